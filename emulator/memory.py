"""The memory hierarchy: tiled block layout, block-granular LRU caches, bandwidth ports.

Data moves in *blocks*: every tensor is stored in a tiled layout of ``br`` x ``bc``
element blocks of about ``memory.block_bytes`` bytes, and a block is the unit that hits
or misses. L1 is one LRU per core, L2 one LRU shared by all cores (write-back,
write-allocate), HBM is interleaved over channels by block. Which blocks a tile touches
depends on the tiling and the loop order, so those choices change the hit and miss
counts the profiler sees.

Bytes counted at a level are the bytes that cross that level's port: reads by the
array or vector unit and fills for L1, fills of L1 and write-backs from it for L2,
reads and write-backs for HBM.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from .config import DeviceSpec
from .counters import Counters
from .kernels import Region, TensorRef

__all__ = ["BandwidthPort", "BlockLayout", "MemorySystem", "Region"]

Key = tuple[int, int, int]



class BandwidthPort:
    """A FIFO server that moves bytes at a fixed rate: a memory channel or SRAM port.

    ``reserve(now, nbytes)`` books the port for ``ceil(nbytes / bytes_per_cycle)``
    cycles starting when it is free and at or after ``now``, and returns the cycle the
    transfer ends. Called by SimPy processes in simulation-time order, this is exactly
    a ``simpy.Resource(capacity=1)`` whose holder's service time is known when it
    requests (tests check the equivalence), at one call instead of three events.
    """

    __slots__ = ("bytes_per_cycle", "free_at", "busy_cycles", "name", "_num", "_den")

    def __init__(self, name: str, bytes_per_cycle: Fraction) -> None:
        if bytes_per_cycle <= 0:
            raise ValueError(f"bytes_per_cycle must be positive, got {bytes_per_cycle}")
        self.name = name
        self.bytes_per_cycle = Fraction(bytes_per_cycle)
        self._num = self.bytes_per_cycle.numerator
        self._den = self.bytes_per_cycle.denominator
        self.free_at = 0
        self.busy_cycles = 0

    def cycles(self, nbytes: int) -> int:
        """``transfer_cycles(nbytes, bytes_per_cycle)`` in integer arithmetic."""
        return -(-nbytes * self._den // self._num)

    def reserve(self, now: int, nbytes: int) -> int:
        if nbytes <= 0:
            return now
        start = now if now > self.free_at else self.free_at
        dur = -(-nbytes * self._den // self._num)
        self.free_at = start + dur
        self.busy_cycles += dur
        return self.free_at


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
        return cls(tid, ref.rows, ref.cols, br, bc, ref.elem_bytes)

    def blocks(self, r0: int, r1: int, c0: int, c1: int) -> list[tuple[Key, int]]:
        """The blocks covering rows ``[r0, r1)`` x cols ``[c0, c1)``, with their bytes."""
        br, bc, e = self.br, self.bc, self.elem_bytes
        out = []
        for bi in range(r0 // br, -(-r1 // br)):
            rb = min(br, self.rows - bi * br) * e
            for bj in range(c0 // bc, -(-c1 // bc)):
                out.append(((self.tid, bi, bj), rb * min(bc, self.cols - bj * bc)))
        return out


class MemorySystem:
    """L1 per core, shared L2, HBM channels; owns the hit/miss/byte counters."""

    def __init__(self, spec: DeviceSpec, counters: Counters) -> None:
        m = spec.memory
        self.spec = spec
        self.counters = counters
        self.block_bytes = m.block_bytes
        self.l1_capacity = m.l1.size_bytes
        self.l2_capacity = m.l2.size_bytes
        cores = spec.compute.cores
        self.l1: list[OrderedDict[Key, int]] = [OrderedDict() for _ in range(cores)]
        self.l1_used = [0] * cores
        self.l2: OrderedDict[Key, list[int]] = OrderedDict()   # key -> [bytes, dirty]
        self.l2_used = 0
        self.l1_ports = [BandwidthPort(f"l1.{c}", spec.bytes_per_cycle(m.l1.bandwidth_gbs))
                         for c in range(cores)]
        self.l2_port = BandwidthPort("l2", spec.bytes_per_cycle(m.l2.bandwidth_gbs))
        per_ch = spec.bytes_per_cycle(m.hbm.bandwidth_gbs) / m.hbm.channels
        self.channels = [BandwidthPort(f"hbm.{i}", per_ch) for i in range(m.hbm.channels)]
        self.hbm_latency = math.ceil(m.hbm.latency_ns * spec.clock_ghz)
        self.l2_latency = m.l2.latency_cycles
        self.l1_latency = m.l1.latency_cycles
        self._layouts: dict[str, BlockLayout] = {}
        self.hbm_written_tensors: set[str] = set()
        #: Bytes of L2 blocks that became dirty (each is written back to HBM once, later)
        #: and bytes written back; a kernel's deltas attribute write-backs to the writer.
        self.dirtied_bytes = 0
        self.writeback_bytes = 0

    # -- layout ----------------------------------------------------------------------
    def layout(self, ref: TensorRef) -> BlockLayout:
        lay = self._layouts.get(ref.name)
        if lay is None:
            lay = BlockLayout.for_tensor(len(self._layouts), ref, self.block_bytes)
            self._layouts[ref.name] = lay
        return lay

    def region_blocks(self, regions: list[Region]) -> list[tuple[Key, int]]:
        """The blocks a list of regions touches.

        A region of a *view* (same storage name, another 2-D shape, e.g. a reshape) is
        mapped through its flat element range onto the storage's layout; a range that
        spans several storage rows is widened to whole rows (conservative: never fewer
        blocks than the data needs).
        """
        out: list[tuple[Key, int]] = []
        for ref, r0, r1, c0, c1 in regions:
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
            out.extend(lay.blocks(r0, r1, c0, c1))
        return out

    def _channel(self, key: Key) -> int:
        tid, bi, bj = key
        return (tid * 7919 + bi * 131 + bj) % len(self.channels)

    # -- cache bookkeeping -----------------------------------------------------------
    def _l2_insert(self, key: Key, nbytes: int, dirty: bool, hbm: list[int]) -> None:
        c = self.counters
        ent = self.l2.get(key)
        if ent is not None:
            self.l2.move_to_end(key)
            if dirty:
                self.dirtied_bytes += 0 if ent[1] else ent[0]
                ent[1] = 1
            return
        self.l2[key] = [nbytes, int(dirty)]
        self.l2_used += nbytes
        self.dirtied_bytes += nbytes if dirty else 0
        while self.l2_used > self.l2_capacity and len(self.l2) > 1:
            old, (nb, d) = self.l2.popitem(last=False)
            self.l2_used -= nb
            if d:                       # write-back of a dirty block
                self.writeback_bytes += nb
                hbm[self._channel(old)] += nb
                c.bytes["l2"] += nb
                c.bytes["hbm"] += nb

    def _l1_insert(self, core: int, key: Key, nbytes: int) -> None:
        l1 = self.l1[core]
        if key in l1:
            l1.move_to_end(key)
            return
        l1[key] = nbytes
        self.l1_used[core] += nbytes
        while self.l1_used[core] > self.l1_capacity and len(l1) > 1:
            _, nb = l1.popitem(last=False)
            self.l1_used[core] -= nb

    def _hbm_transfer(self, now: int, per_channel: list[int]) -> int:
        done = now
        for ch, nb in enumerate(per_channel):
            if nb:
                done = max(done, self.channels[ch].reserve(now, nb) + self.hbm_latency)
        return done

    # -- the two operations a DMA engine performs ------------------------------------
    def load(self, core: int, blocks: list[tuple[Key, int]], now: int) -> int:
        """Stage ``blocks`` into core ``core``'s L1; returns the cycle the data is there.

        L1 hits cost nothing to stage; an L1 miss reads L2 (a hit there) or HBM (a miss
        in both, filling L2 on the way). HBM channels and the L2 port are shared with
        the other cores, so concurrent loads queue.
        """
        c = self.counters
        hits, misses, byts = c.hits, c.misses, c.bytes
        l1 = self.l1[core]
        l2 = self.l2
        hbm = [0] * len(self.channels)
        l2_bytes = 0
        any_hbm = False
        used1, cap1 = self.l1_used[core], self.l1_capacity
        for key, nb in blocks:
            if key in l1:
                l1.move_to_end(key)
                hits["l1"] += 1
                continue
            misses["l1"] += 1
            ent = l2.get(key)
            if ent is not None:
                l2.move_to_end(key)
                hits["l2"] += 1
            else:
                misses["l2"] += 1
                hbm[self._channel(key)] += nb
                byts["hbm"] += nb
                byts["l2"] += nb            # the fill written into L2
                any_hbm = True
                self._l2_insert(key, nb, False, hbm)
            l2_bytes += nb
            l1[key] = nb                    # fill L1 (the key was not there)
            used1 += nb
            while used1 > cap1 and len(l1) > 1:
                used1 -= l1.popitem(last=False)[1]
        self.l1_used[core] = used1
        byts["l2"] += l2_bytes              # read out of L2 towards L1
        byts["l1"] += l2_bytes              # written into L1
        if not l2_bytes:
            return now + self.l1_latency
        done = self.l2_port.reserve(now, l2_bytes) + self.l2_latency
        if any_hbm:
            done = max(done, self._hbm_transfer(now, hbm))
        return done

    def store(self, core: int, blocks: list[tuple[Key, int]], now: int) -> int:
        """Write result blocks from the core: into L1 and through to L2 (dirty there).

        Returns the cycle the write completes (it does not stall the array: the DMA
        engine drains results while the next tile computes).
        """
        byts = self.counters.bytes
        hbm = [0] * len(self.channels)
        total = 0
        for key, nb in blocks:
            byts["l1"] += nb
            byts["l2"] += nb
            total += nb
            self._l1_insert(core, key, nb)
            self._l2_insert(key, nb, True, hbm)
        done = self.l2_port.reserve(now, total) + self.l2_latency
        if any(hbm):
            done = max(done, self._hbm_transfer(now, hbm))
        return done

    def flush(self, now: int) -> int:
        """Write every dirty L2 block back to HBM (end of a run); returns the end cycle."""
        hbm = [0] * len(self.channels)
        for key, ent in self.l2.items():
            if ent[1]:
                self.writeback_bytes += ent[0]
                hbm[self._channel(key)] += ent[0]
                self.counters.bytes["l2"] += ent[0]
                self.counters.bytes["hbm"] += ent[0]
                ent[1] = 0
        return self._hbm_transfer(now, hbm) if any(hbm) else now

    def pim_coherence(self, reads: Sequence[TensorRef], writes: Sequence[TensorRef],
                      now: int) -> int:
        """Make memory coherent for processing in memory: write back the dirty cached
        blocks of the tensors the PIM units read or write, then drop the cached copies of
        those they write (the units change them behind the caches). Returns the cycle
        the write-backs end."""
        hbm = [0] * len(self.channels)
        byts = self.counters.bytes
        for ref in list(reads) + list(writes):
            for key, _ in self.region_blocks([(ref, 0, ref.rows, 0, ref.cols)]):
                ent = self.l2.get(key)
                if ent is not None and ent[1]:
                    self.writeback_bytes += ent[0]
                    hbm[self._channel(key)] += ent[0]
                    byts["l2"] += ent[0]
                    byts["hbm"] += ent[0]
                    ent[1] = 0
        drop = {key for ref in writes
                for key, _ in self.region_blocks([(ref, 0, ref.rows, 0, ref.cols)])}
        for key in drop:
            ent = self.l2.pop(key, None)
            if ent is not None:
                self.l2_used -= ent[0]
            for core, l1 in enumerate(self.l1):
                nb = l1.pop(key, None)
                if nb is not None:
                    self.l1_used[core] -= nb
        return self._hbm_transfer(now, hbm) if any(hbm) else now

    def hold_channels(self, until: int) -> None:
        """Keep every HBM channel busy until ``until`` (the banks compute in place)."""
        for ch in self.channels:
            ch.free_at = max(ch.free_at, until)

    def invalidate(self) -> None:
        """Drop every cached block (a cold start)."""
        for l1 in self.l1:
            l1.clear()
        self.l1_used = [0] * len(self.l1)
        self.l2.clear()
        self.l2_used = 0
