"""The memory hierarchy: tiled block layout, block-granular LRU caches, bandwidth ports,
HBM channel interleaving.

Data moves in *blocks*: every tensor is stored in a tiled layout of ``br`` x ``bc``
element blocks of about ``memory.block_bytes`` bytes, and a block is the unit that hits
or misses. L1 is one LRU per core, L2 one LRU shared by all cores (write-back,
write-allocate). Which blocks a tile touches depends on the tiling and the loop order,
so those choices change the hit and miss counts the profiler sees.

**Physical layout and HBM interleaving.** Each tensor owns a contiguous range of the
physical address space, one ``block_bytes`` slot per block in block-major order (block
``(bi, bj)`` of a tensor whose first slot is ``s0`` starts at byte
``(s0 + bi * nbj + bj) * block_bytes``; a block smaller than the slot, at a tensor's
edge, fills the start of its slot). Tensors take slots in the order the memory system
first sees them. Addresses map to HBM channels in units of ``hbm.interleave_bytes``
(see :func:`channel_of`): consecutive units go to consecutive channels, and each
stripe of ``channels`` units is rotated by a fold of the higher address bits (as the
XOR hashing of real controllers does) so that the partial stripes at the ends of
blocks do not all land on channel 0. A transfer is split over the channels its bytes
touch (closed form per block, :func:`hbm_spread`, cached per block) and completes when
the last piece does, plus ``hbm.latency_ns``.

**Ports.** Every shared port (HBM channel, L2 port, a core's L1 port) is a
:class:`BandwidthPort`, a FIFO server: callers book it at the current simulation time
(the device's DMA engines issue each transfer when it is issued, never back-dated or
ahead of time), so no request is served before one that arrived earlier.

Bytes counted at a level are the bytes that cross that level's port: reads by the
array or vector unit and fills for L1, fills of L1 and write-backs from it for L2,
reads and write-backs for HBM.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain, repeat

from .config import DeviceSpec
from .counters import Counters
from .errors import SpecError
from .kernels import Region, TensorRef

__all__ = [
    "BandwidthPort",
    "BlockLayout",
    "MemorySystem",
    "Region",
    "channel_of",
    "hbm_spread",
    "refresh_factor",
    "refresh_windows",
    "MIN_REFRESH_PERIOD_CYCLES",
]

Key = tuple[int, int, int]

#: A region's blocks: (slots, bytes of each or -1, the bytes of each when they differ,
#: total bytes); see :meth:`MemorySystem.runs`.
Run = tuple["range | list[int]", int, "list[int] | None", int]

#: Run an iterator to its end at C speed (``deque(it, maxlen=0)``).
_consume = deque(maxlen=0).extend
_chain = chain.from_iterable


#: The fewest cycles a refresh period is counted in: a tREFI of fewer cycles (a sub-cycle
#: or few-cycle refresh) is stretched to this many, its tRFC in proportion, so the
#: refresh's share of a channel's time keeps its ratio to 1 part in this many instead of
#: being rounded to whole cycles of a tiny period.
MIN_REFRESH_PERIOD_CYCLES = 1024


def refresh_windows(interval_ns: float, cycle_ns: float, clock_ghz: float) -> tuple[int, int]:
    """The refresh of a DRAM channel in whole cycles: ``(T, R)``, a window of ``R``
    cycles every ``T``, with ``R / T`` the share ``tRFC / tREFI`` (``cycle_ns /
    interval_ns``, ``0 < cycle_ns < interval_ns``, as :class:`~wia_hw.emulator.config.
    HBMConfig` checks) and ``0 < R < T``.

    A tREFI of at least :data:`MIN_REFRESH_PERIOD_CYCLES` cycles is ``T = ceil(tREFI)``
    and ``R = ceil(tRFC)`` in cycles (each rounded up to a whole cycle); a shorter one is
    stretched to ``T = MIN_REFRESH_PERIOD_CYCLES`` with ``R = ceil(T * tRFC / tREFI)``,
    so the share stays right to ``1 / T`` however small the figures. ``R`` is at most
    ``T - 1``. Below that cap the share never falls when tRFC grows or tREFI shrinks
    (across the stretch too: the stretched share is at least the whole-cycle one)."""
    period = interval_ns * clock_ghz
    if period >= MIN_REFRESH_PERIOD_CYCLES:
        trefi = math.ceil(period)
        trfc = math.ceil(cycle_ns * clock_ghz)
    else:
        trefi = MIN_REFRESH_PERIOD_CYCLES
        trfc = math.ceil(trefi * Fraction(cycle_ns) / Fraction(interval_ns))
    return trefi, max(1, min(trfc, trefi - 1))


def refresh_factor(spec: DeviceSpec) -> Fraction:
    """The share of a DRAM channel's time left for transfers by refresh, ``1 - tRFC /
    tREFI`` in the whole cycles of :func:`refresh_windows`: the channels move their
    nominal rate times this (see :class:`~wia_hw.emulator.config.HBMConfig`)."""
    hbm = spec.memory.hbm
    if not hbm.refresh_cycle_ns:
        return Fraction(1)
    trefi, trfc = refresh_windows(hbm.refresh_interval_ns, hbm.refresh_cycle_ns, spec.clock_ghz)
    return 1 - Fraction(trfc, trefi)


class BandwidthPort:
    """A FIFO server that moves bytes at a fixed rate: a memory channel or SRAM port.

    ``reserve(now, nbytes)`` books the port for ``ceil(nbytes / bytes_per_cycle)``
    cycles starting when it is free and at or after ``now`` (the request's arrival
    cycle), and returns the cycle the transfer ends. Requests must arrive in
    non-decreasing ``now`` order (SimPy processes booking at ``env.now`` do); then this
    is exactly a ``simpy.Resource(capacity=1)`` whose holder's service time is known
    when it requests (tests check the equivalence), at one call instead of three events.
    A request arriving before one already booked raises ``RuntimeError``: serving it
    after the later arrival would break the FIFO order.

    A DRAM channel also refreshes (:meth:`set_refresh`): the port is blocked during the
    windows ``[phase + k T, phase + k T + R)``, and a transfer that meets one pauses
    until its end (:meth:`serve`). ``refresh_stall_cycles`` counts the cycles added.
    """

    __slots__ = (
        "bytes_per_cycle",
        "free_at",
        "busy_cycles",
        "name",
        "_num",
        "_den",
        "last_arrival",
        "refresh_interval",
        "refresh_cycles",
        "refresh_phase",
        "refresh_stall_cycles",
    )

    def __init__(self, name: str, bytes_per_cycle: Fraction) -> None:
        if bytes_per_cycle <= 0:
            raise ValueError(f"bytes_per_cycle must be positive, got {bytes_per_cycle}")
        self.name = name
        self.bytes_per_cycle = Fraction(bytes_per_cycle)
        self._num = self.bytes_per_cycle.numerator
        self._den = self.bytes_per_cycle.denominator
        self.free_at = 0
        self.busy_cycles = 0
        self.last_arrival = 0
        self.refresh_interval = 1
        self.refresh_cycles = 0  # 0: no refresh
        self.refresh_phase = 0
        self.refresh_stall_cycles = 0

    def set_refresh(self, interval: int, cycles: int, phase: int) -> None:
        """Block the port ``cycles`` cycles every ``interval`` from cycle ``phase`` on
        (``cycles`` 0: never). Set on every HBM channel of a memory system or on none:
        its inlined booking looks at the first channel to know whether windows exist."""
        if cycles and not 0 < cycles < interval:
            raise ValueError(f"refresh of {cycles} cycles every {interval}: needs 0 < R < T")
        self.refresh_interval = max(1, interval)
        self.refresh_cycles = cycles
        self.refresh_phase = phase % self.refresh_interval

    def copy_state(self, other: BandwidthPort) -> None:
        """Take ``other``'s booking state and refresh windows (a stand-in port taking
        over, or handing back)."""
        self.free_at, self.busy_cycles = other.free_at, other.busy_cycles
        self.last_arrival = other.last_arrival
        self.refresh_interval, self.refresh_cycles = other.refresh_interval, other.refresh_cycles
        self.refresh_phase = other.refresh_phase
        self.refresh_stall_cycles = other.refresh_stall_cycles

    def cycles(self, nbytes: int) -> int:
        """``transfer_cycles(nbytes, bytes_per_cycle)`` in integer arithmetic."""
        return -(-nbytes * self._den // self._num)

    def serve(self, start: int, dur: int) -> int:
        """The cycle a transfer of ``dur`` cycles that may start at ``start`` ends, when it
        pauses during every refresh window it meets (steps once per window met)."""
        r = self.refresh_cycles
        if not r:
            return start + dur
        t, o = self.refresh_interval, self.refresh_phase
        k = (start - o) // t  # the window at or before start
        if start < o + k * t + r:  # inside it: wait for its end
            start = o + k * t + r
        end, left = start, dur
        while True:
            gap = o + (k + 1) * t - end  # cycles until the next window
            if left <= gap:
                return end + left
            left -= gap
            k += 1
            end = o + k * t + r

    def window_cycles(self, a: int, b: int) -> int:
        """The cycles of ``[a, b)`` inside refresh windows."""
        r = self.refresh_cycles
        if not r or b <= a:
            return 0
        t, o = self.refresh_interval, self.refresh_phase

        def upto(x: int) -> int:  # window cycles in [o - t, x), x >= o - t
            k, rem = divmod(x - o, t)
            return (k + 1) * r + min(rem, r)

        return upto(b) - upto(a)

    def reserve(self, now: int, nbytes: int) -> int:
        if nbytes <= 0:
            return now
        if now < self.last_arrival:
            raise RuntimeError(
                f"port {self.name}: a request arriving at cycle {now} was "
                f"booked after one arriving at {self.last_arrival} "
                "(requests must be booked in arrival order)"
            )
        self.last_arrival = now
        start = now if now > self.free_at else self.free_at
        dur = -(-nbytes * self._den // self._num)
        if self.refresh_cycles:
            end = self.serve(start, dur)
            self.refresh_stall_cycles += end - start - dur
        else:
            end = start + dur
        self.free_at = end
        self.busy_cycles += dur
        return end


#: BandwidthPort.reserve as defined here (the HBM booking is inlined while it is this)
_RESERVE = BandwidthPort.reserve


def _fold(stripe: int, channels: int) -> int:
    """The rotation of stripe ``stripe``: the sum of its base-``channels`` digits."""
    f = 0
    while stripe:
        stripe, d = divmod(stripe, channels)
        f += d
    return f


def channel_of(addr: int, channels: int, interleave_bytes: int) -> int:
    """The HBM channel that holds physical byte ``addr``.

    Unit ``u = addr // interleave_bytes`` lies in stripe ``s = u // channels`` and goes
    to channel ``(u + fold(s)) mod channels``, where ``fold(s)`` is the sum of the
    base-``channels`` digits of ``s``: within a stripe, consecutive units take
    consecutive channels (a permutation of all of them); the rotation differs from
    stripe to stripe, like the XOR of higher address bits into the channel bits that
    memory controllers use (a sum modulo the channel count also works when the count
    is not a power of two).
    """
    if channels == 1:
        return 0
    u = addr // interleave_bytes
    return (u + _fold(u // channels, channels)) % channels


def hbm_spread(addr: int, nbytes: int, channels: int, interleave_bytes: int) -> list[int]:
    """Bytes of ``[addr, addr + nbytes)`` held by each channel under :func:`channel_of`.

    Closed form: whole stripes in the middle give every channel ``interleave_bytes``
    each; only the first and last stripes (at most ``2 * channels`` units) are walked.
    """
    out = [0] * channels
    if nbytes <= 0:
        return out
    if channels == 1:
        out[0] = nbytes
        return out
    g, c = interleave_bytes, channels
    stripe = g * c
    if addr % stripe == 0 and nbytes % stripe == 0:  # whole stripes: even spread
        return [nbytes // c] * c
    end = addr + nbytes
    u0, u1 = addr // g, (end - 1) // g
    s0, s1 = u0 // c, u1 // c

    def units(ua: int, ub: int) -> None:  # units ua..ub of one stripe, g bytes each
        first = (ua + _fold(ua // c, c)) % c  # a cyclic run of channels from here
        last = first + ub - ua + 1
        out[first : min(last, c)] = [x + g for x in out[first : min(last, c)]]
        if last > c:
            out[: last - c] = [x + g for x in out[: last - c]]

    if s0 == s1:
        units(u0, u1)
    else:
        units(u0, (s0 + 1) * c - 1)
        units(s1 * c, u1)
        mid = (s1 - s0 - 1) * g
        if mid:
            for i in range(c):
                out[i] += mid
    out[channel_of(addr, c, g)] -= addr - u0 * g  # the first unit's head
    out[channel_of(end - 1, c, g)] -= (u1 + 1) * g - end  # the last unit's tail
    return out


#: The most blocks one tensor may span (``memory.block_bytes`` too small for the
#: workload): past it the emulator's per-block state outgrows a machine's memory.
MAX_BLOCKS_PER_TENSOR = 1 << 22


@dataclass(frozen=True)
class BlockLayout:
    """Tiled layout of one tensor: id ``tid``, blocks of ``br`` rows x ``bc`` cols."""

    tid: int
    rows: int
    cols: int
    br: int
    bc: int
    elem_bytes: int

    @classmethod
    def for_tensor(cls, tid: int, ref: TensorRef, block_bytes: int) -> BlockLayout:
        elems = max(1, block_bytes // ref.elem_bytes)
        side = 1 << (int(math.isqrt(elems)).bit_length() - 1)
        bc = min(1 << (ref.cols - 1).bit_length(), side)
        br = max(1, elems // bc)
        # a view at an offset, met before its storage: the storage reaches at least to
        # the view's end (rows of the view's width), so the view maps onto it
        rows = -(-(ref.offset + ref.rows * ref.cols) // ref.cols)
        out = cls(tid, rows, ref.cols, br, bc, ref.elem_bytes)
        if out.block_rows * out.block_cols > MAX_BLOCKS_PER_TENSOR:
            raise SpecError(
                f"tensor {ref.name!r} ({ref.rows} x {ref.cols} x {ref.elem_bytes} B) would be "
                f"{out.block_rows * out.block_cols:,} blocks of {block_bytes} B; the emulator "
                f"tracks every block and takes at most {MAX_BLOCKS_PER_TENSOR:,} per tensor: "
                "raise memory.block_bytes",
                field="memory.block_bytes",
            )
        return out

    @property
    def block_rows(self) -> int:
        """Blocks along the rows (``ceil(rows / br)``)."""
        return -(-self.rows // self.br)

    @property
    def block_cols(self) -> int:
        """Blocks along the columns (``ceil(cols / bc)``)."""
        return -(-self.cols // self.bc)

    def blocks(self, r0: int, r1: int, c0: int, c1: int) -> list[tuple[Key, int]]:
        """The blocks covering rows ``[r0, r1)`` x cols ``[c0, c1)``, with their bytes."""
        br, bc, e, tid = self.br, self.bc, self.elem_bytes, self.tid
        rows, cols = self.rows, self.cols
        jr = range(c0 // bc, -(-c1 // bc))
        out: list[tuple[Key, int]] = []
        app = out.append
        for bi in range(r0 // br, -(-r1 // br)):
            rb = (br if (bi + 1) * br <= rows else rows - bi * br) * e
            for bj in jr:
                app(((tid, bi, bj), rb * (bc if (bj + 1) * bc <= cols else cols - bj * bc)))
        return out


class _CacheView(MutableMapping):
    """A cache's blocks by ``(tid, bi, bj)`` key (the public face of a slot-keyed
    ``OrderedDict``, in its LRU order): L1 gives a block's bytes, L2 ``[bytes, dirty]``.
    Assigning a new key appends it as the most recent block; assigning an existing one
    keeps its place (like an ``OrderedDict``)."""

    __slots__ = ("_mem", "_d", "_l2")

    def __init__(self, mem: MemorySystem, d: OrderedDict[int, int], l2: bool) -> None:
        self._mem, self._d, self._l2 = mem, d, l2

    def __getitem__(self, key: Key) -> int | list[int]:
        v = self._d[self._mem.slot_of(key)]
        return [v >> 1, v & 1] if self._l2 else v

    def __setitem__(self, key: Key, value: int | Sequence[int]) -> None:
        if self._l2:
            nb, dirty = value  # type: ignore[misc]
            self._d[self._mem.slot_of(key)] = nb << 1 | (1 if dirty else 0)
        else:
            self._d[self._mem.slot_of(key)] = value  # type: ignore[assignment]

    def __delitem__(self, key: Key) -> None:
        del self._d[self._mem.slot_of(key)]

    def __contains__(self, key: object) -> bool:
        mem = self._mem
        if not isinstance(key, tuple) or len(key) != 3:
            return False
        tid, bi, bj = key
        if not 0 <= tid < len(mem._first_slot) or not 0 <= bj < mem._block_cols[tid]:
            return False
        return mem.slot_of(key) in self._d

    def __iter__(self) -> Iterator[Key]:
        return map(self._mem.key_of, list(self._d))

    def __len__(self) -> int:
        return len(self._d)


class MemorySystem:
    r"""L1 per core, shared L2, HBM channels; owns the hit/miss/byte counters.

    Latencies: an L1 hit ``l1.latency_cycles``; an L2 read ``l2.latency_cycles`` after
    its port transfer; an HBM transfer ``ceil(hbm.latency_ns * clock_ghz)`` cycles after
    the last of its channel pieces.

    Inside, a block is named by its *slot* (an int: its index in the physical address
    space, see the module doc), so the caches are ``OrderedDict``\s of ints: L1 maps a
    slot to its bytes, L2 to ``bytes << 1 | dirty`` (:attr:`l1` and :attr:`l2` show them
    by ``(tid, bi, bj)`` key). A region's blocks are handled as a :data:`Run`
    (:meth:`runs`); :meth:`load` and :meth:`store` take ``(key, bytes)`` lists, and
    :meth:`load_runs` and :meth:`store_runs` runs, with the same results.
    """

    def __init__(self, spec: DeviceSpec, counters: Counters) -> None:
        m = spec.memory
        self.spec = spec
        self.counters = counters
        self.block_bytes = m.block_bytes
        self.l1_capacity = m.l1.size_bytes
        self.l2_capacity = m.l2.size_bytes
        cores = spec.compute.cores
        self._l1: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(cores)]
        self.l1_used = [0] * cores
        self._l2: OrderedDict[int, int] = OrderedDict()  # slot -> bytes << 1 | dirty
        self.l2_used = 0
        # each cache with its bound methods (the hot loops take them in one unpack)
        self._l1_ops = [(d, d.__contains__, d.move_to_end, d.popitem, d.update) for d in self._l1]
        d2 = self._l2
        self._l2_ops = (d2, d2.__contains__, d2.move_to_end, d2.popitem, d2.update)
        self.l1_ports = [
            BandwidthPort(f"l1.{c}", spec.bytes_per_cycle(m.l1.bandwidth_gbs)) for c in range(cores)
        ]
        self.l2_port = BandwidthPort("l2", spec.bytes_per_cycle(m.l2.bandwidth_gbs))
        #: a channel's rate between refreshes (bytes per cycle)
        self.channel_nominal_bpc = spec.bytes_per_cycle(m.hbm.bandwidth_gbs) / m.hbm.channels
        per_ch = self.channel_nominal_bpc * refresh_factor(spec)
        self.channels = [BandwidthPort(f"hbm.{i}", per_ch) for i in range(m.hbm.channels)]
        self.interleave_bytes = m.hbm.interleave_bytes
        # every block slot starts on a stripe boundary: a block of whole stripes then
        # spreads evenly, which needs no address (the common case, kept cheap)
        self._stripe = m.hbm.interleave_bytes * m.hbm.channels
        self._aligned = m.block_bytes % self._stripe == 0
        self.hbm_latency = math.ceil(m.hbm.latency_ns * spec.clock_ghz)
        self.l2_latency = m.l2.latency_cycles
        self.l1_latency = m.l1.latency_cycles
        self._layouts: dict[str, BlockLayout] = {}
        self._first_slot: list[int] = []  # per tid: its first block slot
        self._block_cols: list[int] = []  # per tid: blocks along its columns
        self._slots = 0  # block slots handed out so far
        # per block slot: its bytes per channel, an int when every channel holds the same
        self._spread: dict[int, int | tuple[int, ...]] = {}
        self.hbm_written_tensors: set[str] = set()
        #: the blocks stored since the last eager-write-back mark (None: not tracked)
        self._stored: set[int] | None = set() if m.eager_writeback else None
        #: Bytes of L2 blocks that became dirty (each is written back to HBM once, later)
        #: and bytes written back; a kernel's deltas attribute write-backs to the writer.
        self.dirtied_bytes = 0
        self.writeback_bytes = 0

    @property
    def l1(self) -> list[_CacheView]:
        """Each core's L1 blocks, ``(tid, bi, bj) -> bytes``, least recent first."""
        return [_CacheView(self, d, False) for d in self._l1]

    @property
    def l2(self) -> _CacheView:
        """The L2 blocks, ``(tid, bi, bj) -> [bytes, dirty]``, least recent first."""
        return _CacheView(self, self._l2, True)

    # -- layout ----------------------------------------------------------------------
    def layout(self, ref: TensorRef) -> BlockLayout:
        lay = self._layouts.get(ref.name)
        if lay is None:
            # tids are never reused (a released name's blocks may still be cached)
            lay = BlockLayout.for_tensor(len(self._first_slot), ref, self.block_bytes)
            self._layouts[ref.name] = lay
            self._first_slot.append(self._slots)
            self._block_cols.append(lay.block_cols)
            self._slots += lay.block_rows * lay.block_cols
        return lay

    def release(self, name: str) -> None:
        """Forget the storage called ``name``: its next reference lays out a new tensor
        at fresh addresses, not a view of the old one. For a later run on the same
        device whose tensor of that name is another tensor (another size): it was
        mapped as a view onto the old storage, so a 64x64 GEMM after a 4096x4096 one
        wrote back 2 MiB of the old output's blocks. The old blocks still cached stay
        there (clean or dirty, as freed memory's lines do) until they are evicted."""
        self._layouts.pop(name, None)

    def block_address(self, key: Key) -> int:
        """The physical byte address where block ``key`` starts (see the module doc)."""
        return self.slot_of(key) * self.block_bytes

    def slot_of(self, key: Key) -> int:
        """The slot of block ``key = (tid, bi, bj)``: its index in the address space."""
        tid, bi, bj = key
        return self._first_slot[tid] + bi * self._block_cols[tid] + bj

    def key_of(self, slot: int) -> Key:
        """The ``(tid, bi, bj)`` key of block slot ``slot`` (inverse of :meth:`slot_of`)."""
        tid = bisect.bisect_right(self._first_slot, slot) - 1
        bi, bj = divmod(slot - self._first_slot[tid], self._block_cols[tid])
        return (tid, bi, bj)

    def _storage_region(self, region: Region) -> tuple[BlockLayout, int, int, int, int]:
        """A region mapped onto its storage's layout: (layout, r0, r1, c0, c1).

        A region of a *view* (same storage name, another 2-D shape, e.g. a reshape) is
        mapped through its flat element range onto the storage's layout; a range that
        spans several storage rows is widened to whole rows (conservative: never fewer
        blocks than the data needs).
        """
        ref, r0, r1, c0, c1 = region
        lay = self._layouts.get(ref.name)
        if lay is None:
            lay = self.layout(ref)
        if ref.cols != lay.cols or ref.rows != lay.rows or ref.offset:
            s = ref.offset + r0 * ref.cols + c0
            t = ref.offset + (r1 - 1) * ref.cols + c1
            rs, re_ = s // lay.cols, (t - 1) // lay.cols + 1
            if re_ - rs == 1:
                c0, c1 = s % lay.cols, (t - 1) % lay.cols + 1
            else:
                c0, c1 = 0, lay.cols
            r0, r1 = rs, min(re_, lay.rows)
        return lay, r0, r1, c0, c1

    def region_blocks(self, regions: list[Region]) -> list[tuple[Key, int]]:
        """The blocks a list of regions touches, with their bytes (views mapped onto
        their storage, see :meth:`runs`)."""
        out: list[tuple[Key, int]] = []
        for region in regions:
            lay, r0, r1, c0, c1 = self._storage_region(region)
            out.extend(lay.blocks(r0, r1, c0, c1))
        return out

    def runs(self, regions: Sequence[Region]) -> list[Run]:
        """The blocks of each region as a :data:`Run` ``(slots, bytes, per-block bytes,
        total bytes)``: its block slots in the order of :meth:`region_blocks` (a region's
        blocks are distinct), the bytes of each block when all are equal (``bytes``,
        with ``per-block bytes`` ``None``), else ``-1`` and the list of them.

        A region of a *view* (same storage name, another 2-D shape, e.g. a reshape) is
        mapped through its flat element range onto the storage's layout; a range that
        spans several storage rows is widened to whole rows (conservative: never fewer
        blocks than the data needs).
        """
        out: list[Run] = []
        app = out.append
        first = self._first_slot
        for region in regions:
            lay, r0, r1, c0, c1 = self._storage_region(region)
            br, bc, e, rows, cols = lay.br, lay.bc, lay.elem_bytes, lay.rows, lay.cols
            nbj = -(-cols // bc)
            base = first[lay.tid]
            bi0, bi1 = r0 // br, -(-r1 // br)
            bj0, bj1 = c0 // bc, -(-c1 // bc)
            if bj0 == 0 and bj1 == nbj:  # whole rows of blocks: consecutive slots
                slots: range | list[int] = range(base + bi0 * nbj, base + bi1 * nbj)
            elif bi1 - bi0 == 1:
                row = base + bi0 * nbj
                slots = range(row + bj0, row + bj1)
            else:
                row0, row1 = base + bi0 * nbj, base + bi1 * nbj
                slots = list(
                    _chain(
                        map(range, range(row0 + bj0, row1, nbj), range(row0 + bj1, row1 + 1, nbj))
                    )
                )
            full_bi1 = min(bi1, rows // br)  # rows of blocks with br rows
            full_bj1 = min(bj1, cols // bc)  # columns of blocks with bc columns
            if full_bi1 == bi1 and full_bj1 == bj1:  # no block at an edge
                nb = br * bc * e
                app((slots, nb, None, len(slots) * nb))
                continue
            inner = max(0, full_bj1 - bj0)
            edge_c = cols - (nbj - 1) * bc if bj1 > full_bj1 else 0  # last column's width
            nbs: list[int] = []
            for bi in range(bi0, bi1):
                rb = (br if bi < full_bi1 else rows - bi * br) * e
                nbs += [rb * bc] * inner
                if edge_c:
                    nbs.append(rb * edge_c)
            app((slots, -1, nbs, sum(nbs)))
        return out

    def _as_runs(self, blocks: Sequence[tuple[Key, int]]) -> list[Run]:
        """``(key, bytes)`` blocks as one-block runs (the order kept; keys may repeat)."""
        slot = self.slot_of
        return [(range(slot(k), slot(k) + 1), nb, None, nb) for k, nb in blocks]

    def _block_spread(self, slot: int, nbytes: int) -> int | tuple[int, ...]:
        """Block ``slot``'s bytes per HBM channel (cached): an int when all are equal."""
        addr = slot * self.block_bytes
        chans = len(self.channels)
        stripe = self.interleave_bytes * chans
        if addr % stripe == 0 and nbytes % stripe == 0:
            self._spread[slot] = nbytes // chans
            return nbytes // chans
        per = hbm_spread(addr, nbytes, chans, self.interleave_bytes)
        sp: int | tuple[int, ...] = per[0] if per.count(per[0]) == len(per) else tuple(per)
        self._spread[slot] = sp
        return sp

    def _charge(self, acc: list, slot: int, nbytes: int) -> None:
        """Add block ``slot``'s ``nbytes`` to an HBM transfer being assembled, ``acc`` =
        ``[bytes on every channel, per-channel vectors of uneven blocks]`` (what
        :meth:`_hbm_transfer` books)."""
        if self._aligned and not nbytes % self._stripe:
            acc[0] += nbytes // len(self.channels)
            return
        sp = self._spread.get(slot)
        if sp is None:
            sp = self._block_spread(slot, nbytes)
        if sp.__class__ is int:
            acc[0] += sp
        else:
            acc[1].append(sp)

    def _evict_l2(self, used: int, acc: list) -> tuple[int, int]:
        """Evict LRU L2 blocks while ``used`` bytes exceed L2's capacity (the last
        block stays); a dirty victim is written back first, its bytes charged to
        ``acc`` (:meth:`_charge`). Returns the bytes then used and those written back."""
        l2, cap, charge = self._l2, self.l2_capacity, self._charge
        wb = 0
        while used > cap and len(l2) > 1:
            old, v = l2.popitem(False)
            onb = v >> 1
            used -= onb
            if v & 1:  # written back first
                wb += onb
                charge(acc, old, onb)
        return used, wb

    def _hbm_transfer(self, now: int, uniform: int, odd: list[tuple[int, ...]]) -> int:
        """Book one HBM transfer at cycle ``now``: ``uniform`` bytes on every channel plus
        the per-channel vectors ``odd``; returns the cycle the last piece has arrived."""
        done = now
        chans = self.channels
        # plain ports (not traced, not spied on, no refresh windows): the booking inlined
        plain = (
            chans[0].__class__ is BandwidthPort
            and BandwidthPort.reserve is _RESERVE
            and not chans[0].refresh_cycles
        )
        if odd:
            per = map(sum, zip(*odd, strict=True), repeat(uniform))  # uniform + column sums
            if plain:
                num, den = chans[0]._num, chans[0]._den  # every channel has the same rate
                for ch, nb in zip(chans, per, strict=False):
                    if nb:
                        if now < ch.last_arrival:
                            ch.reserve(now, nb)  # raises
                        ch.last_arrival = now
                        dur = -(-nb * den // num)
                        fa = ch.free_at
                        end = ch.free_at = (now if now > fa else fa) + dur
                        ch.busy_cycles += dur
                        if end > done:
                            done = end
            else:
                for ch, nb in zip(chans, per, strict=False):
                    if nb:
                        end = ch.reserve(now, nb)
                        if end > done:
                            done = end
        elif uniform:
            if plain:
                dur = chans[0].cycles(uniform)  # every channel has the same rate
                for ch in chans:
                    if now < ch.last_arrival:
                        ch.reserve(now, uniform)  # raises
                    ch.last_arrival = now
                    fa = ch.free_at
                    end = ch.free_at = (now if now > fa else fa) + dur
                    ch.busy_cycles += dur
                    if end > done:
                        done = end
            else:
                for ch in chans:
                    end = ch.reserve(now, uniform)
                    if end > done:
                        done = end
        else:
            return now
        return done + self.hbm_latency

    # -- cache bookkeeping -----------------------------------------------------------
    # -- the two operations a DMA engine performs ------------------------------------
    def load(self, core: int, blocks: list[tuple[Key, int]], now: int) -> int:
        """Stage ``blocks`` into core ``core``'s L1, issued at cycle ``now`` (the
        current simulation time); returns the cycle the data is there.

        L1 hits cost ``l1.latency_cycles``; an L1 miss reads L2 (a hit there) or HBM (a
        miss in both, filling L2 on the way), over the L2 port and the HBM channels its
        bytes map to. The ports are shared with the other cores, so concurrent loads
        queue.
        """
        return self.load_runs(core, self._as_runs(blocks), now)

    def load_runs(self, core: int, runs: Sequence[Run], now: int) -> int:
        """:meth:`load` of the blocks given as :meth:`runs` (the same result).

        Exactly the block-by-block LRU walk, with a whole run (distinct slots) done at
        once where that walk's outcome is known from the start: every block of the run
        in the cache (all hits: none is evicted, since hits fill nothing) or none of
        them (all misses: filling them one by one, each followed by evicting LRU blocks
        while over capacity, evicts the same blocks as filling them all and then
        evicting, since the byte total only grows). L1 and L2 are separate structures,
        so a run's L2 work may go before its L1 fills. Other runs go block by block.
        """
        l1, in_l1, touch1, pop1, upd1 = self._l1_ops[core]
        l2, in_l2, touch2, pop2, upd2 = self._l2_ops
        acc: list = [0, []]  # the HBM transfer (see _charge)
        charge, evict = self._charge, self._evict_l2
        h1 = h2 = m2 = 0
        blocks = 0
        l2_bytes = hbm_bytes = 0
        used1, cap1 = self.l1_used[core], self.l1_capacity
        used2, cap2 = self.l2_used, self.l2_capacity
        wb = 0  # bytes of dirty victims written back
        for slots, nb, nbs, tot in runs:
            n = len(slots)
            blocks += n
            sizes = repeat(nb) if nbs is None else nbs
            if all(map(in_l1, slots)):  # all L1 hits
                _consume(map(touch1, slots))
                h1 += n
                continue
            if not any(map(in_l1, slots)):  # all L1 misses
                if all(map(in_l2, slots)):  # all L2 hits
                    _consume(map(touch2, slots))
                    h2 += n
                elif not any(map(in_l2, slots)):  # all L2 misses: fill, then evict
                    m2 += n
                    hbm_bytes += tot
                    if nbs is None and self._aligned and not nb % self._stripe:
                        acc[0] += nb // len(self.channels) * n  # whole stripes: even
                    else:
                        for key, b in zip(slots, sizes, strict=False):
                            charge(acc, key, b)
                    if nbs is None:
                        upd2(zip(slots, repeat(nb << 1)))
                    else:
                        upd2(zip(slots, [b << 1 for b in nbs], strict=False))
                    used2 += tot
                    if used2 > cap2:
                        used2, w = evict(used2, acc)
                        wb += w
                else:
                    for key, b in zip(slots, sizes, strict=False):
                        if in_l2(key):
                            touch2(key)
                            h2 += 1
                            continue
                        m2 += 1
                        hbm_bytes += b
                        charge(acc, key, b)
                        l2[key] = b << 1  # fill L2 (clean)
                        used2 += b
                        if used2 > cap2:
                            used2, w = evict(used2, acc)
                            wb += w
                l2_bytes += tot
                upd1(zip(slots, sizes, strict=False))  # fill L1, evict
                used1 += tot
                while used1 > cap1 and len(l1) > 1:
                    used1 -= pop1(False)[1]
                continue
            for key, b in zip(slots, sizes, strict=False):  # block by block
                if in_l1(key):
                    touch1(key)
                    h1 += 1
                    continue
                if in_l2(key):
                    touch2(key)
                    h2 += 1
                else:
                    m2 += 1
                    hbm_bytes += b
                    charge(acc, key, b)
                    l2[key] = b << 1  # fill L2 (clean)
                    used2 += b
                    if used2 > cap2:
                        used2, w = evict(used2, acc)
                        wb += w
                l2_bytes += b
                l1[key] = b  # fill L1 (the key was not there)
                used1 += b
                while used1 > cap1 and len(l1) > 1:
                    used1 -= pop1(False)[1]
        self.l1_used[core] = used1
        self.l2_used = used2
        self.writeback_bytes += wb
        c = self.counters
        hits, misses, byts = c.hits, c.misses, c.bytes
        hits["l1"] += h1
        misses["l1"] += blocks - h1
        hits["l2"] += h2
        misses["l2"] += m2
        byts["hbm"] += hbm_bytes + wb
        byts["l2"] += l2_bytes + hbm_bytes + wb  # out towards L1, fills in, victims out
        byts["l1"] += l2_bytes  # written into L1
        if not l2_bytes:
            return now + self.l1_latency
        done = self.l2_port.reserve(now, l2_bytes) + self.l2_latency
        if hbm_bytes:
            done = max(done, self._hbm_transfer(now, acc[0], acc[1]))
        return done

    def store(self, core: int, blocks: list[tuple[Key, int]], now: int) -> int:
        """Write result blocks from the core, issued at cycle ``now`` (the current
        simulation time): into L1 and through to L2 (dirty there). Returns the cycle the
        write completes (L2 port transfer and latency, and any write-back of dirty
        blocks it evicts to HBM)."""
        return self.store_runs(core, self._as_runs(blocks), now)

    def store_runs(self, core: int, runs: Sequence[Run], now: int) -> int:
        """:meth:`store` of the blocks given as :meth:`runs` (the same result; whole
        runs at once where the outcome is known, as in :meth:`load_runs`)."""
        total = dirtied = wb = 0
        l1, in_l1, touch1, pop1, upd1 = self._l1_ops[core]
        l2, in_l2, touch2, pop2, upd2 = self._l2_ops
        used1, cap1 = self.l1_used[core], self.l1_capacity
        used2, cap2 = self.l2_used, self.l2_capacity
        acc: list = [0, []]  # write-backs of the victims (see _charge)
        evict = self._evict_l2
        stored = self._stored
        for slots, nb, nbs, tot in runs:
            total += tot
            if stored is not None:
                stored.update(slots)
            sizes = repeat(nb) if nbs is None else nbs
            # into L1
            if all(map(in_l1, slots)):
                _consume(map(touch1, slots))
            elif not any(map(in_l1, slots)):
                upd1(zip(slots, sizes, strict=False))
                used1 += tot
                while used1 > cap1 and len(l1) > 1:
                    used1 -= pop1(False)[1]
            else:
                for key, b in zip(slots, sizes, strict=False):
                    if in_l1(key):
                        touch1(key)
                    else:
                        l1[key] = b
                        used1 += b
                        while used1 > cap1 and len(l1) > 1:
                            used1 -= pop1(False)[1]
            # through to L2, dirty there
            if not any(map(in_l2, slots)):  # all new: fill, then evict
                dirty = repeat(nb << 1 | 1) if nbs is None else [b << 1 | 1 for b in nbs]
                upd2(zip(slots, dirty, strict=False))
                used2 += tot
                dirtied += tot
            else:
                for key, b in zip(slots, sizes, strict=False):
                    v = l2.get(key)
                    if v is not None:
                        touch2(key)
                        if not v & 1:
                            dirtied += v >> 1
                            l2[key] = v | 1
                        continue
                    l2[key] = b << 1 | 1
                    used2 += b
                    dirtied += b
                    if used2 > cap2:
                        used2, w = evict(used2, acc)
                        wb += w
            if used2 > cap2:
                used2, w = evict(used2, acc)
                wb += w
        self.l1_used[core] = used1
        self.l2_used = used2
        self.dirtied_bytes += dirtied
        self.writeback_bytes += wb
        byts = self.counters.bytes
        byts["l1"] += total
        byts["l2"] += total + wb
        byts["hbm"] += wb
        done = self.l2_port.reserve(now, total) + self.l2_latency
        if acc[0] or acc[1]:  # the victims it evicts are written back first
            done = max(done, self._hbm_transfer(now, acc[0], acc[1]))
        return done

    def eager_mark(self, now: int) -> tuple[list[int], list[int], int, int] | None:
        """Start an eager-write-back interval at cycle ``now`` (a kernel's start): the
        cycle each channel and the L2 port are free from, and their busy cycles so
        far. ``None`` when the spec's ``memory.eager_writeback`` is off."""
        if self._stored is None:
            return None
        self._stored.clear()
        chans, l2p = self.channels, self.l2_port
        return (
            [max(now, ch.free_at) for ch in chans],
            [ch.busy_cycles for ch in chans],
            max(now, l2p.free_at),
            l2p.busy_cycles,
        )

    def eager_writeback(self, mark: tuple[list[int], list[int], int, int] | None, now: int) -> int:
        """Write dirty L2 blocks back to HBM in the idle time of the interval from
        ``mark`` (:meth:`eager_mark`) to cycle ``now`` (the kernel's end); returns the
        bytes written.

        Each channel was idle, over the interval, for its length less the cycles it was
        booked, less its refresh windows (bookings that run past ``now`` count whole:
        the idle time is never overstated), and likewise the L2 port (which reads the
        data out). The blocks eligible are the dirty ones the interval did not store
        (so each was dirty, with its present contents, before the interval began), least
        recently used first; each is written while every channel its bytes map to and
        the L2 port still have idle cycles for its piece, and the first that does not fit
        ends the pass. Written blocks stay cached, clean: evicting them later costs
        nothing. No time passes and no transfer is re-timed: the pieces fill gaps that
        already lay behind ``now``. Their bytes count at HBM and L2 and in
        ``writeback_bytes``, and their cycles in the ports' ``busy_cycles``.
        """
        if mark is None:
            return 0
        free0, busy0, free2, busy2 = mark
        chans, l2p = self.channels, self.l2_port
        idle = [
            (now - a) - (ch.busy_cycles - b) - ch.window_cycles(a, now)
            for ch, a, b in zip(chans, free0, busy0, strict=True)
        ]
        idle2 = (now - free2) - (l2p.busy_cycles - busy2)
        if idle2 <= 0 or min(idle) <= 0:
            return 0
        stored, l2 = self._stored, self._l2
        assert stored is not None
        ch0, spread_get, block_spread = chans[0], self._spread.get, self._block_spread
        written = 0
        base = 0  # cycles spent on every channel by evenly spread blocks
        avail = idle  # per channel: idle cycles less those of uneven blocks
        lo = min(avail)
        for slot, v in l2.items():
            if not v & 1 or slot in stored:
                continue
            nb = v >> 1
            c2 = l2p.cycles(nb)
            if c2 > idle2:
                break
            sp = spread_get(slot) or block_spread(slot, nb)  # its bytes per channel
            if sp.__class__ is int:
                cu = ch0.cycles(sp)  # every channel has the same rate
                if base + cu > lo:
                    break
                base += cu
            else:
                cyc = [ch.cycles(p) for ch, p in zip(chans, sp, strict=True)]
                if any(base + c > a for c, a in zip(cyc, avail, strict=True)):
                    break
                avail = [a - c for a, c in zip(avail, cyc, strict=True)]
                lo = min(avail)
            idle2 -= c2
            l2p.busy_cycles += c2
            l2[slot] = v ^ 1  # clean, in place (its LRU position kept)
            written += nb
        if written:
            for ch, i, a in zip(chans, idle, avail, strict=True):
                ch.busy_cycles += base + i - a
            self.writeback_bytes += written
            byts = self.counters.bytes
            byts["hbm"] += written
            byts["l2"] += written
        return written

    def host_write(self, regions: Sequence[Region]) -> None:
        """The host has written ``regions`` into L2 over its own interface
        (``memory.host_io: l2``): their blocks become clean L2 blocks, in order, as far
        as they fit; nothing crosses HBM and no device time passes."""
        l2 = self._l2
        for slots, nb, nbs, _tot in self.runs(regions):
            for slot, b in zip(slots, repeat(nb) if nbs is None else nbs, strict=False):
                if slot in l2:
                    continue
                if self.l2_used + b > self.l2_capacity:
                    return
                l2[slot] = b << 1
                self.l2_used += b

    def _writeback(self, slots: Sequence[int], now: int) -> int:
        """Write the dirty blocks among ``slots`` back to HBM at cycle ``now`` (they stay
        cached, clean); returns the cycle the write-backs end."""
        acc: list = [0, []]
        byts = self.counters.bytes
        l2 = self._l2
        for slot in slots:
            v = l2.get(slot)
            if v is not None and v & 1:
                nb = v >> 1
                self.writeback_bytes += nb
                self._charge(acc, slot, nb)
                byts["l2"] += nb
                byts["hbm"] += nb
                l2[slot] = v ^ 1
        return self._hbm_transfer(now, acc[0], acc[1])

    def flush(self, now: int) -> int:
        """Write every dirty L2 block back to HBM (end of a run); returns the end cycle."""
        return self._writeback(list(self._l2), now)

    def _tensor_slots(self, ref: TensorRef) -> list[int]:
        return [s for run in self.runs([(ref, 0, ref.rows, 0, ref.cols)]) for s in run[0]]

    def pim_coherence(
        self, reads: Sequence[TensorRef], writes: Sequence[TensorRef], now: int
    ) -> int:
        """Make memory coherent for processing in memory: write back the dirty cached
        blocks of the tensors the PIM units read or write, then drop the cached copies of
        those they write (the units change them behind the caches). Returns the cycle
        the write-backs end."""
        slots = [s for ref in list(reads) + list(writes) for s in self._tensor_slots(ref)]
        done = self._writeback(slots, now)
        drop = {s for ref in writes for s in self._tensor_slots(ref)}
        for slot in drop:
            v = self._l2.pop(slot, None)
            if v is not None:
                self.l2_used -= v >> 1
            for core, l1 in enumerate(self._l1):
                nb = l1.pop(slot, None)
                if nb is not None:
                    self.l1_used[core] -= nb
        return done

    def hold_channels(self, until: int) -> None:
        """Keep every HBM channel busy until ``until`` (the banks compute in place)."""
        for ch in self.channels:
            ch.free_at = max(ch.free_at, until)

    def invalidate(self) -> None:
        """Drop every cached block (a cold start)."""
        for l1 in self._l1:
            l1.clear()
        self.l1_used = [0] * len(self._l1)
        self._l2.clear()
        self.l2_used = 0
