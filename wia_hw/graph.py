"""The workload graph IR: tensors with shapes and dtypes, ops that read and write them.

A :class:`Graph` is a list of :class:`Op` in execution (topological) order over named
:class:`Tensor` values. Build one with :class:`GraphBuilder`, whose methods check
shapes as they go and raise :class:`~wia_hw.WorkloadError` naming the op and both
shapes; a graph made by hand is checked the same way by :meth:`Graph.validate`.

Op kinds and their shape rules (``*`` is any number of leading dims):

======================  ===========================================  =================
kind                    inputs                                       output
======================  ===========================================  =================
``linear``              x ``[*, K]``, w ``[K, N]``, (bias ``[N]``)   ``[*, N]``
``matmul``              a ``[M, K]``, b ``[K, N]``                   ``[M, N]``
``bmm``                 a ``[*, M, K]``, b ``[*, K, N]``             ``[*, M, N]``
                        (``transpose_b``: b ``[*, N, K]``)
``conv2d``              x ``[N, C, H, W]``, w ``[O, C/g, kh, kw]``   ``[N, O, Ho, Wo]``
``softmax``             x, (an additive bias broadcast to x)         same
``layer_norm``          x ``[*, H]``, gamma ``[H]``, beta ``[H]``    same as x
                        (``rms``: RMS norm, no centring)
unary (``gelu`` ...)    x                                            same
binary (``add`` ...)    a, b (numpy broadcasting)                    broadcast shape
``embedding``           ids ``[*]`` (int), table ``[V, H]``          ``[*, H]``
``maxpool``/``avgpool`` x ``[N, C, H, W]``                           ``[N, C, Ho, Wo]``
``global_avgpool``      x ``[N, C, H, W]``                           ``[N, C, 1, 1]``
``reshape``             x                                            attr ``shape``
``transpose``           x                                            permuted by ``perm``
``concat``              xs                                           joined on ``axis``
``slice``               x                                            ``axis``, ``start``, ``stop``, ``step``
                                                                     (``step`` < 0: backward,
                                                                     ``stop`` -1 past the start)
``where``               cond, x, y (numpy broadcasting)              broadcast shape
``cumsum``              x (running sums along ``axis``; ``exclusive``  same
                        and ``reverse`` as ONNX's CumSum)
``resize``              x ``[N, C, H, W]`` (bilinear or bicubic;     ``[N, C, *size]``
                        ``size``)
``col2im``              cols ``[N, O*kh*kw, H, W]``                  ``[N, O, Ho, Wo]``
                        (a transposed convolution's overlap-add: ``channels``, window attributes, ``output_padding``)
======================  ===========================================  =================

Window attributes (``conv2d``, ``maxpool``, ``avgpool``; :func:`window` reads them):
``stride`` and ``dilation`` are an int or ``[h, w]``; ``pad`` an int, ``[h, w]`` or
``[top, left, bottom, right]`` (ONNX's ``pads`` order); a pool's ``kernel`` an int or
``[kh, kw]`` (``stride`` defaults to it); pools take ``ceil_mode`` and ``avgpool``
``count_include_pad`` (default true: padded cells count in the divisor; cells past the
padding, reached only by ``ceil_mode``, never do).

``reshape`` is a view (no data moves); ``transpose``, ``concat`` and ``slice`` copy,
except a ``slice`` that keeps one contiguous block of its input (every axis before
``axis`` has size 1, e.g. taking q, k or v from a ``[3, ...]`` tensor): that is a view
too. :func:`is_view` is the one place that rule lives.
Every op has a ``group``: the breakdown category the run report sums time over (the
seed's section 8.7 table: ``multi_head_attention``, ``layer_norm``, ``feed_forward``,
``embedding``, ``output``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

from .emulator.errors import WorkloadError
from .emulator.window import Window, parse_window

__all__ = [
    "DTYPE_BYTES",
    "GEMM_KINDS",
    "UNARY_KINDS",
    "BINARY_KINDS",
    "OP_KINDS",
    "Tensor",
    "Op",
    "Graph",
    "GraphBuilder",
    "op_flops",
    "op_macs",
    "conv_output_hw",
    "is_view",
    "Window",
    "window",
    "QuantParams",
    "MOVE_KINDS",
]

#: Bytes per element of each dtype.
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "int8": 1,
    "int32": 4,
    "int64": 8,
    "bool": 1,
}
FLOAT_DTYPES = ("fp32", "fp16", "bf16")
GEMM_KINDS = ("linear", "matmul", "bmm", "conv2d")
#: Elementwise unary ops, with their FLOPs per element (as a profiler would count them).
UNARY_KINDS: dict[str, int] = {
    "gelu": 8,
    "relu": 1,
    "tanh": 4,
    "sigmoid": 4,
    "erf": 4,
    "exp": 1,
    "sqrt": 1,
    "neg": 1,
    "scale": 1,
    "identity": 0,
    "cast": 0,
    # ONNX CNN activations: clip = max + min; hardsigmoid = mul, add, clip;
    # hardswish = hardsigmoid + mul; lrn (size 5) = square, 4 window adds, scale and
    # bias, pow, div
    "clip": 2,
    "hardsigmoid": 3,
    "hardswish": 4,
    "lrn": 9,
    # ONNX tests on values (IsNaN, IsInf, Not): one compare per element
    "isnan": 1,
    "not": 1,
    # leakyrelu = compare, mul; elu = compare, exp, sub; softplus = exp, add, log
    "leakyrelu": 2,
    "elu": 3,
    "softplus": 3,
    # elementwise math (ONNX Log, Reciprocal, Abs, Sin, Cos, Floor, Ceil, Round, Sign)
    "log": 1,
    "reciprocal": 1,
    "abs": 1,
    "sin": 1,
    "cos": 1,
    "floor": 1,
    "ceil": 1,
    "round": 1,
    "sign": 1,
    # inverse and hyperbolic trigonometry (ONNX Tan, Asin, Acos, Atan, Sinh, Cosh,
    # Asinh, Acosh, Atanh)
    "tan": 1,
    "asin": 1,
    "acos": 1,
    "atan": 1,
    "sinh": 1,
    "cosh": 1,
    "asinh": 1,
    "acosh": 1,
    "atanh": 1,
    # more activations: mish = softplus, tanh, mul; swish = mul, sigmoid, mul;
    # selu/celu = compare, exp, sub, scale; thresholdedrelu = compare; softsign = abs,
    # add, div; shrink = two compares, add
    "mish": 5,
    "swish": 6,
    "selu": 4,
    "celu": 4,
    "thresholdedrelu": 1,
    "softsign": 3,
    "shrink": 2,
}
#: Elementwise binary ops, with their FLOPs per output element.
BINARY_KINDS: dict[str, int] = {
    "add": 1,
    "sub": 1,
    "mul": 1,
    "div": 1,
    "max": 1,
    "min": 1,
    "pow": 1,
    "compare": 1,
    "logical": 1,
    "prelu": 2,
}  # prelu: compare, mul by the slope
OTHER_KINDS = (
    "softmax",
    "layer_norm",
    "embedding",
    "maxpool",
    "avgpool",
    "global_avgpool",
    "reshape",
    "transpose",
    "concat",
    "slice",
    "where",
    "col2im",
    "resize",
    "cumsum",
)
OP_KINDS = GEMM_KINDS + tuple(UNARY_KINDS) + tuple(BINARY_KINDS) + OTHER_KINDS
#: Data movement: the values (an integer tensor's codes too) move unchanged.
MOVE_KINDS = ("reshape", "slice", "concat", "transpose", "identity")
#: FLOPs per element of the reductions: softmax (max, sub, exp, sum, div),
#: layer norm (mean, sub, square, sum, rsqrt-mul, scale, shift, ...).
SOFTMAX_FLOPS_PER_ELEMENT = 5
#: FLOPs per output element of a bilinear resize (4 weighted neighbours: 4 mul, 3 add).
RESIZE_FLOPS_PER_ELEMENT = 7
LAYER_NORM_FLOPS_PER_ELEMENT = 8
#: RMS norm (``layer_norm`` with ``rms``): square, mean, scale by the reciprocal root, gamma.
RMS_NORM_FLOPS_PER_ELEMENT = 4


@dataclass(frozen=True)
class Tensor:
    """A named value: ``kind`` is ``input``, ``weight`` or ``activation``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str = "activation"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise WorkloadError(f"tensor name must be a non-empty string, got {self.name!r}")
        shape = tuple(self.shape)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
            raise WorkloadError(
                f"tensor {self.name!r}: shape must be positive integers, got {list(self.shape)}"
            )
        object.__setattr__(self, "shape", shape)
        if self.dtype not in DTYPE_BYTES:
            raise WorkloadError(
                f"tensor {self.name!r}: unknown dtype {self.dtype!r} "
                f"(known: {', '.join(DTYPE_BYTES)})"
            )
        if self.kind not in ("input", "weight", "activation"):
            raise WorkloadError(
                f"tensor {self.name!r}: kind must be input, weight or activation, got {self.kind!r}"
            )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True, eq=False)
