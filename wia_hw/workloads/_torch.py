"""PyTorch import: a ``torch.nn.Module`` to a wia-hw :class:`~wia_hw.graph.Graph`.

``torch`` is an optional dependency (``pip install 'wia-hw[torch]'``: torch, onnx and
onnxscript), imported on first use.

The route is ``torch.export.export`` (the module traced at the example arguments'
shapes into an ``ExportedProgram`` of ATen ops) -> the ONNX translation of that
program (``torch.onnx.export`` of the ``ExportedProgram``, the translator that the
dynamo exporter uses) -> :func:`~wia_hw.workloads.from_onnx`. So the op table, the
folding and the pattern recognition are the ONNX importer's, and the same model gives
the same MACs by either route (a test checks it).

The translation runs without onnxscript's optimizer (``optimize=False``): that
optimizer merges initializers whose *values* are equal (up to 1,024 elements), then
the layers that read them as common subexpressions, and folds a transposed tied
embedding into a second initializer, so parameters, MACs and latency would change with
the weights' values (four parallel heads initialised alike became one). Timing
depends on shapes and dtypes only; the importer's own folding does the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..emulator.errors import WorkloadError
from ..graph import Graph

_MISSING = "from_torch needs PyTorch: pip install 'wia-hw[torch]'"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def from_torch(
    module: Any,
    example_args: Sequence[Any],
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    recognise: bool = True,
) -> Graph:
    """Import ``module`` (a ``torch.nn.Module``, put in eval mode) traced at
    ``example_args`` (a tuple of tensors; their shapes are the graph's shapes).

    Returns the :class:`~wia_hw.graph.Graph` that :func:`~wia_hw.workloads.from_onnx`
    gives for the module's ``torch.export`` program, named after the module's class;
    ``params["source"]`` is ``torch.export``. Weights' values are not carried. Its
    ``sequences`` (samples per run, for throughput) is the leading dim that every
    example input shares, when each has two or more dims, else 1.

    Raises :class:`~wia_hw.WorkloadError` when torch (or onnxscript) is not
    installed, ``module`` is not a ``torch.nn.Module``, ``example_args`` is not a
    tuple or list, ``torch.export`` or the ONNX translation fails (the first line of
    torch's message), or the program has ops the importer does not map (every such op
    type with its count, as ``from_onnx``, naming the module's class).
    """
    try:
        import torch
    except ImportError:
        raise WorkloadError(_MISSING) from None
    if not isinstance(module, torch.nn.Module):
        raise WorkloadError(f"from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(example_args, (tuple, list)):
        raise WorkloadError(
            f"from_torch: example_args must be a tuple of example inputs, "
            f"got {type(example_args).__name__}"
        )
    try:
        import onnxscript  # noqa: F401 - the ONNX translation needs it
    except ImportError:
        raise WorkloadError(
            "from_torch needs onnxscript (torch's ONNX translator): pip install 'wia-hw[torch]'"
        ) from None
    module = module.eval()
    name = type(module).__name__
    try:
        with torch.no_grad():
            program = torch.export.export(
                module, tuple(example_args), kwargs=dict(example_kwargs or {})
            )
    except Exception as e:  # noqa: BLE001 - torch.export raises many error types
        raise WorkloadError(
            f"from_torch: torch.export of {name} failed: {_first_line(e)}"
        ) from None
    try:
        # not optimize=True: onnxscript's optimizer merges equal-valued weights (see
        # the module text), so the graph would depend on the weights' values
        onnx_program = torch.onnx.export(program, dynamo=True, optimize=False, verbose=False)
        proto = onnx_program.model_proto
    except Exception as e:  # noqa: BLE001 - the translator raises many error types
        raise WorkloadError(
            f"from_torch: translating the torch.export program of {name} "
            f"to ONNX failed: {_first_line(e)}"
        ) from None
    proto.graph.name = name
    from ._onnx import import_model

    graph = import_model(proto, recognise=recognise, source=f"{name} (torch.export)")
    graph.params["source"] = "torch.export"
    return graph
