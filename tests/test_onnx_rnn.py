"""ONNX's recurrent ops (wia_hw/workloads/_onnx_rnn.py): LSTM, GRU and RNN unrolled
into GEMMs and vector ops compute what ONNX's reference evaluator computes, in every
direction, with and without biases and initial states, and cost the MACs of their
GEMMs exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import wia_hw
from wia_hw import from_onnx
from wia_hw.graph import GEMM_KINDS

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx_node_tests import run_node_cases  # noqa: E402

F = TensorProto.FLOAT
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def rnn_model(op, direction, bias, h0, lbr=0, seq=5, batch=3, inp=4, hid=6, layout=0, **kw):
    """A one-node model with seeded weights; returns (model, feeds)."""
    rng = np.random.default_rng(len(op) + 7 * bias + 3 * h0 + lbr)
    nd = 2 if direction == "bidirectional" else 1
    ng = GATES[op]
    inits = [
        numpy_helper.from_array(
            (rng.standard_normal((nd, ng * hid, inp)) * 0.5).astype(np.float32), "W"
        ),
        numpy_helper.from_array(
            (rng.standard_normal((nd, ng * hid, hid)) * 0.5).astype(np.float32), "R"
        ),
    ]
    ins = ["x", "W", "R", ""]
    if bias:
        inits.append(
            numpy_helper.from_array(
                (rng.standard_normal((nd, 2 * ng * hid)) * 0.5).astype(np.float32), "B"
            )
        )
        ins[3] = "B"
    xshape = [batch, seq, inp] if layout else [seq, batch, inp]
    sshape = [batch, nd, hid] if layout else [nd, batch, hid]
    feeds = {"x": rng.standard_normal(xshape).astype(np.float32)}
    vis = [helper.make_tensor_value_info("x", F, xshape)]
    if h0:
        ins += ["", "h0"] + (["c0"] if op == "LSTM" else [])
        for s in ("h0", "c0") if op == "LSTM" else ("h0",):
            feeds[s] = rng.standard_normal(sshape).astype(np.float32)
            vis.append(helper.make_tensor_value_info(s, F, sshape))
    while ins[-1] == "":
        ins.pop()
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    attrs = dict(hidden_size=hid, direction=direction, layout=layout, **kw)
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(op, ins, outs, name="rnn", **attrs)
    g = helper.make_graph(
        [node], "r", vis, [helper.make_tensor_value_info(o, F, None) for o in outs], inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)]), feeds


CASES = [
    (op, d, b, h, lbr)
    for op in GATES
    for d, b, h in itertools.product(("forward", "reverse", "bidirectional"), (0, 1), (0, 1))
    for lbr in ((0, 1) if op == "GRU" else (0,))
]


@pytest.mark.parametrize("op, direction, bias, h0, lbr", CASES)
def test_unrolled_recurrence_computes_as_onnx(op, direction, bias, h0, lbr):
    m, feeds = rnn_model(op, direction, bias, h0, lbr)
    want = ReferenceEvaluator(m).run(None, feeds)
    g = from_onnx(m)
    out = wia_hw.run(g, device="wia-npu", mode="functional", inputs=feeds).outputs
    for name, w in zip(("Y", "Y_h", "Y_c"), want, strict=False):
        np.testing.assert_allclose(out[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
    # MACs: one input GEMM per direction, then one recurrence GEMM per step (none on
    # the first step from a zero state; GRU without linear_before_reset: two)
    seq, batch, inp, hid = 5, 3, 4, 6
    dirs = 2 if direction == "bidirectional" else 1
    ng = GATES[op]
    steps = seq if h0 else seq - 1
    rec = batch * hid * ng * hid if not (op == "GRU" and not lbr) else batch * hid * 3 * hid
    assert g.macs() == dirs * (seq * batch * inp * ng * hid + steps * rec)


def test_batch_first_layout_and_peepholes():
    m, feeds = rnn_model("GRU", "bidirectional", 1, 1, 1, layout=1)
    want = ReferenceEvaluator(m).run(None, feeds)
    out = wia_hw.run(from_onnx(m), mode="functional", inputs=feeds).outputs
    for name, w in zip(("Y", "Y_h"), want, strict=True):
        np.testing.assert_allclose(out[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
    assert out["Y"].shape == (3, 5, 2, 6)


def test_onnx_node_tests_of_the_recurrent_ops():
    """Every node test the onnx package ships for LSTM, GRU and RNN (peepholes, batch-first
    layout, sequence lengths, initial biases) gives ONNX's expected outputs."""
    matched, refused = run_node_cases(("LSTM", "GRU", "RNN"))
    assert not refused
    assert len(matched) >= 18
    assert {"test_lstm_with_peepholes", "test_gru_batchwise", "test_gru_seq_length"} <= set(matched)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"clip": 3.0}, "clip is not modelled"),
        ({"activations": ["Relu"]}, r"activations \['Relu'\] are not modelled"),
        ({"input_forget": 1}, "input_forget is not modelled"),
    ],
)
def test_refusals_name_the_node(kw, match):
    op = "LSTM" if "input_forget" in kw else "RNN"
    m, _ = rnn_model(op, "forward", 1, 0, **kw)
    with pytest.raises(wia_hw.WorkloadError, match=rf"^ONNX node 'rnn' \({op}\): {match}"):
        from_onnx(m)


def test_timing_runs_every_step_on_the_array():
    m, _ = rnn_model("LSTM", "bidirectional", 1, 0, seq=16, batch=8, inp=64, hid=128)
    g = from_onnx(m)
    gemms = [o for o in g.ops if o.kind in GEMM_KINDS]
    assert len(gemms) == 2 * (1 + 15)
    r = wia_hw.run(g, device="wia-npu")
    assert r.latency_ms > 0 and sum(k.flops for k in r.kernels) >= g.flops()
