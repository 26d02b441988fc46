"""What-if runs: apply a change to the kernels a session launched and run them again.

Recommendations measure their ``estimated_improvement`` with these: the session's
kernel program (every kernel in launch order, with the write-back at the end of each
run) is replayed on a fresh emulated device of the same spec, started at the
temperature the session started at, once as it was and once with the change; the
gain is the difference in cycles. Both replays start from cold caches, so the
comparison is like for like even when the session itself ran warm.

Changes the emulator can apply exactly:

* **Fuse two vector kernels** (:func:`fuse_vector_pair`): a vector kernel that reads
  only the previous vector kernel's output (plus small or other operands) over the same
  rows becomes one pass: the intermediate never goes to memory; the fused pass issues
  the sum of both parts' vector work.
* **Fuse an activation into a GEMM epilogue** (:func:`fuse_gemm_epilogue`): a
  one-input vector kernel on a GEMM's output becomes the GEMM writing the activation's
  result. The activation's vector work runs on the core's vector unit while the array
  computes the next tile, so it is hidden; the pair is only offered when that holds
  with margin (vector work at most half the array work).
* **Re-tile a GEMM** (:func:`gemm_tilings`): other tile sizes and loop orders that fit
  the L1 budget of the lowering heuristic; a vector kernel: other row chunks
  (:func:`vector_tilings`).
* **Pool allocations** (:func:`replay_allocations`): the session's allocation trace
  replayed on an allocator with size-class pooling.
* **Remove thermal throttling** (:func:`replay` on a spec whose ``throttle_factor`` is 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..emulator.allocator import AllocatorConfig, CachingAllocator
from ..emulator.device import Device
from ..emulator.kernels import GemmKernel, GemmTiling, VectorKernel

# fusion has one implementation, shared with wia_hw.apply_fusion
from ..optimize._kernels import fuse_gemm_epilogue, fuse_vector_pair, reads
from ..optimize._kernels import rows_per_tile as _rows_per_tile

__all__ = [
    "replay",
    "reads",
    "fuse_vector_pair",
    "fuse_gemm_epilogue",
    "gemm_tilings",
    "time_kernel",
    "replay_allocations",
    "substitute",
    "vector_tilings",
    "FLUSH",
]

FLUSH = "flush"


def _execute(dev: Device, kernels: list[Any]) -> None:
    try:
        from ..emulator.extension_kernels import execute_kernels
    except ImportError:  # pragma: no cover
        dev.execute(kernels)
        return
    execute_kernels(dev, kernels)


def replay(spec: Any, program: Sequence[Any], *, temperature_c: float | None = None) -> int:
    """Cycles ``program`` (kernels and ``"flush"`` markers) takes on a fresh device."""
    dev = Device(spec)
    if temperature_c is not None:
        dev.thermal.temperature_c = temperature_c
    batch: list[Any] = []
    for item in program:
        if isinstance(item, str) and item == FLUSH:
            if batch:
                _execute(dev, batch)
                batch = []
            dev.flush()
        else:
            batch.append(item)
    if batch:
        _execute(dev, batch)
    return dev.now


def time_kernel(spec: Any, kernel: Any) -> int:
    """Cycles of one kernel alone on a fresh (cold) device."""
    dev = Device(spec)
    _execute(dev, [kernel])
    return dev.now


def _fits(spec: Any, tm: int, tn: int, tk: int, tb: int, e: int, eo: int) -> bool:
    budget = spec.memory.l1.size_bytes // 2
    return tb * (tm + tn) * tk * e <= budget and tb * tm * tn * eo <= spec.memory.l1.size_bytes // 4


def gemm_tilings(spec: Any, k: GemmKernel, limit: int = 24) -> list[GemmTiling]:
    """Other tilings of ``k`` that fit the lowering's L1 budget: tile sides in whole
    array multiples (powers of two times the array, and the whole dimension), K whole or
    halved, both loop orders; at most ``limit``, nearest the current tiling first."""
    a = spec.compute.array
    R, C = a.rows, a.cols
    e, eo = k.a.elem_bytes, k.c.elem_bytes

    def sides(dim: int, unit: int) -> list[int]:
        out = {min(dim, unit)}
        s = unit
        while s < dim:
            out.add(s)
            s *= 2
        out.add(-(-dim // unit) * unit if dim > unit else dim)
        return sorted(x for x in out if x <= max(dim, unit))

    ks = {k.k}
    half = k.k
    while half > R:
        half = max(R, (half // 2) // R * R)
        ks.add(half)
    t0 = k.tiling
    cands = []
    for tm in sides(k.m, R):
        for tn in sides(k.n, C):
            for tk in sorted(ks):
                for tb in sorted({1, t0.tb}):
                    for order in ("mn", "nm"):
                        t = GemmTiling(min(tm, k.m), min(tn, k.n), min(tk, k.k), tb, order)
                        if t != t0 and _fits(spec, t.tm, t.tn, t.tk, t.tb, e, eo):
                            cands.append(t)
    cands = list(dict.fromkeys(cands))

    def dist(t: GemmTiling) -> tuple[float, str]:
        d = sum(
            abs(math.log2(x / y))
            for x, y in ((t.tm, t0.tm), (t.tn, t0.tn), (t.tk, t0.tk), (t.tb, t0.tb))
        )
        return d + (0.5 if t.order != t0.order else 0.0), repr(t)

    cands.sort(key=dist)
    return cands[:limit]


def vector_tilings(spec: Any, k: VectorKernel) -> list[int]:
    """Other row chunkings of a vector kernel: rows per tile halved (down to 1) or
    doubled while inputs and outputs fit the lowering's L1/4 budget."""
    most = _rows_per_tile(spec, k.rows, k.outputs, k.inputs) * spec.compute.cores
    out = []
    r = k.rows_per_tile
    while r > 1 and len(out) < 4:
        r //= 2
        out.append(r)
    r = k.rows_per_tile
    budget_rows = _rows_per_tile(spec, 1 << 62, k.outputs, k.inputs)
    while r * 2 <= min(k.rows, max(budget_rows, most)) and len(out) < 6:
        r *= 2
        out.append(r)
    return sorted(set(out) - {k.rows_per_tile})


def substitute(program: Sequence[Any], changes: dict[int, Any]) -> list[Any]:
    """``program`` with kernel ``i`` replaced by ``changes[i]`` (``None`` removes it)."""
    out = []
    for i, item in enumerate(program):
        if i in changes:
            if changes[i] is not None:
                out.append(changes[i])
        else:
            out.append(item)
    return out


def replay_allocations(
    events: Iterable[tuple[Any, ...]],
    capacity_bytes: int,
    config: AllocatorConfig,
    sync: Callable[[tuple[Any, ...]], bool],
) -> tuple[int, int]:
    """Replay a memory report's allocation trace on a fresh allocator with ``config``;
    returns ``(device cycles of the calls for which sync(event) holds, peak reserved
    bytes)``. Frees of blocks allocated before the trace began are skipped."""
    a = CachingAllocator(capacity_bytes, config)
    live: dict[int, Any] = {}
    cycles = 0
    for e in events:
        kind = e[1]
        if kind == "malloc":
            blk, c = a.malloc(max(1, e[5]))
            live[e[2]] = blk
        elif kind == "free" and e[2] in live:
            c = a.free(live.pop(e[2]))
        else:
            continue
        if sync(e):
            cycles += c
    return cycles, a.stats.peak_reserved_bytes
