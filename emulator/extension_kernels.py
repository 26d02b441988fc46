"""Kernels of device extensions, on the device's own machinery.

An extension's unit (a flash-attention engine, a 2:4 sparse tensor unit, a
processing-in-memory stack, a photonic or analog core) hands the device one of:

* a :class:`~wia_hw.emulator.kernels.TiledKernel`: ready-made tiles that the device runs
  exactly like the tiles it cuts from a built-in kernel (staged by each core's DMA
  engine through the caches, double-buffered, contending for L2 and HBM, throttled);
  their compute cycles come from the cycle functions of the extension's unit;
* a :class:`~wia_hw.emulator.kernels.MemoryKernel`: work done inside the memory (PIM);
* a :class:`CostedKernel` (this module): a built-in kernel's tiling and data movement
  with a cost model written in the extension's YAML; it becomes a ``TiledKernel``.

MACs done outside the systolic array (``array=False``: photonic, analog, PIM) are
counted in ``macs`` and FLOPs but charged the energy the extension reports
(``energy_pj``) instead of the array's ``pj_per_mac``. Vector FLOPs (a fused tail's, a
vector primitive's) run on the vector unit whichever unit did the MACs, so the device
charges them ``pj_per_vector_op`` either way: a cost model's ``energy_pj`` replaces the
MACs' energy only (PIM's work, done inside the memory, is the exception).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .device import Device, KernelRecord
from .kernels import (
    GemmKernel,
    MemoryKernel,
    TensorRef,
    Tile,
    TiledKernel,
    VectorKernel,
    _KernelBase,
)

__all__ = [
    "TiledKernel",
    "MemoryKernel",
    "CostedKernel",
    "execute_kernels",
    "gemm_passes",
    "tile_dims",
    "extension_summary",
    "Tile",
]


#: A tile's cost: ``dims -> (cycles, macs or None, energy_pj or None)``. ``dims`` holds
#: ``B, M, N, K`` of a GEMM tile or ``ROWS, COLS, ELEMENTS`` of a vector chunk.
TileCost = Callable[[Mapping[str, int]], tuple[int, "int | None", "float | None"]]


@dataclass(frozen=True)
class CostedKernel(_KernelBase):
    """A built-in kernel's tiling and data movement with an extension's compute cost.

    The device tiles ``inner`` as usual (so every tile loads and stores what the
    built-in kernel would), then each tile's compute cycles, MACs and energy come from
    ``tile_cost`` (a YAML cost model). ``extra_inputs`` are operands of fused tail ops:
    one the size of the output is read tile by tile with the output's rows and columns,
    a smaller one whole by every tile that stores. ``extra_flops``: the fused tails'
    FLOPs (counted on the vector side).
    """

    inner: GemmKernel | VectorKernel | None = None
    tile_cost: TileCost | None = None
    extra_inputs: tuple[TensorRef, ...] = ()
    extra_flops: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def macs(self) -> int:  # the dense MACs of the op (executed MACs: the record)
        return self.inner.macs if self.inner is not None else 0

    @property
    def flops(self) -> int:
        return (self.inner.flops if self.inner is not None else 0) + self.extra_flops

    def to_tiled(self, device: Device) -> TiledKernel:
        """Tile ``inner`` as ``device`` would, and cost every tile."""
        inner = self.inner
        if inner is None or self.tile_cost is None:
            raise ValueError(f"CostedKernel {self.name!r} needs inner and tile_cost")
        gemm = isinstance(inner, GemmKernel)
        tiles, _ = device.tiles_of(inner)
        dims = tile_dims(inner, tiles)
        out: list[Tile] = []
        macs = 0
        energy = 0.0
        own_energy = True
        cache: dict[tuple[int, ...], tuple[int, int | None, float | None]] = {}
        for tile, d in zip(tiles, dims, strict=True):
            key = tuple(d.values())
            got = cache.get(key)
            if got is None:
                got = cache[key] = self.tile_cost(d)
            cyc, m, e = got
            tmacs = (tile.macs if m is None else int(m)) if gemm else int(m or 0)
            macs += tmacs
            if e is None:
                own_energy = False
            else:
                energy += e
            loads = list(tile.loads)
            if self.extra_inputs and tile.stores:
                _, r0, r1, c0, c1 = tile.stores[0]
                for ref in self.extra_inputs:
                    out_ref = tile.stores[0][0]
                    if ref.rows * ref.cols == out_ref.rows * out_ref.cols:
                        loads.append(
                            (
                                TensorRef(
                                    ref.name, out_ref.rows, out_ref.cols, ref.elem_bytes, ref.offset
                                ),
                                r0,
                                r1,
                                c0,
                                c1,
                            )
                        )
                    else:
                        loads.append((ref, 0, ref.rows, 0, ref.cols))
            out.append(
                Tile(
                    loads,
                    list(tile.stores),
                    cyc if gemm else 0,
                    0 if gemm else cyc,
                    tile.l1_bytes,
                    tile.passes,
                    tmacs,
                    tmacs if gemm else 0,
                    cyc if gemm else 0,
                    tile.dims,
                )
            )
        vec = self.extra_flops + (0 if gemm else inner.flops)
        return TiledKernel(
            name=self.name,
            op=self.op,
            group=self.group,
            op_kind=self.op_kind,
            io=self.io,
            attrs=self.attrs,
            provider=self.provider,
            record_kind="gemm" if gemm else "vector",
            precision=inner.precision if gemm else "fp16",
            tiles=tuple(out),
            macs=macs,
            flops=2 * macs + vec,
            vector_flops=vec,
            compulsory_bytes=inner.compulsory_bytes + sum(r.nbytes for r in self.extra_inputs),
            array=not own_energy,
            energy_pj=energy if own_energy else 0.0,
            extra={**self.extra, "dense_macs": self.macs, "executed_macs": macs},
        )


def tile_dims(k: GemmKernel | VectorKernel, tiles: Sequence[Tile]) -> list[dict[str, int]]:
    """The shape of every tile the device cut from ``k``, for a cost model: ``B, M, N,
    K`` of a GEMM tile or ``ROWS, COLS, ELEMENTS`` of a vector chunk, plus ``E``, the
    operand element size in bytes."""
    if isinstance(k, GemmKernel):
        e = k.a.elem_bytes if k.a is not None else 2
        return [dict(zip(("B", "M", "N", "K"), t.dims, strict=True), E=e) for t in tiles]
    e = k.inputs[0].elem_bytes if k.inputs else 2
    return [dict(zip(("ROWS", "COLS", "ELEMENTS"), t.dims, strict=True), E=e) for t in tiles]


def gemm_passes(
    device_or_spec: Any,
    precision: str,
    batch: int,
    m: int,
    n: int,
    k: int,
    elem_bytes: int,
    out_bytes: int,
) -> tuple[int, int, int, int, int]:
    """(passes, cycles per pass, L1 bytes read by the array, MAC slots, busy cycles per
    pass) of one GEMM tile ``batch x [m, k] @ [k, n]`` on the device's array: the
    device's own geometry rule (built on :mod:`~wia_hw.emulator.cycles`)."""
    spec = getattr(device_or_spec, "spec", device_or_spec)
    a = spec.compute.array
    return Device._gemm_geometry(
        a.dataflow,
        a.rows,
        a.cols,
        a.rate(precision),
        batch,
        m,
        n,
        k,
        elem_bytes,
        out_bytes,
        last=False,
    )


def execute_kernels(device: Device, kernels: Sequence[Any]) -> list[KernelRecord]:
    """Run kernels in order on ``device`` (a :class:`CostedKernel` is first tiled and
    costed into a ``TiledKernel``); one record per kernel."""
    return device.execute(
        [k.to_tiled(device) if isinstance(k, CostedKernel) else k for k in kernels]
    )


def extension_summary(records: Sequence[KernelRecord]) -> dict[str, dict[str, float]]:
    """Per provider other than ``builtin``: ``kernels``, ``cycles`` and the sum of every
    numeric figure its kernels report (``saved_hbm_bytes``, ``saved_cycles``, ...)."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        if r.provider == "builtin":
            continue
        d = out.setdefault(r.provider, {"kernels": 0, "cycles": 0})
        d["kernels"] += 1
        d["cycles"] += r.cycles
        for name, v in getattr(r, "extra", {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                d[name] = d.get(name, 0) + v
    return out
