"""Post-training quantisation to int8 (the seed's ``wia_quantize_model``, section 8.7).

:func:`quantize_model` takes a float graph, its weights (or the seeded ones functional
mode draws) and calibration batches, and returns a :class:`QuantizedGraph`: a
:class:`~wia_hw.graph.Graph` whose ``linear`` and ``matmul`` ops with a weight operand
run int8 on the array, plus the values to run it with (``weights``).

Per quantised op ``y = x @ W (+ b)`` (``W`` is ``[K, N]``):

* **Weights**, symmetric: ``s_w[n] = max_k |W[k, n]| / 127`` per output channel
  (``per_channel=True``) or one ``s_w = max |W| / 127``, raised (with a warning) where
  the bias would not fit the int32 accumulator (below);
  ``W_q = clip(rint(W / s_w), -127, 127)`` (int8).
* **Activations**, symmetric per tensor: ``s_x = T / 127`` with the threshold ``T``
  calibrated on the data (:class:`CalibrationMethod`): ``minmax`` (``T = max |x|``),
  ``percentile`` (the ``percentile``-th percentile of ``|x|``), ``mse`` (the ``T`` of
  128 candidates that minimises the mean squared quantisation error over the
  histogram of ``|x|``), ``entropy`` (TensorRT's KL-divergence calibration as NVIDIA's
  pytorch-quantization implements it: 2048-bin histogram, the threshold whose 128-level
  quantised distribution is nearest in KL, the zero bin counted as its neighbour).
  Histograms have ``HIST_BINS`` bins over ``[0, max |x|]``; stats use at most
  ``calibration_batches`` batches.
* Each quantised activation is quantised once, ``x_q = clip(rint(x / s_x), -127,
  127)``: by its producer, which then writes int8 itself (``attrs["quant"]
  ["output_scale"]``), when that is an elementwise, softmax or layer-norm op whose
  output only quantised ops read (the output conversion of a pass, no extra pass);
  else by a ``cast`` op ``{x}.quantize`` read by every quantised op on ``x``. The
  op reads ``x_q``, ``{op}.weight_q`` (int8) and ``{op}.bias_q`` (int32,
  ``rint(b / (s_x s_w))``), accumulates in int32 (bit-exact with the RTL's int8 golden
  model, over the device's tiles) and its epilogue writes
  ``acc * s_x * s_w[n]`` in the op's original output dtype. The accumulator cannot
  wrap: codes are within 127, so ``|acc| <= K 127^2 + |b_q|``, and ``s_w`` is raised
  where needed to keep ``|b_q| <= 2^31 - 1 - K 127^2`` (as ONNX Runtime's quantiser
  does; it binds only for weights tiny next to their bias, such as a pruned neuron).

A graph made by :func:`~wia_hw.apply_fusion` is fused again after the rewrite, with
the same config (a GEMM -> GELU epilogue then writes int8). The graph keeps the
source's declared outputs (an ONNX model's), which stay float: a declared output that
a quantised op reads is quantised by a ``cast``, never by its producer.

Scales are in each op's ``attrs["quant"]`` (``input_scale``, ``weight_scale``: a float
or one per output channel). Timing mode needs only the graph; functional mode
(``wia_hw.run(q, mode="functional")``, and :mod:`wia_hw.accuracy`, which runs
:class:`QuantExecutor`, the same executor) honours the static scales and loads the
graph's ``weights`` (its ``weight_values``). ``params["precision"]`` is ``"int8"`` only
when every GEMM-class op became int8; otherwise (a CNN's convolutions, attention's
``bmm``) it is left out, a run reports its dominant GEMM precision, and
:func:`quantize_model` warns with the share of GEMM MACs left float.

Errors (one line each): a config field out of range or unknown, or a ``seed`` that is
not a non-negative integer (``ValueError``; numpy integers and bools count as the
Python ones), a given weight that is not an array of real numbers (named), calibration
data of the wrong shape or kind (integers for an integer input such as token ids, real
numbers for a float one) or naming an unknown input, no calibration batch, a weight or
bias of an op to quantise holding NaN or inf (named, with the index of the
first), an op whose K int8 products could overflow int32 on their own (K > 133,144), a
graph with nothing to quantise (:class:`~wia_hw.WorkloadError`).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._functional import FunctionalExecutor
from ..emulator.enums import StrNamedEnum
from ..emulator.errors import WorkloadError
from ..graph import FLOAT_DTYPES, Graph, Op, Tensor, op_macs
from ._fusion import refuse

__all__ = [
    "QuantMode",
    "Precision",
    "CalibrationMethod",
    "QuantizationConfig",
    "QuantizedGraph",
    "QuantExecutor",
    "quantize_model",
    "calibrate_threshold",
    "HIST_BINS",
    "QMAX",
]

#: Bins of the calibration histograms of |x|.
HIST_BINS = 2048
#: Largest int8 code of the symmetric quantiser (-127..127; -128 is not used).
QMAX = 127
#: Largest int32 value: the accumulator (and so the bias codes) must stay within it.
INT32_MAX = 2**31 - 1
#: Producers that quantise their own output instead of a separate cast (their output
#: conversion writes int8; no extra pass).
_FOLDABLE = ("gelu", "relu", "tanh", "sigmoid", "softmax", "layer_norm", "add", "sub", "mul")


class QuantMode(StrNamedEnum):
    """The seed's ``WIA_QUANT_MODE_*``: post-training quantisation (PTQ) is what runs;
    quantisation-aware training is not implemented (refused with a one-line error)."""

    PTQ = "ptq"
    QAT = "qat"


class Precision(StrNamedEnum):
    """The seed's precisions (``WIA_INT8``, ...)."""

    INT8 = "int8"
    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"


