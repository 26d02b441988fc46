"""Argument checks shared by the RTL constructors (errors show the bad value)."""

from __future__ import annotations

__all__ = ["check_choice", "check_int"]


def check_int(name: str, value: object, low: int, high: int) -> int:
    """Return ``value`` if it is an ``int`` in ``[low, high]``.

    Raises ``TypeError`` for a non-integer (``bool`` included) and ``ValueError`` for an
    integer outside the range; both messages name the parameter and show the value.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of the strings in ``choices``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {value!r}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value
