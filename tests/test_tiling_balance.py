"""The tiling heuristic's last two steps: tiles split for pipelining, and tiles evened
over the cores (``wia_hw._tiling._balanced``), checked against the emulator's own
tiles and core shares, and end to end where a bigger L1 used to be much slower."""

from __future__ import annotations

import random

import pytest
from wia_hw.emulator.device import Device
from wia_hw.emulator.kernels import GemmKernel, GemmTiling, TensorRef

import wia_hw
import wia_hw._tiling as tiling
from wia_hw._tiling import (
    PIPELINE_TILES,
    _array_cycles,
    _even_k,
    _min_tile_cycles,
    choose_gemm_tiling,
)
from wia_hw.spec import load_spec

PREC = {1: "int8", 2: "fp16", 4: "fp32"}


def _kernel(batch: int, m: int, n: int, k: int, e: int, t: GemmTiling) -> GemmKernel:
    return GemmKernel(
        name="g",
        op="g",
        group="matmul",
        op_kind="bmm" if batch > 1 else "matmul",
        precision=PREC[e],
        batch=batch,
        m=m,
        n=n,
        k=k,
        a=TensorRef("A", batch * m, k, e),
        b=TensorRef("B", batch * k, n, e),
        c=TensorRef("C", batch * m, n, e),
        b_shared=batch == 1,
        tiling=t,
    )


def _busiest(spec, kernel: GemmKernel) -> int:
    """MAC slots of the busiest core, from the emulator's tiles and shares."""
    dev = Device(spec)
    tiles, groups = dev.tiles_of(kernel)
    shares = Device.partition(
        tiles, groups, spec.compute.cores, spec.compute.tile_schedule, [t.origin for t in tiles]
    )
    return max(sum(t.slot_macs for t in share) for share in shares)


def _unbalanced(monkeypatch, spec, *args) -> GemmTiling:
    with monkeypatch.context() as mp:
        mp.setattr(tiling, "_balanced", lambda spec, batch, m, n, k, t, e: t)
        return choose_gemm_tiling(spec, *args)


def _without_whole_blocks(monkeypatch) -> None:
    """Leave out the last step (whole block columns, which recomputes K from the
    balanced tile), so a test sees what balancing alone does."""
    monkeypatch.setattr(tiling, "_whole_blocks", lambda spec, n, k, t, e, o: t)


@pytest.mark.parametrize("seed", range(4))
def test_balancing_never_loads_the_busiest_core_more_and_only_shrinks_tiles(seed, monkeypatch):
    _without_whole_blocks(monkeypatch)
    rng = random.Random(seed)
    for _ in range(25):
        base = rng.choice(["wia-npu", "wia-edge", "tpu-v1"])
        over = {
            "compute.cores": rng.choice([2, 3, 4, 6, 8]),
            "memory.l1.size_kib": rng.choice([1024, 4096, 8192, 24576]),
            "compute.tile_schedule": rng.choice(["contiguous", "round_robin"]),
        }
        spec = load_spec(base, over)
        e = 1 if base == "tpu-v1" else rng.choice([1, 2])
        batch = rng.choice([1, 1, 3, 16])
        m, n, k = (rng.choice([1, rng.randint(1, 3000)]) for _ in range(3))
        args = (batch, m, n, k, e, e)
        before = _unbalanced(monkeypatch, spec, *args)
        after = choose_gemm_tiling(spec, *args)
        what = f"{base} {over} {args}: {before} -> {after}"
        assert (after.tk, after.order) == (before.tk, before.order), what
        assert after.tm <= before.tm and after.tn <= before.tn and after.tb <= before.tb, what
        old = _busiest(spec, _kernel(batch, m, n, k, e, before))
        new = _busiest(spec, _kernel(batch, m, n, k, e, after))
        assert new <= old, what