class QuantParams:
    """Static affine quantisation of an integer tensor (ONNX's QuantizeLinear and
    DequantizeLinear): the real value of code ``q`` is ``(q - zero_point) * scale``,
    and a real ``x`` is stored as ``clip(rint(x / scale) + zero_point, lo, hi)``.

    ``scale`` (float32) and ``zero_point`` (int64) are numpy arrays that broadcast
    against the tensor: shape ``()`` per tensor, or one axis kept (``[C, 1, 1, 1]``
    for a convolution weight's output channels, ``[N]`` for a ``[K, N]`` weight's
    columns). ``lo``/``hi`` is the code range: -128..127 (int8), 0..255 (uint8, also
    stored in one byte), or int32's for a bias.
    """

    scale: Any
    zero_point: Any
    lo: int = -128
    hi: int = 127

    def quantise(self, x: Any) -> Any:
        """The codes (int64) of real values ``x``, as ONNX's QuantizeLinear computes
        them: ``clip(rint(x / scale) + zero_point, lo, hi)``, the division in float32,
        the clip before the cast to integers, so an infinity saturates (cast first, it
        wrapped: +inf gave -128)."""
        import numpy as np

        q = np.rint(np.asarray(x, np.float32) / np.asarray(self.scale, np.float32))
        q = np.clip(
            q.astype(np.float64) + np.asarray(self.zero_point, np.float64), self.lo, self.hi
        )
        return q.astype(np.int64)

    def real(self, codes: Any) -> Any:
        """The real values (float32) of ``codes``: ``(codes - zero_point) * scale``."""
        import numpy as np

        return ((np.asarray(codes, np.float64) - self.zero_point) * self.scale).astype(np.float32)

    def same(self, other: QuantParams | None) -> bool:
        """Equal parameters (so a tensor of codes means the same under either)."""
        import numpy as np

        return (
            other is not None
            and (self.lo, self.hi) == (other.lo, other.hi)
            and np.shape(self.scale) == np.shape(other.scale)
            and np.array_equal(self.scale, other.scale)
            and np.array_equal(self.zero_point, other.zero_point)
        )


