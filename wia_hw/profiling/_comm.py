"""Communication profiling (the seed's section 8.5) on a :class:`wia_hw.Communicator`.

``start_comm_profiling(comm, CommProfilingConfig())`` attaches a session to the
communicator; every collective, point-to-point message and device compute that
*finishes* (collectives) or is *issued* (compute) until ``stop_comm_profiling(session)``
is recorded, and the chunk transfers each link served when ``track_bandwidth`` is set.
Every figure is clipped to the session: a collective that began before it counts only
its time inside it (and is left out of ``records`` and ``collective_stats``), and link
time still to be served when it stops is cut there.
The :class:`CommProfileReport` carries every figure the seed prints:

* ``total_comm_time_s``: the length of the union of the recorded communication
  intervals (any rank, any collective); ``total_compute_time_s``: the same for device
  compute; ``overlap_efficiency`` (Holistic Trace Analysis' definition): compute time
  during communication / communication time, i.e. ``|compute ∩ comm| / |comm|`` on
  those unions; ``communication_fraction = comm / (comm + compute)``.
* ``collective_stats``: one :class:`CollectiveStats` per collective name (``send`` for
  point-to-point): count, total/avg/min/max time, ``algbw_gbs`` (bytes / time, as
  nccl-tests), ``busbw_gbs`` (time-weighted bus bandwidth, nccl-tests' factors),
  ``avg_bandwidth_gbs`` (= ``busbw_gbs``) and its ``pct_of_peak`` against
  ``peak_bandwidth_gbs``: the calls' own peaks (``CollectiveRecord.peak_busbw_gbs``,
  the mean over the ranks of what each rank's links can send together; a send's
  slowest link on its path), time-weighted, so it never exceeds 100%;
  ``total_data_gb`` (the nccl-tests sizes summed).
* ``avg/peak/min_bandwidth_util``: the bus bandwidth of each invocation over its own
  peak (fractions, at most 1), averaged (time-weighted), highest, lowest. The report's
  ``peak_bandwidth_gbs`` is the fastest link's, for reference.

Timelines: :meth:`CommProfileReport.chrome_trace` gives Trace Event Format JSON with a
compute and a communication track per rank and one track per link;
:func:`comm_trace_events` gives the same events under another ``pid`` to merge into a
device timeline (:func:`wia_hw.profiling._timeline.chrome_trace`'s ``traceEvents``).
:func:`plot_comm_timeline` draws it with matplotlib.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CommProfilingConfig",
    "CommProfilingSession",
    "CommProfileReport",
    "CollectiveStats",
    "start_comm_profiling",
    "stop_comm_profiling",
    "plot_comm_timeline",
    "comm_trace_events",
    "interval_union",
    "overlap_cycles",
]


@dataclass(frozen=True, kw_only=True)
class CommProfilingConfig:
    """The seed's ``wia_comm_profiling_config_t``. ``track_collectives``: record
    collectives; ``track_p2p``: record send/recv; ``track_bandwidth``: record every
    chunk each link serves (link tracks, ``link_utilization``); ``track_latency``: keep
    each invocation's record in ``report.records`` (timeline, plot); ``track_overlap``:
    record device compute (without it compute time and overlap are 0)."""

    track_collectives: bool = True
    track_p2p: bool = True
    track_bandwidth: bool = True
    track_latency: bool = True
    track_overlap: bool = True

    def __post_init__(self) -> None:
        for n in (
            "track_collectives",
            "track_p2p",
            "track_bandwidth",
            "track_latency",
            "track_overlap",
        ):
            if not isinstance(getattr(self, n), bool):
                raise TypeError(f"{n} must be a bool, got {getattr(self, n)!r}")


@dataclass(frozen=True)
class CollectiveStats:
    """The seed's ``wia_collective_stats_t`` for one collective name (see module doc)."""

    name: str
    count: int
    total_time_s: float
    avg_time_ms: float
    min_time_ms: float
    max_time_ms: float
    avg_bandwidth_gbs: float
    peak_bandwidth_gbs: float
    pct_of_peak: float
    total_data_gb: float
    algbw_gbs: float
    busbw_gbs: float
    algorithms: tuple[str, ...]


