"""cocotb testbench of ``SystolicArray``: driver / monitor / golden model / checker.

Golden model: ``emulator.golden.int8_matmul``. Cycle model: ``emulator.cycles.
systolic_tile_cycles`` and ``systolic_tile_counters`` (imported, never re-derived).
Checks, on random int8 tiles (with -128 and 127 forced in) for a sample of depths that
always includes 1 and 64: every output row bit-exact; cycles from the edge that accepts
``start`` to the cycle where ``done`` is seen equal to the cycle function plus the stall
cycles injected in that window; the performance counters equal the emulator's counters,
for isolated tiles, back-to-back tiles and tiles with random ``stall``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cocotb
import numpy as np
from tb_common import Cycler, params, ports, quick, seed, start_clock_and_reset
from wia_hw.emulator.counters import Counter
from wia_hw.emulator.cycles import systolic_tile_counters, systolic_tile_cycles
from wia_hw.emulator.golden import int8_matmul
from wia_hw.rtl.perf_counters import REGISTER_MAP

P = params()
ROWS, COLS, DATAFLOW = P["rows"], P["cols"], P["dataflow"]
MAX_DEPTH = P.get("max_depth", 64)


# ---- golden model ----------------------------------------------------------------------


@dataclass
class Tile:
    """One transaction: operand steps in the order the ports consume them, and the
    expected output rows (golden model)."""

    depth: int
    a_steps: list[list[int]]
    b_steps: list[list[int]]
    expected: np.ndarray
    a_idx: int = 0
    b_idx: int = 0
    accept_cycle: int | None = None
    done_cycle: int | None = None
    rows_seen: list[list[int]] = field(default_factory=list)

    @property
    def consumed(self) -> bool:
        return self.a_idx == len(self.a_steps) and self.b_idx == len(self.b_steps)


def int8(rng: np.random.Generator, shape: tuple[int, ...], mode: str = "random") -> np.ndarray:
    if mode == "min":
        return np.full(shape, -128)
    if mode == "max":
        return np.full(shape, 127)
    v = rng.integers(-128, 128, shape)
    mask = rng.random(shape)
    v[mask < 0.05] = -128
    v[mask > 0.95] = 127
    return v


def make_tile(rng: np.random.Generator, depth: int, modes: tuple[str, str] = ("random",) * 2
              ) -> Tile:
    """A random tile of ``depth``: OS ``A (rows x D) @ B (D x cols)``, WS
    ``X (D x rows) @ W (rows x cols)`` with the weight rows fed last row first."""
    if DATAFLOW == "os":
        a, b = int8(rng, (ROWS, depth), modes[0]), int8(rng, (depth, COLS), modes[1])
        return Tile(depth, [list(a[:, k]) for k in range(depth)],
                    [list(b[k, :]) for k in range(depth)], int8_matmul(a, b))
    x, w = int8(rng, (depth, ROWS), modes[0]), int8(rng, (ROWS, COLS), modes[1])
    return Tile(depth, [list(x[m, :]) for m in range(depth)],
                [list(w[ROWS - 1 - r, :]) for r in range(ROWS)], int8_matmul(x, w))


# ---- driver and monitor ----------------------------------------------------------------


class Driver:
    """Drives ``start``/``depth``/``stall`` and the operand steps of the oldest tile that
    still has unconsumed steps; advances on ``a_ready``/``b_ready`` (junk otherwise)."""

    def __init__(self, dut: Any, rng: np.random.Generator) -> None:
        self.dut, self.rng = dut, rng
        self.a, self.b = ports(dut, "a", ROWS), ports(dut, "b", COLS)

    def drive(self, start: bool, depth: int, stall: bool, data_tile: Tile | None) -> None:
        self.dut.start.value = int(start)
        self.dut.depth.value = depth
        self.dut.stall.value = int(stall)
        a_step = b_step = None
        if data_tile is not None:
            if data_tile.a_idx < len(data_tile.a_steps):
                a_step = data_tile.a_steps[data_tile.a_idx]
            if data_tile.b_idx < len(data_tile.b_steps):
                b_step = data_tile.b_steps[data_tile.b_idx]
        for h, v in zip(self.a, a_step or self.rng.integers(-128, 128, ROWS), strict=True):
            h.value = int(v)
        for h, v in zip(self.b, b_step or self.rng.integers(-128, 128, COLS), strict=True):
            h.value = int(v)


class Monitor:
    """Samples the handshake and result ports (after ``ReadOnly``)."""

    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.out = ports(dut, "out", COLS)

    def sample(self) -> dict[str, Any]:
        d = self.dut
        s = {name: int(getattr(d, name).value) for name in
             ("idle", "a_ready", "b_ready", "out_valid", "done")}
        s["row"] = [h.value.to_signed() for h in self.out] if s["out_valid"] else None
        return s


# ---- checker ---------------------------------------------------------------------------


class Checker:
    """Compares each finished tile with the golden model and the cycle function."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.tiles_checked = 0

    def tile_done(self, tile: Tile, stall_cycles: set[int]) -> int:
        got = np.array(tile.rows_seen, dtype=np.int64)
        assert got.shape == tile.expected.shape, \
            f"depth {tile.depth}: {got.shape[0]} rows out, expected {tile.expected.shape[0]}"
        bad = np.argwhere(got != tile.expected)
        assert bad.size == 0, (f"depth {tile.depth}: {len(bad)} wrong outputs, first at "
                               f"{tuple(bad[0])}: {got[tuple(bad[0])]} != "
                               f"{tile.expected[tuple(bad[0])]}")
        assert tile.consumed, f"depth {tile.depth}: not every operand step was consumed"
        stalls = sum(1 for c in stall_cycles if tile.accept_cycle <= c < tile.done_cycle)
        measured = tile.done_cycle - tile.accept_cycle
        expected = systolic_tile_cycles(DATAFLOW, ROWS, COLS, tile.depth) + stalls
        assert measured == expected, (f"depth {tile.depth}: start->done took {measured} "
                                      f"cycles, cycle function + {stalls} stalls = {expected}")
        self.tiles_checked += 1
        return stalls