class CalibrationMethod(StrNamedEnum):
    """How an activation's threshold ``T`` is chosen (module docstring)."""

    MINMAX = "minmax"
    PERCENTILE = "percentile"
    MSE = "mse"
    ENTROPY = "entropy"


def _enum(cls: Any, field_name: str, value: Any) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise ValueError(
            f"QuantizationConfig.{field_name} must be one of "
            f"{', '.join(m.value for m in cls)}, got {value!r}"
        ) from None


@dataclass(frozen=True, kw_only=True)
class QuantizationConfig:
    """The seed's ``wia_quantization_config_t`` plus the calibration ``method``,
    ``per_channel`` weight scales and the ``percentile`` of that method."""

    mode: QuantMode | str = QuantMode.PTQ
    weight_precision: Precision | str = Precision.INT8
    activation_precision: Precision | str = Precision.INT8
    calibration_batches: int = 100
    method: CalibrationMethod | str = CalibrationMethod.MINMAX
    per_channel: bool = True
    percentile: float = 99.99

    def __post_init__(self) -> None:
        for name, cls in (
            ("mode", QuantMode),
            ("weight_precision", Precision),
            ("activation_precision", Precision),
            ("method", CalibrationMethod),
        ):
            object.__setattr__(self, name, _enum(cls, name, getattr(self, name)))
        if self.mode is not QuantMode.PTQ:
            raise ValueError(
                f"QuantizationConfig.mode: only ptq is implemented, got {self.mode.value!r}"
            )
        for name in ("weight_precision", "activation_precision"):
            if getattr(self, name) is not Precision.INT8:
                raise ValueError(
                    f"QuantizationConfig.{name}: quantize_model targets int8, "
                    f"got {getattr(self, name).value!r}"
                )
        # numpy scalars (np.int64, np.bool_, np.float32) are accepted as the Python
        # values they hold, as AutotuneConfig accepts them
        b = self.calibration_batches
        if not _is_int(b) or b < 1:
            raise ValueError(
                f"QuantizationConfig.calibration_batches must be a positive integer, got {b!r}"
            )
        object.__setattr__(self, "calibration_batches", int(b))
        if not isinstance(self.per_channel, (bool, np.bool_)):
            raise ValueError(
                f"QuantizationConfig.per_channel must be a bool, got {self.per_channel!r}"
            )
        object.__setattr__(self, "per_channel", bool(self.per_channel))
        p = self.percentile
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real) or not 50 < p <= 100:
            raise ValueError(f"QuantizationConfig.percentile must be in (50, 100], got {p!r}")
        object.__setattr__(self, "percentile", float(p))


