"""Functional mode: values computed alongside timing, bit-exact for int8 GEMMs."""

from __future__ import annotations

import numpy as np
import pytest
from wia_hw.emulator.functional import evaluate
from wia_hw.emulator.golden import int8_matmul, round_to_bf16, wrap_int32

import wia_hw
from wia_hw import WorkloadError
from wia_hw.workloads import build, gemm


def _int8(rng, shape):
    x = rng.integers(-128, 128, size=shape).astype(np.int8)
    x.flat[0], x.flat[-1] = -128, 127
    return x


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (37, 53, 29), (128, 256, 300), (200, 130, 70)])
def test_int8_gemm_is_bit_exact_with_numpy(m, n, k):
    rng = np.random.default_rng(m * n * k)
    g = gemm(m, n, k, precision="int8")
    a_name, b_name = g.ops[0].inputs[:2]
    a, b = _int8(rng, (m, k)), _int8(rng, (k, n))
    r = wia_hw.run(g, mode="functional", inputs={a_name: a, b_name: b})
    (out,) = r.outputs.values()
    assert out.dtype == np.int32
    expected = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)  # no wrap at k<2**17
    np.testing.assert_array_equal(out, expected)


def test_int32_accumulator_wraps():
    a = np.full((1, 1 << 18), 127, dtype=np.int8)  # 127*127*2**18 > 2**31
    b = np.full(((1 << 18), 1), 127, dtype=np.int8)
    got = int8_matmul(a, b)
    assert got[0, 0] == wrap_int32(np.array([127 * 127 * (1 << 18)]))[0]
    assert got[0, 0] != 127 * 127 * (1 << 18)


@pytest.mark.parametrize("precision,tol", [("fp32", 1e-5), ("fp16", 2e-3), ("bf16", 1e-2)])
def test_float_gemm_accumulates_in_fp32(precision, tol):
    rng = np.random.default_rng(4)
    g = gemm(64, 48, 300, precision=precision)
    a_name, b_name = g.ops[0].inputs[:2]
    a = rng.standard_normal((64, 300)).astype(np.float32)
    b = rng.standard_normal((300, 48)).astype(np.float32)
    r = wia_hw.run(g, mode="functional", inputs={a_name: a, b_name: b})
    (out,) = r.outputs.values()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.abs(out - ref).max() / np.abs(ref).max()
    assert err < tol


def test_bf16_rounding_is_round_to_nearest_even():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 3.0e38], dtype=np.float32)
    y = round_to_bf16(x)
    assert y[0] == 1.0 and y[1] == 1.0  # tie -> even
    assert y[2] == 1.0 + 2**-6  # tie -> even (up)
    assert y[3] == -2.5
    bits = y.view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)


def test_reference_ops_against_float64():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 7, 33)).astype(np.float32) * 30  # large logits
    y = evaluate("softmax", {}, [x], x.shape, "fp32")
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    g, bta = rng.standard_normal(33).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    y = evaluate("layer_norm", {}, [x, g, bta], x.shape, "fp32")
    xd = x.astype(np.float64)
    ref = (xd - xd.mean(-1, keepdims=True)) / np.sqrt(xd.var(-1, keepdims=True) + 1e-5) * g + bta
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    from math import erf

    v = np.linspace(-6, 6, 101).astype(np.float32)
    y = evaluate("gelu", {}, [v], v.shape, "fp32")
    ref = np.array([0.5 * t * (1 + erf(t / np.sqrt(2))) for t in v.astype(np.float64)])
    np.testing.assert_allclose(y, ref, atol=2e-6)


def test_conv_via_im2col_matches_direct_convolution():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y = evaluate("conv2d", {"stride": 2, "pad": 1}, [x, w], (2, 4, 5, 5), "fp32")
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
    ref = np.zeros((2, 4, 5, 5))
    for o in range(4):
        for i in range(5):
            for j in range(5):
                ref[:, o, i, j] = (xp[:, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3] * w[o]).sum(
                    (1, 2, 3)
                )
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "workload,kw",
    [
        ("bert-base", dict(batch=1, seq=8, layers=2)),
        ("bert-base", dict(batch=1, seq=8, layers=1, precision="int8")),
        ("gpt2", dict(batch=1, seq=6, layers=1)),
        ("gpt2", dict(batch=1, phase="decode", kv_len=5, layers=1)),
        ("resnet50", dict(batch=1, image=32)),
    ],
)
def test_small_models_run_functionally_and_deterministically(workload, kw):
    g = build(workload, **kw)
    a = wia_hw.run(g, mode="functional", seed=5)
    b = wia_hw.run(g, mode="functional", seed=5)
    assert a.outputs and a.outputs.keys() == b.outputs.keys()
    for name, v in a.outputs.items():
        assert np.all(np.isfinite(v)), name
        np.testing.assert_array_equal(v, b.outputs[name])
    assert a.to_json() == b.to_json()
    timing = wia_hw.run(g, seed=5)  # functional mode does not change timing
    assert timing.cycles == a.cycles


def test_precisions_agree_on_a_float_model():
    outs = {}
    for p in ("fp32", "fp16", "bf16"):
        r = wia_hw.run(
            build("bert-base", batch=1, seq=8, layers=1, precision=p), mode="functional", seed=1
        )
        outs[p] = next(iter(r.outputs.values()))
    ref = outs["fp32"]
    assert np.abs(outs["fp16"] - ref).max() <= 0.02 * np.abs(ref).max() + 1e-3
    assert np.abs(outs["bf16"] - ref).max() <= 0.1 * np.abs(ref).max() + 1e-2


def test_functional_input_errors():
    g = gemm(4, 4, 4)
    with pytest.raises(
        WorkloadError,
        match=r"input '.*': shape \[3, 4\] given, the graph "
        r"needs \[4, 4\]",
    ):
        wia_hw.run(g, mode="functional", inputs={g.ops[0].inputs[0]: np.zeros((3, 4))})
    with pytest.raises(WorkloadError, match=r"not inputs or weights"):
        wia_hw.run(g, mode="functional", inputs={"nope": np.zeros(1)})
    with pytest.raises(WorkloadError, match=r"mode must be one of timing, functional"):
        wia_hw.run(g, mode="fast")


def test_bf16_rounding_of_a_scalar_keeps_its_shape():
    """A 0-d value (an ONNX model's scalar weight in bf16) rounds like any other, NaN
    included, and stays 0-d."""
    from wia_hw.emulator.golden import round_to_bf16

    one = round_to_bf16(np.float32(1.2345))
    assert one.shape == () and one == np.float32(1.234375)
    assert np.isnan(round_to_bf16(np.array(np.nan, np.float32)))
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    assert np.array_equal(
        round_to_bf16(x), np.stack([round_to_bf16(v) for v in x.reshape(-1)]).reshape(3, 4)
    )


def test_random_int8_weights_are_named_as_such():
    """An int8 graph run without its weights draws them as random codes, unrelated to
    the float model's at the same seed: the run says so (a user comparing it with fp32
    would see a cosine near 0 and conclude int8 is broken)."""
    from wia_hw._functional import RandomInt8WeightsWarning
    from wia_hw.workloads import gemm

    with pytest.warns(RandomInt8WeightsWarning, match=r"drew 1 int8 weight\(s\) of 'gemm'"):
        wia_hw.run(gemm(8, 8, 8, precision="int8"), mode="functional")
    rng = np.random.default_rng(0)
    given = {"B": rng.integers(-127, 128, (8, 8)).astype(np.int8)}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RandomInt8WeightsWarning)
        wia_hw.run(gemm(8, 8, 8, precision="int8"), mode="functional", inputs=given)