# ---- the per-cycle loop ----------------------------------------------------------------


class Bench:
    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.rng = np.random.default_rng(seed())
        self.cyc = Cycler(dut)
        self.drv = Driver(dut, self.rng)
        self.mon = Monitor(dut)
        self.chk = Checker(dut._log)

    async def idle_cycles(self, n: int, stall_prob: float = 0.0) -> None:
        for _ in range(n):
            await self.cyc.drive_phase()
            self.drv.drive(False, 1, self.rng.random() < stall_prob, None)
            await self.cyc.sample_phase()
            s = self.mon.sample()
            assert not (s["out_valid"] or s["done"] or s["a_ready"] or s["b_ready"]), s

    async def run_batch(self, tiles: list[Tile], *, back_to_back: bool, stall_prob: float,
                        max_gap: int = 2) -> None:
        """Run ``tiles``; check outputs, cycles, then the counters of the whole batch."""
        pending = list(tiles)
        in_flight: list[Tile] = []
        stall_cycles: set[int] = set()
        start_at = self.cyc.cycle + 1 + int(self.rng.integers(0, max_gap + 1))
        guard = self.cyc.cycle + 100 + 3 * sum(
            systolic_tile_cycles(DATAFLOW, ROWS, COLS, t.depth) for t in tiles)
        while pending or in_flight:
            await self.cyc.drive_phase()
            c = self.cyc.cycle
            assert c < guard, "batch did not finish (hang)"
            want = bool(pending) and (c >= start_at or (back_to_back and bool(in_flight)))
            stall = bool(self.rng.random() < stall_prob)
            data_tile = next((t for t in in_flight + pending if not t.consumed), None)
            self.drv.drive(want, pending[0].depth if pending else 1, stall, data_tile)
            await self.cyc.sample_phase()
            s = self.mon.sample()
            if stall:
                stall_cycles.add(c)
            if DATAFLOW == "os":
                assert s["a_ready"] == s["b_ready"], f"cycle {c}: a_ready != b_ready"
            if s["a_ready"] or s["b_ready"]:
                assert data_tile is not None, f"cycle {c}: ready with no tile feeding"
                if s["a_ready"]:
                    assert data_tile.a_idx < len(data_tile.a_steps), "extra a step taken"
                    data_tile.a_idx += 1
                if s["b_ready"]:
                    assert data_tile.b_idx < len(data_tile.b_steps), "extra b step taken"
                    data_tile.b_idx += 1
            if s["out_valid"]:
                assert in_flight, f"cycle {c}: out_valid with no tile in flight"
                in_flight[0].rows_seen.append(s["row"])
            if s["done"]:
                assert in_flight, f"cycle {c}: done with no tile in flight"
                tile = in_flight.pop(0)
                tile.done_cycle = c
                self.chk.tile_done(tile, stall_cycles)
                start_at = c + int(self.rng.integers(0, max_gap + 1))
            if want and s["idle"] and not stall:
                tile = pending.pop(0)
                tile.accept_cycle = c + 1  # accepted at the next rising edge: its cycle 0
                in_flight.append(tile)
        await self.check_counters(tiles, stall_cycles)

    async def read_counter(self, addr: int) -> int:
        await self.cyc.drive_phase()
        self.drv.drive(False, 1, False, None)
        self.dut.ctr_addr.value = addr
        await self.cyc.drive_phase()
        self.drv.drive(False, 1, False, None)
        await self.cyc.sample_phase()
        return int(self.dut.ctr_rdata.value)

    async def check_counters(self, tiles: list[Tile], stall_cycles: set[int]) -> None:
        windows: set[int] = set()
        for t in tiles:
            windows.update(range(t.accept_cycle, t.done_cycle))
        stalls = len(stall_cycles & windows)
        if len(tiles) == 1:
            # One tile: exactly what the emulator adds to its counters for this tile.
            expected = systolic_tile_counters(DATAFLOW, ROWS, COLS, tiles[0].depth,
                                              stall_cycles=stalls)
        else:
            expected = {c: 0 for c in (Counter.CYCLES, Counter.BUSY_CYCLES, Counter.MACS,
                                       Counter.STALL_CYCLES)}
            for t in tiles:
                for key, v in systolic_tile_counters(DATAFLOW, ROWS, COLS, t.depth).items():
                    expected[key] += v
            # A stalled cycle shared by two windows (a held `done` overlapping the next
            # tile's cycle 0) is one cycle of the array.
            expected[Counter.CYCLES] += stalls
            expected[Counter.STALL_CYCLES] = stalls
            assert expected[Counter.CYCLES] == len(windows)
        got = {}
        for addr, name in enumerate(REGISTER_MAP):
            got[Counter(name)] = await self.read_counter(addr)
        assert got == expected, f"counters {got} != emulator {expected}"
        await self.idle_cycles(int(self.rng.integers(0, 3)), stall_prob=0.5)
        again = {Counter(n): await self.read_counter(a) for a, n in enumerate(REGISTER_MAP)}
        assert again == got, "counters moved while the array was idle"
        await self.cyc.drive_phase()
        self.drv.drive(False, 1, False, None)
        self.dut.ctr_clear.value = 1
        await self.cyc.drive_phase()
        self.drv.drive(False, 1, False, None)
        self.dut.ctr_clear.value = 0
        assert await self.read_counter(0) == 0, "ctr_clear did not clear"


