"""The profiler's per-kernel and per-sample records are what the run itself recorded,
whatever shortcuts the hot paths take (the session's ``op_end``, ``capture_counters``,
the sampler's ``_sample``): each is checked against a plain reference computation on
the same data."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from wia_hw.emulator.counters import Counters

import wia_hw
from wia_hw.profiling import ProfilingConfig, start_profiling, stop_profiling
from wia_hw.profiling._records import COUNTER_FIELDS, capture_counters
from wia_hw.profiling._sampler import Sampler

MODES = ("sampling", "instrumentation", "counters", "trace", "detailed")


def _reference_capture(c: Counters, names: tuple[str, ...]) -> dict:
    return {
        f: dict(getattr(c, f)) if isinstance(getattr(c, f), dict) else getattr(c, f) for f in names
    }


def _random_counters(rng: np.random.Generator) -> Counters:
    c = Counters()
    for f in dataclasses.fields(Counters):
        v = getattr(c, f.name)
        if isinstance(v, dict):
            for k in v:
                v[k] = int(rng.integers(0, 1 << 40))
        elif isinstance(v, float):
            setattr(c, f.name, float(rng.uniform(0, 1e9)))
        else:
            setattr(c, f.name, int(rng.integers(0, 1 << 40)))
    return c


def test_capture_counters_is_the_plain_read_of_the_fields():
    rng = np.random.default_rng(11)
    every = tuple(f.name for f in dataclasses.fields(Counters))
    for _ in range(20):
        c = _random_counters(rng)
        before = _reference_capture(c, every)
        for names in [every] + [COUNTER_FIELDS[k] for k in COUNTER_FIELDS]:
            got = capture_counters(c, names)
            assert got == _reference_capture(c, names)
            assert list(got) == list(names)
        assert _reference_capture(c, every) == before  # reading changed nothing


@pytest.mark.parametrize("mode", MODES)
def test_profiled_kernels_and_ops_are_the_runs_own_records(mode):
    ctx = wia_hw.open_device()
    cfg = ProfilingConfig(mode=mode, capture_memory=False, sampling_interval_us=1)
    s = start_profiling(ctx, cfg)
    runs = [
        ctx.run("bert-base", batch=2, seq=32, layers=2),
        ctx.run("gpt2", phase="decode", kv_len=8, layers=1),
    ]
    rep = stop_profiling(s)
    records = [(i, k.record) for i, r in enumerate(runs) for k in r.kernels]
    facets = cfg.facets
    if not facets & {"instrumentation", "counters", "trace"}:
        assert rep.kernels == [] and rep.ops == []
        return
    fields_: list[str] = []
    if "counters" in facets:
        for c in cfg.hardware_counters:
            fields_ += [f for f in COUNTER_FIELDS[c] if f not in fields_]
    if cfg.capture_power and "energy_pj" not in fields_:
        fields_.append("energy_pj")
    assert len(rep.kernels) == len(records)
    for idx, (ks, (run, r)) in enumerate(zip(rep.kernels, records, strict=True)):
        assert (ks.index, ks.run, ks.name, ks.op, ks.start_cycle, ks.end_cycle) == (
            idx,
            run,
            r.name,
            r.op,
            r.start_cycle,
            r.end_cycle,
        )
        assert (ks.flop_count, ks.macs, ks.tiles, ks.core_busy_cycles) == (
            r.flops,
            r.macs,
            r.tiles,
            list(r.core_busy_cycles),
        )
        for f in dataclasses.fields(ks):  # every field the record also has, in place
            src = {"flop_count": "flops"}.get(f.name, f.name)
            if f.name not in ("counters", "power_w", "temperature_c") and hasattr(r, src):
                assert getattr(ks, f.name) == getattr(r, src), f.name
        want = _reference_capture(r.counters, tuple(fields_))
        if "counters" not in facets and not cfg.capture_power:
            want = None
        assert ks.counters == want
        assert (ks.power_w, ks.temperature_c) == (
            (r.power_w, r.temperature_c) if cfg.capture_power else (None, None)
        )
    if "instrumentation" in facets:  # every op once, its kernels in order
        ops = [(i, o.name) for i, r in enumerate(runs) for o in r.op_times]
        assert [(o.run, o.name) for o in rep.ops] == ops
        flat = [k for o in rep.ops for k in o.kernels]
        assert flat == list(range(len(records)))
        for o in rep.ops:
            assert all(rep.kernels[k].op == o.name for k in o.kernels)


def _reference_sample(sampler: Sampler, t: int, at: int) -> tuple:
    """The sample as the sampler's contract states it, read field by field from the
    device's ports as they are now (traced ones in the detailed mode)."""
    mem = sampler.device.memory
    kernels, computing, queue = [], [], []
    for st in sampler._states:
        if st.kernel is None or (st.end is not None and at >= st.end):
            kernels.append(None)
            computing.append(False)
            queue.append(0)
            continue
        a, b = st.compute, st.prev_compute
        kernels.append(st.kernel)
        computing.append(a[0] <= at < a[1] or b[0] <= at < b[1])
        queue.append(st.pending_stores + (1 if st.load[0] <= at < st.load[1] else 0))
    hbm = sum(max(0, ch.free_at - at) for ch in mem.channels)
    return (t, kernels, computing, queue, hbm, max(0, mem.l2_port.free_at - at))


