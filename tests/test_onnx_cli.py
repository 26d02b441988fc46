"""``wia-hw import MODEL``: the report, and one error line with exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from wia_hw.cli import cli  # noqa: E402

DATA = Path(__file__).parent / "data" / "onnx"


def run(*args: str):
    return CliRunner().invoke(cli, ["import", *args])


def test_import_prints_ops_macs_parameters_and_bytes():
    r = run(str(DATA / "resnet50.legacy.onnx"), "--dim", "batch=1")
    assert r.exit_code == 0, r.output
    assert "conv2d" in r.output and "53" in r.output  # 53 convolutions
    assert "MACs:        4,089,184,256 (4.09 GMAC)" in r.output
    assert "Parameters:" in r.output and "Weights:" in r.output


def test_import_of_a_transformer_with_named_dims():
    r = run(str(DATA / "bert_large_2l.dynamo.onnx"), "--dim", "batch=1", "--dim", "seq=128")
    assert r.exit_code == 0, r.output
    assert "softmax" in r.output and "layer_norm" in r.output
    # the legacy export writes GELU as Erf arithmetic: kept with --no-patterns
    args = [str(DATA / "bert_large_2l.legacy.onnx"), "--dim", "batch=1", "--dim", "seq=128"]
    fused, raw = run(*args), run(*args, "--no-patterns")
    assert fused.exit_code == raw.exit_code == 0
    assert "gelu" in fused.output and "erf" not in fused.output
    assert "erf" in raw.output and "gelu" not in raw.output


def test_unsupported_ops_exit_2_with_one_line_naming_all(tmp_path):
    import onnx

    nodes = [
        helper.make_node("Hardmax", ["x"], ["a"]),
        helper.make_node("Hardmax", ["a"], ["b"]),
        helper.make_node("EyeLike", ["b"], ["c"]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    r = CliRunner().invoke(cli, ["import", str(path)])
    assert r.exit_code == 2
    assert r.output.splitlines() == [
        f"wia-hw: error: {path}: 2 unsupported ONNX op types: Hardmax x2, EyeLike x1"
    ]
    assert "Traceback" not in r.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--dim", "seq"], r"--dim 'seq': expected NAME=VALUE with a positive integer VALUE"),
        (["--dim", "seq=0"], r"--dim 'seq=0': expected NAME=VALUE"),
        ([], r"ONNX input 'input_ids': dimension 1 \('seq'\) is not fixed"),
    ],
)
def test_bad_input_is_one_line(args, message):
    import re

    r = run(str(DATA / "bert_large_2l.legacy.onnx"), "--batch", "1", *args)
    assert r.exit_code == 2 and len(r.output.splitlines()) == 1
    assert re.search(message, r.output), r.output


def test_missing_file_is_one_line(tmp_path):
    r = run(str(tmp_path / "nope.onnx"))
    assert r.exit_code == 2
    assert r.output == f"wia-hw: error: ONNX file not found: {str(tmp_path / 'nope.onnx')!r}\n"
