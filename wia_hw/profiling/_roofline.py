"""Roofline analysis (the seed's section 8.3.1).

A :class:`Roofline` holds ceilings (compute peaks per precision, a bandwidth per memory
level) and measured points (arithmetic intensity in FLOP/byte, performance in FLOP/s).
At intensity ``AI`` a level with bandwidth ``BW`` allows at most ``AI x BW``; the compute
ceiling allows ``peak``. A point is memory-bound when a memory ceiling is below the
compute ceiling at its intensity (``AI`` below the ridge point ``peak / BW``) and
compute-bound otherwise. Points from kernels carry their intensity at every level (L1,
L2, HBM), and the lowest ceiling binds, so a kernel served from L2 is judged by L2.

:func:`analyze_roofline` gives one recommendation per point in the seed's form:

* ``AI`` below 1 FLOP/byte (less than one operation per byte moved: the kernel is data
  movement, and only fusing it into its producer saves the trip through memory):
  ``Severely memory-bound (AI=0.25). Fuse with preceding operation.``
* otherwise below the ridge: ``Memory-bound (AI=45). Increase tiling to improve cache
  reuse.``
* at or above the ridge, at 80 % of the peak or more: ``Compute-bound. Near-optimal
  performance (92% of peak).``; below 80 %: ``Compute-bound at 45% of peak. Increase
  parallelism or improve the array mapping.``
* a point under half its roof is latency-bound, and a point above its roof (a user's
  measurement the ceilings do not allow) is said to be so, never "near-optimal":
  ``Above its roof: 133% of what the ceilings allow (AI=1000). The measurement or the
  ceilings are wrong.``
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._bounds import LATENCY_BOUND_PCT, memory_traffic_bytes
from ._kernel import KernelProfile
from ._metrics import fmt_ai

__all__ = [
    "RooflineConfig",
    "Roofline",
    "RooflinePoint",
    "RooflineRecommendation",
    "RooflineAnalysis",
    "create_roofline",
    "roofline_add_point",
    "roofline_plot",
    "analyze_roofline",
    "SEVERE_AI",
    "NEAR_OPTIMAL_PCT",
    "RooflineSkipWarning",
]


class RooflineSkipWarning(UserWarning):
    """Kernels left off a roofline because their bytes were not captured."""


def _warn_uncaptured(where: str, names: Sequence[str]) -> None:
    """Warn that ``names`` have no roofline point: their bytes were not captured."""
    warnings.warn(
        f"{where}: {len(names)} kernel(s) skipped (e.g. {names[0]!r}): their bytes were "
        "not captured (Counter.BANDWIDTH is not in the session's hardware_counters, or "
        "its mode reads no counters), so they have no arithmetic intensity; profile "
        "with Counter.BANDWIDTH to place them",
        RooflineSkipWarning,
        stacklevel=3,
    )


#: A memory-bound point below this intensity (FLOP/byte) is severely memory-bound.
SEVERE_AI = 1.0
#: A compute-bound point at this share of peak or more is near-optimal.
NEAR_OPTIMAL_PCT = 80.0


def _pos(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
        raise ValueError(f"{name} must be a positive number, got {v!r}")
    return float(v)


@dataclass(frozen=True, kw_only=True)
class RooflineConfig:
    """The seed's ``wia_roofline_config_t``: ``peak_flops`` (FLOP/s, of ``precision``),
    ``peak_bandwidth`` (main memory, bytes/s), ``cache_sizes`` (bytes, innermost first)
    and ``cache_bandwidths`` (bytes/s, same order), plus ``precision_peaks`` (more
    compute ceilings, FLOP/s by name), ``cache_names`` and ``memory_name``.
    :meth:`from_spec` fills it from a device spec."""

    peak_flops: float
    peak_bandwidth: float
    cache_sizes: Sequence[int] = ()
    cache_bandwidths: Sequence[float] = ()
    cache_names: Sequence[str] = ()
    memory_name: str = "HBM"
    precision: str = "fp16"
    precision_peaks: Mapping[str, float] = field(default_factory=dict)
    name: str = "roofline"

    def __post_init__(self) -> None:
        _pos("peak_flops", self.peak_flops)
        _pos("peak_bandwidth", self.peak_bandwidth)
        sizes, bws = tuple(self.cache_sizes), tuple(self.cache_bandwidths)
        if len(sizes) != len(bws):
            raise ValueError(
                f"cache_sizes ({len(sizes)}) and cache_bandwidths ({len(bws)}) "
                "must have the same length"
            )
        for i, b in enumerate(bws):
            _pos(f"cache_bandwidths[{i}]", b)
        names = tuple(self.cache_names) or tuple(f"L{i + 1}" for i in range(len(sizes)))
        if len(names) != len(sizes):
            raise ValueError(
                f"cache_names ({len(names)}) must name every cache level ({len(sizes)})"
            )
        for k, v in self.precision_peaks.items():
            _pos(f"precision_peaks[{k!r}]", v)
        object.__setattr__(self, "cache_sizes", sizes)
        object.__setattr__(self, "cache_bandwidths", bws)
        object.__setattr__(self, "cache_names", names)
        object.__setattr__(self, "precision_peaks", dict(self.precision_peaks))

    @classmethod
    def from_spec(cls, spec: Any) -> RooflineConfig:
        """Ceilings of a device: every array precision's peak, HBM, and L2 and L1
        (aggregate over cores) with their sizes. Vector kernels bring their own op-class
        ceilings (:meth:`Roofline.add_kernel`); there is no one vector roof."""
        from ._metrics import DeviceInfo

        spec = getattr(spec, "spec", spec)  # a Context works too
        d = DeviceInfo.from_spec(spec)
        prec = "fp16" if "fp16" in d.peak_macs_per_cycle else next(iter(d.peak_macs_per_cycle))
        peaks = {p: d.peak_flops(p) for p in d.peak_macs_per_cycle if p != prec}
        return cls(
            peak_flops=d.peak_flops(prec),
            peak_bandwidth=d.hbm_bandwidth_gbs * 1e9,
            cache_sizes=(d.l1_size_bytes * d.cores, d.l2_size_bytes),
            cache_bandwidths=(d.level_bandwidth_gbs("l1") * 1e9, d.l2_bandwidth_gbs * 1e9),
            cache_names=("L1", "L2"),
            precision=prec,
            precision_peaks=peaks,
            name=d.name,
        )

    def peak(self, precision: str | None = None) -> float:
        if precision is None or precision == self.precision:
            return self.peak_flops
        if precision not in self.precision_peaks:
            raise ValueError(
                f"no compute ceiling for {precision!r} (have: "
                f"{', '.join([self.precision, *self.precision_peaks])})"
            )
        return self.precision_peaks[precision]

    def bandwidth(self, level: str | None = None) -> float:
        if level is None or level in (self.memory_name, "hbm", "memory"):
            return self.peak_bandwidth
        names = [n.lower() for n in self.cache_names]
        if level.lower() not in names:
            raise ValueError(
                f"unknown memory level {level!r} (have: "
                f"{', '.join([*self.cache_names, self.memory_name])})"
            )
        return self.cache_bandwidths[names.index(level.lower())]


@dataclass(frozen=True)
class RooflinePoint:
    """One measurement: ``arithmetic_intensity`` (FLOP/byte at ``level``),
    ``performance`` (FLOP/s), the compute ceiling it is judged against (``peak`` FLOP/s
    when given, e.g. a vector kernel's op-class rate, else the ``precision``'s),
    ``time_ms`` (its weight in the analysis; ``None`` when unknown), and
    ``intensities`` (FLOP/byte at each memory level by name, when known: the analysis
    then judges the point against every level's ceiling, not only ``level``'s)."""

    name: str
    arithmetic_intensity: float
    performance: float
    precision: str | None = None
    level: str | None = None
    time_ms: float | None = None
    peak: float | None = None
    intensities: Mapping[str, float] | None = None
    ceiling: str | None = None
    kind: str | None = None

    def roof(self, config: RooflineConfig) -> float:
        """The attainable FLOP/s at this point's intensity: ``min(peak, AI x BW)`` over
        its own compute ceiling and every memory level it has an intensity for."""
        peak = self.peak or config.peak(self.precision)
        levels = dict(
            self.intensities or {(self.level or config.memory_name): self.arithmetic_intensity}
        )
        return min([peak] + [ai * config.bandwidth(lvl) for lvl, ai in levels.items()])


@dataclass(frozen=True)
class RooflineRecommendation:
    """One line of the analysis: ``kernel_name`` and the seed-form ``suggestion``, with
    the figures behind it (``bound`` ``memory`` or ``compute``, the binding memory
    ``level`` and the ``arithmetic_intensity`` there, ``pct_of_peak``,
    ``pct_of_attainable``, ``severity`` ``severe``/``memory``/``ok``/``compute``/
    ``latency``, or ``above`` for a point above its roof, which no measurement on the
    modelled device can be)."""

    kernel_name: str
    suggestion: str
    bound: str
    arithmetic_intensity: float
    performance: float
    attainable: float
    pct_of_peak: float
    pct_of_attainable: float
    severity: str
    time_ms: float | None = None
    level: str = "HBM"


@dataclass(frozen=True)
class RooflineAnalysis:
    """The seed's ``wia_roofline_analysis_t``."""

    recommendations: list[RooflineRecommendation]
    ridge_point: float

    @property
    def num_recommendations(self) -> int:
        return len(self.recommendations)

    def format(self) -> str:
        return "\n".join(f"Kernel {r.kernel_name}: {r.suggestion}" for r in self.recommendations)


