"""Hardware counters: one enum of identities, one record type.

The seed's counter set (``WIA_COUNTER_CYCLES`` ... ``WIA_COUNTER_BRANCH_MISPREDICTS``)
plus what a microarchitect needs beside it: hits and misses per cache level, bytes per
level, MACs per precision, stall cycles by cause, energy. Every emulator unit increments
the counters it owns where the event happens; profilers read deltas
(:meth:`Counters.delta`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .enums import NamedEnum

__all__ = ["Counter", "Counters", "LEVELS", "PRECISIONS", "STALL_CAUSES"]

#: Memory levels, innermost first.
LEVELS = ("l1", "l2", "hbm")
#: Compute precisions of the systolic array.
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
#: Why a unit waited: operands not yet in L1 (memory), a previous kernel or tile not
#: finished (dependency), clock throttled above the thermal limit (thermal).
STALL_CAUSES = ("memory", "dependency", "thermal", "launch")


class Counter(NamedEnum):
    """Counter identities. Members also accept their lower-case name: ``Counter("flops")``."""

    CYCLES = "cycles"
    INSTRUCTIONS = "instructions"
    CACHE_MISSES = "cache_misses"
    CACHE_HITS = "cache_hits"
    BANDWIDTH = "bandwidth"  # bytes moved at each memory level
    FLOPS = "flops"
    MACS = "macs"
    BRANCH_MISPREDICTS = "branch_mispredicts"
    BUSY_CYCLES = "busy_cycles"  # cycles in which the array performs MACs
    STALL_CYCLES = "stall_cycles"
    ENERGY = "energy"


def _levels() -> dict[str, int]:
    return dict.fromkeys(LEVELS, 0)


@dataclass
class Counters:
    """A snapshot (or delta) of every hardware counter of a device.

    Scalar fields are totals; the dict fields break them down. Invariants (tested):
    ``flops == 2 * macs`` for array work plus vector FLOPs, ``hits + misses ==
    accesses`` at every level, ``cache_misses == sum(misses.values())``.
    """

    cycles: int = 0
    instructions: int = 0
    branches: int = 0
    branch_mispredicts: int = 0
    flops: int = 0
    array_flops: int = 0
    vector_flops: int = 0
    macs: int = 0
    busy_cycles: int = 0
    macs_by_precision: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PRECISIONS, 0))
    hits: dict[str, int] = field(default_factory=_levels)
    misses: dict[str, int] = field(default_factory=_levels)
    bytes: dict[str, int] = field(default_factory=_levels)
    stall_cycles: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STALL_CAUSES, 0))
    energy_pj: float = 0.0

    # -- the seed's counter names as read-only views ---------------------------------
    @property
    def cache_misses(self) -> int:
        """Misses summed over the cache levels (L1 and L2)."""
        return self.misses["l1"] + self.misses["l2"]

    @property
    def cache_hits(self) -> int:
        return self.hits["l1"] + self.hits["l2"]

    @property
    def bandwidth(self) -> dict[str, int]:
        """Bytes moved at each level (divide by time for GB/s)."""
        return dict(self.bytes)

    @property
    def energy_j(self) -> float:
        return self.energy_pj * 1e-12

    def accesses(self, level: str) -> int:
        return self.hits[level] + self.misses[level]

    def get(self, counter: Counter | str) -> Any:
        """The value of one counter identity (``Counter.BANDWIDTH`` gives bytes per level)."""
        c = Counter(counter)
        return {
            Counter.CYCLES: self.cycles,
            Counter.INSTRUCTIONS: self.instructions,
            Counter.CACHE_MISSES: self.cache_misses,
            Counter.CACHE_HITS: self.cache_hits,
            Counter.BANDWIDTH: self.bandwidth,
            Counter.FLOPS: self.flops,
            Counter.MACS: self.macs,
            Counter.BRANCH_MISPREDICTS: self.branch_mispredicts,
            Counter.BUSY_CYCLES: self.busy_cycles,
            Counter.STALL_CYCLES: dict(self.stall_cycles),
            Counter.ENERGY: self.energy_pj,
        }[c]

    def copy(self) -> Counters:
        return Counters(
            **{
                f.name: (dict(v) if isinstance(v := getattr(self, f.name), dict) else v)
                for f in fields(self)
            }
        )

    def add(self, other: Counters) -> None:
        """Add ``other`` into this record, field by field."""
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, dict):
                for k, v in b.items():
                    a[k] = a.get(k, 0) + v
            else:
                setattr(self, f.name, a + b)

    def delta(self, before: Counters) -> Counters:
        """``self - before``, field by field (what happened between two snapshots)."""
        out = self.copy()
        for f in fields(self):
            a, b = getattr(out, f.name), getattr(before, f.name)
            if isinstance(a, dict):
                for k in a:
                    a[k] -= b.get(k, 0)
            else:
                setattr(out, f.name, a - b)
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = dict(v) if isinstance(v, dict) else v
        d["cache_misses"] = self.cache_misses
        d["cache_hits"] = self.cache_hits
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Counters:
        names = {f.name for f in fields(cls)}
        return cls(
            **{k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items() if k in names}
        )
