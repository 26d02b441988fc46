"""Make ``tests/data/onnx/optimum/``: models as Hugging Face Optimum exports them
(``optimum.exporters.onnx.onnx_export_from_model``), with the dims it names
(``batch_size``, ``sequence_length``, ``past_sequence_length`` and the expression
``past_sequence_length + sequence_length``) and its decoders' KV-cache inputs.

Needs torch, transformers, optimum-onnx and onnxruntime (not wia-hw's own extras):

    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch optimum-onnx onnxruntime
    /tmp/tv/bin/python scripts/make_optimum_fixtures.py [--out tests/data/onnx/optimum]

Toy sizes (hidden 32, 2 layers, 4 heads, LLaMA with 2 key/value heads, vocabulary 64),
seeded random weights, nothing downloaded, opset 17:

* ``bert_cls``: BertForSequenceClassification (``text-classification``): input ids,
  an attention mask with padding, token types; the logits out.
* ``gpt2_past`` and ``llama_past``: the causal LMs with their cache
  (``text-generation-with-past``): one decode step after 5 cached positions, the
  second sequence's first two positions padding; the logits and every layer's
  present keys and values out.

``bert_cls.ortopt`` is ``bert_cls`` put through ONNX Runtime's transformer optimizer
(``optimize_model(model_type="bert")``): its embeddings become EmbedLayerNormalization,
its attention com.microsoft::Attention (packed q/k/v, the mask as key lengths), its
norms SkipLayerNormalization and its GELUs BiasGelu.

``<name>.npz`` holds the inputs (``in_<input>``), ONNX Runtime's outputs on the file
(``out_<output>``) and the dims (``dim_<name>``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import transformers as tf
from onnxruntime.transformers.optimizer import optimize_model
from optimum.exporters.onnx import onnx_export_from_model

ROOT = Path(__file__).resolve().parent.parent
BATCH, SEQ, PAST, HEAD = 2, 1, 5, 8


def models() -> dict[str, tuple[torch.nn.Module, str]]:
    small = dict(vocab_size=64)
    return {
        "bert_cls": (
            tf.BertForSequenceClassification(
                tf.BertConfig(
                    hidden_size=32,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=64,
                    **small,
                )
            ),
            "text-classification",
        ),
        "gpt2_past": (
            tf.GPT2LMHeadModel(
                tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **small)
            ),
            "text-generation-with-past",
        ),
        "llama_past": (
            tf.LlamaForCausalLM(
                tf.LlamaConfig(
                    hidden_size=32,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    intermediate_size=64,
                    max_position_embeddings=64,
                    **small,
                )
            ),
            "text-generation-with-past",
        ),
    }


def inputs(sess: ort.InferenceSession, rng: np.random.Generator) -> tuple[dict, dict]:
    """Feeds for every input of the session, and the dims they fix."""
    seq = 8 if "past_key_values.0.key" not in {i.name for i in sess.get_inputs()} else SEQ
    past = 0 if seq != SEQ else PAST
    dims = {"batch_size": BATCH, "sequence_length": seq}
    if past:
        dims["past_sequence_length"] = past
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, 64, (BATCH, seq)).astype(np.int64)
        elif i.name == "attention_mask":
            mask = np.ones((BATCH, past + seq), np.int64)
            mask[1, :2] = 0
            feeds[i.name] = mask
        elif i.name == "token_type_ids":
            feeds[i.name] = (np.arange(seq)[None, :] >= seq // 2).repeat(BATCH, 0).astype(np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.full((BATCH, seq), past, np.int64)
        elif i.name.startswith("past_key_values"):
            heads = i.shape[1]
            feeds[i.name] = rng.standard_normal((BATCH, heads, past, HEAD)).astype(np.float32)
        else:
            raise SystemExit(f"unexpected input {i.name}")
    return feeds, dims


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "onnx" / "optimum"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for name, (model, task) in models().items():
        model.eval()
        with tempfile.TemporaryDirectory() as tmp:
            onnx_export_from_model(model, output=tmp, task=task, opset=17)
            shutil.copyfile(Path(tmp) / "model.onnx", out / f"{name}.onnx")
        names = [name]
        if name == "bert_cls":
            opt = optimize_model(
                str(out / f"{name}.onnx"), model_type="bert", num_heads=4, hidden_size=32
            )
            opt.save_model_to_file(str(out / f"{name}.ortopt.onnx"))
            names.append(f"{name}.ortopt")
        for file in names:
            sess = ort.InferenceSession(
                str(out / f"{file}.onnx"), providers=["CPUExecutionProvider"]
            )
            feeds, dims = inputs(sess, np.random.default_rng(len(file)))
            got = sess.run(None, feeds)
            np.savez_compressed(
                out / f"{file}.npz",
                **{f"in_{k}": v for k, v in feeds.items()},
                **{f"out_{o.name}": v for o, v in zip(sess.get_outputs(), got, strict=True)},
                **{f"dim_{k}": np.int64(v) for k, v in dims.items()},
            )
            sys.stdout.write(f"{file}: {(out / f'{file}.onnx').stat().st_size:,} B\n")


if __name__ == "__main__":
    main()
