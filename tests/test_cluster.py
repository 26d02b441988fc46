"""The cluster model: topologies, their checks, and the SimPy link model (issue #11)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import simpy
from wia_hw.emulator.cluster import LinkModel, build_topology
from wia_hw.emulator.errors import SpecError

import wia_hw


def cluster(n: int = 8, **links) -> wia_hw.ClusterSpec:
    links.setdefault("bandwidth_gbs", 100)
    return wia_hw.load_spec(
        {"schema_version": 1, "name": "t", "devices": n, "device": "wia-npu", "links": links}
    )


def test_shipped_cluster_specs_load():
    for name in ("wia-cluster-8", "wia-cluster-2x8", "wia-cluster-torus16"):
        c = wia_hw.load_spec(name)
        assert isinstance(c, wia_hw.ClusterSpec)
        build_topology(c)
    assert wia_hw.load_spec("wia-cluster-8").links.latency_us == 2.0


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_link_counts_per_topology(n):
    # each direction of each cable is one link
    assert len(build_topology(cluster(n, topology="ring")).links) == (2 if n == 2 else 2 * n)
    assert len(build_topology(cluster(n, topology="fully_connected")).links) == n * (n - 1)
    sw = build_topology(cluster(n, topology="switch"))
    assert len(sw.links) == 2 * n and sw.fabric == {n: n * 100.0}


def test_torus_links_and_routes_are_shortest():
    rows, cols = 4, 6
    t = build_topology(cluster(rows * cols, topology="torus2d", torus_dims=[rows, cols]))
    assert len(t.links) == 4 * rows * cols
    for a in range(rows * cols):
        for b in range(rows * cols):
            dr, dc = abs(a // cols - b // cols), abs(a % cols - b % cols)
            hops = min(dr, rows - dr) + min(dc, cols - dc)
            path = t.route(a, b)
            assert len(path) - 1 == hops
            assert all((u, v) in t.links for u, v in zip(path, path[1:], strict=False))
    # the ring order is a snake whose neighbours (and its wrap) are one hop apart
    ring = t.ring
    assert sorted(ring) == list(range(rows * cols))
    assert all((u, v) in t.links for u, v in zip(ring, ring[1:] + ring[:1], strict=True))


@pytest.mark.parametrize(
    "rows,cols", [(4, 4), (3, 4), (4, 6), (5, 5), (2, 8), (8, 8), (1, 8), (7, 1), (2, 2)]
)
def test_torus_routes_are_dimension_ordered_and_balance_an_all_to_all(rows, cols):
    """Each route runs along its row, then its column, the short way round; over all
    pairs every link of a dimension and direction carries the same number of routes
    (half-way ties split evenly), where routes that took the lowest-numbered neighbour loaded link 0->1 of a
    4x4 torus 3.4x the mean."""
    t = build_topology(cluster(rows * cols, topology="torus2d", torus_dims=[rows, cols]))
    load = {link: 0 for link in t.links}
    for a in range(rows * cols):
        for b in range(rows * cols):
            if a == b:
                continue
            path = t.route(a, b)
            turned = False
            for u, v in zip(path, path[1:], strict=False):
                load[(u, v)] += 1
                along_row = u // cols == v // cols
                assert not (turned and along_row), (a, b, path)  # row moves come first
                turned = turned or not along_row
    groups: dict[tuple[bool, int], set[int]] = {}
    for (u, v), n in load.items():
        along_row = u // cols == v // cols
        step = (v - u) % cols if along_row else (v // cols - u // cols) % rows
        groups.setdefault((along_row, step), set()).add(n)
    assert all(len(counts) == 1 for counts in groups.values()), groups


def test_hierarchical_links():
    t = build_topology(wia_hw.load_spec("wia-cluster-2x8"))
    k, m = 8, 2
    intra = [lk for (u, v), lk in t.links.items() if u // k == v // k]
    inter = [lk for (u, v), lk in t.links.items() if u // k != v // k]
    assert len(intra) == m * k * (k - 1) and set(intra) == {(300.0, 1.0)}
    assert len(inter) == 2 * k and set(inter) == {(50.0, 5.0)}
    assert t.devices_per_node == k


@pytest.mark.parametrize(
    "links, match",
    [
        ({"topology": "mesh"}, r"links\.topology: must be one of ring, fully_connected"),
        ({"topology": "ring", "torus_dims": [2, 4]}, r"links\.torus_dims: only a torus2d"),
        (
            {"topology": "torus2d", "torus_dims": [3, 3]},
            r"links\.torus_dims: 3 x 3 is 9 devices, the cluster has 8",
        ),
        ({"topology": "torus2d", "torus_dims": [8]}, r"links\.torus_dims: must be a list of 2"),
        (
            {"topology": "hierarchical", "inter_node_bandwidth_gbs": 10},
            r"links\.devices_per_node: a hierarchical topology needs it",
        ),
        (
            {"topology": "hierarchical", "devices_per_node": 3, "inter_node_bandwidth_gbs": 10},
            r"links\.devices_per_node: 3 devices per node does not divide the 8 devices",
        ),
        ({"topology": "custom"}, r"links\.edges: a custom topology needs its edges"),
        (
            {"topology": "custom", "edges": [[0, 1], [1, 9]]},
            r"links\.edges\[1\]: device 9 does not exist \(the cluster has devices 0\.\.7\)",
        ),
        (
            {"topology": "custom", "edges": [[0, 1], [2, 2]]},
            r"links\.edges\[1\]: links device 2 to itself",
        ),
        (
            {"topology": "custom", "edges": [[0, 1], [1]]},
            r"links\.edges\[1\]: must be a pair of device indices",
        ),
        (
            {"topology": "custom", "edges": [[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6, 7]]},
            r"links\.edges: the topology is disconnected: devices 4, 5, 6, 7 cannot reach device 0",
        ),
        ({"latency_ns": 2000}, r"links\.latency_ns: unknown field"),
        ({"bandwidth_gbs": 0}, r"links\.bandwidth_gbs: must be a positive number"),
    ],
)
def test_bad_topology_is_one_line_spec_error(links, match):
    with pytest.raises(SpecError, match=match) as e:
        cluster(8, **links)
    assert "\n" not in str(e.value)


def test_size_bounds():
    with pytest.raises(SpecError, match=r"devices: at most 65536 devices are modelled"):
        cluster(70000)
    with pytest.raises(
        SpecError,
        match=r"links\.topology: a fully connected cluster of "
        r"2000 devices would have 3998000 links",
    ):
        cluster(2000, topology="fully_connected")


def test_disconnected_error_names_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(
        "schema_version: 1\nname: c\ndevices: 4\ndevice: wia-npu\nlinks:\n"
        "  bandwidth_gbs: 10\n  topology: custom\n  edges: [[0, 1], [2, 3]]\n"
    )
    with pytest.raises(
        SpecError,
        match=r"c\.yaml:8: links\.edges: the topology is "
        r"disconnected: devices 2, 3",
    ):
        wia_hw.load_spec(p)


# -- the link model ------------------------------------------------------------------------


def _model(spec, chunk_bytes=1 << 20):
    env = simpy.Environment()
    return env, LinkModel(build_topology(spec), spec.device.clock_ghz, env, chunk_bytes)


def _send(env, lm, src, dst, nbytes):
    out = {}
    lm.send(src, dst, nbytes, lambda: out.setdefault("t", env.now))
    env.run()
    return out["t"]


@pytest.mark.parametrize("seed", range(4))
def test_store_and_forward_pipelines_chunks(seed):
    """P equal chunks over h hops arrive at h (L + c) + (P - 1) c cycles, where c is one
    chunk's serialisation cycles and L the per-hop latency."""
    rng = np.random.default_rng(seed)
    spec = cluster(8, topology="ring", latency_us=float(rng.integers(0, 5)))
    chunk = int(rng.integers(1, 64)) * 4096
    pieces = int(rng.integers(1, 20))
    env, lm = _model(spec, chunk)
    h = int(rng.integers(1, 5))
    t = _send(env, lm, 0, h, chunk * pieces)
    bpc = Fraction(100) / Fraction(str(spec.device.clock_ghz))
    c = math.ceil(chunk / bpc)
    lat = round(spec.links.latency_us * 1e3 * spec.device.clock_ghz)
    assert t == h * (lat + c) + (pieces - 1) * c
    # bytes are conserved: each link of the path carried the whole message
    path = build_topology(spec).route(0, h)
    assert {k: v for k, v in lm.link_bytes.items() if v} == {
        (u, v): chunk * pieces for u, v in zip(path, path[1:], strict=False)
    }


