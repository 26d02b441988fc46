"""Kernel auto-tuning: search each GEMM kernel's schedule on the emulator (the seed's
section 8.7 step 3).

:func:`autotune_model` lowers a graph, groups its built-in GEMM kernels by
:func:`~wia_hw.lowering.gemm_key` (the 24 layers of BERT-Large share 6 keys: each is
tuned once) and searches, per key, the schedule that takes the fewest cycles.

**Search space** (:func:`candidate_pool`), per kernel:

* tile sizes ``tm``/``tn``: whole multiples of the array's rows/cols (x1, 2, 3, 4, 6,
  8, 12, 16, ...) below the padded extent, and the whole extent; ``tk``: the whole K or
  multiples of the array rows (x1, 2, 4, 8, ...); ``tb`` (batched GEMMs whose matrices
  fit one tile): 1, 2, 4, ... up to the batch. Every candidate fits the double-buffered
  L1 exactly as lowering's heuristic requires: ``tb (tm + tn) tk bytes <= L1/2`` and
  ``tb tm tn out_bytes <= L1/4``; candidates of more than ``max_tiles`` tiles are left
  out (their per-tile overhead already loses, and they are slow to emulate).
* loop order over output tiles: ``mn`` (tiles sharing an A panel adjacent) or ``nm``.
* core split: a core's share is a contiguous run of tiles in loop order
  (``Device.partition``), so the order also chooses whether cores split M (``mn``) or N
  (``nm``); the split granularity is the minimum number of output tiles per core (1,
  2, 4; an output tile's K slices run on one core): tiles are halved, the larger side
  first, until the kernel has that many per core; and, where that leaves fewer than
  two output tiles a core and the kernel's operands all come from HBM, how many cores
  take part (``GemmTiling.cores``: all, half or a quarter of them, the rest idle; a
  kernel that reads another op's output stays on all of them, as lowering keeps it:
  on fewer, it slows the op after it, which reads that output from the L1s of the
  cores that wrote it, :func:`wia_hw._tiling.choose_gemm_tiling`).
  More tiles per core balance the cores and overlap loads with compute; fewer reuse
  more per tile; fewer cores load smaller first tiles through the shared ports.
* dataflow: the array of a spec has one (``compute.array.dataflow``: ``os`` or ``ws``),
  not both, so it is not searched; each schedule records the dataflow it was tuned for
  and its spec hash, so it never applies to another array.

**Measurement.** A candidate's cost is its cycles on a fresh device
(:class:`~wia_hw.emulator.device.Device`, cold caches) running that kernel alone: the
emulator itself, not a model of it. The search only needs to know whether a candidate
beats the best so far, so a cache miss is decided in the cheapest exact way
(:mod:`._fast_eval`):

1. ``pruned``: a closed-form lower bound of its cycles (:func:`cycles_lower_bound`:
   each core's array chain with no operand ever late, its last result store, and HBM's
   compulsory bytes; never above the emulator's count, tested on random cases over
   the shipped specs) is already at or above the best: it cannot win, and no emulator
   runs (tens of microseconds to under a millisecond);
2. ``cut``: else the emulator runs the kernel and is stopped at the best's cycle if
   it has not ended (:class:`PartialRun`; the run is kept, and continued rather than
   restarted if a later search asks again against a higher best);
3. ``run``: a kernel that ends before that cycle (it beats the best), and every
   default tiling (trial 0), has its whole run, exactly ``Device(spec).execute``'s
   record, cached.

So the best tiling, its cycles and the best-so-far after every trial are those of a
search that runs every candidate whole (``AutotuneConfig(prune=False)`` does; tested).
The ML tuner learns a candidate that does not beat the best as ``max(bound, best)``:
all that a fresh process knows of it, whatever the caches hold, so a search's result
never depends on the searches run before it in the process. Whole runs are cached by (spec hash, kernel key, tiling)
for the life of the process (tilings that give the emulator the same tiles share an
entry, :func:`canonical_tiling`), so a candidate met again costs a dictionary look-up.
A whole or cut run costs what the emulator takes, about 30 to 120 us per tile (1 to 35
ms on BERT-Large's GEMMs): the shared L2's LRU order depends on how the cores' loads
interleave and edge blocks spread over the HBM channels by address, so no periodic
extrapolation of a run is known to be exact. ``AutotuneResult`` counts each kind and the wall time of each cold
candidate (``cold_walls_s``, ``cold_candidates_per_s``).

**Methods** (``AutotuneConfig.method``):

* ``grid``: the pool in canonical order (tm, tn, tk, tb, order, cores), evenly strided to fit
  ``max_trials``;
* ``random``: a seeded permutation of the pool;
* ``ml``: a cost model learned from the trials measured so far, in the spirit of TVM's
  XGBoost tuner: after a first random batch, it fits gradient-boosted trees
  (scikit-learn ``GradientBoostingRegressor``, ``cost_model="gbt"``) or a ridge
  regression on quadratic features (numpy, ``cost_model="ridge"``) to the log cycles of
  the measured candidates from their features (:func:`schedule_features`: log tile
  sizes, tile counts, tiles per core and imbalance, the share of the cores used,
  padding waste on the array, L1 footprint, reuse per byte, loop order; and the log of
  the candidate's closed-form
  lower bound, which the pruning computes anyway: the model learns how far above it
  each kind of tiling lands), ranks every unmeasured candidate of the pool
  and measures the best ``batch_size`` of them, each slot replaced by a random one
  with probability ``epsilon`` (exploration). A candidate's features are computed when
  first needed (the pool's before the first fit, in chunks with the deadline checked
  between), so a ``time_budget_seconds`` holds; without one, the search is the same.

The heuristic's own tiling is measured first (trial 0) and kept when nothing beats it,
so a tuned kernel is never slower than the default on its own.

**In-graph check.** Alone on a fresh device is not how a kernel runs in the graph: its
operands may already be in L2 (views into the op before's output), where a tiling
tuned cold can thrash (bert-base's attention-score bmm on wia-edge: 18,623 -> 15,839
cycles alone, 24,992 -> 225,080 in the graph). So after the search
:func:`autotune_model` runs the whole graph on a fresh device (the runtime's own
``run``, with the context's extensions) with the default tilings and with the tuned
ones, sums each kernel key's in-graph cycles, and drops (falls back to the default
for) every key whose kernels got slower; it runs again with the rest until no key is
slower, and if the whole graph still is, drops them all. What was dropped and why is
in ``KernelTuning.dropped``, ``AutotuneResult.notes`` and ``table()``; the schedules
handed back (``schedules``, ``entries()``, ``save``) never make that graph slower on
that device. The check costs 2 or more graph runs after the search, outside
``time_budget_seconds`` (``check_s``). Every choice is
seeded: the same graph, spec, config and seed give the same schedules, unless a
``time_budget_seconds`` cuts the search at a wall-clock-dependent point.

**Selecting kernels.** ``kernels_to_tune`` names kernel keys, or ops and kernels of
the graph as the run reports them: ``layer0.feed_forward_output``, or
``feed_forward_output`` without the ``layerN.`` prefix, as ``wia-hw run``'s Top kernels
table prints the op of every layer (it selects that op in every layer), so the seed's
``"attention_qkv_projection"`` ... ``"feed_forward_output"`` work as written. A name of
an op without a built-in GEMM kernel (the seed's ``"attention_softmax"``, a vector op)
is skipped with a :class:`KernelSkippedWarning` naming it and why.

Errors: an :class:`AutotuneError` (one line naming the field) for a budget of 0, a
field of the wrong type or range (a seed is a non-negative integer), an unknown method
or cost model, an empty ``kernels_to_tune``, a name in it that matches no op, kernel or
kernel key of the graph, or names that all skip (nothing would be tuned).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import re
import time
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .._files import update_locked
from .._tile_estimate import operands_cold
from ..emulator.config import DeviceSpec
from ..emulator.device import Device
from ..emulator.enums import StrNamedEnum
from ..emulator.errors import WiaError
from ..emulator.kernels import GemmKernel, GemmTiling
from ..graph import GEMM_KINDS, Graph
from ..lowering import Storage, gemm_key, lower
from ._fast_eval import PartialRun, canonical_tiling, cycles_lower_bound
from ._quant import _is_int
from ._schedules import (
    AutotuneError,
    ScheduleError,
    Schedules,
    read_entries,
    save_schedules,
    spec_hash,
    tiling_fields,
)

__all__ = [
    "METHODS",
    "COST_MODELS",
    "AutotuneConfig",
    "AutotuneMethod",
    "AutotuneResult",
    "KernelSkippedWarning",
    "KernelTuning",
    "autotune_model",
    "candidate_pool",
    "schedule_features",
    "measure_cycles",
    "kernel_floor_cycles",
    "load_measurements",
    "save_measurements",
]

METHODS = ("grid", "random", "ml")


class AutotuneMethod(StrNamedEnum):
    """The seed's ``WIA_AUTOTUNE_*`` methods; ``AutotuneConfig.method`` also takes their
    values or names as strings (``"ml"``, ``"ml_guided"``, ``"ML-guided"``)."""

    GRID = "grid"
    RANDOM = "random"
    ML_GUIDED = "ml"


COST_MODELS = ("gbt", "ridge")


class KernelSkippedWarning(UserWarning):
    """A name of ``AutotuneConfig.kernels_to_tune`` that names only ops without a
    built-in GEMM kernel (the seed's ``attention_softmax``, a vector op) was skipped:
    auto-tuning searches GEMM tilings."""


@dataclass(frozen=True)
class AutotuneConfig:
    """How to tune.

    ``method``: ``grid``, ``random`` or ``ml`` (an :class:`AutotuneMethod`; see the
    module docstring).
    ``time_budget_seconds``: wall seconds for the whole graph (shared among the kernels
    still to tune; counted from the call, the ML cost model's import included, to the
    in-graph check, which is outside it), ``None`` for no limit. ``max_trials``:
    candidates measured per kernel key (the default tiling, measured first, is not
    counted). Both must be positive. ``kernels_to_tune``: op or kernel names, with or
    without their ``layerN.`` prefix, or kernel keys (``None``: every built-in GEMM
    kernel; see the module docstring). ``seed``: every random choice.
    ``batch_size``/``epsilon``: the ML tuner's candidates per round and exploration
    probability. ``cost_model``: ``gbt`` (scikit-learn) or ``ridge`` (numpy).
    ``max_tiles``: the largest tile count a candidate may have. ``prune``: decide a
    candidate that cannot beat the best so far without a whole emulator run (see the
    module docstring; the best found is the same either way).
    """

    method: str = "ml"
    time_budget_seconds: float | None = 60.0
    max_trials: int = 64
    kernels_to_tune: Sequence[str] | None = None
    seed: int = 0
    batch_size: int = 8
    epsilon: float = 0.1
    cost_model: str = "gbt"
    max_tiles: int = 256
    prune: bool = True

    def __post_init__(self) -> None:
        try:
            method = AutotuneMethod(self.method)
        except ValueError:
            raise AutotuneError(
                f"AutotuneConfig.method must be one of {', '.join(METHODS)}, got {self.method!r}"
            ) from None
        object.__setattr__(self, "method", method.value)
        if self.cost_model not in COST_MODELS:
            raise AutotuneError(
                f"AutotuneConfig.cost_model must be one of {', '.join(COST_MODELS)}, "
                f"got {self.cost_model!r}"
            )
        t = self.time_budget_seconds
        if t is not None and not (_is_number(t) and t > 0):
            raise AutotuneError(
                "AutotuneConfig.time_budget_seconds must be positive (a number of seconds, "
                f"or None for no limit), got {_shown(t)}"
                + (": a budget of 0 tunes nothing" if _is_number(t) and t == 0 else "")
            )
        for name in ("max_trials", "batch_size", "max_tiles"):
            v = getattr(self, name)
            if not (_is_int(v) and v >= 1):
                raise AutotuneError(
                    f"AutotuneConfig.{name} must be a positive integer, got {_shown(v)}"
                    + (
                        ": a budget of 0 tunes nothing"
                        if name == "max_trials" and _is_int(v) and v == 0
                        else ""
                    )
                )
        if not (_is_int(self.seed) and self.seed >= 0):
            raise AutotuneError(
                f"AutotuneConfig.seed must be a non-negative integer, got {_shown(self.seed)}"
            )
        object.__setattr__(self, "seed", int(self.seed))
        if isinstance(self.prune, np.bool_):  # numpy's bool, as other fields take numpy's
            object.__setattr__(self, "prune", bool(self.prune))
        if not isinstance(self.prune, bool):
            raise AutotuneError(f"AutotuneConfig.prune must be True or False, got {self.prune!r}")
        if not (_is_number(self.epsilon) and 0.0 <= self.epsilon <= 1.0):
            raise AutotuneError(
                f"AutotuneConfig.epsilon must be in [0, 1], got {_shown(self.epsilon)}"
            )
        names = self.kernels_to_tune
        if names is not None:
            if isinstance(names, (str, bytes)):
                raise AutotuneError(
                    "AutotuneConfig.kernels_to_tune must be a list of names, got the string "
                    f"{names!r}"
                )
            if not isinstance(names, Iterable):
                raise AutotuneError(
                    "AutotuneConfig.kernels_to_tune must be a list of names (or None for "
                    f"every GEMM kernel), got {_shown(names)}"
                )
            names = tuple(names)
            if not names:
                raise AutotuneError(
                    "AutotuneConfig.kernels_to_tune is empty, which tunes nothing (None "
                    "tunes every GEMM kernel)"
                )
            for i, name in enumerate(names):
                if not isinstance(name, str):
                    raise AutotuneError(
                        "AutotuneConfig.kernels_to_tune must hold op names or kernel keys "
                        f"(strings), got {_shown(name)} at index {i}"
                    )
            object.__setattr__(self, "kernels_to_tune", names)


def _is_number(v: Any) -> bool:
    """A real number that is not a bool or NaN."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and not math.isnan(v)


def _shown(v: Any) -> str:
    """``v`` for an error message: its repr, with its type when that is not obvious."""
    r = repr(v)
    if len(r) > 60:
        r = r[:57] + "..."
    return r if isinstance(v, (int, float)) or v is None else f"{r} ({type(v).__name__})"


@dataclass
class KernelTuning:
    """One kernel key's search: the ``ops`` that share it, the ``default`` tiling and
    its cycles, the ``best`` found and its cycles (never more than the default's), its
    ``floor_cycles`` (the largest floor of the bound model, :func:`kernel_floor_cycles`),
    ``trials`` measured, the ``pool_size`` searched, and ``history``: the best cycles
    after each trial (``history[0]``: the default)."""

    key: str
    ops: tuple[str, ...]
    precision: str
    dataflow: str
    default: GemmTiling
    default_cycles: int
    best: GemmTiling
    best_cycles: int
    floor_cycles: float
    trials: int
    pool_size: int
    history: list[int] = field(default_factory=list)
    #: in-graph cycles of this key's kernels (summed over its ops) in a whole run of the
    #: graph with the default tilings, and in the last run with the tuned one applied
    #: (``None``: not checked, nothing beat the default)
    graph_default_cycles: int | None = None
    graph_tuned_cycles: int | None = None
    #: why the tuned tiling was dropped for the default after the in-graph check ("":
    #: not dropped)
    dropped: str = ""

    @property
    def count(self) -> int:
        return len(self.ops)

    @property
    def applied(self) -> bool:
        """Whether the schedule is handed back: it beat the default alone and was not
        dropped by the in-graph check."""
        return self.best_cycles < self.default_cycles and not self.dropped

    @property
    def speedup(self) -> float:
        return self.default_cycles / self.best_cycles if self.best_cycles else 1.0


@dataclass
class AutotuneResult:
    """What :func:`autotune_model` found: ``kernels`` by key, the ``method`` and
    ``seed``, the ``device`` name and ``spec_sha256``, ``wall_s`` of the search (from
    the call, the cost model's import and the lowering included, to the in-graph check),
    ``measured`` (whole emulator runs made), ``cache_hits`` (candidates found in the
    cache), ``pruned`` (decided by the lower bound, no emulator run), ``cut`` (emulator
    runs stopped at the best cycles so far), ``eval_s`` (wall seconds spent evaluating
    candidates), ``cold_s`` (of which on the candidates the cache did not answer) and
    ``cold_walls_s`` (each of those in order: how it was decided, ``run``, ``cut`` or
    ``pruned``, and its wall seconds)."""

    method: str
    seed: int
    device: str
    spec_sha256: str
    dataflow: str
    kernels: dict[str, KernelTuning]
    wall_s: float
    measured: int
    cache_hits: int
    eval_s: float
    cold_s: float = 0.0
    pruned: int = 0
    cut: int = 0
    cold_walls_s: list[tuple[str, float]] = field(default_factory=list)
    #: the graph's name and the in-graph check (see :func:`autotune_model`): cycles of
    #: a whole run with the default tilings and with the schedules handed back (``None``
    #: when nothing beat a default, so no run was needed), the runs made and their wall
    #: seconds, and what was dropped and why, one line each
    graph: str = ""
    graph_default_cycles: int | None = None
    graph_tuned_cycles: int | None = None
    graph_runs: int = 0
    check_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: the graph tuned and the device spec it was tuned on: what
    #: :func:`wia_hw.benchmark_model` and :func:`wia_hw.create_inference_server` run
    #: when given this result (the seed's ``tuned_model``), with :attr:`schedules`
    workload: Graph | None = field(default=None, repr=False, compare=False)
    spec: DeviceSpec | None = field(default=None, repr=False, compare=False)
    #: the extensions registered on the context it was tuned on (``device=ctx``), as a
    #: run's provenance records them (id, version, source, parameters, ...; in
    #: registration order): they lowered the graph the schedules were searched and
    #: checked in, so :func:`wia_hw.benchmark_model` and
    #: :func:`wia_hw.create_inference_server` register them on the context they open
    #: (:meth:`tuning_extensions`); ``extension_objects``: those extensions themselves
    extensions: list[dict[str, Any]] = field(default_factory=list)
    extension_objects: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    #: op kinds or names the tuning context routed to providers that no registered
    #: extension owns (set on ``ctx.providers`` by hand): no fresh context has them
    custom_providers: tuple[str, ...] = ()

    @property
    def cold(self) -> int:
        """Candidates the cache did not answer (whole runs, pruned, cut)."""
        return self.measured + self.pruned + self.cut

    @property
    def candidates(self) -> int:
        """Candidates evaluated (cache misses and hits)."""
        return self.cold + self.cache_hits

    @property
    def candidates_per_s(self) -> float:
        """Candidates evaluated per wall second of evaluation."""
        return self.candidates / self.eval_s if self.eval_s > 0 else float("inf")

    @property
    def cold_candidates_per_s(self) -> float:
        """Cache misses (whole runs, pruned and cut candidates) per wall second they
        took."""
        return self.cold / self.cold_s if self.cold_s > 0 else float("inf")

    def mismatch(self, spec: Any) -> str | None:
        """Why this result's schedules do not belong on ``spec`` (``None``: they were
        tuned on it): a tiling is tuned for one spec's array and memory, so a caller
        running the tuned graph elsewhere says so rather than apply them there. ``spec``
        is a :class:`DeviceSpec`, or a :class:`wia_hw.Context`, whose registered
        extensions (id and parameters) and hand-set providers must also be those the
        result was tuned with: they choose which ops the GEMM kernels run."""
        ctx = None if isinstance(spec, DeviceSpec) else spec
        if ctx is not None:
            spec = ctx.spec
        if spec_hash(spec) != self.spec_sha256:
            return (
                f"the AutotuneResult was tuned on {self.device!r} (spec sha256 "
                f"{self.spec_sha256[:12]}), not on {spec.name!r} (sha256 "
                f"{spec_hash(spec)[:12]}): run it on the spec it was tuned on "
                "(device=result.spec) or tune again there"
            )
        if ctx is None:
            return None
        why = _extensions_differ(self.extensions, ctx.provenance()["extensions"])
        if why is None and _custom_providers(ctx) != self.custom_providers:
            why = (
                f"providers set by hand for {list(self.custom_providers)}, the context's for "
                f"{list(_custom_providers(ctx))}"
            )
        if why is None:
            return None
        return (
            f"the AutotuneResult was tuned with other extensions than the context's: {why}; "
            "run it on a context with the extensions it was tuned with (without ctx=, "
            "benchmark_model and create_inference_server register them) or tune again"
        )

    def tuning_extensions(self) -> list[Any]:
        """The extensions to register on a fresh context so that it lowers the graph as
        the tuning context did: those registered there (:attr:`extension_objects`), else
        each loaded again from its record in :attr:`extensions` (manifest or id, with
        its parameters). :class:`AutotuneError` (one line, naming them) when that cannot
        be done (providers set by hand, or a record that no longer loads): pass a
        context that has them (``ctx=``)."""
        if self.custom_providers:
            raise AutotuneError(
                f"the AutotuneResult was tuned on a context with providers set by hand for "
                f"{', '.join(self.custom_providers)}, which a fresh context cannot have: "
                "pass ctx= a context with them"
            )
        if len(self.extension_objects) == len(self.extensions):
            return list(self.extension_objects)
        from ..registry import load_extension

        out = []
        for e in self.extensions:
            try:
                out.append(load_extension(e.get("path") or e["source"], parameters=e["parameters"]))
            except (WiaError, OSError, KeyError, TypeError) as exc:
                raise AutotuneError(
                    f"the AutotuneResult was tuned with extension(s) "
                    f"{', '.join(str(x.get('id', '?')) for x in self.extensions)}, and "
                    f"{e.get('id', '?')!r} cannot be registered again "
                    f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}): pass "
                    "ctx= a context with them registered"
                ) from None
        return out

    def register_extensions(self, ctx: Any) -> None:
        """Register :meth:`tuning_extensions` on ``ctx`` (a fresh context), in the order
        the tuning context registered them."""
        from ..registry import register_device_extension

        for ext in self.tuning_extensions():
            register_device_extension(ctx, ext)

    @property
    def schedules(self) -> Schedules:
        """The tuned tilings that beat the default alone and kept the graph from getting
        slower (:attr:`KernelTuning.applied`), by kernel key (what ``run`` and
        :func:`wia_hw.lowering.lower` accept as ``schedules``), as a
        :class:`~wia_hw.optimize.Schedules` of the spec they were tuned on: a run on
        another spec leaves them out with a ``ScheduleDeviceWarning``, as it does a
        schedule file's entries of another spec."""
        out = Schedules({k: t.best for k, t in self.kernels.items() if t.applied})
        out.device, out.spec_sha256 = self.device, self.spec_sha256
        return out

    @property
    def default_cycles(self) -> int:
        """Cycles of every tuned kernel with its default tiling, each alone on a fresh
        device, summed over the ops that share it."""
        return sum(t.default_cycles * t.count for t in self.kernels.values())

    @property
    def tuned_cycles(self) -> int:
        """The same sum with the schedules handed back (a dropped key counts its
        default)."""
        return sum(
            (t.best_cycles if t.applied else t.default_cycles) * t.count
            for t in self.kernels.values()
        )

    def entries(self) -> list[dict[str, Any]]:
        """The schedule-file entries of the tuned kernels (:mod:`._schedules`)."""
        out = []
        for key, t in self.kernels.items():
            if not t.applied:
                continue
            b = t.best
            out.append(
                {
                    "kernel": key,
                    "precision": t.precision,
                    "device": self.device,
                    "spec_sha256": self.spec_sha256,
                    "dataflow": t.dataflow,
                    "tiling": tiling_fields(b),
                    "cycles": t.best_cycles,
                    "default_cycles": t.default_cycles,
                    "floor_cycles": t.floor_cycles,
                    "trials": t.trials,
                    "method": self.method,
                    "seed": self.seed,
                    "graph": self.graph,
                    "graph_default_cycles": t.graph_default_cycles,
                    "graph_cycles": t.graph_tuned_cycles,
                }
            )
        return out

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Merge the tuned schedules into the JSON file at ``path``; returns it."""
        return save_schedules(path, self.entries())

    def table(self) -> str:
        """A plain-text table: one line per kernel key."""
        lines = [
            f"{'kernel':44} {'ops':>4} {'default':>10} {'tuned':>10} {'floor':>10} "
            f"{'x':>5} {'trials':>6}  tiling"
        ]
        for key, t in self.kernels.items():
            b = t.best
            lines.append(
                f"{key[:44]:44} {t.count:4d} {t.default_cycles:10d} {t.best_cycles:10d} "
                f"{t.floor_cycles:10.0f} {t.speedup:5.2f} {t.trials:6d}  "
                f"{b.tm}x{b.tn}x{b.tk} tb={b.tb} {b.order}"
                + (f" cores={b.cores}" if b.cores else "")
                + ("  DROPPED" if t.dropped else "")
            )
        if self.graph_default_cycles is not None:
            lines.append(
                f"in the graph ({self.graph_runs} runs): {self.graph_default_cycles:,} -> "
                f"{self.graph_tuned_cycles:,} cycles with {len(self.schedules)} of "
                f"{len(self.kernels)} schedules"
            )
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


def _custom_providers(ctx: Any) -> tuple[str, ...]:
    """The op kinds or names ``ctx`` routes to a provider no registered extension owns
    (set on ``ctx.providers`` by hand), sorted."""
    own = set(ctx.extensions)
    out = []
    for key, (owner, fn) in ctx.providers.items():
        owners = {e.ext for e in getattr(fn, "entries", ())} or {owner}
        if owners - own:
            out.append(key)
    return tuple(sorted(out))


def _extensions_differ(want: list[dict[str, Any]], have: list[dict[str, Any]]) -> str | None:
    """How the extension records ``have`` (a context's provenance) differ from ``want``
    (the tuning context's) in id or parameters, one phrase; None when they do not."""
    w = {e["id"]: e["parameters"] for e in want}
    h = {e["id"]: e["parameters"] for e in have}
    parts = []
    if set(w) - set(h):
        parts.append(f"tuned with {', '.join(sorted(set(w) - set(h)))}, not registered here")
    if set(h) - set(w):
        parts.append(f"{', '.join(sorted(set(h) - set(w)))} registered here, not tuned with")
    for i in sorted(set(w) & set(h)):
        diff = [
            f"{k}={w[i].get(k)!r} tuned, {h[i].get(k)!r} here"
            for k in sorted(set(w[i]) | set(h[i]))
            if w[i].get(k) != h[i].get(k)
        ]
        if diff:
            parts.append(f"{i} parameters {', '.join(diff)}")
    return "; ".join(parts) or None


# -- measurement --------------------------------------------------------------------

#: (spec hash, kernel key, tiling) -> (cycles, bytes per level) of the kernel alone on
#: a fresh device.
_MEASURED: dict[tuple[str, str, GemmTiling], tuple[int, tuple[int, int, int]]] = {}


def _cache_key(k: GemmKernel) -> str:
    """The kernel key plus the operands' layout (rows, cols, element bytes, offset, and
    which operands share storage): what the emulator's cycles depend on besides the
    tiling, so two kernels of one key laid out differently are measured apart."""
    refs = [k.a, k.b, k.c, k.bias]
    names = [r.name if r is not None else None for r in refs]
    parts = []
    for r in refs:
        if r is None:
            parts.append("-")
        else:
            parts.append(f"{r.rows}x{r.cols}x{r.elem_bytes}@{r.offset}={names.index(r.name)}")
    return f"{gemm_key(k)} | {' '.join(parts)}"


#: (spec hash, kernel key, tiling) -> :func:`cycles_lower_bound` of the candidate
_BOUNDS: dict[tuple[str, str, GemmTiling], int] = {}
#: (spec hash, kernel key, tiling) -> the emulator run of a candidate stopped at the best
#: cycles of its search (continued, not restarted, when asked again with a higher best);
#: least recently used first, at most _MAX_SUSPENDED of them
_SUSPENDED: OrderedDict[tuple[str, str, GemmTiling], PartialRun] = OrderedDict()
_MAX_SUSPENDED = 256


def _store(key: tuple[str, str, GemmTiling], rec: Any) -> tuple[int, tuple[int, int, int]]:
    b = rec.counters.bytes
    out = (int(rec.end_cycle - rec.start_cycle), (b["l1"], b["l2"], b["hbm"]))
    if len(_MEASURED) > 200_000:
        _MEASURED.clear()
    _MEASURED[key] = out
    return out


def _run(
    kernel: GemmKernel, tiling: GemmTiling, spec: DeviceSpec, spec_sha: str | None
) -> tuple[tuple[int, tuple[int, int, int]], bool]:
    h = spec_sha or spec_hash(spec)
    tiling = canonical_tiling(kernel, tiling)
    key = (h, _cache_key(kernel), tiling)
    hit = _MEASURED.get(key)
    if hit is not None:
        return hit, True
    return _store(key, Device(spec).execute([replace(kernel, tiling=tiling)])[0]), False


def measure_cycles(
    kernel: GemmKernel, tiling: GemmTiling, spec: DeviceSpec, spec_sha: str | None = None
) -> tuple[int, bool]:
    """Cycles of ``kernel`` with ``tiling`` alone on a fresh device of ``spec`` (the
    emulator's own count: ``end_cycle - start_cycle`` of its record), and whether the
    cache answered. Cached by (spec hash, kernel key, tiling); tilings that give the
    emulator the same tiles (:func:`canonical_tiling`) share an entry."""
    (cycles, _), hit = _run(kernel, tiling, spec, spec_sha)
    return cycles, hit


def kernel_floor_cycles(
    kernel: GemmKernel, tiling: GemmTiling, spec: DeviceSpec, spec_sha: str | None = None
) -> dict[str, float]:
    """The floors of the bound model (:mod:`wia_hw.profiling._bounds`) of ``kernel`` with
    ``tiling`` run alone on a fresh device, in cycles: ``compute`` (its FLOPs at the
    arrays' peak), ``pipeline`` and ``parallelism`` (the array's issue cycles of its
    tiles, over all cores and on the busiest core), and ``l1``/``l2``/``hbm`` (the bytes
    each level carried during the run, at that level's bandwidth). Each is a lower bound
    of the kernel's cycles."""
    from ..profiling._bounds import floors_cycles, unit_floors
    from ..profiling._metrics import DeviceInfo

    (_, (l1, l2, hbm)), _ = _run(kernel, tiling, spec, spec_sha)
    k = replace(kernel, tiling=tiling)
    uf = unit_floors(k, spec)
    dev = DeviceInfo.from_spec(spec)
    return floors_cycles(
        None,
        2 * k.macs,
        k.precision,
        "gemm",
        uf.to_dict() if uf is not None else None,
        {"l1": l1, "l2": l2, "hbm": hbm},
        dev,
    )


_MFORMAT = "wia-hw-measurements"


def load_measurements(path: str | os.PathLike[str]) -> int:
    """Read a measurements file (:func:`save_measurements`) into the cache; returns the
    number of entries read (0 when the file does not exist). ScheduleError when it is
    malformed."""
    import json

    p = Path(path)
    if not p.exists():
        return 0
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScheduleError(f"{p}: not a readable JSON measurements file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != _MFORMAT or doc.get("version") != 1:
        raise ScheduleError(f"{p}: not a measurements file (format {_MFORMAT!r}, version 1)")
    rows = doc.get("entries")
    if not isinstance(rows, list):
        raise ScheduleError(f"{p}: 'entries' must be a list")
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, list) or len(row) not in (11, 12):
                raise TypeError(f"a row has 11 or 12 fields, got {row!r}")
            sha, key, tm, tn, tk, tb, order, cycles, l1, l2, hbm = row[:11]
            t = GemmTiling(
                tm=tm, tn=tn, tk=tk, tb=tb, order=order, cores=row[11] if len(row) == 12 else 0
            )
            if not (isinstance(sha, str) and isinstance(key, str)):
                raise TypeError("spec hash and kernel key must be strings")
            vals = (cycles, l1, l2, hbm)
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in vals):
                raise TypeError("cycles and bytes must be non-negative integers")
        except (TypeError, ValueError) as exc:
            raise ScheduleError(f"{p}: entry {i}: {exc}") from None
        _MEASURED[(sha, key, t)] = (cycles, (l1, l2, hbm))
    return len(rows)


def save_measurements(path: str | os.PathLike[str], sha: str) -> Path:
    """Write the cache's measurements of spec hash ``sha`` into ``path``, merged with the
    entries already there (other specs' kept); sorted, so equal contents give equal
    bytes. Rows: spec hash, kernel key, tm, tn, tk, tb, order, cycles, l1, l2, hbm bytes, and
    ``cores`` when the tiling has a core count (``GemmTiling.cores``).
    Processes saving into one file at once each keep the other's rows
    (:func:`wia_hw._files.update_locked`)."""
    import json

    p = Path(path)

    def merged_text() -> str:  # under the file's lock: another process's rows kept
        rows: dict[tuple[Any, ...], list[Any]] = {}
        if p.exists():
            load_measurements(p)
            for r in json.loads(p.read_text())["entries"]:
                rows[(*r[:7], *r[11:12])] = r
        for (h, key, t), (cycles, nb) in list(_MEASURED.items()):
            if h == sha:
                r = [h, key, t.tm, t.tn, t.tk, t.tb, t.order, cycles, *nb]
                r += [t.cores] if t.cores else []
                rows[(*r[:7], *r[11:12])] = r
        doc = {"format": _MFORMAT, "version": 1, "entries": [rows[k] for k in sorted(rows)]}
        return json.dumps(doc, separators=(",", ":")) + "\n"

    return update_locked(p, merged_text)


# -- search space -------------------------------------------------------------------

_MULTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def _sides(extent: int, unit: int) -> list[int]:
    if extent <= unit:
        return [extent]
    out = {unit * j for j in _MULTS if unit * j < extent}
    out.add(extent)
    return sorted(out)


def _split(
    spec: DeviceSpec, k: GemmKernel, t: GemmTiling, per_core: int, cores: int = 0
) -> GemmTiling:
    """Halve tiles (the larger side first; then tb) until the kernel has at least
    ``per_core`` output tiles per core, where the shape allows (the core split; an
    output tile's K slices run on one core, ``Device.tiles_of``), on ``cores`` of the
    device's cores (0: all; the tiling's ``cores``)."""
    a = spec.compute.array
    R, C = a.rows, a.cols
    tm, tn, tb = t.tm, t.tn, t.tb
    target = per_core * (cores or spec.compute.cores)

    def count() -> int:
        return -(-k.batch // tb) * -(-k.m // tm) * -(-k.n // tn)

    def half(x: int, unit: int) -> int:  # half of x, rounded up to whole units
        return _ceil_div(_ceil_div(x, 2), unit) * unit

    while count() < target:
        if tb > 1:
            tb = -(-tb // 2)
        elif tm > R and tm >= tn:
            tm = half(tm, R)
        elif tn > C:
            tn = half(tn, C)
        elif tm > R:
            tm = half(tm, R)
        else:
            break
    return GemmTiling(tm=min(tm, k.m), tn=min(tn, k.n), tk=t.tk, tb=tb, order=t.order, cores=cores)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _out_tiles(k: GemmKernel, t: GemmTiling) -> int:
    return t.out_tiles(k.batch, k.m, k.n)


def _tile_count(k: GemmKernel, t: GemmTiling) -> int:
    return t.tile_count(k.batch, k.m, k.n, k.k)


def _fits(spec: DeviceSpec, k: GemmKernel, t: GemmTiling) -> bool:
    e = k.a.elem_bytes if k.a is not None else 2
    eo = k.c.elem_bytes if k.c is not None else e
    l1 = spec.memory.l1.size_bytes
    return t.tb * (t.tm + t.tn) * t.tk * e <= l1 // 2 and t.tb * t.tm * t.tn * eo <= l1 // 4


def candidate_pool(
    kernel: GemmKernel, spec: DeviceSpec, max_tiles: int = 256, fewer_cores: bool = True
) -> list[GemmTiling]:
    """Every candidate tiling of ``kernel`` on ``spec`` (the search space of the module
    docstring), deduplicated, in canonical order (tm, tn, tk, tb, order, cores).
    ``fewer_cores``: with core counts below the device's (for a kernel whose operands
    all come from HBM; see :func:`autotune_model`)."""
    a = spec.compute.array
    R, C = a.rows, a.cols
    k = kernel
    tms, tns = _sides(k.m, R), _sides(k.n, C)
    tks = _sides(k.k, R)
    n = spec.compute.cores
    counts = sorted({c for c in (n // 2, n // 4) if c >= 1})
    out: set[GemmTiling] = set()
    for tm in tms:
        for tn in tns:
            whole = tm >= k.m and tn >= k.n
            tbs = [1]
            if whole and k.batch > 1:
                tbs = sorted({min(k.batch, 2**i) for i in range(k.batch.bit_length() + 1)})
            for tk in tks:
                for tb in tbs:
                    for order in ("mn", "nm"):
                        base = GemmTiling(tm=tm, tn=tn, tk=tk, tb=tb, order=order)
                        if not _fits(spec, k, base):
                            continue
                        for per_core in (1, 2, 4):
                            t = _split(spec, k, base, per_core)
                            if _tile_count(k, t) <= max_tiles:
                                out.add(t)
                            if not fewer_cores or _out_tiles(k, t) >= 2 * n:
                                continue  # two tiles a core or more: all cores
                            for cores in counts:
                                t = _split(spec, k, base, per_core, cores)
                                if _tile_count(k, t) <= max_tiles:
                                    out.add(t)
    return sorted(out, key=lambda t: (t.tm, t.tn, t.tk, t.tb, t.order, t.cores))


def schedule_features(kernel: GemmKernel, t: GemmTiling, spec: DeviceSpec) -> list[float]:
    """The cost model's features of one candidate (see the module docstring)."""
    a = spec.compute.array
    R, C = a.rows, a.cols
    k = kernel
    cores = t.active_cores(spec.compute.cores)
    mt, nt = -(-k.m // t.tm), -(-k.n // t.tn)
    kt, bt = -(-k.k // t.tk), -(-k.batch // t.tb)
    out_tiles = bt * mt * nt
    tiles = out_tiles * kt
    e = k.a.elem_bytes if k.a is not None else 2
    # MAC slots the array passes occupy over the MACs done (padding to R x C)
    pad_m = mt * -(-t.tm // R) * R / k.m if a.dataflow == "os" else 1.0
    pad_n = nt * -(-t.tn // C) * C / k.n
    pad_k = kt * -(-t.tk // R) * R / k.k if a.dataflow == "ws" else 1.0
    share = -(-out_tiles // cores)
    l1_frac = t.tb * (t.tm + t.tn) * t.tk * e / (spec.memory.l1.size_bytes / 2)
    return [
        math.log2(t.tm),
        math.log2(t.tn),
        math.log2(t.tk),
        math.log2(t.tb),
        1.0 if t.order == "mn" else 0.0,
        math.log2(tiles),
        math.log2(out_tiles),
        float(kt),
        tiles / cores,
        share * cores / out_tiles,
        min(out_tiles, cores) / cores,
        pad_m,
        pad_n,
        pad_k,
        l1_frac,
        math.log2(1.0 / (1.0 / t.tm + 1.0 / t.tn)),
        math.log2(t.tm * t.tn * t.tb),
        cores / spec.compute.cores,
    ]


# -- cost models --------------------------------------------------------------------


class _Ridge:
    """Ridge regression on standardised features and their squares (numpy)."""

    def __init__(self, alpha: float = 1.0) -> None:
        self.alpha = alpha

    def _expand(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.mu) / self.sd
        return np.hstack([z, z * z, np.ones((len(z), 1))])

    def fit(self, x: np.ndarray, y: np.ndarray) -> _Ridge:
        self.mu = x.mean(axis=0)
        self.sd = x.std(axis=0)
        self.sd[self.sd == 0] = 1.0
        z = self._expand(x)
        reg = self.alpha * np.eye(z.shape[1])
        reg[-1, -1] = 0.0
        self.w = np.linalg.solve(z.T @ z + reg, z.T @ y)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self._expand(x) @ self.w


def _model(kind: str, seed: int) -> Any:
    if kind == "ridge":
        return _Ridge()
    try:
        from sklearn.ensemble import GradientBoostingRegressor
    except ImportError:  # pragma: no cover - the test extras install it
        raise AutotuneError(
            "AutotuneConfig.cost_model='gbt' needs scikit-learn (pip install 'wia-hw[ml]'); "
            "cost_model='ridge' needs nothing"
        ) from None
    return GradientBoostingRegressor(
        n_estimators=80, max_depth=3, learning_rate=0.1, subsample=1.0, random_state=seed
    )


# -- the search ---------------------------------------------------------------------


class _Evaluator:
    """Evaluates candidates: ``ev(kernel, tiling, below)`` is the candidate's cycles
    when they are below ``below`` (``None``: always), else ``max(bound, below)``, where
    ``bound`` is :func:`cycles_lower_bound` (the candidate does not beat the best).
    Either answer depends only on the candidate and ``below``, never on what the caches
    hold, so a search gives the same result in a fresh process and after others.
    Counts each kind of evaluation."""

    def __init__(self, spec: DeviceSpec, sha: str, prune: bool = True) -> None:
        self.spec, self.sha, self.prune = spec, sha, prune
        self.measured = self.hits = self.pruned = self.cut = 0
        self.seconds = self.cold_seconds = 0.0
        self.cold_walls: list[tuple[str, float]] = []

    def _bound(self, key: tuple[str, str, GemmTiling], kernel: GemmKernel, t: GemmTiling) -> int:
        bound = _BOUNDS.get(key)
        if bound is None:
            bound = _BOUNDS[key] = cycles_lower_bound(kernel, t, self.spec)
            if len(_BOUNDS) > 200_000:
                _BOUNDS.clear()
        return bound

    def bound(self, kernel: GemmKernel, t: GemmTiling) -> int:
        """:func:`cycles_lower_bound` of a candidate, cached with the pruning's."""
        t = canonical_tiling(kernel, t)
        return self._bound((self.sha, _cache_key(kernel), t), kernel, t)

    def __call__(self, kernel: GemmKernel, t: GemmTiling, below: int | None = None) -> int:
        t0 = time.perf_counter()
        t = canonical_tiling(kernel, t)
        key = (self.sha, _cache_key(kernel), t)
        hit = _MEASURED.get(key)
        if not self.prune:
            below = None
        bound = 0
        if hit is not None and (below is None or hit[0] < below):
            self.hits += 1
            self.seconds += time.perf_counter() - t0
            return hit[0]
        if below is not None:
            bound = self._bound(key, kernel, t)
            if hit is not None:  # known not to win: the answer a fresh process gives
                self.hits += 1
                self.seconds += time.perf_counter() - t0
                return max(bound, below)
        if below is not None and bound >= below:
            self.pruned += 1
            kind = "pruned"
            cycles = bound
        else:
            run = _SUSPENDED.pop(key, None) or PartialRun(replace(kernel, tiling=t), self.spec)
            rec = run.advance(below)
            if rec is None:  # not ended by cycle `below`: at least that many
                self.cut += 1
                kind = "cut"
                cycles = below  # type: ignore[assignment]  # (max(bound, below))
                _SUSPENDED[key] = run
                if len(_SUSPENDED) > _MAX_SUSPENDED:
                    _SUSPENDED.popitem(last=False)
            else:
                self.measured += 1
                kind = "run"
                cycles = _store(key, rec)[0]
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.cold_seconds += dt
        self.cold_walls.append((kind, dt))
        return cycles


def _search(
    kernel: GemmKernel,
    spec: DeviceSpec,
    cfg: AutotuneConfig,
    ev: _Evaluator,
    deadline: float,
    cold: bool = True,
) -> tuple[GemmTiling, int, int, list[int], int]:
    """(best tiling, its cycles, default cycles, history, pool size) of one kernel;
    ``cold``: its operands all come from HBM (:func:`candidate_pool`'s ``fewer_cores``)."""
    default = kernel.tiling
    default_cycles = ev(kernel, default)
    pool = candidate_pool(kernel, spec, cfg.max_tiles, fewer_cores=cold)
    pool = [t for t in pool if t != default]
    rng = np.random.default_rng([cfg.seed, zlib.crc32(gemm_key(kernel).encode())])
    best, best_cycles = default, default_cycles
    history = [default_cycles]
    budget = min(cfg.max_trials, len(pool))

    def take(t: GemmTiling) -> int:
        nonlocal best, best_cycles
        c = ev(kernel, t, best_cycles)
        if c < best_cycles:
            best, best_cycles = t, c
        history.append(best_cycles)
        return c

    def out_of_time() -> bool:
        return time.perf_counter() > deadline

    if cfg.method == "grid":
        idx = np.unique(np.linspace(0, len(pool) - 1, budget).round().astype(int)) if pool else []
        for i in idx:
            if out_of_time():
                break
            take(pool[int(i)])
    elif cfg.method == "random":
        for i in rng.permutation(len(pool))[:budget]:
            if out_of_time():
                break
            take(pool[int(i)])
    else:

        def features(t: GemmTiling) -> list[float]:
            return [*schedule_features(kernel, t, spec), math.log2(ev.bound(kernel, t))]

        # a candidate's features (its lower bound: up to a millisecond each, a tenth of a
        # second over a big kernel's pool) are computed when first needed, those of the
        # pool in chunks with the deadline checked between: a budget holds, and the
        # features (so the search without a budget) are those of computing them all first
        feats: dict[int, list[float]] = {}

        def pool_features(idx: list[int]) -> np.ndarray | None:
            """The features of ``pool[i]`` for ``i`` in ``idx``; None if time ran out."""
            todo = [i for i in idx if i not in feats]
            for j in range(0, len(todo), 16):
                if out_of_time():
                    return None
                for i in todo[j : j + 16]:
                    feats[i] = features(pool[i])
            return np.array([feats[i] for i in idx])

        left = list(range(len(pool)))
        xs = [features(default)]
        ys = [math.log(default_cycles)]
        first = rng.permutation(len(pool))[: min(cfg.batch_size, budget)]
        batch = [int(i) for i in first]
        while batch and not out_of_time():
            for i in batch:
                if len(history) - 1 >= budget or out_of_time():
                    break
                ys.append(math.log(take(pool[i])))
                f = feats.get(i)
                if f is None:
                    f = feats[i] = features(pool[i])
                xs.append(f)
                left.remove(i)
            if len(history) - 1 >= budget or not left:
                break
            ranking = pool_features(left)
            if ranking is None or out_of_time():
                break
            model = _model(cfg.cost_model, cfg.seed).fit(np.array(xs), np.array(ys))
            if out_of_time():
                break
            pred = model.predict(ranking)
            ranked = [left[j] for j in np.argsort(pred, kind="stable")]
            n = min(cfg.batch_size, budget - (len(history) - 1), len(left))
            batch, chosen = [], set()
            pos = 0
            for _ in range(n):
                if rng.random() < cfg.epsilon:
                    rest = [i for i in left if i not in chosen]
                    pick = rest[int(rng.integers(len(rest)))]
                else:
                    while ranked[pos] in chosen:
                        pos += 1
                    pick = ranked[pos]
                chosen.add(pick)
                batch.append(pick)
    return best, best_cycles, default_cycles, history, len(pool)


def _kernels_of(
    graph: Graph, spec: DeviceSpec, providers: Mapping[str, Any] | None
) -> dict[str, tuple[GemmKernel, list[str]]]:
    out: dict[str, tuple[GemmKernel, list[str]]] = {}
    for op, kernels in lower(graph, spec, dict(providers or {})):
        for k in kernels:
            if isinstance(k, GemmKernel) and k.provider == "builtin":
                key = gemm_key(k)
                if key in out:
                    out[key][1].append(op.name)
                else:
                    out[key] = (k, [op.name])
    return out


#: a leading ``layerN.``: ``wia-hw run``'s Top kernels table (and the profiler's
#: views) print the same op of every layer as one row, the name without it
_LAYER = re.compile(r"^layer\d+\.")


def _unlayered(name: str) -> str:
    return _LAYER.sub("", name)


def _select(
    graph: Graph,
    spec: DeviceSpec,
    providers: Mapping[str, Any] | None,
    found: Mapping[str, tuple[GemmKernel, list[str]]],
    names: Sequence[str],
) -> list[str]:
    """The kernel keys ``names`` select (``AutotuneConfig.kernels_to_tune``), in order.

    A name is a kernel key of ``found``; an op or kernel name of the lowered graph
    (``layer0.feed_forward_output``, ``layer0.attention_context``: the kernel of a fused
    attention chain is named after its op); or such a name without its ``layerN.``
    prefix, as the run's Top kernels table prints it (``feed_forward_output`` selects
    that op in every layer). A kernel name selects that kernel; an op name that names
    none of its kernels (a fused chain's), every built-in GEMM kernel of the op. A name
    that matches only ops or kernels without a built-in GEMM kernel
    (``attention_softmax``: the tuner searches GEMM tilings) is skipped with one
    warning naming it and why; a name matching nothing is an :class:`AutotuneError`,
    and so is a list whose every name is skipped (nothing would be tuned)."""
    gemm: dict[str, list[str]] = {}  # op or kernel name -> its built-in GEMM keys
    # op (then kernel) name -> why it has no built-in GEMM kernel
    other_ops: dict[str, str] = {}
    other_kernels: dict[str, str] = {}
    for op, kernels in lower(graph, spec, dict(providers or {})):
        keys = []
        for k in kernels:
            if isinstance(k, GemmKernel) and k.provider == "builtin":
                keys.append(gemm_key(k))
                gemm.setdefault(k.name, []).append(gemm_key(k))
            else:
                other_kernels.setdefault(
                    k.name, f"a {type(k).__name__} of op {op.name!r}, not a GEMM"
                )
        if keys:
            if op.name not in {k.name for k in kernels}:
                gemm.setdefault(op.name, []).extend(keys)
        elif op.kind not in GEMM_KINDS:
            other_ops[op.name] = f"a {op.kind} op, not a GEMM"
        elif kernels:
            runs = sorted({f"{type(k).__name__} ({k.provider})" for k in kernels})
            other_ops[op.name] = (
                f"a {op.kind} op run by {', '.join(runs)}, not a built-in GEMM kernel"
            )
        else:
            other_ops[op.name] = f"a {op.kind} op fused into another op's kernel"
    selected: list[str] = []
    skipped: list[str] = []
    for name in names:
        if name in found:
            keys = [name]
        else:
            keys = gemm.get(name) or [
                key for n, ks in gemm.items() if _unlayered(n) == name for key in ks
            ]
        if not keys:
            whys = [
                why
                for other in (other_ops, other_kernels)
                for n, why in other.items()
                if name in (n, _unlayered(n))
            ]
            if not whys:
                some = ", ".join(repr(n) for n in list(dict.fromkeys(map(_unlayered, gemm)))[:3])
                raise AutotuneError(
                    f"kernels_to_tune: unknown kernel {name!r}: no GEMM op, kernel or kernel "
                    f"key of that name (with or without a layerN. prefix) in graph "
                    f"{graph.name!r} (GEMMs such as {some})"
                )
            skipped.append(f"{name!r}: {whys[0]}")
        selected += [k for k in dict.fromkeys(keys) if k in found and k not in selected]
    if not selected:
        raise AutotuneError(
            f"kernels_to_tune: nothing to tune in graph {graph.name!r}: "
            f"{'; '.join(skipped)} (auto-tuning searches GEMM tilings)"
        )
    for why in skipped:
        warnings.warn(
            f"kernels_to_tune: skipping {why} (auto-tuning searches GEMM tilings)",
            KernelSkippedWarning,
            stacklevel=3,
        )
    return selected


def _graph_run(
    graph: Graph, ctx: Any, schedules: Mapping[str, GemmTiling], keys: Mapping[str, str]
) -> tuple[int, dict[str, int]]:
    """(cycles, in-graph cycles per kernel key) of ``graph`` run with ``schedules`` on a
    fresh device of ``ctx``'s spec with its extensions (what ``wia_hw.run`` does);
    ``keys``: kernel name -> key of the tuned kernels."""
    from ..runtime import Context

    fresh = Context(ctx.spec, seed=ctx.seed)
    fresh.providers = dict(ctx.providers)
    fresh.extensions = dict(ctx.extensions)
    res = fresh.run(graph, schedules=dict(schedules))
    per: dict[str, int] = {}
    for k in res.kernels:
        key = keys.get(k.name)
        if key is not None:
            per[key] = per.get(key, 0) + k.cycles
    return res.cycles, per


def _check_in_graph(graph: Graph, ctx: Any, tuned: dict[str, KernelTuning]) -> dict[str, Any]:
    """Drop the tuned tilings that make the graph slower on ``ctx``'s device (sets
    ``KernelTuning.dropped`` and the in-graph cycles); returns the result's graph
    fields. See :func:`autotune_model`."""
    active = {k: t.best for k, t in tuned.items() if t.best_cycles < t.default_cycles}
    out: dict[str, Any] = {"graph_runs": 0, "notes": []}
    if not active:
        return out
    keys = {
        k.name: gemm_key(k)
        for _, ks in lower(graph, ctx.spec, ctx.providers)
        for k in ks
        if isinstance(k, GemmKernel) and gemm_key(k) in tuned
    }
    base, base_per = _graph_run(graph, ctx, {}, keys)
    out["graph_runs"] = 1
    for key, t in tuned.items():
        t.graph_default_cycles = base_per.get(key, 0)
    total = base
    while active:
        total, per = _graph_run(graph, ctx, active, keys)
        out["graph_runs"] += 1
        slower = [k for k in active if per.get(k, 0) > base_per.get(k, 0)]
        for key in active:
            tuned[key].graph_tuned_cycles = per.get(key, 0)
        for key in slower:
            t = tuned[key]
            t.dropped = (
                f"slower in the graph: {t.graph_default_cycles:,} -> {per.get(key, 0):,} "
                f"cycles (alone {t.default_cycles:,} -> {t.best_cycles:,})"
            )
            out["notes"].append(f"dropped {key}: {t.dropped}")
            del active[key]
        if slower:
            continue
        if total > base:
            for key in active:
                tuned[key].dropped = (
                    f"the whole graph was slower with the schedules: {base:,} -> {total:,} "
                    "cycles, though no key's own kernels were"
                )
            out["notes"].append(
                f"dropped all {len(active)} schedules: the whole graph was slower with them "
                f"({base:,} -> {total:,} cycles) though no key's own kernels were"
            )
            active = {}
        break
    out["graph_default_cycles"] = base
    out["graph_tuned_cycles"] = total if active else base
    return out


def autotune_model(
    graph: Graph,
    config: AutotuneConfig | None = None,
    *,
    device: Any = "wia-npu",
    schedules_file: str | os.PathLike[str] | None = None,
    measurements_file: str | os.PathLike[str] | None = None,
) -> AutotuneResult:
    """Tune the schedule of every built-in GEMM kernel of ``graph`` (or those named in
    ``config.kernels_to_tune``) on ``device`` (a spec name or path, a
    :class:`DeviceSpec`, or a :class:`wia_hw.Context`, whose extensions lower the graph
    as ``run`` would). Kernels sharing a key are tuned once, the heaviest first.

    Returns an :class:`AutotuneResult`; with ``schedules_file`` its schedules are also
    merged into that JSON file, which ``wia_hw.run(..., schedules=path)`` applies.
    The schedules handed back have passed the in-graph check (module docstring): with
    them, no key's kernels and not the whole graph run slower on a fresh ``device``
    than with the default tilings; those that failed it are dropped and noted.
    ``measurements_file``: a JSON file of emulator measurements (read into the cache
    before the search, the cache's entries for this spec written back after it), so a
    later session evaluates a candidate measured before by a look-up.
    ``config.kernels_to_tune`` names are matched as the module docstring says (the
    seed's ``"feed_forward_output"`` selects that op of every layer); a name of an op
    without a built-in GEMM kernel is skipped with a :class:`KernelSkippedWarning`.
    Raises :class:`AutotuneError` (one line) for a name that matches nothing, or when
    every name is skipped. The result holds ``graph``, the spec and the context's
    extensions (``workload``, ``spec``, ``extensions``), so
    :func:`wia_hw.benchmark_model` and :func:`wia_hw.create_inference_server` take it as
    the seed's ``tuned_model`` and run it as it was tuned.
    """
    from ..runtime import Context, open_device

    cfg = config or AutotuneConfig()
    if not isinstance(cfg, AutotuneConfig):
        raise AutotuneError(f"config must be an AutotuneConfig, got {type(cfg).__name__}")
    if not isinstance(graph, Graph):
        raise AutotuneError(f"autotune_model takes a Graph, got {type(graph).__name__}")
    # the search's wall time, and its budget, start here: the cost model's import (2 s
    # for scikit-learn in a fresh process) and the graph's lowering count
    start = time.perf_counter()
    if cfg.method == "ml":
        _model(cfg.cost_model, cfg.seed)  # a missing scikit-learn fails here, at once
    ctx = device if isinstance(device, Context) else open_device(device)
    spec = ctx.spec
    found = _kernels_of(graph, spec, ctx.providers)
    if cfg.kernels_to_tune is not None:
        keys = _select(graph, spec, ctx.providers, found, cfg.kernels_to_tune)
        found = {k: found[k] for k in keys}
    order = sorted(found, key=lambda key: (-found[key][0].macs * len(found[key][1]), key))
    sha = spec_hash(spec)
    # both files are checked before the search (minutes), not after it
    if schedules_file is not None:
        _check_output_file(schedules_file, "schedules_file")
        read_entries(schedules_file)  # ScheduleError when it is not a schedule file
    if measurements_file is not None:
        _check_output_file(measurements_file, "measurements_file")
        load_measurements(measurements_file)
    try:
        result = _tune(graph, cfg, ctx, found, order, sha, schedules_file, start)
    except BaseException:  # an interrupted or failed search keeps what it measured,
        if measurements_file is not None:  # and its own error is the one raised
            with contextlib.suppress(WiaError, OSError):
                _save_measurements(measurements_file, sha)
        raise
    if measurements_file is not None:
        _save_measurements(measurements_file, sha)
    return result


def _save_measurements(path: str | os.PathLike[str], sha: str) -> None:
    """:func:`save_measurements`, an OSError as one ScheduleError line naming the file."""
    try:
        save_measurements(path, sha)
    except OSError as exc:
        raise ScheduleError(f"measurements_file {path}: cannot write ({exc.strerror})") from None


def _check_output_file(path: str | os.PathLike[str], what: str) -> None:
    """Refuse, in one line, a file the search could not save into: a directory, a path
    under a file, a folder that cannot be written."""
    p = Path(path)
    if p.is_dir():
        raise ScheduleError(f"{what} {p}: is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    for up in (parent, *parent.parents):
        if up.exists():
            if not up.is_dir():
                raise ScheduleError(f"{what} {p}: {up} is a file, not a folder")
            if not os.access(up, os.W_OK):
                raise ScheduleError(f"{what} {p}: {up} is not writable")
            break


def _tune(
    graph: Graph,
    cfg: AutotuneConfig,
    ctx: Any,
    found: dict[str, Any],
    order: list[str],
    sha: str,
    schedules_file: str | os.PathLike[str] | None,
    start: float,
) -> AutotuneResult:
    """The search of :func:`autotune_model` over ``order``'s kernel keys, the in-graph
    check, and the schedules saved; ``start``: the ``time.perf_counter()`` the wall time
    and the budget count from."""
    spec = ctx.spec
    ev = _Evaluator(spec, sha, cfg.prune)
    limit = cfg.time_budget_seconds
    inputs = Storage(graph).cold  # the tensors that come from HBM
    tuned: dict[str, KernelTuning] = {}
    for i, key in enumerate(order):
        kernel, ops = found[key]
        if limit is None:
            deadline = math.inf
        else:  # the time left, shared among the kernels left
            left = start + limit - time.perf_counter()
            deadline = time.perf_counter() + max(0.0, left) / (len(order) - i)
        cold = operands_cold(kernel, inputs)
        best, best_c, dflt_c, history, pool = _search(kernel, spec, cfg, ev, deadline, cold)
        tuned[key] = KernelTuning(
            key=key,
            ops=tuple(ops),
            precision=kernel.precision,
            dataflow=spec.compute.array.dataflow,
            default=kernel.tiling,
            default_cycles=dflt_c,
            best=best,
            best_cycles=best_c,
            floor_cycles=max(kernel_floor_cycles(kernel, best, spec, sha).values()),
            trials=len(history) - 1,
            pool_size=pool,
            history=history,
        )
    result = AutotuneResult(
        method=cfg.method,
        seed=cfg.seed,
        device=spec.name,
        spec_sha256=sha,
        dataflow=spec.compute.array.dataflow,
        kernels={k: tuned[k] for k in order},
        wall_s=time.perf_counter() - start,
        measured=ev.measured,
        cache_hits=ev.hits,
        eval_s=ev.seconds,
        cold_s=ev.cold_seconds,
        pruned=ev.pruned,
        cut=ev.cut,
        cold_walls_s=ev.cold_walls,
        graph=graph.name,
        workload=graph,
        spec=spec,
        extensions=ctx.provenance()["extensions"],
        extension_objects=tuple(
            e for e in ctx.extensions.values() if not getattr(e, "direct", False)
        ),
        custom_providers=_custom_providers(ctx),
    )
    t0 = time.perf_counter()
    for name, value in _check_in_graph(graph, ctx, result.kernels).items():
        setattr(result, name, value)
    result.check_s = time.perf_counter() - t0
    if schedules_file is not None:
        result.save(schedules_file)
    return result
