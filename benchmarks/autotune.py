"""Auto-tuning on BERT-Large b32 s128 (wia-npu): random search against the ML-guided
tuner over several seeds, the end-to-end latency the tuned schedules give, and the
speed of candidate evaluation.

Usage: ``python benchmarks/autotune.py [--seeds 5] [--trials 48] [--device wia-npu]
[--no-prune]``

What it prints:

1. Best latency found against trials: the sum over BERT-Large's GEMM kernel keys of
   (ops sharing the key) x (best cycles found after ``t`` trials of that key, the
   kernel alone on a fresh device), in ms. Median over the seeds per method, with the
   grid search (one walk, no seed) beside them.
2. Trials to reach random search's final result: for each seed, the first trial count
   at which each method's curve is at or below random's value after all ``--trials``;
   the medians must favour the ML-guided tuner.
3. End-to-end: ``wia_hw.run`` of BERT-Large without schedules and with the ML-guided
   tuner's schedules (seed 0) from a JSON file, with the run's roofline floor.
4. Candidate evaluation: cold candidates (cache misses, the first time a candidate is
   met) per second and the wall time of each (median, P90, share under 1 ms), split by
   how each was decided: ``pruned`` (its lower bound is at or above the best so far, no
   emulator run), ``cut`` (the emulator stopped at the best's cycle) or ``run`` (a whole
   emulator run: it beat the best, or was the default); then cache hits, and all
   evaluations together. ``--no-prune`` runs every candidate whole (the figures
   before pruning).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import wia_hw
from wia_hw.optimize import AutotuneConfig, autotune_model
from wia_hw.runtime import open_device, resolve_workload


def curve(res: wia_hw.AutotuneResult, trials: int, clock_ghz: float) -> list[float]:
    """Latency (ms) of the tuned kernels after t = 0..trials trials of each key."""
    out = []
    for t in range(trials + 1):
        cycles = sum(k.count * k.history[min(t, len(k.history) - 1)] for k in res.kernels.values())
        out.append(cycles / (clock_ghz * 1e6))
    return out


def stats(walls: list[float]) -> str:
    """Median, P90 and share at or under 1 ms of wall times in seconds."""
    w = sorted(walls)
    p90 = w[min(len(w) - 1, int(0.9 * len(w)))]
    under = sum(1 for x in w if x <= 1e-3) / len(w)
    return (
        f"median {1e3 * statistics.median(w):.2f}, P90 {1e3 * p90:.2f}, "
        f"max {1e3 * w[-1]:.2f}; {100 * under:.0f}% <= 1 ms"
    )


def first_reach(c: list[float], target: float) -> int:
    return next((t for t, v in enumerate(c) if v <= target + 1e-12), len(c))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=48)
    ap.add_argument("--device", default="wia-npu")
    ap.add_argument("--no-prune", action="store_true", help="run every candidate whole")
    args = ap.parse_args(argv)

    ctx = open_device(args.device)
    clock = ctx.spec.clock_ghz
    graph = resolve_workload("bert-large", batch=32, seq=128)
    print(
        f"BERT-Large b32 s128 on {ctx.spec.name}: {args.trials} trials per kernel key, "
        f"{args.seeds} seeds"
    )

    curves: dict[str, list[list[float]]] = {"random": [], "ml": []}
    results: dict[tuple[str, int], wia_hw.AutotuneResult] = {}
    wall: dict[str, float] = {"random": 0.0, "ml": 0.0, "grid": 0.0}
    hits = 0
    cold_s = eval_s = 0.0
    walls: list[tuple[str, float]] = []
    for method in ("grid", "random", "ml"):
        for seed in range(1 if method == "grid" else args.seeds):
            cfg = AutotuneConfig(
                method=method,
                max_trials=args.trials,
                time_budget_seconds=None,
                seed=seed,
                prune=not args.no_prune,
            )
            res = autotune_model(graph, cfg, device=ctx)
            results[(method, seed)] = res
            wall[method] += res.wall_s
            walls += res.cold_walls_s
            hits += res.cache_hits
            cold_s += res.cold_s
            eval_s += res.eval_s
            if method != "grid":
                curves[method].append(curve(res, args.trials, clock))
    grid_curve = curve(results[("grid", 0)], args.trials, clock)
    first = results[("random", 0)]
    print(
        f"\n{len(first.kernels)} kernel keys over "
        f"{sum(k.count for k in first.kernels.values())} GEMM ops; pool sizes "
        + ", ".join(str(k.pool_size) for k in first.kernels.values())
    )

    print("\n1. Best GEMM latency found (ms, kernels alone) against trials per key")
    print(
        f"{'trials':>6} {'grid':>9} {'random med':>11} {'ml med':>9} "
        f"{'random min..max':>17} {'ml min..max':>17}"
    )
    marks = sorted({0, 1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, args.trials})
    for t in (m for m in marks if m <= args.trials):
        r = [c[t] for c in curves["random"]]
        m = [c[t] for c in curves["ml"]]
        print(
            f"{t:6d} {grid_curve[t]:9.3f} {statistics.median(r):11.3f} "
            f"{statistics.median(m):9.3f} {min(r):8.3f}..{max(r):7.3f} "
            f"{min(m):8.3f}..{max(m):7.3f}"
        )

    print("\n2. Trials to reach random search's final result (per seed)")
    reach_r, reach_m = [], []
    for s in range(args.seeds):
        target = curves["random"][s][-1]
        reach_r.append(first_reach(curves["random"][s], target))
        reach_m.append(first_reach(curves["ml"][s], target))
        print(
            f"  seed {s}: random final {target:.4f} ms reached at trial {reach_r[-1]} by "
            f"random, {reach_m[-1]} by ml (ml final {curves['ml'][s][-1]:.4f} ms)"
        )
    med_r, med_m = statistics.median(reach_r), statistics.median(reach_m)
    verdict = "fewer" if med_m < med_r else "NOT fewer"
    print(f"  median: random {med_r}, ml {med_m} -> ml-guided needs {verdict} trials")
    print(
        f"  search wall (all seeds, incl. model fits): grid {wall['grid']:.1f} s, "
        f"random {wall['random']:.1f} s, ml {wall['ml']:.1f} s"
    )

    print("\n3. End-to-end (wia_hw.run, one fresh device each)")
    best = results[("ml", 0)]
    with tempfile.TemporaryDirectory() as tmp:
        path = best.save(Path(tmp) / "bert_large_schedules.json")
        t0 = time.perf_counter()
        base = wia_hw.run(graph, device=ctx.spec)
        tuned = wia_hw.run(graph, device=ctx.spec, schedules=path)
        run_s = time.perf_counter() - t0
    print(best.table())
    print(
        f"  untuned: {base.latency_ms:.3f} ms   tuned: {tuned.latency_ms:.3f} ms   "
        f"({100 * (1 - tuned.latency_ms / base.latency_ms):.1f}% lower)   "
        f"roofline floor: {tuned.roofline_floor_ms:.3f} ms   ({run_s:.1f} s for both runs)"
    )
    ok = tuned.latency_ms < base.latency_ms and tuned.latency_ms >= tuned.roofline_floor_ms

    print("\n4. Candidate evaluation (wall ms per candidate)")
    cold = len(walls)
    print(
        f"  cold candidates (cache misses): {cold} in {cold_s:.2f} s = "
        f"{cold / cold_s:.0f} candidates/s; {stats([w for _, w in walls])}"
    )
    for kind in ("pruned", "cut", "run"):
        ws = [w for k, w in walls if k == kind]
        if ws:
            print(f"    {kind:6} {len(ws):5d} ({100 * len(ws) / cold:4.1f}%): {stats(ws)}")
    hit_s = max(eval_s - cold_s, 1e-9)
    print(
        f"  cache hits: {hits} in {hit_s * 1e3:.1f} ms = {hits / hit_s:,.0f} candidates/s "
        f"({1e6 * hit_s / max(1, hits):.1f} us each)"
    )
    total = cold + hits
    print(
        f"  all evaluations incl. cache hits: {total} in {eval_s:.2f} s = "
        f"{total / eval_s:.0f} candidates/s"
    )
    return 0 if ok and med_m < med_r else 1


if __name__ == "__main__":
    sys.exit(main())
