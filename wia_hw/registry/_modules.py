"""An extension's Python module: checking its operations' ``impl`` without running it,
and loading it when the extension is registered.

An ``impl`` is the name of a function defined in the extension's own module (the
module of the built-in package, the entry point's module, or ``<module>.py`` beside the
manifest) or ``"entry-point:NAME"`` (an installed entry point of the
:data:`OPERATION_ENTRY_POINT_GROUP` group). References that point anywhere else are
refused with a :class:`~wia_hw.SpecError` naming the manifest, line and field.

Two steps, so that validating a manifest runs nothing:

* :func:`check_impl` (loading and validating a manifest: ``load_extension``,
  ``wia-hw ext validate``/``show``/``list``) reads the module's source with :mod:`ast`
  and checks that the ``impl`` is a function defined at the top level of the module
  (a ``def``, not an import or an assignment). Nothing is imported or executed.
* :func:`resolve_impl` (``register_device_extension``, ``wia-hw ext register``,
  ``wia-hw run --ext``, ``DeviceExtension.implementation``) imports the module and
  checks the function object again.
"""

from __future__ import annotations

import ast
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

__all__ = [
    "IDENTIFIER",
    "OPERATION_ENTRY_POINT_GROUP",
    "MAX_MODULE_BYTES",
    "builtin_dir",
    "check_impl",
    "entry_points",
    "load_module",
    "module_functions",
    "resolve_impl",
]