class Roofline:
    """The seed's ``wia_roofline_t``: ceilings from a :class:`RooflineConfig` and points."""

    def __init__(self, config: RooflineConfig) -> None:
        if not isinstance(config, RooflineConfig):
            raise TypeError(f"config must be a RooflineConfig, got {type(config).__name__}")
        self.config = config
        self.points: list[RooflinePoint] = []

    def __repr__(self) -> str:
        return f"Roofline({self.config.name!r}, {len(self.points)} points)"

    def ridge_point(self, precision: str | None = None, level: str | None = None) -> float:
        """FLOP/byte where the compute ceiling meets the level's bandwidth ceiling."""
        return self.config.peak(precision) / self.config.bandwidth(level)

    def attainable(
        self, arithmetic_intensity: float, precision: str | None = None, level: str | None = None
    ) -> float:
        """``min(peak, AI x bandwidth)`` in FLOP/s."""
        return min(self.config.peak(precision), arithmetic_intensity * self.config.bandwidth(level))

    def add_point(
        self,
        arithmetic_intensity: float,
        performance: float,
        name: str | None = None,
        *,
        precision: str | None = None,
        level: str | None = None,
        time_ms: float | None = None,
        peak: float | None = None,
        intensities: Mapping[str, float] | None = None,
        ceiling: str | None = None,
        kind: str | None = None,
    ) -> RooflinePoint:
        """Add a measurement (``wia_roofline_add_point``); returns it. ``peak`` is the
        point's own compute ceiling (``ceiling`` names it, ``kind`` says what it is:
        ``array``, ``vector``, ``pipeline``, ``parallelism``). Raises ValueError for a
        non-positive value or an unknown precision or level."""
        ai = _pos("arithmetic_intensity", arithmetic_intensity)
        perf = _pos("performance", performance)
        if peak is None:
            self.config.peak(precision)
        else:
            _pos("peak", peak)
        self.config.bandwidth(level)
        for lvl, v in (intensities or {}).items():
            self.config.bandwidth(lvl)
            _pos(f"intensities[{lvl!r}]", v)
        p = RooflinePoint(
            name or f"point{len(self.points)}",
            ai,
            perf,
            precision,
            level,
            time_ms,
            peak,
            dict(intensities) if intensities else None,
            ceiling,
            kind,
        )
        self.points.append(p)
        return p

    def add_kernel(self, profile: KernelProfile) -> RooflinePoint | None:
        """Add a :class:`KernelProfile`, judged as the bound model judges it: its own
        compute-side ceiling (the array peak at its precision, its vector-op class's
        rate, or lower, its pipeline or parallelism ceiling) and every memory level's
        bytes (:func:`._bounds.memory_traffic_bytes`); placed at the intensity of the
        memory level that binds it. Skipped (``None``) without FLOPs or bytes; a kernel
        whose bytes were not captured (``Counter.BANDWIDTH`` not among the session's
        ``hardware_counters``) is skipped with a :class:`RooflineSkipWarning` saying so."""
        if profile.bytes is None and profile.flops:
            _warn_uncaptured("add_kernel", [profile.name])
        if not profile.flops or not profile.bytes or not profile.floor_cycles:
            return None
        label = profile.op_class or profile.precision
        hz = profile.cycles / (profile.duration_ms * 1e-3) if profile.duration_ms else 0.0
        return self._add_floors(
            profile.name,
            profile.flop_count,
            profile.cycles,
            dict(profile.floor_cycles),
            memory_traffic_bytes(profile.bytes),
            profile.kind,
            label,
            profile.precision,
            hz,
        )

    def _add_floors(
        self,
        name: str,
        flop: int,
        cycles: int,
        floors: Mapping[str, float],
        traffic: Mapping[str, int],
        kind: str,
        label: str,
        precision: str,
        hz: float,
    ) -> RooflinePoint | None:
        """A point from a kernel's (or a group's summed) floors in cycles (``hz``: the
        clock that turns cycles into seconds)."""
        if not flop or not cycles or not hz or not any(traffic.values()):
            return None
        unit = {c: floors[c] for c in ("compute", "pipeline", "parallelism") if c in floors}
        which = max(unit, key=lambda c: (unit[c], -list(unit).index(c)))
        peak = flop / (unit[which] / hz) if unit[which] else None
        names = {"l1": "L1", "l2": "L2", "hbm": self.config.memory_name}
        have = {n.lower() for n in self.config.cache_names}
        ints = {
            names[lvl]: flop / nb
            for lvl, nb in traffic.items()
            if nb and (lvl == "hbm" or lvl in have)
        }
        lvl = min(ints, key=lambda n: (ints[n] * self.config.bandwidth(n), n))
        if which == "compute":
            kind_ = "vector" if kind == "vector" else "array"
            ceiling = f"{label} vector" if kind == "vector" else f"{label} peak"
        else:
            kind_ = which
            ceiling = which
        if peak is None:
            return None
        return self.add_point(
            ints[lvl],
            flop / (cycles / hz),
            name,
            level=lvl,
            time_ms=cycles / hz * 1e3,
            peak=peak,
            intensities=ints,
            ceiling=ceiling,
            kind=kind_,
            precision=precision
            if precision == self.config.precision or precision in self.config.precision_peaks
            else None,
        )

    def add_report(self, report: Any, *, aggregate: bool = True) -> list[RooflinePoint]:
        """Add the kernels of a :class:`ProfilingReport` (or a ``RunResult``). With
        ``aggregate``, kernels that differ only by their ``layerN.`` prefix become one
        point (FLOPs, bytes at each level, time and each ceiling's floor summed, so the
        group's roof is at least each member's) named ``name (xN)``. Kernels whose bytes
        were not captured (``Counter.BANDWIDTH`` not among the session's
        ``hardware_counters``, or a mode that reads no counters) have no intensity and
        are skipped with one :class:`RooflineSkipWarning` naming the counter."""
        from ._kernel import KernelProfile, stats_from_record
        from ._metrics import DeviceInfo

        if hasattr(report, "kernel_profiles"):
            profiles = report.kernel_profiles()
            dev = report.device
        else:  # a RunResult: its resolved spec and launched kernels (the floors need both)
            from ..spec import load_spec

            spec = getattr(report, "spec", None) or load_spec(report.device)
            dev = DeviceInfo.from_spec(spec)
            profiles = [
                KernelProfile.from_stats(
                    stats_from_record(
                        k.record, i, kernel=k.kernel, spec=spec if k.kernel is not None else None
                    ),
                    dev,
                )
                for i, k in enumerate(report.kernels)
            ]
        groups: dict[str, list[Any]] = {}
        for i, p in enumerate(profiles):
            key = re.sub(r"^layer\d+\.", "", p.name) if aggregate else f"{p.name}#{i}"
            groups.setdefault(key, []).append(p)
        out = []
        uncaptured = [m.name for m in profiles if m.bytes is None and m.flops]
        if uncaptured:
            _warn_uncaptured("add_report", uncaptured)
        for key, members in groups.items():
            if any(not m.bytes or not m.floor_cycles for m in members):
                continue
            flop = sum(m.flop_count for m in members)
            cyc = sum(m.cycles for m in members)
            floors: dict[str, float] = {}
            for c in members[0].floor_cycles:
                if all(c in (m.floor_cycles or {}) for m in members):
                    floors[c] = sum(m.floor_cycles[c] for m in members)
            traffic: dict[str, int] = {}
            for m in members:
                for lvl, nb in memory_traffic_bytes(m.bytes).items():
                    traffic[lvl] = traffic.get(lvl, 0) + nb
            k0 = members[0]
            name = key.split("#")[0] + (f" (x{len(members)})" if len(members) > 1 else "")
            pt = self._add_floors(
                name,
                flop,
                cyc,
                floors,
                traffic,
                k0.kind,
                k0.op_class or k0.precision,
                k0.precision,
                dev.clock_ghz * 1e9,
            )
            if pt is not None:
                out.append(pt)
        return out

    def analyze(
        self, *, severe_ai: float = SEVERE_AI, near_optimal_pct: float = NEAR_OPTIMAL_PCT
    ) -> RooflineAnalysis:
        """``wia_analyze_roofline``; see the module docstring for the rules. Points with
        a known ``time_ms`` come first, longest first."""
        ridge = self.ridge_point()
        recs = []
        main = self.config.memory_name
        for p in self.points:
            peak = p.peak or self.config.peak(p.precision)
            levels = dict(p.intensities or {(p.level or main): p.arithmetic_intensity})
            # the binding memory ceiling: the lowest AI x bandwidth over the levels
            lvl, ai_b = min(
                levels.items(), key=lambda kv: (kv[1] * self.config.bandwidth(kv[0]), kv[0])
            )
            att = min(peak, ai_b * self.config.bandwidth(lvl))
            where = "" if lvl == main or lvl.lower() == "hbm" else f"{lvl}, "
            ai = f"{where}AI={fmt_ai(ai_b)}"
            pct_peak = 100.0 * p.performance / peak
            pct_att = 100.0 * p.performance / att
            if p.performance > att * (1 + 1e-9):
                bound, sev = ("memory" if att < peak else "compute"), "above"
                text = (
                    f"Above its roof: {pct_att:.0f}% of what the ceilings allow ({ai}). "
                    "The measurement or the ceilings are wrong."
                )
            elif pct_att < LATENCY_BOUND_PCT:
                bound, sev = "latency", "latency"
                text = (
                    f"Latency-bound at {pct_att:.0f}% of its roof ({ai}). Batch or fuse "
                    "it so fixed latencies are paid once."
                )
            elif att < peak:
                if ai_b < severe_ai:
                    sev, text = (
                        "severe",
                        (f"Severely memory-bound ({ai}). Fuse with preceding operation."),
                    )
                else:
                    sev, text = (
                        "memory",
                        (f"Memory-bound ({ai}). Increase tiling to improve cache reuse."),
                    )
                bound = "memory"
            else:
                bound = "compute"
                what = p.ceiling or "peak"
                if p.kind == "pipeline":
                    sev, text = (
                        "compute",
                        (
                            f"Pipeline-bound (array fill/drain) at "
                            f"{pct_att:.0f}% of that ceiling. Use longer "
                            "passes (deeper K per pass, fused attention)."
                        ),
                    )
                elif p.kind == "parallelism":
                    sev, text = (
                        "compute",
                        (
                            f"Parallelism-bound at {pct_att:.0f}% of that "
                            "ceiling. Use a tile count that splits evenly "
                            "over the cores."
                        ),
                    )
                elif p.kind == "vector":
                    sev = "ok" if pct_peak >= near_optimal_pct else "compute"
                    text = (
                        f"Vector-bound ({what}) at {pct_peak:.0f}% of its rate. Fuse it "
                        "into a GEMM epilogue or its neighbours."
                    )
                elif pct_peak >= near_optimal_pct:
                    sev, text = (
                        "ok",
                        (f"Compute-bound. Near-optimal performance ({pct_peak:.0f}% of peak)."),
                    )
                else:
                    sev, text = (
                        "compute",
                        (
                            f"Compute-bound at {pct_peak:.0f}% of peak. "
                            "Increase parallelism or improve the array "
                            "mapping."
                        ),
                    )
            recs.append(
                RooflineRecommendation(
                    p.name,
                    text,
                    bound,
                    ai_b,
                    p.performance,
                    att,
                    pct_peak,
                    pct_att,
                    sev,
                    p.time_ms,
                    lvl,
                )
            )
        recs.sort(key=lambda x: (x.time_ms is None, -(x.time_ms or 0.0)))
        return RooflineAnalysis(recs, ridge)

    def plot_data(self, max_labels: int = 16) -> dict[str, Any]:
        """What :meth:`plot` draws, as data (FLOP/s and FLOP/byte): ``ceilings``, a list
        of ``{"label", "kind" ("memory" or "compute"), "x", "y"}`` polylines (every
        memory level's diagonal, every precision peak, and every other compute-side
        ceiling a point is judged against: vector-op rates, pipeline and parallelism
        ceilings), and ``points``, ``{"name", "x", "y", "roof", "ceiling", "labelled"}``
        with ``x`` the intensity the point is judged at and ``roof`` its attainable
        FLOP/s there."""
        cfg = self.config
        pts = self.points
        ridge_max = max(
            cfg.peak(p) / cfg.peak_bandwidth for p in [cfg.precision, *cfg.precision_peaks]
        )
        lo = min([p.arithmetic_intensity for p in pts] + [0.1]) / 2
        hi = max([p.arithmetic_intensity for p in pts] + [ridge_max]) * 4
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        top = max([cfg.peak_flops, *cfg.precision_peaks.values()] + [p.peak or 0.0 for p in pts])
        ceilings: list[dict[str, Any]] = []
        levels = [(cfg.memory_name, cfg.peak_bandwidth, None)] + [
            (n, b, s)
            for n, b, s in zip(cfg.cache_names, cfg.cache_bandwidths, cfg.cache_sizes, strict=True)
        ]
        for name, bw, size in levels:
            lab = f"{name} {bw / 1e9:,.0f} GB/s" + (f" ({_fmt_bytes(size)})" if size else "")
            ceilings.append(
                {
                    "label": lab,
                    "kind": "memory",
                    "level": name,
                    "x": xs,
                    "y": [min(top, x * bw) for x in xs],
                }
            )
        same: dict[float, list[str]] = {}
        for name, pk in [(cfg.precision, cfg.peak_flops), *cfg.precision_peaks.items()]:
            same.setdefault(pk, []).append(name)
        for pk, names in sorted(same.items(), key=lambda x: -x[0]):
            nm = "/".join(names)
            what = "vector units (1 op/lane/cycle)" if nm == "vector" else f"{nm} peak"
            ceilings.append(
                {
                    "label": f"{what} {pk / 1e12:,.2f} TFLOPS",
                    "kind": "compute",
                    "x": [pk / cfg.peak_bandwidth, hi],
                    "y": [pk, pk],
                }
            )
        own: dict[tuple[str, float], list[RooflinePoint]] = {}
        for p in pts:
            if p.peak is not None and not any(abs(p.peak / g - 1) < 1e-2 for g in same):
                key = (p.ceiling or "own", float(f"{p.peak:.3g}"))
                own.setdefault(key, []).append(p)
        for (label, _), members in sorted(own.items(), key=lambda x: -x[0][1]):
            x0 = min(m.arithmetic_intensity for m in members) / 1.6
            x1 = max(m.arithmetic_intensity for m in members) * 1.6
            pk = max(m.peak or 0.0 for m in members)
            who = ", ".join(m.name for m in members[:3]) + (", ..." if len(members) > 3 else "")
            ceilings.append(
                {
                    "label": f"{label} {pk / 1e12:,.3g} TFLOPS ({who})",
                    "kind": "compute",
                    "x": [x0, x1],
                    "y": [pk, pk],
                    "points": [m.name for m in members],
                }
            )
        ranked = sorted(range(len(pts)), key=lambda i: -(pts[i].time_ms or 0.0))
        shown = set(ranked[:max_labels])
        points = [
            {
                "name": p.name,
                "x": p.arithmetic_intensity,
                "y": p.performance,
                "roof": p.roof(cfg),
                "ceiling": p.ceiling,
                "level": p.level,
                "memory_bound": p.roof(cfg) < (p.peak or cfg.peak(p.precision)),
                "labelled": i in shown,
            }
            for i, p in enumerate(pts)
        ]
        return {
            "ceilings": ceilings,
            "points": points,
            "xlim": (lo, hi),
            "ylim": (min([p.performance for p in pts] + [lo * cfg.peak_bandwidth]) / 2, top * 2),
        }

    def figure(self, *, title: str | None = None, max_labels: int = 16) -> Any:
        """The roofline as a matplotlib ``Figure`` drawn from :meth:`plot_data` (log-log,
        TFLOPS over FLOP/byte): every ceiling, the points (red: memory-bound, green:
        compute-side bound, grey: latency-bound, under half its roof), labelled by name
        (the ``max_labels`` longest-running ones)."""
        from ._plot import new_figure

        cfg = self.config
        data = self.plot_data(max_labels)
        fig = new_figure((11, 7))
        ax = fig.subplots()
        ax.set_xscale("log")
        ax.set_yscale("log")
        lo, hi = data["xlim"]
        own = 0
        for c in data["ceilings"]:
            ys = [y / 1e12 for y in c["y"]]
            if c["kind"] == "memory":
                ax.plot(
                    c["x"],
                    ys,
                    lw=1.4,
                    ls="-" if c["level"] == cfg.memory_name else "--",
                    label=c["label"],
                    gid=f"ceiling:{c['label']}",
                )
            elif "points" in c:
                own += 1
                ax.plot(c["x"], ys, color="tab:purple", lw=0.9, ls=":", gid=f"ceiling:{c['label']}")
                ax.annotate(
                    c["label"],
                    (c["x"][1], ys[1]),
                    textcoords="offset points",
                    xytext=(2, 2),
                    fontsize=6,
                    color="tab:purple",
                )
            else:
                ax.plot(c["x"], ys, color="gray", lw=1.0, gid=f"ceiling:{c['label']}")
                ax.annotate(
                    c["label"],
                    (hi, ys[1]),
                    textcoords="offset points",
                    xytext=(-4, 3),
                    ha="right",
                    fontsize=8,
                    color="dimgray",
                )
        pts = data["points"]
        if pts:

            def color(p: dict[str, Any]) -> str:
                if p["y"] < LATENCY_BOUND_PCT / 100 * p["roof"]:
                    return "tab:gray"
                return "tab:red" if p["memory_bound"] else "tab:green"

            ax.scatter(
                [p["x"] for p in pts],
                [p["y"] / 1e12 for p in pts],
                c=[color(p) for p in pts],
                s=28,
                zorder=3,
                edgecolors="black",
                linewidths=0.5,
                gid="points",
            )
            _label(ax, [(p["name"], p["x"], p["y"] / 1e12) for p in pts if p["labelled"]])
        ax.set_xlim(lo, hi)
        ax.set_ylim(data["ylim"][0] / 1e12, data["ylim"][1] / 1e12)
        ax.set_xlabel("arithmetic intensity (FLOP/byte) at the level that binds each point")
        ax.set_ylabel("performance (TFLOPS)")
        ax.set_title(
            title
            or f"Roofline: {cfg.name} (ridge point {self.ridge_point():.3g} "
            f"FLOP/byte; red: memory-bound, green: compute-side bound, grey: "
            f"latency-bound; dotted: per-kernel ceilings)"
        )
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(loc="lower right", fontsize=8)
        return fig

    def plot(
        self, path: str | os.PathLike[str], *, title: str | None = None, max_labels: int = 16
    ) -> str:
        """Draw :meth:`figure` and write it as a PNG to ``path``; returns the path
        (``wia_roofline_plot``)."""
        from ._plot import save

        return save(self.figure(title=title, max_labels=max_labels), path)


