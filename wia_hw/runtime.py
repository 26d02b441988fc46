"""The runtime: open a device, run a workload on it, get a :class:`RunResult`.

``wia_hw.open_device(spec, overrides=...)`` gives a :class:`Context` (the seed's
``ctx``): one emulated device that keeps its state (time, caches, temperature)
between runs. ``ctx.run(workload, ...)`` builds or imports the workload graph, lowers
it to kernels, executes them on the emulator and reports; ``wia_hw.run(...)`` does the
same on a fresh context.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._functional import FunctionalExecutor
from ._memory_plan import AllocInfo, DeviceBuffer, RunMemory
from .emulator.allocator import CachingAllocator
from .emulator.config import ClusterSpec, DeviceSpec
from .emulator.counters import Counters
from .emulator.device import Device, KernelRecord, TraceLog
from .emulator.errors import SpecError, WorkloadError
from .emulator.extension_kernels import execute_kernels, extension_summary
from .emulator.kernels import GemmKernel, MemoryKernel
from .emulator.power import ThermalWarning
from .graph import Graph, Op
from .lowering import Provider, Storage, gemm_key, lower
from .spec import DEFAULT_DEVICE, load_spec

__all__ = [
    "Context",
    "open_device",
    "run",
    "RunResult",
    "OpTime",
    "KernelTime",
    "resolve_workload",
    "MODES",
    "JSON_SCHEMA_VERSION",
    "spec_sha256",
]

MODES = ("timing", "functional")
JSON_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class OpTime:
    """One row of the seed's section 8.7 breakdown: a group of ops, its time and share."""

    name: str
    time_ms: float
    pct: float
    flops: int = 0
    count: int = 0


@dataclass(frozen=True)
class KernelTime:
    """One kernel of a run: where it ran, how long, and its counters."""

    name: str
    op: str
    group: str
    kind: str
    provider: str
    precision: str
    start_ms: float
    time_ms: float
    cycles: int
    flops: int
    macs: int
    tiles: int
    cores_used: int
    compute_utilization: float  # percent of the precision's peak
    counters: Counters
    record: KernelRecord = field(repr=False, compare=False)
    #: the kernel as lowered and launched, and the device's resolved spec (overrides and
    #: extensions applied): what ``profile_kernel`` and ``Roofline.add_report`` need for
    #: the kernel's floors; ``None`` for a kernel read back from JSON
    kernel: Any = field(default=None, repr=False, compare=False)
    spec: DeviceSpec | None = field(default=None, repr=False, compare=False)