def interval_union(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint intervals covering the given half-open ``[start, end)`` spans."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(sp for sp in spans if sp[1] > sp[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def overlap_cycles(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Total length of the intersection of two disjoint sorted interval lists."""
    i = j = tot = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            tot += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


@dataclass
class CommProfileReport:
    """The seed's ``wia_comm_profile_report_t`` (see the module docstring for each
    figure's definition). Times in seconds unless the name says otherwise."""

    cluster: str
    ranks: int
    clock_ghz: float
    start_cycle: int
    end_cycle: int
    peak_bandwidth_gbs: float
    total_comm_time_s: float
    total_compute_time_s: float
    overlap_efficiency: float
    communication_fraction: float
    collective_stats: list[CollectiveStats]
    avg_bandwidth_util: float
    peak_bandwidth_util: float
    min_bandwidth_util: float
    link_utilization: dict[str, float]
    records: list[Any] = field(default_factory=list, repr=False)
    compute: list[Any] = field(default_factory=list, repr=False)
    link_events: list[tuple[str, int, int, int]] = field(default_factory=list, repr=False)

    @property
    def num_collective_types(self) -> int:
        return len(self.collective_stats)

    @property
    def duration_s(self) -> float:
        return (self.end_cycle - self.start_cycle) / (self.clock_ghz * 1e9)

    def summary(self) -> str:
        """The seed's printout of this report."""
        c, k = self.total_comm_time_s, self.total_compute_time_s
        lines = [
            "Communication Profile:",
            f"  Total Communication Time: {c:.6f} s",
            f"  Total Computation Time: {k:.6f} s",
            f"  Overlap Efficiency: {self.overlap_efficiency * 100:.1f}%",
            f"  Communication Fraction: {self.communication_fraction * 100:.1f}%",
            "",
            "Collective Operations:",
        ]
        for s in self.collective_stats:
            lines += [
                f"  {s.name}:",
                f"    Invocations: {s.count}",
                f"    Total time: {s.total_time_s:.6f} s",
                f"    Avg time: {s.avg_time_ms:.3f} ms",
                f"    Min time: {s.min_time_ms:.3f} ms",
                f"    Max time: {s.max_time_ms:.3f} ms",
                f"    Bandwidth: {s.avg_bandwidth_gbs:.1f} GB/s ({s.pct_of_peak:.1f}% of peak)",
                f"    algbw / busbw: {s.algbw_gbs:.1f} / {s.busbw_gbs:.1f} GB/s",
                f"    Data volume: {s.total_data_gb:.2f} GB",
            ]
        lines += [
            "",
            "Bandwidth Utilization:",
            f"  Average: {self.avg_bandwidth_util * 100:.1f}%",
            f"  Peak: {self.peak_bandwidth_util * 100:.1f}%",
            f"  Minimum: {self.min_bandwidth_util * 100:.1f}%",
        ]
        return "\n".join(lines)

    def chrome_trace(self) -> dict[str, Any]:
        """The report as a Trace Event Format object (one process: the cluster)."""
        return {
            "traceEvents": comm_trace_events(self, pid=1),
            "displayTimeUnit": "ns",
            "otherData": {
                "generator": "wia-hw",
                "cluster": self.cluster,
                "clock_ghz": self.clock_ghz,
                "start_cycle": self.start_cycle,
                "time_unit": "microseconds of device time",
            },
        }


class CommProfilingSession:
    """An open communication-profiling session (``wia_comm_profiling_session_t``)."""

    def __init__(self, comm: Any, config: CommProfilingConfig) -> None:
        self.comm = comm
        self.config = config
        self.start_cycle = comm.now_cycles
        self.records: list[Any] = []
        self.compute: list[Any] = []
        self._link_start = len(comm.links.events)
        self._was_recording = comm.links.record
        self.active = True

    def on_collective(self, rec: Any) -> None:
        if (
            rec.kind == "p2p"
            and self.config.track_p2p
            or rec.kind != "p2p"
            and self.config.track_collectives
        ):
            self.records.append(rec)

    def on_compute(self, rec: Any) -> None:
        if self.config.track_overlap:
            self.compute.append(rec)


def start_comm_profiling(
    communicator: Any, config: CommProfilingConfig | None = None
) -> CommProfilingSession:
    """Start recording ``communicator``'s collectives, messages, compute and link
    transfers (``wia_start_comm_profiling``)."""
    # duck-typed: the communicator sits above profiling (it runs workloads through the
    # runtime, which profiles), so this module does not import it
    if not all(hasattr(communicator, a) for a in ("listeners", "links", "records", "now_cycles")):
        raise TypeError(
            f"start_comm_profiling needs a Communicator (wia_hw.open_cluster), "
            f"got {type(communicator).__name__}"
        )
    config = CommProfilingConfig() if config is None else config
    if not isinstance(config, CommProfilingConfig):
        raise TypeError(f"config must be a CommProfilingConfig, got {type(config).__name__}")
    s = CommProfilingSession(communicator, config)
    communicator.listeners.append(s)
    if config.track_bandwidth:
        communicator.links.record = True
    return s


def stop_comm_profiling(session: CommProfilingSession) -> CommProfileReport:
    """End the session and build its :class:`CommProfileReport`
    (``wia_stop_comm_profiling``). Stopping twice raises ``RuntimeError``."""
    if not isinstance(session, CommProfilingSession):
        raise TypeError(f"expected a CommProfilingSession, got {type(session).__name__}")
    if not session.active:
        raise RuntimeError("this communication-profiling session was already stopped")
    comm, cfg = session.comm, session.config
    session.active = False
    comm.listeners.remove(session)
    links = comm.links
    events = links.events[session._link_start :] if cfg.track_bandwidth else []
    if (
        cfg.track_bandwidth
        and not session._was_recording
        and not any(getattr(x, "config", None) and x.config.track_bandwidth for x in comm.listeners)
    ):
        links.record = False
    hz = comm.clock_ghz * 1e9
    recs, comp = session.records, session.compute
    t0 = session.start_cycle
    t1 = max([comm.now_cycles] + [r.end_cycle for r in recs] + [c.end_cycle for c in comp])
    # everything is clipped to the session [t0, t1]: a collective that began before it
    # counts only its time inside (and not in the per-call statistics, whose times and
    # bandwidths are whole calls'); link chunks are booked when they are queued, so a
    # chunk still to be served when the session stops is cut at its end
    comm_u = interval_union((max(r.start_cycle, t0), min(r.end_cycle, t1)) for r in recs)
    comp_u = interval_union((max(c.start_cycle, t0), min(c.end_cycle, t1)) for c in comp)
    recs = [r for r in recs if r.start_cycle >= t0]
    events = _clip_events(events, t0, t1)
    comm_c = sum(e - s for s, e in comm_u)
    comp_c = sum(e - s for s, e in comp_u)
    stats = []
    for name in dict.fromkeys(r.name for r in recs):
        rs = [r for r in recs if r.name == name]
        tot_s = sum(r.time_s for r in rs)
        data = sum(r.nbytes for r in rs)
        bus = sum(r.nbytes * r.bus_factor for r in rs)
        busbw = bus / tot_s / 1e9 if tot_s else 0.0
        # the calls' peaks weighted by their times: sum(bus) <= sum(peak x time)
        peak = (
            sum(r.peak_busbw_gbs * r.time_s for r in rs) / tot_s
            if tot_s
            else sum(r.peak_busbw_gbs for r in rs) / len(rs)
        )
        stats.append(
            CollectiveStats(
                name=name,
                count=len(rs),
                total_time_s=tot_s,
                avg_time_ms=tot_s / len(rs) * 1e3,
                min_time_ms=min(r.time_ms for r in rs),
                max_time_ms=max(r.time_ms for r in rs),
                avg_bandwidth_gbs=busbw,
                peak_bandwidth_gbs=peak,
                pct_of_peak=100.0 * busbw / peak if peak else 0.0,
                total_data_gb=data / 1e9,
                algbw_gbs=data / tot_s / 1e9 if tot_s else 0.0,
                busbw_gbs=busbw,
                algorithms=tuple(dict.fromkeys(r.algorithm for r in rs)),
            )
        )
    timed = [r for r in recs if r.duration_cycles]
    utils = [r.busbw_gbs / r.peak_busbw_gbs for r in timed]
    tot_t = sum(r.time_s for r in timed)
    avg_u = sum(u * r.time_s for u, r in zip(utils, timed, strict=True)) / tot_t if tot_t else 0.0
    span = t1 - t0
    busy: dict[str, int] = {}
    for name, s, e, _ in events:
        busy[name] = busy.get(name, 0) + (e - s)
    link_util = (
        {n: busy.get(n, 0) / span if span else 0.0 for n in comm.link_names()}
        if cfg.track_bandwidth
        else {}
    )
    return CommProfileReport(
        cluster=comm.spec.name,
        ranks=comm.size,
        clock_ghz=comm.clock_ghz,
        start_cycle=t0,
        end_cycle=t1,
        peak_bandwidth_gbs=comm.peak_link_bandwidth_gbs,
        total_comm_time_s=comm_c / hz,
        total_compute_time_s=comp_c / hz,
        overlap_efficiency=overlap_cycles(comm_u, comp_u) / comm_c if comm_c else 0.0,
        communication_fraction=comm_c / (comm_c + comp_c) if comm_c + comp_c else 0.0,
        collective_stats=stats,
        avg_bandwidth_util=avg_u,
        peak_bandwidth_util=max(utils, default=0.0),
        min_bandwidth_util=min(utils, default=0.0),
        link_utilization=link_util,
        records=list(recs) if cfg.track_latency else [],
        compute=list(comp),
        link_events=list(events),
    )


def _clip_events(
    events: Iterable[tuple[str, int, int, int]], t0: int, t1: int
) -> list[tuple[str, int, int, int]]:
    """Link chunks cut to ``[t0, t1]``; a cut chunk keeps its bytes in proportion."""
    out = []
    for name, s, e, nb in events:
        cs, ce = max(s, t0), min(e, t1)
        if ce <= cs:
            continue
        out.append((name, cs, ce, nb if (cs, ce) == (s, e) else nb * (ce - cs) // (e - s)))
    return out


def _lanes(spans: list[tuple[int, int, Any]]) -> list[tuple[int, int, int, Any]]:
    """Assign each span the first lane whose last span ended by its start."""
    ends: list[int] = []
    out = []
    for s, e, x in sorted(spans, key=lambda t: (t[0], t[1])):
        lane = next((i for i, end in enumerate(ends) if end <= s), None)
        if lane is None:
            lane = len(ends)
            ends.append(e)
        else:
            ends[lane] = e
        out.append((lane, s, e, x))
    return out


def _link_key(name: str) -> tuple[int, ...]:
    """``"2->3"`` sorts as ``(2, 3)``; a switch end (``sw``, ``sw1``) after the devices."""
    return tuple(int(x) if x.isdigit() else 1 << 30 for x in name.split("->"))


def comm_trace_events(report: CommProfileReport, *, pid: int = 2) -> list[dict[str, Any]]:
    """Trace events of the report under process ``pid``: per rank a ``rank N compute``
    and ``rank N comm`` track (more lanes when its collectives overlap), per link a
    ``link U->V`` track of the transfers it served (back-to-back chunks merged)."""
    t0, us_per = report.start_cycle, 1.0 / (report.clock_ghz * 1e3)
    ev: list[dict[str, Any]] = []
    tids: dict[str, int] = {}

    def span(track: str, name: str, s: int, e: int, cat: str, args: dict[str, Any]) -> None:
        tid = tids.setdefault(track, len(tids) + 1)
        ts = round((s - t0) * us_per, 4)
        ev.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": ts,
                "dur": round(round((e - t0) * us_per, 4) - ts, 4),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )

    for r in range(report.ranks):
        for lane, s, e, c in _lanes(
            [(c.start_cycle, c.end_cycle, c) for c in report.compute if c.rank == r]
        ):
            span(f"rank {r} compute{f' {lane}' if lane else ''}", c.label, s, e, "compute", {})
        for lane, s, e, rec in _lanes(
            [(x.start_cycle, x.end_cycle, x) for x in report.records if r in x.ranks]
        ):
            span(
                f"rank {r} comm{f' {lane}' if lane else ''}",
                rec.name,
                s,
                e,
                "comm",
                {
                    "algorithm": rec.algorithm,
                    "bytes": rec.nbytes,
                    "algbw_gbs": round(rec.algbw_gbs, 3),
                    "busbw_gbs": round(rec.busbw_gbs, 3),
                },
            )
    merged: dict[str, list[list[int]]] = {}
    for name, s, e, nb in sorted(report.link_events, key=lambda t: (t[0], t[1])):
        m = merged.setdefault(name, [])
        if m and m[-1][1] == s:
            m[-1][1], m[-1][2] = e, m[-1][2] + nb
        else:
            m.append([s, e, nb])
    for name in sorted(merged, key=_link_key):
        for s, e, nb in merged[name]:
            span(f"link {name}", "transfer", s, e, "link", {"bytes": nb})
    meta: list[dict[str, Any]] = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": pid,
            "args": {"name": f"{report.cluster} (communication)"},
        }
    ]
    for i, (name, tid) in enumerate(tids.items()):
        meta.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        )
        meta.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": i},
            }
        )
    return meta + ev


