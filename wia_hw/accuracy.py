"""Accuracy, measured: run a graph in functional mode on labelled data and compare it
with the fp32 reference.

* :class:`GraphEvaluator` runs a graph on an emulated device in functional mode, batch
  by batch, with given weights: every op is lowered as a run lowers it (``providers``:
  the lowering policy, e.g. an extension's claims; the built-in lowering by default)
  and GEMMs lowered to the array are computed over the device's own tiles (int8 in
  wrapping int32, bit-exact with the RTL's golden model; fp16/bf16 through the PE's
  fp32-accumulating MAC). Quantised graphs (:func:`wia_hw.quantize_model`) run with
  their static scales (:class:`~wia_hw.optimize.QuantExecutor`).
* :func:`compare` gives an :class:`AccuracyReport`: accuracy against labels of both,
  agreement of their predicted classes, and for the raw outputs cosine similarity and
  max abs error against the reference.
* :func:`verify_accuracy` is the seed's ``verify_accuracy(quantized_model,
  reference_model, test_data)``: both graphs run on the same data, the accuracy lost
  as a fraction (top-1 accuracy points with labels; ``1 - cosine`` of the outputs
  without).
* Real trained models with no downloads: :func:`load_digits_split` (scikit-learn's
  bundled 8x8 digits), :func:`train_digits_mlp` (an ``MLPClassifier`` trained on it,
  seeded) and :func:`mlp_to_graph` (an MLP's weights -> ``linear`` + activation ops);
  :func:`train_digits_cnn` (a small CNN trained in numpy, convolutions as im2col
  matmuls) and :func:`cnn_to_graph` (-> ``conv2d`` + ``linear`` ops); a one-block
  transformer trained in numpy on a synthetic task (:func:`majority_task`,
  :func:`train_synthetic_transformer`, :func:`transformer_to_graph`).
* Analog and photonic execution: ``GraphEvaluator(..., unit="analog",
  unit_parameters={"policy": "all_but_first_last", "adc_bits": 6})`` routes the ops the
  policy selects to that extension (functional mode computes them through its noise
  model) and :attr:`GraphEvaluator.unit_cost` gives the routed ops' energy per MAC
  from the unit's cost model (:class:`UnitCost`).

scikit-learn is imported only by the functions that need it; when it is missing they
raise one ``ImportError`` line naming the extra to install.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._functional import nonfinite
from .emulator.config import DeviceSpec
from .emulator.device import Device
from .emulator.errors import WorkloadError
from .graph import Graph, GraphBuilder
from .lowering import Provider, lower
from .optimize._quant import QuantExecutor, QuantizedGraph
from .spec import DEFAULT_DEVICE, load_spec

__all__ = [
    "GraphEvaluator",
    "AccuracyReport",
    "UnitCost",
    "unit_providers",
    "train_digits_cnn",
    "cnn_predict",
    "cnn_to_graph",
    "majority_task",
    "train_synthetic_transformer",
    "transformer_predict",
    "transformer_to_graph",
    "compare",
    "agreement_stats",
    "verify_accuracy",
    "calibration_batches",
    "load_digits_split",
    "train_digits_mlp",
    "mlp_to_graph",
]


def _sklearn() -> Any:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise ImportError(
            "wia_hw.accuracy needs scikit-learn for its bundled data sets "
            "and models: pip install 'wia-hw[ml]' (scikit-learn)"
        ) from None
    return sklearn


class GraphEvaluator:
    """Functional runs of ``graph`` on ``device`` with ``weights`` (see the module
    docstring). The graph is lowered once; :meth:`run` computes one batch.

    ``providers``: op kind or name -> ``(extension id, lowering function)``, as
    :attr:`wia_hw.Context.providers` holds them. ``unit`` (``"analog"`` or
    ``"photonic"``) with ``unit_parameters`` (the extension's parameters, e.g. its
    ``policy``) builds them instead (:func:`unit_providers`); giving both raises
    ValueError. ``seed`` draws any weight not given, and the units' noise; ``weights``
    may hold more than the graph's (those are ignored).
    """

    def __init__(
        self,
        graph: Graph,
        weights: Mapping[str, np.ndarray] | None = None,
        *,
        device: str | DeviceSpec = DEFAULT_DEVICE,
        providers: Mapping[str, tuple[str, Provider]] | None = None,
        seed: int = 0,
        unit: str | None = None,
        unit_parameters: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphEvaluator takes a Graph, got {type(graph).__name__}")
        self.graph = graph
        self.spec = device if isinstance(device, DeviceSpec) else load_spec(device)
        if unit is not None:
            if providers:
                raise ValueError("GraphEvaluator: give providers or unit, not both")
            providers = unit_providers(unit, unit_parameters, device=self.spec)
        self.device = Device(self.spec)
        given = {**(getattr(graph, "weights", None) or {}), **(weights or {})}
        # a superset is fine (e.g. a quantised graph's float_weights for its reference)
        self.weights = {
            n: v
            for n, v in given.items()
            if n in graph.tensors and graph.tensors[n].kind == "weight"
        }
        self.seed = seed
        self.lowered = lower(graph, self.spec, dict(providers or {}))
        self.inputs = [n for n, t in graph.tensors.items() if t.kind == "input"]

    def execute(self, inputs: Mapping[str, np.ndarray] | np.ndarray) -> QuantExecutor:
        """Run one batch (a mapping, or an array when the graph has one input); the
        executor holds every tensor's value (``values``, int8 ones with ``scales``).
        Raises WorkloadError on a shape that does not fit."""
        if not isinstance(inputs, Mapping):
            if len(self.inputs) != 1:
                raise WorkloadError(
                    f"graph {self.graph.name!r} has inputs {self.inputs}; "
                    "give a {name: array} mapping"
                )
            inputs = {self.inputs[0]: inputs}
        fx = QuantExecutor(self.graph, self.seed, {**self.weights, **inputs})
        for op, kernels in self.lowered:
            fx.step(op, kernels, self.device)
        return fx

    @property
    def unit_cost(self) -> UnitCost:
        """What the ops routed to attached units (analog, photonic) cost per batch,
        from the units' cost models (their kernels' ``unit_energy_pj``)."""
        ops, macs, energy = [], 0, 0.0
        total = 0
        for op, kernels in self.lowered:
            for k in kernels:
                total += int(getattr(k, "macs", 0))
                extra = getattr(k, "extra", {})
                if "unit_energy_pj" in extra:
                    ops.append(op.name)
                    macs += int(extra["unit_macs"])
                    energy += float(extra["unit_energy_pj"])
        return UnitCost(tuple(ops), macs, total, energy)

    def run(self, inputs: Mapping[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        """The graph's outputs (float32, dequantised) for one batch (see :meth:`execute`)."""
        fx = self.execute(inputs)
        return {n: np.asarray(v, dtype=np.float32) for n, v in fx.outputs().items()}

    def predict(self, x: np.ndarray, output: str | None = None) -> np.ndarray:
        """Outputs for ``x`` (rows of samples; the graph's batch is its input's first
        dim), run batch by batch; the last batch is zero-padded and trimmed. ``output``
        names the graph output to return; it is required when the graph has several.
        Raises WorkloadError for a graph of several inputs (use :meth:`run`), samples
        of another shape, no sample, or an ``output`` missing or not the graph's."""
        if len(self.inputs) != 1:
            raise WorkloadError(
                f"predict: graph {self.graph.name!r} has inputs {self.inputs}; predict "
                "feeds one, use run() with a {name: array} mapping"
            )
        name = self.inputs[0]
        shape = self.graph.tensors[name].shape
        b = shape[0]
        x = np.asarray(x, dtype=np.float32)
        if x.ndim == 0 or tuple(x.shape[1:]) != shape[1:]:
            raise WorkloadError(
                f"predict: samples of shape {list(x.shape[1:])}, input "
                f"{name!r} needs {list(shape[1:])}"
            )
        if len(x) == 0:
            raise WorkloadError(f"predict: no sample given for input {name!r}")
        outs = []
        key = output
        for i in range(0, len(x), b):
            chunk = x[i : i + b]
            pad = np.zeros((b,) + shape[1:], np.float32)
            pad[: len(chunk)] = chunk
            got = self.run({name: pad})
            if key is None and len(got) > 1:
                raise WorkloadError(
                    f"predict: graph {self.graph.name!r} has outputs {sorted(got)}; "
                    "name one with output="
                )
            key = key if key is not None else next(iter(got))
            if key not in got:
                raise WorkloadError(
                    f"predict: output {key!r} is not one of graph {self.graph.name!r}'s "
                    f"outputs {sorted(got)}"
                )
            outs.append(got[key][: len(chunk)])
        return np.concatenate(outs)


