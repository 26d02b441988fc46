"""The sampling profiler: a SimPy process that reads the device state every N cycles.

It adds events to the device's SimPy environment but never changes when anything
else happens (it only reads state), so simulated timing is the same with and without
it. A sample at cycle ``t`` stands for the interval ``[t, t + N)`` (clipped to the end of
the session), so the samples' weights add up to the profiled time exactly; it reads the
device state at the interval's middle, ``t + N // 2`` (at ``t`` itself the first sample
would read the device before the first kernel launched in that same cycle).

The session's end clips the last interval, and can come before that interval's middle:
the sample is then taken at the clipped interval's own middle, ``t + (end - t) // 2``,
when sampling stops, from the kernel records of what ran (:meth:`Sampler.stop`), never
filled in as idle.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import simpy

from ..emulator.device import CoreState, Device, KernelRecord
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

    def stop(self, ran: Sequence[KernelRecord] | None = None) -> list[Sample]:
        """End sampling; returns the samples from the start to the device's current
        cycle. An interval the end clipped before its middle was reached is sampled at
        its own middle (:meth:`_sample_past`): from ``ran``, the kernel records of the
        session in launch order, or, without them, from the device state as it is
        now."""
        self.active = False
        end = self.device.now
        t = self.raw[-1][0] + self.interval if self.raw else self.start
        while t < end:
            at = t + (min(t + self.interval, end) - t) // 2
            if ran is None:
                self._sample(t, at)
            else:
                self._sample_past(t, at, ran)
            t += self.interval
        if self.device.core_state is self._states:
            self.device.core_state = None
        out = []
        for t, k, c, q, hbm, l2 in self.raw:
            if t >= end and out:
                break
            out.append(Sample(t, max(0, min(self.interval, end - t)), k, c, q, hbm, l2))
        return out

    def _sample_past(self, t: int, at: int, ran: Sequence[KernelRecord]) -> None:
        """Record the state at cycle ``at``, already past, as the sample of the interval
        from ``t``. Each core runs the kernel whose record spans ``at`` while the core
        still works on it (a core ends its share ``max(core_busy) - core_busy[c]``
        cycles before the kernel ends); idle when none does (a launch, the final
        write-back, time between runs). Whether a core computes is read from its last
        two compute intervals when they are of that kernel and cover ``at`` or lie after
        it; earlier ones are gone, and the core then counts as computing when the arrays
        were busy at least half of the kernel's core time (``counters.busy_cycles``).
        Queues and backlogs of the past are not kept: 0, but an operand load of the
        core's last two tiles."""
        n = len(self._states)
        kernels: list[str | None] = [None] * n
        computing = [False] * n
        queue = [0] * n
        rec = None
        for r in reversed(ran):
            if r.start_cycle <= at < r.end_cycle:
                rec = r
                break
            if r.end_cycle <= at:
                break
        if rec is not None:
            busy = rec.core_busy_cycles
            top = max(busy, default=0)
            span = rec.cycles * max(1, sum(1 for b in busy if b))
            share = rec.counters.busy_cycles / span if span else 0.0
            for c, st in enumerate(self._states):
                b = busy[c] if c < len(busy) else 0
                done = rec.end_cycle - top + b  # the cycle the core finished its share
                if not b or at >= done:
                    continue
                kernels[c] = rec.name
                a, p = st.compute, st.prev_compute
                if st.kernel == rec.name and st.end == done and at >= min(a[0], p[0]):
                    computing[c] = a[0] <= at < a[1] or p[0] <= at < p[1]
                    queue[c] = 1 if st.load[0] <= at < st.load[1] else 0
                else:
                    computing[c] = share >= 0.5
        self.raw.append((t, kernels, computing, queue, 0, 0))
