"""The user-facing surface: wia_hw.run, open_device, RunResult, the wia-hw CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw import WorkloadError
from wia_hw.cli import cli
from wia_hw.graph import Graph, Op, Tensor
from wia_hw.workloads import gemm


def test_issue_python_example():
    r = wia_hw.run("bert-large", batch=32, seq=128, device="wia-npu")
    assert r.latency_ms > 0 and r.throughput > 0
    assert {o.name for o in r.ops} >= {
        "multi_head_attention",
        "layer_norm",
        "feed_forward",
        "embedding",
        "output",
    }
    c = r.counters
    assert c.cycles == r.cycles and c.instructions > 0 and c.cache_misses > 0 and c.flops > 0
    ctx = wia_hw.open_device("wia-npu", overrides={"compute.array.rows": 64})
    r2 = ctx.run("gpt2", batch=4, seq=256)
    assert r2.device == "wia-npu" and r2.params["batch"] == 4
    # a smaller array: half the peak
    assert r2.peak_tflops == pytest.approx(64.0)


def test_run_result_json_roundtrip_and_schema():
    r = wia_hw.run(gemm(256, 256, 256))
    d = json.loads(r.to_json())
    assert d["schema"] == "wia-hw.run/1"
    assert d["latency_ms"] == r.latency_ms
    assert d["counters"]["cycles"] == r.cycles
    assert len(d["kernels"]) == len(r.kernels)
    assert sum(k["cycles"] for k in d["kernels"]) <= d["cycles"]


def test_kernel_times_partition_the_run():
    r = wia_hw.run("bert-base", batch=2, seq=64)
    assert sum(k.cycles for k in r.kernels) + _tail(r) == r.cycles
    for k in r.kernels:
        assert 0 <= k.compute_utilization <= 100.0


def _tail(r):
    return r.cycles - sum(k.cycles for k in r.kernels)


# -- bad input: one line, naming what is wrong ----------------------------------------
def test_unknown_workload():
    with pytest.raises(WorkloadError, match=r"unknown workload 'bert-huge'") as ei:
        wia_hw.run("bert-huge")
    assert "\n" not in str(ei.value)


def test_mismatched_shapes_in_a_user_graph():
    ts = [
        Tensor("x", (4, 8), "fp16", "input"),
        Tensor("w", (9, 16), "fp16", "weight"),
        Tensor("y", (4, 16), "fp16"),
    ]
    with pytest.raises(
        WorkloadError,
        match=r"op 'mm' \(linear\): input \[4, 8\] does not "
        r"match weight \[9, 16\]",
    ):
        Graph("mine", ts, [Op("mm", "linear", ("x", "w"), ("y",))])


def test_missing_onnx_file(tmp_path):
    with pytest.raises(WorkloadError, match=r"absent\.onnx"):
        wia_hw.run(str(tmp_path / "absent.onnx"))


def test_unsupported_precision_on_device():
    with pytest.raises(WorkloadError, match=r"device 'wia-edge' has no fp32 support"):
        wia_hw.run(gemm(64, 64, 64, precision="fp32"), device="wia-edge")


def test_graph_with_builder_args_is_refused():
    with pytest.raises(WorkloadError, match=r"workload is a Graph: batch cannot be applied"):
        wia_hw.run(gemm(8, 8, 8), batch=4)


# -- CLI --------------------------------------------------------------------------------
def _cli(*args):
    return CliRunner().invoke(cli, list(args))


def test_cli_run_prints_the_breakdown_and_counters():
    res = _cli("run", "bert-base", "--batch", "2", "--seq", "64")
    assert res.exit_code == 0, res.output
    for text in (
        "Operation Breakdown",
        "multi_head_attention",
        "feed_forward",
        "Latency:",
        "Throughput:",
        "TFLOPS",
        "Hardware counters",
        "branch_mispredicts",
        "cache_misses",
    ):
        assert text in res.output


def test_cli_json_output_file(tmp_path):
    out = tmp_path / "run.json"
    res = _cli(
        "run",
        "gpt2",
        "--device",
        "wia-edge",
        "--precision",
        "int8",
        "--seq",
        "32",
        "--json",
        "-o",
        str(out),
    )
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["device"] == "wia-edge" and d["precision"] == "int8"
    res = _cli("run", "gemm", "-a", "M=128", "-a", "N=128", "-a", "K=128", "--json")
    assert json.loads(res.output)["flops"] == 2 * 128**3


def test_cli_overrides_and_specs():
    res = _cli(
        "run",
        "gemm",
        "-a",
        "M=256",
        "-a",
        "N=256",
        "-a",
        "K=256",
        "--set",
        "compute.array.rows=64",
        "--set",
        "memory.hbm.bandwidth_gbs=900",
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["peak_tflops"] == pytest.approx(64.0)
    res = _cli("specs", "list")
    assert res.exit_code == 0 and "wia-npu" in res.output and "wia-cluster-8" in res.output
    res = _cli("specs", "show", "wia-npu")
    assert res.exit_code == 0 and "peak fp16: 128.00 TFLOPS" in res.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "bert-huge"], "unknown workload 'bert-huge'"),
        (["run", "missing.onnx"], "no such ONNX file: missing.onnx"),
        (
            [
                "run",
                "gemm",
                "-a",
                "M=64",
                "-a",
                "N=64",
                "-a",
                "K=64",
                "--set",
                "compute.array.rows=-4",
            ],
            "override: compute.array.rows: must be a positive integer",
        ),
        (
            [
                "run",
                "gemm",
                "-a",
                "M=64",
                "-a",
                "N=64",
                "-a",
                "K=64",
                "--set",
                "compute.array.dataflow=zigzag",
            ],
            "must be one of os, ws, got 'zigzag'",
        ),
        (["run", "bert-base", "--device", "nope"], "unknown device spec 'nope'"),
        (["specs", "validate", "nope.yaml"], "nope.yaml: no such spec file"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, message):
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    err = res.stderr if hasattr(res, "stderr") else res.output
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in res.output


def test_cli_validate_reports_file_and_line(tmp_path):
    p = tmp_path / "my-npu.yaml"
    from wia_hw.spec import spec_path

    p.write_text(spec_path("wia-npu").read_text().replace("rows: 128", "rows: -4"))
    res = CliRunner().invoke(cli, ["specs", "validate", str(p)])
    assert res.exit_code == 2
    assert (
        f"{p}:" in res.stderr
        and "compute.array.rows: must be a positive integer, got -4" in res.stderr
    )
    good = tmp_path / "ok.yaml"
    good.write_text(spec_path("wia-edge").read_text())
    res = CliRunner().invoke(cli, ["specs", "validate", str(good)])
    assert res.exit_code == 0 and "ok" in res.output


@pytest.mark.parametrize("module", ["wia_hw.cli", "wia_hw"])
def test_console_script_is_installed(module):
    res = subprocess.run(
        [sys.executable, "-m", module, "specs", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "wia-npu" in res.stdout


def test_cli_runs_an_onnx_file_with_overrides(tmp_path):
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w1 = numpy_helper.from_array(np.zeros((64, 128), np.float32), "w1")
    w2 = numpy_helper.from_array(np.zeros((128, 10), np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 10])],
        [w1, w2],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    res = _cli("run", str(path), "--set", "compute.array.rows=64", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["flops"] == 2 * 32 * 64 * 128 + 32 * 128 + 2 * 32 * 128 * 10
    assert {k["op"] for k in d["kernels"]} == {"fc1", "relu", "fc2"}


def test_out_of_device_memory_names_the_tensor_and_keeps_the_context():
    ctx = wia_hw.open_device("wia-npu", overrides={"memory.hbm.size_gib": 0.5})
    with pytest.raises(
        wia_hw.WiaError,
        match=r"'bert-base': activation "
        r"'layer0\.attention_scores' does not fit: "
        r"cannot allocate 402653184 bytes",
    ):
        ctx.run("bert-base", batch=64, seq=512)  # scores: 64 x 12 x 512 x 512 x 2 bytes
    r = ctx.run("bert-base", batch=1, seq=32)  # the context is still usable
    assert r.latency_ms > 0


def test_cli_run_registers_extensions():
    res = _cli("run", "bert-base", "-b", "2", "-s", "64", "--ext", "transformer_engine", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    providers = {k["provider"] for k in d["kernels"]}
    assert providers == {"builtin", "transformer_engine"}
    res = _cli("run", "bert-base", "-b", "2", "-s", "64", "--ext", "transformer_engine")
    assert "Extension transformer_engine: 12 kernels" in res.output
    res = CliRunner().invoke(cli, ["run", "bert-base", "--ext", "nope"])
    assert res.exit_code == 2 and "unknown extension 'nope'" in res.stderr


def test_readme_gpt2_decode_command_runs_at_the_position_limit():
    """GPT-2 has n_positions = 1024 rows in its position table: the cached tokens hold
    positions 0..kv_len-1 and the new ones kv_len..kv_len+seq-1, so kv_len + seq <= 1024.
    The README's decode command runs at that limit; one more cached token is refused
    with a message that says why."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    line = re.search(r"^wia-hw run gpt2 --phase decode [^#\n]*", readme, flags=re.M)
    assert line is not None
    args = line.group(0).split()[1:]
    res = _cli(*args, "--json")
    assert res.exit_code == 0, res.output
    params = json.loads(res.output)["params"]
    n_positions = 1024
    assert params["phase"] == "decode" and params["kv_len"] + params["seq"] == n_positions
    over = [a if a != str(params["kv_len"]) else str(params["kv_len"] + 1) for a in args]
    res = _cli(*over)
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"wia-hw: error: gpt2: kv_len must be in 1..{n_positions - 1}, got {n_positions} "
        f"(GPT-2 has n_positions={n_positions}: the kv_len cached tokens and the seq new "
        f"ones take positions 0..kv_len+seq-1, so kv_len + seq <= {n_positions})"
    )
    res = _cli("run", "gpt2", "--phase", "decode", "--kv-len", "1000", "--seq", "25")
    assert res.exit_code == 2
    assert "gpt2: seq must be in 1..24, got 25 (GPT-2 has n_positions=1024" in res.output


