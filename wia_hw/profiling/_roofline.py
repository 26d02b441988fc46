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
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._kernel import KernelProfile
from ._metrics import fmt_ai

__all__ = ["RooflineConfig", "Roofline", "RooflinePoint", "RooflineRecommendation",
           "RooflineAnalysis", "create_roofline", "roofline_add_point", "roofline_plot",
           "analyze_roofline", "SEVERE_AI", "NEAR_OPTIMAL_PCT"]

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
            raise ValueError(f"cache_sizes ({len(sizes)}) and cache_bandwidths ({len(bws)}) "
                             "must have the same length")
        for i, b in enumerate(bws):
            _pos(f"cache_bandwidths[{i}]", b)
        names = tuple(self.cache_names) or tuple(f"L{i + 1}" for i in range(len(sizes)))
        if len(names) != len(sizes):
            raise ValueError(f"cache_names ({len(names)}) must name every cache level "
                             f"({len(sizes)})")
        for k, v in self.precision_peaks.items():
            _pos(f"precision_peaks[{k!r}]", v)
        object.__setattr__(self, "cache_sizes", sizes)
        object.__setattr__(self, "cache_bandwidths", bws)
        object.__setattr__(self, "cache_names", names)
        object.__setattr__(self, "precision_peaks", dict(self.precision_peaks))

    @classmethod
    def from_spec(cls, spec: Any) -> RooflineConfig:
        """Ceilings of a device: every array precision's peak and the vector units' peak,
        HBM, and L2 and L1 (aggregate over cores) with their sizes."""
        from ._metrics import DeviceInfo

        spec = getattr(spec, "spec", spec)          # a Context works too
        d = DeviceInfo.from_spec(spec)
        prec = "fp16" if "fp16" in d.peak_macs_per_cycle else next(iter(d.peak_macs_per_cycle))
        peaks = {p: d.peak_flops(p) for p in d.peak_macs_per_cycle if p != prec}
        peaks["vector"] = d.vector_peak_flops
        return cls(peak_flops=d.peak_flops(prec), peak_bandwidth=d.hbm_bandwidth_gbs * 1e9,
                   cache_sizes=(d.l1_size_bytes * d.cores, d.l2_size_bytes),
                   cache_bandwidths=(d.level_bandwidth_gbs("l1") * 1e9,
                                     d.l2_bandwidth_gbs * 1e9),
                   cache_names=("L1", "L2"), precision=prec, precision_peaks=peaks,
                   name=d.name)

    def peak(self, precision: str | None = None) -> float:
        if precision is None or precision == self.precision:
            return self.peak_flops
        if precision not in self.precision_peaks:
            raise ValueError(f"no compute ceiling for {precision!r} (have: "
                             f"{', '.join([self.precision, *self.precision_peaks])})")
        return self.precision_peaks[precision]

    def bandwidth(self, level: str | None = None) -> float:
        if level is None or level in (self.memory_name, "hbm", "memory"):
            return self.peak_bandwidth
        names = [n.lower() for n in self.cache_names]
        if level.lower() not in names:
            raise ValueError(f"unknown memory level {level!r} (have: "
                             f"{', '.join([*self.cache_names, self.memory_name])})")
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


