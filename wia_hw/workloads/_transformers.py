"""Transformer workloads: BERT (encoder) and GPT-2 (decoder) inference graphs.

Op names and groups follow the seed (WIA-AI-011 section 8.7): every layer ``i`` has
ops named ``layer{i}.attention_qkv_projection``, ``layer{i}.attention_scores``,
``layer{i}.attention_softmax``, ``layer{i}.attention_context``,
``layer{i}.attention_output_projection`` (group ``multi_head_attention``),
``layer{i}.attention_residual``, ``layer{i}.attention_layer_norm``,
``layer{i}.ffn_residual``, ``layer{i}.ffn_layer_norm`` (group ``layer_norm``) and
``layer{i}.feed_forward_intermediate``, ``layer{i}.feed_forward_gelu``,
``layer{i}.feed_forward_output`` (group ``feed_forward``); the embeddings are group
``embedding`` and the head is group ``output``.

Modelling choices (shared by both models):

* **Head split and merge are views.** The fused QKV projection writes ``[B, S, 3H]``;
  ``layer{i}.attention_split_heads`` reshapes it to ``[3*B*heads, S, dh]`` and three
  leading-axis slices (``attention_query``/``_key``/``_value``) take q, k and v. In
  a row-major buffer that reshape is really a permutation; we treat it as a strided
  view (the NPU's DMA reads heads with strides, or the QKV epilogue writes head-major
  as fused kernels do), so no copy is modelled. The slices are then contiguous blocks
  (:func:`wia_hw.graph.is_view`). ``attention_merge_heads`` is the same view back.
* **No padding mask:** every sequence is full length; the softmax scale ``1/sqrt(dh)``
  is an attribute of ``attention_scores`` (fused into the bmm epilogue).
* **int8** (``precision="int8"``): every GEMM (the four projections, both attention
  bmms, the pooler and classifier) reads int8 activations and int8 weights with int32
  bias and int32 accumulation. Their epilogues write int8 where a GEMM consumes the
  result next (QKV -> bmm, context -> output projection) and fp16 otherwise. Softmax,
  layer norm, GELU, residual adds and the embeddings stay fp16; softmax and GELU write
  int8 for the GEMM after them, and an explicit ``cast`` (``*_input_quantize``)
  quantises the fp16 residual stream before the QKV and FFN projections. GPT-2's LM
  head is an int8 GEMM too, on a stored int8 copy of the tied token-embedding table
  (``lm_head.weight``; the embeddings read the fp16 table), so int8-only arrays
  (TPU v1) run the whole model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..emulator.errors import WorkloadError
from ..graph import Graph, GraphBuilder
from ._common import check_choice, check_int, layer_norm, linear, precision_dtypes, to_dtype

MHA, LN, FFN, EMB, OUT = (
    "multi_head_attention",
    "layer_norm",
    "feed_forward",
    "embedding",
    "output",
)


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes of one transformer model."""

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    max_positions: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


BERT_LARGE = TransformerConfig("bert-large", 24, 1024, 16, 4096, 30522, 512)
BERT_BASE = TransformerConfig("bert-base", 12, 768, 12, 3072, 30522, 512)
#: Token-type (segment) vocabulary of BERT.
BERT_TYPE_VOCAB = 2
#: Classes of the small classifier head on the BERT pooler.
BERT_CLASSES = 2
GPT2_SIZES = {
    "small": TransformerConfig("gpt2", 12, 768, 12, 3072, 50257, 1024),
    "medium": TransformerConfig("gpt2-medium", 24, 1024, 16, 4096, 50257, 1024),
    "large": TransformerConfig("gpt2-large", 36, 1280, 20, 5120, 50257, 1024),
    "xl": TransformerConfig("gpt2-xl", 48, 1600, 25, 6400, 50257, 1024),
}


