"""The analysis never states more than its numbers show: every figure it prints is what
it says it measures, and the figures of one kernel agree with each other.

* a kernel's HBM bandwidth, its arithmetic intensity and its HBM roof share are of the
  same bytes (its own; the L2's eager write-backs of earlier results are shown apart),
  in the text and in the HTML page;
* no memory-bound wording on a kernel the bound model finds bound elsewhere;
* a memory-bound verdict states the intensity and ridge point of the level that binds;
* a re-tiling recommendation promises what applying its fix gives;
* a sampling profile of a busy device shows no idle time that did not happen;
* modelled gains are not called bounds.
"""

from __future__ import annotations

import json
import re

import pytest

import wia_hw
from wia_hw.profiling import (
    AnalysisConfig,
    ProfilingConfig,
    analyze_performance,
    save_profile_report,
    start_profiling,
)
from wia_hw.profiling._bounds import MEMORY_CEILINGS, _signature, memory_traffic_bytes
from wia_hw.profiling._metrics import LEVEL_NAMES, fmt_ai
from wia_hw.workloads import gemm

ALL = AnalysisConfig(priority_threshold="low", confidence_threshold=0.0)
RETILE = (
    "Low Kernel Occupancy",
    "Low Compute Utilization",
    "Cache Thrashing",
    "Memory-Bound Kernel Below Its Roof",
)


def _profile(workload, kw, mode="counters", **dev):
    ctx = wia_hw.open_device(**dev)
    cfg = ProfilingConfig(mode=mode, hardware_counters=list(wia_hw.Counter))
    with start_profiling(ctx, cfg) as s:
        ctx.run(workload, **kw)
    return s.report


@pytest.fixture(scope="module")
def bert():
    return _profile("bert-base", {"batch": 2, "seq": 64, "layers": 2})


@pytest.fixture(scope="module")
def resnet():
    return _profile("resnet50", {"batch": 1})


# -- 1. bandwidth, intensity and roof share are of the same bytes -------------------------
def test_bandwidth_intensity_and_roof_share_agree(bert):
    profiles = bert.kernel_profiles()
    eager = [k.eager_writeback_bytes for k in bert.kernels]
    assert any(eager), "the run must have eager write-backs for this test to mean anything"
    for k, p in zip(bert.kernels, profiles, strict=True):
        secs = p.duration_ms * 1e-3
        own = k.counters["bytes"]["hbm"] - k.eager_writeback_bytes
        assert p.bytes["hbm"] == own
        assert p.memory_bandwidth_gbs == pytest.approx(own / secs / 1e9)
        assert p.writeback_bandwidth_gbs == pytest.approx(k.eager_writeback_bytes / secs / 1e9)
        # the bandwidth's share of peak is the share of the HBM roof the kernel reaches
        assert p.bandwidth_pct == pytest.approx(p.ceiling_pct("hbm"))
        if own:
            # FLOP/s over bytes/s is the printed intensity
            assert p.flops / (p.memory_bandwidth_gbs * 1e9) == pytest.approx(p.arithmetic_intensity)


def test_printed_kernel_block_agrees_with_itself(bert):
    checked = 0
    for k, p in zip(bert.kernels, bert.kernel_profiles(), strict=True):
        text = p.format()
        bw = re.search(r"Memory Bandwidth: ([\d.]+) GB/s \(([\d.]+)% of peak\)", text)
        tf = float(re.search(r"FLOPS: ([\d.]+) TFLOPS", text).group(1))
        assert float(bw.group(2)) == pytest.approx(
            100 * float(bw.group(1)) / p.peak_bandwidth_gbs, abs=0.06
        )
        wb = re.search(r"\+ ([\d.]+) GB/s of earlier results written back", text)
        assert (wb is not None) == (round(p.writeback_bandwidth_gbs, 1) > 0)
        ai = re.search(r"Arithmetic Intensity: ([\d.]+) FLOP/byte \(HBM\)", text)
        if ai and float(bw.group(1)) >= 10 and tf >= 1:
            # TFLOPS / GB/s within the rounding of the two printed figures
            implied = tf * 1e12 / (float(bw.group(1)) * 1e9)
            assert implied == pytest.approx(float(ai.group(1)), rel=0.06)
            checked += 1
        if p.bound == "hbm":
            eff = re.search(r"reaches (\d+)% of what the HBM ceiling allows", text)
            assert abs(float(eff.group(1)) - float(bw.group(2))) <= 0.51
        if k.name == "layer0.feed_forward_output":
            assert wb is not None  # the kernel the bug was found on
    assert checked > 5


