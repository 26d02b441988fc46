"""Sweep files: YAML (``schema_version: 1``) read through the hardened loader.

A sweep file names a base device spec, a sampler over dotted-path spec parameters, the
workloads (with their builder arguments), the metrics to keep and an optional
constraint; :func:`load_sweep` checks all of it before anything runs and expands it into
:class:`Point` s (device parameters x workload). Every error is a :class:`SpecError`
reading ``file:line: message`` (one line).

Layout (see ``docs/SWEEPS.md``)::

    schema_version: 1
    name: array-vs-hbm          # optional; default: the file's stem
    base: wia-npu               # built-in name, path (relative to this file) or mapping
    grid:                       # or random: / latin_hypercube: (below)
      compute.array.rows: [32, 64, 128]
      memory.hbm.bandwidth_gbs: [600, 900, 1200]
    workloads:
      bert-large: {batch: 32, seq: 128}
    metrics: [latency_ms, throughput, energy_j, utilisation, bytes.hbm]
    constraint: "compute_array_rows * compute_array_cols <= 16384"

``random:`` and ``latin_hypercube:`` take ``n``, ``seed`` and ``parameters:``, whose
values are either a list (choices) or a range ``{low: L, high: H}`` (integers when both
bounds are integers, both ends included; ``log: true`` samples the logarithm uniformly).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from .._yaml import line_for, read_yaml_mapping
from ..emulator.config import DeviceSpec
from ..emulator.counters import Counters
from ..emulator.errors import SpecError, WiaError
from ..registry._expr import Expr, ExprError, compile_expr
from ..spec import list_specs, load_spec, spec_path

__all__ = [
    "SWEEP_SCHEMA_VERSION",
    "MAX_POINTS",
    "SAMPLERS",
    "RUN_METRICS",
    "DEFAULT_METRICS",
    "Sweep",
    "Point",
    "Constraint",
    "load_sweep",
    "metric_names",
    "point_key",
    "canonical_json",
]

SWEEP_SCHEMA_VERSION = 1
SAMPLERS = ("grid", "random", "latin_hypercube")
#: The most points (parameter sets x workloads) one sweep file may expand to; a file
#: asking for more is refused before anything is expanded.
MAX_POINTS = 250_000
#: ``progress(stage, done, total)`` of :func:`load_sweep` on long expansions.
LoadProgress = Callable[[str, int, int], None]
#: Metrics read from the run result (``utilisation`` is ``compute_utilization``, percent).
RUN_METRICS = (
    "latency_ms",
    "throughput",
    "energy_j",
    "utilisation",
    "compute_utilization",
    "avg_power_w",
    "peak_temperature_c",
    "memory_bandwidth_gbs",
    "achieved_tflops",
    "roofline_floor_ms",
    "peak_tflops",
)
DEFAULT_METRICS = ("latency_ms", "throughput", "energy_j", "utilisation")
_TOP_KEYS = ("schema_version", "name", "base", *SAMPLERS, "workloads", "metrics", "constraint")
_CMP = re.compile(r"(<=|>=|==|!=|<|>)")


def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces: the one text a value hashes and compares as."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def metric_names() -> list[str]:
    """Every metric a sweep may keep: the run metrics, the scalar counters
    (``cycles``, ``cache_misses``, ...) and the per-level/per-cause counter entries
    (``bytes.hbm``, ``hits.l1``, ``stall_cycles.memory``, ``macs_by_precision.fp16``)."""
    c = Counters()
    out = list(RUN_METRICS)
    for f in fields(c):
        v = getattr(c, f.name)
        if isinstance(v, dict):
            out += [f"{f.name}.{k}" for k in v]
        else:
            out.append(f.name)
    return out + ["cache_misses", "cache_hits"]


@dataclass(frozen=True)
class Constraint:
    """``A <= B`` (any of ``< <= > >= == !=``, chains allowed) over expressions of the
    restricted language of :mod:`wia_hw.registry._expr`."""

    text: str
    terms: tuple[Expr, ...]
    ops: tuple[str, ...]

    def holds(self, env: Mapping[str, float]) -> bool:
        vals = [t.evaluate(env) for t in self.terms]
        for (a, b), op in zip(zip(vals, vals[1:], strict=False), self.ops, strict=True):
            ok = {
                "<": a < b,
                "<=": a <= b,
                ">": a > b,
                ">=": a >= b,
                "==": a == b,
                "!=": a != b,
            }[op]
            if not ok:
                return False
        return True


def _compile_constraint(text: Any, names: set[str]) -> Constraint:
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"a constraint must be a non-empty string, got {text!r}")
    parts = _CMP.split(text)
    exprs, ops = parts[0::2], parts[1::2]
    if not ops:
        raise ExprError(f"constraint {text!r} compares nothing (use < <= > >= == !=)")
    terms = tuple(compile_expr(e, names) for e in exprs)
    return Constraint(text.strip(), terms, tuple(ops))


@dataclass(frozen=True)
class Point:
    """One run of a sweep: device parameters x one workload. ``key`` identifies it in
    the store (see :func:`point_key`)."""

    key: str
    params: dict[str, Any]
    workload: str  # label: ``name(arg=value, ...)``
    workload_name: str
    workload_args: dict[str, Any]
    metrics: tuple[str, ...]
    error: str | None = None  # the constraint could not be evaluated: failed, not run


@dataclass(frozen=True)
class Sweep:
    """A loaded, checked sweep file. ``points()`` lists its points (constraint
    applied, duplicates removed, in a fixed order)."""

    name: str
    file: str
    base: dict[str, Any] = field(repr=False)
    base_name: str
    base_hash: str
    sampler: str
    parameters: tuple[str, ...]
    param_sets: tuple[dict[str, Any], ...] = field(repr=False)
    workloads: tuple[tuple[str, dict[str, Any]], ...]
    metrics: tuple[str, ...]
    constraint: tuple[Constraint, ...] = ()
    filtered: int = 0  # parameter sets the constraint removed
    #: per parameter set: None, or why the constraint could not be evaluated (its
    #: points are stored ``failed`` with that error and not run)
    set_errors: tuple[str | None, ...] = field(default=(), repr=False)
    #: sha256 of each workload read from a file (``.onnx``, ``.csv``), by its path:
    #: part of its points' keys, so a changed model gets new points
    workload_sha256: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def definition(self) -> str:
        """sha256 (hex) of which points the sweep has and what makes their results
        comparable: its point keys (the parameter sets of its grid or sample, after
        the constraint, per workload), the base spec's content, the metrics, the
        workloads (a model file's content too) and the wia-hw version. A sweep's
        report shows the rows of its current definition only: run again with fewer
        (or other) parameter values, the rows of points it no longer has are left out
        as superseded, as are those of an earlier base spec."""
        doc = {
            "base": self.base_hash,
            "metrics": list(self.metrics),
            "workloads": [[w, a] for w, a in self.workloads],
            "version": __version__,
        }
        if self.workload_sha256:  # absent for builders only: their definitions stay
            doc["workload_sha256"] = dict(self.workload_sha256)
        keys = self.__dict__.get("_point_keys")
        if keys is None:
            keys = tuple(p.key for p in self.points())
        doc["points"] = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()
        return hashlib.sha256(canonical_json(doc).encode()).hexdigest()

    def points(self) -> list[Point]:
        out: dict[str, Point] = {}
        errors = self.set_errors or (None,) * len(self.param_sets)
        for params, error in zip(self.param_sets, errors, strict=True):
            for wname, wargs in self.workloads:
                sha = self.workload_sha256.get(wname)
                # a builder's key as it always was: only a model file adds its hash
                extra = {} if sha is None else {"file_sha256": sha}
                key = point_key(params, wname, wargs, self.metrics, self.base_hash, **extra)
                out.setdefault(
                    key,
                    Point(
                        key,
                        dict(params),
                        _label(wname, wargs),
                        wname,
                        dict(wargs),
                        self.metrics,
                        error,
                    ),
                )
        # for :attr:`definition` (a frozen dataclass: set as its own attribute, no field)
        object.__setattr__(self, "_point_keys", tuple(out))
        return list(out.values())


def _label(name: str, args: Mapping[str, Any]) -> str:
    inner = ", ".join(f"{k}={args[k]}" for k in sorted(args))
    return f"{name}({inner})"


def _canon(v: Any) -> Any:
    """Numbers as one text per value: a float equal to an integer is that integer
    (``600.0`` and ``600`` are one point); booleans stay booleans."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, Mapping):
        return {k: _canon(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    return v


def point_key(
    params: Mapping[str, Any],
    workload: str,
    args: Mapping[str, Any],
    metrics: tuple[str, ...] | list[str],
    base_hash: str,
    version: str = __version__,
    *,
    canonical: bool = True,
    file_sha256: str | None = None,
) -> str:
    """sha256 (hex) of the canonical JSON of (parameters, workload and its arguments,
    the sha256 of the workload's model file when it is read from one (``file_sha256``:
    a changed model is a new point, never the stored one), metrics kept, the base
    spec's content hash, the wia-hw version); numerically equal values give one key
    (``600.0`` is ``600``). ``canonical=False`` gives the key as wia-hw computed it
    before that (values as given: ``1.0`` and ``1`` two keys), which stores written then
    hold; :class:`~wia_hw.sweep.SweepStore` maps those to these."""
    wl: dict[str, Any] = {"name": workload, "args": _canon(dict(args)) if canonical else dict(args)}
    if file_sha256 is not None:  # absent for a builder: its keys stay as they were
        wl["sha256"] = file_sha256
    doc = {
        "params": _canon(dict(params)) if canonical else dict(params),
        "workload": wl,
        "metrics": list(metrics),
        "base": base_hash,
        "version": version,
    }
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def has_integral_float(v: Any) -> bool:
    """Whether ``v`` holds a float equal to an integer (its point key changed when keys
    became canonical)."""
    if isinstance(v, float):
        return v.is_integer()
    if isinstance(v, Mapping):
        return any(has_integral_float(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return any(has_integral_float(x) for x in v)
    return False


# -- loading -------------------------------------------------------------------------


class _Ctx:
    def __init__(self, display: str, lines: Mapping[str, int]) -> None:
        self.display, self.lines = display, lines

    def err(self, message: str, at: str | None) -> SpecError:
        return SpecError(message, file=self.display, line=line_for(at, self.lines))


def _check_path(path: str, base: Mapping[str, Any]) -> str | None:
    """None when ``path`` names a DeviceSpec field (or a key of a mapping field that
    the base spec has); else what is wrong."""
    if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
        return f"parameter path must be a dotted field path, got {path!r}"
    cls: Any = DeviceSpec
    node: Any = base
    parts = path.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the spec"
        if cls is None:  # inside a mapping field: keys the base has
            if not isinstance(node, Mapping) or part not in node:
                known = ", ".join(map(str, node)) if isinstance(node, Mapping) else "none"
                return (
                    f"unknown parameter path {path!r}: no key {part!r} in {where} (known: {known})"
                )
            node = node[part]
            if i < len(parts) - 1:
                return f"unknown parameter path {path!r}: {'.'.join(parts[: i + 1])} is a value"
            continue
        known = {f.name: f for f in fields(cls)}
        if part not in known:
            return (
                f"unknown parameter path {path!r}: no field {part!r} in {where} "
                f"(known: {', '.join(known)})"
            )
        hint = typing.get_type_hints(cls)[part]
        node = node.get(part, {}) if isinstance(node, Mapping) else {}
        if isinstance(hint, type) and is_dataclass(hint):
            cls = hint
            if i == len(parts) - 1:
                return f"parameter path {path!r} names a section, not a value"
        else:
            cls = None
            if i < len(parts) - 1 and not isinstance(node, Mapping):
                return f"unknown parameter path {path!r}: {'.'.join(parts[: i + 1])} is a value"
    return None


def _read_base(base: Any, here: Path, ctx: _Ctx) -> tuple[dict[str, Any], str]:
    if isinstance(base, Mapping):
        return copy.deepcopy(dict(base)), f"{ctx.display}:base"
    if not isinstance(base, str) or not base.strip():
        raise ctx.err(f"base must be a spec name, a path or a mapping, got {base!r}", "base")
    p = Path(base)
    if p.suffix in (".yaml", ".yml") or "/" in base:
        path = p if p.is_absolute() else here / p
        if not path.is_file():
            raise ctx.err(f"base spec file {base!r} not found (looked at {path})", "base")
        data, _ = read_yaml_mapping(path, str(path), "a spec")
        return data, base
    found = spec_path(base)
    if found is None:
        raise ctx.err(f"unknown base spec {base!r} (built-in: {', '.join(list_specs())})", "base")
    data, _ = read_yaml_mapping(found, f"specs/{base}.yaml", "a spec")
    return data, base


def _values(v: Any, at: str, ctx: _Ctx, ranges: bool) -> Any:
    if isinstance(v, list):
        if not v:
            raise ctx.err(f"{at}: empty list of values", at)
        return v
    if ranges and isinstance(v, Mapping):
        extra = set(v) - {"low", "high", "log"}
        if extra or "low" not in v or "high" not in v:
            raise ctx.err(f"{at}: a range reads {{low: L, high: H[, log: true]}}, got {v!r}", at)
        lo, hi, log = v["low"], v["high"], v.get("log", False)
        for b in (lo, hi):
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b):
                raise ctx.err(f"{at}: range bounds must be numbers, got {b!r}", at)
        if lo > hi:
            raise ctx.err(f"{at}: range low {lo!r} is above high {hi!r}", at)
        if not isinstance(log, bool) or (log and lo <= 0):
            raise ctx.err(f"{at}: log must be true/false and needs low > 0", at)
        return (lo, hi, log)
    kind = "a list of values or a range {low: L, high: H}" if ranges else "a list of values"
    raise ctx.err(f"{at}: must be {kind}, got {v!r}", at)


def _pick(spec: Any, u: float) -> Any:
    """The value at quantile ``u`` in [0, 1) of a choice list or a range."""
    if isinstance(spec, list):
        return spec[min(int(u * len(spec)), len(spec) - 1)]
    lo, hi, log = spec
    if isinstance(lo, int) and isinstance(hi, int):
        if log:
            return min(hi, int(round(math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))))))
        return min(hi, lo + int(u * (hi - lo + 1)))
    if log:
        return float(math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))))
    return float(lo + u * (hi - lo))


