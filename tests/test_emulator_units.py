"""Emulator building blocks: bandwidth ports, block layout and LRU, branch predictor,
thermal model, cycle functions."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import simpy
from wia_hw.emulator.config import ThermalConfig
from wia_hw.emulator.control import BranchPredictor, loop_run
from wia_hw.emulator.counters import Counter, Counters
from wia_hw.emulator.cycles import (
    systolic_issue_interval,
    systolic_sequence_counters,
    systolic_sequence_cycles,
    systolic_steps,
    systolic_tile_counters,
    systolic_tile_cycles,
    transfer_cycles,
    vector_op_cycles,
)
from wia_hw.emulator.kernels import TensorRef
from wia_hw.emulator.memory import BandwidthPort, BlockLayout, MemorySystem
from wia_hw.emulator.power import ThermalModel

from wia_hw.spec import load_spec


# -- cycle functions ------------------------------------------------------------------
def test_systolic_tile_cycles_formula_and_errors():
    rng = random.Random(1)
    for _ in range(50):
        r, c, d = rng.randint(1, 256), rng.randint(1, 256), rng.randint(1, 5000)
        for df in ("os", "ws"):
            assert systolic_tile_cycles(df, r, c, d) == d + 2 * r + c - 2
    with pytest.raises(ValueError, match="dataflow must be one of"):
        systolic_tile_cycles("xs", 2, 2, 2)
    with pytest.raises(ValueError, match="rows must be a positive integer, got 0"):
        systolic_tile_cycles("os", 0, 2, 2)
    with pytest.raises(TypeError, match="depth must be an integer"):
        systolic_tile_cycles("os", 2, 2, 2.5)


def test_systolic_issue_interval_rules():
    """Unpipelined: N of the first tile. Pipelined os: max(S, R + S - S'); ws: max(S, R)
    (derivations in the docstring); steady state max(S, R) for both."""
    rng = random.Random(2)
    for _ in range(200):
        r, c = rng.randint(1, 256), rng.randint(1, 256)
        s, s2 = rng.randint(1, 600), rng.randint(1, 600)
        for df in ("os", "ws"):
            assert systolic_issue_interval(df, r, c, s, s2, pipelined=False) == s + 2 * r + c - 2
            assert systolic_issue_interval(df, r, c, s, s, pipelined=True) == max(s, r)
        assert systolic_issue_interval("os", r, c, s, s2, pipelined=True) == max(s, r + s - s2)
        assert systolic_issue_interval("ws", r, c, s, s2, pipelined=True) == max(s, r)
        # pipelining never issues later than the unpipelined array
        assert systolic_issue_interval("os", r, c, s, s2, pipelined=True) <= systolic_tile_cycles(
            "os", r, c, s
        )
    with pytest.raises(TypeError, match="pipelined must be a bool, got 1"):
        systolic_issue_interval("os", 2, 2, 2, 2, pipelined=1)
    with pytest.raises(ValueError, match="next_depth must be a positive integer, got 0"):
        systolic_issue_interval("os", 2, 2, 2, 0, pipelined=True)


def test_systolic_sequence_cycles_and_counters():
    # os 4x3, depths 2 then 5 then 1: accepts at 0, max(2, 4+2-5)=2, 2+max(5, 4+5-1)=10
    assert systolic_sequence_cycles("os", 4, 3, [2, 5, 1], pipelined=True) == 10 + (
        1 + 2 * 4 + 3 - 2
    )
    assert (
        systolic_sequence_cycles("ws", 4, 3, [2, 5, 1], pipelined=True, stall_cycles=3)
        == 4 + 5 + (1 + 8 + 3 - 2) + 3
    )
    assert systolic_sequence_cycles("ws", 4, 3, [], pipelined=True) == 0
    unpiped = systolic_sequence_cycles("os", 4, 3, [2, 5], pipelined=False)
    assert unpiped == (2 + 9) + (5 + 9)
    # busy: union of [T + off, T + off + S + R + C - 2); os windows [0, 7) and [2, 12)
    got = systolic_sequence_counters(
        "os", 4, 3, [2, 5], pipelined=True, stall_cycles=2, elements=[3, 9]
    )
    assert got == {
        Counter.CYCLES: 2 + (5 + 9) + 2,
        Counter.BUSY_CYCLES: 12,
        Counter.MACS: 4 * 3 * 12,
        Counter.STALL_CYCLES: 2,
    }
    # unpipelined tiles do not overlap: the counters add up tile by tile
    seq = systolic_sequence_counters("ws", 3, 2, [4, 1, 6], pipelined=False)
    tiles = [systolic_tile_counters("ws", 3, 2, d) for d in (4, 1, 6)]
    assert seq == {k: sum(t[k] for t in tiles) for k in seq}
    assert systolic_tile_counters("os", 2, 2, 3, elements=5)[Counter.MACS] == 20
    with pytest.raises(ValueError, match=r"elements \(2\) must be at least depth \(3\)"):
        systolic_tile_counters("os", 2, 2, 3, elements=2)
    with pytest.raises(ValueError, match="elements has 1 entries, depths 2"):
        systolic_sequence_counters("os", 2, 2, [1, 2], pipelined=True, elements=[1])
    with pytest.raises(ValueError, match="stall_cycles must be >= 0, got -1"):
        systolic_sequence_cycles("os", 2, 2, [1], pipelined=True, stall_cycles=-1)


def test_systolic_steps_at_fractional_rates():
    assert systolic_steps(100, 1) == 100
    assert systolic_steps(101, 2) == 51
    assert systolic_steps(10, 0.25) == 40
    assert systolic_steps(7, Fraction(1, 2)) == 14


def test_vector_and_transfer_cycles():
    assert vector_op_cycles(0, 8, 3, 5) == 0
    assert vector_op_cycles(17, 8, 3, 5) == 3 * 3 + 5
    assert transfer_cycles(0, Fraction(3)) == 0
    assert transfer_cycles(10, Fraction(3), 4) == 4 + 4


# -- bandwidth port == FIFO simpy.Resource ----------------------------------------------
def test_bandwidth_port_equals_fifo_resource():
    """Random requests from several processes: the port's end times equal those of a
    simpy.Resource(capacity=1) held for the transfer time."""
    rng = random.Random(7)
    bpc = Fraction(75, 2)
    reqs = sorted((rng.randint(0, 2000), rng.randint(1, 5000), i) for i in range(60))

    env = simpy.Environment()
    res = simpy.Resource(env, capacity=1)
    ends_res: dict[int, int] = {}

    def user(t, nbytes, i):
        yield env.timeout(t)
        with res.request() as rq:
            yield rq
            yield env.timeout(transfer_cycles(nbytes, bpc))
            ends_res[i] = env.now

    for t, n, i in reqs:
        env.process(user(t, n, i))
    env.run()

    env2 = simpy.Environment()
    port = BandwidthPort("p", bpc)
    ends_port: dict[int, int] = {}

    def user2(t, nbytes, i):
        yield env2.timeout(t)
        ends_port[i] = port.reserve(int(env2.now), nbytes)

    for t, n, i in reqs:
        env2.process(user2(t, n, i))
    env2.run()
    assert ends_port == ends_res


# -- layout and LRU -------------------------------------------------------------------
def test_block_layout_covers_regions_exactly():
    rng = random.Random(3)
    for _ in range(30):
        ref = TensorRef("t", rng.randint(1, 700), rng.randint(1, 700), rng.choice([1, 2, 4]))
        lay = BlockLayout.for_tensor(0, ref, 4096)
        assert lay.br * lay.bc * ref.elem_bytes <= 4096 or lay.bc == 1
        # the blocks of the whole tensor hold exactly its bytes
        assert sum(nb for _, nb in lay.blocks(0, ref.rows, 0, ref.cols)) == ref.nbytes
        r0, c0 = rng.randrange(ref.rows), rng.randrange(ref.cols)
        r1, c1 = rng.randint(r0 + 1, ref.rows), rng.randint(c0 + 1, ref.cols)
        got = lay.blocks(r0, r1, c0, c1)
        assert sum(nb for _, nb in got) >= (r1 - r0) * (c1 - c0) * ref.elem_bytes
        assert len({k for k, _ in got}) == len(got)


def _mem(**over):
    spec = load_spec("wia-edge", over)
    c = Counters()
    return MemorySystem(spec, c), c, spec


def test_lru_hits_misses_and_bytes_conserve():
    mem, c, spec = _mem()
    ref = TensorRef("w", 256, 256, 2)  # 128 KiB, 8 blocks of 16 KiB
    blocks = mem.region_blocks([(ref, 0, 256, 0, 256)])
    total = sum(nb for _, nb in blocks)
    assert total == ref.nbytes
    mem.load(0, blocks, 0)
    assert c.misses["l1"] == len(blocks) and c.misses["l2"] == len(blocks)
    assert c.bytes["hbm"] == total
    mem.load(0, blocks, 0)  # all resident now
    assert c.hits["l1"] == len(blocks)
    assert c.bytes["hbm"] == total  # nothing more from HBM
    # every L1 miss looked in L2
    assert c.accesses("l2") == c.misses["l1"]


def test_lru_evicts_least_recent_and_writes_back_dirty():
    mem, c, spec = _mem(**{"memory.l2.size_kib": 64, "memory.l1.size_kib": 64})
    ref = TensorRef("a", 64, 1024, 2)  # 128 KiB: twice L2
    blocks = mem.region_blocks([(ref, 0, 64, 0, 1024)])
    mem.store(0, blocks, 0)  # dirty in L2; half gets evicted
    assert c.bytes["hbm"] == ref.nbytes // 2  # the evicted dirty half went to HBM
    mem.flush(0)
    assert c.bytes["hbm"] == ref.nbytes  # the rest at the flush
    # cyclic access larger than the cache: LRU misses every time
    c2 = Counters()
    mem2 = MemorySystem(spec, c2)
    blocks = mem2.region_blocks([(ref, 0, 64, 0, 1024)])  # laid out by this memory
    for _ in range(3):
        mem2.load(0, blocks, 0)
    assert c2.hits["l2"] == 0 and c2.misses["l2"] == 3 * len(blocks)


def test_view_regions_map_onto_storage():
    mem, c, _ = _mem()
    base = TensorRef("qkv", 128, 96, 2)
    view = TensorRef("qkv", 3 * 128, 32, 2, offset=0)  # same bytes, another shape
    whole = mem.region_blocks([(base, 0, 128, 0, 96)])
    via_view = mem.region_blocks([(view, 0, 3 * 128, 0, 32)])
    assert {k for k, _ in via_view} == {k for k, _ in whole}


# -- branch prediction ----------------------------------------------------------------
def _step_2bit(state, outcomes):
    miss = 0
    for taken in outcomes:
        pred = state >= 2
        miss += pred != taken
        state = min(3, state + 1) if taken else max(0, state - 1)
    return state, miss


def test_loop_run_closed_form_equals_stepwise():
    for state in range(4):
        for trips in range(1, 12):
            assert loop_run(state, trips) == _step_2bit(state, [True] * (trips - 1) + [False])


def test_predictor_repeated_runs_equal_stepwise():
    rng = random.Random(5)
    for _ in range(40):
        trips, times = rng.randint(1, 9), rng.randint(1, 30)
        bp = BranchPredictor()
        branches, miss = bp.run("passes", trips, times)
        s, m = 1, 0
        for _ in range(times):
            s, mm = _step_2bit(s, [True] * (trips - 1) + [False])
            m += mm
        assert (branches, miss, bp.state["passes"]) == (trips * times, m, s)


# -- thermal ----------------------------------------------------------------------------
def test_thermal_exact_solution_matches_euler_integration():
    cfg = ThermalConfig(resistance_c_per_w=0.3, capacitance_j_per_c=50, ambient_c=25)
    tm = ThermalModel(cfg)
    tm.advance(10.0, 200.0)
    t, dt = 25.0, 1e-3
    for _ in range(10000):
        t += dt * (200.0 - (t - 25.0) / 0.3) / 50
    assert tm.temperature_c == pytest.approx(t, rel=1e-3)
    assert tm.steady_state_c(200.0) == pytest.approx(25 + 200 * 0.3)


def test_throttling_above_limit():
    cfg = ThermalConfig(initial_c=100.0, throttle_c=95.0, throttle_factor=0.5)
    tm = ThermalModel(cfg)
    assert tm.throttling and tm.frequency_factor == 0.5
    tm.advance(1000.0, 0.0)
    assert not tm.throttling


def test_counter_enum_accepts_names():
    assert Counter("flops") is Counter.FLOPS
    assert Counter("CYCLES") is Counter.CYCLES
    with pytest.raises(ValueError):
        Counter("nonsense")
    c = Counters(cycles=5)
    d = c.copy()
    d.cycles += 3
    d.bytes["hbm"] += 10
    delta = d.delta(c)
    assert delta.cycles == 3 and delta.bytes["hbm"] == 10 and c.bytes["hbm"] == 0
    assert math.isclose(Counters(energy_pj=1e12).energy_j, 1.0)
