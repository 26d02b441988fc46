"""cocotb testbench of ``PimBank``: driver / monitor / golden model / checker.

Golden model and timing: ``emulator.pim_model`` (``PimBank``, ``command_cycles`` via
``PimBank.latency``, the issue rule ``issue_interval``). A random program (row fills,
every op on random int16 data with -32768 and 32767 forced in, GRF/SRF/BANK operands,
illegal commands and words) is issued back to back or with gaps; in every cycle a
command is offered, ``cmd_ready`` must equal the issue rule (column commands pipelined at
``t_ccd``, completions in order); every command's latency from acceptance to ``done``,
its ``error`` flag and every RD result must equal the model's; at the end the whole DRAM
array and every GRF are read back through RD and compared.
"""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass
from typing import Any

import cocotb
import numpy as np
from tb_common import Cycler, params, ports, seed, start_clock_and_reset
from wia_hw.emulator import pim_model as pm
from wia_hw.emulator.pim_model import Operand, OperandKind, PimCommand, PimInstr, PimOp
from wia_hw.emulator.pim_model import PimRequest as Req

P = params()
ROWS, COLS = P["rows"], P["cols"]
TIMING = pm.PimTiming(
    t_rcd=P["t_rcd"], t_rp=P["t_rp"], t_cl=P["t_cl"], t_wr=P["t_wr"], t_ccd=P["t_ccd"]
)
BAD_CMD = 6  # not a command: the bank must report an error


@dataclass
class Issued:
    """A command accepted by the bank, with what the model says about it."""

    req: Req | None  # None for the raw BAD_CMD code
    accept_cycle: int
    latency: int
    error: bool
    data: np.ndarray | None
    column: bool = False  # a legal RD, WR or OP: pipelined at t_ccd


def lanes(rng: np.random.Generator) -> tuple[int, ...]:
    v = rng.integers(-32768, 32768, pm.LANES)
    m = rng.random(pm.LANES)
    v[m < 0.1] = -32768
    v[m > 0.9] = 32767
    return tuple(int(x) for x in v)


