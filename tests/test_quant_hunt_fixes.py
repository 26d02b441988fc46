"""quantize_model fixes from a bug hunt: entropy calibration discounts the ReLU zero
spike as NVIDIA's reference does; biases never clip in int32 (weight scales raised) and
the accumulator cannot wrap; non-finite weights refused; functional mode computes a
quantised graph's values (static scales, its own weights); declared outputs kept and
left float; a partly quantised graph is not labelled int8; fusing a quantised graph
keeps its data."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest

import wia_hw
from wia_hw import GraphBuilder, QuantizationConfig, WorkloadError, apply_fusion, quantize_model
from wia_hw.accuracy import GraphEvaluator
from wia_hw.optimize import QuantizedGraph, calibrate_threshold
from wia_hw.optimize._quant import HIST_BINS, INT32_MAX, QMAX


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum(a * b) / np.linalg.norm(a) / np.linalg.norm(b))


# -- 1. entropy calibration -------------------------------------------------------------


def _nvidia_entropy(hist: np.ndarray, amax: float, start_bin: int = 128) -> float:
    """pytorch-quantization's ``_compute_amax_entropy`` (8 bits, signed, stride 1),
    written as it is there: ``bins[0] = bins[1]``, a bin-by-bin digitised ``Q``,
    KL as scipy's ``entropy`` (inf where Q is 0 and P is not), the last argmin."""
    edges = np.linspace(0, amax, len(hist) + 1)
    bins = hist.astype(np.float64).copy()
    bins[0] = bins[1]
    levels = 128
    divs = []
    for i in range(start_bin, len(bins) + 1):
        dig = np.digitize(range(i), np.linspace(0, i, num=levels + 1)) - 1
        dig[bins[:i] == 0] = -1
        dens = np.zeros(levels)
        for idx, d in enumerate(dig):
            if d != -1:
                dens[d] += bins[idx]
        for k, v in Counter(dig).items():
            if k != -1:
                dens[k] /= v
        q = np.array([dens[d] if d != -1 else 0.0 for d in dig])
        p = bins[:i].copy()
        p[-1] += bins[i:].sum()
        p, q = p / p.sum(), q / max(q.sum(), 1e-300)
        m = p > 0
        divs.append(np.sum(p[m] * np.log(p[m] / q[m])) if np.all(q[m] > 0) else np.inf)
    divs = np.array(divs)
    return float(edges[len(divs) - 1 - np.argmin(divs[::-1]) + start_bin])


@pytest.mark.parametrize("zeros", [0.5, 0.9])
def test_entropy_matches_nvidias_reference_on_relu_outputs(zeros):
    rng = np.random.default_rng(int(zeros * 10))
    x = np.where(rng.random(100_000) < zeros, 0.0, np.abs(rng.standard_normal(100_000)))
    amax = float(x.max())
    hist = np.histogram(x, bins=HIST_BINS, range=(0, amax))[0]
    t = calibrate_threshold(hist, amax, "entropy")
    assert t == pytest.approx(_nvidia_entropy(hist, amax), rel=1e-12)
    # the spike of zeros no longer drags T down (it was 0.27 of max 4.3 at 90% zeros):
    # nothing but the far tail is clipped
    assert np.mean(x > t) < 1e-3


def test_entropy_keeps_every_level_of_discrete_data():
    # pixels of 17 levels, many zero (the digits' input): with the zero bin replaced by
    # its empty neighbour, every candidate with at most one level per group has KL 0;
    # the reference's last minimum keeps the top level (the first would clip at 1/16)
    rng = np.random.default_rng(3)
    x = np.where(rng.random(50_000) < 0.5, 0, rng.integers(0, 17, 50_000)) / 16
    hist = np.histogram(x, bins=HIST_BINS, range=(0, 1.0))[0]
    assert calibrate_threshold(hist, 1.0, "entropy") == 1.0 == _nvidia_entropy(hist, 1.0)