def _is_int(v: Any) -> bool:
    """An integer (a numpy one too) that is not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


class QuantizedGraph(Graph):
    """A :class:`Graph` with int8 linear/matmul ops and what runs them: ``weights``
    (every weight tensor's value: int8 ``weight_q``, int32 ``bias_q`` and the float
    weights of the other ops), ``float_weights`` (the float weights it was made from:
    the reference), ``thresholds`` (the calibrated ``T`` of each quantised activation)
    and the ``config`` used. ``weight_values`` returns ``weights`` (so functional mode
    runs the codes without being given them); the declared outputs, static parameters
    (``Graph.quant``) and weight sources of the source graph carry over."""

    weights: dict[str, np.ndarray]
    float_weights: dict[str, np.ndarray]
    thresholds: dict[str, float]
    config: QuantizationConfig

    def carried_to(self, graph: Graph) -> QuantizedGraph:
        """``graph`` (this graph's tensors and ops, its fusion marks changed) as a
        quantised graph with this one's codes, scales, thresholds and config
        (:func:`~wia_hw.apply_fusion` of a quantised graph)."""
        q = QuantizedGraph.of(graph, validate=False)
        q.weights, q.float_weights = dict(self.weights), dict(self.float_weights)
        q.thresholds, q.config = dict(self.thresholds), self.config
        return q

    @classmethod
    def of(cls, graph: Graph, *, validate: bool = True) -> QuantizedGraph:
        """A quantised graph of ``graph``'s tensors, ops, sequences and params (its
        data, weights and scales, set by the caller)."""
        return cls(
            graph.name,
            graph.tensors.values(),
            graph.ops,
            sequences=graph.sequences,
            params=graph.params,
            validate=validate,
        )


#: Functional execution of a quantised graph: :class:`~wia_hw._functional.FunctionalExecutor`
#: itself honours the static scales (``attrs["quant"]``: a quantising ``cast`` uses its
#: calibrated scale, a quantised GEMM's epilogue multiplies its int32 accumulator by
#: ``input_scale * weight_scale``), so ``wia_hw.run(q, mode="functional")`` and
#: :mod:`wia_hw.accuracy` compute the same values; the name is what the latter uses.
QuantExecutor = FunctionalExecutor


# -- calibration ----------------------------------------------------------------------


def _quant_error(centers: np.ndarray, counts: np.ndarray, t: float) -> float:
    s = t / QMAX
    q = np.clip(np.rint(centers / s), -QMAX, QMAX) * s
    return float(np.sum(counts * (centers - q) ** 2))


def _kl_threshold(hist: np.ndarray, edges: np.ndarray, levels: int = QMAX + 1) -> float:
    """TensorRT's entropy calibration, as NVIDIA's pytorch-quantization implements it
    (``_compute_amax_entropy``): for each candidate ``i`` bins (``levels`` to
    ``len(hist)``), the reference ``P`` is the first ``i`` bins with the outliers added to
    the last; ``Q`` merges them into ``levels`` groups, spread back uniformly over each
    group's non-empty bins; the threshold is the edge with the smallest KL(P || Q).

    As the reference does: the zero bin counts as its neighbour (``hist[0] = hist[1]``),
    since zero is exact at every threshold and a ReLU's spike of zeros would otherwise
    dominate P and pull ``T`` down to a few bins (on a ReLU output the spike is most of
    the data); a candidate whose ``Q`` is empty where ``P`` is not (outliers piled into an
    empty last bin) has infinite divergence; among equal divergences the largest ``T``
    wins (the last minimum). The last rule matters for discrete data (pixels of 17
    levels): every candidate whose groups hold at most one value each represents P
    exactly (KL 0), and the smallest such ``T`` would clip all but the lowest level."""
    n = len(hist)
    if n <= levels:
        return float(edges[-1])
    hist = hist.astype(np.float64)  # a copy: the caller's histogram is left alone
    hist[0] = hist[1]
    if not hist.any():  # only zeros besides bin 0's neighbour: nothing to trade off
        return float(edges[-1])
    best_i, best_kl = n, math.inf
    for i in range(levels, n + 1):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        nz = p > 0
        idx = np.minimum((np.arange(i) * levels) // i, levels - 1)
        sums = np.bincount(idx, weights=hist[:i], minlength=levels)
        cnt = np.bincount(idx, weights=(hist[:i] > 0).astype(np.float64), minlength=levels)
        with np.errstate(divide="ignore", invalid="ignore"):
            per = np.where(cnt > 0, sums / cnt, 0.0)
        q = np.where(hist[:i] > 0, per[idx], 0.0)
        if np.any(nz & (q == 0)):
            kl = math.inf
        else:
            ps, qs = p[nz] / p.sum(), q[nz] / q.sum()
            kl = float(np.sum(ps * np.log(ps / qs)))
        if kl <= best_kl:
            best_i, best_kl = i, kl
    return float(edges[best_i])


def calibrate_threshold(
    hist: np.ndarray, amax: float, method: CalibrationMethod | str, percentile: float = 99.99
) -> float:
    """The threshold ``T`` of one activation from its histogram of ``|x|`` (``len(hist)``
    equal bins over ``[0, amax]``); see the module docstring. ``T > 0`` always."""
    m = CalibrationMethod(method)
    if amax <= 0 or not hist.sum():
        return 1.0
    edges = np.linspace(0.0, amax, len(hist) + 1)
    if m is CalibrationMethod.MINMAX:
        t = amax
    elif m is CalibrationMethod.PERCENTILE:
        cdf = np.cumsum(hist) / hist.sum()
        t = float(edges[min(len(hist), int(np.searchsorted(cdf, percentile / 100.0)) + 1)])
    elif m is CalibrationMethod.MSE:
        centers = (edges[:-1] + edges[1:]) / 2
        cands = edges[np.unique(np.linspace(len(hist) // 16, len(hist), 128).astype(int))]
        t = float(min(cands, key=lambda c: _quant_error(centers, hist, float(c))))
    else:
        t = _kl_threshold(hist, edges)
    return t if t > 0 else amax


def _quant_targets(graph: Graph) -> list[Op]:
    t = graph.tensors
    return [
        op
        for op in graph.ops
        if op.kind in ("linear", "matmul")
        and t[op.inputs[1]].kind == "weight"
        and t[op.inputs[1]].dtype in FLOAT_DTYPES
        and t[op.inputs[0]].dtype in FLOAT_DTYPES
        and "quant" not in op.attrs
    ]


def _wanted_kind(dtype: str) -> tuple[str, str]:
    """The numpy dtype kinds calibration data for a graph input of ``dtype`` may have,
    and how to say so: integers for an integer input (token ids), real numbers (not
    complex) for a float one."""
    if dtype in FLOAT_DTYPES:
        return "iuf", "real numbers (integer or float, not complex)"
    if dtype == "bool":
        return "biu", "booleans or integers"
    return "iu", "integers (such as token ids)"


def _batches(graph: Graph, data: Any, limit: int) -> list[dict[str, np.ndarray]]:
    inputs = {n: t for n, t in graph.tensors.items() if t.kind == "input"}
    if data is None:
        raise WorkloadError(
            "quantize_model: calibration_data is required for PTQ (an "
            "iterable of {input name: array} batches, or arrays when the "
            "graph has one input)"
        )
    if isinstance(data, Mapping) or isinstance(data, np.ndarray):
        data = [data]
    out = []
    for i, b in enumerate(data):
        if i >= limit:
            break
        if not isinstance(b, Mapping):
            if len(inputs) != 1:
                raise WorkloadError(
                    f"calibration batch {i}: a bare array, but graph "
                    f"{graph.name!r} has inputs {sorted(inputs)}; give a "
                    "{name: array} mapping"
                )
            b = {next(iter(inputs)): b}
        unknown = set(b) - set(inputs)
        if unknown:
            raise WorkloadError(
                f"calibration batch {i}: {sorted(unknown)} are not inputs of "
                f"{graph.name!r} (inputs: {sorted(inputs)})"
            )
        missing = set(inputs) - set(b)
        if missing:
            raise WorkloadError(f"calibration batch {i}: inputs {sorted(missing)} missing")
        for n, v in b.items():
            if tuple(np.shape(v)) != inputs[n].shape:
                raise WorkloadError(
                    f"calibration batch {i}: input {n!r} has shape "
                    f"{list(np.shape(v))}, the graph needs "
                    f"{list(inputs[n].shape)}"
                )
            v = np.asarray(v)
            need = _wanted_kind(inputs[n].dtype)
            if v.dtype.kind not in need[0]:
                raise WorkloadError(
                    f"calibration batch {i}: input {n!r} has dtype {v.dtype}, the graph's "
                    f"{inputs[n].dtype} input needs {need[1]}"
                )
            if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
                raise WorkloadError(
                    f"calibration batch {i}: input {n!r} has non-finite values "
                    f"({int(np.sum(~np.isfinite(v)))} NaN or inf of {v.size})"
                )
        out.append({n: np.asarray(v) for n, v in b.items()})
    if not out:
        raise WorkloadError("quantize_model: calibration_data holds no batch")
    return out


def _check_weights(weights: Any) -> None:
    """Refuse ``weights`` that is not a mapping, or one of whose values is not an array
    of numbers (strings, a ragged list), naming the tensor: numpy's own message would
    not say which."""
    if weights is None:
        return
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"quantize_model: weights must be a {{name: array}} mapping, got "
            f"{type(weights).__name__}"
        )
    for name, v in weights.items():
        try:
            kind = np.asarray(v).dtype
        except (TypeError, ValueError):
            kind = None  # ragged nesting
        if kind is None or kind.kind not in "biuf":
            got = "a ragged sequence" if kind is None else f"dtype {kind}"
            raise WorkloadError(
                f"quantize_model: weight {name!r} must be an array of real numbers, got {got}"
            )


def _check_finite(targets: list[Op], ws: Mapping[str, np.ndarray]) -> None:
    """Refuse a non-finite weight or bias of an op to quantise: its scale (``max |W|``)
    and codes would be meaningless, and the int8 graph would compute finite, wrong
    numbers where the float one gives NaN or inf."""
    for op in targets:
        for name in op.inputs[1:]:
            v = np.asarray(ws[name])
            bad = ~np.isfinite(v)
            if bad.any():
                at = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), v.shape))
                raise WorkloadError(
                    f"quantize_model: {name!r} (op {op.name!r}) has non-finite values "
                    f"({int(bad.sum())} NaN or inf of {v.size}; the first, at index "
                    f"{list(at)}, is {v[at]})"
                )


def _reference_values(
    graph: Graph,
    weights: Mapping[str, np.ndarray] | None,
    seed: int,
    batch: Mapping[str, np.ndarray],
    want: set[str],
    check: list[Op] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The float run of one batch (device-free GEMMs): values of ``want`` and every
    weight. The weights and biases of the ``check`` ops are checked finite first."""
    fx = FunctionalExecutor(graph, seed, {**(weights or {}), **batch})
    if check:
        _check_finite(check, fx.values)
    got = {}
    for op in graph.ops:
        fx.step(op)
        for o in op.outputs:
            if o in want:
                got[o] = np.asarray(fx.values[o], dtype=np.float32)
    ws = {n: fx.values[n] for n, t in graph.tensors.items() if t.kind == "weight"}
    got.update({n: np.asarray(fx.values[n], np.float32) for n in want if n in batch})
    return got, ws


