"""Argument checks and small graph helpers shared by the workload builders."""

from __future__ import annotations

from numbers import Integral

from ..emulator.errors import WorkloadError
from ..graph import GraphBuilder

#: Precisions a builder accepts.
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


def check_int(workload: str, arg: str, value: object, lo: int = 1, hi: int | None = None) -> int:
    """``value`` as an int in ``[lo, hi]``; otherwise a one-line WorkloadError."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise WorkloadError(f"{workload}: {arg} must be an integer, got {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        want = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise WorkloadError(f"{workload}: {arg} must be {want}, got {v}")
    return v


def check_choice(workload: str, arg: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices`` (case-insensitive); else a WorkloadError."""
    v = value.lower() if isinstance(value, str) else value
    if v not in choices:
        raise WorkloadError(f"{workload}: {arg} must be one of {', '.join(choices)}, got {value!r}")
    return v  # type: ignore[return-value]


def precision_dtypes(workload: str, precision: object) -> tuple[str, str]:
    """(GEMM dtype, float dtype) of a precision.

    ``int8`` runs the GEMMs (activations and weights) in int8 and everything else
    (softmax, layer norm, GELU, residual adds, embeddings) in fp16; the float
    precisions run everything in themselves.
    """
    p = check_choice(workload, "precision", precision, PRECISIONS)
    return (p, "fp16") if p == "int8" else (p, p)


def linear(
    b: GraphBuilder,
    name: str,
    x: str,
    n_out: int,
    *,
    out_dtype: str,
    bias: bool = True,
    group: str | None = None,
) -> str:
    """``x @ W (+ bias)`` with W in x's dtype and the output in ``out_dtype``.

    For int8 inputs the bias is int32 (added to the int32 accumulator before the
    epilogue requantises or dequantises to ``out_dtype``).
    """
    xd = b.tensor(x).dtype
    w = b.weight(f"{name}.weight", (b.shape(x)[-1], n_out), xd)
    ins = [x, w]
    if bias:
        ins.append(b.weight(f"{name}.bias", (n_out,), "int32" if xd == "int8" else xd))
    return b.op("linear", name, ins, group=group, dtype=out_dtype)


def layer_norm(b: GraphBuilder, name: str, x: str, *, group: str | None = None) -> str:
    """Layer norm over the last dim with its own gamma and beta (in x's dtype)."""
    h = b.shape(x)[-1]
    dt = b.tensor(x).dtype
    return b.op(
        "layer_norm",
        name,
        [x, b.weight(f"{name}.gamma", (h,), dt), b.weight(f"{name}.beta", (h,), dt)],
        group=group,
    )


def to_dtype(b: GraphBuilder, name: str, x: str, dtype: str, *, group: str | None = None) -> str:
    """``x`` itself if it already is ``dtype``, else a ``cast`` op (a quantise step)."""
    if b.tensor(x).dtype == dtype:
        return x
    return b.op("cast", name, [x], group=group, dtype=dtype)
