"""Run the cocotb testbenches of ``tests/rtl/`` on Icarus Verilog (pytest runner file).

Each case emits the block's Verilog with ``wia_hw.rtl.emit``, compiles it with
``iverilog`` into its own folder ``sim_build/<block>_<params>/`` (so cases can run in
parallel) and runs one testbench module in it. ``WAVES=1`` writes ``<block>.fst`` there.
``WIA_SIM_BUILD`` moves the build root. Skipped only if ``iverilog`` is not on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from wia_hw.emulator.pim_model import PimTiming
from wia_hw.rtl import emit

ROOT = Path(__file__).resolve().parent.parent
TB_DIR = Path(__file__).resolve().parent / "rtl"
SIM_BUILD = Path(os.environ.get("WIA_SIM_BUILD", ROOT / "sim_build"))

pytestmark = pytest.mark.skipif(
    shutil.which("iverilog") is None,
    reason="Icarus Verilog (iverilog) is not on PATH; the cocotb RTL tests need it",
)


def _tag(params: dict[str, Any]) -> str:
    return "_".join(f"{k}{v}" for k, v in params.items()) or "default"


def run_cocotb(
    block: str, params: dict[str, Any], tb_module: str, seed: int = 1, quick: bool = False
) -> Path:
    """Emit, build and run ``tb_module`` against ``block``; return the build folder.

    ``quick`` asks the testbench for its reduced transaction set (large builds)."""
    from cocotb_tools.runner import get_runner

    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    build_dir = SIM_BUILD / f"{block}_{_tag(params)}"
    if build_dir.exists():
        shutil.rmtree(build_dir)
    sources = emit(block, params, build_dir)
    if str(TB_DIR) not in sys.path:  # the simulator's Python imports the testbench
        sys.path.insert(0, str(TB_DIR))
    waves = os.environ.get("WAVES", "0") == "1"
    runner = get_runner("icarus")
    runner.build(
        sources=sources,
        hdl_toplevel=block,
        build_dir=build_dir,
        always=True,
        waves=waves,
        timescale=("1ns", "1ps"),
    )
    try:
        runner.test(
            hdl_toplevel=block,
            test_module=tb_module,
            build_dir=build_dir,
            test_dir=build_dir,
            waves=waves,
            extra_env={
                "WIA_TB_PARAMS": json.dumps(params),
                "WIA_TB_SEED": str(seed),
                "WIA_TB_QUICK": "1" if quick else "0",
            },
        )
    except SystemExit as e:  # cocotb's runner exits when a testbench test fails
        pytest.fail(
            f"cocotb testbench {tb_module} failed on {block} {params} "
            f"(exit {e.code}); log and results in {build_dir}",
            pytrace=False,
        )
    return build_dir


@pytest.mark.parametrize("dataflow", ["os", "ws"])
def test_pe(dataflow: str) -> None:
    run_cocotb("pe", {"dataflow": dataflow}, "tb_pe")


#: Unpipelined int8 arrays (the pipelined cases below cover other shapes; 16x16 os is
#: left out to keep the suite's time: 32x32 os pipelined covers the large os array).
SHAPES = [(2, 2, "os"), (2, 2, "ws"), (4, 8, "os"), (4, 8, "ws"), (16, 16, "ws")]


@pytest.mark.parametrize(
    ("rows", "cols", "dataflow"), SHAPES, ids=[f"{r}x{c}-{d}" for r, c, d in SHAPES]
)
def test_systolic_array(rows: int, cols: int, dataflow: str) -> None:
    run_cocotb(
        "systolic_array",
        {"rows": rows, "cols": cols, "dataflow": dataflow, "max_depth": 64},
        "tb_systolic_array",
        seed=rows * 100 + cols + (dataflow == "ws"),
    )


#: Pipelined (double-buffered) arrays, incl. non-square and rows > typical depths.
PIPELINED_SHAPES = [(3, 5), (8, 4)]


@pytest.mark.parametrize("dataflow", ["os", "ws"])
@pytest.mark.parametrize(
    ("rows", "cols"), PIPELINED_SHAPES, ids=[f"{r}x{c}" for r, c in PIPELINED_SHAPES]
)
def test_systolic_array_pipelined(rows: int, cols: int, dataflow: str) -> None:
    run_cocotb(
        "systolic_array",
        {"rows": rows, "cols": cols, "dataflow": dataflow, "max_depth": 64, "pipelined": True},
        "tb_systolic_array",
        seed=7000 + rows * 100 + cols + (dataflow == "ws"),
    )


#: (precision, rows, cols, dataflow, pipelined): two int8 MACs per PE per cycle, the
#: fp16 / bf16 MAC (fp32 accumulation) and the fp32 MAC (one per 4 cycles) on small arrays.
MODES = [
    ("int8x2", 4, 4, "os", True),
    ("int8x2", 3, 2, "ws", True),
    ("int8x2", 2, 3, "os", False),
    ("fp16", 2, 2, "os", True),
    ("fp16", 4, 4, "ws", True),
    ("bf16", 4, 4, "os", False),
    ("bf16", 2, 2, "ws", True),
    ("fp32", 4, 4, "os", True),
    ("fp32", 4, 4, "ws", False),
]


@pytest.mark.parametrize(
    ("precision", "rows", "cols", "dataflow", "pipelined"),
    MODES,
    ids=[f"{p}-{r}x{c}-{d}-{'pipe' if q else 'single'}" for p, r, c, d, q in MODES],
)
def test_systolic_array_modes(
    precision: str, rows: int, cols: int, dataflow: str, pipelined: bool
) -> None:
    run_cocotb(
        "systolic_array",
        {
            "rows": rows,
            "cols": cols,
            "dataflow": dataflow,
            # fp32 streams 4 steps per element: 16 elements are 64 steps, like the rest
            "max_depth": 16 if precision == "fp32" else 64,
            "pipelined": pipelined,
            "precision": precision,
        },
        "tb_systolic_array",
        seed=sum(map(ord, precision)) + rows * 10 + cols + (dataflow == "ws"),
    )


def test_systolic_array_32x32() -> None:
    """A larger shape (32x32, output-stationary, pipelined; most of its time is Icarus),
    with the testbench's reduced transaction set."""
    run_cocotb(
        "systolic_array",
        {"rows": 32, "cols": 32, "dataflow": "os", "max_depth": 64, "pipelined": True},
        "tb_systolic_array",
        seed=3232,
        quick=True,
    )


