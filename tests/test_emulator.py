"""Device-level properties of the emulator, through the runtime (the issue's Must hold)."""

from __future__ import annotations

import math
import random

import pytest
from wia_hw.emulator.counters import Counter
from wia_hw.emulator.cycles import systolic_steps, systolic_tile_counters, systolic_tile_cycles

import wia_hw
from wia_hw.workloads import build, gemm


def _floor_cycles(spec, rec):
    """Roofline floor of one kernel in cycles: FLOPs at peak, HBM bytes at bandwidth."""
    compute = (
        rec.flops / float(2 * spec.peak_macs_per_cycle(rec.precision))
        if rec.kind == "gemm"
        else 0.0
    )
    memory = rec.counters.bytes["hbm"] / float(spec.bytes_per_cycle(spec.peak_bandwidth_gbs))
    return max(compute, memory)


@pytest.mark.parametrize(
    "workload,kw",
    [
        ("bert-large", dict(batch=32, seq=128)),
        ("bert-base", dict(batch=4, seq=64, precision="int8")),
        ("gpt2", dict(batch=2, seq=128)),
        ("gpt2", dict(batch=2, phase="decode", kv_len=300)),
        ("resnet50", dict(batch=2)),
    ],
)
def test_no_kernel_beats_its_roofline_floor(workload, kw):
    ctx = wia_hw.open_device("wia-npu")
    r = ctx.run(workload, **kw)
    for k in r.kernels:
        assert k.cycles >= _floor_cycles(ctx.spec, k.record), k.name
    # the whole run: not faster than the graph's FLOPs at peak
    g = build(workload, **kw)
    assert r.latency_ms >= g.flops() / ctx.spec.peak_flops(r.precision) * 1e3 * 0.999
    assert r.roofline_floor_ms <= r.latency_ms


