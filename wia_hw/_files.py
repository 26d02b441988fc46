"""Files that several processes update: a read-merge-write under a lock, written whole
or not at all.

Two tuning runs saving into one schedules or measurements file at once each read the
file, merged their entries and wrote it back through one fixed temporary name: one
writer's entries were lost (34 of 80 kept), a half-written file could be renamed into
place, and a reader could meet a file being truncated. :func:`update_locked` holds an
exclusive ``flock`` on a lock file beside the target for the whole read-merge-write,
writes into a temporary file of its own (named by process id) and renames it over the
target, so readers see the old file or the new one, never a part.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["update_locked", "write_atomic"]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s lock file (``.NAME.lock`` beside it) while the
    block runs; other processes taking it wait. Without ``fcntl`` (not POSIX), no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the rename still keeps files whole
        yield
        return
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file of this
    process beside it, then renamed over it (the temporary file is removed on any
    failure)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


def update_locked(path: str | os.PathLike[str], make_text: Callable[[], str]) -> Path:
    """Under an exclusive lock of ``path``, call ``make_text()`` (which reads the file's
    current contents and merges into them) and write what it returns with
    :func:`write_atomic`: concurrent updates of one file each see the other's result."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with _locked(p):
        return write_atomic(p, make_text())
