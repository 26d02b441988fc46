"""Stimulus and references for the floating-point MAC (``FpMac``), shared by the
Amaranth-simulator tests (``tests/test_rtl_fp_mac.py``) and the cocotb testbench
(``tb_fp_mac.py``).

Operands are raw bit patterns: ``a`` and ``b`` 16-bit fp16/bf16, ``c`` and the result
32-bit binary32. :func:`reference` runs the golden model
(``wia_hw.emulator.golden.fp_mac_matmul``) once per sample; :func:`exact_fp_mac` is an
independent model of the same arithmetic with exact rationals, used to check the golden
model itself on the corner cases.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from wia_hw.emulator.golden import fp_mac_matmul

__all__ = [
    "LAYOUTS",
    "corner_vectors",
    "corner_vectors_fp32",
    "exact_fp_mac",
    "random_vectors",
    "random_vectors_fp32",
    "reference",
    "to_float32",
]

#: Format -> (exponent bits, fraction bits); binary32 is (8, 23).
LAYOUTS = {"fp16": (5, 10), "bf16": (8, 7), "fp32": (8, 23)}
CANONICAL_NAN = 0x7FC00000


def to_float32(bits: np.ndarray, fmt: str) -> np.ndarray:
    """Raw ``fmt`` bit patterns -> float32 values (exact: both formats embed in binary32)."""
    bits = np.asarray(bits)
    if fmt == "fp16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float32)
    if fmt == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.astype(np.uint32).view(np.float32)


def reference(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, fmt: str, block: int = 128
) -> np.ndarray:
    """``fl32(c + fl32(a * b))`` per sample, as raw uint32 bits, from the golden model.

    Samples go through ``fp_mac_matmul`` in blocks: a ``block x 1`` by ``1 x block``
    product with the accumulators ``c`` on the diagonal, whose diagonal is the per-sample
    result (the off-diagonal entries are discarded)."""
    af, bf, cf = to_float32(a, fmt), to_float32(b, fmt), to_float32(c, "fp32")
    out = np.empty(len(af), np.uint32)
    for lo in range(0, len(af), block):
        hi = min(lo + block, len(af))
        n = hi - lo
        acc = np.zeros((n, n), np.float32)
        acc[np.arange(n), np.arange(n)] = cf[lo:hi]
        res = fp_mac_matmul(af[lo:hi, None], bf[None, lo:hi], fmt, acc)
        out[lo:hi] = np.diagonal(res).view(np.uint32)
    return out


# ---- exact model --------------------------------------------------------------------


def _decode(bits: int, fmt: str) -> tuple[str, int, Fraction]:
    """``(kind, sign, magnitude)`` with kind ``"nan"``, ``"inf"`` or ``"fin"``."""
    exp_bits, frac_bits = LAYOUTS[fmt]
    sign = bits >> (exp_bits + frac_bits) & 1
    field = bits >> frac_bits & ((1 << exp_bits) - 1)
    frac = bits & ((1 << frac_bits) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    if field == (1 << exp_bits) - 1:
        return ("nan" if frac else "inf"), sign, Fraction(0)
    sig = frac if field == 0 else frac | 1 << frac_bits
    return "fin", sign, Fraction(sig) * Fraction(2) ** (max(field, 1) - bias - frac_bits)


def _round_fp32(sign: int, mag: Fraction) -> int:
    """Round ``(-1)**sign * mag`` to binary32, nearest even; overflow gives infinity."""
    if mag == 0:
        return sign << 31
    exp = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** exp > mag:  # now 2**exp <= mag < 2**(exp + 1)
        exp -= 1
    exp = max(exp, -126)
    sig = round(mag / Fraction(2) ** (exp - 23))  # Fraction rounds half to even
    if sig == 1 << 24:
        sig, exp = 1 << 23, exp + 1
    if exp > 127:
        return sign << 31 | 0x7F800000
    if sig < 1 << 23:  # subnormal (exp == -126)
        return sign << 31 | sig
    return sign << 31 | (exp + 127) << 23 | (sig - (1 << 23))


def exact_fp_mac(a: int, b: int, c: int, fmt: str) -> int:
    """``fl32(c + fl32(a * b))`` computed with exact rationals and the IEEE rules of the
    contract (RNE, no flush to zero, canonical NaN); an independent check of the golden
    model."""
    ka, sa, ma = _decode(a, fmt)
    kb, sb, mb = _decode(b, fmt)
    kc, sc, mc = _decode(c, "fp32")
    sp = sa ^ sb
    if "nan" in (ka, kb, kc):
        return CANONICAL_NAN
    if "inf" in (ka, kb):
        if (ka == "fin" and ma == 0) or (kb == "fin" and mb == 0):
            return CANONICAL_NAN  # 0 * inf
        kp, mp = "inf", Fraction(0)
    else:
        kp, sp, mp = _decode(_round_fp32(sp, ma * mb), "fp32")  # may overflow to inf
    if kp == "inf" and kc == "inf":
        return CANONICAL_NAN if sp != sc else sp << 31 | 0x7F800000
    if kp == "inf":
        return sp << 31 | 0x7F800000
    if kc == "inf":
        return c
    total = (-mc if sc else mc) + (-mp if sp else mp)
    if total == 0:
        return _round_fp32(sc & sp, Fraction(0))
    return _round_fp32(int(total < 0), abs(total))


# ---- stimulus -----------------------------------------------------------------------


def _pack(sign: np.ndarray, field: np.ndarray, frac: np.ndarray, fmt: str) -> np.ndarray:
    exp_bits, frac_bits = LAYOUTS[fmt]
    dtype = np.uint32 if fmt == "fp32" else np.uint16
    return (
        (sign.astype(np.uint64) << (exp_bits + frac_bits))
        | (field.astype(np.uint64) << frac_bits)
        | frac.astype(np.uint64)
    ).astype(dtype)


def _random_finite(rng: np.random.Generator, n: int, fmt: str, lo: int, hi: int) -> np.ndarray:
    """Random finite values with exponent field uniform in ``[lo, hi]``."""
    _, frac_bits = LAYOUTS[fmt]
    return _pack(
        rng.integers(0, 2, n), rng.integers(lo, hi + 1, n), rng.integers(0, 1 << frac_bits, n), fmt
    )


def _specials(fmt: str) -> list[int]:
    """Zeros, smallest/largest subnormal, smallest normal, one, largest finite, inf, NaN
    (two payloads), each with both signs."""
    exp_bits, frac_bits = LAYOUTS[fmt]
    top = (1 << exp_bits) - 1
    one = ((1 << (exp_bits - 1)) - 1) << frac_bits
    pos = [
        0,
        1,
        (1 << frac_bits) - 1,
        1 << frac_bits,
        one,
        ((top - 1) << frac_bits) | ((1 << frac_bits) - 1),
        top << frac_bits,
        top << frac_bits | 1 << (frac_bits - 1),
        top << frac_bits | 1,
    ]
    sign = 1 << (exp_bits + frac_bits)
    return pos + [p | sign for p in pos]


def random_vectors(
    fmt: str, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` random ``(a, b, c)`` samples, a mix of: uniform bit patterns; accumulators
    near ``-a*b`` (massive cancellation, carries); accumulators within 30 binades of the
    product (every alignment); products near binary32's subnormal range (bf16) or
    subnormal inputs (fp16); with specials sprinkled into every position."""
    exp_bits, frac_bits = LAYOUTS[fmt]
    top = (1 << exp_bits) - 1
    kind = rng.integers(0, 4, n)
    a = rng.integers(0, 1 << 16, n).astype(np.uint16)
    b = rng.integers(0, 1 << 16, n).astype(np.uint16)
    c = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)

    fin = kind != 0  # kinds 1-3: finite a, b
    a[fin] = _random_finite(rng, int(fin.sum()), fmt, 0, top - 1)
    b[fin] = _random_finite(rng, int(fin.sum()), fmt, 0, top - 1)
    tiny = kind == 3
    if fmt == "bf16":  # exponents summing to just around binary32's subnormal range
        ea = rng.integers(1, 127, n)
        eb = np.clip(127 + rng.integers(-152, -118, n) - (ea - 127), 0, top - 1)
        a[tiny] = _pack(rng.integers(0, 2, n), ea, rng.integers(0, 128, n), fmt)[tiny]
        b[tiny] = _pack(rng.integers(0, 2, n), eb, rng.integers(0, 128, n), fmt)[tiny]
    else:  # subnormal and smallest-normal fp16 inputs
        a[tiny] = _random_finite(rng, int(tiny.sum()), fmt, 0, 2)
    with np.errstate(all="ignore"):
        prod = (to_float32(a, fmt).astype(np.float64) * to_float32(b, fmt)).astype(np.float32)
    pbits = prod.view(np.uint32)
    near = kind == 1  # c = -p (or +p) plus a few ulps
    flip = np.where(rng.random(n) < 0.75, np.uint32(1 << 31), np.uint32(0))
    jitter = rng.integers(-3, 4, n).astype(np.int64)
    c_near = ((pbits.astype(np.int64) ^ flip.astype(np.int64)) + jitter) % (1 << 32)
    c[near] = c_near.astype(np.uint32)[near]
    aligned = (kind == 2) | tiny  # c's exponent near the product's
    pfield = (pbits >> 23 & 0xFF).astype(np.int64)
    cfield = np.clip(pfield + rng.integers(-30, 31, n), 0, 254)
    c_al = _pack(rng.integers(0, 2, n), cfield, rng.integers(0, 1 << 23, n), "fp32")
    c[aligned] = c_al[aligned]
    if fmt == "fp16":  # half of the tiny ones: subnormal / smallest-normal accumulators
        small = tiny & (rng.random(n) < 0.5)
        c[small] = _random_finite(rng, int(small.sum()), "fp32", 0, 2)

    for arr, f in ((a, fmt), (b, fmt), (c, "fp32")):
        pick = rng.random(n) < 0.03
        arr[pick] = rng.choice(np.array(_specials(f), dtype=arr.dtype), int(pick.sum()))
    return a, b, c


