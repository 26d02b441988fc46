"""Enums whose members also accept their name or value as a string, in any case.

The seed's C constants (``WIA_PROFILE_TRACE``) become enum members
(``ProfileMode.TRACE``) that configs may also spell ``"trace"``, ``"TRACE"`` or
``"Trace"``; ``-`` and ``_`` are interchangeable. A class may define ``_aliases()``
returning extra spellings mapped to values.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["NamedEnum", "StrNamedEnum"]


class NamedEnum(enum.Enum):
    """An enum that looks its members up by value or name, case-insensitively."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if isinstance(value, str):
            v = value.strip().lower().replace("-", "_")
            for m in cls:
                if (isinstance(m.value, str) and m.value.lower() == v) or m.name.lower() == v:
                    return m
            aliases = getattr(cls, "_aliases", None)
            if aliases is not None and v in aliases():
                return cls(aliases()[v])
        return None


class StrNamedEnum(str, NamedEnum):
    """A :class:`NamedEnum` whose members are also strings (``str(m)`` is the value)."""

    def __str__(self) -> str:
        return str(self.value)
