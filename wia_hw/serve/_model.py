"""The model a server runs, at any (batch, seq) shape, and its emulator timing per shape.

A builder workload is built again at each shape. A graph made from a builder workload is
rebuilt from its ``params`` (model, layers, precision) and the transformations it carries
are applied again: fusion with its recorded ``fusion_config``, int8 PTQ with its
calibrated thresholds and float weights (no new calibration: the scales carry over by
tensor name, as ``quantize_model(..., calibration_graph=...)`` does). A graph at its own
shape is used as it is.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..emulator.config import DeviceSpec
from ..emulator.errors import WorkloadError
from ..graph import Graph
from ..optimize import FusionConfig, QuantizedGraph, apply_fusion
from ..workloads import WORKLOADS, build
from ._config import ServeError

__all__ = ["ShapeTiming", "builder_kwargs", "graph_at", "model_factory"]


@dataclass(frozen=True)
class ShapeTiming:
    """One executed shape, timed by the emulator on a fresh device: ``latency_ms`` (the
    service time of a batch of this shape), ``roofline_floor_ms``, ``flops``."""

    batch: int
    seq: int | None
    latency_ms: float
    roofline_floor_ms: float
    flops: int


def _builder(model: str) -> Callable[..., Graph] | None:
    key = model.lower().replace("-", "").replace("_", "")
    return next(
        (f for k, f in WORKLOADS.items() if k.lower().replace("-", "").replace("_", "") == key),
        None,
    )


def _float_precision(q: QuantizedGraph) -> str:
    """The dtype a quantised graph's GEMM epilogues write: the float model's precision."""
    for op in q.ops:
        if "weight_scale" in op.attrs.get("quant", {}):
            return str(q.tensors[op.outputs[0]].dtype)
    return "fp16"


def builder_kwargs(params: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """The recorded ``params`` of a built graph that its builder takes again (``names``):
    a prefill's recorded ``kv_len=0`` (no cached tokens) is left out, as the builder
    refuses ``kv_len`` with ``phase='prefill'``."""
    kw = {k: v for k, v in params.items() if k in names}
    if kw.get("phase") == "prefill":
        kw.pop("kv_len", None)
    return kw


def graph_at(graph: Graph, batch: int, seq: int | None) -> Graph:
    """``graph`` at ``batch`` sequences of ``seq`` tokens (``seq`` ignored for a model
    without one). Raises :class:`ServeError` when the graph was not made from a builder
    workload (give :func:`create_inference_server` a callable ``(batch, seq) -> Graph``)."""
    p = graph.params
    if p.get("batch") == batch and ("seq" not in p or seq is None or p.get("seq") == seq):
        return graph
    onnx_file = _onnx_source(graph)
    if onnx_file is not None:
        return _onnx_at(graph, onnx_file, batch, seq)
    fn = _builder(str(p.get("model", "")))
    if fn is None:
        raise ServeError(
            f"graph {graph.name!r} was not built by a workload builder (params.model "
            f"{p.get('model')!r}), so it cannot be re-shaped to batch {batch}; pass a "
            "workload name or a callable (batch, seq) -> Graph"
        )
    names = set(inspect.signature(fn).parameters)
    kw = builder_kwargs(p, names)
    kw["batch"] = batch
    if "seq" in names and seq is not None:
        kw["seq"] = seq
    if isinstance(graph, QuantizedGraph):
        kw["precision"] = _float_precision(graph)
    g = fn(**kw)
    if "fusion_config" in p:
        g = apply_fusion(g, FusionConfig(**p["fusion_config"]))
    if isinstance(graph, QuantizedGraph):
        from ..optimize._quant import _quant_targets, _rewrite

        g = _rewrite(g, graph.config, _quant_targets(g), graph.thresholds, graph.float_weights)
    return g


def _onnx_source(graph: Graph) -> Path | None:
    """The .onnx file ``graph`` was imported from, when it is still there."""
    src = graph.params.get("source")
    if isinstance(src, str) and src.endswith(".onnx") and Path(src).is_file():
        return Path(src)
    return None


def _onnx_at(graph: Graph, path: Path, batch: int, seq: int | None) -> Graph:
    """``graph`` (imported from ``path``) imported again at ``batch`` (and ``seq`` where
    the model has a sequence dim, under any of its names): its symbolic dims take the
    new values."""
    from ..workloads import from_onnx
    from ..workloads._onnx import SEQ_DIMS

    dims = dict(graph.params.get("dims") or {})  # the dims the model used
    if "batch" in dims or not dims:
        dims["batch"] = batch
    for name in SEQ_DIMS if seq is not None else ():
        if name in dims:
            dims[name] = seq
    try:
        g = from_onnx(path, batch=batch, dims=dims)
    except WorkloadError as e:  # the file fixes its batch, among others
        raise ServeError(f"{path.name}: {e}") from None
    fixed = [t for t in g.tensors.values() if t.kind == "input" and t.shape[:1] != (batch,)]
    if fixed:
        raise ServeError(
            f"{path.name}: input {fixed[0].name!r} has a fixed leading dim "
            f"{fixed[0].shape[0]}, so the model cannot run batches of {batch}; export it with "
            "a symbolic batch dim (dynamic_axes, or torch.export's Dim)"
        )
    return g


def model_factory(
    model: str | Graph | Callable[[int, int | None], Graph], **workload_kwargs: Any
) -> tuple[Callable[[int, int | None], Graph], Graph]:
    """``(factory, reference graph)``: ``factory(batch, seq)`` gives the graph to run for
    one executed shape; the reference graph is the model as given (its ``seq`` is the
    longest a request may have)."""
    if isinstance(model, Graph):
        return (lambda b, s: graph_at(model, b, s)), model
    if isinstance(model, str):
        if model.endswith(".onnx") and workload_kwargs.get("batch") is None:
            workload_kwargs = {**workload_kwargs, "batch": 1}  # re-imported per batch size
        ref = build(model, **workload_kwargs)
        return (lambda b, s: graph_at(ref, b, s)), ref
    if callable(model):
        ref = model(1, workload_kwargs.get("seq"))
        if not isinstance(ref, Graph):
            raise ServeError(f"the model callable must return a Graph, got {type(ref).__name__}")
        return model, ref
    raise ServeError(
        "create_inference_server takes a workload name, a Graph, a callable "
        f"(batch, seq) -> Graph or an AutotuneResult, got {type(model).__name__}"
    )


def time_shape(
    graph: Graph,
    spec: DeviceSpec,
    seed: int,
    schedules: Mapping[str, Any] | None = None,
    extensions: Sequence[Any] = (),
) -> ShapeTiming:
    """Time ``graph`` on a fresh device of ``spec`` (timing mode) with ``extensions``
    registered (device extensions, in order), with tuned GEMM ``schedules`` by kernel
    key (those of other shapes do not apply)."""
    from ..optimize import ScheduleUnusedWarning
    from ..registry import register_device_extension
    from ..runtime import open_device

    ctx = open_device(spec, seed=seed)
    for ext in extensions:
        register_device_extension(ctx, ext)
    kw = {"schedules": dict(schedules)} if schedules else {}
    with warnings.catch_warnings():  # a server's shapes other than the tuned one's
        warnings.simplefilter("ignore", ScheduleUnusedWarning)
        r = ctx.run(graph, **kw)
    return ShapeTiming(
        int(graph.params.get("batch", graph.sequences)),
        graph.params.get("seq"),
        r.latency_ms,
        r.roofline_floor_ms,
        r.flops,
    )
