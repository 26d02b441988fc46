"""ONNX import of what exporters write: folding, external data, the op table, patterns.

Models are built with onnx.helper in the shapes torch's exporters give them; the
expected figures are derived from the shapes (formulas in the asserts).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from wia_hw.emulator.errors import WorkloadError

import wia_hw
from wia_hw.graph import LAYER_NORM_FLOPS_PER_ELEMENT, SOFTMAX_FLOPS_PER_ELEMENT, UNARY_KINDS
from wia_hw.workloads import from_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def init(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def vi(name, shape, elem=F32):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def node(op, ins, outs, name=None, **attrs):
    return helper.make_node(op, ins, outs, name=name or outs[0], **attrs)


def kinds(g):
    return [o.kind for o in g.ops]


# -- folding ------------------------------------------------------------------------


def shape_chain_model():
    """y = Reshape(x [B, S, 64], Concat(Shape(x)[0], Shape(x)[1], 4, 16)) + a causal
    mask built from the sequence length: ConstantOfShape, Range, Unsqueeze, Expand,
    Less-or-equal through Trilu, Equal, Where, Cast: the legacy exporter's chains."""
    nodes = [
        node("Shape", ["x"], ["shp"]),
        node("Gather", ["shp", "i0"], ["b"], axis=0),
        node("Gather", ["shp", "i1"], ["s"], axis=0),
        node("Unsqueeze", ["b", "ax0"], ["b1"]),
        node("Unsqueeze", ["s", "ax0"], ["s1"]),
        node("Concat", ["b1", "s1", "heads", "dh"], ["newshape"], axis=0),
        node("Reshape", ["x", "newshape"], ["xr"]),
        node("Transpose", ["xr"], ["xt"], perm=[0, 2, 1, 3]),
        # a [S, S] causal mask from S
        node("Concat", ["s1", "s1"], ["ss"], axis=0),
        node("ConstantOfShape", ["ss"], ["ones"], value=helper.make_tensor("v", F32, [1], [1.0])),
        node("Trilu", ["ones"], ["tri"], upper=0),
        node("Equal", ["tri", "zero"], ["masked"]),
        node("Range", ["zero_i", "s", "one_i"], ["pos"]),
        node("Cast", ["pos"], ["posf"], to=F32),
        node("Where", ["masked", "neg", "zero"], ["mask"]),
        node("Add", ["xt_scores", "mask"], ["y"]),
        node("MatMul", ["xt", "xtT"], ["xt_scores"]),
        node("Transpose", ["xt"], ["xtT"], perm=[0, 1, 3, 2]),
    ]
    # topological order: the two bmm-feeding nodes go before the Add
    nodes = nodes[:14] + [nodes[14], nodes[17], nodes[16], nodes[15]]
    inits = [
        init("i0", 0, np.int64),
        init("i1", 1, np.int64),
        init("ax0", [0], np.int64),
        init("heads", [4], np.int64),
        init("dh", [16], np.int64),
        init("zero", 0.0),
        init("neg", -1e9),
        init("zero_i", 0, np.int64),
        init("one_i", 1, np.int64),
    ]
    return model(nodes, [vi("x", ["B", "S", 64])], [vi("y", None), vi("posf", None)], inits)


def test_shape_and_mask_chains_fold_away():
    g = from_onnx(shape_chain_model(), dims={"B": 2, "S": 8}, recognise=False)
    # only compute is left: reshape, transpose, transpose, bmm, add of the folded mask
    assert sorted(kinds(g)) == ["add", "bmm", "reshape", "transpose", "transpose"]
    assert g.tensors["xr"].shape == (2, 8, 4, 16)
    assert g.tensors["y"].shape == (2, 4, 8, 8)
    # the mask is a constant [S, S] weight now; posf was folded to a constant output
    assert g.tensors["mask"].kind == "weight" and g.tensors["mask"].shape == (8, 8)
    assert g.params["folded_nodes"] == 13  # Shape, 2 Gather, 2 Unsqueeze, 2 Concat,
    # ConstantOfShape, Trilu, Equal, Range, Cast, Where
    assert g.macs() == 2 * 4 * 8 * 8 * 16


def test_folding_follows_the_dims():
    a = from_onnx(shape_chain_model(), dims={"B": 1, "S": 4}, recognise=False)
    b = from_onnx(shape_chain_model(), dims={"B": 3, "S": 16}, recognise=False)
    assert a.tensors["y"].shape == (1, 4, 4, 4) and b.tensors["y"].shape == (3, 4, 16, 16)


def test_recognised_causal_attention_from_the_folded_mask():
    g = from_onnx(shape_chain_model(), dims={"B": 2, "S": 8})
    soft = [o for o in g.ops if o.kind == "softmax"]
    # no softmax in this model: the mask add stays (the pattern needs softmax + bmm)
    assert not soft and "add" in kinds(g)


def mlp_external(tmp_path, keep_data: bool):
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "b"], ["y"])]
    m = model(
        nodes,
        [vi("x", [4, 256])],
        [vi("y", [4, 512])],
        [init("w", np.ones((256, 512))), init("b", np.ones(512))],
    )
    path = tmp_path / "mlp.onnx"
    onnx.save_model(
        m,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mlp.onnx.data",
        size_threshold=0,
    )
    assert (tmp_path / "mlp.onnx.data").stat().st_size == (256 * 512 + 512) * 4
    if not keep_data:
        (tmp_path / "mlp.onnx.data").unlink()
    return path


