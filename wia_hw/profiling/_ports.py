"""Traced bandwidth ports: the trace mode records every transfer an HBM channel or the
L2 port serves, by standing a logging subclass of the port in for it while the session
is open (same arithmetic, so the same timing), and handing the state back at the end.
Transfers that follow one another without a gap are logged as one busy stretch (their
bytes added), as :func:`merged` would join them and as the report's JSON holds them."""

from __future__ import annotations

import gc

from ..emulator.memory import BandwidthPort, MemorySystem

__all__ = ["TracedPort", "install", "uninstall", "merged"]


class TracedPort(BandwidthPort):
    """A :class:`BandwidthPort` that logs ``(start, end, nbytes)`` per busy stretch.

    The log is a flat list of ints while the port serves, a transfer that starts when
    the one before ends extending that one's entry (a traced BERT-Large run makes
    about 93,000 transfers in 29,000 stretches; one tuple per transfer set off some 130
    extra garbage collections during the run, and as many tuples made at the end cost
    tens of milliseconds); :meth:`transfers` gives it as tuples when the session ends."""

    __slots__ = ("flat", "orig")

    def __init__(self, orig: BandwidthPort) -> None:
        super().__init__(orig.name, orig.bytes_per_cycle)
        self.copy_state(orig)
        self.orig = orig
        self.flat: list[int] = []  # start, end, nbytes of every stretch in turn

    def transfers(self) -> list[tuple[int, int, int]]:
        """The log: one ``(start, end, nbytes)`` per busy stretch, in order (equal to
        :func:`merged` of one entry per transfer)."""
        it = iter(self.flat)
        return list(zip(it, it, it, strict=True))

    def reserve(self, now: int, nbytes: int) -> int:
        # BandwidthPort.reserve's booking inlined (as MemorySystem inlines it for plain
        # ports; with refresh windows, through serve), plus the log entry: one
        # Python call per transfer where calling the base's reserve made two or three
        # (a traced BERT-Large run books some 93,000). A test checks it against the
        # base class's reserve, refresh windows included.
        if nbytes <= 0 or now < self.last_arrival:
            return BandwidthPort.reserve(self, now, nbytes)  # nothing booked, or raises
        self.last_arrival = now
        free = self.free_at
        start = now if now > free else free
        dur = -(-nbytes * self._den // self._num)
        if self.refresh_cycles:  # refresh windows (a benchmark's): the port's own walk
            end = self.serve(start, dur)
            self.refresh_stall_cycles += end - start - dur
        else:
            end = start + dur
        self.free_at = end
        self.busy_cycles += dur
        log = self.flat
        if log and log[-2] == start:  # it follows the last stretch without a gap
            log[-2] = end
            log[-1] += nbytes
        else:
            log.extend((start, end, nbytes))  # ints only: nothing for the collector
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
    port name (one ``(start, end, bytes)`` per busy stretch: transfers that follow one
    another without a gap joined, as :func:`merged` joins them)."""
    logs: dict[str, list[tuple[int, int, int]]] = {}
    # tens of thousands of tuples of ints: they cannot form a cycle, so the collector
    # has nothing to find while they are built (it would run some 130 times for nothing)
    enabled = gc.isenabled()
    gc.disable()
    try:
        for p in ports:
            p.orig.copy_state(p)  # its arrival-order check and windows carry on
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
