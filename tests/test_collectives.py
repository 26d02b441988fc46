"""Collectives: functional results, closed forms, byte conservation, errors (issue #11)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import wia_hw
from wia_hw.comm import BUS_FACTORS, CommError


def cluster(n: int = 8, **links) -> wia_hw.ClusterSpec:
    links.setdefault("bandwidth_gbs", 100)
    return wia_hw.load_spec(
        {"schema_version": 1, "name": "t", "devices": n, "device": "wia-npu", "links": links}
    )


CLUSTERS = {
    "ring8": lambda: wia_hw.open_cluster("wia-cluster-8"),
    "torus16": lambda: wia_hw.open_cluster("wia-cluster-torus16"),
    "2x8": lambda: wia_hw.open_cluster("wia-cluster-2x8"),
    "switch5": lambda: wia_hw.open_cluster(cluster(5, topology="switch")),
    "fc6": lambda: wia_hw.open_cluster(cluster(6, topology="fully_connected")),
}


def _ints(rng, n, size):
    return [rng.integers(-10_000, 10_000, size=size).astype(np.int64) for _ in range(n)]


# -- functional results --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, algo", [(c, a) for c in CLUSTERS for a in ("ring", "tree")] + [("2x8", "hierarchical")]
)
def test_all_reduce_equals_numpy_sum(name, algo):
    comm = CLUSTERS[name]()
    rng = np.random.default_rng(hash((name, algo)) % 2**32)
    n = comm.size
    for shape in [(3,), (37, 5), (4096,)]:  # fewer elements than ranks, uneven, even
        ints = _ints(rng, n, shape)
        rec = comm.all_reduce(ints, algorithm=algo)
        want = np.sum(np.stack(ints), axis=0)
        assert all(o.shape == shape and np.array_equal(o, want) for o in rec.outputs)
        fl = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
        rec = comm.all_reduce(fl, algorithm=algo)
        want = np.sum(np.stack(fl).astype(np.float64), axis=0)
        # n - 1 float32 additions in some order: error at most (n - 1) eps sum |x|
        bound = (n - 1) * np.finfo(np.float32).eps * np.sum(np.abs(np.stack(fl)), axis=0)
        assert all(np.all(np.abs(o - want) <= bound + 1e-30) for o in rec.outputs)


def test_all_reduce_other_ops_and_subgroups():
    comm = wia_hw.open_cluster("wia-cluster-torus16")
    rng = np.random.default_rng(1)
    group = [3, 9, 12, 0, 6]
    bufs = _ints(rng, len(group), (50,))
    for op, f in (("max", np.max), ("min", np.min)):
        rec = comm.all_reduce(bufs, op=op, ranks=group)
        assert rec.ranks == tuple(group)
        assert all(np.array_equal(o, f(np.stack(bufs), axis=0)) for o in rec.outputs)


@pytest.mark.parametrize("name", ["ring8", "torus16", "switch5"])
def test_all_gather_reduce_scatter_broadcast_all_to_all(name):
    comm = CLUSTERS[name]()
    n = comm.size
    rng = np.random.default_rng(7)
    bufs = _ints(rng, n, (n * 6,))
    rec = comm.all_gather(bufs)
    assert all(np.array_equal(o, np.stack(bufs)) for o in rec.outputs)
    total = np.sum(np.stack(bufs), axis=0)
    rec = comm.reduce_scatter(bufs)
    assert all(np.array_equal(o, total[k * 6 : (k + 1) * 6]) for k, o in enumerate(rec.outputs))
    for root in (0, n - 1):
        rec = comm.broadcast(bufs, root=root)
        assert all(np.array_equal(o, bufs[root]) for o in rec.outputs)
    rec = comm.all_to_all(bufs)
    for j, o in enumerate(rec.outputs):
        assert np.array_equal(o, np.concatenate([b[j * 6 : (j + 1) * 6] for b in bufs]))


def test_send_recv_moves_the_buffer():
    comm = wia_hw.open_cluster("wia-cluster-torus16")
    a = np.arange(1000, dtype=np.float32)
    comm.send(0, 10, a)
    w = comm.send(0, 10, a * 2, async_op=True)
    assert np.array_equal(comm.recv(10, 0), a)
    assert np.array_equal(comm.recv(10, 0), a * 2) and w.done()
    rec = comm.send(3, 4, nbytes=4096)
    assert rec.kind == "p2p" and rec.nbytes == 4096


# -- closed forms --------------------------------------------------------------------------


def _lat_s(comm, us):
    """A latency as the model holds it: whole device cycles."""
    return round(us * 1e3 * comm.clock_ghz) / (comm.clock_ghz * 1e9)


@pytest.mark.parametrize("name", ["ring8", "torus16"])
@pytest.mark.parametrize("mib", [64, 256, 1024])
def test_ring_all_reduce_matches_alpha_beta(name, mib):
    """2 (n - 1) (L + (S / n) / B) within 2 % for S >= 64 MB; bus bandwidth near B."""
    comm = CLUSTERS[name]()
    n, s = comm.size, mib << 20
    b, lat = comm.spec.links.bandwidth_gbs * 1e9, comm.spec.links.latency_us
    want = 2 * (n - 1) * (lat * 1e-6 + (s / n) / b)
    rec = comm.all_reduce(nbytes=s)
    assert rec.time_s == pytest.approx(want, rel=0.02)
    assert rec.busbw_gbs == pytest.approx(rec.algbw_gbs * 2 * (n - 1) / n)
    assert 0.97 * b / 1e9 <= rec.busbw_gbs <= b / 1e9


def test_small_messages_are_latency_bound():
    comm = wia_hw.open_cluster("wia-cluster-8")
    n = comm.size
    floor = 2 * (n - 1) * _lat_s(comm, comm.spec.links.latency_us)
    t1 = comm.all_reduce(nbytes=1024).time_s
    t2 = comm.all_reduce(nbytes=2048).time_s
    assert floor <= t1 <= 1.01 * floor  # latency is 99 % of the time
    assert t2 / t1 < 1.01  # doubling the size barely moves it
    assert comm.all_reduce(nbytes=1024).busbw_gbs < 0.01 * comm.peak_link_bandwidth_gbs


@pytest.mark.parametrize("n", [5, 8, 13])
@pytest.mark.parametrize("mib", [16, 256])
def test_tree_all_reduce_matches_its_closed_form(n, mib):
    """Pipelined binary tree on dedicated links: 2 d (L + c / B) + (P - 1) c / B with
    d = floor(log2 n) the depth, P = S / chunk pieces of c bytes."""
    comm = wia_hw.open_cluster(cluster(n, topology="fully_connected", latency_us=2.0))
    s, chunk = mib << 20, comm.chunk_bytes
    p, c = s // chunk, chunk
    b, lat = 100e9, _lat_s(comm, 2.0)
    d = int(math.log2(n))
    want = 2 * d * (lat + c / b) + (p - 1) * c / b
    assert comm.all_reduce(nbytes=s, algorithm="tree").time_s == pytest.approx(want, rel=0.01)


@pytest.mark.parametrize("mib", [64, 512])
def test_hierarchical_all_reduce_matches_its_closed_form(mib):
    """2 (k-1) (L1 + S/(k B1)) + 2 (M-1) (L2 + S/(k M B2)): ring reduce-scatter and
    all-gather in the node (k devices), ring all-reduce of S/k over the M nodes."""
    comm = wia_hw.open_cluster("wia-cluster-2x8")
    lk = comm.spec.links
    k, m, s = lk.devices_per_node, comm.size // lk.devices_per_node, mib << 20
    want = 2 * (k - 1) * (_lat_s(comm, lk.latency_us) + s / k / (lk.bandwidth_gbs * 1e9)) + 2 * (
        m - 1
    ) * (_lat_s(comm, lk.inter_node_latency_us) + s / (k * m) / (lk.inter_node_bandwidth_gbs * 1e9))
    rec = comm.all_reduce(nbytes=s, algorithm="hierarchical")
    assert rec.time_s == pytest.approx(want, rel=0.01)
    # on this cluster it beats the flat ring, whose every step crosses the slow network
    assert rec.time_s < comm.all_reduce(nbytes=s, algorithm="ring").time_s


def test_broadcast_and_all_gather_closed_forms():
    comm = wia_hw.open_cluster("wia-cluster-8")
    n, s, chunk = comm.size, 256 << 20, comm.chunk_bytes
    b, lat = 100e9, _lat_s(comm, 2.0)
    p = s // chunk
    assert comm.broadcast(nbytes=s).time_s == pytest.approx(
        (n - 1) * (lat + chunk / b) + (p - 1) * chunk / b, rel=0.01
    )
    assert comm.all_gather(nbytes=s).time_s == pytest.approx((n - 1) * (lat + s / n / b), rel=0.01)
    assert comm.reduce_scatter(nbytes=s).time_s == pytest.approx(
        (n - 1) * (lat + s / n / b), rel=0.01
    )


def test_bus_factors_are_nccl_tests():
    n = 8
    assert BUS_FACTORS["all_reduce"](n) == 2 * (n - 1) / n
    for name in ("all_gather", "reduce_scatter", "all_to_all"):
        assert BUS_FACTORS[name](n) == (n - 1) / n
    assert BUS_FACTORS["broadcast"](n) == 1.0
    comm = wia_hw.open_cluster("wia-cluster-8")
    rec = comm.all_to_all(nbytes=8 << 20)
    assert rec.busbw_gbs == pytest.approx(rec.nbytes / rec.time_s / 1e9 * (n - 1) / n)


# -- byte conservation ---------------------------------------------------------------------


@pytest.mark.parametrize("name", CLUSTERS)
def test_link_bytes_equal_what_the_schedule_sends(name):
    comm = CLUSTERS[name]()
    n = comm.size
    rng = np.random.default_rng(3)
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
        s = int(rng.integers(1, 1 << 22))
        rec = getattr(comm, op)(nbytes=s)
        assert rec.sent_bytes > 0 and rec.transfers > 0
        # every link of a transfer's path carries its bytes, no more, no less
        assert sum(rec.link_bytes.values()) >= rec.sent_bytes
        if comm.topology.kind == "switch":  # device -> switch -> device: two links
            assert sum(rec.link_bytes.values()) == 2 * rec.sent_bytes
    s = n * 4096
    rec = comm.all_reduce(nbytes=s, algorithm="ring")
    assert rec.sent_bytes == 2 * (n - 1) * s  # n ranks x 2(n-1) steps x S/n
    if comm.topology.kind in ("ring", "torus2d", "fully_connected"):
        # ring neighbours are one hop apart: link bytes are the schedule's bytes
        assert sum(rec.link_bytes.values()) == rec.sent_bytes
    rec = comm.all_gather(nbytes=s)
    assert rec.sent_bytes == (n - 1) * s
    rec = comm.all_to_all(nbytes=s)
    assert rec.sent_bytes == (n - 1) * s


def test_link_bytes_count_every_hop():
    comm = wia_hw.open_cluster("wia-cluster-torus16")
    before = dict(comm.links.link_bytes)
    rec = comm.all_to_all(nbytes=16 * 1000)
    hops = sum(comm.links.hops(a, b) for a in range(16) for b in range(16) if a != b)
    assert sum(rec.link_bytes.values()) == 1000 * hops
    after = comm.links.link_bytes
    assert sum(after.values()) - sum(before.values()) == 1000 * hops


# -- async: a scheduler drives collectives and compute together ----------------------------


def test_async_collectives_share_links_and_overlap_compute():
    comm = wia_hw.open_cluster("wia-cluster-8")
    alone = comm.all_reduce(nbytes=64 << 20).duration_cycles
    w1 = comm.all_reduce(nbytes=64 << 20, async_op=True)
    w2 = comm.all_reduce(nbytes=64 << 20, async_op=True)
    c = comm.compute(None, alone // 2, async_op=True)
    r1, r2 = w1.wait(), w2.wait()
    c.wait()
    # two at once share the links: the pair takes about twice one
    assert max(r1.end_cycle, r2.end_cycle) - r1.start_cycle >= 1.9 * alone
    assert all(cr.end_cycle <= r1.end_cycle for cr in comm.compute_records)


# -- errors --------------------------------------------------------------------------------


def test_bad_calls_are_one_line_errors():
    comm = wia_hw.open_cluster("wia-cluster-8")
    bufs = [np.zeros(16, np.float32) for _ in range(8)]
    cases = [
        (
            lambda: comm.all_reduce(bufs[:7] + [np.zeros(15, np.float32)]),
            r"all_reduce: rank 7's buffer is \(15,\) float32, rank 0's is \(16,\) float32",
        ),
        (
            lambda: comm.all_reduce(bufs[:7] + [np.zeros(16, np.int32)]),
            r"rank 7's buffer is \(16,\) int32",
        ),
        (
            lambda: comm.all_reduce(nbytes=64, ranks=[0, 8]),
            r"all_reduce: rank 8 is outside the cluster \(ranks 0\.\.7\)",
        ),
        (lambda: comm.send(0, 8, nbytes=4), r"send: dst 8 is outside the cluster"),
        (lambda: comm.send(2, 2, nbytes=4), r"send: src and dst are both rank 2"),
        (lambda: comm.broadcast(nbytes=4, root=-1), r"broadcast: root -1 is outside"),
        (lambda: comm.all_reduce(bufs[:4]), r"all_reduce: 4 buffers for 8 ranks"),
        (lambda: comm.all_reduce(bufs, nbytes=64), r"give either buffers .* or nbytes"),
        (
            lambda: comm.all_reduce(nbytes=64, algorithm="bruck"),
            r"all_reduce: unknown algorithm 'bruck' \(known: auto, ring, tree, hierarchical\)",
        ),
        (
            lambda: comm.all_reduce(nbytes=64, algorithm="hierarchical"),
            r"the hierarchical algorithm needs the whole cluster on a hierarchical topology",
        ),
        (lambda: comm.all_reduce(nbytes=64, op="mean"), r"unknown op 'mean'"),
        (
            lambda: comm.reduce_scatter([np.zeros(10)] * 8),
            r"reduce_scatter: 10 elements do not split evenly over 8 ranks",
        ),
        (lambda: comm.all_to_all([np.zeros(10)] * 8), r"all_to_all: 10 elements do not split"),
        (lambda: comm.recv(1, 0), r"recv: rank 0 has sent nothing \(left\) to rank 1"),
        (lambda: comm.all_reduce(nbytes=64, ranks=[1, 1]), r"ranks \[1, 1\] repeat a rank"),
        (lambda: comm.all_reduce(nbytes=64, ranks=[1]), r"needs at least 2 ranks"),
        (lambda: comm.all_reduce(nbytes=-1), r"nbytes must be a non-negative integer"),
        (lambda: comm.compute(0, -5), r"compute: cycles must be a non-negative integer"),
        (lambda: comm.broadcast(nbytes=4, root=3, ranks=[0, 1]), r"root 3 is not in the group"),
        (lambda: wia_hw.open_cluster("wia-npu"), r"'wia-npu' is a device spec"),
    ]
    for call, match in cases:
        with pytest.raises(CommError, match=match) as e:
            call()
        assert "\n" not in str(e.value)
