"""Automated performance recommendations (the seed's section 8.6).

:func:`analyze_performance` runs rules over a :class:`ProfilingReport`; each finding is
a :class:`Recommendation` whose ``estimated_improvement`` (the fraction of the profiled
time it saves) is measured where the emulator can apply the change: the session's
kernels are replayed as they were and with the change (:mod:`._whatif`), and the gain
is the difference. ``confidence`` says how the figure was obtained, and
``confidence_basis`` says it in words:

* ``0.9`` measured: both replays on the emulator (a model of the device; both start
  from cold caches, so the figure is the change's effect, not the session's warm-up);
* ``0.5`` modelled: an estimate from the report's counters (a report loaded from JSON
  keeps no kernels to replay, or the emulator cannot make the change yet, e.g.
  overlapping multi-device communication). Most are heuristics (half the unmapped share
  of a kernel's time, half a chain's time) that the measured gain can exceed or fall
  short of; only the communication finding's, the exposed time, is a bound.

Rules: low kernel occupancy (fill and drain count); low compute utilisation in an array
kernel bound by compute, pipeline or parallelism; cache thrashing; unfused
elementwise chains (fuse); unfused attention (the session's graphs lowered again with the
transformer engine registered, flash attention, and replayed); allocation in a hot path;
thermal throttling; communication not overlapped with compute (when the report has link
messages). ``coverage`` lists every op group above 5 % of the time with the findings
that name its kernels, or the reason none applies (its kernels' bounds). ``priority`` follows the improvement: ``CRITICAL`` >= 50 %, ``HIGH`` >= 20 %,
``MEDIUM`` >= 5 %, else ``LOW``. Only recommendations at or above
``priority_threshold`` with ``confidence >= confidence_threshold`` are returned.

Every finding with a change to make carries it as a runnable :class:`Fix` (its code is
``code_example``): API code (``apply_fusion``, providers with the better tiling,
``register_device_extension(ctx, "transformer_engine")``, a non-throttling device, a
pooling allocator; ``train_iteration(..., overlap=True)`` for a training step) or, for
a fusion ``apply_fusion`` does not make exactly, an extension manifest with ``cost:
builtin``. Each applies the change the measurement replayed, so the gain it gives is
``estimated_improvement``. The modelled communication finding of a single-device
report has none (multi-device runs are not emulated from a profile).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..emulator.allocator import AllocatorConfig
from ..emulator.kernels import GemmKernel, VectorKernel
from ._bounds import CEILING_NAMES, MEMORY_CEILINGS, MEMORY_UNKNOWN, _signature
from ._kernel import KernelProfile, ideal_cycles
from ._metrics import DeviceInfo
from ._report import ProfilingReport
from ._whatif import (
    FLUSH,
    fuse_gemm_epilogue,
    fuse_vector_pair,
    gemm_tilings,
    replay,
    replay_allocations,
    substitute,
    time_kernel,
    vector_tilings,
)

__all__ = [
    "Priority",
    "AnalysisConfig",
    "Recommendation",
    "Fix",
    "PerformanceRecommendations",
    "analyze_performance",
    "MEASURED",
    "MODELLED",
    "priority_for",
]

MEASURED = 0.9
MODELLED = 0.5


class Priority(enum.IntEnum):
    """The seed's priorities, ordered; members accept their lower-case names."""

    LOW = 0
    MEDIUM = 1
    HIGH = 2
    CRITICAL = 3

    @classmethod
    def _missing_(cls, value: object) -> Priority | None:
        if isinstance(value, str):
            return cls.__members__.get(value.strip().upper())
        return None


def priority_for(improvement: float) -> Priority:
    """``CRITICAL`` >= 0.5, ``HIGH`` >= 0.2, ``MEDIUM`` >= 0.05, else ``LOW``."""
    if improvement >= 0.5:
        return Priority.CRITICAL
    if improvement >= 0.2:
        return Priority.HIGH
    if improvement >= 0.05:
        return Priority.MEDIUM
    return Priority.LOW


