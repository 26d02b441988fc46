# amaranth: UnusedElaboratable=no
"""Amaranth-simulator unit tests of every RTL block, cycle by cycle at the smallest sizes.

Fast (no Icarus). The cocotb suite (``test_rtl_cocotb.py``) proves the emitted Verilog
at larger sizes. Convention of these tests: ``ctx.set`` the inputs of cycle ``c``, read
the outputs of cycle ``c`` (combinational ones reflect the inputs just set), then
``ctx.tick()`` (rising edge ``c + 1``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from amaranth.sim import Simulator
from wia_hw.emulator import frontend_model as fm
from wia_hw.emulator.counters import Counter
from wia_hw.emulator.cycles import (
    systolic_issue_interval,
    systolic_sequence_counters,
    systolic_tile_counters,
    systolic_tile_cycles,
)
from wia_hw.emulator.golden import ACC_BITS as GOLDEN_ACC_BITS
from wia_hw.emulator.golden import int8_matmul
from wia_hw.rtl import (
    ACC_BITS,
    REGISTER_MAP,
    FrontEnd,
    PerfCounters,
    PimBank,
    ProcessingElement,
    SystolicArray,
)

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")


def simulate(dut: Any, testbench: Any) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


def test_acc_bits_match_golden() -> None:
    assert ACC_BITS == GOLDEN_ACC_BITS == 32


def test_register_map_uses_emulator_counter_names() -> None:
    assert [Counter(n) for n in REGISTER_MAP] == [
        Counter.CYCLES,
        Counter.BUSY_CYCLES,
        Counter.MACS,
        Counter.STALL_CYCLES,
    ]
    assert set(systolic_tile_counters("os", 2, 2, 3)) == {Counter(n) for n in REGISTER_MAP}


# ---- processing element ----------------------------------------------------------------


def test_pe_os_accumulates_restarts_shifts_and_wraps() -> None:
    pe = ProcessingElement("os")
    top = 2**31

    async def tb(ctx: Any) -> None:
        # cycle 0: first MAC restarts the accumulator: 0 + 3 * -4
        ctx.set(pe.a_in, 3)
        ctx.set(pe.b_in, -4)
        ctx.set(pe.valid_in, 1)
        ctx.set(pe.first_in, 1)
        assert ctx.get(pe.mac) == 1
        await ctx.tick()
        assert ctx.get(pe.acc) == -12
        assert (ctx.get(pe.a_out), ctx.get(pe.b_out), ctx.get(pe.first_out)) == (3, -4, 1)
        # cycle 1: accumulate -128 * -128
        ctx.set(pe.a_in, -128)
        ctx.set(pe.b_in, -128)
        ctx.set(pe.first_in, 0)
        await ctx.tick()
        assert ctx.get(pe.acc) == -12 + 16384
        # cycle 2: not valid, shift loads the neighbour's accumulator (near 2**31)
        ctx.set(pe.valid_in, 0)
        ctx.set(pe.shift, 1)
        ctx.set(pe.acc_in, top - 100)
        assert ctx.get(pe.mac) == 0
        await ctx.tick()
        assert ctx.get(pe.acc) == top - 100
        assert ctx.get(pe.valid_out) == 0
        # cycle 3: 127 * 127 pushes it past 2**31: it wraps (does not saturate)
        ctx.set(pe.shift, 1)  # valid has priority over shift
        ctx.set(pe.valid_in, 1)
        ctx.set(pe.a_in, 127)
        ctx.set(pe.b_in, 127)
        await ctx.tick()
        assert ctx.get(pe.acc) == top - 100 + 127 * 127 - 2**32
        # cycle 4: idle holds
        ctx.set(pe.valid_in, 0)
        ctx.set(pe.shift, 0)
        await ctx.tick()
        assert ctx.get(pe.acc) == top - 100 + 127 * 127 - 2**32

    simulate(pe, tb)


def test_pe_ws_holds_weight_and_wraps_partial_sum() -> None:
    pe = ProcessingElement("ws")

    async def tb(ctx: Any) -> None:
        ctx.set(pe.w_in, -7)
        ctx.set(pe.load, 1)
        await ctx.tick()
        assert ctx.get(pe.w) == -7
        ctx.set(pe.load, 0)
        ctx.set(pe.w_in, 99)  # ignored without load
        ctx.set(pe.x_in, 5)
        ctx.set(pe.valid_in, 1)
        ctx.set(pe.psum_in, 1000)
        assert ctx.get(pe.mac) == 1
        await ctx.tick()
        assert (ctx.get(pe.psum_out), ctx.get(pe.x_out), ctx.get(pe.valid_out)) == (965, 5, 1)
        assert ctx.get(pe.w) == -7
        # the MAC uses the weight held before a load in the same cycle
        ctx.set(pe.load, 1)
        ctx.set(pe.w_in, 1)
        ctx.set(pe.x_in, -1)
        ctx.set(pe.psum_in, -(2**31))
        await ctx.tick()
        assert ctx.get(pe.psum_out) == -(2**31) + 7
        ctx.set(pe.load, 0)
        ctx.set(pe.x_in, 1)
        ctx.set(pe.psum_in, 2**31 - 1)
        await ctx.tick()
        assert ctx.get(pe.psum_out) == -(2**31)  # wraps
        ctx.set(pe.valid_in, 0)
        ctx.set(pe.psum_in, 0)
        await ctx.tick()
        assert ctx.get(pe.psum_out) == -(2**31)  # holds when not valid
        assert ctx.get(pe.valid_out) == 0

    simulate(pe, tb)


# ---- systolic array ----------------------------------------------------------------------


@dataclass
class TileRun:
    depth: int
    a_steps: list
    b_steps: list
    expected: np.ndarray
    accept: int | None = None
    done: int | None = None
    a_edges: list[int] = field(default_factory=list)
    b_edges: list[int] = field(default_factory=list)
    out_cycles: list[int] = field(default_factory=list)
    rows: list[list[int]] = field(default_factory=list)


def make_tile(rng: np.random.Generator, rows: int, cols: int, dataflow: str, depth: int) -> TileRun:
    if dataflow == "os":
        a = rng.integers(-128, 128, (rows, depth))
        b = rng.integers(-128, 128, (depth, cols))
        a[0, 0], b[0, 0] = -128, 127
        return TileRun(
            depth, [a[:, k] for k in range(depth)], [b[k] for k in range(depth)], int8_matmul(a, b)
        )
    x = rng.integers(-128, 128, (depth, rows))
    w = rng.integers(-128, 128, (rows, cols))
    x[0, 0], w[0, 0] = -128, -128
    return TileRun(
        depth,
        [x[m] for m in range(depth)],
        [w[rows - 1 - r] for r in range(rows)],
        int8_matmul(x, w),
    )


def run_array(
    rows: int,
    cols: int,
    dataflow: str,
    tiles: list[TileRun],
    *,
    stall_cycles: frozenset[int] = frozenset(),
    back_to_back: bool = False,
    depth_port: dict[int, int] | None = None,
) -> tuple[dict[Counter, int], int]:
    """Run ``tiles`` through an array; fill in each tile's timing; return the counters
    read at the end and the number of stall cycles that fell in a tile's window."""
    dut = SystolicArray(rows, cols, dataflow, max_depth=16)
    counters: dict[Counter, int] = {}

    async def tb(ctx: Any) -> None:
        pending, in_flight = list(tiles), []
        gap = 0
        for c in range(400):
            if not pending and not in_flight:
                break
            feeding = next(
                (
                    t
                    for t in in_flight + pending
                    if len(t.a_edges) < len(t.a_steps) or len(t.b_edges) < len(t.b_steps)
                ),
                None,
            )
            want = bool(pending) and (gap == 0 or back_to_back)
            stall = c in stall_cycles
            ctx.set(dut.start, want)
            if pending:
                d = pending[0].depth
                ctx.set(dut.depth, depth_port.get(d, d) if depth_port else d)
            ctx.set(dut.stall, stall)
            if feeding is not None:
                ai, bi = len(feeding.a_edges), len(feeding.b_edges)
                for i in range(rows):
                    ctx.set(dut.a[i], int(feeding.a_steps[ai][i]) if ai < feeding.depth else 0)
                for j in range(cols):
                    ctx.set(
                        dut.b[j], int(feeding.b_steps[bi][j]) if bi < len(feeding.b_steps) else 0
                    )
            accepted = want and ctx.get(dut.idle) and not stall
            if ctx.get(dut.a_ready):
                feeding.a_edges.append(c + 1)
            if ctx.get(dut.b_ready):
                feeding.b_edges.append(c + 1)
            if ctx.get(dut.out_valid):
                in_flight[0].out_cycles.append(c)
                in_flight[0].rows.append([ctx.get(dut.out[j]) for j in range(cols)])
            if ctx.get(dut.done):
                t = in_flight.pop(0)
                t.done = c
                gap = 2
            elif gap:
                gap -= 1
            if accepted:
                t = pending.pop(0)
                t.accept = c + 1
                in_flight.append(t)
            await ctx.tick()
        assert not pending and not in_flight, "tiles did not finish"
        ctx.set(dut.stall, 0)
        ctx.set(dut.start, 0)
        for addr, name in enumerate(REGISTER_MAP):
            ctx.set(dut.ctr_addr, addr)
            await ctx.tick()
            counters[Counter(name)] = ctx.get(dut.ctr_rdata)

    simulate(dut, tb)
    windows = set()
    for t in tiles:
        windows.update(range(t.accept, t.done))
    return counters, len(windows & stall_cycles)