def _attention(
    b: GraphBuilder,
    p: str,
    x: str,
    cfg: TransformerConfig,
    batch: int,
    seq: int,
    gd: str,
    fd: str,
    *,
    causal: bool,
    kv_len: int = 0,
) -> str:
    """Multi-head self-attention of ``x [B, S, H]`` -> ``[B, S, H]`` (fp dtype ``fd``).

    With ``kv_len > 0`` the keys and values are the cached ``[B*heads, kv_len, dh]``
    inputs ``{p}.past_key``/``{p}.past_value`` concatenated with the new ones.
    """
    h, dh, bh = cfg.hidden, cfg.head_dim, batch * cfg.heads
    b.group = MHA
    xq = to_dtype(b, f"{p}.attention_input_quantize", x, gd)
    qkv = linear(b, f"{p}.attention_qkv_projection", xq, 3 * h, out_dtype=gd)
    heads = b.op("reshape", f"{p}.attention_split_heads", [qkv], shape=(3 * bh, seq, dh))
    q, k, v = (
        b.op("slice", f"{p}.attention_{what}", [heads], axis=0, start=i * bh, stop=(i + 1) * bh)
        for i, what in enumerate(("query", "key", "value"))
    )
    if kv_len:
        k = b.op(
            "concat",
            f"{p}.attention_key_cache",
            [b.input(f"{p}.past_key", (bh, kv_len, dh), gd), k],
            axis=1,
        )
        v = b.op(
            "concat",
            f"{p}.attention_value_cache",
            [b.input(f"{p}.past_value", (bh, kv_len, dh), gd), v],
            axis=1,
        )
    scores = b.op(
        "bmm",
        f"{p}.attention_scores",
        [q, k],
        transpose_b=True,
        scale=1.0 / math.sqrt(dh),
        dtype=fd,
    )
    attrs = {"causal": True, "past": kv_len} if causal else {}
    probs = b.op("softmax", f"{p}.attention_softmax", [scores], dtype=gd, **attrs)
    ctx = b.op("bmm", f"{p}.attention_context", [probs, v], dtype=gd)
    merged = b.op("reshape", f"{p}.attention_merge_heads", [ctx], shape=(batch, seq, h))
    return linear(b, f"{p}.attention_output_projection", merged, h, out_dtype=fd)


def _feed_forward(b: GraphBuilder, p: str, x: str, cfg: TransformerConfig, gd: str, fd: str) -> str:
    """``W2 gelu(W1 x)``: ``[B, S, H] -> [B, S, H]``."""
    b.group = FFN
    xq = to_dtype(b, f"{p}.feed_forward_input_quantize", x, gd)
    mid = linear(b, f"{p}.feed_forward_intermediate", xq, cfg.ffn, out_dtype=fd)
    act = b.op("gelu", f"{p}.feed_forward_gelu", [mid], dtype=gd)
    return linear(b, f"{p}.feed_forward_output", act, cfg.hidden, out_dtype=fd)


def _residual(b: GraphBuilder, name: str, x: str, y: str) -> str:
    return b.op("add", name, [x, y], group=LN)


