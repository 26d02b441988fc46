"""Kernel descriptors: what the runtime's lowering hands to the emulator.

A kernel is one unit of device work with a fixed tiling: a GEMM on the systolic
arrays (:class:`GemmKernel`) or a pass of the vector units (:class:`VectorKernel`).
Tensors are seen by the emulator as 2-D row-major matrices (:class:`TensorRef`);
leading dims are folded into rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TensorRef",
    "Region",
    "Tile",
    "GemmTiling",
    "GemmKernel",
    "VectorKernel",
    "TiledKernel",
    "MemoryKernel",
    "Kernel",
    "VECTOR_CLASSES",
]

#: Vector-unit op classes; their issue cost is ``VectorConfig.cycles_per_element``.
VECTOR_CLASSES = ("elementwise", "activation", "softmax", "layer_norm", "pool", "copy", "gather")


@dataclass(frozen=True)
class TensorRef:
    """A tensor as a ``rows`` x ``cols`` matrix of ``elem_bytes``-byte elements.

    ``name`` is the storage the elements live in; a view (reshape, contiguous slice)
    names its base storage and starts ``offset`` elements into it.
    """

    name: str
    rows: int
    cols: int
    elem_bytes: int
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * self.elem_bytes


Region = tuple[TensorRef, int, int, int, int]  # tensor, row0, row1, col0, col1


@dataclass
class Tile:
    """One work item of a kernel, as the core's tile program sees it."""

    loads: list[Region]
    stores: list[Region]
    array_cycles: int  # cycles of the array passes (0 for vector tiles)
    vector_cycles: int  # cycles of the vector unit
    l1_bytes: int  # bytes the array / vector unit reads and writes in L1
    passes: int  # array passes; on a core of several arrays, rounds of one pass each
    macs: int
    slot_macs: int  # MAC slots the passes occupy (macs / slot_macs = PE mapping)
    busy_cycles: int = 0  # cycles in which the array performs MACs (RTL counter)
    dims: tuple[int, ...] = ()  # (batch, m, n, k) of a GEMM tile; (rows, cols, elements)
    #: Steps (``depth`` of :func:`~wia_hw.emulator.cycles.systolic_tile_cycles`) of each
    #: of the tile's ``passes`` equal array passes; 0: not a built-in array tile (its
    #: ``array_cycles`` are charged as one block, never pipelined).
    pass_steps: int = 0
    #: (b0, m0, n0, k0) of a GEMM tile: where its ``dims`` start in the kernel's batch,
    #: M, N and K (functional mode executes exactly these tiles); () for other tiles.
    origin: tuple[int, ...] = ()