class ProgramGenerator:
    """Random, mostly legal command stream that keeps a row open most of the time."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.open = False  # generator's belief (exact: it mirrors the model below)

    def operand(self, allow_srf: bool = True) -> Operand:
        kinds = [OperandKind.GRF, OperandKind.BANK] + ([OperandKind.SRF] if allow_srf else [])
        k = kinds[int(self.rng.integers(0, len(kinds)))]
        return Operand(k, 0 if k is OperandKind.BANK else int(self.rng.integers(0, 8)))

    def instr(self) -> PimInstr:
        op = PimOp(int(self.rng.integers(1, 8)))
        n = pm.OP_INFO[op].sources
        if op is PimOp.FILL:
            return PimInstr(
                op=op, dst=Operand.grf(int(self.rng.integers(0, 8))), src0=Operand.bank()
            )
        dst = (
            Operand.grf(int(self.rng.integers(0, 8)))
            if op is PimOp.MAC
            else self.operand(allow_srf=False)
        )
        srcs = [self.operand() for _ in range(n)] + [None] * (3 - n)
        return PimInstr(op=op, dst=dst, src0=srcs[0], src1=srcs[1], src2=srcs[2])

    def next(self, model: pm.PimBank) -> Req | None:
        r = self.rng.random()
        is_open = model.open_row is not None
        col = int(self.rng.integers(0, COLS + 1 if r < 0.03 else COLS))  # sometimes bad
        if not is_open and r < 0.5:
            return Req(cmd=PimCommand.ACT, row=int(self.rng.integers(0, ROWS + (r < 0.05))))
        if r < 0.04:
            return Req(cmd=PimCommand.PRE)
        if r < 0.05:
            return None  # raw illegal command code
        if r < 0.07:
            return Req(cmd=PimCommand.ACT, row=int(self.rng.integers(0, ROWS)))
        if r < 0.10:
            return Req(cmd=PimCommand.OP, col=col, instr=int(self.rng.integers(0, 2**32)))
        if r < 0.13:
            return Req(cmd=PimCommand.WRSRF, data=lanes(self.rng))
        if r < 0.25:
            return Req(cmd=PimCommand.RD, col=col)
        if r < 0.32:
            return Req(cmd=PimCommand.WR, col=col, data=lanes(self.rng))
        return Req(cmd=PimCommand.OP, col=col, instr=self.instr())


class Driver:
    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.wdata = ports(dut, "wdata", pm.LANES)

    def drive(self, req: Req | None, valid: bool) -> None:
        d = self.dut
        d.cmd_valid.value = int(valid)
        d.cmd.value = BAD_CMD if req is None else int(req.cmd)
        d.row.value = 0 if req is None else req.row
        d.col.value = 0 if req is None else req.col
        d.instr.value = 0 if req is None else req.word
        data = req.data if req is not None and req.data is not None else (0,) * pm.LANES
        for h, v in zip(self.wdata, data, strict=True):
            h.value = v


class Monitor:
    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.rdata = ports(dut, "rdata", pm.LANES)

    def sample(self) -> dict[str, Any]:
        d = self.dut
        s = {n: int(getattr(d, n).value) for n in ("cmd_ready", "done", "error", "row_open")}
        s["rdata"] = [h.value.to_signed() for h in self.rdata] if s["done"] else None
        return s


class Checker:
    def __init__(self) -> None:
        self.legal_ops: Tally[PimOp] = Tally()
        self.checked = 0
        self.errors = 0
        self.overlapped = 0  # commands accepted while another was in flight

    def done(self, issued: Issued, cycle: int, s: dict[str, Any]) -> None:
        name = "BAD_CMD" if issued.req is None else issued.req.cmd.name
        lat = cycle - issued.accept_cycle
        assert lat == issued.latency, f"{name}: latency {lat}, pim_model says {issued.latency}"
        assert s["error"] == issued.error, f"{name}: error={s['error']}, model {issued.error}"
        if issued.data is not None:
            assert s["rdata"] == list(issued.data), f"RD: {s['rdata']} != {list(issued.data)}"
        if issued.req is not None and issued.req.cmd is PimCommand.OP and not issued.error:
            self.legal_ops[pm.decode_instr(issued.req.word).op] += 1
        self.errors += issued.error
        self.checked += 1


class Bench:
    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.rng = np.random.default_rng(seed())
        self.model = pm.PimBank(rows=ROWS, cols=COLS, timing=TIMING)
        self.cyc = Cycler(dut)
        self.drv, self.mon, self.chk = Driver(dut), Monitor(dut), Checker()
        self.last: Issued | None = None  # the last command accepted

    def timing_of(self, req: Req | None) -> tuple[int, bool]:
        """(latency, is_column) of ``req`` in the model's current state."""
        if req is None:
            return pm.error_cycles(), False
        return self.model.request_timing(req)

    def issue_in_model(self, req: Req | None) -> Issued:
        latency, column = self.timing_of(req)
        if req is None:
            return Issued(None, 0, latency, True, None)
        try:
            data = self.model.execute(req)
            return Issued(req, 0, latency, False, data, column)
        except pm.PimError:
            return Issued(req, 0, latency, True, None)

    async def run(self, reqs: list[Req | None], gap_prob: float) -> None:
        """Issue ``reqs`` in order (back to back unless a random gap) and check each."""
        queue = list(reqs)
        in_flight: list[Issued] = []
        guard = self.cyc.cycle + 50 + 40 * len(reqs)
        while queue or in_flight:
            await self.cyc.drive_phase()
            c = self.cyc.cycle
            assert c < guard, "PIM program did not finish (hang)"
            valid = bool(queue) and self.rng.random() >= gap_prob
            self.drv.drive(queue[0] if queue else None, valid)
            await self.cyc.sample_phase()
            s = self.mon.sample()
            if s["done"]:
                assert in_flight, f"cycle {c}: done with no command in flight"
                self.chk.done(in_flight.pop(0), c, s)
                if not in_flight:
                    assert s["row_open"] == (self.model.open_row is not None), "row_open"
            if queue and self.last is not None:  # the issue rule, checked every cycle
                prev = (self.last.latency, self.last.column)
                earliest = self.last.accept_cycle + pm.issue_interval(
                    prev, self.timing_of(queue[0]), TIMING
                )
                assert s["cmd_ready"] == (c + 1 >= earliest), (
                    f"cycle {c}: cmd_ready={s['cmd_ready']}, issue rule says the next "
                    f"command is accepted from edge {earliest}"
                )
            if valid and s["cmd_ready"]:
                issued = self.issue_in_model(queue.pop(0))
                issued.accept_cycle = c + 1
                in_flight.append(issued)
                self.last = issued
                self.chk.overlapped += len(in_flight) > 1

    def dump_requests(self) -> list[Req]:
        """PRE, then every row's columns through RD, then every GRF via MOV to BANK."""
        out: list[Req] = [Req(cmd=PimCommand.PRE)]
        for r in range(ROWS):
            out.append(Req(cmd=PimCommand.ACT, row=r))
            out += [Req(cmd=PimCommand.RD, col=c) for c in range(COLS)]
            out.append(Req(cmd=PimCommand.PRE))
        out.append(Req(cmd=PimCommand.ACT, row=0))
        for g in range(pm.GRF_ENTRIES):
            out.append(
                Req(
                    cmd=PimCommand.OP,
                    col=0,
                    instr=PimInstr(op=PimOp.MOV, dst=Operand.bank(), src0=Operand.grf(g)),
                )
            )
            out.append(Req(cmd=PimCommand.RD, col=0))
        out.append(Req(cmd=PimCommand.PRE))
        return out


