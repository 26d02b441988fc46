"""ONNX Runtime's own kernels, written back as standard ONNX for the importer.

``onnxruntime.transformers.optimizer`` (what users run on BERT, GPT-2, LLaMA, ViT and T5
exports before deploying them) replaces decomposed subgraphs with fused kernels of its
own. Before shape inference (which does not know them), :func:`expand_ort_ops`
writes each one back as the standard ops it stands for; the importer's patterns then
recognise those as one ``layer_norm``, ``gelu`` or ``swish`` again, so the graph costs
what the fused kernel does and computes what ONNX Runtime computes:

* ``SkipLayerNormalization`` (com.microsoft): ``s = input + skip (+ bias)``, then a
  layer norm of ``s`` over the last axis (``* gamma + beta``); its fourth output, when
  read, is ``s``;
* ``SkipSimplifiedLayerNormalization`` (com.microsoft), ``SimplifiedLayerNormalization``:
  the same with an RMS norm (LLaMA's, T5's);
* ``LayerNormalization`` in a model of an opset before 17 (where it is ONNX Runtime's
  kernel, unknown to shape inference): the layer norm written out;
* ``Gelu``, ``BiasGelu`` (com.microsoft): the Erf form (after the bias);
  ``FastGelu``: the tanh form (after the optional bias); ``QuickGelu``:
  ``x * sigmoid(alpha x)``;
* ``EmbedLayerNormalization`` (com.microsoft, BERT's embeddings): the word, position
  (``0..S-1`` unless position ids are given) and segment rows gathered and summed, then
  the layer norm; its mask index output is the mask's row sums (the keys each sequence
  keeps), its embedding-sum output the sum;
* ``Attention`` (com.microsoft, packed q/k/v): the projection by the packed weight and
  bias, split into q, k and v, heads by views, ``softmax(scale q k^T + mask) v``, the
  heads merged back; the masks added as the kernel adds them (0, or
  ``mask_filter_value`` where masked): the mask index a [B] of key lengths or a [B, S]
  0/1 mask, ``unidirectional`` the causal triangle, and an attention bias. The importer's pattern then finds the attention again.

The mean, variance and inverse-deviation outputs of the norms are not modelled (a
model that reads them is refused, naming the node).

ONNX Runtime's quantised kernels (``com.microsoft``: QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearGlobalAveragePool,
QLinearAveragePool, QLinearConcat, QGemm: what its QOperator format writes for
everything but Conv and MatMul) become ``QuantizeLinear(op(DequantizeLinear(x)...))``;
:mod:`._onnx_qdq` then folds those into the op, so it reads and writes the codes.
Channels-last pools and a softmax of an opset before 13 on a non-last axis are refused.
"""

from __future__ import annotations

import math
from typing import Any

from ..emulator.errors import WorkloadError

__all__ = ["ORT_FUSIONS", "QUANTISED", "expand_ort_ops"]

#: (domain, op type) of the fused kernels written back
ORT_FUSIONS = {
    ("com.microsoft", "SkipLayerNormalization"),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"),
    ("", "SimplifiedLayerNormalization"),
    ("com.microsoft", "SimplifiedLayerNormalization"),
    ("com.microsoft", "Gelu"),
    ("com.microsoft", "BiasGelu"),
    ("com.microsoft", "FastGelu"),
    ("com.microsoft", "QuickGelu"),
    ("com.microsoft", "EmbedLayerNormalization"),
    ("com.microsoft", "Attention"),
}


#: com.microsoft quantised op -> (the float op, the (x, scale, zero point) input triples
#: by position, the (scale, zero point) of the output by position, attributes dropped)
QUANTISED = {
    "QLinearAdd": ("Add", ((0, 1, 2), (3, 4, 5)), (6, 7), ()),
    "QLinearMul": ("Mul", ((0, 1, 2), (3, 4, 5)), (6, 7), ()),
    "QLinearSigmoid": ("Sigmoid", ((0, 1, 2),), (3, 4), ()),
    "QLinearLeakyRelu": ("LeakyRelu", ((0, 1, 2),), (3, 4), ()),
    "QLinearSoftmax": ("Softmax", ((0, 1, 2),), (3, 4), ("opset",)),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", ((0, 1, 2),), (3, 4), ("channels_last",)),
    "QLinearAveragePool": ("AveragePool", ((0, 1, 2),), (3, 4), ("channels_last",)),
    "QLinearConcat": ("Concat", (), (0, 1), ()),  # its triples follow the output's pair
    "QGemm": ("Gemm", (), (), ()),  # written by _qgemm
}


