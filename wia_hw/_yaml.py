"""Reading YAML documents with the line of every field, for file:line:field errors.

Data is read with ``yaml.safe_load`` only; the line index comes from ``yaml.compose``
with the safe loader. Nothing is ever evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .emulator.errors import SpecError

__all__ = ["line_index", "line_for", "read_yaml_mapping"]


def line_index(node: yaml.Node | None, prefix: str = "",
               out: dict[str, int] | None = None) -> dict[str, int]:
    """Map each dotted field path of a composed document to its 1-based line.

    Mapping keys give ``a.b``; sequence items give ``a.0``, ``a.1``, ...
    """
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = f"{prefix}.{k.value}" if prefix else str(k.value)
            out[key] = k.start_mark.line + 1
            line_index(v, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            key = f"{prefix}.{i}"
            out[key] = item.start_mark.line + 1
            line_index(item, key, out)
    return out


def line_for(field: str | None, lines: Mapping[str, int]) -> int | None:
    """The line of ``field`` or of its nearest enclosing field that has one."""
    if not field:
        return None
    parts = field.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in lines:
            return lines[key]
    return None


def read_yaml_mapping(path: Path, display: str, what: str) -> tuple[dict[str, Any],
                                                                    dict[str, int]]:
    """Read a YAML file that must hold a mapping; returns (data, line index).

    ``display`` names the file in errors; ``what`` the kind of document ("a spec").
    """
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", file=display) from None
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"malformed YAML: {problem}", file=display,
                        line=mark.line + 1 if mark else None) from None
    if not isinstance(data, dict):
        raise SpecError(f"{what} must be a YAML mapping", file=display, line=1)
    return data, line_index(node)
