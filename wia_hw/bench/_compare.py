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
    of its magnitude. ``is_regression``: significant and slower.
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

    @property
    def is_regression(self) -> bool:
        return self.is_significant and self.speedup < 1.0

    def format_text(self) -> str:
        """The seed's comparison lines, plus the speedup's confidence interval."""
        lines = [
            "Comparison to baseline:",
            f"  Speedup: {self.speedup:.2f}x ({100 * self.confidence:g}% CI "
            f"{self.speedup_ci_low:.2f}x-{self.speedup_ci_high:.2f}x)",
            f"  Statistical significance: {'YES' if self.is_significant else 'NO'} "
            f"(p={self.p_value:.4f})",
            f"  Effect size (Cohen's d): {self.effect_size:.2f} ({self.effect_label})",
        ]
        lines.extend(f"  {n}" for n in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["notes"] = list(self.notes)
        d["is_regression"] = self.is_regression
        return d


def _samples(x: BenchmarkResult | Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = as_samples(x.samples_ms if isinstance(x, BenchmarkResult) else x, what)
    if arr.size < 2:
        raise BenchmarkError(f"{what} has {arr.size} sample; a t-test needs at least 2")
    return arr


def compare_benchmarks(
    baseline: BenchmarkResult | Sequence[float],
    result: BenchmarkResult | Sequence[float],
    *,
    alpha: float = ALPHA,
    confidence: float = 0.95,
    bootstrap_samples: int = 10_000,
    seed: int = 0,
) -> SignificanceTest:
    """Compare ``result`` with ``baseline``: two :class:`BenchmarkResult` (their samples
    after outlier removal) or two samples of times in ms. ``alpha`` (0.05) is the
    significance level; ``bootstrap_samples`` resamplings of both samples under
    ``seed`` give the speedup's interval.

    Samples without spread (the emulator is deterministic unless a variation source
    varies): the t-test is undefined, so ``p_value`` is 1 when the means are equal and 0
    when they differ (a difference is then certain). Needs scipy (the ``stats`` extra).
    Raises :class:`BenchmarkError` on an empty sample, one of fewer than 2 samples, or
    ``alpha``/``confidence`` outside (0, 1).
    """
    for name, v in (("alpha", alpha), ("confidence", confidence)):
        if not 0 < v < 1:
            raise BenchmarkError(f"compare_benchmarks: {name} must be in (0, 1), got {v!r}")
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
    ma = float(a[0]) if np.ptp(a) == 0 else float(a.mean())
    mb = float(b[0]) if np.ptp(b) == 0 else float(b.mean())
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        t, p = (0.0, 1.0) if ma == mb else (math.copysign(math.inf, ma - mb), 0.0)
    else:
        tt = stats.ttest_ind(a, b, equal_var=False)
        t, p = float(tt.statistic), float(tt.pvalue)
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
    )
