"""Cheap, exact answers about one GEMM candidate alone on a fresh device, for the
autotuner: an equivalent tiling (:func:`canonical_tiling`), a lower bound of its cycles
(:func:`cycles_lower_bound`), and the emulator's own run, stoppable at a cycle and
continued later (:class:`PartialRun`).

The autotuner asks one question of a candidate: does it take fewer cycles than the
best found so far? When the lower bound is already at or above that best, the answer
is no, exactly, and the emulator need not run; otherwise the emulator runs, stopped at
the best's cycle when it has not ended by then (again: no). So a search that prunes
picks the same best tiling, with the same cycles and the same best after every trial,
as one that runs every candidate whole (``tests/test_fast_eval.py`` checks the bound
against the live emulator, the continued runs, and that identity).

Why a bound and not the cycles themselves: a single GEMM's run is not periodic in a
way known to extrapolate exactly. The shared L2's LRU order depends on how the cores'
loads interleave in time (the bound misses mostly the cores' last stores, which evict
dirty L2 blocks to HBM), and edge blocks spread over the HBM channels by their
absolute address. (Refresh windows at absolute cycles were a third obstacle; the
emulator now charges refresh as a channel rate, which is shift-invariant.) Profiled
on BERT-Large's GEMMs, the emulator spends its time in the memory model (about 40% of
a run), the device's per-tile bookkeeping (25%), the builtins they call (18%) and SimPy
(7%); building the device is 2%. No shortcut around one of them brings a run of
hundreds of tiles near a millisecond. Nor does stopping a cut run early: a bound
taken during the run (each core's tiles still to issue, back to back from the current
cycle) reached the best's cycle at a median 97% of the way over the 85 runs one
BERT-Large search cuts, since a candidate the closed-form bound cannot prune lands
within a percent of the best.

The bound itself is :mod:`wia_hw._gemm_bound`'s (the tiling estimate reads it too).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .._gemm_bound import cycles_lower_bound
from ..emulator.config import DeviceSpec
from ..emulator.device import Device
from ..emulator.kernels import GemmKernel, GemmTiling

__all__ = ["PartialRun", "canonical_tiling", "cycles_lower_bound", "run_within"]


def canonical_tiling(kernel: GemmKernel, tiling: GemmTiling) -> GemmTiling:
    """A tiling that gives the emulator exactly the same tiles, in the same order, as
    ``tiling`` does for ``kernel``, so the same run: tile sides above the kernel's
    extent are cut to it (``tm`` to M, ``tn`` to N, ``tk`` to K), and the loop order
    is ``mn`` when the kernel has one row or one column of output tiles (the two loop
    orders then walk the same sequence)."""
    tm, tn, tk = min(tiling.tm, kernel.m), min(tiling.tn, kernel.n), min(tiling.tk, kernel.k)
    order = tiling.order
    if -(-kernel.m // tm) == 1 or -(-kernel.n // tn) == 1:
        order = "mn"
    if (tm, tn, tk, order) == (tiling.tm, tiling.tn, tiling.tk, tiling.order):
        return tiling
    return replace(tiling, tm=tm, tn=tn, tk=tk, order=order)


class PartialRun:
    """The emulator's run of ``kernel`` alone on a fresh ``Device(spec)``, advanced on
    demand: :meth:`advance` runs it up to a cycle and returns its record when it has
    ended before that cycle, so a candidate stopped at one limit continues from where
    it stopped when a larger limit is asked, instead of starting again.

    The run is ``Device(spec).execute([kernel])``'s own (the kernel's SimPy process on a
    fresh device), stopped by SimPy at the limit (``env.run(until=limit)``). Nothing
    before the limit differs: the stop is one event at the limit, and the device's
    clock shortcut (``emulator.device._advance``: move the clock without an event when
    none is due at or before the target) decides the same for every target below it.
    For a target at or past the limit the process yields a timeout instead of moving
    the clock; no other event is due before that target, so when the run continues
    the process resumes at the same cycle before anything else happens, as it would
    have: the continued run is the uninterrupted one (``tests/test_fast_eval.py``).
    """

    __slots__ = ("device", "_out", "_proc")

    def __init__(self, kernel: GemmKernel, spec: DeviceSpec) -> None:
        self.device = Device(spec)
        self._out: list[Any] = []
        self._proc = self.device.env.process(self.device._kernel(kernel, self._out))

    @property
    def reached_cycles(self) -> int:
        """The cycle the run has reached (its end, once it has ended)."""
        return self.device.now

    def advance(self, limit_cycles: int | None) -> Any:
        """Run up to cycle ``limit_cycles`` (``None``: to the end); the kernel's record
        when it has ended before that cycle, else ``None`` (its cycles are then at
        least ``limit_cycles``). ``ValueError`` for a limit below 1."""
        if limit_cycles is not None and limit_cycles < 1:
            raise ValueError(f"limit_cycles must be at least 1, got {limit_cycles}")
        if not self._out:
            env = self.device.env
            if limit_cycles is None:
                env.run(until=self._proc)
            elif limit_cycles > env.now:
                env.run(until=limit_cycles)
        if self._out and (limit_cycles is None or self._out[0].end_cycle < limit_cycles):
            return self._out[0]
        return None


def run_within(kernel: GemmKernel, spec: DeviceSpec, limit_cycles: int | None) -> Any:
    """The emulator's record of ``kernel`` alone on a fresh ``Device(spec)``, exactly as
    ``Device(spec).execute([kernel])[0]``, or ``None`` when the kernel has not ended
    before cycle ``limit_cycles`` (then its cycles are at least ``limit_cycles``):
    ``PartialRun(kernel, spec).advance(limit_cycles)``. ``None`` for ``limit_cycles``:
    no limit. ``ValueError`` for a limit below 1.
    """
    return PartialRun(kernel, spec).advance(limit_cycles)
