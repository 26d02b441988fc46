"""cocotb testbench of ``PerfCounters``: random events, clears and reads against a model
of the four counters (register map ``REGISTER_MAP``, names = emulator ``Counter`` values)."""

from __future__ import annotations

from typing import Any

import cocotb
import numpy as np
from tb_common import Cycler, params, seed, start_clock_and_reset
from wia_hw.emulator.counters import Counter
from wia_hw.rtl.perf_counters import REGISTER_MAP

P = params()
WIDTH, MAX_MACS = P["width"], P["max_macs_per_cycle"]
MASK = (1 << WIDTH) - 1


class CounterModel:
    def __init__(self) -> None:
        self.regs = {Counter(name): 0 for name in REGISTER_MAP}

    def step(self, enable: int, macs: int, stall: int, clear: int) -> None:
        r = self.regs
        if clear:
            for k in r:
                r[k] = 0
        elif enable:
            r[Counter.CYCLES] = (r[Counter.CYCLES] + 1) & MASK
            r[Counter.BUSY_CYCLES] = (r[Counter.BUSY_CYCLES] + (macs != 0)) & MASK
            r[Counter.MACS] = (r[Counter.MACS] + macs) & MASK
            r[Counter.STALL_CYCLES] = (r[Counter.STALL_CYCLES] + stall) & MASK


@cocotb.test()
async def random_events(dut: Any) -> None:
    """Enable/macs/stall random for thousands of cycles (the 12-bit counters wrap),
    a rare clear, and a read of a random address every cycle (latency 1)."""
    rng = np.random.default_rng(seed())
    await start_clock_and_reset(dut, {"enable": 0, "macs": 0, "stall": 0, "clear": 0, "addr": 0})
    cyc = Cycler(dut)
    model = CounterModel()
    prev_addr, prev_value = 0, 0
    wrapped = False
    for n in range(3000):
        await cyc.drive_phase()
        got = int(dut.rdata.value)
        if n > 0:
            assert got == prev_value, (
                f"cycle {n}: rdata[{REGISTER_MAP[prev_addr]}] = {got}, model {prev_value}"
            )
        enable = int(rng.random() < 0.8)
        macs = int(rng.choice([0, MAX_MACS, int(rng.integers(0, MAX_MACS + 1))]))
        stall = int(rng.random() < 0.3)
        clear = int(rng.random() < 0.002)
        addr = int(rng.integers(0, len(REGISTER_MAP)))
        for name, v in (
            ("enable", enable),
            ("macs", macs),
            ("stall", stall),
            ("clear", clear),
            ("addr", addr),
        ):
            getattr(dut, name).value = v
        prev_addr, prev_value = addr, model.regs[Counter(REGISTER_MAP[addr])]
        before = model.regs[Counter.MACS]
        model.step(enable, macs, stall, clear)
        wrapped |= model.regs[Counter.MACS] < before and not clear
    assert wrapped, "the MAC counter never wrapped; widen the run"