@dataclass(frozen=True, eq=False)
class Op:
    """One operation of a graph. ``attrs`` holds kind-specific parameters."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    group: str = "other"
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise WorkloadError(f"op {self.name!r}: unknown op kind {self.kind!r}")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "attrs", dict(self.attrs))


def window(op: Op, kernel: tuple[int, int] | None = None) -> Window:
    """The window of a ``conv2d`` (``kernel``: its weight's ``(kh, kw)``) or pooling
    op, from its attributes (see the module text); a one-line error names the op and
    the attribute that is malformed."""
    return parse_window(op.name, op.kind, op.attrs, kernel)


def _output_padding(a: Mapping[str, Any]) -> tuple[int, int]:
    v = a.get("output_padding", 0)
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def conv_output_hw(
    h: int,
    w: int,
    kh: int,
    kw: int,
    stride: int | Sequence[int],
    pad: int | Sequence[int],
    dilation: int | Sequence[int] = 1,
) -> tuple[int, int]:
    """Output height and width of a convolution or pooling window (``stride``,
    ``pad`` and ``dilation`` as :func:`window` reads them)."""
    attrs = {"stride": stride, "pad": pad, "dilation": dilation}
    return parse_window("conv_output_hw", "conv2d", attrs, (kh, kw)).output_hw(h, w)


def _broadcast(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da != db and 1 not in (da, db):
            raise WorkloadError(f"op {op!r}: shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(da, db))
    return tuple(reversed(out))


def infer_shapes(op: Op, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Output shapes of ``op`` given its input shapes; raises WorkloadError on mismatch."""
    k, n, a = op.kind, op.name, op.attrs

    def need(count: int | tuple[int, int]) -> None:
        lo, hi = (count, count) if isinstance(count, int) else count
        if not lo <= len(shapes) <= hi:
            raise WorkloadError(f"op {n!r} ({k}): takes {lo}..{hi} inputs, got {len(shapes)}")

    def required(attr: str) -> Any:
        if attr not in a:
            raise WorkloadError(f"op {n!r} ({k}): attribute {attr!r} is required")
        return a[attr]

    def axis(shape: tuple[int, ...], default: int) -> int:
        """The ``axis`` attribute as an index into ``shape`` (negative from the end):
        out of range is an error, never wrapped round."""
        v, rank = a.get("axis", default), len(shape)
        if isinstance(v, bool) or not isinstance(v, Integral) or not -rank <= v < rank:
            raise WorkloadError(
                f"op {n!r} ({k}): axis {v!r} is out of range for input {list(shape)} "
                f"(rank {rank}: {-rank}..{rank - 1})"
            )
        return int(v) % rank

    if k == "linear":
        need((2, 3))
        x, w = shapes[0], shapes[1]
        if len(w) != 2 or len(x) < 1 or x[-1] != w[0]:
            raise WorkloadError(
                f"op {n!r} (linear): input {list(x)} does not match "
                f"weight {list(w)} (need x[..., K] and w[K, N])"
            )
        if len(shapes) == 3 and shapes[2] != (w[1],):
            raise WorkloadError(
                f"op {n!r} (linear): bias {list(shapes[2])} does not match "
                f"weight {list(w)} (need [{w[1]}])"
            )
        return [x[:-1] + (w[1],)]
    if k == "matmul":
        need(2)
        x, w = shapes
        if len(x) != 2 or len(w) != 2 or x[1] != w[0]:
            raise WorkloadError(
                f"op {n!r} (matmul): A {list(x)} x B {list(w)}: inner dimensions differ"
            )
        return [(x[0], w[1])]
    if k == "bmm":
        need(2)
        x, y = shapes
        if a.get("transpose_b"):
            if len(y) < 2:
                raise WorkloadError(f"op {n!r} (bmm): B {list(y)} needs 2+ dims")
            y = y[:-2] + (y[-1], y[-2])
        if len(x) < 2 or len(y) < 2 or x[-1] != y[-2] or x[:-2] != y[:-2]:
            raise WorkloadError(
                f"op {n!r} (bmm): A {list(shapes[0])} x B {list(shapes[1])}"
                f"{' (transposed)' if a.get('transpose_b') else ''}: "
                "batch or inner dimensions differ"
            )
        return [x[:-1] + (y[-1],)]
    if k == "conv2d":
        need((2, 3))
        x, w = shapes[0], shapes[1]
        g = a.get("groups", 1)
        if len(x) != 4 or len(w) != 4 or x[1] != w[1] * g or w[0] % g:
            raise WorkloadError(
                f"op {n!r} (conv2d): input {list(x)} and weight {list(w)} do not agree (groups={g})"
            )
        if len(shapes) == 3 and shapes[2] != (w[0],):
            raise WorkloadError(
                f"op {n!r} (conv2d): bias {list(shapes[2])} does not match "
                f"weight {list(w)} (need [{w[0]}])"
            )
        ho, wo = window(op, (w[2], w[3])).output_hw(x[2], x[3])
        if ho < 1 or wo < 1:
            raise WorkloadError(f"op {n!r} (conv2d): output would be empty for input {list(x)}")
        return [(x[0], w[0], ho, wo)]
    if k == "softmax":  # x, and an additive bias (a mask, a position bias) broadcast to it
        need((1, 2))
        axis(shapes[0], -1)
        if len(shapes) == 2 and _broadcast(n, shapes[0], shapes[1]) != shapes[0]:
            raise WorkloadError(
                f"op {n!r} (softmax): bias {list(shapes[1])} does not broadcast to "
                f"{list(shapes[0])}"
            )
        return [shapes[0]]
    if k in UNARY_KINDS:
        need(1)
        return [shapes[0]]
    if k == "layer_norm":
        need((1, 3))
        x = shapes[0]
        for s in shapes[1:]:
            if s != (x[-1],):
                raise WorkloadError(
                    f"op {n!r} (layer_norm): scale {list(s)} does not match input {list(x)}"
                )
        return [x]
    if k in BINARY_KINDS:
        need(2)
        return [_broadcast(n, shapes[0], shapes[1])]
    if k == "where":  # condition, x, y
        need(3)
        return [_broadcast(n, _broadcast(n, shapes[0], shapes[1]), shapes[2])]
    if k == "cumsum":  # running sums along ``axis`` (``exclusive``, ``reverse``)
        need(1)
        axis(shapes[0], 0)
        return [shapes[0]]
    if k == "resize":  # [N, C, H, W] -> [N, C, *size]
        need(1)
        x, size = shapes[0], a.get("size")
        if len(x) != 4 or not isinstance(size, (list, tuple)) or len(size) != 2:
            raise WorkloadError(
                f"op {n!r} (resize): input {list(x)} and size {size!r} must be [N, C, H, W] and [h, w]"
            )
        return [(x[0], x[1], int(size[0]), int(size[1]))]
    if k == "col2im":  # [N, O*kh*kw, H, W] columns -> [N, O, Ho, Wo], overlapping adds
        need(1)
        x, o = shapes[0], a.get("channels", 0)
        win = window(op)
        if len(x) != 4 or not isinstance(o, int) or o < 1 or x[1] != o * win.area:
            raise WorkloadError(
                f"op {n!r} (col2im): input {list(x)} is not [N, {o} x {win.area}, H, W] "
                f"(channels={o!r}, kernel {list(win.kernel)})"
            )
        span, extra = win.transposed_span(x[2], x[3]), _output_padding(a)
        ho, wo = (span[i] + extra[i] - win.pad[i] - win.pad[2 + i] for i in (0, 1))
        if "output_hw" in a:
            ho, wo = a["output_hw"]
        if ho < 1 or wo < 1:
            raise WorkloadError(f"op {n!r} (col2im): output would be empty for input {list(x)}")
        return [(x[0], o, ho, wo)]
    if k == "embedding":
        need(2)
        ids, table = shapes
        if len(table) != 2:
            raise WorkloadError(f"op {n!r} (embedding): table {list(table)} must be [V, H]")
        return [ids + (table[1],)]
    if k in ("maxpool", "avgpool"):
        need(1)
        x = shapes[0]
        if len(x) != 4:
            raise WorkloadError(f"op {n!r} ({k}): input {list(x)} must be [N, C, H, W]")
        win = window(op)
        ho, wo = win.output_hw(x[2], x[3])
        if ho < 1 or wo < 1:
            raise WorkloadError(f"op {n!r} ({k}): output would be empty for input {list(x)}")
        if any(p >= q for p, q in zip(win.pad, win.kernel * 2, strict=True)):
            raise WorkloadError(
                f"op {n!r} ({k}): pad {list(win.pad)} must be smaller than the "
                f"window {list(win.kernel)} (a window of padding only)"
            )
        return [(x[0], x[1], ho, wo)]
    if k == "global_avgpool":
        need(1)
        x = shapes[0]
        if len(x) != 4:
            raise WorkloadError(f"op {n!r} ({k}): input {list(x)} must be [N, C, H, W]")
        return [(x[0], x[1], 1, 1)]
    if k == "reshape":
        need(1)
        new = required("shape")
        if not isinstance(new, (list, tuple)) or not all(
            isinstance(d, Integral) and not isinstance(d, bool) and d > 0 for d in new
        ):
            raise WorkloadError(
                f"op {n!r} (reshape): shape {new!r} must be a list of positive integers"
            )
        new = tuple(int(d) for d in new)
        if math.prod(new) != math.prod(shapes[0]):
            raise WorkloadError(
                f"op {n!r} (reshape): cannot reshape {list(shapes[0])} to {list(new)}"
            )
        return [new]
    if k == "transpose":
        need(1)
        perm = required("perm")
        if not isinstance(perm, (list, tuple)) or sorted(perm) != list(range(len(shapes[0]))):
            raise WorkloadError(
                f"op {n!r} (transpose): perm {perm!r} does not fit {list(shapes[0])}"
            )
        return [tuple(shapes[0][p] for p in perm)]
    if k == "concat":
        need((1, 1 << 16))
        base = list(shapes[0])
        ax = axis(shapes[0], -1)
        for s in shapes[1:]:
            if len(s) != len(base) or any(s[i] != base[i] for i in range(len(s)) if i != ax):
                raise WorkloadError(
                    f"op {n!r} (concat): {list(shapes[0])} and {list(s)} differ outside axis "
                    f"{a.get('axis', -1)}"
                )
            base[ax] += s[ax]
        return [tuple(base)]
    if k == "slice":
        need(1)
        x = list(shapes[0])
        ax = axis(shapes[0], 0)
        step = a.get("step", 1)
        if not isinstance(step, int) or isinstance(step, bool) or step == 0:
            raise WorkloadError(f"op {n!r} (slice): step {step!r} must be a nonzero integer")
        if step < 0:  # backward from start (inclusive) to stop (exclusive; -1: to the start)
            start, stop = a.get("start", x[ax] - 1), a.get("stop", -1)
            if not x[ax] > start > stop >= -1:
                raise WorkloadError(f"op {n!r} (slice): empty slice [{start}:{stop}:{step}] of {x}")
            x[ax] = -(-(start - stop) // -step)
            return [tuple(x)]
        start, stop = a.get("start", 0), min(a.get("stop", x[ax]), x[ax])
        if not 0 <= start < stop:
            raise WorkloadError(f"op {n!r} (slice): empty slice [{start}:{stop}] of {x}")
        x[ax] = -(-(stop - start) // step)
        return [tuple(x)]
    raise WorkloadError(f"op {n!r}: unknown op kind {k!r}")  # pragma: no cover


def gemm_dims(op: Op, shapes: Sequence[tuple[int, ...]]) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a GEMM-class op, given its input shapes."""
    if op.kind == "linear":
        x, w = shapes[0], shapes[1]
        return 1, math.prod(x[:-1]), w[1], w[0]
    if op.kind == "matmul":
        return 1, shapes[0][0], shapes[1][1], shapes[0][1]
    if op.kind == "bmm":
        x, y = shapes[0], shapes[1]
        nn = y[-2] if op.attrs.get("transpose_b") else y[-1]
        return math.prod(x[:-2]), x[-2], nn, x[-1]
    if op.kind == "conv2d":
        x, w = shapes[0], shapes[1]
        g = op.attrs.get("groups", 1)
        ho, wo = window(op, (w[2], w[3])).output_hw(x[2], x[3])
        # im2col per group: M = N*Ho*Wo, K = (C/g)*kh*kw, N = O/g; groups are the batch.
        return g, x[0] * ho * wo, w[0] // g, w[1] * w[2] * w[3]
    raise WorkloadError(f"op {op.name!r} ({op.kind}) is not a GEMM")


def op_macs(op: Op, shapes: Sequence[tuple[int, ...]]) -> int:
    """Multiply-accumulates of a GEMM-class op (0 for the others)."""
    if op.kind not in GEMM_KINDS:
        return 0
    b, m, n, k = gemm_dims(op, shapes)
    return b * m * n * k


def is_view(op: Op, in_shapes: Sequence[tuple[int, ...]]) -> bool:
    """True when ``op`` moves no data: a ``reshape``, or a ``slice`` whose result is one
    contiguous block of its input (the product of the dims before ``axis`` is 1)."""
    if op.kind == "reshape":
        return True
    if op.kind == "slice" and in_shapes:
        x = in_shapes[0]
        if op.attrs.get("step", 1) != 1:  # every step-th element: a strided copy
            return False
        return math.prod(x[: op.attrs.get("axis", 0) % len(x)]) == 1
    return False


def op_flops(
    op: Op, in_shapes: Sequence[tuple[int, ...]], out_shapes: Sequence[tuple[int, ...]]
) -> int:
    """Floating-point (or integer) operations of an op, as profilers count them.

    GEMMs count 2 per MAC plus one add per output for a bias; elementwise ops count
    their per-element cost (:data:`UNARY_KINDS`, :data:`BINARY_KINDS`); data movement
    (reshape, transpose, concat, slice, embedding) counts none. An op that stands for
    several recognised ones (the ONNX importer's fused attention, layer norm, GELU)
    carries their total in ``attrs["flops"]``, which is returned as is.
    """
    if "flops" in op.attrs:
        return int(op.attrs["flops"])
    out = math.prod(out_shapes[0]) if out_shapes else 0
    if op.kind in GEMM_KINDS:
        bias = out if len(in_shapes) == 3 else 0
        return 2 * op_macs(op, in_shapes) + bias
    if op.kind in UNARY_KINDS:
        return UNARY_KINDS[op.kind] * out
    if op.kind in BINARY_KINDS:
        return BINARY_KINDS[op.kind] * out
    if op.kind == "softmax":
        return SOFTMAX_FLOPS_PER_ELEMENT * out
    if op.kind in ("where", "cumsum"):  # one select, or one add, per output element
        return out
    if op.kind == "col2im":  # every column element is added into its output position
        return math.prod(in_shapes[0])
    if op.kind == "resize":  # bilinear: 4 products and 3 sums; bicubic: 16 and 15
        return (31 if op.attrs.get("mode") == "cubic" else RESIZE_FLOPS_PER_ELEMENT) * out
    if op.kind == "layer_norm":  # RMS norm: square, mean, scale, gamma
        return (
            RMS_NORM_FLOPS_PER_ELEMENT if op.attrs.get("rms") else LAYER_NORM_FLOPS_PER_ELEMENT
        ) * out
    if op.kind in ("maxpool", "avgpool"):
        return out * window(op).area
    if op.kind == "global_avgpool":
        return math.prod(in_shapes[0])
    return 0


class Graph:
    """A workload: tensors and ops in execution order.

    ``params`` holds free-form metadata (model name, batch, seq) that reports show;
    ``sequences`` is how many independent samples one run processes (for throughput).
    ``weight_values`` maps weight names to functions returning their values, where the
    graph came with them (an ONNX model's initializers and what the import derives from
    them): functional mode uses them for the weights the caller does not give.
    ``quant`` maps integer tensors to their static :class:`QuantParams` (an ONNX
    model quantised with QuantizeLinear/DequantizeLinear): functional mode reads and
    writes those tensors' codes with them. :func:`~wia_hw.apply_fusion` (which only
    marks ops) keeps both; a quantised graph (:func:`~wia_hw.quantize_model`)
    holds its own (its codes, biases and the float weights it kept). ``weight_sources`` maps a weight that holds (a new layout of, or
    part of) one of the model's weights to that weight's name and element count (an
    ONNX model's tied embedding, read transposed as the LM head, is two weights of
    one source): :attr:`parameters` and :attr:`weight_bytes` count each source once.
    """

    def __init__(
        self,
        name: str,
        tensors: Iterable[Tensor],
        ops: Iterable[Op],
        *,
        sequences: int = 1,
        params: Mapping[str, Any] | None = None,
        validate: bool = True,
    ) -> None:
        self.name = name
        self.tensors: dict[str, Tensor] = {}
        for t in tensors:
            if t.name in self.tensors:
                raise WorkloadError(f"graph {name!r}: tensor {t.name!r} defined twice")
            self.tensors[t.name] = t
        self.ops: list[Op] = list(ops)
        self.sequences = sequences
        self.params: dict[str, Any] = dict(params or {})
        self.weight_values: dict[str, Callable[[], Any]] = {}
        self.quant: dict[str, QuantParams] = {}
        #: weight -> (the model's weight it holds in another layout, that one's elements)
        self.weight_sources: dict[str, tuple[str, int]] = {}
        #: the model's own outputs (an ONNX graph's), which functional mode returns
        #: besides the tensors no op reads
        self.declared_outputs: list[str] = []
        if validate:
            self.validate()

    def validate(self) -> None:
        """Check that every op reads defined tensors and that all shapes agree."""
        produced = {t.name for t in self.tensors.values() if t.kind in ("input", "weight")}
        names = set()
        for op in self.ops:
            if op.name in names:
                raise WorkloadError(f"graph {self.name!r}: op name {op.name!r} used twice")
            names.add(op.name)
            for i in op.inputs:
                if i not in self.tensors:
                    raise WorkloadError(
                        f"op {op.name!r} ({op.kind}): input {i!r} is not a tensor of the graph"
                    )
                if i not in produced:
                    raise WorkloadError(
                        f"op {op.name!r} ({op.kind}): input {i!r} is read before any op writes it"
                    )
            for o in op.outputs:
                if o not in self.tensors:
                    raise WorkloadError(
                        f"op {op.name!r} ({op.kind}): output {o!r} is not a tensor of the graph"
                    )
            got = infer_shapes(op, [self.tensors[i].shape for i in op.inputs])
            for o, s in zip(op.outputs, got, strict=True):
                if self.tensors[o].shape != s:
                    raise WorkloadError(
                        f"op {op.name!r} ({op.kind}): output {o!r} declared "
                        f"{list(self.tensors[o].shape)} but the op gives "
                        f"{list(s)}"
                    )
            produced.update(op.outputs)

    def shapes_of(self, op: Op) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        return (
            [self.tensors[i].shape for i in op.inputs],
            [self.tensors[o].shape for o in op.outputs],
        )

    def flops(self, op: Op | None = None) -> int:
        """FLOPs of one op, or of the whole graph."""
        if op is not None:
            return op_flops(op, *self.shapes_of(op))
        return sum(self.flops(o) for o in self.ops)

    def macs(self) -> int:
        return sum(op_macs(o, self.shapes_of(o)[0]) for o in self.ops)

    def _weight_groups(self) -> list[tuple[list[Tensor], int | None]]:
        """The weights grouped by the model's weight they hold (``weight_sources``;
        a weight without a source is its own group), with that source's elements."""
        groups: dict[str, tuple[list[Tensor], int | None]] = {}
        for t in self.tensors.values():
            if t.kind != "weight":
                continue
            src, numel = self.weight_sources.get(t.name, (t.name, None))
            members, known = groups.setdefault(src, ([], None))
            members.append(t)
            groups[src] = (members, numel if numel is not None else known)
        return list(groups.values())

    @staticmethod
    def _once(sizes: list[int], source: int | None, per_element: int) -> int:
        """What weights of ``sizes`` holding one source of ``source`` elements
        count: all of them, but no more than the source (its elements at
        ``per_element``) and no less than the largest."""
        if len(sizes) == 1 or source is None:
            return sum(sizes)
        return max(max(sizes), min(sum(sizes), source * per_element))

    @property
    def parameters(self) -> int:
        """The weights' elements, each of the model's weights counted once and whole: a
        weight that holds another's values (another layout, a part, or repeated:
        ``weight_sources``) counts as that weight, so the count is the model's whatever
        dims it was imported at."""
        return sum(
            sum(t.numel for t in ts) if src is None else src for ts, src in self._weight_groups()
        )

    @property
    def weight_bytes(self) -> int:
        """The weights' bytes, each of the model's weights counted once (as
        :attr:`parameters`, at the widest dtype of the weights that hold it)."""
        return sum(
            self._once([t.nbytes for t in ts], src, max(DTYPE_BYTES[t.dtype] for t in ts))
            for ts, src in self._weight_groups()
        )

    def with_float_dtype(self, dtype: str) -> Graph:
        """This graph with every float tensor (fp32, fp16, bf16) in ``dtype``, one of
        those: an exported fp32 model run at fp16 or bf16 (``--precision``). Integer
        tensors (ids, masks, a quantised model's codes) keep theirs; the weights'
        values (cast to ``dtype`` when functional mode loads them), the quantisation
        parameters and the declared outputs carry over."""
        if dtype not in FLOAT_DTYPES:
            raise WorkloadError(
                f"graph {self.name!r}: {dtype!r} is not a float dtype ({', '.join(FLOAT_DTYPES)})"
            )
        tensors = [
            Tensor(t.name, t.shape, dtype, t.kind) if t.dtype in FLOAT_DTYPES else t
            for t in self.tensors.values()
        ]
        g = Graph(
            self.name,
            tensors,
            self.ops,
            sequences=self.sequences,
            params={**self.params, "precision": dtype},
            validate=False,
        )
        g.weight_values = dict(self.weight_values)
        g.quant = dict(self.quant)
        g.weight_sources = dict(self.weight_sources)
        g.declared_outputs = list(self.declared_outputs)
        return g

    def __repr__(self) -> str:
        return (
            f"Graph({self.name!r}, {len(self.ops)} ops, {len(self.tensors)} tensors, "
            f"{self.flops() / 1e9:.1f} GFLOP)"
        )


class GraphBuilder:
    """Builds a :class:`Graph` op by op, checking shapes as it goes.

    Every method returns the name of the op's output tensor. ``dtype`` is the default
    activation/weight dtype; ``group`` (settable with :meth:`group_scope` or per call)
    is the breakdown category of the ops added.
    """

    def __init__(self, name: str, dtype: str = "fp16") -> None:
        if dtype not in DTYPE_BYTES:
            raise WorkloadError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
        self.name = name
        self.dtype = dtype
        self.group = "other"
        self._tensors: dict[str, Tensor] = {}
        self._ops: list[Op] = []
        self._op_names: set[str] = set()

    # -- tensors ---------------------------------------------------------------------
    def _add_tensor(self, t: Tensor) -> str:
        if t.name in self._tensors:
            raise WorkloadError(f"graph {self.name!r}: tensor {t.name!r} defined twice")
        self._tensors[t.name] = t
        return t.name

    def input(self, name: str, shape: Sequence[int], dtype: str | None = None) -> str:
        return self._add_tensor(Tensor(name, tuple(shape), dtype or self.dtype, "input"))

    def weight(self, name: str, shape: Sequence[int], dtype: str | None = None) -> str:
        return self._add_tensor(Tensor(name, tuple(shape), dtype or self.dtype, "weight"))

    def shape(self, name: str) -> tuple[int, ...]:
        return self._tensors[name].shape

    def tensor(self, name: str) -> Tensor:
        return self._tensors[name]

    # -- ops -------------------------------------------------------------------------
    def op(
        self,
        kind: str,
        name: str,
        inputs: Sequence[str],
        *,
        group: str | None = None,
        dtype: str | None = None,
        out: str | None = None,
        **attrs: Any,
    ) -> str:
        """Add an op of any kind; its output tensor is named ``out`` or ``name``."""
        if name in self._op_names:
            raise WorkloadError(f"graph {self.name!r}: op name {name!r} used twice")
        for i in inputs:
            if i not in self._tensors:
                raise WorkloadError(f"op {name!r} ({kind}): input {i!r} does not exist")
        op = Op(name, kind, tuple(inputs), (out or name,), group or self.group, attrs)
        (shape,) = infer_shapes(op, [self._tensors[i].shape for i in inputs])
        if dtype is None:
            first = self._tensors[inputs[0]].dtype if inputs else self.dtype
            dtype = (
                self.dtype
                if kind == "embedding" or first in ("int64", "int32") and kind not in GEMM_KINDS
                else first
            )
            if kind == "embedding":
                dtype = self._tensors[inputs[1]].dtype
            if kind == "where":  # the branches' type, not the condition's
                dtype = self._tensors[inputs[1]].dtype
        self._add_tensor(Tensor(out or name, shape, dtype, "activation"))
        self._op_names.add(name)
        self._ops.append(op)
        return out or name

    def linear(
        self, name: str, x: str, n_out: int, *, bias: bool = True, group: str | None = None
    ) -> str:
        """``x[*, K] @ W[K, n_out] (+ b)``; creates the weight (and bias) tensors."""
        k = self.shape(x)[-1]
        w = self.weight(
            f"{name}.weight",
            (k, n_out),
            self._tensors[x].dtype if self._tensors[x].dtype in FLOAT_DTYPES + ("int8",) else None,
        )
        ins = [x, w]
        if bias:
            ins.append(self.weight(f"{name}.bias", (n_out,), self.tensor(w).dtype))
        return self.op("linear", name, ins, group=group)

    def graph(self, *, sequences: int = 1, params: Mapping[str, Any] | None = None) -> Graph:
        """The finished graph (validated again as a whole)."""
        return Graph(
            self.name, self._tensors.values(), self._ops, sequences=sequences, params=params
        )
