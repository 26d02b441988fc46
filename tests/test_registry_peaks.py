"""A YAML-only operation's cost never beats its unit's peak (``wia_hw.registry._peaks``):
refused at validate time where a built-in device's full tile proves it, at run time per
tile otherwise; an honest cost keeps the run above its roofline floor."""

from __future__ import annotations

import math
import random
import re
import textwrap

import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw import SpecError, WorkloadError, load_extension, register_device_extension
from wia_hw.cli import cli

HEAD = """\
schema_version: 1
extension_id: unit
version: "1.0"
parameters:
  speedup: {type: float, default: 1.0, min: 0.01, max: 100}
operations:
"""

#: Cycles of a tile at exactly the array's peak (divided by ``speedup``).
AT_PEAK = "ceil(B * M * N * K / (array_rows * array_cols * rate) / speedup)"


def manifest(tmp_path, ops: str, name: str = "unit.yaml"):
    p = tmp_path / name
    p.write_text(HEAD + textwrap.indent(textwrap.dedent(ops), "  "))
    return p


def line_of(path, needle):
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def test_cycles_1_on_the_array_is_refused_at_validate_time(tmp_path):
    p = manifest(
        tmp_path,
        """\
        - name: instant
          claims: [linear, matmul]
          compose: [matmul]
          cost: {cycles: "1"}
    """,
    )
    with pytest.raises(SpecError) as info:
        load_extension(p)
    e = info.value
    assert e.field == "operations.0.cost.cycles" and e.line == line_of(p, "cost:")
    m = re.search(
        r"unit\.instant: cost model beats the unit's peak on tile \{B=(\d+), "
        r"M=(\d+), N=(\d+), K=(\d+), E=(\d)\}: 1 cycles for ([\d,]+) MACs .* above "
        r"the peak of ([\d,.]+) MACs/cycle \(array_rows\*array_cols\*rate = "
        r"(\d+)\*(\d+)\*([\d.]+)\); the tile needs at least ([\d,]+) cycles, on "
        r"the built-in device '([\w-]+)'",
        e.message,
    )
    assert m, e.message
    b, mm, n, k, _ = map(int, m.groups()[:5])
    macs = int(m.group(6).replace(",", ""))
    rows, cols, rate = int(m.group(8)), int(m.group(9)), float(m.group(10))
    spec = wia_hw.load_spec(m.group(12))
    assert (rows, cols) == (spec.compute.array.rows, spec.compute.array.cols)
    assert macs == b * mm * n * k
    peak = rows * cols * rate
    assert float(m.group(7).replace(",", "")) == peak
    assert int(m.group(11).replace(",", "")) == math.ceil(macs / peak)


def test_cli_validate_refuses_a_cost_above_peak_in_one_line(tmp_path):
    p = manifest(
        tmp_path,
        """\
        - name: instant
          claims: [linear]
          compose: [matmul]
          cost: {cycles: "1"}
    """,
    )
    res = CliRunner().invoke(cli, ["ext", "validate", str(p)])
    assert res.exit_code == 2
    out = res.output.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"wia-hw: error: {p}:")
    assert "beats the unit's peak" in out[0] and "MACs/cycle" in out[0]


def test_cycles_1_on_the_vector_unit_is_refused_with_bytes_per_cycle(tmp_path):
    p = manifest(
        tmp_path,
        """\
        - name: instant_gelu
          claims: [gelu]
          compose: [gelu]
          cost: {cycles: "1"}
    """,
    )
    with pytest.raises(
        SpecError,
        match=r"unit\.instant_gelu: cost model beats the unit's "
        r"peak on tile \{ROWS=\d+, COLS=\d+, ELEMENTS=\d+, E=2\}: 1 cycles "
        r"for [\d,]+ bytes .* bytes/cycle \(lanes\*E = \d+\*2\)",
    ):
        load_extension(p)


def test_a_cost_at_peak_loads_and_a_cost_above_it_is_refused_when_it_runs(tmp_path):
    """``speedup`` is 1 by default (exactly at peak: loads); set to 2 at registration, the
    same expression beats the peak, which only the run-time check can see."""
    p = manifest(
        tmp_path,
        f"""\
        - name: fast
          claims: [linear, matmul]
          compose: [matmul]
          cost: {{cycles: "{AT_PEAK}"}}
    """,
    )
    ext = load_extension(p)
    ctx = wia_hw.open_device("wia-npu")
    register_device_extension(ctx, ext.with_parameters(speedup=2.0))
    a = ctx.spec.compute.array
    with pytest.raises(
        WorkloadError,
        match=(
            r"op 'gemm': unit\.fast: cost model beats the unit's peak on tile \{B=\d+, "
            r"M=\d+, N=\d+, K=\d+, E=2\}: .* above the peak of "
            rf"{a.rows * a.cols * int(a.rate('fp16')):,} MACs/cycle "
            rf"\(array_rows\*array_cols\*rate = {a.rows}\*{a.cols}\*"
        ),
    ):
        ctx.run("gemm", M=512, N=512, K=512)


