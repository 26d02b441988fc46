"""Run-to-run variation sources of the emulator that live in the HBM channels: DRAM
refresh and arbitration jitter.

While a benchmark runs, each HBM channel's port (:class:`~wia_hw.emulator.memory.
BandwidthPort`) is stood in for by a :class:`VariedPort` (the same arithmetic plus the
enabled sources), and handed back, with its state, at the end: the way the profiler's
trace mode stands logging ports in (``wia_hw/profiling/_ports.py``), so the memory
model itself is untouched and runs outside a benchmark are unchanged.

* **DRAM refresh** (``"dram_refresh"``): every ``refresh_interval_ns`` (tREFI) a channel
  is blocked for ``refresh_cycle_ns`` (tRFC), all-bank refresh (the port's own
  :meth:`~wia_hw.emulator.memory.BandwidthPort.serve`), and moves its nominal rate
  between the windows, in place of the spec's mean-cost refresh (``memory.hbm.
  refresh_*``: the channels at ``1 - tRFC / tREFI`` of that rate). Each channel's phase
  is drawn once, uniformly in [0, tREFI), from ``variation_seed``, so an iteration's
  alignment with the windows (and its time) depends on where on the timeline it starts.
  Both are in the whole cycles of :func:`~wia_hw.emulator.memory.refresh_windows` (a
  tREFI shorter than 1024 cycles is stretched to 1024, tRFC in proportion), the same
  windows whose share the spec's mean cost charges.
* **Arbitration jitter** (``"arbitration_jitter"``): the channel's arbiter grants each
  transfer 0 to ``arbitration_jitter_cycles`` cycles late, uniformly, from a per-channel
  generator seeded by ``variation_seed``.

The cost: transfers take the ports' generic booking path (one call per channel piece)
rather than the inlined one, and the refresh arithmetic steps once per window a
transfer meets (never once per cycle).
"""

from __future__ import annotations

import random
from typing import Any

from ..emulator.config import HBMConfig
from ..emulator.memory import BandwidthPort, MemorySystem, refresh_windows

__all__ = ["VariedPort", "install", "uninstall"]


class VariedPort(BandwidthPort):
    """A :class:`BandwidthPort` with arbitration jitter, and with refresh windows at a
    drawn phase.

    Constructed from the port it stands in for (its state, and its rate unless
    ``bytes_per_cycle`` is given); ``refresh_cycles`` (with its interval and phase) sets
    refresh windows; ``jitter_cycles`` (0: none) is the largest grant delay. ``refresh_stall_cycles`` and ``jitter_stall_cycles`` count the cycles each
    source added while it stood in.
    """

    __slots__ = ("orig", "jitter", "rng", "jitter_stall_cycles")

    def __init__(
        self,
        orig: BandwidthPort,
        *,
        refresh_interval_cycles: int = 0,
        refresh_cycles: int | None = None,
        phase_cycles: int = 0,
        jitter_cycles: int,
        seed: int,
        bytes_per_cycle: Any = None,
    ) -> None:
        rate = orig.bytes_per_cycle if bytes_per_cycle is None else bytes_per_cycle
        super().__init__(orig.name, rate)
        self.copy_state(orig)
        self.refresh_stall_cycles = 0
        if refresh_cycles is not None:
            self.set_refresh(refresh_interval_cycles, refresh_cycles, phase_cycles)
        self.orig = orig
        self.jitter = jitter_cycles
        self.rng = random.Random(seed)
        self.jitter_stall_cycles = 0

    def reserve(self, now: int, nbytes: int) -> int:
        # the grant delay moves the start; the port's own booking does the rest (its
        # order check, the refresh windows and the stall count)
        if self.jitter and nbytes > 0 and now >= self.last_arrival:
            delay = self.rng.randint(0, self.jitter)
            self.free_at = (now if now > self.free_at else self.free_at) + delay
            self.jitter_stall_cycles += delay
        return super().reserve(now, nbytes)


def install(mem: MemorySystem, cfg: Any, spec: Any) -> list[VariedPort]:
    """Stand varied ports in for ``mem``'s HBM channels under ``cfg`` (a
    BenchmarkConfig) on a device of ``spec``; returns them, or ``[]`` when no channel
    source is enabled.

    With ``dram_refresh`` on, each channel runs at its nominal rate with refresh windows
    at a phase drawn from the seed (the config's tREFI and tRFC where it sets them, else
    the spec's, else, for a spec with refresh off, HBMConfig's defaults); with it off,
    each channel keeps the spec's rate."""
    refresh = "dram_refresh" in cfg.variation_sources
    jitter = "arbitration_jitter" in cfg.variation_sources
    if not (refresh or jitter):
        return []
    hbm = spec.memory.hbm
    trefi_ns = cfg.refresh_interval_ns or hbm.refresh_interval_ns or HBMConfig.refresh_interval_ns
    trfc_ns = cfg.refresh_cycle_ns or hbm.refresh_cycle_ns or HBMConfig.refresh_cycle_ns
    interval, rfc = refresh_windows(trefi_ns, trfc_ns, spec.clock_ghz)
    seeder = random.Random(cfg.variation_seed)
    ports = []
    for p in mem.channels:
        phase, seed = seeder.randrange(interval), seeder.getrandbits(64)
        ports.append(
            VariedPort(
                p,
                refresh_interval_cycles=interval,
                refresh_cycles=rfc if refresh else None,
                phase_cycles=phase,
                jitter_cycles=cfg.arbitration_jitter_cycles if jitter else 0,
                seed=seed,
                bytes_per_cycle=mem.channel_nominal_bpc if refresh else None,
            )
        )
    mem.channels[:] = ports
    return ports


def uninstall(mem: MemorySystem, ports: list[VariedPort]) -> tuple[int, int]:
    """Put the original ports back with the varied ports' state; returns the cycles
    refresh and jitter added, summed over the channels."""
    if not ports:
        return 0, 0
    for p in ports:  # the booking state goes back; the spec's rate stays
        p.orig.free_at, p.orig.busy_cycles = p.free_at, p.busy_cycles
        p.orig.last_arrival = p.last_arrival
    mem.channels[:] = [p.orig for p in ports]
    return (sum(p.refresh_stall_cycles for p in ports), sum(p.jitter_stall_cycles for p in ports))
