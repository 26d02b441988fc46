"""The timeline: a report as Chrome Trace Event Format JSON (Perfetto, chrome://tracing).

JSON object form: ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``.
Timestamps (``ts``) and durations (``dur``) are microseconds of device time from the
session's start (cycles / clock). One process (``pid`` 1) is the device; its threads
(tracks) are, top to bottom:

* ``runs``, ``ops``, ``kernels`` (instrumentation and counter modes): complete events
  (``"ph": "X"``) per ``ctx.run``, op and kernel launch;
* ``core N`` (trace modes): one event per tile computed on the core's array or vector
  unit; in sampling mode, the sampled state (kernel computing / waiting) per sample;
* ``dmaN load`` (trace modes): the operand loads of core N's DMA engine, with the bytes
  and the L1/L2 misses each caused; ``dmaN store K``: result stores, which overlap one
  another in the model, laid out on as few lanes K as keep each lane non-overlapping;
* ``hbm channel N``, ``l2 port`` (trace modes): every transfer those ports served.

Counter tracks (``"ph": "C"``): HBM/L2/L1 bandwidth per kernel (GB/s, from its
counters), cache misses per DMA burst, power (W) over the whole session
(:func:`power_steps`: each kernel's, the write-backs', static power while idle) and
temperature (°C) per kernel, HBM queue and DMA queue depth per sample, device memory
allocated and reserved (GB). :func:`check_trace_events` is the format check the tests
run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..emulator.device import TraceEvent, TraceLog
from ._ports import merged

__all__ = ["chrome_trace", "check_trace_events", "event_rows", "power_steps"]

_PID = 1


def event_rows(events: Sequence[TraceEvent]) -> Iterable[tuple[Any, ...]]:
    """``events`` as tuples ``(kind, track, start, end, kernel, nbytes, l1_misses,
    l2_misses)``, in order: a :class:`~wia_hw.emulator.device.TraceLog`'s rows as they
    are (no event object built), any other sequence's events field by field."""
    if isinstance(events, TraceLog):
        return events.rows()
    return (
        (e.kind, e.track, e.start, e.end, e.kernel, e.nbytes, e.l1_misses, e.l2_misses)
        for e in events
    )