SMALL_SHAPES = [(1, 1), (2, 2), (2, 3), (3, 2), (1, 4), (4, 1)]


@pytest.mark.parametrize("dataflow", ["os", "ws"])
@pytest.mark.parametrize(("rows", "cols"), SMALL_SHAPES)
def test_array_single_tile_schedule(rows: int, cols: int, dataflow: str) -> None:
    """Outputs bit-exact; the documented per-edge schedule of the ports holds exactly."""
    rng = np.random.default_rng(rows * 10 + cols)
    for depth in (1, 2, 5):
        tile = make_tile(rng, rows, cols, dataflow, depth)
        counters, _ = run_array(rows, cols, dataflow, [tile])
        n = systolic_tile_cycles(dataflow, rows, cols, depth)
        rel = lambda edges, t=tile: [e - t.accept for e in edges]  # noqa: E731
        assert tile.done - tile.accept == n
        assert np.array_equal(np.array(tile.rows), tile.expected)
        if dataflow == "os":
            assert rel(tile.a_edges) == rel(tile.b_edges) == list(range(depth))
            assert rel(tile.out_cycles) == [n - rows + 1 + r for r in range(rows)]
        else:
            assert rel(tile.b_edges) == list(range(rows))
            assert rel(tile.a_edges) == [rows + m for m in range(depth)]
            assert rel(tile.out_cycles) == [2 * rows + cols - 1 + m for m in range(depth)]
        assert counters == systolic_tile_counters(dataflow, rows, cols, depth)


