"""The PIM bank's golden model, ISA and timing (``emulator.pim_model``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from wia_hw.emulator import pim_model as pm
from wia_hw.emulator.pim_model import (
    Operand,
    OperandKind,
    PimBank,
    PimCommand,
    PimError,
    PimInstr,
    PimOp,
    PimRequest,
    PimTiming,
)

G, S, B = Operand.grf, Operand.srf, Operand.bank()


def wrap16(v: int) -> int:
    return (v + 2**15) % 2**16 - 2**15


# ---- timing ----------------------------------------------------------------------------


def test_op_cycles_are_the_stage_count() -> None:
    for op, info in pm.OP_INFO.items():
        assert pm.op_cycles(op) == 2 + info.uses_mul + info.uses_alu
    assert {op.name: pm.op_cycles(op) for op in PimOp} == {
        "ADD": 3,
        "MUL": 3,
        "MAC": 4,
        "MAD": 4,
        "RELU": 3,
        "MOV": 2,
        "FILL": 2,
    }


def test_command_cycles_and_program_cycles() -> None:
    t = PimTiming(t_rcd=5, t_rp=6, t_cl=7, t_wr=8)
    reqs = [
        PimRequest(cmd=PimCommand.ACT, row=1),
        PimRequest(cmd=PimCommand.RD, col=0),
        PimRequest(cmd=PimCommand.WR, col=0, data=(1,) * 16),
        PimRequest(cmd=PimCommand.WRSRF, data=(2,) * 16),
        PimRequest(
            cmd=PimCommand.OP, instr=PimInstr(op=PimOp.MAD, dst=G(0), src0=G(1), src1=S(0), src2=B)
        ),
        PimRequest(cmd=PimCommand.PRE),
    ]
    assert [pm.command_cycles(r, t) for r in reqs] == [5, 7, 8, 1, 4, 6]
    # ACT -> RD waits for ACT (5); RD -> WR are column commands: max(t_ccd=4, 7 - 8 + 1);
    # WR -> WRSRF waits for WR (8); WRSRF -> OP (1); OP -> PRE (4); PRE's own 6
    assert pm.program_cycles(reqs, t) == 5 + max(4, 7 - 8 + 1) + 8 + 1 + 4 + 6
    assert (
        pm.activate_cycles(t),
        pm.precharge_cycles(t),
        pm.read_cycles(t),
        pm.write_cycles(t),
        pm.srf_write_cycles(),
        pm.error_cycles(),
    ) == (5, 6, 7, 8, 1, 1)
    assert PimTiming() == PimTiming(t_rcd=14, t_rp=14, t_cl=14, t_wr=16, t_ccd=4)


def test_column_commands_pipeline_at_t_ccd_in_completion_order() -> None:
    t = PimTiming(t_rcd=5, t_rp=6, t_cl=9, t_wr=3, t_ccd=2)
    rd, wr = (9, True), (3, True)
    assert pm.issue_interval(rd, rd, t) == 2  # a burst of reads: t_ccd
    assert pm.issue_interval(wr, rd, t) == 2
    assert pm.issue_interval(rd, wr, t) == 9 - 3 + 1  # WR's done after RD's
    assert pm.issue_interval((5, False), rd, t) == 5  # after ACT: its latency
    assert pm.issue_interval(rd, (6, False), t) == 9  # PRE waits for the read
    rng = np.random.default_rng(3)
    for _ in range(200):  # any back-to-back mix: done times strictly increase
        seq = [(int(rng.integers(1, 20)), bool(rng.random() < 0.7)) for _ in range(12)]
        tt = PimTiming(t_ccd=int(rng.integers(1, 8)))
        accept, done = 0, []
        for i, cur in enumerate(seq):
            if i:
                accept += pm.issue_interval(seq[i - 1], cur, tt)
            done.append(accept + cur[0])
        assert all(b > a for a, b in itertools.pairwise(done))
        for a, b in itertools.pairwise(seq):  # never later than waiting for done (tCCD floor)
            assert pm.issue_interval(a, b, tt) <= (max(tt.t_ccd, a[0]) if a[1] and b[1] else a[0])


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"t_rcd": 0}, ValueError, r"t_rcd must be between 1 and 255, got 0"),
        ({"t_wr": 300}, ValueError, r"t_wr must be between 1 and 255, got 300"),
        ({"t_cl": 2.0}, TypeError, r"t_cl must be an integer, got 2.0"),
    ],
)
def test_timing_validation(kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        PimTiming(**kwargs)


# ---- ISA -------------------------------------------------------------------------------


def all_instructions() -> list[PimInstr]:
    out = []
    kinds = [G(3), S(5), B]
    for op, info in pm.OP_INFO.items():
        for dst in (G(7), B):
            for srcs in itertools.product(kinds, repeat=info.sources):
                try:
                    out.append(
                        PimInstr(
                            op=op,
                            dst=dst,
                            src0=srcs[0],
                            src1=srcs[1] if len(srcs) > 1 else None,
                            src2=srcs[2] if len(srcs) > 2 else None,
                        )
                    )
                except PimError:
                    pass
    return out


def test_encode_decode_round_trip() -> None:
    instrs = all_instructions()
    assert len(instrs) > 50
    assert {i.op for i in instrs} == set(PimOp)
    for ins in instrs:
        word = pm.encode_instr(ins)
        assert 0 <= word < 1 << 24
        assert pm.decode_instr(word) == ins
        assert pm.decode_instr(word | 0xAB000000) == ins  # reserved bits ignored


def test_encoding_layout() -> None:
    ins = PimInstr(op=PimOp.MAD, dst=G(5), src0=S(2), src1=B, src2=G(7))
    expected = 4 | 0 << 4 | 5 << 6 | 1 << 9 | 2 << 11 | 2 << 14 | 0 << 16 | 0 << 19 | 7 << 21
    assert pm.encode_instr(ins) == expected


@pytest.mark.parametrize(
    ("word", "match"),
    [
        (0, r"unknown PIM opcode 0"),
        (9, r"unknown PIM opcode 9"),
        (int(PimOp.MOV) | 1 << 4, r"dst must be a GRF or BANK operand, got SRF\[0\]"),
        (int(PimOp.MOV) | 3 << 9, r"MOV: invalid operand kind 3 in s0"),
        (int(PimOp.FILL) | 0 << 9, r"FILL moves BANK into a GRF"),
        (int(PimOp.MAC) | 2 << 4 | 2 << 9 | 2 << 14, r"MAC accumulates into a GRF, got dst=BANK"),
        (1 << 32, r"instruction word must be a 32-bit unsigned integer"),
    ],
)
def test_decode_rejects(word: int, match: str) -> None:
    with pytest.raises(PimError, match=match):
        pm.decode_instr(word)


def test_unused_source_fields_are_ignored() -> None:
    word = int(PimOp.RELU) | 3 << 14 | 3 << 19  # kind 3 in unused s1/s2
    assert pm.decode_instr(word) == PimInstr(op=PimOp.RELU, dst=G(0), src0=G(0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"op": PimOp.ADD, "dst": G(0), "src0": G(1)},
            r"ADD needs 2 source operands, src1 is missing",
        ),
        (
            {"op": PimOp.MOV, "dst": G(0), "src0": G(1), "src1": G(2)},
            r"MOV takes 1 source operand\(s\), got src1=GRF\[2\]",
        ),
        ({"op": PimOp.ADD, "dst": S(0), "src0": G(1), "src1": G(1)}, r"dst must be a GRF or BANK"),
        ({"op": PimOp.FILL, "dst": B, "src0": B}, r"FILL moves BANK into a GRF"),
        ({"op": 12, "dst": G(0), "src0": G(1)}, r"unknown PIM opcode 12"),
        ({"op": PimOp.MOV, "dst": "g0", "src0": G(1)}, r"MOV: dst must be an Operand, got 'g0'"),
    ],
)
def test_instr_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(PimError, match=match):
        PimInstr(**kwargs)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((OperandKind.GRF, 8), r"GRF index must be in \[0, 7\], got 8"),
        ((OperandKind.BANK, 1), r"BANK index must be in \[0, 0\], got 1"),
        ((7, 0), r"operand kind must be GRF, SRF or BANK, got 7"),
    ],
)
def test_operand_validation(args: tuple, match: str) -> None:
    with pytest.raises(PimError, match=match):
        Operand(*args)


def test_validate_program_names_the_bad_index() -> None:
    good = PimInstr(op=PimOp.MOV, dst=G(0), src0=S(1))
    assert pm.validate_program([good, pm.encode_instr(good)]) == [good, good]
    with pytest.raises(PimError, match=r"instruction 2: unknown PIM opcode 0"):
        pm.validate_program([good, good, 0])
    with pytest.raises(PimError, match=r"instruction 0: expected a PimInstr"):
        pm.validate_program(["ADD"])


# ---- arithmetic ------------------------------------------------------------------------


def test_alu_wraps_int16() -> None:
    a = np.array([32767, -32768, 256, -32768, -5, 0] + [1] * 10)
    b = np.array([1, -1, 256, -1, 3, 7] + [2] * 10)
    assert pm.pim_alu(PimOp.ADD, a, b)[:6].tolist() == [-32768, 32767, 512, 32767, -2, 7]
    assert pm.pim_alu(PimOp.MUL, a, b)[:6].tolist() == [32767, -32768, 0, -32768, -15, 0]
    assert pm.pim_alu(PimOp.RELU, a)[:6].tolist() == [32767, 0, 256, 0, 0, 0]


def test_alu_matches_integer_reference_on_random_data() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        a, b, c, d = (rng.integers(-32768, 32768, 16) for _ in range(4))
        ref = {
            PimOp.ADD: [wrap16(x + y) for x, y in zip(a, b, strict=True)],
            PimOp.MUL: [wrap16(x * y) for x, y in zip(a, b, strict=True)],
            PimOp.MAC: [wrap16(z + x * y) for x, y, z in zip(a, b, d, strict=True)],
            PimOp.MAD: [wrap16(x * y + z) for x, y, z in zip(a, b, c, strict=True)],
            PimOp.RELU: [max(int(x), 0) for x in a],
            PimOp.MOV: [int(x) for x in a],
            PimOp.FILL: [int(x) for x in a],
        }
        for op, expected in ref.items():
            got = pm.pim_alu(op, a, b, c, d)
            assert got.dtype == np.int16
            assert got.tolist() == expected, op


# ---- the bank model --------------------------------------------------------------------


def req(cmd: PimCommand, **kw: object) -> PimRequest:
    return PimRequest(cmd=cmd, **kw)


def test_bank_row_buffer_semantics() -> None:
    bank = PimBank(rows=4, cols=2)
    data = tuple(range(-8, 8))
    bank.execute(req(PimCommand.ACT, row=2))
    bank.execute(req(PimCommand.WR, col=1, data=data))
    assert not bank.array[2, 1].any()  # only the row buffer until PRE
    assert bank.execute(req(PimCommand.RD, col=1)).tolist() == list(data)
    bank.execute(req(PimCommand.PRE))
    assert bank.array[2, 1].tolist() == list(data)
    assert bank.open_row is None
    bank.execute(req(PimCommand.PRE))  # PRE when closed: no-op
    bank.execute(req(PimCommand.ACT, row=2))
    assert bank.execute(req(PimCommand.RD, col=1)).tolist() == list(data)


def test_bank_ops_use_grf_srf_and_bank() -> None:
    bank = PimBank(rows=1, cols=2)
    bank.execute(req(PimCommand.WRSRF, data=tuple(range(100, 116))))
    bank.execute(req(PimCommand.ACT, row=0))
    bank.execute(req(PimCommand.WR, col=0, data=(3,) * 16))

    def op(o: PimOp, col: int = 0, **kw: Operand) -> PimRequest:
        return req(PimCommand.OP, col=col, instr=PimInstr(op=o, **kw))

    bank.execute(op(PimOp.FILL, dst=G(0), src0=B))
    bank.execute(op(PimOp.MAD, dst=G(1), src0=G(0), src1=S(2), src2=B))  # 3*102 + 3
    assert bank.grf[1].tolist() == [309] * 16
    bank.execute(op(PimOp.MAC, dst=G(1), src0=G(0), src1=G(0)))  # + 9
    bank.execute(op(PimOp.MOV, col=1, dst=B, src0=G(1)))
    assert bank.execute(req(PimCommand.RD, col=1)).tolist() == [318] * 16


@pytest.mark.parametrize(
    ("setup", "bad", "match"),
    [
        ([], req(PimCommand.RD, col=0), r"RD: no open row"),
        ([req(PimCommand.ACT, row=0)], req(PimCommand.ACT, row=1), r"ACT 1: row 0 is still open"),
        ([], req(PimCommand.ACT, row=4), r"ACT: row 4 out of range \[0, 3\]"),
        (
            [req(PimCommand.ACT, row=0)],
            req(PimCommand.WR, col=2, data=(0,) * 16),
            r"WR: column 2 out of range \[0, 1\]",
        ),
        (
            [],
            req(PimCommand.OP, instr=PimInstr(op=PimOp.FILL, dst=G(0), src0=B)),
            r"OP: no open row",
        ),
        ([], req(PimCommand.OP, instr=0xF), r"unknown PIM opcode 15"),
    ],
)
def test_bank_illegal_commands_change_nothing(setup: list, bad: PimRequest, match: str) -> None:
    bank = PimBank(rows=4, cols=2)
    for r in setup:
        bank.execute(r)
    before = (bank.array.copy(), bank.row_buffer.copy(), bank.open_row, bank.grf.copy())
    assert bank.latency(bad) == pm.error_cycles()
    with pytest.raises(PimError, match=match):
        bank.execute(bad)
    assert np.array_equal(bank.array, before[0]) and bank.open_row == before[2]
    assert np.array_equal(bank.row_buffer, before[1]) and np.array_equal(bank.grf, before[3])


def test_ops_without_bank_operands_need_no_open_row() -> None:
    bank = PimBank()
    r = req(PimCommand.OP, instr=PimInstr(op=PimOp.ADD, dst=G(0), src0=G(1), src1=S(0)))
    assert bank.latency(r) == 3
    bank.execute(r)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"cmd": PimCommand.WR, "data": (1, 2)}, PimError, r"WR needs data of 16 lanes"),
        ({"cmd": PimCommand.OP}, PimError, r"OP needs an instr"),
        ({"cmd": 9}, ValueError, r"9 is not a valid PimCommand"),
    ],
)
def test_request_validation(kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        PimRequest(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"rows": 0}, ValueError, r"rows must be between 1 and 4096, got 0"),
        ({"cols": "8"}, TypeError, r"cols must be an integer, got '8'"),
    ],
)
def test_bank_validation(kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        PimBank(**kwargs)


def test_request_data_wraps_to_int16() -> None:
    r = req(PimCommand.WR, data=(40000,) + (0,) * 15)
    assert r.data[0] == 40000 - 65536
