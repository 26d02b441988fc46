"""wia_hw.bench on the emulator and in wall time: thermal carry-over, determinism with
every variation source off, environmental data, SQLite baselines, ``wia-hw bench``."""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw.bench import (
    BenchmarkConfig,
    BenchmarkError,
    benchmark_model,
    benchmark_operation,
    compare_benchmarks,
    load_baseline_results,
    save_baseline,
    spec_hash,
)
from wia_hw.cli import cli

GEMM = {"M": 256, "N": 256, "K": 256}
# a die that throttles after a few iterations: the hot case's spec with a small heat
# capacity, starting 0.03 C below its throttle point
HOT = {"thermal.capacitance_j_per_c": 0.1, "thermal.initial_c": 94.97}


def _cfg(**kw):
    base = {
        "warmup_iterations": 1,
        "measurement_iterations": 8,
        "cooldown_iterations": 1,
        "outlier_detection": "none",
    }
    return BenchmarkConfig(**(base | kw))


def test_with_every_source_off_repeated_runs_are_identical():
    ctx = wia_hw.open_device("wia-npu-passive", overrides=HOT)
    r = benchmark_operation(ctx, "gemm", _cfg(variation_sources=()), M=1024, N=1024, K=1024)
    assert len(set(r.raw_samples_ms)) == 1
    assert (r.std_dev_ms, r.cv_percent, r.num_outliers) == (0.0, 0.0, 0)
    run = r.last_run
    assert r.mean_ms == run.latency_ms == ctx.spec.cycles_to_ms(run.cycles)
    # every iteration starts at the temperature the device had: no throttling
    env = r.environmental_data
    assert env.temperature_start_c == 94.97 and env.throttled_iterations == 0
    assert env.frequency_min_ghz == env.frequency_mean_ghz == ctx.spec.clock_ghz


def test_thermal_carry_over_heats_the_die_into_throttling():
    spec = wia_hw.load_spec("wia-npu-passive", HOT)
    ctx = wia_hw.Context(spec)
    r = benchmark_operation(ctx, "gemm", _cfg(), M=1024, N=1024, K=1024)
    env = r.environmental_data
    cool, hot = min(r.raw_samples_ms), max(r.raw_samples_ms)
    assert cool < hot  # throttled iterations take longer
    # the cool iterations equal the runs of a die held at its start temperature
    ref = benchmark_operation(
        wia_hw.Context(spec), "gemm", _cfg(variation_sources=()), M=1024, N=1024, K=1024
    )
    assert cool == ref.mean_ms
    assert r.raw_samples_ms == tuple(sorted(r.raw_samples_ms))  # the die only heats
    assert 0 < env.throttled_iterations < 8
    assert env.throttled_iterations == sum(1 for x in r.raw_samples_ms if x > cool)
    assert env.frequency_min_ghz == spec.clock_ghz * spec.thermal.throttle_factor
    assert env.frequency_min_ghz < env.frequency_mean_ghz < spec.clock_ghz
    assert env.temperature_max_c > spec.thermal.throttle_c > env.temperature_start_c
    assert env.temperature_variation == env.temperature_max_c - env.temperature_min_c
    assert env.temperature_varied == env.temperature_variation
    assert env.power_max_w >= env.power_mean_w > 0
    # the seed's warning, at a threshold this small run crosses
    warned = benchmark_operation(
        wia_hw.Context(spec), "gemm", _cfg(temperature_warning_c=0.05), M=1024, N=1024, K=1024
    )
    tv = warned.environmental_data.temperature_variation
    assert tv > 0.05
    assert (
        f"  WARNING: Temperature varied by {tv:.1f}°C during measurement"
        in warned.format_text().splitlines()
    )
    # same inputs, same result
    again = benchmark_operation(wia_hw.Context(spec), "gemm", _cfg(), M=1024, N=1024, K=1024)
    assert again.raw_samples_ms == r.raw_samples_ms and again.environmental_data == env


