"""Cycle functions: the single source of truth for how long each block takes.

Every block that has RTL (``wia_hw.rtl``) has exactly one function here, and a cocotb
test asserts that the emitted Verilog takes exactly that many cycles on randomised
shapes. The emulator calls the same functions; nothing else in the project re-derives
these formulas.

All results are integer device-clock cycles.
"""

from __future__ import annotations

from fractions import Fraction

from .counters import Counter

__all__ = [
    "DATAFLOWS",
    "systolic_tile_cycles",
    "systolic_steps",
    "vector_op_cycles",
    "transfer_cycles",
    "systolic_tile_counters",
    "systolic_issue_interval",
    "systolic_sequence_cycles",
]

#: The two dataflows of the systolic array.
DATAFLOWS = ("os", "ws")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return value


def systolic_steps(depth: int, macs_per_pe_cycle: Fraction | int | float = 1) -> int:
    """Array steps needed to consume ``depth`` elements at a PE rate.

    A PE that performs ``r`` MACs per cycle at some precision consumes ``r`` elements
    of the streamed dimension per cycle (the reduction K in the output-stationary
    dataflow, the streamed rows M in the weight-stationary one), so ``depth`` elements
    take ``ceil(depth / r)`` steps. ``r`` may be fractional (``0.25`` for an FP32 MAC
    that takes four cycles).
    """
    _positive_int("depth", depth)
    rate = Fraction(macs_per_pe_cycle).limit_denominator(64)
    if rate <= 0:
        raise ValueError(f"macs_per_pe_cycle must be positive, got {macs_per_pe_cycle}")
    return -(-depth * rate.denominator // rate.numerator)


def systolic_tile_cycles(dataflow: str, rows: int, cols: int, depth: int) -> int:
    """Cycles of one systolic-array tile, from ``start`` sampled high to ``done`` high.

    Parameters
    ----------
    dataflow:
        ``"os"`` (output-stationary) or ``"ws"`` (weight-stationary).
    rows, cols:
        Array shape in processing elements.
    depth:
        Steps streamed through the array: the reduction length K for ``os``, the
        number of input rows M for ``ws`` (already divided by the PE rate, see
        :func:`systolic_steps`).

    Derivation
    ----------
    Output-stationary: row ``i`` of A enters the left edge skewed by ``i`` cycles,
    column ``j`` of B the top edge skewed by ``j``, so PE ``(i, j)`` performs its
    ``k``-th MAC at cycle ``i + j + k``. The last MAC (PE ``(rows-1, cols-1)``,
    ``k = K-1``) is at cycle ``rows + cols + K - 3``; the accumulators are then shifted
    out one row per cycle, ``rows`` cycles, so ``done`` rises at
    ``K + 2*rows + cols - 2`` cycles after ``start``.

    Weight-stationary: the weight tile (``rows`` x ``cols``) is shifted in one row per
    cycle (``rows`` cycles); input row ``m`` then enters skewed, reaching PE ``(i, j)``
    at ``rows + m + i + j``; its partial sum leaves the bottom of column ``j`` one cycle
    after PE ``(rows-1, j)``. The last result (``m = M-1``, ``j = cols-1``) leaves at
    ``M + 2*rows + cols - 2``.

    Both dataflows therefore take ``depth + 2*rows + cols - 2`` cycles. A tile that maps
    onto only part of the array still takes the whole array's skew and drain: that is
    the mapping loss of shapes that are not multiples of the array.
    """
    if dataflow not in DATAFLOWS:
        raise ValueError(f"dataflow must be one of {DATAFLOWS}, got {dataflow!r}")
    _positive_int("rows", rows)
    _positive_int("cols", cols)
    _positive_int("depth", depth)
    return depth + 2 * rows + cols - 2


def vector_op_cycles(elements: int, lanes: int, cycles_per_element: int,
                     pipeline_depth: int) -> int:
    """Cycles of the vector unit applying one op to ``elements`` values.

    ``lanes`` values enter per issue; each issue occupies the unit for
    ``cycles_per_element`` cycles (the op's instruction count per element, e.g. 1 for
    an add, several for a softmax or layer norm); the last result leaves
    ``pipeline_depth`` cycles after its issue.
    """
    if elements < 0:
        raise ValueError(f"elements must be >= 0, got {elements}")
    _positive_int("lanes", lanes)
    _positive_int("cycles_per_element", cycles_per_element)
    if elements == 0:
        return 0
    return -(-elements // lanes) * cycles_per_element + pipeline_depth


def transfer_cycles(nbytes: int, bytes_per_cycle: Fraction, latency_cycles: int = 0) -> int:
    """Cycles to move ``nbytes`` over a port of ``bytes_per_cycle`` plus a fixed latency."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if nbytes == 0:
        return 0
    bpc = Fraction(bytes_per_cycle)
    return latency_cycles + int(-(-Fraction(nbytes) // bpc))


def systolic_tile_counters(dataflow: str, rows: int, cols: int, depth: int,
                           stall_cycles: int = 0) -> dict[Counter, int]:
    """Hardware counters of one systolic-array tile, as the RTL counter block reads them.

    Keys are the counter identities of the RTL's register map
    (``wia_hw.rtl.perf_counters.REGISTER_MAP``):

    - ``Counter.CYCLES``: cycles the tile is in flight,
      ``systolic_tile_cycles(...) + stall_cycles``;
    - ``Counter.BUSY_CYCLES``: cycles in which at least one PE performs a MAC,
      ``depth + rows + cols - 2``: PE ``(i, j)`` works on step ``k`` in cycle
      ``offset + i + j + k`` (``offset`` is 0 for ``os``, ``rows`` for ``ws``, the weight
      load), so MACs span ``k = 0`` at PE ``(0, 0)`` to ``k = depth - 1`` at
      PE ``(rows-1, cols-1)`` without a gap; stalled cycles perform no MAC;
    - ``Counter.MACS``: ``rows * cols * depth`` (every PE does one MAC per step; a tile
      that uses part of the array is padded, as in :func:`systolic_tile_cycles`);
    - ``Counter.STALL_CYCLES``: ``stall_cycles``, cycles the tile was held because its
      operand stream was not ready (the RTL's ``stall`` input).
    """
    if isinstance(stall_cycles, bool) or not isinstance(stall_cycles, int):
        raise TypeError(f"stall_cycles must be an integer, got {stall_cycles!r}")
    if stall_cycles < 0:
        raise ValueError(f"stall_cycles must be >= 0, got {stall_cycles}")
    cycles = systolic_tile_cycles(dataflow, rows, cols, depth)
    return {
        Counter.CYCLES: cycles + stall_cycles,
        Counter.BUSY_CYCLES: depth + rows + cols - 2,
        Counter.MACS: rows * cols * depth,
        Counter.STALL_CYCLES: stall_cycles,
    }


def systolic_issue_interval(dataflow: str, rows: int, cols: int, depth: int,
                            next_depth: int, *, pipelined: bool) -> int:
    """Fewest cycles from the acceptance of a tile of ``depth`` steps to the acceptance
    of the next tile, of ``next_depth`` steps, on the same array.

    Not pipelined: ``systolic_tile_cycles(...)`` of the first tile (a new ``start`` is
    accepted in its cycle ``N - 1``, so back-to-back tiles take ``N`` cycles each).

    Pipelined (double-buffered accumulators for ``os``, double-buffered weights for
    ``ws``): the next tile's operands stream in while this tile drains (``os``) or
    while the next tile's weights load behind this tile's stream (``ws``).
    """
    # TODO(#8): the RTL helper replaces this with the pipelined RTL's exact rule.
    n = systolic_tile_cycles(dataflow, rows, cols, depth)
    _positive_int("next_depth", next_depth)
    if not pipelined:
        return n
    return max(depth, rows)


def systolic_sequence_cycles(dataflow: str, rows: int, cols: int, depths: list[int], *,
                             pipelined: bool, stall_cycles: int = 0) -> int:
    """Cycles from the first ``start`` sampled high to the last ``done`` of a sequence
    of tiles issued back to back (each accepted at the first cycle the array takes it),
    plus one cycle per ``stall`` cycle while any tile is in flight."""
    if not depths:
        return 0
    accept = 0
    for d, nd in zip(depths, depths[1:]):
        accept += systolic_issue_interval(dataflow, rows, cols, d, nd, pipelined=pipelined)
    return accept + systolic_tile_cycles(dataflow, rows, cols, depths[-1]) + stall_cycles
