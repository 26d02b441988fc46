"""Tuned GEMM schedules on disk: one JSON file, entries keyed by kernel and device.

A file holds ``{"format": "wia-hw-schedules", "version": 1, "entries": [...]}``. Each
entry is one kernel's schedule on one device spec:

* ``kernel``: :func:`wia_hw.lowering.gemm_key` (op kind, batch x M x N x K, precision,
  output bytes, B layout, bias), ``precision``;
* ``device`` (the spec's name, for people) and ``spec_sha256`` (of the resolved spec:
  its plain mapping as canonical JSON). Only entries whose hash equals the spec's apply,
  so a schedule tuned on one L1 size is never applied to another;
* ``tiling``: ``tm``, ``tn``, ``tk``, ``tb``, ``order``, and ``cores`` when the tiles
  go to fewer than all the cores (a :class:`~wia_hw.emulator.kernels.GemmTiling`),
  ``dataflow`` (the array's, recorded);
* the evidence: ``cycles`` (tuned, the kernel alone on a fresh device),
  ``default_cycles`` (the heuristic's), ``floor_cycles`` (its roofline floor),
  ``trials``, ``method``, ``seed``.

:func:`save_schedules` merges into an existing file (an entry of the same kernel and
spec hash is replaced); :func:`load_schedules` gives the tilings that apply to a spec
(a :class:`Schedules` mapping that also counts the entries it left out for another
spec), which ``wia_hw.run(..., schedules=path)`` hands to lowering. A file with no
entry for the spec warns (:class:`ScheduleDeviceWarning`): the run uses the default
tilings. A :class:`Schedules` records its spec hash, so one handed to a run on another
spec (``AutotuneResult.schedules``, a loaded file's) is left out and warns alike
(:func:`check_schedules`).

A malformed file is one :class:`ScheduleError` naming the file, the entry (its index
and kernel key) and the field: a structural fault in any entry, two entries of one
kernel and spec hash, and, for the entries of the spec being loaded, a tiling outside
the tuner's search space on that device (:func:`check_tiling`): ``tm`` a multiple of
the array's rows or the whole M, ``tn`` of its columns or the whole N, ``tk`` of its
rows or the whole K, none above its whole extent rounded up to that unit; ``tb`` at
most the batch, and above 1 only when a tile holds whole matrices; ``cores`` at most
the device's; and the
double-buffered L1 rule of lowering's heuristic and the tuner's pool,
``tb (tm + tn) tk in_bytes <= L1/2`` and ``tb tm tn out_bytes <= L1/4`` (element bytes
from the key's precision and output bytes). An entry for a kernel the graph does not
have is not an error here (one file serves many graphs): lowering applies the keys it
meets.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._files import update_locked
from ..emulator.config import DeviceSpec, to_mapping
from ..emulator.errors import WiaError
from ..emulator.kernels import GemmTiling

__all__ = [
    "FORMAT",
    "VERSION",
    "AutotuneError",
    "ScheduleError",
    "ScheduleDeviceWarning",
    "ScheduleUnusedWarning",
    "Schedules",
    "spec_hash",
    "load_schedules",
    "read_entries",
    "save_schedules",
    "check_tiling",
    "tiling_fields",
]

FORMAT = "wia-hw-schedules"
VERSION = 1
_TILING_FIELDS = ("tm", "tn", "tk", "tb", "order", "cores")


def tiling_fields(t: GemmTiling) -> dict[str, Any]:
    """A tiling as a schedule file writes it: ``cores`` only when not 0 (all)."""
    out: dict[str, Any] = {"tm": t.tm, "tn": t.tn, "tk": t.tk, "tb": t.tb, "order": t.order}
    if t.cores:
        out["cores"] = t.cores
    return out


class AutotuneError(WiaError, ValueError):
    """Bad auto-tuning input (budget, method, kernel names) or schedule file."""


class ScheduleError(AutotuneError):
    """A schedule file that cannot be read or is malformed."""


class ScheduleDeviceWarning(UserWarning):
    """A schedule file has no entry for the device it is loaded for (its entries were
    tuned on another spec, or it has none): the run uses the default tilings."""


class ScheduleUnusedWarning(UserWarning):
    """A run was given tuned tilings for its device, but none matches a GEMM kernel of
    its graph (tuned for another model or shape): it uses the default tilings."""


class Schedules(dict[str, GemmTiling]):
    """The tilings of a schedule file that apply to one spec, by kernel key (a dict, what
    lowering takes), and what was left out: ``path``, ``device`` (the spec's name),
    ``spec_sha256`` (that spec's :func:`spec_hash`), ``applied`` (entries of this spec),
    ``other_spec`` (entries tuned on other specs, not applied) and ``other_devices``
    (those entries' device names, sorted). Given to a run on another spec
    (:func:`check_schedules`), its tilings are left out as a file's entries of another
    spec are."""

    path: str = ""
    device: str = ""
    spec_sha256: str = ""
    other_spec: int = 0
    other_devices: tuple[str, ...] = ()

    @property
    def applied(self) -> int:
        return len(self)


def spec_hash(spec: DeviceSpec) -> str:
    """SHA-256 (hex) of the resolved spec's plain mapping as canonical JSON (sorted keys,
    no spaces): equal exactly when every field is equal."""
    text = json.dumps(to_mapping(spec), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def read_entries(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of a schedule file ([] when it does not exist); ScheduleError when it
    is not a schedule file or an entry is malformed."""
    p = Path(path)
    if not p.exists():
        return []
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScheduleError(f"{p}: not a readable JSON schedule file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ScheduleError(f"{p}: not a schedule file (format must be {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ScheduleError(f"{p}: version {doc.get('version')!r} is not {VERSION}")
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise ScheduleError(f"{p}: 'entries' must be a list")
    seen: dict[tuple[str, str], int] = {}
    for i, e in enumerate(entries):
        _check_entry(p, i, e)
        j = seen.setdefault((e["spec_sha256"], e["kernel"]), i)
        if j != i:
            raise ScheduleError(
                f"{p}: entry {i} ({e['kernel']}): 'kernel' repeats entry {j} for the same "
                f"spec ({e['spec_sha256'][:12]}): one schedule per kernel and spec; "
                "remove one of them"
            )
    return entries


def _check_entry(p: Path, i: int, e: Any) -> GemmTiling:
    if not isinstance(e, dict):
        raise ScheduleError(f"{p}: entry {i} must be a mapping")
    for f in ("kernel", "spec_sha256"):
        if not isinstance(e.get(f), str):
            raise ScheduleError(f"{p}: entry {i} needs a string {f!r}")
    t = e.get("tiling")
    if not isinstance(t, dict) or set(t) - set(_TILING_FIELDS) or not {"tm", "tn", "tk"} <= set(t):
        raise ScheduleError(
            f"{p}: entry {i} ({e['kernel']}): 'tiling' must map tm, tn, tk (and tb, order, cores)"
        )
    try:
        return GemmTiling(**t)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{p}: entry {i} ({e['kernel']}): {exc}") from None


_KEY = re.compile(r"(\S+) (\d+)x(\d+)x(\d+)x(\d+) (\S+)->(\d+)B (?:bT|bB|b)(?:\+bias)?")
_PRECISION_BYTES = {"int8": 1, "fp16": 2, "bf16": 2, "fp32": 4}


def check_tiling(key: str, t: GemmTiling, spec: DeviceSpec) -> str | None:
    """Why tiling ``t`` cannot be a schedule of the kernel of key ``key`` on ``spec``
    (the field and the rule, one phrase), or None when it can: see the module
    docstring."""
    m = _KEY.fullmatch(key)
    if m is None or m.group(6) not in _PRECISION_BYTES or int(m.group(7)) < 1:
        return (
            "'kernel' is not a GEMM kernel key (op batchxMxNxK precision-><out bytes>B "
            "layout[+bias], e.g. 'linear 1x128x768x768 fp16->2B b+bias')"
        )
    batch, mm, nn, kk = (int(m.group(i)) for i in (2, 3, 4, 5))
    e, eo = _PRECISION_BYTES[m.group(6)], int(m.group(7))
    a = spec.compute.array
    tm, tn, tk = t.tm, t.tn, t.tk
    for name, v, unit, what, dim, extent in (
        ("tm", tm, a.rows, "rows", "M", mm),
        ("tn", tn, a.cols, "columns", "N", nn),
        ("tk", tk, a.rows, "rows", "K", kk),
    ):
        if v > -(-extent // unit) * unit:
            return (
                f"tiling.{name}={v} is above the whole {dim} ({extent}) rounded up to the "
                f"array's {unit} {what} on {spec.name}"
            )
        if v % unit and v != extent:
            return (
                f"tiling.{name}={v} is neither a multiple of the array's {unit} {what} nor "
                f"the whole {dim} ({extent}) on {spec.name}"
            )
    if t.tb > batch:
        return f"tiling.tb={t.tb} is above the kernel's batch ({batch})"
    if t.tb > 1 and (tm < mm or tn < nn):
        return (
            f"tiling.tb={t.tb} batches tiles that do not hold whole {mm}x{nn} matrices "
            f"(tm={t.tm}, tn={t.tn})"
        )
    if t.cores > spec.compute.cores:
        return f"tiling.cores={t.cores} is above the {spec.compute.cores} cores of {spec.name}"
    l1 = spec.memory.l1.size_bytes
    ins, outs = t.tb * (tm + tn) * tk * e, t.tb * tm * tn * eo
    if ins > l1 // 2 or outs > l1 // 4:
        return (
            f"tiling tm={t.tm}, tn={t.tn}, tk={t.tk}, tb={t.tb} does not fit the "
            f"double-buffered L1 of {spec.name}: operands tb(tm+tn)tk x {e} B = {ins:,} "
            f"(at most L1/2 = {l1 // 2:,}), results tb tm tn x {eo} B = {outs:,} (at most "
            f"L1/4 = {l1 // 4:,})"
        )
    return None


def load_schedules(path: str | os.PathLike[str], spec: DeviceSpec) -> Schedules:
    """The tilings of ``path`` tuned on ``spec`` (equal spec hash), by kernel key, as a
    :class:`Schedules` (a dict that also counts the entries left out for another spec).
    A missing file or an entry of this spec whose tiling cannot run as a schedule on it
    (:func:`check_tiling`) is a ScheduleError (one line: the file, the entry, the
    field); a file with no entry for ``spec`` warns (:class:`ScheduleDeviceWarning`)."""
    p = Path(path)
    if not p.exists():
        raise ScheduleError(f"{p}: schedule file not found")
    h = spec_hash(spec)
    out = Schedules()
    others: set[str] = set()
    for i, e in enumerate(read_entries(p)):
        if e["spec_sha256"] != h:
            out.other_spec += 1
            others.add(str(e.get("device", "?")))
            continue
        t = _check_entry(p, i, e)
        why = check_tiling(e["kernel"], t, spec)
        if why is not None:
            raise ScheduleError(f"{p}: entry {i} ({e['kernel']}): {why}")
        out[e["kernel"]] = t
    out.path, out.device, out.other_devices = str(p), spec.name, tuple(sorted(others))
    out.spec_sha256 = h
    if not out:
        _warn_none_apply(p, spec, h, out.other_spec, ", ".join(out.other_devices), 3)
    return out


def _warn_none_apply(
    where: object, spec: DeviceSpec, h: str, others: int, devices: str, stacklevel: int
) -> None:
    """The :class:`ScheduleDeviceWarning` of schedules none of which applies to ``spec``
    (of hash ``h``): ``others`` entries tuned on ``devices``, or none."""
    what = (
        f"its {others} entries are for another spec ({devices})" if others else "it has no entries"
    )
    warnings.warn(
        f"{where}: no schedule for {spec.name} (spec {h[:12]}): {what}; the run uses the "
        "default tilings",
        ScheduleDeviceWarning,
        stacklevel=stacklevel,
    )


def check_schedules(schedules: Any, spec: DeviceSpec) -> Schedules:
    """A mapping of tilings by kernel key, as ``wia_hw.run(..., schedules=mapping)``
    takes it, checked as :func:`load_schedules` checks a file's entries: each key a
    GEMM kernel key, each value a :class:`~wia_hw.emulator.kernels.GemmTiling` or a
    mapping of its fields (``tm``, ``tn``, ``tk``, and ``tb``, ``order``), each tiling
    one that :func:`check_tiling` accepts on ``spec``. One :class:`ScheduleError` names
    the key and the field at fault.

    A :class:`Schedules` that records a spec (:func:`load_schedules`, an earlier call, or
    ``AutotuneResult.schedules``) is taken as a file's entries of that spec are: tuned on
    another spec (another hash), none applies and a :class:`ScheduleDeviceWarning` says
    so (the run uses the default tilings), as for a file with no entry for ``spec``; of
    this spec, each tiling is checked as above (a tiling never runs on a spec it was not
    checked on)."""
    if isinstance(schedules, Schedules) and schedules.spec_sha256:
        h = spec_hash(spec)
        if schedules.spec_sha256 != h:
            return _other_spec(schedules, spec, h)
        out = _checked(schedules, spec)
        out.path, out.other_spec = schedules.path, schedules.other_spec
        out.other_devices = schedules.other_devices
        return out
    return _checked(schedules, spec)


def _other_spec(schedules: Schedules, spec: DeviceSpec, h: str) -> Schedules:
    """What :func:`load_schedules` gives for a file whose entries are all those of
    ``schedules`` (tuned on another spec than ``spec``, of hash ``h``): none applies,
    with one :class:`ScheduleDeviceWarning`."""
    out = Schedules()
    out.path, out.device, out.spec_sha256 = schedules.path, spec.name, h
    out.other_spec = len(schedules)
    out.other_devices = (schedules.device or "?",)
    devices = f"{out.other_devices[0]}, spec {schedules.spec_sha256[:12]}"
    _warn_none_apply(schedules.path or "schedules", spec, h, out.other_spec, devices, 4)
    return out


def _checked(schedules: Any, spec: DeviceSpec) -> Schedules:
    """:func:`check_schedules` of a mapping: its tilings checked on ``spec``."""
    if not isinstance(schedules, Mapping):
        raise ScheduleError(
            "schedules must be a path to a schedule file or a mapping of tilings by kernel "
            f"key, got {type(schedules).__name__}"
        )
    out = Schedules()
    for key, t in schedules.items():
        if not isinstance(key, str):
            raise ScheduleError(f"schedules: key {key!r} is not a kernel key (a string)")
        if isinstance(t, Mapping):
            if set(t) - set(_TILING_FIELDS) or not {"tm", "tn", "tk"} <= set(t):
                raise ScheduleError(
                    f"schedules[{key!r}]: a tiling maps tm, tn, tk (and tb, order, cores), "
                    f"got {sorted(t)}"
                )
            try:
                t = GemmTiling(**t)
            except (TypeError, ValueError) as exc:
                raise ScheduleError(f"schedules[{key!r}]: {exc}") from None
        elif not isinstance(t, GemmTiling):
            raise ScheduleError(
                f"schedules[{key!r}]: must be a GemmTiling or a mapping of tm, tn, tk (and "
                f"tb, order, cores), got {type(t).__name__}"
            )
        why = check_tiling(key, t, spec)
        if why is not None:
            raise ScheduleError(f"schedules[{key!r}]: {why}")
        out[key] = t
    out.device, out.spec_sha256 = spec.name, spec_hash(spec)
    return out


def save_schedules(path: str | os.PathLike[str], entries: Iterable[Mapping[str, Any]]) -> Path:
    """Merge ``entries`` into the file at ``path`` (created if absent): an entry of the
    same ``kernel`` and ``spec_sha256`` is replaced; order is by (spec hash, kernel),
    so the same schedules give the same bytes. Processes saving into one file at once
    each keep the other's entries (:func:`wia_hw._files.update_locked`)."""
    entries = [dict(e) for e in entries]

    def merged_text() -> str:  # under the file's lock: another process's entries kept
        merged = {(e["spec_sha256"], e["kernel"]): dict(e) for e in read_entries(p)}
        for e in entries:
            merged[(e["spec_sha256"], e["kernel"])] = e
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "entries": [merged[k] for k in sorted(merged)],
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    p = Path(path)
    return update_locked(p, merged_text)
