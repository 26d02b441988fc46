"""Systolic-array transactions shared by the Amaranth-simulator tests and the cocotb
testbench: random tiles in every PE precision, laid out the way the array's ports take
them, with their golden results (``emulator.golden``), plus the cycle model of a tile
sequence (``emulator.cycles``). Pure numpy: importable inside and outside the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from wia_hw.emulator.cycles import systolic_steps
from wia_hw.emulator.golden import fp_mac_matmul, int8_matmul
from wia_hw.rtl.pe import LANES, MACS_PER_CYCLE

__all__ = ["LANES", "Tile", "make_tile", "fp_bits", "steps_of"]


def steps_of(precision: str, depth: int) -> int:
    """Array steps (cycles of streaming) of a tile of ``depth`` elements: the emulator's
    ``emulator.cycles.systolic_steps`` at the PE mode's MACs per cycle (``fp32``: 1/4,
    four steps per element)."""
    return systolic_steps(depth, MACS_PER_CYCLE[precision])


@dataclass
class Tile:
    """One transaction: ``depth`` (the port value, in elements), its steps (cycles, for
    the cycle functions), the operand steps in port order (one per ``a_ready`` /
    ``b_ready``: an fp32 element is sampled once for its four steps), and the expected
    ``out`` vectors in order of appearance."""

    depth: int
    steps: int
    a_steps: list[list[int]]
    b_steps: list[list[int]]
    expected: list[list[int]]
    a_idx: int = 0
    b_idx: int = 0
    accept: int | None = None
    done: int | None = None
    rows: list[list[int]] = field(default_factory=list)

    @property
    def consumed(self) -> bool:
        return self.a_idx == len(self.a_steps) and self.b_idx == len(self.b_steps)


def int8_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    v = rng.integers(-128, 128, shape)
    mask = rng.random(shape)
    v[mask < 0.05] = -128
    v[mask > 0.95] = 127
    return v


def fp_bits(rng: np.random.Generator, shape: tuple[int, ...], fmt: str) -> np.ndarray:
    """Random bit patterns of ``fmt`` (uint16; uint32 for fp32) with specials mixed in:
    +-0, subnormals, +-inf, NaNs, and large exponents (so products and sums overflow)."""
    width = 32 if fmt == "fp32" else 16
    bits = rng.integers(0, 1 << width, shape, dtype=np.uint64).astype(np.uint32)
    exp_bits, frac_bits = {"fp16": (5, 10), "bf16": (8, 7), "fp32": (8, 23)}[fmt]
    sign = rng.integers(0, 2, shape, dtype=np.uint32) << (width - 1)
    top = (1 << exp_bits) - 1
    pick = rng.random(shape)
    frac = rng.integers(0, 1 << frac_bits, shape, dtype=np.uint32)
    special = {
        0.04: sign,  # +-0
        0.10: sign | np.maximum(frac, 1),  # subnormal
        0.13: sign | (top << frac_bits),  # +-inf
        0.15: sign | (top << frac_bits) | np.maximum(frac, 1),  # NaN
        0.30: sign
        | ((top - 1 - rng.integers(0, 3, shape, dtype=np.uint32)) << frac_bits)
        | frac,  # huge
    }
    lo = 0.0
    for hi, value in special.items():
        sel = (pick >= lo) & (pick < hi)
        bits[sel] = value[sel]
        lo = hi
    # mid-range values elsewhere (so most sums are ordinary numbers)
    mid = pick >= 0.6
    bias = (1 << (exp_bits - 1)) - 1
    e = rng.integers(bias - 4, bias + 4, shape, dtype=np.uint32)
    bits[mid] = (sign | (e << frac_bits) | frac)[mid]
    return bits if fmt == "fp32" else bits.astype(np.uint16)


def _to_float(bits: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "fp16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float32)
    if fmt == "fp32":
        return bits.astype(np.uint32).view(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _matmul(a_bits: np.ndarray, b_bits: np.ndarray, precision: str) -> np.ndarray:
    """Golden product in port encoding: int32 values, or binary32 bit patterns."""
    if precision.startswith("int8"):
        return int8_matmul(a_bits, b_bits).astype(np.int64)
    out = fp_mac_matmul(_to_float(a_bits, precision), _to_float(b_bits, precision), precision)
    return out.view(np.uint32).astype(np.int64)


def _operands(rng: np.random.Generator, shape: tuple[int, ...], precision: str) -> np.ndarray:
    if precision.startswith("int8"):
        return int8_values(rng, shape)
    return fp_bits(rng, shape, precision).astype(np.int64)


def make_tile(
    rng: np.random.Generator, rows: int, cols: int, dataflow: str, precision: str, depth: int
) -> Tile:
    """A random tile of ``depth`` elements. os: ``A (rows x K) @ B (K x cols)``, step
    ``s`` gives ``a[i*L + l] = A[i, s*L + l]`` and ``b[j*L + l] = B[s*L + l, j]``; ws:
    ``X (M x rows) @ W (rows x cols)``, weights fed last row first, step ``s`` gives
    ``a[i*L + l] = X[s*L + l, i]`` and ``out[j*L + l] = (X @ W)[s*L + l, j]`` (0 past M).
    Lanes past the depth carry random junk, which the array must ignore."""
    L = LANES[precision]
    steps = steps_of(precision, depth)
    port_steps = -(-depth // L)  # operand samples (one per element group of L lanes)
    pad = port_steps * L
    if dataflow == "os":
        a = _operands(rng, (rows, pad), precision)
        b = _operands(rng, (pad, cols), precision)
        res = _matmul(a[:, :depth], b[:depth], precision)
        a_steps = [
            [int(a[i, s * L + lane]) for i in range(rows) for lane in range(L)]
            for s in range(port_steps)
        ]
        b_steps = [
            [int(b[s * L + lane, j]) for j in range(cols) for lane in range(L)]
            for s in range(port_steps)
        ]
        return Tile(depth, steps, a_steps, b_steps, [list(map(int, r)) for r in res])
    x = _operands(rng, (pad, rows), precision)
    w = _operands(rng, (rows, cols), precision)
    res = np.zeros((pad, cols), np.int64)
    res[:depth] = _matmul(x[:depth], w, precision)
    a_steps = [
        [int(x[s * L + lane, i]) for i in range(rows) for lane in range(L)]
        for s in range(port_steps)
    ]
    b_steps = [[int(v) for v in w[rows - 1 - r]] for r in range(rows)]
    expected = [
        [int(res[s * L + lane, j]) for j in range(cols) for lane in range(L)]
        for s in range(port_steps)
    ]
    return Tile(depth, steps, a_steps, b_steps, expected)
