"""Communication profiling (the seed's section 8.5) on a :class:`wia_hw.Communicator`.

``start_comm_profiling(comm, CommProfilingConfig())`` attaches a session to the
communicator until ``stop_comm_profiling(session)``. The report covers the window
``[start, stop]`` of simulated time and nothing else, by one rule for every figure:
communication time, link busy time and utilisation, compute time, overlap and the
timeline all count the time inside the window of whatever ran in it. A collective or
message that began before the session counts from the start, one still running at the
stop up to the stop (:attr:`CommProfileReport.comm_spans`: each call's clipped
interval); link chunks queued before the session count from the start, chunks booked
to be served after the stop up to the stop; compute booked before the session or
running past the stop likewise. ``link_events`` are the link chunks so cut (a cut
chunk keeps its bytes in proportion; the time a link still owed at the start to chunks
queued before it is one event, its bytes from the link's rate). Only ``records`` and
``collective_stats`` are per call, and they hold whole calls: those that began and
ended inside the session.
The :class:`CommProfileReport` carries every figure the seed prints:

* ``total_comm_time_s``: the length of the union of the communication intervals
  (``comm_spans``: any rank, any collective, clipped to the session);
  ``total_compute_time_s``: the same for device compute; ``overlap_efficiency`` (Holistic Trace Analysis' definition): compute time
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
* Without ``track_overlap`` no compute is recorded, so ``total_compute_time_s``,
  ``overlap_efficiency`` and ``communication_fraction`` are unknown: ``None`` (printed
  ``n/a (not tracked: track_overlap=False)``), never 0 or 100 %.
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
    "CommSpan",
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
    each whole invocation's record in ``report.records`` (``comm_spans``, which the
    timeline draws, are kept either way); ``track_overlap``:
    record device compute (without it compute time, overlap and the communication
    fraction are unknown: ``None``)."""

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


