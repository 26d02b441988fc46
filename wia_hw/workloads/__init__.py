"""Workloads: graph builders for standard models, a single GEMM, and ONNX import.

Every builder returns a validated :class:`~wia_hw.graph.Graph` whose op groups are
the breakdown rows of a run report (the seed's section 8.7 table) and raises
:class:`~wia_hw.WorkloadError` with a one-line message on bad arguments.

>>> g = build("bert-large", batch=32, seq=128)
>>> g.sequences, g.params["layers"]
(32, 24)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..emulator.errors import WorkloadError
from ..graph import Graph
from ._gemm import gemm
from ._onnx import SEQ_DIMS, from_onnx
from ._resnet import resnet50
from ._torch import from_torch
from ._transformers import bert_base, bert_large, gpt2

__all__ = [
    "WORKLOADS",
    "build",
    "bert_large",
    "bert_base",
    "gpt2",
    "resnet50",
    "gemm",
    "from_onnx",
    "from_torch",
]

#: The named workloads, by their canonical (CLI) name.
WORKLOADS: dict[str, Callable[..., Graph]] = {
    "bert-large": bert_large,
    "bert-base": bert_base,
    "gpt2": gpt2,
    "resnet50": resnet50,
    "gemm": gemm,
}


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "").replace("-", "")


def build(name: str, **kwargs: Any) -> Graph:
    """The graph of workload ``name`` built with ``kwargs``.

    ``name`` is looked up in :data:`WORKLOADS` case-insensitively, ignoring ``-`` and
    ``_`` (``"BERT_large"`` is ``bert-large``, ``"resnet-50"`` is ``resnet50``); a name ending in ``.onnx`` is
    imported with :func:`from_onnx` (``seq`` fixes its symbolic dim named ``seq``,
    ``sequence_length`` or another of :data:`~wia_hw.workloads._onnx.SEQ_DIMS`; a model
    without one refuses it, as a builder refuses an argument it does not take). An
    unknown name, or an argument the builder does not take, raises
    :class:`~wia_hw.WorkloadError` listing what is known.
    """
    if not isinstance(name, str) or not name.strip():
        raise WorkloadError(f"workload name must be a non-empty string, got {name!r}")
    seq = None
    if name.lower().endswith(".onnx"):
        fn: Callable[..., Graph] = from_onnx
        seq = kwargs.pop("seq", None)
        if seq is not None:  # the exporters' sequence dim, under its usual names
            kwargs["dims"] = {**dict.fromkeys(SEQ_DIMS, seq), **(kwargs.get("dims") or {})}
    else:
        key = _norm(name)
        fn = next((f for k, f in WORKLOADS.items() if _norm(k) == key), None)  # type: ignore[assignment]
        if fn is None:
            raise WorkloadError(
                f"unknown workload {name!r} (known: {', '.join(WORKLOADS)}, "
                "or a path to an .onnx file or a SCALE-Sim topology .csv)"
            )
    try:
        inspect.signature(fn).bind(*(() if fn is not from_onnx else (name,)), **kwargs)
    except TypeError as e:
        params = [p for p in inspect.signature(fn).parameters if p != "model"]
        raise WorkloadError(f"workload {name!r}: {e} (takes {', '.join(params)})") from None
    if fn is not from_onnx:
        return fn(**kwargs)
    g = from_onnx(name, **kwargs)
    if seq is not None and not set(SEQ_DIMS) & set(g.params["dims"]):
        # as a builder refuses a seq it does not take: the run would not be at that length
        raise WorkloadError(
            f"workload {name!r}: seq {seq} given, but no input has a symbolic sequence dim "
            f"(named {', '.join(SEQ_DIMS[:-1])} or {SEQ_DIMS[-1]})"
        )
    return g
