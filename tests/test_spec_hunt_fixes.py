"""Spec and extension validation fixes: DRAM refresh below a cycle's resolution, YAML 1.1
base-60 numbers, errors in a cluster's device file, huge integers from the Python API,
and extension cost models that claim too few MACs or no cycles."""

from __future__ import annotations

import math
import textwrap
from fractions import Fraction

import pytest
from click.testing import CliRunner
from wia_hw.emulator.counters import Counters
from wia_hw.emulator.memory import (
    MIN_REFRESH_PERIOD_CYCLES,
    MemorySystem,
    refresh_factor,
    refresh_windows,
)

import wia_hw
from wia_hw import SpecError, WorkloadError, load_extension, load_spec
from wia_hw.bench import BenchmarkConfig
from wia_hw.bench._variation import install
from wia_hw.cli import cli
from wia_hw.spec import parse_override, spec_path

SHIPPED = ("wia-npu", "wia-npu-passive", "wia-edge", "tpu-v1", "a100-systolic")


def _refresh(trefi_ns, trfc_ns, device="wia-npu"):
    return load_spec(
        device,
        {"memory.hbm.refresh_interval_ns": trefi_ns, "memory.hbm.refresh_cycle_ns": trfc_ns},
    )


# -- 1. DRAM refresh finer than a cycle ------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_specs_keep_their_whole_cycle_refresh_factor(name):
    s = load_spec(name)
    h = s.memory.hbm
    trefi = math.ceil(h.refresh_interval_ns * s.clock_ghz)
    trfc = min(math.ceil(h.refresh_cycle_ns * s.clock_ghz), trefi - 1)
    assert trefi >= MIN_REFRESH_PERIOD_CYCLES
    assert refresh_factor(s) == 1 - Fraction(trfc, trefi)


@pytest.mark.parametrize(("trefi_ns", "trfc_ns"), [(1.0, 0.9), (2.0, 1.8), (0.5, 0.05), (100, 90)])
def test_sub_cycle_refresh_keeps_its_share(trefi_ns, trfc_ns):
    # a tREFI of fewer than MIN_REFRESH_PERIOD_CYCLES cycles was rounded to whole cycles:
    # 1 ns / 0.9 ns on a 0.977 GHz clock gave 1 and 0 cycles, no refresh at all
    share = 1 - refresh_factor(_refresh(trefi_ns, trfc_ns))
    assert share == pytest.approx(trfc_ns / trefi_ns, abs=1 / MIN_REFRESH_PERIOD_CYCLES)
    t, r = refresh_windows(trefi_ns, trfc_ns, 0.9765625)
    assert 0 < r < t and t >= MIN_REFRESH_PERIOD_CYCLES


def test_refresh_share_is_monotone_in_both_timings():
    clock = 1.0
    shares = [
        Fraction(r, t)
        for trfc in (0.01, 0.3, 0.5, 0.9, 0.99, 1.5, 9.0, 90.0, 260.0, 899.0, 1023.0)
        for t, r in [refresh_windows(1024.0, trfc, clock)]
    ]
    assert shares == sorted(shares)
    # a shorter tREFI at the same tRFC is never less refresh, across the 1024-cycle
    # boundary where the rounding changes
    prev = Fraction(0)
    for trefi in (5000.0, 2048.0, 1100.0, 1025.0, 1024.5, 1024.0, 1023.9, 1000.0, 300.0, 100.0):
        t, r = refresh_windows(trefi, 99.5, clock)
        assert Fraction(r, t) >= prev, trefi
        prev = Fraction(r, t)


def _gemv_cycles(overrides):
    # M=1: every weight streams from HBM once, the kernel is HBM-bound
    return wia_hw.run("gemm", device="wia-npu", overrides=overrides, M=1, N=4096, K=4096).cycles


def test_ninety_percent_refresh_makes_an_hbm_bound_kernel_about_ten_times_slower():
    off = _gemv_cycles({"memory.hbm.refresh_interval_ns": 0, "memory.hbm.refresh_cycle_ns": 0})
    times = []
    for trefi in (1.0, 2.0):  # the hunter's cases: sub-cycle and two-cycle tREFI
        heavy = _gemv_cycles(
            {"memory.hbm.refresh_interval_ns": trefi, "memory.hbm.refresh_cycle_ns": 0.9 * trefi}
        )
        # HBM time x 1 / (1 - 0.9) = 10; the fixed latency and compute do not grow
        assert 7 < heavy / off <= 10, (trefi, heavy, off)
        times.append(heavy)
    assert times[0] == times[1]  # the same share, the same time
    # monotone: more refresh is never faster
    runs = [
        _gemv_cycles({"memory.hbm.refresh_interval_ns": 1.0, "memory.hbm.refresh_cycle_ns": x})
        for x in (0.1, 0.5, 0.9)
    ]
    assert off < runs[0] < runs[1] < runs[2]


