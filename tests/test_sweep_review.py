"""Sweeps, sweep reports, compare/export and run --replay on the inputs a review found
broken: changed definitions, stores shared between sweeps, huge grids, hostile names,
corrupted reports, interrupts and worker crashes. Random inputs use fixed seeds."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw.cli import cli
from wia_hw.sweep import SweepError, best_points, open_store, pareto_front

GEMM = {"gemm": {"M": 128, "N": 96, "K": 160}}


def _sweep_doc(name: str, rows: list[int], **extra: object) -> dict:
    doc = {
        "schema_version": 1,
        "name": name,
        "base": "wia-npu",
        "grid": {"compute.array.rows": rows},
        "workloads": GEMM,
        "metrics": ["latency_ms", "energy_j"],
    }
    doc.update(extra)
    return doc


def _one_line_exit_2(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    return lines[0]


# -- 1, 2: definitions and membership ------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_a_changed_definition_supersedes_its_rows_without_losing_them(tmp_path, seed):
    rnd = random.Random(seed)
    rows = sorted(rnd.sample([8, 16, 24, 32, 48, 64, 96, 128], 3))
    store = tmp_path / "s.sqlite"
    old = _sweep_doc("s", rows)
    wia_hw.sweep(old, store=store, workers=1)
    change = rnd.choice(["base", "metrics", "workloads"])
    if change == "base":
        new = _sweep_doc("s", rows, base={**_base_mapping(), "clock_ghz": 0.5})
    elif change == "metrics":
        new = _sweep_doc("s", rows, metrics=["latency_ms", "energy_j", "cycles"])
    else:
        new = _sweep_doc("s", rows, workloads={"gemm": {"M": 64, "N": 96, "K": 160}})
    s = wia_hw.sweep(new, store=store, workers=1)
    assert s.computed == len(rows)
    st = open_store(store)
    current = st.points()
    assert len(current) == len(rows) == len(st.points("s"))
    assert st.superseded() == len(rows) == st.superseded("s")
    assert len(st.points(superseded=True)) == 2 * len(rows)  # nothing lost
    keys = {r["point_key"] for r in current}
    for best in best_points(current).values():
        assert all(r["point_key"] in keys for r in best.values())
    for front in pareto_front(current).values():
        params = [json.dumps(r["params"], sort_keys=True) for r in front]
        assert len(params) == len(set(params))
    res = CliRunner().invoke(cli, ["sweep-report", str(store)])
    assert res.exit_code == 0, res.output
    assert f"{len(rows)} points" in res.output
    assert f"{len(rows)} superseded rows" in res.output
    res = CliRunner().invoke(cli, ["sweep-report", str(store), "--superseded"])
    assert f"{2 * len(rows)} points" in res.output


def _base_mapping() -> dict:
    from wia_hw._yaml import read_yaml_mapping
    from wia_hw.spec import spec_path

    data, _ = read_yaml_mapping(spec_path("wia-npu"), "wia-npu", "a spec")
    return data


@pytest.mark.parametrize("seed", [3, 4])
def test_a_sweep_report_holds_every_point_of_its_definition(tmp_path, seed):
    rnd = random.Random(seed)
    pool = [8, 16, 24, 32, 48, 64, 96, 128]
    a = rnd.sample(pool, 3)
    b = rnd.sample(a, 1) + rnd.sample([v for v in pool if v not in a], 2)
    store = tmp_path / "s.sqlite"
    wia_hw.sweep(_sweep_doc("a", a), store=store, workers=1)
    s = wia_hw.sweep(_sweep_doc("b", b), store=store, workers=1)
    assert (s.skipped, s.computed) == (1, 2)
    st = open_store(store)
    for name, values in (("a", a), ("b", b)):
        got = sorted(r["params"]["compute.array.rows"] for r in st.points(name))
        assert got == sorted(values)
    assert len(st.points()) == len(set(a) | set(b))
    with pytest.raises(SweepError, match=r"no sweep 'zz' in the store \(known: a, b\)"):
        st.points("zz")
    res = CliRunner().invoke(cli, ["sweep-report", str(store), "--sweep", "b"])
    assert f"{len(b)} points" in res.output
    line = _one_line_exit_2(CliRunner().invoke(cli, ["sweep-report", str(store), "--sweep", "zz"]))
    assert "no sweep 'zz'" in line and "known: a, b" in line


def test_a_store_without_membership_falls_back_to_the_sweep_name(tmp_path):
    store = tmp_path / "s.sqlite"
    wia_hw.sweep(_sweep_doc("a", [16, 32]), store=store, workers=1)
    with sqlite3.connect(store) as c:  # as written before the members table existed
        c.execute("DROP TABLE members")
    assert len(open_store(store).points("a")) == 2


# -- 3: huge grids ---------------------------------------------------------------------


def test_a_grid_above_the_point_limit_is_one_line_and_creates_no_store(tmp_path):
    from wia_hw.sweep._file import MAX_POINTS

    rnd = random.Random(7)
    paths = ["clock_ghz", "compute.array.rows", "compute.array.cols", "compute.cores"]
    paths += ["memory.hbm.bandwidth_gbs", "memory.hbm.channels", "energy.pj_per_mac.fp16"]
    grid = {p: list(range(1, rnd.randint(9, 12))) for p in paths}
    count = 1
    for v in grid.values():
        count *= len(v)
    assert count > MAX_POINTS
    doc = _sweep_doc("big", [1], grid=grid)
    (tmp_path / "big.yaml").write_text(json.dumps(doc))  # JSON is YAML
    store = tmp_path / "s.sqlite"
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "big.yaml"), "--store", str(store)])
    line = _one_line_exit_2(res)
    assert f"{count:,} parameter sets" in line and "compute.array.rows" in line
    assert f"{MAX_POINTS:,}" in line and not store.exists()
    doc = _sweep_doc("big", [1])
    del doc["grid"]
    doc["random"] = {"n": 10**11, "seed": 1, "parameters": {"clock_ghz": {"low": 1, "high": 2}}}
    (tmp_path / "rnd.yaml").write_text(json.dumps(doc))
    line = _one_line_exit_2(CliRunner().invoke(cli, ["sweep", str(tmp_path / "rnd.yaml")]))
    assert "random.n: 100,000,000,000 samples" in line


def test_the_constraint_env_is_the_spec_with_the_parameters_applied():
    import copy

    from wia_hw.sweep._file import _flat, _set_path, constraint_env

    base = _base_mapping()
    rnd = random.Random(11)
    paths = ["clock_ghz", "compute.array.rows", "memory.hbm.bandwidth_gbs", "energy.pj_per_mac"]
    paths += ["energy.pj_per_mac.fp16", "thermal.initial_c", "compute.array.dataflow"]
    for _ in range(200):
        params = {}
        for p in rnd.sample(paths, rnd.randint(1, 3)):
            if any(p.startswith(o + ".") or o.startswith(p + ".") for o in params):
                continue  # one path inside another is refused by load_sweep
            params[p] = rnd.choice(
                [rnd.randint(1, 512), rnd.uniform(0.1, 9.0), "ws", {"fp16": 2.0, "int8": 1}]
            )
        data = copy.deepcopy(base)
        for p, v in params.items():
            _set_path(data, p, v)
        want = _flat(data)
        leaves = [p.rsplit(".", 1)[-1] for p in params]
        for p, v in params.items():
            leaf = p.rsplit(".", 1)[-1]
            if leaves.count(leaf) == 1 and isinstance(v, (int, float)):
                want.setdefault(leaf, v)
        assert constraint_env(base, params) == want, params


def test_no_constraint_means_no_constraint_env(tmp_path, monkeypatch):
    from wia_hw.sweep import _file

    calls = []
    real = _file._EnvMaker.__call__
    monkeypatch.setattr(_file._EnvMaker, "__call__", lambda s, p: calls.append(1) or real(s, p))
    sw = _file.load_sweep(_sweep_doc("n", list(range(1, 3001))))
    assert len(sw.param_sets) == 3000 and len(calls) <= 1
    seen = []
    sw = _file.load_sweep(
        _sweep_doc("n", list(range(1, 3001)), constraint="rows <= 1500"),
        progress=lambda stage, done, total: seen.append((done, total)),
    )
    assert len(sw.param_sets) == 1500 and seen[-1] == (3000, 3000)
    doc = _sweep_doc("n", [1])
    doc["grid"] = {"energy.pj_per_mac": [{"fp16": 1.0}], "energy.pj_per_mac.fp16": [2.0]}
    with pytest.raises(wia_hw.SpecError, match="inside the swept parameter 'energy.pj_per_mac'"):
        _file.load_sweep(doc)


# -- 4, 5: hostile text and output folders in sweep-report and compare -----------------

MARKUP = ["[/red]", "[bold]loud", "[link=x]y[/link]", "a[/]b", "[red", "\\[x]"]


def _store_with(tmp_path: Path, names: list[str], status: str = "ok") -> Path:
    from wia_hw.sweep import SweepStore

    path = tmp_path / "m.sqlite"
    with SweepStore.create(path) as st:
        for i, n in enumerate(names):
            ok = status == "ok"
            st.record(
                point_key=f"k{i}",
                sweep_name="m",
                params={"compute.array.dataflow": n},
                workload=f"w{n}",
                metrics={"latency_ms": 1.0 + i, "energy_j": 2.0 - i / 10} if ok else None,
                status=status,
                error=None if ok else f"boom {n}",
                wall_s=0.0,
            )
    return path


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sweep_report_prints_user_text_verbatim(tmp_path, seed):
    rnd = random.Random(seed)
    names = rnd.sample(MARKUP, 3)
    for status in ("ok", "failed"):
        store = _store_with(tmp_path, names, status)
        res = CliRunner().invoke(cli, ["sweep-report", str(store)], terminal_width=400)
        assert res.exit_code == 0, res.output
        for n in names:
            assert f"compute.array.dataflow={n}" in res.output.replace("\n", "")


def test_sweep_report_refuses_a_missing_output_folder_before_printing(tmp_path):
    store = _store_with(tmp_path, ["os"])
    for option, name in (("--csv", "x.csv"), ("--png", "x.png"), ("--parquet", "x.parquet")):
        line = _one_line_exit_2(
            CliRunner().invoke(cli, ["sweep-report", str(store), option, f"{tmp_path}/no/{name}"])
        )
        assert (
            line.startswith(f"wia-hw: error: {option} {tmp_path}/no/{name}") and "no folder" in line
        )


def test_png_of_a_sweep_whose_points_all_failed_says_so(tmp_path):
    store = _store_with(tmp_path, ["os", "ws"], status="failed")
    res = CliRunner().invoke(cli, ["sweep-report", str(store), "--png", str(tmp_path / "p.png")])
    assert res.exit_code == 0 and "no point succeeded" in res.output
    assert not (tmp_path / "p.png").exists()


@pytest.fixture(scope="module")
def gemm_reports(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemm")
    args = ["gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64"]
    for kind, name in (("run", "r.json"), ("profile", "p.json")):
        res = CliRunner().invoke(cli, [kind, *args, "-o", str(d / name)])
        assert res.exit_code == 0, res.output
    return d / "r.json", d / "p.json"


@pytest.mark.parametrize("seed", [0, 1])
def test_compare_prints_op_and_kernel_names_verbatim(tmp_path, gemm_reports, seed):
    rnd = random.Random(seed)
    d = json.loads(gemm_reports[0].read_text())
    op, kern = rnd.sample(MARKUP, 2)
    d["op_times"][0]["name"] = op
    for k in d["kernels"]:
        k["name"] = kern
    d["provenance"]["overrides"] = {"x": rnd.choice(MARKUP)}
    b = tmp_path / "b.json"
    b.write_text(json.dumps(d))
    res = CliRunner().invoke(cli, ["compare", str(gemm_reports[0]), str(b)], terminal_width=300)
    assert res.exit_code == 0, res.output
    for text in (op, kern, d["provenance"]["overrides"]["x"]):
        assert text in res.output


# -- 6, 7, 14: corrupted reports, other schema versions, compare/export options --------

CORRUPT = [
    ("kernels", None, "kernels"),
    ("op_times", [1, 2], "op_times[0]"),
    ("provenance", "x", "provenance"),
    ("latency_ms", "fast", "latency_ms"),
    ("kernels", [{"name": "k"}], "kernels[0].time_ms"),
    ("counters", [1], "counters"),
    ("kernels", [{"name": 3, "time_ms": 1.0}], "kernels[0].name"),
    ("provenance", {"overrides": [1]}, "provenance.overrides"),
    ("provenance", {"extensions": [{"id": "x", "parameters": 5}]}, "provenance.extensions[0]"),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_corrupted_reports_are_one_line_naming_file_and_field(tmp_path, gemm_reports, seed):
    rnd = random.Random(seed)
    good = gemm_reports[0]
    for key, value, field in rnd.sample(CORRUPT, 4):
        d = json.loads(good.read_text())
        d[key] = value
        bad = tmp_path / f"bad-{key}.json"
        bad.write_text(json.dumps(d))
        commands = [["compare", str(good), str(bad)], ["compare", str(bad), str(good), "--json"]]
        commands += [
            ["export", str(bad), "--csv", "-", "--what", w] for w in ("kernels", "ops", "counters")
        ]
        for args in commands:
            res = CliRunner().invoke(cli, args)
            if key in ("kernels", "op_times", "counters", "latency_ms", "provenance"):
                line = _one_line_exit_2(res)
                assert str(bad) in line and f"field {field}" in line, line
    d = json.loads(gemm_reports[1].read_text())
    d["ops"][0]["end_cycle"] = "late"
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps(d))
    line = _one_line_exit_2(CliRunner().invoke(cli, ["compare", str(good), str(bad)]))
    assert "field ops[0].end_cycle must be a number" in line


@pytest.mark.parametrize("schema", ["wia-hw.run/2", "wia-hw.run/", "wia-hw.profile/0", None])
def test_other_schema_versions_are_refused(tmp_path, gemm_reports, schema):
    d = json.loads(gemm_reports[0].read_text())
    d["schema"] = schema
    other = tmp_path / "v.json"
    other.write_text(json.dumps(d))
    for args in (
        ["compare", str(gemm_reports[0]), str(other)],
        ["export", str(other), "--csv", "-"],
        ["run", "--replay", str(other)],
    ):
        line = _one_line_exit_2(CliRunner().invoke(cli, args))
        assert str(other) in line and repr(schema) in line, line


def test_compare_and_export_options(tmp_path, gemm_reports):
    run, prof = gemm_reports
    for args in (["compare", str(run), str(prof), "--top", "-1"], ["run", "gemm", "--top", "-1"]):
        res = CliRunner().invoke(cli, args)  # click's usage error: exit 2, no traceback
        assert res.exit_code == 2 and "Invalid value for '--top'" in res.output
    out = tmp_path / "a.csv"
    line = _one_line_exit_2(
        CliRunner().invoke(cli, ["export", str(run), "--csv", str(out), "--csv", str(out)])
    )
    assert "the same file" in line and not out.exists()
    res = CliRunner().invoke(cli, ["compare", str(run), str(prof), "--json"])
    made = json.loads(res.stdout)["made_with"]
    for k in ("workload", "batch", "seq", "mode", "precision"):
        assert k not in made


# -- 8, 9: run --replay of a binary file, and options a replay does not take -----------


def test_replay_of_a_binary_file_is_one_line(tmp_path):
    rnd = random.Random(5)
    for i, head in enumerate([b"SQLite format 3\x00", b"\xff\xfe", b'{"a": \xc3']):
        f = tmp_path / f"b{i}.bin"
        f.write_bytes(head + bytes(rnd.randrange(256) for _ in range(200)))
        line = _one_line_exit_2(CliRunner().invoke(cli, ["run", "--replay", str(f)]))
        assert str(f) in line


@pytest.mark.parametrize("seed", [0, 1])
def test_replay_refuses_the_options_the_report_records(gemm_reports, seed):
    rnd = random.Random(seed)
    options = [
        ["--device", "tpu-v1"],
        ["-b", "4"],
        ["-s", "8"],
        ["--precision", "int8"],
        ["--seed", "3"],
        ["--mode", "functional"],
        ["-a", "M=8"],
        ["--set", "clock_ghz=2"],
        ["--kv-len", "4"],
    ]
    chosen = rnd.sample(options, 2)
    args = ["run", "--replay", str(gemm_reports[0])] + [x for o in chosen for x in o]
    line = _one_line_exit_2(CliRunner().invoke(cli, args))
    assert line.startswith("wia-hw: error: --replay takes no ")
    res = CliRunner().invoke(cli, ["run", "--replay", str(gemm_reports[0]), "--json"])
    assert res.exit_code == 0


# -- 11, 13, 14: equal numbers, a constraint that cannot be evaluated, the scheduler -----


@pytest.mark.parametrize("seed", [0, 1])
def test_numerically_equal_values_are_one_point(tmp_path, seed):
    rnd = random.Random(seed)
    ints = rnd.sample([16, 32, 64, 128], 3)
    values = ints + [float(v) for v in rnd.sample(ints, 2)]
    rnd.shuffle(values)
    sw = wia_hw.sweep.load_sweep(_sweep_doc("eq", values))
    assert len(sw.points()) == len(ints)
    s = wia_hw.sweep(_sweep_doc("eq", values), store=tmp_path / "s.sqlite", workers=1)
    assert (s.points, s.computed) == (len(ints), len(ints))
    # booleans are not numbers here, and 0.5 stays 0.5
    doc = _sweep_doc("eq", [1])
    doc["grid"] = {"compute.array.pipelined": [True, 1, 1.0], "clock_ghz": [0.5]}
    assert len(wia_hw.sweep.load_sweep(doc).points()) == 2


@pytest.mark.parametrize("seed", [0, 1])
def test_a_constraint_that_cannot_be_evaluated_fails_that_point_only(tmp_path, seed):
    rnd = random.Random(seed)
    rows = rnd.sample([8, 16, 32, 64, 256], 3) + [0]
    rnd.shuffle(rows)
    doc = _sweep_doc("c", rows, constraint="128 / rows >= 0.5")
    store = tmp_path / "s.sqlite"
    s = wia_hw.sweep(doc, store=store, workers=1)
    keep = [r for r in rows if r and 128 / r >= 0.5]
    assert (s.points, s.failed, s.ok) == (len(keep) + 1, 1, len(keep))
    (bad,) = [r for r in open_store(store).points() if r["status"] == "failed"]
    assert bad["params"] == {"compute.array.rows": 0}
    assert "division by zero" in bad["error"] and "128 / rows" in bad["error"]
    assert wia_hw.sweep(doc, store=store, workers=1).computed == 0


def test_an_unreachable_scheduler_leaves_no_store(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    import wia_hw.sweep._run as run_mod

    monkeypatch.setattr(run_mod, "CONNECT_TIMEOUT_S", 0.5)
    store = tmp_path / "s.sqlite"
    with pytest.raises(SweepError, match="cannot reach the Dask scheduler"):
        wia_hw.sweep(_sweep_doc("d", [16]), executor="dask://127.0.0.1:9", store=store)
    assert not store.exists()


# -- 10, 12: Ctrl-C and a worker that dies ---------------------------------------------


def test_ctrl_c_stores_what_finished_and_exits_130(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    rnd = random.Random(2)
    rows = sorted(rnd.sample(range(16, 257, 16), 8))
    doc = _sweep_doc("slow", rows, workloads={"gemm": {"M": 1024, "N": 1024, "K": 2048}})
    (tmp_path / "s.yaml").write_text(json.dumps(doc))
    store = tmp_path / "s.sqlite"
    wia = Path(sys.executable).parent / "wia-hw"
    p = subprocess.Popen(
        [str(wia), "sweep", "s.yaml", "--store", str(store), "--workers", "2", "--no-progress"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's job
    )

    def stored() -> int:
        try:
            with sqlite3.connect(store) as c:
                return c.execute("SELECT COUNT(*) FROM points").fetchone()[0]
        except sqlite3.Error:
            return 0

    deadline = time.monotonic() + 120
    while stored() < 1 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the whole group
    t0 = time.monotonic()
    _, err = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 10  # the running points are not waited for
    if stored() == len(rows):
        pytest.skip("the sweep finished before the interrupt")
    assert p.returncode == 130, err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and line.startswith("wia-hw: interrupted: ")
    n = stored()
    assert n >= 1 and f"{n} of the sweep's {len(rows)} points" in line
    again = wia_hw.sweep(doc, store=store, workers=1)
    assert again.skipped == n


def test_a_worker_that_dies_is_one_line_and_keeps_the_stored_points(tmp_path):
    import subprocess
    import sys

    store = tmp_path / "t.sqlite"
    wia_hw.sweep(_sweep_doc("t", [16]), store=store, workers=1)
    script = tmp_path / "t.py"  # a thread and no __main__ guard: forkserver workers die
    script.write_text(
        "import threading, wia_hw\n"
        "ev = threading.Event()\n"
        "threading.Thread(target=ev.wait, daemon=True).start()\n"
        f"wia_hw.sweep({_sweep_doc('t', [16, 32, 64])!r}, store='t.sqlite', workers=2)\n"
        "ev.set()\n"
    )
    r = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0
    (last,) = [x for x in r.stderr.splitlines() if x.startswith("wia_hw.sweep._store.SweepError")]
    assert "SweepError: a local worker process died" in last
    assert "forkserver" in last and "if __name__ == '__main__':" in last
    assert len(open_store(store).points()) == 1  # the point stored before is kept


# -- stores written before point keys were canonical -----------------------------------


def _old_keys(monkeypatch):
    """wia-hw before be3cce0: point keys of the values as given (1.0 and 1 two keys)."""
    import hashlib

    from wia_hw._version import __version__
    from wia_hw.sweep import _file

    def old_key(params, workload, args, metrics, base_hash, version=__version__):
        doc = {
            "params": dict(params),
            "workload": {"name": workload, "args": dict(args)},
            "metrics": list(metrics),
            "base": base_hash,
            "version": version,
        }
        return hashlib.sha256(_file.canonical_json(doc).encode()).hexdigest()

    monkeypatch.setattr(_file, "point_key", old_key)


def _clock_doc(seed: int) -> dict:
    rnd = random.Random(seed)
    clocks = sorted(rnd.sample([0.5, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0], 4))
    if not any(float(c).is_integer() for c in clocks):
        clocks[-1] = 2.0
    doc = _sweep_doc("clk", [64], workloads=GEMM)
    doc["grid"] = {"clock_ghz": clocks, "compute.array.rows": rnd.sample([32, 64.0, 128], 2)}
    return doc


@pytest.mark.parametrize("members", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_store_from_before_canonical_keys_is_not_recomputed(tmp_path, monkeypatch, seed, members):
    """A store written when 1.0 and 1 had two point keys (with or without the members
    table): the same sweep run today computes nothing, and its report counts every
    point once and no row superseded."""
    doc = _clock_doc(seed)
    store = tmp_path / "s.sqlite"
    with monkeypatch.context() as m:
        _old_keys(m)
        first = wia_hw.sweep(doc, store=store, workers=1)
    if not members:  # as written before membership was recorded (c384170)
        with sqlite3.connect(store) as c:
            c.execute("DROP TABLE members")
    n = first.points
    again = wia_hw.sweep(doc, store=store, workers=1)
    assert (again.skipped, again.computed) == (n, 0)
    st = open_store(store)
    try:
        assert len(st.points("clk")) == n and st.superseded("clk") == 0
        assert len(st.points("clk", superseded=True)) == n
        assert len(st) == n
    finally:
        st.close()
    out = CliRunner().invoke(cli, ["sweep-report", str(store)]).output
    assert f"{n} points" in out and "superseded" not in out


@pytest.mark.parametrize("seed", [0, 1])
def test_a_store_already_recomputed_under_new_keys_reads_each_point_once(
    tmp_path, monkeypatch, seed
):
    """A store a wia-hw that did not know the old keys ran the sweep on again (so the
    integral-float points are stored twice): the report reads each point once and calls
    nothing superseded; the next run computes nothing and drops the duplicates."""
    from wia_hw.sweep import SweepStore

    doc = _clock_doc(seed)
    store = tmp_path / "s.sqlite"
    with monkeypatch.context() as m:
        _old_keys(m)
        first = wia_hw.sweep(doc, store=store, workers=1)
    with sqlite3.connect(store) as c:
        c.execute("DROP TABLE members")
    with monkeypatch.context() as m:  # be3cce0: new keys, old ones unknown
        m.setattr(SweepStore, "_key_aliases", lambda self, rows: {}, raising=False)
        second = wia_hw.sweep(doc, store=store, workers=1)
    n = first.points
    assert second.computed > 0  # the duplicate rows this finding is about
    st = open_store(store)
    try:
        assert len(st) > n
        rows = st.points("clk", superseded=True)
        assert len(rows) == n and st.superseded("clk") == 0
        seen = [json.dumps(r["params"], sort_keys=True) for r in rows]
        assert len(set(seen)) == n
    finally:
        st.close()
    res = CliRunner().invoke(cli, ["sweep-report", str(store), "--superseded"])
    assert f"{n} points" in res.output
    third = wia_hw.sweep(doc, store=store, workers=1)
    assert (third.skipped, third.computed) == (n, 0)
    st = open_store(store)
    try:
        assert len(st) == n
    finally:
        st.close()


def test_superseded_rows_name_the_version_too(tmp_path):
    """The definition hashes the wia-hw version, and the report says so."""
    store = tmp_path / "s.sqlite"
    wia_hw.sweep(_sweep_doc("s", [32, 64]), store=store, workers=1)
    wia_hw.sweep(_sweep_doc("s", [32, 64], metrics=["latency_ms"]), store=store, workers=1)
    out = CliRunner().invoke(cli, ["sweep-report", str(store)]).output
    assert "2 superseded rows" in out and "wia-hw version" in out


def test_a_store_that_cannot_be_created_is_one_line(tmp_path):
    """SQLite refusing the file (here /proc, where no file can be made) was a
    sqlite3.OperationalError traceback."""
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(json.dumps(_sweep_doc("s", [32])))
    res = CliRunner().invoke(cli, ["sweep", str(sweep_file), "--store", "/proc/s.sqlite"])
    assert _one_line_exit_2(res).endswith(
        "/proc/s.sqlite: cannot open the store (unable to open database file)"
    )


def test_a_store_this_user_cannot_write_is_read(tmp_path, monkeypatch):
    """A store in a folder the user cannot write (a WAL store needs its -shm file there)
    is opened read-only: it said 'not a sweep store (attempt to write a readonly
    database)'."""
    store = tmp_path / "s.sqlite"
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(json.dumps(_sweep_doc("s", [32, 64])))
    wia_hw.sweep(str(sweep_file), store=store, workers=1)
    want = len(open_store(store).points())
    import wia_hw.sweep._store as store_mod

    real = store_mod.os.access
    monkeypatch.setattr(
        store_mod.os, "access", lambda p, mode, **k: mode != store_mod.os.W_OK and real(p, mode)
    )
    assert len(open_store(store).points()) == want == 2
    res = CliRunner().invoke(cli, ["sweep-report", str(store)])
    assert res.exit_code == 0, res.output
