"""The SimPy model of one NPU: cores (systolic array, vector unit, control core, DMA),
the memory hierarchy, power and temperature, and the hardware counters.

Execution is event-driven at tile granularity. A kernel is cut into tiles (work items);
each core runs one SimPy process over its share of them, double-buffered: the DMA
engine stages the operands of tile ``t+1`` into L1 while the array computes tile ``t``.
A tile's load waits for a free buffer and for a DMA engine; its compute waits for its
operands and for the previous tile. A core's operand loads and result stores are two
in-order streams on its ``dma.engines_per_core`` engines (with one, they take turns).
Loads and stores book the shared L2 port and HBM channels
(:class:`~wia_hw.emulator.memory.BandwidthPort`) at the cycle they are issued, so cores
contend for them and every port serves requests in arrival order.
Compute time of a tile is closed-form from :mod:`~wia_hw.emulator.cycles`; no Python
loop runs per clock cycle. Kernels run one after another with a barrier between them.
"""

from __future__ import annotations

import gc
import inspect
import math
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import simpy

from .config import DeviceSpec
from .control import BranchPredictor
from .counters import LEVELS, Counter, Counters
from .cycles import (
    systolic_issue_interval,
    systolic_steps,
    systolic_tile_counters,
    systolic_tile_cycles,
    vector_op_cycles,
)
from .kernels import (
    GemmKernel,
    Kernel,
    MemoryKernel,
    Region,
    Tile,
    TiledKernel,
    VectorKernel,
)
from .memory import MemorySystem
from .power import ThermalModel

__all__ = ["CoreState", "Device", "KernelRecord", "TraceEvent", "TraceLog", "Tile"]


@dataclass(frozen=True)
class TraceEvent:
    """One interval on one track: ``kind`` is ``compute``, ``dma`` or ``store``.

    A ``dma`` event (one tile's operand load) also carries the L1 and L2 misses the
    load caused (each a block fetched from the next level).
    """

    kind: str
    track: str
    start: int
    end: int
    kernel: str
    nbytes: int = 0
    l1_misses: int = 0
    l2_misses: int = 0


#: TraceEvent's fields, in order: one row of a TraceLog
_TRACE_FIELDS = ("kind", "track", "start", "end", "kernel", "nbytes", "l1_misses", "l2_misses")
_ROW = len(_TRACE_FIELDS)


class TraceLog(Sequence[TraceEvent]):
    """A device's event trace: one :class:`TraceEvent` per tile compute, operand load and
    result store (and PIM kernel), in the order the device booked them.

    While the device runs, an event is one row of the eight fields (``kind, track,
    start, end, kernel, nbytes, l1_misses, l2_misses``) appended to a flat list: no
    object per event (a traced BERT-Large run books some 15,000). The
    :class:`TraceEvent` objects are built when an event is first read (indexing,
    iteration, ``==``) and kept, so a log read twice gives the same objects; equal to
    ``TraceEvent(*row)`` field by field. :meth:`rows` gives the rows as tuples without
    building them (what the profiling report's JSON and timeline read). ``append`` and
    ``extend`` add events at the end; a log is otherwise read-only.
    """

    __slots__ = ("_flat", "_built")

    def __init__(self, events: Iterable[TraceEvent] = ()) -> None:
        self._flat: list[Any] = []  # the rows, field after field
        self._built: list[TraceEvent] = []  # the first len(_built) events, built
        self.extend(events)

    def append(self, event: TraceEvent) -> None:
        """Add ``event`` at the end (a :class:`TraceEvent`; else ``TypeError``)."""
        if not isinstance(event, TraceEvent):
            raise TypeError(f"a TraceLog holds TraceEvents, got {type(event).__name__}")
        if len(self._built) * _ROW == len(self._flat):  # all built so far: keep this one
            self._built.append(event)
        d = event.__dict__
        self._flat.extend([d[f] for f in _TRACE_FIELDS])

    def extend(self, events: Iterable[TraceEvent]) -> None:
        """Add ``events`` at the end (another log's rows are copied, nothing built)."""
        if isinstance(events, TraceLog):
            self._flat.extend(events._flat)
        else:
            for e in events:
                self.append(e)

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """The events as tuples of their eight fields, in order, without building them."""
        it = iter(self._flat)
        return zip(*([it] * _ROW), strict=True)

    def _events(self) -> list[TraceEvent]:
        """Every event, built: those not built yet are made now, all at once."""
        built, flat = self._built, self._flat
        if len(built) * _ROW < len(flat):
            new = object.__new__
            enabled = gc.isenabled()
            gc.disable()  # objects of strings and ints: no cycle for the collector to find
            try:
                it = iter(flat[len(built) * _ROW :])
                for row in zip(*([it] * _ROW), strict=True):
                    e = new(TraceEvent)  # as TraceEvent(*row), without frozen __setattr__
                    d = e.__dict__
                    (
                        d["kind"],
                        d["track"],
                        d["start"],
                        d["end"],
                        d["kernel"],
                        d["nbytes"],
                        d["l1_misses"],
                        d["l2_misses"],
                    ) = row
                    built.append(e)
            finally:
                if enabled:
                    gc.enable()
        return built

    def __len__(self) -> int:
        return len(self._flat) // _ROW

    def __getitem__(self, i: Any) -> Any:
        return self._events()[i]

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self._events())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TraceLog):
            return self._flat == other._flat
        if isinstance(other, list):
            return self._events() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"TraceLog({self._events()!r})"


class CoreState:
    """What one core is doing, kept up to date for a sampling profiler.

    Written by the core's tile program only when ``Device.core_state`` is set (no cost
    otherwise). ``kernel``: the kernel the core runs (``None`` before the first);
    ``end``: the cycle the core finishes it (``None`` while unknown); ``tile``/``tiles``:
    the last tile issued and how many the core has; ``compute``/``prev_compute``: the
    last two compute intervals booked (a tile's compute is booked when its load is
    issued, at most two ahead, so a cycle inside neither is not computing); ``load``:
    the last operand load interval; ``pending_stores``: result stores waiting to drain.
    """

    __slots__ = (
        "kernel",
        "end",
        "tile",
        "tiles",
        "compute",
        "prev_compute",
        "load",
        "pending_stores",
    )

    def __init__(self) -> None:
        self.kernel: str | None = None
        self.end: int | None = None
        self.tile = 0
        self.tiles = 0
        self.compute = (0, 0)
        self.prev_compute = (0, 0)
        self.load = (0, 0)
        self.pending_stores = 0


