"""Design-space sweeps (issue #14): sweep files, the store, resuming, executors, reports.

The properties that matter: a point's key is the hash of what it computes; a re-run
computes only points missing from the store; a SIGKILLed sweep loses and recomputes
nothing; the local pool and a Dask LocalCluster store byte-identical metrics, equal to
a fresh ``wia_hw.run`` of the same point; every bad input is one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw import SpecError
from wia_hw.cli import cli
from wia_hw.sweep import (
    SweepError,
    best_points,
    load_sweep,
    open_store,
    pareto_front,
    point_key,
)

ROOT = Path(__file__).resolve().parent.parent

SMALL = """\
schema_version: 1
name: small
base: wia-npu
grid:
  compute.array.rows: [16, 32]
  memory.hbm.bandwidth_gbs: [300, 600]
workloads:
  gemm: {M: 256, N: 192, K: 320}
metrics: [latency_ms, throughput, energy_j, utilisation, cycles, bytes.hbm, stall_cycles.memory]
"""


def _write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _raw_metrics(store: Path) -> dict[str, str]:
    """point_key -> the metrics column exactly as stored (text)."""
    with sqlite3.connect(store) as c:
        return dict(c.execute("SELECT point_key, metrics FROM points"))


# -- the sweep file -------------------------------------------------------------------


def test_grid_points_and_keys(tmp_path):
    sw = load_sweep(_write(tmp_path, SMALL))
    pts = sw.points()
    assert len(pts) == 2 * 2  # rows x bandwidth, one workload
    assert {
        (p.params["compute.array.rows"], p.params["memory.hbm.bandwidth_gbs"]) for p in pts
    } == {
        (16, 300),
        (16, 600),
        (32, 300),
        (32, 600),
    }
    p = pts[0]
    assert p.workload == "gemm(K=320, M=256, N=192)"
    doc = {
        "params": p.params,
        "workload": {"name": "gemm", "args": {"M": 256, "N": 192, "K": 320}},
        "metrics": list(sw.metrics),
        "base": sw.base_hash,
        "version": wia_hw.__version__,
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    assert p.key == hashlib.sha256(text.encode()).hexdigest()
    assert p.key == point_key(
        p.params, "gemm", {"M": 256, "N": 192, "K": 320}, sw.metrics, sw.base_hash
    )
    # anything that changes what is computed changes the key
    assert p.key != point_key(
        p.params, "gemm", {"M": 256, "N": 192, "K": 321}, sw.metrics, sw.base_hash
    )
    assert p.key != point_key(
        p.params, "gemm", {"M": 256, "N": 192, "K": 320}, sw.metrics[:-1], sw.base_hash
    )
    assert p.key != point_key(
        p.params, "gemm", {"M": 256, "N": 192, "K": 320}, sw.metrics, "0" * 64
    )


def test_random_and_latin_hypercube_are_seeded_and_in_range(tmp_path):
    text = """\
schema_version: 1
base: wia-npu
{kind}:
  n: 12
  seed: 3
  parameters:
    compute.array.rows: [16, 32, 64]
    clock_ghz: {{low: 0.5, high: 1.5}}
    memory.hbm.channels: {{low: 4, high: 16}}
