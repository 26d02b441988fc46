"""Sweep throughput: points per minute for BERT-Large b32 s128 on the case-study NPU,
with 1 and 2 local worker processes and on a Dask LocalCluster (2 processes x 1 thread).

Each configuration runs a fresh grid of ``--points`` distinct HBM bandwidths into a new
store and prints: wall time (start of the call to the last row written: pool or cluster
start-up included), points per minute over that wall time, the steady rate (points
after the first finished one, per minute of the time after it), and the mean seconds a
worker spent per point (``wall_s`` of the rows) and the CPU seconds it used per point
(``SweepSummary.cpu_s``): on a machine shared with other jobs the wall figures fall,
the CPU figure does not, and 2 x 60 / CPU is what two free cores would give. The issue's goal: >= 200 points/min
with 2 workers on the project's 2-core machine.

    .venv/bin/python benchmarks/sweep_scaling.py            # 24 points per config
    .venv/bin/python benchmarks/sweep_scaling.py --points 6 # smoke size
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from pathlib import Path

import wia_hw
from wia_hw.sweep import open_store


def _sweep(n: int, tag: str) -> dict:
    return {
        "schema_version": 1,
        "name": f"scaling-{tag}",
        "base": "wia-npu",
        "grid": {"memory.hbm.bandwidth_gbs": [600 + 10 * i for i in range(n)]},
        "workloads": {"bert-large": {"batch": 32, "seq": 128}},
        "metrics": ["latency_ms", "throughput", "energy_j", "utilisation"],
    }


def _measure(label: str, n: int, executor, workers: int | None, folder: Path) -> dict:
    store = folder / f"{label.replace(' ', '_')}.sqlite"
    t0 = time.perf_counter()
    s = wia_hw.sweep(_sweep(n, label), executor=executor, store=store, workers=workers)
    wall = time.perf_counter() - t0
    rows = open_store(store).points()
    assert s.computed == n and all(r["status"] == "ok" for r in rows), s
    stamps = sorted(dt.datetime.fromisoformat(r["finished_at"]) for r in rows)
    steady_s = (stamps[-1] - stamps[0]).total_seconds()
    steady = 60 * (n - 1) / steady_s if steady_s > 0 else float("nan")
    per_point = statistics.mean(r["wall_s"] for r in rows)
    cpu = s.cpu_s / n
    print(
        f"{label:<22} {n:>4} points  {wall:6.1f} s  {60 * n / wall:6.1f} points/min  "
        f"steady {steady:6.1f}/min  in a worker: {per_point:4.2f} s wall, {cpu:4.2f} s CPU "
        "per point"
    )
    return {"wall": wall, "steady": steady, "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=24, help="points per configuration")
    ap.add_argument("--no-dask", action="store_true", help="skip the LocalCluster run")
    a = ap.parse_args()
    # one point in this process first: the CPU cost of a point, nothing else running
    from wia_hw.runtime import resolve_workload

    g = resolve_workload("bert-large", batch=32, seq=128)
    wia_hw.open_device("wia-npu").run(g)
    cpu = []
    for _ in range(3):
        c0 = time.process_time()
        wia_hw.open_device("wia-npu").run(g)
        cpu.append(time.process_time() - c0)
    print(f"one BERT-Large b32 s128 point in-process: {min(cpu):.3f} s CPU (best of 3)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _measure("local, 1 worker", a.points, "local", 1, folder)
        two = _measure("local, 2 workers", a.points, "local", 2, folder)
        if not a.no_dask:
            try:
                from distributed import Client, LocalCluster
            except ImportError:
                print("LocalCluster skipped: dask.distributed is not installed")
            else:
                with (
                    LocalCluster(
                        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
                    ) as cluster,
                    Client(cluster) as client,
                ):
                    _measure("dask LocalCluster x2", a.points, client, None, folder)
    goal = 200
    print(
        f"goal >= {goal} points/min with 2 local workers: "
        f"{'met' if two['steady'] >= goal else 'NOT met'} "
        f"(steady {two['steady']:.0f}, wall {60 * a.points / two['wall']:.0f}); "
        f"CPU-bound ceiling on 2 free cores: 2 x 60 / {two['cpu']:.2f} s = "
        f"{120 / two['cpu']:.0f} points/min"
    )
    print(
        f"load average now: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
