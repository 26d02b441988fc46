"""Convolution and pooling windows as ONNX writes them: rectangular kernels, strides
and dilations, asymmetric pads (Caffe-converted pools), ``auto_pad`` SAME_UPPER and
SAME_LOWER, ``ceil_mode`` and ``count_include_pad``. Each case is imported (its shape
is checked against ONNX shape inference by the importer) and its op is evaluated by
wia-hw's functional model and by ONNX's reference evaluator, on seeded random data.
Then the model zoo's own (weight-stripped) CNNs that the onnx package ships, at opset 9,
import with the MACs ONNX shape inference gives and run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from wia_hw.emulator.errors import WorkloadError
from wia_hw.emulator.functional import evaluate

import wia_hw
from wia_hw.graph import GraphBuilder
from wia_hw.workloads import from_onnx

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper, shape_inference  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

F32 = onnx.TensorProto.FLOAT

#: (op type, input [N, C, H, W], weight [O, C, kh, kw] or None, attributes)
CASES = {
    "conv_1x7_pads_0_3": ("Conv", (2, 3, 9, 11), (4, 3, 1, 7), {"pads": [0, 3, 0, 3]}),
    "conv_7x1_stride_2_1": ("Conv", (1, 2, 13, 6), (3, 2, 7, 1), {"strides": [2, 1]}),
    "conv_asym_pads_s2": (
        "Conv",
        (1, 3, 10, 9),
        (5, 3, 3, 3),
        {"pads": [0, 0, 1, 1], "strides": [2, 2]},
    ),
    "conv_dil_2_1": (
        "Conv",
        (1, 2, 12, 12),
        (2, 2, 3, 3),
        {"dilations": [2, 1], "pads": [1, 2, 3, 0]},
    ),
    "conv_same_upper_s2": (
        "Conv",
        (1, 2, 11, 10),
        (3, 2, 4, 3),
        {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    ),
    "conv_same_lower": ("Conv", (1, 2, 7, 8), (3, 2, 2, 4), {"auto_pad": "SAME_LOWER"}),
    "conv_grouped_rect": ("Conv", (1, 4, 8, 9), (4, 2, 3, 1), {"group": 2, "pads": [1, 0, 1, 0]}),
    "maxpool_caffe_pads": (
        "MaxPool",
        (1, 3, 13, 13),
        None,
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]},
    ),
    "maxpool_ceil": (
        "MaxPool",
        (2, 2, 12, 11),
        None,
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    ),
    "maxpool_rect_same": (
        "MaxPool",
        (1, 2, 9, 10),
        None,
        {"kernel_shape": [2, 3], "strides": [2, 3], "auto_pad": "SAME_UPPER"},
    ),
    "avgpool_exclude_pad": (
        "AveragePool",
        (1, 3, 9, 9),
        None,
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    ),
    "avgpool_include_pad": (
        "AveragePool",
        (1, 3, 9, 9),
        None,
        {"kernel_shape": [3, 3], "pads": [1, 0, 2, 1], "count_include_pad": 1},
    ),
    "avgpool_ceil_pads": (
        "AveragePool",
        (1, 2, 10, 10),
        None,
        {
            "kernel_shape": [3, 3],
            "strides": [2, 2],
            "pads": [1, 1, 1, 1],
            "ceil_mode": 1,
            "count_include_pad": 1,
        },
    ),
    "avgpool_ceil_exclude": (
        "AveragePool",
        (1, 2, 11, 8),
        None,
        {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [0, 1, 0, 1], "ceil_mode": 1},
    ),
}


def _model(
    op: str,
    x: tuple,
    w: tuple | None,
    attrs: dict,
    rng: np.random.Generator,
    weights: dict | None = None,
):
    """One ``op`` node ``n0`` on input ``x``: a random weight ``w`` of shape ``w``, or the
    given ``weights`` (name -> array), as initializers read in that order."""
    if w is not None:
        weights = {"w": rng.standard_normal(w).astype(np.float32)}
    weights = weights or {}
    inits = [numpy_helper.from_array(v, n) for n, v in weights.items()]
    ins = ["x", *weights]
    node = helper.make_node(op, ins, ["y"], name="n0", **attrs)
    g = helper.make_graph(
        [node],
        "case",
        [helper.make_tensor_value_info("x", F32, list(x))],
        [helper.make_tensor_value_info("y", F32, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", sorted(CASES))
def test_window_matches_onnx_reference(case):
    op, xs, ws, attrs = CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    m = _model(op, xs, ws, attrs, rng)
    x = rng.standard_normal(xs).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    g = from_onnx(m)  # the importer checks its output shape against ONNX's
    (o,) = [o for o in g.ops if o.kind in ("conv2d", "maxpool", "avgpool")]
    assert g.tensors[o.outputs[0]].shape == want.shape
    inputs = [x] + ([numpy_helper.to_array(m.graph.initializer[0])] if ws else [])
    got = evaluate(o.kind, o.attrs, inputs, want.shape, "fp32")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if ws:  # MACs: every output element, one window of C/g inputs
        cin = xs[1] // attrs.get("group", 1)
        assert g.macs() == want.size * cin * ws[2] * ws[3]


def test_symmetric_windows_keep_int_attributes():
    op, xs, ws, attrs = (
        "Conv",
        (1, 2, 8, 8),
        (3, 2, 3, 3),
        {"pads": [1, 1, 1, 1], "strides": [2, 2]},
    )
    g = from_onnx(_model(op, xs, ws, attrs, np.random.default_rng(0)))
    assert g.ops[0].attrs == {"stride": 2, "pad": 1, "dilation": 1, "groups": 1}


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"kernel": 3, "pad": [1, 2, 3]}, r"op 'p' \(maxpool\): pad \[1, 2, 3\] is not an int"),
        ({"kernel": 3, "pad": -1}, r"op 'p' \(maxpool\): pad -1 must not be negative"),
        ({"kernel": [3, 0]}, r"op 'p' \(maxpool\): kernel \[3, 0\] must be at least 1"),
        ({"kernel": 3, "stride": "2"}, r"op 'p' \(maxpool\): stride '2' is not an int or \[h, w\]"),
        (
            {"kernel": 2, "pad": [0, 0, 2, 0]},
            r"op 'p' \(maxpool\): pad \[0, 0, 2, 0\] must be smaller than the window",
        ),
    ],
)
def test_malformed_window_attributes_name_the_op(attrs, match):
    b = GraphBuilder("bad")
    x = b.input("x", (1, 1, 6, 6))
    with pytest.raises(WorkloadError, match=match):
        b.op("maxpool", "p", [x], **attrs)


def test_four_d_conv_names_the_node():
    m = _model("Conv", (1, 2, 4, 4, 4, 4), (3, 2, 1, 1, 1, 1), {}, np.random.default_rng(0))
    with pytest.raises(WorkloadError, match=r"ONNX node 'n0' \(Conv\): input \[1, 2, 4, 4, 4, 4\]"):
        from_onnx(m)


ZOO = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ZOO_MODELS = sorted(p.stem for p in ZOO.glob("light_*.onnx"))


def _zoo_macs(path: Path) -> int:
    """Conv and Gemm MACs from ONNX's own shape inference, without the importer."""
    m = shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output)
    }
    shapes.update({t.name: list(t.dims) for t in m.graph.initializer})
    macs = 0
    for n in m.graph.node:
        if n.op_type == "Conv":
            y, w = shapes[n.output[0]], shapes[n.input[1]]
            macs += int(np.prod(y)) * int(np.prod(w[1:]))
        elif n.op_type == "Gemm":
            (a,) = [x.i for x in n.attribute if x.name == "transA"] or [0]
            (b,) = [x.i for x in n.attribute if x.name == "transB"] or [0]
            sa, sb = shapes[n.input[0]], shapes[n.input[1]]
            macs += (sa[1] if a else sa[0]) * (sa[0] if a else sa[1]) * (sb[0] if b else sb[1])
    return macs


