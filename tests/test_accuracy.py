"""wia_hw.accuracy: a real model trained at test time (scikit-learn's digits MLP),
imported into a graph, evaluated in functional mode in fp32 and int8 PTQ (every
calibration method) on the held-out split; BERT-Large's final hidden states fp16 vs
int8 on a reduced model; one-line errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from wia_hw import QuantizationConfig, WorkloadError, quantize_model
from wia_hw.accuracy import (
    GraphEvaluator,
    agreement_stats,
    calibration_batches,
    compare,
    mlp_to_graph,
    train_digits_mlp,
)
from wia_hw.workloads import build

BATCH = 64


@pytest.fixture(scope="module")
def digits():
    clf, split = train_digits_mlp(hidden=(64, 32), seed=0, max_iter=200)
    g, w = mlp_to_graph(clf, BATCH)
    ref = GraphEvaluator(g, w).predict(split[1])
    return clf, split, g, w, ref


def _numpy_logits(clf, x):
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(zip(clf.coefs_, clf.intercepts_, strict=True)):
        h = h @ w + b
        if i < len(clf.coefs_) - 1:
            h = np.maximum(h, 0)
    return h


def test_the_imported_fp32_graph_is_the_trained_model(digits):
    clf, (_, x_test, _, y_test), _, _, ref = digits
    # the device's fp32 GEMMs (sequential fp32 MACs over its tiles) vs float64 numpy
    logits = _numpy_logits(clf, x_test)
    assert np.max(np.abs(ref - logits)) <= 1e-4 * np.max(np.abs(logits))
    np.testing.assert_array_equal(ref.argmax(1), clf.predict(x_test))
    assert compare("fp32", ref, ref, y_test).accuracy == pytest.approx(
        100 * clf.score(x_test, y_test)
    )


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse", "entropy"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_int8_ptq_is_within_one_point_of_fp32_on_the_held_out_split(digits, method, per_channel):
    _, (x_train, x_test, _, y_test), g, w, ref = digits
    cfg = QuantizationConfig(method=method, per_channel=per_channel, calibration_batches=8)
    q = quantize_model(g, cfg, calibration_batches(x_train, BATCH, 8), weights=w)
    out = GraphEvaluator(q).predict(x_test)
    rep = compare(f"int8 {method}", out, ref, y_test)
    assert rep.samples == len(y_test) == 540
    assert rep.reference_accuracy > 95.0  # a real, trained model
    assert abs(rep.accuracy_delta) <= 1.0
    assert rep.agreement >= 98.0
    assert rep.cosine > 0.999


def test_bert_final_hidden_states_fp16_vs_int8_on_a_reduced_model():
    layers = 1  # reduced: 1 of 24 layers, b2 s16
    g = build("bert-large", batch=2, seq=16, layers=layers)
    rng = np.random.default_rng(0)

    def batch():
        return {
            "input_ids": rng.integers(0, 30522, (2, 16)),
            "position_ids": np.arange(16),
            "token_type_ids": rng.integers(0, 2, (2, 16)),
        }

    q = quantize_model(g, QuantizationConfig(calibration_batches=2), [batch(), batch()])
    test = batch()
    hidden = f"layer{layers - 1}.ffn_layer_norm"
    ref = GraphEvaluator(g, q.float_weights).execute(test).values[hidden]
    out = GraphEvaluator(q).execute(test).values[hidden]
    cos, err = agreement_stats(out, ref)
    assert cos > 0.9995
    assert err < 0.5  # layer-normed states are O(1)


def test_agreement_stats_and_compare():
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    assert agreement_stats(a, a) == (pytest.approx(1.0, abs=1e-15), 0.0)
    cos, err = agreement_stats(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert cos == 0.0 and err == 1.0
    rep = compare(
        "x",
        np.array([[0.1, 0.9], [0.8, 0.2]]),
        np.array([[0.2, 0.8], [0.3, 0.7]]),
        np.array([1, 0]),
    )
    assert (rep.accuracy, rep.reference_accuracy, rep.agreement) == (100.0, 50.0, 50.0)
    assert rep.accuracy_delta == 50.0
    with pytest.raises(
        WorkloadError,
        match=r"compare 'x': outputs \[2\] and reference "
        r"\[3\] differ in shape",
    ):
        compare("x", np.zeros(2), np.zeros(3))


def test_bad_input_is_one_line(digits, monkeypatch):
    clf, (_, x_test, _, _), g, w, _ = digits
    with pytest.raises(
        WorkloadError,
        match=r"predict: samples of shape \[63\], input 'x' "
        r"needs \[64\]",
    ):
        GraphEvaluator(g, w).predict(x_test[:, :63])
    with pytest.raises(
        WorkloadError,
        match=r"mlp_to_graph: layer 1: weight \[5, 3\] and "
        r"bias \[3\] do not follow \[64, 4\]",
    ):
        mlp_to_graph([(np.zeros((8, 4)), np.zeros(4)), (np.zeros((5, 3)), np.zeros(3))], 64)
    with pytest.raises(WorkloadError, match=r"mlp_to_graph: the model has no layer"):
        mlp_to_graph([], 4)
    with pytest.raises(TypeError, match=r"GraphEvaluator takes a Graph, got str"):
        GraphEvaluator("mlp")
    monkeypatch.setitem(sys.modules, "sklearn", None)
    from wia_hw.accuracy import load_digits_split

    with pytest.raises(ImportError, match=r"wia_hw.accuracy needs scikit-learn"):
        load_digits_split()


def _logits(seed=0, n=100, classes=10):
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((n, classes))
    ref = out + 0.01 * rng.standard_normal((n, classes))
    return out, ref, ref.argmax(1)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda o, r, y: (o, r, y[:99]), r"labels \[99\] must hold one class id per sample, "),
        (lambda o, r, y: (o, r, y[:1]), r"labels \[1\] must hold one class id per sample"),
        (lambda o, r, y: (o, r, y[:, None]), r"labels \[100, 1\] must hold one class id"),
        (lambda o, r, y: (o, r, np.eye(10)[y]), r"labels \[100, 10\] .*one-hot\? give argmax"),
        (lambda o, r, y: (o, r, y + 0.5), r"labels must be integer class ids, got \d+\.5 at \[0\]"),
        (lambda o, r, y: (o, r, y.astype(str)), r"labels must be integer class ids, got dtype <U"),
        (lambda o, r, y: (o, r, y + 10), r"labels must be class ids 0\.\.9 \(the outputs have 10"),
        (lambda o, r, y: (o, r, y - 10), r"labels must be class ids 0\.\.9 .*got -\d+ at \[0\]"),
        (
            lambda o, r, y: (o[:, 0], r[:, 0], y),
            r"with labels, outputs must be \[samples, classes\]",
        ),
        (lambda o, r, y: (o[:0], r[:0], y[:0]), r"outputs \[0, 10\] hold no sample"),
        (lambda o, r, y: (np.full_like(o, np.nan), r, y), r"outputs hold 1000 non-finite value"),
        (lambda o, r, y: (o, np.where(r > 2, np.inf, r), y), r"reference hold \d+ non-finite"),
    ],
)
def test_compare_refuses_labels_and_outputs_that_do_not_fit(make, match):
    # seeded random logits; each case used to broadcast, mis-score or raise numpy's error
    out, ref, y = make(*_logits(seed=3))
    with pytest.raises(WorkloadError, match=r"^compare 'q': " + match) as e:
        compare("q", out, ref, y)
    assert "\n" not in str(e.value)


def test_compare_still_scores_good_input_and_unlabelled_outputs():
    out, ref, y = _logits(seed=5)
    o2 = out.copy()
    o2[:7] = -o2[:7]  # some predictions change
    rep = compare("q", o2, ref, y.astype(np.float64))  # integral float labels are fine
    want = 100.0 * np.mean(o2.argmax(1) == y)
    assert rep.accuracy == pytest.approx(want) and rep.reference_accuracy == 100.0
    assert compare("r", out[:, 0], ref[:, 0]).samples == 100  # regression-like, no labels
    with pytest.raises(WorkloadError, match=r"^agreement_stats: outputs hold 1 non-finite"):
        agreement_stats(np.where(np.arange(5) == 2, np.nan, 1.0), np.ones(5))
    with pytest.raises(WorkloadError, match=r"^agreement_stats: outputs \[5\] and reference \[4\]"):
        agreement_stats(np.ones(5), np.ones(4))


def _two_heads(seed=0):
    from wia_hw.graph import GraphBuilder

    rng = np.random.default_rng(seed)
    b = GraphBuilder("heads", "fp32")
    x = b.input("x", (4, 6))
    b.linear("head_a", x, 3)
    b.linear("head_b", x, 5)
    w = {
        "head_a.weight": rng.standard_normal((6, 3)).astype(np.float32),
        "head_a.bias": rng.standard_normal(3).astype(np.float32),
        "head_b.weight": rng.standard_normal((6, 5)).astype(np.float32),
        "head_b.bias": rng.standard_normal(5).astype(np.float32),
    }
    return b.graph(sequences=4), w, rng.standard_normal((10, 6)).astype(np.float32)


def test_predict_needs_output_when_the_graph_has_several():
    g, w, x = _two_heads(seed=11)
    ev = GraphEvaluator(g, w)
    # it silently returned the first output
    with pytest.raises(
        WorkloadError,
        match=r"^predict: graph 'heads' has outputs \['head_a', 'head_b'\]; name one with output=$",
    ):
        ev.predict(x)
    with pytest.raises(WorkloadError, match=r"^predict: output 'head_c' is not one of graph"):
        ev.predict(x, output="head_c")
    for head, n in (("head_a", 3), ("head_b", 5)):
        want = x.astype(np.float64) @ w[f"{head}.weight"] + w[f"{head}.bias"]
        got = ev.predict(x, output=head)
        assert got.shape == (10, n)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(WorkloadError, match=r"^predict: no sample given for input 'x'$"):
        ev.predict(x[:0], output="head_a")


def test_predict_refuses_a_graph_of_several_inputs():
    from wia_hw.graph import GraphBuilder

    b = GraphBuilder("two_in", "fp32")
    s = b.op("add", "sum", [b.input("x", (4, 6)), b.input("z", (4, 6))])
    b.op("relu", "out", [s])
    x = np.random.default_rng(2).standard_normal((9, 6))
    with pytest.raises(
        WorkloadError, match=r"^predict: graph 'two_in' has inputs \['x', 'z'\]; predict feeds one"
    ):
        GraphEvaluator(b.graph(sequences=4)).predict(x)