def test_perf_counters() -> None:
    run_cocotb("perf_counters", {"max_macs_per_cycle": 64, "width": 12}, "tb_perf_counters")


@pytest.mark.parametrize(
    "timing",
    [
        PimTiming(),
        PimTiming(t_rcd=1, t_rp=1, t_cl=1, t_wr=1, t_ccd=1),
        PimTiming(t_rcd=5, t_rp=4, t_cl=9, t_wr=3, t_ccd=3),
    ],
    ids=["hbm2", "all1", "cl9-ccd3"],
)
def test_pim_bank(timing: PimTiming) -> None:
    params = {
        "rows": 8,
        "cols": 4,
        "t_rcd": timing.t_rcd,
        "t_rp": timing.t_rp,
        "t_cl": timing.t_cl,
        "t_wr": timing.t_wr,
        "t_ccd": timing.t_ccd,
    }
    run_cocotb("pim_bank", params, "tb_pim_bank", seed=timing.t_rcd)


@pytest.mark.parametrize("precision_bits", [4, 5, 6, 7, 8])
def test_frontend(precision_bits: int) -> None:
    run_cocotb(
        "frontend",
        {"precision_bits": precision_bits, "matrix_size_limit": 4},
        "tb_frontend",
        seed=precision_bits,
    )


def test_frontend_narrow_detectors() -> None:
    run_cocotb(
        "frontend",
        {
            "precision_bits": 6,
            "matrix_size_limit": 3,
            "in_bits": 10,
            "det_bits": 12,
            "acc_bits": 16,
        },
        "tb_frontend",
        seed=11,
    )


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_fp_mac(fmt: str) -> None:
    """The combinational fp16/bf16 MAC: ~3600 corner + 3000 random samples, bit-exact."""
    run_cocotb("fp_mac", {"fmt": fmt}, "tb_fp_mac", seed=16 if fmt == "fp16" else 8)
