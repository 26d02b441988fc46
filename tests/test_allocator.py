"""The device memory allocator: rounding, best fit, split/merge, pooling, caching, costs."""

from __future__ import annotations

import random

import pytest
from wia_hw.emulator.allocator import (
    KIB,
    MIB,
    AllocatorConfig,
    CachingAllocator,
    DeviceOutOfMemory,
    size_class,
)

import wia_hw


def _alloc(**kw) -> CachingAllocator:
    return CachingAllocator(1 << 30, AllocatorConfig(**kw))


def test_sizes_round_up_to_round_bytes():
    a = _alloc()
    b, _ = a.malloc(1)
    assert b.size == 512 and b.requested == 1
    b2, _ = a.malloc(513)
    assert b2.size == 1024
    assert a.stats.allocated_bytes == 512 + 1024 and a.stats.requested_bytes == 514
    a.check()


def test_first_request_reserves_a_segment_and_costs_device_cycles():
    cfg = AllocatorConfig()
    a = CachingAllocator(1 << 30, cfg)
    _, c1 = a.malloc(3 * MIB)
    assert c1 == cfg.segment_alloc_cycles
    assert a.stats.reserved_bytes == 4 * MIB  # round_up(3 MiB, 2 MiB)
    _, c2 = a.malloc(512 * KIB)  # the 1 MiB split-off tail serves it
    assert c2 == 0 and a.stats.num_segment_allocs == 1
    a.check()


def test_best_fit_picks_the_smallest_block_that_fits():
    a = _alloc()
    blocks = [a.malloc(s * MIB)[0] for s in (8, 2, 4, 2)]  # four 2-MiB-multiple segments
    a.free(blocks[0])
    a.free(blocks[2])
    b, c = a.malloc(3 * MIB)
    assert c == 0 and b.address == blocks[2].address  # the 4 MiB hole, not the 8 MiB one
    a.check()


def test_free_merges_neighbours_back_into_one_block():
    a = _alloc()
    xs = [a.malloc(256 * KIB)[0] for _ in range(8)]  # one 2 MiB segment, split 8 ways
    assert a.stats.num_segment_allocs == 1
    for i in (1, 3, 5, 7, 0, 2, 4, 6):
        a.free(xs[i])
        a.check()  # no two free neighbours
    assert a.free_ranges() == [2 * MIB]


def test_double_free_and_foreign_block_raise():
    a, other = _alloc(), _alloc()
    b, _ = a.malloc(100)
    a.free(b)
    with pytest.raises(ValueError, match="not allocated here"):
        a.free(b)
    b2, _ = other.malloc(100)
    with pytest.raises(ValueError, match="not allocated here"):
        a.free(b2)
    with pytest.raises(TypeError, match="takes a Block"):
        a.free(123)


@pytest.mark.parametrize(
    "bad, exc, msg",
    [
        (0, ValueError, "nbytes must be a positive integer, got 0"),
        (-5, ValueError, "nbytes must be a positive integer, got -5"),
        (1.5, TypeError, "nbytes must be an integer, got 1.5"),
        (True, TypeError, "nbytes must be an integer, got True"),
    ],
)
def test_bad_sizes_raise(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        _alloc().malloc(bad)


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"round_bytes": 500}, "round_bytes must be a power of two, got 500"),
        ({"segment_bytes": 0}, "segment_bytes must be a positive integer, got 0"),
        ({"pool_max_bytes": 4 * MIB}, "need round_bytes <= pool_max_bytes <= segment_bytes"),
        ({"segment_alloc_cycles": -1}, "segment_alloc_cycles must be a non-negative integer"),
        ({"pooling": 1}, "pooling must be a bool, got 1"),
    ],
)
def test_config_errors(kw, msg):
    with pytest.raises((TypeError, ValueError), match=msg):
        AllocatorConfig(**kw)


def test_out_of_memory_names_the_figures():
    a = CachingAllocator(8 * MIB)
    a.malloc(6 * MIB)
    with pytest.raises(DeviceOutOfMemory, match=r"cannot allocate .* 8 MiB, 6.00 MiB allocated"):
        a.malloc(4 * MIB)


def test_cache_is_given_back_before_running_out():
    a = CachingAllocator(8 * MIB)
    x, _ = a.malloc(6 * MIB)
    a.free(x)  # stays reserved (cached)
    assert a.stats.reserved_bytes == 6 * MIB
    y, c = a.malloc(8 * MIB)  # needs the cached segment released first
    cfg = a.config
    assert c == cfg.segment_free_cycles + cfg.segment_alloc_cycles
    assert y.size == 8 * MIB and a.stats.reserved_bytes == 8 * MIB
    a.check()


