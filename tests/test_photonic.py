"""Photonic extension: error statistics against their analytic expectations (quantisation
step^2/12, shot noise following the signal), precision, tiling, timing, energy, device."""

from __future__ import annotations

import math

import numpy as np
import pytest
from wia_hw.emulator.frontend_model import frontend_matvec_cycles

import wia_hw
from wia_hw import (
    PhotonicConfig,
    PhotonicDetection,
    PhotonicEncoding,
    PhotonicMatmul,
    PhotonicMode,
    WorkloadError,
    photonic_matmul,
)

Q = 1.602176634e-19
IDEAL = {"shot_noise": False, "thermal_noise": False, "mzi_phase_sigma_rad": 0.0}
PHASE = PhotonicMatmul(
    input_encoding=PhotonicEncoding.PHASE,
    computation_mode=PhotonicMode.COHERENT,
    output_detection=PhotonicDetection.BALANCED,
)


def rel_rms(out, ref):
    return float(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref**2)))


def quantisation_variance(cfg, a, b, shift, passes):
    """Predicted error variance of every output: each quantiser adds step^2/12.

    Weights and inputs are rounded to steps of 1/hi (hi = 2**(p-1) - 1) of their
    row/column maximum; each detector sample is rounded (step 1); the ADC rounds the
    balanced difference to steps of 2**shift; the ADC and detectors act once per pass
    and per tile along K; all referred to C through C = y * n * max|A_i| * max|B_j| and
    the difference's full scale L * (2**det_bits - 1).
    """
    hi = (1 << (cfg.precision_bits - 1)) - 1
    n = cfg.matrix_size_limit
    amax = np.abs(a).max(axis=1, keepdims=True)
    bmax = np.abs(b).max(axis=0, keepdims=True)
    w2 = ((a / amax) ** 2).sum(axis=1, keepdims=True)
    x2 = ((b / bmax) ** 2).sum(axis=0, keepdims=True)
    kt = -(-a.shape[1] // n)
    full = cfg.transmission * ((1 << cfg.det_bits) - 1)
    y_var = (w2 + x2) / (12 * hi**2) / n**2 + kt * passes * (2 / 12 + 4.0**shift / 12) / full**2
    return y_var * (n * amax * bmax) ** 2


@pytest.mark.parametrize(
    ("bits", "mm", "passes"),
    [
        (6, PHASE, 1),
        (8, PHASE, 1),
        (7, PhotonicMatmul(input_encoding="intensity"), 2),
    ],
)
def test_quantisation_error_variance_is_step_squared_over_12(bits, mm, passes):
    rng = np.random.default_rng(bits)
    a = rng.uniform(-1, 1, (96, 150))
    b = rng.uniform(-1, 1, (150, 120))
    cfg = PhotonicConfig(matrix_size_limit=64, precision_bits=bits, **IDEAL)
    res = photonic_matmul(None, cfg, mm, a, b)
    err = res.output - a @ b
    predicted = quantisation_variance(cfg, a, b, res.adc_shift, passes)
    ratio = np.mean(err**2) / np.mean(predicted)
    assert 0.85 < ratio < 1.15, ratio
    assert abs(np.mean(err)) < 3 * math.sqrt(np.mean(predicted) / err.size)  # unbiased


def test_error_falls_as_precision_bits_rise():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((64, 100)), rng.standard_normal((100, 64))
    errs = [
        rel_rms(
            photonic_matmul(
                None, PhotonicConfig(matrix_size_limit=64, precision_bits=p, **IDEAL), PHASE, a, b
            ).output,
            a @ b,
        )
        for p in (4, 6, 8, 10, 12)
    ]
    assert all(x > 2.5 * y for x, y in zip(errs, errs[1:], strict=False)), errs


def _shot_experiment(detection, laser_mw, columns=400):
    """Rows with known ideal outputs y_i in (-1, 1); every column is the same all-ones
    input, so the spread over columns is the noise of each row's detection."""
    s = 32
    h = np.arange(-28, 29, 4)  # y_i = h_i / s
    a = np.zeros((len(h), s))
    for i, hh in enumerate(h):
        a[i, : abs(hh)] = np.sign(hh)
        if hh == 0:
            a[i, 0] = 1e-9  # a zero row, kept non-empty
    b = np.ones((s, columns))
    cfg = PhotonicConfig(
        matrix_size_limit=s,
        precision_bits=16,
        det_bits=32,
        modulation_bandwidth_ghz=100.0,
        laser_power_mw=laser_mw,
        shot_noise=True,
        thermal_noise=False,
        mzi_phase_sigma_rad=0.0,
    )
    mm = PhotonicMatmul(input_encoding="phase", output_detection=detection)
    out = photonic_matmul(None, cfg, mm, a, b, seed=11).output
    y = h / s
    var_y = out.var(axis=1) / s**2 / np.abs(a).max(axis=1) ** 2
    return cfg, y, var_y


def test_single_detector_shot_noise_variance_follows_the_signal():
    cfg, y, var_y = _shot_experiment("single", 2.0)
    # 2*det_p - bias: var = 4 * 2 q I_p B / (R P0 L)^2 with I_p = R P0 L (1 + y) / 2
    expected = (
        4
        * Q
        * cfg.modulation_bandwidth_ghz
        * 1e9
        * (1 + y)
        / (cfg.detector_responsivity_a_per_w * cfg.laser_power_mw * 1e-3 * cfg.transmission)
    )
    ratio = var_y / expected
    assert np.all((ratio > 0.75) & (ratio < 1.3)), ratio
    # proportional to the signal: the brightest row is ~(1+0.875)/(1-0.875) = 15x noisier
    assert var_y[-1] / var_y[0] > 8


def test_balanced_shot_noise_follows_total_power_not_y():
    cfg, y, var_y = _shot_experiment("balanced", 2.0)
    expected = (
        2
        * Q
        * cfg.modulation_bandwidth_ghz
        * 1e9
        / (cfg.detector_responsivity_a_per_w * cfg.laser_power_mw * 1e-3 * cfg.transmission)
    )
    ratio = var_y / expected
    assert np.all((ratio > 0.75) & (ratio < 1.3)), ratio
    # the current's variance is proportional to the optical signal: 4x the laser power,
    # 4x the current variance, so 1/4 of the variance in units of the full scale
    _, _, var_4x = _shot_experiment("balanced", 8.0)
    assert 3.2 < np.mean(var_y) / np.mean(var_4x) < 5.0


def test_noise_and_phase_error_cost_accuracy_and_are_seeded():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 48))
    cfg = PhotonicConfig(matrix_size_limit=64)
    r1 = photonic_matmul(None, cfg, PHASE, a, b, seed=5)
    r2 = photonic_matmul(None, cfg, PHASE, a, b, seed=5)
    r3 = photonic_matmul(None, cfg, PHASE, a, b, seed=6)
    np.testing.assert_array_equal(r1.output, r2.output)
    assert not np.array_equal(r1.output, r3.output)
    ideal = photonic_matmul(None, PhotonicConfig(matrix_size_limit=64, **IDEAL), PHASE, a, b)
    assert rel_rms(r1.output, a @ b) > 2 * rel_rms(ideal.output, a @ b)
    phase_only = photonic_matmul(
        None,
        PhotonicConfig(
            matrix_size_limit=64, shot_noise=False, thermal_noise=False, mzi_phase_sigma_rad=0.05
        ),
        PHASE,
        a,
        b,
    )
    assert rel_rms(phase_only.output, a @ b) > 2 * rel_rms(ideal.output, a @ b)


