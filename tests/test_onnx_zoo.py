"""Today's transformer architectures as the torch exporters write them
(tests/data/onnx/zoo, made by scripts/make_zoo_fixtures.py with transformers' own model
code, a LLaMA decode step with its KV cache, and BART encoder-decoder): each imports, computes in functional
mode what PyTorch computed, and both exporters' graphs cost the same MACs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import wia_hw
from wia_hw import from_onnx

pytest.importorskip("onnx")

ZOO = Path(__file__).parent / "data" / "onnx" / "zoo"
FILES = sorted(p.name for p in ZOO.glob("*.onnx"))
NAMES = sorted({f.split(".")[0] for f in FILES})
BOTH = [n for n in NAMES if f"{n}.legacy.onnx" in FILES and f"{n}.dynamo.onnx" in FILES]
LAYERS = 2


def test_the_zoo_is_there():
    assert set(NAMES) >= {"llama", "mistral", "qwen2", "phi3", "gemma", "gptneox", "t5enc", "vit"}
    assert "llama_sdpa_op23.dynamo.onnx" in FILES  # ONNX's own Attention and RMSNormalization


@pytest.mark.parametrize("file", FILES)
def test_computes_what_pytorch_computed(file):
    data = np.load(ZOO / f"{file.split('.')[0]}.npz")
    g = from_onnx(ZOO / file)
    inputs = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
    used = {t.name for t in g.tensors.values() if t.kind == "input"}
    assert used <= set(inputs)
    out = wia_hw.run(
        g, device="wia-npu", mode="functional", inputs={k: inputs[k] for k in used}
    ).outputs
    (result,) = g.declared_outputs
    y, want = out[result], data["y"]
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())
    # every attention found (bmm, softmax, bmm), whatever wrote its mask; BART has the
    # encoder's, and the decoder's self- and cross-attention
    attentions = 3 * LAYERS if file.startswith("bart") else LAYERS
    assert sum(o.kind == "softmax" for o in g.ops) == attentions
    assert wia_hw.run(g, device="wia-npu").latency_ms > 0


@pytest.mark.parametrize("name", BOTH)
def test_both_exporters_cost_the_same_macs(name):
    legacy = from_onnx(ZOO / f"{name}.legacy.onnx")
    dynamo = from_onnx(ZOO / f"{name}.dynamo.onnx")
    assert legacy.macs() == dynamo.macs() > 0


GELU = {"vit", "roberta", "whisper_enc", "gptneox", "gpt2", "bert_mask"}
SILU = {"llama", "mistral", "qwen2", "phi3", "llama_decode", "llama_sdpa_op23"}
RMS = {"llama", "mistral", "qwen2", "phi3", "gemma", "t5enc", "llama_decode", "llama_sdpa_op23"}


@pytest.mark.parametrize("file", FILES)
def test_recognition_keeps_the_flops_and_finds_every_norm(file):
    """Pattern recognition fuses without changing FLOPs or MACs, and finds every
    RMSNorm (two per layer and the final one) however the exporter wrote it (x * x or
    Pow, 1 / sqrt or Reciprocal, a same-type Cast before the gain, opset 23's
    RMSNormalization)."""
    g = from_onnx(ZOO / file)
    raw = from_onnx(ZOO / file, recognise=False)
    assert g.flops() == raw.flops() and g.macs() == raw.macs()
    rms = [o for o in g.ops if o.kind == "layer_norm" and o.attrs.get("rms")]
    if file.split(".")[0] in RMS:
        assert len(rms) == 2 * LAYERS + 1, file
        assert wia_hw.run(g).latency_ms < wia_hw.run(raw).latency_ms  # one pass each
    else:
        assert not rms
    if file.split(".")[0] in GELU:  # Erf GELU, in either exporter's operand order
        assert sum(o.kind == "gelu" for o in g.ops) >= LAYERS, file
    if file.split(".")[0] in SILU:  # the gated MLP's x * sigmoid(x)
        assert sum(o.kind == "swish" for o in g.ops) == LAYERS, file
