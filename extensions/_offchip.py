"""Attached matrix units (photonic, analog): shared operand checks and the device run.

Both units compute ``C = A @ B`` off the systolic array; on a context the product also
runs on the device as one :class:`~wia_hw.emulator.kernels.TiledKernel`: a core's DMA
stages A and B through the caches, the unit works for its own time, C is stored.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ..emulator.errors import WorkloadError
from ..emulator.extension_kernels import execute_kernels
from ..emulator.kernels import TensorRef, Tile, TiledKernel

__all__ = ["product_operands", "write_product", "run_offchip_unit"]

_calls = itertools.count()


def product_operands(fn: str, A: Any, B: Any) -> tuple[np.ndarray, np.ndarray]:  # noqa: N803
    """``A`` and ``B`` as float64 matrices that multiply; WorkloadError naming ``fn``."""
    a = np.asarray(A, dtype=np.float64)
    b = np.asarray(B, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise WorkloadError(
            f"{fn}: A {list(a.shape)} x B {list(b.shape)}: inner "
            "dimensions differ (need A[M, K] and B[K, N])"
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise WorkloadError(f"{fn}: A and B must be finite")
    return a, b


def write_product(fn: str, C: Any, out: np.ndarray) -> None:  # noqa: N803
    """Copy the product into the caller's ``C``, which must have its shape."""
    if np.shape(C) != out.shape:
        raise WorkloadError(
            f"{fn}: C has shape {list(np.shape(C))}, the product is {list(out.shape)}"
        )
    C[...] = out


def run_offchip_unit(
    ctx: Any,
    unit: str,
    name: str,
    m: int,
    k: int,
    n: int,
    elem_bytes: int,
    time_ns: float,
    macs: int,
    energy_pj: float,
    extra: dict[str, Any],
) -> int:
    """Run one product of an attached unit (photonic, analog) on ``ctx``'s device: a
    core's DMA stages A and B through the caches, the unit works ``time_ns``, C is
    stored. Returns the device cycles the kernel took."""
    idx = next(_calls)
    ra = TensorRef(f"{unit}{idx}.A", m, k, elem_bytes)
    rb = TensorRef(f"{unit}{idx}.B", k, n, elem_bytes)
    rc = TensorRef(f"{unit}{idx}.C", m, n, elem_bytes)
    cycles = max(1, math.ceil(time_ns * ctx.spec.clock_ghz))
    tile = Tile([(ra, 0, m, 0, k), (rb, 0, k, 0, n)], [(rc, 0, m, 0, n)], 0, cycles, 0, 0, macs, 0)
    kern = TiledKernel(
        name=name,
        op=name,
        group=unit,
        op_kind="matmul",
        provider=unit,
        record_kind=unit,
        precision="fp16",
        tiles=(tile,),
        macs=macs,
        flops=2 * macs,
        vector_flops=0,
        compulsory_bytes=ra.nbytes + rb.nbytes + rc.nbytes,
        array=False,
        energy_pj=energy_pj,
        extra=extra,
    )
    (rec,) = execute_kernels(ctx.device, [kern])
    return rec.cycles