@pytest.mark.skipif(not ZOO_MODELS, reason="this onnx package ships no model zoo files")
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_model_zoo_cnns_import_at_opset_9(name):
    path = ZOO / f"{name}.onnx"
    g = from_onnx(path)
    assert g.params["opset"] == 9
    assert g.macs() == _zoo_macs(path)


@pytest.mark.skipif(not ZOO_MODELS, reason="this onnx package ships no model zoo files")
@pytest.mark.parametrize("name", ZOO_MODELS)
def test_model_zoo_cnns_run(name):
    res = wia_hw.run(from_onnx(ZOO / f"{name}.onnx"), device="wia-npu")
    assert res.latency_ms >= res.roofline_floor_ms > 0
    assert res.counters.macs == _zoo_macs(ZOO / f"{name}.onnx")


#: the zoo models small enough to run in functional mode in a test (seconds each)
ZOO_FUNCTIONAL = ["light_densenet121", "light_shufflenet", "light_squeezenet", "light_inception_v1"]


@pytest.mark.parametrize("name", [n for n in ZOO_FUNCTIONAL if n in ZOO_MODELS])
def test_model_zoo_cnns_compute_the_output_onnx_stored(name):
    """The stored output is ONNX's for the model's rebuilt (ConstantOfShape) weights
    and an input the data set does not ship: these CNNs' outputs do not depend on it
    (constant weights make every position alike), which the test checks with two."""
    g = from_onnx(ZOO / f"{name}.onnx")
    want = numpy_helper.to_array(onnx.load_tensor(str(ZOO / f"{name}_output_0.pb")))
    (inp,) = [t for t in g.tensors.values() if t.kind == "input"]
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal(inp.shape).astype(np.float32)
        y = wia_hw.run(g, mode="functional", inputs={inp.name: x}).outputs[g.declared_outputs[0]]
        assert y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