@dataclass(frozen=True)
class UnitCost:
    """The ops a graph routes to attached units and their cost per batch:
    ``routed_macs`` of ``total_macs``, ``energy_pj`` from the units' cost models."""

    routed_ops: tuple[str, ...]
    routed_macs: int
    total_macs: int
    energy_pj: float

    @property
    def energy_per_mac_pj(self) -> float:
        """The routed ops' energy per MAC (NaN when nothing is routed)."""
        return self.energy_pj / self.routed_macs if self.routed_macs else math.nan


def unit_providers(
    unit: str,
    parameters: Mapping[str, Any] | None = None,
    *,
    device: str | DeviceSpec = DEFAULT_DEVICE,
) -> dict[str, tuple[str, Provider]]:
    """The provider table of a fresh context on ``device`` with extension ``unit``
    registered with ``parameters`` (its ``policy`` says which ops it takes). Raises
    SpecError for an unknown extension or a bad parameter."""
    from .registry import register_device_extension
    from .runtime import open_device

    ctx = open_device(device)
    register_device_extension(ctx, unit, parameters=dict(parameters or {}))
    return dict(ctx.providers)


def _outputs(where: str, out: Any, ref: Any) -> tuple[np.ndarray, np.ndarray]:
    """``out`` and ``ref`` as float64 arrays of one shape with finite values; else one
    WorkloadError line naming ``where`` and the argument."""
    arrays = []
    for arg, v in (("outputs", out), ("reference", ref)):
        try:
            a = np.asarray(v, np.float64)
        except (TypeError, ValueError):
            raise WorkloadError(
                f"{where}: {arg} must be a numeric array, got {type(v).__name__}"
            ) from None
        arrays.append(a)
    a, r = arrays
    if a.shape != r.shape:
        raise WorkloadError(
            f"{where}: outputs {list(a.shape)} and reference {list(r.shape)} differ in shape"
        )
    for arg, v in (("outputs", a), ("reference", r)):
        if (bad := nonfinite(v)) is not None:
            raise WorkloadError(f"{where}: {arg} hold {bad[0]} non-finite value(s) {bad[1]}")
    return a, r


