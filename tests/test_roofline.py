"""Kernel profiles (seed 8.3) and roofline models (seed 8.3.1)."""

from __future__ import annotations

import numpy as np
import pytest
from wia_hw.emulator.cycles import systolic_issue_interval

import wia_hw
from wia_hw.profiling import (
    KernelProfile,
    ProfilingConfig,
    RooflineConfig,
    analyze_roofline,
    create_roofline,
    profile_kernel,
    roofline_add_point,
    roofline_plot,
    start_profiling,
)

SEED_CFG = RooflineConfig(
    peak_flops=150.0e12,
    peak_bandwidth=900.0e9,
    cache_sizes=(32 * 1024, 256 * 1024, 8 * 1024 * 1024),
    cache_bandwidths=(10000.0e9, 3000.0e9, 1500.0e9),
)


def test_seed_example_gives_the_seed_output():
    rf = create_roofline(SEED_CFG)
    roofline_add_point(rf, 45, 40e12, "matmul_large")
    roofline_add_point(rf, 0.25, 0.2e12, "elementwise_add")
    roofline_add_point(rf, 400, 0.92 * 150e12, "matmul_small")
    a = analyze_roofline(rf)
    assert a.num_recommendations == 3
    assert a.format().splitlines() == [
        "Kernel matmul_large: Memory-bound (AI=45). Increase tiling to improve cache reuse.",
        "Kernel elementwise_add: Severely memory-bound (AI=0.25). Fuse with preceding operation.",
        "Kernel matmul_small: Compute-bound. Near-optimal performance (92% of peak).",
    ]
    assert a.ridge_point == pytest.approx(150e12 / 900e9)
    assert rf.attainable(45) == pytest.approx(45 * 900e9)
    assert rf.attainable(1000) == 150e12
    assert rf.attainable(10, level="L1") == pytest.approx(10 * 10000e9)


def test_a_point_above_its_roof_is_said_to_be_so(tmp_path):
    rf = create_roofline(SEED_CFG)
    roofline_add_point(rf, 1000, 200e12, "too_fast")  # above the compute peak
    roofline_add_point(rf, 2, 3e12, "too_fast_mem")  # above 2 x 900 GB/s
    roofline_add_point(rf, 1000, 150e12, "at_peak")  # on the roof: near-optimal
    got = {r.kernel_name: r for r in analyze_roofline(rf).recommendations}
    assert got["too_fast"].suggestion == (
        "Above its roof: 133% of what the ceilings allow (AI=1000). "
        "The measurement or the ceilings are wrong."
    )
    assert got["too_fast"].severity == "above" and got["too_fast"].bound == "compute"
    assert got["too_fast_mem"].severity == "above" and got["too_fast_mem"].bound == "memory"
    assert got["at_peak"].suggestion.startswith("Compute-bound. Near-optimal")
    with pytest.raises(wia_hw.WiaError, match=r"x\.svg: plots are PNG images"):
        roofline_plot(rf, tmp_path / "x.svg")
    assert not (tmp_path / "x.svg").exists()


def test_create_roofline_takes_a_spec_name_or_path(tmp_path):
    by_name = create_roofline("wia-edge").config
    spec = wia_hw.load_spec("wia-edge")
    assert by_name == create_roofline(spec).config
    assert by_name.peak_flops == spec.peak_flops("fp16")
    with pytest.raises(wia_hw.WiaError):
        create_roofline("no-such-device")


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="peak_flops must be a positive number, got 0"):
        RooflineConfig(peak_flops=0, peak_bandwidth=1e9)
    with pytest.raises(ValueError, match=r"cache_sizes \(2\) and cache_bandwidths \(1\)"):
        RooflineConfig(
            peak_flops=1e12, peak_bandwidth=1e9, cache_sizes=(1, 2), cache_bandwidths=(1e9,)
        )
    rf = create_roofline(SEED_CFG)
    with pytest.raises(ValueError, match="arithmetic_intensity must be a positive number"):
        rf.add_point(-1, 1e12)
    with pytest.raises(ValueError, match="no compute ceiling for 'int4'"):
        rf.add_point(1, 1e12, precision="int4")
    with pytest.raises(ValueError, match="unknown memory level 'L7'"):
        rf.add_point(1, 1e12, level="L7")


