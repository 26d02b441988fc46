"""Derived metrics: every figure a report prints, as a formula over raw counters.

One place for the formulas (the report, :func:`profile_kernel` and the roofline use
them); each takes the raw numbers a report stores, so a reader can recompute any
figure from the report's own counters:

* ``duration_ms = cycles / (clock_ghz * 1e6)``
* ``compute_utilization = 100 * flop_count / (cycles * 2 * peak_macs_per_cycle[precision])``
* ``memory_bandwidth_gbs = bytes.hbm / (duration_ms * 1e-3) / 1e9``
* ``l1_cache_hit_rate = 100 * hits.l1 / (hits.l1 + misses.l1)`` (``None`` without accesses)
* ``occupancy = 100 * pe_mapping * core_balance`` with ``pe_mapping`` the share of the
  units' issue cycles that do useful work, ``compute floor / pipeline floor`` of the
  bound model (:mod:`._bounds`: the array's fill and drain of short passes and the PEs a
  small tile leaves unmapped count against it; for a vector kernel, the lanes its tiles'
  last issues leave empty), or ``macs / slot_macs`` for a kernel without unit floors,
  and ``core_balance = sum(core_busy_cycles) / (cores * cycles)`` (the share of core
  time the cores are busy, so idle cores and load imbalance count)
* ``arithmetic_intensity = flop_count / bytes.hbm`` (FLOP per HBM byte; per level with
  that level's bytes)
* ``power_w = energy_pj * 1e-12 / (cycles / (clock_ghz * 1e9))``
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..emulator.config import DeviceSpec, blended_peak

__all__ = [
    "DeviceInfo",
    "fmt_ai",
    "duration_ms",
    "compute_utilization",
    "mix_utilization",
    "bandwidth_gbs",
    "hit_rate",
    "occupancy_parts",
    "occupancy",
    "arithmetic_intensity",
    "LEVEL_NAMES",
]

LEVEL_NAMES = {"l1": "L1", "l2": "L2", "hbm": "HBM"}


@dataclass(frozen=True)
class DeviceInfo:
    """The figures of a device a report needs to derive its metrics (stored in it)."""

    name: str
    clock_ghz: float
    cores: int
    array_rows: int
    array_cols: int
    dataflow: str
    vector_lanes: int
    #: the array overlaps one pass's fill and drain with the next's (``pipelined``)
    array_pipelined: bool = False
    peak_macs_per_cycle: Mapping[str, float] = field(default_factory=dict)
    hbm_bandwidth_gbs: float = 0.0
    hbm_channels: int = 1
    l2_bandwidth_gbs: float = 0.0
    l1_bandwidth_gbs: float = 0.0  # per core
    l1_size_bytes: int = 0  # per core
    l2_size_bytes: int = 0
    hbm_size_bytes: int = 0

    @classmethod
    def from_spec(cls, spec: DeviceSpec) -> DeviceInfo:
        m = spec.memory
        return cls(
            name=spec.name,
            clock_ghz=spec.clock_ghz,
            cores=spec.compute.cores,
            array_rows=spec.compute.array.rows,
            array_cols=spec.compute.array.cols,
            dataflow=spec.compute.array.dataflow,
            vector_lanes=spec.compute.vector.lanes,
            array_pipelined=bool(getattr(spec.compute.array, "pipelined", False)),
            peak_macs_per_cycle={
                p: float(spec.peak_macs_per_cycle(p)) for p in spec.compute.array.macs_per_pe_cycle
            },
            hbm_bandwidth_gbs=m.hbm.bandwidth_gbs,
            hbm_channels=m.hbm.channels,
            l2_bandwidth_gbs=m.l2.bandwidth_gbs,
            l1_bandwidth_gbs=m.l1.bandwidth_gbs,
            l1_size_bytes=m.l1.size_bytes,
            l2_size_bytes=m.l2.size_bytes,
            hbm_size_bytes=m.hbm.size_bytes,
        )

    @property
    def peak_bandwidth_gbs(self) -> float:
        """HBM bandwidth, the seed's ``peak_bandwidth_gbs``."""
        return self.hbm_bandwidth_gbs

    def level_bandwidth_gbs(self, level: str) -> float:
        """Aggregate bandwidth of a level (L1: all cores' ports together)."""
        return {
            "l1": self.l1_bandwidth_gbs * self.cores,
            "l2": self.l2_bandwidth_gbs,
            "hbm": self.hbm_bandwidth_gbs,
        }[level]

    def peak_flops(self, precision: str = "fp16") -> float:
        """Peak FLOP/s of the arrays at ``precision`` (0 when unsupported)."""
        return 2.0 * self.peak_macs_per_cycle.get(precision, 0.0) * self.clock_ghz * 1e9

    @property
    def vector_peak_flops(self) -> float:
        """Peak FLOP/s of the vector units: one operation per lane per cycle."""
        return float(self.cores * self.vector_lanes) * self.clock_ghz * 1e9

    def peak_flops_per_cycle(self, precision: str = "fp16") -> float:
        return 2.0 * self.peak_macs_per_cycle.get(precision, 0.0)

    def ridge_point(self, precision: str = "fp16", level: str = "hbm") -> float:
        """FLOP/byte where the ``level`` bandwidth ceiling meets the compute ceiling."""
        bw = self.level_bandwidth_gbs(level) * 1e9
        return self.peak_flops(precision) / bw if bw else math.inf

    def cycles_to_ms(self, cycles: float) -> float:
        return cycles / (self.clock_ghz * 1e6)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["peak_macs_per_cycle"] = dict(self.peak_macs_per_cycle)
        d["peak_flops"] = {p: self.peak_flops(p) for p in self.peak_macs_per_cycle}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceInfo:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


