"""cocotb testbench of ``FrontEnd``: driver / monitor / golden model / checker.

Golden model: ``emulator.frontend_model`` (``dac_quantize``, ``balanced_subtract``,
``adc_quantize``, ``accumulate_tiles``, ``frontend_cycles``, ``frontend_matvec`` with the
seeded ``PhotonicCore``). All outputs of the block are registers, so this bench reads
them at the falling edge (``Cycler.drive_phase``) and then writes the next inputs.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import cocotb
import numpy as np
from tb_common import Cycler, params, ports, seed, start_clock_and_reset
from wia_hw.emulator import frontend_model as fm

P = params()
PB = P["precision_bits"]
N = P["matrix_size_limit"]
IN_BITS = P.get("in_bits", 16)
DET_BITS = P.get("det_bits", 16)
ACC_BITS = P.get("acc_bits", 32)


class Ports:
    def __init__(self, dut: Any) -> None:
        self.dut = dut
        self.dac_in, self.dac_out = ports(dut, "dac_in", N), ports(dut, "dac_out", N)
        self.det_p, self.det_n = ports(dut, "det_p", N), ports(dut, "det_n", N)
        self.adc_out, self.acc_out = ports(dut, "adc_out", N), ports(dut, "acc_out", N)

    # driver side
    def drive_dac(self, valid: bool, shift: int, x: np.ndarray) -> None:
        self.dut.dac_valid.value = int(valid)
        self.dut.dac_shift.value = shift
        for h, v in zip(self.dac_in, x, strict=True):
            h.value = int(v)

    def drive_det(self, valid: bool, last: bool, shift: int, p: np.ndarray, n: np.ndarray) -> None:
        self.dut.det_valid.value = int(valid)
        self.dut.det_last.value = int(last)
        self.dut.adc_shift.value = shift
        for h, v in zip(self.det_p, p, strict=True):
            h.value = int(v)
        for h, v in zip(self.det_n, n, strict=True):
            h.value = int(v)

    # monitor side
    def sample(self) -> dict[str, Any]:
        d = self.dut
        s = {
            k: int(getattr(d, k).value)
            for k in ("dac_out_valid", "adc_valid", "adc_last", "acc_valid")
        }
        s["dac_out"] = [h.value.to_signed() for h in self.dac_out]
        s["adc_out"] = [h.value.to_signed() for h in self.adc_out]
        s["acc_out"] = [h.value.to_signed() for h in self.acc_out]
        return s


def x_samples(rng: np.random.Generator) -> np.ndarray:
    lo, hi = -(1 << (IN_BITS - 1)), (1 << (IN_BITS - 1)) - 1
    v = rng.integers(lo, hi + 1, N)
    m = rng.random(N)
    v[m < 0.15] = lo
    v[m > 0.85] = hi
    return v


def det_samples(rng: np.random.Generator) -> np.ndarray:
    top = (1 << DET_BITS) - 1
    v = rng.integers(0, top + 1, N)
    m = rng.random(N)
    v[m < 0.1] = 0
    v[m > 0.9] = top
    return v


async def setup(dut: Any) -> tuple[Ports, Cycler]:
    inputs = {"dac_valid": 0, "dac_shift": 0, "det_valid": 0, "det_last": 0, "adc_shift": 0}
    for name in ("dac_in", "det_p", "det_n"):
        inputs.update({f"{name}__{i}": 0 for i in range(N)})
    await start_clock_and_reset(dut, inputs)
    return Ports(dut), Cycler(dut)


@cocotb.test()
async def dac_quantiser(dut: Any) -> None:
    """Random samples (extremes forced) at every shift: codes equal ``dac_quantize``,
    one cycle after sampling; the shifts that clamp are exercised."""
    rng = np.random.default_rng(seed())
    io, cyc = await setup(dut)
    expect: deque = deque()
    clamped = 0
    lo, hi = fm.dac_range(PB)
    for n in range(400):
        await cyc.drive_phase()
        s = io.sample()
        # Written in cycle c, sampled at edge c + 1, on dac_out after edge
        # c + 1 + DAC_LATENCY_CYCLES: read here in cycle c + 1 + DAC_LATENCY_CYCLES.
        if len(expect) == 1 + fm.DAC_LATENCY_CYCLES:
            valid, codes = expect.popleft()
            assert s["dac_out_valid"] == valid, f"cycle {n}: dac_out_valid"
            if valid:
                assert s["dac_out"] == list(codes), f"cycle {n}: {s['dac_out']} != {codes}"
        valid = bool(rng.random() < 0.8)
        shift = int(rng.integers(0, IN_BITS + 1))
        x = x_samples(rng)
        io.drive_dac(valid, shift, x)
        codes = fm.dac_quantize(x, PB, shift, IN_BITS)
        clamped += int(np.sum((codes == lo) | (codes == hi)))
        expect.append((int(valid), codes))
    assert clamped > 0, "no sample clamped"


@cocotb.test()
async def adc_and_accumulator(dut: Any) -> None:
    """Detector pairs (0 and full scale forced) in groups of 1..6 partial tiles, back to
    back or with gaps: ADC codes equal ``adc_quantize(balanced_subtract(...))`` (with
    saturation), each group's sum equals ``accumulate_tiles`` and appears
    ``frontend_cycles(tiles)`` cycles after its first tile was sampled."""
    rng = np.random.default_rng(seed() + 1)
    io, cyc = await setup(dut)
    lo, hi = fm.adc_range(PB)
    groups = [int(rng.integers(1, 7)) for _ in range(60)]
    if ACC_BITS <= 16:  # long enough at full scale to wrap the accumulator
        groups.append((1 << (ACC_BITS - 1)) // (1 << (PB - 1)) + 40)
    stream = []  # (valid, last, shift, p, n, group index)
    for g, tiles in enumerate(groups):
        shift = int(rng.integers(0, DET_BITS + 1))
        long_group = tiles > 6
        for t in range(tiles):
            while rng.random() < 0.2 and not long_group:  # idle cycles inside a group
                stream.append((False, False, shift, det_samples(rng), det_samples(rng), g))
            p = np.full(N, (1 << DET_BITS) - 1) if long_group else det_samples(rng)
            n = np.zeros(N, dtype=np.int64) if long_group else det_samples(rng)
            stream.append((True, t == tiles - 1, shift if not long_group else 0, p, n, g))
    # golden model per group
    codes_by_group: dict[int, list[np.ndarray]] = {}
    adc_expect: deque = deque()
    first_edge: dict[int, int] = {}
    saturated = 0
    for valid, last, shift, p, n, g in stream:
        code = fm.adc_quantize(fm.balanced_subtract(p, n, DET_BITS), PB, shift)
        adc_expect.append((int(valid), int(last), code))
        if valid:
            codes_by_group.setdefault(g, []).append(code)
            saturated += int(np.sum((code == lo) | (code == hi)))
    assert saturated > 0
    sums = {g: fm.accumulate_tiles(c, ACC_BITS) for g, c in codes_by_group.items()}

    gaps = {g: sum(1 for v, *_rest, gg in stream if gg == g and not v) for g in range(len(groups))}
    code_delay = 1 + (fm.ADC_LATENCY_CYCLES - 1)  # write -> sampling edge -> adc_out
    done_groups: list[int] = []
    pending_adc: deque = deque()
    first_edge: dict[int, int] = {}
    i = 0
    start = cyc.cycle
    while len(done_groups) < len(groups):
        await cyc.drive_phase()
        c = cyc.cycle
        assert c - start < len(stream) + 20, "accumulator results missing"
        s = io.sample()
        if pending_adc and pending_adc[0][0] == c - code_delay:
            _, (valid, last, code) = pending_adc.popleft()
            assert s["adc_valid"] == valid, f"cycle {c}: adc_valid"
            if valid:
                assert s["adc_last"] == last, f"cycle {c}: adc_last"
                assert s["adc_out"] == list(code), f"adc {s['adc_out']} != {list(code)}"
        if s["acc_valid"]:
            g = len(done_groups)
            assert s["acc_out"] == list(sums[g]), f"group {g}: {s['acc_out']} != {sums[g]}"
            measured = c - first_edge[g]
            expected = fm.frontend_cycles(groups[g]) + gaps[g]
            assert measured == expected, (
                f"group {g}: {measured} cycles for {groups[g]} "
                f"tiles + {gaps[g]} idle, model {expected}"
            )
            done_groups.append(g)
        if i < len(stream):
            valid, last, shift, p, n, g = stream[i]
            io.drive_det(valid, last, shift, p, n)
            first_edge.setdefault(g, c + 1)  # sampled at the next rising edge
            pending_adc.append((c, adc_expect.popleft()))
            i += 1
        else:
            io.drive_det(False, False, 0, np.zeros(N), np.zeros(N))


@cocotb.test()
async def photonic_matvec(dut: Any) -> None:
    """End to end with the seeded photonic core model in the loop: x tiles through the
    RTL DAC, the core model turns the RTL's codes into detector samples (settling in one
    cycle), the RTL's ADC path accumulates the K tiles. Codes and results equal
    ``frontend_matvec`` with the same seed, and the result arrives in
    ``frontend_matvec_cycles`` cycles."""
    rng = np.random.default_rng(seed() + 2)
    io, cyc = await setup(dut)
    rows, k = 2 * N - 1, 3 * N + 1
    w = rng.uniform(-1, 1, (rows, k))
    x = rng.integers(-(1 << (IN_BITS - 1)), 1 << (IN_BITS - 1), k)
    config = fm.FrontendConfig(
        precision_bits=PB,
        matrix_size_limit=N,
        dac_shift=IN_BITS - PB,
        adc_shift=max(DET_BITS - PB - 1, 0),
        in_bits=IN_BITS,
        det_bits=DET_BITS,
        acc_bits=ACC_BITS,
    )
    core_params = fm.PhotonicParams(matrix_size_limit=N, precision_bits=PB, det_bits=DET_BITS)
    trace = fm.frontend_matvec(w, x, config, fm.PhotonicCore(core_params, seed=seed()))
    core = fm.PhotonicCore(core_params, seed=seed())  # the same core, driven by the RTL
    wq = fm.quantize_weights(w, PB)
    kt, mt = fm.frontend_tiles(k, N), fm.frontend_tiles(rows, N)
    order = [(mb, kb) for mb in range(mt) for kb in range(kt)]
    xp = np.zeros(kt * N, dtype=np.int64)
    xp[:k] = x
    _, hi = fm.dac_range(PB)

    results: list[list[int]] = []
    t_in = t_det = 0
    edge0 = cyc.cycle + 2  # tile 0 is written in the next cycle, sampled at the edge after
    end = None
    while end is None:
        await cyc.drive_phase()
        c = cyc.cycle
        assert c - edge0 < 10 * len(order) + 20, "matvec did not finish"
        s = io.sample()
        if s["acc_valid"]:
            results.append(s["acc_out"])
            if len(results) == mt:
                end = c
        # DAC side: tile t is written in cycle edge0 - 1 + t, sampled at edge edge0 + t.
        if t_in < len(order):
            kb = order[t_in][1]
            io.drive_dac(True, config.dac_shift, xp[kb * N : (kb + 1) * N])
            t_in += 1
        else:
            io.drive_dac(False, 0, np.zeros(N))
        # Core + ADC side: tile t's codes are visible in cycle edge0 + t + 1; the core
        # settles within that cycle and its detector samples are sampled at the next edge.
        if s["dac_out_valid"] and t_det < len(order):
            mb, kb = order[t_det]
            codes = np.array(s["dac_out"])
            assert list(codes) == list(trace.dac_codes[kb]), f"tile {t_det}: DAC codes"
            core.program(wq[mb * N : (mb + 1) * N, kb * N : (kb + 1) * N])
            p, n = core.detect(codes / hi)
            assert np.array_equal(p, trace.det_p[t_det]) and np.array_equal(n, trace.det_n[t_det])
            io.drive_det(True, bool(trace.last[t_det]), config.adc_shift, p, n)
            t_det += 1
        else:
            io.drive_det(False, False, 0, np.zeros(N), np.zeros(N))
    got = np.array(results).reshape(-1)[:rows]
    assert np.array_equal(got, trace.result), f"{got} != {trace.result}"
    expected = fm.frontend_matvec_cycles(rows, k, N, core_latency_cycles=1)
    assert end - edge0 == expected, f"matvec took {end - edge0} cycles, model {expected}"