@dataclass
class KernelRecord:
    """What one kernel did: its interval and its counter deltas."""

    name: str
    op: str
    group: str
    kind: str  # "gemm", "vector", or an extension unit ("pim", ...)
    provider: str
    precision: str
    start_cycle: int
    end_cycle: int
    counters: Counters
    flops: int
    macs: int
    slot_macs: int
    tiles: int
    cores_used: int
    compulsory_bytes: int
    frequency_factor: float
    temperature_c: float
    power_w: float
    core_busy_cycles: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # figures an extension reports
    #: L2 bytes this kernel made dirty (written back to HBM later, once) and the bytes
    #: written back during it (of any kernel's dirty blocks; part of counters.bytes.hbm).
    dirtied_bytes: int = 0
    writeback_bytes: int = 0
    #: the part of ``writeback_bytes`` the L2 controller wrote eagerly in the kernel's
    #: idle HBM time (``memory.eager_writeback``): background traffic that never
    #: delayed the kernel (in counters.bytes at HBM and L2, and in its energy)
    eager_writeback_bytes: int = 0

    @property
    def cycles(self) -> int:
        return self.end_cycle - self.start_cycle


class Device:
    """One emulated NPU built from a :class:`~wia_hw.emulator.config.DeviceSpec`.

    The device keeps its state between calls of :meth:`execute` (time, caches,
    temperature, counters), like a real device between launches.
    ``trace``: ``None`` (no trace), or a list or :class:`TraceLog` to record a
    :class:`TraceEvent` per tile compute, load and store (see :attr:`trace`).
    """

    def __init__(
        self, spec: DeviceSpec, *, trace: TraceLog | list[TraceEvent] | None = None
    ) -> None:
        self.spec = spec
        self.env = simpy.Environment()
        self.counters = Counters()
        self.memory = MemorySystem(spec, self.counters)
        self.thermal = ThermalModel(spec.thermal)
        self.predictors = [
            BranchPredictor(spec.compute.control.predictor) for _ in range(spec.compute.cores)
        ]
        self.trace = trace
        self.records: list[KernelRecord] = []
        #: One CoreState per core while a sampling profiler watches, else None.
        self.core_state: list[CoreState] | None = None
        a = spec.compute.array
        self._rows, self._cols, self._df = a.rows, a.cols, a.dataflow
        self._pipelined = a.pipelined
        self._launch_cycles = math.ceil(
            spec.compute.control.launch_overhead_ns * spec.clock_ghz - 1e-9
        )
        self._timing: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        # the RC model advances on the device timeline, at least every 1e-4 of its time
        # constant, with the energy booked since its last step (see _heat)
        th = spec.thermal
        self._heat_step = max(
            1, int(th.resistance_c_per_w * th.capacitance_j_per_c * self.spec.clock_hz * 1e-4)
        )
        self._heat_cycle = 0  # cycle up to which the RC model has advanced
        self._heat_pj = 0.0  # energy booked (MACs) and not yet given to it
        self._heat_given_pj = 0.0  # dynamic energy given to it in this accounting interval
        self._heat_bytes = dict.fromkeys(LEVELS, 0)  # byte counters at its last step
        self._clock_cycles = [0, 0]  # this kernel's array/vector work: nominal, throttled
        self._array_busy = 0  # this kernel's busy cycles (union over passes)
        #: this kernel's regions and their memory runs, by id (see _runs)
        self._run_memo: dict[int, tuple[Region, Any]] = {}

    # -- public ----------------------------------------------------------------------
    @property
    def trace(self) -> TraceLog | None:
        """The :class:`TraceLog` the device records its events into (``None``: none).
        Assigning a list records into a new log that starts with the list's events (the
        list itself is not filled); assigning a log records into that log; ``None``
        stops recording. Recording never changes timing."""
        return self._trace

    @trace.setter
    def trace(self, value: TraceLog | list[TraceEvent] | None) -> None:
        log = value if value is None or isinstance(value, TraceLog) else TraceLog(value)
        self._trace = log
        self._trace_flat = None if log is None else log._flat  # where rows are appended

    @property
    def now(self) -> int:
        return int(self.env.now)

    def execute(
        self, kernels: Sequence[Kernel], on_kernel: Callable[[KernelRecord], None] | None = None
    ) -> list[KernelRecord]:
        """Run ``kernels`` in order; returns one record per kernel.

        Built-in GEMM and vector kernels are tiled by the device; a
        :class:`~wia_hw.emulator.kernels.TiledKernel` brings its own tiles and runs on
        the same core machinery; a :class:`~wia_hw.emulator.kernels.MemoryKernel` runs
        inside the memory (processing in memory).
        """
        out: list[KernelRecord] = []
        for k in kernels:
            gen = self._in_memory(k, out) if isinstance(k, MemoryKernel) else self._kernel(k, out)
            proc = self.env.process(gen)
            self.env.run(until=proc)
            if on_kernel is not None:
                on_kernel(out[-1])
        return out

    def idle(self, cycles: int) -> None:
        """Let ``cycles`` pass with every unit idle (the device waits on the host, e.g.
        for a memory reservation): counts them and their static energy."""
        if cycles > 0:
            self.env.run(until=self.now + cycles)
            self.counters.cycles += cycles
            self._account_energy(cycles, {})

    def flush(self) -> int:
        """Write dirty L2 data back to HBM; returns the cycles it took."""
        start = self.now
        before = self.counters.copy()
        end = self.memory.flush(start)
        if end > start:
            self.env.run(until=end)
            self.counters.cycles += end - start
        # the bytes written back are charged as every kernel's are
        self._account_energy(end - start, self.counters.delta(before))
        return end - start

    # -- tiling ----------------------------------------------------------------------
    def _gemm_tiles(self, k: GemmKernel) -> list[Tile]:
        t = k.tiling
        R, C, df = self._rows, self._cols, self._df
        rate = self.spec.compute.array.rate(k.precision)
        arrays = self.spec.compute.arrays_per_core
        e_c = k.c.elem_bytes
        e = k.a.elem_bytes
        mt, nt = -(-k.m // t.tm), -(-k.n // t.tn)
        kt, bt = -(-k.k // t.tk), -(-k.batch // t.tb)
        tiles: list[Tile] = []
        outer, inner = (range(mt), range(nt)) if t.order == "mn" else (range(nt), range(mt))
        cache: dict[tuple[int, int, int, int], tuple[int, int, int, int, int]] = {}
        a_regions: dict[tuple, Region] = {}
        b_regions: dict[tuple, Region] = {}
        for bb in range(bt):
            b0, b1 = bb * t.tb, min(k.batch, (bb + 1) * t.tb)
            nb = b1 - b0
            for o in outer:
                for q in inner:
                    i, j = (o, q) if t.order == "mn" else (q, o)
                    m0, m1 = i * t.tm, min(k.m, (i + 1) * t.tm)
                    n0, n1 = j * t.tn, min(k.n, (j + 1) * t.tn)
                    for kk in range(kt):
                        k0, k1 = kk * t.tk, min(k.k, (kk + 1) * t.tk)
                        mi, ni, ki = m1 - m0, n1 - n0, k1 - k0
                        key = (nb, mi, ni, ki)
                        geo = cache.get(key)
                        if geo is None:
                            geo = self._gemm_geometry(
                                df, R, C, rate, nb, mi, ni, ki, e, e_c, last=False
                            ) + (systolic_steps(ki if df == "os" else mi, rate),)
                            if arrays > 1:  # passes dealt to the core's arrays in rounds
                                p_, pc_, l1_, slot_, busy_, st_ = geo
                                rounds = -(-p_ // arrays)
                                geo = (rounds, pc_, l1_, slot_ // p_ * rounds * arrays, busy_, st_)
                            cache[key] = geo
                        passes, pass_cycles, l1_bytes, slot, busy, steps = geo
                        last = kk == kt - 1
                        if t.tb > 1 or nb > 1:
                            ar = (b0 * k.m, b1 * k.m)
                        else:
                            ar = (b0 * k.m + m0, b0 * k.m + m1)
                        # operand regions are shared by the tiles that load them (one
                        # object each: the device computes a region's blocks once)
                        a_reg = a_regions.get((ar, k0, k1))
                        if a_reg is None:
                            a_reg = a_regions[(ar, k0, k1)] = self._a_region(k, ar, k0, k1)
                        b_key = self._b_key(k, b0, b1, k0, k1, n0, n1)
                        b_reg = b_regions.get(b_key)
                        if b_reg is None:
                            b_reg = b_regions[b_key] = (k.b, *b_key)
                        loads: list[Region] = [a_reg, b_reg]
                        stores: list[Region] = []
                        out_bytes = nb * mi * ni * e_c
                        if last:
                            stores.append((k.c, ar[0], ar[1], n0, n1))
                            if k.bias is not None:
                                bias = b_regions.get((-1, n0, n1))
                                if bias is None:
                                    bias = b_regions[(-1, n0, n1)] = (k.bias, 0, 1, n0, n1)
                                loads.append(bias)
                        # partial sums of a K-chunked tile are read-modified-written in L1
                        extra = 0 if kt == 1 else (out_bytes * (2 if kk else 1))
                        tiles.append(
                            Tile(
                                loads,
                                stores,
                                passes * pass_cycles,
                                0,
                                l1_bytes + extra + (out_bytes if last else 0),
                                passes,
                                nb * mi * ni * ki,
                                slot,
                                passes * busy,
                                (nb, mi, ni, ki),
                                origin=(b0, m0, n0, k0),
                                pass_steps=steps,
                            )
                        )
        return tiles

    @staticmethod
    def _a_region(k: GemmKernel, rows: tuple[int, int], k0: int, k1: int) -> Region:
        """The part of A a tile reads. When A's storage is not ``[batch*m, k]`` (an
        im2col view of a convolution's input), rows and columns map proportionally."""
        a = k.a
        mm = k.batch * k.m
        if a.rows == mm and a.cols == k.k:
            return (a, rows[0], rows[1], k0, k1)
        r0 = rows[0] * a.rows // mm
        r1 = max(r0 + 1, -(-rows[1] * a.rows // mm))
        c0 = k0 * a.cols // k.k
        c1 = max(c0 + 1, -(-k1 * a.cols // k.k))
        return (a, r0, min(r1, a.rows), c0, min(c1, a.cols))

    @staticmethod
    def _b_key(
        k: GemmKernel, b0: int, b1: int, k0: int, k1: int, n0: int, n1: int
    ) -> tuple[int, int, int, int]:
        """The rows and columns of B's storage a tile of batches ``[b0, b1)``, K range
        ``[k0, k1)`` and N range ``[n0, n1)`` reads: shared weights ``[k, n]``, a
        transposed B ``[batch*n, k]`` or a batched B ``[batch*k, n]``."""
        if k.b_shared:
            return (k0, k1, n0, n1)
        if k.b_transposed:
            if b1 - b0 > 1:
                return (b0 * k.n, b1 * k.n, k0, k1)
            return (b0 * k.n + n0, b0 * k.n + n1, k0, k1)
        return (b0 * k.k + k0, (b1 - 1) * k.k + k1, n0, n1)

    @staticmethod
    def _gemm_geometry(
        df: str,
        R: int,
        C: int,
        rate: Fraction,
        nb: int,
        mi: int,
        ni: int,
        ki: int,
        e: int,
        e_c: int,
        last: bool,
    ) -> tuple[int, int, int, int, int]:
        """(passes, cycles per pass, L1 bytes the array reads, MAC slots, busy per pass).

        Cycles and busy cycles of a pass come from :func:`systolic_tile_cycles` and
        :func:`systolic_tile_counters`, the functions the RTL is tested against.
        """
        if df == "os":
            pm, pn = -(-mi // R), -(-ni // C)
            passes = nb * pm * pn
            steps = systolic_steps(ki, rate)
            pass_cycles = systolic_tile_cycles("os", R, C, steps)
            busy = systolic_tile_counters("os", R, C, steps)[Counter.BUSY_CYCLES]
            # each pass streams its A rows and B columns out of L1
            l1 = nb * (mi * ki * pn + ki * ni * pm) * e
            slot = passes * R * C * ki
        else:
            pk, pn = -(-ki // R), -(-ni // C)
            passes = nb * pk * pn
            steps = systolic_steps(mi, rate)
            pass_cycles = systolic_tile_cycles("ws", R, C, steps)
            busy = systolic_tile_counters("ws", R, C, steps)[Counter.BUSY_CYCLES]
            # weights are loaded once per pass; inputs stream once per column block
            l1 = nb * (ki * ni + mi * ki * pn) * e
            slot = passes * R * C * mi
        return passes, pass_cycles, l1, slot, busy

    @staticmethod
    def _vector_cols(k: VectorKernel) -> int:
        return k.outputs[0].cols if k.outputs else 1

    def _vector_reduce_tiles(self, k: VectorKernel) -> tuple[list[Tile], tuple[int, ...]]:
        """Tiles of a reduction along the rows (``global_avgpool``: each output row of
        ``out_cols`` reduces an input row of ``k.inputs[0].cols``) cut into bands of
        ``k.rows_per_tile`` rows and chunks of ``k.cols_per_tile`` input columns, with
        the groups: one core reduces a band's chunks in order, keeping the partial
        results (a few values a row) in its registers, and stores the band's output
        rows with its last chunk. Long rows cut into thin row chunks instead load whole
        storage blocks for a few of their rows (1,024 rows of 65,536: 19x the input's
        bytes from HBM)."""
        v = self.spec.compute.vector
        cpe = int(v.cycles_per_element[k.vclass])
        inp = k.inputs[0]
        rpt, cpt = max(1, k.rows_per_tile), k.cols_per_tile
        tiles: list[Tile] = []
        groups: list[int] = []
        out_cols = self._vector_cols(k)
        for r0 in range(0, k.rows, rpt):
            r1 = min(k.rows, r0 + rpt)
            groups.append(len(tiles))
            for c0 in range(0, inp.cols, cpt):
                c1 = min(inp.cols, c0 + cpt)
                loads: list[Region] = [(inp, r0, r1, c0, c1)]
                stores: list[Region] = (
                    [(ref, r0, r1, 0, ref.cols) for ref in k.outputs] if c1 == inp.cols else []
                )
                elems = (r1 - r0) * (c1 - c0)  # every input element passes the unit
                cyc = vector_op_cycles(elems, v.lanes, cpe, v.pipeline_depth)
                nbytes = sum(
                    (r[2] - r[1]) * (r[4] - r[3]) * r[0].elem_bytes for r in loads + stores
                )
                tiles.append(
                    Tile(loads, stores, 0, cyc, nbytes, 0, 0, 0, 0, (r1 - r0, out_cols, elems))
                )
        return tiles, tuple(groups)

    def _vector_tiles(self, k: VectorKernel) -> list[Tile]:
        v = self.spec.compute.vector
        cpe = int(v.cycles_per_element[k.vclass])
        tiles = []
        rpt = max(1, k.rows_per_tile)
        cols = self._vector_cols(k)
        if k.cols_per_tile and k.cols_per_tile < cols:
            return self._vector_block_tiles(k, cpe, rpt, cols)
        for r0 in range(0, k.rows, rpt):
            r1 = min(k.rows, r0 + rpt)
            frac_rows = r1 - r0
            loads: list[Region] = []
            for idx, ref in enumerate(k.inputs):
                if k.vclass == "gather" and idx == len(k.inputs) - 1:
                    # rows of the table the tokens touch: taken as distinct and contiguous
                    g0 = r0 % ref.rows
                    loads.append((ref, g0, min(ref.rows, g0 + frac_rows), 0, ref.cols))
                elif ref.rows == k.rows:
                    loads.append((ref, r0, r1, 0, ref.cols))
                elif ref.rows > k.rows or k.split_inputs:
                    # rows in proportion: a slice or reduction over a leading axis, or
                    # one part of a concatenation, gives each row to one output chunk
                    a0 = r0 * ref.rows // k.rows
                    loads.append((ref, a0, max(a0 + 1, -(-r1 * ref.rows // k.rows)), 0, ref.cols))
                else:  # a broadcast operand (bias, scale, position table): whole
                    loads.append((ref, 0, ref.rows, 0, ref.cols))
            stores: list[Region] = [
                (
                    ref,
                    r0 * ref.rows // k.rows,
                    max(r0 * ref.rows // k.rows + 1, r1 * ref.rows // k.rows),
                    0,
                    ref.cols,
                )
                for ref in k.outputs
            ]
            elems = k.elements * frac_rows // k.rows
            cyc = vector_op_cycles(elems, v.lanes, cpe, v.pipeline_depth)
            nbytes = sum((r[2] - r[1]) * (r[4] - r[3]) * r[0].elem_bytes for r in loads + stores)
            tiles.append(
                Tile(
                    loads,
                    stores,
                    0,
                    cyc,
                    nbytes,
                    0,
                    0,
                    0,
                    0,
                    (frac_rows, k.outputs[0].cols if k.outputs else 1, elems),
                )
            )
        return tiles

    def _vector_block_tiles(self, k: VectorKernel, cpe: int, rpt: int, cols: int) -> list[Tile]:
        """Tiles of ``rpt`` rows x ``k.cols_per_tile`` columns of an elementwise kernel:
        inputs of ``k.rows`` rows and broadcast rows (fewer rows) are cut at the same
        columns; every input has the output's columns (the lowering checks it)."""
        v = self.spec.compute.vector
        cpt = k.cols_per_tile
        tiles = []
        for r0 in range(0, k.rows, rpt):
            r1 = min(k.rows, r0 + rpt)
            for c0 in range(0, cols, cpt):
                c1 = min(cols, c0 + cpt)
                loads: list[Region] = [
                    (ref, r0, r1, c0, c1) if ref.rows == k.rows else (ref, 0, ref.rows, c0, c1)
                    for ref in k.inputs
                ]
                stores: list[Region] = [(ref, r0, r1, c0, c1) for ref in k.outputs]
                elems = (r1 - r0) * (c1 - c0)
                cyc = vector_op_cycles(elems, v.lanes, cpe, v.pipeline_depth)
                nbytes = sum(
                    (r[2] - r[1]) * (r[4] - r[3]) * r[0].elem_bytes for r in loads + stores
                )
                tiles.append(
                    Tile(loads, stores, 0, cyc, nbytes, 0, 0, 0, 0, (r1 - r0, c1 - c0, elems))
                )
        return tiles

    def tiles_of(
        self, k: GemmKernel | VectorKernel | TiledKernel
    ) -> tuple[list[Tile], tuple[int, ...]]:
        """The tiles of a kernel and the start index of each group of tiles that one
        core runs in order (empty: every tile is its own group).

        A GEMM whose K is cut groups each output tile's K slices: their partial sums
        stay in one core's L1 (``_gemm_tiles``), so one core runs them all. Slices of
        one output tile on two cores would each hold a part of the sum with nothing
        to add them up (a split-K reduction across cores is not modelled); they did
        before, and made more cores slower: a 4096^3 GEMM on 64 cores of wia-npu
        gave each core one K slice of 16 output tiles, 0.428 ms against 0.225 on 32.
        """
        if isinstance(k, GemmKernel):
            tiles = self._gemm_tiles(k)
            kt = -(-k.k // k.tiling.tk)
            return tiles, tuple(range(0, len(tiles), kt)) if kt > 1 else ()
        if isinstance(k, VectorKernel):
            if k.cols_per_tile and k.inputs and k.inputs[0].cols > self._vector_cols(k):
                return self._vector_reduce_tiles(k)
            return self._vector_tiles(k), ()
        return list(k.tiles), tuple(k.groups)

    @staticmethod
    def shares_of(
        k: GemmKernel | VectorKernel | TiledKernel,
        tiles: Sequence[Any],
        groups: Sequence[int],
        spec: DeviceSpec,
    ) -> list[list[Any]]:
        """Every core's share of ``k``'s ``tiles`` (``tiles_of``), one list a core: a
        GEMM's on its ``GemmTiling.cores`` (the rest idle), a vector kernel's by its
        ``placement`` when it has one, else :meth:`partition`'s under the spec's
        ``tile_schedule``. A placement made for another chunking or another device (one
        of another length than the tiles, or naming a core the device does not have: a
        what-if re-chunked the kernel or runs it on fewer cores) is void, and the
        schedule deals the tiles."""
        cores = spec.compute.cores
        placement = getattr(k, "placement", ())
        if placement and len(placement) == len(tiles) and max(placement) < cores:
            out: list[list[Any]] = [[] for _ in range(cores)]
            for t, c in zip(tiles, placement, strict=True):
                out[c].append(t)
            return out
        active = k.tiling.active_cores(cores) if isinstance(k, GemmKernel) else cores
        shares = Device.partition(
            tiles,
            groups,
            active,
            spec.compute.tile_schedule,
            [t.origin for t in tiles] if isinstance(k, GemmKernel) else (),
        )
        return shares + [[] for _ in range(cores - active)]  # a core split: the rest idle

    @staticmethod
    def partition(
        tiles: Sequence[Any],
        groups: Sequence[int],
        cores: int,
        schedule: str = "contiguous",
        origins: Sequence[tuple[int, ...]] = (),
    ) -> list[list[Any]]:
        """The cores' shares of ``tiles`` (``spec.compute.tile_schedule``).

        ``contiguous``: contiguous runs of whole groups of tiles, one run per core,
        balanced by tile count. Core ``c``'s fair share ends at ``B_c`` (the shares
        differ by at most one tile, the larger ones first); a group goes to the first
        core whose share ends past the group's midpoint. Without groups every tile is
        one, and the runs are exactly the fair shares.

        ``round_robin``: group ``i`` goes to core ``i mod cores``. Without groups, the
        tiles of one GEMM output tile (equal ``origins[:3]``: its K slices) form a group.
        """
        total = len(tiles)
        if schedule == "round_robin":
            if groups:
                starts = list(groups)
            elif origins:
                starts = [i for i in range(total) if i == 0 or origins[i][:3] != origins[i - 1][:3]]
            else:
                starts = list(range(total))
            rr: list[list[Any]] = [[] for _ in range(cores)]
            for i, (a, b) in enumerate(zip(starts, starts[1:] + [total], strict=True)):
                rr[i % cores].extend(tiles[a:b])
            return rr
        return [tiles[a:b] for a, b in Device.contiguous_shares(groups, total, cores)]

    @staticmethod
    def contiguous_shares(groups: Sequence[int], total: int, cores: int) -> list[tuple[int, int]]:
        """The ``contiguous`` schedule's shares of ``total`` tiles in groups starting at
        ``groups`` (empty: every tile is its own group) as ``[start, end)`` per core
        (:meth:`partition`)."""
        if not groups:  # every tile its own group: exactly the fair shares
            out, lo = [], 0
            for c in range(cores):
                hi = lo + total // cores + (1 if c < total % cores else 0)
                out.append((lo, hi))
                lo = hi
            return out
        ends, acc = [], 0
        for c in range(cores):
            acc += total // cores + (1 if c < total % cores else 0)
            ends.append(acc)
        lo_hi = [[0, 0] for _ in range(cores)]
        core = 0
        for a, b in zip(groups, [*groups[1:], total], strict=True):
            while core < cores - 1 and a + b >= 2 * ends[core]:  # midpoint past the share
                core += 1
            if lo_hi[core][1] == lo_hi[core][0]:
                lo_hi[core][0] = a
            lo_hi[core][1] = b
        return [(a, b) for a, b in lo_hi]

    # -- processes -------------------------------------------------------------------
    def _kernel(
        self, k: GemmKernel | VectorKernel | TiledKernel, out: list[KernelRecord]
    ) -> Iterator[simpy.Event]:
        env = self.env
        start = self.now
        before = self.counters.copy()
        cores = self.spec.compute.cores
        if self._launch_cycles:  # the host launches the kernel; every core waits
            yield env.timeout(self._launch_cycles)
            self.counters.stall_cycles["launch"] += cores * self._launch_cycles
        factor = self._heat(self.now)
        self._clock_cycles = [0, 0]
        self._array_busy = 0
        self._run_memo = {}
        tiles, groups = self.tiles_of(k)
        shares = self.shares_of(k, tiles, groups, self.spec)
        wb0 = (self.memory.dirtied_bytes, self.memory.writeback_bytes)
        eager = self.memory.eager_mark(self.now)
        busy = [0] * cores
        procs = []
        for c, share in enumerate(shares):
            if share:
                procs.append(env.process(self._core(c, share, k, factor, busy)))
                self._tile_program(c, share)
        if procs:
            yield env.all_of(procs)
        end = self.now
        eager_b = self.memory.eager_writeback(eager, end)  # dirty blocks out in idle time
        elapsed = end - start
        c_ = self.counters
        work = elapsed - self._launch_cycles
        for c, s in enumerate(shares):  # cores idle at the barrier: dependency stall
            c_.stall_cycles["dependency"] += work - busy[c] if s else 0
        c_.cycles += elapsed
        # the work, counted once per kernel by the unit that did it
        if isinstance(k, GemmKernel):
            array_flops, vector_flops = 2 * k.macs, k.flops - 2 * k.macs
        elif isinstance(k, VectorKernel):
            array_flops, vector_flops = 0, k.flops
        else:
            array_flops, vector_flops = k.flops - k.vector_flops, k.vector_flops
        precision = getattr(k, "precision", "fp16")
        if k.macs:
            c_.macs += k.macs
            c_.macs_by_precision[precision] = c_.macs_by_precision.get(precision, 0) + k.macs
        c_.array_flops += array_flops
        c_.vector_flops += vector_flops
        c_.flops += k.flops
        c_.busy_cycles += self._array_busy
        nominal, throttled = self._clock_cycles
        if throttled > nominal:  # the clock the kernel's work ran at, on average (whole
            # cycles round each slowed pass up; the clock is never below the throttled one)
            factor = max(self.thermal.cfg.throttle_factor, nominal / throttled)
        on_units = isinstance(k, TiledKernel) and not k.array
        power = self._account_energy(
            elapsed,
            c_.delta(before),
            array=not on_units,
            extra_pj=k.energy_pj if isinstance(k, TiledKernel) else 0.0,
        )
        kind = (
            k.record_kind
            if isinstance(k, TiledKernel)
            else "gemm"
            if isinstance(k, GemmKernel)
            else "vector"
        )
        out.append(
            KernelRecord(
                name=k.name,
                op=k.op,
                group=k.group,
                kind=kind,
                provider=k.provider,
                precision=precision,
                start_cycle=start,
                end_cycle=end,
                counters=c_.delta(before),
                flops=k.flops,
                macs=k.macs,
                slot_macs=sum(t.slot_macs for t in tiles),
                tiles=len(tiles),
                cores_used=sum(1 for s in shares if s),
                compulsory_bytes=k.compulsory_bytes,
                frequency_factor=factor,
                temperature_c=self.thermal.temperature_c,
                power_w=power,
                core_busy_cycles=busy,
                extra=dict(getattr(k, "extra", {})),
                dirtied_bytes=self.memory.dirtied_bytes - wb0[0],
                writeback_bytes=self.memory.writeback_bytes - wb0[1],
                eager_writeback_bytes=eager_b,
            )
        )

    def _tile_program(self, core: int, share: list[Tile]) -> None:
        """The control core's tile program for one core's share: a loop over tiles, a
        loop over array passes; counts its instructions, branches and mispredicts."""
        ctl = self.spec.compute.control
        passes = [t.passes for t in share]
        self.counters.instructions += (
            ctl.instructions_per_kernel
            + ctl.instructions_per_tile * len(share)
            + ctl.instructions_per_pass * sum(passes)
        )
        pred = self.predictors[core]
        br, mp = pred.run("tiles", len(share))
        self.counters.branches += br
        self.counters.branch_mispredicts += mp
        run_start = 0
        for idx in range(1, len(passes) + 1):  # runs of equal pass counts
            if idx == len(passes) or passes[idx] != passes[run_start]:
                if passes[run_start]:
                    br, mp = pred.run("passes", passes[run_start], idx - run_start)
                    self.counters.branches += br
                    self.counters.branch_mispredicts += mp
                run_start = idx

    def _in_memory(self, k: MemoryKernel, out: list[KernelRecord]) -> Iterator[simpy.Event]:
        """A kernel that runs inside the memory (PIM) for ``k.cycles`` cycles: no core
        works and no byte crosses the HBM interface, except the write-back of dirty
        cached copies of its tensors before it starts; the banks hold the HBM channels
        meanwhile, and the copies it changes are dropped from the caches."""
        env = self.env
        start = self.now
        before = self.counters.copy()
        factor = self.thermal.frequency_factor
        wb0 = self.memory.writeback_bytes
        ready = self.memory.pim_coherence(k.reads, k.writes, start)
        end = ready + k.cycles  # the PIM units run at the memory's clock: no throttling
        self.memory.hold_channels(end)
        if end > env.now:
            yield env.timeout(end - env.now)
        elapsed = end - start
        c_ = self.counters
        c_.cycles += elapsed
        c_.instructions += k.commands
        c_.flops += k.flops
        c_.vector_flops += k.flops
        cores = self.spec.compute.cores
        c_.stall_cycles["dependency"] += cores * elapsed  # the cores wait for the memory
        delta = c_.delta(before)
        # the memory's own energy covers its operations: no vector-unit energy
        power = self._account_energy(
            elapsed, delta, array=False, vector=False, extra_pj=k.energy_pj
        )
        extra = dict(k.extra)
        if "npu_cycles_estimate" in extra:  # what running it on the cores would take
            extra["saved_cycles"] = extra["npu_cycles_estimate"] - elapsed
        if "npu_hbm_bytes_estimate" in extra:
            extra["saved_hbm_bytes"] = extra["npu_hbm_bytes_estimate"] - delta.bytes["hbm"]
        if self._trace_flat is not None:  # a TraceLog row (see TraceLog)
            self._trace_flat.extend(("compute", "pim", ready, end, k.name, 0, 0, 0))
        out.append(
            KernelRecord(
                name=k.name,
                op=k.op,
                group=k.group,
                kind=k.record_kind,
                provider=k.provider,
                precision=k.precision,
                start_cycle=start,
                end_cycle=end,
                counters=c_.delta(before),
                flops=k.flops,
                macs=0,
                slot_macs=0,
                tiles=1,
                cores_used=0,
                compulsory_bytes=k.compulsory_bytes,
                frequency_factor=factor,
                temperature_c=self.thermal.temperature_c,
                power_w=power,
                core_busy_cycles=[0] * cores,
                extra=extra,
                writeback_bytes=self.memory.writeback_bytes - wb0,
            )
        )

    def _core(
        self, core: int, tiles: list[Tile], k: Kernel, factor: float, busy: list[int]
    ) -> Iterator[simpy.Event]:
        env = self.env
        mem = self.memory
        setup = self.spec.dma.setup_cycles
        t0 = self.now
        # a load waits for its (double-buffered) operand buffer, so more than 2 loads in
        # flight change nothing, and more engines than loads in flight + 1 (the result
        # stores' stream) are never all busy: both are cut there, exactly
        in_flight = min(self.spec.dma.loads_in_flight, 2)
        engines = [t0] * min(self.spec.dma.engines_per_core, in_flight + 1)  # free cycles
        ld = t0  # the cycle the last operand load completes
        # the completions of the last `loads_in_flight` loads: a load issues once the
        # one that many back has completed (1: the previous one)
        lds = deque([t0] * in_flight, maxlen=in_flight)
        slot_free = [t0, t0]
        comp_done = t0
        store_done = t0
        pending: list[tuple[int, list[Region]]] = []
        stalls = self.counters.stall_cycles
        trace = self._trace_flat  # the trace's flat rows (see TraceLog), or None
        track = f"core{core}"
        dma_tracks = [f"dma{core}"] + [f"dma{core}.{e}" for e in range(1, len(engines))]
        l1_port = mem.l1_ports[core]
        misses = self.counters.misses
        st = self.core_state[core] if self.core_state is not None else None
        if st is not None:
            st.kernel, st.end, st.tiles = k.name, None, len(tiles)
        # the array (see _charge_array): the last pass it accepted, when, and its steps
        arr = [0, t0, t0, t0, 0, 0]  # steps, accepted, port free, busy end, lost, tail
        held: tuple[int, int] | None = None  # the last array tile's trace interval
        on_array = not isinstance(k, TiledKernel) or k.array
        mac_pj = (
            self.spec.energy.pj_per_mac.get(getattr(k, "precision", "fp16"), 0.0)
            if on_array
            else 0.0
        )
        clock = self._clock_cycles
        for idx, tile in enumerate(tiles):
            ready = slot_free[idx & 1]  # the tile's operand buffer is free
            if pending and pending[0][0] <= ready:  # results ready no later go first
                store_done = yield from self._drain(
                    core, engines, pending, ready, k.name, store_done
                )
            eng = engines.index(min(engines))
            ls = max(ready, engines[eng], lds[0])  # loads issue in order, a few in flight
            if ls > env.now and not _advance(env, ls):
                yield env.timeout(ls - env.now)
            if ld > env.now:
                # a prefetch (the previous load is still in flight): the loads other
                # cores need now are asked for first, as a controller serves demand
                # before prefetch
                yield env.timeout(0)
            now = int(env.now)
            runs = self._runs(tile.loads)
            if trace is not None:
                m1, m2 = misses["l1"], misses["l2"]
            ld = mem.load_runs(core, runs, now) + setup
            engines[eng] = ld
            lds.append(ld)
            if trace is not None:
                trace.extend(
                    (
                        "dma",
                        dma_tracks[eng],
                        now,
                        ld,
                        k.name,
                        sum([r[3] for r in runs]),
                        misses["l1"] - m1,
                        misses["l2"] - m2,
                    )
                )
            factor = self._heat(now)
            self._heat_pj += tile.macs * mac_pj
            port_cycles = l1_port.cycles(tile.l1_bytes)
            if self._pipelined and tile.pass_steps and not tile.vector_cycles:
                cs, done = self._charge_array(tile, ld, comp_done, port_cycles, factor, arr)
                comp_done = max(comp_done, done)
                if trace is not None:
                    if held is not None:
                        trace.extend(("compute", track, held[0], min(held[1], cs), k.name, 0, 0, 0))
                    held = (cs, done)
            else:
                cs = max(ld, comp_done)
                stalls["memory"] += max(0, ld - comp_done)
                work = max(tile.array_cycles + tile.vector_cycles, port_cycles)
                eff = work if factor >= 1.0 else math.ceil(work / factor)
                stalls["thermal"] += eff - work
                clock[0] += work
                clock[1] += eff
                self._array_busy += tile.busy_cycles
                comp_done = done = cs + eff
                arr[0] = 0  # the array is idle again when it is done
                if trace is not None:
                    trace.extend(("compute", track, cs, comp_done, k.name, 0, 0, 0))
            self.counters.bytes["l1"] += tile.l1_bytes
            slot_free[idx & 1] = done  # its operand buffer is free once it is done
            if tile.stores:
                pending.append((done, tile.stores))
            if st is not None:
                st.tile, st.prev_compute, st.compute = idx, st.compute, (cs, done)
                st.load, st.pending_stores = (now, ld), len(pending)
        if held is not None and trace is not None:
            trace.extend(("compute", track, held[0], held[1], k.name, 0, 0, 0))
        stalls["thermal"] += arr[4] + arr[5]  # pipelined: lost issue slots + last drain
        if pending:
            store_done = yield from self._drain(
                core, engines, pending, math.inf, k.name, store_done
            )
        end = max(comp_done, store_done)
        busy[core] = end - t0
        if st is not None:
            st.end, st.pending_stores = end, 0
        if end > env.now and not _advance(env, end):
            yield env.timeout(end - env.now)

    def _runs(self, regions: Sequence[Region]) -> list[Any]:
        """``memory.runs(regions)``, each region object's run computed once per kernel
        (tiles share the operand regions they load). The memo, by id, holds the region
        too, so no other object can take its id; it is emptied at every kernel start."""
        memo = self._run_memo
        out = []
        for r in regions:
            hit = memo.get(id(r))
            if hit is None:
                hit = memo[id(r)] = (r, self.memory.runs((r,))[0])
            out.append(hit[1])
        return out

    def _drain(
        self,
        core: int,
        engines: list[int],
        pending: list[tuple[int, list[Region]]],
        until: float,
        kernel: str,
        done: int,
    ) -> Generator[simpy.Event, Any, int]:
        """Issue, in order and one at a time, the pending result stores that are ready at
        or before ``until``: each on the DMA engine that frees first, at the latest of its
        ready cycle, that engine's free cycle and the end of the previous store ``done``,
        booked at that simulation time (never back-dated: the shared ports serve
        requests in arrival order). Updates ``engines``; returns the cycle the last
        store completes.

        A core's operand loads and its result stores are two in-order streams, one
        transfer in flight each; ``dma.engines_per_core`` bounds how many transfers are
        in flight at once: with one engine the streams take turns, with two or more a
        result drains while the next operands load.
        """
        env = self.env
        while pending and pending[0][0] <= until:
            when, regions = pending.pop(0)
            eng = engines.index(min(engines))
            at = max(when, engines[eng], done)
            if at > env.now and not _advance(env, at):
                yield env.timeout(at - env.now)
            engines[eng] = done = self._store(core, regions, int(env.now), kernel)
        return done

    def _store(self, core: int, regions: list[Region], now: int, kernel: str) -> int:
        """Store result ``regions`` of core ``core``, issued at cycle ``now`` (the current
        simulation time); returns its completion cycle, descriptor setup included."""
        runs = self._runs(regions)
        done = self.memory.store_runs(core, runs, now) + self.spec.dma.setup_cycles
        if self._trace_flat is not None:  # a TraceLog row
            self._trace_flat.extend(
                ("store", f"dma{core}", now, done, kernel, sum([r[3] for r in runs]), 0, 0)
            )
        return done

    # -- the array -------------------------------------------------------------------
    def _array_timing(self, prev_steps: int, steps: int) -> tuple[int, int, int, int]:
        """Pipelined array timing of a pass of ``steps`` after one of ``prev_steps`` (0:
        none): (interval from the previous pass, interval between two passes of
        ``steps``, latency of one pass, busy cycles of one pass), all from
        :mod:`~wia_hw.emulator.cycles` and cached."""
        key = (prev_steps, steps)
        got = self._timing.get(key)
        if got is None:
            df, R, C = self._df, self._rows, self._cols
            cross = (
                systolic_issue_interval(df, R, C, prev_steps, steps, pipelined=True)
                if prev_steps
                else 0
            )
            inner = systolic_issue_interval(df, R, C, steps, steps, pipelined=True)
            lat = systolic_tile_cycles(df, R, C, steps, **_LATENCY_KW)
            busy = systolic_tile_counters(df, R, C, steps, **_COUNTERS_KW)[Counter.BUSY_CYCLES]
            got = self._timing[key] = (cross, inner, lat, busy)
        return got

    def _charge_array(
        self,
        tile: Tile,
        ready: int,
        comp_done: int,
        port_cycles: int,
        factor: float,
        arr: list[int],
    ) -> tuple[int, int]:
        """Book one tile's ``passes`` equal passes on a pipelined array; returns the cycle
        its first pass is accepted and the cycle its last pass is done.

        The first pass is accepted at the later of ``ready`` (its operands are in L1) and
        the first cycle the array takes it: ``systolic_issue_interval`` after the last
        pass it accepted (of this tile's predecessor on the core, across the tile
        boundary), and not before the L1 port has delivered the predecessor's operand
        bytes (``port_cycles`` of them per tile). Waiting for ``ready`` is a bubble,
        counted as a ``memory`` stall. Passes 2..p follow one interval apart (closed form:
        ``(p - 1) * interval``); the last is done ``systolic_tile_cycles`` after it is
        accepted, and the tile not before its L1 bytes are delivered. Throttled
        (``factor < 1``), every interval and latency takes ``ceil(cycles / factor)``
        cycles; the difference on the critical path is ``thermal`` stall (``arr[4]``;
        the last drain's, ``arr[5]``, counts once per core).

        ``arr`` is the core's array state: steps of the last pass accepted (0: idle),
        cycle it was accepted, cycle the L1 port is free, end of the last busy window,
        thermal cycles lost, thermal cycles of the last drain. Busy cycles (the RTL
        counter: cycles in which some PE does a MAC) are the union of the passes' busy
        windows, each ``systolic_tile_counters(...)[BUSY_CYCLES]`` long from its
        acceptance (plus the same offset for every pass).
        """
        steps, p = tile.pass_steps, tile.passes
        prev = arr[0]
        cross, inner, lat, busy1 = self._array_timing(prev, steps)
        span = (p - 1) * inner
        if factor >= 1.0:
            gap, slow_span, slow_lat, slow_port = cross, span, lat, port_cycles
        else:
            gap, slow_span = _slow(cross, factor), _slow(span, factor)
            slow_lat, slow_port = _slow(lat, factor), _slow(port_cycles, factor)
        if prev:
            earliest = max(arr[1] + gap, arr[2])
            # what the slowed interval delayed the acceptance by
            arr[4] += max(0, min(gap - cross, earliest - max(ready, arr[1] + cross, arr[2])))
        else:
            earliest = comp_done
        cs = max(ready, earliest)
        if ready > earliest:
            self.counters.stall_cycles["memory"] += ready - earliest
        arr[4] += slow_span - span
        arr[5] = slow_lat - lat
        a_last = cs + slow_span
        port_free = cs + slow_port
        done = max(a_last + slow_lat, port_free)
        union = (p - 1) * min(inner, busy1) + busy1
        overlap = max(0, min(arr[3] - cs, union if inner <= busy1 else busy1))
        self._array_busy += union - overlap
        clock = self._clock_cycles
        clock[0] += span + (cross if prev else 0)
        clock[1] += slow_span + (gap if prev else 0)
        arr[0], arr[1], arr[2], arr[3] = steps, a_last, port_free, max(arr[3], a_last + busy1)
        return cs, done

    # -- energy and temperature ------------------------------------------------------
    def _heat(self, now: int) -> float:
        """Advance the RC thermal model to cycle ``now`` when at least ``_heat_step``
        cycles (1e-4 of its time constant) have passed since its last step, with the
        power of that interval: static power plus the energy booked meanwhile (MACs of
        the tiles issued, bytes counted at every level). Returns the clock factor
        (``thermal.frequency_factor``) a tile issued now runs at."""
        if now - self._heat_cycle >= self._heat_step:
            self._heat_advance(now)
        return self.thermal.frequency_factor

    def _heat_advance(self, now: int) -> None:
        dt = now - self._heat_cycle
        if dt <= 0:
            return
        en = self.spec.energy
        b, last = self.counters.bytes, self._heat_bytes
        pj = self._heat_pj + sum((b[lvl] - last[lvl]) * en.pj_per_byte[lvl] for lvl in LEVELS)
        self._heat_bytes = dict(b)
        self._heat_given_pj += pj
        self._heat_pj = 0.0
        seconds = dt / self.spec.clock_hz
        self.thermal.advance(seconds, pj * 1e-12 / seconds + self.spec.static_power_w)
        self._heat_cycle = now

    def _account_energy(
        self,
        cycles: int,
        delta: Counters | dict,
        *,
        array: bool = True,
        vector: bool = True,
        extra_pj: float = 0.0,
    ) -> float:
        """Add the interval's energy to the counters, bring the thermal model to now;
        returns the interval's average power in W.

        MACs are charged the spec's ``pj_per_mac`` when ``array``; an extension unit that
        did them instead (``array=False``) reports its own energy as ``extra_pj``. Vector
        FLOPs run on the vector unit whichever unit did the MACs (a unit's fused tail, a
        vector primitive), so they are charged ``pj_per_vector_op`` whenever counted,
        except when ``vector`` is False: work done inside the memory (PIM), whose
        ``extra_pj`` holds its operations' energy. Bytes at every level and static power
        are always charged. The thermal model has had part of the interval's dynamic
        energy already (tile by tile, :meth:`_heat`); it gets the rest now, so it sees
        exactly the energy counted.
        """
        en = self.spec.energy
        pj = 0.0
        if isinstance(delta, Counters):
            if array:
                for prec, macs in delta.macs_by_precision.items():
                    pj += macs * en.pj_per_mac.get(prec, 0.0)
            if vector:
                pj += delta.vector_flops * en.pj_per_vector_op
            for lvl, nb in delta.bytes.items():
                pj += nb * en.pj_per_byte[lvl]
        seconds = cycles / self.spec.clock_hz
        static_pj = self.spec.static_power_w * seconds * 1e12
        pj += static_pj + extra_pj
        self.counters.energy_pj += pj
        power = pj * 1e-12 / seconds if seconds > 0 else self.spec.static_power_w
        # the rest of the dynamic energy goes to the thermal model, then it steps to now
        self._heat_pj = max(0.0, pj - static_pj - self._heat_given_pj)
        self._heat_bytes = dict(self.counters.bytes)
        self._heat_advance(self.now)
        self._heat_given_pj = 0.0
        return power


def _advance(env: simpy.Environment, cycle: int) -> bool:
    """Move ``env``'s clock to ``cycle`` without an event when no event is due at or
    before it (``env.peek() > cycle``): a timeout to ``cycle`` would then be the next
    event, and nothing else would happen before the process resumed, so the process
    goes on at once, at the same cycle, and every other event keeps its order. Returns
    False (the caller yields a timeout) otherwise."""
    if env.peek() > cycle:
        env._now = cycle  # SimPy's clock (Environment.now reads it)
        return True
    return False


def _slow(cycles: int, factor: float) -> int:
    """Cycles a block of ``cycles`` nominal cycles takes at ``factor`` of the clock."""
    return cycles if factor >= 1.0 else math.ceil(cycles / factor)


def _pipelined_kw(fn: Callable[..., Any]) -> dict[str, bool]:
    """``{"pipelined": True}`` when the cycle function takes that keyword (a pipelined
    array may have its own pass latency), else ``{}``."""
    try:
        takes = "pipelined" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without signature
        takes = False
    return {"pipelined": True} if takes else {}


_LATENCY_KW = _pipelined_kw(systolic_tile_cycles)
_COUNTERS_KW = _pipelined_kw(systolic_tile_counters)
