"""Analog and photonic units after issue #12: the one-read rounding, converter energy
that grows with bits, the ADC range fixed at programming, output noise, the photonic
noise budget (ENOB, warning, laser sizing), and graph routing by policy with
functional accuracy on models trained at test time (digits MLP and CNN)."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
from wia_hw.emulator.frontend_model import PhotonicCore
from wia_hw.extensions.analog import (
    ADC_FOM_FJ_PER_STEP,
    DAC_FOM_FJ_PER_STEP,
    adc_full_scale,
    analog_energy_pj,
)
from wia_hw.extensions.photonic import (
    PhotonicPrecisionWarning,
    laser_power_for_bits,
    photonic_enob,
    photonic_snr,
    size_laser_power,
)

import wia_hw
from wia_hw import (
    AnalogConfig,
    PhotonicConfig,
    PhotonicMatmul,
    WorkloadError,
    hybrid_matmul,
    photonic_matmul,
)
from wia_hw.accuracy import (
    GraphEvaluator,
    cnn_predict,
    cnn_to_graph,
    compare,
    mlp_to_graph,
    train_digits_cnn,
    train_digits_mlp,
    train_synthetic_transformer,
    transformer_predict,
    transformer_to_graph,
)

Q = 1.602176634e-19
KB = 1.380649e-23
BATCH = 64


def rel_rms(out, ref):
    return float(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref**2)))


def data(seed, m=64, k=256, n=64):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))


# -- analog: rounding, converters, ADC range, output noise ------------------------------


def test_one_read_rounds_like_the_multi_read_branch_at_4_bits():
    """With compensation on, one read's drift-scaled codes are rounded as the averaged
    reads are (they were truncated): without read noise every read is the same, so one
    read and four give the same output, bit for bit, and compensation removes the
    drift's gain."""
    a, b = data(11)
    ref = a @ b
    kw = {
        "analog_precision_bits": 4,
        "digital_precision_bits": 8,
        "programming_noise": False,
        "read_noise": False,
        "output_noise": 0.0,
        "t_inference_s": 86400.0,
    }
    one = hybrid_matmul(None, AnalogConfig(repeated_reads=1, **kw), a, b, seed=2)
    four = hybrid_matmul(None, AnalogConfig(repeated_reads=4, **kw), a, b, seed=2)
    assert one.reads == 1 and four.reads == 4
    assert np.all(one.drift_alpha > 1.2)  # the compensation factor is not an integer
    np.testing.assert_array_equal(one.output, four.output)
    raw = hybrid_matmul(None, AnalogConfig(noise_compensation=False, **kw), a, b, seed=2)
    fresh = hybrid_matmul(None, AnalogConfig(repeated_reads=1, **{**kw, "drift": False}), a, b)
    gain = float((one.output * ref).sum() / (ref**2).sum())
    gain_raw = float((raw.output * ref).sum() / (ref**2).sum())
    assert abs(gain - 1) < 0.6 * abs(gain_raw - 1)
    # compensated drift is within 1.6x of the drift-free 4-bit quantisation error
    assert rel_rms(one.output, ref) < 1.6 * rel_rms(fresh.output, ref)


