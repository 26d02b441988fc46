"""The case study: every step at or above its roofline floor, each optimisation helps
on BERT-Large, and the table's numbers are those of the individual API calls made the
same way. BERT-Large is built with 1 of its 24 layers (b32 s128) to keep it affordable;
the case study is run once per module (and cached by case_study itself)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw import (
    BatchingConfig,
    FusionConfig,
    QuantizationConfig,
    ServerWorkload,
    apply_fusion,
    benchmark_server,
    create_inference_server,
    quantize_model,
)
from wia_hw.bench._workflow import calibration_model, random_batches
from wia_hw.cli import cli
from wia_hw.workloads import build

ARGS = dict(layers=1, accuracy_layers=1, server_duration_s=0.2)


@pytest.fixture(scope="module")
def cs():
    return wia_hw.case_study("bert-large", device="wia-npu", **ARGS)


def test_every_step_at_or_above_its_floor(cs):
    for r in cs.rows:
        if r.available:
            assert r.latency_ms >= r.floor_ms > 0, r.step
    # batching: no completed request is faster than the floor of the batch it ran in
    assert cs.server.p50_latency_ms >= cs.row("dynamic batching").floor_ms


def test_each_optimisation_helps(cs):
    base, fused, q = (cs.row(s) for s in ("baseline", "fusion", "int8 quantisation"))
    assert base.latency_ms > fused.latency_ms > q.latency_ms
    tuned = cs.row("auto-tuning")
    if tuned.available:
        assert tuned.latency_ms < q.latency_ms and cs.schedules
    # int8 peak = 2x fp16; attention's bmm GEMMs (2% of the MACs) stay fp16 at their own
    # peak, so the floor is a little above half
    assert base.floor_ms / 2 < q.floor_ms < base.floor_ms / 2 * 1.05
    b = cs.row("dynamic batching")
    assert b.available and b.throughput > base.throughput
    assert cs.server.p99_latency_ms <= cs.target_latency_ms and cs.server.rejected == 0
    assert cs.goal_achieved == (q.latency_ms < cs.target_latency_ms)
    assert "the seed's printed test" in cs.goal
    assert cs.overall_speedup == base.latency_ms / cs.server.p50_latency_ms


def test_table_equals_the_individual_api_calls(cs):
    spec = wia_hw.load_spec("wia-npu")
    g = build("bert-large", batch=32, seq=128, layers=1)
    base = wia_hw.run(g, device="wia-npu")
    assert cs.row("baseline").latency_ms == base.latency_ms
    assert cs.row("baseline").floor_ms == base.roofline_floor_ms
    assert cs.row("baseline").throughput == base.throughput
    assert [(o.name, o.time_ms) for o in cs.runs["baseline"].ops] == [
        (o.name, o.time_ms) for o in base.ops
    ]
    fused = apply_fusion(g, FusionConfig())
    assert cs.row("fusion").latency_ms == wia_hw.run(fused).latency_ms
    # int8: PTQ of the fused graph calibrated on the model at b1 s16 (2 random batches)
    cal = calibration_model(g)
    assert cal.tensors["embeddings.word.table"].shape == (1024, 1024)
    q = quantize_model(
        fused,
        QuantizationConfig(calibration_batches=2),
        random_batches(cal, 2, 0),
        calibration_graph=cal,
    )
    assert q.thresholds == cs.graphs["int8 quantisation"].thresholds
    assert cs.row("int8 quantisation").latency_ms == wia_hw.run(q).latency_ms
    schedules = {}
    if cs.row("auto-tuning").available:  # ML-guided, 32 trials per key, no wall budget
        cfg = wia_hw.AutotuneConfig(method="ml", time_budget_seconds=None, max_trials=32)
        schedules = wia_hw.autotune_model(q, cfg, device=spec).schedules
        assert schedules == cs.schedules
        tuned = wia_hw.run(q, schedules=schedules)
        assert cs.row("auto-tuning").latency_ms == tuned.latency_ms
    # batching: the same server and workload give the same figures
    server = create_inference_server(
        q,
        BatchingConfig(max_batch_size=64, max_latency_ms=10.0, padding_strategy="multiple_of_8"),
        device=spec,
        schedules=schedules,
    )
    sb = benchmark_server(
        server, ServerWorkload(p99_bound_ms=10.0, duration_s=0.2, seq=128, seed=0)
    )
    row = cs.row("dynamic batching")
    assert (row.p50_ms, row.p99_ms, row.throughput) == (
        sb.p50_latency_ms,
        sb.p99_latency_ms,
        sb.throughput,
    )


def test_accuracy_is_measured_and_labelled(cs):
    a = cs.accuracy
    assert "REDUCED to 1 of 1 layers" in a["model"] and a["output"] == "layer0.ffn_layer_norm"
    assert 0.999 < a["cosine"] <= 1.0 and a["max_abs_error"] > 0  # int8 differs, a little
    assert "hidden-state cosine" in cs.row("int8 quantisation").note


def test_autotuning_row_says_when_it_is_missing(cs):
    import wia_hw.optimize as opt

    r = cs.row("auto-tuning")
    if hasattr(opt, "autotune_model"):
        assert r.available and r.latency_ms >= r.floor_ms
    else:
        assert not r.available and "not available" in r.note


def test_feasibility_arithmetic(cs):
    gflop = cs.runs["baseline"].flops / 32 / 1e9
    assert cs.model_gflop_per_seq == gflop
    need = 5432 * gflop / 1e3
    assert f"{need:.0f} TFLOP/s" in cs.feasibility[1]
    # the implied compute of every row: throughput x FLOP per sequence
    for r in cs.rows:
        if r.available:
            assert r.implied_tflops == pytest.approx(r.throughput * gflop / 1e3)


def test_seed_target_is_impossible_at_full_size():
    """The arithmetic at 24 layers, from the model's FLOPs (timing runs only): the seed's
    5,432 seq/s needs ~429 TFLOP/s, above wia-npu's 256 TOPS int8 peak."""
    r = wia_hw.run(build("bert-large", batch=1, seq=128))
    need_tflops = 5432 * r.flops / 1e12
    assert need_tflops == pytest.approx(429, rel=0.01)
    assert need_tflops > wia_hw.load_spec("wia-npu").peak_flops("int8") / 1e12