@pytest.mark.parametrize("keep_data", [True, False])
def test_external_data_loads_with_or_without_the_data_file(tmp_path, keep_data):
    g = from_onnx(mlp_external(tmp_path, keep_data))
    assert kinds(g) == ["linear"]  # the bias add fused
    assert g.macs() == 4 * 256 * 512
    assert g.weight_bytes == (256 * 512 + 512) * 4
    assert g.flops() == 2 * 4 * 256 * 512 + 4 * 512


def test_external_shape_constant_is_read_for_folding(tmp_path):
    nodes = [node("Reshape", ["x", "shape"], ["y"])]
    m = model(nodes, [vi("x", [2, 3, 4])], [vi("y", None)], [init("shape", [6, 4], np.int64)])
    path = tmp_path / "r.onnx"
    onnx.save_model(
        m,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="r.onnx.data",
        size_threshold=0,
    )
    g = from_onnx(path)
    assert g.tensors["y"].shape == (6, 4)


def test_weight_transforms_are_shape_folded():
    """Transpose and Cast of a weight happen once at load: they are no ops, and the
    weight keeps its values (the legacy exporter's Identity of a shared weight too)."""
    nodes = [
        node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        node("Cast", ["wt"], ["wc"], to=F32),
        node("MatMul", ["x", "wc"], ["y"]),
    ]
    big = np.random.default_rng(2).standard_normal((300, 400)).astype(np.float32)
    m = model(nodes, [vi("x", [2, 400])], [vi("y", [2, 300])], [init("w", big)])
    g = from_onnx(m)  # > INIT_MAX_ELEMENTS: folded for its dims, never evaluated then
    assert kinds(g) == ["linear"] and g.tensors["wc"].shape == (400, 300)
    assert g.weight_bytes == 300 * 400 * 4
    # functional mode computes the moved weight's values from the model's
    x = np.random.default_rng(3).standard_normal((2, 400)).astype(np.float32)
    y = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, x @ big.T, rtol=1e-4, atol=1e-3)


def test_weights_the_legacy_exporter_moves_keep_their_values():
    """At real sizes (tables above INIT_MAX_ELEMENTS) the legacy exporter's Identity of
    a shared weight and the position-embedding rows gathered for a fixed sequence
    fold for their dims; functional mode still computes with the model's values."""
    rng = np.random.default_rng(4)
    table = rng.standard_normal((512, 256)).astype(np.float32)  # 131,072 elements
    w = rng.standard_normal((256, 300)).astype(np.float32)
    nodes = [
        node("Identity", ["w"], ["w_shared"]),
        node("Mul", ["w_shared", "half"], ["w_scaled"]),  # and a weight scaled in the graph
        node("Gather", ["table", "pos"], ["p"], axis=0),
        node("Add", ["x", "p"], ["h"]),
        node("MatMul", ["h", "w_scaled"], ["y"]),
    ]
    inits = [init("table", table), init("w", w), init("pos", np.arange(16), np.int64)]
    inits.append(init("half", 0.5))
    g = from_onnx(model(nodes, [vi("x", [16, 256])], [vi("y", None)], inits))
    assert kinds(g) == ["add", "linear"]
    assert set(g.weight_values) >= {
        t for o in g.ops for t in o.inputs if g.tensors[t].kind == "weight"
    }
    x = rng.standard_normal((16, 256)).astype(np.float32)
    y = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, (x + table[:16]) @ (0.5 * w), rtol=1e-4, atol=1e-3)


# -- the op table ---------------------------------------------------------------------


def one_op(op, x_shape, y_shape=None, inits=(), extra_ins=(), **attrs):
    m = model(
        [node(op, ["x", *extra_ins], ["y"], **attrs)],
        [vi("x", list(x_shape))],
        [vi("y", list(y_shape) if y_shape else None)],
        inits,
    )
    return from_onnx(m, recognise=False)


@pytest.mark.parametrize(
    "op,kind",
    [
        ("HardSwish", "hardswish"),
        ("HardSigmoid", "hardsigmoid"),
        ("Clip", "clip"),
        ("LRN", "lrn"),
        ("Dropout", "identity"),
        ("LeakyRelu", "leakyrelu"),
        ("Elu", "elu"),
        ("Softplus", "softplus"),
    ],
)
def test_cnn_activations(op, kind):
    attrs = {"size": 5} if op == "LRN" else {}
    g = one_op(op, (1, 16, 7, 7), **attrs)
    assert kinds(g) == [kind] and g.flops() == UNARY_KINDS[kind] * 16 * 7 * 7


def test_reduce_mean_is_a_pool_over_the_trailing_axes():
    g = one_op(
        "ReduceMean",
        (2, 8, 32),
        inits=[init("axes", [-1], np.int64)],
        extra_ins=["axes"],
        keepdims=1,
    )
    assert g.tensors["y"].shape == (2, 8, 1)
    assert g.flops() == 2 * 8 * 32  # one add per input element
    g = one_op(
        "ReduceMean",
        (2, 64, 7, 7),
        axes=[2, 3],
        keepdims=0,
    )
    assert kinds(g) == ["global_avgpool", "reshape"] and g.tensors["y"].shape == (2, 64)


def test_reduce_over_a_leading_axis_moves_it_last():
    g = one_op("ReduceMean", (2, 8, 32), axes=[1])
    assert kinds(g)[0] == "transpose" and "global_avgpool" in kinds(g)
    assert g.tensors["y"].shape == (2, 1, 32)


