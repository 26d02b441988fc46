"""The emulator charges a pipelined systolic array through the cycle contract only.

``compute.array.pipelined``: the array accepts pass i+1 ``systolic_issue_interval`` after
pass i, across tile boundaries too, or when the next tile's operands arrive (a bubble,
counted as a memory stall); a pass is done ``systolic_tile_cycles`` after it is
accepted. Off: every pass pays the whole ``systolic_tile_cycles``. Expected timelines
are rebuilt here from the DMA trace and the functions of ``emulator/cycles.py``.
"""

from __future__ import annotations

import random

import pytest
from wia_hw.emulator import cycles as cycles_mod
from wia_hw.emulator import device as device_mod
from wia_hw.emulator.counters import Counter
from wia_hw.emulator.cycles import (
    systolic_issue_interval,
    systolic_sequence_cycles,
    systolic_tile_counters,
    systolic_tile_cycles,
)
from wia_hw.emulator.device import Device
from wia_hw.emulator.errors import SpecError

import wia_hw
from wia_hw.lowering import lower
from wia_hw.spec import load_spec
from wia_hw.workloads import gemm


def _spec(pipelined: bool, **over):
    base = {"compute.array.pipelined": pipelined}
    base.update(over)
    return load_spec("wia-npu", base)


def _run(spec, graph):
    """Execute ``graph`` on a fresh device with a trace; (device, [(kernel, record)])."""
    dev = Device(spec, trace=[])
    kernels = [k for _, ks in lower(graph, spec) for k in ks]
    return dev, list(zip(kernels, dev.execute(kernels), strict=True))


def _expected_array_timeline(dev, kern, rec, pipelined):
    """The array's compute intervals per core and its memory-stall cycles, rebuilt from
    the DMA events of the trace and the cycle functions alone."""
    spec = dev.spec
    a = spec.compute.array
    R, C, df = a.rows, a.cols, a.dataflow
    tiles, groups = dev.tiles_of(kern)
    shares = dev.partition(tiles, groups, spec.compute.cores)
    out, stall = {}, 0
    seen = {"back_to_back": 0, "bubble": 0}
    for core, share in enumerate(shares):
        if not share:
            continue
        loads = [
            e
            for e in dev.trace
            if e.kind == "dma" and e.kernel == kern.name and e.track.split(".")[0] == f"dma{core}"
        ]
        assert len(loads) == len(share)
        port = dev.memory.l1_ports[core]
        t0 = rec.start_cycle
        prev = None  # (steps, last accept, port free)
        done_max = t0
        spans = []
        for tile, ld in zip(share, loads, strict=True):
            d, p = tile.pass_steps, tile.passes
            ready = ld.end
            if not pipelined:
                cs = max(ready, done_max)
                stall += max(0, ready - done_max)
                done = cs + max(p * systolic_tile_cycles(df, R, C, d), port.cycles(tile.l1_bytes))
                spans.append((cs, done))
                done_max = done
                continue
            if prev is None:
                earliest = t0
            else:
                earliest = max(
                    prev[1] + systolic_issue_interval(df, R, C, prev[0], d, pipelined=True), prev[2]
                )
            cs = max(ready, earliest)
            stall += max(0, ready - earliest)
            if prev is not None:
                seen["back_to_back" if ready <= earliest else "bubble"] += 1
            a_last = cs + (p - 1) * systolic_issue_interval(df, R, C, d, d, pipelined=True)
            port_free = cs + port.cycles(tile.l1_bytes)
            done = max(a_last + systolic_tile_cycles(df, R, C, d), port_free)
            spans.append((cs, done))
            prev = (d, a_last, port_free)
        if pipelined:  # the trace shows a tile until the next one takes the array
            spans = [
                (s, min(e, nxt[0])) for (s, e), nxt in zip(spans, spans[1:], strict=False)
            ] + spans[-1:]
        out[f"core{core}"] = spans
    return out, stall, seen


