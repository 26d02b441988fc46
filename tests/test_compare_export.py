"""wia-hw compare and wia-hw export (issue #15 item 4)."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from click.testing import CliRunner

from wia_hw.cli import cli

BERT = ["bert-base", "-b", "1", "-s", "32", "-a", "layers=2"]


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def _one_line_error(args: list[str], match: str) -> None:
    code, out, err = _cli(*args)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.search(match, lines[0]), lines[0]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    a, b, p = d / "a.json", d / "b.json", d / "p.json"
    assert _cli("run", *BERT, "-o", str(a))[0] == 0
    code, _, err = _cli(
        "run",
        *BERT,
        "--set",
        "memory.hbm.bandwidth_gbs=100",
        "--ext",
        "transformer_engine",
        "--ext-param",
        "transformer_engine.block_q=64",
        "-o",
        str(b),
    )
    assert code == 0, err
    assert _cli("profile", *BERT, "-o", str(p))[0] == 0
    return a, b, p


def test_compare_json_deltas_and_what_differs(reports):
    a, b, _ = reports
    code, out, err = _cli("compare", str(a), str(b), "--json")
    assert code == 0, err
    c = json.loads(out)
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert c["totals"]["latency"] == [ra["latency_ms"], rb["latency_ms"]]
    assert c["totals"]["energy"] == [ra["energy_j"], rb["energy_j"]]
    made = c["made_with"]
    assert made["--set memory.hbm.bandwidth_gbs"] == [None, 100]
    assert made["  transformer_engine.block_q"] == [None, 64]
    assert made["peak HBM GB/s"] == [600, 100]
    assert "seed" not in made and "workload" not in made  # equal: not listed
    # per op: each op's time in each report
    for o in ra["op_times"]:
        assert c["ops"][o["name"]][0] == o["time_ms"]
    # per kernel: a kernel of every layer is one row; launches and total ms add up
    ffn = [k for k in ra["kernels"] if k["name"].endswith("feed_forward_intermediate")]
    assert c["kernels"]["feed_forward_intermediate"][0] == [
        len(ffn),
        pytest.approx(sum(k["time_ms"] for k in ffn)),
    ]
    assert sum(n for n, _ in (v[0] for v in c["kernels"].values() if v[0])) == len(ra["kernels"])


def test_compare_text(reports):
    a, b, _ = reports
    code, out, _ = _cli("compare", str(a), str(b))
    assert code == 0
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    pct = 100.0 * (rb["latency_ms"] - ra["latency_ms"]) / ra["latency_ms"]
    latency = next(ln for ln in out.splitlines() if ln.startswith("│ latency"))
    assert f"{pct:+.1f}%" in latency
    assert "memory.hbm.bandwidth_gbs" in out and "Per kernel" in out and "…" not in out
    code, out, _ = _cli("compare", str(a), str(a))
    assert "Made with: the same spec" in out and "+0.0%" in out


def test_compare_run_with_profile_report(reports):
    a, _, p = reports
    code, out, err = _cli("compare", str(a), str(p), "--json")
    assert code == 0, err
    c = json.loads(out)
    # the same run, timed and profiled: the same device time (profiling is free)
    assert c["totals"]["cycles"][0] == c["totals"]["cycles"][1]
    assert c["kernels"]["feed_forward_output"][0] == pytest.approx(
        c["kernels"]["feed_forward_output"][1]
    )


def test_compare_errors(tmp_path, reports):
    a, _, _ = reports
    _one_line_error(["compare", str(a)], r"at least two reports")
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": "wia-hw.sweep/1"}')
    _one_line_error(["compare", str(a), str(bad)], r"x\.json: not a wia-hw run or profile report")
    bad.write_text("[1,")
    _one_line_error(["compare", str(a), str(bad)], r"x\.json: not JSON")
    _one_line_error(["compare", str(a), str(tmp_path / "no.json")], r"cannot read .*no\.json")


def _read_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_export_kernels_ops_counters(tmp_path, reports):
    a, _, _ = reports
    r = json.loads(a.read_text())
    k, o, c = tmp_path / "kernels.csv", tmp_path / "ops.csv", tmp_path / "counters.csv"
    code, _, err = _cli("export", str(a), "--csv", str(k), "--csv", str(o), "--csv", str(c))
    assert code == 0, err
    rows = _read_csv(k.read_text())
    assert [x["name"] for x in rows] == [x["name"] for x in r["kernels"]]
    assert [int(x["cycles"]) for x in rows] == [x["cycles"] for x in r["kernels"]]
    assert [int(x["counters.bytes.hbm"]) for x in rows] == [
        x["counters"]["bytes"]["hbm"] for x in r["kernels"]
    ]
    ops = _read_csv(o.read_text())
    tail = [x for x in r["ops"] if x["name"] == "writeback"]  # the final write-back
    assert [(x["name"], float(x["time_ms"])) for x in ops] == [
        (x["name"], x["time_ms"]) for x in r["op_times"] + tail
    ]
    counters = {x["counter"]: x["value"] for x in _read_csv(c.read_text())}
    assert int(counters["cycles"]) == r["counters"]["cycles"]
    assert int(counters["bytes.hbm"]) == r["counters"]["bytes"]["hbm"]
    # --what chooses the kind whatever the name; - is stdout
    code, out, _ = _cli("export", str(a), "--csv", "-", "--what", "ops")
    assert code == 0 and out == o.read_text()


def test_export_profile_report(reports):
    _, _, p = reports
    code, out, err = _cli("export", str(p), "--csv", "-")
    assert code == 0, err
    rows = _read_csv(out)
    assert len(rows) == len(json.loads(p.read_text())["kernels"]) and "profile.cycles" in rows[0]


def test_export_errors(tmp_path, reports):
    a, _, _ = reports
    _one_line_error(
        ["export", str(a), "--csv", str(tmp_path / "x.csv"), "--csv", str(tmp_path / "y.csv")],
        r"say what it holds with --what",
    )
    _one_line_error(
        ["export", str(a), "--csv", str(tmp_path / "x.csv"), "--what", "ops", "--what", "kernels"],
        r"1 --csv file\(s\) but 2 --what",
    )
    _one_line_error(["export", str(a), "--csv", str(tmp_path / "no" / "x.csv")], r"cannot write")
    for name in ("k.xlsx", "k.json", "kernels"):  # CSV text in a file named otherwise
        _one_line_error(
            ["export", str(a), "--csv", str(tmp_path / name)],
            r"unknown kind .*: export writes CSV text: \*\.csv or \*\.txt, or -",
        )
        assert not (tmp_path / name).exists()
