"""Workload builders: FLOP derivations, shapes, groups, argument errors, determinism."""

from __future__ import annotations

import math

import pytest
from wia_hw.emulator.errors import WorkloadError

import wia_hw
from wia_hw.graph import (
    LAYER_NORM_FLOPS_PER_ELEMENT,
    SOFTMAX_FLOPS_PER_ELEMENT,
    UNARY_KINDS,
    Graph,
    Op,
    Tensor,
    conv_output_hw,
    is_view,
    op_macs,
)
from wia_hw.workloads import (
    WORKLOADS,
    bert_base,
    bert_large,
    build,
    gemm,
    gpt2,
    resnet50,
)

SEED_GROUPS = {"multi_head_attention", "layer_norm", "feed_forward", "embedding", "output"}
#: The kernels the seed's autotuner names (section 8.7.1).
SEED_KERNELS = (
    "attention_qkv_projection",
    "attention_softmax",
    "attention_output_projection",
    "feed_forward_intermediate",
    "feed_forward_output",
)
GELU = UNARY_KINDS["gelu"]
TANH = UNARY_KINDS["tanh"]
LN = LAYER_NORM_FLOPS_PER_ELEMENT
SM = SOFTMAX_FLOPS_PER_ELEMENT

# (builder, L, H, heads, FFN)
BERTS = [(bert_large, 24, 1024, 16, 4096), (bert_base, 12, 768, 12, 3072)]


def op(g: Graph, name: str) -> Op:
    return next(o for o in g.ops if o.name == name)


def out_shape(g: Graph, name: str) -> tuple[int, ...]:
    return g.tensors[op(g, name).outputs[0]].shape


def signature(g: Graph) -> list:
    return [
        (
            o.name,
            o.kind,
            o.group,
            o.inputs,
            o.outputs,
            sorted(o.attrs.items()),
            [g.tensors[t].shape for t in o.outputs],
            [g.tensors[t].dtype for t in o.outputs],
        )
        for o in g.ops
    ]


# -- BERT ------------------------------------------------------------------------------


def bert_macs(batch: int, seq: int, L: int, H: int, F: int) -> int:
    """Projections (QKV 3H^2, output H^2, FFN 2HF) + attention bmms (2 S H) per token,
    plus the pooler (H^2) and the 2-class head on the [CLS] token of each sequence."""
    return batch * seq * L * (4 * H * H + 2 * H * F + 2 * seq * H) + batch * (H * H + 2 * H)


def bert_flops(batch: int, seq: int, L: int, H: int, heads: int, F: int) -> int:
    """2 per MAC, plus per token: biases (3H + H + F + H), softmax over heads x S scores,
    two layer norms, two residual adds and GELU on F per layer; the embedding adds and
    layer norm; the pooler/classifier biases and tanh."""
    per_layer = (3 * H + H + F + H) + SM * heads * seq + 2 * LN * H + 2 * H + GELU * F
    per_token = L * per_layer + 2 * H + LN * H
    return 2 * bert_macs(batch, seq, L, H, F) + batch * seq * per_token + batch * (H + TANH * H + 2)


@pytest.mark.parametrize("builder,L,H,heads,F", BERTS)
def test_bert_flops_are_the_derivation(builder, L, H, heads, F):
    g = builder(batch=2, seq=64)
    assert g.macs() == bert_macs(2, 64, L, H, F)
    assert g.flops() == bert_flops(2, 64, L, H, heads, F)


def test_bert_large_b32_s128_is_0617_gflop_per_token():
    g = bert_large(batch=32, seq=128)
    L, H, S, tokens = 24, 1024, 128, 32 * 128
    # Encoder GEMMs (24 H^2 FLOPs per token per layer with FFN = 4H) + attention bmms
    # (4 S H): the figure of about 0.617 GFLOP per token.
    per_token = L * (24 * H * H + 4 * S * H)
    assert per_token / 1e9 == pytest.approx(0.617, abs=5e-4)
    # GEMM FLOPs are that (plus the pooler/classifier on the [CLS] token) ...
    assert 2 * g.macs() == pytest.approx(per_token * tokens, rel=1e-4)
    # ... and the elementwise work (biases, softmax, layer norms, GELU: ~1.7 MFLOP per
    # token) adds under 0.3%: graph.flops() ~ 2.53e12.
    assert g.flops() == pytest.approx(per_token * tokens, rel=3e-3)
    assert g.flops() == bert_flops(32, 128, L, H, 16, 4096)


