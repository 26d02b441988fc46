"""Fixes from a bug hunt over the optimisation and accuracy paths: fusion keeps a
declared model output, a binary MLP's graph predicts as scikit-learn does, a quantised
graph refuses a NaN instead of coding it, the analog ``g_max_us`` is declared metadata,
and one-line errors for numpy config values, a ``names:`` policy naming a non-GEMM op,
non-numeric weights and a negative seed."""

from __future__ import annotations

import numpy as np
import pytest

import wia_hw
from wia_hw import GraphBuilder, QuantizationConfig, WorkloadError, apply_fusion, quantize_model
from wia_hw.accuracy import GraphEvaluator, calibration_batches, compare, mlp_to_graph
from wia_hw.graph import Graph, QuantParams

# -- 1. fusion never keeps a declared model output on chip --------------------------------


def _gemm_gelu(declared: bool) -> Graph:
    b = GraphBuilder("two_out", "fp16")
    h = b.linear("fc", b.input("x", (1024, 1024)), 2048)
    y = b.op("gelu", "act", [h])
    g = b.graph()
    if declared:
        g.declared_outputs = [h, y]  # an ONNX model returning (h, gelu(h))
    return g


def _add_ln(declared: bool) -> Graph:
    b = GraphBuilder("res_out", "fp32")
    a, c = b.input("a", (2048, 1024)), b.input("c", (2048, 1024))
    r = b.op("add", "res", [a, c])
    y = b.op("layer_norm", "ln", [r, b.weight("ln.g", (1024,)), b.weight("ln.b", (1024,))])
    g = b.graph()
    if declared:
        g.declared_outputs = [r, y]  # an ONNX model returning (a + b, ln(a + b))
    return g


def _compulsory(g: Graph) -> int:
    ins = sum(t.nbytes for t in g.tensors.values() if t.kind in ("input", "weight"))
    return ins + sum(g.tensors[n].nbytes for n in g.declared_outputs)


@pytest.mark.parametrize("make", [_gemm_gelu, _add_ln], ids=["gemm_gelu", "add_layer_norm"])
def test_fusion_writes_a_declared_intermediate(make):
    """A chain whose intermediate is a declared output is not fused: the fused run moves
    at least the compulsory bytes (inputs, weights and every declared output once)."""
    plain = make(declared=False)
    assert apply_fusion(plain).params["fusion"], "the chain fuses when nothing is declared"
    g = make(declared=True)
    f = apply_fusion(g)
    r0, r1 = wia_hw.run(g), wia_hw.run(f)
    assert r1.counters.bytes["hbm"] >= _compulsory(g)
    assert r1.counters.bytes["hbm"] == r0.counters.bytes["hbm"]
    assert f.params["fusion"] == {}
    assert not any("fusion" in o.attrs for o in f.ops)
    assert f.declared_outputs == g.declared_outputs


def test_fusion_declared_intermediate_functional_outputs_equal():
    """The fused graph returns the declared intermediate, with the unfused values."""
    b = GraphBuilder("small", "fp32")
    h = b.linear("fc", b.input("x", (8, 16)), 32)
    y = b.op("gelu", "act", [h])
    g = b.graph()
    g.declared_outputs = [h, y]
    f = apply_fusion(g)
    x = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)
    o0 = wia_hw.run(g, mode="functional", inputs={"x": x}, seed=1).outputs
    o1 = wia_hw.run(f, mode="functional", inputs={"x": x}, seed=1).outputs
    assert set(o0) == set(o1) == {h, y}
    for n in o0:
        np.testing.assert_array_equal(np.asarray(o0[n]), np.asarray(o1[n]))


def test_fusion_attention_with_declared_probs_is_not_fused():
    b = GraphBuilder("attn", "fp16")
    q, k, v = (b.input(n, (8, 128, 64)) for n in "qkv")
    p = b.op("softmax", "probs", [b.op("bmm", "scores", [q, k], transpose_b=True)])
    b.op("bmm", "ctx", [p, v])
    g = b.graph()
    assert apply_fusion(g).params["fusion"] == {"attention": 1}
    g.declared_outputs = [p, "ctx"]
    assert apply_fusion(g).params["fusion"] == {}


# -- 2. a binary MLPClassifier -----------------------------------------------------------


