# amaranth: UnusedElaboratable=no
"""Amaranth-simulator tests of ``FpMac`` and ``Fp32Mac``: bit-exact against the golden
model (``golden.fp_mac_matmul``) on directed corner cases and random samples per format;
the golden model itself is checked against exact rational arithmetic. Stimulus and
references: ``tests/rtl/fp_vectors.py`` (shared with the cocotb testbench
``tb_fp_mac.py``). The fp32 PE mode in the array (bit-exact, cycle-exact, counters) is
checked at the end with the sequence driver of ``test_rtl_sim.py``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import Shape
from amaranth.sim import Simulator
from wia_hw.emulator.counters import Counter
from wia_hw.emulator.cycles import systolic_steps, systolic_tile_cycles
from wia_hw.emulator.golden import FP_FORMATS as GOLDEN_FORMATS
from wia_hw.emulator.golden import fp_mac_matmul
from wia_hw.rtl import SystolicArray
from wia_hw.rtl.fp_mac import (
    FP32_CANONICAL_NAN,
    FP32_PASSES,
    FP32_SLICE_BITS,
    FP_FORMATS,
    Fp32Mac,
    FpMac,
)

sys.path.insert(0, str(Path(__file__).resolve().parent / "rtl"))
from fp_vectors import (  # noqa: E402
    CANONICAL_NAN,
    corner_vectors,
    corner_vectors_fp32,
    exact_fp_mac,
    random_vectors,
    random_vectors_fp32,
    reference,
    to_float32,
)
from test_rtl_sim import check_sequence, run_sequence  # noqa: E402  (the sequence driver)
from tiles import make_tile  # noqa: E402

#: The formats of the combinational unit ``FpMac``; ``Fp32Mac`` takes binary32.
FP16_FORMATS = FP_FORMATS[:2]

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
    assert FP16_FORMATS == ("fp16", "bf16")
    for fmt in FP16_FORMATS:
        dut = FpMac(fmt)
        assert dut.fmt == fmt
        assert {
            name: (m.flow.name, Shape.cast(m.shape).width)
            for name, m in dut.signature.members.items()
        } == {"a": ("In", 16), "b": ("In", 16), "c": ("In", 32), "y": ("Out", 32)}


@pytest.mark.parametrize("fmt", FP16_FORMATS)
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


@pytest.mark.parametrize("fmt", FP16_FORMATS)
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
        # exact for fp16/bf16; for fp32 within 2**-53 relative (the range checks below)
        exact = af.astype(np.float64) * bf.astype(np.float64)
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


@pytest.mark.parametrize("fmt", FP16_FORMATS)
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


# ---- Fp32Mac: binary32 operands, one MAC per 4 cycles -----------------------------------

#: Random fp32 samples through the RTL (4 clock cycles each, ~200 samples/s of CPU).
N_RANDOM_FP32 = 1500


def simulate_fp32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``y`` of ``Fp32Mac`` in the phase-3 cycle of each sample, the samples back to back
    (each holds ``a``, ``b``, ``c`` for its four passes)."""
    dut = Fp32Mac()
    out: list[int] = []

    async def testbench(ctx: object) -> None:
        for x, y, z in zip(a.tolist(), b.tolist(), c.tolist(), strict=True):
            ctx.set(dut.a, x)
            ctx.set(dut.b, y)
            ctx.set(dut.c, z)
            for phase in range(FP32_PASSES):
                ctx.set(dut.phase, phase)
                if phase == FP32_PASSES - 1:
                    out.append(ctx.get(dut.y))
                await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return np.array(out, np.uint32)


def test_fp32_unit_ports_and_rate() -> None:
    """Four passes of a 6-bit slice cover the 24-bit significand: one MAC per 4 cycles,
    the 0.25 MACs/PE/cycle the emulator charges for fp32."""
    assert FP32_PASSES * FP32_SLICE_BITS == 24
    dut = Fp32Mac()
    assert dut.fmt == "fp32"
    assert {
        name: (m.flow.name, Shape.cast(m.shape).width) for name, m in dut.signature.members.items()
    } == {
        "a": ("In", 32),
        "b": ("In", 32),
        "c": ("In", 32),
        "phase": ("In", 2),
        "y": ("Out", 32),
    }


