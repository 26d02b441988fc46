"""Temperature advances within a kernel (tile by tile, on the device timeline) and the
clock throttles once the die passes ``throttle_c``; the lost cycles are ``thermal``
stalls. ``specs/wia-npu-passive.yaml`` (failed cooling) throttles on one BERT-Large run;
``wia-npu`` does not."""

from __future__ import annotations

import math

import pytest
from wia_hw.emulator.cycles import systolic_sequence_cycles, systolic_tile_cycles
from wia_hw.emulator.device import Device

import wia_hw
from wia_hw.lowering import lower
from wia_hw.spec import load_spec
from wia_hw.workloads import gemm


@pytest.fixture(scope="module")
def bert_runs():
    kw = dict(batch=32, seq=128)
    return (
        wia_hw.run("bert-large", device="wia-npu-passive", **kw),
        wia_hw.run("bert-large", device="wia-npu", **kw),
    )


def test_bert_large_throttles_on_the_passive_spec_only(bert_runs):
    hot, cool = bert_runs
    spec = load_spec("wia-npu-passive")
    th = spec.thermal
    # cooled: no throttling, the die stays far below the limit
    assert cool.counters.stall_cycles["thermal"] == 0
    assert cool.peak_temperature_c < load_spec("wia-npu").thermal.throttle_c
    assert all(k.record.frequency_factor == 1.0 for k in cool.kernels)
    # failed cooling: the die starts below throttle_c, crosses it during the run
    assert th.initial_c < th.throttle_c < hot.peak_temperature_c
    first = next(i for i, k in enumerate(hot.kernels) if k.record.frequency_factor < 1.0)
    assert first > 0  # not throttled from the start
    assert hot.kernels[first - 1].record.temperature_c < th.throttle_c + 0.5
    lost = hot.counters.stall_cycles["thermal"]
    assert lost > 0 and lost == sum(k.counters.stall_cycles["thermal"] for k in hot.kernels)
    # the same work, slower: only the throttled kernels lose cycles
    assert hot.flops == cool.flops and hot.cycles > cool.cycles
    assert all(k.counters.stall_cycles["thermal"] == 0 for k in hot.kernels[:first])
    # a throttled kernel's clock lies between the throttle factor (less the rounding up
    # of each slowed block to whole cycles) and 1
    for k in hot.kernels[first:]:
        assert th.throttle_factor - 0.005 <= k.record.frequency_factor <= 1.0


@pytest.mark.parametrize("pipelined", [False, True])
def test_thermal_stall_cycles_are_the_lost_cycles(pipelined):
    """A die hot from the start runs every cycle at ``throttle_factor``: one tile of p
    passes takes ``ceil(nominal / factor)`` per stretched piece, and the thermal stall
    counter holds exactly the difference."""
    over = {
        "compute.array.rows": 16,
        "compute.array.cols": 16,
        "compute.cores": 1,
        "compute.array.pipelined": pipelined,
        "thermal.initial_c": 150.0,
        "thermal.throttle_factor": 0.75,
    }
    spec = load_spec("wia-npu", over)
    dev = Device(spec, trace=[])
    kernels = [k for _, ks in lower(gemm(16 * 6, 16, 50), spec) for k in ks]
    (rec,) = dev.execute(kernels)
    (comp,) = [e for e in dev.trace if e.kind == "compute"]
    f = 0.75
    if pipelined:
        step = systolic_sequence_cycles(
            "os", 16, 16, [50, 50], pipelined=True
        ) - systolic_tile_cycles("os", 16, 16, 50)
        lat = systolic_tile_cycles("os", 16, 16, 50)
        nominal = 5 * step + lat
        slowed = math.ceil(5 * step / f) + math.ceil(lat / f)
    else:
        nominal = systolic_sequence_cycles("os", 16, 16, [50] * 6, pipelined=False)
        slowed = math.ceil(nominal / f)
    assert comp.end - comp.start == slowed
    assert rec.counters.stall_cycles["thermal"] == slowed - nominal
    assert rec.frequency_factor == pytest.approx(f, rel=0.02)


def test_temperature_advances_within_a_kernel():
    """One long GEMM on the passive spec starting just under the limit: the die crosses
    ``throttle_c`` during the kernel, so part of its tiles run throttled (the kernel's
    mean clock factor lies strictly between the throttle factor and 1)."""
    spec = load_spec("wia-npu-passive", {"thermal.initial_c": 94.95})
    dev = Device(spec, trace=[])
    kernels = [k for _, ks in lower(gemm(4096, 4096, 4096), spec) for k in ks]
    (rec,) = dev.execute(kernels)
    assert spec.thermal.throttle_factor < rec.frequency_factor < 1.0
    assert rec.counters.stall_cycles["thermal"] > 0
    assert rec.temperature_c > spec.thermal.throttle_c
    computes = sorted(e.start for e in dev.trace if e.kind == "compute")
    assert len(computes) > 8


def test_thermal_model_sees_exactly_the_energy_counted():
    """No cooling to speak of (huge R): the die warms by energy / C, the energy being what
    the counters charge, whether it reached the model tile by tile or at kernel end."""
    over = {
        "thermal.resistance_c_per_w": 1e6,
        "thermal.capacitance_j_per_c": 1000.0,
        "thermal.throttle_c": 1000.0,  # the hottest a spec may name: never reached here
    }
    r = wia_hw.run("bert-base", batch=2, seq=64, overrides=over)
    spec = load_spec("wia-npu", over)
    rise = r.peak_temperature_c - spec.thermal.ambient_c
    assert rise == pytest.approx(r.energy_j / spec.thermal.capacitance_j_per_c, rel=1e-6)
