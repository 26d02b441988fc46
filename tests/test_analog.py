"""Analog (hybrid digital-analog) extension: error statistics against analytic
expectations (quantisation step^2/12, PCM read noise), precision, drift and its
compensation, repeated reads, timing, energy and the device."""

from __future__ import annotations

import math

import numpy as np
import pytest
from wia_hw.extensions.analog import CURRENT_RESOLUTION, analog_read_ns, analog_timing_ns

import wia_hw
from wia_hw import AnalogConfig, WorkloadError, hybrid_matmul

QUIET = {
    "programming_noise": False,
    "read_noise": False,
    "drift": False,
    "noise_compensation": False,
    "output_noise": 0.0,
}


def rel_rms(out, ref):
    return float(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref**2)))


def data(seed, m=48, k=300, n=80):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))


@pytest.mark.parametrize(("analog", "digital"), [(4, 8), (6, 8), (8, 10)])
def test_quantisation_error_variance_is_step_squared_over_12(analog, digital):
    a, b = data(analog)
    cfg = AnalogConfig(
        analog_precision_bits=analog, digital_precision_bits=digital, tile_size=128, **QUIET
    )
    res = hybrid_matmul(None, cfg, a, b)
    dhi = (1 << (analog - 1)) - 1
    whi = (1 << (digital - 1)) - 1
    s = digital - analog
    apeak = np.abs(a).max(axis=1, keepdims=True)
    bpeak = np.abs(b).max(axis=0, keepdims=True)
    x2 = ((a / apeak) ** 2).sum(axis=1, keepdims=True)  # [m, 1]
    w2 = ((b / bpeak) ** 2).sum(axis=0, keepdims=True)  # [1, n]
    adc = np.array([(4.0 ** res.adc_shifts[j // 128]).sum() for j in range(b.shape[1])])
    y_var = (
        (1 / (12 * dhi**2) + 1 / (12 * (dhi << s) ** 2)) * w2
        + x2 / (12 * whi**2)
        + adc[None, :] / (12 * CURRENT_RESOLUTION**2)
    )
    predicted = y_var * (apeak * bpeak) ** 2
    err = res.output - a @ b
    ratio = np.mean(err**2) / np.mean(predicted)
    assert 0.85 < ratio < 1.15, ratio


def test_error_falls_as_precision_bits_rise():
    a, b = data(1)
    ref = a @ b
    by_analog = [
        rel_rms(
            hybrid_matmul(
                None,
                AnalogConfig(analog_precision_bits=p, digital_precision_bits=max(p, 12), **QUIET),
                a,
                b,
            ).output,
            ref,
        )
        for p in (3, 4, 6, 8, 10)
    ]
    assert all(x > 1.8 * y for x, y in zip(by_analog, by_analog[1:], strict=False)), by_analog
    by_digital = [
        rel_rms(
            hybrid_matmul(
                None, AnalogConfig(analog_precision_bits=4, digital_precision_bits=p, **QUIET), a, b
            ).output,
            ref,
        )
        for p in (4, 5, 6, 8)
    ]
    assert all(x > y for x, y in zip(by_digital, by_digital[1:], strict=False)), by_digital


def _read_noise_only(reads, comp):
    return AnalogConfig(
        analog_precision_bits=14,
        digital_precision_bits=16,
        programming_noise=False,
        drift=False,
        read_noise=True,
        output_noise=0.0,
        noise_compensation=comp,
        repeated_reads=reads,
        tile_size=128,
        t_inference_s=3600.0,
    )


def test_read_noise_variance_matches_the_pcm_model_and_averages_down():
    a, b = data(2, m=64, k=128, n=96)
    cfg = _read_noise_only(1, False)
    res = hybrid_matmul(None, cfg, a, b, seed=3)
    xs = a / np.abs(a).max(axis=1, keepdims=True)
    w = np.rint(b / np.abs(b).max(axis=0, keepdims=True) * 32767) / 32767
    g_rel = np.abs(w)
    qs = np.minimum(0.0088 / np.maximum(g_rel, 1e-3) ** 0.65, 0.2)
    t = cfg.t_inference_s + cfg.t0_s
    spread = math.log((t + cfg.t_read_s) / (2 * cfg.t_read_s))
    var_w = (g_rel * qs) ** 2 * spread  # per weight, one read
    y_var = (xs**2) @ var_w
    predicted = (
        y_var * (np.abs(a).max(axis=1, keepdims=True) * np.abs(b).max(axis=0, keepdims=True)) ** 2
    )
    err = res.output - a @ b
    ratio = np.mean(err**2) / np.mean(predicted)
    assert 0.85 < ratio < 1.15, ratio
    four = hybrid_matmul(None, _read_noise_only(4, True), a, b, seed=3)
    r = np.mean(err**2) / np.mean((four.output - a @ b) ** 2)
    assert 3.2 < r < 5.0, r  # variance / 4
    # at about 4x the time: 4x the reads, one pipeline fill
    assert 3.9 * res.time_ns < four.time_ns < 4 * res.time_ns


def test_drift_biases_low_and_global_drift_compensation_removes_it():
    a, b = data(4)
    ref = a @ b
    kw = {
        "programming_noise": False,
        "read_noise": False,
        "drift": True,
        "output_noise": 0.0,
        "analog_precision_bits": 10,
        "digital_precision_bits": 12,
        "t_inference_s": 86400.0,
    }
    raw = hybrid_matmul(None, AnalogConfig(noise_compensation=False, **kw), a, b, seed=1)
    gain = float((raw.output * ref).sum() / (ref**2).sum())
    nu = 0.06  # about the mean drift exponent of the cells
    assert 0.6 < gain < 0.85 and gain == pytest.approx(((86400 + 20) / 20) ** -nu, rel=0.1)
    comp = hybrid_matmul(
        None, AnalogConfig(noise_compensation=True, repeated_reads=1, **kw), a, b, seed=1
    )
    gain_c = float((comp.output * ref).sum() / (ref**2).sum())
    assert abs(gain_c - 1) < 0.03
    assert rel_rms(comp.output, ref) < rel_rms(raw.output, ref) / 3
    assert np.all(comp.drift_alpha > 1.2)


def test_compensation_lowers_error_with_every_noise_source_on():
    a, b = data(5)
    ref = a @ b
    errs = {
        comp: np.mean(
            [
                rel_rms(
                    hybrid_matmul(None, AnalogConfig(noise_compensation=comp), a, b, seed=s).output,
                    ref,
                )
                for s in range(3)
            ]
        )
        for comp in (False, True)
    }
    assert errs[True] < 0.6 * errs[False], errs
    # the seed's 6/8-bit hybrid with compensation is accurate to about 10 per cent
    assert errs[True] < 0.15


def test_deterministic_per_seed():
    a, b = data(6, m=8, k=64, n=8)
    r1 = hybrid_matmul(None, AnalogConfig(), a, b, seed=9)
    r2 = hybrid_matmul(None, AnalogConfig(), a, b, seed=9)
    r3 = hybrid_matmul(None, AnalogConfig(), a, b, seed=10)
    np.testing.assert_array_equal(r1.output, r2.output)
    assert not np.array_equal(r1.output, r3.output)


def test_timing_energy_and_the_device():
    cfg = AnalogConfig(analog_precision_bits=6, digital_precision_bits=8, noise_compensation=True)
    a, b = data(7, m=32, k=600, n=300)
    ctx = wia_hw.open_device("wia-npu")
    out = np.zeros((32, 300))
    res = hybrid_matmul(ctx, cfg, a, b, out)
    np.testing.assert_array_equal(out, res.output)
    assert res.tiles == 3 * 2
    # 6-bit PWM inputs (31 LSBs of 0.5 ns) + settling; 256 CCO ADCs at 64 x 0.3 ns each
    t_in, t_adc = 31 * 0.5 + 5.0, 64 * 0.3
    assert analog_read_ns(cfg) == pytest.approx((t_in, t_adc))
    reads = 32 * cfg.repeated_reads
    assert res.time_ns == pytest.approx(t_in + t_adc + (reads - 1) * max(t_in, t_adc))
    assert res.energy_per_mac_pj == pytest.approx(res.energy_pj / res.macs) and res.energy_pj > 0
    assert ctx.device.counters.macs == 32 * 600 * 300
    assert ctx.device.now >= res.device_cycles >= math.ceil(res.time_ns * ctx.spec.clock_ghz)
    # more weight tiles than crossbars: tiles are reprogrammed in rounds
    t, tiles = analog_timing_ns(
        AnalogConfig(analog_precision_bits=6, crossbars=2, noise_compensation=False), 32, 600, 300
    )
    assert tiles == 6
    assert t == pytest.approx(3 * (t_in + t_adc + 31 * max(t_in, t_adc)) + 2 * 1000.0 * 1e3)


def test_timing_model_follows_its_parameters():
    """Bits cost time exponentially; ADCs, crossbars and faster converters never cost any;
    a conversion-bound periphery is limited by its ADCs."""
    base = AnalogConfig(noise_compensation=False)
    t0, _ = analog_timing_ns(base, 64, 512, 512)
    for bits in range(3, 9):
        lo = analog_timing_ns(
            AnalogConfig(analog_precision_bits=bits, noise_compensation=False), 64, 512, 512
        )[0]
        hi = analog_timing_ns(
            AnalogConfig(
                analog_precision_bits=bits + 1,
                digital_precision_bits=max(8, bits + 1),
                noise_compensation=False,
            ),
            64,
            512,
            512,
        )[0]
        assert hi > lo
    for field_, better in (
        ("adcs_per_tile", 512),
        ("crossbars", 128),
        ("adc_lsb_ns", 0.1),
        ("dac_lsb_ns", 0.1),
        ("settle_ns", 0.0),
    ):
        t1, _ = analog_timing_ns(
            AnalogConfig(noise_compensation=False, **{field_: better}), 64, 512, 512
        )
        assert t1 <= t0, field_
    # 8 ADCs for 256 columns: 32 conversions per read dominate the stream
    few = AnalogConfig(analog_precision_bits=6, adcs_per_tile=8, noise_compensation=False)
    t_in, t_adc = analog_read_ns(few)
    assert t_adc == pytest.approx(32 * 64 * 0.3) and t_adc > t_in
    t, _ = analog_timing_ns(few, 100, 256, 256)
    assert t == pytest.approx(t_in + t_adc + 99 * t_adc)
    with pytest.raises(ValueError, match=r"AnalogConfig.adcs_per_tile must be an integer"):
        AnalogConfig(adcs_per_tile=0)
    with pytest.raises(ValueError, match=r"AnalogConfig.adc_lsb_ns must be a positive"):
        AnalogConfig(adc_lsb_ns=0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"analog_precision_bits": 8, "digital_precision_bits": 6},
            r"digital_precision_bits must be an integer from the DAC's 8 bits to 16, got 6",
        ),
        ({"analog_precision_bits": 1}, r"analog_precision_bits must be an integer in 2..16"),
        ({"repeated_reads": 0}, r"repeated_reads must be an integer in 1..1024"),
        ({"noise_compensation": "yes"}, r"noise_compensation must be a bool"),
        ({"t_inference_s": -1.0}, r"t_inference_s must be a number >= 0"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        AnalogConfig(**kwargs)


def test_shape_errors():
    with pytest.raises(WorkloadError, match=r"hybrid_matmul: A \[2, 3\] x B \[4, 2\]"):
        hybrid_matmul(None, AnalogConfig(), np.ones((2, 3)), np.ones((4, 2)))
