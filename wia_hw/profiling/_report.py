"""``ProfilingReport``: what a session recorded, its derived figures, and its JSON form.

JSON schema ``wia-hw.profile/1`` (documented in ``docs/PROFILING.md``): the raw records
(session counters, runs, ops, kernels with their captured counters, samples, device
events, memory events) and, beside them, every derived figure, so each figure can be
recomputed from the counters in the same file with the formulas of :mod:`._metrics`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..emulator.counters import Counters
from ..emulator.device import TraceEvent
from ..emulator.errors import WiaError
from ._config import OutputFormat, ProfileMode, ProfilingConfig
from ._kernel import ON_CORES, KernelProfile
from ._metrics import DeviceInfo, bandwidth_gbs, hit_rate, mix_utilization
from ._ports import merged
from ._records import KernelStats, OpSpan, RunInfo, Sample
from ._timeline import event_rows

__all__ = [
    "ProfilingReport",
    "Hotspot",
    "save_profile_report",
    "load_profile_report",
    "SCHEMA",
    "SCHEMA_VERSION",
    "spec_label",
]

SCHEMA_VERSION = 1
SCHEMA = f"wia-hw.profile/{SCHEMA_VERSION}"


@dataclass(frozen=True)
class Hotspot:
    """Where time goes: a kernel, op or group, its time, share and launch count.
    ``exact`` is False for estimates from samples."""

    name: str
    cycles: int
    time_ms: float
    pct: float
    count: int
    exact: bool = True


@dataclass
class ProfilingReport:
    """The seed's ``wia_profiling_report_t``: one session's records and figures.

    Raw records: ``counters`` (the session's counter deltas, all of them), ``runs``,
    ``ops`` (instrumentation), ``kernels`` (with the captured counters), ``samples``
    (sampling), ``device_events``/``port_events`` (trace), ``memory`` (a
    :class:`MemoryProfileReport` when ``capture_memory``). ``program`` and ``spec`` keep
    the kernels as launched (not saved to JSON) so recommendations can re-run them
    (``program_stats`` maps each to its entry in ``kernels``), from the temperature the
    session started at (``start_temperature_c``); ``graphs`` (one per run) and
    ``providers`` (the context's op providers) let them lower the runs again with a
    device extension (not saved either).
    ``overhead`` states what profiling cost: ``simulated_cycles`` is 0 in every mode
    (the emulator observes for free; no mode models a device-side cost yet) and
    ``host_seconds`` is the wall time the session was open.
    """

    mode: ProfileMode
    config: ProfilingConfig
    device: DeviceInfo
    start_cycle: int
    end_cycle: int
    counters: Counters
    runs: list[RunInfo] = field(default_factory=list)
    ops: list[OpSpan] = field(default_factory=list)
    kernels: list[KernelStats] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    device_events: Sequence[TraceEvent] | None = None  # a TraceLog from a session
    port_events: dict[str, list[tuple[int, int, int]]] | None = None
    memory: Any = None
    communication: dict[str, Any] = field(default_factory=dict)
    overhead: dict[str, Any] = field(default_factory=dict)
    program: list[Any] | None = field(default=None, repr=False)
    spec: Any = field(default=None, repr=False)
    program_stats: list[int | None] | None = field(default=None, repr=False)
    start_temperature_c: float | None = None
    graphs: list[Any] | None = field(default=None, repr=False)
    providers: dict[str, Any] | None = field(default=None, repr=False)
    #: The spec as used (:meth:`wia_hw.runtime.Context.provenance`: source, overrides,
    #: extensions with parameters, resolved-spec hash, peaks, version, seed) when
    #: the session stopped; each run's workload and parameters are in ``runs``.
    provenance: dict[str, Any] = field(default_factory=dict)

    # -- basic figures -----------------------------------------------------------------
    @property
    def cycles(self) -> int:
        return self.end_cycle - self.start_cycle

    @property
    def duration_ms(self) -> float:
        return self.device.cycles_to_ms(self.cycles)

    @property
    def precision(self) -> str:
        """The precision most MACs ran at (``fp16`` without GEMMs)."""
        by = {p: v for p, v in self.counters.macs_by_precision.items() if v}
        return max(by, key=lambda p: by[p]) if by else "fp16"

    def _flops_by_precision(self, off: int) -> dict[str, float]:
        """The arrays' FLOPs by precision: GEMMs at their own, the rest (less the ``off``
        FLOPs done off the cores) at :attr:`precision`."""
        by: dict[str, float] = {}
        for k in self.kernels:
            if k.kind == "gemm" and self.device.peak_flops_per_cycle(k.precision):
                by[k.precision] = by.get(k.precision, 0) + k.flop_count
        rest = self.counters.flops - off - sum(by.values())
        by[self.precision] = by.get(self.precision, 0) + max(rest, 0)
        return by

    def summary(self) -> dict[str, Any]:
        """Session-wide figures, each a formula over ``counters`` (see _metrics)."""
        c, dev, cyc = self.counters, self.device, self.cycles
        ms = self.duration_ms
        secs = ms * 1e-3
        # FLOPs done off the cores (an extension's photonic, analog or PIM unit) are not
        # the arrays' work: utilisation counts the rest
        off = sum(k.flop_count for k in self.kernels if k.kind not in ON_CORES)
        by_prec = self._flops_by_precision(off)
        return {
            "duration_ms": ms,
            "cycles": cyc,
            "precision": self.precision,
            "flops": c.flops,
            "off_core_flops": off,
            "achieved_tflops": (c.flops - off) / secs / 1e12 if secs else 0.0,
            "compute_utilization": mix_utilization(by_prec, cyc, dev),
            # whose peak: the run's precision, or the blend of the GEMMs' several
            "peak_of": "+".join(sorted(p for p, w in by_prec.items() if w)) or self.precision,
            "memory_bandwidth_gbs": bandwidth_gbs(c.bytes["hbm"], cyc, dev),
            "peak_bandwidth_gbs": dev.peak_bandwidth_gbs,
            "l1_cache_hit_rate": hit_rate(c.hits["l1"], c.misses["l1"]),
            "l2_cache_hit_rate": hit_rate(c.hits["l2"], c.misses["l2"]),
            "instructions": c.instructions,
            "branch_mispredict_rate": 100.0 * c.branch_mispredicts / c.branches
            if c.branches
            else None,
            "energy_j": c.energy_pj * 1e-12,
            "avg_power_w": c.energy_pj * 1e-12 / secs if secs else 0.0,
            "stall_pct": {
                k: 100.0 * v / (dev.cores * cyc) if cyc else 0.0 for k, v in c.stall_cycles.items()
            },
        }

    def kernel_profiles(self) -> list[KernelProfile]:
        """A :class:`KernelProfile` per kernel (fields without counters are ``None``)."""
        self.fill_unit_floors()
        return [KernelProfile.from_stats(k, self.device) for k in self.kernels]

    def fill_unit_floors(self) -> None:
        """Compute the kernels' pipeline and parallelism floors (``unit_floors``) from the
        launched kernels, once, after the session (so profiling hooks stay cheap); a
        report loaded from JSON keeps the ones it was saved with."""
        if self.program is None or self.spec is None or not self.program_stats:
            return
        from ._bounds import unit_floors

        for k, idx in zip(self.program, self.program_stats, strict=False):
            if idx is None or isinstance(k, str):
                continue
            ks = self.kernels[idx]
            if ks.unit_floors is None:
                uf = unit_floors(k, self.spec)
                ks.unit_floors = None if uf is None else uf.to_dict()

    def hotspots(self, by: str = "kernel", top: int | None = 10) -> list[Hotspot]:
        """Time per ``kernel``, ``op`` or ``group`` (exact, from kernel records) or, in
        sampling mode, per kernel estimated from the samples."""
        if by not in ("kernel", "op", "group"):
            raise ValueError(f"by must be kernel, op or group, got {by!r}")
        agg: dict[str, list[int]] = {}
        exact = bool(self.kernels)
        if self.kernels:
            for k in self.kernels:
                key = {"kernel": k.name, "op": k.op, "group": k.group}[by]
                a = agg.setdefault(key, [0, 0])
                a[0] += k.cycles
                a[1] += 1
            # each run's final write-back of its results (after its last kernel): part
            # of the profiled time, as the run's op breakdown shows it
            wb = [r.writeback_cycles for r in self.runs if r.writeback_cycles]
            if wb:
                agg["writeback"] = [sum(wb), len(wb)]
        else:
            for s in self.samples:
                names = {n for n in s.kernels if n is not None}
                key = next(iter(sorted(names))) if names else "[idle]"
                a = agg.setdefault(key, [0, 0])
                a[0] += s.weight_cycles
                a[1] += 1
        total = self.cycles
        out = [
            Hotspot(
                n, c, self.device.cycles_to_ms(c), 100.0 * c / total if total else 0.0, cnt, exact
            )
            for n, (c, cnt) in agg.items()
        ]
        out.sort(key=lambda h: (-h.cycles, h.name))
        return out if top is None else out[:top]

    # -- outputs -----------------------------------------------------------------------
    def collapsed_stacks(self) -> list[str]:
        """Flamegraph stacks in Brendan Gregg's collapsed format, values in cycles;
        they sum to the profiled time (``cycles``). See :mod:`._flamegraph`."""
        from ._flamegraph import collapsed_stacks

        return collapsed_stacks(self)

    def call_graph(self) -> dict[str, Any]:
        """The call graph (user frames, runs, groups, ops, kernels) as a tree with the
        inclusive cycles and launch counts of every frame (see :mod:`._flamegraph`)."""
        from ._flamegraph import call_graph

        return call_graph(self)

    def flamegraph_svg(self, title: str | None = None) -> str:
        from ._flamegraph import render_svg

        return render_svg(
            self.collapsed_stacks(),
            title=title or self.flamegraph_title(),
            unit="cycles",
        )

    def flamegraph_title(self) -> str:
        """The default flamegraph title: device, profiled time, mode and the spec as
        used (:func:`spec_label`)."""
        return (
            f"{self.device.name}: {self.duration_ms:.3f} ms profiled "
            f"({ProfileMode(self.mode).value}); {spec_label(self.provenance)}"
        )

    def chrome_trace(self) -> dict[str, Any]:
        """The timeline in Chrome Trace Event Format (see :mod:`._timeline`)."""
        from ._timeline import chrome_trace

        trace = chrome_trace(self)
        trace.setdefault("otherData", {})["provenance"] = self.provenance
        return trace

    def save_timeline(self, path: str | os.PathLike[str]) -> Path:
        return _write(path, json.dumps(self.chrome_trace(), allow_nan=False))

    def save_flamegraph(self, path: str | os.PathLike[str]) -> Path:
        """The kind follows the suffix: ``.svg`` writes the drawing, ``.png`` draws it
        with matplotlib, ``.folded``/``.txt`` write the collapsed stacks. Any other
        suffix raises :class:`~wia_hw.WiaError` naming the kinds."""
        p = Path(path)
        suffix = p.suffix.lower()
        if suffix == ".svg":
            return _write(p, self.flamegraph_svg())
        if suffix == ".png":
            from ._flamegraph import render_png

            return render_png(self.collapsed_stacks(), p, title=self.flamegraph_title())
        if suffix in (".folded", ".txt"):
            return _write(p, "\n".join(self.collapsed_stacks()) + "\n")
        raise WiaError(
            f"{p}: unknown flamegraph kind {p.suffix or '(no suffix)'!r}: .svg or .png draw "
            "it, .folded or .txt write collapsed stacks"
        )

    def format_text(self, top: int = 10) -> str:
        """A human summary: totals, hotspots, and each hot kernel's assessment."""
        s = self.summary()
        lines = [
            f"Profile of {self.device.name} ({ProfileMode(self.mode).value} mode): "
            f"{s['duration_ms']:.3f} ms, {len(self.runs)} run(s), "
            f"{len(self.kernels)} kernels",
            f"  Spec: {spec_label(self.provenance)}",
            f"  Compute: {s['achieved_tflops']:.1f} TFLOPS "
            f"({s['compute_utilization']:.1f}% of {s['peak_of']} peak)"
            + (
                f"; {s['off_core_flops'] / (s['duration_ms'] * 1e-3) / 1e12:.1f} TFLOPS more "
                "on extension units"
                if s["off_core_flops"] and s["duration_ms"]
                else ""
            ),
            f"  Memory Bandwidth: {s['memory_bandwidth_gbs']:.1f} GB/s "
            f"({100 * s['memory_bandwidth_gbs'] / s['peak_bandwidth_gbs']:.1f}% of peak)",
            f"  Energy: {s['energy_j'] * 1e3:.2f} mJ, {s['avg_power_w']:.1f} W average",
        ]
        hs = self.hotspots("group" if self.kernels else "kernel", top)
        if hs:
            lines.append("Hotspots" + ("" if hs[0].exact else " (estimated from samples)") + ":")
            for h in hs:
                lines.append(f"  {h.name:<40} {h.time_ms:9.3f} ms {h.pct:5.1f}%  x{h.count}")
        return "\n".join(lines)

    # -- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON form (schema ``wia-hw.profile/1``); plain types only."""
        kp = self.kernel_profiles()
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "mode": ProfileMode(self.mode).value,
            "config": self.config.to_dict(),
            "device": self.device.to_dict(),
            "start_cycle": self.start_cycle,
            "end_cycle": self.end_cycle,
            "cycles": self.cycles,
            "duration_ms": self.duration_ms,
            "counters": self.counters.to_dict(),
            "summary": self.summary(),
            "runs": [r.to_dict() for r in self.runs],
            "ops": [o.to_dict() for o in self.ops],
            "kernels": [
                dict(k.to_dict(), profile=p.to_dict())
                for k, p in zip(self.kernels, kp, strict=True)
            ],
            "samples": [s.to_dict() for s in self.samples],
            "hotspots": [vars(h) for h in self.hotspots("kernel", None)],
            "flamegraph": self.collapsed_stacks(),
            "call_graph": self.call_graph(),
            "device_events": None
            if self.device_events is None
            else [list(row) for row in event_rows(self.device_events)],
            "port_events": None
            if self.port_events is None
            else {k: [list(e) for e in merged(v)] for k, v in self.port_events.items()},
            "memory": None if self.memory is None else self.memory.to_dict(),
            "communication": self.communication,
            "overhead": self.overhead,
            "start_temperature_c": self.start_temperature_c,
            "provenance": self.provenance,
        }
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProfilingReport:
        """Read a report back (``program`` and ``spec`` are not stored: a loaded report
        cannot re-run its kernels)."""
        schema = d.get("schema")
        if schema != SCHEMA:
            raise WiaError(f"not a {SCHEMA} report (schema {schema!r})")
        from ._memory import MemoryProfileReport

        return cls(
            mode=ProfileMode(d["mode"]),
            config=ProfilingConfig.from_dict(d["config"]),
            device=DeviceInfo.from_dict(d["device"]),
            start_cycle=d["start_cycle"],
            end_cycle=d["end_cycle"],
            counters=Counters.from_dict(d["counters"]),
            runs=[RunInfo.from_dict(r) for r in d["runs"]],
            ops=[OpSpan.from_dict(o) for o in d["ops"]],
            kernels=[KernelStats.from_dict(k) for k in d["kernels"]],
            samples=[Sample.from_dict(s) for s in d["samples"]],
            device_events=None
            if d["device_events"] is None
            else [TraceEvent(*e) for e in d["device_events"]],
            port_events=None
            if d["port_events"] is None
            else {k: [tuple(e) for e in v] for k, v in d["port_events"].items()},
            memory=None if d["memory"] is None else MemoryProfileReport.from_dict(d["memory"]),
            communication=d.get("communication", {}),
            overhead=d.get("overhead", {}),
            start_temperature_c=d.get("start_temperature_c"),
            provenance=d.get("provenance", {}),
        )


