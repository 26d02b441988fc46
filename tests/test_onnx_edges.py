"""ONNX as older exporters and opsets write it, and edge shapes real graphs contain:
Slice with attributes (opset < 10), PRelu with one slope per channel (opset < 7), a
Split with a zero-length piece that a Concat drops (rotary embedding over the whole
head), and scalar (rank-0) elementwise results (a loss's mean)."""

from __future__ import annotations

import numpy as np
import pytest
from wia_hw.emulator.errors import WorkloadError
from wia_hw.emulator.functional import evaluate

import wia_hw
from wia_hw.workloads import from_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

F32 = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs, opset, inits=()):
    g = helper.make_graph(
        nodes,
        "edge",
        [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F32, None) for n in outputs],
        list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _values(g, feeds):
    """Every tensor of ``g`` by wia-hw's functional model, op by op."""
    vals = dict(feeds)
    for o in g.ops:
        shape = g.tensors[o.outputs[0]].shape
        vals[o.outputs[0]] = evaluate(o.kind, o.attrs, [vals[i] for i in o.inputs], shape, "fp32")
    return vals


def test_slice_attributes_before_opset_10():
    node = helper.make_node("Slice", ["x"], ["y"], name="s", starts=[1], ends=[-1], axes=[1])
    m = _model([node], [("x", [2, 7, 3])], ["y"], opset=9)
    x = np.random.default_rng(0).standard_normal((2, 7, 3)).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    g = from_onnx(m)
    assert [o.kind for o in g.ops] == ["slice"]
    np.testing.assert_array_equal(_values(g, {"x": x})["y"], want)