@dataclass
class RunResult:
    """The outcome of one run. Times in ms, utilisation in percent, counters raw."""

    workload: str
    device: str
    precision: str
    mode: str
    seed: int
    params: dict[str, Any]
    sequences: int
    latency_ms: float
    throughput: float  # sequences (samples) per second
    cycles: int
    clock_ghz: float
    flops: int
    # the array's peak at the run's precision; for GEMMs at several precisions, the
    # blend of their peaks (DeviceSpec.blended_peak_flops)
    peak_tflops: float
    compute_utilization: float  # percent of peak over the whole run
    ops: list[OpTime]  # the seed's 8.7 breakdown, by op group
    op_times: list[OpTime]  # every graph op
    kernels: list[KernelTime]
    counters: Counters
    energy_j: float
    avg_power_w: float
    peak_temperature_c: float
    roofline_floor_ms: float
    outputs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    trace: TraceLog | None = field(default=None, repr=False)  # TraceEvents, with trace=True
    #: The ProfilingReport when the run was made with ``run(..., profile=cfg)``.
    profile: Any = field(default=None, repr=False)
    #: Per extension that ran kernels: ``kernels``, ``cycles`` and the figures its
    #: kernels report (PIM offload: ``saved_hbm_bytes``, ``saved_cycles``...).
    extensions: dict[str, dict[str, float]] = field(default_factory=dict)
    #: What produced the run (:meth:`Context.provenance` plus ``run``: the workload
    #: and its arguments as given); ``wia-hw run --replay`` re-runs it from this.
    provenance: dict[str, Any] = field(default_factory=dict)
    #: the device's resolved spec (overrides and extensions applied); not serialised
    spec: DeviceSpec | None = field(default=None, repr=False, compare=False)

    @property
    def achieved_tflops(self) -> float:
        return self.flops / (self.latency_ms * 1e-3) / 1e12 if self.latency_ms else 0.0

    @property
    def memory_bandwidth_gbs(self) -> float:
        """Average HBM bandwidth over the run."""
        return (
            self.counters.bytes["hbm"] / (self.latency_ms * 1e-3) / 1e9 if self.latency_ms else 0.0
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (schema ``wia-hw.run/1``): plain types only."""
        return {
            "schema": f"wia-hw.run/{JSON_SCHEMA_VERSION}",
            "workload": self.workload,
            "device": self.device,
            "precision": self.precision,
            "mode": self.mode,
            "seed": self.seed,
            "params": self.params,
            "sequences": self.sequences,
            "latency_ms": self.latency_ms,
            "throughput": self.throughput,
            "cycles": self.cycles,
            "clock_ghz": self.clock_ghz,
            "flops": self.flops,
            "peak_tflops": self.peak_tflops,
            "achieved_tflops": self.achieved_tflops,
            "compute_utilization": self.compute_utilization,
            "memory_bandwidth_gbs": self.memory_bandwidth_gbs,
            "roofline_floor_ms": self.roofline_floor_ms,
            "energy_j": self.energy_j,
            "avg_power_w": self.avg_power_w,
            "peak_temperature_c": self.peak_temperature_c,
            "ops": [vars(o) for o in self.ops],
            "op_times": [vars(o) for o in self.op_times],
            "kernels": [
                {
                    k: (v.to_dict() if isinstance(v, Counters) else v)
                    for k, v in vars(kt).items()
                    if k not in ("record", "kernel", "spec")
                }
                for kt in self.kernels
            ],
            "counters": self.counters.to_dict(),
            "extensions": self.extensions,
            "provenance": self.provenance,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)


def resolve_workload(workload: str | os.PathLike[str] | Graph, **kwargs: Any) -> Graph:
    """A graph from a builder name (``"bert-large"``), an ``.onnx`` path, a SCALE-Sim
    topology ``.csv`` (:mod:`wia_hw.scalesim`), or a Graph."""
    if isinstance(workload, Graph):
        unused = {k: v for k, v in kwargs.items() if v is not None}
        if unused:
            raise WorkloadError(
                f"workload is a Graph: {', '.join(unused)} cannot be applied "
                "to it (build the graph with them instead)"
            )
        return workload
    from . import workloads

    text = os.fspath(workload)
    if text.lower().endswith(".csv"):  # a SCALE-Sim topology
        from .scalesim import read_topology

        extra = [k for k, v in kwargs.items() if v is not None and k != "batch"]
        if extra:
            raise WorkloadError(
                f"{text}: {', '.join(extra)} does not apply to a SCALE-Sim topology "
                "(its layers fix every size; batch sets the images per conv layer)"
            )
        batch = kwargs.get("batch")
        return read_topology(text, **({"batch": batch} if batch is not None else {}))
    if text.lower().endswith(".onnx"):
        # batch and seq as the builders take them; any other argument (-a NAME=N) fixes
        # the model's symbolic input dim NAME; precision casts its float tensors
        given = {k: v for k, v in kwargs.items() if v is not None}
        precision = given.pop("precision", None)
        onnx_kw = {k: given.pop(k) for k in ("batch", "seq") if k in given}
        if given:
            onnx_kw["dims"] = given
        graph = workloads.build(text, **onnx_kw)
        if precision is None:
            return graph
        if precision == "int8":
            raise WorkloadError(
                f"{text}: precision int8 needs the model's quantisation: import a "
                "quantised ONNX model (QuantizeLinear/DequantizeLinear, QLinear*), or "
                "quantise this one with wia_hw.optimize.quantize_model and calibration data"
            )
        return graph.with_float_dtype(precision)
    return workloads.build(text, **{k: v for k, v in kwargs.items() if v is not None})


class Context:
    """One emulated device (the seed's ``ctx``). Keeps state between runs."""

    def __init__(self, spec: DeviceSpec, *, seed: int = 0) -> None:
        if isinstance(spec, ClusterSpec):
            raise SpecError(
                f"{spec.name!r} is a cluster spec; a context opens one device "
                f"(its device is {spec.device.name!r})"
            )
        self.spec = spec
        self.seed = _check_seed(seed)
        #: How the spec was given (built-in name or path; the spec's name for an
        #: object) and the ``--set`` overrides applied to it (:func:`open_device`).
        self.spec_source: str = spec.name
        #: The spec file's absolute path when the spec was read from a file, so that a
        #: replay from another folder reads the same file (:func:`open_device`).
        self.spec_file: Path | None = None
        self.overrides: dict[str, Any] = {}
        self.device = Device(spec)
        self.providers: dict[str, tuple[str, Provider]] = {}
        self.extensions: dict[str, Any] = {}
        #: Device memory (HBM): weights, activations, workspaces and ctx.allocate().
        self.allocator = CachingAllocator(spec.memory.hbm.size_bytes)
        #: Profilers watching runs (wia_hw.profiling): each has ``wants_trace`` and
        #: ``run_begin(ctx, graph, lowered)``, ``op_begin(op, kernels, cycle)``,
        #: ``op_end(op, records, cycle)``, ``run_end(result, trace)``.
        self.observers: list[Any] = []
        self._run_memory: RunMemory | None = None
        #: every tensor the runs on this device have named: shape and dtype
        self._tensor_shapes: dict[str, tuple] = {}
        #: the tensors named by the runs of the current same_program block (None: none)
        self._program: set[str] | None = None

    def __repr__(self) -> str:
        return f"Context({self.spec.name!r}, now={self.device.now} cycles)"

    def provenance(self) -> dict[str, Any]:
        """The spec as used, in plain types: ``spec`` (name or path as given),
        ``spec_path`` (the file's absolute path, for a spec read from a file),
        ``overrides``, ``extensions`` (id, version, source, parameters, the sha256 of
        their manifest and module files, in registration order:
        :func:`_extension_provenance`), ``spec_sha256`` (of the resolved spec,
        :func:`spec_sha256`), ``peaks`` (clock, peak TFLOPS per precision and HBM GB/s
        of the resolved spec), the ``wia_hw_version`` and the context's ``seed``."""
        from ._version import __version__

        spec = self.spec
        where = {} if self.spec_file is None else {"spec_path": str(self.spec_file)}
        return {
            "spec": self.spec_source,
            **where,
            "device": spec.name,
            "overrides": dict(self.overrides),
            # a unit registered by a direct call (pim_execute, ...) claims no graph op:
            # a replay that registered it would reroute the graph
            "extensions": [
                _extension_provenance(e)
                for e in self.extensions.values()
                if not getattr(e, "direct", False)
            ],
            "spec_sha256": spec_sha256(spec),
            "peaks": {
                "clock_ghz": spec.clock_ghz,
                "peak_tflops": {
                    p: spec.peak_flops(p) / 1e12 for p in spec.compute.array.macs_per_pe_cycle
                },
                "hbm_bandwidth_gbs": spec.peak_bandwidth_gbs,
            },
            "wia_hw_version": __version__,
            "seed": self.seed,
        }

    @contextlib.contextmanager
    def same_program(self) -> Iterator[None]:
        """Runs inside the block are one program at several lengths (a prefill and its
        decode steps): a tensor an earlier run of the block named keeps its storage when
        it shrinks, as the program's buffers are reused, instead of being taken as
        another tensor (the default: see :func:`_release_other_tensors`). One that grows
        past it (the KV cache, one position longer each step) is laid out again at its
        new size: mapped onto the old storage, a decode step at 1,000 cached tokens read
        277 MB from HBM, less than its 297 MB of KV cache."""
        before = self._program
        self._program = set() if before is None else before
        try:
            yield
        finally:
            self._program = before

    def allocate(self, nbytes: int, *, tag: str = "user") -> DeviceBuffer:
        """A device buffer of ``nbytes`` from the caching allocator.

        Synchronous with the device: when the request needs a new segment the device
        waits ``allocator.config.segment_alloc_cycles``. Raises ``DeviceOutOfMemory``
        when it does not fit, ``TypeError``/``ValueError`` on a bad size.
        """
        info = AllocInfo("user", tag)
        blk, cycles = self.allocator.malloc(nbytes, now=self.device.now, tag=tag, info=info)
        self.device.idle(cycles)
        buf = DeviceBuffer(blk, nbytes, tag)
        info.handle = weakref.ref(buf)
        return buf

    def free(self, buffer: DeviceBuffer) -> None:
        """Give ``buffer`` back to the allocator (its cache); raises ValueError when it
        was freed already."""
        if not isinstance(buffer, DeviceBuffer):
            raise TypeError(f"free() takes a DeviceBuffer, got {type(buffer).__name__}")
        if buffer._block.id != buffer.id or buffer._block.free:
            raise ValueError(f"{buffer!r} is not allocated here (freed already?)")
        self.device.idle(self.allocator.free(buffer._block, now=self.device.now))

    def run(
        self,
        workload: str | os.PathLike[str] | Graph,
        *,
        batch: int | None = None,
        seq: int | None = None,
        precision: str | None = None,
        mode: str = "timing",
        seed: int | None = None,
        inputs: Mapping[str, np.ndarray] | None = None,
        trace: bool = False,
        progress: Callable[[int, int, str], None] | None = None,
        schedules: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        **workload_kwargs: Any,
    ) -> RunResult:
        """Run a workload on this context's device (it keeps its state: caches, memory,
        temperature, clock; :func:`wia_hw.run` opens a fresh one). ``workload``,
        ``batch``, ``seq``, ``precision``, ``mode`` and the builder's keyword arguments
        are :func:`wia_hw.run`'s; ``seed`` defaults to the context's. ``inputs``:
        ``{name: array}`` values of inputs and weights (functional mode). ``trace``: keep
        the per-tile trace. ``progress``: ``(ops done, ops in all, op name)`` after each
        op. ``schedules``: a file of tuned GEMM schedules
        (:func:`wia_hw.optimize.autotune_model`; entries of this spec apply, others are
        ignored) or a mapping of them by kernel key."""
        if mode not in MODES:
            raise WorkloadError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        seed = self.seed if seed is None else _check_seed(seed)
        invocation = {
            "workload": workload.name if isinstance(workload, Graph) else os.fspath(workload),
            "replayable": not isinstance(workload, Graph)
            and not inputs
            and not isinstance(schedules, Mapping),
            "batch": batch,
            "seq": seq,
            "precision": precision,
            "mode": mode,
            "seed": seed,
            "kwargs": dict(workload_kwargs),
            "start_cycle": self.device.now,
        }
        # a model or schedules file: where it was and what it held, so that a replay
        # from another folder reads it there, and one of an edited file is refused
        # rather than run on other content
        if not isinstance(workload, Graph):
            invocation.update(workload_file_provenance(workload))
        if isinstance(schedules, (str, os.PathLike)):
            invocation["schedules"] = os.fspath(schedules)
            invocation.update(file_provenance("schedules", schedules))
        graph = resolve_workload(
            workload, batch=batch, seq=seq, precision=precision, **workload_kwargs
        )
        if schedules is not None:
            from .optimize._schedules import check_schedules, load_schedules

            if isinstance(schedules, (str, os.PathLike)):
                schedules = load_schedules(schedules, self.spec)
            else:  # a mapping (or a wrong type), checked as a file's entries are
                schedules = check_schedules(schedules, self.spec)
        lowered = lower(graph, self.spec, self.providers, schedules)
        if schedules:  # which tuned tilings this graph used: none is worth saying
            keys = {gemm_key(k) for _, ks in lowered for k in ks if isinstance(k, GemmKernel)}
            invocation["schedules_used"] = used = len(keys & set(schedules))
            if not used:
                from .optimize._schedules import ScheduleUnusedWarning

                warnings.warn(
                    f"none of the {len(schedules)} tuned tiling(s) for {self.spec.name!r} "
                    f"matches a GEMM kernel of {graph.name!r} (tuned for another model or "
                    "shape?): the run uses the default tilings",
                    ScheduleUnusedWarning,
                    stacklevel=2,
                )
        dev = self.device
        _release_other_tensors(dev.memory, graph, self._tensor_shapes, self._program)
        obs = tuple(self.observers)
        dev.trace = [] if trace or any(o.wants_trace for o in obs) else None
        if self._run_memory is not None and not self._run_memory.done:
            self._run_memory.finish(dev.now)  # a previous run raised: release its memory
        mem = self._run_memory = RunMemory(self.allocator, graph, lowered)
        mem.start(dev.now)
        for o in obs:
            o.run_begin(self, graph, lowered)
        start = dev.now
        start_c = dev.thermal.temperature_c
        before = dev.counters.copy()
        host_l2 = self.spec.memory.host_io == "l2"
        if host_l2:
            _host_writes_inputs(dev, graph)
        on_chip = _on_chip_bytes(dev)  # a warm device: what need not cross HBM again
        records: list[tuple[str, str, KernelRecord]] = []
        launched: list[Any] = []  # the kernel of each record, as lowered
        fx = FunctionalExecutor(graph, seed, inputs, keep=()) if mode == "functional" else None
        op_cycles: dict[str, int] = {}
        for idx, (op, kernels) in enumerate(lowered):
            if progress is not None:
                progress(idx, len(lowered), op.name)
            t0 = dev.now
            mem.before_op(idx, t0)
            for o in obs:
                o.op_begin(op, kernels, t0)
            recs = execute_kernels(dev, kernels)  # extension kernels run themselves
            launched.extend(kernels)
            for rec in recs:
                records.append((op.name, op.group, rec))
            for o in obs:
                o.op_end(op, recs, dev.now)
            mem.after_op(idx, dev.now)
            op_cycles[op.name] = dev.now - t0
            if fx is not None:
                fx.step(op, kernels, dev)  # GEMMs run over the device's own tiles
        if progress is not None:
            progress(len(lowered), len(lowered), "")
        if not host_l2:  # the results go back to HBM (host_io l2: the host reads L2)
            dev.flush()
        mem.finish(dev.now)
        total = dev.now - start
        delta = dev.counters.delta(before)
        result = self._report(
            graph,
            records,
            op_cycles,
            total,
            delta,
            mode,
            seed,
            floor_bytes=compulsory_hbm_bytes(graph, lowered, on_chip, outputs=not host_l2),
            launched=launched,
            start_temperature_c=start_c,
        )
        result.extensions = extension_summary([r for _, _, r in records])
        result.provenance = dict(self.provenance(), run=invocation)
        result.spec = self.spec
        if fx is not None:
            result.outputs = fx.outputs()
        result.trace = dev.trace if trace else None
        for o in obs:
            o.run_end(result, dev.trace)
        dev.trace = None
        return result

    # -- report ----------------------------------------------------------------------
    def _report(
        self,
        graph: Graph,
        records: list[tuple[str, str, KernelRecord]],
        op_cycles: dict[str, int],
        total: int,
        delta: Counters,
        mode: str,
        seed: int,
        *,
        floor_bytes: int = 0,
        launched: list[Any] | None = None,
        start_temperature_c: float | None = None,
    ) -> RunResult:
        spec = self.spec
        to_ms = spec.cycles_to_ms
        precision = graph.params.get("precision") or _dominant_precision(records)
        latency_ms = to_ms(total)
        groups: dict[str, list[int]] = {}
        flops_by_op: dict[str, int] = {}
        for op in graph.ops:
            flops_by_op[op.name] = graph.flops(op)
            g = groups.setdefault(op.group, [0, 0, 0])
            g[0] += op_cycles.get(op.name, 0)
            g[1] += flops_by_op[op.name]
            g[2] += 1
        tail = total - sum(op_cycles.values())  # final write-back of results
        if tail:
            g = groups.setdefault("writeback", [0, 0, 0])
            g[0] += tail

        def pct(c: int) -> float:
            return 100.0 * c / total if total else 0.0

        ops = sorted(
            (OpTime(n, to_ms(c), pct(c), f, cnt) for n, (c, f, cnt) in groups.items()),
            key=lambda o: (-o.time_ms, o.name),
        )
        op_times = [
            OpTime(
                op.name,
                to_ms(op_cycles.get(op.name, 0)),
                pct(op_cycles.get(op.name, 0)),
                flops_by_op[op.name],
                1,
            )
            for op in graph.ops
        ]
        kernels = []
        for i, (_opname, _group, r) in enumerate(records):
            peak = (
                float(spec.peak_macs_per_cycle(r.precision)) * 2
                if spec.supports(r.precision)
                else 0.0
            )
            util = 100.0 * r.flops / (r.cycles * peak) if r.cycles and peak else 0.0
            kernels.append(
                KernelTime(
                    name=r.name,
                    op=r.op,
                    group=r.group,
                    kind=r.kind,
                    provider=r.provider,
                    precision=r.precision,
                    start_ms=to_ms(r.start_cycle - records[0][2].start_cycle),
                    time_ms=to_ms(r.cycles),
                    cycles=r.cycles,
                    flops=r.flops,
                    macs=r.macs,
                    tiles=r.tiles,
                    cores_used=r.cores_used,
                    compute_utilization=util,
                    counters=r.counters,
                    record=r,
                    kernel=launched[i] if launched else None,
                    spec=spec,
                )
            )
        # the FLOPs the array executed, against its peak: not the MACs done on attached
        # units (photonic, analog), nor those an extension skipped (a sparse unit's
        # dense_macs less its executed_macs)
        flops = graph.flops() - sum(
            r.flops
            if r.kind in ("photonic", "analog")
            else 2 * (r.extra.get("dense_macs", 0) - r.extra.get("executed_macs", 0))
            for _, _, r in records
        )
        prec_for_peak = precision if spec.supports(precision) else "fp16"
        # the array's peak for this mix: GEMMs at their own precision (a mixed-precision
        # graph's fp32 and int8 parts each at their peak), the rest at the run's
        by_prec: dict[str, float] = {}
        for _, _, r in records:
            if r.kind == "gemm" and spec.supports(r.precision):
                by_prec[r.precision] = by_prec.get(r.precision, 0) + r.flops
        rest = flops - sum(by_prec.values())
        if rest > 0 or not by_prec:
            by_prec[prec_for_peak] = by_prec.get(prec_for_peak, 0) + max(rest, 0)
        peak = (
            spec.blended_peak_flops(by_prec) or spec.peak_flops(prec_for_peak)
            if spec.supports(prec_for_peak)
            else 0.0
        )
        # the floor: the graph's FLOPs at peak, its compulsory HBM traffic at peak
        # bandwidth (from the graph, never the simulated bytes)
        floor_s = max(flops / peak if peak else 0.0, floor_bytes / (spec.peak_bandwidth_gbs * 1e9))
        seconds = latency_ms * 1e-3
        # the peak over the run: its start (a die that cools from a hot start peaks
        # there), every kernel's end and its end
        thermal = self.device.thermal
        start_c = thermal.temperature_c if start_temperature_c is None else start_temperature_c
        peak_c = max([start_c, thermal.temperature_c] + [r.temperature_c for _, _, r in records])
        # the power drawn throttled: the throttled kernels' (the run's when none was)
        hot = [r for _, _, r in records if r.frequency_factor < 1.0]
        hot_s = sum(r.cycles for r in hot) / spec.clock_hz
        if hot_s:
            power_w = sum(r.counters.energy_pj for r in hot) * 1e-12 / hot_s
            power_of = "its throttled kernels' mean power"
        else:
            power_w = delta.energy_j / seconds if seconds else 0.0
            power_of = "the run's mean power"
        msg = thermal.excursion_warning(
            f"{graph.name} on {spec.name}", start_c, peak_c, power_w, power_of
        )
        if msg is not None:
            warnings.warn(msg, ThermalWarning, stacklevel=3)
        return RunResult(
            workload=graph.name,
            device=spec.name,
            precision=precision,
            mode=mode,
            seed=seed,
            params=dict(graph.params),
            sequences=graph.sequences,
            latency_ms=latency_ms,
            throughput=graph.sequences / seconds if seconds else 0.0,
            cycles=total,
            clock_ghz=spec.clock_ghz,
            flops=flops,
            peak_tflops=peak / 1e12,
            compute_utilization=100.0 * flops / (peak * seconds) if peak and seconds else 0.0,
            ops=ops,
            op_times=op_times,
            kernels=kernels,
            counters=delta,
            energy_j=delta.energy_j,
            avg_power_w=delta.energy_j / seconds if seconds else 0.0,
            peak_temperature_c=peak_c,
            roofline_floor_ms=floor_s * 1e3,
        )


def compulsory_hbm_bytes(
    graph: Graph,
    lowered: list[tuple[Op, list[Any]]] | None = None,
    on_chip: Mapping[str, int] | None = None,
    outputs: bool = True,
) -> int:
    """Bytes a run of ``graph`` must move across the HBM interface at least: every
    weight and input an op reads, once (an embedding lookup only the table rows it can
    touch: at most one per looked-up id), and every output (a tensor some op writes and
    no op reads), once: :meth:`Context.run` writes results back before it returns
    (``outputs=False``: the host reads them on chip, ``memory.host_io: l2``).
    Tensors that only kernels running inside the memory (``MemoryKernel``, given
    ``lowered``) touch never cross the interface and are left out; on a warm device,
    ``on_chip`` (bytes of each tensor already in L1/L2 when the run starts) need not be
    read again. Derived from the graph's shapes, never from simulated traffic.
    """
    in_memory = {
        op.name for op, ks in (lowered or ()) if ks and all(isinstance(k, MemoryKernel) for k in ks)
    }
    read: dict[str, int] = {}
    consumed: set[str] = set()
    written: list[str] = []
    for op in graph.ops:
        consumed.update(op.inputs)
        if op.name in in_memory:
            continue
        for idx, name in enumerate(op.inputs):
            t = graph.tensors[name]
            if t.kind == "activation":
                continue
            nbytes = t.nbytes
            if op.kind == "embedding" and idx == 1 and t.shape:
                ids = math.prod(graph.tensors[op.inputs[0]].shape)
                nbytes = min(t.shape[0], ids) * (t.nbytes // t.shape[0])
            nbytes = max(0, nbytes - (on_chip or {}).get(name, 0))
            read[name] = max(read.get(name, 0), nbytes)
        written.extend(op.outputs)
    results = {o for o in written if o not in consumed} if outputs else set()
    return sum(read.values()) + sum(graph.tensors[o].nbytes for o in results)


def _host_writes_inputs(dev: Device, graph: Graph) -> None:
    """``memory.host_io: l2``: the host has written the graph's inputs into L2 before
    the run starts (:meth:`~wia_hw.emulator.memory.MemorySystem.host_write`)."""
    st = Storage(graph)
    refs = [st.ref(name) for name, t in graph.tensors.items() if t.kind == "input"]
    dev.memory.host_write([(r, 0, r.rows, 0, r.cols) for r in refs])


def _check_seed(seed: Any) -> int:
    """``seed`` as an int: a non-negative integer (numpy's generators take no other), else
    a one-line WorkloadError (``--seed -1`` in functional mode was a numpy traceback)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise WorkloadError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _release_other_tensors(
    mem: Any, graph: Graph, seen: dict[str, tuple], program: set[str] | None = None
) -> None:
    """Before a run on a used device: a tensor of the graph named as a tensor of an
    earlier run (``seen``: name -> shape and dtype, updated here) but of another shape
    or dtype is another tensor, and its name is released (``MemorySystem.release``) so
    it gets its own storage instead of being mapped onto the old one, which could not
    hold it (a 2048^3 GEMM after a 64^3 one read 8 KB from HBM, its operands collapsed
    onto the old blocks; bert-base b8 after b1 moved 226 MB instead of 597) or was mapped
    by whole block rows (a 64x64 output after a 4096x4096 one wrote back 2 MiB). A
    tensor of the same shape and dtype is the same (a model run again finds its tensors
    warm). Inside a :meth:`Context.same_program` block (``program``: the names its runs
    have named so far, updated here) a tensor named there before keeps its storage
    unless it grows or changes dtype."""
    for name, t in graph.tensors.items():
        now = (tuple(t.shape), t.dtype)
        old = seen.get(name)
        seen[name] = now
        if program is not None:
            mine = name in program
            program.add(name)
            if mine and old is not None and old[1] == t.dtype:
                if t.numel <= math.prod(old[0]):
                    continue  # the program's buffer, reused at a shorter length
        if old is not None and old != now:
            mem.release(name)


def _on_chip_bytes(dev: Device) -> dict[str, int]:
    """Bytes of each stored tensor held in L1 or L2 now (a block counted once)."""
    mem = dev.memory
    if not mem.l2 and not any(mem.l1):
        return {}
    names = {lay.tid: name for name, lay in mem._layouts.items()}
    held: dict[tuple[int, int, int], int] = {key: ent[0] for key, ent in mem.l2.items()}
    for l1 in mem.l1:
        for key, nbytes in l1.items():
            held.setdefault(key, nbytes)
    out: dict[str, int] = {}
    for key, nbytes in held.items():
        name = names.get(key[0])
        if name is not None:
            out[name] = out.get(name, 0) + nbytes
    return out


def spec_sha256(spec: DeviceSpec | ClusterSpec) -> str:
    """SHA-256 (hex) of the resolved spec: its plain mapping as canonical JSON (sorted
    keys, no spaces), so two specs hash alike exactly when every field is equal."""
    from .emulator.config import to_mapping

    text = json.dumps(to_mapping(spec), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file's bytes (read in 1 MiB blocks: a model may be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def is_workload_file(workload: str | os.PathLike[str]) -> bool:
    """Whether :func:`resolve_workload` reads ``workload`` from a file (an ``.onnx``
    model or a SCALE-Sim ``.csv`` topology) rather than building it by name."""
    return os.fspath(workload).lower().endswith((".onnx", ".csv"))


def file_provenance(key: str, path: str | os.PathLike[str]) -> dict[str, str]:
    """``{key}_path`` (absolute) and ``{key}_sha256`` (of its bytes) of a file a run
    reads; empty for a file that cannot be read (the run then refuses it, naming it)."""
    p = Path(path)
    try:
        return {f"{key}_path": str(p.resolve()), f"{key}_sha256": file_sha256(p)}
    except OSError:
        return {}


def workload_file_provenance(workload: str | os.PathLike[str]) -> dict[str, str]:
    """``workload_path`` and ``workload_sha256`` of a workload read from a file
    (:func:`file_provenance`); empty for a builder name."""
    return file_provenance("workload", workload) if is_workload_file(workload) else {}


def extension_files(ext: Any) -> dict[str, str]:
    """``manifest_sha256`` and ``module_sha256`` of an extension's files: its YAML
    manifest and its Python module (beside the manifest, built in, or an entry point's),
    each when it has one. The version a manifest states is not enough: an edited cost
    expression or operation keeps it."""
    out: dict[str, str] = {}
    src = ext.source
    module = getattr(ext.module_obj, "__file__", None)
    if module is None and ext.module is not None and src is not None:
        module = Path(src).parent / f"{ext.module}.py"
    for key, f in (("manifest_sha256", src), ("module_sha256", module)):
        if f is not None:
            try:
                out[key] = file_sha256(f)
            except OSError:  # gone since it was loaded: nothing to record
                pass
    return out


def _extension_provenance(ext: Any) -> dict[str, Any]:
    """id, version, source (the id when the registry finds it by id at the same file,
    else the manifest path as given), ``path`` (that manifest's absolute path, so a
    replay from another folder reads the same file), every parameter's value, the names
    of those that differ from their default (``changed``) and the sha256 of its files
    (:func:`extension_files`) of a registered extension."""
    from .registry._sources import find_extensions

    ext_id = str(getattr(ext.id, "value", ext.id))
    src = ext.source
    found = find_extensions().get(ext_id)
    by_id = found is not None and (src is None or found[1] == src)
    return {
        "id": ext_id,
        "version": ext.version,
        "source": ext_id if by_id or src is None else str(src),
        **({} if by_id or src is None else {"path": str(Path(src).resolve())}),
        "parameters": {k: ext.values[k] for k in sorted(ext.values)},
        "changed": sorted(
            k for k, p in ext.parameters.items() if k in ext.values and ext.values[k] != p.default
        ),
        **extension_files(ext),
    }


def _dominant_precision(records: list[tuple[str, str, KernelRecord]]) -> str:
    by: dict[str, int] = {}
    for _, _, r in records:
        if r.kind == "gemm":
            by[r.precision] = by.get(r.precision, 0) + r.macs
    return max(by, key=lambda p: by[p]) if by else "fp16"


def open_device(
    spec: str | os.PathLike[str] | DeviceSpec = DEFAULT_DEVICE,
    *,
    overrides: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> Context:
    """Open an emulated device: a built-in spec name, a YAML path, or a DeviceSpec.

    ``overrides`` maps dotted spec fields to values (``{"compute.array.rows": 64}``),
    validated like the file.
    """
    loaded = load_spec(Path(spec) if isinstance(spec, os.PathLike) else spec, overrides)
    ctx = Context(loaded, seed=seed)  # type: ignore[arg-type]
    if isinstance(spec, (str, os.PathLike)):
        ctx.spec_source = os.fspath(spec)
        if Path(spec).is_file():  # read from this file (load_spec prefers a file)
            ctx.spec_file = Path(spec).resolve()
    ctx.overrides = dict(overrides or {})
    return ctx


def run(
    workload: str | os.PathLike[str] | Graph,
    *,
    device: str | os.PathLike[str] | DeviceSpec = DEFAULT_DEVICE,
    overrides: Mapping[str, Any] | None = None,
    batch: int | None = None,
    seq: int | None = None,
    precision: str | None = None,
    mode: str = "timing",
    seed: int = 0,
    profile: Any = None,
    **kwargs: Any,
) -> RunResult:
    """Run ``workload`` on a fresh ``device``.

    ``workload`` is a builder name (``bert-large``, ``bert-base``, ``gpt2``,
    ``resnet50``, ``gemm``), a path to an ``.onnx`` file or a SCALE-Sim topology
    ``.csv``, or a :class:`Graph`. ``device``: a built-in spec name, a spec file (YAML,
    or a SCALE-Sim ``.cfg``) or a :class:`DeviceSpec`; ``overrides``: ``{"dotted.path":
    value}`` applied to it. ``batch``, ``seq``, ``precision`` and other keyword
    arguments go to the builder (``M``/``N``/``K`` for ``gemm``, ``layers``,
    ``phase``/``kv_len`` for ``gpt2``, an ONNX model's named dims), except these, which
    go to the run (:meth:`Context.run`):

    * ``inputs``: ``{name: array}`` values of inputs and weights (functional mode);
    * ``schedules``: a file of tuned GEMM tilings (:func:`wia_hw.autotune_model`), or a
      mapping of them by kernel key;
    * ``trace``: keep the per-tile trace (``result.trace``);
    * ``progress``: a callback ``(ops done, ops in all, op name)``.

    ``mode="timing"`` needs only shapes; ``mode="functional"`` also computes values
    (small sizes; ``result.outputs``). ``seed`` fixes every random choice: same inputs
    and seed, same report byte for byte. ``profile`` (a :class:`wia_hw.ProfilingConfig`)
    profiles the run; the report is ``result.profile`` (and is saved to its
    ``output_file``, if set). Bad input raises a :class:`~wia_hw.WiaError` subclass
    whose one-line message names the file, field, op or shape at fault.
    """
    ctx = open_device(device, overrides=overrides, seed=seed)
    if profile is None:
        return ctx.run(workload, batch=batch, seq=seq, precision=precision, mode=mode, **kwargs)
    from .profiling import start_profiling, stop_profiling

    session = start_profiling(ctx, profile)
    try:
        result = ctx.run(workload, batch=batch, seq=seq, precision=precision, mode=mode, **kwargs)
    finally:
        report = stop_profiling(session)
    result.profile = report
    return result
