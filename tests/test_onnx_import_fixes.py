"""ONNX import: dead nodes, tied weights, grouped-query attention, node order, 1-D A.

Each model is built with onnx.helper in the shape an exporter (or a graph-surgery
tool) writes; functional outputs are checked against onnx's ReferenceEvaluator on
random inputs with a fixed seed, and the expected figures are derived from the shapes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from wia_hw.emulator.errors import WorkloadError

import wia_hw
from wia_hw.workloads import from_onnx
from wia_hw.workloads._import_report import format_report, import_report

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

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


def check_functional(m, g, feeds, rtol=1e-5, atol=1e-5):
    """The graph's functional outputs are the model's declared outputs, with the
    reference evaluator's values."""
    want = dict(
        zip([o.name for o in m.graph.output], ReferenceEvaluator(m).run(None, feeds), strict=True)
    )
    got = wia_hw.run(g, mode="functional", inputs=feeds).outputs
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=rtol, atol=atol, err_msg=k)


# -- 1. dead nodes ------------------------------------------------------------------


def shape_only_model():
    """A Transpose read only by a Shape (which folds): dead once folded."""
    nodes = [
        node("Transpose", ["x"], ["xt"], perm=[1, 0]),
        node("Shape", ["xt"], ["s"]),
        node("Reshape", ["x", "s"], ["y"]),
        node("Relu", ["y"], ["out"]),
    ]
    return model(nodes, [vi("x", [64, 32])], [vi("out", [32, 64])])


def test_dead_node_after_folding_is_removed():
    m = shape_only_model()
    g = from_onnx(m)
    assert kinds(g) == ["reshape", "relu"]
    assert g.params["folded_nodes"] == 1  # the Shape
    assert g.params["dead_nodes"] == 1  # the Transpose
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    check_functional(m, g, {"x": x})


def test_import_report_counts_dead_nodes():
    r = import_report(shape_only_model())
    assert (r.onnx_nodes, r.folded_nodes, r.dead_nodes) == (4, 1, 1)
    assert "1 dead (no output depends on them)" in format_report(r).splitlines()[0]


def test_dead_unsupported_op_does_not_block_import():
    """An unsupported op that no output depends on is removed before the check."""
    nodes = [
        node("Relu", ["x"], ["out"]),
        node("Det", ["x"], ["unused"]),  # no mapping, and nothing reads it
    ]
    m = model(nodes, [vi("x", [4, 4])], [vi("out", [4, 4])])
    g = from_onnx(m)
    assert kinds(g) == ["relu"] and g.params["dead_nodes"] == 1
    # still refused when an output depends on it
    live = model(nodes, [vi("x", [4, 4])], [vi("out", [4, 4]), vi("unused", [])])
    with pytest.raises(WorkloadError, match=r"unsupported ONNX op type: Det x1"):
        from_onnx(live)


def test_graph_without_outputs_is_not_pruned():
    from wia_hw.workloads._onnx_fold import prune_dead

    m = model([node("Relu", ["x"], ["y"])], [vi("x", [4])], [])
    assert prune_dead(onnx, m) == 0 and len(m.graph.node) == 1


def test_names_read_inside_subgraphs_keep_their_producers():
    """An If on a run-time condition whose branch reads an outer value: the value's
    producer stays (the names a subgraph reads count as inputs of its node)."""
    from wia_hw.workloads._onnx_fold import prune_dead

    then_g = helper.make_graph(
        [node("Identity", ["t"], ["r1"])], "then", [], [vi("r1", [4])]
    )  # reads "t" from the enclosing graph
    else_g = helper.make_graph([node("Identity", ["x"], ["r2"])], "else", [], [vi("r2", [4])])
    nodes = [
        node("Neg", ["x"], ["t"]),
        node("Abs", ["x"], ["dead"]),
        node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g),
    ]
    m = model(nodes, [vi("x", [4]), vi("c", [], TensorProto.BOOL)], [vi("out", [4])])
    assert prune_dead(onnx, m) == 1
    assert [n.op_type for n in m.graph.node] == ["Neg", "If"]