class _Writer:
    """Emits the standard nodes of one fused node, with fresh names and constants."""

    def __init__(self, onnx: Any, proto: Any, node: Any, tag: str, elem: int) -> None:
        self.onnx, self.proto, self.node, self.tag, self.elem = onnx, proto, node, tag, elem
        self.opset = next(
            (o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 17
        )
        self.nodes: list[Any] = []
        self.k = 0

    def name(self, what: str) -> str:
        self.k += 1
        return f"{self.tag}/{what}_{self.k}"

    def const(self, value: float) -> str:
        import numpy as np
        from onnx import helper, numpy_helper

        n = self.name("const")
        dtype = helper.tensor_dtype_to_np_dtype(self.elem)
        self.proto.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype), n))
        return n

    def op(self, op_type: str, ins: list[str], out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, ins, [out], name=self.name(op_type), **attrs))
        return out

    def mean_last(self, x: str) -> str:
        """ReduceMean over the last axis, keeping it (axes an input from opset 18)."""
        import numpy as np
        from onnx import numpy_helper

        if self.opset >= 18:
            axes = self.name("axes")
            self.proto.graph.initializer.append(
                numpy_helper.from_array(np.array([-1], np.int64), axes)
            )
            return self.op("ReduceMean", [x, axes], keepdims=1)
        return self.op("ReduceMean", [x], axes=[-1], keepdims=1)

    def norm(self, x: str, gamma: str, beta: str, eps: float, rms: bool, out: str) -> None:
        """A layer norm (or RMS norm) of ``x`` over its last axis, as the exporters
        decompose it (so the importer's pattern finds it)."""
        d = x if rms else self.op("Sub", [x, self.mean_last(x)])
        var = self.mean_last(self.op("Pow", [d, self.const(2.0)]))
        std = self.op("Sqrt", [self.op("Add", [var, self.const(eps)])])
        y = self.op("Div", [d, std])
        if beta:
            y = self.op("Add", [self.op("Mul", [y, gamma]), beta], out)
        else:
            self.op("Mul", [y, gamma], out)

    def gelu_erf(self, x: str, out: str) -> None:
        e = self.op("Erf", [self.op("Div", [x, self.const(math.sqrt(2.0))])])
        h = self.op("Mul", [x, self.op("Add", [e, self.const(1.0)])])
        self.op("Mul", [h, self.const(0.5)], out)

    def gelu_tanh(self, x: str, out: str) -> None:
        cube = self.op("Pow", [x, self.const(3.0)])
        inner = self.op("Add", [x, self.op("Mul", [self.const(0.044715), cube])])
        t = self.op("Tanh", [self.op("Mul", [self.const(math.sqrt(2.0 / math.pi)), inner])])
        half = self.op("Mul", [self.const(0.5), x])
        self.op("Mul", [half, self.op("Add", [self.const(1.0), t])], out)


def _elem(proto: Any, names: list[str]) -> int:
    """The element type of the first of ``names`` that is an initializer (a norm's
    gamma, a bias: the model's float type), else FLOAT."""
    inits = {t.name: t.data_type for t in proto.graph.initializer}
    return next((inits[n] for n in names if n in inits), 1)


