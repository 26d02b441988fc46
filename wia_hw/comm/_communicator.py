"""The communicator: collectives over a cluster's SimPy link model.

``open_cluster(spec)`` gives a :class:`Communicator` over the cluster's devices (ranks
``0 .. N-1``). Each collective builds a :class:`~._schedule.Schedule` (a DAG of chunked
point-to-point transfers) and runs it on :class:`~wia_hw.emulator.cluster.LinkModel` in
the communicator's :class:`simpy.Environment`: its time comes out of the simulation.
Functional mode (``buffers=``: one numpy array per rank) moves real data with each
transfer; timing mode (``nbytes=``) needs only the size. Calls block by default;
``async_op=True`` returns a :class:`Work` whose SimPy ``event`` a scheduler can wait on
while other collectives and device compute (:meth:`Communicator.compute`) proceed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from ..emulator.cluster import LinkModel, Topology, build_topology, link_name
from ..emulator.config import ClusterSpec, DeviceSpec
from ..emulator.errors import WiaError
from ._schedule import Schedule, even_ranges

__all__ = [
    "CommError",
    "CollectiveRecord",
    "ComputeRecord",
    "CallInFlight",
    "Communicator",
    "Work",
    "open_cluster",
    "BUS_FACTORS",
    "ALGORITHMS",
    "AUTO",
    "MAX_CHUNK_TRANSFERS",
    "MAX_RING_CELLS",
]

#: The most chunk transfers one simulated call may schedule, each counted once per link
#: (or switch fabric) it crosses: each such chunk hop is a SimPy event or booking of
#: about 10 us CPU, so a ring all-reduce over 10,000 ranks, or 1-byte chunks of a 256
#: MiB message, would run for hours. The biggest call of the docs and tests is far
#: below it. Ring collectives timed exactly without events (:meth:`Communicator.ring_exact`)
#: have their own bound, :data:`MAX_RING_CELLS`.
MAX_CHUNK_TRANSFERS = 2_000_000

#: The most (ring steps x ranks) one exactly timed ring collective may evaluate: each
#: step is a few numpy operations over the ranks (about 0.1 s per million cells), so
#: an all-reduce over 4096 ranks (33.5 million) takes a few seconds and one over the
#: largest cluster (65,536 ranks) is refused rather than run for minutes.
MAX_RING_CELLS = 1 << 26

#: nccl-tests' bus-bandwidth factor per collective, as a function of the rank count.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send": lambda n: 1.0,
}

#: The algorithm name that picks, per call, the collective's algorithm that ends first
#: alone on idle links (the default; see ``Communicator._auto_all_reduce``).
AUTO = "auto"

#: The algorithms of each collective (``AUTO`` chooses among them where there are several).
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "hierarchical"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "broadcast": ("ring",),
    "all_to_all": ("direct",),
    "send": ("p2p",),
}

#: The ring collectives :meth:`Communicator.ring_exact` times: per phase of ``n - 1``
#: steps, the offset ``o`` for which step ``s`` of ring position ``i`` sends the
#: segment of position ``(i + o - s) mod n`` (the all-reduce's reduce-scatter and
#: all-gather run with shift 1, the standalone ones with shift 0; see ``_schedule``).
_RING_PHASES: dict[str, tuple[int, ...]] = {
    "all_reduce": (0, 1),
    "reduce_scatter": (-1,),
    "all_gather": (0,),
}

_REDUCE_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


class CommError(WiaError, ValueError):
    """A collective was called with bad arguments (ranks, buffers, algorithm). One line."""


@dataclass
class CollectiveRecord:
    """One collective or point-to-point message as it ran.

    ``nbytes`` is the size as nccl-tests counts it (all-reduce, reduce-scatter,
    all-to-all, broadcast: one rank's buffer; all-gather: the gathered output).
    ``sent_bytes``: what the schedule sends (each transfer once); ``link_bytes``: bytes
    per directed link (a transfer counts on every link of its path). Times are device
    cycles of the communicator's clock. ``peak_busbw_gbs``: the highest bus bandwidth
    the call could reach on its links (:meth:`Communicator.peak_busbw_gbs`), so
    ``busbw_gbs <= peak_busbw_gbs``."""

    name: str
    algorithm: str
    nbytes: int
    ranks: tuple[int, ...]
    start_cycle: int
    end_cycle: int
    clock_ghz: float
    sent_bytes: int
    transfers: int
    link_bytes: dict[str, int]
    kind: str = "collective"
    peak_busbw_gbs: float = 0.0
    outputs: list[np.ndarray] | None = field(default=None, repr=False)

    @property
    def duration_cycles(self) -> int:
        return self.end_cycle - self.start_cycle

    @property
    def time_s(self) -> float:
        return self.duration_cycles / (self.clock_ghz * 1e9)

    @property
    def time_ms(self) -> float:
        return self.time_s * 1e3

    @property
    def bus_factor(self) -> float:
        return BUS_FACTORS[self.name](len(self.ranks))

    @property
    def algbw_gbs(self) -> float:
        """nccl-tests' algorithm bandwidth: ``nbytes / time`` (GB/s, 1e9 B/s)."""
        return self.nbytes / self.time_s / 1e9 if self.duration_cycles else 0.0

    @property
    def busbw_gbs(self) -> float:
        """nccl-tests' bus bandwidth: ``algbw x bus_factor``."""
        return self.algbw_gbs * self.bus_factor


@dataclass(frozen=True)
class CallInFlight:
    """A collective or message that has started and not finished yet
    (:attr:`Communicator.in_flight`): what it is and the cycle it started."""

    name: str
    algorithm: str
    nbytes: int
    ranks: tuple[int, ...]
    start_cycle: int
    kind: str = "collective"


@dataclass(frozen=True)
class ComputeRecord:
    """Device compute booked on ``rank`` from ``start_cycle`` to ``end_cycle``."""

    rank: int
    start_cycle: int
    end_cycle: int
    label: str = "compute"


class Work:
    """A collective or compute in flight. ``event`` is its SimPy event (value: the
    record); :meth:`wait` runs the simulation until it is done and returns the record."""

    def __init__(self, comm: Communicator, event: simpy.Event) -> None:
        self.comm = comm
        self.event = event

    def done(self) -> bool:
        """Whether the simulation has reached the end of this work."""
        return self.event.processed

    def wait(self) -> Any:
        ev, env = self.event, self.comm.env
        while not ev.processed:
            env.step()
        return ev.value


class Communicator:
    """Collectives over the devices of ``spec`` (a :class:`ClusterSpec`).

    ``chunk_bytes``: the largest message piece a link carries at once (store-and-forward
    unit on multi-hop paths) and the pipelining unit of the tree and broadcast
    algorithms. ``env``: share a SimPy environment with other models (a training
    scheduler); a fresh one by default. Time is integer cycles of the device clock;
    ``now_cycles`` is the current simulated time.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        *,
        chunk_bytes: int = 1 << 20,
        env: simpy.Environment | None = None,
        _topology: Topology | None = None,
    ) -> None:
        if not isinstance(spec, ClusterSpec):
            raise CommError(f"open_cluster needs a cluster spec, got {type(spec).__name__}")
        if (
            isinstance(chunk_bytes, bool)
            or not isinstance(chunk_bytes, (int, np.integer))
            or chunk_bytes < 1
        ):
            raise CommError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
        chunk_bytes = int(chunk_bytes)
        self.spec = spec
        self.size = spec.devices
        self.device: DeviceSpec = spec.device
        self.clock_ghz = spec.device.clock_ghz
        self.topology: Topology = build_topology(spec) if _topology is None else _topology
        self.env = env if env is not None else simpy.Environment()
        self.links = LinkModel(self.topology, self.clock_ghz, self.env, chunk_bytes)
        self.chunk_bytes = chunk_bytes
        self.records: list[CollectiveRecord] = []
        self.compute_records: list[ComputeRecord] = []
        self.listeners: list[Any] = []
        #: the calls started and not finished yet, in start order (a profiling session
        #: stopped meanwhile counts them up to its stop)
        self.in_flight: dict[int, CallInFlight] = {}
        self._free_at = [0] * self.size
        self._out_gbs = [0.0] * self.size
        for (u, _), (b, _) in self.topology.links.items():
            if u < self.size:
                self._out_gbs[u] += b
        self._mailbox: dict[tuple[int, int], list[Work]] = {}
        #: the all-reduce algorithm "auto" chose, per (group, element count, width)
        self._auto_choice: dict[tuple[tuple[tuple[int, ...], ...], int, int, bool], str] = {}
        #: the links each exactly timed ring in flight holds (:meth:`ring_exact`)
        self._held: dict[int, tuple[set[tuple[int, int]], CallInFlight]] = {}

    def __repr__(self) -> str:
        return f"Communicator({self.spec.name!r}, ranks={self.size}, topology={self.topology.kind})"

    @property
    def now_cycles(self) -> int:
        return int(self.env.now)

    def cycles_to_s(self, cycles: float) -> float:
        return cycles / (self.clock_ghz * 1e9)

    @property
    def peak_link_bandwidth_gbs(self) -> float:
        """The fastest device link's bandwidth (one direction), GB/s."""
        return max(b for b, _ in self.topology.links.values())

    def out_bandwidth_gbs(self, rank: int) -> float:
        """The bandwidth of all of ``rank``'s outgoing links together (GB/s); every link
        is bidirectional, so it is also what the rank can receive."""
        return self._out_gbs[self._rank(rank, "rank", "out_bandwidth_gbs")]

    def peak_busbw_gbs(self, name: str, ranks: Sequence[int]) -> float:
        """The highest bus bandwidth collective ``name`` could reach over ``ranks`` (GB/s):
        for ``send`` (``ranks = [src, dst]``) the slowest link (or switch fabric) of its
        path; for a collective the mean over its ranks of :meth:`out_bandwidth_gbs`.
        Every collective's bytes-per-rank bound makes ``busbw`` at most that mean:
        all-reduce sends at least 2 (n-1) S in all (each element needs 2 (n-1) one-way
        transfers to be combined and known everywhere), reduce-scatter, all-gather and
        all-to-all (n-1) S, broadcast S into each rank other than the root and S out of
        the root; with the bus factors these are each ``busbw <= mean out bandwidth``."""
        if name == "send":
            src, dst = ranks
            path = self.topology.route(src, dst)
            bws = [self.topology.links[(u, v)][0] for u, v in zip(path, path[1:], strict=False)]
            bws += [self.topology.fabric[u] for u in path[1:-1] if u in self.topology.fabric]
            return min(bws)
        return sum(self._out_gbs[r] for r in ranks) / len(ranks)

    def link_names(self) -> list[str]:
        return [link_name(u, v, self.size) for u, v in self.topology.links]

    # -- argument checks ----------------------------------------------------------------

    def _rank(self, r: Any, what: str, where: str) -> int:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
            raise CommError(f"{where}: {what} must be an integer rank, got {r!r}")
        if not 0 <= r < self.size:
            raise CommError(
                f"{where}: {what} {r} is outside the cluster (ranks 0..{self.size - 1})"
            )
        return int(r)

    def _group(self, ranks: Sequence[int] | None, where: str) -> list[int]:
        if ranks is None:
            return list(range(self.size))
        group = [self._rank(r, "rank", where) for r in ranks]
        if len(set(group)) != len(group):
            raise CommError(f"{where}: ranks {list(ranks)} repeat a rank")
        if len(group) < 2:
            raise CommError(f"{where}: a collective needs at least 2 ranks, got {group}")
        return group

    def _buffers(
        self,
        where: str,
        group: list[int],
        buffers: Sequence[Any] | None,
        nbytes: int | None,
        reduces: bool = False,
    ) -> tuple[list[np.ndarray] | None, int, int]:
        """(flat copies or None, element count, itemsize) of a call's data. Buffers must
        hold numbers (integers, floats, complex); bools only where nothing is reduced
        (``reduces``): a sum of bools is a count or an "or", and NCCL has neither."""
        if (buffers is None) == (nbytes is None):
            raise CommError(f"{where}: give either buffers (functional) or nbytes (timing)")
        if buffers is None:
            if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
                raise CommError(f"{where}: nbytes must be a non-negative integer, got {nbytes!r}")
            return None, int(nbytes), 1
        if len(buffers) != len(group):
            raise CommError(f"{where}: {len(buffers)} buffers for {len(group)} ranks")
        arrs = [np.asarray(b) for b in buffers]
        a0 = arrs[0]
        if a0.dtype.kind == "b" and reduces:
            raise CommError(
                f"{where}: rank {group[0]}'s buffer is bool; a reduction needs numbers "
                "(integers, floats or complex); bools can only be moved (all_gather, "
                "broadcast, all_to_all, send)"
            )
        if a0.dtype.kind not in "biufc":
            raise CommError(
                f"{where}: rank {group[0]}'s buffer is {a0.dtype}; buffers must hold numbers "
                "(integers, floats or complex) or bools"
            )
        for k, a in enumerate(arrs):
            if a.shape != a0.shape or a.dtype != a0.dtype:
                raise CommError(
                    f"{where}: rank {group[k]}'s buffer is {a.shape} {a.dtype}, "
                    f"rank {group[0]}'s is {a0.shape} {a0.dtype}"
                )
        return [a.reshape(-1).copy() for a in arrs], a0.size, a0.dtype.itemsize

    def _algorithm(self, name: str, algorithm: str | None) -> str:
        """The algorithm a call names, checked; ``None`` and ``"auto"`` give the
        collective's only algorithm, or :data:`AUTO` where it has several (the caller
        picks per size with its ``_auto_*``)."""
        algos = ALGORITHMS[name]
        if algorithm is None or algorithm == AUTO:
            return algos[0] if len(algos) == 1 else AUTO
        if algorithm not in algos:
            raise CommError(
                f"{name}: unknown algorithm {algorithm!r} (known: {AUTO}, {', '.join(algos)})"
            )
        return algorithm

    def _order(self, group: list[int]) -> list[int]:
        """The group's members in the topology's ring order."""
        members = set(group)
        return [r for r in self.topology.ring if r in members]

    def _chunk_elems(self, itemsize: int) -> int:
        """Elements of one pipelining chunk (``chunk_bytes`` of them, at least one)."""
        return max(1, self.chunk_bytes // itemsize)

    def _pieces(self, count: int, itemsize: int) -> int:
        """The chunks a message of ``count`` elements is pipelined in (at least one)."""
        return max(1, -(-count // self._chunk_elems(itemsize)))

    def chunk_transfers(self, name: str, algorithm: str, n: int, count: int, itemsize: int) -> int:
        """How many chunk transfers (messages x chunks per message, one per link hop not
        counted) collective ``name`` over ``n`` ranks of ``count`` elements schedules, at
        most: :data:`MAX_CHUNK_TRANSFERS` bounds it."""

        def msgs(m: int, elems: int) -> int:  # m messages of up to elems elements
            return m * max(1, -(-elems * itemsize // self.chunk_bytes))

        def part(parts: int) -> int:
            return -(-count // parts)

        if name == "send":
            return msgs(1, count)
        if name in ("broadcast",) or algorithm == "tree":
            p = self._pieces(count, itemsize)
            return msgs((n - 1) * p * (2 if algorithm == "tree" else 1), part(p))
        if algorithm == "hierarchical":
            k = self.topology.devices_per_node or 1
            m = n // k
            return msgs(2 * m * k * (k - 1), part(k)) + msgs(2 * k * m * (m - 1), part(k * m))
        steps = 2 * (n - 1) if name == "all_reduce" else n - 1
        return msgs(n * steps, part(n))

    def _servers(self, a: int, b: int) -> int:
        """The FIFO servers (links, switch fabrics) a chunk from ``a`` to ``b`` passes:
        counted without routing on a ring or a switch (where a many-rank tree would
        otherwise run a breadth-first search per parent), else from the route."""
        topo = self.topology
        if (a, b) in topo.links:
            return 1
        if topo.kind == "ring":
            d = abs(a - b)
            return min(d, topo.devices - d)
        if topo.kind == "switch":
            return 3  # up-link, fabric, down-link
        return len(self.links.servers(a, b))

    def _sim_work(
        self, name: str, algorithm: str, group: Sequence[int], count: int, isz: int
    ) -> int:
        """The chunk hops (one per chunk per link or fabric it crosses: SimPy events and
        bookings) simulating the call would take, at most: what
        :data:`MAX_CHUNK_TRANSFERS` bounds. A message over one link costs one event
        however many chunks it has, but a booking per chunk, so it counts its chunks."""
        n = len(group)
        base = self.chunk_transfers(name, algorithm, n, count, isz)
        if (
            name in ("send", "all_to_all")
            or algorithm == "hierarchical"
            or base > (MAX_CHUNK_TRANSFERS)
        ):
            return base  # hierarchical steps are single links; the others keep their count
        order = self._order(list(group))
        if algorithm == "tree":
            hops = sum(self._servers(order[i], order[(i - 1) // 2]) for i in range(1, n))
            return 2 * self._pieces(count, isz) * hops
        hops = sum(self._servers(a, b) for a, b in zip(order, order[1:] + order[:1], strict=True))
        if name == "broadcast":
            return self._pieces(count, isz) * hops
        # ring steps: every step moves one segment over each pair of neighbours
        return base // n * hops

    def _sim_floor(self, name: str, algorithm: str, group: Sequence[int]) -> int:
        """:meth:`_sim_work` of the smallest message (one element, one chunk): what no
        size or chunk can bring below."""
        return self._sim_work(name, algorithm, group, 1, 1)

    def _ring_links(
        self, name: str, algorithm: str, group: Sequence[int]
    ) -> list[tuple[int, int]] | None:
        """The links of a ring collective's steps (position ``i`` to ``i + 1`` of the
        ring order), when :meth:`ring_exact` can time it: the ring algorithm, every step
        one direct link (so each link carries one rank's sends, in step order), no
        refresh on them and no per-chunk link recording. Else ``None``."""
        if name not in _RING_PHASES or algorithm != "ring" or self.links.record:
            return None
        order = self._order(list(group))
        pairs = list(zip(order, order[1:] + order[:1], strict=True))
        ports = self.links.ports
        if any(p not in ports or ports[p].refresh_cycles for p in pairs):
            return None
        return pairs

    def _exact_fits(self, name: str, n: int) -> bool:
        """Whether the ring steps x ranks of ``name`` over ``n`` ranks are within
        :data:`MAX_RING_CELLS`."""
        return len(_RING_PHASES[name]) * (n - 1) * n <= MAX_RING_CELLS

    def _exact_ring(
        self, name: str, algorithm: str, group: list[int], count: int, isz: int, functional: bool
    ) -> list[tuple[int, int]] | None:
        """The ring links when this call may be timed exactly by :meth:`ring_exact`:
        timing mode, a ring over direct links within :data:`MAX_RING_CELLS`, and no
        other call in flight (so its links are idle and, while it runs, no earlier
        booking can come between its own)."""
        if functional or self.in_flight or name not in _RING_PHASES:
            return None
        pairs = self._ring_links(name, algorithm, group)
        if pairs is None or not self._exact_fits(name, len(group)):
            return None
        if not self._int64_fits(name, pairs, count * isz):
            return None
        return pairs

    def _int64_fits(self, name: str, pairs: list[tuple[int, int]], nbytes: int) -> bool:
        """Whether :meth:`_ring_times` on segments of at most ``nbytes`` stays within
        int64 (its cycles and byte-by-rate products; beyond, the call is simulated)."""
        ports = [self.links.ports[p] for p in pairs]
        steps = len(_RING_PHASES[name]) * (len(pairs) - 1)
        big = (nbytes + self.chunk_bytes) * max(p._den for p in ports) + max(
            self.links.latency_cycles[p] for p in pairs
        )
        free = max(p.free_at for p in ports)
        return big * (steps + 2) + max(int(self.env.now), free) < 1 << 62

    def _runnable(
        self, name: str, algorithm: str, group: list[int], count: int, isz: int, functional: bool
    ) -> bool:
        """Whether the call would run rather than be refused (:meth:`_bound`)."""
        if self._exact_ring(name, algorithm, group, count, isz, functional) is not None:
            return True
        return self._sim_work(name, algorithm, group, count, isz) <= MAX_CHUNK_TRANSFERS

    def refused(
        self,
        name: str,
        algorithm: str,
        nbytes: int,
        ranks: Sequence[int] | None = None,
        *,
        functional: bool = False,
    ) -> tuple[int, int] | None:
        """Whether collective ``name`` of ``nbytes`` (timing mode unless
        ``functional``) by ``algorithm`` over ``ranks`` (default all) would be refused
        as too costly to model: ``None`` when it runs, else ``(work, floor)``: the chunk
        hops it would simulate and those of a one-byte message (above
        :data:`MAX_CHUNK_TRANSFERS` too: no size or chunk makes it run)."""
        group = self._group(ranks, name)
        if self._runnable(name, algorithm, group, int(nbytes), 1, functional):
            return None
        return (
            self._sim_work(name, algorithm, group, int(nbytes), 1),
            self._sim_floor(name, algorithm, group),
        )

    def _bound(
        self,
        where: str,
        algorithm: str,
        group: list[int],
        count: int,
        itemsize: int,
        exact: bool = False,
    ) -> None:
        """Refuse, in one line, a call simulating more than :data:`MAX_CHUNK_TRANSFERS`
        chunk hops (``exact``: timed by :meth:`ring_exact`, which the caller checked
        against :data:`MAX_RING_CELLS`), with the advice that can make it run."""
        if exact:
            return
        n = len(group)
        t = self._sim_work(where, algorithm, group, count, itemsize)
        if t <= MAX_CHUNK_TRANSFERS:
            return
        if self._sim_floor(where, algorithm, group) <= MAX_CHUNK_TRANSFERS:
            advice = "use fewer ranks, a smaller message or a larger chunk_bytes"
        else:
            others = [
                a
                for a in ALGORITHMS[where]
                if a != algorithm
                and (a != "hierarchical" or self._hierarchical_fits(group))
                and self._sim_floor(where, a, group) <= MAX_CHUNK_TRANSFERS
            ]
            advice = "at any size and chunk; use fewer ranks" + (
                f" or algorithm {' or '.join(others)}" if others else ""
            )
            if (
                self._ring_links(where, algorithm, group) is not None
                and self._exact_fits(where, n)
                and self.in_flight
            ):
                advice += (
                    ", or issue it with no other call in flight (a ring over direct "
                    "links is then timed exactly, without simulating each transfer)"
                )
        raise CommError(
            f"{where}: {n} ranks moving {count * itemsize:,} B in chunks of "
            f"{self.chunk_bytes:,} B would take {t:,} chunk transfers, more than the "
            f"{MAX_CHUNK_TRANSFERS:,} modelled; {advice}"
        )

    # -- exact ring timing --------------------------------------------------------------

    def ring_exact(
        self,
        name: str,
        group: list[int],
        lens: Sequence[int],
        nbytes: int,
        *,
        async_op: bool = False,
        _pairs: list[tuple[int, int]] | None = None,
    ) -> Any:
        """Time ring collective ``name`` (all_reduce, reduce_scatter, all_gather) over
        ``group`` exactly as the link model would, without one SimPy event per transfer,
        or return ``None`` where that cannot be done exactly. ``lens``: the bytes of the
        segment that starts at each position of the ring order (segment ``k`` is what
        position ``k`` owns, as :meth:`~._schedule.Schedule.ring_reduce_scatter` cuts
        it); ``nbytes`` the record's size.

        Why it is exact: each step of the ring is one direct link, and the link from
        position ``i`` carries only position ``i``'s sends, so the model reduces to a
        recurrence. Step ``s`` of position ``i`` starts when step ``s - 1`` of position
        ``i - 1`` arrives (the first at the call's start), is booked on its link as
        :meth:`BandwidthPort.reserve` books it (from the later of its start and the
        link's free cycle, each chunk's ceil(bytes / bytes per cycle) cycles) and
        arrives one latency after; an empty segment books nothing and pays the latency,
        as :meth:`LinkModel.send` does. The recurrence runs one numpy step per ring step
        over all ranks (:data:`MAX_RING_CELLS` bounds it). It holds while each link's
        bookings come in step order with strictly increasing start cycles (always when
        no segment is empty, since every booking ends after it starts); where two
        could tie, their order is the simulation's event order, so the call is
        simulated instead (``None``). The links' bookings, busy cycles and byte counts
        end as the simulation leaves them; the record comes at its last arrival.

        The links must stay idle of other traffic while it runs: no other call may be
        in flight when it starts, and one started on its links before it ends is
        refused (:meth:`_run`)."""
        pairs = _pairs if _pairs is not None else self._ring_links(name, "ring", group)
        if pairs is None or self.in_flight:
            return None
        t = self._ring_times(name, pairs, lens)
        if t is None:
            return None
        end, transfers, sent, tally = t
        env = self.env
        start = int(env.now)
        done = env.event()
        call = CallInFlight(name, "ring", nbytes, tuple(group), start)
        self.in_flight[id(done)] = call
        self._held[id(done)] = (set(pairs), call)
        peak = self.peak_busbw_gbs(name, group)
        n = self.size

        def finish(_e: Any) -> None:
            del self.in_flight[id(done)]
            del self._held[id(done)]
            rec = CollectiveRecord(
                name=name,
                algorithm="ring",
                nbytes=nbytes,
                ranks=tuple(group),
                start_cycle=start,
                end_cycle=int(env.now),
                clock_ghz=self.clock_ghz,
                sent_bytes=sent,
                transfers=transfers,
                link_bytes={link_name(u, v, n): b for (u, v), b in sorted(tally.items())},
                peak_busbw_gbs=peak,
            )
            self.records.append(rec)
            for lst in self.listeners:
                lst.on_collective(rec)
            done.succeed(rec)

        env.timeout(end - start).callbacks.append(finish)
        work = Work(self, done)
        return work if async_op else work.wait()

    def _ring_times(
        self, name: str, pairs: list[tuple[int, int]], lens: Sequence[int]
    ) -> tuple[int, int, int, dict[tuple[int, int], int]] | None:
        """The recurrence of :meth:`ring_exact`: (end cycle, transfers, bytes sent,
        bytes per link), booking the links as the simulation would; ``None`` (links
        untouched) where a tie or an integer overflow could make it differ."""
        m = len(pairs)
        if not self._int64_fits(name, pairs, max(lens, default=0)):
            return None
        ports = [self.links.ports[p] for p in pairs]
        c = self.chunk_bytes
        b_of = np.asarray(lens, dtype=np.int64)
        num = np.array([p._num for p in ports], dtype=np.int64)
        den = np.array([p._den for p in ports], dtype=np.int64)
        lat = np.array([self.links.latency_cycles[p] for p in pairs], dtype=np.int64)
        now = int(self.env.now)
        full = -(-c * den // num)  # cycles of one whole chunk, per link
        free = np.array([p.free_at for p in ports], dtype=np.int64)
        busy = np.zeros(m, dtype=np.int64)
        seen = np.full(m, -1, dtype=np.int64)  # the last booking's start, this call
        tally = np.zeros(m, dtype=np.int64)
        pos = np.arange(m)
        arrive = np.full(m, now, dtype=np.int64)
        end = now
        first = True
        for o in _RING_PHASES[name]:
            for s in range(m - 1):
                launch = arrive if first else np.roll(arrive, 1)
                first = False
                b = b_of[(pos + o - s) % m]
                ne = b > 0
                if np.any(ne & (launch <= seen)):
                    return None  # a tie (or overtaking): the event order decides
                d = (b // c) * full + (-(-(b % c) * den // num))
                fin = np.maximum(launch, free) + d
                arrive = np.where(ne, fin, launch) + lat
                free = np.where(ne, fin, free)
                seen = np.where(ne, launch, seen)
                busy += np.where(ne, d, 0)
                tally += b
                end = max(end, int(arrive.max()))
        for k, p in enumerate(ports):
            if seen[k] >= 0:
                p.free_at = int(free[k])
                p.busy_cycles += int(busy[k])
                p.last_arrival = int(seen[k])
        lb = self.links.link_bytes
        out = {}
        for k, pr in enumerate(pairs):
            lb[pr] += int(tally[k])
            out[pr] = int(tally[k])
        return end, m * len(_RING_PHASES[name]) * (m - 1), int(tally.sum()), out

    # -- execution ----------------------------------------------------------------------

    def _run(
        self,
        name: str,
        algo: str,
        nbytes: int,
        group: list[int],
        sched: Schedule,
        state: dict[int, dict[str, np.ndarray]] | None,
        reduce: Any,
        finalize: Callable[[], list[np.ndarray] | None],
        kind: str = "collective",
        async_op: bool = False,
    ) -> Any:
        env = self.env
        start = env.now
        peak = self.peak_busbw_gbs(name, group)
        tally: dict[tuple[int, int], int] = {}
        tr = sched.transfers
        waiting = [len(t.deps) for t in tr]
        dependents: list[list[int]] = [[] for _ in tr]
        for i, t in enumerate(tr):
            for d in t.deps:
                dependents[d].append(i)
        if self._held:
            self._check_held(name, tr)
        payload: list[Any] = [None] * len(tr)
        left = [len(tr)]
        done = env.event()
        links = self.links
        self.in_flight[id(done)] = CallInFlight(name, algo, nbytes, tuple(group), int(start), kind)

        def finish() -> None:
            del self.in_flight[id(done)]
            rec = CollectiveRecord(
                name=name,
                algorithm=algo,
                nbytes=nbytes,
                ranks=tuple(group),
                start_cycle=int(start),
                end_cycle=int(env.now),
                clock_ghz=self.clock_ghz,
                sent_bytes=sched.sent_bytes,
                transfers=len(tr),
                link_bytes={link_name(u, v, self.size): b for (u, v), b in sorted(tally.items())},
                kind=kind,
                peak_busbw_gbs=peak,
                outputs=finalize(),
            )
            self.records.append(rec)
            for lst in self.listeners:
                lst.on_collective(rec)
            done.succeed(rec)

        def launch(i: int) -> None:
            t = tr[i]
            if state is not None:
                payload[i] = state[t.src][t.src_key][t.start : t.stop].copy()
            links.send(t.src, t.dst, (t.stop - t.start) * sched.itemsize, lambda: arrive(i), tally)

        def arrive(i: int) -> None:
            t = tr[i]
            if state is not None:
                off = t.start if t.dst_start is None else t.dst_start
                dst = state[t.dst][t.dst_key][off : off + t.stop - t.start]
                if t.op == "reduce":
                    reduce(dst, payload[i], out=dst)
                else:
                    dst[...] = payload[i]
                payload[i] = None
            left[0] -= 1
            for j in dependents[i]:
                waiting[j] -= 1
                if not waiting[j]:
                    launch(j)
            if not left[0]:
                finish()

        if tr:
            for i in range(len(tr)):
                if not waiting[i]:
                    launch(i)
        else:
            env.timeout(0).callbacks.append(lambda _e: finish())
        work = Work(self, done)
        return work if async_op else work.wait()

    def _check_held(self, name: str, tr: list[Any]) -> None:
        """Refuse a call whose transfers would cross links an exactly timed ring in
        flight holds: it was timed on the assumption that they stay idle."""
        pairs = {(t.src, t.dst) for t in tr}
        used = {ln for a, b in pairs for _, _, ln in self.links.servers(a, b) if ln is not None}
        for held, call in self._held.values():
            if used & held:
                raise CommError(
                    f"{name}: its transfers would share links with the {call.name} over "
                    f"{len(call.ranks)} ranks still in flight, which was timed exactly "
                    "on the assumption that its links stay idle; wait for it first"
                )

    def _hierarchical_fits(self, group: list[int]) -> bool:
        """Whether the hierarchical all-reduce can run over ``group``: the whole cluster
        of a hierarchical topology."""
        return self.topology.devices_per_node is not None and len(group) == self.size

    def _all_reduce_schedule(self, algo: str, group: list[int], count: int, isz: int) -> Schedule:
        """The transfers of an all-reduce of ``count`` elements of ``isz`` bytes over
        ``group`` by ``algo`` (ring, tree or hierarchical)."""
        sched = Schedule(isz)
        k = self.topology.devices_per_node
        rng = (0, count)
        if algo == "ring":
            sched.ring_all_reduce(self._order(group), rng, {})
        elif algo == "tree":
            sched.tree_all_reduce(self._order(group), rng, self._chunk_elems(isz))
        else:
            assert k is not None
            m = self.size // k
            segs = even_ranges(rng, k)
            after: dict[int, list[int]] = {}
            for a in range(m):
                after.update(sched.ring_reduce_scatter([a * k + j for j in range(k)], segs, {}, 1))
            after2: dict[int, list[int]] = {}
            if m > 1:
                for j in range(k):
                    after2.update(
                        sched.ring_all_reduce(
                            [a * k + j for a in range(m)], segs[(j + 1) % k], after
                        )
                    )
            else:
                after2 = after
            for a in range(m):
                sched.ring_all_gather([a * k + j for j in range(k)], segs, after2, 1)
        return sched

    def _max_hops(self) -> int:
        """An upper bound of the hops of any route: twice the hops from device 0 to
        the node farthest from it (:meth:`Topology.hops_to`)."""
        return max(1, 2 * max(self.topology.hops_to(0)))

    def _try_exact(
        self,
        where: str,
        algo: str,
        group: list[int],
        count: int,
        isz: int,
        functional: bool,
        async_op: bool,
        seg_of: dict[int, tuple[int, int]] | None = None,
    ) -> Any:
        """Run the call by :meth:`ring_exact` where it may (:meth:`_exact_ring`) and
        either runs alone (blocking, nothing else scheduled in the simulation, so no
        other traffic can start before it ends) or would be refused as too large to
        simulate (then other calls that would share its links are refused while it is
        in flight); else, or on a tie it cannot order, ``None``: the caller simulates.
        ``seg_of``: each rank's segment (default: the all-reduce's even split in ring
        order)."""
        pairs = self._exact_ring(where, algo, group, count, isz, functional)
        if pairs is None:
            return None
        alone = not async_op and self.env.peek() == float("inf")
        if not alone and self._sim_work(where, algo, group, count, isz) <= MAX_CHUNK_TRANSFERS:
            return None
        order = self._order(group)
        if seg_of is None:
            segs = even_ranges((0, count), len(order))
        else:
            segs = [seg_of[r] for r in order]
        lens = [(hi - lo) * isz for lo, hi in segs]
        return self.ring_exact(where, group, lens, count * isz, async_op=async_op, _pairs=pairs)

    def auto_candidates(
        self, name: str, group: Sequence[int], count: int, itemsize: int, functional: bool = False
    ) -> list[str]:
        """The algorithms ``auto`` would time for collective ``name`` over ``group``
        (``count`` elements of ``itemsize`` bytes; timing mode unless ``functional``):
        those that can run there (``hierarchical`` over the whole of a hierarchical
        cluster) and whose chunk transfers, times the hops a transfer may take (one
        for the ring, whose steps are single hops; else :meth:`_max_hops`), stay
        within :data:`MAX_CHUNK_TRANSFERS`, as long as they are not refused
        (:meth:`_bound`). When none is left, those that are not refused: the ring timed
        exactly (:meth:`ring_exact`) on a cluster too large to simulate it, an
        algorithm whose actual hops keep it within the bound. Empty: the call would be
        refused."""
        group = list(group)
        fits = [
            a for a in ALGORITHMS[name] if a != "hierarchical" or self._hierarchical_fits(group)
        ]
        runs = [a for a in fits if self._runnable(name, a, group, count, itemsize, functional)]
        # the rough first cut keeps auto's choice where one ran before exact timing
        rough = [
            a
            for a in runs
            if self.chunk_transfers(name, a, len(group), count, itemsize)
            * (1 if a in ("ring", "direct", "p2p") else self._max_hops())
            <= MAX_CHUNK_TRANSFERS
        ]
        return rough or runs

    def _auto_all_reduce(self, group: list[int], count: int, isz: int, functional: bool) -> str:
        """The all-reduce algorithm that ends first for this group and size, each run
        alone on idle links of a fresh copy of the cluster (timing mode, the same
        schedule the call would run; a ring over direct links by :meth:`ring_exact`,
        with the same cycles), as NCCL's tuner picks an algorithm per size; ties go to
        the earlier of ``ALGORITHMS["all_reduce"]``. Only :meth:`auto_candidates` are
        timed: timing the others would cost more than the call, or they cannot run.
        When none is left, the ring runs (and is refused with the usual error); when
        one is, it runs untimed. Cached per group, size and element width."""
        return self._fastest([group], count, isz, functional)

    def choose_all_reduce(self, groups: Sequence[Sequence[int]], nbytes: int) -> str:
        """The all-reduce algorithm that ends first when ``groups`` (disjoint rank
        lists) each all-reduce ``nbytes`` at the same time, on idle links of a fresh
        copy of the cluster: what ``auto`` picks for one group alone, for concurrent
        ones (a training step's data-parallel groups share links, and an algorithm
        fastest alone can contend). Candidates and ties as ``auto``'s; with several
        groups only the simulated ones (the first group's call is in flight when the
        next starts, so none is timed exactly)."""
        gs = [self._group(g, "choose_all_reduce") for g in groups]
        if not gs:
            raise CommError("choose_all_reduce: no groups")
        return self._fastest(gs, int(nbytes), 1, False)

    def _fastest(self, groups: list[list[int]], count: int, isz: int, functional: bool) -> str:
        key = (tuple(tuple(g) for g in groups), count, isz, functional)
        hit = self._auto_choice.get(key)
        if hit is not None:
            return hit
        tried = [
            a
            for a in ALGORITHMS["all_reduce"]
            if all(
                a in self.auto_candidates("all_reduce", g, count, isz, functional) for g in groups
            )
        ]
        if len(groups) > 1:  # concurrent groups multiply the transfers timed
            simulated = [
                a
                for a in tried
                if all(
                    self._sim_work("all_reduce", a, g, count, isz) <= MAX_CHUNK_TRANSFERS
                    for g in groups
                )
            ]
            tried = [
                a
                for a in simulated
                if len(groups)
                * self.chunk_transfers("all_reduce", a, len(groups[0]), count, isz)
                * (1 if a == "ring" else self._max_hops())
                <= MAX_CHUNK_TRANSFERS
            ] or simulated[:1]
        best, best_end = (tried or ALGORITHMS["all_reduce"])[0], None
        for a in tried if len(tried) > 1 else ():  # one left: nothing to time
            scratch = Communicator(self.spec, chunk_bytes=self.chunk_bytes, _topology=self.topology)
            works = None
            if len(groups) == 1 and not functional:
                works = [scratch._try_exact("all_reduce", a, groups[0], count, isz, False, False)]
                works = None if works[0] is None else works
            if works is None:
                if any(
                    self._sim_work("all_reduce", a, g, count, isz) > MAX_CHUNK_TRANSFERS
                    for g in groups
                ):
                    continue  # not timed exactly here (a tie), so it is refused too
                works = [
                    scratch._run(
                        "all_reduce",
                        a,
                        count * isz,
                        g,
                        scratch._all_reduce_schedule(a, g, count, isz),
                        None,
                        None,
                        lambda: None,
                        async_op=True,
                    )
                    for g in groups
                ]
            end = max((w if isinstance(w, CollectiveRecord) else w.wait()).end_cycle for w in works)
            if best_end is None or end < best_end:
                best, best_end = a, end
        self._auto_choice[key] = best
        return best

    # -- collectives --------------------------------------------------------------------

    def all_reduce(
        self,
        buffers: Sequence[Any] | None = None,
        *,
        nbytes: int | None = None,
        algorithm: str | None = None,
        op: str = "sum",
        ranks: Sequence[int] | None = None,
        async_op: bool = False,
    ) -> Any:
        """Reduce one buffer per rank elementwise (``op``: sum, max, min, prod) and give
        every rank the result. ``algorithm``: ``auto`` (default: of the algorithms that
        can run, the one that ends first alone on idle links for this group and size,
        measured on a fresh copy of the cluster, as NCCL's tuner picks per size),
        ``ring``, ``tree`` or ``hierarchical`` (whole cluster of a hierarchical
        topology); the record's ``algorithm`` is the one that ran. ``buffers``: one
        array per rank of ``ranks`` (default all), all of one shape and dtype
        (functional mode; ``record.outputs`` holds each rank's result); or ``nbytes``
        (timing mode). Returns a :class:`CollectiveRecord` (a :class:`Work` with
        ``async_op``). Raises :class:`CommError` on a bad rank, buffer or algorithm."""
        where = "all_reduce"
        group = self._group(ranks, where)
        algo = self._algorithm(where, algorithm)
        if op not in _REDUCE_OPS:
            raise CommError(f"{where}: unknown op {op!r} (known: {', '.join(_REDUCE_OPS)})")
        flat, count, isz = self._buffers(where, group, buffers, nbytes, reduces=True)
        if algo == AUTO:
            algo = self._auto_all_reduce(group, count, isz, flat is not None)
        elif algo == "hierarchical" and not self._hierarchical_fits(group):
            raise CommError(
                f"{where}: the hierarchical algorithm needs the whole "
                "cluster on a hierarchical topology (this is "
                f"{self.topology.kind}, {len(group)} of {self.size} ranks)"
            )
        done = self._try_exact(where, algo, group, count, isz, flat is not None, async_op)
        if done is not None:
            return done
        self._bound(where, algo, group, count, isz)
        sched = self._all_reduce_schedule(algo, group, count, isz)
        shape = None if buffers is None else np.asarray(buffers[0]).shape
        state = None if flat is None else {r: {"buf": f} for r, f in zip(group, flat, strict=True)}

        def finalize() -> list[np.ndarray] | None:
            if state is None:
                return None
            return [state[r]["buf"].reshape(shape) for r in group]

        return self._run(
            where,
            algo,
            count * isz,
            group,
            sched,
            state,
            _REDUCE_OPS[op],
            finalize,
            async_op=async_op,
        )

    def reduce_scatter(
        self,
        buffers: Sequence[Any] | None = None,
        *,
        nbytes: int | None = None,
        algorithm: str | None = None,
        op: str = "sum",
        ranks: Sequence[int] | None = None,
        async_op: bool = False,
    ) -> Any:
        """Reduce one buffer per rank; the ``k``-th rank of the group gets the ``k``-th of
        ``len(ranks)`` equal parts of the result (flat). Ring algorithm. Functional
        buffers must split evenly over the ranks."""
        where = "reduce_scatter"
        group = self._group(ranks, where)
        algo = self._algorithm(where, algorithm)
        if op not in _REDUCE_OPS:
            raise CommError(f"{where}: unknown op {op!r} (known: {', '.join(_REDUCE_OPS)})")
        flat, count, isz = self._buffers(where, group, buffers, nbytes, reduces=True)
        n = len(group)
        if flat is not None and count % n:
            raise CommError(f"{where}: {count} elements do not split evenly over {n} ranks")
        seg_of = dict(zip(group, even_ranges((0, count), n), strict=True))
        order = self._order(group)
        done = self._try_exact(where, algo, group, count, isz, flat is not None, async_op, seg_of)
        if done is not None:
            return done
        self._bound(where, algo, group, count, isz)
        sched = Schedule(isz)
        sched.ring_reduce_scatter(order, [seg_of[r] for r in order], {}, 0)
        state = None if flat is None else {r: {"buf": f} for r, f in zip(group, flat, strict=True)}

        def finalize() -> list[np.ndarray] | None:
            if state is None:
                return None
            return [state[r]["buf"][slice(*seg_of[r])].copy() for r in group]

        return self._run(
            where,
            algo,
            count * isz,
            group,
            sched,
            state,
            _REDUCE_OPS[op],
            finalize,
            async_op=async_op,
        )

    def all_gather(
        self,
        buffers: Sequence[Any] | None = None,
        *,
        nbytes: int | None = None,
        algorithm: str | None = None,
        ranks: Sequence[int] | None = None,
        async_op: bool = False,
    ) -> Any:
        """Every rank gets every rank's buffer: outputs of shape ``(len(ranks),) +
        shape``, in group order. Ring algorithm. In timing mode ``nbytes`` is the
        gathered size (nccl-tests' convention)."""
        where = "all_gather"
        group = self._group(ranks, where)
        algo = self._algorithm(where, algorithm)
        flat, count, isz = self._buffers(where, group, buffers, nbytes)
        n = len(group)
        total = count if flat is None else count * n
        seg_of = dict(zip(group, even_ranges((0, total), n), strict=True))
        order = self._order(group)
        done = self._try_exact(where, algo, group, total, isz, flat is not None, async_op, seg_of)
        if done is not None:
            return done
        self._bound(where, algo, group, total, isz)
        sched = Schedule(isz)
        sched.ring_all_gather(order, [seg_of[r] for r in order], {}, 0)
        state = None
        if flat is not None:
            state = {}
            for r, f in zip(group, flat, strict=True):
                out = np.zeros(total, dtype=f.dtype)
                out[slice(*seg_of[r])] = f
                state[r] = {"buf": out}
        shape = None if buffers is None else (n, *np.asarray(buffers[0]).shape)

        def finalize() -> list[np.ndarray] | None:
            if state is None:
                return None
            return [state[r]["buf"].reshape(shape) for r in group]

        return self._run(
            where, algo, total * isz, group, sched, state, None, finalize, async_op=async_op
        )

    def broadcast(
        self,
        buffers: Sequence[Any] | None = None,
        *,
        nbytes: int | None = None,
        root: int = 0,
        algorithm: str | None = None,
        ranks: Sequence[int] | None = None,
        async_op: bool = False,
    ) -> Any:
        """Every rank gets ``root``'s buffer (the others' buffers give only the shape).
        Ring algorithm: a chain from the root in ring order, pipelined in chunks."""
        where = "broadcast"
        group = self._group(ranks, where)
        algo = self._algorithm(where, algorithm)
        root = self._rank(root, "root", where)
        if root not in group:
            raise CommError(f"{where}: root {root} is not in the group {group}")
        flat, count, isz = self._buffers(where, group, buffers, nbytes)
        self._bound(where, algo, group, count, isz)
        order = self._order(group)
        i = order.index(root)
        order = order[i:] + order[:i]
        sched = Schedule(isz)
        sched.chain_broadcast(order, (0, count), self._chunk_elems(isz))
        state = None if flat is None else {r: {"buf": f} for r, f in zip(group, flat, strict=True)}
        shape = None if buffers is None else np.asarray(buffers[0]).shape

        def finalize() -> list[np.ndarray] | None:
            if state is None:
                return None
            return [state[r]["buf"].reshape(shape) for r in group]

        return self._run(
            where, algo, count * isz, group, sched, state, None, finalize, async_op=async_op
        )

    def all_to_all(
        self,
        buffers: Sequence[Any] | None = None,
        *,
        nbytes: int | None = None,
        algorithm: str | None = None,
        ranks: Sequence[int] | None = None,
        async_op: bool = False,
    ) -> Any:
        """Block ``j`` of the ``k``-th rank's (flat) buffer goes to the ``j``-th rank, as
        its block ``k``. All blocks move at once over their shortest paths (``direct``).
        Functional buffers must split evenly over the ranks."""
        where = "all_to_all"
        group = self._group(ranks, where)
        algo = self._algorithm(where, algorithm)
        flat, count, isz = self._buffers(where, group, buffers, nbytes)
        n = len(group)
        if flat is not None and count % n:
            raise CommError(f"{where}: {count} elements do not split evenly over {n} ranks")
        self._bound(where, algo, group, count, isz)
        blocks = even_ranges((0, count), n)
        sched = Schedule(isz)
        for s in range(1, n):
            for k in range(n):
                j = (k + s) % n
                t = sched.add(group[k], group[j], blocks[j], "copy", [], "in", "out")
                sched.transfers[t].dst_start = blocks[k][0]
                if blocks[j][1] - blocks[j][0] != blocks[k][1] - blocks[k][0]:
                    # uneven timing-mode sizes: send block j's length into slot k
                    sched.transfers[t].dst_start = None
        state = None
        if flat is not None:
            state = {}
            for k, (r, f) in enumerate(zip(group, flat, strict=True)):
                out = np.zeros_like(f)
                out[slice(*blocks[k])] = f[slice(*blocks[k])]
                state[r] = {"in": f, "out": out}
        shape = None if buffers is None else np.asarray(buffers[0]).shape

        def finalize() -> list[np.ndarray] | None:
            if state is None:
                return None
            return [state[r]["out"].reshape(shape) for r in group]

        return self._run(
            where, algo, count * isz, group, sched, state, None, finalize, async_op=async_op
        )

    # -- point to point -----------------------------------------------------------------

    def send(
        self,
        src: int,
        dst: int,
        buffer: Any = None,
        *,
        nbytes: int | None = None,
        async_op: bool = False,
    ) -> Any:
        """Move ``buffer`` (or ``nbytes``) from rank ``src`` to rank ``dst`` over the
        shortest path, chunked; :meth:`recv` on ``dst`` takes it. Returns the record."""
        where = "send"
        src, dst = self._rank(src, "src", where), self._rank(dst, "dst", where)
        if src == dst:
            raise CommError(f"{where}: src and dst are both rank {src}")
        bufs = None if buffer is None else [buffer, buffer]
        flat, count, isz = self._buffers(where, [src, dst], bufs, nbytes)
        self._bound(where, "p2p", [src, dst], count, isz)
        sched = Schedule(isz)
        sched.add(src, dst, (0, count), "copy", [])
        state = None
        if flat is not None:
            state = {src: {"buf": flat[0]}, dst: {"buf": np.zeros_like(flat[0])}}
        shape = None if buffer is None else np.asarray(buffer).shape

        def finalize() -> list[np.ndarray] | None:
            return None if state is None else [state[dst]["buf"].reshape(shape)]

        work = self._run(
            where,
            "p2p",
            count * isz,
            [src, dst],
            sched,
            state,
            None,
            finalize,
            kind="p2p",
            async_op=True,
        )
        self._mailbox.setdefault((src, dst), []).append(work)
        return work if async_op else work.wait()

    def recv(self, dst: int, src: int) -> Any:
        """The oldest message ``src`` sent to ``dst`` not yet received: its array in
        functional mode, else its record; waits for it to arrive."""
        where = "recv"
        dst, src = self._rank(dst, "dst", where), self._rank(src, "src", where)
        box = self._mailbox.get((src, dst))
        if not box:
            raise CommError(f"{where}: rank {src} has sent nothing (left) to rank {dst}")
        rec = box.pop(0).wait()
        return rec if rec.outputs is None else rec.outputs[0]

    # -- compute ------------------------------------------------------------------------

    def compute(
        self,
        rank: int | Sequence[int] | None,
        cycles: int,
        *,
        label: str = "compute",
        async_op: bool = False,
    ) -> Any:
        """Book ``cycles`` of device compute on ``rank`` (a rank, a list, or ``None`` for
        all): each device runs its compute in order, from the later of now and its
        previous compute's end. Communication runs on the links meanwhile, so compute
        issued with ``async_op=True`` overlaps collectives. Returns the records."""
        where = "compute"
        if isinstance(cycles, bool) or not isinstance(cycles, (int, np.integer)) or cycles < 0:
            raise CommError(f"{where}: cycles must be a non-negative integer, got {cycles!r}")
        ranks = (
            list(range(self.size))
            if rank is None
            else ([rank] if not isinstance(rank, Sequence) else list(rank))
        )
        ranks = [self._rank(r, "rank", where) for r in ranks]
        if not ranks:
            raise CommError(f"{where}: the list of ranks is empty")
        now = self.now_cycles
        recs = []
        for r in ranks:
            start = max(now, self._free_at[r])
            rec = ComputeRecord(r, start, start + int(cycles), label)
            self._free_at[r] = rec.end_cycle
            self.compute_records.append(rec)
            for lst in self.listeners:
                lst.on_compute(rec)
            recs.append(rec)
        end = max(rec.end_cycle for rec in recs)
        work = Work(self, self.env.timeout(end - now, value=recs))
        return work if async_op else work.wait()

    def busy_until(self, rank: int | None = None) -> int:
        """The cycle at which the compute booked on ``rank`` (``None``: every rank) ends;
        at most :attr:`now_cycles` when it is idle."""
        if rank is None:
            return max(self._free_at)
        return self._free_at[self._rank(rank, "rank", "busy_until")]

    def run(
        self,
        rank: int | Sequence[int] | None,
        workload: Any,
        *,
        async_op: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Emulate ``workload`` (as :func:`wia_hw.run`, on the cluster's device spec) and
        book its cycles as compute on ``rank``."""
        from ..runtime import run

        res = run(workload, device=self.device, **kwargs)
        name = workload if isinstance(workload, str) else getattr(workload, "name", "workload")
        return self.compute(rank, res.cycles, label=str(name), async_op=async_op)

    def synchronize(self) -> None:
        """Run the simulation until everything issued has finished."""
        self.env.run()


def open_cluster(
    spec: Any = "wia-cluster-8",
    *,
    overrides: Any = None,
    chunk_bytes: int = 1 << 20,
    env: simpy.Environment | None = None,
) -> Communicator:
    """A :class:`Communicator` over a cluster spec (built-in name, path, mapping or
    :class:`ClusterSpec`; ``overrides`` as for :func:`wia_hw.load_spec`)."""
    from ..spec import load_spec

    s = load_spec(spec, overrides)
    if not isinstance(s, ClusterSpec):
        raise CommError(
            f"{s.name!r} is a device spec; open_cluster needs a cluster spec (e.g. wia-cluster-8)"
        )
    return Communicator(s, chunk_bytes=chunk_bytes, env=env)
