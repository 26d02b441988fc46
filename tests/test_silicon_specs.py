"""The published-silicon specs (tpu-v1, a100-systolic) and the mechanisms they need:
several arrays per core, a per-kernel launch overhead, and the tiling rule for a small
L1. The full reproduction table is ``benchmarks/silicon.py``."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from wia_hw.emulator.errors import SpecError

import wia_hw
from wia_hw.lowering import choose_gemm_tiling
from wia_hw.spec import load_spec


def test_tpu_v1_peaks_are_the_published_ones() -> None:
    s = load_spec("tpu-v1")
    # 256 x 256 MACs x 2 x 700 MHz = 91.75 TOPS ("92 TeraOps/second"), DDR3 34 GB/s
    assert s.peak_flops("int8") == pytest.approx(256 * 256 * 2 * 0.7e9)
    assert s.peak_flops("int8") / 1e12 == pytest.approx(92, rel=0.005)
    assert s.peak_bandwidth_gbs == 34
    assert s.memory.l2.size_bytes == 24 * 2**20  # Unified Buffer
    assert s.memory.l1.size_bytes == 4 * 256 * 256  # weight FIFO, four 64 KiB tiles
    assert not s.supports("fp16")


def test_a100_systolic_peaks_are_llmcompass_and_the_whitepaper() -> None:
    s = load_spec("a100-systolic")
    # 108 SMs x 4 arrays x 16 x 16 x 2 x 1.41 GHz = 311.9 TFLOPS (whitepaper: 312)
    assert s.pes == 108 * 4 * 16 * 16
    assert s.peak_flops("fp16") / 1e12 == pytest.approx(312, rel=0.001)
    assert s.peak_flops("int8") / 1e12 == pytest.approx(624, rel=0.001)
    assert s.peak_bandwidth_gbs == 2039
    assert float(s.bytes_per_cycle(s.memory.l2.bandwidth_gbs)) == pytest.approx(5120)
    assert s.memory.l2.size_bytes == 40 * 2**20
    assert s.compute.control.launch_overhead_ns == 21000  # overhead_dict["A100"].matmul


@pytest.mark.parametrize(
    ("name", "trefi_ns", "trfc_ns"),
    [
        # HBM2e 16 Gb dies (the A100 80GB's): tRFC 450 ns by density from JESD235C as
        # Ramulator 2 tables it (src/dram/impl/HBM2.cpp), tREFI 3.9 us
        ("a100-systolic", 3900, 450),
        # DDR3 (JESD79-3): tREFI 7.8 us up to 85 C, tRFC 260 ns for a 4 Gb die
        ("tpu-v1", 7800, 260),
    ],
)
def test_refresh_is_the_published_dram_timing(name, trefi_ns, trfc_ns) -> None:
    from wia_hw.emulator.counters import Counters
    from wia_hw.emulator.memory import MemorySystem

    s = load_spec(name)
    hbm = s.memory.hbm
    assert (hbm.refresh_interval_ns, hbm.refresh_cycle_ns) == (trefi_ns, trfc_ns)
    chans = MemorySystem(s, Counters()).channels
    trefi, trfc = math.ceil(trefi_ns * s.clock_ghz), math.ceil(trfc_ns * s.clock_ghz)
    # every channel moves its nominal rate less refresh's share, in whole cycles
    nominal = s.bytes_per_cycle(s.memory.hbm.bandwidth_gbs) / len(chans)
    assert {c.bytes_per_cycle for c in chans} == {nominal * (1 - Fraction(trfc, trefi))}
    # whole-cycle windows keep the published duty cycle, so the streaming ceiling the
    # refresh leaves is the published one: A100 1,804 GB/s of 2,039, TPU v1 32.9 of 34
    ceiling = s.peak_bandwidth_gbs * (1 - trfc / trefi)
    assert ceiling == pytest.approx(s.peak_bandwidth_gbs * (1 - trfc_ns / trefi_ns), rel=1e-3)


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_arrays_per_core_must_be_a_positive_integer(bad) -> None:
    with pytest.raises(SpecError, match="arrays_per_core"):
        load_spec("wia-npu", {"compute.arrays_per_core": bad})


def test_launch_overhead_must_be_non_negative() -> None:
    with pytest.raises(SpecError, match="launch_overhead_ns: must be a non-negative number"):
        load_spec("wia-npu", {"compute.control.launch_overhead_ns": -1})


def test_launch_overhead_is_paid_once_per_kernel_with_every_core_waiting() -> None:
    base = wia_hw.run("gemm", M=256, N=256, K=256)
    ns = 3333.0
    r = wia_hw.run(
        "gemm", M=256, N=256, K=256, overrides={"compute.control.launch_overhead_ns": ns}
    )
    spec = load_spec("wia-npu")
    launch = math.ceil(ns * spec.clock_ghz - 1e-9)
    kernels = len(r.kernels)
    assert r.counters.cycles == base.counters.cycles + kernels * launch
    assert r.counters.stall_cycles["launch"] == kernels * launch * spec.compute.cores
    assert base.counters.stall_cycles["launch"] == 0


def test_more_arrays_per_core_never_slower_and_multiply_the_peak() -> None:
    rng = random.Random(16)
    for _ in range(6):
        m, n, k = (rng.choice([64, 200, 384, 1000]) for _ in range(3))
        times = [
            wia_hw.run(
                "gemm", M=m, N=n, K=k, device="wia-edge", overrides={"compute.arrays_per_core": a}
            ).counters.cycles
            for a in (1, 2, 4)
        ]
        assert times[0] >= times[1] >= times[2], (m, n, k, times)
    one, four = (
        load_spec("wia-edge", {"compute.arrays_per_core": a}).peak_flops("fp16") for a in (1, 4)
    )
    assert four == 4 * one


def test_a_tile_of_p_passes_takes_ceil_p_over_arrays_rounds() -> None:
    from wia_hw.emulator.device import Device

    from wia_hw.lowering import lower

    for arrays in (1, 3, 4):
        assert load_spec("wia-edge").compute.array.dataflow == "ws"
        spec = load_spec("wia-edge", {"compute.arrays_per_core": arrays})
        g = wia_hw.workloads.build("gemm", M=96, N=160, K=64)
        ((_, (k,)),) = lower(g, spec)
        tiles, _ = Device(spec).tiles_of(k)
        for t in tiles:
            _, mi, ni, ki = t.dims
            # a 32 x 32 weight-stationary array: one pass per 32 x 32 block of weights,
            # each streaming the tile's mi rows
            passes = -(-ki // 32) * -(-ni // 32)
            assert t.passes == -(-passes // arrays)
            # the arrays left without a pass in the last round are mapping loss
            assert t.slot_macs == t.passes * arrays * 32 * 32 * mi


def test_small_l1_slices_k_when_full_k_tiles_would_starve_l2() -> None:
    a100 = load_spec("a100-systolic")
    t = choose_gemm_tiling(a100, 1, 8192, 1024, 1024, 2, 2)
    # full K (1024) leaves room for 32 x 16 tiles only: 2 x (1/32 + 1/16) B/MAC at the
    # arrays' 110,592 MACs/cycle is 20,736 B/cycle, four times the L2's 5,120
    assert t.tk < 1024 and t.tm * t.tn >= 128 * 128
    # a GEMV streams its weights once whatever its tile: K stays whole
    npu = load_spec("wia-npu")
    assert choose_gemm_tiling(npu, 1, 1, 1024, 4096, 2, 2).tk == 4096


def test_round_robin_deals_whole_output_tiles_to_cores_in_turn() -> None:
    from wia_hw.emulator.device import Device

    rng = random.Random(7)
    for _ in range(20):
        origins = []
        for t in range(rng.randint(1, 30)):  # output tiles, each with 1..4 K slices
            origins += [(0, t, 0, kk) for kk in range(rng.randint(1, 4))]
        cores = rng.randint(1, 6)
        idx = list(range(len(origins)))
        shares = Device.partition(idx, (), cores, "round_robin", origins)
        assert sorted(i for s in shares for i in s) == idx  # every tile once
        for c, s in enumerate(shares):
            tiles_here = [origins[i][1] for i in s]
            assert all(t % cores == c for t in tiles_here)  # output tile t -> core t mod n
            assert s == sorted(s)  # in order on the core
    with pytest.raises(SpecError, match="tile_schedule: must be one of contiguous, round_robin"):
        load_spec("wia-npu", {"compute.tile_schedule": "random"})


def test_round_robin_shares_panels_in_l2_on_a_many_core_device() -> None:
    # 1024 x 4096 x 4096 on 108 cores: contiguous runs put unrelated output tiles side
    # by side and re-read B from HBM; dealt in turn, the tiles in flight share panels
    hbm = {}
    for schedule in ("contiguous", "round_robin"):
        r = wia_hw.run(
            "gemm",
            M=1024,
            N=4096,
            K=4096,
            device="a100-systolic",
            overrides={"compute.tile_schedule": schedule},
        )
        hbm[schedule] = r.counters.bytes["hbm"]
    compulsory = 1024 * 4096 * 2 + 4096 * 4096 * 2 + 1024 * 4096 * 2
    assert compulsory <= hbm["round_robin"] < hbm["contiguous"]


@pytest.mark.parametrize("device", ["a100-systolic", "wia-edge", "wia-npu"])
def test_elementwise_tiles_move_only_their_bytes(device: str) -> None:
    from wia_hw.graph import GraphBuilder

    rng = random.Random(3)
    for _ in range(3):
        rows, cols = rng.choice([1000, 4096, 3000]), rng.choice([768, 2048, 1000])
        b = GraphBuilder("add", "fp16")
        b.op("add", "y", [b.input("x0", (rows, cols)), b.input("x1", (rows, cols))])
        r = wia_hw.run(b.graph(), device=device)
        # two inputs read from HBM once, the output written back once: no block is
        # fetched for a part of it
        assert r.counters.bytes["hbm"] <= 3 * rows * cols * 2 * 1.02, (rows, cols)


def _mlp(width: int, layers: int, batch: int):
    from wia_hw.graph import GraphBuilder

    b = GraphBuilder("mlp", "int8")
    x = b.input("x", (batch, width))
    for i in range(layers):
        x = b.op("matmul", f"fc{i}", [x, b.weight(f"w{i}", (width, width))])
    return b.graph()


def test_host_io_l2_keeps_inputs_and_results_off_dram() -> None:
    rng = random.Random(5)
    for _ in range(4):
        width, layers, batch = rng.choice([256, 512, 600]), rng.randint(1, 3), rng.randint(8, 200)
        g = _mlp(width, layers, batch)
        on = wia_hw.run(g, device="tpu-v1")
        off = wia_hw.run(g, device="tpu-v1", overrides={"memory.host_io": "dram"})
        weights = layers * width * width
        act = batch * width  # int8: one byte per element
        # on chip: only the weights cross the DDR3 interface; from DRAM: the input is
        # read, and every layer's output (dirty in L2) is written back at the end
        assert on.counters.bytes["hbm"] == weights
        assert off.counters.bytes["hbm"] == weights + act + layers * act
        assert on.latency_ms < off.latency_ms
        assert on.roofline_floor_ms <= on.latency_ms
    with pytest.raises(SpecError, match="host_io: must be dram or l2, got 'pcie'"):
        load_spec("wia-npu", {"memory.host_io": "pcie"})
