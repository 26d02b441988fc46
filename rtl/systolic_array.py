# amaranth: UnusedElaboratable=no
"""Systolic array of processing elements, output- or weight-stationary, optionally
pipelined (double-buffered), in int8, int8x2, fp16, bf16 or fp32."""

from __future__ import annotations

import os

from amaranth.hdl import (
    Cat,
    ClockSignal,
    EnableInserter,
    Instance,
    Module,
    Mux,
    ResetSignal,
    Signal,
    Value,
)
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._checks import check_choice, check_int
from .pe import (
    ACC_BITS,
    DATA_BITS,
    DATAFLOWS,
    LANES,
    PRECISIONS,
    STEPS_PER_ELEMENT,
    ProcessingElement,
    acc_shape,
    operand_shape,
)
from .perf_counters import REGISTER_MAP, PerfCounters

__all__ = ["SystolicArray", "MAX_DIM", "ACC_BITS", "DATA_BITS"]

#: Largest ``rows`` / ``cols`` accepted.
MAX_DIM = 256


def _adder_tree(values: list) -> Value:
    """Sum of ``values`` as a balanced tree of adders (depth ``log2(n)``)."""
    values = list(values)
    while len(values) > 1:
        values = [
            values[i] + values[i + 1] if i + 1 < len(values) else values[i]
            for i in range(0, len(values), 2)
        ]
    return Value.cast(values[0])


def _gate(value: Value, sample: Value | None) -> Value:
    """``value``, ANDed with ``sample`` unless that is ``None`` (keeps the hardware of the
    one-step-per-element modes as it was)."""
    return value if sample is None else value & sample


def _delay_lines(dom: Module, values: list, delays: list[int], name: str) -> list[Value]:
    """``values[i]`` delayed by ``delays[i]`` cycles (registers in ``dom.d.sync``).

    Stage ``k`` is ONE wide register holding every lane still to be delayed (``delays[i]
    >= k``), so a triangular skew of ``n`` lanes costs ``max(delays)`` signals, not
    ``n**2 / 2``: this is what keeps a 128 x 128 array elaborating quickly."""
    cur = [Value.cast(v) for v in values]
    widths = [len(v) for v in cur]
    out: list[Value | None] = [v if d == 0 else None for v, d in zip(cur, delays, strict=True)]
    k = 0
    while True:
        k += 1
        lanes = [i for i, d in enumerate(delays) if d >= k]
        if not lanes:
            break
        reg = Signal(sum(widths[i] for i in lanes), name=f"{name}_d{k}")
        dom.d.sync += reg.eq(Cat(*[cur[i] for i in lanes]))
        pos = 0
        for i in lanes:
            cur[i] = reg[pos : pos + widths[i]]
            pos += widths[i]
            if delays[i] == k:
                out[i] = cur[i]
    return out  # type: ignore[return-value]


def _place(
    m: Module, name: str, comp: wiring.Component, module_name: str | None, **extra: object
) -> None:
    """Add ``comp`` as a submodule, or (``module_name`` given) as an ``Instance`` of a
    separately emitted Verilog module of that name with the same ports (plus ``extra``
    instance ports)."""
    if module_name is None:
        m.submodules[name] = comp
        return
    kw: dict[str, object] = {"i_clk": ClockSignal(), "i_rst": ResetSignal(), **extra}
    for path, member, value in comp.signature.flatten(comp):
        port = "__".join(str(p) for p in path)
        kw[("i_" if member.flow == In else "o_") + port] = value
    m.submodules[name] = Instance(module_name, **kw)


class _Gated(wiring.Component):
    """``inner`` with a clock enable input ``en`` (what ``EnableInserter`` does inline, for
    a module that is emitted once and instantiated)."""

    def __init__(self, inner: wiring.Component) -> None:
        self._inner = inner
        super().__init__({**dict(inner.signature.members.items()), "en": In(1)})

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.submodules.inner = EnableInserter(self.en)(self._inner)
        mine = {path: v for path, _, v in self.signature.flatten(self)}
        for path, member, value in self._inner.signature.flatten(self._inner):
            if member.flow == In:
                m.d.comb += value.eq(mine[path])
            else:
                m.d.comb += mine[path].eq(value)
        return m


#: Columns per row-port group (see :class:`_Bus`).
_GROUP = 8


class _Bus:
    """A per-column row port split into groups of :data:`_GROUP` columns, each group one
    packed signal: few signals for Amaranth to elaborate (rows * cols / 8 per port, not
    rows * cols), and narrow enough that Icarus does not re-evaluate every column's
    slice each time one column changes (one packed bus per row makes simulation and
    compilation grow with cols**2 per row)."""

    def __init__(self, groups: list[Signal], per_col: int) -> None:
        self.groups, self.per_col = groups, per_col

    def word_select(self, idx: int, width: int) -> Value:
        j, rest = divmod(idx, self.per_col)
        g, jj = divmod(j, _GROUP)
        return self.groups[g].word_select(jj * self.per_col + rest, width)

    def __getitem__(self, j: int) -> Value:
        return self.word_select(j, 1)

    def eq(self, other: object) -> list:
        if isinstance(other, _Bus):
            return [g.eq(o) for g, o in zip(self.groups, other.groups, strict=True)]
        if isinstance(other, int):
            return [g.eq(other) for g in self.groups]
        out, pos = [], 0
        for g in self.groups:
            out.append(g.eq(other[pos : pos + len(g)]))
            pos += len(g)
        return out