def _bits(value: float, fmt: str) -> int:
    """Bit pattern of a value exactly representable in ``fmt``."""
    f32 = int(np.array([value], np.float32).view(np.uint32)[0])
    if fmt == "fp16":
        out = int(np.array([value], np.float16).view(np.uint16)[0])
        if float(np.float16(value)) != value:
            raise ValueError(f"{value!r} is not an fp16 value")
        return out
    if fmt == "bf16":
        if f32 & 0xFFFF:
            raise ValueError(f"{value!r} is not a bf16 value")
        return f32 >> 16
    if float(np.float32(value)) != value:
        raise ValueError(f"{value!r} is not a binary32 value")
    return f32


def corner_vectors(fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Directed ``(a, b, c)`` samples (see the comments); each is also checked against
    :func:`exact_fp_mac` by the tests."""
    cases: list[tuple[int, int, int]] = []
    add = cases.append
    f32 = lambda v: _bits(v, "fp32")  # noqa: E731
    h = lambda v: _bits(v, fmt)  # noqa: E731
    sp16 = _specials(fmt)
    sp32 = _specials("fp32")
    # Every special in every position (signed zeros, subnormals, inf, NaN, extremes).
    for x in sp16:
        for y in sp16:
            for z in (
                sp32[0],
                sp32[1],
                sp32[2],
                sp32[4],
                sp32[6],
                sp32[7],
                sp32[9],
                sp32[10],
                sp32[13],
                sp32[15],
                sp32[16],
            ):
                add((x, y, z))
    # Signed zeros: (+-0 * +-1) + +-0, and x*y + (-x*y) = +0.
    for sa in (0, 1):
        for sc in (0, 1):
            add((h(-0.0 if sa else 0.0), h(1.0), f32(-0.0 if sc else 0.0)))
            add((h(-1.5 if sa else 1.5), h(2.0), f32(3.0 if sa else -3.0)))
    # Ties to even: 1 + 2**-24 -> 1; (1 + 2**-23) + 2**-24 -> 1 + 2**-22; just above a tie.
    half_ulp = (h(2.0**-12), h(2.0**-12))
    add((*half_ulp, f32(1.0)))
    add((*half_ulp, f32(-1.0)))
    add((*half_ulp, f32(1.0 + 2.0**-23)))
    add((h(2.0**-12), h(2.0**-12 + 2.0**-18), f32(1.0)))
    add((h(3 * 2.0**-14), h(2.0**-11), f32(1.0)))  # 1 + 0.75 ulp -> 1 + 1 ulp
    # Massive cancellation: c = -(a*b) + one ulp of c, both signs.
    add((h(1.5), h(1.25), f32(-1.875) + 1))
    add((h(-1.5), h(1.25), f32(1.875) + 1))
    add((h(1.0 + 2.0**-7), h(1.0 - 2.0**-8), f32(-1.0)))
    # Overflow of the sum (and of the product, for bf16): max * max, +- max binary32.
    big = sp16[5]
    add((big, big, sp32[5]))
    add((big, big | 0x8000, sp32[5] | 1 << 31))
    add((big, big, sp32[6] | 1 << 31))  # +big*big + -inf
    add((h(2.0), h(1.0), sp32[5]))  # 2 + max -> max
    if fmt == "bf16":  # max + 2**103 (half an ulp of max): tie, to even (inf)
        add((h(2.0**103), h(1.0), sp32[5]))
        add((h(2.0**103), h(-1.0), sp32[5] | 1 << 31))
    else:  # max + 2**20, far below half an ulp: max
        add((h(2.0**10), h(2.0**10), sp32[5]))
    if fmt == "bf16":
        # Products underflowing into (or through) binary32's subnormal range.
        add((h(2.0**-70), h(2.0**-70), f32(0.0)))  # 2**-140, subnormal
        add((h(2.0**-75), h(2.0**-75), f32(0.0)))  # 2**-150: tie -> +0
        add((h(-(2.0**-75)), h(2.0**-75), f32(0.0)))  # -> -0, + (+0) = +0
        add((h(-(2.0**-75)), h(2.0**-75), f32(-0.0)))  # -> -0 + -0 = -0
        add((h(1.5 * 2.0**-75), h(2.0**-75), f32(0.0)))  # 1.5 * 2**-150 -> 2**-149
        add((h(2.0**-75), h(2.0**-75), f32(2.0**-149)))  # round(p) = 0, not 2**-149 + p
        add((h(1.5 * 2.0**-75), h(2.0**-75), f32(2.0**-149)))
        add((h(1.9921875 * 2.0**-75), h(2.0**-75), f32(0.0)))  # -> 2**-149
        add((h(1.5 * 2.0**-74), h(2.0**-75), f32(0.0)))  # 1.5 * 2**-149: tie -> 2**-148
        add((h(1.25 * 2.0**-64), h(1.5 * 2.0**-64), f32(0.0)))  # 1.875 * 2**-128, exact
        add((h(2.0**-100), h(2.0**-100), f32(1.0)))  # underflows to 0 entirely
        add((h(2.0**64), h(2.0**64), f32(-float(np.finfo(np.float32).max))))
        add((h(2.0**64), h(-(2.0**64)), f32(float("inf"))))
    a, b, c = zip(*cases, strict=True)
    return (np.array(a, np.uint16), np.array(b, np.uint16), np.array(c, np.uint32))


# ---- binary32 operands (the fp32 PE mode, ``Fp32Mac``) -------------------------------


def _f32(value: float) -> int:
    return _bits(value, "fp32")


def random_vectors_fp32(
    n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` random binary32 ``(a, b, c)`` samples (uint32 each), a mix of: uniform bit
    patterns; accumulators near ``-a*b`` (massive cancellation); accumulators within 30
    binades of the product; products around binary32's subnormal range (and subnormal
    inputs); products around its overflow threshold; short significands (13 bits), whose
    48-bit products are often exact ties at the rounding point; specials sprinkled in."""
    kind = rng.integers(0, 6, n)
    u32 = lambda: rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)  # noqa: E731
    sign = lambda: rng.integers(0, 2, n)  # noqa: E731
    frac = lambda: rng.integers(0, 1 << 23, n)  # noqa: E731
    a, b, c = u32(), u32(), u32()
    fin = kind != 0
    a[fin] = _random_finite(rng, int(fin.sum()), "fp32", 1, 254)
    b[fin] = _random_finite(rng, int(fin.sum()), "fp32", 1, 254)
    # products near the subnormal range: (ea - 127) + (eb - 127) in [-152, -118]
    ea = rng.integers(1, 255, n)
    eb_tiny = np.clip(254 + rng.integers(-152, -118, n) - ea, 0, 254)
    tiny = kind == 3
    a[tiny] = _pack(sign(), ea, frac(), "fp32")[tiny]
    b[tiny] = _pack(sign(), eb_tiny, frac(), "fp32")[tiny]
    sub = tiny & (rng.random(n) < 0.3)  # subnormal a (times a large b)
    a[sub] = _pack(sign(), np.zeros(n, np.int64), frac(), "fp32")[sub]
    b[sub] = _pack(sign(), rng.integers(127, 255, n), frac(), "fp32")[sub]
    # products near the overflow threshold: (ea - 127) + (eb - 127) in [124, 130]
    huge = kind == 4
    ea_h = rng.integers(128, 255, n)
    eb_h = np.clip(254 + rng.integers(124, 131, n) - ea_h, 1, 254)
    a[huge] = _pack(sign(), ea_h, frac(), "fp32")[huge]
    b[huge] = _pack(sign(), eb_h, frac(), "fp32")[huge]
    short = kind == 5  # 13-bit significands: products of 26 bits, ties at the cut
    a[short] &= np.uint32(0xFFFFF800)
    b[short] &= np.uint32(0xFFFFF800)
    with np.errstate(all="ignore"):
        prod = (a.view(np.float32) * b.view(np.float32)).astype(np.float32)
    pbits = prod.view(np.uint32)
    near = kind == 1
    flip = np.where(rng.random(n) < 0.75, np.uint32(1 << 31), np.uint32(0))
    jitter = rng.integers(-3, 4, n).astype(np.int64)
    c_near = ((pbits.astype(np.int64) ^ flip.astype(np.int64)) + jitter) % (1 << 32)
    c[near] = c_near.astype(np.uint32)[near]
    aligned = (kind == 2) | tiny | short
    pfield = (pbits >> 23 & 0xFF).astype(np.int64)
    c_al = _pack(sign(), np.clip(pfield + rng.integers(-30, 31, n), 0, 254), frac(), "fp32")
    c[aligned] = c_al[aligned]
    zero_c = short & (rng.random(n) < 0.5)  # the rounded product alone
    c[zero_c] = 0
    zeros = tiny & (rng.random(n) < 0.25)  # +-0 * b + -0: the sign of an exact zero
    a[zeros] = (sign().astype(np.uint32) << 31)[zeros]
    c[zeros] = np.uint32(1 << 31)
    for arr in (a, b, c):
        pick = rng.random(n) < 0.03
        arr[pick] = rng.choice(np.array(_specials("fp32"), dtype=np.uint32), int(pick.sum()))
    return a, b, c


