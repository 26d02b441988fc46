"""Chains of graph ops: the ops a fused operation covers.

A chain matches a sequence of op-kind sets, one per position, in which each op's result
is read by the next op only (so it never needs to reach memory).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence

from ..graph import Graph, Op

__all__ = ["consumers", "match_chain", "chain_head"]

_CONSUMERS: weakref.WeakKeyDictionary[Graph, dict[str, list[Op]]] = weakref.WeakKeyDictionary()
_PRODUCERS: weakref.WeakKeyDictionary[Graph, dict[str, Op]] = weakref.WeakKeyDictionary()


def consumers(graph: Graph) -> dict[str, list[Op]]:
    """Tensor name -> the ops that read it (cached per graph)."""
    got = _CONSUMERS.get(graph)
    if got is None:
        got = {}
        for o in graph.ops:
            for i in dict.fromkeys(o.inputs):
                got.setdefault(i, []).append(o)
        _CONSUMERS[graph] = got
    return got


def _producers(graph: Graph) -> dict[str, Op]:
    got = _PRODUCERS.get(graph)
    if got is None:
        got = {t: o for o in graph.ops for t in o.outputs}
        _PRODUCERS[graph] = got
    return got


def match_chain(
    graph: Graph,
    head: Op,
    kinds: Sequence[Iterable[str]],
    accept: Callable[[list[Op]], bool] | None = None,
) -> list[Op] | None:
    """The chain of ops starting at ``head`` whose kinds match ``kinds`` (one set of
    kinds per position) in which each op's result is read by the next op only (so it
    never needs to reach memory); ``accept`` may reject a structurally matching chain.
    ``None`` when there is no such chain."""
    if head.kind not in kinds[0]:
        return None
    chain = [head]
    cons = consumers(graph)
    for want in kinds[1:]:
        out = chain[-1].outputs[0]
        readers = cons.get(out, [])
        if len(readers) != 1 or readers[0].kind not in want:
            return None
        chain.append(readers[0])
    if accept is not None and not accept(chain):
        return None
    return chain


def chain_head(
    graph: Graph,
    op: Op,
    kinds: Sequence[Iterable[str]],
    accept: Callable[[list[Op]], bool] | None = None,
) -> tuple[Op, int] | None:
    """If ``op`` is a non-first member of a chain matching ``kinds``: (head, position)."""
    prod = _producers(graph)
    for pos in range(1, len(kinds)):
        if op.kind not in kinds[pos]:
            continue
        cur = op
        ok = True
        for back in range(pos, 0, -1):  # walk back to the head
            src = [prod[i] for i in cur.inputs if i in prod and prod[i].kind in kinds[back - 1]]
            if not src:
                ok = False
                break
            cur = src[0]
        if ok:
            chain = match_chain(graph, cur, kinds, accept)
            if chain is not None and len(chain) > pos and chain[pos] is op:
                return cur, pos
    return None
