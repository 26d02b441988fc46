"""Every recommendation kind carries a runnable fix, and running it gives the promised
gain (issue #15, "Actionable recommendations").

Each test profiles a small workload that triggers one kind, executes the
recommendation's ``code_example`` as a user would (Python run with ``wia_hw``, ``ctx``,
``workload`` and ``run_kwargs``; a manifest written to a file and registered), runs the
workload again on a fresh context, and checks the measured gain. The estimates are
measured by replaying the session's kernels with the change on a fresh device, and the
fixes apply that very change, so the gains must be *equal*: ``(before - after) /
before`` in cycles, where ``before`` is the profiled run (the session's replay starts
cold as the profiled run does, so its cycles are the report's).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from wia_hw.emulator.allocator import MIB, AllocatorConfig, CachingAllocator

import wia_hw
from wia_hw.cli import cli
from wia_hw.graph import GraphBuilder
from wia_hw.profiling import (
    AnalysisConfig,
    Fix,
    ProfilingConfig,
    analyze_performance,
    start_profiling,
)
from wia_hw.profiling._recommend import MEASURED
from wia_hw.registry import load_extension, register_device_extension
from wia_hw.workloads import gemm

ALL = AnalysisConfig(priority_threshold="low", confidence_threshold=0.0, max_tilings=6)
BERT = ("bert-base", {"batch": 2, "seq": 128, "layers": 2})


def _profile(workload, kw, dev=None):
    ctx = wia_hw.open_device(**(dev or {}))
    with start_profiling(ctx, ProfilingConfig(mode="counters")) as s:
        ctx.run(workload, **kw)
    return s.report, analyze_performance(s.report, ALL)


def _apply_code(rec, workload, kw, dev, tmp_path):
    """Run ``rec.code_example`` on a fresh context as a user would; the run's result."""
    ctx = wia_hw.open_device(**(dev or {}))
    assert rec.fix is not None and rec.code_example == rec.fix.code
    if rec.fix.kind == "manifest":
        path = tmp_path / f"{rec.kernels[0]}.yaml"
        path.write_text(rec.code_example)
        register_device_extension(ctx, path)
        return ctx.run(workload, **kw)
    ns = {"wia_hw": wia_hw, "ctx": ctx, "workload": workload, "run_kwargs": dict(kw)}
    exec(rec.code_example, ns)
    return ns["result"] if "result" in ns else ns["ctx"].run(workload, **kw)


def _check_gain(report, rec, after):
    """The fix's measured gain is the promised one, and the run is the replayed one."""
    assert rec.confidence == MEASURED and rec.estimated_improvement > 0
    gain = (report.cycles - after.cycles) / report.cycles
    assert gain == pytest.approx(rec.estimated_improvement, rel=1e-12, abs=1e-15)
    assert after.latency_ms == pytest.approx(rec.modified_ms, rel=1e-12)


@pytest.fixture(scope="module")
def bert():
    return _profile(*BERT)


def test_gelu_fusion_is_an_apply_fusion_call_with_the_promised_gain(bert, tmp_path):
    report, recs = bert
    rec = next(r for r in recs.considered if "feed_forward_gelu" in r.description)
    assert rec.fix.kind == "api" and "wia_hw.apply_fusion(" in rec.code_example
    assert "fuse_gelu=True" in rec.code_example and "fuse_layer_norm=False" in rec.code_example
    after = _apply_code(rec, *BERT, None, tmp_path)
    _check_gain(report, rec, after)
    fused = [k.name for k in after.kernels if k.name.endswith("feed_forward_gelu")]
    assert fused == [
        f"layer{i}.feed_forward_intermediate+layer{i}.feed_forward_gelu" for i in (0, 1)
    ]


@pytest.mark.parametrize("which", ["ffn_layer_norm", "attention_layer_norm"])
def test_residual_layer_norm_fusion_is_a_builtin_cost_manifest(bert, tmp_path, which):
    """apply_fusion would fuse both residual/layer-norm pairs at once; the finding names
    one, so its fix is a manifest that claims exactly its producers by name and reuses
    the emulator's kernel timing (``cost: builtin``), no copied formula."""
    report, recs = bert
    rec = next(
        r
        for r in recs.considered
        if r.title == "Unfused Elementwise Chain" and f'Kernel "{which}"' in r.description
    )
    assert rec.fix.kind == "manifest"
    ext = load_extension_text(rec.code_example, tmp_path)
    (op,) = ext.operations
    assert op.builtin_cost == "vector" and not op.cost
    assert op.compose == ("add", "layer_norm")
    assert op.claims == tuple(f"layer{i}.{which.split('_')[0]}_residual" for i in (0, 1))
    after = _apply_code(rec, *BERT, None, tmp_path)
    _check_gain(report, rec, after)
    assert after.extensions[ext.id]["kernels"] == 2


