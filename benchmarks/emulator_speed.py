"""Emulator speed: wall time and SimPy events per second, BERT-Large b32 s128, timing mode.

Prints one table: the whole model, then the scaling with the number of encoder layers
(1, 2, 4, 8, 24); cost should grow linearly with the number of tiles. Target: the
24-layer model in <= 1 s on one core. Usage::

    python benchmarks/emulator_speed.py [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import simpy
from rich.console import Console
from rich.table import Table

import wia_hw
from wia_hw.workloads import build


class _CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules."""

    scheduled = 0

    def schedule(self, event, priority=1, delay=0):  # type: ignore[override]
        _CountingEnvironment.scheduled += 1
        return super().schedule(event, priority, delay)


def measure(layers: int, repeat: int) -> dict[str, float]:
    walls, events = [], 0
    result = None
    for _ in range(repeat):
        graph = build("bert-large", batch=32, seq=128, layers=layers)
        ctx = wia_hw.open_device("wia-npu")
        ctx.device.env = _CountingEnvironment()
        _CountingEnvironment.scheduled = 0
        t0 = time.perf_counter()
        result = ctx.run(graph)
        walls.append(time.perf_counter() - t0)
        events = _CountingEnvironment.scheduled
    assert result is not None
    wall = statistics.median(walls)
    tiles = sum(k.tiles for k in result.kernels)
    return {"layers": layers, "wall_s": wall, "events": events, "tiles": tiles,
            "events_per_s": events / wall, "us_per_tile": wall / tiles * 1e6,
            "latency_ms": result.latency_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per size (median is shown)")
    ap.add_argument("--quick", action="store_true", help="1 run, layers 1 and 2 only")
    args = ap.parse_args()
    sizes = (1, 2) if args.quick else (1, 2, 4, 8, 24)
    repeat = 1 if args.quick else args.repeat
    rows = [measure(n, repeat) for n in sizes]
    t = Table(title="wia-hw emulator speed: BERT-Large b32 s128, timing mode, wia-npu")
    for col in ("layers", "tiles", "SimPy events", "wall (s)", "events/s", "us/tile",
                "emulated latency (ms)"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["layers"]), f"{r['tiles']:,}", f"{r['events']:,}",
                  f"{r['wall_s']:.3f}", f"{r['events_per_s']:,.0f}",
                  f"{r['us_per_tile']:.1f}", f"{r['latency_ms']:.2f}")
    Console().print(t)
    first, last = rows[0], rows[-1]
    Console().print(f"scaling {first['layers']}->{last['layers']} layers: tiles x"
                    f"{last['tiles'] / first['tiles']:.1f}, wall x"
                    f"{last['wall_s'] / first['wall_s']:.1f}")
    if not args.quick:
        verdict = "meets" if last["wall_s"] <= 1.0 else "misses"
        Console().print(f"full model: {last['wall_s']:.3f} s ({verdict} the 1 s target)")


if __name__ == "__main__":
    main()
