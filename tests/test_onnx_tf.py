"""Keras models as tf2onnx writes them (tests/data/onnx/tf, made by
scripts/make_tf_fixtures.py), and what the importer folds into a Conv: each imports,
computes in functional mode what Keras computed, costs the MACs Keras's own layers
count, and tf2onnx's idioms (a BatchNormalization left as a Mul after a depthwise
Conv, ZeroPadding2D as a Pad, TensorFlow's layer norm, GELU's tanh form) come out as
the ops a compiler would run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import wia_hw
from wia_hw import from_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

TF = Path(__file__).parent / "data" / "onnx" / "tf"
MACS = json.loads((TF / "keras_macs.json").read_text())


@pytest.mark.parametrize("name", ["keras_cnn", "keras_encoder", "keras_rnn"])
def test_computes_what_keras_computed(name):
    data = np.load(TF / f"{name}.npz")
    g = from_onnx(TF / f"{name}.onnx")
    out = wia_hw.run(g, device="wia-npu", mode="functional", inputs={"x": data["x"]}).outputs
    (result,) = g.declared_outputs
    y, want = out[result], data["y"]
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_the_encoder_is_layer_norms_gelus_and_softmaxes():
    g = from_onnx(TF / "keras_encoder.onnx")
    kinds = [o.kind for o in g.ops]
    assert kinds.count("layer_norm") == 4 and kinds.count("softmax") == 2
    assert [o.attrs["approximate"] for o in g.ops if o.kind == "gelu"] == ["tanh", "tanh"]
    for o in g.ops:
        if o.kind == "layer_norm":
            assert o.attrs["eps"] == pytest.approx(1e-6)
            assert [g.tensors[t].shape for t in o.inputs[1:]] == [(32,), (32,)]
    assert not {"sqrt", "reciprocal", "neg", "tanh", "pow", "mul"} & set(kinds)
    raw = from_onnx(TF / "keras_encoder.onnx", recognise=False)
    assert g.flops() == raw.flops() and g.macs() == raw.macs()


def test_keras_recurrent_layers_are_their_loops_unrolled():
    """tf2onnx writes Keras's LSTM and GRU as a Loop over the 12 time steps: unrolled,
    each step is its GEMMs and gates, and the MACs are the layers' own, less at most
    the first step's product of a zero initial state, which can fold away (the GRU's
    does)."""
    g = from_onnx(TF / "keras_rnn.onnx")
    b, t, f, u = 2, 12, 8, 16
    full = t * b * (f + u) * 4 * u + t * b * (u + u) * 3 * u + b * u * 4
    assert full - b * u * (4 * u + 3 * u) <= g.macs() <= full
    kinds = {o.kind for o in g.ops}
    assert {"linear", "sigmoid", "tanh"} <= kinds
    assert wia_hw.run(g, device="wia-npu").latency_ms > 0


def test_keras_attention_through_einsum_is_recognised():
    """Keras's MultiHeadAttention as tf2onnx writes its einsums: views that regroup
    the batch and head axes between the bmms and the softmax, the causal mask as
    SelectV2's ``s * m + c``. Both layers' attention is the bmm -> softmax -> bmm chain
    (the second causal), which the transformer engine claims as flash attention."""
    g = from_onnx(TF / "keras_encoder.onnx")
    scores = [o for o in g.ops if o.kind == "bmm" and o.attrs.get("transpose_b")]
    assert [o.attrs["scale"] for o in scores] == [pytest.approx(8**-0.5)] * 2
    soft = [o for o in g.ops if o.kind == "softmax"]
    assert [o.inputs for o in soft] == [(s.outputs[0],) for s in scores]
    assert [bool(o.attrs.get("causal")) for o in soft] == [False, True]
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "transformer_engine")
    kernels = [k.name for k in ctx.run(g).kernels if k.provider == "transformer_engine"]
    assert kernels == [f"{s.name}+softmax+context" for s in scores]


@pytest.mark.parametrize("name", sorted(MACS))
def test_keras_applications_cost_the_macs_of_their_layers(name):
    g = from_onnx(TF / f"{name}.onnx")
    assert g.macs() == MACS[name]
    kinds = {o.kind for o in g.ops}
    # every BatchNormalization folded into its Conv (tf2onnx leaves the depthwise
    # ones as a Mul), every ZeroPadding2D before a Conv into its pads (ResNet's before
    # its max pool stays: a max pool's own pads are -inf, not zero)
    assert all("pool1_pad" in o.name for o in g.ops if o.kind == "concat")
    if name != "keras_efficientnetb0":  # (its squeeze-and-excitation multiplies)
        assert "mul" not in kinds


def test_the_cnn_folds_its_batch_norms_and_pads():
    g = from_onnx(TF / "keras_cnn.onnx")
    kinds = [o.kind for o in g.ops]
    assert kinds.count("conv2d") == 8 and "concat" not in kinds
    # left: Rescaling's multiply and add before the first Conv (its zero padding
    # would pad the rescaled image, so they do not fold), the squeeze-and-excitation
    # multiply and the residual add
    assert kinds.count("mul") == 2 and kinds.count("add") == 2
    assert wia_hw.run(g, device="wia-npu").latency_ms > 0


# -- folding into a Conv, hand-built -------------------------------------------------


def conv_model(after, pad=None, const_shape=(1, 4, 1, 1), opset=13):
    """x [2, 3, 6, 6] -> (a Pad) -> Conv 3x3 (4 outputs, bias) -> ``after``: a list of
    (op, constant first) applied in turn with per-channel constants."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
    ]
    nodes, x = [], "x"
    if pad is not None:
        pads, value = pad
        inits.append(numpy_helper.from_array(np.asarray(pads, np.int64), "pads"))
        inits.append(numpy_helper.from_array(np.float32(value), "fill"))
        nodes.append(helper.make_node("Pad", ["x", "pads", "fill"], ["xp"], name="pad"))
        x = "xp"
    nodes.append(helper.make_node("Conv", [x, "w", "b"], ["c0"], name="conv", kernel_shape=[3, 3]))
    cur = "c0"
    for i, (op, first) in enumerate(after):
        c = f"k{i}"
        value = rng.uniform(0.5, 2.0, const_shape).astype(np.float32)
        inits.append(numpy_helper.from_array(value, c))
        ins = [c, cur] if first else [cur, c]
        nodes.append(helper.make_node(op, ins, [f"c{i + 1}"], name=f"{op.lower()}{i}"))
        cur = f"c{i + 1}"
    nodes.append(helper.make_node("Relu", [cur], ["y"], name="relu"))
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def same_as_reference(m):
    x = np.random.default_rng(8).standard_normal((2, 3, 6, 6)).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    g = from_onnx(m)
    y = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    return [o.kind for o in g.ops]


