"""What a benchmark measured: :class:`BenchmarkResult` (the seed's
``wia_benchmark_result_t``) and its :class:`EnvironmentalData`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ._config import BenchmarkConfig, BenchmarkError
from ._stats import as_samples, outlier_mask

__all__ = ["BenchmarkResult", "EnvironmentalData", "summarize", "fmt_ms"]

#: The seed's five percentiles and the result fields that hold them.
SEED_PERCENTILES = {50.0: "p50_ms", 90.0: "p90_ms", 95.0: "p95_ms", 99.0: "p99_ms", 99.9: "p999_ms"}


@dataclass(frozen=True)
class EnvironmentalData:
    """The device's state over the measured iterations (the emulator's power and thermal
    model); ``None`` where not tracked or not available (wall-time benchmarks).

    Temperatures in °C: at the start of the first and the end of the last measured
    iteration, lowest and highest seen (at iteration boundaries and at the end of every
    kernel), and ``temperature_variation`` = highest - lowest. Power in W: the mean and
    the highest of the iterations' average powers (energy / time). Frequency in GHz: the
    clock the kernels' work ran at (nominal clock times the thermal throttle factor),
    cycle-weighted mean and lowest; ``throttled_iterations`` counts iterations with any
    kernel below nominal clock.
    """

    temperature_start_c: float | None = None
    temperature_end_c: float | None = None
    temperature_min_c: float | None = None
    temperature_max_c: float | None = None
    temperature_variation: float | None = None
    power_mean_w: float | None = None
    power_max_w: float | None = None
    frequency_mean_ghz: float | None = None
    frequency_min_ghz: float | None = None
    throttled_iterations: int | None = None

    @property
    def temperature_varied(self) -> float | None:
        """The seed's spelling of :attr:`temperature_variation`."""
        return self.temperature_variation

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def fmt_ms(v: float) -> str:
    """The seed's ``%.3f``, with more decimals below 1 ms (four significant digits)."""
    if v == 0 or not math.isfinite(v) or abs(v) >= 1:
        return f"{v:.3f}"
    return f"{v:.{max(3, 3 - math.floor(math.log10(abs(v))))}f}"


@dataclass
class BenchmarkResult:
    """The statistics of one benchmark. Times in ms.

    ``raw_samples_ms`` holds every measured iteration in order; ``samples_ms`` those left
    after outlier removal, on which every statistic is computed. ``num_measurements`` is
    the number of measured iterations, ``num_outliers`` the number removed. ``std_dev_ms``
    is the sample standard deviation (n - 1); ``cv_percent`` = 100 std / mean;
    percentiles by linear interpolation (numpy's default); ``throughput`` in operations
    per second (1000 / mean_ms). ``kind`` is ``"emulator"`` (device time) or ``"wall"``
    (host wall time, ``inner_loops`` calls per sample). ``device``/``spec_hash`` identify
    where it ran (``"host"`` for wall time); ``warnings`` holds the seed's temperature
    warning and the instability warning.
    """

    name: str
    kind: str
    device: str
    spec_hash: str
    tool_version: str
    raw_samples_ms: tuple[float, ...]
    samples_ms: tuple[float, ...]
    num_measurements: int
    num_outliers: int
    mean_ms: float
    std_dev_ms: float
    median_ms: float
    min_ms: float
    max_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    cv_percent: float
    throughput: float
    percentiles_ms: dict[float, float]
    environmental_data: EnvironmentalData
    config: BenchmarkConfig
    inner_loops: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: Cycles the HBM-channel variation sources added over the whole benchmark, summed
    #: over channels (``refresh_stall_cycles``, ``jitter_stall_cycles``), when enabled.
    variation_cycles: dict[str, int] = field(default_factory=dict)
    #: The last measured run (emulator workloads run through ``ctx.run``), else None.
    last_run: Any = field(default=None, repr=False, compare=False)

    def format_text(self) -> str:
        """The seed's report block (section 8.8), one line per figure the config asks."""
        c = self.config
        lines = [f"Benchmark Results ({self.num_measurements} measurements):"]
        # a spread needs two samples: with one, it is not zero but unknown
        spread = self.num_measurements - self.num_outliers >= 2
        sd_text = f"{fmt_ms(self.std_dev_ms)} ms" if spread else "n/a (one measurement)"
        if c.report_mean:
            sd = f" (±{sd_text})" if c.report_std_dev and spread else ""
            lines.append(f"  Mean: {fmt_ms(self.mean_ms)} ms{sd}")
        elif c.report_std_dev:
            lines.append(f"  Std dev: {sd_text}")
        if c.report_median:
            lines.append(f"  Median: {fmt_ms(self.median_ms)} ms")
        if c.report_min_max:
            lines.append(f"  Min: {fmt_ms(self.min_ms)} ms")
            lines.append(f"  Max: {fmt_ms(self.max_ms)} ms")
        for p, v in self.percentiles_ms.items():
            lines.append(f"  P{p:g}: {fmt_ms(v)} ms")
        lines.append(
            f"  Coefficient of variation: {self.cv_percent:.1f}%"
            if spread
            else "  Coefficient of variation: n/a (one measurement)"
        )
        lines.append(f"  Throughput: {self.throughput:.1f} ops/sec")
        lines.append(f"  Outliers removed: {self.num_outliers}")
        lines.extend(f"  {w}" for w in self.warnings)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain types (JSON); :meth:`from_dict` reads it back."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "last_run":
                continue
            v = getattr(self, f.name)
            if f.name == "environmental_data":
                v = v.to_dict()
            elif f.name == "config":
                v = v.to_dict()
            elif f.name == "percentiles_ms":
                v = [[p, x] for p, x in v.items()]
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchmarkResult:
        try:
            kw = {k: d[k] for k in (f.name for f in fields(cls)) if k in d}
            kw["raw_samples_ms"] = tuple(d["raw_samples_ms"])
            kw["samples_ms"] = tuple(d["samples_ms"])
            kw["percentiles_ms"] = {float(p): float(x) for p, x in d["percentiles_ms"]}
            kw["environmental_data"] = EnvironmentalData(**d["environmental_data"])
            cfg = dict(d["config"])
            cfg["report_percentiles"] = tuple(cfg["report_percentiles"])
            cfg["variation_sources"] = tuple(cfg["variation_sources"])
            kw["config"] = BenchmarkConfig(**cfg)
            return cls(**kw)
        except (KeyError, TypeError) as e:
            raise BenchmarkError(f"not a benchmark result record: {type(e).__name__} {e}") from None


