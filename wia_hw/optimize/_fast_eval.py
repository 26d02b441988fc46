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

The bound, the equivalent tiling and the stoppable run live in
:mod:`wia_hw._gemm_bound` (the tiling heuristic reads them too).
"""

from __future__ import annotations

from .._gemm_bound import PartialRun, canonical_tiling, cycles_lower_bound, run_within

__all__ = ["PartialRun", "canonical_tiling", "cycles_lower_bound", "run_within"]
