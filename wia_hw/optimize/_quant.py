"""Post-training quantisation to int8 (the seed's ``wia_quantize_model``, section 8.7).

:func:`quantize_model` takes a float graph, its weights (or the seeded ones functional
mode draws) and calibration batches, and returns a :class:`QuantizedGraph`: a
:class:`~wia_hw.graph.Graph` whose ``linear`` and ``matmul`` ops with a weight operand
run int8 on the array, plus the values to run it with (``weights``).

Per quantised op ``y = x @ W (+ b)`` (``W`` is ``[K, N]``):

* **Weights**, symmetric: ``s_w[n] = max_k |W[k, n]| / 127`` per output channel
  (``per_channel=True``) or one ``s_w = max |W| / 127``;
  ``W_q = clip(rint(W / s_w), -127, 127)`` (int8).
* **Activations**, symmetric per tensor: ``s_x = T / 127`` with the threshold ``T``
  calibrated on the data (:class:`CalibrationMethod`): ``minmax`` (``T = max |x|``),
  ``percentile`` (the ``percentile``-th percentile of ``|x|``), ``mse`` (the ``T`` of
  128 candidates that minimises the mean squared quantisation error over the
  histogram of ``|x|``), ``entropy`` (TensorRT's KL-divergence calibration: 2048-bin
  histogram, the threshold whose 128-level quantised distribution is nearest in KL).
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
  ``acc * s_x * s_w[n]`` in the op's original output dtype.

A graph made by :func:`~wia_hw.apply_fusion` is fused again after the rewrite, with
the same config (a GEMM -> GELU epilogue then writes int8).

Scales are in each op's ``attrs["quant"]`` (``input_scale``, ``weight_scale``: a float
or one per output channel). Timing mode needs only the graph; functional values of a
quantised graph come from :class:`QuantExecutor` (what :mod:`wia_hw.accuracy` runs),
which honours the static scales.

Errors (one line each): a config field out of range or unknown (``ValueError``),
calibration data of the wrong shape or kind (integers for an integer input such as
token ids, real numbers for a float one) or naming an unknown input, no calibration batch,
a graph with nothing to quantise (:class:`~wia_hw.WorkloadError`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._functional import FunctionalExecutor
from ..emulator.enums import StrNamedEnum
from ..emulator.errors import WorkloadError
from ..emulator.functional import cast_to, evaluate
from ..graph import FLOAT_DTYPES, Graph, Op, Tensor
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
        b = self.calibration_batches
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(
                f"QuantizationConfig.calibration_batches must be a positive integer, got {b!r}"
            )
        if not isinstance(self.per_channel, bool):
            raise ValueError(
                f"QuantizationConfig.per_channel must be a bool, got {self.per_channel!r}"
            )
        p = self.percentile
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 50 < p <= 100:
            raise ValueError(f"QuantizationConfig.percentile must be in (50, 100], got {p!r}")


class QuantizedGraph(Graph):
    """A :class:`Graph` with int8 linear/matmul ops and what runs them: ``weights``
    (every weight tensor's value: int8 ``weight_q``, int32 ``bias_q`` and the float
    weights of the other ops), ``float_weights`` (the float weights it was made from:
    the reference), ``thresholds`` (the calibrated ``T`` of each quantised activation)
    and the ``config`` used."""

    weights: dict[str, np.ndarray]
    float_weights: dict[str, np.ndarray]
    thresholds: dict[str, float]
    config: QuantizationConfig


class QuantExecutor(FunctionalExecutor):
    """Functional execution that honours static int8 scales (``attrs["quant"]``): a
    quantising ``cast`` uses its calibrated scale and a quantised GEMM's epilogue
    multiplies its int32 accumulator by ``input_scale * weight_scale`` (per channel).
    Every other op runs as in :class:`~wia_hw._functional.FunctionalExecutor`; the
    int32 accumulation is the same tiled, RTL-exact int8 path."""

    def step(self, op: Op, kernels: Sequence[Any] = (), device: Any = None) -> None:
        q = op.attrs.get("quant")
        if q is None:
            super().step(op, kernels, device)
            return
        out = op.outputs[0]
        if "output_scale" in q:  # a vector op that writes int8 with a static scale
            t = self.graph.tensors[out]
            ins = [self._dequantised(i) for i in op.inputs]
            y = evaluate(op.kind, op.attrs, ins, t.shape, "fp32", None, op.name)
            s = np.float32(q["output_scale"])
            self.values[out] = np.clip(np.rint(y / s), -QMAX, QMAX).astype(np.int8)
            self.scales[out] = float(s)
            return
        if op.kind == "cast":
            s = np.float32(q["scale"])
            x = self._dequantised(op.inputs[0]).astype(np.float32)
            self.values[out] = np.clip(np.rint(x / s), -QMAX, QMAX).astype(np.int8)
            self.scales[out] = float(s)
            return
        acc = self._gemm(op, [self.values[i] for i in op.inputs], "int32", kernels, device)
        sw = np.asarray(q["weight_scale"], dtype=np.float64)
        scale = (float(q["input_scale"]) * sw).astype(np.float32)
        y = acc.astype(np.float32) * scale
        self.values[out] = cast_to(y, self.graph.tensors[out].dtype)


# -- calibration ----------------------------------------------------------------------


def _quant_error(centers: np.ndarray, counts: np.ndarray, t: float) -> float:
    s = t / QMAX
    q = np.clip(np.rint(centers / s), -QMAX, QMAX) * s
    return float(np.sum(counts * (centers - q) ** 2))


def _kl_threshold(hist: np.ndarray, edges: np.ndarray, levels: int = QMAX + 1) -> float:
    """TensorRT's entropy calibration: for each candidate ``i`` bins (``levels`` to
    ``len(hist)``), the reference ``P`` is the first ``i`` bins with the outliers added to
    the last; ``Q`` merges them into ``levels`` groups, spread back uniformly over each
    group's non-empty bins; the threshold is the edge with the smallest KL(P || Q)."""
    n = len(hist)
    if n <= levels:
        return float(edges[-1])
    best_i, best_kl = n, math.inf
    hist = hist.astype(np.float64)
    for i in range(levels, n + 1):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        nz = p > 0
        if not nz.any():
            continue
        idx = np.minimum((np.arange(i) * levels) // i, levels - 1)
        sums = np.bincount(idx, weights=hist[:i], minlength=levels)
        cnt = np.bincount(idx, weights=(hist[:i] > 0).astype(np.float64), minlength=levels)
        with np.errstate(divide="ignore", invalid="ignore"):
            per = np.where(cnt > 0, sums / cnt, 0.0)
        q = np.where(hist[:i] > 0, per[idx], 0.0)
        ps, qs = p / p.sum(), q / max(q.sum(), 1e-300)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(nz, ps * np.log(ps / np.where(qs > 0, qs, 1e-12)), 0.0)
        kl = float(terms.sum())
        if kl < best_kl:
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


def _reference_values(
    graph: Graph,
    weights: Mapping[str, np.ndarray] | None,
    seed: int,
    batch: Mapping[str, np.ndarray],
    want: set[str],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The float run of one batch (device-free GEMMs): values of ``want`` and every
    weight."""
    fx = FunctionalExecutor(graph, seed, {**(weights or {}), **batch})
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
        vals, ws = _reference_values(graph, weights, seed, b, set(acts))
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
    return _rewrite(graph_for_data, config, targets, thresholds, ws)


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
    folded: dict[str, Op] = {}
    for op in graph.ops:
        x = op.outputs[0] if op.outputs else None
        rs = readers.get(x, [])
        if (
            x in thresholds
            and rs
            and op.kind in _FOLDABLE
            and all(r.name in tset and r.inputs[0] == x and x not in r.inputs[1:] for r in rs)
        ):
            folded[x] = op
    cast_for: dict[str, str] = {x: x for x in folded}
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
        amax_w = np.max(np.abs(w), axis=0) if cfg.per_channel else np.max(np.abs(w))
        sw = np.where(amax_w > 0, amax_w / QMAX, 1.0)
        wq = np.clip(np.rint(w / sw), -QMAX, QMAX).astype(np.int8)
        wname = f"{op.name}.weight_q"
        tensors[wname] = Tensor(wname, w.shape, "int8", "weight")
        values[wname] = wq
        ins = [xq, wname]
        if len(op.inputs) == 3:
            b = np.asarray(ws[op.inputs[2]], dtype=np.float64)
            bname = f"{op.name}.bias_q"
            tensors[bname] = Tensor(bname, b.shape, "int32", "weight")
            values[bname] = np.clip(np.rint(b / (sx * sw)), -(2**31), 2**31 - 1).astype(np.int32)
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
    params = {
        **graph.params,
        "quantization": {
            "method": cfg.method.value,
            "per_channel": cfg.per_channel,
            "ops": len(targets),
        },
        "precision": "int8",
    }
    # a fused graph's marks are derived again over the new ops
    plain = refuse(
        Graph(graph.name, tensors.values(), ops, sequences=graph.sequences, params=params)
    )
    qg = QuantizedGraph(
        plain.name,
        plain.tensors.values(),
        plain.ops,
        sequences=plain.sequences,
        params=plain.params,
    )
    qg.weights = {n: v for n, v in values.items() if n in tensors}
    qg.float_weights = dict(ws)
    qg.thresholds = thresholds
    qg.config = cfg
    return qg