#: How a figure of compute (time, overlap, fraction) prints when compute was not tracked.
_NOT_TRACKED = "n/a (not tracked: track_overlap=False)"


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
    figure's definition). Times in seconds unless the name says otherwise.
    ``total_compute_time_s``, ``overlap_efficiency`` and ``communication_fraction`` are
    ``None`` when the session did not track compute (``track_overlap=False``)."""

    cluster: str
    ranks: int
    clock_ghz: float
    start_cycle: int
    end_cycle: int
    peak_bandwidth_gbs: float
    total_comm_time_s: float
    total_compute_time_s: float | None
    overlap_efficiency: float | None
    communication_fraction: float | None
    collective_stats: list[CollectiveStats]
    avg_bandwidth_util: float
    peak_bandwidth_util: float
    min_bandwidth_util: float
    link_utilization: dict[str, float]
    records: list[Any] = field(default_factory=list, repr=False)
    compute: list[Any] = field(default_factory=list, repr=False)
    link_events: list[tuple[str, int, int, int]] = field(default_factory=list, repr=False)
    comm_spans: list[CommSpan] = field(default_factory=list, repr=False)

    @property
    def num_collective_types(self) -> int:
        return len(self.collective_stats)

    @property
    def duration_s(self) -> float:
        return (self.end_cycle - self.start_cycle) / (self.clock_ghz * 1e9)

    def summary(self) -> str:
        """The seed's printout of this report."""
        c, k = self.total_comm_time_s, self.total_compute_time_s
        ov, frac = self.overlap_efficiency, self.communication_fraction

        def shown(v: float | None, text: str) -> str:
            # compute not recorded: its figures are unknown, not 0
            return _NOT_TRACKED if v is None else text

        lines = [
            "Communication Profile:",
            f"  Total Communication Time: {c:.6f} s",
            f"  Total Computation Time: {shown(k, f'{k or 0.0:.6f} s')}",
            f"  Overlap Efficiency: {shown(ov, f'{(ov or 0.0) * 100:.1f}%')}",
            f"  Communication Fraction: {shown(frac, f'{(frac or 0.0) * 100:.1f}%')}",
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


@dataclass(frozen=True)
class CommSpan:
    """One call's communication inside the session: ``[start_cycle, end_cycle)`` is the
    call's time clipped to the session. ``whole``: the call began and ended inside it
    (then ``record`` is its :class:`~wia_hw.comm.CollectiveRecord`); a call that began
    before the session or was still running at its stop is cut at that edge and has no
    record (``algorithm`` and ``nbytes`` are still the call's)."""

    name: str
    algorithm: str
    nbytes: int
    ranks: tuple[int, ...]
    start_cycle: int
    end_cycle: int
    whole: bool
    record: Any = field(default=None, repr=False, compare=False)


class CommProfilingSession:
    """An open communication-profiling session (``wia_comm_profiling_session_t``)."""

    def __init__(self, comm: Any, config: CommProfilingConfig) -> None:
        self.comm = comm
        self.config = config
        self.start_cycle = t0 = comm.now_cycles
        self.records: list[Any] = []
        # compute booked before the session that runs into it (each rank runs its
        # compute in order, so looking back from the newest record, a rank is done at
        # its first record that ends by the start)
        carried: list[Any] = []
        if config.track_overlap:
            open_ranks = {r for r in range(comm.size) if comm.busy_until(r) > t0}
            for c in reversed(comm.compute_records):
                if not open_ranks:
                    break
                if c.rank not in open_ranks:
                    continue
                if c.end_cycle > t0:
                    carried.append(c)
                else:
                    open_ranks.discard(c.rank)
        self.compute: list[Any] = carried[::-1]
        # link time booked before the session: each link is a FIFO whose chunks queued
        # by now end at its free_at, back to back from the first that ends after now,
        # so what it still serves is exactly [start, free_at)
        self._carried_links = (
            [
                (p.name, t0, p.free_at, int((p.free_at - t0) * p.bytes_per_cycle))
                for p in comm.links.ports.values()
                if p.free_at > t0
            ]
            if config.track_bandwidth
            else []
        )
        self._link_start = len(comm.links.events)
        self._was_recording = comm.links.record
        self.active = True

    def _tracks(self, kind: str) -> bool:
        return self.config.track_p2p if kind == "p2p" else self.config.track_collectives

    def on_collective(self, rec: Any) -> None:
        if self._tracks(rec.kind):
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
    comp = session.compute
    t0, t1 = session.start_cycle, comm.now_cycles
    # one window for every figure: [t0, t1], the session's start and stop. A call that
    # began before the session counts from t0, one still running at the stop up to t1;
    # compute and link chunks booked before the session count from t0, those booked to
    # run past the stop up to t1. records and collective_stats hold whole calls only
    spans = [
        CommSpan(
            r.name,
            r.algorithm,
            r.nbytes,
            r.ranks,
            max(r.start_cycle, t0),
            r.end_cycle,
            r.start_cycle >= t0,
            r if r.start_cycle >= t0 else None,
        )
        for r in session.records
    ]
    spans += [
        CommSpan(c.name, c.algorithm, c.nbytes, c.ranks, max(c.start_cycle, t0), t1, False)
        for c in comm.in_flight.values()
        if session._tracks(c.kind)
    ]
    spans = [x for x in spans if x.end_cycle > x.start_cycle or x.whole]
    comm_u = interval_union((x.start_cycle, x.end_cycle) for x in spans)
    comp_u = interval_union((max(c.start_cycle, t0), min(c.end_cycle, t1)) for c in comp)
    comp = [c for c in comp if min(c.end_cycle, t1) > max(c.start_cycle, t0)]
    recs = [x.record for x in spans if x.whole]
    events = _clip_events(session._carried_links + list(events), t0, t1)
    comm_c = sum(e - s for s, e in comm_u)
    comp_c = sum(e - s for s, e in comp_u)
    ov = cfg.track_overlap  # without it no compute is recorded: its figures are unknown
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
        total_compute_time_s=comp_c / hz if ov else None,
        overlap_efficiency=(overlap_cycles(comm_u, comp_u) / comm_c if comm_c else 0.0)
        if ov
        else None,
        communication_fraction=(comm_c / (comm_c + comp_c) if comm_c + comp_c else 0.0)
        if ov
        else None,
        collective_stats=stats,
        avg_bandwidth_util=avg_u,
        peak_bandwidth_util=max(utils, default=0.0),
        min_bandwidth_util=min(utils, default=0.0),
        link_utilization=link_util,
        records=list(recs) if cfg.track_latency else [],
        compute=list(comp),
        link_events=list(events),
        comm_spans=spans,
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

    lo, hi = report.start_cycle, report.end_cycle
    for r in range(report.ranks):
        for lane, s, e, c in _lanes(
            [
                (max(c.start_cycle, lo), min(c.end_cycle, hi), c)
                for c in report.compute
                if c.rank == r
            ]
        ):
            span(f"rank {r} compute{f' {lane}' if lane else ''}", c.label, s, e, "compute", {})
        for lane, s, e, x in _lanes(
            [(x.start_cycle, x.end_cycle, x) for x in report.comm_spans if r in x.ranks]
        ):
            args: dict[str, Any] = {"algorithm": x.algorithm, "bytes": x.nbytes}
            if x.record is not None:
                args["algbw_gbs"] = round(x.record.algbw_gbs, 3)
                args["busbw_gbs"] = round(x.record.busbw_gbs, 3)
            else:
                args["clipped"] = True  # the call runs past an edge of the session
            span(f"rank {r} comm{f' {lane}' if lane else ''}", x.name, s, e, "comm", args)
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
    for x in report.comm_spans:
        colors.setdefault(x.name, palette[(len(colors) - 1) % len(palette)])
    lo, hi = report.start_cycle, report.end_cycle
    for r in range(report.ranks):
        comp = [
            (
                (max(c.start_cycle, lo) - t0) * to_ms,
                (min(c.end_cycle, hi) - max(c.start_cycle, lo)) * to_ms,
            )
            for c in report.compute
            if c.rank == r
        ]
        if comp:
            ax.broken_barh(comp, (r - 0.4, 0.35), color=colors["compute"])
        for name in colors:
            bars = [
                ((x.start_cycle - t0) * to_ms, (x.end_cycle - x.start_cycle) * to_ms)
                for x in report.comm_spans
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
        f"{report.cluster}: compute (upper) and communication (lower) per rank; overlap "
        + (
            _NOT_TRACKED
            if report.overlap_efficiency is None
            else f"{report.overlap_efficiency * 100:.1f}%"
        )
    )
    return save(fig, path)
