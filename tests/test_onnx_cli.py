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


# -- an .onnx file under run: its dims, its precision ---------------------------------


def dynamic_model(path, seq_name="sequence_length"):
    """x [batch, <seq_name>, 16] -> MatMul by a [16, 8] weight -> Relu: dims as Hugging
    Face Optimum (``batch_size``, ``sequence_length``) or tf2onnx (``unk__7``) name them."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w"
    )
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "tf2onnx",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", seq_name, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def run_json(*args):
    import json

    r = CliRunner().invoke(cli, ["run", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_run_fixes_named_dims_by_seq_and_arg(tmp_path):
    hf = dynamic_model(tmp_path / "hf.onnx")
    a = run_json(hf, "--batch", "2", "--seq", "64")
    b = run_json(hf, "--batch", "2", "-a", "sequence_length=64")
    assert a["flops"] == b["flops"] == 2 * 64 * 16 * 8 * 2 + 2 * 64 * 8
    tf = dynamic_model(tmp_path / "tf.onnx", "unk__7")
    assert run_json(tf, "--batch", "2", "-a", "unk__7=64")["flops"] == a["flops"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--batch", "2"],
            r"dimension 1 \('unk__7'\) is not fixed; pass dims=\{'unk__7': N\} "
            r"\(command line: -a unk__7=N; wia-hw import: --dim unk__7=N\)",
        ),
        (
            ["--batch", "2", "-a", "unk__7=4", "-a", "tokens=3"],
            r"the model has no symbolic input dim 'tokens' \(its symbolic dims: batch_size, unk__7\)",
        ),
        (
            ["--batch", "2", "-a", "unk__7=4", "--precision", "int8"],
            r"precision int8 needs the model's quantisation",
        ),
    ],
)
def test_run_refuses_in_one_line(tmp_path, args, message):
    import re

    r = CliRunner().invoke(cli, ["run", dynamic_model(tmp_path / "tf.onnx", "unk__7"), *args])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1, r.output
    assert re.search(message, r.output), r.output


def test_run_at_another_precision_casts_the_float_tensors(tmp_path):
    import numpy as np

    import wia_hw
    from wia_hw.runtime import resolve_workload

    path = dynamic_model(tmp_path / "m.onnx")
    fp32 = run_json(path, "--batch", "2", "--seq", "64")
    fp16 = run_json(path, "--batch", "2", "--seq", "64", "--precision", "fp16")
    assert fp16["precision"] == "fp16" and fp32["precision"] == "fp32"
    assert fp16["flops"] == fp32["flops"]
    g = resolve_workload(path, batch=2, seq=64, precision="bf16")
    assert {t.dtype for t in g.tensors.values()} == {"bf16"}
    x = np.random.default_rng(1).standard_normal((2, 64, 16)).astype(np.float32)
    y = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    # the input and the weight rounded to bf16, the products summed in fp32, the
    # result rounded to bf16 again: within one bf16 step (2^-8 relative) of that
    from wia_hw.emulator.functional import cast_to

    xb, wb = cast_to(x, "bf16"), cast_to(np.asarray(g.weight_values["w"]()), "bf16")
    want = np.maximum(xb.astype(np.float64) @ wb.astype(np.float64), 0)
    np.testing.assert_allclose(y, want, rtol=2**-8, atol=1e-6)
    assert not np.allclose(y, np.maximum(x @ np.asarray(g.weight_values["w"]()), 0), rtol=1e-4)


def optimum_decoder(path):
    """Hugging Face Optimum's decoder-with-past inputs: ``input_ids [batch_size,
    sequence_length]``, ``attention_mask [batch_size, past_sequence_length +
    sequence_length]``, ``past_key [batch_size, 2, past_sequence_length, 8]``; the
    new key (an embedding of the ids) is appended to the past one and the mask
    weights it."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((50, 16)).astype(np.float32), "emb"
    )
    shape = numpy_helper.from_array(np.array([0, -1, 2, 8], np.int64), "split_heads")
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
        helper.make_node("Reshape", ["e", "split_heads"], ["e4"]),
        helper.make_node("Transpose", ["e4"], ["k_new"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["past_key", "k_new"], ["present_key"], axis=2),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axes13"], ["m4"]),
        helper.make_node("Mul", ["present_key", "m4"], ["y"]),
    ]
    axes = numpy_helper.from_array(np.array([1, 3], np.int64), "axes13")
    g = helper.make_graph(
        nodes,
        "decoder_with_past",
        [
            helper.make_tensor_value_info(
                "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
            ),
            helper.make_tensor_value_info(
                "attention_mask",
                TensorProto.INT64,
                ["batch_size", "past_sequence_length + sequence_length"],
            ),
            helper.make_tensor_value_info(
                "past_key", TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length", 8]
            ),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [table, shape, axes],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_dims_written_as_expressions_of_others(tmp_path):
    import numpy as np

    import wia_hw

    path = optimum_decoder(tmp_path / "decoder.onnx")
    g = wia_hw.from_onnx(path, batch=2, dims={"sequence_length": 1, "past_sequence_length": 7})
    assert g.tensors["attention_mask"].shape == (2, 8) and g.tensors["y"].shape == (2, 2, 8, 8)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, (2, 1))
    mask = np.ones((2, 8), np.int64)
    mask[1, :3] = 0  # the second sequence's first three positions are padding
    past = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
    y = wia_hw.run(
        g, mode="functional", inputs={"input_ids": ids, "attention_mask": mask, "past_key": past}
    ).outputs["y"]
    table = np.asarray(g.weight_values["emb"]())
    new = table[ids].reshape(2, 1, 2, 8).transpose(0, 2, 1, 3)
    want = np.concatenate([past, new], axis=2) * mask[:, None, :, None]
    np.testing.assert_allclose(y, want, rtol=1e-6)
    r = CliRunner().invoke(cli, ["run", path, "--batch", "2", "--seq", "1"])
    assert r.exit_code != 0 and "-a past_sequence_length=N" in r.output, r.output
    r = CliRunner().invoke(
        cli, ["run", path, "--batch", "2", "--seq", "1", "-a", "past_sequence_length=7"]
    )
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "param, dims, want",
    [
        ("N/2", {"N": 8}, 4),
        ("2*N - 1", {"N": 8}, 15),
        ("(N + 3) // 4", {"N": 8}, 2),
        ("N/3", {"N": 8}, None),  # not exact
        ("N**2", {"N": 8}, None),  # not an operator wia-hw evaluates
    ],
)
def test_dim_expressions(param, dims, want):
    import wia_hw

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", param])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    if want is None:
        with pytest.raises(wia_hw.WorkloadError, match=r"is not an expression wia-hw evaluates"):
            wia_hw.from_onnx(m, dims=dims)
    else:
        assert wia_hw.from_onnx(m, dims=dims).tensors["x"].shape == (8, want)


def test_an_expression_dim_given_against_its_names_is_refused(tmp_path):
    import re

    import wia_hw

    path = optimum_decoder(tmp_path / "decoder.onnx")
    expr = "past_sequence_length + sequence_length"
    with pytest.raises(
        wia_hw.WorkloadError, match=rf"input dim '{re.escape(expr)}' given as 5, but .* it is 8"
    ):
        wia_hw.from_onnx(
            path, batch=2, dims={"sequence_length": 1, "past_sequence_length": 7, expr: 5}
        )
    ok = wia_hw.from_onnx(
        path, batch=2, dims={"sequence_length": 1, "past_sequence_length": 7, expr: 8}
    )
    assert ok.tensors["attention_mask"].shape == (2, 8)
