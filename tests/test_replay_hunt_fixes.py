"""Bug-hunt fixes in replay, compare, export and sweeps: a report records the content
(sha256) and absolute path of the files behind it (ONNX model, SCALE-Sim topology,
extension manifest and module, spec file), ``--replay`` refuses a changed file and
does not depend on the current folder, ``compare`` never calls the same what differs
or is not recorded, a sweep's points follow a model file's content, and the sweep
plot and export counts are exact."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw.cli import cli
from wia_hw.spec import spec_path
from wia_hw.sweep import load_sweep, open_store

ONNX = Path(__file__).parent / "data" / "onnx"
MODEL_A = ONNX / "bert_large_2l.legacy.onnx"
MODEL_B = ONNX / "bert_sdpa_2l.legacy.onnx"

# a YAML-only extension whose cost expression an edit changes, its version kept
SPARSE = """\
schema_version: 1
extension_id: sparse_tensor_unit
version: "1.0"
description: 2:4 structured-sparse tensor unit
requires: {wia_hw: ">=0.1, <1.0"}
capabilities: [structured_sparsity]
parameters:
  keep: {type: int, default: 2, min: 1, max: 4, description: non-zero weights per group}
  group: {type: int, default: 4, min: 1, max: 16, description: group length along K}
  index_cycles: {type: int, default: 2, min: 0, max: 64, unit: cycles, description: decode}
operations:
  - name: sparse_matmul_2_4
    description: linear and matmul layers whose weights are 2:4 sparse
    claims: [linear, matmul]
    compose: [matmul]
    uses: [structured_sparsity]
    cost:
      cycles: "B * ceil(M / array_rows) * ceil(N / array_cols) * (ceil(K * keep / group / rate) + 2 * array_rows + array_cols - 2 + COST)"
      macs: "B * M * N * ceil(K * keep / group)"
"""

# an extension with a Python module beside its manifest
UNIT = """\
schema_version: 1
extension_id: unit
version: "1.0"
module: unit_impl
capabilities: [video_processing]
operations:
  - name: unit_gelu
    impl: gelu_impl
    claims: [gelu]