async def setup(dut: Any) -> Bench:
    inputs = {"cmd_valid": 0, "cmd": 0, "row": 0, "col": 0, "instr": 0}
    inputs.update({f"wdata__{i}": 0 for i in range(pm.LANES)})
    await start_clock_and_reset(dut, inputs)
    return Bench(dut)


@cocotb.test()
async def random_program(dut: Any) -> None:
    bench = await setup(dut)
    rng = bench.rng
    fill: list[Req | None] = []
    for r in range(ROWS):
        fill.append(Req(cmd=PimCommand.ACT, row=r))
        fill += [Req(cmd=PimCommand.WR, col=c, data=lanes(rng)) for c in range(COLS)]
        fill.append(Req(cmd=PimCommand.PRE))
    fill.append(Req(cmd=PimCommand.WRSRF, data=lanes(rng)))
    await bench.run(fill, gap_prob=0.0)

    # A random program: the generator consults the model (in program order) so it can
    # aim for mostly-legal commands; the bank runs them back to back and with gaps.
    gen = ProgramGenerator(rng)
    shadow = pm.PimBank(rows=ROWS, cols=COLS, timing=TIMING)
    shadow.open_row = bench.model.open_row
    program: list[Req | None] = []
    for _ in range(500):
        req = gen.next(shadow)
        if req is not None:
            try:
                shadow.execute(req)
            except pm.PimError:
                pass
        program.append(req)
    await bench.run(program[:250], gap_prob=0.0)
    await bench.run(program[250:], gap_prob=0.3)
    await bench.run(bench.dump_requests(), gap_prob=0.0)

    missing = [op.name for op in PimOp if bench.chk.legal_ops[op] < 5]
    assert not missing, f"ops executed legally fewer than 5 times: {missing}"
    assert bench.chk.errors >= 10, "too few illegal commands exercised"
    assert bench.chk.overlapped >= 50, "too few pipelined (overlapping) column commands"
    dut._log.info(
        "checked %d commands (%d illegal); legal ops %s",
        bench.chk.checked,
        bench.chk.errors,
        dict(bench.chk.legal_ops),
    )
