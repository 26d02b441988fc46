"""Make ``tests/data/onnx/yolo/``: Ultralytics YOLO detectors as ``model.export(format=
"onnx")`` writes them, weight-stripped, with their MACs counted in PyTorch.

Needs torch, ultralytics and onnx (not wia-hw's own test extras); nothing is
downloaded (the models are built from their YAML, with random weights):

    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch ultralytics onnx
    YOLO_OFFLINE=1 /tmp/tv/bin/python scripts/make_yolo_fixtures.py [--out tests/data/onnx/yolo]

``yolov8n`` and ``yolo11n`` (YOLO11's C2PSA blocks hold self-attention) at 320 x 320,
batch 1, opset 17, without onnx-simplifier, their tensors above 1 KiB stripped (dims
kept, values dropped: MACs and timing need no weights). ``yolo_macs.json`` holds each
model's MACs as PyTorch runs it: every Conv2d's output elements x (input channels
per group x kernel), and for each attention block N x N x (key_dim + head_dim) x
heads for its two products (N = H x W tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")

import onnx  # noqa: E402
import torch  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.nn.modules.block import Attention  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
IMGSZ = 320


def macs(model: torch.nn.Module) -> int:
    total = 0

    def conv(mod: torch.nn.Conv2d, inp: tuple, out: torch.Tensor) -> None:
        nonlocal total
        total += (
            out.numel() * mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
        )

    def attention(mod: Attention, inp: tuple, out: torch.Tensor) -> None:
        nonlocal total
        b, _, h, w = inp[0].shape
        n = h * w
        total += b * mod.num_heads * n * n * (mod.key_dim + mod.head_dim)

    hooks = [
        m.register_forward_hook(conv if isinstance(m, torch.nn.Conv2d) else attention)
        for m in model.modules()
        if isinstance(m, (torch.nn.Conv2d, Attention))
    ]
    with torch.no_grad():
        model(torch.zeros(1, 3, IMGSZ, IMGSZ))
    for h in hooks:
        h.remove()
    return total


def strip(path: Path) -> None:
    """Drop the values of tensors above 1 KiB (kept as dims with an external-data
    marker to a file that is not there)."""
    m = onnx.load(str(path))
    for t in m.graph.initializer:
        if len(t.raw_data) > 1024:
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            e = t.external_data.add()
            e.key, e.value = "location", f"{path.name}.data"
    for n in m.graph.node:
        n.doc_string = ""
    onnx.save(m, str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "onnx" / "yolo"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name in ("yolov8n", "yolo11n"):
        torch.manual_seed(0)
        yolo = YOLO(f"{name}.yaml")
        counts[name] = macs(yolo.model.eval())
        with tempfile.TemporaryDirectory() as tmp:
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                made = Path(yolo.export(format="onnx", imgsz=IMGSZ, simplify=False, opset=17))
                shutil.copyfile(made, out / f"{name}.onnx")
            finally:
                os.chdir(cwd)
        strip(out / f"{name}.onnx")
        sys.stdout.write(
            f"{name}: {(out / f'{name}.onnx').stat().st_size:,} B, {counts[name]:,} MACs\n"
        )
    (out / "yolo_macs.json").write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
