"""Processing-in-memory bank: ISA, golden model and command timing.

One DRAM bank of a 3D-stacked memory with a SIMD unit beside its row buffer, after the
published HBM-PIM organisation (Samsung Aquabolt-XL / FIMDRAM: a 256-bit column access
feeds 16 lanes of 16 bits; general registers ``GRF``, scalar registers ``SRF``; ops
ADD, MUL, MAC, MAD, MOV (with a ReLU variant) and FILL). The RTL (``wia_hw.rtl.PimBank``)
is checked against this module bit for bit and cycle for cycle; the emulator and the PIM
extension compute with it.

Number format
-------------
Every lane is a 16-bit two's-complement integer (``int16``). ADD, MUL, MAC and MAD wrap
modulo ``2**16`` (a product keeps its low 16 bits; nothing saturates). RELU maps negative
lanes to 0. Fixed-point use is up to the program (e.g. Q8.8 needs a shift the ISA does
not have), so the golden model is exact integer arithmetic.

State
-----
``rows`` x ``cols`` columns of 256 bits (16 lanes) in the DRAM array; one row buffer of
``cols`` columns; ``GRF_ENTRIES`` (8) vector registers of 16 lanes; ``SRF_ENTRIES`` (8)
scalar int16 registers, broadcast to all lanes when read.

Commands (:class:`PimCommand`) and their latency
------------------------------------------------
A command is accepted at a rising edge (edge 0); ``done`` is high in cycle ``N`` (the
period after edge ``N``) with ``N`` given by the function beside each.

Issue rule (:func:`issue_interval`). *Column commands* (legal RD, WR and OP: each is one
256-bit column access of the open row, as HBM-PIM triggers its SIMD units with column
commands) are pipelined: the next column command may be accepted ``t_ccd`` cycles after
the previous one (the column-to-column delay of a bank group, HBM2's tCCD_L), and no
earlier than it takes for its ``done`` to come strictly after the previous ``done``
(completions stay in program order, one per cycle). Every other pair waits for the
previous command to finish: a row command (ACT, PRE), WRSRF and an illegal command are
accepted at the earliest at the edge where the previous command's ``done`` rises, and
the command after them likewise. Commands take effect in program order (a column command
reads the state its predecessors left, as a fully forwarded pipeline would), so the
values are those of executing the program one command at a time. A program issued back
to back takes :func:`program_cycles`.

- ``ACT row``: open ``row``, copying it into the row buffer: :func:`activate_cycles`
  (``t_rcd``). Illegal while a row is open or for ``row >= rows``.
- ``PRE``: write the row buffer back to the open row and close it (no-op when closed):
  :func:`precharge_cycles` (``t_rp``).
- ``RD col``: return row-buffer column ``col``: :func:`read_cycles` (``t_cl``).
- ``WR col data``: write row-buffer column ``col``: :func:`write_cycles` (``t_wr``).
  RD and WR need an open row and ``col < cols``.
- ``WRSRF data``: ``SRF[i] = data[i]`` for ``i < 8``: :func:`srf_write_cycles` (1).
- ``OP col instr``: execute one :class:`PimInstr`; a ``BANK`` operand is row-buffer
  column ``col`` (needs an open row): :func:`op_cycles` (``2 + mul + alu``: accept,
  operand read, a multiply stage if the op multiplies, an ALU stage if it adds or
  applies ReLU, write-back).

An illegal command changes nothing and reports an error after :func:`error_cycles` (1).

Instruction encoding (32-bit word, :data:`INSTR_FIELDS`, LSB first)
-------------------------------------------------------------------
``op[3:0] dst_kind[5:4] dst_idx[8:6] s0_kind[10:9] s0_idx[13:11] s1_kind[15:14]
s1_idx[18:16] s2_kind[20:19] s2_idx[23:21]``, bits 31:24 reserved (ignored). Kinds are
:class:`OperandKind` codes (3 is invalid); fields of unused sources are ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import WiaError

__all__ = [
    "LANES",
    "LANE_BITS",
    "WORD_BITS",
    "GRF_ENTRIES",
    "SRF_ENTRIES",
    "INSTR_FIELDS",
    "PimOp",
    "OperandKind",
    "Operand",
    "PimInstr",
    "OP_INFO",
    "OpInfo",
    "PimCommand",
    "PimRequest",
    "PimTiming",
    "PimError",
    "PimBank",
    "encode_instr",
    "decode_instr",
    "validate_program",
    "pim_alu",
    "wrap_int16",
    "activate_cycles",
    "precharge_cycles",
    "read_cycles",
    "write_cycles",
    "srf_write_cycles",
    "op_cycles",
    "error_cycles",
    "command_cycles",
    "program_cycles",
    "COLUMN_COMMANDS",
    "issue_interval",
    "request_timing",
]

#: Lanes per 256-bit access and bits per lane.
LANES = 16
LANE_BITS = 16
WORD_BITS = LANES * LANE_BITS
#: Vector (GRF) and scalar (SRF) register counts.
GRF_ENTRIES = 8
SRF_ENTRIES = 8

#: Instruction word layout: (field, lsb, width).
INSTR_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("op", 0, 4),
    ("dst_kind", 4, 2),
    ("dst_idx", 6, 3),
    ("s0_kind", 9, 2),
    ("s0_idx", 11, 3),
    ("s1_kind", 14, 2),
    ("s1_idx", 16, 3),
    ("s2_kind", 19, 2),
    ("s2_idx", 21, 3),
)


class PimError(WiaError, ValueError):
    """A PIM instruction or command is invalid (bad encoding, or illegal in the state)."""


class PimOp(enum.IntEnum):
    """Opcodes of the SIMD unit (the value is the 4-bit encoding)."""

    ADD = 1  # dst = s0 + s1
    MUL = 2  # dst = s0 * s1
    MAC = 3  # dst = dst + s0 * s1   (dst must be a GRF)
    MAD = 4  # dst = s0 * s1 + s2
    RELU = 5  # dst = max(s0, 0)
    MOV = 6  # dst = s0
    FILL = 7  # dst(GRF) = s0(BANK): load a row-buffer column into a register


class OperandKind(enum.IntEnum):
    """Where an operand lives (the value is the 2-bit encoding)."""

    GRF = 0  # vector register, index 0..7
    SRF = 1  # scalar register, index 0..7, broadcast to 16 lanes (source only)
    BANK = 2  # row-buffer column selected by the command's ``col`` (index must be 0)


@dataclass(frozen=True)
class OpInfo:
    """Static properties of an opcode: sources read, pipeline stages used."""

    sources: int
    uses_mul: bool
    uses_alu: bool


#: Per-opcode properties; :func:`op_cycles` derives the latency from them.
OP_INFO: dict[PimOp, OpInfo] = {
    PimOp.ADD: OpInfo(2, False, True),
    PimOp.MUL: OpInfo(2, True, False),
    PimOp.MAC: OpInfo(2, True, True),
    PimOp.MAD: OpInfo(3, True, True),
    PimOp.RELU: OpInfo(1, False, True),
    PimOp.MOV: OpInfo(1, False, False),
    PimOp.FILL: OpInfo(1, False, False),
}


@dataclass(frozen=True)
class Operand:
    """One operand: ``Operand(OperandKind.GRF, 3)``, ``Operand.bank()``..."""

    kind: OperandKind
    index: int = 0

    def __post_init__(self) -> None:
        try:
            kind = OperandKind(self.kind)
        except ValueError:
            raise PimError(f"operand kind must be GRF, SRF or BANK, got {self.kind!r}") from None
        object.__setattr__(self, "kind", kind)
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise PimError(f"operand index must be an integer, got {self.index!r}")
        limit = {OperandKind.GRF: GRF_ENTRIES, OperandKind.SRF: SRF_ENTRIES, OperandKind.BANK: 1}[
            kind
        ]
        if not 0 <= self.index < limit:
            raise PimError(f"{kind.name} index must be in [0, {limit - 1}], got {self.index}")

    @classmethod
    def grf(cls, index: int) -> Operand:
        return cls(OperandKind.GRF, index)

    @classmethod
    def srf(cls, index: int) -> Operand:
        return cls(OperandKind.SRF, index)

    @classmethod
    def bank(cls) -> Operand:
        return cls(OperandKind.BANK, 0)

    def __str__(self) -> str:
        return "BANK" if self.kind is OperandKind.BANK else f"{self.kind.name}[{self.index}]"


@dataclass(frozen=True, kw_only=True)
class PimInstr:
    """One SIMD instruction; validated on construction (:class:`PimError` names the rule).

    Rules: ``dst`` is a GRF or BANK operand; exactly ``OP_INFO[op].sources`` sources are
    given (``src0``, ``src1``, ``src2`` in order); FILL reads BANK into a GRF; MAC
    accumulates into a GRF.
    """

    op: PimOp
    dst: Operand
    src0: Operand
    src1: Operand | None = None
    src2: Operand | None = None

    def __post_init__(self) -> None:
        try:
            op = PimOp(self.op)
        except ValueError:
            raise PimError(f"unknown PIM opcode {self.op!r}") from None
        object.__setattr__(self, "op", op)
        for name in ("dst", "src0", "src1", "src2"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, Operand):
                raise PimError(f"{op.name}: {name} must be an Operand, got {v!r}")
        if self.dst.kind is OperandKind.SRF:
            raise PimError(f"{op.name}: dst must be a GRF or BANK operand, got {self.dst}")
        n = OP_INFO[op].sources
        given = (self.src0, self.src1, self.src2)
        for i, s in enumerate(given):
            if i < n and s is None:
                raise PimError(f"{op.name} needs {n} source operands, src{i} is missing")
            if i >= n and s is not None:
                raise PimError(f"{op.name} takes {n} source operand(s), got src{i}={s}")
        if op is PimOp.FILL and (
            self.src0.kind is not OperandKind.BANK or self.dst.kind is not OperandKind.GRF
        ):
            raise PimError(f"FILL moves BANK into a GRF, got dst={self.dst} src0={self.src0}")
        if op is PimOp.MAC and self.dst.kind is not OperandKind.GRF:
            raise PimError(f"MAC accumulates into a GRF, got dst={self.dst}")

    @property
    def sources(self) -> tuple[Operand, ...]:
        return tuple(s for s in (self.src0, self.src1, self.src2) if s is not None)

    @property
    def uses_bank(self) -> bool:
        """True if any operand is the row-buffer column (the row must be open)."""
        return any(o.kind is OperandKind.BANK for o in (self.dst, *self.sources))

    def __str__(self) -> str:
        return f"{self.op.name} {self.dst}, " + ", ".join(map(str, self.sources))


def _field(word: int, name: str) -> int:
    for fname, lsb, width in INSTR_FIELDS:
        if fname == name:
            return (word >> lsb) & ((1 << width) - 1)
    raise KeyError(name)  # pragma: no cover


def encode_instr(instr: PimInstr) -> int:
    """The 32-bit instruction word of ``instr`` (unused fields zero)."""
    if not isinstance(instr, PimInstr):
        raise TypeError(f"instr must be a PimInstr, got {instr!r}")
    values = {"op": int(instr.op), "dst_kind": int(instr.dst.kind), "dst_idx": instr.dst.index}
    for i, s in enumerate(instr.sources):
        values[f"s{i}_kind"] = int(s.kind)
        values[f"s{i}_idx"] = s.index
    word = 0
    for fname, lsb, width in INSTR_FIELDS:
        word |= (values.get(fname, 0) & ((1 << width) - 1)) << lsb
    return word


def decode_instr(word: int) -> PimInstr:
    """The instruction of a 32-bit word, as the RTL decodes it; :class:`PimError` if invalid.

    The index of a BANK operand and the fields of unused sources are ignored.
    """
    if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word < 1 << 32:
        raise PimError(f"instruction word must be a 32-bit unsigned integer, got {word!r}")
    try:
        op = PimOp(_field(word, "op"))
    except ValueError:
        raise PimError(f"unknown PIM opcode {_field(word, 'op')} in word {word:#010x}") from None

    def operand(prefix: str) -> Operand:
        code = _field(word, f"{prefix}_kind")
        try:
            kind = OperandKind(code)
        except ValueError:
            raise PimError(
                f"{op.name}: invalid operand kind {code} in {prefix} of word {word:#010x}"
            ) from None
        return Operand(kind, 0 if kind is OperandKind.BANK else _field(word, f"{prefix}_idx"))

    srcs = [operand(f"s{i}") for i in range(OP_INFO[op].sources)]
    srcs += [None] * (3 - len(srcs))
    return PimInstr(op=op, dst=operand("dst"), src0=srcs[0], src1=srcs[1], src2=srcs[2])


def validate_program(instrs: Iterable[PimInstr | int]) -> list[PimInstr]:
    """Check a list of instructions (or encoded words); return them as :class:`PimInstr`.

    Raises :class:`PimError` naming the index of the first bad instruction.
    """
    out = []
    for i, ins in enumerate(instrs):
        try:
            out.append(decode_instr(ins) if isinstance(ins, int) else _check_instr(ins))
        except PimError as e:
            raise PimError(f"instruction {i}: {e}") from None
    return out


def _check_instr(ins: object) -> PimInstr:
    if not isinstance(ins, PimInstr):
        raise PimError(f"expected a PimInstr or an instruction word, got {ins!r}")
    return ins


def wrap_int16(x: np.ndarray | int) -> np.ndarray:
    """Reduce integers modulo ``2**16`` into int16 (two's complement), as a lane does."""
    x = np.asarray(x, dtype=np.int64)
    return ((x + (1 << 15)) % (1 << 16) - (1 << 15)).astype(np.int16)


def pim_alu(
    op: PimOp,
    s0: np.ndarray,
    s1: np.ndarray | None = None,
    s2: np.ndarray | None = None,
    dst: np.ndarray | None = None,
) -> np.ndarray:
    """The 16-lane result of ``op`` (golden model of the SIMD unit), as int16.

    ``s0..s2`` are the source lanes (an SRF operand already broadcast), ``dst`` the old
    destination (read by MAC only).
    """
    a = np.asarray(s0, dtype=np.int64)
    op = PimOp(op)
    if op is PimOp.ADD:
        r = a + np.asarray(s1, dtype=np.int64)
    elif op is PimOp.MUL:
        r = a * np.asarray(s1, dtype=np.int64)
    elif op is PimOp.MAC:
        r = np.asarray(dst, dtype=np.int64) + wrap_int16(a * np.asarray(s1, dtype=np.int64))
    elif op is PimOp.MAD:
        r = wrap_int16(a * np.asarray(s1, dtype=np.int64)) + np.asarray(s2, dtype=np.int64)
    elif op is PimOp.RELU:
        r = np.maximum(a, 0)
    else:  # MOV, FILL
        r = a
    return wrap_int16(r)


# ---- timing ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PimTiming:
    """DRAM command latencies of the bank, in bank clock cycles (each 1..255).

    Defaults are HBM2-like at 1 GHz (tRCD = tRP = CL = 14 ns, tWR = 16 ns) and
    ``t_ccd`` = 4, HBM2's tCCD_L (column-to-column delay within a bank group, 4 nCK in
    JEDEC JESD235); Samsung's HBM-PIM issues its PIM operations at that spacing (Lee et
    al., "Hardware Architecture and Software Stack for PIM Based on Commercial DRAM
    Technology", ISCA 2021).
    """

    t_rcd: int = 14
    t_rp: int = 14
    t_cl: int = 14
    t_wr: int = 16
    t_ccd: int = 4

    def __post_init__(self) -> None:
        for name in ("t_rcd", "t_rp", "t_cl", "t_wr", "t_ccd"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an integer, got {v!r}")
            if not 1 <= v <= 255:
                raise ValueError(f"{name} must be between 1 and 255, got {v}")


def activate_cycles(timing: PimTiming) -> int:
    """ACT: row into the row buffer, ``t_rcd`` cycles."""
    return timing.t_rcd


def precharge_cycles(timing: PimTiming) -> int:
    """PRE: row buffer back to the array, ``t_rp`` cycles."""
    return timing.t_rp


def read_cycles(timing: PimTiming) -> int:
    """RD: one 256-bit column out, ``t_cl`` cycles (CAS latency)."""
    return timing.t_cl


def write_cycles(timing: PimTiming) -> int:
    """WR: one 256-bit column in, ``t_wr`` cycles (write recovery)."""
    return timing.t_wr


def srf_write_cycles() -> int:
    """WRSRF: load the scalar registers, 1 cycle."""
    return 1


def error_cycles() -> int:
    """An illegal command reports its error after 1 cycle."""
    return 1


def op_cycles(op: PimOp) -> int:
    """OP: accept + operand read + [multiply] + [ALU] + write-back.

    ADD 3, MUL 3, MAC 4, MAD 4, RELU 3, MOV 2, FILL 2 cycles.
    """
    info = OP_INFO[PimOp(op)]
    return 2 + int(info.uses_mul) + int(info.uses_alu)


class PimCommand(enum.IntEnum):
    """Bank commands (the value is the 3-bit encoding on the RTL's ``cmd`` port)."""

    ACT = 0
    PRE = 1
    RD = 2
    WR = 3
    WRSRF = 4
    OP = 5


@dataclass(frozen=True, kw_only=True)
class PimRequest:
    """One command to the bank. ``data`` (16 int16 lanes) for WR and WRSRF; ``instr`` for
    OP, a :class:`PimInstr` or a raw 32-bit word (which may be invalid)."""

    cmd: PimCommand
    row: int = 0
    col: int = 0
    data: tuple[int, ...] | None = None
    instr: PimInstr | int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cmd", PimCommand(self.cmd))
        if self.cmd in (PimCommand.WR, PimCommand.WRSRF):
            if self.data is None or len(self.data) != LANES:
                raise PimError(f"{self.cmd.name} needs data of {LANES} lanes, got {self.data!r}")
            object.__setattr__(self, "data", tuple(int(v) for v in wrap_int16(self.data)))
        if self.cmd is PimCommand.OP and self.instr is None:
            raise PimError("OP needs an instr")

    @property
    def word(self) -> int:
        """The instruction word driven on the RTL's ``instr`` port (0 if not an OP)."""
        if self.instr is None:
            return 0
        return self.instr if isinstance(self.instr, int) else encode_instr(self.instr)


def command_cycles(req: PimRequest, timing: PimTiming) -> int:
    """Latency of a legal command (see the module docstring)."""
    return {
        PimCommand.ACT: lambda: activate_cycles(timing),
        PimCommand.PRE: lambda: precharge_cycles(timing),
        PimCommand.RD: lambda: read_cycles(timing),
        PimCommand.WR: lambda: write_cycles(timing),
        PimCommand.WRSRF: srf_write_cycles,
        PimCommand.OP: lambda: op_cycles(decode_instr(req.word).op),
    }[req.cmd]()


#: Commands that access one column of the open row; pipelined at ``t_ccd`` when legal.
COLUMN_COMMANDS = frozenset({PimCommand.RD, PimCommand.WR, PimCommand.OP})


def request_timing(req: PimRequest, timing: PimTiming, *, legal: bool = True) -> tuple[int, bool]:
    """``(latency, is_column)`` of a command: what :func:`issue_interval` needs.

    An illegal command takes :func:`error_cycles` and is never a column command.
    """
    if not legal:
        return error_cycles(), False
    return command_cycles(req, timing), req.cmd in COLUMN_COMMANDS


def issue_interval(prev: tuple[int, bool], nxt: tuple[int, bool], timing: PimTiming) -> int:
    """Fewest cycles from the acceptance of one command to that of the next.

    ``prev`` and ``nxt`` are ``(latency, is_column)`` (:func:`request_timing`). Two
    column commands: ``max(t_ccd, latency_prev - latency_next + 1)``, the second term
    keeping ``done`` in program order; any other pair: ``latency_prev`` (the next command
    is accepted at the edge where the previous ``done`` rises).
    """
    (lp, cp), (ln, cn) = prev, nxt
    if cp and cn:
        return max(timing.t_ccd, lp - ln + 1)
    return lp


def program_cycles(reqs: Sequence[PimRequest], timing: PimTiming) -> int:
    """Cycles of a command sequence issued back to back (all legal), from the first
    acceptance to the last ``done``: the sum of :func:`issue_interval` between
    neighbours plus the last command's latency."""
    total = 0
    prev: tuple[int, bool] | None = None
    for r in reqs:
        cur = request_timing(r, timing)
        if prev is not None:
            total += issue_interval(prev, cur, timing)
        prev = cur
    return total + prev[0] if prev is not None else 0


# ---- golden model ----------------------------------------------------------------------


@dataclass
class PimBank:
    """Golden model of one PIM bank (state and semantics equal to the RTL's).

    ``execute(req)`` applies a command and returns the column read by RD (else ``None``);
    an illegal command raises :class:`PimError` and changes nothing. ``latency(req)`` is
    what the RTL takes for it in the current state (``error_cycles()`` if illegal).
    """

    rows: int = 16
    cols: int = 8
    timing: PimTiming = field(default_factory=PimTiming)
    array: np.ndarray = field(init=False)
    row_buffer: np.ndarray = field(init=False)
    open_row: int | None = field(init=False, default=None)
    grf: np.ndarray = field(init=False)
    srf: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for name, hi in (("rows", 4096), ("cols", 64)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an integer, got {v!r}")
            if not 1 <= v <= hi:
                raise ValueError(f"{name} must be between 1 and {hi}, got {v}")
        self.array = np.zeros((self.rows, self.cols, LANES), dtype=np.int16)
        self.row_buffer = np.zeros((self.cols, LANES), dtype=np.int16)
        self.grf = np.zeros((GRF_ENTRIES, LANES), dtype=np.int16)
        self.srf = np.zeros(SRF_ENTRIES, dtype=np.int16)

    def check(self, req: PimRequest) -> None:
        """Raise :class:`PimError` if ``req`` is illegal in the current state."""
        if req.cmd is PimCommand.ACT:
            if self.open_row is not None:
                raise PimError(f"ACT {req.row}: row {self.open_row} is still open")
            if not 0 <= req.row < self.rows:
                raise PimError(f"ACT: row {req.row} out of range [0, {self.rows - 1}]")
        needs_row = req.cmd in (PimCommand.RD, PimCommand.WR)
        if req.cmd is PimCommand.OP:
            needs_row = decode_instr(req.word).uses_bank
        if needs_row:
            if self.open_row is None:
                raise PimError(f"{req.cmd.name}: no open row")
            if not 0 <= req.col < self.cols:
                raise PimError(
                    f"{req.cmd.name}: column {req.col} out of range [0, {self.cols - 1}]"
                )

    def latency(self, req: PimRequest) -> int:
        """Cycles from acceptance to ``done`` for ``req`` in the current state."""
        return self.request_timing(req)[0]

    def request_timing(self, req: PimRequest) -> tuple[int, bool]:
        """``(latency, is_column)`` of ``req`` in the current state (an illegal command
        is not a column command); feed two of them to :func:`issue_interval`."""
        try:
            self.check(req)
        except PimError:
            return request_timing(req, self.timing, legal=False)
        return request_timing(req, self.timing)

    def _read(self, o: Operand, col: int) -> np.ndarray:
        if o.kind is OperandKind.GRF:
            return self.grf[o.index].copy()
        if o.kind is OperandKind.SRF:
            return np.full(LANES, self.srf[o.index], dtype=np.int16)
        return self.row_buffer[col].copy()

    def execute(self, req: PimRequest) -> np.ndarray | None:
        """Apply ``req``; return the RD data (16 int16 lanes) or ``None``."""
        self.check(req)
        c = req.cmd
        if c is PimCommand.ACT:
            self.row_buffer = self.array[req.row].copy()
            self.open_row = req.row
        elif c is PimCommand.PRE:
            if self.open_row is not None:
                self.array[self.open_row] = self.row_buffer
            self.open_row = None
        elif c is PimCommand.RD:
            return self.row_buffer[req.col].copy()
        elif c is PimCommand.WR:
            self.row_buffer[req.col] = np.asarray(req.data, dtype=np.int16)
        elif c is PimCommand.WRSRF:
            self.srf[:] = np.asarray(req.data[:SRF_ENTRIES], dtype=np.int16)
        else:
            ins = decode_instr(req.word)
            srcs = [self._read(s, req.col) for s in ins.sources]
            srcs += [None] * (3 - len(srcs))
            old = self.grf[ins.dst.index] if ins.dst.kind is OperandKind.GRF else None
            value = pim_alu(ins.op, srcs[0], srcs[1], srcs[2], old)
            if ins.dst.kind is OperandKind.GRF:
                self.grf[ins.dst.index] = value
            else:
                self.row_buffer[req.col] = value
        return None