@pytest.mark.parametrize("builder,L,H,heads,F", BERTS)
def test_bert_ops_groups_and_shapes(builder, L, H, heads, F):
    B, S = 3, 16
    g = builder(batch=B, seq=S)
    assert {o.group for o in g.ops} == SEED_GROUPS
    assert g.sequences == B
    assert g.params == {"model": g.name, "batch": B, "seq": S, "precision": "fp16", "layers": L}
    for i in (0, L - 1):
        for k in SEED_KERNELS + ("attention_scores", "attention_context", "feed_forward_gelu"):
            grp = op(g, f"layer{i}.{k}").group
            assert grp == ("feed_forward" if "feed_forward" in k else "multi_head_attention")
        for k in ("attention_residual", "attention_layer_norm", "ffn_residual", "ffn_layer_norm"):
            assert op(g, f"layer{i}.{k}").group == "layer_norm"
    assert out_shape(g, "layer0.attention_qkv_projection") == (B, S, 3 * H)
    assert out_shape(g, "layer0.attention_scores") == (B * heads, S, S)
    assert op(g, "layer0.attention_scores").attrs["transpose_b"] is True
    assert op(g, "layer0.attention_scores").attrs["scale"] == 1 / math.sqrt(H // heads)
    assert out_shape(g, "layer0.attention_context") == (B * heads, S, H // heads)
    assert out_shape(g, "layer0.feed_forward_intermediate") == (B, S, F)
    assert out_shape(g, f"layer{L - 1}.ffn_layer_norm") == (B, S, H)
    assert out_shape(g, "classifier") == (B, 2)
    emb = [o for o in g.ops if o.group == "embedding"]
    assert [o.kind for o in emb].count("embedding") == 3
    assert emb[-1].kind == "layer_norm"


def test_head_split_is_a_view_and_merge_a_reshape():
    g = bert_base(batch=2, seq=8, layers=1)
    for name in (
        "attention_split_heads",
        "attention_query",
        "attention_key",
        "attention_value",
        "attention_merge_heads",
    ):
        o = op(g, f"layer0.{name}")
        assert is_view(o, g.shapes_of(o)[0]), name
    cls = op(g, "pooler.cls_token")  # a [CLS] row from each of 2 sequences: a copy
    assert not is_view(cls, g.shapes_of(cls)[0])


def test_bert_int8_runs_gemms_in_int8_and_the_rest_in_fp16():
    g = bert_large(batch=2, seq=16, precision="int8", layers=2)
    gemms = [o for o in g.ops if o.kind in ("linear", "matmul", "bmm")]
    assert len(gemms) == 2 * 6 + 2
    for o in gemms:
        assert [g.tensors[i].dtype for i in o.inputs[:2]] == ["int8", "int8"], o.name
        if len(o.inputs) == 3:
            assert g.tensors[o.inputs[2]].dtype == "int32"
    for o in g.ops:
        if o.kind in ("softmax", "layer_norm", "gelu", "add"):
            assert g.tensors[o.inputs[0]].dtype == "fp16", o.name
    # quantise steps are casts: no FLOPs, so int8 and fp16 count the same work
    assert g.flops() == bert_large(batch=2, seq=16, layers=2).flops()
    assert g.weight_bytes < bert_large(batch=2, seq=16, layers=2).weight_bytes
    assert g.params["precision"] == "int8"


@pytest.mark.parametrize("precision,dtype", [("fp32", "fp32"), ("BF16", "bf16")])
def test_bert_float_precisions(precision, dtype):
    g = bert_base(batch=1, seq=8, precision=precision, layers=1)
    assert g.tensors["layer0.attention_qkv_projection.weight"].dtype == dtype
    assert g.tensors["layer0.attention_softmax"].dtype == dtype
    assert not any(o.kind == "cast" for o in g.ops)


def test_bert_layers_override_scales_linearly():
    macs = {n: bert_large(batch=2, seq=32, layers=n).macs() for n in (1, 2, 4, 8, 24)}
    per_layer = macs[2] - macs[1]
    assert per_layer == 2 * 32 * (12 * 1024**2 + 2 * 32 * 1024)
    for n, m in macs.items():
        assert m == macs[1] + (n - 1) * per_layer
    assert macs[24] == bert_large(batch=2, seq=32).macs()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"batch": 0}, r"bert-large: batch must be >= 1, got 0"),
        ({"batch": -3}, r"batch must be >= 1, got -3"),
        ({"batch": 2.5}, r"batch must be an integer, got 2.5"),
        ({"batch": True}, r"batch must be an integer, got True"),
        ({"seq": 0}, r"seq must be in 1..512, got 0"),
        ({"seq": 513}, r"seq must be in 1..512, got 513"),
        ({"precision": "fp8"}, r"precision must be one of fp32, fp16, bf16, int8, got 'fp8'"),
        ({"layers": 0}, r"layers must be >= 1, got 0"),
    ],
)
def test_bert_bad_arguments(kwargs, match):
    with pytest.raises(WorkloadError, match=match) as e:
        bert_large(**kwargs)
    assert "\n" not in str(e.value)


