"""Operator fusion of a workload graph (the seed's ``wia_apply_fusion``, section 8.7).

:func:`apply_fusion` returns a new :class:`~wia_hw.graph.Graph` with the same ops and
tensors, in which every fused chain of ops is marked: each member's ``attrs["fusion"]``
holds ``{"name", "pattern", "ops", "position"}``. Lowering
(:func:`wia_hw.lowering.lower_op`) gives the chain's first op the fused kernel(s) and
the others none, so the chain's intermediates never cross memory. Patterns, each
claimed only when every intermediate is read by the next op of the chain alone and
is not a declared model output (``Graph.declared_outputs``, which must be written):

=====================  ============================================  ==================
config field           chain                                         fused kernel
=====================  ============================================  ==================
``fuse_attention``     ``bmm`` (``transpose_b``) -> ``softmax``      flash attention of
                       -> ``bmm``                                    the transformer
                                                                     engine (one kernel)
``fuse_gelu``          ``linear``/``matmul`` -> ``gelu``             GEMM epilogue
``fuse_residual_``     residual ``add`` (same-shape operands, no     one vector pass
``connections``        weight) -> ``layer_norm``
``fuse_layer_norm``    any elementwise op -> ``layer_norm``          one vector pass
=====================  ============================================  ==================

The kernel-level fusion is :mod:`wia_hw.optimize._kernels`, the same code the
recommendation engine's what-ifs replay, so a fusion recommendation measures what
``apply_fusion`` gives.

Device-dependent choices, made when the graph is lowered on a device (documented,
never silent: the kernels' names and providers show them):

* a GEMM epilogue is fused only when the activation's vector work hides behind the
  array (:func:`~wia_hw.optimize._kernels.fuse_gemm_epilogue`); otherwise the chain
  lowers to its two unfused kernels;
* an attention chain lowers to flash attention only when that is not slower than the
  three unfused kernels on this device (both timed on a cold device of the same spec,
  write-back included, cached per shape): at short sequences the unfused GEMMs can
  use the array better than the flash tiles do;
* a vector pair (a residual add into a layer norm) lowers to its one fused pass, at
  the fastest of its row chunkings (:func:`~wia_hw.optimize._kernels.fuse_vector_pair`),
  only when that is not slower than the two unfused kernels, timed the same way: a
  layer norm cannot be cut into column blocks as the add alone can, and over wide
  rows the fused pass's row chunks can lose more than the intermediate saves.

The fused graph keeps the source graph's weight values and static quantisation (an
imported model's: ``Graph.weight_values``, ``Graph.quant``); fusing a
:class:`~wia_hw.optimize.QuantizedGraph` gives one, with its weights and scales (the
documented order is fuse, then quantise; with one config both orders give the same
graph). Functional mode computes
a fused chain op by op, each intermediate rounded to its
declared dtype (an epilogue that converts the accumulator before applying the
activation); flash attention's values are the extension-lowered path's (untiled
GEMMs), so fused and unfused results agree within the precision's rounding.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from ..emulator.config import DeviceSpec
from ..emulator.errors import WorkloadError
from ..emulator.kernels import Kernel
from ..graph import BINARY_KINDS, UNARY_KINDS, Graph, Op
from ..lowering import ATTR_LOWERINGS, _builtin
from ._kernels import cold_cycles, fuse_gemm_epilogue, fuse_vector_pair

__all__ = ["FusionConfig", "apply_fusion", "lower_fused", "refuse", "FUSION_PATTERNS"]

#: Fusion patterns and the config field that enables each.
FUSION_PATTERNS = {
    "attention": "fuse_attention",
    "gemm_epilogue": "fuse_gelu",
    "residual_layer_norm": "fuse_residual_connections",
    "layer_norm": "fuse_layer_norm",
}


@dataclass(frozen=True, kw_only=True)
class FusionConfig:
    """The seed's ``wia_fusion_config_t`` (every pattern on by default)."""

    fuse_attention: bool = True
    fuse_layer_norm: bool = True
    fuse_residual_connections: bool = True
    fuse_gelu: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, bool):
                raise TypeError(f"FusionConfig.{f.name} must be a bool, got {v!r}")


def _consumers(graph: Graph) -> dict[str, list[Op]]:
    out: dict[str, list[Op]] = {}
    for o in graph.ops:
        for i in dict.fromkeys(o.inputs):
            out.setdefault(i, []).append(o)
    return out


def _only_reader(cons: dict[str, list[Op]], op: Op, declared: frozenset[str]) -> Op | None:
    """The one op that reads ``op``'s output, or None when several ops read it, none
    does, or it is a declared model output (``Graph.declared_outputs``): a model
    output must be written, so no fused kernel may keep it on chip."""
    if op.outputs[0] in declared:
        return None
    r = cons.get(op.outputs[0], [])
    return r[0] if len(r) == 1 else None