def _samples(kind: str, spec: Any, ctx: _Ctx) -> tuple[list[str], list[dict[str, Any]]]:
    if not isinstance(spec, Mapping) or not spec:
        raise ctx.err(f"{kind} must be a non-empty mapping", kind)
    if kind == "grid":
        names = [str(k) for k in spec]
        vals = [_values(spec[k], f"{kind}.{k}", ctx, ranges=False) for k in spec]
        count = math.prod(len(v) for v in vals)
        if count > MAX_POINTS:
            axes = " x ".join(f"{n} ({len(v)})" for n, v in zip(names, vals, strict=True))
            raise ctx.err(
                f"grid: {count:,} parameter sets ({axes}) is above the limit of "
                f"{MAX_POINTS:,} points a sweep may have; split the sweep or use random: "
                "or latin_hypercube:",
                kind,
            )
        sets = [{}]
        for n, vs in zip(names, vals, strict=True):
            sets = [dict(s, **{n: v}) for s in sets for v in vs]
        return names, sets
    extra = set(spec) - {"n", "seed", "parameters"}
    if extra:
        raise ctx.err(
            f"{kind}: unknown key(s) {', '.join(sorted(map(str, extra)))} "
            "(known: n, seed, parameters)",
            f"{kind}.{sorted(map(str, extra))[0]}",
        )
    n, seed, params = spec.get("n"), spec.get("seed"), spec.get("parameters")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ctx.err(f"{kind}.n must be a positive integer, got {n!r}", f"{kind}.n")
    if n > MAX_POINTS:
        raise ctx.err(
            f"{kind}.n: {n:,} samples is above the limit of {MAX_POINTS:,} points a sweep may have",
            f"{kind}.n",
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ctx.err(f"{kind}.seed must be a non-negative integer, got {seed!r}", f"{kind}.seed")
    if not isinstance(params, Mapping) or not params:
        raise ctx.err(f"{kind}.parameters must be a non-empty mapping", f"{kind}.parameters")
    names = [str(k) for k in params]
    vals = [_values(params[k], f"{kind}.parameters.{k}", ctx, ranges=True) for k in params]
    if kind == "random":
        u = np.random.default_rng(seed).random((n, len(names)))
    else:
        try:
            from scipy.stats import qmc
        except ImportError:
            raise ctx.err(
                "latin_hypercube needs scipy (pip install 'wia-hw[sweep]')", kind
            ) from None
        kw = "rng" if "rng" in inspect.signature(qmc.LatinHypercube).parameters else "seed"
        u = qmc.LatinHypercube(d=len(names), **{kw: seed}).random(n)
    sets = [
        {
            name: _pick(v, float(u[i, j]))
            for j, (name, v) in enumerate(zip(names, vals, strict=True))
        }
        for i in range(n)
    ]
    return names, sets


def _workloads(
    spec: Any, here: Path, ctx: _Ctx
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, str]]:
    """The workloads (name, arguments), each checked by building it as a point runs it
    (:func:`~wia_hw.runtime.resolve_workload`, so what loads runs), and the sha256 of
    each model file (``.onnx``, SCALE-Sim ``.csv``; a relative path is relative to the
    sweep file) by its absolute path."""
    from ..runtime import file_sha256, is_workload_file, resolve_workload

    items: list[tuple[str, Any, str]] = []
    if isinstance(spec, Mapping) and spec:
        items = [(str(k), v, f"workloads.{k}") for k, v in spec.items()]
    elif isinstance(spec, list) and spec:
        for i, item in enumerate(spec):
            if not isinstance(item, Mapping) or len(item) != 1:
                raise ctx.err(
                    "each workloads item must be one NAME: {ARGS} mapping", f"workloads.{i}"
                )
            ((k, v),) = item.items()
            items.append((str(k), v, f"workloads.{i}"))
    else:
        raise ctx.err(
            "workloads must be a non-empty mapping NAME: {ARGS} (or a list of them)", "workloads"
        )
    out = []
    hashes: dict[str, str] = {}
    for name, args, at in items:
        if args is None:
            args = {}
        if not isinstance(args, Mapping):
            raise ctx.err(f"workload {name!r}: arguments must be a mapping, got {args!r}", at)
        if is_workload_file(name) and not Path(name).is_absolute():
            name = str(here / name)
        try:
            resolve_workload(name, **{str(k): v for k, v in args.items()})
        except WiaError as e:
            raise ctx.err(f"workload {name!r}: {e}", at) from None
        if is_workload_file(name) and name not in hashes:
            try:
                hashes[name] = file_sha256(name)
            except OSError as e:
                raise ctx.err(f"workload {name!r}: cannot read it: {e.strerror}", at) from None
        out.append((name, {str(k): v for k, v in args.items()}))
    return out, hashes


