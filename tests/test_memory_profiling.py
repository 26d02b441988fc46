"""Memory profiling: totals, peak, leaks with call stacks, top sites, fragmentation."""

from __future__ import annotations

import inspect
import random
from typing import Any

import pytest
from wia_hw.emulator.allocator import KIB, MIB, AllocatorConfig, CachingAllocator

import wia_hw
from wia_hw.profiling import (
    MemoryProfilingConfig,
    analyze_fragmentation,
    plot_memory_timeline,
    start_memory_profiling,
    stop_memory_profiling,
)

GB, MB = 1e9, 1e6


def _leaky_helper(ctx, n):
    return ctx.allocate(n, tag="scratch")  # the allocating line of the leak


def test_report_fields_recompute_from_its_events():
    ctx = wia_hw.open_device()
    keep = ctx.allocate(5 * MIB, tag="before")  # allocated before the session
    session = start_memory_profiling(ctx, MemoryProfilingConfig())
    ctx.run("bert-base", batch=2, seq=64)
    a = ctx.allocate(3 * MIB, tag="kv")
    ctx.free(a)
    report = stop_memory_profiling(session)
    ev = report.events
    mallocs = [e for e in ev if e[1] == "malloc"]
    frees = [e for e in ev if e[1] == "free"]
    assert report.num_allocations == len(mallocs) and report.num_deallocations == len(frees)
    assert report.total_allocated_gb == pytest.approx(sum(e[4] for e in mallocs) / GB)
    current = report.baseline_bytes + sum(e[4] for e in mallocs) - sum(e[4] for e in frees)
    assert report.current_usage_gb == pytest.approx(current / GB)
    assert report.current_usage_gb == pytest.approx(keep.size / GB)
    tl = report.timeline()
    assert report.peak_usage_gb == pytest.approx(max(tl["allocated"]) / GB)
    assert tl["allocated"][-1] == current
    assert all(
        sum(v[i] for v in tl["by_kind"].values()) == tl["allocated"][i]
        for i in range(len(tl["cycle"]))
    )
    assert report.active_buffers == 1 and report.num_leaks == 0  # "before" is not a leak
    r = report.free_ranges_end
    frag = 100 * (1 - max(r) / sum(r)) if r else 0.0
    assert report.fragmentation_percent == pytest.approx(frag)
    # the run's weights: every weight tensor, allocated once
    g = wia_hw.workloads.build("bert-base", batch=2, seq=64)
    weights = next(s for s in report.top_sites if s.description == "weights of bert-base")
    assert weights.count == sum(1 for t in g.tensors.values() if t.kind == "weight")
    assert weights.total_size_gb * GB >= g.weight_bytes
    assert sum(s.total_size_gb for s in report.top_sites) <= report.total_allocated_gb + 1e-12


def test_leaks_carry_size_site_and_the_users_call_stack():
    ctx = wia_hw.open_device()
    with start_memory_profiling(ctx) as session:
        kept = _leaky_helper(ctx, 2 * MIB + 1)
        _leaky_helper(ctx, 1 * MIB)  # dropped without free: unreachable
        done = ctx.allocate(4096)
        ctx.free(done)
    report = session.report
    assert report.num_leaks == 2
    big = max(report.leaks, key=lambda x: x.size_mb)
    assert big.size_mb == pytest.approx(kept.size / MB) and big.tag == "scratch"
    src = inspect.getsource(_leaky_helper).splitlines()
    line = inspect.getsourcelines(_leaky_helper)[1] + next(
        i for i, s in enumerate(src) if "ctx.allocate" in s
    )
    assert (big.allocation_site.file, big.allocation_site.line) == (__file__, line)
    assert big.stack_trace[0] == f"_leaky_helper ({__file__}:{line})"
    assert "test_leaks_carry_size_site_and_the_users_call_stack" in big.stack_trace[1]
    assert big.stack_depth == len(big.stack_trace) >= 2
    assert [x.unreachable for x in sorted(report.leaks, key=lambda x: x.size_mb)] == [True, False]
    text = report.format()
    assert f"Leaked {big.size_mb:.2f} MB at {__file__}:{line}" in text
    assert "    Call stack:" in text
    assert "ctx.allocate('scratch')" in text
    del kept


def test_top_sites_rank_by_bytes_and_name_what_they_hold():
    ctx = wia_hw.open_device()
    with start_memory_profiling(ctx, MemoryProfilingConfig(top_sites=3)) as s:
        ctx.run("gpt2", batch=1, seq=32)
    sites = s.report.top_sites
    assert len(sites) == 3 == s.report.num_top_sites
    assert [x.total_size_gb for x in sites] == sorted(
        (x.total_size_gb for x in sites), reverse=True
    )
    assert sites[0].file == __file__ and "of gpt2" in sites[0].description
    assert all(x.device_cycles == 0 for x in sites)  # the runtime's plan costs no time


def _decode_loop(ctx, steps=24):
    """Each step: transient activations freed at its end, then a small persistent
    KV-cache page (which, without pooling, is carved out of the freed blocks)."""
    pages = []
    for i in range(steps):
        tmp = [ctx.allocate(s * MIB) for s in (12, 4, 12)]
        for b in tmp:
            ctx.free(b)
        pages.append(ctx.allocate(256 * KIB + (i % 4) * 64 * KIB, tag="kv"))
    return pages


