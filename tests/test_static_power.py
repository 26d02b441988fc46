"""Static power is derived from the device (PEs, on-chip SRAM, DRAM channels), charged
over every cycle of a run, grows with every resource, and ``wia-hw specs show`` prints
it with its breakdown (issue #15, "Static power"; sources in ``docs/POWER.md``)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from wia_hw.emulator.config import DeviceSpec, to_mapping
from wia_hw.emulator.errors import SpecError

import wia_hw
from wia_hw.cli import cli
from wia_hw.spec import list_specs, load_spec

DEVICE_SPECS = [n for n in list_specs() if isinstance(load_spec(n), DeviceSpec)]
COEFFICIENTS = ("static_mw_per_pe", "static_mw_per_mib_sram", "static_mw_per_hbm_channel")


@pytest.mark.parametrize("name", DEVICE_SPECS)
def test_static_power_is_the_formula_on_the_spec_numbers(name):
    s = load_spec(name)
    c, m, en = s.compute, s.memory, s.energy
    pes = c.cores * c.arrays_per_core * c.array.rows * c.array.cols
    sram_mib = (c.cores * m.l1.size_kib + m.l2.size_kib) / 1024
    pe_w = pes * en.static_mw_per_pe / 1000
    sram_w = sram_mib * en.static_mw_per_mib_sram / 1000
    hbm_w = m.hbm.channels * en.static_mw_per_hbm_channel / 1000
    assert s.sram_mib == sram_mib
    assert s.static_power_breakdown_w == pytest.approx({"pe": pe_w, "sram": sram_w, "hbm": hbm_w})
    assert s.static_power_w == pytest.approx(pe_w + sram_w + hbm_w, rel=1e-12)
    assert s.static_power_w > 0


def test_shipped_figures_match_their_spec_comments():
    """The derived totals written in the specs' comments (``derived: ... = x W``)."""
    written = {
        "wia-npu": 19.26,
        "wia-npu-passive": 19.26,
        "a100-systolic": 20.7,
        "wia-edge": 0.95,
        "tpu-v1": 14.31,
    }
    for name, watts in written.items():
        assert load_spec(name).static_power_w == pytest.approx(watts, abs=0.006), name


def test_a_run_is_charged_static_power_for_every_cycle():
    """The energy of a run with the spec's coefficients less that of the same run with
    all three at zero is static power x the run's time, exactly (timing is unchanged)."""
    spec = load_spec("wia-npu")
    off = load_spec("wia-npu", {f"energy.{k}": 0 for k in COEFFICIENTS})
    assert off.static_power_w == 0
    kw = dict(M=512, N=768, K=1024)
    on_run, off_run = wia_hw.run("gemm", device=spec, **kw), wia_hw.run("gemm", device=off, **kw)
    cycles = on_run.counters.cycles
    assert cycles == off_run.counters.cycles
    static_pj = spec.static_power_w * cycles / spec.clock_hz * 1e12
    got_pj = on_run.counters.energy_pj - off_run.counters.energy_pj
    assert got_pj == pytest.approx(static_pj, rel=1e-9)


@pytest.mark.parametrize("workload,kw", [("gemm", dict(M=384, N=640, K=512)), ("gpt2", {})])
def test_a_runs_energy_is_its_counted_work_at_the_spec_energies(workload, kw):
    """Every MAC, vector op and byte the counters hold is charged its energy, the
    end-of-run write-back of dirty L2 blocks included, plus static power over every
    cycle: nothing counted goes uncharged and nothing uncounted is charged."""
    spec = load_spec("wia-npu")
    if workload == "gpt2":
        kw = dict(batch=1, seq=64)
    c = wia_hw.run(workload, device=spec, **kw).counters
    en = spec.energy
    want = sum(n * en.pj_per_mac[p] for p, n in c.macs_by_precision.items())
    want += c.vector_flops * en.pj_per_vector_op
    want += sum(c.bytes[lvl] * en.pj_per_byte[lvl] for lvl in c.bytes)
    want += spec.static_power_w * c.cycles / spec.clock_hz * 1e12
    assert c.energy_pj == pytest.approx(want, rel=1e-9)


def test_a_smaller_array_has_less_static_power():
    """The issue's case: 4 x 64x64 draws less static power than 4 x 128x128 (it was
    40 W for both), by the PE term alone: 3/4 of the PEs' share."""
    big = load_spec("wia-npu")
    small = load_spec("wia-npu", {"compute.array.rows": 64, "compute.array.cols": 64})
    saved = big.static_power_w - small.static_power_w
    assert saved == pytest.approx(
        4 * (128 * 128 - 64 * 64) * big.energy.static_mw_per_pe / 1000, rel=1e-12
    )
    assert saved > 0


_GROWTH = {
    "compute.cores": [1, 2, 3, 4, 8, 16],
    "compute.arrays_per_core": [1, 2, 4],
    "compute.array.rows": [8, 16, 32, 64, 128, 256],
    "compute.array.cols": [8, 16, 32, 64, 128, 256],
    "memory.l1.size_kib": [512, 1024, 4096, 8192, 16384],
    "memory.l2.size_kib": [1024, 8192, 32768, 65536],
    "memory.hbm.channels": [1, 2, 4, 8, 16, 32, 40],
}


