# amaranth: UnusedElaboratable=no
"""Amaranth-simulator tests of ``FpMac``: bit-exact against the golden model
(``golden.fp_mac_matmul``) on directed corner cases and tens of thousands of random
samples per format; the golden model itself is checked against exact rational
arithmetic on the corner cases. Stimulus and references: ``tests/rtl/fp_vectors.py``
(shared with the cocotb testbench ``tb_fp_mac.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import Shape
from amaranth.sim import Simulator
from wia_hw.emulator.golden import FP_FORMATS as GOLDEN_FORMATS
from wia_hw.rtl.fp_mac import FP32_CANONICAL_NAN, FP_FORMATS, FpMac

sys.path.insert(0, str(Path(__file__).resolve().parent / "rtl"))
from fp_vectors import (  # noqa: E402
    CANONICAL_NAN,
    corner_vectors,
    exact_fp_mac,
    random_vectors,
    reference,
    to_float32,
)

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

#: Random samples per format (~3000 samples/s of CPU in Amaranth's simulator).
N_RANDOM = 16384


def simulate(fmt: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``y`` of ``FpMac(fmt)`` for every sample, from one testbench process."""
    dut = FpMac(fmt)
    out: list[int] = []

    async def testbench(ctx: object) -> None:
        for x, y, z in zip(a.tolist(), b.tolist(), c.tolist(), strict=True):
            ctx.set(dut.a, x)
            ctx.set(dut.b, y)
            ctx.set(dut.c, z)
            out.append(ctx.get(dut.y))

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()
    return np.array(out, np.uint32)


def assert_bit_exact(
    fmt: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, got: np.ndarray, want: np.ndarray
) -> None:
    bad = np.flatnonzero(got != want)
    shown = "; ".join(
        f"a={a[i]:04x} b={b[i]:04x} c={c[i]:08x}: y={got[i]:08x}, golden {want[i]:08x}"
        for i in bad[:6]
    )
    assert bad.size == 0, f"{fmt}: {bad.size} of {len(got)} samples differ: {shown}"


def test_constructor_checks_fmt() -> None:
    with pytest.raises(ValueError, match=r"^fmt must be one of 'fp16', 'bf16', got 'fp32'$"):
        FpMac("fp32")
    with pytest.raises(TypeError, match=r"^fmt must be a string, got 16$"):
        FpMac(16)  # type: ignore[arg-type]


def test_contract_constants_and_ports() -> None:
    assert FP_FORMATS == GOLDEN_FORMATS
    assert FP32_CANONICAL_NAN == CANONICAL_NAN == 0x7FC00000
    for fmt in FP_FORMATS:
        dut = FpMac(fmt)
        assert dut.fmt == fmt
        assert {
            name: (m.flow.name, Shape.cast(m.shape).width)
            for name, m in dut.signature.members.items()
        } == {"a": ("In", 16), "b": ("In", 16), "c": ("In", 32), "y": ("Out", 32)}


@pytest.mark.parametrize("fmt", FP_FORMATS)
def test_golden_model_is_exact_ieee(fmt: str) -> None:
    """The golden model (numpy binary32 arithmetic) equals exact rational arithmetic
    rounded by the contract's rules on every corner case and on random samples. This
    also catches a process running with flush-to-zero / denormals-are-zero set."""
    a, b, c = corner_vectors(fmt)
    ra, rb, rc = random_vectors(fmt, 1500, np.random.default_rng(7))
    a, b, c = np.concatenate([a, ra]), np.concatenate([b, rb]), np.concatenate([c, rc])
    exact = np.array(
        [exact_fp_mac(int(x), int(y), int(z), fmt) for x, y, z in zip(a, b, c, strict=True)],
        np.uint32,
    )
    assert_bit_exact(fmt, a, b, c, reference(a, b, c, fmt), exact)