def _bert(
    cfg: TransformerConfig, batch: int, seq: int, precision: str, layers: int | None
) -> Graph:
    w = cfg.name
    batch = check_int(w, "batch", batch)
    seq = check_int(w, "seq", seq, 1, cfg.max_positions)
    layers = cfg.layers if layers is None else check_int(w, "layers", layers)
    gd, fd = precision_dtypes(w, precision)
    h = cfg.hidden
    b = GraphBuilder(w, fd)

    b.group = EMB
    ids = b.input("input_ids", (batch, seq), "int64")
    pos = b.input("position_ids", (seq,), "int64")
    seg = b.input("token_type_ids", (batch, seq), "int64")
    tok = b.op(
        "embedding", "embeddings.word", [ids, b.weight("embeddings.word.table", (cfg.vocab, h))]
    )
    pe = b.op(
        "embedding",
        "embeddings.position",
        [pos, b.weight("embeddings.position.table", (cfg.max_positions, h))],
    )
    te = b.op(
        "embedding",
        "embeddings.token_type",
        [seg, b.weight("embeddings.token_type.table", (BERT_TYPE_VOCAB, h))],
    )
    x = b.op("add", "embeddings.add_position", [tok, pe])
    x = b.op("add", "embeddings.add_token_type", [x, te])
    x = layer_norm(b, "embeddings.layer_norm", x)

    for i in range(layers):  # post-LN: x = LN(x + f(x))
        p = f"layer{i}"
        a = _attention(b, p, x, cfg, batch, seq, gd, fd, causal=False)
        x = layer_norm(
            b, f"{p}.attention_layer_norm", _residual(b, f"{p}.attention_residual", x, a), group=LN
        )
        f = _feed_forward(b, p, x, cfg, gd, fd)
        x = layer_norm(b, f"{p}.ffn_layer_norm", _residual(b, f"{p}.ffn_residual", x, f), group=LN)

    b.group = OUT  # pooler on the [CLS] token, then the classifier head
    cls = b.op("slice", "pooler.cls_token", [x], axis=1, start=0, stop=1)
    cls = b.op("reshape", "pooler.flatten", [cls], shape=(batch, h))
    pooled = linear(b, "pooler.dense", to_dtype(b, "pooler.quantize", cls, gd), h, out_dtype=fd)
    pooled = b.op("tanh", "pooler.tanh", [pooled])
    linear(
        b, "classifier", to_dtype(b, "classifier.quantize", pooled, gd), BERT_CLASSES, out_dtype=fd
    )
    return b.graph(
        sequences=batch,
        params={
            "model": w,
            "batch": batch,
            "seq": seq,
            "precision": precision.lower(),
            "layers": layers,
        },
    )


def bert_large(
    batch: int = 32, seq: int = 128, precision: str = "fp16", *, layers: int | None = None
) -> Graph:
    """BERT-Large encoder inference (L=24, H=1024, 16 heads, FFN 4096, vocab 30522).

    ``seq`` must be in 1..512 (the position table), ``batch >= 1``, ``precision`` one
    of fp32, fp16, bf16, int8; ``layers`` overrides the number of encoder layers.
    Returns a :class:`~wia_hw.graph.Graph` with ``sequences = batch`` and ``params``
    model, batch, seq, precision, layers. Bad arguments raise
    :class:`~wia_hw.WorkloadError` naming the argument and its value.
    """
    return _bert(BERT_LARGE, batch, seq, precision, layers)


def bert_base(
    batch: int = 32, seq: int = 128, precision: str = "fp16", *, layers: int | None = None
) -> Graph:
    """BERT-Base encoder inference (L=12, H=768, 12 heads, FFN 3072); as
    :func:`bert_large` otherwise."""
    return _bert(BERT_BASE, batch, seq, precision, layers)


