"""The communication layer's review findings: profiling windows, honest peaks, ring
orders, one-line errors, bounded schedules, spec paths and training's own time."""

from __future__ import annotations

import numpy as np
import pytest

import wia_hw
from wia_hw.profiling._comm import interval_union, overlap_cycles


def _spec(n: int, topology: str, **links):
    return dict(
        schema_version=1,
        name=f"t{n}{topology}",
        devices=n,
        device="wia-npu",
        links=dict(topology=topology, bandwidth_gbs=100, latency_us=1.0, **links),
    )


# -- profiling: everything inside the session -----------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_profile_is_clipped_to_the_session(seed):
    """Work in flight when a session starts or stops counts only inside it: no link is
    busy more than the whole session, communication never outlasts it, and every record
    lies in it."""
    rng = np.random.default_rng(seed)
    comm = wia_hw.open_cluster(["wia-cluster-8", "wia-cluster-torus16"][seed % 2])
    before = comm.all_reduce(nbytes=int(rng.integers(8, 64)) << 20, async_op=True)
    comm.compute(None, int(rng.integers(1, 200_000)))  # the session starts mid-call
    s = wia_hw.start_comm_profiling(comm)
    work = [
        getattr(comm, op)(nbytes=int(rng.integers(1, 64)) << 20, async_op=True)
        for op in rng.choice(["all_reduce", "all_gather", "all_to_all"], size=3)
    ]
    comm.compute(None, int(rng.integers(1, 400_000)))  # and stops mid-call
    rep = wia_hw.stop_comm_profiling(s)
    assert max(rep.link_utilization.values()) <= 1.0
    assert rep.total_comm_time_s <= rep.duration_s + 1e-15
    for r in rep.records:
        assert rep.start_cycle <= r.start_cycle <= r.end_cycle <= rep.end_cycle
    for _, a, b, _ in rep.link_events:
        assert rep.start_cycle <= a < b <= rep.end_cycle
    before.wait()
    for w in work:
        w.wait()


# -- peaks: what a call's ranks can drive ----------------------------------------------


