"""The photonic/analog front-end's golden model, timing and optical core model."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from wia_hw.emulator import frontend_model as fm


def ref_round(v: int, shift: int) -> int:
    """round_half_up(v / 2**shift) with exact rationals."""
    return math.floor(Fraction(v, 2**shift) + Fraction(1, 2))


@pytest.mark.parametrize("p", [4, 5, 6, 7, 8])
def test_dac_quantize_exhaustive_8bit(p: int) -> None:
    x = np.arange(-128, 128)
    lo, hi = fm.dac_range(p)
    assert (lo, hi) == (-(2 ** (p - 1) - 1), 2 ** (p - 1) - 1)
    for shift in range(0, 9):
        got = fm.dac_quantize(x, p, shift, in_bits=8)
        ref = [min(max(ref_round(int(v), shift), lo), hi) for v in x]
        assert got.tolist() == ref
    # saturation at both ends for a small shift
    assert fm.dac_quantize(np.array([-128, 127]), p, 0, 8).tolist() == [lo, hi]


@pytest.mark.parametrize("p", [4, 5, 6, 7, 8])
def test_adc_quantize_matches_reference(p: int) -> None:
    d = np.arange(-300, 301)
    lo, hi = fm.adc_range(p)
    assert (lo, hi) == (-(2 ** (p - 1)), 2 ** (p - 1) - 1)
    for shift in range(0, 10):
        got = fm.adc_quantize(d, p, shift)
        assert got.tolist() == [min(max(ref_round(int(v), shift), lo), hi) for v in d]
    assert fm.adc_quantize(np.array([-(2**16), 2**16]), p, 4).tolist() == [lo, hi]


def test_balanced_subtract_and_ranges() -> None:
    assert fm.balanced_subtract([65535, 0, 7], [0, 65535, 7]).tolist() == [65535, -65535, 0]
    with pytest.raises(ValueError, match=r"det_p outside unsigned 12-bit range: \[0, 4096\]"):
        fm.balanced_subtract([0, 4096], [0, 0], det_bits=12)
    with pytest.raises(ValueError, match=r"DAC input outside signed 8-bit range"):
        fm.dac_quantize([128], 8, 0, in_bits=8)
    with pytest.raises(ValueError, match=r"shift must be between 0 and 8, got 9"):
        fm.dac_quantize([1], 8, 9, in_bits=8)
    with pytest.raises(ValueError, match=r"precision_bits must be between 2 and 16, got 1"):
        fm.adc_range(1)


def test_accumulate_tiles_sums_and_wraps() -> None:
    codes = [np.array([127, -128]), np.array([127, -128]), np.array([1, 0])]
    assert fm.accumulate_tiles(codes).tolist() == [255, -256]
    assert fm.accumulate_tiles(codes, acc_bits=8).tolist() == [-1, 0]
    with pytest.raises(ValueError, match="at least one partial tile"):
        fm.accumulate_tiles([])


def test_cycle_functions() -> None:
    assert fm.frontend_tiles(1, 64) == 1
    assert fm.frontend_tiles(65, 64) == 2
    assert fm.frontend_cycles(1) == 1 + fm.ADC_LATENCY_CYCLES - 1 == 3
    assert fm.frontend_cycles(5) == 5 + fm.ADC_LATENCY_CYCLES - 1
    # 2 x 3 tiles: DAC latency + core settle + ADC path for 6 tiles
    assert fm.frontend_matvec_cycles(100, 130, 64) == (
        fm.DAC_LATENCY_CYCLES + 1 + fm.frontend_cycles(2 * 3)
    )
    assert fm.frontend_matvec_cycles(8, 8, 8, core_latency_cycles=4) == 1 + 4 + 3
    with pytest.raises(ValueError, match=r"tiles must be between 1 and"):
        fm.frontend_cycles(0)


# ---- the optical core ------------------------------------------------------------------


def test_core_is_deterministic_per_seed() -> None:
    params = fm.PhotonicParams(matrix_size_limit=8)
    w = np.random.default_rng(0).uniform(-1, 1, (8, 8))
    x = np.random.default_rng(1).uniform(-1, 1, 8)

    def run(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        core = fm.PhotonicCore(params, seed=seed)
        w_eff = core.program(w)
        return (w_eff, *core.detect(x))

    a, b, c = run(3), run(3), run(4)
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    assert not np.array_equal(a[1], c[1])


def test_ideal_core_is_balanced_detection_of_the_product() -> None:
    n = 8
    params = fm.PhotonicParams(matrix_size_limit=n, insertion_loss_db=3.0).ideal
    core = fm.PhotonicCore(params, seed=0)
    rng = np.random.default_rng(2)
    w = rng.uniform(-1, 1, (n, n))
    x = rng.uniform(-1, 1, n)
    assert np.allclose(core.program(w), w)
    p, q = core.detect(x)
    top = 2**16 - 1
    loss = 10 ** (-0.3)
    y = w @ x / n
    assert np.allclose(p, np.round(loss * (1 + y) / 2 * top))
    assert np.allclose(q, np.round(loss * (1 - y) / 2 * top))
    assert np.all(np.abs((p - q) - loss * y * top) <= 1)


def test_phase_error_statistics() -> None:
    """MZI phase error: w_eff = cos(arccos(w) + d), d ~ N(0, sigma); at w = 0 the
    deviation is ~ d itself, so its standard deviation is sigma within 10% (4096 MZIs)."""
    params = fm.PhotonicParams(matrix_size_limit=64, mzi_phase_sigma_rad=0.005)
    w_eff = fm.PhotonicCore(params, seed=9).program(np.zeros((64, 64)))
    assert abs(np.std(w_eff) - 0.005) < 0.0005


def test_detector_noise_matches_shot_and_thermal_formula() -> None:
    """At y = 0 each arm carries I = R P0 L / 2; the sample's standard deviation is
    sqrt(2 q I B + 4 k T B / R_L) / (R P0) * (2**16 - 1), within 5% over 2000 samples."""
    n = 64
    params = fm.PhotonicParams(matrix_size_limit=n, mzi_phase_sigma_rad=0.0)
    core = fm.PhotonicCore(params, seed=1)
    core.program(np.zeros((n, n)))
    samples = np.concatenate([core.detect(np.zeros(n))[0] for _ in range(32)])
    i = 1e-3 * 10 ** (-0.3) / 2
    bw = 10e9
    sigma_a = math.sqrt(2 * 1.602176634e-19 * i * bw + 4 * 1.380649e-23 * 300 * bw / 50)
    expected = sigma_a / 1e-3 * (2**16 - 1)
    assert abs(np.std(samples) / expected - 1) < 0.05


def test_frontend_matvec_tracks_the_exact_product() -> None:
    """With an ideal core the accumulated ADC codes equal the scaled exact product to
    within half an ADC step per partial tile (rounding) plus the DAC/weight rounding."""
    n, rows, k = 8, 10, 20
    config = fm.FrontendConfig(precision_bits=8, matrix_size_limit=n, dac_shift=8, adc_shift=6)
    core = fm.PhotonicCore(fm.PhotonicParams(matrix_size_limit=n).ideal, seed=0)
    rng = np.random.default_rng(4)
    w = rng.uniform(-1, 1, (rows, k))
    x = rng.integers(-20000, 20000, k)
    trace = fm.frontend_matvec(w, x, config, core)
    assert trace.adc_codes.shape == (2 * 3, n) and trace.last.tolist() == [0, 0, 1] * 2
    hi = 127
    codes = trace.dac_codes.reshape(-1)[:k]
    wq = fm.quantize_weights(w, 8)
    scale = 10 ** (-0.3) * (2**16 - 1) / n / 2**6
    exact = (wq @ (codes / hi)) * scale
    assert np.all(np.abs(trace.result - exact) <= 3 * (0.5 + 1 / 2**6) + 1e-9)
    # Default noise: per arm sigma <= sqrt(2 q I_max B + 4 k T B / R_L) (I_max = R P0 L),
    # in detector LSBs; a code is the difference of two arms over 2**adc_shift; three
    # tiles add. Bound: 5 sigma, plus 2 codes for the phase error and rounding.
    noisy = fm.frontend_matvec(
        w, x, config, fm.PhotonicCore(fm.PhotonicParams(matrix_size_limit=n), seed=0)
    )
    sigma_arm = (
        math.sqrt(
            2 * 1.602176634e-19 * 1e-3 * 10 ** (-0.3) * 10e9 + 4 * 1.380649e-23 * 300 * 10e9 / 50
        )
        / 1e-3
        * (2**16 - 1)
    )
    sigma_result = math.sqrt(3) * math.sqrt(2) * sigma_arm / 2**6
    assert 0 < np.abs(noisy.result - trace.result).max() <= 5 * sigma_result + 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"laser_power_mw": 0}, r"laser_power_mw must be a positive number, got 0"),
        ({"insertion_loss_db": -1}, r"insertion_loss_db must be a number >= 0, got -1"),
        ({"matrix_size_limit": 0}, r"matrix_size_limit must be between 1 and 4096, got 0"),
    ],
)
def test_photonic_params_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fm.PhotonicParams(**kwargs)


def test_core_and_config_validation() -> None:
    core = fm.PhotonicCore(fm.PhotonicParams(matrix_size_limit=4))
    with pytest.raises(RuntimeError, match=r"program\(\) a weight tile before detect\(\)"):
        core.detect(np.zeros(4))
    with pytest.raises(ValueError, match=r"weight tile must be at most 4x4, got shape \(5, 4\)"):
        core.program(np.zeros((5, 4)))
    with pytest.raises(ValueError, match=r"weights must be finite and within \[-1, 1\]"):
        core.program(np.full((2, 2), 1.5))
    with pytest.raises(ValueError, match=r"precision_bits \(8\) must not exceed in_bits \(6\)"):
        fm.FrontendConfig(precision_bits=8, in_bits=6, dac_shift=0)
    with pytest.raises(ValueError, match=r"core matrix_size_limit 4 != front-end 8"):
        fm.frontend_matvec(
            np.zeros((2, 2)), np.zeros(2, dtype=int), fm.FrontendConfig(matrix_size_limit=8), core
        )
    with pytest.raises(ValueError, match=r"matvec shapes do not agree"):
        fm.frontend_matvec(
            np.zeros((2, 3)), np.zeros(2, dtype=int), fm.FrontendConfig(matrix_size_limit=4), core
        )