def test_binary_mlp_graph_predicts_as_sklearn():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    d = load_breast_cancer()
    x = StandardScaler().fit_transform(d.data).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(
        x, d.target, test_size=0.3, random_state=0, stratify=d.target
    )
    clf = MLPClassifier((16,), max_iter=1000, random_state=0).fit(xtr, ytr)
    g, w = mlp_to_graph(clf, batch=16)
    assert g.tensors["logits"].shape == (16, 2)
    out = GraphEvaluator(g, w).predict(xte)
    assert out.shape == (len(xte), 2)
    np.testing.assert_array_equal(out[:, 0], 0.0)
    pred = out.argmax(1)
    np.testing.assert_array_equal(clf.classes_[pred], clf.predict(xte))
    rep = compare("fp32", out, out, yte)
    assert rep.accuracy == pytest.approx(100.0 * float(np.mean(clf.predict(xte) == yte)))
    assert rep.accuracy > 90
    # the logits' softmax is scikit-learn's predict_proba
    e = np.exp(out - out.max(1, keepdims=True))
    np.testing.assert_allclose(e / e.sum(1, keepdims=True), clf.predict_proba(xte), atol=1e-5)


def test_multilabel_mlp_is_refused_and_one_column_labels_say_why():
    class MultiLabel:  # what a multi-label MLPClassifier exposes
        rng = np.random.default_rng(0)
        coefs_ = [rng.normal(size=(4, 8)), rng.normal(size=(8, 3))]
        intercepts_ = [np.zeros(8), np.zeros(3)]
        activation = "relu"
        out_activation_ = "logistic"

    with pytest.raises(WorkloadError, match="multi-label") as e:
        mlp_to_graph(MultiLabel(), batch=4)
    assert "\n" not in str(e.value)
    out = np.random.default_rng(1).normal(size=(6, 1))
    with pytest.raises(WorkloadError, match="one column") as e:
        compare("one", out, out, np.array([0, 1, 0, 1, 1, 0]))
    assert "0..0" not in str(e.value) and "\n" not in str(e.value)


# -- 3. a quantised graph refuses NaN where it quantises ---------------------------------


def _small_mlp():
    rng = np.random.default_rng(0)
    layers = [
        (rng.normal(size=(8, 16)), rng.normal(size=16)),
        (rng.normal(size=(16, 4)), rng.normal(size=4)),
    ]
    return mlp_to_graph(layers, batch=4)


def test_quantised_graph_refuses_nan_input_naming_the_op():
    g, w = _small_mlp()
    xs = np.random.default_rng(1).normal(size=(16, 8)).astype(np.float32)
    q = quantize_model(
        g, QuantizationConfig(calibration_batches=4), calibration_batches(xs, 4, 4), weights=w
    )
    good = wia_hw.run(q, mode="functional", inputs={"x": xs[:4]}).outputs["logits"]
    assert np.all(np.isfinite(good))
    for bad in (np.nan, np.inf):
        x = xs[:4].copy()
        x[1, 3] = bad
        with pytest.raises(WorkloadError, match=r"op 'x\.quantize' \(cast\)") as e:
            wia_hw.run(q, mode="functional", inputs={"x": x})
        assert "\n" not in str(e.value) and "[1, 3]" in str(e.value)
        with pytest.raises(WorkloadError, match="x.quantize"):
            GraphEvaluator(q).run({"x": x})


def test_dynamic_int8_cast_refuses_nan():
    b = GraphBuilder("dyn", "fp32")
    b.op("cast", "codes", [b.input("x", (4, 8))], dtype="int8", to="int8")
    g = b.graph()
    x = np.ones((4, 8), np.float32)
    assert np.all(np.isfinite(wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["codes"]))
    x[0, 0] = np.nan
    with pytest.raises(WorkloadError, match="op 'codes' \\(cast\\)"):
        wia_hw.run(g, mode="functional", inputs={"x": x})


def test_static_qdq_refuses_nan_and_inf():
    """An imported model's static QuantizeLinear (``Graph.quant``) cannot code a NaN,
    and its integer cast would wrap an infinity to the wrong end (-inf's code for
    +inf): both are one line naming the op."""
    b = GraphBuilder("qdq", "fp32")
    b.op("relu", "r", [b.input("x", (2, 4))], dtype="int8")
    g = b.graph()
    g.quant["r"] = QuantParams(np.asarray(np.float32(0.5)), np.asarray(0, np.int64))
    x = np.array([[1.0, 2.0, 100.0, 0.0], [0.0, 1.0, 3.0, 4.0]], np.float32)
    out = np.asarray(wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["r"])
    np.testing.assert_array_equal(out, [[1.0, 2.0, 63.5, 0.0], [0.0, 1.0, 3.0, 4.0]])
    for bad in (np.nan, np.inf):
        x[1, 1] = bad
        with pytest.raises(WorkloadError, match=r"op 'r' \(relu\).* NaN or inf of 8"):
            wia_hw.run(g, mode="functional", inputs={"x": x})


# -- 4. analog g_max_us is declared metadata ---------------------------------------------


