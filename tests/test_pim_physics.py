"""PIM extension physics: energy per row opened and per column op, the memory capacity
(pim_execute and the graph offload), cycles that are the bank RTL's (``program_cycles``
of the stream) with one row opening per row for ops without a staged operand, bytes
saved and the internal bandwidth."""

from __future__ import annotations

import numpy as np
import pytest
from wia_hw.emulator.errors import WorkloadError
from wia_hw.emulator.pim_model import PimCommand, PimTiming
from wia_hw.extensions.pim import (
    PIMConfig,
    PIMKernel,
    PIMOperation,
    pim_execute,
    unit_commands,
)

import wia_hw
from wia_hw.graph import GraphBuilder

_OPERAND = {"add", "sub", "mul", "axpy", "copy"}
_SCALAR = {"scale", "axpy", "fill"}
ALL_OPS = ["relu", "add", "sub", "mul", "scale", "axpy", "fill", "copy"]


def _op(name: str, in_place: bool = True, n: int = 1) -> PIMOperation:
    return PIMOperation(
        operation=name,
        in_place=in_place,
        operand=np.ones(n, np.int16) if name in _OPERAND else None,
        scalar=3 if name in _SCALAR else None,
    )


def _run(cfg: PIMConfig, op: PIMOperation | PIMKernel, n: int):
    return pim_execute(None, cfg, op, np.zeros(n, np.int16), functional=False)


# -- 1. energy ----------------------------------------------------------------------------


def _row_energy(cfg: PIMConfig, acts_per_row: int = 1, col_ops_per_column: int = 1) -> float:
    col = cfg.column_energy_pj + cfg.op_energy_pj
    return acts_per_row * cfg.act_energy_pj + col_ops_per_column * cfg.bank_columns * col


@pytest.mark.parametrize("rows", [1, 5, 127, 128, 129, 256, 1000])
def test_energy_is_rows_opened_times_act_plus_column_ops(rows):
    """A ReLU over ``rows`` full rows opens each row once (one ACT per bank row, shared by
    the bank's units) and does one column op per column; nothing more."""
    cfg = PIMConfig()
    n = rows * cfg.row_elements
    for name in ("relu", "scale", "fill"):
        assert _run(cfg, _op(name), n).energy_pj == rows * _row_energy(cfg)
    # ADD opens the operand's row and the data's (4 columns per unit fit the GRF) and
    # does two column ops per column (FILL the operand, ADD)
    add = _run(cfg, _op("add", n=n), n)
    assert add.energy_pj == rows * _row_energy(cfg, acts_per_row=2, col_ops_per_column=2)


def test_energy_129_rows_on_128_banks_is_one_more_row_not_double():
    cfg = PIMConfig()
    e = {r: _run(cfg, _op("relu"), r * cfg.row_elements).energy_pj for r in (128, 129, 256)}
    assert e[129] - e[128] == _row_energy(cfg)
    assert e[256] == 2 * e[128] and e[129] < e[256]


@pytest.mark.parametrize("seed", range(4))
def test_energy_independent_of_units_per_bank_for_the_same_work(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 1 << 18))
    banks = int(rng.integers(1, 300))
    for name in ("relu", "scale", "fill"):
        energies = {
            cu: _run(PIMConfig(banks=banks, compute_units_per_bank=cu), _op(name), n).energy_pj
            for cu in (1, 2, 4, 8, 16, 32)
        }
        cfg = PIMConfig(banks=banks)
        rows = -(-n // cfg.row_elements)  # padding columns of the last row run too
        assert set(energies.values()) == {rows * _row_energy(cfg)}, (name, energies)


# -- 2. capacity and bandwidth_gb_s -------------------------------------------------------


def test_pim_execute_counts_the_operand_and_the_separate_output_against_capacity():
    cfg = PIMConfig(memory_capacity_gb=0.001)  # 1 MB
    n = 400_000  # 0.8 MB of int16 (782 whole 1 KB rows: 800,768 bytes)
    assert _run(cfg, _op("relu"), n).cycles > 0  # in place: fits
    with pytest.raises(WorkloadError) as e:
        _run(cfg, _op("relu", in_place=False), n)
    msg = str(e.value)
    assert "\n" not in msg and "need 1601536 bytes" in msg and "data, output" in msg
    assert "memory_capacity_gb = 0.001 GB" in msg
    with pytest.raises(WorkloadError, match=r"need 2402304 bytes .*data, operand, output"):
        _run(cfg, _op("copy", in_place=False, n=n), n)
    with pytest.raises(WorkloadError, match=r"data, operand\)"):
        _run(cfg, _op("add", n=n), n)


def _relu_graph(extra_reader: bool = False):
    b = GraphBuilder("relu_net", "fp16")
    h = b.linear("fc", b.input("x", (16384, 256)), 2048, bias=False)  # 64 MiB activation
    r = b.op("relu", "act", [h])
    out = b.op("add", "res", [r, h]) if extra_reader else r
    b.op("scale", "post", [out], factor=0.5)
    return b.graph()


def _pim_kernels(graph, **params):
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "pim", parameters={"offload_min_bytes": 1, **params})
    return [k for k in ctx.run(graph).kernels if k.provider == "pim"]


