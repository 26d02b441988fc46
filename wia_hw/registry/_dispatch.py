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
from ..emulator.errors import SpecError, WiaError
from ..emulator.extension_kernels import CostedKernel
from ..emulator.kernels import GemmKernel, MemoryKernel, TiledKernel, VectorKernel
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


#: What a lowering may return: kernels of the emulator's own kinds.
KERNEL_TYPES = (GemmKernel, VectorKernel, TiledKernel, MemoryKernel, CostedKernel)


@dataclass
class _Entry:
    ext: str
    operation: str
    fn: Callable[[Op, Graph, DeviceSpec, Any], Any]
    explicit: bool
    #: Builds the error naming the operation's manifest, line and field (``None`` for
    #: a provider not registered through a manifest).
    error: Callable[[str], SpecError] | None = None


class _Dispatch:
    """The provider bound to one op kind (or name): tries the claiming operations in
    registration order; kernels are stamped with the extension that made them.

    An operation's lowering runs the extension's own code: what it returns is checked
    (``None`` to decline, else a list of the emulator's kernels, :data:`KERNEL_TYPES`)
    and an exception it raises (other than a :class:`WiaError`, which already names
    its fault) becomes a :class:`SpecError` naming the extension, the operation and the
    graph op, with the original chained, instead of a bare traceback."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []

    def __call__(self, op: Op, graph: Graph, spec: DeviceSpec, storage: Any) -> list[Any] | None:
        for e in self.entries:
            try:
                kernels = e.fn(op, graph, spec, storage)
            except WiaError:
                raise
            except Exception as exc:
                raise _failure(
                    e, op, f"raised {type(exc).__name__}: {_one_line(str(exc))}"
                ) from exc
            if kernels is None:
                continue
            if not isinstance(kernels, (list, tuple)) or not all(
                isinstance(k, KERNEL_TYPES) for k in kernels
            ):
                bad = (
                    kernels
                    if not isinstance(kernels, (list, tuple))
                    else next(k for k in kernels if not isinstance(k, KERNEL_TYPES))
                )
                what = "returned" if bad is kernels else "returned a list holding"
                raise _failure(
                    e,
                    op,
                    f"{what} {_one_line(repr(bad))[:60]} ({type(bad).__name__}); a "
                    "lowering returns a list of kernels ("
                    + ", ".join(t.__name__ for t in KERNEL_TYPES)
                    + ") or None to decline",
                )
            return [k if k.provider != "builtin" else replace(k, provider=e.ext) for k in kernels]
        return None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _failure(e: _Entry, op: Op, what: str) -> SpecError:
    """The error of operation ``e`` lowering graph op ``op``: ``what`` went wrong."""
    msg = (
        f"extension {e.ext!r} operation {e.operation!r}, lowering graph op "
        f"{op.name!r} ({op.kind}): {what}"
    )
    return e.error(msg) if e.error is not None else SpecError(msg)


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


def _error_of(ext: DeviceExtension, op: Operation) -> Callable[[str], SpecError]:
    field_ = f"operations.{op.index}.impl" if not op.yaml_only else f"operations.{op.index}"

    def error(message: str) -> SpecError:
        return ext.error(field_, message)

    return error


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

    The one registration it replaces is a direct call's (:func:`ensure_extension`: the
    extension without its graph claims, :attr:`DeviceExtension.direct`): after
    ``pim_execute(ctx, ...)``, ``register_device_extension(ctx, "pim", parameters=...)``
    registers the full manifest with those parameters.
    """
    if not isinstance(ext, DeviceExtension):
        ext = load_extension(ext, parameters=parameters)
    elif parameters:
        ext = ext.with_parameters(parameters)
    have = registered_extensions(ctx)
    prior = ctx.extensions.get(ext.id)
    replacing = isinstance(prior, DeviceExtension) and prior.direct
    if prior is not None and not replacing:
        raise ext.error(
            "extension_id", f"extension {ext.id!r} is already registered on this context"
        )
    have.pop(ext.id, None)
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
    if replacing:
        _drop(ctx, ext.id)
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
        disp.entries.append(_Entry(ext.id, o.name, fns[o.name], explicit, _error_of(ext, o)))
        # explicit claims are tried before implicit (fused-tail) ones
        disp.entries.sort(key=lambda e: not e.explicit)
        providers[key] = (disp.entries[0].ext, disp)
    ctx.extensions[ext.id] = ext
    return ext


def ensure_extension(
    ctx: Any, ext_id: ExtensionId | str, *, claims: bool = False
) -> DeviceExtension:
    """The extension ``ext_id`` on ``ctx`` for a direct call (what a seed call such as
    ``wia_pim_execute(ctx, ...)`` implies): the registered one, else its manifest
    registered *without* the operations that claim graph ops (``direct=True``), so a
    direct call (``pim_execute``, ``multi_head_attention``, ``photonic_matmul``,
    ``hybrid_matmul``) leaves later graph runs on the context unchanged and direct calls
    to units that claim the same op kinds share a context. Routing graph ops is asked
    for by registering the extension (:func:`register_device_extension`, which replaces
    such a registration).

    ``claims=True`` asks for the graph claims too: the full manifest is registered when
    the extension is absent or registered by a direct call (keeping its parameters).
    """
    key = ext_id.value if isinstance(ext_id, ExtensionId) else str(ext_id)
    ext = ctx.extensions.get(key)
    if ext is None:
        full = load_extension(ext_id)
        if claims:
            return register_device_extension(ctx, full)
        direct = replace(
            full, operations=tuple(o for o in full.operations if not o.claims), direct=True
        )
        return register_device_extension(ctx, direct)
    if claims and isinstance(ext, DeviceExtension) and ext.direct:
        return register_device_extension(ctx, load_extension(ext_id, parameters=ext.values))
    return ext


def unregister_device_extension(ctx: Any, ext_id: str | ExtensionId) -> None:
    """Remove an extension (and every claim it made) from ``ctx``."""
    key_id = str(ext_id)
    if key_id not in ctx.extensions:
        raise WiaError(f"extension {key_id!r} is not registered on this context")
    del ctx.extensions[key_id]
    _drop(ctx, key_id)


def _drop(ctx: Any, key_id: str) -> None:
    """Remove every claim of extension ``key_id`` from ``ctx``'s provider table."""
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
