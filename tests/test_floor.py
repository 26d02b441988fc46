"""The roofline floor of a run: the graph's FLOPs at peak and its compulsory HBM bytes at
peak bandwidth, from the graph (each weight and input read once, each output written
once), less what a warm device already holds on chip. (Random specs and workloads:
``tests/test_emulator.py``.)"""

from __future__ import annotations

import pytest

import wia_hw
from wia_hw.graph import GraphBuilder
from wia_hw.runtime import compulsory_hbm_bytes


def _add(rows: int, cols: int):
    b = GraphBuilder("add", "fp16")
    x, y = b.input("x", (rows, cols)), b.input("y", (rows, cols))
    b.op("add", "sum", [x, y])
    return b.graph()


def test_floor_counts_each_input_and_output_once():
    g = _add(1024, 2048)
    nbytes = 1024 * 2048 * 2
    assert compulsory_hbm_bytes(g) == 3 * nbytes  # x, y read; sum written
    r = wia_hw.run(g)
    spec = wia_hw.load_spec("wia-npu")
    assert r.roofline_floor_ms == pytest.approx(3 * nbytes / (spec.peak_bandwidth_gbs * 1e9) * 1e3)
    assert r.latency_ms >= r.roofline_floor_ms
    assert r.counters.bytes["hbm"] >= 3 * nbytes


def test_warm_device_floor_leaves_out_what_is_on_chip():
    """Run twice on one context: the inputs are in L2 the second time, so the floor no
    longer asks for them from HBM, and the run is still not below it."""
    g = _add(1024, 2048)
    ctx = wia_hw.open_device("wia-npu")
    cold = ctx.run(g)
    warm = ctx.run(g)
    assert warm.counters.bytes["hbm"] < cold.counters.bytes["hbm"]
    assert warm.roofline_floor_ms < cold.roofline_floor_ms
    assert warm.latency_ms >= warm.roofline_floor_ms