# (a, b, c, y, why): golden values written from the arithmetic, not from a model.
NAMED = {
    "fp16": [
        (0x3C00, 0x3C00, 0x3F800000, 0x40000000, "1*1 + 1 = 2"),
        (0x3E00, 0xC000, 0x40400000, 0x00000000, "1.5*-2 + 3 = +0 (RNE)"),
        (0x8000, 0x3C00, 0x80000000, 0x80000000, "-0*1 + -0 = -0"),
        (0x8000, 0x3C00, 0x00000000, 0x00000000, "-0*1 + +0 = +0"),
        (0x0001, 0x0001, 0x00000000, (127 - 48) << 23, "2**-24 * 2**-24 = 2**-48, exact"),
        (
            0x7BFF,
            0x7BFF,
            0x00000000,
            158 << 23 | (2047**2 << 2) - (1 << 23),
            "65504**2 = 2047**2 * 2**10 (22-bit significand, exponent 31), exact",
        ),
        (0x0C00, 0x0C00, 0x3F800000, 0x3F800000, "1 + 2**-24: tie, to even (1)"),
        (0x0C00, 0x0C00, 0x3F800001, 0x3F800002, "(1 + 2**-23) + 2**-24: tie, to even"),
        (0x7C00, 0x0000, 0x00000000, 0x7FC00000, "inf * 0 = NaN"),
        (0x7C00, 0x3C00, 0xFF800000, 0x7FC00000, "inf - inf = NaN"),
        (0xFC00, 0x3C00, 0xFF800000, 0xFF800000, "-inf + -inf = -inf"),
        (0x7E01, 0x3C00, 0x00000000, 0x7FC00000, "NaN payload -> canonical NaN"),
        (0x3C00, 0x3C00, 0xFFC12345, 0x7FC00000, "negative NaN accumulator -> canonical"),
        (0x0000, 0x3C00, 0x00000001, 0x00000001, "0 + 2**-149 keeps the subnormal"),
        (0x3C00, 0x3C00, 0x7F7FFFFF, 0x7F7FFFFF, "max + 1 = max"),
    ],
    "bf16": [
        (0x3F80, 0x3F80, 0x3F800000, 0x40000000, "1*1 + 1 = 2"),
        (0x1A00, 0x1A00, 0x00000000, 0x00000000, "2**-75 * 2**-75 = 2**-150: tie, to +0"),
        (0x9A00, 0x1A00, 0x80000000, 0x80000000, "-2**-150 -> -0; -0 + -0 = -0"),
        (0x9A00, 0x1A00, 0x00000000, 0x00000000, "-2**-150 -> -0; -0 + +0 = +0"),
        (0x1A40, 0x1A00, 0x00000001, 0x00000002, "1.5 * 2**-150 -> 2**-149, + 2**-149"),
        (0x1A00, 0x1A00, 0x00000001, 0x00000001, "product rounds to 0 first: 2**-149 stays"),
        (0x1C80, 0x1C80, 0x00000000, 1 << 9, "2**-70 * 2**-70 = 2**-140 = 2**9 * 2**-149"),
        (0x5F80, 0x5F80, 0xFF7FFFFF, 0x7F800000, "2**64 * 2**64 overflows: inf + -max = inf"),
        (0x5F80, 0x5F80, 0xFF800000, 0x7FC00000, "overflowed product + -inf = NaN"),
        (0x7F7F, 0x3F80, 0x7F7F0000, 0x7F800000, "max_bf16 * 1 + max_bf16 overflows"),
        (0x7F80, 0x0000, 0x3F800000, 0x7FC00000, "inf * 0 = NaN"),
        (0xFF80, 0xBF80, 0x3F800000, 0x7F800000, "-inf * -1 + 1 = inf"),
    ],
}


@pytest.mark.parametrize("fmt", FP_FORMATS)
def test_named_cases(fmt: str) -> None:
    a, b, c, want, why = zip(*NAMED[fmt], strict=True)
    a, b, c = np.array(a, np.uint16), np.array(b, np.uint16), np.array(c, np.uint32)
    got = simulate(fmt, a, b, c)
    for i, reason in enumerate(why):
        assert got[i] == want[i], f"{fmt} {reason}: y={got[i]:08x}, expected {want[i]:08x}"
    assert_bit_exact(fmt, a, b, c, got, reference(a, b, c, fmt))


def _coverage(
    fmt: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, y: np.ndarray
) -> dict[str, int]:
    """How many samples exercise each path the stimulus is meant to reach."""
    af, bf, cf = to_float32(a, fmt), to_float32(b, fmt), to_float32(c, "fp32")
    yf = y.view(np.float32)
    finite = np.isfinite(af) & np.isfinite(bf) & np.isfinite(cf) & np.isfinite(yf)
    with np.errstate(all="ignore"):
        exact = af.astype(np.float64) * bf.astype(np.float64)  # exact for both formats
        big = np.maximum(np.abs(exact), np.abs(cf.astype(np.float64)))
        tiny32 = 2.0**-126
        return {
            "nan": int((y == CANONICAL_NAN).sum()),
            "inf": int(((y & 0x7FFFFFFF) == 0x7F800000).sum()),
            "signed zero": int((y == 0x80000000).sum()),
            "subnormal result": int(((((y >> 23) & 0xFF) == 0) & ((y & 0x7FFFFF) != 0)).sum()),
            "cancellation >= 2**-20": int(
                (finite & (yf != 0) & (np.abs(yf) < big * 2.0**-20)).sum()
            ),
            "exact cancellation": int((finite & (yf == 0) & (big != 0)).sum()),
            "product below 2**-126": int((finite & (exact != 0) & (np.abs(exact) < tiny32)).sum()),
            "product overflow": int(
                (
                    np.isfinite(af) & np.isfinite(bf) & (np.abs(exact) > np.finfo(np.float32).max)
                ).sum()
            ),
        }


@pytest.mark.parametrize("fmt", FP_FORMATS)
def test_bit_exact_against_golden(fmt: str) -> None:
    """Every directed corner (every special in every position, signed zeros, ties,
    cancellation, underflow, overflow) and ``N_RANDOM`` random samples."""
    ca, cb, cc = corner_vectors(fmt)
    ra, rb, rc = random_vectors(fmt, N_RANDOM, np.random.default_rng(2024))
    a, b, c = np.concatenate([ca, ra]), np.concatenate([cb, rb]), np.concatenate([cc, rc])
    got = simulate(fmt, a, b, c)
    assert_bit_exact(fmt, a, b, c, got, reference(a, b, c, fmt))
    seen = _coverage(fmt, a, b, c, got)
    wanted = {k: 20 for k in seen}
    if fmt == "fp16":  # fp16 products are exact binary32 normals
        wanted["product below 2**-126"] = wanted["product overflow"] = 0
    missing = {k: v for k, v in seen.items() if v < wanted[k]}
    assert not missing, f"{fmt}: the stimulus rarely reaches {missing}"
