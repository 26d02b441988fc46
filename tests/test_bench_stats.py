"""wia_hw.bench statistics: config validation, outlier removal (Tukey's fences, MAD),
the summary, and compare_benchmarks against scipy and the textbook formulas."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from wia_hw.bench import (
    BenchmarkConfig,
    BenchmarkError,
    EnvironmentalMonitoring,
    OutlierMethod,
    cohens_d,
    compare_benchmarks,
    effect_label,
    outlier_mask,
)
from wia_hw.bench._result import EnvironmentalData, summarize


def _summary(samples, cfg=None, env=None):
    return summarize(
        list(samples),
        cfg or BenchmarkConfig(),
        name="x",
        kind="wall",
        device="host",
        spec_hash="0",
        tool_version="0",
        env=env or EnvironmentalData(),
    )


# -- config --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"measurement_iterations": 0}, r"measurement_iterations must be at least 1, got 0"),
        ({"warmup_iterations": -1}, r"warmup_iterations must be at least 0, got -1"),
        ({"cooldown_iterations": 1.5}, r"cooldown_iterations must be an integer, got 1.5"),
        ({"measurement_iterations": True}, r"measurement_iterations must be an integer"),
        (
            {"report_percentiles": (50, 100.5)},
            r"report_percentiles must be in \[0, 100\], got 100.5",
        ),
        ({"report_percentiles": ("a",)}, r"report_percentiles must be numbers"),
        ({"outlier_detection": "grubbs"}, r"outlier_detection must be one of none, iqr, mad"),
        ({"outlier_threshold": 0}, r"outlier_threshold must be a positive number, got 0"),
        ({"min_sample_time_ms": float("nan")}, r"min_sample_time_ms must be a positive number"),
        (
            {"variation_sources": ("cosmic",)},
            r"unknown source 'cosmic'; modelled: thermal, dram_refresh, arbitration_jitter",
        ),
        (
            {"refresh_interval_ns": 3900, "refresh_cycle_ns": 4000},
            r"refresh_cycle_ns must be below refresh_interval_ns \(3900\)",
        ),
        (
            {"refresh_cycle_ns": 300},
            r"refresh_interval_ns and refresh_cycle_ns are set together",
        ),
        (
            {"arbitration_jitter_cycles": -2},
            r"arbitration_jitter_cycles must be at least 0, got -2",
        ),
        (
            {"environmental_monitoring": {"track_power": True}},
            r"environmental_monitoring must be an EnvironmentalMonitoring, got dict",
        ),
    ],
)
def test_config_errors_are_one_line(kw, match):
    with pytest.raises(BenchmarkError, match=match) as e:
        BenchmarkConfig(**kw)
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


def test_config_has_the_seeds_defaults():
    c = BenchmarkConfig()
    assert (c.warmup_iterations, c.measurement_iterations, c.cooldown_iterations) == (10, 100, 5)
    assert c.report_percentiles == (50, 90, 95, 99, 99.9)
    assert c.outlier_detection is OutlierMethod.IQR and c.outlier_threshold == 1.5
    assert c.environmental_monitoring == EnvironmentalMonitoring(
        track_temperature=True, track_power=True, track_frequency=True
    )
    assert BenchmarkConfig(outlier_detection="MAD").outlier_detection is OutlierMethod.MAD


# -- outliers ------------------------------------------------------------------------
def _quantile_by_hand(xs, q):
    """Linear interpolation between order statistics (Hyndman-Fan type 7)."""
    s = sorted(xs)
    h = (len(s) - 1) * q
    lo = math.floor(h)
    return s[lo] + (h - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo])


@pytest.mark.parametrize("seed", range(5))
def test_iqr_removal_matches_tukeys_fences(seed):
    rng = np.random.default_rng(seed)
    xs = list(rng.normal(10.0, 0.5, 80)) + list(rng.uniform(13, 20, 4)) + [1.0]
    k = [1.5, 1.5, 3.0, 0.5, 1.0][seed]
    q1, q3 = _quantile_by_hand(xs, 0.25), _quantile_by_hand(xs, 0.75)
    lo, hi = q1 - k * (q3 - q1), q3 + k * (q3 - q1)
    kept = [x for x in xs if lo <= x <= hi]
    r = _summary(xs, BenchmarkConfig(outlier_threshold=k))
    assert r.num_outliers == len(xs) - len(kept) > 0
    assert list(r.samples_ms) == kept
    assert list(r.raw_samples_ms) == xs
    assert r.mean_ms == pytest.approx(statistics.fmean(kept), rel=1e-12)
    assert r.std_dev_ms == pytest.approx(statistics.stdev(kept), rel=1e-12)


def test_mad_removal_is_the_modified_z_score():
    rng = np.random.default_rng(7)
    xs = np.concatenate([rng.normal(5.0, 0.2, 60), [9.0, 0.5]])
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    want = [0.6745 * abs(x - med) / mad > 3.5 for x in xs]
    assert list(outlier_mask(xs, OutlierMethod.MAD, 3.5)) == want
    assert sum(want) >= 2
    assert not outlier_mask(xs, OutlierMethod.NONE, 1.5).any()


def test_summary_fields_follow_their_definitions():
    rng = np.random.default_rng(3)
    xs = list(rng.gamma(4.0, 0.25, 200))
    r = _summary(xs, BenchmarkConfig(outlier_detection="none", report_percentiles=(10, 99.9)))
    assert r.num_measurements == 200 and r.num_outliers == 0
    assert r.median_ms == statistics.median(xs)
    assert (r.min_ms, r.max_ms) == (min(xs), max(xs))
    for p, name in (
        (50, "p50_ms"),
        (90, "p90_ms"),
        (95, "p95_ms"),
        (99, "p99_ms"),
        (99.9, "p999_ms"),
    ):
        assert getattr(r, name) == pytest.approx(_quantile_by_hand(xs, p / 100), rel=1e-12)
    assert list(r.percentiles_ms) == [10.0, 99.9]
    assert r.percentiles_ms[10.0] == pytest.approx(_quantile_by_hand(xs, 0.1), rel=1e-12)
    assert r.cv_percent == pytest.approx(100 * statistics.stdev(xs) / statistics.fmean(xs))
    assert r.throughput == pytest.approx(1000 / statistics.fmean(xs))


def test_identical_samples_have_exactly_zero_spread():
    r = _summary([0.1 + 0.2] * 50)
    assert (r.std_dev_ms, r.cv_percent, r.mean_ms) == (0.0, 0.0, 0.1 + 0.2)


def test_format_text_prints_the_seeds_lines_and_temperature_warning():
    r = _summary([1.0, 2.0, 3.0], env=EnvironmentalData(temperature_variation=6.25))
    lines = r.format_text().splitlines()
    assert lines[0] == "Benchmark Results (3 measurements):"
    assert "  Mean: 2.000 ms (±1.000 ms)" in lines
    for text in (
        "  Median: 2.000 ms",
        "  Min: 1.000 ms",
        "  Max: 3.000 ms",
        "  P50: 2.000 ms",
        "  P90: 2.800 ms",
        "  P99.9: 2.998 ms",
        "  Coefficient of variation: 50.0%",
        "  Throughput: 500.0 ops/sec",
        "  Outliers removed: 0",
        "  WARNING: Temperature varied by 6.2°C during measurement",
        "  Results may not be representative",
    ):
        assert text in lines
    assert r.environmental_data.temperature_varied == 6.25
    calm = _summary([1.0, 1.0, 1.0], env=EnvironmentalData(temperature_variation=5.0))
    assert "WARNING" not in calm.format_text()


def test_unstable_results_carry_a_warning():
    r = _summary([1.0, 1.3, 1.0, 1.3], BenchmarkConfig(unstable_cv_percent=10))
    assert r.cv_percent > 10
    assert any("unstable results: coefficient of variation" in w for w in r.warnings)
    assert not _summary([1.0, 1.01, 1.0]).warnings


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ([], r"the measured samples is empty"),
        ([1.0, float("inf")], r"non-finite value"),
    ],
)
def test_bad_samples_are_one_line_errors(values, match):
    with pytest.raises(BenchmarkError, match=match):
        _summary(values)


# -- comparison ----------------------------------------------------------------------
def _welch_by_hand(a, b):
    m1, m2 = statistics.fmean(a), statistics.fmean(b)
    v1, v2 = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (m1 - m2) / math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1**2 / (len(a) - 1) + v2**2 / (len(b) - 1))
    return t, 2 * stats.t.sf(abs(t), df)


@pytest.mark.parametrize("seed", range(4))
def test_welch_and_cohens_d_equal_scipy_and_the_textbook(seed):
    rng = np.random.default_rng(100 + seed)
    n1, n2 = 40 + 7 * seed, 55 - 3 * seed
    a = rng.normal(10.0, 1.0, n1)
    b = rng.normal(10.0 - 0.3 * seed, 1.0 + 0.2 * seed, n2)
    test = compare_benchmarks(list(a), list(b))
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert test.p_value == pytest.approx(ref.pvalue, rel=1e-12)
    t, p = _welch_by_hand(list(a), list(b))
    assert test.t_statistic == pytest.approx(t, rel=1e-9)
    assert test.p_value == pytest.approx(p, rel=1e-9)
    s_pooled = math.sqrt(
        ((n1 - 1) * statistics.variance(a) + (n2 - 1) * statistics.variance(b)) / (n1 + n2 - 2)
    )
    d = (statistics.fmean(a) - statistics.fmean(b)) / s_pooled
    assert test.effect_size == pytest.approx(d, rel=1e-9)
    assert test.effect_label == effect_label(d)
    assert test.speedup == pytest.approx(statistics.fmean(a) / statistics.fmean(b), rel=1e-12)
    assert test.is_significant == (ref.pvalue < 0.05)
    assert test.speedup_ci_low <= test.speedup <= test.speedup_ci_high


def test_a_known_difference_is_significant_and_its_interval_covers_it():
    rng = np.random.default_rng(5)
    base = rng.normal(10.0, 0.5, 100)
    faster = rng.normal(8.0, 0.5, 100)  # true speedup 1.25
    t = compare_benchmarks(base, faster)
    assert t.is_significant and t.p_value < 1e-10 and not t.is_regression
    assert t.effect_label == "large" and t.effect_size > 3
    assert t.speedup_ci_low < t.speedup < t.speedup_ci_high
    assert t.speedup_ci_high - t.speedup_ci_low < 0.05
    slower = compare_benchmarks(faster, base)
    assert slower.is_regression and slower.effect_size < -3 and slower.effect_label == "large"


def test_bootstrap_interval_covers_the_true_speedup_about_95_percent_of_the_time():
    # 300 replications of n = 40 vs 40 with a true speedup of 10 / 8 = 1.25: the binomial
    # 99.9 % band around 0.95 coverage is about [0.91, 0.98] (the percentile bootstrap
    # runs a little under its nominal level at small n)
    rng = np.random.default_rng(11)
    hits = 0
    for rep in range(300):
        t = compare_benchmarks(
            rng.normal(10.0, 1.0, 40), rng.normal(8.0, 1.0, 40), bootstrap_samples=1000, seed=rep
        )
        hits += t.speedup_ci_low <= 1.25 <= t.speedup_ci_high
    assert 0.89 <= hits / 300 <= 0.985


def test_bootstrap_is_seeded():
    rng = np.random.default_rng(1)
    a, b = rng.normal(5, 1, 30), rng.normal(5.2, 1, 30)
    one, two = compare_benchmarks(a, b, seed=3), compare_benchmarks(a, b, seed=3)
    other = compare_benchmarks(a, b, seed=4)
    assert (one.speedup_ci_low, one.speedup_ci_high) == (two.speedup_ci_low, two.speedup_ci_high)
    assert (one.speedup_ci_low, one.speedup_ci_high) != (
        other.speedup_ci_low,
        other.speedup_ci_high,
    )


def test_seed_labels():
    assert [effect_label(d) for d in (0.81, 0.8, 0.51, 0.5, 0.0, -0.9, -0.6)] == [
        "large",
        "medium",
        "medium",
        "small",
        "small",
        "large",
        "medium",
    ]


def test_deterministic_samples_compare_exactly():
    same = compare_benchmarks([2.0] * 5, [2.0] * 7)
    assert (same.p_value, same.is_significant, same.effect_size, same.speedup) == (
        1.0,
        False,
        0.0,
        1.0,
    )
    worse = compare_benchmarks([2.0] * 5, [2.5] * 5)
    assert worse.p_value == 0.0 and worse.is_regression and worse.effect_size == -math.inf
    assert worse.speedup == 0.8 and worse.speedup_ci_low == worse.speedup_ci_high == 0.8
    assert cohens_d(np.array([1.0, 1.0]), np.array([1.0, 1.0])) == 0.0


@pytest.mark.parametrize(
    ("a", "b", "kw", "match"),
    [
        ([], [1.0, 2.0], {}, r"the baseline sample is empty"),
        ([1.0, 2.0], [], {}, r"the result sample is empty"),
        ([1.0], [1.0, 2.0], {}, r"the baseline sample has 1 sample; a t-test needs at least 2"),
        ([1.0, 2.0], [1.0, 2.0], {"alpha": 1.5}, r"alpha must be in \(0, 1\), got 1.5"),
        ([1.0, 2.0], [1.0, 2.0], {"confidence": 0}, r"confidence must be in \(0, 1\), got 0"),
        ([1.0, 2.0], [1.0, 2.0], {"bootstrap_samples": 0}, r"bootstrap_samples must be a positive"),
    ],
)
def test_compare_errors_are_one_line(a, b, kw, match):
    with pytest.raises(BenchmarkError, match=match):
        compare_benchmarks(a, b, **kw)


def test_format_text_prints_the_seeds_comparison_lines():
    rng = np.random.default_rng(9)
    t = compare_benchmarks(rng.normal(10, 1, 50), rng.normal(9, 1, 50))
    lines = t.format_text().splitlines()
    assert lines[0] == "Comparison to baseline:"
    assert lines[1].startswith(f"  Speedup: {t.speedup:.2f}x (95% CI ")
    assert lines[2] == f"  Statistical significance: YES (p={t.p_value:.4f})"
    assert lines[3] == f"  Effect size (Cohen's d): {t.effect_size:.2f} ({t.effect_label})"


# -- review: practical threshold, variation notes, degenerate samples -----------------
@pytest.mark.parametrize("seed", range(6))
def test_a_change_within_the_noise_threshold_is_never_a_regression(seed):
    """Nearly constant samples (the within-run spread far below the difference) make a
    tiny change statistically significant; below the 1 % noise threshold it is neither
    a regression nor an improvement, and the text says so. Above it, it is."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 60))
    base = 0.1338 * (1 + rng.normal(0, 1e-5, n))
    delta = float(rng.uniform(-0.009, 0.009))
    small = compare_benchmarks(base, 0.1338 * (1 + delta) * (1 + rng.normal(0, 1e-5, n)))
    assert small.is_significant and small.within_noise
    assert not small.is_regression and not small.is_improvement
    assert abs(small.change - delta) < 1e-4
    assert "within the 1% noise threshold" in small.format_text()
    big = float(rng.uniform(0.011, 0.2)) * (1 if seed % 2 else -1)
    large = compare_benchmarks(base, 0.1338 * (1 + big) * (1 + rng.normal(0, 1e-5, n)))
    assert large.is_regression == (big > 0) and large.is_improvement == (big < 0)
    assert not large.within_noise
    strict = compare_benchmarks(base, base * (1 + abs(delta)), noise_threshold=0.0)
    assert strict.is_regression