def expand_ort_ops(onnx: Any, proto: Any) -> None:
    """Write ONNX Runtime's kernels in ``proto`` (:data:`ORT_FUSIONS`, :data:`QUANTISED`)
    back as standard ONNX (module docstring), in place."""
    g = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 17)
    # before opset 17 LayerNormalization is ONNX Runtime's own (shape inference does not
    # know it): written back too
    fusions = ORT_FUSIONS | ({("", "LayerNormalization")} if opset < 17 else set())
    fusions |= {("com.microsoft", t) for t in QUANTISED}

    def key(n: Any) -> tuple[str, str]:
        return (n.domain if n.domain != "ai.onnx" else "", n.op_type)

    if not any(key(n) in fusions for n in g.node):
        return
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    out = []
    for k, n in enumerate(g.node):
        if key(n) not in fusions:
            out.append(n)
            continue
        from onnx import helper

        label = n.name or n.op_type
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        ins = list(n.input) + [""] * 5
        outs = list(n.output) + [""] * 4
        t = n.op_type
        w = _Writer(onnx, proto, n, f"{label}#{k}", _elem(proto, [i for i in ins[1:] if i]))
        if n.domain == "com.microsoft" and t in QUANTISED:
            _quantised(w, n, attrs, label)
        elif t == "EmbedLayerNormalization":
            _embed_layer_norm(w, ins, outs, attrs, read, label)
        elif t == "Attention":
            _attention(w, ins, outs, attrs, read, label)
        elif "Normalization" in t:
            if any(o and o in read for o in outs[1:3]):
                raise WorkloadError(
                    f"ONNX node {label!r} ({n.domain}::{t}): its mean/variance outputs are "
                    "read; only the normalised output (and the skip sum) is modelled"
                )
            eps = float(attrs.get("epsilon", 1e-5 if "Simplified" not in t else 1e-6))
            if attrs.get("axis", -1) != -1:
                raise WorkloadError(
                    f"ONNX node {label!r} ({t}): axis {attrs['axis']} is not modelled here "
                    "(the last axis is)"
                )
            rms = "Simplified" in t
            if t.startswith("Skip"):
                x, skip, gamma = ins[0], ins[1], ins[2]
                beta = "" if rms else ins[3]
                bias = ins[3] if rms else ins[4]
                total = outs[3] if outs[3] and outs[3] in read else None
                s = w.op("Add", [x, skip], None if bias else total)
                if bias:
                    s = w.op("Add", [s, bias], total)
            else:
                s, gamma, beta = ins[0], ins[1], ins[2] if not rms else ""
            w.norm(s, gamma, beta, eps, rms, outs[0])
        elif t in ("Gelu", "BiasGelu", "FastGelu"):
            x = ins[0]
            if ins[1]:  # the bias of BiasGelu and FastGelu
                x = w.op("Add", [x, ins[1]])
            (w.gelu_tanh if t == "FastGelu" else w.gelu_erf)(x, outs[0])
        else:  # QuickGelu: x * sigmoid(alpha x)
            alpha = float(attrs.get("alpha", 1.702))
            sig = w.op("Sigmoid", [w.op("Mul", [ins[0], w.const(alpha)])])
            w.op("Mul", [ins[0], sig], outs[0])
        out.extend(w.nodes)
    del g.node[:]
    g.node.extend(out)


def _int64(w: _Writer, values: list[int] | int) -> str:
    """An int64 initializer of ``values`` (a scalar for an int)."""
    import numpy as np
    from onnx import numpy_helper

    n = w.name("ints")
    w.proto.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), n))
    return n


def _dim(w: _Writer, x: str, axis: int) -> str:
    """Dim ``axis`` of ``x`` as an int64 scalar (folds once the input dims are fixed)."""
    return w.op("Gather", [w.op("Shape", [x]), _int64(w, axis)], axis=0)


def _positions(w: _Writer, x: str) -> str:
    """``0 .. S-1`` for the dim 1 of ``x``, an int64 [S]."""
    return w.op("Range", [_int64(w, 0), _dim(w, x, 1), _int64(w, 1)])


def _unsqueeze(w: _Writer, x: str, axes: list[int]) -> str:
    if w.opset >= 13:
        return w.op("Unsqueeze", [x, _int64(w, axes)])
    return w.op("Unsqueeze", [x], axes=axes)


