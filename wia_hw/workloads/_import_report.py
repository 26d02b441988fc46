"""What ``wia-hw import MODEL`` reports: an ONNX model's ops, MACs, parameters, bytes.

:func:`import_report` imports a model and returns an :class:`ImportReport` (data);
:func:`format_report` turns one into the text the command prints. A model with
unsupported ops does not raise here: the report lists every such op type with its
node count (``unsupported``), and the command exits 2 with
:func:`~wia_hw.workloads._onnx.unsupported_message` as its one error line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..emulator.errors import WorkloadError
from ..graph import GEMM_KINDS, Graph

__all__ = ["ImportReport", "import_report", "format_report"]


@dataclass(frozen=True, kw_only=True)
class ImportReport:
    """One import. ``ops_by_kind`` maps each op kind to (ops, FLOPs, MACs);
    ``parameters`` counts weight elements (each of the model's weights once, however
    many layouts of it the import holds: ``Graph.parameters``); ``weight_bytes``, ``input_bytes`` and
    ``activation_bytes`` are the bytes of the weights, the graph inputs and every
    value an op writes; ``folded_nodes`` and ``dead_nodes`` count the ONNX nodes
    folded as constants and those removed because no graph output depends on them
    (both within ``onnx_nodes``); ``unsupported`` maps each unmapped ONNX op type to its node
    count (then ``graph`` is None and the figures are 0); ``import_s`` is the wall
    time of the import."""

    source: str
    model: str
    onnx_nodes: int
    folded_nodes: int
    dead_nodes: int = 0
    unsupported: Mapping[str, int] = field(default_factory=dict)
    ops_by_kind: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    flops: int = 0
    macs: int = 0
    parameters: int = 0
    weight_bytes: int = 0
    input_bytes: int = 0
    activation_bytes: int = 0
    import_s: float = 0.0
    graph: Graph | None = None

    @property
    def ok(self) -> bool:
        return not self.unsupported


def import_report(
    model: str | os.PathLike[str] | Any,
    *,
    batch: int | None = None,
    dims: Mapping[str, int] | None = None,
    recognise: bool = True,
) -> ImportReport:
    """Import ``model`` (as :func:`~wia_hw.workloads.from_onnx`) and summarise it.

    Unsupported op types are returned in the report, not raised; every other import
    error raises :class:`~wia_hw.WorkloadError` as ``from_onnx`` does.
    """
    from . import _onnx

    try:
        import onnx
    except ImportError:
        raise WorkloadError(_onnx._MISSING) from None
    if batch is not None:
        batch = _onnx._positive("batch", batch)
    dims = dict(dims or {})
    for k, v in dims.items():
        _onnx._positive(f"dims[{k!r}]", v)
    t0 = time.perf_counter()
    proto, gname, source, folded, info = _onnx._prepare(onnx, model, batch, dims)
    dims = info["dims"]
    dead = info["dead"]
    nodes = len(proto.graph.node) + folded + dead
    bad = _onnx.unsupported_ops(proto)
    if bad:
        return ImportReport(
            source=source,
            model=gname,
            onnx_nodes=nodes,
            folded_nodes=folded,
            dead_nodes=dead,
            unsupported=bad,
            import_s=time.perf_counter() - t0,
        )
    g = _onnx._import_prepared(
        onnx, proto, gname, source, batch, dims, folded, recognise, info=info
    )
    elapsed = time.perf_counter() - t0
    by_kind: dict[str, tuple[int, int, int]] = {}
    from ..graph import op_macs

    for op in g.ops:
        ins, outs = g.shapes_of(op)
        n, f, m = by_kind.get(op.kind, (0, 0, 0))
        by_kind[op.kind] = (n + 1, f + g.flops(op), m + op_macs(op, ins))
    return ImportReport(
        source=source,
        model=gname,
        onnx_nodes=nodes,
        folded_nodes=folded,
        dead_nodes=dead,
        ops_by_kind=dict(sorted(by_kind.items(), key=lambda kv: (-kv[1][1], kv[0]))),
        flops=g.flops(),
        macs=g.macs(),
        parameters=g.parameters,
        weight_bytes=g.weight_bytes,
        input_bytes=sum(t.nbytes for t in g.tensors.values() if t.kind == "input"),
        activation_bytes=sum(t.nbytes for t in g.tensors.values() if t.kind == "activation"),
        import_s=elapsed,
        graph=g,
    )


def _si(x: float, unit: str) -> str:
    for scale, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {p}{unit}"
    return f"{x:.0f} {unit}"


def _bytes(n: int) -> str:
    for scale, p in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.2f} {p}"
    return f"{n} B"


def format_report(r: ImportReport) -> str:
    """The text of ``wia-hw import``: header, a table of ops by kind (ops, GFLOP,
    GMAC), then MACs, parameters and bytes; for a model with unsupported ops, the list
    of every unsupported op type with its count."""
    head = (
        f"{r.model} ({r.source}): {r.onnx_nodes} ONNX nodes, {r.folded_nodes} folded "
        f"as constants, "
        + (f"{r.dead_nodes} dead (no output depends on them), " if r.dead_nodes else "")
        + f"imported in {r.import_s:.2f} s"
    )
    if r.unsupported:
        lines = [head, f"unsupported op types ({len(r.unsupported)}):"]
        lines += [f"  {k:<32} {v:>6} nodes" for k, v in r.unsupported.items()]
        return "\n".join(lines)
    lines = [head, "", f"  {'op kind':<16} {'ops':>6} {'GFLOP':>10} {'GMAC':>10}"]
    for kind, (n, f, m) in r.ops_by_kind.items():
        mac = f"{m / 1e9:>10.3f}" if kind in GEMM_KINDS else f"{'':>10}"
        lines.append(f"  {kind:<16} {n:>6} {f / 1e9:>10.3f} {mac}".rstrip())
    total_ops = sum(n for n, _, _ in r.ops_by_kind.values())
    lines.append(f"  {'total':<16} {total_ops:>6} {r.flops / 1e9:>10.3f} {r.macs / 1e9:>10.3f}")
    lines += [
        "",
        f"  MACs:        {r.macs:,} ({_si(r.macs, 'MAC')})",
        f"  FLOPs:       {r.flops:,} ({_si(r.flops, 'FLOP')})",
        f"  Parameters:  {r.parameters:,} ({_si(r.parameters, '')})".rstrip(),
        f"  Weights:     {_bytes(r.weight_bytes)}",
        f"  Inputs:      {_bytes(r.input_bytes)}",
        f"  Activations: {_bytes(r.activation_bytes)} (every value an op writes)",
    ]
    g = r.graph
    if g is not None and g.quant:  # a quantised model: how much of it runs on integers
        gemms = [op for op in g.ops if op.kind in GEMM_KINDS]
        ints = sum(all(g.tensors[i].dtype == "int8" for i in op.inputs[:2]) for op in gemms)
        lines.append(
            f"  Quantised:   {len(g.quant)} integer tensors with static scales; "
            f"{ints} of {len(gemms)} GEMMs on integer operands"
        )
    return "\n".join(lines)