def test_outputs(cs, tmp_path):
    d = json.loads(cs.to_json())
    assert d["schema"] == "wia-hw.case-study/1" and len(d["rows"]) == 5
    text = cs.format_text()
    for s in ("baseline", "fusion", "int8 quantisation", "auto-tuning", "dynamic batching"):
        assert s in text
    assert "Goal achieved:" in text and "Feasibility:" in text
    md = cs.to_markdown(tmp_path / "r.md", plots=False)  # plots: matplotlib, slow to import
    assert "| baseline |" in md and (tmp_path / "r.md").read_text() == md


def test_cli_prints_the_same_table(cs, tmp_path):
    args = [
        "case-study",
        "bert-large",
        "--layers",
        "1",
        "--accuracy-layers",
        "1",
        "--duration",
        "0.2",
        "--json",
        "--markdown",
        str(tmp_path / "r.md"),
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert [r["latency_ms"] for r in d["rows"]] == [r.latency_ms for r in cs.rows]
    md = (tmp_path / "r.md").read_text()
    assert "| int8 quantisation |" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "plots skipped" in md
    else:
        assert (tmp_path / "r_roofline.png").stat().st_size > 0
        assert (tmp_path / "r_breakdown.png").stat().st_size > 0


def test_cli_bad_model_is_one_line():
    res = CliRunner().invoke(cli, ["case-study", "resnet50", "--layers", "1"])
    assert res.exit_code == 2
    assert "workload 'resnet50'" in res.output and len(res.output.strip().splitlines()) == 1


def test_server_counts_are_conserved(cs):
    s = cs.server
    assert s.completed + s.rejected == s.offered
    assert sum(n * c for n, c in s.batch_size_histogram.items()) == s.completed
    assert np.isfinite(s.p99_latency_ms)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_decoder_model_rebuilds_for_calibration_and_verification(seed):
    """GPT-2 (a prefill records kv_len=0; its LM head is tied to the token table) is
    rebuilt small for int8 calibration and the accuracy check: the builder is not given
    kv_len with phase='prefill', and the tied table keeps its rows so the LM head's
    output still has the vocabulary's width."""
    from wia_hw.bench._workflow import reduced_model

    rng = np.random.default_rng(seed)
    g = build("gpt2", batch=int(rng.integers(1, 33)), seq=int(rng.integers(16, 129)), layers=2)
    vocab = g.tensors["lm_head"].shape[-1]
    cal = calibration_model(g)
    small, label = reduced_model(g, layers=1)
    for m in (cal, small):
        assert m.params["phase"] == "prefill" and m.tensors["lm_head"].shape[-1] == vocab
        assert m.tensors["embeddings.token.table"].shape[0] == vocab
    assert "REDUCED to 1 of 2 layers" in label


@pytest.mark.parametrize("where", ["missing_dir", "parent_is_a_file"])
def test_cli_unwritable_markdown_is_refused_before_the_run(where, tmp_path, monkeypatch):
    """A --markdown path that cannot be written is one line before anything runs (it
    was a FileNotFoundError traceback after the whole case study)."""
    import wia_hw.cli._case_study as mod

    ran = []
    monkeypatch.setattr(mod, "case_study", lambda *a, **k: ran.append(1))
    (tmp_path / "file.txt").write_text("")
    parent = tmp_path / ("nowhere" if where == "missing_dir" else "file.txt")
    path = parent / "x.md"
    res = CliRunner().invoke(
        cli, ["case-study", "bert-large", "--layers", "1", "--markdown", str(path)]
    )
    assert res.exit_code == 2 and not ran
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wia-hw: error: --markdown {path}: ")


def test_speedups_print_a_slowdown_and_say_what_batching_compares():
    from wia_hw._case_study import _speedup

    assert [_speedup(v) for v in (1.0, 140.03 / 140.47, 4.324, None)] == [
        "1.00x",
        "0.997x",
        "4.32x",
        "-",
    ]


def test_batching_row_says_its_speedup_is_per_request_and_gives_throughput(cs):
    row = next(r for r in cs.rows if r.step == "dynamic batching")
    if not row.available:
        pytest.skip("no batching row on this configuration")
    base = next(r for r in cs.rows if r.step == "baseline")
    assert "per-request P50 latency against the baseline batch's" in row.note
    assert f"throughput {row.throughput / base.throughput:.2f}x the baseline's" in row.note


def test_progress_names_each_step_in_order_and_ends_done():
    seen: list[tuple[int, int, str]] = []
    wia_hw.case_study(
        "bert-base",
        device="wia-npu",
        batch=2,
        seq=16,
        layers=1,
        accuracy=False,
        server_duration_s=0.05,
        cache=False,
        progress=lambda d, n, what: seen.append((d, n, what)),
    )
    starts = [what for d, n, what in seen if "(ops" not in what and d < n]
    assert starts[:4] == ["baseline", "fusion", "int8 calibration", "int8 quantisation"]
    assert starts[-1] == "dynamic batching" and "accuracy" not in starts
    assert any(what.startswith("baseline (ops ") for _, _, what in seen)
    n = seen[0][1]
    assert len(starts) == n and seen[-1] == (n, n, "")
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)


