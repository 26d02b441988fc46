"""Processing element: one int8 x int8 multiplier and an int32 accumulator."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._checks import check_choice

__all__ = ["DATAFLOWS", "DATA_BITS", "ACC_BITS", "ProcessingElement"]

#: The two dataflows a PE (and the array built from it) supports.
DATAFLOWS = ("os", "ws")
#: Width of the operands (two's complement int8).
DATA_BITS = 8
#: Width of the accumulator / partial sum. Overflow WRAPS modulo ``2**ACC_BITS`` (two's
#: complement), it never saturates; this equals ``wia_hw.emulator.golden.ACC_BITS``.
ACC_BITS = 32


class ProcessingElement(wiring.Component):
    """One cell of the systolic array, for either dataflow.

    All ``*_out`` ports and ``acc``/``psum_out``/``w`` are registers: a value presented
    on an input during cycle ``t`` appears on the matching output during cycle ``t+1``
    (one cycle of latency), which is what makes the array systolic. ``mac`` is
    combinational: it is high in the cycles in which the PE performs a multiply-
    accumulate (it equals ``valid_in``); the array sums it for the MAC counter.

    Arithmetic: ``int8 x int8`` products are exact (16 bits); accumulation is modulo
    ``2**32`` (wrap, not saturate), matching the golden model ``int8_matmul``.

    Output-stationary (``dataflow="os"``) ports
        ``a_in``, ``b_in`` (in, ``signed(8)``): operands from the left / top neighbour.
        ``valid_in`` (in): the operands are a step of the current tile.
        ``first_in`` (in): this step is ``k == 0``; the accumulator restarts from zero.
        ``shift`` (in), ``acc_in`` (in, ``signed(32)``): drain; when ``shift`` is high
        and ``valid_in`` low, ``acc`` loads ``acc_in`` (the neighbour's accumulator).
        ``a_out``, ``b_out``, ``valid_out``, ``first_out`` (out): the inputs, registered,
        for the right / bottom neighbours. ``acc`` (out, ``signed(32)``): the accumulator.
        Per cycle: ``acc <= (0 if first_in else acc) + a_in * b_in`` when ``valid_in``.

    Weight-stationary (``dataflow="ws"``) ports
        ``w_in`` (in, ``signed(8)``), ``load`` (in): ``w <= w_in`` when ``load``; ``w``
        (out) feeds the PE below, so a column of PEs is a weight shift register.
        ``x_in`` (in, ``signed(8)``), ``valid_in`` (in): activation from the left.
        ``psum_in`` (in, ``signed(32)``): partial sum from the PE above (0 at the top).
        ``x_out``, ``valid_out`` (out): the activation and its valid, registered.
        ``psum_out`` (out, ``signed(32)``): ``psum_in + x_in * w`` when ``valid_in``.

    Parameters
    ----------
    dataflow:
        ``"os"`` or ``"ws"``. ``TypeError`` if not a string, ``ValueError`` otherwise.
    """

    def __init__(self, dataflow: str = "os") -> None:
        self._dataflow = check_choice("dataflow", dataflow, DATAFLOWS)
        data, acc = signed(DATA_BITS), signed(ACC_BITS)
        if dataflow == "os":
            members = {
                "a_in": In(data), "b_in": In(data), "valid_in": In(1), "first_in": In(1),
                "shift": In(1), "acc_in": In(acc),
                "a_out": Out(data), "b_out": Out(data), "valid_out": Out(1),
                "first_out": Out(1), "acc": Out(acc), "mac": Out(1),
            }
        else:
            members = {
                "x_in": In(data), "valid_in": In(1), "w_in": In(data), "load": In(1),
                "psum_in": In(acc),
                "x_out": Out(data), "valid_out": Out(1), "w": Out(data),
                "psum_out": Out(acc), "mac": Out(1),
            }
        super().__init__(members)

    @property
    def dataflow(self) -> str:
        """``"os"`` or ``"ws"``."""
        return self._dataflow

    def elaborate(self, platform: object) -> Module:
        m = Module()
        m.d.comb += self.mac.eq(self.valid_in)
        m.d.sync += self.valid_out.eq(self.valid_in)
        if self._dataflow == "os":
            m.d.sync += [
                self.a_out.eq(self.a_in),
                self.b_out.eq(self.b_in),
                self.first_out.eq(self.first_in),
            ]
            with m.If(self.valid_in):
                base = Mux(self.first_in, 0, self.acc)
                m.d.sync += self.acc.eq(base + self.a_in * self.b_in)
            with m.Elif(self.shift):
                m.d.sync += self.acc.eq(self.acc_in)
        else:
            m.d.sync += self.x_out.eq(self.x_in)
            with m.If(self.load):
                m.d.sync += self.w.eq(self.w_in)
            with m.If(self.valid_in):
                m.d.sync += self.psum_out.eq(self.psum_in + self.x_in * self.w)
        return m
