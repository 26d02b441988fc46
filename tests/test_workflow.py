"""The optimisation workflow: the loop's decisions and their evidence, the stop rules,
the bottleneck classes and bad input."""

from __future__ import annotations

import warnings

import pytest
from wia_hw.emulator.kernels import GemmKernel

import wia_hw
from wia_hw import GraphBuilder
from wia_hw.bench import BenchmarkError
from wia_hw.bench._workflow import (
    BOTTLENECKS,
    OptimizationWorkflow,
    WorkflowBaseline,
    apply_optimisation,
    autotune_schedules,
    bottleneck_shares,
    optimize_workload,
)
from wia_hw.lowering import gemm_key, lower
from wia_hw.optimize import ScheduleUnusedWarning
from wia_hw.workloads import build


def _block(n: int = 64, d: int = 256) -> wia_hw.Graph:
    """A transformer FFN block: linear -> GELU -> linear -> residual add -> layer norm."""
    b = GraphBuilder("block", "fp16")
    x = b.input("x", (n, d))
    h = b.linear("fc1", x, 4 * d)
    a = b.op("gelu", "act", [h])
    y = b.linear("fc2", a, d)
    r = b.op("add", "residual", [y, x])
    b.op("layer_norm", "ln", [r])
    return b.graph()


@pytest.fixture(scope="module")
def block_result():
    # the loop's own runs never apply schedules tuned for a graph it has since changed
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleUnusedWarning)
        return optimize_workload("wia-npu", _block(), OptimizationWorkflow())


def test_each_kept_step_has_its_evidence(block_result):
    res = block_result
    spec = wia_hw.load_spec("wia-npu")
    assert res.applied and res.steps[0].applied is not None
    graph, schedules = _block(), {}
    prev_ms = res.baseline_ms
    for s in res.steps:
        assert s.bottleneck in BOTTLENECKS
        assert s.shares[s.bottleneck] == max(s.shares.values())
        assert sum(s.shares.values()) == pytest.approx(100.0)
        assert s.latency_ms >= s.floor_ms and s.latency_ms == prev_ms
        if s.decision == "kept":
            assert s.after_ms >= s.after_floor_ms
            assert s.gain == s.latency_ms / s.after_ms >= 1.01
            if s.applied == "autotune":  # changes no value: nothing to verify
                assert s.agreement is None
                schedules = {**schedules, **autotune_schedules(graph, spec)[0]}
            else:
                assert s.agreement.cosine >= 0.99
                graph = apply_optimisation(s.applied, graph, spec)
                keys = {
                    gemm_key(k)
                    for _, ks in lower(graph, spec)
                    for k in ks
                    if isinstance(k, GemmKernel)
                }
                schedules = {key: t for key, t in schedules.items() if key in keys}
            # the measurement is the plain run of the same optimisations
            kw = {"schedules": schedules} if schedules else {}
            assert wia_hw.run(graph, device=spec, **kw).latency_ms == s.after_ms
            prev_ms = s.after_ms
    assert res.final_ms == prev_ms and res.speedup == res.baseline_ms / res.final_ms > 1
    assert sorted(res.schedules) == sorted(schedules)
    assert "no optimisation left" in res.stop_reason or "converged" in res.stop_reason


def test_reproducible(block_result):
    again = optimize_workload("wia-npu", _block(), OptimizationWorkflow())
    assert again.to_dict() == block_result.to_dict()


def test_target_met_stops_before_optimising():
    res = optimize_workload(
        "wia-npu", _block(), OptimizationWorkflow(baseline=WorkflowBaseline(target_value=1e3))
    )
    assert res.target_met and res.stop_reason == "target met"
    assert len(res.steps) == 1 and res.steps[0].applied is None and res.applied == []


def test_small_gain_converges_and_reverts():
    res = optimize_workload("wia-npu", _block(), OptimizationWorkflow(convergence_threshold=0.9))
    s = res.steps[0]
    assert s.gain < 1.9 and s.decision.startswith("converged") and "(reverted)" in s.decision
    assert res.applied == [] and res.final_ms == res.baseline_ms


