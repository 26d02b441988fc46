"""Functional mode executes the lowered tiles, array pass by array pass, in K order.

Every result is compared bit for bit with a reference computed another way: int8 with an
int64 numpy matmul wrapped modulo 2**32; fp16/bf16 with a scalar loop over outputs and
K in ``np.float32`` that follows the documented order (K chunks from the lowering's
``tk``, and on a weight-stationary array from its height; a fresh fp32 sum per chunk,
chunks summed in fp32 in K order, then the bias). The reference never sees the device's
tile list, so a tiling that departs from the documented one changes the comparison.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from wia_hw.emulator.device import Device
from wia_hw.emulator.functional import gemm_operands
from wia_hw.emulator.golden import fp_mac_matmul
from wia_hw.emulator.kernels import GemmKernel, Tile
from wia_hw.emulator.tiled_exec import execute_gemm, tile_passes

import wia_hw
from wia_hw.graph import GraphBuilder
from wia_hw.lowering import lower
from wia_hw.spec import load_spec
from wia_hw.workloads import gemm

F = np.float32
NAN_BITS = 0x7FC00000


def _small(
    rows: int = 8, cols: int = 8, dataflow: str = "os", l1_kib: int = 1, block: int = 256
) -> dict:
    """An array small enough for many passes, an L1 small enough to cut K."""
    return {
        "compute.array.rows": rows,
        "compute.array.cols": cols,
        "compute.array.dataflow": dataflow,
        "memory.l1.size_kib": l1_kib,
        "memory.block_bytes": block,
    }


# -- independent references ---------------------------------------------------------
def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) by comparing the dropped half
    with 0x8000 (a different formulation from the golden model's add-and-shift)."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    hi, lo = bits >> 16, bits & 0xFFFF
    up = (lo > 0x8000) | ((lo == 0x8000) & ((hi & 1) == 1))
    out = ((hi + up.astype(np.uint32)) << 16).astype(np.uint32)
    out[np.isnan(x)] = NAN_BITS
    return out.view(np.float32)


def _to(x: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "fp32":
        return np.asarray(x, np.float32)
    if fmt == "bf16":
        return _bf16(x)
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _operand(rng: np.random.Generator, shape: tuple, fmt: str) -> np.ndarray:
    """Normal values in ``fmt`` with 10% subnormals of ``fmt`` and 5% values so large
    that products (bf16, fp32) or sums rounded to an fp16 output overflow."""
    x = rng.standard_normal(shape).astype(np.float32)
    sel = rng.random(shape)
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    if fmt == "fp16":  # fp16 subnormals are multiples of 2**-24 below 2**-14
        sub = rng.integers(1, 1024, shape) * 2.0**-24
        big = rng.integers(1024, 2048, shape) * 2.0**5  # 32768 .. 65504
    elif fmt == "fp32":  # binary32 subnormals are multiples of 2**-149
        sub = rng.integers(1, 2**23, shape) * 2.0**-149
        big = rng.integers(128, 256, shape) * 2.0**120
    else:  # bf16 subnormals are multiples of 2**-133 below 2**-126
        sub = rng.integers(1, 128, shape) * 2.0**-133
        big = rng.integers(128, 256, shape) * 2.0**120  # products overflow fp32
    x = np.where(sel < 0.10, sign * sub, x)
    x = np.where(sel > 0.95, sign * big, x)
    return _to(x, fmt)


def _chunks(kernel: GemmKernel, rows: int, dataflow: str) -> list[tuple[int, int]]:
    """K ranges in the documented order: the lowering cuts K every ``tk``; a
    weight-stationary array then cuts each of those every ``rows``."""
    out = []
    tk = kernel.tiling.tk
    for k0 in range(0, kernel.k, tk):
        k1 = min(kernel.k, k0 + tk)
        step = rows if dataflow == "ws" else k1 - k0
        out += [(s, min(s + step, k1)) for s in range(k0, k1, step)]
    return out


def _ref_fp(
    a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, chunks: list[tuple[int, int]]
) -> np.ndarray:
    """a [B, m, k], b [1 or B, k, n], bias [1 or B, n]: scalar fp32 loops."""
    nb, m, _ = a.shape
    n = b.shape[2]
    out = np.empty((nb, m, n), np.float32)
    with np.errstate(all="ignore"):
        for bb in range(nb):
            bm = b[0 if b.shape[0] == 1 else bb]
            for i in range(m):
                for j in range(n):
                    running = F(0)
                    for k0, k1 in chunks:
                        acc = F(0)
                        for kk in range(k0, k1):
                            acc = F(acc + F(a[bb, i, kk] * bm[kk, j]))
                        running = F(running + acc)
                    if bias is not None:
                        running = F(running + bias[0 if bias.shape[0] == 1 else bb, j])
                    out[bb, i, j] = running
    out.view(np.uint32)[np.isnan(out)] = NAN_BITS
    return out


def _ref_int8(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    c = np.matmul(a.astype(np.int64), b.astype(np.int64))
    if bias is not None:
        c = c + bias.astype(np.int64)[:, None, :]
    return ((c + 2**31) % 2**32 - 2**31).astype(np.int32)


def _bits_equal(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape
    np.testing.assert_array_equal(
        np.asarray(got, np.float32).view(np.uint32), np.asarray(ref, np.float32).view(np.uint32)
    )


def _kernel_and_tiles(graph, overrides: dict) -> tuple[GemmKernel, list[Tile], object]:
    spec = load_spec("wia-npu", overrides)
    ((_, (kern,)),) = [(op, ks) for op, ks in lower(graph, spec) if ks]
    tiles, _ = Device(spec).tiles_of(kern)
    return kern, tiles, spec


# -- bit-exact against the references -----------------------------------------------
CASES = [  # (dataflow, rows, cols, batch, m, n, k)
    ("os", 8, 8, 2, 19, 13, 45),
    ("ws", 8, 8, 2, 19, 13, 45),
    ("os", 4, 4, 1, 11, 10, 37),
    ("ws", 4, 8, 3, 6, 11, 29),
]


@pytest.mark.parametrize("fmt", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}{}x{}-b{}-{}x{}x{}".format(*c))
def test_fp_gemm_is_bit_exact_with_the_documented_order(fmt, case):
    df, rows, cols, batch, m, n, k = case
    rng = np.random.default_rng(zlib.crc32(repr((fmt, case)).encode()))
    b_ = GraphBuilder("g", fmt)
    lead = (batch,) if batch > 1 else ()
    x = b_.input("A", lead + (m, k))
    w = b_.weight("B", lead + (k, n))
    b_.op("bmm" if batch > 1 else "matmul", "gemm", [x, w], dtype="fp32")  # fp32 result
    g = b_.graph()
    a, bw = _operand(rng, (batch, m, k), fmt), _operand(rng, (batch, k, n), fmt)
    ov = _small(rows, cols, df)
    kern, tiles, _ = _kernel_and_tiles(g, ov)
    chunks = _chunks(kern, rows, df)
    assert len(chunks) >= 2 and any(t.dims[1] % rows or t.dims[2] % cols for t in tiles)
    ref = _ref_fp(a, bw, None, chunks)
    r = wia_hw.run(
        g,
        overrides=ov,
        mode="functional",
        inputs={"A": a.reshape(lead + (m, k)), "B": bw.reshape(lead + (k, n))},
    )
    got = r.outputs["gemm"].reshape(batch, m, n)
    _bits_equal(got, ref)
    assert np.isnan(ref).any() or fmt == "fp16"  # the specials reached the output
    assert np.isinf(ref).any() or fmt == "fp16"


@pytest.mark.parametrize("df", ["os", "ws"])
def test_fp16_output_rounding_overflows_to_inf(df):
    """An fp16 result: the fp32 accumulator rounded to fp16 once, big sums to inf."""
    rng = np.random.default_rng(11)
    m, n, k = 9, 10, 21
    g = gemm(m, n, k, precision="fp16")
    a, bw = _operand(rng, (1, m, k), "fp16"), _operand(rng, (1, k, n), "fp16")
    kern, _, _ = _kernel_and_tiles(g, _small(dataflow=df))
    ref = _to(_ref_fp(a, bw, None, _chunks(kern, 8, df)), "fp16")
    r = wia_hw.run(
        g, overrides=_small(dataflow=df), mode="functional", inputs={"A": a[0], "B": bw[0]}
    )
    _bits_equal(r.outputs["gemm"], ref[0])
    assert np.isinf(ref).any()


@pytest.mark.parametrize("df", ["os", "ws"])
@pytest.mark.parametrize("shape", [(3, 29, 21, 53), (1, 17, 9, 300)])
def test_int8_gemm_wraps_like_int64_modulo_2_32(df, shape):
    batch, m, n, k = shape
    rng = np.random.default_rng(batch * m * n * k)
    g = gemm(m, n, k, precision="int8", batch=batch)
    lead = (batch,) if batch > 1 else ()
    a = rng.integers(-128, 128, (batch, m, k)).astype(np.int8)
    bw = rng.integers(-128, 128, (batch, k, n)).astype(np.int8)
    r = wia_hw.run(
        g,
        overrides=_small(dataflow=df),
        mode="functional",
        inputs={"A": a.reshape(lead + (m, k)), "B": bw.reshape(lead + (k, n))},
    )
    np.testing.assert_array_equal(r.outputs["gemm"].reshape(batch, m, n), _ref_int8(a, bw))


@pytest.mark.parametrize("shape", [(200, 1, 5000), (129, 1, 7000), (37, 48, 300)])
def test_several_arrays_per_core_compute_the_same_products(shape):
    """a100-systolic deals a tile's passes to its four arrays in rounds: functional mode
    checks the rounds the timing model charged (it compared per-array passes with the
    rounds and refused every tile of more than one pass) and computes int8 exactly."""
    m, n, k = shape
    rng = np.random.default_rng(m * n * k)
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    bw = rng.integers(-128, 128, (k, n)).astype(np.int8)
    g = gemm(m, n, k, precision="int8")
    r = wia_hw.run(g, device="a100-systolic", mode="functional", inputs={"A": a, "B": bw})
    np.testing.assert_array_equal(r.outputs["gemm"], _ref_int8(a[None], bw[None])[0])


def test_int8_accumulator_wraps_across_k_chunks():
    """K = 140000 of -128 * -128 overflows int32 after 131072 steps; the K chunks of
    the tiling wrap exactly like one int64 sum reduced modulo 2**32."""
    k = 140_000
    g = gemm(1, 2, k, precision="int8")
    a = np.full((1, k), -128, np.int8)
    bw = np.full((k, 2), -128, np.int8)
    bw[::7, 1] = 127
    ov = _small(l1_kib=64, block=4096)
    kern, tiles, _ = _kernel_and_tiles(g, ov)
    assert kern.tiling.tk < k and len(tiles) > 10
    r = wia_hw.run(g, overrides=ov, mode="functional", inputs={"A": a, "B": bw})
    ref = _ref_int8(a[None], bw[None])[0]
    assert ref[0, 0] == 128 * 128 * k - 2**32  # it did wrap
    np.testing.assert_array_equal(r.outputs["gemm"], ref)


def test_linear_with_bias_int8_and_fp16():
    """linear: B shared by the folded rows; bias after the last K chunk (int32 wrap /
    one fp32 add), then the result rounds to the output dtype."""
    rng = np.random.default_rng(3)
    for fmt in ("int8", "fp16"):
        b_ = GraphBuilder("lin", fmt)
        x = b_.input("x", (2, 7, 37))
        w = b_.weight("w", (37, 19))
        bias = b_.weight("bias", (19,), "int32" if fmt == "int8" else "fp16")
        b_.op("linear", "fc", [x, w, bias], dtype="int32" if fmt == "int8" else "fp16")
        g = b_.graph()
        ov = _small(dataflow="ws")
        if fmt == "int8":
            xv = rng.integers(-128, 128, (2, 7, 37)).astype(np.int8)
            wv = rng.integers(-128, 128, (37, 19)).astype(np.int8)
            bv = rng.integers(-(2**31), 2**31, 19).astype(np.int32)
            ref = _ref_int8(xv.reshape(1, 14, 37), wv[None], bv[None])
        else:
            xv, wv = _operand(rng, (2, 7, 37), "fp16"), _operand(rng, (37, 19), "fp16")
            bv = _to(rng.standard_normal(19) * 100, "fp16")
            kern, _, _ = _kernel_and_tiles(g, ov)
            ref = _to(
                _ref_fp(xv.reshape(1, 14, 37), wv[None], bv[None], _chunks(kern, 8, "ws")), "fp16"
            )
        r = wia_hw.run(g, overrides=ov, mode="functional", inputs={"x": xv, "w": wv, "bias": bv})
        if fmt == "fp16":
            _bits_equal(r.outputs["fc"].reshape(1, 14, 19), ref)
        else:
            np.testing.assert_array_equal(r.outputs["fc"].reshape(1, 14, 19), ref)


def test_bmm_transposed_b_with_scale():
    """Attention scores: B stored [batch, n, k] (transpose_b), fp32 scale epilogue."""
    rng = np.random.default_rng(4)
    q = _operand(rng, (2, 3, 7, 20), "bf16")
    kt = _operand(rng, (2, 3, 9, 20), "bf16")
    b_ = GraphBuilder("att", "bf16")
    b_.input("q", q.shape)
    b_.input("k", kt.shape)
    b_.op("bmm", "s", ["q", "k"], transpose_b=True, scale=0.125, dtype="fp32")
    g = b_.graph()
    ov = _small(4, 4, "os", l1_kib=1)
    kern, _, _ = _kernel_and_tiles(g, ov)
    assert kern.b_transposed and kern.batch == 6
    ref = _ref_fp(
        q.reshape(6, 7, 20), np.swapaxes(kt.reshape(6, 9, 20), 1, 2), None, _chunks(kern, 4, "os")
    )
    with np.errstate(all="ignore"):
        ref = (ref * F(0.125)).reshape(2, 3, 7, 9)
    r = wia_hw.run(g, overrides=ov, mode="functional", inputs={"q": q, "k": kt})
    _bits_equal(r.outputs["s"], ref)


def test_batched_tiles_group_several_entries():
    """Small matrices grouped tb > 1 to a tile (nb > 1)."""
    rng = np.random.default_rng(5)
    g = gemm(5, 6, 9, precision="fp16", batch=16)
    ov = _small(4, 4, "os", l1_kib=64, block=4096)
    kern, tiles, _ = _kernel_and_tiles(g, ov)
    assert kern.tiling.tb > 1 and max(t.dims[0] for t in tiles) > 1
    a, bw = _operand(rng, (16, 5, 9), "fp16"), _operand(rng, (16, 9, 6), "fp16")
    ref = _to(_ref_fp(a, bw, None, _chunks(kern, 4, "os")), "fp16")
    r = wia_hw.run(g, overrides=ov, mode="functional", inputs={"A": a, "B": bw})
    _bits_equal(r.outputs["gemm"], ref)


@pytest.mark.parametrize("df", ["os", "ws"])
def test_grouped_conv_matches_a_direct_loop(df):
    """conv2d (groups=2, stride 2, pad 1) through im2col and the tiles, against a loop
    over output pixels with K in (channel, ky, kx) order, chunked as documented."""
    rng = np.random.default_rng(6)
    n_, c, h, wd, o, kh = 1, 4, 7, 6, 6, 3
    x = _operand(rng, (n_, c, h, wd), "fp16")
    w = _operand(rng, (o, c // 2, kh, kh), "fp16")
    bias = _to(rng.standard_normal(o), "fp16")
    b_ = GraphBuilder("conv", "fp16")
    b_.input("x", x.shape)
    b_.weight("w", w.shape)
    b_.weight("b", bias.shape)
    b_.op("conv2d", "y", ["x", "w", "b"], stride=2, pad=1, groups=2, dtype="fp32")
    g = b_.graph()
    ov = _small(dataflow=df)
    kern, _, _ = _kernel_and_tiles(g, ov)
    assert kern.batch == 2 and not kern.b_shared
    chunks = _chunks(kern, 8, df)
    ho, wo = (h + 2 - kh) // 2 + 1, (wd + 2 - kh) // 2 + 1
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.empty((n_, o, ho, wo), np.float32)
    og, cg = o // 2, c // 2
    with np.errstate(all="ignore"):
        for oc in range(o):
            gi = oc // og
            for yy in range(ho):
                for xx in range(wo):
                    terms = [
                        (xp[0, gi * cg + ci, 2 * yy + i, 2 * xx + j], w[oc, ci, i, j])
                        for ci in range(cg)
                        for i in range(kh)
                        for j in range(kh)
                    ]
                    running = F(0)
                    for k0, k1 in chunks:
                        acc = F(0)
                        for u, v in terms[k0:k1]:
                            acc = F(acc + F(u * v))
                        running = F(running + acc)
                    ref[0, oc, yy, xx] = F(running + bias[oc])
    ref.view(np.uint32)[np.isnan(ref)] = NAN_BITS
    r = wia_hw.run(g, overrides=ov, mode="functional", inputs={"x": x, "w": w, "b": bias})
    _bits_equal(r.outputs["y"], ref)


# -- the arithmetic's own claims ------------------------------------------------------
def test_padded_pass_gives_the_same_values():
    """An edge pass (5 x 3 outputs, K 6 on an 8 x 8 array) padded with zeros to the full
    array (and K to 8, as a WS pass's unused rows) gives the same bits in its real part,
    with infinities, NaNs and subnormals among the inputs."""
    rng = np.random.default_rng(7)
    for fmt in ("fp16", "bf16"):
        a, b = _operand(rng, (5, 6), fmt), _operand(rng, (6, 3), fmt)
        a[1, 2], b[4, 0] = np.inf, -np.inf
        a[3, 3] = np.nan
        ap = np.zeros((8, 8), np.float32)
        bp = np.zeros((8, 8), np.float32)
        ap[:5, :6], bp[:6, :3] = a, b
        _bits_equal(fp_mac_matmul(ap, bp, fmt)[:5, :3], fp_mac_matmul(a, b, fmt))


@pytest.mark.parametrize("df", ["os", "ws"])
def test_grouped_passes_equal_pass_by_pass(df):
    """Evaluating passes that share a K range in one call is bit-identical to running
    every pass on its own, in tile order."""
    rng = np.random.default_rng(8)
    g = gemm(23, 17, 41, precision="bf16", batch=2)
    kern, tiles, spec = _kernel_and_tiles(g, _small(4, 4, df))
    a, b = _operand(rng, (2, 23, 41), "bf16"), _operand(rng, (2, 41, 17), "bf16")
    kw = dict(dataflow=df, rows=4, cols=4)
    one = execute_gemm(kern, tiles, a, b, **kw)
    each = execute_gemm(kern, tiles, a, b, group_passes=False, **kw)
    _bits_equal(one, each)
    assert sum(len(tile_passes(t, df, 4, 4)) for t in tiles) == sum(t.passes for t in tiles)


def test_readme_int8_example_is_bit_exact():
    g = gemm(64, 32, 100, precision="int8")
    a = np.random.default_rng(0).integers(-128, 128, (64, 100), dtype=np.int8)
    b = np.random.default_rng(1).integers(-128, 128, (100, 32), dtype=np.int8)
    for ov in (None, _small(dataflow="ws")):
        r = wia_hw.run(
            g,
            mode="functional",
            overrides=ov,
            inputs={g.ops[0].inputs[0]: a, g.ops[0].inputs[1]: b},
        )
        (c,) = r.outputs.values()
        assert (c == a.astype(np.int32) @ b.astype(np.int32)).all()


# -- a tiling bug shows -------------------------------------------------------------
def _mutating(monkeypatch, mutate) -> None:
    """Make Device.tiles_of hand out mutated GEMM tiles (timing and functional)."""
    orig = Device.tiles_of

    def tiles_of(self, k):
        tiles, groups = orig(self, k)
        return (mutate(list(tiles)) if isinstance(k, GemmKernel) else tiles), groups

    monkeypatch.setattr(Device, "tiles_of", tiles_of)


def _k_pair(tiles: list[Tile]) -> tuple[int, int]:
    """Indices of the first tile and of the next K chunk of the same outputs."""
    first = tiles[0]
    nxt = next(
        i
        for i, t in enumerate(tiles)
        if t.origin[:3] == first.origin[:3] and t.origin[3] == first.dims[3]
    )
    return 0, nxt


def test_shifted_k_boundary_changes_the_result(monkeypatch):
    """Moving one K-chunk boundary by 3 (a valid cover of K, but not the lowered tiling)
    changes fp32 sums: the comparison with the reference fails."""
    rng = np.random.default_rng(9)
    g = GraphBuilder("g", "fp16")
    g.input("A", (13, 45))
    g.weight("B", (45, 11))
    g.op("matmul", "gemm", ["A", "B"], dtype="fp32")
    g = g.graph()
    a = _to(rng.standard_normal((13, 45)), "fp16")
    b = _to(rng.standard_normal((45, 11)), "fp16")
    ov = _small()
    kern, _, _ = _kernel_and_tiles(g, ov)
    ref = _ref_fp(a[None], b[None], None, _chunks(kern, 8, "os"))[0]
    ok = wia_hw.run(g, overrides=ov, mode="functional", inputs={"A": a, "B": b})
    _bits_equal(ok.outputs["gemm"], ref)

    def shift(tiles):
        i, j = _k_pair(tiles)
        ti, tj = tiles[i], tiles[j]
        tiles[i] = dataclasses.replace(ti, dims=ti.dims[:3] + (ti.dims[3] - 3,))
        tiles[j] = dataclasses.replace(
            tj, dims=tj.dims[:3] + (tj.dims[3] + 3,), origin=tj.origin[:3] + (tj.origin[3] - 3,)
        )
        return tiles

    _mutating(monkeypatch, shift)
    bad = wia_hw.run(g, overrides=ov, mode="functional", inputs={"A": a, "B": b})
    assert not np.array_equal(bad.outputs["gemm"].view(np.uint32), ref.view(np.uint32))


def test_dropped_k_chunk_is_an_error(monkeypatch):
    g = gemm(13, 11, 45, precision="int8")
    _mutating(monkeypatch, lambda t: t[: _k_pair(t)[1]] + t[_k_pair(t)[1] + 1 :])
    with pytest.raises(
        ValueError,
        match=r"kernel 'gemm': the tiles leave \d+ of 143 "
        r"outputs short of K=45 \(first: batch 0, row 0",
    ):
        wia_hw.run(g, overrides=_small(), mode="functional")


def test_overlapping_tiles_are_an_error(monkeypatch):
    g = gemm(13, 11, 45, precision="int8")

    def overlap(tiles):
        i = next(i for i, t in enumerate(tiles) if t.origin[1] > 0)
        t = tiles[i]
        tiles[i] = dataclasses.replace(t, origin=(t.origin[0], t.origin[1] - 1) + t.origin[2:])
        return tiles

    _mutating(monkeypatch, overlap)
    with pytest.raises(
        ValueError,
        match=r"kernel 'gemm': tile \d+ \(dims .*\) accumulates "
        r"K \[\d+, \d+\) into batch 0, rows .* whose K so "
        r"far reaches .*: the tiles do not cover K in order",
    ):
        wia_hw.run(g, overrides=_small(), mode="functional")


# -- errors -------------------------------------------------------------------------
def test_executor_errors():
    g = gemm(13, 11, 45, precision="fp16")
    kern, tiles, _ = _kernel_and_tiles(g, _small())
    a, b = np.zeros((1, 13, 45), np.float32), np.zeros((1, 45, 11), np.float32)
    kw = dict(dataflow="os", rows=8, cols=8)
    with pytest.raises(
        ValueError,
        match=r"kernel 'gemm': arithmetic must be one of "
        r"\('int8', 'fp16', 'bf16', 'fp32'\), got 'fp8'",
    ):
        execute_gemm(kern, tiles, a, b, arithmetic="fp8", **kw)
    with pytest.raises(
        ValueError,
        match=r"array rows and cols must be positive integers, "
        r"got 0 x 8",
    ):
        execute_gemm(kern, tiles, a, b, dataflow="os", rows=0, cols=8)
    with pytest.raises(
        ValueError,
        match=r"operands A \[1, 13, 44\] and B \[1, 45, 11\] do "
        r"not match; A must be \[1, 13, 45\]",
    ):
        execute_gemm(kern, tiles, a[:, :, :44], b, **kw)
    with pytest.raises(ValueError, match=r"bias \[11\] must be \[1 or 1, 11\]"):
        execute_gemm(kern, tiles, a, b, np.zeros(11), **kw)
    with pytest.raises(
        ValueError,
        match=r"tile 0 \(dims \(1, 8, 8, 16\)\) makes 4 passes "
        r"on a 4x4 os array, but the timing model charged 1",
    ):
        execute_gemm(kern, tiles, a, b, dataflow="os", rows=4, cols=4)
    far = [dataclasses.replace(tiles[0], origin=(0, 10, 0, 0))] + tiles[1:]
    with pytest.raises(
        ValueError,
        match=r"tile 0 .* has a pass outside the GEMM \(batch 1, "
        r"m 13, n 11, k 45\)",
    ):
        execute_gemm(kern, far, a, b, **kw)
    with pytest.raises(ValueError, match=r"dataflow must be 'os' or 'ws', got 'rs'"):
        tile_passes(tiles[0], "rs", 8, 8)
    with pytest.raises(ValueError, match=r"not a GEMM tile: dims \(\), origin \(\)"):
        tile_passes(Tile([], [], 0, 1, 0, 0, 0, 0), "os", 8, 8)
    with pytest.raises(ValueError, match=r"op kind 'softmax' is not a GEMM"):
        gemm_operands("softmax", {}, [a], a.shape)


def test_given_float_inputs_are_stored_in_their_dtype():
    """A float32 array given for an fp16 tensor is rounded once on the way in: the run
    equals the run on the rounded values, and the executor, told the operands are held
    in fp16 already, rejects values that are not (the golden model's check)."""
    rng = np.random.default_rng(10)
    g = gemm(9, 7, 20, precision="fp16")
    a = rng.standard_normal((9, 20)).astype(np.float32)
    b = rng.standard_normal((20, 7)).astype(np.float32)
    raw = wia_hw.run(g, mode="functional", inputs={"A": a, "B": b})
    held = wia_hw.run(g, mode="functional", inputs={"A": _to(a, "fp16"), "B": _to(b, "fp16")})
    _bits_equal(raw.outputs["gemm"], held.outputs["gemm"])
    kern, tiles, _ = _kernel_and_tiles(g, None)
    with pytest.raises(ValueError, match=r"A and B has values not representable in fp16"):
        execute_gemm(
            kern, tiles, a[None], b[None], dataflow="os", rows=128, cols=128, round_operands=False
        )
