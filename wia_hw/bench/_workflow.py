"""The performance optimisation cycle (the seed's section 8.1): ``optimize_workload``.

Each iteration: measure the current graph (a fresh device of the spec, so every step
starts cold), profile it with the counters (the bound model of
:mod:`wia_hw.profiling._bounds` judges each kernel), add kernel time by bottleneck class,
pick the optimisation that targets the dominant class, apply it, measure again, verify
correctness on a reduced model in functional mode, and keep it or revert it.

Bottleneck classes (the seed's four, and one more the bound model finds):

* ``compute``: kernels bound by ``compute``, ``pipeline`` or ``parallelism``;
* ``memory bandwidth``: bound by ``l1``, ``l2`` or ``hbm``, or latency-bound with the
  cores waiting for DMA loads;
* ``synchronisation``: latency-bound with the cores idle at a kernel barrier or waiting
  on launches;
* ``communication``: collective kernels (multi-device runs);
* ``latency``: latency-bound by the fixed latency of a tile (the seed has no class for it).

The profiler's top recommendation (:func:`wia_hw.analyze_performance`) is recorded with
each step; when its category names one of the dominant class's remedies not yet tried
(``fusion`` and ``attention`` -> fusion; the tiling ones, ``occupancy``, ``utilization``
and ``cache`` -> auto-tuning), that one goes first.
Optimisations by class, in order of preference (:data:`REMEDIES`): memory bandwidth ->
fusion (intermediates stay on chip), then int8 PTQ (half the bytes); compute -> int8 PTQ
(twice the peak), then auto-tuning; synchronisation and latency -> auto-tuning, then
fusion (fewer kernels); communication -> none on one device. Auto-tuning is used when
:func:`wia_hw.optimize.autotune_model` exists.

Correctness: the same optimisation is applied to the model rebuilt small (``verify_layers``
layers, batch 2, sequence 16) and its functional outputs are compared with the reduced
float model's (cosine similarity of the last layer norm's output, or of the last op's
when there is none); a step below ``min_cosine`` is reverted.
"""

from __future__ import annotations

import enum
import inspect
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..emulator.config import DeviceSpec
from ..graph import Graph
from ._config import BenchmarkError

__all__ = [
    "BOTTLENECKS",
    "REMEDIES",
    "Agreement",
    "OptimizationStrategy",
    "OptimizationWorkflow",
    "WorkflowBaseline",
    "WorkflowProfiling",
    "WorkflowResult",
    "WorkflowStep",
    "autotune_schedules",
    "autotuner",
    "bottleneck_shares",
    "calibration_model",
    "shrink_vocab",
    "functional_agreement",
    "optimize_workload",
    "random_batches",
    "reduced_model",
]

BOTTLENECKS = ("compute", "memory bandwidth", "synchronisation", "communication", "latency")
REMEDIES: dict[str, tuple[str, ...]] = {
    "memory bandwidth": ("fusion", "int8", "autotune"),
    "compute": ("int8", "autotune"),
    "synchronisation": ("autotune", "fusion"),
    "latency": ("autotune", "fusion"),
    "communication": (),
}


class OptimizationStrategy(enum.Enum):
    """``ITERATIVE`` (the seed's ``WIA_OPTIMIZE_ITERATIVE``): one optimisation per
    iteration, the one that targets the dominant bottleneck."""

    ITERATIVE = "iterative"


@dataclass(frozen=True, kw_only=True)
class WorkflowBaseline:
    """The goal: ``metric`` ``latency`` (ms, lower is better) or ``throughput``
    (sequences/s, higher is better) reaching ``target_value`` (``None``: no target, run
    to convergence) within ``tolerance`` (0.05: a latency up to 5 % above the target
    counts as met)."""

    metric: str = "latency"
    target_value: float | None = None
    tolerance: float = 0.05

    def __post_init__(self) -> None:
        if self.metric not in ("latency", "throughput"):
            raise BenchmarkError(
                f"WorkflowBaseline.metric must be latency or throughput, got {self.metric!r}"
            )
        t = self.target_value
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0):
            raise BenchmarkError(f"WorkflowBaseline.target_value must be > 0, got {t!r}")
        if not isinstance(self.tolerance, (int, float)) or not 0 <= self.tolerance < 1:
            raise BenchmarkError(
                f"WorkflowBaseline.tolerance must be in [0, 1), got {self.tolerance!r}"
            )