def gpt2(
    batch: int = 1,
    seq: int | None = None,
    precision: str = "fp16",
    phase: str = "prefill",
    kv_len: int | None = None,
    size: str = "small",
    *,
    layers: int | None = None,
) -> Graph:
    """GPT-2 decoder inference (pre-LN, causal attention, GELU, vocab 50257).

    ``size`` is small (12 x 768), medium (24 x 1024), large (36 x 1280) or xl
    (48 x 1600). ``phase="prefill"`` runs ``seq`` prompt tokens (default 128) with a
    causal mask and computes next-token logits for the **last token only** (a
    generating server needs nothing else). ``phase="train"`` is the forward pass of
    training: the same ``seq`` tokens, with logits for **every** position (the
    causal-LM loss reads all of them, so the LM head is a ``[B*S, H] x [V, H]^T``
    GEMM; :func:`wia_hw.train_iteration` builds GPT-2 so). ``phase="decode"`` runs
    ``seq`` new tokens (default 1) that attend to ``kv_len`` cached tokens (default
    128): each layer's cache is an input ``[B*heads, kv_len, dh]`` concatenated with
    the new keys and values (a copy, as in a framework that concatenates; an in-place
    cache append would move only the new rows), and every new token gets logits.
    ``kv_len + seq`` must fit the 1024 positions (``n_positions``: the cached tokens
    take positions ``0..kv_len-1``, the new ones ``kv_len..kv_len+seq-1``; so one new
    token attends to at most 1023 cached ones). The LM head is tied to the token
    embedding table (``bmm`` with ``transpose_b``), after the final layer norm; both
    are group ``output``.
    """
    phase = check_choice("gpt2", "phase", phase, ("prefill", "train", "decode"))
    size = check_choice("gpt2", "size", size, tuple(GPT2_SIZES))
    cfg = GPT2_SIZES[size]
    w = cfg.name
    batch = check_int(w, "batch", batch)
    if phase != "decode":
        if kv_len is not None:
            raise WorkloadError(
                f"{w}: kv_len is for phase='decode', got kv_len={kv_len!r} with phase={phase!r}"
            )
        past = 0
        seq = check_int(w, "seq", 128 if seq is None else seq, 1, cfg.max_positions)
    else:
        # GPT-2's position table has n_positions rows (ids 0..n_positions-1); the cached
        # tokens hold positions 0..kv_len-1 and the new ones kv_len..kv_len+seq-1, so
        # kv_len + seq <= n_positions: kv_len is at most n_positions - 1 for one new token
        n = cfg.max_positions
        why = (
            f" (GPT-2 has n_positions={n}: the kv_len cached tokens and the seq new "
            f"ones take positions 0..kv_len+seq-1, so kv_len + seq <= {n})"
        )
        try:
            past = check_int(w, "kv_len", 128 if kv_len is None else kv_len, 1, n - 1)
            seq = check_int(w, "seq", 1 if seq is None else seq, 1, n - past)
        except WorkloadError as e:
            raise WorkloadError(str(e) + (why if "must be in" in str(e) else "")) from None
    layers = cfg.layers if layers is None else check_int(w, "layers", layers)
    gd, fd = precision_dtypes(w, precision)
    h = cfg.hidden
    b = GraphBuilder(w, fd)

    b.group = EMB
    ids = b.input("input_ids", (batch, seq), "int64")
    pos = b.input("position_ids", (seq,), "int64")
    wte = b.weight("embeddings.token.table", (cfg.vocab, h))
    tok = b.op("embedding", "embeddings.token", [ids, wte])
    pe = b.op(
        "embedding",
        "embeddings.position",
        [pos, b.weight("embeddings.position.table", (cfg.max_positions, h))],
    )
    x = b.op("add", "embeddings.add_position", [tok, pe])

    for i in range(layers):  # pre-LN: x = x + f(LN(x))
        p = f"layer{i}"
        a = _attention(
            b,
            p,
            layer_norm(b, f"{p}.attention_layer_norm", x, group=LN),
            cfg,
            batch,
            seq,
            gd,
            fd,
            causal=True,
            kv_len=past,
        )
        x = _residual(b, f"{p}.attention_residual", x, a)
        f = _feed_forward(b, p, layer_norm(b, f"{p}.ffn_layer_norm", x, group=LN), cfg, gd, fd)
        x = _residual(b, f"{p}.ffn_residual", x, f)

    b.group = OUT
    if phase == "prefill":
        x = b.op("slice", "lm_head.last_token", [x], axis=1, start=seq - 1, stop=seq)
        rows = batch
    else:
        rows = batch * seq
    x = b.op("reshape", "lm_head.flatten", [x], shape=(rows, h))
    x = layer_norm(b, "final_layer_norm", x)
    # at int8 the head is an int8 GEMM too: the tied table's quantised copy, stored
    head = wte if gd == fd else b.weight("lm_head.weight", (cfg.vocab, h), gd)
    xq = to_dtype(b, "lm_head.quantize", x, gd)
    b.op("bmm", "lm_head", [xq, head], transpose_b=True, dtype=fd)
    return b.graph(
        sequences=batch,
        params={
            "model": w,
            "batch": batch,
            "seq": seq,
            "precision": precision.lower(),
            "layers": layers,
            "phase": phase,
            "kv_len": past,
        },
    )
