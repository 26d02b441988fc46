"""Import fixes from a bug hunt on ``from_torch`` and the ONNX importer.

Each cause is reproduced with an ONNX model built with onnx.helper (no torch) where it
can be; the ``from_torch`` tests skip where torch (and onnxscript) are not installed.
Expected figures are torch's own (``sum(p.numel() for p in m.parameters())``) or
derived from the shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

import wia_hw
from wia_hw import GraphBuilder, WorkloadError
from wia_hw.workloads import from_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from test_onnx_import_fixes import init, model, vi  # noqa: E402  (the ONNX builders)

F32 = TensorProto.FLOAT


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def const(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name], name=name, value=init(name, value, dtype))


# -- bug 9 and 8: a GEMM on the model's weights is the model's compute ----------------
def test_gemm_on_two_weights_is_kept_and_counts_every_weight():
    """Learned queries through a Linear (Perceiver, Q-Former, DETR): the product of two
    weights was folded and counted as one of them; it is the model's compute (torch
    counts its MACs) and the queries, the weight and the bias are all parameters."""
    rng = np.random.default_rng(0)
    nq, d, t = 4, 8, 6
    inits = [
        init("queries", rng.standard_normal((nq, d))),
        init("qproj.weight", rng.standard_normal((d, d))),
        init("qproj.bias", rng.standard_normal(d)),
    ]
    nodes = [
        node("Transpose", ["qproj.weight"], ["wt"], perm=[1, 0]),
        node("MatMul", ["queries", "wt"], ["qw"]),
        node("Add", ["qw", "qproj.bias"], ["q"]),
        node("Transpose", ["q"], ["qt"], perm=[1, 0]),
        node("MatMul", ["x", "qt"], ["y"]),
    ]
    m = model(nodes, [vi("x", [2, t, d])], [vi("y", [2, t, nq])], inits)
    g = from_onnx(m)
    assert g.parameters == nq * d + d * d + d  # was 32: the folded product alone
    assert g.macs() == nq * d * d + 2 * t * d * nq
    x = rng.standard_normal((2, t, d)).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def rnn_model(b):
    """torch's nn.RNN as the dynamo exporter writes it: a zero initial state from
    Expand, then per step ``tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (2 steps)."""
    i, h = 4, 8
    rng = np.random.default_rng(1)
    inits = [
        init("w_ih", rng.standard_normal((h, i))),
        init("w_hh", rng.standard_normal((h, h))),
        init("b_hh", rng.standard_normal(h)),
    ]
    nodes = [
        const("zero", 0.0),
        const("shape", [b, h], np.int64),
        node("Expand", ["zero", "shape"], ["h0"]),
        node("Transpose", ["w_ih"], ["wih_t"], perm=[1, 0]),
        node("Transpose", ["w_hh"], ["whh_t"], perm=[1, 0]),
    ]
    state = "h0"
    for k in range(2):
        nodes += [
            node("MatMul", [f"x{k}", "wih_t"], [f"xw{k}"]),
            node("MatMul", [state, "whh_t"], [f"hw{k}"]),
            node("Add", [f"hw{k}", "b_hh"], [f"hb{k}"]),
            node("Add", [f"xw{k}", f"hb{k}"], [f"pre{k}"]),
            node("Tanh", [f"pre{k}"], [f"h{k + 1}"]),
        ]
        state = f"h{k + 1}"
    return model(nodes, [vi("x0", [b, i]), vi("x1", [b, i])], [vi(state, [b, h])], inits)


def test_first_recurrence_on_a_zero_state_is_counted_and_the_state_is_no_parameter():
    """h0 @ W_hh read only constants, so folding took the first step's recurrent GEMM
    away (torch's FLOP counter and the ONNX RNN op count it); the zero state it left,
    [B, H], counted as a parameter, so the count changed with the batch."""
    for b in (1, 3):
        g = from_onnx(rnn_model(b))
        assert g.macs() == 2 * b * (4 * 8 + 8 * 8)  # was 2*b*4*8 + b*8*8
        assert g.parameters == 8 * 4 + 8 * 8 + 8  # was + b*8 (the folded h0 @ W_hh + b)


# -- bug 5: constants made from shapes are not parameters ------------------------------
def test_zero_lstm_state_and_causal_mask_are_not_parameters():
    """An LSTM's zero initial state (ConstantOfShape [1, B, H], as torch exports
    nn.LSTM) and a causal mask built from ``full`` and ``triu`` are constants of the
    run: graph.parameters is the model's at every batch and sequence length."""
    hid, inp = 8, 4
    for b, t in ((2, 3), (5, 7)):  # (B 1 would read k as a unit-batch linear)
        inits = [
            init("W", np.ones((1, 4 * hid, inp))),
            init("R", np.ones((1, 4 * hid, hid))),
            init("B", np.ones((1, 8 * hid))),
        ]
        nodes = [
            helper.make_node(
                "ConstantOfShape",
                ["hshape"],
                ["h0"],
                name="h0",
                value=init("v", [0.0]),
            ),
            const("hshape", [1, b, hid], np.int64),
            node("LSTM", ["x", "W", "R", "B", "", "h0", "h0"], ["y"], hidden_size=hid),
            const("minf", -np.inf),
            const("tt", [t, t], np.int64),
            node("Expand", ["minf", "tt"], ["full"]),
            const("one", 1, np.int64),
            node("Trilu", ["full", "one"], ["mask"], upper=1),
            node("Transpose", ["y"], ["yt"], perm=[2, 1, 0, 3]),  # [B, 1, T, H]
            node("Transpose", ["y"], ["ykt"], perm=[2, 1, 3, 0]),  # [B, 1, H, T]
            node("MatMul", ["yt", "ykt"], ["s"]),
            node("Add", ["s", "mask"], ["sm"]),
            node("Softmax", ["sm"], ["p"], axis=-1),
            node("MatMul", ["p", "yt"], ["o"]),
        ]
        nodes = nodes[1:2] + nodes[:1] + nodes[2:]  # the shape before its reader
        m = model(nodes, [vi("x", [t, b, inp])], [vi("o", [b, 1, t, hid])], inits)
        g = from_onnx(m)
        assert g.parameters == 4 * hid * inp + 4 * hid * hid + 8 * hid
        soft = [o for o in g.ops if o.kind == "softmax"]
        assert [o.attrs.get("causal") for o in soft] == [True]


