"""Exact results of the emulator, pinned so that a speed-up cannot change a cycle or a
counter without a test failing.

Two kinds of check:

* the memory system's fast paths (slot-keyed caches, whole runs of blocks at once)
  against a plain block-by-block LRU walk written here from the module's contract, on
  random regions, views and cache sizes (hits, misses, bytes, LRU order, dirty bits,
  channel bookings and completion cycles all equal);
* whole runs on three devices pinned to the values the emulator gave before its hot
  paths were optimised (commit 31acf76, block-by-block ``MemorySystem.load``): cycles,
  hits and misses per level, bytes per level, kernels and write-back bytes.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict

import pytest
from wia_hw.emulator.counters import Counters
from wia_hw.emulator.kernels import TensorRef
from wia_hw.emulator.memory import MemorySystem, hbm_spread

import wia_hw
from wia_hw.spec import load_spec
from wia_hw.workloads import build, gemm


# -- the reference: one block at a time ------------------------------------------------
class _Reference:
    """The memory system's contract, block by block: L1 per core and L2 are LRU
    ``OrderedDict``\\s keyed ``(tid, bi, bj)``; a transfer's HBM bytes go to the channels
    :func:`hbm_spread` gives for each block's address, each channel with bytes booked at
    the issue cycle; the transfer ends when the last is done, plus the HBM latency."""

    def __init__(self, mem: MemorySystem) -> None:
        self.mem = mem  # its ports, layout and counters are the reference's
        self.l1: list[OrderedDict] = [OrderedDict() for _ in mem._l1]
        self.l1_used = [0] * len(mem._l1)
        self.l2: OrderedDict = OrderedDict()
        self.l2_used = 0
        self.dirtied = self.written_back = 0

    def _hbm(self, now: int, blocks: list) -> int:
        m = self.mem
        per = [0] * len(m.channels)
        for key, nb in blocks:
            spread = hbm_spread(m.block_address(key), nb, len(m.channels), m.interleave_bytes)
            per = [a + b for a, b in zip(per, spread, strict=True)]
        done = now
        for ch, nb in zip(m.channels, per, strict=True):
            if nb:
                done = max(done, ch.reserve(now, nb))
        return done + m.hbm_latency if blocks else now

    def _fill_l1(self, core: int, key: tuple, nb: int) -> None:
        l1 = self.l1[core]
        l1[key] = nb
        self.l1_used[core] += nb
        while self.l1_used[core] > self.mem.l1_capacity and len(l1) > 1:
            self.l1_used[core] -= l1.popitem(last=False)[1]

    def _fill_l2(self, key: tuple, nb: int, dirty: int, victims: list) -> None:
        self.l2[key] = [nb, dirty]
        self.l2_used += nb
        while self.l2_used > self.mem.l2_capacity and len(self.l2) > 1:
            old, (onb, d) = self.l2.popitem(last=False)
            self.l2_used -= onb
            if d:
                victims.append((old, onb))

    def load(self, core: int, blocks: list, now: int) -> int:
        c, m = self.mem.counters, self.mem
        from_l2 = 0
        hbm: list = []
        for key, nb in blocks:
            if key in self.l1[core]:
                self.l1[core].move_to_end(key)
                c.hits["l1"] += 1
                continue
            c.misses["l1"] += 1
            if key in self.l2:
                self.l2.move_to_end(key)
                c.hits["l2"] += 1
            else:
                c.misses["l2"] += 1
                hbm.append((key, nb))
                victims: list = []
                self._fill_l2(key, nb, 0, victims)
                hbm += victims
                self.written_back += sum(b for _, b in victims)
            from_l2 += nb
            self._fill_l1(core, key, nb)
        hbm_bytes = sum(b for _, b in hbm)
        c.bytes["hbm"] += hbm_bytes
        c.bytes["l2"] += from_l2 + hbm_bytes
        c.bytes["l1"] += from_l2
        if not from_l2:
            return now + m.l1_latency
        done = m.l2_port.reserve(now, from_l2) + m.l2_latency
        return max(done, self._hbm(now, hbm)) if hbm else done

    def store(self, core: int, blocks: list, now: int) -> int:
        c, m = self.mem.counters, self.mem
        total = 0
        victims: list = []
        for key, nb in blocks:
            total += nb
            if key in self.l1[core]:
                self.l1[core].move_to_end(key)
            else:
                self._fill_l1(core, key, nb)
            ent = self.l2.get(key)
            if ent is not None:
                self.l2.move_to_end(key)
                if not ent[1]:
                    self.dirtied += ent[0]
                    ent[1] = 1
                continue
            self.dirtied += nb
            self._fill_l2(key, nb, 1, victims)
        wb = sum(b for _, b in victims)
        self.written_back += wb
        c.bytes["l1"] += total
        c.bytes["l2"] += total + wb
        c.bytes["hbm"] += wb
        done = m.l2_port.reserve(now, total) + m.l2_latency
        return max(done, self._hbm(now, victims)) if victims else done


def _state(mem: MemorySystem) -> tuple:
    c = mem.counters
    ports = [(p.free_at, p.busy_cycles) for p in [mem.l2_port, *mem.channels]]
    return (
        [list(v.items()) for v in mem.l1],
        list(mem.l2.items()),
        mem.l1_used,
        mem.l2_used,
        dict(c.hits),
        dict(c.misses),
        dict(c.bytes),
        ports,
    )


def _ref_state(ref: _Reference) -> tuple:
    c = ref.mem.counters
    m = ref.mem
    ports = [(p.free_at, p.busy_cycles) for p in [m.l2_port, *m.channels]]
    return (
        [list(d.items()) for d in ref.l1],
        list(ref.l2.items()),
        ref.l1_used,
        ref.l2_used,
        dict(c.hits),
        dict(c.misses),
        dict(c.bytes),
        ports,
    )


def _random_region(rng: random.Random, tensors: list[TensorRef]):
    ref = rng.choice(tensors)
    if rng.random() < 0.2:  # a view: the same storage as another shape
        flat = ref.rows * ref.cols
        cols = rng.choice([c for c in (1, 2, 3, 4, 8, 16, 48, 64) if flat % c == 0] or [1])
        ref = TensorRef(ref.name, flat // cols, cols, ref.elem_bytes)
    if rng.random() < 0.3:
        return (ref, 0, ref.rows, 0, ref.cols)
    r0, c0 = rng.randrange(ref.rows), rng.randrange(ref.cols)
    return (ref, r0, rng.randint(r0 + 1, ref.rows), c0, rng.randint(c0 + 1, ref.cols))


@pytest.mark.parametrize(
    "seed, device, over",
    [
        (1, "wia-edge", {"memory.l1.size_kib": 64, "memory.l2.size_kib": 256}),
        (2, "wia-edge", {"memory.hbm.channels": 3, "memory.l1.size_kib": 128}),
        (3, "wia-npu", {"memory.l1.size_kib": 1024, "memory.l2.size_kib": 2048}),
        (4, "wia-npu", {"memory.hbm.channels": 6, "memory.l2.size_kib": 4096}),
    ],
)
def test_runs_equal_the_block_by_block_lru_walk(seed, device, over):
    spec = load_spec(device, over)
    rng = random.Random(seed)
    fast = MemorySystem(spec, Counters())
    slow = MemorySystem(spec, Counters())
    ref = _Reference(slow)
    tensors = [
        TensorRef(f"t{i}", rng.randint(1, 700), rng.randint(1, 900), rng.choice([1, 2, 4]))
        for i in range(6)
    ]
    cores = spec.compute.cores
    now = 0
    for step in range(400):
        regions = [_random_region(rng, tensors) for _ in range(rng.randint(1, 4))]
        core = rng.randrange(cores)
        now += rng.choice([0, 0, 1, 50, 5000])
        # both systems lay tensors out in the same order, so keys and slots agree
        runs = fast.runs(regions)
        blocks = slow.region_blocks(regions)
        assert sum(r[3] for r in runs) == sum(nb for _, nb in blocks)
        if rng.random() < 0.6:
            assert fast.load_runs(core, runs, now) == ref.load(core, blocks, now), step
        else:
            assert fast.store_runs(core, runs, now) == ref.store(core, blocks, now), step
        assert _state(fast) == _ref_state(ref), step
        assert fast.dirtied_bytes == ref.dirtied and fast.writeback_bytes == ref.written_back
    # the runs name the blocks region_blocks lists, in its order
    regions = [_random_region(rng, tensors) for _ in range(8)]
    assert [(fast.slot_of(k), nb) for k, nb in fast.region_blocks(regions)] == [
        (s, nb if nbs is None else nbs[i])
        for slots, nb, nbs, _ in fast.runs(regions)
        for i, s in enumerate(slots)
    ]
    # the public entry points taking (key, bytes) lists give the same as the runs
    by_key, by_run = MemorySystem(spec, Counters()), MemorySystem(spec, Counters())
    for step in range(100):
        regions = [_random_region(rng, tensors) for _ in range(rng.randint(1, 3))]
        core, now = rng.randrange(cores), 10 * step
        if step % 3:
            got = by_key.load(core, by_key.region_blocks(regions), now)
            assert got == by_run.load_runs(core, by_run.runs(regions), now)
        else:
            got = by_key.store(core, by_key.region_blocks(regions), now)
            assert got == by_run.store_runs(core, by_run.runs(regions), now)
        assert _state(by_key) == _state(by_run)


def test_slots_and_keys_are_inverse():
    mem = MemorySystem(load_spec("wia-npu"), Counters())
    rng = random.Random(5)
    for i in range(10):
        ref = TensorRef(f"x{i}", rng.randint(1, 5000), rng.randint(1, 5000), 2)
        for key, _ in mem.region_blocks([(ref, 0, ref.rows, 0, ref.cols)]):
            assert mem.key_of(mem.slot_of(key)) == key
            assert mem.block_address(key) == mem.slot_of(key) * mem.block_bytes


def test_cache_views_by_key():
    """``l1`` and ``l2`` show the slot-keyed caches by (tid, bi, bj) key in LRU order,
    L2 as [bytes, dirty]; a key assigned is the most recent block."""
    mem = MemorySystem(load_spec("wia-edge"), Counters())
    a, b = TensorRef("a", 256, 256, 2), TensorRef("b", 64, 300, 2)
    mem.load(0, mem.region_blocks([(a, 0, 256, 0, 256)]), 0)
    out = mem.region_blocks([(b, 0, 64, 0, 300)])
    mem.store(0, out, 10)
    keys_a = [k for k, _ in mem.region_blocks([(a, 0, 256, 0, 256)])]
    assert list(mem.l2) == keys_a + [k for k, _ in out]
    assert [mem.l2[k] for k, _ in out] == [[nb, 1] for _, nb in out]
    assert mem.l2[keys_a[0]] == [dict(mem.region_blocks([(a, 0, 256, 0, 256)]))[keys_a[0]], 0]
    assert list(mem.l1[0].items())[-len(out) :] == out
    assert (0, 0, 0) in mem.l2 and (0, 99, 0) not in mem.l2 and (7, 0, 0) not in mem.l2
    assert "x" not in mem.l2
    last = keys_a[0]
    mem.l2[last] = [mem.l2[last][0], 1]  # an existing key keeps its place
    assert list(mem.l2)[0] == last and mem.l2[last][1] == 1
    del mem.l2[last]
    assert last not in mem.l2 and len(mem.l2) == len(keys_a) - 1 + len(out)
    mem.l2[last] = [16384, 0]  # a new key is the most recent
    assert list(mem.l2)[-1] == last


# -- whole runs, pinned ----------------------------------------------------------------
#: HBM refresh and eager write-back off: the runs below were pinned before either was
#: modelled (a run with refresh on takes the same paths, plus the windows, and the
#: trace-mode tests check that the inlined channel booking equals the ports' own
#: ``reserve`` with refresh on; eager write-back has its own tests).
NO_REFRESH = {
    "memory.hbm.refresh_interval_ns": 0,
    "memory.hbm.refresh_cycle_ns": 0,
    "memory.eager_writeback": False,
}

#: name -> (run, cycles, hits, misses, bytes, kernels, write-back bytes), as the
#: block-by-block memory model of commit 31acf76 gave them, re-pinned when the tiling
#: heuristic began to even tiles over the cores and split them for pipelining, and to
#: widen a weight-stationary array's tiles to whole storage blocks (the wia-edge run);
#: other tiles, so other counts. The memory model is unchanged, and its own tests
#: above check it block by block.
PINNED = {
    "wia-npu gemm 512x768x1024": (
        lambda: wia_hw.run(gemm(512, 768, 1024), overrides=NO_REFRESH),
        # re-pinned when the tiler began to measure a short GEMM of cold operands
        # among its tilings for fewer cores and less L1 (128 x 512 x 512 tiles): 10,679
        # cycles before
        9825,
        {"l1": 16, "l2": 44},
        {"l1": 64, "l2": 20},
        {"l1": 25690112, "l2": 13369344, "hbm": 3407872},
        1,
        0,
    ),
    "wia-npu bert-base 2 layers b2 s64": (
        lambda: wia_hw.run(build("bert-base", batch=2, seq=64, layers=2), overrides=NO_REFRESH),
        # the pooler's first-token slice reads its source in proportion, each row once
        # (commit c384170; each of its tiles read the whole source before): 48 cycles
        # and 196,608 L1 bytes fewer, the same L2 and HBM traffic
        110620,
        {"l1": 628, "l2": 284},
        {"l1": 610, "l2": 326},
        {"l1": 141633556, "l2": 106792984, "hbm": 39285772},
        34,
        1409024,
    ),
    "wia-npu 6 channels (blocks not stripe-aligned)": (
        lambda: wia_hw.run(
            gemm(384, 640, 896),
            overrides={"memory.hbm.channels": 6, "memory.l2.size_kib": 1024, **NO_REFRESH},
        ),
        # measured among the tiler's choices, as above (256^3 tiles): 10,150 before
        7518,
        {"l1": 8, "l2": 20},
        {"l1": 40, "l2": 20},
        {"l1": 14974976, "l2": 6488064, "hbm": 2326528},
        1,
        0,  # 393,216 before: the L2's dirty blocks evicted during the kernel
    ),
    "wia-edge bert-base 1 layer b1 s64": (
        lambda: wia_hw.run(
            build("bert-base", batch=1, seq=64, layers=1), device="wia-edge", overrides=NO_REFRESH
        ),
        1348042,
        {"l1": 2621, "l2": 635},
        {"l1": 1883, "l2": 1248},
        {"l1": 80766860, "l2": 50550672, "hbm": 18942472},
        21,
        2072576,
    ),
    "a100-systolic gemm 256x1024x2048 (round robin)": (
        lambda: wia_hw.run(gemm(256, 1024, 2048), device="a100-systolic", overrides=NO_REFRESH),
        # re-pinned when an output tile's K slices began to stay on one core and the
        # heuristic to keep from partial waves of them: 57,968 cycles before; 49,702
        # before the tiler measured it among its choices (now on 64 of the 108 cores)
        48221,
        {"l1": 2015, "l2": 3360},
        {"l1": 3680, "l2": 320},
        {"l1": 212287488, "l2": 68108288, "hbm": 5767168},
        1,
        0,
    ),
}


@pytest.mark.parametrize("name", list(PINNED))
def test_pinned_runs(name):
    run, cycles, hits, misses, nbytes, kernels, written_back = PINNED[name]
    r = run()
    c = r.counters
    assert r.cycles == cycles
    assert {lvl: c.hits[lvl] for lvl in hits} == hits
    assert {lvl: c.misses[lvl] for lvl in misses} == misses
    assert {lvl: c.bytes[lvl] for lvl in nbytes} == nbytes
    assert len(r.kernels) == kernels
    assert sum(k.record.writeback_bytes for k in r.kernels) == written_back
    # every L1 miss looked in L2, and L2's misses are what HBM delivered or took back
    assert c.accesses("l2") == c.misses["l1"]
    assert math.isclose(r.latency_ms, r.cycles / (r.clock_ghz * 1e6))


def test_a_run_is_byte_for_byte_repeatable():
    first = wia_hw.run(build("bert-base", batch=2, seq=64, layers=1)).to_json()
    assert wia_hw.run(build("bert-base", batch=2, seq=64, layers=1)).to_json() == first