def lstm_model(outputs):
    """A one-layer LSTM over x [T, B, n_in] whose node names Y, Y_h and Y_c; ``outputs``
    are the graph's (the legacy exporter names all three even when only Y is used)."""
    T, B, n_in, H = 5, 2, 3, 4
    rng = np.random.default_rng(1)
    inits = [
        init("W", rng.standard_normal((1, 4 * H, n_in)) * 0.5),
        init("R", rng.standard_normal((1, 4 * H, H)) * 0.5),
        init("Bi", rng.standard_normal((1, 8 * H)) * 0.1),
    ]
    nodes = [node("LSTM", ["x", "W", "R", "Bi"], ["Y", "Y_h", "Y_c"], hidden_size=H)]
    shapes = {"Y": [T, 1, B, H], "Y_h": [1, B, H], "Y_c": [1, B, H]}
    return model(nodes, [vi("x", [T, B, n_in])], [vi(o, shapes[o]) for o in outputs], inits), (
        T,
        B,
        n_in,
    )


def test_unread_lstm_states_build_no_copies():
    m, (T, B, n_in) = lstm_model(["Y"])
    g = from_onnx(m)
    both, _ = lstm_model(["Y", "Y_h", "Y_c"])
    g_both = from_onnx(both)
    assert not [o for o in g.ops if o.name.endswith((".Y_h", ".Y_c"))]
    # Y_h and Y_c of one direction are identity copies of the last states (and their views)
    assert len(g.ops) < len(g_both.ops)
    read = {i for o in g.ops for i in o.inputs}
    assert all(o.outputs[0] in read or o.outputs[0] == "Y" for o in g.ops)
    x = np.random.default_rng(2).standard_normal((T, B, n_in)).astype(np.float32)
    check_functional(m, g, {"x": x})


# -- 2. a weight shared by a Gather and a Transpose ---------------------------------


def tied_model(V=300, H=256):
    E = np.random.default_rng(0).standard_normal((V, H)).astype(np.float32)
    nodes = [
        node("Gather", ["E", "ids"], ["x"]),
        node("Transpose", ["E"], ["Et"], perm=[1, 0]),
        node("MatMul", ["x", "Et"], ["logits"]),
    ]
    return model(
        nodes,
        [vi("ids", [2, 5], I64)],
        [vi("logits", [2, 5, V])],
        [numpy_helper.from_array(E, "E")],
        opset=18,
    )


def test_tied_embedding_counts_its_weight_once():
    V, H = 300, 256
    m = tied_model(V, H)
    g = from_onnx(m)
    assert sorted(kinds(g)) == ["embedding", "linear"]
    assert g.parameters == V * H
    assert g.weight_bytes == V * H * 4
    assert g.macs() == 2 * 5 * H * V
    r = import_report(m)
    assert (r.parameters, r.weight_bytes) == (V * H, V * H * 4)
    ids = np.random.default_rng(3).integers(0, V, (2, 5)).astype(np.int64)
    check_functional(m, g, {"ids": ids}, rtol=1e-4, atol=1e-4)


def test_tied_embedding_as_gemm_trans_b_counts_its_weight_once():
    """The legacy form: the head is Gemm(x, E, transB=1), E laid out anew at import."""
    V, H = 40, 16
    E = np.random.default_rng(4).standard_normal((V, H)).astype(np.float32)
    nodes = [
        node("Gather", ["E", "ids"], ["x"]),
        node("Gemm", ["x", "E"], ["logits"], transB=1),
    ]
    m = model(nodes, [vi("ids", [3], I64)], [vi("logits", [3, V])], [init("E", E)])
    g = from_onnx(m)
    assert g.parameters == V * H and g.weight_bytes == V * H * 4
    assert sum(t.numel for t in g.tensors.values() if t.kind == "weight") >= V * H
    ids = np.array([0, 7, 39], np.int64)
    check_functional(m, g, {"ids": ids}, rtol=1e-4, atol=1e-4)


