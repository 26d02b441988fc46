"""Automated recommendations: rules, measured improvements, thresholds."""

from __future__ import annotations

import dataclasses

import pytest
from wia_hw.emulator.allocator import MIB, AllocatorConfig, CachingAllocator

import wia_hw
from wia_hw.profiling import (
    AnalysisConfig,
    Priority,
    ProfilingConfig,
    ProfilingReport,
    analyze_performance,
    start_profiling,
)
from wia_hw.profiling._kernel import KernelProfile
from wia_hw.profiling._metrics import DeviceInfo
from wia_hw.profiling._recommend import MEASURED, MODELLED, priority_for
from wia_hw.workloads import gemm

ALL = AnalysisConfig(priority_threshold="low", confidence_threshold=0.0, max_tilings=6)


def _session(workload, ctx=None, **kw):
    ctx = ctx or wia_hw.open_device(**kw.pop("device_kw", {}))
    with start_profiling(
        ctx, ProfilingConfig(mode="counters", hardware_counters=list(wia_hw.Counter))
    ) as s:
        if isinstance(workload, tuple):
            ctx.run(workload[0], **workload[1])
        else:
            ctx.run(workload)
    return ctx, s.report


@pytest.fixture(scope="module")
def bert():
    ctx, report = _session(("bert-base", {"batch": 2, "seq": 64}))
    return report, analyze_performance(report, ALL)


def test_fusion_gain_is_measured_by_replaying_the_session(bert):
    report, recs = bert
    fuse = [r for r in recs.considered if r.category == "fusion"]
    gelu = next(r for r in fuse if "feed_forward_gelu" in r.description)
    assert len(gelu.kernels) == 12 and gelu.confidence == MEASURED
    assert gelu.confidence_basis.startswith("measured: re-ran the session's")
    # the replay of the unchanged session is the session itself (both start cold)
    assert gelu.baseline_ms == pytest.approx(report.duration_ms, rel=1e-12)
    assert gelu.modified_ms < gelu.baseline_ms
    assert gelu.estimated_improvement == pytest.approx(
        (gelu.baseline_ms - gelu.modified_ms) / report.duration_ms
    )
    removed = sum(k.cycles for k in report.kernels if k.name in gelu.kernels)
    assert gelu.estimated_improvement * report.cycles >= 0.5 * removed
    assert gelu.priority == priority_for(gelu.estimated_improvement)
    assert {"ffn_layer_norm", "attention_layer_norm"} <= {r.description.split('"')[1] for r in fuse}


def test_fusion_findings_state_the_measured_bound_and_survive_extensions(bert):
    """The finding names the bound the kernel profile measures (the intermediate may
    come from L2, so a gelu pass is vector-bound, not memory-bound); without
    measuring it is modelled; and an extension's kernels in the program (flash
    attention) do not hide the chains before them."""
    report, recs = bert
    gelu = next(r for r in recs.considered if "feed_forward_gelu" in r.description)
    ks = next(k for k in report.kernels if k.name == "layer0.feed_forward_gelu")
    prof = KernelProfile.from_stats(ks, DeviceInfo.from_spec(report.spec))
    assert prof.bound == "compute" and "bound by its vector unit" in gelu.description
    assert "memory-bound" not in gelu.description
    modelled = analyze_performance(report, dataclasses.replace(ALL, measure=False))
    m = next(r for r in modelled.considered if "feed_forward_gelu" in r.description)
    assert m.confidence == MODELLED and 0 < m.estimated_improvement <= 1
    ctx = wia_hw.open_device()
    wia_hw.register_device_extension(ctx, "transformer_engine")
    _, te = _session(("bert-base", {"batch": 2, "seq": 64}), ctx)
    te_recs = analyze_performance(te, ALL)
    assert any(
        r.category == "fusion" and "feed_forward_gelu" in r.description and r.modified_ms
        for r in te_recs.considered
    )


def test_every_finding_is_seed_shaped_and_ranked(bert):
    _, recs = bert
    assert recs.considered and recs.num_recommendations == len(recs.recommendations)
    for r in recs.considered:
        assert r.title and r.description and r.impact and r.suggestion
        assert 0.0 <= r.estimated_improvement < 1.0 and 0.0 < r.confidence <= 1.0
        assert r.confidence_basis.split(":")[0] in ("measured", "modelled")
    keys = [(-r.priority, -r.estimated_improvement) for r in recs.considered]
    assert keys == sorted(keys)
    text = recs.format()
    assert text.startswith(f"Performance Recommendations ({recs.num_recommendations} total):")
    assert "  Estimated improvement: " in text and "  Confidence: " in text


def test_thresholds_filter_by_priority_and_confidence(bert):
    report, _ = bert
    strict = analyze_performance(report, AnalysisConfig(max_tilings=6))
    assert all(
        r.priority >= Priority.MEDIUM and r.confidence >= 0.7 for r in strict.recommendations
    )
    assert set(strict.recommendations) <= set(strict.considered)
    assert any(r.priority < Priority.MEDIUM for r in strict.considered)
    none = analyze_performance(report, AnalysisConfig(priority_threshold="critical", max_tilings=6))
    assert none.recommendations == [] or all(
        r.priority is Priority.CRITICAL for r in none.recommendations
    )


