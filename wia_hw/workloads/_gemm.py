"""A single GEMM workload (the unit benchmark of the systolic array)."""

from __future__ import annotations

from ..graph import Graph, GraphBuilder
from ._common import check_int, precision_dtypes


def gemm(M: int, N: int, K: int, precision: str = "fp16", batch: int = 1) -> Graph:  # noqa: N803
    """``C[M, N] = A[M, K] @ B[K, N]`` in ``precision``; ``batch > 1`` makes it a bmm.

    A is an ``input`` and B a ``weight`` (the stationary operand); with ``batch > 1``
    they are ``[batch, M, K]`` and ``[batch, K, N]``. C is written in ``precision``
    for fp32/fp16/bf16 and as int32 for int8 (int8 x int8 -> int32 accumulator).
    One op named ``gemm``, group ``gemm``; FLOPs are ``2 * batch * M * N * K``.
    """
    w = "gemm"
    m, n, k = (check_int(w, a, v) for a, v in (("M", M), ("N", N), ("K", K)))
    batch = check_int(w, "batch", batch)
    dt, _ = precision_dtypes(w, precision)
    out = "int32" if dt == "int8" else dt
    b = GraphBuilder(w, dt)
    lead = (batch,) if batch > 1 else ()
    a = b.input("A", lead + (m, k))
    bm = b.weight("B", lead + (k, n))
    b.op("bmm" if batch > 1 else "matmul", "gemm", [a, bm], group="gemm", dtype=out)
    return b.graph(
        sequences=batch,
        params={"model": w, "M": m, "N": n, "K": k, "batch": batch, "precision": dt},
    )