def test_conv3d_depth_padding_is_not_a_parameter():
    """A 3-D Conv's zero depth padding is a slab per side that the import makes; it
    counted as parameters, in proportion to the batch."""
    for n in (1, 4):
        inits = [init("w", np.ones((8, 4, 3, 3, 3))), init("b", np.ones(8))]
        m = model(
            [node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1, 1, 1])],
            [vi("x", [n, 4, 6, 8, 8])],
            [vi("y", [n, 8, 6, 8, 8])],
            inits,
        )
        g = from_onnx(m)
        assert g.parameters == 8 * 4 * 27 + 8
        assert any(t.endswith("depth_pad_lo") for t in g.tensors)  # still read


# -- bug 3: attention through composed transposes, a CastLike scale ---------------------
def mha_scores_model(castlike: bool):
    """The optimised dynamo export of nn.MultiheadAttention: k [T, B*H, d] goes
    through the heads' transpose(1, 0, 2) straight into transpose(0, 2, 1), then a
    reshape to [B, H, d, T]; the scale is a CastLike of a constant (unoptimised) or
    an initializer."""
    b, h, t, d = 2, 4, 16, 8
    nodes = [
        node("Transpose", ["k"], ["kh"], perm=[1, 0, 2]),
        node("Transpose", ["kh"], ["ktr"], perm=[0, 2, 1]),
        const("kshape", [b, h, d, t], np.int64),
        node("Reshape", ["ktr", "kshape"], ["kt"]),
        node("MatMul", ["q", "kt"], ["s"]),
    ]
    inits = []
    if castlike:
        nodes += [const("c", 8.0), node("Sqrt", ["c"], ["rc"])]
        nodes += [node("CastLike", ["rc", "s"], ["scale"]), node("Div", ["s", "scale"], ["ss"])]
    else:
        inits.append(init("scale", np.float32(1 / np.sqrt(8.0))))
        nodes.append(node("Mul", ["s", "scale"], ["ss"]))
    nodes += [node("Softmax", ["ss"], ["p"], axis=-1), node("MatMul", ["p", "v"], ["o"])]
    ins = [vi("q", [b, h, t, d]), vi("k", [t, b * h, d]), vi("v", [b, h, t, d])]
    return model(nodes, ins, [vi("o", [b, h, t, d])], inits)


