"""Megatron-style tensor parallelism of a transformer graph (issue #11).

:func:`shard_graph` gives the graph one rank of a tensor-parallel group of ``tp``
devices runs (Shoeybi et al., "Megatron-LM", 2019, section 3): in every layer the QKV
projection is split by columns (each rank holds ``heads / tp`` whole heads: its q, k
and v), the attention runs on those heads, the output projection is split by rows; the
MLP's first linear by columns, its second by rows. The row-parallel outputs are partial
sums: an all-reduce of ``[B, S, H]`` follows each (Megatron's ``g``, 2 per layer in the
forward pass); in the backward pass the input gradients of the two column-parallel
linears are partial sums and are all-reduced (Megatron's ``f``, 2 per layer).
Embeddings, layer norms and the head are replicated (their gradients agree on every
rank of the group). The transformer layers are found by their op names
(``*.attention_qkv_projection``, ``*.attention_output_projection``,
``*.feed_forward_intermediate``, ``*.feed_forward_output``, as the builders of
:mod:`wia_hw.workloads` name them).
"""

from __future__ import annotations

import re

from ..emulator.errors import WorkloadError
from ..graph import DTYPE_BYTES, Graph, Op, Tensor, infer_shapes

__all__ = ["shard_graph", "TPError"]

_COL = ("attention_qkv_projection", "feed_forward_intermediate")
_ROW = ("attention_output_projection", "feed_forward_output")


class TPError(WorkloadError):
    """A tensor-parallel degree that does not fit the model."""


def _suffix(name: str) -> str:
    return re.sub(r"^.*\.", "", name)


def shard_graph(graph: Graph, tp: int) -> tuple[Graph, dict[str, int], dict[str, int]]:
    """(rank graph, forward all-reduces, backward all-reduces) for a TP group of ``tp``.

    The dicts map an op name to the bytes of the all-reduce after its forward kernel
    (row-parallel linears) or after its input-gradient kernel (column-parallel ones).
    Raises :class:`TPError` when ``tp`` does not divide the attention heads or the MLP
    width, or the graph has no transformer layers to split."""
    if tp == 1:
        return graph, {}, {}
    ops = graph.ops
    tensors = dict(graph.tensors)
    splits = [
        op for op in ops if op.kind == "reshape" and op.name.endswith(".attention_split_heads")
    ]
    if not splits:
        raise TPError(
            f"tp={tp}: graph {graph.name!r} has no transformer layers to split "
            "(no op named *.attention_split_heads)"
        )
    # heads from the first layer: the QKV output [.., 3H] and the head dim
    sp = splits[0]
    h3 = tensors[sp.inputs[0]].shape[-1]
    dh = tensors[sp.outputs[0]].shape[-1]
    heads = h3 // 3 // dh
    if heads % tp:
        raise TPError(f"tp={tp} does not divide the {heads} attention heads of {graph.name!r}")
    new_w: dict[str, tuple[int, ...]] = {}
    fwd: dict[str, int] = {}
    bwd: dict[str, int] = {}
    for op in ops:
        suf = _suffix(op.name)
        if op.kind != "linear" or suf not in _COL + _ROW:
            continue
        w = tensors[op.inputs[1]]
        k, n = w.shape
        if suf in _COL:
            if n % tp:
                raise TPError(f"tp={tp} does not divide the {n} columns of {op.name!r}")
            new_w[op.inputs[1]] = (k, n // tp)
            if len(op.inputs) == 3:
                new_w[op.inputs[2]] = (n // tp,)
            x = tensors[op.inputs[0]]
            bwd[op.name] = x.numel * DTYPE_BYTES[x.dtype]
        else:
            if k % tp:
                raise TPError(f"tp={tp} does not divide the {k} rows of {op.name!r}")
            new_w[op.inputs[1]] = (k // tp, n)
            y = tensors[op.outputs[0]]
            fwd[op.name] = y.numel * DTYPE_BYTES[y.dtype]
    out_t: dict[str, Tensor] = {}
    for t in graph.tensors.values():
        if t.kind != "activation":
            shape = new_w.get(t.name, t.shape)
            if re.search(r"\.past_(key|value)$", t.name):
                shape = (t.shape[0] // tp,) + t.shape[1:]
            out_t[t.name] = Tensor(t.name, shape, t.dtype, t.kind)
    new_ops = []
    for op in ops:
        attrs = dict(op.attrs)
        suf = _suffix(op.name)
        if op.kind == "reshape" and suf == "attention_split_heads":
            s = tuple(attrs["shape"])
            attrs["shape"] = (s[0] // tp,) + s[1:]
        elif op.kind == "reshape" and suf == "attention_merge_heads":
            s = tuple(attrs["shape"])
            attrs["shape"] = s[:-1] + (s[-1] // tp,)
        elif op.kind == "slice" and suf in ("attention_query", "attention_key", "attention_value"):
            attrs["start"] = attrs["start"] // tp
            attrs["stop"] = attrs["stop"] // tp
        nop = Op(op.name, op.kind, op.inputs, op.outputs, op.group, attrs)
        (shape,) = infer_shapes(nop, [out_t[i].shape for i in op.inputs])
        o = graph.tensors[op.outputs[0]]
        out_t[o.name] = Tensor(o.name, shape, o.dtype, o.kind)
        new_ops.append(nop)
    params = dict(graph.params, tp=tp)
    g = Graph(graph.name, out_t.values(), new_ops, sequences=graph.sequences, params=params)
    return g, fwd, bwd
