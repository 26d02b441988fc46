"""The user's Python call stack: the frames outside wia-hw that led to a call."""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any

__all__ = ["Frame", "user_stack", "is_library_file"]

_OWN = ("wia_hw",)


@dataclass(frozen=True)
class Frame:
    """One Python frame: ``file`` (as Python knows it), ``line``, ``function``."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"

    @property
    def short(self) -> str:
        """``basename:line`` (for flamegraph frames and tables)."""
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Frame:
        return cls(d["file"], int(d["line"]), d["function"])


_OWN_DIRS: tuple[str, ...] | None = None


def _own_dirs() -> tuple[str, ...]:
    """Directories of wia-hw's packages (they may live apart in an editable install)."""
    global _OWN_DIRS
    if _OWN_DIRS is None:
        dirs = []
        for mod in ("wia_hw", "wia_hw.emulator", "wia_hw.extensions", "wia_hw.rtl"):
            m = sys.modules.get(mod)
            f = getattr(m, "__file__", None)
            if f:
                dirs.append(os.path.dirname(os.path.realpath(f)) + os.sep)
        _OWN_DIRS = tuple(dirs)
    return _OWN_DIRS


def _own(frame: Any) -> bool:
    """A frame of wia-hw: a module of its packages, or a file in them (``python -m
    wia_hw.cli`` runs one as ``__main__``)."""
    name = frame.f_globals.get("__name__", "")
    if name == "wia_hw" or name.startswith("wia_hw."):
        return True
    f = frame.f_code.co_filename
    hit = _IS_OWN.get(f)
    if hit is None:
        real = os.path.realpath(f) if not f.startswith("<") else f
        hit = _IS_OWN[f] = any(real.startswith(d) for d in _own_dirs())
    return hit


_IS_OWN: dict[str, bool] = {}


def _library_dirs() -> tuple[str, ...]:
    """Directories of the standard library and of installed packages."""
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib", "scripts"):
        try:
            d = sysconfig.get_paths().get(key)
        except (KeyError, ValueError):  # pragma: no cover - odd installations
            d = None
        if d:
            dirs.add(os.path.realpath(d) + os.sep)
    for d in getattr(site, "getsitepackages", lambda: [])() + [site.getusersitepackages()]:
        dirs.add(os.path.realpath(d) + os.sep)
    return tuple(sorted(dirs, key=len, reverse=True))


_LIBS: tuple[str, ...] | None = None
_IS_LIB: dict[str, bool] = {}


def is_library_file(filename: str) -> bool:
    """Whether ``filename`` belongs to the standard library or an installed third-party
    package (under ``site-packages``/``dist-packages`` or a ``sysconfig`` library
    directory, console-script launchers included; frozen modules count as standard
    library). Cached per file name."""
    global _LIBS
    hit = _IS_LIB.get(filename)
    if hit is not None:
        return hit
    if _LIBS is None:
        _LIBS = _library_dirs()
    if filename.startswith("<frozen "):
        out = True
    elif filename.startswith("<"):
        out = False  # <stdin>, <string>: the user's code
    else:
        real = os.path.realpath(filename)
        parts = real.split(os.sep)
        out = (
            "site-packages" in parts
            or "dist-packages" in parts
            or any(real.startswith(d) for d in _LIBS)
        )
    _IS_LIB[filename] = out
    return out


def user_stack(limit: int = 16, *, keep_library_frames: bool = False) -> tuple[Frame, ...]:
    """The calling user code's frames, innermost first (at most ``limit``). Empty when
    wia-hw was not called from Python code outside it. Cheap: no source lines are read.

    By default frames of wia-hw itself (its CLI included) and of the standard library
    and installed third-party packages (``click``, ``pytest``, ...) are skipped, so a
    call made through the ``wia-hw`` command has no frames at all and a script's stack
    shows only the script. ``keep_library_frames=True`` keeps every frame above the
    innermost wia-hw call chain (the CLI's and the libraries' frames too).
    """
    f = sys._getframe(1)
    while f is not None and not _own(f):  # frames of the caller of this helper
        f = f.f_back
    while f is not None and _own(f):
        f = f.f_back
    out = []
    while f is not None and len(out) < limit:
        if keep_library_frames or not (_own(f) or is_library_file(f.f_code.co_filename)):
            out.append(Frame(f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return tuple(out)