def quantize_model(
    graph: Graph,
    config: QuantizationConfig,
    calibration_data: Iterable[Any] | Mapping[str, Any] | np.ndarray | None,
    *,
    weights: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    calibration_graph: Graph | None = None,
) -> QuantizedGraph:
    """PTQ of ``graph`` (module docstring). ``calibration_data``: batches, each a
    ``{input name: array}`` mapping (or an array when the graph has one input) shaped
    as the graph's inputs; the first ``config.calibration_batches`` are used.
    ``weights``: the float weights (missing ones are drawn as functional mode draws
    them with ``seed``; give every input in each batch so the draws do not depend on
    the batch shape). ``calibration_graph``: calibrate on this graph instead, the same
    model at another batch or sequence length (same weight and activation names, e.g.
    a smaller build for a graph too large for functional mode); the scales carry over
    by tensor name. Raises as the module docstring says."""
    if not isinstance(graph, Graph):
        raise TypeError(f"quantize_model takes a Graph, got {type(graph).__name__}")
    if not isinstance(config, QuantizationConfig):
        raise TypeError(f"config must be a QuantizationConfig, got {type(config).__name__}")
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"quantize_model: seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    _check_weights(weights)
    targets = _quant_targets(graph)
    if not targets:
        raise WorkloadError(
            f"quantize_model: graph {graph.name!r} has no float linear or "
            "matmul op with a weight operand to quantise"
        )
    cal = graph if calibration_graph is None else calibration_graph
    if not isinstance(cal, Graph):
        raise TypeError(f"calibration_graph must be a Graph, got {type(cal).__name__}")
    for op in targets:
        for i, name in enumerate(op.inputs):
            t = cal.tensors.get(name)
            if t is None or (i > 0 and t.shape != graph.tensors[name].shape):
                raise WorkloadError(
                    f"quantize_model: calibration_graph {cal.name!r} has no "
                    f"tensor {name!r} shaped like graph {graph.name!r}'s "
                    f"{list(graph.tensors[name].shape)} (op {op.name!r})"
                )
    graph_for_data, graph = graph, cal
    batches = _batches(graph, calibration_data, config.calibration_batches)
    acts = list(dict.fromkeys(op.inputs[0] for op in targets))
    amax = dict.fromkeys(acts, 0.0)
    runs = []
    ws: dict[str, np.ndarray] = {}
    for i, b in enumerate(batches):  # pass 1: ranges (values kept for the histograms)
        vals, ws = _reference_values(
            graph, weights, seed, b, set(acts), targets if i == 0 else None
        )
        runs.append(vals)
        for a in acts:
            if not np.all(np.isfinite(vals[a])):
                raise WorkloadError(
                    f"calibration batch {i}: activation {a!r} has non-finite values "
                    "(the float model overflows on this batch)"
                )
            amax[a] = max(amax[a], float(np.max(np.abs(vals[a]))) if vals[a].size else 0.0)
    thresholds = {}
    for a in acts:  # pass 2: histograms of |x| over [0, amax]
        hist = np.zeros(HIST_BINS, np.int64)
        for vals in runs:
            if amax[a] > 0:
                hist += np.histogram(np.abs(vals[a]), bins=HIST_BINS, range=(0.0, amax[a]))[0]
        thresholds[a] = calibrate_threshold(hist, amax[a], config.method, config.percentile)
    q = _rewrite(graph_for_data, config, targets, thresholds, ws)
    left = _float_gemm_macs(q)
    if left:  # said once here, not by every rewrite (a server re-shapes the graph)
        total = sum(left.values()) + sum(
            op_macs(o, q.shapes_of(o)[0])
            for o in q.ops
            if "weight_scale" in o.attrs.get("quant", {})
        )
        warnings.warn(
            f"quantize_model: {_share(sum(left.values()) / total)} of the GEMM MACs of graph "
            f"{q.name!r} stay float ({', '.join(f'{k} {m:,}' for k, m in sorted(left.items()))}): "
            "only linear and matmul ops with a weight operand are quantised, so the graph is "
            "not labelled int8 and a run reports its dominant GEMM precision",
            stacklevel=2,
        )
    return q


