"""Processing-in-memory bank: a DRAM bank, its row buffer and a 16-lane int16 SIMD unit."""

from __future__ import annotations

import enum

from amaranth.hdl import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ._checks import check_int

__all__ = ["PimBank", "PIM_COMMANDS", "PIM_OPCODES", "OPERAND_KINDS", "INSTR_LAYOUT",
           "LANES", "LANE_BITS", "GRF_ENTRIES", "SRF_ENTRIES"]

LANES = 16
LANE_BITS = 16
WORD_BITS = LANES * LANE_BITS
GRF_ENTRIES = 8
SRF_ENTRIES = 8

#: Command codes on the ``cmd`` port (equal to ``emulator.pim_model.PimCommand``).
PIM_COMMANDS = {"ACT": 0, "PRE": 1, "RD": 2, "WR": 3, "WRSRF": 4, "OP": 5}
#: Opcodes in the instruction word (equal to ``emulator.pim_model.PimOp``).
PIM_OPCODES = {"ADD": 1, "MUL": 2, "MAC": 3, "MAD": 4, "RELU": 5, "MOV": 6, "FILL": 7}
#: Operand kinds (equal to ``emulator.pim_model.OperandKind``); 3 is invalid.
OPERAND_KINDS = {"GRF": 0, "SRF": 1, "BANK": 2}
#: The 32-bit instruction word, LSB first (``emulator.pim_model.INSTR_FIELDS``).
INSTR_LAYOUT = data.StructLayout({
    "op": 4, "dst_kind": 2, "dst_idx": 3,
    "s0_kind": 2, "s0_idx": 3, "s1_kind": 2, "s1_idx": 3, "s2_kind": 2, "s2_idx": 3,
    "reserved": 8,
})

_C = PIM_COMMANDS
_O = PIM_OPCODES
_K = OPERAND_KINDS


class _State(enum.IntEnum):
    IDLE = 0
    WAIT = 1   # DRAM command (or error) counting down its latency
    READ = 2   # OP: operand read
    MUL = 3    # OP: multiply stage
    ALU = 4    # OP: add / ReLU stage
    WRITE = 5  # OP: write-back