def plot_comm_timeline(report: CommProfileReport, path: str | os.PathLike[str]) -> str:
    """Draw the report's timeline (one row per rank: compute and communication bars,
    coloured per collective) as a PNG at ``path``; returns the path
    (``wia_plot_comm_timeline``). Needs matplotlib."""
    from ._plot import new_figure, save

    to_ms = 1.0 / (report.clock_ghz * 1e6)
    t0 = report.start_cycle
    fig = new_figure((10, 1.2 + 0.35 * report.ranks))
    ax = fig.subplots()
    colors = {"compute": "tab:blue"}
    palette = ["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink"]
    for rec in report.records:
        colors.setdefault(rec.name, palette[(len(colors) - 1) % len(palette)])
    for r in range(report.ranks):
        comp = [
            ((c.start_cycle - t0) * to_ms, (c.end_cycle - c.start_cycle) * to_ms)
            for c in report.compute
            if c.rank == r
        ]
        if comp:
            ax.broken_barh(comp, (r - 0.4, 0.35), color=colors["compute"])
        for name in colors:
            bars = [
                ((x.start_cycle - t0) * to_ms, x.duration_cycles * to_ms)
                for x in report.records
                if x.name == name and r in x.ranks
            ]
            if bars:
                ax.broken_barh(bars, (r + 0.02, 0.35), color=colors[name], alpha=0.85)
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=n) for n, c in colors.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_yticks(range(report.ranks), [f"rank {r}" for r in range(report.ranks)])
    ax.invert_yaxis()
    ax.set_xlabel("device time (ms)")
    ax.set_title(
        f"{report.cluster}: compute (upper) and communication (lower) per rank; "
        f"overlap {report.overlap_efficiency * 100:.1f}%"
    )
    return save(fig, path)