def _embed_layer_norm(
    w: _Writer, ins: list[str], outs: list[str], attrs: dict[str, Any], read: set[str], label: str
) -> None:
    """BERT's embeddings, ONNX Runtime's fused kernel, as standard ops."""
    from onnx import TensorProto

    ids, seg, word, pos, seg_table, gamma, beta, mask = ins[:8]
    position_ids = ins[8] if len(ins) > 8 else ""
    x = w.op("Gather", [word, ids], axis=0)
    if not position_ids:  # 0..S-1, one row per position, broadcast over the batch
        position_ids = _positions(w, ids)
    x = w.op("Add", [x, w.op("Gather", [pos, position_ids], axis=0)])
    if seg and seg_table:
        x = w.op("Add", [x, w.op("Gather", [seg_table, seg], axis=0)])
    total = outs[2] if len(outs) > 2 and outs[2] and outs[2] in read else None
    if total:
        x = w.op("Identity", [x], total)
    w.norm(x, gamma, beta, float(attrs.get("epsilon", 1e-12)), False, outs[0])
    if outs[1] and outs[1] in read:
        if not mask:
            raise WorkloadError(
                f"ONNX node {label!r} (com.microsoft::EmbedLayerNormalization): its mask "
                "index is read but the node has no mask"
            )
        if attrs.get("mask_index_type", 1) != 1:
            raise WorkloadError(
                f"ONNX node {label!r} (com.microsoft::EmbedLayerNormalization): "
                f"mask_index_type {attrs['mask_index_type']} is not modelled (1, key lengths, is)"
            )
        m = w.op("Cast", [mask], to=TensorProto.INT32)
        if w.opset >= 13:
            w.op("ReduceSum", [m, _int64(w, [1])], outs[1], keepdims=0)
        else:
            w.op("ReduceSum", [m], outs[1], keepdims=0, axes=[1])


