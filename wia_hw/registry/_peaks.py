"""The peak of the unit a YAML-only operation runs on, and the check that the
operation's cost model never beats it (honest physics: nothing below its roofline).

A YAML-only operation composes built-in primitives, so it runs on a built-in unit and
inherits its peak:

* on the array (``compose`` starts with ``matmul``): ``macs_per_cycle =
  array_rows * array_cols * rate``, the MACs one core's systolic array performs per
  cycle at the op's precision;
* on the vector unit (any other primitive): ``bytes_per_cycle = lanes * E``, one
  element of ``E`` bytes per lane per cycle.

A manifest may declare a lower peak (``peak: {macs_per_cycle: EXPR}`` or
``peak: {bytes_per_cycle: EXPR}``, an expression of the parameters, the device names and
``rate``/``E``), for a unit that uses part of the array, say; a declared peak above the
inherited one is refused. A tile's cost beats the peak when

* array: ``cycles * macs_per_cycle < macs`` (``macs``: the MACs the unit executes, the
  cost model's ``macs`` or the tile's ``B*M*N*K``);
* vector unit: ``cycles * bytes_per_cycle < ELEMENTS * E``.

The MACs an array operation executes are bounded below (:func:`check_macs`), or a cost
model could claim to execute none and run at any speed: at least the tile's
``B*M*N*K``, unless the extension declares ``structured_sparsity`` (a unit that skips
zero weights), then at least ``B*M*N``, one per output element. A tile's values must
also be in range (:func:`check_values`: ``cycles`` at least 1, ``macs`` and
``energy_pj`` not negative).

:func:`check_values`, :func:`check_macs` and :func:`check_tile` are the run-time checks of every tile (a
:class:`~wia_hw.WorkloadError` naming the op, the operation, the tile shape and the
peak). :func:`check_costs` is the validate-time check: it evaluates the cost model on
the full tiles each built-in device cuts, and refuses the manifest (a
:class:`~wia_hw.SpecError` naming the file, line and field) when the cost beats the peak
on one of them (or its values are out of range, or its MACs too few, there), which
proves the operation would be refused when it runs there, with the same message.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from fractions import Fraction

from ..emulator.config import ClusterSpec, DeviceSpec
from ..emulator.errors import SpecError
from ..graph import DTYPE_BYTES
from ..lowering import choose_gemm_tiling
from ..spec import list_specs, load_spec
from ._expr import ExprError
from ._manifest import PEAK_KEYS, Capability, DeviceExtension, Operation

__all__ = [
    "device_names",
    "unit_peak",
    "skips_macs",
    "check_values",
    "check_macs",
    "check_tile",
    "check_costs",
]

Number = int | float


def device_names(spec: DeviceSpec) -> dict[str, float]:
    """The device names a cost or peak expression may read."""
    a = spec.compute.array
    return {
        "array_rows": a.rows,
        "array_cols": a.cols,
        "cores": spec.compute.cores,
        "lanes": spec.compute.vector.lanes,
        "clock_ghz": spec.clock_ghz,
    }


def _num(x: Number) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def unit_peak(op: Operation, env: Mapping[str, Number]) -> tuple[Fraction, str, str]:
    """(peak per cycle, unit, how it was obtained) of ``op`` on the device and tile
    environment ``env``. Raises ValueError when a declared peak is not positive or is
    above the inherited one, ExprError when it cannot be evaluated."""
    if op.on_array:
        rows, cols, rate = env["array_rows"], env["array_cols"], env["rate"]
        inherited = Fraction(rows) * Fraction(cols) * Fraction(rate)
        how = f"array_rows*array_cols*rate = {_num(rows)}*{_num(cols)}*{_num(rate)}"
        unit = "MACs"
    else:
        lanes, e = env["lanes"], env["E"]
        inherited = Fraction(lanes) * Fraction(e)
        how = f"lanes*E = {_num(lanes)}*{_num(e)}"
        unit = "bytes"
    key = PEAK_KEYS[op.on_array]
    expr = op.peak.get(key)
    if expr is None:
        return inherited, unit, how
    declared = Fraction(expr.evaluate(env))
    if declared <= 0:
        raise ValueError(
            f"declared peak {key} = {expr} is {_num(float(declared))}; it must be positive"
        )
    if declared > inherited:
        raise ValueError(
            f"declared peak {key} = {expr} is {_num(float(declared))}, above "
            f"the unit's own {_num(float(inherited))} ({how})"
        )
    return declared, unit, f"declared {key} = {expr}"


def _shape(dims: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in dims.items()) + "}"


def skips_macs(ext: DeviceExtension, op: Operation) -> bool:
    """Whether ``op`` may execute fewer MACs than its tiles' ``B*M*N*K``: it, or its
    extension, declares ``structured_sparsity`` (a unit that skips zero weights)."""
    sparse = Capability.STRUCTURED_SPARSITY
    return sparse in op.uses or sparse in ext.capabilities


def check_values(
    name: str,
    dims: Mapping[str, int],
    cycles: Number,
    macs: Number | None,
    energy_pj: Number | None,
) -> str | None:
    """Why a tile's cost values are out of range (``cycles`` below 1, ``macs`` or
    ``energy_pj`` negative), or ``None``; the values are as the expressions gave them,
    before rounding."""
    if cycles >= 1 and (macs is None or macs >= 0) and (energy_pj is None or energy_pj >= 0):
        return None
    return (
        f"cost model of {name} gave cycles {cycles!r}, macs {macs!r}, energy_pj "
        f"{energy_pj!r} for tile {dict(dims)} (cycles must be >= 1, the others >= 0)"
    )


def check_macs(
    name: str, op: Operation, dims: Mapping[str, int], macs: int | None, sparse: bool
) -> str | None:
    """Why the MACs an array operation's cost model says a tile executes are too few,
    or ``None``: at least ``B*M*N*K``, or, for a unit that skips zero weights
    (``sparse``, see :func:`skips_macs`), at least ``B*M*N`` (one per output element).
    Without the bound a cost model claiming no MACs would beat any peak."""
    if not op.on_array or macs is None:
        return None
    outputs = dims["B"] * dims["M"] * dims["N"]
    least, what = (
        (
            outputs,
            "B*M*N, one per output element (a structured-sparse unit skips zero weights, not outputs)",
        )
        if sparse
        else (
            outputs * dims["K"],
            "B*M*N*K, the tile's MACs (only a unit that declares structured_sparsity may "
            "skip some)",
        )
    )
    if macs >= least:
        return None
    return (
        f"{name}: cost model executes {_num(macs)} MACs on tile {_shape(dims)}, fewer "
        f"than {_num(least)} = {what}"
    )


def check_tile(
    name: str,
    op: Operation,
    env: Mapping[str, Number],
    dims: Mapping[str, int],
    cycles: int,
    macs: int | None,
) -> str | None:
    """Why the cost of one tile beats the unit's peak, or ``None`` when it does not.

    ``name``: the operation as ``extension.operation``; ``env``: device names,
    parameters and the tile's names; ``cycles``: the tile's cost; ``macs``: the MACs the
    cost model says the unit executes (``None``: the tile's ``B*M*N*K``)."""
    try:
        peak, unit, how = unit_peak(op, env)
    except ValueError as e:
        return f"{name}: {e}"
    if op.on_array:
        work = macs if macs is not None else dims["B"] * dims["M"] * dims["N"] * dims["K"]
    else:
        work = dims["ELEMENTS"] * dims["E"]
    if work <= cycles * peak:
        return None
    need = math.ceil(work / peak)
    return (
        f"{name}: cost model beats the unit's peak on tile {_shape(dims)}: "
        f"{_num(cycles)} cycles for {_num(work)} {unit} is "
        f"{_num(float(work / cycles))} {unit}/cycle, above the peak of "
        f"{_num(float(peak))} {unit}/cycle ({how}); the tile needs at least "
        f"{_num(need)} cycles"
    )


@functools.lru_cache(maxsize=1)
def _builtin_samples() -> tuple[
    tuple[str, dict[str, float], tuple[dict[str, int], ...], tuple[dict[str, int], ...]], ...
]:
    """(device name, device names, array tiles by precision with ``rate``, vector
    chunks) of every built-in device spec: the full tiles its tiler cuts from a large
    GEMM and an array-sized one, and vector chunks of one issue to a large block."""
    out = []
    seen = set()
    for name in list_specs():
        try:
            s = load_spec(name)
        except SpecError:  # a broken built-in spec is its own test's job
            continue
        d = s.device if isinstance(s, ClusterSpec) else s
        if not isinstance(d, DeviceSpec) or d.name in seen:
            continue
        seen.add(d.name)
        a = d.compute.array
        gemm = []
        for prec in a.macs_per_pe_cycle:
            e = DTYPE_BYTES.get(prec, 2)
            t = choose_gemm_tiling(d, 1, 4096, 4096, 4096, e, 4 if prec == "int8" else e)
            rate = float(a.rate(prec))
            for b, m, n, k in ((t.tb, t.tm, t.tn, t.tk), (1, a.rows, a.cols, a.rows)):
                gemm.append({"B": b, "M": m, "N": n, "K": k, "E": e, "rate": rate})
        lanes = d.compute.vector.lanes
        vec = tuple(
            {"ROWS": r, "COLS": c, "ELEMENTS": r * c, "E": 2}
            for r, c in ((1, lanes), (16, 1024), (128, 4096))
        )
        out.append((d.name, device_names(d), tuple(gemm), vec))
    return tuple(out)


def check_costs(ext: DeviceExtension) -> DeviceExtension:
    """Refuse ``ext`` when the cost model of one of its YAML-only operations beats its
    unit's peak on a full tile of a built-in device (see the module docstring); the
    :class:`~wia_hw.SpecError` names the manifest, the line of ``cost.cycles`` and the
    built-in device; returns ``ext``. Samples whose expressions cannot be evaluated prove nothing and
    are skipped (the run-time check still applies)."""
    for op in ext.operations:
        if not op.yaml_only or "cycles" not in op.cost:
            continue
        for device, names, gemm, vec in _builtin_samples():
            for dims in gemm if op.on_array else vec:
                env = {**names, **ext.values, **dims}
                cost = op.cost
                try:
                    cyc = cost["cycles"].evaluate(env)
                    macs = cost["macs"].evaluate(env) if "macs" in cost else None
                    pj = cost["energy_pj"].evaluate(env) if "energy_pj" in cost else None
                    unit_peak(op, env)
                except ExprError:
                    continue
                except ValueError as e:
                    raise ext.error(
                        f"operations.{op.index}.peak", f"{e} on the built-in device {device!r}"
                    ) from None
                name = f"{ext.id}.{op.name}"
                tile = {k: v for k, v in dims.items() if k != "rate"}
                on = f", on the built-in device {device!r}"
                why = check_values(name, tile, cyc, macs, pj)
                if why is not None:  # the run refuses it with this message
                    key = (
                        "cycles"
                        if cyc < 1
                        else "macs"
                        if macs is not None and macs < 0
                        else "energy_pj"
                    )
                    raise ext.error(f"operations.{op.index}.cost.{key}", why + on)
                cycles, tile_macs = math.ceil(cyc), None if macs is None else math.ceil(macs)
                why = check_macs(name, op, tile, tile_macs, skips_macs(ext, op))
                if why is not None:
                    raise ext.error(f"operations.{op.index}.cost.macs", why + on)
                why = check_tile(name, op, env, tile, cycles, tile_macs)
                if why is not None:
                    raise ext.error(
                        f"operations.{op.index}.cost.cycles",
                        f"{why}, on the built-in device {device!r}",
                    )
    return ext
