"""Finding extensions by id: the built-in ones, user manifests in
:func:`extension_dirs`, and installed entry points of :data:`ENTRY_POINT_GROUP`.

Third-party packages register through the entry-point group ``wia_hw.extensions``: the
entry point names a module whose ``WIA_HW_MANIFEST`` attribute is the path of its YAML
manifest (relative to the module's file); its operations' ``impl`` resolve in that
module.
"""

from __future__ import annotations

import functools
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
    "duplicate_extensions",
    "extension_dirs",
    "find_extensions",
    "manifest_id",
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


@functools.lru_cache(maxsize=256)
def _declared_id(path: str, mtime_ns: int, size: int) -> str | None:
    """The ``extension_id`` the manifest at ``path`` declares (cached per file
    version), or None when it cannot be read or declares no identifier."""
    try:
        data, _ = read_manifest(Path(path))
    except SpecError:
        return None
    ext_id = data.get("extension_id")
    return ext_id if isinstance(ext_id, str) and _modules.IDENTIFIER.match(ext_id) else None


def manifest_id(path: Path) -> str:
    """The id a manifest is found by: the ``extension_id`` it declares, or its file
    stem when it declares none that can be read (so that ``wia-hw ext list`` still
    shows a broken manifest, as invalid). Nothing is validated or run."""
    try:
        st = path.stat()
    except OSError:
        return path.stem
    return _declared_id(str(path), st.st_mtime_ns, st.st_size) or path.stem


def _scan() -> tuple[dict[str, tuple[str, Path | metadata.EntryPoint]], dict[str, list[Path]]]:
    """(id -> (kind, where), id -> manifests) of every extension found by id, and of
    every id that two or more user manifests declare. A built-in id always resolves to
    the built-in manifest; entry points come last, by name."""
    found: dict[str, tuple[str, Path | metadata.EntryPoint]] = {}
    dups: dict[str, list[Path]] = {}
    for p in sorted(_modules.builtin_dir().glob("*.yaml")):
        found[p.stem] = ("builtin", p)
    for d in extension_dirs():
        if d.is_dir():
            for p in sorted(d.glob("*.yaml")):
                ext_id = manifest_id(p)
                have = found.get(ext_id)
                if have is None:
                    found[ext_id] = ("user", p)
                elif have[0] == "user":
                    dups.setdefault(ext_id, [have[1]]).append(p)  # type: ignore[list-item]
    for e in _modules.entry_points(ENTRY_POINT_GROUP):
        found.setdefault(e.name, ("entry point", e))
    return found, dups


def find_extensions() -> dict[str, tuple[str, Path | metadata.EntryPoint]]:
    """Id -> (kind, where) for every extension :func:`load_extension` finds by name;
    kind is ``"builtin"``, ``"user"`` or ``"entry point"``. A user manifest is found by
    the ``extension_id`` it declares (not its file name); for an id that several user
    manifests declare (:func:`duplicate_extensions`) this holds the first, which
    :func:`load_extension` refuses to pick."""
    return _scan()[0]


def duplicate_extensions() -> dict[str, list[Path]]:
    """Id -> manifests, for every id that two or more user manifests (in
    :func:`extension_dirs`) declare."""
    return _scan()[1]


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
    everything, dups = _scan()
    if text in dups:
        files = dups[text]
        raise SpecError(
            f"extension id {text!r} is declared by {len(files)} manifests, "
            f"{', '.join(map(str, files[:-1]))} and {files[-1]}: remove or rename all but one"
        )
    found = everything.get(text)
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
