"""cocotb testbench of ``SystolicArray``: driver / monitor / golden model / checker.

Golden models: ``emulator.golden.int8_matmul`` and ``fp_mac_matmul`` (through
``tiles.make_tile``; fp16, bf16 and fp32, whose elements stream for four steps each). Cycle model: ``emulator.cycles.systolic_tile_cycles``,
``systolic_issue_interval``, ``systolic_tile_counters`` and ``systolic_sequence_counters``
(imported, never re-derived). Any precision, pipelined or not. Checks, on random tiles
(int8 with -128 and 127 forced in; fp16/bf16 random bit patterns with specials) for a
sample of depths that always includes 1 and 64: every output row bit-exact; cycles from
the edge that accepts ``start`` to the cycle where ``done`` is seen equal to the cycle
function plus the stall cycles in that window; in back-to-back sequences of 2-6 tiles of
random depth, each accept ``systolic_issue_interval`` (+ stalls) after the previous;
the performance counters equal the emulator's counters.
"""

from __future__ import annotations

from typing import Any

import cocotb
import numpy as np
from tb_common import Cycler, params, ports, quick, seed, start_clock_and_reset
from tiles import LANES, Tile, make_tile
from wia_hw.emulator.counters import Counter
from wia_hw.emulator.cycles import (
    systolic_issue_interval,
    systolic_sequence_counters,
    systolic_tile_counters,
    systolic_tile_cycles,
)
from wia_hw.rtl.perf_counters import REGISTER_MAP

P = params()
ROWS, COLS, DATAFLOW = P["rows"], P["cols"], P["dataflow"]
MAX_DEPTH = P.get("max_depth", 64)
PIPELINED = bool(P.get("pipelined", False))
PRECISION = P.get("precision", "int8")
L = LANES[PRECISION]
N_B = COLS * L if DATAFLOW == "os" else COLS
N_OUT = COLS if DATAFLOW == "os" else COLS * L
SIGNED = PRECISION.startswith("int8")


def tile(rng: np.random.Generator, depth: int) -> Tile:
    return make_tile(rng, ROWS, COLS, DATAFLOW, PRECISION, depth)


def extreme_tile(rng: np.random.Generator, depth: int, va: int, vb: int) -> Tile:
    """Every operand -128 or 127 (largest |sums|): the random tile with its operands
    replaced and the expected result recomputed by the same golden model."""
    t = tile(rng, depth)
    t.a_steps = [[va] * len(s) for s in t.a_steps]
    t.b_steps = [[vb] * len(s) for s in t.b_steps]

    def wrap(v: int) -> int:
        return (v + 2**31) % 2**32 - 2**31

    if DATAFLOW == "os":
        t.expected = [[wrap(va * vb * depth)] * COLS for _ in range(ROWS)]
    else:
        per = wrap(va * vb * ROWS)
        t.expected = [
            [per if s * L + lane < depth else 0 for _ in range(COLS) for lane in range(L)]
            for s in range(t.steps)
        ]
    return t


# ---- driver and monitor ----------------------------------------------------------------


class Driver:
    """Drives ``start``/``depth``/``stall`` and the operand steps: ``a`` from the oldest
    tile with ``a`` steps left, ``b`` likewise (in pipelined ws the next tile's weights
    load while this one's activations stream); junk when no tile is feeding."""

    def __init__(self, dut: Any, rng: np.random.Generator) -> None:
        self.dut, self.rng = dut, rng
        self.a, self.b = ports(dut, "a", ROWS * L), ports(dut, "b", N_B)

    def junk(self, n: int) -> list[int]:
        if SIGNED:
            return [int(v) for v in self.rng.integers(-128, 128, n)]
        width = 32 if PRECISION == "fp32" else 16
        return [int(v) for v in self.rng.integers(0, 1 << width, n)]

    def drive(
        self, start: bool, depth: int, stall: bool, a_tile: Tile | None, b_tile: Tile | None
    ) -> None:
        self.dut.start.value = int(start)
        self.dut.depth.value = depth
        self.dut.stall.value = int(stall)
        a = a_tile.a_steps[a_tile.a_idx] if a_tile else self.junk(len(self.a))
        b = b_tile.b_steps[b_tile.b_idx] if b_tile else self.junk(len(self.b))
        for h, v in zip(self.a, a, strict=True):
            h.value = v
        for h, v in zip(self.b, b, strict=True):
            h.value = v


class Monitor:
    """Samples the handshake and result ports (after ``ReadOnly``)."""

    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.out = ports(dut, "out", N_OUT)

    def sample(self) -> dict[str, Any]:
        d = self.dut
        s = {
            name: int(getattr(d, name).value)
            for name in ("idle", "a_ready", "b_ready", "out_valid", "done")
        }
        if s["out_valid"]:
            s["row"] = [h.value.to_signed() if SIGNED else h.value.to_unsigned() for h in self.out]
        return s