def agreement_stats(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(cosine similarity, max abs error) of ``out`` against ``ref``, flattened.
    Raises WorkloadError when they differ in shape or hold a NaN or infinity."""
    a, r = _outputs("agreement_stats", out, ref)
    a, r = a.ravel(), r.ravel()
    den = float(np.linalg.norm(a) * np.linalg.norm(r))
    cos = float(a @ r) / den if den else (1.0 if not a.any() and not r.any() else 0.0)
    return cos, float(np.max(np.abs(a - r))) if a.size else 0.0


@dataclass(frozen=True)
class AccuracyReport:
    """One graph against the reference on the same samples. Accuracies and
    ``agreement`` (share of samples whose predicted class matches the reference's) in
    percent; ``cosine`` and ``max_abs_error`` over the raw outputs."""

    name: str
    samples: int
    accuracy: float
    reference_accuracy: float
    agreement: float
    cosine: float
    max_abs_error: float

    @property
    def accuracy_delta(self) -> float:
        """Accuracy minus the reference's, in points (negative: a loss)."""
        return self.accuracy - self.reference_accuracy


def compare(
    name: str, out: np.ndarray, ref: np.ndarray, labels: np.ndarray | None = None
) -> AccuracyReport:
    """An :class:`AccuracyReport` of ``out`` against ``ref`` (``[samples, classes]``
    logits, or any regression-like outputs when ``labels`` is None). ``labels``: one
    class id per sample (``[samples]`` integers in ``0..classes-1``). Raises one
    WorkloadError line when the outputs differ in shape, are empty or hold a NaN or
    infinity, or when labels are given and the outputs are not ``[samples, classes]``
    or the labels are not one class id per sample."""
    where = f"compare {name!r}"
    out, ref = _outputs(where, out, ref)
    if out.ndim == 0 or out.shape[0] == 0:
        raise WorkloadError(f"{where}: outputs {list(out.shape)} hold no sample")
    cos, err = agreement_stats(out, ref)
    acc = racc = agree = math.nan
    if labels is not None:
        if out.ndim != 2:
            raise WorkloadError(
                f"{where}: with labels, outputs must be [samples, classes] logits, "
                f"got {list(out.shape)}"
            )
        labels = _labels(where, labels, *out.shape)
        po, pr = out.argmax(axis=-1), ref.argmax(axis=-1)
        acc = 100.0 * float(np.mean(po == labels))
        racc = 100.0 * float(np.mean(pr == labels))
        agree = 100.0 * float(np.mean(po == pr))
    return AccuracyReport(name, int(out.shape[0]), acc, racc, agree, cos, err)


def verify_accuracy(
    model: Graph,
    reference: Graph,
    test_data: Any,
    *,
    labels: Any = None,
    output: str | None = None,
    device: str | DeviceSpec = DEFAULT_DEVICE,
    weights: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> float:
    """The seed's ``verify_accuracy(quantized_model, reference_model, test_data)``: the
    accuracy ``model`` loses against ``reference`` on ``test_data``, as a fraction (the
    seed prints ``100 *`` it as "Accuracy delta: 0.420%").

    Both graphs run in functional mode on ``device`` (:class:`GraphEvaluator`, int8
    GEMMs bit-exact with the RTL) and their outputs are compared with :func:`compare`:

    * with labels (``test_data`` an ``(inputs, labels)`` tuple, or ``labels=``; one class
      id per sample, the outputs ``[samples, classes]`` logits): the reference's top-1
      accuracy minus the model's, as a fraction of the samples (0.0042: 0.42 points
      lost); negative when the model scores higher.
    * without labels: ``1 - cosine similarity`` of the model's outputs against the
      reference's, every sample flattened together (:func:`agreement_stats`): 0 for
      outputs in the same direction, 1 for orthogonal ones. It says how far the
      outputs moved, not how much task accuracy was lost, which needs labels.

    ``test_data`` (the inputs): rows of samples for a graph of one input (run batch by
    batch, the last batch zero-padded: :meth:`GraphEvaluator.predict`), one batch as an
    ``{input name: array}`` mapping, or a list of such mappings (outputs concatenated
    along the first axis). ``output`` names the graph output compared (required when
    there are several). ``weights``: the reference's float weights; by default a
    quantised model's reference runs on the float weights it was quantised from
    (``QuantizedGraph.float_weights``), other graphs on their own or on weights drawn
    from ``seed``. A quantised model runs on its own codes; any other model on
    ``weights`` when given (a fused graph shares the reference's weight names), else on
    its own or the same draws.
    Raises one WorkloadError line when the data or the outputs do not fit.
    """
    where = "verify_accuracy"
    for arg, g in (("model", model), ("reference", reference)):
        if not isinstance(g, Graph):
            raise TypeError(f"{where}: {arg} must be a Graph, got {type(g).__name__}")
    if (
        labels is None
        and isinstance(test_data, tuple)
        and len(test_data) == 2
        and not isinstance(test_data[1], Mapping)
    ):
        test_data, labels = test_data
    ref_weights = weights
    if ref_weights is None and isinstance(model, QuantizedGraph):
        ref_weights = model.float_weights
    model_weights = None if isinstance(model, QuantizedGraph) else ref_weights
    outs = [
        _evaluated(
            GraphEvaluator(g, w, device=device, seed=seed), test_data, output, f"{where} {arg}"
        )
        for arg, g, w in (("model", model, model_weights), ("reference", reference, ref_weights))
    ]
    report = compare(where, outs[0], outs[1], labels)
    if labels is None:
        return 1.0 - report.cosine
    return (report.reference_accuracy - report.accuracy) / 100.0


def _evaluated(ev: GraphEvaluator, data: Any, output: str | None, where: str) -> np.ndarray:
    """``ev``'s output ``output`` on ``data`` (rows of samples, a mapping or a list of
    mappings, see :func:`verify_accuracy`); else one WorkloadError line."""
    if isinstance(data, Mapping):
        batches = [data]
    elif isinstance(data, (list, tuple)) and data and all(isinstance(b, Mapping) for b in data):
        batches = list(data)
    else:
        try:
            x = np.asarray(data, dtype=np.float32)
        except (TypeError, ValueError):
            raise WorkloadError(
                f"{where}: test_data must be rows of samples, an {{input: array}} mapping "
                f"or a list of them, got {type(data).__name__}"
            ) from None
        return ev.predict(x, output)
    outs = []
    for b in batches:
        got = ev.run(b)
        if output is None and len(got) > 1:
            raise WorkloadError(
                f"{where}: graph {ev.graph.name!r} has outputs {sorted(got)}; name one with output="
            )
        key = output if output is not None else next(iter(got))
        if key not in got:
            raise WorkloadError(
                f"{where}: output {key!r} is not one of graph {ev.graph.name!r}'s "
                f"outputs {sorted(got)}"
            )
        outs.append(got[key])
    return np.concatenate(outs) if len(outs) > 1 else outs[0]


def _labels(where: str, labels: Any, samples: int, classes: int) -> np.ndarray:
    """``labels`` as ``[samples]`` int64 class ids in ``0..classes-1``; else one
    WorkloadError line."""
    y = np.asarray(labels)
    if y.shape != (samples,):
        hint = " (one-hot? give argmax(axis=1))" if y.shape == (samples, classes) else ""
        raise WorkloadError(
            f"{where}: labels {list(y.shape)} must hold one class id per sample, "
            f"shape [{samples}]{hint}"
        )
    if y.dtype.kind not in "iuf":
        raise WorkloadError(f"{where}: labels must be integer class ids, got dtype {y.dtype}")
    if y.dtype.kind == "f":
        bad = ~(np.isfinite(y) & (y == np.round(y)))
        if bad.any():
            i = int(np.argmax(bad))
            raise WorkloadError(f"{where}: labels must be integer class ids, got {y[i]} at [{i}]")
    bad = (y < 0) | (y >= classes)
    if bad.any() and classes == 1:
        i = int(np.argmax(bad))
        raise WorkloadError(
            f"{where}: the outputs have one column, so every prediction is class 0, but "
            f"labels hold {y[i]:g} at [{i}]: a binary model with one logit z needs two "
            "columns, e.g. [0, z] (mlp_to_graph gives them)"
        )
    if bad.any():
        i = int(np.argmax(bad))
        raise WorkloadError(
            f"{where}: labels must be class ids 0..{classes - 1} (the outputs have "
            f"{classes} classes), got {y[i]:g} at [{i}]"
        )
    return y.astype(np.int64)


# -- bundled data and trained models --------------------------------------------------


def load_digits_split(
    test_size: float = 0.3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits (1797 8x8 images, 10 classes), pixels scaled to
    [0, 1], split stratified into ``(x_train, x_test, y_train, y_test)``."""
    _sklearn()
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return tuple(
        train_test_split(x, d.target, test_size=test_size, random_state=seed, stratify=d.target)
    )  # type: ignore[return-value]


def train_digits_mlp(
    hidden: Sequence[int] = (64, 32), seed: int = 0, max_iter: int = 200
) -> tuple[Any, tuple[np.ndarray, ...]]:
    """An ``MLPClassifier`` (ReLU, Adam, seeded) trained on the digits' training
    split; returns ``(classifier, (x_train, x_test, y_train, y_test))``."""
    _sklearn()
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    split = load_digits_split(seed=seed)
    clf = MLPClassifier(
        hidden_layer_sizes=tuple(hidden), activation="relu", max_iter=max_iter, random_state=seed
    )
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency

    # one BLAS thread: on these tiny matrices threads only contend (5-20x slower)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(split[0], split[2])
    return clf, split


_ACTS = {"relu": "relu", "tanh": "tanh", "logistic": "sigmoid", "identity": None}


def mlp_to_graph(
    model: Any, batch: int, *, dtype: str = "fp32", name: str = "mlp"
) -> tuple[Graph, dict[str, np.ndarray]]:
    """A trained MLP as a graph: ``x [batch, in]`` -> ``linear`` (+ activation) per
    layer -> ``logits``. ``model``: a fitted scikit-learn ``MLPClassifier`` (or any
    object with ``coefs_``, ``intercepts_`` and ``activation``), or a list of
    ``(W [in, out], b [out])`` pairs with ReLU between them. Returns the graph and its
    weights (name -> array). The output layer's softmax is left out (argmax is the
    same). A binary classifier (one logistic output unit, ``out_activation_`` of
    ``"logistic"``) gets two logit columns ``[0, z]``: their softmax is its
    ``predict_proba`` and their argmax its prediction (``z > 0``, ties to class 0 as
    scikit-learn's 0.5 threshold), where one column would always argmax to 0. A
    multi-label one (several logistic outputs, each its own yes/no) has no class
    logits and is refused in one line."""
    binary = False
    if hasattr(model, "coefs_"):
        layers = list(zip(model.coefs_, model.intercepts_, strict=True))
        act = getattr(model, "activation", "relu")
        if getattr(model, "out_activation_", None) == "logistic" and layers:
            outs = int(np.shape(layers[-1][0])[-1])
            if outs != 1:
                raise WorkloadError(
                    f"mlp_to_graph: a multi-label MLPClassifier ({outs} logistic outputs, "
                    "each its own yes/no) has no class logits to argmax; not supported"
                )
            binary = True
    else:
        layers, act = list(model), "relu"
    if act not in _ACTS:
        raise WorkloadError(
            f"mlp_to_graph: activation {act!r} has no graph op (known: {', '.join(_ACTS)})"
        )
    if not layers:
        raise WorkloadError("mlp_to_graph: the model has no layer")
    b = GraphBuilder(name, dtype)
    x = b.input("x", (batch, int(np.shape(layers[0][0])[0])))
    weights: dict[str, np.ndarray] = {}
    for i, (w, bias) in enumerate(layers):
        w, bias = np.asarray(w, np.float32), np.asarray(bias, np.float32)
        last = i == len(layers) - 1
        lname = "logits" if last else f"fc{i}"
        if w.shape[0] != b.shape(x)[-1] or bias.shape != (w.shape[1],):
            raise WorkloadError(
                f"mlp_to_graph: layer {i}: weight {list(w.shape)} and bias "
                f"{list(bias.shape)} do not follow {list(b.shape(x))}"
            )
        if last and binary:  # logits [0, z]: argmax 1 exactly when z > 0
            w = np.concatenate([np.zeros_like(w), w], axis=1)
            bias = np.concatenate([np.zeros_like(bias), bias])
        x = b.linear(lname, x, w.shape[1])
        weights[f"{lname}.weight"], weights[f"{lname}.bias"] = w, bias
        if not last and _ACTS[act] is not None:
            x = b.op(_ACTS[act], f"{lname}.{_ACTS[act]}", [x])
    return b.graph(sequences=batch, params={"model": name, "precision": dtype}), weights


def calibration_batches(
    x: np.ndarray, batch: int, count: int, name: str = "x"
) -> Iterable[dict[str, np.ndarray]]:
    """Up to ``count`` full batches of ``x`` (rows) as ``{name: array}`` mappings."""
    for i in range(min(count, len(x) // batch)):
        yield {name: np.asarray(x[i * batch : (i + 1) * batch], np.float32)}


# -- a small CNN, trained in numpy -----------------------------------------------------


def _im2col(x: np.ndarray, k: int, stride: int, pad: int) -> tuple[np.ndarray, int, int]:
    """``[n*ho*wo, c*k*k]`` patches of ``x [n, c, h, w]`` (columns in (c, i, j) order,
    as ``conv2d``'s functional model and a ``[o, c, k, k]`` weight reshaped agree)."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    cols = np.empty((n, ho, wo, c, k, k), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            cols[..., i, j] = xp[
                :, :, i : i + stride * ho : stride, j : j + stride * wo : stride
            ].transpose(0, 2, 3, 1)
    return cols.reshape(n * ho * wo, c * k * k), ho, wo


def _col2im(
    d: np.ndarray, shape: tuple[int, ...], k: int, stride: int, pad: int, ho: int, wo: int
) -> np.ndarray:
    n, c, h, w = shape
    d = d.reshape(n, ho, wo, c, k, k)
    dxp = np.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=d.dtype)
    for i in range(k):
        for j in range(k):
            dxp[:, :, i : i + stride * ho : stride, j : j + stride * wo : stride] += d[
                ..., i, j
            ].transpose(0, 3, 1, 2)
    return dxp[:, :, pad : pad + h, pad : pad + w]


#: The digits CNN: (name, out channels, stride) of its two 3x3 convolutions (pad 1),
#: then a hidden linear layer and the logits.
_CNN_CONVS = (("conv1", 8, 1), ("conv2", 16, 2))
_CNN_HIDDEN = 32


def _cnn_forward(
    p: Mapping[str, np.ndarray], x: np.ndarray
) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    cache: list[tuple[Any, ...]] = []
    h = x
    for name, o, st in _CNN_CONVS:
        w = p[f"{name}.weight"]
        cols, ho, wo = _im2col(h, 3, st, 1)
        y = cols @ w.reshape(o, -1).T + p[f"{name}.bias"]
        cache.append((name, st, h.shape, cols, ho, wo, y))
        h = np.maximum(y, 0).reshape(len(x), ho, wo, o).transpose(0, 3, 1, 2)
    flat = h.reshape(len(x), -1)
    z1 = flat @ p["fc1.weight"] + p["fc1.bias"]
    a1 = np.maximum(z1, 0)
    logits = a1 @ p["logits.weight"] + p["logits.bias"]
    cache.append((flat, z1, a1))
    return logits, cache


def train_digits_cnn(
    seed: int = 0, epochs: int = 20, batch: int = 32, lr: float = 3e-3
) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]:
    """A small CNN trained on the digits' training split in numpy (Adam, seeded,
    cross-entropy): 8x8 image -> conv 3x3 x8 (pad 1) -> ReLU -> conv 3x3 x16 (stride 2,
    pad 1) -> ReLU -> linear 256->32 -> ReLU -> linear 32->10. Convolutions are im2col
    matmuls, the same arithmetic the graph's ``conv2d`` lowers to. Returns the
    parameters (graph weight names and layouts: conv ``[o, c, 3, 3]``, linear ``[in,
    out]``) and ``(x_train, x_test, y_train, y_test)`` with images ``[n, 1, 8, 8]``."""
    x_tr, x_te, y_tr, y_te = load_digits_split(seed=seed)
    x_tr = x_tr.reshape(-1, 1, 8, 8).astype(np.float64)
    x_te = x_te.reshape(-1, 1, 8, 8).astype(np.float32)
    rng = np.random.default_rng(seed)
    p: dict[str, np.ndarray] = {}
    c = 1
    for name, o, _ in _CNN_CONVS:
        p[f"{name}.weight"] = rng.standard_normal((o, c, 3, 3)) * math.sqrt(2.0 / (c * 9))
        p[f"{name}.bias"] = np.zeros(o)
        c = o
    flat = _CNN_CONVS[-1][1] * 4 * 4
    p["fc1.weight"] = rng.standard_normal((flat, _CNN_HIDDEN)) * math.sqrt(2.0 / flat)
    p["fc1.bias"] = np.zeros(_CNN_HIDDEN)
    p["logits.weight"] = rng.standard_normal((_CNN_HIDDEN, 10)) * math.sqrt(1.0 / _CNN_HIDDEN)
    p["logits.bias"] = np.zeros(10)
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency

    with threadpool_limits(1):  # tiny matrices: BLAS threads only contend
        _adam(p, x_tr, y_tr, rng, epochs, batch, lr)
    params = {k: v.astype(np.float32) for k, v in p.items()}
    return params, (x_tr.astype(np.float32), x_te, y_tr, y_te)


def _adam(
    p: dict[str, np.ndarray],
    x_tr: np.ndarray,
    y_tr: np.ndarray,
    rng: np.random.Generator,
    epochs: int,
    batch: int,
    lr: float,
) -> None:
    m1 = {k: np.zeros_like(v) for k, v in p.items()}
    m2 = {k: np.zeros_like(v) for k, v in p.items()}
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x_tr))
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            xb, yb = x_tr[idx], y_tr[idx]
            logits, cache = _cnn_forward(p, xb)
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            prob = e / e.sum(axis=1, keepdims=True)
            prob[np.arange(len(idx)), yb] -= 1
            d = prob / len(idx)
            fl, z1, a1 = cache[-1]
            g = {"logits.weight": a1.T @ d, "logits.bias": d.sum(0)}
            dz1 = (d @ p["logits.weight"].T) * (z1 > 0)
            g["fc1.weight"], g["fc1.bias"] = fl.T @ dz1, dz1.sum(0)
            dh = (dz1 @ p["fc1.weight"].T).reshape(len(idx), -1, 4, 4)
            for name, st, hshape, cols, ho, wo, y in reversed(cache[:-1]):
                o = y.shape[1]
                dy = dh.transpose(0, 2, 3, 1).reshape(-1, o) * (y > 0)
                wm = p[f"{name}.weight"]
                g[f"{name}.weight"] = (dy.T @ cols).reshape(wm.shape)
                g[f"{name}.bias"] = dy.sum(0)
                dh = _col2im(dy @ wm.reshape(o, -1), hshape, 3, st, 1, ho, wo)
            step += 1
            for k in p:  # Adam
                m1[k] = 0.9 * m1[k] + 0.1 * g[k]
                m2[k] = 0.999 * m2[k] + 0.001 * g[k] ** 2
                mh, vh = m1[k] / (1 - 0.9**step), m2[k] / (1 - 0.999**step)
                p[k] = p[k] - lr * mh / (np.sqrt(vh) + 1e-8)


