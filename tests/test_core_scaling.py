"""More cores are no slower: a GEMM output tile's K slices stay on one core, and the
tiling heuristic undoes a split whose smaller tiles would read the same storage blocks
again (``wia_hw._tile_estimate``)."""

from __future__ import annotations

import random

import pytest
from wia_hw.emulator.device import Device
from wia_hw.emulator.kernels import GemmKernel, GemmTiling, TensorRef, VectorKernel

import wia_hw
from wia_hw._tiling import choose_gemm_tiling
from wia_hw.spec import load_spec


def _kernel(batch: int, m: int, n: int, k: int, t: GemmTiling) -> GemmKernel:
    return GemmKernel(
        name="g",
        op="g",
        group="matmul",
        op_kind="bmm" if batch > 1 else "matmul",
        precision="fp16",
        batch=batch,
        m=m,
        n=n,
        k=k,
        a=TensorRef("A", batch * m, k, 2),
        b=TensorRef("B", batch * k, n, 2),
        c=TensorRef("C", batch * m, n, 2),
        b_shared=batch == 1,
        tiling=t,
    )


@pytest.mark.parametrize("schedule", ["contiguous", "round_robin"])
def test_the_k_slices_of_an_output_tile_run_on_one_core(schedule):
    """Partial sums stay in one core's L1 (no cross-core reduction is modelled), so no
    output tile has slices on two cores; the shares cover every tile once, in order
    within a core, and under the contiguous schedule each is one run."""
    rng = random.Random(3)
    for _ in range(60):
        cores = rng.choice([2, 3, 4, 5, 7, 16, 64])
        spec = load_spec("wia-npu", {"compute.cores": cores, "compute.tile_schedule": schedule})
        batch = rng.choice([1, 1, 3])
        m, n, k = (rng.randint(1, 1500) for _ in range(3))
        t = GemmTiling(
            tm=rng.choice([128, 256, 512]),
            tn=rng.choice([128, 256]),
            tk=rng.choice([64, 128, 384, k]),
            tb=rng.choice([1, batch]),
        )
        tiles, groups = Device(spec).tiles_of(_kernel(batch, m, n, k, t))
        shares = Device.partition(tiles, groups, cores, schedule, [x.origin for x in tiles])
        owner: dict[tuple, int] = {}
        for c, share in enumerate(shares):
            for x in share:
                assert owner.setdefault(x.origin[:3], c) == c, (cores, m, n, k, t)
        index = {id(x): i for i, x in enumerate(tiles)}
        seen = [index[id(x)] for share in shares for x in share]
        assert sorted(seen) == list(range(len(tiles)))
        for share in shares:
            got = [index[id(x)] for x in share]
            assert got == sorted(got)
            if schedule == "contiguous" and got:
                assert got == list(range(got[0], got[-1] + 1))


def test_contiguous_shares_are_the_fair_shares_without_groups_and_whole_groups_with():
    rng = random.Random(4)
    for _ in range(200):
        total, cores = rng.randint(0, 300), rng.randint(1, 70)
        shares = Device.contiguous_shares((), total, cores)
        sizes = [b - a for a, b in shares]
        assert sum(sizes) == total and max(sizes) - min(sizes) <= 1
        size = rng.randint(1, 9)
        groups = range(0, total, size)
        shares = Device.contiguous_shares(groups, total, cores)
        for a, b in shares:
            assert a == b or (a % size == 0 and (b % size == 0 or b == total))
        assert sum(b - a for a, b in shares) == total


@pytest.mark.parametrize(("m", "n", "k"), [(4096, 4096, 4096), (1024, 1024, 1024)])
def test_a_gemm_on_twice_the_cores_is_no_slower(m, n, k):
    """4096^3 on 64 cores of wia-npu gave each core one K slice of 16 output tiles
    (0.428 ms against 0.225 on 32); 1024^3 split into 128 x 128 tiles whose loads
    outran the L2 port (0.0228 ms against 0.0149)."""

    def cycles(cores: int) -> int:
        return wia_hw.run("gemm", M=m, N=n, K=k, overrides={"compute.cores": cores}).cycles

    assert cycles(64) <= cycles(32) <= cycles(16)