class _Row(wiring.Component):
    """One row of ``cols`` PEs and the wiring between them (internal to the array).

    Rows are identical, so the emitted Verilog has one row module instantiated ``rows``
    times (and one PE module instantiated ``cols`` times in it). Per-column ports are
    :class:`_Bus` groups (element ``column * lanes + lane``); ``macs`` is the number of
    MACs of the row in the cycle."""

    def __init__(
        self,
        cols: int,
        dataflow: str,
        precision: str,
        pipelined: bool,
        pe_module: str | None = None,
    ) -> None:
        self._cols, self._df, self._prec, self._pipe = cols, dataflow, precision, pipelined
        self._pe_module = pe_module
        n = LANES[precision]
        op, acc = operand_shape(precision).width, ACC_BITS
        C = cols
        members: dict[str, object] = {"en": In(1), "valid_in": In(n), "macs": Out(range(C * n + 1))}
        if precision == "fp32":  # the step's pass, and whether any PE works on a step
            members.update({"phase_in": In(2), "active": Out(1)})
        buses: dict[str, tuple[type, int, int]] = {}  # name -> (flow, width, per column)
        if dataflow == "os":
            members.update({"a_in": In(op * n), "first_in": In(1)})
            buses.update({"b_in": (In, op, n), "b_out": (Out, op, n)})
            if pipelined:
                members["last_in"] = In(1)
                buses.update(
                    {
                        "start": (In, 1, 1),
                        "q_in": (In, 1, 1),
                        "q_out": (Out, 1, 1),
                        "res_in": (In, acc, 1),
                        "res": (Out, acc, 1),
                    }
                )
            else:
                members["shift"] = In(1)
                buses.update({"acc_in": (In, acc, 1), "acc": (Out, acc, 1)})
        else:
            members.update({"x_in": In(op * n), "valid_out": Out(1)})
            buses.update(
                {
                    "w_in": (In, op, 1),
                    "w": (Out, op, 1),
                    "psum_in": (In, acc, n),
                    "psum_out": (Out, acc, n),
                }
            )
            if pipelined:
                members["first_in"] = In(1)
                buses.update({"load_end": (In, 1, 1), "ldf_in": (In, 1, 1), "ldf_out": (Out, 1, 1)})
            else:
                members["load"] = In(1)
        n_groups = -(-C // _GROUP)
        for name, (flow, width, per) in buses.items():
            for g in range(n_groups):
                cols_g = min(_GROUP, C - g * _GROUP)
                members[f"{name}_g{g}"] = flow(cols_g * per * width)
        super().__init__(members)
        for name, (_, _, per) in buses.items():
            setattr(self, name, _Bus([getattr(self, f"{name}_g{g}") for g in range(n_groups)], per))

    def elaborate(self, platform: object) -> Module:
        m = Module()
        C, n = self._cols, LANES[self._prec]
        op, acc = operand_shape(self._prec).width, ACC_BITS
        pes = [ProcessingElement(self._df, self._prec, self._pipe) for _ in range(C)]
        for j, pe in enumerate(pes):
            _place(m, f"pe{j}", pe, self._pe_module, i_en=self.en)

        def lanes(port: object) -> list:
            return [port] if n == 1 else [port[i] for i in range(n)]

        for j, pe in enumerate(pes):
            left = pes[j - 1] if j else None
            m.d.comb += pe.valid_in.eq(left.valid_out if left else self.valid_in)
            if self._prec == "fp32":
                m.d.comb += pe.phase_in.eq(left.phase_out if left else self.phase_in)
            if self._df == "os":
                for lane, (ai, bi, bo) in enumerate(
                    zip(lanes(pe.a_in), lanes(pe.b_in), lanes(pe.b_out), strict=True)
                ):
                    m.d.comb += [
                        ai.eq(lanes(left.a_out)[lane] if left else self.a_in.word_select(lane, op)),
                        bi.eq(self.b_in.word_select(j * n + lane, op)),
                        self.b_out.word_select(j * n + lane, op).eq(bo),
                    ]
                m.d.comb += pe.first_in.eq(left.first_out if left else self.first_in)
                if self._pipe:
                    en = Signal(name=f"shift{j}")
                    m.d.comb += [
                        pe.last_in.eq(left.last_out if left else self.last_in),
                        en.eq(self.start[j] | self.q_in[j]),
                        pe.shift.eq(en),
                        pe.res_in.eq(self.res_in.word_select(j, acc)),
                        self.res.word_select(j, acc).eq(pe.res),
                    ]
                    m.d.sync += self.q_out[j].eq(en)
                else:
                    m.d.comb += [
                        pe.shift.eq(self.shift),
                        pe.acc_in.eq(self.acc_in.word_select(j, acc)),
                        self.acc.word_select(j, acc).eq(pe.acc),
                    ]
            else:
                for lane, xi in enumerate(lanes(pe.x_in)):
                    m.d.comb += xi.eq(
                        lanes(left.x_out)[lane] if left else self.x_in.word_select(lane, op)
                    )
                for lane, (pi, po) in enumerate(
                    zip(lanes(pe.psum_in), lanes(pe.psum_out), strict=True)
                ):
                    m.d.comb += [
                        pi.eq(self.psum_in.word_select(j * n + lane, acc)),
                        self.psum_out.word_select(j * n + lane, acc).eq(po),
                    ]
                m.d.comb += [
                    pe.w_in.eq(self.w_in.word_select(j, op)),
                    self.w.word_select(j, op).eq(pe.w),
                ]
                if self._pipe:
                    m.d.comb += [
                        pe.first_in.eq(left.first_out if left else self.first_in),
                        pe.load_end.eq(self.load_end[j]),
                        pe.ldf_in.eq(self.ldf_in[j]),
                        self.ldf_out[j].eq(pe.ldf_out),
                    ]
                else:
                    m.d.comb += pe.load.eq(self.load)
        if self._df == "ws":
            finished = pes[-1].valid_out[0]
            if self._prec == "fp32":  # a partial sum leaves once per element
                finished = finished & (pes[-1].phase_out == 3)
            m.d.comb += self.valid_out.eq(finished)
        if self._prec == "fp32":
            m.d.comb += self.active.eq(Cat(*[pe.valid_in for pe in pes]).any())
        m.d.comb += self.macs.eq(_adder_tree([pe.mac for pe in pes]))
        return EnableInserter(self.en)(m)


class SystolicArray(wiring.Component):
    """A ``rows x cols`` systolic array computing one tile per ``start``.

    The input skew (a diagonal of delay registers on the left and top edges), the
    output drain (OS) or de-skew (WS), the tile controller and a :class:`PerfCounters`
    block are inside the component. Arithmetic is that of :class:`ProcessingElement`
    in the chosen ``precision`` (see there; int8 modes wrap modulo ``2**32``).

    Timing convention
    -----------------
    *Edge* ``e`` is a rising clock edge and *cycle* ``e`` the clock period that follows
    it. A tile starts at the edge where ``start`` is sampled high (with ``idle`` high and
    ``stall`` low): that is edge 0. ``done`` is high during exactly one cycle, cycle
    ``N``, where, with ``S`` the tile's *steps* (``S = ceil(depth / lanes)``, ``lanes``
    = 2 for ``int8x2``, else 1; ``S = 4 * depth`` for ``fp32``, one MAC per 4 cycles;
    ``emulator.cycles.systolic_steps(depth, pe.MACS_PER_CYCLE[precision])``)::

        N = S + 2 * rows + cols - 2      (= emulator.cycles.systolic_tile_cycles)

    for both dataflows and both ``pipelined`` settings, plus one cycle for every cycle in
    which ``stall`` was high while the tile was in flight.

    Issue rule (``emulator.cycles.systolic_issue_interval``): with ``pipelined=False``
    a new ``start`` is accepted in cycle ``N - 1`` of the previous tile at the earliest
    (back-to-back tiles take ``N`` cycles each). With ``pipelined=True`` a tile of ``S``
    steps accepted at edge ``T`` lets the next one, of ``S'`` steps, be accepted at edge
    ``T + max(S, rows + S - S')`` (``os``: its operands follow this tile's, and its
    drain follows this tile's drain) or ``T + max(S, rows)`` (``ws``: its weights load
    while this tile streams, its activations follow this tile's). Several tiles are
    then in flight; their ``done`` pulses come in order, each ``N`` cycles after its own
    start. In ``os`` pipelined mode ``idle`` depends combinationally on ``depth``.

    Output-stationary (``dataflow="os"``): computes ``A @ B`` with ``A`` ``rows x K``
    and ``B`` ``K x cols``. Step ``s`` (``0 <= s < S``), lane ``l``: ``a[i*lanes + l] =
    A[i, s*lanes + l]``, ``b[j*lanes + l] = B[s*lanes + l, j]``, sampled at edge ``s``
    (``a_ready``/``b_ready`` high in the cycle before each sampling edge); lanes past
    ``K`` are ignored. The PE holding output row ``i`` multiplies step ``s`` in cycle
    ``p + j + s`` (``p = i``, or ``p = rows - 1 - i`` when pipelined); the accumulators
    are then drained, one row per cycle, and result row ``r`` (``out[j] = (A @ B)[r,
    j]``) is on ``out`` with ``out_valid`` high in cycle ``N - rows + 1 + r``. The last
    row and ``done`` share cycle ``N``. Accumulation order: ``k = 0, 1, ..., K-1`` from
    zero (``int8x2`` adds the two lanes of a step, exact, then accumulates).

    Weight-stationary (``dataflow="ws"``): computes ``X @ W`` with ``W`` ``rows x cols``
    held in the PEs and ``X`` ``M x rows`` streamed (``depth = M``, the emulator's
    ``M``). Weight load: at edge ``r`` (``0 <= r < rows``, ``b_ready`` high)
    ``b[j] = W[rows - 1 - r, j]`` (the weights shift down, so the last row enters first).
    Step ``s``: ``a[i*lanes + l] = X[s*lanes + l, i]``, sampled at edge ``rows + s``
    (``a_ready`` high). PE ``(i, j)`` multiplies in cycle ``rows + s + i + j``; partial
    sums flow down, top to bottom starting from zero (``fl32(... fl32(0 + x0*w0) +
    x1*w1 ...)`` in the fp modes), and are de-skewed, so step ``s`` of ``X @ W`` is on
    ``out`` with ``out_valid`` in cycle ``2 * rows + cols - 1 + s``: ``out[j*lanes + l]
    = (X @ W)[s*lanes + l, j]`` (0 for a lane past ``M``); the last step and ``done``
    share cycle ``N``.

    Ports
    -----
    start (in, 1): begin a tile; sampled when ``idle`` is high and ``stall`` is low.
    depth (in, ``range(max_depth + 1)``): ``K`` (os) or ``M`` (ws) in elements, sampled
    with ``start``; 0 acts as 1.
    a (in, operand x ``rows * lanes``), b (in, operand x ``cols * lanes`` for os,
    ``cols`` for ws): operand steps (above). Operands are ``signed(8)`` in the int8
    modes and raw 16-bit fp16 / bf16 or 32-bit binary32 patterns in the fp modes. In
    ``fp32`` an element is sampled once (``a_ready`` / ``b_ready`` high at its first
    step, ws weight loads unchanged) and held for its 4 steps: step ``s`` carries
    element ``s // 4``, and ws results come once per element, at its last step.
    stall (in, 1): hold. In a cycle with ``stall`` high no register of the array changes
    at the next edge (nothing is sampled, nothing advances) and ``out_valid``, ``done``,
    ``a_ready``, ``b_ready`` read low; every such cycle while a tile is in flight is
    counted as a stall cycle and delays every ``done`` still to come by one cycle.
    idle (out, 1): a ``start`` would be accepted at the next edge.
    a_ready, b_ready (out, 1): ``a`` / ``b`` is sampled at the next edge (combinational;
    includes the ``start`` edge).
    out (out, 32 bits x ``cols`` (os) or ``cols * lanes`` (ws)), out_valid (out, 1),
    done (out, 1): result rows: ``signed(32)`` (int8 modes) or raw binary32 bits.
    ctr_addr (in, ``range(4)``), ctr_clear (in, 1), ctr_rdata (out, ``counter_width``):
    the :class:`PerfCounters` register interface (read latency 1 cycle). A tile is *in
    flight* from cycle 0 to cycle ``N - 1`` (and while ``done`` is held back by
    ``stall``); ``cycles`` counts the cycles in which at least one tile is in flight,
    ``busy_cycles`` those in which at least one PE performs a MAC, ``macs`` the MACs
    (``K * rows * cols`` per os tile, ``M * rows * cols`` per ws tile), ``stall_cycles``
    the stalled ones (``emulator.cycles.systolic_tile_counters`` /
    ``systolic_sequence_counters``).

    Verilog emission (:meth:`to_verilog`) writes one PE module and one row module and
    instantiates them, so the PE logic is written once; the instances' port maps and
    the wiring still grow with ``rows * cols`` (docs/RTL.md gives the measured sizes).
    The Amaranth simulator elaborates the same rows and PEs inline.

    Parameters
    ----------
    rows, cols:
        Array shape, 1 to :data:`MAX_DIM`.
    dataflow:
        ``"os"`` or ``"ws"``.
    max_depth:
        Largest ``depth``, 1 to 65536 (default 1024).
    counter_width:
        Width of the performance counters, 8 to 64 (default 48).
    pipelined:
        Double-buffered accumulators (os) / weights (ws); default ``False``.
    precision:
        ``"int8"`` (default), ``"int8x2"``, ``"fp16"``, ``"bf16"`` or ``"fp32"``.

    Raises ``TypeError`` for an argument of the wrong type and ``ValueError`` for one
    out of range; the message names the parameter and shows the value.
    """

    def __init__(
        self,
        rows: int = 4,
        cols: int = 4,
        dataflow: str = "os",
        max_depth: int = 1024,
        counter_width: int = 48,
        pipelined: bool = False,
        precision: str = "int8",
    ) -> None:
        self._rows = check_int("rows", rows, 1, MAX_DIM)
        self._cols = check_int("cols", cols, 1, MAX_DIM)
        self._dataflow = check_choice("dataflow", dataflow, DATAFLOWS)
        self._max_depth = check_int("max_depth", max_depth, 1, 1 << 16)
        self._counter_width = check_int("counter_width", counter_width, 8, 64)
        if not isinstance(pipelined, bool):
            raise TypeError(f"pipelined must be a bool, got {pipelined!r}")
        self._pipelined = pipelined
        self._precision = check_choice("precision", precision, PRECISIONS)
        self._lanes = n = LANES[precision]
        self._steps_per = STEPS_PER_ELEMENT[precision]
        # largest steps of a tile (fp32: each element is held for 4 steps)
        self._max_steps = self._max_depth * self._steps_per
        self._module_prefix: str | None = None  # set by to_verilog: rows as instances
        op, acc = operand_shape(precision), acc_shape(precision)
        n_b = n if dataflow == "os" else 1
        n_out = 1 if dataflow == "os" else n
        super().__init__(
            {
                "start": In(1),
                "depth": In(range(self._max_depth + 1)),
                "stall": In(1),
                "a": In(op).array(self._rows * n),
                "b": In(op).array(self._cols * n_b),
                "idle": Out(1),
                "a_ready": Out(1),
                "b_ready": Out(1),
                "out": Out(acc).array(self._cols * n_out),
                "out_valid": Out(1),
                "done": Out(1),
                "ctr_addr": In(range(len(REGISTER_MAP))),
                "ctr_clear": In(1),
                "ctr_rdata": Out(self._counter_width),
            }
        )

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cols(self) -> int:
        return self._cols

    @property
    def dataflow(self) -> str:
        return self._dataflow

    @property
    def max_depth(self) -> int:
        return self._max_depth

    @property
    def pipelined(self) -> bool:
        return self._pipelined

    @property
    def precision(self) -> str:
        return self._precision

    @property
    def lanes(self) -> int:
        """Streamed elements per step (2 for ``int8x2``, else 1)."""
        return self._lanes

    def to_verilog(self, name: str = "systolic_array") -> str:
        """Verilog text: top module ``name``, one ``{name}_row`` module and one
        ``{name}_pe`` module (no source locations)."""
        from amaranth.back import rtlil, verilog

        os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
        top = SystolicArray(
            self._rows,
            self._cols,
            self._dataflow,
            self._max_depth,
            self._counter_width,
            self._pipelined,
            self._precision,
        )
        top._module_prefix = name
        row = _Row(
            self._cols, self._dataflow, self._precision, self._pipelined, pe_module=f"{name}_pe"
        )
        pe = _Gated(ProcessingElement(self._dataflow, self._precision, self._pipelined))
        # one yosys run (the bundled yosys is WebAssembly: each start costs seconds)
        text = "\n".join(
            rtlil.convert(c, name=n, emit_src=False)
            for c, n in ((top, name), (row, f"{name}_row"), (pe, f"{name}_pe"))
        )
        return verilog._convert_rtlil_text(text)

    # ---- elaboration ---------------------------------------------------------------

    def elaborate(self, platform: object) -> Module:
        m = Module()
        core = Module()  # everything that `stall` freezes
        R = self._rows
        advance = Signal()
        m.d.comb += advance.eq(~self.stall)
        rows = [
            _Row(self._cols, self._dataflow, self._precision, self._pipelined) for _ in range(R)
        ]
        row_module = None if self._module_prefix is None else f"{self._module_prefix}_row"
        for i, row in enumerate(rows):
            _place(core, f"row{i}", row, row_module)
            m.d.comb += row.en.eq(advance)

        # depth port -> steps (0 acts as 1) and whether the last step has one lane only
        n = self._lanes
        depth1 = Signal(range(self._max_depth + 1))
        steps_in = Signal(range(self._max_steps + 1))
        odd_in = Signal()
        per = self._steps_per.bit_length() - 1  # log2 of the steps per element
        groups = (depth1 + (n - 1)) >> (n - 1)  # elements / lanes, rounded up
        m.d.comb += [
            depth1.eq(Mux(self.depth == 0, 1, self.depth)),
            steps_in.eq(groups << per if per else groups),
            odd_in.eq(depth1[0] if n == 2 else 0),
        ]
        self._operand_sources(m, core)
        ctl = dict(core=core, rows=rows, advance=advance, steps_in=steps_in, odd_in=odd_in)
        if self._pipelined and self._dataflow == "os":
            in_flight_reg, done_reg, done_pre = self._os_pipelined(m, **ctl)
        elif self._pipelined:
            in_flight_reg, done_reg, done_pre = self._ws_pipelined(m, **ctl)
        else:
            in_flight_reg, done_reg, done_pre = self._single(m, **ctl)
        m.d.comb += self.done.eq(done_reg & advance)

        m.submodules.core = EnableInserter(advance)(core)

        # ---- performance counters (never stalled: they count the stalls) -------------
        macs = Signal(range(R * self._cols * n + 1))
        m.d.comb += macs.eq(_adder_tree([row.macs for row in rows]))
        fp32 = self._precision == "fp32"
        counters = PerfCounters(
            max_macs_per_cycle=R * self._cols * n, width=self._counter_width, busy_port=fp32
        )
        m.submodules.counters = counters
        if fp32:  # busy: a PE works on a pass (a MAC completes only every 4th cycle)
            m.d.comb += counters.busy.eq(Cat(*[row.active for row in rows]).any() & advance)
        in_flight = Signal()
        m.d.comb += [
            in_flight.eq(in_flight_reg | (done_reg & self.stall)),
            counters.enable.eq(in_flight),
            counters.macs.eq(Mux(advance, macs, 0)),
            counters.stall.eq(in_flight & self.stall),
            counters.clear.eq(self.ctr_clear),
            counters.addr.eq(self.ctr_addr),
            self.ctr_rdata.eq(counters.rdata),
        ]
        return m

    def _operand_sources(self, m: Module, core: Module) -> None:
        """What enters the skew from the ``a`` (and os ``b``) ports: the ports themselves,
        or (fp32) the port at an element's first step and a hold register, loaded then,
        at its other three (an element is sampled once and streamed for 4 steps)."""
        n_b = len(self.b) if self._dataflow == "os" else 0
        if self._steps_per == 1:
            self._phase_now = None
            self._a_src, self._b_src = list(self.a), list(self.b)[:n_b]
            return
        self._phase_now = Signal(2, name="step_phase")
        first = self._phase_now == 0
        srcs = []
        for name, ports in (("a", list(self.a)), ("b", list(self.b)[:n_b])):
            out = []
            for idx, port in enumerate(ports):
                held = Signal.like(port, name=f"{name}_held{idx}")
                with core.If(first):
                    core.d.sync += held.eq(port)
                out.append(Mux(first, port, held))
            srcs.append(out)
        self._a_src, self._b_src = srcs

    def _phase(self, m: Module, core: Module, feed: Value, first: Value) -> Value | None:
        """High in a cycle whose step samples the operand ports: ``None`` (every step) or,
        in fp32, an element's first. fp32: drives ``step_phase``, the pass of the step fed in this
        cycle (0 at the tile's first step ``first``, + 1 per step fed, modulo 4), and
        adds it to the flags the left edge skews onto the rows."""
        if self._phase_now is None:
            return None
        ph = Signal(2, name="phase_next")
        m.d.comb += self._phase_now.eq(Mux(first, 0, ph))
        with core.If(feed):
            core.d.sync += ph.eq(self._phase_now + 1)
        return self._phase_now == 0

    def _lane_valid(self, feed: Value, last: Value, odd: Value) -> Value:
        """Per-lane valid bits of a step: lane 1 is off in the last step of an odd depth."""
        if self._lanes == 1:
            return feed
        return Cat(feed, feed & ~(last & odd))

    def _count_tiles(self, core: Module, accepted: Value, done_pre: Value) -> Signal:
        """Tiles accepted and not yet done (a tile leaves at the edge that raises done)."""
        cnt = Signal(
            range(self._max_steps + 2 * self._rows + self._cols + 2), name="tiles_in_flight"
        )
        core.d.sync += cnt.eq(cnt + accepted - done_pre)
        return cnt

    def _left_edge(
        self, core: Module, rows: list, pe_row_of: list[int], flags: dict[str, Value]
    ) -> None:
        """Skew the ``a`` port (and the step flags) onto the rows: port row ``i`` drives
        PE row ``pe_row_of[i]`` with ``pe_row_of[i] + 1`` cycles of delay."""
        R, n = self._rows, self._lanes
        if self._phase_now is not None:
            flags = {**flags, "phase_in": self._phase_now}
        values, delays, sinks = [], [], []
        for i in range(R):
            p = pe_row_of[i]
            row = rows[p]
            port = row.a_in if self._dataflow == "os" else row.x_in
            for lane in range(n):
                values.append(self._a_src[i * n + lane])
                delays.append(p + 1)
                sinks.append(port.word_select(lane, len(self.a[0])))
            for fname, v in flags.items():
                values.append(v)
                delays.append(p + 1)
                sinks.append(getattr(row, fname))
        for sink, v in zip(sinks, _delay_lines(core, values, delays, "left"), strict=True):
            core.d.comb += sink.eq(v)

    def _single(self, m, core, rows, advance, steps_in, odd_in):
        """``pipelined=False``: one tile at a time; the next is accepted in cycle N-1."""
        R, C = self._rows, self._cols
        running = Signal()
        t = Signal(range(self._max_steps + 2 * R + C))  # index of the current cycle
        k = Signal(range(self._max_steps + 1))  # steps of the tile in flight
        odd = Signal()
        done_reg = Signal()
        last = Signal()
        accepted = Signal()
        m.d.comb += [
            last.eq(running & (t == k + (2 * R + C - 3))),
            self.idle.eq(~running | last),
            accepted.eq(self.start & self.idle),
        ]
        with core.If(accepted):
            core.d.sync += [running.eq(1), t.eq(0), k.eq(steps_in), odd.eq(odd_in)]
        with core.Elif(last):
            core.d.sync += running.eq(0)
        with core.Elif(running):
            core.d.sync += t.eq(t + 1)
        core.d.sync += done_reg.eq(last)
        if self._dataflow == "os":
            feed, drain = Signal(), Signal()
            laststep = Mux(accepted, steps_in == 1, t + 2 == k)
            oddnow = Mux(accepted, odd_in, odd)
            sample = self._phase(m, core, feed, accepted)
            m.d.comb += [
                feed.eq(accepted | (running & (t + 1 < k))),
                drain.eq(running & (t >= k + (R + C - 2))),
                self.a_ready.eq(_gate(feed & advance, sample)),
                self.b_ready.eq(_gate(feed & advance, sample)),
            ]
            self._left_edge(
                core,
                rows,
                list(range(R)),
                {"valid_in": self._lane_valid(feed, laststep, oddnow), "first_in": accepted},
            )
            self._top_edge(core, rows, list(range(C)), [1 + j for j in range(C)])
            out_valid = Signal()
            out_regs = [Signal(acc_shape(self._precision), name=f"out_reg{j}") for j in range(C)]
            for i, row in enumerate(rows):
                core.d.comb += [
                    row.shift.eq(drain),
                    row.acc_in.eq(rows[i + 1].acc if i + 1 < R else 0),
                ]
            core.d.sync += out_valid.eq(drain)
            with core.If(drain):
                core.d.sync += [
                    out_regs[j].eq(rows[0].acc.word_select(j, ACC_BITS)) for j in range(C)
                ]
            m.d.comb += [self.out[j].eq(out_regs[j]) for j in range(C)]
            m.d.comb += self.out_valid.eq(out_valid & advance)
        else:
            load, feed = Signal(), Signal()
            laststep = t + 2 == k + R
            sample = self._phase(m, core, feed, running & (t + 1 == R))
            m.d.comb += [
                load.eq(accepted | (running & (t + 1 < R))),
                feed.eq(running & (t + 1 >= R) & (t + 1 < k + R)),
                self.a_ready.eq(_gate(feed & advance, sample)),
                self.b_ready.eq(load & advance),
            ]
            self._left_edge(
                core, rows, list(range(R)), {"valid_in": self._lane_valid(feed, laststep, odd)}
            )
            for i, row in enumerate(rows):
                core.d.comb += [
                    row.load.eq(load),
                    row.w_in.eq(rows[i - 1].w if i else Cat(*self.b)),
                ]
            self._ws_bottom(m, core, rows)
        return running, done_reg, last

    def _top_edge(self, core: Module, rows: list, cols: list[int], delays: list[int]) -> None:
        """OS: ``b`` lanes of column ``j`` into row 0, delayed ``delays[j]`` cycles."""
        n = self._lanes
        values, dl, sinks = [], [], []
        for j in cols:
            for lane in range(n):
                values.append(self._b_src[j * n + lane])
                dl.append(delays[j])
                sinks.append(rows[0].b_in.word_select(j * n + lane, len(self.b[0])))
        for sink, v in zip(sinks, _delay_lines(core, values, dl, "top"), strict=True):
            core.d.comb += sink.eq(v)
        for i in range(1, self._rows):
            core.d.comb += rows[i].b_in.eq(rows[i - 1].b_out)

    def _ws_bottom(self, m: Module, core: Module, rows: list) -> None:
        """WS: partial sums flow down from 0; the bottom is de-skewed onto ``out``."""
        R, C, n = self._rows, self._cols, self._lanes
        for i, row in enumerate(rows):
            core.d.comb += row.psum_in.eq(rows[i - 1].psum_out if i else 0)
        values = [
            rows[R - 1].psum_out.word_select(j * n + lane, ACC_BITS)
            for j in range(C)
            for lane in range(n)
        ]
        delays = [C - 1 - j for j in range(C) for _ in range(n)]
        for idx, v in enumerate(_delay_lines(core, values, delays, "deskew")):
            m.d.comb += self.out[idx].eq(v)
        m.d.comb += self.out_valid.eq(rows[R - 1].valid_out & ~self.stall)

    def _os_pipelined(self, m, core, rows, advance, steps_in, odd_in):
        """Double-buffered accumulators: see the class docstring and ``docs/RTL.md``.

        Each PE copies its finished sum into its result register at the tile's last
        step (the ``last`` flag travels with the operands), so its accumulator takes the
        next tile at once. Column ``j`` is drained downwards for ``rows`` cycles from
        cycle ``S + rows - 1 + j`` (when its bottom PE has finished); PE row ``p`` moves
        only while the drain has not passed it (a thermometer travelling down with the
        drain), so the rows above, already free, can take the next tile's results. Port
        row ``i`` drives PE row ``rows - 1 - i``, so result rows leave in order."""
        R, C = self._rows, self._cols
        rem = Signal(range(self._max_steps + 1))  # steps still to sample
        slack = Signal(range(self._max_steps + R + 1))  # drain slack (see below)
        odd = Signal()
        accepted, feed = Signal(), Signal()
        # The next tile (S' steps, accepted at edge T') must satisfy T' >= T + S (its
        # operands follow ours) and T' + S' >= T + S + R (its drain follows ours):
        # `slack` is T + S + R - 1 - c in cycle c, counted down to 0.
        m.d.comb += [
            self.idle.eq((rem == 0) & (slack <= steps_in)),
            accepted.eq(self.start & self.idle),
            feed.eq(accepted | (rem != 0)),
        ]
        sample = self._phase(m, core, feed, accepted)
        m.d.comb += [
            self.a_ready.eq(_gate(feed & advance, sample)),
            self.b_ready.eq(_gate(feed & advance, sample)),
        ]
        laststep = Mux(accepted, steps_in == 1, rem == 1)
        with core.If(accepted):
            core.d.sync += [rem.eq(steps_in - 1), slack.eq(steps_in + R - 1), odd.eq(odd_in)]
        with core.Else():
            with core.If(rem != 0):
                core.d.sync += rem.eq(rem - 1)
            with core.If(slack != 0):
                core.d.sync += slack.eq(slack - 1)
        oddnow = Mux(accepted, odd_in, odd)
        self._left_edge(
            core,
            rows,
            [R - 1 - i for i in range(R)],
            {
                "valid_in": self._lane_valid(feed, laststep, oddnow),
                "first_in": accepted,
                "last_in": feed & laststep,
            },
        )
        self._top_edge(core, rows, list(range(C)), [1 + j for j in range(C)])
        # Column j's drain starts in cycle D_j = T + S + R - 1 + j; the last step is
        # sampled in cycle T + S - 2, so start_j is that pulse delayed R + 1 + j.
        chain = Signal(R + C, name="drain_start")
        core.d.sync += chain.eq(Cat(feed & laststep, chain[:-1]))
        start = [chain[R + j] for j in range(C)]
        for p, row in enumerate(rows):
            core.d.comb += [
                row.start.eq(Cat(*start) if p else 0),
                row.q_in.eq(rows[p - 1].q_out if p else 0),
                row.res_in.eq(rows[p - 1].res if p else 0),
            ]
        bottom = rows[R - 1]
        col_out = []
        for j in range(C):
            en = start[j] | bottom.q_out[j]  # drain step s < rows for column j
            reg = Signal(acc_shape(self._precision), name=f"col_out{j}")
            with core.If(en):
                core.d.sync += reg.eq(bottom.res.word_select(j, ACC_BITS))
            col_out.append(reg)
        en_last = start[C - 1] | bottom.q_out[C - 1]
        en_prev = (start[C - 1] if R > 1 else 0) | bottom.q_in[C - 1]
        out_valid, done_reg, done_pre = Signal(), Signal(), Signal()
        m.d.comb += done_pre.eq(en_last & ~en_prev)  # drain step s == rows - 1
        core.d.sync += [out_valid.eq(en_last), done_reg.eq(done_pre)]
        deskew = _delay_lines(core, col_out, [C - 1 - j for j in range(C)], "deskew")
        m.d.comb += [self.out[j].eq(deskew[j]) for j in range(C)]
        m.d.comb += self.out_valid.eq(out_valid & advance)
        cnt = self._count_tiles(core, accepted, done_pre)
        return cnt != 0, done_reg, done_pre

    def _ws_pipelined(self, m, core, rows, advance, steps_in, odd_in):
        """Double-buffered weights: tile ``n+1``'s weights shift into the shadow registers
        (column ``j`` skewed by ``j + 1`` cycles, row ``p`` only from the cycle the load
        front reaches it to the load's last cycle) while tile ``n`` streams; each PE switches to them at tile ``n+1``'s
        first activation. Accept rule: ``T' >= T + max(S, rows)``."""
        R, C = self._rows, self._cols
        hold = Signal(range(max(self._max_steps, R) + 1))  # cycles until idle
        lrem = Signal(range(R + 1))  # weight rows still to load
        xpend = Signal()  # a stream waits for its load
        kp = Signal(range(self._max_steps + 1))  # ... its steps
        oddp = Signal()
        xrem = Signal(range(self._max_steps + 1))  # steps still to stream
        oddx = Signal()
        accepted, load, xstart, feed = Signal(), Signal(), Signal(), Signal()
        m.d.comb += [
            self.idle.eq(hold == 0),
            accepted.eq(self.start & self.idle),
            load.eq(accepted | (lrem != 0)),
            xstart.eq(xpend & (lrem == 0)),
            feed.eq(xstart | (xrem != 0)),
        ]
        sample = self._phase(m, core, feed, xstart)
        m.d.comb += [
            self.a_ready.eq(_gate(feed & advance, sample)),
            self.b_ready.eq(load & advance),
        ]
        laststep = Mux(xstart, kp == 1, xrem == 1)
        oddnow = Mux(xstart, oddp, oddx)
        with core.If(accepted):
            core.d.sync += [
                lrem.eq(R - 1),
                xpend.eq(1),
                kp.eq(steps_in),
                oddp.eq(odd_in),
                hold.eq(Mux(steps_in > R, steps_in, R) - 1),
            ]
        with core.Else():
            with core.If(lrem != 0):
                core.d.sync += lrem.eq(lrem - 1)
            with core.If(hold != 0):
                core.d.sync += hold.eq(hold - 1)
            with core.If(xstart):
                core.d.sync += xpend.eq(0)
        with core.If(xstart):
            core.d.sync += [xrem.eq(kp - 1), oddx.eq(oddp)]
        with core.Elif(xrem != 0):
            core.d.sync += xrem.eq(xrem - 1)
        self._left_edge(
            core,
            rows,
            list(range(R)),
            {"valid_in": self._lane_valid(feed, laststep, oddnow), "first_in": xstart},
        )
        # column j: the weights, the load's first cycle (the front) and its last cycle,
        # delayed j + 1 cycles
        load_end = load & Mux(accepted, R == 1, lrem == 1)
        skewed = _delay_lines(
            core,
            [Cat(self.b[j], accepted, load_end) for j in range(C)],
            [j + 1 for j in range(C)],
            "wload",
        )
        opw = len(self.b[0])
        load_ends = Cat(*[skewed[j][opw + 1] for j in range(C)])
        for p, row in enumerate(rows):
            core.d.comb += [
                row.load_end.eq(load_ends),
                row.ldf_in.eq(rows[p - 1].ldf_out if p else Cat(*[v[opw] for v in skewed])),
                row.w_in.eq(rows[p - 1].w if p else Cat(*[v[:opw] for v in skewed])),
            ]
        self._ws_bottom(m, core, rows)
        # done: the last step, sampled in cycle T + R + S - 2, leaves in cycle N.
        chain = Signal(R + C, name="done_chain")
        core.d.sync += chain.eq(Cat(feed & laststep, chain[:-1]))
        done_reg, done_pre = chain[R + C - 1], chain[R + C - 2]
        cnt = self._count_tiles(core, accepted, done_pre)
        return cnt != 0, done_reg, done_pre