def test_link_is_a_fifo_server():
    """Two messages on one link at once: the second waits for the first (FIFO)."""
    spec = cluster(4, topology="ring", latency_us=1.0)
    env, lm = _model(spec)
    ends = []
    for _ in range(2):
        lm.send(0, 1, 3 << 20, lambda: ends.append(env.now))
    env.run()
    bpc = Fraction(100) / Fraction(str(spec.device.clock_ghz))
    c = math.ceil((1 << 20) / bpc)
    lat = round(1e3 * spec.device.clock_ghz)
    assert ends == [3 * c + lat, 6 * c + lat]


def test_switch_fabric_bandwidth_limits():
    """A switch whose fabric is slower than the links bounds a message's rate by it."""
    nbytes = 64 << 20
    slow = cluster(4, topology="switch", switch_bandwidth_gbs=25, latency_us=0.0)
    env, lm = _model(slow)
    t_slow = _send(env, lm, 0, 2, nbytes)
    fast = cluster(4, topology="switch", latency_us=0.0)
    env, lm = _model(fast)
    t_fast = _send(env, lm, 0, 2, nbytes)
    hz = slow.device.clock_hz
    assert t_slow / hz >= nbytes / 25e9
    assert t_fast / hz == pytest.approx(nbytes / 100e9, rel=0.03)
    assert t_fast < t_slow


@pytest.mark.parametrize("seed", range(3))
def test_more_bandwidth_is_never_slower(seed):
    rng = np.random.default_rng(seed)
    nbytes = int(rng.integers(1, 1 << 26))
    times = []
    for bw in (25, 50, 100, 400):
        c = wia_hw.open_cluster(cluster(8, topology="torus2d", bandwidth_gbs=bw))
        times.append(c.all_reduce(nbytes=nbytes).duration_cycles)
    assert times == sorted(times, reverse=True)
