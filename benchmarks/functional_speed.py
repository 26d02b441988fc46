"""Functional-mode speed: a GEMM executed over the device's tiles and array passes.

For a 256 x 256 x 256 GEMM (fp16, bf16, int8) on the default device (128 x 128 OS
array) and on 8 x 8 OS and WS arrays (many passes), prints the best wall time of:

* ``run functional``: ``wia_hw.run(..., mode="functional")`` (timing run included);
* ``run timing``: the same run in timing mode (what functional mode adds is the gap);
* ``tiled``: :func:`~wia_hw.emulator.tiled_exec.execute_gemm` alone, passes sharing a
  K range evaluated together (what functional mode uses);
* ``pass by pass``: the same with ``group_passes=False`` (bit-identical, slower);
* ``untiled numpy``: the device-free :func:`~wia_hw.emulator.functional.evaluate`
  (one numpy product per ``tk`` slice; what functional mode did before it executed
  tiles), for the cost ratio.

Target: the 256^3 fp16 GEMM in seconds, not minutes. Usage::

    python benchmarks/functional_speed.py [--size N] [--repeat N] [--models]

``--models`` also times small models (functional against timing mode).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
from rich.console import Console
from rich.table import Table
from wia_hw.emulator.device import Device
from wia_hw.emulator.functional import evaluate
from wia_hw.emulator.tiled_exec import execute_gemm

import wia_hw
from wia_hw.lowering import lower
from wia_hw.spec import load_spec
from wia_hw.workloads import build, gemm

DEVICES = {
    "default 128x128 os": None,
    "8x8 os": {"compute.array.rows": 8, "compute.array.cols": 8},
    "8x8 ws": {"compute.array.rows": 8, "compute.array.cols": 8, "compute.array.dataflow": "ws"},
}


def best_s(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def gemm_row(size: int, precision: str, overrides: dict | None, repeat: int) -> tuple[float, ...]:
    rng = np.random.default_rng(0)
    g = gemm(size, size, size, precision=precision)
    if precision == "int8":
        a = rng.integers(-128, 128, (size, size)).astype(np.int8)
        b = rng.integers(-128, 128, (size, size)).astype(np.int8)
    else:
        a = rng.standard_normal((size, size)).astype(np.float32)
        b = rng.standard_normal((size, size)).astype(np.float32)
    inputs = {"A": a, "B": b}
    spec = load_spec("wia-npu", overrides)
    ((op, (kern,)),) = lower(g, spec)
    tiles, _ = Device(spec).tiles_of(kern)
    arr = spec.compute.array
    kw = dict(dataflow=arr.dataflow, rows=arr.rows, cols=arr.cols)
    out_dtype = "int32" if precision == "int8" else precision
    return (
        best_s(
            lambda: wia_hw.run(g, overrides=overrides, mode="functional", inputs=inputs), repeat
        ),
        best_s(lambda: wia_hw.run(g, overrides=overrides), repeat),
        best_s(lambda: execute_gemm(kern, tiles, a[None], b[None], **kw), repeat),
        best_s(lambda: execute_gemm(kern, tiles, a[None], b[None], group_passes=False, **kw), 1),
        best_s(
            lambda: evaluate(
                op.kind, op.attrs, [a, b], (size, size), out_dtype, kern.tiling.tk, op.name
            ),
            repeat,
        ),
        len(tiles),
        sum(t.passes for t in tiles),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", action="store_true")
    args = ap.parse_args()
    con = Console(width=150)
    t = Table(title=f"functional mode, {args.size}^3 GEMM (best of {args.repeat}, seconds)")
    for col in (
        "precision",
        "device",
        "tiles",
        "passes",
        "run functional",
        "run timing",
        "tiled",
        "pass by pass",
        "untiled numpy",
        "tiled / untiled",
    ):
        t.add_column(col, justify="right")
    for prec in ("fp16", "bf16", "int8"):
        for name, ov in DEVICES.items():
            fn, tm, tiled, each, old, ntiles, npasses = gemm_row(args.size, prec, ov, args.repeat)
            t.add_row(
                prec,
                name,
                str(ntiles),
                str(npasses),
                f"{fn:.3f}",
                f"{tm:.3f}",
                f"{tiled:.3f}",
                f"{each:.3f}",
                f"{old:.4f}",
                f"{tiled / old:.1f}x",
            )
    con.print(t)
    if args.models:
        m = Table(title="small models (seconds, best of 1)")
        for col in ("workload", "functional", "timing"):
            m.add_column(col, justify="right")
        for w, kw in [
            ("bert-base", dict(batch=1, seq=8, layers=2)),
            ("gpt2", dict(batch=1, seq=6, layers=1)),
            ("resnet50", dict(batch=1, image=32)),
        ]:
            g = build(w, **kw)
            fn = best_s(lambda g=g: wia_hw.run(g, mode="functional"), 1)
            m.add_row(f"{w} {kw}", f"{fn:.2f}", f"{best_s(lambda g=g: wia_hw.run(g), 1):.2f}")
        con.print(m)


if __name__ == "__main__":
    main()