def test_refresh_windows_of_the_benchmark_keep_the_share():
    spec = _refresh(1.0, 0.9)
    mem = MemorySystem(spec, Counters())
    cfg = BenchmarkConfig(variation_sources=("dram_refresh",), variation_seed=1)
    ports = install(mem, cfg, spec)
    assert ports
    for p in ports:
        assert Fraction(p.refresh_cycles, p.refresh_interval) == pytest.approx(0.9, abs=1e-3)


def test_refresh_cycle_at_or_above_interval_is_refused():
    with pytest.raises(SpecError, match=r"memory\.hbm\.refresh_cycle_ns: must be below"):
        _refresh(1.0, 1.0)


# -- 2. YAML 1.1 base-60 numbers -------------------------------------------------------


def test_base60_integer_in_a_spec_file_is_a_type_error(tmp_path):
    text = (spec_path("wia-npu")).read_text()
    assert "  cores: 4\n" in text
    p = tmp_path / "s.yaml"
    p.write_text(text.replace("  cores: 4\n", "  cores: 4:00\n", 1))
    line = p.read_text().splitlines().index("  cores: 4:00") + 1
    with pytest.raises(
        SpecError, match=rf"s\.yaml:{line}: compute\.cores: must be an integer, got '4:00'"
    ):
        load_spec(p)


@pytest.mark.parametrize("raw", ["1:30", "1:30.5", "-2:00", "12:34:56"])
def test_base60_set_values_read_as_text(raw):
    assert parse_override(f"compute.cores={raw}") == ("compute.cores", raw)
    with pytest.raises(SpecError, match=r"compute\.cores: must be an integer"):
        load_spec("wia-npu", {"compute.cores": parse_override(f"compute.cores={raw}")[1]})


def test_set_base60_cores_on_the_command_line_is_refused():
    r = CliRunner().invoke(
        cli,
        ["run", "gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64", "--set", "compute.cores=1:30"],
    )
    assert r.exit_code != 0
    assert "compute.cores: must be an integer, got '1:30'" in r.output


def test_explicitly_tagged_base60_is_refused():
    from wia_hw._yaml import load_yaml_text

    with pytest.raises(SpecError, match=r"x:1: base-60 number '1:30'"):
        load_yaml_text("!!int 1:30", "x")
    with pytest.raises(SpecError, match=r"x:1: base-60 number '1:30\.5'"):
        load_yaml_text("!!float 1:30.5", "x")


def test_other_numbers_still_read_as_before():
    from wia_hw._yaml import load_yaml_text

    assert load_yaml_text("a: [90, 0x1f, 1_000, 1.5, 1e-9, .inf, 3900]", "x") == {
        "a": [90, 31, 1000, 1.5, 1e-9, math.inf, 3900]
    }


# -- 3. an error in a cluster's device file --------------------------------------------


def test_error_in_a_clusters_device_file_names_that_file_and_line(tmp_path):
    text = (spec_path("wia-npu")).read_text()
    dev = tmp_path / "dev.yaml"
    dev.write_text(text.replace("clock_ghz: 0.9765625", "clock_ghz: .nan", 1))
    line = next(i for i, s in enumerate(dev.read_text().splitlines(), 1) if "clock_ghz:" in s)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "schema_version: 1\nname: c\ndevices: 8\ndevice: dev.yaml\n"
        "links:\n  bandwidth_gbs: 100\n  topology: ring\n"
    )
    with pytest.raises(SpecError) as e:
        load_spec(cluster)
    assert e.value.file == str(dev)
    assert e.value.line == line
    assert e.value.field == "clock_ghz"
    assert str(e.value).startswith(f"{dev}:{line}: clock_ghz: must be a positive number")
    assert f"(device of {cluster})" in str(e.value)


# -- 4. huge integers from the Python API ----------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("clock_ghz", 10**400),
        ("clock_ghz", -(10**400)),
        ("clock_ghz", 10**5000),
        ("memory.hbm.latency_ns", 10**400),
        ("thermal.ambient_c", 10**400),
        ("thermal.initial_c", -(10**5000)),
        ("energy.pj_per_mac.fp16", 10**400),
    ],
    ids=["clock", "negative-clock", "clock-past-str-limit", "latency", "ambient", "initial", "pj"],
)
def test_huge_integer_overrides_are_spec_errors(field, value):
    with pytest.raises(SpecError, match=rf"override: {field}: .*integer of about [\d,]+ digits"):
        load_spec("wia-npu", {field: value})


