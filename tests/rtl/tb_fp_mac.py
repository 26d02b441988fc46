"""cocotb testbench of ``FpMac`` (combinational, no clock): the directed corner cases
and random samples of ``fp_vectors`` through the emitted Verilog, bit-exact against the
golden model ``golden.fp_mac_matmul``.

Driver (writes ``a``, ``b``, ``c`` and lets the logic settle), monitor (reads ``y``,
refusing X/Z), model (the golden model over the whole stimulus, one result per sample)
and checker (collects every mismatch, fails once at the end showing the first few).
"""

from __future__ import annotations

from typing import Any

import cocotb
import numpy as np
from cocotb.triggers import Timer
from fp_vectors import corner_vectors, random_vectors, reference
from tb_common import params, quick, seed

FMT = params()["fmt"]
#: Random samples after the corner cases (a tenth with ``WIA_TB_QUICK=1``).
N_RANDOM = 3000


class Driver:
    def __init__(self, dut: Any) -> None:
        self.dut = dut

    async def apply(self, a: int, b: int, c: int) -> None:
        self.dut.a.value = a
        self.dut.b.value = b
        self.dut.c.value = c
        await Timer(1, unit="ns")  # combinational: settled one step later


class Monitor:
    def __init__(self, dut: Any) -> None:
        self.dut = dut

    def sample(self) -> int:
        return self.dut.y.value.to_unsigned()  # raises on X / Z


class Model:
    """``fl32(c + fl32(a * b))`` per sample, from the golden model."""

    def __init__(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        self.expected = reference(a, b, c, FMT)

    def predict(self, i: int) -> int:
        return int(self.expected[i])


class Checker:
    def __init__(self) -> None:
        self.checked = 0
        self.mismatches: list[str] = []

    def check(self, a: int, b: int, c: int, got: int, want: int) -> None:
        self.checked += 1
        if got != want:
            self.mismatches.append(f"a={a:04x} b={b:04x} c={c:08x}: y={got:08x}, golden {want:08x}")

    def report(self) -> None:
        assert not self.mismatches, (
            f"{FMT}: {len(self.mismatches)} of {self.checked} "
            f"samples differ: {'; '.join(self.mismatches[:6])}"
        )


@cocotb.test()
async def corners_and_random(dut: Any) -> None:
    ca, cb, cc = corner_vectors(FMT)
    n_random = N_RANDOM // 10 if quick() else N_RANDOM
    ra, rb, rc = random_vectors(FMT, n_random, np.random.default_rng(seed()))
    a, b, c = np.concatenate([ca, ra]), np.concatenate([cb, rb]), np.concatenate([cc, rc])
    driver, monitor, model, checker = Driver(dut), Monitor(dut), Model(a, b, c), Checker()
    for i, (x, y, z) in enumerate(zip(a.tolist(), b.tolist(), c.tolist(), strict=True)):
        await driver.apply(x, y, z)
        checker.check(x, y, z, monitor.sample(), model.predict(i))
    assert checker.checked == len(a) == len(ca) + n_random
    checker.report()
