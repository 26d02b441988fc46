"""Loading an extension's Python module and resolving its operations' ``impl``.

An ``impl`` is the name of a function defined in the extension's own module (the
module of the built-in package, the entry point's module, or ``<module>.py`` beside the
manifest) or ``"entry-point:NAME"`` (an installed entry point of the
:data:`OPERATION_ENTRY_POINT_GROUP` group). References that point anywhere else are
refused with a :class:`~wia_hw.SpecError` naming the manifest, line and field.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from importlib import metadata, resources
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._manifest import DeviceExtension, Operation

__all__ = ["IDENTIFIER", "OPERATION_ENTRY_POINT_GROUP", "builtin_dir", "entry_points",
           "load_module", "resolve_impl"]

#: Entry-point group of operation implementations (``impl: "entry-point:NAME"``).
OPERATION_ENTRY_POINT_GROUP = "wia_hw.operations"
#: What an extension id, an operation name, a parameter or an ``impl`` must look like.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_BUILTIN_PACKAGE = "wia_hw.extensions"


def builtin_dir() -> Path:
    return Path(str(resources.files(_BUILTIN_PACKAGE)))


def load_module(ext: DeviceExtension) -> ModuleType:
    """The extension's own module: a module of the built-in package, the entry point's
    module, or ``<module>.py`` beside the manifest (loaded under a private name)."""
    if ext.module_obj is not None:
        return ext.module_obj
    if ext.module is None:
        raise ext.error("module", "the extension has no module")
    src = ext.source
    if src is not None and src.parent.resolve() == builtin_dir().resolve():
        return importlib.import_module(f"{_BUILTIN_PACKAGE}.{ext.module}")
    if src is None:
        raise ext.error("module", "an extension built in Python gives its functions "
                        "directly")
    file = src.parent / f"{ext.module}.py"
    if not file.is_file():
        raise ext.error("module", f"no module {file.name} beside the manifest")
    name = f"wia_hw_ext_{ext.id}_{ext.module}"
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == str(file):
        return mod
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:   # pragma: no cover - a .py file always loads
        raise ext.error("module", f"cannot load {file}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[name]
        raise ext.error("module", f"importing {file.name} failed: {type(e).__name__}: "
                        f"{e}") from None
    return mod


def entry_points(group: str) -> list[metadata.EntryPoint]:
    """Installed entry points of ``group`` (a seam for tests)."""
    return list(metadata.entry_points(group=group))


def resolve_impl(ext: DeviceExtension, op: Operation) -> Callable[..., Any]:
    f = f"operations.{op.index}.impl"
    ref = op.impl
    if callable(ref):
        return ref
    if not isinstance(ref, str):
        raise ext.error(f, f"operation {op.name!r} has no implementation")
    if ref.startswith("entry-point:"):
        name = ref.split(":", 1)[1]
        eps = [e for e in entry_points(OPERATION_ENTRY_POINT_GROUP) if e.name == name]
        if not eps:
            raise ext.error(f, f"no installed entry point {name!r} in group "
                            f"{OPERATION_ENTRY_POINT_GROUP!r}")
        fn = eps[0].load()
        if not callable(fn):
            raise ext.error(f, f"entry point {name!r} is not callable")
        return fn
    if not IDENTIFIER.match(ref):
        raise ext.error(f, f"implementation reference {ref!r} points outside the "
                        f"extension's module: give the name of a function defined in "
                        f"{ext.module or 'its module'}.py (no dots, no module paths), or "
                        f"'entry-point:NAME'")
    mod = load_module(ext)
    fn = getattr(mod, ref, None)
    if fn is None:
        raise ext.error(f, f"module {mod.__name__} has no function {ref!r}")
    if not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
        raise ext.error(f, f"implementation reference {ref!r} points outside the "
                        f"extension's module: {ref!r} in {mod.__name__} is not a function "
                        f"defined there (it comes from "
                        f"{getattr(fn, '__module__', None) or type(fn).__name__})")
    return fn