def _attention_ok(graph: Graph, chain: Sequence[Op]) -> bool:
    scores, soft, ctx = chain
    t = graph.tensors
    if not scores.attrs.get("transpose_b") or ctx.attrs.get("transpose_b"):
        return False
    if soft.attrs.get("axis", -1) not in (-1, len(t[soft.inputs[0]].shape) - 1):
        return False
    if ctx.inputs[0] != soft.outputs[0] or t[scores.inputs[0]].dtype not in (
        "fp16",
        "bf16",
        "fp32",
    ):
        return False
    qs, vs = t[scores.inputs[0]].shape, t[ctx.inputs[1]].shape
    return len(qs) >= 3 and len(vs) == len(qs) and qs[:-2] == vs[:-2]


def _match(
    graph: Graph, cons: dict[str, list[Op]], op: Op, cfg: FusionConfig
) -> tuple[str, list[Op]] | None:
    declared = frozenset(graph.declared_outputs)
    nxt = _only_reader(cons, op, declared) if op.outputs else None
    t = graph.tensors
    if (
        cfg.fuse_attention
        and op.kind == "bmm"
        and nxt is not None
        and nxt.kind == "softmax"
        and not nxt.attrs.get("log")
    ):
        last = _only_reader(cons, nxt, declared)
        if last is not None and last.kind == "bmm" and _attention_ok(graph, [op, nxt, last]):
            return "attention", [op, nxt, last]
    if nxt is None:
        return None
    if cfg.fuse_gelu and op.kind in ("linear", "matmul") and nxt.kind == "gelu":
        return "gemm_epilogue", [op, nxt]
    if (
        nxt.kind == "layer_norm"
        and nxt.inputs[0] == op.outputs[0]
        and (op.kind in BINARY_KINDS or op.kind in UNARY_KINDS)
    ):
        residual = (
            op.kind == "add"
            and t[op.inputs[0]].shape == t[op.inputs[1]].shape
            and all(t[i].kind != "weight" for i in op.inputs)
        )
        if residual and cfg.fuse_residual_connections:
            return "residual_layer_norm", [op, nxt]
        if cfg.fuse_layer_norm:
            return "layer_norm", [op, nxt]
    return None