@pytest.mark.parametrize("dataflow", ["os", "ws"])
def test_array_depth_zero_acts_as_one(dataflow: str) -> None:
    tile = make_tile(np.random.default_rng(3), 2, 2, dataflow, 1)
    run_array(2, 2, dataflow, [tile], depth_port={1: 0})
    assert tile.done - tile.accept == systolic_tile_cycles(dataflow, 2, 2, 1)
    assert np.array_equal(np.array(tile.rows), tile.expected)


@pytest.mark.parametrize("dataflow", ["os", "ws"])
def test_array_back_to_back_tiles(dataflow: str) -> None:
    """The next start is accepted in the last cycle of a tile: no gap, N cycles each."""
    rng = np.random.default_rng(7)
    tiles = [make_tile(rng, 2, 3, dataflow, d) for d in (3, 1, 4)]
    counters, _ = run_array(2, 3, dataflow, tiles, back_to_back=True)
    for t in tiles:
        assert t.done - t.accept == systolic_tile_cycles(dataflow, 2, 3, t.depth)
        assert np.array_equal(np.array(t.rows), t.expected)
    assert [b.accept - a.done for a, b in zip(tiles, tiles[1:], strict=False)] == [0, 0]
    total = {
        k: sum(systolic_tile_counters(dataflow, 2, 3, t.depth)[k] for t in tiles) for k in counters
    }
    assert counters == total


