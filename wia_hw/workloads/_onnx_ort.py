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
  ``x * sigmoid(alpha x)``.

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
