"""Profiling sessions: the four modes, the JSON report, the timeline and the flamegraph."""

from __future__ import annotations

import inspect
import json
import xml.etree.ElementTree as ET

import pytest

import wia_hw
from wia_hw.profiling import (
    SEED_COUNTERS,
    OutputFormat,
    ProfileMode,
    ProfilingConfig,
    check_trace_events,
    load_profile_report,
    parse_collapsed,
    save_profile_report,
    start_profiling,
    stop_profiling,
)

WL = ("bert-base", {"batch": 2, "seq": 64})
MODES = ["sampling", "instrumentation", "counters", "trace", "detailed"]
ALL_COUNTERS = list(wia_hw.Counter)


def _profile(mode, **cfg):
    ctx = wia_hw.open_device()
    with start_profiling(ctx, ProfilingConfig(mode=mode, **cfg)) as s:
        result = ctx.run(WL[0], **WL[1])
    return ctx, result, s.report


@pytest.mark.parametrize("mode", MODES)
def test_profiling_does_not_change_simulated_timing(mode):
    plain = wia_hw.open_device().run(WL[0], **WL[1])
    ctx, profiled, report = _profile(mode, sampling_interval_us=5.0)
    assert profiled.cycles == plain.cycles
    assert profiled.counters.to_dict() == plain.counters.to_dict()
    assert [k.cycles for k in profiled.kernels] == [k.cycles for k in plain.kernels]
    assert report.cycles == plain.cycles  # the session is the run
    assert report.overhead["simulated_cycles"] == 0


def _pct(a, b):
    return 100.0 * a / b if b else None


def test_every_number_recomputes_from_the_counters_in_the_report():
    _, _, report = _profile("detailed", hardware_counters=ALL_COUNTERS)
    d = json.loads(report.to_json())  # only what the file holds
    dev, c = d["device"], d["counters"]
    clock_hz = dev["clock_ghz"] * 1e9
    peak = {p: 2 * v for p, v in dev["peak_macs_per_cycle"].items()}
    secs = d["cycles"] / clock_hz
    s = d["summary"]
    assert s["duration_ms"] == pytest.approx(secs * 1e3)
    assert s["flops"] == c["flops"]
    assert s["achieved_tflops"] == pytest.approx(c["flops"] / secs / 1e12)
    assert s["compute_utilization"] == pytest.approx(
        100 * c["flops"] / (d["cycles"] * peak[s["precision"]])
    )
    assert s["memory_bandwidth_gbs"] == pytest.approx(c["bytes"]["hbm"] / secs / 1e9)
    assert s["l1_cache_hit_rate"] == pytest.approx(
        _pct(c["hits"]["l1"], c["hits"]["l1"] + c["misses"]["l1"])
    )
    assert s["energy_j"] == pytest.approx(c["energy_pj"] * 1e-12)
    assert s["avg_power_w"] == pytest.approx(c["energy_pj"] * 1e-12 / secs)
    # the kernels and the write-back account for the whole session, counter by counter
    ks = d["kernels"]
    wb = sum(r["writeback_cycles"] for r in d["runs"])
    assert sum(k["end_cycle"] - k["start_cycle"] for k in ks) + wb == d["cycles"]
    assert sum(k["flop_count"] for k in ks) == c["flops"]
    assert sum(k["counters"]["instructions"] for k in ks) == c["instructions"]
    assert sum(k["counters"]["misses"]["l2"] for k in ks) == c["misses"]["l2"]
    for k in ks:
        cyc = k["end_cycle"] - k["start_cycle"]
        ksecs = cyc / clock_hz
        kc, p = k["counters"], k["profile"]
        assert p["duration_ms"] == pytest.approx(ksecs * 1e3)
        assert p["compute_utilization"] == pytest.approx(
            100 * k["flop_count"] / (cyc * peak[k["precision"]])
        )
        # the kernel's own HBM traffic; the eager write-backs of earlier results apart
        own_hbm = kc["bytes"]["hbm"] - k["eager_writeback_bytes"]
        assert p["memory_bandwidth_gbs"] == pytest.approx(own_hbm / ksecs / 1e9)
        assert p["writeback_bandwidth_gbs"] == pytest.approx(
            k["eager_writeback_bytes"] / ksecs / 1e9
        )
        assert p["peak_bandwidth_gbs"] == dev["hbm_bandwidth_gbs"]
        for lvl in ("l1", "l2"):
            assert p[f"{lvl}_cache_hit_rate"] == pytest.approx(
                _pct(kc["hits"][lvl], kc["hits"][lvl] + kc["misses"][lvl])
            )
        # PE mapping counts fill and drain: the work at full rate over the cycles the
        # units are occupied issuing it (both stored with the kernel)
        uf = k["unit_floors"]
        mapping = (
            min(1.0, k["ideal_cycles"] / uf["pipeline_cycles"])
            if uf and uf["pipeline_cycles"]
            else (k["macs"] / k["slot_macs"] if k["slot_macs"] else 1.0)
        )
        balance = sum(k["core_busy_cycles"]) / (dev["cores"] * cyc)
        assert p["occupancy"] == pytest.approx(100 * mapping * balance)
        assert p["flops"] == pytest.approx(k["flop_count"] / ksecs)
        own = kc["bytes"]["hbm"] - k["eager_writeback_bytes"]  # less the eager write-backs
        assert p["bytes"]["hbm"] == own and 0 <= k["eager_writeback_bytes"] <= k["writeback_bytes"]
        if own:
            assert p["arithmetic_intensity"] == pytest.approx(k["flop_count"] / own)
        assert k["power_w"] == pytest.approx(kc["energy_pj"] * 1e-12 / ksecs)
        assert kc["cycles"] == cyc