def test_pooling_lowers_fragmentation_of_a_decode_workload():
    frags = {}
    for pooling in (False, True):
        ctx = wia_hw.open_device()
        ctx.allocator = CachingAllocator(
            ctx.spec.memory.hbm.size_bytes, AllocatorConfig(pooling=pooling)
        )
        with start_memory_profiling(ctx) as s:
            _decode_loop(ctx)
        frags[pooling] = analyze_fragmentation(s.report)
        assert s.report.pooling is pooling
    plain, pooled = frags[False], frags[True]
    assert plain.external_frag_percent > 15.0
    assert pooled.external_frag_percent < 0.5 * plain.external_frag_percent
    assert plain.largest_free_block_mb < pooled.largest_free_block_mb


def test_fragmentation_analysis_figures_and_seed_suggestions():
    ctx = wia_hw.open_device()
    with start_memory_profiling(ctx) as s:
        bufs = [ctx.allocate(MIB) for _ in range(8)]  # 8 MiB split out of 4 segments
        for b in bufs[::2]:
            ctx.free(b)
    f = analyze_fragmentation(s.report)
    r = s.report.free_ranges_end
    assert f.num_free_blocks == len(r) and f.total_free_gb == pytest.approx(sum(r) / GB)
    assert f.largest_free_block_mb == pytest.approx(max(r) / MB)
    assert f.avg_free_block_kb == pytest.approx(sum(r) / len(r) / 1e3)
    assert f.external_frag_percent == pytest.approx(100 * (1 - max(r) / sum(r)))
    assert f.external_frag_percent > 20.0
    assert f.suggestions[0] == "Use memory pooling for frequently allocated sizes"
    assert "External fragmentation:" in f.format() and "Suggestions:" in f.format()
    with pytest.raises(ValueError, match="at must be 'end' or 'peak'"):
        analyze_fragmentation(s.report, at="start")


def test_memory_timeline_plot_is_a_png(tmp_path):
    ctx = wia_hw.open_device()
    with start_memory_profiling(ctx) as s:
        ctx.run("bert-base", batch=2, seq=64)
        _decode_loop(ctx, 6)
    out = plot_memory_timeline(s.report, tmp_path / "memory_timeline.png")
    data = open(out, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # read the drawing back: one band per kind of memory, stacked to the allocated total,
    # and the reserved line, both at every allocator call
    from wia_hw.profiling._memory import memory_timeline_figure

    tl = s.report.timeline()
    ax = memory_timeline_figure(s.report).axes[0]
    kinds = [k for k in tl["by_kind"] if any(tl["by_kind"][k])]
    bands = [c for c in ax.collections if c.get_label() in kinds]
    assert [b.get_label() for b in bands] == kinds
    top = bands[-1].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(max(tl["allocated"]) / 1e9)
    (reserved,) = [ln for ln in ax.get_lines() if ln.get_gid() == "reserved"]
    assert list(reserved.get_ydata()) == pytest.approx([v / 1e9 for v in tl["reserved"]])
    assert list(reserved.get_xdata()) == list(range(len(tl["cycle"])))
    assert all(a <= r for a, r in zip(tl["allocated"], tl["reserved"], strict=True))


def test_config_and_session_errors():
    with pytest.raises(TypeError, match="track_call_stacks must be a bool"):
        MemoryProfilingConfig(track_call_stacks="yes")
    with pytest.raises(ValueError, match="top_sites must be a positive integer"):
        MemoryProfilingConfig(top_sites=0)
    ctx = wia_hw.open_device()
    s = start_memory_profiling(ctx)
    stop_memory_profiling(s)
    with pytest.raises(wia_hw.WiaError, match="not running"):
        stop_memory_profiling(s)
    assert ctx.allocator.listeners == []
    no_stacks = start_memory_profiling(ctx, MemoryProfilingConfig(track_call_stacks=False))
    buf = ctx.allocate(100)
    rep = stop_memory_profiling(no_stacks)
    assert rep.leaks[0].stack_trace == () and rep.leaks[0].allocation_site.file == "<unknown>"
    ctx.free(buf)


def test_peak_fragmentation_is_the_free_ranges_the_peak_left():
    """The free ranges at the peak, taken lazily (before the next free or cache release),
    equal those an observer takes at every new peak as it happens; random sequences of
    allocations, frees and cache releases."""
    rng = random.Random(31)
    for trial in range(6):
        ctx = wia_hw.open_device()
        a = ctx.allocator
        eager: dict[str, Any] = {"peak": a.stats.allocated_bytes, "ranges": a.free_ranges()}

        def watch(ev, eager=eager, a=a):
            if ev.kind == "malloc" and ev.allocated_bytes > eager["peak"]:
                eager["peak"], eager["ranges"] = ev.allocated_bytes, a.free_ranges()

        a.listeners.append(watch)
        live = []
        with start_memory_profiling(ctx) as s:
            for _ in range(120):
                r = rng.random()
                if r < 0.55 or not live:
                    live.append(ctx.allocate(rng.choice([1, 7, 64, 300, 2048]) * KIB))
                elif r < 0.95:
                    ctx.free(live.pop(rng.randrange(len(live))))
                else:
                    a.empty_cache()
        a.listeners.remove(watch)
        assert s.report.free_ranges_peak == eager["ranges"], trial
