"""Energy, power and temperature fixes.

- A training iteration's power counts each kernel's own energy (over the cycles the
  schedule gives it), not its timing run's final write-back as well, so power x
  iteration time = the kernels' energy + static power over the rest of the iteration.
- A YAML extension that states its MACs' ``energy_pj`` keeps the vector energy of its
  fused tail: stating the documented default changes no number.
- A run whose die passes the throttle point and whose throttled power would hold it
  above it warns (``ThermalWarning``), once per excursion; a cool run does not.
- ``peak_temperature_c`` is never below the run's start temperature (runs and profiles).
- The timeline's power counter covers the whole session: its integral is the session's
  energy (kernels, write-backs, idle time at static power).
- ``wia-hw specs show CLUSTER`` labels its figures per device and adds the totals.
"""

from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner
from wia_hw.emulator.power import ThermalWarning

import wia_hw
from wia_hw.cli import cli
from wia_hw.graph import Graph, Op, Tensor
from wia_hw.profiling import _timeline
from wia_hw.report._run import _profile_view
from wia_hw.runtime import Context
from wia_hw.train import TrainingThermalWarning


def _ring(device: str, n: int = 4) -> dict:
    return dict(
        schema_version=1,
        name=f"{device}-{n}",
        devices=n,
        device=device,
        links=dict(topology="ring", bandwidth_gbs=100, latency_us=2.0),
    )


# -- 1. training power: the kernels' own energy --------------------------------------
class _OpRecords:
    """Observer keeping the probe op's kernel records and its cycles."""

    wants_trace = False

    def __init__(self) -> None:
        self.records: list = []
        self.cycles = 0
        self._t0 = 0

    def run_begin(self, ctx, graph, lowered) -> None:
        pass

    def op_begin(self, op, kernels, cycle) -> None:
        self._t0 = cycle

    def op_end(self, op, records, cycle) -> None:
        self.records = list(records)
        self.cycles = cycle - self._t0

    def run_end(self, result, trace) -> None:
        pass


def _own_energy_j(spec, k) -> float:
    """A training kernel's energy over its own cycles, measured independently: its
    kernels' energies (plus static power over any gap between them inside the op)."""
    tensors, ins = [], []
    for j, (s, d) in enumerate(k.inputs):
        tensors.append(Tensor(f"in{j}", s, d, "input"))
        ins.append(f"in{j}")
    tensors.append(Tensor("out", k.output[0], k.output[1]))
    op = Op("k", k.kind, tuple(ins), ("out",), k.phase, dict(k.attrs))
    ctx = Context(spec)
    obs = _OpRecords()
    ctx.observers.append(obs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ThermalWarning)
        ctx.run(Graph(k.name, tensors, [op], validate=False))
    gap = obs.cycles - sum(r.cycles for r in obs.records)
    assert gap >= 0
    return (
        sum(r.counters.energy_pj for r in obs.records) * 1e-12
        + spec.static_power_w * gap / spec.clock_hz
    )


def test_training_power_is_kernel_energy_plus_static_power_over_the_rest():
    res = wia_hw.train_iteration("bert-base", cluster=_ring("wia-npu"), batch=2, seq=32, layers=1)
    spec = res.comm.device
    hz = res.clock_ghz * 1e9
    iter_s = (res.end_cycle - res.start_cycle) / hz
    busy_s = (res.forward_cycles + res.backward_cycles + res.optimizer_cycles) / hz
    ks = res.kernels.forward + res.kernels.backward + res.kernels.optimizer
    own: dict = {}
    for k in ks:
        if k.signature not in own:
            own[k.signature] = _own_energy_j(spec, k)
    kernels_j = sum(own[k.signature] for k in ks)
    expected_j = kernels_j + spec.static_power_w * (iter_s - busy_s)
    assert iter_s > busy_s > 0
    assert res.mean_power_w * iter_s == pytest.approx(expected_j, rel=1e-9)
    th = spec.thermal
    assert res.sustained_temperature_c == pytest.approx(
        th.ambient_c + res.mean_power_w * th.resistance_c_per_w
    )


# -- 2. a YAML cost's energy_pj keeps its fused tail's vector energy -------------------
_MANIFEST = """schema_version: 1
extension_id: {id}
version: "1.0"
operations:
  - name: linear_gelu
    claims: [linear]
    compose: [matmul, gelu]
    cost: {{cycles: "ceil(B*M*N*K / (array_rows*array_cols*rate))"{energy}}}
"""