def test_entropy_tracks_fp32_on_a_relu_layer_of_wide_channels():
    # the layer test_quantization uses: fc1's channels span two decades, ReLU, fc2;
    # the zero spike made entropy clip the ReLU output at 1.93 of 30.9 (cosine 0.706)
    rng = np.random.default_rng(1)
    m, k, n = 96, 300, 200
    b = GraphBuilder("mlp", "fp32")
    h = b.op("relu", "act", [b.linear("fc1", b.input("x", (m, k)), n)])
    b.linear("fc2", h, 10)
    g = b.graph()
    w = {
        "fc1.weight": rng.standard_normal((k, n)) / np.sqrt(k) * np.logspace(-1, 1, n),
        "fc1.bias": rng.standard_normal(n) * 0.1,
        "fc2.weight": rng.standard_normal((n, 10)) / np.sqrt(n),
        "fc2.bias": rng.standard_normal(10) * 0.1,
    }
    w = {name: v.astype(np.float32) for name, v in w.items()}
    data = [{"x": rng.standard_normal((m, k)).astype(np.float32)} for _ in range(4)]
    q = quantize_model(g, QuantizationConfig(method="entropy"), data, weights=w)
    assert (
        q.thresholds["act"]
        > 0.5 * quantize_model(g, QuantizationConfig(), data, weights=w).thresholds["act"]
    )
    batch = {"x": rng.standard_normal((m, k)).astype(np.float32)}
    ref = GraphEvaluator(g, w).run(batch)["fc2"]
    out = GraphEvaluator(q).run(batch)["fc2"]
    assert _cos(out, ref) > 0.998
    assert np.linalg.norm(out - ref) < 0.06 * np.linalg.norm(ref)


# -- 2. int32 bias ------------------------------------------------------------------------


def _one_linear(m: int, k: int, n: int):
    b = GraphBuilder("one", "fp32")
    b.linear("fc", b.input("x", (m, k)), n)
    return b.graph()


@pytest.mark.parametrize(
    "case,per_channel",
    # a pruned column overflows only with its own scale; tiny inputs and weights do with both
    [("pruned neuron", True), ("tiny inputs", True), ("tiny inputs", False)],
)
def test_a_bias_too_large_for_int32_raises_the_weight_scale_instead_of_clipping(case, per_channel):
    rng = np.random.default_rng(0)
    m, k, n = 16, 64, 8
    g = _one_linear(m, k, n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) * 0.1).astype(np.float32)
    bias = rng.uniform(0.2, 1.0, n).astype(np.float32)
    if case == "pruned neuron":
        w[:, rng.integers(n)] = 1e-9
    else:
        x, w = x * np.float32(1e-4), w * np.float32(1e-2)
    weights = {"fc.weight": w, "fc.bias": bias}
    with pytest.warns(UserWarning, match=r"op 'fc': the weight scale of \d+ of \d+ output"):
        q = quantize_model(
            g, QuantizationConfig(per_channel=per_channel), [{"x": x}], weights=weights
        )
    # every bias code leaves room for K products of 127 x 127 codes
    assert np.abs(q.weights["fc.bias_q"].astype(np.int64)).max() <= INT32_MAX - k * QMAX**2
    for xe in (x, 3 * x):  # beyond the calibrated range too: codes clip, no wrap
        fx = GraphEvaluator(q).execute({"x": xe})
        xq = fx.values["x.quantize"].astype(np.int64)
        acc = xq @ q.weights["fc.weight_q"].astype(np.int64) + q.weights["fc.bias_q"]
        assert np.abs(acc).max() <= INT32_MAX
        qa = q.ops[-1].attrs["quant"]
        scale = (qa["input_scale"] * np.asarray(qa["weight_scale"])).astype(np.float32)
        np.testing.assert_array_equal(fx.values["fc"], acc.astype(np.float32) * scale)
    # the bias comes through (it was clipped to 2^31 - 1 codes: ~0, or 0.1 of it)
    ref = GraphEvaluator(g, weights).run({"x": x})["fc"]
    out = GraphEvaluator(q).run({"x": x})["fc"]
    np.testing.assert_allclose(out, ref, atol=0.02 * np.abs(ref).max())


