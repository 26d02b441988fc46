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
    "systolic_sequence_counters",
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


def vector_op_cycles(
    elements: int, lanes: int, cycles_per_element: int, pipeline_depth: int
) -> int:
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


def _check_stalls(stall_cycles: object) -> int:
    if isinstance(stall_cycles, bool) or not isinstance(stall_cycles, int):
        raise TypeError(f"stall_cycles must be an integer, got {stall_cycles!r}")
    if stall_cycles < 0:
        raise ValueError(f"stall_cycles must be >= 0, got {stall_cycles}")
    return stall_cycles


def _check_pipelined(pipelined: object) -> bool:
    if not isinstance(pipelined, bool):
        raise TypeError(f"pipelined must be a bool, got {pipelined!r}")
    return pipelined


def _check_elements(elements: int | None, depth: int) -> int:
    """Streamed elements of a tile of ``depth`` steps (``None``: one per step). A step
    streams one or more elements, or each element spans the same whole number of steps
    (an fp32 MAC: 4 steps per element, ``systolic_steps(elements, 0.25)``)."""
    if elements is None:
        return depth
    _positive_int("elements", elements)
    if elements < depth and depth % elements:
        raise ValueError(
            f"elements ({elements}) must be at least depth ({depth}): "
            "a step streams at least one element (or, fewer, they must divide it: "
            "each element then spans depth / elements steps)"
        )
    return elements


