"""Transformer engine: attention numerics against float64, flash vs naive traffic in the
counters, masked tiles skipped, lowering of graph attention (self and decode)."""

from __future__ import annotations

import numpy as np
import pytest
from wia_hw.extensions.transformer_engine import (
    BF16_REL_ERR,
    FP16_REL_ERR,
    attention_mask,
    attention_reference,
)

import wia_hw
from wia_hw import AttentionConfig, AttentionPattern, WorkloadError, multi_head_attention

PATTERNS = list(AttentionPattern)


def rel_err(out, ref):
    """Max-norm relative error: max |out - ref| / max |ref|."""
    return float(np.abs(np.asarray(out, np.float64) - ref).max() / np.abs(ref).max())


def qkv(rng, b, h, s, d, skv=None, scale=1.0):
    skv = s if skv is None else skv
    q = (rng.standard_normal((b, h, s, d)) * scale).astype(np.float32)
    k = rng.standard_normal((b, h, skv, d)).astype(np.float32)
    v = rng.standard_normal((b, h, skv, d)).astype(np.float32)
    return q, k, v


def cfg_for(pattern, flash, s=200, precision="fp32", **kw):
    return AttentionConfig(
        num_heads=3,
        head_dim=32,
        sequence_length=s,
        use_flash_attention=flash,
        attention_pattern=pattern,
        precision=precision,
        window_size=48,
        block_size=32,
        **kw,
    )


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "naive"])
@pytest.mark.parametrize("pattern", PATTERNS, ids=[p.value for p in PATTERNS])
def test_fp32_matches_float64_reference(pattern, flash):
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng, 2, 3, 200, 32, scale=2.0)  # logits with std ~ 2
    cfg = cfg_for(pattern, flash)
    res = multi_head_attention(wia_hw.open_device("wia-npu"), q, k, v, cfg=cfg)
    ref = attention_reference(q, k, v, cfg.softmax_scale, attention_mask(cfg))
    assert rel_err(res.output, ref) < 1e-5


@pytest.mark.parametrize("flash", [True, False], ids=["flash", "naive"])
@pytest.mark.parametrize("pattern", PATTERNS, ids=[p.value for p in PATTERNS])
def test_large_magnitude_logits(pattern, flash):
    """Logits up to ~1e4 (exp overflows float32 beyond 88): integer-valued q and k and a
    power-of-two scale (head_dim 64) make every logit exact in float32, so what is
    tested is the softmax's stability (flash attention's running maximum), not the
    dot product's rounding (which alone costs ~eps * |logit| at any size)."""
    rng = np.random.default_rng(2)
    q = rng.integers(-64, 64, (1, 2, 160, 64)).astype(np.float32)
    k = rng.integers(-64, 64, (1, 2, 160, 64)).astype(np.float32)
    v = rng.standard_normal((1, 2, 160, 64)).astype(np.float32)
    cfg = AttentionConfig(
        num_heads=2,
        head_dim=64,
        sequence_length=160,
        use_flash_attention=flash,
        attention_pattern=pattern,
        precision="fp32",
        window_size=48,
        block_size=32,
    )
    logits = np.abs(q @ np.swapaxes(k, -1, -2)).max() * cfg.softmax_scale
    assert logits > 3000
    res = multi_head_attention(wia_hw.open_device("wia-npu"), q, k, v, cfg=cfg)
    assert np.isfinite(res.output).all()
    ref = attention_reference(q, k, v, cfg.softmax_scale, attention_mask(cfg))
    assert rel_err(res.output, ref) < 1e-5


@pytest.mark.parametrize(("precision", "bound"), [("fp16", FP16_REL_ERR), ("bf16", BF16_REL_ERR)])
@pytest.mark.parametrize("pattern", PATTERNS, ids=[p.value for p in PATTERNS])
def test_half_precision_within_documented_bounds(pattern, precision, bound):
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 1, 3, 200, 32, scale=2.0)
    errs = []
    for flash in (True, False):
        cfg = cfg_for(pattern, flash, precision=precision)
        res = multi_head_attention(wia_hw.open_device("wia-npu"), q, k, v, cfg=cfg)
        errs.append(
            rel_err(
                res.output, attention_reference(q, k, v, cfg.softmax_scale, attention_mask(cfg))
            )
        )
    assert max(errs) < bound
    assert min(errs) > 1e-5  # the bound is about rounding: there is some