def chrome_trace(report: Any) -> dict[str, Any]:
    """The report's timeline as a Trace Event Format object (see the module docstring)."""
    dev = report.device
    t0 = report.start_cycle
    us_per_cycle = 1.0 / (dev.clock_ghz * 1e3)

    def us(c: int) -> float:
        return round((c - t0) * us_per_cycle, 4)

    ev: list[dict[str, Any]] = []
    tids: dict[str, int] = {}

    def tid(name: str) -> int:
        t = tids.get(name)
        if t is None:
            t = tids[name] = len(tids) + 1
        return t

    def span(
        track: str, name: str, start: int, end: int, cat: str, args: Mapping[str, Any] | None = None
    ) -> None:
        e: dict[str, Any] = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": us(start),
            "dur": round(us(end) - us(start), 4),
            "pid": _PID,
            "tid": tid(track),
        }
        if args:
            e["args"] = dict(args)
        ev.append(e)

    def counter(name: str, cycle: int, values: Mapping[str, float]) -> None:
        ev.append(
            {
                "name": name,
                "cat": "counter",
                "ph": "C",
                "ts": us(cycle),
                "pid": _PID,
                "args": {k: float(v) for k, v in values.items()},
            }
        )

    for name in ("runs", "ops", "kernels"):
        tid(name)
    for r in report.runs:
        cs = r.callsite
        span(
            "runs",
            f"run {r.workload}",
            r.start_cycle,
            r.end_cycle,
            "run",
            {
                "params": r.params,
                "callsite": str(cs) if cs else None,
                "writeback_cycles": r.writeback_cycles,
            },
        )
    for o in report.ops:
        span(
            "ops",
            o.name,
            o.start_cycle,
            o.end_cycle,
            "op",
            {"group": o.group, "kind": o.kind, "kernels": len(o.kernels)},
        )
    for k in report.kernels:
        args: dict[str, Any] = {
            "op": k.op,
            "group": k.group,
            "kind": k.kind,
            "precision": k.precision,
            "cycles": k.cycles,
            "flops": k.flop_count,
            "tiles": k.tiles,
            "cores_used": k.cores_used,
        }
        span("kernels", k.name, k.start_cycle, k.end_cycle, "kernel", args)
        nb = k.counter("bytes")
        if nb is not None and k.cycles:
            secs = k.cycles / (dev.clock_ghz * 1e9)
            counter(
                "bandwidth (GB/s)",
                k.start_cycle,
                {lvl: nb[lvl] / secs / 1e9 for lvl in ("hbm", "l2", "l1")},
            )
        if k.temperature_c is not None:
            counter("temperature (C)", k.end_cycle, {"temperature": k.temperature_c})
    if report.kernels:
        last = max(k.end_cycle for k in report.kernels)
        if any(k.counter("bytes") is not None for k in report.kernels):
            counter("bandwidth (GB/s)", last, {"hbm": 0.0, "l2": 0.0, "l1": 0.0})
    for cycle, watts in power_steps(report):
        counter("power (W)", cycle, {"power": watts})

    if report.device_events is not None:
        for c in range(dev.cores):
            tid(f"core {c}")
        for c in range(dev.cores):
            tid(f"dma{c} load")
        lanes: dict[str, list[int]] = {}
        for kind, track, start, end, kernel, nbytes, m1, m2 in event_rows(report.device_events):
            if kind == "compute":
                span(f"core {track[4:]}", kernel, start, end, "compute")
            elif kind == "dma":
                span(
                    f"{track} load",
                    kernel,
                    start,
                    end,
                    "dma",
                    {"bytes": nbytes, "l1_misses": m1, "l2_misses": m2},
                )
                if m1 or m2:
                    counter("cache misses (blocks)", start, {"l1": m1, "l2": m2})
            else:
                ends = lanes.setdefault(track, [])
                lane = next((i for i, e in enumerate(ends) if e <= start), None)
                if lane is None:
                    lane = len(ends)
                    ends.append(end)
                else:
                    ends[lane] = end
                span(f"{track} store {lane}", kernel, start, end, "store", {"bytes": nbytes})
    if report.port_events is not None:
        names = sorted(report.port_events, key=lambda n: (n == "l2", len(n), n))
        for name in names:
            track = "l2 port" if name == "l2" else f"hbm channel {name.split('.')[-1]}"
            for start, end, nbytes in merged(report.port_events[name]):
                span(track, "transfer", start, end, "memory", {"bytes": nbytes})

    if report.samples and report.device_events is None:
        for c in range(dev.cores):
            tid(f"core {c}")
        for c in range(dev.cores):
            run: tuple[str, int] | None = None
            for s in report.samples:
                k = s.kernels[c]
                state = (
                    None if k is None else f"{k} ({'computing' if s.computing[c] else 'waiting'})"
                )
                if run is not None and (state != run[0]):
                    span(f"core {c}", run[0], run[1], s.cycle, "sample")
                    run = None
                if state is not None and run is None:
                    run = (state, s.cycle)
            if run is not None and report.samples:
                s = report.samples[-1]
                span(f"core {c}", run[0], run[1], s.cycle + s.weight_cycles, "sample")
    for s in report.samples:
        counter("HBM queue (cycles)", s.cycle, {"backlog": s.hbm_backlog_cycles})
        counter("DMA queue (requests)", s.cycle, {f"dma{i}": q for i, q in enumerate(s.dma_queue)})

    mem = report.memory
    if mem is not None and mem.events:
        tl = mem.timeline()
        for c, a, r in zip(tl["cycle"], tl["allocated"], tl["reserved"], strict=True):
            counter("device memory (GB)", c, {"allocated": a / 1e9, "reserved": r / 1e9})

    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "args": {"name": dev.name}}
    ]
    for rank, (name, t) in enumerate(sorted(tids.items(), key=lambda kv: _order(kv[0]))):
        meta.append(
            {"name": "thread_name", "ph": "M", "pid": _PID, "tid": t, "args": {"name": name}}
        )
        meta.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": _PID,
                "tid": t,
                "args": {"sort_index": rank},
            }
        )
    used = {e["tid"] for e in ev if "tid" in e}
    meta = [m for m in meta if "tid" not in m or m["tid"] in used]
    return {
        "traceEvents": meta + ev,
        "displayTimeUnit": "ns",
        "otherData": {
            "generator": "wia-hw",
            "device": dev.name,
            "clock_ghz": dev.clock_ghz,
            "start_cycle": t0,
            "mode": getattr(report.mode, "value", str(report.mode)),
            "time_unit": "microseconds of device time",
        },
    }


def power_steps(report: Any) -> list[tuple[int, float]]:
    """The ``power (W)`` counter as ``(cycle, W)`` steps over the session, each held
    until the next, the last (0 W) at the session's end; empty when the mode captured no
    power. Its integral is the session's energy (``counters.energy_pj``):

    * a kernel: its mean power (its energy over its cycles);
    * a run's final write-back (the ``writeback_cycles`` after its last kernel): the
      write-backs' energy over their time (the session's energy less the kernels' and
      the idle time's), one mean power for all of a session's write-backs;
    * any other time without a kernel (the device waiting, e.g. on a memory
      reservation): static power, the only power an idle device draws.

    A report read back from JSON holds no spec, so no static power: there every time
    without a kernel gets the mean power of all of it (its energy over its time)."""
    ks = sorted((k for k in report.kernels if k.power_w is not None), key=lambda k: k.start_cycle)
    if not ks:
        return []
    t0, t1 = report.start_cycle, report.end_cycle
    hz = report.device.clock_ghz * 1e9
    # (start, end, what): kernels and write-back tails, then the idle time between them
    spans: list[tuple[int, int, Any]] = [(k.start_cycle, k.end_cycle, k) for k in ks]
    for r in report.runs:
        if r.writeback_cycles > 0:
            a, b = max(t0, r.end_cycle - r.writeback_cycles), min(t1, r.end_cycle)
            if b > a:
                spans.append((a, b, "writeback"))
    spans.sort(key=lambda s: (s[0], s[1]))
    full: list[tuple[int, int, Any]] = []
    cur = t0
    for a, b, what in spans:
        if a > cur:
            full.append((cur, a, "idle"))
        a = max(a, cur)
        if b > a:
            full.append((a, b, what))
        cur = max(cur, b)
    if t1 > cur:
        full.append((cur, t1, "idle"))
    rest_j = report.counters.energy_pj * 1e-12 - sum(
        k.power_w * k.cycles / hz for k in ks if k.cycles
    )
    wb_s = sum(b - a for a, b, w in full if w == "writeback") / hz
    idle_s = sum(b - a for a, b, w in full if w == "idle") / hz
    spec = getattr(report, "spec", None)
    static_w = getattr(spec, "static_power_w", None)
    if static_w is not None and wb_s:
        idle_w, wb_w = static_w, (rest_j - static_w * idle_s) / wb_s
    else:  # all the time without a kernel alike
        idle_w = wb_w = rest_j / (wb_s + idle_s) if wb_s + idle_s else 0.0
    steps: list[tuple[int, float]] = []
    for a, _b, what in full:
        w = idle_w if what == "idle" else wb_w if what == "writeback" else what.power_w
        steps.append((a, float(w)))
    steps.append((t1, 0.0))
    return steps


