"""Profiling sessions (the seed's section 8.2): start, run workloads, stop, get a report.

A session watches one context from :func:`start_profiling` to :func:`stop_profiling`:
every ``ctx.run`` in between (it registers as an observer of the context's runs), and
the device itself (counters at both ends; in the sampling modes a sampler process; in
the trace modes the device's event trace and traced HBM/L2 ports). None of this changes
when anything happens on the device: the same cycles with and without profiling.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..emulator.device import KernelRecord, TraceEvent, TraceLog
from ..emulator.errors import WiaError
from . import _ports
from ._callsite import user_stack
from ._config import OutputFormat, ProfileMode, ProfilingConfig
from ._kernel import StatsMaker
from ._memory import MemoryProfilingConfig, MemoryProfilingSession
from ._metrics import DeviceInfo
from ._records import COUNTER_FIELDS, OpSpan, RunInfo
from ._report import ProfilingReport, save_profile_report
from ._sampler import Sampler

__all__ = ["ProfilingSession", "start_profiling", "stop_profiling"]


class ProfilingSession:
    """The seed's ``wia_profiling_session_t``. Use :func:`start_profiling` /
    :func:`stop_profiling`, or ``with start_profiling(ctx, cfg) as s: ...`` (the report is
    ``s.report`` after the block). One session per context at a time."""

    def __init__(self, ctx: Any, config: ProfilingConfig) -> None:
        if not isinstance(config, ProfilingConfig):
            raise TypeError(f"config must be a ProfilingConfig, got {type(config).__name__}")
        if not hasattr(ctx, "observers") or not hasattr(ctx, "device"):
            raise TypeError(f"ctx must be a wia_hw Context, got {type(ctx).__name__}")
        self.ctx = ctx
        self.config = config
        self.report: ProfilingReport | None = None
        self.active = False
        facets = config.facets
        self._kernels_on = config.capture_kernels and bool(
            facets & {"instrumentation", "counters", "trace"}
        )
        self._instr = config.capture_kernels and "instrumentation" in facets
        self._counters = "counters" in facets
        self._trace = config.capture_kernels and "trace" in facets
        self._samples = "samples" in facets
        fields_: list[str] = []
        wanted = list(config.hardware_counters) if self._counters else []
        for c in wanted:
            fields_ += [f for f in COUNTER_FIELDS[c] if f not in fields_]
        if config.capture_power and self._kernels_on and "energy_pj" not in fields_:
            fields_.append("energy_pj")
        self._fields = tuple(fields_)
        self._drop_counters = not self._counters and not config.capture_power
        self._drop_power = not config.capture_power

    # -- the observer protocol of Context.run ------------------------------------------
    @property
    def wants_trace(self) -> bool:
        return self.active and self._trace

    def run_begin(self, ctx: Any, graph: Any, lowered: Sequence[Any]) -> None:
        stack = user_stack(keep_library_frames=self.config.keep_library_frames)
        self._run = RunInfo(
            len(self._runs), graph.name, dict(graph.params), ctx.device.now, stack=stack
        )
        if self._mem is not None and self._mem.config.stack_depth == 16:  # user_stack's limit
            self._mem.run_stack = stack  # the run's allocations share its user frames
        self._runs.append(self._run)
        self._graphs.append(graph)
        self._run_ops = 0

    def op_begin(self, op: Any, kernels: Sequence[Any], cycle: int) -> None:
        self._op_kernels = kernels
        self._op_start = cycle

    def op_end(self, op: Any, records: Sequence[KernelRecord], cycle: int) -> None:
        # runs once per op of every profiled run: it keeps references only (the
        # records are the emulator's own, never changed after their kernel); stop()
        # builds the program, the op spans and the per-kernel statistics from them
        start = self._op_start
        self._run_ops += cycle - start
        self._raw.append((op, self._op_kernels, records, start, cycle, self._run))

    def run_end(self, result: Any, trace: Sequence[TraceEvent] | None) -> None:
        if self._mem is not None:
            self._mem.run_stack = None
        if self._run is not None:
            self._run.end_cycle = self.ctx.device.now
            self._run.writeback_cycles = self._run.end_cycle - self._run.start_cycle - self._run_ops
        self._raw.append(None)  # the run's final write-back ("flush" in the program)
        if trace is not None and self._trace:
            self._events.extend(trace)  # a device's TraceLog: its rows, nothing built
        self._run = None

    def _unpack(self) -> tuple[list[Any], list[int | None], list[OpSpan], Any]:
        """The program (kernels and flushes in order), each entry's index into the
        kernel statistics, the op spans, and a function that builds the per-kernel
        statistics (the report calls it when first read), from what the observer
        methods kept."""
        program: list[Any] = []
        program_stats: list[int | None] = []
        ops: list[OpSpan] = []
        raw, self._raw = self._raw, []
        nk = 0
        for entry in raw:
            if entry is None:
                program.append("flush")
                program_stats.append(None)
                continue
            op, kernels, records, start, cycle, info = entry
            n = len(kernels)
            program.extend(kernels)
            if not self._kernels_on:
                program_stats.extend([None] * n)
                continue
            first, nk = nk, nk + len(records)
            program_stats.extend(range(first, first + n) if n == len(records) else [None] * n)
            if self._instr:
                run = info.index if info is not None else -1
                ops.append(
                    OpSpan(op.name, op.group, op.kind, run, start, cycle, list(range(first, nk)))
                )
        if not self._kernels_on:
            return program, program_stats, ops, []
        make = StatsMaker(self._fields, self.ctx.spec)
        drop_counters, drop_power = self._drop_counters, self._drop_power

        def build() -> list[Any]:
            kstats: list[Any] = []
            for entry in raw:
                if entry is None:
                    continue
                _op, kernels, records, _start, _cycle, info = entry
                run = info.index if info is not None else -1
                launched = kernels if len(kernels) == len(records) else [None] * len(records)
                for r, k in zip(records, launched, strict=True):
                    ks = make(r, len(kstats), run, k)
                    if drop_counters:
                        ks.counters = None
                    if drop_power:
                        ks.power_w = ks.temperature_c = None
                    kstats.append(ks)
            return kstats

        return program, program_stats, ops, build

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> ProfilingSession:
        if self.active:
            raise WiaError("this profiling session is already running")
        for o in self.ctx.observers:
            if isinstance(o, ProfilingSession):
                raise WiaError(
                    "a profiling session is already running on this context; stop it first"
                )
        dev = self.ctx.device
        self._t0 = time.perf_counter()
        self._start_cycle = dev.now
        self._before = dev.counters.copy()
        self._runs: list[RunInfo] = []
        self._graphs: list[Any] = []
        self._run: RunInfo | None = None
        self._run_ops = 0
        self._op_start = 0
        self._raw: list[Any] = []  # (op, kernels, records, start, end, run) or None
        self._start_temperature_c = dev.thermal.temperature_c
        self._op_kernels: Sequence[Any] = ()
        self._events = TraceLog()
        self._sampler = None
        # the traced ports first: a sampler reads the ports the device books (detailed)
        self._ports = _ports.install(dev.memory) if self._trace else None
        if self._samples:
            interval = max(
                1, round(self.config.sampling_interval_us * 1e3 * self.ctx.spec.clock_ghz)
            )
            self._sampler = Sampler(dev, interval)
        self._mem = None
        if self.config.capture_memory:
            self._mem = MemoryProfilingSession(
                self.ctx, MemoryProfilingConfig(keep_library_frames=self.config.keep_library_frames)
            ).start()
        self.ctx.observers.append(self)
        self.active = True
        return self

    def __enter__(self) -> ProfilingSession:
        return self if self.active else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.active:
            stop_profiling(self)

    def stop(self) -> ProfilingReport:
        if not self.active:
            raise WiaError("this profiling session is not running")
        ctx, dev, cfg = self.ctx, self.ctx.device, self.config
        ctx.observers.remove(self)
        self.active = False
        end = dev.now
        samples = (
            self._sampler.stop([r for e in self._raw if e is not None for r in e[2]])
            if self._sampler is not None
            else []
        )
        port_events = _ports.uninstall(dev.memory, self._ports) if self._ports else None
        memory = self._mem.stop() if self._mem is not None else None
        program, program_stats, ops, kstats = self._unpack()
        host = time.perf_counter() - self._t0
        comm: dict[str, Any] = {}
        if cfg.capture_communication:
            comm = {
                "events": [],
                "note": "single-device runs send no link messages; "
                "multi-device communication is not emulated yet",
            }
        self.report = ProfilingReport(
            mode=ProfileMode(cfg.mode),
            config=cfg,
            device=DeviceInfo.from_spec(ctx.spec),
            start_cycle=self._start_cycle,
            end_cycle=end,
            counters=dev.counters.delta(self._before),
            runs=self._runs,
            ops=ops,
            kernels=kstats,
            samples=samples,
            device_events=self._events if self._trace else None,
            port_events=port_events,
            memory=memory,
            communication=comm,
            overhead={
                "simulated_cycles": 0,
                "host_seconds": host,
                "note": "profiling observes the emulator without changing its "
                "timing; no mode models a device-side cost",
            },
            program=program,
            spec=ctx.spec,
            program_stats=program_stats,
            start_temperature_c=self._start_temperature_c,
            graphs=list(self._graphs),
            providers=dict(ctx.providers),
            provenance=ctx.provenance() if hasattr(ctx, "provenance") else {},
        )
        if cfg.output_file is not None:
            _write_outputs(self.report, Path(cfg.output_file))
        return self.report


def _write_outputs(report: ProfilingReport, path: Path) -> None:
    cfg = report.config
    save_profile_report(report, path, cfg.output_format)
    stem = path.with_suffix("")
    if cfg.timeline_enabled and OutputFormat(cfg.output_format) is not OutputFormat.CHROME_TRACE:
        report.save_timeline(stem.with_name(stem.name + ".trace.json"))
    if cfg.flamegraph_enabled:
        report.save_flamegraph(stem.with_name(stem.name + ".folded"))
        report.save_flamegraph(stem.with_name(stem.name + ".svg"))


def start_profiling(ctx: Any, config: ProfilingConfig | None = None) -> ProfilingSession:
    """Start profiling ``ctx`` (the seed's ``wia_start_profiling``); returns the session.
    Usable as a context manager. Raises :class:`~wia_hw.WiaError` when the context
    already has a session running."""
    return ProfilingSession(ctx, config if config is not None else ProfilingConfig()).start()


def stop_profiling(session: ProfilingSession) -> ProfilingReport:
    """Stop ``session`` and build its report (``wia_stop_profiling``); saves it to the
    config's ``output_file`` when one is set."""
    if not isinstance(session, ProfilingSession):
        raise TypeError(f"stop_profiling takes a ProfilingSession, got {type(session).__name__}")
    return session.stop()
