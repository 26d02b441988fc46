"""The GEMM tiling heuristic that :mod:`wia_hw.lowering`'s module docstring describes:
:func:`choose_gemm_tiling` picks the tiles of one GEMM on a spec (the auto-tuner may
replace them, per kernel key). Each step's reason, and what it measured, is in the
docstring of the function that takes it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from typing import NamedTuple

from ._tile_estimate import GemmEstimate
from .emulator.config import DeviceSpec
from .emulator.cycles import systolic_steps, systolic_tile_cycles
from .emulator.device import Device
from .emulator.kernels import GemmTiling, TensorRef
from .emulator.memory import BlockLayout

__all__ = ["choose_gemm_tiling"]


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def choose_gemm_tiling(
    spec: DeviceSpec,
    batch: int,
    m: int,
    n: int,
    k: int,
    elem_bytes: int,
    out_bytes: int,
    b_transposed: bool = False,
    estimate: Callable[[GemmTiling], float] | None = None,
) -> GemmTiling:
    """The tiling heuristic of the module docstring, for one GEMM on ``spec``
    (``b_transposed``: B is stored ``n x k``); with ``estimate``, also on fewer cores.

    The heuristic's tiling for every core (:func:`_choose`) is the answer unless, with
    an ``estimate`` of a kernel whose operands all come from HBM (its ``all_cold``: a
    GEMM of a graph's inputs and weights, as it runs alone), the tiling the heuristic
    makes for fewer cores, run on those cores alone (``GemmTiling.cores``, the others
    idle), is estimated lower by the margin (:data:`COLD_MARGIN`). The counts tried are
    the halvings of the device's and the powers of two below it, so what a device of
    ``c`` of these cores runs is among the choices of any device with more: more cores
    are no slower in the estimate, to the margin. Without this, a count that gave each
    core one output tile, with nothing to overlap its first load with, was slower than
    half of it: 256 x 4096 x 4096 on wia-npu took 79,165 cycles on 16 cores, 70,973 on
    8. A count is skipped, with every smaller one, once the array time alone of its
    cores (the kernel's MACs at their peak rate) reaches the best estimate so far.

    A short kernel of operands from HBM (:func:`_short`) is tiled by the emulator
    instead, among the same counts' tilings and those of smaller L1s
    (:func:`_measured`).

    A kernel that reads another op's output is left on every core: its producer's
    output sits in the L1s of the cores that wrote it, and a kernel on fewer cores
    slows the op after it, which the estimate of one kernel does not see (BERT-Base b8
    s512 on 32 cores: the attention-score ``bmm`` on 16 cores made the softmax after it
    59% slower, the model 11%).
    """
    t = _choose(spec, batch, m, n, k, elem_bytes, out_bytes, b_transposed, estimate)
    cores = spec.compute.cores
    if estimate is None or not getattr(estimate, "all_cold", False):
        return t
    g = _Gemm(batch, m, n, k, elem_bytes, out_bytes, b_transposed)
    if isinstance(estimate, GemmEstimate) and _short(spec, g):
        return _measured(spec, t, estimate, g)
    if cores == 1:
        return t
    best, best_est = t, estimate(t) * COLD_MARGIN
    macs = Fraction(batch * m * n * k)
    per_core = _peak_macs(spec, elem_bytes) / cores
    for c in _fewer_cores(cores):
        if macs / (per_core * c) >= best_est:
            break
        cand = _on_cores(spec, c, spec.memory.l1.size_kib, estimate, g)
        if (e := estimate(cand)) < best_est:
            best, best_est = cand, e
    return best


class _Gemm(NamedTuple):
    """A GEMM's shape and element widths, as :func:`_choose` takes them."""

    batch: int
    m: int
    n: int
    k: int
    elem_bytes: int
    out_bytes: int
    b_transposed: bool = False


def _fewer_cores(cores: int) -> list[int]:
    """The core counts below ``cores`` a GEMM of cold operands may run on, most first:
    the halvings of ``cores`` and the powers of two below it."""
    counts = {cores >> i for i in range(1, cores.bit_length())}
    counts |= {1 << j for j in range(cores.bit_length()) if 1 << j < cores}
    return sorted(counts, reverse=True)


def _on_cores(
    spec: DeviceSpec, c: int, kib: int, estimate: Callable[[GemmTiling], float], g: _Gemm
) -> GemmTiling:
    """The heuristic's tiling for ``c`` of ``spec``'s cores with ``kib`` KiB of L1 (as on
    a device of ``c`` cores and that L1), to run on those cores alone
    (``GemmTiling.cores``; 0 when ``c`` is all of them)."""
    if c == spec.compute.cores:
        return _choose(_variant(spec, c, kib), *g, estimate)

    def on_c(t: GemmTiling) -> float:
        return estimate(replace(t, cores=c))

    return replace(_choose(_variant(spec, c, kib), *g, on_c), cores=c)


def _short(spec: DeviceSpec, g: _Gemm) -> bool:
    """Whether a GEMM is short enough for :func:`_measured`: the heuristic's tiling for
    one of ``spec``'s cores has at most :data:`MEASURED_TILES` tiles (one core's, so
    every core count of the spec decides alike, and more cores never leave the
    measured choices)."""
    one = _choose(_variant(spec, 1, spec.memory.l1.size_kib), *g)
    return one.tile_count(g.batch, g.m, g.n, g.k) <= MEASURED_TILES


def _measured(spec: DeviceSpec, t: GemmTiling, estimate: GemmEstimate, g: _Gemm) -> GemmTiling:
    """Of the heuristic's tilings of a short GEMM of cold operands for every core count
    :func:`_fewer_cores` allows and every halving of L1 down to
    :data:`MEASURED_L1_BLOCKS` blocks (each run on its cores alone, in the spec's
    whole L1), the one the emulator's runs give the least :func:`run_cost`: ``t``, the
    heuristic's own, unless one costs strictly less.

    The estimate ranks tilings; it is not a cycle count, and between tilings a few
    percent apart it picks the slower often enough that a device with more cores, or
    more L1, ran such a GEMM slower than one with fewer: 160 random GEMMs on 4 to 64
    cores of wia-npu had 3 slower on some count than on a smaller one, up to 10.5%;
    60 on its 4 cores, with L1 doubled from 1 to 16 MiB, were slower than with less at
    122 of the 240 steps, up to 63% (384 x 256 x 4096: 11,532 cycles at 4 MiB of L1,
    16,544 at 8), where the heuristic's bigger tiles left cores without work or
    without a second tile to overlap a load with. Here the emulator decides:
    ``estimate.measure``, the kernel alone on a fresh device at its nominal clock,
    lowest estimate first, each run cut at the best so far (or pruned by the
    closed-form bound, :func:`wia_hw._gemm_bound.cycles_lower_bound`), by
    :func:`run_cost`. What a device of fewer cores or less L1 picks is among the
    choices of one with more, each on the cores and in the L1 it names; the count is
    exact (a device runs ``GemmTiling.cores=c`` as a device of ``c`` cores does), the
    L1 holds more of the same blocks. Now none of the 160 is slower on more cores, and
    5 of the 240 L1 steps are (up to 8.4%: a GEMM too long to measure with the smaller
    L1, where the heuristic's tiling is kept); on 16 cores none. Another 60 random
    GEMMs on the 4 cores take 9.0% fewer cycles on geometric mean, none more, with no
    more HBM bytes (a100-systolic: 0.8%). Only a short GEMM is
    measured so: its runs cost milliseconds each (a 4096^3 GEMM's tiling on 64 cores
    0.27 s); a long one keeps the estimate's choice."""
    cores = spec.compute.cores
    sizes = [spec.memory.l1.size_kib]
    while sizes[-1] // 2 * 1024 >= MEASURED_L1_BLOCKS * spec.memory.block_bytes:
        sizes.append(sizes[-1] // 2)

    def cost(run: tuple[int, int]) -> Fraction:
        return run_cost(spec, estimate.compulsory_bytes, run)

    first = estimate.measure(t)
    if first is None:  # (only a limit cuts a run)
        return t
    best, best_cost = t, cost(first)
    seen = {t}
    macs = Fraction(g.batch * g.m * g.n * g.k)
    per_core = _peak_macs(spec, g.elem_bytes) / cores
    for c in [cores, *_fewer_cores(cores)]:
        if macs / (per_core * c) >= best_cost:
            break  # the array time alone of c cores (and of fewer) reaches the best
        cands = [_on_cores(spec, c, kib, estimate, g) for kib in sizes]
        cands = [x for x in dict.fromkeys(cands) if x not in seen]
        seen.update(cands)
        for cand in sorted(cands, key=estimate):
            # a run whose cycles reach the best cost costs at least as much: cut there
            run = estimate.measure(cand, math.ceil(best_cost))
            if run is not None and cost(run) < best_cost:
                best, best_cost = cand, cost(run)
    return best


def run_cost(spec: DeviceSpec, compulsory: int, run: tuple[int, int]) -> Fraction:
    """What :func:`_measured` minimises over a GEMM's runs ``(cycles, HBM bytes)``: the
    cycles, plus the HBM time (at the spec's bandwidth) of the bytes the run moves
    beyond the kernel's ``compulsory`` ones (``GemmKernel.compulsory_bytes``: its
    operands and results once). A re-read that the array's time hides is
    still energy, and bandwidth another kernel could use: 1024 x 4096 x 16384 on
    wia-npu ran 2.8% faster in 512 x 256 x 256 tiles than in 1024^3, reading 411 MB
    from HBM against 176 MB, for 13% more energy."""
    rate = Fraction(spec.bytes_per_cycle(spec.memory.hbm.bandwidth_gbs))
    return run[0] + max(0, run[1] - compulsory) / rate


#: A GEMM of cold operands is :func:`_measured` when the heuristic cuts it into at most
#: this many tiles for one core.
MEASURED_TILES = 256
#: The smallest L1 (in storage blocks) whose heuristic tiling :func:`_measured` runs.
MEASURED_L1_BLOCKS = 4


#: per (spec id, cores, L1 KiB): (spec, the spec with that many cores and that L1)
_VARIANTS: dict[tuple[int, int, int], tuple[DeviceSpec, DeviceSpec]] = {}


def _variant(spec: DeviceSpec, cores: int, l1_kib: int) -> DeviceSpec:
    """``spec`` with ``cores`` cores and ``l1_kib`` KiB of L1 (kept per spec and both)."""
    if (cores, l1_kib) == (spec.compute.cores, spec.memory.l1.size_kib):
        return spec
    hit = _VARIANTS.get((id(spec), cores, l1_kib))
    if hit is None or hit[0] is not spec:
        if len(_VARIANTS) > 256:
            _VARIANTS.clear()
        mem = replace(spec.memory, l1=replace(spec.memory.l1, size_kib=l1_kib))
        sub = replace(spec, compute=replace(spec.compute, cores=cores), memory=mem)
        hit = _VARIANTS[(id(spec), cores, l1_kib)] = (spec, sub)
    return hit[1]


def _choose(
    spec: DeviceSpec,
    batch: int,
    m: int,
    n: int,
    k: int,
    elem_bytes: int,
    out_bytes: int,
    b_transposed: bool = False,
    estimate: Callable[[GemmTiling], float] | None = None,
) -> GemmTiling:
    """The tiling heuristic for every core of ``spec``.

    ``estimate``: an estimate of the kernel's cycles under a tiling (the lowering's
    :func:`wia_hw._tile_estimate.gemm_estimate`, which sees the operands' storage
    blocks). The heuristic splits tiles for the cores and for pipelining; each split
    reads more bytes per MAC, which its rules count in the tile's own bytes. A tile
    reads whole storage blocks, so where a tile is smaller than the blocks it reads (a
    view of the QKV projection's output, read one attention head at a time) a split
    can double the bytes over the L2 port and gain nothing. With ``estimate``, the
    tilings before each split are estimated too, and the heuristic's result is
    replaced by an earlier one only when that one's estimate is lower by a margin
    (:data:`ESTIMATE_MARGIN`)."""
    a = spec.compute.array
    R, C = a.rows, a.cols
    budget = spec.memory.l1.size_bytes // 2  # one of the two operand buffers
    out_budget = spec.memory.l1.size_bytes // 4  # results drain through L1 as well
    cores = spec.compute.cores

    def fits(tm: int, tn: int, tk: int, tb: int = 1) -> bool:
        return tb * (tm + tn) * tk * elem_bytes <= budget and tb * tm * tn * out_bytes <= out_budget

    mcap, ncap = _ceil_to(m, R), _ceil_to(n, C)
    if a.dataflow == "os":

        def grow(tk: int) -> tuple[int, int]:
            tm, tn = _shrunk(min(R, mcap), min(C, ncap), lambda tm, tn: fits(tm, tn, tk))
            while True:
                grow_m = tm <= tn and tm + R <= mcap and fits(tm + R, tn, tk)
                grow_n = not grow_m and tn + C <= ncap and fits(tm, tn + C, tk)
                if grow_m:
                    tm += R
                elif grow_n:
                    tn += C
                elif tm + R <= mcap and fits(tm + R, tn, tk):
                    tm += R
                else:
                    break
            return tm, tn

        tk = k
        if not fits(R, C, tk):
            tk = max(1, budget // ((R + C) * elem_bytes))
            # whole array rows deep where that fits; below, K slices as deep as fit (an
            # output-stationary array streams K, so a shallow slice costs loads, not MACs)
            tk = min(k, tk // R * R if tk >= R else tk)
        tm, tn = grow(tk)
        # Panels stream elem_bytes x (1/tm + 1/tn) bytes per MAC: from L2, and from HBM
        # again for every row or column of output tiles when an operand does not stay in
        # L2. A K slice of T (two T x T panels fill the buffer) lets the output tile, and
        # the reuse of every byte, grow; a slice of T steps keeps the array's passes long,
        # so it is taken whenever it grows the tile. (It was taken only when a threshold
        # said the panels outran L2 or HBM: a yes/no estimate whose errors made more
        # bandwidth, L2, L1 or cores up to 2-4x slower, e.g. 4096 x 512 x 16384 on
        # wia-npu 1.22 ms at 32 MiB of L2, 0.56 at 16; always: 0.56 ms. A weight
        # gradient's K is the step's tokens: 4096 x 1024 x 32768 took 9.66 ms, 5.4 GB
        # from HBM, with 128 x 128 x 8192 tiles; 2.18 ms, 344 MB with 1024 x 1024 x 1024.)
        side = math.isqrt(budget // (2 * elem_bytes)) // R * R
        if side > R and tk > side:
            tm2, tn2 = grow(side)

            def per_mac(tm: int, tn: int) -> float:  # operand bytes a MAC streams
                return 1 / min(tm, m) + 1 / min(tn, n)

            # only where both operands are re-read (two rows and two columns of output
            # tiles) and it cuts the streamed bytes by a tenth: a GEMV or a decode GEMM
            # (one row of output tiles) streams each weight once whatever its tile, and
            # its K cut would be all cost
            rereads = -(-m // tm) >= 2 and -(-n // tn) >= 2
            # an array that does not overlap one pass's fill and drain with the next pays
            # them for every K slice (BERT-Large on wia-npu unpipelined: 35.9 ms with
            # whole-K tiles, 37.2 sliced): there a slice is taken only when the panels
            # would outrun the L2 port, as before
            if (
                a.pipelined
                and rereads
                and per_mac(tm2, tn2) < 0.9 * per_mac(tm, tn)
                or (not a.pipelined and _l2_starved(spec, elem_bytes, tm, tn))
                and 1 / tm2 + 1 / tn2 < 1 / tm + 1 / tn
            ):
                tk, tm, tn = side, tm2, tn2
    else:
        # weight-stationary: the streamed rows amortise fill and drain, so they go first
        tm, tk, tn = min(m, 4096), min(k, R), min(C, ncap)
        while tm > 1 and not fits(tm, tn, tk):
            tm = max(1, tm // 2)
        if tm < min(m, R) or not fits(tm, tn, tk):
            # fewer streamed rows than the array is high (a pass's fill and drain, about
            # 2R + C steps, then outweigh them), or no tile fits at all: the stationary
            # block may be cut too
            tm, tk, tn = _ws_small_buffer(spec, m, n, k, elem_bytes, fits)
        while tk < k and fits(tm, tn, min(k, tk + R)):
            tk = min(k, tk + R)
        while tn + C <= ncap and fits(tm, tn + C, tk):
            tn += C
    tk = _even_k(k, tk, R)
    tb = 1
    if tm >= m and tn >= n and batch > 1:
        tb = max(
            1,
            min(
                batch,
                budget // max(1, (m * tk + tk * n) * elem_bytes),
                out_budget // max(1, m * n * out_bytes),
            ),
        )
    tm, tn = min(tm, max(m, 1)), min(tn, max(n, 1))

    def count(tm: int, tn: int, tb: int) -> int:
        return -(-batch // tb) * -(-m // tm) * -(-n // tn) * -(-k // tk)

    def halved(tm: int, tn: int, tb: int) -> tuple[int, int, int] | None:
        if tb > 1:
            return tm, tn, -(-tb // 2)
        if a.dataflow == "ws" and tn > C:
            # a weight-stationary pass streams tm rows: halving tn keeps each pass as
            # long, halving tm doubles its share of fill and drain (wia-edge, 512 x 1024
            # x 1024 int8 at 4 MiB of L1: 0.515 ms with tm halved, 0.419 with tn)
            return tm, _ceil_to(-(-tn // 2), C), tb
        if tm > R and tm >= tn:
            return _ceil_to(-(-tm // 2), R), tn, tb
        if tn > C:
            return tm, _ceil_to(-(-tn // 2), C), tb
        if a.dataflow == "ws" and tm > 64:
            return -(-tm // 2), tn, tb
        return None

    def outputs(tm: int, tn: int, tb: int) -> int:
        return -(-batch // tb) * -(-m // tm) * -(-n // tn)

    um, un = (1, C) if a.dataflow == "ws" else (R, C)

    def share(tm: int, tn: int, tb: int) -> int:  # a core's MAC slots per K, at most
        return -(-outputs(tm, tn, tb) // cores) * tb * _ceil_to(tm, um) * _ceil_to(tn, un)

    # give every core an output tile where possible: one output tile's K slices run on
    # one core (``Device.tiles_of``), so they do not count as work for another. A split
    # that gives some cores a second output tile while others idle (a partial wave) is
    # not taken when it adds to the busiest core's work, nor, when K is cut, when it
    # leaves that work as it is: then each output tile is a long run of K slices, each
    # a load, and the busiest core runs two of them (a100-systolic's 108 cores, 64 x
    # 12288 x 12288 in 64 x 144 tiles, 86 of them: 0.199 ms; split to 64 x 80, 154
    # tiles: 0.239 ms; 128 x 12288 x 12288, 64 tiles of 128 x 192: 0.238 ms, split to
    # 128 x 96: 0.279). With K whole the split pipelines and spreads the loads: GPT-2's
    # 64 x 768 x 768 on 4 cores in 6 tiles of 64 x 128 takes 17% less than in 3 of 256.
    def partial_wave(half: tuple[int, int, int]) -> bool:
        now, then = share(tm, tn, tb), share(*half)
        return then > now or (then == now and tk < k and outputs(*half) % cores != 0)

    chain = [(tm, tn, tb)]  # the tilings passed through, coarsest first
    while outputs(tm, tn, tb) < cores:
        half = halved(tm, tn, tb)
        if half is None or partial_wave(half):
            break
        tm, tn, tb = half
        chain.append(half)
    # Then up to PIPELINE_TILES tiles a core while a tile still keeps its array busy for
    # several times a tile's fixed cost, and its panels would not outrun the L2 port: a
    # core's first load and last computation overlap nothing, and with few, large tiles
    # they are a large part of its time.
    floor = _min_tile_cycles(spec)
    while count(tm, tn, tb) < PIPELINE_TILES * cores:
        half = halved(tm, tn, tb)
        if (
            half is None
            or _array_cycles(spec, *half, min(tk, k), elem_bytes) < floor
            or _l2_demand(spec, *half, min(tk, k), elem_bytes) > 1
            # a partial wave of long K runs, as above (512 x 4096 x 3645 on 16 cores:
            # +18% against 8); with K whole the split is for the pipeline
            or (tk < k and partial_wave(half))
        ):
            break
        tm, tn, tb = half
        chain.append(half)

    def finished(tm: int, tn: int, tb: int) -> GemmTiling:
        t = _balanced(spec, batch, m, n, k, GemmTiling(tm=tm, tn=tn, tk=tk, tb=tb), elem_bytes)
        return t if b_transposed else _whole_blocks(spec, n, k, t, elem_bytes, out_bytes)

    t = finished(tm, tn, tb)
    if estimate is None or len(chain) == 1:
        return t
    # a split that the estimate says is clearly slower is undone (see the docstring)
    margin = COLD_MARGIN if getattr(estimate, "all_cold", False) else ESTIMATE_MARGIN
    best, best_est = t, estimate(t) * margin
    for state in reversed(chain[:-1]):
        cand = finished(*state)
        if cand != best and (e := estimate(cand)) < best_est:
            best, best_est = cand, e
    return best


#: An earlier tiling replaces the heuristic's only when its estimate is below this
#: fraction of the heuristic's. The estimate sees a kernel alone: not which core's L1
#: holds the producer's output, which the heuristic's tiles of one attention head
#: match (BERT-Base b8 s512 on 48 cores: the context ``bmm`` 17% faster in the estimate
#: with 4 heads a tile than with 2, and 4.6x slower in the model).
ESTIMATE_MARGIN = 0.9
#: The margin where every operand comes from HBM (the estimate's ``all_cold``), for an
#: earlier tiling and for fewer cores: then no producer's output sits in some core's
#: L1, the estimate's blind spot above, and the estimate also counts the results'
#: stores and the kernel's lower bound (``wia_hw._tile_estimate``); it is within a few
#: percent of the model there, about as far apart as the tilings it weighs, hence a
#: margin still (1024 x 4096 x 1024 on 32 cores of wia-npu: 16 cores' tiling
#: estimated 8% lower, and 10% faster).
COLD_MARGIN = 0.95


def _halvings(x: int) -> list[int]:
    """``x, ceil(x / 2), ...`` down to 1."""
    out = [x]
    while out[-1] > 1:
        out.append(-(-out[-1] // 2))
    return out


def _ws_small_buffer(
    spec: DeviceSpec, m: int, n: int, k: int, elem_bytes: int, fits: Callable[..., bool]
) -> tuple[int, int, int]:
    """A weight-stationary tile ``(tm, tk, tn)`` for an L1 too small for an array's
    height of streamed rows under a whole stationary block: of the tiles whose rows,
    depth and width are halvings of ``min(m, 4096)``, ``min(k, R)`` and the array's
    width, that fit, the one with the fewest array cycles over the whole GEMM (its
    tiles x passes x (steps + fill and drain)); ties to the larger tile. The smallest
    tile when none fits."""
    a = spec.compute.array
    R, C = a.rows, a.cols
    rate = a.rate(_precision(spec, elem_bytes))
    best: tuple[int, int, int] = (1, 1, 1)
    best_key: tuple[int, int] | None = None
    for tm in _halvings(min(m, 4096)):
        steps = systolic_tile_cycles("ws", R, C, systolic_steps(tm, rate))  # with fill
        for tk in _halvings(min(k, R)):
            for tn in _halvings(min(n, C)):
                if not fits(tm, tn, tk):
                    continue
                tiles = -(-m // tm) * -(-n // tn) * -(-k // tk)
                key = (tiles * steps, -tm * tk * tn)
                if best_key is None or key < best_key:
                    best, best_key = (tm, tk, tn), key
    return best


def _shrunk(x: int, y: int, ok: Callable[[int, int], bool]) -> tuple[int, int]:
    """``(x, y)``, the larger halved (rounded up) while ``ok`` refuses them and one is
    above 1: a tile's two sides cut to fit its buffer."""
    while not ok(x, y) and (x > 1 or y > 1):
        if x >= y:
            x = -(-x // 2)
        else:
            y = -(-y // 2)
    return x, y


def _whole_blocks(
    spec: DeviceSpec, n: int, k: int, t: GemmTiling, elem_bytes: int, out_bytes: int
) -> GemmTiling:
    """``t``, or ``t`` widened to whole block columns of B with K cut to fit, when its B
    panel uses at most half of each block it touches (output-stationary: only when K is
    cut already).

    B (``k x n``) is stored in blocks of ``br x bc`` elements (``BlockLayout``). A tile
    narrower than ``bc`` reads whole blocks from HBM and uses a part; the rest waits in
    L2 for the core's next tiles, as long as LRU keeps it: with several cores streaming,
    it does not, and B crosses HBM several times (a 1 x 4096 x 4096 int8 GEMV on
    ``wia-edge``, B in 128 x 128 blocks, tiles 32 wide: 0.87 ms on 3 cores, 1.42 ms on
    4; 2.46 ms on one, where the L1 port and the DMA pay for the narrow panels). Tiles
    of whole block columns read each block once: ``tn`` becomes a multiple of ``bc``
    (and of the array's columns), ``tk`` the largest multiple of ``br`` (else of the
    array's rows) that fits the operand buffer; a weight-stationary array sums the K
    slices in its accumulators, so the cut costs little (1.80 ms on one core, 0.71 ms on
    3 and on 4). On output-stationary arrays K slices are partial outputs stored and
    read back, so they are widened only where K is cut already: there the same re-read
    happens (1 x 8192 x 28672 fp16 on wia-npu, B in 256 x 256 blocks, 128-wide tiles:
    B crossed HBM twice, 1.69 ms on 4 cores against 1.23 on 2; 0.86 ms widened, and
    8 x 4096 x 16384 0.49 -> 0.25 ms); a K slice a whole-K tile would add measured
    slower (+5 to +14%).
    """
    a = spec.compute.array
    lay = BlockLayout.for_tensor(0, TensorRef("b", k, n, elem_bytes), spec.memory.block_bytes)
    bc, br = lay.bc, lay.br
    if t.tb > 1 or t.tn >= n or 2 * t.tn > bc or (a.dataflow != "ws" and t.tk >= k):
        return t
    tn = min(_ceil_to(_ceil_to(t.tn, bc), a.cols), _ceil_to(n, a.cols))
    if t.tm * tn * out_bytes > spec.memory.l1.size_bytes // 4:
        return t
    tk = spec.memory.l1.size_bytes // 2 // ((t.tm + tn) * elem_bytes)
    unit = br if tk >= br else a.rows
    tk = min(k, tk // unit * unit)
    if tk < min(a.rows, k):  # not an array's height of K beside the wider panel
        return t
    tk = _even_k(k, tk, unit)
    if tk < min(a.rows, k):
        return t
    return replace(t, tn=tn, tk=tk)


def _even_k(k: int, tk: int, unit: int) -> int:
    """A K slice no longer than ``tk`` that cuts K into as many slices as ``tk`` does,
    as even as whole ``unit`` multiples allow: a short last slice cannot hide the next
    tile's load behind its computation (a GEMV on wia-edge in slices of 3968 and 128:
    2.20 ms; of 2048 and 2048, or whole: 1.58)."""
    if tk >= k:
        return tk
    even = _ceil_to(-(-k // -(-k // tk)), unit)
    return even if even <= tk else tk


#: Tiles a core gets, where the shape and :func:`_min_tile_cycles` allow (see above).
PIPELINE_TILES = 4


def _array_cycles(spec: DeviceSpec, tm: int, tn: int, tb: int, tk: int, elem_bytes: int) -> int:
    """Steps a tile keeps one array busy: its passes (``Device._gemm_geometry``'s count)
    times the steps of each (:func:`~wia_hw.emulator.cycles.systolic_steps` of ``tk``
    output-stationary, of ``tm`` weight-stationary, at the array's rate)."""
    a = spec.compute.array
    rate = a.rate(_precision(spec, elem_bytes))
    if a.dataflow == "ws":
        return tb * -(-tk // a.rows) * -(-tn // a.cols) * systolic_steps(tm, rate)
    return tb * -(-tm // a.rows) * -(-tn // a.cols) * systolic_steps(tk, rate)


def _min_tile_cycles(spec: DeviceSpec) -> int:
    """Array steps a tile must keep to be split further for pipelining: 4 times what a
    tile costs besides its steps (DMA setup, L2 latency, and one fill and drain of the
    array, ``2 rows + cols - 2``). All in cycles of the spec's own, so no bandwidth,
    buffer size or clock changes the tiling it allows."""
    a = spec.compute.array
    fill = systolic_tile_cycles(a.dataflow, a.rows, a.cols, 1) - 1  # a pass less its step
    return 4 * (spec.dma.setup_cycles + spec.memory.l2.latency_cycles + fill)


def _l2_demand(spec: DeviceSpec, tm: int, tn: int, tb: int, tk: int, elem_bytes: int) -> Fraction:
    """Operand bytes of a tile over what a core's share of the L2 port delivers while
    the core's arrays run the tile at their peak rate (above 1: they would wait)."""
    cycles = Fraction(_array_cycles(spec, tm, tn, tb, tk, elem_bytes), spec.compute.arrays_per_core)
    share = spec.bytes_per_cycle(spec.memory.l2.bandwidth_gbs) / spec.compute.cores
    return Fraction(tb * (tm + tn) * tk * elem_bytes) / (share * cycles)


def _sides(extent: int, side: int, unit: int) -> list[int]:
    """Tile sides below ``side`` that cut ``extent`` into more, even tiles: for each
    count up to twice as many tiles as ``side`` gives, plus one, ``ceil(extent /
    count)`` rounded up to ``unit`` (not rounded when ``side`` is below one unit)."""
    first = -(-extent // side)
    out = set()
    for count in range(first + 1, 2 * first + 2):
        even = -(-extent // count)
        s = _ceil_to(even, unit) if side >= unit else even
        if s < side:
            out.add(s)
    return sorted(out, reverse=True)


def _edge_sizes(extent: int, side: int) -> list[int]:
    return [min(side, extent - i) for i in range(0, extent, side)]


#: per (spec id, batch, m, n, k, tiling): (spec, balanced tiling)
_BALANCED: dict[tuple, tuple[DeviceSpec, GemmTiling]] = {}


def _balanced(
    spec: DeviceSpec, batch: int, m: int, n: int, k: int, t: GemmTiling, elem_bytes: int
) -> GemmTiling:
    """``t``, or the tiling whose busiest core has the least array work among those that
    cut batch, M or N into more, even tiles (same K slice and loop order); ties keep the
    larger tile, so a tiling that is already even stays.

    The cores take contiguous runs of tiles of equal count (or every ``cores``-th output
    tile under ``tile_schedule: round_robin``), so tiles of unequal size, or a count that
    does not divide over the cores, leave one core more passes than its share: 2048 x
    2048 x 256 in 1536 x 1536 tiles gives one core 9 times the work of another, and the
    bigger tiles a bigger L1 allows can make the kernel slower. A tile's array work is
    its MAC slots: ``tb x tm x tn x tk``, with ``tm`` and ``tn`` (output-stationary) or
    ``tk`` and ``tn`` (weight-stationary) padded to whole passes. Tiles only shrink, so
    every candidate fits where ``t`` does.
    """
    cores = spec.compute.cores
    out_tiles = -(-batch // t.tb) * -(-m // t.tm) * -(-n // t.tn)
    if cores == 1 or out_tiles > 1024:
        return t  # one core, or a share already within a fraction of a tile of even
    key = (id(spec), batch, m, n, k, t, elem_bytes)
    hit = _BALANCED.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    a = spec.compute.array
    um, un, uk = (1, a.cols, a.rows) if a.dataflow == "ws" else (a.rows, a.cols, 1)
    slices = -(-k // t.tk)
    k_work = sum(_ceil_to(s, uk) for s in _edge_sizes(k, t.tk))
    rr = spec.compute.tile_schedule == "round_robin"

    def busiest(tb: int, tm: int, tn: int) -> int:
        mw = [_ceil_to(s, um) for s in _edge_sizes(m, tm)]
        nw = [_ceil_to(s, un) for s in _edge_sizes(n, tn)]
        outer, inner = (mw, nw) if t.order == "mn" else (nw, mw)
        work = [b * o * i for b in _edge_sizes(batch, tb) for o in outer for i in inner]
        if rr:  # whole output tiles (all their K slices) dealt in turn
            return max(sum(work[c::cores]) for c in range(cores)) * k_work
        # contiguous runs of whole output tiles (all their K slices: one group each,
        # Device.tiles_of), balanced by tile count as Device.partition deals them
        prefix = [0]
        for w in work:
            prefix.append(prefix[-1] + w)
        total = len(work) * slices
        groups = range(0, total, slices) if slices > 1 else ()
        shares = Device.contiguous_shares(groups, total, cores)
        return max(prefix[hi // slices] - prefix[lo // slices] for lo, hi in shares) * k_work

    best = (busiest(t.tb, t.tm, t.tn), 0, t)
    tk = min(t.tk, k)
    limit = max(Fraction(1, 2), _l2_demand(spec, t.tm, t.tn, t.tb, tk, elem_bytes))
    # HBM bytes times the busiest core's work: a tiling that re-reads more from HBM
    # must even the work by more than it adds (no bandwidth in it: see _hbm_bytes)
    cost = _hbm_bytes(spec, batch, m, n, k, t.tm, t.tn, tk, t.order, elem_bytes) * best[0]
    for tb in [t.tb, *_sides(batch, t.tb, 1)]:
        for tm in [t.tm, *_sides(m, t.tm, um)]:
            for tn in [t.tn, *_sides(n, t.tn, un)]:
                if -(-batch // tb) * -(-m // tm) * -(-n // tn) > 4 * out_tiles + cores:
                    continue
                if _l2_demand(spec, tm, tn, tb, tk, elem_bytes) > limit:
                    continue
                work = busiest(tb, tm, tn)
                if _hbm_bytes(spec, batch, m, n, k, tm, tn, tk, t.order, elem_bytes) * work > cost:
                    continue
                cand = (work, -tb * tm * tn, replace(t, tb=tb, tm=tm, tn=tn))
                if cand[:2] < best[:2]:
                    best = cand
    if len(_BALANCED) > 4096:
        _BALANCED.clear()
    _BALANCED[key] = (spec, best[2])
    return best[2]


def _hbm_bytes(
    spec: DeviceSpec,
    batch: int,
    m: int,
    n: int,
    k: int,
    tm: int,
    tn: int,
    tk: int,
    order: str,
    e: int,
) -> int:
    """Operand bytes a GEMM's tiles read from HBM, estimated: each operand once when
    its reuse stays on chip, else once for every row (B, loop order ``mn``) or column
    (A) of output tiles. In loop order ``mn`` a row's A panel stays in the core's L1
    over the row when K is whole, or in L2 when every core's panel fits in half of it;
    B stays in L2 when it fits in half of it (``nm``: the roles swap). A deep-K GEMM
    whose operands outgrow L2 re-reads them from HBM for every row or column of output
    tiles (4096 x 512 x 16384 on 5 cores of wia-npu: 640 x 256 tiles evened the cores'
    work by 6% and read 348 MB from HBM against 170 with 512 x 512, 0.63 ms against
    0.55). Only its growth from one tiling to another is used: against how much a
    tiling evens the cores' work, so no bandwidth changes the tiling."""
    half_l2 = spec.memory.l2.size_bytes // 2
    cores = spec.compute.cores
    mt, nt = -(-m // tm), -(-n // tn)
    a, b = batch * m * k * e, batch * k * n * e
    if order == "nm":  # B's panels stay; A is re-read for every column of tiles
        a, b, mt, nt, tm, tn = b, a, nt, mt, tn, tm
    a_reads = 1 if tk >= k or cores * tm * k * e <= half_l2 else nt
    b_reads = 1 if b <= half_l2 else mt
    return a * a_reads + b * b_reads


def _precision(spec: DeviceSpec, elem_bytes: int) -> str:
    """The precision of ``elem_bytes``-byte operands, or the array's fastest when it has
    none of that width."""
    prec = {1: "int8", 2: "fp16", 4: "fp32"}.get(elem_bytes, "")
    if spec.supports(prec):
        return prec
    return max(spec.compute.array.macs_per_pe_cycle, key=spec.peak_macs_per_cycle)


def _peak_macs(spec: DeviceSpec, elem_bytes: int) -> Fraction:
    """MACs per cycle of all the arrays for ``elem_bytes``-byte operands."""
    return Fraction(spec.peak_macs_per_cycle(_precision(spec, elem_bytes)))


def _l2_starved(spec: DeviceSpec, elem_bytes: int, tm: int, tn: int) -> bool:
    """Whether output tiles of ``tm x tn`` need more L2 bandwidth than the L2 port has
    when every array runs at its peak rate for ``elem_bytes``-byte operands."""
    demand = elem_bytes * (Fraction(1, tm) + Fraction(1, tn)) * _peak_macs(spec, elem_bytes)
    return demand > spec.bytes_per_cycle(spec.memory.l2.bandwidth_gbs)
