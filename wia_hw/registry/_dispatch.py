"""Registering extensions on a context: every claim of an operation becomes a provider
of the graph op kind (or op name) it claims, consulted by
:func:`wia_hw.lowering.lower_op`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..emulator.config import DeviceSpec
from ..emulator.errors import WiaError
from ..graph import Graph, Op
from ._manifest import DeviceExtension, ExtensionId, Operation
from ._modules import resolve_impl
from ._sources import load_extension
from ._yaml_ops import yaml_operation_provider

__all__ = [
    "register_device_extension",
    "unregister_device_extension",
    "registered_extensions",
    "ensure_extension",
]


@dataclass
class _Entry:
    ext: str
    operation: str
    fn: Callable[[Op, Graph, DeviceSpec, Any], Any]
    explicit: bool


class _Dispatch:
    """The provider bound to one op kind (or name): tries the claiming operations in
    registration order; kernels are stamped with the extension that made them."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []

    def __call__(self, op: Op, graph: Graph, spec: DeviceSpec, storage: Any) -> list[Any] | None:
        for e in self.entries:
            kernels = e.fn(op, graph, spec, storage)
            if kernels is not None:
                return [
                    k
                    if getattr(k, "provider", "builtin") != "builtin"
                    else replace(k, provider=e.ext)
                    for k in kernels
                ]
        return None


def registered_extensions(ctx: Any) -> dict[str, DeviceExtension]:
    """The extensions registered on ``ctx``, by id."""
    return {k: v for k, v in ctx.extensions.items() if isinstance(v, DeviceExtension)}


def _bind(ext: DeviceExtension, op: Operation) -> Callable[[Op, Graph, DeviceSpec, Any], Any]:
    if op.yaml_only:
        return yaml_operation_provider(ext, op)
    fn = resolve_impl(ext, op)

    def provider(o: Op, graph: Graph, spec: DeviceSpec, storage: Any) -> Any:
        return fn(o, graph, spec, storage, ext)

    provider.__name__ = f"{ext.id}.{op.name}"
    return provider


def register_device_extension(
    ctx: Any,
    ext: DeviceExtension | str | os.PathLike[str],
    *,
    parameters: Mapping[str, Any] | None = None,
) -> DeviceExtension:
    """Register ``ext`` on the context ``ctx`` (the seed's
    ``wia_register_device_extension``): its operations become providers of the graph op
    kinds and names they claim (:func:`wia_hw.lowering.lower_op`), and
    ``ctx.extensions[id]`` holds it.

    ``ext`` may be a :class:`DeviceExtension`, a manifest path or an extension id.
    Raises :class:`SpecError` naming the manifest and field when the id is already
    registered, when an operation name is already registered by another extension, or
    when another extension already claims one of the op kinds or names it claims.
    Returns the registered extension (with ``parameters`` applied).
    """
    if not isinstance(ext, DeviceExtension):
        ext = load_extension(ext, parameters=parameters)
    elif parameters:
        ext = ext.with_parameters(parameters)
    have = registered_extensions(ctx)
    if ext.id in ctx.extensions:
        raise ext.error(
            "extension_id", f"extension {ext.id!r} is already registered on this context"
        )
    names = {o.name: e for e in have.values() for o in e.operations}
    for o in ext.operations:
        if o.name in names:
            other = names[o.name]
            raise ext.error(
                f"operations.{o.index}.name",
                f"operation {o.name!r} is already "
                f"registered by extension {other.id!r} ({other.file})",
            )
    bindings: list[tuple[str, Operation, bool]] = []
    for o in ext.operations:
        for c in o.claims:
            bindings.append((c, o, True))
        for kinds in o.chain_kinds()[1:]:
            for k in kinds:
                bindings.append((k, o, False))
    providers = ctx.providers
    for key, o, explicit in bindings:  # check every claim before changing anything
        if not explicit:
            continue
        cur = providers.get(key)
        if cur is None:
            continue
        owner, fn = cur
        holders = (
            [e for e in fn.entries if e.explicit and e.ext != ext.id]
            if isinstance(fn, _Dispatch)
            else [_Entry(owner, "?", fn, True)]
        )
        if holders:
            h = holders[0]
            j = o.claims.index(key)
            what = "op name" if "." in key else "op kind"
            by = f" (operation {h.operation!r})" if h.operation != "?" else ""
            raise ext.error(
                f"operations.{o.index}.claims.{j}",
                f"{what} {key!r} is already claimed by extension {h.ext!r}{by}; "
                "one op has one provider (unregister the other extension first)",
            )
    fns = {o.name: _bind(ext, o) for o in ext.operations if o.claims}
    for key, o, explicit in bindings:
        if o.name not in fns:
            continue
        cur = providers.get(key)
        if cur is not None and not isinstance(cur[1], _Dispatch):
            disp = _Dispatch()
            disp.entries.append(_Entry(cur[0], "?", cur[1], True))
        elif cur is not None:
            disp = cur[1]
        else:
            disp = _Dispatch()
        if any(e.ext == ext.id and e.operation == o.name for e in disp.entries):
            continue
        disp.entries.append(_Entry(ext.id, o.name, fns[o.name], explicit))
        # explicit claims are tried before implicit (fused-tail) ones
        disp.entries.sort(key=lambda e: not e.explicit)
        providers[key] = (disp.entries[0].ext, disp)
    ctx.extensions[ext.id] = ext
    return ext


def ensure_extension(ctx: Any, ext_id: ExtensionId | str) -> DeviceExtension:
    """The extension ``ext_id`` registered on ``ctx``, registering it first if needed
    (what a seed call such as ``wia_pim_execute(ctx, ...)`` implies)."""
    key = ext_id.value if isinstance(ext_id, ExtensionId) else str(ext_id)
    ext = ctx.extensions.get(key)
    if ext is None:
        ext = register_device_extension(ctx, load_extension(ext_id))
    return ext


def unregister_device_extension(ctx: Any, ext_id: str | ExtensionId) -> None:
    """Remove an extension (and every claim it made) from ``ctx``."""
    key_id = str(ext_id)
    if key_id not in ctx.extensions:
        raise WiaError(f"extension {key_id!r} is not registered on this context")
    del ctx.extensions[key_id]
    for key in list(ctx.providers):
        owner, fn = ctx.providers[key]
        if isinstance(fn, _Dispatch):
            fn.entries = [e for e in fn.entries if e.ext != key_id]
            if fn.entries:
                ctx.providers[key] = (fn.entries[0].ext, fn)
            else:
                del ctx.providers[key]
        elif owner == key_id:
            del ctx.providers[key]
