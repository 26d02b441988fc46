"""Make ``tests/data/onnx/zoo/``: today's transformer architectures as users export them,
small enough to keep their weights, with PyTorch's own output beside each.

Needs torch, transformers, onnxscript and onnxruntime (not wia-hw's own test extras):

    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch transformers onnxscript onnx \
        onnxruntime
    /tmp/tv/bin/python scripts/make_zoo_fixtures.py [--out tests/data/onnx/zoo]

Each model is built from a transformers config with seeded random weights (nothing is
downloaded) at a toy size (hidden 32, 2 layers, 4 heads, 2 key/value heads where the
architecture has grouped queries, vocabulary 64) and exported by both torch exporters
(``legacy``: TorchScript, ``dynamo``: torch.export) at opset 18 with fixed shapes. The
wrapper returns the last hidden state (``use_cache=False``; decoders get an all-ones
attention mask, as GPT-2's fixture does). ``llama_decode`` is one decode step with a KV
cache: the new token's ids and each layer's past keys and values (6 positions) in,
the hidden state out. ``<name>.npz`` holds the inputs (``in_<input name>``) and
PyTorch's output (``y``): the tests import each file, run it in functional mode and
compare. ``bart`` is a whole encoder-decoder (BART: ``input_ids`` and
``decoder_input_ids`` in, the logits out; the decoder's cross-attention reads the
encoder's output). ``llama_sdpa_op23`` is LLaMA with transformers' default SDPA attention, exported
by the dynamo exporter at opset 23, where it writes ONNX's own Attention and
RMSNormalization ops. ``bert_mask`` is BERT with a padded batch (its attention mask and
token types as inputs) exported at opset 14 by the legacy exporter. ``<name>.ortopt`` (RoBERTa, LLaMA, ViT, T5's encoder, the masked BERT) is the
legacy export put through ONNX Runtime's transformer optimizer (``optimize_model``,
opt_level 1), which writes its fused kernels: SkipLayerNormalization,
SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization and Gelu.

Architectures: LLaMA, Mistral, Qwen2, Phi-3, Gemma (RMSNorm, rotary embeddings,
grouped-query attention, gated SiLU/GELU MLPs), GPT-NeoX (partial rotary, parallel
residual), GPT-2 (GELU in its tanh form), RoBERTa, T5's encoder (relative position bias, RMS norm), ViT (patch
convolution) and Whisper's encoder (1-D convolutions, GELU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import transformers as tf
from transformers.models.whisper.modeling_whisper import WhisperEncoder

ROOT = Path(__file__).resolve().parent.parent
H, LAYERS, HEADS, KV, FFN, VOCAB = 32, 2, 4, 2, 64, 64
BATCH, SEQ = 2, 8


def say(text: str) -> None:
    sys.stdout.write(text + "\n")


class LastHidden(torch.nn.Module):
    """``model(**{key: x}).last_hidden_state``: one tensor in, one out."""

    def __init__(self, model: torch.nn.Module, key: str, decoder: bool) -> None:
        super().__init__()
        self.model, self.key, self.decoder = model, key, decoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kw = {self.key: x}
        if self.decoder:
            kw.update(attention_mask=torch.ones_like(x), use_cache=False)
        r = self.model(**kw)
        return r[0] if isinstance(r, tuple) else r.last_hidden_state


def models() -> dict[str, tuple[torch.nn.Module, str, bool]]:
    common = dict(
        hidden_size=H,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=FFN,
        vocab_size=VOCAB,
    )
    gqa = dict(common, num_key_value_heads=KV, max_position_embeddings=64)
    return {
        "llama": (tf.LlamaModel(tf.LlamaConfig(**gqa)), "ids", True),
        "mistral": (tf.MistralModel(tf.MistralConfig(**gqa)), "ids", True),
        "qwen2": (tf.Qwen2Model(tf.Qwen2Config(**gqa)), "ids", True),
        "phi3": (tf.Phi3Model(tf.Phi3Config(**gqa, pad_token_id=0)), "ids", True),
        "gemma": (tf.GemmaModel(tf.GemmaConfig(**gqa, head_dim=H // HEADS)), "ids", True),
        "gptneox": (
            tf.GPTNeoXModel(tf.GPTNeoXConfig(**common, max_position_embeddings=64)),
            "ids",
            True,
        ),
        "gpt2": (
            tf.GPT2Model(
                tf.GPT2Config(
                    n_embd=H, n_layer=LAYERS, n_head=HEADS, n_positions=64, vocab_size=VOCAB
                )
            ),
            "ids",
            True,
        ),
        "roberta": (
            tf.RobertaModel(tf.RobertaConfig(**common, max_position_embeddings=40)),
            "ids",
            False,
        ),
        "t5enc": (
            tf.T5EncoderModel(
                tf.T5Config(
                    d_model=H,
                    d_kv=H // HEADS,
                    d_ff=FFN,
                    num_layers=LAYERS,
                    num_heads=HEADS,
                    vocab_size=VOCAB,
                )
            ),
            "ids",
            False,
        ),
        "vit": (
            tf.ViTModel(
                tf.ViTConfig(
                    hidden_size=H,
                    num_hidden_layers=LAYERS,
                    num_attention_heads=HEADS,
                    intermediate_size=FFN,
                    image_size=16,
                    patch_size=4,
                )
            ),
            "img",
            False,
        ),
        "whisper_enc": (
            WhisperEncoder(
                tf.WhisperConfig(
                    d_model=H,
                    encoder_layers=LAYERS,
                    encoder_attention_heads=HEADS,
                    encoder_ffn_dim=FFN,
                    num_mel_bins=8,
                    max_source_positions=8,
                )
            ),
            "mel",
            False,
        ),
    }


class Seq2Seq(torch.nn.Module):
    """``model(input_ids, decoder_input_ids).logits``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, decoder_input_ids=dec, use_cache=False).logits