def test_builds_are_deterministic():
    for f in (
        lambda: bert_base(batch=2, seq=16, precision="int8"),
        lambda: gpt2(phase="decode", kv_len=31),
        lambda: resnet50(batch=2),
    ):
        assert signature(f()) == signature(f())


# -- GPT-2 -----------------------------------------------------------------------------

GPT2 = {
    "small": (12, 768, 12),
    "medium": (24, 1024, 16),
    "large": (36, 1280, 20),
    "xl": (48, 1600, 25),
}
VOCAB = 50257


def gpt2_macs(L: int, H: int, batch: int, new: int, past: int, logits_rows: int) -> int:
    """Per new token and layer: projections 12 H^2 (FFN = 4H) and both attention bmms
    over past + new keys (2 (past + new) H); plus the tied LM head (H x vocab)."""
    return batch * new * L * (12 * H * H + 2 * (past + new) * H) + logits_rows * H * VOCAB


@pytest.mark.parametrize("size", list(GPT2))
def test_gpt2_prefill_macs_and_shapes(size):
    L, H, heads = GPT2[size]
    B, S = 2, 32
    g = gpt2(batch=B, seq=S, size=size)
    assert g.macs() == gpt2_macs(L, H, B, S, 0, B)  # logits of the last token only
    assert {o.group for o in g.ops} == SEED_GROUPS
    assert out_shape(g, "layer0.attention_scores") == (B * heads, S, S)
    assert op(g, "layer0.attention_softmax").attrs["causal"] is True
    assert out_shape(g, "lm_head") == (B, VOCAB)
    lm = op(g, "lm_head")
    assert lm.inputs[1] == "embeddings.token.table" and lm.attrs["transpose_b"]
    assert op(g, "final_layer_norm").group == "output"
    assert g.params["layers"] == L and g.params["phase"] == "prefill"


def test_gpt2_small_prefill_s128_flops():
    g = gpt2(seq=128)
    L, H, _ = GPT2["small"]
    assert 2 * g.macs() == 2 * gpt2_macs(L, H, 1, 128, 0, 1)
    assert g.flops() == pytest.approx(2 * g.macs(), rel=0.01)


def test_gpt2_decode_uses_the_kv_cache():
    B, K = 3, 40
    g = gpt2(batch=B, phase="decode", kv_len=K)
    L, H, heads = GPT2["small"]
    dh = H // heads
    assert g.params["seq"] == 1 and g.params["kv_len"] == K
    assert g.tensors["layer0.past_key"].shape == (B * heads, K, dh)
    assert g.tensors["layer0.past_key"].kind == "input"
    assert op(g, "layer0.attention_key_cache").kind == "concat"
    assert out_shape(g, "layer0.attention_key_cache") == (B * heads, K + 1, dh)
    assert out_shape(g, "layer0.attention_scores") == (B * heads, 1, K + 1)
    assert g.macs() == gpt2_macs(L, H, B, 1, K, B)


def test_gpt2_decode_and_prefill_flop_relation():
    """Generating S tokens one at a time does the projection work of one S-token
    prefill; its attention scores cover sum_{k<S} (k+1) = S(S+1)/2 keys per head-dim,
    while prefill computes the full S x S square (the causal mask is applied, not
    skipped)."""
    L, H, _ = GPT2["small"]
    S = 16

    def macs(g: Graph, pick) -> int:
        return sum(op_macs(o, g.shapes_of(o)[0]) for o in g.ops if pick(o))

    def proj(o: Op) -> bool:
        return o.kind == "linear"

    def scores(o: Op) -> bool:
        return o.name.endswith("attention_scores")

    prefill = gpt2(seq=S)
    steps = [gpt2(seq=1)] + [gpt2(phase="decode", kv_len=k) for k in range(1, S)]
    assert all(macs(s, proj) == macs(steps[0], proj) for s in steps)
    assert macs(prefill, proj) == S * macs(steps[0], proj) == S * L * 12 * H * H
    assert sum(macs(s, scores) for s in steps) == L * H * S * (S + 1) // 2
    assert macs(prefill, scores) == L * H * S * S