@pytest.mark.parametrize("dataflow", ["os", "ws"])
def test_array_stall_delays_by_exactly_the_stalled_cycles(dataflow: str) -> None:
    rng = np.random.default_rng(11)
    tile = make_tile(rng, 2, 2, dataflow, 4)
    n = systolic_tile_cycles(dataflow, 2, 2, 4)
    # stalls at the start edge, mid-tile, and on the done cycle (done is held back)
    stalls = frozenset({0, 3, 4, n + 2})
    counters, in_window = run_array(2, 2, dataflow, [tile], stall_cycles=stalls)
    assert tile.done - tile.accept == n + in_window
    assert np.array_equal(np.array(tile.rows), tile.expected)
    assert counters == systolic_tile_counters(dataflow, 2, 2, 4, stall_cycles=in_window)
    assert in_window == 3  # cycle 0 is before the tile (it blocks the start)


# ---- performance counters ----------------------------------------------------------------


def test_perf_counters_count_clear_and_read_latency() -> None:
    dut = PerfCounters(max_macs_per_cycle=4, width=8)

    async def tb(ctx: Any) -> None:
        events = [(1, 4, 0), (1, 0, 1), (0, 3, 1), (1, 2, 1)]  # (enable, macs, stall)
        for en, macs, stall in events:
            ctx.set(dut.enable, en)
            ctx.set(dut.macs, macs)
            ctx.set(dut.stall, stall)
            await ctx.tick()
        ctx.set(dut.enable, 0)
        got = []
        for addr in range(4):
            ctx.set(dut.addr, addr)
            await ctx.tick()
            got.append(ctx.get(dut.rdata))
        assert got == [3, 2, 6, 2]
        # wrap at 8 bits
        ctx.set(dut.enable, 1)
        ctx.set(dut.macs, 4)
        ctx.set(dut.addr, 2)
        for _ in range(63):
            await ctx.tick()
        ctx.set(dut.enable, 0)
        await ctx.tick()
        assert ctx.get(dut.rdata) == (6 + 4 * 63) % 256
        # clear wins over counting
        ctx.set(dut.enable, 1)
        ctx.set(dut.clear, 1)
        await ctx.tick()
        ctx.set(dut.clear, 0)
        ctx.set(dut.enable, 0)
        await ctx.tick()
        assert ctx.get(dut.rdata) == 0

    simulate(dut, tb)


# ---- front-end ---------------------------------------------------------------------------


def test_frontend_dac_clamps_with_latency_one() -> None:
    p = 4
    dut = FrontEnd(precision_bits=p, matrix_size_limit=2, in_bits=8, det_bits=8, acc_bits=8)
    samples = [((-128, 127), 0), ((5, -6), 1), ((20, -20), 3), ((-3, 3), 2)]
    expect = [list(fm.dac_quantize(np.array(x), p, sh, 8)) for x, sh in samples]
    assert expect[:3] == [[-7, 7], [3, -3], [3, -2]]  # clamp at +-7, round half up

    async def tb(ctx: Any) -> None:
        for k, (x, sh) in enumerate(samples + [((0, 0), 0)]):
            ctx.set(dut.dac_valid, k < len(samples))
            ctx.set(dut.dac_shift, sh)
            ctx.set(dut.dac_in[0], x[0])
            ctx.set(dut.dac_in[1], x[1])
            await ctx.tick()  # edge k samples input k; code k-1 is visible now
            if k >= fm.DAC_LATENCY_CYCLES:
                j = k - fm.DAC_LATENCY_CYCLES
                assert ctx.get(dut.dac_out_valid) == 1
                assert [ctx.get(dut.dac_out[i]) for i in range(2)] == expect[j]
        await ctx.tick()
        assert ctx.get(dut.dac_out_valid) == 0

    simulate(dut, tb)


