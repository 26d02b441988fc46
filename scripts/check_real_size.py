"""Check functional mode on real-size transformer exports, with their weights.

The committed fixtures are toy-sized (hidden 32) or weight-stripped, and CI has no
torch; this script exports real-size models with seeded random weights (nothing is
downloaded) by both torch exporters, imports each with wia-hw and compares functional
mode's output with PyTorch's. It prints, per model and exporter, the import time, the
largest difference from PyTorch and the output's largest value, and the weights
(if any) that had no values. Real sizes are where weights cross the importer's
folding limits (a 768 x 768 weight is over ``INIT_MAX_ELEMENTS``), so this is where a
weight the exporter moves or slices must keep its values.

Needs torch and transformers (not wia-hw's own test extras):

    /tmp/tv/bin/python scripts/check_real_size.py [--models bert,gpt2,...] [--large]

Models (2 layers at their base sizes): BERT, GPT-2, LLaMA (hidden 1024, grouped
queries), RoBERTa, ViT, T5's encoder, Whisper's encoder. ``--large`` adds BERT-Large
with all 24 layers (a 1.3 GB export; the legacy exporter only), timing its import and
one functional run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers as tf

import wia_hw


class LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}).last_hidden_state


def ids(b: int = 2, s: int = 16) -> torch.Tensor:
    return torch.randint(3, 1000, (b, s))


EAGER = {"attn_implementation": "eager"}
MODELS = {
    "bert": (lambda: tf.BertModel(tf.BertConfig(num_hidden_layers=2, **EAGER)), "input_ids", ids),
    "gpt2": (lambda: tf.GPT2Model(tf.GPT2Config(n_layer=2, **EAGER)), "input_ids", ids),
    "llama": (
        lambda: tf.LlamaModel(
            tf.LlamaConfig(
                hidden_size=1024,
                intermediate_size=2816,
                num_hidden_layers=2,
                num_attention_heads=16,
                num_key_value_heads=4,
                **EAGER,
            )
        ),
        "input_ids",
        ids,
    ),
    "roberta": (
        lambda: tf.RobertaModel(tf.RobertaConfig(num_hidden_layers=2, **EAGER)),
        "input_ids",
        ids,
    ),
    "vit": (
        lambda: tf.ViTModel(tf.ViTConfig(num_hidden_layers=2, **EAGER)),
        "pixel_values",
        lambda: torch.randn(1, 3, 224, 224),
    ),
    "t5": (lambda: tf.T5EncoderModel(tf.T5Config(num_layers=2)), "input_ids", ids),
    "whisper": (
        lambda: (
            tf.WhisperModel(
                tf.WhisperConfig(
                    encoder_layers=2,
                    decoder_layers=1,
                    d_model=384,
                    encoder_attention_heads=6,
                    decoder_attention_heads=6,
                )
            ).encoder
        ),
        "input_features",
        lambda: torch.randn(1, 80, 3000),
    ),
}


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def check(name: str, wrapper: torch.nn.Module, x: torch.Tensor, exporter: str, tmp: Path) -> None:
    with torch.no_grad():
        want = wrapper(x).numpy()
    path = tmp / f"{name}.{exporter}.onnx"
    legacy = exporter == "legacy"
    torch.onnx.export(
        wrapper,
        (x,),
        str(path),
        opset_version=17 if legacy else 18,
        dynamo=not legacy,
        input_names=["x"],
    )
    t0 = time.perf_counter()
    g = wia_hw.from_onnx(path)
    took = time.perf_counter() - t0
    (inp,) = [t.name for t in g.tensors.values() if t.kind == "input"]
    t0 = time.perf_counter()
    y = wia_hw.run(g, mode="functional", inputs={inp: x.numpy()}).outputs[g.declared_outputs[0]]
    run_s = time.perf_counter() - t0
    missing = [
        t.name for t in g.tensors.values() if t.kind == "weight" and t.name not in g.weight_values
    ]
    say(
        f"{name:8} {exporter:7} import {took:6.2f} s, functional {run_s:6.1f} s; "
        f"max |wia-hw - PyTorch| {np.abs(y - want).max():.2e} of {np.abs(want).max():.2f}; "
        f"weights without values: {len(missing)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--large", action="store_true", help="also BERT-Large, 24 layers")
    a = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            make, key, inp = MODELS[name]
            wrapper = LastHidden(make().eval(), key).eval()
            x = inp()
            for exporter in ("legacy", "dynamo"):
                check(name, wrapper, x, exporter, Path(tmp))
        if a.large:
            cfg = tf.BertConfig(
                hidden_size=1024,
                num_hidden_layers=24,
                num_attention_heads=16,
                intermediate_size=4096,
                **EAGER,
            )
            wrapper = LastHidden(tf.BertModel(cfg).eval(), "input_ids").eval()
            check("bert-large", wrapper, ids(1, 128), "legacy", Path(tmp))


if __name__ == "__main__":
    main()
