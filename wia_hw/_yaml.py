"""The one YAML reader of wia-hw: bounded, strict, with the line of every field.

Every YAML document the tool reads (device and cluster specs, extension manifests,
sweep files, ``--set``/``--arg`` values) goes through :func:`read_yaml_mapping` or
:func:`load_yaml_text`. They use PyYAML's safe machinery only (a subclass of
``yaml.SafeLoader``: plain data, no Python tags, nothing evaluated), compose the document
once and construct the data from that node tree, so the data and the line index agree.
A float written with an exponent and no dot (``1e-9``, ``6E2``) is a number, as in YAML
1.2 (PyYAML's YAML 1.1 would read it as a string, and a spec field would refuse it).
A base-60 number (``4:00``, ``1:30.5``) is a string, as in YAML 1.2 (PyYAML's YAML 1.1
would read 240 and 90.5), so a numeric field refuses it; with an explicit ``!!int`` or
``!!float`` tag it is refused outright.

Refused, each with one :class:`~wia_hw.SpecError` reading ``file:line: message``:

* a file larger than :data:`MAX_FILE_BYTES` (checked before it is read, and no more than
  that many bytes are ever read);
* bytes that are not UTF-8 (the error gives the line and the byte offset);
* characters YAML does not allow (control characters);
* a document whose node count, with every alias expanded, exceeds :data:`MAX_NODES`
  (the "billion laughs" bomb is refused while it is composed, before anything grows);
* a recursive alias (an alias inside the node it names, ``a: &r [*r]``);
* nesting deeper than :data:`MAX_DEPTH`;
* a duplicate key in one mapping (the error names the line of both);
* an integer literal of more than :data:`MAX_INT_DIGITS` digits;
* malformed YAML (the parser's message and line).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .emulator.errors import SpecError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_NODES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "line_index",
    "line_for",
    "load_yaml_text",
    "read_yaml_mapping",
]

#: Largest YAML file read (bytes): 1 MiB. The built-in specs and manifests are 0.4 to
#: 3 KB; a file 300 times larger than any of them is refused before it is read.
MAX_FILE_BYTES = 1 << 20
#: Most nodes (scalars, sequences, mappings; keys count) in one document, counted with
#: every alias expanded to the node it names. The built-in specs and manifests have 21
#: to 250; PyYAML composes some 25,000 nodes a second, so no document costs more than
#: about a second to read.
MAX_NODES = 20_000
#: Deepest nesting of sequences and mappings.
MAX_DEPTH = 100
#: Most digits in one integer literal (Python's own limit for ``int(str)`` is 4300).
MAX_INT_DIGITS = 100

_MERGE_TAG = "tag:yaml.org,2002:merge"
_FLOAT_TAG = "tag:yaml.org,2002:float"
#: A float written with an exponent and no dot (``1e-9``, ``5E3``): a number in YAML 1.2
#: and to every reader, a string in PyYAML's YAML 1.1 (which needs ``1.0e-9``)
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_INT_TAG = "tag:yaml.org,2002:int"


class _Refused(yaml.MarkedYAMLError):
    """A document refused by one of this module's bounds (not a syntax error)."""


class _BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts expanded nodes while composing and refuses
    recursive aliases, deep nesting, duplicate keys and over-long integers."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._count = 0  # nodes so far, aliases expanded
        self._depth = 0
        self._open: set[str] = set()  # anchors whose node is being composed
        self._sizes: dict[str, int] = {}  # anchor -> expanded size of its node

    def _add(self, n: int, mark: yaml.Mark) -> None:
        self._count += n
        if self._count > MAX_NODES:
            raise _Refused(
                None,
                None,
                f"document too large: more than {MAX_NODES:,} "
                "nodes with aliases expanded (an alias bomb?)",
                mark,
            )

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            anchor = event.anchor
            if anchor in self._open:
                raise _Refused(
                    None,
                    None,
                    f"recursive alias *{anchor} (it refers to the node that contains it)",
                    event.start_mark,
                )
            node = super().compose_node(parent, index)
            self._add(self._sizes.get(anchor, 1), event.start_mark)
            return node
        event = self.peek_event()
        anchor = event.anchor
        if self._depth >= MAX_DEPTH:
            raise _Refused(None, None, f"nesting deeper than {MAX_DEPTH} levels", event.start_mark)
        before = self._count
        if anchor is not None:
            self._open.add(anchor)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open.discard(anchor)
        self._add(1, event.start_mark)
        if anchor is not None:
            self._sizes[anchor] = self._count - before
        if isinstance(node, MappingNode):
            _check_duplicate_keys(node)
        elif (
            isinstance(node, ScalarNode)
            and node.tag == _INT_TAG
            and len(node.value) > MAX_INT_DIGITS
        ):
            raise _Refused(
                None,
                None,
                f"integer of {len(node.value)} characters (at most {MAX_INT_DIGITS})",
                node.start_mark,
            )
        return node


# after SafeLoader's own resolvers, so integers and dotted floats resolve as before
_BoundedSafeLoader.add_implicit_resolver(_FLOAT_TAG, _EXPONENT_FLOAT, list("-+0123456789"))