workloads: {{gemm: {{M: 64, N: 64, K: 64}}}}
"""
    for kind in ("random", "latin_hypercube"):
        a = load_sweep(_write(tmp_path, text.format(kind=kind)))
        b = load_sweep(_write(tmp_path, text.format(kind=kind), "again.yaml"))
        assert [p.params for p in a.points()] == [p.params for p in b.points()]
        sets = a.param_sets
        assert len(sets) == 12
        for s in sets:
            assert s["compute.array.rows"] in (16, 32, 64)
            assert 0.5 <= s["clock_ghz"] < 1.5 and isinstance(s["clock_ghz"], float)
            assert 4 <= s["memory.hbm.channels"] <= 16 and isinstance(s["memory.hbm.channels"], int)
    # Latin hypercube: each of the n equal strata of a range holds exactly one sample
    strata = sorted(int((s["clock_ghz"] - 0.5) / 1.0 * 12) for s in sets)
    assert strata == list(range(12))
    seed4 = load_sweep(_write(tmp_path, text.format(kind="random").replace("seed: 3", "seed: 4")))
    assert [p.params for p in seed4.points()] != [p.params for p in a.points()] or kind != "random"


def test_constraint_filters_parameter_sets(tmp_path):
    text = SMALL.replace(
        "metrics:", 'constraint: "rows * compute_array_cols <= 16 * 128 and 1"\nmetrics:'
    )
    with pytest.raises(SpecError, match=r"sweep\.yaml:\d+: constraint: "):
        load_sweep(_write(tmp_path, text))  # `and` is not in the expression language
    text = SMALL.replace(
        "metrics:", 'constraint: "rows * compute_array_cols <= 16 * 128"\nmetrics:'
    )
    sw = load_sweep(_write(tmp_path, text))
    assert sw.filtered == 2  # rows 32 x cols 128 > 2048, at both bandwidths
    assert {p.params["compute.array.rows"] for p in sw.points()} == {16}
    chain = SMALL.replace(
        "metrics:", 'constraint: ["200 < memory_hbm_bandwidth_gbs < 500"]\nmetrics:'
    )
    assert {
        p.params["memory.hbm.bandwidth_gbs"] for p in load_sweep(_write(tmp_path, chain)).points()
    } == {300}


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("old", "new", "needle", "match"),
    [
        (
            "compute.array.rows:",
            "compute.array.rowz:",
            "rowz",
            r"unknown parameter path 'compute\.array\.rowz': no field 'rowz' in compute\.array \(known: rows, cols",
        ),
        (
            "compute.array.rows:",
            "compute.array:",
            "compute.array:",
            r"names a section, not a value",
        ),
        (
            "compute.array.rows:",
            "energy.pj_per_mac.fp8:",
            "fp8",
            r"no key 'fp8' in energy\.pj_per_mac",
        ),
        ("bytes.hbm", "bytes.dram", "metrics:", r"unknown metric 'bytes\.dram'"),
        ("gemm:", "gemmm:", "gemmm", r"workload 'gemmm': unknown workload"),
        (
            "{M: 256, N: 192, K: 320}",
            "{M: 256, N: 192, K: 320, Q: 1}",
            "gemm:",
            r"workload 'gemm': .*Q",
        ),
        (
            "schema_version: 1",
            "schema_version: 2",
            "schema_version",
            r"schema_version must be 1, got 2",
        ),
        ("base: wia-npu", "base: wia-nope", "base:", r"unknown base spec 'wia-nope'"),
        ("grid:", "grids:", "grids:", r"unknown key 'grids'"),
        ("[16, 32]", "[]", "compute.array.rows", r"empty list of values"),
        (
            "[16, 32]",
            "[16, .nan]",
            "compute.array.rows",
            r"values of 'compute\.array\.rows' must be finite numbers",
        ),
        (
            "metrics:",
            'constraint: "__import__(1) < 2"\nmetrics:',
            "constraint",
            r"constraint: .*not allowed",
        ),
        (
            "metrics:",
            'constraint: "rows < nope"\nmetrics:',
            "constraint",
            r"constraint: unknown name 'nope'",
        ),
        ("metrics:", 'constraint: "rows + 1"\nmetrics:', "constraint", r"compares nothing"),
    ],
)
def test_bad_sweep_file_is_one_line_naming_file_and_line(tmp_path, old, new, needle, match):
    assert old in SMALL
    p = _write(tmp_path, SMALL.replace(old, new, 1))
    with pytest.raises(SpecError, match=match) as e:
        load_sweep(p)
    assert str(e.value).startswith(f"{p}:{_line_of(p, needle)}: ")
    assert "\n" not in str(e.value)


def test_cli_bad_sweep_file_exits_2_with_one_line(tmp_path):
    p = _write(tmp_path, SMALL.replace("compute.array.rows:", "compute.array.rowz:"))
    res = CliRunner().invoke(cli, ["sweep", str(p), "--store", str(tmp_path / "s.sqlite")])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines() if hasattr(res, "stderr") else res.output.splitlines()
    assert len(lines) == 1 and "unknown parameter path 'compute.array.rowz'" in lines[0]
    assert lines[0].startswith(f"wia-hw: error: {p}:{_line_of(p, 'rowz')}: ")


# -- running, the store, resuming ------------------------------------------------------


def test_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    p = _write(tmp_path, SMALL.replace("[16, 32]", "[16, -8, 32.5]"))
    store = tmp_path / "s.sqlite"
    s = wia_hw.sweep(p, store=store, workers=1)
    assert (s.points, s.computed, s.ok, s.failed) == (6, 6, 2, 4)
    rows = open_store(store).points()
    bad = [r for r in rows if r["status"] == "failed"]
    assert {r["params"]["compute.array.rows"] for r in bad} == {-8, 32.5}
    for r in bad:
        assert r["metrics"] is None
        assert r["error"].startswith("override: compute.array.rows: ") and "\n" not in r["error"]
    assert all(r["status"] == "ok" and r["error"] is None for r in rows if r not in bad)
    # failed points are finished: a re-run skips them, retry_failed computes them again
    assert wia_hw.sweep(p, store=store, workers=1).computed == 0
    assert wia_hw.sweep(p, store=store, workers=1, retry_failed=True).computed == 4


def test_rerun_skips_and_a_changed_file_computes_only_new_points(tmp_path):
    p = _write(tmp_path, SMALL)
    store = tmp_path / "s.sqlite"
    first = wia_hw.sweep(p, store=store, workers=1)
    assert (first.computed, first.skipped) == (4, 0)
    before = open_store(store).points()
    again = wia_hw.sweep(p, store=store, workers=1)
    assert (again.computed, again.skipped) == (0, 4)
    _write(tmp_path, SMALL.replace("[16, 32]", "[16, 32, 64]"))
    grown = wia_hw.sweep(p, store=store, workers=1)
    assert (grown.points, grown.computed, grown.skipped) == (6, 2, 4)
    after = {r["point_key"]: r for r in open_store(store).points()}
    assert len(after) == 6
    for r in before:  # untouched, not recomputed
        assert after[r["point_key"]] == r
    st = open_store(store)
    assert st.meta["format"] == "wia-hw-sweep/1"
    assert json.loads(st.meta["sweep:small"])["points"] == 6
    with sqlite3.connect(store) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_local_pool_and_dask_local_cluster_store_identical_metrics(tmp_path):
    distributed = pytest.importorskip("distributed")
    p = _write(tmp_path, SMALL)
    local, remote, client_store = (tmp_path / n for n in ("l.sqlite", "d.sqlite", "c.sqlite"))
    wia_hw.sweep(p, executor="local", store=local, workers=2)
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        address = cluster.scheduler_address.removeprefix("tcp://")
        s = wia_hw.sweep(p, executor=f"dask://{address}", store=remote)
        assert s.computed == 4 and s.executor == f"dask://{address}"
        with distributed.Client(cluster) as client:
            assert wia_hw.sweep(p, executor=client, store=client_store).computed == 4
    a, b, c = _raw_metrics(local), _raw_metrics(remote), _raw_metrics(client_store)
    assert len(a) == 4 and a == b == c  # byte for byte
    # and equal to a fresh run of the same point (worker caches change nothing)
    sw = load_sweep(p)
    pt = sw.points()[-1]
    r = wia_hw.run("gemm", M=256, N=192, K=320, overrides=pt.params)
    got = json.loads(a[pt.key])
    assert got["latency_ms"] == r.latency_ms and got["cycles"] == r.cycles
    assert got["energy_j"] == r.energy_j and got["utilisation"] == r.compute_utilization
    assert got["bytes.hbm"] == r.counters.bytes["hbm"]
    assert got["stall_cycles.memory"] == r.counters.stall_cycles["memory"]


def _rows(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        with sqlite3.connect(store, timeout=1) as c:
            return c.execute("SELECT COUNT(*) FROM points").fetchone()[0]
    except sqlite3.OperationalError:
        return 0  # tables not made yet


def test_sigkill_mid_sweep_then_restart_loses_and_recomputes_nothing(tmp_path):
    """A real ``wia-hw sweep`` process is SIGKILLed once k > 0 points are stored;
    the restart computes exactly total - k and leaves the k rows untouched."""
    text = """\
