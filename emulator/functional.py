"""Functional semantics of every graph op kind, in numpy: what functional mode computes.

GEMM-class ops (linear, matmul, bmm, conv2d) are first put in the kernel's layout by
:func:`gemm_operands`: ``A [batch, m, k]``, ``B [1 or batch, k, n]``, a bias
``[1 or batch, n]`` and a function that turns ``C [batch, m, n]`` into the op's output
(conv2d: im2col per group, the groups being the batch; bmm: its ``scale`` epilogue in
float32). Functional mode runs a GEMM lowered to a
:class:`~wia_hw.emulator.kernels.GemmKernel` through
:func:`~wia_hw.emulator.tiled_exec.execute_gemm`, over the device's own tiles and array
passes. :func:`evaluate` is the device-free path (ops lowered by an extension, direct
calls): int8 x int8 -> int32 exact, floats rounded to their precision and accumulated
in float32 one ``tk`` slice at a time. Everything else is computed in float32 and
rounded to the output dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import WorkloadError
from .golden import float_matmul, int8_matmul, round_to_precision, wrap_int32
from .window import parse_window

__all__ = ["evaluate", "cast_to", "random_input", "GemmOperands", "gemm_operands"]

_NP = {
    "fp32": np.float32,
    "fp16": np.float16,
    "int8": np.int8,
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
}


def cast_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Convert to a graph dtype. Floats round (bf16 is kept as float32 holding bf16
    values); int8 saturates after rounding; int32 wraps."""
    if dtype in ("fp32", "fp16", "bf16"):
        return round_to_precision(np.asarray(x, dtype=np.float32), dtype)
    if dtype == "int8":
        return np.clip(np.rint(x), -128, 127).astype(np.int8)
    if dtype == "int32":
        return (
            wrap_int32(np.rint(np.asarray(x, dtype=np.float64)).astype(np.int64))
            if np.asarray(x).dtype.kind == "f"
            else wrap_int32(x)
        )
    return np.asarray(x).astype(_NP.get(dtype, np.float32))


