"""The autotuner's cheap, exact answers (``wia_hw.optimize._fast_eval``, issue #12),
checked against the live emulator (``Device(spec).execute``), never stored numbers:

* ``cycles_lower_bound`` is never above the emulator's cycles, on random GEMM shapes x
  random tilings (edge tiles, both loop orders, core splits and counts, batched tiles, K chunks,
  a B operand that is an offset view) x the four shipped device specs;
* its tile facts are the emulator's own tiles and partition, field by field;
* ``canonical_tiling`` gives the same run (cycles and bytes at every level);
* ``run_within`` is ``execute`` when the kernel ends before the limit, else ``None``;
* a search that prunes finds the same best tiling, cycles and history as one that runs
  every candidate whole, and does prune.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from wia_hw.emulator.device import Device
from wia_hw.emulator.kernels import GemmKernel, GemmTiling

from wia_hw._gemm_bound import _first_loads, _gemm_facts, _tile_facts
from wia_hw._gemm_bound import device_for as _device
from wia_hw.lowering import lower
from wia_hw.optimize import AutotuneConfig, AutotuneError, autotune_model
from wia_hw.optimize._autotune import _BOUNDS, _MEASURED, _SUSPENDED, candidate_pool
from wia_hw.optimize._fast_eval import (
    PartialRun,
    canonical_tiling,
    cycles_lower_bound,
    run_within,
)
from wia_hw.runtime import open_device, resolve_workload

SPECS = ("wia-npu", "wia-edge", "a100-systolic", "tpu-v1")


def _spec(name: str):
    return open_device(name).spec


def _kernel(spec, m: int, n: int, k: int, batch: int = 1) -> GemmKernel:
    """The GEMM kernel lowering makes, at the spec's first precision (fp16 where the
    array has it; tpu-v1: int8)."""
    rates = spec.compute.array.macs_per_pe_cycle
    prec = "fp16" if "fp16" in rates else next(iter(rates))
    g = resolve_workload("gemm", M=m, N=n, K=k, batch=batch, precision=prec)
    (kern,) = [x for _, ks in lower(g, spec) for x in ks if isinstance(x, GemmKernel)]
    return kern


def _random_tiling(rng: random.Random, k: GemmKernel, max_tiles: int) -> GemmTiling:
    """Any tiling (not only the pool's), at most ``max_tiles`` tiles."""
    while True:
        t = GemmTiling(
            tm=rng.randint(1, k.m),
            tn=rng.randint(1, k.n),
            tk=rng.randint(1, k.k),
            tb=rng.randint(1, k.batch),
            order=rng.choice(("mn", "nm")),
            cores=rng.choice((0, 0, 1, 2, 3, 64)),  # a core split; 64: all of them
        )
        tiles = -(-k.batch // t.tb) * -(-k.m // t.tm) * -(-k.n // t.tn) * -(-k.k // t.tk)
        if tiles <= max_tiles:
            return t


def _cases(n_per_spec: int, seed: int):
    """(spec, kernel, tiling): random shapes, half the tilings from the autotuner's
    pool (core splits, whole multiples of the array), half anything; some kernels
    batched, some with B an offset view into another tensor."""
    rng = random.Random(seed)
    for name in SPECS:
        spec = _spec(name)
        for i in range(n_per_spec):
            batch = rng.choice((1, 1, 1, 2, 3, 8))
            m = rng.choice((1, 7, 32, 100, 128, 200, 256, 384, 640, 1024))
            n = rng.choice((2, 30, 64, 128, 200, 256, 512, 1024))
            kk = rng.choice((16, 64, 100, 256, 512, 768, 2048))
            kern = _kernel(spec, m, n, kk, batch)
            if i % 7 == 3:  # B a view at an offset (its storage first met as the view)
                kern = replace(kern, b=replace(kern.b, offset=rng.choice((64, 4096))))
            pool = candidate_pool(kern, spec, max_tiles=48) if i % 2 else []
            t = rng.choice(pool) if pool else _random_tiling(rng, kern, 48)
            yield name, spec, kern, t


def test_lower_bound_is_never_above_the_emulator():
    """240 cases over the four specs: the bound never exceeds the emulator's cycles,
    and it is not vacuous (at least half the emulator's cycles on median)."""
    ratios = []
    for name, spec, kern, t in _cases(60, seed=12):
        rec = Device(spec).execute([replace(kern, tiling=t)])[0]
        bound = cycles_lower_bound(kern, t, spec)
        assert 0 < bound <= rec.cycles, (name, kern.name, t, bound, rec.cycles)
        ratios.append(bound / rec.cycles)
    assert len(ratios) == 240
    assert sorted(ratios)[len(ratios) // 2] > 0.5
    print(f"bound / cycles: min {min(ratios):.3f}, median {sorted(ratios)[120]:.3f}")


@pytest.mark.parametrize("name", SPECS)
def test_tile_facts_are_the_emulators_tiles(name):
    """The closed-form per-core facts and first-tile operand regions (contiguous
    schedule) equal those read from the emulator's own tiles and partition; on a
    round-robin spec the bound reads those."""
    spec = _spec(name)
    dev = _device(spec)
    rng = random.Random(5)
    for _ in range(30):
        kern = _kernel(
            spec,
            rng.randint(1, 300),
            rng.randint(1, 300),
            rng.randint(1, 600),
            rng.choice((1, 2, 5)),
        )
        k = replace(kern, tiling=_random_tiling(rng, kern, 64))
        if spec.compute.tile_schedule == "contiguous":
            assert _gemm_facts(dev, k) == _tile_facts(dev, k)
            tiles, groups = dev.tiles_of(k)
            shares = Device.partition(tiles, groups, spec.compute.cores)
            firsts = [share[0].loads if share else [] for share in shares]
            assert _first_loads(k, spec.compute.cores) == firsts
        else:
            facts = _tile_facts(dev, k)
            tiles, _ = dev.tiles_of(k)
            assert sum(len(f) for f in facts) == len(tiles)


def test_canonical_tiling_gives_the_same_run():
    """Tilings whose sides exceed the kernel, or whose loop order has one row or column
    of output tiles to walk, run exactly as their canonical form."""
    rng = random.Random(3)
    checked = 0
    for name in SPECS:
        spec = _spec(name)
        for _ in range(8):
            m, n, k = rng.randint(1, 256), rng.randint(1, 256), rng.randint(1, 512)
            kern = _kernel(spec, m, n, k)
            side = rng.choice(("m", "n"))
            t = GemmTiling(
                tm=m + rng.randint(0, 64) if side == "m" else rng.randint(max(1, m // 4), m),
                tn=n + rng.randint(0, 64) if side == "n" else rng.randint(max(1, n // 4), n),
                tk=k + rng.randint(0, 64),
                order="nm",
            )
            c = canonical_tiling(kern, t)
            assert c.order == "mn" and c.tk == k and c.tm <= m and c.tn <= n
            a = Device(spec).execute([replace(kern, tiling=t)])[0]
            b = Device(spec).execute([replace(kern, tiling=c)])[0]
            assert (a.cycles, a.counters.bytes, a.counters.misses) == (
                b.cycles,
                b.counters.bytes,
                b.counters.misses,
            )
            checked += 1
    # a tiling with several rows and columns of output tiles keeps its order
    kern = _kernel(_spec("wia-npu"), 256, 256, 128)
    t = GemmTiling(tm=128, tn=128, tk=128, order="nm")
    assert canonical_tiling(kern, t) is t
    assert checked == 32


def test_run_within_is_execute_or_none():
    """Below the limit: the record of ``execute`` (cycles, bytes, misses); at or above
    it: ``None``."""
    for name, spec, kern, t in _cases(6, seed=21):
        k = replace(kern, tiling=t)
        rec = Device(spec).execute([k])[0]
        for limit in (None, rec.cycles + 1, 10 * rec.cycles):
            got = run_within(k, spec, limit)
            assert got is not None
            assert (got.cycles, got.counters.bytes, got.counters.misses) == (
                rec.cycles,
                rec.counters.bytes,
                rec.counters.misses,
            ), (name, t, limit)
        for limit in (rec.cycles, max(1, rec.cycles // 2), 1):
            assert run_within(k, spec, limit) is None, (name, t, limit)


def _same(a, b) -> bool:
    return (a.cycles, a.counters.bytes, a.counters.misses, a.counters.hits) == (
        b.cycles,
        b.counters.bytes,
        b.counters.misses,
        b.counters.hits,
    ) and dict(a.counters.stall_cycles) == dict(b.counters.stall_cycles)


def test_a_continued_run_is_the_uninterrupted_run():
    """A run stopped at several limits and continued gives execute's record; asked
    again at or below its end afterwards, it says not ended before that limit."""
    rng = random.Random(8)
    n = 0
    for name, spec, kern, t in _cases(8, seed=33):
        k = replace(kern, tiling=t)
        rec = Device(spec).execute([k])[0]
        run = PartialRun(k, spec)
        limits = sorted({max(1, int(rec.cycles * rng.random())) for _ in range(4)})
        for limit in limits:
            assert run.advance(limit) is None, (name, t, limit)
            assert run.reached_cycles == limit
        got = run.advance(rec.cycles + 1 if n % 2 else None)
        assert got is not None and _same(got, rec), (name, t, limits)
        assert run.advance(rec.cycles) is None and run.advance(None) is got
        n += 1
    assert n == 32


def test_run_within_rejects_a_limit_below_one():
    spec = _spec("wia-npu")
    kern = _kernel(spec, 64, 64, 64)
    with pytest.raises(ValueError, match="limit_cycles must be at least 1, got 0"):
        run_within(kern, spec, 0)


@pytest.mark.parametrize("method", ["grid", "random"])
def test_pruned_search_finds_what_the_whole_search_finds(method):
    """Pruning changes how candidates are decided, not what the search finds: the same
    best tiling and cycles, and the same best-so-far after every trial."""
    g = resolve_workload("gemm", M=384, N=512, K=768)
    out = {}
    for prune in (True, False):
        _clear()
        cfg = AutotuneConfig(
            method=method, time_budget_seconds=None, max_trials=40, seed=1, prune=prune
        )
        out[prune] = autotune_model(g, cfg, device="wia-npu")
    (a,), (b,) = out[True].kernels.values(), out[False].kernels.values()
    assert (a.best, a.best_cycles, a.history) == (b.best, b.best_cycles, b.history)
    assert out[True].pruned + out[True].cut > 0
    assert out[True].measured < out[False].measured
    assert out[False].pruned == out[False].cut == 0


def _clear() -> None:
    _MEASURED.clear()
    _BOUNDS.clear()
    _SUSPENDED.clear()


def test_a_search_does_not_depend_on_what_the_caches_hold():
    """The ML tuner learns from what the evaluations answer; with pruning, an answer
    depends only on the candidate and the best so far, so a search after another one
    that measured many candidates whole gives what it gives in a fresh process."""
    g = resolve_workload("gemm", M=384, N=512, K=768)
    cfg = AutotuneConfig(method="ml", time_budget_seconds=None, max_trials=24, batch_size=4, seed=2)
    _clear()
    fresh = autotune_model(g, cfg, device="wia-npu")
    _clear()
    autotune_model(g, replace(cfg, prune=False), device="wia-npu")  # every one whole
    warm = autotune_model(g, cfg, device="wia-npu")
    (a,), (b,) = fresh.kernels.values(), warm.kernels.values()
    assert (a.best, a.best_cycles, a.history) == (b.best, b.best_cycles, b.history)
    assert fresh.pruned + fresh.cut > 0 and warm.cache_hits > fresh.cache_hits


def test_prune_must_be_a_bool():
    with pytest.raises(AutotuneError, match="AutotuneConfig.prune must be True or False"):
        AutotuneConfig(prune="yes")  # type: ignore[arg-type]