def test_split_is_one_slice_per_output():
    m = model(
        [node("Split", ["x", "sizes"], ["a", "b", "c"], name="split", axis=2)],
        [vi("x", [2, 8, 96])],
        [vi("a", None), vi("b", None), vi("c", None)],
        [init("sizes", [32, 32, 32], np.int64)],
    )
    g = from_onnx(m)
    assert kinds(g) == ["slice"] * 3
    assert [g.tensors[o].shape for o in "abc"] == [(2, 8, 32)] * 3
    assert [o.attrs["start"] for o in g.ops] == [0, 32, 64]


def test_gather_elements_and_general_gather():
    m = model(
        [node("GatherElements", ["x", "idx"], ["y"], axis=1)],
        [vi("x", [4, 10]), vi("idx", [4, 3], I64)],
        [vi("y", None)],
    )
    g = from_onnx(m)
    assert g.tensors["y"].shape == (4, 3) and "embedding" in kinds(g)
    m = model(
        [node("Gather", ["x", "idx"], ["y"], axis=0)],
        [vi("x", [10, 4, 6]), vi("idx", [5], I64)],
        [vi("y", None)],
    )
    g = from_onnx(m)
    assert g.tensors["y"].shape == (5, 4, 6) and "embedding" in kinds(g)


def test_gather_constant_run_is_a_slice_and_scattered_axis1_is_an_error():
    g = one_op(
        "Gather", (2, 10, 6), inits=[init("i", [3, 4, 5], np.int64)], extra_ins=["i"], axis=1
    )
    assert kinds(g) == ["slice"] and g.tensors["y"].shape == (2, 3, 6)
    with pytest.raises(
        WorkloadError,
        match=r"^ONNX node 'y' \(Gather\): gathers "
        r"non-contiguous indices on axis 1",
    ):
        one_op("Gather", (2, 10, 6), inits=[init("i", [3, 5], np.int64)], extra_ins=["i"], axis=1)


def test_where_expand_trilu_cost_one_op_per_output_element():
    m = model(
        [node("Where", ["c", "x", "fill"], ["y"])],
        [vi("c", [2, 4, 8, 8], TensorProto.BOOL), vi("x", [2, 4, 8, 8])],
        [vi("y", None)],
        [init("fill", -1e9)],
    )
    g = from_onnx(m)
    assert g.flops() == 2 * 4 * 8 * 8 and g.tensors["y"].shape == (2, 4, 8, 8)
    g = one_op("Expand", (2, 1, 8), inits=[init("s", [2, 5, 8], np.int64)], extra_ins=["s"])
    assert g.tensors["y"].shape == (2, 5, 8) and g.flops() == 2 * 5 * 8
    g = one_op("Trilu", (3, 8, 8), upper=0)
    assert kinds(g) == ["mul"] and g.flops() == 3 * 8 * 8


