"""Run-to-run variation sources of the emulator that live in the HBM channels: DRAM
refresh and arbitration jitter.

While a benchmark runs, each HBM channel's port (:class:`~wia_hw.emulator.memory.
BandwidthPort`) is stood in for by a :class:`VariedPort` (the same arithmetic plus the
enabled sources), and handed back, with its state, at the end: the way the profiler's
trace mode stands logging ports in (``wia_hw/profiling/_ports.py``), so the memory
model itself is untouched and runs outside a benchmark are unchanged.

* **DRAM refresh** (``"dram_refresh"``): every ``refresh_interval_ns`` (tREFI) a channel
  is blocked for ``refresh_cycle_ns`` (tRFC), all-bank refresh. A transfer that meets a
  refresh window waits for its end (a transfer in progress pauses and resumes after it).
  The windows run on the device's absolute timeline; each channel's phase is drawn
  once, uniformly in [0, tREFI), from ``variation_seed``, so an iteration's alignment
  with them (and its time) depends on where on the timeline it starts.
* **Arbitration jitter** (``"arbitration_jitter"``): the channel's arbiter grants each
  transfer 0 to ``arbitration_jitter_cycles`` cycles late, uniformly, from a per-channel
  generator seeded by ``variation_seed``.

The cost: transfers take the ports' generic booking path (one call per channel piece)
rather than the inlined one, and the refresh arithmetic steps once per window a
transfer meets (never once per cycle).
"""

from __future__ import annotations

import math
import random
from typing import Any

from ..emulator.memory import BandwidthPort, MemorySystem

__all__ = ["VariedPort", "install", "uninstall"]


class VariedPort(BandwidthPort):
    """A :class:`BandwidthPort` with refresh windows and arbitration jitter.

    ``refresh_interval_cycles``/``refresh_cycles`` (0: no refresh) and ``phase_cycles``
    place the windows ``[phase + k T, phase + k T + R)``; ``jitter_cycles`` (0: none) is
    the largest grant delay. ``refresh_stall_cycles`` and ``jitter_stall_cycles`` count
    the cycles each source added.
    """

    __slots__ = (
        "orig",
        "interval",
        "refresh",
        "phase",
        "jitter",
        "rng",
        "refresh_stall_cycles",
        "jitter_stall_cycles",
    )

    def __init__(
        self,
        orig: BandwidthPort,
        *,
        refresh_interval_cycles: int,
        refresh_cycles: int,
        phase_cycles: int,
        jitter_cycles: int,
        seed: int,
    ) -> None:
        super().__init__(orig.name, orig.bytes_per_cycle)
        self.free_at, self.busy_cycles = orig.free_at, orig.busy_cycles
        self.last_arrival = orig.last_arrival
        self.orig = orig
        self.interval, self.refresh, self.phase = (
            refresh_interval_cycles,
            refresh_cycles,
            phase_cycles,
        )
        self.jitter = jitter_cycles
        self.rng = random.Random(seed)
        self.refresh_stall_cycles = 0
        self.jitter_stall_cycles = 0

    def serve(self, start: int, dur: int) -> int:
        """The cycle a transfer of ``dur`` cycles that may start at ``start`` ends, when it
        pauses during every refresh window it meets."""
        if not self.refresh:
            return start + dur
        t, r, o = self.interval, self.refresh, self.phase
        k = (start - o) // t  # the window at or before start
        if start < o + k * t + r:  # inside it: wait for its end
            start = o + k * t + r
        end, left = start, dur
        while True:
            gap = o + (k + 1) * t - end  # cycles until the next window
            if left <= gap:
                return end + left
            left -= gap
            k += 1
            end = o + k * t + r

    def reserve(self, now: int, nbytes: int) -> int:
        if nbytes <= 0:
            return now
        if now < self.last_arrival:
            return super().reserve(now, nbytes)  # raises, as the port does
        self.last_arrival = now
        start = now if now > self.free_at else self.free_at
        if self.jitter:
            delay = self.rng.randint(0, self.jitter)
            start += delay
            self.jitter_stall_cycles += delay
        dur = self.cycles(nbytes)
        end = self.serve(start, dur)
        self.refresh_stall_cycles += end - start - dur
        self.free_at = end
        self.busy_cycles += dur
        return end


def install(mem: MemorySystem, cfg: Any, clock_ghz: float) -> list[VariedPort]:
    """Stand varied ports in for ``mem``'s HBM channels under ``cfg`` (a
    BenchmarkConfig); returns them, or ``[]`` when no channel source is enabled."""
    refresh = "dram_refresh" in cfg.variation_sources
    jitter = "arbitration_jitter" in cfg.variation_sources
    if not (refresh or jitter):
        return []
    interval = max(1, math.ceil(cfg.refresh_interval_ns * clock_ghz))
    rfc = math.ceil(cfg.refresh_cycle_ns * clock_ghz) if refresh else 0
    seeder = random.Random(cfg.variation_seed)
    ports = []
    for p in mem.channels:
        phase, seed = seeder.randrange(interval), seeder.getrandbits(64)
        ports.append(
            VariedPort(
                p,
                refresh_interval_cycles=interval,
                refresh_cycles=rfc,
                phase_cycles=phase,
                jitter_cycles=cfg.arbitration_jitter_cycles if jitter else 0,
                seed=seed,
            )
        )
    mem.channels[:] = ports
    return ports


def uninstall(mem: MemorySystem, ports: list[VariedPort]) -> tuple[int, int]:
    """Put the original ports back with the varied ports' state; returns the cycles
    refresh and jitter added, summed over the channels."""
    if not ports:
        return 0, 0
    for p in ports:
        p.orig.free_at, p.orig.busy_cycles = p.free_at, p.busy_cycles
        p.orig.last_arrival = p.last_arrival
    mem.channels[:] = [p.orig for p in ports]
    return (sum(p.refresh_stall_cycles for p in ports), sum(p.jitter_stall_cycles for p in ports))