def test_attention_heads_stay_in_tiles_that_share_their_blocks():
    """BERT's attention reads one head's queries and keys as a few rows of the QKV
    projection's output, so a tile of a few heads loads the same storage blocks as a
    tile of many: on 64 cores the heuristic's tiles of 2 heads took the model 70%
    longer than on 12 cores; it keeps more heads a tile there now."""

    def cycles(cores: int) -> int:
        over = {"compute.cores": cores}
        return wia_hw.run("bert-base", batch=8, seq=128, layers=2, overrides=over).cycles

    best = cycles(4)
    for cores in (8, 12, 16, 24, 32, 64):
        now = cycles(cores)
        # within 6%: where the next op's tiles land on other cores than the producer's
        # (docs/ARCHITECTURE.md) more cores still cost a few percent
        assert now <= 1.06 * best, (cores, now, best)
        best = min(best, now)


@pytest.mark.parametrize(
    ("path", "ladder"),
    [
        ("memory.l2.bandwidth_gbs", (2000, 4000, 8000, 16000)),
        ("memory.hbm.bandwidth_gbs", (300, 600, 1200, 2400)),
        ("memory.l1.size_kib", (2048, 4096, 8192, 16384)),
    ],
)
def test_the_estimate_keeps_bandwidth_and_l1_monotone_on_many_cores(path, ladder):
    """The estimate reads the L2 and HBM bandwidths and the L1 size, so a better spec
    may change the tiling it keeps: never to a slower run here (without the estimate,
    8,000 GB/s of L2 bandwidth gave 248,001 cycles)."""

    def cycles(value: int) -> int:
        over = {"compute.cores": 64, path: value}
        return wia_hw.run("bert-base", batch=8, seq=128, layers=2, overrides=over).cycles

    runs = [cycles(v) for v in ladder]
    # to a few cycles: how the cores' loads interleave moves with any rate (twice the
    # L2 bandwidth: 194,679 -> 194,685 cycles, the same tilings)
    assert all(b <= a * 1.0001 for a, b in zip(runs, runs[1:], strict=False)), runs


def test_an_estimate_picks_among_the_tilings_before_each_split():
    spec = load_spec("wia-npu", {"compute.cores": 64})
    args = (spec, 96, 128, 128, 64, 2, 2)
    plain = choose_gemm_tiling(*args)
    seen: list[GemmTiling] = []

    def flat(t: GemmTiling) -> float:
        seen.append(t)
        return 1.0

    assert choose_gemm_tiling(*args, estimate=flat) == plain  # a tie keeps the heuristic's
    assert seen[0] == plain and len(seen) > 1
    assert all(s.tb >= plain.tb for s in seen)  # only coarser tilings are candidates
    # an estimate that grows with the tile count picks the coarsest
    coarsest = choose_gemm_tiling(*args, estimate=lambda t: -t.tb)
    assert coarsest.tb == max(s.tb for s in seen)


def test_the_lowering_keeps_heads_together_on_many_cores():
    from wia_hw.lowering import lower
    from wia_hw.workloads import bert_base

    spec = load_spec("wia-npu", {"compute.cores": 64})
    tbs = {
        k.name: k.tiling.tb
        for _, ks in lower(bert_base(batch=8, seq=128, layers=1), spec)
        for k in ks
        if getattr(k, "op_kind", "") == "bmm"
    }
    assert tbs and min(tbs.values()) >= 8, tbs


