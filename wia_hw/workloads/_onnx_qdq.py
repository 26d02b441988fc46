"""Quantised ONNX models for the importer: QDQ (QuantizeLinear/DequantizeLinear, what
ONNX Runtime's ``quantize_static`` and QAT exports write), QLinearConv/QLinearMatMul
(the QOperator format), MatMulInteger/ConvInteger with constant zero points, and
DynamicQuantizeLinear as ``quantize_dynamic`` writes it.

Integer tensors stay integer in the imported graph, with their static
:class:`~wia_hw.graph.QuantParams` in ``Graph.quant``, so timing sees one-byte
operands and an int8 array pass, and functional mode computes on the codes. Run on
the strictly shape-inferred model before the nodes are mapped, :func:`rewrite` changes
the ONNX graph so that the mapping sees plain ops on integer values:

* a **DequantizeLinear of a constant** (a weight or bias) goes away: its readers read
  the integer constant, whose parameters are recorded (the folder leaves such nodes
  for this when every reader is a GEMM weight or bias, or a Gather table:
  :func:`keeps_integer`; any other reader gets the dequantised float constant);
* a **QuantizeLinear** whose input only it reads, written by a compute op
  (:data:`FUSE_INTO`), goes away: that op writes the codes itself (a real int8 kernel
  requantises in its epilogue); any other QuantizeLinear is a ``cast`` to int8;
* a data-movement op (:data:`PASS_THROUGH`: Reshape, Transpose, MaxPool, Concat ...)
  between a DequantizeLinear and QuantizeLinears of the same parameters moves the
  codes themselves (``Q(move(DQ(c))) == move(c)``);
* a **DequantizeLinear of an activation** goes away where a compute op reads it (the op
  dequantises on input); before any other reader, or as a graph output, it is a
  ``cast`` to float;
* **QLinearConv** and **QLinearMatMul** become Conv and MatMul on the codes, with the
  parameters of their inputs, weight, bias (scale ``x_scale * w_scale``) and output;
  **MatMulInteger** and **ConvInteger** the same with scale 1 and an int32 output;
* a **DynamicQuantizeLinear** stays (a ``cast`` that computes its codes' scale and
  zero point at run time); the ``MatMulInteger``/``ConvInteger -> Cast -> Mul`` by
  the scales after it becomes one MatMul/Conv on the codes (:meth:`_Rewrite.dynamic`).

Refused, one line each naming the node: a scale or zero point computed at run time
otherwise (or a graph input), a DynamicQuantizeLinear read other than by that chain,
blocked quantisation (``block_size``), element types other than int8, uint8 and
int32 (int16, int4, float8), and a DequantizeLinear reading codes written with other
parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..emulator.errors import WorkloadError
from ..graph import MOVE_KINDS, QuantParams

__all__ = ["QDQ_OPS", "keeps_integer", "quant_of", "readers_of", "rewrite", "transformed"]

QDQ_OPS = (
    "DynamicQuantizeLinear",
    "QuantizeLinear",
    "DequantizeLinear",
    "QLinearConv",
    "QLinearMatMul",
    "MatMulInteger",
    "ConvInteger",
)
#: (op type, input index) of the readers that take an integer constant as it is: the
#: weight and bias of a GEMM, the table of a Gather.
INTEGER_SLOTS = {("MatMul", 1), ("Gemm", 1), ("Gemm", 2), ("Conv", 1), ("Conv", 2), ("Gather", 0)}
#: Ops that move values without arithmetic: on codes they give the same codes.
PASS_THROUGH = (
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Identity",
    "Slice",
    "MaxPool",
    "Concat",
    "Gather",
)
#: Ops that map to one wia-hw op, which can write a QuantizeLinear's codes itself.
FUSE_INTO = (
    "Conv",
    "MatMul",
    "Gemm",
    "Add",
    "Sub",
    "Mul",
    "Relu",
    "Clip",
    "LeakyRelu",
    "Sigmoid",
    "Tanh",
    "HardSigmoid",
    "HardSwish",
    "AveragePool",
    "GlobalAveragePool",
    "Softmax",
    "Gelu",
)
#: Code range of each element type (ONNX TensorProto numbers: UINT8 2, INT8 3, INT32 6).
_RANGES = {2: (0, 255), 3: (-128, 127), 6: (-(2**31), 2**31 - 1)}


def keeps_integer(dq: Any, readers: dict[str, list[tuple[Any, int]]]) -> bool:
    """Whether constant folding leaves DequantizeLinear ``dq`` (its input a constant)
    for :func:`rewrite`: every reader, through Identity nodes (an exporter's shared
    initializers), takes the integer constant as it is."""
    todo, seen = [dq.output[0]], set()
    while todo:
        value = todo.pop()
        rs = readers.get(value, [])
        if not rs:
            return False
        for n, i in rs:
            if n.op_type == "Identity" and n.output[0] not in seen:
                seen.add(n.output[0])
                todo.append(n.output[0])
            elif (n.op_type, i) not in INTEGER_SLOTS:
                return False
    return True


def _attr(node: Any, key: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == key:
            return helper.get_attribute_value(a)
    return default


def transformed(p: QuantParams, dims: tuple[int, ...], make: Callable[[Any], Any]) -> QuantParams:
    """``p`` for the constant ``make(x)`` where ``x`` (of ``dims``) had ``p``: the
    parameters broadcast to ``dims``, put through ``make``, and every axis along which
    they do not vary cut to size 1."""
    import numpy as np

    if np.ndim(p.scale) == 0 and np.ndim(p.zero_point) == 0:
        return p

    def move(a: Any) -> Any:
        full = np.asarray(make(np.broadcast_to(a, dims).copy()))
        for ax in range(full.ndim):
            first = np.take(full, [0], axis=ax)
            if np.all(full == first):
                full = first
        return full

    return QuantParams(move(p.scale), move(p.zero_point), p.lo, p.hi)


class _Rewrite:
    def __init__(self, imp: Any) -> None:
        self.imp = imp
        self.g = imp.g
        self.outputs = {o.name for o in self.g.output}
        self.params: dict[str, QuantParams] = imp.qparams
        self.dropped: list[Any] = imp.dropped

    def drop(self, node: Any) -> None:
        """Leave ``node`` out of the mapping (``imp.skip`` holds ids: the wrapper is
        kept alive here so that its id is not reused)."""
        self.imp.skip.add(id(node))
        self.dropped.append(node)

    # -- parameters --------------------------------------------------------------------
    def fail(self, node: Any, why: str) -> WorkloadError:
        return WorkloadError(f"ONNX node {node.name or node.op_type!r} ({node.op_type}): {why}")

    def const(self, node: Any, value: str, what: str) -> Any:
        import numpy as np

        if value not in self.imp.consts:
            if any(vi.name == value for vi in self.g.input):
                raise self.fail(
                    node, f"its {what} {value!r} is a graph input (it must be a constant)"
                )
            raise self.fail(
                node,
                f"its {what} {value!r} is computed at run time (dynamic quantisation, "
                "e.g. DynamicQuantizeLinear's, is not modelled)",
            )
        arr = self.imp.const_values(value)
        if arr is None:
            raise self.fail(node, f"its {what} {value!r} has no values in the model")
        return np.asarray(arr)

    def elem(self, value: str) -> int:
        if value in self.imp.consts:
            return self.imp.consts[value].data_type
        return self.imp.types.get(value, (None, 0))[1]

    def rank(self, value: str) -> int:
        return len(self.imp.shape(value))

    def make(
        self,
        node: Any,
        codes: str,
        scale: Any,
        zero: Any,
        axis: int | None,
        elem: int | None = None,
    ) -> QuantParams:
        """Parameters of ``codes`` (element type ``elem``, default its own) from a
        scale and zero point (numpy arrays; ``axis`` for per-axis ones)."""
        import numpy as np

        elem = self.elem(codes) if elem is None else elem
        if elem not in _RANGES:
            name = self.imp.onnx.TensorProto.DataType.Name(elem) if elem else "unknown"
            raise self.fail(
                node, f"{name} codes are not modelled (int8, uint8 and int32 are supported)"
            )
        lo, hi = _RANGES[elem]
        scale = np.asarray(scale, dtype=np.float32)
        zero = np.zeros((), np.int64) if zero is None else np.asarray(zero, dtype=np.int64)
        if scale.size == 1 and zero.size == 1:
            return QuantParams(scale.reshape(()), zero.reshape(()), lo, hi)
        rank = self.rank(codes)
        ax = axis + rank if axis is not None and axis < 0 else axis
        if ax is None or not 0 <= ax < rank or scale.ndim > 1:
            raise self.fail(node, f"scale of shape {list(scale.shape)} needs an axis")
        shape = (-1,) + (1,) * (rank - ax - 1)
        n = max(scale.size, zero.size)
        dim = self.imp.shape(codes)[ax]
        if n != dim:
            raise self.fail(node, f"{n} scales for axis {ax} of {codes!r}, which has {dim}")
        if zero.ndim > 1 or scale.size not in (1, n) or zero.size not in (1, n):
            raise self.fail(
                node, f"scale {list(scale.shape)} and zero point {list(zero.shape)} disagree"
            )
        scale = np.broadcast_to(scale.reshape(-1), (n,))
        zero = np.broadcast_to(zero.reshape(-1), (n,))
        return QuantParams(scale.reshape(shape).copy(), zero.reshape(shape).copy(), lo, hi)

    def of_node(self, node: Any, codes: str) -> QuantParams:
        """A QuantizeLinear's or DequantizeLinear's parameters (inputs 1, 2; axis)."""
        if _attr(node, "block_size", 0):
            raise self.fail(node, "blocked quantisation (block_size) is not modelled")
        ins = list(node.input)
        scale = self.const(node, ins[1], "scale")
        zero = self.const(node, ins[2], "zero point") if len(ins) > 2 and ins[2] else None
        elem = None
        if node.op_type == "QuantizeLinear":
            zp_elem = self.elem(ins[2]) if zero is not None else 0
            elem = zp_elem or _attr(node, "output_dtype", 0) or 2  # uint8 by default
        return self.make(node, codes, scale, zero, _attr(node, "axis", 1), elem)

    def record(self, node: Any, value: str, p: QuantParams) -> None:
        have = self.params.get(value)
        if have is not None and not have.same(p):
            raise self.fail(
                node,
                f"reads codes {value!r} written with other quantisation parameters",
            )
        self.params[value] = p

    def claim(self, node: Any, value: str, p: QuantParams) -> str:
        """The name under which ``value``'s codes mean ``p``: ``value`` itself, or, for
        an integer constant already read with other parameters, an alias of it."""
        have = self.params.get(value)
        if have is None or have.same(p) or value not in self.imp.consts:
            self.record(node, value, p)
            return value
        k = 1
        while f"{value}.q{k}" in self.imp.consts and not self.params[f"{value}.q{k}"].same(p):
            k += 1
        alias = f"{value}.q{k}"
        self.imp.consts[alias] = self.imp.consts[value]
        self.params[alias] = p
        return alias

    def weight_codes(self, q: Any, p: QuantParams) -> None:
        """QuantizeLinear ``q`` of a float weight too large to fold: its output becomes
        an integer constant of the weight's dims, whose codes the import computes
        from the weight when functional mode asks."""
        import numpy as np

        src, out = q.input[0], q.output[0]
        t = self.imp.onnx.TensorProto()
        t.name = out
        t.data_type = 2 if (p.lo, p.hi) == (0, 255) else 3
        t.dims.extend(self.imp.consts[src].dims)
        t.data_location = self.imp.onnx.TensorProto.EXTERNAL
        e = t.external_data.add()
        e.key, e.value = "location", "<quantised at import>"
        self.imp.consts[out] = t
        dtype = np.uint8 if t.data_type == 2 else np.int8

        if self.imp.has_value(src):
            self.imp.computed[out] = lambda: p.quantise(self.imp.weight_array(src)).astype(dtype)
        self.drop(q)

    # -- the QOperator ops ---------------------------------------------------------------
    def qlinear(self, node: Any) -> None:
        """QLinearConv / QLinearMatMul / ConvInteger / MatMulInteger -> Conv / MatMul on
        the codes, their parameters recorded."""
        import numpy as np

        ins = list(node.input) + [""] * 9
        t = node.op_type
        if t in ("QLinearConv", "QLinearMatMul"):
            x, xs, xz, w, ws, wz, ys, yz = ins[:8]
            one = None
        else:
            x, w, xz, wz = ins[:4]
            one = np.ones((), np.float32)
        get = self.const
        sx = one if one is not None else get(node, xs, "x scale")
        sw = one if one is not None else get(node, ws, "w scale")
        zx = get(node, xz, "x zero point") if xz else None
        zw = get(node, wz, "w zero point") if wz else None
        w_axis = 0 if "Conv" in t else self.rank(w) - 1
        self.record(node, x, self.make(node, x, sx, zx, 1 if "Conv" in t else 0))
        w = self.claim(node, w, self.make(node, w, sw, zw, w_axis))
        out = node.output[0]
        if one is None:
            self.record(
                node,
                out,
                self.make(
                    node,
                    out,
                    get(node, ys, "y scale"),
                    get(node, yz, "y zero point") if yz else None,
                    None,
                ),
            )
        else:
            self.record(node, out, self.make(node, out, one, None, None))
        new_ins = [x, w]
        if t == "QLinearConv" and len(node.input) > 8 and node.input[8]:
            b = node.input[8]
            b = self.claim(node, b, self.make(node, b, np.asarray(sx * sw).reshape(-1), None, 0))
            new_ins.append(b)
        node.op_type = "Conv" if "Conv" in t else "MatMul"
        del node.input[:]
        node.input.extend(new_ins)

    # -- dynamic quantisation --------------------------------------------------------
    def dynamic(self, d: Any, readers: dict[str, list[tuple[Any, int]]]) -> None:
        """DynamicQuantizeLinear ``d`` and what ONNX Runtime's ``quantize_dynamic`` writes
        after it: ``MatMulInteger``/``ConvInteger(y, W, y_zero_point, w_zero_point) ->
        Cast(float) -> Mul(., Mul(y_scale, w_scale))``. Each such chain becomes one
        MatMul/Conv on the codes ``y`` (whose scale and zero point functional mode
        computes at run time) and ``W`` (static parameters), writing the Mul's output;
        ``d`` stays, as a ``cast`` to codes."""
        y, ys, yz = (list(d.output) + ["", ""])[:3]
        if {y, ys, yz} & self.outputs:
            raise self.fail(d, "its outputs as graph outputs are not modelled")

        def only(value: str, op_type: str) -> Any:
            rs = readers.get(value, [])
            if len(rs) != 1 or rs[0][0].op_type != op_type or value in self.outputs:
                raise self.fail(
                    d,
                    f"{value!r} must be read by one {op_type} alone: only ONNX Runtime's "
                    "MatMulInteger/ConvInteger -> Cast -> Mul chain is modelled after "
                    "dynamic quantisation",
                )
            return rs[0][0]

        for m, i in readers.get(y, []):
            if m.op_type not in ("MatMulInteger", "ConvInteger") or i != 0:
                raise self.fail(
                    d,
                    f"its codes are read by {m.op_type}: only MatMulInteger and ConvInteger are modelled",
                )
            ins = list(m.input) + ["", "", ""]
            if ins[2] != yz:
                raise self.fail(m, "its A zero point must be the DynamicQuantizeLinear's")
            cast = only(m.output[0], "Cast")
            mul = only(cast.output[0], "Mul")
            s_name = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
            s_node = next((n for n, _ in readers.get(ys, []) if s_name in n.output), None)
            if s_node is None or s_node.op_type != "Mul":
                raise self.fail(mul, "its scale must be Mul(y_scale, w_scale)")
            ws = s_node.input[1] if s_node.input[0] == ys else s_node.input[0]
            w = ins[1]
            scale = self.const(m, ws, "weight scale")
            zero = self.const(m, ins[3], "weight zero point") if ins[3] else None
            axis = 0 if m.op_type == "ConvInteger" else self.rank(w) - 1
            w = self.claim(m, w, self.make(m, w, scale, zero, axis))
            m.op_type = "Conv" if m.op_type == "ConvInteger" else "MatMul"
            del m.input[:]
            m.input.extend([y, w])
            m.output[0] = mul.output[0]
            for n in (cast, mul, s_node):
                self.drop(n)

    # -- the graph ---------------------------------------------------------------------
    def run(self) -> None:
        g, imp = self.g, self.imp
        readers = readers_of(g.node, imp.skip)
        for n in g.node:
            if n.op_type == "DynamicQuantizeLinear":
                self.dynamic(n, readers)
        for n in g.node:
            if n.op_type in ("QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger"):
                self.qlinear(n)
        readers = readers_of(g.node, imp.skip)
        quants = {
            n.output[0]: self.of_node(n, n.output[0])
            for n in g.node
            if n.op_type == "QuantizeLinear"
        }
        self.params.update(quants)
        for n in g.node:  # a float weight quantised in the model (a QAT export)
            if n.op_type == "QuantizeLinear" and n.input[0] in imp.consts:
                self.weight_codes(n, quants[n.output[0]])
        # Identity of a dequantised constant (an exporter's shared initializer): its
        # readers read the DequantizeLinear's output itself
        dq_outs = {n.output[0] for n in g.node if n.op_type == "DequantizeLinear"}
        for n in g.node:
            if (
                n.op_type == "Identity"
                and n.input[0] in dq_outs
                and n.output[0] not in self.outputs
            ):
                for r, i in readers.get(n.output[0], []):
                    r.input[i] = n.input[0]
                    readers.setdefault(n.input[0], []).append((r, i))
                dq_outs.add(n.output[0])
                self.drop(n)
        dq: dict[str, tuple[Any, QuantParams]] = {}  # DQ output -> (node, its params)
        for n in g.node:
            if n.op_type == "DequantizeLinear":
                dq[n.output[0]] = (n, self.of_node(n, n.input[0]))

        # 1. moves between a DequantizeLinear and QuantizeLinears of the same parameters
        for m in g.node:
            if m.op_type not in PASS_THROUGH or len(m.output) != 1 or m.output[0] in self.outputs:
                continue
            data = [i for i, v in enumerate(m.input) if v and (m.op_type != "Gather" or i == 0)]
            data = data if m.op_type == "Concat" else data[:1]
            src = [dq.get(m.input[i]) for i in data]
            if not src or any(s is None for s in src):
                continue
            p = src[0][1]
            if any(not s[1].same(p) for s in src):
                continue
            qs = readers.get(m.output[0], [])
            if not qs or any(
                q.op_type != "QuantizeLinear" or not quants[q.output[0]].same(p) for q, _ in qs
            ):
                continue
            if any(q.output[0] in self.outputs for q, _ in qs[1:]):
                continue
            keep = qs[0][0].output[0]
            for i, s in zip(data, src, strict=True):
                m.input[i] = s[0].input[0]
                self.record(m, s[0].input[0], p)
            for q, _ in qs:
                self.drop(q)
                for r, j in readers.get(q.output[0], []):
                    r.input[j] = keep
            m.output[0] = keep
        # 2. DequantizeLinear: readers that compute read the codes
        readers = readers_of(g.node, imp.skip)
        for out, (n, p) in dq.items():
            codes = n.input[0] = self.claim(n, n.input[0], p)
            rest = []
            for r, i in readers.get(out, []):
                if r.op_type in PASS_THROUGH and codes not in imp.consts:
                    rest.append((r, i))  # a move of an activation's values: a cast first
                else:
                    r.input[i] = codes
            if not rest and out not in self.outputs:
                self.drop(n)
        # 3. QuantizeLinear fused into the compute op that writes its only input
        readers = readers_of(g.node, imp.skip)
        producer = {o: n for n in g.node if id(n) not in imp.skip for o in n.output}
        for q in g.node:
            if q.op_type != "QuantizeLinear" or id(q) in imp.skip:
                continue
            x = q.input[0]
            p = producer.get(x)
            if (
                p is None
                or p.op_type not in FUSE_INTO
                or len(p.output) != 1
                or x in self.outputs
                or len(readers.get(x, [])) != 1
                or not _fusable(p, imp)
            ):
                continue
            p.output[0] = q.output[0]
            self.drop(q)


def readers_of(nodes: Any, skip: set[int] = frozenset()) -> dict[str, list[tuple[Any, int]]]:
    """value -> the (node, input index) pairs that read it, left-out nodes not counted."""
    out: dict[str, list[tuple[Any, int]]] = {}
    for n in nodes:
        if id(n) not in skip:
            for i, v in enumerate(n.input):
                if v:
                    out.setdefault(v, []).append((n, i))
    return out


def _fusable(node: Any, imp: Any) -> bool:
    """Whether ``node`` maps to one op writing its output (so that op can write codes):
    a Gemm without alpha or beta; a 2-D Conv or pool (1-D ones map through views)."""
    if node.op_type == "Gemm":
        return _attr(node, "alpha", 1.0) == 1.0 and _attr(node, "beta", 1.0) == 1.0
    if node.op_type in ("Conv", "AveragePool"):
        return len(imp.shape(node.input[0])) == 4
    return True


def rewrite(imp: Any) -> None:
    """Rewrite ``imp``'s ONNX graph as the module docstring says; the parameters of
    every integer value go to ``imp.qparams`` and the nodes made redundant to
    ``imp.skip``. A model without quantisation ops is left as it is."""
    if any(n.op_type in QDQ_OPS for n in imp.g.node):
        _Rewrite(imp).run()


def quant_of(graph: Any, params: dict[str, QuantParams]) -> dict[str, QuantParams]:
    """``Graph.quant`` for an imported graph: the recorded parameters of its tensors,
    and, through data movement (which keeps codes), those of the integer tensors the
    mapping put between (a view before or after an op that writes codes)."""
    quant = {n: p for n, p in params.items() if n in graph.tensors}
    if not quant:
        return quant
    moves = [
        (op.inputs[0], op.outputs[0])
        for op in graph.ops
        if op.kind in MOVE_KINDS
        and graph.tensors[op.inputs[0]].dtype in ("int8", "int32")
        and graph.tensors[op.outputs[0]].dtype == graph.tensors[op.inputs[0]].dtype
    ]
    for x, y in moves:  # forward along chains of moves (ops are in execution order)
        if x in quant and y not in quant:
            quant[y] = quant[x]
    for x, y in reversed(moves):  # and back to the activations before them
        if y in quant and x not in quant and graph.tensors[x].kind == "activation":
            quant[x] = quant[y]
    return quant
