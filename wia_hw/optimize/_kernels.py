"""Kernel-level fusion: the one implementation of fusing two lowered kernels.

:func:`wia_hw.optimize.apply_fusion` lowers a fused chain of graph ops through these,
and the recommendation engine's what-ifs (:mod:`wia_hw.profiling._whatif`) replay a
session's kernels with them, so a recommendation measures exactly what
``apply_fusion`` produces. Both take a kernel *program* (kernels in launch order,
``"flush"`` markers allowed) and the index ``i`` of the first kernel of the pair.

* :func:`fuse_vector_pair`: a vector kernel that reads the previous vector kernel's
  only output (plus other operands) over the same rows becomes one pass; the
  intermediate never goes to memory; the fused pass issues the sum of both parts'
  vector work (in elementwise cycles per element, rounded up; its class is
  ``elementwise``, so a GEMM epilogue can take the fused pass in turn).
* :func:`fuse_gemm_epilogue`: a one-input elementwise/activation vector kernel on a
  GEMM's output becomes the GEMM writing the activation's result. The activation runs
  on the core's vector unit while the array computes the next tile, so it is hidden;
  the pair is only fused when that holds with margin (vector cycles at most half the
  array's ideal cycles), else ``None``.

Neither changes a kernel's arithmetic; they change which bytes cross memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..emulator.extension_kernels import CostedKernel
from ..emulator.kernels import GemmKernel, MemoryKernel, TensorRef, TiledKernel, VectorKernel
from ..lowering import vector_row_bytes as rows_per_tile_bytes
from ..lowering import vector_rows_per_tile as rows_per_tile

__all__ = ["reads", "fuse_vector_pair", "fuse_gemm_epilogue", "rows_per_tile"]


def reads(k: Any) -> set[str]:
    """Storage names a kernel reads (``"\\0unknown"`` for a kernel type not known): an
    extension's costed kernel reads what the kernel it costs reads and its extra
    inputs; a kernel with its own tiles, what they load; a PIM kernel, what the units
    read or modify."""
    if isinstance(k, GemmKernel):
        return {r.name for r in (k.a, k.b, k.bias) if r is not None}
    if isinstance(k, VectorKernel):
        return {r.name for r in k.inputs}
    if isinstance(k, CostedKernel) and k.inner is not None:
        return reads(k.inner) | {r.name for r in k.extra_inputs}
    if isinstance(k, TiledKernel):
        return {region[0].name for t in k.tiles for region in t.loads}
    if isinstance(k, MemoryKernel):
        return {r.name for r in (*k.reads, *k.writes)}
    return {"\0unknown"}


def _read_later(program: Sequence[Any], start: int, name: str) -> bool:
    for k in program[start:]:
        if isinstance(k, str):
            continue
        r = reads(k)
        if name in r or "\0unknown" in r:
            return True
    return False


def fuse_vector_pair(spec: Any, program: Sequence[Any], i: int) -> VectorKernel | None:
    """Kernel ``i`` and ``i + 1`` fused into one vector pass, or ``None`` when the pair
    is not two vector kernels over the same rows where the second reads the first's
    only output and no later kernel reads that intermediate."""
    a, b = program[i], program[i + 1] if i + 1 < len(program) else None
    if not (isinstance(a, VectorKernel) and isinstance(b, VectorKernel)):
        return None
    if len(a.outputs) != 1 or a.rows != b.rows or a.vclass == "gather":
        return None
    mid = a.outputs[0].name
    if mid not in {r.name for r in b.inputs} or _read_later(program, i + 2, mid):
        return None
    cpe = spec.compute.vector.cycles_per_element
    work = a.elements * cpe[a.vclass] + b.elements * cpe[b.vclass]
    base = "elementwise"  # the issue class of the fused pass (an epilogue can take it)
    inputs = tuple(a.inputs) + tuple(r for r in b.inputs if r.name != mid)
    fused = VectorKernel(
        name=f"{a.name}+{b.name}",
        op=b.op,
        group=b.group,
        op_kind=b.op_kind,
        io=(a.io[0] + tuple(x for x in b.io[0] if x not in a.io[1]), b.io[1]),
        attrs=dict(b.attrs),
        provider=b.provider,
        vclass=base,
        rows=b.rows,
        elements=-(-work // int(cpe[base])),
        flops=a.flops + b.flops,
        inputs=inputs,
        outputs=b.outputs,
        rows_per_tile=rows_per_tile(spec, b.rows, b.outputs, inputs),
        precision=b.precision,
    )
    return dataclasses.replace(fused, rows_per_tile=_best_rows(spec, fused))


#: (spec id, a fused pass's shape) -> (the spec, its rows per tile): the spec is held
#: so that its id cannot be reused by another spec while the entry exists
_ROWS: dict[tuple[Any, ...], tuple[Any, int]] = {}


def cold_cycles(spec: Any, kernels: Sequence[Any]) -> int:
    """Cycles of ``kernels`` on a fresh device of ``spec``, results written back."""
    from ..emulator.device import Device
    from ..emulator.extension_kernels import execute_kernels

    dev = Device(spec)
    execute_kernels(dev, list(kernels))
    dev.flush()
    return dev.now


def _best_rows(spec: Any, k: VectorKernel) -> int:
    """The rows per tile of a fused vector pass: the lowering's L1/4 rule, or a larger
    power of two up to one tile per core whose tile still fits half of L1 (double
    buffered), whichever runs it fastest alone on a cold device (a chunk that splits
    the storage blocks' rows can load each block several times: a residual add fused
    into a layer norm of 8192 x 4096 fp32 ran 3x slower at the rule's 42 rows than at
    64). Cached per spec and shape."""
    key = (
        id(spec),
        k.rows,
        k.vclass,
        k.elements,
        tuple((r.rows, r.cols, r.elem_bytes) for r in k.inputs),
        tuple((r.rows, r.cols, r.elem_bytes) for r in k.outputs),
    )
    hit = _ROWS.get(key)
    if hit is None or hit[0] is not spec:
        rpt = k.rows_per_tile
        per_core = -(-k.rows // spec.compute.cores)
        row_bytes = max(1, rows_per_tile_bytes(k.rows, k.outputs, k.inputs))
        fits = spec.memory.l1.size_bytes // 2 // row_bytes
        cands = [rpt]
        c = 1 << max(0, rpt.bit_length())  # the next power of two above rpt
        while c <= min(per_core, fits):
            cands.append(c)
            c *= 2
        if len(cands) > 1:
            best = min(
                cands, key=lambda r: cold_cycles(spec, [dataclasses.replace(k, rows_per_tile=r)])
            )
        else:
            best = rpt
        hit = _ROWS[key] = (spec, best)
    return hit[1]


def fuse_gemm_epilogue(spec: Any, program: Sequence[Any], i: int) -> GemmKernel | None:
    """GEMM ``i`` writing the result of the one-input vector kernel ``i + 1`` on its
    output, or ``None`` when that does not apply or the vector work would not hide
    behind the array's (see the module docstring)."""
    g, v = program[i], program[i + 1] if i + 1 < len(program) else None
    if not (isinstance(g, GemmKernel) and isinstance(v, VectorKernel)) or g.c is None:
        return None
    if len(v.inputs) != 1 or len(v.outputs) != 1 or v.inputs[0].name != g.c.name:
        return None
    if v.vclass not in ("elementwise", "activation") or _read_later(program, i + 2, g.c.name):
        return None
    out = v.outputs[0]
    if out.rows * out.cols != g.c.rows * g.c.cols:
        return None
    vec = spec.compute.vector
    v_cycles = v.elements * vec.cycles_per_element[v.vclass] / (vec.lanes * spec.compute.cores)
    a_cycles = g.macs / float(spec.peak_macs_per_cycle(g.precision))
    if v_cycles > 0.5 * a_cycles:
        return None
    c = TensorRef(out.name, g.c.rows, g.c.cols, out.elem_bytes, out.offset)
    return dataclasses.replace(g, name=f"{g.name}+{v.name}", c=c, io=(g.io[0], v.io[1]))