def test_counters_mode_reads_only_the_requested_counters():
    _, _, report = _profile("counters", hardware_counters=["cycles", "flops"], capture_power=False)
    k = report.kernels[0]
    assert set(k.counters) == {"cycles", "flops", "array_flops", "vector_flops"}
    p = report.kernel_profiles()[0]
    assert p.memory_bandwidth_gbs is None and p.l1_cache_hit_rate is None
    assert p.compute_utilization >= 0 and report.ops == []  # no call graph


def test_instrumentation_records_ops_kernels_and_the_users_call_site():
    ctx = wia_hw.open_device()
    session = start_profiling(ctx, ProfilingConfig(mode="instrumentation"))
    line = inspect.currentframe().f_lineno + 1
    ctx.run(WL[0], **WL[1])
    report = stop_profiling(session)
    (run,) = report.runs
    assert run.callsite.file == __file__ and run.callsite.line == line
    assert (
        run.callsite.function == "test_instrumentation_records_ops_kernels_and_the_users_call_site"
    )
    # no hardware counters, only the energy that capture_power needs for power
    assert report.kernels and all(set(k.counters) == {"energy_pj"} for k in report.kernels)
    prev_end = run.start_cycle
    for op in report.ops:  # ops tile the run back to back
        assert op.start_cycle == prev_end
        inner = [report.kernels[i] for i in op.kernels]
        assert sum(k.cycles for k in inner) == op.end_cycle - op.start_cycle
        prev_end = op.end_cycle
    assert prev_end + run.writeback_cycles == run.end_cycle


def test_sampling_weights_cover_the_session_and_find_the_hotspot():
    ctx = wia_hw.open_device()
    interval_us = 2.0
    with start_profiling(
        ctx, ProfilingConfig(mode="sampling", sampling_interval_us=interval_us)
    ) as s:
        ctx.run(WL[0], **WL[1])
    rep = s.report
    period = round(interval_us * 1e3 * ctx.spec.clock_ghz)
    assert not rep.kernels and rep.samples
    assert [x.cycle for x in rep.samples] == [
        rep.start_cycle + i * period for i in range(len(rep.samples))
    ]
    assert sum(x.weight_cycles for x in rep.samples) == rep.cycles
    exact = {h.name: h.cycles for h in _profile("instrumentation")[2].hotspots("kernel", None)}
    top = rep.hotspots("kernel", 1)[0]
    assert not top.exact
    assert top.name == max(exact, key=exact.get) or exact[top.name] >= 0.8 * max(exact.values())
    assert abs(top.cycles - exact[top.name]) <= 3 * period
    assert any(any(x.computing) for x in rep.samples)
    assert any(x.hbm_backlog_cycles > 0 for x in rep.samples)


