"""Traced bandwidth ports: the trace mode records every transfer an HBM channel or the
L2 port serves, by standing a logging subclass of the port in for it while the session
is open (same arithmetic, so the same timing), and handing the state back at the end."""

from __future__ import annotations

import gc

from ..emulator.memory import BandwidthPort, MemorySystem

__all__ = ["TracedPort", "install", "uninstall", "merged"]


class TracedPort(BandwidthPort):
    """A :class:`BandwidthPort` that logs ``(start, end, nbytes)`` per reservation.

    The log is a flat list of ints while the port serves (no container per transfer: a
    traced BERT-Large run makes about 93,000 transfers, and as tuples they set off some
    130 extra garbage collections); :meth:`transfers` gives it as tuples when the
    session ends."""

    __slots__ = ("flat", "orig")

    def __init__(self, orig: BandwidthPort) -> None:
        super().__init__(orig.name, orig.bytes_per_cycle)
        self.free_at = orig.free_at
        self.busy_cycles = orig.busy_cycles
        self.orig = orig
        self.flat: list[int] = []  # start, end, nbytes of every transfer in turn

    def transfers(self) -> list[tuple[int, int, int]]:
        """The log: one ``(start, end, nbytes)`` per transfer, in order."""
        it = iter(self.flat)
        return list(zip(it, it, it, strict=True))

    def reserve(self, now: int, nbytes: int) -> int:
        # BandwidthPort.reserve, inlined (this runs per transfer), plus the log entry
        if nbytes <= 0:
            return now
        start = now if now > self.free_at else self.free_at
        dur = -(-nbytes * self._den // self._num)
        end = self.free_at = start + dur
        self.busy_cycles += dur
        self.flat.extend((start, end, nbytes))  # ints only: nothing for the collector
        return end


def install(mem: MemorySystem) -> list[TracedPort]:
    """Stand traced ports in for ``mem``'s HBM channels and L2 port."""
    chans = [TracedPort(p) for p in mem.channels]
    mem.channels[:] = chans
    l2 = TracedPort(mem.l2_port)
    mem.l2_port = l2
    return chans + [l2]


def uninstall(mem: MemorySystem, ports: list[TracedPort]) -> dict[str, list[tuple[int, int, int]]]:
    """Put the original ports back (with the traced ports' state); returns the logs by
    port name (one ``(start, end, bytes)`` per transfer; :func:`merged` joins those
    that follow one another without a gap)."""
    logs: dict[str, list[tuple[int, int, int]]] = {}
    # tens of thousands of tuples of ints: they cannot form a cycle, so the collector
    # has nothing to find while they are built (it would run some 130 times for nothing)
    enabled = gc.isenabled()
    gc.disable()
    try:
        for p in ports:
            p.orig.free_at, p.orig.busy_cycles = p.free_at, p.busy_cycles
            logs[p.name] = p.transfers()
    finally:
        if enabled:
            gc.enable()
    mem.channels[:] = [p.orig for p in ports[:-1]]
    mem.l2_port = ports[-1].orig
    return logs


def merged(log: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Transfers that follow one another without a gap joined into one (bytes added)."""
    out: list[tuple[int, int, int]] = []
    for s, e, nb in log:
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e, out[-1][2] + nb)
        else:
            out.append((s, e, nb))
    return out
