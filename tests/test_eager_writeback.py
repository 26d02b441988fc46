"""Eager write-back (``memory.eager_writeback``): the L2 controller writes dirty blocks
back to HBM in the idle port time of each kernel, least recently used first, so that
evicting them later costs nothing.

Properties: the blocks a kernel stored stay dirty (only blocks dirty before it began
are written); the pieces fit each channel's and the L2 port's idle time (so a kernel's
HBM bytes, eager ones included, never exceed what its channels could carry in its
cycles); every byte is counted (HBM and L2 counters, ``writeback_bytes``); turning it
off gives back the write-on-evict model; and it never makes a run slower.
"""

from __future__ import annotations

import random

import pytest
from wia_hw.emulator.counters import Counters
from wia_hw.emulator.device import Device
from wia_hw.emulator.errors import SpecError
from wia_hw.emulator.kernels import TensorRef
from wia_hw.emulator.memory import MemorySystem

from wia_hw.lowering import lower
from wia_hw.spec import load_spec
from wia_hw.workloads import build

OFF = {"memory.eager_writeback": False}


def _dirty(mem: MemorySystem) -> set[int]:
    return {slot for slot, v in mem._l2.items() if v & 1}


def test_a_pass_writes_only_blocks_dirty_before_the_interval_lru_first():
    spec = load_spec("wia-npu")
    mem = MemorySystem(spec, Counters())
    refs = [TensorRef(f"t{i}", 512, 256, 2) for i in range(4)]  # two blocks each
    now = 0
    for ref in refs[:3]:
        now = mem.store(0, mem.region_blocks([(ref, 0, ref.rows, 0, ref.cols)]), now)
    before = _dirty(mem)
    mark = mem.eager_mark(now)
    # during the interval: t1 is stored again, t3 is new
    for ref in (refs[1], refs[3]):
        now = mem.store(0, mem.region_blocks([(ref, 0, ref.rows, 0, ref.cols)]), now)
    stored = {
        mem.slot_of(k)
        for r in (refs[1], refs[3])
        for k, _ in mem.region_blocks([(r, 0, r.rows, 0, r.cols)])
    }
    hbm0, wb0 = mem.counters.bytes["hbm"], mem.writeback_bytes
    written = mem.eager_writeback(mark, now + 1_000_000)  # ample idle time
    eligible = before - stored
    assert written == sum(mem._l2[s] >> 1 for s in eligible) > 0
    assert _dirty(mem) == stored  # what the interval stored stays dirty
    assert mem.counters.bytes["hbm"] - hbm0 == written == mem.writeback_bytes - wb0


def test_a_pass_fits_the_idle_time_and_goes_least_recent_first():
    """With idle time for some blocks only, the least recently used dirty ones are
    written, as many as the channels' idle cycles hold, and no more."""
    rng = random.Random(7)
    spec = load_spec(
        "wia-npu", {"memory.hbm.refresh_interval_ns": 0, "memory.hbm.refresh_cycle_ns": 0}
    )
    for _ in range(20):
        mem = MemorySystem(spec, Counters())
        refs = [TensorRef(f"t{i}", 256, 256, 2) for i in range(rng.randint(2, 8))]
        now = 0
        for ref in refs:
            now = mem.store(0, mem.region_blocks([(ref, 0, ref.rows, 0, ref.cols)]), now)
        order = [s for s, v in mem._l2.items() if v & 1]
        nb = mem.block_bytes  # each tensor is one block
        per_block = mem.channels[0].cycles(nb // len(mem.channels))
        l2_block = mem.l2_port.cycles(nb)
        gap = rng.randint(0, len(order) + 1) * max(per_block, l2_block) + rng.randint(
            0, per_block - 1
        )
        start = max([now, mem.l2_port.free_at, *(ch.free_at for ch in mem.channels)])
        mark = mem.eager_mark(start)
        written = mem.eager_writeback(mark, start + gap)
        fits = min(gap // per_block, gap // l2_block, len(order))
        assert written == fits * nb
        assert [s for s, v in mem._l2.items() if v & 1] == order[fits:]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kernels_carry_no_more_hbm_bytes_than_their_cycles_allow_and_runs_are_never_slower(seed):
    rng = random.Random(seed)
    kind = rng.choice(["bert-base", "gpt2"])
    graph = build(kind, batch=rng.choice([1, 2, 4]), seq=rng.choice([64, 128]), layers=2)
    spec = load_spec("wia-npu", {"memory.l2.size_kib": rng.choice([2048, 4096, 8192])})
    lowered = lower(graph, spec)
    ends, eager_total = [], 0
    for sp in (spec, load_spec(spec, OFF)):
        dev = Device(sp)
        peak = sp.bytes_per_cycle(sp.memory.hbm.bandwidth_gbs)
        for _, kernels in lowered:
            for rec in dev.execute(kernels):
                assert rec.counters.bytes["hbm"] <= peak * rec.cycles  # eager bytes included
                eager_total += rec.eager_writeback_bytes
        dev.flush()
        ends.append((dev.now, dev.counters.bytes["hbm"]))
    assert eager_total > 0
    assert ends[0][0] <= ends[1][0]  # never slower


def test_off_writes_back_only_on_eviction_and_bad_value_is_one_line():
    graph = build("bert-base", batch=2, seq=128, layers=2)
    for overrides, eager in ((OFF, False), ({}, True)):
        spec = load_spec("wia-npu", overrides)
        dev = Device(spec)
        recs = [r for _, kernels in lower(graph, spec) for r in dev.execute(kernels)]
        assert (sum(r.eager_writeback_bytes for r in recs) > 0) is eager
        assert all(r.eager_writeback_bytes <= r.writeback_bytes for r in recs)
    with pytest.raises(SpecError, match=r"eager_writeback: must be true or false, got 'yes'"):
        load_spec("wia-npu", {"memory.eager_writeback": "yes"})