def _first_touch_bytes(graph):
    """Per op: bytes of the weights and inputs it is the first to read (an embedding only
    the table rows its ids can touch). From a cold device these cross HBM during the
    op's kernels: the op's share of the graph's compulsory traffic."""
    seen, out = set(), {}
    for op in graph.ops:
        total = 0
        for idx, name in enumerate(op.inputs):
            t = graph.tensors[name]
            if t.kind == "activation" or name in seen:
                continue
            seen.add(name)
            nbytes = t.nbytes
            if op.kind == "embedding" and idx == 1:
                ids = math.prod(graph.tensors[op.inputs[0]].shape)
                nbytes = min(t.shape[0], ids) * (t.nbytes // t.shape[0])
            total += nbytes
        out[op.name] = total
    return out


@pytest.mark.parametrize("pipelined", [True, False])
def test_no_run_or_kernel_below_its_floor_on_random_specs(pipelined):
    """Property: random GEMMs and small transformers on random devices, pipelined array on
    and off. The reported floor is the graph's FLOPs at peak and its compulsory HBM bytes
    (each weight and input read once, each output written once) at peak bandwidth; the
    run is never below it, and no kernel below its own floor (its array FLOPs at peak,
    the compulsory bytes it is first to read at peak bandwidth)."""
    from wia_hw.runtime import compulsory_hbm_bytes

    rng = random.Random(41 if pipelined else 42)
    for _ in range(5):
        over = {
            "compute.array.pipelined": pipelined,
            "compute.cores": rng.choice([1, 2, 4]),
            "compute.array.rows": rng.choice([16, 32, 64, 128]),
            "compute.array.cols": rng.choice([16, 32, 64, 128]),
            "compute.array.dataflow": rng.choice(["os", "ws"]),
            "memory.hbm.bandwidth_gbs": rng.choice([40, 200, 600, 4000]),
            "memory.hbm.channels": rng.choice([2, 8, 16]),
            "clock_ghz": rng.choice([0.5, 1.0, 2.0]),
        }
        kind = rng.choice(["gemm", "bmm", "bert"])
        if kind == "bert":
            g = build("bert-base", batch=rng.randint(1, 2), seq=rng.choice([16, 48]), layers=1)
        else:
            g = gemm(
                rng.randint(1, 900),
                rng.randint(1, 900),
                rng.randint(1, 900),
                batch=1 if kind == "gemm" else rng.randint(2, 6),
            )
        ctx = wia_hw.open_device("wia-npu", overrides=over)
        spec = ctx.spec
        r = ctx.run(g)
        bw_bps = spec.peak_bandwidth_gbs * 1e9
        floor_ms = 1e3 * max(
            g.flops() / spec.peak_flops(r.precision), compulsory_hbm_bytes(g) / bw_bps
        )
        assert r.roofline_floor_ms == pytest.approx(floor_ms, rel=1e-12)
        assert r.latency_ms >= r.roofline_floor_ms
        assert r.counters.bytes["hbm"] >= compulsory_hbm_bytes(g)  # never fewer bytes
        first = _first_touch_bytes(g)
        bpc = float(spec.bytes_per_cycle(spec.peak_bandwidth_gbs))
        charged = set()
        for k in r.kernels:
            own = 0 if k.op in charged else first.get(k.op, 0)
            charged.add(k.op)
            compute = (
                k.flops / float(2 * spec.peak_macs_per_cycle(k.precision))
                if k.kind == "gemm"
                else 0.0
            )
            assert k.cycles >= max(compute, own / bpc), (k.name, over)


def test_bert_large_floor_derived_from_graph_flops():
    r = wia_hw.run("bert-large", batch=32, seq=128, device="wia-npu")
    g = build("bert-large", batch=32, seq=128)
    floor_ms = g.flops() / load_peak("wia-npu") * 1e3  # ~19.7 ms for 2.53 TFLOP
    assert r.latency_ms >= floor_ms
    assert r.flops == g.flops()
    assert [o.name for o in r.ops][:1] in (["feed_forward"], ["multi_head_attention"])
    names = {o.name for o in r.ops}
    assert {"multi_head_attention", "layer_norm", "feed_forward", "embedding", "output"} <= names
    assert sum(o.time_ms for o in r.ops) == pytest.approx(r.latency_ms)
    assert sum(o.pct for o in r.ops) == pytest.approx(100.0)
    assert r.throughput == pytest.approx(32 / (r.latency_ms / 1e3))


def load_peak(name: str) -> float:
    return wia_hw.load_spec(name).peak_flops("fp16")


def test_large_gemm_reaches_85_percent_of_peak():
    r = wia_hw.run(gemm(4096, 4096, 4096), device="wia-npu")
    assert r.compute_utilization >= 85.0
    assert r.compute_utilization <= 100.0


def test_mapping_loss_for_dims_not_multiple_of_the_array():
    """4032 = 31.5 x 128: the same passes as 4096, so the same time, 3% fewer FLOPs
    per dimension."""
    full = wia_hw.run(gemm(4096, 4096, 4096))
    part = wia_hw.run(gemm(4032, 4032, 4096))
    expected = (4032 / 4096) ** 2
    assert part.cycles == pytest.approx(full.cycles, rel=0.02)
    assert part.compute_utilization / full.compute_utilization == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("dataflow", ["os", "ws"])
def test_one_tile_takes_the_cycle_function(dataflow):
    rng = random.Random(11 if dataflow == "os" else 12)
    for _ in range(8):
        rows, cols = rng.choice([4, 8, 16, 32]), rng.choice([4, 8, 16, 32])
        k = rng.randint(1, rows if dataflow == "ws" else 200)
        m = rows if dataflow == "os" else rng.randint(1, 200)
        ctx = wia_hw.open_device(
            "wia-npu",
            overrides={
                "compute.array.rows": rows,
                "compute.array.cols": cols,
                "compute.array.dataflow": dataflow,
                "compute.cores": 1,
            },
        )
        r = ctx.run(gemm(m, cols, k), trace=True)
        (kern,) = r.kernels
        assert kern.tiles == 1
        depth = systolic_steps(k if dataflow == "os" else m, 1)
        expected = systolic_tile_cycles(dataflow, rows, cols, depth)
        rtl = systolic_tile_counters(dataflow, rows, cols, depth)  # the RTL counter block
        computes = [e for e in r.trace if e.kind == "compute"]
        assert len(computes) == 1
        assert computes[0].end - computes[0].start == expected == rtl[Counter.CYCLES]
        assert kern.counters.busy_cycles == rtl[Counter.BUSY_CYCLES]
        assert kern.record.slot_macs == rtl[Counter.MACS]
        assert kern.macs == m * cols * k
        assert kern.cycles >= expected


def test_counter_invariants():
    r = wia_hw.run(gemm(1000, 700, 300))
    c = r.counters
    assert c.flops == 2 * c.macs == 2 * 1000 * 700 * 300
    assert c.array_flops == 2 * c.macs
    assert c.cache_misses == c.misses["l1"] + c.misses["l2"]
    assert c.accesses("l2") == c.misses["l1"]  # every L1 miss goes to L2
    # L1 accesses counted against the blocks the tiles' loads touch, derived apart from
    # the counters (accesses() itself is hits + misses, so it cannot check them)
    from wia_hw.emulator.device import Device

    from wia_hw.lowering import lower

    spec = wia_hw.load_spec("wia-npu")
    (kern,) = [k for _, ks in lower(gemm(1000, 700, 300), spec) for k in ks]
    dev = Device(spec)
    tiles, _ = dev.tiles_of(kern)
    touched = sum(len(dev.memory.region_blocks(t.loads)) for t in tiles)
    assert c.hits["l1"] + c.misses["l1"] == touched >= c.misses["l1"] > 0
    assert c.macs_by_precision["fp16"] == c.macs
    assert c.energy_pj > 0 and c.instructions > 0 and c.branches >= c.branch_mispredicts


def test_bytes_at_least_compulsory_traffic():
    g = build("bert-base", batch=2, seq=64)
    r = wia_hw.run(g)
    c = r.counters
    # cold caches: every weight and input crosses HBM at least once, and the final
    # outputs are written back
    tables = {
        op.inputs[1]: math.prod(g.tensors[op.inputs[0]].shape)
        for op in g.ops
        if op.kind == "embedding"
    }
    compulsory = 0
    for name, t in g.tensors.items():
        if t.kind not in ("weight", "input"):
            continue
        if name in tables:  # a lookup reads only the rows it touches
            compulsory += min(tables[name], t.shape[0]) * t.nbytes // t.shape[0]
        else:
            compulsory += t.nbytes
    assert c.bytes["hbm"] >= compulsory
    for k in r.kernels:
        assert k.counters.bytes["l1"] >= k.record.compulsory_bytes * 0.999, k.name


def test_energy_positive_and_grows_with_work():
    small = wia_hw.run(gemm(512, 512, 512))
    big = wia_hw.run(gemm(1024, 1024, 1024))
    assert 0 < small.energy_j < big.energy_j
    assert big.avg_power_w > 0


def test_same_inputs_and_seed_give_identical_json():
    a = wia_hw.run("gpt2", batch=2, seq=64, seed=3).to_json()
    b = wia_hw.run("gpt2", batch=2, seq=64, seed=3).to_json()
    assert a == b


def test_context_keeps_state_between_runs():
    ctx = wia_hw.open_device("wia-npu")
    cold = ctx.run(gemm(512, 512, 512))
    warm = ctx.run(gemm(512, 512, 512))
    assert warm.counters.bytes["hbm"] < cold.counters.bytes["hbm"]  # weights in L2
    assert ctx.device.now == cold.cycles + warm.cycles


def test_thermal_throttling_shows_as_thermal_stall():
    hot = wia_hw.run(gemm(2048, 2048, 2048), overrides={"thermal.initial_c": 150.0})
    cool = wia_hw.run(gemm(2048, 2048, 2048))
    assert hot.counters.stall_cycles["thermal"] > 0
    assert cool.counters.stall_cycles["thermal"] == 0
    assert hot.cycles > cool.cycles


def test_tiling_changes_cache_behaviour():
    """A smaller L1 holds fewer of the blocks a core's tiles re-read: more L2 traffic;
    and its tiles fit its operand buffers. (2048^3 on 4 cores runs fastest in 256^3
    tiles, which fit either L1, so the tiler, measuring, picks them for both.)"""
    big = wia_hw.run(gemm(2048, 2048, 2048))
    small = wia_hw.run(gemm(2048, 2048, 2048), overrides={"memory.l1.size_kib": 2048})
    assert small.counters.bytes["l2"] > big.counters.bytes["l2"]
    for r, kib in ((big, 8192), (small, 2048)):
        (g,) = [x for x in r.kernels if x.kind == "gemm"]
        t = g.kernel.tiling
        assert (t.tm + t.tn) * t.tk * 2 <= kib * 1024 // 2, t


def test_edge_device_runs_int8():
    r = wia_hw.run("gpt2", device="wia-edge", precision="int8", batch=1, seq=32)
    assert r.precision == "int8" and r.counters.macs_by_precision["int8"] > 0
    assert r.latency_ms > 0 and math.isfinite(r.throughput)
