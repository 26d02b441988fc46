"""cocotb testbench of ``ProcessingElement``: random per-cycle stimulus against a
cycle-level reference model, including accumulations that wrap past 2**31."""

from __future__ import annotations

from typing import Any

import cocotb
import numpy as np
from tb_common import Cycler, params, seed, start_clock_and_reset
from wia_hw.emulator.golden import wrap_int32

DATAFLOW = params()["dataflow"]
CYCLES = 600


def wrap(v: int) -> int:
    return int(wrap_int32(np.array([v]))[0])


class OsModel:
    """Output-stationary PE: registered forwarding, accumulate / restart / shift."""

    def __init__(self) -> None:
        self.state = {"a_out": 0, "b_out": 0, "valid_out": 0, "first_out": 0, "acc": 0}

    def step(self, i: dict[str, int]) -> None:
        s = self.state
        if i["valid_in"]:
            acc = wrap((0 if i["first_in"] else s["acc"]) + i["a_in"] * i["b_in"])
        elif i["shift"]:
            acc = i["acc_in"]
        else:
            acc = s["acc"]
        self.state = {
            "a_out": i["a_in"],
            "b_out": i["b_in"],
            "valid_out": i["valid_in"],
            "first_out": i["first_in"],
            "acc": acc,
        }


class WsModel:
    """Weight-stationary PE: weight register, registered forwarding, partial sum."""

    def __init__(self) -> None:
        self.state = {"x_out": 0, "valid_out": 0, "w": 0, "psum_out": 0}

    def step(self, i: dict[str, int]) -> None:
        s = dict(self.state)
        if i["valid_in"]:
            s["psum_out"] = wrap(i["psum_in"] + i["x_in"] * self.state["w"])
        if i["load"]:
            s["w"] = i["w_in"]
        s["x_out"], s["valid_out"] = i["x_in"], i["valid_in"]
        self.state = s


def stimulus(rng: np.random.Generator, n: int) -> dict[str, int]:
    """Random inputs; every few cycles an accumulator/partial sum near +-2**31."""
    big = int(rng.choice([2**31 - 1, 2**31 - 20000, -(2**31), -(2**31) + 5]))
    near_edge = n % 7 == 0

    def i8() -> int:
        return int(rng.choice([-128, 127])) if rng.random() < 0.2 else int(rng.integers(-128, 128))

    if DATAFLOW == "os":
        return {
            "a_in": i8(),
            "b_in": i8(),
            "valid_in": int(rng.random() < 0.7),
            "first_in": int(rng.random() < 0.1),
            "shift": int(rng.random() < 0.3),
            "acc_in": big if near_edge else int(rng.integers(-(2**31), 2**31)),
        }
    return {
        "x_in": i8(),
        "valid_in": int(rng.random() < 0.7),
        "w_in": i8(),
        "load": int(rng.random() < 0.2),
        "psum_in": big if near_edge else int(rng.integers(-(2**31), 2**31)),
    }


@cocotb.test()
async def random_cycles(dut: Any) -> None:
    rng = np.random.default_rng(seed())
    model = OsModel() if DATAFLOW == "os" else WsModel()
    first = stimulus(rng, 1)
    await start_clock_and_reset(dut, {k: 0 for k in first})
    cyc = Cycler(dut)
    wraps = 0
    for n in range(CYCLES):
        await cyc.drive_phase()
        # outputs now show the state after the previous edge
        for name, v in model.state.items():
            got = getattr(dut, name).value
            got = got.to_signed() if len(got) > 1 else int(got)
            assert got == v, f"cycle {n}: {name} = {got}, model {v}"
        inputs = stimulus(rng, n)
        if DATAFLOW == "os" and inputs["valid_in"] and not inputs["first_in"]:
            wraps += not -(2**31) <= model.state["acc"] + inputs["a_in"] * inputs["b_in"] < 2**31
        if DATAFLOW == "ws" and inputs["valid_in"]:
            wraps += not -(2**31) <= inputs["psum_in"] + inputs["x_in"] * model.state["w"] < 2**31
        for name, v in inputs.items():
            getattr(dut, name).value = v
        await cyc.sample_phase()
        assert int(dut.mac.value) == inputs["valid_in"], f"cycle {n}: mac != valid_in"
        model.step(inputs)
    assert wraps > 0, "the stimulus never wrapped the accumulator"
