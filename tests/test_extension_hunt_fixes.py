"""Fixes to the device extensions found by a bug hunt: the photonic core refuses a path
loss that leaves no usable light and never reports more bits than its converters
resolve; the analog tile honours an explicit converter width and accepts every manifest
value; the PIM offload decides and reports by the data's actual level and its own
write-back, and a run never gets slower for it."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from wia_hw.extensions.analog import AnalogConfig
from wia_hw.extensions.photonic import (
    MAX_PATH_LOSS_DB,
    PhotonicConfig,
    PhotonicMatmul,
    PhotonicPrecisionWarning,
    laser_power_for_bits,
    photonic_enob,
    photonic_matmul,
)
from wia_hw.extensions.pim import PIMConfig, relu_offload_estimate

import wia_hw
from wia_hw import SpecError
from wia_hw.graph import GraphBuilder
from wia_hw.registry import load_extension

# -- photonic: the optical path loss -----------------------------------------------------


@pytest.mark.parametrize(("loss_db", "size"), [(10.0, 1024), (10.0, 64), (10.0, 256)])
def test_photonic_refuses_a_path_loss_that_leaves_no_light(loss_db, size):
    total = loss_db * (size + 3)
    with pytest.raises(ValueError, match=r"insertion_loss_db_per_component=10 over") as e:
        PhotonicConfig(insertion_loss_db_per_component=loss_db, matrix_size_limit=size)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"matrix_size_limit + 3 = {size + 3} components" in msg
    assert f"{total:.4g} dB optical path loss" in msg and "above the 100 dB" in msg


def test_photonic_path_loss_limit_is_inclusive_and_the_largest_mesh_fits():
    # 0.5 dB x (197 + 3) components is exactly the limit
    at = PhotonicConfig(insertion_loss_db_per_component=0.5, matrix_size_limit=197)
    assert at.insertion_loss_db == MAX_PATH_LOSS_DB == 100.0
    assert at.transmission > 0
    with pytest.raises(ValueError, match=r"100.5 dB optical path loss"):
        PhotonicConfig(insertion_loss_db_per_component=0.5, matrix_size_limit=198)
    big = PhotonicConfig(matrix_size_limit=4096)  # 0.02 dB x 4099 = 82 dB
    assert big.insertion_loss_db == pytest.approx(0.02 * 4099)
    # 16-bit detector samples see 4e-4 of a step at full scale: no laser helps (one line)
    with pytest.raises(ValueError, match=r"converters' rounding alone leaves -11.23 bits"):
        laser_power_for_bits(big)
    assert math.isfinite(
        laser_power_for_bits(PhotonicConfig(matrix_size_limit=4096, det_bits=32), bits=4)
    )


def test_photonic_graph_run_with_the_repro_loss_is_one_spec_error():
    ctx = wia_hw.open_device("wia-npu")
    params = {"policy": "all", "insertion_loss_db_per_component": 10, "matrix_size_limit": 1024}
    with pytest.raises(SpecError, match=r"10270 dB optical path loss|1\.027e\+04 dB"):
        wia_hw.register_device_extension(ctx, "photonic", parameters=params)
        ctx.run("gemm", M=512, N=512, K=512)


def test_photonic_energy_stays_finite_at_the_loss_limit():
    cfg = PhotonicConfig(insertion_loss_db_per_component=0.5, matrix_size_limit=16)
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhotonicPrecisionWarning)
        r = photonic_matmul(
            None, cfg, PhotonicMatmul(), rng.standard_normal((8, 16)), rng.standard_normal((16, 4))
        )
    assert math.isfinite(r.energy_pj) and r.energy_pj > 0


@pytest.mark.parametrize("bits", [math.inf, math.nan, 1e6])
def test_laser_power_for_bits_refuses_unreachable_bits(bits):
    with pytest.raises(ValueError, match=r"bits must be a finite number|no finite laser power"):
        laser_power_for_bits(PhotonicConfig(), bits=bits)


# -- photonic: the converters are in the budget, not a cap --------------------------------


@pytest.mark.parametrize("precision_bits", [4, 6, 8])
def test_photonic_delivered_bits_are_the_converters_with_ample_light(precision_bits):
    """At 10 W the noise alone would leave more than 12 bits: what is delivered is what
    the DAC and ADC codes leave (reported as measured, no longer the configured
    precision_bits: until 2026-12-02 a 4-bit core reported 4.00 while delivering
    2.9), and the warning says no laser reaches the configured bits."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((48, 64)), rng.standard_normal((64, 16))
    cfg = PhotonicConfig(matrix_size_limit=64, laser_power_mw=10000, precision_bits=precision_bits)
    no_converters = PhotonicConfig(
        matrix_size_limit=64, laser_power_mw=10000, precision_bits=16, mzi_phase_sigma_rad=0
    )
    assert photonic_enob(no_converters, PhotonicMatmul()) > 12
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = photonic_matmul(None, cfg, PhotonicMatmul(), a, b, seed=1)
    assert r.enob < precision_bits and r.effective_bits < r.enob
    unit = 64 * np.abs(a).max(axis=1, keepdims=True) * np.abs(b).max(axis=0, keepdims=True)
    err = (r.output - a @ b) / unit
    peak = float(np.abs(a @ b / unit).max())
    measured = (10 * math.log10(peak**2 / 2 / np.var(err)) - 1.76) / 6.02
    assert r.effective_bits == pytest.approx(measured, abs=0.15)
    msgs = [str(x.message) for x in w if issubclass(x.category, PhotonicPrecisionWarning)]
    assert msgs and f"no laser power reaches {precision_bits} bits" in msgs[0]


