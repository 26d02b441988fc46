# amaranth: UnusedElaboratable=no
"""Amaranth-simulator tests of the PIM bank (``wia_hw.rtl.PimBank``) against
``emulator.pim_model``: values, errors, latencies and the issue rule (column commands
pipelined at ``t_ccd``), cycle by cycle.

Convention: ``ctx.set`` the inputs of cycle ``c``, read the outputs of cycle ``c``, then
``ctx.tick()`` (rising edge ``c + 1``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from amaranth.sim import Simulator
from wia_hw.emulator import pim_model as pm
from wia_hw.rtl import PimBank

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

R, C = pm.PimRequest, pm.PimCommand
G, S, BANK = pm.Operand.grf, pm.Operand.srf, pm.Operand.bank()


def op(o: pm.PimOp, col: int = 0, **kw: Any) -> pm.PimRequest:
    return R(cmd=C.OP, col=col, instr=pm.PimInstr(op=o, **kw))


def run_pim(
    reqs: list[pm.PimRequest], timing: pm.PimTiming, *, gap: bool, rows: int = 2, cols: int = 2
) -> list[dict]:
    """Issue ``reqs`` in order (back to back, or with idle cycles when ``gap``); return
    each command's acceptance cycle, latency, error flag and RD data. ``cmd_ready`` is
    checked against ``pim_model.issue_interval`` in every cycle a command is offered."""
    dut = PimBank(
        rows=rows,
        cols=cols,
        t_rcd=timing.t_rcd,
        t_rp=timing.t_rp,
        t_cl=timing.t_cl,
        t_wr=timing.t_wr,
        t_ccd=timing.t_ccd,
    )
    model = pm.PimBank(rows=rows, cols=cols, timing=timing)
    seen: list[dict] = []
    rng = np.random.default_rng(11)

    async def tb(ctx: Any) -> None:
        queue, in_flight = list(reqs), []
        prev: tuple[int, bool] | None = None
        last_accept = 0
        for c in range(40 * len(reqs) + 50):
            if not queue and not in_flight:
                break
            valid = bool(queue) and not (gap and rng.random() < 0.4)
            if queue:
                q = queue[0]
                ctx.set(dut.cmd, int(q.cmd))
                ctx.set(dut.row, q.row)
                ctx.set(dut.col, q.col)
                ctx.set(dut.instr, q.word)
                for i, v in enumerate(q.data or (0,) * pm.LANES):
                    ctx.set(dut.wdata[i], v)
            ctx.set(dut.cmd_valid, valid)
            if ctx.get(dut.done):
                obs = in_flight.pop(0)
                obs.update(
                    latency=c - obs["accept"],
                    error=ctx.get(dut.error),
                    rdata=[ctx.get(dut.rdata[i]) for i in range(pm.LANES)],
                )
                seen.append(obs)
            if queue:
                cur = model.request_timing(queue[0])
                earliest = 0 if prev is None else last_accept + pm.issue_interval(prev, cur, timing)
                assert ctx.get(dut.cmd_ready) == (c + 1 >= earliest), (
                    f"cycle {c}: cmd_ready for {queue[0].cmd.name}, earliest edge {earliest}"
                )
            if valid and ctx.get(dut.cmd_ready):
                q = queue.pop(0)
                prev, last_accept = model.request_timing(q), c + 1
                try:
                    data = model.execute(q)
                except pm.PimError:
                    data = None
                in_flight.append({"req": q, "accept": c + 1, "model": data})
            await ctx.tick()
        assert not queue and not in_flight

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return seen


def directed_program(rng: np.random.Generator) -> list[pm.PimRequest]:
    data = lambda: tuple(int(v) for v in rng.integers(-32768, 32768, pm.LANES))  # noqa: E731
    return [
        R(cmd=C.RD, col=0),  # error: no open row
        R(cmd=C.ACT, row=1),
        R(cmd=C.RD, col=1),  # RD right after ACT (forwarded state)
        R(cmd=C.ACT, row=0),  # error: row 1 still open
        R(cmd=C.WR, col=0, data=data()),
        R(cmd=C.WR, col=1, data=data()),
        R(cmd=C.RD, col=0),
        R(cmd=C.RD, col=1),  # reads right behind the writes
        R(cmd=C.WRSRF, data=data()),
        op(pm.PimOp.FILL, 0, dst=G(0), src0=BANK),
        op(pm.PimOp.FILL, 1, dst=G(1), src0=BANK),
        op(pm.PimOp.ADD, dst=G(2), src0=G(0), src1=G(1)),  # reads the FILLs in flight
        op(pm.PimOp.MUL, dst=G(3), src0=G(0), src1=S(2)),
        op(pm.PimOp.MAC, 1, dst=G(2), src0=BANK, src1=G(1)),
        op(pm.PimOp.MAC, 0, dst=G(2), src0=BANK, src1=G(3)),  # back-to-back accumulation
        op(pm.PimOp.MAD, 0, dst=BANK, src0=G(2), src1=G(3), src2=S(7)),
        R(cmd=C.RD, col=0),  # reads the MAD's result
        op(pm.PimOp.RELU, 1, dst=BANK, src0=G(2)),
        op(pm.PimOp.MOV, 0, dst=G(4), src0=S(1)),
        R(cmd=C.OP, col=0, instr=0),  # error: opcode 0
        R(cmd=C.RD, col=0),
        R(cmd=C.RD, col=1),
        R(cmd=C.RD, col=2),  # last: bad column
        R(cmd=C.PRE),
        R(cmd=C.PRE),  # second PRE: no-op
        op(pm.PimOp.ADD, dst=G(5), src0=G(4), src1=G(4)),  # no bank operand: legal closed
        op(pm.PimOp.MOV, 0, dst=G(6), src0=BANK),  # error: bank closed
        R(cmd=C.ACT, row=1),
        R(cmd=C.RD, col=1),
        R(cmd=C.RD, col=0),
        R(cmd=C.PRE),
        R(cmd=C.ACT, row=2),  # error: row out of range
    ]


TIMINGS = [
    pm.PimTiming(t_rcd=3, t_rp=2, t_cl=2, t_wr=1, t_ccd=1),
    pm.PimTiming(t_rcd=3, t_rp=2, t_cl=5, t_wr=3, t_ccd=2),
    pm.PimTiming(t_rcd=1, t_rp=1, t_cl=1, t_wr=1, t_ccd=1),
    pm.PimTiming(t_rcd=4, t_rp=3, t_cl=9, t_wr=2, t_ccd=3),
]


@pytest.mark.parametrize(
    ("timing", "gap"),
    [(TIMINGS[0], False), (TIMINGS[1], True), (TIMINGS[2], False), (TIMINGS[3], True)],
    ids=lambda v: (
        f"cl{v.t_cl}-ccd{v.t_ccd}" if hasattr(v, "t_cl") else ("gaps" if v else "back_to_back")
    ),
)
def test_pim_bank_against_model(gap: bool, timing: pm.PimTiming) -> None:
    rng = np.random.default_rng(5)
    reqs = directed_program(rng)
    seen = run_pim(reqs, timing, gap=gap)
    assert len(seen) == len(reqs)
    model = pm.PimBank(rows=2, cols=2, timing=timing)
    for obs in seen:
        q = obs["req"]
        lat = model.latency(q)
        assert (obs["latency"], obs["error"]) == (lat, int(lat == 1 and _illegal(model, q))), q
        try:
            data = model.execute(q)
        except pm.PimError:
            data = None
        if data is not None:
            assert obs["rdata"] == list(data), q
    assert sum(o["error"] for o in seen) == 6


def _illegal(model: pm.PimBank, q: pm.PimRequest) -> bool:
    try:
        model.check(q)
    except pm.PimError:
        return True
    return False


def test_back_to_back_program_takes_program_cycles() -> None:
    """A legal program issued back to back: first acceptance to last done equals
    ``program_cycles``, and column commands really overlap (fewer cycles than the sum
    of their latencies)."""
    timing = pm.PimTiming(t_rcd=4, t_rp=3, t_cl=7, t_wr=2, t_ccd=2)
    rng = np.random.default_rng(8)
    reqs = [R(cmd=C.ACT, row=0)]
    reqs += [
        R(cmd=C.WR, col=c % 4, data=tuple(int(v) for v in rng.integers(-9, 9, 16)))
        for c in range(4)
    ]
    reqs += [R(cmd=C.RD, col=c % 4) for c in range(6)]
    reqs += [op(pm.PimOp.MAC, c % 4, dst=G(0), src0=BANK, src1=G(1)) for c in range(5)]
    reqs += [R(cmd=C.PRE)]
    seen = run_pim(reqs, timing, gap=False, rows=1, cols=4)
    first = seen[0]["accept"]
    last_done = seen[-1]["accept"] + seen[-1]["latency"]
    assert last_done - first == pm.program_cycles(reqs, timing)
    assert pm.program_cycles(reqs, timing) < sum(pm.command_cycles(q, timing) for q in reqs)