#: Entry-point group of operation implementations (``impl: "entry-point:NAME"``).
OPERATION_ENTRY_POINT_GROUP = "wia_hw.operations"
#: What an extension id, an operation name, a parameter or an ``impl`` must look like.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Largest extension module read for the static check (bytes).
MAX_MODULE_BYTES = 4 << 20

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
        raise ext.error("module", "an extension built in Python gives its functions directly")
    file = src.parent / f"{ext.module}.py"
    if not file.is_file():
        raise ext.error("module", f"no module {file.name} beside the manifest")
    name = f"wia_hw_ext_{ext.id}_{ext.module}"
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__file__", None) == str(file):
        return mod
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always loads
        raise ext.error("module", f"cannot load {file}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[name]
        raise ext.error(
            "module", f"importing {file.name} failed: {type(e).__name__}: {e}"
        ) from None
    return mod


def entry_points(group: str) -> list[metadata.EntryPoint]:
    """Installed entry points of ``group`` (a seam for tests)."""
    return list(metadata.entry_points(group=group))


def _module_file(ext: DeviceExtension) -> Path:
    """The source file of the extension's module (built-in package or beside the
    manifest), without importing it."""
    if ext.module is None:
        raise ext.error("module", "the extension has no module")
    src = ext.source
    if src is None:
        raise ext.error("module", "an extension built in Python gives its functions directly")
    file = src.parent / f"{ext.module}.py"
    if not file.is_file():
        raise ext.error("module", f"no module {file.name} beside the manifest")
    return file


def module_functions(ext: DeviceExtension) -> dict[str, str]:
    """What each top-level name of the extension's module is, read from its source
    with :mod:`ast` (nothing is imported): ``"function"`` for a ``def`` (decorated or
    not, async or not), otherwise a phrase such as ``"imported from os"``,
    ``"assigned"`` or ``"a class"``; the last top-level binding of a name wins. Names
    bound only inside ``if``/``try`` blocks are absent."""
    file = _module_file(ext)
    try:
        with open(file, "rb") as f:
            raw = f.read(MAX_MODULE_BYTES + 1)
    except OSError as e:
        raise ext.error("module", f"cannot read {file.name}: {e.strerror}") from None
    if len(raw) > MAX_MODULE_BYTES:
        raise ext.error("module", f"{file.name} is larger than {MAX_MODULE_BYTES:,} bytes")
    try:
        tree = ast.parse(raw, filename=file.name)
    except SyntaxError as e:
        raise ext.error("module", f"{file.name}:{e.lineno}: does not parse: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise ext.error("module", f"{file.name} does not parse: {type(e).__name__}: {e}") from None
    kinds: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kinds[node.name] = "function"
        elif isinstance(node, ast.ClassDef):
            kinds[node.name] = "a class"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            src = node.module if isinstance(node, ast.ImportFrom) else None
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                kinds[name] = f"imported from {src or a.name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        kinds[n.id] = "assigned"
    return kinds


def _check_reference(ext: DeviceExtension, op: Operation) -> str | None:
    """The checks common to both steps: ``None`` for a callable or an entry point, else
    the function name the reference must resolve to in the module."""
    f = f"operations.{op.index}.impl"
    ref = op.impl
    if callable(ref):
        return None
    if not isinstance(ref, str):
        raise ext.error(f, f"operation {op.name!r} has no implementation")
    if ref.startswith("entry-point:"):
        name = ref.split(":", 1)[1]
        if not any(e.name == name for e in entry_points(OPERATION_ENTRY_POINT_GROUP)):
            raise ext.error(
                f, f"no installed entry point {name!r} in group {OPERATION_ENTRY_POINT_GROUP!r}"
            )
        return None
    if not IDENTIFIER.match(ref):
        raise ext.error(
            f,
            f"implementation reference {ref!r} points outside the "
            f"extension's module: give the name of a function defined in "
            f"{ext.module or 'its module'}.py (no dots, no module paths), or "
            f"'entry-point:NAME'",
        )
    return ref


def check_impl(ext: DeviceExtension, op: Operation) -> None:
    """Check ``op.impl`` without importing or running anything: an entry point must be
    installed; a name must be a function defined at the top level of the extension's
    module (read with :mod:`ast`). An extension whose module is already imported (an
    entry-point extension) is checked on the module object. Raises
    :class:`~wia_hw.SpecError` naming the manifest, the line and the field."""
    ref = _check_reference(ext, op)
    if ref is None:
        return
    if ext.module_obj is not None:
        resolve_impl(ext, op)
        return
    kinds = module_functions(ext)
    f = f"operations.{op.index}.impl"
    what = kinds.get(ref)
    if what is None:
        raise ext.error(f, f"module {ext.module}.py has no function {ref!r}")
    if what != "function":
        raise ext.error(
            f,
            f"implementation reference {ref!r} points outside the "
            f"extension's module: {ref!r} in {ext.module}.py is not a function "
            f"defined there (it is {what})",
        )


def resolve_impl(ext: DeviceExtension, op: Operation) -> Callable[..., Any]:
    """The function of ``op.impl``, importing the extension's module (or loading the
    entry point) if needed: the step that runs the extension's code. Raises
    :class:`~wia_hw.SpecError` like :func:`check_impl`, and when the import fails."""
    f = f"operations.{op.index}.impl"
    ref = op.impl
    if callable(ref):
        return ref
    name = _check_reference(ext, op)
    if name is None:  # an installed entry point
        ep_name = str(ref).split(":", 1)[1]
        eps = [e for e in entry_points(OPERATION_ENTRY_POINT_GROUP) if e.name == ep_name]
        try:
            fn = eps[0].load()
        except Exception as e:
            raise ext.error(
                f,
                f"entry point {ep_name!r} ({eps[0].value}) failed to load: {type(e).__name__}: {e}",
            ) from None
        if not callable(fn):
            raise ext.error(f, f"entry point {ep_name!r} is not callable")
        return fn
    ref = name
    mod = load_module(ext)
    fn = getattr(mod, ref, None)
    if fn is None:
        raise ext.error(f, f"module {mod.__name__} has no function {ref!r}")
    if not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
        raise ext.error(
            f,
            f"implementation reference {ref!r} points outside the "
            f"extension's module: {ref!r} in {mod.__name__} is not a function "
            f"defined there (it comes from "
            f"{getattr(fn, '__module__', None) or type(fn).__name__})",
        )
    return fn