def test_converter_energy_grows_with_bits_by_the_walden_model():
    adc = [AnalogConfig(adc_bits=b).adc_conversion_pj for b in range(2, 17)]
    dac = [AnalogConfig(dac_bits=b).dac_conversion_pj for b in range(2, 9)]
    assert all(x < y for x, y in zip(adc, adc[1:], strict=False))
    assert all(x < y for x, y in zip(dac, dac[1:], strict=False))
    # E = FOM * 2**bits (fJ -> pJ)
    assert AnalogConfig(adc_bits=9).adc_conversion_pj == pytest.approx(
        ADC_FOM_FJ_PER_STEP * 2**9 * 1e-3
    )
    assert AnalogConfig(dac_bits=7).dac_conversion_pj == pytest.approx(
        DAC_FOM_FJ_PER_STEP * 2**7 * 1e-3
    )
    # a fixed energy per conversion, when given, replaces the model
    assert AnalogConfig(adc_energy_pj=1.5, adc_bits=12).adc_conversion_pj == 1.5
    a, b = data(3, m=16, k=128, n=32)
    per_mac = [
        hybrid_matmul(
            None, AnalogConfig(analog_precision_bits=p, digital_precision_bits=max(8, p)), a, b
        ).energy_per_mac_pj
        for p in (4, 6, 8, 10)
    ]
    assert all(x < y for x, y in zip(per_mac, per_mac[1:], strict=False)), per_mac
    # the energy of one product, term by term
    cfg = AnalogConfig(dac_bits=6, adc_bits=8)
    e, program = analog_energy_pj(cfg, 16, 300, 40)
    reads = 16 * cfg.repeated_reads
    expected = (
        reads * 300 * 1 * cfg.dac_conversion_pj  # one column tile: every input once
        + reads * 40 * 2 * (cfg.adc_conversion_pj + cfg.digital_energy_pj)  # two K tiles
        + 16 * 300 * 40 * cfg.repeated_reads * cfg.cell_energy_fj * 1e-3
        + 300 * 40 * 2 * cfg.program_energy_pj
    )
    assert e == pytest.approx(expected) and program == 300 * 40 * 2 * cfg.program_energy_pj
    assert analog_energy_pj(cfg, 16, 300, 40, resident=True)[1] == 0.0


def test_adc_range_is_fixed_by_the_weights_not_by_the_product():
    _, b = data(5, k=300, n=80)
    rng = np.random.default_rng(6)
    inputs = [
        rng.uniform(-1, 1, (32, 300)),
        np.abs(rng.uniform(-1, 1, (32, 300))),  # all positive: larger, correlated outputs
        rng.uniform(-1, 1, (8, 300)) * 1e-3,
    ]
    cfg = AnalogConfig(tile_size=128)
    shifts = [hybrid_matmul(None, cfg, a, b).adc_shifts for a in inputs]
    for s in shifts[1:]:
        np.testing.assert_array_equal(s, shifts[0])
    # the range: min(L1, headroom * L2) of the programmed (normalised, quantised) columns
    whi = (1 << (cfg.digital_precision_bits - 1)) - 1
    w = np.rint(b / np.abs(b).max(axis=0, keepdims=True) * whi) / whi
    _, ahi = -(1 << 8), (1 << 8) - 1
    for nb in range(shifts[0].shape[0]):
        for kb in range(shifts[0].shape[1]):
            wt = w[kb * 128 : (kb + 1) * 128, nb * 128 : (nb + 1) * 128]
            full = min(
                np.abs(wt).sum(axis=0).max(), cfg.adc_headroom * np.sqrt((wt**2).sum(axis=0)).max()
            )
            assert full == pytest.approx(adc_full_scale(cfg, wt))
            want = math.ceil(math.log2(full * 2**24 / ahi))
            assert shifts[0][nb, kb] == want
    # other weights, another range
    sparse = b * (rng.uniform(0, 1, b.shape) < 0.1)
    other = hybrid_matmul(None, cfg, inputs[0], sparse).adc_shifts
    assert not np.array_equal(other, shifts[0])


def test_output_noise_variance_matches_its_parameter():
    a, b = data(7, m=64, k=200, n=96)
    sigma = 0.2
    cfg = AnalogConfig(
        analog_precision_bits=14,
        digital_precision_bits=16,
        programming_noise=False,
        read_noise=False,
        drift=False,
        noise_compensation=False,
        output_noise=sigma,
        tile_size=128,
    )
    res = hybrid_matmul(None, cfg, a, b, seed=4)
    kt = 2  # K tiles summed: their noises add
    scale = np.abs(a).max(axis=1, keepdims=True) * np.abs(b).max(axis=0, keepdims=True)
    predicted = kt * sigma**2 * scale**2
    ratio = np.mean((res.output - a @ b) ** 2) / np.mean(predicted)
    assert 0.85 < ratio < 1.15, ratio
    quiet = hybrid_matmul(None, AnalogConfig(**{**cfg.__dict__, "output_noise": 0.0}), a, b)
    assert rel_rms(quiet.output, a @ b) < 0.1 * rel_rms(res.output, a @ b)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dac_bits": 1}, r"AnalogConfig.dac_bits must be an integer in 2..16, got 1"),
        ({"adc_bits": 17}, r"AnalogConfig.adc_bits must be an integer in 2..16, got 17"),
        (
            {"dac_bits": 10, "digital_precision_bits": 8},
            r"digital_precision_bits must be an integer from the DAC's 10 bits to 16, got 8",
        ),
        ({"output_noise": -0.1}, r"AnalogConfig.output_noise must be a number >= 0"),
        ({"adc_energy_pj": -1.0}, r"AnalogConfig.adc_energy_pj must be None"),
        ({"adc_headroom": 0.0}, r"AnalogConfig.adc_headroom must be a number > 0"),
        ({"policy": "most"}, r"AnalogConfig.policy must be one of none, all, all_but_first_last"),
    ],
)
def test_analog_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AnalogConfig(**kwargs)


