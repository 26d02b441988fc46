"""Loading device and cluster specs from YAML, with overrides by dotted path.

``load_spec("wia-npu")`` reads a built-in spec (shipped as package data), a path reads
a file. YAML is read by :mod:`wia_hw._yaml` (PyYAML's safe loader, bounded: file size,
node count with aliases expanded, nesting; strict UTF-8; duplicate keys refused), which
also gives the line of every field; nothing in a spec is evaluated. Every error is
a :class:`SpecError` reading ``file:line: field: message``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ._yaml import line_for, load_yaml_text, read_yaml_mapping
from .emulator.cluster import build_topology
from .emulator.config import ClusterSpec, DeviceSpec, from_mapping
from .emulator.errors import SpecError

__all__ = ["load_spec", "list_specs", "parse_override", "spec_path", "DEFAULT_DEVICE"]

DEFAULT_DEVICE = "wia-npu"


def _spec_dir() -> Any:
    return resources.files("wia_hw.specs")


def list_specs() -> list[str]:
    """Names of the built-in specs (``wia-npu``, ``wia-edge``, ``wia-cluster-8``, ...)."""
    return sorted(p.name[:-5] for p in _spec_dir().iterdir() if p.name.endswith(".yaml"))


def spec_path(name: str) -> Path | None:
    """The file of a built-in spec, or None."""
    p = _spec_dir() / f"{name}.yaml"
    return Path(str(p)) if p.is_file() else None


def parse_override(text: str) -> tuple[str, Any]:
    """``"compute.array.rows=64"`` -> ``("compute.array.rows", 64)`` (value read as YAML)."""
    if "=" not in text:
        raise SpecError(
            f"override {text!r} must read PATH=VALUE, e.g. compute.array.rows=64", field="--set"
        )
    path, _, raw = text.partition("=")
    path = path.strip()
    if not path:
        raise SpecError(f"override {text!r} has an empty path", field="--set")
    try:
        value = load_yaml_text(raw, "--set") if raw.strip() else ""
    except SpecError:
        value = raw
    return path, value


def _apply_override(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` in ``data``. A section the file leaves out (its fields all at their
    defaults, e.g. ``compute.control``) is created; validation then rejects a name that
    is no field at all, naming it."""
    parts = path.split(".")
    node: Any = data
    for i, p in enumerate(parts[:-1]):
        if isinstance(node, dict) and p not in node:
            node[p] = {}
        if not isinstance(node, dict) or not isinstance(node[p], dict):
            raise SpecError(
                f"override path does not exist ({'.'.join(parts[: i + 1])!r} is not a section)",
                file="override",
                field=path,
            )
        node = node[p]
    if not isinstance(node, dict) or parts[-1] not in node:
        # a field that has a default may be absent from the file: allow it, and let
        # validation reject names that are not fields at all
        if not isinstance(node, dict):
            raise SpecError("override path does not exist", file="override", field=path)
    node[parts[-1]] = value


def _read(source: str | Path) -> tuple[dict[str, Any], dict[str, int], str]:
    """(data, line index, display name) of a spec given by name or path."""
    p = Path(source)
    if p.suffix in (".yaml", ".yml") or p.exists() or "/" in str(source):
        if not p.is_file():
            raise SpecError(
                f"no such spec file (built-in specs: {', '.join(list_specs())})", file=str(source)
            )
        path, display = p, str(source)
    else:
        found = spec_path(str(source))
        if found is None:
            raise SpecError(
                f"unknown device spec {str(source)!r} (built-in: "
                f"{', '.join(list_specs())}; or give a path to a .yaml file)"
            )
        path, display = found, f"specs/{source}.yaml"
    data, lines = read_yaml_mapping(path, display, "a spec")
    return data, lines, display


def load_spec(
    spec: str | Path | DeviceSpec | ClusterSpec | Mapping[str, Any] = DEFAULT_DEVICE,
    overrides: Mapping[str, Any] | None = None,
) -> DeviceSpec | ClusterSpec:
    """Load and validate a device or cluster spec.

    ``spec`` is a built-in name (``"wia-npu"``), a path to a YAML file, a SCALE-Sim
    ``.cfg`` (:func:`wia_hw.scalesim.config_mapping` over ``wia-npu``), a mapping of
    the same form, or an already-built spec (then only ``overrides`` are applied).
    ``overrides`` maps dotted field paths to values (``{"compute.array.rows": 64}``) and
    is validated exactly like the file. A cluster spec's ``device`` may name a device
    spec; ``device.<field>`` overrides then reach into it.
    """
    lines: dict[str, int] = {}
    # a cluster's device read from its own file: (display, line index) of that file
    device_file: tuple[str, dict[str, int]] | None = None
    if isinstance(spec, (DeviceSpec, ClusterSpec)):
        from .emulator.config import to_mapping

        data, display = to_mapping(spec), spec.name
    elif isinstance(spec, Mapping):
        data, display = copy.deepcopy(dict(spec)), "<mapping>"
    elif str(spec).lower().endswith(".cfg"):  # a SCALE-Sim configuration
        from ._scalesim_cfg import scalesim_config_mapping

        base = load_spec(DEFAULT_DEVICE)
        data, display = scalesim_config_mapping(spec, base), str(spec)
    else:
        data, lines, display = _read(spec)

    is_cluster = "devices" in data or "links" in data
    if is_cluster and isinstance(data.get("device"), str):
        # a relative path is read next to the cluster file first, then as given (from
        # the current directory, or a built-in name)
        ref = data["device"]
        here = None
        if isinstance(spec, (str, Path)) and Path(spec).is_file():
            here = Path(spec).parent / ref
        try:
            sub, sub_lines, sub_display = _read(
                here if here is not None and here.is_file() else ref
            )
        except SpecError as e:
            raise SpecError(
                f"cluster device {ref!r}: {e.message}",
                file=display,
                line=lines.get("device"),
                field="device",
            ) from None
        if "devices" in sub or "links" in sub:
            raise SpecError(
                f"{ref!r} is itself a cluster spec; a cluster's device must be a device "
                "spec (e.g. wia-npu)",
                file=display,
                line=lines.get("device"),
                field="device",
            )
        data = dict(data, device=sub)
        device_file = (sub_display, sub_lines)
    for path, value in (overrides or {}).items():
        _apply_override(data, str(path), value)
        lines.pop(str(path), None)
    try:
        out = from_mapping(ClusterSpec if is_cluster else DeviceSpec, data)
        if is_cluster:
            build_topology(out)  # links name existing devices, graph connected
        return out
    except SpecError as e:
        overridden = e.field is not None and any(
            e.field == p or e.field.startswith(f"{p}.") or str(p).startswith(f"{e.field}.")
            for p in (overrides or {})
        )
        if overridden:
            raise SpecError(e.message, file="override", field=e.field) from None
        # a check across fields that an override broke: say which overrides were applied
        msg = e.message
        if overrides:
            msg += " (with override " + ", ".join(f"{p}={v}" for p, v in overrides.items()) + ")"
        if device_file is not None and e.field is not None and e.field.startswith("device."):
            # a field of the device file the cluster names: that file's line and field
            sub_display, sub_lines = device_file
            field = e.field.removeprefix("device.")
            raise SpecError(
                f"{msg} (device of {display})",
                file=sub_display,
                line=line_for(field, sub_lines),
                field=field,
            ) from None
        raise SpecError(msg, file=display, line=line_for(e.field, lines), field=e.field) from None
