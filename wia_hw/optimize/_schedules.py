"""Tuned GEMM schedules on disk: one JSON file, entries keyed by kernel and device.

A file holds ``{"format": "wia-hw-schedules", "version": 1, "entries": [...]}``. Each
entry is one kernel's schedule on one device spec:

* ``kernel``: :func:`wia_hw.lowering.gemm_key` (op kind, batch x M x N x K, precision,
  output bytes, B layout, bias), ``precision``;
* ``device`` (the spec's name, for people) and ``spec_sha256`` (of the resolved spec:
  its plain mapping as canonical JSON). Only entries whose hash equals the spec's apply,
  so a schedule tuned on one L1 size is never applied to another;
* ``tiling``: ``tm``, ``tn``, ``tk``, ``tb``, ``order`` (a
  :class:`~wia_hw.emulator.kernels.GemmTiling`), ``dataflow`` (the array's, recorded);
* the evidence: ``cycles`` (tuned, the kernel alone on a fresh device),
  ``default_cycles`` (the heuristic's), ``floor_cycles`` (its roofline floor),
  ``trials``, ``method``, ``seed``.

:func:`save_schedules` merges into an existing file (an entry of the same kernel and
spec hash is replaced); :func:`load_schedules` gives the tilings that apply to a spec,
which ``wia_hw.run(..., schedules=path)`` hands to lowering. A malformed file is one
:class:`ScheduleError` naming the file and the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..emulator.config import DeviceSpec, to_mapping
from ..emulator.errors import WiaError
from ..emulator.kernels import GemmTiling

__all__ = [
    "FORMAT",
    "VERSION",
    "AutotuneError",
    "ScheduleError",
    "spec_hash",
    "load_schedules",
    "read_entries",
    "save_schedules",
]

FORMAT = "wia-hw-schedules"
VERSION = 1
_TILING_FIELDS = ("tm", "tn", "tk", "tb", "order")


class AutotuneError(WiaError, ValueError):
    """Bad auto-tuning input (budget, method, kernel names) or schedule file."""


class ScheduleError(AutotuneError):
    """A schedule file that cannot be read or is malformed."""


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
    for i, e in enumerate(entries):
        _check_entry(p, i, e)
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
            f"{p}: entry {i} ({e['kernel']}): 'tiling' must map tm, tn, tk (and tb, order)"
        )
    try:
        return GemmTiling(**t)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{p}: entry {i} ({e['kernel']}): {exc}") from None


def load_schedules(path: str | os.PathLike[str], spec: DeviceSpec) -> dict[str, GemmTiling]:
    """The tilings of ``path`` tuned on ``spec`` (equal spec hash), by kernel key.
    A missing file is a ScheduleError (a run asked for it)."""
    p = Path(path)
    if not p.exists():
        raise ScheduleError(f"{p}: schedule file not found")
    h = spec_hash(spec)
    return {
        e["kernel"]: _check_entry(p, i, e)
        for i, e in enumerate(read_entries(p))
        if e["spec_sha256"] == h
    }


def save_schedules(path: str | os.PathLike[str], entries: Iterable[Mapping[str, Any]]) -> Path:
    """Merge ``entries`` into the file at ``path`` (created if absent): an entry of the
    same ``kernel`` and ``spec_sha256`` is replaced; order is by (spec hash, kernel),
    so the same schedules give the same bytes."""
    p = Path(path)
    merged = {(e["spec_sha256"], e["kernel"]): dict(e) for e in read_entries(p)}
    for e in entries:
        merged[(e["spec_sha256"], e["kernel"])] = dict(e)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "entries": [merged[k] for k in sorted(merged)],
    }
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, p)
    return p