def test_defaults_come_from_the_device_spec():
    ctx = wia_hw.open_device()
    cfg = RooflineConfig.from_spec(ctx)
    spec = ctx.spec
    assert cfg.peak_flops == spec.peak_flops("fp16")
    assert cfg.precision_peaks["int8"] == spec.peak_flops("int8")
    assert cfg.peak_bandwidth == spec.peak_bandwidth_gbs * 1e9
    assert cfg.cache_bandwidths == (
        spec.memory.l1.bandwidth_gbs * 1e9 * spec.compute.cores,
        spec.memory.l2.bandwidth_gbs * 1e9,
    )
    assert create_roofline(ctx).ridge_point() == pytest.approx(
        spec.peak_flops("fp16") / (spec.peak_bandwidth_gbs * 1e9)
    )


def _bert_roofline():
    ctx = wia_hw.open_device()
    with start_profiling(ctx, ProfilingConfig(mode="counters")) as s:
        ctx.run("bert-base", batch=4, seq=128)
    rf = create_roofline(ctx)
    pts = rf.add_report(s.report)
    return s.report, rf, pts


def test_report_points_aggregate_layers_and_classify_by_position():
    report, rf, pts = _bert_roofline()
    by = {p.name: p for p in pts}
    gelu = by["feed_forward_gelu (x12)"]
    ks = [k for k in report.kernels if k.name.endswith("feed_forward_gelu")]
    flops = sum(k.flop_count for k in ks)
    # the kernels' own HBM bytes (less the eager write-backs in their idle time)
    own = sum(k.counters["bytes"]["hbm"] - k.eager_writeback_bytes for k in ks)
    if own:
        assert gelu.intensities["HBM"] == pytest.approx(flops / own)
    else:  # its input in L2, its output written back later: no HBM intensity
        assert "HBM" not in gelu.intensities and gelu.intensities
    # drawn at the intensity of the level that binds it (the lowest AI x bandwidth)
    lvl = min(gelu.intensities, key=lambda n: gelu.intensities[n] * rf.config.bandwidth(n))
    assert gelu.level == lvl and gelu.arithmetic_intensity == gelu.intensities[lvl]
    secs = sum(k.cycles for k in ks) / (report.device.clock_ghz * 1e9)
    assert gelu.performance == pytest.approx(flops / secs)
    a = {r.kernel_name: r for r in analyze_roofline(rf).recommendations}
    res = a["attention_residual (x12)"]  # an add: data movement only, in whole blocks
    if res.bound == "memory":
        assert res.pct_of_attainable >= 50
        where = "" if res.level == "HBM" else f"{res.level}, "
        assert res.suggestion.startswith(f"Severely memory-bound ({where}AI=")
    else:  # its 2 x 3 blocks of 256 x 256 do not split evenly over 4 cores
        assert res.bound == "compute" and res.suggestion.startswith("Parallelism-bound at")
    ffn = a["feed_forward_intermediate (x12)"]
    assert ffn.bound == "compute"
    for r in a.values():  # no point above the ceiling that judges it
        assert r.performance <= r.attainable * 1.0000001
        assert r.bound != "memory" or r.pct_of_attainable >= 50


def flops_of(report, suffix):
    return sum(k.flop_count for k in report.kernels if k.name.endswith(suffix))


def bytes_of(report, suffix, level):
    return sum(k.counters["bytes"][level] for k in report.kernels if k.name.endswith(suffix))