schema_version: 1
name: kill
base: wia-edge
grid:
  memory.hbm.bandwidth_gbs: [40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150]
  compute.array.rows: [8, 16]
workloads:
  bert-base: {batch: 1, seq: 32, layers: 2}
metrics: [latency_ms, energy_j]
"""
    p = _write(tmp_path, text)
    total = 24
    store = tmp_path / "kill.sqlite"
    cmd = [sys.executable, "-m", "wia_hw.cli", "sweep", str(p), "--store", str(store)]
    cmd += ["--workers", "1", "--no-progress", "--json"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while _rows(store) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the pool's orphaned workers
        except ProcessLookupError:
            pass
    assert proc.returncode == -signal.SIGKILL
    k = _rows(store)
    assert 0 < k < total, f"killed with {k} of {total} points stored; make points slower"
    before = {r["point_key"]: r for r in open_store(store).points()}
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["points"] == total
    assert summary["skipped"] == k and summary["computed"] == total - k
    after = {r["point_key"]: r for r in open_store(store).points()}
    assert len(after) == total and all(r["status"] == "ok" for r in after.values())
    for key, r in before.items():
        assert after[key] == r  # same finished_at: not recomputed


# -- bad stores and executors -----------------------------------------------------------


def test_a_file_that_is_not_a_store_is_refused_in_one_line(tmp_path):
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n" * 100)
    with pytest.raises(
        SweepError, match=r"notes\.sqlite: not a sweep store \(file is not a database\)"
    ):
        open_store(text)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t(x)")
    with pytest.raises(
        SweepError, match=r"other\.sqlite: not a sweep store \(no meta/points tables"
    ):
        open_store(other)
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
        c.execute("CREATE TABLE points(point_key TEXT PRIMARY KEY)")
        c.execute("INSERT INTO meta VALUES ('format', 'something/9')")
    with pytest.raises(SweepError, match=r"format 'something/9', expected 'wia-hw-sweep/1'"):
        open_store(other)
    with pytest.raises(SweepError, match=r"missing\.sqlite: no such sweep store"):
        open_store(tmp_path / "missing.sqlite")
    data = text.read_bytes()
    with pytest.raises(SweepError, match="not a sweep store"):
        wia_hw.sweep(_write(tmp_path, SMALL), store=text, workers=1)
    assert text.read_bytes() == data  # never overwritten
    res = CliRunner().invoke(cli, ["sweep-report", str(text)])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "not a sweep store" in res.output


def test_unreachable_scheduler_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    import wia_hw.sweep._run as run_mod

    monkeypatch.setattr(run_mod, "CONNECT_TIMEOUT_S", 1.0)
    p = _write(tmp_path, SMALL)
    with pytest.raises(
        SweepError, match=r"^cannot reach the Dask scheduler at dask://127\.0\.0\.1:9 within 1 s \("
    ) as e:
        wia_hw.sweep(p, executor="dask://127.0.0.1:9", store=tmp_path / "s.sqlite")
    assert "\n" not in str(e.value)
    res = CliRunner().invoke(
        cli, ["sweep", str(p), "--scheduler", "127.0.0.1:9", "--store", str(tmp_path / "s.sqlite")]
    )
    assert res.exit_code == 2 and "cannot reach the Dask scheduler" in res.output
    assert res.output.strip().count("\n") == 0
    with pytest.raises(
        SweepError, match=r"executor must be 'local' or 'dask://HOST:PORT', got 'ray'"
    ):
        wia_hw.sweep(p, executor="ray", store=tmp_path / "s.sqlite")
    with pytest.raises(SweepError, match=r"workers must be a positive integer, got 0"):
        wia_hw.sweep(p, store=tmp_path / "s.sqlite", workers=0)


# -- reports ---------------------------------------------------------------------------


def _row(key, lat, en, wl="w", status="ok", **extra):
    return {
        "point_key": key,
        "workload": wl,
        "status": status,
        "params": {},
        "metrics": None if status != "ok" else {"latency_ms": lat, "energy_j": en, **extra},
    }


def test_pareto_front_and_best_points():
    rows = [
        _row("a", 1.0, 9.0, throughput=5),
        _row("b", 2.0, 4.0, throughput=9),
        _row("c", 3.0, 4.0, throughput=1),  # dominated by b (same energy, slower)
        _row("d", 4.0, 1.0, throughput=2),
        _row("e", 5.0, 5.0, throughput=3),  # dominated by b
        _row("f", 0.1, 0.1, status="failed"),  # failed rows never count
        _row("g", 9.0, 0.5, wl="other"),  # another workload: its own front
    ]
    fronts = pareto_front(rows)
    assert [r["point_key"] for r in fronts["w"]] == ["a", "b", "d"]
    assert [r["point_key"] for r in fronts["other"]] == ["g"]
    best = best_points(rows)["w"]
    assert best["latency_ms"]["point_key"] == "a"
    assert best["energy_j"]["point_key"] == "d"
    assert best["throughput"]["point_key"] == "b"  # larger is better


def test_sweep_report_cli_writes_png_csv_and_says_parquet_is_skipped(tmp_path):
    p = _write(tmp_path, SMALL.replace("[16, 32]", "[16, -8]"))
    store = tmp_path / "s.sqlite"
    wia_hw.sweep(p, store=store, workers=1)
    png, csv_path, pq = tmp_path / "p.png", tmp_path / "p.csv", tmp_path / "p.parquet"
    res = CliRunner().invoke(
        cli,
        [
            "sweep-report",
            str(store),
            "--png",
            str(png),
            "--csv",
            str(csv_path),
            "--parquet",
            str(pq),
        ],
    )
    assert res.exit_code == 0, res.output
    assert f"{store}: 4 points (2 ok, 2 failed)" in res.output
    assert "Pareto front (latency_ms vs energy_j): gemm(K=320, M=256, N=192)" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = csv_path.read_text().splitlines()
    assert len(lines) == 1 + 4 and "metric:latency_ms" in lines[0]
    try:
        import pyarrow  # noqa: F401

        assert pq.exists()
    except ImportError:
        assert f"parquet export skipped ({pq}): pyarrow is not installed" in res.output
        assert not pq.exists()


def test_sweep_report_without_energy_skips_the_plot_and_keeps_the_rest(tmp_path):
    p = _write(tmp_path, SMALL.replace(", energy_j", ""))
    store = tmp_path / "s.sqlite"
    wia_hw.sweep(p, store=store, workers=1)
    png, csv_path = tmp_path / "p.png", tmp_path / "p.csv"
    args = ["sweep-report", str(store), "--png", str(png), "--csv", str(csv_path)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "best points: gemm" in res.output  # the tables, then the CSV
    assert "and no point has energy_j (add it to the sweep's metrics)" in res.output
    assert not png.exists() and csv_path.exists()
    # explicit objectives: points without one are left out, not a KeyError
    rows = [_row("a", 1.0, 2.0), {**_row("b", 0.5, 0.0), "metrics": {"latency_ms": 0.5}}]
    assert [r["point_key"] for r in pareto_front(rows, ("latency_ms", "energy_j"))["w"]] == ["a"]


@pytest.mark.parametrize(
    "option, name, says",
    [
        ("--png", "p.txt", "unknown kind '.txt': the Pareto plot is drawn as .png, .svg or .pdf"),
        ("--csv", "p.xlsx", "unknown kind '.xlsx': the points are CSV text: .csv or .txt"),
        ("--parquet", "p.csv", "unknown kind '.csv': the points are Parquet: .parquet"),
    ],
)
def test_sweep_report_output_kinds_follow_the_suffix(tmp_path, option, name, says):
    store = tmp_path / "s.sqlite"
    wia_hw.sweep(_write(tmp_path, SMALL), store=store, workers=1)
    res = CliRunner().invoke(cli, ["sweep-report", str(store), option, str(tmp_path / name)])
    assert res.exit_code == 2
    assert res.output.strip() == f"wia-hw: error: {option} {tmp_path / name}: {says}"
    assert not (tmp_path / name).exists()


def test_example_sweep_files_load():
    for f in sorted((ROOT / "examples" / "sweeps").glob("*.yaml")):
        assert load_sweep(f).points()


def test_cli_sweep_with_progress_bar_and_summary_line(tmp_path, monkeypatch):
    import rich.console

    # the bar is drawn on a terminal only: make stderr one
    monkeypatch.setattr(rich.console.Console, "is_terminal", property(lambda s: True))
    p = _write(tmp_path, SMALL)
    store = tmp_path / "s.sqlite"
    res = CliRunner().invoke(cli, ["sweep", str(p), "--store", str(store), "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert "points" in res.output and "ETA" in res.output  # the bar (on stderr)
    assert "sweep small: 4 points, 0 already stored, 4 computed (4 ok, 0 failed)" in res.output
    assert f"on local pool (2 workers) -> {store}" in res.output
    res = CliRunner().invoke(cli, ["sweep", str(p), "--store", str(store), "--json"])
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert (summary["points"], summary["skipped"], summary["computed"]) == (4, 4, 0)


def test_inline_base_mapping_and_workload_list(tmp_path):
    import yaml

    from wia_hw.spec import spec_path

    base = yaml.safe_load(spec_path("wia-edge").read_text())
    sw = load_sweep(
        {
            "schema_version": 1,
            "base": base,
            "grid": {"clock_ghz": [0.5, 1.0]},
            "workloads": [
                {"gemm": {"M": 64, "N": 64, "K": 64}},
                {"gemm": {"M": 128, "N": 64, "K": 64}},
            ],
        }
    )
    pts = sw.points()
    assert len(pts) == 4 and len({p.key for p in pts}) == 4
    assert sw.metrics == ("latency_ms", "throughput", "energy_j", "utilisation")
    s = wia_hw.sweep(sw, store=tmp_path / "s.sqlite", workers=1)
    assert s.ok == 4
    rows = open_store(tmp_path / "s.sqlite").points()
    by = {(r["workload"], r["params"]["clock_ghz"]): r["metrics"]["latency_ms"] for r in rows}
    # each equals a fresh run of the built-in spec with the same override
    for clock in (0.5, 1.0):
        r = wia_hw.run("gemm", M=64, N=64, K=64, device="wia-edge", overrides={"clock_ghz": clock})
        assert by[("gemm(K=64, M=64, N=64)", clock)] == r.latency_ms
