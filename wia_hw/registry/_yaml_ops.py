"""Lowering of YAML-only operations: built-in primitives plus a cost expression.

A YAML-only operation (``compose`` + ``cost``, no ``impl``) lowers the graph ops it
claims to a :class:`~wia_hw.emulator.extension_kernels.CostedKernel`: the built-in
lowering of the chain's first op gives the tiling and the data each tile moves (so the
cache model sees the operation's real traffic), the cost expressions give each tile's
compute cycles, MACs and energy. A chain of several primitives is fused: the chain's
result is written where its last op writes, the intermediate results stay on chip, and
the other ops of the chain lower to nothing. Every tile's cost is checked against the
unit's peak (:func:`._peaks.check_tile`): a cost model that beats it is refused.

An operation with ``cost: builtin`` reuses the emulator's own timing instead
(:func:`_builtin_chain`): its chain's ops are lowered by the built-in lowering and fused
by the same code as :func:`wia_hw.apply_fusion`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..emulator.config import DeviceSpec
from ..emulator.errors import WorkloadError
from ..emulator.extension_kernels import CostedKernel
from ..emulator.kernels import GemmKernel, TensorRef, VectorKernel
from ..graph import Graph, Op, is_view
from ..lowering import VIEW_KINDS, lower_op
from ._chains import chain_head, match_chain
from ._expr import ExprError
from ._manifest import DeviceExtension, Operation
from ._peaks import check_macs, check_tile, check_values, device_names, skips_macs

__all__ = ["yaml_operation_provider"]


def _claimed(op: Op, operation: Operation) -> bool:
    return op.name in operation.claims or op.kind in operation.claims


def _builtin_chain(chain: list[Op], graph: Graph, spec: DeviceSpec, storage: Any) -> list[Any]:
    """The kernels of a ``cost: builtin`` chain: every op lowered by the built-in
    lowering, then fused from the front as :func:`wia_hw.apply_fusion` fuses (a GEMM
    epilogue, or one vector pass) while the built-in fusion applies; the rest run in
    order, unfused (so the chain's tails, which lower to nothing, are never lost)."""
    from ..optimize._kernels import fuse_gemm_epilogue, fuse_vector_pair

    prog: list[Any] = []
    for o in chain:
        prog.extend(lower_op(o, graph, spec, storage))
    at = 0
    while at + 1 < len(prog):
        fused = fuse_gemm_epilogue(spec, prog, at) or fuse_vector_pair(spec, prog, at)
        if fused is None:
            at += 1
            continue
        prog[at : at + 2] = [fused]
    return prog


def yaml_operation_provider(
    ext: DeviceExtension, operation: Operation
) -> Callable[[Op, Graph, DeviceSpec, Any], list[Any] | None]:
    """The lowering function of a YAML-only operation of ``ext``."""
    kinds = operation.chain_kinds()
    cost = dict(operation.cost)

    def provider(op: Op, graph: Graph, spec: DeviceSpec, storage: Any) -> list[Any] | None:
        def fusable(chain: list[Op]) -> bool:
            head = chain[0]
            if head.kind in VIEW_KINDS or is_view(head, graph.shapes_of(head)[0]):
                return False
            return graph.tensors[chain[-1].outputs[0]].numel == graph.tensors[head.outputs[0]].numel

        chain = (
            match_chain(graph, op, kinds, fusable)
            if _claimed(op, operation) and op.kind in kinds[0]
            else None
        )
        if chain is None:
            if len(kinds) > 1:
                hit = chain_head(graph, op, kinds, fusable)
                if hit is not None and _claimed(hit[0], operation):
                    return []  # fused into the chain's first op
            return None
        head, tail = chain[0], chain[1:]
        if operation.builtin_cost is not None:
            return _builtin_chain(chain, graph, spec, storage)
        # the tiling of tiles costed one block each, never pipelined: as an unpipelined
        # array's (which slices K only when the panels would outrun the L2 port; a
        # pipelined array's deeper K slices would each pay a costed tile's fixed part)
        arr = spec.compute.array
        tiling_spec = (
            replace(spec, compute=replace(spec.compute, array=replace(arr, pipelined=False)))
            if arr.pipelined
            else spec
        )
        built = lower_op(head, graph, tiling_spec, storage)
        if len(built) != 1 or not isinstance(built[0], (GemmKernel, VectorKernel)):
            return None  # a view (or nothing to run): decline
        inner = built[0]
        extra: list[TensorRef] = []
        extra_flops = 0
        if tail:
            last = tail[-1]
            out = storage.ref(last.outputs[0])
            inside = {t for o in chain for t in o.outputs}
            for o in tail:
                extra_flops += graph.flops(o)
                for i in o.inputs:
                    if i not in inside and i not in head.inputs:
                        extra.append(storage.ref(i))
            if isinstance(inner, GemmKernel):
                c = inner.c
                inner = replace(
                    inner, c=TensorRef(out.name, c.rows, c.cols, out.elem_bytes, out.offset)
                )
            else:
                o0 = inner.outputs[0]
                inner = replace(
                    inner,
                    outputs=(TensorRef(out.name, o0.rows, o0.cols, out.elem_bytes, out.offset),),
                    inputs=inner.inputs + tuple(extra),
                )
                extra = []
        env_base: dict[str, float] = {**device_names(spec), **ext.values}
        if isinstance(inner, GemmKernel):
            env_base["rate"] = float(spec.compute.array.rate(inner.precision))
        name = f"{ext.id}.{operation.name}"
        sparse = skips_macs(ext, operation)

        def tile_cost(dims: Mapping[str, int]) -> tuple[int, int | None, float | None]:
            env = {**env_base, **dims}
            try:
                cyc = cost["cycles"].evaluate(env)
                macs = cost["macs"].evaluate(env) if "macs" in cost else None
                pj = cost["energy_pj"].evaluate(env) if "energy_pj" in cost else None
            except ExprError as e:
                raise WorkloadError(
                    f"op {head.name!r}: cost model of {name} failed for tile {dict(dims)}: {e}"
                ) from None
            why = check_values(name, dims, cyc, macs, pj)
            if why is not None:
                raise WorkloadError(f"op {head.name!r}: {why}")
            cycles, tile_macs = math.ceil(cyc), (None if macs is None else math.ceil(macs))
            why = check_macs(name, operation, dims, tile_macs, sparse) or check_tile(
                name, operation, env, dims, cycles, tile_macs
            )
            if why is not None:
                raise WorkloadError(f"op {head.name!r}: {why}")
            return cycles, tile_macs, pj

        return [
            CostedKernel(
                name=head.name if not tail else f"{head.name}+{'+'.join(o.kind for o in tail)}",
                op=head.name,
                group=head.group,
                op_kind=head.kind,
                io=(
                    tuple(
                        dict.fromkeys(
                            i
                            for o in chain
                            for i in o.inputs
                            if i not in {t for c in chain for t in c.outputs}
                        )
                    ),
                    tail[-1].outputs if tail else head.outputs,
                ),
                attrs={**head.attrs, "operation": operation.name},
                provider=ext.id,
                inner=inner,
                tile_cost=tile_cost,
                extra_inputs=tuple(extra),
                extra_flops=extra_flops,
                extra={"operation": operation.name},
            )
        ]

    provider.__name__ = f"{ext.id}.{operation.name}"
    return provider
