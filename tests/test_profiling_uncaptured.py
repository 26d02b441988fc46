"""Analysis claims no more than what was captured.

A kernel profiled without ``Counter.BANDWIDTH`` has unknown memory floors: its verdict
names no bound (neither "compute-bound" nor "latency-bound" from the unit-side floors
alone) and a roofline says why it has no point. Memory and communication figures whose
tracking flag is off are ``None`` (JSON ``null``), printed ``n/a (not tracked: ...)``,
never 0.
"""

from __future__ import annotations

import json
import random
import warnings

import pytest
from wia_hw.emulator.errors import WiaError

import wia_hw
from wia_hw import Counter, GraphBuilder
from wia_hw.profiling import (
    MemoryProfilingConfig,
    analyze_fragmentation,
    start_memory_profiling,
    stop_memory_profiling,
)
from wia_hw.profiling._bounds import MEMORY_CEILINGS, MEMORY_UNKNOWN
from wia_hw.profiling._memory import UNTRACKED_BY, memory_timeline_figure
from wia_hw.profiling._roofline import RooflineSkipWarning

BOUND_WORDS = ("latency-bound", "compute-bound", "memory-bound", "bound by", "-bound (")


def _add_graph():
    b = GraphBuilder("addk", "fp16")
    x = b.input("x", (4096, 4096))
    y = b.input("y", (4096, 4096))
    b.op("add", "sum", [x, y])
    return b.graph()


def _profile(workload, counters, mode="counters"):
    ctx = wia_hw.open_device()
    s = wia_hw.start_profiling(
        ctx, wia_hw.ProfilingConfig(mode=mode, hardware_counters=counters, capture_memory=False)
    )
    if isinstance(workload, tuple):
        ctx.run(workload[0], **workload[1])
    else:
        ctx.run(workload)
    return ctx, wia_hw.stop_profiling(s)


def _assert_no_bound_claimed(p):
    assert p.bytes is None and p.arithmetic_intensity is None
    assert p.bound is None and p.ceiling is None
    assert p.roofline_efficiency is None and p.attainable_flops is None
    assert p.near_ceilings == [] and p.latency_cause is None
    # the memory floors are unknown (absent), not 0
    assert not set(p.floor_cycles) & set(MEMORY_CEILINGS), p.floor_cycles
    first = p.assessments[0].message
    assert first.startswith("Bound unknown: ") and first.endswith(MEMORY_UNKNOWN), first
    comp = 100.0 * p.floor_cycles["compute"] / p.cycles
    assert p.ceiling_pct("compute") == pytest.approx(comp, rel=1e-12)
    assert f"compute at {comp:.0f}% of its " in first
    for a in p.assessments:  # (saying it "may be memory-bound" claims nothing)
        said = a.message.lower().replace("it may be memory-bound", "")
        assert not any(w in said for w in BOUND_WORDS), a.message