@pytest.mark.parametrize("castlike", [False, True])
def test_attention_through_composed_transposes_is_recognised(castlike):
    m = mha_scores_model(castlike)
    g, raw = from_onnx(m), from_onnx(m, recognise=False)
    scores = [o for o in g.ops if o.kind == "bmm" and o.attrs.get("transpose_b")]
    assert len(scores) == 1
    assert scores[0].attrs["scale"] == pytest.approx(1 / np.sqrt(8.0))
    assert [o.kind for o in g.ops].count("transpose") == 1  # the heads' permutation
    assert not any(o.kind in ("cast", "sqrt") for o in g.ops)
    assert g.macs() == raw.macs() and g.flops() == raw.flops()
    rng = np.random.default_rng(2)
    feeds = {
        "q": rng.standard_normal((2, 4, 16, 8)).astype(np.float32),
        "k": rng.standard_normal((16, 8, 8)).astype(np.float32),
        "v": rng.standard_normal((2, 4, 16, 8)).astype(np.float32),
    }
    want = ReferenceEvaluator(m).run(None, feeds)[0]
    got = wia_hw.run(g, mode="functional", inputs=feeds).outputs["o"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# -- bug 4: the batch of a static model --------------------------------------------------
def test_static_batch_is_the_inputs_common_leading_dim():
    def mlp(shapes):
        inits = [init("w", np.ones((16, 4)))]
        nodes = [node("MatMul", [f"x{i}", "w"], [f"y{i}"]) for i in range(len(shapes))]
        ins = [vi(f"x{i}", s) for i, s in enumerate(shapes)]
        outs = [vi(f"y{i}", [*s[:-1], 4]) for i, s in enumerate(shapes)]
        return model(nodes, ins, outs, inits)

    g = from_onnx(mlp([[32, 16]]))
    assert g.sequences == 32  # was 1: throughput 32 times too low
    r = wia_hw.run(g)
    assert r.throughput == pytest.approx(32 / (r.latency_ms * 1e-3))
    assert from_onnx(mlp([[32, 16], [32, 5, 16]])).sequences == 32
    assert from_onnx(mlp([[32, 16], [3, 16]])).sequences == 1  # the inputs disagree
    assert from_onnx(mlp([[16]])).sequences == 1  # rank 1: one sample
    assert from_onnx(mlp([[32, 16]]), batch=32).sequences == 32


# -- bugs 6 and 7: GraphBuilder ------------------------------------------------------------
def test_resize_with_only_its_documented_size_runs_in_functional_mode():
    b = GraphBuilder("up", "fp32")
    b.op("resize", "up", [b.input("x", (1, 2, 4, 4))], size=(8, 8))
    b.op("resize", "up2", [b.input("x2", (1, 2, 4, 4))], size=(8, 8), scales=(2.0, 2.0))
    x = np.random.default_rng(3).standard_normal((1, 2, 4, 4)).astype(np.float32)
    out = wia_hw.run(b.graph(), mode="functional", inputs={"x": x, "x2": x}).outputs
    assert out["up"].shape == (1, 2, 8, 8)
    np.testing.assert_array_equal(out["up"], out["up2"])


@pytest.mark.parametrize(
    "kind,attrs,message",
    [
        ("transpose", {}, r"^op 'o' \(transpose\): attribute 'perm' is required$"),
        ("reshape", {}, r"^op 'o' \(reshape\): attribute 'shape' is required$"),
        ("reshape", {"shape": 32}, r"^op 'o' \(reshape\): shape 32 must be a list of positive"),
        ("softmax", {"axis": 5}, r"^op 'o' \(softmax\): axis 5 is out of range for input \[4, 8\]"),
        ("concat", {"axis": 5}, r"^op 'o' \(concat\): axis 5 is out of range for input \[4, 8\]"),
        ("slice", {"axis": -3, "stop": 2}, r"^op 'o' \(slice\): axis -3 is out of range"),
        ("cumsum", {"axis": 7}, r"^op 'o' \(cumsum\): axis 7 is out of range"),
        ("cumsum", {"axis": "1"}, r"^op 'o' \(cumsum\): axis '1' is out of range"),
    ],
)
def test_builder_attribute_errors_name_op_attribute_and_value(kind, attrs, message):
    b = GraphBuilder("g", "fp32")
    with pytest.raises(WorkloadError, match=message):
        b.op(kind, "o", [b.input("x", (4, 8))], **attrs)


def test_builder_negative_axes_still_count_from_the_end():
    b = GraphBuilder("g", "fp32")
    x = b.input("x", (4, 8))
    assert b.shape(b.op("concat", "c", [x, x], axis=-2)) == (8, 8)
    assert b.shape(b.op("slice", "s", [x], axis=-1, start=0, stop=2)) == (4, 2)


# -- from_torch ------------------------------------------------------------------------------
def _torch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    return torch


def torch_params(m):
    return sum(p.numel() for p in m.parameters())


def test_from_torch_does_not_depend_on_weight_values():
    """onnxscript's optimizer merged equal-valued weights, then the layers reading
    them: four heads initialised alike became one (1,024 parameters, not 4,224)."""
    torch = _torch()
    nn = torch.nn

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))

        def forward(self, x):
            return torch.stack([h(x) for h in self.heads], 0)

    x = torch.randn(64, 32)
    figures = []
    for zero in (False, True):
        torch.manual_seed(0)
        m = Heads()
        if zero:
            for p in m.parameters():
                nn.init.zeros_(p)
        g = wia_hw.from_torch(m, (x,))
        figures.append((g.parameters, g.macs(), wia_hw.run(g).latency_ms))
        assert g.parameters == torch_params(m) == 4224
    assert figures[0] == figures[1]


