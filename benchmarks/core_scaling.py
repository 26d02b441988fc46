"""Latency against core count: the sweep a user makes first, and where more cores are
still slower (docs/ARCHITECTURE.md, "More cores can be slower").

Usage: ``python benchmarks/core_scaling.py [--device wia-npu] [--cores 1,2,4,8,16,32,64]``

For each workload, the latency at each core count (``--set compute.cores=N``) and, where
a count is slower than the best on fewer cores, by how much; then the largest such
departure over all workloads. The physics says more cores are never slower (the program
for fewer cores still runs); what remains is where the data sits (a consumer's tiles on
other cores than its producer's, L2 thrash), which the emulator models and the lowering
does not yet avoid.
"""

from __future__ import annotations

import argparse
import sys
import time

import wia_hw

WORKLOADS = (
    ("bert-base", {"batch": 8, "seq": 128}),
    ("bert-large", {"batch": 8, "seq": 128}),
    ("gpt2", {"batch": 1, "seq": 64}),
    ("resnet50", {"batch": 1}),
    ("gemm", {"M": 1024, "N": 1024, "K": 1024}),
    ("gemm", {"M": 4096, "N": 4096, "K": 4096}),
    ("gemm", {"M": 256, "N": 4096, "K": 4096}),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="wia-npu")
    ap.add_argument("--cores", default="1,2,4,8,16,32,64")
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.cores.split(",")]
    print(f"{args.device}: latency (ms) at {', '.join(map(str, counts))} cores")
    worst = (0.0, "")
    start = time.perf_counter()
    for name, kw in WORKLOADS:
        label = f"{name} " + " ".join(f"{k}={v}" for k, v in kw.items())
        cells, best = [], None
        for cores in counts:
            r = wia_hw.run(name, device=args.device, overrides={"compute.cores": cores}, **kw)
            ms = r.latency_ms
            cell = f"{ms:.4g}"
            if best is not None and ms > best:
                over = ms / best - 1
                cell += f" (+{100 * over:.1f}%)"
                if over > worst[0]:
                    worst = (over, f"{label} on {cores} cores")
            cells.append(cell)
            best = ms if best is None else min(best, ms)
        print(f"  {label:32s} " + "  ".join(cells))
    if worst[1]:
        print(f"largest departure: +{100 * worst[0]:.1f}% ({worst[1]}, against fewer cores)")
    else:
        print("no count slower than the best on fewer cores")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