def _attention(
    w: _Writer, ins: list[str], outs: list[str], attrs: dict[str, Any], read: set[str], label: str
) -> None:
    """ONNX Runtime's fused Attention, as the eager attention the exporters write."""
    from onnx import TensorProto

    x, weight, bias, mask = ins[:4]
    past = ins[4]
    extra = ins[5:8]
    where = f"ONNX node {label!r} (com.microsoft::Attention)"
    if past or any(o and o in read for o in outs[1:]):
        raise WorkloadError(f"{where}: a KV cache (past, present) is not modelled here")
    if any(extra[1:]) or attrs.get("do_rotary") or attrs.get("past_present_share_buffer"):
        raise WorkloadError(
            f"{where}: past_sequence_length, rotary or a shared buffer is not modelled"
        )
    inits = {t.name: t for t in w.proto.graph.initializer}
    if weight not in inits:
        raise WorkloadError(f"{where}: its packed weight must be a constant")
    hidden_in, packed = (int(d) for d in inits[weight].dims)
    sizes = [int(v) for v in attrs.get("qkv_hidden_sizes", [])] or [packed // 3] * 3
    heads = int(attrs["num_heads"])
    if sum(sizes) != packed or sizes[0] != sizes[1] or any(v % heads for v in sizes):
        raise WorkloadError(
            f"{where}: qkv_hidden_sizes {sizes} do not fit {packed} and {heads} heads"
        )
    hd, vd = sizes[0] // heads, sizes[2] // heads
    qkv = w.op("MatMul", [x, weight])
    if bias:
        qkv = w.op("Add", [qkv, bias])
    q, k, v = w.name("q"), w.name("k"), w.name("v")
    split = _int64(w, sizes)
    if w.opset >= 13:
        w.nodes.append(
            w.onnx.helper.make_node("Split", [qkv, split], [q, k, v], axis=-1, name=w.name("Split"))
        )
    else:
        w.nodes.append(
            w.onnx.helper.make_node(
                "Split", [qkv], [q, k, v], axis=-1, split=sizes, name=w.name("Split")
            )
        )

    def heads_of(t: str, d: int, perm: list[int]) -> str:
        return w.op("Transpose", [w.op("Reshape", [t, _int64(w, [0, 0, heads, d])])], perm=perm)

    qh = heads_of(q, hd, [0, 2, 1, 3])
    kt = heads_of(k, hd, [0, 2, 3, 1])
    vh = heads_of(v, vd, [0, 2, 1, 3])
    scale = float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(hd)
    scores = w.op("Mul", [w.op("MatMul", [qh, kt]), w.const(scale)])
    fill = float(attrs.get("mask_filter_value", -10000.0))
    if mask:  # key lengths [B], or a [B, S] mask of 0s and 1s
        shape = None
        for vi in [*w.proto.graph.input, *w.proto.graph.value_info]:
            if vi.name == mask:
                shape = len(vi.type.tensor_type.shape.dim)
        if shape == 2:
            keep = w.op("Cast", [mask], to=TensorProto.BOOL)
        elif shape in (1, None):  # a [B] of lengths (what EmbedLayerNormalization gives)
            lengths = _unsqueeze(w, w.op("Cast", [mask], to=TensorProto.INT64), [1])
            keep = w.op("Less", [_unsqueeze(w, _positions(w, x), [0]), lengths])
        else:
            raise WorkloadError(
                f"{where}: a mask index of rank {shape} is not modelled ([B] or [B, S] is)"
            )
        add = w.op("Where", [keep, w.const(0.0), w.const(fill)])
        scores = w.op("Add", [scores, _unsqueeze(w, add, [1, 2])])
    if extra[0]:  # attention_bias / relative position bias [B or 1, N, S, S]
        scores = w.op("Add", [scores, extra[0]])
    if attrs.get("unidirectional"):  # key j <= query i
        pos = _positions(w, x)
        tril = w.op("LessOrEqual", [_unsqueeze(w, pos, [0]), _unsqueeze(w, pos, [1])])
        # added, as the kernel adds its masks (0 or mask_filter_value) to the scores
        scores = w.op("Add", [scores, w.op("Where", [tril, w.const(0.0), w.const(fill)])])
    probs = w.op("Softmax", [scores], axis=-1)
    ctx = w.op("Transpose", [w.op("MatMul", [probs, vh])], perm=[0, 2, 1, 3])
    w.op("Reshape", [ctx, _int64(w, [0, 0, sizes[2]])], outs[0])


def _quantised(w: _Writer, n: Any, attrs: dict[str, Any], label: str) -> None:
    """One of ONNX Runtime's quantised kernels as ``QuantizeLinear(op(DequantizeLinear
    (x)...))``; QGemm's bias dequantised with ``a_scale * b_scale``."""
    t = n.op_type
    ins = list(n.input) + [""] * 9
    if attrs.get("channels_last"):
        raise WorkloadError(
            f"ONNX node {label!r} (com.microsoft::{t}): channels_last is not modelled"
        )
    if t == "QLinearSoftmax" and attrs.get("opset", 13) < 13 and attrs.get("axis", -1) != -1:
        raise WorkloadError(
            f"ONNX node {label!r} (com.microsoft::{t}): a softmax of opset "
            f"{attrs['opset']} over axis {attrs['axis']} is not modelled"
        )

    def dq(x: str, s: str, z: str, **axis: Any) -> str:
        return w.op("DequantizeLinear", [x, s] + ([z] if z else []), **axis)

    def q(y: str, s: str, z: str) -> None:
        w.op("QuantizeLinear", [y, s] + ([z] if z else []), n.output[0])

    if t == "QGemm":  # A, a_scale, a_zp, B, b_scale, b_zp, C, y_scale, y_zp
        a, as_, az, b, bs, bz, c, ys, yz = ins[:9]
        floats = [dq(a, as_, az), dq(b, bs, bz, axis=0 if attrs.get("transB", 0) else 1)]
        if c:  # int32, in the accumulator's units
            floats.append(dq(c, w.op("Mul", [as_, bs]), "", axis=0))
        gemm = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
        if ys:
            q(w.op("Gemm", floats, **gemm), ys, yz)
        else:  # a float output
            w.op("Gemm", floats, n.output[0], **gemm)
        return
    float_op, triples, (ys, yz), drop = QUANTISED[t]
    if t == "QLinearConcat":  # y_scale, y_zp, then (x, x_scale, x_zp) per input
        triples = tuple((i, i + 1, i + 2) for i in range(2, len(n.input), 3))
    floats = [dq(ins[x], ins[s], ins[z]) for x, s, z in triples if ins[x]]
    kept = {a: v for a, v in attrs.items() if a not in drop}
    q(w.op(float_op, floats, **kept), ins[ys], ins[yz])