def test_digital_resolution_defaults_to_8_bits_or_the_dacs():
    """A DAC finer than 8 bits raises the default digital resolution with it, from
    Python and from the manifest (``--ext-param analog.dac_bits=10`` was an error
    naming a field the user never set)."""
    assert AnalogConfig().digital_precision_bits == 8
    assert AnalogConfig(dac_bits=10).digital_precision_bits == 10
    assert AnalogConfig(dac_bits=4, digital_precision_bits=12).digital_precision_bits == 12
    ext = wia_hw.load_extension("analog", parameters={"dac_bits": 12})
    assert AnalogConfig.from_extension(ext).digital_precision_bits == 12
    ext = wia_hw.load_extension("analog", parameters={"digital_precision_bits": 9})
    assert AnalogConfig.from_extension(ext).digital_precision_bits == 9


def test_the_seed_single_width_sets_both_converters_and_the_manifest_defaults_to_aihwkit():
    c = AnalogConfig(analog_precision_bits=6)
    assert (c.dac_precision_bits, c.adc_precision_bits) == (6, 6)
    c = AnalogConfig(analog_precision_bits=6, adc_bits=10)
    assert (c.dac_precision_bits, c.adc_precision_bits) == (6, 10)
    c = AnalogConfig()
    assert (c.dac_precision_bits, c.adc_precision_bits) == (7, 9)
    ext = wia_hw.load_extension("analog")
    c = AnalogConfig.from_extension(ext)
    assert (c.dac_precision_bits, c.adc_precision_bits) == (7, 9)
    c = AnalogConfig.from_extension(ext.with_parameters(analog_precision_bits=5))
    assert (c.dac_precision_bits, c.adc_precision_bits) == (5, 5)
    c = AnalogConfig.from_extension(ext.with_parameters(analog_precision_bits=5, adc_bits=8))
    assert (c.dac_precision_bits, c.adc_precision_bits) == (5, 8)


# -- photonic: the noise budget ---------------------------------------------------------


def test_photonic_snr_is_the_detectors_noise_budget_and_the_core_measures_it():
    # 16-bit converters: their rounding (in the budget too) stays out of the way
    cfg = PhotonicConfig(
        matrix_size_limit=16, mzi_phase_sigma_rad=0.0, laser_power_mw=2.0, precision_bits=16
    )
    r, p0, bw = cfg.detector_responsivity_a_per_w, 2e-3, cfg.modulation_bandwidth_ghz * 1e9
    full = r * p0 * cfg.transmission
    var = 2 * Q * full * bw + 2 * 4 * KB * cfg.temperature_k * bw / cfg.load_ohm
    snr = full**2 / 2 / var
    one = PhotonicMatmul(input_encoding="phase")  # one pass; 16-bit samples and codes add 1e-5
    assert photonic_snr(cfg, one) == pytest.approx(snr, rel=3e-5)
    assert photonic_enob(cfg, one) == pytest.approx((10 * math.log10(snr) - 1.76) / 6.02)
    # the simulated core's balanced difference at y = 0 has that variance (+ rounding)
    core = PhotonicCore(params=cfg.core_params(), seed=1)
    core.program(np.zeros((16, 16)))
    diffs = np.concatenate([np.subtract(*core.detect(np.zeros(16))) for _ in range(400)])
    lsb = r * p0 / ((1 << cfg.det_bits) - 1)  # amperes per detector count
    measured = np.var(diffs) - 2 / 12
    assert measured == pytest.approx(var / lsb**2, rel=0.1)