def test_noise_threshold_out_of_range_is_one_line():
    with pytest.raises(BenchmarkError, match=r"noise_threshold must be in \[0, 1\), got 1.5"):
        compare_benchmarks([1.0, 2.0], [1.0, 2.0], noise_threshold=1.5)


def test_results_under_different_variation_seeds_get_a_note():
    def res(sources, seed):
        cfg = BenchmarkConfig(variation_sources=sources, variation_seed=seed)
        return summarize(
            [1.0, 1.001, 1.002],
            cfg,
            name="x",
            kind="emulator",
            device="d",
            spec_hash="h",
            tool_version="0",
            env=EnvironmentalData(),
        )

    t = compare_benchmarks(res(("dram_refresh",), 0), res(("dram_refresh",), 1))
    assert any("seed 0" in n and "seed 1" in n for n in t.notes)
    assert "drawn once per run" in t.format_text()
    # the seed only matters to the seeded sources
    assert not compare_benchmarks(res(("thermal",), 0), res(("thermal",), 1)).notes
    t = compare_benchmarks(res(("thermal",), 0), res(("thermal", "dram_refresh"), 0))
    assert t.notes and "thermal,dram_refresh (seed 0)" in t.notes[0]


@pytest.mark.parametrize("seed", range(4))
def test_nearly_constant_samples_compare_without_warnings(seed):
    """A sample without spread against one with a little: no RuntimeWarning, the
    t-test as the textbook computes it."""
    import warnings

    rng = np.random.default_rng(seed)
    n1, n2 = int(rng.integers(2, 20)), int(rng.integers(2, 20))
    a = [1.0] * n1
    b = list(1.0 + rng.uniform(0, 1e-4, n2))
    b[0] = 1.0001
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = compare_benchmarks(a, b)
    ref_t, ref_p = _welch_by_hand(a, b)
    assert t.t_statistic == pytest.approx(ref_t, rel=1e-6)
    assert t.p_value == pytest.approx(ref_p, rel=1e-6)
    assert math.isfinite(t.effect_size)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("method", [OutlierMethod.IQR, OutlierMethod.MAD])