def test_caching_off_releases_segments_at_once():
    cached, raw = _alloc(), _alloc(caching=False)
    for a in (cached, raw):
        for _ in range(10):
            b, _ = a.malloc(5 * MIB)
            a.free(b)
    assert cached.stats.num_segment_allocs == 1
    assert raw.stats.num_segment_allocs == raw.stats.num_segment_frees == 10
    cfg = raw.config
    assert raw.stats.device_cycles == 10 * (cfg.segment_alloc_cycles + cfg.segment_free_cycles)
    assert cached.empty_cache() == cfg.segment_free_cycles and cached.stats.reserved_bytes == 0


def test_size_classes_four_per_doubling():
    assert [size_class(n) for n in (1, 512, 513, 1025, 2048, 65537, 100_000)] == [
        512,
        512,
        1024,
        1536,
        2048,
        81920,
        114688,
    ]
    for n in range(1, 1 << 20, 997):
        c = size_class(n)
        assert c >= n and c % 512 == 0 and (c <= 512 or c < 1.25 * n + 512)


def test_pooled_requests_reuse_slots_of_their_class():
    a = _alloc(pooling=True)
    xs = [a.malloc(3000)[0] for _ in range(10)]
    assert {b.size for b in xs} == {size_class(3000)}
    assert a.stats.num_segment_allocs == 1  # one slab
    addr = xs[4].address
    a.free(xs[4])
    assert a.malloc(2900)[0].address == addr  # same class, same slot
    big, _ = a.malloc(3 * MIB)  # above pool_max: general pool
    assert big.segment.size_class is None and big.address < xs[0].address  # slabs on top
    a.check()


def test_random_workload_keeps_invariants_and_is_deterministic():
    def go(pooling):
        rng = random.Random(7)
        a = _alloc(pooling=pooling)
        live, log = [], []
        for _ in range(2000):
            if live and rng.random() < 0.45:
                a.free(live.pop(rng.randrange(len(live))))
            else:
                b, _ = a.malloc(rng.choice([rng.randint(1, 64 * KIB), rng.randint(1, 8 * MIB)]))
                live.append(b)
                log.append(b.address)
        a.check()
        assert sum(a.free_ranges()) <= a.stats.reserved_bytes - a.stats.allocated_bytes
        return log

    for pooling in (False, True):
        assert go(pooling) == go(pooling)


def _decode_loop(pooling: bool) -> CachingAllocator:
    """Each step: transient activations (12, 4, 12 MiB) freed at the step's end, then a
    persistent KV-cache page of 256-448 KiB (the page carves the freed blocks without
    pooling)."""
    a = _alloc(pooling=pooling)
    for i in range(32):
        tmp = [a.malloc(s * MIB)[0] for s in (12, 4, 12)]
        for b in tmp:
            a.free(b)
        a.malloc(256 * KIB + (i % 4) * 64 * KIB)
    a.check()
    return a


def _external_frag(a: CachingAllocator) -> float:
    r = a.free_ranges()
    return 100.0 * (1 - max(r) / sum(r))


def test_pooling_lowers_fragmentation_of_a_decode_loop():
    plain, pooled = _decode_loop(False), _decode_loop(True)
    assert _external_frag(plain) > 15.0
    assert _external_frag(pooled) < 0.5 * _external_frag(plain)


def test_context_allocations_cost_device_time_only_for_segments():
    ctx = wia_hw.open_device()
    cfg = ctx.allocator.config
    t0, c0 = ctx.device.now, ctx.device.counters.cycles
    buf = ctx.allocate(3 * MIB, tag="kv")
    assert ctx.device.now - t0 == cfg.segment_alloc_cycles
    assert ctx.device.counters.cycles - c0 == cfg.segment_alloc_cycles
    ctx.free(buf)
    t1 = ctx.device.now
    buf2 = ctx.allocate(3 * MIB)  # served from the cache: no device time
    assert ctx.device.now == t1 and buf2.address == buf.address
    with pytest.raises(ValueError, match="not allocated here"):
        ctx.free(buf)


def test_runs_allocate_and_release_their_memory_without_changing_time():
    from wia_hw.workloads import gemm

    ctx = wia_hw.open_device()
    r = ctx.run(gemm(512, 512, 512))
    st = ctx.allocator.stats
    g = gemm(512, 512, 512)
    tensors = sum(t.nbytes for t in g.tensors.values())
    assert st.allocated_bytes == 0 and st.num_allocs == st.num_frees
    assert st.peak_allocated_bytes >= tensors
    assert r.cycles == wia_hw.open_device().run(gemm(512, 512, 512)).cycles
