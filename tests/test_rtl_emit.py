# amaranth: UnusedElaboratable=no
"""Verilog emission: every block emits, with the top module and the ports (names,
directions, widths) that the cocotb testbenches in ``tests/rtl/`` rely on; the registry
and the ``wia-hw rtl`` commands reject bad input with one-line messages."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from wia_hw.emulator import pim_model as pm
from wia_hw.rtl import BLOCKS, build, emit

from wia_hw.cli._rtl import rtl

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

PORT_RE = re.compile(r"^\s*(input|output)\s+(?:signed\s+)?(?:\[(\d+):0\]\s+)?(\w+);", re.M)


def ports_of(verilog: str, module: str) -> dict[str, tuple[str, int]]:
    """``{port: (direction, width)}`` of ``module`` in ``verilog``."""
    body = re.search(rf"^module {module}\(.*?^endmodule", verilog, re.M | re.S)
    assert body, f"module {module} not found"
    return {name: (d, int(hi) + 1 if hi else 1) for d, hi, name in PORT_RE.findall(body.group(0))}


def arr(name: str, n: int, d: str, w: int) -> dict[str, tuple[str, int]]:
    return {f"{name}__{i}": (d, w) for i in range(n)}


CLOCK = {"clk": ("input", 1), "rst": ("input", 1)}
#: Blocks without a clock (purely combinational).
COMBINATIONAL = {"fp_mac"}

EXPECTED = {
    ("pe", (("dataflow", "os"),)): {
        **CLOCK,
        "a_in": ("input", 8),
        "b_in": ("input", 8),
        "valid_in": ("input", 1),
        "first_in": ("input", 1),
        "shift": ("input", 1),
        "acc_in": ("input", 32),
        "a_out": ("output", 8),
        "b_out": ("output", 8),
        "valid_out": ("output", 1),
        "first_out": ("output", 1),
        "acc": ("output", 32),
        "mac": ("output", 1),
    },
    ("pe", (("dataflow", "ws"),)): {
        **CLOCK,
        "x_in": ("input", 8),
        "valid_in": ("input", 1),
        "w_in": ("input", 8),
        "load": ("input", 1),
        "psum_in": ("input", 32),
        "x_out": ("output", 8),
        "valid_out": ("output", 1),
        "w": ("output", 8),
        "psum_out": ("output", 32),
        "mac": ("output", 1),
    },
    ("systolic_array", (("rows", 4), ("cols", 8), ("dataflow", "ws"), ("max_depth", 64))): {
        **CLOCK,
        "start": ("input", 1),
        "depth": ("input", 7),
        "stall": ("input", 1),
        **arr("a", 4, "input", 8),
        **arr("b", 8, "input", 8),
        "idle": ("output", 1),
        "a_ready": ("output", 1),
        "b_ready": ("output", 1),
        **arr("out", 8, "output", 32),
        "out_valid": ("output", 1),
        "done": ("output", 1),
        "ctr_addr": ("input", 2),
        "ctr_clear": ("input", 1),
        "ctr_rdata": ("output", 48),
    },
    ("perf_counters", (("max_macs_per_cycle", 64), ("width", 12))): {
        **CLOCK,
        "enable": ("input", 1),
        "macs": ("input", 7),
        "stall": ("input", 1),
        "clear": ("input", 1),
        "addr": ("input", 2),
        "rdata": ("output", 12),
    },
    ("pim_bank", (("rows", 8), ("cols", 4))): {
        **CLOCK,
        "cmd_valid": ("input", 1),
        "cmd_ready": ("output", 1),
        "cmd": ("input", 3),
        "row": ("input", 16),
        "col": ("input", 8),
        "instr": ("input", 32),
        **arr("wdata", 16, "input", 16),
        "done": ("output", 1),
        "error": ("output", 1),
        **arr("rdata", 16, "output", 16),
        "row_open": ("output", 1),
    },
    (
        "frontend",
        (
            ("precision_bits", 6),
            ("matrix_size_limit", 3),
            ("in_bits", 10),
            ("det_bits", 12),
            ("acc_bits", 16),
        ),
    ): {
        **CLOCK,
        "dac_valid": ("input", 1),
        "dac_shift": ("input", 4),
        **arr("dac_in", 3, "input", 10),
        **arr("dac_out", 3, "output", 6),
        "dac_out_valid": ("output", 1),
        "det_valid": ("input", 1),
        "det_last": ("input", 1),
        "adc_shift": ("input", 4),
        **arr("det_p", 3, "input", 12),
        **arr("det_n", 3, "input", 12),
        **arr("adc_out", 3, "output", 6),
        "adc_valid": ("output", 1),
        "adc_last": ("output", 1),
        **arr("acc_out", 3, "output", 16),
        "acc_valid": ("output", 1),
    },
    ("fp_mac", (("fmt", "bf16"),)): {
        "a": ("input", 16),
        "b": ("input", 16),
        "c": ("input", 32),
        "y": ("output", 32),
    },
}


@pytest.mark.parametrize(
    ("block", "params"),
    list(EXPECTED),
    ids=[f"{b}-{'-'.join(str(v) for _, v in p)}" for b, p in EXPECTED],
)
def test_emitted_ports(block: str, params: tuple, tmp_path: Path) -> None:
    paths = emit(block, dict(params), tmp_path / "out")
    assert paths == [tmp_path / "out" / f"{block}.v"]
    text = paths[0].read_text()
    assert ports_of(text, block) == EXPECTED[(block, params)]
    assert "/work/" not in text and "src =" not in text  # emit_src=False


@pytest.mark.parametrize("block", list(BLOCKS))
def test_every_block_emits_with_defaults(block: str, tmp_path: Path) -> None:
    info = BLOCKS[block]
    assert set(info.docs) == set(info.defaults)
    (path,) = emit(block, None, tmp_path)
    text = path.read_text()
    assert re.search(rf"^module {block}\(", text, re.M)
    assert ("clk" in ports_of(text, block)) != (block in COMBINATIONAL)


def test_pim_encodings_match_model() -> None:
    from wia_hw.rtl.pim_bank import INSTR_LAYOUT, OPERAND_KINDS, PIM_COMMANDS, PIM_OPCODES

    assert PIM_COMMANDS == {c.name: c.value for c in pm.PimCommand}
    assert PIM_OPCODES == {o.name: o.value for o in pm.PimOp}
    assert OPERAND_KINDS == {k.name: k.value for k in pm.OperandKind}
    offsets = {name: (f.offset, f.width) for name, f in INSTR_LAYOUT}
    assert {n: (lsb, w) for n, lsb, w in pm.INSTR_FIELDS} == {
        n: v for n, v in offsets.items() if n != "reserved"
    }
    bank = build("pim_bank")
    assert bank.timing == {k: getattr(pm.PimTiming(), k) for k in bank.timing}


def test_build_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match=r"unknown block 'alu'; choose from pe, "):
        build("alu")
    with pytest.raises(ValueError, match=r"unknown parameter 'depth' for block 'pe'"):
        build("pe", {"depth": 3})
    with pytest.raises(TypeError, match=r"block must be a string, got 3"):
        build(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"rows must be between 1 and 256, got 300"):
        build("systolic_array", {"rows": 300})


def test_cli_list_and_emit(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(rtl, ["list"])
    assert out.exit_code == 0
    for block in BLOCKS:
        assert f"{block}:" in out.output
    res = runner.invoke(
        rtl,
        [
            "emit",
            "systolic_array",
            "--param",
            "rows=2",
            "-p",
            "cols=3",
            "--param",
            "dataflow=ws",
            "-o",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    path = tmp_path / "systolic_array.v"
    assert res.output.strip() == str(path)
    assert set(arr("out", 3, "output", 32)) <= set(ports_of(path.read_text(), "systolic_array"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["emit", "alu"], "unknown block 'alu'"),
        (["emit", "pe", "--param", "dataflow"], "'dataflow' must read NAME=VALUE"),
        (["emit", "pe", "--param", "rows=2"], "unknown parameter 'rows' for pe"),
        (["emit", "pe", "--param", "dataflow=xs"], "dataflow must be one of 'os', 'ws', got 'xs'"),
        (["emit", "systolic_array", "-p", "rows=0"], "rows must be between 1 and 256, got 0"),
        (["emit", "systolic_array", "--cols", "257"], "cols must be between 1 and 256, got 257"),
        (["emit", "systolic_array", "-p", "pipelined=2"], "pipelined must be a bool, got 2"),
        (["emit", "systolic_array", "-p", "rows=two"], "rows must be an integer, got 'two'"),
        (["emit", "fp_mac", "-p", "fmt=fp32"], "fmt must be one of 'fp16', 'bf16', got 'fp32'"),
        # two values for one parameter: refused, not one silently taken
        (
            ["emit", "systolic_array", "--rows", "8", "-p", "rows=16"],
            "--rows 8 contradicts --param rows=16",
        ),
        (
            ["emit", "systolic_array", "-p", "cols=4", "-p", "cols=8"],
            "cols is given twice (4 and 8)",
        ),
    ],
)
def test_cli_bad_input_is_a_usage_error(args: list[str], message: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(rtl, [*args, "-o", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output
    assert not list(tmp_path.iterdir())


def test_cli_rows_cols_options_and_bool_params(tmp_path: Path) -> None:
    """--rows/--cols are shorthands for --param; true/false become bools; the array is
    emitted as one top module with one row module and one PE module."""
    res = CliRunner().invoke(
        rtl,
        [
            "emit",
            "systolic_array",
            "--rows",
            "3",
            "--cols",
            "5",
            "-p",
            "pipelined=true",
            "-p",
            "precision=int8x2",
            "-o",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    text = (tmp_path / "systolic_array.v").read_text()
    ports = ports_of(text, "systolic_array")
    # int8x2 os: two int8 lanes per a/b element, one int32 per output column
    assert {
        **arr("a", 6, "input", 8),
        **arr("b", 10, "input", 8),
        **arr("out", 5, "output", 32),
    }.items() <= ports.items()
    assert sorted(re.findall(r"^module (\w+)\(", text, re.M)) == [
        "systolic_array",
        "systolic_array_pe",
        "systolic_array_row",
    ]
    assert len(re.findall(r"^\s*systolic_array_row \S+ \(", text, re.M)) == 3
    assert len(re.findall(r"^\s*systolic_array_pe \S+ \(", text, re.M)) == 5


def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path):
    from click.testing import CliRunner

    from wia_hw.cli import cli

    (tmp_path / "pe.v").write_text("")  # a file where the folder should be
    out = tmp_path / "pe.v" / "sub"
    res = CliRunner().invoke(cli, ["rtl", "emit", "pe", "-o", str(out)])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"wia-hw: error: cannot write {out / 'pe.v'}: Not a directory"
    ]
