"""Raw records a profiling session keeps: runs, ops, kernels, samples. Plain data;
every derived figure is computed from them by :mod:`._metrics`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..emulator.counters import Counter, Counters
from ._callsite import Frame

__all__ = ["KernelStats", "OpSpan", "RunInfo", "Sample", "capture_counters", "COUNTER_FIELDS"]

#: The fields of :class:`~wia_hw.Counters` each counter identity reads. A cache-miss
#: counter also counts the accesses (hits), so a hit rate can be derived.
COUNTER_FIELDS: dict[Counter, tuple[str, ...]] = {
    Counter.CYCLES: ("cycles",),
    Counter.INSTRUCTIONS: ("instructions",),
    Counter.CACHE_MISSES: ("misses", "hits"),
    Counter.CACHE_HITS: ("hits",),
    Counter.BANDWIDTH: ("bytes",),
    Counter.FLOPS: ("flops", "array_flops", "vector_flops"),
    Counter.MACS: ("macs", "macs_by_precision"),
    Counter.BRANCH_MISPREDICTS: ("branches", "branch_mispredicts"),
    Counter.BUSY_CYCLES: ("busy_cycles",),
    Counter.STALL_CYCLES: ("stall_cycles",),
    Counter.ENERGY: ("energy_pj",),
}


#: The fields of :class:`~wia_hw.Counters` that hold a dict (per level, cause, precision).


def capture_counters(c: Counters, fields_: tuple[str, ...]) -> dict[str, Any]:
    """The named fields of ``c``, in ``fields_``'s order. Runs once per kernel in the
    counter modes: it reads the instance dict directly (every name in ``fields_`` is a
    dataclass field of :class:`~wia_hw.Counters`) and copies nothing: a kernel
    record's counters are a delta the emulator made for it and never changes, so its
    dicts (``bytes``, ``hits``, ...) are shared, read-only, with the record."""
    d = vars(c)
    return {f: d[f] for f in fields_}


@dataclass
class RunInfo:
    """One ``ctx.run`` inside the session: the workload, where the user called it from,
    its interval (``end_cycle`` after the final write-back) and the write-back cycles."""

    index: int
    workload: str
    params: dict[str, Any]
    start_cycle: int
    end_cycle: int = 0
    writeback_cycles: int = 0
    stack: tuple[Frame, ...] = ()

    @property
    def callsite(self) -> Frame | None:
        return self.stack[0] if self.stack else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "workload": self.workload,
            "params": self.params,
            "start_cycle": self.start_cycle,
            "end_cycle": self.end_cycle,
            "writeback_cycles": self.writeback_cycles,
            "stack": [f.to_dict() for f in self.stack],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunInfo:
        return cls(
            d["index"],
            d["workload"],
            d["params"],
            d["start_cycle"],
            d["end_cycle"],
            d["writeback_cycles"],
            tuple(Frame.from_dict(f) for f in d["stack"]),
        )


@dataclass
class OpSpan:
    """One graph op: its interval and the indices of its kernels in the report."""

    name: str
    group: str
    kind: str
    run: int
    start_cycle: int
    end_cycle: int
    kernels: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpSpan:
        return cls(**d)


@dataclass
class KernelStats:
    """One kernel launch: identity, interval, static work, mapping facts, and the
    counters captured for it (``counters``: field -> value, ``None`` when the mode reads
    no counters). ``ideal_cycles``: the cycles its work takes on its units at full rate
    (array: ``macs / peak MACs per cycle``; vector: ``elements x cycles per element /
    (lanes x cores)``), the kernel's compute ceiling; ``None`` when unknown.
    ``compulsory_bytes``: what it must read and write at least once.
    ``unit_floors``: its pipeline and parallelism floors (:class:`._bounds.UnitFloors`
    as a dict; ``None`` when unknown). ``dirtied_bytes``: L2 bytes it left dirty (its
    write-backs, done later); ``writeback_bytes``: write-backs of dirty L2 blocks (any
    kernel's) during it, ``eager_writeback_bytes`` the part of them written eagerly in
    its idle time (background traffic, not the kernel's demand). ``op_class``: a vector
    kernel's op class (``softmax``, ...)."""

    index: int
    name: str
    op: str
    group: str
    kind: str
    provider: str
    precision: str
    run: int
    start_cycle: int
    end_cycle: int
    flop_count: int
    macs: int
    slot_macs: int
    tiles: int
    cores_used: int
    core_busy_cycles: list[int]
    frequency_factor: float = 1.0
    ideal_cycles: float | None = None
    compulsory_bytes: int = 0
    counters: dict[str, Any] | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    unit_floors: dict[str, float] | None = None
    dirtied_bytes: int = 0
    writeback_bytes: int = 0
    eager_writeback_bytes: int = 0
    op_class: str | None = None

    @property
    def cycles(self) -> int:
        return self.end_cycle - self.start_cycle

    def counter(self, name: str, default: Any = None) -> Any:
        return default if self.counters is None else self.counters.get(name, default)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["core_busy_cycles"] = list(self.core_busy_cycles)
        d["unit_floors"] = None if self.unit_floors is None else dict(self.unit_floors)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelStats:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Sample:
    """One sample of the device state at ``cycle``, standing for ``weight_cycles`` of
    time from there. Per core: the kernel it runs (``None``: idle), whether it computes
    at that cycle, and its DMA queue (an operand load in flight + result stores waiting).
    ``hbm_backlog_cycles``: work queued on the HBM channels, summed over channels;
    ``l2_backlog_cycles``: work queued on the L2 port."""

    cycle: int
    weight_cycles: int
    kernels: list[str | None]
    computing: list[bool]
    dma_queue: list[int]
    hbm_backlog_cycles: int
    l2_backlog_cycles: int

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        return cls(**d)