def test_low_occupancy_names_the_mapping_and_measures_a_retile():
    # K = 64: passes of 64 steps, half the array's issue cycles fill and drain
    _, report = _session(gemm(4096, 4096, 64))
    recs = analyze_performance(report, ALL)
    occ = next(r for r in recs.considered if r.title == "Low Kernel Occupancy")
    assert "50% of PE slots mapped" in occ.description
    assert occ.confidence == MEASURED


def test_memory_bound_low_occupancy_is_a_finding_only_with_a_measured_gain():
    # 64 output columns on a 128-wide array, HBM-bound: its idle PEs are expected
    _, report = _session(gemm(2048, 64, 2048))
    recs = analyze_performance(report, ALL)
    assert not any(r.title == "Low Kernel Occupancy" for r in recs.considered)
    mem = next(r for r in recs.considered if r.title == "Memory-Bound Kernel Below Its Roof")
    assert "occupancy is expected" in mem.description
    assert mem.confidence == MEASURED and mem.estimated_improvement > 0


def test_thermal_throttling_gain_equals_a_run_without_throttling():
    hot = {"overrides": {"thermal.initial_c": 150.0}}
    ctx, report = _session(gemm(2048, 2048, 2048), device_kw=hot)
    assert report.counters.stall_cycles["thermal"] > 0
    rec = next(
        r for r in analyze_performance(report, ALL).considered if r.title == "Thermal Throttling"
    )
    cool = wia_hw.run(
        gemm(2048, 2048, 2048),
        overrides={"thermal.initial_c": 150.0, "thermal.throttle_factor": 1.0},
    )
    assert rec.modified_ms == pytest.approx(cool.latency_ms, rel=1e-12)
    assert rec.baseline_ms == pytest.approx(report.duration_ms, rel=1e-12)
    assert rec.estimated_improvement == pytest.approx((report.cycles - cool.cycles) / report.cycles)
    assert rec.estimated_improvement > 0.15


def test_allocation_in_a_hot_path_is_measured_by_replaying_the_allocations():
    ctx = wia_hw.open_device()
    raw = AllocatorConfig(caching=False)  # every call reaches the device
    ctx.allocator = CachingAllocator(ctx.spec.memory.hbm.size_bytes, raw)
    n = 120
    with start_profiling(ctx, ProfilingConfig(mode="counters")) as s:
        for _ in range(n):
            buf = ctx.allocate(MIB)  # the hot line
            ctx.run(gemm(256, 256, 256))
            ctx.free(buf)
    report = s.report
    rec = next(
        r
        for r in analyze_performance(report, ALL).considered
        if r.title == "Memory Allocation in Hot Path"
    )
    assert f"called {n}x" in rec.description and rec.confidence == MEASURED
    per_call = raw.segment_alloc_cycles + raw.segment_free_cycles
    pooled = raw.segment_alloc_cycles  # one slab, kept in the cache
    assert rec.estimated_improvement == pytest.approx((n * per_call - pooled) / report.cycles)
    assert rec.priority >= Priority.HIGH
    assert "Pre-allocate buffers outside loop or use memory pooling" == rec.suggestion


def test_a_loaded_report_gets_modelled_estimates_only(tmp_path, bert):
    report, _ = bert
    loaded = ProfilingReport.from_dict(report.to_dict())
    recs = analyze_performance(loaded, ALL)
    assert recs.considered and all(r.confidence == MODELLED for r in recs.considered)
    assert all(r.confidence_basis.startswith("modelled") for r in recs.considered)
    assert analyze_performance(loaded).recommendations == []  # below 0.7 confidence


def test_unoverlapped_communication_is_reported_as_modelled():
    _, report = _session(gemm(512, 512, 512))
    end = report.end_cycle
    report = dataclasses.replace(
        report,
        end_cycle=end + 30_000,
        communication={
            "events": [{"kind": "all_reduce", "start_cycle": end, "end_cycle": end + 30_000}]
        },
    )
    rec = next(
        r for r in analyze_performance(report, ALL).considered if r.category == "communication"
    )
    assert rec.title == "Inefficient Communication Pattern"
    assert rec.estimated_improvement == pytest.approx(30_000 / report.cycles)
    assert rec.confidence == MODELLED


def test_priority_and_config_validation():
    assert [priority_for(x) for x in (0.6, 0.3, 0.1, 0.01)] == [
        Priority.CRITICAL,
        Priority.HIGH,
        Priority.MEDIUM,
        Priority.LOW,
    ]
    assert Priority("medium") is Priority.MEDIUM and Priority.LOW < Priority.HIGH
    assert AnalysisConfig(priority_threshold="HIGH").priority_threshold is Priority.HIGH
    with pytest.raises(
        ValueError, match="priority_threshold must be low, medium, high or critical, got 'urgent'"
    ):
        AnalysisConfig(priority_threshold="urgent")
    with pytest.raises(ValueError, match=r"confidence_threshold must be a number in \[0, 1\]"):
        AnalysisConfig(confidence_threshold=70)
    with pytest.raises(TypeError, match="takes a ProfilingReport"):
        analyze_performance({})


