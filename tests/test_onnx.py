"""ONNX import: models built with onnx.helper here, checked against GraphBuilder graphs."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from wia_hw.emulator.errors import WorkloadError

from wia_hw.graph import Graph, GraphBuilder
from wia_hw.workloads import build, from_onnx

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError:  # the missing-package test below still runs
    onnx = None

needs_onnx = pytest.mark.skipif(onnx is None, reason="onnx is not installed")
F32 = 1  # TensorProto.FLOAT


def init(name: str, shape, dtype=np.float32, value=None):
    arr = np.zeros(shape, dtype) if value is None else np.asarray(value, dtype)
    return numpy_helper.from_array(arr, name)


def vi(name: str, shape, elem: int = F32):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits=(), opset: int = 17, name: str = "test"):
    g = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def kinds(g: Graph) -> list[str]:
    return [o.kind for o in g.ops]


def same_work(got: Graph, ref: Graph) -> None:
    assert got.flops() == ref.flops()
    assert got.macs() == ref.macs()
    assert got.weight_bytes == ref.weight_bytes
    assert kinds(got) == kinds(ref)
    assert [got.tensors[o.outputs[0]].shape for o in got.ops] == [
        ref.tensors[o.outputs[0]].shape for o in ref.ops
    ]


# -- an MLP ----------------------------------------------------------------------------


def mlp(batch_dim="batch"):
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
        helper.make_node("Relu", ["hb"], ["a"], name="act"),
        helper.make_node("Gemm", ["a", "w2", "b2"], ["y"], name="fc2", transB=1),
    ]
    return model(
        nodes,
        [vi("x", [batch_dim, 64])],
        [vi("y", [batch_dim, 10])],
        [init("w1", (64, 32)), init("b1", (32,)), init("w2", (10, 32)), init("b2", (10,))],
    )


def mlp_ref(batch: int) -> Graph:
    b = GraphBuilder("ref", "fp32")
    x = b.input("x", (batch, 64))
    h = b.op("linear", "fc1", [x, b.weight("w1", (64, 32))])
    h = b.op("add", "fc1_bias", [h, b.weight("b1", (32,))])
    h = b.op("relu", "act", [h])
    b.op("linear", "fc2", [h, b.weight("w2", (32, 10)), b.weight("b2", (10,))])
    return b.graph()


@needs_onnx
def test_mlp_matches_the_builder_graph():
    g = from_onnx(mlp(), batch=8, recognise=False)
    same_work(g, mlp_ref(8))
    assert g.tensors["x"].kind == "input" and g.tensors["w1"].kind == "weight"
    assert g.tensors["w2.T"].shape == (32, 10)  # transB initializer transposed
    assert g.tensors["y"].shape == (8, 10) and g.tensors["y"].dtype == "fp32"
    assert g.sequences == 8
    assert g.params["source"] == "<ModelProto>" and g.params["opset"] == 17
    assert [o.group for o in g.ops] == ["matmul", "add", "relu", "gemm"]


@needs_onnx
def test_from_file_and_build(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(batch_dim=4), str(path))
    g = from_onnx(path, recognise=False)
    same_work(g, mlp_ref(4))
    assert g.params["source"] == str(path)
    assert build(str(path)).flops() == g.flops()
    assert build(str(path), batch=4).tensors["y"].shape == (4, 10)  # the file's own batch
    # another batch cannot change a fixed one (the run would report 2 samples for 4)
    with pytest.raises(
        WorkloadError, match=r"^batch 2: no input has a free leading dim \(input 'x' is \[4, 64\]"
    ):
        build(str(path), batch=2)


@needs_onnx
def test_model_is_not_modified():
    m = mlp()
    before = m.SerializeToString()
    from_onnx(m, batch=3)
    assert m.SerializeToString() == before


# -- a tiny conv net -------------------------------------------------------------------


def conv_net():
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "c1w"],
            ["c1"],
            name="/features/conv1/Conv",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node(
            "BatchNormalization",
            ["c1", "g", "be", "mu", "var"],
            ["bn"],
            name="/features/bn1/BatchNormalization",
        ),
        helper.make_node("Relu", ["bn"], ["r1"], name="/features/relu1/Relu"),
        helper.make_node(
            "MaxPool",
            ["r1"],
            ["p1"],
            name="/features/pool/MaxPool",
            kernel_shape=[2, 2],
            strides=[2, 2],
        ),
        helper.make_node(
            "Conv",
            ["p1", "c2w", "c2b"],
            ["c2"],
            name="/features/conv2/Conv",
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
        ),
        helper.make_node("Relu", ["c2"], ["r2"], name="/features/relu2/Relu"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gp"], name="/head/GlobalAveragePool"),
        helper.make_node("Flatten", ["gp"], ["fl"], name="/head/Flatten"),
        helper.make_node("Gemm", ["fl", "fcw", "fcb"], ["y"], name="/head/fc/Gemm", transB=1),
    ]
    inits = [
        init("c1w", (8, 3, 3, 3)),
        init("g", (8,)),
        init("be", (8,)),
        init("mu", (8,)),
        init("var", (8,)),
        init("c2w", (16, 8, 3, 3)),
        init("c2b", (16,)),
        init("fcw", (10, 16)),
        init("fcb", (10,)),
    ]
    return model(nodes, [vi("x", ["N", 3, 16, 16])], [vi("y", ["N", 10])], inits)


def conv_ref(n: int) -> Graph:
    b = GraphBuilder("ref", "fp32")
    x = b.input("x", (n, 3, 16, 16))
    x = b.op("conv2d", "c1", [x, b.weight("c1w", (8, 3, 3, 3)), b.weight("c1b", (8,))], pad=1)
    x = b.op("relu", "r1", [x])
    x = b.op("maxpool", "p1", [x], kernel=2, stride=2)
    x = b.op(
        "conv2d", "c2", [x, b.weight("c2w", (16, 8, 3, 3)), b.weight("c2b", (16,))], pad=1, stride=2
    )
    x = b.op("relu", "r2", [x])
    x = b.op("global_avgpool", "gp", [x])
    x = b.op("reshape", "fl", [x], shape=(n, 16))
    b.op("linear", "fc", [x, b.weight("fcw", (16, 10)), b.weight("fcb", (10,))])
    return b.graph()


@needs_onnx
def test_conv_net_matches_the_builder_graph():
    g = from_onnx(conv_net(), dims={"N": 2}, recognise=False)
    same_work(g, conv_ref(2))
    conv1 = g.ops[0]
    assert conv1.outputs == ("bn",)  # batch norm folded into conv1
    assert conv1.attrs == {"stride": 1, "pad": 1, "dilation": 1, "groups": 1}
    assert g.tensors["y"].shape == (2, 10)
    # groups: the first component of the '/'-path node names
    assert {o.group for o in g.ops} == {"features", "head"}


@needs_onnx
def test_batch_norm_that_cannot_fold_is_mul_and_add():
    nodes = [
        helper.make_node("BatchNormalization", ["x", "g", "be", "mu", "var"], ["y"], name="bn")
    ]
    m = model(
        nodes,
        [vi("x", [2, 4, 5, 5])],
        [vi("y", [2, 4, 5, 5])],
        [init(n, (4,)) for n in ("g", "be", "mu", "var")],
    )
    g = from_onnx(m, recognise=False)
    assert kinds(g) == ["mul", "add"]
    assert g.tensors["bn.folded_scale"].shape == (4, 1, 1)
    assert g.flops() == 2 * 2 * 4 * 5 * 5


# -- a tiny attention block ------------------------------------------------------------

H, HEADS = 32, 4
DH = H // HEADS


def attention_block(seq_dim="seq"):
    def mm(a, w, out, n):
        return helper.make_node("MatMul", [a, w], [out], name=f"/attn/{n}/MatMul")

    nodes = []
    for p in "qkv":
        nodes += [
            mm("x", f"w{p}", f"{p}0", f"{p}_proj"),
            helper.make_node("Add", [f"{p}0", f"b{p}"], [f"{p}1"], name=f"/attn/{p}_proj/Add"),
            helper.make_node(
                "Reshape", [f"{p}1", "heads"], [f"{p}2"], name=f"/attn/{p}_split/Reshape"
            ),
            helper.make_node(
                "Transpose",
                [f"{p}2"],
                [f"{p}3"],
                name=f"/attn/{p}_split/Transpose",
                perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3],
            ),
        ]
    nodes += [
        helper.make_node(
            "Constant",
            [],
            ["sqrt_dk"],
            name="/attn/Constant",
            value=numpy_helper.from_array(np.array(math.sqrt(DH), np.float32)),
        ),
        mm("q3", "k3", "s", "scores"),
        helper.make_node("Div", ["s", "sqrt_dk"], ["s1"], name="/attn/scores/Div"),
        helper.make_node("Softmax", ["s1"], ["p"], name="/attn/Softmax", axis=-1),
        mm("p", "v3", "c", "context"),
        helper.make_node(
            "Transpose", ["c"], ["c1"], name="/attn/merge/Transpose", perm=[0, 2, 1, 3]
        ),
        helper.make_node("Reshape", ["c1", "merged"], ["c2"], name="/attn/merge/Reshape"),
        mm("c2", "wo", "o", "out_proj"),
        helper.make_node("Add", ["o", "bo"], ["o1"], name="/attn/out_proj/Add"),
        helper.make_node("Add", ["o1", "x"], ["r"], name="/residual/Add"),
        helper.make_node(
            "LayerNormalization",
            ["r", "gamma", "beta"],
            ["y"],
            name="/ln/LayerNormalization",
            axis=-1,
        ),
    ]
    inits = [init(f"w{p}", (H, H)) for p in "qkvo"] + [init(f"b{p}", (H,)) for p in "qkvo"]
    inits += [
        init("heads", None, np.int64, [0, 0, HEADS, DH]),
        init("merged", None, np.int64, [0, 0, H]),
        init("gamma", (H,)),
        init("beta", (H,)),
    ]
    return model(nodes, [vi("x", ["batch", seq_dim, H])], [vi("y", ["batch", seq_dim, H])], inits)


def attention_ref(batch: int, seq: int) -> Graph:
    b = GraphBuilder("ref", "fp32")
    x = b.input("x", (batch, seq, H))
    heads = {}
    for p in "qkv":
        t = b.op("linear", f"{p}0", [x, b.weight(f"w{p}", (H, H))])
        t = b.op("add", f"{p}1", [t, b.weight(f"b{p}", (H,))])
        t = b.op("reshape", f"{p}2", [t], shape=(batch, seq, HEADS, DH))
        heads[p] = b.op("transpose", f"{p}3", [t], perm=(0, 2, 3, 1) if p == "k" else (0, 2, 1, 3))
    s = b.op("bmm", "s", [heads["q"], heads["k"]])
    s = b.op("div", "s1", [s, b.weight("sqrt_dk", ())])
    p = b.op("softmax", "p", [s])
    c = b.op("bmm", "c", [p, heads["v"]])
    c = b.op("transpose", "c1", [c], perm=(0, 2, 1, 3))
    c = b.op("reshape", "c2", [c], shape=(batch, seq, H))
    o = b.op("linear", "o", [c, b.weight("wo", (H, H))])
    o = b.op("add", "o1", [o, b.weight("bo", (H,))])
    r = b.op("add", "r", [o, x])
    b.op("layer_norm", "y", [r, b.weight("gamma", (H,)), b.weight("beta", (H,))])
    return b.graph()


@needs_onnx
def test_attention_block_matches_the_builder_graph():
    g = from_onnx(attention_block(), batch=2, dims={"seq": 16}, recognise=False)
    same_work(g, attention_ref(2, 16))
    names = {o.name: o for o in g.ops}
    assert g.tensors["s"].shape == (2, HEADS, 16, 16)
    assert names["/attn/scores/MatMul"].kind == "bmm"
    assert names["/attn/q_proj/MatMul"].kind == "linear"
    assert g.tensors["sqrt_dk"].kind == "weight"  # Constant node -> weight
    assert "heads" not in g.tensors  # shape-only initializers stay out
    assert {o.group for o in g.ops} == {"attn", "residual", "ln"}
    assert g.params["dims"] == {"seq": 16} and g.params["batch"] == 2


@needs_onnx
def test_unresolved_symbolic_dim_names_the_input_and_dim():
    with pytest.raises(
        WorkloadError,
        match=r"ONNX input 'x': dimension 1 \('seq'\) is not "
        r"fixed; pass dims=\{'seq': N\}",
    ):
        from_onnx(attention_block(), batch=2)
    with pytest.raises(
        WorkloadError,
        match=r"ONNX input 'x': dimension 0 \('batch'\) .*"
        r"or batch=N",
    ):
        from_onnx(attention_block(), dims={"seq": 4})
    with pytest.raises(
        WorkloadError,
        match=r"from_onnx: dims\['seq'\] must be a positive "
        r"integer, got 0",
    ):
        from_onnx(attention_block(), batch=1, dims={"seq": 0})


# -- other ops -------------------------------------------------------------------------


@needs_onnx
def test_embedding_gather_slice_concat_cast():
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="emb"),
        helper.make_node("Gather", ["e", "zero"], ["cls"], name="cls", axis=1),
        helper.make_node("Unsqueeze", ["cls", "one"], ["u"], name="unsq"),
        helper.make_node("Concat", ["u", "e"], ["cat"], name="cat", axis=1),
        helper.make_node("Slice", ["cat", "s0", "s1", "one"], ["sl"], name="sl"),
        helper.make_node("Cast", ["sl"], ["y"], name="cast", to=TensorProto.FLOAT16),
        helper.make_node("Gelu", ["y"], ["z"], name="gelu"),
    ]
    inits = [
        init("table", (100, 16)),
        init("zero", None, np.int64, 0),
        init("one", None, np.int64, [1]),
        init("s0", None, np.int64, [2]),
        init("s1", None, np.int64, [-1]),
    ]
    m = model(
        nodes,
        [vi("ids", [3, 8], TensorProto.INT64)],
        [vi("z", [3, 6, 16], TensorProto.FLOAT16)],
        inits,
        opset=20,
    )
    g = from_onnx(m, recognise=False)
    assert kinds(g) == [
        "embedding",
        "slice",
        "reshape",
        "reshape",
        "concat",
        "slice",
        "cast",
        "gelu",
    ]
    assert g.tensors["ids"].dtype == "int64" and g.tensors["table"].kind == "weight"
    assert g.tensors["e"].shape == (3, 8, 16)
    assert g.tensors["cls"].shape == (3, 16)
    assert g.tensors["cat"].shape == (3, 9, 16)
    assert g.tensors["sl"].shape == (3, 6, 16)
    assert g.tensors["z"].dtype == "fp16"
    assert g.flops() == 8 * 3 * 6 * 16  # only the GELU computes


@needs_onnx
def test_gemm_with_transposed_activation_and_full_c():
    nodes = [
        helper.make_node("Gemm", ["a", "w", "c"], ["y"], name="g", transA=1, transB=1, alpha=0.5)
    ]
    m = model(nodes, [vi("a", [8, 4])], [vi("y", [4, 6])], [init("w", (6, 8)), init("c", (4, 6))])
    g = from_onnx(m, recognise=False)
    assert kinds(g) == ["transpose", "linear", "add"]  # alpha folds into constant B
    assert g.macs() == 4 * 6 * 8
    assert g.tensors["y"].shape == (4, 6)


@needs_onnx
def test_fp16_model_keeps_its_dtypes():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    m = model(
        nodes,
        [vi("a", [4, 8], TensorProto.FLOAT16), vi("b", [8, 2], TensorProto.FLOAT16)],
        [vi("y", [4, 2], TensorProto.FLOAT16)],
    )
    g = from_onnx(m, recognise=False)
    assert kinds(g) == ["matmul"] and g.tensors["y"].dtype == "fp16"


# -- errors ----------------------------------------------------------------------------


@needs_onnx
def test_unknown_ops_are_all_named_with_counts_in_one_line():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="n1"),
        helper.make_node("NonMaxSuppression", ["r", "r"], ["y"], name="n3"),
        helper.make_node("Hardmax", ["r"], ["c1"], name="n4"),
        helper.make_node("Hardmax", ["c1"], ["c2"], name="n5"),
        helper.make_node("Foo", ["c2"], ["z"], name="n6", domain="custom"),
    ]
    m = model(nodes, [vi("x", [1, 4, 4])], [vi("y", [3, 3], TensorProto.INT64), vi("z", [1, 4, 4])])
    m.opset_import.append(helper.make_opsetid("custom", 1))
    with pytest.raises(
        WorkloadError,
        match=r"^<ModelProto>: 3 unsupported ONNX op types: "
        r"Hardmax x2, NonMaxSuppression x1, custom::Foo x1$",
    ):
        from_onnx(m)


@needs_onnx
def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.onnx"
    with pytest.raises(WorkloadError, match=r"ONNX file not found: '.*nope\.onnx'"):
        from_onnx(path)
    with pytest.raises(WorkloadError, match=r"ONNX file not found: '.*nope\.onnx'"):
        build(str(path))


@needs_onnx
def test_corrupt_file(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"not an onnx model\n")
    with pytest.raises(WorkloadError, match=r"bad\.onnx' is not a readable ONNX model"):
        from_onnx(path)


@needs_onnx
@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("g.json", "garbage", r"g\.json' is not a readable ONNX model: Failed to load JSON"),
        ("m.textproto", "garbage {", r"m\.textproto' is not a readable ONNX model: 1:1"),
        ("m.onnxtxt", "garbage", r"m\.onnxtxt' is not a readable ONNX model: \[ParseError"),
        ("e.onnx", "", r"e\.onnx' is not an ONNX model: it holds no graph \(0 bytes\)"),
    ],
)
def test_unreadable_files_of_every_kind_onnx_parses_are_one_line(tmp_path, name, text, match):
    """onnx.load picks a JSON, text-format or .onnxtxt parser by suffix; their errors
    were tracebacks, and an empty .onnx parsed as an empty model and ran to 0 ms."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(WorkloadError, match=match):
        from_onnx(path)


def test_missing_onnx_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(
        WorkloadError,
        match=r"^ONNX import needs the 'onnx' package: "
        r"pip install 'wia-hw\[onnx\]'$",
    ):
        from_onnx("model.onnx")