def test_fp32_golden_model_is_exact_ieee() -> None:
    """The golden model with binary32 inputs (two roundings: the product, then the sum)
    equals exact rational arithmetic on every corner (every special x special x
    accumulator special, product ties, carries, underflow, overflow) and on random
    samples of every kind."""
    a, b, c = corner_vectors_fp32()
    ra, rb, rc = random_vectors_fp32(3000, np.random.default_rng(32))
    a, b, c = np.concatenate([a, ra]), np.concatenate([b, rb]), np.concatenate([c, rc])
    exact = np.array(
        [exact_fp_mac(int(x), int(y), int(z), "fp32") for x, y, z in zip(a, b, c, strict=True)],
        np.uint32,
    )
    assert_bit_exact("fp32", a, b, c, reference(a, b, c, "fp32"), exact)


def _f32(v: float) -> int:
    return int(np.array([v], np.float32).view(np.uint32)[0])


# (a, b, c, y, why): golden values from the arithmetic; 31 * 1082401 = 2**25 - 1.
NAMED_FP32 = [
    (_f32(1.0), _f32(1.0), _f32(1.0), _f32(2.0), "1*1 + 1 = 2"),
    (_f32(1.5), _f32(-2.0), _f32(3.0), 0x00000000, "1.5*-2 + 3 = +0"),
    (
        _f32(1 + 2.0**-12),
        _f32(1 + 2.0**-12),
        0,
        _f32(1 + 2.0**-11),
        "(1+2**-12)**2 = 1 + 2**-11 + 2**-24: a tie, to even (down)",
    ),
    (_f32(31.0), _f32(1082401.0), 0, _f32(2.0**25), "2**25 - 1: 25 ones, tie, carry to 2**25"),
    (
        _f32(31 * 2.0**60),
        _f32(1082401 * 2.0**43),
        0,
        0x7F800000,
        "(2**25 - 1) * 2**103 rounds to 2**128: overflow after rounding",
    ),
    (
        _f32(31 * 2.0**-80),
        _f32(1082401 * 2.0**-71),
        0,
        0x00800000,
        "2**-126 - 2**-151 rounds up to the smallest normal",
    ),
    (
        _f32(2.0**-75),
        _f32(2.0**-75),
        0x00000001,
        0x00000001,
        "2**-150 rounds to 0 before the add (fused would give 2**-148)",
    ),
    (0x00000001, _f32(1024.0), 0, 1 << 10, "2**-149 * 2**10 = 2**-139, exact subnormal"),
    (0x80000001, 0x00000001, 0x80000000, 0x80000000, "-2**-298 -> -0; -0 + -0 = -0"),
    (0x80000001, 0x00000001, 0x00000000, 0x00000000, "-2**-298 -> -0; -0 + +0 = +0"),
    (0x7F7FFFFF, 0x7F7FFFFF, 0xFF800000, 0x7FC00000, "max*max = +inf; + -inf = NaN"),
    (0x7F7FFFFF, _f32(-1.0), 0x7F7FFFFF, 0x00000000, "max*-1 + max = +0"),
    (0x7F800000, 0x00000000, 0, 0x7FC00000, "inf * 0 = NaN"),
    (0x7FC12345, _f32(1.0), 0, 0x7FC00000, "NaN payload -> canonical NaN"),
    (_f32(1.0), _f32(1.0), 0x7F7FFFFF, 0x7F7FFFFF, "max + 1 = max"),
]


def test_fp32_named_cases() -> None:
    a, b, c, want, why = zip(*NAMED_FP32, strict=True)
    a, b, c = (np.array(v, np.uint32) for v in (a, b, c))
    got = simulate_fp32(a, b, c)
    for i, reason in enumerate(why):
        assert got[i] == want[i], f"fp32 {reason}: y={got[i]:08x}, expected {want[i]:08x}"
    assert_bit_exact("fp32", a, b, c, got, reference(a, b, c, "fp32"))