def corner_vectors_fp32(full: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Directed binary32 ``(a, b, c)`` samples: every special in the ``a`` and ``b``
    positions, with every accumulator special (``full``) or one of them in turn; then
    product rounding (ties, a carry to the next binade, into and out of the subnormal
    range, overflow after rounding), signed zeros and cancellation."""
    sp = _specials("fp32")
    cs = [sp[i] for i in (0, 1, 2, 4, 6, 7, 9, 10, 13, 15, 16)]
    cases: list[tuple[int, int, int]] = []
    n = 0
    for x in sp:
        for y in sp:
            for z in cs if full else [cs[n % len(cs)]]:
                cases.append((x, y, z))
            n += 1
    f = _f32
    two25m1 = (31.0, 1082401.0)  # 31 * 1082401 = 2**25 - 1
    for za in (0.0, -0.0, 1.0, -(2.0**25)):
        cases.append((f(two25m1[0]), f(two25m1[1]), f(za)))  # rounds (tie) up to 2**25
    cases += [
        (f(31.0 * 2.0**60), f(1082401.0 * 2.0**43), f(0.0)),  # -> 2**128: overflow
        (f(31.0 * 2.0**-80), f(1082401.0 * 2.0**-71), f(0.0)),  # -> 2**-126, normal
        (f(1.0 + 2.0**-12), f(1.0 + 2.0**-12), f(0.0)),  # tie, to even (down)
        (f(1.0 + 2.0**-12), f(1.0 + 2.0**-12 + 2.0**-23), f(0.0)),  # above the tie
        (f(2.0**-75), f(2.0**-75), f(2.0**-149)),  # product rounds to 0 first
        (f(1.5 * 2.0**-75), f(2.0**-75), f(0.0)),  # 1.5 * 2**-150 -> 2**-149
        (f(2.0**-149), f(1024.0), f(0.0)),  # subnormal x normal, exact
        (f(2.0**-149), f(-(2.0**-149)), f(-0.0)),  # underflows to -0; -0 + -0
        (f(1.5), f(-2.0), f(3.0)),  # exact cancellation -> +0
        (f(3.0), f(float(np.float32(1 / 3))), f(-1.0)),  # cancellation, tiny remainder
        (f(2.0**64), f(2.0**64), f(float("inf"))),  # product overflows, + inf
        (f(2.0**64), f(2.0**64), f(-float("inf"))),  # inf - inf
    ]
    a, b, c = zip(*cases, strict=True)
    return tuple(np.array(v, np.uint32) for v in (a, b, c))  # type: ignore[return-value]
