"""Every field of every shipped device spec changes some output of a run, or is declared
metadata (``emulator.config.METADATA_FIELDS``).

For each shipped device spec and each leaf of its config tree (defaults included; a
mapping's keys are leaves), the field is perturbed (a bool flipped, an enum changed, a
number doubled, halved or moved by one: the first valid perturbation that changes
something wins) and a small workload set that exercises every unit is run in timing
mode; the test fails when no output (the run's whole JSON report: latency, every
counter, energy, temperature, per-kernel records) changes. A field that acts only when
another allows it (:data:`ENABLED_BY`) is checked with that other field set so.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from wia_hw.emulator.config import METADATA_FIELDS, TILE_SCHEDULES, DeviceSpec, to_mapping
from wia_hw.emulator.cycles import DATAFLOWS
from wia_hw.emulator.errors import SpecError

import wia_hw
from wia_hw.graph import Graph, GraphBuilder
from wia_hw.spec import list_specs, load_spec


#: The workloads, most sensitive (and cheapest) first: GEMMs in every precision the
#: array may support (array, L1/L2/HBM, DMA, control core, energy per precision), a
#: transformer layer (softmax, layer norm, GELU, gather, copies), a small ResNet (pools),
#: and a run that starts hot (thermal throttling).
def _transpose(rows: int = 256, cols: int = 384) -> Graph:
    b = GraphBuilder("transpose", "fp16")
    b.op("transpose", "t", [b.input("x", (rows, cols))], perm=(1, 0))
    return b.graph()


WORKLOADS: list[tuple[str | Callable[[], Graph], dict[str, Any]]] = [
    ("gemm", {"M": 200, "N": 300, "K": 500}),
    ("gemm", {"M": 64, "N": 96, "K": 128, "precision": "int8"}),
    ("gemm", {"M": 64, "N": 96, "K": 128, "precision": "bf16"}),
    ("gemm", {"M": 64, "N": 96, "K": 128, "precision": "fp32"}),
    ("bert-base", {"batch": 1, "seq": 16, "layers": 1}),
    (_transpose, {}),  # copies (transpose, concat, slice)
    ("resnet50", {"batch": 1, "image": 32}),
    ("hot", {"M": 512, "N": 512, "K": 512}),
    # a device of many cores (a100-systolic's 108) hides a small workload's vector and
    # DMA work under its latencies: the same kinds of work, large enough to spread
    ("bert-base", {"batch": 8, "seq": 128, "layers": 1}),
    (lambda: _transpose(4096, 2048), {}),
    # an int8-only array (tpu-v1) runs the same kinds of work in int8
    ("bert-base", {"batch": 1, "seq": 16, "layers": 1, "precision": "int8"}),
    ("resnet50", {"batch": 1, "image": 32, "precision": "int8"}),
    ("hot", {"M": 512, "N": 512, "K": 512, "precision": "int8"}),
]

_HOT_MARGIN_C = 5.0  # the hot run starts this far above the throttle limit


def _device_specs() -> list[str]:
    out = []
    for name in list_specs():
        if isinstance(load_spec(name), DeviceSpec):
            out.append(name)
    return out


def _leaves(obj: Any, path: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        p = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(v):
            out += _leaves(v, p)
        elif isinstance(v, Mapping):
            out += [(f"{p}.{k}", x) for k, x in v.items()]
        else:
            out.append((p, v))
    return out


def _set(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(data))
    parts = path.split(".")
    node = data
    for p in parts[:-1]:
        node = node[p]
    node[parts[-1]] = value
    return data


def _perturbations(path: str, value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [not value]
    if path.endswith("dataflow"):
        return [d for d in DATAFLOWS if d != value]
    if path.endswith("predictor"):
        return [p for p in ("2bit", "static_taken") if p != value]
    if path.endswith("tile_schedule"):
        return [p for p in TILE_SCHEDULES if p != value]
    if path.endswith("host_io"):
        return [p for p in ("dram", "l2") if p != value]
    if value is None:  # thermal.initial_c: start hot
        return [90.0, 60.0]
    # a capacity matters only when something does not fit; a bandwidth only when it
    # binds: the tenfold and millionfold cuts reach those regimes on small workloads,
    # and a 10,000-fold cost makes a unit bind that a wide device hides under memory
    if isinstance(value, int):
        return [
            value * 2,
            value // 2,
            value + 1,
            value - 1,
            value * 10,
            value // 10,
            value * 1e-6,
            value * 10000,
        ]  # (value * 1e-6 is for float fields written as ints)
    if isinstance(value, float):
        return [
            value * 2,
            value / 2,
            value + 1.0,
            value - 1.0,
            value / 10,
            value * 1e-6,
            value * 10000,
        ]
    return []


def _outputs(spec: DeviceSpec) -> Iterator[str]:
    """The JSON report of each workload in turn (``unsupported`` when ``spec`` cannot run
    it, e.g. a precision its array lacks)."""
    for name, kw in WORKLOADS:
        s = spec
        if name == "hot":
            hot = spec.thermal.throttle_c + _HOT_MARGIN_C
            s = load_spec(_set(to_mapping(spec), "thermal.initial_c", hot))
            name = "gemm"
        try:
            work = name if isinstance(name, str) else name()
            yield wia_hw.run(work, device=s, **kw).to_json(indent=None)
        except wia_hw.WiaError:
            yield "unsupported"


#: Fields that act only when another allows them: checked with that other field set so
#: (on both sides of the comparison). Operand loads overlap only on engines to carry
#: them, so ``dma.loads_in_flight`` is checked with four engines.
ENABLED_BY: dict[str, tuple[str, Any]] = {"dma.loads_in_flight": ("dma.engines_per_core", 4)}


@pytest.mark.parametrize("spec_name", _device_specs())
def test_every_spec_field_changes_an_output_or_is_metadata(spec_name: str) -> None:
    spec = load_spec(spec_name)
    assert isinstance(spec, DeviceSpec)
    bases: dict[str | None, tuple[dict[str, Any], list[str], Iterator[str]]] = {
        None: (to_mapping(spec), [], _outputs(spec))
    }
    dead = []
    for path, value in _leaves(spec):
        if path in METADATA_FIELDS:
            continue
        if path not in bases and path in ENABLED_BY:
            enabler, on = ENABLED_BY[path]
            data = _set(bases[None][0], enabler, on)
            bases[path] = (data, [], _outputs(load_spec(data)))
        base, reference, ref_runs = bases[path if path in ENABLED_BY else None]
        live = False
        for new in _perturbations(path, value):
            try:
                variant = load_spec(_set(base, path, new))
            except SpecError:
                continue  # not a valid value for this field: next one
            for i, got in enumerate(_outputs(variant)):
                if i == len(reference):
                    reference.append(next(ref_runs))
                if got != reference[i]:
                    live = True
                    break
            if live:
                break
        if not live:
            dead.append(path)
    assert dead == [], f"{spec_name}: fields that change no output: {dead}"


def test_energy_lists_exactly_the_array_precisions() -> None:
    with pytest.raises(
        SpecError,
        match=r"energy\.pj_per_mac\.fp32: the array does not "
        r"support fp32 \(supported: fp16, bf16, int8\)",
    ):
        load_spec("wia-edge", {"energy.pj_per_mac.fp32": 2.3})
    data = to_mapping(load_spec("wia-npu"))
    del data["energy"]["pj_per_mac"]["int8"]
    with pytest.raises(
        SpecError,
        match=r"energy\.pj_per_mac: missing int8 \(the array "
        r"supports it\)",
    ):
        load_spec(data)
