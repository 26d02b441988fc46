"""How emulating collectives scales with the cluster size (issue #11).

For 8, 16, 32, 64, 128 and 256 devices on a ring of 100 GB/s links (2 us), and on the
squarest 2D torus, this prints the wall and CPU time of an nccl-tests-style all-reduce
sweep (ring algorithm, 1 KB to 1 GB doubling, as ``wia-hw collectives`` runs it), with
the transfers simulated and the simulated time of the 1 GB all-reduce. CPU time is the
load-independent figure on a shared machine.

The training-iteration figures of the issue (a data-parallel BERT-Large iteration on
8 and 64 devices) need the training scheduler, which is not written yet.

Usage: ``python benchmarks/cluster_speed.py [--max-devices 256] [--max-size 1G]``
"""

from __future__ import annotations

import argparse
import time

import wia_hw
from wia_hw.cli._collectives import parse_size, sweep_sizes


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
    args = ap.parse_args()
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
                rec = comm.all_reduce(nbytes=s)
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
