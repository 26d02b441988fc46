"""The sampling profiler: a SimPy process that reads the device state every N cycles.

It adds events to the device's SimPy environment but never changes when anything
else happens (it only reads state), so simulated timing is the same with and without
it. A sample at cycle ``t`` stands for the interval ``[t, t + N)`` (clipped to the end of
the session), so the samples' weights add up to the profiled time exactly; it reads the
device state at the interval's middle, ``t + N // 2`` (at ``t`` itself the first sample
would read the device before the first kernel launched in that same cycle).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import simpy

from ..emulator.device import CoreState, Device
from ._records import Sample

__all__ = ["Sampler"]


class Sampler:
    """Samples ``device`` every ``interval_cycles`` from the current cycle on."""

    def __init__(self, device: Device, interval_cycles: int) -> None:
        if interval_cycles < 1:
            raise ValueError(f"interval_cycles must be >= 1, got {interval_cycles}")
        self.device = device
        self.interval = int(interval_cycles)
        self.start = device.now
        self.raw: list[tuple[Any, ...]] = []
        self.active = True
        if device.core_state is None:
            device.core_state = [CoreState() for _ in range(device.spec.compute.cores)]
        self._states = device.core_state
        self._channels = device.memory.channels
        self._l2 = device.memory.l2_port
        device.env.process(self._loop())

    def _loop(self) -> Iterator[simpy.Event]:
        env = self.device.env
        t = self.start
        half = self.interval // 2
        while self.active:
            at = t + half
            if env.now < at:
                yield env.timeout(at - env.now)
                continue
            self._sample(t, at)
            t += self.interval
            if env.now < t + half:
                yield env.timeout(t + half - env.now)

    def _sample(self, t: int, at: int) -> None:
        """Record the state at cycle ``at`` as the sample of the interval from ``t``."""
        kernels: list[str | None] = []
        computing: list[bool] = []
        queue: list[int] = []
        for st in self._states:
            end = st.end
            if st.kernel is None or (end is not None and at >= end):
                kernels.append(None)
                computing.append(False)
                queue.append(0)
                continue
            a, b = st.compute, st.prev_compute
            kernels.append(st.kernel)
            computing.append(a[0] <= at < a[1] or b[0] <= at < b[1])
            ld = st.load
            queue.append(st.pending_stores + (1 if ld[0] <= at < ld[1] else 0))
        hbm = 0
        for ch in self._channels:
            f = ch.free_at
            if f > at:
                hbm += f - at
        l2 = self._l2.free_at - at
        self.raw.append((t, kernels, computing, queue, hbm, l2 if l2 > 0 else 0))

    def stop(self) -> list[Sample]:
        """End sampling; returns the samples from the start to the device's current
        cycle (times the environment has not reached yet are idle: the device has done
        nothing since)."""
        self.active = False
        end = self.device.now
        n = len(self.device.core_state or [])
        if self.device.core_state is self._states:
            self.device.core_state = None
        t = self.raw[-1][0] + self.interval if self.raw else self.start
        while t < end:
            self.raw.append((t, [None] * n, [False] * n, [0] * n, 0, 0))
            t += self.interval
        out = []
        for t, k, c, q, hbm, l2 in self.raw:
            if t >= end and out:
                break
            out.append(Sample(t, max(0, min(self.interval, end - t)), k, c, q, hbm, l2))
        return out