# ---- checker ---------------------------------------------------------------------------


class Checker:
    """Compares each finished tile with the golden model and the cycle functions."""

    def __init__(self) -> None:
        self.tiles_checked = 0

    def tile_done(self, t: Tile, stall_cycles: set[int]) -> None:
        assert len(t.rows) == len(t.expected), (
            f"depth {t.depth}: {len(t.rows)} rows out, expected {len(t.expected)}"
        )
        for r, (got, exp) in enumerate(zip(t.rows, t.expected, strict=True)):
            assert got == exp, f"depth {t.depth}: row {r}: {got} != {exp}"
        assert t.consumed, f"depth {t.depth}: not every operand step was consumed"
        stalls = sum(1 for c in stall_cycles if t.accept <= c < t.done)
        measured = t.done - t.accept
        expected = systolic_tile_cycles(DATAFLOW, ROWS, COLS, t.steps) + stalls
        assert measured == expected, (
            f"depth {t.depth}: start->done took {measured} "
            f"cycles, cycle function + {stalls} stalls = {expected}"
        )
        self.tiles_checked += 1

    @staticmethod
    def issue(tiles: list[Tile], stall_cycles: set[int]) -> None:
        for t, u in zip(tiles, tiles[1:], strict=False):
            between = sum(1 for c in stall_cycles if t.accept <= c < u.accept)
            want = (
                systolic_issue_interval(DATAFLOW, ROWS, COLS, t.steps, u.steps, pipelined=PIPELINED)
                + between
            )
            assert u.accept - t.accept == want, (
                f"depths {t.depth}->{u.depth}: accepted {u.accept - t.accept} cycles apart, "
                f"issue interval + {between} stalls = {want}"
            )


# ---- the per-cycle loop ----------------------------------------------------------------


class Bench:
    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.rng = np.random.default_rng(seed())
        self.cyc = Cycler(dut)
        self.drv = Driver(dut, self.rng)
        self.mon = Monitor(dut)
        self.chk = Checker()

    async def idle_cycles(self, n: int, stall_prob: float = 0.0) -> None:
        for _ in range(n):
            await self.cyc.drive_phase()
            self.drv.drive(False, 1, self.rng.random() < stall_prob, None, None)
            await self.cyc.sample_phase()
            s = self.mon.sample()
            assert not (s["out_valid"] or s["done"] or s["a_ready"] or s["b_ready"]), s

    async def run_batch(self, tiles: list[Tile], *, stall_prob: float) -> None:
        """Run ``tiles`` back to back (``start`` held high from a random first cycle);
        check outputs, cycles, the issue rule, then the counters of the whole batch."""
        pending = list(tiles)
        in_flight: list[Tile] = []
        stall_cycles: set[int] = set()
        start_at = self.cyc.cycle + 1 + int(self.rng.integers(0, 3))
        guard = (
            self.cyc.cycle
            + 100
            + 3 * sum(systolic_tile_cycles(DATAFLOW, ROWS, COLS, t.steps) for t in tiles)
        )
        while pending or in_flight:
            await self.cyc.drive_phase()
            c = self.cyc.cycle
            assert c < guard, "batch did not finish (hang)"
            want = bool(pending) and c >= start_at
            stall = bool(self.rng.random() < stall_prob)
            feeding = in_flight + pending
            a_tile = next((t for t in feeding if t.a_idx < len(t.a_steps)), None)
            b_tile = next((t for t in feeding if t.b_idx < len(t.b_steps)), None)
            self.drv.drive(want, pending[0].depth if pending else 1, stall, a_tile, b_tile)
            await self.cyc.sample_phase()
            s = self.mon.sample()
            if stall:
                stall_cycles.add(c)
            if DATAFLOW == "os":
                assert s["a_ready"] == s["b_ready"], f"cycle {c}: a_ready != b_ready"
            if s["a_ready"]:
                assert a_tile is not None, f"cycle {c}: a_ready with no tile feeding"
                a_tile.a_idx += 1
            if s["b_ready"]:
                assert b_tile is not None, f"cycle {c}: b_ready with no tile feeding"
                b_tile.b_idx += 1
            if s["out_valid"]:
                assert in_flight, f"cycle {c}: out_valid with no tile in flight"
                in_flight[0].rows.append(s["row"])
            if s["done"]:
                assert in_flight, f"cycle {c}: done with no tile in flight"
                t = in_flight.pop(0)
                t.done = c
                self.chk.tile_done(t, stall_cycles)
            if want and s["idle"] and not stall:
                t = pending.pop(0)
                t.accept = c + 1  # accepted at the next rising edge: its cycle 0
                in_flight.append(t)
        self.chk.issue(tiles, stall_cycles)
        await self.check_counters(tiles, stall_cycles)

    async def read_counter(self, addr: int) -> int:
        await self.cyc.drive_phase()
        self.drv.drive(False, 1, False, None, None)
        self.dut.ctr_addr.value = addr
        await self.cyc.drive_phase()
        self.drv.drive(False, 1, False, None, None)
        await self.cyc.sample_phase()
        return int(self.dut.ctr_rdata.value)

    async def check_counters(self, tiles: list[Tile], stall_cycles: set[int]) -> None:
        windows: set[int] = set()
        for t in tiles:
            windows.update(range(t.accept, t.done))
        stalls = len(stall_cycles & windows)
        if len(tiles) == 1:
            expected = systolic_tile_counters(
                DATAFLOW, ROWS, COLS, tiles[0].steps, stall_cycles=stalls, elements=tiles[0].depth
            )
        else:
            expected = systolic_sequence_counters(
                DATAFLOW,
                ROWS,
                COLS,
                [t.steps for t in tiles],
                pipelined=PIPELINED,
                stall_cycles=stalls,
                elements=[t.depth for t in tiles],
            )
            assert expected[Counter.CYCLES] == len(windows)
        got = {
            Counter(name): await self.read_counter(addr) for addr, name in enumerate(REGISTER_MAP)
        }
        assert got == expected, f"counters {got} != emulator {expected}"
        await self.idle_cycles(int(self.rng.integers(0, 3)), stall_prob=0.5)
        again = {Counter(n): await self.read_counter(a) for a, n in enumerate(REGISTER_MAP)}
        assert again == got, "counters moved while the array was idle"
        await self.cyc.drive_phase()
        self.drv.drive(False, 1, False, None, None)
        self.dut.ctr_clear.value = 1
        await self.cyc.drive_phase()
        self.drv.drive(False, 1, False, None, None)
        self.dut.ctr_clear.value = 0
        assert await self.read_counter(0) == 0, "ctr_clear did not clear"


