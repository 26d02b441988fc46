"""Memory profiling (the seed's sections 8.4 and 8.4.1).

A :class:`MemoryProfilingSession` listens to the context's device allocator
(:mod:`wia_hw.emulator.allocator`) and records every allocation and free with the
device cycle it happened at, what it holds (weight, input, activation, workspace, or a
user buffer) and the Python call stack of the user code that caused it. Units are SI:
``GB`` = 1e9 bytes, ``MB`` = 1e6, ``KB`` = 1e3.

Leaks: a block allocated during the session and still allocated when it stops. The
runtime frees all of a run's memory at the end of the run, so leaks are user buffers
(``ctx.allocate`` without ``ctx.free``); ``unreachable`` says the user also dropped the
buffer object, so nothing can free it any more.

Fragmentation (:func:`analyze_fragmentation`): over the free ranges of the reserved
memory (:meth:`~wia_hw.emulator.allocator.CachingAllocator.free_ranges`),
``external_frag_percent = 100 * (1 - largest_free_range / total_free)``: the share of
free memory that a request as large as all of it could not use.

A figure whose tracking flag is off (:class:`MemoryProfilingConfig`) is ``None``, never
0 (JSON ``null``; printed ``n/a (not tracked: <flag>=False)``):
``peak_usage_tracking=False`` leaves the peak unknown, ``detect_fragmentation=False``
the fragmentation (and :func:`analyze_fragmentation` refuses the report),
``track_allocations=False`` the allocation count and bytes, the sites and the leaks,
``track_deallocations=False`` the free count, ``detect_leaks=False`` the leaks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..emulator.allocator import AllocEvent
from ..emulator.errors import WiaError
from ._callsite import Frame, user_stack

__all__ = [
    "MemoryProfilingConfig",
    "MemoryProfilingSession",
    "MemoryProfileReport",
    "AllocationSite",
    "MemoryLeak",
    "FragmentationAnalysis",
    "start_memory_profiling",
    "stop_memory_profiling",
    "analyze_fragmentation",
    "plot_memory_timeline",
    "memory_timeline_figure",
    "external_fragmentation",
    "FRAGMENTATION_SUGGESTIONS",
    "UNTRACKED_BY",
]

GB, MB, KB = 1e9, 1e6, 1e3
#: The seed's suggestions when external fragmentation exceeds 20 %.
FRAGMENTATION_SUGGESTIONS = (
    "Use memory pooling for frequently allocated sizes",
    "Implement allocation size classes",
    "Periodically defragment during idle periods",
)
FRAGMENTATION_THRESHOLD_PCT = 20.0

#: The :class:`MemoryProfileReport` figures each tracking flag of
#: :class:`MemoryProfilingConfig` records: with the flag off they are ``None``.
UNTRACKED_BY: dict[str, tuple[str, ...]] = {
    "total_allocated_gb": ("track_allocations",),
    "num_allocations": ("track_allocations",),
    "top_sites": ("track_allocations",),
    "num_deallocations": ("track_deallocations",),
    "num_leaks": ("detect_leaks", "track_allocations"),
    "leaks": ("detect_leaks", "track_allocations"),
    "peak_usage_gb": ("peak_usage_tracking",),
    "peak_cycle": ("peak_usage_tracking",),
    "fragmentation_percent": ("detect_fragmentation",),
    "free_ranges_end": ("detect_fragmentation",),
    "peak_fragmentation_percent": ("detect_fragmentation", "peak_usage_tracking"),
    "free_ranges_peak": ("detect_fragmentation", "peak_usage_tracking"),
}


@dataclass(frozen=True, kw_only=True)
class MemoryProfilingConfig:
    """The seed's ``wia_memory_profiling_config_t`` (plus ``top_sites``, how many sites
    the report ranks, ``stack_depth``, how many user frames a stack keeps, and
    ``keep_library_frames``: keep frames of wia-hw, the standard library and installed
    packages, skipped by default)."""

    track_allocations: bool = True
    track_deallocations: bool = True
    track_call_stacks: bool = True
    detect_leaks: bool = True
    detect_fragmentation: bool = True
    peak_usage_tracking: bool = True
    top_sites: int = 10
    stack_depth: int = 16
    keep_library_frames: bool = False

    def __post_init__(self) -> None:
        for n in (
            "track_allocations",
            "track_deallocations",
            "track_call_stacks",
            "detect_leaks",
            "detect_fragmentation",
            "peak_usage_tracking",
            "keep_library_frames",
        ):
            if not isinstance(getattr(self, n), bool):
                raise TypeError(f"{n} must be a bool, got {getattr(self, n)!r}")
        for n in ("top_sites", "stack_depth"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{n} must be a positive integer, got {v!r}")


@dataclass(frozen=True)
class AllocationSite:
    """The seed's ``wia_allocation_site_t``: where user code allocated (``file``,
    ``line``, ``function``), ``description`` of what (``activations of bert-large``,
    ``ctx.allocate('kv')``), ``count`` allocations totalling ``total_size_gb``, the
    device cycles those calls cost (``device_cycles``; 0 for the runtime's planned
    allocations, which the device does not wait for), and the user ``stack``."""

    file: str
    line: int
    function: str
    description: str
    count: int
    total_size_gb: float
    device_cycles: int = 0
    stack: tuple[Frame, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["stack"] = [f.to_dict() for f in self.stack]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AllocationSite:
        d = dict(d)
        d["stack"] = tuple(Frame.from_dict(f) for f in d["stack"])
        return cls(**d)


@dataclass(frozen=True)
class MemoryLeak:
    """The seed's ``wia_memory_leak_t``: ``size_mb`` still allocated at the end,
    ``allocation_site`` (file and line), ``stack_trace`` (``stack_depth`` lines of the
    user's Python stack, innermost first), the block's ``address``, ``tag``, the cycle it
    was allocated at, and ``unreachable`` (the user dropped the buffer object too)."""

    size_mb: float
    allocation_site: AllocationSite
    stack_trace: tuple[str, ...]
    address: int
    tag: str
    allocated_cycle: int
    unreachable: bool

    @property
    def stack_depth(self) -> int:
        return len(self.stack_trace)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["allocation_site"] = self.allocation_site.to_dict()
        d["stack_trace"] = list(self.stack_trace)
        d["stack_depth"] = self.stack_depth
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryLeak:
        d = {k: v for k, v in d.items() if k != "stack_depth"}
        d["allocation_site"] = AllocationSite.from_dict(d["allocation_site"])
        d["stack_trace"] = tuple(d["stack_trace"])
        return cls(**d)


@dataclass(frozen=True)
class FragmentationAnalysis:
    """The seed's ``wia_fragmentation_analysis_t``; ``suggestions`` are the seed's three
    when ``external_frag_percent`` exceeds 20 %."""

    external_frag_percent: float
    largest_free_block_mb: float
    avg_free_block_kb: float
    total_free_gb: float
    num_free_blocks: int
    suggestions: tuple[str, ...] = ()

    def format(self) -> str:
        lines = [
            "Fragmentation Analysis:",
            f"  External fragmentation: {self.external_frag_percent:.1f}%",
            f"  Largest free block: {self.largest_free_block_mb:.2f} MB",
            f"  Average free block: {self.avg_free_block_kb:.2f} KB",
            f"  Total free memory: {self.total_free_gb:.2f} GB",
        ]
        if self.suggestions:
            lines += ["", "Suggestions:"] + [f"  - {s}" for s in self.suggestions]
        return "\n".join(lines)


def external_fragmentation(free_ranges: list[int]) -> float:
    """``100 * (1 - largest / total)`` over free range sizes (0 with no free memory)."""
    total = sum(free_ranges)
    return 100.0 * (1.0 - max(free_ranges) / total) if total else 0.0


# event tuple: (cycle, kind, id, address, size, requested, what, name, workload,
#               stack index, device cycles)
_E_CYCLE, _E_KIND, _E_ID, _E_ADDR, _E_SIZE, _E_REQ, _E_WHAT, _E_NAME, _E_WL, _E_STACK, _E_COST = (
    range(11)
)


@dataclass
class MemoryProfileReport:
    """The seed's ``wia_memory_profile_report_t``.

    Summary fields (GB/MB SI): ``total_allocated_gb`` (bytes of every allocation made
    in the session, after rounding), ``peak_usage_gb`` (most bytes allocated at once,
    including what was allocated before the session), ``current_usage_gb`` (allocated at
    the end), ``fragmentation_percent`` (external fragmentation at the end;
    ``peak_fragmentation_percent`` at the peak), counts, ``active_buffers`` (blocks
    allocated at the end), ``top_sites``, ``leaks``.

    Raw records: ``events`` (one tuple per allocator call: cycle, ``malloc``/``free``/
    ``segment_alloc``/``segment_free``, block id, address, size, requested bytes, what it
    holds, its name, workload, index into ``stacks``, device cycles), ``stacks``,
    ``baseline_bytes`` and ``baseline_reserved_bytes`` (at the start), the allocator's
    ``allocator_config`` and ``capacity_bytes``,
    ``free_ranges_end``/``free_ranges_peak`` (free range sizes at the end / at the
    peak), ``reserved_bytes_end``. Every summary field is a formula over these.
    A figure whose tracking flag was off is ``None`` (:data:`UNTRACKED_BY`;
    :meth:`untracked` names the flag).
    """

    total_allocated_gb: float | None
    peak_usage_gb: float | None
    current_usage_gb: float
    fragmentation_percent: float | None
    num_allocations: int | None
    num_deallocations: int | None
    active_buffers: int
    num_leaks: int | None
    top_sites: list[AllocationSite] | None
    leaks: list[MemoryLeak] | None
    start_cycle: int = 0
    end_cycle: int = 0
    clock_ghz: float = 1.0
    peak_cycle: int | None = 0
    peak_fragmentation_percent: float | None = 0.0
    reserved_bytes_end: int = 0
    peak_reserved_bytes: int = 0
    baseline_bytes: int = 0
    baseline_reserved_bytes: int = 0
    allocator_device_cycles: int = 0
    free_ranges_end: list[int] | None = field(default_factory=list)
    free_ranges_peak: list[int] | None = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list, repr=False)
    stacks: list[tuple[Frame, ...]] = field(default_factory=list, repr=False)
    config: MemoryProfilingConfig = field(default_factory=MemoryProfilingConfig)
    pooling: bool = False
    allocator_config: dict[str, Any] = field(default_factory=dict)
    capacity_bytes: int = 0

    @property
    def num_top_sites(self) -> int | None:
        return None if self.top_sites is None else len(self.top_sites)

    def untracked(self, name: str) -> str | None:
        """``"<flag>=False"`` when figure ``name`` was not tracked (its flag in
        :data:`UNTRACKED_BY` was off in the session's config), else ``None``."""
        for flag in UNTRACKED_BY.get(name, ()):
            if not getattr(self.config, flag):
                return f"{flag}=False"
        return None

    def shown(self, name: str, text: str) -> str:
        """``text`` for a tracked figure ``name``, ``n/a (not tracked: <flag>=False)``
        for one whose flag was off."""
        why = self.untracked(name)
        return text if why is None else f"n/a (not tracked: {why})"

    def timeline(self) -> dict[str, list[Any]]:
        """``cycle``, ``allocated`` and ``reserved`` bytes after every event, and the
        allocated bytes by what they hold (``by_kind``), from ``events``."""
        alloc, res = self.baseline_bytes, self.baseline_reserved_bytes
        kinds = ("weight", "input", "activation", "workspace", "user", "other")
        cur = dict.fromkeys(kinds, 0)
        cur["other"] = alloc
        sizes: dict[int, tuple[int, str]] = {}
        out: dict[str, Any] = {
            "cycle": [self.start_cycle],
            "allocated": [alloc],
            "reserved": [res],
            "by_kind": {k: [cur[k]] for k in kinds},
        }
        for e in self.events:
            k = e[_E_KIND]
            if k == "malloc":
                what = e[_E_WHAT] if e[_E_WHAT] in cur else "other"
                alloc += e[_E_SIZE]
                cur[what] += e[_E_SIZE]
                sizes[e[_E_ID]] = (e[_E_SIZE], what)
            elif k == "free":
                size, what = sizes.pop(e[_E_ID], (e[_E_SIZE], "other"))
                alloc -= size
                cur[what] -= size
            elif k == "segment_alloc":
                res += e[_E_SIZE]
            else:
                res -= e[_E_SIZE]
            out["cycle"].append(e[_E_CYCLE])
            out["allocated"].append(alloc)
            out["reserved"].append(res)
            for kk in kinds:
                out["by_kind"][kk].append(cur[kk])
        return out

    def format(self) -> str:
        """The seed's printf block: summary, top sites, leaks with their stacks."""
        f = self.shown
        lines = [
            "Memory Profile Summary:",
            "  Total Allocated: "
            + f("total_allocated_gb", f"{self.total_allocated_gb or 0.0:.2f} GB"),
            "  Peak Usage: " + f("peak_usage_gb", f"{self.peak_usage_gb or 0.0:.2f} GB"),
            f"  Current Usage: {self.current_usage_gb:.2f} GB",
            "  Fragmentation: "
            + f("fragmentation_percent", f"{self.fragmentation_percent or 0.0:.1f}%"),
            "  Allocations: " + f("num_allocations", str(self.num_allocations)),
            "  Deallocations: " + f("num_deallocations", str(self.num_deallocations)),
            f"  Active Buffers: {self.active_buffers}",
            "  Memory Leaks: " + f("num_leaks", str(self.num_leaks)),
            "",
            f"Top Allocation Sites: {f('top_sites', '')}".rstrip(),
        ]
        for i, s in enumerate(self.top_sites or ()):
            lines.append(
                f"  {i + 1}. {s.file}:{s.line} - {s.total_size_gb:.2f} GB ({s.description})"
            )
        lines += [
            "",
            f"Memory Leaks Detected: {f('leaks', '')}".rstrip(),
        ]
        for leak in self.leaks or ():
            lines.append(
                f"  Leaked {leak.size_mb:.2f} MB at {leak.allocation_site.file}:"
                f"{leak.allocation_site.line}"
            )
            lines.append("    Call stack:")
            lines += [f"      {t}" for t in leak.stack_trace]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = {
            k: v
            for k, v in vars(self).items()
            if k not in ("top_sites", "leaks", "events", "stacks", "config")
        }
        d["num_top_sites"] = self.num_top_sites
        d["top_sites"] = None if self.top_sites is None else [s.to_dict() for s in self.top_sites]
        d["leaks"] = None if self.leaks is None else [x.to_dict() for x in self.leaks]
        d["events"] = [list(e) for e in self.events]
        d["stacks"] = [[f.to_dict() for f in st] for st in self.stacks]
        d["config"] = dict(vars(self.config))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryProfileReport:
        d = dict(d)
        d.pop("num_top_sites", None)
        sites, leaks = d["top_sites"], d["leaks"]
        d["top_sites"] = None if sites is None else [AllocationSite.from_dict(s) for s in sites]
        d["leaks"] = None if leaks is None else [MemoryLeak.from_dict(x) for x in leaks]
        d["events"] = [tuple(e) for e in d["events"]]
        d["stacks"] = [tuple(Frame.from_dict(f) for f in st) for st in d["stacks"]]
        d["config"] = MemoryProfilingConfig(**d["config"])
        return cls(**d)


class MemoryProfilingSession:
    """The seed's ``wia_memory_profiling_session_t``: open from
    :func:`start_memory_profiling` until :func:`stop_memory_profiling` (or use it as a
    context manager; the report is then ``session.report``)."""

    def __init__(self, ctx: Any, cfg: MemoryProfilingConfig | None = None) -> None:
        if cfg is None:
            cfg = MemoryProfilingConfig()
        if not isinstance(cfg, MemoryProfilingConfig):
            raise TypeError(f"cfg must be a MemoryProfilingConfig, got {type(cfg).__name__}")
        if not hasattr(ctx, "allocator"):
            raise TypeError(f"ctx must be a wia_hw Context, got {type(ctx).__name__}")
        self.ctx = ctx
        self.config = cfg
        self.report: MemoryProfileReport | None = None
        self._events: list[tuple[Any, ...]] = []
        self._stacks: list[tuple[Frame, ...]] = []
        self._stack_ids: dict[tuple[Frame, ...], int] = {}
        #: the user's stack of the ``ctx.run`` in progress, set by the profiling session
        #: (``None``: each allocation walks the stack itself)
        self.run_stack: tuple[Frame, ...] | None = None
        self._active = False

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> MemoryProfilingSession:
        if self._active:
            raise WiaError("this memory profiling session is already running")
        a = self.ctx.allocator
        self._start_cycle = self.ctx.device.now
        self._baseline = a.stats.allocated_bytes
        self._baseline_reserved = a.stats.reserved_bytes
        self._pre_existing = {b.id for b in a.live_blocks}
        self._alloc = self._peak = self._baseline
        self._peak_cycle = self._start_cycle
        self._peak_reserved = self._baseline_reserved
        cfg = self.config
        self._peak_ranges = (
            a.free_ranges() if cfg.detect_fragmentation and cfg.peak_usage_tracking else []
        )
        self._peak_pending = False
        self._device_cycles = 0
        a.listeners.append(self._on_event)
        a.before_free.append(self._take_peak_ranges)
        self._active = True
        return self

    def __enter__(self) -> MemoryProfilingSession:
        return self if self._active else self.start()

    def __exit__(self, *exc: object) -> None:
        if self._active:
            self.stop()

    # -- recording ---------------------------------------------------------------------
    def _stack_index(self, runtime: bool = False) -> int:
        """The index of the calling user code's stack; for an allocation the runtime
        makes inside a ``ctx.run`` (``runtime``), the stack the profiling session took at
        the run's start (:attr:`run_stack`: the same user frames, walked once per run
        instead of once per allocation)."""
        if not self.config.track_call_stacks:
            return -1
        st = self.run_stack if runtime else None
        if st is None:
            st = user_stack(
                self.config.stack_depth, keep_library_frames=self.config.keep_library_frames
            )
        idx = self._stack_ids.get(st)
        if idx is None:
            idx = self._stack_ids[st] = len(self._stacks)
            self._stacks.append(st)
        return idx

    def _take_peak_ranges(self) -> None:
        """The allocator's free ranges, as the peak left them (see :meth:`_on_event`)."""
        if self._peak_pending:
            self._peak_ranges = self.ctx.allocator.free_ranges()
            self._peak_pending = False

    def _on_event(self, ev: AllocEvent) -> None:
        info = ev.info
        what = getattr(info, "kind", ev.tag or "other")
        sync = what == "user"
        cost = ev.cycles if sync else 0
        self._device_cycles += cost
        if ev.kind == "malloc":
            self._alloc = ev.allocated_bytes
            if self.config.track_allocations:
                self._events.append(
                    (
                        ev.now,
                        "malloc",
                        ev.block_id,
                        ev.address,
                        ev.size,
                        ev.requested,
                        what,
                        getattr(info, "name", ev.tag),
                        getattr(info, "workload", ""),
                        self._stack_index(runtime=not sync),
                        cost,
                    )
                )
            if self.config.peak_usage_tracking and ev.allocated_bytes > self._peak:
                self._peak, self._peak_cycle = ev.allocated_bytes, ev.now
                # the free ranges at the peak, taken when they are about to change (a
                # free or a cache release; a later malloc makes a new peak): one walk
                # per peak that stands, not one per malloc that raises it
                self._peak_pending = self.config.detect_fragmentation
        elif ev.kind == "free":
            self._alloc = ev.allocated_bytes
            if self.config.track_deallocations:
                self._events.append(
                    (
                        ev.now,
                        "free",
                        ev.block_id,
                        ev.address,
                        ev.size,
                        ev.requested,
                        what,
                        getattr(info, "name", ev.tag),
                        getattr(info, "workload", ""),
                        -1,
                        cost,
                    )
                )
        else:
            self._events.append(
                (ev.now, ev.kind, ev.block_id, ev.address, ev.size, 0, "", "", "", -1, 0)
            )
        self._peak_reserved = max(self._peak_reserved, ev.reserved_bytes)

    # -- the report --------------------------------------------------------------------
    def stop(self) -> MemoryProfileReport:
        if not self._active:
            raise WiaError("this memory profiling session is not running")
        a = self.ctx.allocator
        self._take_peak_ranges()
        a.listeners.remove(self._on_event)
        a.before_free.remove(self._take_peak_ranges)
        self._active = False
        cfg = self.config
        mallocs = [e for e in self._events if e[_E_KIND] == "malloc"]
        frees = [e for e in self._events if e[_E_KIND] == "free"]
        sites: dict[tuple[Any, ...], list[Any]] = {}
        site_of: dict[int, tuple[Any, ...]] = {}
        for e in mallocs:
            st = self._stacks[e[_E_STACK]] if e[_E_STACK] >= 0 else ()
            top = st[0] if st else Frame("<unknown>", 0, "<unknown>")
            key = (top.file, top.line, top.function, _describe(e))
            s = sites.setdefault(key, [0, 0, 0, st])
            s[0] += 1
            s[1] += e[_E_SIZE]
            s[2] += e[_E_COST]
            site_of[e[_E_ID]] = key
        for e in frees:  # a user free's cost belongs to its site
            key = site_of.get(e[_E_ID])
            if key is not None:
                sites[key][2] += e[_E_COST]

        def site(key: tuple[Any, ...]) -> AllocationSite:
            n, nb, cyc, st = sites[key]
            return AllocationSite(key[0], key[1], key[2], key[3], n, nb / GB, cyc, st)

        ranked = sorted(sites, key=lambda k: (-sites[k][1], k))
        top_sites = [site(k) for k in ranked[: cfg.top_sites]]
        leaks: list[MemoryLeak] = []
        live = a.live_blocks
        if cfg.detect_leaks:
            by_id = {e[_E_ID]: e for e in mallocs}
            for b in live:
                e = by_id.get(b.id)
                if e is None or b.id in self._pre_existing:
                    continue
                st = self._stacks[e[_E_STACK]] if e[_E_STACK] >= 0 else ()
                handle = getattr(b.info, "handle", None)
                leaks.append(
                    MemoryLeak(
                        size_mb=b.size / MB,
                        allocation_site=site(site_of[b.id]),
                        stack_trace=tuple(str(f) for f in st),
                        address=b.address,
                        tag=b.tag,
                        allocated_cycle=e[_E_CYCLE],
                        unreachable=handle is not None and handle() is None,
                    )
                )
        # a figure whose flag is off is unknown (None), not 0 (UNTRACKED_BY)
        frag, peak, allocs = (
            cfg.detect_fragmentation,
            cfg.peak_usage_tracking,
            cfg.track_allocations,
        )
        ranges = a.free_ranges() if frag else None
        self.report = MemoryProfileReport(
            total_allocated_gb=sum(e[_E_SIZE] for e in mallocs) / GB if allocs else None,
            peak_usage_gb=self._peak / GB if peak else None,
            current_usage_gb=a.stats.allocated_bytes / GB,
            fragmentation_percent=None if ranges is None else external_fragmentation(ranges),
            num_allocations=len(mallocs) if allocs else None,
            num_deallocations=len(frees) if cfg.track_deallocations else None,
            active_buffers=len(live),
            num_leaks=len(leaks) if cfg.detect_leaks and allocs else None,
            top_sites=top_sites if allocs else None,
            leaks=leaks if cfg.detect_leaks and allocs else None,
            start_cycle=self._start_cycle,
            end_cycle=self.ctx.device.now,
            clock_ghz=self.ctx.spec.clock_ghz,
            peak_cycle=self._peak_cycle if peak else None,
            peak_fragmentation_percent=external_fragmentation(self._peak_ranges)
            if frag and peak
            else None,
            reserved_bytes_end=a.stats.reserved_bytes,
            peak_reserved_bytes=self._peak_reserved,
            baseline_bytes=self._baseline,
            baseline_reserved_bytes=self._baseline_reserved,
            allocator_device_cycles=self._device_cycles,
            free_ranges_end=ranges,
            free_ranges_peak=list(self._peak_ranges) if frag and peak else None,
            events=self._events,
            stacks=self._stacks,
            config=cfg,
            pooling=a.config.pooling,
            allocator_config=dict(vars(a.config)),
            capacity_bytes=a.capacity_bytes,
        )
        return self.report


def _describe(e: tuple[Any, ...]) -> str:
    what, name, wl = e[_E_WHAT], e[_E_NAME], e[_E_WL]
    if what == "user":
        return f"ctx.allocate({name!r})"
    plural = {
        "activation": "activations",
        "weight": "weights",
        "input": "inputs",
        "workspace": "workspaces",
    }.get(what, what)
    return f"{plural} of {wl}" if wl else plural


def start_memory_profiling(
    ctx: Any, cfg: MemoryProfilingConfig | None = None
) -> MemoryProfilingSession:
    """Start recording ``ctx``'s device allocations (the seed's
    ``wia_start_memory_profiling``)."""
    return MemoryProfilingSession(ctx, cfg).start()


def stop_memory_profiling(session: MemoryProfilingSession) -> MemoryProfileReport:
    """Stop ``session`` and build its report (``wia_stop_memory_profiling``)."""
    if not isinstance(session, MemoryProfilingSession):
        raise TypeError(
            f"stop_memory_profiling takes a MemoryProfilingSession, got {type(session).__name__}"
        )
    return session.stop()


def analyze_fragmentation(report: MemoryProfileReport, at: str = "end") -> FragmentationAnalysis:
    """The seed's ``wia_analyze_fragmentation`` over the free ranges recorded at the
    session's ``end`` (default) or at its ``peak`` usage. Raises
    :class:`~wia_hw.WiaError` for a session that did not record them
    (``detect_fragmentation=False``, or ``peak_usage_tracking=False`` for the peak)."""
    if not isinstance(report, MemoryProfileReport):
        raise TypeError(
            f"analyze_fragmentation takes a MemoryProfileReport, got {type(report).__name__}"
        )
    if at not in ("end", "peak"):
        raise ValueError(f"at must be 'end' or 'peak', got {at!r}")
    name = "free_ranges_end" if at == "end" else "free_ranges_peak"
    why = report.untracked(name)
    r = getattr(report, name)
    if why is not None or r is None:
        raise WiaError(
            f"analyze_fragmentation(at={at!r}): the session did not record its free "
            f"ranges (MemoryProfilingConfig({why or 'detect_fragmentation=False'})); "
            "profile with it on"
        )
    frag = external_fragmentation(r)
    total = sum(r)
    return FragmentationAnalysis(
        external_frag_percent=frag,
        largest_free_block_mb=max(r, default=0) / MB,
        avg_free_block_kb=total / len(r) / KB if r else 0.0,
        total_free_gb=total / GB,
        num_free_blocks=len(r),
        suggestions=FRAGMENTATION_SUGGESTIONS if frag > FRAGMENTATION_THRESHOLD_PCT else (),
    )


def plot_memory_timeline(
    report: MemoryProfileReport, path: str | os.PathLike[str], *, x: str = "events"
) -> str:
    """Draw :func:`memory_timeline_figure` and write it as a PNG to ``path``; returns the
    path (``wia_plot_memory_timeline``)."""
    from ._plot import save

    return save(memory_timeline_figure(report, x=x), path)


def memory_timeline_figure(report: MemoryProfileReport, *, x: str = "events") -> Any:
    """Allocated memory, stacked by what it holds (one band per kind, from
    ``report.timeline()``), with the reserved memory (a step line, gid ``reserved``) and
    the peak marked, as a matplotlib ``Figure``.

    ``x="events"`` (default) spaces the allocator's calls evenly, in order, so host-side
    activity that takes no device time (a loop of cached allocations) stays visible;
    ``x="time"`` uses device time (ms). Needs matplotlib (``pip install
    'wia-hw[plot]'``); raises ValueError for another ``x``."""
    if x not in ("events", "time"):
        raise ValueError(f"x must be 'events' or 'time', got {x!r}")
    from ._plot import new_figure

    tl = report.timeline()
    if x == "time":
        to_ms = 1.0 / (report.clock_ghz * 1e6)
        t = [(c - report.start_cycle) * to_ms for c in tl["cycle"]]
        xlabel = "device time (ms)"
    else:
        t = list(range(len(tl["cycle"])))
        xlabel = "allocator calls, in order"
    fig = new_figure((10, 5))
    ax = fig.subplots()
    kinds = [k for k in tl["by_kind"] if any(tl["by_kind"][k])]
    if kinds:
        ax.stackplot(
            t,
            *[[v / GB for v in tl["by_kind"][k]] for k in kinds],
            labels=kinds,
            step="post",
            alpha=0.8,
        )
    ax.step(
        t,
        [v / GB for v in tl["reserved"]],
        where="post",
        color="black",
        lw=1.2,
        ls="--",
        label="reserved (segments)",
        gid="reserved",
    )
    i_peak = max(range(len(t)), key=lambda i: (tl["allocated"][i], -i))
    pk = t[i_peak]
    ax.axvline(pk, color="red", lw=0.8, ls=":")
    ax.annotate(
        f"peak {tl['allocated'][i_peak] / GB:.2f} GB",
        (pk, tl["allocated"][i_peak] / GB),
        textcoords="offset points",
        xytext=(5, 5),
        color="red",
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("device memory (GB)")
    # figures not tracked (their flag off) are n/a, never 0
    n, leaks, frag = report.num_allocations, report.num_leaks, report.fragmentation_percent
    ax.set_title(
        "Memory timeline: "
        + ("allocations n/a" if n is None else f"{n} allocations")
        + ", "
        + ("leaks n/a" if leaks is None else f"{leaks} leaks")
        + ", fragmentation "
        + ("n/a" if frag is None else f"{frag:.1f}%")
    )
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    return fig