def test_cli_progress_goes_to_a_terminal_stderr_only(monkeypatch):
    import io

    from rich.console import Console

    import wia_hw.cli._common as common

    buf = io.StringIO()
    monkeypatch.setattr(common, "PROGRESS_DELAY", 0)
    monkeypatch.setattr(
        common, "progress_console", lambda: Console(file=buf, force_terminal=True, width=150)
    )
    args = ["case-study", "bert-base", "-b", "2", "-s", "16", "--layers", "1"]
    args += ["--no-accuracy", "--duration", "0.05", "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"] and "case study" in buf.getvalue()


def test_the_header_names_the_model_not_the_tuners_cost_model(cs):
    # the auto-tuning note's cost-model label once overwrote the model's name
    assert cs.model == "bert-large"
    assert cs.format_text().splitlines()[0].startswith("Case study: bert-large b")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "-1"], "--duration must be a finite number > 0, got -1.0"),
        (["--duration", "0"], "--duration must be a finite number > 0, got 0.0"),
        (["--target-ms", "-5"], "--target-ms must be a finite number > 0, got -5.0"),
        (["--max-batch-size", "0"], "--max-batch-size must be an integer >= 1, got 0"),
        (["--accuracy-layers", "0"], "--accuracy-layers must be an integer >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused_before_the_runs_naming_the_option(args, message, monkeypatch):
    """A bad batching setting was recorded as the batching row's note after minutes of
    runs, exit 0, and the goal then claimed "no Poisson rate meets" the target."""
    import wia_hw._case_study as cs

    def no_runs(*a, **k):
        raise AssertionError("ran before checking its settings")

    monkeypatch.setattr(cs, "run", no_runs)
    res = CliRunner().invoke(cli, ["case-study", "bert-base", "--layers", "1", *args])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [f"wia-hw: error: {message}"]
