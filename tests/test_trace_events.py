"""The device's event trace (``TraceLog``): recorded as flat rows, read as
``TraceEvent`` objects equal to the public constructor's, field by field; the profiling
report's JSON and timeline read the rows and equal those of plain ``TraceEvent`` lists;
the traced ports book exactly as the plain port does, refresh windows included."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from wia_hw.emulator.device import Device, TraceEvent, TraceLog
from wia_hw.emulator.memory import BandwidthPort

import wia_hw
from wia_hw.profiling import ProfilingConfig, load_profile_report, start_profiling, stop_profiling
from wia_hw.profiling._ports import TracedPort

#: a small BERT on two DMA engines per core (tracks ``dmaN`` and ``dmaN.1``)
WL = ("bert-base", {"batch": 1, "seq": 32, "layers": 2})
OVERRIDES = {"dma.engines_per_core": 2}
FIELDS = [f.name for f in dataclasses.fields(TraceEvent)]


def _old_row(e: TraceEvent) -> list:
    """A device event as the report's JSON held it before the rows: its fields in
    declaration order, read attribute by attribute."""
    return [e.kind, e.track, e.start, e.end, e.kernel, e.nbytes, e.l1_misses, e.l2_misses]


def test_logged_events_equal_trace_event_objects_field_by_field():
    ctx = wia_hw.open_device(overrides=OVERRIDES)
    r = ctx.run(WL[0], trace=True, **WL[1])
    log = r.trace
    assert isinstance(log, TraceLog)
    rows = list(log.rows())
    assert len(rows) == len(log) > 0
    events = list(log)
    assert events[0] is log[0] and events[-1] is log[-1]  # built once, kept
    for row, e in zip(rows, events, strict=True):
        assert type(e) is TraceEvent
        ref = TraceEvent(*row)  # the public constructor
        assert e == ref and hash(e) == hash(ref) and repr(e) == repr(ref)
        assert dataclasses.astuple(e) == row == tuple(_old_row(e))
        assert [type(getattr(e, f)) for f in FIELDS] == [type(getattr(ref, f)) for f in FIELDS]
    with pytest.raises(dataclasses.FrozenInstanceError):
        events[0].start = 0
    # what the trace holds: per core one load and one compute per tile, in the order
    # the core issued them; every L1 miss is a load's
    tiles = sum(k.tiles for k in r.kernels)
    assert sum(e.kind == "dma" for e in events) == tiles
    assert sum(e.kind == "compute" for e in events) == tiles
    assert sum(e.l1_misses for e in events) == r.counters.misses["l1"]
    assert {e.track for e in events if e.kind == "dma"} == {
        f"dma{c}{s}" for c in range(ctx.spec.compute.cores) for s in ("", ".1")
    }
    for e in events:
        assert e.start <= e.end
    for c in range(ctx.spec.compute.cores):
        starts = [e.start for e in events if e.track == f"core{c}"]
        assert starts == sorted(starts)


def test_traced_run_has_the_untraced_timing():
    plain = wia_hw.open_device(overrides=OVERRIDES).run(WL[0], **WL[1])
    traced = wia_hw.open_device(overrides=OVERRIDES).run(WL[0], trace=True, **WL[1])
    assert traced.cycles == plain.cycles
    assert traced.counters.to_dict() == plain.counters.to_dict()
    assert [k.cycles for k in traced.kernels] == [k.cycles for k in plain.kernels]


def test_report_outputs_equal_those_of_plain_trace_event_lists(tmp_path):
    ctx = wia_hw.open_device(overrides=OVERRIDES)
    s = start_profiling(ctx, ProfilingConfig(mode="trace", capture_memory=False))
    r1 = ctx.run(WL[0], trace=True, **WL[1])
    r2 = ctx.run(WL[0], trace=True, **WL[1])
    rep = stop_profiling(s)
    # the session's log is the runs' logs in turn
    assert isinstance(rep.device_events, TraceLog)
    assert list(rep.device_events.rows()) == list(r1.trace.rows()) + list(r2.trace.rows())
    assert rep.device_events == list(r1.trace) + list(r2.trace)
    # the same report holding a plain list of TraceEvent(*fields), as sessions made it
    plain = dataclasses.replace(
        rep, device_events=[TraceEvent(*_old_row(e)) for e in rep.device_events]
    )
    assert type(plain.device_events) is list
    assert rep.to_json() == plain.to_json()
    assert rep.chrome_trace() == plain.chrome_trace()
    d = json.loads(rep.to_json())
    assert d["device_events"] == [_old_row(e) for e in plain.device_events]
    # and read back from its JSON (a list of TraceEvent again)
    path = tmp_path / "rep.json"
    path.write_text(rep.to_json())
    back = load_profile_report(path)
    assert back.device_events == list(rep.device_events)
    assert back.chrome_trace()["traceEvents"] == rep.chrome_trace()["traceEvents"]


def test_trace_log_list_behaviour_and_errors():
    a = TraceEvent("compute", "core0", 0, 10, "k")
    b = TraceEvent("dma", "dma0.1", 3, 9, "k", 64, 1, 2)
    log = TraceLog([a])
    assert log[0] is a  # appended objects are kept, not rebuilt
    log.extend(TraceLog([b]))  # rows copied
    assert len(log) == 2 and log == [a, b] and [a, b] == log and log[1] == b
    assert log[1:] == [b] and list(log.rows()) == [dataclasses.astuple(a), dataclasses.astuple(b)]
    assert log != [a] and log != TraceLog([b, a]) and log == TraceLog([a, b])
    with pytest.raises(TypeError, match="a TraceLog holds TraceEvents, got tuple"):
        log.append(("compute", "core0", 0, 1, "k"))
    with pytest.raises(TypeError, match="unhashable"):
        hash(log)
    # a device given a list records into a log that starts with the list's events
    spec = wia_hw.open_device().spec
    dev = Device(spec, trace=[a])
    assert isinstance(dev.trace, TraceLog) and list(dev.trace) == [a]
    dev.trace = None
    assert dev.trace is None
    mine = TraceLog()
    dev.trace = mine
    assert dev.trace is mine


@pytest.mark.parametrize("refresh", [(97, 13, 5), (0, 0, 0)])
def test_traced_port_books_as_the_plain_port(refresh):
    """Random arrivals and sizes (some zero or negative) on a port with dense refresh
    windows (or none): the traced port returns the same end cycles and ends in the same
    state as the plain one, and rejects an out-of-order arrival with the same error."""
    interval, cycles, phase = refresh
    rng = np.random.default_rng(11)
    rate = wia_hw.open_device().device.memory.channels[0].bytes_per_cycle
    plain = BandwidthPort("hbm.0", rate)
    orig = BandwidthPort("hbm.0", rate)
    if cycles:
        plain.set_refresh(interval, cycles, phase)
        orig.set_refresh(interval, cycles, phase)
    traced = TracedPort(orig)
    now = 0
    for _ in range(3000):
        now += int(rng.integers(0, 40))
        nbytes = int(rng.integers(-2, 3000))
        assert traced.reserve(now, nbytes) == plain.reserve(now, nbytes)
        state = ("free_at", "busy_cycles", "last_arrival", "refresh_stall_cycles")
        assert [getattr(traced, f) for f in state] == [getattr(plain, f) for f in state]
    if cycles:
        assert plain.refresh_stall_cycles > 0  # the windows were met
    for port in (plain, traced):
        with pytest.raises(RuntimeError, match=f"arriving at cycle {now - 1} was booked after"):
            port.reserve(now - 1, 64)