def spec_label(prov: dict[str, Any]) -> str:
    """One line naming the spec as used: source, ``--set`` overrides, ``--ext``
    extensions with the parameters that differ from their defaults, the resolved
    spec's hash (12 hex digits), peak HBM bandwidth, the wia_hw version and the seed."""
    if not prov:
        return "provenance not recorded"
    parts = [str(prov.get("spec", "?"))]
    parts += [f"--set {k}={v}" for k, v in prov.get("overrides", {}).items()]
    for e in prov.get("extensions", []):
        values = e.get("parameters", {})
        ps = ",".join(f"{k}={values[k]}" for k in e.get("changed", values))
        parts.append(f"--ext {e.get('source', e.get('id'))}" + (f" ({ps})" if ps else ""))
    bw = prov.get("peaks", {}).get("hbm_bandwidth_gbs")
    return (
        " ".join(parts)
        + f"; spec sha256 {str(prov.get('spec_sha256', '?'))[:12]}"
        + ("" if bw is None else f"; HBM peak {bw:g} GB/s")
        + f"; wia_hw {prov.get('wia_hw_version', '?')}; seed {prov.get('seed', '?')}"
    )


def _write(path: str | os.PathLike[str], text: str) -> Path:
    p = Path(path)
    try:
        p.write_text(text)
    except OSError as e:
        raise WiaError(f"cannot write {p}: {e.strerror}") from None
    return p


