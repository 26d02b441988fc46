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
