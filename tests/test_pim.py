"""PIM extension: elementwise ops and ISA kernels bit-exact with the bank's golden model,
cycle-exact with its command latencies, and the runtime's offload of memory-bound ReLUs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from wia_hw.emulator import pim_model as pm
from wia_hw.emulator.pim_model import Operand, PimError, PimInstr, PimOp, PimTiming
from wia_hw.extensions.pim import Op, unit_commands

import wia_hw
from wia_hw import (
    ElementwiseOp,
    PIMConfig,
    PIMKernel,
    PIMKernelType,
    PIMOperation,
    PIMOpType,
    PIMType,
    pim_execute,
)
from wia_hw.graph import GraphBuilder

SMALL = PIMConfig(
    banks=4,
    compute_units_per_bank=2,
    bank_columns=8,
    timing=PimTiming(t_rcd=11, t_rp=9, t_cl=7, t_wr=5),
)

EXPECTED = {
    "relu": lambda a, b, s: np.maximum(a, 0),
    "add": lambda a, b, s: a + b,
    "sub": lambda a, b, s: a - b,
    "mul": lambda a, b, s: a * b,
    "scale": lambda a, b, s: a * s,
    "axpy": lambda a, b, s: s * b + a,
    "fill": lambda a, b, s: np.full_like(a, s),
    "copy": lambda a, b, s: b,
}
WITH_OPERAND = {"add", "sub", "mul", "axpy", "copy"}
WITH_SCALAR = {"scale", "axpy", "fill"}


def make_op(name, in_place, y, s=-3):
    return PIMOperation(
        type=PIMOpType.ELEMENTWISE,
        operation=name,
        in_place=in_place,
        operand=y if name in WITH_OPERAND else None,
        scalar=s if name in WITH_SCALAR else None,
    )


@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "out_of_place"])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_elementwise_ops_bit_exact(name, in_place):
    rng = np.random.default_rng(hash(name) % 1000)
    n = 1500  # not a multiple of a row: padding works
    x = rng.integers(-32768, 32768, n).astype(np.int16)
    y = rng.integers(-32768, 32768, n).astype(np.int16)
    x0 = x.copy()
    res = pim_execute(None, SMALL, make_op(name, in_place, y), x)
    want = pm.wrap_int16(EXPECTED[name](x0.astype(np.int64), y.astype(np.int64), -3))
    np.testing.assert_array_equal(res.data, want)
    if in_place:
        assert res.data is x
    else:
        np.testing.assert_array_equal(x, x0)  # the input is kept


def test_size_processes_a_prefix_and_seed_names():
    x = np.arange(-50, 50, dtype=np.int16)
    op = PIMOperation(type=PIMOpType.ELEMENTWISE, operation=Op.RELU, in_place=True)
    pim_execute(
        None,
        PIMConfig(
            pim_type=PIMType.STACKED_3D,
            memory_capacity_gb=16,
            bandwidth_gb_s=2000,
            compute_units_per_bank=8,
        ),
        op,
        x,
        60,
    )
    assert (x[:60] >= 0).all() and (x[60:] == np.arange(10, 50)).all()
    assert Op is ElementwiseOp and ElementwiseOp("RELU") is ElementwiseOp.RELU
    assert PIMType("3d_stacked") is PIMType.STACKED_3D


def _hand_cycles(name, rows, cols, t, in_place=True):
    """The latency of one unit's stream, from pim_model's per-command functions: a run
    of ``w`` equal column ops between ACT and PRE issues one op every ``t_ccd`` cycles
    (equal latencies keep completions in order), and PRE waits for the last op. Ops that
    stage an operand in the GRF reopen their rows every 8 columns."""
    act, pre = pm.activate_cycles(t), pm.precharge_cycles(t)
    op = {"relu": PimOp.RELU, "add": PimOp.ADD, "scale": PimOp.MUL, "sub": PimOp.MAD}[name]
    srf = pm.srf_write_cycles() if name in ("scale", "sub") else 0

    def run(w: int, o: PimOp) -> int:
        return act + (w - 1) * t.t_ccd + pm.op_cycles(o) + pre

    if name in ("relu", "scale") and in_place:  # no GRF staging: one opening a row
        return srf + rows * run(cols, op)
    per_row = 0
    for c0 in range(0, cols, pm.GRF_ENTRIES):
        w = min(pm.GRF_ENTRIES, cols - c0)
        if name in ("add", "sub"):
            per_row += run(w, PimOp.FILL)
        per_row += run(w, op)
    return srf + rows * per_row


@pytest.mark.parametrize("seed", range(6))
def test_cycle_exact_with_the_bank_command_latencies(seed):
    rng = np.random.default_rng(seed)
    t = PimTiming(
        **{k: int(rng.integers(1, 40)) for k in ("t_rcd", "t_rp", "t_cl", "t_wr", "t_ccd")}
    )
    units = int(rng.choice([1, 2, 4]))
    cols_per_unit = int(rng.integers(1, 20))
    cfg = PIMConfig(
        banks=int(rng.integers(1, 9)),
        compute_units_per_bank=units,
        bank_columns=units * cols_per_unit,
        timing=t,
    )
    n = int(rng.integers(1, 6000))
    rows = -(-n // cfg.row_elements)
    per_unit = -(-rows // cfg.banks)
    x = rng.integers(-100, 100, n).astype(np.int16)
    y = rng.integers(-100, 100, n).astype(np.int16)
    for name in ("relu", "add", "scale", "sub"):
        op = make_op(name, True, y, 5)
        res = pim_execute(None, cfg, op, x.copy())
        assert res.cycles == _hand_cycles(name, per_unit, cols_per_unit, t)
        reqs = unit_commands(op, per_unit, cols_per_unit)
        assert res.cycles == pm.program_cycles(reqs, t)
        # the golden bank, command by command, takes the same cycles (all legal)
        bank = pm.PimBank(rows=2 * per_unit, cols=cols_per_unit, timing=t)
        total, prev = 0, None
        for r in reqs:
            cur = bank.request_timing(r)
            total += 0 if prev is None else pm.issue_interval(prev, cur, t)
            prev = cur
            bank.execute(r)
        assert total + prev[0] == res.cycles
        assert res.commands == len(reqs)


def test_timing_scales_with_bank_parallelism():
    x = np.zeros(1 << 16, np.int16)
    op = PIMOperation(operation="relu")
    few = pim_execute(None, PIMConfig(banks=16), op, x, functional=False)
    many = pim_execute(None, PIMConfig(banks=128), op, x, functional=False)
    assert few.cycles == 8 * many.cycles  # 8x the rows per unit
    assert many.units_used == 128 * 8 and few.data is None


def test_float16_relu_is_exact_and_float_arithmetic_refused():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(3000).astype(np.float16)
    x[:4] = [-0.0, np.inf, -np.inf, 0.0]
    want = np.maximum(x.astype(np.float32), 0).astype(np.float16)
    pim_execute(None, SMALL, PIMOperation(operation="relu"), x)
    np.testing.assert_array_equal(x, want)
    with pytest.raises(PimError, match=r"ADD on float16 data: the bank's lanes are int16"):
        pim_execute(None, SMALL, PIMOperation(operation="add", operand=x), x)
    with pytest.raises(PimError, match=r"values outside int16"):
        pim_execute(None, SMALL, PIMOperation(operation="relu"), np.array([40000, 1], np.int32))


def test_custom_kernel_replaces_the_seeds_c_string():
    """The seed's ``for(i...)`` kernel as a validated program: x = relu(3 x - 7)."""
    body = [
        PimInstr(
            op=PimOp.MAD,
            dst=Operand.grf(0),
            src0=Operand.bank(),
            src1=Operand.srf(0),
            src2=Operand.srf(1),
        ),
        PimInstr(op=PimOp.RELU, dst=Operand.bank(), src0=Operand.grf(0)),
    ]
    k = PIMKernel(kernel_type=PIMKernelType.CUSTOM, body=body, scalars=[3, -7], name="relu_affine")
    x = np.arange(-2000, 2000, dtype=np.int16)
    ctx = wia_hw.open_device("wia-npu")
    res = pim_execute(ctx, SMALL, k, x)
    np.testing.assert_array_equal(x, np.maximum(np.arange(-2000, 2000) * 3 - 7, 0))
    rows = math.ceil(4000 / SMALL.row_elements)
    per_unit = math.ceil(rows / SMALL.banks)
    t = SMALL.timing
    mad, relu, cols = pm.op_cycles(PimOp.MAD), pm.op_cycles(PimOp.RELU), SMALL.columns_per_unit
    # per row: ACT, then MAD/RELU pairs pipelined at t_ccd (completions kept in order),
    # PRE after the last RELU is done
    per_row = (
        t.t_rcd
        + cols * max(t.t_ccd, mad - relu + 1)
        + (cols - 1) * max(t.t_ccd, relu - mad + 1)
        + relu
        + t.t_rp
    )
    assert res.cycles == pm.srf_write_cycles() + per_unit * per_row
    # encoded words are accepted too, and the device saw the interval
    k2 = PIMKernel(body=[pm.encode_instr(i) for i in body], scalars=[3, -7])
    assert k2.body == k.body
    assert ctx.device.counters.instructions >= res.commands
    assert "pim" in ctx.extensions


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"body": []}, r"the body is empty"),
        (
            {
                "body": [
                    PimInstr(
                        op=PimOp.ADD, dst=Operand.grf(0), src0=Operand.bank(), src1=Operand.srf(0)
                    )
                ]
            },
            r"no body instruction writes BANK",
        ),
        ({"body": [0xFFFFFFFF]}, r"body: instruction 0: unknown PIM opcode 15"),
        (
            {
                "body": [PimInstr(op=PimOp.RELU, dst=Operand.bank(), src0=Operand.bank())],
                "prologue": [PimInstr(op=PimOp.MOV, dst=Operand.grf(1), src0=Operand.bank())],
            },
            r"prologue: instruction 0 .* reads or writes BANK",
        ),
        (
            {
                "body": [PimInstr(op=PimOp.RELU, dst=Operand.bank(), src0=Operand.bank())],
                "scalars": list(range(9)),
            },
            r"at most 8 scalars",
        ),
        (
            {
                "body": [PimInstr(op=PimOp.RELU, dst=Operand.bank(), src0=Operand.bank())],
                "scalars": [1 << 15],
            },
            r"scalars must be int16",
        ),
    ],
)
def test_kernel_validation(kwargs, message):
    with pytest.raises(PimError, match=message):
        PIMKernel(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"banks": 0}, r"PIMConfig.banks must be a positive integer, got 0"),
        ({"bank_columns": 30}, r"bank_columns \(30\) must be a multiple of compute_units_per_bank"),
        ({"compute_units_per_bank": 1, "bank_columns": 128}, r"serve 128 columns"),
        ({"pim_type": "dimm"}, r"pim_type must be one of 3d_stacked, got 'dimm'"),
        ({"bandwidth_gb_s": -1}, r"bandwidth_gb_s must be a positive number"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PIMConfig(**kwargs)


def test_operation_validation():
    with pytest.raises(ValueError, match=r"ADD needs an operand array"):
        PIMOperation(operation="add")
    with pytest.raises(ValueError, match=r"SCALE needs a scalar"):
        PIMOperation(operation="scale")
    with pytest.raises(ValueError, match=r"operation must be one of relu, add"):
        PIMOperation(operation="gelu")


# -- runtime offload ----------------------------------------------------------------------
def _relu_graph(rows, cols, extra_reader=False):
    b = GraphBuilder("relu_net", "fp16")
    x = b.input("x", (rows, 256))
    h = b.linear("fc", x, cols, bias=False)
    r = b.op("relu", "act", [h])
    out = b.op("add", "res", [r, h]) if extra_reader else r
    b.op("scale", "post", [out], factor=0.5)
    return b.graph()


def test_runtime_offloads_memory_bound_relu_and_reports_savings():
    g = _relu_graph(16384, 2048)  # a 64 MiB activation: beyond L2
    base = wia_hw.run(g)
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "pim")
    r = ctx.run(g)
    (k,) = [k for k in r.kernels if k.provider == "pim"]
    assert k.name == "act" and k.kind == "pim" and k.record.extra["in_place"] == 1
    s = r.extensions["pim"]
    assert s["kernels"] == 1 and s["saved_hbm_bytes"] > 0 and s["saved_cycles"] > 0
    assert r.counters.bytes["hbm"] < base.counters.bytes["hbm"]
    assert r.latency_ms < base.latency_ms
    assert r.to_dict()["extensions"]["pim"]["saved_hbm_bytes"] == s["saved_hbm_bytes"]
    # the PIM kernel's time is the bank stream plus the write-back of dirty cached data
    cfg = PIMConfig.from_extension(ctx.extensions["pim"])
    assert (
        k.record.extra["pim_cycles"]
        == pim_execute(
            None,
            cfg,
            PIMOperation(operation="relu"),
            np.zeros(16384 * 2048, np.float16),
            functional=False,
        ).cycles
    )


