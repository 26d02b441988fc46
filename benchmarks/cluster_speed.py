"""How emulating collectives scales with the cluster size (issue #11).

For 8, 16, 32, 64, 128 and 256 devices on a ring of 100 GB/s links (2 us), and on the
squarest 2D torus, this prints the wall and CPU time of an nccl-tests-style all-reduce
sweep (ring algorithm, 1 KB to 1 GB doubling, as ``wia-hw collectives`` runs it), with
the transfers simulated and the simulated time of the 1 GB all-reduce. CPU time is the
load-independent figure on a shared machine.

Then, for the same device counts on the ring, one data-parallel BERT-Large training
iteration (batch 32 per replica, seq 128, Adam, DDP buckets of 25 MiB overlapping the
backward pass): the wall and CPU time of ``wia_hw.train_iteration`` with the kernel
timing cache emptied first (so each figure includes emulating every distinct kernel
once), the all-reduces and transfers it simulated, and the simulated iteration time.
The issue's targets: at most 2 s wall on 8 devices, 10 s on 64. Measured (CPU s,
8 to 256 devices): 0.27, 0.64, 1.30, 3.74, 11.8, 24.3 (the default ``auto`` all-reduce
times the ring and the tree once per bucket size, up to 128 devices). The growth is the
2 n (n - 1) point-to-point transfers of each ring all-reduce, one SimPy event each
(~10 us).

Usage: ``python benchmarks/cluster_speed.py [--max-devices 256] [--max-size 1G]
[--only sweep|train]``
"""

from __future__ import annotations

import argparse
import time

import wia_hw
from wia_hw.cli._collectives import parse_size, sweep_sizes
from wia_hw.train import _backward


def cluster(n: int, topology: str) -> wia_hw.ClusterSpec:
    return wia_hw.load_spec(
        {
            "schema_version": 1,
            "name": f"{topology}-{n}",
            "devices": n,
            "device": "wia-npu",
            "links": {"bandwidth_gbs": 100, "latency_us": 2.0, "topology": topology},
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-devices", type=int, default=256)
    ap.add_argument("--max-size", default="1G")
    ap.add_argument("--only", choices=("sweep", "train"), default=None)
    args = ap.parse_args()
    if args.only != "train":
        sweep(args)
    if args.only != "sweep":
        train(args)


def train(args: argparse.Namespace) -> None:
    print()
    print("data-parallel BERT-Large training iteration, b32 s128 per replica, ring topology")
    print(
        f"{'devices':>7} {'wall s':>8} {'cpu s':>8} {'all-reduces':>11} {'transfers':>10} "
        f"{'iter ms':>9} {'exposed ms':>10} {'overlap %':>9}"
    )
    n = 8
    first = None
    while n <= args.max_devices:
        _backward._CACHE.clear()  # each point emulates its kernels from scratch
        w0, c0 = time.perf_counter(), time.process_time()
        r = wia_hw.train_iteration("bert-large", cluster=cluster(n, "ring"), batch=32, seq=128)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        first = first or wall
        print(
            f"{n:>7} {wall:>8.2f} {cpu:>8.2f} {len(r.records):>11} "
            f"{sum(x.transfers for x in r.records):>10} {r.iteration_ms:>9.2f} "
            f"{r.exposed_comm_ms:>10.2f} {100 * r.overlap_efficiency:>9.1f}   "
            f"(x{wall / first:.1f} the 8-device wall time)",
            flush=True,
        )
        n *= 2


def sweep(args: argparse.Namespace) -> None:
    sizes = sweep_sizes(1024, parse_size(args.max_size))
    print(f"all-reduce sweep, ring algorithm, {len(sizes)} sizes from 1 KB to {sizes[-1] >> 20} MB")
    print(
        f"{'topology':>9} {'devices':>7} {'transfers':>10} {'wall s':>8} {'cpu s':>8} "
        f"{'us/transfer':>11} {'largest ms':>10} {'busbw GB/s':>10}"
    )
    n = 8
    while n <= args.max_devices:
        for topology in ("ring", "torus2d"):
            comm = wia_hw.open_cluster(cluster(n, topology))
            w0, c0 = time.perf_counter(), time.process_time()
            transfers = 0
            rec = None
            for s in sizes:
                rec = comm.all_reduce(nbytes=s, algorithm="ring")
                transfers += rec.transfers
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            assert rec is not None
            print(
                f"{topology:>9} {n:>7} {transfers:>10} {wall:>8.2f} {cpu:>8.2f} "
                f"{cpu / transfers * 1e6:>11.2f} {rec.time_ms:>10.2f} "
                f"{rec.busbw_gbs:>10.1f}",
                flush=True,
            )
        n *= 2


if __name__ == "__main__":
    main()