def test_power_and_samples_agree_with_the_runs():
    ctx = wia_hw.open_device("wia-npu", overrides=NO_REFRESH)  # identical iterations
    r = benchmark_operation(ctx, "gemm", _cfg(), **GEMM)
    run = r.last_run
    assert r.environmental_data.power_mean_w == pytest.approx(run.avg_power_w, rel=1e-12)
    assert r.name == "gemm(K=256, M=256, N=256, batch=1, precision=fp16)"
    assert r.params["M"] == 256 and r.kind == "emulator" and r.device == "wia-npu"
    assert r.spec_hash == spec_hash(ctx.spec)
    # a callable taking the context measures the same device time
    ctx2 = wia_hw.open_device("wia-npu", overrides=NO_REFRESH)
    c = benchmark_operation(ctx2, lambda c: c.run("gemm", **GEMM), _cfg())
    assert c.raw_samples_ms == r.raw_samples_ms and c.last_run is not None
    assert ctx.device.now == ctx2.device.now  # warm-up, measured and cool-down runs


def test_emulator_bad_input():
    ctx = wia_hw.open_device("wia-npu")
    with pytest.raises(BenchmarkError, match=r"took no device time \(0 cycles\)"):
        benchmark_operation(ctx, lambda c: None, _cfg())
    with pytest.raises(BenchmarkError, match=r"workload arguments \(M\) apply to a workload"):
        benchmark_operation(ctx, lambda c: c.run("gemm", **GEMM), _cfg(), M=3)
    with pytest.raises(TypeError, match=r"operation must be a workload name"):
        benchmark_operation(ctx, 42, _cfg())
    with pytest.raises(TypeError, match=r"cfg must be a BenchmarkConfig, got dict"):
        benchmark_operation(ctx, "gemm", {"measurement_iterations": 3})
    with pytest.raises(BenchmarkError, match=r"measurement_iterations must be at least 1"):
        benchmark_operation(ctx, "gemm", _cfg(measurement_iterations=0), **GEMM)
    assert ctx.observers == []


def test_wall_time_calibrates_its_inner_loop():
    calls = [0]

    def op():
        calls[0] += 1

    cfg = _cfg(
        warmup_iterations=2, measurement_iterations=5, cooldown_iterations=1, min_sample_time_ms=0.2
    )
    r = benchmark_operation(None, op, cfg)
    assert r.kind == "wall" and r.device == "host" and r.num_measurements == 5
    assert r.inner_loops > 1  # one call of op lasts far under 0.2 ms
    # calibration calls, then 8 samples of inner_loops calls
    assert calls[0] > 8 * r.inner_loops
    assert all(x > 0 for x in r.raw_samples_ms)
    assert r.environmental_data.temperature_variation is None
    with pytest.raises(BenchmarkError, match=r"workload arguments \(batch\) need a context"):
        benchmark_operation(None, op, cfg, batch=2)
    with pytest.raises(TypeError, match=r"without a context, operation must be a callable"):
        benchmark_operation(None, "gemm", cfg)


def test_benchmark_model_is_the_seeds_thin_wrapper():
    m = benchmark_model("bert-base", 2, seq=64, layers=1)
    run = m.run
    assert m.latency_ms == run.latency_ms
    assert m.throughput == pytest.approx(2 / (run.latency_ms * 1e-3), rel=1e-12)
    assert m.ops == run.ops and m.num_operations == len(run.ops)
    assert {o.name for o in m.ops} >= {"multi_head_attention", "feed_forward"}


# -- baselines -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemm_result():
    return benchmark_operation(wia_hw.open_device("wia-npu"), "gemm", _cfg(), **GEMM)


