"""Backward pass of a workload graph, derived op by op (issue #11).

:func:`training_kernels` turns a forward :class:`~wia_hw.graph.Graph` into the kernels
of one training step: the forward ops as they are, then for each op in reverse order
the kernels of its gradient, then the optimizer's. Each kernel is a :class:`Kern`: one
op of the graph IR with the shapes and dtypes it reads and writes, so the emulator
times it through the same lowering as the forward pass (:func:`time_kernels`).

Gradients (``dY`` is the gradient of the op's output, shapes are the op's own):

* ``linear`` ``Y[M, N] = X[M, K] @ W[K, N] + b``: ``dX = dY @ W^T`` (``bmm`` with
  ``transpose_b``, ``[M, N] x [K, N]^T``), ``dW = X^T @ dY`` (``matmul`` ``[K, M] x
  [M, N]``: X is read transposed by the DMA's strided addressing, as cuBLAS' ``TN``
  layouts do, so ``X^T`` is a view), ``db`` = the column sums of ``dY`` (a
  ``global_avgpool``-class reduction reading ``M x N``, writing ``N``).
* ``matmul`` and ``bmm``: ``dA = dY @ B^T``, ``dB = A^T @ dY`` (with ``transpose_b``:
  ``dA = dY @ B``, ``dB = dY^T @ A``), batched like the forward op.
* ``conv2d`` (groups 1) ``Y = X * W``: ``dW`` is the convolution of ``X`` (channels as
  the batch) with ``dY`` as its kernel (dilation = the stride), ``[C*kh*kw] x [O]``
  over ``N*Ho*Wo``; ``dX``: stride 1, the transposed convolution (``dY`` with the
  flipped kernel, pad ``k - 1 - p``); stride > 1, ``dcol = dY @ W`` (``[N*Ho*Wo, O] x
  [O, C*kh*kw]``) and col2im, a scatter-add into ``dX`` (a pool-class kernel reading
  the columns, writing ``dX``).
* ``softmax``: ``dX = Y * (dY - rowsum(dY * Y))``, a row-reduction kernel reading
  ``Y`` and ``dY`` (4 flops per element).
* ``layer_norm``: ``dX`` in one row-reduction kernel reading ``X``, ``dY`` and
  ``gamma`` (recompute x-hat, two row sums, the combination: 10 flops per element);
  ``dgamma`` and ``dbeta``, the column sums of ``dY * x-hat`` and ``dY`` (one
  reduction reading ``X`` and ``dY``, 3 flops per element).
* unary ops (``gelu``, ``tanh``, ...): ``dX = dY * f'(X)`` reading the op's input
  (``Y`` for tanh, sigmoid, exp, relu) and ``dY``, with :data:`GRAD_FLOPS` per element;
  ``cast`` casts ``dY`` back.
* ``add``: the gradient passes through (a view); ``sub``'s second input is negated;
  ``mul``/``div``: one binary kernel per input; a broadcast input sums ``dY`` over the
  broadcast dims (a reduction).
* ``embedding``: a scatter-add of ``dY`` into the touched rows of the table's gradient
  (read-modify-write of those rows).
* views (``reshape``, contiguous ``slice``) pass ``dY`` through; ``transpose`` copies it
  back; ``concat`` is sliced back; the slices of one tensor are joined by a ``concat``
  copy (PyTorch's ``SplitBackward`` does ``cat``), a lone copying ``slice`` pads ``dY``
  into a zero tensor of the input's shape.
* A tensor read by several ops gets its gradients summed: one ``add`` per extra reader
  (autograd's accumulation).
* Inputs that are integers (ids) and graph inputs get no gradient.

The optimizer step runs over every parameter tensor (PyTorch's per-tensor loop): SGD is
one kernel ``p -= lr * g``; Adam three passes: first moment (reads ``g``, ``m``),
second moment (``g``, ``v``), update (``p``, ``m``, ``v``), its moments in fp32.

Gradient kernels read ``dY`` besides their forward inputs, so some break the forward
shape rules (a ``softmax`` with two inputs); they are timed in graphs built with
``validate=False``, whose shapes this module derives.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..emulator.allocator import DeviceOutOfMemory
from ..emulator.config import DeviceSpec
from ..emulator.errors import WorkloadError
from ..emulator.power import ThermalWarning
from ..graph import (
    BINARY_KINDS,
    DTYPE_BYTES,
    FLOAT_DTYPES,
    UNARY_KINDS,
    Graph,
    Op,
    Tensor,
    op_flops,
    window,
)

__all__ = [
    "Kern",
    "TrainingKernels",
    "training_kernels",
    "time_kernels",
    "kernel_energy_j",
    "GRAD_FLOPS",
    "OPTIMIZERS",
]

#: FLOPs per element of each unary op's gradient ``dY * f'(.)``: gelu (tanh form:
#: inner polynomial 4, tanh 4, derivative 4, times dY 1); relu (select); tanh
#: ``dY (1 - y^2)``; sigmoid ``dY y (1 - y)``; erf ``dY 2/sqrt(pi) exp(-x^2)``; exp
#: ``dY y``; sqrt ``dY / (2 y)``; the others their forward cost plus the product.
GRAD_FLOPS: dict[str, int] = {
    "gelu": 13,
    "relu": 1,
    "tanh": 3,
    "sigmoid": 3,
    "erf": 5,
    "exp": 1,
    "sqrt": 2,
    "neg": 1,
    "scale": 1,
    "clip": 2,
    "hardsigmoid": 2,
    "hardswish": 4,
    "lrn": 10,
    "leakyrelu": 2,
    "elu": 3,
    "softplus": 4,
}
#: Unary ops whose gradient reads the op's output instead of its input.
_GRAD_FROM_OUTPUT = ("relu", "tanh", "sigmoid", "exp", "sqrt")
SOFTMAX_GRAD_FLOPS_PER_ELEMENT = 4
LAYER_NORM_GRAD_FLOPS_PER_ELEMENT = 10
LAYER_NORM_PARAM_GRAD_FLOPS_PER_ELEMENT = 3
#: Optimizers: the passes over each parameter tensor, as (name, reads, writes, flops
#: per element); ``p``/``g`` are in the parameter's dtype, ``m``/``v`` fp32.
OPTIMIZERS: dict[str, tuple[tuple[str, tuple[str, ...], str, int], ...]] = {
    "sgd": (("update", ("p", "g"), "p", 2),),
    "adam": (
        ("first_moment", ("g", "m"), "m", 3),
        ("second_moment", ("g", "v"), "v", 4),
        ("update", ("p", "m", "v"), "p", 8),
    ),
}
_STATE_DTYPE = "fp32"


def operand_dtypes(param_dtype: str) -> dict[str, str]:
    """The dtype of each optimizer operand of a parameter of ``param_dtype``: ``p``
    and ``g`` its own, the state (``m``, ``v``) fp32."""
    return {"p": param_dtype, "g": param_dtype, "m": _STATE_DTYPE, "v": _STATE_DTYPE}


Shape = tuple[int, ...]


@dataclass(frozen=True)
class Kern:
    """One kernel of a training step: an op of the graph IR with its operands.

    ``kind``/``attrs`` as :class:`~wia_hw.graph.Op`; ``inputs`` the ``(shape, dtype)``
    it reads, ``output`` what it writes; ``phase`` is ``forward``, ``backward`` or
    ``optimizer``; ``params`` the parameter tensors whose gradient is complete once
    this kernel ran; ``tp_all_reduce_bytes`` > 0 marks a tensor-parallel all-reduce
    of that many bytes right after the kernel (its result is needed next). ``reads``,
    one per input: the graph tensor it is (a weight, or an activation the forward
    pass wrote, which a backward kernel reading it keeps alive until it runs: a
    *saved* activation), or ``None`` for a gradient or a temporary of the backward
    pass; not part of the signature."""

    name: str
    kind: str
    inputs: tuple[tuple[Shape, str], ...]
    output: tuple[Shape, str]
    phase: str
    attrs: tuple[tuple[str, Any], ...] = ()
    params: tuple[str, ...] = ()
    tp_all_reduce_bytes: int = 0
    reads: tuple[str | None, ...] = ()

    @property
    def signature(self) -> tuple[Any, ...]:
        """What its time depends on (kernels of equal signature take equal time)."""
        return (self.kind, self.inputs, self.output, self.attrs)

    @property
    def macs(self) -> int:
        return op_macs_of(self)

    @property
    def flops(self) -> int:
        op = Op(
            self.name,
            self.kind,
            tuple(f"i{i}" for i in range(len(self.inputs))),
            ("o",),
            attrs=dict(self.attrs),
        )
        return op_flops(op, [s for s, _ in self.inputs], [self.output[0]])


def op_macs_of(k: Kern) -> int:
    from ..graph import op_macs

    op = Op(k.name, k.kind, tuple(f"i{i}" for i in range(len(k.inputs))), ("o",), attrs=k.attrs)
    return op_macs(op, [s for s, _ in k.inputs])


@dataclass
class TrainingKernels:
    """The kernels of one training step of ``graph`` and its parameters, in the order
    their gradients become ready (reverse layer order: DDP's bucket order);
    ``optimizer_name`` the :data:`OPTIMIZERS` entry of the optimizer kernels."""

    graph: Graph
    forward: list[Kern]
    backward: list[Kern]
    optimizer: list[Kern]
    params: list[Tensor] = field(default_factory=list)
    optimizer_name: str = "adam"

    @property
    def param_bytes(self) -> int:
        return sum(t.nbytes for t in self.params)


def _attrs(**kw: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in kw.items() if v is not None))


def _freeze(a: Any) -> Any:
    if isinstance(a, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in a.items()))
    if isinstance(a, list):
        return tuple(_freeze(v) for v in a)
    return a


class _Builder:
    def __init__(self, graph: Graph, tp_ops: dict[str, int]) -> None:
        self.g = graph
        self.tp_ops = tp_ops  # op name -> all-reduce bytes after its (forward|backward) kernel
        self.out: list[Kern] = []
        # tensor -> gradient contributions: ("full", shape, dtype) or ("piece", ...)
        self.grads: dict[str, list[tuple[str, Shape, str]]] = {}
        self.readers: dict[str, int] = {}
        self.needs: set[str] = set()
        self.ready_now: list[str] = []
        for t in graph.tensors.values():
            if t.kind == "weight" and t.dtype in FLOAT_DTYPES:
                self.needs.add(t.name)
        for op in graph.ops:
            for i in op.inputs:
                self.readers[i] = self.readers.get(i, 0) + 1
            if any(i in self.needs for i in op.inputs):
                for o in op.outputs:
                    if graph.tensors[o].dtype in FLOAT_DTYPES or graph.tensors[o].dtype == "int8":
                        self.needs.add(o)

    def t(self, name: str) -> tuple[Shape, str]:
        x = self.g.tensors[name]
        return x.shape, x.dtype

    def emit(
        self,
        name: str,
        kind: str,
        inputs: Sequence[tuple[Shape, str]],
        output: tuple[Shape, str],
        params: Iterable[str] = (),
        tp: int = 0,
        reads: Sequence[str | None] | None = None,
        **attrs: Any,
    ) -> None:
        """A backward kernel; ``reads`` names the graph tensor each input is (``None``
        for a gradient), all gradients when not given."""
        self.out.append(
            Kern(
                name,
                kind,
                tuple((tuple(s), d) for s, d in inputs),
                (tuple(output[0]), output[1]),
                "backward",
                _attrs(**attrs),
                tuple(params),
                tp,
                tuple(reads) if reads is not None else (None,) * len(inputs),
            )
        )

    def add_grad(self, tensor: str, how: str = "full", shape: Shape | None = None) -> None:
        if tensor not in self.needs:
            return
        s, d = self.t(tensor)
        self.grads.setdefault(tensor, []).append((how, shape or s, d))

    def grad_of(self, tensor: str, at: str) -> tuple[Shape, str] | None:
        """The gradient of ``tensor``, summing its contributions (emits the kernels)."""
        parts = self.grads.pop(tensor, [])
        if not parts:
            return None
        s, d = self.t(tensor)
        pieces = [(p[1], p[2]) for p in parts if p[0] == "piece"]
        fulls = [p for p in parts if p[0] == "full"]
        n_full = len(fulls)
        if pieces:
            self.emit(f"{at}.grad_join", "concat", pieces, (s, d), flops=0)
            n_full += 1
        for j in range(n_full - 1):
            self.emit(f"{at}.grad_accumulate{j}", "add", [(s, d), (s, d)], (s, d))
        return s, d

    def reduce(
        self,
        name: str,
        srcs: Sequence[tuple[Shape, str]],
        out: tuple[Shape, str],
        params: Iterable[str] = (),
        flops_per: int = 1,
        reads: Sequence[str | None] | None = None,
    ) -> None:
        """A column reduction of ``srcs`` (all of one numel) to ``out``'s numel."""
        n_in = math.prod(srcs[0][0])
        n_out = math.prod(out[0])
        rows = max(1, n_in // n_out)
        self.emit(
            name,
            "global_avgpool",
            [((1, n_out, rows, 1), d) for _, d in srcs],
            ((1, n_out, 1, 1), out[1]),
            params,
            reads=reads,
            flops=flops_per * n_in * len(srcs),
        )

    # -- per op kind ----------------------------------------------------------------
    def op(self, op: Op) -> None:
        g = self.g
        outs = [o for o in op.outputs if o in self.needs]
        if not outs:
            return
        dy = self.grad_of(op.outputs[0], op.name)
        need_in = [i for i in op.inputs if i in self.needs]
        if dy is None or not need_in:
            return
        k, n = op.kind, op.name
        ins = [self.t(i) for i in op.inputs]
        y = self.t(op.outputs[0])
        wants = [i in self.needs for i in op.inputs]
        params = [i for i in op.inputs if g.tensors[i].kind == "weight" and i in self.needs]
        tp = self.tp_ops.get(n, 0)
        if k == "linear":
            (xs, xd), (ws, wd) = ins[0], ins[1]
            m, kk, nn = math.prod(xs[:-1]), ws[0], ws[1]
            if wants[0]:
                self.emit(
                    f"{n}.grad_input",
                    "bmm",
                    [((1, m, nn), dy[1]), ((1, kk, nn), wd)],
                    ((1, m, kk), xd),
                    tp=tp,
                    reads=(None, op.inputs[1]),
                    transpose_b=True,
                )
                self.add_grad(op.inputs[0])
            if wants[1]:
                self.emit(
                    f"{n}.grad_weight",
                    "matmul",
                    [((kk, m), xd), ((m, nn), dy[1])],
                    ((kk, nn), wd),
                    [op.inputs[1]],
                    reads=(op.inputs[0], None),
                )
            if len(op.inputs) == 3 and wants[2]:
                self.reduce(f"{n}.grad_bias", [((m, nn), dy[1])], ins[2], [op.inputs[2]])
            return
        if k == "matmul":
            (a_s, ad), (b_s, bd) = ins
            m, kk, nn = a_s[0], a_s[1], b_s[1]
            if wants[0]:
                self.emit(
                    f"{n}.grad_a",
                    "bmm",
                    [((1, m, nn), dy[1]), ((1, kk, nn), bd)],
                    ((1, m, kk), ad),
                    reads=(None, op.inputs[1]),
                    transpose_b=True,
                )
                self.add_grad(op.inputs[0])
            if wants[1]:
                self.emit(
                    f"{n}.grad_b",
                    "matmul",
                    [((kk, m), ad), ((m, nn), dy[1])],
                    (b_s, bd),
                    [op.inputs[1]] if op.inputs[1] in params else [],
                    reads=(op.inputs[0], None),
                )
                self.add_grad(op.inputs[1])
            return
        if k == "bmm":
            (a_s, ad), (b_s, bd) = ins
            bt = tuple(a_s[:-2])
            m, kk = a_s[-2], a_s[-1]
            tb = bool(op.attrs.get("transpose_b"))
            nn = b_s[-2] if tb else b_s[-1]
            pb = [op.inputs[1]] if op.inputs[1] in params else []
            if wants[0]:  # dA = dY @ B (B stored transposed), else dY @ B^T
                self.emit(
                    f"{n}.grad_a",
                    "bmm",
                    [(y[0], dy[1]), (b_s, bd)],
                    (a_s, ad),
                    reads=(None, op.inputs[1]),
                    **({} if tb else {"transpose_b": True}),
                )
                self.add_grad(op.inputs[0])
            if wants[1]:
                if tb:  # dB = dY^T @ A: [*, N, M] x [*, M, K]
                    self.emit(
                        f"{n}.grad_b",
                        "bmm",
                        [(bt + (nn, m), dy[1]), (a_s, ad)],
                        (b_s, bd),
                        pb,
                        reads=(None, op.inputs[0]),
                    )
                else:  # dB = A^T @ dY: [*, K, M] x [*, M, N]
                    self.emit(
                        f"{n}.grad_b",
                        "bmm",
                        [(bt + (kk, m), ad), (y[0], dy[1])],
                        (b_s, bd),
                        pb,
                        reads=(op.inputs[0], None),
                    )
                self.add_grad(op.inputs[1])
            return
        if k == "conv2d":
            self.conv(op, ins, y, dy, wants, tp)
            return
        if k == "softmax":
            self.emit(
                f"{n}.grad",
                "softmax",
                [y, dy],
                ins[0],
                reads=(op.outputs[0], None),
                flops=SOFTMAX_GRAD_FLOPS_PER_ELEMENT * math.prod(y[0]),
                **dict(op.attrs),
            )
            self.add_grad(op.inputs[0])
            return
        if k == "layer_norm":
            xs, xd = ins[0]
            h = xs[-1]
            numel = math.prod(xs)
            if wants[0]:
                self.emit(
                    f"{n}.grad_input",
                    "layer_norm",
                    [ins[0], dy] + ins[1:2],
                    ins[0],
                    reads=(op.inputs[0], None, *op.inputs[1:2]),
                    flops=LAYER_NORM_GRAD_FLOPS_PER_ELEMENT * numel,
                )
                self.add_grad(op.inputs[0])
            if len(op.inputs) > 1 and any(wants[1:]):
                self.reduce(
                    f"{n}.grad_gamma_beta",
                    [ins[0], dy],
                    ((2, h), xd),
                    params,
                    flops_per=LAYER_NORM_PARAM_GRAD_FLOPS_PER_ELEMENT,
                    reads=(op.inputs[0], None),
                )
            return
        if k in UNARY_KINDS:
            if k == "identity":
                self.add_grad(op.inputs[0])
                return
            if k == "cast":
                self.emit(f"{n}.grad", "cast", [dy], ins[0])
                self.add_grad(op.inputs[0])
                return
            src = y if k in _GRAD_FROM_OUTPUT else ins[0]
            self.emit(
                f"{n}.grad",
                k,
                [src, dy],
                ins[0],
                reads=(op.outputs[0] if k in _GRAD_FROM_OUTPUT else op.inputs[0], None),
                flops=GRAD_FLOPS.get(k, UNARY_KINDS[k] + 1) * math.prod(y[0]),
            )
            self.add_grad(op.inputs[0])
            return
        if k in BINARY_KINDS:
            if k in ("compare", "logical"):
                return  # not differentiable
            numel = math.prod(y[0])
            for j, i in enumerate(op.inputs):
                if not wants[j]:
                    continue
                s_i, other = ins[j], ins[1 - j]
                out = (y[0], s_i[1])
                before = len(self.out)
                if k == "sub" and j == 1:  # -dY
                    self.emit(f"{n}.grad_{j}", "neg", [dy], out)
                elif k == "div" and j == 1:  # -dY a / b^2
                    self.emit(
                        f"{n}.grad_{j}",
                        "div",
                        [dy, ins[0], ins[1]],
                        out,
                        reads=(None, *op.inputs),
                        flops=3 * numel,
                    )
                elif k not in ("add", "sub"):  # dY * other (mul, div, max/min select...)
                    self.emit(
                        f"{n}.grad_{j}",
                        k,
                        [dy, other],
                        out,
                        reads=(None, op.inputs[1 - j]),
                        flops=BINARY_KINDS[k] * numel,
                    )
                mine = [i] if i in params else []
                if math.prod(s_i[0]) != numel:  # broadcast: sum dY over those dims
                    self.reduce(f"{n}.grad_{j}_sum", [out], s_i, mine)
                elif mine and len(self.out) > before:
                    self.out[-1] = _with_params(self.out[-1], mine)
                elif mine:  # a pass-through gradient is ready with dY
                    self.ready_now.extend(mine)
                self.add_grad(i)
            return
        if k == "where":  # dX = where(cond, dY, 0), dY' = where(cond, 0, dY)
            numel = math.prod(y[0])
            for j in (1, 2):
                if not wants[j]:
                    continue
                s_i, i = ins[j], op.inputs[j]
                out = (y[0], s_i[1])
                self.emit(
                    f"{n}.grad_{j}",
                    "where",
                    [ins[0], dy, dy],
                    out,
                    reads=(op.inputs[0], None, None),
                    flops=numel,
                )
                mine = [i] if i in params else []
                if math.prod(s_i[0]) != numel:  # broadcast: sum dY over those dims
                    self.reduce(f"{n}.grad_{j}_sum", [out], s_i, mine)
                elif mine:
                    self.out[-1] = _with_params(self.out[-1], mine)
                self.add_grad(i)
            return
        if k == "embedding":
            if wants[1]:
                rows = (y[0], ins[1][1])
                self.emit(f"{n}.grad_table", "add", [dy, rows], rows, [op.inputs[1]])
            return
        if k == "reshape":
            self.add_grad(op.inputs[0])
            return
        if k == "slice":  # a part of the input: joined with its siblings (or zeros)
            whole = ins[0][0] == y[0]
            self.add_grad(op.inputs[0], "full" if whole else "piece", y[0])
            return
        if k == "transpose":
            self.emit(
                f"{n}.grad",
                "transpose",
                [dy],
                ins[0],
                perm=tuple(sorted(range(len(y[0])), key=lambda a: op.attrs["perm"][a])),
            )
            self.add_grad(op.inputs[0])
            return
        if k == "concat":
            for j, i in enumerate(op.inputs):
                if wants[j]:
                    self.emit(f"{n}.grad_{j}", "slice", [dy], ins[j], flops=0)
                    self.add_grad(i)
            return
        if k in ("maxpool", "avgpool"):
            self.emit(
                f"{n}.grad",
                k,
                [ins[0], dy],
                ins[0],
                reads=(op.inputs[0], None),
                flops=math.prod(ins[0][0]),
            )
            self.add_grad(op.inputs[0])
            return
        if k == "global_avgpool":
            xs = ins[0][0]
            self.emit(
                f"{n}.grad",
                "scale",
                [((xs[0] * xs[1], 1), dy[1])],
                ((xs[0] * xs[1], xs[2] * xs[3]), ins[0][1]),
                flops=math.prod(xs),
            )
            self.add_grad(op.inputs[0])
            return
        raise WorkloadError(f"op {n!r} ({k}): its gradient is not modelled")

    def conv(
        self,
        op: Op,
        ins: list[tuple[Shape, str]],
        y: tuple[Shape, str],
        dy: tuple[Shape, str],
        wants: list[bool],
        tp: int,
    ) -> None:
        n, a = op.name, op.attrs
        (xs, xd), (ws, wd) = ins[0], ins[1]
        if a.get("groups", 1) != 1:
            raise WorkloadError(
                f"op {n!r} (conv2d): the gradient of a grouped convolution "
                f"(groups={a.get('groups')}) is not modelled"
            )
        nb, c, h, w = xs
        o, _, kh, kw = ws
        ho, wo = y[0][2], y[0][3]
        win = window(op, (kh, kw))
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = win.stride, win.dilation, win.pad
        if wants[1]:  # dW[C, O, kh, kw] = conv(X^T [C, N, H, W], dY^T [O, N, Ho, Wo])
            # only the rows and columns the forward windows touched (a floor in Ho)
            he = sh * (ho - 1) + dh * (kh - 1) + 1 - pt - pb
            we = sw * (wo - 1) + dw * (kw - 1) + 1 - pl - pr
            self.emit(
                f"{n}.grad_weight",
                "conv2d",
                [((c, nb, min(h, he), min(w, we)), xd), ((o, nb, ho, wo), dy[1])],
                ((c, o, kh, kw), wd),
                [op.inputs[1]],
                reads=(op.inputs[0], None),
                pad=win.pad,
                dilation=win.stride,
                stride=win.dilation,
            )
        if len(op.inputs) == 3 and wants[2]:
            self.reduce(f"{n}.grad_bias", [dy], ins[2], [op.inputs[2]])
        if wants[0]:
            # stride and dilation 1: dX is the full convolution of dY with W
            full = (kh - 1 - pt, kw - 1 - pl, kh - 1 - pb, kw - 1 - pr)
            if win.stride == (1, 1) and win.dilation == (1, 1) and min(full) >= 0:
                self.emit(
                    f"{n}.grad_input",
                    "conv2d",
                    [dy, ((c, o, kh, kw), wd)],
                    ins[0],
                    reads=(None, op.inputs[1]),
                    pad=full,
                )
            else:
                m, kc = nb * ho * wo, c * kh * kw
                self.emit(
                    f"{n}.grad_col",
                    "matmul",
                    [((m, o), dy[1]), ((o, kc), wd)],
                    ((m, kc), xd),
                    reads=(None, op.inputs[1]),
                )
                # col2im: every column element is added into its input position
                self.emit(
                    f"{n}.grad_col2im",
                    "avgpool",
                    [((nb, c, kh * kw, ho * wo), xd)],
                    ins[0],
                    flops=m * kc,
                )
            self.add_grad(op.inputs[0])


def _with_params(k: Kern, params: Sequence[str]) -> Kern:
    from dataclasses import replace

    return replace(k, params=k.params + tuple(params))


def training_kernels(
    graph: Graph,
    *,
    optimizer: str = "adam",
    tp_forward: dict[str, int] | None = None,
    tp_backward: dict[str, int] | None = None,
) -> TrainingKernels:
    """The forward, backward and optimizer kernels of one training step of ``graph``.

    ``tp_forward``/``tp_backward`` map op names to the bytes of the tensor-parallel
    all-reduce that follows their forward kernel / their input-gradient kernel
    (:mod:`._parallel` fills them). Raises :class:`~wia_hw.WorkloadError` for an
    optimizer other than sgd or adam, a fused graph, a graph with int8 weights or without float
    parameters, or an op whose
    gradient is not modelled (grouped convolutions)."""
    if optimizer not in OPTIMIZERS:
        raise WorkloadError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    fused = next((op.name for op in graph.ops if "fusion" in op.attrs), None)
    if fused is not None:
        raise WorkloadError(
            f"graph {graph.name!r} is fused (apply_fusion marked op {fused!r}): the backward "
            "pass is derived from the unfused graph; train the graph before apply_fusion"
        )
    quant = [t.name for t in graph.tensors.values() if t.kind == "weight" and t.dtype == "int8"]
    if quant:
        raise WorkloadError(
            f"graph {graph.name!r} has int8 weights ({quant[0]!r}, ...): a quantised graph is "
            "inference-only; train it in precision fp16, bf16 or fp32"
        )
    params = [t for t in graph.tensors.values() if t.kind == "weight" and t.dtype in FLOAT_DTYPES]
    if not params:
        raise WorkloadError(
            f"graph {graph.name!r} has no float parameters to train (int8 graphs are "
            "inference-only; build it with precision fp16, bf16 or fp32)"
        )
    tpf = tp_forward or {}
    fwd = []
    for op in graph.ops:
        ins, outs = graph.shapes_of(op)
        fwd.append(
            Kern(
                op.name,
                op.kind,
                tuple((s, graph.tensors[i].dtype) for s, i in zip(ins, op.inputs, strict=True)),
                (outs[0], graph.tensors[op.outputs[0]].dtype),
                "forward",
                _freeze(dict(op.attrs)),
                (),
                tpf.get(op.name, 0),
                tuple(op.inputs),
            )
        )
    b = _Builder(graph, tp_backward or {})
    # the loss gradient arrives at every float output nobody reads
    for op in graph.ops:
        for o in op.outputs:
            if b.readers.get(o, 0) == 0:
                b.add_grad(o)
    for op in reversed(graph.ops):
        b.op(op)
        if b.ready_now and b.out:
            b.out[-1] = _with_params(b.out[-1], b.ready_now)
            b.ready_now = []
    # parameters in the order their gradients complete
    order: list[str] = []
    seen: set[str] = set()
    for kern in b.out:
        for p in kern.params:
            if p not in seen:
                seen.add(p)
                order.append(p)
    for p in params:  # parameters whose gradient no kernel writes (unused): last
        if p.name not in seen:
            order.append(p.name)
    opt = []
    for name in order:
        t = graph.tensors[name]
        shape = t.shape if len(t.shape) > 1 else (1, t.shape[0])
        dt = operand_dtypes(t.dtype)
        for pas, reads, writes, fl in OPTIMIZERS[optimizer]:
            opt.append(
                Kern(
                    f"{name}.{optimizer}_{pas}",
                    "add",
                    tuple((shape, dt[r]) for r in reads),
                    (shape, dt[writes]),
                    "optimizer",
                    _attrs(flops=fl * t.numel),
                )
            )
    return TrainingKernels(graph, fwd, b.out, opt, [graph.tensors[p] for p in order], optimizer)


# -- timing ---------------------------------------------------------------------------

#: (spec, kernel signature) -> (cycles, joules) of the kernel's op in its timing run:
#: the joules the device counted from the op's start to its end (dynamic, and static
#: over those cycles), not the probe's final write-back, which lies outside the cycles
_CACHE: dict[tuple[str, tuple[Any, ...]], tuple[int, float]] = {}


class _OpTimer:
    """Cycles and joules of each op of a run, from its first kernel's start to its
    last's end (the device's energy counter read at both ends)."""

    wants_trace = False

    def __init__(self) -> None:
        self.cycles: dict[str, int] = {}
        self.energy_pj: dict[str, float] = {}
        self._t0 = 0
        self._e0 = 0.0
        self._dev: Any = None

    def run_begin(self, ctx: Any, graph: Any, lowered: Any) -> None:
        self._dev = ctx.device

    def op_begin(self, op: Op, kernels: Any, cycle: int) -> None:
        self._t0 = cycle
        self._e0 = self._dev.counters.energy_pj

    def op_end(self, op: Op, records: Any, cycle: int) -> None:
        self.cycles[op.name] = cycle - self._t0
        self.energy_pj[op.name] = self._dev.counters.energy_pj - self._e0

    def run_end(self, result: Any, trace: Any) -> None:
        pass


def time_kernels(spec: DeviceSpec, kernels: Iterable[Kern]) -> dict[tuple[Any, ...], int]:
    """Cycles of each distinct kernel (by :attr:`Kern.signature`) on ``spec``.

    A kernel whose operands do not fit the device's memory raises
    :class:`~wia_hw.emulator.allocator.DeviceOutOfMemory` naming it (its phase, op
    name and output).

    Each kernel not timed before on this spec (a process-wide cache) runs alone, as a
    one-op graph on a fresh device (cold caches), through :func:`wia_hw.lowering.lower`
    and the emulator like any workload, so its cycles do not depend on which kernels
    were timed before; an op's cycles are from its first kernel's start to its last's
    end."""
    from ..runtime import Context

    key = repr(spec)
    out: dict[tuple[Any, ...], int] = {}
    todo: dict[tuple[Any, ...], Kern] = {}
    for k in kernels:
        sig = k.signature
        if sig in out or sig in todo:
            continue
        hit = _CACHE.get((key, sig))
        if hit is None:
            todo[sig] = k
        else:
            out[sig] = hit[0]
    for sig, k in todo.items():  # each alone on a fresh device: history cannot matter
        tensors: list[Tensor] = []
        ins = []
        for j, (s, d) in enumerate(k.inputs):
            tensors.append(Tensor(f"in{j}", s, d, "input"))
            ins.append(f"in{j}")
        tensors.append(Tensor("out", k.output[0], k.output[1]))
        op = Op("k", k.kind, tuple(ins), ("out",), k.phase, dict(k.attrs))
        probe = Graph(k.name, tensors, [op], validate=False)
        ctx = Context(spec)
        timer = _OpTimer()
        ctx.observers.append(timer)
        try:
            # a probe that heats past the throttle point is not the user's run: the
            # iteration's own warning (TrainingThermalWarning) speaks for the step
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ThermalWarning)
                ctx.run(probe)
        except DeviceOutOfMemory as e:  # name the kernel and its operand, not the probe
            m = re.search(r"'(in\d+|out)' does not fit: (.*)$", str(e))
            if m is None:
                raise
            which, why = m.groups()
            j = None if which == "out" else int(which[2:])
            s, d = k.output if j is None else k.inputs[j]
            operand = "output" if j is None else f"input {j}"
            raise DeviceOutOfMemory(
                f"{k.phase} kernel {k.name!r} ({k.kind}): its {operand} {list(s)} {d} does "
                f"not fit device memory ({spec.name}): {why}"
            ) from None
        c = timer.cycles["k"]
        _CACHE[(key, sig)] = (c, timer.energy_pj["k"] * 1e-12)
        out[sig] = c
    return out


def kernel_energy_j(spec: DeviceSpec, kernels: Iterable[Kern]) -> float:
    """Joules of ``kernels`` (each as often as listed) on ``spec``, each as its
    :func:`time_kernels` run spent them over the cycles it reports (dynamic energy, and
    static power over those cycles; not the probe run's final write-back, whose cycles
    are not the kernel's either); kernels not timed yet are timed first."""
    kernels = list(kernels)
    time_kernels(spec, kernels)
    key = repr(spec)
    return sum(_CACHE[(key, k.signature)][1] for k in kernels)


def kern_bytes(k: Kern) -> int:
    """Bytes a kernel reads and writes once each (its compulsory traffic)."""
    return (
        sum(math.prod(s) * DTYPE_BYTES[d] for s, d in k.inputs)
        + math.prod(k.output[0]) * DTYPE_BYTES[k.output[1]]
    )