def _share(f: float) -> str:
    """A share as a percentage; one below 0.1% is not printed as 0."""
    return f"{f:.1%}" if f >= 0.001 else "<0.1%"


def _float_gemm_macs(graph: Graph) -> dict[str, int]:
    """MACs of the GEMM-class ops that did not become int8, by op kind."""
    left: dict[str, int] = {}
    for op in graph.ops:
        m = op_macs(op, graph.shapes_of(op)[0])
        if m and "weight_scale" not in op.attrs.get("quant", {}):
            left[op.kind] = left.get(op.kind, 0) + m
    return left


def _weight_scale(op: Op, w: np.ndarray, b: np.ndarray | None, sx: float, per_channel: bool) -> Any:
    """``s_w`` of ``op``'s weights ``w`` (``[K, N]``): ``max |W| / 127`` per output channel
    or per tensor (1 for all-zero weights), raised where needed so that the int32
    accumulator cannot wrap. Inputs are clipped to 127 codes, so ``|acc| <= K 127^2 +
    |b_q|``; each bias code ``rint(b / (s_x s_w))`` must therefore stay within
    ``2^31 - 1 - K 127^2``, and ``s_w >= |b| / (s_x (2^31 - 1 - K 127^2))``, as ONNX
    Runtime's quantiser raises a weight scale too small for its bias. It binds only
    where the weights are tiny next to the bias (a pruned neuron, or tiny inputs): those
    channels' weights then use fewer codes, whose share of the output is as small."""
    amax_w = np.max(np.abs(w), axis=0) if per_channel else np.max(np.abs(w))
    sw = np.where(amax_w > 0, amax_w / QMAX, 1.0)
    k = w.shape[0]
    room = INT32_MAX - k * QMAX * QMAX
    if room <= 0:
        raise WorkloadError(
            f"quantize_model: op {op.name!r} sums K={k:,} int8 products, more than the "
            "int32 accumulator holds at full scale (K x 127 x 127 > 2^31 - 1)"
        )
    if b is None:
        return sw
    need = np.abs(b) / (sx * room)
    floor = need if per_channel else need.max()
    raised = np.ravel(floor > sw)
    if raised.any():
        warnings.warn(
            f"quantize_model: op {op.name!r}: the weight scale of {int(raised.sum())} of "
            f"{raised.size} output channel(s) (first: {int(np.argmax(raised))}) is raised so "
            "that the int32 bias fits the accumulator (weights tiny next to the bias); "
            "those channels' weights use fewer than 127 codes",
            stacklevel=4,
        )
    return np.maximum(sw, floor)


