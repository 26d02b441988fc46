"""Reading what a report page is made from: a run report JSON (``wia-hw run --json``,
schema ``wia-hw.run/1``), a profiling report JSON (``wia-hw profile -o``,
:func:`~wia_hw.profiling.save_profile_report`, schema ``wia-hw.profile/1``) or a sweep
store (SQLite, ``meta.format`` = ``wia-hw-sweep/1``).

The kind is detected from the file's content, never its name: an SQLite file starts
with the 16 bytes ``SQLite format 3\\0``; anything else must be a JSON object whose
``schema`` is one of the two report schemas. Everything else is a
:class:`ReportError` naming the file and what was found (one line).

The store is read through :func:`wia_hw.sweep.open_store`; reading only (a sweep
may still be adding points).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..emulator.errors import WiaError
from ..sweep._store import sweeps_in_meta

__all__ = [
    "ReportError",
    "RUN_SCHEMA",
    "PROFILE_SCHEMA",
    "STORE_FORMAT",
    "SweepData",
    "load_source",
    "read_sweep_store",
]

RUN_SCHEMA = "wia-hw.run/1"
PROFILE_SCHEMA = "wia-hw.profile/1"
STORE_FORMAT = "wia-hw-sweep/1"
_SQLITE_MAGIC = b"SQLite format 3\x00"
_WHAT = (
    f"a run or profile report JSON (schema {RUN_SCHEMA!r} or {PROFILE_SCHEMA!r}) "
    f"or a sweep store (SQLite, format {STORE_FORMAT!r})"
)


class ReportError(WiaError, ValueError):
    """A report page cannot be made: the input is missing or is not a report or a
    sweep store, or the page cannot be written (one line naming the file)."""


@dataclass
class SweepData:
    """A sweep store's content: ``meta`` (the meta table) and ``points`` (one dict per
    row with the store's columns; ``params`` and ``metrics`` decoded from JSON,
    ``metrics`` ``None`` for a failed point), in order of ``finished_at``."""

    path: Path
    meta: dict[str, str]
    points: list[dict[str, Any]] = field(default_factory=list)

    def sweeps(self) -> dict[str, dict[str, Any]]:
        """Sweep name -> its description from ``meta`` (:func:`sweeps_in_meta`)."""
        return sweeps_in_meta(self.meta)


def read_sweep_store(path: str | os.PathLike[str]) -> SweepData:
    """Read a sweep store through :func:`wia_hw.sweep.open_store` (which checks its
    tables, format and columns). Raises :class:`ReportError` (one line, the store's
    own message) when ``path`` is missing or not a store."""
    from ..sweep import SweepError, open_store

    try:
        with open_store(path) as store:
            return SweepData(Path(path), store.meta, store.points())
    except SweepError as e:
        raise ReportError(str(e)) from None
    except (ValueError, sqlite3.Error) as e:  # a row's JSON, a locked or damaged file
        raise ReportError(f"{path}: cannot read the sweep store ({e})") from None


def load_source(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """``("run", dict)``, ``("profile", dict)`` or ``("sweep", SweepData)`` for the file
    at ``path``, detected from its content. Raises :class:`ReportError` (one line)
    for a missing file or one that is none of these."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except FileNotFoundError:
        raise ReportError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ReportError(f"{p}: is a directory, not {_WHAT}") from None
    except OSError as e:
        raise ReportError(f"cannot read {p}: {e.strerror}") from None
    if head == _SQLITE_MAGIC:
        return "sweep", read_sweep_store(p)
    try:
        d = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ReportError(f"{p}: not {_WHAT}: neither JSON nor SQLite") from None
    if not isinstance(d, dict):
        raise ReportError(f"{p}: not {_WHAT}: the JSON is a {type(d).__name__}, not an object")
    schema = d.get("schema")
    if schema == RUN_SCHEMA:
        return "run", d
    if schema == PROFILE_SCHEMA:
        return "profile", d
    raise ReportError(f"{p}: not {_WHAT}: JSON with schema {schema!r}")
