"""Models as Hugging Face Optimum exports them (tests/data/onnx/optimum, made by
scripts/make_optimum_fixtures.py): BERT for sequence classification, and GPT-2 and
LLaMA decoders with their KV cache as inputs (``past_sequence_length``, and the
attention mask's ``past_sequence_length + sequence_length``). Each imports with the
dims Optimum names, computes in functional mode every output ONNX Runtime computed
(logits and present keys and values), and runs from the command line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw.cli import cli

pytest.importorskip("onnx")

OPT = Path(__file__).parent / "data" / "onnx" / "optimum"
NAMES = sorted(p.stem for p in OPT.glob("*.onnx"))


def test_the_exports_are_there():
    assert NAMES == ["bert_cls", "bert_cls.ortopt", "gpt2_past", "llama_past"]


def test_onnx_runtimes_fused_bert_is_written_back():
    """ONNX Runtime's optimizer made bert_cls.ortopt of its own kernels; imported, they
    are standard ops again, found as attention, layer norms and GELUs."""
    import onnx

    ops = {n.op_type for n in onnx.load(str(OPT / "bert_cls.ortopt.onnx")).graph.node}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"} <= ops
    g = wia_hw.from_onnx(OPT / "bert_cls.ortopt.onnx", batch=2, dims={"sequence_length": 8})
    kinds = [o.kind for o in g.ops]
    assert kinds.count("softmax") == 2 and kinds.count("gelu") == 2
    assert kinds.count("layer_norm") == 5  # the embeddings' and two per layer
    plain = wia_hw.from_onnx(OPT / "bert_cls.onnx", batch=2, dims={"sequence_length": 8})
    assert g.macs() == plain.macs()


@pytest.mark.parametrize("name", NAMES)
def test_computes_what_onnx_runtime_computed(name):
    data = np.load(OPT / f"{name}.npz")
    dims = {k[4:]: int(data[k]) for k in data.files if k.startswith("dim_")}
    g = wia_hw.from_onnx(OPT / f"{name}.onnx", batch=dims.pop("batch_size"), dims=dims)
    feeds = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
    used = {t.name for t in g.tensors.values() if t.kind == "input"}
    out = wia_hw.run(
        g, mode="functional", inputs={k: v for k, v in feeds.items() if k in used}
    ).outputs
    wanted = [k[4:] for k in data.files if k.startswith("out_")]
    assert set(wanted) <= set(g.declared_outputs)
    for o in wanted:
        want = data[f"out_{o}"]
        np.testing.assert_allclose(out[o], want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=o)
    softmax = [o for o in g.ops if o.kind == "softmax"]
    assert len(softmax) == 2 and all(o.attrs.get("masked") for o in softmax)


def test_the_decoders_run_from_the_command_line():
    for name in ("gpt2_past", "llama_past"):
        path = str(OPT / f"{name}.onnx")
        r = CliRunner().invoke(cli, ["run", path, "--batch", "4", "--seq", "1"])
        assert r.exit_code != 0 and "-a past_sequence_length=N" in r.output, r.output
        r = CliRunner().invoke(
            cli, ["run", path, "--batch", "4", "--seq", "1", "-a", "past_sequence_length=63"]
        )
        assert r.exit_code == 0, r.output


def test_seq_reaches_optimums_sequence_length_and_is_refused_without_one():
    from wia_hw.serve._model import _onnx_at
    from wia_hw.workloads import build

    path = OPT / "bert_cls.onnx"
    g = build(str(path), batch=2, seq=12)
    assert g.params["dims"] == {"sequence_length": 12}  # only the dims the model has
    assert g.tensors["input_ids"].shape == (2, 12)
    served = _onnx_at(g, path, 4, 16)  # serving re-imports at each executed shape
    assert served.tensors["input_ids"].shape == (4, 16)
    cnn = Path(__file__).parent / "data" / "onnx" / "resnet18.legacy.onnx"
    with pytest.raises(
        wia_hw.WorkloadError, match=r"seq 12 given, but no input has a symbolic sequence dim"
    ):
        build(str(cnn), batch=1, seq=12)