def apply_fusion(graph: Graph, config: FusionConfig | None = None) -> Graph:
    """A copy of ``graph`` with the chains ``config`` enables marked as fused (see the
    module docstring). Ops already fused are left as they are, so applying it twice
    changes nothing. ``graph.params["fusion"]`` counts the chains by pattern and
    ``graph.params["fusion_config"]`` records the config (:func:`refuse` reuses it).

    Raises ``TypeError`` when ``graph`` is not a Graph or ``config`` not a FusionConfig.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"apply_fusion takes a Graph, got {type(graph).__name__}")
    cfg = FusionConfig() if config is None else config
    if not isinstance(cfg, FusionConfig):
        raise TypeError(f"config must be a FusionConfig, got {type(cfg).__name__}")
    cons = _consumers(graph)
    claimed: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = dict(graph.params.get("fusion", {}))
    for op in graph.ops:
        if op.name in claimed or "fusion" in op.attrs:
            continue
        hit = _match(graph, cons, op, cfg)
        if hit is None or any(o.name in claimed or "fusion" in o.attrs for o in hit[1]):
            continue
        pattern, chain = hit
        names = tuple(o.name for o in chain)
        for pos, o in enumerate(chain):
            claimed[o.name] = {
                "name": "+".join(names),
                "pattern": pattern,
                "ops": names,
                "position": pos,
            }
        counts[pattern] = counts.get(pattern, 0) + 1
    ops = [
        replace(o, attrs={**o.attrs, "fusion": claimed[o.name]}) if o.name in claimed else o
        for o in graph.ops
    ]
    before = graph.params.get("fusion_config", {})
    config_used = {f.name: bool(before.get(f.name)) or getattr(cfg, f.name) for f in fields(cfg)}
    return _same_values(
        graph,
        Graph(
            graph.name,
            graph.tensors.values(),
            ops,
            sequences=graph.sequences,
            params={**graph.params, "fusion": counts, "fusion_config": config_used},
            validate=False,
        ),
    )


def _same_values(src: Graph, marked: Graph) -> Graph:
    """``marked`` (``src``'s tensors and ops, marks changed) with ``src``'s weight values
    and static quantisation: fused chains compute op by op, so they still apply. A
    quantised ``src`` gives a quantised graph, with its weights, scales and thresholds
    (fusing after :func:`wia_hw.quantize_model` marks what fusing before it would: the
    rewrite fuses its result again with the same config)."""
    carried_to = getattr(src, "carried_to", None)  # a QuantizedGraph (which imports us)
    if carried_to is not None:
        marked = carried_to(marked)
    marked.weight_values = dict(src.weight_values)
    marked.quant = dict(src.quant)
    marked.declared_outputs = list(src.declared_outputs)
    marked.weight_sources = dict(src.weight_sources)
    return marked


def refuse(graph: Graph) -> Graph:
    """``graph`` with its fusion marks derived again (after a transformation such as
    :func:`wia_hw.quantize_model` changed the ops between them): the marks are removed
    and :func:`apply_fusion` runs with the config recorded in
    ``graph.params["fusion_config"]``. A graph never fused is returned as it is."""
    cfg = graph.params.get("fusion_config")
    if cfg is None:
        return graph
    ops = [replace(o, attrs={k: v for k, v in o.attrs.items() if k != "fusion"}) for o in graph.ops]
    params = {k: v for k, v in graph.params.items() if k not in ("fusion", "fusion_config")}
    bare = Graph(
        graph.name,
        graph.tensors.values(),
        ops,
        sequences=graph.sequences,
        params=params,
        validate=False,
    )
    return apply_fusion(_same_values(graph, bare), FusionConfig(**cfg))


# -- lowering ---------------------------------------------------------------------------

_BY_NAME: weakref.WeakKeyDictionary[Graph, dict[str, Op]] = weakref.WeakKeyDictionary()
#: (spec id, what is fused, shapes) -> (the spec, the fused kernels are not slower): the
#: spec is held so that its id cannot be reused by another spec while the entry exists.
_CHOICE: dict[tuple[Any, ...], tuple[DeviceSpec, bool]] = {}


@functools.lru_cache(maxsize=1)
def _transformer_engine() -> Any:
    from ..registry import load_extension

    return load_extension("transformer_engine")


def _ops_by_name(graph: Graph) -> dict[str, Op]:
    got = _BY_NAME.get(graph)
    if got is None:
        got = _BY_NAME[graph] = {o.name: o for o in graph.ops}
    return got


def _attention_kernels(
    chain: list[Op], graph: Graph, spec: DeviceSpec, storage: Any, plain: list[Kernel]
) -> list[Kernel]:
    from ..extensions.transformer_engine import _graph_attention

    t = graph.tensors
    q, k = t[chain[0].inputs[0]], t[chain[0].inputs[1]]
    ext = _transformer_engine()
    cross = q.shape[-2] != k.shape[-2]
    flash = _graph_attention(
        chain,
        graph,
        spec,
        storage,
        ext,
        "cross_attention_optimized" if cross else "multi_head_attention_fused",
        cross=cross,
    )
    if not flash:
        return plain
    key = (
        id(spec),
        "attention",
        q.shape,
        k.shape,
        t[chain[2].inputs[1]].shape,
        q.dtype,
        bool(chain[1].attrs.get("causal")),
    )
    return list(flash) if _not_slower(spec, key, flash, plain) else plain


def _not_slower(spec: DeviceSpec, key: tuple[Any, ...], fused: Any, plain: Any) -> bool:
    """Whether the ``fused`` kernels take no more cycles than the ``plain`` ones on a
    cold device of ``spec`` (:func:`cold_cycles`), cached under ``key`` (which holds
    the spec's id and the shapes)."""
    hit = _CHOICE.get(key)
    if hit is None or hit[0] is not spec:
        hit = _CHOICE[key] = (spec, cold_cycles(spec, fused) <= cold_cycles(spec, plain))
    return hit[1]


def lower_fused(op: Op, graph: Graph, spec: DeviceSpec, storage: Any) -> list[Kernel]:
    """Kernels of an op marked by :func:`apply_fusion`: the chain's fused kernel(s) on
    its first op, none on the others (see the module docstring for when a chain lowers
    unfused on a device). Raises WorkloadError when a marked chain is broken (an op it
    names is missing or no longer reads the previous one's output)."""
    info = op.attrs["fusion"]
    if info["position"] > 0:
        return []
    by = _ops_by_name(graph)
    chain = [by.get(n) for n in info["ops"]]
    if any(
        c is None or c.attrs.get("fusion", {}).get("name") != info["name"] for c in chain
    ) or any(b.outputs[0] not in c.inputs for b, c in zip(chain[:-1], chain[1:], strict=True)):
        raise WorkloadError(
            f"op {op.name!r}: fused chain {info['name']!r} is broken (an "
            "op is missing, not marked as its member, or no longer reads "
            "the previous one's output)"
        )
    ops: list[Op] = [c for c in chain if c is not None]
    plain = [k for o in ops for k in _builtin(o, graph, spec, storage)]
    pattern = info["pattern"]
    if pattern == "attention":
        return _attention_kernels(ops, graph, spec, storage, plain)
    if len(plain) != 2:
        return plain
    if pattern == "gemm_epilogue":
        fused = fuse_gemm_epilogue(spec, plain, 0)
        return plain if fused is None else [fused]
    fused = fuse_vector_pair(spec, plain, 0)
    if fused is None:
        return plain
    key = (id(spec), "pair", *((r.rows, r.cols, r.elem_bytes) for r in fused.inputs))
    key += tuple(k.vclass for k in plain)
    return [fused] if _not_slower(spec, key, [fused], plain) else plain


ATTR_LOWERINGS["fusion"] = lower_fused