def test_prelu_before_opset_7_has_one_slope_per_channel():
    rng = np.random.default_rng(1)
    slope = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "a")
    node = helper.make_node("PRelu", ["x", "a"], ["y"], name="p")
    m = _model([node], [("x", [2, 3, 4, 5])], ["y"], opset=6, inits=[slope])
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g = from_onnx(m)
    got = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    want = np.where(x > 0, x, x * numpy_helper.to_array(slope).reshape(3, 1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _rotary_like(second):
    """Split x [2, 4, 8] on the last axis into [8, 0]; rotate the first; concat back."""
    sizes = numpy_helper.from_array(np.array([8, 0], np.int64), "sizes")
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b"], name="split", axis=-1),
        helper.make_node("Neg", ["a"], ["na"], name="neg"),
        helper.make_node("Concat", ["na", "b"], ["y"], name="cat", axis=-1)
        if second == "concat"
        else helper.make_node("Relu", ["b"], ["y"], name="reads_empty"),
    ]
    return _model(nodes, [("x", [2, 4, 8])], ["y"], opset=18, inits=[sizes])


def test_split_with_an_empty_piece_that_a_concat_drops():
    m = _rotary_like("concat")
    x = np.random.default_rng(2).standard_normal((2, 4, 8)).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    g = from_onnx(m)
    np.testing.assert_array_equal(_values(g, {"x": x})["y"], want)
    assert wia_hw.run(g, device="wia-npu").latency_ms > 0


def test_an_op_that_reads_an_empty_piece_is_named():
    with pytest.raises(
        WorkloadError, match=r"ONNX node 'reads_empty': input 'b' is an empty tensor"
    ):
        from_onnx(_rotary_like("relu"))


def test_scalar_elementwise_results_run():
    """A loss's mean: ReduceMean to a scalar, then a scalar Div (rank-0 tensors)."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], name="mean", keepdims=0),
        helper.make_node("Div", ["m", "two"], ["y"], name="half"),
    ]
    m = _model(nodes, [("x", [4, 6])], ["y"], opset=13, inits=[two])
    g = from_onnx(m)
    assert g.tensors["y"].shape == ()
    res = wia_hw.run(g, device="wia-npu")
    assert res.latency_ms > 0 and res.flops == g.flops()


BOOL = onnx.TensorProto.BOOL
#: (op type, attributes, input kind, opset, extra constant inputs)
ELEMENTWISE = {
    "leakyrelu": ("LeakyRelu", {"alpha": 0.1}, "f", 17, ()),
    "elu": ("Elu", {"alpha": 0.7}, "f", 17, ()),
    "hardsigmoid": ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, "f", 17, ()),
    "hardswish": ("HardSwish", {}, "f", 17, ()),
    "softplus": ("Softplus", {}, "f", 17, ()),
    "clip_attrs_opset6": ("Clip", {"min": -0.5, "max": 0.25}, "f", 6, ()),
    "clip_inputs": ("Clip", {}, "f", 13, (np.float32(-0.3), np.float32(0.6))),
    "clip_min_only": ("Clip", {}, "f", 13, (np.float32(0.1),)),
    "lrn_3": ("LRN", {"size": 3, "alpha": 0.02, "beta": 0.6, "bias": 1.5}, "f", 17, ()),
    "lrn_4": ("LRN", {"size": 4}, "f", 17, ()),
    "equal": ("Equal", {}, "ff", 17, ()),
    "less": ("Less", {}, "ff", 17, ()),
    "greater_or_equal": ("GreaterOrEqual", {}, "ff", 17, ()),
    "xor": ("Xor", {}, "bb", 17, ()),
    "or": ("Or", {}, "bb", 17, ()),
    "not": ("Not", {}, "b", 17, ()),
    "isnan": ("IsNaN", {}, "f", 17, ()),
    "isinf_positive_only": ("IsInf", {"detect_negative": 0}, "f", 17, ()),
    "reduce_sum": ("ReduceSum", {"keepdims": 1}, "f", 11, ()),
    "reduce_max": ("ReduceMax", {"keepdims": 0}, "f", 11, ()),
    "reduce_min": ("ReduceMin", {"axes": [2, 3]}, "f", 11, ()),
}


@pytest.mark.parametrize("case", sorted(ELEMENTWISE))
def test_elementwise_semantics_match_onnx_reference(case):
    """Each op's attributes reach its functional model: values as ONNX's reference."""
    op, attrs, kinds, opset, consts = ELEMENTWISE[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    # onnx 1.23's reference LRN loops its channels over range(N): N = C keeps it right
    shape = (5, 5, 2, 3) if op == "LRN" else (2, 5, 3, 4)
    feeds, names, vis = {}, [], []
    for j, k in enumerate(kinds):
        n = f"x{j}"
        if k == "b":
            feeds[n] = rng.random(shape) > 0.5
        else:
            v = rng.standard_normal(shape).astype(np.float32)
            if j == 1:  # some ties for the comparisons
                v = np.where(rng.random(shape) < 0.3, feeds["x0"], v)
            if op in ("IsNaN", "IsInf"):
                v.flat[::7], v.flat[3::11], v.flat[5::13] = np.nan, np.inf, -np.inf
            feeds[n] = v
        names.append(n)
        vis.append(helper.make_tensor_value_info(n, BOOL if k == "b" else F32, list(shape)))
    inits = [numpy_helper.from_array(np.array(c), f"c{j}") for j, c in enumerate(consts)]
    node = helper.make_node(op, names + [i.name for i in inits], ["y"], name="n", **attrs)
    g = helper.make_graph(
        node and [node], "e", vis, [helper.make_tensor_value_info("y", 0, None)], inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    graph = from_onnx(m)
    got = _values(graph, feeds)["y"]
    assert got.shape == want.shape
    if want.dtype == bool:
        np.testing.assert_array_equal(got.astype(bool), want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_clip_with_a_bound_computed_at_run_time_is_refused_in_functional_mode():
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["hi"], name="top", keepdims=0),
        helper.make_node("Clip", ["x", "", "hi"], ["y"], name="clamp"),
    ]
    m = _model(nodes, [("x", [3, 4])], ["y"], opset=13)
    g = from_onnx(m)
    assert wia_hw.run(g, device="wia-npu").latency_ms > 0  # timing needs no values
    with pytest.raises(WorkloadError, match=r"op 'clamp' \(clip\): its bounds are computed"):
        wia_hw.run(g, device="wia-npu", mode="functional")


MATH = {
    "log": ("Log", {}, 13),
    "reciprocal": ("Reciprocal", {}, 13),
    "abs": ("Abs", {}, 13),
    "sin": ("Sin", {}, 13),
    "cos": ("Cos", {}, 13),
    "floor": ("Floor", {}, 13),
    "ceil": ("Ceil", {}, 13),
    "round": ("Round", {}, 13),
    "sign": ("Sign", {}, 13),
    "logsoftmax": ("LogSoftmax", {}, 13),
    "logsoftmax_axis1": ("LogSoftmax", {"axis": 1}, 13),
    "logsoftmax_opset11": ("LogSoftmax", {}, 11),
    "argmax_last": ("ArgMax", {"axis": -1}, 13),
    "argmin_last_keep0": ("ArgMin", {"axis": 3, "keepdims": 0}, 13),
    "argmax_select_last": ("ArgMax", {"axis": 3, "select_last_index": 1}, 13),
}


@pytest.mark.parametrize("case", sorted(MATH))
def test_math_ops_run_at_run_time_as_onnx_reference(case):
    """Ops once folded only when constant now run on activations."""
    op, attrs, opset = MATH[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32) * 3
    if op == "Log":
        x = np.abs(x) + 0.1
    if op == "Round":
        x = np.round(x * 2) / 2  # halves: ties to even
    if op.startswith("Arg"):
        x = np.round(x)  # ties: the first (or last) index
    node = helper.make_node(op, ["x"], ["y"], name="n", **attrs)
    g = helper.make_graph(
        [node],
        "m",
        [helper.make_tensor_value_info("x", F32, list(x.shape))],
        [helper.make_tensor_value_info("y", 0, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    if opset < 13:  # onnx's reference runs the newest LogSoftmax; opset 11 flattens from 1
        flat = x.reshape(2, -1)
        want = (flat - flat.max(1, keepdims=True)).reshape(x.shape)
        want = want - np.log(np.exp(want.reshape(2, -1)).sum(1)).reshape(2, 1, 1, 1)
    graph = from_onnx(m)
    got = _values(graph, {"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert wia_hw.run(graph, device="wia-npu").latency_ms > 0


def test_argmax_over_a_middle_axis_is_named():
    node = helper.make_node("ArgMax", ["x"], ["y"], name="seg", axis=1)
    g = helper.make_graph(
        [node],
        "seg",
        [helper.make_tensor_value_info("x", F32, [1, 21, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT64, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(
        WorkloadError, match=r"ONNX node 'seg' \(ArgMax\): takes the max over axis 1"
    ):
        from_onnx(m)


def _one(op, inputs, attrs=None, opset=17, inits=(), out_elem=0):
    """A one-node model: ``inputs`` is [(name, array)], fed at run time."""
    node = helper.make_node(
        op, [n for n, _ in inputs] + [i.name for i in inits], ["y"], name="n", **(attrs or {})
    )
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for n, v in inputs
    ]
    g = helper.make_graph(
        [node], "one", vis, [helper.make_tensor_value_info("y", out_elem, None)], list(inits)
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_gelu_tanh_approximation():
    x = np.random.default_rng(3).standard_normal((4, 9)).astype(np.float32) * 3
    m = _one("Gelu", [("x", x)], {"approximate": "tanh"}, opset=20)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_allclose(_values(from_onnx(m), {"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_gather_negative_indices_count_from_the_end():
    rng = np.random.default_rng(4)
    table = numpy_helper.from_array(rng.standard_normal((6, 3)).astype(np.float32), "t")
    ids = np.array([[0, -1], [-6, 2]], np.int64)
    m = _one("Gather", [("ids", ids)], opset=13, inits=[table])
    m.graph.node[0].input[:] = ["t", "ids"]
    (want,) = ReferenceEvaluator(m).run(None, {"ids": ids})
    got = _values(from_onnx(m), {"ids": ids, "t": numpy_helper.to_array(table)})["y"]
    np.testing.assert_allclose(got, want)


def test_integer_division_truncates_toward_zero():
    a = np.array([-3, 3, -7, 7, 5], np.int32)
    b = np.array([2, -2, 2, 3, -5], np.int32)
    m = _one("Div", [("a", a), ("b", b)], opset=14)
    (want,) = ReferenceEvaluator(m).run(None, {"a": a, "b": b})
    got = _values(from_onnx(m), {"a": a, "b": b})["y"]
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize(
    "ctm, nm, ok",
    [
        ("half_pixel", "round_prefer_floor", True),  # ONNX's defaults
        ("asymmetric", "floor", True),
        ("pytorch_half_pixel", "round_prefer_floor", True),
        ("align_corners", "floor", False),
        ("asymmetric", "round_prefer_ceil", False),
        ("half_pixel", "ceil", False),
    ],
)
def test_resize_modes_that_are_not_pixel_repetition_are_refused(ctm, nm, ok):
    x = np.random.default_rng(5).standard_normal((1, 2, 3, 4)).astype(np.float32)
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    attrs = {"mode": "nearest", "coordinate_transformation_mode": ctm, "nearest_mode": nm}
    m = _one("Resize", [("x", x)], attrs, opset=13, inits=[scales])
    m.graph.node[0].input[:] = ["x", "", "scales"]
    if not ok:
        with pytest.raises(
            WorkloadError,
            match=rf"ONNX node 'n' \(Resize\): coordinate_transformation_mode '{ctm}'",
        ):
            from_onnx(m)
        return
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_array_equal(_values(from_onnx(m), {"x": x})["y"], want)


def test_training_mode_graphs_are_refused():
    x = np.ones((2, 3, 4, 4), np.float32)
    true = numpy_helper.from_array(np.array(True), "train")
    ratio = numpy_helper.from_array(np.array(0.5, np.float32), "ratio")
    m = _one("Dropout", [("x", x)], opset=13, inits=[ratio, true])
    with pytest.raises(WorkloadError, match=r"\(Dropout\): training_mode is true"):
        from_onnx(m)
    params = [numpy_helper.from_array(np.ones(3, np.float32), n) for n in ("s", "b", "mu", "var")]
    m = _one("BatchNormalization", [("x", x)], {"training_mode": 1}, opset=15, inits=params)
    m.graph.node[0].output[:] = ["y", "rm", "rv"]  # a training BN has its running stats out
    m.graph.output.extend([helper.make_tensor_value_info(n, F32, None) for n in ("rm", "rv")])
    with pytest.raises(WorkloadError, match=r"\(BatchNormalization\): training_mode=1"):
        from_onnx(m)


@pytest.mark.parametrize(
    "data_shape, idx_shape, axis",
    [
        ((3, 4), (2, 4), 0),
        ((3, 4), (3, 2), 1),
        ((2, 3, 5), (2, 3, 4), 2),
        ((4, 3, 2), (2, 3, 2), -3),
    ],
)
def test_gather_elements_reads_each_element_at_its_own_position(data_shape, idx_shape, axis):
    rng = np.random.default_rng(sum(data_shape) + axis)
    x = rng.standard_normal(data_shape).astype(np.float32)
    n = data_shape[axis]
    idx = rng.integers(-n, n, idx_shape).astype(np.int64)  # negatives count from the end
    m = _one("GatherElements", [("x", x), ("i", idx)], {"axis": axis}, opset=13)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x, "i": idx})
    got = _values(from_onnx(m), {"x": x, "i": idx})["y"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "data_shape, idx_shape",
    [((4, 5), (3, 2)), ((2, 3, 4), (5, 2)), ((2, 3, 4), (2, 2, 3)), ((6, 2), (4, 1))],
)
def test_gather_nd_linearises_every_index_column(data_shape, idx_shape):
    rng = np.random.default_rng(sum(data_shape) + sum(idx_shape))
    x = rng.standard_normal(data_shape).astype(np.float32)
    k = idx_shape[-1]
    idx = np.stack([rng.integers(0, data_shape[j], idx_shape[:-1]) for j in range(k)], -1)
    m = _one("GatherND", [("x", x), ("i", idx.astype(np.int64))], opset=13)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x, "i": idx})
    g = from_onnx(m)
    got = _values(g, {"x": x, "i": idx})["y"]
    np.testing.assert_array_equal(got, want)
    # the row index costs a multiply and an add per index element (k > 1)
    extra = sum(g.flops(o) for o in g.ops if o.kind in ("scale", "global_avgpool"))
    assert extra == (2 * idx.size if k > 1 else 0)


@pytest.mark.parametrize("consts", ["none", "y", "cond"])
def test_where_selects_as_onnx(consts):
    """A run-time condition (Clip's expansion: Less + Where), or two run-time branches
    under a constant condition: a ``where`` op, one select per element."""
    rng = np.random.default_rng(len(consts))
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    other = rng.standard_normal((4, 5)).astype(np.float32)  # broadcast
    inits, feeds = [], {"x": x}
    if consts == "y":
        inits.append(numpy_helper.from_array(other, "o"))
        nodes = [
            helper.make_node("Less", ["x", "o"], ["c"], name="lt"),
            helper.make_node("Where", ["c", "o", "x"], ["y"], name="sel"),
        ]
    elif consts == "cond":
        inits.append(numpy_helper.from_array(rng.random((4, 5)) > 0.5, "c"))
        nodes = [
            helper.make_node("Neg", ["x"], ["nx"], name="neg"),
            helper.make_node("Where", ["c", "x", "nx"], ["y"], name="sel"),
        ]
    else:
        nodes = [
            helper.make_node("Greater", ["x", "o"], ["c"], name="gt"),
            helper.make_node("Where", ["c", "x", "o"], ["y"], name="sel"),
        ]
        feeds["o"] = other
    ins = [helper.make_tensor_value_info(n, F32, list(v.shape)) for n, v in feeds.items()]
    g = helper.make_graph(nodes, "w", ins, [helper.make_tensor_value_info("y", F32, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    graph = from_onnx(m)
    assert [o.kind for o in graph.ops if o.name == "sel"] == ["where"]
    vals = dict(feeds)
    vals.update({i.name: numpy_helper.to_array(i) for i in inits})
    np.testing.assert_array_equal(_values(graph, vals)["y"], want)
    sel = next(o for o in graph.ops if o.name == "sel")
    assert graph.flops(sel) == want.size  # one select per element
    assert wia_hw.run(graph, device="wia-npu").latency_ms > 0


def test_functional_mode_computes_with_the_model_s_own_weights():
    """A small CNN written by hand with real weights: Conv + BatchNormalization (folded),
    Pad, Conv without bias + BN, MaxPool, ConvTranspose, GlobalAveragePool, Flatten and
    Gemm (transB, alpha, beta), Softmax. Functional mode, given only the input, computes
    what ONNX's reference does: the initializers and what the import derives from them
    (folded BN weights and biases, transposed and scaled Gemm operands, the permuted
    ConvTranspose weight, pad fills) are the graph's weight values."""
    rng = np.random.default_rng(11)

    def t(name, *shape, pos=False):
        v = rng.standard_normal(shape).astype(np.float32)
        return numpy_helper.from_array(np.abs(v) + 0.5 if pos else v * 0.5, name)

    inits = [
        t("w1", 8, 3, 3, 3),
        t("b1", 8),
        t("g1", 8),
        t("be1", 8),
        t("m1", 8),
        t("v1", 8, pos=True),
        t("w2", 6, 8, 3, 3),
        t("g2", 6),
        t("be2", 6),
        t("m2", 6),
        t("v2", 6, pos=True),
        t("wt", 6, 4, 2, 2),
        t("bt", 4),
        t("fc", 10, 4),
        t("fcb", 10),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
        numpy_helper.from_array(np.array(0.25, np.float32), "fill"),
    ]
    N = helper.make_node
    nodes = [
        N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["n1"], epsilon=1e-3),
        N("Relu", ["n1"], ["r1"]),
        N("Pad", ["r1", "pads", "fill"], ["p1"]),
        N("Conv", ["p1", "w2"], ["c2"], strides=[2, 2]),
        N("BatchNormalization", ["c2", "g2", "be2", "m2", "v2"], ["n2"]),
        N("MaxPool", ["n2"], ["m"], kernel_shape=[2, 2], strides=[1, 1]),
        N("ConvTranspose", ["m", "wt", "bt"], ["u"], strides=[2, 2]),
        N("GlobalAveragePool", ["u"], ["gp"]),
        N("Flatten", ["gp"], ["f"]),
        N("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1, alpha=0.5, beta=2.0),
        N("Softmax", ["logits"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", F32, [2, 3, 12, 12])],
        [helper.make_tensor_value_info("y", F32, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    graph = from_onnx(m)
    assert {"w1", "b1", "w2", "fc.T", "fcb", "wt.cols"} <= set(graph.weight_values)
    res = wia_hw.run(graph, device="wia-npu", mode="functional", inputs={"x": x})
    np.testing.assert_allclose(res.outputs["y"], want, rtol=2e-3, atol=2e-5)
    # given weights win over the model's: a zero classifier gives a uniform softmax
    zero = {"fc.T": np.zeros((4, 10), np.float32), "fcb": np.zeros(10, np.float32)}
    res = wia_hw.run(graph, device="wia-npu", mode="functional", inputs={"x": x, **zero})
    np.testing.assert_allclose(res.outputs["y"], np.full((2, 10), 0.1), rtol=1e-3)


EINSUM = {
    "bhqd,bhkd->bhqk": [(2, 3, 5, 4), (2, 3, 6, 4)],  # attention scores
    "bhqk,bhkd->bhqd": [(2, 3, 5, 6), (2, 3, 6, 4)],
    "ij,jk->ik": [(5, 4), (4, 3)],
    "bid,bjd->bij": [(2, 5, 4), (2, 6, 4)],
    "...ij,...jk->...ik": [(2, 3, 5, 4), (2, 3, 4, 6)],
    "ik,jk": [(5, 4), (6, 4)],  # implicit output: ij
    "bn,anm->bam": [(3, 4), (2, 4, 5)],
    "ij->ji": [(3, 5)],
}


@pytest.mark.parametrize("eq", sorted(EINSUM))
def test_einsum_is_a_batched_matmul_between_views(eq):
    rng = np.random.default_rng(len(eq))
    shapes = EINSUM[eq]
    feeds = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    node = helper.make_node("Einsum", list(feeds), ["y"], name="e", equation=eq)
    vis = [helper.make_tensor_value_info(n, F32, list(v.shape)) for n, v in feeds.items()]
    g = helper.make_graph([node], "ein", vis, [helper.make_tensor_value_info("y", F32, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    graph = from_onnx(m)
    np.testing.assert_allclose(_values(graph, feeds)["y"], want, rtol=1e-5, atol=1e-5)
    if len(shapes) == 2:  # the MACs of the contraction: every letter's size, once
        assert graph.macs() == _einsum_macs(eq, shapes)


def _einsum_macs(eq, shapes):
    lhs = eq.split("->")[0].split(",")
    size = {}
    for t, s in zip(lhs, shapes, strict=True):
        t = t.replace("...", "XY"[: len(s) - len(t) + 3])
        size.update(zip(t, s, strict=True))
    return int(np.prod(list(size.values())))


@pytest.mark.parametrize(
    "eq, shapes, match",
    [
        ("ii->i", [(3, 3)], r"repeats a letter"),
        ("ij,jk->i", [(3, 4), (4, 5)], r"a letter summed within one operand"),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], r"one or two operands"),
    ],
)
def test_einsum_outside_the_model_is_named(eq, shapes, match):
    feeds = {f"x{i}": np.ones(s, np.float32) for i, s in enumerate(shapes)}
    node = helper.make_node("Einsum", list(feeds), ["y"], name="e", equation=eq)
    vis = [helper.make_tensor_value_info(n, F32, list(v.shape)) for n, v in feeds.items()]
    g = helper.make_graph([node], "ein", vis, [helper.make_tensor_value_info("y", F32, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(WorkloadError, match=rf"ONNX node 'e' \(Einsum\): equation .*{match}"):
        from_onnx(m)


def test_weights_in_an_external_data_file_are_read_when_it_is_there(tmp_path):
    """A model saved with its weights in ``model.onnx.data``: functional mode reads them
    from the file beside the model; without the file the model still imports (timing
    needs no values) and those weights are drawn at random."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Add", ["h", "b"], ["y"], name="bias"),
    ]
    g = helper.make_graph(
        nodes,
        "ext",
        [helper.make_tensor_value_info("x", F32, [4, 16])],
        [helper.make_tensor_value_info("y", F32, None)],
        [w, b],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((4, 16)).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    path = tmp_path / "model.onnx"
    onnx.save_model(
        m, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0
    )
    graph = from_onnx(path)
    assert set(graph.weight_values) == {"w", "b"}
    res = wia_hw.run(graph, device="wia-npu", mode="functional", inputs={"x": x})
    np.testing.assert_allclose(res.outputs["y"], want, rtol=2e-3, atol=1e-5)
    (tmp_path / "model.onnx.data").unlink()
    graph = from_onnx(path)
    assert graph.weight_values == {} and graph.macs() == 4 * 16 * 8


def _run_one(op, x, attrs=None, opset=13, inits=()):
    node = helper.make_node(op, ["x"] + [i.name for i in inits], ["y"], name="n", **(attrs or {}))
    g = helper.make_graph(
        [node],
        "one",
        [helper.make_tensor_value_info("x", F32, list(x.shape))],
        [helper.make_tensor_value_info("y", F32, None)],
        list(inits),
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    graph = from_onnx(m)
    return graph, _values(graph, {"x": x})["y"], want


@pytest.mark.parametrize(
    "starts, ends, axes, steps",
    [
        ([0, 0], [2**31, 2**31], [2, 3], [2, 2]),  # YOLOv5's Focus: x[..., ::2, ::2]
        ([1, 0], [2**31, 2**31], [2, 3], [2, 2]),
        ([1], [7], [1], [3]),
        ([0, 1], [2, 5], [0, 3], [1, 1]),  # two axes, step 1
    ],
)
def test_slices_with_steps_and_several_axes(starts, ends, axes, steps):
    x = (
        np.random.default_rng(len(starts) + sum(steps))
        .standard_normal((2, 8, 6, 6))
        .astype(np.float32)
    )
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), n)
        for n, v in (("s", starts), ("e", ends), ("a", axes), ("st", steps))
    ]
    graph, got, want = _run_one("Slice", x, inits=inits)
    np.testing.assert_array_equal(got, want)
    assert wia_hw.run(graph, device="wia-npu").latency_ms > 0


@pytest.mark.parametrize("mode", ["edge", "reflect"])
def test_pad_edge_and_reflect_copy_the_border(mode):
    x = np.random.default_rng(9).standard_normal((1, 2, 5, 6)).astype(np.float32)
    pads = numpy_helper.from_array(np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64), "pads")
    graph, got, want = _run_one("Pad", x, {"mode": mode}, inits=[pads])
    np.testing.assert_array_equal(got, want)
    assert graph.flops() == 0  # copies


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("ReduceMean", {"axes": [1], "keepdims": 1}),  # a channel mean (CBAM)
        ("ReduceMax", {"axes": [1], "keepdims": 1}),
        ("ReduceSum", {"axes": [0, 2], "keepdims": 0}),
        ("ReduceMin", {"axes": [1, 3], "keepdims": 1}),
    ],
)
def test_reductions_over_any_axes(op, attrs):
    x = np.random.default_rng(len(op)).standard_normal((2, 3, 4, 5)).astype(np.float32)
    graph, got, want = _run_one(op, x, attrs, opset=13)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "ctm, scales, sizes",
    [
        ("half_pixel", [1, 1, 2, 2], None),  # ONNX's default
        ("align_corners", None, [1, 2, 11, 7]),  # torch's align_corners=True
        ("pytorch_half_pixel", [1, 1, 1.5, 3], None),
        ("asymmetric", [1, 1, 0.5, 2], None),
        ("half_pixel", None, [1, 2, 4, 3]),  # a downscale
    ],
)
def test_resize_linear_matches_onnx_reference(ctm, scales, sizes):
    """Bilinear resize (segmentation heads, FPNs): values as ONNX's reference."""
    x = np.random.default_rng(len(ctm)).standard_normal((1, 2, 6, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array([], np.float32), "roi")]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        ins = ["x", "roi", "scales"]
    else:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        ins = ["x", "roi", "", "sizes"]
    attrs = {"mode": "linear", "coordinate_transformation_mode": ctm}
    m = _one("Resize", [("x", x)], attrs, opset=13, inits=inits, out_elem=F32)
    m.graph.node[0].input[:] = ins
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    graph = from_onnx(m)
    np.testing.assert_allclose(_values(graph, {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
    assert graph.flops() == 7 * want.size
    assert wia_hw.run(graph, device="wia-npu").latency_ms > 0


ATTN = {
    "plain": ((2, 4, 6, 8), (2, 4, 6, 8), (2, 4, 6, 8), {}, None),
    "causal_scaled": (
        (1, 2, 5, 4),
        (1, 2, 5, 4),
        (1, 2, 5, 6),
        {"is_causal": 1, "scale": 0.3},
        None,
    ),
    "float_mask": ((1, 2, 4, 8), (1, 2, 7, 8), (1, 2, 7, 8), {}, "float"),
    "bool_mask": ((2, 2, 4, 8), (2, 2, 6, 8), (2, 2, 6, 8), {}, "bool"),
    "gqa": ((1, 6, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4), {}, None),
    "causal_more_keys": ((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8), {"is_causal": 1}, None),
    "three_d": ((2, 5, 32), (2, 7, 16), (2, 7, 16), {"q_num_heads": 4, "kv_num_heads": 2}, None),
}


@pytest.mark.parametrize("case", sorted(ATTN))
def test_attention_op_matches_onnx_reference(case):
    """Opset 23's Attention (what new exporters write for SDPA): two bmm around a softmax,
    as ONNX's reference computes it."""
    qs, ks, vs, attrs, mask = ATTN[case]
    rng = np.random.default_rng(len(case))
    feeds = {
        n: rng.standard_normal(s).astype(np.float32) for n, s in (("q", qs), ("k", ks), ("v", vs))
    }
    ins = ["q", "k", "v"]
    if mask is not None:
        shape = (qs[-2] if len(qs) == 4 else qs[1], ks[-2] if len(ks) == 4 else ks[1])
        feeds["m"] = (
            rng.random(shape) > 0.3
            if mask == "bool"
            else rng.standard_normal(shape).astype(np.float32)
        )
        if mask == "bool":
            feeds["m"][:, 0] = True  # every query attends somewhere
        ins.append("m")
    node = helper.make_node("Attention", ins, ["y"], name="attn", **attrs)
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for n, v in feeds.items()
    ]
    g = helper.make_graph([node], "a", vis, [helper.make_tensor_value_info("y", F32, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    graph = from_onnx(m)
    vals = dict(feeds)
    vals.update({n: f() for n, f in graph.weight_values.items()})
    np.testing.assert_allclose(_values(graph, vals)["y"], want, rtol=1e-4, atol=1e-5)
    assert wia_hw.run(graph, device="wia-npu").latency_ms > 0


@pytest.mark.parametrize(
    "op, axis, opset",
    [
        ("LayerNormalization", -1, 17),
        ("LayerNormalization", 1, 17),  # normalised over [3, 4] together
        ("RMSNormalization", -1, 23),
        ("RMSNormalization", 1, 23),
    ],
)
def test_layer_and_rms_norm_over_the_dims_from_axis(op, axis, opset):
    rng = np.random.default_rng(axis + opset)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    norm = x.shape[axis % 3 :]
    inits = [numpy_helper.from_array(rng.standard_normal(norm).astype(np.float32), "scale")]
    if op == "LayerNormalization":
        inits.append(numpy_helper.from_array(rng.standard_normal(norm).astype(np.float32), "bias"))
    m = _one(op, [("x", x)], {"axis": axis, "epsilon": 1e-3}, opset=opset, inits=inits)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    graph = from_onnx(m)
    vals = {"x": x, **{i.name: numpy_helper.to_array(i) for i in inits}}
    vals.update({n: f() for n, f in graph.weight_values.items()})
    np.testing.assert_allclose(_values(graph, vals)["y"], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "case", ["mask_-inf", "mask_finfo_min", "fill_zero", "trilu_upper", "trilu_lower", "expand"]
)
def test_merged_constant_operands_compute_as_onnx(case):
    """Where with a constant condition and fill, Trilu and Expand merge their constants
    into one weight: functional mode gives it its value (a mask's fill, zeros, the
    triangle), so the model computes what ONNX does; a fill that is not a mask's
    (0 here) is a select instead, exact whatever the activation."""
    rng = np.random.default_rng(len(case))
    x = rng.standard_normal((2, 5, 5)).astype(np.float32)
    causal = np.tril(np.ones((5, 5), bool))
    if case.startswith(("mask", "fill")):
        fill = {"mask_-inf": -np.inf, "mask_finfo_min": np.finfo(np.float32).min}.get(case, 0.0)
        inits = [
            numpy_helper.from_array(causal, "c"),
            numpy_helper.from_array(np.array(fill, np.float32), "f"),
        ]
        nodes = [
            helper.make_node("Where", ["c", "x", "f"], ["w"], name="sel"),
            helper.make_node("Softmax", ["w"], ["y"], name="sm", axis=-1),
        ]
    elif case.startswith("trilu"):
        inits = [numpy_helper.from_array(np.array(1, np.int64), "k")]
        nodes = [helper.make_node("Trilu", ["x", "k"], ["y"], upper=int(case.endswith("upper")))]
    else:
        inits = [numpy_helper.from_array(np.array([3, 2, 5, 5], np.int64), "s")]
        nodes = [helper.make_node("Expand", ["x", "s"], ["y"])]
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", F32, [2, 5, 5])],
        [helper.make_tensor_value_info("y", F32, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    graph = from_onnx(m)
    kinds = [o.kind for o in graph.ops]
    assert ("where" in kinds) == (case == "fill_zero")
    y = wia_hw.run(graph, device="wia-npu", mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "starts, ends, axes, steps",
    [
        ([-1], [-(2**63)], [2], [-1]),  # torch.flip's export
        ([5, -1], [0, -100], [1, 2], [-2, -3]),
        ([3], [1], [0], [-1]),
        ([100], [-100], [1], [-4]),  # clamped to [n - 1, -1]
    ],
)
def test_slice_with_negative_steps(starts, ends, axes, steps):
    x = np.random.default_rng(len(starts)).standard_normal((4, 7, 6)).astype(np.float32)
    c = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    inits = [c("s", starts), c("e", ends), c("a", axes), c("t", steps)]
    m = _one("Slice", [("x", x)], inits=inits, opset=13)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    g = from_onnx(m)
    assert g.tensors["y"].shape == want.shape
    np.testing.assert_array_equal(_values(g, {"x": x})["y"], want)
    assert wia_hw.run(g, device="wia-npu").latency_ms > 0  # a strided copy, timed


MORE_OPS = (
    "Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Mish Swish Selu Celu ThresholdedRelu "
    "Softsign Shrink ReduceSumSquare ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp "
    "ReduceProd InstanceNormalization GroupNormalization LpNormalization DepthToSpace "
    "SpaceToDepth Tile GlobalMaxPool Mean OneHot"
).split()


def test_onnx_node_tests_of_activations_reductions_and_normalisations():
    """ONNX's own node tests of the trigonometric and extra activations, the composite
    reductions (L1, L2, sum of squares, log-sum(-exp), product), instance, group and Lp
    normalisation, DepthToSpace/SpaceToDepth, Tile, GlobalMaxPool and Mean: every one
    gives ONNX's expected output, but for empty tensors and float64 data (refused,
    saying so)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from onnx_node_tests import run_node_cases

    matched, refused = run_node_cases(MORE_OPS)
    assert all("empty_set" in r or "log_sum_exp" in r for r in refused), refused
    assert len(matched) >= 90
    assert {
        "test_group_normalization_example",
        "test_instancenorm_epsilon",
        "test_l2normalization_axis_0",
        "test_depthtospace_crd_mode_example",
        "test_spacetodepth_crd_mode_example",
        "test_tile_precomputed",
        "test_globalmaxpool",
        "test_mean_example",
        "test_mish",
        "test_reduce_prod_default_axes_keepdims_random",
        "test_onehot_negative_indices",
    } <= set(matched)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_on_run_time_values(exclusive, reverse):
    """CumSum of a run-time tensor (position ids from an attention mask, say): a
    ``cumsum`` op, one add per element, computed as ONNX does."""
    x = np.random.default_rng(exclusive + 2 * reverse).standard_normal((3, 7)).astype(np.float32)
    ids = (np.random.default_rng(5).random((2, 9)) > 0.3).astype(np.int64)
    for data, axis in ((x, 1), (x, -2), (ids, 1)):
        ax = numpy_helper.from_array(np.array(axis, np.int64), "ax")
        m = _one("CumSum", [("x", data)], {"exclusive": exclusive, "reverse": reverse}, inits=[ax])
        (want,) = ReferenceEvaluator(m).run(None, {"x": data})
        g = from_onnx(m)
        assert [o.kind for o in g.ops] == ["cumsum"] and g.flops() == data.size
        np.testing.assert_allclose(_values(g, {"x": data})["y"], want, rtol=1e-6, atol=1e-6)


def test_declared_outputs_are_returned_even_when_other_ops_read_them():
    """A model whose output is also read by a later op (BERT's last hidden state, read
    by the pooler): functional mode returns every declared output."""
    nodes = [
        helper.make_node("Relu", ["x"], ["hidden"]),
        helper.make_node("ReduceMean", ["hidden"], ["pooled"], axes=[1], keepdims=0),
    ]
    g = helper.make_graph(
        nodes,
        "two",
        [helper.make_tensor_value_info("x", F32, [2, 5])],
        [
            helper.make_tensor_value_info("hidden", F32, [2, 5]),
            helper.make_tensor_value_info("pooled", F32, [2]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((2, 5)).astype(np.float32)
    graph = from_onnx(m)
    assert graph.declared_outputs == ["hidden", "pooled"]
    out = wia_hw.run(graph, mode="functional", inputs={"x": x}).outputs
    want = ReferenceEvaluator(m).run(None, {"x": x})
    assert set(out) == {"hidden", "pooled"}
    np.testing.assert_allclose(out["hidden"], want[0])
    np.testing.assert_allclose(out["pooled"], want[1], rtol=1e-6)


def test_an_empty_slice_is_dropped_from_the_concat_that_reads_it():
    """Phi-3's rotary writes ``cat(x[..., :d] rotated, x[..., d:])`` with d the whole head:
    the second slice is empty and the Concat reads the first alone."""
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    c = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    nodes = [
        helper.make_node("Slice", ["x", "s0", "e0", "ax"], ["a"]),
        helper.make_node("Slice", ["x", "s1", "e1", "ax"], ["b"]),
        helper.make_node("Neg", ["a"], ["na"]),
        helper.make_node("Concat", ["na", "b"], ["y"], axis=-1),
    ]
    inits = [c("s0", [0]), c("e0", [8]), c("s1", [8]), c("e1", [2**62]), c("ax", [-1])]
    g = helper.make_graph(
        nodes,
        "e",
        [helper.make_tensor_value_info("x", F32, [2, 3, 8])],
        [helper.make_tensor_value_info("y", F32, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    graph = from_onnx(m)
    np.testing.assert_array_equal(_values(graph, {"x": x})["y"], want)


def test_a_split_whose_num_outputs_disagrees_is_refused_before_shape_inference():
    """onnx's C++ shape inference aborts the process (an assertion) on this model: the
    import refuses it first, in one line."""
    node = helper.make_node("Split", ["x"], ["a", "b", "c"], name="sp", axis=1, num_outputs=2)
    g = helper.make_graph(
        [node],
        "s",
        [helper.make_tensor_value_info("x", F32, [2, 6])],
        [helper.make_tensor_value_info(o, F32, None) for o in "abc"],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(WorkloadError, match=r"'sp' \(Split\): num_outputs 2 but 3 outputs$"):
        from_onnx(m)


@pytest.mark.parametrize("op", ["Gelu", "BiasGelu", "FastGelu", "QuickGelu"])
def test_onnx_runtime_gelu_kernels(op):
    """ONNX Runtime's fused GELU kernels (com.microsoft) are written back as the ops they
    stand for: the Erf and tanh forms become one ``gelu`` again; values as defined."""
    from math import erf, pi, sqrt, tanh

    x = np.random.default_rng(len(op)).standard_normal((3, 8)).astype(np.float32)
    bias = np.linspace(-1, 1, 8).astype(np.float32)
    ins = ["x", "b"] if op in ("BiasGelu", "FastGelu") else ["x"]
    node = helper.make_node(op, ins, ["y"], domain="com.microsoft", name="g")
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", F32, [3, 8])],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(bias, "b")] if len(ins) == 2 else [],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    graph = from_onnx(m)
    v = (x + bias if len(ins) == 2 else x).astype(np.float64)
    if op == "FastGelu":
        want = 0.5 * v * (1 + np.tanh(sqrt(2 / pi) * (v + 0.044715 * v**3)))
        assert "gelu" in [o.kind for o in graph.ops]
    elif op == "QuickGelu":
        want = v / (1 + np.exp(-1.702 * v))
        assert [o.kind for o in graph.ops] == ["swish"]  # x * sigmoid(1.702 x), one pass
    else:
        want = 0.5 * v * (1 + np.vectorize(erf)(v / sqrt(2)))
        assert "gelu" in [o.kind for o in graph.ops]
    del tanh
    y = wia_hw.run(graph, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_skip_layer_norm_statistics_outputs_are_refused():
    node = helper.make_node(
        "SkipLayerNormalization",
        ["x", "s", "gamma", "beta"],
        ["y", "mean"],
        domain="com.microsoft",
        name="sln",
    )
    g = helper.make_graph(
        [node, helper.make_node("Identity", ["mean"], ["m"])],
        "s",
        [helper.make_tensor_value_info(n, F32, [2, 4, 8]) for n in ("x", "s")],
        [helper.make_tensor_value_info(o, F32, None) for o in ("y", "m")],
        [
            numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
            numpy_helper.from_array(np.zeros(8, np.float32), "beta"),
        ],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    with pytest.raises(WorkloadError, match=r"^ONNX node 'sln' .*mean/variance outputs are read"):
        from_onnx(m)


def test_onnx_node_tests_of_resize():
    """Every Resize/Upsample node test ONNX ships: nearest integer upscales, linear and
    cubic (any coefficient, exclude_outside, every coordinate mode but
    tf_crop_and_resize, align_corners downscales over the scaled width as ONNX) give
    ONNX's outputs; the rest (fractional nearest, antialiasing, crops) are refused
    saying what is modelled."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from onnx_node_tests import run_node_cases

    matched, refused = run_node_cases(("Resize", "Upsample"))
    assert len(matched) >= 21, matched
    assert {
        "test_resize_upsample_scales_cubic",
        "test_resize_downsample_scales_cubic_A_n0p5_exclude_outside",
        "test_resize_downsample_scales_cubic_align_corners",
        "test_resize_downsample_scales_linear_align_corners",
    } <= set(matched)
    assert all("antialias" in r or "nearest" in r or "crop" in r or "tf_" in r for r in refused), (
        refused
    )


@pytest.mark.parametrize(
    "ops, runtime, least, named",
    [
        # BatchNormalization's statistics given at run time: the normalisation written out
        (("BatchNormalization",), {"BatchNormalization": (0, 1, 2, 3, 4)}, 2, ()),
        (("Trilu",), {}, 16, ("test_triu_neg", "test_tril_out_pos")),
        (("Expand",), {}, 2, ("test_expand_dim_changed",)),
        (
            ("Attention",),
            {"Attention": (0, 1, 2)},
            38,
            (
                "test_attention_4d_fp16",
                "test_attention_4d_causal",
                "test_attention_23_boolmask_fullymasked_row_nan_robustness",
            ),
        ),
    ],
)
def test_onnx_node_tests_of_more_ops(ops, runtime, least, named):
    """ONNX's node tests of ops whose operands can come at run time (and Attention's,
    fully masked rows included: they attend to nothing, as ONNX says); what is refused
    (training-mode BatchNormalization, Attention's KV cache, softcap and windows) says
    what is modelled."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from onnx_node_tests import run_node_cases

    matched, refused = run_node_cases(ops, runtime)
    assert len(matched) >= least and set(named) <= set(matched), (matched, refused)


def test_a_used_optional_output_that_is_not_modelled_is_refused():
    node = helper.make_node("LayerNormalization", ["x", "g"], ["y", "mean"], name="ln", axis=-1)
    g = helper.make_graph(
        [node],
        "ln",
        [helper.make_tensor_value_info("x", F32, [2, 8])],
        [helper.make_tensor_value_info(o, F32, None) for o in ("y", "mean")],
        [numpy_helper.from_array(np.ones(8, np.float32), "g")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(
        WorkloadError, match=r"^ONNX node 'ln' \(LayerNormalization\): its output 'mean' is used"
    ):
        from_onnx(m)


# -- ONNX Runtime's fused Attention, hand-built -----------------------------------------


def _ort_attention(mask_kind, unidirectional, bias_term):
    """x [2, 6, 16] -> com.microsoft::Attention (4 heads, packed weight [16, 48] and
    bias), with a mask of key lengths [2] or a 0/1 mask [2, 6], causal or not, and an
    attention bias [1, 4, 6, 6] or not."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((16, 48)).astype(np.float32) * 0.3
    b = rng.standard_normal(48).astype(np.float32) * 0.1
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    ins = ["x", "w", "b", "mask" if mask_kind else ""]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 16])]
    if mask_kind == "lengths":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, [2]))
    elif mask_kind == "2d":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, [2, 6]))
    if bias_term:
        ab = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
        inits.append(numpy_helper.from_array(ab, "ab"))
        ins += ["", "ab"]
    node = helper.make_node(
        "Attention",
        ins,
        ["y"],
        domain="com.microsoft",
        num_heads=4,
        unidirectional=int(unidirectional),
    )
    g = helper.make_graph(
        [node], "att", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    return m, w, b, (inits[2] if bias_term else None)


@pytest.mark.parametrize("mask_kind", ["", "lengths", "2d"])
@pytest.mark.parametrize("unidirectional", [False, True])
@pytest.mark.parametrize("bias_term", [False, True])
def test_onnx_runtimes_attention_kernel_by_its_definition(mask_kind, unidirectional, bias_term):
    m, w, b, ab = _ort_attention(mask_kind, unidirectional, bias_term)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    feeds = {"x": x}
    keep = np.ones((2, 6), bool)
    if mask_kind == "lengths":
        feeds["mask"] = np.array([6, 4], np.int32)
        keep[1, 4:] = False
    elif mask_kind == "2d":
        feeds["mask"] = np.array([[1] * 6, [1, 1, 0, 1, 1, 0]], np.int32)
        keep = feeds["mask"].astype(bool)
    g = from_onnx(m)
    y = wia_hw.run(g, mode="functional", inputs=feeds).outputs["y"]
    q, k, v = np.split(x @ w + b, 3, axis=-1)
    heads = [t.reshape(2, 6, 4, 4).transpose(0, 2, 1, 3) for t in (q, k, v)]
    s = heads[0] @ heads[1].transpose(0, 1, 3, 2) / 2.0  # 1 / sqrt(head size 4)
    s = np.where(keep[:, None, None, :], s, -10000.0) if mask_kind else s
    if bias_term:
        s = s + numpy_helper.to_array(ab)
    if unidirectional:
        s = np.where(np.tril(np.ones((6, 6), bool)), s, -10000.0)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = (p @ heads[2]).transpose(0, 2, 1, 3).reshape(2, 6, 16)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    soft = [o for o in g.ops if o.kind == "softmax"]
    assert len(soft) == 1
    if not mask_kind and not bias_term:  # only the triangle: causal, or nothing
        assert bool(soft[0].attrs.get("causal")) == unidirectional


def test_onnx_runtimes_attention_with_a_kv_cache_is_refused():
    m, *_ = _ort_attention("", False, False)
    m.graph.node[0].input.extend(["past"])
    m.graph.input.append(helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, 2, 4, 0, 4]))
    with pytest.raises(WorkloadError, match=r"com.microsoft::Attention\): a KV cache"):
        from_onnx(m)


@pytest.mark.parametrize(
    "op, hint",
    [
        ("GroupQueryAttention", "import the model as exported, before ONNX Runtime's optimizer"),
        ("MatMulNBits", "quantise in QDQ format"),
    ],
)
def test_an_unmodelled_contrib_op_is_named_with_what_to_do(op, hint):
    node = helper.make_node(op, ["x"], ["y"], domain="com.microsoft")
    g = helper.make_graph(
        [node],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    with pytest.raises(
        WorkloadError, match=rf"1 unsupported ONNX op type: com.microsoft::{op} x1; .*{hint}"
    ):
        from_onnx(m)
