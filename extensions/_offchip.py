"""Attached matrix units (photonic, analog): shared operand checks and the device run.

Both units compute ``C = A @ B`` off the systolic array; on a context the product also
runs on the device as one :class:`~wia_hw.emulator.kernels.TiledKernel`: a core's DMA
stages A and B through the caches, the unit works for its own time, C is stored.

Graph routing: both manifests claim ``linear``, ``matmul`` and ``conv2d`` (an im2col
matmul); their ``policy`` parameter (:func:`parse_policy`) decides which of those ops
they take (:func:`policy_selects`), the rest decline to the built-in lowering. A taken
op becomes one such kernel (:func:`gemm_unit_kernel`) whose ``attrs["unit_gemm"]`` is
the unit's numeric model, which functional mode calls (``wia_hw._functional``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..emulator.errors import WorkloadError
from ..emulator.extension_kernels import execute_kernels
from ..emulator.kernels import TensorRef, Tile, TiledKernel
from ..graph import GEMM_KINDS, Graph, Op
from ..registry import DeviceExtension, ExtensionId, ensure_extension

__all__ = [
    "product_operands",
    "write_product",
    "run_offchip_unit",
    "parse_policy",
    "policy_selects",
    "gemm_unit_kernel",
    "ensure_unit",
    "POLICIES",
    "UNIT_KINDS",
]

#: The routing policies of the ``policy`` parameter (``names:`` takes a list).
POLICIES = ("none", "all", "all_but_first_last", "names:OP[,OP...]")
#: The graph op kinds both units' manifests claim (the only ones a policy can route).
UNIT_KINDS = ("linear", "matmul", "conv2d")

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


def parse_policy(policy: Any, where: str = "policy") -> tuple[str, frozenset[str]]:
    """``(mode, names)`` of a routing policy: ``none`` (take no graph op: the unit is
    called directly only), ``all`` (every claimed op), ``all_but_first_last`` (every
    claimed op except the graph's first and last GEMM-class layer, which commonly stay
    digital) or ``names:a,b`` (exactly the ops named). Raises ValueError naming
    ``where`` otherwise."""
    if isinstance(policy, str):
        if policy in ("none", "all", "all_but_first_last"):
            return policy, frozenset()
        if policy.startswith("names:"):
            names = frozenset(n.strip() for n in policy[6:].split(",") if n.strip())
            if names:
                return "names", names
    raise ValueError(
        f"{where} must be one of none, all, all_but_first_last, names:OP[,OP...]; got {policy!r}"
    )


def policy_selects(policy: str, op: Op, graph: Graph, unit: str) -> bool:
    """Whether ``unit``'s ``policy`` takes graph op ``op``. Raises WorkloadError when a
    ``names:`` policy names an op the graph does not have, or one of a kind the unit
    does not take (not in :data:`UNIT_KINDS`: it would route nothing, silently)."""
    mode, names = parse_policy(policy, f"{unit}.policy")
    if mode == "none":
        return False
    if mode == "names":
        missing = names - {o.name for o in graph.ops}
        if missing:
            raise WorkloadError(
                f"{unit} policy {policy!r}: graph {graph.name!r} has no op "
                f"{', '.join(sorted(missing))}"
            )
        other = sorted(o.name for o in graph.ops if o.name in names and o.kind not in UNIT_KINDS)
        if other:
            kind = next(o.kind for o in graph.ops if o.name == other[0])
            raise WorkloadError(
                f"{unit} policy {policy!r}: op {other[0]!r} is a {kind}; {unit} takes only "
                f"{', '.join(UNIT_KINDS)} ops"
            )
        return op.name in names
    if mode == "all":
        return True
    layers = [o.name for o in graph.ops if o.kind in GEMM_KINDS]
    return op.name not in (layers[0], layers[-1])


def gemm_unit_kernel(
    op: Op,
    graph: Graph,
    spec: Any,
    storage: Any,
    unit: str,
    dims: tuple[int, int, int, int],
    time_ns: float,
    energy_pj: float,
    extra: dict[str, Any],
    unit_gemm: Callable[[np.ndarray, np.ndarray, int], np.ndarray],
) -> TiledKernel:
    """One graph GEMM op (``dims = (batch, m, n, k)``) on an attached unit: one tile
    that loads the op's inputs (activations, weights, bias) through the caches, works
    ``ceil(time_ns * clock_ghz)`` device cycles (the unit's time; the array is idle)
    and stores the output. ``unit_gemm(a [m, k], b [k, n], seed) -> c [m, n]`` is the
    unit's numeric model, kept in ``attrs["unit_gemm"]`` for functional mode."""
    batch, m, n, k = dims
    macs = batch * m * n * k
    loads = [(r, 0, r.rows, 0, r.cols) for r in (storage.ref(i) for i in op.inputs)]
    out = storage.ref(op.outputs[0])
    cycles = max(1, math.ceil(time_ns * spec.clock_ghz))
    tile = Tile(loads, [(out, 0, out.rows, 0, out.cols)], 0, cycles, 0, 0, macs, 0)
    return TiledKernel(
        name=op.name,
        op=op.name,
        group=op.group,
        op_kind=op.kind,
        io=(op.inputs, op.outputs),
        attrs={**op.attrs, "unit_gemm": unit_gemm},
        provider=unit,
        record_kind=unit,
        precision=graph.tensors[op.inputs[0]].dtype,
        tiles=(tile,),
        macs=macs,
        flops=2 * macs,
        vector_flops=0,
        compulsory_bytes=sum(r.nbytes for r, *_ in loads) + out.nbytes,
        array=False,
        energy_pj=energy_pj,
        extra=extra,
    )


def ensure_unit(ctx: Any, ext_id: ExtensionId) -> DeviceExtension:
    """The unit's extension on ``ctx`` for a direct call (``hybrid_matmul(ctx, ...)``,
    ``photonic_matmul(ctx, ...)``): the registered one, else the built-in manifest
    registered *without* its graph claims (:func:`wia_hw.registry.ensure_extension`, as
    every direct call), so that direct calls to both units share a context (their graph
    operations claim the same op kinds; routing graph ops is asked for by registering
    the extension explicitly, which replaces the claim-less registration)."""
    return ensure_extension(ctx, ext_id)