def test_run_with_a_huge_clock_is_a_spec_error():
    with pytest.raises(SpecError, match=r"clock_ghz: must be at most"):
        wia_hw.run("gemm", device="wia-npu", overrides={"clock_ghz": 10**400}, M=64, N=64, K=64)


# -- 5. extension cost models that claim too few MACs or no cycles ---------------------

HEAD = """\
schema_version: 1
extension_id: tst
version: "1.0"
{caps}parameters:
  s: {{type: float, default: 1.0, min: 0, max: 2}}
operations:
  - name: free_mm
    claims: [matmul, linear]
    compose: [matmul]
    cost: {{cycles: "{cycles}", macs: "{macs}"}}
"""
AT_PEAK = "ceil(B * M * N * K / (array_rows * array_cols * rate))"


def _manifest(tmp_path, cycles, macs, caps=""):
    p = tmp_path / "tst.yaml"
    p.write_text(textwrap.dedent(HEAD.format(cycles=cycles, macs=macs, caps=caps)))
    return p


def test_zero_macs_is_refused_at_validate(tmp_path):
    p = _manifest(tmp_path, "1", "0")
    with pytest.raises(
        SpecError,
        match=r"tst\.yaml:10: operations\.0\.cost\.macs: tst\.free_mm: cost model executes 0 "
        r"MACs on tile .*fewer than [\d,]+ = B\*M\*N\*K",
    ):
        load_extension(p)
    r = CliRunner().invoke(cli, ["ext", "validate", str(p)])
    assert r.exit_code != 0 and "operations.0.cost.macs" in r.output


def test_macs_below_the_dense_count_need_structured_sparsity(tmp_path):
    # half the MACs at the dense peak's cycles: a 2x speed-up over the peak
    half = f"ceil({AT_PEAK} / 2)"
    with pytest.raises(SpecError, match=r"operations\.0\.cost\.macs: .*structured_sparsity"):
        load_extension(_manifest(tmp_path, half, "B * M * N * ceil(K / 2)"))
    ok = load_extension(
        _manifest(
            tmp_path, half, "B * M * N * ceil(K / 2)", caps="capabilities: [structured_sparsity]\n"
        )
    )
    assert ok.id == "tst"
    # a sparse unit still takes one MAC per output element
    with pytest.raises(SpecError, match=r"fewer than [\d,]+ = B\*M\*N, one per output element"):
        load_extension(
            _manifest(tmp_path, "1", "B * M * N - 1", caps="capabilities: [structured_sparsity]\n")
        )


def test_an_extension_cannot_beat_the_peak_by_claiming_few_macs_at_run_time(tmp_path):
    # valid at the default s=1; s=0 claims no MACs, refused per tile when it runs
    p = _manifest(tmp_path, AT_PEAK, "B * M * N * K * s")
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, load_extension(p))
    r = ctx.run("gemm", M=512, N=512, K=512)
    peak = 2 * float(ctx.spec.peak_macs_per_cycle("fp16"))
    assert r.flops / r.cycles <= peak * (1 + 1e-9)
    ctx2 = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx2, load_extension(p).with_parameters(s=0))
    with pytest.raises(WorkloadError, match=r"cost model executes 0 MACs"):
        ctx2.run("gemm", M=512, N=512, K=512)


def test_zero_cycles_is_refused_at_validate_with_the_run_message(tmp_path):
    with pytest.raises(
        SpecError,
        match=r"tst\.yaml:10: operations\.0\.cost\.cycles: cost model of tst\.free_mm gave "
        r"cycles 0, macs [\d]+, energy_pj None for tile .* \(cycles must be >= 1, the others "
        r">= 0\), on the built-in device",
    ):
        load_extension(_manifest(tmp_path, "0", "B * M * N * K"))
    # the run's message is the same one (cycles 0 at s=0, after a valid default)
    p = _manifest(tmp_path, f"{AT_PEAK} * s", "B * M * N * K")
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, load_extension(p).with_parameters(s=0))
    with pytest.raises(
        WorkloadError,
        match=r"cost model of tst\.free_mm gave cycles 0\.0, macs [\d]+, energy_pj None for "
        r"tile .* \(cycles must be >= 1, the others >= 0\)",
    ):
        ctx.run("gemm", M=512, N=512, K=512)
