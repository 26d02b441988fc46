"""The extension registry: device extensions declared in YAML, registered on a context.

The data path of an extension, one module per step (each imports only the ones above
it):

* :mod:`._expr`: the restricted arithmetic language of cost expressions (parsed with
  :mod:`ast`, checked against a whitelist, never ``eval``-ed);
* :mod:`._modules`: an extension's Python module and the resolution of each
  operation's ``impl`` (a function defined in that module, or an entry point);
* :mod:`._manifest`: the manifest format (:class:`DeviceExtension`,
  :class:`Operation`, :class:`Parameter`, :class:`Capability`) and its validation, every
  problem a :class:`~wia_hw.SpecError` reading ``file:line: field: message``;
* :mod:`._chains`: chains of graph ops that a fused operation covers;
* :mod:`._peaks`: the peak of the unit a YAML-only operation runs on (MACs or bytes per
  cycle, inherited or declared lower) and the check that no tile's cost beats it;
* :mod:`._sources`: finding extensions by id (built-in, user directories, entry points)
  and :func:`load_extension` (validation: the module is read, never run);
* :mod:`._yaml_ops`: lowering of YAML-only operations (built-in primitives plus a cost
  expression per tile, checked against the peak);
* :mod:`._dispatch`: :func:`register_device_extension`, which binds each claim to the
  context's provider table that :func:`wia_hw.lowering.lower_op` consults.

Extensions (``wia_hw.extensions``) use only the names exported here.
"""

from __future__ import annotations

from ._chains import chain_head, consumers, match_chain
from ._dispatch import (
    ensure_extension,
    register_device_extension,
    registered_extensions,
    unregister_device_extension,
)
from ._expr import Expr, ExprError, compile_expr, evaluate_expr
from ._manifest import (
    PRIMITIVES,
    SCHEMA_VERSION,
    Capability,
    DeviceExtension,
    ExtensionId,
    Impl,
    Operation,
    Parameter,
    version_satisfies,
)
from ._modules import OPERATION_ENTRY_POINT_GROUP
from ._sources import (
    ENTRY_POINT_GROUP,
    PATH_ENV,
    duplicate_extensions,
    extension_dirs,
    find_extensions,
    list_extensions,
    load_extension,
    manifest_id,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "OPERATION_ENTRY_POINT_GROUP",
    "PATH_ENV",
    "PRIMITIVES",
    "SCHEMA_VERSION",
    "Capability",
    "DeviceExtension",
    "Expr",
    "ExprError",
    "ExtensionId",
    "Impl",
    "Operation",
    "Parameter",
    "chain_head",
    "compile_expr",
    "consumers",
    "duplicate_extensions",
    "ensure_extension",
    "evaluate_expr",
    "extension_dirs",
    "find_extensions",
    "list_extensions",
    "load_extension",
    "manifest_id",
    "match_chain",
    "register_device_extension",
    "registered_extensions",
    "unregister_device_extension",
    "version_satisfies",
]