def test_photonic_enob_grows_with_laser_power_and_the_seed_config_is_reported():
    enobs = [photonic_enob(PhotonicConfig(laser_power_mw=p)) for p in (0.1, 1, 10, 100, 1000)]
    assert all(x < y for x, y in zip(enobs, enobs[1:], strict=False)), enobs
    seed = PhotonicConfig(
        wavelength_channels=64,
        modulation_bandwidth_ghz=100,
        matrix_size_limit=256,
        precision_bits=8,
    )
    assert photonic_enob(seed) < 8  # shot-noise limited at 10 mW
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 30)), rng.standard_normal((30, 12))
    with pytest.warns(
        PhotonicPrecisionWarning, match=r"precision_bits=8 delivers 6\.\d\d effective"
    ):
        res = photonic_matmul(None, seed, PhotonicMatmul(), a, b)
    assert res.precision_bits == 8 and res.enob == pytest.approx(photonic_enob(seed))
    # the product's outputs span a fraction of full scale: fewer bits still
    assert res.effective_bits < res.enob
    # 8 bits are out of reach: the ADC's power-of-two gain puts its step at 1/77.6 of full
    # scale (not 1/127) and the two passes each round; the refusal is one line
    with pytest.raises(ValueError, match=r"converters' rounding alone leaves 6\.78 bits") as e:
        laser_power_for_bits(seed)
    assert "\n" not in str(e.value) and "precision_bits=8" in str(e.value)
    # sized for 6.5 bits at full scale: ENOB 6.5, more energy
    p65 = laser_power_for_bits(seed, bits=6.5)
    assert p65 > seed.laser_power_mw
    assert photonic_enob(PhotonicConfig(laser_power_mw=p65)) == pytest.approx(6.5)
    sized = size_laser_power(seed, PhotonicMatmul(), 40, 30, 12, bits=6.5)
    assert sized.laser_power_mw == pytest.approx(p65) and sized.enob == pytest.approx(6.5)
    with pytest.warns(PhotonicPrecisionWarning):  # timing only: judged at full scale
        base = photonic_matmul(None, seed, PhotonicMatmul(), a, b, functional=False)
    assert sized.energy_pj > base.energy_pj
    # sized for the product's own range (phase error off: at its bound it alone would
    # leave 4.9 bits at this range), wider converters and samples deliver 8 bits
    wide = PhotonicConfig(
        precision_bits=12, det_bits=20, matrix_size_limit=32, mzi_phase_sigma_rad=0.0
    )
    unit = wide.matrix_size_limit * np.abs(a).max() * np.abs(b).max()
    frac = float(np.abs(a @ b).max() / unit)
    p_all = laser_power_for_bits(wide, signal_fraction=frac, bits=8.5)
    with warnings.catch_warnings():  # 8 of the 12 bits configured
        warnings.simplefilter("ignore", PhotonicPrecisionWarning)
        ok = photonic_matmul(None, replace(wide, laser_power_mw=p_all), PhotonicMatmul(), a, b)
    assert ok.effective_bits >= 8
    with pytest.raises(ValueError, match=r"signal_fraction must be in \(0, 1\], got 0"):
        laser_power_for_bits(seed, signal_fraction=0)


# -- graph routing ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp():
    clf, split = train_digits_mlp(hidden=(64, 32), seed=0, max_iter=200)
    g, w = mlp_to_graph(clf, BATCH)
    ref = GraphEvaluator(g, w).predict(split[1])
    return g, w, split, ref


def _ctx(unit, **params):
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, unit, parameters=params)
    return ctx


@pytest.mark.parametrize("unit", ["analog", "photonic"])
def test_policy_all_but_first_last_routes_exactly_the_middle_layers(mlp, unit):
    g, w, split, _ = mlp
    ctx = _ctx(unit, policy="all_but_first_last")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhotonicPrecisionWarning)
        res = ctx.run(g, mode="functional", inputs={"x": split[1][:BATCH], **w})
    providers = {k.name: k.provider for k in res.kernels}
    assert providers == {
        "fc0": "builtin",
        "fc0.relu": "builtin",
        "fc1": unit,
        "fc1.relu": "builtin",
        "logits": "builtin",
    }
    fc1 = next(k for k in res.kernels if k.name == "fc1")
    ext = res.extensions[unit]
    assert ext["kernels"] == 1 and ext["unit_macs"] == BATCH * 64 * 32
    # the unit's own time: at least its cost model's, in device cycles
    t_ns = ext[f"{unit}_time_ns"]
    assert fc1.cycles >= math.ceil(t_ns * ctx.spec.clock_ghz)
    assert res.outputs["logits"].shape == (BATCH, 10)
    # by name, and the default policy takes nothing
    ctx = _ctx(unit, policy="names:fc0,logits")
    res = ctx.run(g)
    assert [k.name for k in res.kernels if k.provider == unit] == ["fc0", "logits"]
    res = _ctx(unit).run(g)
    assert all(k.provider == "builtin" for k in res.kernels)


