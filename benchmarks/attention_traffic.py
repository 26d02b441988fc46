"""Flash vs naive attention: HBM traffic and time against sequence length (128..8192).

One attention layer (12 heads of 64, batch 1, fp16) on the emulated device, timing mode,
through :func:`wia_hw.multi_head_attention`: naive attention writes and reads the
``S x S`` scores and probabilities (O(S^2) HBM bytes), flash attention streams K and V
tiles past each query block (O(S d)). Bytes are the HBM counter of the run (including
the final write-back of results). Usage::

    python benchmarks/attention_traffic.py [--device wia-npu] [--causal] [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from rich.console import Console
from rich.table import Table

import wia_hw
from wia_hw import AttentionConfig, AttentionPattern, multi_head_attention

HEADS, HEAD_DIM = 12, 64


def measure(device: str, n: int, flash: bool, causal: bool) -> wia_hw.AttentionResult:
    cfg = AttentionConfig(
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        sequence_length=n,
        use_flash_attention=flash,
        precision="fp16",
        attention_pattern=AttentionPattern.CAUSAL if causal else AttentionPattern.FULL,
    )
    x = np.zeros((1, HEADS, n, HEAD_DIM), np.float16)
    return multi_head_attention(wia_hw.open_device(device), x, x, x, cfg=cfg, functional=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="wia-npu")
    ap.add_argument("--causal", action="store_true", help="causal mask (tiles skipped)")
    ap.add_argument("--quick", action="store_true", help="128..1024 only")
    args = ap.parse_args()
    sizes = [128, 256, 512, 1024] if args.quick else [128, 256, 512, 1024, 2048, 4096, 8192]
    t = Table(
        title=f"attention {HEADS}x{HEAD_DIM}, fp16, {args.device}"
        f"{', causal' if args.causal else ''}"
    )
    for col in (
        "S",
        "flash HBM MB",
        "naive HBM MB",
        "naive/flash bytes",
        "flash ms",
        "naive ms",
        "speedup",
        "flash bytes / (S d)",
        "naive bytes / S^2",
        "wall s",
    ):
        t.add_column(col, justify="right")
    qkvo = 4 * HEADS * HEAD_DIM * 2  # bytes of Q, K, V, O per token
    for n in sizes:
        t0 = time.perf_counter()
        f = measure(args.device, n, True, args.causal)
        v = measure(args.device, n, False, args.causal)
        wall = time.perf_counter() - t0
        t.add_row(
            str(n),
            f"{f.hbm_bytes / 1e6:.2f}",
            f"{v.hbm_bytes / 1e6:.2f}",
            f"{v.hbm_bytes / f.hbm_bytes:.1f}",
            f"{f.latency_ms:.3f}",
            f"{v.latency_ms:.3f}",
            f"{v.latency_ms / f.latency_ms:.2f}x",
            f"{f.hbm_bytes / (n * qkvo):.2f}",
            f"{v.hbm_bytes / (HEADS * n * n):.2f}",
            f"{wall:.2f}",
        )
    Console(width=160).print(t)


if __name__ == "__main__":
    main()