def test_photonic_warning_fires_when_delivered_bits_fall_short():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((48, 64)), rng.standard_normal((64, 16))
    cfg = PhotonicConfig(matrix_size_limit=64, laser_power_mw=0.1, precision_bits=8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = photonic_matmul(None, cfg, PhotonicMatmul(), a, b, seed=1)
    assert r.effective_bits < 8 and r.enob <= 8
    assert [x for x in w if issubclass(x.category, PhotonicPrecisionWarning)]


# -- analog: manifest bounds, explicit converter widths -----------------------------------


def test_analog_adc_headroom_accepts_its_manifest_maximum():
    assert AnalogConfig(adc_headroom=1e6).adc_headroom == 1e6
    with pytest.raises(ValueError, match=r"adc_headroom must be a number > 0 and at most 1e6"):
        AnalogConfig(adc_headroom=1e6 * 1.5)
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(
        ctx, "analog", parameters={"policy": "all", "adc_headroom": 1000000}
    )
    r = ctx.run("gemm", M=64, N=64, K=64)
    assert r.extensions["analog"]["kernels"] == 1


#: Combinations a single parameter's extreme cannot take alone: the partner value that
#: makes the extreme legal (documented in the manifests).
_PARTNER = {
    ("photonic", "insertion_loss_db_per_component", 10.0): {"matrix_size_limit": 7},
    ("pim", "compute_units_per_bank", 64): {"bank_columns": 64},
    ("pim", "bank_columns", 1): {"compute_units_per_bank": 1},
    ("pim", "bank_columns", 4096): {"compute_units_per_bank": 64},
}


@pytest.mark.parametrize("ext_id", ["analog", "photonic", "pim"])
def test_every_manifest_bound_is_accepted_by_the_config(ext_id):
    from wia_hw.extensions.photonic import PhotonicConfig as Ph

    make = {"analog": AnalogConfig, "photonic": Ph, "pim": PIMConfig}[ext_id].from_extension
    ext = load_extension(ext_id)
    checked = 0
    for name, p in ext.parameters.items():
        for bound in (p.min, p.max):
            if bound is None:
                continue
            v = int(bound) if p.type == "int" else float(bound)
            extra = _PARTNER.get((ext_id, name, v), {})
            make(load_extension(ext_id, parameters={name: v, **extra}))
            checked += 1
    assert checked >= 10


def test_analog_explicit_dac_bits_is_honoured_even_at_aihwkits_default():
    def cfg(**p):
        return AnalogConfig.from_extension(load_extension("analog", parameters=p))

    c = cfg(analog_precision_bits=4, dac_bits=7)
    assert (c.dac_precision_bits, c.adc_precision_bits) == (7, 4)
    c = cfg(analog_precision_bits=4, adc_bits=9)
    assert (c.dac_precision_bits, c.adc_precision_bits) == (4, 9)
    c = cfg(analog_precision_bits=4)
    assert (c.dac_precision_bits, c.adc_precision_bits) == (4, 4)
    c = cfg()
    assert (c.dac_precision_bits, c.adc_precision_bits) == (7, 9)

    def time_ns(p):
        ctx = wia_hw.open_device("wia-npu")
        wia_hw.register_device_extension(ctx, "analog", parameters={"policy": "all", **p})
        return ctx.run("gemm", M=256, N=256, K=256).extensions["analog"]["analog_time_ns"]

    four = time_ns({"analog_precision_bits": 4})
    seven = time_ns({"analog_precision_bits": 4, "dac_bits": 7})
    assert seven > four  # a 7-bit PWM input takes longer than a 4-bit one
    assert seven == time_ns({"dac_bits": 7, "adc_bits": 4})


# -- PIM: the offload decision and its saving ----------------------------------------------


def test_pim_offload_never_makes_resnet50_slower():
    base = wia_hw.open_device("wia-npu").run("resnet50", batch=1)
    for params in (
        {"offload_min_bytes": 1},
        {"offload_min_bytes": 1, "compute_units_per_bank": 1},
        {"offload_min_bytes": 1, "t_rcd": 255},
    ):
        ctx = wia_hw.open_device("wia-npu")
        wia_hw.register_device_extension(ctx, "pim", parameters=params)
        r = ctx.run("resnet50", batch=1)
        assert r.latency_ms <= base.latency_ms, params
        for k in r.kernels:
            if k.provider == "pim":
                e = k.record.extra
                assert e["pim_cycles_estimate"] < e["npu_cycles_estimate"], (params, k.name)


def test_pim_estimate_reads_l2_resident_activations_at_l2_bandwidth():
    spec = wia_hw.open_device("wia-npu").spec
    b = GraphBuilder("relu_net", "fp16")
    x = b.input("x", (256, 256))
    h = b.linear("fc", x, 256, bias=False)
    b.op("relu", "act", [h])
    g = b.graph()
    (op,) = [o for o in g.ops if o.kind == "relu"]
    xt, yt = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
    est = relu_offload_estimate(spec, xt, yt, 100)
    l2_bpc = float(spec.bytes_per_cycle(spec.memory.l2.bandwidth_gbs))
    hbm_bpc = float(spec.bytes_per_cycle(spec.peak_bandwidth_gbs))
    v = spec.compute.vector
    vec = -(-(256 * 256 // spec.compute.cores) // v.lanes) * 1 + v.pipeline_depth  # elementwise
    assert est["l2_resident"] == 1
    assert est["npu_cycles_estimate"] == max(math.ceil(2 * 256 * 256 * 2 / l2_bpc), vec)
    assert est["pim_cycles_estimate"] == 100 + math.ceil(256 * 256 * 2 / hbm_bpc)
    # the graph input itself is not in the caches: no write-back, HBM bandwidth
    xin = g.tensors["x"]
    est_in = relu_offload_estimate(spec, xin, xin, 100)
    assert est_in["l2_resident"] == 0 and est_in["pim_cycles_estimate"] == 100


def test_photonic_laser_energy_charges_the_path_loss_once():
    """``laser_power_mw`` is launched power: the noise budget sees it times the path's
    transmission (``R P0 L``), so a lossier path delivers fewer bits for the same
    laser energy; the energy is not divided by the transmission a second time (it
    was: 3.3x the laser energy at the default loss)."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((32, 64)), rng.standard_normal((64, 16))
    out = {}
    for loss in (0.0, 0.05):
        cfg = PhotonicConfig(matrix_size_limit=64, insertion_loss_db_per_component=loss)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PhotonicPrecisionWarning)
            out[loss] = photonic_matmul(None, cfg, PhotonicMatmul(), a, b, functional=False)
    assert out[0.05].energy_pj == pytest.approx(out[0.0].energy_pj, rel=1e-12)
    # 16-bit converters: the light's share of the bits (at 8 bits the ADC's power-of-two
    # gain, fitted to each path's full scale, can favour either path)
    lossy = PhotonicConfig(
        matrix_size_limit=64, insertion_loss_db_per_component=0.05, precision_bits=16
    )
    assert photonic_enob(lossy) < photonic_enob(
        PhotonicConfig(matrix_size_limit=64, insertion_loss_db_per_component=0, precision_bits=16)
    )