def test_untied_weights_are_all_counted():
    """Two weights of one shape that are not one another's layout: both count."""
    rng = np.random.default_rng(5)
    nodes = [node("MatMul", ["x", "A"], ["h"]), node("MatMul", ["h", "B"], ["y"])]
    m = model(
        nodes,
        [vi("x", [2, 8])],
        [vi("y", [2, 8])],
        [init("A", rng.standard_normal((8, 8))), init("B", rng.standard_normal((8, 8)))],
    )
    g = from_onnx(m)
    assert g.parameters == 2 * 8 * 8 and g.weight_bytes == 2 * 8 * 8 * 4


# -- 3. grouped-query attention through repeat_kv -----------------------------------


def gqa_model(B=2, H=4, NKV=2, T=6, D=8, three_d=False):
    """F.scaled_dot_product_attention(q, repeat_kv(k), repeat_kv(v), is_causal=True)
    as the dynamo exporter writes it: k and v unsqueezed and expanded to
    [B, NKV, REP, T, D]; k reshaped to [B*H, T, D], transposed, reshaped back; q and
    k^T scaled by sqrt(1/sqrt(D)) each; a -inf causal mask added. ``three_d``: the
    model works on [B*H, T, D] (q given so, k^T reshaped to [B*H, D, T])."""
    REP = H // NKV
    lead = (B * H,) if three_d else (B, H)
    causal = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    inits = [
        init("ax2", [2], np.int64),
        init("kv5", [B, NKV, REP, T, D], np.int64),
        init("flat", [B * H, T, D], np.int64),
        init("kt_shape", [*lead, D, T], np.int64),
        init("v_shape", [*lead, T, D], np.int64),
        init("half_scale", [math.sqrt(1 / math.sqrt(D))]),
        init("mask", causal),
    ]
    nodes = [
        node("Unsqueeze", ["k", "ax2"], ["k5"]),
        node("Expand", ["k5", "kv5"], ["ke"]),
        node("Reshape", ["ke", "flat"], ["kr"]),
        node("Transpose", ["kr"], ["krt"], perm=[0, 2, 1]),
        node("Reshape", ["krt", "kt_shape"], ["kt"]),
        node("Unsqueeze", ["v", "ax2"], ["v5"]),
        node("Expand", ["v5", "kv5"], ["ve"]),
        node("Reshape", ["ve", "v_shape"], ["vr"]),
        node("Mul", ["q", "half_scale"], ["qs"]),
        node("Mul", ["kt", "half_scale"], ["kts"]),
        node("MatMul", ["qs", "kts"], ["scores"]),
        node("Add", ["scores", "mask"], ["masked"]),
        node("Softmax", ["masked"], ["probs"], axis=-1),
        node("MatMul", ["probs", "vr"], ["y"]),
    ]
    inputs = [vi("q", [*lead, T, D]), vi("k", [B, NKV, T, D]), vi("v", [B, NKV, T, D])]
    return model(nodes, inputs, [vi("y", [*lead, T, D])], inits, opset=18)


@pytest.mark.parametrize("nkv, three_d", [(2, False), (1, False), (4, False), (2, True)], ids=str)
def test_gqa_repeat_kv_is_attention(nkv, three_d):
    B, H, T, D = 2, 4, 6, 8
    m = gqa_model(B, H, nkv, T, D, three_d)
    g, raw = from_onnx(m), from_onnx(m, recognise=False)
    bmms = [o for o in g.ops if o.kind == "bmm"]
    soft = [o for o in g.ops if o.kind == "softmax"]
    assert len(bmms) == 2 and len(soft) == 1
    assert bmms[0].attrs["transpose_b"] is True
    assert bmms[0].attrs["scale"] == pytest.approx(1 / math.sqrt(D))
    assert soft[0].attrs.get("causal") is True
    assert g.macs() == raw.macs() == 2 * B * H * T * T * D
    rng = np.random.default_rng(6)
    lead = (B * H,) if three_d else (B, H)
    feeds = {
        "q": rng.standard_normal((*lead, T, D)).astype(np.float32),
        "k": rng.standard_normal((B, nkv, T, D)).astype(np.float32),
        "v": rng.standard_normal((B, nkv, T, D)).astype(np.float32),
    }
    check_functional(m, g, feeds)