def _ext_run(tmp_path, ext_id: str, energy: str | None):
    path = tmp_path / f"{ext_id}.yaml"
    e = "" if energy is None else f', energy_pj: "{energy}"'
    path.write_text(_MANIFEST.format(id=ext_id, energy=e))
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, str(path))
    r = ctx.run("bert-base", batch=2, seq=32, layers=1)
    fused = [k for k in r.kernels if k.name.endswith("+gelu")]
    assert fused and all(k.counters.vector_flops > 0 for k in fused)
    return r, fused


def test_stating_the_default_energy_pj_changes_no_number(tmp_path):
    assert wia_hw.load_spec("wia-npu").energy.pj_per_mac["fp16"] == 1.0
    plain, fused_plain = _ext_run(tmp_path, "lg_plain", None)
    stated, fused_stated = _ext_run(tmp_path, "lg_stated", "B*M*N*K*1.0")
    assert stated.energy_j == plain.energy_j
    assert [k.counters.energy_pj for k in fused_stated] == [
        k.counters.energy_pj for k in fused_plain
    ]
    # twice the MAC energy adds exactly the MACs' energy once more, nothing else
    double, fused_double = _ext_run(tmp_path, "lg_double", "B*M*N*K*2.0")
    macs = sum(k.counters.macs for k in fused_double)
    assert macs > 0
    assert (double.energy_j - plain.energy_j) * 1e12 == pytest.approx(macs * 1.0, rel=1e-9)


# -- 3. thermal runaway warns ------------------------------------------------------------
HOT = {"thermal.capacitance_j_per_c": 0.001}  # wia-npu-passive, R x C = 2.3 ms
GEMM = dict(M=2048, N=2048, K=2048)