def test_analog_g_max_us_is_declared_metadata_and_changes_no_result():
    from wia_hw.registry import load_extension

    text = load_extension("analog").parameters["g_max_us"].description
    assert text.startswith("metadata here") and "scale-invariant" in text
    b = GraphBuilder("g", "fp32")
    b.linear("fc", b.input("x", (16, 300)), 40)
    g = b.graph()
    x = np.random.default_rng(0).normal(size=(16, 300)).astype(np.float32)
    got = []
    for gm in (0.1, 25.0, 1000.0):
        p = {"policy": "all", "g_max_us": gm}
        ctx = wia_hw.open_device("wia-npu")
        wia_hw.register_device_extension(ctx, "analog", parameters=p)
        r = ctx.run(g)
        ev = GraphEvaluator(g, unit="analog", unit_parameters=p, seed=3)
        got.append((r.latency_ms, r.energy_j, ev.unit_cost.energy_pj, ev.run({"x": x})["fc"]))
    for other in got[1:]:
        assert other[:3] == got[0][:3]
        np.testing.assert_allclose(other[3], got[0][3], rtol=1e-9, atol=1e-9)


# -- 5. minor: numpy config values, policy kinds, weights, seed --------------------------


def test_quantization_config_accepts_numpy_ints_and_bools():
    c = QuantizationConfig(
        calibration_batches=np.int64(4), per_channel=np.bool_(False), percentile=np.float32(99.5)
    )
    assert c.calibration_batches == 4 and type(c.calibration_batches) is int
    assert c.per_channel is False
    assert type(c.percentile) is float and c.percentile == pytest.approx(99.5)
    assert QuantizationConfig(per_channel=np.bool_(True)).per_channel is True
    for kw in (
        {"calibration_batches": np.bool_(True)},
        {"calibration_batches": True},
        {"calibration_batches": np.int64(0)},
        {"calibration_batches": 2.0},
        {"per_channel": np.int64(1)},
        {"percentile": np.bool_(True)},
        {"percentile": float("nan")},
    ):
        with pytest.raises(ValueError, match="QuantizationConfig"):
            QuantizationConfig(**kw)


@pytest.mark.parametrize("unit", ["analog", "photonic"])
def test_names_policy_naming_a_non_gemm_op_is_one_line(unit):
    g, w = _small_mlp()
    with pytest.raises(WorkloadError, match="'fc0.relu' is a relu") as e:
        _ = GraphEvaluator(g, w, unit=unit, unit_parameters={"policy": "names:fc0.relu"}).unit_cost
    msg = str(e.value)
    assert "\n" not in msg and "linear, matmul, conv2d" in msg and unit in msg
    ev = GraphEvaluator(g, w, unit=unit, unit_parameters={"policy": "names:fc0"})
    assert ev.unit_cost.routed_ops == ("fc0",)


def test_quantize_model_names_a_non_numeric_weight():
    g, w = _small_mlp()
    xs = np.random.default_rng(1).normal(size=(8, 8)).astype(np.float32)
    for name, bad in (("fc0.weight", np.full((8, 16), "a")), ("logits.bias", ["a"] * 4)):
        with pytest.raises(WorkloadError, match=f"weight '{name}'") as e:
            quantize_model(
                g,
                QuantizationConfig(calibration_batches=2),
                calibration_batches(xs, 4, 2),
                weights={**w, name: bad},
            )
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_quantize_model_names_a_bad_seed(seed):
    g, _ = _small_mlp()
    xs = np.random.default_rng(1).normal(size=(8, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="quantize_model: seed must be a non-negative integer"):
        quantize_model(
            g, QuantizationConfig(calibration_batches=2), calibration_batches(xs, 4, 2), seed=seed
        )
    q = quantize_model(
        g,
        QuantizationConfig(calibration_batches=2),
        calibration_batches(xs, 4, 2),
        seed=np.int64(2),
    )
    assert q.ops


def test_quantise_saturates_infinities_as_onnx_does():
    """QuantizeLinear clips before the cast: +inf is the top code (cast first, the int64
    cast wrapped and +inf came out as -128); finite values keep their codes."""
    import numpy as np

    from wia_hw.graph import QuantParams

    q = QuantParams(scale=np.float32(0.5), zero_point=3)
    x = np.array([np.inf, -np.inf, 1e30, -1e30, 0.0, 1.25, -7.6], np.float32)
    assert q.quantise(x).tolist() == [127, -128, 127, -128, 3, 5, -12]
    rng = np.random.default_rng(0)
    y = rng.normal(0, 40, 1000).astype(np.float32)
    expect = np.clip(np.rint(y / np.float32(0.5)).astype(np.int64) + 3, -128, 127)
    assert np.array_equal(q.quantise(y), expect)


def test_autotune_config_takes_numpy_bools():
    import numpy as np

    from wia_hw.optimize import AutotuneConfig

    assert AutotuneConfig(prune=np.bool_(False)).prune is False
