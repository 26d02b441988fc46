"""Provenance: every report names the spec as used (source, overrides, extensions with
their parameters, the resolved spec's hash and peaks, version, seed), and
``wia-hw run --replay`` re-runs a run report byte for byte (issue #15)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw._version import __version__
from wia_hw.cli import cli
from wia_hw.profiling import ProfilingConfig, start_profiling, stop_profiling
from wia_hw.runtime import spec_sha256
from wia_hw.spec import load_spec, spec_path

# a small run on which the transformer_engine extension runs a kernel
BERT1 = ["bert-base", "-b", "1", "-s", "32", "-a", "layers=1"]
VARIANT = [
    "--set",
    "memory.hbm.bandwidth_gbs=100",
    "--set",
    "compute.array.rows=64",
    "--ext",
    "transformer_engine",
    "--ext-param",
    "transformer_engine.block_q=64",
    "--seed",
    "7",
]


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def _one_line_error(args: list[str], match: str) -> None:
    code, out, err = _cli(*args)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.search(match, lines[0]), lines[0]


def test_replay_is_byte_identical_with_overrides_and_extension_parameters(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    code, out, err = _cli("run", *BERT1, *VARIANT, "-o", str(a), "--json")
    assert code == 0, err
    assert out == a.read_text()  # --json prints even with -o
    prov = json.loads(a.read_text())["provenance"]
    assert prov["overrides"] == {"memory.hbm.bandwidth_gbs": 100, "compute.array.rows": 64}
    [te] = prov["extensions"]
    assert te["id"] == "transformer_engine" and te["source"] == "transformer_engine"
    assert te["parameters"]["block_q"] == 64 and te["changed"] == ["block_q"]
    assert prov["seed"] == 7 and prov["run"]["seed"] == 7
    assert json.loads(a.read_text())["extensions"]["transformer_engine"]["kernels"] >= 1
    code, out, err = _cli("run", "--replay", str(a), "-o", str(b))
    assert code == 0, err
    assert b.read_bytes() == a.read_bytes()
    # and the extension parameter mattered: the default block_q gives another report
    code, _, _ = _cli("run", *BERT1, *VARIANT[:6], "--seed", "7", "-o", str(b))
    assert code == 0 and b.read_bytes() != a.read_bytes()


def test_provenance_names_the_resolved_spec_and_its_peaks():
    ctx = wia_hw.open_device("wia-npu", overrides={"memory.hbm.bandwidth_gbs": 100}, seed=3)
    r = ctx.run("gemm", M=256, N=256, K=256)
    p = r.provenance
    resolved = load_spec("wia-npu", {"memory.hbm.bandwidth_gbs": 100})
    assert p["spec"] == "wia-npu" and p["device"] == "wia-npu"
    assert p["spec_sha256"] == spec_sha256(resolved) != spec_sha256(load_spec("wia-npu"))
    assert p["peaks"]["hbm_bandwidth_gbs"] == 100
    assert p["peaks"]["peak_tflops"]["fp16"] == resolved.peak_flops("fp16") / 1e12
    assert p["wia_hw_version"] == __version__ and p["seed"] == 3
    assert p["run"] == {
        "workload": "gemm",
        "replayable": True,
        "batch": None,
        "seq": None,
        "precision": None,
        "mode": "timing",
        "seed": 3,
        "kwargs": {"M": 256, "N": 256, "K": 256},
        "start_cycle": 0,
    }
    # the same fields give the same hash; a different field another
    assert spec_sha256(load_spec("wia-npu", {"memory.hbm.bandwidth_gbs": 100})) == p["spec_sha256"]


def test_text_header_and_floor_use_the_resolved_spec(tmp_path):
    code, out, _ = _cli(
        "run",
        "gemm",
        "-a",
        "M=512",
        "-a",
        "N=512",
        "-a",
        "K=512",
        "--set",
        "memory.hbm.bandwidth_gbs=100",
    )
    assert code == 0
    assert "on wia-npu (modified)" in out
    assert "--set memory.hbm.bandwidth_gbs=100" in out
    assert re.search(r"HBM bytes at \d+/100 GB/s", out)
    # a spec given by path: its own peak, never "?"
    src = spec_path("wia-edge")
    assert src is not None
    f = tmp_path / "edge.yaml"
    f.write_text(src.read_text())
    code, out, _ = _cli("run", "gemm", "-a", "M=256", "-a", "N=256", "-a", "K=256", "-d", str(f))
    assert code == 0
    bw = load_spec(f).peak_bandwidth_gbs
    assert f"/{bw:.0f} GB/s" in out and "/? GB/s" not in out
    assert f"Spec: {f};" in out


def test_profile_reports_carry_provenance(tmp_path):
    ctx = wia_hw.open_device("wia-npu", overrides={"compute.array.cols": 64}, seed=5)
    s = start_profiling(ctx, ProfilingConfig(mode="trace"))
    ctx.run("gemm", M=128, N=128, K=128)
    rep = stop_profiling(s)
    p = rep.provenance
    assert p["overrides"] == {"compute.array.cols": 64} and p["seed"] == 5
    assert p["spec_sha256"] == spec_sha256(ctx.spec)
    assert json.loads(rep.to_json())["provenance"] == p
    assert rep.chrome_trace()["otherData"]["provenance"] == p
    assert "--set compute.array.cols=64" in rep.format_text().splitlines()[1]
    assert "--set compute.array.cols=64" in rep.flamegraph_svg()
    assert f"sha256 {p['spec_sha256'][:12]}" in rep.flamegraph_title()
    # CLI: the JSON written with -o and the one printed with --json agree
    out = tmp_path / "p.json"
    code, text, err = _cli(
        "profile",
        "gemm",
        "-a",
        "M=64",
        "-a",
        "N=64",
        "-a",
        "K=64",
        "--set",
        "compute.array.cols=64",
        "--json",
        "-o",
        str(out),
    )
    assert code == 0, err
    assert json.loads(text)["provenance"]["overrides"] == {"compute.array.cols": 64}
    assert json.loads(out.read_text())["provenance"] == json.loads(text)["provenance"]


def _report(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "r.json"
    code, _, err = _cli(
        "run", "gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64", *args, "-o", str(out), "--json"
    )
    assert code == 0, err
    return out


def test_replay_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    _one_line_error(["run", "--replay", str(bad)], r"bad\.json: not JSON")
    _one_line_error(["run", "--replay", str(tmp_path / "none.json")], r"cannot read .*none\.json")
    bad.write_text(json.dumps({"schema": "wia-hw.profile/1"}))
    _one_line_error(["run", "--replay", str(bad)], r"not a wia-hw run report")
    d = json.loads(_report(tmp_path).read_text())
    del d["provenance"]
    bad.write_text(json.dumps(d))
    _one_line_error(["run", "--replay", str(bad)], r"has no provenance")
    d = json.loads(_report(tmp_path).read_text())
    d["provenance"]["run"]["start_cycle"] = 1000
    bad.write_text(json.dumps(d))
    _one_line_error(["run", "--replay", str(bad)], r"started at cycle 1000 .* fresh device")
    _one_line_error(["run", "gemm", "--replay", str(bad)], r"--replay takes no WORKLOAD")
    _one_line_error(["run"], r"missing WORKLOAD")
    # a spec file edited after the report: refused, naming both hashes
    src = spec_path("wia-edge")
    assert src is not None
    f = tmp_path / "edge.yaml"
    f.write_text(src.read_text())
    rep = _report(tmp_path, "-d", str(f))
    f.write_text(src.read_text().replace("description:", "description: edited", 1))
    load_spec(f)  # still valid
    assert spec_sha256(load_spec(f)) != json.loads(rep.read_text())["provenance"]["spec_sha256"]
    _one_line_error(["run", "--replay", str(rep)], r"resolves differently now")


def test_graph_runs_are_not_replayable(tmp_path):
    from wia_hw.workloads import gemm

    r = wia_hw.run(gemm(64, 64, 64))
    assert r.provenance["run"]["replayable"] is False
    f = tmp_path / "g.json"
    f.write_text(r.to_json())
    _one_line_error(
        ["run", "--replay", str(f)],
        r"Graph object, with given inputs or with schedules given as a mapping; it cannot be replayed",
    )


def test_warm_context_records_its_start_cycle():
    ctx = wia_hw.open_device()
    first = ctx.run("gemm", M=64, N=64, K=64)
    second = ctx.run("gemm", M=64, N=64, K=64)
    assert first.provenance["run"]["start_cycle"] == 0
    assert second.provenance["run"]["start_cycle"] > 0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--ext-param", "transformer_engine.block_q=64"], r"not an extension given with --ext"),
        (
            ["--ext", "transformer_engine", "--ext-param", "transformer_engine.nope=1"],
            r"has no parameter 'nope'",
        ),
        (["--ext", "transformer_engine", "--ext-param", "block_q=64"], r"must read ID\.NAME=VALUE"),
    ],
)
def test_ext_param_errors(args, match):
    _one_line_error(["run", "gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64", *args], match)


def test_schedules_file_is_recorded_and_replayed(tmp_path):
    sched = tmp_path / "schedules.json"
    sched.write_text(json.dumps({"format": "wia-hw-schedules", "version": 1, "entries": []}))
    r = wia_hw.open_device().run("gemm", M=64, N=64, K=64, schedules=sched)
    assert r.provenance["run"]["schedules"] == str(sched)
    assert r.provenance["run"]["replayable"] is True
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(r.to_json() + "\n")
    code, _, err = _cli("run", "--replay", str(a), "-o", str(b))
    assert code == 0, err
    assert b.read_bytes() == a.read_bytes()
    mapped = wia_hw.open_device().run("gemm", M=64, N=64, K=64, schedules={})
    assert mapped.provenance["run"]["replayable"] is False
