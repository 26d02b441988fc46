"""Make the weight-stripped ONNX fixtures of ``tests/data/onnx/`` from real exporters.

Needs torch, torchvision, transformers and onnxscript (not wia-hw's own test extras):

    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch torchvision \\
        transformers onnxscript onnx
    /tmp/torchenv/bin/python scripts/make_onnx_fixtures.py [--out tests/data/onnx]

Every model is built with random weights (torchvision ``weights=None``, transformers
from a config: nothing is downloaded) and exported by both torch exporters:
``legacy`` (TorchScript, ``dynamo=False``) and ``dynamo`` (``torch.export``). Inputs
have symbolic dims (``batch``; ``batch`` and ``seq`` for the transformers), so the
graphs carry the exporters' Shape/Gather/Concat chains that the importer must fold.
Each graph is saved with its tensors above 1 KiB in an external data file, which is
then deleted: the committed ``.onnx`` keeps every initializer's dims and the small
constants' values, not the weights (the whole set is a few hundred KiB).

It also writes ``torch_macs.json``: for each model, the MACs that wia-hw computes for
the ONNX export and for :func:`wia_hw.from_torch` (``torch.export``) at the fixture
shape, so CI (without torch) checks the ONNX side against the recorded torch side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import onnx
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Shapes the fixtures are exported (and checked) at.
IMAGE = 224
BATCH = 1
SEQ = 128
#: BERT at BERT-Large's shape (H 1024, 16 heads, FFN 4096) with 2 of its 24 layers;
#: GPT-2 small's shape (H 768) with 2 of its 12 layers: the tests scale by layers.
#: Those two use transformers' "eager" attention (explicit MatMul/Softmax); the
#: *_sdpa_2l models (H 256, 4 heads) keep the default, torch's SDPA, whose exports
#: scale q and k separately and guard the softmax against NaN.
BERT_LAYERS = 2
GPT2_LAYERS = 2


def say(text: str) -> None:
    """Progress on stdout (a script, not library code)."""
    sys.stdout.write(text + "\n")


def cnns() -> dict[str, torch.nn.Module]:
    import torchvision.models as tvm

    return {
        "resnet18": tvm.resnet18(weights=None),
        "resnet50": tvm.resnet50(weights=None),
        "mobilenet_v2": tvm.mobilenet_v2(weights=None),
        "mobilenet_v3_large": tvm.mobilenet_v3_large(weights=None),
        "efficientnet_b0": tvm.efficientnet_b0(weights=None),
    }


class LastHidden(torch.nn.Module):
    """``model(input_ids=ids).last_hidden_state``: one tensor in, one out (both
    exporters trace keyword-free ``forward(ids)``)."""

    def __init__(self, model: torch.nn.Module, ones_mask: bool = False) -> None:
        super().__init__()
        self.model = model
        self.ones_mask = ones_mask

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # GPT-2: an all-ones attention mask made from the ids' shape (it folds to a
        # constant) keeps transformers from its packed-sequence check (aten::diff,
        # which the legacy exporter cannot write)
        mask = torch.ones_like(input_ids) if self.ones_mask else None
        return self.model(
            input_ids=input_ids, attention_mask=mask, use_cache=False
        ).last_hidden_state


class WithMask(torch.nn.Module):
    """``model(input_ids, attention_mask).last_hidden_state``: a padding mask as a
    second run-time input (its mask arithmetic cannot fold)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state


def transformers_models() -> dict[str, torch.nn.Module]:
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(
            hidden_size=1024,
            num_hidden_layers=BERT_LAYERS,
            num_attention_heads=16,
            intermediate_size=4096,
            attn_implementation="eager",
        )
    )
    gpt2 = GPT2Model(GPT2Config(n_layer=GPT2_LAYERS, attn_implementation="eager"))
    # all 24 layers of BERT-Large, for benchmarks/onnx_import.py (the 2 s target)
    bert24 = BertModel(
        BertConfig(
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            attn_implementation="eager",
        )
    )
    # transformers' default attention (torch's scaled_dot_product_attention), small
    bert_sdpa = BertModel(
        BertConfig(
            hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024
        )
    )
    gpt2_sdpa = GPT2Model(GPT2Config(n_layer=2, n_embd=256, n_head=4))
    return {
        "bert_large_2l": LastHidden(bert),
        "gpt2_2l": LastHidden(gpt2, ones_mask=True),
        "bert_sdpa_2l": LastHidden(bert_sdpa),
        "gpt2_sdpa_2l": LastHidden(gpt2_sdpa, ones_mask=True),
        # an attention_mask input (H 128, 1 layer, FFN 256 / 512)
        "bert_mask_1l": WithMask(
            BertModel(
                BertConfig(
                    hidden_size=128,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=256,
                )
            )
        ),
        "gpt2_mask_1l": WithMask(GPT2Model(GPT2Config(n_layer=1, n_embd=128, n_head=2))),
        "bert_large_24l": LastHidden(bert24),
    }


