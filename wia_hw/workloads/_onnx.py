"""ONNX import: an ONNX model (file or ``onnx.ModelProto``) to a wia-hw :class:`Graph`.

Only shapes and dtypes are imported (weights' values are not carried); ``onnx`` is an
optional dependency (``pip install 'wia-hw[onnx]'``), imported on first use. A model
whose weights sit in an external data file (``model.onnx`` + ``model.onnx.data``)
loads with or without that file: only small constants' values are ever read.

The pipeline: fix the symbolic input dims; ONNX shape inference; fold every constant
and static-shape subgraph (:mod:`._onnx_fold`: ``Shape``, ``Gather``, ``Unsqueeze``,
``Concat``, ``ConstantOfShape``, ``Range``, ``Expand``, ``Where``, ``Equal``, ``Cast``
... on constants are evaluated by ``onnx.reference``); list the op types left that
have no mapping (all at once, with counts); strict shape inference; map each node
below; recognise attention, decomposed layer norm and Erf-written GELU
(:mod:`._onnx_patterns`). ``docs/ONNX.md`` has the op table with status per op.

Mapping of ONNX node types (default domain) to op kinds:

=====================================  ================================================
ONNX                                   wia-hw
=====================================  ================================================
MatMul                                 ``linear`` when B is 2-D (B an initializer or
                                       A more than 2-D), ``matmul`` for 2-D x 2-D
                                       activations, ``bmm`` for N-D x N-D with equal
                                       batch dims; a 1-D operand is a row (A) or a
                                       column (B), dropped after; B with unit batch
                                       dims is its last two
Gemm                                   ``linear`` (B constant) or ``matmul``; a
                                       transposed constant A/B is transposed at
                                       import, a transposed activation gets a
                                       ``transpose`` op; C of shape [N] is the bias,
                                       any other C an ``add``; alpha/beta fold into
                                       constants, else a ``scale`` op
Attention (opset 23)                   ``bmm``, ``add`` of the mask, ``softmax``,
                                       ``bmm``; heads by views and transposes
Einsum                                 ``bmm`` (or ``matmul``/``linear``) between
                                       ``transpose`` and ``reshape`` views
Add Sub Mul Div Pow Max Min Sum        the binary op (constants become weights); n
                                       inputs of Sum, Max, Min: n - 1 ops
Equal Less Greater LessOrEqual         ``compare``; And Or Xor: ``logical``
GreaterOrEqual And Or Xor
Relu Gelu Tanh Sigmoid Erf Sqrt Exp    the unary op (Dropout is ``identity``; IsNaN
Neg Identity Cast Clip HardSigmoid     and IsInf are ``isnan``)
HardSwish LRN Dropout IsNaN IsInf Not
LeakyRelu Elu Softplus; PRelu          ``leakyrelu``, ``elu``, ``softplus``; ``prelu``
                                       (binary, the slope a weight)
Softmax LogSoftmax LayerNormalization  ``softmax`` (LogSoftmax: ``log``), ``layer_norm``
                                       (from any axis, viewed flat)
RMSNormalization                       ``layer_norm`` with ``rms`` (from any axis, viewed
                                       flat)
Log Reciprocal Abs Sin Cos Floor Ceil  the unary op; CastLike is ``cast``
Round Sign CastLike
Conv                                   ``conv2d`` (1-D, 2-D or 3-D: any kernel,
                                       strides, dilations, pads; grouped and
                                       depthwise through ``groups``; 1-D as height 1
                                       between views; 3-D as one ``conv2d`` over the
                                       depth taps stacked into the channels)
ConvTranspose                          a 1x1 ``conv2d`` into ``O x kh x kw`` columns,
                                       ``col2im`` (the overlap-add), ``add`` of the bias
BatchNormalization                     folded into the Conv before it when that Conv
                                       feeds only it and the BN parameters are
                                       constants (so is a Mul, Add, Sub or Div by a
                                       per-channel constant, as tf2onnx leaves a BN
                                       after a depthwise Conv); else ``mul`` + ``add``
                                       by per-channel constants
MaxPool AveragePool GlobalAveragePool  ``maxpool``, ``avgpool``, ``global_avgpool``
                                       (1-D, 2-D or 3-D; pads, ceil_mode,
                                       count_include_pad as ONNX; 3-D pools per
                                       depth tap, then ``max`` or ``add``)
ReduceMean ReduceSum ReduceMax         ``global_avgpool`` (``reduce``) over the reduced
ReduceMin ArgMax ArgMin                axes moved last (a ``transpose`` when they are
                                       not), between ``reshape`` views; ArgMax and
                                       ArgMin over the last non-unit axis
Reshape Flatten Squeeze Unsqueeze      ``reshape`` (to the inferred shape)
Transpose, Concat                      ``transpose``, ``concat``
Slice, Split                           ``slice`` per cut axis (any nonzero step) or per
                                       output
Gather                                 ``embedding`` (a 2-D constant table, or axis 0
                                       of any tensor between ``reshape`` views); a
                                       constant run of indices is a ``slice``
GatherElements                         ``embedding`` of the flattened data (one row
                                       per output element)
GatherND (batch_dims 0)                ``embedding`` of ``data`` as rows (one row per
                                       index row, its linearised index a ``scale``
                                       and a ``global_avgpool`` sum)
Where                                  ``where`` when the condition or both branches
                                       are computed at run time; a constant mask on
                                       one run-time branch: ``add`` of the fill
Expand, Trilu                          one binary op per element of the output
                                       (``add``/``mul`` with the constant operands
                                       merged into one weight)
Pad (constant, edge, reflect)          a zero Pad of the spatial axes that feeds only
                                       a 2-D Conv goes into its pads (Keras's
                                       ZeroPadding2D); else ``concat`` per padded
                                       axis of fill weights or
                                       border-row ``slice`` copies
Resize, Upsample (nearest, integer     ``concat`` copies between ``reshape`` views
scales)
Resize, Upsample (linear)              ``resize`` (bilinear)
LSTM, GRU, RNN                         unrolled over the sequence (:mod:`._onnx_rnn`):
                                       ``linear`` of the input, per step a ``linear`` of
                                       the state and the gates' vector ops
Constant                               a weight tensor (when not folded)
=====================================  ================================================

A model with op types that have no mapping raises one ``WorkloadError`` naming every
such op type and its node count (``... 2 unsupported ONNX op types: HardSwish x12,
custom::Foo x1``). Initializers become ``weight`` tensors (created when a mapped op
reads them), graph inputs ``input`` tensors. Element types map FLOAT/FLOAT16/BFLOAT16/
INT8/INT32/INT64/BOOL to fp32/fp16/bf16/int8/int32/int64/bool and UINT8 to int8.

The **group** of an op (its breakdown row) is the first component of the node name
when the name is a ``/``-path with two or more components (PyTorch's exporter names
nodes ``/encoder/layer.0/attention/MatMul``, giving ``encoder``), after the leading
components that every path-named node shares (a wrapper's ``/model/...``), otherwise
the op type lower-cased (``matmul``).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Mapping
from numbers import Integral
from pathlib import Path
from typing import Any

import numpy as np

from ..emulator.errors import WorkloadError
from ..emulator.window import Window
from ..graph import Graph, GraphBuilder, QuantParams
from ._onnx_funcs import expand_functions, replace_removed_ops, upgrade_old_opset
from ._onnx_ort import expand_ort_ops
from ._onnx_qdq import QDQ_OPS, quant_of, transformed
from ._onnx_qdq import rewrite as rewrite_qdq
from ._onnx_rnn import RNN_OPS, map_rnn

_MISSING = "ONNX import needs the 'onnx' package: pip install 'wia-hw[onnx]'"

_BINARY = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "Pow": "pow",
    "Max": "max",
    "Min": "min",
    "Equal": "compare",
    "Less": "compare",
    "Greater": "compare",
    "LessOrEqual": "compare",
    "GreaterOrEqual": "compare",
    "And": "logical",
    "Or": "logical",
    "Xor": "logical",
    "PRelu": "prelu",
}
_UNARY = {
    **{
        t: t.lower()
        for t in (
            "Tan",
            "Asin",
            "Acos",
            "Atan",
            "Sinh",
            "Cosh",
            "Asinh",
            "Acosh",
            "Atanh",
            "Mish",
            "Swish",
            "Selu",
            "Celu",
            "ThresholdedRelu",
            "Softsign",
            "Shrink",
        )
    },
    "Relu": "relu",
    "Gelu": "gelu",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "Erf": "erf",
    "Sqrt": "sqrt",
    "Exp": "exp",
    "Neg": "neg",
    "Identity": "identity",
    "Cast": "cast",
    "Clip": "clip",
    "HardSigmoid": "hardsigmoid",
    "HardSwish": "hardswish",
    "LRN": "lrn",
    "Dropout": "identity",
    "IsNaN": "isnan",
    "IsInf": "isnan",
    "Not": "not",
    "LeakyRelu": "leakyrelu",
    "Elu": "elu",
    "Softplus": "softplus",
    "CastLike": "cast",
    "Log": "log",
    "Reciprocal": "reciprocal",
    "Abs": "abs",
    "Sin": "sin",
    "Cos": "cos",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Sign": "sign",
}
_RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
#: reductions written as (op before, reduction, op after)
_REDUCE_PARTS = {
    "ReduceSumSquare": ("square", "sum", None),
    "ReduceL1": ("abs", "sum", None),
    "ReduceL2": ("square", "sum", "sqrt"),
    "ReduceLogSum": (None, "sum", "log"),
    "ReduceLogSumExp": ("exp", "sum", "log"),
    "ReduceProd": (None, "prod", None),
}
_REDUCES = (
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ArgMax",
    "ArgMin",
    *_REDUCE_PARTS,
)
_OTHER = (
    "MatMul",
    "Gemm",
    "Einsum",
    "Attention",
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "RMSNormalization",
    "Conv",
    "ConvTranspose",
    "BatchNormalization",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Transpose",
    "Concat",
    "Slice",
    "Split",
    "Gather",
    "GatherElements",
    "GatherND",
    "Where",
    "Expand",
    "Trilu",
    "Pad",
    "Resize",
    "Upsample",
    "Constant",
    "InstanceNormalization",
    "GroupNormalization",
    "LpNormalization",
    "DepthToSpace",
    "SpaceToDepth",
    "Tile",
    "GlobalMaxPool",
    "Mean",
    "CumSum",
    "OneHot",
)
#: ONNX op types the importer maps.
SUPPORTED_OPS = (
    ("Sum",) + tuple(_BINARY) + tuple(_UNARY) + _RESHAPES + _REDUCES + _OTHER + QDQ_OPS + RNN_OPS
)
#: Op types that only compute shapes, indices or masks: supported when their inputs
#: are constants or static shapes (they are folded away), never as run-time ops.
FOLDED_OPS = (
    "Shape",
    "Size",
    "ConstantOfShape",
    "Range",
    "NonZero",
    "ScatterND",
    "ScatterElements",
    "Mod",
)


#: Graph names the exporters give every model: the file's stem names it instead.
_GENERIC_NAMES = ("", "main_graph", "torch_jit", "torch-jit-export", "tf2onnx")
#: the names exporters give the sequence dim, which ``seq`` (``--seq``) fixes: the
#: torch exporters' dynamic axes as users name them, Hugging Face Optimum's
SEQ_DIMS = ("seq", "sequence", "seq_len", "seq_length", "sequence_length")


def _elem_dtypes(onnx: Any) -> dict[int, str]:
    tp = onnx.TensorProto
    return {
        tp.FLOAT: "fp32",
        tp.FLOAT16: "fp16",
        tp.BFLOAT16: "bf16",
        tp.INT8: "int8",
        tp.UINT8: "int8",
        tp.INT32: "int32",
        tp.INT64: "int64",
        tp.BOOL: "bool",
    }


def _load(onnx: Any, model: Any) -> tuple[Any, str, str]:
    """(a private copy of the ModelProto, graph name, source description)."""
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise WorkloadError(f"ONNX file not found: {str(path)!r}")
        from google.protobuf import json_format, text_format
        from google.protobuf.message import DecodeError

        unreadable = (
            OSError,
            ValueError,
            DecodeError,
            json_format.ParseError,
            text_format.ParseError,
            onnx.parser.ParseError,
        )
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except unreadable as e:
            # onnx picks a parser by suffix: binary protobuf, JSON, text format, .onnxtxt
            arg = e.args[0] if e.args else ""
            why = (arg.decode(errors="replace") if isinstance(arg, bytes) else str(e)).strip()
            raise WorkloadError(
                f"{str(path)!r} is not a readable ONNX model: "
                f"{why.splitlines()[0] if why else type(e).__name__}"
            ) from None
        if not proto.graph.node and not proto.graph.output:
            raise WorkloadError(
                f"{str(path)!r} is not an ONNX model: it holds no graph "
                f"({path.stat().st_size} bytes)"
            )
        generic = proto.graph.name in _GENERIC_NAMES
        return proto, path.stem if generic else proto.graph.name, str(path)
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        return proto, proto.graph.name or "onnx-model", "<ModelProto>"
    raise WorkloadError(
        f"from_onnx: expected a path or an onnx.ModelProto, got {type(model).__name__}"
    )


def _positive(what: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, Integral) or v < 1:
        raise WorkloadError(f"from_onnx: {what} must be a positive integer, got {v!r}")
    return int(v)


def _dim_names(param: str) -> set[str]:
    """The names a dim_param reads: itself, or the names of an expression of them
    (Hugging Face Optimum writes ``past_sequence_length + 1``)."""
    import ast

    try:
        tree = ast.parse(param, mode="eval")
    except SyntaxError:
        return {param}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return names if names and not isinstance(tree.body, ast.Name) else {param}


def _dim_expression(param: str, values: Mapping[str, int]) -> int | None:
    """The value of a dim_param that is an integer expression (``+``, ``-``, ``*``,
    ``//``, ``/`` when exact, parentheses) of dims in ``values``; None when it is not
    one, or reads a dim not there. Parsed, never evaluated as code."""
    import ast

    try:
        tree = ast.parse(param, mode="eval")
    except SyntaxError:
        return None
    ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}
    ops[ast.FloorDiv] = int.__floordiv__

    def value(n: Any) -> int | None:
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        if isinstance(n, ast.Name):
            return values.get(n.id)
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            a, b = value(n.left), value(n.right)
            if a is None or b is None or isinstance(n.op, ast.FloorDiv) and b == 0:
                return None
            return ops[type(n.op)](a, b)
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):  # exact only
            a, b = value(n.left), value(n.right)
            return a // b if a is not None and b and a % b == 0 else None
        return None

    return value(tree.body)


def _fix_input_dims(
    graph: Any, initializers: set[str], batch: int | None, dims: Mapping[str, int]
) -> dict[str, int]:
    """Replace every symbolic dim of the graph inputs by its value, in place: a name in
    ``dims`` takes its value; a free leading dim takes ``batch`` (and so does its name,
    wherever else it appears); an expression of named dims (``past_sequence_length +
    1``) takes its value. A name in ``dims`` that no input has is an error, unless it
    is ``batch``, or the sequence dim given under all its names (:data:`SEQ_DIMS`), as
    ``workloads.build`` gives ``seq``: those apply where the model has them. Returns the entries of ``dims`` the model used (and
    ``batch`` when given there)."""
    params = [
        d.dim_param
        for vi in graph.input
        if vi.name not in initializers and vi.type.HasField("tensor_type")
        for d in vi.type.tensor_type.shape.dim
        if d.HasField("dim_param") and d.dim_param
    ]
    named = set(params).union(*(_dim_names(p) for p in params))
    # ``seq`` given as such (``workloads.build``) arrives under every name of SEQ_DIMS,
    # to apply where the model has one (build refuses a model with none). A sequence dim
    # named alone that the model lacks is said (a model exported at a fixed length runs
    # at that length, which may be the one asked for: a warning, not an error); any
    # other name the model lacks is an error
    aliases = set(SEQ_DIMS) if set(SEQ_DIMS) <= set(dims) else set()
    symbolic = ", ".join(sorted(set(params))) or "none"
    stray = sorted(set(dims) - named - {"batch", *aliases})
    for name in [n for n in stray if n in SEQ_DIMS]:
        warnings.warn(
            f"dims[{name!r}]={dims[name]} is not used: the model has no symbolic input "
            f"dim {name!r} (its symbolic dims: {symbolic}), so it runs at its inputs' "
            "fixed lengths",
            stacklevel=3,
        )
    stray = [n for n in stray if n not in SEQ_DIMS]
    if stray:
        raise WorkloadError(
            f"the model has no symbolic input dim {stray[0]!r} (its symbolic dims: {symbolic})"
        )
    resolved = dict(dims)
    for p in set(params) & set(dims):  # an expression given a value of its own
        if _dim_names(p) != {p}:
            computed = _dim_expression(p, {k: v for k, v in dims.items() if k != p})
            if computed is not None and computed != dims[p]:
                raise WorkloadError(
                    f"input dim {p!r} given as {dims[p]}, but with the dims given it is "
                    f"{computed}; give its names, not it"
                )
    if batch is not None:  # a leading dim's name takes the batch everywhere
        for vi in graph.input:
            if vi.name not in initializers and vi.type.HasField("tensor_type"):
                first = list(vi.type.tensor_type.shape.dim)[:1]
                if first and first[0].dim_param and first[0].dim_param not in dims:
                    resolved[first[0].dim_param] = batch
    fixed_lead = [
        (vi.name, [d.dim_value for d in vi.type.tensor_type.shape.dim])
        for vi in graph.input
        if vi.name not in initializers
        and vi.type.HasField("tensor_type")
        and vi.type.tensor_type.shape.dim
        and vi.type.tensor_type.shape.dim[0].dim_value > 0
    ]
    for vi in graph.input:
        if vi.name in initializers:
            continue
        if not vi.type.HasField("tensor_type"):
            raise WorkloadError(f"ONNX input {vi.name!r} is not a tensor")
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise WorkloadError(
                f"ONNX input {vi.name!r} has no shape; wia-hw needs every input's rank"
            )
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if d.HasField("dim_value") and d.dim_value == 0 and not d.dim_param:
                raise WorkloadError(
                    f"ONNX input {vi.name!r}: dimension {axis} has size 0; empty "
                    "tensors are not modelled"
                )
            param = d.dim_param if d.HasField("dim_param") else ""
            value = resolved.get(param) if param else None
            if value is None and param:
                value = _dim_expression(param, resolved)
                if value is not None and value < 1:
                    raise WorkloadError(
                        f"ONNX input {vi.name!r}: dimension {axis} ({param!r}) is {value} "
                        "with the dims given; it must be at least 1"
                    )
            if value is None and axis == 0 and batch is not None:
                value = batch
            if value is None:
                missing = sorted(_dim_names(param) - set(resolved)) if param else []
                seq_flag = "--seq N or " if missing and missing[0] in SEQ_DIMS else ""
                hints = (
                    [
                        f"dims={{{missing[0]!r}: N}} (command line: {seq_flag}-a "
                        f"{missing[0]}=N; wia-hw import: --dim {missing[0]}=N)"
                    ]
                    if missing
                    else []
                ) + (["batch=N (--batch N)"] if axis == 0 else [])
                if hints:
                    how = f"pass {' or '.join(hints)}"
                elif param:  # every name it reads is given: an expression not evaluated
                    how = (
                        f"{param!r} is not an expression wia-hw evaluates (integers and "
                        "named dims with + - * // and parentheses, / when exact); fix it in "
                        "the model"
                    )
                else:
                    how = "it has no name, so fix it in the model"
                raise WorkloadError(
                    f"ONNX input {vi.name!r}: dimension {axis} "
                    f"({repr(param) if param else 'unnamed'}) is not fixed; "
                    f"{how}"
                )
            d.Clear()
            d.dim_value = value
    leads = [
        vi.type.tensor_type.shape.dim[0].dim_value
        for vi in graph.input
        if vi.name not in initializers and vi.type.tensor_type.shape.dim
    ]
    if batch is not None and batch not in leads:  # the file fixes its batch to another
        name, shape = fixed_lead[0] if fixed_lead else ("", [])
        raise WorkloadError(
            f"batch {batch}: no input has a free leading dim"
            + (f" (input {name!r} is {shape}: the file fixes its batch)" if name else "")
            + "; pass the file's own batch, or export the model with a symbolic batch dim "
            "(dynamic_axes, or torch.export's Dim)"
        )
    return {k: v for k, v in dims.items() if k in named or k == "batch"}


class _Importer:
    """One import: walks the nodes in order and adds ops to a GraphBuilder."""

    def __init__(self, onnx: Any, proto: Any, name: str) -> None:
        self.onnx = onnx
        self.g = proto.graph
        self.opset = next(
            (o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 21
        )
        self.dtypes = _elem_dtypes(onnx)
        self.b = GraphBuilder(name, "fp32")
        self.inits: dict[str, Any] = {t.name: t for t in self.g.initializer}
        self.consts: dict[str, Any] = dict(self.inits)  # + Constant node outputs
        self.types: dict[str, tuple[tuple[int, ...] | None, int]] = {}
        for vi in list(self.g.input) + list(self.g.value_info) + list(self.g.output):
            if vi.type.HasField("tensor_type"):
                tt = vi.type.tensor_type
                shape = None
                if tt.HasField("shape"):
                    ds = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim]
                    shape = tuple(ds) if all(ds) or not ds else None
                self.types[vi.name] = (shape, tt.elem_type)
        self.op_names: set[str] = set()  # names given to ONNX nodes so far
        #: Conv output name -> the nodes folded into it (BatchNormalization, and Mul,
        #: Add, Sub or Div by per-channel constants), in order
        self.folded: dict[str, list[Any]] = {}
        #: Conv output name -> (the zero Pad folded into its pads, [top, left, bottom, right])
        self.pad_folded: dict[str, tuple[Any, list[int]]] = {}
        self.skip: set[int] = set()  # ids of the nodes folded away
        self.node_index = -1  # the node being mapped
        self.empty: set[str] = set()  # zero-length Split pieces and Slices (dropped from a Concat)
        #: weight -> its value from the model (initializers, and the constants the
        #: import derives from them), computed when functional mode asks
        self.values: dict[str, Callable[[], Any]] = {}
        self.base_dir: Path | None = None  # where an external data file would be
        self.source = "<ModelProto>"  # the model, as errors name it
        #: the external data files (locations) of weights that are not beside the model
        #: (a weight-stripped model): functional mode draws those weights, and says so
        self.absent: set[str] = set()
        self.origin: dict[int, list[str]] = {}  # node index -> names of its ops
        self.mask_allowed: dict[str, Any] = {}  # Where's merged weight -> kept elements
        self.prefix = _common_prefix(self.g.node)  # path components all names share
        #: integer value (ONNX name) -> its static quantisation (_onnx_qdq.rewrite)
        self.qparams: dict[str, QuantParams] = {}
        self.dropped: list[Any] = []  # nodes the rewrite left out (kept: ids in skip)
        #: constant -> a function giving its values, for those the import computes from
        #: the model's weights (a shape-folded node on weights, _onnx_fold.DERIVED; the
        #: codes of a float weight the model quantises, _onnx_qdq), registered only
        #: when those weights' values are there
        self.computed: dict[str, Callable[[], Any]] = {}
        #: weight -> the ONNX constant whose values it holds (itself, or reshaped or
        #: transposed at import: :meth:`const_weight`), for counting each once
        self.weight_origin: dict[str, str] = {}
        #: ONNX constants that hold none of the model's data (_onnx_fold.PLAIN), and
        #: the float ones folding computed from those (_onnx_fold.MADE)
        self.plain: set[str] = set()
        self.made_consts: set[str] = set()
        #: weights the import makes that hold none of the model's data (:meth:`made`)
        self.made_weights: set[str] = set()

    # -- values ------------------------------------------------------------------------
    def made(self, weight: str) -> str:
        """Mark ``weight`` as a constant of the run that holds none of the model's data
        (a zero padding slab, a mask or fill built from shapes and scalars): not one of
        the model's parameters (:func:`_weight_sources`). It stays a weight that its
        op reads, as torch reads the buffer it allocates for it (``F.pad``'s zeros, an
        RNN's ``torch.zeros`` state, an ``attn_mask``), so timing still moves its bytes;
        only the parameter count leaves it out."""
        self.made_weights.add(weight)
        return weight

    def dtype(self, value: str, elem: int, node: str = "") -> str:
        dt = self.dtypes.get(elem)
        if dt is None:
            dtn = self.onnx.TensorProto.DataType.Name(elem) if elem else "undefined"
            where = f"ONNX node {node!r}: " if node else "ONNX "
            raise WorkloadError(
                f"{where}tensor {value!r} has element type {dtn}, which wia-hw does not model"
            )
        return dt

    def defined(self, value: str) -> bool:
        """Whether ``value`` already is a tensor of the graph being built."""
        return value in self.b._tensors

    def shape(self, value: str) -> tuple[int, ...]:
        if self.defined(value):
            return self.b.shape(value)
        if value in self.consts:
            return tuple(self.consts[value].dims)
        known = self.types.get(value, (None, 0))[0]
        if known is None:
            raise WorkloadError(f"ONNX value {value!r}: shape unknown after shape inference")
        return known

    def value(self, value: str, node: str) -> str:
        """Our tensor for an ONNX value; constants become weights on first use."""
        if self.defined(value):
            return value
        if value in self.empty:
            raise WorkloadError(
                f"ONNX node {node!r}: input {value!r} is an empty tensor (a zero-length "
                "Split piece); wia-hw models empty tensors only as Concat inputs"
            )
        if value in self.consts:
            t = self.consts[value]
            name = self.b.weight(value, tuple(t.dims), self.dtype(value, t.data_type, node))
            self.weight_origin[name] = value
            if self.has_value(value):
                self.values[name] = lambda v=value: self.weight_array(v)
            return name
        raise WorkloadError(
            f"ONNX node {node!r}: input {value!r} is not produced by any earlier node"
        )

    def const_weight(
        self,
        value: str,
        shape: tuple[int, ...],
        suffix: str,
        node: str,
        make: Callable[[Any], Any] | None = None,
    ) -> str:
        """A weight for constant ``value`` with ``shape`` (e.g. transposed at import);
        ``make`` turns the constant's array into the weight's (default: a reshape)."""
        t = self.consts[value]
        if tuple(t.dims) == shape and not self.defined(value) and make is None:
            return self.value(value, node)
        name = f"{value}.{suffix}"
        if self.defined(name):
            return name
        name = self.b.weight(name, shape, self.dtype(value, t.data_type, node))
        self.weight_origin[name] = value
        fn = make or (lambda arr: arr.reshape(shape))
        if self.has_value(value):
            self.values[name] = lambda: fn(self.weight_array(value))
        if value in self.qparams:  # integer codes: their parameters move with them
            self.qparams[name] = transformed(self.qparams[value], tuple(t.dims), fn)
        return name

    def scale_value(self, name: str, factor: float) -> None:
        """The weight ``name`` stands for ``factor`` times its constant (Gemm's alpha
        and beta folded in)."""
        p = self.qparams.get(name)
        if p is not None:  # integer codes: the scale carries the factor
            self.qparams[name] = QuantParams(p.scale * np.float32(factor), p.zero_point, p.lo, p.hi)
            return
        inner = self.values.get(name)
        if inner is not None:
            self.values[name] = lambda: inner() * factor

    def const_array(self, value: str) -> Any:
        from onnx import numpy_helper

        return numpy_helper.to_array(self.consts[value])

    def has_value(self, value: str) -> bool:
        """Whether constant ``value``'s elements can be read: in the model, or in the
        external data file beside it."""
        from ._onnx_fold import external_state

        if value in self.computed:
            return True
        where, state = external_state(self.onnx, self.consts[value], self.base_dir)
        if state == "absent" and where and not where.startswith("<"):
            self.absent.add(where)
        # a file outside the model's folder "has" values: reading them is the error
        return state != "absent"

    def weight_array(self, value: str) -> Any:
        """Constant ``value``'s elements (read from the external data file if there: a
        file that does not hold them is a WorkloadError, :func:`read_external`)."""
        from onnx import numpy_helper

        from ._onnx_fold import read_external

        if value in self.computed:
            return self.computed[value]()
        t = self.consts[value]
        if t.data_location != self.onnx.TensorProto.EXTERNAL:
            return numpy_helper.to_array(t)
        return read_external(self.onnx, t, self.base_dir, self.source)

    # -- ops ---------------------------------------------------------------------------
    def view(self, src: str, shape: tuple[int, ...], name: str, out: str, grp: str) -> str:
        """``src`` as ``shape``: itself when it has that shape, else a ``reshape`` view
        named ``name`` writing ``out``."""
        if tuple(self.b.shape(src)) == tuple(shape):
            return src
        return self.add("reshape", name, [src], out, grp, None, shape=tuple(shape))

    def add(
        self,
        kind: str,
        name: str,
        inputs: list[str],
        out: str,
        group: str,
        dtype: str | None = None,
        **attrs: Any,
    ) -> str:
        self.origin.setdefault(self.node_index, []).append(name)
        return self.b.op(kind, name, inputs, group=group, out=out, dtype=dtype, **attrs)

    def array_of(self, value: str) -> Any | None:
        """Constant ``value``'s elements wherever they are: in the model, in its
        external data file, or computed from a weight the exporter moved; None when
        they are not there (a weight-stripped model) or ``value`` is not a constant."""
        v = self.const_values(value)
        if v is not None or value not in self.consts or not self.has_value(value):
            return v
        return self.weight_array(value)

    def const_values(self, value: str) -> Any | None:
        """The numpy value of a constant, or None (not a constant, or dims only)."""
        t = self.consts.get(value)
        if t is None or t.data_location == self.onnx.TensorProto.EXTERNAL:
            return None
        return self.const_array(value)

    def out_dtype(self, node: Any, name: str) -> str | None:
        elem = self.types.get(node.output[0], (None, 0))[1]
        return self.dtype(node.output[0], elem, name) if elem else None

    def check(self, node: Any, name: str, out: str) -> None:
        """Our shape for ``out`` must equal ONNX's (when ONNX inferred one)."""
        theirs = self.types.get(node.output[0], (None, 0))[0]
        ours = self.b.shape(out)
        if theirs is not None and theirs != ours:
            raise WorkloadError(
                f"ONNX node {name!r} ({node.op_type}): wia-hw computes "
                f"{list(ours)} but ONNX shape inference gives {list(theirs)}"
            )


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _node_name(node: Any, index: int) -> str:
    """The node's name, or ``<op type>_<index>`` for an unnamed node."""
    return node.name or f"{node.op_type.lower()}_{index}"


def _group(node: Any, skip: int = 0) -> str:
    """The first ``/``-path component of the node's name after the ``skip`` components
    that every path-named node shares (a wrapper module's attribute, say)."""
    parts = [p for p in node.name.split("/") if p]
    if "/" in node.name and len(parts) >= 2 + skip:
        return parts[skip]
    return node.op_type.lower()


def _common_prefix(nodes: Any) -> int:
    """How many leading path components all ``/``-named nodes share."""
    common: list[str] | None = None
    for n in nodes:
        parts = [p for p in n.name.split("/") if p]
        if "/" not in n.name or len(parts) < 2:
            continue
        parts = parts[:-1]
        if common is None:
            common = parts
        else:
            k = 0
            while k < min(len(common), len(parts)) and common[k] == parts[k]:
                k += 1
            common = common[:k]
        if not common:
            return 0
    return len(common or [])


#: The attributes (ONNX name, default) each unary op's functional model reads.
_UNARY_ATTRS = {
    "Swish": (("alpha", 1.0),),
    "Selu": (("alpha", 1.67326319217681884765625), ("gamma", 1.05070102214813232421875)),
    "Celu": (("alpha", 1.0),),
    "ThresholdedRelu": (("alpha", 1.0),),
    "Shrink": (("bias", 0.0), ("lambd", 0.5)),
    "LeakyRelu": (("alpha", 0.01),),
    "Elu": (("alpha", 1.0),),
    "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)),
    "LRN": (("size", None), ("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)),
    "IsInf": (("detect_positive", 1), ("detect_negative", 1)),
}


def _unary_attrs(imp: _Importer, node: Any, a: dict[str, Any]) -> dict[str, Any]:
    """What a unary op computes beyond its kind: its ONNX attributes with their
    defaults; Clip's bounds (attributes before opset 11, constant inputs from 11; a
    bound that is not a constant is recorded as such and functional mode refuses it);
    IsInf against IsNaN."""
    t = node.op_type
    out = {k: a.get(k, d) for k, d in _UNARY_ATTRS.get(t, ())}
    if t == "Gelu" and a.get("approximate", b"none") in (b"tanh", "tanh"):
        out["approximate"] = "tanh"
    if t == "Dropout":  # inference only: a training-mode Dropout draws a random mask
        train = node.input[2] if len(node.input) > 2 and node.input[2] else None
        vals = imp.const_values(train) if train else None
        if train and (vals is None or bool(vals.reshape(-1)[0])):
            raise WorkloadError(
                f"ONNX node {node.name or t!r} (Dropout): training_mode is "
                f"{'true' if vals is not None else 'computed at run time'}; wia-hw imports "
                "inference graphs (Dropout is the identity)"
            )
    if t in ("IsNaN", "IsInf"):
        out["op"] = t.lower()
    if t == "Clip":
        for i, key in ((1, "min"), (2, "max")):
            if key in a:
                out[key] = float(a[key])
            elif len(node.input) > i and node.input[i]:
                vals = imp.const_values(node.input[i])
                out[key] = float(vals.reshape(-1)[0]) if vals is not None else "dynamic"
    return out


def _as_2d(a: dict[str, Any]) -> dict[str, Any]:
    """A 1-D Conv/pool node's attributes as those of a 2-D one of height 1."""
    a = dict(a)
    for key, one in (("kernel_shape", 1), ("strides", 1), ("dilations", 1)):
        if key in a:
            a[key] = [one, *a[key]]
    if "pads" in a:
        a["pads"] = [0, a["pads"][0], 0, a["pads"][-1]] if len(a["pads"]) == 2 else a["pads"]
    return a


def _same_pads(
    auto: str, dims: Any, kernel: list[int], stride: list[int], dil: list[int]
) -> list[int]:
    """``auto_pad`` SAME_UPPER/SAME_LOWER as ONNX resolves it: per axis the total pad
    that keeps ``ceil(x / stride)`` outputs, the odd one at the end (UPPER) or at the
    start (LOWER); ONNX's order, every axis's start then every axis's end."""
    n = len(dims)
    pads = [0] * (2 * n)
    for i, x in enumerate(dims):
        total = max((-(-x // stride[i]) - 1) * stride[i] + (kernel[i] - 1) * dil[i] + 1 - x, 0)
        small = total // 2
        pads[i], pads[i + n] = (
            (small, total - small) if auto == "SAME_UPPER" else (total - small, small)
        )
    return pads


def _window(node: Any, name: str, a: dict[str, Any], kernel: list[int], in_hw: Any) -> dict:
    """The window attributes (``kernel``, ``stride``, ``pad``, ``dilation``) of a 2-D
    Conv/pool node, as :func:`wia_hw.graph.window` reads them: ``pads`` as given,
    ``auto_pad`` ``SAME_UPPER``/``SAME_LOWER`` resolved to ONNX's pads (the odd pad at
    the end or at the start)."""
    k = [int(v) for v in kernel]
    stride = [int(v) for v in a.get("strides", [1, 1])]
    dil = [int(v) for v in a.get("dilations", [1, 1])]
    if len(k) != 2 or len(stride) != 2 or len(dil) != 2:
        raise WorkloadError(
            f"ONNX node {name!r} ({node.op_type}): kernel_shape {k}, strides {stride} "
            f"or dilations {dil} is not 2-D"
        )
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        pad = [int(v) for v in a.get("pads", [0, 0, 0, 0])]
        if len(pad) != 4:
            raise WorkloadError(f"ONNX node {name!r} ({node.op_type}): pads {pad} is not 2-D")
    elif auto == "VALID":
        pad = [0, 0, 0, 0]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        pad = _same_pads(auto, in_hw, k, stride, dil)
    else:
        raise WorkloadError(f"ONNX node {name!r} ({node.op_type}): unknown auto_pad {auto!r}")

    def compact(v: list[int]) -> int | list[int]:  # an int when every entry is equal
        return v[0] if len(set(v)) == 1 else v

    return {
        "kernel": compact(k),
        "stride": compact(stride),
        "pad": compact(pad),
        "dilation": compact(dil),
    }


def _map_node(imp: _Importer, node: Any, name: str) -> None:
    """Add the op(s) of one ONNX node (one branch per op type; see the module table)."""
    t, a, out, grp = node.op_type, _attrs(node), node.output[0], _group(node, imp.prefix)
    ins = list(node.input)
    dt = imp.out_dtype(node, name)

    def v(i: int) -> str:
        return imp.value(ins[i], name)

    def has(i: int) -> bool:
        return len(ins) > i and ins[i] != ""

    def is_const(i: int) -> bool:
        return ins[i] in imp.consts

    def fail(why: str) -> WorkloadError:
        return WorkloadError(f"ONNX node {name!r} ({t}): {why}")

    if t in _BINARY or t == "Sum":
        # Sum, Max and Min take 1..n inputs: one binary op per extra input
        kind = _BINARY.get(t, "add")
        args = [v(i) for i in range(len(ins)) if has(i)]
        if len(args) == 1:
            imp.add("identity", name, args, out, grp, dt)
        y = args[0]
        for j, other in enumerate(args[1:]):
            last = j == len(args) - 2
            y = imp.add(
                kind,
                name if last else f"{name}.{j}",
                [y, other],
                out if last else f"{out}.{j}",
                grp,
                dt,
                **({"op": t.lower()} if kind in ("compare", "logical") else {}),
            )
    elif t in _UNARY:
        imp.add(_UNARY[t], name, [v(0)], out, grp, dt, **_unary_attrs(imp, node, a))
    elif t in _REDUCES:
        _reduce(imp, node, name, a, out, grp, dt, fail)
    elif t == "Split":
        _split(imp, node, name, a, grp, dt, fail)
        return
    elif t == "GatherElements":
        _gather_elements(imp, node, name, out, grp, dt)
    elif t == "GatherND":
        _gather_nd(imp, node, name, a, out, grp, dt, fail)
    elif t in ("Where", "Expand", "Trilu"):
        _select(imp, node, name, out, grp, dt)
    elif t == "Pad":
        _pad(imp, node, name, a, out, grp, dt, fail)
    elif t in ("Resize", "Upsample"):
        _resize(imp, node, name, a, out, grp, dt, fail)
    elif t == "DynamicQuantizeLinear":  # codes with a scale and zero point of their own
        imp.add("cast", name, [v(0)], out, grp, dt, dynamic_quant=True)
    elif t == "QuantizeLinear":  # one not written by the op before it (_onnx_qdq)
        imp.add("cast", name, [v(0)], out, grp, dt)
    elif t == "DequantizeLinear":  # before a move of an activation, or a graph output
        imp.add("cast", name, [v(0)], out, grp, dt)
    elif t in _RESHAPES:
        theirs = imp.types.get(out, (None, 0))[0]
        if theirs is None:
            raise fail("output shape unknown after shape inference")
        imp.add("reshape", name, [v(0)], out, grp, dt, shape=theirs)
    elif t == "MatMul":
        sa, sb = imp.shape(ins[0]), imp.shape(ins[1])
        if len(sa) == 1 and len(sb) > 2:
            _row_times_batched(imp, ins, is_const, name, out, grp, dt)
            imp.check(node, name, out)
            return
        ops, final = [v(0), v(1)], out
        # numpy's rules: a 1-D A is a row, a 1-D B a column (dropped from the result);
        # B with unit batch dims, under an A of at least its rank, is its last two
        unit_b = len(sb) > 2 and set(sb[:-2]) == {1} and len(sa) >= len(sb)
        if len(sa) == 1 or len(sb) == 1 or unit_b:
            new_a = (1, *sa) if len(sa) == 1 else sa
            new_b = (*sb, 1) if len(sb) == 1 else sb[-2:] if unit_b else sb
            for i, (old, shape) in enumerate(((sa, new_a), (sb, new_b))):
                if tuple(old) != tuple(shape):
                    ops[i] = (
                        imp.const_weight(ins[i], shape, "mm", name)
                        if is_const(i)
                        else imp.view(ops[i], shape, f"{name}.in{i}", f"{out}.in{i}", grp)
                    )
            sa, sb, out = new_a, new_b, f"{out}.mm" if len(sa) == 1 or len(sb) == 1 else out
        if len(sb) == 2 and (is_const(1) or len(sa) != 2):
            y = imp.add("linear", name, ops, out, grp, dt)
        elif len(sa) == 2 and len(sb) == 2:
            y = imp.add("matmul", name, ops, out, grp, dt)
        elif len(sa) >= 3 and sa[:-2] == sb[:-2]:
            y = imp.add("bmm", name, ops, out, grp, dt)
        else:
            raise fail(
                f"A {list(imp.shape(ins[0]))} x B {list(imp.shape(ins[1]))} needs "
                "broadcasting that wia-hw does not model"
            )
        if out != final:  # the 1-D operand's axis dropped
            shape = imp.b.shape(y)
            keep = (
                shape[:-2]
                + ((shape[-2],) if len(imp.shape(ins[0])) > 1 else ())
                + ((shape[-1],) if len(imp.shape(ins[1])) > 1 else ())
            )
            imp.add("reshape", f"{name}.squeeze", [y], final, grp, dt, shape=keep)
    elif t == "Gemm":
        _gemm(imp, node, name, a, out, grp, dt)
    elif t in ("Softmax", "LogSoftmax"):
        shape = imp.shape(ins[0])
        rank = len(shape)
        axis = a.get("axis", -1 if imp.opset >= 13 else 1) % max(rank, 1)
        log = {"log": True} if t == "LogSoftmax" else {}
        if imp.opset >= 13 or axis >= rank - 1:
            axis = axis - rank if rank else -1
            imp.add("softmax", name, [v(0)], out, grp, dt, axis=axis, **log)
        else:  # before opset 13: one softmax over the flattened dims from ``axis`` on
            rows = (math.prod(shape[:axis]), math.prod(shape[axis:]))
            flat = imp.add("reshape", f"{name}.flat", [v(0)], f"{out}.flat", grp, dt, shape=rows)
            y = imp.add("softmax", name, [flat], f"{out}.2d", grp, dt, axis=-1, **log)
            imp.add("reshape", f"{name}.unflat", [y], out, grp, dt, shape=shape)
    elif t in ("LayerNormalization", "RMSNormalization"):
        _normalization(imp, node, name, a, out, grp, dt)
    elif t == "Conv":
        padded = imp.pad_folded.get(out)
        if padded is not None:  # a zero Pad before: the Conv reads its input, padded more
            pad_node, extra = padded
            ins[0] = pad_node.input[0]
            a = dict(a, auto_pad=b"NOTSET")
            a["pads"] = [
                int(p) + e for p, e in zip(a.get("pads", [0, 0, 0, 0]), extra, strict=True)
            ]
        x, w = imp.shape(ins[0]), imp.shape(ins[1])
        if len(x) == 5 and len(w) == 5:
            _conv3d(imp, node, name, a, out, grp, dt, fail)
            imp.check(node, name, out)
            return
        if len(x) not in (3, 4) or len(w) != len(x):
            raise fail(f"input {list(x)} is not 1-D [N, C, L], 2-D or 3-D [N, C, D, H, W]")
        inputs = [v(0), v(1)] + ([v(2)] if has(2) else [])
        if len(x) == 3:  # 1-D: a conv2d of height 1 on views of the input and weight
            a, x, w = _as_2d(a), (x[0], x[1], 1, x[2]), (w[0], w[1], 1, w[2])
            inputs[0] = imp.add(
                "reshape", f"{name}.x2d", [inputs[0]], f"{out}.x2d", grp, None, shape=x
            )
            inputs[1] = imp.add(
                "reshape", f"{name}.w2d", [inputs[1]], f"{out}.w2d", grp, None, shape=w
            )
        win = _window(node, name, a, list(w[2:]), x[2:])
        chain = imp.folded.get(out)
        if chain:  # folded in: the scales into the weights, the shifts into the bias
            out = chain[-1].output[0]
            dt = imp.out_dtype(chain[-1], name) or dt
            if not has(2):
                inputs.append(
                    imp.b.weight(f"{name}.folded_bias", (w[0],), imp.b.tensor(inputs[1]).dtype)
                )
            _fold_values(imp, chain, ins[1], ins[2] if has(2) else None, inputs[2])
        final, out = out, f"{out}.y2d" if len(imp.shape(ins[0])) == 3 else out
        y = imp.add(
            "conv2d",
            name,
            inputs,
            out,
            grp,
            dt,
            stride=win["stride"],
            pad=win["pad"],
            dilation=win["dilation"],
            groups=a.get("group", 1),
        )
        if out != final:  # back to [N, O, L]
            (n_, o_, _, l_), out = imp.shape(y), final
            imp.add("reshape", f"{name}.y1d", [y], out, grp, dt, shape=(n_, o_, l_))
        if chain:
            node = chain[-1]
    elif t == "ConvTranspose":
        _conv_transpose(imp, node, name, a, out, grp, dt, fail)
    elif t == "BatchNormalization":
        if a.get("training_mode", 0):
            raise fail(
                "training_mode=1 (normalising by the batch's own statistics) is not "
                "modelled; wia-hw imports inference graphs (BatchNormalization with its "
                "running statistics)"
            )
        x = imp.shape(ins[0])
        if len(x) < 2:
            raise fail(f"input {list(x)} has no channel axis")
        shape = (x[1],) + (1,) * (len(x) - 2)
        params = tuple(imp.shape(ins[1]))
        if len(params) > 1 and params == tuple(x[1:]):  # spatial=0 (before opset 9):
            shape = params  # statistics per activation, [C, D1, ...]
        elif params != (x[1],):
            raise fail(f"scale {list(params)} is neither [C] nor [C, D1, ...] of input {list(x)}")
        xd = imp.b.tensor(v(0)).dtype
        if any(i not in imp.consts for i in ins[1:5]):  # statistics given at run time
            p = [imp.view(v(j), shape, f"{name}.p{j}", f"{out}.p{j}", grp) for j in range(1, 5)]
            e = imp.b.weight(f"{name}.epsilon", (1,), xd)
            eps = float(a.get("epsilon", 1e-5))
            imp.values[e] = lambda: np.full(1, eps, np.float32)
            d = imp.add("sub", f"{name}.centre", [v(0), p[2]], f"{out}.centred", grp, dt)
            sd = imp.add(
                "sqrt",
                f"{name}.std",
                [imp.add("add", f"{name}.var_eps", [p[3], e], f"{out}.var_eps", grp, dt)],
                f"{out}.std",
                grp,
                dt,
            )
            y = imp.add("div", f"{name}.norm", [d, sd], f"{out}.normed", grp, dt)
            y = imp.add("mul", f"{name}.scale", [y, p[0]], f"{out}.scaled", grp, dt)
            imp.add("add", name, [y, p[1]], out, grp, dt)
            imp.check(node, name, out)
            return
        sw = imp.b.weight(f"{name}.folded_scale", shape, xd)
        hw = imp.b.weight(f"{name}.folded_shift", shape, xd)
        affine = _bn_affine(imp, node)
        if affine is not None:
            imp.values[sw] = lambda: affine()[0].reshape(shape)
            imp.values[hw] = lambda: affine()[1].reshape(shape)
        y = imp.add("mul", f"{name}.scale", [v(0), sw], f"{out}.scaled", grp, dt)
        imp.add("add", name, [y, hw], out, grp, dt)
    elif t in ("MaxPool", "AveragePool") and len(imp.shape(ins[0])) == 5:
        _pool3d(imp, node, name, a, out, grp, dt, fail)
    elif t in ("MaxPool", "AveragePool"):
        x = imp.shape(ins[0])
        if len(x) not in (3, 4):
            raise fail(f"input {list(x)} is not 1-D [N, C, L], 2-D or 3-D [N, C, D, H, W]")
        if "kernel_shape" not in a:
            raise fail("has no kernel_shape attribute")
        src, final = v(0), out
        if len(x) == 3:  # 1-D: a pool of height 1 on a view
            a, x = _as_2d(a), (x[0], x[1], 1, x[2])
            src = imp.add("reshape", f"{name}.x2d", [src], f"{out}.x2d", grp, None, shape=x)
            out = f"{out}.y2d"
        win = _window(node, name, a, list(a["kernel_shape"]), x[2:])
        if win["dilation"] != 1:
            raise fail(f"dilations {win['dilation']} are not modelled for pooling")
        del win["dilation"]
        if a.get("ceil_mode", 0):
            win["ceil_mode"] = True
        if t == "AveragePool":  # ONNX's default excludes the padding from the divisor
            win["count_include_pad"] = bool(a.get("count_include_pad", 0))
        y = imp.add("maxpool" if t == "MaxPool" else "avgpool", name, [src], out, grp, dt, **win)
        if out != final:  # back to [N, C, L]
            (n_, c_, _, l_), out = imp.shape(y), final
            imp.add("reshape", f"{name}.y1d", [y], out, grp, dt, shape=(n_, c_, l_))
    elif t == "GlobalAveragePool":
        x = imp.shape(ins[0])
        if len(x) > 4:  # 3-D and up: over a view [N, C, D*H, W], then back
            view = (*x[:2], math.prod(x[2:-1]), x[-1])
            src = imp.add("reshape", f"{name}.x2d", [v(0)], f"{out}.x2d", grp, None, shape=view)
            y = imp.add("global_avgpool", name, [src], f"{out}.y2d", grp, dt)
            imp.add(
                "reshape", f"{name}.ynd", [y], out, grp, dt, shape=(*x[:2], *[1] * (len(x) - 2))
            )
        elif len(x) == 3:  # 1-D: over a view of height 1, then back to [N, C, 1]
            src = imp.add(
                "reshape", f"{name}.x2d", [v(0)], f"{out}.x2d", grp, None, shape=(*x[:2], 1, x[2])
            )
            y = imp.add("global_avgpool", name, [src], f"{out}.y2d", grp, dt)
            imp.add("reshape", f"{name}.y1d", [y], out, grp, dt, shape=(x[0], x[1], 1))
        else:
            imp.add("global_avgpool", name, [v(0)], out, grp, dt)
    elif t == "Einsum":
        _einsum(imp, node, name, a, out, grp, dt, fail)
    elif t == "Attention":
        _attention(imp, node, name, a, out, grp, dt, fail)
    elif t == "Transpose":
        rank = len(imp.shape(ins[0]))
        imp.add(
            "transpose",
            name,
            [v(0)],
            out,
            grp,
            dt,
            perm=tuple(a.get("perm", range(rank - 1, -1, -1))),
        )
    elif t == "Concat":
        parts = [v(i) for i in range(len(ins)) if has(i) and ins[i] not in imp.empty]
        if len(parts) == 1:
            imp.add("identity", name, parts, out, grp, dt)
        else:
            imp.add("concat", name, parts, out, grp, dt, axis=a["axis"])
    elif t == "Slice":
        _slice(imp, node, name, out, grp, dt, fail)
        if out in imp.empty:
            return
    elif t == "Gather":
        _gather(imp, node, name, a, out, grp, dt, fail)
    elif t in ("InstanceNormalization", "GroupNormalization"):
        _group_norm(imp, node, name, a, out, grp, dt)
    elif t == "LpNormalization":
        _lp_norm(imp, node, name, a, out, grp, dt)
    elif t in ("DepthToSpace", "SpaceToDepth"):
        _space_depth(imp, node, name, a, out, grp, dt)
    elif t == "Tile":
        _tile(imp, node, name, out, grp, dt, fail)
    elif t == "GlobalMaxPool":
        x = imp.shape(ins[0])
        _reduce_axes(
            imp,
            name,
            v(0),
            x,
            list(range(2, len(x))),
            out,
            _out_shape(imp, out, fail),
            grp,
            dt,
            "max",
            {},
        )
    elif t == "OneHot":
        _one_hot(imp, node, name, a, out, grp, dt, fail)
    elif t == "CumSum":  # on a run-time tensor (a constant one is folded)
        axis = imp.const_values(ins[1]) if has(1) else None
        if axis is None:
            raise fail("axis must be a constant")
        imp.add(
            "cumsum",
            name,
            [v(0)],
            out,
            grp,
            dt,
            axis=int(axis.reshape(-1)[0]),
            exclusive=int(a.get("exclusive", 0)),
            reverse=int(a.get("reverse", 0)),
        )
    elif t == "Mean":  # the sum of the inputs, then a scale by 1/n
        args = [v(i) for i in range(len(ins)) if has(i)]
        y = args[0]
        for j, other in enumerate(args[1:]):
            y = imp.add("add", f"{name}.{j}", [y, other], f"{out}.{j}", grp, dt)
        imp.add("scale", name, [y], out, grp, dt, factor=1.0 / len(args))
    elif t in RNN_OPS:
        map_rnn(imp, node, name, a, grp, dt)
        for o in node.output:  # any of Y, Y_h, Y_c may be absent
            theirs = imp.types.get(o, (None, 0))[0] if o else None
            if theirs is not None and theirs != imp.b.shape(o):
                raise fail(f"wia-hw computes {list(imp.b.shape(o))} for {o!r}, ONNX {list(theirs)}")
        return
    else:  # pragma: no cover - the support check runs before
        raise fail("is not supported")
    imp.check(node, name, node.output[0])


def _row_times_batched(
    imp: _Importer,
    ins: list[str],
    is_const: Callable[[int], bool],
    name: str,
    out: str,
    grp: str,
    dt: str | None,
) -> None:
    """MatMul of a 1-D A ``[K]`` by a batched B ``[..., K, N]`` as numpy: the row
    times each matrix of B, ``[..., N]``. Computed as B with its last two axes swapped
    (a ``transpose``; at import for a constant B) times A as a column ``[K, 1]``: one
    ``linear`` of the same MACs, its unit axis dropped by a ``reshape``."""
    sa, sb = imp.shape(ins[0]), imp.shape(ins[1])
    perm = (*range(len(sb) - 2), len(sb) - 1, len(sb) - 2)
    bt_shape = tuple(sb[i] for i in perm)
    if is_const(1):
        bt = imp.const_weight(ins[1], bt_shape, "T", name, make=lambda arr: arr.transpose(perm))
    else:
        bt = imp.add(
            "transpose", f"{name}.bt", [imp.value(ins[1], name)], f"{out}.bt", grp, dt, perm=perm
        )
    col_shape = (sa[0], 1)
    if is_const(0):
        col = imp.const_weight(ins[0], col_shape, "mm", name)
    else:
        col = imp.view(imp.value(ins[0], name), col_shape, f"{name}.in0", f"{out}.in0", grp)
    y = imp.add("linear", name, [bt, col], f"{out}.mm", grp, dt)
    imp.add("reshape", f"{name}.squeeze", [y], out, grp, dt, shape=(*sb[:-2], sb[-1]))


def _gemm(
    imp: _Importer, node: Any, name: str, a: dict[str, Any], out: str, grp: str, dt: str | None
) -> None:
    """Gemm: ``alpha * A' B' + beta * C``. Only shapes are imported, so alpha and beta
    fold into constant operands; on activations they cost a ``scale`` op each."""
    ins = list(node.input)
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)

    def operand(i: int, trans: bool, tag: str) -> str:
        s = imp.shape(ins[i])
        if len(s) != 2:
            raise WorkloadError(f"ONNX node {name!r} (Gemm): {tag} {list(s)} is not 2-D")
        if not trans:
            return imp.value(ins[i], name)
        if ins[i] in imp.consts:
            return imp.const_weight(ins[i], (s[1], s[0]), "T", name, make=lambda v: v.T)
        return imp.add(
            "transpose",
            f"{name}.transpose_{tag.lower()}",
            [imp.value(ins[i], name)],
            f"{out}.{tag}T",
            grp,
            None,
            perm=(1, 0),
        )

    x = operand(0, bool(a.get("transA", 0)), "A")
    w = operand(1, bool(a.get("transB", 0)), "B")
    n = imp.b.shape(w)[1]
    const_b = imp.b.tensor(w).kind == "weight"
    has_c = len(ins) > 2 and ins[2] != ""
    bias = has_c and ins[2] in imp.consts and imp.shape(ins[2]) in ((n,), (1, n))
    if const_b and alpha != 1.0:
        imp.scale_value(w, alpha)
    inputs = [x, w] + ([imp.const_weight(ins[2], (n,), "bias", name)] if bias else [])
    if bias and beta != 1.0:
        imp.scale_value(inputs[2], beta)
    chain = (["alpha"] if alpha != 1.0 and not const_b else []) + (
        ["c"] if has_c and not bias else []
    )
    y = imp.add(
        "linear" if const_b or bias else "matmul",
        name,
        inputs,
        f"{out}.gemm" if chain else out,
        grp,
        dt,
    )
    for j, step in enumerate(chain):
        target = out if j == len(chain) - 1 else f"{out}.{step}"
        if step == "alpha":
            y = imp.add("scale", f"{name}.alpha", [y], target, grp, dt, factor=alpha)
        else:
            c = imp.value(ins[2], name)
            if beta != 1.0 and ins[2] not in imp.consts:
                c = imp.add("scale", f"{name}.beta", [c], f"{out}.beta", grp, dt, factor=beta)
            elif beta != 1.0:
                imp.scale_value(c, beta)
            y = imp.add("add", f"{name}.add_c", [y, c], target, grp, dt)


def _slice(
    imp: _Importer, node: Any, name: str, out: str, grp: str, dt: str | None, fail: Any
) -> None:
    ins = list(node.input)
    x = imp.shape(ins[0])
    args = []
    a = _attrs(node)
    for i in range(1, 5):
        key = ("starts", "ends", "axes", "steps")[i - 1]
        if key in a:  # before opset 10: attributes, not inputs
            args.append([int(e) for e in a[key]])
        elif len(ins) > i and ins[i]:
            if ins[i] not in imp.consts:
                raise fail("starts, ends, axes and steps must be constants")
            args.append([int(e) for e in imp.const_array(ins[i]).reshape(-1)])
        else:
            args.append(None)
    starts, ends, axes, steps = args
    axes = axes if axes is not None else list(range(len(starts)))
    if starts is None or ends is None:
        raise fail("has no starts or ends")
    steps = steps if steps is not None else [1] * len(starts)
    if 0 in steps:
        raise fail(f"steps {steps}: a step of 0 is invalid")
    cuts = []
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        ax %= len(x)
        n = x[ax]
        if st > 0:
            s = max(0, min(n, s + n if s < 0 else s))
            e = max(0, min(n, e + n if e < 0 else e))
        else:  # ONNX clamps a backward slice to [0, n - 1] and [-1, n - 1]
            s = max(0, min(n - 1, s + n if s < 0 else s))
            e = max(-1, min(n - 1, e + n if e < 0 else e))
        if (s, e, st) != (0, n, 1):
            cuts.append((ax, s, e, st))
        if (e - s) * st <= 0:  # nothing selected: an empty tensor (e.g. phi-3's rotary tail)
            imp.empty.add(out)
            return
    y = imp.value(ins[0], name)
    if not cuts:
        imp.add("identity", name, [y], out, grp, dt)
        return
    for j, (ax, s, e, st) in enumerate(cuts):  # one slice op per cut axis
        last = j == len(cuts) - 1
        y = imp.add(
            "slice",
            name if last else f"{name}.{j}",
            [y],
            out if last else f"{out}.{j}",
            grp,
            dt,
            axis=ax,
            start=s,
            stop=e,
            **({"step": st} if st != 1 else {}),
        )


def _out_shape(imp: _Importer, value: str, fail: Any) -> tuple[int, ...]:
    theirs = imp.types.get(value, (None, 0))[0]
    if theirs is None:
        raise fail(f"shape of {value!r} unknown after shape inference")
    return theirs


def _gather(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """Gather: an embedding lookup (a row gather), or a slice for a constant run."""
    ins = list(node.input)
    data = imp.shape(ins[0])
    axis = a.get("axis", 0) % max(len(data), 1)
    if ins[0] in imp.consts and axis == 0 and len(data) == 2:
        ids, table = imp.value(ins[1], name), imp.value(ins[0], name)
        imp.add("embedding", name, [ids, table], out, grp, dt, negative_from_end=True)
        return
    oshape = _out_shape(imp, out, fail)
    idx = imp.const_values(ins[1])
    if idx is not None and idx.size >= 1:
        flat = [int(i) + data[axis] if int(i) < 0 else int(i) for i in idx.reshape(-1)]
        if flat == list(range(flat[0], flat[0] + len(flat))):
            sliced = imp.add(
                "slice",
                name,
                [imp.value(ins[0], name)],
                f"{out}.slice" if oshape != _sliced(data, axis, flat[0], len(flat)) else out,
                grp,
                dt,
                axis=axis,
                start=flat[0],
                stop=flat[0] + len(flat),
            )
            if sliced != out:
                imp.add("reshape", f"{name}.reshape", [sliced], out, grp, dt, shape=oshape)
            return
    if axis != 0:
        raise fail(
            f"gathers non-contiguous indices on axis {axis}; wia-hw models a gather "
            "on axis 0 or a contiguous run of constant indices"
        )
    rest = math.prod(data[1:])
    table = imp.value(ins[0], name)
    if len(data) != 2:
        table = imp.add(
            "reshape", f"{name}.rows", [table], f"{out}.rows", grp, None, shape=(data[0], rest)
        )
    ids = imp.value(ins[1], name)
    got = imp.add(
        "embedding",
        name,
        [ids, table],
        f"{out}.gather" if oshape != imp.b.shape(ids) + (rest,) else out,
        grp,
        dt,
        negative_from_end=True,  # ONNX Gather: -1 is the last row
    )
    if got != out:
        imp.add("reshape", f"{name}.reshape", [got], out, grp, dt, shape=oshape)


def _sliced(shape: tuple[int, ...], axis: int, start: int, n: int) -> tuple[int, ...]:
    return shape[:axis] + (n,) + shape[axis + 1 :]


def _gather_elements(
    imp: _Importer, node: Any, name: str, out: str, grp: str, dt: str | None
) -> None:
    """GatherElements: one element per output, read through the index tensor: an
    ``embedding`` of the data flattened to ``[numel, 1]`` rows."""
    ins = list(node.input)
    data, idx = imp.shape(ins[0]), imp.shape(ins[1])
    table = imp.add(
        "reshape",
        f"{name}.rows",
        [imp.value(ins[0], name)],
        f"{out}.rows",
        grp,
        None,
        shape=(math.prod(data), 1),
    )
    ids = imp.add(
        "reshape",
        f"{name}.ids",
        [imp.value(ins[1], name)],
        f"{out}.ids",
        grp,
        None,
        shape=(math.prod(idx),),
    )
    # the index of each element counts along ``axis`` only; its other coordinates are
    # its own position in the index tensor (functional mode reads them from here)
    axis = _attrs(node).get("axis", 0) % len(data)
    got = imp.add(
        "embedding",
        name,
        [ids, table],
        f"{out}.gather",
        grp,
        dt,
        elements_of={"data": list(data), "index": list(idx), "axis": axis},
    )
    imp.add("reshape", f"{name}.reshape", [got], out, grp, dt, shape=idx)


def _gather_nd(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """GatherND (``batch_dims`` 0): each index row ``[k]`` picks a slice
    ``data[i0, .., ik-1]``: an ``embedding`` of ``data`` viewed as
    ``[prod(data[:k]), prod(data[k:])]`` rows, read by the linearised row index: the
    index rows times the row strides of ``data[:k]`` (a ``scale`` by one factor per
    column), summed (a ``global_avgpool`` sum); one index column needs neither."""
    if a.get("batch_dims", 0):
        raise fail(f"batch_dims={a['batch_dims']} is not modelled (only 0)")
    ins = list(node.input)
    data, idx = imp.shape(ins[0]), imp.shape(ins[1])
    k = idx[-1]
    rows, rest = math.prod(data[:k]), math.prod(data[k:])
    oshape = _out_shape(imp, out, fail)
    table = imp.add(
        "reshape",
        f"{name}.rows",
        [imp.value(ins[0], name)],
        f"{out}.rows",
        grp,
        None,
        shape=(rows, rest),
    )
    n = math.prod(idx[:-1])
    ids = imp.add(
        "reshape",
        f"{name}.index_rows",
        [imp.value(ins[1], name)],
        f"{out}.index",
        grp,
        None,
        shape=(1, n, 1, k),
    )
    if k > 1:  # the row index: sum of index x stride over the k columns
        strides = [math.prod(data[j + 1 : k]) for j in range(k)]
        ids = imp.add(
            "scale", f"{name}.strided", [ids], f"{out}.strided", grp, None, factor=strides
        )
        ids = imp.add(
            "global_avgpool", f"{name}.row_index", [ids], f"{out}.row", grp, None, reduce="sum"
        )
    ids = imp.add("reshape", f"{name}.ids", [ids], f"{out}.ids", grp, None, shape=(n,))
    got = imp.add(
        "embedding", name, [ids, table], f"{out}.gather", grp, dt, negative_from_end=k == 1
    )
    imp.add("reshape", f"{name}.reshape", [got], out, grp, dt, shape=oshape)


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(1, rank + 1):
        out.append(max(s[-i] if i <= len(s) else 1 for s in shapes))
    return tuple(reversed(out))


def _select(imp: _Importer, node: Any, name: str, out: str, grp: str, dt: str | None) -> None:
    """Where / Expand / Trilu on run-time values.

    Where with a run-time condition, or with two run-time branches, is a ``where``
    (one select per output element). Otherwise (a constant condition and one run-time
    branch: a masked fill) and for Expand and Trilu, the constant operands (the mask
    and fill, Expand's broadcast, Trilu's triangle) merge into one weight and the op is
    one binary op per element (``add``: a masked fill is an additive mask; Trilu a
    ``mul``)."""
    t, ins = node.op_type, [i for i in node.input]
    oshape = imp.types.get(out, (None, 0))[0] or ()
    xd = None
    if t == "Where" and (
        ins[0] not in imp.consts
        or all(i not in imp.consts for i in ins[1:])
        or not _mask_fill(imp, ins)
    ):
        # a condition computed at run time, two run-time branches, or a constant fill
        # that is not a mask's (x + fill would not be fill): a select
        imp.add("where", name, [imp.value(i, name) for i in ins], out, grp, dt)
        return
    if t == "Where":  # a constant condition: a masked fill of the run-time branch
        dyn = [i for i in ins[1:] if i not in imp.consts]
        consts = [imp.shape(i) for i in ins if i not in dyn]
        kind = "add"
        xd = imp.b.tensor(imp.value(dyn[0], name)).dtype
    elif t == "Expand":
        x = imp.shape(ins[0])
        if x == oshape:  # nothing to broadcast
            imp.add("identity", name, [imp.value(ins[0], name)], out, grp, dt)
            return
        xr = (1,) * (len(oshape) - len(x)) + x
        dyn = [ins[0]]
        consts = [tuple(1 if a == b else b for a, b in zip(xr, oshape, strict=True))]
        kind = "add"
    else:  # Trilu: keep one triangle of the last two axes
        if len(ins) > 1 and ins[1] and imp.const_values(ins[1]) is None:
            raise WorkloadError(
                f"ONNX node {name!r} (Trilu): its diagonal k {ins[1]!r} is computed at run "
                "time; wia-hw models a constant k"
            )
        x = imp.shape(ins[0])
        dyn, consts, kind = [ins[0]], [tuple(x[-2:])], "mul"
    vals = [imp.value(d, name) for d in dyn]
    xd = xd or imp.b.tensor(vals[0]).dtype
    if consts and math.prod(_broadcast_shape(consts)) > 1 or not vals[1:]:
        shape = _broadcast_shape(consts) if consts else (1,)
        w = imp.b.weight(f"{name}.{t.lower()}_const", shape, xd if xd != "bool" else (dt or "fp32"))
        if all(i in imp.plain for i in ins if i and i not in dyn):
            imp.made(w)  # a mask or fill from shapes and scalars: no model data
        vals.append(w)
        cond = imp.array_of(ins[0]) if t == "Where" else None
        if cond is not None:  # the elements that keep the run-time value
            imp.mask_allowed[w] = cond.astype(bool) if dyn[0] == ins[1] else ~cond.astype(bool)
        known = [imp.array_of(i) is not None for i in ins if i and i not in dyn]
        if all(known) or t == "Expand":  # the constants' values are in the model (Expand's
            # zeros need none)
            imp.values[w] = _merged_value(imp, t, node, ins, dyn, shape)
    y = vals[0]
    for k, other in enumerate(vals[1:]):
        last = k == len(vals) - 2
        y = imp.add(
            kind if k == 0 else "add",
            name if last else f"{name}.{k}",
            [y, other],
            out if last else f"{out}.{k}",
            grp,
            dt,
        )


#: A Where's constant fill at or below this is a mask's (minus infinity, or the most
#: negative float an exporter writes): adding it to any activation gives the fill.
_MASK_FILL = -1e30


def _mask_fill(imp: _Importer, ins: list[str]) -> bool:
    """Whether Where(cond, a, b) with a constant condition and one constant branch is a
    masked fill that an additive mask models exactly (the fill's values known and at
    most :data:`_MASK_FILL`), or a fill whose values are not in the model (dims only:
    timing is all there is)."""
    fill = next((i for i in ins[1:] if i in imp.consts), None)
    vals = imp.array_of(fill) if fill is not None else None
    return vals is None or bool(np.all(np.asarray(vals, np.float64) <= _MASK_FILL))


def _merged_value(
    imp: _Importer,
    t: str,
    node: Any,
    ins: list[str],
    dyn: list[str],
    shape: tuple[int, ...],
) -> Callable[[], Any]:
    """The value of the weight ``_select`` merges the constant operands into: Where's
    additive mask (0 where the run-time branch is kept, the fill elsewhere), Expand's
    zeros (broadcasting by an ``add``), Trilu's triangle of ones (a ``mul``)."""

    def value() -> Any:
        if t == "Where":
            cond = np.asarray(imp.array_of(ins[0])).astype(bool)
            keep = cond if dyn[0] == ins[1] else ~cond
            fill = imp.array_of(next(i for i in ins[1:] if i not in dyn))
            return np.broadcast_to(np.where(keep, 0.0, fill), shape).astype(np.float32)
        if t == "Expand":
            return np.zeros(shape, np.float32)
        k = 0
        if len(ins) > 1 and ins[1]:
            k = int(np.asarray(imp.const_values(ins[1])).reshape(-1)[0])
        ones = np.ones(shape, np.float32)
        upper = next((a.i for a in node.attribute if a.name == "upper"), 1)
        return np.triu(ones, k) if upper else np.tril(ones, k)

    return value


def _reduce(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """Reduce* over any axes (the reduced ones moved last by a ``transpose`` when they
    are not already trailing), ArgMax/ArgMin over the last non-unit axis: a
    ``global_avgpool`` (``reduce``: mean, sum, max, min, argmax, argmin) over
    ``[1, rows, reduced, 1]`` (one add or compare per input element)."""
    ins = list(node.input)
    x = imp.shape(ins[0])
    rank = len(x)
    pre, how, post = _REDUCE_PARTS.get(node.op_type, (None, None, None))
    if how is None:
        how = (
            node.op_type[6:].lower() if node.op_type.startswith("Reduce") else node.op_type.lower()
        )
    extra = {}
    if node.op_type in ("ArgMax", "ArgMin"):  # one axis; the index of the first extreme
        axes = [a.get("axis", 0)]
        if a.get("select_last_index", 0):
            extra["select_last_index"] = True
        # the trailing dims after the axis are 1 when it is the last non-unit axis
        ax = axes[0] % rank
        if any(d != 1 for d in x[ax + 1 :]):
            raise fail(
                f"takes the {node.op_type[3:].lower()} over axis {ax} of {list(x)}; "
                "wia-hw models it over the last non-unit axis only"
            )
        axes = list(range(ax, rank))
    elif "axes" in a:
        axes = list(a["axes"])
    elif len(ins) > 1 and ins[1]:
        vals = imp.const_values(ins[1])
        if vals is None:
            raise fail("axes must be a constant")
        axes = [int(v) for v in vals.reshape(-1)]
    else:
        axes = []
    if not axes and not a.get("noop_with_empty_axes", 0):  # none, or empty: all of them
        axes = list(range(rank))
    axes = sorted({ax % rank for ax in axes})
    oshape = _out_shape(imp, out, fail)
    src = imp.value(ins[0], name)
    if pre == "square":  # ReduceSumSquare, ReduceL2
        src = imp.add("mul", f"{name}.square", [src, src], f"{out}.square", grp, None)
    elif pre is not None:  # ReduceL1 (abs), ReduceLogSumExp (exp)
        src = imp.add(pre, f"{name}.{pre}", [src], f"{out}.{pre}", grp, None)
    if post is not None:  # ReduceL2 (sqrt), ReduceLogSum and ReduceLogSumExp (log)
        inner = f"{out}.{how}"
        _reduce_axes(imp, name, src, x, axes, inner, oshape, grp, dt, how, extra)
        imp.add(post, f"{name}.{post}", [inner], out, grp, dt)
        return
    _reduce_axes(imp, name, src, x, axes, out, oshape, grp, dt, how, extra)


def _reduce_axes(
    imp: _Importer,
    name: str,
    src: str,
    x: tuple[int, ...],
    axes: list[int],
    out: str,
    oshape: tuple[int, ...],
    grp: str,
    dt: str | None,
    how: str,
    extra: dict[str, Any],
) -> None:
    """``src`` (of shape ``x``) reduced by ``how`` over ``axes`` into ``out``."""
    rank = len(x)
    if not axes:
        imp.add("identity", name, [src], out, grp, dt)
        return
    if axes != list(range(axes[0], rank)):  # move the reduced axes last: a transpose
        keep = [d for d in range(rank) if d not in axes]
        src = imp.add(
            "transpose", f"{name}.last", [src], f"{out}.last", grp, None, perm=tuple(keep + axes)
        )
        x = tuple(x[d] for d in keep + axes)
        axes = list(range(len(keep), rank))
    rows, red = math.prod(x[: axes[0]]), math.prod(x[axes[0] :])
    if rank == 4 and axes == [2, 3]:
        pooled_shape = (x[0], x[1], 1, 1)
    else:
        src = imp.add(
            "reshape", f"{name}.rows", [src], f"{out}.rows", grp, None, shape=(1, rows, red, 1)
        )
        pooled_shape = (1, rows, 1, 1)
    pooled = imp.add(
        "global_avgpool",
        name,
        [src],
        out if pooled_shape == oshape else f"{out}.pooled",
        grp,
        dt,
        reduce=how,
        **extra,
    )
    if pooled != out:
        imp.add("reshape", f"{name}.reshape", [pooled], out, grp, dt, shape=oshape)


def _split(
    imp: _Importer, node: Any, name: str, a: dict[str, Any], grp: str, dt: str | None, fail: Any
) -> None:
    """Split: one ``slice`` per output (a view when the block is contiguous)."""
    ins = list(node.input)
    x = imp.shape(ins[0])
    axis = a.get("axis", 0) % len(x)
    outs = list(node.output)
    if len(ins) > 1 and ins[1]:
        vals = imp.const_values(ins[1])
        if vals is None:
            raise fail("split sizes must be a constant")
        sizes = [int(v) for v in vals.reshape(-1)]
    elif "split" in a:
        sizes = list(a["split"])
    else:
        n = len(outs)
        step = -(-x[axis] // n)
        sizes = [min(step, x[axis] - k * step) for k in range(n)]
    src = imp.value(ins[0], name)
    start = 0
    for k, (o, size) in enumerate(zip(outs, sizes, strict=True)):
        if o and size == 0:  # an empty piece (a rotary dim that takes the whole head)
            imp.empty.add(o)
        elif o:
            imp.add(
                "slice",
                name if k == 0 else f"{name}.{k}",
                [src],
                o,
                grp,
                dt,
                axis=axis,
                start=start,
                stop=start + size,
            )
            theirs = imp.types.get(o, (None, 0))[0]
            if theirs is not None and theirs != imp.b.shape(o):
                raise fail(
                    f"output {k}: wia-hw computes {list(imp.b.shape(o))} but ONNX "
                    f"shape inference gives {list(theirs)}"
                )
        start += size


def _pad(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """Pad: per padded axis a ``concat`` of what goes before, the input and what goes
    after: fill weights (constant mode), or slices of the input's border rows (edge:
    the border row repeated; reflect: the rows next to it, mirrored)."""
    import numpy as np

    ins = list(node.input)
    try:
        mode, todo, fill = _pad_spec(imp, node, len(imp.shape(ins[0])))
    except ValueError as e:
        raise fail(str(e)) from None
    if mode not in ("constant", "edge", "reflect"):
        raise fail(f"mode {mode!r} is not modelled (constant, edge, reflect)")
    if any(lo < 0 or hi < 0 for _, lo, hi in todo):
        raise fail(f"negative pads {[p for _, lo, hi in todo for p in (lo, hi)]} are not modelled")
    y = imp.value(ins[0], name)
    if not todo:
        imp.add("identity", name, [y], out, grp, dt)
        return
    xd = imp.b.tensor(y).dtype
    for j, (ax, lo, hi) in enumerate(todo):
        cur = imp.b.shape(y)
        if mode == "reflect" and max(lo, hi) >= cur[ax]:
            raise fail(f"reflect pads {[lo, hi]} reach past axis {ax} of {list(cur)}")

        def edge(side: str, width: int, src: str = y, ax: int = ax, j: int = j) -> list[str]:
            """What goes on one side of axis ``ax``: nothing, a fill weight (constant
            mode) or copies of the input's own border rows."""
            if not width:
                return []
            if mode != "constant":
                return [_pad_border(imp, name, out, grp, dt, src, ax, side, width, mode, j)]
            shape = imp.b.shape(src)[:ax] + (width,) + imp.b.shape(src)[ax + 1 :]
            wname = imp.made(imp.b.weight(f"{name}.fill{j}_{side}", shape, xd))
            if fill is not None:
                imp.values[wname] = lambda: np.full(shape, fill, dtype=np.float32)
            return [wname]

        parts = [*edge("lo", lo), y, *edge("hi", hi)]
        last = j == len(todo) - 1
        y = imp.add(
            "concat",
            name if last else f"{name}.{j}",
            parts,
            out if last else f"{out}.{j}",
            grp,
            dt,
            axis=ax,
        )


def _pad_border(
    imp: _Importer,
    name: str,
    out: str,
    grp: str,
    dt: str | None,
    y: str,
    ax: int,
    side: str,
    width: int,
    mode: str,
    j: int,
) -> str:
    """The ``width`` rows an edge or reflect Pad adds on one side of axis ``ax``:
    ``slice`` copies of the border row (edge), or of the rows next to it, mirrored
    (reflect: one single-row slice per padded row, in mirror order, joined)."""
    n = imp.b.shape(y)[ax]
    if mode == "edge":
        rows = [0] * width if side == "lo" else [n - 1] * width
    elif side == "lo":
        rows = list(range(width, 0, -1))
    else:
        rows = list(range(n - 2, n - 2 - width, -1))
    tag = f"{name}.{mode}{j}_{side}"
    parts = [
        imp.add(
            "slice",
            f"{tag}.{k}",
            [y],
            f"{out}.{mode}{j}_{side}.{k}",
            grp,
            dt,
            axis=ax,
            start=r,
            stop=r + 1,
        )
        for k, r in enumerate(rows)
    ]
    if len(parts) == 1:
        return parts[0]
    return imp.add("concat", tag, parts, f"{out}.{mode}{j}_{side}", grp, dt, axis=ax)


def _resize(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """Resize, nearest mode, integer scale on the spatial axes of ``[N, C, H, W]``:
    ``[N, C, H, 1, W, 1]`` (a view) -> ``concat`` of ``fw`` copies -> ``concat`` of
    ``fh`` copies -> ``[N, C, H*fh, W*fw]`` (a view): exactly nearest upsampling's
    element order, so the bytes are the copy's."""
    mode = a.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("nearest", "linear", "bilinear", "cubic", "bicubic"):
        raise fail(f"mode {mode!r} is not modelled (nearest, linear, cubic)")
    x = imp.shape(node.input[0])
    y = _out_shape(imp, out, fail)
    if len(x) != 4 or y[:2] != x[:2]:
        raise fail(f"{list(x)} -> {list(y)} does not resize the spatial axes of [N, C, H, W]")
    if mode != "nearest":
        _resize_linear(imp, node, name, a, out, grp, dt, fail, x, y)
        return
    if any(b % a_ for a_, b in zip(x[2:], y[2:], strict=True)):
        raise fail(
            f"{list(x)} -> {list(y)} is not an integer upscale of [N, C, H, W] (nearest "
            "Resize is modelled for integer upscales only)"
        )
    fh, fw = y[2] // x[2], y[3] // x[3]
    ctm = a.get("coordinate_transformation_mode", b"half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    nm = a.get("nearest_mode", b"round_prefer_floor")
    nm = nm.decode() if isinstance(nm, bytes) else nm
    if node.op_type == "Upsample" or imp.opset < 11:  # Upsample, Resize-10: asymmetric floor
        ctm, nm = "asymmetric", "floor"
    for n_in, n_out in ((x[2], y[2]), (x[3], y[3])):
        got = _nearest_source(n_in, n_out, ctm, nm)
        if got is None or got != [i * n_in // n_out for i in range(n_out)]:
            raise fail(
                f"coordinate_transformation_mode {ctm!r} with nearest_mode {nm!r} does not "
                f"repeat each of {n_in} pixels {n_out // n_in} times; wia-hw models nearest "
                "upsampling as pixel repetition"
            )
    v = imp.add(
        "reshape",
        f"{name}.expand_dims",
        [imp.value(node.input[0], name)],
        f"{out}.6d",
        grp,
        None,
        shape=(x[0], x[1], x[2], 1, x[3], 1),
    )
    if fw > 1:
        v = imp.add("concat", f"{name}.repeat_w", [v] * fw, f"{out}.w", grp, dt, axis=5)
    if fh > 1:
        v = imp.add("concat", f"{name}.repeat_h", [v] * fh, f"{out}.h", grp, dt, axis=3)
    imp.add("reshape", name, [v], out, grp, dt, shape=y)


def _normalization(
    imp: _Importer, node: Any, name: str, a: dict[str, Any], out: str, grp: str, dt: str | None
) -> None:
    """LayerNormalization and RMSNormalization (opset 23) over the dims from ``axis``
    on: a ``layer_norm`` (``rms`` for RMS norm) over the last axis, the input (and
    scale and bias) viewed flat from ``axis`` when that is not the last one."""
    ins = [i for i in node.input]
    x = imp.shape(ins[0])
    rank = len(x)
    axis = a.get("axis", -1) % rank
    rows, width = math.prod(x[:axis]), math.prod(x[axis:])
    attrs: dict[str, Any] = {"eps": float(a.get("epsilon", 1e-5))}
    if node.op_type == "RMSNormalization":
        attrs["rms"] = True

    def view(src: str, shape: tuple[int, ...], tag: str) -> str:
        return imp.view(src, shape, f"{name}.{tag}", f"{out}.{tag}", grp)

    params = [view(imp.value(i, name), (width,), f"p{j}") for j, i in enumerate(ins[1:3]) if i]
    if axis == rank - 1:
        imp.add("layer_norm", name, [imp.value(ins[0], name), *params], out, grp, dt, **attrs)
        return
    # normalised over several dims: a flat view of them
    src = view(imp.value(ins[0], name), (rows, width), "flat")
    y = imp.add("layer_norm", name, [src, *params], f"{out}.flat_out", grp, dt, **attrs)
    imp.add("reshape", f"{name}.unflat", [y], out, grp, dt, shape=x)


def _group_norm(
    imp: _Importer, node: Any, name: str, a: dict[str, Any], out: str, grp: str, dt: str | None
) -> None:
    """InstanceNormalization and GroupNormalization: the input ``[N, C, *S]`` viewed ``[N, G, C/G * prod(S)]`` (G = C for instance norm), a
    ``layer_norm`` of each group (``eps``), the view back, ``* scale`` and ``+ bias``
    per channel (GroupNormalization before opset 21: per group, repeated over the
    group's channels at import)."""
    import numpy as np

    t, ins = node.op_type, list(node.input)
    x = imp.shape(ins[0])
    n, c = x[0], x[1]
    spatial = math.prod(x[2:])
    groups = int(a.get("num_groups", 1)) if t == "GroupNormalization" else c
    if groups < 1 or c % groups:
        raise WorkloadError(
            f"ONNX node {name!r} ({t}): {c} channels do not split into {groups} groups"
        )
    eps = float(a.get("epsilon", 1e-5))
    src = imp.view(
        imp.value(ins[0], name),
        (n, groups, c // groups * spatial),
        f"{name}.groups",
        f"{out}.groups",
        grp,
    )
    y = imp.add("layer_norm", f"{name}.norm", [src], f"{out}.norm", grp, dt, eps=eps)
    y = imp.view(y, x, f"{name}.back", f"{out}.back", grp)
    bshape = (c,) + (1,) * (len(x) - 2)
    for j, (kind, tag) in enumerate((("mul", "scale"), ("add", "bias"))):
        v = ins[j + 1] if len(ins) > j + 1 else ""
        if not v:
            continue
        if v not in imp.consts:
            raise WorkloadError(f"ONNX node {name!r} ({t}): {tag} {v!r} must be a constant")
        per_group = imp.shape(v) == (groups,) and groups != c
        w = imp.const_weight(
            v,
            bshape,
            f"{tag}_c",
            name,
            make=(lambda arr: np.repeat(arr, c // groups).reshape(bshape)) if per_group else None,
        )
        last = j == 1 or not (len(ins) > 2 and ins[2])
        y = imp.add(kind, f"{name}.{tag}", [y, w], out if last else f"{out}.{tag}", grp, dt)
    if y != out:
        imp.add("identity", f"{name}.out", [y], out, grp, dt)


def _lp_norm(
    imp: _Importer, node: Any, name: str, a: dict[str, Any], out: str, grp: str, dt: str | None
) -> None:
    """LpNormalization: ``x / sum(|x|^p)^(1/p)`` over ``axis`` (p 1 or 2): ``abs`` or
    ``x * x``, a sum over the axis (kept as 1), ``sqrt`` for p = 2, ``div``."""
    ins = list(node.input)
    x = imp.shape(ins[0])
    ax = a.get("axis", -1) % len(x)
    p = a.get("p", 2)
    if p not in (1, 2):
        raise WorkloadError(f"ONNX node {name!r} (LpNormalization): p={p} is not 1 or 2")
    src = imp.value(ins[0], name)
    mag = (
        imp.add("abs", f"{name}.abs", [src], f"{out}.abs", grp, dt)
        if p == 1
        else imp.add("mul", f"{name}.square", [src, src], f"{out}.square", grp, dt)
    )
    kept = tuple(1 if d == ax else n for d, n in enumerate(x))
    _reduce_axes(imp, f"{name}.sum", mag, x, [ax], f"{out}.sum", kept, grp, dt, "sum", {})
    norm = (
        f"{out}.sum"
        if p == 1
        else imp.add("sqrt", f"{name}.norm", [f"{out}.sum"], f"{out}.norm", grp, dt)
    )
    # a zero norm (an all-zero slice) divides by the smallest normal float: 0, as ONNX
    tiny = float(np.finfo(np.float32).tiny)
    norm = imp.add("clip", f"{name}.floor", [norm], f"{out}.floor", grp, dt, min=tiny)
    imp.add("div", name, [src, norm], out, grp, dt)


def _space_depth(
    imp: _Importer, node: Any, name: str, a: dict[str, Any], out: str, grp: str, dt: str | None
) -> None:
    """DepthToSpace (DCR or CRD) and SpaceToDepth: a 6-D view, a ``transpose`` (the
    copy), the view to the output."""
    x = imp.shape(node.input[0])
    n, c, h, w = x
    b = int(a["blocksize"])
    src = imp.value(node.input[0], name)
    crd = a.get("mode", b"DCR") in (b"CRD", "CRD")
    if node.op_type == "SpaceToDepth":  # CRD (opset 24): channels before the blocks
        six = (n, c, h // b, b, w // b, b)
        perm = (0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4)
    elif crd:
        six, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
    else:
        six, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
    v = imp.view(src, six, f"{name}.six", f"{out}.six", grp)
    y = imp.add("transpose", name, [v], f"{out}.moved", grp, dt, perm=perm)
    if node.op_type == "SpaceToDepth":
        shape = (n, c * b * b, h // b, w // b)
    else:
        shape = (n, c // (b * b), h * b, w * b)
    imp.add("reshape", f"{name}.out", [y], out, grp, dt, shape=shape)


def _one_hot(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """OneHot of run-time indices (constant depth and values): the indices viewed with a
    unit axis at ``axis``, ``compare`` (equal) against ``0..depth-1`` and against
    ``-depth..-1`` (ONNX counts negative indices from the end), ``logical`` or, then a
    ``where`` between the on and off values."""
    ins = list(node.input)
    depth_v, values_v = imp.const_values(ins[1]), imp.const_values(ins[2])
    if depth_v is None or values_v is None:
        raise fail("depth and values must be constants")
    depth = int(np.asarray(depth_v).reshape(-1)[0])
    idx_shape = imp.shape(ins[0])
    rank = len(idx_shape) + 1
    ax = a.get("axis", -1) % rank
    unit = idx_shape[:ax] + (1,) + idx_shape[ax:]
    along = tuple(depth if d == ax else 1 for d in range(rank))
    idx = imp.view(imp.value(ins[0], name), unit, f"{name}.unit", f"{out}.unit", grp)
    idt = imp.b.tensor(idx).dtype
    hits = []
    for tag, lo in (("pos", 0), ("neg", -depth)):
        r = imp.b.weight(f"{name}.{tag}", along, idt)
        imp.values[r] = lambda lo=lo: np.arange(lo, lo + depth).reshape(along)
        hits.append(
            imp.add(
                "compare", f"{name}.{tag}_eq", [idx, r], f"{out}.{tag}_eq", grp, "bool", op="equal"
            )
        )
    hit = imp.add("logical", f"{name}.hit", hits, f"{out}.hit", grp, "bool", op="or")
    vals = np.asarray(values_v).reshape(-1)
    vdt = dt or "fp32"
    on, off = imp.b.weight(f"{name}.on", (1,), vdt), imp.b.weight(f"{name}.off", (1,), vdt)
    imp.values[on] = lambda: vals[1:2].copy()
    imp.values[off] = lambda: vals[0:1].copy()
    imp.add("where", name, [hit, on, off], out, grp, dt)


def _tile(
    imp: _Importer, node: Any, name: str, out: str, grp: str, dt: str | None, fail: Any
) -> None:
    """Tile on a run-time tensor with constant repeats: per repeated axis a ``concat``
    of the copies."""
    reps = imp.const_values(node.input[1])
    if reps is None:
        raise fail("repeats must be a constant")
    y = imp.value(node.input[0], name)
    cut = [(ax, int(r)) for ax, r in enumerate(reps.reshape(-1)) if int(r) != 1]
    if not cut:
        imp.add("identity", name, [y], out, grp, dt)
        return
    for j, (ax, r) in enumerate(cut):
        last = j == len(cut) - 1
        y = imp.add(
            "concat",
            name if last else f"{name}.{j}",
            [y] * r,
            out if last else f"{out}.{j}",
            grp,
            dt,
            axis=ax,
        )


def _attention(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """Attention (opset 23): ``softmax(scale Q K^T + mask) V`` as ``bmm`` (K transposed,
    the scale its epilogue), an ``add`` of the mask (a boolean mask first becomes 0 or
    -inf through a ``where``), ``softmax`` (``causal`` for ``is_causal``; with more keys
    than queries ONNX's upper-left triangle is an added constant mask), ``bmm``. 3-D
    inputs ``[B, S, H*D]`` are viewed and transposed to heads; grouped K/V heads are
    repeated (``concat`` copies). The KV-cache inputs and outputs, ``softcap`` and the
    QK output are refused."""
    import numpy as np

    ins = list(node.input)
    if any(ins[4:]) or any(node.output[1:]):
        raise fail(
            "past_key/past_value, present_key/present_value or the QK output are not modelled"
        )
    if a.get("softcap", 0.0):
        raise fail(f"softcap {a['softcap']} is not modelled")
    known = {"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale"}
    known |= {"softcap", "softmax_precision"}
    other = sorted(set(a) - known)
    if other:  # a later opset's (left_window_size ...): computed otherwise
        raise fail(f"attributes {', '.join(other)} are not modelled")
    q, k, v = (imp.shape(i) for i in ins[:3])
    three_d = len(q) == 3

    def heads(src: str, shape: tuple[int, ...], h: int, tag: str) -> str:
        b, s_, hd = shape
        x4 = imp.add(
            "reshape",
            f"{name}.{tag}4",
            [imp.value(src, name)],
            f"{out}.{tag}4",
            grp,
            None,
            shape=(b, s_, h, hd // h),
        )
        return imp.add(
            "transpose", f"{name}.{tag}h", [x4], f"{out}.{tag}h", grp, None, perm=(0, 2, 1, 3)
        )

    if three_d:
        hq, hkv = a.get("q_num_heads"), a.get("kv_num_heads")
        if not hq or not hkv:
            raise fail("3-D inputs need q_num_heads and kv_num_heads")
        qh, kh_, vh = (
            heads(ins[0], q, hq, "q"),
            heads(ins[1], k, hkv, "k"),
            heads(ins[2], v, hkv, "v"),
        )
    elif len(q) == 4 and len(k) == 4 and len(v) == 4:
        qh, kh_, vh = (imp.value(i, name) for i in ins[:3])
    else:
        raise fail(f"Q {list(q)}, K {list(k)}, V {list(v)} are not all 3-D or all 4-D")
    bq, hq, sq, d = imp.b.shape(qh)
    _, hkv, sk, _ = imp.b.shape(kh_)
    if hq % hkv:
        raise fail(f"{hq} query heads do not share {hkv} key/value heads evenly")
    if hkv != hq:  # grouped-query attention: each K/V head serves hq/hkv query heads

        def repeat(src: str, tag: str) -> str:
            b_, h_, l_, e_ = imp.b.shape(src)
            five = imp.add(
                "reshape",
                f"{name}.{tag}5",
                [src],
                f"{out}.{tag}5",
                grp,
                None,
                shape=(b_, h_, 1, l_, e_),
            )
            rep = imp.add(
                "concat",
                f"{name}.{tag}rep",
                [five] * (hq // hkv),
                f"{out}.{tag}rep",
                grp,
                None,
                axis=2,
            )
            return imp.add(
                "reshape",
                f"{name}.{tag}g",
                [rep],
                f"{out}.{tag}g",
                grp,
                None,
                shape=(b_, hq, l_, e_),
            )

        kh_, vh = repeat(kh_, "k"), repeat(vh, "v")
    scale = float(a.get("scale", 1.0 / math.sqrt(d)))
    y = imp.add(
        "bmm", f"{name}.scores", [qh, kh_], f"{out}.scores", grp, dt, transpose_b=True, scale=scale
    )
    if len(ins) > 3 and ins[3]:
        mask = imp.value(ins[3], name)
        if imp.b.tensor(mask).dtype == "bool":  # True attends: 0, False: -inf
            zero = imp.made(imp.b.weight(f"{name}.mask_keep", (1,), "fp32"))
            drop = imp.made(imp.b.weight(f"{name}.mask_drop", (1,), "fp32"))
            imp.values[zero] = lambda: np.zeros(1, np.float32)
            imp.values[drop] = lambda: np.full(1, -np.inf, np.float32)
            mask = imp.add("where", f"{name}.mask", [mask, zero, drop], f"{out}.mask", grp, None)
        y = imp.add("add", f"{name}.masked", [y, mask], f"{out}.masked", grp, dt)
    causal = bool(a.get("is_causal", 0))
    if causal and sq != sk:  # ONNX aligns the triangle upper-left: query i sees keys <= i
        tri = imp.made(imp.b.weight(f"{name}.causal", (sq, sk), "fp32"))
        imp.values[tri] = lambda: np.where(
            np.tril(np.ones((sq, sk), bool)), np.float32(0), np.float32(-np.inf)
        ).astype(np.float32)
        y = imp.add("add", f"{name}.causal_mask", [y, tri], f"{out}.causal", grp, dt)
        causal = False
    p = imp.add(
        "softmax",
        f"{name}.probs",
        [y],
        f"{out}.probs",
        grp,
        dt,
        axis=-1,
        **({"causal": True} if causal else {}),
    )
    if not three_d:
        imp.add("bmm", name, [p, vh], out, grp, dt)
        return
    ctx = imp.add("bmm", name, [p, vh], f"{out}.ctx", grp, dt)
    t = imp.add("transpose", f"{name}.merge", [ctx], f"{out}.merge", grp, None, perm=(0, 2, 1, 3))
    dv = imp.b.shape(vh)[3]
    imp.add("reshape", f"{name}.out", [t], out, grp, dt, shape=(bq, sq, hq * dv))


def _einsum(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """Einsum of one operand (a permutation) or two (a batched matrix product): each
    operand is permuted to ``(batch, free, contracted)`` / ``(batch, contracted,
    free)`` and viewed as ``[B, M, K]`` / ``[B, K, N]``, one ``bmm`` (``matmul`` or
    ``linear`` without batch letters), then viewed and permuted to the output's letters.
    Letters repeated in one operand (a trace or diagonal), or summed in one operand
    alone, are refused."""
    eq = a.get("equation", b"")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    ins = [i for i in node.input]
    shapes = [imp.shape(i) for i in ins]
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ins) or len(ins) not in (1, 2):
        raise fail(f"equation {eq!r}: wia-hw models Einsum of one or two operands")
    spare = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq)
    ell = ""
    if "..." in eq:  # the broadcast dims: as many fresh letters as the widest operand needs
        width = max(
            len(s) - len(t.replace("...", ""))
            for s, t in zip(shapes, terms, strict=True)
            if "..." in t
        )
        ell = "".join(next(spare) for _ in range(width))
        terms = [
            t.replace("...", ell[len(ell) - (len(s) - len(t) + 3) :])
            for t, s in zip(terms, shapes, strict=True)
        ]
    if not arrow:  # implicit output: the letters met once, in order
        counts = {c: "".join(terms).count(c) for c in "".join(terms)}
        rhs = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
    rhs = rhs.replace("...", ell)
    size: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        if len(term) != len(shape) or len(set(term)) != len(term):
            raise fail(
                f"equation {eq!r}: operand {term!r} of shape {list(shape)} repeats a letter or does not fit"
            )
        for c, d in zip(term, shape, strict=True):
            if size.setdefault(c, d) != d:
                raise fail(
                    f"equation {eq!r}: letter {c!r} is {size[c]} and {d}; wia-hw does not broadcast Einsum dims"
                )
    if any(sum(c in t for t in terms) == 1 and c not in rhs for c in size):
        raise fail(f"equation {eq!r}: a letter summed within one operand is not modelled")

    def permuted(src: str, have: str, want: str, tag: str) -> str:
        if have == want:
            return src
        perm = tuple(have.index(c) for c in want)
        return imp.add("transpose", f"{name}.{tag}", [src], f"{out}.{tag}", grp, None, perm=perm)

    def view(src: str, shape: tuple[int, ...], tag: str) -> str:
        return imp.view(src, shape, f"{name}.{tag}", f"{out}.{tag}", grp)

    if len(terms) == 1:
        src = permuted(imp.value(ins[0], name), terms[0], rhs, "perm")
        imp.add("identity", name, [src], out, grp, dt)
        return
    ta, tb = terms
    batch = [c for c in rhs if c in ta and c in tb]
    free_a = [c for c in rhs if c in ta and c not in tb]
    free_b = [c for c in rhs if c in tb and c not in ta]
    red = [c for c in ta if c in tb and c not in rhs]
    prod = lambda cs: math.prod(size[c] for c in cs)  # noqa: E731
    bsz, m, k, n = prod(batch), prod(free_a), prod(red), prod(free_b)
    a_src = permuted(imp.value(ins[0], name), ta, "".join(batch + free_a + red), "a")
    b_src = permuted(imp.value(ins[1], name), tb, "".join(batch + red + free_b), "b")
    mid = "".join(batch + free_a + free_b)
    if batch:
        a_v = view(a_src, (bsz, m, k), "a3")
        b_v = view(b_src, (bsz, k, n), "b3")
        y = imp.add("bmm", f"{name}.bmm", [a_v, b_v], f"{out}.bmm", grp, dt)
    else:
        a_v = view(a_src, (m, k), "a2")
        b_v = view(b_src, (k, n), "b2")
        kind = "linear" if imp.b.tensor(b_v).kind == "weight" else "matmul"
        y = imp.add(kind, f"{name}.{kind}", [a_v, b_v], f"{out}.{kind}", grp, dt)
    y = view(y, tuple(size[c] for c in mid), "unflat")
    y = permuted(y, mid, rhs, "out")
    imp.add("identity", name, [y], out, grp, dt)


def _bn_affine(imp: _Importer, bn: Any) -> Callable[[], tuple[Any, Any]] | None:
    """BatchNormalization's per-channel ``(scale, shift)``: ``gamma / sqrt(var + eps)``
    and ``beta - mean * scale``; None when a parameter has no value in the model."""
    import numpy as np

    params = list(bn.input[1:5])
    if any(p not in imp.consts or not imp.has_value(p) for p in params):
        return None
    eps = float(_attrs(bn).get("epsilon", 1e-5))

    def compute() -> tuple[Any, Any]:
        gamma, beta, mean, var = (imp.weight_array(p).astype(np.float64) for p in params)
        scale = gamma / np.sqrt(var + eps)
        return scale, beta - mean * scale

    return compute


def _chain_affine(imp: _Importer, chain: list[Any]) -> Callable[[], tuple[Any, Any]] | None:
    """The per-channel ``(scale, shift)`` of the nodes folded into a Conv, composed in
    order (a BatchNormalization's, or a Mul, Add, Sub or Div by its constant); None when
    a constant has no value in the model."""
    import numpy as np

    steps: list[Any] = []
    for n in chain:
        if n.op_type == "BatchNormalization":
            bn = _bn_affine(imp, n)
            if bn is None:
                return None
            steps.append(("bn", bn))
            continue
        c = n.input[0] if n.input[0] in imp.consts else n.input[1]  # (y * c or c * y)
        if not imp.has_value(c):
            return None
        steps.append((n.op_type, lambda c=c: imp.weight_array(c).astype(np.float64).reshape(-1)))

    def compute() -> tuple[Any, Any]:
        scale, shift = np.float64(1.0), np.float64(0.0)
        for op, value in steps:
            if op == "bn":
                s, b = value()
                scale, shift = scale * s, shift * s + b
            elif op == "Mul":
                scale, shift = scale * value(), shift * value()
            elif op == "Div":
                scale, shift = scale / value(), shift / value()
            else:  # Add, Sub
                shift = shift + value() if op == "Add" else shift - value()
        return scale, shift

    return compute


def _fold_values(
    imp: _Importer, chain: list[Any], weight: str, bias: str | None, bias_tensor: str
) -> None:
    """The values of a Conv with ``chain`` folded in (its per-channel affine
    ``y * scale + shift``): the weight's output channels times the scale, the bias
    ``b * scale + shift`` (no bias: the shift). Neither has one when the model lacks a
    value."""
    import numpy as np

    affine = _chain_affine(imp, chain)
    if affine is None or not imp.has_value(weight):
        imp.values.pop(weight, None)
        imp.values.pop(bias_tensor, None)
        return
    w_shape = tuple(imp.b.shape(weight))

    channels = w_shape[0]

    def conv_weight() -> Any:
        scale = np.broadcast_to(affine()[0], (channels,))
        w = imp.weight_array(weight)
        return (w * scale.reshape((-1,) + (1,) * (w.ndim - 1))).reshape(w_shape)

    def conv_bias() -> Any:
        scale, shift = affine()
        b = imp.weight_array(bias) if bias is not None else 0.0
        return np.broadcast_to(b * scale + shift, (channels,))

    imp.values[weight] = conv_weight
    if bias is not None and not imp.has_value(bias):
        imp.values.pop(bias_tensor, None)
    else:
        imp.values[bias_tensor] = conv_bias


def _window3d(
    node: Any, a: dict[str, Any], kernel: list[int], dhw: tuple[int, ...], fail: Any
) -> tuple[list[int], list[int], list[int]]:
    """A 3-D Conv/pool node's (strides, dilations, pads ``[d0, h0, w0, d1, h1, w1]``),
    ``auto_pad`` resolved as ONNX does."""
    stride = [int(v) for v in a.get("strides", [1, 1, 1])]
    dil = [int(v) for v in a.get("dilations", [1, 1, 1])]
    if len(kernel) != 3 or len(stride) != 3 or len(dil) != 3:
        raise fail(f"kernel_shape {kernel}, strides {stride} or dilations {dil} is not 3-D")
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        pads = [int(v) for v in a.get("pads", [0] * 6)]
        if len(pads) != 6:
            raise fail(f"pads {pads} is not 3-D")
    elif auto == "VALID":
        pads = [0] * 6
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(auto, dhw, kernel, stride, dil)
    else:
        raise fail(f"unknown auto_pad {auto!r}")
    return stride, dil, pads


def _depth_taps(
    imp: _Importer,
    name: str,
    src: str,
    out: str,
    grp: str,
    dt: str | None,
    window: tuple[int, int, int, int, int],
    fill: float,
) -> list[str]:
    """The depth taps of a 3-D window over ``src`` [N, C, D, H, W]: depth padded with
    ``fill`` (``lo``, ``hi``), then per kernel position ``j`` the slice of the depths
    that output depth ``t`` reads there, ``j * dilation + t * stride``, each
    [N, C, Dout, H, W]. ``window`` is (kernel, stride, dilation, lo, hi)."""
    import numpy as np

    k, stride, dil, lo, hi = window
    x = imp.b.shape(src)
    if lo or hi:
        xd = imp.b.tensor(src).dtype
        parts = []
        for side, width in (("lo", lo), ("hi", hi)):
            if width:
                shape = (x[0], x[1], width, *x[3:])
                # zeros of the padded depth: a constant of the run (Importer.made)
                wname = imp.made(imp.b.weight(f"{name}.depth_pad_{side}", shape, xd))
                imp.values[wname] = lambda shape=shape: np.full(shape, fill, np.float32)
                parts.append(wname)
        parts.insert(1 if lo else 0, src)
        src = imp.add("concat", f"{name}.depth_pad", parts, f"{out}.depth_pad", grp, dt, axis=2)
    depth = x[2] + lo + hi
    dout = (depth - dil * (k - 1) - 1) // stride + 1
    if dout < 1:
        raise WorkloadError(f"ONNX node {name!r}: the depth window does not fit the input")
    taps = []
    for j in range(k):
        start, stop = j * dil, j * dil + stride * (dout - 1) + 1
        if (start, stop, stride) == (0, depth, 1):
            taps.append(src)
            continue
        taps.append(
            imp.add(
                "slice",
                f"{name}.tap{j}",
                [src],
                f"{out}.tap{j}",
                grp,
                dt,
                axis=2,
                start=start,
                stop=stop,
                **({"step": stride} if stride != 1 else {}),
            )
        )
    return taps


def _conv3d(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """A 3-D Conv as one ``conv2d``: the kernel's depth taps (:func:`_depth_taps`) are
    stacked into the channels, group by group ([N * Dout, g * kd * C/g, H, W]), the
    weight [O, C/g, kd, kh, kw] is laid out to match ([O, kd * C/g, kh, kw]), and the
    result [N * Dout, O, Ho, Wo] is moved back to [N, O, Dout, Ho, Wo]. The same MACs,
    one GEMM of K = C/g * kd * kh * kw, as an accelerator maps a 3-D convolution; the
    taps are copies of the input."""
    ins = list(node.input)
    n, c, d, h, w_ = imp.shape(ins[0])
    o, cg, kd, kh, kw = imp.shape(ins[1])
    groups = int(a.get("group", 1))
    if ins[1] not in imp.consts:
        raise fail("a 3-D Conv needs a constant weight (it is laid out for the array at import)")
    if c != cg * groups or o % groups:
        raise fail(
            f"weight {[o, cg, kd, kh, kw]} does not fit input {[n, c, d, h, w_]}, group {groups}"
        )
    stride, dil, pads = _window3d(node, a, [kd, kh, kw], (d, h, w_), fail)
    x = imp.value(ins[0], name)
    taps = _depth_taps(imp, name, x, out, grp, dt, (kd, stride[0], dil[0], pads[0], pads[3]), 0.0)
    dout = imp.b.shape(taps[0])[2]
    views = [
        imp.view(t, (n, groups, 1, cg, dout, h, w_), f"{name}.tap{j}.g", f"{out}.tap{j}.g", grp)
        for j, t in enumerate(taps)
    ]
    stack = (
        views[0]
        if kd == 1
        else imp.add("concat", f"{name}.taps", views, f"{out}.taps", grp, dt, axis=2)
    )
    moved = imp.add(
        "transpose",
        f"{name}.depth_out",
        [stack],
        f"{out}.depth_out",
        grp,
        dt,
        perm=(0, 4, 1, 2, 3, 5, 6),
    )
    x2 = imp.view(moved, (n * dout, groups * kd * cg, h, w_), f"{name}.x2d", f"{out}.x2d", grp)
    wt = imp.const_weight(
        ins[1],
        (o, kd * cg, kh, kw),
        "conv3d",
        name,
        lambda arr: arr.transpose(0, 2, 1, 3, 4).reshape(o, kd * cg, kh, kw),
    )
    inputs = [x2, wt] + ([imp.value(ins[2], name)] if len(ins) > 2 and ins[2] else [])

    def compact(v: list[int]) -> int | list[int]:
        return v[0] if len(set(v)) == 1 else v

    y = imp.add(
        "conv2d",
        f"{name}.conv2d",
        inputs,
        f"{out}.y2d",
        grp,
        dt,
        stride=compact(stride[1:]),
        pad=compact([pads[1], pads[2], pads[4], pads[5]]),
        dilation=compact(dil[1:]),
        groups=groups,
    )
    _, _, ho, wo = imp.b.shape(y)
    y = imp.view(y, (n, dout, o, ho, wo), f"{name}.y5d", f"{out}.y5d", grp)
    imp.add("transpose", name, [y], out, grp, dt, perm=(0, 2, 1, 3, 4))


def _pool3d(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """A 3-D MaxPool/AveragePool: per depth tap (:func:`_depth_taps`, padded with -inf
    for a max, zeros for an average) a 2-D pool of [N, C * Dout, H, W], then the taps'
    ``max``, or their sum scaled by 1/kd. An average whose depth padding is left out of
    the divisor (``count_include_pad=0`` with depth pads), dilations and a ceil_mode
    that adds a partial depth window are refused."""
    x = imp.shape(node.input[0])
    n, c, d, h, w_ = x
    if "kernel_shape" not in a:
        raise fail("has no kernel_shape attribute")
    kd, kh, kw = [int(k) for k in a["kernel_shape"]]
    stride, dil, pads = _window3d(node, a, [kd, kh, kw], (d, h, w_), fail)
    if dil != [1, 1, 1]:
        raise fail(f"dilations {dil} are not modelled for pooling")
    avg = node.op_type == "AveragePool"
    cip = bool(a.get("count_include_pad", 0))
    if avg and (pads[0] or pads[3]) and not cip:
        raise fail("a 3-D average pool with depth pads left out of the divisor is not modelled")
    depth = d + pads[0] + pads[3]
    if a.get("ceil_mode", 0) and (depth - kd) % stride[0]:
        raise fail("ceil_mode with a partial depth window is not modelled")
    src = imp.value(node.input[0], name)
    fill = 0.0 if avg else float("-inf")
    taps = _depth_taps(imp, name, src, out, grp, dt, (kd, stride[0], 1, pads[0], pads[3]), fill)
    dout = imp.b.shape(taps[0])[2]
    win: dict[str, Any] = {
        "kernel": [kh, kw],
        "stride": stride[1:],
        "pad": [pads[1], pads[2], pads[4], pads[5]],
    }
    if a.get("ceil_mode", 0):
        win["ceil_mode"] = True
    if avg:
        win["count_include_pad"] = cip
    kind = "avgpool" if avg else "maxpool"
    pooled = []
    for j, t in enumerate(taps):
        v2 = imp.view(t, (n, c * dout, h, w_), f"{name}.tap{j}.2d", f"{out}.tap{j}.2d", grp)
        pooled.append(imp.add(kind, f"{name}.pool{j}", [v2], f"{out}.pool{j}", grp, dt, **win))
    y = pooled[0]
    for j, p in enumerate(pooled[1:], 1):
        y = imp.add("add" if avg else "max", f"{name}.join{j}", [y, p], f"{out}.join{j}", grp, dt)
    if avg and kd > 1:
        y = imp.add("scale", f"{name}.mean", [y], f"{out}.mean", grp, dt, factor=1.0 / kd)
    _, _, ho, wo = imp.b.shape(y)
    imp.add("reshape", name, [y], out, grp, dt, shape=(n, c, dout, ho, wo))


def _conv_transpose(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
) -> None:
    """ConvTranspose (1-D or 2-D): every input pixel times the weights gives ``O x kh x
    kw`` columns (a 1x1 ``conv2d`` by the weight permuted to ``[O*kh*kw, C/g, 1, 1]``,
    a constant transform: the MACs a transposed convolution does, ``N H W C (O/g) kh
    kw``), then a ``col2im`` adds each column into its output pixel (the overlap-add,
    cropped by the pads), then the bias (an ``add``). Pads follow ONNX: explicit
    ``pads`` and ``output_padding``, or ``auto_pad`` SAME_UPPER/SAME_LOWER and
    ``output_shape``, the odd padding at the end or the start."""
    ins = list(node.input)
    x, w = imp.shape(ins[0]), imp.shape(ins[1])
    if len(x) not in (3, 4) or len(w) != len(x):
        raise fail(f"input {list(x)} is not 1-D [N, C, L] or 2-D [N, C, H, W]")
    src, final = imp.value(ins[0], name), out
    if len(x) == 3:  # 1-D: height 1
        a = _as_2d(a)
        for key in ("output_padding", "output_shape"):
            if key in a:
                a[key] = [0 if key == "output_padding" else 1, *a[key]]
        x, w = (x[0], x[1], 1, x[2]), (w[0], w[1], 1, w[2])
        src = imp.add("reshape", f"{name}.x2d", [src], f"{out}.x2d", grp, None, shape=x)
        out = f"{out}.y2d"
    g = int(a.get("group", 1))
    n_, c, h, wd = x
    og, kh, kw = w[1], w[2], w[3]
    o = og * g
    stride = [int(v) for v in a.get("strides", [1, 1])]
    dil = [int(v) for v in a.get("dilations", [1, 1])]
    opad = [int(v) for v in a.get("output_padding", [0, 0])]
    if len(stride) != 2 or len(dil) != 2 or len(opad) != 2:
        raise fail(f"strides {stride}, dilations {dil} or output_padding {opad} is not 2-D")
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    span = Window((kh, kw), (stride[0], stride[1]), (0, 0, 0, 0), (dil[0], dil[1])).transposed_span(
        h, wd
    )
    full = [span[i] + opad[i] for i in (0, 1)]
    shape_attr = [int(v) for v in a.get("output_shape", [])][-2:]
    if auto in ("SAME_UPPER", "SAME_LOWER") or shape_attr:
        want = shape_attr or [(h, wd)[i] * stride[i] for i in (0, 1)]
        pad = [0, 0, 0, 0]
        for i in (0, 1):
            total = full[i] - want[i]
            small = total // 2
            upper = auto == "SAME_UPPER" or not shape_attr
            pad[i], pad[i + 2] = (small, total - small) if upper else (total - small, small)
        if shape_attr and auto not in ("SAME_UPPER", "SAME_LOWER"):  # pads at the end
            begin = [int(v) for v in a.get("pads", [0, 0, 0, 0])][:2]
            pad = [begin[0], begin[1], full[0] - want[0] - begin[0], full[1] - want[1] - begin[1]]
    else:
        pad = [int(v) for v in a.get("pads", [0, 0, 0, 0])]
    if len(pad) != 4:
        raise fail(f"pads {pad} is not 2-D")
    if min(pad) < 0 and not shape_attr:
        raise fail(f"pads {pad} are negative")
    # the columns: one 1x1 conv2d of the input by the permuted weight
    wcols = (
        imp.const_weight(
            ins[1],
            (o * kh * kw, c // g, 1, 1),
            "cols",
            name,
            make=lambda v: (
                v.reshape(g, c // g, og, kh, kw)
                .transpose(0, 2, 3, 4, 1)
                .reshape(o * kh * kw, c // g, 1, 1)
            ),
        )
        if ins[1] in imp.consts
        else None
    )
    if wcols is None:
        raise fail("its weight is computed at run time; wia-hw models a constant weight")
    cols = imp.add("conv2d", f"{name}.cols", [src, wcols], f"{out}.cols", grp, dt, groups=g)
    win = {"kernel": [kh, kw], "stride": stride, "pad": pad, "dilation": dil}
    shape_kw = {"output_padding": opad} if any(opad) else {}
    if shape_attr:
        shape_kw = {"output_hw": shape_attr}
    y = out if not (len(ins) > 2 and ins[2]) else f"{out}.nobias"
    y = imp.add("col2im", name, [cols], y, grp, dt, channels=o, **win, **shape_kw)
    if len(ins) > 2 and ins[2]:
        bias = imp.add(
            "reshape",
            f"{name}.bias",
            [imp.value(ins[2], name)],
            f"{out}.bias",
            grp,
            None,
            shape=(o, 1, 1),
        )
        y = imp.add("add", f"{name}.add_bias", [y, bias], out, grp, dt)
    if out != final:  # back to [N, O, L]
        (n2, o2, _, l2) = imp.shape(y)
        imp.add("reshape", f"{name}.y1d", [y], final, grp, dt, shape=(n2, o2, l2))


def _resize_linear(
    imp: _Importer,
    node: Any,
    name: str,
    a: dict[str, Any],
    out: str,
    grp: str,
    dt: str | None,
    fail: Any,
    x: tuple[int, ...],
    y: tuple[int, ...],
) -> None:
    """Resize in linear mode (bilinear on ``[N, C, H, W]``): a ``resize`` op carrying
    the coordinate transformation and the scales ONNX maps coordinates with (the
    ``scales`` input when given, else output over input size); cubic mode carries
    ``cubic_coeff_a`` and ``exclude_outside``."""
    mode = a.get("mode", b"linear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ctm = a.get("coordinate_transformation_mode", b"half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    if node.op_type == "Upsample" or imp.opset < 11:
        ctm = "asymmetric"  # Upsample and Resize-10 map coordinates that way
    from ..emulator.functional import COORDINATE_MODES

    if ctm not in COORDINATE_MODES or ctm == "tf_half_pixel_for_nn":
        raise fail(f"coordinate_transformation_mode {ctm!r} is not modelled in linear mode")
    if a.get("antialias", 0) and (y[2] < x[2] or y[3] < x[3]):
        raise fail("antialias on a downscale is not modelled")
    scales = [y[2] / x[2], y[3] / x[3]]
    src = list(node.input)
    given = None
    if node.op_type == "Upsample" and len(src) > 1:
        given = imp.const_values(src[1])
    elif node.op_type == "Resize" and len(src) > 2 and src[2]:
        given = imp.const_values(src[2])
    elif node.op_type == "Resize" and len(src) > 3 and src[3] and imp.const_values(src[3]) is None:
        raise fail("sizes are computed at run time; wia-hw models constant sizes or scales")
    if given is None and node.op_type == "Resize" and len(src) > 2 and src[2]:
        raise fail("scales are computed at run time; wia-hw models constant sizes or scales")
    if given is not None and given.size == 4:
        scales = [float(given.reshape(-1)[2]), float(given.reshape(-1)[3])]
    imp.add(
        "resize",
        name,
        [imp.value(src[0], name)],
        out,
        grp,
        dt,
        coordinate_transformation_mode=ctm,
        scales=scales,
        size=[y[2], y[3]],
        **(
            {
                "mode": "cubic",
                "cubic_coeff_a": float(a.get("cubic_coeff_a", -0.75)),
                "exclude_outside": int(a.get("exclude_outside", 0)),
            }
            if mode in ("cubic", "bicubic")
            else {"mode": "linear"}
        ),
    )


def _nearest_source(n_in: int, n_out: int, ctm: str, nm: str) -> list[int] | None:
    """The input index each output index of a nearest Resize reads on one axis (its
    :func:`~wia_hw.emulator.functional.source_coordinate`, rounded by ``nearest_mode``,
    clamped), or None for a mode ONNX does not define."""
    import numpy as np

    from ..emulator.functional import COORDINATE_MODES, source_coordinate

    if ctm not in COORDINATE_MODES:
        return None
    xo = source_coordinate(n_in, n_out, n_out / n_in, ctm)
    lo, frac = np.floor(xo), xo - np.floor(xo)
    rounded = {
        "floor": lo,
        "ceil": np.ceil(xo),
        "round_prefer_floor": np.where(frac <= 0.5, lo, lo + 1),
        "round_prefer_ceil": np.where(frac < 0.5, lo, lo + 1),
    }.get(nm)
    if rounded is None:
        return None
    return [int(k) for k in np.clip(rounded, 0, n_in - 1)]


def _per_channel(imp: _Importer, n: Any, x: str, rank: int, channels: int) -> bool:
    """Whether node ``n`` applies to its input ``x`` (a Conv's output: ``rank`` axes,
    ``channels`` on axis 1) an affine map per channel that folds into the Conv: a
    BatchNormalization with constant parameters, or ``x * c``, ``x + c``, ``x - c``,
    ``x / c`` with a float constant ``c`` of one value or one per channel (``[C, 1, 1]``,
    ``[1, C, 1, 1]``)."""
    if n.domain not in ("", "ai.onnx") or not n.input:
        return False
    if n.op_type == "BatchNormalization":
        return (
            n.input[0] == x
            and all(i in imp.consts for i in n.input[1:5])
            and all(len(imp.consts[i].dims) == 1 for i in n.input[1:5])  # per channel
            and not _attrs(n).get("training_mode", 0)
            and len(n.output) == 1
        )
    if n.op_type not in ("Mul", "Add", "Sub", "Div") or len(n.input) != 2:
        return False
    if n.input[0] != x and (n.op_type in ("Sub", "Div") or n.input[1] != x):
        return False  # c - x and c / x are not affine in x
    c = n.input[1] if n.input[0] == x else n.input[0]
    if c == x or c not in imp.consts or c in imp.qparams:
        return False
    t = imp.consts[c]
    if imp.dtypes.get(t.data_type) not in ("fp32", "fp16", "bf16", "fp64"):
        return False
    dims = [int(d) for d in t.dims]
    if len(dims) > rank:
        return False
    dims = [1] * (rank - len(dims)) + dims
    return all(d == 1 for i, d in enumerate(dims) if i != 1) and dims[1] in (1, channels)


def _pad_spec(
    imp: _Importer, node: Any, rank: int
) -> tuple[str, list[tuple[int, int, int]], float | None]:
    """A Pad node's mode, its ``(axis, before, after)`` for every padded axis, and its
    fill (None when the model does not hold its value): pads and fill from the inputs
    (opset 11 on) or the attributes (before), the axes input of opset 18. ValueError
    naming the input that is not a constant."""
    a = _attrs(node)
    ins = list(node.input)
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if len(ins) > 1 and ins[1]:
        vals = imp.const_values(ins[1])
        if vals is None:
            raise ValueError("pads must be a constant")
        pads = [int(v) for v in vals.reshape(-1)]
    else:
        pads = [int(v) for v in a.get("pads", [])]
    axes = list(range(rank))
    if len(ins) > 3 and ins[3]:
        av = imp.const_values(ins[3])
        if av is None:
            raise ValueError("axes must be a constant")
        axes = [int(v) % rank for v in av.reshape(-1)]
    n = len(axes)
    padded = [(ax, pads[k], pads[k + n]) for k, ax in enumerate(axes) if pads[k] or pads[k + n]]
    fill: float | None = float(a.get("value", 0.0))
    if len(ins) > 2 and ins[2]:
        fv = imp.const_values(ins[2])
        fill = float(fv.reshape(-1)[0]) if fv is not None and fv.size else None
    return mode, padded, fill


def _zero_spatial_pads(imp: _Importer, n: Any, rank: int) -> list[int] | None:
    """A Pad node's ``[top, left, bottom, right]`` when it pads a 4-D tensor with
    zeros on its two spatial axes only, every pad a constant >= 0; else None."""
    if rank != 4:
        return None
    try:
        mode, padded, fill = _pad_spec(imp, n, rank)
    except ValueError:
        return None
    if (
        mode != "constant"
        or fill != 0.0
        or any(ax < 2 or lo < 0 or hi < 0 for ax, lo, hi in padded)
    ):
        return None
    by_axis = {ax: (lo, hi) for ax, lo, hi in padded}
    (top, bottom), (left, right) = by_axis.get(2, (0, 0)), by_axis.get(3, (0, 0))
    return [top, left, bottom, right]


def _fold_candidates(imp: _Importer) -> None:
    """Find what folds into a Conv: after it, a chain of BatchNormalization and Mul,
    Add, Sub or Div by per-channel constants (:func:`_per_channel`; each node the only
    reader of the one before); before it, a zero Pad of its spatial axes that feeds
    only it (:func:`_zero_spatial_pads`). Not into a Conv with a run-time or integer
    weight."""
    consumers: dict[str, list[Any]] = {}
    for n in imp.g.node:
        for i in dict.fromkeys(n.input):
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in imp.g.output}
    producer = {o: n for n in imp.g.node for o in n.output}
    for n in imp.g.node:
        if (
            n.op_type != "Conv"
            or n.domain not in ("", "ai.onnx")
            or len(n.input) < 2
            or n.input[1] not in imp.consts
            or n.input[1] in imp.qparams  # integer weights do not absorb a scale
        ):
            continue
        wdims = list(imp.consts[n.input[1]].dims)
        if len(wdims) not in (3, 4):
            continue  # a 3-D Conv's weight is laid out at import (_conv3d): not folded into
        rank, channels = len(wdims), wdims[0]
        chain, x = [], n.output[0]
        while len(consumers.get(x, [])) == 1 and x not in outputs and x not in imp.qparams:
            (nxt,) = consumers[x]
            if not _per_channel(imp, nxt, x, rank, channels):
                break
            chain.append(nxt)
            x = nxt.output[0]
        if chain:
            imp.folded[n.output[0]] = chain
            imp.skip.update(id(c) for c in chain)
        pad = producer.get(n.input[0])
        auto = _attrs(n).get("auto_pad", b"NOTSET")
        if (
            pad is not None
            and pad.op_type == "Pad"
            and pad.domain in ("", "ai.onnx")
            and len(consumers.get(n.input[0], [])) == 1
            and n.input[0] not in outputs
            and (auto.decode() if isinstance(auto, bytes) else auto) in ("NOTSET", "", "VALID")
            and len(_attrs(n).get("pads", [0, 0, 0, 0])) == 4
        ):
            extra = _zero_spatial_pads(imp, pad, rank)
            if extra is not None:
                imp.pad_folded[n.output[0]] = (pad, extra)
                imp.skip.add(id(pad))


def _preflight(proto: Any, source: str) -> None:
    """Refuse what onnx's C++ shape inference would abort the process on (an assertion,
    not an exception): a Split whose ``num_outputs`` differs from its outputs."""
    for n in proto.graph.node:
        if n.op_type == "Split" and n.domain in ("", "ai.onnx"):
            k = next((a.i for a in n.attribute if a.name == "num_outputs"), None)
            if k is not None and k != len(n.output):
                raise WorkloadError(
                    f"{source}: ONNX node {n.name or 'Split'!r} (Split): num_outputs {k} but "
                    f"{len(n.output)} outputs"
                )


def _prepare(
    onnx: Any,
    model: Any,
    batch: int | None,
    dims: Mapping[str, int],
    source: str | None = None,
) -> tuple[Any, str, str, int, dict[str, Any]]:
    """Load, fix the input dims, infer shapes and fold constants: (proto, graph name,
    source, nodes folded, ``info``: ``dims``, the entries of ``dims`` the model used;
    ``moved``, the shape-folded moves of weights, output -> a function giving its
    values; ``sources``, the shape-folded nodes that hold one weight of the model,
    output -> (that weight, its element count); ``held``, the bytes of the large
    inline initializers, held out of the proto while shape inference copies it round
    after round, which :func:`_import_prepared` puts back; ``dead``, the number of
    nodes removed after folding because no graph output depends on them; ``plain`` and
    ``made``, the constants that hold none of the model's data and the float ones
    folding computed from those). ``source``, when given, names the model in messages
    (``from_torch`` gives the module's class)."""
    import onnx.shape_inference

    from ._onnx_fold import (
        ABSENT,
        DERIVED,
        HELD,
        MADE,
        PLAIN,
        SOURCES,
        check_loops,
        fold,
        hold_weights,
        inline_small_external,
        prune_dead,
        sort_nodes,
    )

    proto, gname, loaded = _load(onnx, model)
    source = source or loaded
    sort_nodes(proto.graph, source)  # shape inference reads the nodes in order
    _preflight(proto, source)
    replace_removed_ops(onnx, proto)
    proto = upgrade_old_opset(onnx, proto, source)
    expand_ort_ops(onnx, proto)
    proto = expand_functions(onnx, proto, set(SUPPORTED_OPS) | set(FOLDED_OPS))
    base_dir = Path(model).parent if isinstance(model, (str, os.PathLike)) else None
    inline_small_external(onnx, proto, base_dir)
    g = proto.graph
    used = _fix_input_dims(g, {t.name for t in g.initializer}, batch, dims)
    folded, memo = 0, {HELD: hold_weights(onnx, proto)}
    for _ in range(8):  # folding can fix dims that the next inference round needs
        del proto.graph.value_info[:]
        proto = _infer(onnx, proto, source, strict=False)
        step, complete = fold(onnx, proto, base_dir, memo, source)
        folded += step
        if not step or complete:
            break
    check_loops(memo, source)
    dead = prune_dead(onnx, proto)  # before the unsupported-op check: a dead op is no op
    info = {
        "dims": used,
        "moved": memo.get(DERIVED, {}),
        "sources": memo.get(SOURCES, {}),
        "held": memo[HELD],
        "dead": dead,
        "plain": memo.get(PLAIN, set()),
        "made": memo.get(MADE, set()),
        "absent": memo.get(ABSENT, set()),
    }
    return proto, gname, source, folded, info


def _infer(onnx: Any, proto: Any, source: str, *, strict: bool) -> Any:
    try:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=strict, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkloadError(f"ONNX shape inference failed for {source}: {first}") from None


def _op_label(n: Any) -> str:
    return f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type


def unsupported_ops(proto: Any) -> dict[str, int]:
    """Op types of ``proto``'s nodes that have no mapping, with their node counts
    (most frequent first). Run on a folded model: folded nodes are gone."""
    counts: dict[str, int] = {}
    for n in proto.graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in SUPPORTED_OPS:
            counts[_op_label(n)] = counts.get(_op_label(n), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def unsupported_message(source: str, counts: Mapping[str, int]) -> str:
    """The one-line error naming every unsupported op type and its count."""
    kinds = "op type" if len(counts) == 1 else "op types"
    listed = ", ".join(f"{k} x{v}" for k, v in counts.items())
    ms = [k.split("::")[1] for k in counts if k.startswith("com.microsoft::")]
    if any(k.startswith(("Q", "DynamicQuantize")) or "Integer" in k or "NBits" in k for k in ms):
        hint_ort = (
            "; these ONNX Runtime contrib ops (com.microsoft) are not modelled: quantise in "
            "QDQ format (quant_format=QuantFormat.QDQ)"
        )
    elif ms:
        hint_ort = (
            "; these ONNX Runtime contrib ops (com.microsoft) are not modelled: import the "
            "model as exported, before ONNX Runtime's optimizer"
        )
    else:
        hint_ort = ""
    folded = [k for k in counts if k in FOLDED_OPS]
    hint = (
        (
            f" ({', '.join(folded)} only when {'its' if len(folded) == 1 else 'their'} "
            "inputs are constants or static shapes)"
        )
        if folded
        else ""
    )
    flow = [k for k in counts if k in ("If", "Loop", "Scan")]
    if flow:
        hint += (
            f" ({', '.join(flow)}: control flow on run-time values is not modelled; an If "
            "whose condition folds to a constant is its branch, a Loop whose trip count "
            "does, at most 4,096, is unrolled)"
        )
    return f"{source}: {len(counts)} unsupported ONNX {kinds}: {listed}{hint}{hint_ort}"


def _import_prepared(
    onnx: Any,
    proto: Any,
    gname: str,
    source: str,
    batch: int | None,
    dims: Mapping[str, int],
    folded: int,
    recognise: bool,
    base_dir: Path | None = None,
    info: Mapping[str, Any] | None = None,
) -> Graph:
    proto = _infer(onnx, proto, source, strict=True)
    held = (info or {}).get("held", {})
    for t in proto.graph.initializer:  # the large weights' bytes, back in
        if t.name in held:
            t.raw_data = held[t.name]
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
    imp = _Importer(onnx, proto, gname)
    imp.base_dir = base_dir
    imp.source = source
    imp.absent |= set((info or {}).get("absent", ()))  # asked for while folding
    imp.computed.update((info or {}).get("moved", {}))  # shape-folded nodes on weights
    imp.plain = set((info or {}).get("plain", ()))
    imp.made_consts = set((info or {}).get("made", ()))
    for vi in imp.g.input:
        if vi.name in imp.inits:
            continue
        shape, elem = imp.types[vi.name]
        if not any(vi.name in n.input for n in imp.g.node):
            continue  # read only by folded nodes (e.g. through Shape)
        imp.b.input(vi.name, shape or (), imp.dtype(vi.name, elem))
    for n in imp.g.node:
        if n.op_type == "Constant":
            _constant(imp, n)
    rewrite_qdq(imp)
    _fold_candidates(imp)
    used = {i for n in imp.g.node if id(n) not in imp.skip for i in n.input}
    used |= {o.name for o in imp.g.output}
    for i, n in enumerate(imp.g.node):
        if n.op_type == "Constant" or id(n) in imp.skip:
            continue
        name = _node_name(n, i)
        if name in imp.op_names:
            name = f"{name}_{i}"
        imp.op_names.add(name)
        imp.node_index = i
        try:
            _map_node(imp, n, name)
        except WorkloadError:
            raise
        except (KeyError, IndexError, ValueError, TypeError, AttributeError, ArithmeticError) as e:
            # a node outside what the mapping expects: one line, never a traceback
            raise WorkloadError(
                f"ONNX node {name!r} ({n.op_type}): cannot be imported ({type(e).__name__}: {e})"
            ) from None
        for o in n.output[1:]:  # an optional output (LayerNormalization's mean, a
            # Dropout's mask, MaxPool's indices) that the model uses must exist
            if o and o in used and not imp.defined(o) and o not in imp.empty:
                raise WorkloadError(
                    f"ONNX node {name!r} ({n.op_type}): its output {o!r} is used, and "
                    "that output is not modelled"
                )
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    sequences = batch or dims.get("batch") or _common_batch(imp) or 1
    params = {
        "model": gname,
        "source": source,
        "opset": opset,
        "batch": batch,
        "dims": dims,
        "folded_nodes": folded,
        "dead_nodes": (info or {}).get("dead", 0),
    }
    if imp.absent:  # functional mode draws these weights at random, and warns
        params["weight_data_absent"] = ", ".join(sorted(imp.absent))
    if recognise:  # the builder checked every op; the rewrite validates the result
        graph = Graph(
            imp.b.name,
            imp.b._tensors.values(),
            imp.b._ops,
            sequences=sequences,
            params=params,
            validate=False,
        )
    else:
        graph = imp.b.graph(sequences=sequences, params=params)
    if recognise:
        from ._onnx_patterns import recognise as _recognise

        graph = _recognise(graph, imp)
    # the weights whose values the model holds, for functional mode (Graph.weight_values)
    graph.weight_values = {n: f for n, f in imp.values.items() if n in graph.tensors}
    graph.quant = quant_of(graph, imp.qparams)
    graph.declared_outputs = [o.name for o in proto.graph.output if o.name in graph.tensors]
    graph.weight_sources = _weight_sources(imp, graph, (info or {}).get("sources", {}))
    return graph


def _common_batch(imp: _Importer) -> int | None:
    """The batch of a model imported without one: the leading dim that every input
    shares, when there are inputs, each has at least two dims and they agree (an
    image batch ``[N, C, H, W]``, token ids and their mask ``[B, S]``, a torch module
    traced at ``[B, ...]``); else None (a rank-1 input, or inputs whose leading dims
    differ, say a state ``[layers, B, H]`` beside ``[B, T, I]``: one sample)."""
    shapes = [t.shape for t in imp.b._tensors.values() if t.kind == "input"]
    if not shapes or any(len(s) < 2 for s in shapes) or len({s[0] for s in shapes}) != 1:
        return None
    return shapes[0][0]


def _weight_sources(
    imp: _Importer, graph: Graph, sources: Mapping[str, tuple[str, int]]
) -> dict[str, tuple[str, int]]:
    """:attr:`Graph.weight_sources`: each weight that holds another constant's values
    (a shape-folded move of a weight, ``sources``; a constant laid out anew at
    import) -> (the model's weight, its elements). A weight that holds none of the
    model's data (:meth:`_Importer.made`, or a float constant folding computed from
    shapes and scalars: ``_onnx_fold.MADE``) -> a source of its own with no
    elements, so :attr:`Graph.parameters` (what torch's ``parameters()`` counts)
    leaves it out whatever the dims, while :attr:`Graph.weight_bytes` keeps its bytes
    (memory the run holds)."""
    found: dict[str, tuple[str, int]] = {}
    for w in graph.tensors:
        v = imp.weight_origin.get(w)
        if w in imp.made_weights or v in imp.made_consts and v not in sources:
            found[w] = (f"<constant {w}>", 0)
    for w, v in imp.weight_origin.items():
        if w in found:
            continue
        if w not in graph.tensors:
            continue
        src = sources.get(v)
        if src is None and w != v:
            src = (v, math.prod(imp.consts[v].dims))
        if src is not None and src[0] != w:
            found[w] = src
    return found


def from_onnx(
    model: str | os.PathLike[str] | Any,
    *,
    batch: int | None = None,
    dims: Mapping[str, int] | None = None,
    recognise: bool = True,
) -> Graph:
    """Import an ONNX model as a :class:`~wia_hw.graph.Graph` (shapes and dtypes only).

    ``model`` is a path to a ``.onnx`` file (its external data file may be absent) or
    an ``onnx.ModelProto`` (not modified). Symbolic input dims are fixed before ONNX
    shape inference: a dim named ``p`` takes ``dims[p]``; a still-free leading dim
    takes ``batch``. Constant and static-shape subgraphs are folded away. With
    ``recognise`` (default) attention, decomposed layer norms and Erf-written GELUs
    become ``bmm``/``softmax``/``bmm``, ``layer_norm`` and ``gelu`` ops carrying the
    FLOPs of the ops they replace. The graph's ``sequences`` (the samples one run
    processes, for throughput) is ``batch``, else ``dims["batch"]``, else the leading
    dim that every input shares when each has two or more dims (a model whose batch is
    fixed in the file, or traced by ``from_torch``), else 1; ``params`` records the
    source, opset, dims and the number of folded nodes.

    Raises :class:`~wia_hw.WorkloadError` when ``onnx`` is not installed, the file is
    missing or unreadable, an input dim stays unresolved (naming the input and dim),
    op types have no mapping (one message naming every such type with its count), a
    node's attributes are outside what is modelled (naming node and op type), or
    shapes disagree.
    """
    return import_model(model, batch=batch, dims=dims, recognise=recognise)


def import_model(
    model: str | os.PathLike[str] | Any,
    *,
    batch: int | None = None,
    dims: Mapping[str, int] | None = None,
    recognise: bool = True,
    source: str | None = None,
) -> Graph:
    """:func:`from_onnx`, with ``source`` naming the model in its messages (``from_torch``
    names the module's class, not ``<ModelProto>``)."""
    try:
        import onnx
        import onnx.shape_inference
    except ImportError:
        raise WorkloadError(_MISSING) from None
    if batch is not None:
        batch = _positive("batch", batch)
    dims = dict(dims or {})
    for k, val in dims.items():
        _positive(f"dims[{k!r}]", val)
    proto, gname, source, folded, info = _prepare(onnx, model, batch, dims, source)
    dims = info["dims"]
    bad = unsupported_ops(proto)
    if bad:
        raise WorkloadError(unsupported_message(source, bad))
    base_dir = Path(model).parent if isinstance(model, (str, os.PathLike)) else None
    return _import_prepared(
        onnx, proto, gname, source, batch, dims, folded, recognise, base_dir, info
    )


def _constant(imp: _Importer, node: Any) -> None:
    """Record a Constant node's output as a constant (a weight when an op reads it)."""
    from onnx import helper, numpy_helper

    a = node.attribute[0] if node.attribute else None
    if a is None:
        raise WorkloadError(f"ONNX node {node.name!r} (Constant) has no value")
    value = helper.get_attribute_value(a)
    if a.name == "value":
        tensor = value
    elif a.name in ("value_float", "value_floats", "value_int", "value_ints"):
        import numpy as np

        np_dtype = np.float32 if "float" in a.name else np.int64
        tensor = numpy_helper.from_array(np.asarray(value, dtype=np_dtype))
    else:
        raise WorkloadError(
            f"ONNX node {node.name!r} (Constant): attribute {a.name!r} is not supported"
        )
    tensor.name = node.output[0]
    imp.consts[node.output[0]] = tensor
