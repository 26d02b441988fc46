"""Golden (bit-exact reference) models shared by the emulator and the RTL testbenches.

One model per block: the emulator's functional mode computes with these, and the
cocotb testbenches check the RTL against these, so the two can never drift apart.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ACC_BITS",
    "wrap_int32",
    "int8_matmul",
    "round_to_bf16",
    "round_to_precision",
    "float_matmul",
    "FP_FORMATS",
    "fp_mac_matmul",
]

#: Width of a PE accumulator. Overflow wraps (two's complement), it does not saturate:
#: a K-long int8 dot product fits in int32 for K <= 2**17 (127*128*K < 2**31), so
#: wrapping only happens beyond that, and wrapping keeps tiled accumulation associative.
ACC_BITS = 32


def wrap_int32(x: np.ndarray) -> np.ndarray:
    """Reduce integers modulo 2**32 into int32, as the PE accumulator does."""
    x = np.asarray(x, dtype=np.int64)
    return ((x + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def _check_matmul_shapes(a: np.ndarray, b: np.ndarray) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul shapes do not agree: A {a.shape} x B {b.shape}")


def int8_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int8 x int8 -> int32 matrix product with wrapping accumulation.

    ``a`` is M x K, ``b`` is K x N, both int8 (values in [-128, 127]). Exact: products
    are summed in int64 and wrapped to int32 once, which equals wrapping after every
    MAC because addition modulo 2**32 is associative.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    _check_matmul_shapes(a, b)
    for name, m in (("A", a), ("B", b)):
        if m.size and (m.min() < -128 or m.max() > 127):
            raise ValueError(f"{name} has values outside int8 [-128, 127]")
    return wrap_int32(a.astype(np.int64) @ b.astype(np.int64))


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (round to nearest even), returned as float32."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.reshape(-1).view(np.uint32).astype(np.uint64)  # 1-D: a 0-d input too
    rounding = ((bits >> 16) & 1) + 0x7FFF
    out = ((bits + rounding) >> 16 << 16).astype(np.uint32)
    out[np.isnan(f.reshape(-1))] = 0x7FC00000
    return out.view(np.float32).reshape(f.shape)


def round_to_precision(x: np.ndarray, precision: str) -> np.ndarray:
    """Round values to a storage precision, returned as float32 (``int8`` is rejected)."""
    if precision == "fp32":
        return np.asarray(x, dtype=np.float32)
    if precision == "fp16":
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)
    if precision == "bf16":
        return round_to_bf16(x)
    raise ValueError(f"precision must be fp32, fp16 or bf16, got {precision!r}")


def float_matmul(a: np.ndarray, b: np.ndarray, precision: str) -> np.ndarray:
    """Matrix product with inputs rounded to ``precision`` and float32 accumulation.

    The array accumulates in float32 along K; numpy's float32 product sums in a
    different order, so results agree with the hardware to float32 rounding (relative
    error below ``K * 2**-24``), not bit for bit.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    _check_matmul_shapes(a, b)
    return round_to_precision(a, precision) @ round_to_precision(b, precision)


#: Input formats of the floating-point PE modes (binary32 accumulation in each).
FP_FORMATS = ("fp16", "bf16", "fp32")

_CANONICAL_NAN = np.uint32(0x7FC00000)


def fp_mac_matmul(
    a: np.ndarray, b: np.ndarray, fmt: str, acc: np.ndarray | None = None
) -> np.ndarray:
    """The floating-point PE's arithmetic over a whole tile: ``fmt`` inputs, fp32
    accumulation, bit-exact with the RTL.

    ``a`` is M x K and ``b`` K x N, float32 arrays whose values are representable in
    ``fmt`` (``fp16``, ``bf16`` or ``fp32``; :func:`round_to_precision` makes them so).
    Every
    output accumulates in the RTL's order, ``k = 0, 1, ..., K-1``, starting from ``acc``
    (zeros if ``None``)::

        p   = fl32(a[i, k] * b[k, j])      # exact for fp16; rounded for bf16 and fp32
        acc = fl32(acc + p)                # IEEE-754 binary32, round to nearest even

    Two roundings per MAC (no fused multiply-add), in every format: for ``fp32`` this is
    the multi-cycle fp32 PE mode (``wia_hw.rtl.fp_mac.Fp32Mac``). numpy's own float32
    ``a @ b`` is *not* this arithmetic: BLAS sums in blocks (and may fuse), so it differs
    in the last bits; this loop over ``k`` is vectorised over the whole M x N block.

    IEEE-754 binary32 throughout: subnormal inputs, products and sums are kept (no
    flush to zero), overflow gives a signed infinity, ``inf - inf`` and ``0 * inf``
    give NaN, and every NaN result is the canonical quiet NaN ``0x7FC00000``.
    """
    if fmt not in FP_FORMATS:
        raise ValueError(f"fmt must be one of {FP_FORMATS}, got {fmt!r}")
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    _check_matmul_shapes(a, b)
    bad = [
        n
        for n, m in (("A", a), ("B", b))
        # rounding keeps NaN as NaN: array_equal(equal_nan=True), without its slow masking
        if not np.all((round_to_precision(m, fmt) == m) | np.isnan(m))
    ]
    if bad:
        raise ValueError(f"{' and '.join(bad)} has values not representable in {fmt}")
    m_, n_ = a.shape[0], b.shape[1]
    out = (
        np.zeros((m_, n_), np.float32)
        if acc is None
        else np.array(acc, dtype=np.float32, copy=True)
    )
    if out.shape != (m_, n_):
        raise ValueError(f"acc shape {out.shape} does not match the product {(m_, n_)}")
    with np.errstate(all="ignore"):
        for k in range(a.shape[1]):
            out = out + np.multiply.outer(a[:, k], b[k, :])  # float32 ops, RNE
    bits = out.view(np.uint32)
    bits[np.isnan(out)] = _CANONICAL_NAN
    return out
