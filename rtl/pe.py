"""Processing element: int8 (one or two MACs per cycle), fp16/bf16 MAC (one per cycle)
or fp32 MAC (one per four cycles), single- or double-buffered."""

from __future__ import annotations

from fractions import Fraction

from amaranth.hdl import Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._checks import check_choice

__all__ = [
    "DATAFLOWS",
    "DATA_BITS",
    "ACC_BITS",
    "PRECISIONS",
    "LANES",
    "STEPS_PER_ELEMENT",
    "MACS_PER_CYCLE",
    "ProcessingElement",
    "operand_shape",
    "acc_shape",
]

#: The two dataflows a PE (and the array built from it) supports.
DATAFLOWS = ("os", "ws")
#: PE arithmetic modes. ``int8``: one int8 x int8 MAC per cycle into int32; ``int8x2``:
#: two int8 x int8 products per cycle (two *lanes*) into int32; ``fp16`` / ``bf16``: one
#: fp16 / bf16 MAC per cycle with binary32 accumulation (``rtl.fp_mac.FpMac``); ``fp32``:
#: one binary32 MAC every four cycles (``rtl.fp_mac.Fp32Mac``, four passes of a 24 x 6
#: multiplier).
PRECISIONS = ("int8", "int8x2", "fp16", "bf16", "fp32")
#: Elements of the streamed dimension a PE takes per step (its operand lanes).
LANES = {"int8": 1, "int8x2": 2, "fp16": 1, "bf16": 1, "fp32": 1}
#: Steps (cycles) each element occupies: an fp32 element is held for the unit's 4 passes.
STEPS_PER_ELEMENT = {"int8": 1, "int8x2": 1, "fp16": 1, "bf16": 1, "fp32": 4}
#: MACs per PE per cycle, the rate the emulator charges (``macs_per_pe_cycle``).
MACS_PER_CYCLE = {p: Fraction(LANES[p], STEPS_PER_ELEMENT[p]) for p in PRECISIONS}
#: Width of the integer operands (two's complement int8).
DATA_BITS = 8
#: Width of the accumulator / partial sum. Integer overflow WRAPS modulo ``2**ACC_BITS``
#: (two's complement), it never saturates; this equals ``wia_hw.emulator.golden.ACC_BITS``.
#: Floating-point modes hold raw IEEE binary32 bits in the same 32 bits.
ACC_BITS = 32


def operand_shape(precision: str) -> Shape:
    """Shape of one operand lane: ``signed(8)`` for the int8 modes, ``unsigned(16)`` (raw
    fp16 / bf16 bits) or ``unsigned(32)`` (raw binary32 bits) for the floating-point
    ones."""
    if precision.startswith("int8"):
        return signed(DATA_BITS)
    return unsigned(32) if precision == "fp32" else unsigned(16)


def acc_shape(precision: str) -> Shape:
    """Shape of an accumulator / partial sum: ``signed(32)`` or raw binary32 bits."""
    return signed(ACC_BITS) if precision.startswith("int8") else unsigned(ACC_BITS)


def _lanes(port: object, n: int) -> list:
    return [port] if n == 1 else [port[i] for i in range(n)]


