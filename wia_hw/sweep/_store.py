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
    CREATE TABLE members(sweep_name TEXT, definition TEXT, point_key TEXT,
                         PRIMARY KEY(sweep_name, definition, point_key))

``meta`` holds ``format``, ``wia_hw_version`` (of the store's creator), ``created_at``,
and per sweep run into it ``sweep:<name>``: JSON of the file, base spec, sampler,
parameters, workloads, metrics and ``definition`` (the hash of the sweep's point keys,
the base spec's content, the metrics, the workloads and the wia-hw version).
``members`` says which points belong to which definition of which sweep: points are shared by ``point_key`` between
sweeps (``sweep_name`` is the sweep that computed the row first), and a sweep's rows are
those of its current definition (rows of an earlier one are kept, *superseded*). A
store without ``members`` rows for a sweep (written before they existed) falls back to
``sweep_name``. Each finished point is written in its own
transaction (``synchronous=FULL``), so a killed sweep loses no finished point. SQLite
errors (a damaged file, a lock held past :data:`BUSY_TIMEOUT_S`) are one-line
:class:`SweepError` naming the file and what failed.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import re
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from .._version import __version__
from ..emulator.errors import WiaError

__all__ = ["STORE_FORMAT", "SweepError", "SweepStore", "open_store"]

STORE_FORMAT = "wia-hw-sweep/1"

_MEMBERS = (
    "CREATE TABLE IF NOT EXISTS members(sweep_name TEXT, definition TEXT, point_key TEXT, "
    "PRIMARY KEY(sweep_name, definition, point_key))"
)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)",
    "CREATE TABLE IF NOT EXISTS points(point_key TEXT PRIMARY KEY, sweep_name TEXT, "
    "params TEXT, workload TEXT, metrics TEXT, status TEXT, error TEXT, wall_s REAL, "
    "finished_at TEXT)",
    _MEMBERS,
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


#: Seconds a store operation waits for another process's lock before giving up.
BUSY_TIMEOUT_S = 30

_F = TypeVar("_F", bound=Callable[..., Any])


def _sql_error(path: Path, what: str, e: sqlite3.Error) -> SweepError:
    """One line for SQLite refusing ``what`` on the store at ``path``: a lock another
    process held past :data:`BUSY_TIMEOUT_S` says so, anything else (a damaged file:
    ``database disk image is malformed``) gives SQLite's words."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "locked" in text or "busy" in text:
        return SweepError(
            f"{path}: cannot {what}: database is locked: another process holds it "
            f"(waited {BUSY_TIMEOUT_S:g} s)"
        )
    return SweepError(f"{path}: cannot {what} ({text})")


def _sql(what: str) -> Callable[[_F], _F]:
    """A store method whose SQLite errors (a damaged or locked file) become one-line
    :class:`SweepError` naming the file and ``what`` failed, not a traceback."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def guarded(self: SweepStore, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except sqlite3.Error as e:
                raise _sql_error(self.path, what, e) from None

        return guarded  # type: ignore[return-value]

    return wrap


# an integral float in a row's params JSON (``1.0``, ``1e+16``), not ``2.05``
_INTEGRAL_FLOAT = re.compile(r"\d\.0(?![0-9])|\de\+")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def sweeps_in_meta(meta: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Sweep name -> its description from a store's ``meta`` (``sweep:<name>`` keys,
    JSON); a value that is not a JSON object is kept as ``{"text": value}``."""
    out: dict[str, dict[str, Any]] = {}
    for k, v in sorted(meta.items()):
        if k.startswith("sweep:"):
            try:
                d = json.loads(v)
            except (TypeError, ValueError):
                d = None
            out[k[len("sweep:") :]] = d if isinstance(d, dict) else {"text": v}
    return out


class SweepStore:
    """An open sweep store. ``meta`` is the meta table as a dict; :meth:`points` lists
    the rows. Use :func:`open_store` to read one; :meth:`create` opens one for writing.
    """

    def __init__(self, path: str | os.PathLike[str], conn: sqlite3.Connection) -> None:
        self.path = Path(path)
        self._conn = conn

    # -- opening ---------------------------------------------------------------------
    @classmethod
    def _connect(cls, path: Path, *, read_only: bool = False) -> sqlite3.Connection:
        """A connection to ``path``; ``read_only`` opens a store this user cannot write
        (its folder or file not writable) for reading: ``mode=ro`` when its -wal file
        holds data (a sweep is writing it, or was killed: its newest rows are there, and
        ``immutable`` would ignore them, reading a partial store or none), else
        ``immutable`` (the file is whole, and ``mode=ro`` on a WAL store needs a -shm
        file, made in the folder, left behind owned by this user). SweepError when
        SQLite cannot open it; for the -wal case, saying why in one line."""
        wal = Path(f"{path}-wal")
        live = read_only and wal.is_file() and wal.stat().st_size > 0
        conn = None
        try:
            if read_only:
                mode = "mode=ro" if live else "mode=ro&immutable=1"
                uri = f"{path.resolve().as_uri()}?{mode}"
                conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
            else:
                conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S)
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            if live:  # SQLite opens the -wal and -shm files at the first read
                conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as e:
            if conn is not None:
                conn.close()
            if live and ("unable to open" in str(e) or "readonly" in str(e)):
                raise SweepError(
                    f"{path}: cannot read the store without write access: its newest rows "
                    f"are in {wal.name} (a sweep is writing it, or was stopped), which "
                    f"SQLite reads only with a {path.name}-shm file it cannot make in "
                    f"{path.parent} ({e}); open it as a user who can write there, or "
                    f"copy {path.name} and {wal.name} to a folder you can write"
                ) from None
            why = "read the store" if read_only else "open the store"
            raise _sql_error(path, why, e) from None
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
            if any(w in str(e) for w in ("locked", "busy", "malformed")):
                # a store that is locked or damaged, not some other file
                raise _sql_error(path, "read the store", e) from None
            if "readonly" in str(e):  # a store this user may read but not write
                raise SweepError(
                    f"{path}: cannot write to this sweep store ({e}); run the sweep with "
                    "--store naming a file you can write, or read it with sweep-report"
                ) from None
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
        writable = os.access(p, os.W_OK) and os.access(p.parent, os.W_OK)
        conn = cls._connect(p, read_only=not writable)
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
            with conn:  # a store made before the members table: add it
                conn.execute(_MEMBERS)
            cls(p, conn)._rekey_old_rows()  # points stored under pre-canonical keys
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
        except SweepError:
            conn.close()
            raise
        except sqlite3.Error as e:
            conn.close()
            raise _sql_error(p, "open the store", e) from None
        return cls(p, conn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SweepStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------
    @property
    @_sql("read its meta table")
    def meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    @_sql("read its sweeps")
    def sweeps(self) -> dict[str, dict[str, Any]]:
        """Sweep name -> its description from ``meta`` (:func:`sweeps_in_meta`), plus
        the names only found in the ``sweep_name`` column."""
        out = sweeps_in_meta(self.meta)
        for (n,) in self._conn.execute("SELECT DISTINCT sweep_name FROM points"):
            if n is not None:
                out.setdefault(n, {})
        return out

    def _has_members(self) -> bool:
        return (
            self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='members'"
            ).fetchone()
            is not None
        )

    def _member_keys(self, name: str, definition: str | None) -> set[str] | None:
        """The point keys of ``name``'s ``definition`` (every definition when None);
        None when the store records no membership for the sweep (an older store)."""
        if not self._has_members():
            return None
        sql, args = "SELECT point_key FROM members WHERE sweep_name = ?", (name,)
        if definition is not None:
            sql, args = sql + " AND definition = ?", (name, definition)
        keys = {r[0] for r in self._conn.execute(sql, args)}
        if keys or definition is None:
            return keys or None
        any_def = self._conn.execute(
            "SELECT 1 FROM members WHERE sweep_name = ? LIMIT 1", (name,)
        ).fetchone()
        return set() if any_def else None

    def _key_aliases(self, rows: Iterable[tuple[Any, ...]]) -> dict[str, str]:
        """Old point key -> today's, for rows written before point keys were canonical
        (wia-hw before numerically equal values were one point: ``clock_ghz: 1.0`` had
        another key than ``1``). ``rows`` start with (point_key, sweep_name, params,
        workload). A row's old key is recomputed from its params and workload and a
        sweep description in ``meta`` (base hash, metrics, workloads) under this or the
        store creator's wia-hw version; only a row whose stored key is that old key, and
        differs from the canonical one, is mapped."""
        from ._file import _label, has_integral_float, point_key

        meta = self.meta
        versions = list(dict.fromkeys([__version__, meta.get("wia_hw_version", __version__)]))
        by_label: dict[str, list[tuple[str, dict[str, Any], list[str], str]]] = {}
        for d in sweeps_in_meta(meta).values():
            base, metrics, workloads = d.get("base_hash"), d.get("metrics"), d.get("workloads")
            if not isinstance(base, str) or not isinstance(metrics, list):
                continue
            for w in workloads if isinstance(workloads, list) else ():
                if isinstance(w, list) and len(w) == 2 and isinstance(w[1], dict):
                    by_label.setdefault(_label(str(w[0]), w[1]), []).append(
                        (str(w[0]), w[1], metrics, base)
                    )
        out: dict[str, str] = {}
        for key, _, params_text, label in (r[:4] for r in rows):
            cands = by_label.get(label)
            if not cands or params_text is None:
                continue
            floats = bool(_INTEGRAL_FLOAT.search(params_text))
            if not floats and not any(has_integral_float(a) for _, a, _, _ in cands):
                continue
            params = json.loads(params_text)
            for w, a, metrics, base in cands:
                if not (floats or has_integral_float(a)):
                    continue
                for v in versions:
                    if point_key(params, w, a, metrics, base, v, canonical=False) == key:
                        new = point_key(params, w, a, metrics, base, v)
                        if new != key:
                            out[key] = new
                        break
        return out

    def _rekey_old_rows(self) -> None:
        """Give rows stored under an old point key (:meth:`_key_aliases`) today's key,
        in the points and members tables; a row whose point is also stored under
        today's key (computed again by a wia-hw that did not know the old key) is the
        same point and is dropped."""
        rows = self._conn.execute(
            "SELECT point_key, sweep_name, params, workload FROM points"
        ).fetchall()
        aliases = self._key_aliases(rows)
        if not aliases:
            return
        have = {r[0] for r in rows}
        with self._conn:
            for old, new in aliases.items():
                if new in have:
                    self._conn.execute("DELETE FROM points WHERE point_key = ?", (old,))
                else:
                    self._conn.execute(
                        "UPDATE points SET point_key = ? WHERE point_key = ?", (new, old)
                    )
                self._conn.execute(
                    "UPDATE OR IGNORE members SET point_key = ? WHERE point_key = ?", (new, old)
                )
                self._conn.execute("DELETE FROM members WHERE point_key = ?", (old,))

    @_sql("read its points")
    def points(
        self, sweep_name: str | None = None, *, superseded: bool = False
    ) -> list[dict[str, Any]]:
        """The rows of the current definition of ``sweep_name`` (of every sweep when
        None) as dicts with the columns above; ``params`` and ``metrics`` decoded from
        JSON; in order of ``finished_at``. A point another sweep computed is included
        when it belongs to this sweep's definition. ``superseded=True`` adds the rows
        of the sweep's earlier definitions (all rows when ``sweep_name`` is None).
        :class:`SweepError` naming the known sweeps when ``sweep_name`` is unknown."""
        sweeps = self.sweeps()
        if sweep_name is not None and sweep_name not in sweeps:
            known = ", ".join(sweeps) or "none"
            raise SweepError(f"{self.path}: no sweep {sweep_name!r} in the store (known: {known})")
        sql = f"SELECT {', '.join(_COLUMNS)} FROM points ORDER BY finished_at, point_key"
        rows = self._conn.execute(sql).fetchall()
        # rows under a pre-canonical key read as today's (and once, when both are stored)
        aliases = self._key_aliases(rows)
        if aliases:
            have = {r[0] for r in rows}
            rows = [
                r if r[0] not in aliases else (aliases[r[0]], *r[1:])
                for r in rows
                if aliases.get(r[0]) not in have
            ]
        if sweep_name is None and superseded:
            keep = None
        else:
            keep = set()
            for name in [sweep_name] if sweep_name is not None else list(sweeps):
                definition = None if superseded else sweeps[name].get("definition")
                keys = self._member_keys(name, definition)
                if keys is not None and aliases:
                    keys = {aliases.get(k, k) for k in keys}
                if keys is None or superseded:  # an older store: by the sweep_name column
                    keep |= {r[0] for r in rows if r[1] == name}
                keep |= keys or set()
        out = []
        for r in rows:
            if keep is not None and r[0] not in keep:
                continue
            d = dict(zip(_COLUMNS, r, strict=True))
            d["params"] = json.loads(d["params"]) if d["params"] is not None else {}
            d["metrics"] = json.loads(d["metrics"]) if d["metrics"] is not None else None
            out.append(d)
        return out

    def superseded(self, sweep_name: str | None = None) -> int:
        """How many rows :meth:`points` leaves out: rows of earlier definitions."""
        return len(self.points(sweep_name, superseded=True)) - len(self.points(sweep_name))

    @_sql("count its points")
    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM points").fetchone()[0])

    @_sql("look up its finished points")
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

    @_sql("look up its finished points")
    def finished_at(self, keys: Iterable[str]) -> dict[str, str]:
        """``finished_at`` (ISO 8601 UTC, to the microsecond) of each of ``keys`` that
        has a row."""
        want = list(keys)
        found: dict[str, str] = {}
        for i in range(0, len(want), 500):
            chunk = want[i : i + 500]
            q = ",".join("?" * len(chunk))
            found.update(
                self._conn.execute(
                    f"SELECT point_key, finished_at FROM points WHERE point_key IN ({q})", chunk
                ).fetchall()
            )
        return found

    # -- writing (the sweep's parent process only) -----------------------------------
    @_sql("write its meta table")
    def set_meta(self, key: str, value: str) -> None:
        with self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value)
            )

    @_sql("record the sweep's points")
    def add_members(self, sweep_name: str, definition: str, keys: Iterable[str]) -> None:
        """Record that the points ``keys`` belong to ``definition`` of ``sweep_name``."""
        with self._conn:
            self._conn.executemany(
                "INSERT OR IGNORE INTO members(sweep_name, definition, point_key) VALUES (?, ?, ?)",
                ((sweep_name, definition, k) for k in keys),
            )

    @_sql("store a finished point")
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