def _thermal_warnings(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn()
    return out, [w for w in got if issubclass(w.category, ThermalWarning)]


def test_thermal_runaway_warns_with_peak_throttle_point_and_settling_temperature():
    r, got = _thermal_warnings(
        lambda: wia_hw.run("gemm", device="wia-npu-passive", overrides=HOT, **GEMM)
    )
    th = r.spec.thermal
    assert r.peak_temperature_c > th.throttle_c
    hot = [k.record for k in r.kernels if k.record.frequency_factor < 1.0]
    assert hot
    power = (
        sum(k.counters.energy_pj for k in hot)
        * 1e-12
        / (sum(k.cycles for k in hot) / r.spec.clock_hz)
    )
    settle = th.ambient_c + power * th.resistance_c_per_w
    assert settle > th.throttle_c
    assert len(got) == 1
    msg = str(got[0].message)
    assert "\n" not in msg
    assert f"peaked at {r.peak_temperature_c:.1f} \N{DEGREE SIGN}C" in msg
    assert f"throttle point ({th.throttle_c:g} \N{DEGREE SIGN}C)" in msg
    assert f"at {power:.1f} W" in msg and f"settle at {settle:.1f} \N{DEGREE SIGN}C" in msg
    assert "throttle deeper or shut down" in msg and "not physical" in msg
    assert issubclass(TrainingThermalWarning, ThermalWarning)


@pytest.mark.parametrize(
    "device, overrides, workload, kw",
    [
        ("wia-npu", {}, "gemm", GEMM),
        ("wia-npu", {}, "bert-base", dict(batch=8, seq=128)),
        # starts above the throttle point but the throttled power holds it (it cools)
        ("wia-npu", {"thermal.initial_c": 120}, "gemm", GEMM),
    ],
)
def test_no_thermal_warning_when_the_die_is_held(device, overrides, workload, kw):
    r, got = _thermal_warnings(
        lambda: wia_hw.run(workload, device=device, overrides=overrides, **kw)
    )
    assert got == []
    if overrides:
        assert r.peak_temperature_c == 120  # its start
        assert r.kernels[-1].record.temperature_c < 120


def test_thermal_warning_once_per_excursion():
    ctx = wia_hw.open_device("wia-npu-passive", overrides=HOT)

    def three_runs():
        return [ctx.run("gemm", **GEMM) for _ in range(3)]

    runs, got = _thermal_warnings(three_runs)
    assert all(r.peak_temperature_c > 95 for r in runs)
    assert len(got) == 1  # the later runs start above the throttle point: same excursion
    ctx.device.thermal.temperature_c = 94.0  # cooled below it: a new excursion warns again
    _, again = _thermal_warnings(lambda: ctx.run("gemm", **GEMM))
    assert len(again) == 1


# -- 4. the peak is never below the start ------------------------------------------------
def test_peak_temperature_includes_the_start_temperature():
    ov = {"thermal.initial_c": 80}
    r = wia_hw.run("gemm", device="wia-edge", overrides=ov, M=512, N=512, K=512)
    ends = [k.record.temperature_c for k in r.kernels]
    assert max(ends) < 80  # the die cools from its start
    assert r.peak_temperature_c == 80
    ctx = wia_hw.open_device("wia-edge", overrides=ov)
    with wia_hw.start_profiling(ctx, wia_hw.ProfilingConfig(mode="instrumentation")) as s:
        ctx.run("gemm", M=512, N=512, K=512)
    figs = {f[0]: f[2] for f in _profile_view(s.report.to_dict())["figures"]}
    assert figs["peak_temperature_c"] == 80


# -- 5. the timeline's power covers the session ------------------------------------------
def _power_integral_j(trace: dict) -> tuple[float, list]:
    pw = sorted(
        (e["ts"], e["args"]["power"])
        for e in trace["traceEvents"]
        if e.get("ph") == "C" and e.get("name") == "power (W)"
    )
    return sum((b[0] - a[0]) * 1e-6 * a[1] for a, b in zip(pw, pw[1:], strict=False)), pw


def test_timeline_power_integral_is_the_session_energy():
    ctx = wia_hw.open_device("wia-npu")
    with wia_hw.start_profiling(ctx, wia_hw.ProfilingConfig(mode="instrumentation")) as s:
        ctx.run("gemm", M=1024, N=1024, K=1024)
        buf = ctx.allocate(64 << 20)  # the device idles while the allocator maps a segment
        ctx.free(buf)
        ctx.run("bert-base", batch=1, seq=32, layers=1)
    rep = s.report
    assert all(r.writeback_cycles > 0 for r in rep.runs)
    energy_j = rep.counters.energy_pj * 1e-12
    trace = json.loads(json.dumps(rep.chrome_trace()))
    got, pw = _power_integral_j(trace)
    assert got == pytest.approx(energy_j, rel=1e-6)
    us = 1.0 / (rep.device.clock_ghz * 1e3)
    assert pw[-1] == (pytest.approx(rep.cycles * us, abs=1e-3), 0.0)  # the session's end
    steps = _timeline.power_steps(rep)
    # between the runs the device only idles: static power
    gap = (rep.runs[0].end_cycle, rep.runs[1].start_cycle)
    assert gap[1] > gap[0]
    idle = [w for c, w in steps if gap[0] <= c < gap[1]]
    assert idle == [pytest.approx(ctx.spec.static_power_w, rel=1e-12)]
    # a write-back draws static power and its bytes' energy
    tail = [w for c, w in steps if c == rep.runs[1].end_cycle - rep.runs[1].writeback_cycles]
    assert tail and tail[0] > ctx.spec.static_power_w
    # exact in cycles, before the timeline's rounding to 0.1 ns
    hz = rep.device.clock_ghz * 1e9
    exact = sum((b[0] - a[0]) / hz * a[1] for a, b in zip(steps, steps[1:], strict=False))
    assert exact == pytest.approx(energy_j, rel=1e-12)
    # a report read back (no spec, so no static power) still integrates to its energy
    back = wia_hw.ProfilingReport.from_dict(json.loads(rep.to_json()))
    got_back, _ = _power_integral_j(back.chrome_trace())
    assert got_back == pytest.approx(energy_j, rel=1e-6)


# -- 6. specs show of a cluster ----------------------------------------------------------
def test_specs_show_cluster_labels_per_device_figures_and_gives_totals():
    out = CliRunner().invoke(cli, ["specs", "show", "wia-cluster-8"])
    assert out.exit_code == 0, out.output
    c = wia_hw.load_spec("wia-cluster-8")
    d, n = c.device, c.devices
    lines = out.output.splitlines()
    assert f"# derived, per device (each of the {n} {d.name} devices of {c.name}):" in lines
    assert "# derived:" not in lines
    assert f"#   static power: {d.static_power_w:.2f} W (leakage and DRAM background)" in lines
    assert f"# derived, cluster {c.name} ({n} devices, totals):" in lines
    assert (
        f"#   static power: {n * d.static_power_w:.2f} W ({n} x {d.static_power_w:.2f} W)" in lines
    )
    assert (
        f"#   peak fp16: {n * d.peak_flops('fp16') / 1e12:.2f} TFLOPS "
        f"({n} x {d.peak_flops('fp16') / 1e12:.2f})" in lines
    )
    assert f"#   HBM: {n * d.peak_bandwidth_gbs:g} GB/s ({n} x {d.peak_bandwidth_gbs:g})" in lines
    # a device's output is unchanged
    dev = CliRunner().invoke(cli, ["specs", "show", "wia-npu"])
    assert "# derived:" in dev.output.splitlines() and "totals" not in dev.output
