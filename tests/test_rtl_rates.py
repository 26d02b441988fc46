"""Every per-PE rate the emulator charges on a shipped spec has an RTL PE mode behind it.

A spec's ``compute.array.macs_per_pe_cycle`` maps a precision to MACs per PE per cycle;
the RTL's PE modes (``wia_hw.rtl.pe.PRECISIONS``) perform ``LANES[mode]`` MACs per cycle.
A (precision, rate) pair with no mode is listed in ``WITHOUT_RTL`` with the reason, so the
gap is visible and a new spec cannot add one silently.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from wia_hw.rtl.pe import LANES

from wia_hw.spec import list_specs, load_spec

#: RTL PE mode -> the emulator precision it computes.
MODE_PRECISION = {"int8": "int8", "int8x2": "int8", "fp16": "fp16", "bf16": "bf16"}
#: (precision, MACs/PE/cycle) pairs shipped without RTL, and why.
WITHOUT_RTL = {
    ("fp32", Fraction(1, 4)): "TODO(#8): no fp32 PE mode yet (one fp32 MAC every 4 cycles)",
}


def _rtl_rates() -> set[tuple[str, Fraction]]:
    return {(MODE_PRECISION[m], Fraction(n)) for m, n in LANES.items()}


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
    """256 TOPS INT8 and 128 TFLOPS FP16 on wia-npu come from the int8x2 and fp16 modes."""
    spec = load_spec("wia-npu")
    rtl = _rtl_rates()
    for prec in ("int8", "fp16", "bf16"):
        assert (prec, spec.compute.array.rate(prec)) in rtl


def test_listed_gaps_are_still_gaps():
    """A gap closed in RTL must leave the list (so the list never hides a real mode)."""
    assert not set(WITHOUT_RTL) & _rtl_rates()