def cnn_predict(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The CNN's logits in float64 numpy (the reference its graph must match)."""
    return _cnn_forward({k: np.asarray(v, np.float64) for k, v in params.items()}, x)[0]


def cnn_to_graph(
    params: Mapping[str, np.ndarray], batch: int, *, dtype: str = "fp32", name: str = "cnn"
) -> tuple[Graph, dict[str, np.ndarray]]:
    """The digits CNN of :func:`train_digits_cnn` as a graph: ``x [batch, 1, 8, 8]`` ->
    ``conv1`` -> ReLU -> ``conv2`` -> ReLU -> ``flatten`` (reshape) -> ``fc1`` -> ReLU ->
    ``logits``. Returns the graph and its weights. Raises WorkloadError when a parameter
    is missing or has another shape."""
    b = GraphBuilder(name, dtype)
    x = b.input("x", (batch, 1, 8, 8))
    weights: dict[str, np.ndarray] = {}

    def take(key: str, shape: tuple[int, ...]) -> str:
        v = params.get(key)
        if v is None or tuple(np.shape(v)) != shape:
            got = "missing" if v is None else list(np.shape(v))
            raise WorkloadError(f"cnn_to_graph: parameter {key!r} is {got}, need {list(shape)}")
        weights[key] = np.asarray(v, np.float32)
        return b.weight(key, shape)

    c = 1
    for cname, o, st in _CNN_CONVS:
        w = take(f"{cname}.weight", (o, c, 3, 3))
        bias = take(f"{cname}.bias", (o,))
        x = b.op("conv2d", cname, [x, w, bias], stride=st, pad=1)
        x = b.op("relu", f"{cname}.relu", [x])
        c = o
    flat = math.prod(b.shape(x)[1:])
    x = b.op("reshape", "flatten", [x], shape=(batch, flat))
    for lname, n_out in (("fc1", _CNN_HIDDEN), ("logits", 10)):
        k = b.shape(x)[-1]
        w = take(f"{lname}.weight", (k, n_out))
        bias = take(f"{lname}.bias", (n_out,))
        x = b.op("linear", lname, [x, w, bias])
        if lname != "logits":
            x = b.op("relu", f"{lname}.relu", [x])
    return b.graph(sequences=batch, params={"model": name, "precision": dtype}), weights


# -- a small transformer on a synthetic task, trained in numpy -------------------------

#: The synthetic task: ``TASK_TOKENS`` tokens in a sequence, ids ``0..TASK_VOCAB-1``;
#: the label is which of ids ``0..TASK_CLASSES-1`` occurs most often (ids above are
#: distractors; sequences with a tie are redrawn). A ``CLS`` id is prepended, and the
#: model must gather the counts into it through attention.
TASK_TOKENS = 16
TASK_VOCAB = 8
TASK_CLASSES = 4
_CLS = TASK_VOCAB
_TF_D, _TF_FF = 32, 64


def majority_task(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sequences of the synthetic task: ids ``[n, 1 + TASK_TOKENS]`` (int64, the
    ``CLS`` id first) and labels ``[n]``, seeded."""
    rng = np.random.default_rng(seed)
    ids, labels = [], []
    while len(ids) < n:
        t = rng.integers(0, TASK_VOCAB, (2 * n, TASK_TOKENS))
        counts = np.stack([(t == c).sum(axis=1) for c in range(TASK_CLASSES)], axis=1)
        top = np.sort(counts, axis=1)
        ok = top[:, -1] > top[:, -2]
        ids.extend(t[ok])
        labels.extend(counts[ok].argmax(axis=1))
    x = np.concatenate([np.full((n, 1), _CLS), np.asarray(ids[:n])], axis=1).astype(np.int64)
    return x, np.asarray(labels[:n], dtype=np.int64)


def _tf_forward(p: Mapping[str, np.ndarray], ids: np.ndarray) -> tuple[np.ndarray, dict]:
    d = p["attn.q.weight"].shape[0]
    s = 1.0 / math.sqrt(d)
    e = p["tok_emb"][ids] + p["pos_emb"][None]
    q, k, v = (e @ p[f"attn.{n}.weight"] for n in "qkv")
    sc = q @ k.transpose(0, 2, 1) * s
    sc = sc - sc.max(axis=-1, keepdims=True)
    pr = np.exp(sc)
    pr /= pr.sum(axis=-1, keepdims=True)
    a = pr @ v
    h = e + a @ p["attn.out.weight"]
    z = h @ p["ffn.fc1.weight"] + p["ffn.fc1.bias"]
    r = np.maximum(z, 0)
    h2 = h + r @ p["ffn.fc2.weight"] + p["ffn.fc2.bias"]
    c = h2[:, 0]
    logits = c @ p["logits.weight"] + p["logits.bias"]
    return logits, {
        "e": e,
        "q": q,
        "k": k,
        "v": v,
        "p": pr,
        "a": a,
        "h": h,
        "z": z,
        "r": r,
        "c": c,
        "s": s,
    }


def transformer_predict(params: Mapping[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """The transformer's logits in float64 numpy (the reference its graph must match)."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    return _tf_forward(p, np.asarray(ids, np.int64))[0]


def train_synthetic_transformer(
    seed: int = 0, samples: int = 2000, epochs: int = 6, batch: int = 64, lr: float = 3e-3
) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, ...]]:
    """A one-block transformer trained in numpy on :func:`majority_task` (Adam, seeded,
    cross-entropy): token + position embeddings (d 32) -> single-head self-attention
    (q, k, v, out projections; residual) -> ReLU feed-forward 32-64-32 (residual) -> the
    ``CLS`` position -> linear to 4 classes. Returns the parameters (graph weight names;
    linear weights ``[in, out]``) and ``(ids_train, ids_test, y_train, y_test)`` (a 75/25
    split)."""
    x, y = majority_task(samples, seed)
    cut = samples * 3 // 4
    rng = np.random.default_rng(seed + 1)
    d, f, s_len = _TF_D, _TF_FF, TASK_TOKENS + 1
    p: dict[str, np.ndarray] = {
        "tok_emb": rng.standard_normal((TASK_VOCAB + 1, d)) * 0.5,
        "pos_emb": rng.standard_normal((s_len, d)) * 0.5,
        "ffn.fc1.bias": np.zeros(f),
        "ffn.fc2.bias": np.zeros(d),
        "logits.bias": np.zeros(TASK_CLASSES),
    }
    for n in ("attn.q", "attn.k", "attn.v", "attn.out"):
        p[f"{n}.weight"] = rng.standard_normal((d, d)) / math.sqrt(d)
    p["ffn.fc1.weight"] = rng.standard_normal((d, f)) * math.sqrt(2.0 / d)
    p["ffn.fc2.weight"] = rng.standard_normal((f, d)) / math.sqrt(f)
    p["logits.weight"] = rng.standard_normal((d, TASK_CLASSES)) / math.sqrt(d)
    m1 = {k: np.zeros_like(v) for k, v in p.items()}
    m2 = {k: np.zeros_like(v) for k, v in p.items()}
    step = 0
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency

    with threadpool_limits(1):
        for _ in range(epochs):
            order = rng.permutation(cut)
            for i in range(0, cut, batch):
                idx = order[i : i + batch]
                g = _tf_grads(p, x[idx], y[idx])
                step += 1
                for k in p:  # Adam
                    m1[k] = 0.9 * m1[k] + 0.1 * g[k]
                    m2[k] = 0.999 * m2[k] + 0.001 * g[k] ** 2
                    mh, vh = m1[k] / (1 - 0.9**step), m2[k] / (1 - 0.999**step)
                    p[k] = p[k] - lr * mh / (np.sqrt(vh) + 1e-8)
    params = {k: v.astype(np.float32) for k, v in p.items()}
    return params, (x[:cut], x[cut:], y[:cut], y[cut:])