#: 1-D cases (audio front-ends, TCNs): (op type, input [N, C, L], weight or None, attributes)
CASES_1D = {
    "conv1d_pads_stride": ("Conv", (2, 3, 17), (4, 3, 5), {"pads": [2, 1], "strides": [2]}),
    "conv1d_dilated_grouped": ("Conv", (1, 4, 20), (6, 2, 3), {"dilations": [3], "group": 2}),
    "conv1d_same_upper": ("Conv", (1, 2, 9), (3, 2, 4), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    "maxpool1d_ceil": (
        "MaxPool",
        (1, 3, 10),
        None,
        {"kernel_shape": [3], "strides": [2], "ceil_mode": 1},
    ),
    "avgpool1d_pads": ("AveragePool", (2, 2, 9), None, {"kernel_shape": [4], "pads": [1, 2]}),
    "global_avgpool1d": ("GlobalAveragePool", (2, 3, 7), None, {}),
}


@pytest.mark.parametrize("case", sorted(CASES_1D))
def test_one_d_windows_match_onnx_reference(case):
    """A 1-D op imports as its 2-D op of height 1 between views: same output shape,
    same values (the views and the 2-D op evaluated in order), MACs as ONNX's."""
    op, xs, ws, attrs = CASES_1D[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    m = _model(op, xs, ws, attrs, rng)
    x = rng.standard_normal(xs).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    g = from_onnx(m)
    vals = {"x": x}
    if ws:
        vals["w"] = numpy_helper.to_array(m.graph.initializer[0])
    for o in g.ops:
        shape = g.tensors[o.outputs[0]].shape
        vals[o.outputs[0]] = evaluate(o.kind, o.attrs, [vals[i] for i in o.inputs], shape, "fp32")
    np.testing.assert_allclose(vals["y"], want, rtol=1e-5, atol=1e-5)
    if ws:
        assert g.macs() == want.size * (xs[1] // attrs.get("group", 1)) * ws[2]


def test_old_opset_softmax_flattens_from_its_axis():
    """Before opset 13, Softmax normalises over every dim from ``axis`` on (default 1);
    from 13, over ``axis`` alone (default -1)."""
    node = helper.make_node("Softmax", ["x"], ["y"], name="sm")
    g = helper.make_graph(
        [node],
        "sm",
        [helper.make_tensor_value_info("x", F32, [2, 3, 4])],
        [helper.make_tensor_value_info("y", F32, None)],
    )
    for opset in (11, 13):
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        x = np.random.default_rng(opset).standard_normal((2, 3, 4)).astype(np.float32)
        want = x.reshape(2, 12) if opset == 11 else x
        want = np.exp(want - want.max(-1, keepdims=True))  # opset 13: axis -1 by default
        want = (want / want.sum(-1, keepdims=True)).reshape(2, 3, 4)
        gr = from_onnx(m)
        vals = {"x": x}
        for o in gr.ops:
            shape = gr.tensors[o.outputs[0]].shape
            vals[o.outputs[0]] = evaluate(
                o.kind, o.attrs, [vals[i] for i in o.inputs], shape, "fp32"
            )
        np.testing.assert_allclose(vals["y"], want, rtol=1e-5)


#: ConvTranspose: (input [N, C, (H,) W], weight [C, O/g, (kh,) kw], attributes, bias)
CONVT = {
    "k2_s2": ((1, 3, 5, 4), (3, 2, 2, 2), {"strides": [2, 2]}, True),
    "k4_s2_p1_gan": ((2, 4, 4, 4), (4, 3, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, False),
    "k3_s2_outpad": (
        (1, 2, 3, 5),
        (2, 2, 3, 3),
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
        True,
    ),
    "grouped_dilated": ((1, 4, 4, 3), (4, 1, 3, 2), {"group": 2, "dilations": [2, 1]}, True),
    "same_upper": (
        (1, 2, 5, 5),
        (2, 3, 3, 3),
        {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
        False,
    ),
    "output_shape": (
        (1, 2, 4, 4),
        (2, 2, 3, 3),
        {"strides": [2, 2], "output_shape": [9, 9]},
        False,
    ),
    "one_d": ((2, 3, 7), (3, 4, 3), {"strides": [3], "pads": [1, 0]}, True),
}


@pytest.mark.parametrize("case", sorted(CONVT))
def test_conv_transpose_matches_onnx_reference(case):
    """A 1x1 conv2d into columns and a col2im overlap-add: the reference's values with
    the weight given in its column layout, the MACs of a transposed convolution."""
    xs, ws, attrs, has_bias = CONVT[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    w = rng.standard_normal(ws).astype(np.float32)
    weights = {"w": w}
    if has_bias:
        o = ws[1] * attrs.get("group", 1)
        weights["b"] = rng.standard_normal(o).astype(np.float32)
    m = _model("ConvTranspose", xs, None, attrs, rng, weights)
    inits = list(m.graph.initializer)
    x = rng.standard_normal(xs).astype(np.float32)
    grp = attrs.get("group", 1)
    if grp == 1:
        (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    else:  # onnx 1.23's reference mishandles groups: one group-1 model per group
        per = []
        for gi in range(grp):
            a1 = {k: v for k, v in attrs.items() if k != "group"}
            cg = xs[1] // grp
            wi = numpy_helper.from_array(w[gi * cg : (gi + 1) * cg], "w")
            n1 = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **a1)
            g1 = helper.make_graph(
                [n1],
                "g",
                [helper.make_tensor_value_info("x", F32, [xs[0], cg, *xs[2:]])],
                [helper.make_tensor_value_info("y", F32, None)],
                [wi],
            )
            m1 = helper.make_model(g1, opset_imports=[helper.make_opsetid("", 17)])
            per.append(ReferenceEvaluator(m1).run(None, {"x": x[:, gi * cg : (gi + 1) * cg]})[0])
        want = np.concatenate(per, axis=1)
        if has_bias:
            want = want + numpy_helper.to_array(inits[1]).reshape(1, -1, *([1] * (len(xs) - 2)))
    graph = from_onnx(m)
    assert graph.tensors["y"].shape == want.shape
    # the weight in its column layout: [g, C/g, O/g, k...] -> [O * k..., C/g, 1, 1]
    c, og, k = ws[0], ws[1], ws[2:]
    cols = w.reshape(grp, c // grp, og, *k).transpose(0, 2, *range(3, 3 + len(k)), 1)
    vals = {"x": x, "w.cols": cols.reshape(grp * og * int(np.prod(k)), c // grp, 1, 1)}
    if has_bias:
        vals["b"] = numpy_helper.to_array(inits[1])
    for o in graph.ops:
        shape = graph.tensors[o.outputs[0]].shape
        vals[o.outputs[0]] = evaluate(o.kind, o.attrs, [vals[i] for i in o.inputs], shape, "fp32")
    np.testing.assert_allclose(vals["y"], want, rtol=1e-4, atol=1e-4)
    assert graph.macs() == int(np.prod(xs)) * og * int(np.prod(k))  # N H W C (O/g) k
    assert wia_hw.run(graph, device="wia-npu").latency_ms > 0
