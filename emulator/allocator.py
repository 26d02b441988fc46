"""The device memory allocator: a deterministic caching allocator over the HBM address space.

Device memory is reserved in *segments* (the device-driver allocation, like
``cudaMalloc``): whole multiples of ``segment_bytes`` taken first-fit from the HBM
address space ``[0, capacity_bytes)``. Requests are served from *blocks* inside the
segments and, when freed, go back to the allocator's cache instead of the device, so a
later request of a similar size costs no device call. Which block serves a request:

* **Size rounding.** A request of ``n`` bytes takes ``round_up(n, round_bytes)``.
* **Best fit, split and merge** (the general pool): the smallest free block that is
  large enough (lowest address among equals); the rest of it is split off as a new free
  block when it is at least ``round_bytes``; a freed block merges with its free
  neighbours in the same segment. A request no free block fits reserves a new segment
  of ``round_up(size, segment_bytes)``.
* **Pooling by size class** (``pooling=True``): requests up to ``pool_max_bytes`` are
  rounded up to a size class (four per doubling: :func:`size_class`) and served from
  slabs: segments of ``segment_bytes`` carved into equal slots of one class (the tail
  that no whole slot fits stays unused). A freed slot returns to its
  class's free list (lowest address first); slots never split or merge, and small,
  long-lived buffers no longer pepper the large blocks of the general pool. Larger
  requests use the general pool.
  Slabs are reserved from the top of the address space and general segments from the
  bottom, so the two never interleave.
* **Coalescing.** When no free block fits, a run of address-adjacent, wholly free
  general segments large enough is released and reserved again as one segment before
  new device memory is taken; so free segments that touch count as one free range
  (:meth:`CachingAllocator.free_ranges`).
* **Caching** (``caching=True``, the default): freed segments stay reserved until
  :meth:`CachingAllocator.empty_cache` (or an allocation that would otherwise run out
  of memory) releases the wholly free ones. With ``caching=False`` a segment is
  released as soon as its last block is freed, like a raw device allocator.

Cost model: only device calls cost device time, ``segment_alloc_cycles`` per segment
reserved and ``segment_free_cycles`` per segment released; serving a request from the
cache is host-side bookkeeping and costs none. :meth:`~CachingAllocator.malloc` and
:meth:`~CachingAllocator.free` return those cycles; the caller decides whether the
device waits for them (the runtime's own planned allocations do not; a user's
``ctx.allocate`` does).

Everything is deterministic: the same sequence of calls gives the same addresses.
Listeners (``allocator.listeners``) receive an :class:`AllocEvent` after every call.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import WiaError

__all__ = [
    "AllocEvent",
    "AllocatorConfig",
    "AllocatorStats",
    "Block",
    "CachingAllocator",
    "DeviceOutOfMemory",
    "Segment",
    "size_class",
]

KIB = 1024
MIB = 1024 * 1024


class DeviceOutOfMemory(WiaError, MemoryError):
    """An allocation does not fit in device memory; the message gives the figures."""


def _pos_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    if v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v}")
    return v


def _nonneg_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an integer, got {v!r}")
    if v < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {v}")
    return v


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def size_class(n: int, round_bytes: int = 512) -> int:
    """The pooled size class of an ``n``-byte request: the next of ``2**k * (4 + j) / 4``
    (``j`` = 0..3, four classes per doubling, at most 25 % internal waste), and at least
    ``round_bytes``, a multiple of it."""
    if n <= round_bytes:
        return round_bytes
    top = 1 << (n - 1).bit_length()  # next power of two >= n
    step = max(round_bytes, top // 8)  # quarter steps of the octave below top
    return min(top, _round_up(n, step))


@dataclass(frozen=True, kw_only=True)
class AllocatorConfig:
    """Policy and cost of a :class:`CachingAllocator` (see the module docstring).

    ``round_bytes`` and ``segment_bytes`` must be powers of two with
    ``round_bytes <= pool_max_bytes <= segment_bytes``.
    """

    round_bytes: int = 512
    segment_bytes: int = 2 * MIB
    pooling: bool = False
    pool_max_bytes: int = 1 * MIB
    caching: bool = True
    segment_alloc_cycles: int = 20_000
    segment_free_cycles: int = 10_000

    def __post_init__(self) -> None:
        for n in ("round_bytes", "segment_bytes", "pool_max_bytes"):
            v = _pos_int(n, getattr(self, n))
            if v & (v - 1):
                raise ValueError(f"{n} must be a power of two, got {v}")
        for n in ("segment_alloc_cycles", "segment_free_cycles"):
            _nonneg_int(n, getattr(self, n))
        if not self.round_bytes <= self.pool_max_bytes <= self.segment_bytes:
            raise ValueError(
                "need round_bytes <= pool_max_bytes <= segment_bytes, got "
                f"{self.round_bytes}, {self.pool_max_bytes}, {self.segment_bytes}"
            )
        for n in ("pooling", "caching"):
            if not isinstance(getattr(self, n), bool):
                raise TypeError(f"{n} must be a bool, got {getattr(self, n)!r}")


@dataclass(eq=False)
class Segment:
    """One device reservation: ``[address, address + size)``. ``size_class`` is the slot
    size of a slab, ``None`` for a segment of the general pool."""

    id: int
    address: int
    size: int
    size_class: int | None
    blocks: list[Block] = field(default_factory=list, repr=False)  # slabs only
    head: Block | None = field(default=None, repr=False)  # general pool only
    used: int = 0  # allocated blocks


@dataclass(eq=False)
class Block:
    """A range ``[address, address + size)`` of a segment; ``requested`` bytes asked for.

    ``prev``/``next`` link the blocks of a general-pool segment in address order.
    """

    address: int
    size: int
    segment: Segment = field(repr=False)
    free: bool = True
    requested: int = 0
    id: int = 0
    tag: str = ""
    info: Any = field(default=None, repr=False)
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)


@dataclass(frozen=True)
class AllocEvent:
    """What one allocator call did. ``kind``: ``malloc``, ``free``, ``segment_alloc`` or
    ``segment_free``. ``cycles`` is the device time the call cost; the byte totals are
    after the call."""

    kind: str
    now: int
    block_id: int
    address: int
    size: int
    requested: int
    tag: str
    info: Any
    cycles: int
    allocated_bytes: int
    reserved_bytes: int


@dataclass
class AllocatorStats:
    """Running totals. ``allocated_bytes`` counts block sizes (after rounding),
    ``requested_bytes`` what callers asked for, ``reserved_bytes`` the segments."""

    allocated_bytes: int = 0
    requested_bytes: int = 0
    reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    num_allocs: int = 0
    num_frees: int = 0
    num_segment_allocs: int = 0
    num_segment_frees: int = 0
    device_cycles: int = 0


class CachingAllocator:
    """A deterministic caching allocator over ``capacity_bytes`` of device memory.

    ``malloc(nbytes)`` returns ``(block, cycles)``; ``free(block)`` returns ``cycles``
    (device time spent in segment reservations or releases). Raises
    :class:`DeviceOutOfMemory` when a request cannot be met even after releasing the
    cached free segments, ``TypeError``/``ValueError`` on bad arguments, and
    ``ValueError`` on a double free or a block from another allocator.
    """

    def __init__(self, capacity_bytes: int, config: AllocatorConfig | None = None) -> None:
        self.capacity_bytes = _pos_int("capacity_bytes", capacity_bytes)
        if config is None:
            config = AllocatorConfig()
        if not isinstance(config, AllocatorConfig):
            raise TypeError(f"config must be an AllocatorConfig, got {config!r}")
        self.config = config
        self.stats = AllocatorStats()
        self.listeners: list[Callable[[AllocEvent], None]] = []
        #: called before a free or a release of cached segments changes the free ranges
        #: (a profiler that snapshots the ranges at a peak takes them then, once)
        self.before_free: list[Callable[[], None]] = []
        self.segments: dict[int, Segment] = {}
        self._space: list[tuple[int, int]] = [(0, capacity_bytes)]  # free address ranges
        self._free: list[tuple[int, int, int]] = []  # (size, address, id)
        self._free_blocks: dict[int, Block] = {}
        self._slots: dict[int, list[tuple[int, int]]] = {}  # class -> (address, id)
        self._slot_blocks: dict[int, Block] = {}
        self._live: dict[int, Block] = {}
        self._ids = itertools.count(1)
        self._seg_ids = itertools.count(1)

    # -- public ------------------------------------------------------------------------
    def malloc(
        self, nbytes: int, *, now: int = 0, tag: str = "", info: Any = None
    ) -> tuple[Block, int]:
        """Allocate ``nbytes``; returns the block and the device cycles the call cost."""
        _pos_int("nbytes", nbytes)
        cfg = self.config
        size = _round_up(nbytes, cfg.round_bytes)
        cycles = 0
        if cfg.pooling and size <= cfg.pool_max_bytes:
            cls = size_class(size, cfg.round_bytes)
            free = self._slots.setdefault(cls, [])
            if not free:
                cycles += self._new_slab(cls, nbytes, now)
            _, bid = free.pop(0)
            blk = self._slot_blocks.pop(bid)
        else:
            blk, c = self._best_fit(size, nbytes, now)
            cycles += c
        blk.free = False
        blk.requested = nbytes
        blk.id = next(self._ids)
        blk.tag = tag
        blk.info = info
        blk.segment.used += 1
        self._live[blk.id] = blk
        st = self.stats
        st.allocated_bytes += blk.size
        st.requested_bytes += nbytes
        st.peak_allocated_bytes = max(st.peak_allocated_bytes, st.allocated_bytes)
        st.num_allocs += 1
        st.device_cycles += cycles
        self._emit("malloc", now, blk, cycles)
        return blk, cycles

    def free(self, block: Block, *, now: int = 0) -> int:
        """Return ``block`` to the cache; returns the device cycles the call cost."""
        if not isinstance(block, Block):
            raise TypeError(f"free() takes a Block, got {type(block).__name__}")
        if self._live.get(block.id) is not block:
            raise ValueError(
                f"block {block.id} at {block.address:#x} is not allocated here "
                "(double free, or a block of another allocator)"
            )
        for fn in self.before_free:
            fn()
        del self._live[block.id]
        st = self.stats
        st.allocated_bytes -= block.size
        st.requested_bytes -= block.requested
        st.num_frees += 1
        seg = block.segment
        seg.used -= 1
        block.free = True
        freed = Block(
            block.address,
            block.size,
            seg,
            requested=block.requested,
            id=block.id,
            tag=block.tag,
            info=block.info,
        )
        if seg.size_class is not None:
            bisect.insort(self._slots[seg.size_class], (block.address, block.id))
            self._slot_blocks[block.id] = block
        else:
            block = self._merge(block)
            self._insert_free(block)
        cycles = 0
        if not self.config.caching and seg.used == 0:
            cycles = self._release(seg, now)
        st.device_cycles += cycles
        self._emit("free", now, freed, cycles)
        return cycles

    def empty_cache(self, *, now: int = 0) -> int:
        """Release every wholly free segment to the device; returns the cycles it took."""
        for fn in self.before_free:
            fn()
        cycles = self._release_unused(now)
        self.stats.device_cycles += cycles
        return cycles

    def _release_unused(self, now: int) -> int:
        cycles = 0
        for seg in [s for s in self.segments.values() if s.used == 0]:
            cycles += self._release(seg, now)
        return cycles

    @property
    def live_blocks(self) -> list[Block]:
        """Allocated blocks, oldest first."""
        return [self._live[k] for k in sorted(self._live)]

    def free_ranges(self) -> list[int]:
        """Sizes of the maximal runs of free bytes inside the reserved segments, in
        address order: adjacent free blocks (or slots) of one segment form one run, and
        address-adjacent wholly free general segments join into one run (the allocator
        coalesces them on demand). A segment holding a live block never joins another."""
        out: list[int] = []
        prev_end, prev_whole = -1, False
        for seg in sorted(self.segments.values(), key=lambda s: s.address):
            whole = seg.used == 0 and seg.size_class is None
            if whole and prev_whole and prev_end == seg.address:
                out[-1] += seg.size
                prev_end = seg.address + seg.size
                continue
            prev_end, prev_whole = seg.address + seg.size, whole
            run = 0
            blocks: list[Block] = seg.blocks if seg.size_class is not None else []
            if seg.size_class is None:
                b = seg.head
                while b is not None:
                    blocks.append(b)
                    b = b.next
            for b in blocks:
                if b.free:
                    run += b.size
                elif run:
                    out.append(run)
                    run = 0
            if run:
                out.append(run)
        return out

    def check(self) -> None:
        """Verify the internal invariants (tests call it); raises AssertionError."""
        reserved = sum(s.size for s in self.segments.values())
        if reserved != self.stats.reserved_bytes:
            raise AssertionError(f"reserved {self.stats.reserved_bytes} != segments {reserved}")
        alloc = sum(b.size for b in self._live.values())
        if alloc != self.stats.allocated_bytes:
            raise AssertionError(f"allocated {self.stats.allocated_bytes} != blocks {alloc}")
        space = sum(s for _, s in self._space)
        if space + reserved != self.capacity_bytes:
            raise AssertionError("address space is not conserved")
        for seg in self.segments.values():
            if seg.size_class is None:
                b, addr, prev_free = seg.head, seg.address, False
                while b is not None:
                    if b.address != addr:
                        raise AssertionError(f"gap in segment {seg.id} at {addr:#x}")
                    if b.free and prev_free:
                        raise AssertionError(f"unmerged free neighbours at {addr:#x}")
                    prev_free = b.free
                    addr += b.size
                    b = b.next
                if addr != seg.address + seg.size:
                    raise AssertionError(f"segment {seg.id} blocks do not cover it")

    # -- general pool ------------------------------------------------------------------
    def _best_fit(self, size: int, nbytes: int, now: int) -> tuple[Block, int]:
        cycles = 0
        i = bisect.bisect_left(self._free, (size, -1, -1))
        if i == len(self._free):
            seg_size = _round_up(size, self.config.segment_bytes)
            cycles = self._coalesce(seg_size, now)
            seg, c = self._reserve(seg_size, None, nbytes, now)
            cycles += c
            blk = Block(seg.address, seg.size, seg)
            seg.head = blk
        else:
            _, _, bid = self._free.pop(i)
            blk = self._free_blocks.pop(bid)
        rest = blk.size - size
        if rest >= self.config.round_bytes:  # split off the tail as a free block
            tail = Block(blk.address + size, rest, blk.segment, prev=blk, next=blk.next)
            if blk.next is not None:
                blk.next.prev = tail
            blk.next = tail
            blk.size = size
            self._insert_free(tail)
        return blk, cycles

    def _insert_free(self, blk: Block) -> None:
        blk.id = -next(self._ids)  # free blocks get fresh negative ids
        self._free_blocks[blk.id] = blk
        bisect.insort(self._free, (blk.size, blk.address, blk.id))

    def _remove_free(self, blk: Block) -> None:
        i = bisect.bisect_left(self._free, (blk.size, blk.address, blk.id))
        del self._free[i]
        del self._free_blocks[blk.id]

    def _merge(self, blk: Block) -> Block:
        nxt = blk.next
        if nxt is not None and nxt.free:
            self._remove_free(nxt)
            blk.size += nxt.size
            blk.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = blk
        prv = blk.prev
        if prv is not None and prv.free:
            self._remove_free(prv)
            prv.size += blk.size
            prv.next = blk.next
            if blk.next is not None:
                blk.next.prev = prv
            blk = prv
        return blk

    # -- slabs -------------------------------------------------------------------------
    def _new_slab(self, cls: int, nbytes: int, now: int) -> int:
        seg, cycles = self._reserve(self.config.segment_bytes, cls, nbytes, now)
        free = self._slots[cls]
        for addr in range(seg.address, seg.address + seg.size - cls + 1, cls):
            b = Block(addr, cls, seg)
            b.id = -next(self._ids)
            seg.blocks.append(b)
            self._slot_blocks[b.id] = b
            free.append((addr, b.id))
        free.sort()
        return cycles

    # -- segments ----------------------------------------------------------------------
    def _free_segment_runs(self) -> list[list[Segment]]:
        """Runs of address-adjacent, wholly free general segments, in address order."""
        runs: list[list[Segment]] = []
        for seg in sorted(self.segments.values(), key=lambda s: s.address):
            if seg.used or seg.size_class is not None:
                continue
            if runs and runs[-1][-1].address + runs[-1][-1].size == seg.address:
                runs[-1].append(seg)
            else:
                runs.append([seg])
        return runs

    def _coalesce(self, seg_size: int, now: int) -> int:
        """Release the first run of touching free segments that can hold ``seg_size``
        (its space is then taken first-fit by the reservation that follows)."""
        for run in self._free_segment_runs():
            if len(run) > 1 and sum(s.size for s in run) >= seg_size:
                return sum(self._release(seg, now) for seg in run)
        return 0

    def _reserve(
        self, seg_size: int, cls: int | None, nbytes: int, now: int
    ) -> tuple[Segment, int]:
        addr = self._take_space(seg_size, top=cls is not None)
        cycles = 0
        if addr is None and self.config.caching:
            cycles += self._release_unused(now)  # give the cache back, then retry
            addr = self._take_space(seg_size, top=cls is not None)
        if addr is None:
            st = self.stats
            largest = max((s for _, s in self._space), default=0)
            raise DeviceOutOfMemory(
                f"cannot allocate {nbytes} bytes ({nbytes / MIB:.2f} MiB): device memory "
                f"{self.capacity_bytes / MIB:.0f} MiB, {st.allocated_bytes / MIB:.2f} MiB "
                f"allocated, {st.reserved_bytes / MIB:.2f} MiB reserved, largest free "
                f"range {largest / MIB:.2f} MiB"
            )
        seg = Segment(next(self._seg_ids), addr, seg_size, cls)
        self.segments[seg.id] = seg
        st = self.stats
        st.reserved_bytes += seg_size
        st.peak_reserved_bytes = max(st.peak_reserved_bytes, st.reserved_bytes)
        st.num_segment_allocs += 1
        self._emit_seg("segment_alloc", now, seg, self.config.segment_alloc_cycles)
        return seg, cycles + self.config.segment_alloc_cycles

    def _take_space(self, size: int, top: bool = False) -> int | None:
        """First fit from the bottom of the address space, or from the top (slabs)."""
        order = range(len(self._space) - 1, -1, -1) if top else range(len(self._space))
        for i in order:
            addr, avail = self._space[i]
            if avail >= size:
                if avail == size:
                    del self._space[i]
                elif top:
                    self._space[i] = (addr, avail - size)
                    return addr + avail - size
                else:
                    self._space[i] = (addr + size, avail - size)
                return addr
        return None

    def _release(self, seg: Segment, now: int) -> int:
        if seg.size_class is not None:
            ids = {b.id for b in seg.blocks}
            self._slots[seg.size_class] = [
                e for e in self._slots[seg.size_class] if e[1] not in ids
            ]
            for bid in ids:
                self._slot_blocks.pop(bid, None)
        else:
            assert seg.head is not None and seg.head.next is None
            self._remove_free(seg.head)
        del self.segments[seg.id]
        st = self.stats
        st.reserved_bytes -= seg.size
        st.num_segment_frees += 1
        bisect.insort(self._space, (seg.address, seg.size))
        merged: list[tuple[int, int]] = []
        for a, s in self._space:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((a, s))
        self._space = merged
        cycles = self.config.segment_free_cycles
        self._emit_seg("segment_free", now, seg, cycles)
        return cycles

    # -- events ------------------------------------------------------------------------
    def _emit(self, kind: str, now: int, blk: Block, cycles: int) -> None:
        if self.listeners:
            st = self.stats
            ev = AllocEvent(
                kind,
                now,
                blk.id,
                blk.address,
                blk.size,
                blk.requested,
                blk.tag,
                blk.info,
                cycles,
                st.allocated_bytes,
                st.reserved_bytes,
            )
            for fn in self.listeners:
                fn(ev)

    def _emit_seg(self, kind: str, now: int, seg: Segment, cycles: int) -> None:
        if self.listeners:
            st = self.stats
            ev = AllocEvent(
                kind,
                now,
                -seg.id,
                seg.address,
                seg.size,
                0,
                "",
                None,
                cycles,
                st.allocated_bytes,
                st.reserved_bytes,
            )
            for fn in self.listeners:
                fn(ev)