def test_routed_energy_is_the_units_cost_model(mlp):
    g, w, _, _ = mlp
    ctx = _ctx("analog", policy="all", adc_bits=6)
    res = ctx.run(g)
    cfg = AnalogConfig(adc_bits=6)
    want = sum(
        analog_energy_pj(cfg, BATCH, k, n, resident=True)[0]
        for k, n in ((64, 64), (64, 32), (32, 10))
    )
    assert res.extensions["analog"]["unit_energy_pj"] == pytest.approx(want)
    base = wia_hw.run(g)
    # the array's MAC energy is replaced by the unit's
    assert res.energy_j != base.energy_j


def test_policy_errors(mlp):
    g, _, _, _ = mlp
    with pytest.raises(
        WorkloadError, match=r"analog policy 'names:fc1,fc9': graph 'mlp' has no op fc9"
    ):
        _ctx("analog", policy="names:fc1,fc9").run(g)
    with pytest.raises(ValueError, match=r"AnalogConfig.policy must be one of none, all"):
        _ctx("analog", policy="half").run(g)
    with pytest.raises(ValueError, match=r"PhotonicConfig.policy must be one of none, all"):
        PhotonicConfig(policy="names:")
    with pytest.raises(ValueError, match=r"give providers or unit, not both"):
        GraphEvaluator(g, unit="analog", providers=_ctx("analog").providers)


def test_functional_accuracy_degrades_gracefully_with_analog_bits(mlp):
    g, w, (_, x_test, _, y_test), ref = mlp
    acc = {}
    for bits in (8, 2):
        ev = GraphEvaluator(
            g,
            w,
            unit="analog",
            unit_parameters={"policy": "all", "dac_bits": bits, "adc_bits": bits},
        )
        assert ev.unit_cost.routed_ops == ("fc0", "fc1", "logits")
        acc[bits] = compare(f"analog {bits}", ev.predict(x_test), ref, y_test)
    assert acc[8].reference_accuracy > 95
    assert acc[8].accuracy >= acc[8].reference_accuracy - 3  # 8-bit: a few points at most
    assert acc[2].accuracy < acc[8].accuracy - 20  # 2-bit: clearly worse
    # same seed, same numbers; another seed, other noise
    ev = GraphEvaluator(g, w, unit="analog", unit_parameters={"policy": "all"}, seed=1)
    o1, o2 = ev.predict(x_test[:64]), ev.predict(x_test[:64])
    np.testing.assert_array_equal(o1, o2)
    ev2 = GraphEvaluator(g, w, unit="analog", unit_parameters={"policy": "all"}, seed=2)
    assert not np.array_equal(o1, ev2.predict(x_test[:64]))


def test_digits_cnn_trains_lowers_to_conv_and_runs_on_the_units():
    params, (_, x_test, _, y_test) = train_digits_cnn(seed=0)
    g, w = cnn_to_graph(params, BATCH)
    ref = GraphEvaluator(g, w).predict(x_test)
    numpy_ref = cnn_predict(params, x_test)
    assert np.max(np.abs(ref - numpy_ref)) <= 1e-4 * np.max(np.abs(numpy_ref))
    assert 100 * np.mean(ref.argmax(1) == y_test) > 95
    ev = GraphEvaluator(g, w, unit="analog", unit_parameters={"policy": "all_but_first_last"})
    cost = ev.unit_cost
    assert cost.routed_ops == ("conv2", "fc1") and 0 < cost.routed_macs < cost.total_macs
    rep = compare("cnn analog", ev.predict(x_test), ref, y_test)
    assert rep.accuracy >= rep.reference_accuracy - 3
    # photonic: more laser power, more accuracy (one batch keeps the optics model quick)
    xs, ys, rs = x_test[:BATCH], y_test[:BATCH], ref[:BATCH]
    accs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhotonicPrecisionWarning)
        for p in (1.0, 1000.0):
            ph = {"policy": "all_but_first_last", "laser_power_mw": p}
            ev = GraphEvaluator(g, w, unit="photonic", unit_parameters=ph)
            accs.append(compare("cnn photonic", ev.predict(xs), rs, ys).agreement)
    assert accs[1] > accs[0] + 20, accs
    with pytest.raises(WorkloadError, match=r"parameter 'fc1.weight' is \[3\], need \[256, 32\]"):
        cnn_to_graph({**params, "fc1.weight": np.zeros(3)}, BATCH)