@dataclass(frozen=True, kw_only=True)
class AnalysisConfig:
    """The seed's ``wia_analysis_config_t`` plus: ``min_time_share`` (kernels, summed
    over their layers, below this share of the profiled time are not analysed),
    ``max_tilings`` (tilings tried per GEMM shape), ``hot_path_allocations`` (a site
    allocating this often is a hot path), ``measure`` (False: model estimates only)."""

    analyze_kernels: bool = True
    analyze_memory: bool = True
    analyze_communication: bool = True
    priority_threshold: Priority | str = Priority.MEDIUM
    confidence_threshold: float = 0.7
    min_time_share: float = 0.01
    max_tilings: int = 16
    hot_path_allocations: int = 100
    measure: bool = True

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "priority_threshold", Priority(self.priority_threshold))
        except ValueError:
            raise ValueError(
                "priority_threshold must be low, medium, high or critical, got "
                f"{self.priority_threshold!r}"
            ) from None
        for n in ("confidence_threshold", "min_time_share"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"{n} must be a number in [0, 1], got {v!r}")
        for n in ("max_tilings", "hot_path_allocations"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{n} must be a positive integer, got {v!r}")


#: The names an API fix's code reads (besides ``wia_hw``): the context and the run that
#: was profiled, ``ctx.run(workload, **run_kwargs)``.
FIX_NAMES = ("ctx", "workload", "run_kwargs")


@dataclass(frozen=True)
class Fix:
    """A recommendation's runnable fix, in one of two kinds:

    * ``"api"``: ``code`` is Python run with ``wia_hw`` imported and the names ``ctx``
      (the context, on the profiled device), ``workload`` and ``run_kwargs`` (what was
      profiled: ``ctx.run(workload, **run_kwargs)``). It changes the context (or binds
      a new ``ctx``) and binds ``result``, the run with the fix; when it binds no
      ``result``, the workload is run on the (new) ``ctx``.
    * ``"manifest"``: ``code`` is a complete extension manifest (YAML) whose
      operations reuse the emulator's kernel timing by reference (``cost: builtin``);
      applying it registers it on ``ctx`` and runs the workload.

    ``description`` says in one line what applying it changes."""

    kind: str
    code: str
    description: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("api", "manifest"):
            raise ValueError(f"Fix.kind must be 'api' or 'manifest', got {self.kind!r}")

    def apply(
        self, ctx: Any, workload: Any = None, run_kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Apply the fix on ``ctx`` and run ``workload`` with ``run_kwargs``; returns the
        run's result (a ``RunResult``, or what the fix's code binds to ``result``)."""
        kw = dict(run_kwargs or {})
        if self.kind == "manifest":
            import tempfile
            from pathlib import Path

            from ..registry import register_device_extension

            with tempfile.TemporaryDirectory() as d:
                path = Path(d) / "fix.yaml"
                path.write_text(self.code)
                register_device_extension(ctx, path)
            return ctx.run(workload, **kw)
        # the package itself, loaded before any of its modules (no import: the code's
        # ``wia_hw`` is the caller's, as in a user's script)
        ns: dict[str, Any] = {
            "wia_hw": sys.modules[__name__.split(".")[0]],
            "ctx": ctx,
            "workload": workload,
            "run_kwargs": kw,
        }
        exec(compile(self.code, "<fix>", "exec"), ns)  # the engine's own code, not input
        if "result" in ns:
            return ns["result"]
        return ns["ctx"].run(workload, **kw)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "code": self.code, "description": self.description}


@dataclass(frozen=True)
class Recommendation:
    """The seed's ``wia_recommendation_t``. ``estimated_improvement`` is a fraction of
    the profiled time (0.12 = 12 %); ``confidence`` in [0, 1] with ``confidence_basis``
    saying how the estimate was obtained; ``baseline_ms``/``modified_ms`` are the two
    replays when measured. ``fix`` is the runnable change (:class:`Fix`; its code is
    ``code_example``), or ``None`` when the emulator cannot apply it (communication
    overlap in a single-device report)."""

    priority: Priority
    title: str
    description: str
    impact: str
    suggestion: str
    estimated_improvement: float
    confidence: float
    code_example: str | None = None
    confidence_basis: str = ""
    category: str = ""
    kernels: tuple[str, ...] = ()
    baseline_ms: float | None = None
    modified_ms: float | None = None
    fix: Fix | None = None

    def format(self) -> str:
        lines = [
            f"[{self.priority.name}] {self.title}",
            f"  Issue: {self.description}",
            f"  Impact: {self.impact}",
            f"  Suggestion: {self.suggestion}",
            f"  Estimated improvement: {self.estimated_improvement * 100:.1f}%",
            f"  Confidence: {self.confidence * 100:.1f}% ({self.confidence_basis})",
        ]
        if self.code_example:
            what = "Extension manifest" if self.fix and self.fix.kind == "manifest" else "Code"
            lines += [f"  {what} example:", self.code_example]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["priority"] = self.priority.name
        d["kernels"] = list(self.kernels)
        d["fix"] = self.fix.to_dict() if self.fix is not None else None
        return d


@dataclass
class PerformanceRecommendations:
    """The seed's ``wia_performance_recommendations_t``: the recommendations that pass
    the thresholds, most important first; ``considered`` holds every finding."""

    recommendations: list[Recommendation]
    considered: list[Recommendation] = field(default_factory=list)
    baseline_ms: float | None = None
    coverage: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_recommendations(self) -> int:
        return len(self.recommendations)

    def format(self) -> str:
        out = [f"Performance Recommendations ({self.num_recommendations} total):", ""]
        for i, r in enumerate(self.recommendations, 1):  # numbered for --apply N
            out += [f"{i}. {r.format()}", ""]
        gaps = [c for c in self.coverage if c["reason"]]
        if gaps:
            out.append("Operation classes above 5% of the time without a recommendation:")
            out += [f"  {c['group']} ({100 * c['share']:.1f}%): {c['reason']}" for c in gaps]
            out.append("")
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "recommendations": [r.to_dict() for r in self.recommendations],
            "considered": [r.to_dict() for r in self.considered],
            "baseline_ms": self.baseline_ms,
            "coverage": self.coverage,
        }


def _pattern(name: str) -> str:
    return re.sub(r"^layer\d+\.", "", name)


class _Analyzer:
    def __init__(self, report: ProfilingReport, cfg: AnalysisConfig) -> None:
        self.r = report
        self.cfg = cfg
        self.dev: DeviceInfo = report.device
        self.total = max(1, report.cycles)
        self.profiles = report.kernel_profiles()
        self.can_replay = bool(cfg.measure and report.program and report.spec is not None)
        self._base: int | None = None
        self.out: list[Recommendation] = []
        self.notes: dict[str, str] = {}
        self._pidx: dict[int, int] | None = None

    # -- measuring ---------------------------------------------------------------------
    def ms(self, cycles: float) -> float:
        return self.dev.cycles_to_ms(cycles)

    def baseline(self) -> int:
        if self._base is None:
            self._base = replay(
                self.r.spec, self.r.program, temperature_c=self.r.start_temperature_c
            )
        return self._base

    def measure(self, program: Sequence[Any], spec: Any = None) -> tuple[float, str, float, float]:
        """(improvement, basis, baseline ms, modified ms) of running ``program``."""
        base = self.baseline()
        new = replay(
            spec if spec is not None else self.r.spec,
            program,
            temperature_c=self.r.start_temperature_c,
        )

        def count(p: Sequence[Any]) -> int:
            return sum(1 for k in p if not (isinstance(k, str) and k == FLUSH))

        n0, n1 = count(self.r.program or []), count(program)
        after = "" if n1 == n0 else f" ({n1} after it)"
        basis = (
            f"measured: re-ran the session's {n0} kernels{after} on a fresh "
            f"{self.dev.name} emulator without and with the change: "
            f"{self.ms(base):.3f} ms -> {self.ms(new):.3f} ms"
        )
        return max(0.0, (base - new) / self.total), basis, self.ms(base), self.ms(new)

    def add(self, improvement: float, confidence: float, basis: str, **kw: Any) -> None:
        fix = kw.get("fix")
        if fix is not None:
            kw["code_example"] = fix.code
        self.out.append(
            Recommendation(
                priority=priority_for(improvement),
                estimated_improvement=improvement,
                confidence=confidence,
                confidence_basis=basis,
                **kw,
            )
        )

    # -- grouping ----------------------------------------------------------------------
    def shape(self, i: int) -> Any:
        """A key equal for kernels of one shape and tiling: the launched kernel's tiling
        signature (:func:`._bounds._signature`) when the program is kept, else the
        kernel's figures that its shape fixes."""
        if self._pidx is None:
            self._pidx = self.program_index()
        pidx = self._pidx
        prog = self.r.program or []
        k = prog[pidx[i]] if i in pidx else None
        sig = None if k is None else _signature(k)
        if sig is not None:
            return sig
        ks = self.r.kernels[i]
        return (
            ks.kind,
            ks.precision,
            ks.op_class,
            ks.flop_count,
            ks.macs,
            ks.tiles,
            ks.compulsory_bytes,
        )

    def groups(self) -> dict[str, list[int]]:
        """Kernel indices grouped by shape: kernels of one shape and tiling whose names
        differ only in their numbers (``layer3.1.conv2``, ``layer3.2.conv2``) share a
        finding, so a re-tiling changes them all alike and their figures are one
        kernel's. A group is named by its name without the ``layerN.`` prefix when its
        kernels share it and no other shape does, else by its kernels' names."""
        g: dict[tuple[str, Any], list[int]] = {}
        for i, k in enumerate(self.r.kernels):
            g.setdefault((re.sub(r"\d+", "#", k.name), self.shape(i)), []).append(i)
        shapes: dict[str, int] = {}
        for idx in g.values():
            for p in {_pattern(self.r.kernels[i].name) for i in idx}:
                shapes[p] = shapes.get(p, 0) + 1
        out: dict[str, list[int]] = {}
        for idx in g.values():
            names = [self.r.kernels[i].name for i in idx]
            pats = {_pattern(n) for n in names}
            if len(pats) == 1 and shapes[next(iter(pats))] == 1:
                out[next(iter(pats))] = idx
            elif len(names) <= 3:
                out[", ".join(names)] = idx
            else:
                out[f"{names[0]} and {len(names) - 1} more of its shape"] = idx
        return out

    def share(self, idx: Sequence[int]) -> float:
        return sum(self.r.kernels[i].cycles for i in idx) / self.total

    def program_index(self) -> dict[int, int]:
        """Kernel stats index -> program index."""
        ps = self.r.program_stats or []
        return {s: j for j, s in enumerate(ps) if s is not None}

    # -- re-tiling ---------------------------------------------------------------------
    def retileable(self, idx: Sequence[int]) -> bool:
        """Whether the kernels ``idx`` are the built-in GEMMs or vector kernels
        :meth:`retile` can try other tilings of (an extension's kernel tiles itself)."""
        pidx = self.program_index()
        prog = self.r.program or []
        ks = [prog[pidx[i]] for i in idx if i in pidx]
        return bool(ks) and (
            all(isinstance(k, GemmKernel) for k in ks)
            or all(isinstance(k, VectorKernel) for k in ks)
        )

    def retile(self, idx: Sequence[int]) -> tuple[dict[int, Any], str] | None:
        """Best tiling found for the GEMMs ``idx`` (same shape), as program changes."""
        pidx = self.program_index()
        prog = self.r.program or []
        ks = [prog[pidx[i]] for i in idx if i in pidx]
        if not ks or not (
            all(isinstance(k, GemmKernel) for k in ks)
            or all(isinstance(k, VectorKernel) for k in ks)
        ):
            return None
        k0 = ks[0]
        spec = self.r.spec
        base = time_kernel(spec, k0)
        if isinstance(k0, VectorKernel):
            return self._retile_vector(idx, ks, base)
        best_t, best = None, base
        for t in gemm_tilings(spec, k0, self.cfg.max_tilings):
            c = time_kernel(spec, dataclasses.replace(k0, tiling=t))
            if c < best:
                best_t, best = t, c
        if best_t is None or best > 0.98 * base:
            return None
        changes = {
            pidx[i]: dataclasses.replace(prog[pidx[i]], tiling=best_t)
            for i in idx
            if i in pidx
            and isinstance(prog[pidx[i]], GemmKernel)
            and (prog[pidx[i]].m, prog[pidx[i]].n, prog[pidx[i]].k, prog[pidx[i]].batch)
            == (k0.m, k0.n, k0.k, k0.batch)
        }
        t0 = k0.tiling
        desc = (
            f"tile {best_t.tm}x{best_t.tn}x{best_t.tk} (batch {best_t.tb}, order "
            f"{best_t.order}) instead of {t0.tm}x{t0.tn}x{t0.tk} (batch {t0.tb}, order "
            f"{t0.order}{f', on {t0.cores} cores' if t0.cores else ''}): "
            f"{self.ms(base):.3f} -> {self.ms(best):.3f} ms per kernel alone"
        )
        return changes, desc

    def _retile_vector(
        self, idx: Sequence[int], ks: list[Any], base: int
    ) -> tuple[dict[int, Any], str] | None:
        pidx = self.program_index()
        prog = self.r.program or []
        k0 = ks[0]
        best_r, best = None, base
        for rpt in vector_tilings(self.r.spec, k0)[: self.cfg.max_tilings]:
            c = time_kernel(self.r.spec, dataclasses.replace(k0, rows_per_tile=rpt))
            if c < best:
                best_r, best = rpt, c
        if best_r is None or best > 0.98 * base:
            return None
        changes = {
            pidx[i]: dataclasses.replace(prog[pidx[i]], rows_per_tile=best_r)
            for i in idx
            if i in pidx
            and isinstance(prog[pidx[i]], VectorKernel)
            and prog[pidx[i]].rows == k0.rows
        }
        return changes, (
            f"{best_r} rows per tile instead of {k0.rows_per_tile}: "
            f"{self.ms(base):.3f} -> {self.ms(best):.3f} ms per kernel alone"
        )

    # -- rules -------------------------------------------------------------------------
    def kernel_rules(self) -> None:
        seen: set[str] = set()
        for pat, idx in sorted(self.groups().items(), key=lambda x: -self.share(x[1])):
            share = self.share(idx)
            if share < self.cfg.min_time_share:
                continue
            ps = [self.profiles[i] for i in idx]
            cyc = max(1, sum(p.cycles for p in ps))
            time_ms = self.ms(sum(self.r.kernels[i].cycles for i in idx))
            # the group's figures, time-weighted over its kernels (one shape: the PE
            # mapping is theirs alike; the cores' balance may differ by launch)
            occ = sum(p.occupancy * p.cycles for p in ps) / cyc
            mapping = sum(p.pe_mapping * p.cycles for p in ps) / cyc
            balance = 100.0 * occ / mapping if mapping else 0.0
            n = f" (x{len(idx)})" if len(idx) > 1 else ""
            # occupancy is the arrays' (PE slots mapped, cores busy): it says nothing of
            # vector work or a unit off the arrays; and a memory-bound kernel's idle PEs
            # are expected (more PEs busy would only wait longer for bytes): for it, only a
            # tiling measured to move its bytes faster is a finding
            arrays = all(p.kind == "gemm" for p in ps)
            mem = [p for p in ps if p.bound in MEMORY_CEILINGS]
            if occ < 50.0 and arrays and len(mem) == len(ps) and pat not in seen:
                seen.add(pat)
                eff = sum((p.roofline_efficiency or 0.0) * p.cycles for p in ps) / cyc
                lvls = sorted({CEILING_NAMES[p.bound or "hbm"] for p in ps})
                self.tiling_rec(
                    idx,
                    "Memory-Bound Kernel Below Its Roof",
                    "memory",
                    f'Kernel "{pat}"{n} is bound by {" and ".join(lvls)} at {eff:.0f}% of '
                    f"that roof (its {occ:.0f}% occupancy is expected of a memory-bound "
                    "kernel)",
                    f"{time_ms:.3f} ms ({100 * share:.1f}% of the profiled time) below the "
                    "rate its memory allows",
                    "Tiles that keep more loads in flight or reuse panels in L2",
                    share,
                    occupancy=occ,
                    only_if_gain=True,
                )
            if occ < 50.0 and arrays and pat not in seen:
                seen.add(pat)
                self.tiling_rec(
                    idx,
                    "Low Kernel Occupancy",
                    "occupancy",
                    f'Kernel "{pat}"{n} has occupancy of {occ:.0f}% ({mapping:.0f}% of '
                    f"PE slots mapped x {balance:.0f}% of core time busy), wasting "
                    "compute resources",
                    f"Underutilizing {100 - occ:.0f}% of available compute units for "
                    f"{time_ms:.3f} ms ({100 * share:.1f}% of the profiled time)",
                    "Use tiles in multiples of the "
                    f"{self.dev.array_rows}x{self.dev.array_cols} array and at least "
                    f"{self.dev.cores} of them; batch small matrices into one kernel",
                    share,
                    occupancy=occ,
                )
            # array kernels bound by their compute side that reach under half of their
            # compute ceiling (the arrays' peak at their precision), each bound apart:
            # the finding names the bound its kernels share
            for b in ("compute", "pipeline", "parallelism"):
                sub = [i for i, p in zip(idx, ps, strict=True) if p.bound == b]
                if pat in seen or not sub or ps[0].kind != "gemm":
                    continue
                qs = [self.profiles[i] for i in sub]
                qcyc = max(1, sum(q.cycles for q in qs))
                util = (
                    sum((q.ceiling_pct("compute") or q.compute_utilization) * q.cycles for q in qs)
                    / qcyc
                )
                if util >= 50.0:
                    continue
                seen.add(pat)
                sshare = self.share(sub)
                sn = f" (x{len(sub)})" if len(sub) > 1 else ""
                what = "compute" if b == "compute" else f"its {CEILING_NAMES[b]}"
                self.tiling_rec(
                    sub,
                    "Low Compute Utilization",
                    "utilization",
                    f'Kernel "{pat}"{sn} is bound by {what} and reaches {util:.0f}% of '
                    "its compute ceiling",
                    f"{self.ms(sum(q.cycles for q in qs)):.3f} ms "
                    f"({100 * sshare:.1f}% of the profiled time) at under half the rate its "
                    "units allow",
                    "Increase parallelism or change the tiling to cut stalls and fill/drain",
                    sshare,
                    occupancy=sum(q.occupancy * q.cycles for q in qs) / qcyc,
                )
            hit = [(p.l2_cache_hit_rate, p.cycles) for p in ps if p.l2_cache_hit_rate is not None]
            l2 = sum(h * c for h, c in hit) / max(1, sum(c for _, c in hit)) if hit else None
            comp = sum(self.r.kernels[i].compulsory_bytes for i in idx)
            hbm = sum((p.bytes or {}).get("hbm", 0) for p in ps)
            if l2 is not None and l2 < 50.0 and comp and hbm > 2 * comp and pat not in seen:
                seen.add(pat)
                self.tiling_rec(
                    idx,
                    "Cache Thrashing",
                    "cache",
                    f'Kernel "{pat}"{n} moves {hbm / comp:.1f}x its '
                    f"compulsory bytes through HBM with an L2 hit rate of {l2:.0f}%",
                    f"{(hbm - comp) / 1e6:.1f} MB of repeated HBM traffic over {time_ms:.3f} ms",
                    "Change the loop order or tile sizes so a tile's panels stay in L2",
                    share,
                    occupancy=occ,
                )

    def tiling_rec(
        self,
        idx: Sequence[int],
        title: str,
        category: str,
        desc: str,
        impact: str,
        suggestion: str,
        share: float,
        occupancy: float,
        only_if_gain: bool = False,
    ) -> None:
        """A finding of the kernels ``idx`` with the best other tiling measured by a
        replay of the session (or, without one, a modelled bound); ``only_if_gain``: none
        unless a tiling measured faster in the run."""
        names = tuple(self.r.kernels[i].name for i in idx)
        if only_if_gain and not (self.can_replay and self.retileable(idx)):
            return
        if self.can_replay and self.retileable(idx):
            found = self.retile(idx)
            if found is None and only_if_gain:
                return
            if found is None:
                self.add(
                    0.0,
                    MEASURED,
                    f"measured: none of up to {self.cfg.max_tilings} other tilings ran "
                    "this kernel 2% faster alone on the emulator; the loss is in the "
                    "shape, not the tiling",
                    title=title,
                    description=desc,
                    impact=impact,
                    suggestion=suggestion,
                    category=category,
                    kernels=names,
                )
                return
            changes, how = found
            # the fix names exactly the kernels the replay changed: what it applies is
            # what was measured
            pidx = self.program_index()
            names = tuple(self.r.kernels[i].name for i in idx if i in pidx and pidx[i] in changes)
            imp, basis, b_ms, m_ms = self.measure(substitute(self.r.program or [], changes))
            if m_ms >= b_ms and only_if_gain:
                return
            if m_ms >= b_ms:
                # faster alone, not in the run (its neighbours' caches, the cores' share):
                # no fix to offer, as applying it would give what was measured, a loss
                self.add(
                    0.0,
                    MEASURED,
                    f"{basis}; the tiling faster alone ({how.split(': ')[-1]}) does not make "
                    "the run faster",
                    title=title,
                    description=desc,
                    impact=impact,
                    suggestion=suggestion,
                    category=category,
                    kernels=names,
                    baseline_ms=b_ms,
                    modified_ms=m_ms,
                )
                return
            example = _retile_example(names, next(iter(changes.values())))
            self.add(
                imp,
                MEASURED,
                basis,
                title=title,
                description=desc,
                impact=impact,
                suggestion=f"{suggestion}: {how}",
                fix=Fix("api", example, f"lower {len(names)} kernel(s) with {how.split(':')[0]}"),
                category=category,
                kernels=names,
                baseline_ms=b_ms,
                modified_ms=m_ms,
            )
        else:
            bound = share * max(0.0, 1.0 - occupancy / 100.0) * 0.5
            self.add(
                bound,
                MODELLED,
                "modelled: half the unmapped share of the kernels' time "
                + (
                    "(an extension tiles these kernels itself: no other tiling to try)"
                    if self.can_replay
                    else "(the report has no kernels to re-run)"
                ),
                title=title,
                description=desc,
                impact=impact,
                suggestion=suggestion,
                category=category,
                kernels=names,
            )

    def fusion_rules(self) -> None:
        prog = self.r.program
        if not prog:
            return
        spec = self.r.spec
        ridge = self.dev.ridge_point(self.r.precision)
        pats: dict[tuple[str, str], dict[int, Any]] = {}
        removed: dict[tuple[str, str], list[int]] = {}
        i = 0
        while i + 1 < len(prog):
            a, b = prog[i], prog[i + 1]
            if not isinstance(b, VectorKernel) or isinstance(a, str):
                i += 1
                continue
            ai = b.flops / max(1, b.compulsory_bytes)
            fused = fuse_gemm_epilogue(spec, prog, i) or fuse_vector_pair(spec, prog, i)
            if fused is None or ai >= self.own_ridge(b, ridge):
                i += 1
                continue
            key = (_pattern(a.name), _pattern(b.name))
            pats.setdefault(key, {})[i] = fused
            pats[key][i + 1] = None
            removed.setdefault(key, []).append(i + 1)
            i += 2
        stats = self.program_index()
        inv = {j: s for s, j in stats.items()}
        for (pa, pb), changes in pats.items():
            consumers = removed[(pa, pb)]
            cyc = sum(self.r.kernels[inv[j]].cycles for j in consumers if j in inv)
            share = cyc / self.total
            if share < self.cfg.min_time_share:
                continue
            n = len(consumers)
            mid = sum(
                prog[j - 1].c.nbytes
                if isinstance(prog[j - 1], GemmKernel)
                else prog[j - 1].outputs[0].nbytes
                for j in consumers
            )
            kind = (
                "epilogue of"
                if isinstance(prog[consumers[0] - 1], GemmKernel)
                else "one vector pass with"
            )
            b = prog[consumers[0]]
            # what binds the consumers as measured (the kernel profile's bound model):
            # their intermediate may come from L2, not HBM
            bounds = {
                KernelProfile.from_stats(self.r.kernels[inv[j]], self.dev).bound
                for j in consumers
                if j in inv
            }
            bounds.discard(None)
            names = {
                "vector unit" if c == "compute" and isinstance(b, VectorKernel) else c
                for c in bounds
            }
            measured = (
                "as measured, memory-bound"
                if bounds and bounds <= set(MEMORY_CEILINGS)
                else f"as measured, bound by its {' / '.join(sorted(names))}"
                if bounds
                else "no measured bound"
            )
            desc = (
                f'Kernel "{pb}" (x{n}) is a separate pass over "{pa}"\'s output, which it '
                f"reads back from memory (AI={b.flops / max(1, b.compulsory_bytes):.2g} "
                f"FLOP/byte over its compulsory bytes, below its ridge point "
                f"{self.own_ridge(b, ridge):.3g}; {measured})"
            )
            impact = (
                f"{self.ms(cyc):.3f} ms ({100 * share:.1f}% of the profiled time) in "
                f"the {n} kernels; {2 * mid / 1e6:.1f} MB of intermediate writes and "
                "reads"
            )
            sugg = f'Fuse "{pb}" into the {kind} "{pa}" so the intermediate stays on chip'
            names = tuple(self.r.kernels[inv[j]].name for j in consumers if j in inv)
            fix = self.fusion_fix(pa, pb, [(prog[j - 1], prog[j]) for j in consumers])
            if self.can_replay:
                imp, basis, b_ms, m_ms = self.measure(substitute(prog, changes))
                how = dict(basis=basis, baseline_ms=b_ms, modified_ms=m_ms)
                conf = MEASURED
            else:  # AnalysisConfig(measure=False): the intermediate's bytes at HBM rate
                hz = self.dev.clock_ghz * 1e9
                imp = min(cyc, 2 * mid / (self.dev.hbm_bandwidth_gbs * 1e9) * hz) / self.total
                how = dict(basis="modelled: intermediate bytes at HBM bandwidth")
                conf = MODELLED
            self.add(
                imp,
                conf,
                title="Unfused Elementwise Chain",
                description=desc,
                impact=impact,
                suggestion=sugg,
                fix=fix,
                category="fusion",
                kernels=names,
                **how,
            )

    def fusion_fix(self, pa: str, pb: str, pairs: Sequence[tuple[Any, Any]]) -> Fix:
        """The fix of a fusion finding over ``pairs`` (producer kernel, consumer kernel):
        :func:`wia_hw.apply_fusion` with the one :class:`FusionConfig` field whose
        pattern marks exactly these pairs, else an extension manifest composing the two
        ops with ``cost: builtin`` and claiming the producers by name; either way exactly
        the measured pairs fuse, into the kernels the measurement replayed."""
        field_ = self.fusion_field(pairs)
        if field_ is not None:
            from ..optimize._fusion import FUSION_PATTERNS

            flags = ",\n".join(f"        {f}={f == field_}" for f in FUSION_PATTERNS.values())
            code = (
                "from wia_hw.runtime import resolve_workload\n\n"
                "graph = resolve_workload(workload, **run_kwargs)\n"
                "fused = wia_hw.apply_fusion(\n"
                f"    graph,\n    wia_hw.FusionConfig(\n{flags},\n    ),\n)\n"
                "result = ctx.run(fused)   # one kernel per chain, the intermediate on chip"
            )
            return Fix(
                "api", code, f"apply_fusion with {field_} only (it fuses exactly these chains)"
            )
        return Fix(
            "manifest",
            _fusion_manifest(pa, pb, pairs),
            f'an extension fusing "{pb}" into "{pa}" (cost: builtin, no copied formula)',
        )

    def fusion_field(self, pairs: Sequence[tuple[Any, Any]]) -> str | None:
        """The :class:`FusionConfig` field whose pattern alone fuses exactly the pairs'
        ops (each pair one chain, no other chain) in the session's graphs, or None."""
        if not self.r.graphs:
            return None
        from ..optimize._fusion import FUSION_PATTERNS, FusionConfig, apply_fusion

        want = {(a.op, b.op) for a, b in pairs}
        for f in FUSION_PATTERNS.values():
            if f == "fuse_attention":
                continue
            cfg = FusionConfig(**{g: g == f for g in FUSION_PATTERNS.values()})
            got = set()
            for g in self.r.graphs:
                for op in apply_fusion(g, cfg).ops:
                    m = op.attrs.get("fusion")
                    if m and m["position"] == 0 and len(m["ops"]) == 2:
                        got.add(tuple(m["ops"]))
            if want == got:
                return f
        return None

    def own_ridge(self, k: Any, default: float) -> float:
        """HBM ridge point of a kernel's own compute ceiling (its op class's rate for a
        vector kernel)."""
        ideal = ideal_cycles(k, self.r.spec)
        if not ideal or not k.flops:
            return default
        return k.flops / (ideal / (self.dev.clock_ghz * 1e9)) / (self.dev.hbm_bandwidth_gbs * 1e9)

    def memory_rules(self) -> None:
        mem = self.r.memory
        if mem is None:
            return
        stack_of = {e[2]: e[9] for e in mem.events if e[1] == "malloc"}
        done: set[tuple[str, int, str, str]] = set()
        for s in (mem.top_sites or []) + [x.allocation_site for x in mem.leaks or []]:
            if (
                s.count < self.cfg.hot_path_allocations
                or not s.description.startswith("ctx.allocate")
                or (s.file, s.line, s.function, s.description) in done
            ):
                continue
            done.add((s.file, s.line, s.function, s.description))
            desc = (
                f"{s.description} at {s.file}:{s.line} ({s.function}) called "
                f"{s.count}x in the profiled region"
            )
            impact = (
                f"Allocation overhead adds {self.ms(s.device_cycles):.3f} ms of device "
                f"time ({100 * s.device_cycles / self.total:.1f}%)"
            )
            sugg = "Pre-allocate buffers outside loop or use memory pooling"
            fix = Fix(
                "api",
                "from dataclasses import replace\n"
                "from wia_hw.emulator.allocator import CachingAllocator\n\n"
                "# the allocator with size-class pooling and caching (what was measured);\n"
                "# or allocate once before the loop: buf = ctx.allocate(max_bytes)\n"
                "a = ctx.allocator\n"
                "ctx.allocator = CachingAllocator(\n"
                "    a.capacity_bytes, replace(a.config, pooling=True, caching=True)\n"
                ")\n"
                "# then run your loop as before",
                "the context's allocator with size-class pooling and caching",
            )
            key = (s.file, s.line, s.function)

            def at_site(e: tuple[Any, ...], key: tuple[str, int, str] = key) -> bool:
                si = stack_of.get(e[2], -1)
                top = mem.stacks[si][0] if si >= 0 and mem.stacks[si] else None
                where = (
                    ("<unknown>", 0, "<unknown>")
                    if top is None
                    else (top.file, top.line, top.function)
                )
                return e[6] == "user" and where == key

            base_cfg = AllocatorConfig(**mem.allocator_config)
            cap = mem.capacity_bytes or self.dev.hbm_size_bytes
            base, _ = replay_allocations(mem.events, cap, base_cfg, at_site)
            pooled, _ = replay_allocations(
                mem.events, cap, dataclasses.replace(base_cfg, pooling=True, caching=True), at_site
            )
            saved = max(0, base - pooled)
            self.add(
                saved / self.total,
                MEASURED,
                f"measured: replayed the session's {mem.num_allocations} allocations on "
                f"the session's allocator and on one with size-class pooling (and "
                f"caching): {base} -> {pooled} device cycles at this site",
                title="Memory Allocation in Hot Path",
                description=desc,
                impact=impact,
                suggestion=sugg,
                fix=fix,
                category="memory",
                kernels=(),
            )

    # -- attention -----------------------------------------------------------------
    def attention_chains(self) -> list[tuple[int, list[str]]]:
        """(run index, op names) of every attention chain (``bmm`` with ``transpose_b``,
        ``softmax``, ``bmm``, each read only by the next) in the session's graphs."""
        from ..registry import match_chain

        out = []
        for run, g in enumerate(self.r.graphs or []):
            for op in g.ops:
                if op.kind != "bmm" or not op.attrs.get("transpose_b"):
                    continue
                chain = match_chain(g, op, [("bmm",), ("softmax",), ("bmm",)])
                if chain is not None:
                    out.append((run, [o.name for o in chain]))
        return out

    def attention_rule(self) -> None:
        """Flash attention through the transformer engine, measured by lowering the
        session's graphs again with the engine registered and replaying them."""
        chains = self.attention_chains()
        if not chains:
            return
        names = {n for _, ch in chains for n in ch}
        idx = [i for i, k in enumerate(self.r.kernels) if k.op in names]
        cyc = sum(self.r.kernels[i].cycles for i in idx)
        share = cyc / self.total
        kinds = {self.r.kernels[i].provider for i in idx}
        owners = {v[0] for v in (self.r.providers or {}).values()}
        if "transformer_engine" in owners or any("transformer" in (k or "") for k in kinds):
            self.notes["attention"] = (
                "attention already runs through the transformer engine (flash attention)"
            )
            return
        n = len(chains)
        desc = (
            f"{n} attention chain{'s' if n > 1 else ''} (scores GEMM, softmax, context "
            f"GEMM) write the S x S scores and probabilities to memory and run the "
            f"scores GEMM in short passes (K = head dim)"
        )
        impact = f"{self.ms(cyc):.3f} ms ({100 * share:.1f}% of the profiled time) in the chains"
        sugg = (
            "Run attention as one flash-attention kernel through the transformer "
            "engine: scores stay on chip, softmax is fused between the two GEMMs"
        )
        fix = Fix(
            "api",
            'wia_hw.register_device_extension(ctx, "transformer_engine")\n'
            "result = ctx.run(workload, **run_kwargs)   # attention lowers to flash attention\n"
            "# CLI: wia-hw profile WORKLOAD --ext transformer_engine",
            "register the transformer engine: attention chains run as flash attention",
        )
        kernels = tuple(self.r.kernels[i].name for i in idx)
        program = self.attention_program()
        if program is None:
            bound = share * 0.5
            self.add(
                bound,
                MODELLED,
                "modelled: half the chains' time (the report keeps no graphs to lower again)",
                title="Unfused Attention",
                description=desc,
                impact=impact,
                suggestion=sugg,
                fix=fix,
                category="attention",
                kernels=kernels,
            )
            return
        imp, basis, b_ms, m_ms = self.measure(program)
        self.add(
            imp,
            MEASURED,
            basis.replace(
                "without and with the change",
                "as lowered and with the transformer engine registered (flash attention)",
            ),
            title="Unfused Attention",
            description=desc,
            impact=impact,
            suggestion=sugg,
            fix=fix,
            category="attention",
            kernels=kernels,
            baseline_ms=b_ms,
            modified_ms=m_ms,
        )

    def attention_program(self) -> list[Any] | None:
        """The session's program with every run lowered again with the transformer
        engine registered (on a copy of the session's providers)."""
        import copy

        if not self.can_replay or not self.r.graphs or self.r.program is None:
            return None
        from ..lowering import lower
        from ..registry import ensure_extension

        class _Ctx:  # what registering an extension touches
            def __init__(self, providers: dict[str, Any]) -> None:
                self.providers = providers
                self.extensions: dict[str, Any] = {}

        provs: dict[str, Any] = {}
        for key, (owner, fn) in (self.r.providers or {}).items():
            if hasattr(fn, "entries"):
                fn = copy.copy(fn)
                fn.entries = list(fn.entries)
            provs[key] = (owner, fn)
        tmp = _Ctx(provs)
        ensure_extension(tmp, "transformer_engine", claims=True)
        out: list[Any] = []
        for g in self.r.graphs:
            for _, ks in lower(g, self.r.spec, tmp.providers):
                out.extend(ks)
            out.append(FLUSH)
        return out

    # -- coverage ----------------------------------------------------------------------
    def coverage(
        self, shown: Sequence[Recommendation], min_share: float = 0.05
    ) -> list[dict[str, Any]]:
        """Every op group (operation class) above ``min_share`` of the profiled time with
        the ``shown`` recommendations that name its kernels, or the reason none applies
        (findings below the thresholds included)."""
        if not self.r.ops:
            return []
        groups: dict[str, list[int]] = {}
        cyc: dict[str, int] = {}
        for op in self.r.ops:
            groups.setdefault(op.group, []).extend(op.kernels)
            cyc[op.group] = cyc.get(op.group, 0) + op.end_cycle - op.start_cycle
        out = []
        for g, idx in sorted(groups.items(), key=lambda x: -cyc[x[0]]):
            share = cyc[g] / self.total
            if share < min_share:
                continue
            names = {self.r.kernels[i].name for i in idx}
            recs = [r for r in shown if names & set(r.kernels)]
            reason = None
            if not recs:
                reason = self.why_none(g, idx, [r for r in self.out if names & set(r.kernels)])
            out.append(
                {
                    "group": g,
                    "share": share,
                    "time_ms": self.ms(cyc[g]),
                    "recommendations": [r.title for r in recs],
                    "reason": reason,
                }
            )
        wb = sum(r.writeback_cycles for r in self.r.runs)
        if wb and wb / self.total >= min_share:
            out.append(
                {
                    "group": "writeback",
                    "share": wb / self.total,
                    "time_ms": self.ms(wb),
                    "recommendations": [],
                    "reason": "the runs' final write-back of their results (dirty L2 "
                    "blocks) to HBM, bound by HBM bandwidth: only smaller outputs (a lower "
                    "precision) or a host that reads them from L2 (memory.host_io: l2) "
                    "shorten it",
                }
            )
            out.sort(key=lambda d: -d["share"])
        return out

    def why_none(self, group: str, idx: Sequence[int], recs: Sequence[Recommendation]) -> str:
        """Why no change is recommended for a group's kernels, from their bounds."""
        if group == "multi_head_attention" and "attention" in self.notes:
            return self.notes["attention"]
        by: dict[str, list[int]] = {}
        for i in idx:
            p = self.profiles[i]
            # a unit off the arrays (photonic, analog, PIM): its cost model sets its time
            key = (p.bound or "unknown") if p.kind in ("gemm", "vector") else f"unit:{p.kind}"
            by.setdefault(key, []).append(i)
        parts = []
        for b, ii in sorted(by.items(), key=lambda x: -sum(self.r.kernels[i].cycles for i in x[1])):
            c = sum(self.r.kernels[i].cycles for i in ii)
            pats = sorted({_pattern(self.r.kernels[i].name) for i in ii})
            if b.startswith("unit:"):
                parts.append(
                    f"{', '.join(pats[:3])}{', ...' if len(pats) > 3 else ''}: run on the "
                    f"{b[5:]} unit, off the arrays (its cost model sets their time)"
                )
                continue
            if b == "unknown":  # no byte counts: their memory ceilings are unknown
                parts.append(
                    f"{', '.join(pats[:3])}{', ...' if len(pats) > 3 else ''}: bound "
                    f"unknown, {MEMORY_UNKNOWN}"
                )
                continue
            eff = sum(
                (self.profiles[i].roofline_efficiency or 0.0) * self.r.kernels[i].cycles for i in ii
            ) / max(1, c)
            parts.append(
                f"{', '.join(pats[:3])}{', ...' if len(pats) > 3 else ''}: "
                f"{CEILING_NAMES.get(b, b)}-bound at {eff:.0f}% of that ceiling"
            )
        tried = (
            "; below the thresholds: "
            + ", ".join(
                f"{r.title} ({r.confidence_basis.split(':')[0]} "
                f"{100 * r.estimated_improvement:.1f}%)"
                for r in recs
            )
            if recs
            else ""
        )
        return (
            "no change passes the thresholds: "
            + "; ".join(parts)
            + tried
            + " (near its binding ceiling only less work, e.g. int8 or sparsity, makes "
            "a kernel faster)"
        )

    def thermal_rule(self) -> None:
        th = self.r.counters.stall_cycles.get("thermal", 0)
        if not th:
            return
        cores = self.dev.cores
        desc = (
            f"The clock throttled above the thermal limit: {th:,} core-cycles of thermal "
            f"stall ({100 * th / (cores * self.total):.1f}% of core time)"
        )
        impact = f"about {self.ms(th / cores):.3f} ms of the {self.ms(self.total):.3f} ms"
        sugg = (
            "Keep the die below its throttle temperature: better cooling (lower "
            "thermal resistance), less energy per inference (int8, fusion), or pauses "
            "between bursts"
        )
        fix = Fix(
            "api",
            "from dataclasses import replace\n\n"
            "# the device with no throttling: the most better cooling can give\n"
            "cooled = replace(ctx.spec, thermal=replace(ctx.spec.thermal, throttle_factor=1.0))\n"
            "ctx = wia_hw.Context(cooled, seed=ctx.seed)\n"
            "result = ctx.run(workload, **run_kwargs)",
            "a device that does not throttle (a cooling change, not a software one)",
        )
        if self.can_replay:
            spec = self.r.spec
            cool = dataclasses.replace(
                spec, thermal=dataclasses.replace(spec.thermal, throttle_factor=1.0)
            )
            imp, basis, b_ms, m_ms = self.measure(self.r.program or [], cool)
            self.add(
                imp,
                MEASURED,
                basis + " (throttling switched off: the most cooling can give)",
                title="Thermal Throttling",
                description=desc,
                impact=impact,
                suggestion=sugg,
                fix=fix,
                category="thermal",
                baseline_ms=b_ms,
                modified_ms=m_ms,
            )
        else:
            self.add(
                th / cores / self.total,
                MODELLED,
                "modelled: thermal stall cycles per core",
                title="Thermal Throttling",
                description=desc,
                impact=impact,
                suggestion=sugg,
                fix=fix,
                category="thermal",
            )

    def communication_rule(self) -> None:
        events = self.r.communication.get("events") or []
        if not events:
            return
        busy = sorted((k.start_cycle, k.end_cycle) for k in self.r.kernels)
        comm = exposed = 0
        for e in events:
            s, t = int(e["start_cycle"]), int(e["end_cycle"])
            comm += t - s
            covered = sum(max(0, min(t, b) - max(s, a)) for a, b in busy)
            exposed += max(0, (t - s) - covered)
        if not exposed:
            return
        self.add(
            exposed / self.total,
            MODELLED,
            "modelled: the exposed communication time, "
            "an upper bound reached with perfect overlap (multi-device runs are not "
            "emulated yet, so the change cannot be re-run)",
            title="Inefficient Communication Pattern",
            description=f"{100 * exposed / max(1, comm):.0f}% of communication is not "
            "overlapped with computation",
            impact=f"{self.ms(exposed):.3f} ms of communication serialized with compute",
            suggestion="Split gradient all-reduce into layer-wise chunks and overlap "
            "with backward pass",
            category="communication",
        )


def _fusion_manifest(pa: str, pb: str, pairs: Sequence[tuple[Any, Any]]) -> str:
    """An extension manifest (YAML) that fuses each pair's consumer into its producer,
    timed by the emulator's own kernels (``cost: builtin``)."""
    a0, b0 = pairs[0]
    head = "matmul" if isinstance(a0, GemmKernel) else a0.op_kind
    producers = list(dict.fromkeys(a.op for a, _ in pairs))
    claims = producers if all("." in n for n in producers) else [a0.op_kind]
    ident = re.sub(r"\W+", "_", f"{pa}_{pb}").strip("_")
    listed = "".join(f"\n      - {json.dumps(c)}" for c in claims)
    return (
        "schema_version: 1\n"
        f"extension_id: fuse_{ident}\n"
        'version: "1.0"\n'
        f"description: {json.dumps(f'{pb} fused into {pa}, the intermediate kept on chip')}\n"
        "operations:\n"
        f"  - name: fused_{ident}\n"
        f"    claims:{listed}\n"
        f"    compose: [{head}, {b0.op_kind}]\n"
        "    cost: builtin   # the emulator's own kernels, fused as apply_fusion fuses\n"
    )


def _retile_example(ops: Sequence[str], k: Any) -> str:
    """Runnable code that lowers ``ops`` with ``k``'s tiling (or row chunking)."""
    if isinstance(k, GemmKernel):
        t = k.tiling
        change = f"tiling={t!r}"  # GemmTiling(tm=..., order=...[, cores=...])
        imp = "from wia_hw.emulator.kernels import GemmTiling\n"
    else:
        change = f"rows_per_tile={k.rows_per_tile}"
        imp = ""
    m = [re.match(r"^layer(\d+)\.(.+)$", n) for n in ops]
    if (
        len(ops) > 2
        and all(m)
        and len({x.group(2) for x in m if x}) == 1
        and sorted(int(x.group(1)) for x in m if x) == list(range(len(ops)))
    ):
        names = f'f"layer{{i}}.{m[0].group(2) if m[0] else ""}" for i in range({len(ops)})'
    else:
        names = ", ".join(repr(n) for n in ops)
    return (
        f"from dataclasses import replace\n{imp}from wia_hw.lowering import lower_op\n\n"
        f"def retiled(op, graph, spec, storage):\n"
        f"    return [replace(k, {change})\n"
        f"            for k in lower_op(op, graph, spec, storage)]\n\n"
        f"for name in [{names}]:\n"
        f'    ctx.providers[name] = ("retiled", retiled)\n'
        f"result = ctx.run(workload, **run_kwargs)   # the same workload, re-tiled"
    )


def analyze_performance(
    report: ProfilingReport, cfg: AnalysisConfig | None = None
) -> PerformanceRecommendations:
    """Recommendations for a profiled session (the seed's ``wia_analyze_performance``);
    see the module docstring for the rules, the measurement and the filtering. A
    training iteration (``wia_hw.train_iteration``'s result) is analysed by its own
    rules (``wia_hw.train._recommend``: the measured communication-overlap gain)."""
    if hasattr(report, "communication_recommendations"):  # duck-typed: train sits above
        return report.communication_recommendations(cfg)  # type: ignore[no-any-return]
    if not isinstance(report, ProfilingReport):
        raise TypeError(f"analyze_performance takes a ProfilingReport, got {type(report).__name__}")
    if cfg is None:
        cfg = AnalysisConfig()
    a = _Analyzer(report, cfg)
    if cfg.analyze_kernels and report.kernels:
        a.kernel_rules()
        a.fusion_rules()
        a.attention_rule()
        a.thermal_rule()
    if cfg.analyze_memory:
        a.memory_rules()
    if cfg.analyze_communication:
        a.communication_rule()
    ranked = sorted(a.out, key=lambda r: (-r.priority, -r.estimated_improvement, r.title))
    keep = [
        r
        for r in ranked
        if r.priority >= Priority(cfg.priority_threshold)
        and r.confidence >= cfg.confidence_threshold
    ]
    return PerformanceRecommendations(
        keep,
        ranked,
        a.ms(a._base) if a._base is not None else None,
        a.coverage(keep) if cfg.analyze_kernels else [],
    )