def test_frontend_adc_saturates_and_accumulates_groups() -> None:
    p = 4
    dut = FrontEnd(precision_bits=p, matrix_size_limit=2, in_bits=8, det_bits=8, acc_bits=8)
    # (det_p, det_n, adc_shift, last): a group of 3 tiles (saturating high and low), then 1
    tiles = [
        ((255, 0), (0, 255), 0, 0),
        ((40, 3), (3, 40), 2, 0),
        ((9, 1), (1, 9), 1, 1),
        ((100, 0), (0, 0), 4, 1),
    ]
    codes = [fm.adc_quantize(fm.balanced_subtract(pp, nn, 8), p, sh) for pp, nn, sh, _ in tiles]
    assert list(codes[0]) == [7, -8]
    sums = [fm.accumulate_tiles(codes[:3], 8), fm.accumulate_tiles(codes[3:], 8)]

    async def tb(ctx: Any) -> None:
        seen_adc, seen_acc = [], []
        for c in range(12):
            if c < len(tiles):
                pp, nn, sh, last = tiles[c]
                ctx.set(dut.det_valid, 1)
                ctx.set(dut.det_last, last)
                ctx.set(dut.adc_shift, sh)
                for i in range(2):
                    ctx.set(dut.det_p[i], pp[i])
                    ctx.set(dut.det_n[i], nn[i])
            else:
                ctx.set(dut.det_valid, 0)
            await ctx.tick()  # edge c
            if ctx.get(dut.adc_valid):
                seen_adc.append((c, [ctx.get(dut.adc_out[i]) for i in range(2)]))
            if ctx.get(dut.acc_valid):
                seen_acc.append((c, [ctx.get(dut.acc_out[i]) for i in range(2)]))
        # tile t is sampled at edge t; its code is visible after edge t + 2
        assert seen_adc == [(t + 2, list(codes[t])) for t in range(4)]
        # a group whose first tile is sampled at edge e ends after e + frontend_cycles(T)
        assert seen_acc == [
            (0 + fm.frontend_cycles(3), list(sums[0])),
            (3 + fm.frontend_cycles(1), list(sums[1])),
        ]

    simulate(dut, tb)