@pytest.mark.parametrize(
    "after",
    [
        [("Mul", False)],
        [("Mul", True), ("Add", True)],
        [("Div", False), ("Sub", False), ("Mul", False)],
    ],
)
def test_per_channel_affine_after_a_conv_folds_into_it(after):
    assert same_as_reference(conv_model(after)) == ["conv2d", "relu"]


def test_scalar_constants_fold_too():
    assert same_as_reference(conv_model([("Mul", False)], const_shape=())) == ["conv2d", "relu"]


@pytest.mark.parametrize(
    "after, shape",
    [
        ([("Sub", True)], (1, 4, 1, 1)),  # c - y is not y's affine map with a positive...
        ([("Div", True)], (1, 4, 1, 1)),  # ...or any scale
        ([("Mul", False)], (1, 1, 1, 4)),  # per column, not per channel
    ],
)
def test_what_is_not_per_channel_stays(after, shape):
    kinds = same_as_reference(conv_model(after, const_shape=shape))
    assert kinds == ["conv2d", after[0][0].lower(), "relu"]


def test_a_zero_pad_of_the_spatial_axes_goes_into_the_conv():
    m = conv_model([], pad=([0, 0, 1, 2, 0, 0, 2, 1], 0.0))
    assert same_as_reference(m) == ["conv2d", "relu"]


@pytest.mark.parametrize(
    "pads, value",
    [([0, 0, 1, 1, 0, 0, 1, 1], 0.5), ([1, 0, 1, 1, 0, 0, 1, 1], 0.0)],
    ids=["nonzero-fill", "batch-axis"],
)
def test_other_pads_stay(pads, value):
    assert "concat" in same_as_reference(conv_model([], pad=(pads, value)))
