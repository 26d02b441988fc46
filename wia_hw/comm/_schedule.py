"""Collective algorithms as schedules: DAGs of point-to-point transfers.

A :class:`Transfer` moves elements ``[start, stop)`` of buffer ``src_key`` on rank
``src`` into the same range of buffer ``dst_key`` on rank ``dst``, combining them with
the reduction (``op="reduce"``) or replacing them (``op="copy"``); ``dst_start``
moves the range elsewhere in the destination. It starts once every
transfer in ``deps`` has arrived. The builders below give every algorithm of
``docs/COMMUNICATION.md``; ``after`` maps a rank to the transfers it waits for before
its first send (how phases chain).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Transfer", "Schedule", "chunk_ranges", "even_ranges"]


@dataclass(slots=True)
class Transfer:
    src: int
    dst: int
    start: int
    stop: int
    op: str
    deps: list[int]
    src_key: str = "buf"
    dst_key: str = "buf"
    dst_start: int | None = None  # where the range lands at dst (default: start)


@dataclass
class Schedule:
    """The transfers of one collective, in creation order (ids are list indices)."""

    itemsize: int
    transfers: list[Transfer] = field(default_factory=list)

    def add(
        self,
        src: int,
        dst: int,
        rng: tuple[int, int],
        op: str,
        deps: list[int],
        src_key: str = "buf",
        dst_key: str = "buf",
    ) -> int:
        self.transfers.append(Transfer(src, dst, rng[0], rng[1], op, list(deps), src_key, dst_key))
        return len(self.transfers) - 1

    def nbytes(self, t: Transfer) -> int:
        return (t.stop - t.start) * self.itemsize

    @property
    def sent_bytes(self) -> int:
        """Bytes the schedule sends (each transfer once, whatever its path)."""
        return sum((t.stop - t.start) for t in self.transfers) * self.itemsize

    # -- ring ---------------------------------------------------------------------------

    def ring_reduce_scatter(
        self, ranks: list[int], segs: list[tuple[int, int]], after: dict[int, list[int]], shift: int
    ) -> dict[int, list[int]]:
        """m-1 steps; position ``i`` ends holding the reduced ``segs[(i + shift) % m]``.
        Step ``s``: position ``i`` sends ``segs[(i + shift - 1 - s) % m]`` to ``i + 1``,
        after it received that segment from ``i - 1`` in step ``s - 1``."""
        m = len(ranks)
        prev: list[int] = []
        for s in range(m - 1):
            cur = []
            for i, r in enumerate(ranks):
                deps = after.get(r, []) if s == 0 else [prev[(i - 1) % m]]
                cur.append(
                    self.add(r, ranks[(i + 1) % m], segs[(i + shift - 1 - s) % m], "reduce", deps)
                )
            prev = cur
        return {r: [prev[(i - 1) % m]] for i, r in enumerate(ranks)} if prev else after

    def ring_all_gather(
        self, ranks: list[int], segs: list[tuple[int, int]], after: dict[int, list[int]], shift: int
    ) -> dict[int, list[int]]:
        """m-1 steps; position ``i`` starts owning ``segs[(i + shift) % m]`` and ends with
        all of them. Step ``s``: position ``i`` sends ``segs[(i + shift - s) % m]``."""
        m = len(ranks)
        prev: list[int] = []
        for s in range(m - 1):
            cur = []
            for i, r in enumerate(ranks):
                deps = after.get(r, []) if s == 0 else [prev[(i - 1) % m]]
                cur.append(self.add(r, ranks[(i + 1) % m], segs[(i + shift - s) % m], "copy", deps))
            prev = cur
        return {r: [prev[(i - 1) % m]] for i, r in enumerate(ranks)} if prev else after

    def ring_all_reduce(
        self, ranks: list[int], rng: tuple[int, int], after: dict[int, list[int]]
    ) -> dict[int, list[int]]:
        """Reduce-scatter then all-gather of ``rng`` split evenly over the ranks."""
        segs = even_ranges(rng, len(ranks))
        after = self.ring_reduce_scatter(ranks, segs, after, 1)
        return self.ring_all_gather(ranks, segs, after, 1)

    # -- tree ---------------------------------------------------------------------------

    def tree_all_reduce(self, ranks: list[int], rng: tuple[int, int], chunk: int) -> None:
        """A binary tree (heap order over ``ranks``: the parent of position ``i`` is
        ``(i - 1) // 2``), pipelined in chunks of ``chunk`` elements (the last shorter,
        :func:`chunk_ranges`): each node sends chunk ``c`` up once it has it from all
        its children; the root's result flows down the same way."""
        m = len(ranks)
        for lo, hi in chunk_ranges(rng, chunk):
            up: dict[int, int] = {}
            for i in range(m - 1, 0, -1):
                kids = [k for k in (2 * i + 1, 2 * i + 2) if k < m]
                up[i] = self.add(
                    ranks[i], ranks[(i - 1) // 2], (lo, hi), "reduce", [up[k] for k in kids]
                )
            down: dict[int, int] = {}
            for i in range(1, m):
                p = (i - 1) // 2
                deps = [up[k] for k in (1, 2) if k < m] if p == 0 else [down[p]]
                down[i] = self.add(ranks[p], ranks[i], (lo, hi), "copy", deps)

    # -- others -------------------------------------------------------------------------

    def chain_broadcast(self, order: list[int], rng: tuple[int, int], chunk: int) -> None:
        """``order[0]`` (the root) to the others along the chain, pipelined in chunks
        of ``chunk`` elements (the last shorter, :func:`chunk_ranges`)."""
        for lo, hi in chunk_ranges(rng, chunk):
            prev: list[int] = []
            for a, b in zip(order, order[1:], strict=False):
                prev = [self.add(a, b, (lo, hi), "copy", prev)]


def chunk_ranges(rng: tuple[int, int], chunk: int) -> list[tuple[int, int]]:
    """``rng`` cut into pieces of ``chunk`` elements, the last one shorter (one empty
    piece for an empty range). Fixed pieces, not equal ones: a message one element
    longer than a chunk adds a short piece after a full one, so more data never takes
    less time (cut in two equal halves, it pipelined over the hops and ran 43% faster
    than one chunk's worth)."""
    lo, hi = rng
    if hi <= lo:
        return [(lo, hi)]
    return [(a, min(hi, a + chunk)) for a in range(lo, hi, chunk)]


def even_ranges(rng: tuple[int, int], parts: int) -> list[tuple[int, int]]:
    """``rng`` cut into ``parts`` contiguous ranges whose lengths differ by at most one."""
    lo, hi = rng
    n = hi - lo
    cuts = [lo + i * n // parts for i in range(parts + 1)]
    return list(zip(cuts, cuts[1:], strict=False))