@dataclass(frozen=True, kw_only=True)
class WorkflowProfiling:
    """What the profile looks at (the seed's ``.profiling``): kernels (the bound of each,
    always needed), memory (the memory-bound classes), communication and
    synchronisation (those classes). A class switched off is not counted."""

    enable_kernel_profiling: bool = True
    enable_memory_profiling: bool = True
    enable_communication_profiling: bool = True
    enable_synchronization_profiling: bool = True


@dataclass(frozen=True, kw_only=True)
class OptimizationWorkflow:
    """The seed's ``wia_optimization_workflow_t``. ``max_iterations`` >= 1;
    ``convergence_threshold``: the least relative gain a step must bring to be kept
    (0.01 = 1 %); a smaller gain ends the loop (converged). ``verify``: check each step
    in functional mode on the model rebuilt with ``verify_layers`` layers, needing a
    cosine >= ``min_cosine``. ``calibration_batches``: for int8 PTQ (random inputs,
    seeded; a builder model is calibrated at batch 1, sequence 16)."""

    baseline: WorkflowBaseline = field(default_factory=WorkflowBaseline)
    profiling: WorkflowProfiling = field(default_factory=WorkflowProfiling)
    optimization_strategy: OptimizationStrategy | str = OptimizationStrategy.ITERATIVE
    max_iterations: int = 10
    convergence_threshold: float = 0.01
    verify: bool = True
    verify_layers: int = 1
    min_cosine: float = 0.99
    calibration_batches: int = 2

    def __post_init__(self) -> None:
        try:
            object.__setattr__(
                self, "optimization_strategy", OptimizationStrategy(self.optimization_strategy)
            )
        except ValueError:
            raise BenchmarkError(
                "OptimizationWorkflow.optimization_strategy must be one of "
                f"{', '.join(s.value for s in OptimizationStrategy)}, "
                f"got {self.optimization_strategy!r}"
            ) from None
        for name in ("max_iterations", "verify_layers", "calibration_batches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BenchmarkError(
                    f"OptimizationWorkflow.{name} must be an integer >= 1, got {v!r}"
                )
        c = self.convergence_threshold
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < 1:
            raise BenchmarkError(
                f"OptimizationWorkflow.convergence_threshold must be in [0, 1), got {c!r}"
            )
        m = self.min_cosine
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not -1 <= m <= 1:
            raise BenchmarkError(f"OptimizationWorkflow.min_cosine must be in [-1, 1], got {m!r}")


@dataclass
class Agreement:
    """Functional agreement of an optimised reduced model with its reference:
    ``cosine`` and ``max_abs_error`` of tensor ``output`` of ``model`` (a label that
    says how it was reduced)."""

    model: str
    output: str
    cosine: float
    max_abs_error: float
    max_abs_reference: float

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class WorkflowStep:
    """One iteration, with its evidence. ``latency_ms``/``throughput``/``floor_ms``: the
    graph profiled at the start of the step; ``shares``: percent of kernel time per
    bottleneck class; ``top_kernels``: the three longest ``(name, ms, bound)``;
    ``recommendation``: the profiler's top recommendation title when the profile has
    one; ``applied``: the optimisation tried (``None`` if none); ``after_ms`` and
    ``gain`` (``latency_ms / after_ms``) its measurement; ``agreement`` its functional
    check; ``decision``: ``kept``, ``reverted: ...``, or why nothing was tried."""

    iteration: int
    latency_ms: float
    throughput: float
    floor_ms: float
    bottleneck: str
    shares: dict[str, float]
    top_kernels: list[tuple[str, float, str]]
    applied: str | None = None
    after_ms: float | None = None
    after_floor_ms: float | None = None
    gain: float | None = None
    agreement: Agreement | None = None
    decision: str = ""
    recommendation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["agreement"] = self.agreement.to_dict() if self.agreement else None
        d["top_kernels"] = [list(k) for k in self.top_kernels]
        return d