def test_gpt2_decode_several_tokens_gets_logits_for_each():
    g = gpt2(batch=2, seq=4, phase="decode", kv_len=10, size="medium", layers=2)
    assert out_shape(g, "lm_head") == (8, VOCAB)
    assert out_shape(g, "layer1.attention_scores") == (2 * 16, 4, 14)
    assert op(g, "layer1.attention_softmax").attrs == {"causal": True, "past": 10}


def test_gpt2_int8_runs_the_lm_head_on_an_int8_copy_of_the_tied_table():
    g = gpt2(precision="int8", layers=1)
    assert g.tensors["layer0.attention_qkv_projection.weight"].dtype == "int8"
    assert g.tensors["embeddings.token.table"].dtype == "fp16"
    head = op(g, "lm_head")
    assert [g.tensors[i].dtype for i in head.inputs] == ["int8", "int8"]
    assert head.inputs[1] == "lm_head.weight" and g.tensors[head.outputs[0]].dtype == "fp16"
    assert g.tensors["lm_head.weight"].shape == g.tensors["embeddings.token.table"].shape
    fp16 = gpt2(layers=1)  # at fp16 the head reads the tied table itself
    assert op(fp16, "lm_head").inputs[1] == "embeddings.token.table"
    # an int8-only array (TPU v1) runs every built-in model at int8
    for name, kw in (("gpt2", dict(seq=16, layers=1)), ("bert-base", dict(seq=16, layers=1))):
        assert wia_hw.run(name, device="tpu-v1", precision="int8", **kw).latency_ms > 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"phase": "infer"}, r"gpt2: phase must be one of prefill, train, decode, got 'infer'"),
        ({"size": "huge"}, r"gpt2: size must be one of small, medium, large, xl, got 'huge'"),
        ({"kv_len": 8}, r"gpt2: kv_len is for phase='decode', got kv_len=8"),
        ({"seq": 1025}, r"gpt2: seq must be in 1..1024, got 1025"),
        ({"phase": "decode", "kv_len": 0}, r"kv_len must be in 1..1023, got 0"),
        ({"phase": "decode", "kv_len": 1000, "seq": 30}, r"seq must be in 1..24, got 30"),
        ({"batch": 0, "size": "xl"}, r"gpt2-xl: batch must be >= 1, got 0"),
    ],
)
def test_gpt2_bad_arguments(kwargs, match):
    with pytest.raises(WorkloadError, match=match):
        gpt2(**kwargs)


# -- ResNet-50 -------------------------------------------------------------------------