def summarize(
    raw_ms: list[float],
    cfg: BenchmarkConfig,
    *,
    name: str,
    kind: str,
    device: str,
    spec_hash: str,
    tool_version: str,
    env: EnvironmentalData,
    inner_loops: int = 1,
    params: dict[str, Any] | None = None,
    last_run: Any = None,
    variation_cycles: dict[str, int] | None = None,
) -> BenchmarkResult:
    """The statistics of ``raw_ms`` under ``cfg``, with the seed's warnings."""
    raw = as_samples(raw_ms, f"benchmark {name!r}: the measured samples")
    mask = outlier_mask(raw, cfg.outlier_detection, cfg.outlier_threshold)
    kept = raw[~mask]
    if np.ptp(kept) == 0:  # identical samples (a deterministic emulator): exact
        mean, sd = float(kept[0]), 0.0
    else:
        mean, sd = float(np.mean(kept)), float(np.std(kept, ddof=1))
    seed_p = dict(
        zip(
            SEED_PERCENTILES.values(),
            (float(x) for x in np.percentile(kept, list(SEED_PERCENTILES))),
            strict=True,
        )
    )
    asked = cfg.report_percentiles
    pcts = (
        dict(zip(asked, (float(x) for x in np.percentile(kept, list(asked))), strict=True))
        if asked
        else {}
    )
    cv = 100.0 * sd / mean if mean else 0.0
    warnings = []
    tv = env.temperature_variation
    if tv is not None and tv > cfg.temperature_warning_c:
        warnings.append(f"WARNING: Temperature varied by {tv:.1f}°C during measurement")
        warnings.append("Results may not be representative")
    if cv > cfg.unstable_cv_percent:
        warnings.append(
            f"WARNING: unstable results: coefficient of variation {cv:.1f}% "
            f"is above {cfg.unstable_cv_percent:g}%"
        )
    return BenchmarkResult(
        name=name,
        kind=kind,
        device=device,
        spec_hash=spec_hash,
        tool_version=tool_version,
        raw_samples_ms=tuple(float(x) for x in raw),
        samples_ms=tuple(float(x) for x in kept),
        num_measurements=int(raw.size),
        num_outliers=int(mask.sum()),
        mean_ms=mean,
        std_dev_ms=sd,
        median_ms=float(np.median(kept)),
        min_ms=float(kept.min()),
        max_ms=float(kept.max()),
        **seed_p,
        cv_percent=cv,
        throughput=1000.0 / mean if mean else 0.0,
        percentiles_ms=pcts,
        environmental_data=env,
        config=cfg,
        inner_loops=inner_loops,
        params=dict(params or {}),
        warnings=warnings,
        last_run=last_run,
        variation_cycles=dict(variation_cycles or {}),
    )