def test_baseline_round_trip_and_keys(tmp_path, gemm_result):
    db = tmp_path / "b.sqlite"
    key = save_baseline(gemm_result, db)
    back = load_baseline_results(db, device="wia-npu")
    assert back.to_dict() == gemm_result.to_dict()
    assert back.format_text() == gemm_result.format_text()
    assert load_baseline_results(db).to_dict() == gemm_result.to_dict()  # the only one
    # a newer baseline of the same key wins; another workload is kept apart
    newer = dataclasses.replace(gemm_result, samples_ms=(1.0, 2.0))
    save_baseline(newer, db)
    other = benchmark_operation(wia_hw.open_device("wia-npu"), "gemm", _cfg(), M=128, N=128, K=128)
    save_baseline(other, db)
    assert load_baseline_results(db, key).samples_ms == (1.0, 2.0)
    assert load_baseline_results(db, other.name).to_dict() == other.to_dict()
    with pytest.raises(BenchmarkError, match=r"holds baselines of 2 workloads .*; name one"):
        load_baseline_results(db)
    with pytest.raises(BenchmarkError, match=r"no baseline for workload 'resnet' \(it holds"):
        load_baseline_results(db, "resnet")
    with pytest.raises(BenchmarkError, match=r"no baseline of .* from wia-hw 0.0.0 \(it holds "):
        load_baseline_results(db, key, tool_version="0.0.0")
    rows = (
        sqlite3.connect(db)
        .execute("SELECT workload, device, spec_hash, tool_version FROM baselines")
        .fetchall()
    )
    assert rows[0] == (key, "wia-npu", spec_hash(wia_hw.load_spec("wia-npu")), wia_hw.__version__)


def test_a_baseline_of_another_device_is_an_error_naming_both(tmp_path, gemm_result):
    db = tmp_path / "b.sqlite"
    save_baseline(gemm_result, db)
    edge = wia_hw.load_spec("wia-edge")
    with pytest.raises(
        BenchmarkError,
        match=(
            rf"measured on device 'wia-npu' \(spec {gemm_result.spec_hash}\), not on "
            rf"'wia-edge' \(spec {spec_hash(edge)}\)"
        ),
    ) as e:
        load_baseline_results(db, device=edge)
    assert "\n" not in str(e.value)
    wrong = dataclasses.replace(gemm_result, device="wia-edge", spec_hash=spec_hash(edge))
    with pytest.raises(BenchmarkError, match=r"the baseline was measured on 'wia-edge'"):
        compare_benchmarks(wrong, gemm_result)


def test_baseline_file_errors(tmp_path, gemm_result):
    with pytest.raises(BenchmarkError, match=r"no baseline file .*missing.sqlite"):
        load_baseline_results(tmp_path / "missing.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite, just some bytes" * 10)
    with pytest.raises(BenchmarkError, match=r"junk.sqlite: not a baseline database"):
        load_baseline_results(junk)
    with pytest.raises(TypeError, match=r"save_baseline takes a BenchmarkResult, got list"):
        save_baseline([1.0], tmp_path / "x.sqlite")


def test_spec_hash_is_stable_and_ignores_metadata():
    a, b = wia_hw.load_spec("wia-npu"), wia_hw.load_spec("wia-npu")
    assert spec_hash(a) == spec_hash(b) == spec_hash(dataclasses.replace(a, name="other"))
    assert spec_hash(a) != spec_hash(wia_hw.load_spec("wia-npu", {"memory.hbm.bandwidth_gbs": 300}))
    assert len(spec_hash(a)) == 16


# -- CLI -----------------------------------------------------------------------------
ARGS = [
    "bench",
    "gemm",
    "-a",
    "M=256",
    "-a",
    "N=256",
    "-a",
    "K=256",
    "-n",
    "6",
    "--warmup",
    "1",
    "--cooldown",
    "0",
]


