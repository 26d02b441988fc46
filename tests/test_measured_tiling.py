"""A short GEMM of cold operands (a GEMM as it runs alone) is tiled by the emulator's
own runs among the heuristic's tilings for fewer cores and less L1
(``wia_hw._tiling._measured``): more cores and more L1 are no slower for it, exactly
where the counts' choices are among each other's, and the measurement is the
emulator's run of the kernel alone."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from wia_hw.emulator.device import Device
from wia_hw.emulator.kernels import GemmKernel

import wia_hw
import wia_hw.lowering as lowering
from wia_hw._tile_estimate import _nominal
from wia_hw._tiling import MEASURED_TILES, _Gemm, _short, choose_gemm_tiling
from wia_hw.lowering import lower
from wia_hw.runtime import resolve_workload
from wia_hw.spec import load_spec


def _shape(rng: random.Random) -> tuple[int, int, int]:
    return tuple(rng.choice([64, 256, 512, 1024, 4096, rng.randint(32, 4096)]) for _ in range(3))


def _gemm(m: int, n: int, k: int, over: dict) -> tuple[int, GemmKernel]:
    """The GEMM kernel's cycles in ``wia_hw.run`` of the ``gemm`` workload, and the
    kernel as lowered."""
    r = wia_hw.run("gemm", M=m, N=n, K=k, overrides=over)
    (g,) = [x for x in r.kernels if x.kind == "gemm"]
    return g.cycles, g.kernel


def _estimate_of(spec, m: int, n: int, k: int):
    """The lowering's GemmEstimate of the ``gemm`` workload's kernel on ``spec``, and
    the kernel."""
    seen = {}
    real = lowering.gemm_estimate

    def spy(s, kern, storage=(), cold=frozenset()):
        seen["f"] = real(s, kern, storage, cold)
        return seen["f"]

    lowering.gemm_estimate = spy
    try:
        g = resolve_workload("gemm", M=m, N=n, K=k)
        (kern,) = [x for _, ks in lower(g, spec) for x in ks if isinstance(x, GemmKernel)]
    finally:
        lowering.gemm_estimate = real
    return seen["f"], kern


def test_short_gemms_are_monotone_in_cores():
    """Random shapes on 4 to 64 cores of wia-npu: the kernel on more cores never takes
    more cycles (a tiling of ``c`` cores runs on a device of more exactly as on ``c``,
    so a count's choices include every smaller count's)."""
    rng = random.Random(21)
    checked = 0
    for _ in range(10):
        m, n, k = _shape(rng)
        if not _short(load_spec("wia-npu"), _Gemm(1, m, n, k, 2, 2)):
            continue
        runs = [_gemm(m, n, k, {"compute.cores": c})[0] for c in (4, 8, 16, 32, 64)]
        assert all(b <= a for a, b in zip(runs, runs[1:], strict=False)), (m, n, k, runs)
        checked += 1
    assert checked >= 6


def test_short_gemms_are_monotone_in_l1():
    """Random shapes on 16 cores of wia-npu, L1 from 1 to 16 MiB: no kernel slower with
    more L1 (before, 384 x 256 x 4096 took 11,532 cycles at 4 MiB, 16,544 at 8: the
    heuristic's bigger tiles left cores without a second tile to overlap a load with)."""
    rng = random.Random(22)
    checked = 0
    for _ in range(10):
        m, n, k = _shape(rng)
        runs = []
        for kib in (2048, 4096, 8192, 16384):
            over = {"compute.cores": 16, "memory.l1.size_kib": kib}
            if _short(load_spec("wia-npu", over), _Gemm(1, m, n, k, 2, 2)):
                runs.append(_gemm(m, n, k, over)[0])
        # a smaller L1's tiling is among a larger one's, run in the larger L1: the
        # same blocks and more room, so no more cycles (to a few, from how loads
        # interleave with more hits)
        assert all(b <= a * 1.001 for a, b in zip(runs, runs[1:], strict=False)), (m, n, k, runs)
        checked += len(runs) > 1
    assert checked >= 6
    # the shape that showed the hole
    eight = _gemm(384, 256, 4096, {"compute.cores": 16})[0]
    four = _gemm(384, 256, 4096, {"compute.cores": 16, "memory.l1.size_kib": 4096})[0]
    assert eight <= four


def test_measure_is_the_emulators_run_alone_at_the_nominal_clock():
    """``GemmEstimate.measure`` is ``Device(spec).execute([kernel])``'s cycles at the
    nominal clock, or ``None`` exactly when they reach the limit; a hot die (which
    throttles the run itself) changes neither it nor the tiling chosen."""
    rng = random.Random(23)
    for _ in range(4):
        m, n, k = (rng.randint(64, 1500) for _ in range(3))
        spec = load_spec("wia-npu", {"compute.cores": rng.choice([4, 8, 16])})
        est, kern = _estimate_of(spec, m, n, k)
        assert est.all_cold
        want = Device(spec).execute([kern])[0]
        got, hbm = est.measure(kern.tiling)
        assert (got, hbm) == (want.end_cycle - want.start_cycle, want.counters.bytes["hbm"])
        assert est.measure(kern.tiling, got) is None  # at the limit: not below it
        assert est.measure(kern.tiling, got + 1) == (got, hbm)
        hot = replace(spec, thermal=replace(spec.thermal, initial_c=150.0))
        est_hot, kern_hot = _estimate_of(hot, m, n, k)
        assert kern_hot.tiling == kern.tiling
        assert est_hot.measure(kern.tiling) == (got, hbm)
        assert _nominal(hot).thermal == _nominal(spec).thermal


def test_measure_caches_and_rejects_nothing_it_has_cut():
    spec = load_spec("wia-npu")
    est, kern = _estimate_of(spec, 768, 1024, 512)
    full = est.measure(kern.tiling)
    assert full is not None
    assert est.measure(kern.tiling, full[0] // 2) is None  # cut (or pruned)
    assert est.measure(kern.tiling) == full  # then asked whole: the whole count


@pytest.mark.parametrize("kib", [8192, 1024])
def test_only_a_gemm_short_on_one_core_is_measured(kib, monkeypatch):
    """A GEMM is measured when the heuristic cuts it into at most MEASURED_TILES tiles
    for one core, whatever the device's core count (so every count decides alike):
    4096^3 is short with 8 MiB of L1 and long with 1 MiB."""
    from wia_hw._tile_estimate import GemmEstimate

    calls = []
    real = GemmEstimate.measure

    def spy(self, tiling, limit=None):
        calls.append(tiling)
        return real(self, tiling, limit)

    monkeypatch.setattr(GemmEstimate, "measure", spy)
    m = n = k = 4096
    one = choose_gemm_tiling(
        load_spec("wia-npu", {"compute.cores": 1, "memory.l1.size_kib": kib}), 1, m, n, k, 2, 2
    )
    tiles = -(-m // one.tm) * -(-n // one.tn) * -(-k // one.tk)
    assert (tiles <= MEASURED_TILES) == (kib == 8192), tiles
    for c in (4, 64):
        calls.clear()
        spec = load_spec("wia-npu", {"compute.cores": c, "memory.l1.size_kib": kib})
        assert _short(spec, _Gemm(1, m, n, k, 2, 2)) == (tiles <= MEASURED_TILES)
        _estimate_of(spec, m, n, k)
        assert bool(calls) == (tiles <= MEASURED_TILES), (c, kib, len(calls))