def _random_cluster(rng):
    kind = rng.choice(["ring", "fully_connected", "switch", "torus2d", "hierarchical", "tree"])
    n = int(rng.integers(3, 13))
    if kind == "torus2d":
        r, c = int(rng.integers(1, 5)), int(rng.integers(2, 5))
        return _spec(r * c, "torus2d", torus_dims=[r, c])
    if kind == "hierarchical":
        k, m = int(rng.integers(1, 5)), int(rng.integers(2, 4))
        return _spec(k * m, "hierarchical", devices_per_node=k, inter_node_bandwidth_gbs=25)
    if kind == "tree":  # a binary-tree graph: leaves have one link
        return _spec(n, "custom", edges=[[i, (i - 1) // 2] for i in range(1, n)])
    return _spec(n, str(kind))


@pytest.mark.parametrize("seed", range(12))
def test_no_call_beats_its_peak(seed):
    """Bus bandwidth never exceeds the call's peak (what its ranks' links can drive;
    a send's slowest link), so no percentage of peak exceeds 100%."""
    rng = np.random.default_rng(seed)
    comm = wia_hw.open_cluster(_random_cluster(rng), chunk_bytes=int(rng.integers(1, 9)) << 17)
    s = wia_hw.start_comm_profiling(comm)
    for _ in range(6):
        op = str(
            rng.choice(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"])
        )
        algo = "tree" if op == "all_reduce" and rng.random() < 0.4 else None
        size = int(rng.integers(1, 32 << 20))
        getattr(comm, op)(nbytes=size, algorithm=algo)
        a, b = rng.choice(comm.size, size=2, replace=False)
        comm.send(int(a), int(b), nbytes=size)
    rep = wia_hw.stop_comm_profiling(s)
    for r in rep.records:
        assert r.busbw_gbs <= r.peak_busbw_gbs * (1 + 1e-9), (r.name, r.algorithm)
    for st in rep.collective_stats:
        assert 0 < st.pct_of_peak <= 100.0
    assert 0 < rep.min_bandwidth_util <= rep.avg_bandwidth_util <= rep.peak_bandwidth_util <= 1


def test_peaks_that_are_reached():
    """All-to-all on fully connected links and a send on a rail reach near 100%."""
    comm = wia_hw.open_cluster(_spec(8, "fully_connected"))
    assert comm.all_to_all(nbytes=64 << 20).peak_busbw_gbs == 700
    c2 = wia_hw.open_cluster("wia-cluster-2x8")
    s = wia_hw.start_comm_profiling(c2)
    c2.send(0, 8, nbytes=64 << 20)
    send = wia_hw.stop_comm_profiling(s).collective_stats[0]
    assert send.peak_bandwidth_gbs == pytest.approx(50) and 95 < send.pct_of_peak <= 100


# -- profiling: one window for every figure ---------------------------------------------


def _clip(spans, t0, t1):
    return [(max(s, t0), min(e, t1)) for s, e in spans if min(e, t1) > max(s, t0)]


def _length(spans):
    return sum(e - s for s, e in interval_union(spans))


def _scenario(rng, cluster, start, stop):
    """Issue the same seeded calls and compute at the same cycles; start a session at
    ``start`` and stop it at ``stop`` (None: after everything has finished)."""
    comm = wia_hw.open_cluster(cluster)
    plan = []
    t = 0
    for _ in range(int(rng.integers(2, 5))):
        op = str(rng.choice(["all_reduce", "all_gather", "all_to_all", "send"]))
        plan.append((t, op, int(rng.integers(1, 24)) << 20, int(rng.integers(0, 300_000))))
        t += int(rng.integers(0, 400_000))
    acts = [(p[0], 1, p) for p in plan] + [(start, 0, None)]
    acts += [(stop, 2, None)] if stop is not None else []
    acts.sort(key=lambda a: (a[0], a[1]))
    s = rep = None
    for at, what, p in acts:
        if at > comm.now_cycles:
            comm.env.run(until=at)
        if what == 1:
            _, op, size, cyc = p
            if op == "send":
                comm.send(0, comm.size - 1, nbytes=size, async_op=True)
            else:
                getattr(comm, op)(nbytes=size, async_op=True)
            comm.compute(int(rng.integers(0, comm.size)), cyc, async_op=True)
        elif what == 0:
            s = wia_hw.start_comm_profiling(comm)
        else:
            rep = wia_hw.stop_comm_profiling(s)
    comm.synchronize()
    if rep is None:
        rep = wia_hw.stop_comm_profiling(s)
    return comm, rep


CLUSTERS = ["wia-cluster-8", "wia-cluster-torus16", _spec(8, "fully_connected")]


@pytest.mark.parametrize("seed", range(9))
def test_every_figure_counts_the_same_window(seed):
    """A session from any cycle to any cycle, calls and compute straddling either edge:
    communication time is exactly the union of every call's time clipped to the window,
    each link's busy time exactly its chunks clipped to it, compute likewise, overlap
    their intersection; the link-busy union lies inside the communication union, the
    trace draws those same intervals, and records hold the calls wholly inside."""
    cluster = CLUSTERS[seed % 3]
    ref_comm, ref = _scenario(np.random.default_rng(seed), cluster, 0, None)
    end = ref.end_cycle
    rng = np.random.default_rng(1000 + seed)
    t0 = int(rng.integers(0, end // 2))
    t1 = int(rng.integers(t0 + 1, end + end // 4))
    comm, rep = _scenario(np.random.default_rng(seed), cluster, t0, t1)
    assert (rep.start_cycle, rep.end_cycle) == (t0, t1)
    calls = [(r.start_cycle, r.end_cycle) for r in ref_comm.records]
    comm_u = interval_union(_clip(calls, t0, t1))
    assert round(rep.total_comm_time_s * comm.clock_ghz * 1e9) == _length(comm_u)
    assert interval_union((x.start_cycle, x.end_cycle) for x in rep.comm_spans) == comm_u
    comp = [(c.start_cycle, c.end_cycle) for c in ref_comm.compute_records]
    comp_u = interval_union(_clip(comp, t0, t1))
    assert round(rep.total_compute_time_s * comm.clock_ghz * 1e9) == _length(comp_u)
    if comm_u:
        assert rep.overlap_efficiency == overlap_cycles(comm_u, comp_u) / _length(comm_u)
    busy = {}
    for name, s, e, _ in ref.link_events:
        for a, b in _clip([(s, e)], t0, t1):
            busy[name] = busy.get(name, 0) + b - a
    got = {n: round(u * (t1 - t0)) for n, u in rep.link_utilization.items() if u}
    assert got == busy
    link_u = interval_union((s, e) for _, s, e, _ in rep.link_events)
    assert overlap_cycles(link_u, comm_u) == _length(link_u)  # links busy only in calls
    for _, s, e, _ in rep.link_events:
        assert t0 <= s < e <= t1
    inside = sorted((a, b) for a, b in calls if t0 <= a and b <= t1)
    assert sorted((r.start_cycle, r.end_cycle) for r in rep.records) == inside
    assert sum(st.count for st in rep.collective_stats) == len(inside)
    # the trace: comm tracks cover the communication union, link tracks the busy time
    us = 1e-3 / comm.clock_ghz
    ev = [e for e in rep.chrome_trace()["traceEvents"] if e["ph"] == "X"]
    traced = interval_union(
        (round(e["ts"] / us) + t0, round((e["ts"] + e["dur"]) / us) + t0)
        for e in ev
        if e["cat"] == "comm"
    )
    assert abs(_length(traced) - _length(comm_u)) <= len(ev)
    link_tr = sum(e["dur"] for e in ev if e["cat"] == "link")
    assert link_tr == pytest.approx(sum(busy.values()) * us, abs=1e-3 * len(ev))
    for e in ev:
        assert -1e-3 <= e["ts"] and e["ts"] + e["dur"] <= (t1 - t0) * us + 1e-3


@pytest.mark.parametrize("edge", ["inside", "start", "stop", "both"])
@pytest.mark.parametrize("seed", range(3))
def test_one_call_inside_or_straddling_an_edge(edge, seed):
    """One async call, the session inside it or around it: communication time is the
    call's time inside the session and each link's busy time its chunks' time there
    (chunks queued before the start included); the call is in records only when wholly
    inside."""
    rng = np.random.default_rng(seed)
    cluster = CLUSTERS[seed % 3]
    op = ["all_reduce", "all_to_all", "all_gather"][seed]
    size = int(rng.integers(16, 64)) << 20
    ref_comm = wia_hw.open_cluster(cluster)
    ref_s = wia_hw.start_comm_profiling(ref_comm)
    ref = getattr(ref_comm, op)(nbytes=size)
    ref_rep = wia_hw.stop_comm_profiling(ref_s)
    a, b = ref.start_cycle, ref.end_cycle
    d = b - a
    t0 = {"inside": 0, "start": int(rng.integers(1, d // 2)), "stop": 0, "both": d // 3}[edge]
    t1 = {
        "inside": b + 10,
        "start": b + 10,
        "stop": int(rng.integers(d // 2, d)),
        "both": 2 * d // 3,
    }[edge]
    comm = wia_hw.open_cluster(cluster)
    if t0:
        w = getattr(comm, op)(nbytes=size, async_op=True)
        comm.env.run(until=t0)
        s = wia_hw.start_comm_profiling(comm)
    else:
        s = wia_hw.start_comm_profiling(comm)
        w = getattr(comm, op)(nbytes=size, async_op=True)
    comm.env.run(until=t1)
    rep = wia_hw.stop_comm_profiling(s)
    w.wait()
    hz = comm.clock_ghz * 1e9
    assert round(rep.total_comm_time_s * hz) == min(b, t1) - max(a, t0)
    assert [(x.start_cycle, x.end_cycle, x.whole) for x in rep.comm_spans] == [
        (max(a, t0), min(b, t1), edge == "inside")
    ]
    assert len(rep.records) == (edge == "inside")
    # each link: exactly its chunks (from a session around the whole call) in the window
    busy = {}
    for name, x, y, _ in ref_rep.link_events:
        for lo, hi in _clip([(x, y)], t0, t1):
            busy[name] = busy.get(name, 0) + hi - lo
    assert {n: round(u * (t1 - t0)) for n, u in rep.link_utilization.items() if u} == busy
    assert max(busy.values()) > (min(b, t1) - max(a, t0)) // 2  # and that is much


# -- ring orders: one hop per step -----------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_ring_order_is_one_hop_per_step(seed):
    """Every consecutive pair of the ring order, the last back to the first too, is
    joined by a link (tori of any shape, hierarchical clusters of any node count)."""
    from wia_hw.emulator.cluster import build_topology

    from wia_hw.spec import load_spec

    rng = np.random.default_rng(seed)
    a, b = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    if a * b < 2:
        b = 2
    if seed % 2:
        spec = _spec(a * b, "torus2d", torus_dims=[a, b])
    else:
        spec = _spec(a * b, "hierarchical", devices_per_node=b, inter_node_bandwidth_gbs=50)
    topo = build_topology(load_spec(spec))
    ring = topo.ring
    assert sorted(ring) == list(range(a * b)) and ring[0] == 0
    for u, v in zip(ring, ring[1:] + ring[:1], strict=True):
        assert (u, v) in topo.links, (a, b, ring)


@pytest.mark.parametrize("dims", [(3, 4), (3, 3), (5, 3)])
def test_ring_all_reduce_on_odd_tori_meets_the_closed_form(dims):
    n = dims[0] * dims[1]
    comm = wia_hw.open_cluster(_spec(n, "torus2d", torus_dims=list(dims)))
    S, B, L = 192 << 20, 100e9, 1e-6
    t = comm.all_reduce(nbytes=S).time_s
    assert t == pytest.approx(2 * (n - 1) * (L + S / n / B), rel=0.02)


# -- bad input: one line --------------------------------------------------------------


def _one_line(fn, match):
    with pytest.raises(wia_hw.CommError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c: c.all_reduce([np.array([{}], dtype=object)] * 8), r"all_reduce: .* object"),
        (lambda c: c.all_reduce([np.array(["a"])] * 8), r"all_reduce: .* <U1; buffers must"),
        (lambda c: c.all_gather([np.array(["ab"])] * 8), r"all_gather: .* <U2"),
        (lambda c: c.send(0, 1, np.array([{}])), r"send: .* object"),
        (lambda c: c.all_reduce([np.array([True])] * 8), r"all_reduce: .* bool; a reduction"),
        (lambda c: c.reduce_scatter([np.ones(8, bool)] * 8), r"reduce_scatter: .* bool"),
        (lambda c: c.compute([], 10), r"compute: the list of ranks is empty"),
    ],
)
def test_bad_buffers_and_ranks_are_one_line(call, match):
    _one_line(lambda: call(wia_hw.open_cluster("wia-cluster-8")), match)


def test_bools_move_unchanged_and_numpy_chunk_sizes_are_accepted():
    rng = np.random.default_rng(3)
    comm = wia_hw.open_cluster("wia-cluster-8", chunk_bytes=np.int64(1024))
    assert comm.chunk_bytes == 1024 and type(comm.chunk_bytes) is int
    bufs = [rng.random(40) < 0.5 for _ in range(8)]
    out = comm.all_gather(bufs).outputs
    assert all(o.dtype == bool and (o == np.stack(bufs)).all() for o in out)
    for bad in (0, -1, 1.5, True, "1M"):
        _one_line(lambda b=bad: wia_hw.open_cluster(chunk_bytes=b), "chunk_bytes must be")


@pytest.mark.parametrize(
    "args, match",
    [
        (["--op", "all_reduce", "--max", "1K", "--chunk", "0"], "--chunk"),
        (
            [
                "--op",
                "all_reduce",
                "--min",
                "99999999999999999999G",
                "--max",
                "99999999999999999999G",
            ],
            "chunk transfers",
        ),
        (["--min", "256M", "--max", "256M", "--chunk", "1"], "lower --max or raise --chunk"),
        (["--algo", "hierarchical", "--max", "1K"], "needs a hierarchical cluster"),
    ],
)
def test_collectives_cli_refuses_in_one_line(args, match):
    from click.testing import CliRunner

    from wia_hw.cli import cli

    r = CliRunner().invoke(cli, ["collectives", *args])
    assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output
    assert "# all_reduce" not in r.output  # refused before anything is printed


def test_train_cli_refuses_an_infinite_bucket():
    from click.testing import CliRunner

    from wia_hw.cli import cli

    r = CliRunner().invoke(cli, ["train", "bert-large", "--bucket-mb", "inf"])
    assert r.exit_code == 2 and "bucket_mb must be a positive finite number" in r.output


# -- oversized work is refused up front -------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_oversized_collectives_are_refused_at_once(seed):
    """A call whose schedule would pass the transfer limit is refused before anything
    is built or simulated, naming the count and what to change; one just under runs."""
    import time

    from wia_hw.comm import MAX_CHUNK_TRANSFERS

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2000, 20000))
    comm = wia_hw.open_cluster(_spec(n, "ring"))
    op = str(rng.choice(["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]))
    t = time.process_time()
    _one_line(
        lambda: getattr(comm, op)(nbytes=n),
        rf"{op}: {n} ranks .* chunk transfers, more than the 2,000,000",
    )
    assert time.process_time() - t < 1.0
    small = wia_hw.open_cluster("wia-cluster-8", chunk_bytes=int(rng.integers(1, 64)))
    # 2 x 8 x 7 messages of S/8 bytes: the largest size that fits, then one chunk more,
    # which a blocking ring all-reduce times exactly step by step instead of refusing
    per = MAX_CHUNK_TRANSFERS // (2 * 8 * 7)
    fits = 8 * per * small.chunk_bytes
    assert small.chunk_transfers("all_reduce", "ring", 8, fits, 1) <= MAX_CHUNK_TRANSFERS
    t = time.process_time()
    rec = small.all_reduce(nbytes=fits + 8 * small.chunk_bytes, algorithm="ring")
    assert rec.sent_bytes == 2 * 7 * (fits + 8 * small.chunk_bytes)
    assert time.process_time() - t < 1.0
    # what cannot be timed exactly (a tree) is still refused in one line
    _one_line(
        lambda: small.all_reduce(nbytes=fits + 8 * small.chunk_bytes, algorithm="tree"),
        "chunk",
    )


# -- cluster specs: the device file and the fields named -----------------------------


def test_cluster_device_path_is_read_next_to_the_cluster_file(tmp_path, monkeypatch):
    import yaml

    from wia_hw.spec import load_spec, spec_path

    sub = tmp_path / "sub"
    sub.mkdir()
    npu = yaml.safe_load(spec_path("wia-npu").read_text())
    npu["name"] = "mynpu"
    (sub / "mynpu.yaml").write_text(yaml.safe_dump(npu))
    cl = _spec(4, "ring")
    cl["device"] = "mynpu.yaml"
    (sub / "cl.yaml").write_text(yaml.safe_dump(cl))
    for cwd in (tmp_path, sub):
        monkeypatch.chdir(cwd)
        path = "sub/cl.yaml" if cwd == tmp_path else "cl.yaml"
        assert load_spec(path).device.name == "mynpu"
    cl["device"] = "wia-npu"  # a built-in name still works from a file
    (sub / "cl.yaml").write_text(yaml.safe_dump(cl))
    assert load_spec(sub / "cl.yaml").device.name == "wia-npu"


@pytest.mark.parametrize(
    "spec, match",
    [
        (
            dict(
                _spec(2, "custom"),
                links=dict(topology="custom", bandwidth_gbs=100, latency_us=1, edges=[]),
            ),
            r"links\.edges: the topology is disconnected",
        ),
        (
            dict(_spec(8, "ring"), device="wia-cluster-8"),
            r"device: 'wia-cluster-8' is itself a cluster spec",
        ),
    ],
)
def test_cluster_spec_errors_name_the_field(spec, match):
    from wia_hw.spec import load_spec

    with pytest.raises(wia_hw.SpecError, match=match) as e:
        load_spec(spec)
    assert "\n" not in str(e.value)


# -- training: its own time and its own collectives -------------------------------------


def _tiny():
    from wia_hw.workloads import bert_large

    return bert_large(batch=2, seq=16, layers=1)


@pytest.mark.parametrize("kw", [dict(dp=1, tp=8), dict(dp=8, tp=1), dict(dp=2, tp=4)])
def test_training_algorithm_is_checked_before_any_kernel_is_timed(kw, monkeypatch):
    import wia_hw.train._schedule as sched

    def timed(*a, **k):
        raise AssertionError("kernels were timed before the algorithm was checked")

    monkeypatch.setattr(sched, "time_kernels", timed)
    for algo, match in (("bogus", "unknown algorithm 'bogus'"), ("hierarchical", "hierarchical")):
        if algo == "hierarchical" and kw["dp"] == 1:
            continue  # no DP all-reduce: nothing to run it on
        with pytest.raises(wia_hw.WorkloadError, match=match) as e:
            wia_hw.train_iteration(_tiny(), cluster="wia-cluster-8", algorithm=algo, **kw)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("seed", range(3))
def test_training_counts_only_its_own_step(seed):
    """Compute booked earlier on some ranks delays the step but is not in it: the step
    equals one on a fresh cluster. A collective still running when the step starts may
    slow it, but is not its communication."""
    rng = np.random.default_rng(seed)
    g = _tiny()
    fresh = wia_hw.train_iteration(g, cluster="wia-cluster-8", bucket_mb=1)
    comm = wia_hw.open_cluster("wia-cluster-8")
    busy = rng.choice(8, size=int(rng.integers(1, 8)), replace=False)
    cycles = int(rng.integers(1, 5_000_000))
    comm.compute([int(r) for r in busy], cycles, async_op=True)
    end_busy = cycles
    r = wia_hw.train_iteration(g, cluster=comm, bucket_mb=1)
    assert r.start_cycle == end_busy  # the step starts when every rank is free
    assert r.iteration_cycles == fresh.iteration_cycles
    assert r.breakdown() == fresh.breakdown() and r.comm_ms == fresh.comm_ms
    comm.all_reduce(nbytes=int(rng.integers(64, 512)) << 20, async_op=True)
    r2 = wia_hw.train_iteration(g, cluster=comm, bucket_mb=1)
    assert len(r2.records) == sum(r2.collective_calls.values())
    assert all(x.start_cycle >= r2.start_cycle for x in r2.records)
    assert r2.comm_ms <= r2.iteration_ms and r2.exposed_comm_ms >= 0
    assert r2.compute_cycles == fresh.compute_cycles