@dataclass(frozen=True)
class RooflineRecommendation:
    """One line of the analysis: ``kernel_name`` and the seed-form ``suggestion``, with
    the figures behind it (``bound`` ``memory`` or ``compute``, the binding memory
    ``level`` and the ``arithmetic_intensity`` there, ``pct_of_peak``,
    ``pct_of_attainable``, ``severity`` ``severe``/``memory``/``ok``/``compute``)."""

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

    def attainable(self, arithmetic_intensity: float, precision: str | None = None,
                   level: str | None = None) -> float:
        """``min(peak, AI x bandwidth)`` in FLOP/s."""
        return min(self.config.peak(precision),
                   arithmetic_intensity * self.config.bandwidth(level))

    def add_point(self, arithmetic_intensity: float, performance: float,
                  name: str | None = None, *, precision: str | None = None,
                  level: str | None = None, time_ms: float | None = None,
                  peak: float | None = None,
                  intensities: Mapping[str, float] | None = None) -> RooflinePoint:
        """Add a measurement (``wia_roofline_add_point``); returns it. Raises
        ValueError for a non-positive value or an unknown precision or level."""
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
        p = RooflinePoint(name or f"point{len(self.points)}", ai, perf, precision, level,
                          time_ms, peak, dict(intensities) if intensities else None)
        self.points.append(p)
        return p

    def add_kernel(self, profile: KernelProfile) -> RooflinePoint | None:
        """Add a :class:`KernelProfile` at its HBM intensity; skipped (``None``) when it
        moved no HBM byte or did no FLOP (no finite point to plot)."""
        ai = profile.arithmetic_intensity
        if not ai or not profile.flops:
            return None
        prec, peak = self._ceiling(profile.kind, profile.precision,
                                   profile.compute_ceiling_flops)
        return self.add_point(ai, profile.flops, profile.name, precision=prec,
                              time_ms=profile.duration_ms, peak=peak,
                              intensities=self._levels(profile.flop_count, profile.bytes))

    def _levels(self, flop: int, nbytes: Mapping[str, int] | None) -> dict[str, float] | None:
        """Per-level intensities for the levels this roofline has (L1, L2, HBM)."""
        if not nbytes:
            return None
        names = {n.lower(): n for n in self.config.cache_names}
        out = {}
        for lvl, nb in nbytes.items():
            if nb and (lvl in names or lvl == "hbm"):
                out[names.get(lvl, self.config.memory_name)] = flop / nb
        return out or None

    def _ceiling(self, kind: str, precision: str, own: float | None
                 ) -> tuple[str | None, float | None]:
        """(precision, peak) to judge a kernel by: its precision's ceiling for array
        work; its own op-class rate for vector work (the vector ceiling if unknown)."""
        if kind == "vector":
            if own:
                return None, own
            precision = "vector"
        if precision != self.config.precision and precision not in self.config.precision_peaks:
            return None, own
        return precision, None

    def add_report(self, report: Any, *, aggregate: bool = True) -> list[RooflinePoint]:
        """Add the kernels of a :class:`ProfilingReport` (or a ``RunResult``). With
        ``aggregate``, kernels that differ only by their ``layerN.`` prefix become one
        point (their FLOPs, HBM bytes and time summed) named ``name (xN)``."""
        from ._kernel import stats_from_record
        from ._metrics import DeviceInfo

        if hasattr(report, "kernel_profiles"):
            stats, dev = report.kernels, report.device
        else:                                   # a RunResult
            stats = [stats_from_record(k.record, i) for i, k in enumerate(report.kernels)]
            from ..spec import load_spec

            dev = DeviceInfo.from_spec(load_spec(report.device))
        groups: dict[str, list[Any]] = {}
        for ks in stats:
            key = re.sub(r"^layer\d+\.", "", ks.name) if aggregate else f"{ks.name}#{ks.index}"
            groups.setdefault(key, []).append(ks)
        out = []
        for key, members in groups.items():
            nb = [m.counter("bytes") for m in members]
            if any(b is None for b in nb):
                continue
            flop = sum(m.flop_count for m in members)
            hbm = sum(b["hbm"] for b in nb)
            cyc = sum(m.cycles for m in members)
            if not flop or not hbm or not cyc:
                continue
            secs = cyc / (dev.clock_ghz * 1e9)
            k0 = members[0]
            own = None
            if all(m.ideal_cycles for m in members):
                own = flop / (sum(m.ideal_cycles for m in members) / (dev.clock_ghz * 1e9))
            prec, peak = self._ceiling(k0.kind, k0.precision, own)
            name = key.split("#")[0] + (f" (x{len(members)})" if len(members) > 1 else "")
            levels = {lvl: sum(b[lvl] for b in nb) for lvl in nb[0]}
            out.append(self.add_point(flop / hbm, flop / secs, name, precision=prec,
                                      time_ms=secs * 1e3, peak=peak,
                                      intensities=self._levels(flop, levels)))
        return out

    def analyze(self, *, severe_ai: float = SEVERE_AI,
                near_optimal_pct: float = NEAR_OPTIMAL_PCT) -> RooflineAnalysis:
        """``wia_analyze_roofline``; see the module docstring for the rules. Points with
        a known ``time_ms`` come first, longest first."""
        ridge = self.ridge_point()
        recs = []
        main = self.config.memory_name
        for p in self.points:
            peak = p.peak or self.config.peak(p.precision)
            levels = dict(p.intensities or {(p.level or main): p.arithmetic_intensity})
            # the binding memory ceiling: the lowest AI x bandwidth over the levels
            lvl, ai_b = min(levels.items(),
                            key=lambda kv: (kv[1] * self.config.bandwidth(kv[0]), kv[0]))
            att = min(peak, ai_b * self.config.bandwidth(lvl))
            where = "" if lvl in (main, p.level) or lvl.lower() == "hbm" else f"{lvl}, "
            ai = f"{where}AI={fmt_ai(ai_b)}"
            pct_peak = 100.0 * p.performance / peak
            pct_att = 100.0 * p.performance / att
            if att < peak:
                if ai_b < severe_ai:
                    sev, text = "severe", (f"Severely memory-bound ({ai}). Fuse with "
                                           "preceding operation.")
                else:
                    sev, text = "memory", (f"Memory-bound ({ai}). Increase tiling to "
                                           "improve cache reuse.")
                bound = "memory"
            else:
                bound = "compute"
                if pct_peak >= near_optimal_pct:
                    sev, text = "ok", (f"Compute-bound. Near-optimal performance "
                                       f"({pct_peak:.0f}% of peak).")
                else:
                    sev, text = "compute", (f"Compute-bound at {pct_peak:.0f}% of peak. "
                                            "Increase parallelism or improve the array "
                                            "mapping.")
            recs.append(RooflineRecommendation(p.name, text, bound, ai_b, p.performance, att,
                                               pct_peak, pct_att, sev, p.time_ms, lvl))
        recs.sort(key=lambda x: (x.time_ms is None, -(x.time_ms or 0.0)))
        return RooflineAnalysis(recs, ridge)

    def plot(self, path: str | os.PathLike[str], *, title: str | None = None,
             max_labels: int = 16) -> str:
        """Draw the roofline (log-log): a horizontal ceiling per precision, a diagonal
        per memory level, the points labelled by name (the ``max_labels`` longest-running
        ones); writes a PNG to ``path`` and returns it (``wia_roofline_plot``)."""
        from ._plot import new_figure, save

        cfg = self.config
        pts = self.points
        ridge_max = max(cfg.peak(p) / cfg.peak_bandwidth
                        for p in [cfg.precision, *cfg.precision_peaks])
        lo = min([p.arithmetic_intensity for p in pts] + [0.1]) / 2
        hi = max([p.arithmetic_intensity for p in pts] + [ridge_max]) * 4
        fig = new_figure((11, 7))
        ax = fig.subplots()
        ax.set_xscale("log")
        ax.set_yscale("log")
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        top = max([cfg.peak_flops, *cfg.precision_peaks.values()])
        levels = [(cfg.memory_name, cfg.peak_bandwidth, None)] + [
            (n, b, s) for n, b, s in zip(cfg.cache_names, cfg.cache_bandwidths,
                                         cfg.cache_sizes, strict=True)]
        for name, bw, size in levels:
            ys = [min(top, x * bw) for x in xs]
            lab = f"{name} {bw / 1e9:,.0f} GB/s" + (f" ({_fmt_bytes(size)})" if size else "")
            ax.plot(xs, [y / 1e12 for y in ys], lw=1.4, ls="-" if size is None else "--",
                    label=lab)
        same: dict[float, list[str]] = {}
        for name, pk in [(cfg.precision, cfg.peak_flops), *cfg.precision_peaks.items()]:
            same.setdefault(pk, []).append(name)
        peaks = [("/".join(names), pk) for pk, names in same.items()]
        for name, pk in sorted(peaks, key=lambda x: -x[1]):
            ax.plot([pk / cfg.peak_bandwidth, hi], [pk / 1e12] * 2, color="gray", lw=1.0)
            what = "vector units (1 op/lane/cycle)" if name == "vector" else f"{name} peak"
            ax.annotate(f"{what} {pk / 1e12:,.1f} TFLOPS", (hi, pk / 1e12),
                        textcoords="offset points", xytext=(-4, 3), ha="right", fontsize=8,
                        color="dimgray")
        if pts:
            bound = ["tab:red" if p.arithmetic_intensity * self.config.bandwidth(p.level)
                     < (p.peak or self.config.peak(p.precision)) else "tab:green" for p in pts]
            ax.scatter([p.arithmetic_intensity for p in pts],
                       [p.performance / 1e12 for p in pts], c=bound, s=28, zorder=3,
                       edgecolors="black", linewidths=0.5)
        ax.set_xlim(lo, hi)
        floor = min([p.performance for p in pts] + [lo * cfg.peak_bandwidth]) / 1e12
        ax.set_ylim(floor / 2, top / 1e12 * 2)
        if pts:
            ranked = sorted(range(len(pts)), key=lambda i: -(pts[i].time_ms or 0.0))
            _label(ax, [(pts[i].name, pts[i].arithmetic_intensity, pts[i].performance / 1e12)
                        for i in ranked[:max_labels]])
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("performance (TFLOPS)")
        ax.set_title(title or f"Roofline: {cfg.name} (ridge point {self.ridge_point():.3g} "
                     f"FLOP/byte; red: memory-bound, green: compute-bound)")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(loc="lower right", fontsize=8)
        return save(fig, path)


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
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3]
                       for b in placed):
                choice = (dx, dy)
                placed.append(box)
                break
        else:
            placed.append((px, py, px + w, py + h))
        ax.annotate(name, (x, y), textcoords="offset points", xytext=choice, fontsize=7,
                    ha="left" if choice[0] > 0 else "right")


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def create_roofline(config: RooflineConfig | Any | None = None) -> Roofline:
    """``wia_create_roofline``: from a :class:`RooflineConfig`, or from a device spec or
    context (its ceilings via :meth:`RooflineConfig.from_spec`)."""
    if config is None:
        from ..spec import DEFAULT_DEVICE, load_spec

        config = RooflineConfig.from_spec(load_spec(DEFAULT_DEVICE))
    elif not isinstance(config, RooflineConfig):
        config = RooflineConfig.from_spec(config)
    return Roofline(config)


def roofline_add_point(roofline: Roofline, arithmetic_intensity: float, performance: float,
                       name: str | None = None, **kw: Any) -> RooflinePoint:
    """``wia_roofline_add_point``: :meth:`Roofline.add_point`."""
    return roofline.add_point(arithmetic_intensity, performance, name, **kw)


def roofline_plot(roofline: Roofline, path: str | os.PathLike[str], **kw: Any) -> str:
    """``wia_roofline_plot``: :meth:`Roofline.plot`."""
    return roofline.plot(path, **kw)


def analyze_roofline(roofline: Roofline, **kw: Any) -> RooflineAnalysis:
    """``wia_analyze_roofline``: :meth:`Roofline.analyze`."""
    return roofline.analyze(**kw)