def test_pad_and_resize():
    g = one_op(
        "Pad", (1, 3, 8, 8), inits=[init("p", [0, 0, 1, 2, 0, 0, 1, 2], np.int64)], extra_ins=["p"]
    )
    assert g.tensors["y"].shape == (1, 3, 10, 12) and kinds(g) == ["concat", "concat"]
    with pytest.raises(
        WorkloadError,
        match=r"^ONNX node 'y' \(Pad\): mode 'wrap' is "
        r"not modelled \(constant, edge, reflect\)$",
    ):
        one_op(
            "Pad",
            (1, 3, 8, 8),
            inits=[init("p", [0, 0, 1, 1, 0, 0, 1, 1], np.int64)],
            extra_ins=["p"],
            mode="wrap",
        )
    m = model(
        [node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
        [vi("x", [1, 3, 4, 5])],
        [vi("y", None)],
        [init("scales", [1, 1, 2, 3])],
    )
    g = from_onnx(m)
    assert g.tensors["y"].shape == (1, 3, 8, 15) and g.flops() == 0
    assert kinds(g) == ["reshape", "concat", "concat", "reshape"]
    m = model(
        [node("Resize", ["x", "", "scales"], ["y"], mode="cubic")],
        [vi("x", [1, 3, 4, 5])],
        [vi("y", None)],
        [init("scales", [1, 1, 2, 2])],
    )
    g = from_onnx(m)  # bicubic: 16 products and 15 sums per output element
    assert kinds(g) == ["resize"] and g.flops() == 31 * 1 * 3 * 8 * 10


# -- patterns ---------------------------------------------------------------------------

B, S, NH, DH = 2, 16, 4, 8
H = NH * DH


def attention_model(mask: str):
    """torch's eager attention as the exporters write it: q, k, v [B, NH, S, DH];
    scores = q @ k^T / sqrt(DH) (+ mask); softmax; @ v."""
    nodes = [
        node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q", "kt"], ["s0"]),
        node("Div", ["s0", "sqrt_dh"], ["s1"]),
    ]
    inits = [init("sqrt_dh", math.sqrt(DH))]
    last = "s1"
    if mask == "causal_where":
        tril = np.tril(np.ones((S, S), bool))
        nodes.append(node("Where", ["keep", "s1", "neg"], ["s2"]))
        inits += [numpy_helper.from_array(tril.reshape(1, 1, S, S), "keep"), init("neg", -3.4e38)]
        last = "s2"
    elif mask == "zeros_add":
        nodes.append(node("Add", ["s1", "zmask"], ["s2"]))
        inits.append(init("zmask", np.zeros((B, 1, 1, S))))
        last = "s2"
    elif mask == "input":
        nodes.append(node("Add", ["s1", "amask"], ["s2"]))
        last = "s2"
    nodes += [node("Softmax", [last], ["p"], axis=-1), node("MatMul", ["p", "v"], ["o"])]
    ins = [vi(n, [B, NH, S, DH]) for n in "qkv"]
    if mask == "input":
        ins.append(vi("amask", [B, 1, 1, S]))
    return model(nodes, ins, [vi("o", [B, NH, S, DH])], inits)


@pytest.mark.parametrize(
    "mask,attrs",
    [
        ("none", {}),
        ("causal_where", {"causal": True}),
        ("zeros_add", {}),
        ("input", {"masked": True}),
    ],
)
def test_attention_is_recognised_with_the_same_flops(mask, attrs):
    raw = from_onnx(attention_model(mask), recognise=False)
    g = from_onnx(attention_model(mask))
    assert kinds(g) == ["bmm", "softmax", "bmm"]
    assert g.ops[0].attrs["transpose_b"] and g.ops[0].attrs["scale"] == pytest.approx(
        1 / math.sqrt(DH)
    )
    soft = g.ops[1]
    assert {k: v for k, v in soft.attrs.items() if k in ("causal", "masked")} == attrs
    assert g.flops() == raw.flops() and g.macs() == raw.macs() == 2 * B * NH * S * S * DH
    scores = B * NH * S * S
    extra = scores if mask != "none" else 0  # the div, and the mask op
    assert (
        g.flops() == 4 * B * NH * S * S * DH + scores + extra + SOFTMAX_FLOPS_PER_ELEMENT * scores
    )


def test_gpt2s_causal_buffer_at_real_size():
    """GPT-2 keeps a [1, 1, 1024, 1024] causal buffer (over INIT_MAX_ELEMENTS: folded
    for its dims only) that the export slices to the sequence, behind a same-type
    Cast of the scores (transformers 4): attention is still recognised as causal, and
    functional mode computes with the buffer's values."""
    from onnx.reference import ReferenceEvaluator

    big = np.tril(np.ones((1024, 1024), bool)).reshape(1, 1, 1024, 1024)
    nodes = [
        node("Slice", ["bias", "zero", "seq", "two"], ["keep"]),
        node("Slice", ["keep", "zero", "seq", "three"], ["keep2"]),
        node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q", "kt"], ["s0"]),
        node("Div", ["s0", "sqrt_dh"], ["s1"]),
        node("Cast", ["s1"], ["s1c"], to=F32),
        node("Where", ["keep2", "s1c", "neg"], ["s2"]),
        node("Softmax", ["s2"], ["p"], axis=-1),
        node("MatMul", ["p", "v"], ["o"]),
    ]
    inits = [
        numpy_helper.from_array(big, "bias"),
        init("zero", [0], np.int64),
        init("seq", [S], np.int64),
        init("two", [2], np.int64),
        init("three", [3], np.int64),
        init("sqrt_dh", math.sqrt(DH)),
        init("neg", -3.4e38),
    ]
    m = model(nodes, [vi(n, [B, NH, S, DH]) for n in "qkv"], [vi("o", [B, NH, S, DH])], inits)
    g = from_onnx(m)
    assert kinds(g) == ["bmm", "softmax", "bmm"] and g.ops[1].attrs.get("causal")
    assert g.flops() == from_onnx(m, recognise=False).flops()
    rng = np.random.default_rng(10)
    feeds = {n: rng.standard_normal((B, NH, S, DH)).astype(np.float32) for n in "qkv"}
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    for graph in (g, from_onnx(m, recognise=False)):
        y = wia_hw.run(graph, mode="functional", inputs=feeds).outputs["o"]
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_recognised_attention_is_claimed_by_the_transformer_engine():
    g = from_onnx(attention_model("causal_where"))
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "transformer_engine")
    r = ctx.run(g)
    te = [k for k in r.kernels if k.provider == "transformer_engine"]
    assert len(te) == 1 and te[0].name == "s0+softmax+context"


def ln_gelu_model():
    """x [B, S, H] -> decomposed layer norm (as the legacy exporter writes
    nn.LayerNorm before opset 17) -> Erf GELU."""
    nodes = [
        node("ReduceMean", ["x"], ["mu"], axes=[-1]),
        node("Sub", ["x", "mu"], ["d"]),
        node("Pow", ["d", "two"], ["d2"]),
        node("ReduceMean", ["d2"], ["var"], axes=[-1]),
        node("Add", ["var", "eps"], ["ve"]),
        node("Sqrt", ["ve"], ["std"]),
        node("Div", ["d", "std"], ["n"]),
        node("Mul", ["n", "gamma"], ["ng"]),
        node("Add", ["ng", "beta"], ["ln"]),
        node("Div", ["ln", "sqrt2"], ["g0"]),
        node("Erf", ["g0"], ["g1"]),
        node("Add", ["g1", "one"], ["g2"]),
        node("Mul", ["ln", "g2"], ["g3"]),
        node("Mul", ["g3", "half"], ["y"]),
    ]
    inits = [
        init("two", 2.0),
        init("eps", 1e-12),
        init("gamma", np.ones(H)),
        init("beta", np.zeros(H)),
        init("sqrt2", math.sqrt(2)),
        init("one", 1.0),
        init("half", 0.5),
    ]
    return model(nodes, [vi("x", [B, S, H])], [vi("y", [B, S, H])], inits, opset=13)


def test_layer_norm_and_gelu_are_recognised_with_the_same_flops():
    raw = from_onnx(ln_gelu_model(), recognise=False)
    g = from_onnx(ln_gelu_model())
    assert kinds(g) == ["layer_norm", "gelu"]
    assert g.ops[0].attrs["eps"] == pytest.approx(1e-12)
    assert g.ops[0].inputs == ("x", "gamma", "beta")
    n = B * S * H
    # decomposed: mean, sub, pow, mean, div, mul, add per element + add, sqrt per row
    assert raw.flops() == g.flops() == 7 * n + 2 * B * S + UNARY_KINDS["gelu"] * n
    assert g.flops() != LAYER_NORM_FLOPS_PER_ELEMENT * n + UNARY_KINDS["gelu"] * n


