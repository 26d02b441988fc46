"""``benchmark_operation``: measure an operation many times, the seed's way (8.8).

An operation is either

* an **emulator workload**: a builder name (``"gemm"``, ``"bert-base"``), an ``.onnx``
  path or a :class:`~wia_hw.Graph`, run with ``ctx.run`` every iteration, or a callable
  taking the context (``lambda ctx: ctx.run(...)``). Each iteration's time is the
  device time it took (``ctx.device.now`` after minus before, in cycles, reported in
  ms with the spec's clock); every iteration runs on the same context, so caches and
  the die temperature carry over from one to the next. The temperature, power and
  clock come from the emulator's power and thermal model (every kernel's record).
* a **plain Python callable** (``ctx`` is ``None``), timed in host wall time with
  ``time.perf_counter_ns``: calibrated inner loops, so that each sample lasts at least
  ``min_sample_time_ms``, and the garbage collector off while a sample runs (pyperf,
  criterion and ``timeit`` do the same).
"""

from __future__ import annotations

import gc
import math
import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._version import __version__
from ..graph import Graph
from ..optimize._autotune import AutotuneResult
from ..optimize._schedules import AutotuneError
from ..runtime import Context, OpTime, RunResult, open_device, resolve_workload
from ._baseline import spec_hash
from ._config import BenchmarkConfig, BenchmarkError
from ._result import BenchmarkResult, EnvironmentalData, summarize
from ._variation import install, uninstall

__all__ = [
    "benchmark_operation",
    "benchmark_model",
    "ModelBenchmark",
    "workload_key",
    "host_identity",
]

_MAX_INNER_LOOPS = 10**9


def workload_key(graph: Graph) -> str:
    """The name a workload's baselines are kept under: its name and builder parameters,
    e.g. ``gemm(K=256, M=256, N=256, batch=1, precision=fp16)``."""
    ps = ", ".join(f"{k}={v}" for k, v in sorted(graph.params.items()) if k != "model")
    return f"{graph.name}({ps})" if ps else graph.name


