"""The user's Python call stack: the frames outside wia-hw that led to a call."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["Frame", "user_stack"]

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


def _own(frame: Any) -> bool:
    name = frame.f_globals.get("__name__", "")
    return name == "wia_hw" or name.startswith("wia_hw.")


def user_stack(limit: int = 16) -> tuple[Frame, ...]:
    """The calling user code's frames, innermost first: every frame above the outermost
    wia-hw frame of the current call (at most ``limit``). Empty when wia-hw was not
    called from Python code outside it. Cheap: no source lines are read."""
    f = sys._getframe(1)
    while f is not None and not _own(f):       # frames of the caller of this helper
        f = f.f_back
    while f is not None and _own(f):
        f = f.f_back
    out = []
    while f is not None and len(out) < limit:
        out.append(Frame(f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return tuple(out)
