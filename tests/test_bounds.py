"""The bound model (issue #9): each ceiling's floor, the ceiling that binds, latency-bound
kernels, advice that matches the bound, occupancy with fill and drain, write-backs
attributed to the kernel that dirtied them, and BERT-Large's kernels."""

from __future__ import annotations

import random
import re

import pytest
from wia_hw.emulator.cycles import systolic_issue_interval, systolic_steps

import wia_hw
from wia_hw.profiling import ProfilingConfig, create_roofline, profile_kernel, start_profiling
from wia_hw.profiling._bounds import CEILINGS, LATENCY_BOUND_PCT, MEMORY_CEILINGS

#: The first assessment of each bound opens with these words.
OPENING = {
    "compute": "Compute-bound",
    "pipeline": "Pipeline-bound",
    "parallelism": "Parallelism-bound",
    "latency": "Latency-bound",
    "l1": "Memory-bound (L1",
    "l2": "Memory-bound (L2",
    "hbm": "Memory-bound (HBM",
}


def check_bound(p):
    """The properties every kernel profile holds (see wia_hw.profiling._bounds)."""
    f = p.floor_cycles
    largest = max(f.values())
    assert f[p.ceiling] == largest, (p.name, p.ceiling, f)
    earlier = CEILINGS[: CEILINGS.index(p.ceiling)]
    assert all(f[c] < largest for c in earlier if c in f), (p.name, f)  # ties: earlier wins
    for c, v in f.items():  # floors are lower bounds of the time
        assert v <= p.cycles * (1 + 1e-9), (p.name, c, v, p.cycles)
    eff = 100.0 * largest / p.cycles
    assert p.roofline_efficiency == pytest.approx(eff)
    if eff >= LATENCY_BOUND_PCT:
        assert p.bound == p.ceiling
    else:
        assert p.bound == "latency" and p.latency_cause
    if p.bound in MEMORY_CEILINGS:  # never memory-bound below half the roof
        assert 100.0 * f[p.bound] / p.cycles >= 50.0
    first = p.assessments[0]
    assert first.message.startswith(OPENING[p.bound]), (p.bound, first.message)
    for a in p.assessments:
        if "is expected" in a.message:
            assert p.bound in MEMORY_CEILINGS or p.kind == "vector", a.message
        if p.kind == "vector":
            assert "array mapping" not in a.suggestion and "multiples of" not in a.suggestion
    if p.bound == "pipeline" and p.kind != "vector":
        assert "longer passes" in first.suggestion.lower()
    if p.bound in MEMORY_CEILINGS:
        assert "memory traffic" in first.suggestion


def _gemm_shapes(seed, n):
    rng = random.Random(seed)
    ks = [1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000]
    ks += [rng.randint(1, 1100) for _ in range(n - len(ks))]
    dims = [1, 17, 100, 128, 200, 384, 512]
    return [(rng.choice(dims), k, rng.choice(dims)) for k in ks]


@pytest.mark.parametrize("pipelined", [True, False])
def test_gemms_of_every_k_name_the_largest_floor(pipelined):
    spec = wia_hw.open_device(overrides={"compute.array.pipelined": pipelined}).spec
    for m, k, n in _gemm_shapes(7 + pipelined, 20):
        ctx = wia_hw.Context(spec)
        p = profile_kernel(ctx, "matmul", [(m, k), (k, n)])
        check_bound(p)


@pytest.mark.parametrize("op", ["add", "relu", "gelu", "softmax", "layer_norm", "transpose"])
def test_vector_ops_and_copies_name_the_largest_floor(op):
    rng = random.Random(op)
    for _ in range(4):
        rows, cols = rng.choice([1, 3, 64, 1000, 4096]), rng.choice([16, 768, 1024, 3000])
        ins = [(rows, cols)] * (2 if op == "add" else 1)
        attrs = {}
        if op == "layer_norm":
            ins = [(rows, cols), (cols,), (cols,)]
        if op == "transpose":
            attrs = {"perm": (1, 0)}
        p = profile_kernel(wia_hw.open_device(), op, ins, **attrs)
        assert p.kind == "vector"
        check_bound(p)


def test_occupancy_counts_fill_and_drain():
    """A K=64 GEMM on the 128-row output-stationary array: each pass is accepted every
    ``systolic_issue_interval`` cycles but streams only 64 steps, so at most 64/interval
    of the array's issue cycles do useful MACs (one 128x128 tile per core: exactly)."""
    ctx = wia_hw.open_device()
    a = ctx.spec.compute.array
    cores = ctx.spec.compute.cores
    p = profile_kernel(ctx, "matmul", [(128 * cores, 64), (64, 128)])
    steps = systolic_steps(64, a.rate("fp16"))
    interval = systolic_issue_interval(
        a.dataflow, a.rows, a.cols, steps, steps, pipelined=a.pipelined
    )
    assert p.pe_mapping == pytest.approx(100.0 * steps / interval)
    assert p.fill_drain_pct == pytest.approx(100.0 * (1 - steps / interval))
    assert p.occupancy == pytest.approx(p.pe_mapping * p.core_balance / 100)
    assert p.occupancy <= 100.0 * steps / interval
    # the unpipelined array pays the whole fill and drain on every pass
    ctx = wia_hw.open_device(overrides={"compute.array.pipelined": False})
    q = profile_kernel(ctx, "matmul", [(128 * cores, 64), (64, 128)])
    n = systolic_issue_interval(a.dataflow, a.rows, a.cols, steps, steps, pipelined=False)
    assert q.pe_mapping == pytest.approx(100.0 * steps / n) and n > interval
    assert q.bound == "pipeline"


