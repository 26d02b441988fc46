"""Analysis never states more than its numbers show: utilisation of a mixed-precision
run against the blend of its precisions' peaks, and a run's kernels profiled (or put on
a roofline) with the floors of the kernel as launched on the device as configured."""

from __future__ import annotations

import pytest

import wia_hw
from wia_hw import GraphBuilder
from wia_hw.profiling import ProfilingConfig, start_profiling
from wia_hw.spec import load_spec


def _mixed() -> wia_hw.Graph:
    b = GraphBuilder("mixed", "fp16")
    b.linear("fc32", b.input("x32", (512, 1024), "fp32"), 1024)
    b.linear("fc8", b.input("x8", (512, 1000), "int8"), 1024)
    return b.graph()


def test_blended_peak_is_the_parts_ideal_times() -> None:
    spec = load_spec("wia-npu")
    f32, f8 = 3e9, 5e9
    blended = spec.blended_peak_flops({"fp32": f32, "int8": f8})
    ideal = f32 / spec.peak_flops("fp32") + f8 / spec.peak_flops("int8")
    assert (f32 + f8) / blended == pytest.approx(ideal, rel=1e-12)
    assert spec.peak_flops("fp32") < blended < spec.peak_flops("int8")
    assert spec.blended_peak_flops({"fp16": 1.0}) == spec.peak_flops("fp16")
    assert spec.blended_peak_flops({"fp16": 1.0, "fp64": 1.0}) == 0.0


def test_mixed_precision_run_never_above_peak_nor_below_its_floor() -> None:
    ctx = wia_hw.open_device()
    with start_profiling(ctx, ProfilingConfig(mode="counters")) as s:
        r = ctx.run(_mixed())
    assert {k.precision for k in r.kernels} == {"fp32", "int8"}
    assert 0 < r.compute_utilization <= 100.0
    assert r.roofline_floor_ms <= r.latency_ms
    # the run's utilisation is the GEMMs' ideal time (each at its own peak) over latency
    spec = ctx.spec
    ideal_s = sum(k.flops / spec.peak_flops(k.precision) for k in r.kernels)
    assert r.compute_utilization == pytest.approx(100 * ideal_s / (r.latency_ms * 1e-3), rel=1e-9)
    summary = s.report.summary()
    assert 0 < summary["compute_utilization"] <= 100.0
    assert summary["peak_of"] == "fp32+int8"
    assert "of fp32+int8 peak" in s.report.format_text(top=2)


def test_run_kernel_profiles_agree_with_the_session() -> None:
    ctx = wia_hw.open_device()
    with start_profiling(ctx, ProfilingConfig(mode="counters")) as s:
        res = ctx.run("bert-base", batch=2, seq=64, layers=1)
    sess = {p.name: p for p in s.report.kernel_profiles()}
    for kt in res.kernels:
        a, b = wia_hw.profile_kernel(ctx, kt), sess[kt.name]
        assert (a.bound, a.ceiling) == (b.bound, b.ceiling), kt.name
        assert a.roofline_efficiency == pytest.approx(b.roofline_efficiency), kt.name
        assert a.roofline_efficiency <= 100.0 + 1e-9, kt.name
        # a bare record (no launched kernel) never claims a vector rate it cannot know
        bare = wia_hw.profile_kernel(ctx, kt.record)
        assert bare.roofline_efficiency <= 100.0 + 1e-9, kt.name


def test_roofline_of_a_run_uses_the_devices_overrides() -> None:
    ctx = wia_hw.open_device(overrides={"memory.hbm.bandwidth_gbs": 100, "clock_ghz": 0.5})
    res = ctx.run("gemm", M=256, N=2048, K=2048)
    roof = wia_hw.create_roofline(ctx)
    roof.add_report(res)
    (rec,) = wia_hw.analyze_roofline(roof).recommendations
    k = res.kernels[0]
    true_flops_s = k.flops / (k.cycles / 0.5e9)
    assert rec.performance == pytest.approx(true_flops_s, rel=1e-9)
    assert rec.performance <= rec.attainable * (1 + 1e-9)
    assert rec.severity != "above"


def _profile(ctx: wia_hw.Context, workload: str, mode: str = "counters", **kw: object):
    with start_profiling(ctx, ProfilingConfig(mode=mode)) as s:
        ctx.run(workload, **kw)
    return s.report


