"""The bound model: every ceiling a kernel is judged against, and which one binds.

Each ceiling gives a *floor*, the fewest cycles the kernel could take if that ceiling
were its only limit. Floors are lower bounds of the measured time (a test holds it on
generated kernels and on BERT), so ``floor / cycles`` is how close the kernel gets to
that ceiling (100 % = at the ceiling).

Throughput ceilings (:data:`CEILINGS`), in tie-break order:

* ``compute``: the kernel's work on its units at full rate (``ideal_cycles``): MACs over
  the arrays' peak MACs per cycle at the kernel's precision, or for a vector kernel its
  elements x the op class's cycles per element over all lanes (per precision and per
  vector-op class).
* ``pipeline``: the cycles the units are occupied issuing the kernel's work, spread over
  every core: for each tile, ``passes x systolic_issue_interval(dataflow, rows, cols,
  steps, steps, pipelined=spec.compute.array.pipelined)`` (the array's fill and drain of
  short passes, and the whole-array cost of a tile that maps onto part of it); for a
  vector tile ``vector_op_cycles(elements, lanes, cycles_per_element, 0)`` (lanes left
  empty by the last issue of each tile). Tiles an extension builds itself without
  ``pass_steps`` count their ``array_cycles + vector_cycles``. Computed from :mod:`wia_hw.emulator.cycles`, never
  re-derived.
* ``parallelism``: the same issue cycles of the busiest core, with the tiles split over
  the cores as the device splits them (:meth:`Device.partition`): fewer tiles than
  cores, or unequal shares.
* ``l1``: the operand bytes the arrays and vector units stream through the L1 ports
  (``bytes.l1 - bytes.l2 + bytes.hbm``: the L1 counter less the DMA fills and stores)
  over the cores' L1 bandwidth.
* ``l2``: the bytes through the shared L2 port (``bytes.l2 - bytes.hbm``: the L2 counter
  less the HBM fills and write-backs it also counts) over its bandwidth.
* ``hbm``: the bytes that crossed HBM during the kernel (reads and write-backs of dirty
  L2 blocks evicted meanwhile) over its bandwidth. Write-backs the kernel leaves owed in
  L2 (``dirtied_bytes``, written later) are reported beside it, not in this floor: they
  do not happen during the kernel, and counting them would put floors above measured
  times (an embedding gather would sit at 260 % of its HBM roof). Nor are the L2
  controller's eager write-backs (``eager_writeback_bytes``, ``memory.eager_writeback``)
  in the ``hbm`` and ``l2`` floors: they fill the kernel's idle port time, so they never
  limit it; the profile's ``bytes`` are the kernel's own traffic.

The binding ceiling (``ceiling``) is the one with the largest floor. The kernel's
``bound`` is that ceiling when the kernel reaches at least :data:`LATENCY_BOUND_PCT` of
it; below that it is far from every throughput roof and ``bound`` is ``"latency"``, with
its measured cause (:func:`latency_cause`): cores waiting for DMA loads (memory stall
cycles), cores idle at the kernel's barrier (dependency stalls), thermal throttling, or
the fixed latency of one tile (``latency_cycles``: DMA setup, the first load and the
last pass's drain, the last store).

Without a kernel's byte counts (``Counter.BANDWIDTH`` not among the session's
``hardware_counters``, or a mode that reads no counters) its memory floors are unknown
(absent from :func:`floors_cycles`, never 0), and so is its binding ceiling: any memory
level might bind it, so neither a ceiling nor a bound (nor "latency") is named, only how
close it gets to its unit-side ceilings (:data:`MEMORY_UNKNOWN` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CEILINGS",
    "MEMORY_CEILINGS",
    "LATENCY_BOUND_PCT",
    "UnitFloors",
    "unit_floors",
    "memory_traffic_bytes",
    "floors_cycles",
    "binding_ceiling",
    "latency_cause",
    "CEILING_NAMES",
    "MEMORY_UNKNOWN",
]

#: Throughput ceilings, in tie-break order (at equal floors the earlier one binds).
CEILINGS = ("compute", "pipeline", "parallelism", "l1", "l2", "hbm")
MEMORY_CEILINGS = ("l1", "l2", "hbm")
#: A kernel reaching less than this share of its binding ceiling is latency-bound.
LATENCY_BOUND_PCT = 50.0

#: Why a kernel without byte counts has no binding ceiling (see the module docstring).
MEMORY_UNKNOWN = "memory ceilings unknown (bandwidth counter not captured)"

CEILING_NAMES = {
    "compute": "compute",
    "pipeline": "array pipeline (fill/drain, mapping)",
    "parallelism": "parallelism (tiles over cores)",
    "l1": "L1 bandwidth",
    "l2": "L2 bandwidth",
    "hbm": "HBM bandwidth",
    "latency": "latency",
}


@dataclass(frozen=True)
class UnitFloors:
    """The unit-side floors of one kernel in cycles (see the module docstring):
    ``pipeline_cycles`` and ``parallel_cycles``; ``latency_cycles`` the fixed latency of
    a core's first and last tile; ``fill_drain_pct`` the share of the array's issue
    cycles not streaming operands (0 for vector work); ``tiles``, ``cores``;
    ``own_tiles_pct`` the share of the issue cycles in tiles an extension built itself
    (their array passes' fill and drain are inside its cost model, not separable: the
    fill/drain share covers the other tiles only) and ``own_vector_pct`` the share of
    those tiles' cycles on the vector unit (a flash kernel's online softmax)."""

    pipeline_cycles: float
    parallel_cycles: float
    latency_cycles: float
    fill_drain_pct: float
    tiles: int
    own_tiles_pct: float = 0.0
    own_vector_pct: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return dict(vars(self))


_CACHE: dict[Any, tuple[Any, UnitFloors]] = {}


def _signature(k: Any) -> Any:
    """A key equal for kernels that tile identically (names aside)."""
    from ..emulator.kernels import GemmKernel, VectorKernel

    if isinstance(k, GemmKernel):
        return (
            "gemm",
            k.m,
            k.n,
            k.k,
            k.batch,
            k.precision,
            k.tiling,
            k.a.elem_bytes,
            k.c.elem_bytes,
            k.b_shared,
            k.b_transposed,
            k.bias is not None,
        )
    if isinstance(k, VectorKernel):
        return (
            "vector",
            k.vclass,
            k.rows,
            k.elements,
            k.rows_per_tile,
            k.cols_per_tile,
            tuple((r.rows, r.cols, r.elem_bytes) for r in k.inputs),
            tuple((r.rows, r.cols, r.elem_bytes) for r in k.outputs),
            k.placement,
        )
    return None


def unit_floors(kernel: Any, spec: Any) -> UnitFloors | None:
    """The unit-side floors of ``kernel`` on ``spec`` (``None`` for a kernel that does
    not run on the cores' tiles, e.g. processing in memory)."""
    from ..emulator.cycles import (
        systolic_issue_interval,
        systolic_steps,
        systolic_tile_cycles,
        vector_op_cycles,
    )
    from ..emulator.device import Device
    from ..emulator.kernels import GemmKernel, TiledKernel, VectorKernel

    if not isinstance(kernel, (GemmKernel, VectorKernel, TiledKernel)):
        return None
    a = spec.compute.array
    pipelined = bool(getattr(a, "pipelined", False))
    sig = _signature(kernel)
    key = None if sig is None else (sig, id(spec), pipelined)
    hit = _CACHE.get(key) if key is not None else None
    if hit is not None and hit[0] is spec:
        return hit[1]
    tiles, groups = Device(spec).tiles_of(kernel)
    v = spec.compute.vector
    issue: list[float] = []
    streaming = occupied = 0
    drain = 0
    own_arr = own_vec = 0  # cycles of tiles the kernel's extension built itself
    for t in tiles:
        steps = getattr(t, "pass_steps", 0)
        if not steps and isinstance(kernel, GemmKernel) and t.passes:
            nb, mi, ni, ki = t.dims
            steps = systolic_steps(ki if a.dataflow == "os" else mi, a.rate(kernel.precision))
        if steps and t.passes:
            per = systolic_issue_interval(
                a.dataflow, a.rows, a.cols, steps, steps, pipelined=pipelined
            )
            issue.append(float(t.passes * per))
            streaming += t.passes * steps
            occupied += t.passes * per
            drain = max(drain, systolic_tile_cycles(a.dataflow, a.rows, a.cols, steps) - per)
        elif isinstance(kernel, VectorKernel):
            elems = t.dims[2] if len(t.dims) > 2 else 0
            issue.append(
                float(vector_op_cycles(elems, v.lanes, int(v.cycles_per_element[kernel.vclass]), 0))
            )
            drain = max(drain, v.pipeline_depth)
        else:
            issue.append(float(t.array_cycles + t.vector_cycles))
            own_arr += t.array_cycles
            own_vec += t.vector_cycles
    cores = spec.compute.cores
    index = {id(t): i for i, t in enumerate(tiles)}
    shares = Device.shares_of(kernel, tiles, groups, spec)
    per_core = [sum(issue[index[id(t)]] for t in s) for s in shares]
    m = spec.memory
    latency = spec.dma.setup_cycles + m.l1.latency_cycles + drain + m.l2.latency_cycles
    out = UnitFloors(
        pipeline_cycles=sum(issue) / cores,
        parallel_cycles=max(per_core),
        latency_cycles=float(latency),
        fill_drain_pct=100.0 * (1 - streaming / occupied) if occupied else 0.0,
        tiles=len(tiles),
        own_tiles_pct=100.0 * (own_arr + own_vec) / sum(issue) if sum(issue) else 0.0,
        own_vector_pct=100.0 * own_vec / (own_arr + own_vec) if own_arr + own_vec else 0.0,
    )
    if key is not None:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[key] = (spec, out)
    return out


def memory_traffic_bytes(nbytes: Mapping[str, int]) -> dict[str, int]:
    """Bytes each memory ceiling carries, from a kernel's ``bytes`` counter (see the
    module docstring): ``l1`` through the cores' L1 ports, ``l2`` through the L2 port,
    ``hbm`` across HBM."""
    hbm = int(nbytes.get("hbm", 0))
    l2 = int(nbytes.get("l2", 0))
    l1 = int(nbytes.get("l1", 0))
    return {"l1": max(0, l1 - l2 + hbm), "l2": max(0, l2 - hbm), "hbm": hbm}


def floors_cycles(
    ideal_cycles: float | None,
    flop_count: int,
    precision: str,
    kind: str,
    floors: Mapping[str, float] | None,
    nbytes: Mapping[str, int] | None,
    dev: Any,
) -> dict[str, float]:
    """Every known ceiling's floor in cycles: ``compute`` (``ideal_cycles``, else a GEMM's
    FLOPs at the array's peak; 0 where the rate is not known: an extension's unit, or a
    vector kernel without its op class, whose FLOPs per element and cycles per element
    differ by class), ``pipeline``/``parallelism`` (from ``floors``, the stored
    :class:`UnitFloors` figures) and each memory level (when ``nbytes`` is known: without
    it the memory floors are unknown, not 0, and absent from the result)."""
    if ideal_cycles is None:
        peak = dev.peak_flops_per_cycle(precision) if kind == "gemm" else 0.0
        ideal_cycles = flop_count / peak if peak else 0.0
    out = {"compute": float(ideal_cycles)}
    if floors:
        out["pipeline"] = max(out["compute"], float(floors["pipeline_cycles"]))
        out["parallelism"] = max(out["pipeline"], float(floors["parallel_cycles"]))
    if nbytes is not None:
        hz = dev.clock_ghz * 1e9
        for lvl, nb in memory_traffic_bytes(nbytes).items():
            bw = dev.level_bandwidth_gbs(lvl) * 1e9
            if bw:
                out[lvl] = nb / bw * hz
    return out


def binding_ceiling(floors: Mapping[str, float]) -> tuple[str, float]:
    """The ceiling with the largest floor (ties: the earlier in :data:`CEILINGS`)."""
    best, floor = "compute", floors.get("compute", 0.0)
    for c in CEILINGS[1:]:
        if c in floors and floors[c] > floor:
            best, floor = c, floors[c]
    return best, floor


def latency_cause(
    cycles: int,
    cores: int,
    stall_cycles: Mapping[str, int] | None,
    latency_cycles: float | None,
    core_busy_cycles: list[int] | None,
) -> str:
    """The measured cause of a latency-bound kernel's time, largest first."""
    parts: list[tuple[float, str]] = []
    if cycles and stall_cycles:
        mem = 100.0 * stall_cycles.get("memory", 0) / (cores * cycles)
        dep = 100.0 * stall_cycles.get("dependency", 0) / (cores * cycles)
        th = 100.0 * stall_cycles.get("thermal", 0) / (cores * cycles)
        la = 100.0 * stall_cycles.get("launch", 0) / (cores * cycles)
        if la >= 1.0:
            parts.append((la, f"kernel launch overhead {la:.0f}% of the kernel"))
        if mem >= 1.0:
            parts.append((mem, f"cores waited for DMA loads {mem:.0f}% of core time"))
        if dep >= 1.0:
            parts.append(
                (
                    dep,
                    f"cores idle at the kernel's barrier {dep:.0f}% of core time "
                    "(unequal or too few tiles)",
                )
            )
        if th >= 1.0:
            parts.append((th, f"thermal throttling {th:.0f}% of core time"))
    elif cycles and core_busy_cycles:
        idle = 100.0 * (1 - sum(core_busy_cycles) / (cores * cycles))
        if idle >= 1.0:
            parts.append((idle, f"cores idle {idle:.0f}% of core time"))
    if latency_cycles and cycles:
        fixed = 100.0 * latency_cycles / cycles
        if fixed >= 1.0:
            parts.append(
                (
                    fixed,
                    f"fixed latency of a tile (DMA setup, first load, last "
                    f"drain and store: {latency_cycles:.0f} cycles) is "
                    f"{fixed:.0f}% of the kernel",
                )
            )
    parts.sort(key=lambda x: -x[0])
    return "; ".join(t for _, t in parts) or "DMA and issue latency between tiles"