def test_encodings_modes_and_tiling_compute_the_product():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((70, 130)), rng.standard_normal((130, 40))
    cfg = PhotonicConfig(matrix_size_limit=32, precision_bits=12, **IDEAL)
    for enc, mode in (
        ("intensity", "coherent"),
        ("phase", "coherent"),
        ("intensity", "incoherent"),
    ):
        for det in ("balanced", "single"):
            mm = PhotonicMatmul(input_encoding=enc, computation_mode=mode, output_detection=det)
            res = photonic_matmul(None, cfg, mm, a, b)
            assert rel_rms(res.output, a @ b) < 5e-3, (enc, mode, det)
            assert res.tiles == 3 * 5 and res.passes == mm.input_passes * mm.weight_passes


def test_timing_from_modulation_rate_and_wdm_and_energy_per_mac():
    cfg = PhotonicConfig()  # the seed's 64 ch, 100 GHz, 256, 8 bit
    mm = PhotonicMatmul()  # intensity, coherent, balanced
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((300, 300)), rng.standard_normal((300, 128))
    res = photonic_matmul(None, cfg, mm, a, b)
    symbols = -(-128 // 64) * 2  # two channel groups, x+ and x-
    stream = frontend_matvec_cycles(256, 256 * symbols, 256, cfg.core_latency_cycles)
    assert res.tiles == 4
    assert res.time_ns == pytest.approx(4 * (cfg.reprogram_ns + stream / 100.0))
    wide = photonic_matmul(None, PhotonicConfig(wavelength_channels=128), mm, a, b)
    assert wide.time_ns < res.time_ns
    assert res.macs == 300 * 300 * 128
    assert 0 < res.energy_per_mac_pj == pytest.approx(res.energy_pj / res.macs)
    # lasers burn while tiles are reprogrammed: long streams amortise it towards fJ/MAC
    long = photonic_matmul(None, cfg, mm, a, rng.standard_normal((300, 1 << 16)), functional=False)
    assert long.energy_per_mac_pj < res.energy_per_mac_pj / 20
    assert long.energy_per_mac_pj < 0.2  # ~100 fJ: 34% of each 256 tile is used


def test_on_a_device_and_errors():
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 64))
    ctx = wia_hw.open_device("wia-npu")
    out = np.zeros((64, 64))
    res = photonic_matmul(ctx, PhotonicConfig(matrix_size_limit=64), PHASE, a, b, out)
    np.testing.assert_array_equal(out, res.output)
    assert ctx.device.now >= res.device_cycles >= math.ceil(res.time_ns * ctx.spec.clock_ghz)
    assert ctx.device.counters.macs == 64**3
    assert "photonic" in ctx.extensions
    with pytest.raises(WorkloadError, match=r"A \[64, 64\] x B \[63, 64\]: inner"):
        photonic_matmul(None, PhotonicConfig(), PHASE, a, b[:63])
    with pytest.raises(ValueError, match=r"phase encoding needs coherent computation"):
        PhotonicMatmul(input_encoding="phase", computation_mode="incoherent")
    with pytest.raises(ValueError, match=r"precision_bits must be an integer in 2..16"):
        PhotonicConfig(precision_bits=20)
    with pytest.raises(ValueError, match=r"output_detection must be one of balanced, single"):
        PhotonicMatmul(output_detection="triple")