def test_reshape_that_splits_the_last_axes_is_not_attention():
    """k [B, H, T, D] viewed as [B*H, D, T] without a transpose is no k^T: the
    reshape -> transpose -> reshape form needs the first reshape to keep (T, D)."""
    B, H, T, D = 1, 2, 4, 8
    inits = [
        init("odd", [B * H, D, T], np.int64),
        init("kt_shape", [B, H, D, T], np.int64),
        init("scale", [0.5]),
    ]
    nodes = [
        node("Reshape", ["k", "odd"], ["kr"]),  # (T, D) regrouped as (D, T): no view of k
        node("Transpose", ["kr"], ["krt"], perm=[0, 2, 1]),
        node("Reshape", ["krt", "kt_shape"], ["kt"]),
        node("MatMul", ["q", "kt"], ["s"]),
        node("Mul", ["s", "scale"], ["ss"]),
        node("Softmax", ["ss"], ["p"], axis=-1),
        node("MatMul", ["p", "v"], ["y"]),
    ]
    shape = [B, H, T, D]
    m = model(nodes, [vi("q", shape), vi("k", shape), vi("v", shape)], [vi("y", shape)], inits)
    g = from_onnx(m)
    assert not any(o.attrs.get("transpose_b") for o in g.ops if o.kind == "bmm")
    rng = np.random.default_rng(7)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    check_functional(m, g, feeds)


# -- 4. nodes out of topological order ----------------------------------------------


def test_unsorted_nodes_are_sorted():
    rng = np.random.default_rng(0)
    W = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    nodes = [
        node("Relu", ["y"], ["out"]),  # the consumer listed first
        node("Add", ["mm", "B"], ["y"]),
        node("MatMul", ["x", "W"], ["mm"]),
    ]
    m = model(nodes, [vi("x", [4, 16])], [vi("out", [4, 8])], [init("W", W), init("B", b)])
    g = from_onnx(m)
    assert kinds(g) == ["linear", "relu"]
    assert g.macs() == 4 * 16 * 8 and g.parameters == 16 * 8 + 8
    # the reference evaluator runs the nodes in the file's order: give it them sorted
    ordered = model(
        nodes[::-1], [vi("x", [4, 16])], [vi("out", [4, 8])], [init("W", W), init("B", b)]
    )
    check_functional(ordered, g, {"x": rng.standard_normal((4, 16)).astype(np.float32)})


def test_sort_keeps_the_file_order_among_ready_nodes():
    from wia_hw.workloads._onnx_fold import sort_nodes

    nodes = [
        node("Neg", ["x"], ["a"]),
        node("Add", ["a", "c"], ["out"]),  # read before "c" is written
        node("Abs", ["x"], ["b"]),
        node("Relu", ["x"], ["c"]),
    ]
    m = model(nodes, [vi("x", [3])], [vi("out", [3])])
    assert sort_nodes(m.graph, "m") is True
    assert [n.name for n in m.graph.node] == ["a", "b", "c", "out"]
    assert sort_nodes(m.graph, "m") is False  # sorted: left as it is


def test_cycle_is_one_line_naming_a_node():
    nodes = [
        node("Add", ["x", "z"], ["y"], name="add"),
        node("Relu", ["y"], ["z"], name="relu"),
        node("Neg", ["y"], ["out"], name="neg"),
    ]
    m = model(nodes, [vi("x", [3])], [vi("out", [3])])
    with pytest.raises(
        WorkloadError, match=r"ONNX node '(add|relu)' \((Add|Relu)\) is in a cycle"
    ) as e:
        from_onnx(m)
    assert "\n" not in str(e.value)