def test_output_argument_is_filled_and_fast_softmax_is_equivalent():
    rng = np.random.default_rng(4)
    q, k, v = qkv(rng, 1, 3, 64, 32)
    out = np.zeros_like(q)
    cfg = cfg_for(AttentionPattern.CAUSAL, True, s=64)
    res = multi_head_attention(wia_hw.open_device("wia-npu"), q, k, v, out, cfg)
    np.testing.assert_array_equal(out, res.output)
    slow = multi_head_attention(
        wia_hw.open_device("wia-npu"),
        q,
        k,
        v,
        cfg=cfg_for(AttentionPattern.CAUSAL, True, s=64, fast_softmax=False),
    )
    assert rel_err(res.output, slow.output.astype(np.float64)) < 1e-6


def test_cross_attention_shapes():
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, 2, 3, 16, 32, skv=300)
    for pattern in (AttentionPattern.FULL, AttentionPattern.CAUSAL):
        cfg = cfg_for(pattern, True, s=16, kv_sequence_length=300)
        res = multi_head_attention(wia_hw.open_device("wia-npu"), q, k, v, cfg=cfg)
        assert res.operation == "cross_attention_optimized"
        ref = attention_reference(q, k, v, cfg.softmax_scale, attention_mask(cfg))
        assert rel_err(res.output, ref) < 1e-5


def test_causal_mask_aligns_queries_with_the_end_of_the_keys():
    cfg = cfg_for(AttentionPattern.CAUSAL, True, s=2, kv_sequence_length=5)
    assert attention_mask(cfg).tolist() == [
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


def test_seed_example_and_bad_shapes():
    """The seed's 8.9.1 call: 12 heads of 64, sequence 128, flash, causal."""
    cfg = AttentionConfig(
        num_heads=12,
        head_dim=64,
        sequence_length=128,
        use_flash_attention=True,
        attention_pattern=AttentionPattern.CAUSAL,
    )
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, 1, 12, 128, 64)
    ctx = wia_hw.open_device("wia-npu")
    res = multi_head_attention(ctx, q, k, v, cfg=cfg)
    assert res.output.shape == q.shape and res.cycles > 0 and res.latency_ms > 0
    assert "transformer_engine" in ctx.extensions  # registered on first use
    assert {r.provider for r in res.kernels} == {"transformer_engine"}
    with pytest.raises(
        WorkloadError,
        match=r"queries has shape \[1, 12, 100, 64\], the "
        r"config needs \[batch, 12, 128, 64\]",
    ):
        multi_head_attention(ctx, q[:, :, :100], k, v, cfg=cfg)
    with pytest.raises(
        ValueError,
        match=r"AttentionConfig.num_heads must be a positive "
        r"integer, got 0",
    ):
        AttentionConfig(num_heads=0, head_dim=64, sequence_length=128)
    with pytest.raises(
        ValueError,
        match=r"attention_pattern must be one of full, causal, "
        r"local, block_sparse, got 'diagonal'",
    ):
        AttentionConfig(num_heads=1, head_dim=64, sequence_length=128, attention_pattern="diagonal")
    with pytest.raises(ValueError, match=r"block_layout: query block 1 attends to no key"):
        AttentionConfig(
            num_heads=1,
            head_dim=8,
            sequence_length=64,
            block_size=32,
            attention_pattern="block_sparse",
            block_layout=[[True, False], [False, False]],
        )
    assert (
        AttentionConfig(
            num_heads=1, head_dim=8, sequence_length=8, attention_pattern="CAUSAL"
        ).attention_pattern
        is AttentionPattern.CAUSAL
    )


# -- timing: the counters show O(N d) against O(N^2) -------------------------------------
def _hbm(n, flash, pattern=AttentionPattern.FULL):
    cfg = AttentionConfig(
        num_heads=4,
        head_dim=64,
        sequence_length=n,
        use_flash_attention=flash,
        attention_pattern=pattern,
        precision="fp16",
    )
    x = np.zeros((1, 4, n, 64), np.float16)
    return multi_head_attention(wia_hw.open_device("wia-npu"), x, x, x, cfg=cfg, functional=False)


