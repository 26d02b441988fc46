"""Every per-PE rate the emulator charges on a shipped spec has an RTL PE mode behind it.

A spec's ``compute.array.macs_per_pe_cycle`` maps a precision to MACs per PE per cycle;
the RTL's PE modes (``wia_hw.rtl.pe.PRECISIONS``) perform ``MACS_PER_CYCLE[mode]`` MACs
per cycle (``LANES[mode]`` elements per step, each held ``STEPS_PER_ELEMENT[mode]``
steps: fp32 is one MAC every 4 cycles).
A (precision, rate) pair with no mode is listed in ``WITHOUT_RTL`` with the reason, so the
gap is visible and a new spec cannot add one silently.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from wia_hw.emulator.cycles import systolic_steps
from wia_hw.rtl.pe import LANES, MACS_PER_CYCLE, STEPS_PER_ELEMENT

from wia_hw.spec import list_specs, load_spec

#: RTL PE mode -> the emulator precision it computes.
MODE_PRECISION = {
    "int8": "int8",
    "int8x2": "int8",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp32": "fp32",
}
#: (precision, MACs/PE/cycle) pairs shipped without RTL, and why (none today).
WITHOUT_RTL: dict[tuple[str, Fraction], str] = {}


def _rtl_rates() -> set[tuple[str, Fraction]]:
    return {(MODE_PRECISION[m], Fraction(n)) for m, n in MACS_PER_CYCLE.items()}


def test_mode_rates_are_lanes_over_steps_per_element():
    """The rate is what the array streams: LANES elements per step, one step per cycle,
    STEPS_PER_ELEMENT steps per element; ``systolic_steps`` at that rate gives the steps
    the array takes (fp32: 4 per element)."""
    assert set(MACS_PER_CYCLE) == set(MODE_PRECISION)
    assert MACS_PER_CYCLE["fp32"] == Fraction(1, 4)
    for mode, rate in MACS_PER_CYCLE.items():
        assert rate == Fraction(LANES[mode], STEPS_PER_ELEMENT[mode])
        for depth in (1, 2, 7, 64):
            want = -(-depth // LANES[mode]) * STEPS_PER_ELEMENT[mode]
            assert systolic_steps(depth, rate) == want


@pytest.mark.parametrize("name", sorted(list_specs()))
def test_every_charged_rate_has_rtl_or_a_stated_gap(name):
    spec = load_spec(name)
    spec = getattr(spec, "device", spec)
    rtl = _rtl_rates()
    for prec in spec.compute.array.macs_per_pe_cycle:
        pair = (prec, spec.compute.array.rate(prec))
        assert pair in rtl or pair in WITHOUT_RTL, (
            f"{name}: {prec} at {pair[1]} MACs/PE/cycle has no RTL PE mode (modes: {sorted(LANES)})"
        )


def test_the_default_spec_int8_and_fp16_rates_are_rtl_backed():
    """256 TOPS INT8 and 128 TFLOPS FP16 on wia-npu come from the int8x2 and fp16 modes,
    and its fp32 rate (one MAC per PE every 4 cycles) from the fp32 mode."""
    spec = load_spec("wia-npu")
    rtl = _rtl_rates()
    for prec in ("int8", "fp16", "bf16", "fp32"):
        assert (prec, spec.compute.array.rate(prec)) in rtl


def test_listed_gaps_are_still_gaps():
    """A gap closed in RTL must leave the list (so the list never hides a real mode)."""
    assert not set(WITHOUT_RTL) & _rtl_rates()