@pytest.mark.parametrize("seed", range(6))
def test_more_resources_never_lower_static_power(seed):
    """Random devices (fixed seeds), random coefficients: raising any one resource
    (cores, arrays, rows, cols, L1, L2, DRAM channels) never lowers static power, and
    raises it when that resource's coefficient is positive."""
    rng = random.Random(seed)
    for _ in range(20):
        base = {k: rng.choice(v) for k, v in _GROWTH.items()}
        base["memory.block_bytes"] = 65536  # fits the smallest L1 (512 KiB / 4)
        for k in COEFFICIENTS:
            base[f"energy.{k}"] = rng.choice([0, rng.uniform(0.001, 500)])
        s0 = load_spec("wia-npu", base)
        for field, values in _GROWTH.items():
            bigger = [v for v in values if v > base[field]]
            if not bigger:
                continue
            s1 = load_spec("wia-npu", {**base, field: rng.choice(bigger)})
            assert s1.static_power_w >= s0.static_power_w, (field, base)
            term = {"memory.hbm.channels": "hbm", "memory.l1.size_kib": "sram"}.get(
                field, "sram" if field == "memory.l2.size_kib" else "pe"
            )
            if s0.static_power_breakdown_w[term] > 0:
                assert s1.static_power_w > s0.static_power_w, (field, base)


@pytest.mark.parametrize("field", COEFFICIENTS)
def test_a_negative_coefficient_is_a_spec_error_naming_the_field(field, tmp_path):
    with pytest.raises(
        SpecError, match=rf"energy\.{field}: must be a non-negative number, got -0\.5$"
    ):
        load_spec("wia-npu", {f"energy.{field}": -0.5})
    data = to_mapping(load_spec("wia-npu"))
    data["energy"][field] = -0.5
    p = tmp_path / "neg.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError, match=rf"neg\.yaml.*energy\.{field}: must be a non-negative"):
        load_spec(p)


def test_the_old_fixed_static_power_field_is_named_as_unknown():
    with pytest.raises(
        SpecError, match=r"energy\.static_power_w: unknown field \(known: .*static_mw_per_pe"
    ):
        load_spec("wia-npu", {"energy.static_power_w": 40})


def test_passive_spec_starts_at_its_idle_steady_state():
    """wia-npu-passive's ``initial_c`` is the idle steady state its comment derives:
    ambient + static power x R (to the 0.1 C written)."""
    th = load_spec("wia-npu-passive").thermal
    idle_c = th.ambient_c + load_spec("wia-npu-passive").static_power_w * th.resistance_c_per_w
    assert th.initial_c == pytest.approx(idle_c, abs=0.05)
    assert th.initial_c < th.throttle_c


@pytest.mark.parametrize("name", ["wia-npu", "tpu-v1"])
def test_specs_show_prints_the_derived_figure_and_breakdown(name):
    s = load_spec(name)
    out = CliRunner().invoke(cli, ["specs", "show", name, "--set", "compute.cores=2"])
    assert out.exit_code == 0, out.output
    s = load_spec(name, {"compute.cores": 2})
    parts = s.static_power_breakdown_w
    assert f"static power: {s.static_power_w:.2f} W" in out.output
    assert f"PEs:  {parts['pe']:.2f} W = {s.pes:,} PEs x {s.energy.static_mw_per_pe:g} mW" in (
        out.output
    )
    assert f"SRAM: {parts['sram']:.2f} W = {s.sram_mib:g} MiB" in out.output
    assert f"HBM:  {parts['hbm']:.2f} W = {s.memory.hbm.channels} channels" in out.output
    assert "per core:" in out.output and "2 cores" in out.output


def _power_page_blocks() -> list[tuple[str, str]]:
    page = Path(__file__).resolve().parent.parent / "docs" / "POWER.md"
    return re.findall(r"```(\w*)\n(.*?)```", page.read_text(), flags=re.S)


def test_power_page_shows_what_specs_show_prints():
    blocks = _power_page_blocks()
    i = next(i for i, (lang, b) in enumerate(blocks) if lang == "sh" and "specs show" in b)
    name = blocks[i][1].split()[-1]
    out = CliRunner().invoke(cli, ["specs", "show", name])
    assert out.exit_code == 0, out.output
    shown = blocks[i + 1][1].strip().splitlines()
    assert out.output.strip().splitlines()[-len(shown) :] == shown


def test_power_page_python_example_prints_what_the_page_shows(capsys):
    blocks = _power_page_blocks()
    i = next(i for i, (lang, _) in enumerate(blocks) if lang == "python")
    exec(compile(blocks[i][1], "POWER.md example", "exec"), {"__name__": "example"})
    assert capsys.readouterr().out.strip().splitlines() == blocks[i + 1][1].strip().splitlines()