def test_cli_small_run_shows_significant_figures_not_zeros():
    """A 512^3 GEMM takes microseconds: its rows, latency, floor and GFLOP read with
    3 significant digits, not 0.00."""
    import re

    res = _cli("run", "gemm", "-a", "M=512", "-a", "N=512", "-a", "K=512")
    assert res.exit_code == 0, res.output
    r = wia_hw.run("gemm", M=512, N=512, K=512)
    row = next(line for line in res.output.splitlines() if line.startswith("│ gemm "))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert float(cells[1]) == pytest.approx(r.ops[0].time_ms, rel=5e-3) and cells[1] != "0.00"
    assert cells[3] == "0.268"
    lat = re.search(r"Latency:\s+(\S+) ms", res.output).group(1)
    assert float(lat) == pytest.approx(r.latency_ms, rel=5e-3)
    floor = re.search(r"Roofline floor: (\S+) ms", res.output).group(1)
    assert float(floor) == pytest.approx(r.roofline_floor_ms, rel=5e-3)


def test_fixed_keeps_large_values_and_gives_small_ones_three_digits():
    from wia_hw.cli._run import column_places, fixed

    assert fixed(28.8712, 2) == "28.87" and fixed(0.0, 2) == "0.00"
    assert fixed(0.004581, 2) == "0.00458" and fixed(0.5, 1) == "0.500"
    assert column_places([16.73, 0.06, 0.0], 2) == 2  # BERT-Large's rows as before
    assert column_places([0.00458, 0.00104], 2) == 5