def _get_kernels(self: ProfilingReport) -> list[KernelStats]:
    k = self.__dict__["_kernels"]
    if callable(k):  # a session's builder: the per-kernel statistics, made on first use
        k = self.__dict__["_kernels"] = k()
    return k


def _set_kernels(self: ProfilingReport, value: Any) -> None:
    self.__dict__["_kernels"] = value


# ``kernels`` is a dataclass field (set in __init__, compared, saved) read through a
# property: a profiling session hands a function that builds the list, and the list is
# built when the report is first read (collect in the run, decode afterwards, as
# ``fill_unit_floors`` does), so the session's stop costs the run almost nothing
ProfilingReport.kernels = property(  # type: ignore[assignment]
    _get_kernels,
    _set_kernels,
    doc="The kernel launches' :class:`KernelStats` (built from the session's "
    "records when first read).",
)


def save_profile_report(
    report: ProfilingReport, path: str | os.PathLike[str], format: OutputFormat | str | None = None
) -> Path:
    """Write ``report`` to ``path`` in ``format`` (default: the report's configured
    ``output_format``; ``JSON`` for a ``.json`` path unless told otherwise). Returns the
    path. Raises :class:`~wia_hw.WiaError` when the file cannot be written."""
    if not isinstance(report, ProfilingReport):
        raise TypeError(f"save_profile_report takes a ProfilingReport, got {type(report).__name__}")
    fmt = OutputFormat(format) if format is not None else OutputFormat(report.config.output_format)
    if fmt is OutputFormat.JSON:
        return _write(path, report.to_json(indent=1) + "\n")
    if fmt is OutputFormat.CHROME_TRACE:
        return report.save_timeline(path)
    if fmt is OutputFormat.COLLAPSED:
        return _write(path, "\n".join(report.collapsed_stacks()) + "\n")
    return _write(path, report.format_text() + "\n")


def load_profile_report(path: str | os.PathLike[str]) -> ProfilingReport:
    """Read a JSON report written by :func:`save_profile_report`."""
    try:
        d = json.loads(Path(path).read_text())
    except OSError as e:
        raise WiaError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise WiaError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    return ProfilingReport.from_dict(d)