def test_cli_prints_the_seeds_block_and_gates_on_regressions(tmp_path):
    runner = CliRunner()
    db = tmp_path / "base.sqlite"
    out = runner.invoke(cli, [*ARGS, "--save", str(db)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert "Benchmark Results (6 measurements):" in lines
    assert any(s.startswith("  P99.9: ") for s in lines)
    assert "  Outliers removed: 0" in lines
    same = runner.invoke(cli, [*ARGS, "--compare", str(db)])
    assert same.exit_code == 0, same.output
    assert "  Statistical significance: NO (p=1.0000)" in same.output.splitlines()
    # a baseline 10 % faster than today: a significant regression, exit status 1
    base = load_baseline_results(db)
    fast = tuple(0.9 * x for x in base.samples_ms)
    save_baseline(dataclasses.replace(base, samples_ms=fast, raw_samples_ms=fast), db)
    worse = runner.invoke(cli, [*ARGS, "--compare", str(db)])
    assert worse.exit_code == 1, worse.output
    assert "  Statistical significance: YES (p=0.0000)" in worse.output.splitlines()
    assert "  Speedup: 0.90x (95% CI 0.90x-0.90x)" in worse.output.splitlines()
    js = runner.invoke(cli, [*ARGS, "--compare", str(db), "--json"])
    assert js.exit_code == 1
    doc = json.loads(js.output)
    assert doc["comparison"]["is_regression"] is True
    assert doc["result"]["num_measurements"] == 6


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["-n", "0"], "-n/--iterations must be at least 1, got 0"),
        (["--compare", "nowhere.sqlite"], "no baseline file nowhere.sqlite"),
        (
            ["--vary", "thermal,cosmic"],
            "--vary: unknown source 'cosmic'; modelled: thermal, dram_refresh, arbitration_jitter",
        ),
    ],
)
def test_cli_bad_input_is_one_line(extra, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(cli, [*ARGS, *extra])
    assert out.exit_code == 2
    assert out.output.strip() == f"wia-hw: error: {match}"


# a GEMV whose 64 MiB of weights stream from HBM every iteration
GEMV = {"M": 16, "N": 8192, "K": 4096}


#: the spec's own refresh windows off: the sources alone vary the runs
NO_REFRESH = {"memory.hbm.refresh_interval_ns": 0, "memory.hbm.refresh_cycle_ns": 0}


def _varied(sources, seed=0):
    ctx = wia_hw.open_device("wia-npu", overrides=NO_REFRESH)
    orig = list(ctx.device.memory.channels)
    r = benchmark_operation(
        ctx,
        "gemm",
        _cfg(measurement_iterations=6, variation_sources=sources, variation_seed=seed),
        **GEMV,
    )
    assert ctx.device.memory.channels == orig  # the ports are handed back
    return r


def test_refresh_and_jitter_vary_runs_reproducibly_under_a_seed():
    base = _varied(())
    assert len(set(base.raw_samples_ms)) == 1 and base.variation_cycles == {}
    both = _varied(("dram_refresh", "arbitration_jitter"), seed=3)
    again = _varied(("dram_refresh", "arbitration_jitter"), seed=3)
    other = _varied(("dram_refresh", "arbitration_jitter"), seed=4)
    assert both.raw_samples_ms == again.raw_samples_ms
    assert both.variation_cycles == again.variation_cycles
    assert both.raw_samples_ms != other.raw_samples_ms
    assert len(set(both.raw_samples_ms)) > 1 and both.cv_percent > 0
    # refresh takes tRFC of every tREFI from a channel: a memory-bound run slows by at
    # most about tREFI / (tREFI - tRFC), never speeds up
    refresh = _varied(("dram_refresh",))
    hbm = wia_hw.open_device("wia-npu").spec.memory.hbm  # the timings it draws phases for
    bound = hbm.refresh_interval_ns / (hbm.refresh_interval_ns - hbm.refresh_cycle_ns)
    assert base.mean_ms < refresh.min_ms
    assert refresh.max_ms <= base.mean_ms * bound * 1.01
    assert refresh.variation_cycles["refresh_stall_cycles"] > 0
    jitter = _varied(("arbitration_jitter",))
    assert base.mean_ms <= jitter.min_ms < jitter.max_ms
    assert jitter.variation_cycles == {
        "refresh_stall_cycles": 0,
        "jitter_stall_cycles": jitter.variation_cycles["jitter_stall_cycles"],
    }
    assert jitter.variation_cycles["jitter_stall_cycles"] > 0


def test_cli_vary_turns_sources_on_and_off():
    gemv = [
        "bench",
        "gemm",
        "-a",
        "M=16",
        "-a",
        "N=8192",
        "-a",
        "K=4096",
        "-n",
        "5",
        "--warmup",
        "1",
        "--cooldown",
        "0",
        "--outliers",
        "none",
        "--json",
    ]
    runs = {}
    for vary in ("none", "dram_refresh,arbitration_jitter"):
        out = CliRunner().invoke(cli, [*gemv, "--vary", vary, "--variation-seed", "3"])
        assert out.exit_code == 0, out.output
        runs[vary] = json.loads(out.output)["result"]
    assert len(set(runs["none"]["raw_samples_ms"])) == 1
    varied = runs["dram_refresh,arbitration_jitter"]
    assert varied["config"]["variation_sources"] == ["dram_refresh", "arbitration_jitter"]
    assert min(varied["raw_samples_ms"]) > runs["none"]["mean_ms"]
    assert varied["variation_cycles"]["jitter_stall_cycles"] > 0


def test_remaining_bad_input_messages(tmp_path, gemm_result, monkeypatch):
    with pytest.raises(TypeError, match=r"ctx must be a wia_hw.Context or None, got str"):
        benchmark_operation("wia-npu", "gemm", _cfg())
    with pytest.raises(BenchmarkError, match=r"not a benchmark result record: KeyError"):
        type(gemm_result).from_dict({"name": "x"})
    db = tmp_path / "b.sqlite"
    save_baseline(gemm_result, db)
    with pytest.raises(BenchmarkError, match=r"not to the cluster spec 'wia-cluster-8'"):
        load_baseline_results(db, device="wia-cluster-8")
    with pytest.raises(TypeError, match=r"device must be a spec name or path, a DeviceSpec"):
        load_baseline_results(db, device=3.5)
    ctx = wia_hw.open_device("wia-npu")
    assert load_baseline_results(db, device=ctx).to_dict() == gemm_result.to_dict()
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(BenchmarkError, match=r"empty.sqlite: not a baseline database \(an SQLite"):
        load_baseline_results(empty)  # and it is not given a baselines table
    assert [r[0] for r in sqlite3.connect(empty).execute("SELECT name FROM sqlite_master")] == ["t"]
    import sys

    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy raises ImportError
    with pytest.raises(BenchmarkError, match=r"compare_benchmarks needs scipy: pip install"):
        compare_benchmarks([1.0, 2.0], [1.0, 2.0])


@pytest.mark.parametrize("alpha", ["1.5", "0", "-0.1"])
def test_cli_alpha_outside_0_1_is_refused_without_compare(alpha, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(cli, [*ARGS, "--alpha", alpha])
    assert out.exit_code == 2
    assert out.output.strip() == f"wia-hw: error: --alpha must be in (0, 1), got {float(alpha):g}"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cli_gates_only_on_a_change_above_the_noise_threshold(seed, tmp_path):
    """A baseline a fraction of a percent faster is significant with nearly constant
    samples but not a regression (exit 0); above --noise-threshold it is (exit 1)."""
    rng = np.random.default_rng(seed)
    runner = CliRunner()
    db = tmp_path / "base.sqlite"
    assert runner.invoke(cli, [*ARGS, "--save", str(db)]).exit_code == 0
    base = load_baseline_results(db)
    f = 1 - float(rng.uniform(0.001, 0.009))
    fast = tuple(f * x * (1 + 1e-6 * i) for i, x in enumerate(base.samples_ms))
    save_baseline(dataclasses.replace(base, samples_ms=fast, raw_samples_ms=fast), db)
    out = runner.invoke(cli, [*ARGS, "--compare", str(db)])
    assert out.exit_code == 0, out.output
    assert "Statistical significance: YES" in out.output
    assert "within the 1% noise threshold" in out.output
    strict = runner.invoke(cli, [*ARGS, "--compare", str(db), "--noise-threshold", "0"])
    assert strict.exit_code == 1, strict.output


def _no_measuring(monkeypatch):
    """Make measuring fail loudly: a store error must come before it."""
    import wia_hw.cli._bench as bench_cli

    def boom(*a, **k):
        raise AssertionError("measured before checking the store")

    monkeypatch.setattr(bench_cli, "benchmark_operation", boom)


def _sqlite_with_other_table(path):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (x TEXT)")
    con.commit()
    con.close()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (None, r"--save nodir/b.sqlite: no folder nodir"),
        (
            lambda p: p.write_text("not sqlite " * 200),
            r"--save b.sqlite: not a baseline database \(file is not a database\)",
        ),
        (
            _sqlite_with_other_table,
            r"--save b.sqlite: not a baseline database \(an SQLite file with no baselines",
        ),
    ],
)
def test_cli_save_store_is_checked_before_measuring(make, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _no_measuring(monkeypatch)
    where = "nodir/b.sqlite" if make is None else "b.sqlite"
    if make is not None:
        make(tmp_path / where)
    out = CliRunner().invoke(cli, [*ARGS, "--save", where])
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and re.search(match, lines[0]), out.output


def test_cli_compare_store_is_checked_before_measuring(tmp_path, monkeypatch, gemm_result):
    monkeypatch.chdir(tmp_path)
    save_baseline(gemm_result, "other.sqlite", workload="resnet")
    (tmp_path / "junk.sqlite").write_text("not sqlite " * 200)
    sqlite3.connect(tmp_path / "empty.sqlite").close()
    _no_measuring(monkeypatch)
    for store, match in [
        (
            "other.sqlite",
            r"other.sqlite: no baseline for workload 'gemm\(.*\)' \(it holds resnet\)",
        ),
        ("junk.sqlite", r"junk.sqlite: not a baseline database"),
        ("empty.sqlite", r"empty.sqlite: holds no baseline"),
    ]:
        out = CliRunner().invoke(cli, [*ARGS, "--compare", store])
        assert out.exit_code == 2, out.output
        lines = out.output.strip().splitlines()
        assert len(lines) == 1 and re.search(match, lines[0]), out.output


def test_cli_save_into_a_baseline_store_still_appends(tmp_path):
    db = tmp_path / "b.sqlite"
    for _ in range(2):
        assert CliRunner().invoke(cli, [*ARGS, "--save", str(db)]).exit_code == 0
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM baselines").fetchone()[0] == 2
    con.close()


def test_cli_progress_counts_iterations_on_a_terminal(monkeypatch):
    import io

    from rich.console import Console

    import wia_hw.cli._common as common

    buf = io.StringIO()
    monkeypatch.setattr(common, "PROGRESS_DELAY", 0)
    monkeypatch.setattr(
        common, "progress_console", lambda: Console(file=buf, force_terminal=True, width=150)
    )
    plain = CliRunner().invoke(cli, ARGS)
    assert plain.exit_code == 0
    shown = buf.getvalue()
    assert "benchmarking" in shown and "7/7 iterations" in shown


def test_compare_never_writes_to_the_file_it_reads(tmp_path, monkeypatch, gemm_result):
    """``--compare FILE`` only reads FILE: a sweep store given by mistake is refused in
    one line and left as it was (it gained a baselines table before)."""
    monkeypatch.chdir(tmp_path)
    con = sqlite3.connect(tmp_path / "store.sqlite")
    con.execute("CREATE TABLE points (k TEXT)")
    con.commit()
    con.close()
    before = (tmp_path / "store.sqlite").read_bytes()
    _no_measuring(monkeypatch)
    out = CliRunner().invoke(cli, [*ARGS, "--compare", "store.sqlite"])
    assert out.exit_code == 2, out.output
    assert out.output.strip().splitlines() == [
        "wia-hw: error: store.sqlite: not a baseline database "
        "(an SQLite file with no baselines table)"
    ]
    assert (tmp_path / "store.sqlite").read_bytes() == before
    tables = sqlite3.connect(tmp_path / "store.sqlite").execute("SELECT name FROM sqlite_master")
    assert [r[0] for r in tables] == ["points"]


def test_a_broken_baseline_row_is_one_line_naming_the_file(tmp_path, gemm_result):
    db = tmp_path / "b.sqlite"
    key = save_baseline(gemm_result, db)
    for value, match in [
        ("substr(result_json, 1, 40)", r"b.sqlite: the baseline of .* is not a readable "),
        ('\'{"name": "x"}\'', r"b.sqlite: the baseline of .*: not a benchmark"),
    ]:
        con = sqlite3.connect(db)
        with con:
            con.execute(f"UPDATE baselines SET result_json = {value}")
        con.close()
        with pytest.raises(BenchmarkError, match=match):
            load_baseline_results(db, key)


def test_ctrl_c_is_one_line_and_status_130(monkeypatch):
    """An interrupted command says so in one line and exits 130 (128 + SIGINT), not
    click's "Aborted!" with status 1, which CI reads as bench --compare's regression."""
    import wia_hw.cli._bench as bench_cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_cli, "benchmark_operation", interrupted)
    out = CliRunner().invoke(cli, [*ARGS])
    assert out.exit_code == 130, out.output
    assert out.output.strip().splitlines()[-1] == "wia-hw: interrupted"
