"""Wall-clock overhead of each profiling mode against an unprofiled run of the same
workload, measured in one process, interleaved.

For every mode the workload runs in back-to-back pairs, unprofiled then profiled, each
on a fresh device (so both do the same simulated work); the overhead is the median over
the pairs of profiled / unprofiled wall-clock time, minus one (pairing cancels the
drift of a shared machine's load, and the order within a pair alternates; the
interquartile spread is printed), with the same ratio of process CPU time beside it,
and the ratio of the best profiled time to the best unprofiled one (the estimate least
disturbed by other load).
A control row pairs two unprofiled runs: its figure is the noise floor. "gc" is the
median time the garbage collector took inside the profiled runs (the unprofiled runs'
median beside it): what the profiler's allocations cost besides its own code. "own code" is
the time spent in the profiler's own hooks (observer calls, sampler reads, start and
stop) over the rest of the run, timed call by call in 5 separate runs (the median); the trace modes'
recording inside the emulator (event list, traced ports) is not in it. A profiled run's time covers ``start_profiling`` + ``ctx.run`` + ``stop_profiling``;
writing the outputs (JSON report, timeline, flamegraph) is timed apart, after the run
(the JSON's time includes building the report's per-kernel statistics from the run's
records, which a report does when first read).
The seed's targets (section 8.2.1): sampling < 2 %, instrumentation < 15 %, trace < 30 %,
hardware counters < 1 %.

    python benchmarks/profiler_overhead.py            # BERT-Large, batch 32, seq 128
    python benchmarks/profiler_overhead.py --quick    # BERT-Base, batch 2, seq 64
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import wia_hw
from wia_hw.profiling import ProfilingConfig, start_profiling, stop_profiling

TARGETS = {
    "none (control)": None,
    "sampling": 2.0,
    "instrumentation": 15.0,
    "counters": 1.0,
    "trace": 30.0,
    "detailed": None,
}


_GC = {"start": 0.0, "spent": 0.0}


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        _GC["start"] = time.perf_counter()
    else:
        _GC["spent"] += time.perf_counter() - _GC["start"]


def _once(workload: str, kw: dict, mode: str | None) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds, report) of one run on a fresh device; the time the
    garbage collector took in it is left in ``_GC["spent"]``."""
    ctx = wia_hw.open_device()
    gc.collect()
    _GC["spent"] = 0.0
    c0, t0 = time.process_time(), time.perf_counter()
    report = None
    if mode is None:
        ctx.run(workload, **kw)
    else:
        s = start_profiling(ctx, ProfilingConfig(mode=mode, capture_memory=False))
        ctx.run(workload, **kw)
        report = stop_profiling(s)
    return time.perf_counter() - t0, time.process_time() - c0, report


