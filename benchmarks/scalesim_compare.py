"""wia-hw against SCALE-Sim on SCALE-Sim's own inputs: the topologies and configurations
in ``tests/data/scalesim`` and the cycles SCALE-Sim 3.0.0 reported for them
(``compute_report.csv``, made by ``scripts/scalesim_reference.py``).

Usage: ``python benchmarks/scalesim_compare.py [--scalesim-python PY]``

For each configuration and topology it prints, summed over the layers:

* ``scalesim``: SCALE-Sim's Total Cycles (compute; InterfaceBandwidth CALC, so no stall);
* ``folds``: SCALE-Sim's folds, each timed by wia-hw's RTL-exact pass
  (``systolic_tile_cycles``) less the output drain SCALE-Sim leaves out (os only), less
  one per layer: equal to ``scalesim`` on every layer (``tests/test_scalesim.py``);
* ``+drain``: the same with the drain, what a non-pipelined array of wia-hw's RTL takes;
* ``emulator``: ``wia-hw run TOPOLOGY --device CONFIG`` (one core, not pipelined, the
  configuration's SRAMs as L1, wia-npu's memory behind them), each layer's kernel
  cycles; ``ideal mem``: the same with memory that never stalls (bandwidths x1000,
  latencies and DMA set-up 0), the array alone with wia-hw's own tiling;
* ``pipelined``: ``ideal mem`` with ``compute.array.pipelined: true`` (double-buffered
  accumulators or weights: a pass fills while the previous drains).

With ``--scalesim-python`` (a Python that has ``scalesim``), SCALE-Sim also runs here:
the wall time of both is printed from the same run, and SCALE-Sim's cycles are checked
against the recorded ones.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import wia_hw
from wia_hw.graph import gemm_dims
from wia_hw.scalesim import fold_cycles, read_topology
from wia_hw.spec import load_spec

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "scalesim"
IDEAL = {
    "memory.hbm.bandwidth_gbs": 600_000,
    "memory.l2.bandwidth_gbs": 4_000_000,
    "memory.l1.bandwidth_gbs": 2_000_000,
    "memory.hbm.latency_ns": 0,
    "memory.l2.latency_cycles": 0,
    "memory.l1.latency_cycles": 0,
    "dma.setup_cycles": 0,
}


def kernel_cycles(topo: Path, spec: object) -> int:
    res = wia_hw.run(str(topo), device=spec)
    return sum(k.cycles for k in res.kernels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scalesim-python", help="a Python with scalesim, to run and time it here")
    args = ap.parse_args(argv)
    with (DATA / "compute_report.csv").open() as f:
        lines = [r for r in csv.reader(f) if r]
    print(f"SCALE-Sim reference: {lines[0][0].lstrip('# ')}")
    peer: dict[tuple[str, str], list[int]] = {}
    for cfg, topo, _l, _pre, cycles, _st in lines[2:]:
        peer.setdefault((cfg, topo), []).append(int(cycles))
    head = (
        f"{'config':8} {'topology':9} {'layers':>6} {'scalesim':>10} {'folds':>10} "
        f"{'+drain':>10} {'emulator':>10} {'ideal mem':>10} {'pipelined':>10}"
    )
    print(head)
    print("-" * len(head))
    exact = total = rerun_differs = 0
    walls: list[tuple[str, float, float]] = []
    for (cfg, topo), cycles in sorted(peer.items()):
        spec = load_spec(DATA / f"{cfg}.cfg")
        a = spec.compute.array
        graph = read_topology(DATA / topo)
        folds = drained = 0
        mine = []
        for op in graph.ops:
            g, m, n, k = gemm_dims(op, graph.shapes_of(op)[0])
            mine += [fold_cycles(a.dataflow, a.rows, a.cols, m, n, k)] * g
            drained += g * fold_cycles(a.dataflow, a.rows, a.cols, m, n, k, drain=True)
        folds = sum(mine)
        exact += sum(x == y for x, y in zip(mine, cycles, strict=True))
        total += len(cycles)
        t0 = time.perf_counter()
        emu = kernel_cycles(DATA / topo, spec)
        wall = time.perf_counter() - t0
        ideal = kernel_cycles(DATA / topo, load_spec(DATA / f"{cfg}.cfg", IDEAL))
        piped = kernel_cycles(
            DATA / topo, load_spec(DATA / f"{cfg}.cfg", {**IDEAL, "compute.array.pipelined": True})
        )
        print(
            f"{cfg:8} {topo:9} {len(cycles):>6} {sum(cycles):>10,} {folds:>10,} {drained:>10,} "
            f"{emu:>10,} {ideal:>10,} {piped:>10,}"
        )
        if args.scalesim_python:
            kind = "gemm" if topo.startswith("gemm") else "conv"
            with tempfile.TemporaryDirectory() as tmp:
                t1 = time.perf_counter()
                subprocess.run(
                    [args.scalesim_python, "-m", "scalesim.scale", "-c", str(DATA / f"{cfg}.cfg")]
                    + ["-t", str(DATA / topo), "-l", str(DATA / "layout.csv"), "-p", tmp]
                    + ["-i", kind, "-s", "N"],
                    check=True,
                    capture_output=True,
                )
                walls.append((f"{cfg} {topo}", wall, time.perf_counter() - t1))
                (report,) = Path(tmp).glob("*/COMPUTE_REPORT.csv")
                with report.open() as f:
                    live = [int(r[2]) for r in list(csv.reader(f))[1:]]
                if live != cycles:
                    print(f"  SCALE-Sim's cycles today differ from the recorded ones: {live}")
                    rerun_differs += 1
    print(
        f"\nlayers whose SCALE-Sim cycles equal wia-hw's folds exactly: {exact} of {total}"
        "\n(os: wia-hw's RTL also drains each fold's results, R cycles; `+drain` counts it)"
    )
    if walls:
        print("\nwall time, same run (s):  wia-hw emulator  SCALE-Sim  ratio")
        for what, ours, theirs in walls:
            print(f"  {what:22} {ours:>14.3f} {theirs:>10.2f} {theirs / ours:>6.0f}x")
        ours, theirs = sum(w[1] for w in walls), sum(w[2] for w in walls)
        print(f"  {'all':22} {ours:>14.3f} {theirs:>10.2f} {theirs / ours:>6.0f}x")
        print(f"SCALE-Sim reruns whose cycles differ from the recorded ones: {rerun_differs}")
    return 0 if exact == total and not rerun_differs else 1


if __name__ == "__main__":
    sys.exit(main())