class ProcessingElement(wiring.Component):
    """One cell of the systolic array, for either dataflow.

    All ``*_out`` ports and ``acc``/``res``/``psum_out``/``w`` are registers: a value
    presented on an input during cycle ``t`` appears on the matching output during cycle
    ``t+1`` (one cycle of latency), which is what makes the array systolic. ``mac`` is
    combinational: the number of MACs the PE performs in the cycle (the number of high
    ``valid_in`` bits); the array sums it for the MAC counter.

    Arithmetic (``precision``)
        ``int8``: ``int8 x int8`` products are exact (16 bits); accumulation is modulo
        ``2**32`` (wrap, not saturate), matching the golden model ``int8_matmul``.
        ``int8x2``: two lanes; operand ports carry two int8 values (``a_in[l]``...), and
        ``valid_in`` has one bit per lane (lane 1 is only valid with lane 0). Output-
        stationary: ``acc <= base + a[0]*b[0] + a[1]*b[1]`` (two K steps per cycle; the
        sum of two products is exact, the accumulation wraps, so any order gives the
        same bits). Weight-stationary: two partial sums, ``psum_out[l] <= psum_in[l] +
        x[l]*w`` (two rows of M per cycle). An invalid lane contributes 0.
        ``fp16`` / ``bf16``: operands are raw 16-bit patterns, accumulators raw binary32
        bits; one MAC is ``y = fl32(c + fl32(a*b))`` by ``FpMac``; the accumulation starts
        from ``+0.0`` (bits 0).
        ``fp32``: operands are raw binary32 bits, each held for 4 consecutive valid
        cycles (an element's 4 steps), numbered by ``phase_in`` 0..3 (``phase_out``: it,
        registered, travelling with the operands). ``Fp32Mac`` builds the product in the
        4 passes and the same ``y = fl32(c + fl32(a*b))`` (binary32 operands) is written
        at the phase-3 step: ``acc`` (os) or ``psum_out`` (ws) changes once per element,
        and ``mac`` is 1 in that cycle only (one MAC per 4 cycles). os: ``first_in`` is
        sampled at phase 0 (the accumulator restarts from +0 at that element's phase 3);
        ``last_in`` comes with phase 3. ws: ``psum_in`` is read at phase 3; pipelined,
        ``first_in`` comes with phase 0 and the active weight serves phases 1-3.

    Output-stationary (``dataflow="os"``) ports
        ``a_in``, ``b_in`` (in, operand x lanes): operands from the left / top neighbour.
        ``valid_in`` (in, lanes bits): the operands are a step of the current tile.
        ``first_in`` (in): this step is the tile's first; the accumulator restarts
        (``base`` is 0, else ``acc``).
        ``a_out``, ``b_out``, ``valid_out``, ``first_out`` (out): the inputs, registered.
        ``acc`` (out): the accumulator; per valid cycle ``acc <= base + products``.
        Single-buffered (``pipelined=False``): ``shift``, ``acc_in`` (in): drain; when
        ``shift`` is high and ``valid_in`` low, ``acc`` loads ``acc_in``.
        Double-buffered (``pipelined=True``): ``last_in`` (in) / ``last_out`` (out): the
        step is the tile's last; then the finished sum also goes to the result register
        ``res`` (out), which the array drains while ``acc`` already accumulates the next
        tile. ``shift``, ``res_in`` (in): when ``shift`` is high (and no result is being
        written), ``res`` loads ``res_in``.

    Weight-stationary (``dataflow="ws"``) ports
        ``w_in`` (in, operand), ``load`` (in): ``w`` (out) is a register fed by ``w_in``;
        a column of PEs is a weight shift register.
        ``x_in`` (in, operand x lanes), ``valid_in`` (in, lanes bits): activations.
        ``psum_in`` (in, acc x lanes): partial sums from the PE above (0 at the top).
        ``x_out``, ``valid_out`` (out): the activations and their valid, registered.
        ``psum_out`` (out, acc x lanes): ``psum_in + x * weight`` when valid (holds
        otherwise).
        Single-buffered: ``w <= w_in`` when ``load``; the MAC uses ``w``.
        Double-buffered (``pipelined=True``, no ``load``): ``w`` is the *shadow* weight.
        ``ldf_in`` (in) / ``ldf_out`` (out): the load front, a one-cycle pulse travelling
        down the column at the start of a weight load; ``load_end`` (in): the column's
        last load cycle. The shadow shifts (``w <= w_in``) from the cycle the front
        reaches the PE to the load's last cycle, so rows the front has not reached
        keep the weights of the tile still streaming. ``first_in`` / ``first_out``: the
        step is the
        tile's first; then the MAC uses the shadow ``w`` and copies it into the active
        weight, which every later step of the tile uses, so the shadow can load the next
        tile's weights while this tile streams (Gemmini's ``propagate`` switch).

    Parameters
    ----------
    dataflow:
        ``"os"`` or ``"ws"``. ``TypeError`` if not a string, ``ValueError`` otherwise.
    precision:
        One of :data:`PRECISIONS` (default ``"int8"``), same errors.
    pipelined:
        Double-buffered (default ``False``); ``TypeError`` if not a bool.
    """

    def __init__(
        self, dataflow: str = "os", precision: str = "int8", pipelined: bool = False
    ) -> None:
        self._dataflow = check_choice("dataflow", dataflow, DATAFLOWS)
        self._precision = check_choice("precision", precision, PRECISIONS)
        if not isinstance(pipelined, bool):
            raise TypeError(f"pipelined must be a bool, got {pipelined!r}")
        self._pipelined = pipelined
        self._n = n = LANES[precision]
        op, acc = operand_shape(precision), acc_shape(precision)

        def port(flow: type, shape: Shape, multi: bool = True) -> object:
            return flow(shape) if n == 1 or not multi else flow(shape).array(n)

        mac_shape = 1 if n == 1 else range(n + 1)
        if precision == "fp32":
            phase_ports = {"phase_in": In(2), "phase_out": Out(2)}
        else:
            phase_ports = {}
        if dataflow == "os":
            members = {
                "a_in": port(In, op),
                "b_in": port(In, op),
                "valid_in": In(n),
                "first_in": In(1),
                "shift": In(1),
                "a_out": port(Out, op),
                "b_out": port(Out, op),
                "valid_out": Out(n),
                "first_out": Out(1),
                "acc": Out(acc),
                "mac": Out(mac_shape),
            }
            if pipelined:
                members.update(
                    {"last_in": In(1), "last_out": Out(1), "res_in": In(acc), "res": Out(acc)}
                )
            else:
                members["acc_in"] = In(acc)
        else:
            members = {
                "x_in": port(In, op),
                "valid_in": In(n),
                "w_in": In(op),
                "load": In(1),
                "psum_in": port(In, acc),
                "x_out": port(Out, op),
                "valid_out": Out(n),
                "w": Out(op),
                "psum_out": port(Out, acc),
                "mac": Out(mac_shape),
            }
            if pipelined:
                del members["load"]
                members.update(
                    {
                        "first_in": In(1),
                        "first_out": Out(1),
                        "ldf_in": In(1),
                        "ldf_out": Out(1),
                        "load_end": In(1),
                    }
                )
        members.update(phase_ports)
        super().__init__(members)

    @property
    def dataflow(self) -> str:
        """``"os"`` or ``"ws"``."""
        return self._dataflow

    @property
    def precision(self) -> str:
        """One of :data:`PRECISIONS`."""
        return self._precision

    @property
    def pipelined(self) -> bool:
        """Double-buffered accumulators (os) / weights (ws)."""
        return self._pipelined

    @property
    def lanes(self) -> int:
        """MACs per cycle (streamed elements per step)."""
        return self._n

    def _mac_expr(
        self,
        m: Module,
        c: object,
        pairs: list[tuple[object, object]],
        valid: list[object],
        name: str,
    ) -> object:
        """``c`` plus the products of ``pairs`` (an invalid lane adds 0)."""
        if self._precision.startswith("int8"):
            total = c
            for (x, y), v in zip(pairs, valid, strict=True):
                total = total + (Mux(v, x * y, 0) if self._n > 1 else x * y)
            return total[:ACC_BITS].as_signed()
        from .fp_mac import Fp32Mac, FpMac  # the floating-point MAC units

        unit = Fp32Mac() if self._precision == "fp32" else FpMac(self._precision)
        m.submodules[name] = unit
        ((x, y),) = pairs
        m.d.comb += [unit.a.eq(x), unit.b.eq(y), unit.c.eq(c)]
        if self._precision == "fp32":
            m.d.comb += unit.phase.eq(self.phase_in)
        return unit.y

    def elaborate(self, platform: object) -> Module:
        m = Module()
        n = self._n
        valid = [self.valid_in[i] for i in range(n)]
        # `write`: the step that writes the accumulator / partial sum (every step, or an
        # fp32 element's last pass)
        if self._precision == "fp32":
            write = self.valid_in & (self.phase_in == 3)
            m.d.sync += self.phase_out.eq(self.phase_in)
            m.d.comb += self.mac.eq(write)
        else:
            write = self.valid_in[0]
            m.d.comb += self.mac.eq(sum(valid) if n > 1 else self.valid_in)
        m.d.sync += self.valid_out.eq(self.valid_in)
        if self._dataflow == "os":
            a, b = _lanes(self.a_in, n), _lanes(self.b_in, n)
            m.d.sync += [o.eq(i) for o, i in zip(_lanes(self.a_out, n), a, strict=True)]
            m.d.sync += [o.eq(i) for o, i in zip(_lanes(self.b_out, n), b, strict=True)]
            m.d.sync += self.first_out.eq(self.first_in)
            if self._precision == "fp32":  # `first` comes at phase 0, is used at phase 3
                fresh = Signal(name="fresh")
                with m.If(self.valid_in & (self.phase_in == 0)):
                    m.d.sync += fresh.eq(self.first_in)
                restart = fresh
            else:
                restart = self.first_in
            base = Mux(restart, 0, self.acc)
            new = self._mac_expr(m, base, list(zip(a, b, strict=True)), valid, "mac_unit")
            if self._pipelined:
                m.d.sync += self.last_out.eq(self.last_in)
                with m.If(write):
                    m.d.sync += self.acc.eq(new)
                with m.If(write & self.last_in):
                    m.d.sync += self.res.eq(new)
                with m.Elif(self.shift):
                    m.d.sync += self.res.eq(self.res_in)
            else:
                with m.If(write):
                    m.d.sync += self.acc.eq(new)
                with m.Elif(self.shift):
                    m.d.sync += self.acc.eq(self.acc_in)
        else:
            xs, ps_in = _lanes(self.x_in, n), _lanes(self.psum_in, n)
            ps_out = _lanes(self.psum_out, n)
            m.d.sync += [o.eq(i) for o, i in zip(_lanes(self.x_out, n), xs, strict=True)]
            if self._pipelined:
                active = Signal.like(self.w, name="w_active")
                weight = Mux(self.first_in, self.w, active)
                armed = Signal(name="load_armed")
                shift = self.ldf_in | armed
                m.d.sync += [
                    self.first_out.eq(self.first_in),
                    self.ldf_out.eq(self.ldf_in),
                    armed.eq(shift & ~self.load_end),
                ]
                with m.If(self.valid_in[0] & self.first_in):
                    m.d.sync += active.eq(self.w)
                with m.If(shift):
                    m.d.sync += self.w.eq(self.w_in)
            else:
                weight = self.w
                with m.If(self.load):
                    m.d.sync += self.w.eq(self.w_in)
            # the MAC units' inputs are driven every cycle (the fp32 unit's passes)
            news = [
                self._mac_expr(
                    m, ps_in[lane], [(xs[lane], weight)], [valid[lane]], f"mac_unit{lane}"
                )
                for lane in range(n)
            ]
            with m.If(write):
                m.d.sync += [o.eq(v) for o, v in zip(ps_out, news, strict=True)]
        return m