def _own_time(workload: str, kw: dict, mode: str) -> tuple[float, float]:
    """(seconds in the profiler's own hooks, seconds of the whole run): the session's
    observer methods, start/stop and the sampler's reads, timed one by one. The trace
    modes' device-side recording (the device's event list, the traced ports) happens
    inside the emulator and is not included."""
    ctx = wia_hw.open_device()
    spent = [0.0]

    def timed(fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t

        return wrapper

    gc.collect()
    t0 = time.perf_counter()
    t = time.perf_counter()
    s = start_profiling(ctx, ProfilingConfig(mode=mode, capture_memory=False))
    spent[0] += time.perf_counter() - t
    for name in ("run_begin", "op_begin", "op_end", "run_end"):
        setattr(s, name, timed(getattr(s, name)))
    if s._sampler is not None:
        s._sampler._sample = timed(s._sampler._sample)
    ctx.run(workload, **kw)
    t = time.perf_counter()
    stop_profiling(s)
    spent[0] += time.perf_counter() - t
    return spent[0], time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small workload (smoke test)")
    ap.add_argument("--reps", type=int, default=None, help="pairs per mode (default 9, quick 3)")
    ap.add_argument("--modes", default=None, help="comma-separated modes (default: all)")
    a = ap.parse_args()
    if a.modes:
        keep = {"none (control)"} | set(a.modes.split(","))
        for m in [m for m in TARGETS if m not in keep]:
            del TARGETS[m]
    gc.callbacks.append(_gc_timer)
    workload, kw = (
        ("bert-base", {"batch": 2, "seq": 64})
        if a.quick
        else ("bert-large", {"batch": 32, "seq": 128})
    )
    reps = a.reps or (3 if a.quick else 9)
    wall: dict[str, list[float]] = {m: [] for m in TARGETS}
    cpu: dict[str, list[float]] = {m: [] for m in TARGETS}
    plain: list[float] = []
    best: dict[str, list[float]] = {m: [] for m in TARGETS}
    gcs: dict[str, list[float]] = {m: [] for m in TARGETS}
    gc_plain: list[float] = []
    reports: dict[str, object] = {}
    load0 = os.getloadavg()[0]
    _once(workload, kw, None)  # warm imports and caches
    for r in range(reps):
        for m in TARGETS:  # back-to-back pairs
            mode = None if m.startswith("none") else m
            if r % 2:  # alternate the order
                t1, c1, reports[m] = _once(workload, kw, mode)
                gcs[m].append(_GC["spent"])
                t0, c0, _r = _once(workload, kw, None)
                gc_plain.append(_GC["spent"])
            else:
                t0, c0, _r = _once(workload, kw, None)
                gc_plain.append(_GC["spent"])
                t1, c1, reports[m] = _once(workload, kw, mode)
                gcs[m].append(_GC["spent"])
            plain.append(t0)
            best[m].append(t1)
            wall[m].append(t1 / t0 - 1.0)
            cpu[m].append(c1 / c0 - 1.0)
    print(
        f"{workload} {kw}: {reps} pairs per mode; unprofiled run best "
        f"{min(plain) * 1e3:.1f} ms, median {statistics.median(plain) * 1e3:.1f} ms; "
        f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
        f"on {os.cpu_count()} CPUs"
    )
    print(
        f"{'mode':<16}{'overhead':>9}{'(cpu)':>8}{'spread':>16}{'best/best':>10}"
        f"{'target':>9}{'own code':>15}{'gc ms':>8}     outputs (ms): json / timeline / flamegraph"
    )
    print(f"{'':<16}(unprofiled runs: gc {1e3 * statistics.median(gc_plain):.1f} ms median)")
    own = {  # the profiler's own code, as a share of the rest of the run: median of 5
        m: statistics.median(
            100 * o / max(1e-9, t - o) for o, t in (_own_time(workload, kw, m) for _ in range(5))
        )
        for m in TARGETS
        if not m.startswith("none")
    }
    with tempfile.TemporaryDirectory() as tmp:
        for m in TARGETS:
            w = sorted(wall[m])
            ovh, covh = 100 * statistics.median(w), 100 * statistics.median(cpu[m])
            q1, q3 = 100 * w[len(w) // 4], 100 * w[(3 * len(w)) // 4]
            tgt = TARGETS[m]
            rep = reports[m]
            out = []
            for fn in (
                ()
                if rep is None
                else (
                    lambda p: rep.to_json(),  # noqa: B023
                    lambda p: rep.save_timeline(p.with_suffix(".trace.json")),  # noqa: B023
                    lambda p: rep.save_flamegraph(p.with_suffix(".folded")),  # noqa: B023
                )
            ):
                t0 = time.perf_counter()
                fn(Path(tmp) / m)
                out.append((time.perf_counter() - t0) * 1e3)
            verdict = "" if tgt is None else ("ok" if ovh < tgt else "OVER")
            o = own.get(m)
            own_txt = "" if o is None else f"{o:.2f}%"
            bb = 100 * (min(best[m]) / min(plain) - 1.0)
            print(
                f"{m:<16}{ovh:>8.1f}%{covh:>7.1f}%{f'[{q1:.1f}, {q3:.1f}]%':>16}{bb:>9.1f}%"
                f"{'' if tgt is None else f'< {tgt:g}%':>9} {verdict:<4}{own_txt:>10}"
                f"{1e3 * statistics.median(gcs[m]):>8.1f}"
                + (f"  {out[0]:.0f} / {out[1]:.0f} / {out[2]:.0f}" if out else "")
            )


if __name__ == "__main__":
    main()
