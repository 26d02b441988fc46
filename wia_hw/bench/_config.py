"""The benchmark configuration (the seed's ``wia_benchmark_config_t``, section 8.8)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from ..emulator.enums import StrNamedEnum
from ..emulator.errors import WiaError

__all__ = [
    "BenchmarkConfig",
    "BenchmarkError",
    "EnvironmentalMonitoring",
    "Metric",
    "OutlierMethod",
    "VARIATION_SOURCES",
]


class BenchmarkError(WiaError, ValueError):
    """Bad benchmark input: a config value, an empty sample, a baseline of another device.
    ``str(err)`` is one line."""


class OutlierMethod(enum.Enum):
    """How measurements are declared outliers and removed before the statistics.

    ``IQR`` (the seed's ``WIA_OUTLIER_IQR``): Tukey's fences, a sample outside
    ``[Q1 - k IQR, Q3 + k IQR]`` is removed (``k = outlier_threshold``, 1.5 by default;
    quartiles by linear interpolation, numpy's default). ``MAD``: the modified z-score of
    Iglewicz and Hoaglin, ``0.6745 |x - median| / MAD > k`` (they suggest ``k = 3.5``).
    ``NONE`` keeps every sample. When the IQR (or the MAD) is 0, most samples are one
    value and the fences would collapse onto it: nothing is removed.
    """

    NONE = "none"
    IQR = "iqr"
    MAD = "mad"


#: The modelled sources of run-to-run variation on the emulator, by config name.
VARIATION_SOURCES: dict[str, str] = {
    "thermal": "the die temperature carries over from one iteration to the next (the "
    "emulator's RC model); when off, every iteration starts at the temperature "
    "the device had when the benchmark began",
    "dram_refresh": "the HBM channels' refresh windows (every tREFI a channel is blocked "
    "for tRFC: the spec's memory.hbm figures, or refresh_interval_ns/refresh_cycle_ns) "
    "at a phase per channel drawn from variation_seed, each channel at its nominal rate "
    "between them, in place of the spec's mean-cost refresh",
    "arbitration_jitter": "each HBM transfer is granted 0 to arbitration_jitter_cycles "
    "cycles late, uniformly, drawn from variation_seed",
}


class Metric(StrNamedEnum):
    """What an optimisation workflow's goal measures (the seed's ``WIA_METRIC_*``):
    ``LATENCY`` (ms, lower is better) or ``THROUGHPUT`` (sequences/s, higher is better).
    Members are strings too, so ``WorkflowBaseline(metric=Metric.LATENCY)`` and
    ``WorkflowBaseline(metric="latency")`` are the same goal."""

    LATENCY = "latency"
    THROUGHPUT = "throughput"


@dataclass(frozen=True, kw_only=True)
class EnvironmentalMonitoring:
    """What the benchmark records about the device while it measures."""

    track_temperature: bool = True
    track_power: bool = True
    track_frequency: bool = True


def _count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BenchmarkError(f"BenchmarkConfig.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise BenchmarkError(f"BenchmarkConfig.{name} must be at least {minimum}, got {value}")


@dataclass(frozen=True, kw_only=True)
class BenchmarkConfig:
    """How to benchmark an operation: the seed's fields plus the variation model and the
    wall-time calibration.

    ``warmup_iterations`` run first and are discarded (on the emulator they warm the
    caches); ``measurement_iterations`` (at least 1) are measured; ``cooldown_iterations``
    run after them and are discarded (the last measured launch is never the device's
    last). ``report_percentiles`` (in [0, 100]) are computed into
    ``BenchmarkResult.percentiles_ms``; the seed's five (50, 90, 95, 99, 99.9) are always
    fields of the result. ``report_mean/median/std_dev/min_max`` choose the lines of
    ``format_text``. ``outlier_detection`` and ``outlier_threshold`` (> 0): see
    :class:`OutlierMethod`.

    ``variation_sources``: modelled run-to-run variation on the emulator, names from
    :data:`VARIATION_SOURCES` (default: ``thermal`` only, the one a plain ``ctx.run``
    sequence has too); empty turns every source off and repeated runs are then
    identical (the spec's refresh is its mean cost). ``variation_seed`` seeds the random ones (refresh
    phases, grant delays): the same seed gives the same samples.
    ``refresh_interval_ns`` (tREFI) and ``refresh_cycle_ns`` (tRFC): the timings
    ``dram_refresh`` uses (``None``, the default: the spec's);
    ``arbitration_jitter_cycles`` (8, a model assumption, not a cited figure) bounds the
    grant delay of ``arbitration_jitter``. See :mod:`wia_hw.bench._variation`.

    Wall-time benchmarks (a plain callable): each sample calls it in a calibrated inner
    loop lasting at least ``min_sample_time_ms`` (pyperf and criterion calibrate the same
    way); a result whose coefficient of variation exceeds ``unstable_cv_percent`` (10 %,
    pyperf's threshold) carries a warning. ``temperature_warning_c`` is the seed's 5 °C.
    Bad values raise :class:`BenchmarkError` naming the field.
    """

    warmup_iterations: int = 10
    measurement_iterations: int = 100
    cooldown_iterations: int = 5
    report_percentiles: tuple[float, ...] = (50, 90, 95, 99, 99.9)
    num_percentiles: int | None = None
    report_mean: bool = True
    report_median: bool = True
    report_std_dev: bool = True
    report_min_max: bool = True
    outlier_detection: OutlierMethod = OutlierMethod.IQR
    outlier_threshold: float = 1.5
    environmental_monitoring: EnvironmentalMonitoring = field(
        default_factory=EnvironmentalMonitoring
    )
    variation_sources: tuple[str, ...] = ("thermal",)
    variation_seed: int = 0
    refresh_interval_ns: float | None = None
    refresh_cycle_ns: float | None = None
    arbitration_jitter_cycles: int = 8
    min_sample_time_ms: float = 10.0
    unstable_cv_percent: float = 10.0
    temperature_warning_c: float = 5.0

    def __post_init__(self) -> None:
        _count("warmup_iterations", self.warmup_iterations, 0)
        _count("measurement_iterations", self.measurement_iterations, 1)
        _count("cooldown_iterations", self.cooldown_iterations, 0)
        _count("variation_seed", self.variation_seed, 0)
        _count("arbitration_jitter_cycles", self.arbitration_jitter_cycles, 0)
        try:
            pcts = tuple(float(p) for p in self.report_percentiles)
        except (TypeError, ValueError):
            raise BenchmarkError(
                "BenchmarkConfig.report_percentiles must be numbers, got "
                f"{self.report_percentiles!r}"
            ) from None
        bad = [p for p in pcts if not 0 <= p <= 100]
        if bad:
            raise BenchmarkError(
                f"BenchmarkConfig.report_percentiles must be in [0, 100], got {bad[0]:g}"
            )
        object.__setattr__(self, "report_percentiles", pcts)
        n = self.num_percentiles
        if n is None:
            object.__setattr__(self, "num_percentiles", len(pcts))
        elif isinstance(n, bool) or not isinstance(n, int) or n != len(pcts):
            raise BenchmarkError(
                f"BenchmarkConfig.num_percentiles must equal len(report_percentiles) = "
                f"{len(pcts)}, got {n!r}"
            )
        method = self.outlier_detection
        if isinstance(method, str):
            try:
                method = OutlierMethod(method.lower())
            except ValueError:
                method = None
        if not isinstance(method, OutlierMethod):
            raise BenchmarkError(
                "BenchmarkConfig.outlier_detection must be one of "
                f"{', '.join(m.value for m in OutlierMethod)}, got "
                f"{self.outlier_detection!r}"
            )
        object.__setattr__(self, "outlier_detection", method)
        for name in (
            "outlier_threshold",
            "min_sample_time_ms",
            "unstable_cv_percent",
            "temperature_warning_c",
            "refresh_interval_ns",
            "refresh_cycle_ns",
        ):
            v = getattr(self, name)
            if v is None and name.startswith("refresh_"):
                continue
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
                or v <= 0
            ):
                raise BenchmarkError(f"BenchmarkConfig.{name} must be a positive number, got {v!r}")
        if (self.refresh_interval_ns is None) != (self.refresh_cycle_ns is None):
            raise BenchmarkError(
                "BenchmarkConfig.refresh_interval_ns and refresh_cycle_ns are set together "
                f"(None: the spec's), got {self.refresh_interval_ns!r} and "
                f"{self.refresh_cycle_ns!r}"
            )
        if self.refresh_cycle_ns is not None and self.refresh_cycle_ns >= self.refresh_interval_ns:
            raise BenchmarkError(
                "BenchmarkConfig.refresh_cycle_ns must be below "
                f"refresh_interval_ns ({self.refresh_interval_ns:g}), got "
                f"{self.refresh_cycle_ns:g}"
            )
        sources = (
            (self.variation_sources,)
            if isinstance(self.variation_sources, str)
            else tuple(self.variation_sources)
        )
        for s in sources:
            if s not in VARIATION_SOURCES:
                raise BenchmarkError(
                    f"BenchmarkConfig.variation_sources: unknown source "
                    f"{s!r}; modelled: {', '.join(VARIATION_SOURCES)}"
                )
        object.__setattr__(self, "variation_sources", sources)
        if not isinstance(self.environmental_monitoring, EnvironmentalMonitoring):
            raise BenchmarkError(
                "BenchmarkConfig.environmental_monitoring must be an "
                "EnvironmentalMonitoring, got "
                f"{type(self.environmental_monitoring).__name__}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain types, for JSON and the baseline file."""
        return {
            "warmup_iterations": self.warmup_iterations,
            "measurement_iterations": self.measurement_iterations,
            "cooldown_iterations": self.cooldown_iterations,
            "report_percentiles": list(self.report_percentiles),
            "outlier_detection": self.outlier_detection.value,
            "outlier_threshold": self.outlier_threshold,
            "variation_sources": list(self.variation_sources),
            "variation_seed": self.variation_seed,
            "refresh_interval_ns": self.refresh_interval_ns,
            "refresh_cycle_ns": self.refresh_cycle_ns,
            "arbitration_jitter_cycles": self.arbitration_jitter_cycles,
            "min_sample_time_ms": self.min_sample_time_ms,
        }
