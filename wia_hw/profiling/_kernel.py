"""Kernel-level analysis (the seed's section 8.3): ``KernelProfile`` and ``profile_kernel``.

Assessment rules. The seed's thresholds are kept (utilisation below 50 %, bandwidth
above 90 % of peak, occupancy below 50 %), but a kernel is classified by the bound model
(:mod:`._bounds`), not by its utilisation: every ceiling (compute at the kernel's
precision or vector-op class, the array pipeline, parallelism over the cores, each memory
level) sets a floor on its time, the ceiling with the largest floor binds, and a kernel
reaching under half of it is latency-bound, with the measured cause. "Low utilisation
is expected" is said only of a memory-bound kernel (at least half its memory roof) and
of vector work; the advice follows the bound: vector, array mapping, memory, pipeline,
parallelism or latency. The bandwidth rule reads the kernel's own HBM traffic and fires
only where the bound model finds HBM binding (or within 10 % of it): the L2's eager
write-backs of earlier results fill the port's idle time without delaying the kernel.
A memory-bound verdict states the intensity and ridge point of the level that binds.
Without the kernel's byte counts (``Counter.BANDWIDTH`` not captured) its memory floors
are unknown, so no bound is named: the verdict gives how close it gets to its compute
(and pipeline, parallelism) ceilings and says the memory ceilings are unknown, never
"compute-bound" or "latency-bound" from the floors that are known.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..emulator.counters import Counters
from ..emulator.device import KernelRecord
from ..emulator.errors import WorkloadError
from ..emulator.kernels import GemmKernel, TiledKernel, VectorKernel
from ..graph import DTYPE_BYTES, Graph, GraphBuilder
from ._bounds import (
    CEILING_NAMES,
    CEILINGS,
    LATENCY_BOUND_PCT,
    MEMORY_CEILINGS,
    MEMORY_UNKNOWN,
    binding_ceiling,
    floors_cycles,
    latency_cause,
    memory_traffic_bytes,
    unit_floors,
)
from ._metrics import (
    LEVEL_NAMES,
    DeviceInfo,
    arithmetic_intensity,
    bandwidth_gbs,
    compute_utilization,
    fmt_ai,
    hit_rate,
    occupancy_parts,
)
from ._records import KernelStats, capture_counters

#: Other ceilings whose floor is at least this share of the binding one are named too.
NEAR_FRACTION = 0.9

__all__ = [
    "Assessment",
    "KernelProfile",
    "profile_kernel",
    "format_kernel_profile",
    "stats_from_record",
]

_ALL_FIELDS = tuple(f.name for f in dataclasses.fields(Counters))
_NP_DTYPES = {
    "float32": "fp32",
    "float16": "fp16",
    "int8": "int8",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
}


@dataclass(frozen=True)
class Assessment:
    """One finding: ``level`` ``INFO`` or ``WARNING``, what was found, what to do."""

    level: str
    message: str
    suggestion: str

    def to_dict(self) -> dict[str, str]:
        return dict(vars(self))


@dataclass
class KernelProfile:
    """The seed's ``wia_kernel_profile_t`` plus what the assessment needs.

    Percentages are 0-100. ``flops`` is the achieved rate in FLOP/s (the seed prints it
    as ``FLOPS: x TFLOPS``); ``flop_count`` the operations performed.
    ``bytes`` is the kernel's own traffic per level: the counters less the L2
    controller's eager write-backs of earlier kernels' dirty results in the kernel's idle
    HBM time (``KernelRecord.eager_writeback_bytes``), which never delayed it.
    ``memory_bandwidth_gbs`` is the kernel's own HBM bytes over its duration (so its
    percent of peak is the share of the HBM roof it reaches, and ``flops /
    memory_bandwidth_gbs`` its arithmetic intensity); ``writeback_bandwidth_gbs`` the
    eager write-backs that crossed HBM during it, over the same duration (the HBM port
    carried both). ``arithmetic_intensity`` is FLOP per own HBM byte (``None`` when no
    HBM byte moved); :meth:`level_intensity` and :meth:`level_ridge_point` give the
    same at each memory level;
    hit rates are ``None`` for a level with no accesses. ``occupancy`` is
    ``pe_mapping x core_balance``: ``pe_mapping`` the share of the units' issue cycles
    doing useful work (the array's fill and drain and unmapped PEs count against it),
    ``core_balance`` the share of core time the cores are busy.

    Bound model (:mod:`._bounds`): ``floor_cycles`` holds each ceiling's floor,
    ``ceiling`` the one with the largest floor, ``roofline_efficiency`` the share of
    that ceiling reached (``floor / cycles``), ``bound`` the ceiling or ``"latency"``
    when the efficiency is under 50 % (``latency_cause`` then says why, from the
    counters). ``compute_ceiling_flops`` is the rate the kernel's own units allow (the
    array peak at its precision; for a vector kernel its op class's rate);
    ``unit_ceiling_flops`` the rate its pipeline and parallelism allow (at most the
    former); ``attainable_flops`` the rate its binding ceiling allows; ``ridge_point``
    the HBM intensity where ``compute_ceiling_flops`` meets HBM bandwidth, and
    ``ridge_points`` the same at every memory level (L1: all cores' ports together).
    ``writeback_owed_bytes``: L2 bytes the kernel left dirty, written to HBM later.
    ``near_ceilings``: the other ceilings whose floor is within 10 % of the binding one
    (the kernel is bound by them nearly as much; the assessment names them).
    Without byte counts (``bytes`` ``None``: ``Counter.BANDWIDTH`` not captured) the
    memory floors are unknown, so ``ceiling``, ``bound``, ``roofline_efficiency`` and
    ``attainable_flops`` are ``None`` (any memory level might bind) and
    :meth:`ceiling_pct` gives how close it gets to the unit-side ceilings.
    """

    name: str
    duration_ms: float
    compute_utilization: float
    memory_bandwidth_gbs: float | None
    peak_bandwidth_gbs: float
    l1_cache_hit_rate: float | None
    l2_cache_hit_rate: float | None
    occupancy: float
    flops: float
    arithmetic_intensity: float | None
    flop_count: int = 0
    cycles: int = 0
    precision: str = "fp16"
    kind: str = "gemm"
    bytes: dict[str, int] | None = None
    pe_mapping: float = 100.0
    core_balance: float = 100.0
    bound: str | None = None
    ceiling: str | None = None
    ridge_point: float = math.inf
    attainable_flops: float | None = None
    compute_ceiling_flops: float | None = None
    unit_ceiling_flops: float | None = None
    roofline_efficiency: float | None = None
    floor_cycles: dict[str, float] | None = None
    latency_cause: str | None = None
    fill_drain_pct: float = 0.0
    tiles: int = 0
    #: UnitFloors' own_tiles_pct and own_vector_pct: issue cycles in tiles an
    #: extension built itself, and those tiles' share on the vector unit
    own_tiles_pct: float = 0.0
    own_vector_pct: float = 0.0
    writeback_owed_bytes: int = 0
    writeback_bandwidth_gbs: float | None = None
    ridge_points: dict[str, float] | None = None
    op_class: str | None = None
    near_ceilings: list[str] = field(default_factory=list)
    stall_cycles: dict[str, int] | None = None
    assessments: list[Assessment] = field(default_factory=list)

    @classmethod
    def from_stats(cls, ks: KernelStats, dev: DeviceInfo) -> KernelProfile:
        """Derive every field from a kernel's raw record (see :mod:`._metrics`)."""
        cyc = ks.cycles
        ms = dev.cycles_to_ms(cyc)
        nbytes = ks.counter("bytes")
        eager = ks.eager_writeback_bytes if nbytes is not None else 0
        if eager:
            # the kernel's own traffic (its bandwidth, floors, intensity and roofline
            # point): less the L2 controller's eager write-backs of earlier results in its
            # idle time, which filled gaps and never delayed it (reported apart)
            nbytes = {**nbytes, "hbm": nbytes["hbm"] - eager, "l2": nbytes["l2"] - eager}
        hits, misses = ks.counter("hits"), ks.counter("misses")
        l1 = l2 = None
        if hits is not None and misses is not None:
            l1 = hit_rate(hits["l1"], misses["l1"])
            l2 = hit_rate(hits["l2"], misses["l2"])
        mapping, balance = occupancy_parts(
            ks.macs, ks.slot_macs, ks.core_busy_cycles, cyc, dev.cores
        )
        uf = ks.unit_floors
        floors = floors_cycles(
            ks.ideal_cycles, ks.flop_count, ks.precision, ks.kind, uf, nbytes, dev
        )
        if uf and floors.get("pipeline"):
            mapping = min(1.0, floors["compute"] / floors["pipeline"])
        p = cls(
            name=ks.name,
            duration_ms=ms,
            # the arrays' utilisation: none for work done off them (an extension's unit)
            compute_utilization=compute_utilization(ks.flop_count, cyc, ks.precision, dev)
            if ks.kind in ON_CORES
            else 0.0,
            memory_bandwidth_gbs=None if nbytes is None else bandwidth_gbs(nbytes["hbm"], cyc, dev),
            writeback_bandwidth_gbs=None if nbytes is None else bandwidth_gbs(eager, cyc, dev),
            peak_bandwidth_gbs=dev.peak_bandwidth_gbs,
            l1_cache_hit_rate=l1,
            l2_cache_hit_rate=l2,
            occupancy=100.0 * mapping * balance,
            flops=ks.flop_count / (ms * 1e-3) if ms else 0.0,
            arithmetic_intensity=None
            if nbytes is None
            else arithmetic_intensity(ks.flop_count, nbytes["hbm"]),
            flop_count=ks.flop_count,
            cycles=cyc,
            precision=ks.precision,
            kind=ks.kind,
            bytes=None if nbytes is None else dict(nbytes),
            pe_mapping=100.0 * mapping,
            core_balance=100.0 * balance,
            floor_cycles=floors,
            fill_drain_pct=float(uf["fill_drain_pct"]) if uf else 0.0,
            own_tiles_pct=float(uf.get("own_tiles_pct", 0.0)) if uf else 0.0,
            own_vector_pct=float(uf.get("own_vector_pct", 0.0)) if uf else 0.0,
            tiles=int(uf["tiles"]) if uf else 0,
            writeback_owed_bytes=ks.dirtied_bytes,
            op_class=ks.op_class,
            stall_cycles=ks.counter("stall_cycles"),
        )
        hz = dev.clock_ghz * 1e9
        if floors["compute"]:
            p.compute_ceiling_flops = ks.flop_count / (floors["compute"] / hz)
            unit = max(floors[c] for c in ("compute", "pipeline", "parallelism") if c in floors)
            p.unit_ceiling_flops = ks.flop_count / (unit / hz)
            p.ridge_points = {
                lvl: p.compute_ceiling_flops / (bw * 1e9) if bw else math.inf
                for lvl in MEMORY_CEILINGS
                for bw in (dev.level_bandwidth_gbs(lvl),)
            }
            p.ridge_point = p.ridge_points["hbm"]
        if nbytes is not None:
            # every ceiling's floor is known (without the bytes the memory floors are
            # not, and any level might bind: no ceiling, bound or latency is named)
            ceiling, floor = binding_ceiling(floors)
            p.ceiling = ceiling
            p.near_ceilings = [
                c
                for c in CEILINGS
                if c != ceiling
                and c in floors
                and floor
                and floors[c] >= NEAR_FRACTION * floor
                and not (c in ("pipeline", "parallelism") and floors[c] == floors["compute"])
            ]
            p.attainable_flops = ks.flop_count / (floor / hz) if floor else None
            p.roofline_efficiency = 100.0 * floor / cyc if cyc else None
            eff = p.roofline_efficiency or 0.0
            p.bound = ceiling if eff >= LATENCY_BOUND_PCT else "latency"
            if p.bound == "latency":
                p.latency_cause = latency_cause(
                    cyc,
                    dev.cores,
                    p.stall_cycles,
                    uf["latency_cycles"] if uf else None,
                    ks.core_busy_cycles,
                )
        p.assessments = assess(p, dev)
        return p

    @property
    def bandwidth_pct(self) -> float | None:
        """HBM bandwidth as a percent of peak."""
        if self.memory_bandwidth_gbs is None or not self.peak_bandwidth_gbs:
            return None
        return 100.0 * self.memory_bandwidth_gbs / self.peak_bandwidth_gbs

    def level_intensity(self, level: str) -> float | None:
        """FLOP per byte the kernel itself moves at memory ``level`` (the bytes its
        floor there counts, :func:`~._bounds.memory_traffic_bytes`); ``None`` when no
        byte moved there or its bytes are not known."""
        if self.bytes is None:
            return None
        return arithmetic_intensity(self.flop_count, memory_traffic_bytes(self.bytes)[level])

    def level_ridge_point(self, level: str) -> float:
        """FLOP per ``level`` byte where that level's bandwidth meets the kernel's compute
        ceiling (``ridge_points``); ``inf`` when not known."""
        return (self.ridge_points or {}).get(level, math.inf)

    def ceiling_pct(self, ceiling: str) -> float | None:
        """How close the kernel gets to ``ceiling`` (its floor over the measured time)."""
        f = (self.floor_cycles or {}).get(ceiling)
        return None if f is None or not self.cycles else 100.0 * f / self.cycles

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k != "assessments"}
        d["ridge_point"] = None if math.isinf(self.ridge_point) else self.ridge_point
        if self.ridge_points is not None:
            d["ridge_points"] = {
                k: None if math.isinf(v) else v for k, v in self.ridge_points.items()
            }
        d["assessments"] = [a.to_dict() for a in self.assessments]
        return d

    def format(self) -> str:
        return format_kernel_profile(self)


def _what(p: KernelProfile) -> str:
    return (
        f"{p.op_class} vector"
        if p.kind == "vector" and p.op_class
        else ("vector" if p.kind == "vector" else f"{p.precision} array")
    )


def assess(p: KernelProfile, dev: DeviceInfo) -> list[Assessment]:
    """The seed's three checks with their thresholds, classified by the bound model.
    A kernel run off the cores (an extension's unit: photonic, analog, PIM) is judged
    by its memory traffic only: the arrays' utilisation and occupancy say nothing of it,
    and its unit's compute ceiling is not known."""
    out: list[Assessment] = []
    if p.kind not in ON_CORES:
        bw = p.bandwidth_pct
        out.append(
            Assessment(
                "INFO",
                f"Runs on the {p.kind} unit, off the arrays: no compute ceiling is known for "
                "it"
                + ("" if bw is None else f"; its HBM traffic reaches {bw:.0f}% of peak bandwidth"),
                "See the unit's own figures (RunResult.extensions) for its rate and energy",
            )
        )
        return out
    ai = p.arithmetic_intensity
    ai_txt = "inf" if ai is None else fmt_ai(ai)
    eff = p.roofline_efficiency or 0.0
    b = p.bound
    vector = p.kind == "vector"
    # the bound is unknown when the kernel's bytes are (the memory floors with them)
    unknown = b is None and p.bytes is None
    if unknown:
        out.append(_bound_unknown(p))
    elif b in MEMORY_CEILINGS:
        lvl = LEVEL_NAMES[b]
        if p.flop_count:
            # the intensity and ridge point of the level that binds: FLOP per byte the
            # kernel moves there, and its compute ceiling over that level's bandwidth
            lai = p.level_intensity(b)
            why = (
                f"AI={'inf' if lai is None else fmt_ai(lai)} FLOP per {lvl} byte (ridge "
                f"point {fmt_ai(p.level_ridge_point(b))})"
            )
        else:
            moved = memory_traffic_bytes(p.bytes or {}).get(b, 0)
            why = f"moves {moved:,} {lvl} bytes and does no arithmetic"
        out.append(
            Assessment(
                "INFO",
                f"Memory-bound ({lvl} bandwidth): {why}; reaches {eff:.0f}% of what the "
                f"{lvl} ceiling allows",
                "Reduce memory traffic through tiling or fusion",
            )
        )
    elif b == "compute":
        what = _what(p)
        if vector:
            sugg = (
                "Move the work into a GEMM epilogue, fuse it with its neighbours, or use "
                "a cheaper form of the op (fewer vector cycles per element)"
            )
        elif eff >= 80.0:
            sugg = (
                "The array runs near its peak: only less work (lower precision, "
                "sparsity, fewer FLOPs) makes it faster"
            )
        else:
            sugg = "Cut stalls between passes (double buffering, fewer DMA waits)"
        out.append(
            Assessment(
                "INFO",
                f"Compute-bound ({what} peak): AI={ai_txt} FLOP per HBM byte is above the "
                f"ridge point {fmt_ai(p.ridge_point)}; reaches {eff:.0f}% of that peak",
                sugg,
            )
        )
    elif b == "pipeline":
        if vector:
            out.append(
                Assessment(
                    "INFO",
                    f"Pipeline-bound (vector issue): {p.tiles} tiles leave lanes empty "
                    f"on their last issue; reaches {eff:.0f}% of that ceiling",
                    "Use larger row chunks per tile (fewer, fuller issues)",
                )
            )
        elif p.own_tiles_pct >= 50.0:
            # tiles the extension costed itself: their passes' fill and drain are inside
            # its cost model, so only the vector share and the whole pipeline are known
            out.append(
                Assessment(
                    "INFO",
                    f"Pipeline-bound (its extension's own tiles: array passes and vector "
                    f"work back to back, {p.own_vector_pct:.0f}% of their cycles on the "
                    f"vector unit): the units' issue cycles are {100 - p.pe_mapping:.0f}% "
                    f"above the MAC-rate floor; reaches {eff:.0f}% of that ceiling",
                    "Larger blocks per tile (fewer, longer passes; see the extension's "
                    "parameters) or less vector work per tile",
                )
            )
        else:
            out.append(
                Assessment(
                    "INFO",
                    f"Pipeline-bound (array fill/drain and mapping): "
                    f"{p.fill_drain_pct:.0f}% of the array's issue cycles fill and drain short "
                    f"passes, {100 - p.pe_mapping:.0f}% of its MAC slots do no useful work; "
                    f"reaches {eff:.0f}% of that ceiling",
                    (
                        "Longer passes: more reduction depth per pass (batch small GEMMs, "
                        "fuse the chain, e.g. flash attention)"
                        if dev.dataflow == "os"
                        else "Longer passes: more streamed rows per pass (a larger batch, "
                        "or small GEMMs batched into one)"
                    )
                    + (
                        ""
                        if dev.array_pipelined
                        else f" or a pipelined {dev.array_rows}x{dev.array_cols} array "
                        "that overlaps fill and drain"
                    ),
                )
            )
    elif b == "parallelism":
        out.append(
            Assessment(
                "INFO",
                f"Parallelism-bound: {p.tiles} tiles over {dev.cores} cores leave cores "
                f"idle ({p.core_balance:.0f}% of core time busy); reaches {eff:.0f}% of that "
                "ceiling",
                f"Use equal tiles in a multiple of {dev.cores} (one per core at least: smaller "
                "tiles, or a split of K with a reduction)",
            )
        )
    elif b == "latency":
        c = p.ceiling or "compute"
        out.append(
            Assessment(
                "WARNING",
                f"Latency-bound: reaches only {eff:.0f}% of its nearest ceiling "
                f"({CEILING_NAMES[c]}); {p.latency_cause}",
                "Batch or fuse it with neighbouring kernels so the fixed latencies are paid "
                "once; overlap its loads with the previous kernel",
            )
        )
    if out and p.near_ceilings and b != "latency":
        first = out[0]
        near = ", ".join(CEILING_NAMES[c] for c in p.near_ceilings)
        out[0] = Assessment(
            first.level,
            f"{first.message} (nearly as bound by {near}: within 10%)",
            first.suggestion,
        )
    if p.compute_utilization < 50.0:
        if b in MEMORY_CEILINGS:
            out.append(
                Assessment(
                    "INFO",
                    f"Low compute utilization ({p.compute_utilization:.1f}%) is expected: "
                    f"the kernel is memory-bound ({eff:.0f}% of its {LEVEL_NAMES[b]} roof)",
                    "Raise arithmetic intensity: fuse with neighbouring kernels, reuse tiles",
                )
            )
        elif vector:
            own = p.ceiling_pct("compute")
            out.append(
                Assessment(
                    "INFO",
                    f"Low compute utilization ({p.compute_utilization:.1f}% of the arrays' "
                    "peak) is expected: the kernel runs on the vector units"
                    + ("" if own is None else f", at {own:.0f}% of their rate for this op"),
                    "Move the work into a GEMM epilogue, or fuse it with its neighbours",
                )
            )
        else:
            out.append(
                Assessment(
                    "WARNING",
                    f"Low compute utilization ({p.compute_utilization:.1f}%) in an "
                    + (
                        "array kernel whose bound is unknown (it may be memory-bound): "
                        if unknown
                        else f"array kernel bound by {CEILING_NAMES[b or 'compute']}: "
                    )
                    + _why_slow(p, dev),
                    f"Tiles that fill the {dev.array_rows}x{dev.array_cols} array with long "
                    f"passes, at least {dev.cores} of them",
                )
            )
    # the seed's near-peak rule, on the kernel's own HBM traffic, and only where that
    # traffic binds it (or nearly): the L2's eager write-backs of earlier kernels' results
    # fill the HBM port's idle time without delaying the kernel, and a kernel bound
    # elsewhere is not memory-bound however busy the port was
    bw = p.bandwidth_pct
    if bw is not None and bw > 90.0 and "hbm" in (b, *p.near_ceilings):
        out.append(
            Assessment(
                "INFO",
                f"Near-peak bandwidth ({bw:.0f}% of peak) - memory-bound"
                if b == "hbm"
                else f"Near-peak bandwidth ({bw:.0f}% of peak): nearly as bound by HBM bandwidth",
                "Reduce memory traffic through tiling or fusion",
            )
        )
    if p.occupancy < 50.0 and not vector and b not in MEMORY_CEILINGS:
        # (a memory-bound kernel's idle PEs are expected: the note above says so)
        out.append(
            Assessment(
                "WARNING",
                f"Low occupancy ({p.occupancy:.1f}%): {p.pe_mapping:.0f}% of the "
                f"array's issue cycles do useful MACs ("
                + (
                    f"its extension's own tiles, {p.own_vector_pct:.0f}% vector work"
                    if p.own_tiles_pct >= 50.0
                    else f"fill/drain {p.fill_drain_pct:.0f}%"
                )
                + f") x {p.core_balance:.0f}% of core time busy"
                + (" (its bound is unknown: it may be memory-bound)" if unknown else ""),
                f"Use tiles in multiples of {dev.array_rows}x{dev.array_cols} with long passes "
                f"and at least {dev.cores} of them (one per core); batch small matrices into one "
                "kernel",
            )
        )
    return out


def _bound_unknown(p: KernelProfile) -> Assessment:
    """The verdict on a kernel whose memory floors are unknown (no byte counts): how
    close it gets to its compute ceiling, and to its pipeline or parallelism ceiling when
    that one is larger; no bound is named, since any memory level might bind it."""
    f = p.floor_cycles or {}
    parts = []
    comp = p.ceiling_pct("compute") if f.get("compute") else None
    if comp is not None and p.cycles:
        parts.append(
            f"compute at {comp:.0f}% of its {_what(p)} {'rate' if p.kind == 'vector' else 'peak'}"
        )
        unit, floor = binding_ceiling(
            {c: f[c] for c in ("compute", "pipeline", "parallelism") if c in f}
        )
        if unit != "compute" and floor > f["compute"]:
            parts.append(f"{100.0 * floor / p.cycles:.0f}% of its {CEILING_NAMES[unit]} ceiling")
    elif not f.get("compute"):
        parts.append("no compute ceiling is known for it")
    return Assessment(
        "INFO",
        f"Bound unknown: {'; '.join([*parts, MEMORY_UNKNOWN])}",
        "Profile with Counter.BANDWIDTH in hardware_counters (a counters, trace or detailed "
        "mode) to judge it against the L1, L2 and HBM ceilings",
    )


def _why_slow(p: KernelProfile, dev: DeviceInfo) -> str:
    """What an array kernel's missing utilisation is lost to, largest first."""
    parts = []
    if p.pe_mapping < 95.0:
        parts.append(
            (
                100.0 - p.pe_mapping,
                f"{100 - p.pe_mapping:.0f}% of the units' issue cycles do no useful MAC "
                f"(its extension's own tiles: their passes' fill and drain and "
                f"{p.own_vector_pct:.0f}% vector work)"
                if p.own_tiles_pct >= 50.0
                else f"{100 - p.pe_mapping:.0f}% of the array's issue "
                f"cycles do no useful MAC (fill/drain of short passes "
                f"{p.fill_drain_pct:.0f}%, tiles smaller than the array)",
            )
        )
    if p.core_balance < 95.0:
        parts.append(
            (
                100.0 - p.core_balance,
                f"cores idle {100 - p.core_balance:.0f}% of "
                "the kernel (too few tiles, or unequal shares)",
            )
        )
    if p.stall_cycles and p.cycles:
        mem = 100.0 * p.stall_cycles.get("memory", 0) / (dev.cores * p.cycles)
        if mem >= 5.0:
            parts.append((mem, f"cores waiting for operands {mem:.0f}% of the time"))
        th = 100.0 * p.stall_cycles.get("thermal", 0) / (dev.cores * p.cycles)
        if th >= 1.0:
            parts.append((th, f"thermal throttling {th:.0f}% of the time"))
    parts.sort(key=lambda x: -x[0])
    return "; ".join(t for _, t in parts) or "pipeline overheads (DMA setup, drain)"


#: Record kinds of kernels run on the cores' arrays and vector units.
ON_CORES = ("gemm", "vector")


def _pct(v: float | None, captured: bool = True) -> str:
    if v is None:
        return "n/a (no accesses)" if captured else "n/a (counters not captured)"
    return f"{v:.1f}%"


def format_kernel_profile(p: KernelProfile) -> str:
    """The seed's printf block for one kernel, then its assessment."""
    lines = [
        f"Kernel: {p.name}",
        f"  Duration: {p.duration_ms:.3f} ms",
        f"  Compute Utilization: {p.compute_utilization:.1f}%"
        + ("" if p.kind in ON_CORES else f" (runs on the {p.kind} unit, off the arrays)"),
    ]
    if p.memory_bandwidth_gbs is not None:
        wb = p.writeback_bandwidth_gbs
        lines.append(
            f"  Memory Bandwidth: {p.memory_bandwidth_gbs:.1f} GB/s "
            f"({100.0 * p.memory_bandwidth_gbs / p.peak_bandwidth_gbs:.1f}% of peak)"
            + (
                f" + {wb:.1f} GB/s of earlier results written back"
                if wb is not None and round(wb, 1)
                else ""
            )
        )
    lines += [
        f"  Cache Hit Rate L1: {_pct(p.l1_cache_hit_rate, p.bytes is not None)}",
        f"  Cache Hit Rate L2: {_pct(p.l2_cache_hit_rate, p.bytes is not None)}",
        f"  Occupancy: {p.occupancy:.1f}%",
        f"  FLOPS: {p.flops / 1e12:.1f} TFLOPS",
    ]
    if p.arithmetic_intensity is not None:
        lines.append(f"  Arithmetic Intensity: {p.arithmetic_intensity:.1f} FLOP/byte (HBM)")
    for a in p.assessments:
        lines.append(f"  {a.level}: {a.message}")
        lines.append(f"  Suggestion: {a.suggestion}")
    return "\n".join(lines)


def _peak_macs(spec: Any, precision: str) -> float | None:
    """``peak_macs_per_cycle`` as a float, cheaply (rates are powers of two: exact)."""
    rate = spec.compute.array.macs_per_pe_cycle.get(precision)
    return None if rate is None else spec.pes * float(rate)


def ideal_cycles(k: Any, spec: Any) -> float | None:
    """Cycles kernel ``k``'s work takes on its units at full rate on ``spec`` (see
    :class:`KernelStats`); ``None`` for a kernel type this does not know."""
    return StatsMaker(spec=spec).ideal_cycles(k)


class StatsMaker:
    """Builds :class:`KernelStats` from emulator records for one device and one set of
    counter fields, with what every record shares worked out once (each precision's and
    vector class's full rate): a profiling session makes one and builds every kernel's
    statistics with it."""

    def __init__(self, fields_: Sequence[str] | None = None, spec: Any = None) -> None:
        self.fields = _ALL_FIELDS if fields_ is None else tuple(fields_)
        self.spec = spec
        self._gemm: dict[str, float | None] = {}
        self._vector: dict[str, tuple[float, int] | None] = {}

    def ideal_cycles(self, k: Any) -> float | None:
        """:func:`ideal_cycles` of ``k`` on this maker's device, rates looked up once."""
        if self.spec is None or k is None:
            return None
        if isinstance(k, GemmKernel):
            rate = self._gemm.get(k.precision, 0.0)
            if rate == 0.0:
                rate = self._gemm[k.precision] = _peak_macs(self.spec, k.precision)
            return None if rate is None else k.macs / rate
        if isinstance(k, VectorKernel):
            vc = self._vector.get(k.vclass, 0)
            if vc == 0:
                v = self.spec.compute.vector
                cpe = v.cycles_per_element.get(k.vclass)
                vc = self._vector[k.vclass] = (
                    None if cpe is None else (float(cpe), v.lanes * self.spec.compute.cores)
                )
            return None if vc is None else k.elements * vc[0] / vc[1]
        return None

    def __call__(
        self, r: KernelRecord, index: int = 0, run: int = -1, kernel: Any = None
    ) -> KernelStats:
        # positional, in KernelStats' field order (a third of the keyword call's cost;
        # test_profiling_records checks every field against the record)
        return KernelStats(
            index,
            r.name,
            r.op,
            r.group,
            r.kind,
            r.provider,
            r.precision,
            run,
            r.start_cycle,
            r.end_cycle,
            r.flops,
            r.macs,
            r.slot_macs,
            r.tiles,
            r.cores_used,
            r.core_busy_cycles,  # the record's own list, read-only like its counters
            r.frequency_factor,
            self.ideal_cycles(kernel),
            r.compulsory_bytes,
            capture_counters(r.counters, self.fields),
            r.power_w,
            r.temperature_c,
            None,  # unit_floors
            r.dirtied_bytes,
            r.writeback_bytes,
            r.eager_writeback_bytes,
            getattr(kernel, "vclass", None),
        )


def stats_from_record(
    r: KernelRecord,
    index: int = 0,
    run: int = -1,
    fields_: Sequence[str] | None = None,
    kernel: Any = None,
    spec: Any = None,
    *,
    floors: bool = True,
) -> KernelStats:
    """A :class:`KernelStats` from the emulator's record, with ``fields_`` of its counter
    deltas (every field when ``None``); ``kernel`` and ``spec`` (the launched kernel and
    the device) give its ``ideal_cycles`` and, with ``floors``, its ``unit_floors``
    (a session leaves them to :meth:`ProfilingReport.fill_unit_floors`)."""
    ks = StatsMaker(fields_, spec)(r, index, run, kernel)
    if kernel is not None and spec is not None and floors:
        ks.unit_floors = unit_floors(kernel, spec).to_dict()
    return ks


def _one_op_graph(
    kind: str, inputs: Mapping[str, Any] | Sequence[Any], attrs: Mapping[str, Any]
) -> Graph:
    items = (
        list(inputs.items())
        if isinstance(inputs, Mapping)
        else [(f"in{i}", v) for i, v in enumerate(inputs)]
    )
    if not items:
        raise WorkloadError(f"profile_kernel: op {kind!r} needs inputs (arrays or shapes)")
    b = GraphBuilder(f"profile_kernel.{kind}")
    names = []
    for idx, (name, v) in enumerate(items):
        if isinstance(v, np.ndarray):
            dt = _NP_DTYPES.get(str(v.dtype))
            if dt is None:
                raise WorkloadError(
                    f"profile_kernel: input {name!r} has dtype {v.dtype}, "
                    f"supported: {', '.join(_NP_DTYPES)}"
                )
            shape = v.shape
        elif isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], str):
            shape, dt = tuple(v[0]), _NP_DTYPES.get(v[1], v[1])  # "float16" is fp16
        else:
            shape, dt = tuple(v), "fp16"
        if dt not in DTYPE_BYTES:
            raise WorkloadError(
                f"profile_kernel: input {name!r}: unknown dtype {dt!r} (known: "
                f"{', '.join(DTYPE_BYTES)}, or numpy's {', '.join(_NP_DTYPES)})"
            )
        weight = idx == 1 and kind in ("linear", "conv2d", "layer_norm", "embedding")
        names.append(b.weight(name, shape, dt) if weight else b.input(name, shape, dt))
    b.op(kind, kind, names, **dict(attrs))
    return b.graph()


