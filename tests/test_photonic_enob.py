"""Photonic precision: the effective bits reported (``photonic_enob``, ``effective_bits``)
and the laser sized for them (``laser_power_for_bits``) against the bits the simulated
core measurably delivers: every pass of a product (``x+``/``x-`` of intensity encoding,
``W+``/``W-`` of an incoherent mesh) adds its own detector noise, and the detectors'
``det_bits`` samples round, whatever the laser."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
from wia_hw.extensions.photonic import (
    PhotonicPrecisionWarning,
    laser_power_for_bits,
    photonic_enob,
    size_laser_power,
)

from wia_hw import PhotonicConfig, PhotonicMatmul, photonic_matmul

#: Reported and measured bits agree to this where the detectors' noise dithers their
#: samples' rounding (every case below but the last test's): three seeds of a 64 x 64 by
#: 64 x 64 product measure the noise's variance to a few per cent, ~0.02 bits.
TOL_BITS = 0.1
#: Converters at 16 bits and no phase error: what is left is the budget's own terms
#: (shot, thermal, the detectors' samples), not the precision_bits cap.
EXACT = {"precision_bits": 16, "mzi_phase_sigma_rad": 0.0, "matrix_size_limit": 64}
MMS = {
    "phase": PhotonicMatmul(input_encoding="phase"),  # one pass
    "intensity": PhotonicMatmul(),  # two: x+ and x-
    "intensity+incoherent": PhotonicMatmul(computation_mode="incoherent"),  # four
    "single": PhotonicMatmul(output_detection="single"),
}


def _snr_bits(signal_amplitude: float, noise_var: float) -> float:
    """ENOB of a sine of that amplitude against that noise: (SNR_dB - 1.76) / 6.02."""
    return (10 * math.log10(signal_amplitude**2 / 2 / noise_var) - 1.76) / 6.02


def measured_and_reported_bits(cfg, mm, seeds=3):
    """(measured, reported) effective bits over the product's range: the error and the
    ideal output's peak in units of the mesh's full scale (``y = W x / n``, each row and
    column normalised by its max), against the mean ``effective_bits`` reported."""
    n = cfg.matrix_size_limit
    errs, bits, reported = [], [], []
    for s in range(seeds):
        rng = np.random.default_rng(100 + s)
        a, b = rng.standard_normal((64, n)), rng.standard_normal((n, 64))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PhotonicPrecisionWarning)
            r = photonic_matmul(None, cfg, mm, a, b, seed=s)
        unit = n * np.abs(a).max(axis=1, keepdims=True) * np.abs(b).max(axis=0, keepdims=True)
        errs.append(((r.output - a @ b) / unit).ravel())
        bits.append(np.abs(a @ b / unit).max())
        reported.append(r.effective_bits)
    var = np.var(np.concatenate(errs))
    return float(np.mean([_snr_bits(p, var) for p in bits])), float(np.mean(reported))


@pytest.mark.parametrize("mm_name", list(MMS))
@pytest.mark.parametrize(("laser_mw", "det_bits"), [(10, 8), (10, 10), (10, 16), (1000, 12)])
def test_reported_effective_bits_are_the_measured_ones(mm_name, laser_mw, det_bits):
    cfg = PhotonicConfig(**EXACT, laser_power_mw=laser_mw, det_bits=det_bits)
    measured, reported = measured_and_reported_bits(cfg, MMS[mm_name])
    assert reported == pytest.approx(measured, abs=TOL_BITS), (measured, reported)


def test_each_pass_costs_its_share_of_the_bits():
    # detector noise only: two passes lose half a bit, four a whole bit
    cfg = PhotonicConfig(**EXACT, det_bits=32)
    one = photonic_enob(cfg, MMS["phase"])
    assert photonic_enob(cfg, MMS["intensity"]) == pytest.approx(one - 0.5, abs=1e-3)
    assert photonic_enob(cfg, MMS["intensity+incoherent"]) == pytest.approx(one - 1, abs=1e-3)
    # the default is the seed's (and graph routing's) intensity encoding
    assert photonic_enob(cfg) == photonic_enob(cfg, PhotonicMatmul())


@pytest.mark.parametrize("mm_name", ["phase", "intensity", "intensity+incoherent"])
@pytest.mark.parametrize("bits", [6.0, 8.0])
def test_a_laser_sized_for_bits_delivers_them(mm_name, bits):
    mm = MMS[mm_name]
    cfg = PhotonicConfig(**EXACT)
    sized = size_laser_power(cfg, mm, 64, 64, 64, bits=bits)
    assert sized.laser_power_mw == pytest.approx(laser_power_for_bits(cfg, mm, bits=bits))
    assert sized.enob == pytest.approx(bits)
    # measured at full scale: rows and columns whose max is 1, noise in units of y = 1
    at = PhotonicConfig(**{**EXACT, "laser_power_mw": sized.laser_power_mw})
    n = at.matrix_size_limit
    rng = np.random.default_rng(0)
    a, x = rng.uniform(-1, 1, (n, n)), rng.uniform(-1, 1, (n, 128))
    a[:, 0], x[0] = 1.0, 1.0
    with warnings.catch_warnings():  # 16-bit converters: the sized bits are fewer
        warnings.simplefilter("ignore", PhotonicPrecisionWarning)
        err = [(photonic_matmul(None, at, mm, a, x, seed=s).output - a @ x) / n for s in range(3)]
    measured = _snr_bits(1.0, float(np.var(np.concatenate(err))))
    assert measured >= bits - TOL_BITS, measured
    assert measured == pytest.approx(bits, abs=TOL_BITS)


def test_the_seed_configuration_sized_for_8_bits_delivers_8():
    seed = PhotonicConfig(
        wavelength_channels=64,
        modulation_bandwidth_ghz=100,
        matrix_size_limit=256,
        precision_bits=8,
    )
    # intensity encoding: twice the detections of phase encoding, twice the light
    p8 = laser_power_for_bits(seed)
    phase8 = laser_power_for_bits(seed, MMS["phase"])
    assert p8 == pytest.approx(2 * phase8, rel=0.01)
    assert photonic_enob(seed) < photonic_enob(seed, MMS["phase"]) - 0.49


def test_detector_sample_width_limits_the_bits_and_the_sizing_says_so():
    # the hunter's repro: plenty of light, the detectors' det_bits decide
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 128)), rng.standard_normal((128, 32))
    got = {}
    for det_bits in (6, 8, 16):
        cfg = PhotonicConfig(det_bits=det_bits, laser_power_mw=1000.0)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = photonic_matmul(None, cfg, PhotonicMatmul(), a, b, seed=0)
        got[det_bits] = (r.enob, r.effective_bits, [str(x.message) for x in w])
    assert got[6][1] < got[8][1] < got[16][1]
    assert got[6][0] < got[8][0] < 8 == got[16][0]  # full scale: 16-bit samples suffice
    assert "det_bits=6 detector samples" in got[6][2][0]
    # no laser reaches 8 bits through 8-bit detector samples: one line saying why
    with pytest.raises(ValueError) as e:
        laser_power_for_bits(PhotonicConfig(det_bits=8))
    msg = str(e.value)
    assert "\n" not in msg and "det_bits=8" in msg
    assert re_bits(msg) == pytest.approx(
        photonic_enob(PhotonicConfig(det_bits=8, laser_power_mw=1e7)), abs=0.01
    )
    with pytest.raises(ValueError, match=r"converters' rounding alone leaves"):
        size_laser_power(PhotonicConfig(det_bits=8), PhotonicMatmul(), 8, 8, 8)


def re_bits(msg: str) -> float:
    """The bits a laser_power_for_bits refusal says the converters alone leave."""
    return float(re.search(r"alone leaves (-?[\d.]+) bits", msg).group(1))


def test_undithered_detector_rounding_is_reported_conservatively():
    # with little noise the two arms' rounding errors are correlated and partly cancel in
    # the balanced difference: the budget's independent step**2 / 12 per sample is then
    # an upper bound (up to ~0.25 bits pessimistic), never an overstatement
    cfg = PhotonicConfig(**EXACT, laser_power_mw=1000, det_bits=10)
    measured, reported = measured_and_reported_bits(cfg, MMS["intensity"])
    assert reported - TOL_BITS <= measured <= reported + 0.3, (measured, reported)


@pytest.mark.parametrize(
    ("field", "value", "rng"),
    [
        ("in_bits", "x", r"precision_bits \(8\)\.\.32"),
        ("in_bits", 7, r"precision_bits \(8\)\.\.32"),
        ("in_bits", 8.0, r"precision_bits \(8\)\.\.32"),
        ("det_bits", "16", r"2\.\.32"),
        ("det_bits", 33, r"2\.\.32"),
    ],
)
def test_converter_widths_are_checked_in_one_line_naming_the_field(field, value, rng):
    with pytest.raises(ValueError, match=rf"PhotonicConfig\.{field} must be an integer in {rng}"):
        PhotonicConfig(**{field: value})
