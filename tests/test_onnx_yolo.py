"""Ultralytics YOLO detectors as their ``export(format="onnx")`` writes them
(tests/data/onnx/yolo, weight-stripped, made by scripts/make_yolo_fixtures.py):
YOLOv8n and YOLO11n (whose C2PSA blocks hold self-attention) at 320 x 320. Each
imports, costs exactly the MACs PyTorch runs (counted with hooks on its Conv2d and
attention modules), and runs on wia-npu. (With their
weights, both compute what ONNX Runtime computes; the weights are left out of the
repository for their size.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import wia_hw

pytest.importorskip("onnx")

YOLO = Path(__file__).parent / "data" / "onnx" / "yolo"
MACS = json.loads((YOLO / "yolo_macs.json").read_text())


@pytest.mark.parametrize("name", sorted(MACS))
def test_yolo_costs_the_macs_pytorch_runs(name):
    g = wia_hw.from_onnx(YOLO / f"{name}.onnx")
    assert g.macs() == MACS[name]
    assert g.tensors[g.declared_outputs[0]].shape == (1, 84, 2100)  # 4 box + 80 classes
    # YOLO11's attention (C2PSA: q^T k, then v attn^T, over 100 tokens) is there as
    # bmm -> softmax -> bmm, written in an orientation the pattern does not fuse
    bmms = [o for o in g.ops if o.kind == "bmm"]
    assert len(bmms) == (2 if name == "yolo11n" else 0)
    r = wia_hw.run(g, device="wia-npu")
    assert r.latency_ms >= r.roofline_floor_ms > 0
