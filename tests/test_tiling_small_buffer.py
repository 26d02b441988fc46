"""The tiling heuristic on buffers too small for its usual first tile: every tile it
chooses fits the double-buffered L1 (half of it for a tile's operands, a quarter for its
results), on random arrays, dataflows, buffers and shapes; and a weight-stationary array
whose stationary block alone fills the buffer cuts that block instead of streaming one
row per tile (a 512-row TPU v1 array ran a GEMM 46x slower than the 256-row one)."""

from __future__ import annotations

import random

import pytest

import wia_hw
from wia_hw._tiling import choose_gemm_tiling
from wia_hw.spec import load_spec


def _random_case(rng: random.Random):
    base = rng.choice(["wia-npu", "wia-edge", "tpu-v1", "a100-systolic"])
    block = rng.choice([1024, 4096, 16384])
    l1_kib = max(4 * block // 1024, rng.choice([4, 16, 64, 256, 1024, 8192]))
    spec = load_spec(
        base,
        overrides={
            "compute.array.rows": rng.choice([8, 16, 32, 64, 128, 256, 512]),
            "compute.array.cols": rng.choice([8, 16, 32, 64, 128, 256, 512]),
            "compute.array.dataflow": rng.choice(["os", "ws"]),
            "memory.block_bytes": block,
            "memory.l1.size_kib": l1_kib,
        },
    )
    e = rng.choice([1, 2, 4])
    shape = (
        rng.choice([1, 1, 2, 12]),
        rng.choice([1, 7, 64, 128, 333, 1024, 4096]),
        rng.choice([1, 64, 100, 768, 4096]),
        rng.choice([1, 64, 100, 768, 4096]),
        e,
        rng.choice([e, 4]),
    )
    return spec, shape


@pytest.mark.parametrize("seed", range(4))
def test_every_tile_fits_the_double_buffered_l1(seed):
    rng = random.Random(seed)
    for _ in range(100):
        spec, (b, m, n, k, e, o) = _random_case(rng)
        for bt in (False, True):
            t = choose_gemm_tiling(spec, b, m, n, k, e, o, b_transposed=bt)
            l1 = spec.memory.l1.size_bytes
            where = f"{spec.compute.array} L1 {l1} B, GEMM {(b, m, n, k, e, o)}: {t}"
            assert t.tb * (t.tm + t.tn) * t.tk * e <= l1 // 2, where
            assert t.tb * t.tm * t.tn * o <= l1 // 4, where
            assert min(t.tm, t.tn, t.tk, t.tb) >= 1, where


def test_a_taller_weight_stationary_array_cuts_its_block_not_its_rows():
    """TPU v1's 256 KiB weight FIFO holds, at 512 rows, a 512 x 256 int8 block and
    nothing beside it: the tile keeps an array's height of rows and halves the block."""
    kw = dict(device="tpu-v1", precision="int8", M=256, N=512, K=768)
    base = wia_hw.run("gemm", **kw).latency_ms
    tall = wia_hw.run("gemm", overrides={"compute.array.rows": 512}, **kw).latency_ms
    # a taller array fills and drains longer; it is not 46x slower (1.34 ms before)
    assert tall < 1.2 * base, (tall, base)
    spec = load_spec("tpu-v1", overrides={"compute.array.rows": 512})
    t = choose_gemm_tiling(spec, 1, 256, 512, 768, 1, 4)
    assert t.tm >= 64 and t.tk * t.tn >= 256 * 64, t


def test_weight_stationary_tiles_split_their_width_before_their_rows():
    """Split for pipelining, a weight-stationary tile halves its width (the stationary
    block's columns) before its streamed rows, whose number each pass's fill and drain
    is shared over: a bigger L1 then costs little (wia-edge, 512 x 1024 x 1024 int8:
    0.419 ms at 2 and 4 MiB; it was 0.515 ms at 4 MiB, tm halved)."""
    kw = dict(device="wia-edge", precision="int8", M=512, N=1024, K=1024)
    at = {
        kib: wia_hw.run("gemm", overrides={"memory.l1.size_kib": kib}, **kw).latency_ms
        for kib in (2048, 4096)
    }
    assert at[4096] <= 1.01 * at[2048], at
    spec = load_spec("wia-edge", overrides={"memory.l1.size_kib": 4096})
    t = choose_gemm_tiling(spec, 1, 512, 1024, 1024, 1, 4)
    assert t.tm == 512, t