def test_html_kernel_table_uses_the_texts_bytes(bert):
    from wia_hw.report._run import _profile_view

    rows = _profile_view(json.loads(bert.to_json()))["kernels"]
    for row, k, p in zip(rows, bert.kernels, bert.kernel_profiles(), strict=True):
        assert row["name"] == k.name
        assert row["hbm_mb"] == pytest.approx(p.bytes["hbm"] / 1e6)
        assert row["writeback_mb"] == pytest.approx(k.eager_writeback_bytes / 1e6)
        if p.arithmetic_intensity is None:
            assert row["ai_hbm"] is None
        else:
            assert row["ai_hbm"] == pytest.approx(p.arithmetic_intensity)


# -- 2. memory-bound wording only on memory-bound kernels ---------------------------------
def test_no_memory_bound_wording_on_a_kernel_bound_elsewhere(resnet):
    profiles = {p.name: p for p in resnet.kernel_profiles()}
    for p in profiles.values():
        msgs = [a.message for a in p.assessments]
        if p.bound not in MEMORY_CEILINGS:
            assert not any("memory-bound" in m.lower() for m in msgs), (p.name, p.bound, msgs)
        for m in msgs:
            if m.startswith("Near-peak bandwidth"):
                assert "hbm" in (p.bound, *p.near_ceilings) and p.bandwidth_pct > 90
    # where the bug was found: parallelism-bound, its HBM port busy with write-backs
    mp = profiles["stem.maxpool"]
    assert mp.bound == "parallelism" and mp.bytes["hbm"] == 0
    assert not any(a.message.startswith("Near-peak") for a in mp.assessments)


# -- 6. the intensity and ridge point of the level that binds -----------------------------
def _check_memory_verdicts(report) -> int:
    dev = report.device
    n = 0
    for p in report.kernel_profiles():
        if p.bound not in MEMORY_CEILINGS:
            continue
        lvl = LEVEL_NAMES[p.bound]
        msg = p.assessments[0].message
        assert msg.startswith(f"Memory-bound ({lvl} bandwidth): ")
        moved = memory_traffic_bytes(p.bytes)[p.bound]
        if not p.flop_count:
            assert f"moves {moved:,} {lvl} bytes and does no arithmetic" in msg
            assert "AI=" not in msg and "ridge" not in msg
            continue
        ai = p.flop_count / moved
        ridge = p.compute_ceiling_flops / (dev.level_bandwidth_gbs(p.bound) * 1e9)
        assert f"AI={fmt_ai(ai)} FLOP per {lvl} byte (ridge point {fmt_ai(ridge)})" in msg
        assert ai < ridge  # memory-bound: below that level's ridge point
        n += 1
    return n


def test_memory_verdicts_state_the_binding_levels_intensity(resnet, bert):
    assert _check_memory_verdicts(resnet) > 0
    assert _check_memory_verdicts(bert) > 0
    # (layer3.0.residual was the example until the elementwise ops after a convolution
    # read its output in the geometry it was stored in: now it reads its blocks once)
    l2s = [p for p in resnet.kernel_profiles() if p.bound == "l2"]
    assert l2s and all("FLOP per L2 byte" in p.assessments[0].message for p in l2s)
    gathers = [p for p in bert.kernel_profiles() if p.bound in MEMORY_CEILINGS and not p.flop_count]
    assert gathers  # the embedding lookups: no 0/0


