"""Processing-in-memory bank: a DRAM bank, its row buffer and a 16-lane int16 SIMD unit."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ._checks import check_int

__all__ = [
    "PimBank",
    "PIM_COMMANDS",
    "PIM_OPCODES",
    "OPERAND_KINDS",
    "INSTR_LAYOUT",
    "LANES",
    "LANE_BITS",
    "GRF_ENTRIES",
    "SRF_ENTRIES",
]

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
INSTR_LAYOUT = data.StructLayout(
    {
        "op": 4,
        "dst_kind": 2,
        "dst_idx": 3,
        "s0_kind": 2,
        "s0_idx": 3,
        "s1_kind": 2,
        "s1_idx": 3,
        "s2_kind": 2,
        "s2_idx": 3,
        "reserved": 8,
    }
)

_C = PIM_COMMANDS
_O = PIM_OPCODES
_K = OPERAND_KINDS


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
    ``cmd_ready`` says whether the command *on the ports* would be accepted at the next
    edge (it depends on that command): the issue rule of ``pim_model.issue_interval``.
    Column commands (legal RD, WR, OP) follow each other every ``t_ccd`` cycles (and
    late enough that ``done`` stays in program order); any other command waits for the
    previous ``done``, and so does the command after it. So several column commands
    can be in flight; their ``done`` pulses come in program order, one per cycle.

    Microarchitecture: a command takes effect in the cycle after its acceptance (cycle 0:
    row buffer, registers, open-row state, the SIMD unit's one-cycle datapath), in
    program order, which is what a fully forwarded pipeline shows; its completion (``done``,
    ``error``, and for RD the column read then, held in a small queue) travels down a
    delay line and appears in cycle ``N``. ``row_open`` therefore changes in cycle 1.

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
    t_rcd, t_rp, t_cl, t_wr, t_ccd: cycles, 1..255 (defaults 14, 14, 14, 16, 4, those
    of ``pim_model.PimTiming``).
    """

    def __init__(
        self,
        rows: int = 16,
        cols: int = 8,
        t_rcd: int = 14,
        t_rp: int = 14,
        t_cl: int = 14,
        t_wr: int = 16,
        t_ccd: int = 4,
    ) -> None:
        self._rows = check_int("rows", rows, 1, 4096)
        self._cols = check_int("cols", cols, 1, 64)
        self._timing = {
            name: check_int(name, v, 1, 255)
            for name, v in (
                ("t_rcd", t_rcd),
                ("t_rp", t_rp),
                ("t_cl", t_cl),
                ("t_wr", t_wr),
                ("t_ccd", t_ccd),
            )
        }
        super().__init__(
            {
                "cmd_valid": In(1),
                "cmd_ready": Out(1),
                "cmd": In(3),
                "row": In(16),
                "col": In(8),
                "instr": In(32),
                "wdata": In(signed(LANE_BITS)).array(LANES),
                "done": Out(1),
                "error": Out(1),
                "rdata": Out(signed(LANE_BITS)).array(LANES),
                "row_open": Out(1),
            }
        )

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cols(self) -> int:
        return self._cols

    @property
    def timing(self) -> dict[str, int]:
        """``{"t_rcd": ..., "t_rp": ..., "t_cl": ..., "t_wr": ..., "t_ccd": ...}``."""
        return dict(self._timing)

    def elaborate(self, platform: object) -> Module:
        m = Module()
        rows, cols, tm = self._rows, self._cols, self._timing
        latencies = {
            _C["ACT"]: tm["t_rcd"],
            _C["PRE"]: tm["t_rp"],
            _C["RD"]: tm["t_cl"],
            _C["WR"]: tm["t_wr"],
            _C["WRSRF"]: 1,
        }
        max_lat = max(*latencies.values(), 4)

        mem = Memory(shape=cols * WORD_BITS, depth=rows, init=[])
        m.submodules.mem = mem
        rd_port = mem.read_port(domain="comb")
        wr_port = mem.write_port()

        row_buf = Signal(cols * WORD_BITS)
        open_reg = Signal()
        open_row = Signal(range(rows))
        grf = Array(Signal(WORD_BITS, name=f"grf{i}") for i in range(GRF_ENTRIES))
        srf = Array(Signal(signed(LANE_BITS), name=f"srf{i}") for i in range(SRF_ENTRIES))

        def lanes(v) -> list:
            return [v[LANE_BITS * i : LANE_BITS * (i + 1)].as_signed() for i in range(LANES)]

        def decode(ins) -> dict:
            op = ins.op
            uses_s1 = (op == _O["ADD"]) | (op == _O["MUL"]) | (op == _O["MAC"]) | (op == _O["MAD"])
            uses_s2 = op == _O["MAD"]
            return {
                "uses_mul": (op == _O["MUL"]) | (op == _O["MAC"]) | (op == _O["MAD"]),
                "uses_alu": (
                    (op == _O["ADD"]) | (op == _O["MAC"]) | (op == _O["MAD"]) | (op == _O["RELU"])
                ),
                "uses_bank": (
                    (ins.dst_kind == _K["BANK"])
                    | (ins.s0_kind == _K["BANK"])
                    | (uses_s1 & (ins.s1_kind == _K["BANK"]))
                    | (uses_s2 & (ins.s2_kind == _K["BANK"]))
                ),
                "invalid": (
                    (op == 0)
                    | (op > 7)
                    | ((ins.dst_kind != _K["GRF"]) & (ins.dst_kind != _K["BANK"]))
                    | (ins.s0_kind == 3)
                    | (uses_s1 & (ins.s1_kind == 3))
                    | (uses_s2 & (ins.s2_kind == 3))
                    | (
                        (op == _O["FILL"])
                        & ((ins.s0_kind != _K["BANK"]) | (ins.dst_kind != _K["GRF"]))
                    )
                    | ((op == _O["MAC"]) & (ins.dst_kind != _K["GRF"]))
                ),
            }

        # ---- the command executing this cycle (accepted at the last edge) -------------
        exec_v = Signal()
        cmd_r = Signal(3)
        row_r = Signal(16)
        col_r = Signal(8)
        instr_r = Signal(INSTR_LAYOUT)
        wdata_r = Signal(WORD_BITS)
        err_r = Signal()
        ok = Signal()
        m.d.comb += ok.eq(exec_v & ~err_r)

        # ---- acceptance: legality (open-row state forwarded from the executing command)
        open_next = Signal()
        m.d.comb += open_next.eq(
            Mux(ok & (cmd_r == _C["ACT"]), 1, Mux(ok & (cmd_r == _C["PRE"]), 0, open_reg))
        )
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

        # latency and column-ness of the command on the ports
        lat_in = Signal(range(max_lat + 1))
        col_in = Signal()
        op_lat = 2 + in_dec["uses_mul"] + in_dec["uses_alu"]
        with m.If(illegal):
            m.d.comb += lat_in.eq(1)
        with m.Else():
            with m.Switch(self.cmd):
                for code, n in latencies.items():
                    with m.Case(code):
                        m.d.comb += lat_in.eq(n)
                with m.Case(_C["OP"]):
                    m.d.comb += lat_in.eq(op_lat)
            m.d.comb += col_in.eq(
                (self.cmd == _C["RD"]) | (self.cmd == _C["WR"]) | (self.cmd == _C["OP"])
            )

        # the issue rule: cycles since the last acceptance against the required interval
        have_prev = Signal()
        prev_lat = Signal(range(max_lat + 1))
        prev_col = Signal()
        elapsed = Signal(range(2 * max_lat + 2))  # (this cycle + 1) - last acceptance edge
        gap = Signal(signed(prev_lat.shape().width + 2))
        need = Signal(range(max(max_lat, tm["t_ccd"]) + 1))
        m.d.comb += gap.eq(prev_lat - lat_in + 1)
        with m.If(prev_col & col_in):
            m.d.comb += need.eq(Mux(gap > tm["t_ccd"], gap, tm["t_ccd"]))
        with m.Else():
            m.d.comb += need.eq(prev_lat)
        m.d.comb += self.cmd_ready.eq(~have_prev | (elapsed >= need))
        accept = Signal()
        m.d.comb += accept.eq(self.cmd_valid & self.cmd_ready)

        m.d.sync += exec_v.eq(accept)
        with m.If(accept):
            m.d.sync += [
                cmd_r.eq(self.cmd),
                row_r.eq(self.row),
                col_r.eq(self.col),
                instr_r.eq(self.instr),
                wdata_r.eq(Cat(*self.wdata)),
                err_r.eq(illegal),
                have_prev.eq(1),
                prev_lat.eq(lat_in),
                prev_col.eq(col_in),
                elapsed.eq(1),
            ]
        with m.Elif(elapsed < 2 * max_lat + 1):
            m.d.sync += elapsed.eq(elapsed + 1)

        # ---- completions: a delay line of done / error / "is a read" bits --------------
        pend = Signal(max_lat)
        pend_err = Signal(max_lat)
        pend_rd = Signal(max_lat)
        slot = Signal(max_lat)  # bit lat_in - 1: the done rises lat_in edges from now
        m.d.comb += slot.eq(Mux(accept, ((Const(1, max_lat + 1) << lat_in) >> 1)[:max_lat], 0))
        m.d.sync += [
            pend.eq((pend >> 1) | slot),
            pend_err.eq((pend_err >> 1) | Mux(illegal, slot, 0)),
            pend_rd.eq((pend_rd >> 1) | Mux(~illegal & (self.cmd == _C["RD"]), slot, 0)),
        ]
        done_r = Signal()
        error_r = Signal()
        rdata_r = Signal(WORD_BITS)
        m.d.sync += [done_r.eq(pend[0]), error_r.eq(pend_err[0])]

        # ---- execution, in program order ------------------------------------------------
        col_word = row_buf.word_select(col_r, WORD_BITS)
        cur_col = Signal(WORD_BITS)  # the addressed column, read once
        m.d.comb += cur_col.eq(col_word)
        m.d.comb += rd_port.addr.eq(row_r)
        m.d.comb += [wr_port.addr.eq(open_row), wr_port.data.eq(row_buf)]

        # RD data waits for its done in a queue (one entry per read that can be in flight)
        if tm["t_cl"] == 1:
            with m.If(ok & (cmd_r == _C["RD"])):
                m.d.sync += rdata_r.eq(cur_col)
        else:
            depth = -(-tm["t_cl"] // tm["t_ccd"]) + 1
            queue = Array(Signal(WORD_BITS, name=f"rdq{i}") for i in range(depth))
            wp = Signal(range(depth))
            rp = Signal(range(depth))
            with m.If(ok & (cmd_r == _C["RD"])):
                m.d.sync += [queue[wp].eq(cur_col), wp.eq(Mux(wp == depth - 1, 0, wp + 1))]
            with m.If(pend[0] & pend_rd[0]):
                m.d.sync += [rdata_r.eq(queue[rp]), rp.eq(Mux(rp == depth - 1, 0, rp + 1))]

        dec = decode(instr_r)
        # the SIMD unit's one-cycle datapath, each stage a named wire (so the emitted
        # Verilog computes it once)
        op_a, op_b, op_c, prod, value = (
            Signal(WORD_BITS, name=n) for n in ("op_a", "op_b", "op_c", "prod", "value")
        )

        def operand(kind, idx):
            broadcast = Cat(*([srf[idx]] * LANES))
            return Mux(kind == _K["GRF"], grf[idx], Mux(kind == _K["SRF"], broadcast, cur_col))

        m.d.comb += [
            op_a.eq(operand(instr_r.s0_kind, instr_r.s0_idx)),
            op_b.eq(operand(instr_r.s1_kind, instr_r.s1_idx)),
            op_c.eq(
                Mux(
                    instr_r.op == _O["MAC"],
                    grf[instr_r.dst_idx],
                    operand(instr_r.s2_kind, instr_r.s2_idx),
                )
            ),
            prod.eq(
                Cat(*[(a * b)[:LANE_BITS] for a, b in zip(lanes(op_a), lanes(op_b), strict=True)])
            ),
        ]
        alu = []
        for a, b, c, p in zip(lanes(op_a), lanes(op_b), lanes(op_c), lanes(prod), strict=True):
            alu.append(
                Mux(
                    instr_r.op == _O["ADD"],
                    a + b,
                    Mux(instr_r.op == _O["RELU"], Mux(a < 0, 0, a), p + c),
                )[:LANE_BITS]
            )
        m.d.comb += value.eq(Mux(dec["uses_alu"], Cat(*alu), Mux(dec["uses_mul"], prod, op_a)))

        with m.If(ok):
            with m.Switch(cmd_r):
                with m.Case(_C["ACT"]):
                    m.d.sync += [row_buf.eq(rd_port.data), open_reg.eq(1), open_row.eq(row_r)]
                with m.Case(_C["PRE"]):
                    m.d.comb += wr_port.en.eq(open_reg)
                    m.d.sync += open_reg.eq(0)
                with m.Case(_C["WR"]):
                    m.d.sync += col_word.eq(wdata_r)
                with m.Case(_C["WRSRF"]):
                    m.d.sync += [
                        srf[i].eq(wdata_r[LANE_BITS * i : LANE_BITS * (i + 1)])
                        for i in range(SRF_ENTRIES)
                    ]
                with m.Case(_C["OP"]):
                    with m.If(instr_r.dst_kind == _K["GRF"]):
                        m.d.sync += grf[instr_r.dst_idx].eq(value)
                    with m.Else():
                        m.d.sync += col_word.eq(value)

        m.d.comb += [
            self.done.eq(done_r),
            self.error.eq(error_r),
            self.row_open.eq(open_reg),
        ]
        m.d.comb += [
            self.rdata[i].eq(rdata_r[LANE_BITS * i : LANE_BITS * (i + 1)]) for i in range(LANES)
        ]
        return m
