"""Little's law on the DMA model (issue #16): a streaming kernel's bandwidth is the bytes
in flight over a load's round trip, up to the HBM channels' refreshed peak.

In flight: a core's operand loads are one in-order stream with one transfer in flight
on a100-systolic (``dma.loads_in_flight`` 1: a load issues when the previous one
completes; the second DMA engine carries the result stores, into L2), and a streaming
(Copy) tile loads one storage block, so ``outstanding = cores x block_bytes``.
Unloaded round trip of a load: ``dma.setup_cycles + hbm latency + the most loaded
channel's piece`` at the channels' refreshed rate (the L2 path runs alongside and is
shorter). The prediction is
``min(peak x (1 - tRFC / tREFI), outstanding / round trip)``, every term derived here
from the spec and the model, none pinned.

The spec is ``a100-systolic`` with its HBM at 300 GB/s (``--set``), so a few cores
already saturate it and both regimes run in a few seconds; the 12 MiB arrays (in and
out) fit its 40 MiB L2, so no write-back shares the channels during the kernel. The
full-size curve (2,039 GB/s, 1..108 cores) is in ``benchmarks/silicon.py``.
"""

from __future__ import annotations

import math

import pytest

import wia_hw
from wia_hw.graph import GraphBuilder

SPEC = "a100-systolic"
BASE = {"memory.hbm.bandwidth_gbs": 300}
NO_REFRESH = {"memory.hbm.refresh_interval_ns": 0, "memory.hbm.refresh_cycle_ns": 0}
ARRAY_BYTES = 12 << 20  # Triad's three arrays fit L2 too
#: emulated within this of Little's law away from the knee (queueing at the knee, where
#: the round trip grows with the load, is what the prediction leaves out)
TOL = 0.05


def _stream_graph(inputs: int):
    """Copy (one array in) or Triad (two in), one out: fp32 ``[n / 1024, 1024]``."""
    n = ARRAY_BYTES // 4
    b = GraphBuilder("stream", "fp32")
    xs = [b.input(f"x{i}", (n // 1024, 1024)) for i in range(inputs)]
    if inputs == 1:
        b.op("cast", "copy", xs, dtype="fp32")
    else:
        b.op("add", "triad", xs)
    return b.graph()


def _point(cores: int, extra: dict | None = None, inputs: int = 1) -> dict:
    over = {**BASE, **(extra or {}), "compute.cores": cores}
    ctx = wia_hw.open_device(SPEC, overrides=over)
    r = ctx.run(_stream_graph(inputs), trace=True)
    rec = r.kernels[-1].record
    s, mem = ctx.spec, ctx.device.memory
    loads = [e for e in r.trace if e.kind == "dma" and e.kernel == rec.name]
    load_bytes = inputs * s.memory.block_bytes  # one block of each input per tile
    assert {e.nbytes for e in loads} == {load_bytes}
    assert rec.counters.bytes["hbm"] == load_bytes * len(loads)  # reads only, each once
    launch = math.ceil(s.compute.control.launch_overhead_ns * s.clock_ghz - 1e-9)
    kernel_cycles = rec.cycles - launch
    hbm = s.memory.hbm
    stripe = hbm.interleave_bytes * hbm.channels
    piece = mem.channels[0].cycles(-(-load_bytes // stripe) * hbm.interleave_bytes)
    hbm_path = math.ceil(hbm.latency_ns * s.clock_ghz) + piece  # the refreshed rate's piece
    l2_path = mem.l2_port.cycles(load_bytes) + s.memory.l2.latency_cycles
    assert l2_path < hbm_path  # the L2 path runs alongside and is the shorter
    round_trip = s.dma.setup_cycles + hbm_path
    refreshed = 1 - hbm.refresh_cycle_ns / hbm.refresh_interval_ns if hbm.refresh_cycle_ns else 1
    peak = float(s.bytes_per_cycle(hbm.bandwidth_gbs)) * refreshed
    outstanding = cores * load_bytes
    return {
        "outstanding": outstanding,
        "emulated": load_bytes * len(loads) / kernel_cycles,  # bytes per cycle
        "little": outstanding / round_trip,
        "peak": peak,
        "predicted": min(peak, outstanding / round_trip),
        "min_round_trip": round_trip,
        "measured_round_trip": sum(e.end - e.start for e in loads) / len(loads),
    }


@pytest.fixture(scope="module")
def curve() -> list[dict]:
    """Outstanding bytes swept by cores, Copy (one 16 KiB block per load) and Triad
    (two)."""
    pts = [_point(c) for c in (1, 2, 4, 8, 32, 64)]
    pts += [_point(c, inputs=2) for c in (3, 6)]
    return sorted(pts, key=lambda p: p["outstanding"])


def test_the_sweep_covers_both_regimes(curve):
    assert any(p["little"] <= 0.5 * p["peak"] for p in curve)  # latency-bound
    assert any(p["little"] >= 2 * p["peak"] for p in curve)  # bandwidth-bound


def test_bandwidth_follows_littles_law_away_from_the_knee(curve):
    for p in curve:
        if 0.5 * p["peak"] < p["little"] < 2 * p["peak"]:
            continue  # the knee: queueing stretches the round trip
        assert p["emulated"] == pytest.approx(p["predicted"], rel=TOL), p


def test_littles_law_bounds_the_bandwidth_everywhere(curve):
    # never above outstanding / the shortest round trip (no refresh wait at all), nor
    # above the refreshed peak (1% for the part of a refresh period a kernel's edges cut)
    for p in curve:
        assert p["emulated"] <= p["outstanding"] / p["min_round_trip"], p
        assert p["emulated"] <= p["peak"] * 1.01, p


def test_in_flight_over_the_measured_round_trip_is_the_bandwidth(curve):
    # L = lambda W with W measured: one load in flight per core, back to back
    for p in curve:
        if p["little"] <= 0.5 * p["peak"]:
            assert p["emulated"] == pytest.approx(
                p["outstanding"] / p["measured_round_trip"], rel=0.02
            ), p


def test_bandwidth_is_monotone_in_outstanding_bytes(curve):
    bws = [p["emulated"] for p in curve]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(bws, bws[1:], strict=False)), bws


def test_without_refresh_the_round_trip_is_exactly_the_model_latency():
    p = _point(1, NO_REFRESH)
    assert p["emulated"] == pytest.approx(p["predicted"], rel=0.01)
    on = _point(64)
    off = _point(64, NO_REFRESH)
    assert off["emulated"] > on["emulated"]  # refresh costs bandwidth at saturation
    assert on["emulated"] == pytest.approx(on["peak"], rel=TOL)
    assert off["emulated"] == pytest.approx(off["peak"], rel=TOL)