def _label(ax: Any, items: list[tuple[str, float, float]]) -> None:
    """Label points, trying a few offsets per label so that labels do not overlap."""
    fig = ax.figure
    fig.canvas.draw()
    placed: list[tuple[float, float, float, float]] = []
    offsets = [(5, 4), (5, -11), (-5, 4), (-5, -11), (5, 14), (5, -21), (-5, 14), (-5, -21)]
    for name, x, y in items:
        px, py = ax.transData.transform((x, y))
        w, h = 4.6 * len(name) + 4, 10.0
        choice = offsets[0]
        for dx, dy in offsets:
            x0 = px + dx * 1.4 if dx > 0 else px + dx * 1.4 - w
            y0 = py + dy * 1.4
            box = (x0, y0, x0 + w, y0 + h)
            if not any(
                box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed
            ):
                choice = (dx, dy)
                placed.append(box)
                break
        else:
            placed.append((px, py, px + w, py + h))
        ax.annotate(
            name,
            (x, y),
            textcoords="offset points",
            xytext=choice,
            fontsize=7,
            ha="left" if choice[0] > 0 else "right",
        )


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def create_roofline(config: RooflineConfig | Any | None = None) -> Roofline:
    """``wia_create_roofline``: from a :class:`RooflineConfig`, or from a device spec,
    a spec's name or path, or a context (its ceilings via
    :meth:`RooflineConfig.from_spec`)."""
    if config is None or isinstance(config, (str, os.PathLike)):
        from ..spec import DEFAULT_DEVICE, load_spec

        config = RooflineConfig.from_spec(load_spec(DEFAULT_DEVICE if config is None else config))
    elif not isinstance(config, RooflineConfig):
        config = RooflineConfig.from_spec(config)
    return Roofline(config)


def roofline_add_point(
    roofline: Roofline,
    arithmetic_intensity: float,
    performance: float,
    name: str | None = None,
    **kw: Any,
) -> RooflinePoint:
    """``wia_roofline_add_point``: :meth:`Roofline.add_point`."""
    return roofline.add_point(arithmetic_intensity, performance, name, **kw)


def roofline_plot(roofline: Roofline, path: str | os.PathLike[str], **kw: Any) -> str:
    """``wia_roofline_plot``: :meth:`Roofline.plot`."""
    return roofline.plot(path, **kw)


def analyze_roofline(roofline: Roofline, **kw: Any) -> RooflineAnalysis:
    """``wia_analyze_roofline``: :meth:`Roofline.analyze`."""
    return roofline.analyze(**kw)