def test_too_few_tiles_is_parallelism_bound():
    ctx = wia_hw.open_device()
    # one output tile, four cores (its K slices, however many, run on one core)
    p = profile_kernel(ctx, "matmul", [(128, 4096), (4096, 128)])
    assert p.ceiling == "parallelism"
    assert p.floor_cycles["parallelism"] == pytest.approx(
        ctx.spec.compute.cores * p.floor_cycles["pipeline"]
    )
    check_bound(p)


def test_writebacks_are_attributed_to_the_kernel_that_dirtied_them():
    """Over a run (which ends with a flush) the HBM bytes attributed to kernels (their
    reads, less write-backs of others' blocks, plus the blocks they dirtied) add up to
    every HBM byte moved."""
    ctx = wia_hw.open_device()
    before = ctx.device.counters.bytes["hbm"]
    r = ctx.run("bert-base", batch=1, seq=64)
    total = ctx.device.counters.bytes["hbm"] - before
    recs = [k.record for k in r.kernels]
    attributed = sum(k.counters.bytes["hbm"] - k.writeback_bytes + k.dirtied_bytes for k in recs)
    assert attributed == total
    assert sum(k.dirtied_bytes for k in recs) > 0 and sum(k.writeback_bytes for k in recs) > 0


@pytest.fixture(scope="module")
def bert_large():
    ctx = wia_hw.open_device()
    with start_profiling(ctx, ProfilingConfig(mode="counters", capture_memory=False)) as s:
        ctx.run("bert-large", batch=32, seq=128)
    return ctx, s.report


def test_bert_large_bounds_hold_their_properties(bert_large):
    _, report = bert_large
    profiles = report.kernel_profiles()
    for p in profiles:
        check_bound(p)
    scores = [p for p in profiles if p.name.endswith("attention_scores")]
    assert len(scores) == 24
    for p in scores:  # K = 64 passes on a 128-row array: fill and drain bind the cores
        f = p.floor_cycles
        assert f["pipeline"] == max(f["compute"], f["pipeline"], f["parallelism"], f["l1"])
        # what binds is the array's fill and drain or, where its tiles' Q and K blocks
        # miss in the shared L2 (32 batch entries a tile, not 64: more tiles in flight), HBM
        assert p.ceiling == p.bound and p.bound in ("pipeline", "hbm"), (p.name, f)
        assert f[p.bound] == max(f.values()), (p.name, f)
    for p in profiles:  # never memory-bound below half of that memory roof
        if p.bound in ("l1", "l2", "hbm"):
            assert p.floor_cycles[p.bound] >= 0.5 * p.cycles, (p.name, p.bound)


def test_bert_large_roofline_points_sit_under_their_own_roofs(bert_large, tmp_path):
    ctx, report = bert_large
    rf = create_roofline(ctx)
    pts = rf.add_report(report)
    assert len(pts) >= 15
    fig = rf.figure()
    ax = fig.axes[0]
    (scatter,) = [c for c in ax.collections if c.get_gid() == "points"]
    drawn = [float(v) for xy in scatter.get_offsets() for v in xy]
    data = rf.plot_data()
    assert drawn == pytest.approx([v for p in data["points"] for v in (p["x"], p["y"] / 1e12)])
    lines = {
        ln.get_gid(): ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("ceiling:")
    }
    for p, pt in zip(data["points"], pts, strict=True):
        assert p["y"] <= p["roof"] * (1 + 1e-9), p
        # the point is drawn at the intensity it is judged at: its binding level's
        assert p["x"] == pt.intensities[pt.level]
        assert pt.roof(rf.config) == min(
            [pt.peak] + [ai * rf.config.bandwidth(lvl) for lvl, ai in pt.intensities.items()]
        )
        # its own compute-side ceiling is drawn: a line at that height
        heights = [ln.get_ydata()[-1] * 1e12 for ln in lines.values()]
        assert any(h == pytest.approx(pt.peak, rel=1e-2) for h in heights), pt.name
    # the vector kernels' op-class ceilings are drawn, not one vector roof
    labels = " ".join(lines)
    for cls in ("layer_norm vector", "softmax vector", "activation vector"):
        assert cls in labels
    assert "1 op/lane/cycle" not in labels
    out = rf.plot(tmp_path / "roofline.png")
    assert open(out, "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kernel_names_have_no_layer_prefix_collisions(bert_large):
    _, report = bert_large
    names = {re.sub(r"^layer\d+\.", "", k.name) for k in report.kernels}
    assert "attention_scores" in names and "classifier" in names


def test_extension_kernels_hold_the_same_properties():
    """Flash attention (the transformer engine's tiles, which bring their own cycles)."""
    from wia_hw.registry import ensure_extension

    ctx = wia_hw.open_device()
    ensure_extension(ctx, "transformer_engine", claims=True)
    with start_profiling(ctx, ProfilingConfig(mode="counters", capture_memory=False)) as s:
        ctx.run("bert-base", batch=2, seq=128)
    flash = [p for p in s.report.kernel_profiles() if "+" in p.name]
    assert flash and all(p.floor_cycles.get("pipeline") for p in flash)
    for p in s.report.kernel_profiles():
        check_bound(p)