def test_direct_calls_to_both_units_share_a_context_without_claiming_graph_ops(mlp):
    g, _, _, _ = mlp
    ctx = wia_hw.open_device("wia-npu")
    a, b = data(12, m=4, k=16, n=8)
    hybrid_matmul(ctx, AnalogConfig(), a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhotonicPrecisionWarning)
        photonic_matmul(ctx, PhotonicConfig(), PhotonicMatmul(), a, b)
    assert set(ctx.extensions) == {"analog", "photonic"} and not ctx.providers
    assert all(k.provider == "builtin" for k in ctx.run(g).kernels)


def test_synthetic_transformer_trains_and_its_weight_gemms_run_on_the_analog_unit():
    params, (_, x_test, _, y_test) = train_synthetic_transformer(seed=0)
    x_test, y_test = x_test[:192], y_test[:192]
    g, w = transformer_to_graph(params, BATCH)
    ref = GraphEvaluator(g, w).predict(x_test)
    numpy_ref = transformer_predict(params, x_test)
    assert np.max(np.abs(ref - numpy_ref)) <= 1e-4 * np.max(np.abs(numpy_ref))
    assert 100 * np.mean(ref.argmax(1) == y_test) > 90  # trained: chance is 25-40%
    acc = {}
    for bits in (8, 2):
        ev = GraphEvaluator(
            g,
            w,
            unit="analog",
            unit_parameters={"policy": "all_but_first_last", "dac_bits": bits, "adc_bits": bits},
        )
        # the weight GEMMs but the first (q) and last (logits); the attention bmms stay
        assert ev.unit_cost.routed_ops == ("attn.k", "attn.v", "attn.out", "ffn.fc1", "ffn.fc2")
        acc[bits] = compare(f"analog {bits}", ev.predict(x_test), ref, y_test)
    assert acc[8].accuracy >= acc[8].reference_accuracy - 3
    assert acc[2].accuracy < acc[8].accuracy - 20
    with pytest.raises(WorkloadError, match=r"parameter 'pos_emb' is \[2, 2\], need \[17, 32\]"):
        transformer_to_graph({**params, "pos_emb": np.zeros((2, 2))}, BATCH)


def test_the_roofline_floor_leaves_out_what_the_units_compute():
    """The seed photonic core beats the array's FLOP floor on BERT-Base's linears; the
    run's floor then counts only what the array and the memory must do."""
    ctx = _ctx("photonic", policy="all")
    res = ctx.run("bert-base", batch=32, seq=128, layers=2)
    base = wia_hw.run("bert-base", batch=32, seq=128, layers=2)
    assert res.latency_ms < base.roofline_floor_ms  # faster than the array could be
    assert res.latency_ms >= res.roofline_floor_ms
    assert base.latency_ms >= base.roofline_floor_ms


@pytest.mark.parametrize("unit", ["analog", "photonic"])
def test_a_bad_policy_from_the_command_line_is_one_line(unit: str) -> None:
    from click.testing import CliRunner

    from wia_hw.cli import cli

    res = CliRunner().invoke(
        cli,
        [
            "run",
            "gemm",
            "-a",
            "M=64",
            "-a",
            "N=64",
            "-a",
            "K=64",
            "--ext",
            unit,
            "--ext-param",
            f"{unit}.policy=bogus",
        ],
    )
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0
    assert f"extension {unit!r} parameters" in res.output and "'bogus'" in res.output
