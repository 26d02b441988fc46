"""Device specs: loading, validation with file:line:field errors, overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
from wia_hw.emulator.config import ClusterSpec, DeviceSpec

import wia_hw
from wia_hw import SpecError
from wia_hw.spec import list_specs, load_spec, parse_override, spec_path

NPU = spec_path("wia-npu")


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    text = NPU.read_text()
    assert old in text
    p = tmp_path / "x.yaml"
    p.write_text(text.replace(old, new, 1))
    return p


def _line_of(path: Path, needle: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


def test_builtin_specs_load_and_validate():
    assert {"wia-npu", "wia-edge", "wia-cluster-8"} <= set(list_specs())
    for name in list_specs():
        assert load_spec(name).name == name


def test_wia_npu_is_the_seed_case_study_device():
    s = load_spec("wia-npu")
    a = s.compute.array
    # the comment's derivation: cores x rows x cols x MACs/PE/cycle x 2 x clock
    fp16 = s.compute.cores * a.rows * a.cols * a.macs_per_pe_cycle["fp16"] * 2 * s.clock_hz
    assert s.peak_flops("fp16") == pytest.approx(fp16)
    assert s.peak_flops("fp16") == pytest.approx(128e12, rel=1e-12)
    assert s.peak_flops("int8") == pytest.approx(2 * s.peak_flops("fp16"))
    assert s.peak_bandwidth_gbs == 600


def test_cluster_spec_resolves_its_device():
    c = load_spec("wia-cluster-8")
    assert isinstance(c, ClusterSpec)
    assert c.devices == 8 and isinstance(c.device, DeviceSpec) and c.device.name == "wia-npu"
    c2 = load_spec("wia-cluster-8", {"device.compute.cores": 2})
    assert c2.device.compute.cores == 2


def test_overrides_apply_and_validate():
    s = load_spec("wia-npu", {"compute.array.rows": 64, "memory.hbm.bandwidth_gbs": 900})
    assert s.compute.array.rows == 64 and s.memory.hbm.bandwidth_gbs == 900
    assert s.peak_flops("fp16") == pytest.approx(64e12)
    with pytest.raises(
        SpecError,
        match=r"^override: compute\.array\.rows: must be a positive "
        r"integer, got -4$",
    ):
        load_spec("wia-npu", {"compute.array.rows": -4})
    with pytest.raises(SpecError, match=r"^override: compute\.nothing: unknown field \(known: "):
        load_spec("wia-npu", {"compute.nothing.rows": 1})
    with pytest.raises(SpecError, match=r"override path does not exist \('clock_ghz' is not a"):
        load_spec("wia-npu", {"clock_ghz.x": 1})


def test_overrides_reach_sections_a_file_leaves_out(tmp_path):
    """A section the file leaves at its defaults (wia-edge has no compute.control, no
    compute.vector.cycles_per_element) takes an override like any other field."""
    edge = load_spec("wia-edge")
    s = load_spec(
        "wia-edge",
        {
            "compute.vector.cycles_per_element.softmax": 3,
            "compute.control.launch_overhead_ns": 1000,
        },
    )
    assert s.compute.vector.cycles_per_element["softmax"] == 3
    assert s.compute.control.launch_overhead_ns == 1000
    assert (
        s.compute.vector.cycles_per_element["activation"]
        == edge.compute.vector.cycles_per_element["activation"]
    )


def test_a_check_across_fields_an_override_broke_names_the_override():
    with pytest.raises(SpecError) as ei:
        load_spec("wia-edge", {"memory.l1.size_kib": 32})
    assert str(ei.value).endswith("(with override memory.l1.size_kib=32)")


def test_parse_override_reads_yaml_values():
    assert parse_override("compute.array.rows=64") == ("compute.array.rows", 64)
    assert parse_override("compute.array.dataflow=ws") == ("compute.array.dataflow", "ws")
    assert parse_override("memory.hbm.bandwidth_gbs=900.5")[1] == 900.5
    with pytest.raises(SpecError, match="must read PATH=VALUE"):
        parse_override("compute.array.rows")


@pytest.mark.parametrize(
    "old,new,field,message",
    [
        ("rows: 128", "rows: -4", "compute.array.rows", "must be a positive integer, got -4"),
        ("rows: 128", "rows: 0", "compute.array.rows", "must be a positive integer, got 0"),
        ("cols: 128", "cols: wide", "compute.array.cols", "must be an integer, got 'wide'"),
        (
            "dataflow: os",
            "dataflow: diagonal",
            "compute.array.dataflow",
            "must be one of os, ws, got 'diagonal'",
        ),
        ("  cores: 4", "  cores: 4\n  turbo: true", "compute.turbo", "unknown field"),
        (
            "bandwidth_gbs: 600",
            "bandwidth_gbs: -1",
            "memory.hbm.bandwidth_gbs",
            "must be a positive number, got -1",
        ),
        ("channels: 16", "channels: 0", "memory.hbm.channels", "must be a positive integer"),
        ("clock_ghz: 0.9765625", "clock_ghz: 0", "clock_ghz", "must be a positive number"),
        ("int8: 2}", "int8: 3}", "compute.array.macs_per_pe_cycle.int8", "must be one of"),
        (
            "schema_version: 1",
            "schema_version: 7",
            "schema_version",
            "unsupported schema_version 7",
        ),
        (
            "throttle_factor: 0.75",
            "throttle_factor: 1.5",
            "thermal.throttle_factor",
            "must be in \\(0, 1\\]",
        ),
        (
            "ambient_c: 25",
            "ambient_c: -300",
            "thermal.ambient_c",
            "must be at least absolute zero \\(-273.15 °C\\), got -300",
        ),
    ],
)
def test_spec_errors_name_file_line_and_field(tmp_path, old, new, field, message):
    p = _variant(tmp_path, old, new)
    with pytest.raises(SpecError) as ei:
        load_spec(p)
    e = ei.value
    assert e.field == field
    assert e.file == str(p)
    needle = new.split("\n")[-1].strip()
    assert e.line == _line_of(p, needle)
    assert str(e).startswith(f"{p}:{e.line}: {field}: ")
    assert "\n" not in str(e)
    import re

    assert re.search(message, str(e))


def test_missing_required_field(tmp_path):
    p = _variant(tmp_path, "    rows: 128\n", "")
    with pytest.raises(SpecError, match=r"compute\.array\.rows: missing required field"):
        load_spec(p)


def test_malformed_yaml_names_the_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("schema_version: 1\nname: [unclosed\nclock_ghz: 1\n")
    with pytest.raises(SpecError, match=rf"^{p}:\d+: malformed YAML"):
        load_spec(p)


def test_not_a_mapping_and_missing_file(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="a spec must be a YAML mapping"):
        load_spec(p)
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "absent.yaml")
    with pytest.raises(SpecError, match="unknown device spec 'nope'"):
        load_spec("nope")


def test_yaml_is_never_evaluated(tmp_path):
    p = _variant(tmp_path, "name: wia-npu", "name: !!python/object/apply:os.system ['true']")
    with pytest.raises(SpecError, match="malformed YAML"):
        load_spec(p)


def test_open_device_with_overrides_is_the_seed_ctx():
    ctx = wia_hw.open_device("wia-npu", overrides={"compute.array.rows": 64})
    assert ctx.spec.compute.array.rows == 64
    with pytest.raises(SpecError, match="is a cluster spec"):
        wia_hw.open_device("wia-cluster-8")


def test_spec_roundtrip_through_mapping():
    from wia_hw.emulator.config import to_mapping

    s = load_spec("wia-edge")
    assert load_spec(to_mapping(s)) == s


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("compute.cores", 10**20, r"compute.cores: must be at most 4,096"),
        ("memory.hbm.channels", 10**6, r"memory.hbm.channels: must be at most 4,096"),
        (
            "memory.hbm.bandwidth_gbs",
            1e-300,
            r"memory.hbm.bandwidth_gbs: must be at least 1e-06 GB/s",
        ),
        ("memory.l2.bandwidth_gbs", 1e-12, r"memory.l2.bandwidth_gbs: must be at least 1e-06"),
        ("clock_ghz", 1e-300, r"clock_ghz: must be at least 1e-06 GHz"),
        ("clock_ghz", 5000.0, r"clock_ghz: must be at most 1,000 \(1 THz"),
        ("compute.array.rows", 10**11, r"compute.array.rows: must be at most 4,096"),
        ("compute.arrays_per_core", 10**12, r"compute.arrays_per_core: must be at most 4,096"),
        ("memory.hbm.size_gib", 1e300, r"memory.hbm.size_gib: must be at most 1,000,000,000,000"),
        ("thermal.capacitance_j_per_c", 1e300, r"thermal.capacitance_j_per_c: must be at most"),
        ("thermal.initial_c", 1e6, r"thermal.initial_c: must be at most 1000 °C"),
        ("energy.pj_per_byte.hbm", float("inf"), r"energy.pj_per_byte.hbm: must be a non-neg"),
        ("energy.pj_per_mac.fp16", float("nan"), r"energy.pj_per_mac.fp16: must be a non-neg"),
        (
            "compute.vector.cycles_per_element.softmax",
            1e300,
            r"compute.vector.cycles_per_element.softmax: must be a non-negative number at most",
        ),
    ],
)
def test_values_that_would_exhaust_the_machine_are_refused_at_load(field, value, match):
    """A hostile or mistyped spec gets a one-line error at load, not a hang or a crash."""
    with pytest.raises(SpecError, match=match):
        load_spec("wia-npu", {field: value})


def test_a_block_size_too_small_for_the_workload_names_the_tensor():
    with pytest.raises(SpecError, match=r"tensor '.*' \(.*\) would be [\d,]+ blocks of 1 B"):
        wia_hw.run(
            "bert-base", seq=16, batch=1, device=load_spec("wia-npu", {"memory.block_bytes": 1})
        )


def test_dma_fields_past_what_changes_anything_cost_nothing():
    """More than 2 loads in flight or more engines than loads + 1 change no cycle (a load
    waits for its double-buffered operand slot), so huge values run as fast as those."""
    base = wia_hw.run(
        "bert-base",
        seq=16,
        batch=1,
        device=load_spec("wia-npu", {"dma.loads_in_flight": 2, "dma.engines_per_core": 3}),
    )
    huge = wia_hw.run(
        "bert-base",
        seq=16,
        batch=1,
        device=load_spec("wia-npu", {"dma.loads_in_flight": 10**8, "dma.engines_per_core": 10**8}),
    )
    assert huge.cycles == base.cycles and huge.to_dict()["kernels"] == base.to_dict()["kernels"]


def test_spec_names_print_as_written_and_refuse_control_characters(tmp_path):
    """A name is printed in every header: rich markup in it is printed literally (a
    '[/bold]' crashed `wia-hw run`), and a terminal escape is refused at load."""
    from click.testing import CliRunner

    from wia_hw.cli import cli

    text = (Path(__file__).resolve().parent.parent / "specs" / "wia-edge.yaml").read_text()
    p = tmp_path / "m.yaml"
    p.write_text(text.replace("name: wia-edge", 'name: "[/bold]x[red]"'))
    res = CliRunner().invoke(
        cli, ["run", "gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64", "-d", str(p)]
    )
    assert res.exit_code == 0, res.output
    assert "on [/bold]x[red], fp16" in res.output.splitlines()[0]
    p.write_text(text.replace("name: wia-edge", 'name: "\\e[31mred"'))
    with pytest.raises(SpecError, match=r"name: must be printable text without control"):
        load_spec(p)