def test_uneven_large_tiles_are_evened_over_the_cores():
    """2048 x 2048 x 256 at 24 MiB of L1: the heuristic's tiles were 1536 x 1536 (one
    core 9 times another's work); every core now gets the same MAC slots."""
    spec = load_spec("wia-npu", {"memory.l1.size_kib": 24576})
    t = choose_gemm_tiling(spec, 1, 2048, 2048, 256, 2, 2)
    dev = Device(spec)
    tiles, _ = dev.tiles_of(_kernel(1, 2048, 2048, 256, 2, t))
    shares = Device.partition(tiles, (), spec.compute.cores)
    assert len({sum(x.slot_macs for x in s) for s in shares}) == 1, t


def test_tiles_split_for_pipelining_down_to_the_floor_only(monkeypatch):
    spec = load_spec("wia-npu")
    cores = spec.compute.cores
    # a GEMV: 1 x 4096 x 4096 fp16 has work enough for PIPELINE_TILES tiles a core
    t = choose_gemm_tiling(spec, 1, 1, 4096, 4096, 2, 2)
    assert -(-4096 // t.tn) >= PIPELINE_TILES * cores
    assert _array_cycles(spec, t.tm, t.tn, t.tb, t.tk, 2) >= _min_tile_cycles(spec)
    # a small GEMM is not split for pipelining: halving would go below the floor
    small = load_spec("wia-edge", {"compute.cores": 2})
    t = _unbalanced(monkeypatch, small, 1, 64, 96, 64, 1, 1)
    count = -(-64 // t.tm) * -(-96 // t.tn) * -(-64 // t.tk)
    assert count < PIPELINE_TILES * 2


def test_no_bandwidth_changes_the_tiling():
    """The pipelining floor is in array cycles: a faster L2, HBM or L1 port leaves
    every tiling as it is (a floor in bytes a core's L2 share moves made 512^3 8%
    slower at twice the L2 bandwidth). The heuristic has no bandwidth rule left: the K
    cut that grows the output tile is taken whenever it grows it."""
    rng = random.Random(5)
    for _ in range(40):
        batch, dims = rng.choice([1, 4]), [rng.randint(1, 4000) for _ in range(3)]
        tilings = {
            choose_gemm_tiling(load_spec("wia-npu", {path: value}), batch, *dims, 2, 2)
            for path, value in [
                ("memory.l2.bandwidth_gbs", 4000),
                ("memory.l2.bandwidth_gbs", 16000),
                ("memory.hbm.bandwidth_gbs", 2400),
                ("memory.l1.bandwidth_gbs", 8000),
            ]
        }
        assert len(tilings) == 1, (batch, dims, tilings)


@pytest.mark.parametrize(
    ("dims", "l1_kib"),
    [((2048, 2048, 256), (8192, 16384, 24576)), ((1, 4096, 4096), (4096, 8192, 16384, 32768))],
)
def test_a_bigger_l1_no_longer_makes_these_gemms_slower(dims, l1_kib):
    """With the heuristic in the loop: these were +86% (24 MiB against 8 MiB) and +36%
    (32 MiB against 8 MiB) before tiles were evened and split for pipelining; they are
    now within 1.5% of the smallest L1's time, never above it by more."""
    m, n, k = dims
    times = [
        wia_hw.run("gemm", overrides={"memory.l1.size_kib": v}, M=m, N=n, K=k).cycles
        for v in l1_kib
    ]
    assert max(times) <= times[0] * 1.015, times


def test_tiles_narrower_than_a_block_widen_to_whole_blocks_on_a_ws_array():
    """A 1 x 4096 x 4096 int8 GEMV on wia-edge (weight-stationary): B's 16 KiB blocks
    are 128 x 128 and the heuristic's tiles were 32 wide, so each block was read by four
    tiles and, from 3 cores on, evicted in between (0.87 ms on 3 cores, 1.42 ms on 4).
    Tiles of whole block columns read every block of B once; more cores are never
    slower, nor more L2 beyond the final write-back's share."""
    times = []
    for cores in (1, 2, 3, 4, 8):
        spec = load_spec("wia-edge", {"compute.cores": cores})
        t = choose_gemm_tiling(spec, 1, 1, 4096, 4096, 1, 4)
        assert t.tn % 128 == 0 and t.tk % 128 == 0, t
        assert 2 * (t.tm + t.tn) * t.tk <= spec.memory.l1.size_bytes
        r = wia_hw.run("gemm", device=spec, M=1, N=4096, K=4096, precision="int8")
        times.append(r.cycles)
        # every block of B (16 MiB) crosses HBM once; A, C and the rest are small
        assert r.counters.bytes["hbm"] < 1.05 * 4096 * 4096, (cores, r.counters.bytes)
    assert times == sorted(times, reverse=True), times
    over = [
        wia_hw.run(
            "gemm",
            device="wia-edge",
            overrides={"compute.cores": 4, "memory.l2.size_kib": v},
            M=1,
            N=4096,
            K=4096,
            precision="int8",
        ).cycles
        for v in (1024, 2048, 4096, 8192)
    ]
    # within the final write-back's share: a bigger L2 keeps more dirty blocks to the end
    assert all(b <= a * 1.001 for a, b in zip(over, over[1:], strict=False)), over
    # an output-stationary array keeps its tiles (K slices there are partial outputs)
    npu = load_spec("wia-npu")
    assert choose_gemm_tiling(npu, 1, 1, 768, 4096, 2, 2).tn % 256 != 0


def test_k_slices_are_even_and_no_more_of_them():
    """_even_k: no longer than the heuristic's slice, as many slices, a whole multiple
    of the unit when it changes anything, and the shortest slice never shorter."""
    rng = random.Random(9)
    for _ in range(2000):
        k, unit = rng.randint(1, 20000), rng.choice([1, 8, 16, 32, 128, 256])
        tk = rng.randint(1, k)
        even = _even_k(k, tk, unit)
        what = (k, tk, unit, even)
        assert even <= tk and -(-k // even) == -(-k // tk), what
        assert even == tk or even % unit == 0, what
        assert k - (-(-k // even) - 1) * even >= k - (-(-k // tk) - 1) * tk, what


def _add_run(device: str, shape: tuple[int, int], cores: int):
    from wia_hw import GraphBuilder

    b = GraphBuilder("g", "fp16")
    x, y = b.input("x", shape), b.input("y", shape)
    b.op("add", "add", [x, y])
    r = wia_hw.run(b.graph(), device=device, overrides={"compute.cores": cores})
    return r.kernels[0].record


@pytest.mark.parametrize("seed", range(6))
def test_elementwise_passes_never_reload_blocks_more_with_more_cores(seed):
    """A vector tile loads whole storage blocks. Row chunks thinner than a block's rows
    made every core load every block (128 x 768 fp16 on wia-npu: 1,020 cycles on 4
    cores, 9,268 on 64). Now no core count moves more than BLOCK_ROW_SHARES times the
    bytes one core moves between L2 and L1, and more cores are not slower by more than
    one chunking step on a tiny tensor (10%)."""
    from wia_hw.lowering import BLOCK_ROW_SHARES

    rng = random.Random(seed)
    for _ in range(6):
        device = rng.choice(["wia-npu", "wia-edge"])
        shape = (rng.choice([1, 7, 64, 128, 200, 512]), rng.choice([64, 100, 768, 3000]))
        times, moved = [], []
        for cores in (1, 2, 4, 8, 16, 64):
            rec = _add_run(device, shape, cores)
            times.append(rec.end_cycle - rec.start_cycle)
            moved.append(rec.counters.bytes["l2"])
        what = (device, shape, times, moved)
        # one core loads every block once; no more than BLOCK_ROW_SHARES chunks load one
        assert max(moved) <= BLOCK_ROW_SHARES * moved[0], what
        assert all(b <= a * 1.10 for a, b in zip(times, times[1:], strict=False)), what


@pytest.mark.parametrize("m, n, k", [(4096, 1024, 32768), (1024, 1024, 65536), (1024, 4096, 16384)])
def test_a_deep_k_gemm_whose_operands_outgrow_l2_takes_large_output_tiles(m, n, k):
    # a weight gradient's K is the step's tokens: 128 x 128 x 8192 tiles re-read A and B
    # from HBM for every column and row of output tiles (9.66 ms, 5.4 GB for the first;
    # its transpose 32768 x 1024 x 4096 takes 2.18 ms); larger output tiles re-read less
    r = wia_hw.run("gemm", M=m, N=n, K=k)
    assert r.latency_ms <= 1.1 * r.roofline_floor_ms
    compulsory = (m * k + k * n + m * n) * 2
    assert r.counters.bytes["hbm"] <= 1.5 * compulsory


@pytest.mark.parametrize("m, n, k", [(1, 8192, 28672), (8, 4096, 16384), (64, 8192, 28672)])
def test_a_decode_gemm_with_k_cut_reads_its_weights_once_on_any_number_of_cores(m, n, k):
    # 128-wide tiles used half of each 256-wide block of B while K was cut in two: LRU
    # evicted the other half before the next tile came, so B crossed HBM twice on 3 or
    # more cores (1 x 8192 x 28672: 1.69 ms on 4 cores, 1.23 on 2)
    times = []
    for cores in (2, 3, 4, 8):
        r = wia_hw.run("gemm", M=m, N=n, K=k, overrides={"compute.cores": cores})
        assert r.counters.bytes["hbm"] <= 1.1 * (k * n + m * k + m * n) * 2, cores
        assert r.latency_ms <= 1.25 * r.roofline_floor_ms, cores
        times.append(r.cycles)
    # more cores: never more than the L2-sharing departure ARCHITECTURE.md documents
    # (64 x 8192 x 28672: 0.860 ms on 3 cores, 0.904 on 4; it was 1.79 on 4)
    assert all(t <= 1.06 * min(times[:i]) for i, t in enumerate(times) if i)


@pytest.mark.parametrize(
    "m, n, k, batch",
    [(2048, 2048, 16384, 1), (4096, 512, 16384, 1), (2882, 2519, 19438, 3), (3072, 768, 8192, 1)],
)
def test_deep_k_gemms_are_monotone_in_bandwidth_l2_and_cores(m, n, k, batch):
    # the K-slice rule once hung on a yes/no estimate of HBM re-reads: 1100 GB/s took
    # up to 2.2x longer than 1000, 32 MiB of L2 2.2x longer than 16, 6 cores 3x longer
    # than 4 (a GEMM the estimate misjudged); it now takes the slice whenever it cuts
    # the bytes streamed, whatever the bandwidths and capacities
    def cycles(**over):
        return wia_hw.run("gemm", M=m, N=n, K=k, batch=batch, overrides=over).cycles

    for path, ladder in (
        ("memory.hbm.bandwidth_gbs", (600, 1000, 1100, 2400)),
        ("memory.l2.size_kib", (16384, 32768, 49152)),
        ("compute.cores", (4, 5, 6, 8)),
    ):
        ts = [cycles(**{path: v}) for v in ladder]
        assert all(b <= a * 1.04 for a, b in zip(ts, ts[1:], strict=False)), (path, ts)


@pytest.mark.parametrize("cores", [3, 5, 12, 32, 48])
def test_vector_chunks_come_in_whole_rounds_over_the_cores(cores):
    """More chunks than cores come in whole rounds (48 chunks of a softmax on 32 cores
    left 16 cores idle in the last round and put the chunks on other cores than the
    producer's: BERT-Base b8 s512 took 6.83 ms on 32 cores against 5.68 on 16)."""
    from wia_hw.emulator.kernels import TensorRef

    from wia_hw.lowering import vector_rows_per_tile
    from wia_hw.spec import load_spec

    spec = load_spec("wia-npu", {"compute.cores": cores})
    rows = 49152
    ref = TensorRef("x", rows, 512, 2)
    rpt = vector_rows_per_tile(spec, rows, [ref], [TensorRef("y", rows, 512, 2)])
    tiles = -(-rows // rpt)
    assert tiles <= cores or tiles % cores == 0
    assert rpt * 2 * 512 * 2 <= spec.memory.l1.size_bytes // 4  # within the L1 budget


def test_more_cores_no_slower_on_the_softmax_after_its_bmm():
    def cycles(cores: int) -> int:
        over = {"compute.cores": cores}
        return wia_hw.run("bert-base", batch=8, seq=512, layers=2, overrides=over).cycles

    assert cycles(32) <= cycles(16)