def test_from_torch_tied_head_counts_once():
    torch = _torch()
    nn = torch.nn

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.h = nn.Embedding(100, 32), nn.Linear(32, 100, bias=False)
            self.h.weight = self.e.weight

        def forward(self, ids):
            return self.h(self.e(ids))

    m = Tied()
    g = wia_hw.from_torch(m, (torch.randint(0, 100, (2, 12)),))
    assert g.parameters == torch_params(m) == 3200  # was 6,400


def test_from_torch_multihead_attention_is_recognised():
    torch = _torch()
    nn = torch.nn

    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.att = nn.MultiheadAttention(64, 4, batch_first=True)

        def forward(self, x):
            t = x.shape[1]
            mask = torch.triu(torch.full((t, t), float("-inf")), 1)
            return self.att(x, x, x, attn_mask=mask, need_weights=False)[0]

    for m in (Enc(), nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)):
        g = wia_hw.from_torch(m, (torch.randn(2, 16, 64),))
        scores = [o for o in g.ops if o.kind == "bmm" and o.attrs.get("transpose_b")]
        assert len(scores) == 1 and scores[0].attrs["scale"] == pytest.approx(0.25)
        soft = [o for o in g.ops if o.kind == "softmax"]
        assert [bool(o.attrs.get("causal")) for o in soft] == [isinstance(m, Enc)]
        assert g.parameters == torch_params(m)  # the mask is no parameter
        ctx = wia_hw.open_device("wia-npu")
        wia_hw.register_device_extension(ctx, "transformer_engine")
        assert any(k.provider == "transformer_engine" for k in ctx.run(g).kernels)


def test_from_torch_batch_and_constants():
    torch = _torch()
    nn = torch.nn
    mlp = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    assert wia_hw.from_torch(mlp, (torch.randn(32, 16),)).sequences == 32  # was 1

    class L(nn.Module):
        def __init__(self):
            super().__init__()
            self.r = nn.LSTM(16, 32, batch_first=True)

        def forward(self, x):
            return self.r(x)[0]

    lstm = L()
    for b in (1, 8):  # the zero initial states [1, B, H] are no parameters
        assert wia_hw.from_torch(lstm, (torch.randn(b, 7, 16),)).parameters == 6400
    conv = nn.Conv3d(4, 8, 3, padding=1)
    for n in (1, 4):
        assert wia_hw.from_torch(conv, (torch.randn(n, 4, 6, 8, 8),)).parameters == 872


def test_from_torch_rnn_and_learned_queries():
    torch = _torch()
    nn = torch.nn

    class R(nn.Module):
        def __init__(self):
            super().__init__()
            self.r = nn.RNN(16, 32, batch_first=True)

        def forward(self, x):
            return self.r(x)[0]

    g = wia_hw.from_torch(R(), (torch.randn(3, 7, 16),))
    assert g.macs() == 7 * 3 * (16 * 32 + 32 * 32)  # was 29,184: step 0's h0 @ W_hh

    class Q(nn.Module):
        def __init__(self):
            super().__init__()
            self.queries = nn.Parameter(torch.randn(16, 64))
            self.qproj, self.kproj = nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, x):
            return torch.softmax(self.kproj(x) @ self.qproj(self.queries).T, -1)

    m = Q()
    g = wia_hw.from_torch(m, (torch.randn(2, 32, 64),))
    assert g.parameters == torch_params(m)
    assert g.macs() == 16 * 64 * 64 + 2 * 32 * 64 * 64 + 2 * 32 * 64 * 16


def test_from_torch_unsupported_op_names_the_module():
    torch = _torch()

    class TopK(torch.nn.Module):
        def forward(self, x):
            return torch.topk(x, 2).values

    with pytest.raises(
        WorkloadError, match=r"^TopK \(torch.export\): 1 unsupported ONNX op type: TopK x1"
    ):
        wia_hw.from_torch(TopK(), (torch.randn(2, 8),))


def test_a_sequence_dim_named_alone_must_be_the_models(tmp_path):
    # from_onnx(dims={"seq": 128}) and `import --dim seq=128` on a model whose sequence
    # dim is fixed were silently ignored (the 16-token MACs), while `run --seq` refused;
    # now they say so
    import onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, 64])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "fixedseq", [x], [y])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.warns(UserWarning, match=r"dims\['seq'\]=128 is not used: .*symbolic dims: batch"):
        g = wia_hw.from_onnx(model, dims={"batch": 2, "seq": 128})
    assert g.tensors["x"].shape == (2, 16, 64)
    with pytest.raises(wia_hw.WorkloadError, match="no input has a symbolic sequence dim"):
        path = tmp_path / "fixedseq.onnx"
        onnx.save(model, path)
        wia_hw.workloads.build(str(path), batch=2, seq=128)
    assert wia_hw.from_onnx(model, dims={"batch": 2}).flops() > 0