@pytest.mark.parametrize(
    ("mode", "interval_us"), [("sampling", 0.3), ("sampling", 2.0), ("detailed", 0.3)]
)
def test_every_sample_is_the_device_state_its_contract_names(monkeypatch, mode, interval_us):
    seen = []
    real = Sampler._sample

    def checked(self, t, at):
        want = _reference_sample(self, t, at)
        real(self, t, at)
        seen.append((self.raw[-1], want))

    monkeypatch.setattr(Sampler, "_sample", checked)
    ctx = wia_hw.open_device()
    s = start_profiling(
        ctx, ProfilingConfig(mode=mode, capture_memory=False, sampling_interval_us=interval_us)
    )
    ctx.run("bert-base", batch=2, seq=32, layers=2)
    rep = stop_profiling(s)
    assert len(seen) > 20
    assert any(any(got[2]) for got, _ in seen)  # some samples catch a core computing
    assert any(got[5] for got, _ in seen)  # and some a busy L2 port
    for got, want in seen:
        assert got == want
    assert [x.cycle for x in rep.samples[: len(seen)]] == [g[0] for g, _ in seen]


@pytest.mark.parametrize("gc_enabled", [True, False])
def test_traced_ports_log_every_transfer_as_the_port_serves_it(gc_enabled):
    """A traced port serves like the plain one and logs (start, end, bytes) of each
    transfer, those that follow one another without a gap joined (as ``merged`` joins
    them); handing the ports back leaves the collector as it was."""
    import gc
    from fractions import Fraction

    from wia_hw.emulator.memory import BandwidthPort

    from wia_hw.profiling import _ports

    rng = np.random.default_rng(5)
    dev = wia_hw.open_device().device
    mem = dev.memory
    plain = [BandwidthPort(p.name, p.bytes_per_cycle) for p in mem.channels]
    for p, ch in zip(plain, mem.channels, strict=True):  # with the channels' refresh windows
        p.set_refresh(ch.refresh_interval, ch.refresh_cycles, ch.refresh_phase)
    plain.append(BandwidthPort(mem.l2_port.name, Fraction(mem.l2_port.bytes_per_cycle)))
    traced = _ports.install(mem)
    want: dict[str, list[tuple[int, int, int]]] = {p.name: [] for p in plain}
    now = 0
    for _ in range(2000):
        i = int(rng.integers(0, len(plain)))
        now += int(rng.integers(0, 50))
        nbytes = int(rng.integers(-2, 5000))
        before = plain[i].free_at
        end = plain[i].reserve(now, nbytes)
        assert traced[i].reserve(now, nbytes) == end
        if nbytes > 0:
            want[plain[i].name].append((max(now, before), end, nbytes))
    was = gc.isenabled()
    (gc.enable if gc_enabled else gc.disable)()
    try:
        logs = _ports.uninstall(mem, traced)
        assert gc.isenabled() is gc_enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert logs == {k: _ports.merged(v) for k, v in want.items()}
    assert sum(len(v) for v in logs.values()) < sum(len(v) for v in want.values())
    assert [p.free_at for p in mem.channels] == [p.free_at for p in plain[:-1]]
    assert mem.l2_port.busy_cycles == plain[-1].busy_cycles