def tf_layer_norm_model(form):
    """x [B, S, H] -> TensorFlow's layer norm as tf2onnx writes it: the means as
    GlobalAveragePool of the 3-D tensor (``keras``) or ReduceMean (``tf1``,
    ``nobeta``), ``inv = reciprocal(sqrt(var + eps)) * gamma [1, 1, H]``, then Keras's
    ``x * inv + (-mean * inv + beta)``, ``tf.nn.batch_normalization``'s
    ``x * inv + (beta - mean * inv)``, or without beta ``x * inv - mean * inv``."""
    mean = (
        (lambda i, o: node("GlobalAveragePool", [i], [o]))
        if form == "keras"
        else (lambda i, o: node("ReduceMean", [i], [o], axes=[-1]))
    )
    nodes = [
        mean("x", "mu"),
        node("Sub", ["x", "mu"], ["d"]),
        node("Mul", ["d", "d"], ["d2"]),
        mean("d2", "var"),
        node("Add", ["var", "eps"], ["ve"]),
        node("Sqrt", ["ve"], ["std"]),
        node("Reciprocal", ["std"], ["r"]),
        node("Mul", ["r", "gamma"], ["inv"]),
        node("Mul", ["x", "inv"], ["xi"]),
    ]
    if form == "keras":
        nodes += [
            node("Neg", ["mu"], ["nm"]),
            node("Mul", ["nm", "inv"], ["mi"]),
            node("Add", ["mi", "beta"], ["res"]),
            node("Add", ["xi", "res"], ["y"]),
        ]
    elif form == "tf1":
        nodes += [
            node("Mul", ["mu", "inv"], ["mi"]),
            node("Sub", ["beta", "mi"], ["res"]),
            node("Add", ["xi", "res"], ["y"]),
        ]
    else:
        nodes += [node("Mul", ["inv", "mu"], ["mi"]), node("Sub", ["xi", "mi"], ["y"])]
    rng = np.random.default_rng(3)
    inits = [
        init("eps", 1e-3),
        init("gamma", rng.standard_normal((1, 1, H))),
        init("beta", rng.standard_normal((1, 1, H))),
    ]
    if form == "nobeta":
        inits.pop()
    return model(nodes, [vi("x", [B, S, H])], [vi("y", [B, S, H])], inits, opset=13)