def load_extension_text(text, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return load_extension(path)


#: attention at a sequence where flash attention wins on wia-npu (at BERT's s128 the
#: unfused chain is faster: its S and P write-backs hide in the GEMMs' idle HBM time)
LONG = ("gpt2", {"batch": 1, "seq": 1024, "layers": 1})


def test_attention_fix_registers_the_transformer_engine(tmp_path):
    report, recs = _profile(*LONG)
    rec = next(r for r in recs.considered if r.category == "attention")
    assert 'register_device_extension(ctx, "transformer_engine")' in rec.code_example
    after = _apply_code(rec, *LONG, None, tmp_path)
    _check_gain(report, rec, after)
    assert "transformer_engine" in after.extensions


def test_an_epilogue_outside_apply_fusion_gets_a_matmul_manifest(tmp_path):
    """linear -> relu is no apply_fusion pattern: the fix composes [matmul, relu] with
    the built-in GEMM timing, and gives the measured gain."""
    b = GraphBuilder("mlp")
    x = b.input("x", (512, 1024))
    for i in range(2):
        x = b.op("relu", f"block{i}.relu", [b.linear(f"block{i}.fc", x, 1024)])
    g = b.graph()
    report, recs = _profile(g, {})
    rec = next(r for r in recs.considered if r.kernels == ("block0.relu",))
    assert rec.fix.kind == "manifest"
    assert "compose: [matmul, relu]" in rec.code_example and "cost: builtin" in rec.code_example
    after = _apply_code(rec, g, {}, None, tmp_path)
    _check_gain(report, rec, after)
    assert [k.name for k in after.kernels][:2] == ["block0.fc+block0.relu", "block1.fc"]


@pytest.mark.parametrize(
    "title, workload, dev",
    [
        # 64 of 128 columns, HBM-bound at 71% of its roof: a tiling moves its bytes faster
        ("Memory-Bound Kernel Below Its Roof", gemm(2048, 64, 2048), None),
        (
            "Cache Thrashing",
            gemm(2048, 2048, 2048),
            {"overrides": {"memory.l2.size_kib": 4096, "memory.l1.size_kib": 1024}},
        ),
        ("Thermal Throttling", gemm(1024, 1024, 1024), {"overrides": {"thermal.initial_c": 150.0}}),
    ],
)
def test_retiling_and_cooling_fixes_give_the_promised_gain(tmp_path, title, workload, dev):
    report, recs = _profile(workload, {}, dev)
    rec = next(r for r in recs.considered if r.title == title)
    assert rec.fix.kind == "api"
    after = _apply_code(rec, workload, {}, dev, tmp_path)
    _check_gain(report, rec, after)


def test_vector_row_chunking_fix_runs_the_replayed_kernel():
    """The re-tiling fix of a vector kernel (rows per tile) lowers the named op to the
    kernel the measurement replays (no small workload makes the engine pick one, as the
    lowering's chunking is already the fastest there, so the fix is built directly)."""
    import dataclasses

    from wia_hw.lowering import lower
    from wia_hw.profiling._recommend import _retile_example
    from wia_hw.profiling._whatif import FLUSH, replay

    b = GraphBuilder("v")
    b.op("softmax", "a.softmax", [b.input("x", (64, 4096))])
    g = b.graph()
    ctx = wia_hw.open_device()
    (k,) = [k for _, ks in lower(g, ctx.spec) for k in ks]
    new = dataclasses.replace(k, rows_per_tile=k.rows_per_tile // 4)
    code = _retile_example(("a.softmax",), new)
    assert f"rows_per_tile={k.rows_per_tile // 4}" in code
    ns = {"wia_hw": wia_hw, "ctx": ctx, "workload": g, "run_kwargs": {}}
    exec(code, ns)
    assert ns["result"].cycles == replay(ctx.spec, [new, FLUSH]) != replay(ctx.spec, [k, FLUSH])


def test_pooling_fix_gives_at_least_the_promised_gain():
    """The allocation finding's fix swaps in a pooling allocator; the user's loop run
    again saves at least the replayed allocation cycles at the hot site."""
    raw = AllocatorConfig(caching=False)  # every call reaches the device

    def loop(ctx):
        start = ctx.device.now
        for _ in range(120):
            buf = ctx.allocate(MIB)  # the hot line
            ctx.run(gemm(256, 256, 256))
            ctx.free(buf)
        return ctx.device.now - start

    ctx = wia_hw.open_device()
    ctx.allocator = CachingAllocator(ctx.spec.memory.hbm.size_bytes, raw)
    with start_profiling(ctx, ProfilingConfig(mode="counters")) as s:
        loop(ctx)
    rec = next(
        r
        for r in analyze_performance(s.report, ALL).considered
        if r.title == "Memory Allocation in Hot Path"
    )
    fixed = wia_hw.open_device()
    fixed.allocator = CachingAllocator(fixed.spec.memory.hbm.size_bytes, raw)
    exec(rec.code_example, {"wia_hw": wia_hw, "ctx": fixed})
    assert fixed.allocator.config.pooling and fixed.allocator.config.caching
    gain = (s.report.cycles - loop(fixed)) / s.report.cycles
    assert rec.estimated_improvement > 0.2 and gain >= rec.estimated_improvement


def test_overlap_fix_reruns_the_training_step_with_the_promised_gain():
    kw = {"batch": 2, "seq": 64, "layers": 2}
    serial = wia_hw.train_iteration("bert-base", cluster="wia-cluster-8", overlap=False, **kw)
    rec = analyze_performance(serial, ALL).considered[0]
    assert rec.category == "communication" and rec.fix.kind == "api"
    ns = {"wia_hw": wia_hw, "workload": "bert-base", "run_kwargs": kw}
    exec(rec.code_example, ns)
    assert ns["result"].overlap
    gain = (serial.iteration_ms - ns["result"].iteration_ms) / serial.iteration_ms
    assert gain == pytest.approx(rec.estimated_improvement, rel=1e-12)
    assert rec.estimated_improvement > 0


def test_fix_validation_and_json():
    with pytest.raises(ValueError, match="Fix.kind must be 'api' or 'manifest', got 'patch'"):
        Fix("patch", "")
    f = Fix("api", "result = 1", "nothing")
    assert f.apply(None) == 1
    assert f.to_dict() == {"kind": "api", "code": "result = 1", "description": "nothing"}


def test_recommendation_json_carries_the_fix(bert):
    _, recs = bert
    d = recs.to_dict()["considered"]
    assert all(r["fix"] is None or r["fix"]["code"] == r["code_example"] for r in d)
    assert {r["fix"]["kind"] for r in d if r["fix"]} == {"api", "manifest"}


# -- manifests: cost: builtin ---------------------------------------------------------

HEAD = 'schema_version: 1\nextension_id: m\nversion: "1.0"\noperations:\n  - name: o\n'


def _manifest(tmp_path, body):
    p = tmp_path / "m.yaml"
    p.write_text(HEAD + body)
    return load_extension(p)


def test_builtin_cost_forms(tmp_path):
    a = _manifest(
        tmp_path, "    claims: [linear]\n    compose: [matmul, gelu]\n    cost: builtin\n"
    )
    b = _manifest(
        tmp_path, "    claims: [linear]\n    compose: [matmul, gelu]\n    cost: {builtin: gemm}\n"
    )
    assert a.operations[0].builtin_cost == b.operations[0].builtin_cost == "gemm"
    assert a.to_dict()["operations"][0]["cost"] == {"builtin": "gemm"}
    v = _manifest(
        tmp_path, "    claims: [add]\n    compose: [add, layer_norm]\n    cost: builtin\n"
    )
    assert v.operations[0].builtin_cost == "vector"


def test_builtin_cost_equals_apply_fusion(tmp_path):
    """compose [matmul, gelu] with cost: builtin (the manifest docs/EXTENSIONS.md shows)
    times exactly what apply_fusion gives."""
    from wia_hw.runtime import resolve_workload

    doc = (Path(__file__).resolve().parent.parent / "docs" / "EXTENSIONS.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "gelu_epilogue" in b]
    g = resolve_workload(BERT[0], **BERT[1])
    ctx = wia_hw.open_device()
    ext = register_device_extension(ctx, load_extension_text(block, tmp_path))
    assert ext.operations[0].builtin_cost == "gemm"
    cfg = wia_hw.FusionConfig(
        fuse_attention=False, fuse_layer_norm=False, fuse_residual_connections=False
    )
    fused = wia_hw.open_device().run(wia_hw.apply_fusion(g, cfg))
    assert ctx.run(g).cycles == fused.cycles < wia_hw.open_device().run(g).cycles


@pytest.mark.parametrize(
    "body, match",
    [
        (
            "    claims: [linear]\n    compose: [matmul]\n    cost: {builtin: gemn}\n",
            r"m\.yaml:\d+: operations\.0\.cost\.builtin: unknown builtin cost model 'gemn' "
            r"\(did you mean 'gemm'\?\)",
        ),
        (
            "    claims: [linear]\n    compose: [matmul]\n    cost: {builtin: systolic}\n",
            r"unknown builtin cost model 'systolic' \(known: gemm, vector\)",
        ),
        (
            "    claims: [linear]\n    compose: [matmul]\n    cost: {builtin: vector}\n",
            r"operations\.0\.cost\.builtin: builtin cost model 'vector' times the vector "
            r"unit, but compose starts with 'matmul' \(on the array\): use builtin: gemm",
        ),
        (
            "    claims: [linear]\n    compose: [matmul]\n    cost: {builtin: gemm, cycles: '1'}\n",
            r"operations\.0\.cost\.cycles: cost: \{builtin: NAME\} takes no other key",
        ),
        (
            "    claims: [linear]\n    compose: [matmul]\n    cost: bultin\n",
            r"operations\.0\.cost: unknown cost 'bultin' \(did you mean 'builtin'\?\)",
        ),
        (
            "    claims: [linear]\n    compose: [matmul]\n    cost: builtin\n"
            "    peak: {macs_per_cycle: '1'}\n",
            r"operations\.0\.peak: a peak belongs to operations with their own cost "
            r"expressions; cost: builtin runs at the built-in unit's own peak",
        ),
        (
            "    claims: [softmax]\n    compose: [matmul]\n    cost: builtin\n",
            r"operations\.0\.claims\.0: claims 'softmax' but compose starts with 'matmul'",
        ),
    ],
)
def test_builtin_cost_errors_are_one_line(tmp_path, body, match):
    with pytest.raises(wia_hw.SpecError, match=match) as e:
        _manifest(tmp_path, body)
    assert "\n" not in str(e.value)


# -- the CLI ----------------------------------------------------------------------------


def _gain_line(out):
    m = re.search(r"Gain: measured ([\d.]+)% of the run, promised ([\d.]+)%", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


def test_cli_apply_prints_before_after_and_the_gain():
    args = ["profile", "gemm", "-a", "M=2048", "-a", "N=64", "-a", "K=2048", "--mode", "counters"]
    res = CliRunner().invoke(cli, args + ["--apply", "1"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert (
        "1. [" in out
        and "Applied recommendation 1: Memory-Bound Kernel Below Its Roof (api:" in out
    )
    lat = re.search(r"Latency: +([\d.]+) ms -> ([\d.]+) ms", out)
    assert lat and float(lat.group(2)) < float(lat.group(1))
    assert "Throughput: " in out and "Changed kernels: 1 " in out
    measured, promised = _gain_line(out)
    assert measured == promised > 0
    bad = CliRunner().invoke(cli, args + ["--apply", "9"])
    assert bad.exit_code != 0
    assert "--apply 9: there is 1 recommendation(s) at these thresholds" in bad.output
    both = CliRunner().invoke(cli, args + ["--apply", "1", "--json"])
    assert both.exit_code == 2 and "--apply prints before and after as text" in both.output


def test_cli_apply_a_manifest_fix():
    args = ["profile", "bert-base", "-b", "2", "-s", "128", "-a", "layers=2", "--mode"]
    args += ["counters", "--priority", "low"]
    listed = CliRunner().invoke(cli, [*args, "--recommend"])
    assert listed.exit_code == 0, listed.output
    # the residual + layer norm finding: its fix is a manifest (apply_fusion would fuse
    # both pairs of a layer, the finding names one)
    n = re.search(
        r"^(\d+)\. \[\w+\] Unfused Elementwise Chain\n  Issue: Kernel \"\w+_layer_norm\"",
        listed.output,
        flags=re.M,
    ).group(1)
    res = CliRunner().invoke(cli, [*args, "--apply", n])
    assert res.exit_code == 0, res.output
    assert f"Applied recommendation {n}: Unfused Elementwise Chain (manifest:" in res.output
    assert re.search(r"layer0\.(ffn|attention)_residual\+layer0\.\1_layer_norm: - -> ", res.output)
    measured, promised = _gain_line(res.output)
    assert measured == promised > 0


def test_cli_apply_refuses_a_recommendation_without_fix():
    from wia_hw.cli._common import RunOptions
    from wia_hw.cli._profile import _apply
    from wia_hw.profiling import Priority, Recommendation

    rec = Recommendation(
        priority=Priority.HIGH,
        title="Inefficient Communication Pattern",
        description="d",
        impact="i",
        suggestion="s",
        estimated_improvement=0.3,
        confidence=0.5,
        confidence_basis="modelled: the exposed communication time",
    )
    with pytest.raises(
        wia_hw.WiaError,
        match=r"--apply 1: 'Inefficient Communication Pattern' has no fix the emulator can "
        r"apply \(modelled: the exposed communication time\)",
    ):
        _apply(RunOptions(workload="gemm"), 0, {}, [rec], 1, None)