class PimBank(wiring.Component):
    """One PIM bank: ``rows`` x ``cols`` 256-bit columns, a row buffer, GRF/SRF, SIMD.

    The ISA, the number format (16 lanes of int16, wrapping), the instruction encoding
    and the command latencies are specified in ``wia_hw.emulator.pim_model`` (the golden
    model); this block implements them. Summary: ``ACT`` t_rcd, ``PRE`` t_rp, ``RD``
    t_cl, ``WR`` t_wr, ``WRSRF`` 1, ``OP`` ``2 + mul + alu`` (ADD 3, MUL 3, MAC 4,
    MAD 4, RELU 3, MOV 2, FILL 2) cycles; an illegal command: 1 cycle with ``error``.

    Handshake: a command is accepted at a rising edge where ``cmd_valid`` and
    ``cmd_ready`` are high (edge 0); ``done`` is high during cycle ``N`` (the period
    after edge ``N``), with ``error`` and, for RD, ``rdata`` valid in that cycle.
    ``cmd_ready`` is high when idle and in the last cycle of a command (cycle ``N - 1``),
    so back-to-back commands take the sum of their latencies.

    Illegal commands (nothing changes): ACT while a row is open or with ``row >= rows``;
    RD/WR, or an OP with a BANK operand, while no row is open or with ``col >= cols``;
    an OP whose word does not decode (opcode not 1..7, dst kind not GRF/BANK, a used
    source of kind 3, FILL not BANK -> GRF, MAC into a non-GRF); a ``cmd`` above 5.

    Ports
    -----
    cmd_valid (in, 1), cmd_ready (out, 1): command handshake.
    cmd (in, 3): command code, :data:`PIM_COMMANDS`.
    row (in, 16): row for ACT. col (in, 8): column for RD, WR and OP's BANK operand.
    instr (in, 32): OP instruction word, :data:`INSTR_LAYOUT`.
    wdata (in, ``signed(16)`` x 16): WR column / WRSRF scalars (lanes 0..7).
    done (out, 1), error (out, 1): completion pulse and its status.
    rdata (out, ``signed(16)`` x 16): last RD result (held until the next RD).
    row_open (out, 1): a row is open.

    Parameters
    ----------
    rows: 1..4096 (default 16). cols: 256-bit columns per row, 1..64 (default 8).
    t_rcd, t_rp, t_cl, t_wr: latencies in cycles, 1..255 (defaults 14, 14, 14, 16,
    those of ``pim_model.PimTiming``).
    """

    def __init__(self, rows: int = 16, cols: int = 8, t_rcd: int = 14, t_rp: int = 14,
                 t_cl: int = 14, t_wr: int = 16) -> None:
        self._rows = check_int("rows", rows, 1, 4096)
        self._cols = check_int("cols", cols, 1, 64)
        self._timing = {name: check_int(name, v, 1, 255) for name, v in
                        (("t_rcd", t_rcd), ("t_rp", t_rp), ("t_cl", t_cl), ("t_wr", t_wr))}
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd": In(3),
            "row": In(16), "col": In(8), "instr": In(32),
            "wdata": In(signed(LANE_BITS)).array(LANES),
            "done": Out(1), "error": Out(1),
            "rdata": Out(signed(LANE_BITS)).array(LANES),
            "row_open": Out(1),
        })

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cols(self) -> int:
        return self._cols

    @property
    def timing(self) -> dict[str, int]:
        """``{"t_rcd": ..., "t_rp": ..., "t_cl": ..., "t_wr": ...}``."""
        return dict(self._timing)

    def elaborate(self, platform: object) -> Module:
        m = Module()
        rows, cols, tm = self._rows, self._cols, self._timing

        mem = Memory(shape=cols * WORD_BITS, depth=rows, init=[])
        m.submodules.mem = mem
        rd_port = mem.read_port(domain="comb")
        wr_port = mem.write_port()

        row_buf = Signal(cols * WORD_BITS)
        open_reg = Signal()
        open_row = Signal(range(rows))
        grf = Array(Signal(WORD_BITS, name=f"grf{i}") for i in range(GRF_ENTRIES))
        srf = Array(Signal(signed(LANE_BITS), name=f"srf{i}") for i in range(SRF_ENTRIES))

        state = Signal(_State)
        cnt = Signal(8)
        cmd_r = Signal(3)
        row_r = Signal(16)
        col_r = Signal(8)
        instr_r = Signal(INSTR_LAYOUT)
        wdata_r = Signal(WORD_BITS)
        err_r = Signal()
        done_r = Signal()
        error_r = Signal()
        rdata_r = Signal(WORD_BITS)
        op_a, op_b, op_c, prod, res = (Signal(WORD_BITS, name=n)
                                       for n in ("op_a", "op_b", "op_c", "prod", "res"))

        def lanes(v: Signal) -> list:
            return [v[LANE_BITS * i:LANE_BITS * (i + 1)].as_signed() for i in range(LANES)]

        def decode(ins) -> dict:
            op = ins.op
            uses_s1 = (op == _O["ADD"]) | (op == _O["MUL"]) | (op == _O["MAC"]) | (op == _O["MAD"])
            uses_s2 = op == _O["MAD"]
            return {
                "uses_s1": uses_s1,
                "uses_s2": uses_s2,
                "uses_mul": (op == _O["MUL"]) | (op == _O["MAC"]) | (op == _O["MAD"]),
                "uses_alu": ((op == _O["ADD"]) | (op == _O["MAC"]) | (op == _O["MAD"])
                             | (op == _O["RELU"])),
                "uses_bank": ((ins.dst_kind == _K["BANK"]) | (ins.s0_kind == _K["BANK"])
                              | (uses_s1 & (ins.s1_kind == _K["BANK"]))
                              | (uses_s2 & (ins.s2_kind == _K["BANK"]))),
                "invalid": ((op == 0) | (op > 7)
                            | ((ins.dst_kind != _K["GRF"]) & (ins.dst_kind != _K["BANK"]))
                            | (ins.s0_kind == 3)
                            | (uses_s1 & (ins.s1_kind == 3))
                            | (uses_s2 & (ins.s2_kind == 3))
                            | ((op == _O["FILL"]) & ((ins.s0_kind != _K["BANK"])
                                                      | (ins.dst_kind != _K["GRF"])))
                            | ((op == _O["MAC"]) & (ins.dst_kind != _K["GRF"]))),
            }

        # ---- acceptance and the legality check (with the open-row state forwarded) ----
        finishing = Signal()
        m.d.comb += [
            finishing.eq(((state == _State.WAIT) & (cnt == 0)) | (state == _State.WRITE)),
            self.cmd_ready.eq((state == _State.IDLE) | finishing),
        ]
        accept = Signal()
        m.d.comb += accept.eq(self.cmd_valid & self.cmd_ready)
        fin_wait_ok = (state == _State.WAIT) & (cnt == 0) & ~err_r
        open_next = Signal()
        m.d.comb += open_next.eq(Mux(fin_wait_ok & (cmd_r == _C["ACT"]), 1,
                                     Mux(fin_wait_ok & (cmd_r == _C["PRE"]), 0, open_reg)))
        in_ins = data.View(INSTR_LAYOUT, self.instr)
        in_dec = decode(in_ins)
        col_bad = ~open_next | (self.col >= cols)
        illegal = Signal()
        with m.Switch(self.cmd):
            with m.Case(_C["ACT"]):
                m.d.comb += illegal.eq(open_next | (self.row >= rows))
            with m.Case(_C["PRE"], _C["WRSRF"]):
                m.d.comb += illegal.eq(0)
            with m.Case(_C["RD"], _C["WR"]):
                m.d.comb += illegal.eq(col_bad)
            with m.Case(_C["OP"]):
                m.d.comb += illegal.eq(in_dec["invalid"] | (in_dec["uses_bank"] & col_bad))
            with m.Default():
                m.d.comb += illegal.eq(1)

        latency = {_C["ACT"]: tm["t_rcd"], _C["PRE"]: tm["t_rp"], _C["RD"]: tm["t_cl"],
                   _C["WR"]: tm["t_wr"], _C["WRSRF"]: 1}

        # ---- the command in flight ----------------------------------------------------
        dec = decode(instr_r)
        col_word = row_buf.word_select(col_r, WORD_BITS)
        m.d.comb += rd_port.addr.eq(row_r)
        m.d.comb += [wr_port.addr.eq(open_row), wr_port.data.eq(row_buf)]

        def fetch(kind, idx):
            broadcast = Cat(*([srf[idx]] * LANES))
            return Mux(kind == _K["GRF"], grf[idx], Mux(kind == _K["SRF"], broadcast, col_word))

        m.d.sync += [done_r.eq(0), error_r.eq(0)]
        with m.Switch(state):
            with m.Case(_State.WAIT):
                with m.If(cnt == 0):
                    m.d.sync += [done_r.eq(1), error_r.eq(err_r), state.eq(_State.IDLE)]
                    with m.If(~err_r):
                        with m.Switch(cmd_r):
                            with m.Case(_C["ACT"]):
                                m.d.sync += [row_buf.eq(rd_port.data), open_reg.eq(1),
                                             open_row.eq(row_r)]
                            with m.Case(_C["PRE"]):
                                m.d.comb += wr_port.en.eq(open_reg)
                                m.d.sync += open_reg.eq(0)
                            with m.Case(_C["RD"]):
                                m.d.sync += rdata_r.eq(col_word)
                            with m.Case(_C["WR"]):
                                m.d.sync += col_word.eq(wdata_r)
                            with m.Case(_C["WRSRF"]):
                                m.d.sync += [srf[i].eq(wdata_r[LANE_BITS * i:LANE_BITS * (i + 1)])
                                             for i in range(SRF_ENTRIES)]
                with m.Else():
                    m.d.sync += cnt.eq(cnt - 1)
            with m.Case(_State.READ):
                m.d.sync += [
                    op_a.eq(fetch(instr_r.s0_kind, instr_r.s0_idx)),
                    op_b.eq(fetch(instr_r.s1_kind, instr_r.s1_idx)),
                    op_c.eq(Mux(instr_r.op == _O["MAC"], grf[instr_r.dst_idx],
                                fetch(instr_r.s2_kind, instr_r.s2_idx))),
                    state.eq(Mux(dec["uses_mul"], _State.MUL,
                                 Mux(dec["uses_alu"], _State.ALU, _State.WRITE))),
                ]
            with m.Case(_State.MUL):
                m.d.sync += [
                    prod.eq(Cat(*[(a * b)[:LANE_BITS]
                                  for a, b in zip(lanes(op_a), lanes(op_b), strict=True)])),
                    state.eq(Mux(dec["uses_alu"], _State.ALU, _State.WRITE)),
                ]
            with m.Case(_State.ALU):
                out = []
                operands = zip(lanes(op_a), lanes(op_b), lanes(op_c), lanes(prod), strict=True)
                for a, b, c, p in operands:
                    out.append(Mux(instr_r.op == _O["ADD"], a + b,
                                   Mux(instr_r.op == _O["RELU"], Mux(a < 0, 0, a), p + c))
                               [:LANE_BITS])
                m.d.sync += [res.eq(Cat(*out)), state.eq(_State.WRITE)]
            with m.Case(_State.WRITE):
                value = Mux(dec["uses_alu"], res, Mux(dec["uses_mul"], prod, op_a))
                with m.If(instr_r.dst_kind == _K["GRF"]):
                    m.d.sync += grf[instr_r.dst_idx].eq(value)
                with m.Else():
                    m.d.sync += col_word.eq(value)
                m.d.sync += [done_r.eq(1), state.eq(_State.IDLE)]

        with m.If(accept):
            m.d.sync += [
                cmd_r.eq(self.cmd), row_r.eq(self.row), col_r.eq(self.col),
                instr_r.eq(self.instr), wdata_r.eq(Cat(*self.wdata)), err_r.eq(illegal),
            ]
            with m.If(illegal):
                m.d.sync += [state.eq(_State.WAIT), cnt.eq(0)]
            with m.Elif(self.cmd == _C["OP"]):
                m.d.sync += state.eq(_State.READ)
            with m.Else():
                m.d.sync += state.eq(_State.WAIT)
                with m.Switch(self.cmd):
                    for code, n in latency.items():
                        with m.Case(code):
                            m.d.sync += cnt.eq(n - 1)

        m.d.comb += [
            self.done.eq(done_r),
            self.error.eq(error_r),
            self.row_open.eq(open_reg),
        ]
        m.d.comb += [self.rdata[i].eq(rdata_r[LANE_BITS * i:LANE_BITS * (i + 1)])
                     for i in range(LANES)]
        return m