WORKLOADS = {
    "add": (_add_graph, "vector", "elementwise vector rate"),
    "gemm": (lambda: ("gemm", dict(M=1024, N=1024, K=1024)), "gemm", "fp16 array peak"),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_cycles_only_names_no_bound_and_full_counters_verdict_unchanged(name):
    make, kind, peak = WORKLOADS[name]
    _, rep = _profile(make(), [Counter.CYCLES])
    (p,) = rep.kernel_profiles()
    assert p.kind == kind
    _assert_no_bound_claimed(p)
    assert f"of its {peak}" in p.assessments[0].message
    # the JSON form carries null for what is unknown (and stays valid JSON)
    d = json.loads(rep.to_json())["kernels"][0]["profile"]
    assert d["bound"] is None and d["ceiling"] is None and d["roofline_efficiency"] is None
    # with every counter: the same run, the same compute floor, and the verdict as before
    _, full = _profile(make(), list(Counter))
    (q,) = full.kernel_profiles()
    assert (q.cycles, q.floor_cycles["compute"]) == (p.cycles, p.floor_cycles["compute"])
    msg = q.assessments[0].message
    if name == "add":
        assert q.bound == "hbm"
        assert msg == (
            "Memory-bound (HBM bandwidth): AI=0.195 FLOP per HBM byte (ridge point 1.67); "
            "reaches 92% of what the HBM ceiling allows"
        )
    else:
        assert q.bound == "compute"
        assert msg == (
            "Compute-bound (fp16 array peak): AI=512 FLOP per HBM byte is above the ridge "
            "point 213; reaches 89% of that peak"
        )


def test_random_kernels_without_bandwidth_never_claim_a_bound():
    rng = random.Random(7)
    for _ in range(4):
        m, n, k = (rng.choice([32, 64, 192, 512, 1024]) for _ in range(3))
        _, rep = _profile(("gemm", dict(M=m, N=n, K=k)), [Counter.CYCLES, Counter.FLOPS])
        for p in rep.kernel_profiles():
            _assert_no_bound_claimed(p)
            # a unit-side floor above the compute one is named with its share
            unit = max(p.floor_cycles.values())
            if unit > p.floor_cycles["compute"]:
                assert f"{100.0 * unit / p.cycles:.0f}% of its " in p.assessments[0].message


def test_low_utilisation_without_bandwidth_does_not_say_what_binds():
    _, rep = _profile(("gemm", dict(M=64, N=64, K=4096)), [Counter.CYCLES])
    (p,) = rep.kernel_profiles()
    _assert_no_bound_claimed(p)
    low = next(a for a in p.assessments if a.message.startswith("Low compute utilization"))
    assert "whose bound is unknown (it may be memory-bound)" in low.message
    # the parallelism floor (1 tile over 4 cores) is above the compute floor: named
    par = 100.0 * p.floor_cycles["parallelism"] / p.cycles
    assert f"{par:.0f}% of its parallelism (tiles over cores) ceiling" in p.assessments[0].message


def test_roofline_says_why_kernels_without_bytes_have_no_point():
    ctx, rep = _profile(("gemm", dict(M=1024, N=1024, K=1024)), [Counter.CYCLES])
    rf = wia_hw.create_roofline(ctx)
    with pytest.warns(RooflineSkipWarning, match=r"Counter\.BANDWIDTH") as rec:
        assert rf.add_report(rep) == []
    assert len(rec) == 1 and "\n" not in str(rec[0].message)
    assert "add_report: 1 kernel(s) skipped (e.g. 'gemm')" in str(rec[0].message)
    with pytest.warns(RooflineSkipWarning, match=r"add_kernel: .*Counter\.BANDWIDTH"):
        assert rf.add_kernel(rep.kernel_profiles()[0]) is None
    assert rf.points == []
    # with the bytes captured: a point, and no warning
    ctx2, full = _profile(("gemm", dict(M=1024, N=1024, K=1024)), list(Counter))
    rf2 = wia_hw.create_roofline(ctx2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RooflineSkipWarning)
        assert len(rf2.add_report(full)) == 1


def test_coverage_reason_without_bandwidth_names_no_bound():
    _, rep = _profile(("gemm", dict(M=1024, N=1024, K=1024)), [Counter.CYCLES], mode="trace")
    recs = wia_hw.analyze_performance(rep)
    (g,) = [c for c in recs.coverage if c["group"] == "gemm"]
    assert not g["recommendations"]
    assert f"gemm: bound unknown, {MEMORY_UNKNOWN}" in g["reason"]
    assert "-bound at" not in g["reason"]


# -- memory and communication tracking flags -------------------------------------------


def _memory_session(**flags):
    ctx = wia_hw.open_device()
    s = start_memory_profiling(ctx, MemoryProfilingConfig(**flags))
    bufs = [ctx.allocate(5 << 20) for _ in range(3)]
    ctx.free(bufs[1])
    return stop_memory_profiling(s)


LABELS = {
    "total_allocated_gb": "  Total Allocated: ",
    "peak_usage_gb": "  Peak Usage: ",
    "fragmentation_percent": "  Fragmentation: ",
    "num_allocations": "  Allocations: ",
    "num_deallocations": "  Deallocations: ",
    "num_leaks": "  Memory Leaks: ",
}
FLAGS = (
    "peak_usage_tracking",
    "detect_fragmentation",
    "track_allocations",
    "track_deallocations",
    "detect_leaks",
)


@pytest.mark.parametrize("flag", FLAGS)
def test_untracked_memory_figures_are_none_and_print_not_tracked(flag):
    full, off = _memory_session(), _memory_session(**{flag: False})
    gone = {f for f, flags in UNTRACKED_BY.items() if flag in flags}
    assert gone
    d = off.to_dict()
    text = off.format().splitlines()
    for f in UNTRACKED_BY:
        if f in gone:
            assert getattr(off, f) is None and d[f] is None, f
            assert getattr(full, f) is not None, f
            if f in LABELS:
                assert f"{LABELS[f]}n/a (not tracked: {flag}=False)" in text, (f, text)
        else:  # the other figures are measured as with every flag on
            assert getattr(off, f) == getattr(full, f), f
    assert off.current_usage_gb == full.current_usage_gb and off.active_buffers == 2
    # JSON null, and back: still unknown
    back = type(off).from_dict(json.loads(json.dumps(d, allow_nan=False)))
    assert back.format() == off.format()
    title = memory_timeline_figure(off).axes[0].get_title()
    if flag == "detect_fragmentation":
        assert title.endswith("fragmentation n/a")
    elif flag in ("track_allocations", "detect_leaks"):
        assert "leaks n/a" in title


def test_untracked_peak_usage_and_fragmentation():
    off = _memory_session(peak_usage_tracking=False)
    full = _memory_session()
    assert full.peak_usage_gb == pytest.approx(15 * (1 << 20) / 1e9)
    assert off.peak_usage_gb is None and off.peak_cycle is None
    assert "  Peak Usage: n/a (not tracked: peak_usage_tracking=False)" in off.format()
    assert "  Current Usage: 0.01 GB" in off.format()
    # the end's fragmentation is still measured; the peak's is not
    assert analyze_fragmentation(off) == analyze_fragmentation(full)
    with pytest.raises(WiaError, match=r"peak_usage_tracking=False") as e:
        analyze_fragmentation(off, at="peak")
    assert "\n" not in str(e.value)
    nofrag = _memory_session(detect_fragmentation=False)
    assert nofrag.fragmentation_percent is None and nofrag.free_ranges_end is None
    assert full.fragmentation_percent == pytest.approx(25.0)
    assert "  Fragmentation: n/a (not tracked: detect_fragmentation=False)" in nofrag.format()
    for at in ("end", "peak"):
        with pytest.raises(WiaError, match=r"detect_fragmentation=False") as e:
            analyze_fragmentation(nofrag, at=at)
        assert "\n" not in str(e.value) and "analyze_fragmentation" in str(e.value)


def _comm_session(cfg):
    comm = wia_hw.open_cluster("wia-cluster-8")
    s = wia_hw.start_comm_profiling(comm, cfg)
    comm.compute(None, 400_000, label="fwd+bwd")
    comm.all_reduce(nbytes=64 << 20)
    return wia_hw.stop_comm_profiling(s)


def test_comm_without_overlap_tracking_leaves_compute_figures_unknown():
    off = _comm_session(wia_hw.CommProfilingConfig(track_overlap=False))
    full = _comm_session(wia_hw.CommProfilingConfig())
    assert off.total_compute_time_s is None
    assert off.overlap_efficiency is None and off.communication_fraction is None
    lines = off.summary().splitlines()
    na = "n/a (not tracked: track_overlap=False)"
    assert lines[2:5] == [
        f"  Total Computation Time: {na}",
        f"  Overlap Efficiency: {na}",
        f"  Communication Fraction: {na}",
    ]
    # what was tracked is as measured with every flag on
    assert off.total_comm_time_s == full.total_comm_time_s > 0
    assert full.total_compute_time_s == pytest.approx(400_000 / (full.clock_ghz * 1e9))
    assert full.communication_fraction == pytest.approx(
        full.total_comm_time_s / (full.total_comm_time_s + full.total_compute_time_s)
    )
    assert lines[1] == full.summary().splitlines()[1]


def test_profile_kernel_takes_numpy_dtype_names_and_lists_the_known_ones():
    import wia_hw
    from wia_hw import WorkloadError

    def add(dtype: str):
        inputs = {"a": ((256, 256), dtype), "b": ((256, 256), dtype)}
        return wia_hw.profile_kernel(wia_hw.open_device(), "add", inputs)

    assert add("float16").duration_ms == add("fp16").duration_ms
    ctx = wia_hw.open_device()
    with pytest.raises(WorkloadError, match=r"unknown dtype 'half' \(known: fp32, fp16, .*float16"):
        wia_hw.profile_kernel(ctx, "add", {"a": ((256, 256), "half")})
