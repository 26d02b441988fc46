"""Baselines in SQLite: ``save_baseline`` and ``load_baseline_results``.

One table, ``baselines``: one row per saved result, keyed by workload (its name and
builder parameters), device name, device spec hash and tool version, with the whole
result as JSON. Loading picks the newest row that matches.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..emulator.config import METADATA_FIELDS, DeviceSpec
from ._config import BenchmarkError

if TYPE_CHECKING:
    from ._result import BenchmarkResult

__all__ = ["spec_hash", "save_baseline", "load_baseline_results", "check_baseline_file"]

_SCHEMA = """CREATE TABLE IF NOT EXISTS baselines (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload TEXT NOT NULL,
    device TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    tool_version TEXT NOT NULL,
    created_utc TEXT NOT NULL,
    result_json TEXT NOT NULL)"""


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [_plain(v) for v in obj]
        return sorted(items, key=repr) if isinstance(obj, (set, frozenset)) else items
    if isinstance(obj, enum.Enum):
        return obj.value
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def spec_hash(spec: DeviceSpec | Mapping[str, Any]) -> str:
    """A stable hash of a device spec's mapping: SHA-256 (first 16 hex digits) of its
    fields as sorted JSON, without the metadata fields (name, description,
    schema_version), so two specs that describe the same hardware hash alike."""
    d = _plain(spec)
    if isinstance(spec, DeviceSpec):
        d = {k: v for k, v in d.items() if k not in METADATA_FIELDS}
    text = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _connect(path: str | os.PathLike[str], *, create: bool) -> sqlite3.Connection:
    """A connection to the baseline file ``path``: for saving (``create``), made with
    its table when missing; for reading, opened read-only, so a file given to compare
    with is never changed (an SQLite file without a ``baselines`` table is refused, not
    given one)."""
    p = Path(path)
    if not create and not p.is_file():
        raise BenchmarkError(f"no baseline file {p}")
    try:
        if create:
            con = sqlite3.connect(p)
            con.execute(_SCHEMA)
            return con
        con = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as e:
        raise BenchmarkError(f"{p}: not a baseline database ({e})") from None
    if "baselines" not in tables:
        con.close()
        if not tables:  # an empty database (or file): nothing saved into it yet
            raise BenchmarkError(f"{p}: holds no baseline")
        raise BenchmarkError(
            f"{p}: not a baseline database (an SQLite file with no baselines table)"
        )
    return con


def check_baseline_file(path: str | os.PathLike[str], what: str = "") -> None:
    """Refuse, before any measuring, a file :func:`save_baseline` could not append to,
    in one line (``what`` names the option): it is not writable, or it exists and is
    not a baseline database (not SQLite, or SQLite with tables but no ``baselines``).
    A missing or empty file passes (saving creates it). Nothing is written."""
    p = Path(path)
    label = f"{what} {p}" if what else str(p)
    if not os.access(p if p.exists() else p.parent, os.W_OK):
        raise BenchmarkError(f"{label}: not writable")
    if not p.exists() or p.stat().st_size == 0:
        return
    try:
        con = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise BenchmarkError(f"{label}: not a baseline database ({e})") from None
    if tables and "baselines" not in tables:
        raise BenchmarkError(
            f"{label}: not a baseline database (an SQLite file with no baselines table)"
        )


def save_baseline(
    result: BenchmarkResult, path: str | os.PathLike[str], *, workload: str | None = None
) -> str:
    """Append ``result`` to the baseline file ``path`` (created if missing) under
    ``workload`` (default ``result.name``), its device, spec hash and tool version;
    returns the workload key."""
    from ._result import BenchmarkResult

    if not isinstance(result, BenchmarkResult):
        raise TypeError(f"save_baseline takes a BenchmarkResult, got {type(result).__name__}")
    key = workload or result.name
    con = _connect(path, create=True)
    try:
        with con:
            con.execute(
                "INSERT INTO baselines (workload, device, spec_hash, tool_version, "
                "created_utc, result_json) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    key,
                    result.device,
                    result.spec_hash,
                    result.tool_version,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    json.dumps(result.to_dict(), sort_keys=True),
                ),
            )
    finally:
        con.close()
    return key


def _device_identity(device: Any) -> tuple[str, str]:
    if isinstance(device, DeviceSpec):
        return device.name, spec_hash(device)
    if hasattr(device, "spec") and isinstance(device.spec, DeviceSpec):  # a Context
        return device.spec.name, spec_hash(device.spec)
    if isinstance(device, (str, os.PathLike)):
        from ..spec import load_spec

        spec = load_spec(device)
        if not isinstance(spec, DeviceSpec):
            raise BenchmarkError(
                f"{device}: a baseline belongs to one device, not to the cluster spec {spec.name!r}"
            )
        return spec.name, spec_hash(spec)
    raise TypeError(
        "device must be a spec name or path, a DeviceSpec or a Context, got "
        f"{type(device).__name__}"
    )


def load_baseline_results(
    path: str | os.PathLike[str],
    workload: str | None = None,
    *,
    device: Any = None,
    tool_version: str | None = None,
) -> BenchmarkResult:
    """The newest baseline in ``path`` for ``workload`` (a workload key as saved; may be
    omitted when the file holds one workload) on ``device`` (a spec name or path,
    DeviceSpec, Context, or ``("host", hash)``; ``None`` accepts any) with
    ``tool_version`` (``None`` accepts any).

    Raises :class:`BenchmarkError`: no such file, no baseline for the workload (naming
    those there are), a baseline of another device (naming both, with their spec
    hashes), none for the tool version.
    """
    from ._result import BenchmarkResult

    con = _connect(path, create=False)
    try:
        rows = con.execute(
            "SELECT workload, device, spec_hash, tool_version, result_json "
            "FROM baselines ORDER BY id DESC"
        ).fetchall()
    finally:
        con.close()
    if not rows:
        raise BenchmarkError(f"{path}: holds no baseline")
    names = sorted({r[0] for r in rows})
    if workload is None:
        if len(names) > 1:
            raise BenchmarkError(
                f"{path}: holds baselines of {len(names)} workloads ({', '.join(names)}); name one"
            )
        workload = names[0]
    rows = [r for r in rows if r[0] == workload]
    if not rows:
        raise BenchmarkError(
            f"{path}: no baseline for workload {workload!r} (it holds {', '.join(names)})"
        )
    if device is not None:
        name, h = device if isinstance(device, tuple) else _device_identity(device)
        same = [r for r in rows if r[2] == h]
        if not same:
            other = rows[0]
            raise BenchmarkError(
                f"{path}: the baseline of {workload!r} was measured on "
                f"device {other[1]!r} (spec {other[2]}), not on {name!r} "
                f"(spec {h})"
            )
        rows = same
    if tool_version is not None:
        versions = sorted({r[3] for r in rows})
        rows = [r for r in rows if r[3] == tool_version]
        if not rows:
            raise BenchmarkError(
                f"{path}: no baseline of {workload!r} from wia-hw "
                f"{tool_version} (it holds {', '.join(versions)})"
            )
    try:
        return BenchmarkResult.from_dict(json.loads(rows[0][4]))
    except BenchmarkError as e:  # a record missing fields
        raise BenchmarkError(f"{path}: the baseline of {workload!r}: {e}") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise BenchmarkError(
            f"{path}: the baseline of {workload!r} is not a readable result record "
            f"({type(e).__name__}: {e})"
        ) from None
