"""Finding extensions by id: the built-in ones, user manifests in
:func:`extension_dirs`, and installed entry points of :data:`ENTRY_POINT_GROUP`.

Third-party packages register through the entry-point group ``wia_hw.extensions``: the
entry point names a module whose ``WIA_HW_MANIFEST`` attribute is the path of its YAML
manifest (relative to the module's file); its operations' ``impl`` resolve in that
module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from ..emulator.errors import SpecError
from . import _modules
from ._manifest import DeviceExtension, ExtensionId, from_data, read_manifest
from ._peaks import check_costs

__all__ = [
    "ENTRY_POINT_GROUP",
    "PATH_ENV",
    "extension_dirs",
    "find_extensions",
    "list_extensions",
    "load_extension",
]

#: Entry-point group through which installed packages provide extensions.
ENTRY_POINT_GROUP = "wia_hw.extensions"
#: Environment variable: extra directories (``os.pathsep``-separated) of user manifests.
PATH_ENV = "WIA_HW_EXTENSION_PATH"


def extension_dirs() -> list[Path]:
    """Directories searched for user manifests: ``$WIA_HW_EXTENSION_PATH``
    (``os.pathsep``-separated) or, when unset, ``$XDG_CONFIG_HOME/wia-hw/extensions``
    (``~/.config/wia-hw/extensions``). ``wia-hw ext register FILE`` installs there."""
    env = os.environ.get(PATH_ENV)
    if env is not None:
        return [Path(p) for p in env.split(os.pathsep) if p]
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return [Path(base) / "wia-hw" / "extensions"]


def find_extensions() -> dict[str, tuple[str, Path | metadata.EntryPoint]]:
    """Id -> (kind, where) for every extension :func:`load_extension` finds by name;
    kind is ``"builtin"``, ``"user"`` or ``"entry point"``."""
    found: dict[str, tuple[str, Path | metadata.EntryPoint]] = {}
    for p in sorted(_modules.builtin_dir().glob("*.yaml")):
        found[p.stem] = ("builtin", p)
    for d in extension_dirs():
        if d.is_dir():
            for p in sorted(d.glob("*.yaml")):
                found.setdefault(p.stem, ("user", p))
    for e in _modules.entry_points(ENTRY_POINT_GROUP):
        found.setdefault(e.name, ("entry point", e))
    return found


def list_extensions() -> list[str]:
    """Ids of the extensions that :func:`load_extension` finds by name: the built-in
    ones, manifests in :func:`extension_dirs`, and installed entry points."""
    return sorted(find_extensions())


def _load_entry_point(ep: metadata.EntryPoint, values: Mapping[str, Any] | None) -> DeviceExtension:
    try:
        mod = ep.load()
    except Exception as e:
        raise SpecError(
            f"entry point {ep.name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}"
        ) from None
    if not isinstance(mod, ModuleType):
        raise SpecError(f"entry point {ep.name!r} must name a module, got {ep.value!r}")
    rel = getattr(mod, "WIA_HW_MANIFEST", None)
    if rel is None or getattr(mod, "__file__", None) is None:
        raise SpecError(
            f"entry point {ep.name!r}: module {mod.__name__} has no "
            "WIA_HW_MANIFEST (the path of its YAML manifest)"
        )
    path = (Path(mod.__file__).parent / str(rel)).resolve()
    data, lines = read_manifest(path)
    return check_costs(from_data(data, lines, path, values, module_obj=mod))


def load_extension(
    source: str | os.PathLike[str] | ExtensionId, *, parameters: Mapping[str, Any] | None = None
) -> DeviceExtension:
    """Load and validate an extension: a path to a YAML manifest, or the id of a
    built-in, user-installed or entry-point extension (see :func:`list_extensions`).

    ``parameters`` overrides parameter values (checked against type and range). A
    YAML-only operation whose cost beats its unit's peak on a built-in device is refused
    (:func:`._peaks.check_costs`). Every problem raises :class:`SpecError` naming the
    file, the line and the field. Nothing in the extension's module runs.
    """
    if isinstance(source, ExtensionId):
        source = source.value
    text = os.fspath(source)
    p = Path(text)
    if p.suffix in (".yaml", ".yml") or os.sep in text or p.is_file():
        if not p.is_file():
            raise SpecError("no such extension manifest", file=text)
        data, lines = read_manifest(p)
        return check_costs(from_data(data, lines, p, parameters))
    found = find_extensions().get(text)
    if found is None:
        raise SpecError(
            f"unknown extension {text!r} (known: {', '.join(list_extensions())}"
            f"; or give the path of a .yaml manifest)"
        )
    kind, where = found
    if isinstance(where, Path):
        data, lines = read_manifest(where)
        return check_costs(from_data(data, lines, where, parameters))
    return _load_entry_point(where, parameters)
