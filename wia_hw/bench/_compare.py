"""``compare_benchmarks``: is a result faster or slower than its baseline, and how sure
is that (the seed's ``wia_significance_test_t``, section 8.8)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._config import BenchmarkError
from ._result import BenchmarkResult
from ._stats import as_samples

__all__ = ["SignificanceTest", "compare_benchmarks", "cohens_d", "effect_label"]

ALPHA = 0.05

#: The smallest relative change of the mean a comparison calls a regression or an
#: improvement (criterion's ``noise_threshold``, 1 %): below it a difference, however
#: significant statistically, is reported as within noise.
NOISE_THRESHOLD = 0.01

#: The variation sources drawn from ``variation_seed``.
SEEDED_SOURCES = ("dram_refresh", "arbitration_jitter")


def effect_label(d: float) -> str:
    """The seed's labels on ``|d|``: large above 0.8, medium above 0.5, else small."""
    a = abs(d)
    return "large" if a > 0.8 else "medium" if a > 0.5 else "small"


def cohens_d(baseline: np.ndarray, result: np.ndarray) -> float:
    """``(mean(baseline) - mean(result)) / s_pooled`` with
    ``s_pooled = sqrt(((n1 - 1) s1^2 + (n2 - 1) s2^2) / (n1 + n2 - 2))`` (sample variances):
    positive when the result is faster. Both samples without spread: 0 when the means
    are equal, else +-inf."""
    n1, n2 = baseline.size, result.size
    if np.ptp(baseline) == 0 and np.ptp(result) == 0:
        diff = float(baseline[0] - result[0])
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    pooled = math.sqrt(
        ((n1 - 1) * baseline.var(ddof=1) + (n2 - 1) * result.var(ddof=1)) / (n1 + n2 - 2)
    )
    return float(baseline.mean() - result.mean()) / pooled