def _flat(data: Any, prefix: str = "", out: dict[str, float] | None = None) -> dict[str, float]:
    """Numeric leaves of a spec mapping by ``path_with_underscores``."""
    out = {} if out is None else out
    if isinstance(data, Mapping):
        for k, v in data.items():
            _flat(v, f"{prefix}_{k}" if prefix else str(k), out)
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[prefix] = data
    return out


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    node = data
    *head, last = path.split(".")
    for p in head:
        node = node.setdefault(p, {})
    node[last] = value


class _EnvMaker:
    """:func:`constraint_env` for many parameter sets over the same parameters: the
    base spec is flattened once; per set only the swept paths are replaced."""

    def __init__(self, base: Mapping[str, Any], names: list[str] | tuple[str, ...]) -> None:
        self.flat = _flat(base)
        self.under: dict[str, list[str]] = {}  # path -> the base's flat keys under it
        for name in names:
            node: Any = base
            for part in name.split("."):
                node = node.get(part) if isinstance(node, Mapping) else None
            self.under[name] = list(_flat(node, name.replace(".", "_"))) if node is not None else []
        leaves = [p.rsplit(".", 1)[-1] for p in names]
        self.leaf = {p: p.rsplit(".", 1)[-1] for p in names}
        self.unique = {p for p in names if leaves.count(self.leaf[p]) == 1}

    def __call__(self, params: Mapping[str, Any]) -> dict[str, float]:
        env = dict(self.flat)
        for p, v in params.items():  # no path is inside another (load_sweep checks)
            for k in self.under.get(p, ()):
                env.pop(k, None)
            _flat(v, p.replace(".", "_"), env)
        for p, v in params.items():
            if p in self.unique and isinstance(v, (int, float)) and not isinstance(v, bool):
                env.setdefault(self.leaf[p], v)
        return env