def profile_kernel(
    ctx: Any,
    kernel: Any,
    inputs: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    warmup: int = 0,
    **attrs: Any,
) -> KernelProfile:
    """Profile one kernel on ``ctx``'s device (the seed's ``wia_profile_kernel``).

    ``kernel`` is an emulator kernel (``GemmKernel``/``VectorKernel``), an op kind
    (``"matmul"``, ``"add"``, ``"softmax"``, ...) built from ``inputs`` (a mapping or
    sequence of numpy arrays, shapes, or ``(shape, dtype)`` pairs; ``attrs`` go to the
    op), a one-op :class:`~wia_hw.Graph`, or a kernel of an earlier run
    (``KernelTime``/``KernelRecord``: profiled from its record without running again).
    The launch runs on the device as it is (caches, temperature); ``warmup`` launches
    run first. Raises :class:`~wia_hw.WorkloadError` when the op lowers to no kernel
    (a view) or to several.
    """
    dev = DeviceInfo.from_spec(ctx.spec)
    if isinstance(kernel, KernelRecord):
        return KernelProfile.from_stats(stats_from_record(kernel), dev)
    rec = getattr(kernel, "record", None)
    if isinstance(rec, KernelRecord):  # a run's KernelTime: its launched kernel and spec
        spec = getattr(kernel, "spec", None) or ctx.spec
        launched = getattr(kernel, "kernel", None)
        return KernelProfile.from_stats(
            stats_from_record(rec, kernel=launched, spec=spec if launched is not None else None),
            DeviceInfo.from_spec(spec),
        )
    if isinstance(kernel, (GemmKernel, VectorKernel, TiledKernel)):
        k = kernel
    else:
        if isinstance(kernel, str):
            graph = _one_op_graph(kernel, inputs if inputs is not None else {}, attrs)
        elif isinstance(kernel, Graph):
            graph = kernel
        else:
            raise TypeError(
                "profile_kernel: kernel must be a GemmKernel, VectorKernel, op "
                f"kind, Graph or KernelTime, got {type(kernel).__name__}"
            )
        from ..lowering import lower

        ks = [k for _, kk in lower(graph, ctx.spec, ctx.providers) for k in kk]
        if len(ks) != 1:
            raise WorkloadError(
                f"profile_kernel: {graph.name!r} lowers to {len(ks)} kernels "
                "(need exactly one; a view runs none)"
            )
        k = ks[0]
    from ..emulator.extension_kernels import execute_kernels

    for _ in range(max(0, int(warmup))):
        execute_kernels(ctx.device, [k])
    (r,) = execute_kernels(ctx.device, [k])  # an extension's kernel runs as lowered
    return KernelProfile.from_stats(stats_from_record(r, kernel=k, spec=ctx.spec), dev)
