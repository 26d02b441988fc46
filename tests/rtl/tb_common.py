"""Shared pieces of the cocotb testbenches (imported inside the simulator process).

Cycle convention used by every testbench: the clock has a 10 ns period; the testbench
acts once per cycle, at the falling edge (the middle of the cycle): it writes the inputs
for the next rising edge, waits for ``ReadOnly`` (so combinational outputs reflect those
inputs) and samples the outputs. ``cycle`` counts rising edges, so the sample taken in
cycle ``c`` is what the design shows in the period after rising edge ``c``; the edge that
samples an input written in cycle ``c`` is edge ``c + 1``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

__all__ = [
    "Cycler",
    "params",
    "ports",
    "quick",
    "seed",
    "signed_value",
    "start_clock_and_reset",
    "unsigned_value",
]


def params() -> dict[str, Any]:
    """The block parameters the pytest runner passed (``WIA_TB_PARAMS``, JSON)."""
    return json.loads(os.environ.get("WIA_TB_PARAMS", "{}"))


def seed() -> int:
    """The seed the pytest runner passed (``WIA_TB_SEED``)."""
    return int(os.environ.get("WIA_TB_SEED", "0"))


def quick() -> bool:
    """True if the runner asked for the reduced transaction set (``WIA_TB_QUICK=1``)."""
    return os.environ.get("WIA_TB_QUICK", "0") == "1"


def ports(dut: Any, name: str, n: int) -> list[Any]:
    """Handles of an Amaranth array port flattened as ``name__0 .. name__{n-1}``."""
    return [getattr(dut, f"{name}__{i}") for i in range(n)]


async def start_clock_and_reset(dut: Any, inputs: dict[str, int], cycles: int = 2) -> None:
    """Drive every input (``inputs``: handle name -> value) before the clock starts, then
    hold ``rst`` for ``cycles`` rising edges and release it."""
    for name, value in inputs.items():
        getattr(dut, name).value = value
    dut.rst.value = 1
    Clock(dut.clk, 10, unit="ns").start()
    for _ in range(cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0


class Cycler:
    """Steps the simulation one clock cycle at a time (see the module docstring)."""

    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.cycle = 0

    async def drive_phase(self) -> None:
        """Wait for the middle of the next cycle; inputs may be written after this."""
        await FallingEdge(self.dut.clk)
        self.cycle += 1

    async def sample_phase(self) -> None:
        """Let combinational logic settle on the inputs just written; read after this."""
        await ReadOnly()


def signed_value(handle: Any) -> int:
    return handle.value.to_signed()


def unsigned_value(handle: Any) -> int:
    return handle.value.to_unsigned()