def _tf_grads(p: Mapping[str, np.ndarray], ids: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Cross-entropy gradients of every parameter (backpropagation by hand)."""
    logits, t = _tf_forward(p, ids)
    n = len(ids)
    ex = np.exp(logits - logits.max(axis=1, keepdims=True))
    d = ex / ex.sum(axis=1, keepdims=True)
    d[np.arange(n), y] -= 1
    d /= n
    g = {"logits.weight": t["c"].T @ d, "logits.bias": d.sum(0)}
    dh2 = np.zeros_like(t["h"])
    dh2[:, 0] = d @ p["logits.weight"].T

    def flat(v: np.ndarray) -> np.ndarray:
        return v.reshape(-1, v.shape[-1])

    g["ffn.fc2.weight"] = flat(t["r"]).T @ flat(dh2)
    g["ffn.fc2.bias"] = flat(dh2).sum(0)
    dz = (dh2 @ p["ffn.fc2.weight"].T) * (t["z"] > 0)
    g["ffn.fc1.weight"] = flat(t["h"]).T @ flat(dz)
    g["ffn.fc1.bias"] = flat(dz).sum(0)
    dh = dh2 + dz @ p["ffn.fc1.weight"].T
    g["attn.out.weight"] = flat(t["a"]).T @ flat(dh)
    da = dh @ p["attn.out.weight"].T
    dpr = da @ t["v"].transpose(0, 2, 1)
    dv = t["p"].transpose(0, 2, 1) @ da
    dsc = t["p"] * (dpr - (dpr * t["p"]).sum(axis=-1, keepdims=True)) * t["s"]
    dq = dsc @ t["k"]
    dk = dsc.transpose(0, 2, 1) @ t["q"]
    de = dh.copy()
    for name, dd in (("q", dq), ("k", dk), ("v", dv)):
        g[f"attn.{name}.weight"] = flat(t["e"]).T @ flat(dd)
        de += dd @ p[f"attn.{name}.weight"].T
    g["pos_emb"] = de.sum(0)
    tok = np.zeros_like(p["tok_emb"])
    np.add.at(tok, ids, de)
    g["tok_emb"] = tok
    return g


def transformer_to_graph(
    params: Mapping[str, np.ndarray], batch: int, *, dtype: str = "fp32", name: str = "transformer"
) -> tuple[Graph, dict[str, np.ndarray]]:
    """The transformer of :func:`train_synthetic_transformer` as a graph: ``ids [batch,
    17]`` -> ``embed`` (+ ``pos_emb``) -> ``attn.q/k/v`` (linear) -> ``attn.scores``
    (bmm, scaled) -> softmax -> ``attn.context`` (bmm) -> ``attn.out`` -> residual ->
    ``ffn.fc1`` -> ReLU -> ``ffn.fc2`` -> residual -> the CLS row (slice, reshape) ->
    ``logits``. Returns the graph and its weights. Raises WorkloadError when a parameter
    is missing or has another shape."""
    b = GraphBuilder(name, dtype)
    s_len = TASK_TOKENS + 1
    ids = b.input("ids", (batch, s_len), "int64")
    weights: dict[str, np.ndarray] = {}

    def check(key: str, shape: tuple[int, ...]) -> None:
        v = params.get(key)
        if v is None or tuple(np.shape(v)) != shape:
            got = "missing" if v is None else list(np.shape(v))
            raise WorkloadError(
                f"transformer_to_graph: parameter {key!r} is {got}, need {list(shape)}"
            )
        weights[key] = np.asarray(v, np.float32)

    d = int(np.shape(params.get("attn.q.weight", np.zeros((_TF_D, _TF_D))))[0])
    check("tok_emb", (TASK_VOCAB + 1, d))
    check("pos_emb", (s_len, d))
    x = b.op("embedding", "embed", [ids, b.weight("tok_emb", (TASK_VOCAB + 1, d))])
    x = b.op("add", "embed.pos", [x, b.weight("pos_emb", (s_len, d))])

    def linear(lname: str, inp: str, n_out: int, bias: bool) -> str:
        check(f"{lname}.weight", (b.shape(inp)[-1], n_out))
        if bias:
            check(f"{lname}.bias", (n_out,))
        return b.linear(lname, inp, n_out, bias=bias)

    q, k, v = (linear(f"attn.{n}", x, d, False) for n in "qkv")
    sc = b.op("bmm", "attn.scores", [q, k], transpose_b=True, scale=1.0 / math.sqrt(d))
    pr = b.op("softmax", "attn.probs", [sc])
    a = b.op("bmm", "attn.context", [pr, v])
    h = b.op("add", "attn.residual", [x, linear("attn.out", a, d, False)])
    z = b.op("relu", "ffn.relu", [linear("ffn.fc1", h, _TF_FF, True)])
    h2 = b.op("add", "ffn.residual", [h, linear("ffn.fc2", z, d, True)])
    c = b.op("slice", "cls", [h2], axis=1, start=0, stop=1)
    c = b.op("reshape", "cls.flat", [c], shape=(batch, d))
    linear("logits", c, TASK_CLASSES, True)
    return b.graph(sequences=batch, params={"model": name, "precision": dtype}), weights