def test_ordinary_weight_scales_are_not_raised():
    rng = np.random.default_rng(5)
    g = _one_linear(16, 64, 8)
    w = (rng.standard_normal((64, 8)) * 0.1).astype(np.float32)
    weights = {"fc.weight": w, "fc.bias": rng.standard_normal(8).astype(np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = quantize_model(
            g,
            QuantizationConfig(),
            [rng.standard_normal((16, 64)).astype(np.float32)],
            weights=weights,
        )
    np.testing.assert_allclose(q.ops[-1].attrs["quant"]["weight_scale"], np.abs(w).max(0) / 127)


# -- 3. non-finite weights ----------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("which", ["fc1.weight", "fc1.bias", "fc0.weight"])
def test_non_finite_weights_are_refused_naming_the_tensor_and_index(bad, which):
    rng = np.random.default_rng(7)
    b = GraphBuilder("g", "fp32")
    b.linear("fc1", b.op("relu", "r", [b.linear("fc0", b.input("x", (4, 8)), 8)]), 3)
    g = b.graph()
    w = {
        n: rng.standard_normal(t.shape).astype(np.float32)
        for n, t in g.tensors.items()
        if t.kind == "weight"
    }
    at = tuple(int(rng.integers(s)) for s in w[which].shape)
    w[which][at] = bad
    op = which.split(".")[0]
    with pytest.raises(
        WorkloadError,
        match=rf"quantize_model: '{which}' \(op '{op}'\) has non-finite values \(1 NaN or "
        rf"inf of {w[which].size}; the first, at index \[{', '.join(map(str, at))}\], is",
    ):
        quantize_model(g, QuantizationConfig(), [rng.standard_normal((4, 8))], weights=w)


# -- 4, 5. functional mode, weight values and declared outputs of an ONNX model ------------


def _two_output_onnx(rng: np.random.Generator):
    """x -> MatMul + Add -> Relu = 'hidden' (a declared output, read by the head) ->
    MatMul + Add -> Mul by a per-class scale (a float weight that stays float) = 'logits'."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    vals = {
        "w0": rng.standard_normal((16, 32)).astype(np.float32) / 4,
        "b0": rng.standard_normal(32).astype(np.float32) * 0.1,
        "w1": rng.standard_normal((32, 4)).astype(np.float32) / 6,
        "b1": rng.standard_normal(4).astype(np.float32) * 0.1,
        "s": rng.uniform(0.5, 2.0, 4).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"]),
        helper.make_node("Add", ["h0", "b0"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "w1"], ["l0"]),
        helper.make_node("Add", ["l0", "b1"], ["l1"]),
        helper.make_node("Mul", ["l1", "s"], ["logits"]),
    ]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "two_out",
        [helper.make_tensor_value_info("x", f32, [8, 16])],
        [
            helper.make_tensor_value_info("hidden", f32, [8, 32]),
            helper.make_tensor_value_info("logits", f32, [8, 4]),
        ],
        [numpy_helper.from_array(v, n) for n, v in vals.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx, model, vals


def _numpy_two_out(vals, x):
    hidden = np.maximum(x @ vals["w0"] + vals["b0"], 0)
    return hidden, (hidden @ vals["w1"] + vals["b1"]) * vals["s"]


def test_functional_mode_runs_a_quantised_onnx_model_with_its_own_weights():
    rng = np.random.default_rng(11)
    _, model, vals = _two_output_onnx(rng)
    g = wia_hw.from_onnx(model)
    cal = [{"x": rng.standard_normal((8, 16)).astype(np.float32)} for _ in range(4)]
    q = quantize_model(g, QuantizationConfig(), cal)
    x = cal[0]["x"]  # within the calibrated range: rounding error only
    ev = GraphEvaluator(q).run({"x": x})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no int8 weight drawn at random
        got = wia_hw.run(q, mode="functional", inputs={"x": x}).outputs
        given = wia_hw.run(q, mode="functional", inputs={"x": x, **q.weights}).outputs
    for name in ("hidden", "logits"):
        # what the accuracy module computes, value for value, given the weights or not
        np.testing.assert_array_equal(got[name], ev[name])
        np.testing.assert_array_equal(given[name], ev[name])
    _, want = _numpy_two_out(vals, x)
    # the model's own weights (the float per-class scale among them), int8 error only
    assert _cos(got["logits"], want) > 0.999
    np.testing.assert_allclose(got["logits"], want, atol=0.05 * np.abs(want).max())
    assert set(q.weight_values) == set(q.weights)


def test_declared_outputs_are_kept_and_stay_float():
    rng = np.random.default_rng(12)
    _, model, vals = _two_output_onnx(rng)
    g = wia_hw.from_onnx(model)
    assert g.declared_outputs == ["hidden", "logits"]
    cal = [{"x": rng.standard_normal((8, 16)).astype(np.float32)} for _ in range(2)]
    q = quantize_model(g, QuantizationConfig(), cal)
    assert q.declared_outputs == ["hidden", "logits"]
    hidden_t = next(t for t in q.tensors.values() if t.name == "hidden")
    assert hidden_t.dtype == "fp32"  # the ReLU writes float; a cast quantises it for the head
    assert "hidden.quantize" in q.tensors
    x = cal[1]["x"]
    out = GraphEvaluator(q).run({"x": x})
    assert sorted(out) == ["hidden", "logits"]
    hidden, _ = _numpy_two_out(vals, x)
    np.testing.assert_allclose(out["hidden"], hidden, atol=0.02 * hidden.max())


# -- 6. precision label --------------------------------------------------------------------


def test_a_graph_left_mostly_float_is_not_labelled_int8():
    rng = np.random.default_rng(13)
    b = GraphBuilder("cnn", "fp32")
    x = b.input("x", (8, 3, 16, 16))
    y = b.op(
        "conv2d", "conv", [x, b.weight("conv.w", (16, 3, 3, 3)), b.weight("conv.b", (16,))], pad=1
    )
    y = b.op("reshape", "flat", [b.op("relu", "r", [y])], shape=(8, 16 * 16 * 16))
    b.linear("fc", y, 10)
    g = b.graph(params={"precision": "fp32"})
    cal = [rng.standard_normal((8, 3, 16, 16)).astype(np.float32)]
    conv_macs = 8 * 16 * 16 * 16 * 27
    share = conv_macs / (conv_macs + 8 * 4096 * 10)
    with pytest.warns(
        UserWarning,
        match=rf"{share:.1%} of the GEMM MACs of graph 'cnn' stay float \(conv2d {conv_macs:,}\)",
    ):
        q = quantize_model(g, QuantizationConfig(), cal)
    assert "precision" not in q.params
    r = wia_hw.run(q)
    macs = Counter()
    for k in r.kernels:
        macs[k.precision] += k.macs
    assert macs["int8"] > 0 and r.precision == max(macs, key=macs.get) == "fp32"
    # every GEMM int8: labelled so, no warning
    b = GraphBuilder("mlp", "fp32")
    b.linear("fc1", b.op("relu", "r", [b.linear("fc0", b.input("x", (8, 32)), 32)]), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = quantize_model(b.graph(), QuantizationConfig(), [rng.standard_normal((8, 32))])
    assert q.params["precision"] == "int8" and wia_hw.run(q).precision == "int8"


# -- 7. fusing a quantised graph -----------------------------------------------------------


def test_fusing_a_quantised_graph_keeps_its_weights_and_matches_fusing_first():
    rng = np.random.default_rng(14)
    b = GraphBuilder("ffn", "fp32")
    y = b.op("gelu", "act", [b.linear("fc", b.input("x", (64, 256)), 128)])
    b.linear("fc2", y, 32)
    g = b.graph()
    w = {
        n: (rng.standard_normal(t.shape) / np.sqrt(t.shape[0])).astype(np.float32)
        for n, t in g.tensors.items()
        if t.kind == "weight"
    }
    data = [rng.standard_normal((64, 256)).astype(np.float32)]
    q = quantize_model(g, QuantizationConfig(), data, weights=w)
    after = apply_fusion(q)
    first = quantize_model(apply_fusion(g), QuantizationConfig(), data, weights=w)
    assert isinstance(after, QuantizedGraph)
    assert after.params["fusion"] == first.params["fusion"] == {"gemm_epilogue": 1}
    assert after.thresholds == q.thresholds and after.config == q.config
    assert set(after.weights) == set(q.weights) == set(after.weight_values)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = GraphEvaluator(after).run({"x": x})["fc2"]
    np.testing.assert_array_equal(out, GraphEvaluator(first).run({"x": x})["fc2"])
    np.testing.assert_array_equal(out, GraphEvaluator(q).run({"x": x})["fc2"])
    assert [k.name for k in wia_hw.run(after).kernels] == [
        k.name for k in wia_hw.run(first).kernels
    ]


def test_a_k_whose_products_alone_can_overflow_int32_is_refused():
    k = (2**31 - 1) // QMAX**2 + 1  # 133,145 products of 127 x 127 exceed 2^31 - 1
    rng = np.random.default_rng(6)
    with pytest.raises(
        WorkloadError,
        match=rf"op 'fc' sums K={k:,} int8 products, more than the int32 accumulator",
    ):
        quantize_model(_one_linear(1, k, 1), QuantizationConfig(), [rng.standard_normal((1, k))])