def example(name: str) -> tuple[tuple[torch.Tensor, ...], list[str]]:
    if "_mask_" in name:
        ids = torch.ones(BATCH, SEQ, dtype=torch.long)
        return (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    if name.startswith(("bert", "gpt2")):
        return (torch.ones(BATCH, SEQ, dtype=torch.long),), ["input_ids"]
    return (torch.randn(BATCH, 3, IMAGE, IMAGE),), ["x"]


def export(model: torch.nn.Module, name: str, exporter: str, path: Path) -> None:
    args, names = example(name)
    seq_model = name.startswith(("bert", "gpt2"))
    if exporter == "legacy":
        axes = {n: ({0: "batch", 1: "seq"} if seq_model else {0: "batch"}) for n in names}
        torch.onnx.export(
            model,
            args,
            str(path),
            dynamo=False,
            input_names=names,
            dynamic_axes=axes,
            opset_version=17,
        )
    else:
        batch = torch.export.Dim("batch", min=1, max=1024)
        shapes = {0: batch, 1: torch.export.Dim("seq", min=2, max=512)} if seq_model else {0: batch}
        kw = {n: shapes for n in names}
        prog = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=kw, input_names=names)
        prog.save(str(path), external_data=True)


def strip(src: Path, dst: Path) -> None:
    """Save ``src`` as ``dst`` with tensors above 1 KiB external, then drop the data."""
    proto = onnx.load(str(src))
    for n in proto.graph.node:  # the dynamo exporter's stack traces: not needed
        del n.metadata_props[:]
        n.doc_string = ""
    for vi in proto.graph.value_info:
        del vi.metadata_props[:]
    data = f"{dst.name}.data"
    onnx.save_model(
        proto,
        str(dst),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data,
        size_threshold=1024,
    )
    (dst.parent / data).unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "onnx"))
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument(
        "--no-export", action="store_true", help="keep the .onnx files; only record torch_macs.json"
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    models = {**cnns(), **transformers_models()}
    only = [m for m in args.only.split(",") if m]
    from wia_hw import from_torch
    from wia_hw.workloads import from_onnx

    macs_file = out / "torch_macs.json"
    record = json.loads(macs_file.read_text()) if macs_file.exists() else {}
    for name, model in models.items():
        if only and name not in only:
            continue
        model.eval()
        for exporter in () if args.no_export else ("legacy", "dynamo"):
            dst = out / f"{name}.{exporter}.onnx"
            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "model.onnx"
                try:
                    with torch.no_grad():
                        export(model, name, exporter, raw)
                except Exception as e:  # noqa: BLE001 - report and go on
                    say(
                        f"{name} {exporter}: export failed: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}"
                    )
                    continue
                strip(raw, dst)
            say(f"{dst.name}: {os.path.getsize(dst) / 1024:.0f} KiB")
        if name == "bert_large_24l":
            continue  # the benchmark's model: its 2-layer cut is recorded
        ex, _ = example(name)
        g_torch = from_torch(model, ex)
        seq_model = name.startswith(("bert", "gpt2"))
        dims = {"batch": BATCH, "seq": SEQ} if seq_model else {"batch": BATCH}
        g_onnx = from_onnx(out / f"{name}.legacy.onnx", dims=dims)
        record[name] = {
            "shape": [list(t.shape) for t in ex],
            "torch_export_macs": g_torch.macs(),
            "onnx_legacy_macs": g_onnx.macs(),
            "torch_version": torch.__version__,
        }
        say(f"{name}: torch.export {g_torch.macs():,} MACs, ONNX {g_onnx.macs():,}")
        macs_file.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