"""


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def _one_line_error(args: list[str], match: str) -> str:
    code, out, err = _cli(*args)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.search(match, lines[0]), lines[0]
    return lines[0]


def _run(out: Path, *args: str) -> dict:
    code, _, err = _cli("run", *args, "-o", str(out))
    assert code == 0, err
    return json.loads(out.read_text())


# -- 1: a changed model or extension file is noticed -----------------------------------


def test_replay_refuses_a_changed_onnx_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(MODEL_A, "model.onnx")
    rep = _run(tmp_path / "run.json", "model.onnx", "-b", "1", "-a", "seq=16")
    run = rep["provenance"]["run"]
    assert run["workload"] == "model.onnx"  # as given
    assert run["workload_path"] == str(tmp_path.resolve() / "model.onnx")
    assert run["workload_sha256"] == file_sha256(MODEL_A)
    # unchanged: the same report byte for byte
    code, _, err = _cli("run", "--replay", "run.json", "-o", "again.json")
    assert code == 0, err
    assert Path("again.json").read_bytes() == Path("run.json").read_bytes()
    shutil.copy(MODEL_B, "model.onnx")  # re-exported: other bytes, the same name
    line = _one_line_error(["run", "--replay", "run.json"], r"has changed since the report")
    assert f"the report has {file_sha256(MODEL_A)[:12]}" in line
    assert file_sha256(MODEL_B)[:12] in line
    Path("model.onnx").unlink()
    _one_line_error(["run", "--replay", "run.json"], r"model\.onnx cannot be read now")


def test_replay_refuses_an_edited_extension_manifest_or_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("ext.yaml").write_text(SPARSE.replace("COST", "index_cycles"))
    bert = ["bert-base", "-b", "1", "-s", "32", "-a", "layers=1", "--ext", "ext.yaml"]
    rep = _run(tmp_path / "run.json", *bert)
    [e] = rep["provenance"]["extensions"]
    assert e["source"] == "ext.yaml" and e["path"] == str(tmp_path.resolve() / "ext.yaml")
    assert e["manifest_sha256"] == file_sha256("ext.yaml") and "module_sha256" not in e
    Path("ext.yaml").write_text(SPARSE.replace("COST", "10 * index_cycles"))  # same version
    _one_line_error(
        ["run", "--replay", "run.json"],
        r"extension 'sparse_tensor_unit' \(ext\.yaml\) has changed since the report "
        r"\(manifest sha256 ",
    )
    # compare says so too: the extension's manifest differs
    _run(tmp_path / "edited.json", *bert)
    code, out, err = _cli("compare", "run.json", "edited.json", "--json")
    assert code == 0, err
    made = json.loads(out)["made_with"]
    assert made["  sparse_tensor_unit manifest sha256"] == [
        e["manifest_sha256"][:12],
        file_sha256("ext.yaml")[:12],
    ]
    # an extension with a module: its module's bytes are recorded and checked
    Path("unit.yaml").write_text(UNIT)
    Path("unit_impl.py").write_text(
        "def gelu_impl(op, graph, spec, storage, ext):\n    return None\n"
    )
    gemm = ["gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64", "--ext", "unit.yaml"]
    rep = _run(tmp_path / "unit.json", *gemm)
    [e] = rep["provenance"]["extensions"]
    assert e["module_sha256"] == file_sha256("unit_impl.py")
    with open("unit_impl.py", "a") as f:
        f.write("# edited\n")
    _one_line_error(
        ["run", "--replay", "unit.json"], r"'unit' \(unit\.yaml\) has changed .*\(module sha256 "
    )


def test_compare_reports_a_changed_model_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(MODEL_A, "model.onnx")
    _run(tmp_path / "a.json", "model.onnx", "-b", "1", "-a", "seq=16")
    shutil.copy(MODEL_B, "model.onnx")
    _run(tmp_path / "b.json", "model.onnx", "-b", "1", "-a", "seq=16")
    code, out, _ = _cli("compare", "a.json", "b.json", "--json")
    assert code == 0
    made = json.loads(out)["made_with"]
    assert made["workload sha256"] == [file_sha256(MODEL_A)[:12], file_sha256(MODEL_B)[:12]]
    code, out, _ = _cli("compare", "a.json", "b.json", "--top", "0")
    assert "Made with: the same" not in out and "workload sha256" in out


def _sweep_doc(model: str) -> dict:
    return {
        "schema_version": 1,
        "name": "s",
        "base": "wia-npu",
        "grid": {"memory.hbm.bandwidth_gbs": [300, 600]},
        "workloads": {model: {"batch": 1, "seq": 8}},
        "metrics": ["latency_ms"],
    }


def test_sweep_points_follow_the_model_files_content(tmp_path):
    from wia_hw.sweep._worker import evaluate_point

    model = tmp_path / "m.onnx"
    shutil.copy(MODEL_A, model)
    doc = _sweep_doc(str(model))
    store = tmp_path / "st.sqlite"
    first = wia_hw.sweep(doc, store=store, workers=1)
    assert first.computed == 2
    assert wia_hw.sweep(doc, store=store, workers=1).computed == 0  # unchanged: stored
    sw_a = load_sweep(doc)
    assert sw_a.workload_sha256 == {str(model): file_sha256(MODEL_A)}
    shutil.copy(MODEL_B, model)  # a different model under the same name
    again = wia_hw.sweep(doc, store=store, workers=1)
    assert (again.skipped, again.computed) == (0, 2)
    sw_b = load_sweep(doc)
    assert {p.key for p in sw_a.points()}.isdisjoint(p.key for p in sw_b.points())
    assert sw_a.definition != sw_b.definition
    meta = json.loads(open_store(store).meta["sweep:s"])
    assert meta["workload_sha256"] == {str(model): file_sha256(MODEL_B)}
    # a builder workload's key is as before: no file, no hash in it
    gemm = dict(_sweep_doc("gemm"), workloads={"gemm": {"M": 64, "N": 64, "K": 64}})
    assert load_sweep(gemm).workload_sha256 == {}
    # a model that changes after the sweep was loaded fails its points, never stored
    # under the loaded content's key
    [p, *_] = sw_a.points()
    task = {
        "key": p.key,
        "base": sw_a.base,
        "params": p.params,
        "workload": p.workload_name,
        "args": p.workload_args,
        "workload_sha256": sw_a.workload_sha256[p.workload_name],
        "metrics": list(p.metrics),
    }
    r = evaluate_point(task)
    assert r["status"] == "failed" and "has changed since the sweep was loaded" in r["error"]


# -- 2: a replay reads the files the report recorded, from any folder -------------------


def test_replay_from_another_folder_reads_the_recorded_files(tmp_path, monkeypatch):
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    shutil.copy(MODEL_A, a / "model.onnx")
    shutil.copy(MODEL_B, b / "model.onnx")  # another model of the same name
    monkeypatch.chdir(a)
    rep = _run(tmp_path / "a.json", "model.onnx", "-b", "1", "-a", "seq=16")
    src = spec_path("wia-edge")
    assert src is not None
    (a / "my.yaml").write_text(src.read_text())
    (a / "ext.yaml").write_text(SPARSE.replace("COST", "index_cycles"))
    gemm = ["gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64", "-d", "my.yaml"]
    spec_rep = _run(tmp_path / "c.json", *gemm, "--ext", "ext.yaml")
    assert spec_rep["provenance"]["spec"] == "my.yaml"
    assert spec_rep["provenance"]["spec_path"] == str(a.resolve() / "my.yaml")
    monkeypatch.chdir(b)
    code, _, err = _cli("run", "--replay", str(tmp_path / "a.json"), "-o", "b.json")
    assert code == 0, err
    again = json.loads(Path("b.json").read_text())
    assert (again["latency_ms"], again["flops"]) == (rep["latency_ms"], rep["flops"])
    assert again["provenance"]["run"]["workload"] == str(a.resolve() / "model.onnx")
    code, _, err = _cli("run", "--replay", str(tmp_path / "c.json"), "-o", "d.json")
    assert code == 0, err
    d = json.loads(Path("d.json").read_text())
    assert d["latency_ms"] == spec_rep["latency_ms"] and d["device"] == "wia-edge"
    # the recorded file gone: refused, naming it (never the file of that name here)
    (a / "model.onnx").unlink()
    _one_line_error(["run", "--replay", str(tmp_path / "a.json")], r"cannot be read now")


def test_replay_reads_and_checks_a_schedules_file(tmp_path, monkeypatch):
    import warnings

    from wia_hw.optimize._schedules import FORMAT

    monkeypatch.chdir(tmp_path)
    sched = Path("tuned.json")
    sched.write_text(json.dumps({"format": FORMAT, "version": 1, "entries": []}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no tiling for this device: the defaults run
        r = wia_hw.run("gemm", M=64, N=64, K=64, schedules="tuned.json")
    run = r.provenance["run"]
    assert run["schedules"] == "tuned.json"
    assert run["schedules_path"] == str(tmp_path.resolve() / "tuned.json")
    assert run["schedules_sha256"] == file_sha256(sched)
    Path("r.json").write_text(r.to_json())
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)  # the schedules file is read where the report recorded it
    code, _, err = _cli("run", "--replay", str(tmp_path / "r.json"), "-o", "again.json")
    assert code == 0, err
    sched = tmp_path / "tuned.json"
    sched.write_text(sched.read_text() + "\n")
    _one_line_error(
        ["run", "--replay", str(tmp_path / "r.json")],
        r"schedules .*tuned\.json has changed since the report \(schedules sha256 ",
    )


# -- 3: compare of profiles: the graphs run, their parameters, the profile mode ---------


def test_compare_profiles_of_different_workloads(tmp_path):
    g, p, r = tmp_path / "gemm.json", tmp_path / "gpt2.json", tmp_path / "run.json"
    gemm = ["gemm", "-a", "M=128", "-a", "N=128", "-a", "K=128"]
    assert _cli("profile", *gemm, "--mode", "counters", "-o", str(g))[0] == 0
    gpt2 = ["gpt2", "-b", "1", "-s", "16", "-a", "layers=1"]
    assert _cli("profile", *gpt2, "--mode", "trace", "-o", str(p))[0] == 0
    assert _cli("run", *gemm, "-o", str(r))[0] == 0
    code, out, _ = _cli("compare", str(g), str(p), "--json")
    c = json.loads(out)
    assert c["made_with"]["graph"] == ["gemm", "gpt2"]
    assert c["made_with"]["profile mode"] == ["counters", "trace"]
    assert c["made_with"]["graph layers"] == [None, 1]
    assert "workload as given" in c["not_recorded_by_all"]
    code, out, _ = _cli("compare", str(g), str(p), "--top", "0")
    assert "Made with: the same" not in out
    # a gemm profile against a gpt2 run
    assert _cli("run", *gpt2, "-o", str(tmp_path / "gpt2run.json"))[0] == 0
    code, out, _ = _cli("compare", str(g), str(tmp_path / "gpt2run.json"), "--top", "0")
    assert "Made with: the same" not in out and re.search(r"│ graph +│ gemm +│ gpt2", out)
    # the same gemm profiled and run: the same graph, and the run's arguments as given
    # are not recorded by the profile, so not claimed the same
    code, out, _ = _cli("compare", str(g), str(r), "--top", "0")
    first = out.splitlines()[0]
    assert first.startswith("Made with: the same") and "graph and its parameters" in first
    assert "workload and its arguments" not in first
    assert "Not compared (not recorded in every report): workload as given" in out


# -- 4: a sweep checks an .onnx workload as its points run it --------------------------


def test_sweep_checks_onnx_arguments_as_the_points_run_them(tmp_path):
    model = tmp_path / "m.onnx"
    shutil.copy(MODEL_A, model)
    doc = _sweep_doc(str(model))
    doc["workloads"] = {str(model): {"batch": 1, "seq": 8, "precision": "fp16"}}
    sw = load_sweep(doc)  # `wia-hw run m.onnx -p fp16` runs: so does the sweep
    s = wia_hw.sweep(sw, store=tmp_path / "s.sqlite", workers=1)
    assert (s.ok, s.failed) == (2, 0)
    doc["workloads"] = {str(model): {"batch": 1, "dims": {"seq": 8}}}
    with pytest.raises(wia_hw.SpecError, match=r"workload .*m\.onnx"):
        load_sweep(doc)  # every point would fail: refused at load


# -- 5: the sweep plot as SVG or PDF is the same bytes each time ------------------------


@pytest.mark.parametrize("suffix", [".svg", ".pdf"])
def test_sweep_plot_svg_and_pdf_are_reproducible(tmp_path, suffix):
    pytest.importorskip("matplotlib")
    from wia_hw.sweep._report import plot_pareto

    rows = [
        {
            "point_key": str(c),
            "status": "ok",
            "workload": "gemm(K=1, M=1, N=1)",
            "params": {"clock_ghz": c},
            "metrics": {"latency_ms": 1.0 / c, "energy_j": c},
        }
        for c in (1, 2, 3)
    ]
    a = plot_pareto(rows, tmp_path / f"a{suffix}").read_bytes()
    time.sleep(1.1)  # a date to the second would differ now
    b = plot_pareto(rows, tmp_path / f"b{suffix}").read_bytes()
    assert a == b
    assert b"<dc:date>" not in a and b"/CreationDate" not in a


# -- 6: export counts records, not lines ------------------------------------------------


def test_export_counts_records_not_lines(tmp_path):
    d = _run(tmp_path / "r.json", "gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64")
    d["kernels"][0]["name"] = "two\nlines"
    weird = tmp_path / "weird.json"
    weird.write_text(json.dumps(d))
    code, _, err = _cli("export", str(weird), "--csv", str(tmp_path / "k.csv"))
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO((tmp_path / "k.csv").read_text())))
    assert rows[0]["name"] == "two\nlines"
    assert f"(kernels, {len(d['kernels'])} rows)" in err


# -- 7: ops.csv adds up to the latency; compare compares the resolved precision ---------


def test_ops_csv_holds_the_final_writeback(tmp_path):
    d = _run(tmp_path / "r.json", "bert-base", "-b", "1", "-s", "32", "-a", "layers=1")
    out = tmp_path / "ops.csv"
    code, _, err = _cli("export", str(tmp_path / "r.json"), "--csv", str(out))
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert rows[-1]["name"] == "writeback" and float(rows[-1]["time_ms"]) > 0
    assert len(rows) == len(d["op_times"]) + 1
    assert sum(float(r["time_ms"]) for r in rows) == pytest.approx(d["latency_ms"], rel=1e-9)


def test_compare_default_precision_is_the_resolved_one(tmp_path):
    gemm = ["gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64"]
    a = _run(tmp_path / "a.json", *gemm)
    _run(tmp_path / "b.json", *gemm, "-p", "fp16")
    _run(tmp_path / "c.json", *gemm, "-p", "fp32")
    assert a["precision"] == "fp16" and a["provenance"]["run"]["precision"] is None
    code, out, _ = _cli("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert "precision" not in json.loads(out)["made_with"]
    code, out, _ = _cli("compare", str(tmp_path / "a.json"), str(tmp_path / "c.json"), "--json")
    assert json.loads(out)["made_with"]["precision"] == ["fp16", "fp32"]


def test_a_generation_report_replays_byte_for_byte(tmp_path):
    # a --generate report says its run is replayable: --replay generates again, on the
    # spec, overrides and extension it was made with (it refused the schema before)
    a, b = tmp_path / "gen.json", tmp_path / "again.json"
    made = [
        "run", "gpt2", "--generate", "6", "--prompt-len", "3", "-b", "2", "-a", "layers=2",
        "-d", "wia-edge", "--set", "memory.hbm.bandwidth_gbs=300",
        "--ext", "transformer_engine", "-o", str(a),
    ]  # fmt: skip
    assert _cli(*made)[0] == 0
    code, out, err = _cli("run", "--replay", str(a), "-o", str(b))
    assert code == 0, err
    assert a.read_bytes() == b.read_bytes()
    d = json.loads(a.read_text())
    assert d["schema"] == "wia-hw.generate/1" and d["provenance"]["run"]["replayable"]


def test_an_interrupted_write_leaves_the_old_report_and_no_partial_file(tmp_path, monkeypatch):
    from wia_hw.cli._common import emit_json

    out = tmp_path / "run.json"
    out.write_text('{"old": 1}\n')
    real = Path.write_text

    def interrupted(self, data, *a, **k):
        real(self, data[: len(data) // 2], *a, **k)  # half of it, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        emit_json('{"new": "' + "x" * 1000 + '"}', out, False)
    monkeypatch.setattr(Path, "write_text", real)
    assert out.read_text() == '{"old": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_compare_names_the_profile_mode_a_run_report_lacks(tmp_path):
    a, p = tmp_path / "a.json", tmp_path / "p.json"
    args = ["gemm", "-a", "M=128", "-a", "N=128", "-a", "K=128", "-o"]
    assert _cli("run", *args, str(a))[0] == 0
    assert _cli("profile", *args, str(p))[0] == 0
    code, out, _ = _cli("compare", str(a), str(p))
    assert code == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Not compared")]
    assert "profile mode" in line