def constraint_env(base: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, float]:
    """The names a constraint may read: every numeric field of the base spec with the
    point's parameters applied, by dotted path with ``.`` written ``_``
    (``compute_array_rows``), plus each swept parameter's last name (``rows``) when no
    other swept parameter shares it."""
    return _EnvMaker(base, list(params))(params)


def load_sweep(
    source: str | Path | Mapping[str, Any], progress: LoadProgress | None = None
) -> Sweep:
    """Read and check a sweep file (a path, or a mapping of the same form).

    Raises :class:`SpecError` (``file:line: message``) for a bad schema version, an
    unknown key, an unknown base spec, an unknown parameter path (checked against the
    fields of :class:`~wia_hw.DeviceSpec`), bad values lists or ranges, an unknown
    workload or builder argument, an unknown metric, or a constraint outside the
    expression language or reading an unknown name. Values are *not* validated here:
    a value the spec refuses makes that point fail (status ``failed``) when it runs.
    A file of more than :data:`MAX_POINTS` points is refused before it is expanded.
    ``progress(stage, done, total)`` is called now and then while the constraint is
    checked over many parameter sets.
    """
    if isinstance(source, Mapping):
        data, lines, display, here = copy.deepcopy(dict(source)), {}, "<sweep>", Path.cwd()
        stem = "sweep"
    else:
        p = Path(source)
        display = str(source)
        data, lines = read_yaml_mapping(p, display, "a sweep file")
        here, stem = p.resolve().parent, p.stem
    ctx = _Ctx(display, lines)
    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise ctx.err(
            f"unknown key {unknown[0]!r} (known: {', '.join(_TOP_KEYS)})", str(unknown[0])
        )
    if data.get("schema_version") != SWEEP_SCHEMA_VERSION:
        raise ctx.err(
            f"schema_version must be {SWEEP_SCHEMA_VERSION}, got {data.get('schema_version')!r}",
            "schema_version",
        )
    name = data.get("name", stem)
    if not isinstance(name, str) or not name.strip():
        raise ctx.err(f"name must be a non-empty string, got {name!r}", "name")
    if "base" not in data:
        raise ctx.err("missing base (a spec name such as wia-npu, a path or a mapping)", None)
    base, base_name = _read_base(data["base"], here, ctx)
    if "devices" in base or "links" in base:
        raise ctx.err("base must be a device spec, not a cluster spec", "base")
    try:
        load_spec(base)
    except SpecError as e:
        raise ctx.err(f"base spec {base_name!r} is invalid: {e}", "base") from None
    base_hash = hashlib.sha256(canonical_json(base).encode()).hexdigest()

    kinds = [k for k in SAMPLERS if k in data]
    if len(kinds) != 1:
        raise ctx.err(
            f"give exactly one of {', '.join(SAMPLERS)} (found {', '.join(kinds) or 'none'})",
            kinds[1] if len(kinds) > 1 else None,
        )
    kind = kinds[0]
    names, sets = _samples(kind, data[kind], ctx)
    prefix = "grid" if kind == "grid" else f"{kind}.parameters"
    for n in names:
        problem = _check_path(n, base)
        if problem:
            raise ctx.err(problem, f"{prefix}.{n}")
        outer = [o for o in names if n.startswith(o + ".")]
        if outer:
            raise ctx.err(
                f"parameter {n!r} is inside the swept parameter {outer[0]!r}: sweep one of them",
                f"{prefix}.{n}",
            )

    for n in names:
        try:
            canonical_json([s[n] for s in sets])
        except (TypeError, ValueError) as e:
            raise ctx.err(
                f"values of {n!r} must be finite numbers, strings, lists or mappings ({e})",
                f"{prefix}.{n}",
            ) from None
    workloads, workload_sha256 = _workloads(data.get("workloads"), here, ctx)
    for wname, wargs in workloads:
        try:
            canonical_json(wargs)
        except (TypeError, ValueError) as e:
            raise ctx.err(
                f"workload {wname!r}: arguments must be plain values ({e})", "workloads"
            ) from None

    metrics = data.get("metrics", list(DEFAULT_METRICS))
    if not isinstance(metrics, list) or not metrics:
        raise ctx.err(f"metrics must be a non-empty list, got {metrics!r}", "metrics")
    known = metric_names()
    for i, m in enumerate(metrics):
        if m not in known:
            raise ctx.err(f"unknown metric {m!r} (known: {', '.join(known)})", f"metrics.{i}")
    if len(set(metrics)) != len(metrics):
        raise ctx.err("metrics lists a name twice", "metrics")

    if len(sets) * len(workloads) > MAX_POINTS:
        raise ctx.err(
            f"{len(sets):,} parameter sets x {len(workloads)} workloads = "
            f"{len(sets) * len(workloads):,} points is above the limit of {MAX_POINTS:,} "
            "points a sweep may have",
            kind,
        )
    raw = data.get("constraint")
    texts = [] if raw is None else raw if isinstance(raw, list) else [raw]
    make_env = _EnvMaker(base, names)
    allowed = set(make_env(sets[0]))
    constraints = []
    for i, t in enumerate(texts):
        try:
            constraints.append(_compile_constraint(t, allowed))
        except ExprError as e:
            at = "constraint" if not isinstance(raw, list) else f"constraint.{i}"
            raise ctx.err(f"constraint: {e}", at) from None
    kept = [] if constraints else sets
    set_errors: list[str | None] = []
    step = max(1, len(sets) // 100)
    for i, s in enumerate(sets if constraints else ()):
        if progress is not None and i % step == 0:
            progress("constraint", i, len(sets))
        env = make_env(s)
        try:
            if all(c.holds(env) for c in constraints):
                kept.append(s)
                set_errors.append(None)
        except ExprError as e:  # this set fails (stored with the error), the others run
            kept.append(s)
            set_errors.append(f"constraint {', '.join(c.text for c in constraints)}: {e}")
    if progress is not None and constraints:
        progress("constraint", len(sets), len(sets))
    return Sweep(
        name=name.strip(),
        file=display,
        base=base,
        base_name=base_name,
        base_hash=base_hash,
        sampler=kind,
        parameters=tuple(names),
        param_sets=tuple(kept),
        workloads=tuple(workloads),
        workload_sha256=workload_sha256,
        metrics=tuple(metrics),
        constraint=tuple(constraints),
        filtered=len(sets) - len(kept),
        set_errors=tuple(set_errors),
    )