def test_flash_traffic_is_linear_and_naive_quadratic():
    sizes = (512, 1024, 2048)
    flash = [_hbm(n, True).hbm_bytes for n in sizes]
    naive = [_hbm(n, False).hbm_bytes for n in sizes]
    qkvo = [4 * 4 * n * 64 * 2 for n in sizes]  # Q, K, V, O once each
    assert flash == qkvo  # exactly compulsory: O(N d)
    for a, b in zip(naive, naive[1:], strict=False):
        assert b / a > 3.5  # O(N^2): x4 per doubling
    for n, nv in zip(sizes, naive, strict=True):
        assert nv >= 2 * 4 * n * n * 2  # S and P written at least once
    assert naive[-1] > 20 * flash[-1]


def test_masked_tiles_are_skipped_and_cost_less():
    full = _hbm(2048, True)
    causal = _hbm(2048, True, AttentionPattern.CAUSAL)
    assert causal.macs < 0.6 * full.macs
    assert causal.cycles < full.cycles
    rec = causal.kernels[0]
    assert rec.extra["skipped_tiles"] > 0
    assert full.kernels[0].extra["skipped_tiles"] == 0


def test_graph_lowering_bert_and_gpt2_decode():
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "transformer_engine")
    base = wia_hw.run("bert-base", batch=2, seq=384)
    r = ctx.run("bert-base", batch=2, seq=384)
    fused = [k for k in r.kernels if k.provider == "transformer_engine"]
    assert len(fused) == 12 and all(k.name.endswith("+softmax+context") for k in fused)
    assert not any(k.name.endswith("attention_softmax") for k in r.kernels)
    assert r.counters.bytes["hbm"] < base.counters.bytes["hbm"]
    assert r.flops == base.flops  # the same model
    # GPT-2 decode: one query against 512 cached keys -> cross-attention
    ctx2 = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx2, "transformer_engine")
    d = ctx2.run("gpt2", batch=1, seq=1, phase="decode", kv_len=511, layers=2)
    te = [k for k in d.kernels if k.provider == "transformer_engine"]
    assert len(te) == 2
    assert all(k.record.extra["operation"] == "cross_attention_optimized" for k in te)


def test_decoding_with_few_heads_splits_the_keys_over_the_cores():
    from wia_hw.graph import GraphBuilder

    b = GraphBuilder("decode", "fp16")
    q = b.input("q", (2, 1, 64))
    k = b.input("k", (2, 4096, 64))
    v = b.input("v", (2, 4096, 64))
    s = b.op("bmm", "scores", [q, k], transpose_b=True, scale=0.125)
    p = b.op("softmax", "probs", [s], causal=True)
    b.op("bmm", "ctx", [p, v])
    g = b.graph()
    # the engine's tile costs are those of the unpipelined array: compare on that array
    flat = {"compute.array.pipelined": False}
    ctx = wia_hw.open_device("wia-npu", overrides=flat)
    wia_hw.register_device_extension(ctx, "transformer_engine")
    r = ctx.run(g)
    names = [k.name for k in r.kernels]
    assert names == ["scores+softmax+context", "scores+softmax+context.combine"]
    assert r.kernels[0].cores_used == ctx.spec.compute.cores  # 2 heads, 4 cores busy
    base = wia_hw.run(g, overrides=flat)
    assert r.latency_ms < base.latency_ms


def test_functional_graph_run_is_unchanged_by_the_engine():
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "transformer_engine")
    r = ctx.run("bert-base", batch=1, seq=64, layers=1, mode="functional", seed=7)
    assert any(k.provider == "transformer_engine" for k in r.kernels)
    base = wia_hw.run("bert-base", batch=1, seq=64, layers=1, mode="functional", seed=7)
    for name, val in base.outputs.items():
        np.testing.assert_array_equal(r.outputs[name], val)


def test_use_flash_attention_false_keeps_three_kernels():
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(
        ctx, "transformer_engine", parameters={"use_flash_attention": False}
    )
    r = ctx.run("bert-base", batch=1, seq=128, layers=1)
    te = [k.name for k in r.kernels if k.provider == "transformer_engine"]
    assert te == ["layer0.attention_scores", "layer0.attention_softmax", "layer0.attention_context"]