def test_roofline_plot_draws_every_ceiling_and_point(tmp_path):
    _, rf, pts = _bert_roofline()
    out = roofline_plot(rf, tmp_path / "roofline.png")
    assert open(out, "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = rf.figure().axes[0]
    gids = [ln.get_gid() for ln in ax.get_lines()]
    for lvl in ("HBM", "L1", "L2"):  # a diagonal per memory level
        assert any(g.startswith(f"ceiling:{lvl} ") for g in gids)
    for name in ("int8", "fp16/bf16", "fp32"):  # a roof per precision
        assert any(g.startswith(f"ceiling:{name} peak") for g in gids)
    (sc,) = [c for c in ax.collections if c.get_gid() == "points"]
    assert len(sc.get_offsets()) == len(pts)
    seed = create_roofline(SEED_CFG)
    seed.add_point(0.25, 0.2e12, "elementwise_add")
    seed_ax = seed.figure().axes[0]
    (sc,) = [c for c in seed_ax.collections if c.get_gid() == "points"]
    assert [tuple(map(float, xy)) for xy in sc.get_offsets()] == [(0.25, 0.2)]
    assert open(seed.plot(tmp_path / "seed.png"), "rb").read()[:4] == b"\x89PNG"


def test_profile_kernel_fields_follow_the_counters():
    ctx = wia_hw.open_device()
    p = profile_kernel(ctx, "matmul", {"a": (2048, 2048), "b": (2048, 2048)})
    assert isinstance(p, KernelProfile) and p.name == "matmul"
    assert p.flop_count == 2 * 2048**3
    assert p.duration_ms == pytest.approx(p.cycles / (ctx.spec.clock_ghz * 1e6))
    assert p.compute_utilization == pytest.approx(
        100 * p.flop_count / (p.cycles * 2 * float(ctx.spec.peak_macs_per_cycle("fp16")))
    )
    assert p.flops == pytest.approx(p.flop_count / (p.duration_ms * 1e-3))
    assert p.arithmetic_intensity == pytest.approx(p.flop_count / p.bytes["hbm"])
    assert p.occupancy == pytest.approx(p.pe_mapping * p.core_balance / 100)
    assert p.bound == "compute" and p.compute_utilization > 50
    lines = p.format().splitlines()
    assert lines[0] == "Kernel: matmul" and lines[1].startswith("  Duration: ")
    assert [ln.split(":")[0] for ln in lines[2:10]] == [
        "  Compute Utilization",
        "  Memory Bandwidth",
        "  Cache Hit Rate L1",
        "  Cache Hit Rate L2",
        "  Occupancy",
        "  FLOPS",
        "  Arithmetic Intensity",
        "  INFO",
    ]


def test_low_utilisation_is_not_called_compute_bound():
    """The seed's rule calls any kernel under 50 % utilisation compute-bound; an
    elementwise add is the opposite, and the assessment says so."""
    ctx = wia_hw.open_device()
    x = np.zeros((4096, 4096), dtype=np.float16)
    p = profile_kernel(ctx, "add", [x, x])
    assert p.compute_utilization < 50 and p.bound in ("hbm", "l2")
    msgs = [a.message for a in p.assessments]
    assert not any("compute-bound" in m and "Low compute" in m and "WARNING" in m for m in msgs)
    assert any(
        m.startswith("Low compute utilization") and "is expected: the kernel is memory-bound" in m
        for m in msgs
    )
    assert any(m.startswith("Near-peak bandwidth") for m in msgs)


def test_small_gemm_warns_about_occupancy_and_says_why():
    ctx = wia_hw.open_device()
    a = ctx.spec.compute.array
    p = profile_kernel(ctx, "matmul", [(100, 100), (100, 100)])
    # one pass of 100 steps on the 128x128 array, accepted every issue interval: its
    # useful MACs over the MAC slots of those cycles (fill, drain and unmapped PEs)
    interval = systolic_issue_interval(a.dataflow, a.rows, a.cols, 100, 100, pipelined=a.pipelined)
    mapping = 100 * (100 * 100 * 100) / (a.rows * a.cols * interval)
    assert p.pe_mapping == pytest.approx(mapping)
    assert p.occupancy < 50
    warn = next(a for a in p.assessments if a.message.startswith("Low occupancy"))
    assert warn.level == "WARNING" and f"{mapping:.0f}% of the array's issue cycles" in warn.message
    assert "multiples of 128x128" in warn.suggestion


def test_profile_kernel_accepts_records_and_rejects_views():
    ctx = wia_hw.open_device()
    r = ctx.run("bert-base", batch=1, seq=32)
    k = max(r.kernels, key=lambda k: k.cycles)
    p = profile_kernel(ctx, k)
    assert p.name == k.name and p.cycles == k.cycles
    assert p.compute_utilization == pytest.approx(k.compute_utilization)
    with pytest.raises(wia_hw.WorkloadError, match="lowers to 0 kernels"):
        profile_kernel(ctx, "reshape", [(4, 4)], shape=(16,))
    with pytest.raises(TypeError, match="kernel must be a GemmKernel"):
        profile_kernel(ctx, 3.5)


def test_profile_kernel_runs_an_op_an_extension_lowers():
    """With the transformer engine registered, an attention chain (bmm -> softmax ->
    bmm) lowers to one flash-attention kernel; profile_kernel runs it as lowered."""
    b = wia_hw.GraphBuilder("attention")
    q, k, v = (b.input(n, (16, 512, 64)) for n in ("q", "k", "v"))
    s = b.op("bmm", "scores", [q, k], transpose_b=True, scale=0.125)
    p = b.op("softmax", "probs", [s])
    b.op("bmm", "context", [p, v])
    graph = b.graph()
    ctx = wia_hw.open_device()
    wia_hw.register_device_extension(ctx, wia_hw.load_extension("transformer_engine"))
    prof = profile_kernel(ctx, graph)
    assert prof.flop_count >= 2 * 2 * 16 * 512 * 512 * 64
    with pytest.raises(wia_hw.WorkloadError, match="lowers to 3 kernels"):
        profile_kernel(wia_hw.open_device(), graph)  # built-in: three kernels