@dataclass(frozen=True)
class SignificanceTest:
    """A result against its baseline.

    ``speedup`` = baseline mean / result mean (above 1: the result is faster), with a
    percentile bootstrap confidence interval ``[speedup_ci_low, speedup_ci_high]`` at
    ``confidence``. ``p_value``: Welch's t-test (``scipy.stats.ttest_ind``,
    ``equal_var=False``), two-sided; ``is_significant`` when ``p_value < alpha``.
    ``effect_size``: Cohen's d (:func:`cohens_d`), ``effect_label`` the seed's label
    of its magnitude (against the samples' within-run spread, so a tiny difference of
    nearly constant samples can be "large"). ``change`` = result mean / baseline mean
    - 1 (positive: slower); ``within_noise`` when ``|change| <= noise_threshold``
    (:data:`NOISE_THRESHOLD`, criterion's 1 %). ``is_regression``: significant, slower
    and not within noise; ``is_improvement`` the same, faster.
    """

    speedup: float
    p_value: float
    is_significant: bool
    alpha: float
    t_statistic: float
    speedup_ci_low: float
    speedup_ci_high: float
    confidence: float
    effect_size: float
    effect_label: str
    baseline_mean_ms: float
    result_mean_ms: float
    notes: tuple[str, ...] = ()
    noise_threshold: float = NOISE_THRESHOLD

    @property
    def change(self) -> float:
        """Relative change of the mean time (positive: the result is slower)."""
        return self.result_mean_ms / self.baseline_mean_ms - 1.0

    @property
    def within_noise(self) -> bool:
        return abs(self.change) <= self.noise_threshold

    @property
    def is_regression(self) -> bool:
        return self.is_significant and self.speedup < 1.0 and not self.within_noise

    @property
    def is_improvement(self) -> bool:
        return self.is_significant and self.speedup > 1.0 and not self.within_noise

    def format_text(self) -> str:
        """The seed's comparison lines, plus the speedup's confidence interval."""
        lines = [
            "Comparison to baseline:",
            f"  Speedup: {self.speedup:.2f}x ({100 * self.confidence:g}% CI "
            f"{self.speedup_ci_low:.2f}x-{self.speedup_ci_high:.2f}x)",
            f"  Statistical significance: {'YES' if self.is_significant else 'NO'} "
            f"(p={self.p_value:.4f})",
            f"  Effect size (Cohen's d): {self.effect_size:.2f} ({self.effect_label})",
            f"  Change: {100 * self.change:+.2f}% of the baseline mean ("
            + (
                f"within the {100 * self.noise_threshold:g}% noise threshold: neither a "
                "regression nor an improvement)"
                if self.within_noise
                else (
                    "regression)"
                    if self.is_regression
                    else "improvement)"
                    if self.is_improvement
                    else "not statistically significant)"
                )
            ),
        ]
        lines.extend(f"  {n}" for n in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["notes"] = list(self.notes)
        d["is_regression"] = self.is_regression
        d["is_improvement"] = self.is_improvement
        d["change"] = self.change
        d["within_noise"] = self.within_noise
        return d


def _samples(x: BenchmarkResult | Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = as_samples(x.samples_ms if isinstance(x, BenchmarkResult) else x, what)
    if arr.size < 2:
        raise BenchmarkError(f"{what} has {arr.size} sample; a t-test needs at least 2")
    if np.any(arr <= 0):  # a speedup or a relative change divides by the times
        raise BenchmarkError(f"{what} holds a time of {arr[arr <= 0][0]!r} ms: times are positive")
    return arr


def compare_benchmarks(
    baseline: BenchmarkResult | Sequence[float],
    result: BenchmarkResult | Sequence[float],
    *,
    alpha: float = ALPHA,
    confidence: float = 0.95,
    bootstrap_samples: int = 10_000,
    seed: int = 0,
    noise_threshold: float = NOISE_THRESHOLD,
) -> SignificanceTest:
    """Compare ``result`` with ``baseline``: two :class:`BenchmarkResult` (their samples
    after outlier removal) or two samples of times in ms. ``alpha`` (0.05) is the
    significance level; ``bootstrap_samples`` resamplings of both samples under
    ``seed`` give the speedup's interval. ``noise_threshold`` (0.01) is the smallest
    relative change of the mean called a regression or an improvement.

    Samples without spread (the emulator is deterministic unless a variation source
    varies): the t-test is undefined, so ``p_value`` is 1 when the means are equal and 0
    when they differ (a difference is then certain). Needs scipy (the ``stats`` extra).
    Two results whose variation sources or (for the seeded sources) variation seeds
    differ get a note: each HBM channel's refresh phase is drawn once per run, so the
    run-to-run variation between them is not in either within-run spread.
    Raises :class:`BenchmarkError` on an empty sample, one of fewer than 2 samples, a
    time at or below 0,
    ``alpha``/``confidence`` outside (0, 1), or ``noise_threshold`` outside [0, 1).
    """
    for name, v in (("alpha", alpha), ("confidence", confidence)):
        if not 0 < v < 1:
            raise BenchmarkError(f"compare_benchmarks: {name} must be in (0, 1), got {v!r}")
    nt = noise_threshold
    if isinstance(nt, bool) or not isinstance(nt, (int, float)) or not 0 <= nt < 1:
        raise BenchmarkError(
            f"compare_benchmarks: noise_threshold must be in [0, 1), got {noise_threshold!r}"
        )
    if (
        isinstance(bootstrap_samples, bool)
        or not isinstance(bootstrap_samples, int)
        or bootstrap_samples < 1
    ):
        raise BenchmarkError(
            "compare_benchmarks: bootstrap_samples must be a positive "
            f"integer, got {bootstrap_samples!r}"
        )
    a = _samples(baseline, "the baseline sample")
    b = _samples(result, "the result sample")
    try:
        from scipy import stats
    except ImportError:
        raise BenchmarkError(
            "compare_benchmarks needs scipy: pip install 'wia-hw[stats]'"
        ) from None
    notes = []
    if isinstance(baseline, BenchmarkResult) and isinstance(result, BenchmarkResult):
        if baseline.spec_hash != result.spec_hash:
            raise BenchmarkError(
                f"the baseline was measured on {baseline.device!r} (spec "
                f"{baseline.spec_hash}), the result on {result.device!r} "
                f"(spec {result.spec_hash})"
            )
        if baseline.tool_version != result.tool_version:
            notes.append(
                f"note: baseline from wia-hw {baseline.tool_version}, result from "
                f"{result.tool_version}"
            )
        note = _variation_note(baseline, result)
        if note:
            notes.append(note)
    ma = float(a[0]) if np.ptp(a) == 0 else float(a.mean())
    mb = float(b[0]) if np.ptp(b) == 0 else float(b.mean())
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        t, p = (0.0, 1.0) if ma == mb else (math.copysign(math.inf, ma - mb), 0.0)
    else:
        t, p = _welch(a, b, stats)
    rng = np.random.default_rng(seed)
    boot_a = a[rng.integers(0, a.size, size=(bootstrap_samples, a.size))].mean(axis=1)
    boot_b = b[rng.integers(0, b.size, size=(bootstrap_samples, b.size))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(boot_a / boot_b, [tail, 100 - tail])
    d = cohens_d(a, b)
    return SignificanceTest(
        speedup=ma / mb,
        p_value=p,
        is_significant=p < alpha,
        alpha=alpha,
        t_statistic=t,
        speedup_ci_low=float(lo),
        speedup_ci_high=float(hi),
        confidence=confidence,
        effect_size=d,
        effect_label=effect_label(d),
        baseline_mean_ms=ma,
        result_mean_ms=mb,
        notes=tuple(notes),
        noise_threshold=float(noise_threshold),
    )


def _welch(a: np.ndarray, b: np.ndarray, stats: Any) -> tuple[float, float]:
    """Welch's t statistic and two-sided p-value, as ``scipy.stats.ttest_ind(a, b,
    equal_var=False)`` computes them, with the variances taken about each sample's
    mean (two passes) so nearly constant samples lose no precision and raise no
    warning; one sample without spread is allowed (its variance is 0)."""
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se2 = va + vb
    t = (a.mean() - b.mean()) / math.sqrt(se2)
    df = se2**2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return float(t), float(min(1.0, 2 * stats.t.sf(abs(t), df)))


def _variation_note(baseline: BenchmarkResult, result: BenchmarkResult) -> str:
    """A note when the two results ran under different variation configs ("" if not)."""

    def desc(r: BenchmarkResult) -> tuple[tuple[str, ...], int | None]:
        src = tuple(r.config.variation_sources)
        seeded = any(x in SEEDED_SOURCES for x in src)
        return src, r.config.variation_seed if seeded else None

    a, b = desc(baseline), desc(result)
    if a == b:
        return ""

    def text(d: tuple[tuple[str, ...], int | None]) -> str:
        src = ",".join(d[0]) or "none"
        return src + (f" (seed {d[1]})" if d[1] is not None else "")

    return (
        f"note: the baseline ran with variation {text(a)}, the result with {text(b)}; "
        "each HBM channel's refresh phase and jitter stream are drawn once per run, so "
        "the difference between such runs is not in either run's spread and the t-test "
        "can call it significant"
    )