@pytest.mark.parametrize("form", ["keras", "tf1", "nobeta"])
def test_tensorflow_layer_norm_is_recognised_and_computes_the_same(form):
    raw = from_onnx(tf_layer_norm_model(form), recognise=False)
    g = from_onnx(tf_layer_norm_model(form))
    assert kinds(g) == ["layer_norm"] and g.ops[0].attrs["eps"] == pytest.approx(1e-3)
    assert len(g.ops[0].inputs) == (2 if form == "nobeta" else 3)
    assert all(g.tensors[t].shape == (H,) for t in g.ops[0].inputs[1:])
    assert g.flops() == raw.flops() and g.macs() == raw.macs()
    x = np.random.default_rng(4).standard_normal((B, S, H)).astype(np.float32) * 3 + 1
    fused = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    plain = wia_hw.run(raw, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(fused, plain, rtol=0, atol=2e-5 * np.abs(plain).max())


def test_tensorflow_layer_norm_with_another_reader_of_inv_is_left_alone():
    m = tf_layer_norm_model("keras")
    m.graph.node.append(node("Identity", ["inv"], ["inv_out"]))
    m.graph.output.append(vi("inv_out", [B, S, H]))
    assert "layer_norm" not in kinds(from_onnx(m))


@pytest.mark.parametrize("cube", ["pow", "x*x*x", "x*(x*x)"])
def test_tanh_gelu_in_tensorflows_order_with_any_cube(cube):
    """TF1 BERT's ``x * (0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))))``,
    the cube written with Pow or two Muls: one ``gelu`` (tanh), same outputs."""
    head = {
        "pow": [node("Pow", ["x", "three"], ["p"])],
        "x*x*x": [node("Mul", ["x", "x"], ["x2"]), node("Mul", ["x2", "x"], ["p"])],
        "x*(x*x)": [node("Mul", ["x", "x"], ["x2"]), node("Mul", ["x", "x2"], ["p"])],
    }[cube]
    nodes = head + [
        node("Mul", ["k", "p"], ["kp"]),
        node("Add", ["x", "kp"], ["s"]),
        node("Mul", ["r", "s"], ["rs"]),
        node("Tanh", ["rs"], ["t"]),
        node("Add", ["one", "t"], ["t1"]),
        node("Mul", ["half", "t1"], ["cdf"]),
        node("Mul", ["x", "cdf"], ["y"]),
    ]
    inits = [
        init("three", 3.0),
        init("k", 0.044715),
        init("r", math.sqrt(2 / math.pi)),
        init("one", 1.0),
        init("half", 0.5),
    ]
    m = model(nodes, [vi("x", [B, S, H])], [vi("y", [B, S, H])], inits, opset=13)
    g, raw = from_onnx(m), from_onnx(m, recognise=False)
    assert kinds(g) == ["gelu"] and g.ops[0].attrs["approximate"] == "tanh"
    assert g.flops() == raw.flops()
    x = np.random.default_rng(5).standard_normal((B, S, H)).astype(np.float32) * 2
    a = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    b = wia_hw.run(raw, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_a_cube_with_another_coefficient_is_not_gelu():
    nodes = [
        node("Pow", ["x", "three"], ["p"]),
        node("Mul", ["k", "p"], ["kp"]),
        node("Add", ["x", "kp"], ["s"]),
        node("Mul", ["r", "s"], ["rs"]),
        node("Tanh", ["rs"], ["t"]),
        node("Add", ["one", "t"], ["t1"]),
        node("Mul", ["half", "t1"], ["cdf"]),
        node("Mul", ["x", "cdf"], ["y"]),
    ]
    inits = [init("three", 3.0), init("k", 0.5), init("r", math.sqrt(2 / math.pi))]
    inits += [init("one", 1.0), init("half", 0.5)]
    m = model(nodes, [vi("x", [B, S, H])], [vi("y", [B, S, H])], inits, opset=13)
    assert "gelu" not in kinds(from_onnx(m))


# -- errors and the import report -----------------------------------------------------


def test_constant_folding_failure_names_the_node():
    m = model(
        [node("Reshape", ["c", "s"], ["r"], name="bad_reshape"), node("Add", ["x", "r"], ["y"])],
        [vi("x", [2, 3])],
        [vi("y", None)],
        [init("c", np.ones((2, 3))), init("s", [4], np.int64)],
    )
    with pytest.raises(
        WorkloadError,
        match=r"^ONNX node 'bad_reshape' \(Reshape\): "
        r"constant folding failed: ",
    ):
        from_onnx(m)


def test_import_report_lists_ops_macs_and_bytes():
    from wia_hw.workloads._import_report import format_report, import_report

    r = import_report(attention_model("causal_where"))
    # attention has no weights: the scale and the causal mask are absorbed as attrs
    assert r.ok and r.macs == 2 * B * NH * S * S * DH and r.parameters == 0
    raw = import_report(attention_model("causal_where"), recognise=False)
    assert raw.parameters == 1 + S * S and raw.weight_bytes == 4 * (1 + S * S)
    assert r.ops_by_kind["bmm"] == (
        2,
        r.graph.flops(r.graph.ops[0]) + r.graph.flops(r.graph.ops[2]),
        r.macs,
    )
    assert r.input_bytes == 3 * B * NH * S * DH * 4
    text = format_report(r)
    assert "bmm" in text and f"MACs:        {r.macs:,}" in text


def test_import_report_lists_every_unsupported_op():
    from wia_hw.workloads._import_report import format_report, import_report

    m = model(
        [
            node("Hardmax", ["x"], ["a"]),
            node("Hardmax", ["a"], ["b"]),
            node("EyeLike", ["b"], ["y"]),
        ],
        [vi("x", [2, 3])],
        [vi("y", [2, 3])],
    )
    r = import_report(m)
    assert not r.ok and r.unsupported == {"Hardmax": 2, "EyeLike": 1} and r.graph is None
    assert format_report(r).splitlines()[1:] == [
        "unsupported op types (2):",
        f"  {'Hardmax':<32} {2:>6} nodes",
        f"  {'EyeLike':<32} {1:>6} nodes",
    ]


def test_an_unexpected_failure_in_a_mapping_is_one_line(monkeypatch):
    from wia_hw.workloads import _onnx

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(_onnx, "_split", broken)
    m = model(
        [node("Split", ["x"], ["a", "b"], name="split", axis=0)],
        [vi("x", [4, 3])],
        [vi("a", None), vi("b", None)],
        opset=18,
    )
    m.graph.node[0].attribute.append(helper.make_attribute("num_outputs", 2))
    with pytest.raises(
        WorkloadError,
        match=r"^ONNX node 'split' \(Split\): cannot be "
        r"imported \(KeyError: 'boom'\)$",
    ):
        from_onnx(m)


@pytest.mark.parametrize("hw,k,stride", [(55, 3, 2), (56, 3, 2), (13, 3, 2), (10, 2, 3)])
def test_maxpool_ceil_mode_sizes(hw, k, stride):
    """SqueezeNet's pools: ceil_mode=1 gives ceil((H - k) / s) + 1 outputs."""
    g = one_op(
        "MaxPool", (1, 8, hw, hw), kernel_shape=[k, k], strides=[stride, stride], ceil_mode=1
    )
    out = -(-(hw - k) // stride) + 1
    assert g.tensors["y"].shape == (1, 8, out, out)
    assert g.flops() == 8 * out * out * k * k


def test_gather_nd_is_a_row_gather():
    m = model(
        [node("GatherND", ["x", "idx"], ["y"])],
        [vi("x", [4, 5, 6]), vi("idx", [3, 2], I64)],
        [vi("y", None)],
    )
    g = from_onnx(m)
    assert g.tensors["y"].shape == (3, 6) and "embedding" in kinds(g)
    assert g.flops() == 2 * 3 * 2  # the row index: a multiply and an add per index element
    emb = next(o for o in g.ops if o.kind == "embedding")
    assert g.tensors[emb.inputs[1]].shape == (4 * 5, 6)  # one row per index row
    m = model(
        [node("GatherND", ["x", "idx"], ["y"], batch_dims=1)],
        [vi("x", [4, 5, 6]), vi("idx", [4, 2, 1], I64)],
        [vi("y", None)],
    )
    with pytest.raises(
        WorkloadError,
        match=r"^ONNX node 'y' \(GatherND\): batch_dims=1 "
        r"is not modelled \(only 0\)$",
    ):
        from_onnx(m)


def test_expand_to_the_same_shape_is_free():
    g = one_op("Expand", (2, 5, 8), inits=[init("s", [2, 5, 8], np.int64)], extra_ins=["s"])
    assert kinds(g) == ["identity"] and g.flops() == 0


def test_a_run_time_shape_op_is_unsupported_with_a_hint():
    m = model(
        [node("Range", ["zero_i", "n", "one_i"], ["y"])],
        [vi("n", [], I64)],
        [vi("y", None, I64)],
        [init("zero_i", 0, np.int64), init("one_i", 1, np.int64)],
    )
    with pytest.raises(
        WorkloadError,
        match=r"^<ModelProto>: 1 unsupported ONNX op type: "
        r"Range x1 \(Range only when its inputs are "
        r"constants or static shapes\)$",
    ):
        from_onnx(m)


def test_upsample_of_older_opsets_is_resize():
    m = model(
        [node("Upsample", ["x", "scales"], ["y"], mode="nearest")],
        [vi("x", [1, 3, 4, 5])],
        [vi("y", None)],
        [init("scales", [1, 1, 2, 2])],
        opset=9,
    )
    g = from_onnx(m)
    assert g.tensors["y"].shape == (1, 3, 8, 10) and g.flops() == 0


def test_variadic_sum_max_min():
    m = model(
        [node("Sum", ["a", "b", "c"], ["s"]), node("Max", ["s", "a", "b"], ["y"])],
        [vi(n, [2, 8]) for n in "abc"],
        [vi("y", [2, 8])],
    )
    g = from_onnx(m)
    assert kinds(g) == ["add", "add", "max", "max"] and g.flops() == 4 * 2 * 8


def test_prelu_reads_its_slope():
    g = one_op(
        "PRelu", (1, 16, 7, 7), inits=[init("slope", np.ones((16, 1, 1)))], extra_ins=["slope"]
    )
    assert kinds(g) == ["prelu"] and g.flops() == 2 * 16 * 7 * 7
    assert g.weight_bytes == 16 * 4


@pytest.mark.parametrize("bias_shape", [(B, 1, 1, S), (1, NH, S, S)])
def test_recognised_attention_keeps_an_additive_mask_or_bias(bias_shape):
    """A run-time additive term before the softmax (a padding mask [B, 1, 1, S], T5's
    position bias [1, NH, S, S]) becomes the softmax's second input: the recognised
    chain computes what ONNX does, and the transformer engine's flash kernel streams
    the term: its bytes and its adds on top of the unmasked chain's."""
    from onnx.reference import ReferenceEvaluator

    m = attention_model("input")
    for vi_ in m.graph.input:
        if vi_.name == "amask":
            del vi_.type.tensor_type.shape.dim[:]
            for d in bias_shape:
                vi_.type.tensor_type.shape.dim.add().dim_value = d
    rng = np.random.default_rng(sum(bias_shape))
    feeds = {n: rng.standard_normal((B, NH, S, DH)).astype(np.float32) for n in "qkv"}
    feeds["amask"] = rng.standard_normal(bias_shape).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    g = from_onnx(m)
    assert kinds(g) == ["bmm", "softmax", "bmm"] and g.ops[1].inputs[1] == "amask"
    got = wia_hw.run(g, device="wia-npu", mode="functional", inputs=feeds).outputs["o"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    def flash(graph):
        ctx = wia_hw.open_device("wia-npu")
        wia_hw.register_device_extension(ctx, "transformer_engine")
        (k,) = [k for k in ctx.run(graph).kernels if k.name == "s0+softmax+context"]
        return k

    biased, plain = flash(g), flash(from_onnx(attention_model("none")))
    nbytes = int(np.prod(bias_shape)) * 4
    assert biased.counters.bytes["hbm"] == plain.counters.bytes["hbm"] + nbytes
    assert biased.flops == plain.flops + B * NH * S * S  # one add per score


def test_a_mask_added_before_the_scale_leaves_the_chain():
    """(scores + mask) / sqrt(d) would scale the mask too: not recognised, still exact."""
    nodes = [
        node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q", "kt"], ["s0"]),
        node("Add", ["s0", "amask"], ["s1"]),
        node("Div", ["s1", "sqrt_dh"], ["s2"]),
        node("Softmax", ["s2"], ["p"], axis=-1),
        node("MatMul", ["p", "v"], ["o"]),
    ]
    ins = [vi(n, [B, NH, S, DH]) for n in "qkv"] + [vi("amask", [B, 1, 1, S])]
    g = from_onnx(model(nodes, ins, [vi("o", [B, NH, S, DH])], [init("sqrt_dh", math.sqrt(DH))]))
    assert "add" in kinds(g) and "div" in kinds(g)


# -- If on a condition that folds -----------------------------------------------------


def if_model(cond_nodes, inits):
    """y = 2 * (If(cond) then relu(x) + bias (a then-branch initializer) else -x),
    x [2, 8]; the then branch has a nested If reading the branch's own value."""
    f = TensorProto.FLOAT
    inner = helper.make_graph(
        [helper.make_node("Abs", ["t0"], ["i_out"])],
        "inner",
        [],
        [helper.make_tensor_value_info("i_out", f, None)],
    )
    then_g = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["t0"]),
            helper.make_node("If", ["yes"], ["t1"], then_branch=inner, else_branch=inner),
            helper.make_node("Add", ["t1", "bias"], ["t_out"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", f, None)],
        [init("bias", np.arange(8)), init("yes", True, np.bool_)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", f, None)],
    )
    nodes = cond_nodes + [
        node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g),
        node("Mul", ["z", "two"], ["y"]),
    ]
    return model(nodes, [vi("x", [2, 8])], [vi("y", None)], [*inits, init("two", 2.0)], opset=17)


@pytest.mark.parametrize("limit, branch", [(4, "then"), (9, "else")])
def test_an_if_on_a_shape_test_is_the_branch_it_takes(limit, branch):
    from onnx.reference import ReferenceEvaluator

    m = if_model(
        [
            node("Shape", ["x"], ["s"]),
            node("Gather", ["s", "i1"], ["d"], axis=0),
            node("Greater", ["d", "lim"], ["c"]),
        ],
        [init("i1", 1, np.int64), init("lim", limit, np.int64)],
    )
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    g = from_onnx(m)
    assert [o.kind for o in g.ops if o.kind != "identity"] == (
        ["relu", "abs", "add", "mul"] if branch == "then" else ["neg", "mul"]
    )
    y = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_an_if_on_run_time_values_is_one_line():
    m = if_model(
        [node("ReduceSum", ["x"], ["r"], keepdims=0), node("Greater", ["r", "zero"], ["c"])],
        [init("zero", 0.0)],
    )
    with pytest.raises(
        WorkloadError, match=r"unsupported ONNX op type: If x1 \(If: control flow on run-time"
    ):
        from_onnx(m)


# -- Loop with a constant trip count --------------------------------------------------


def loop_model(trip, cond_out="less"):
    """acc [2, 4] carried: acc = acc * 0.5 + x[i] (x [T, 2, 4], i the iteration number);
    each step's acc also a scan output. ``cond_out``: ``less`` (i + 1 < T, false only
    after the last step, as tf2onnx writes it), ``early`` (i + 1 < 2: exits after two
    steps), ``data`` (sum(acc) > -1e9, on run-time values)."""
    f = TensorProto.FLOAT
    body_nodes = [
        helper.make_node("Gather", ["x", "i"], ["xi"], axis=0),
        helper.make_node("Mul", ["acc_in", "half"], ["scaled"]),
        helper.make_node("Add", ["scaled", "xi"], ["acc_out"]),
        helper.make_node("Identity", ["acc_out"], ["scan"]),
        helper.make_node("Add", ["i", "one"], ["next"]),
    ]
    if cond_out == "data":
        body_nodes += [
            helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "low"], ["c_out"]),
        ]
    else:
        body_nodes.append(
            helper.make_node("Less", ["next", "stop" if cond_out == "less" else "two"], ["c_out"])
        )
    body = helper.make_graph(
        body_nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", f, [2, 4]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", f, [2, 4]),
            helper.make_tensor_value_info("scan", f, [2, 4]),
        ],
        [
            init("half", 0.5),
            init("one", 1, np.int64),
            init("two", 2, np.int64),
            init("stop", trip, np.int64),
            init("low", -1e9),
        ],
    )
    nodes = [
        node("Shape", ["x"], ["shp"]),
        node("Gather", ["shp", "zero"], ["t"], axis=0),  # the trip count from x's shape
        node("Loop", ["t", "go", "acc0"], ["acc", "all"], body=body),
        node("ReduceSum", ["all", "axes0"], ["total"], keepdims=0),
        node("Add", ["acc", "total"], ["y"]),
    ]
    inits = [init("zero", 0, np.int64), init("go", True, np.bool_), init("acc0", np.zeros((2, 4)))]
    inits.append(init("axes0", [0], np.int64))
    return model(nodes, [vi("x", [trip, 2, 4])], [vi("y", None)], inits, opset=17)