def test_retiling_code_example_reproduces_the_measured_time():
    wl = ("bert-base", {"batch": 8, "seq": 128})
    # the unpipelined array: every pass pays its fill and drain, which retiling cuts
    dev = {"overrides": {"compute.array.pipelined": False}}
    _, report = _session(wl, device_kw=dev)
    recs = analyze_performance(report, ALL)
    rec = next(
        r
        for r in recs.considered
        if r.category in ("utilization", "occupancy") and r.modified_ms is not None
    )
    assert rec.modified_ms < rec.baseline_ms
    ctx = wia_hw.open_device(**dev)
    code = rec.code_example.rsplit("\n", 1)[0]  # all but "ctx.run(...)"
    exec(code, {"ctx": ctx})
    assert set(ctx.providers) == set(rec.kernels)
    result = ctx.run(wl[0], **wl[1])
    assert result.latency_ms == pytest.approx(rec.modified_ms, rel=1e-12)


def test_cache_thrashing_is_found_and_a_retile_measured():
    # a small L1 forces small tiles with K split, a small L2 cannot hold the panels (at
    # 2 MiB of L1 the K slices that grow the tile keep HBM under twice the compulsory)
    small = {"overrides": {"memory.l2.size_kib": 4096, "memory.l1.size_kib": 1024}}
    _, report = _session(gemm(2048, 2048, 2048), device_kw=small)
    k = report.kernels[0]
    assert k.counters["bytes"]["hbm"] > 2 * k.compulsory_bytes
    rec = next(
        r for r in analyze_performance(report, ALL).considered if r.title == "Cache Thrashing"
    )
    assert "compulsory bytes through HBM with an L2 hit rate" in rec.description
    assert rec.confidence == MEASURED and rec.modified_ms < rec.baseline_ms
    assert rec.estimated_improvement == pytest.approx(
        (rec.baseline_ms - rec.modified_ms) / report.duration_ms
    )


def test_attention_is_measured_with_the_transformer_engine_and_every_class_covered():
    """Attention chains get a recommendation whose gain is measured: the session's graph
    lowered again with the transformer engine (flash attention) and replayed; a fresh
    run with the engine registered takes exactly the modified time. Every op group above
    5 % of the time has a recommendation or the reason none applies."""
    from wia_hw.registry import ensure_extension

    wl = ("bert-base", {"batch": 2, "seq": 128})
    ctx = wia_hw.open_device()
    with start_profiling(ctx, ProfilingConfig(mode="detailed", capture_memory=False)) as s:
        ctx.run(wl[0], **wl[1])
    report = s.report
    recs = analyze_performance(report, AnalysisConfig(max_tilings=4))
    att = next(r for r in recs.considered if r.category == "attention")
    assert att.title == "Unfused Attention" and att.confidence == MEASURED
    assert len(att.kernels) == 3 * 12 and all(
        k.split(".")[1] in ("attention_scores", "attention_softmax", "attention_context")
        for k in att.kernels
    )
    assert "transformer engine" in att.confidence_basis
    assert att.baseline_ms == pytest.approx(report.duration_ms, rel=1e-12)
    assert att.estimated_improvement == pytest.approx(
        max(0.0, att.baseline_ms - att.modified_ms) / report.duration_ms
    )
    te = wia_hw.open_device()
    ensure_extension(te, "transformer_engine", claims=True)
    assert te.run(wl[0], **wl[1]).latency_ms == pytest.approx(att.modified_ms, rel=1e-12)
    # coverage: op groups above 5 % of the time
    shares = {}
    for op in report.ops:
        shares[op.group] = shares.get(op.group, 0) + op.end_cycle - op.start_cycle
    big = {g for g, c in shares.items() if c >= 0.05 * report.cycles}
    assert {c["group"] for c in recs.coverage} == big
    shown = {r.title for r in recs.recommendations}
    for c in recs.coverage:
        assert c["share"] == pytest.approx(shares[c["group"]] / report.cycles)
        if c["recommendations"]:
            assert c["reason"] is None and set(c["recommendations"]) <= shown
        else:
            assert "-bound at" in c["reason"]
            assert f"{c['group']} (" in recs.format()
    # a session that already runs attention through the engine is not told to
    ctx2 = wia_hw.open_device()
    ensure_extension(ctx2, "transformer_engine", claims=True)
    with start_profiling(ctx2, ProfilingConfig(mode="detailed", capture_memory=False)) as s2:
        ctx2.run(wl[0], **wl[1])
    recs2 = analyze_performance(s2.report, AnalysisConfig(max_tilings=4))
    assert not any(r.category == "attention" for r in recs2.considered)