def resnet50_macs(image: int) -> int:
    """MACs of ResNet-50 v1.5 walked from its topology, independently of the builder."""

    def conv(hw: int, cin: int, cout: int, k: int, stride: int) -> tuple[int, int]:
        ho, _ = conv_output_hw(hw, hw, k, k, stride, k // 2)
        return ho, ho * ho * cin * cout * k * k

    hw, total = conv(image, 3, 64, 7, 2)
    hw = conv_output_hw(hw, hw, 3, 3, 2, 1)[0]  # max pool
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            _, m1 = conv(hw, cin, width, 1, 1)
            hw2, m2 = conv(hw, width, width, 3, s)
            _, m3 = conv(hw2, width, 4 * width, 1, 1)
            total += m1 + m2 + m3
            if i == 0:
                total += conv(hw, cin, 4 * width, 1, s)[1]
            hw, cin = hw2, 4 * width
    return total + 2048 * 1000


def test_resnet50_macs_per_image():
    g = resnet50(batch=2)
    assert g.macs() == 2 * resnet50_macs(224)
    assert resnet50_macs(224) / 1e9 == pytest.approx(4.1, rel=0.01)
    assert resnet50(image=160).macs() == resnet50_macs(160)


def test_resnet50_topology():
    g = resnet50(batch=4)
    convs = [o for o in g.ops if o.kind == "conv2d"]
    assert len(convs) == 1 + 3 * 16 + 4  # stem, 16 bottlenecks, 4 projections
    assert all(len(o.inputs) == 3 for o in convs)  # batch norm folded into a bias
    assert sum(o.kind == "add" for o in g.ops) == 16
    assert {o.group for o in g.ops} == {"conv", "pool", "residual", "output"}
    assert out_shape(g, "stem.maxpool") == (4, 64, 56, 56)
    assert out_shape(g, "layer2.0.conv2") == (4, 128, 28, 28)  # v1.5: stride on the 3x3
    assert out_shape(g, "layer2.0.conv1") == (4, 128, 56, 56)
    assert out_shape(g, "layer4.2.residual_relu") == (4, 2048, 7, 7)
    assert out_shape(g, "fc") == (4, 1000)
    assert g.sequences == 4


def test_resnet50_int8():
    g = resnet50(precision="int8")
    assert g.tensors["layer1.0.conv1.weight"].dtype == "int8"
    assert g.tensors["layer1.0.conv1.bias"].dtype == "int32"
    assert g.tensors["fc"].dtype == "fp16"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"batch": 0}, r"resnet50: batch must be >= 1, got 0"),
        ({"image": 16}, r"resnet50: image must be >= 32, got 16"),
        ({"precision": "fp64"}, r"resnet50: precision must be one of .*got 'fp64'"),
    ],
)
def test_resnet50_bad_arguments(kwargs, match):
    with pytest.raises(WorkloadError, match=match):
        resnet50(**kwargs)


# -- GEMM ------------------------------------------------------------------------------


def test_gemm():
    g = gemm(100, 60, 30)
    (o,) = g.ops
    assert (o.name, o.kind, o.group) == ("gemm", "matmul", "gemm")
    assert g.flops() == 2 * 100 * 60 * 30
    assert g.tensors["gemm"].shape == (100, 60)
    b = gemm(16, 8, 4, precision="int8", batch=5)
    assert b.ops[0].kind == "bmm" and b.tensors["gemm"].shape == (5, 16, 8)
    assert b.macs() == 5 * 16 * 8 * 4 and b.sequences == 5
    assert b.tensors["A"].dtype == "int8" and b.tensors["gemm"].dtype == "int32"


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 4, 4), r"gemm: M must be >= 1, got 0"),
        ((4, -1, 4), r"gemm: N must be >= 1, got -1"),
        ((4, 4, "8"), r"gemm: K must be an integer, got '8'"),
    ],
)
def test_gemm_bad_arguments(args, match):
    with pytest.raises(WorkloadError, match=match):
        gemm(*args)


# -- build() and hand-made graphs ------------------------------------------------------


@pytest.mark.parametrize("name", ["bert-large", "BERT_Large", "Bert-LARGE", " bert_large "])
def test_build_names(name):
    assert build(name, batch=1, seq=8, layers=1).name == "bert-large"


def test_build_every_workload():
    assert set(WORKLOADS) == {"bert-large", "bert-base", "gpt2", "resnet50", "gemm"}
    assert build("gemm", M=8, N=8, K=8).flops() == 2 * 8**3
    assert build("GPT2", phase="decode").params["phase"] == "decode"
    assert build("ResNet-50").name == "resnet50"


def test_build_unknown_name_lists_the_known_ones():
    with pytest.raises(
        WorkloadError,
        match=r"unknown workload 'llama' \(known: bert-large, "
        r"bert-base, gpt2, resnet50, gemm",
    ):
        build("llama")


def test_build_unknown_argument():
    with pytest.raises(
        WorkloadError,
        match=r"workload 'resnet50': .*'seq'.*\(takes batch, "
        r"precision, image\)",
    ):
        build("resnet50", seq=128)


def test_hand_made_graph_with_mismatched_shapes():
    ts = [
        Tensor("x", (4, 8), "fp16", "input"),
        Tensor("w", (16, 4), "fp16", "weight"),
        Tensor("y", (4, 4), "fp16"),
    ]
    with pytest.raises(
        WorkloadError,
        match=r"op 'proj' \(linear\): input \[4, 8\] does not "
        r"match weight \[16, 4\]",
    ):
        Graph("bad", ts, [Op("proj", "linear", ("x", "w"), ("y",))])