def host_identity() -> tuple[str, str]:
    """``("host", hash)`` for wall-time results: the hash of machine, processor and
    Python implementation and version."""
    desc = {
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
    return "host", spec_hash(desc)


class _Watcher:
    """A Context observer that keeps every kernel record of the runs it sees."""

    wants_trace = False

    def __init__(self) -> None:
        self.records: list[Any] = []

    def run_begin(self, ctx: Any, graph: Any, lowered: Any) -> None:
        pass

    def op_begin(self, op: Any, kernels: Any, cycle: int) -> None:
        pass

    def op_end(self, op: Any, records: Any, cycle: int) -> None:
        self.records.extend(records)

    def run_end(self, result: Any, trace: Any) -> None:
        pass


@dataclass
class _Iteration:
    ms: float
    temp_start_c: float
    temp_end_c: float
    temp_min_c: float
    temp_max_c: float
    power_w: float
    freq_cycles: float  # sum of factor x cycles over the kernels
    cycles: int  # sum of kernel cycles
    min_factor: float


def _emulator_iteration(
    ctx: Context, fn: Callable[[Context], Any], watcher: _Watcher, reset_temp_c: float | None
) -> tuple[_Iteration, Any]:
    dev = ctx.device
    if reset_temp_c is not None:
        dev.thermal.temperature_c = reset_temp_c
    t0, e0, temp0 = dev.now, dev.counters.energy_pj, dev.thermal.temperature_c
    watcher.records.clear()
    out = fn(ctx)
    cycles = dev.now - t0
    if cycles <= 0:
        raise BenchmarkError(
            "the operation took no device time (0 cycles): a callable "
            "given with a context must run work on it (ctx.run(...)); "
            "pass ctx=None to time a plain callable in wall time"
        )
    seconds = cycles / ctx.spec.clock_hz
    recs = watcher.records
    temps = [temp0, dev.thermal.temperature_c] + [r.temperature_c for r in recs]
    return _Iteration(
        ms=ctx.spec.cycles_to_ms(cycles),
        temp_start_c=temp0,
        temp_end_c=dev.thermal.temperature_c,
        temp_min_c=min(temps),
        temp_max_c=max(temps),
        power_w=(dev.counters.energy_pj - e0) * 1e-12 / seconds,
        freq_cycles=sum(r.frequency_factor * r.cycles for r in recs),
        cycles=sum(r.cycles for r in recs),
        min_factor=min((r.frequency_factor for r in recs), default=1.0),
    ), out


def _environment(
    its: list[_Iteration], cfg: BenchmarkConfig, clock_ghz: float
) -> EnvironmentalData:
    mon = cfg.environmental_monitoring
    kw: dict[str, Any] = {}
    if mon.track_temperature:
        lo, hi = min(i.temp_min_c for i in its), max(i.temp_max_c for i in its)
        kw.update(
            temperature_start_c=float(its[0].temp_start_c),
            temperature_end_c=float(its[-1].temp_end_c),
            temperature_min_c=float(lo),
            temperature_max_c=float(hi),
            temperature_variation=float(hi - lo),
        )
    if mon.track_power:
        kw.update(
            power_mean_w=sum(i.power_w for i in its) / len(its),
            power_max_w=max(i.power_w for i in its),
        )
    if mon.track_frequency:
        cyc = sum(i.cycles for i in its)
        kw.update(
            frequency_mean_ghz=clock_ghz * (sum(i.freq_cycles for i in its) / cyc if cyc else 1.0),
            frequency_min_ghz=clock_ghz * min(i.min_factor for i in its),
            throttled_iterations=sum(1 for i in its if i.min_factor < 1.0),
        )
    return EnvironmentalData(**kw)


def _own_sizes(graph: Graph, workload_kwargs: dict[str, Any]) -> None:
    """Check the workload arguments given with a Graph, and drop them: the ``batch`` and
    ``seq`` it already has (the seed's ``benchmark_model(fused_model, batch_32)`` names
    the batch the model was built at) and those left unset (``None``). A Graph's shapes
    are fixed, so another batch or seq, or any builder argument, is a
    :class:`BenchmarkError` naming the value and the graph's own."""
    for name in ("batch", "seq"):
        want = workload_kwargs.pop(name, None)
        if want is None:
            continue
        own = graph.params.get(name, graph.sequences if name == "batch" else None)
        if own is None:
            raise BenchmarkError(f"graph {graph.name!r} has no {name} to set to {want}")
        if want != own:
            raise BenchmarkError(
                f"graph {graph.name!r} was built at {name} {own}, not {want}: a Graph's "
                f"shapes are fixed (build it at {name} {want}, or give the workload's name)"
            )
    extra = [k for k, v in workload_kwargs.items() if v is not None]
    if extra:
        raise BenchmarkError(
            f"{', '.join(extra)} cannot be applied to graph {graph.name!r}, which is already "
            "built (builder arguments go with a workload name; schedules, mode, seed and "
            "inputs go to the run)"
        )
    workload_kwargs.clear()


def _bench_emulator(
    ctx: Context, operation: Any, cfg: BenchmarkConfig, workload_kwargs: dict[str, Any]
) -> BenchmarkResult:
    params: dict[str, Any] = {}
    if callable(operation) and not isinstance(operation, Graph):
        if workload_kwargs:
            raise BenchmarkError(
                f"workload arguments ({', '.join(workload_kwargs)}) apply "
                "to a workload name or graph, not to a callable"
            )
        fn: Callable[[Context], Any] = operation
        name = getattr(operation, "__qualname__", None) or repr(operation)
    elif isinstance(operation, (str, os.PathLike, Graph)):
        run_kw = {
            k: workload_kwargs.pop(k)
            for k in ("mode", "seed", "inputs", "schedules")
            if k in workload_kwargs
        }
        if isinstance(operation, Graph):
            _own_sizes(operation, workload_kwargs)
        graph = resolve_workload(operation, **workload_kwargs)
        name, params = workload_key(graph), dict(graph.params)

        def fn(c: Context) -> RunResult:
            return c.run(graph, **run_kw)
    else:
        raise TypeError(
            "operation must be a workload name, an .onnx path, a Graph or a "
            f"callable, got {type(operation).__name__}"
        )
    watcher = _Watcher()
    reset = None if "thermal" in cfg.variation_sources else ctx.device.thermal.temperature_c
    last = None
    ports = install(ctx.device.memory, cfg, ctx.spec)
    ctx.observers.append(watcher)
    try:
        for _ in range(cfg.warmup_iterations):
            _emulator_iteration(ctx, fn, watcher, reset)
        its = []
        for _ in range(cfg.measurement_iterations):
            it, last = _emulator_iteration(ctx, fn, watcher, reset)
            its.append(it)
        for _ in range(cfg.cooldown_iterations):
            _emulator_iteration(ctx, fn, watcher, reset)
    finally:
        ctx.observers.remove(watcher)
        refresh_cycles, jitter_cycles = uninstall(ctx.device.memory, ports)
    variation = (
        {"refresh_stall_cycles": refresh_cycles, "jitter_stall_cycles": jitter_cycles}
        if ports
        else {}
    )
    return summarize(
        [i.ms for i in its],
        cfg,
        name=name,
        kind="emulator",
        device=ctx.spec.name,
        spec_hash=spec_hash(ctx.spec),
        tool_version=__version__,
        env=_environment(its, cfg, ctx.spec.clock_ghz),
        params=params,
        variation_cycles=variation,
        last_run=last if isinstance(last, RunResult) else None,
    )


def _time_ns(fn: Callable[[], Any], loops: int) -> int:
    """Wall time of ``loops`` calls of ``fn``, in ns, with the garbage collector off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        return time.perf_counter_ns() - t0
    finally:
        if enabled:
            gc.enable()


def calibrate_loops(fn: Callable[[], Any], min_ns: float) -> int:
    """The inner-loop count that makes one sample of ``fn`` last at least ``min_ns``:
    grows from 1 (tenfold while a sample reads 0 ns, else scaled to the target with 10 %
    margin) until one measured sample reaches it."""
    loops = 1
    while True:
        t = _time_ns(fn, loops)
        if t >= min_ns or loops >= _MAX_INNER_LOOPS:
            return loops
        grow = 10 * loops if t == 0 else math.ceil(loops * 1.1 * min_ns / t)
        loops = min(_MAX_INNER_LOOPS, max(loops + 1, grow))


def _bench_wall(
    fn: Callable[[], Any], cfg: BenchmarkConfig, workload_kwargs: dict[str, Any]
) -> BenchmarkResult:
    if not callable(fn):
        raise TypeError(
            "without a context, operation must be a callable taking no "
            f"arguments, got {type(fn).__name__}"
        )
    if workload_kwargs:
        raise BenchmarkError(
            f"workload arguments ({', '.join(workload_kwargs)}) need a "
            "context: benchmark_operation(ctx, workload, ...)"
        )
    min_ns = cfg.min_sample_time_ms * 1e6
    loops = calibrate_loops(fn, min_ns)
    for _ in range(cfg.warmup_iterations):
        _time_ns(fn, loops)
    raw = [_time_ns(fn, loops) / loops / 1e6 for _ in range(cfg.measurement_iterations)]
    for _ in range(cfg.cooldown_iterations):
        _time_ns(fn, loops)
    device, h = host_identity()
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return summarize(
        raw,
        cfg,
        name=name,
        kind="wall",
        device=device,
        spec_hash=h,
        tool_version=__version__,
        env=EnvironmentalData(),
        inner_loops=loops,
    )


def benchmark_operation(
    ctx: Context | None, operation: Any, cfg: BenchmarkConfig | None = None, **workload_kwargs: Any
) -> BenchmarkResult:
    """Benchmark ``operation`` under ``cfg`` (default :class:`BenchmarkConfig`).

    With a :class:`~wia_hw.Context`, ``operation`` is a workload (builder name, ``.onnx``
    path, :class:`~wia_hw.Graph`; ``workload_kwargs`` such as ``batch``, ``seq``, ``M``
    go to its builder, and a Graph takes only its own ``batch`` and ``seq``;
    ``mode``/``seed``/``inputs``/``schedules`` go to ``ctx.run``) or a callable taking
    the context; each sample is the device time of one iteration. With ``ctx=None``,
    ``operation`` is a callable taking no arguments, timed in wall time. Warm-up,
    measured and cool-down iterations run in that order; outliers are removed before
    the statistics (see :class:`BenchmarkResult`). Raises :class:`BenchmarkError` on bad
    input (a callable that takes no device time, workload arguments with a callable, a
    Graph given another batch or seq than its own, or builder arguments).
    """
    cfg = BenchmarkConfig() if cfg is None else cfg
    if not isinstance(cfg, BenchmarkConfig):
        raise TypeError(f"cfg must be a BenchmarkConfig, got {type(cfg).__name__}")
    if ctx is None:
        return _bench_wall(operation, cfg, workload_kwargs)
    if not isinstance(ctx, Context):
        raise TypeError(f"ctx must be a wia_hw.Context or None, got {type(ctx).__name__}")
    return _bench_emulator(ctx, operation, cfg, dict(workload_kwargs))


@dataclass
class ModelBenchmark:
    """What the seed's ``wia_benchmark_model`` returns (section 8.7): the median latency
    over the measured runs, the throughput at it (sequences per second), and the last
    run's operation breakdown; ``benchmark`` holds the statistics, ``run`` that run."""

    latency_ms: float
    throughput: float
    ops: list[OpTime]
    benchmark: BenchmarkResult
    run: RunResult = field(repr=False)

    @property
    def num_operations(self) -> int:
        return len(self.ops)


def benchmark_model(
    model: str | os.PathLike[str] | Graph | AutotuneResult,
    batch: int | None = None,
    *,
    seq: int | None = None,
    device: Any = None,
    ctx: Context | None = None,
    cfg: BenchmarkConfig | None = None,
    schedules: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    **workload_kwargs: Any,
) -> ModelBenchmark:
    """The seed's ``wia_benchmark_model(model, batch)``: benchmark a model on a device
    (``ctx``, else a fresh context on ``device``, default ``wia-npu``) and report
    latency, throughput and the breakdown. ``cfg`` defaults to 1 warm-up and 3 measured
    runs without cool-down (the emulator is deterministic; more runs matter only with
    variation sources that vary).

    ``model``: a workload name (built at ``batch``, ``seq`` and ``workload_kwargs``), an
    ``.onnx`` path, a :class:`~wia_hw.Graph` (``batch``/``seq``, when given, must be
    the graph's own: its shapes are fixed), or the :class:`~wia_hw.AutotuneResult` of
    :func:`~wia_hw.autotune_model` (the seed's ``tuned_model``): its graph run with its
    schedules, on the spec it was tuned on unless ``device``/``ctx`` say otherwise (a
    different spec is refused), with the extensions of the context it was tuned on
    (registered on the context opened here; a ``ctx`` given must have the same, else it
    is refused: they choose which ops the tuned kernels run). ``schedules``: tuned GEMM
    tilings, a schedule file or a mapping by kernel key, as :func:`wia_hw.run` takes
    them. Bad input raises :class:`BenchmarkError` (one line)."""
    if isinstance(model, AutotuneResult):
        if schedules is not None:
            raise BenchmarkError(
                "benchmark_model: schedules= was given with an AutotuneResult, which "
                "carries its own (result.schedules); to run others, pass result.workload"
            )
        if model.workload is None or model.spec is None:
            raise BenchmarkError(
                "benchmark_model: the AutotuneResult holds no graph (not made by "
                "autotune_model): pass the graph with schedules=result.schedules"
            )
        fresh = ctx is None
        if fresh:
            ctx = open_device(model.spec if device is None else device)
        why = model.mismatch(ctx.spec)
        if why is None and fresh:  # the tuning context's extensions, registered again
            try:
                model.register_extensions(ctx)
            except AutotuneError as exc:
                raise BenchmarkError(f"benchmark_model: {exc}") from None
        why = why or model.mismatch(ctx)
        if why is not None:
            raise BenchmarkError(f"benchmark_model: {why}")
        model, schedules = model.workload, model.schedules
    cfg = cfg or BenchmarkConfig(
        warmup_iterations=1, measurement_iterations=3, cooldown_iterations=0
    )
    ctx = ctx if ctx is not None else open_device("wia-npu" if device is None else device)
    if schedules is not None:
        workload_kwargs["schedules"] = schedules
    res = benchmark_operation(ctx, model, cfg, batch=batch, seq=seq, **workload_kwargs)
    run = res.last_run
    return ModelBenchmark(
        latency_ms=res.median_ms,
        throughput=run.sequences / (res.median_ms * 1e-3),
        ops=list(run.ops),
        benchmark=res,
        run=run,
    )