def test_cli_run_header_names_the_dims_used(tmp_path):
    """An ONNX run's header shows its fixed dims (-s, -a NAME=N), a builder's the
    arguments given; BERT-Large's reads as before."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 4], np.zeros(64, dtype=np.float32))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mlp", [x], [y], [w])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(g), path)
    first = {
        ("run", str(path), "-a", "N=8"): "mlp (N=8) on ",
        ("run", "gemm", "-a", "M=64", "-a", "N=8", "-a", "K=64"): "gemm (batch=1, M=64, N=8, K=64)",
        ("run", "bert-base", "-b", "2", "-s", "16", "-a", "layers=1"): (
            "bert-base (batch=2, seq=16, layers=1) on "
        ),
    }
    for args, head in first.items():
        res = _cli(*args)
        assert res.exit_code == 0, res.output
        assert res.output.splitlines()[0].startswith(head), res.output.splitlines()[0]


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_a_bad_seed_is_one_line_not_a_numpy_traceback(seed):
    """A negative seed reached numpy's generator in functional mode (a 41-line
    traceback); every entry point refuses it in one line."""
    with pytest.raises(WorkloadError, match=r"^seed must be a non-negative integer, got "):
        wia_hw.run("gemm", M=8, N=8, K=8, mode="functional", seed=seed)
    with pytest.raises(WorkloadError, match=r"^seed must be a non-negative integer"):
        wia_hw.open_device(seed=seed)
    if seed == -1:
        res = CliRunner().invoke(
            cli,
            [
                "run",
                "gemm",
                "-a",
                "M=8",
                "-a",
                "N=8",
                "-a",
                "K=8",
                "--seed",
                "-1",
                "--mode",
                "functional",
            ],
        )
        assert res.exit_code == 2
        assert res.output.strip() == "wia-hw: error: seed must be a non-negative integer, got -1"
