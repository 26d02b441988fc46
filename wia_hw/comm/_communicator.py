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
]

#: The most chunk transfers one call may schedule (each is a SimPy event of about 10 us
#: CPU): a ring all-reduce over 10,000 ranks, or 1-byte chunks of a 256 MiB message,
#: would run for hours. The biggest call of the docs and tests is far below it.
MAX_CHUNK_TRANSFERS = 2_000_000

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
        self._auto_choice: dict[tuple[tuple[int, ...], int, int], str] = {}

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

    def _bound(self, where: str, algorithm: str, n: int, count: int, itemsize: int) -> None:
        t = self.chunk_transfers(where, algorithm, n, count, itemsize)
        if t > MAX_CHUNK_TRANSFERS:
            raise CommError(
                f"{where}: {n} ranks moving {count * itemsize:,} B in chunks of "
                f"{self.chunk_bytes:,} B would take {t:,} chunk transfers, more than the "
                f"{MAX_CHUNK_TRANSFERS:,} modelled; use fewer ranks, a smaller message or a "
                "larger chunk_bytes"
            )

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

    def auto_candidates(
        self, name: str, group: Sequence[int], count: int, itemsize: int
    ) -> list[str]:
        """The algorithms ``auto`` would time for collective ``name`` over ``group``
        (``count`` elements of ``itemsize`` bytes): those that can run there
        (``hierarchical`` over the whole of a hierarchical cluster) and whose chunk
        transfers, times the hops a transfer may take (one for the ring, whose steps
        are single hops; else :meth:`_max_hops`), stay within
        :data:`MAX_CHUNK_TRANSFERS`. Empty: the call would be refused."""
        out = []
        for a in ALGORITHMS[name]:
            if a == "hierarchical" and not self._hierarchical_fits(list(group)):
                continue
            work = self.chunk_transfers(name, a, len(group), count, itemsize)
            if work * (1 if a in ("ring", "direct", "p2p") else self._max_hops()) > (
                MAX_CHUNK_TRANSFERS
            ):
                continue
            out.append(a)
        return out

    def _auto_all_reduce(self, group: list[int], count: int, isz: int) -> str:
        """The all-reduce algorithm that ends first for this group and size, each run
        alone on idle links of a fresh copy of the cluster (timing mode, the same
        schedule the call would run), as NCCL's tuner picks an algorithm per size;
        ties go to the earlier of ``ALGORITHMS["all_reduce"]``. An algorithm that cannot
        run here (hierarchical off a hierarchical topology or on part of the cluster)
        is not tried, nor one whose chunk transfers times the hops a transfer may take
        (at most twice the farthest node's from device 0) pass
        :data:`MAX_CHUNK_TRANSFERS`: timing it would cost more than the call. When
        none is left, the ring runs (and is refused with the usual error if it is too
        large); when one is, it runs untimed. Cached per group, size and element
        width."""
        return self._fastest([group], count, isz)

    def choose_all_reduce(self, groups: Sequence[Sequence[int]], nbytes: int) -> str:
        """The all-reduce algorithm that ends first when ``groups`` (disjoint rank
        lists) each all-reduce ``nbytes`` at the same time, on idle links of a fresh
        copy of the cluster: what ``auto`` picks for one group alone, for concurrent
        ones (a training step's data-parallel groups share links, and an algorithm
        fastest alone can contend). Candidates and ties as ``auto``'s."""
        gs = [self._group(g, "choose_all_reduce") for g in groups]
        if not gs:
            raise CommError("choose_all_reduce: no groups")
        return self._fastest(gs, int(nbytes), 1)

    def _fastest(self, groups: list[list[int]], count: int, isz: int) -> str:
        key = (tuple(tuple(g) for g in groups), count, isz)
        hit = self._auto_choice.get(key)
        if hit is not None:
            return hit
        tried = [
            a
            for a in ALGORITHMS["all_reduce"]
            if all(a in self.auto_candidates("all_reduce", g, count, isz) for g in groups)
        ]
        if len(groups) > 1:  # concurrent groups multiply the transfers timed
            tried = [
                a
                for a in tried
                if len(groups)
                * self.chunk_transfers("all_reduce", a, len(groups[0]), count, isz)
                * (1 if a == "ring" else self._max_hops())
                <= MAX_CHUNK_TRANSFERS
            ] or tried[:1]
        best, best_end = (tried or ALGORITHMS["all_reduce"])[0], None
        for a in tried if len(tried) > 1 else ():  # one left: nothing to time
            scratch = Communicator(self.spec, chunk_bytes=self.chunk_bytes, _topology=self.topology)
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
            end = max(w.wait().end_cycle for w in works)
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
            algo = self._auto_all_reduce(group, count, isz)
        elif algo == "hierarchical" and not self._hierarchical_fits(group):
            raise CommError(
                f"{where}: the hierarchical algorithm needs the whole "
                "cluster on a hierarchical topology (this is "
                f"{self.topology.kind}, {len(group)} of {self.size} ranks)"
            )
        self._bound(where, algo, len(group), count, isz)
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
        self._bound(where, algo, n, count, isz)
        seg_of = dict(zip(group, even_ranges((0, count), n), strict=True))
        order = self._order(group)
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
        self._bound(where, algo, n, total, isz)
        seg_of = dict(zip(group, even_ranges((0, total), n), strict=True))
        order = self._order(group)
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
        self._bound(where, algo, len(group), count, isz)
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
        self._bound(where, algo, n, count, isz)
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
        self._bound(where, "p2p", 2, count, isz)
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