@dataclass
class WorkflowResult:
    """The history (``steps``), the final ``graph`` (and ``schedules``, when auto-tuning
    was kept) and its measurement, and why the loop stopped (``stop_reason``). ``speedup`` = first latency / final latency."""

    steps: list[WorkflowStep]
    graph: Graph
    baseline_ms: float
    final_ms: float
    final_floor_ms: float
    target_met: bool
    stop_reason: str
    applied: list[str]
    #: tuned GEMM schedules by kernel key (auto-tuning), for ``run(graph, schedules=...)``
    schedules: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.final_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": [s.to_dict() for s in self.steps],
            "baseline_ms": self.baseline_ms,
            "final_ms": self.final_ms,
            "final_floor_ms": self.final_floor_ms,
            "speedup": self.speedup,
            "target_met": self.target_met,
            "stop_reason": self.stop_reason,
            "applied": self.applied,
            "tuned_kernels": sorted(self.schedules),
        }

    def format(self) -> str:
        out = []
        for s in self.steps:
            shares = ", ".join(f"{k} {v:.0f}%" for k, v in s.shares.items() if v >= 1)
            line = (
                f"[{s.iteration}] {s.latency_ms:.3f} ms (floor {s.floor_ms:.3f}); "
                f"bottleneck {s.bottleneck} ({shares})"
            )
            if s.recommendation:
                line += f"; profiler: {s.recommendation}"
            if s.applied:
                line += f"; {s.applied} -> {s.after_ms:.3f} ms ({s.gain:.2f}x)"
            if s.agreement:
                line += f"; cosine {s.agreement.cosine:.5f}"
            out.append(line + f"; {s.decision}")
        out.append(
            f"{self.baseline_ms:.3f} -> {self.final_ms:.3f} ms ({self.speedup:.2f}x); "
            f"stopped: {self.stop_reason}"
        )
        return "\n".join(out)


# -- pieces ------------------------------------------------------------------------------


def autotuner() -> Callable[..., Any] | None:
    """``wia_hw.optimize.autotune_model`` when it exists (the case study plugs it in too)."""
    from .. import optimize

    return getattr(optimize, "autotune_model", None)


def default_cost_model() -> str:
    """The ML tuner's cost model :func:`autotune_schedules` uses: gradient-boosted trees
    (``gbt``) where scikit-learn is installed (the test extra), else numpy's ``ridge``."""
    import importlib.util

    return "gbt" if importlib.util.find_spec("sklearn") else "ridge"


def autotune_schedules(
    graph: Graph, spec: DeviceSpec, config: Any = None, seed: int = 0
) -> tuple[dict[str, Any], Any]:
    """Tune ``graph``'s GEMM kernels on ``spec`` with ``autotune_model`` (``config``:
    an ``AutotuneConfig``; default: ML-guided (gradient-boosted trees with scikit-learn,
    else ridge), 32 trials per kernel key, no wall-clock budget so the result is the
    same on every machine). Returns ``(schedules by kernel
    key, the AutotuneResult)``; ``run(graph, schedules=...)`` applies them."""
    from .. import optimize

    if config is None:
        config = optimize.AutotuneConfig(  # type: ignore[attr-defined]
            method="ml",
            time_budget_seconds=None,
            max_trials=32,
            seed=seed,
            cost_model=default_cost_model(),
        )
    res = optimize.autotune_model(graph, config, device=spec)  # type: ignore[attr-defined]
    return dict(res.schedules), res