def _rewrite(
    graph: Graph,
    cfg: QuantizationConfig,
    targets: list[Op],
    thresholds: dict[str, float],
    ws: dict[str, np.ndarray],
) -> QuantizedGraph:
    tensors = dict(graph.tensors)
    values = dict(ws)
    tset = {op.name for op in targets}
    # activations whose producer writes int8 itself: a vector op (not a view, GEMM or
    # cast) whose output only quantised ops read, as their input x
    readers: dict[str, list[Op]] = {}
    for op in graph.ops:
        for i in dict.fromkeys(op.inputs):
            readers.setdefault(i, []).append(op)
    # a declared output (an ONNX model's) keeps its float value: it is read by the
    # caller as well as by the quantised ops, so it gets a cast instead
    declared = set(graph.declared_outputs)
    folded: dict[str, Op] = {}
    for op in graph.ops:
        x = op.outputs[0] if op.outputs else None
        rs = readers.get(x, [])
        if (
            x in thresholds
            and x not in declared
            and rs
            and op.kind in _FOLDABLE
            and all(r.name in tset and r.inputs[0] == x and x not in r.inputs[1:] for r in rs)
        ):
            folded[x] = op
    cast_for: dict[str, str] = {x: x for x in folded}
    sources = dict(graph.weight_sources)
    ops: list[Op] = []
    for op in graph.ops:
        x = op.outputs[0] if op.outputs else None
        if x in folded:  # the producer quantises its own output
            tensors[x] = Tensor(x, graph.tensors[x].shape, "int8", "activation")
            ops.append(
                Op(
                    op.name,
                    op.kind,
                    op.inputs,
                    op.outputs,
                    op.group,
                    {
                        **op.attrs,
                        "quant": {"output_scale": thresholds[x] / QMAX, "threshold": thresholds[x]},
                    },
                )
            )
            continue
        if op.name not in tset:
            ops.append(op)
            continue
        x = op.inputs[0]
        sx = thresholds[x] / QMAX
        xq = cast_for.get(x)
        if xq is None:
            xq = cast_for[x] = f"{x}.quantize"
            if xq in tensors:
                raise WorkloadError(f"quantize_model: tensor name {xq!r} is taken")
            tensors[xq] = Tensor(xq, graph.tensors[x].shape, "int8", "activation")
            ops.append(
                Op(
                    xq,
                    "cast",
                    (x,),
                    (xq,),
                    op.group,
                    {"quant": {"scale": sx, "threshold": thresholds[x]}},
                )
            )
        w = np.asarray(ws[op.inputs[1]], dtype=np.float64)
        b = np.asarray(ws[op.inputs[2]], dtype=np.float64) if len(op.inputs) == 3 else None
        sw = _weight_scale(op, w, b, sx, cfg.per_channel)
        wq = np.clip(np.rint(w / sw), -QMAX, QMAX).astype(np.int8)
        wname = f"{op.name}.weight_q"
        tensors[wname] = Tensor(wname, w.shape, "int8", "weight")
        values[wname] = wq
        sources[wname] = graph.weight_sources.get(op.inputs[1], (op.inputs[1], w.size))
        ins = [xq, wname]
        if b is not None:
            bname = f"{op.name}.bias_q"
            tensors[bname] = Tensor(bname, b.shape, "int32", "weight")
            # within int32 by construction (_weight_scale): never clipped
            values[bname] = np.rint(b / (sx * sw)).astype(np.int32)
            sources[bname] = graph.weight_sources.get(op.inputs[2], (op.inputs[2], b.size))
            ins.append(bname)
        wscale: Any = [float(v) for v in np.ravel(sw)] if cfg.per_channel else float(sw)
        ops.append(
            Op(
                op.name,
                op.kind,
                tuple(ins),
                op.outputs,
                op.group,
                {**op.attrs, "quant": {"input_scale": sx, "weight_scale": wscale}},
            )
        )
    used = {i for op in ops for i in op.inputs}
    tensors = {n: t for n, t in tensors.items() if t.kind != "weight" or n in used}
    params = {k: v for k, v in graph.params.items() if k != "precision"}
    params["quantization"] = {
        "method": cfg.method.value,
        "per_channel": cfg.per_channel,
        "ops": len(targets),
    }
    bare = Graph(graph.name, tensors.values(), ops, sequences=graph.sequences, params=params)
    # labelled int8 only when every GEMM is: otherwise a run reports its dominant GEMM
    # precision from its kernels (a CNN whose convolutions stay float is not int8)
    if not _float_gemm_macs(bare):
        bare.params["precision"] = "int8"
    bare.declared_outputs = list(graph.declared_outputs)
    bare.quant = {n: p for n, p in graph.quant.items() if n in tensors}
    bare.weight_sources = {n: s for n, s in sources.items() if n in tensors}
    # a fused graph's marks are derived again over the new ops
    plain = refuse(bare)
    qg = QuantizedGraph.of(plain)
    qg.weights = {n: v for n, v in values.items() if n in tensors}
    # functional mode (wia_hw.run) loads the same values: the codes, the int32 biases and
    # the float weights of the other ops (an ONNX model's among them)
    qg.weight_values = {n: _constant(v) for n, v in qg.weights.items()}
    qg.declared_outputs = list(plain.declared_outputs)
    qg.quant = dict(plain.quant)
    qg.weight_sources = dict(plain.weight_sources)
    qg.float_weights = dict(ws)
    qg.thresholds = thresholds
    qg.config = cfg
    return qg


def _constant(value: np.ndarray) -> Any:
    """A ``Graph.weight_values`` entry that returns ``value``."""
    return lambda: value
