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
* Real trained models with no downloads: :func:`load_digits_split` (scikit-learn's
  bundled 8x8 digits), :func:`train_digits_mlp` (an ``MLPClassifier`` trained on it,
  seeded) and :func:`mlp_to_graph` (an MLP's weights -> ``linear`` + activation ops).

scikit-learn is imported only by the functions that need it; when it is missing they
raise one ``ImportError`` line naming the extra to install.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .emulator.config import DeviceSpec
from .emulator.device import Device
from .emulator.errors import WorkloadError
from .graph import Graph, GraphBuilder
from .lowering import Provider, lower
from .optimize._quant import QuantExecutor
from .spec import DEFAULT_DEVICE, load_spec

__all__ = [
    "GraphEvaluator",
    "AccuracyReport",
    "compare",
    "agreement_stats",
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
            "and models: pip install 'wia-hw[test]' (or scikit-learn)"
        ) from None
    return sklearn


class GraphEvaluator:
    """Functional runs of ``graph`` on ``device`` with ``weights`` (see the module
    docstring). The graph is lowered once; :meth:`run` computes one batch.

    ``providers``: op kind or name -> ``(extension id, lowering function)``, as
    :attr:`wia_hw.Context.providers` holds them (the policy a later routing of ops to
    analog or photonic units plugs in). ``seed`` draws any weight not given;
    ``weights`` may hold more than the graph's (those are ignored).
    """

    def __init__(
        self,
        graph: Graph,
        weights: Mapping[str, np.ndarray] | None = None,
        *,
        device: str | DeviceSpec = DEFAULT_DEVICE,
        providers: Mapping[str, tuple[str, Provider]] | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"GraphEvaluator takes a Graph, got {type(graph).__name__}")
        self.graph = graph
        self.spec = device if isinstance(device, DeviceSpec) else load_spec(device)
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

    def run(self, inputs: Mapping[str, np.ndarray] | np.ndarray) -> dict[str, np.ndarray]:
        """The graph's outputs (float32, dequantised) for one batch (see :meth:`execute`)."""
        fx = self.execute(inputs)
        return {n: np.asarray(v, dtype=np.float32) for n, v in fx.outputs().items()}

    def predict(self, x: np.ndarray, output: str | None = None) -> np.ndarray:
        """Outputs for ``x`` (rows of samples; the graph's batch is its first input's
        first dim), run batch by batch; the last batch is zero-padded and trimmed."""
        name = self.inputs[0]
        shape = self.graph.tensors[name].shape
        b = shape[0]
        x = np.asarray(x, dtype=np.float32)
        if tuple(x.shape[1:]) != shape[1:]:
            raise WorkloadError(
                f"predict: samples of shape {list(x.shape[1:])}, input "
                f"{name!r} needs {list(shape[1:])}"
            )
        outs = []
        for i in range(0, len(x), b):
            chunk = x[i : i + b]
            pad = np.zeros((b,) + shape[1:], np.float32)
            pad[: len(chunk)] = chunk
            got = self.run({name: pad})
            key = output or next(iter(got))
            outs.append(got[key][: len(chunk)])
        return np.concatenate(outs)


def agreement_stats(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(cosine similarity, max abs error) of ``out`` against ``ref``, flattened."""
    a = np.asarray(out, np.float64).ravel()
    r = np.asarray(ref, np.float64).ravel()
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
    logits, or any regression-like outputs when ``labels`` is None)."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        raise WorkloadError(
            f"compare {name!r}: outputs {list(out.shape)} and reference "
            f"{list(ref.shape)} differ in shape"
        )
    cos, err = agreement_stats(out, ref)
    acc = racc = agree = math.nan
    if labels is not None:
        po, pr = out.argmax(axis=-1), ref.argmax(axis=-1)
        labels = np.asarray(labels)
        acc = 100.0 * float(np.mean(po == labels))
        racc = 100.0 * float(np.mean(pr == labels))
        agree = 100.0 * float(np.mean(po == pr))
    return AccuracyReport(name, int(out.shape[0]), acc, racc, agree, cos, err)


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
    same)."""
    if hasattr(model, "coefs_"):
        layers = list(zip(model.coefs_, model.intercepts_, strict=True))
        act = getattr(model, "activation", "relu")
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