def test_declared_peaks(tmp_path):
    half = manifest(
        tmp_path,
        f"""\
        - name: half_array
          claims: [linear]
          compose: [matmul]
          peak: {{macs_per_cycle: "array_rows * array_cols * rate / 2"}}
          cost: {{cycles: "{AT_PEAK}"}}
    """,
    )
    with pytest.raises(
        SpecError,
        match=r"above the peak of [\d,]+ MACs/cycle \(declared "
        r"macs_per_cycle = array_rows \* array_cols \* rate / 2\)",
    ):
        load_extension(half)
    double = manifest(
        tmp_path,
        """\
        - name: double
          claims: [linear]
          compose: [matmul]
          peak: {macs_per_cycle: "array_rows * array_cols * rate * 2"}
          cost: {cycles: "B * M * N * K"}
    """,
    )
    with pytest.raises(
        SpecError,
        match=r"operations\.0\.peak: declared peak macs_per_cycle "
        r"= array_rows \* array_cols \* rate \* 2 is [\d,]+, above the unit's "
        r"own [\d,]+",
    ):
        load_extension(double)
    wrong_key = manifest(
        tmp_path,
        """\
        - name: wrong
          claims: [linear]
          compose: [matmul]
          peak: {bytes_per_cycle: "64"}
          cost: {cycles: "B * M * N * K"}
    """,
    )
    with pytest.raises(
        SpecError,
        match=r"operations\.0\.peak: must be a mapping with one "
        r"key, macs_per_cycle \(an expression\), for an operation on the "
        r"array",
    ):
        load_extension(wrong_key)
    bad_name = manifest(
        tmp_path,
        """\
        - name: wrong
          claims: [gelu]
          compose: [gelu]
          peak: {bytes_per_cycle: "M * 2"}
          cost: {cycles: "ELEMENTS"}
    """,
    )
    with pytest.raises(SpecError, match=r"operations\.0\.peak\.bytes_per_cycle: .*'M'"):
        load_extension(bad_name)
    ok = manifest(
        tmp_path,
        """\
        - name: slow_lanes
          claims: [gelu]
          compose: [gelu]
          peak: {bytes_per_cycle: "lanes"}
          cost: {cycles: "ceil(ELEMENTS * E / lanes) + 4"}
    """,
    )
    e = load_extension(ok)
    assert e.to_dict()["operations"][0]["peak"] == {"bytes_per_cycle": "lanes"}


def test_honest_costs_keep_the_run_above_its_floor(tmp_path):
    """Seeded cost factors around the peak: a factor below 1 is refused (at validate time
    or when the run reaches the tile), one at or above 1 runs at no more than 100% of the
    peak and no faster than the roofline floor."""
    rng = random.Random(11)
    factors = [1.0, 0.999, 0.5] + [round(rng.uniform(0.3, 3.0), 3) for _ in range(4)]
    ran, refused = [], []
    for i, f in enumerate(factors):
        p = manifest(
            tmp_path,
            f"""\
            - name: op{i}
              claims: [linear, matmul]
              compose: [matmul]
              cost: {{cycles: "ceil(B * M * N * K / (array_rows * array_cols * rate) * {f})"}}
        """,
            name=f"u{i}.yaml",
        )
        try:
            ext = load_extension(p)
        except SpecError as e:
            assert f < 1 and "beats the unit's peak" in e.message
            refused.append(f)
            continue
        ctx = wia_hw.open_device("wia-npu")
        register_device_extension(ctx, ext)
        try:
            r = ctx.run("gemm", M=1024, N=1024, K=1024)
        except WorkloadError as e:
            assert f < 1 and "beats the unit's peak" in str(e)
            refused.append(f)
            continue
        assert f >= 1
        assert {k.provider for k in r.kernels} == {"unit"}
        assert r.compute_utilization <= 100.0 + 1e-9
        assert r.latency_ms >= r.roofline_floor_ms
        ran.append(f)
    assert sorted(ran + refused) == sorted(factors) and refused and len(ran) >= 2