@pytest.mark.parametrize("dataflow", ["os", "ws"])
@pytest.mark.parametrize("pipelined", [True, False])
def test_one_tile_of_many_passes_takes_the_sequence_cycles(dataflow, pipelined):
    """One core, one tile of p equal passes: compute takes exactly
    ``systolic_sequence_cycles`` of p passes (the contract the RTL is tested against);
    busy cycles are the union of the passes' busy windows; MAC slots p x R x C x D."""
    rng = random.Random(31 if dataflow == "os" else 32)
    for _ in range(6):
        rows, cols = rng.choice([8, 16, 32]), rng.choice([8, 16, 32])
        if dataflow == "os":
            m, n, k = rows * rng.randint(1, 4), cols * rng.randint(1, 3), rng.randint(1, 90)
            depth, passes = k, (m // rows) * (n // cols)
        else:
            m, n, k = rng.randint(1, 90), cols * rng.randint(1, 3), rows * rng.randint(1, 3)
            depth, passes = m, (k // rows) * (n // cols)
        spec = _spec(
            pipelined,
            **{
                "compute.array.rows": rows,
                "compute.array.cols": cols,
                "compute.array.dataflow": dataflow,
                "compute.cores": 1,
            },
        )
        dev, [(kern, rec)] = _run(spec, gemm(m, n, k))
        assert rec.tiles == 1
        (comp,) = [e for e in dev.trace if e.kind == "compute"]
        assert comp.end - comp.start == systolic_sequence_cycles(
            dataflow, rows, cols, [depth] * passes, pipelined=pipelined
        )
        one = systolic_tile_counters(dataflow, rows, cols, depth)
        step = systolic_issue_interval(dataflow, rows, cols, depth, depth, pipelined=True)
        busy = (
            (passes - 1) * min(step, one[Counter.BUSY_CYCLES]) + one[Counter.BUSY_CYCLES]
            if pipelined
            else passes * one[Counter.BUSY_CYCLES]
        )
        assert rec.counters.busy_cycles == busy <= rec.cycles
        seq = getattr(cycles_mod, "systolic_sequence_counters", None)
        if seq is not None:  # the RTL counter block's reading of the same sequence
            assert (
                busy
                == seq(dataflow, rows, cols, [depth] * passes, pipelined=pipelined)[
                    Counter.BUSY_CYCLES
                ]
            )
        assert rec.slot_macs == passes * one[Counter.MACS]


@pytest.mark.parametrize("pipelined", [True, False])
def test_whole_array_timeline_follows_the_cycle_functions(pipelined):
    """Random GEMMs and batched matmuls on random arrays and core counts: every core's
    compute intervals equal the timeline rebuilt from its DMA loads and the cycle
    functions (back-to-back across tile boundaries when the operands are in L1, a
    memory-stall bubble when they are late), and the memory-stall counter is the sum of
    those bubbles."""
    rng = random.Random(7 if pipelined else 8)
    seen = {"back_to_back": 0, "bubble": 0}
    for _ in range(5):
        rows = rng.choice([16, 32, 64])
        over = {
            "compute.array.rows": rows,
            "compute.array.cols": rng.choice([16, 32, 64]),
            "compute.array.dataflow": rng.choice(["os", "ws"]),
            "compute.cores": rng.choice([1, 2, 4]),
            "memory.l1.size_kib": rng.choice([1024, 2048]),
            "memory.block_bytes": 65536,
            "memory.hbm.bandwidth_gbs": rng.choice([600, 5]),
        }  # 5: operands late
        spec = _spec(pipelined, **over)
        g = gemm(
            rng.randint(100, 700),
            rng.randint(100, 700),
            rng.randint(30, 900),
            batch=rng.choice([1, 1, 3]),
        )
        dev, runs = _run(spec, g)
        for kern, rec in runs:
            want, stall, how = _expected_array_timeline(dev, kern, rec, pipelined)
            for key in seen:
                seen[key] += how[key]
            got = {}
            for e in dev.trace:
                if e.kind == "compute" and e.kernel == kern.name:
                    got.setdefault(e.track, []).append((e.start, e.end))
            assert got == want
            assert rec.counters.stall_cycles["memory"] == stall
            assert rec.counters.busy_cycles <= rec.cycles * rec.cores_used
    if pipelined:  # both cases of a tile boundary were exercised
        assert seen["back_to_back"] > 0 and seen["bubble"] > 0, seen


def test_pipelining_is_one_flag_and_never_slower():
    """Random GEMMs on wia-npu: on is never slower than off; off keeps today's per-pass
    cycles (checked by the timeline test); a K=64 pass sequence gains what the contract
    says it gains."""
    rng = random.Random(5)
    for _ in range(4):
        g = gemm(rng.randint(64, 2048), rng.randint(64, 2048), rng.choice([64, 300, 1024]))
        on = wia_hw.run(g, overrides={"compute.array.pipelined": True})
        off = wia_hw.run(g, overrides={"compute.array.pipelined": False})
        assert on.cycles <= off.cycles
        assert on.flops == off.flops and on.counters.macs == off.counters.macs
        assert on.counters.bytes["hbm"] > 0 and on.roofline_floor_ms <= on.latency_ms


def test_emulator_charges_the_array_only_through_the_contract(monkeypatch):
    """Replace the issue-interval rule (as the RTL's exact rule may): the emulator's
    compute interval follows it, since it never re-derives the formula."""
    spec = _spec(True, **{"compute.array.rows": 16, "compute.array.cols": 16, "compute.cores": 1})
    base, [(_, rec0)] = _run(spec, gemm(16 * 5, 16, 40))
    monkeypatch.setattr(
        device_mod, "systolic_issue_interval", lambda df, r, c, d, nd, *, pipelined: d + r + 7
    )
    dev, [(_, rec1)] = _run(spec, gemm(16 * 5, 16, 40))
    (c0,) = [e for e in base.trace if e.kind == "compute"]
    (c1,) = [e for e in dev.trace if e.kind == "compute"]
    assert (c1.end - c1.start) - (c0.end - c0.start) == 4 * ((40 + 16 + 7) - max(40, 16))


def test_pipelined_field_is_checked_and_shipped_specs_state_it():
    with pytest.raises(SpecError, match="pipelined.*must be true or false, got 'yes'"):
        load_spec("wia-npu", {"compute.array.pipelined": "yes"})
    assert load_spec("wia-npu").compute.array.pipelined is True
    assert load_spec("wia-edge").compute.array.pipelined is False
    from wia_hw.spec import list_specs, spec_path

    for name in list_specs():
        text = spec_path(name).read_text()
        if "compute:" in text:
            assert "pipelined:" in text, name