class MaskedBert(torch.nn.Module):
    """BERT with its padding mask and token types as run-time inputs."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, tt: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state


class DecodeStep(torch.nn.Module):
    """One LLaMA decode step: ``ids [B, 1]`` and per layer past ``k``, ``v``
    ``[B, KV, P, H / HEADS]`` in a cache; the last hidden state out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, *past: torch.Tensor) -> torch.Tensor:
        cache = tf.DynamicCache()
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        mask = torch.ones(ids.shape[0], past[0].shape[2] + ids.shape[1], dtype=torch.long)
        return self.model(
            input_ids=ids, past_key_values=cache, attention_mask=mask, use_cache=True
        ).last_hidden_state


def export(
    m: torch.nn.Module,
    args: tuple,
    names: list[str],
    out: Path,
    name: str,
    exporters: tuple[str, ...] = ("legacy", "dynamo"),
    opset: int = 18,
) -> None:
    with torch.no_grad():
        y = m(*args)
    np.savez(
        out / f"{name}.npz",
        y=y.numpy(),
        **{f"in_{n}": a.numpy() for n, a in zip(names, args, strict=True)},
    )
    for exporter in exporters:
        path = out / f"{name}.{exporter}.onnx"
        torch.onnx.export(
            m,
            args,
            str(path),
            input_names=names,
            output_names=["logits" if name == "bart" else "last_hidden_state"],
            opset_version=opset,
            dynamo=exporter == "dynamo",
        )
        say(f"{path.name}: {path.stat().st_size} bytes")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "onnx" / "zoo"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for name, (model, kind, decoder) in models().items():
        for cfg in (getattr(model, "config", None),):
            if cfg is not None:
                cfg._attn_implementation = "eager"
        key = {"ids": "input_ids", "img": "pixel_values", "mel": "input_features"}[kind]
        m = LastHidden(model.eval(), key, decoder).eval()
        gen = torch.Generator().manual_seed(1)
        if kind == "ids":
            x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
        elif kind == "img":
            x = torch.randn(BATCH, 3, 16, 16, generator=gen)
        else:
            x = torch.randn(BATCH, 8, 16, generator=gen)
        export(m, (x,), [key], out, name)
    llama = models()["llama"][0]
    llama.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
    past = [torch.randn(BATCH, KV, 6, H // HEADS, generator=gen) for _ in range(2 * LAYERS)]
    names = ["input_ids"] + [f"past_{kv}{i}" for i in range(LAYERS) for kv in "kv"]
    export(DecodeStep(llama.eval()).eval(), (ids, *past), names, out, "llama_decode")
    bart = tf.BartForConditionalGeneration(
        tf.BartConfig(
            d_model=H,
            encoder_layers=LAYERS,
            decoder_layers=LAYERS,
            encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS,
            encoder_ffn_dim=FFN,
            decoder_ffn_dim=FFN,
            vocab_size=VOCAB,
            max_position_embeddings=32,
        )
    )
    bart.config._attn_implementation = "eager"
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
    dec = torch.randint(1, VOCAB, (BATCH, 5), generator=gen)
    export(Seq2Seq(bart.eval()).eval(), (ids, dec), ["input_ids", "decoder_input_ids"], out, "bart")
    llama.config._attn_implementation = "sdpa"
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    sdpa = LastHidden(llama, "input_ids", True).eval()
    export(sdpa, (x,), ["input_ids"], out, "llama_sdpa_op23", ("dynamo",), 23)
    from onnxruntime.transformers.optimizer import optimize_model

    bert = tf.BertModel(
        tf.BertConfig(
            hidden_size=H,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            vocab_size=VOCAB,
            max_position_embeddings=32,
        )
    )
    bert.config._attn_implementation = "eager"
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 3 :] = 0  # the second sequence is padded
    tt = torch.zeros(BATCH, SEQ, dtype=torch.long)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    export(
        MaskedBert(bert.eval()).eval(), (ids, mask, tt), names, out, "bert_mask", ("legacy",), 14
    )
    opt = optimize_model(
        str(out / "bert_mask.legacy.onnx"),
        model_type="bert",
        num_heads=HEADS,
        hidden_size=H,
        opt_level=1,
        use_gpu=False,
    )
    opt.save_model_to_file(str(out / "bert_mask.ortopt.onnx"))
    say("bert_mask.ortopt.onnx written")

    for name, kind in (("roberta", "bert"), ("llama", "gpt2"), ("vit", "vit"), ("t5enc", "t5")):
        opt = optimize_model(
            str(out / f"{name}.legacy.onnx"),
            model_type=kind,
            num_heads=HEADS,
            hidden_size=H,
            opt_level=1,
            use_gpu=False,
        )
        path = out / f"{name}.ortopt.onnx"
        opt.save_model_to_file(str(path))
        say(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