# ---- constructor errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "kwargs", "exc", "match"),
    [
        (ProcessingElement, {"dataflow": 3}, TypeError, r"dataflow must be a string, got 3"),
        (
            ProcessingElement,
            {"dataflow": "xs"},
            ValueError,
            r"dataflow must be one of 'os', 'ws', got 'xs'",
        ),
        (SystolicArray, {"rows": 0}, ValueError, r"rows must be between 1 and 256, got 0"),
        (SystolicArray, {"cols": 257}, ValueError, r"cols must be between 1 and 256, got 257"),
        (SystolicArray, {"pipelined": 1}, TypeError, r"pipelined must be a bool, got 1"),
        (
            SystolicArray,
            {"precision": "fp8"},
            ValueError,
            r"precision must be one of 'int8', 'int8x2', 'fp16', 'bf16', 'fp32', got 'fp8'",
        ),
        (ProcessingElement, {"precision": 8}, TypeError, r"precision must be a string, got 8"),
        (
            ProcessingElement,
            {"pipelined": "yes"},
            TypeError,
            r"pipelined must be a bool, got 'yes'",
        ),
        (SystolicArray, {"rows": "4"}, TypeError, r"rows must be an integer, got '4'"),
        (SystolicArray, {"rows": True}, TypeError, r"rows must be an integer, got True"),
        (SystolicArray, {"dataflow": "is"}, ValueError, r"dataflow must be one of .*got 'is'"),
        (SystolicArray, {"max_depth": 0}, ValueError, r"max_depth must be between 1 and 65536"),
        (
            SystolicArray,
            {"counter_width": 7},
            ValueError,
            r"counter_width must be between 8 and 64, got 7",
        ),
        (
            PerfCounters,
            {"max_macs_per_cycle": 0},
            ValueError,
            r"max_macs_per_cycle must be between 1 and 1048576, got 0",
        ),
        (PerfCounters, {"width": 65}, ValueError, r"width must be between 8 and 64, got 65"),
        (PerfCounters, {"width": 8.5}, TypeError, r"width must be an integer, got 8.5"),
        (PimBank, {"rows": 0}, ValueError, r"rows must be between 1 and 4096, got 0"),
        (PimBank, {"cols": 65}, ValueError, r"cols must be between 1 and 64, got 65"),
        (PimBank, {"t_rcd": 0}, ValueError, r"t_rcd must be between 1 and 255, got 0"),
        (PimBank, {"t_wr": 256}, ValueError, r"t_wr must be between 1 and 255, got 256"),
        (PimBank, {"t_cl": None}, TypeError, r"t_cl must be an integer, got None"),
        (
            FrontEnd,
            {"precision_bits": 1},
            ValueError,
            r"precision_bits must be between 2 and 16, got 1",
        ),
        (
            FrontEnd,
            {"precision_bits": 8, "in_bits": 6},
            ValueError,
            r"precision_bits \(8\) must not exceed in_bits \(6\)",
        ),
        (
            FrontEnd,
            {"matrix_size_limit": 0},
            ValueError,
            r"matrix_size_limit must be between 1 and 256, got 0",
        ),
        (FrontEnd, {"det_bits": "16"}, TypeError, r"det_bits must be an integer, got '16'"),
        (FrontEnd, {"acc_bits": 7}, ValueError, r"acc_bits must be between 8 and 64, got 7"),
    ],
)
def test_constructor_errors(factory: Any, kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        factory(**kwargs)


# ---- pipelined arrays and PE precision modes (issue #8) ----------------------------------

sys.path.insert(0, str(Path(__file__).resolve().parent / "rtl"))
from tiles import Tile  # noqa: E402
from tiles import make_tile as make_any_tile  # noqa: E402


def run_sequence(
    dut: SystolicArray,
    tiles: list[Tile],
    *,
    stall_cycles: frozenset[int] = frozenset(),
    gap: int = 0,
    limit: int = 3000,
) -> tuple[dict, set[int]]:
    """Drive ``tiles`` with ``start`` held high (``gap`` idle cycles after each accept),
    the a / b ports from the oldest tile that still has steps to give; record accept,
    done and output rows. Returns the counters read at the end and the stall cycles
    that fell while a tile was in flight."""
    R, C, L = dut.rows, dut.cols, dut.lanes
    nb = C * L if dut.dataflow == "os" else C
    counters: dict[Counter, int] = {}
    windows: set[int] = set()

    async def tb(ctx: Any) -> None:
        pending, in_flight = list(tiles), []
        wait = 0
        for c in range(limit):
            if not pending and not in_flight:
                break
            stall = c in stall_cycles
            want = bool(pending) and wait == 0
            ctx.set(dut.start, want)
            ctx.set(dut.stall, stall)
            if pending:
                ctx.set(dut.depth, pending[0].depth)
            a_t = next((t for t in in_flight + pending if t.a_idx < len(t.a_steps)), None)
            b_t = next((t for t in in_flight + pending if t.b_idx < len(t.b_steps)), None)
            for idx in range(R * L):
                ctx.set(dut.a[idx], a_t.a_steps[a_t.a_idx][idx] if a_t else 0)
            for idx in range(nb):
                ctx.set(dut.b[idx], b_t.b_steps[b_t.b_idx][idx] if b_t else 0)
            if ctx.get(dut.a_ready):
                a_t.a_idx += 1
            if ctx.get(dut.b_ready):
                b_t.b_idx += 1
            if ctx.get(dut.out_valid):
                in_flight[0].rows.append([ctx.get(dut.out[j]) for j in range(len(dut.out))])
            if ctx.get(dut.done):
                in_flight.pop(0).done = c
            if want and ctx.get(dut.idle) and not stall:
                t = pending.pop(0)
                t.accept = c + 1
                in_flight.append(t)
                wait = gap
            elif wait:
                wait -= 1
            await ctx.tick()
        assert not pending and not in_flight, "tiles did not finish"
        ctx.set(dut.stall, 0)
        ctx.set(dut.start, 0)
        for addr, name in enumerate(REGISTER_MAP):
            ctx.set(dut.ctr_addr, addr)
            await ctx.tick()
            counters[Counter(name)] = ctx.get(dut.ctr_rdata)

    simulate(dut, tb)
    for t in tiles:
        windows.update(range(t.accept, t.done))
    return counters, windows & set(stall_cycles)


def check_sequence(
    dut: SystolicArray,
    tiles: list[Tile],
    counters: dict,
    stalls: set[int],
    back_to_back: bool = True,
) -> None:
    """Bit-exact outputs; every done ``systolic_tile_cycles`` (+ stalls) after its accept;
    accepts ``systolic_issue_interval`` (+ stalls) apart; counters as the emulator's."""
    df, R, C = dut.dataflow, dut.rows, dut.cols
    for t in tiles:
        assert t.rows == t.expected, f"depth {t.depth}: wrong outputs"
        assert t.consumed
        in_win = sum(1 for c in stalls if t.accept <= c < t.done)
        assert t.done - t.accept == systolic_tile_cycles(df, R, C, t.steps) + in_win
    if back_to_back:
        for t, u in zip(tiles, tiles[1:], strict=False):
            between = sum(1 for c in stalls if t.accept <= c < u.accept)
            assert u.accept - t.accept == between + systolic_issue_interval(
                df, R, C, t.steps, u.steps, pipelined=dut.pipelined
            )
        assert counters == systolic_sequence_counters(
            df,
            R,
            C,
            [t.steps for t in tiles],
            pipelined=dut.pipelined,
            stall_cycles=len(stalls),
            elements=[t.depth for t in tiles],
        )


CONFIGS = [
    (r, c, df)
    for r, c in ((1, 1), (2, 3), (3, 2), (4, 4), (1, 4), (4, 1), (2, 11))
    for df in ("os", "ws")
]


@pytest.mark.parametrize(("rows", "cols", "dataflow"), CONFIGS)
@pytest.mark.parametrize("pipelined", [False, True])
def test_array_sequences_int8(rows: int, cols: int, dataflow: str, pipelined: bool) -> None:
    """Random back-to-back sequences (depths 1..9, so shorter and longer than rows), with
    and without stalls: bit-exact, cycle-exact against the issue rule, counters."""
    rng = np.random.default_rng(rows * 100 + cols * 10 + pipelined + 2 * (dataflow == "ws"))
    for stall_p in (0.0, 0.2):
        dut = SystolicArray(rows, cols, dataflow, max_depth=16, pipelined=pipelined)
        tiles = [
            make_any_tile(rng, rows, cols, dataflow, "int8", int(rng.integers(1, 10)))
            for _ in range(int(rng.integers(2, 6)))
        ]
        stalls = frozenset(int(c) for c in np.flatnonzero(rng.random(400) < stall_p))
        counters, in_win = run_sequence(dut, tiles, stall_cycles=stalls)
        check_sequence(dut, tiles, counters, in_win)


def test_pipelined_steady_state_interval() -> None:
    """Equal depths: the pipelined array accepts a tile every max(depth, rows) cycles,
    the unpipelined one every depth + 2*rows + cols - 2."""
    for df in ("os", "ws"):
        for depth in (1, 3, 6):
            for pipelined, interval in ((True, max(depth, 3)), (False, depth + 2 * 3 + 2 - 2)):
                rng = np.random.default_rng(depth)
                dut = SystolicArray(3, 2, df, max_depth=8, pipelined=pipelined)
                tiles = [make_any_tile(rng, 3, 2, df, "int8", depth) for _ in range(4)]
                counters, _ = run_sequence(dut, tiles)
                check_sequence(dut, tiles, counters, set())
                assert [u.accept - t.accept for t, u in zip(tiles, tiles[1:], strict=False)] == [
                    interval
                ] * 3


@pytest.mark.parametrize("dataflow", ["os", "ws"])
@pytest.mark.parametrize("pipelined", [False, True])
def test_array_int8x2_two_macs_per_cycle(dataflow: str, pipelined: bool) -> None:
    """int8x2: two K (os) / M (ws) elements per step, odd depths mask the second lane;
    steps = ceil(depth / 2) drive the cycle functions; MACS counts real MACs."""
    rng = np.random.default_rng(5 + pipelined)
    dut = SystolicArray(3, 2, dataflow, max_depth=16, pipelined=pipelined, precision="int8x2")
    tiles = [make_any_tile(rng, 3, 2, dataflow, "int8x2", d) for d in (1, 2, 7, 4, 9)]
    stalls = frozenset({5, 6, 17, 30})
    counters, in_win = run_sequence(dut, tiles, stall_cycles=stalls)
    check_sequence(dut, tiles, counters, in_win)
    assert counters[Counter.MACS] == 3 * 2 * sum(t.depth for t in tiles)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("dataflow", ["os", "ws"])
def test_array_fp_modes_bit_exact(precision: str, dataflow: str) -> None:
    """fp16 / bf16 with binary32 accumulation, specials included: bit-exact against
    ``golden.fp_mac_matmul`` (os: k in order; ws: rows top to bottom from +0)."""
    rng = np.random.default_rng(len(precision) + (dataflow == "ws"))
    dut = SystolicArray(2, 2, dataflow, max_depth=8, pipelined=True, precision=precision)
    tiles = [make_any_tile(rng, 2, 2, dataflow, precision, d) for d in (1, 5, 3)]
    counters, in_win = run_sequence(dut, tiles, stall_cycles=frozenset({4, 9}))
    check_sequence(dut, tiles, counters, in_win)