def random_batches(graph: Graph, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``n`` batches of random inputs for ``graph`` (ids below the vocabulary of the
    embedding that reads them; floats N(0, 1)), seeded."""
    from ..emulator.functional import random_input

    rng = np.random.default_rng(seed)
    vocab = {
        op.inputs[0]: graph.tensors[op.inputs[1]].shape[0]
        for op in graph.ops
        if op.kind == "embedding"
    }
    ins = [t for t in graph.tensors.values() if t.kind == "input"]
    return [
        {t.name: random_input(rng, t.shape, t.dtype, vocab.get(t.name)) for t in ins}
        for _ in range(n)
    ]


#: Rows of an embedding table the functional (calibration, verification) models keep.
FUNCTIONAL_VOCAB_ROWS = 1024


def shrink_vocab(graph: Graph, rows: int = FUNCTIONAL_VOCAB_ROWS) -> tuple[Graph, str]:
    """``graph`` with every embedding table read by a graph input cut to its first
    ``rows`` rows, and a label saying so ("" when nothing was cut). Weights and token ids
    are random in these models either way; no quantised tensor changes shape, and the
    functional runs no longer draw and round a 30,522 x 1,024 table each time."""
    from dataclasses import replace

    inputs = {t.name for t in graph.tensors.values() if t.kind == "input"}
    cut: dict[str, tuple[int, ...]] = {}
    for op in graph.ops:
        if op.kind == "embedding" and op.inputs[0] in inputs:
            t = graph.tensors[op.inputs[1]]
            if t.shape[0] > rows:
                cut[t.name] = (rows, *t.shape[1:])
    # a table another op reads too (GPT-2's LM head is tied to its token embedding) keeps
    # its rows: cutting it would change that op's output shape
    for op in graph.ops:
        if op.kind != "embedding":
            for i in op.inputs:
                cut.pop(i, None)
    if not cut:
        return graph, ""
    tensors = [replace(t, shape=cut[n]) if n in cut else t for n, t in graph.tensors.items()]
    label = ", ".join(f"{n} {cut[n][0]:,} of {graph.tensors[n].shape[0]:,} rows" for n in cut)
    return (
        Graph(graph.name, tensors, graph.ops, sequences=graph.sequences, params=graph.params),
        label,
    )


def reduced_model(graph: Graph, layers: int, batch: int = 2, seq: int = 16) -> tuple[Graph, str]:
    """The float model of ``graph`` rebuilt small, and a label saying so. A builder model
    is rebuilt with ``layers`` layers (when it has layers), ``batch`` and ``seq``;
    another graph is used as it is (label says so)."""
    from ..workloads import WORKLOADS

    p = graph.params
    key = str(p.get("model", "")).lower().replace("-", "").replace("_", "")
    fn = next((f for k, f in WORKLOADS.items() if k.replace("-", "").replace("_", "") == key), None)
    if fn is None:
        return graph, f"{graph.name} (full graph)"
    from ..serve._model import builder_kwargs

    names = set(inspect.signature(fn).parameters)
    kw = {k: v for k, v in builder_kwargs(p, names).items() if k != "precision"}
    kw["precision"] = _float_precision(graph)
    kw["batch"] = batch
    if "seq" in names:
        kw["seq"] = min(seq, int(p.get("seq", seq)))
    if "layers" in names and "layers" in p:
        kw["layers"] = min(layers, int(p["layers"]))
    small, cut = shrink_vocab(fn(**kw))
    full = p.get("layers")
    what = (
        f"{p['model']} REDUCED to {kw.get('layers', '?')} of {full} layers" if full else p["model"]
    )
    dims = f"b{batch}" + (f" s{kw['seq']}" if "seq" in kw else "")
    return small, f"{what}, {dims}" + (f", {cut}" if cut else "")


def fuse(graph: Graph, config: Mapping[str, bool] | None = None) -> Graph:
    """:func:`apply_fusion` with ``config``, a recorded ``fusion_config``, or every
    pattern (a quantised graph stays quantised, its weights and scales kept)."""
    from ..optimize import FusionConfig, apply_fusion

    return apply_fusion(graph, FusionConfig(**config) if config else FusionConfig())


def _float_precision(graph: Graph) -> str:
    for op in graph.ops:
        q = op.attrs.get("quant", {})
        if "weight_scale" in q:
            return str(graph.tensors[op.outputs[0]].dtype)
    return str(graph.params.get("precision", "fp16"))


def _hidden(graph: Graph) -> str:
    ln = [op for op in graph.ops if op.kind == "layer_norm"]
    return (ln[-1] if ln else graph.ops[-1]).outputs[0]


def functional_agreement(
    graph: Graph,
    transforms: Sequence[str],
    *,
    spec: DeviceSpec | str = "wia-npu",
    layers: int = 1,
    calibration_batches: int = 2,
    seed: int = 0,
) -> Agreement:
    """Apply ``transforms`` (``fusion``, ``int8``; ``autotune`` changes no value) to the
    model of ``graph`` rebuilt small (:func:`reduced_model`) and compare its functional
    outputs with the reduced float model's, on one batch of random inputs (seed 99).
    int8 is calibrated on ``calibration_batches`` random batches of the reduced model."""
    from .._functional import FunctionalExecutor
    from ..accuracy import GraphEvaluator, agreement_stats
    from ..optimize import QuantizationConfig, quantize_model

    small, label = reduced_model(graph, layers)
    test = random_batches(small, 1, 99)[0]
    # the float weights, drawn once as functional mode draws them, shared by every run
    drawn = FunctionalExecutor(small, seed, test).values
    weights = {n: drawn[n] for n, t in small.tensors.items() if t.kind == "weight"}
    g = small
    for t in transforms:
        if t == "fusion":
            g = fuse(g, graph.params.get("fusion_config"))
        elif t == "int8":
            with warnings.catch_warnings():
                # the full model's quantisation already said which GEMMs stay float
                warnings.filterwarnings("ignore", message="quantize_model: .* stay float")
                g = quantize_model(
                    g,
                    QuantizationConfig(calibration_batches=calibration_batches),
                    random_batches(small, calibration_batches, seed),
                    weights=weights,
                    seed=seed,
                )
        elif t != "autotune":
            raise BenchmarkError(f"unknown transform {t!r} (fusion, int8, autotune)")
    out_name = _hidden(small)
    ref = GraphEvaluator(small, weights, device=spec, seed=seed).execute(test).values[out_name]
    out = GraphEvaluator(g, weights, device=spec, seed=seed).execute(test).values[out_name]
    cos, err = agreement_stats(np.asarray(out, np.float64), np.asarray(ref, np.float64))
    return Agreement(label, out_name, cos, err, float(np.max(np.abs(ref))))


def _classify(k: Any, prof: WorkflowProfiling) -> str | None:
    if k.kind in ("collective", "comm", "communication"):
        return "communication" if prof.enable_communication_profiling else None
    b = k.bound or "compute"
    if b in ("compute", "pipeline", "parallelism"):
        return "compute"
    if b in ("l1", "l2", "hbm"):
        return "memory bandwidth" if prof.enable_memory_profiling else None
    cause = k.latency_cause or ""
    first = cause.split(";")[0]
    if "DMA loads" in first:
        return "memory bandwidth" if prof.enable_memory_profiling else None
    if "barrier" in first or "launch" in first or "idle" in first:
        return "synchronisation" if prof.enable_synchronization_profiling else None
    return "latency"


def bottleneck_shares(
    kernels: Sequence[Any], profiling: WorkflowProfiling | None = None
) -> dict[str, float]:
    """Percent of kernel time per bottleneck class (module docstring) over
    :class:`~wia_hw.KernelProfile` s judged by the bound model."""
    prof = profiling or WorkflowProfiling()
    tot: dict[str, float] = dict.fromkeys(BOTTLENECKS, 0.0)
    for k in kernels:
        c = _classify(k, prof)
        if c is not None:
            tot[c] += k.duration_ms
    s = sum(tot.values())
    return {k: 100.0 * v / s if s else 0.0 for k, v in tot.items()}


def _measure(
    graph: Graph, spec: DeviceSpec, seed: int, schedules: Mapping[str, Any] | None = None
) -> Any:
    """A profiled run (counters) on a fresh device, with tuned ``schedules`` if any."""
    from ..profiling import ProfileMode, ProfilingConfig
    from ..runtime import run

    cfg = ProfilingConfig(
        mode=ProfileMode.COUNTERS, capture_memory=False, capture_communication=False
    )
    kw = {"schedules": dict(schedules)} if schedules else {}
    return run(graph, device=spec, seed=seed, profile=cfg, **kw)


def _schedules_for(graph: Graph, spec: DeviceSpec, schedules: Mapping[str, Any]) -> dict[str, Any]:
    """The tuned ``schedules`` whose kernel keys ``graph`` still has: a transformation
    (int8 changes a GEMM's precision, fusion its epilogue) can leave none of them."""
    if not schedules:
        return {}
    from ..optimize._autotune import _kernels_of

    keys = _kernels_of(graph, spec, None)
    return {key: t for key, t in schedules.items() if key in keys}


def calibration_model(graph: Graph) -> Graph:
    """The model at batch 1, sequence 16 (a builder model; embedding tables cut by
    :func:`shrink_vocab`), for int8 calibration; another graph as it is."""
    from ..workloads import WORKLOADS

    p = graph.params
    key = str(p.get("model", "")).lower().replace("-", "").replace("_", "")
    fn = next((f for k, f in WORKLOADS.items() if k.replace("-", "").replace("_", "") == key), None)
    if fn is None:
        return graph
    from ..serve._model import builder_kwargs

    names = set(inspect.signature(fn).parameters)
    kw = builder_kwargs(p, names)
    kw["batch"] = 1
    if "seq" in names and "seq" in p:
        kw["seq"] = min(16, int(p["seq"]))
    return shrink_vocab(fn(**kw))[0]


def apply_optimisation(
    name: str, graph: Graph, spec: DeviceSpec, calibration_batches: int = 2, seed: int = 0
) -> Graph:
    """``graph`` with optimisation ``name`` applied: ``fusion`` (:func:`apply_fusion`,
    every pattern), ``int8`` (:func:`quantize_model`, PTQ, calibrated on random inputs of
    the model at batch 1, sequence 16), ``autotune`` (:func:`autotuner`)."""
    from ..optimize import QuantizationConfig, quantize_model

    if name == "fusion":
        return fuse(graph)
    if name == "int8":
        cal = calibration_model(graph)
        q = quantize_model(
            graph,
            QuantizationConfig(calibration_batches=calibration_batches),
            random_batches(cal, calibration_batches, seed),
            calibration_graph=cal,
            seed=seed,
        )
        # values of tables the calibration model cut do not belong to this graph
        for d in (q.weights, q.float_weights):
            for n in [n for n, v in d.items() if n in q.tensors and v.shape != q.tensors[n].shape]:
                del d[n]
        return q
    raise BenchmarkError(f"unknown optimisation {name!r} (fusion, int8, autotune)")


#: recommendation category -> the optimisation that carries it out
_REMEDY_OF_CATEGORY = {
    "fusion": "fusion",
    "attention": "fusion",  # flash attention is apply_fusion's fuse_attention
    "occupancy": "autotune",  # the three tiling recommendations
    "utilization": "autotune",
    "cache": "autotune",
}


def _top_recommendation(report: Any) -> Any:
    """The profiler's first recommendation (:func:`wia_hw.analyze_performance`, kernel
    rules only), or None."""
    from ..profiling import AnalysisConfig, analyze_performance

    recs = analyze_performance(
        report, AnalysisConfig(analyze_memory=False, analyze_communication=False)
    )
    return recs.recommendations[0] if recs.recommendations else None


def _met(wf: OptimizationWorkflow, latency_ms: float, throughput: float) -> bool:
    b = wf.baseline
    if b.target_value is None:
        return False
    if b.metric == "latency":
        return latency_ms <= b.target_value * (1 + b.tolerance)
    return throughput >= b.target_value * (1 - b.tolerance)


# -- the loop ----------------------------------------------------------------------------


def optimize_workload(
    ctx_or_device: Any,
    workload: str | os.PathLike[str] | Graph,
    workflow: OptimizationWorkflow | None = None,
    *,
    seed: int = 0,
    **workload_kwargs: Any,
) -> WorkflowResult:
    """The seed's ``wia_optimize_workload``: run the optimisation cycle (module
    docstring) on ``workload`` (a builder name with ``workload_kwargs``, an ``.onnx``
    path, or a :class:`~wia_hw.Graph`) for the device of ``ctx_or_device`` (a
    :class:`~wia_hw.Context`, a spec name or path, or a :class:`~wia_hw.DeviceSpec`).
    Every measurement runs on a fresh device of that spec (cold, reproducible).

    Returns a :class:`WorkflowResult`. Raises :class:`~wia_hw.BenchmarkError` on a bad
    workflow, ``TypeError`` on a wrong argument type.
    """
    from ..runtime import Context, resolve_workload
    from ..spec import load_spec

    wf = OptimizationWorkflow() if workflow is None else workflow
    if not isinstance(wf, OptimizationWorkflow):
        raise TypeError(f"workflow must be an OptimizationWorkflow, got {type(wf).__name__}")
    if isinstance(ctx_or_device, Context):
        spec = ctx_or_device.spec
    elif isinstance(ctx_or_device, DeviceSpec):
        spec = ctx_or_device
    elif isinstance(ctx_or_device, (str, os.PathLike)):
        spec = load_spec(ctx_or_device)
    else:
        raise TypeError(
            "optimize_workload takes a Context, a DeviceSpec or a spec name, got "
            f"{type(ctx_or_device).__name__}"
        )
    graph = original = resolve_workload(workload, **workload_kwargs)
    have_autotune = autotuner() is not None
    applied: list[str] = []
    tried: set[str] = set()
    steps: list[WorkflowStep] = []
    schedules: dict[str, Any] = {}
    r = _measure(graph, spec, seed)
    base_ms = r.latency_ms
    stop = f"max_iterations ({wf.max_iterations}) reached"
    for it in range(1, wf.max_iterations + 1):
        kernels = r.profile.kernel_profiles()
        shares = bottleneck_shares(kernels, wf.profiling)
        dominant = max(BOTTLENECKS, key=lambda c: shares[c])
        top = sorted(kernels, key=lambda k: -k.duration_ms)[:3]
        step = WorkflowStep(
            iteration=it,
            latency_ms=r.latency_ms,
            throughput=r.throughput,
            floor_ms=r.roofline_floor_ms,
            bottleneck=dominant,
            shares=shares,
            top_kernels=[(k.name, k.duration_ms, k.bound or "") for k in top],
        )
        steps.append(step)
        if _met(wf, r.latency_ms, r.throughput):
            step.decision = stop = "target met"
            break
        # the remedy for the dominant class first, then those of the other classes by share
        order = [dominant] + sorted(
            (c for c in BOTTLENECKS if c != dominant), key=lambda c: -shares[c]
        )
        todo = [
            m
            for c in order
            for m in REMEDIES[c]
            if m not in tried and (m != "autotune" or have_autotune)
        ]
        if not todo:
            step.decision = stop = f"no optimisation left for {dominant}" + (
                "" if have_autotune else " (auto-tuning not available)"
            )
            break
        rec = _top_recommendation(r.profile) if wf.profiling.enable_kernel_profiling else None
        if rec is not None:
            step.recommendation = (
                f"{rec.title} ({rec.category or 'kernel'}, est. "
                f"{100 * rec.estimated_improvement:.1f}%)"
            )
            pick = _REMEDY_OF_CATEGORY.get(rec.category)
            # the profiler's top recommendation wins among the dominant class's remedies
            if pick in todo and pick in REMEDIES[dominant]:
                todo.remove(pick)
                todo.insert(0, pick)
        name = todo[0]
        tried.add(name)
        step.applied = name
        new_schedules = schedules
        if name == "autotune":
            new = graph
            tuned, _ = autotune_schedules(graph, spec, seed=seed)
            new_schedules = {**schedules, **tuned}
        else:
            new = apply_optimisation(name, graph, spec, wf.calibration_batches, seed)
            new_schedules = _schedules_for(new, spec, schedules)
        r2 = _measure(new, spec, seed, new_schedules)
        step.after_ms, step.after_floor_ms = r2.latency_ms, r2.roofline_floor_ms
        step.gain = r.latency_ms / r2.latency_ms
        if wf.verify and name != "autotune":
            step.agreement = functional_agreement(
                original,
                [*applied, name],
                spec=spec,
                layers=wf.verify_layers,
                calibration_batches=wf.calibration_batches,
                seed=seed,
            )
        if step.agreement is not None and not step.agreement.cosine >= wf.min_cosine:
            step.decision = (
                f"reverted: cosine {step.agreement.cosine:.5f} < {wf.min_cosine} on "
                f"{step.agreement.model}"
            )
            continue
        if step.gain < 1 + wf.convergence_threshold:
            step.decision = stop = (
                f"converged: {name} gains {100 * (step.gain - 1):.2f}% < "
                f"{100 * wf.convergence_threshold:g}% (reverted)"
            )
            break
        step.decision = "kept"
        graph, r, schedules = new, r2, new_schedules
        applied.append(name)
    else:
        if _met(wf, r.latency_ms, r.throughput):
            stop = "target met"
    return WorkflowResult(
        steps=steps,
        graph=graph,
        baseline_ms=base_ms,
        final_ms=r.latency_ms,
        final_floor_ms=r.roofline_floor_ms,
        target_met=_met(wf, r.latency_ms, r.throughput),
        stop_reason=stop,
        applied=applied,
        schedules=schedules,
    )