@dataclass(frozen=True)
class GemmTiling:
    """How a GEMM is cut into tiles (the work items of the cores).

    A tile computes a ``tm`` x ``tn`` block of the output of ``tb`` batch entries over a
    ``tk``-long slice of K; its operands are staged in L1 (double-buffered) before the
    array runs over them. ``order`` is the loop order over output tiles: ``"mn"``
    (row-major: tiles sharing A rows are adjacent) or ``"nm"``.

    ``cores``: how many of the device's cores the tiles are dealt to (the first ones;
    the others idle through the kernel); 0, the default, is all of them. A count above
    the device's means all of them (:meth:`active_cores`). Fewer cores can be faster:
    each core's first load is smaller, so the shared ports deliver it sooner, and a
    core runs several tiles, so its loads overlap its computation (256 x 4096 x 4096 on
    wia-npu: 79,165 cycles on 16 cores in 16 tiles, 70,973 on 8 in 32).
    """

    tm: int
    tn: int
    tk: int
    tb: int = 1
    order: str = "mn"
    cores: int = 0

    def __post_init__(self) -> None:
        for n in ("tm", "tn", "tk", "tb"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"GemmTiling.{n} must be a positive integer, got {v!r}")
        if self.order not in ("mn", "nm"):
            raise ValueError(f"GemmTiling.order must be 'mn' or 'nm', got {self.order!r}")
        c = self.cores
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"GemmTiling.cores must be a non-negative integer (0: all), got {c!r}")

    def __repr__(self) -> str:
        tail = f", cores={self.cores}" if self.cores else ""
        return (
            f"GemmTiling(tm={self.tm}, tn={self.tn}, tk={self.tk}, tb={self.tb}, "
            f"order={self.order!r}{tail})"
        )

    def active_cores(self, device_cores: int) -> int:
        """The cores the tiles are dealt to on a device of ``device_cores``."""
        return min(self.cores, device_cores) if self.cores else device_cores

    def out_tiles(self, batch: int, m: int, n: int) -> int:
        """Output tiles of a ``batch`` x ``m`` x ``n`` result (the groups of K slices
        ``Device.tiles_of`` makes)."""
        return -(-batch // self.tb) * -(-m // self.tm) * -(-n // self.tn)

    def tile_count(self, batch: int, m: int, n: int, k: int) -> int:
        """Tiles of a ``batch`` x ``m`` x ``n`` x ``k`` GEMM: output tiles times K slices."""
        return self.out_tiles(batch, m, n) * -(-k // self.tk)


@dataclass(frozen=True)
class _KernelBase:
    name: str
    op: str  # the graph op this kernel implements
    group: str  # breakdown category of the op
    op_kind: str  # graph op kind (functional semantics)
    io: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # graph tensor names
    attrs: Mapping[str, Any] = field(default_factory=dict)
    provider: str = "builtin"


@dataclass(frozen=True)
class GemmKernel(_KernelBase):
    """``C[b] = A[b] @ B[b]`` (+ bias) for ``b < batch``: A is ``m x k``, B ``k x n``.

    ``a``: ``[batch*m, k]``; ``b``: ``[k, n]`` when ``b_shared`` (one weight for every
    batch entry), else ``[batch*k, n]``, or ``[batch*n, k]`` when ``b_transposed``;
    ``c``: ``[batch*m, n]``.
    """

    precision: str = "fp16"
    batch: int = 1
    m: int = 1
    n: int = 1
    k: int = 1
    a: TensorRef | None = None
    b: TensorRef | None = None
    c: TensorRef | None = None
    bias: TensorRef | None = None
    b_shared: bool = True
    b_transposed: bool = False
    tiling: GemmTiling = field(default_factory=lambda: GemmTiling(1, 1, 1))

    @property
    def macs(self) -> int:
        return self.batch * self.m * self.n * self.k

    @property
    def flops(self) -> int:
        return 2 * self.macs + (self.batch * self.m * self.n if self.bias else 0)

    @property
    def compulsory_bytes(self) -> int:
        """Bytes the kernel must read and write at least once."""
        refs = [r for r in (self.a, self.b, self.c, self.bias) if r is not None]
        return sum(r.nbytes for r in refs)


@dataclass(frozen=True)
class VectorKernel(_KernelBase):
    """An elementwise or row-reduction pass of the vector units over ``rows`` rows.

    Inputs whose row count equals ``rows`` are read in row chunks along with the output;
    larger ones (a slice's or reduction's source) in proportional row chunks (each row
    read once over the kernel), and so are smaller ones when ``split_inputs`` says they
    are parts of the output's rows (a concatenation); other smaller ones (biases,
    scales, broadcast operands) are read whole by every tile.
    ``elements`` is the number of output elements; ``flops`` what they cost.

    ``cols_per_tile`` (0: every column) cuts each row chunk into column chunks as well,
    for an elementwise kernel whose inputs all have the output's columns: a tile then
    covers whole storage blocks, where a chunk of fewer rows than a block would load
    (and the cache model charge) whole blocks for a part of them.
    """

    vclass: str = "elementwise"
    rows: int = 1
    elements: int = 0
    flops: int = 0
    inputs: tuple[TensorRef, ...] = ()
    outputs: tuple[TensorRef, ...] = ()
    rows_per_tile: int = 1
    cols_per_tile: int = 0
    split_inputs: bool = False
    #: the output's dtype (``fp32``, ``fp16``, ``bf16``, ``int8``, ...), a label of the
    #: kernel's records, as :class:`GemmKernel`'s
    precision: str = "fp16"
    #: the core of each tile, in tile order (owner computes: the lowering puts a chunk
    #: on the core that wrote its input); empty: the device's ``tile_schedule`` deals
    #: them (``Device.shares_of``)
    placement: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.vclass not in VECTOR_CLASSES:
            raise ValueError(
                f"VectorKernel.vclass must be one of {VECTOR_CLASSES}, got {self.vclass!r}"
            )
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in self.placement):
            raise ValueError(
                f"VectorKernel.placement must hold non-negative core indices, got "
                f"{self.placement[:8]!r}"
            )

    @property
    def macs(self) -> int:
        return 0

    @property
    def compulsory_bytes(self) -> int:
        """Bytes read and written at least once; a gather reads only the table rows its
        ``rows`` lookups touch."""
        refs = list(self.inputs + self.outputs)
        total = 0
        for i, r in enumerate(refs):
            if self.vclass == "gather" and i == len(self.inputs) - 1:
                total += min(self.rows, r.rows) * r.cols * r.elem_bytes
            else:
                total += r.nbytes
        return total


@dataclass(frozen=True)
class TiledKernel(_KernelBase):
    """A kernel with a ready-made tile program (see the module docstring).

    ``tiles``: the work items in order; ``groups``: the index of the first tile of each
    group (a group is never split across cores; empty means every tile is a group).
    ``macs``/``flops``/``vector_flops``: what the kernel does (counted once, at the end).
    ``array``: whether the MACs run on the systolic array (charged ``pj_per_mac``) or on
    an extension unit (charged ``energy_pj``). ``record_kind`` names the unit in reports
    (``"gemm"``, ``"vector"``, ``"photonic"``, ...). ``extra``: figures to report.
    """

    record_kind: str = "gemm"
    precision: str = "fp16"
    tiles: tuple[Tile, ...] = ()
    groups: tuple[int, ...] = ()
    macs: int = 0
    flops: int = 0
    vector_flops: int = 0
    compulsory_bytes: int = 0
    array: bool = True
    energy_pj: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for n in ("macs", "flops", "vector_flops", "compulsory_bytes"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"TiledKernel.{n} must be a non-negative integer, got {v!r}")
        if not self.tiles:
            raise ValueError(f"TiledKernel {self.name!r} has no tiles")
        g = self.groups
        if g and (
            g[0] != 0
            or any(b <= a for a, b in zip(g, g[1:], strict=False))
            or g[-1] >= len(self.tiles)
        ):
            raise ValueError(
                f"TiledKernel.groups must start at 0 and increase within the "
                f"{len(self.tiles)} tiles, got {g[:8]}"
            )


@dataclass(frozen=True)
class MemoryKernel(_KernelBase):
    """Work done inside the memory (processing in memory) for ``cycles`` device cycles.

    ``reads``: tensors the PIM units read (their dirty cached copies are written back
    first); ``writes``: tensors they modify (written back first too, and dropped from the
    caches after). ``commands``: bank commands the host issues (the ``instructions``
    counter). ``flops``: element operations done. ``energy_pj``: the memory's energy.
    """

    cycles: int = 0
    reads: tuple[TensorRef, ...] = ()
    writes: tuple[TensorRef, ...] = ()
    commands: int = 0
    flops: int = 0
    energy_pj: float = 0.0
    compulsory_bytes: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    record_kind: str = "pim"
    precision: str = "int16"

    def __post_init__(self) -> None:
        for n in ("cycles", "commands", "flops", "compulsory_bytes"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"MemoryKernel.{n} must be a non-negative integer, got {v!r}")

    @property
    def macs(self) -> int:
        return 0


Kernel = GemmKernel | VectorKernel | TiledKernel | MemoryKernel