def _order(track: str) -> tuple[int, int, int, int]:
    """Display order: runs, ops, kernels; per core its array, DMA loads, DMA store
    lanes; HBM channels; the L2 port."""
    fixed = {"runs": 0, "ops": 1, "kernels": 2}
    if track in fixed:
        return (0, fixed[track], 0, 0)
    nums = [int(x) for x in re.findall(r"\d+", track)] + [0, 0]
    if track.startswith("core "):
        return (1, nums[0], 0, 0)
    if track.startswith("dma"):
        return (1, nums[0], 1 if track.endswith("load") else 2, nums[1])
    if track.startswith("hbm channel"):
        return (2, nums[0], 0, 0)
    return (3, 0, 0, 0)


_REQUIRED = {
    "X": ("name", "ph", "ts", "dur", "pid", "tid"),
    "B": ("name", "ph", "ts", "pid", "tid"),
    "E": ("ph", "ts", "pid", "tid"),
    "C": ("name", "ph", "ts", "pid", "args"),
    "i": ("name", "ph", "ts", "pid", "s"),
    "I": ("name", "ph", "ts", "pid"),
    "M": ("name", "ph", "pid", "args"),
}


def check_trace_events(obj: Any, *, eps_us: float = 1e-3) -> list[str]:
    """Problems with a Trace Event Format object (empty when it is valid): the JSON
    object form with a ``traceEvents`` list; each event's required keys for its phase;
    numeric, finite, non-negative ``ts`` (microseconds) and ``dur``; numeric counter
    values; metadata with a name; and, per ``(pid, tid)`` track, complete events that
    do not overlap (each starts at or after the previous one's end, within ``eps_us``
    of rounding)."""
    problems: list[str] = []
    if not isinstance(obj, Mapping) or not isinstance(obj.get("traceEvents"), list):
        return ["not a JSON object with a 'traceEvents' list"]
    if obj.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        problems.append(f"displayTimeUnit must be 'ms' or 'ns', got {obj['displayTimeUnit']!r}")
    tracks: dict[tuple[Any, Any], list[tuple[float, float, int]]] = {}
    for i, e in enumerate(obj["traceEvents"]):
        if not isinstance(e, Mapping):
            problems.append(f"event {i}: not an object")
            continue
        ph = e.get("ph")
        if ph not in _REQUIRED:
            problems.append(f"event {i}: unknown phase {ph!r}")
            continue
        missing = [k for k in _REQUIRED[ph] if k not in e]
        if missing:
            problems.append(f"event {i} ({ph}): missing {', '.join(missing)}")
            continue
        for key in ("ts", "dur"):
            if key in e:
                v = e[key]
                if (
                    isinstance(v, bool)
                    or not isinstance(v, (int, float))
                    or not math.isfinite(v)
                    or v < 0
                ):
                    problems.append(
                        f"event {i}: {key} must be a non-negative number of microseconds, got {v!r}"
                    )
        if ph == "C" and not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in e["args"].values()
        ):
            problems.append(f"event {i}: counter values must be numbers")
        if ph == "M" and not isinstance(e["args"], Mapping):
            problems.append(f"event {i}: metadata args must be an object")
        if ph == "X":
            ts, dur = e.get("ts"), e.get("dur")
            if isinstance(ts, (int, float)) and isinstance(dur, (int, float)):
                tracks.setdefault((e["pid"], e["tid"]), []).append((ts, ts + dur, i))
    for (pid, t), spans in tracks.items():
        spans.sort()
        for (_s0, e0, i0), (s1, _e1, i1) in zip(spans, spans[1:], strict=False):
            if s1 < e0 - eps_us:
                problems.append(
                    f"track pid={pid} tid={t}: event {i1} starts at {s1} us, "
                    f"before event {i0} ends at {e0} us"
                )
    return problems