def depths(rng: np.random.Generator) -> list[int]:
    """1 and the largest depth, plus a random sample in between (6, or none when quick)."""
    top = min(64, MAX_DEPTH)
    size = min(0 if quick() else 6, max(top - 2, 0))
    inner = list(rng.choice(np.arange(2, top), size=size, replace=False))
    return [1, top] + [int(d) for d in inner]


async def setup(dut: Any) -> Bench:
    inputs = {"start": 0, "depth": 1, "stall": 0, "ctr_addr": 0, "ctr_clear": 0}
    inputs.update({f"a__{i}": 0 for i in range(ROWS * L)})
    inputs.update({f"b__{j}": 0 for j in range(N_B)})
    await start_clock_and_reset(dut, inputs)
    return Bench(dut)


@cocotb.test()
async def isolated_tiles(dut: Any) -> None:
    """Each depth alone, half of them with random stalls; counters per tile."""
    bench = await setup(dut)
    sample = depths(bench.rng)
    for n, d in enumerate(sample):
        await bench.run_batch([tile(bench.rng, d)], stall_prob=0.25 * (n % 2))
    assert bench.chk.tiles_checked == len(sample)


@cocotb.test(skip=not SIGNED)
async def extreme_values(dut: Any) -> None:
    """-128 x -128 and -128 x 127 everywhere at the largest depth (largest |sums|)."""
    bench = await setup(dut)
    top = min(64, MAX_DEPTH)
    pairs = ((-128, -128), (-128, 127), (127, 127))
    for va, vb in pairs[:1] if quick() else pairs:
        await bench.run_batch([extreme_tile(bench.rng, top, va, vb)], stall_prob=0.0)


@cocotb.test()
async def back_to_back(dut: Any) -> None:
    """Sequences of 2-6 tiles of random depth (shorter and longer than ``rows``) with
    ``start`` held high: each accepted ``systolic_issue_interval`` after the previous,
    each done ``systolic_tile_cycles`` after its start; then with random stalls."""
    bench = await setup(dut)
    top = min(64, MAX_DEPTH)
    if quick():  # large builds: one short sequence (Icarus time grows with rows * cols)
        top = min(top, 24)
    for stall_prob in (0.3,) if quick() else (0.0, 0.3, 0.0, 0.15):
        n = int(bench.rng.integers(2, 4 if quick() else 7))
        short = int(bench.rng.integers(1, max(2, min(top, 2 * ROWS * L)) + 1))
        tiles = [
            tile(
                bench.rng,
                int(bench.rng.integers(1, top + 1)) if bench.rng.random() < 0.5 else short,
            )
            for _ in range(n)
        ]
        await bench.run_batch(tiles, stall_prob=stall_prob)
