"""The seed's names, fields and printed labels that /work/shared/API.md promises: every
name importable from ``wia_hw`` and behaving as its counterpart, the seed's count
fields accepted and checked, ``verify_accuracy`` as the seed calls it, the case study's
section 8.7 printout with its exact labels, and ``wia-hw run``'s ``seq/sec``."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from click.testing import CliRunner
from wia_hw.emulator.pim_model import Operand, PimError, PimInstr, PimOp

import wia_hw
from wia_hw.accuracy import (
    GraphEvaluator,
    agreement_stats,
    calibration_batches,
    compare,
    mlp_to_graph,
    train_digits_mlp,
)
from wia_hw.cli import cli

# -- 1. names ------------------------------------------------------------------------


def test_every_promised_name_is_importable_from_wia_hw():
    for name in ("Model", "Metric", "OptimizeStrategy", "verify_accuracy"):
        assert name in wia_hw.__all__, name
    # wia_model_t: a workload graph bound to its weights (what the optimisations return)
    assert wia_hw.Model is wia_hw.Graph
    g = wia_hw.workloads.build("bert-base", batch=1, seq=8, layers=1)
    assert isinstance(wia_hw.apply_fusion(g, wia_hw.FusionConfig()), wia_hw.Model)
    assert wia_hw.OptimizeStrategy.ITERATIVE is wia_hw.OptimizationStrategy.ITERATIVE
    wf = wia_hw.OptimizationWorkflow(optimization_strategy=wia_hw.OptimizeStrategy.ITERATIVE)
    assert wf.optimization_strategy is wia_hw.OptimizationStrategy.ITERATIVE


def test_metric_is_an_enum_the_workflow_baseline_takes_as_its_string():
    M = wia_hw.Metric
    assert [m.value for m in M] == ["latency", "throughput"]
    assert M("latency") is M.LATENCY and M("THROUGHPUT") is M.THROUGHPUT
    for m in M:
        by_enum = wia_hw.WorkflowBaseline(metric=m, target_value=10.0)
        by_str = wia_hw.WorkflowBaseline(metric=m.value, target_value=10.0)
        assert by_enum == by_str and by_enum.metric == m.value and str(m) == m.value
    with pytest.raises(wia_hw.BenchmarkError, match=r"WorkflowBaseline.metric must be"):
        wia_hw.WorkflowBaseline(metric=wia_hw.Counter.CYCLES)


def test_pad_to_multiple_of_8_is_an_alias_member():
    P = wia_hw.PaddingStrategy
    assert P.PAD_TO_MULTIPLE_OF_8 is P.MULTIPLE_OF_8 is P("pad_to_multiple_of_8")
    assert P["PAD_TO_MULTIPLE_OF_8"] is P.MULTIPLE_OF_8
    assert list(P) == [P.NONE, P.MULTIPLE_OF_8, P.BUCKETS]  # no fourth strategy
    cfg = wia_hw.BatchingConfig(padding_strategy=P.PAD_TO_MULTIPLE_OF_8)
    assert cfg == wia_hw.BatchingConfig(padding_strategy="multiple_of_8")


def test_op_relu_is_the_pim_elementwise_op_and_the_graph_op_is_unchanged():
    Op, E = wia_hw.Op, wia_hw.ElementwiseOp
    for m in E:
        assert getattr(Op, m.name) is m
    assert Op.RELU is E.RELU is wia_hw.extensions.pim.Op.RELU
    # still the graph op dataclass: same fields, constructs and validates as before
    assert [f.name for f in dataclasses.fields(Op)] == [
        "name",
        "kind",
        "inputs",
        "outputs",
        "group",
        "attrs",
    ]
    op = Op(name="r", kind="relu", inputs=["x"], outputs=["y"])
    assert op.inputs == ("x",) and dataclasses.replace(op, name="s").name == "s"
    with pytest.raises(wia_hw.WorkloadError, match=r"unknown op kind"):
        Op(name="r", kind="nope", inputs=[], outputs=[])
    # the seed's pim_op: {.type = WIA_PIM_ELEMENTWISE, .operation = WIA_OP_RELU}
    cfg = wia_hw.PIMConfig(banks=4, compute_units_per_bank=2, bank_columns=8)
    x = np.arange(-300, 300, dtype=np.int16)
    wia_hw.pim_execute(
        None, cfg, wia_hw.PIMOperation(type=wia_hw.PIMOpType.ELEMENTWISE, operation=Op.RELU), x
    )
    np.testing.assert_array_equal(x, np.maximum(np.arange(-300, 300), 0))


# -- verify_accuracy -----------------------------------------------------------------

BATCH = 64


@pytest.fixture(scope="module")
def digits():
    clf, split = train_digits_mlp(hidden=(64, 32), seed=0, max_iter=200)
    g, w = mlp_to_graph(clf, BATCH)
    x_train = split[0]
    good = wia_hw.quantize_model(
        g,
        wia_hw.QuantizationConfig(calibration_batches=4),
        calibration_batches(x_train, BATCH, 4),
        weights=w,
    )
    # calibrated on inputs 50x too small: the activations clip, accuracy drops
    bad = wia_hw.quantize_model(
        g,
        wia_hw.QuantizationConfig(calibration_batches=4),
        calibration_batches(x_train / 50, BATCH, 4),
        weights=w,
    )
    return g, w, split, good, bad


def test_verify_accuracy_with_labels_is_the_top1_points_lost(digits):
    g, w, (_, x_test, _, y_test), good, bad = digits
    ref = GraphEvaluator(g, w).predict(x_test)
    for q in (good, bad):
        rep = compare("q", GraphEvaluator(q).predict(x_test), ref, y_test)
        want = (rep.reference_accuracy - rep.accuracy) / 100
        # the seed's call; the reference runs on the float weights q was made from
        assert wia_hw.verify_accuracy(q, g, (x_test, y_test)) == want
        assert wia_hw.verify_accuracy(q, g, x_test, labels=y_test) == want
    assert wia_hw.verify_accuracy(bad, g, (x_test, y_test)) > 0.05  # a real loss
    assert abs(wia_hw.verify_accuracy(good, g, (x_test, y_test))) <= 0.01
    assert wia_hw.verify_accuracy(g, g, (x_test, y_test), weights=w) == 0.0


def test_verify_accuracy_without_labels_is_one_minus_cosine(digits):
    g, w, (_, x_test, _, _), good, bad = digits
    ref = GraphEvaluator(g, w).predict(x_test)
    losses = []
    for q in (good, bad):
        cos, _ = agreement_stats(GraphEvaluator(q).predict(x_test), ref)
        loss = wia_hw.verify_accuracy(q, g, x_test)
        assert loss == 1.0 - cos
        losses.append(loss)
    assert 0 < losses[0] < 1e-3 < losses[1] < 1  # monotone in how far the outputs moved
    # one batch as a mapping, or a list of them: the same outputs as rows
    name = next(n for n, t in g.tensors.items() if t.kind == "input")
    rows = x_test[: 2 * BATCH]
    batches = [{name: rows[:BATCH]}, {name: rows[BATCH:]}]
    assert wia_hw.verify_accuracy(good, g, batches) == wia_hw.verify_accuracy(good, g, rows)
    assert wia_hw.verify_accuracy(good, g, batches[0]) == wia_hw.verify_accuracy(
        good, g, rows[:BATCH]
    )


def test_verify_accuracy_bad_input_is_one_line(digits):
    g, w, (_, x_test, _, y_test), good, _ = digits
    with pytest.raises(wia_hw.WorkloadError, match=r"labels \[3\] must hold one class id"):
        wia_hw.verify_accuracy(good, g, (x_test, y_test[:3]))
    with pytest.raises(wia_hw.WorkloadError, match=r"verify_accuracy model: test_data must"):
        wia_hw.verify_accuracy(good, g, object())
    with pytest.raises(TypeError, match=r"verify_accuracy: reference must be a Graph"):
        wia_hw.verify_accuracy(good, "mlp", x_test)


# -- 2. the seed's count fields and the PIM kernel's code ------------------------------


def test_profiling_config_takes_num_counters_and_checks_it():
    cfg = wia_hw.ProfilingConfig(num_counters=6)
    assert cfg == wia_hw.ProfilingConfig() and cfg.num_counters == len(cfg.hardware_counters)
    assert wia_hw.ProfilingConfig.from_dict(cfg.to_dict()) == cfg
    two = wia_hw.ProfilingConfig(hardware_counters=["cycles", "flops"], num_counters=2)
    assert two.num_counters == 2
    for kw, msg in (
        ({"num_counters": 5}, r"num_counters must equal the 6 hardware_counters listed, got 5"),
        (
            {"hardware_counters": ["cycles", "cycles"], "num_counters": 2},
            r"must equal the 1 distinct hardware_counters listed, got 2",
        ),
        ({"num_counters": "6"}, r"got '6'"),
    ):
        with pytest.raises(ValueError, match=msg) as e:
            wia_hw.ProfilingConfig(**kw)
        assert "\n" not in str(e.value)


def test_benchmark_config_takes_num_percentiles_and_checks_it():
    cfg = wia_hw.BenchmarkConfig(num_percentiles=5)
    assert cfg == wia_hw.BenchmarkConfig() and cfg.num_percentiles == 5
    assert wia_hw.BenchmarkConfig(**cfg.to_dict()) == cfg
    assert wia_hw.BenchmarkConfig(report_percentiles=(50, 99)).num_percentiles == 2
    with pytest.raises(
        wia_hw.BenchmarkError,
        match=r"^BenchmarkConfig.num_percentiles must equal len\(report_percentiles\) = 5, "
        r"got 4$",
    ):
        wia_hw.BenchmarkConfig(num_percentiles=4)


BODY = [
    PimInstr(
        op=PimOp.MAD,
        dst=Operand.grf(0),
        src0=Operand.bank(),
        src1=Operand.srf(0),
        src2=Operand.srf(1),
    ),
    PimInstr(op=PimOp.RELU, dst=Operand.bank(), src0=Operand.grf(0)),
]


def test_pim_kernel_takes_the_seeds_code_field_as_its_body():
    by_code = wia_hw.PIMKernel(kernel_type=wia_hw.PIMKernelType.CUSTOM, code=BODY, scalars=[3, -7])
    by_body = wia_hw.PIMKernel(body=BODY, scalars=[3, -7])
    assert by_code == by_body and by_code.code is None
    cfg = wia_hw.PIMConfig(banks=4, compute_units_per_bank=2, bank_columns=8)
    xs = [np.arange(-500, 500, dtype=np.int16) for _ in range(2)]
    runs = [
        wia_hw.pim_execute(None, cfg, k, x) for k, x in zip((by_code, by_body), xs, strict=True)
    ]
    np.testing.assert_array_equal(xs[0], np.maximum(np.arange(-500, 500) * 3 - 7, 0))
    np.testing.assert_array_equal(xs[0], xs[1])
    assert runs[0].cycles == runs[1].cycles
    # the seed's C string: one line naming the Python field
    with pytest.raises(
        PimError, match=r"code: a source string cannot run .* give the program as body="
    ) as e:
        wia_hw.PIMKernel(kernel_type=wia_hw.PIMKernelType.CUSTOM, code="for(i=0; i<n; i++) ;")
    assert "\n" not in str(e.value)
    with pytest.raises(PimError, match=r"give the program as body or as code .* not both"):
        wia_hw.PIMKernel(body=BODY, code=BODY)


# -- 3. the case study's printout -----------------------------------------------------

CS_ARGS = dict(batch=2, seq=16, layers=1, accuracy=False, server_duration_s=0.05)

LABELS = [
    "Baseline Performance:",
    "  Latency: ",
    "  Throughput: ",
    "Operation Breakdown:",
    "After fusion: ",
    "After quantization: ",
    "Accuracy delta: ",
    "After auto-tuning: ",
    "With dynamic batching:",
    "  P50 latency: ",
    "  P99 latency: ",
    "  Throughput: ",
    "Optimization Summary:",
    "  Baseline latency: ",
    "  Optimized latency: ",
    "  Overall speedup: ",
    "  Throughput improvement: ",
    "  Accuracy impact: ",
    "  Goal achieved: ",
]


def _printout(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[lines.index("Baseline Performance:") :]


def test_case_study_prints_the_seeds_labels_in_order_with_its_numbers():
    res = CliRunner().invoke(
        cli,
        [
            "case-study",
            "bert-base",
            "-b",
            "2",
            "-s",
            "16",
            "--layers",
            "1",
            "--no-accuracy",
            "--duration",
            "0.05",
        ],
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[2].startswith("step ")  # the table is kept, first
    block = _printout(res.stdout)
    i = 0
    for label in LABELS:
        while not block[i].startswith(label):
            i += 1
            assert i < len(block), label
    cs = wia_hw.case_study("bert-base", **CS_ARGS)  # the same, cached
    base, s = cs.runs["baseline"], cs.server
    text = "\n".join(block)

    def speedup(step: str) -> str:
        r = cs.runs[step]
        return f"{r.latency_ms:.2f} ms ({base.latency_ms / r.latency_ms:.1f}x speedup)"

    for want in (
        f"  Latency: {base.latency_ms:.2f} ms",
        f"  Throughput: {base.throughput:.1f} seq/sec",
        *(f"  {o.name}: {o.time_ms:.2f} ms ({o.pct:.1f}%)" for o in base.ops),
        f"After fusion: {speedup('fusion')}",
        f"After quantization: {speedup('int8 quantisation')}",
        "Accuracy delta: n/a",
        f"After auto-tuning: {speedup('auto-tuning')}",
        f"  P50 latency: {s.p50_latency_ms:.2f} ms",
        f"  P99 latency: {s.p99_latency_ms:.2f} ms",
        f"  Throughput: {s.throughput:.1f} seq/sec",
        f"  Baseline latency: {base.latency_ms:.2f} ms",
        f"  Optimized latency: {s.p50_latency_ms:.2f} ms",
        f"  Overall speedup: {base.latency_ms / s.p50_latency_ms:.2f}x",
        f"  Throughput improvement: {s.throughput / base.throughput:.2f}x",
        "  Accuracy impact: n/a",
        "  Goal achieved: YES ✓" if s.p99_latency_ms < 10 else "  Goal achieved: NO",
    ):
        assert want in text, want


def test_case_study_printout_accuracy_and_missing_steps():
    cs = wia_hw.case_study("bert-base", **CS_ARGS)
    acc = {
        "model": "bert-base REDUCED",
        "output": "h",
        "cosine": 0.9958,
        "max_abs_error": 0.1,
        "max_abs_reference": 2.0,
    }
    text = "\n".join(_printout(dataclasses.replace(cs, accuracy=acc).format_text()))
    assert re.search(r"^Accuracy delta: 0\.420% \(1 - cosine", text, re.M)
    assert "  Accuracy impact: 0.420%" in text
    # no auto-tuning and no server: n/a, and the seed's goal test fails
    runs = {k: v for k, v in cs.runs.items() if k != "auto-tuning"}
    rows = [
        dataclasses.replace(r, available=False, note="not available: x")
        if r.step == "auto-tuning"
        else r
        for r in cs.rows
    ]
    text = "\n".join(
        _printout(dataclasses.replace(cs, runs=runs, rows=rows, server=None).format_text())
    )
    for want in (
        "After auto-tuning: n/a (not available: x)",
        "  P50 latency: n/a",
        "  Optimized latency: n/a",
        "  Overall speedup: n/a",
        "  Goal achieved: NO",
    ):
        assert want in text, want


# -- 4. wia-hw run's summary line ------------------------------------------------------


def test_run_summary_prints_seq_per_sec():
    res = CliRunner().invoke(cli, ["run", "bert-base", "-b", "2", "-s", "16", "-a", "layers=1"])
    assert res.exit_code == 0, res.output
    r = wia_hw.run(wia_hw.workloads.build("bert-base", batch=2, seq=16, layers=1))
    line = next(x for x in res.output.splitlines() if x.strip().startswith("Throughput:"))
    assert (
        line
        == f"  Throughput:  {r.throughput:,.1f} seq/sec ({2 * 16 / (r.latency_ms * 1e-3):,.0f} tokens/s)"
    )
    assert "sequences/s" not in res.output
