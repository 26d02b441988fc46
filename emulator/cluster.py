"""Several devices on links: the topology graph and its SimPy link model.

:func:`build_topology` turns a :class:`~emulator.config.ClusterSpec` into a
:class:`Topology`: devices ``0 .. N-1``, extra switch nodes after them, and *directed*
links (each direction of a cable is its own link) with their bandwidth and latency.
It raises a one-line :class:`SpecError` naming the field when a link names a device
that does not exist or when the graph is disconnected.

:class:`LinkModel` runs messages on that graph in a :class:`simpy.Environment`, in
integer device cycles. Each directed link is a FIFO bandwidth server
(:class:`~emulator.memory.BandwidthPort`): a chunk of ``c`` bytes holds it for
``ceil(c / bytes_per_cycle)`` cycles and arrives ``latency_cycles`` after it leaves.
A message is split into chunks of at most ``chunk_bytes``; on a multi-hop path each
chunk is stored and forwarded at every node, so chunks pipeline over the hops. A
switch's fabric is one more FIFO server (its ``switch_bandwidth_gbs``, no latency)
that every chunk crossing the switch passes. Routes are shortest paths in hops, ties
broken towards lower node numbers (deterministic).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import simpy

from .errors import SpecError
from .memory import BandwidthPort

__all__ = [
    "Topology",
    "LinkModel",
    "build_topology",
    "link_name",
    "MAX_DEVICES",
    "MAX_FULLY_CONNECTED",
]

#: Bounds that keep a mistyped spec from building a graph that never finishes.
MAX_DEVICES = 65536
MAX_FULLY_CONNECTED = 1024


def link_name(u: int, v: int, devices: int) -> str:
    """``"3->4"``; a switch node ``s`` reads ``"sw"`` (``"sw1"``, ... when several)."""

    def n(x: int) -> str:
        return str(x) if x < devices else ("sw" if x == devices else f"sw{x - devices}")

    return f"{n(u)}->{n(v)}"


@dataclass
class Topology:
    """The cluster graph. ``links[(u, v)] = (bandwidth_gbs, latency_us)`` per direction;
    ``fabric[s]`` the switch fabric bandwidth (GB/s) of switch node ``s``;
    ``devices_per_node`` is set for a hierarchical cluster; ``ring`` is the order in
    which ring algorithms visit the devices: on a torus and a hierarchical cluster each
    step, the last back to the first included, is one hop (:func:`_torus_ring`,
    :func:`_hierarchical_ring`)."""

    devices: int
    kind: str
    links: dict[tuple[int, int], tuple[float, float]]
    fabric: dict[int, float] = field(default_factory=dict)
    devices_per_node: int | None = None
    ring: list[int] = field(default_factory=list)
    _adj: dict[int, list[int]] = field(default_factory=dict, repr=False)
    #: (rows, cols) of a torus: its routes are dimension-ordered
    dims: tuple[int, int] | None = None
    _dist: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        adj: dict[int, list[int]] = {}
        for u, v in self.links:
            adj.setdefault(u, []).append(v)
        for vs in adj.values():
            vs.sort()
        self._adj = adj
        if not self.ring:
            self.ring = list(range(self.devices))

    @property
    def nodes(self) -> int:
        return self.devices + len(self.fabric)

    def route(self, src: int, dst: int) -> list[int]:
        """The nodes of the path ``src -> dst`` (both included): a shortest path in
        hops. On a torus, dimension-order routing (along the row to the destination's
        column, then along the column), each dimension the short way round, a half-way
        tie going forward from the first half of every run of ``n / 2`` coordinates and
        backward from the second (so every link of a direction carries as many tied
        pairs as the others, and both directions alike when ``n / 2`` is even). Elsewhere, where several next hops are equally short, the
        pair picks one by ``(src * dst + src + dst + hop) mod count`` (equal-cost
        multi-path, as fabrics hash flows), so the pairs of an all-to-all spread over
        the equal paths instead of all taking the lowest-numbered neighbour."""
        if (src, dst) in self.links:
            return [src, dst]
        if self.dims is not None:
            return self._dimension_order(src, dst)
        dist = self.hops_to(dst)
        path = [src]
        u = src
        while u != dst:
            nxt = [v for v in self._adj[u] if dist[v] == dist[u] - 1]
            u = nxt[(src * dst + src + dst + len(path)) % len(nxt)]
            path.append(u)
        return path

    def hops_to(self, dst: int) -> list[int]:
        """Hops to node ``dst`` from every node (-1: unreachable), by breadth-first
        search, kept; links come in both directions, so also the hops from ``dst``."""
        dist = self._dist.get(dst)
        if dist is None:
            dist = [-1] * self.nodes
            dist[dst] = 0
            q = deque([dst])
            while q:
                u = q.popleft()
                for v in self._adj.get(u, ()):
                    if dist[v] < 0:
                        dist[v] = dist[u] + 1
                        q.append(v)
            self._dist[dst] = dist
        return dist

    def _dimension_order(self, src: int, dst: int) -> list[int]:
        """A torus route: along the row, then along the column (:meth:`route`)."""
        rows, cols = self.dims  # type: ignore[misc]
        (r, c), (r2, c2) = divmod(src, cols), divmod(dst, cols)
        path = [src]
        for dim, (a, b, n) in enumerate(((c, c2, cols), (r, r2, rows))):
            fwd, back = (b - a) % n, (a - b) % n
            # a tie (half way round): forward from the first half of every run of n/2
            # coordinates, so each direction's links carry the same number of them
            if fwd == 0:  # already there (every route on a side of 1)
                continue
            step = 1 if fwd < back or (fwd == back and 2 * (a % (n // 2)) < n // 2) else -1
            for _ in range(min(fwd, back)):
                a = (a + step) % n
                if dim == 0:
                    c = a
                else:
                    r = a
                path.append(r * cols + c)
        return path

    def connected(self) -> list[int]:
        """Devices not reachable from device 0 (empty when connected)."""
        seen = {0}
        q = deque([0])
        while q:
            u = q.popleft()
            for v in self._adj.get(u, ()):
                if v not in seen:
                    seen.add(v)
                    q.append(v)
        return [d for d in range(self.devices) if d not in seen]


def _squarest(n: int) -> tuple[int, int]:
    r = int(math.isqrt(n))
    while n % r:
        r -= 1
    return r, n // r


def _torus_ring(rows: int, cols: int) -> list[int]:
    """A cycle through every device of a rows x cols torus, one hop per step (the last
    device next to the first). With an even row count: a snake along the rows, closed by
    the wrap-around of the first column; with an even column count, the same along the
    columns; with both odd: row 0, then a snake down and up columns ``cols-1 .. 1`` over
    rows ``1 .. rows-1``, then column 0 downwards, closed by its wrap-around."""

    def at(r: int, c: int) -> int:
        return r * cols + c

    if rows == 1 or cols == 1 or rows % 2 == 0:
        return [at(r, c if r % 2 == 0 else cols - 1 - c) for r in range(rows) for c in range(cols)]
    if cols % 2 == 0:
        return [at(r if c % 2 == 0 else rows - 1 - r, c) for c in range(cols) for r in range(rows)]
    ring = [at(0, c) for c in range(cols)]
    for i, c in enumerate(range(cols - 1, 0, -1)):
        rs = range(1, rows) if i % 2 == 0 else range(rows - 1, 0, -1)
        ring += [at(r, c) for r in rs]
    return ring + [at(r, 0) for r in range(1, rows)]


def _hierarchical_ring(m: int, k: int) -> list[int]:
    """A cycle through the devices of ``m`` nodes of ``k``, one hop per step: each node's
    devices in a row (entered and left by rails, which join equal local ranks of
    neighbouring nodes), ending on a rail back to device 0. With ``k = 2`` and an odd
    ``m`` no such order exists; there it runs along rail 0 and back along rail 1."""
    if m == 1 or k == 1:
        return list(range(m * k))
    if m % 2 == 0:  # enter at j = 0 or k - 1, alternately; the last node leaves at 0
        return [a * k + (j if a % 2 == 0 else k - 1 - j) for a in range(m) for j in range(k)]
    if k == 2:
        return [a * 2 for a in range(m)] + [a * 2 + 1 for a in range(m - 1, -1, -1)]
    ring: list[int] = []
    enter = 0
    for a in range(m):
        leave = 0 if a == m - 1 else (1 if enter != 1 else 2)
        mid = [j for j in range(k) if j not in (enter, leave)]
        ring += [a * k + j for j in [enter, *mid, leave]]
        enter = leave
    return ring


def build_topology(spec: Any) -> Topology:
    """The :class:`Topology` of a cluster spec (see :class:`~emulator.config.LinkConfig`).

    Raises :class:`SpecError` (field ``devices`` or ``links.<name>``) for more than
    :data:`MAX_DEVICES` devices (:data:`MAX_FULLY_CONNECTED` fully connected), a torus whose dims do not
    multiply to the device count, a node size that does not divide it, a custom edge
    naming a device outside ``0 .. devices-1`` or joining a device to itself, and a
    graph in which some device cannot reach the others."""
    n, lk = spec.devices, spec.links
    if n > MAX_DEVICES:
        raise SpecError(f"at most {MAX_DEVICES} devices are modelled, got {n}", field="devices")
    if lk.topology == "fully_connected" and n > MAX_FULLY_CONNECTED:
        raise SpecError(
            f"a fully connected cluster of {n} devices would have {n * (n - 1)} "
            f"links; at most {MAX_FULLY_CONNECTED} devices (use switch or "
            "hierarchical)",
            field="links.topology",
        )
    bw, lat = float(lk.bandwidth_gbs), float(lk.latency_us)
    links: dict[tuple[int, int], tuple[float, float]] = {}
    fabric: dict[int, float] = {}
    ring: list[int] = []
    per_node = None
    dims: tuple[int, int] | None = None

    def both(u: int, v: int, b: float = bw, la: float = lat) -> None:
        links[(u, v)] = (b, la)
        links[(v, u)] = (b, la)

    if lk.topology == "ring":
        for i in range(n):
            both(i, (i + 1) % n)
    elif lk.topology == "fully_connected":
        for i in range(n):
            for j in range(i + 1, n):
                both(i, j)
    elif lk.topology == "switch":
        for i in range(n):
            both(i, n)
        fabric[n] = float(lk.switch_bandwidth_gbs or n * bw)
    elif lk.topology == "torus2d":
        rows, cols = lk.torus_dims or _squarest(n)
        if rows * cols != n:
            raise SpecError(
                f"{rows} x {cols} is {rows * cols} devices, the cluster has {n}",
                field="links.torus_dims",
            )
        for r in range(rows):
            for c in range(cols):
                i = r * cols + c
                if cols > 1:
                    both(i, r * cols + (c + 1) % cols)
                if rows > 1:
                    both(i, ((r + 1) % rows) * cols + c)
        ring = _torus_ring(rows, cols)
        dims = (rows, cols)
    elif lk.topology == "hierarchical":
        k = lk.devices_per_node
        if n % k:
            raise SpecError(
                f"{k} devices per node does not divide the {n} devices",
                field="links.devices_per_node",
            )
        per_node, m = k, n // k
        ib = float(lk.inter_node_bandwidth_gbs)
        il = float(lat if lk.inter_node_latency_us is None else lk.inter_node_latency_us)
        for a in range(m):
            for i in range(k):
                for j in range(i + 1, k):
                    both(a * k + i, a * k + j)
                if m > 1:
                    both(a * k + i, ((a + 1) % m) * k + i, ib, il)
        ring = _hierarchical_ring(m, k)
    else:  # custom
        for i, (a, b) in enumerate(lk.edges):
            for x in (a, b):
                if not 0 <= x < n:
                    raise SpecError(
                        f"device {x} does not exist (the cluster has devices 0..{n - 1})",
                        field=f"links.edges[{i}]",
                    )
            if a == b:
                raise SpecError(f"links device {a} to itself", field=f"links.edges[{i}]")
            both(a, b)
    topo = Topology(
        devices=n,
        kind=lk.topology,
        links=links,
        fabric=fabric,
        devices_per_node=per_node,
        ring=ring,
        dims=dims,
    )
    lost = topo.connected()
    if lost:
        raise SpecError(
            f"the topology is disconnected: device{'s' if len(lost) > 1 else ''} "
            f"{', '.join(map(str, lost[:8]))}{' ...' if len(lost) > 8 else ''} "
            "cannot reach device 0",
            field=f"links.{'edges' if lk.topology == 'custom' else 'topology'}",
        )
    return topo


class LinkModel:
    """The links of a cluster as SimPy FIFO bandwidth servers (see the module docstring).

    ``clock_ghz`` converts link figures to integer cycles: a link moves
    ``bandwidth_gbs / clock_ghz`` bytes per cycle (exact fraction) and delays each chunk
    by ``round(latency_us * 1e3 * clock_ghz)`` cycles. ``link_bytes[(u, v)]`` counts
    every byte each directed link carried; with ``record`` set, ``events`` lists
    ``(link, start_cycle, end_cycle, nbytes)`` for every chunk a link served.
    """

    def __init__(
        self,
        topology: Topology,
        clock_ghz: float,
        env: simpy.Environment,
        chunk_bytes: int = 1 << 20,
    ) -> None:
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
        self.topology = topology
        self.env = env
        self.chunk_bytes = chunk_bytes
        self.clock_ghz = clock_ghz
        clk = Fraction(str(clock_ghz))
        n = topology.devices
        self.ports: dict[tuple[int, int], BandwidthPort] = {}
        self.latency_cycles: dict[tuple[int, int], int] = {}
        for (u, v), (b, la) in topology.links.items():
            self.ports[(u, v)] = BandwidthPort(link_name(u, v, n), Fraction(str(b)) / clk)
            self.latency_cycles[(u, v)] = round(la * 1e3 * clock_ghz)
        self.fabric_ports = {
            s: BandwidthPort(link_name(s, s, n).split("->")[0] + " fabric", Fraction(str(b)) / clk)
            for s, b in topology.fabric.items()
        }
        self.link_bytes: dict[tuple[int, int], int] = dict.fromkeys(self.ports, 0)
        self.record = False
        self.events: list[tuple[str, int, int, int]] = []
        self._servers: dict[
            tuple[int, int], list[tuple[BandwidthPort, int, tuple[int, int] | None]]
        ] = {}

    def servers(
        self, src: int, dst: int
    ) -> list[tuple[BandwidthPort, int, tuple[int, int] | None]]:
        """The FIFO servers a chunk from ``src`` to ``dst`` passes, in order:
        ``(port, latency_cycles, link or None for a switch fabric)``."""
        key = (src, dst)
        s = self._servers.get(key)
        if s is None:
            path = self.topology.route(src, dst)
            s = []
            for u, v in zip(path, path[1:], strict=False):
                if u in self.fabric_ports:
                    s.append((self.fabric_ports[u], 0, None))
                s.append((self.ports[(u, v)], self.latency_cycles[(u, v)], (u, v)))
            self._servers[key] = s
        return s

    def hops(self, src: int, dst: int) -> int:
        return len(self.topology.route(src, dst)) - 1

    def send(
        self,
        src: int,
        dst: int,
        nbytes: int,
        done: Callable[[], None],
        tally: dict[tuple[int, int], int] | None = None,
    ) -> None:
        """Start moving ``nbytes`` from device ``src`` to ``dst`` now; call ``done()`` at
        the cycle the last chunk arrives. ``tally`` (per link) gets the bytes booked."""
        env = self.env
        servers = self._servers.get((src, dst)) or self.servers(src, dst)
        c = self.chunk_bytes
        if len(servers) == 1 and 0 < nbytes <= c and not self.record:
            # fast path (one chunk over one link: every ring step on a ring), same result
            port, lat, ln = servers[0]
            self.link_bytes[ln] += nbytes  # type: ignore[index]
            if tally is not None:
                tally[ln] = tally.get(ln, 0) + nbytes  # type: ignore[index]
            now = env.now
            env.timeout(port.reserve(now, nbytes) + lat - now).callbacks.append(lambda _e: done())
            return
        sizes = [c] * (nbytes // c) + ([nbytes % c] if nbytes % c else [])
        for _, _, ln in servers:
            if ln is not None:
                self.link_bytes[ln] += nbytes
                if tally is not None:
                    tally[ln] = tally.get(ln, 0) + nbytes
        if not sizes:  # an empty message still pays the path's latency
            lat = sum(la for _, la, _ in servers)
            env.timeout(lat).callbacks.append(lambda _e: done())
            return
        if len(servers) == 1:
            port, lat, ln = servers[0]
            now = env.now
            end = now
            for sz in sizes:
                end = port.reserve(now, sz)
                if self.record:
                    self.events.append((port.name, end - port.cycles(sz), end, sz))
            env.timeout(end + lat - now).callbacks.append(lambda _e: done())
            return
        left = [len(sizes)]

        def hop(sz: int, i: int) -> None:
            port, lat, ln = servers[i]
            now = env.now
            end = port.reserve(now, sz)
            if self.record and ln is not None:
                self.events.append((port.name, end - port.cycles(sz), end, sz))
            ev = env.timeout(end + lat - now)
            if i + 1 < len(servers):
                ev.callbacks.append(lambda _e: hop(sz, i + 1))
            else:
                ev.callbacks.append(lambda _e: arrived())

        def arrived() -> None:
            left[0] -= 1
            if not left[0]:
                done()

        for sz in sizes:
            hop(sz, 0)