def test_graph_offload_declines_a_relu_the_memory_cannot_hold():
    mib64 = 16384 * 2048 * 2
    g = _relu_graph()
    assert len(_pim_kernels(g, memory_capacity_gb=mib64 / 1e9)) == 1  # exactly fits
    assert _pim_kernels(g, memory_capacity_gb=0.05) == []  # 50 MB < 64 MiB
    # out of place (h is read again) it needs its output's rows too
    g2 = _relu_graph(extra_reader=True)
    assert _pim_kernels(g2, memory_capacity_gb=2 * mib64 / 1e9)
    assert _pim_kernels(g2, memory_capacity_gb=1.5 * mib64 / 1e9) == []


def test_bandwidth_gb_s_sets_only_the_transfer_time():
    n = 1 << 16
    a = _run(PIMConfig(bandwidth_gb_s=1000), _op("relu"), n)
    b = _run(PIMConfig(bandwidth_gb_s=4000), _op("relu"), n)
    assert a.transfer_time_ns == 4 * b.transfer_time_ns == 2 * n * 2 / 1000
    assert (a.cycles, a.energy_pj) == (b.cycles, b.energy_pj)


# -- 3. cycles: the bank RTL's (tests/test_pim.py checks them by hand), t_cl and t_wr ---
# -- metadata ---------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["t_cl", "t_wr"])
def test_t_cl_and_t_wr_are_declared_metadata_of_the_op_streams(field):
    """The streams issue no RD or WR: the bank's RD/WR latencies change no result, as
    pim.yaml declares (the RTL leaves the DRAM array's CAS latency and write recovery
    out of its column-triggered ops, and the emulator follows the RTL)."""
    from wia_hw.registry import load_extension

    text = load_extension("pim").parameters[field].description
    assert text.startswith("metadata here")
    n = 5000
    for name in ALL_OPS:
        op = _op(name, True, n)
        cycles = {_run(PIMConfig(timing=PimTiming(**{field: v})), op, n).cycles for v in (1, 40)}
        assert len(cycles) == 1, name


# -- 4. one row opening per row for ops that stage nothing --------------------------------


@pytest.mark.parametrize("name", ["relu", "scale", "fill"])
def test_ops_without_staging_open_each_row_once(name):
    for cols in (1, 7, 8, 9, 32, 64):
        reqs = unit_commands(_op(name), 3, cols)
        assert sum(r.cmd is PimCommand.ACT for r in reqs) == 3, cols


@pytest.mark.parametrize("name", ["relu", "scale", "fill"])
def test_wider_rows_never_slower_and_fewer_activations(name):
    n = 1 << 20  # full rows at every width
    prev = None
    for bc in (64, 128, 256, 512):
        cfg = PIMConfig(bank_columns=bc)
        res = _run(cfg, _op(name), n)
        rows_per_bank = n // cfg.row_elements // cfg.banks
        acts = sum(
            r.cmd is PimCommand.ACT
            for r in unit_commands(_op(name), rows_per_bank, cfg.columns_per_unit)
        )
        assert acts == rows_per_bank
        if prev is not None:
            assert res.cycles < prev[0] and acts < prev[1] and res.energy_pj < prev[2]
        prev = (res.cycles, acts, res.energy_pj)


# -- 5. bytes saved and internal bandwidth ------------------------------------------------


def test_bytes_saved_counts_the_inputs_the_op_reads_and_the_result():
    n = 1 << 12
    factor = {"relu": 2, "scale": 2, "fill": 1, "copy": 2, "add": 3, "sub": 3, "mul": 3, "axpy": 3}
    for name, f in factor.items():
        for in_place in (True, False):
            assert _run(PIMConfig(), _op(name, in_place, n), n).bytes_saved == f * 2 * n, name


def test_internal_bandwidth_is_the_column_issue_ceiling():
    for cfg in (
        PIMConfig(),
        PIMConfig(banks=16, compute_units_per_bank=4, timing=PimTiming(t_ccd=2)),
        PIMConfig(pim_clock_ghz=1.5, timing=PimTiming(t_ccd=1, t_cl=1, t_wr=1)),
    ):
        assert cfg.internal_bandwidth_gbs == (cfg.units * 32 * cfg.pim_clock_ghz / cfg.timing.t_ccd)
        n = 64 * cfg.banks * cfg.row_elements
        res = _run(cfg, _op("relu"), n)
        assert n * 2 / res.time_ns <= cfg.internal_bandwidth_gbs
    assert PIMConfig().internal_bandwidth_gbs == 8192


@pytest.mark.parametrize("field", ["act_energy_pj", "column_energy_pj", "op_energy_pj"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_non_finite_or_negative_energy_is_refused(field, value):
    with pytest.raises(ValueError, match=rf"PIMConfig.{field} must be a finite number >= 0"):
        PIMConfig(**{field: value})
