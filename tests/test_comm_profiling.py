"""Communication profiling (seed 8.5) and docs/COMMUNICATION.md's examples (issue #11)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw.cli import cli
from wia_hw.profiling import check_trace_events, comm_trace_events
from wia_hw.profiling._comm import interval_union, overlap_cycles


def _profile(overlapped: bool, cfg: wia_hw.CommProfilingConfig | None = None):
    comm = wia_hw.open_cluster("wia-cluster-8")
    t_ar = comm.all_reduce(nbytes=32 << 20).duration_cycles  # before the session
    s = wia_hw.start_comm_profiling(comm, cfg)
    compute = 3 * t_ar // 4
    for _ in range(3):
        if overlapped:
            w = comm.all_reduce(nbytes=32 << 20, async_op=True)
            comm.compute(None, compute)
            w.wait()
        else:
            comm.compute(None, compute)
            comm.all_reduce(nbytes=32 << 20)
    comm.send(0, 4, nbytes=1 << 20)
    return comm, wia_hw.stop_comm_profiling(s), t_ar, compute


def test_report_fields_are_derived_from_the_records():
    comm, r, t_ar, compute = _profile(overlapped=False)
    hz = comm.clock_ghz * 1e9
    ar = next(s for s in r.collective_stats if s.name == "all_reduce")
    assert ar.count == 3 and r.num_collective_types == 2
    assert ar.total_time_s == pytest.approx(3 * t_ar / hz)
    assert ar.min_time_ms == ar.max_time_ms == pytest.approx(t_ar / hz * 1e3)
    assert ar.total_data_gb == pytest.approx(3 * (32 << 20) / 1e9)
    assert ar.algbw_gbs == pytest.approx((32 << 20) / (t_ar / hz) / 1e9)
    assert ar.busbw_gbs == pytest.approx(ar.algbw_gbs * 2 * 7 / 8)
    assert ar.avg_bandwidth_gbs == ar.busbw_gbs
    # the peak: each rank of the 100 GB/s ring can send on two links, 200 GB/s
    assert ar.peak_bandwidth_gbs == pytest.approx(200.0)
    assert ar.pct_of_peak == pytest.approx(100 * ar.busbw_gbs / 200.0)
    # sequential compute then communication: nothing overlaps
    assert r.total_compute_time_s == pytest.approx(3 * compute / hz)
    send = next(s for s in r.collective_stats if s.name == "send")
    assert r.total_comm_time_s == pytest.approx(ar.total_time_s + send.total_time_s)
    assert r.overlap_efficiency == 0.0
    assert r.communication_fraction == pytest.approx(
        r.total_comm_time_s / (r.total_comm_time_s + r.total_compute_time_s)
    )
    assert r.peak_bandwidth_util == pytest.approx(ar.busbw_gbs / 200.0)
    assert send.peak_bandwidth_gbs == pytest.approx(100.0)  # a send: its path's slowest link
    assert r.min_bandwidth_util == pytest.approx(min(ar.busbw_gbs / 200.0, send.busbw_gbs / 100.0))
    assert r.min_bandwidth_util <= r.avg_bandwidth_util <= r.peak_bandwidth_util
    assert "Overlap Efficiency: 0.0%" in r.summary()


def test_overlap_efficiency_is_compute_during_comm_over_comm():
    comm, r, t_ar, compute = _profile(overlapped=True)
    _, seq, _, _ = _profile(overlapped=False)
    ar = next(s for s in r.collective_stats if s.name == "all_reduce")
    send = next(s for s in r.collective_stats if s.name == "send")
    # each all-reduce hides `compute` cycles of compute; the send hides none
    hz = comm.clock_ghz * 1e9
    assert r.overlap_efficiency == pytest.approx(
        3 * compute / hz / (ar.total_time_s + send.total_time_s)
    )
    assert r.overlap_efficiency > seq.overlap_efficiency
    assert r.duration_s < seq.duration_s


def test_interval_helpers():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = [(int(s), int(s + d)) for s, d in rng.integers(0, 100, (8, 2))]
        b = [(int(s), int(s + d)) for s, d in rng.integers(0, 100, (8, 2))]
        ua, ub = interval_union(a), interval_union(b)
        cover_a = {t for s, e in a for t in range(s, e)}
        cover_b = {t for s, e in b for t in range(s, e)}
        assert sum(e - s for s, e in ua) == len(cover_a)
        assert overlap_cycles(ua, ub) == len(cover_a & cover_b)


def test_link_tracks_bytes_and_trace():
    comm, r, _, _ = _profile(overlapped=True)
    linked = sum(sum(rec.link_bytes.values()) for rec in r.records)
    assert sum(nb for *_, nb in r.link_events) == linked
    assert set(r.link_utilization) == set(comm.link_names())
    assert all(0.0 <= u <= 1.0 for u in r.link_utilization.values())
    assert r.link_utilization["0->1"] > 0 and r.link_utilization["1->0"] == 0.0
    trace = r.chrome_trace()
    assert check_trace_events(trace) == []
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"rank 0 compute", "rank 7 comm", "link 0->1", "link 7->0"} <= names
    json.dumps(trace)
    # the same events under another pid merge into a device timeline
    assert {e["pid"] for e in comm_trace_events(r, pid=5)} == {5}


def test_config_switches():
    cfg = wia_hw.CommProfilingConfig(track_p2p=False, track_bandwidth=False, track_overlap=False)
    _, r, _, _ = _profile(overlapped=True, cfg=cfg)
    assert [s.name for s in r.collective_stats] == ["all_reduce"]
    assert r.link_events == [] and r.link_utilization == {}
    assert r.total_compute_time_s is None and r.overlap_efficiency is None
    with pytest.raises(TypeError, match="track_p2p must be a bool"):
        wia_hw.CommProfilingConfig(track_p2p=1)
    with pytest.raises(TypeError, match="start_comm_profiling needs a Communicator"):
        wia_hw.start_comm_profiling("wia-cluster-8")
    comm = wia_hw.open_cluster("wia-cluster-8")
    s = wia_hw.start_comm_profiling(comm)
    wia_hw.stop_comm_profiling(s)
    with pytest.raises(RuntimeError, match="already stopped"):
        wia_hw.stop_comm_profiling(s)
    assert comm.links.record is False and comm.listeners == []


def test_plot_comm_timeline(tmp_path):
    pytest.importorskip("matplotlib")
    _, r, _, _ = _profile(overlapped=True)
    out = wia_hw.plot_comm_timeline(r, tmp_path / "comm_timeline.png")
    assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_books_a_workload_as_compute():
    comm = wia_hw.open_cluster("wia-cluster-8")
    want = wia_hw.run("gemm", M=64, N=64, K=64, device=comm.device).cycles
    recs = comm.run(2, "gemm", M=64, N=64, K=64)
    assert [(c.rank, c.end_cycle - c.start_cycle) for c in recs] == [(2, want)]


# -- the CLI -------------------------------------------------------------------------------


def test_cli_collectives_table():
    res = CliRunner().invoke(
        cli, ["collectives", "--op", "all_reduce", "--min", "1K", "--max", "64M"]
    )
    assert res.exit_code == 0, res.output
    rows = [ln.split() for ln in res.output.splitlines() if not ln.startswith("#")]
    assert [int(r[0]) for r in rows] == [1024 << i for i in range(17)]
    comm = wia_hw.open_cluster("wia-cluster-8")
    last = comm.all_reduce(nbytes=64 << 20)
    assert float(rows[-1][3]) == pytest.approx(last.time_s * 1e6, abs=0.01)
    assert float(rows[-1][5]) == pytest.approx(last.busbw_gbs, abs=0.01)
    res = CliRunner().invoke(
        cli,
        [
            "collectives",
            "--min",
            "1M",
            "--max",
            "2M",
            "-c",
            "wia-cluster-2x8",
            "--algo",
            "hierarchical",
        ],
    )
    assert res.exit_code == 0 and res.output.count("# Avg bus bandwidth") == 5
    assert "all_reduce (algorithm hierarchical)" in res.output


@pytest.mark.parametrize(
    "args, match",
    [
        (["--min", "1X"], r"'1X' is not a size"),
        (["--min", "4K", "--max", "1K"], r"need 1 <= min <= max"),
        (["--op", "all_gather", "--algo", "tree"], r"'tree' is not an algorithm of all_gather"),
    ],
)
def test_cli_collectives_errors(args, match):
    res = CliRunner().invoke(cli, ["collectives", *args])
    assert res.exit_code == 2 and re.search(match, res.output)


def test_cli_collectives_spec_error_is_one_line():
    res = CliRunner().invoke(cli, ["collectives", "-c", "wia-npu"])
    assert res.exit_code == 2
    assert "'wia-npu' is a device spec" in res.output
