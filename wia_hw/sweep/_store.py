"""The sweep store: one SQLite file, WAL mode, one writer (the sweep's parent process).

Schema (``format`` = ``wia-hw-sweep/1``; readers such as ``wia-hw report`` rely on it)::

    CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)
    CREATE TABLE points(point_key TEXT PRIMARY KEY, sweep_name TEXT,
                        params TEXT,    -- JSON: dotted spec path -> value
                        workload TEXT,  -- label: name(arg=value, ...)
                        metrics TEXT,   -- JSON: metric -> number; NULL when failed
                        status TEXT,    -- 'ok' | 'failed'
                        error TEXT,     -- one line; NULL when ok
                        wall_s REAL,    -- seconds the worker spent on the point
                        finished_at TEXT)  -- ISO 8601 UTC

``meta`` holds ``format``, ``wia_hw_version`` (of the store's creator), ``created_at``,
and per sweep run into it ``sweep:<name>``: JSON of the file, base spec, sampler,
parameters, workloads and metrics. Each finished point is written in its own
transaction (``synchronous=FULL``), so a killed sweep loses no finished point.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._version import __version__
from ..emulator.errors import WiaError

__all__ = ["STORE_FORMAT", "SweepError", "SweepStore", "open_store"]

STORE_FORMAT = "wia-hw-sweep/1"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)",
    "CREATE TABLE IF NOT EXISTS points(point_key TEXT PRIMARY KEY, sweep_name TEXT, "
    "params TEXT, workload TEXT, metrics TEXT, status TEXT, error TEXT, wall_s REAL, "
    "finished_at TEXT)",
)
_COLUMNS = (
    "point_key",
    "sweep_name",
    "params",
    "workload",
    "metrics",
    "status",
    "error",
    "wall_s",
    "finished_at",
)


class SweepError(WiaError, ValueError):
    """A sweep cannot run or a store cannot be read (one line: what and where)."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


class SweepStore:
    """An open sweep store. ``meta`` is the meta table as a dict; :meth:`points` lists
    the rows. Use :func:`open_store` to read one; :meth:`create` opens one for writing.
    """

    def __init__(self, path: str | os.PathLike[str], conn: sqlite3.Connection) -> None:
        self.path = Path(path)
        self._conn = conn

    # -- opening ---------------------------------------------------------------------
    @classmethod
    def _connect(cls, path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), timeout=30)
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn

    @classmethod
    def _check(cls, path: Path, conn: sqlite3.Connection) -> None:
        try:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if "meta" not in tables or "points" not in tables:
                raise SweepError(
                    f"{path}: not a sweep store (no meta/points tables; "
                    f"a store's format is {STORE_FORMAT!r})"
                )
            row = conn.execute("SELECT value FROM meta WHERE key='format'").fetchone()
            cols = tuple(r[1] for r in conn.execute("PRAGMA table_info(points)"))
        except sqlite3.DatabaseError as e:
            raise SweepError(f"{path}: not a sweep store ({e})") from None
        if row is None or row[0] != STORE_FORMAT:
            found = row[0] if row else None
            raise SweepError(
                f"{path}: not a sweep store (format {found!r}, expected {STORE_FORMAT!r})"
            )
        if cols != _COLUMNS:
            raise SweepError(f"{path}: not a sweep store (points columns {', '.join(cols)})")

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> SweepStore:
        """An existing store; SweepError when the file is missing or not a store."""
        p = Path(path)
        if not p.is_file():
            raise SweepError(f"{p}: no such sweep store")
        conn = cls._connect(p)
        try:
            cls._check(p, conn)
        except SweepError:
            conn.close()
            raise
        return cls(p, conn)

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> SweepStore:
        """Open ``path`` for writing, creating the store when the file does not exist.
        An existing file that is not a sweep store is refused, never overwritten."""
        p = Path(path)
        fresh = not p.exists() or p.stat().st_size == 0
        if p.exists() and not p.is_file():
            raise SweepError(f"{p}: not a sweep store (not a file)")
        if fresh and not p.parent.is_dir():
            raise SweepError(f"{p}: cannot create the store (no folder {p.parent})")
        conn = cls._connect(p)
        try:
            if fresh:
                conn.execute("PRAGMA journal_mode = WAL")
                with conn:
                    for stmt in _SCHEMA:
                        conn.execute(stmt)
                    conn.executemany(
                        "INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)",
                        [
                            ("format", STORE_FORMAT),
                            ("wia_hw_version", __version__),
                            ("created_at", _now()),
                        ],
                    )
            cls._check(p, conn)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
        except SweepError:
            conn.close()
            raise
        except sqlite3.DatabaseError as e:
            conn.close()
            raise SweepError(f"{p}: cannot open the store ({e})") from None
        return cls(p, conn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SweepStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def points(self, sweep_name: str | None = None) -> list[dict[str, Any]]:
        """Every row as a dict with the columns above; ``params`` and ``metrics``
        decoded from JSON. In order of ``finished_at``."""
        sql = f"SELECT {', '.join(_COLUMNS)} FROM points"
        args: tuple[Any, ...] = ()
        if sweep_name is not None:
            sql += " WHERE sweep_name = ?"
            args = (sweep_name,)
        rows = self._conn.execute(sql + " ORDER BY finished_at, point_key", args).fetchall()
        out = []
        for r in rows:
            d = dict(zip(_COLUMNS, r, strict=True))
            d["params"] = json.loads(d["params"]) if d["params"] is not None else {}
            d["metrics"] = json.loads(d["metrics"]) if d["metrics"] is not None else None
            out.append(d)
        return out

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM points").fetchone()[0])

    def finished_keys(self, keys: Iterable[str], *, include_failed: bool = True) -> set[str]:
        """The subset of ``keys`` that has a row (only ``ok`` rows without
        ``include_failed``)."""
        want = list(keys)
        found: set[str] = set()
        status = "" if include_failed else " AND status = 'ok'"
        for i in range(0, len(want), 500):
            chunk = want[i : i + 500]
            q = ",".join("?" * len(chunk))
            found.update(
                r[0]
                for r in self._conn.execute(
                    f"SELECT point_key FROM points WHERE point_key IN ({q}){status}", chunk
                )
            )
        return found

    # -- writing (the sweep's parent process only) -----------------------------------
    def set_meta(self, key: str, value: str) -> None:
        with self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value)
            )

    def record(
        self,
        *,
        point_key: str,
        sweep_name: str,
        params: dict[str, Any],
        workload: str,
        metrics: dict[str, Any] | None,
        status: str,
        error: str | None,
        wall_s: float,
    ) -> None:
        """Write one finished point in its own transaction (replacing a retried one)."""
        if status not in ("ok", "failed"):
            raise ValueError(f"status must be 'ok' or 'failed', got {status!r}")
        row = (
            point_key,
            sweep_name,
            json.dumps(params, sort_keys=True),
            workload,
            None if metrics is None else json.dumps(metrics, sort_keys=True),
            status,
            error,
            float(wall_s),
            _now(),
        )
        with self._conn:
            self._conn.execute(
                f"INSERT OR REPLACE INTO points({', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_COLUMNS))})",
                row,
            )


def open_store(path: str | os.PathLike[str]) -> SweepStore:
    """Open a sweep store to read it: ``store.meta`` (dict) and ``store.points()``
    (list of dicts). Raises :class:`SweepError` (one line) when ``path`` is missing or
    is not a sweep store."""
    return SweepStore.open(path)