def test_flash_kernel_is_not_told_it_has_no_fill_drain_nor_to_use_flash() -> None:
    from wia_hw.emulator.device import Device

    from wia_hw.lowering import lower
    from wia_hw.runtime import resolve_workload

    ctx = wia_hw.open_device()
    wia_hw.register_device_extension(ctx, "transformer_engine")
    rep = _profile(ctx, "bert-base", batch=2, seq=256, layers=1)
    (p,) = [p for p in rep.kernel_profiles() if "attention_scores+softmax" in p.name]
    assert p.own_tiles_pct == pytest.approx(100.0)
    # its vector share, from the extension's own tiles
    graph = resolve_workload("bert-base", batch=2, seq=256, layers=1)
    (k,) = [
        k
        for _, ks in lower(graph, ctx.spec, ctx.providers)
        for k in ks
        if "attention_scores+softmax" in getattr(k, "name", "")
    ]
    tiles, _ = Device(ctx.spec).tiles_of(
        k.to_tiled(Device(ctx.spec)) if hasattr(k, "to_tiled") else k
    )
    arr, vec = sum(t.array_cycles for t in tiles), sum(t.vector_cycles for t in tiles)
    assert p.own_vector_pct == pytest.approx(100 * vec / (arr + vec))
    text = " ".join(a.message + " " + a.suggestion for a in p.assessments)
    assert "fill/drain 0%" not in text and "of short passes 0%" not in text
    assert "e.g. flash attention" not in text


def test_pipelined_array_is_not_advised_a_pipelined_array() -> None:
    def advice(overrides: dict[str, object]) -> str:
        ctx = wia_hw.open_device(overrides=overrides)
        rep = _profile(ctx, "gemm", M=4096, N=4096, K=64)
        (p,) = rep.kernel_profiles()
        assert p.bound == "pipeline"
        return " ".join(a.suggestion for a in p.assessments)

    assert "pipelined" not in advice({})  # wia-npu's array is pipelined
    assert "a pipelined 128x128 array" in advice({"compute.array.pipelined": False})


def test_memory_bound_kernel_gets_no_occupancy_warning() -> None:
    ctx = wia_hw.open_device()
    rep = _profile(ctx, "gpt2", batch=1, seq=1, phase="decode", kv_len=512, layers=2)
    (p,) = [p for p in rep.kernel_profiles() if p.name == "lm_head"]
    assert p.bound == "hbm" and p.occupancy < 5
    assert not any("Low occupancy" in a.message for a in p.assessments)
    recs = wia_hw.analyze_performance(
        rep, wia_hw.AnalysisConfig(priority_threshold="low", confidence_threshold=0)
    )
    assert not any(
        r.title == "Low Kernel Occupancy" and "lm_head" in r.kernels for r in recs.considered
    )


def test_off_array_units_get_no_array_findings() -> None:
    ctx = wia_hw.open_device()
    wia_hw.register_device_extension(ctx, "analog", parameters={"policy": "all"})
    rep = _profile(ctx, "bert-base", mode="instrumentation", batch=2, seq=64, layers=1)
    analog = {k.name for k in rep.kernels if k.kind == "analog"}
    assert analog
    recs = wia_hw.analyze_performance(
        rep, wia_hw.AnalysisConfig(priority_threshold="low", confidence_threshold=0)
    )
    for r in recs.considered:
        if r.title in ("Low Kernel Occupancy", "Low Compute Utilization"):
            assert not analog & set(r.kernels), r
            assert "none of up to" not in r.confidence_basis or r.kernels


def test_hotspots_and_coverage_count_the_final_writeback() -> None:
    ctx = wia_hw.open_device()
    rep = _profile(ctx, "gemm", mode="instrumentation", M=4096, N=4096, K=64)
    hs = rep.hotspots(top=None)
    assert sum(h.cycles for h in hs) == rep.cycles  # every profiled cycle is somewhere
    (wb,) = [h for h in hs if h.name == "writeback"]
    assert wb.cycles == sum(r.writeback_cycles for r in rep.runs) > 0
    recs = wia_hw.analyze_performance(rep, wia_hw.AnalysisConfig())
    (cov,) = [c for c in recs.coverage if c["group"] == "writeback"]
    assert cov["share"] == pytest.approx(wb.cycles / rep.cycles)
    assert "host_io" in cov["reason"]
    # instrumentation captures no counters: the hit rates say so
    from wia_hw.profiling._kernel import format_kernel_profile

    text = format_kernel_profile(rep.kernel_profiles()[0])
    assert "L1: n/a (counters not captured)" in text


def test_profile_cli_takes_phase_and_kv_len() -> None:
    from click.testing import CliRunner

    from wia_hw.cli import cli

    args = ["profile", "gpt2", "-b", "1", "-s", "1", "-a", "layers=1", "--json"]
    a = CliRunner().invoke(cli, [*args, "--phase", "decode", "--kv-len", "64"])
    b = CliRunner().invoke(cli, [*args, "-a", "phase=decode", "-a", "kv_len=64"])
    assert a.exit_code == 0, a.output
    assert b.exit_code == 0, b.output
    import json

    ja, jb = json.loads(a.output), json.loads(b.output)
    assert ja["summary"]["cycles"] == jb["summary"]["cycles"]
