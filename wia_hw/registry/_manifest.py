"""The extension manifest: device extensions declared in YAML, validated.

The seed's ``wia_device_extension_t`` (``extension_id``, ``version``, ``capabilities``,
``operations``) is :class:`DeviceExtension`. An extension is a YAML manifest, optionally
beside a Python module::

    schema_version: 1
    extension_id: sparse_tensor_unit      # built-in ids are ExtensionId members
    version: "1.0"
    description: A 2:4 structured-sparse tensor unit
    requires: {wia_hw: ">=0.1, <1.0"}     # the range of wia-hw versions it works with
    module: sparse_unit                    # optional: sparse_unit.py beside this file
    capabilities: [structured_sparsity]    # Capability values
    parameters:                            # typed, with ranges and defaults
      tile: {type: int, default: 16, min: 1, max: 256, description: PE tile edge}
    operations:
      - name: sparse_linear_2_4            # unique among registered extensions
        claims: [linear, matmul]           # graph op kinds (or op names) it lowers
        compose: [matmul]                  # built-in primitives, in data-flow order
        cost:                              # per tile, restricted expressions
          cycles: "ceil(M/tile) * ceil(N/tile) * ceil(K/2) + 40"

An operation is either Python (``impl: function_name``: a function defined in the
extension's own module, or ``impl: "entry-point:NAME"``: an installed entry point of the
``wia_hw.operations`` group) or YAML alone (``compose`` + ``cost``). References that
point anywhere else are refused. The ``impl`` of an operation that claims graph ops is
its lowering function (see :data:`Impl`); one that claims nothing is reached directly
(``ext.implementation(name)``, e.g. ``pim_execute``).

**Lowering.** :func:`register_device_extension` binds every claim to the context's
``providers`` table, which :func:`wia_hw.lowering.lower_op` consults: the op is lowered
by the extension (its kernels carry ``provider=<extension id>`` into the run report),
or, when every claiming operation declines (returns ``None``), by the built-in lowering.

**Composition.** ``compose`` lists primitives in data-flow order: ``matmul`` (any GEMM
kind: ``linear``, ``matmul``, ``bmm``, ``conv2d``), ``elementwise`` (any unary or binary
kind), ``reduce`` (``softmax``, ``layer_norm``, ``global_avgpool``), ``copy``, ``gather``,
``pool``, or a graph op kind by name (``gelu``, ``softmax``, ...). A chain of several
primitives fuses a chain of graph ops in which each op's result is read only by the
next: the first op (the claimed one) gets the fused kernel, the others lower to nothing
and their intermediate results never reach memory. The tails are claimed implicitly,
without excluding another extension's claim on the same kind.

**Cost model** (YAML-only operations). Per tile of the built-in tiling (the array's
GEMM tiles for ``matmul``, the vector unit's row chunks otherwise): ``cycles``
(required, at least 1), ``macs`` (default: the MACs of the tile; at least those, or one
per output element for a ``structured_sparsity`` unit) and ``energy_pj`` (default: the
array's or vector unit's energy). Names an expression may read: the tile's ``B``,
``M``, ``N``, ``K`` and ``rate`` (the array's MACs per PE per cycle at the op's
precision) for matmul, ``ROWS``, ``COLS``, ``ELEMENTS`` otherwise, ``E`` (bytes per
input element), the extension's parameters and the device's ``array_rows``,
``array_cols``, ``cores``, ``lanes``, ``clock_ghz``. See :mod:`wia_hw.registry._expr`.
An optional ``peak`` (``macs_per_cycle`` on the array, ``bytes_per_cycle`` on the vector
unit) lowers the unit's peak, which no tile's cost may beat (:mod:`._peaks`).

**Built-in cost by reference.** ``cost: builtin`` (or ``cost: {builtin: gemm}`` /
``{builtin: vector}``, :data:`BUILTIN_COSTS`) reuses the emulator's own kernel timing
instead of expressions: each op of the chain is lowered by the built-in lowering and
the kernels are fused as :func:`wia_hw.apply_fusion` fuses them (a GEMM epilogue, one
vector pass; :mod:`wia_hw.optimize._kernels`), so ``compose: [matmul, gelu]`` with
``cost: builtin`` times exactly what the built-in fusion would, with no copied formula.
Where the built-in fusion does not apply (an epilogue whose vector work would not hide
behind the array), the chain's kernels run unfused, in order. The name must match the
unit ``compose`` starts on; an unknown name is refused in one line naming it.

**Errors.** Every problem in a manifest is a :class:`~wia_hw.SpecError` reading
``file:line: field: message``: an unknown capability, an incompatible version, a
parameter outside its range, an implementation reference outside the module, two
registered extensions claiming one op kind or one operation name, ...

Third-party packages register through the entry-point group ``wia_hw.extensions``: the
entry point names a module whose ``WIA_HW_MANIFEST`` attribute is the path of its YAML
manifest (relative to the module's file); its operations' ``impl`` resolve in that
module.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import keyword
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

from .._version import __version__
from .._yaml import line_for, read_yaml_mapping
from ..emulator.config import DeviceSpec
from ..emulator.enums import StrNamedEnum
from ..emulator.errors import SpecError
from ..graph import BINARY_KINDS, GEMM_KINDS, OP_KINDS, UNARY_KINDS, Graph, Op
from ._expr import Expr, ExprError, compile_expr
from ._modules import IDENTIFIER as _IDENT
from ._modules import check_impl, resolve_impl

__all__ = [
    "ExtensionId",
    "Capability",
    "Parameter",
    "Operation",
    "DeviceExtension",
    "Impl",
    "PRIMITIVES",
    "PEAK_KEYS",
    "BUILTIN_COSTS",
    "SCHEMA_VERSION",
    "from_data",
    "read_manifest",
    "version_satisfies",
]

SCHEMA_VERSION = 1


_StrEnum = StrNamedEnum


class ExtensionId(_StrEnum):
    """Ids of the built-in extensions (the seed's ``WIA_EXT_*``). A third-party
    extension may use any other identifier; its id is then a plain string."""

    TRANSFORMER_ENGINE = "transformer_engine"
    PIM = "pim"
    PHOTONIC = "photonic"
    ANALOG = "analog"


class Capability(_StrEnum):
    """What an extension's unit can do (the seed's ``WIA_CAP_*``).

    Seed 8.9.1-8.9.3 names these units: transformer engines, graph and sparse tensor
    units, video units, near-memory processing, photonic and analog cores.
    """

    FUSED_ATTENTION = "fused_attention"
    FAST_SOFTMAX = "fast_softmax"
    SPARSE_ATTENTION = "sparse_attention"
    FLASH_ATTENTION = "flash_attention"
    STRUCTURED_SPARSITY = "structured_sparsity"
    GRAPH_PROCESSING = "graph_processing"
    VIDEO_PROCESSING = "video_processing"
    PIM_ELEMENTWISE = "pim_elementwise"
    PIM_KERNELS = "pim_kernels"
    PIM_OFFLOAD = "pim_offload"
    PHOTONIC_MATMUL = "photonic_matmul"
    WAVELENGTH_MULTIPLEXING = "wavelength_multiplexing"
    ANALOG_MATMUL = "analog_matmul"
    NOISE_COMPENSATION = "noise_compensation"


#: Primitive families of ``compose`` and the graph op kinds each stands for.
PRIMITIVES: dict[str, tuple[str, ...]] = {
    "matmul": GEMM_KINDS,
    "elementwise": tuple(UNARY_KINDS) + tuple(BINARY_KINDS) + ("where", "cumsum"),
    "reduce": ("softmax", "layer_norm", "global_avgpool"),
    "copy": ("transpose", "concat", "slice"),
    "gather": ("embedding",),
    "pool": ("maxpool", "avgpool", "global_avgpool", "col2im", "resize"),
}
_PARAM_TYPES = {"int": int, "float": float, "bool": bool, "str": str}
_VERSION = re.compile(r"^\d+(\.\d+){0,3}$")
_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+){0,3})\s*$")
_MATMUL_NAMES = ("B", "M", "N", "K", "E", "rate")
_VECTOR_NAMES = ("ROWS", "COLS", "ELEMENTS", "E")
_DEVICE_NAMES = ("array_rows", "array_cols", "cores", "lanes", "clock_ghz")
_COST_KEYS = ("cycles", "macs", "energy_pj")
#: The emulator's own kernel models a YAML-only operation may reuse by reference
#: (``cost: builtin`` or ``cost: {builtin: NAME}``), and whether each times the array
#: (``gemm``: the systolic array's GEMM tiles) or the vector unit (``vector``).
BUILTIN_COSTS = {"gemm": True, "vector": False}
_TOP_KEYS = (
    "schema_version",
    "extension_id",
    "version",
    "description",
    "requires",
    "module",
    "capabilities",
    "parameters",
    "operations",
)
_OP_KEYS = ("name", "description", "impl", "claims", "compose", "cost", "peak", "uses")
#: The peak a YAML-only operation's unit declares (or inherits): MACs per cycle for an
#: operation composed on the array (``matmul``), bytes per cycle for one on the vector
#: unit; the default is the built-in unit's own peak (see :mod:`._peaks`).
PEAK_KEYS = {True: "macs_per_cycle", False: "bytes_per_cycle"}
_PEAK_NAMES = {True: ("rate", "E"), False: ("E",)}
_PARAM_KEYS = ("type", "default", "min", "max", "choices", "unit", "description")


# -- versions ------------------------------------------------------------------------


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in text.split("."))
    return parts + (0,) * (4 - len(parts))


def version_satisfies(version: str, requirement: str) -> bool:
    """Whether ``version`` (``"0.1.0"``) meets ``requirement`` (``">=0.1, <1.0"``)."""
    v = _version_tuple(version)
    for clause in requirement.split(","):
        m = _CLAUSE.match(clause)
        if m is None:
            raise ValueError(f"bad version clause {clause.strip()!r} (use e.g. '>=0.1, <1.0')")
        op, ref = m.group(1), _version_tuple(m.group(2))
        ok = {
            ">=": v >= ref,
            "<=": v <= ref,
            "==": v == ref,
            "!=": v != ref,
            ">": v > ref,
            "<": v < ref,
        }[op]
        if not ok:
            return False
    return True


# -- declarations --------------------------------------------------------------------


@dataclass(frozen=True)
class Parameter:
    """A typed extension parameter: ``type`` (int, float, bool, str), ``default``, an
    inclusive range ``min``/``max`` (numbers) or ``choices`` (strings), a ``unit``."""

    name: str
    type: str
    default: Any
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None
    unit: str = ""
    description: str = ""

    def check(self, value: Any) -> Any:
        """``value`` converted to the parameter's type; ValueError/TypeError if it does
        not fit (the message shows the value and the allowed range). A float must be
        finite: NaN compares false with both bounds and would pass any range."""
        t = self.type
        if t == "bool":
            if not isinstance(value, bool):
                raise TypeError(f"must be true or false, got {value!r}")
            return value
        if t == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"must be an integer, got {value!r}")
        elif t == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"must be a number, got {value!r}")
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"must be a finite number, got {value!r}")
        elif t == "str":
            if not isinstance(value, str):
                raise TypeError(f"must be a string, got {value!r}")
            if self.choices is not None and value not in self.choices:
                raise ValueError(f"must be one of {', '.join(self.choices)}, got {value!r}")
            return value
        if self.min is not None and value < self.min:
            raise ValueError(
                f"value {value!r} is below the minimum {self.min!r} (range {self._range()})"
            )
        if self.max is not None and value > self.max:
            raise ValueError(
                f"value {value!r} is above the maximum {self.max!r} (range {self._range()})"
            )
        return value

    def _range(self) -> str:
        lo = "-inf" if self.min is None else repr(self.min)
        hi = "inf" if self.max is None else repr(self.max)
        return f"[{lo}, {hi}]"


#: The signature of a Python operation: ``impl(op, graph, spec, storage, ext)`` returns
#: the op's kernels, or ``None`` to decline it (then the built-in lowering runs).
Impl = Callable[[Op, Graph, DeviceSpec, Any, "DeviceExtension"], "list[Any] | None"]


@dataclass(frozen=True)
class Operation:
    """One operation of an extension (the seed's ``{"name", impl}`` pairs).

    ``impl``: the reference as written (``"fn"`` or ``"entry-point:NAME"``) or, for an
    extension built in Python, the function itself. ``claims``: graph op kinds or op
    names it lowers. ``compose``: its primitives in data-flow order (see the module
    docstring). ``cost``: compiled cost expressions of a YAML-only operation.
    ``builtin_cost``: instead of ``cost``, the name of the emulator's kernel model it
    reuses (a key of :data:`BUILTIN_COSTS`). ``uses``: the capabilities it relies on.
    """

    name: str
    impl: str | Callable[..., Any] | None = None
    claims: tuple[str, ...] = ()
    compose: tuple[str, ...] = ()
    cost: Mapping[str, Expr] = field(default_factory=dict)
    peak: Mapping[str, Expr] = field(default_factory=dict)
    uses: tuple[Capability, ...] = ()
    description: str = ""
    index: int = 0
    builtin_cost: str | None = None

    @property
    def yaml_only(self) -> bool:
        return self.impl is None

    @property
    def on_array(self) -> bool:
        """Whether the operation's first primitive runs on the array (``matmul``);
        otherwise it runs on the vector unit."""
        return bool(self.compose) and all(k in GEMM_KINDS for k in self.chain_kinds()[0])

    def chain_kinds(self) -> tuple[tuple[str, ...], ...]:
        """The graph op kinds each ``compose`` entry accepts."""
        return tuple(PRIMITIVES.get(c, (c,)) for c in self.compose)


def _path_name(source: Path | None) -> str:
    return str(source) if source is not None else "<python>"


@dataclass(frozen=True, kw_only=True)
class DeviceExtension:
    """A device extension (the seed's ``wia_device_extension_t``), validated.

    Build one with :func:`load_extension` (YAML) or directly in Python with
    ``operations`` given as :class:`Operation` objects or ``(name, function)`` pairs.
    ``values`` holds the parameters' current values (defaults unless overridden).
    ``direct``: the registration a direct call makes (``pim_execute(ctx, ...)``:
    :func:`~wia_hw.registry.ensure_extension`), the extension without its graph claims;
    :func:`~wia_hw.registry.register_device_extension` replaces it.
    """

    extension_id: ExtensionId | str
    version: str
    capabilities: tuple[Capability, ...] = ()
    operations: tuple[Operation, ...] = ()
    parameters: Mapping[str, Parameter] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)
    requires: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    module: str | None = None
    source: Path | None = None
    lines: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)
    module_obj: ModuleType | None = field(default=None, repr=False, compare=False)
    direct: bool = False

    def __post_init__(self) -> None:
        ext_id = self.extension_id
        try:
            ext_id = ExtensionId(ext_id)
        except ValueError:
            if not isinstance(ext_id, str) or not _IDENT.match(ext_id):
                raise self.error(
                    "extension_id", f"must be an identifier (letters, digits, _), got {ext_id!r}"
                ) from None
        object.__setattr__(self, "extension_id", ext_id)
        if not isinstance(self.version, str) or not _VERSION.match(self.version):
            raise self.error("version", f"must be a version like '1.0', got {self.version!r}")
        caps = []
        for i, c in enumerate(self.capabilities):
            try:
                caps.append(Capability(c))
            except ValueError:
                raise self.error(
                    f"capabilities.{i}",
                    f"unknown capability {c!r} (known: {', '.join(m.value for m in Capability)})",
                ) from None
        object.__setattr__(self, "capabilities", tuple(caps))
        ops = []
        for i, o in enumerate(self.operations):
            if isinstance(o, tuple) and len(o) == 2:
                o = Operation(name=o[0], impl=o[1], index=i)
            if not isinstance(o, Operation):
                raise self.error(
                    f"operations.{i}", f"must be an Operation or a (name, function) pair, got {o!r}"
                )
            ops.append(replace(o, index=i))
        names = set()
        for o in ops:
            if not isinstance(o.name, str) or not _IDENT.match(o.name):
                raise self.error(
                    f"operations.{o.index}.name", f"must be an identifier, got {o.name!r}"
                )
            if o.name in names:
                raise self.error(
                    f"operations.{o.index}.name", f"operation {o.name!r} is declared twice"
                )
            names.add(o.name)
            for j, u in enumerate(o.uses):
                if u not in caps:
                    raise self.error(
                        f"operations.{o.index}.uses.{j}",
                        f"capability {str(u)!r} is not among the extension's "
                        f"capabilities ({', '.join(map(str, caps)) or 'none'})",
                    )
        object.__setattr__(self, "operations", tuple(ops))
        values = {n: p.default for n, p in self.parameters.items()}
        for n, v in self.values.items():
            values[n] = self._checked_param(n, v)
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))
        object.__setattr__(self, "values", MappingProxyType(values))
        object.__setattr__(self, "requires", MappingProxyType(dict(self.requires)))
        object.__setattr__(self, "lines", MappingProxyType(dict(self.lines)))

    # -- errors ----------------------------------------------------------------------
    @property
    def file(self) -> str:
        """Where the extension was declared (file path, or ``<python>``)."""
        return _path_name(self.source)

    def error(self, field_: str, message: str) -> SpecError:
        """A SpecError naming this extension's file, the field's line and the field."""
        return SpecError(message, file=self.file, line=line_for(field_, self.lines), field=field_)

    def _checked_param(self, name: str, value: Any) -> Any:
        p = self.parameters.get(name)
        if p is None:
            raise self.error(
                f"parameters.{name}",
                f"unknown parameter (known: {', '.join(self.parameters) or 'none'})",
            )
        try:
            return p.check(value)
        except (TypeError, ValueError) as e:
            raise self.error(f"parameters.{name}", str(e)) from None

    # -- access ----------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The extension id as a plain string."""
        return str(self.extension_id)

    def param(self, name: str) -> Any:
        """The current value of a parameter."""
        if name not in self.values:
            raise KeyError(f"extension {self.id!r} has no parameter {name!r}")
        return self.values[name]

    def with_parameters(
        self, values: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> DeviceExtension:
        """A copy with some parameters changed (validated: type and range)."""
        new = dict(self.values)
        for n, v in {**(values or {}), **kwargs}.items():
            new[n] = self._checked_param(n, v)
        return replace(self, values=new)

    def has(self, capability: Capability | str) -> bool:
        return Capability(capability) in self.capabilities

    def operation(self, name: str) -> Operation:
        for o in self.operations:
            if o.name == name:
                return o
        raise KeyError(
            f"extension {self.id!r} has no operation {name!r} (it has: "
            f"{', '.join(o.name for o in self.operations)})"
        )

    def implementation(self, name: str) -> Callable[..., Any]:
        """The Python function of operation ``name`` (resolved and checked)."""
        op = self.operation(name)
        return resolve_impl(self, op)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain data (what ``wia-hw ext show`` prints)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "extension_id": self.id,
            "version": self.version,
            "description": self.description,
            "requires": dict(self.requires),
            "module": self.module,
            "capabilities": [str(c) for c in self.capabilities],
            "parameters": {
                n: {
                    k: v
                    for k, v in (
                        ("type", p.type),
                        ("default", p.default),
                        ("value", self.values[n]),
                        ("min", p.min),
                        ("max", p.max),
                        ("choices", list(p.choices) if p.choices else None),
                        ("unit", p.unit),
                        ("description", p.description),
                    )
                    if v not in (None, "")
                }
                for n, p in self.parameters.items()
            },
            "operations": [
                {
                    k: v
                    for k, v in (
                        ("name", o.name),
                        ("description", o.description),
                        (
                            "impl",
                            o.impl
                            if isinstance(o.impl, str) or o.impl is None
                            else f"{o.impl.__module__}.{o.impl.__qualname__}",
                        ),
                        ("claims", list(o.claims)),
                        ("compose", list(o.compose)),
                        (
                            "cost",
                            {"builtin": o.builtin_cost}
                            if o.builtin_cost
                            else {k: str(e) for k, e in o.cost.items()},
                        ),
                        ("peak", {k: str(e) for k, e in o.peak.items()}),
                        ("uses", [str(u) for u in o.uses]),
                    )
                    if v
                }
                for o in self.operations
            ],
            "source": self.file,
        }


# -- reading a manifest --------------------------------------------------------------


def _unknown(key: Any, known: Sequence[str], what: str = "key") -> str:
    """``unknown key 'cycle' (did you mean 'cycles'?)``, or the known keys when no
    known key is close."""
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    if close:
        return f"unknown {what} {str(key)!r} (did you mean {close[0]!r}?)"
    return f"unknown {what} {str(key)!r} (known: {', '.join(known)})"


def read_manifest(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    return read_yaml_mapping(path, str(path), "an extension manifest")


class _Where:
    """Builds SpecErrors for one manifest file."""

    def __init__(self, file: str, lines: Mapping[str, int]) -> None:
        self.file, self.lines = file, lines

    def __call__(self, field_: str, message: str) -> SpecError:
        return SpecError(message, file=self.file, line=line_for(field_, self.lines), field=field_)


def _parse_parameters(raw: Any, err: _Where) -> dict[str, Parameter]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise err("parameters", f"must be a mapping of name -> declaration, got {raw!r}")
    out = {}
    for name, decl in raw.items():
        f = f"parameters.{name}"
        if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
            raise err(f, "a parameter name must be an identifier")
        if name in _MATMUL_NAMES + _VECTOR_NAMES + _DEVICE_NAMES:
            raise err(
                f,
                f"{name!r} is reserved for cost expressions (tile and device "
                "names); choose another name",
            )
        if not isinstance(decl, Mapping):
            raise err(f, f"must be a mapping with type and default, got {decl!r}")
        for k in decl:
            if k not in _PARAM_KEYS:
                raise err(f"{f}.{k}", _unknown(k, _PARAM_KEYS))
        t = decl.get("type")
        if t not in _PARAM_TYPES:
            raise err(f"{f}.type", f"must be one of {', '.join(_PARAM_TYPES)}, got {t!r}")
        if "default" not in decl:
            raise err(f, "missing default")
        lo, hi = decl.get("min"), decl.get("max")
        for k, v in (("min", lo), ("max", hi)):
            if v is not None and (
                t not in ("int", "float") or isinstance(v, bool) or not isinstance(v, (int, float))
            ):
                raise err(f"{f}.{k}", f"a {k} needs a numeric parameter and a number, got {v!r}")
            if v is not None and not math.isfinite(v):
                raise err(f"{f}.{k}", f"must be a finite number (or left out), got {v!r}")
        if lo is not None and hi is not None and lo > hi:
            raise err(f"{f}.min", f"min {lo!r} is above max {hi!r}")
        choices = decl.get("choices")
        if choices is not None:
            if (
                t != "str"
                or not isinstance(choices, list)
                or not all(isinstance(c, str) for c in choices)
                or not choices
            ):
                raise err(
                    f"{f}.choices", "choices must be a non-empty list of strings of a str parameter"
                )
            choices = tuple(choices)
        p = Parameter(
            name,
            t,
            decl["default"],
            lo,
            hi,
            choices,
            str(decl.get("unit", "")),
            str(decl.get("description", "")),
        )
        try:
            p = replace(p, default=p.check(decl["default"]))
        except (TypeError, ValueError) as e:
            raise err(f"{f}.default", str(e)) from None
        if t in ("int", "float") and p.default < 0 and lo is None:
            raise err(
                f"{f}.default",
                f"negative default {p.default!r} with no min: declare the range the "
                "cost model is valid over (min: ...)",
            )
        out[name] = p
    return out


def _parse_operations(
    raw: Any, params: Mapping[str, Parameter], caps: Sequence[Any], err: _Where
) -> list[Operation]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise err("operations", f"must be a list of operations, got {raw!r}")
    ops = []
    for i, o in enumerate(raw):
        f = f"operations.{i}"
        if not isinstance(o, Mapping):
            raise err(f, f"an operation must be a mapping, got {o!r}")
        for k in o:
            if k not in _OP_KEYS:
                raise err(f"{f}.{k}", _unknown(k, _OP_KEYS))
        name = o.get("name")
        if not isinstance(name, str) or not _IDENT.match(name):
            raise err(f"{f}.name", f"must be an identifier, got {name!r}")
        impl = o.get("impl")
        if impl is not None and not isinstance(impl, str):
            raise err(
                f"{f}.impl", f"must be a function name in the extension's module, got {impl!r}"
            )
        claims = o.get("claims", [])
        if not isinstance(claims, list) or not all(isinstance(c, str) and c for c in claims):
            raise err(
                f"{f}.claims", f"must be a list of graph op kinds or op names, got {claims!r}"
            )
        for j, c in enumerate(claims):
            if c not in OP_KINDS and "." not in c:
                raise err(
                    f"{f}.claims.{j}",
                    f"{c!r} is neither a graph op kind (known: "
                    f"{', '.join(OP_KINDS)}) nor an op name (op names contain '.')",
                )
        compose = o.get("compose", [])
        if not isinstance(compose, list) or not all(isinstance(c, str) for c in compose):
            raise err(f"{f}.compose", f"must be a list of primitives, got {compose!r}")
        for j, c in enumerate(compose):
            if c not in PRIMITIVES and c not in OP_KINDS:
                raise err(
                    f"{f}.compose.{j}",
                    f"unknown primitive {c!r} (primitives: "
                    f"{', '.join(PRIMITIVES)}, or a graph op kind)",
                )
        uses = o.get("uses", [])
        if not isinstance(uses, list):
            raise err(f"{f}.uses", f"must be a list of capabilities, got {uses!r}")
        used = []
        for j, u in enumerate(uses):
            try:
                used.append(Capability(u))
            except ValueError:
                raise err(f"{f}.uses.{j}", f"unknown capability {u!r}") from None
        cost_raw = o.get("cost")
        cost: dict[str, Expr] = {}
        builtin: str | None = None
        if impl is None:
            if not compose:
                raise err(
                    f,
                    f"operation {name!r} has neither impl (a Python function) nor "
                    "compose + cost (a YAML-only definition)",
                )
            if not claims:
                raise err(
                    f"{f}.claims",
                    "a YAML-only operation must claim the graph op kinds (or op names) it lowers",
                )
            head = PRIMITIVES.get(compose[0], (compose[0],))
            for j, c in enumerate(claims):
                if c in OP_KINDS and c not in head:
                    raise err(
                        f"{f}.claims.{j}",
                        f"claims {c!r} but compose starts with {compose[0]!r} ({', '.join(head)})",
                    )
            if _is_builtin(cost_raw):
                builtin = _parse_builtin(cost_raw, compose[0], f, err)
                cost_raw = {}
            elif isinstance(cost_raw, str):
                raise err(f"{f}.cost", _unknown(cost_raw, ["builtin"], "cost"))
            for key in cost_raw if isinstance(cost_raw, Mapping) else ():
                if key not in _COST_KEYS:  # a typo ``cycle:`` is named before "no cycles"
                    raise err(f"{f}.cost.{key}", _unknown(key, _COST_KEYS))
            if builtin is None and (not isinstance(cost_raw, Mapping) or "cycles" not in cost_raw):
                raise err(
                    f"{f}.cost",
                    "a YAML-only operation needs a cost model with at least cycles (an "
                    "expression), or builtin (the emulator's own kernel timing)",
                )
            gemm = all(k in GEMM_KINDS for k in head)
            names = set(params) | set(_DEVICE_NAMES) | set(_MATMUL_NAMES if gemm else _VECTOR_NAMES)
            for key, text in cost_raw.items():
                try:
                    cost[key] = compile_expr(text, names)
                except ExprError as e:
                    raise err(f"{f}.cost.{key}", str(e)) from None
        elif cost_raw is not None:
            raise err(
                f"{f}.cost",
                "a cost model belongs to YAML-only operations; a Python "
                "impl computes its own kernels",
            )
        peak: dict[str, Expr] = {}
        if "peak" in o:
            if builtin is not None:
                raise err(
                    f"{f}.peak",
                    "a peak belongs to operations with their own cost expressions; "
                    "cost: builtin runs at the built-in unit's own peak",
                )
            if impl is not None:
                raise err(
                    f"{f}.peak",
                    "a peak belongs to YAML-only operations; a Python "
                    "impl computes its own kernels",
                )
            peak = _parse_peak(
                o["peak"],
                all(k in GEMM_KINDS for k in PRIMITIVES.get(compose[0], (compose[0],))),
                params,
                f,
                err,
            )
        ops.append(
            Operation(
                name=name,
                impl=impl,
                claims=tuple(claims),
                compose=tuple(compose),
                cost=cost,
                peak=peak,
                uses=tuple(used),
                description=str(o.get("description", "")),
                index=i,
                builtin_cost=builtin,
            )
        )
    return ops


def _is_builtin(raw: Any) -> bool:
    """Whether a ``cost`` entry asks for a built-in kernel model (``builtin`` or a
    mapping with the key ``builtin``)."""
    return raw == "builtin" or (isinstance(raw, Mapping) and "builtin" in raw)


def _parse_builtin(raw: Any, head: str, f: str, err: _Where) -> str:
    """The built-in kernel model a ``cost: builtin`` / ``cost: {builtin: NAME}`` names,
    checked against the unit the ``compose`` chain starts on."""
    on_array = all(k in GEMM_KINDS for k in PRIMITIVES.get(head, (head,)))
    if isinstance(raw, str):
        return "gemm" if on_array else "vector"
    others = [k for k in raw if k != "builtin"]
    if others:
        raise err(
            f"{f}.cost.{others[0]}",
            "cost: {builtin: NAME} takes no other key (it reuses the emulator's own "
            "timing; write either builtin or cost expressions, not both)",
        )
    name = raw["builtin"]
    if name not in BUILTIN_COSTS:
        raise err(f"{f}.cost.builtin", _unknown(name, list(BUILTIN_COSTS), "builtin cost model"))
    if BUILTIN_COSTS[name] != on_array:
        unit = "array" if on_array else "vector unit"
        raise err(
            f"{f}.cost.builtin",
            f"builtin cost model {name!r} times the "
            f"{'array' if BUILTIN_COSTS[name] else 'vector unit'}, but compose starts "
            f"with {head!r} (on the {unit}): use builtin: {'gemm' if on_array else 'vector'}",
        )
    return str(name)


def _parse_peak(
    raw: Any, on_array: bool, params: Mapping[str, Parameter], f: str, err: _Where
) -> dict[str, Expr]:
    key = PEAK_KEYS[on_array]
    if not isinstance(raw, Mapping) or list(raw) != [key]:
        raise err(
            f"{f}.peak",
            f"must be a mapping with one key, {key} (an expression), "
            f"for an operation on the {'array' if on_array else 'vector unit'}; "
            f"got {raw!r}",
        )
    names = set(params) | set(_DEVICE_NAMES) | set(_PEAK_NAMES[on_array])
    try:
        return {key: compile_expr(raw[key], names)}
    except ExprError as e:
        raise err(f"{f}.peak.{key}", str(e)) from None


def _written(source: Path | None, line: int | None) -> str | None:
    """The scalar as written after ``key:`` on line ``line`` of ``source`` (for an
    error message), or None when it cannot be read back."""
    if source is None or line is None:
        return None
    try:
        text = source.read_text(encoding="utf-8", errors="replace").splitlines()[line - 1]
    except (OSError, IndexError):
        return None
    value = text.partition(":")[2].split("#")[0].strip()
    return value or None


def from_data(
    data: Mapping[str, Any],
    lines: Mapping[str, int],
    source: Path | None,
    values: Mapping[str, Any] | None,
    module_obj: ModuleType | None = None,
) -> DeviceExtension:
    err = _Where(_path_name(source), lines)
    for k in data:
        if k not in _TOP_KEYS:
            raise err(str(k), _unknown(k, _TOP_KEYS, "field"))
    for k in ("schema_version", "extension_id", "version"):
        if k not in data:
            raise err(k, "missing required field")
    if data["schema_version"] != SCHEMA_VERSION:
        raise err(
            "schema_version",
            f"unsupported schema_version {data['schema_version']!r} "
            f"(this wia-hw reads {SCHEMA_VERSION})",
        )
    version = data["version"]
    if isinstance(version, float):
        written = _written(source, line_for("version", lines)) or repr(version)
        how = f"{written} as {version!r}" if written != repr(version) else "1.10 as 1.1"
        raise err(
            "version",
            f"must be a quoted string (YAML reads an unquoted version as a number: "
            f'{how}); write version: "{written}"',
        )
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    requires = data.get("requires") or {}
    if not isinstance(requires, Mapping):
        raise err("requires", f"must be a mapping like {{wia_hw: '>=0.1'}}, got {requires!r}")

    for k, v in requires.items():
        if k != "wia_hw":
            raise err(f"requires.{k}", "only wia_hw can be required")
        if not isinstance(v, str):
            raise err(f"requires.{k}", f"must be a version range string, got {v!r}")
        try:
            ok = version_satisfies(__version__, v)
        except ValueError as e:
            raise err(f"requires.{k}", str(e)) from None
        if not ok:
            raise err(
                f"requires.{k}",
                f"incompatible version: the extension needs wia_hw "
                f"{v}, this is wia_hw {__version__}",
            )
    module = data.get("module")
    if module is not None and (
        not isinstance(module, str) or not _IDENT.match(module.removesuffix(".py"))
    ):
        raise err(
            "module",
            f"must name a Python module beside the manifest (an identifier, "
            f"no dots or paths), got {module!r}",
        )
    caps = data.get("capabilities") or []
    if not isinstance(caps, list):
        raise err("capabilities", f"must be a list, got {caps!r}")
    params = _parse_parameters(data.get("parameters"), err)
    ops = _parse_operations(data.get("operations"), params, caps, err)
    if module is None and module_obj is None:
        for o in ops:
            if not o.yaml_only and not str(o.impl).startswith("entry-point:"):
                raise err(
                    f"operations.{o.index}.impl",
                    "an impl needs the extension's "
                    "module (add module: NAME for NAME.py beside the manifest)",
                )
    ext = DeviceExtension(
        extension_id=data["extension_id"],
        version=version,
        capabilities=tuple(caps),
        operations=tuple(ops),
        parameters=params,
        values={},
        requires=requires,
        description=str(data.get("description", "")),
        module=module.removesuffix(".py") if module else None,
        source=source,
        lines=lines,
        module_obj=module_obj,
    )
    check_cost_domain(ext)
    if values:
        ext = ext.with_parameters(values)
    for o in ext.operations:  # check every impl now, statically: nothing runs
        if not o.yaml_only:
            check_impl(ext, o)
    return ext


# -- cost expressions over their domain ------------------------------------------------


@functools.lru_cache(maxsize=1)
def _domain_devices() -> tuple[dict[str, float], ...]:
    """The device names (``array_rows``, ..., plus ``rates``: the array's MACs per PE
    per cycle over its precisions) of every distinct built-in device spec."""
    from ..emulator.config import ClusterSpec
    from ..spec import list_specs, load_spec

    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for name in list_specs():
        try:
            s = load_spec(name)
        except SpecError:  # a broken built-in spec is its own test's job
            continue
        d = s.device if isinstance(s, ClusterSpec) else s
        if not isinstance(d, DeviceSpec):
            continue
        a = d.compute.array
        names = {
            "array_rows": a.rows,
            "array_cols": a.cols,
            "cores": d.compute.cores,
            "lanes": d.compute.vector.lanes,
            "clock_ghz": d.clock_ghz,
        }
        rates = tuple(sorted({float(a.rate(p)) for p in a.macs_per_pe_cycle}))
        out.setdefault(tuple(names.values()) + rates, dict(names, rates=rates))
    return tuple(out.values())


def _tile_grid(on_array: bool, dev: Mapping[str, Any]) -> list[dict[str, float]]:
    """Tiles a cost expression is evaluated on, each at 1, 2 and 4 bytes per element
    (``E``). Array: ``M``, ``N``, ``K`` all 1, all the device's full tile (rows, cols,
    rows), and each alone at 1 with the others full, at the lowest and the highest
    ``rate`` of the device's precisions (``B`` = 1). Vector unit: ``ROWS`` in ``{1,
    16}`` by ``COLS`` in ``{1, lanes}``."""
    tiles: list[dict[str, float]] = []
    full = {"M": dev["array_rows"], "N": dev["array_cols"], "K": dev["array_rows"]}
    shapes = [dict.fromkeys(full, 1), full] + [dict(full, **{k: 1}) for k in full]
    rates = sorted({min(dev["rates"]), max(dev["rates"])})
    for e in (1, 2, 4):
        if on_array:
            for shape, rate in itertools.product(shapes, rates):
                tiles.append({"B": 1, **shape, "E": e, "rate": rate})
        else:
            for r, c in itertools.product((1, 16), (1, dev["lanes"])):
                tiles.append({"ROWS": r, "COLS": c, "ELEMENTS": r * c, "E": e})
    return tiles


def _param_points(params: Mapping[str, Parameter], used: frozenset[str]) -> list[dict[str, float]]:
    """Parameter values a cost expression is evaluated at: the defaults, each numeric
    parameter it reads at its ``min`` and its ``max`` (others at their defaults), and
    all of them at their ``min``s, then at their ``max``es."""
    base = {n: p.default for n, p in params.items()}
    num = [p for n, p in params.items() if n in used and p.type in ("int", "float")]
    points = [base]
    for p in num:
        for bound in (p.min, p.max):
            if bound is not None:
                points.append(dict(base, **{p.name: bound}))
    for side in ("min", "max"):
        given = {p.name: getattr(p, side) for p in num if getattr(p, side) is not None}
        if len(given) > 1:
            points.append(dict(base, **given))
    return points


def check_cost_domain(ext: DeviceExtension) -> None:
    """Refuse a YAML-only operation whose ``cost`` (or ``peak``) expression cannot be
    evaluated (division by zero, ``log2`` of a non-positive number, a value out of
    range, a non-numeric parameter) or is negative, for some in-range parameter value
    on some tile: the expressions are evaluated at the parameters' bounds
    (:func:`_param_points`) on a small tile grid of every built-in device
    (:func:`_tile_grid`). The :class:`SpecError` names the file, the line and the field
    (``operations.N.cost.KEY``), the tile and the parameter values."""
    params = tuple((n, p.type, p.default, p.min, p.max) for n, p in sorted(ext.parameters.items()))
    for op in ext.operations:
        exprs = [(f"cost.{k}", e) for k, e in op.cost.items()]
        exprs += [(f"peak.{k}", e) for k, e in op.peak.items()]
        if not op.yaml_only or not exprs:
            continue
        for where, expr in exprs:
            why = _domain_problem(expr.text, op.on_array, params)
            if why is not None:
                raise ext.error(f"operations.{op.index}.{where}", why)


@functools.lru_cache(maxsize=512)
def _domain_problem(
    text: str, on_array: bool, params: tuple[tuple[str, str, Any, Any, Any], ...]
) -> str | None:
    """What is wrong with the expression ``text`` somewhere on its domain (see
    :func:`check_cost_domain`), or None; cached, as manifests are loaded again and
    again with the same expressions."""
    expr = compile_expr(text)
    decl = {n: Parameter(n, t, d, lo, hi) for n, t, d, lo, hi in params}
    used = sorted(expr.names)
    seen: set[tuple[Any, ...]] = set()
    grids = [(dev, _tile_grid(on_array, dev)) for dev in _domain_devices()]
    for point in _param_points(decl, expr.names):
        for dev, tiles in grids:
            for tile in tiles:
                env = {**dev, **point, **tile}
                key = tuple(env[n] for n in used)
                if key in seen:
                    continue
                seen.add(key)
                try:
                    v = expr.evaluate(env)
                except ExprError as e:
                    bad = str(e)
                else:
                    if v >= 0:
                        continue
                    bad = f"is negative ({v:g})"
                shown = ", ".join(f"{n}={env[n]!r}" for n in used)
                return (
                    f"{expr.text!r} {bad} for {shown or 'every value'}: a cost must be "
                    "defined and non-negative for every in-range parameter value and tile"
                )
    return None
