"""Training iterations: backward derivation, DDP buckets and overlap, Megatron TP,
byte conservation, the communication recommendation, the CLI and bad input (issue #11).

Small graphs (BERT-Large with 2 layers, short sequences) on small clusters keep this
fast; the full-size figures are in ``benchmarks/cluster_speed.py``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw.cli import cli
from wia_hw.graph import GraphBuilder
from wia_hw.train import TPError, time_kernels, train_iteration, training_kernels
from wia_hw.workloads import bert_large


def cluster(n: int, **links) -> wia_hw.ClusterSpec:
    links.setdefault("bandwidth_gbs", 100)
    links.setdefault("latency_us", 2.0)
    links.setdefault("topology", "ring")
    return wia_hw.load_spec(
        {"schema_version": 1, "name": f"t{n}", "devices": n, "device": "wia-npu", "links": links}
    )


def small_bert(batch: int = 4, seq: int = 32, layers: int = 2) -> wia_hw.Graph:
    return bert_large(batch=batch, seq=seq, layers=layers)


# -- backward derivation ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_linear_backward_gemm_shapes(seed):
    rng = np.random.default_rng(seed)
    b_, s_, k_, n_ = (int(v) for v in rng.integers(2, 40, size=4))
    g = GraphBuilder("lin", "fp16")
    x = g.input("x", (b_, s_, k_))
    h = g.linear("fc0", x, k_)  # a first layer whose input needs no gradient
    g.linear("fc", h, n_)
    tk = training_kernels(g.graph())
    by = {k.name: k for k in tk.backward}
    m = b_ * s_
    # dX = dY @ W^T: [M, N] x [K, N]^T -> [M, K]
    dx = by["fc.grad_input"]
    assert dx.kind == "bmm" and dict(dx.attrs)["transpose_b"]
    assert dx.inputs == (((1, m, n_), "fp16"), ((1, k_, n_), "fp16"))
    assert dx.output == ((1, m, k_), "fp16")
    # dW = X^T @ dY: [K, M] x [M, N] -> [K, N]
    dw = by["fc.grad_weight"]
    assert dw.kind == "matmul" and dw.inputs == (((k_, m), "fp16"), ((m, n_), "fp16"))
    assert dw.output == ((k_, n_), "fp16") and dw.params == ("fc.weight",)
    # db: the column sums of dY, reading M x N and writing N
    db = by["fc.grad_bias"]
    assert math.prod(db.inputs[0][0]) == m * n_ and math.prod(db.output[0]) == n_
    assert db.params == ("fc.bias",)
    # each gradient GEMM does the forward's MACs; the first layer has no dX
    assert dx.macs == dw.macs == m * k_ * n_
    assert "fc0.grad_input" not in by and by["fc0.grad_weight"].macs == m * k_ * k_


def test_attention_backward_shapes_and_macs():
    g = small_bert(batch=2, seq=16, layers=1)
    tk = training_kernels(g)
    by = {k.name: k for k in tk.backward}
    bh, s, dh = 2 * 16, 16, 64
    # scores = q @ k^T: dq = dS @ k, dk = dS^T @ q
    assert by["layer0.attention_scores.grad_a"].inputs == (
        ((bh, s, s), "fp16"),
        ((bh, s, dh), "fp16"),
    )
    assert by["layer0.attention_scores.grad_b"].output == ((bh, s, dh), "fp16")
    # ctx = P @ v: dP = dC @ v^T, dv = P^T @ dC
    assert dict(by["layer0.attention_context.grad_a"].attrs)["transpose_b"]
    assert by["layer0.attention_context.grad_b"].inputs[0] == ((bh, s, s), "fp16")
    # softmax, layer norm and gelu have their own gradient kernels, reading dY
    sm = by["layer0.attention_softmax.grad"]
    assert sm.kind == "softmax" and len(sm.inputs) == 2 and sm.flops == 4 * bh * s * s
    ln = by["layer0.ffn_layer_norm.grad_input"]
    assert ln.kind == "layer_norm" and ln.flops == 10 * 2 * s * 1024
    ge = by["layer0.feed_forward_gelu.grad"]
    assert ge.kind == "gelu" and ge.flops == 13 * 2 * s * 4096
    # q, k, v gradients are joined (SplitBackward's cat); residual branches summed
    assert by["layer0.attention_split_heads.grad_join"].kind == "concat"
    assert sum(k.name.endswith("grad_accumulate0") for k in tk.backward) == 2
    # every GEMM but the ones on graph inputs does its forward MACs twice in backward
    fwd = sum(k.macs for k in tk.forward)
    assert sum(k.macs for k in tk.backward) == 2 * fwd


def test_every_parameter_gets_one_gradient_and_timing_is_cached():
    g = small_bert()
    tk = training_kernels(g)
    names = [t.name for t in tk.params]
    assert sorted(names) == sorted(t.name for t in g.tensors.values() if t.kind == "weight")
    assert tk.param_bytes == g.weight_bytes
    owned = [p for k in tk.backward for p in k.params]
    assert sorted(owned) == sorted(names)  # each parameter completed exactly once
    assert names[0] == "classifier.weight" and names[-1].startswith("embeddings.")
    spec = wia_hw.load_spec("wia-npu")
    c1 = time_kernels(spec, tk.backward)
    c2 = time_kernels(spec, tk.backward)
    assert c1 == c2 and all(v > 0 for v in c1.values())


# -- data parallel ------------------------------------------------------------------------


def test_overlap_beats_serial_and_bytes_are_conserved():
    g = small_bert(batch=8, seq=64)
    spec = cluster(4)
    ov = train_iteration(g, cluster=spec, bucket_mb=2, first_bucket_mb=1)
    se = train_iteration(g, cluster=spec, bucket_mb=2, first_bucket_mb=1, overlap=False)
    assert ov.overlap_efficiency > se.overlap_efficiency
    assert ov.iteration_ms < se.iteration_ms
    assert se.overlap_efficiency == 0.0
    # same compute, same buckets; only the placement of communication differs
    assert ov.compute_cycles == se.compute_cycles and ov.buckets == se.buckets
    for r in (ov, se):
        assert r.grad_bytes == r.param_bytes == g.weight_bytes
        assert r.collective_bytes == {"dp.all_reduce": g.weight_bytes}
        assert r.collective_calls["dp.all_reduce"] == len(r.buckets)
        # a ring all-reduce of S bytes over n ranks sends 2 (n - 1) S
        assert r.sent_bytes["dp.all_reduce"] == 2 * 3 * g.weight_bytes
        assert sum(rec.sent_bytes for rec in r.records) == r.sent_bytes["dp.all_reduce"]
        total = r.forward_ms + r.backward_ms + r.optimizer_ms + r.exposed_comm_ms
        assert total == pytest.approx(r.iteration_ms)
    # buckets: the first closes at 1 MiB, the others at 2 MiB, in gradient order
    sizes = [b.nbytes for b in ov.buckets]
    assert sizes[0] >= 1 << 20 and all(s >= 2 << 20 for s in sizes[1:-1])
    order = [p for b in ov.buckets for p in b.params]
    assert order == [t.name for t in ov.kernels.params]


def test_bucket_size_changes_the_calls_not_the_bytes():
    g = small_bert(batch=2, seq=16)
    spec = cluster(2)
    a = train_iteration(g, cluster=spec, bucket_mb=1)
    b = train_iteration(g, cluster=spec, bucket_mb=64)
    assert len(a.buckets) > len(b.buckets)
    assert a.collective_bytes == b.collective_bytes == {"dp.all_reduce": g.weight_bytes}


def test_profiling_a_training_iteration():
    g = small_bert(batch=4, seq=32)
    comm = wia_hw.open_cluster(cluster(4))
    session = wia_hw.start_comm_profiling(comm)
    r = train_iteration(g, cluster=comm, bucket_mb=2)
    rep = wia_hw.stop_comm_profiling(session)
    assert rep.overlap_efficiency == pytest.approx(r.overlap_efficiency)
    (ar,) = rep.collective_stats
    assert ar.name == "all_reduce" and ar.count == len(r.buckets)
    assert ar.total_data_gb == pytest.approx(g.weight_bytes / 1e9)
    assert rep.total_compute_time_s * 1e3 == pytest.approx(
        r.forward_ms + r.backward_ms + r.optimizer_ms
    )


# -- tensor parallel ----------------------------------------------------------------------


def test_tensor_parallel_all_reduces_per_layer():
    layers, batch, seq, tp, dp = 3, 2, 16, 4, 2
    g = small_bert(batch=batch, seq=seq, layers=layers)
    spec = cluster(8, topology="hierarchical", devices_per_node=4, inter_node_bandwidth_gbs=25)
    r = train_iteration(g, cluster=spec, dp=dp, tp=tp)
    act = batch * seq * 1024 * 2  # one [B, S, H] fp16 tensor
    for phase in ("forward", "backward"):
        # 2 per layer (attention output, MLP output; their inputs' gradients), per group
        assert r.collective_calls[f"tp.all_reduce.{phase}"] == 2 * layers * dp
        assert r.collective_bytes[f"tp.all_reduce.{phase}"] == 2 * layers * dp * act
    tp_recs = [x for x in r.records if len(x.ranks) == tp]
    assert all(x.ranks in ((0, 1, 2, 3), (4, 5, 6, 7)) for x in tp_recs)  # inside a node
    dp_recs = [x for x in r.records if len(x.ranks) == dp]
    assert {x.ranks for x in dp_recs} == {(t, t + tp) for t in range(tp)}
    # each rank holds 1/tp of the split weights: the QKV and MLP widths shrink
    k = {x.name: x for x in r.kernels.forward}
    assert k["layer0.attention_qkv_projection"].inputs[1][0] == (1024, 3 * 1024 // tp)
    assert k["layer0.feed_forward_output"].inputs[1][0] == (4096 // tp, 1024)
    assert k["layer0.attention_scores"].output[0] == (batch * 16 // tp, seq, seq)
    # fp16 bytes of the split tensors: QKV weight and bias, output weight, fc1 weight and
    # bias, fc2 weight (the row-parallel biases are added once, after the all-reduce)
    split = 2 * layers * (1024 * 3072 + 3072 + 1024 * 1024 + 1024 * 4096 + 4096 + 4096 * 1024)
    assert r.param_bytes == g.weight_bytes - split * (tp - 1) // tp
    assert r.collective_bytes["dp.all_reduce"] == tp * r.param_bytes


# -- the recommendation -------------------------------------------------------------------


def test_recommendation_measures_the_overlap_gain():
    g = small_bert(batch=8, seq=64)
    spec = cluster(4)
    se = train_iteration(g, cluster=spec, bucket_mb=2, overlap=False)
    recs = wia_hw.analyze_performance(se, wia_hw.AnalysisConfig(priority_threshold="low"))
    (rec,) = recs.recommendations
    assert rec.title == "Inefficient Communication Pattern"
    ov = train_iteration(g, cluster=spec, bucket_mb=2)
    assert rec.baseline_ms == pytest.approx(se.iteration_ms)
    assert rec.modified_ms == pytest.approx(ov.iteration_ms)
    assert rec.estimated_improvement == pytest.approx(
        (se.iteration_ms - ov.iteration_ms) / se.iteration_ms
    )
    assert rec.estimated_improvement > 0
    assert not wia_hw.analyze_performance(ov).considered  # nothing to say once overlapped


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(dp=2, tp=3), r"tp=3 does not divide the 16 attention heads of 'bert-large'"),
        (dict(dp=4, tp=3), r"dp x tp = 4 x 3 = 12 devices, t6 has 6"),
        (dict(dp=1, tp=2), r"dp x tp = 1 x 2 = 2 leaves 4 of the 6 devices of t6 idle"),
        (dict(tp=4), r"tp=4 does not divide the 6 devices of t6"),
        (dict(tp=0), r"tp must be a positive integer, got 0"),
        (dict(bucket_mb=0), r"bucket_mb must be a positive finite number, got 0"),
        (dict(optimizer="lamb"), r"optimizer must be one of sgd, adam, got 'lamb'"),
        (dict(first_bucket_mb=float("inf")), r"first_bucket_mb must be a positive finite number"),
        (dict(bucket_mb=float("nan")), r"bucket_mb must be a positive finite number, got nan"),
    ],
)
def test_bad_input_is_one_line(kw, match):
    with pytest.raises(wia_hw.WorkloadError, match=match) as e:
        train_iteration(small_bert(batch=2, seq=8, layers=1), cluster=cluster(6), **kw)
    assert "\n" not in str(e.value)


def test_tp_needs_a_transformer_and_float_weights():
    g = GraphBuilder("mlp", "fp16")
    g.linear("fc", g.input("x", (4, 8)), 8)
    with pytest.raises(TPError, match=r"tp=2: graph 'mlp' has no transformer layers"):
        train_iteration(g.graph(), cluster=cluster(2), tp=2)
    with pytest.raises(wia_hw.WorkloadError, match=r"int8 weights .* is inference-only"):
        train_iteration(bert_large(2, 8, "int8", layers=1), cluster=cluster(2))
    fused = wia_hw.apply_fusion(bert_large(2, 8, layers=1))
    with pytest.raises(wia_hw.WorkloadError, match=r"is fused \(apply_fusion marked op"):
        train_iteration(fused, cluster=cluster(2))
    ids = GraphBuilder("ids", "fp16")
    ids.op("relu", "r", [ids.input("x", (4, 8))])
    with pytest.raises(wia_hw.WorkloadError, match=r"graph 'ids' has no float parameters"):
        train_iteration(ids.graph(), cluster=cluster(2))


# -- CLI ----------------------------------------------------------------------------------


def test_cli_train():
    args = ["train", "bert-base", "-c", "wia-cluster-8", "-b", "2", "-s", "16"]
    res = CliRunner().invoke(cli, args + ["--no-overlap"])
    assert res.exit_code == 0, res.output
    assert "Iteration time:" in res.output and "overlap efficiency 0.0%" in res.output
    assert "[" in res.output and "Inefficient Communication Pattern" in res.output
    res = CliRunner().invoke(cli, args + ["--json", "--tp", "2"])
    d = json.loads(res.output)
    assert d["dp"] == 4 and d["tp"] == 2 and d["breakdown_ms"]["forward"] > 0
    bad = CliRunner().invoke(cli, ["train", "bert-base", "--tp", "5"])
    assert bad.exit_code == 2
    assert bad.output.strip() == (
        "wia-hw: error: train_iteration: tp=5 does not divide the 8 devices of wia-cluster-8"
    )


def test_faster_links_are_never_slower_and_buckets_close_at_their_cap():
    g = small_bert(batch=2, seq=16)
    times = []
    for bw in (25, 100, 400):
        r = train_iteration(g, cluster=cluster(4, bandwidth_gbs=bw), bucket_mb=2)
        times.append(r.iteration_ms)
        sizes = {t.name: t.nbytes for t in r.kernels.params}
        for i, b in enumerate(r.buckets[:-1]):  # DDP: a bucket closes once it reaches its cap
            cap = (1 if i == 0 else 2) << 20
            assert b.nbytes >= cap and b.nbytes - sizes[b.params[-1]] < cap
    assert times == sorted(times, reverse=True)
    assert r.compute_cycles == train_iteration(g, cluster=cluster(4), bucket_mb=2).compute_cycles


def test_kernel_timings_do_not_depend_on_what_was_timed_before():
    from wia_hw.train import _backward

    spec = wia_hw.load_spec("wia-npu")
    tk = training_kernels(small_bert())
    kerns = list(tk.backward)
    _backward._CACHE.clear()
    alone = {sig: time_kernels(spec, [k])[sig] for k in kerns[::-1] if (sig := k.signature)}
    _backward._CACHE.clear()
    together = time_kernels(spec, kerns)  # all at once, in graph order
    _backward._CACHE.clear()
    assert together == alone


@pytest.mark.parametrize("seed", range(6))
def test_conv_backward_shapes_for_any_window(seed):
    """Rectangular kernels, strides, dilations and asymmetric pads: each gradient
    convolution's own shape rule gives the gradient's shape, and dW and dX do the
    forward's MACs (dX as a full convolution when stride and dilation are 1)."""
    from wia_hw.graph import Op, infer_shapes

    rng = np.random.default_rng(seed)
    kh, kw = (int(v) for v in rng.integers(1, 5, size=2))
    stride = [int(v) for v in rng.integers(1, 3, size=2)] if seed % 2 else 1
    dil = [int(v) for v in rng.integers(1, 3, size=2)] if seed % 3 == 1 else 1
    pad = [int(rng.integers(0, k)) for k in (kh, kw, kh, kw)]
    c, o = (int(v) for v in rng.integers(1, 6, size=2))
    g = GraphBuilder("conv", "fp16")
    x = g.input("x", (2, c, 11, 9))
    h = g.op("conv2d", "c0", [x, g.weight("w0", (c, c, 1, 1))])  # so x's grad is wanted
    g.op("conv2d", "c1", [h, g.weight("w1", (o, c, kh, kw))], stride=stride, pad=pad, dilation=dil)
    graph = g.graph()
    fwd = [op for op in graph.ops if op.name == "c1"][0]
    macs = graph.flops(fwd) // 2
    by = {k.name: k for k in training_kernels(graph).backward}
    dw = by["c1.grad_weight"]
    got = infer_shapes(
        Op(dw.name, "conv2d", ("a", "b"), ("y",), attrs=dict(dw.attrs)), [s for s, _ in dw.inputs]
    )
    assert got == [dw.output[0]] == [(c, o, kh, kw)]
    assert dw.macs == macs
    if stride in (1, [1, 1]) and dil in (1, [1, 1]):
        dx = by["c1.grad_input"]
        got = infer_shapes(
            Op(dx.name, "conv2d", ("a", "b"), ("y",), attrs=dict(dx.attrs)),
            [s for s, _ in dx.inputs],
        )
        assert got == [dx.output[0]] == [(2, c, 11, 9)]
    else:
        assert by["c1.grad_col"].macs == macs


def test_where_backward_selects_the_gradient_into_each_branch():
    g = GraphBuilder("w", "fp16")
    x = g.input("x", (4, 8))
    h = g.linear("fc", x, 8)
    c = g.input("c", (4, 8), "bool")
    w = g.weight("fill", (8,))
    g.op("where", "sel", [c, h, w])
    tk = training_kernels(g.graph())
    by = {k.name: k for k in tk.backward}
    assert by["sel.grad_1"].kind == "where" and by["sel.grad_1"].output[0] == (4, 8)
    assert by["sel.grad_2"].kind == "where"
    assert math.prod(by["sel.grad_2_sum"].output[0]) == 8  # the broadcast fill: summed
    assert "fill" in by["sel.grad_2_sum"].params