def test_a_loop_over_a_constant_trip_count_is_unrolled():
    """Against the loop run step by step in numpy (ONNX Runtime agrees; onnx 1.23's
    reference evaluator does not run this Loop right)."""
    m = loop_model(5)
    x = np.random.default_rng(6).standard_normal((5, 2, 4)).astype(np.float32)
    acc, steps = np.zeros((2, 4), np.float32), []
    for k in range(5):
        acc = acc * np.float32(0.5) + x[k]
        steps.append(acc)
    want = acc + np.sum(steps, axis=0)
    g = from_onnx(m)
    assert "loop" not in {o.kind for o in g.ops}
    y = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "cond, why", [("early", "is false: it exits early"), ("data", "depends on run-time values")]
)
def test_a_loop_that_may_exit_early_is_refused(cond, why):
    with pytest.raises(WorkloadError, match=rf"\(Loop\): an iteration's condition .* {why}"):
        from_onnx(loop_model(5, cond))


def test_an_if_that_picks_a_weight_keeps_its_values():
    """The branch taken outputs a weight too large to fold (300 x 300): the MatMul
    after reads that weight itself, with its values, not a shape-only copy."""
    f = TensorProto.FLOAT
    w = np.random.default_rng(8).standard_normal((300, 300)).astype(np.float32)
    then_g = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["t_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", f, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["w"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", f, None)],
    )
    nodes = [
        node("If", ["yes"], ["picked"], then_branch=then_g, else_branch=else_g),
        node("MatMul", ["x", "picked"], ["y"]),
    ]
    m = model(
        nodes,
        [vi("x", [2, 300])],
        [vi("y", None)],
        [init("w", w), init("yes", True, np.bool_)],
        opset=17,
    )
    g = from_onnx(m)
    assert [o.kind for o in g.ops] == ["linear"]
    x = np.random.default_rng(9).standard_normal((2, 300)).astype(np.float32)
    y = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-3)


def test_a_loop_longer_than_the_unroll_limit_is_refused_in_one_line():
    from wia_hw.workloads._onnx_fold import UNROLL_MAX

    with pytest.raises(
        WorkloadError, match=r"unsupported ONNX op type: Loop x1 \(Loop: .*at most 4,096"
    ):
        from_onnx(loop_model(UNROLL_MAX + 1))
