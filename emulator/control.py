"""The control core: instruction counts and loop-branch prediction of the tile program.

Each core's control core runs a loop nest per kernel: an outer loop over the core's
tiles and, inside each tile, a loop over the array passes. Every iteration ends in a
backward branch, taken except on loop exit. Branches are predicted by a 2-bit
saturating counter per loop level (states 0-1 predict not-taken, 2-3 taken), kept
across kernels, so a change of loop trip count or kernel shape shows up as mispredicts.
Trip runs are evaluated in closed form, not iteration by iteration.
"""

from __future__ import annotations

__all__ = ["BranchPredictor", "loop_run"]


def loop_run(state: int, trips: int, predictor: str = "2bit") -> tuple[int, int]:
    """One execution of a loop of ``trips`` iterations through its back-edge branch.

    The branch is taken ``trips - 1`` times, then not taken once. Returns the new
    counter state and the number of mispredicts.
    """
    if trips < 1:
        return state, 0
    if predictor == "static_taken":
        return state, 1
    taken = trips - 1
    miss = min(taken, max(0, 2 - state))  # taken while the counter says not-taken
    state = min(3, state + taken)
    if state >= 2:  # the exit is predicted taken: a miss
        miss += 1
    return max(0, state - 1), miss


class BranchPredictor:
    """Per-core predictor state for the tile program's loop levels."""

    def __init__(self, predictor: str = "2bit") -> None:
        self.predictor = predictor
        self.state = {"tiles": 1, "passes": 1}  # weakly not-taken at reset

    def run(self, level: str, trips: int, times: int = 1) -> tuple[int, int]:
        """Run loop ``level`` ``times`` times with ``trips`` iterations each.

        Returns (branches, mispredicts). Closed form: the counter state after one run is
        a function of the state before it, so the state repeats within three runs and
        every run after that costs the same.
        """
        if times <= 0 or trips <= 0:
            return 0, 0
        s = self.state[level]
        misses = 0
        done = 0
        while done < times:
            s2, m = loop_run(s, trips, self.predictor)
            misses += m
            done += 1
            if s2 == s:  # fixed point: the rest repeat exactly
                misses += m * (times - done)
                done = times
            s = s2
        self.state[level] = s
        return trips * times, misses
