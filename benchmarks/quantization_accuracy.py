"""Fusion and int8 PTQ: what they gain on BERT-Large and what they cost in accuracy.

1. **BERT-Large b32 s128** on the device, timing mode: baseline fp16, fused
   (:func:`wia_hw.apply_fusion`), int8 PTQ (:func:`wia_hw.quantize_model`), fused + int8:
   latency, roofline floor, HBM bytes. The int8 scales are calibrated on the same
   24-layer model built at batch 1, sequence 16 (functional mode cannot run b32 s128),
   with the same seeded weights.
2. **Digits MLP** (scikit-learn's bundled digits, an MLP trained here, seeded): accuracy
   on the held-out split, fp32 against int8 PTQ for each calibration method, per-channel
   and per-tensor weight scales; agreement with fp32, cosine and max abs error of the
   logits.
3. **BERT-Large reduced** (``--bert-layers`` of 24 layers, batch 2, sequence 16):
   agreement of the final hidden states (last layer norm's output), fp16 against int8,
   per calibration method.

Usage::

    python benchmarks/quantization_accuracy.py [--device wia-npu] [--layers 24]
        [--bert-layers 2] [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

import wia_hw
from wia_hw import QuantizationConfig, apply_fusion, quantize_model
from wia_hw.accuracy import (
    GraphEvaluator,
    agreement_stats,
    calibration_batches,
    compare,
    mlp_to_graph,
    train_digits_mlp,
)
from wia_hw.workloads import build

METHODS = ("minmax", "percentile", "mse", "entropy")


def _bert_batches(n: int, batch: int, seq: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "input_ids": rng.integers(0, 30522, (batch, seq)),
            "position_ids": np.arange(seq),
            "token_type_ids": rng.integers(0, 2, (batch, seq)),
        }
        for _ in range(n)
    ]


def bert_latency(console: Console, device: str, layers: int) -> None:
    g = build("bert-large", batch=32, seq=128, layers=layers)
    t0 = time.perf_counter()
    cal = build("bert-large", batch=1, seq=16, layers=layers)
    cfg = QuantizationConfig(calibration_batches=2)
    q = quantize_model(g, cfg, _bert_batches(2, 1, 16), calibration_graph=cal)
    fused = apply_fusion(g)
    fq = quantize_model(fused, cfg, _bert_batches(2, 1, 16), calibration_graph=cal)
    cal_s = time.perf_counter() - t0
    tab = Table(title=f"BERT-Large b32 s128, {layers} of 24 layers, on {device} (timing)")
    for c in ("variant", "latency_ms", "speedup", "floor_ms", "HBM GB"):
        tab.add_column(c, justify="right" if c != "variant" else "left")
    base = None
    for name, graph in (
        ("baseline fp16", g),
        ("fused", fused),
        ("int8 PTQ", q),
        ("fused + int8 PTQ", fq),
    ):
        r = wia_hw.run(graph, device=device)
        base = base or r.latency_ms
        assert r.latency_ms >= r.roofline_floor_ms
        tab.add_row(
            name,
            f"{r.latency_ms:.2f}",
            f"{base / r.latency_ms:.2f}x",
            f"{r.roofline_floor_ms:.2f}",
            f"{r.counters.bytes['hbm'] / 1e9:.2f}",
        )
    console.print(tab)
    console.print(f"(calibration of both int8 graphs: {cal_s:.1f} s wall)")


def digits(console: Console, device: str) -> None:
    clf, (x_train, x_test, _, y_test) = train_digits_mlp(hidden=(64, 32), seed=0)
    batch = 64
    g, w = mlp_to_graph(clf, batch)
    ref = GraphEvaluator(g, w, device=device).predict(x_test)
    tab = Table(
        title=f"Digits MLP 64-64-32-10 (trained here), held-out split "
        f"({len(y_test)} samples), on {device} (functional)"
    )
    for c in ("variant", "weights", "accuracy %", "delta pts", "agree %", "cosine", "max abs err"):
        tab.add_column(c, justify="right" if c not in ("variant", "weights") else "left")
    r = compare("fp32", ref, ref, y_test)
    tab.add_row("fp32", "fp32", f"{r.accuracy:.2f}", "", "", "", "")
    for method in METHODS:
        for per_channel in (True, False):
            cfg = QuantizationConfig(method=method, per_channel=per_channel, calibration_batches=8)
            q = quantize_model(g, cfg, calibration_batches(x_train, batch, 8), weights=w)
            out = GraphEvaluator(q, device=device).predict(x_test)
            r = compare(method, out, ref, y_test)
            tab.add_row(
                f"int8 {method}",
                "per-channel" if per_channel else "per-tensor",
                f"{r.accuracy:.2f}",
                f"{r.accuracy_delta:+.2f}",
                f"{r.agreement:.2f}",
                f"{r.cosine:.6f}",
                f"{r.max_abs_error:.4f}",
            )
    console.print(tab)


def bert_agreement(console: Console, device: str, layers: int) -> None:
    g = build("bert-large", batch=2, seq=16, layers=layers)
    hidden = f"layer{layers - 1}.ffn_layer_norm"
    test = _bert_batches(1, 2, 16, seed=99)[0]
    tab = Table(
        title=f"BERT-Large REDUCED ({layers} of 24 layers, b2 s16): final hidden "
        f"states, int8 PTQ vs fp16, on {device} (functional)"
    )
    for c in ("method", "cosine", "max abs err", "max |fp16|"):
        tab.add_column(c, justify="right" if c != "method" else "left")
    for method in METHODS:
        q = quantize_model(
            g, QuantizationConfig(method=method, calibration_batches=4), _bert_batches(4, 2, 16)
        )
        ref = GraphEvaluator(g, q.float_weights, device=device).execute(test).values[hidden]
        out = GraphEvaluator(q, device=device).execute(test).values[hidden]
        cos, err = agreement_stats(out, ref)
        tab.add_row(method, f"{cos:.6f}", f"{err:.4f}", f"{np.max(np.abs(ref)):.2f}")
    console.print(tab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="wia-npu")
    ap.add_argument("--layers", type=int, default=24, help="BERT-Large layers (timing)")
    ap.add_argument(
        "--bert-layers",
        type=int,
        default=2,
        help="layers of the reduced BERT-Large (functional agreement)",
    )
    ap.add_argument("--quick", action="store_true", help="2 timing layers, 1 reduced layer")
    a = ap.parse_args()
    if a.quick:
        a.layers, a.bert_layers = 2, 1
    console = Console(width=120)
    bert_latency(console, a.device, a.layers)
    digits(console, a.device)
    bert_agreement(console, a.device, a.bert_layers)


if __name__ == "__main__":
    main()
