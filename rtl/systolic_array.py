"""Systolic array of int8 processing elements, output- or weight-stationary."""

from __future__ import annotations

from amaranth.hdl import EnableInserter, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._checks import check_choice, check_int
from .pe import ACC_BITS, DATA_BITS, DATAFLOWS, ProcessingElement
from .perf_counters import REGISTER_MAP, PerfCounters

__all__ = ["SystolicArray", "MAX_DIM"]

#: Largest ``rows`` / ``cols`` accepted.
MAX_DIM = 64


def _adder_tree(values: list) -> object:
    """Sum of ``values`` as a balanced tree of adders (depth ``log2(n)``)."""
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


class SystolicArray(wiring.Component):
    """A ``rows x cols`` systolic array computing one int8 tile per ``start``.

    The input skew (a diagonal of delay registers on the left and top edges), the
    output drain (OS) or de-skew (WS), the tile controller and a :class:`PerfCounters`
    block are inside the component. Arithmetic is that of :class:`ProcessingElement`:
    exact int8 products, int32 accumulation wrapping modulo ``2**32``.

    Timing convention
    -----------------
    *Edge* ``e`` is a rising clock edge and *cycle* ``e`` the clock period that follows
    it. A tile starts at the edge where ``start`` is sampled high (with ``idle`` high and
    ``stall`` low): that is edge 0. ``done`` is high during exactly one cycle, cycle
    ``N``, where, with ``D = depth``::

        N = D + 2 * rows + cols - 2      (= emulator.cycles.systolic_tile_cycles)

    for both dataflows, plus one cycle for every cycle in which ``stall`` was high while
    the tile was in flight. A new ``start`` is accepted already in cycle ``N - 1``
    (``idle`` is high then), so back-to-back tiles take ``N`` cycles each.

    Output-stationary (``dataflow="os"``): computes ``A @ B`` with ``A`` ``rows x D``
    and ``B`` ``D x cols``. Step ``k`` (``0 <= k < D``): ``a[i] = A[i, k]``,
    ``b[j] = B[k, j]``, sampled at edge ``k`` (``a_ready``/``b_ready`` are high in the
    cycle before each sampling edge). PE ``(i, j)`` multiplies step ``k`` in cycle
    ``i + j + k``; the accumulators are then shifted up, one row per cycle, and result
    row ``r`` (``out[j] = (A @ B)[r, j]``) is on ``out`` with ``out_valid`` high in cycle
    ``N - rows + 1 + r``. The last row and ``done`` share cycle ``N``.

    Weight-stationary (``dataflow="ws"``): computes ``X @ W`` with ``W`` ``rows x cols``
    held in the PEs and ``X`` ``D x rows`` streamed (``D`` = rows of ``X``, the emulator's
    ``M``). Weight load: at edge ``r`` (``0 <= r < rows``, ``b_ready`` high)
    ``b[j] = W[rows - 1 - r, j]`` (the weights shift down, so the last row enters first).
    Step ``m`` (``0 <= m < D``): ``a[i] = X[m, i]``, sampled at edge ``rows + m``
    (``a_ready`` high). PE ``(i, j)`` multiplies in cycle ``rows + m + i + j``; partial
    sums flow down and are de-skewed, so row ``m`` of ``X @ W`` is on ``out`` with
    ``out_valid`` in cycle ``2 * rows + cols - 1 + m``; the last row and ``done`` share
    cycle ``N``.

    Ports
    -----
    start (in, 1): begin a tile; sampled when ``idle`` is high and ``stall`` is low.
    depth (in, ``range(max_depth + 1)``): ``D``, sampled with ``start``; 0 acts as 1.
    a (in, ``signed(8)`` x rows), b (in, ``signed(8)`` x cols): operand steps (above).
    stall (in, 1): hold. In a cycle with ``stall`` high no register of the tile changes at
    the next edge (nothing is sampled, nothing advances) and ``out_valid``, ``done``,
    ``a_ready``, ``b_ready`` read low; every such cycle of an in-flight tile is counted as
    a stall cycle and delays ``done`` by one cycle.
    idle (out, 1): a ``start`` would be accepted at the next edge.
    a_ready, b_ready (out, 1): ``a`` / ``b`` is sampled at the next edge (combinational;
    includes the ``start`` edge).
    out (out, ``signed(32)`` x cols), out_valid (out, 1), done (out, 1): result rows.
    ctr_addr (in, ``range(4)``), ctr_clear (in, 1), ctr_rdata (out, ``counter_width``):
    the :class:`PerfCounters` register interface (read latency 1 cycle). A tile is *in
    flight* from cycle 0 to cycle ``N - 1`` (and while ``done`` is held back by
    ``stall``); ``cycles`` counts those cycles, ``busy_cycles`` those in which at least
    one PE performs a MAC, ``macs`` the MACs, ``stall_cycles`` the stalled ones. Per
    unstalled tile: ``N`` cycles, ``D + rows + cols - 2`` busy cycles,
    ``rows * cols * D`` MACs.

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

    Raises ``TypeError`` for a non-integer / non-string argument and ``ValueError`` for
    one out of range; the message names the parameter and shows the value.
    """

    def __init__(self, rows: int = 4, cols: int = 4, dataflow: str = "os",
                 max_depth: int = 1024, counter_width: int = 48) -> None:
        self._rows = check_int("rows", rows, 1, MAX_DIM)
        self._cols = check_int("cols", cols, 1, MAX_DIM)
        self._dataflow = check_choice("dataflow", dataflow, DATAFLOWS)
        self._max_depth = check_int("max_depth", max_depth, 1, 1 << 16)
        self._counter_width = check_int("counter_width", counter_width, 8, 64)
        super().__init__({
            "start": In(1),
            "depth": In(range(self._max_depth + 1)),
            "stall": In(1),
            "a": In(signed(DATA_BITS)).array(self._rows),
            "b": In(signed(DATA_BITS)).array(self._cols),
            "idle": Out(1),
            "a_ready": Out(1),
            "b_ready": Out(1),
            "out": Out(signed(ACC_BITS)).array(self._cols),
            "out_valid": Out(1),
            "done": Out(1),
            "ctr_addr": In(range(len(REGISTER_MAP))),
            "ctr_clear": In(1),
            "ctr_rdata": Out(self._counter_width),
        })

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

    def elaborate(self, platform: object) -> Module:
        m = Module()
        core = Module()  # everything that `stall` freezes
        R, C = self._rows, self._cols
        advance = Signal()
        m.d.comb += advance.eq(~self.stall)

        # ---- tile controller ---------------------------------------------------------
        running = Signal()
        t = Signal(range(self._max_depth + 2 * R + C))  # index of the current cycle
        k = Signal(range(self._max_depth + 1))           # depth of the tile in flight
        done_reg = Signal()
        last = Signal()
        accepted = Signal()
        m.d.comb += [
            last.eq(running & (t == k + (2 * R + C - 3))),
            self.idle.eq(~running | last),
            accepted.eq(self.start & self.idle),
        ]
        with core.If(accepted):
            core.d.sync += [
                running.eq(1), t.eq(0), k.eq(Mux(self.depth == 0, 1, self.depth)),
            ]
        with core.Elif(last):
            core.d.sync += running.eq(0)
        with core.Elif(running):
            core.d.sync += t.eq(t + 1)
        core.d.sync += done_reg.eq(last)
        m.d.comb += self.done.eq(done_reg & advance)

        # ---- PE grid -----------------------------------------------------------------
        pes = [[ProcessingElement(self._dataflow) for _ in range(C)] for _ in range(R)]
        for i in range(R):
            for j in range(C):
                core.submodules[f"pe_{i}_{j}"] = pes[i][j]

        def delay_chain(value: object, length: int, name: str) -> Signal:
            """``length`` registers in series after ``value``; returns the last one."""
            prev = value
            for n in range(length):
                reg = Signal.like(value, name=f"{name}_d{n}")
                core.d.sync += reg.eq(prev)
                prev = reg
            return prev

        if self._dataflow == "os":
            self._elaborate_os(m, core, pes, delay_chain, running, t, k, accepted, advance)
        else:
            self._elaborate_ws(m, core, pes, delay_chain, running, t, k, accepted, advance)

        m.submodules.core = EnableInserter(advance)(core)

        # ---- performance counters (never stalled: they count the stalls) -------------
        macs = Signal(range(R * C + 1))
        m.d.comb += macs.eq(_adder_tree([pe.mac for row in pes for pe in row]))
        counters = PerfCounters(max_macs_per_cycle=R * C, width=self._counter_width)
        m.submodules.counters = counters
        in_flight = Signal()
        m.d.comb += [
            in_flight.eq(running | (done_reg & self.stall)),
            counters.enable.eq(in_flight),
            counters.macs.eq(Mux(advance, macs, 0)),
            counters.stall.eq(in_flight & self.stall),
            counters.clear.eq(self.ctr_clear),
            counters.addr.eq(self.ctr_addr),
            self.ctr_rdata.eq(counters.rdata),
        ]
        return m

    def _elaborate_os(self, m, core, pes, delay_chain, running, t, k, accepted, advance):
        R, C = self._rows, self._cols
        feed, drain = Signal(), Signal()
        m.d.comb += [
            feed.eq(accepted | (running & (t + 1 < k))),
            drain.eq(running & (t >= k + (R + C - 2))),
            self.a_ready.eq(feed & advance),
            self.b_ready.eq(feed & advance),
        ]
        # Left edge: row i is sampled into an input register and delayed i more cycles,
        # with its valid / first-step flags alongside.
        for i in range(R):
            pe = pes[i][0]
            core.d.comb += [
                pe.a_in.eq(delay_chain(self.a[i], i + 1, f"a{i}")),
                pe.valid_in.eq(delay_chain(feed, i + 1, f"a{i}_valid")),
                pe.first_in.eq(delay_chain(accepted, i + 1, f"a{i}_first")),
            ]
        # Top edge: column j is sampled and delayed j more cycles.
        for j in range(C):
            core.d.comb += pes[0][j].b_in.eq(delay_chain(self.b[j], j + 1, f"b{j}"))
        out_valid = Signal()
        out_regs = [Signal(signed(ACC_BITS), name=f"out_reg{j}") for j in range(C)]
        for i in range(R):
            for j in range(C):
                pe = pes[i][j]
                if j > 0:
                    left = pes[i][j - 1]
                    core.d.comb += [
                        pe.a_in.eq(left.a_out),
                        pe.valid_in.eq(left.valid_out),
                        pe.first_in.eq(left.first_out),
                    ]
                if i > 0:
                    core.d.comb += pe.b_in.eq(pes[i - 1][j].b_out)
                below = pes[i + 1][j].acc if i + 1 < R else 0
                core.d.comb += [pe.shift.eq(drain), pe.acc_in.eq(below)]
        # Drain: the top row leaves into the output registers while the rest shift up.
        core.d.sync += out_valid.eq(drain)
        with core.If(drain):
            core.d.sync += [out_regs[j].eq(pes[0][j].acc) for j in range(C)]
        m.d.comb += [self.out[j].eq(out_regs[j]) for j in range(C)]
        m.d.comb += self.out_valid.eq(out_valid & advance)

    def _elaborate_ws(self, m, core, pes, delay_chain, running, t, k, accepted, advance):
        R, C = self._rows, self._cols
        load, feed = Signal(), Signal()
        m.d.comb += [
            load.eq(accepted | (running & (t + 1 < R))),
            feed.eq(running & (t + 1 >= R) & (t + 1 < k + R)),
            self.a_ready.eq(feed & advance),
            self.b_ready.eq(load & advance),
        ]
        for i in range(R):
            pe = pes[i][0]
            core.d.comb += [
                pe.x_in.eq(delay_chain(self.a[i], i + 1, f"a{i}")),
                pe.valid_in.eq(delay_chain(feed, i + 1, f"a{i}_valid")),
            ]
        for i in range(R):
            for j in range(C):
                pe = pes[i][j]
                core.d.comb += [
                    pe.load.eq(load),
                    pe.w_in.eq(pes[i - 1][j].w if i > 0 else self.b[j]),
                    pe.psum_in.eq(pes[i - 1][j].psum_out if i > 0 else 0),
                ]
                if j > 0:
                    left = pes[i][j - 1]
                    core.d.comb += [pe.x_in.eq(left.x_out), pe.valid_in.eq(left.valid_out)]
        # De-skew: column j leaves the bottom j cycles before column cols-1.
        for j in range(C):
            m.d.comb += self.out[j].eq(
                delay_chain(pes[R - 1][j].psum_out, C - 1 - j, f"deskew{j}"))
        m.d.comb += self.out_valid.eq(pes[R - 1][C - 1].valid_out & advance)