def test_small_or_shared_relu_stays_on_the_cores_or_goes_out_of_place():
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "pim")
    r = ctx.run(_relu_graph(256, 256))  # fits in L2: not offloaded
    assert all(k.provider == "builtin" for k in r.kernels)
    ctx2 = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx2, "pim", parameters={"offload_min_bytes": 1})
    r2 = ctx2.run(_relu_graph(16384, 2048, extra_reader=True))  # h is read again
    (k,) = [k for k in r2.kernels if k.provider == "pim"]
    assert k.record.extra["in_place"] == 0


def test_functional_results_unchanged_by_offload():
    # the ReLU reads the graph input, which sits in HBM: offloaded even though small (a
    # small activation just written to L2 stays on the cores, where it is faster)
    b = GraphBuilder("relu_in", "fp16")
    r0 = b.op("relu", "act", [b.input("x", (256, 256))])
    b.op("scale", "post", [r0], factor=0.5)
    g = b.graph()
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "pim", parameters={"offload_min_bytes": 1})
    r = ctx.run(g, mode="functional", seed=2)
    assert any(k.provider == "pim" for k in r.kernels)
    base = wia_hw.run(g, mode="functional", seed=2)
    for name, v in base.outputs.items():
        np.testing.assert_array_equal(r.outputs[name], v)
