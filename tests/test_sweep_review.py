"""Sweeps, sweep reports, compare/export and run --replay on the inputs a review found
broken: changed definitions, stores shared between sweeps, huge grids, hostile names,
corrupted reports, interrupts and worker crashes. Random inputs use fixed seeds."""

from __future__ import annotations

import json
import random
import sqlite3

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