def systolic_tile_counters(
    dataflow: str,
    rows: int,
    cols: int,
    depth: int,
    stall_cycles: int = 0,
    *,
    elements: int | None = None,
) -> dict[Counter, int]:
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
    - ``Counter.MACS``: ``rows * cols * elements`` (every PE does one MAC per element
      of the streamed dimension; a tile that uses part of the array is padded, as in
      :func:`systolic_tile_cycles`). ``elements`` defaults to ``depth``; a PE mode with
      two lanes (``int8x2``) streams ``elements = K`` (os) or ``M`` (ws) in
      ``depth = ceil(elements / 2)`` steps, the idle lane of an odd last step doing no
      MAC; the fp32 mode in ``depth = 4 * elements`` steps (one MAC per 4 cycles, busy
      in all four);
    - ``Counter.STALL_CYCLES``: ``stall_cycles``, cycles the tile was held because its
      operand stream was not ready (the RTL's ``stall`` input).

    The same for a pipelined array when the tile runs alone; a sequence of overlapping
    tiles reads :func:`systolic_sequence_counters`.
    """
    _check_stalls(stall_cycles)
    cycles = systolic_tile_cycles(dataflow, rows, cols, depth)
    return {
        Counter.CYCLES: cycles + stall_cycles,
        Counter.BUSY_CYCLES: depth + rows + cols - 2,
        Counter.MACS: rows * cols * _check_elements(elements, depth),
        Counter.STALL_CYCLES: stall_cycles,
    }


def systolic_issue_interval(
    dataflow: str, rows: int, cols: int, depth: int, next_depth: int, *, pipelined: bool
) -> int:
    """Fewest cycles from the acceptance of a tile of ``depth`` steps to the acceptance
    of the next tile, of ``next_depth`` steps, on the same array (the RTL's ``idle``
    rule, ``wia_hw.rtl.SystolicArray``).

    Not pipelined: ``N = systolic_tile_cycles(...)`` of the first tile (a new ``start``
    is accepted in its cycle ``N - 1``, so back-to-back tiles take ``N`` cycles each).

    Pipelined, output-stationary (double-buffered accumulators):
    ``max(depth, rows + depth - next_depth)``. Derivation: with this tile accepted at
    edge ``T`` (``S = depth``) and the next at ``T'`` (``S' = next_depth``),

    - the operand ports take one step per cycle: ``T' >= T + S``;
    - each PE copies its finished sum into its result register at its last step
      (PE ``(p, j)`` at edge ``T + S + p + j``) and its accumulator takes the next tile
      at once; column ``j`` is drained downwards, one row per cycle, in cycles
      ``D_j .. D_j + rows - 1`` with ``D_j = T + S + rows - 1 + j`` (its bottom PE has
      finished), PE row ``p`` being read for the last time in cycle ``D_j + p``. The next
      tile writes PE ``(p, j)``'s result register at edge ``T' + S' + p + j`` and drains
      column ``j`` from ``D'_j``; both are free of conflict iff ``D'_j >= D_j + rows``,
      i.e. ``T' + S' >= T + S + rows``.

    Pipelined, weight-stationary (double-buffered weights): ``max(depth, rows)``. The
    next tile's weights load into the shadow registers at edges ``T' .. T' + rows - 1``
    (column ``j`` delayed ``j + 1``, row ``p`` first written at edge ``T' + p + j + 1``)
    while this tile streams; PE ``(p, j)`` takes this tile's weights from its shadow at
    its first step, edge ``T + rows + p + j + 1``, so ``T' >= T + rows``; the
    activation port takes one step per cycle, so ``T' + rows >= T + rows + S``.

    In steady state (``depth == next_depth``) both give ``max(depth, rows)``. The latency
    of every tile stays :func:`systolic_tile_cycles`.
    """
    n = systolic_tile_cycles(dataflow, rows, cols, depth)
    _positive_int("next_depth", next_depth)
    if not _check_pipelined(pipelined):
        return n
    if dataflow == "os":
        return max(depth, rows + depth - next_depth)
    return max(depth, rows)


def _issue_times(
    dataflow: str, rows: int, cols: int, depths: list[int], pipelined: bool
) -> list[int]:
    """Acceptance edge of each tile of a back-to-back sequence, the first at 0."""
    times = [0]
    for d, nd in zip(depths, depths[1:], strict=False):
        times.append(
            times[-1] + systolic_issue_interval(dataflow, rows, cols, d, nd, pipelined=pipelined)
        )
    return times


def systolic_sequence_cycles(
    dataflow: str,
    rows: int,
    cols: int,
    depths: list[int],
    *,
    pipelined: bool,
    stall_cycles: int = 0,
) -> int:
    """Cycles from the first ``start`` sampled high to the last ``done`` of a sequence
    of tiles issued back to back (each accepted at the first cycle the array takes it),
    plus one cycle per ``stall`` cycle while any tile is in flight (a stall freezes the
    whole array, so it delays every later event by one cycle).

    ``sum(systolic_issue_interval(d[n], d[n+1])) + systolic_tile_cycles(d[-1])``: the
    last tile's ``done`` is the last one, since ``done`` pulses come in order (os: the
    drains follow each other; ws: the streams do)."""
    _check_stalls(stall_cycles)
    if not depths:
        return 0
    times = _issue_times(dataflow, rows, cols, list(depths), pipelined)
    return times[-1] + systolic_tile_cycles(dataflow, rows, cols, depths[-1]) + stall_cycles


def systolic_sequence_counters(
    dataflow: str,
    rows: int,
    cols: int,
    depths: list[int],
    *,
    pipelined: bool,
    stall_cycles: int = 0,
    elements: list[int] | None = None,
) -> dict[Counter, int]:
    """Hardware counters of a back-to-back sequence of tiles (as
    :func:`systolic_sequence_cycles` issues them), as the RTL counter block reads them.

    - ``CYCLES``: cycles in which at least one tile is in flight, which for a
      back-to-back sequence is :func:`systolic_sequence_cycles` (the windows
      ``[T_n, T_n + N_n)`` overlap or touch);
    - ``BUSY_CYCLES``: the union of the tiles' MAC windows ``[T_n + off, T_n + off + S_n
      + rows + cols - 2)`` (``off`` = 0 for os, ``rows`` for ws; see
      :func:`systolic_tile_counters`); overlapping tiles share their busy cycles;
    - ``MACS``: ``rows * cols * sum(elements)`` (``elements`` defaults to ``depths``);
    - ``STALL_CYCLES``: ``stall_cycles``.
    """
    _check_stalls(stall_cycles)
    depths = list(depths)
    if not depths:
        return {Counter.CYCLES: 0, Counter.BUSY_CYCLES: 0, Counter.MACS: 0, Counter.STALL_CYCLES: 0}
    elements = list(depths) if elements is None else list(elements)
    if len(elements) != len(depths):
        raise ValueError(f"elements has {len(elements)} entries, depths {len(depths)}")
    macs = sum(rows * cols * _check_elements(e, d) for e, d in zip(elements, depths, strict=True))
    times = _issue_times(dataflow, rows, cols, depths, pipelined)
    off = 0 if dataflow == "os" else rows
    busy, end = 0, None
    for t, d in zip(times, depths, strict=True):
        lo, hi = t + off, t + off + d + rows + cols - 2
        if end is not None and lo < end:
            lo = end
        busy += max(0, hi - lo)
        end = hi if end is None else max(end, hi)
    return {
        Counter.CYCLES: systolic_sequence_cycles(dataflow, rows, cols, depths, pipelined=pipelined)
        + stall_cycles,
        Counter.BUSY_CYCLES: busy,
        Counter.MACS: macs,
        Counter.STALL_CYCLES: stall_cycles,
    }