def test_l1_bound_int8_gemm_on_tpu_v1():
    report = _profile(gemm(512, 512, 512, precision="int8"), {}, spec="tpu-v1")
    (p,) = report.kernel_profiles()
    assert p.bound == "l1"
    assert _check_memory_verdicts(report) == 1


# -- 3. a re-tiling recommendation promises what its fix gives ----------------------------
def _apply(rec, workload, kw):
    ctx = wia_hw.open_device()
    ns = {"wia_hw": wia_hw, "ctx": ctx, "workload": workload, "run_kwargs": dict(kw)}
    exec(rec.code_example, ns)
    return ns["result"]


@pytest.mark.parametrize(
    "workload, kw", [("resnet50", {"batch": 1}), ("bert-base", {"batch": 1, "seq": 32})]
)
def test_retiling_promise_is_what_applying_gives(workload, kw, resnet):
    report = resnet if workload == "resnet50" else _profile(workload, kw)
    recs = [r for r in analyze_performance(report, ALL).considered if r.title in RETILE]
    assert recs
    prog = report.program
    prog_of = {j: i for j, i in enumerate(report.program_stats) if i is not None}
    applied = 0
    for r in recs:
        # one shape and tiling per finding (the launched kernels' tiling signature)
        sigs = {
            _signature(prog[j]) for j in prog_of if report.kernels[prog_of[j]].name in r.kernels
        }
        assert len(sigs) == 1, r.kernels
        if r.fix is None:
            assert r.estimated_improvement == 0.0
            continue
        assert r.estimated_improvement > 0
        after = _apply(r, workload, kw)
        gain = (report.cycles - after.cycles) / report.cycles
        assert gain == pytest.approx(r.estimated_improvement, abs=1e-9), r.description
        applied += 1
    assert applied


def test_grouped_occupancy_sentence_uses_the_groups_factors(resnet):
    recs = analyze_performance(resnet, ALL).considered
    occ = [r for r in recs if r.title == "Low Kernel Occupancy"]
    assert any(len(r.kernels) > 1 for r in occ)
    for r in occ:
        m = re.search(
            r"occupancy of (\d+)% \((\d+)% of PE slots mapped x (\d+)% of core time busy\)",
            r.description,
        )
        a, b, c = (float(x) for x in m.groups())
        # the product of the printed factors, within their rounding
        assert abs(b * c / 100 - a) <= 0.5 * (b + c) / 100 + 0.5, r.description


# -- 4. sampling: no idle time that did not happen ----------------------------------------
def test_sampling_a_kernel_only_run_shows_no_idle():
    report = _profile(gemm(256, 256, 256), {}, mode="sampling")
    names = [h.name for h in report.hotspots("kernel", None)]
    assert "[idle]" not in names and names == ["gemm"]
    assert sum(s.weight_cycles for s in report.samples) == report.cycles


def test_sampling_the_clipped_last_interval_reads_what_ran():
    ctx = wia_hw.open_device()
    cfg = ProfilingConfig(mode="sampling", sampling_interval_us=250.0)
    with start_profiling(ctx, cfg) as s:
        ctx.run("bert-base", batch=2, seq=64)
    rep = s.report
    period = round(250.0 * 1e3 * ctx.spec.clock_ghz)
    last = rep.samples[-1]
    assert last.weight_cycles < period // 2  # clipped before its middle: the old bug's case
    assert any(k is not None and k.startswith("layer11.") for k in last.kernels)
    assert "[idle]" not in [h.name for h in rep.hotspots("kernel", None)]
    assert sum(x.weight_cycles for x in rep.samples) == rep.cycles


# -- 5. modelled gains are not called bounds ----------------------------------------------
def test_loaded_report_page_does_not_call_modelled_gains_bounds(tmp_path):
    from wia_hw.report import run_report_html

    report = _profile("bert-base", {"batch": 1, "seq": 32, "layers": 1}, mode="detailed")
    path = tmp_path / "p.json"
    save_profile_report(report, str(path))
    html = run_report_html(json.loads(path.read_text()))
    assert "modelled estimates" in html
    assert "upper bound" not in html