def test_a_sample_mostly_one_value_keeps_its_variation(seed, method):
    """Over three quarters of the samples equal (IQR = MAD = 0): nothing is removed, so the mean
    and spread are those of every sample (IQR removal discarded all the variation and
    reported the slowest value as the mean)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 120))
    top = 0.133883
    others = top - rng.uniform(1e-5, 3e-4, int(rng.integers(1, n // 4 - 1)))
    samples = np.concatenate([others, np.full(n - others.size, top)])
    rng.shuffle(samples)
    assert not outlier_mask(samples, method, 1.5).any()
    r = _summary(samples, BenchmarkConfig(outlier_detection=method))
    assert r.num_outliers == 0 and r.cv_percent > 0
    assert r.mean_ms == pytest.approx(samples.mean(), rel=1e-12) and r.mean_ms < top


def test_one_measurement_has_no_spread_to_print():
    """With one sample the spread is unknown, not zero: no '±0.000 ms', no 'CV 0.0%'."""
    import wia_hw

    cfg = wia_hw.BenchmarkConfig(measurement_iterations=1, warmup_iterations=0)
    r = wia_hw.benchmark_operation(wia_hw.open_device("wia-npu"), "gemm", cfg, M=64, N=64, K=64)
    text = r.format_text()
    assert "±" not in text and "Coefficient of variation: n/a (one measurement)" in text
    cfg = wia_hw.BenchmarkConfig(measurement_iterations=3, warmup_iterations=0)
    r = wia_hw.benchmark_operation(wia_hw.open_device("wia-npu"), "gemm", cfg, M=64, N=64, K=64)
    assert "±" in r.format_text()


@pytest.mark.parametrize("base,res", [([0.0] * 30, [0.1] * 30), ([0.1] * 30, [0.0, -1.0] * 15)])
def test_compare_refuses_a_time_at_or_below_zero(base, res):
    from wia_hw.bench import BenchmarkError, compare_benchmarks

    with pytest.raises(BenchmarkError, match=r"holds a time of .* ms: times are positive"):
        compare_benchmarks(base, res)