def test_fp32_bit_exact_against_golden() -> None:
    """Every special x special (the accumulator rotating through the specials), the
    directed product-rounding corners and ``N_RANDOM_FP32`` random samples, back to back
    (so the partial-product register restarts at every pass 0)."""
    ca, cb, cc = corner_vectors_fp32(full=False)
    ra, rb, rc = random_vectors_fp32(N_RANDOM_FP32, np.random.default_rng(2032))
    a, b, c = np.concatenate([ca, ra]), np.concatenate([cb, rb]), np.concatenate([cc, rc])
    got = simulate_fp32(a, b, c)
    assert_bit_exact("fp32", a, b, c, got, reference(a, b, c, "fp32"))
    seen = _coverage("fp32", a, b, c, got)
    missing = {k: v for k, v in seen.items() if v < 20}
    assert not missing, f"fp32: the stimulus rarely reaches {missing}"


# ---- the fp32 PE mode in the array -------------------------------------------------------


@pytest.mark.parametrize("dataflow", ["os", "ws"])
@pytest.mark.parametrize("pipelined", [False, True])
def test_array_fp32_mode(dataflow: str, pipelined: bool) -> None:
    """fp32 on a 2x3 array: random binary32 tiles (specials, subnormals, overflow) back
    to back with stalls: bit-exact against ``golden.fp_mac_matmul(..., "fp32")``; every
    tile ``systolic_tile_cycles(systolic_steps(depth, 0.25))`` (4 steps per element);
    the issue rule and the counters (MACs = rows * cols * depth, busy in every pass)."""
    rng = np.random.default_rng(32 + 2 * pipelined + (dataflow == "ws"))
    dut = SystolicArray(2, 3, dataflow, max_depth=8, pipelined=pipelined, precision="fp32")
    tiles = [make_tile(rng, 2, 3, dataflow, "fp32", d) for d in (1, 5, 3, 2)]
    counters, in_win = run_sequence(dut, tiles, stall_cycles=frozenset({4, 9, 30, 31}))
    check_sequence(dut, tiles, counters, in_win)
    for t in tiles:
        assert t.steps == systolic_steps(t.depth, 0.25) == 4 * t.depth
        assert t.done - t.accept >= systolic_tile_cycles(dataflow, 2, 3, 4 * t.depth)
    assert counters[Counter.MACS] == 2 * 3 * sum(t.depth for t in tiles)


def test_array_fp32_expected_values_are_the_golden_model() -> None:
    """The tile expectations the array tests use are ``fp_mac_matmul`` of the operands
    (os: A @ B with k in order), so the array is held to the golden model itself."""
    rng = np.random.default_rng(5)
    t = make_tile(rng, 2, 2, "os", "fp32", 6)
    a = np.array(t.a_steps, np.uint32).T.view(np.float32)  # rows x K
    b = np.array(t.b_steps, np.uint32).view(np.float32)  # K x cols
    want = fp_mac_matmul(a, b, "fp32").view(np.uint32)
    assert t.expected == [[int(v) for v in row] for row in want]


def test_fp32_counter_contract() -> None:
    """An fp32 tile of K elements streams 4K steps: MACS counts K per PE, and the
    element count may divide the steps (not only exceed them); the counter block's
    ``busy`` input (fp32: busy in every pass) is a checked bool."""
    from wia_hw.emulator.cycles import systolic_tile_counters
    from wia_hw.rtl import PerfCounters

    got = systolic_tile_counters("os", 2, 3, systolic_steps(5, 0.25), elements=5)
    assert got[Counter.MACS] == 2 * 3 * 5
    assert got[Counter.BUSY_CYCLES] == 4 * 5 + 2 + 3 - 2
    with pytest.raises(ValueError, match=r"elements \(3\) must be at least depth \(20\)"):
        systolic_tile_counters("os", 2, 3, 20, elements=3)
    assert "busy" in PerfCounters(busy_port=True).signature.members
    assert "busy" not in PerfCounters().signature.members
    with pytest.raises(TypeError, match=r"^busy_port must be a bool, got 1$"):
        PerfCounters(busy_port=1)  # type: ignore[arg-type]