def test_failed_verification_reverts():
    res = optimize_workload("wia-npu", _block(), OptimizationWorkflow(min_cosine=1.0))
    for s in res.steps:
        if s.agreement is not None and s.agreement.cosine < 1.0:
            assert s.decision.startswith("reverted: cosine")
            assert s.applied not in res.applied


def test_autotuner_plugs_in(monkeypatch):
    """The loop calls wia_hw.optimize.autotune_model and runs with its schedules (here a
    stand-in that finds nothing, so its gain is 1.0 and the loop converges on it)."""
    from types import SimpleNamespace

    import wia_hw.optimize as opt

    calls = []

    def autotune_model(graph, config, device=None):
        calls.append((graph.name, config.max_trials, device.name))
        return SimpleNamespace(schedules={}, kernels={})

    monkeypatch.setattr(opt, "autotune_model", autotune_model)
    res = optimize_workload("wia-npu", _block(), OptimizationWorkflow(max_iterations=5))
    tuned = [s for s in res.steps if s.applied == "autotune"]
    assert calls == [("block", 32, "wia-npu")] and tuned[0].gain == 1.0
    assert "converged: autotune" in res.stop_reason


def test_without_autotuner_the_loop_says_so(monkeypatch):
    import wia_hw.optimize as opt

    monkeypatch.delattr(opt, "autotune_model")
    res = optimize_workload("wia-npu", _block(), OptimizationWorkflow(verify=False))
    assert "autotune" not in res.applied and "auto-tuning not available" in res.stop_reason


def test_bert_large_compute_first_then_memory():
    """BERT-Large (2 of 24 layers, b32 s128) is compute-bound first (the GEMMs), so int8
    comes first, then fusion for the memory-bound vector passes; each step faster and
    above its floor."""
    g = build("bert-large", batch=32, seq=128, layers=2)
    res = optimize_workload(wia_hw.open_device("wia-npu"), g, OptimizationWorkflow(verify=False))
    assert res.steps[0].bottleneck == "compute" and res.applied[0] == "int8"
    assert "fusion" in res.applied
    assert all(s.recommendation for s in res.steps if s.applied)  # the profiler's evidence
    for s in res.steps:
        if s.applied:
            assert s.after_ms >= s.after_floor_ms and s.gain > 1.01


def test_bottleneck_shares_from_the_bound_model():
    g = build("bert-large", batch=32, seq=128, layers=2)
    cfg = wia_hw.ProfilingConfig(mode="counters", capture_memory=False)
    kernels = wia_hw.run(g, profile=cfg).profile.kernel_profiles()
    shares = bottleneck_shares(kernels)
    compute_ms = sum(
        k.duration_ms for k in kernels if k.bound in ("compute", "pipeline", "parallelism")
    )
    total_ms = sum(k.duration_ms for k in kernels)
    assert shares["compute"] == pytest.approx(100 * compute_ms / total_ms)
    from wia_hw.bench._workflow import WorkflowProfiling

    off = bottleneck_shares(kernels, WorkflowProfiling(enable_memory_profiling=False))
    assert off["memory bandwidth"] == 0 and off["compute"] > shares["compute"]


@pytest.mark.parametrize(
    ("make", "msg"),
    [
        (
            lambda: OptimizationWorkflow(max_iterations=0),
            "max_iterations must be an integer >= 1, got 0",
        ),
        (
            lambda: OptimizationWorkflow(optimization_strategy="random"),
            "optimization_strategy must be one of iterative",
        ),
        (
            lambda: OptimizationWorkflow(convergence_threshold=1.5),
            r"convergence_threshold must be in \[0, 1\)",
        ),
        (lambda: OptimizationWorkflow(min_cosine=2), r"min_cosine must be in \[-1, 1\]"),
        (lambda: WorkflowBaseline(metric="energy"), "metric must be latency or throughput"),
        (lambda: WorkflowBaseline(target_value=0), "target_value must be > 0"),
    ],
)
def test_bad_workflow(make, msg):
    with pytest.raises(BenchmarkError, match=msg):
        make()


def test_bad_device_type():
    with pytest.raises(TypeError, match="optimize_workload takes a Context"):
        optimize_workload(3, _block())
    with pytest.raises(BenchmarkError, match="unknown optimisation 'prune'"):
        apply_optimisation("prune", _block(), wia_hw.load_spec("wia-npu"))