def test_node_reading_its_own_output_is_a_cycle():
    m = model([node("Add", ["x", "y"], ["y"], name="self")], [vi("x", [3])], [vi("y", [3])])
    with pytest.raises(WorkloadError, match=r"'self' \(Add\) is in a cycle: .* read by itself"):
        from_onnx(m)


# -- 5. MatMul of a 1-D A by a batched B --------------------------------------------


@pytest.mark.parametrize("const_b", [False, True], ids=["b-input", "b-weight"])
def test_matmul_vector_by_batched_matrix_as_numpy(const_b):
    rng = np.random.default_rng(8)
    a = rng.standard_normal(8).astype(np.float32)
    b = rng.standard_normal((3, 2, 8, 5)).astype(np.float32)
    inputs, inits, feeds = [vi("a", [8])], [], {"a": a}
    if const_b:
        inits.append(init("b", b))
    else:
        inputs.append(vi("b", list(b.shape)))
        feeds["b"] = b
    m = model([node("MatMul", ["a", "b"], ["y"])], inputs, [vi("y", [3, 2, 5])], inits)
    g = from_onnx(m)
    assert g.tensors["y"].shape == (3, 2, 5)
    assert g.macs() == 3 * 2 * 8 * 5
    assert g.parameters == (b.size if const_b else 0)
    check_functional(m, g, feeds)


def test_parameters_do_not_depend_on_the_dims_a_model_is_imported_at():
    """A ViT's class token expanded to the batch and its learned position table sliced
    to the sequence fold to constants of the import's dims; the parameters are the
    model's (token, table and linear, each whole and once) at every batch and length."""
    P, H = 65, 32
    rng = np.random.default_rng(11)
    cls = rng.standard_normal((1, 1, H)).astype(np.float32)
    pos = rng.standard_normal((P, H)).astype(np.float32)
    W = rng.standard_normal((H, H)).astype(np.float32)
    nodes = [
        node("Shape", ["x"], ["xs"]),
        node("Gather", ["xs", "zero"], ["b"], axis=0),
        node("Gather", ["xs", "one"], ["t"], axis=0),
        node("Unsqueeze", ["b", "ax0"], ["b1"]),
        node("Concat", ["b1", "ones2"], ["cshape"], axis=0),
        node("Expand", ["cls", "cshape"], ["clsb"]),
        node("Concat", ["clsb", "x"], ["xc"], axis=1),
        node("Add", ["t", "one"], ["t1"]),
        node("Unsqueeze", ["t1", "ax0"], ["t1v"]),
        node("Slice", ["pos", "zero1", "t1v", "zero1"], ["posn"]),
        node("Add", ["xc", "posn"], ["xp"]),
        node("MatMul", ["xp", "W"], ["y"]),
    ]
    inits = [
        init("cls", cls),
        init("pos", pos),
        init("W", W),
        init("zero", 0, np.int64),
        init("one", 1, np.int64),
        init("ax0", [0], np.int64),
        init("zero1", [0], np.int64),
        init("ones2", [1, H], np.int64),
    ]
    m = model(nodes, [vi("x", ["batch", "seq", H])], [vi("y", ["batch", "seq1", H])], inits)
    want = cls.size + pos.size + W.size
    for batch, seq in [(1, 16), (2, 16), (8, 4), (1, 64)]:
        g = from_onnx(m, dims={"batch": batch, "seq": seq})
        assert g.parameters == want, (batch, seq)
        assert import_report(m, dims={"batch": batch, "seq": seq}).parameters == want
        x = rng.standard_normal((batch, seq, H)).astype(np.float32)
        check_functional(m, g, {"x": x}, rtol=1e-4, atol=1e-4)