def random_input(
    rng: np.random.Generator, shape: Sequence[int], dtype: str, high: int | None = None
) -> np.ndarray:
    """A random tensor for functional runs: ids in [0, high), int8 over its full range,
    floats ~ N(0, 1) rounded to the dtype."""
    if dtype in ("int64", "int32") and high is not None:
        return rng.integers(0, high, size=tuple(shape)).astype(_NP[dtype])
    if dtype == "int8":
        return rng.integers(-128, 128, size=tuple(shape)).astype(np.int8)
    if dtype in ("int32", "int64"):
        return rng.integers(-1000, 1000, size=tuple(shape)).astype(_NP[dtype])
    return cast_to(rng.standard_normal(tuple(shape), dtype=np.float32), dtype)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to about 1.5e-7 absolute (Abramowitz and Stegun 7.1.26), vectorised."""
    x = np.asarray(x, dtype=np.float64)
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return (np.sign(x) * (1.0 - poly * np.exp(-x * x))).astype(np.float32)


def _gemm2d(a: np.ndarray, b: np.ndarray, tk: int | None) -> np.ndarray:
    """One 2-D GEMM as the array computes it: int8 exact, floats per K slice."""
    if a.dtype == np.int8 and b.dtype == np.int8:
        return int8_matmul(a, b)
    if a.dtype.kind in "iu" or b.dtype.kind in "iu":
        return int8_matmul(np.clip(a, -128, 127), np.clip(b, -128, 127))
    k = a.shape[1]
    tk = k if not tk or tk >= k else tk
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for k0 in range(0, k, tk):  # one slice of K per tile pass, accumulated in float32
        acc += float_matmul(
            a[:, k0 : k0 + tk].astype(np.float32), b[k0 : k0 + tk].astype(np.float32), "fp32"
        )
    return acc


def _softmax(x: np.ndarray, attrs: Mapping[str, Any], bias: np.ndarray | None = None) -> np.ndarray:
    x = x.astype(np.float32) * float(attrs.get("scale", 1.0))
    if bias is not None:
        x = x + bias.astype(np.float32)
    axis = int(attrs.get("axis", -1))
    if attrs.get("causal"):
        s, t = x.shape[-2], x.shape[-1]
        mask = np.triu(np.ones((s, t), dtype=bool), k=1 + (t - s))
        x = np.where(mask, -np.inf, x)
    top = x.max(axis=axis, keepdims=True)
    x = x - np.where(np.isneginf(top), np.float32(0), top)  # a fully masked row stays -inf
    e = np.exp(x)
    total = e.sum(axis=axis, keepdims=True)
    if attrs.get("log"):  # LogSoftmax: x - max - log(sum(exp))
        return x - np.log(total)
    # a row every key of which is masked attends to nothing: zeros, as ONNX's Attention
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def _clip(v: np.ndarray, attrs: Mapping[str, Any], op: str) -> np.ndarray:
    lo, hi = attrs.get("min"), attrs.get("max")
    if "dynamic" in (lo, hi):
        raise WorkloadError(
            f"op {op!r} (clip): its bounds are computed at run time; functional mode "
            "needs constant bounds"
        )
    return np.clip(v, -np.inf if lo is None else lo, np.inf if hi is None else hi)


#: Float activations with attributes: kind -> f(x as fp32, attrs, op name).
_ACTIVATIONS: dict[str, Callable[[np.ndarray, Mapping[str, Any], str], np.ndarray]] = {
    "clip": _clip,
    "leakyrelu": lambda v, a, _: np.where(v >= 0, v, v * np.float32(a.get("alpha", 0.01))),
    "elu": lambda v, a, _: np.where(v > 0, v, np.float32(a.get("alpha", 1.0)) * np.expm1(v)),
    "hardsigmoid": lambda v, a, _: np.clip(
        np.float32(a.get("alpha", 0.2)) * v + np.float32(a.get("beta", 0.5)), 0, 1
    ),
    "hardswish": lambda v, a, _: v * np.clip(v / np.float32(6) + np.float32(0.5), 0, 1),
    "softplus": lambda v, a, _: np.logaddexp(np.float32(0), v),
    "mish": lambda v, a, _: v * np.tanh(np.logaddexp(np.float32(0), v)),
    "swish": lambda v, a, _: v / (1 + np.exp(-np.float32(a.get("alpha", 1.0)) * v)),
    "selu": lambda v, a, _: (
        np.float32(a.get("gamma", 1.05070102214813232421875))
        * np.where(v > 0, v, np.float32(a.get("alpha", 1.67326319217681884765625)) * np.expm1(v))
    ),
    "celu": lambda v, a, _: (
        np.maximum(v, 0)
        + np.minimum(
            0, np.float32(a.get("alpha", 1.0)) * np.expm1(v / np.float32(a.get("alpha", 1.0)))
        )
    ),
    "thresholdedrelu": lambda v, a, _: np.where(v > np.float32(a.get("alpha", 1.0)), v, 0),
    "softsign": lambda v, a, _: v / (1 + np.abs(v)),
    "shrink": lambda v, a, _: np.where(
        v < -np.float32(a.get("lambd", 0.5)),
        v + np.float32(a.get("bias", 0.0)),
        np.where(v > np.float32(a.get("lambd", 0.5)), v - np.float32(a.get("bias", 0.0)), 0),
    ),
}
_COMPARE = {
    "equal": np.equal,
    "less": np.less,
    "greater": np.greater,
    "lessorequal": np.less_equal,
    "greaterorequal": np.greater_equal,
}
_LOGICAL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _arg(pick: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """ArgMax/ArgMin over the flattened ``axis`` dims (the first index of the extreme)."""

    def f(x: np.ndarray, axis: tuple[int, int], keepdims: bool) -> np.ndarray:
        flat = x.reshape(*x.shape[: axis[0]], -1)
        return pick(flat, axis=-1).reshape(*x.shape[: axis[0]], 1, 1)

    return f


_REDUCE = {
    "mean": np.mean,
    "sum": np.sum,
    "max": np.max,
    "min": np.min,
    "argmax": _arg(np.argmax),
    "argmin": _arg(np.argmin),
    "prod": np.prod,
}


def _lrn(x: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """ONNX LRN: ``x / (bias + alpha / size * sum of x^2 over size channels)^beta``,
    the channel window ``[c - floor((size-1)/2), c + ceil((size-1)/2)]``."""
    size = int(attrs.get("size") or 1)
    alpha, beta = float(attrs.get("alpha", 1e-4)), float(attrs.get("beta", 0.75))
    bias = float(attrs.get("bias", 1.0))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    sq = np.square(x)
    pad = [(0, 0)] * x.ndim
    pad[1] = (lo, hi)
    sq = np.pad(sq, pad)
    c = x.shape[1]
    total = sum(sq[:, j : j + c] for j in range(size))
    return x / (bias + alpha / size * total) ** beta


#: ONNX Resize's coordinate transformations: output index -> source coordinate.
COORDINATE_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
)


def source_coordinate(n_in: int, n_out: int, scale: float, ctm: str) -> np.ndarray:
    """The source coordinate of each of ``n_out`` output indices on one axis, as ONNX
    Resize's ``coordinate_transformation_mode`` ``ctm`` maps it (``scale``: the one
    ONNX maps with); ``ValueError`` for a mode not in :data:`COORDINATE_MODES`."""
    i = np.arange(n_out, dtype=np.float64)
    if ctm == "align_corners":  # over the scaled width, as ONNX (not the rounded one)
        width = scale * n_in
        return i * (n_in - 1) / (width - 1) if width != 1 else np.zeros(n_out)
    if ctm == "asymmetric":
        return i / scale
    if ctm == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if ctm == "tf_half_pixel_for_nn":
        return (i + 0.5) / scale
    if ctm == "half_pixel_symmetric":
        return n_in / 2 * (1 - n_out / (scale * n_in)) + (i + 0.5) / scale - 0.5
    if ctm == "half_pixel":
        return (i + 0.5) / scale - 0.5
    raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")


def _linear_weights(n_in: int, n_out: int, scale: float, ctm: str) -> np.ndarray:
    """``[n_out, n_in]``: each output's two neighbours and their linear weights, at
    its :func:`source_coordinate` clamped inside."""
    src = np.clip(source_coordinate(n_in, n_out, scale, ctm), 0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), lo), 1 - frac)
    np.add.at(m, (np.arange(n_out), hi), frac)
    return m


def _cubic_weights(
    n_in: int, n_out: int, scale: float, ctm: str, a: float, exclude_outside: bool
) -> np.ndarray:
    """``[n_out, n_in]``: ONNX Resize's cubic interpolation on one axis (coefficient
    ``a``): each output's four nearest source pixels (ties to the lower index, so a
    source coordinate on a pixel takes ratio 1 and the window ``x-2 .. x+1``), the edge
    pixel standing in for those outside, or, with ``exclude_outside``, those dropped
    and the rest renormalised."""
    x = source_coordinate(n_in, n_out, scale, ctm)
    start = np.clip(np.ceil(x).astype(np.int64) - 2, -2, n_in - 2)
    r = x - np.floor(x)
    r = np.where(r == 0, 1.0, r)[:, None]
    s = np.concatenate([1 + r, r, 1 - r, 2 - r], axis=1)  # distances to the four
    near = ((a + 2) * s - (a + 3)) * s * s + 1  # |s| <= 1
    far = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a  # 1 < |s| < 2
    c = np.where(s <= 1, near, far)
    idx = start[:, None] + np.arange(4)
    if exclude_outside:
        c = np.where((idx >= 0) & (idx < n_in), c, 0.0)
        c = c / c.sum(axis=1, keepdims=True)
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.repeat(np.arange(n_out), 4), np.clip(idx, 0, n_in - 1).ravel()), c.ravel())
    return m


def _resize_linear(
    x: np.ndarray, attrs: Mapping[str, Any], out_shape: tuple[int, ...]
) -> np.ndarray:
    # ``scales`` map coordinates as ONNX's Resize input does; a graph given only the
    # documented ``size`` (GraphBuilder) scales by output over input size, as an ONNX
    # Resize given only sizes does
    default = (out_shape[2] / x.shape[2], out_shape[3] / x.shape[3])
    sh, sw = (float(v) for v in attrs.get("scales", default))
    ctm = str(attrs.get("coordinate_transformation_mode", "half_pixel"))
    if attrs.get("mode") == "cubic":
        a, ex = float(attrs.get("cubic_coeff_a", -0.75)), bool(attrs.get("exclude_outside"))
        mh = _cubic_weights(x.shape[2], out_shape[2], sh, ctm, a, ex)
        mw = _cubic_weights(x.shape[3], out_shape[3], sw, ctm, a, ex)
    else:
        mh = _linear_weights(x.shape[2], out_shape[2], sh, ctm)
        mw = _linear_weights(x.shape[3], out_shape[3], sw, ctm)
    return np.einsum("ih,nchw,jw->ncij", mh, x.astype(np.float64), mw).astype(np.float32)


def _col2im(cols: np.ndarray, attrs: Mapping[str, Any], out_shape: tuple[int, ...]) -> np.ndarray:
    """A transposed convolution's overlap-add: column ``(o, ky, kx)`` of input pixel
    ``(y, x)`` is added at output ``(y*sh + ky*dh - top, x*sw + kx*dw - left)``."""
    n, _, h, w = cols.shape
    o = int(attrs["channels"])
    win = parse_window("col2im", "col2im", attrs)
    (kh, kw), (sh, sw), (dh, dw) = win.kernel, win.stride, win.dilation
    pt, pl = win.pad[0], win.pad[1]
    span_h, span_w = win.transposed_span(h, w)
    full_h, full_w = max(span_h, pt + out_shape[2]), max(span_w, pl + out_shape[3])
    full = np.zeros((n, o, full_h, full_w), dtype=np.float32)
    c = cols.reshape(n, o, kh, kw, h, w)
    for ky in range(kh):
        for kx in range(kw):
            full[
                :,
                :,
                ky * dh : ky * dh + sh * (h - 1) + 1 : sh,
                kx * dw : kx * dw + sw * (w - 1) + 1 : sw,
            ] += c[:, :, ky, kx]
    return full[:, :, pt : pt + out_shape[2], pl : pl + out_shape[3]]


def _pool(x: np.ndarray, attrs: Mapping[str, Any], kind: str) -> np.ndarray:
    win = parse_window(kind, kind, attrs)
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = win.kernel, win.stride, win.pad
    n, c, h, w = x.shape
    ho, wo = win.output_hw(h, w)
    # ceil mode: windows may run past the far padding; those cells are never counted
    eb = max(0, (ho - 1) * sh + kh - (h + pt + pb))
    er = max(0, (wo - 1) * sw + kw - (w + pl + pr))
    fill = -np.inf if kind == "maxpool" else 0.0
    xp = np.pad(
        x.astype(np.float32), ((0, 0), (0, 0), (pt, pb + eb), (pl, pr + er)), constant_values=fill
    )
    win_v = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win_v = win_v[:, :, ::sh, ::sw][:, :, :ho, :wo]
    if kind == "maxpool":
        return win_v.max(axis=(-1, -2))
    # the divisor: the window's cells inside the input, or inside input and padding
    inside = np.zeros(xp.shape[2:], dtype=np.float32)
    if attrs.get("count_include_pad", True):
        inside[: pt + h + pb, : pl + w + pr] = 1
    else:
        inside[pt : pt + h, pl : pl + w] = 1
    count = np.lib.stride_tricks.sliding_window_view(inside, (kh, kw))[::sh, ::sw][:ho, :wo]
    return win_v.sum(axis=(-1, -2)) / np.maximum(count.sum(axis=(-1, -2)), 1)


def _im2col(
    x: np.ndarray, w: np.ndarray, attrs: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Patch matrices ``[groups, n*ho*wo, cg*kh*kw]`` and weights ``[groups, cg*kh*kw,
    o/groups]`` of a convolution, with its output height and width."""
    g = int(attrs.get("groups", 1))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    win = parse_window("conv2d", "conv2d", attrs, (kh, kw))
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = win.stride, win.pad, win.dilation
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho, wo = win.output_hw(h, wd)
    a3, b3 = [], []
    for gi in range(g):  # im2col per group
        xs = xp[:, gi * cg : (gi + 1) * cg]
        cols = np.empty((n, ho, wo, cg, kh, kw), dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                cols[..., i, j] = xs[
                    :, :, i * dh : i * dh + sh * ho : sh, j * dw : j * dw + sw * wo : sw
                ].transpose(0, 2, 3, 1)
        a3.append(cols.reshape(n * ho * wo, cg * kh * kw))
        b3.append(w[gi * (o // g) : (gi + 1) * (o // g)].reshape(o // g, -1).T)
    return np.stack(a3), np.stack(b3), ho, wo


@dataclass(frozen=True)
class GemmOperands:
    """A GEMM-class op in the kernel's layout: ``C[b] = A[b] @ B[b] (+ bias[b])``.

    ``a``: ``[batch, m, k]``; ``b``: ``[1, k, n]`` (shared by every batch entry) or
    ``[batch, k, n]``; ``bias``: ``[1 or batch, n]`` or ``None``; ``finish`` maps
    ``C [batch, m, n]`` to the op's output (layout, and bmm's ``scale`` epilogue).
    """

    a: np.ndarray
    b: np.ndarray
    bias: np.ndarray | None
    finish: Callable[[np.ndarray], np.ndarray]


def gemm_operands(
    kind: str, attrs: Mapping[str, Any], inputs: Sequence[np.ndarray], out_shape: Sequence[int]
) -> GemmOperands:
    """The operands of a ``linear``/``matmul``/``bmm``/``conv2d`` op in the layout its
    :class:`~wia_hw.emulator.kernels.GemmKernel` has (batch, m, n, k as
    :func:`wia_hw.graph.gemm_dims` gives them). Raises ``ValueError`` for other kinds."""
    shape = tuple(out_shape)
    x = inputs[0]
    bias = inputs[2] if len(inputs) == 3 else None
    if kind in ("linear", "matmul"):
        a = x.reshape(1, -1, x.shape[-1])
        return GemmOperands(
            a,
            inputs[1][None],
            None if bias is None else bias.reshape(1, -1),
            lambda c: c.reshape(shape),
        )
    if kind == "bmm":
        b = np.swapaxes(inputs[1], -1, -2) if attrs.get("transpose_b") else inputs[1]
        a3 = x.reshape(-1, x.shape[-2], x.shape[-1])
        b3 = b.reshape(-1, b.shape[-2], b.shape[-1])
        scale = attrs.get("scale")

        def finish(c: np.ndarray) -> np.ndarray:
            c = c.reshape(shape)
            return c * np.float32(scale) if scale is not None and c.dtype.kind == "f" else c

        return GemmOperands(a3, b3, None, finish)
    if kind == "conv2d":
        a3, b3, ho, wo = _im2col(x, inputs[1], attrs)
        g, n = a3.shape[0], x.shape[0]

        def finish(c: np.ndarray) -> np.ndarray:  # [g, n*ho*wo, o/g] -> [n, o, ho, wo]
            return c.reshape(g, n, ho, wo, -1).transpose(1, 0, 4, 2, 3).reshape(shape)

        return GemmOperands(a3, b3, None if bias is None else bias.reshape(g, -1), finish)
    raise ValueError(f"op kind {kind!r} is not a GEMM")


def _gemm_untiled(ops: GemmOperands, tk: int | None) -> np.ndarray:
    """The device-free GEMM of :func:`evaluate`: per batch entry, :func:`_gemm2d`; then
    the bias (int32 wrapping, or float32)."""
    shared = ops.b.shape[0] == 1
    c = np.stack(
        [
            _gemm2d(ops.a[i], np.ascontiguousarray(ops.b[0 if shared else i]), tk)
            for i in range(ops.a.shape[0])
        ]
    )
    if ops.bias is not None:
        if c.dtype.kind == "f":
            c = c + ops.bias.astype(np.float32)[:, None, :]
        else:
            c = wrap_int32(c.astype(np.int64) + ops.bias.astype(np.int64)[:, None, :])
    return c


def evaluate(
    kind: str,
    attrs: Mapping[str, Any],
    inputs: Sequence[np.ndarray],
    out_shape: Sequence[int],
    out_dtype: str,
    tk: int | None = None,
    op_name: str = "?",
) -> np.ndarray:
    """Compute one op's output without a device. ``tk`` is the K slice of the GEMM
    tiling (floats); functional runs execute built-in GEMM kernels tile by tile instead
    (:func:`~wia_hw.emulator.tiled_exec.execute_gemm`)."""
    x = inputs[0] if inputs else None
    if kind in ("linear", "matmul", "bmm", "conv2d"):
        ops = gemm_operands(kind, attrs, inputs, out_shape)
        out = ops.finish(_gemm_untiled(ops, tk))
    elif kind == "softmax":  # a second input is added first (an attention bias or mask)
        out = _softmax(x, attrs, inputs[1] if len(inputs) > 1 else None)
    elif kind == "layer_norm":  # ``rms``: RMSNorm, x / sqrt(mean(x^2) + eps), no centring
        xf = x.astype(np.float32)
        eps = np.float32(attrs.get("eps", 1e-5))
        if attrs.get("rms"):
            out = xf / np.sqrt((xf * xf).mean(axis=-1, keepdims=True) + eps)
        else:
            mu = xf.mean(axis=-1, keepdims=True)
            var = ((xf - mu) ** 2).mean(axis=-1, keepdims=True)
            out = (xf - mu) / np.sqrt(var + eps)
        if len(inputs) > 1:
            out = out * inputs[1].astype(np.float32)
        if len(inputs) > 2:
            out = out + inputs[2].astype(np.float32)
    elif kind in (
        "gelu",
        "relu",
        "tanh",
        "sigmoid",
        "erf",
        "exp",
        "sqrt",
        "neg",
        "scale",
        "identity",
        "cast",
        "log",
        "reciprocal",
        "abs",
        "sin",
        "cos",
        "floor",
        "ceil",
        "round",
        "sign",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
    ):
        xf = x.astype(np.float32) if kind not in ("identity", "cast") else x
        out = {
            "gelu": (
                (
                    lambda v: (
                        0.5
                        * v
                        * (
                            1
                            + np.tanh(
                                np.float32(math.sqrt(2 / math.pi))
                                * (v + np.float32(0.044715) * v**3)
                            )
                        )
                    )
                )
                if attrs.get("approximate") == "tanh"
                else (lambda v: 0.5 * v * (1 + _erf(v / np.float32(math.sqrt(2)))))
            ),
            "relu": lambda v: np.maximum(v, 0),
            "tanh": np.tanh,
            "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
            "erf": _erf,
            "exp": np.exp,
            "sqrt": np.sqrt,
            "neg": np.negative,
            "log": np.log,
            "reciprocal": np.reciprocal,
            "abs": np.abs,
            "sin": np.sin,
            "cos": np.cos,
            "floor": np.floor,
            "ceil": np.ceil,
            "round": np.round,  # half to even, as ONNX's Round
            "sign": np.sign,
            "tan": np.tan,
            "asin": np.arcsin,
            "acos": np.arccos,
            "atan": np.arctan,
            "sinh": np.sinh,
            "cosh": np.cosh,
            "asinh": np.arcsinh,
            "acosh": np.arccosh,
            "atanh": np.arctanh,
            # one factor, or one per element of the last axis (a GatherND's strides)
            "scale": lambda v: v * np.asarray(attrs.get("factor", 1.0), dtype=np.float32),
            "identity": lambda v: v,
            "cast": lambda v: v,
        }[kind](xf)
    elif kind in _ACTIVATIONS:
        out = _ACTIVATIONS[kind](x.astype(np.float32), attrs, op_name)
    elif kind == "lrn":
        out = _lrn(x.astype(np.float32), attrs)
    elif kind in ("compare", "logical", "prelu"):
        a, b = inputs
        if kind == "prelu":
            af = a.astype(np.float32)
            out = np.where(af > 0, af, af * b.astype(np.float32))
        else:
            how = str(attrs.get("op", "")).lower()
            table = _COMPARE if kind == "compare" else _LOGICAL
            if how not in table:
                raise WorkloadError(
                    f"op {op_name!r} ({kind}): attribute op {how!r} is not one of "
                    f"{', '.join(table)}"
                )
            out = table[how](a, b)
    elif kind == "not":
        out = np.logical_not(x)
    elif kind == "where":
        cond, a, b = inputs
        out = np.where(cond.astype(bool), a, b)
    elif kind == "cumsum":  # ONNX's CumSum: exclusive shifts by one, reverse runs backward
        ax = int(attrs.get("axis", 0)) % x.ndim
        v = np.flip(x, ax) if attrs.get("reverse") else x
        acc = np.cumsum(v, axis=ax, dtype=v.dtype)
        if attrs.get("exclusive"):
            acc = np.concatenate(
                [np.zeros_like(np.take(acc, [0], axis=ax)), np.delete(acc, -1, axis=ax)], axis=ax
            )
        out = np.flip(acc, ax) if attrs.get("reverse") else acc
    elif kind == "col2im":
        out = _col2im(x.astype(np.float32), attrs, tuple(out_shape))
    elif kind == "resize":
        out = _resize_linear(x.astype(np.float32), attrs, tuple(out_shape))
    elif kind == "isnan":
        if attrs.get("op") == "isinf":
            pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
            out = (np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))
        else:
            out = np.isnan(x)
    elif kind in ("add", "sub", "mul", "div", "max", "min", "pow"):
        a, b = (
            v.astype(np.float32)
            if v.dtype.kind == "f" or out_dtype in ("fp32", "fp16", "bf16")
            else v.astype(np.int64)
            for v in inputs
        )
        if kind == "div" and a.dtype.kind == "i" and b.dtype.kind == "i":
            # integer division truncates toward zero (ONNX, C); numpy's // floors
            q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
            out = np.where((a < 0) ^ (b < 0), -q, q)
        else:
            out = {
                "add": np.add,
                "sub": np.subtract,
                "mul": np.multiply,
                "div": np.divide,
                "max": np.maximum,
                "min": np.minimum,
                "pow": np.power,
            }[kind](a, b)
    elif kind == "embedding":
        ids, table = inputs
        if attrs.get("negative_from_end"):  # ONNX Gather: -1 is the last row
            ids = np.where(ids < 0, ids + table.shape[0], ids)
        el = attrs.get("elements_of")
        if el:  # GatherElements: ids count along one axis of data; the rest is position
            data, axis = tuple(el["data"]), int(el["axis"])
            pos = list(np.indices(tuple(el["index"])))
            along = ids.reshape(tuple(el["index"])).astype(np.int64)
            pos[axis] = np.where(along < 0, along + data[axis], along)
            if (pos[axis] < 0).any() or (pos[axis] >= data[axis]).any():
                raise WorkloadError(
                    f"op {op_name!r} (embedding): indices outside [0, {data[axis]}) on axis {axis}"
                )
            if len(pos) != len(data) or any(
                d != axis and el["index"][d] > data[d] for d in range(len(data))
            ):
                raise WorkloadError(
                    f"op {op_name!r} (embedding): index shape {list(el['index'])} exceeds "
                    f"data {list(data)} off axis {axis}"
                )
            ids = np.ravel_multi_index(tuple(pos), data).reshape(ids.shape)
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise WorkloadError(f"op {op_name!r} (embedding): ids outside [0, {table.shape[0]})")
        out = table[ids.astype(np.int64)]
    elif kind in ("maxpool", "avgpool"):
        out = _pool(x, attrs, kind)
    elif kind == "global_avgpool":  # ``reduce``: mean (default), sum, max or min
        how = attrs.get("reduce", "mean")
        if how not in _REDUCE:
            raise WorkloadError(
                f"op {op_name!r} (global_avgpool): reduce {how!r} is not one of "
                f"{', '.join(_REDUCE)}"
            )
        # integers sum exactly (a GatherND's row index); floats in fp32
        xf = (
            x.astype(np.float32)
            if how == "mean" or how in ("sum", "prod") and x.dtype.kind == "f"
            else x
        )
        if attrs.get("select_last_index") and how in ("argmax", "argmin"):
            n = x.shape[2] * x.shape[3]  # the last extreme: the first one from the end
            out = n - 1 - _REDUCE[how](xf[:, :, ::-1, ::-1], axis=(2, 3), keepdims=True)
        else:
            out = _REDUCE[how](xf, axis=(2, 3), keepdims=True)
    elif kind == "reshape":
        out = x.reshape(tuple(out_shape))
    elif kind == "transpose":
        out = np.transpose(x, tuple(attrs["perm"]))
    elif kind == "concat":
        out = np.concatenate(list(inputs), axis=int(attrs.get("axis", -1)))
    elif kind == "slice":
        ax = int(attrs.get("axis", 0)) % x.ndim
        sl = [slice(None)] * x.ndim
        step = int(attrs.get("step", 1))
        if step > 0:
            sl[ax] = slice(int(attrs.get("start", 0)), int(attrs.get("stop", x.shape[ax])), step)
        else:  # backward; a stop of -1 runs to index 0 inclusive
            stop = int(attrs.get("stop", -1))
            sl[ax] = slice(
                int(attrs.get("start", x.shape[ax] - 1)), None if stop < 0 else stop, step
            )
        out = x[tuple(sl)]
    else:
        raise WorkloadError(f"op {op_name!r}: no functional model for op kind {kind!r}")
    out = np.asarray(out)
    if tuple(out.shape) != tuple(out_shape):
        raise WorkloadError(
            f"op {op_name!r} ({kind}): computed shape {list(out.shape)} "
            f"but the graph declares {list(out_shape)}"
        )
    return cast_to(out, out_dtype)
