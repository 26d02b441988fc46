"""Traced bandwidth ports: the trace mode records every transfer an HBM channel or the
L2 port serves, by standing a logging subclass of the port in for it while the session
is open (same arithmetic, so the same timing), and handing the state back at the end."""

from __future__ import annotations

from ..emulator.memory import BandwidthPort, MemorySystem

__all__ = ["TracedPort", "install", "uninstall"]


class TracedPort(BandwidthPort):
    """A :class:`BandwidthPort` that logs ``(start, end, nbytes)`` per reservation."""

    __slots__ = ("log", "orig")

    def __init__(self, orig: BandwidthPort) -> None:
        super().__init__(orig.name, orig.bytes_per_cycle)
        self.free_at = orig.free_at
        self.busy_cycles = orig.busy_cycles
        self.orig = orig
        self.log: list[tuple[int, int, int]] = []

    def reserve(self, now: int, nbytes: int) -> int:
        if nbytes <= 0:
            return now
        start = now if now > self.free_at else self.free_at
        end = BandwidthPort.reserve(self, now, nbytes)
        self.log.append((start, end, nbytes))
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
    port name, adjacent transfers merged."""
    logs: dict[str, list[tuple[int, int, int]]] = {}
    for p in ports:
        p.orig.free_at, p.orig.busy_cycles = p.free_at, p.busy_cycles
        merged: list[tuple[int, int, int]] = []
        for s, e, nb in p.log:
            if merged and merged[-1][1] == s:
                merged[-1] = (merged[-1][0], e, merged[-1][2] + nb)
            else:
                merged.append((s, e, nb))
        logs[p.name] = merged
    mem.channels[:] = [p.orig for p in ports[:-1]]
    mem.l2_port = ports[-1].orig
    return logs