def test_no_split_into_a_partial_wave_of_long_k_runs():
    """On a100-systolic's 108 cores, 64 x 12288 x 12288 in 64 x 144 tiles (86) took
    0.199 ms; split so every core had one (64 x 80, 154 tiles: 46 cores with two) 0.239.
    With K whole the same even split is taken (GPT-2's 64 x 768 x 768 on 4 cores: 6
    tiles of 64 x 128, 17% faster than 3 of 256)."""
    a100 = load_spec("a100-systolic")
    t = choose_gemm_tiling(a100, 1, 64, 12288, 12288, 2, 2)
    assert t.tk < 12288 and -(-12288 // t.tn) <= a100.compute.cores, t
    t = choose_gemm_tiling(load_spec("wia-npu"), 1, 64, 768, 768, 2, 2)
    assert t.tk == 768 and -(-768 // t.tn) >= 4, t


def test_random_gemms_are_close_to_monotone_in_cores():
    """Random shapes on wia-npu, 4 to 64 cores: never more than 12% above the best on
    fewer cores (what remains is L2 thrash and partial waves the tiling does not
    re-size, docs/ARCHITECTURE.md). Before the fixes above, 4096^3 was +90% on 64 cores
    and 1024^3 +53%."""
    rng = random.Random(11)
    for _ in range(8):
        m, n, k = (rng.choice([256, 1024, 2048, 4096, rng.randint(32, 4096)]) for _ in range(3))
        best = None
        for cores in (4, 8, 16, 32, 64):
            now = wia_hw.run("gemm", M=m, N=n, K=k, overrides={"compute.cores": cores}).cycles
            assert best is None or now <= 1.12 * best, (m, n, k, cores, now, best)
            best = now if best is None else min(best, now)


def test_a_tiling_on_fewer_cores_runs_as_a_device_of_that_many():
    """``GemmTiling.cores = c`` on a device of more cores is exactly the tiling on a
    device of ``c`` cores (the others idle): the same cycles, bytes, hits and misses,
    on random shapes, tilings and both schedules."""
    rng = random.Random(5)
    for _ in range(24):
        n = rng.choice([8, 16, 64])
        c = rng.randint(1, n - 1)
        sched = rng.choice(["contiguous", "round_robin"])
        big = load_spec("wia-npu", {"compute.cores": n, "compute.tile_schedule": sched})
        small = load_spec("wia-npu", {"compute.cores": c, "compute.tile_schedule": sched})
        batch = rng.choice([1, 1, 3])
        m, nn, k = (rng.randint(1, 900) for _ in range(3))
        t = GemmTiling(
            tm=rng.choice([128, 256]),
            tn=rng.choice([128, 256]),
            tk=rng.choice([128, 256, k]),
            order=rng.choice(["mn", "nm"]),
        )
        a = Device(big).execute([_kernel(batch, m, nn, k, GemmTiling(**{**vars(t), "cores": c}))])
        b = Device(small).execute([_kernel(batch, m, nn, k, t)])
        got, want = a[0], b[0]
        assert got.cycles == want.cycles, (n, c, sched, (batch, m, nn, k), t)
        for f in ("bytes", "hits", "misses"):
            assert getattr(got.counters, f) == getattr(want.counters, f)
        assert got.cores_used == want.cores_used <= c
        # a count at or above the device's is all of them
        t_all = GemmTiling(**{**vars(t), "cores": n + rng.randint(0, 3)})
        whole = Device(big).execute([_kernel(batch, m, nn, k, t_all)])[0]
        assert whole.cycles == Device(big).execute([_kernel(batch, m, nn, k, t)])[0].cycles


def test_a_tiling_rejects_a_negative_core_count():
    for bad in (-1, True, 1.5, "4"):
        with pytest.raises(ValueError, match="GemmTiling.cores must be a non-negative integer"):
            GemmTiling(tm=1, tn=1, tk=1, cores=bad)
    assert "cores" not in repr(GemmTiling(1, 1, 1)) and "cores=8" in repr(
        GemmTiling(1, 1, 1, cores=8)
    )


def test_more_cores_run_what_fewer_would_where_that_is_faster():
    """256 x 4096 x 4096 on wia-npu: 16 cores split it into 16 tiles of 256 x 256, one a
    core, whose loads nothing overlaps (79,165 cycles), where 8 cores run 32 of 128 x
    256 (70,973). The tiling now runs the 8 cores' tiles on 8 cores of 16, 32 or 64."""

    def cycles(cores: int) -> int:
        over = {"compute.cores": cores}
        return wia_hw.run("gemm", M=256, N=4096, K=4096, overrides=over).cycles

    eight = cycles(8)
    for cores in (16, 32, 64):
        assert cycles(cores) <= eight, cores


@pytest.mark.parametrize(("device", "n"), [("wia-npu", 64), ("a100-systolic", 108)])
def test_the_tiling_is_monotone_in_cores_by_its_estimate(device, n):
    """The tiler's choice on ``n`` cores is no slower than its choice on any power-of-two
    count below, or half of ``n``: those are among what it tries on ``n`` (random
    shapes, fixed seed). Measured (the run's cost) for a short GEMM; estimated, to the
    margin, for a long one."""
    import wia_hw.lowering as lowering
    from wia_hw._tiling import COLD_MARGIN, _Gemm, _short, run_cost
    from wia_hw.lowering import lower

    rng = random.Random(9)
    long_ = 0
    for _ in range(6):
        m, nn, k = (rng.choice([64, 192, 512, 768, 1024, 4096]) for _ in range(3))
        g = wia_hw.runtime.resolve_workload("gemm", M=m, N=nn, K=k)
        got: dict[int, tuple[GemmTiling, object]] = {}
        for c in (n, n // 2, 16, 4):
            spec = load_spec(device, {"compute.cores": c})
            seen = {}
            real = lowering.gemm_estimate

            def spy(s, kern, storage=(), cold=frozenset(), seen=seen, real=real):
                seen["f"] = real(s, kern, storage, cold)
                return seen["f"]

            lowering.gemm_estimate = spy
            try:
                (kern,) = [x for _, ks in lower(g, spec) for x in ks if isinstance(x, GemmKernel)]
            finally:
                lowering.gemm_estimate = real
            got[c] = (kern.tiling, seen["f"])
        t_n, est_n = got[n]
        assert est_n.all_cold  # a GEMM of the graph's inputs
        spec_n = load_spec(device, {"compute.cores": n})
        g_ = _Gemm(1, m, nn, k, 2, 2)
        for c in (n // 2, 16, 4):
            t_c, _ = got[c]
            on_c = GemmTiling(**{**vars(t_c), "cores": t_c.cores or c})
            if _short(spec_n, g_):  # chosen by the emulator's runs
                comp = est_n.compulsory_bytes
                assert run_cost(spec_n, comp, est_n.measure(t_n)) <= run_cost(
                    spec_n, comp, est_n.measure(on_c)
                ), (m, nn, k, c, t_n, t_c)
            else:  # by the estimate, to COLD_MARGIN
                assert est_n(t_n) * COLD_MARGIN <= est_n(on_c) * (1 + 1e-9), (m, nn, k, c)
                long_ += 1
    # a100-systolic's small L1 makes long GEMMs of some: the estimate's path is checked
    assert long_ or device == "wia-npu"


def test_a_vector_op_takes_its_chunks_where_its_producer_left_its_input():
    """BERT-Base b8 s512 on 64 cores: the attention scores run 2 heads a tile, 48 tiles
    one a core, and the softmax took 64 chunks of 1.5 heads, which read the scores
    from L2 and HBM (1,189 MB a run against 604 on 32 cores; the model 7.62 ms against
    5.54). Chunks of one head fall on the cores that computed the scores."""
    import wia_hw.lowering as lowering
    from wia_hw.lowering import lower
    from wia_hw.workloads import bert_base

    def cycles(cores: int) -> int:
        over = {"compute.cores": cores}
        return wia_hw.run("bert-base", batch=8, seq=512, layers=2, overrides=over).cycles

    assert cycles(64) <= cycles(32)
    spec = load_spec("wia-npu", {"compute.cores": 64})
    st_seen = {}
    real = lowering._owner_aligned

    def spy(spec_, st, kern, max_rows):
        out = real(spec_, st, kern, max_rows)
        st_seen[kern.name] = (st, kern, out)
        return out

    lowering._owner_aligned = spy
    try:
        lower(bert_base(batch=8, seq=512, layers=1), spec)
    finally:
        lowering._owner_aligned = real
    st, before, after = st_seen["layer0.attention_softmax"]
    (ref,) = after.inputs
    dev = Device(spec)
    theirs = lowering._stored_by_core(dev, spec, st.writers[ref.name], ref.name)
    now = lowering._owned_share(lowering._shares(dev, spec, after), ref.name, theirs)
    was = lowering._owned_share(lowering._shares(dev, spec, before), ref.name, theirs)
    assert was < 0.1 and now > 0.5, (was, now)


def test_the_context_bmm_takes_its_heads_where_the_softmax_left_them():
    """BERT-Large b4 s512 (one layer): the softmax's chunks hold 2 heads, and the
    context ``bmm`` took 4 heads a tile (the estimate keeps heads together for V's
    shared blocks), so half of each tile's probabilities came from another core's L1
    by way of HBM: 455,297 cycles on 64 cores against 391,179 on 32. With tiles of the
    softmax's heads, more cores are no slower to 3% (389,329 on 24, 397,903 on 64)."""
    from wia_hw.lowering import lower
    from wia_hw.workloads import bert_large

    def cycles(cores: int) -> int:
        over = {"compute.cores": cores}
        return wia_hw.run("bert-large", batch=4, seq=512, layers=1, overrides=over).cycles

    runs = [cycles(c) for c in (24, 32, 48, 64)]
    assert all(b <= 1.03 * min(runs[:i]) for i, b in enumerate(runs) if i), runs
    spec = load_spec("wia-npu", {"compute.cores": 64})
    kernels = {
        k.name: k for _, ks in lower(bert_large(batch=4, seq=512, layers=1), spec) for k in ks
    }
    soft, ctx = kernels["layer0.attention_softmax"], kernels["layer0.attention_context"]
    assert ctx.tiling.tb * ctx.m == soft.rows_per_tile, (ctx.tiling, soft.rows_per_tile)


def test_owner_alignment_leaves_tensors_that_fit_l2_alone():
    """Where the producer's output fits in half of L2, another core's L1 is backed by L2
    and a chunking or tiling that follows the producer gained nothing measurable (GPT-2
    b4 s256 on 48 cores: the context in tiles of the softmax's head was 8.9% slower):
    nothing changes there."""
    import wia_hw.lowering as lowering
    from wia_hw.workloads import gpt2

    changed = []
    real_v, real_g = lowering._owner_aligned, lowering._gemm_owner_aligned

    def spy_v(spec, st, kern, max_rows):
        out = real_v(spec, st, kern, max_rows)
        changed.append(out is not kern)
        return out

    def spy_g(spec, st, kern):
        out = real_g(spec, st, kern)
        changed.append(out is not kern)
        return out

    lowering._owner_aligned, lowering._gemm_owner_aligned = spy_v, spy_g
    try:
        lowering.lower(
            gpt2(batch=4, seq=256, layers=1), load_spec("wia-npu", {"compute.cores": 48})
        )
    finally:
        lowering._owner_aligned, lowering._gemm_owner_aligned = real_v, real_g
    assert changed and not any(changed)


def test_an_elementwise_op_after_a_convolution_reads_it_as_it_was_stored():
    """A convolution stores its output NHWC (``N*H*W x C``); the residual add after it
    took the graph's NCHW shape, rows of W elements, so a chunk of its rows cut every
    storage block it touched and each chunk loaded the blocks again: ResNet-50 b8's
    layer3.0.residual moved 69.7 MB over the L2 port on 64 cores (13.2 on 8) for 9.6 MB
    of operands, and the model took 10.8% longer on 64 cores than on 8. It now reads the
    conv's rows: each block at most once per core that needs it."""
    runs = {}
    for cores in (8, 16, 32, 64):
        r = wia_hw.run("resnet50", batch=8, overrides={"compute.cores": cores})
        runs[cores] = r.cycles
        (k,) = [x for x in r.kernels if x.name == "layer3.0.residual"]
        assert [(i.rows, i.cols) for i in k.kernel.inputs] == [(8 * 14 * 14, 1024)] * 2
        operands = 3 * 8 * 14 * 14 * 1024 * 2
        assert k.counters.bytes["l2"] <= operands, (cores, k.counters.bytes["l2"])
    cycles = list(runs.values())
    assert all(b <= 1.04 * min(cycles[:i]) for i, b in enumerate(cycles) if i), runs


def _vector(rows: int, cols: int, rpt: int, placement: tuple[int, ...] = ()) -> VectorKernel:
    return VectorKernel(
        name="v",
        op="v",
        group="softmax",
        op_kind="softmax",
        vclass="softmax",
        rows=rows,
        elements=rows * cols,
        flops=5 * rows * cols,
        inputs=(TensorRef("X", rows, cols, 2),),
        outputs=(TensorRef("Y", rows, cols, 2),),
        rows_per_tile=rpt,
        placement=placement,
    )


def test_a_vector_placement_is_the_cores_its_tiles_run_on():
    """``VectorKernel.placement`` names each tile's core: the partition's own placement
    gives exactly the same run; another puts the tiles (and their busy cycles) where it
    says; one made for another chunking or a larger device is void."""
    rng = random.Random(17)
    for _ in range(8):
        cores = rng.choice([4, 8, 16])
        spec = load_spec("wia-npu", {"compute.cores": cores})
        rows, cols = rng.randint(64, 4096), rng.choice([128, 512, 1024])
        rpt = rng.choice([16, 64, 128])
        plain = _vector(rows, cols, rpt)
        tiles, groups = Device(spec).tiles_of(plain)
        own = Device.partition(tiles, groups, cores, spec.compute.tile_schedule)
        where = {id(t): c for c, s in enumerate(own) for t in s}
        same = _vector(rows, cols, rpt, tuple(where[id(t)] for t in tiles))
        a, b = Device(spec).execute([plain])[0], Device(spec).execute([same])[0]
        assert (a.cycles, a.counters.bytes, a.core_busy_cycles) == (
            b.cycles,
            b.counters.bytes,
            b.core_busy_cycles,
        )
        placed = tuple(rng.randrange(cores // 2) for _ in tiles)  # the first half only
        rec = Device(spec).execute([_vector(rows, cols, rpt, placed)])[0]
        assert all(rec.core_busy_cycles[c] == 0 for c in range(cores) if c not in placed)
        assert all(rec.core_busy_cycles[c] > 0 for c in set(placed))
        for void in ((0,) * (len(tiles) + 1), (cores,) * len(tiles)):
            rec = Device(spec).execute([_vector(rows, cols, rpt, void)])[0]
            assert rec.cycles == a.cycles
    with pytest.raises(ValueError, match="placement must hold non-negative core indices"):
        _vector(8, 8, 1, (0, -1))


def test_a_softmax_thinner_than_its_producers_tiles_runs_where_they_are():
    """GPT-2 b8 s1024 (one layer) on 64 cores: a head's 1,024 x 1,024 scores are one
    tile, 96 of them, 2 or 1 a core; the softmax's L1 budget allows 512-row chunks, and
    dealt 3 a core they read the scores from HBM: 2,295,837 cycles against 1,656,291
    on 48 cores. Placed on the cores that hold their rows: 1,611,627."""

    def cycles(cores: int) -> int:
        over = {"compute.cores": cores}
        return wia_hw.run("gpt2", batch=8, seq=1024, layers=1, overrides=over).cycles

    assert cycles(64) <= cycles(48)
