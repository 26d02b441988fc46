"""The memory system: HBM channel interleaving, ports served in arrival order, DMA
engines, and monotonicity in memory resources."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import simpy
from wia_hw.emulator.config import DEFAULT_INTERLEAVE_BYTES, DeviceSpec
from wia_hw.emulator.counters import Counters
from wia_hw.emulator.cycles import transfer_cycles
from wia_hw.emulator.device import Device
from wia_hw.emulator.errors import SpecError
from wia_hw.emulator.kernels import TensorRef
from wia_hw.emulator.memory import BandwidthPort, MemorySystem, channel_of, hbm_spread

import wia_hw
from wia_hw.graph import Graph, GraphBuilder
from wia_hw.lowering import lower
from wia_hw.spec import load_spec
from wia_hw.workloads import build

#: HBM refresh off: the tests of the channels' nominal arithmetic
NO_REFRESH = {"memory.hbm.refresh_interval_ns": 0, "memory.hbm.refresh_cycle_ns": 0}


# -- the address map -------------------------------------------------------------------
def test_hbm_spread_equals_the_byte_by_byte_channel_map():
    rng = random.Random(11)
    for _ in range(400):
        chans = rng.choice([1, 2, 3, 4, 6, 8, 16, 64])
        g = rng.choice([1, 2, 8, 64, 256])
        addr, n = rng.randrange(0, 200_000), rng.randrange(0, 6000)
        ref = [0] * chans
        for byte in range(addr, addr + n):
            ref[channel_of(byte, chans, g)] += 1
        assert hbm_spread(addr, n, chans, g) == ref


def test_each_stripe_is_a_permutation_of_the_channels_and_stripes_rotate():
    rng = random.Random(12)
    for chans in (2, 3, 5, 16, 64):
        g = 64
        firsts = set()
        for stripe in rng.sample(range(10_000), 50):
            base = stripe * chans * g
            got = [channel_of(base + i * g, chans, g) for i in range(chans)]
            assert sorted(got) == list(range(chans))
            firsts.add(got[0])
        assert len(firsts) > 1  # not every stripe starts on the same channel


def test_a_block_is_striped_over_every_channel():
    spec = load_spec("wia-npu")
    mem = MemorySystem(spec, Counters())
    chans, g = spec.memory.hbm.channels, spec.memory.hbm.interleave_bytes
    assert g == DEFAULT_INTERLEAVE_BYTES
    rng = random.Random(13)
    for _ in range(20):
        ref = TensorRef(
            f"t{rng.random()}", rng.randint(1, 3000), rng.randint(1, 3000), rng.choice([1, 2, 4])
        )
        for key, nb in mem.region_blocks([(ref, 0, ref.rows, 0, ref.cols)]):
            per = hbm_spread(mem.block_address(key), nb, chans, g)
            assert sum(per) == nb  # bytes are conserved
            assert max(per) - min(per) <= g  # even to within one unit
            if nb >= chans * g:
                assert min(per) > 0  # a big block touches every channel
    # distinct tensors never share a byte of the address space
    spans = sorted((mem.block_address((t, 0, 0)), t) for t in range(len(mem._layouts)))
    assert len({a for a, _ in spans}) == len(spans)


def test_interleave_bytes_is_a_positive_power_of_two():
    with pytest.raises(
        SpecError,
        match=r"memory\.hbm\.interleave_bytes: must be a power of "
        r"two, got 96",
    ):
        load_spec("wia-npu", {"memory.hbm.interleave_bytes": 96})
    with pytest.raises(
        SpecError,
        match=r"memory\.hbm\.interleave_bytes: must be a positive "
        r"integer, got 0",
    ):
        load_spec("wia-npu", {"memory.hbm.interleave_bytes": 0})


# -- one transfer: bandwidth, latency, channel count -------------------------------------
def _lone_transfer(spec: DeviceSpec, rows: int, cols: int, seed: int) -> tuple[int, int, int]:
    """(cycles, bytes, L2-only cycles) of a cold load of a whole ``rows`` x ``cols``
    fp16 tensor that starts at a random block slot."""
    mem = MemorySystem(spec, Counters())
    pad = TensorRef("pad", 1, random.Random(seed).randint(1, 300) * 32768, 2)
    mem.region_blocks([(pad, 0, 1, 0, pad.cols)])  # shifts the tensor's slots
    ref = TensorRef("t", rows, cols, 2)
    blocks = mem.region_blocks([(ref, 0, rows, 0, cols)])
    l2_only = mem.l2_port.cycles(ref.nbytes) + mem.l2_latency
    done = mem.load(0, blocks, 0)
    return done, sum(nb for _, nb in blocks), l2_only


def test_more_channels_cost_at_most_one_interleave_unit_per_block():
    """At the same total bandwidth, a transfer takes ``ceil(bytes / peak)`` plus latency
    on any channel count when its blocks are whole stripes; otherwise each block's
    busiest channel holds at most ``bytes / C + 2g / C + g`` bytes (one unit more than
    its share, plus the partial units at its ends), so the transfer ends within
    ``ceil((bytes + blocks * (g*C + 2g)) / peak)`` cycles after the latency, and never
    before ``ceil(bytes / peak)``."""
    rng = random.Random(14)
    g = DEFAULT_INTERLEAVE_BYTES
    specs = {
        c: load_spec("wia-npu", {"memory.hbm.channels": c, **NO_REFRESH})
        for c in (1, 2, 4, 8, 16, 32, 64)
    }
    for trial in range(25):
        rows, cols = rng.randint(1, 700), rng.randint(1, 700)
        for chans in (1, 2, 4, 16, 64):
            spec = specs[chans]
            bpc = spec.bytes_per_cycle(spec.memory.hbm.bandwidth_gbs)
            lat = math.ceil(spec.memory.hbm.latency_ns * spec.clock_ghz)
            done, nbytes, l2_only = _lone_transfer(spec, rows, cols, trial)
            nblocks = -(-rows * cols * 2 // spec.memory.block_bytes) * 4 + 4
            floor = max(lat + transfer_cycles(nbytes, bpc), l2_only)
            assert (
                floor
                <= done
                <= max(l2_only, lat + transfer_cycles(nbytes + nblocks * (g * chans + 2 * g), bpc))
            )
    # whole stripes: identical on every channel count
    ends = {c: _lone_transfer(spec, 512, 1024, 3)[0] for c, spec in specs.items()}
    assert len(set(ends.values())) == 1, ends


def test_small_random_reads_are_latency_bound():
    """Reads of 32-512 B at random addresses, one after another (one engine): each takes
    the HBM latency plus its tiny transfer, so the stream moves a few percent of peak
    (refresh off: a read meeting a window would wait for it)."""
    spec = load_spec("wia-npu", NO_REFRESH)
    mem = MemorySystem(spec, Counters())
    rng = random.Random(15)
    bpc = spec.bytes_per_cycle(spec.memory.hbm.bandwidth_gbs)
    per_ch = bpc / spec.memory.hbm.channels
    now = total = 0
    for i in range(300):
        mem.region_blocks(
            [(TensorRef(f"gap{i}", 1, rng.randint(1, 9) * 8192, 2), 0, 1, 0, 1)]
        )  # a random hole before it
        ref = TensorRef(f"r{i}", 1, rng.randint(16, 256), 2)
        blocks = mem.region_blocks([(ref, 0, 1, 0, ref.cols)])
        done = mem.load(0, blocks, now)
        piece = max(
            hbm_spread(
                mem.block_address(blocks[0][0]),
                ref.nbytes,
                spec.memory.hbm.channels,
                spec.memory.hbm.interleave_bytes,
            )
        )
        assert done - now == max(
            mem.hbm_latency + transfer_cycles(piece, per_ch),
            mem.l2_port.cycles(ref.nbytes) + mem.l2_latency,
        )
        total += ref.nbytes
        now = done
    assert now >= 300 * mem.hbm_latency
    assert total / now < 0.05 * float(bpc)


def _stream_graph(rows: int, cols: int) -> Graph:
    b = GraphBuilder("stream", "fp16")
    b.op("add", "sum", [b.input("x", (rows, cols)), b.input("y", (rows, cols))])
    return b.graph()


def test_a_long_streaming_read_reaches_90_percent_of_peak_hbm_bandwidth():
    rng = random.Random(16)
    spec = load_spec("wia-npu")
    peak = float(spec.bytes_per_cycle(spec.memory.hbm.bandwidth_gbs))
    for _ in range(2):
        rows, cols = rng.randint(4096, 8192), rng.choice([2048, 3072, 4096])
        r = wia_hw.run(_stream_graph(rows, cols))
        assert r.counters.bytes["hbm"] >= 3 * rows * cols * 2  # read twice, written once
        assert r.counters.bytes["hbm"] / r.cycles >= 0.9 * peak


# -- ports serve requests in arrival order -------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_port_equals_fifo_resource_on_random_request_streams(seed):
    """Several SimPy processes issue random-size requests after random think times, each
    waiting for its request to end: every completion time equals that of a
    ``simpy.Resource(capacity=1)`` held for the same service time."""
    rng = random.Random(seed)
    bpc = Fraction(rng.randint(1, 200), rng.randint(1, 7))
    streams = [
        [(rng.randint(0, 300), rng.randint(1, 20_000)) for _ in range(rng.randint(5, 40))]
        for _ in range(rng.randint(2, 8))
    ]

    def run(book) -> dict[tuple[int, int], int]:
        env = simpy.Environment()
        done: dict[tuple[int, int], int] = {}

        def proc(p, reqs):
            for i, (think, nbytes) in enumerate(reqs):
                yield env.timeout(think)
                yield from book(env, nbytes)
                done[p, i] = int(env.now)

        for p, reqs in enumerate(streams):
            env.process(proc(p, reqs))
        env.run()
        return done

    res: dict[str, simpy.Resource] = {}

    def with_resource(env, nbytes):
        r = res.setdefault("r", simpy.Resource(env, capacity=1))
        with r.request() as rq:
            yield rq
            yield env.timeout(transfer_cycles(nbytes, bpc))

    port = BandwidthPort("p", bpc)

    def with_port(env, nbytes):
        end = port.reserve(int(env.now), nbytes)
        yield env.timeout(end - env.now)

    assert run(with_port) == run(with_resource)


def test_port_refuses_a_request_that_arrives_before_a_booked_one():
    port = BandwidthPort("hbm.3", Fraction(16))
    port.reserve(100, 64)
    with pytest.raises(
        RuntimeError,
        match=r"port hbm\.3: a request arriving at cycle 99 was "
        r"booked after one arriving at 100",
    ):
        port.reserve(99, 64)


def test_every_booking_of_a_run_arrives_in_order(monkeypatch):
    """The result stores of a run are booked when they are issued: on every port, no
    request is booked with an arrival earlier than one booked before it."""
    arrivals: dict[str, list[int]] = {}
    orig = BandwidthPort.reserve

    def spy(self, now, nbytes):
        if nbytes > 0:
            arrivals.setdefault(self.name, []).append(now)
        return orig(self, now, nbytes)

    monkeypatch.setattr(BandwidthPort, "reserve", spy)
    for e in (1, 3):
        arrivals.clear()
        wia_hw.run(
            "bert-base",
            batch=2,
            seq=64,
            layers=1,
            overrides={"dma.engines_per_core": e, "memory.l2.size_kib": 4096},
        )
        assert sum(len(v) for v in arrivals.values()) > 300
        for name, seq in arrivals.items():
            assert seq == sorted(seq), name


# -- DMA engines -----------------------------------------------------------------------
def test_dma_engines_bound_the_transfers_in_flight_and_speed_up_stores():
    """On a one-core device a store-heavy stream gets faster with a second engine (a
    result store drains while the next operands load); no core ever has more transfers
    in flight than it has engines, nor more than its two in-order streams (operand
    loads, result stores), so engines beyond two change nothing."""
    g = _stream_graph(1024, 2048)
    cycles = {}
    for e in (1, 2, 4):
        r = wia_hw.run(g, device="wia-edge", overrides={"dma.engines_per_core": e}, trace=True)
        cycles[e] = r.cycles
        spans = sorted((ev.start, ev.end) for ev in r.trace if ev.kind in ("dma", "store"))
        depth = max(sum(1 for s, t in spans if s <= start < t) for start, _ in spans)
        assert depth <= min(e, 2)
        if e > 1:
            assert depth == 2
    assert cycles[2] < cycles[1]
    assert cycles[4] == cycles[2]


def test_loads_in_flight_overlap_the_operand_loads_up_to_the_buffers():
    """With ``dma.loads_in_flight`` N (and engines enough), a core's operand loads
    overlap N deep: the next tile's operands are asked for while the current tile's
    still arrive, so a load-bound stream gets faster; a load still waits for its operand
    buffer (two: the tile two back must be done), so N above 2 changes nothing. With
    N = 1 no two loads of a core overlap."""
    g = _stream_graph(1024, 2048)
    cycles, moved = {}, {}
    for n in (1, 2, 3):
        over = {"dma.loads_in_flight": n, "dma.engines_per_core": 4}
        r = wia_hw.run(g, device="wia-edge", overrides=over, trace=True)
        cycles[n] = r.cycles
        moved[n] = dict(r.counters.bytes)
        loads = sorted((ev.start, ev.end) for ev in r.trace if ev.kind == "dma")
        depth = max(sum(1 for s, t in loads if s <= start < t) for start, _ in loads)
        assert depth == min(n, 2)
    assert moved[1] == moved[2] == moved[3]  # earlier, not more: the same bytes move
    assert cycles[2] < cycles[1]
    assert cycles[3] == cycles[2]
    # one engine: the loads take turns with each other whatever N is
    one = {"dma.engines_per_core": 1}
    r1 = wia_hw.run(g, device="wia-edge", overrides={**one, "dma.loads_in_flight": 1})
    r2 = wia_hw.run(g, device="wia-edge", overrides={**one, "dma.loads_in_flight": 2})
    assert r1.cycles == r2.cycles


# -- monotone in resources -----------------------------------------------------------------
def _random_workload(rng: random.Random) -> Graph:
    kind = rng.choice(["gemm", "gemm", "bert-base", "gpt2"])
    if kind == "gemm":
        return build(
            "gemm",
            M=rng.randint(1, 900),
            N=rng.randint(1, 900),
            K=rng.randint(1, 900),
            batch=rng.choice([1, 1, 2]),
            precision=rng.choice(["fp16", "int8", "fp32"]),
        )
    if kind == "gpt2":
        return build("gpt2", batch=1, seq=rng.choice([8, 16]), layers=1)
    return build("bert-base", batch=rng.randint(1, 3), seq=rng.choice([16, 32, 64]), layers=1)


AXES = {
    "refresh time (tRFC)": [("memory.hbm.refresh_cycle_ns", v) for v in (1000, 260, 100)],
    "hbm bandwidth": [("memory.hbm.bandwidth_gbs", v) for v in (150, 300, 600, 1200)],
    "l1 size": [("memory.l1.size_kib", v) for v in (1024, 2048, 8192)],
    "l2 size": [("memory.l2.size_kib", v) for v in (2048, 8192, 32768)],
    "l2 bandwidth": [("memory.l2.bandwidth_gbs", v) for v in (1000, 2000, 4000, 8000)],
    "dma engines": [("dma.engines_per_core", v) for v in (1, 2, 3)],
    "loads in flight": [("dma.loads_in_flight", v) for v in (1, 2, 3)],
    "cores": [("compute.cores", v) for v in (1, 2, 4)],
}


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_more_memory_resources_are_never_slower(seed):
    """Random small workloads, lowered once (the same program: the tiling heuristic's
    choices are not the model's physics) and run on devices with more HBM bandwidth,
    L1, L2, L2 bandwidth, DMA engines or cores: the last kernel never ends later, and
    the run with its final write-back of dirty L2 data never ends later either, except
    along L2 size: a larger write-back L2 keeps more dirty blocks to the end, and the
    final flush writes them without compute to overlap (a property of write-back
    caches; the bytes written are no more)."""
    rng = random.Random(seed)
    graph = _random_workload(rng)
    lowered = lower(graph, load_spec("wia-npu", {"memory.l1.size_kib": 1024, "compute.cores": 1}))
    for axis, points in AXES.items():
        prev = None
        for path, value in points:
            over = {path: value}
            if path == "dma.loads_in_flight":  # engines enough for the loads to overlap
                over["dma.engines_per_core"] = 4
            dev = Device(load_spec("wia-npu", over))
            for _, kernels in lowered:
                dev.execute(kernels)
            computed = dev.now
            dev.flush()
            now = (computed, dev.now, dev.counters.bytes["hbm"])
            if prev is not None:
                what = f"{graph.name} {axis}: {prev[0]} -> {value}"
                assert now[0] <= prev[1][0], what
                if axis == "l2 size":
                    assert now[2] <= prev[1][2], what
                else:
                    assert now[1] <= prev[1][1], what
            prev = (value, now)


# -- DRAM refresh ----------------------------------------------------------------------
def _walk_serve(start: int, dur: int, t: int, r: int, o: int) -> int:
    """A transfer's end, cycle by cycle: it moves one cycle's worth whenever the cycle
    is outside every window ``[o + k t, o + k t + r)``."""
    cycle, left = start, dur
    while left:
        if (cycle - o) % t >= r:
            left -= 1
        cycle += 1
    return cycle


def test_refresh_serve_equals_a_cycle_by_cycle_walk():
    rng = random.Random(40)
    for _ in range(3000):
        t = rng.randint(2, 60)
        r = rng.randint(1, t - 1)
        o = rng.randint(0, 3 * t)
        port = BandwidthPort("hbm.0", Fraction(1))
        port.set_refresh(t, r, o)
        start, dur = rng.randint(0, 200), rng.randint(1, 150)
        assert port.serve(start, dur) == _walk_serve(start, dur, t, r, o % t)


def test_a_refreshing_channel_streams_at_one_minus_trfc_over_trefi():
    """Back-to-back transfers on one channel: over many windows it moves its nominal
    rate times ``1 - tRFC / tREFI`` (within one window's share at the ends), and the
    stall counter holds exactly the cycles the windows took."""
    rng = random.Random(41)
    for _ in range(20):
        t = rng.randint(500, 8000)
        r = rng.randint(1, t // 3)
        port = BandwidthPort("hbm.0", Fraction(rng.randint(1, 64), rng.randint(1, 3)))
        port.set_refresh(t, r, rng.randint(0, t - 1))
        end = 0
        for _ in range(400):
            end = port.reserve(end, rng.randint(1, 40_000))
        assert port.busy_cycles + port.refresh_stall_cycles == end
        windows = end / t
        assert abs(port.refresh_stall_cycles - windows * r) <= 2 * r


def test_refresh_on_the_inlined_channel_booking_equals_the_ports_own():
    """With refresh windows on the channels (the benchmark's ``dram_refresh`` source),
    the memory system books through the ports' own ``reserve``, and the traced ports
    (which inline the booking themselves) give the same run."""
    from wia_hw.profiling import _ports

    spec = load_spec("a100-systolic", {"compute.cores": 8})
    lowered = lower(build("bert-base", batch=2, seq=128, layers=1), spec)
    runs = []
    for traced in (False, True):
        dev = Device(spec)
        for i, ch in enumerate(dev.memory.channels):  # windows, as dram_refresh sets them
            ch.set_refresh(5499, 367, 97 * i)
        ports = _ports.install(dev.memory) if traced else []
        for _, kernels in lowered:
            dev.execute(kernels)
        dev.flush()
        stalls = sum(ch.refresh_stall_cycles for ch in dev.memory.channels)
        if ports:
            _ports.uninstall(dev.memory, ports)
        runs.append((dev.now, dict(dev.counters.bytes), stalls))
    assert runs[0] == runs[1]
    assert runs[0][2] > 0  # windows were met


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"memory.hbm.refresh_interval_ns": 0}, r"refresh_cycle_ns.*set together"),
        ({"memory.hbm.refresh_cycle_ns": 4000}, r"refresh_cycle_ns.*must be below"),
        ({"memory.hbm.refresh_cycle_ns": -1}, r"refresh_cycle_ns.*non-negative"),
    ],
)
def test_bad_refresh_fields_are_one_line_errors(overrides, match):
    with pytest.raises(SpecError, match=match):
        load_spec("wia-npu", overrides)


def test_a_view_at_an_offset_met_before_its_storage_reads_its_bytes():
    """A kernel timed alone may name a view (a slice at an offset) before anything lays
    its storage out: the storage then reaches at least to the view's end, so the view's
    regions cover at least its bytes, in distinct blocks."""
    rng = random.Random(44)
    spec = load_spec("wia-npu")
    for _ in range(50):
        mem = MemorySystem(spec, Counters())
        rows, cols = rng.randint(1, 600), rng.randint(1, 900)
        ref = TensorRef("qkv", rows, cols, 2, offset=rng.randint(0, 3) * rows * cols)
        blocks = mem.region_blocks([(ref, 0, rows, 0, cols)])
        assert len({k for k, _ in blocks}) == len(blocks)
        assert sum(nb for _, nb in blocks) >= ref.nbytes