def fmt_ai(x: float) -> str:
    """An intensity as the seed writes it: ``45``, ``0.25``, ``1638`` (3 significant
    digits, never in exponent form)."""
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}" if x >= 1e-3 else f"{x:.1e}"


def duration_ms(cycles: int, dev: DeviceInfo) -> float:
    return dev.cycles_to_ms(cycles)


def compute_utilization(flop_count: int, cycles: int, precision: str, dev: DeviceInfo) -> float:
    """Percent of the array peak at ``precision`` (0 for an unsupported precision)."""
    peak = dev.peak_flops_per_cycle(precision)
    return 100.0 * flop_count / (cycles * peak) if cycles and peak else 0.0


def mix_utilization(flops_by_precision: Mapping[str, float], cycles: int, dev: DeviceInfo) -> float:
    """Percent of the arrays' peak for a mix of work at several precisions: the parts'
    ideal cycles (each at its own precision's peak) over ``cycles``, so never above 100%
    for a run of the mix (``DeviceSpec.blended_peak_flops``); 0 when some part's
    precision has no peak."""
    peak = blended_peak(flops_by_precision, dev.peak_flops_per_cycle)
    work = sum(w for w in flops_by_precision.values() if w > 0)
    return 100.0 * work / (peak * cycles) if cycles and peak else 0.0


def bandwidth_gbs(nbytes: int, cycles: int, dev: DeviceInfo) -> float:
    ms = dev.cycles_to_ms(cycles)
    return nbytes / (ms * 1e-3) / 1e9 if ms else 0.0


def hit_rate(hits: int, misses: int) -> float | None:
    """Percent of accesses that hit; ``None`` when there were none."""
    acc = hits + misses
    return 100.0 * hits / acc if acc else None


def occupancy_parts(
    macs: int, slot_macs: int, core_busy_cycles: list[int], cycles: int, cores: int
) -> tuple[float, float]:
    """``(macs / slot_macs, core_balance)``, both in [0, 1]: the mapping part without the
    fill and drain (the bound model replaces it when it knows the kernel's unit floors;
    see the module docstring)."""
    mapping = macs / slot_macs if slot_macs else 1.0
    balance = sum(core_busy_cycles) / (cores * cycles) if cycles and cores else 0.0
    return mapping, balance


def occupancy(
    macs: int, slot_macs: int, core_busy_cycles: list[int], cycles: int, cores: int
) -> float:
    m, b = occupancy_parts(macs, slot_macs, core_busy_cycles, cycles, cores)
    return 100.0 * m * b


def arithmetic_intensity(flop_count: int, nbytes: int) -> float | None:
    """FLOP per byte; ``None`` when no byte moved (infinitely compute-heavy)."""
    return flop_count / nbytes if nbytes else None