def test_trace_timeline_passes_the_trace_event_format_check():
    ctx, result, report = _profile("trace")
    tr = json.loads(json.dumps(report.chrome_trace()))
    assert check_trace_events(tr) == []
    names = {
        e["args"]["name"]
        for e in tr["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    cores = ctx.spec.compute.cores
    assert {f"core {c}" for c in range(cores)} <= names
    assert {f"dma{c} load" for c in range(cores)} <= names
    assert {f"hbm channel {i}" for i in range(ctx.spec.memory.hbm.channels)} <= names
    counters = {e["name"] for e in tr["traceEvents"] if e["ph"] == "C"}
    assert {
        "bandwidth (GB/s)",
        "power (W)",
        "temperature (C)",
        "cache misses (blocks)",
        "device memory (GB)",
    } <= counters
    # timestamps are microseconds of device time from the session's start
    last = max(e["ts"] + e.get("dur", 0) for e in tr["traceEvents"] if "ts" in e)
    assert last == pytest.approx(result.cycles / ctx.spec.clock_ghz / 1e3, rel=1e-6)
    n_tiles = sum(k.tiles for k in report.kernels)
    assert sum(1 for e in tr["traceEvents"] if e.get("cat") == "compute") == n_tiles


def test_trace_check_catches_overlaps_and_missing_keys():
    ok = {"name": "a", "ph": "X", "ts": 0.0, "dur": 2.0, "pid": 1, "tid": 1}
    assert check_trace_events({"traceEvents": [ok]}) == []
    bad = dict(ok, ts=1.0)
    assert (
        "starts at 1.0 us, before event 0 ends" in check_trace_events({"traceEvents": [ok, bad]})[0]
    )
    assert (
        "missing dur"
        in check_trace_events({"traceEvents": [{k: v for k, v in ok.items() if k != "dur"}]})[0]
    )
    assert check_trace_events([ok]) == ["not a JSON object with a 'traceEvents' list"]
    assert "non-negative" in check_trace_events({"traceEvents": [dict(ok, ts=-1)]})[0]


@pytest.mark.parametrize("mode", ["sampling", "instrumentation", "counters", "trace"])
def test_flamegraph_total_equals_the_profiled_time(mode):
    ctx = wia_hw.open_device()
    with start_profiling(ctx, ProfilingConfig(mode=mode)) as s:
        buf = ctx.allocate(3 << 20)  # device time outside any run
        ctx.run(WL[0], **WL[1])
        ctx.free(buf)
    rep = s.report
    stacks = parse_collapsed(rep.collapsed_stacks())
    assert sum(v for _, v in stacks) == rep.cycles
    assert rep.cycles > 0
    if mode != "sampling":
        outside = [v for f, v in stacks if f[-1] == "[outside runs]"]
        assert outside == [ctx.allocator.config.segment_alloc_cycles]
        deepest = max(stacks, key=lambda x: len(x[0]))[0]
        assert deepest[0] == ctx.spec.name and "test_flamegraph_total" in " ".join(deepest)
    svg = rep.flamegraph_svg()
    root = ET.fromstring(svg.split("\n", 1)[1])
    assert root.tag.endswith("svg") and len(root.findall(".//{*}rect")) > 5


def test_run_profile_argument_and_output_files(tmp_path):
    out = tmp_path / "profile_report.json"
    cfg = ProfilingConfig(
        mode="detailed", output_file=str(out), timeline_enabled=True, flamegraph_enabled=True
    )
    r = wia_hw.run(WL[0], profile=cfg, **WL[1])
    assert r.profile.cycles == r.cycles
    assert json.loads(out.read_text())["schema"] == "wia-hw.profile/1"
    assert (
        check_trace_events(json.loads((tmp_path / "profile_report.trace.json").read_text())) == []
    )
    folded = (tmp_path / "profile_report.folded").read_text().splitlines()
    assert sum(v for _, v in parse_collapsed(folded)) == r.cycles
    assert (tmp_path / "profile_report.svg").read_text().startswith("<?xml")


def test_save_and_load_round_trip(tmp_path):
    _, _, report = _profile("detailed")
    p = save_profile_report(report, tmp_path / "r.json")
    back = load_profile_report(p)
    assert back.to_dict() == report.to_dict()
    assert back.program is None  # kernels are not stored
    for fmt, check in [
        ("chrome_trace", lambda t: check_trace_events(json.loads(t)) == []),
        ("collapsed", lambda t: parse_collapsed(t.splitlines())),
        ("text", lambda t: t.startswith("Profile of wia-npu")),
    ]:
        q = save_profile_report(report, tmp_path / f"r.{fmt}", fmt)
        assert check(q.read_text())
    with pytest.raises(wia_hw.WiaError, match="not a wia-hw.profile/1 report"):
        (tmp_path / "x.json").write_text('{"schema": "other"}')
        load_profile_report(tmp_path / "x.json")


def test_config_names_and_errors():
    cfg = ProfilingConfig()
    assert cfg.mode is ProfileMode.DETAILED and cfg.output_format is OutputFormat.JSON
    assert cfg.hardware_counters == SEED_COUNTERS and cfg.num_counters == 6
    assert ProfilingConfig(mode="TRACE").mode is ProfileMode.TRACE
    assert ProfilingConfig(mode="hardware_counters").mode is ProfileMode.COUNTERS
    assert ProfilingConfig(output_format="perfetto").output_format is OutputFormat.CHROME_TRACE
    with pytest.raises(
        ValueError,
        match="mode must be one of detailed, sampling, "
        "instrumentation, counters, trace, got 'fast'",
    ):
        ProfilingConfig(mode="fast")
    with pytest.raises(ValueError, match="hardware_counters: unknown counter 'watts'"):
        ProfilingConfig(hardware_counters=["cycles", "watts"])
    with pytest.raises(TypeError, match="capture_power must be a bool, got 1"):
        ProfilingConfig(capture_power=1)
    with pytest.raises(ValueError, match="sampling_interval_us must be a positive number"):
        ProfilingConfig(sampling_interval_us=0)
    with pytest.raises(TypeError, match="keep_library_frames must be a bool, got 'no'"):
        ProfilingConfig(keep_library_frames="no")


def test_one_session_per_context_and_no_double_stop():
    ctx = wia_hw.open_device()
    s = start_profiling(ctx, ProfilingConfig(mode="counters"))
    with pytest.raises(wia_hw.WiaError, match="already running on this context"):
        start_profiling(ctx, ProfilingConfig())
    stop_profiling(s)
    with pytest.raises(wia_hw.WiaError, match="not running"):
        stop_profiling(s)
    with pytest.raises(TypeError, match="takes a ProfilingSession"):
        stop_profiling("session")
    assert ctx.observers == [] and ctx.device.core_state is None


def test_trace_mode_restores_the_memory_ports():
    ctx = wia_hw.open_device()
    ports = list(ctx.device.memory.channels) + [ctx.device.memory.l2_port]
    with start_profiling(ctx, ProfilingConfig(mode="trace")):
        ctx.run(WL[0], **WL[1])
    now = list(ctx.device.memory.channels) + [ctx.device.memory.l2_port]
    assert all(a is b for a, b in zip(ports, now, strict=True))
    assert max(p.free_at for p in now) > 0  # they kept the traced state
    again = ctx.run(WL[0], **WL[1])
    ref = wia_hw.open_device()
    ref.run(WL[0], **WL[1])
    assert again.cycles == ref.run(WL[0], **WL[1]).cycles


def test_text_summary_lists_hotspots():
    _, _, report = _profile("counters")
    text = report.format_text()
    assert "Hotspots:" in text and "feed_forward" in text
    hs = report.hotspots("group", None)
    assert sum(h.cycles for h in hs) == report.cycles  # the runs' write-backs included
    wb = sum(r.writeback_cycles for r in report.runs)
    assert [h.cycles for h in hs if h.name == "writeback"] == ([wb] if wb else [])


def test_cli_profile_writes_every_output(tmp_path):
    from click.testing import CliRunner

    from wia_hw.cli import cli

    files = {
        k: tmp_path / v
        for k, v in [
            ("o", "r.json"),
            ("timeline", "t.json"),
            ("flamegraph", "f.svg"),
            ("roofline", "roof.png"),
            ("memory-timeline", "mem.png"),
        ]
    }
    args = [
        "profile",
        "bert-base",
        "-b",
        "2",
        "-s",
        "64",
        "--mode",
        "trace",
        "--recommend",
        "--priority",
        "low",
        "--confidence",
        "0",
    ]
    for k, p in files.items():
        args += [f"-{k}" if len(k) == 1 else f"--{k}", str(p)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    for p in files.values():
        assert p.stat().st_size > 1000, p
    assert check_trace_events(json.loads(files["timeline"].read_text())) == []
    for heading in (
        "Hotspots:",
        "Kernel: ",
        "Roofline analysis:",
        "Memory Profile Summary:",
        "Performance Recommendations (",
        "wrote ",
    ):
        assert heading in res.output
    bad = CliRunner().invoke(cli, ["profile", "gemm", "--counters", "cycles,watts"])
    assert bad.exit_code == 2 and "unknown counter 'watts'" in bad.output


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_gives_a_valid_timeline_and_strict_json(mode):
    _, _, report = _profile(mode, sampling_interval_us=5.0)
    tr = json.loads(json.dumps(report.chrome_trace(), allow_nan=False))
    assert check_trace_events(tr) == []
    assert any(e["ph"] == "X" for e in tr["traceEvents"])
    json.loads(report.to_json())  # no NaN or infinity anywhere


def test_call_graph_counts_launches_and_inclusive_time():
    _, result, report = _profile("instrumentation")
    g = report.call_graph()
    assert g["cycles"] == report.cycles and g["calls"] == len(report.kernels)

    def walk(n):
        if n["children"]:
            assert n["cycles"] == sum(c["cycles"] for c in n["children"])
            assert n["calls"] == sum(c["calls"] for c in n["children"])
        for c in n["children"]:
            walk(c)

    walk(g)
    run = g["children"][0]
    while not run["name"].startswith("run "):
        run = run["children"][0]
    ffn = next(c for c in run["children"] if c["name"] == "feed_forward")
    assert ffn["calls"] == sum(1 for k in report.kernels if k.group == "feed_forward")


def _click_profiled(keep):
    """A run launched from a click command (third-party frames between the user's code
    and wia-hw), profiled with and without ``keep_library_frames``."""
    import click
    from click.testing import CliRunner

    out = {}

    @click.command()
    def launch():
        ctx = wia_hw.open_device()
        cfg = ProfilingConfig(mode="instrumentation", capture_memory=True, keep_library_frames=keep)
        with start_profiling(ctx, cfg) as s:
            ctx.run("bert-base", batch=1, seq=32)
        out["report"] = s.report

    res = CliRunner().invoke(launch, [])
    assert res.exit_code == 0, res.output
    return out["report"]


def test_call_sites_skip_library_and_wia_hw_frames_unless_kept():
    from wia_hw.profiling._callsite import is_library_file

    assert is_library_file(click_file := __import__("click").core.__file__)
    assert is_library_file(json.__file__) and not is_library_file(__file__)
    rep = _click_profiled(keep=False)
    (run,) = rep.runs
    assert run.stack and run.stack[0].function == "launch"
    assert all(not is_library_file(f.file) and "wia_hw" not in f.file for f in run.stack)
    stacks = rep.collapsed_stacks()
    assert not any("core.py" in line or "invoke (" in line for line in stacks)
    sites = rep.memory.top_sites
    assert sites and all(site.function == "launch" for site in sites)
    kept = _click_profiled(keep=True)
    files = {f.file for f in kept.runs[0].stack}
    assert click_file in files  # click's frames, kept on request
    assert any("invoke (core.py:" in line for line in kept.collapsed_stacks())


def test_first_sample_reads_the_device_mid_interval():
    """A sample stands for [t, t + N) and reads the device at t + N // 2: the session's
    first sample sees the first kernels, not the idle cycle before they launch."""
    ctx = wia_hw.open_device()
    cfg = ProfilingConfig(mode="sampling", sampling_interval_us=2.0)
    with start_profiling(ctx, cfg) as s:
        ctx.run("bert-base", batch=1, seq=32)
    first = s.report.samples[0]
    assert first.cycle == s.report.start_cycle
    assert any(k is not None for k in first.kernels)
    assert sum(x.weight_cycles for x in s.report.samples) == s.report.cycles


def test_run_table_aggregates_a_kernel_over_its_layers():
    import io
    import re

    from rich.console import Console

    from wia_hw.cli import print_run

    r = wia_hw.run("bert-base", batch=1, seq=32)
    buf = io.StringIO()
    print_run(r, Console(file=buf, width=200), top_kernels=10)
    rows = [ln for ln in buf.getvalue().splitlines() if "feed_forward_intermediate" in ln]
    assert len(rows) == 1  # one row, not one per layer
    ks = [k for k in r.kernels if k.name.endswith(".feed_forward_intermediate")]
    cells = [c.strip() for c in rows[0].split("│") if c.strip()]
    assert cells[0] == "feed_forward_intermediate" and cells[2] == str(len(ks)) == "12"
    total = sum(k.time_ms for k in ks)
    assert cells[3] == f"{total:.3f}" and cells[4] == f"{total / len(ks):.3f}"
    table = buf.getvalue().split("Top 10 kernels")[1]
    names = [ln.split("│")[1].strip() for ln in table.splitlines() if ln.startswith("│")]
    assert len(names) == len(set(names)) == 10  # ten different kernels
    assert all(not re.match(r"layer\d+\.", n) for n in names)


def test_cli_profile_skips_library_frames_unless_asked(tmp_path):
    from click.testing import CliRunner

    from wia_hw.cli import cli

    def stacks(*extra):
        out = tmp_path / f"f{len(extra)}.folded"
        res = CliRunner().invoke(
            cli,
            [
                "profile",
                "bert-base",
                "-b",
                "1",
                "-s",
                "32",
                "--mode",
                "instrumentation",
                "--kernels",
                "0",
                "--flamegraph",
                str(out),
                *extra,
            ],
        )
        assert res.exit_code == 0, res.output
        return out.read_text(), res.output

    text, output = stacks()
    assert "core.py" not in text and "invoke (" not in text
    assert "click/core.py" not in output  # allocation sites
    kept, _ = stacks("--keep-library-frames")
    assert "invoke (core.py:" in kept


def test_the_runs_allocations_carry_the_users_call_site():
    """The runtime's allocations inside a ``ctx.run`` take the stack the session walked
    at the run's start: the line of that ``ctx.run`` call, one per run."""
    ctx = wia_hw.open_device()
    with start_profiling(ctx, ProfilingConfig(mode="counters")) as s:
        first = inspect.currentframe().f_lineno + 1
        ctx.run("bert-base", batch=1, seq=32, layers=1)
        second = inspect.currentframe().f_lineno + 1
        ctx.run("gemm", M=64, N=64, K=64)
    sites = s.report.memory.top_sites
    lines = {(x.description.split(" of ")[-1], x.file, x.line) for x in sites}
    assert ("bert-base", __file__, first) in lines and ("gemm", __file__, second) in lines
    assert all(x.file == __file__ for x in sites)


def test_kernels_off_the_arrays_are_not_judged_as_array_kernels():
    """A matmul the photonic unit takes runs off the cores: the arrays' utilisation,
    occupancy advice and compute ceiling say nothing of it, and the session's
    utilisation counts only the cores' FLOPs."""
    ctx = wia_hw.open_device()
    wia_hw.register_device_extension(ctx, "photonic", parameters={"policy": "all"})
    with wia_hw.start_profiling(ctx, wia_hw.ProfilingConfig(mode="counters")) as s:
        ctx.run("gemm", M=256, N=256, K=256)
    rep = s.report
    (k,) = rep.kernels
    assert k.kind == "photonic"
    summary = rep.summary()
    assert summary["off_core_flops"] == k.flop_count > 0
    assert summary["compute_utilization"] == 0.0
    p = rep.kernel_profiles()[0]
    assert p.compute_utilization == 0.0
    text = "\n".join(f"{a.level}: {a.message}" for a in p.assessments)
    assert "off the arrays" in text and "occupancy" not in text and "ridge" not in text
    assert "TFLOPS more on extension units" in rep.format_text()
