"""What the importer reads through ONNX's own definitions: models older than opset 7
(the ONNX model zoo's oldest files), experimental ops ONNX has since removed, standard
ops defined as functions of other ops, model-local functions, and MatMul's numpy rules
for 1-D and unit-batch operands. Each is checked against numpy or ONNX's reference
evaluator on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import wia_hw
from wia_hw import from_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

F = TensorProto.FLOAT
X = (2, 3, 4, 5)


def model(nodes, inputs, opset, inits=(), *, ir=None, functions=(), domains=()):
    """A model of ``nodes``; before IR 4 (opsets below 7) initializers are graph
    inputs too, as the exporters of the time wrote them."""
    ins = [helper.make_tensor_value_info(n, F, s) for n, s in inputs]
    if ir is not None and ir < 4:
        ins += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    g = helper.make_graph(
        nodes, "m", ins, [helper.make_tensor_value_info("y", F, None)], list(inits)
    )
    m = helper.make_model(
        g,
        opset_imports=[
            helper.make_opsetid("", opset),
            *(helper.make_opsetid(d, 1) for d in domains),
        ],
        functions=list(functions),
    )
    if ir is not None:
        m.ir_version = ir
    return m


def ours(m, feeds):
    g = from_onnx(m)
    return g, wia_hw.run(g, mode="functional", inputs=feeds).outputs["y"]


def const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


RNG = np.random.default_rng(11)
x = RNG.standard_normal(X).astype(np.float32)
c3 = RNG.uniform(0.5, 2, 3).astype(np.float32)
c5 = RNG.uniform(0.5, 2, 5).astype(np.float32)


# -- opsets 1 to 6 -------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, attrs, c, want",
    [
        ("Mul", {"broadcast": 1, "axis": 1}, c3, x * c3[None, :, None, None]),
        ("Add", {"broadcast": 1}, c5, x + c5),  # suffix alignment: numpy's
        ("Sub", {"broadcast": 1, "axis": 3}, c5, x - c5),
        ("Div", {"broadcast": 1, "axis": -3}, c3, x / c3[None, :, None, None]),
    ],
)
def test_opset_6_broadcast_by_axis(op, attrs, c, want):
    m = model(
        [helper.make_node(op, ["x", "c"], ["y"], **attrs)], [("x", X)], 6, [const("c", c)], ir=3
    )
    np.testing.assert_allclose(ours(m, {"x": x})[1], want, rtol=1e-6)


def test_opset_6_conv_bn_and_gemm():
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bn = [RNG.uniform(0.5, 1.5, 4).astype(np.float32) for _ in range(4)]
    fc = RNG.standard_normal((7, 4 * 2 * 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3]),
        helper.make_node(
            "BatchNormalization",
            ["c", "s", "b", "m", "v"],
            ["n"],
            is_test=1,
            consumed_inputs=[0, 0, 0, 1, 1],
        ),
        helper.make_node("Flatten", ["n"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], broadcast=1, transB=1),
    ]
    inits = [
        const("w", w),
        *(const(k, v) for k, v in zip("sbmv", bn, strict=True)),
        const("fc", fc),
        const("fb", c3[:1]),
    ]
    m = model(nodes, [("x", X)], 6, inits, ir=3)
    g, y = ours(m, {"x": x})
    assert [o.kind for o in g.ops][:3] == ["conv2d", "reshape", "linear"]  # the BN folded
    s, b, mu, var = (v.astype(np.float64) for v in bn)
    conv = np.zeros((2, 4, 2, 3))
    for i, j in np.ndindex(2, 3):
        conv[:, :, i, j] = np.einsum("nchw,ochw->no", x[:, :, i : i + 3, j : j + 3], w)
    n = (conv - mu[:, None, None]) / np.sqrt(var + 1e-5)[:, None, None] * s[:, None, None]
    want = (n + b[:, None, None]).reshape(2, -1) @ fc.T + c3[0]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_opset_4_reshape_by_its_shape_attribute():
    m = model([helper.make_node("Reshape", ["x"], ["y"], shape=[2, -1, 5])], [("x", X)], 4, ir=3)
    g, y = ours(m, {"x": x})
    np.testing.assert_array_equal(y, x.reshape(2, -1, 5))


def test_an_old_model_the_converter_refuses_is_one_line():
    m = model([helper.make_node("Reshape", ["x"], ["y"], shape=[2, -1])], [("x", X)], 6, ir=3)
    with pytest.raises(
        wia_hw.WorkloadError,
        match=r"^<ModelProto>: an opset 6 model; onnx's version converter could not bring it to "
        r"opset 7, the oldest wia-hw reads: ",
    ):
        from_onnx(m)


# -- removed experimental ops --------------------------------------------------------


@pytest.mark.parametrize(
    "op, attrs, want",
    [
        (
            "ImageScaler",
            {"scale": 0.5, "bias": [1.0, 2.0, 3.0]},
            0.5 * x + np.array([1, 2, 3])[:, None, None],
        ),
        ("Scale", {"scale": 3.0}, 3 * x),
        ("Affine", {"alpha": 2.0, "beta": -1.0}, 2 * x - 1),
        ("ScaledTanh", {"alpha": 2.0, "beta": 0.5}, 2 * np.tanh(0.5 * x)),
        ("ParametricSoftplus", {"alpha": 2.0, "beta": 0.5}, 2 * np.log1p(np.exp(0.5 * x))),
    ],
)
def test_removed_experimental_ops(op, attrs, want):
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", X)], 7)
    np.testing.assert_allclose(ours(m, {"x": x})[1], want, rtol=1e-5, atol=1e-6)


# -- function ops and model-local functions ------------------------------------------


def same_as_reference(m, feeds):
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    g, y = ours(m, feeds)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    return g


@pytest.mark.parametrize("opset", [13, 18])
def test_mean_variance_normalization_by_its_function_body(opset):
    m = model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])], [("x", X)], opset)
    same_as_reference(m, {"x": x})


def test_rotary_embedding_by_its_function_body():
    b, s, heads, d = 2, 4, 2, 8
    cos = RNG.standard_normal((16, d // 2)).astype(np.float32)
    sin = RNG.standard_normal((16, d // 2)).astype(np.float32)
    pos = numpy_helper.from_array(np.tile(np.arange(1, s + 1), (b, 1)).astype(np.int64), "pos")
    m = model(
        [helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], num_heads=heads)],
        [("x", (b, s, heads * d))],
        23,
        [const("cos", cos), const("sin", sin), pos],
    )
    same_as_reference(m, {"x": RNG.standard_normal((b, s, heads * d)).astype(np.float32)})
    m = model(
        [helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], interleaved=1)],
        [("x", (b, heads, s, d))],
        23,
        [const("cos", cos[None, :s].repeat(b, 0)), const("sin", sin[None, :s].repeat(b, 0))],
    )
    same_as_reference(m, {"x": RNG.standard_normal((b, heads, s, d)).astype(np.float32)})


def test_swiglu_by_its_function_body():
    a, b = (RNG.standard_normal((2, 3, 8)).astype(np.float32) for _ in range(2))
    m = model(
        [helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=1.5)],
        [("a", (2, 3, 8)), ("b", (2, 3, 8))],
        28,
    )
    g, y = ours(m, {"a": a, "b": b})
    assert [o.kind for o in g.ops] == ["swish", "mul"]
    np.testing.assert_allclose(y, a / (1 + np.exp(-1.5 * a)) * b, rtol=1e-5, atol=1e-6)


def test_model_local_functions_are_inlined():
    f = helper.make_function(
        "custom",
        "HalfTanhGate",
        ["X"],
        ["Y"],
        [
            helper.make_node("Constant", [], ["h"], value=numpy_helper.from_array(np.float32(0.5))),
            helper.make_node("Mul", ["X", "h"], ["a"]),
            helper.make_node("Tanh", ["a"], ["t"]),
            helper.make_node("Mul", ["X", "t"], ["Y"]),
        ],
        [helper.make_opsetid("", 17)],
    )
    m = model(
        [
            helper.make_node("HalfTanhGate", ["x"], ["z"], domain="custom"),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        [("x", X)],
        17,
        functions=[f],
        domains=["custom"],
    )
    g = same_as_reference(m, {"x": x})
    assert [o.kind for o in g.ops] == ["mul", "tanh", "mul", "relu"]


def test_an_op_without_a_function_body_is_still_named_unsupported():
    m = model([helper.make_node("Hardmax", ["x"], ["y"])], [("x", X)], 13)
    with pytest.raises(wia_hw.WorkloadError, match=r"1 unsupported ONNX op type: Hardmax x1"):
        from_onnx(m)


# -- MatMul's numpy rules ------------------------------------------------------------


@pytest.mark.parametrize(
    "sa, sb, b_const",
    [
        ((5,), (5, 7), True),
        ((5,), (5, 7), False),
        ((3, 5), (5,), True),
        ((2, 3, 5), (5,), False),
        ((5,), (5,), False),
        ((2, 3, 5), (1, 5, 7), True),
        ((2, 4, 3, 5), (1, 1, 5, 7), False),
        ((5,), (2, 5, 7), False),
        ((5,), (2, 3, 5, 7), True),
    ],
)
def test_matmul_with_1d_or_unit_batch_operands(sa, sb, b_const):
    bv = RNG.standard_normal(sb).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    if b_const:
        m, feeds = model(nodes, [("a", sa)], 17, [const("b", bv)]), {}
    else:
        m, feeds = model(nodes, [("a", sa), ("b", sb)], 17), {"b": bv}
    feeds["a"] = RNG.standard_normal(sa).astype(np.float32)
    same_as_reference(m, feeds)


def test_matmul_broadcasting_batch_dims_is_refused_in_one_line():
    m = model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", (2, 3, 5, 8)), ("b", (3, 8, 4))], 17
    )
    with pytest.raises(
        wia_hw.WorkloadError, match=r"A \[2, 3, 5, 8\] x B \[3, 8, 4\] needs broadcasting"
    ):
        from_onnx(m)


def test_torch_export_with_modules_as_functions():
    """torch's exporter with ``export_modules_as_functions`` (tests/data/onnx/functions,
    made by scripts/make_function_fixtures.py): the graph calls model-local functions
    that call others; inlined, it computes what PyTorch computed, its layer norms and
    GELUs recognised inside the functions' bodies."""
    from pathlib import Path

    here = Path(__file__).parent / "data" / "onnx" / "functions"
    proto = onnx.load(str(here / "blocks.onnx"))
    assert {f.name for f in proto.functions} >= {"Block", "Block.1", "LayerNorm"}
    data = np.load(here / "blocks.npz")
    g = from_onnx(here / "blocks.onnx")
    y = wia_hw.run(g, mode="functional", inputs={"x": data["x"]}).outputs["y"]
    np.testing.assert_allclose(y, data["y"], rtol=0, atol=1e-5 * np.abs(data["y"]).max())
    kinds = [o.kind for o in g.ops]
    assert kinds.count("layer_norm") == 2 and kinds.count("gelu") == 2
    assert kinds.count("softmax") == 1


def test_batch_norm_with_spatial_0_normalises_per_activation():
    """BatchNormalization before opset 9 with ``spatial=0`` (MXNet's exports): its
    statistics are [C, H, W], one per activation; not folded into a Conv."""
    p = [RNG.uniform(0.5, 1.5, X[1:]).astype(np.float32) for _ in range(4)]
    w = RNG.standard_normal((3, 3, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], spatial=0),
    ]
    m = model(
        nodes,
        [("x", X)],
        8,
        [const("w", w), *(const(k, v) for k, v in zip("sbmv", p, strict=True))],
    )
    g, y = ours(m, {"x": x})
    assert [o.kind for o in g.ops] == ["conv2d", "mul", "add"]
    conv = np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0])
    want = (conv - p[2]) / np.sqrt(p[3] + 1e-5) * p[0] + p[1]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    bad = model(
        [nodes[1]], [("c", X)], 8, [const(k, v[:2]) for k, v in zip("sbmv", p, strict=True)]
    )
    with pytest.raises(wia_hw.WorkloadError, match=r"scale \[2, 4, 5\] is neither \[C\] nor"):
        from_onnx(bad)