def depths(rng: np.random.Generator) -> list[int]:
    """1 and the largest depth, plus a random sample in between (6, or 1 when quick)."""
    top = min(64, MAX_DEPTH)
    size = min(1 if quick() else 6, max(top - 2, 0))
    inner = list(rng.choice(np.arange(2, top), size=size, replace=False))
    return [1, top] + [int(d) for d in inner]


async def setup(dut: Any) -> Bench:
    inputs = {"start": 0, "depth": 1, "stall": 0, "ctr_addr": 0, "ctr_clear": 0}
    inputs.update({f"a__{i}": 0 for i in range(ROWS)})
    inputs.update({f"b__{j}": 0 for j in range(COLS)})
    await start_clock_and_reset(dut, inputs)
    return Bench(dut)


@cocotb.test()
async def isolated_tiles(dut: Any) -> None:
    """Each depth alone, half of them with random stalls; counters per tile."""
    bench = await setup(dut)
    sample = depths(bench.rng)
    for n, d in enumerate(sample):
        tile = make_tile(bench.rng, d)
        await bench.run_batch([tile], back_to_back=False, stall_prob=0.25 * (n % 2))
    assert bench.chk.tiles_checked == len(sample)


@cocotb.test()
async def extreme_values(dut: Any) -> None:
    """-128 x -128 and -128 x 127 everywhere at the largest depth (largest |sums|)."""
    bench = await setup(dut)
    top = min(64, MAX_DEPTH)
    all_modes = (("min", "min"), ("min", "max"), ("max", "max"))
    for modes in all_modes[:1] if quick() else all_modes:
        await bench.run_batch([make_tile(bench.rng, top, modes)], back_to_back=False,
                              stall_prob=0.0)


@cocotb.test()
async def back_to_back(dut: Any) -> None:
    """Three tiles with start held high: each still takes the cycle function's count and
    the next is accepted in the last cycle of the previous one; then with stalls."""
    bench = await setup(dut)
    for stall_prob in (0.3,) if quick() else (0.0, 0.3):
        tiles = [make_tile(bench.rng, int(bench.rng.integers(1, min(64, MAX_DEPTH) + 1)))
                 for _ in range(3)]
        await bench.run_batch(tiles, back_to_back=True, stall_prob=stall_prob)
        gaps = [b.accept_cycle - a.done_cycle for a, b in zip(tiles, tiles[1:], strict=False)]
        if stall_prob == 0.0:
            assert gaps == [0, 0], f"back-to-back tiles left gaps {gaps}"