#: YAML 1.1's integers less its base-60 form (``1:30`` is 90 to PyYAML); YAML 1.2 has none
_INT = re.compile(
    r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+)$""",
    re.X,
)
#: YAML 1.1's floats less its base-60 form (``1:30.5`` is 90.5 to PyYAML)
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
# a base-60 number (``cores: 4:00``, ``--set compute.cores=1:30``) is a typo or a time
# to every reader but PyYAML, which reads 240 and 90: it reads as a string here (YAML
# 1.2's reading), so a numeric field refuses it with its usual type error
_SANS_BASE60 = {_INT_TAG: _INT, _FLOAT_TAG: _FLOAT}
_BoundedSafeLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx if rx is _EXPONENT_FLOAT else _SANS_BASE60.get(tag, rx)) for tag, rx in resolvers
    ]
    for first, resolvers in _BoundedSafeLoader.yaml_implicit_resolvers.items()
}


def _no_base60(base: Any) -> Any:
    """``base``, a constructor, refusing the base-60 form an explicit tag
    (``!!int 1:30``) would still give."""

    def construct(loader: SafeConstructor, node: Node) -> Any:
        if isinstance(node, ScalarNode) and ":" in str(node.value):
            raise _Refused(
                None,
                None,
                f"base-60 number {node.value!r} (YAML 1.1 only): write the value it means",
                node.start_mark,
            )
        return base(loader, node)

    return construct


_BoundedSafeLoader.add_constructor(_INT_TAG, _no_base60(SafeConstructor.construct_yaml_int))
_BoundedSafeLoader.add_constructor(_FLOAT_TAG, _no_base60(SafeConstructor.construct_yaml_float))


_KEYS = SafeConstructor()


def _key_value(node: Node) -> Any:
    """The constructed value of a scalar key (``1`` and ``0x1`` are the same key)."""
    try:
        value = _KEYS.construct_object(node)
        hash(value)
        return (type(value).__name__, value)
    except (yaml.YAMLError, TypeError, ValueError):
        return (node.tag, node.value)
    finally:
        _KEYS.constructed_objects.clear()


def _check_duplicate_keys(node: MappingNode) -> None:
    seen: dict[Any, int] = {}
    for key, _ in node.value:
        if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
            continue
        k = _key_value(key)
        line = key.start_mark.line + 1
        if k in seen:
            raise _Refused(
                None, None, f"duplicate key {key.value!r} (first at line {seen[k]})", key.start_mark
            )
        seen[k] = line


def line_index(
    node: yaml.Node | None, prefix: str = "", out: dict[str, int] | None = None
) -> dict[str, int]:
    """Map each dotted field path of a composed document to its 1-based line.

    Mapping keys give ``a.b``; sequence items give ``a.0``, ``a.1``, ...
    """
    out = {} if out is None else out
    if isinstance(node, MappingNode):
        for k, v in node.value:
            key = f"{prefix}.{k.value}" if prefix else str(k.value)
            out[key] = k.start_mark.line + 1
            line_index(v, key, out)
    elif isinstance(node, SequenceNode):
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


def _compose(text: str, display: str) -> tuple[Any, yaml.Node | None]:
    """(data, root node) of one YAML document; SpecError naming ``display`` otherwise."""
    loader = None
    try:
        loader = _BoundedSafeLoader(text)  # the reader checks characters here
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _Refused as e:
        mark = e.problem_mark
        raise SpecError(
            str(e.problem), file=display, line=mark.line + 1 if mark else None
        ) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise SpecError(
            f"character U+{e.character:04X} is not allowed in YAML ({e.reason}, "
            f"character offset {e.position})",
            file=display,
            line=line,
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = ", ".join(
            str(p) for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p
        )
        raise SpecError(
            f"malformed YAML: {problem or str(e).splitlines()[0]}",
            file=display,
            line=mark.line + 1 if mark else None,
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, node


def _decode(raw: bytes, display: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SpecError(
            f"not UTF-8: byte 0x{raw[e.start]:02x} at byte offset {e.start} ({e.reason})",
            file=display,
            line=line,
        ) from None
    return text.removeprefix("\ufeff")


def load_yaml_text(text: str, display: str) -> Any:
    """The data of a short YAML text (a ``--set`` value, say), with the bounds of
    :func:`read_yaml_mapping`; ``display`` names it in errors."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise SpecError(f"YAML text larger than {MAX_FILE_BYTES:,} bytes", file=display)
    return _compose(text, display)[0]


def read_yaml_mapping(path: Path, display: str, what: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Read a YAML file that must hold a mapping; returns (data, line index).

    ``display`` names the file in errors; ``what`` the kind of document ("a spec").
    Raises :class:`SpecError` (``file:line: message``) for every refusal listed in the
    module docstring.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise SpecError(
                    f"file is {size:,} bytes, larger than the maximum "
                    f"{MAX_FILE_BYTES:,} bytes (1 MiB) for YAML",
                    file=display,
                )
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", file=display) from None
    if len(raw) > MAX_FILE_BYTES:  # a pipe or device that stat cannot size
        raise SpecError(
            f"larger than the maximum {MAX_FILE_BYTES:,} bytes (1 MiB) for YAML", file=display
        )
    data, node = _compose(_decode(raw, display), display)
    if not isinstance(data, dict):
        raise SpecError(f"{what} must be a YAML mapping", file=display, line=1)
    return data, line_index(node)
