"""The processing-in-memory extension: elementwise ops and small kernels inside HBM banks
(seed 8.9.2).

Seed::

    wia_pim_config_t pim_cfg = {.pim_type = WIA_PIM_3D_STACKED, .memory_capacity_gb = 16,
        .bandwidth_gb_s = 2000, .compute_units_per_bank = 8};
    wia_pim_operation_t pim_op = {.type = WIA_PIM_ELEMENTWISE, .operation = WIA_OP_RELU,
        .in_place = true};
    wia_pim_execute(ctx, &pim_cfg, &pim_op, data, size);

Python (``WIA_OP_RELU`` is :attr:`ElementwiseOp.RELU`; this module also names the enum
``Op``, the seed's spelling; ``wia_hw.Op`` is the graph op class, which carries the
members as class attributes, so ``wia_hw.Op.RELU is ElementwiseOp.RELU`` too)::

    cfg = PIMConfig(pim_type=PIMType.STACKED_3D, memory_capacity_gb=16, bandwidth_gb_s=2000,
                    compute_units_per_bank=8)
    res = pim_execute(ctx, cfg, PIMOperation(type=PIMOpType.ELEMENTWISE,
                                             operation=ElementwiseOp.RELU, in_place=True),
                      data, size)

**The machine** is the PIM bank of :mod:`wia_hw.emulator.pim_model` (the RTL's golden
model): a DRAM bank with a row buffer of ``bank_columns`` 256-bit columns (16 int16
lanes each), beside it SIMD units with 8 vector and 8 scalar registers. A bank's
columns are split evenly over its ``compute_units_per_bank`` units; every unit of every
bank executes the same command stream in lock step (all-bank mode: one command reaches
all banks), so an operation takes the cycles of the busiest unit's command stream,
``program_cycles(stream)`` at ``pim_clock_ghz``: the bank's command latencies and
issue rule (:func:`~wia_hw.emulator.pim_model.program_cycles`), exactly what the RTL
takes (``tests/rtl/tb_pim_bank.py``). The bank's ``t_cl`` and ``t_wr`` are its ``RD``
and ``WR`` commands' latencies; the streams here trigger their ops on the open row
without RD or WR, so those two fields change no result of this extension (declared so
in ``pim.yaml``). A real HBM-PIM pays CAS latency and write recovery on its
column-triggered ops; the bank RTL and its model leave that out, and the emulator
follows the RTL (one cycle function per block), so PIM op streams are optimistic by up
to ``t_cl`` per op and ``t_wr`` per row.
Data lives row-interleaved over the banks: row ``r`` of ``bank_columns * 16`` elements
is in bank ``r % banks``. An operation must fit ``memory_capacity_gb``
(:func:`footprint_bytes`: whole rows of the data, the operand and a separate output).

**Number format**: int16 lanes, wrapping arithmetic (the bank's format). ``float16`` and
bfloat16 bit patterns may go through RELU, COPY and FILL exactly (a 16-bit float's sign
is its top bit, so ``max(bits, 0)`` as int16 is the float ReLU); arithmetic on floats is
refused (it would not be exact).

**Elementwise ops** (:class:`ElementwiseOp`) and their bank programs, per row
(``ACT``/``PRE`` open and close a row; operands in other rows are staged 8 columns at a
time into the vector registers with FILL, so those ops reopen their rows every 8
columns; RELU, SCALE and FILL in place use no vector register and open each row once):

=========  ===================================================================
RELU       ``BANK <- relu(BANK)``
ADD        ``x += y``: FILL ``GRF[j] <- y``; ``BANK <- BANK + GRF[j]``
SUB        ``x -= y``: ``BANK <- GRF[j] * SRF[0] + BANK`` with ``SRF[0] = -1`` (MAD)
MUL        ``x *= y``: ``BANK <- BANK * GRF[j]``
SCALE      ``x *= s``: ``BANK <- BANK * SRF[0]``
AXPY       ``x += s * y``: ``BANK <- GRF[j] * SRF[0] + BANK`` (MAD)
FILL       ``x = s``: ``BANK <- SRF[0]`` (MOV)
COPY       ``x = y``: ``BANK <- GRF[j]`` (MOV)
=========  ===================================================================

With ``in_place=False`` the result goes to a separate output region (the input is
kept); it costs one more row activation per row to stage the input (FILL and COPY,
which do not read it, write the output row directly).

**Kernels** (:class:`PIMKernel`) replace the seed's C string with a validated program
for the bank ISA: ``body`` instructions run for every column of every row (``BANK`` is
the current column, in place), after ``scalars`` are loaded into the SRF and the
``prologue`` (no ``BANK`` operand) has run once. The seed's field name ``code`` is
accepted for ``body`` (an instruction list; a C string is refused in one line).

**Energy**: ``act_energy_pj`` per row activation (plus precharge) -- one per row a
bank opens, shared by its units, and each bank only for its own rows --,
``column_energy_pj`` per 256-bit column access inside the bank (an op with a ``BANK``
operand), ``op_energy_pj`` per 16-lane SIMD op (defaults after the HBM2 energy
breakdown of O'Connor et al., MICRO 2017: ~0.9 nJ to activate a 1 KB row, local
column access well under the ~3.9 pJ/bit of an off-chip access).

**Runtime offload**: registered on a context, the extension lowers a graph's ``relu``
on a 16-bit float tensor of at least ``offload_min_bytes`` (0: the L2 size, so it would
stream through HBM anyway) to a PIM kernel, in place when the input has no other
reader, when its estimate says the memory is faster (:func:`relu_offload_estimate`: the
bank stream plus the write-back of the dirty cached input, against the vector unit at
the bandwidth of the level the data sits in, L2 for an activation that fits there with
its output, else HBM). The kernel record reports ``saved_hbm_bytes`` and
``saved_cycles``: the built-in cost *estimated* that way (``npu_cycles_estimate``, not
measured: the built-in kernel is not run) minus the PIM kernel's measured cycles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..emulator.config import DeviceSpec
from ..emulator.cycles import vector_op_cycles
from ..emulator.enums import StrNamedEnum
from ..emulator.errors import SpecError, WorkloadError
from ..emulator.extension_kernels import MemoryKernel, execute_kernels
from ..emulator.pim_model import (
    GRF_ENTRIES,
    LANES,
    SRF_ENTRIES,
    Operand,
    OperandKind,
    PimBank,
    PimCommand,
    PimError,
    PimInstr,
    PimOp,
    PimRequest,
    PimTiming,
    decode_instr,
    program_cycles,
    validate_program,
)
from ..graph import UNARY_KINDS, Graph, Tensor
from ..graph import Op as GraphOp
from ..registry import (
    DeviceExtension,
    ExtensionId,
    consumers,
    ensure_extension,
)

__all__ = [
    "PIMType",
    "PIMOpType",
    "ElementwiseOp",
    "Op",
    "PIMOperation",
    "PIMKernelType",
    "PIMKernel",
    "PIMConfig",
    "PIMResult",
    "pim_execute",
    "unit_commands",
    "footprint_bytes",
    "pim_relu_impl",
    "relu_offload_estimate",
    "PimError",
]

_COLUMN_BYTES = LANES * 2


_Enum = StrNamedEnum


class PIMType(_Enum):
    """Where the compute sits (the seed's ``WIA_PIM_*``): ``STACKED_3D`` is bank-level
    PIM in a 3D-stacked DRAM (HBM-PIM), the organisation the bank model follows."""

    STACKED_3D = "3d_stacked"


class PIMOpType(_Enum):
    """Kind of PIM operation (the seed's ``WIA_PIM_ELEMENTWISE``)."""

    ELEMENTWISE = "elementwise"


class ElementwiseOp(_Enum):
    """Elementwise PIM operations (the seed's ``WIA_OP_*``: ``WIA_OP_RELU`` is ``RELU``)."""

    RELU = "relu"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    SCALE = "scale"
    AXPY = "axpy"
    FILL = "fill"
    COPY = "copy"


#: The seed's spelling, ``Op.RELU``. ``wia_hw.Op`` is the graph op class; ``wia_hw``
#: sets these members on it as class attributes, so ``wia_hw.Op.RELU`` is this one too.
Op = ElementwiseOp

_NEEDS_OPERAND = (
    ElementwiseOp.ADD,
    ElementwiseOp.SUB,
    ElementwiseOp.MUL,
    ElementwiseOp.AXPY,
    ElementwiseOp.COPY,
)
_NEEDS_SCALAR = (ElementwiseOp.SCALE, ElementwiseOp.AXPY, ElementwiseOp.FILL)
_FLOAT_OK = (ElementwiseOp.RELU, ElementwiseOp.COPY, ElementwiseOp.FILL)


class PIMKernelType(_Enum):
    """Kind of PIM kernel (the seed's ``WIA_PIM_CUSTOM``)."""

    CUSTOM = "custom"


@dataclass(frozen=True, kw_only=True)
class PIMOperation:
    """One elementwise PIM operation (the seed's ``wia_pim_operation_t``).

    ``operand``: the second array of ADD, SUB, MUL, AXPY, COPY (same size as the data);
    ``scalar``: the int16 constant of SCALE, AXPY, FILL.
    """

    type: PIMOpType = PIMOpType.ELEMENTWISE
    operation: ElementwiseOp = ElementwiseOp.RELU
    in_place: bool = True
    operand: Any = None
    scalar: int | float | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "type", PIMOpType(self.type))
        except ValueError:
            raise ValueError(
                f"PIMOperation.type must be one of "
                f"{', '.join(t.value for t in PIMOpType)}, got {self.type!r}"
            ) from None
        try:
            object.__setattr__(self, "operation", ElementwiseOp(self.operation))
        except ValueError:
            raise ValueError(
                f"PIMOperation.operation must be one of "
                f"{', '.join(o.value for o in ElementwiseOp)}, got "
                f"{self.operation!r}"
            ) from None
        if not isinstance(self.in_place, bool):
            raise TypeError(f"PIMOperation.in_place must be a bool, got {self.in_place!r}")
        op = self.operation
        if op in _NEEDS_OPERAND and self.operand is None:
            raise ValueError(f"PIMOperation: {op.name} needs an operand array")
        if op not in _NEEDS_OPERAND and self.operand is not None:
            raise ValueError(f"PIMOperation: {op.name} takes no operand array")
        if op in _NEEDS_SCALAR and self.scalar is None:
            raise ValueError(f"PIMOperation: {op.name} needs a scalar")


@dataclass(frozen=True, kw_only=True)
class PIMKernel:
    """A small PIM kernel for the bank ISA (the seed's ``wia_pim_kernel_t``).

    ``body``: instructions run for every column of every row of the data (``BANK`` is
    the current column; results written to ``BANK`` change the data in place);
    ``scalars``: up to 8 int16 values loaded into ``SRF[0..7]`` first; ``prologue``:
    instructions run once per unit before the rows (no ``BANK`` operand). Validated on
    construction: every instruction must be legal for the ISA and the body must write
    ``BANK`` (otherwise its results never reach memory). Instructions may be given as
    :class:`~wia_hw.emulator.pim_model.PimInstr` or encoded 32-bit words.

    ``code``: the seed's field name for the kernel's program, accepted as another
    spelling of ``body`` (a list of instructions; give one or the other). It is moved
    into ``body`` on construction and reads back ``None``. The seed's ``code`` is a C
    string, which the bank cannot run: a string is refused with one line pointing to
    ``body``.
    """

    kernel_type: PIMKernelType = PIMKernelType.CUSTOM
    body: Sequence[PimInstr | int] = ()
    scalars: Sequence[int] = ()
    prologue: Sequence[PimInstr | int] = ()
    name: str = "custom"
    code: Sequence[PimInstr | int] | None = None

    def __post_init__(self) -> None:
        if self.code is not None:
            if isinstance(self.code, (str, bytes)):
                raise PimError(
                    f"PIMKernel {self.name!r} code: a source string cannot run on the PIM "
                    "bank ISA; give the program as body=[PimInstr(...), ...] (or code= the "
                    "same instruction list)"
                )
            if tuple(self.body):
                raise PimError(
                    f"PIMKernel {self.name!r}: give the program as body or as code (the "
                    "seed's name for it), not both"
                )
            object.__setattr__(self, "body", self.code)
            object.__setattr__(self, "code", None)
        try:
            object.__setattr__(self, "kernel_type", PIMKernelType(self.kernel_type))
        except ValueError:
            raise PimError(
                f"PIMKernel.kernel_type must be custom, got {self.kernel_type!r}"
            ) from None
        try:
            body = validate_program(self.body)
        except PimError as e:
            raise PimError(f"PIMKernel {self.name!r} body: {e}") from None
        try:
            pro = validate_program(self.prologue)
        except PimError as e:
            raise PimError(f"PIMKernel {self.name!r} prologue: {e}") from None
        if not body:
            raise PimError(f"PIMKernel {self.name!r}: the body is empty")
        for i, ins in enumerate(pro):
            if ins.uses_bank:
                raise PimError(
                    f"PIMKernel {self.name!r} prologue: instruction {i} ({ins}) "
                    "reads or writes BANK, but no row is open before the rows"
                )
        if not any(ins.dst.kind is OperandKind.BANK for ins in body):
            raise PimError(
                f"PIMKernel {self.name!r}: no body instruction writes BANK, so "
                "the kernel's results would never reach memory"
            )
        if len(self.scalars) > SRF_ENTRIES:
            raise PimError(
                f"PIMKernel {self.name!r}: at most {SRF_ENTRIES} scalars, got {len(self.scalars)}"
            )
        for s in self.scalars:
            if (
                isinstance(s, bool)
                or not isinstance(s, (int, np.integer))
                or not -(1 << 15) <= s < (1 << 15)
            ):
                raise PimError(f"PIMKernel {self.name!r}: scalars must be int16, got {s!r}")
        object.__setattr__(self, "body", tuple(body))
        object.__setattr__(self, "prologue", tuple(pro))
        object.__setattr__(self, "scalars", tuple(int(s) for s in self.scalars))


@dataclass(frozen=True, kw_only=True)
class PIMConfig:
    """A PIM-capable memory stack (the seed's ``wia_pim_config_t``).

    ``memory_capacity_gb`` bounds what an operation lays out (:func:`footprint_bytes`:
    ``pim_execute`` refuses more, the ReLU offload declines it). ``bandwidth_gb_s`` is
    the stack's interface bandwidth: what moving the data to a processor would use, so
    it gives :attr:`PIMResult.transfer_time_ns` (the comparison) and nothing else -- a
    graph run's transfers are the device's own HBM traffic at the device's bandwidth
    (the internal bandwidth of the banks is derived: :attr:`internal_bandwidth_gbs`).
    ``banks`` banks of
    ``bank_columns`` 32-byte columns per row, ``compute_units_per_bank`` SIMD units per
    bank (each serving ``bank_columns / compute_units_per_bank`` columns, at most 64),
    ``timing`` in cycles of ``pim_clock_ghz``.
    """

    pim_type: PIMType = PIMType.STACKED_3D
    memory_capacity_gb: float = 16.0
    bandwidth_gb_s: float = 2000.0
    compute_units_per_bank: int = 8
    banks: int = 128
    bank_columns: int = 32
    pim_clock_ghz: float = 1.0
    timing: PimTiming = field(default_factory=PimTiming)
    act_energy_pj: float = 909.0
    column_energy_pj: float = 64.0
    op_energy_pj: float = 5.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "pim_type", PIMType(self.pim_type))
        except ValueError:
            raise ValueError(
                f"PIMConfig.pim_type must be one of "
                f"{', '.join(t.value for t in PIMType)}, got "
                f"{self.pim_type!r}"
            ) from None
        for n in ("compute_units_per_bank", "banks", "bank_columns"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"PIMConfig.{n} must be a positive integer, got {v!r}")
        for n in ("memory_capacity_gb", "bandwidth_gb_s", "pim_clock_ghz"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
                raise ValueError(f"PIMConfig.{n} must be a positive number, got {v!r}")
        for n in ("act_energy_pj", "column_energy_pj", "op_energy_pj"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ValueError(f"PIMConfig.{n} must be a finite number >= 0, got {v!r}")
        if self.bank_columns % self.compute_units_per_bank:
            raise ValueError(
                f"PIMConfig.bank_columns ({self.bank_columns}) must be a "
                f"multiple of compute_units_per_bank "
                f"({self.compute_units_per_bank})"
            )
        if self.columns_per_unit > 64:
            raise ValueError(
                f"PIMConfig: a unit would serve {self.columns_per_unit} "
                "columns; the bank model's row buffer has at most 64"
            )
        if not isinstance(self.timing, PimTiming):
            raise TypeError(f"PIMConfig.timing must be a PimTiming, got {self.timing!r}")

    @property
    def units(self) -> int:
        return self.banks * self.compute_units_per_bank

    @property
    def columns_per_unit(self) -> int:
        return self.bank_columns // self.compute_units_per_bank

    @property
    def row_elements(self) -> int:
        """Elements in one bank row (``bank_columns`` x 16 lanes)."""
        return self.bank_columns * LANES

    @property
    def internal_bandwidth_gbs(self) -> float:
        """Peak bytes per second the SIMD units can access (GB/s): every unit one
        32-byte column per column command, which issue one every ``t_ccd`` cycles (row
        openings and closings not included, so no stream reaches it)."""
        return self.units * _COLUMN_BYTES * self.pim_clock_ghz / self.timing.t_ccd

    @classmethod
    def from_extension(cls, ext: DeviceExtension) -> PIMConfig:
        """The stack described by the PIM extension's parameters. A combination the
        stack cannot take (``bank_columns`` not a multiple of
        ``compute_units_per_bank``, more than 64 columns per unit) is a one-line
        :class:`~wia_hw.SpecError` naming the extension's parameters."""
        v = ext.values
        try:
            return cls._from_values(v)
        except ValueError as e:
            raise SpecError(str(e), field=f"extension {ext.id!r} parameters") from None

    @classmethod
    def _from_values(cls, v: Any) -> PIMConfig:
        return cls(
            pim_type=v["pim_type"],
            memory_capacity_gb=v["memory_capacity_gb"],
            bandwidth_gb_s=v["bandwidth_gb_s"],
            compute_units_per_bank=v["compute_units_per_bank"],
            banks=v["banks"],
            bank_columns=v["bank_columns"],
            pim_clock_ghz=v["pim_clock_ghz"],
            timing=PimTiming(
                t_rcd=v["t_rcd"], t_rp=v["t_rp"], t_cl=v["t_cl"], t_wr=v["t_wr"], t_ccd=v["t_ccd"]
            ),
            act_energy_pj=v["act_energy_pj"],
            column_energy_pj=v["column_energy_pj"],
            op_energy_pj=v["op_energy_pj"],
        )


# -- command streams ----------------------------------------------------------------------


def _req_op(col: int, ins: PimInstr) -> PimRequest:
    return PimRequest(cmd=PimCommand.OP, col=col, instr=ins)


_BANK = Operand.bank()


def _srf(i: int) -> Operand:
    return Operand.srf(i)


def _grf(i: int) -> Operand:
    return Operand.grf(i)


def _elementwise_body(op: ElementwiseOp) -> tuple[list[PimInstr], list[PimInstr] | None]:
    """(instructions applied to the data column, the instruction staging an operand
    column into GRF[j] -- None when the op has no operand). ``GRF[j]`` is written as
    index -1 and fixed per column."""
    fill = [PimInstr(op=PimOp.FILL, dst=_grf(0), src0=_BANK)]
    if op is ElementwiseOp.RELU:
        return [PimInstr(op=PimOp.RELU, dst=_BANK, src0=_BANK)], None
    if op is ElementwiseOp.ADD:
        return [PimInstr(op=PimOp.ADD, dst=_BANK, src0=_BANK, src1=_grf(0))], fill
    if op in (ElementwiseOp.SUB, ElementwiseOp.AXPY):
        return [PimInstr(op=PimOp.MAD, dst=_BANK, src0=_grf(0), src1=_srf(0), src2=_BANK)], fill
    if op is ElementwiseOp.MUL:
        return [PimInstr(op=PimOp.MUL, dst=_BANK, src0=_BANK, src1=_grf(0))], fill
    if op is ElementwiseOp.SCALE:
        return [PimInstr(op=PimOp.MUL, dst=_BANK, src0=_BANK, src1=_srf(0))], None
    if op is ElementwiseOp.FILL:
        return [PimInstr(op=PimOp.MOV, dst=_BANK, src0=_srf(0))], None
    return [PimInstr(op=PimOp.MOV, dst=_BANK, src0=_grf(0))], fill  # COPY


def _with_grf(ins: PimInstr, j: int) -> PimInstr:
    def fix(o: Operand | None) -> Operand | None:
        return Operand.grf(j) if o is not None and o.kind is OperandKind.GRF else o

    return PimInstr(
        op=ins.op, dst=fix(ins.dst), src0=fix(ins.src0), src1=fix(ins.src1), src2=fix(ins.src2)
    )


def unit_commands(
    what: PIMOperation | PIMKernel, rows: int, cols: int, *, row_base: int = 0
) -> list[PimRequest]:
    """The command stream one unit executes for ``rows`` data rows of ``cols`` columns.

    Bank rows: data at ``row_base + r``; the operand (if any) at ``row_base + rows + r``;
    the separate output of ``in_place=False`` at ``row_base + 2 * rows + r`` (or
    ``row_base + rows + r`` without an operand). Scalars are loaded once (WRSRF).
    """
    reqs: list[PimRequest] = []
    if isinstance(what, PIMKernel):
        if what.scalars:
            reqs.append(
                PimRequest(
                    cmd=PimCommand.WRSRF,
                    data=tuple(what.scalars) + (0,) * (LANES - len(what.scalars)),
                )
            )
        reqs.extend(_req_op(0, ins) for ins in what.prologue)
        for r in range(rows):
            reqs.append(PimRequest(cmd=PimCommand.ACT, row=row_base + r))
            for c in range(cols):
                reqs.extend(_req_op(c, ins) for ins in what.body)
            reqs.append(PimRequest(cmd=PimCommand.PRE))
        return reqs
    op = what.operation
    if op in _NEEDS_SCALAR or op is ElementwiseOp.SUB:
        s = -1 if op is ElementwiseOp.SUB else int(_scalar_bits(what))
        reqs.append(PimRequest(cmd=PimCommand.WRSRF, data=(s,) + (0,) * (LANES - 1)))
    body, fill = _elementwise_body(op)
    has_operand = fill is not None
    out_base = row_base + (2 if has_operand else 1) * rows
    # Not in place, the input row is staged into the GRF before the output row is
    # opened -- when the op reads it (FILL and COPY overwrite it unread).
    stage = not what.in_place and any(_reads_bank(ins) for ins in body)
    # Columns per row opening. The GRF holds what is staged from another row: the
    # operand in GRF[0..w), a staged input in GRF[w..2w), so those ops reopen their
    # rows every ``w`` columns. An op on the open row alone (RELU, SCALE, FILL in place)
    # uses no GRF: one ACT covers the whole row.
    if has_operand and stage:
        width = GRF_ENTRIES // 2
    elif has_operand or stage:
        width = GRF_ENTRIES
    else:
        width = max(cols, 1)
    in_base = width if has_operand else 0
    for r in range(rows):
        src_row = row_base + r
        dst_row = src_row if what.in_place else out_base + r
        for c0 in range(0, cols, width):
            chunk = list(enumerate(range(c0, min(cols, c0 + width))))
            if has_operand:  # stage the operand's columns in GRF
                reqs.append(PimRequest(cmd=PimCommand.ACT, row=row_base + rows + r))
                reqs.extend(
                    _req_op(c, PimInstr(op=PimOp.FILL, dst=_grf(j), src0=_BANK)) for j, c in chunk
                )
                reqs.append(PimRequest(cmd=PimCommand.PRE))
            if stage:  # stage the input's columns in GRF
                reqs.append(PimRequest(cmd=PimCommand.ACT, row=src_row))
                reqs.extend(
                    _req_op(c, PimInstr(op=PimOp.FILL, dst=_grf(in_base + j), src0=_BANK))
                    for j, c in chunk
                )
                reqs.append(PimRequest(cmd=PimCommand.PRE))
            reqs.append(PimRequest(cmd=PimCommand.ACT, row=dst_row))
            for j, c in chunk:
                reqs.extend(
                    _req_op(
                        c,
                        _with_grf(ins, j) if what.in_place else _not_in_place(ins, in_base + j, j),
                    )
                    for ins in body
                )
            reqs.append(PimRequest(cmd=PimCommand.PRE))
    return reqs


def _not_in_place(ins: PimInstr, in_reg: int, operand_reg: int) -> PimInstr:
    """``ins`` with its BANK sources read from GRF[in_reg] (the staged input) and its
    GRF sources from GRF[operand_reg] (the staged operand); the result goes to BANK."""

    def fix(o: Operand | None) -> Operand | None:
        if o is None:
            return None
        if o.kind is OperandKind.BANK:
            return Operand.grf(in_reg)
        if o.kind is OperandKind.GRF:
            return Operand.grf(operand_reg)
        return o

    return PimInstr(
        op=ins.op, dst=_BANK, src0=fix(ins.src0), src1=fix(ins.src1), src2=fix(ins.src2)
    )


def _scalar_bits(what: PIMOperation) -> int:
    s = what.scalar
    if isinstance(s, float) and not float(s).is_integer():
        raise PimError(
            f"{what.operation.name}: the scalar must be an int16 (or a float16 "
            f"bit pattern for FILL), got {s!r}"
        )
    return int(s)  # type: ignore[arg-type]


# -- execution ----------------------------------------------------------------------------


@dataclass
class PIMResult:
    """What :func:`pim_execute` did.

    ``cycles``: PIM-clock cycles (cycle-exact: the RTL's command latencies);
    ``device_cycles``: the same interval in the context's device clock; ``commands``:
    commands of the broadcast stream; ``energy_pj``: memory energy; ``bytes_saved``: the
    bytes a processor would have moved over the stack's interface to do the same
    (read the inputs the operation uses, write the result: 2x the data for RELU and
    COPY, 3x for ADD, 1x for FILL); ``transfer_time_ns``: that transfer's time at
    ``bandwidth_gb_s``.
    """

    data: np.ndarray | None = field(repr=False)
    cycles: int
    device_cycles: int
    time_ns: float
    latency_ms: float
    commands: int
    energy_pj: float
    elements: int
    units_used: int
    bytes_saved: int
    transfer_time_ns: float


def _as_lanes(name: str, arr: np.ndarray, op: ElementwiseOp | None) -> np.ndarray:
    a = np.asarray(arr)
    if a.dtype == np.int16:
        return a
    if a.dtype == np.float16 or a.dtype.name == "bfloat16":
        if op is not None and op not in _FLOAT_OK:
            raise PimError(
                f"{op.name} on {a.dtype} data: the bank's lanes are int16, so "
                f"float arithmetic would not be exact (float16 supports "
                f"{', '.join(o.name for o in _FLOAT_OK)}); quantise to int16 first"
            )
        if op is None:
            raise PimError(f"a PIM kernel computes on int16 lanes; {name} is {a.dtype}")
        return a.view(np.int16)
    if a.dtype.kind in "iu":
        if a.size and (a.min() < -(1 << 15) or a.max() >= 1 << 15):
            raise PimError(f"{name} has values outside int16 [-32768, 32767]")
        return a.astype(np.int16)
    raise PimError(
        f"{name} must be int16 (or float16 bit patterns for RELU, COPY, FILL), got {a.dtype}"
    )


def _layout(n: int, cfg: PIMConfig) -> tuple[int, int]:
    """(rows of data, rows per unit) for ``n`` elements."""
    rows = -(-n // cfg.row_elements)
    return rows, -(-rows // cfg.banks)


def _reads_bank(ins: PimInstr) -> bool:
    return any(o.kind is OperandKind.BANK for o in ins.sources)


def _instr(req: PimRequest) -> PimInstr | None:
    """The instruction of an OP (``None`` for any other command)."""
    if req.cmd is not PimCommand.OP:
        return None
    return req.instr if isinstance(req.instr, PimInstr) else decode_instr(req.word)


def _stream_counts(what: PIMOperation | PIMKernel, rows: int, cols: int) -> np.ndarray:
    """``[ACTs, column accesses, SIMD ops]`` of one unit's stream over ``rows`` rows
    (0 for a unit with no rows: it receives no commands). The stream repeats the same
    commands for every row after a fixed prefix, so two short streams give the count."""
    if rows == 0:
        return np.zeros(3, dtype=np.int64)

    def count(n: int) -> np.ndarray:
        acts = cols_ = ops = 0
        for r in unit_commands(what, n, cols):
            ins = _instr(r)
            acts += r.cmd is PimCommand.ACT
            cols_ += r.cmd in (PimCommand.RD, PimCommand.WR) or (ins is not None and ins.uses_bank)
            ops += ins is not None
        return np.array([acts, cols_, ops], dtype=np.int64)

    one, two = count(1), count(2)
    return one + (rows - 1) * (two - one)


def _energy(cfg: PIMConfig, what: PIMOperation | PIMKernel, elements: int) -> float:
    """Memory energy of the operation, by the rows and columns the banks really touch:
    every bank runs its own rows (``rows // banks`` or one more); a row opening (ACT and
    its PRE) is one per bank, shared by the bank's ``compute_units_per_bank`` units,
    which each access their own columns and run their own SIMD ops. ``act_energy_pj``
    per row opened, ``column_energy_pj`` per column access (an OP with a ``BANK``
    operand), ``op_energy_pj`` per SIMD op. Padding columns of a partial last row are
    processed, so they count too."""
    rows = -(-elements // cfg.row_elements)
    q, extra = divmod(rows, cfg.banks)
    cpu, cu = cfg.columns_per_unit, cfg.compute_units_per_bank
    total = np.zeros(3, dtype=np.int64)
    for bank_rows, banks in ((q + 1, extra), (q, cfg.banks - extra)):
        if banks:
            total += banks * _stream_counts(what, bank_rows, cpu)
    acts, cols, ops = (int(v) for v in total)
    return acts * cfg.act_energy_pj + cu * cols * cfg.column_energy_pj + cu * ops * cfg.op_energy_pj


def _regions(what: PIMOperation | PIMKernel) -> list[str]:
    """The row regions :func:`unit_commands` lays the operation out in."""
    if isinstance(what, PIMKernel):
        return ["data"]
    return (
        ["data"]
        + (["operand"] if what.operation in _NEEDS_OPERAND else [])
        + ([] if what.in_place else ["output"])
    )


def footprint_bytes(cfg: PIMConfig, what: PIMOperation | PIMKernel, elements: int) -> int:
    """Bytes of PIM memory the operation occupies: whole rows (``bank_columns`` 32-byte
    columns) of each region it lays out -- the data, the operand (ADD, SUB, MUL, AXPY,
    COPY) and the separate output (``in_place=False``)."""
    rows = -(-elements // cfg.row_elements)
    return len(_regions(what)) * rows * cfg.bank_columns * _COLUMN_BYTES


def _moved_bytes(what: PIMOperation | PIMKernel, elements: int) -> int:
    """Bytes a processor would move over the stack's interface for the same result:
    read the inputs the operation uses (the data unless FILL or COPY overwrite it
    unread, or a kernel whose body never reads ``BANK``; the operand) and write the
    result, 2 bytes per element each."""
    if isinstance(what, PIMKernel):
        reads = int(any(_reads_bank(ins) for ins in what.body))
    else:
        op = what.operation
        reads = int(op not in (ElementwiseOp.FILL, ElementwiseOp.COPY))
        reads += int(op in _NEEDS_OPERAND)
    return (reads + 1) * elements * 2


def pim_timing(
    cfg: PIMConfig, what: PIMOperation | PIMKernel, elements: int
) -> tuple[int, list[PimRequest], int]:
    """(cycles, the busiest unit's command stream, units holding data) for ``elements``:
    every unit runs in lock step, so the operation takes the busiest unit's
    ``program_cycles`` (the RTL's)."""
    rows, per_bank = _layout(elements, cfg)
    reqs = unit_commands(what, per_bank, cfg.columns_per_unit)
    units = min(rows, cfg.banks) * cfg.compute_units_per_bank
    return program_cycles(reqs, cfg.timing), reqs, units


def _simulate(
    cfg: PIMConfig, what: PIMOperation | PIMKernel, x: np.ndarray, y: np.ndarray | None
) -> np.ndarray:
    """Run the command streams on the golden bank model, unit by unit; the result."""
    n = x.size
    re = cfg.row_elements
    rows, per_bank = _layout(n, cfg)
    cpu = cfg.columns_per_unit
    pad = rows * re
    xp = np.zeros(pad, dtype=np.int16)
    xp[:n] = x
    yp = None
    if y is not None:
        yp = np.zeros(pad, dtype=np.int16)
        yp[:n] = y
    out = xp.copy()
    has_operand = yp is not None
    extra = (1 if has_operand else 0) + (
        1 if isinstance(what, PIMOperation) and not what.in_place else 0
    )
    for bank in range(min(rows, cfg.banks)):
        my_rows = list(range(bank, rows, cfg.banks))
        local = len(my_rows)
        reqs = unit_commands(what, local, cpu)
        for u in range(cfg.compute_units_per_bank):
            pb = PimBank(rows=local * (1 + extra), cols=cpu, timing=cfg.timing)
            c0 = u * cpu
            for i, r in enumerate(my_rows):
                seg = xp[r * re : (r + 1) * re].reshape(cfg.bank_columns, LANES)
                pb.array[i] = seg[c0 : c0 + cpu]
                if yp is not None:
                    pb.array[local + i] = yp[r * re : (r + 1) * re].reshape(
                        cfg.bank_columns, LANES
                    )[c0 : c0 + cpu]
            for req in reqs:
                pb.execute(req)
            res_base = (
                0
                if not isinstance(what, PIMOperation) or what.in_place
                else local * (2 if has_operand else 1)
            )
            for i, r in enumerate(my_rows):
                seg = out[r * re : (r + 1) * re].reshape(cfg.bank_columns, LANES)
                seg[c0 : c0 + cpu] = pb.array[res_base + i]
    return out[:n]


def pim_execute(
    ctx: Any,
    pim_cfg: PIMConfig,
    op: PIMOperation | PIMKernel,
    data: np.ndarray,
    size: int | None = None,
    *,
    functional: bool = True,
) -> PIMResult:
    """Run an elementwise operation or a kernel inside the memory (the seed's
    ``wia_pim_execute``).

    ``data``: int16 (or float16 bit patterns, see the module docstring); the first
    ``size`` elements (default: all) are processed. In place (``in_place=True`` and for
    kernels) ``data`` itself is modified; otherwise the result is a new array. Timing is
    the busiest unit's command stream, ``program_cycles``; on a context, the interval
    also passes on its device (the cores wait, HBM is busy) and its counters. ``ctx`` may
    be ``None`` for the model alone. ``functional=False`` skips the bank simulation.
    Raises :class:`~wia_hw.emulator.pim_model.PimError` for data the lanes cannot hold,
    and a one-line :class:`~wia_hw.WorkloadError` when the operation's rows exceed
    ``memory_capacity_gb`` (:func:`footprint_bytes`).
    """
    if not isinstance(pim_cfg, PIMConfig):
        raise TypeError(f"pim_cfg must be a PIMConfig, got {type(pim_cfg).__name__}")
    if not isinstance(op, (PIMOperation, PIMKernel)):
        raise TypeError(f"op must be a PIMOperation or a PIMKernel, got {type(op).__name__}")
    arr = np.asarray(data)
    n = arr.size if size is None else size
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 < n <= arr.size:
        raise WorkloadError(
            f"pim_execute: size must be in 1..{arr.size} (the data's elements), got {size!r}"
        )
    n = int(n)
    need = footprint_bytes(pim_cfg, op, n)
    if need > pim_cfg.memory_capacity_gb * 1e9:
        parts = ", ".join(_regions(op))
        raise WorkloadError(
            f"pim_execute: {n} elements need {need} bytes of PIM memory (whole "
            f"{pim_cfg.bank_columns * _COLUMN_BYTES}-byte rows of the {parts}), more than "
            f"memory_capacity_gb = {pim_cfg.memory_capacity_gb:g} GB"
        )
    eop = op.operation if isinstance(op, PIMOperation) else None
    flat = arr.reshape(-1)
    lanes = _as_lanes("data", flat[:n], eop)
    operand = None
    if isinstance(op, PIMOperation) and op.operand is not None:
        o = np.asarray(op.operand).reshape(-1)
        if o.size < n:
            raise WorkloadError(f"pim_execute: the operand has {o.size} elements, the data {n}")
        operand = _as_lanes("operand", o[:n], eop)
    if (
        isinstance(op, PIMOperation)
        and op.operation is ElementwiseOp.FILL
        and arr.dtype == np.float16
        and isinstance(op.scalar, float)
    ):
        op = PIMOperation(
            type=op.type,
            operation=op.operation,
            in_place=op.in_place,
            scalar=int(np.float16(op.scalar).view(np.int16)),
        )
    if isinstance(op, PIMOperation) and op.scalar is not None:
        s = _scalar_bits(op)
        if not -(1 << 15) <= s < (1 << 15):
            raise PimError(f"{op.operation.name}: scalar {s} is outside int16")
    cycles, reqs, units = pim_timing(pim_cfg, op, n)
    result = None
    if functional:
        res = _simulate(pim_cfg, op, lanes, operand)
        in_place = isinstance(op, PIMKernel) or op.in_place
        if in_place and not (isinstance(data, np.ndarray) and data.flags.c_contiguous):
            raise WorkloadError("pim_execute: in place needs a C-contiguous numpy array")
        target = arr.reshape(-1) if in_place else flat.copy()
        if target.dtype.itemsize == 2 and target.dtype != np.int16:
            target.view(np.int16)[:n] = res
        else:
            target[:n] = res.astype(target.dtype)
        result = arr if in_place else target.reshape(arr.shape)
    energy = _energy(pim_cfg, op, n)
    moved = _moved_bytes(op, n)
    clock = ctx.spec.clock_ghz if ctx is not None else pim_cfg.pim_clock_ghz
    dev_cycles = math.ceil(cycles * clock / pim_cfg.pim_clock_ghz)
    time_ns = cycles / pim_cfg.pim_clock_ghz
    if ctx is not None:
        ensure_extension(ctx, ExtensionId.PIM)
        name = "pim." + (op.name if isinstance(op, PIMKernel) else op.operation.value)
        k = MemoryKernel(
            name=name,
            op=name,
            group="pim",
            op_kind="pim",
            provider=ExtensionId.PIM.value,
            cycles=dev_cycles,
            commands=len(reqs),
            flops=n,
            energy_pj=energy,
            compulsory_bytes=0,
            extra={"pim_cycles": cycles, "elements": n, "bytes_saved": moved},
        )
        execute_kernels(ctx.device, [k])
    return PIMResult(
        data=result,
        cycles=cycles,
        device_cycles=dev_cycles,
        time_ns=time_ns,
        latency_ms=time_ns * 1e-6,
        commands=len(reqs),
        energy_pj=energy,
        elements=n,
        units_used=units,
        bytes_saved=moved,
        transfer_time_ns=moved / pim_cfg.bandwidth_gb_s,
    )


# -- lowering: offload memory-bound ReLU ------------------------------------------------


def relu_offload_estimate(
    spec: DeviceSpec, x: Tensor, y: Tensor, pim_dev_cycles: int
) -> dict[str, int]:
    """The estimates :func:`pim_relu_impl` decides by, in device cycles (a roofline, not
    a measurement: the lowering runs before the caches' state is known).

    ``npu_cycles_estimate``: the vector unit reading ``x`` and writing ``y`` at the
    bandwidth of the level the data sits in, or at its issue rate (ReLU is an
    ``elementwise`` op: one cycle per ``lanes`` elements, the cores sharing the
    elements), whichever is slower. An activation that fits in L2 with its output
    (``x.nbytes + y.nbytes <= L2 size``: its producer just wrote it there) is read and
    written at L2 bandwidth (``l2_resident = 1``), anything else at HBM bandwidth.
    ``pim_cycles_estimate``: the bank stream (``pim_dev_cycles``) plus the write-back the
    device does before the banks may start: the dirty cached part of an activation,
    at most the L2 size, at HBM bandwidth (0 for graph inputs and weights)."""
    l2 = spec.memory.l2
    moved = x.nbytes + y.nbytes
    hbm_bpc = float(spec.bytes_per_cycle(spec.peak_bandwidth_gbs))
    l2_bpc = float(spec.bytes_per_cycle(l2.bandwidth_gbs))
    produced = x.kind == "activation"
    resident = produced and moved <= l2.size_bytes
    v = spec.compute.vector
    vclass = "activation" if UNARY_KINDS["relu"] > 1 else "elementwise"  # as the lowering
    vec = vector_op_cycles(
        -(-x.numel // spec.compute.cores),
        v.lanes,
        int(v.cycles_per_element[vclass]),
        v.pipeline_depth,
    )
    npu = max(math.ceil(moved / (l2_bpc if resident else hbm_bpc)), vec)
    dirty = min(x.nbytes, l2.size_bytes) if produced else 0
    return {
        "npu_cycles_estimate": npu,
        "pim_cycles_estimate": pim_dev_cycles + math.ceil(dirty / hbm_bpc),
        "l2_resident": int(resident),
    }


def pim_relu_impl(
    op: GraphOp, graph: Graph, spec: DeviceSpec, storage: Any, ext: DeviceExtension
) -> list[Any] | None:
    """Lowering of ``pim_relu``: a graph ``relu`` on a 16-bit float tensor of at least
    ``offload_min_bytes`` (0: the device's L2 size) runs in the memory when, by
    :func:`relu_offload_estimate`, the PIM stream with its write-back is faster than the
    vector unit at the data's level; in place (the output shares the input's storage)
    when nothing else reads the input. Else declines, and so it does for a tensor whose
    rows (with a separate output, out of place) exceed ``memory_capacity_gb``
    (:func:`footprint_bytes`): the memory could not hold it.

    The kernel record reports ``npu_cycles_estimate``, ``pim_cycles_estimate`` and
    ``l2_resident_estimate`` (those estimates), ``pim_cycles`` (the bank stream,
    ``program_cycles``) and, from the device, ``saved_cycles`` =
    ``npu_cycles_estimate`` minus the cycles the PIM kernel measured (write-back
    included): the saving against an estimate of the built-in cost, not a second run."""
    if op.kind != "relu":
        return None
    x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    if x.dtype not in ("fp16", "bf16") or y.dtype != x.dtype:
        return None
    threshold = int(ext.param("offload_min_bytes")) or spec.memory.l2.size_bytes
    if x.nbytes < threshold:
        return None
    cfg = PIMConfig.from_extension(ext)
    n = x.numel
    readers = consumers(graph).get(op.inputs[0], [])
    in_place = len(readers) == 1 and x.kind == "activation"
    what = PIMOperation(operation=ElementwiseOp.RELU, in_place=in_place)
    if footprint_bytes(cfg, what, n) > cfg.memory_capacity_gb * 1e9:
        return None  # the tensor (with its output, out of place) does not fit the memory
    cycles, reqs, units = pim_timing(cfg, what, n)
    dev_cycles = math.ceil(cycles * spec.clock_ghz / cfg.pim_clock_ghz)
    est = relu_offload_estimate(spec, x, y, dev_cycles)
    if est["pim_cycles_estimate"] >= est["npu_cycles_estimate"]:
        return None  # by its own estimate the memory would be slower: the cores run it
    moved = x.nbytes + y.nbytes
    xref = storage.ref(op.inputs[0])
    if in_place:
        storage.alias(op.outputs[0], op.inputs[0])
        writes = (xref,)
    else:
        writes = (storage.ref(op.outputs[0]),)
    return [
        MemoryKernel(
            name=op.name,
            op=op.name,
            group=op.group,
            op_kind=op.kind,
            io=(op.inputs, op.outputs),
            attrs=dict(op.attrs),
            provider=ext.id,
            cycles=dev_cycles,
            reads=(xref,),
            writes=writes,
            commands=len(reqs),
            flops=n,
            energy_pj=_energy(cfg, what, n),
            compulsory_bytes=0,
            precision=x.dtype,
            extra={
                "operation": "pim_relu",
                "pim_cycles": cycles,
                "in_place": int(in_place),
                "npu_cycles_estimate": est["npu_cycles_estimate"],
                "pim_cycles_estimate": est["pim_cycles_estimate"],
                "l2_resident_estimate": est["l2_resident"],
                "npu_hbm_bytes_estimate": moved,
            },
        )
    ]
