"""Cheap, exact answers about one GEMM candidate alone on a fresh device, without the
emulator: an equivalent tiling (:func:`canonical_tiling`) and a lower bound of its
cycles (:func:`cycles_lower_bound`).

The autotuner asks one question of a candidate: does it take fewer cycles than the
best found so far? When the lower bound is already at or above that best, the answer
is no, exactly, and the emulator need not run; otherwise the emulator runs (cached).
So a search that prunes with the bound picks the same best tiling, with the same
cycles, as one that runs every candidate (``tests/test_fast_eval.py`` checks both the
bound and that identity).

Why a bound and not the cycles themselves: a single GEMM's run is not periodic in a
way that can be extrapolated exactly. The shared L2's LRU order depends on how the
cores' loads interleave in time, edge blocks spread over the HBM channels by their
absolute address, and the HBM channels refresh every ``tREFI`` cycles from a fixed
phase, so a transfer's end depends on the absolute cycle it starts at (a per-tile
period would have to be a multiple of ``tREFI`` for the timeline to repeat). The
emulator spends its time in that memory model (about 40% of a run), the device's
per-tile bookkeeping (25%), builtins they call (18%) and SimPy (7%), so no shortcut
around one of them brings a run of hundreds of tiles near a millisecond.

Both functions take the emulator's own tiling (``Device.tiles_of``,
``Device.partition``), array timing and block layout, so they follow it as it changes.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any

from ..emulator.config import DeviceSpec
from ..emulator.cycles import systolic_steps
from ..emulator.device import Device
from ..emulator.kernels import GemmKernel, GemmTiling, TensorRef

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


#: per spec (by id, the spec kept): a Device whose tiling and array timing are used
_DEVICES: dict[int, tuple[DeviceSpec, Device]] = {}


def _device(spec: DeviceSpec) -> Device:
    hit = _DEVICES.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_DEVICES) > 64:
            _DEVICES.clear()
        hit = _DEVICES[id(spec)] = (spec, Device(spec))
    return hit[1]


def _cycles(nbytes: int, rate: Fraction) -> int:
    """Cycles of ``nbytes`` at ``rate`` bytes per cycle, rounded up (a port's booking)."""
    return -(-nbytes * rate.denominator // rate.numerator)


def _gemm_facts(dev: Device, k: GemmKernel) -> list[list[tuple[int, int, int, int, int]]]:
    """Per core, in order, each tile's (passes, pass steps, L1 bytes, array cycles, result
    data bytes or 0), as ``Device._gemm_tiles`` and ``Device.partition`` (contiguous
    schedule) make them, from the tile's dimensions alone (no regions built)."""
    t = k.tiling
    spec = dev.spec
    R, C, df = dev._rows, dev._cols, dev._df
    rate = spec.compute.array.rate(k.precision)
    arrays = spec.compute.arrays_per_core
    e, e_c = k.a.elem_bytes, k.c.elem_bytes
    mt, nt = -(-k.m // t.tm), -(-k.n // t.tn)
    kt, bt = -(-k.k // t.tk), -(-k.batch // t.tb)
    n_outer, n_inner = (mt, nt) if t.order == "mn" else (nt, mt)
    total = bt * mt * nt * kt
    cores = spec.compute.cores
    geo: dict[tuple[int, int, int, int, bool], tuple[int, int, int, int, int]] = {}
    out: list[list[tuple[int, int, int, int, int]]] = []
    lo = 0
    for c in range(cores):
        hi = lo + total // cores + (1 if c < total % cores else 0)
        facts = []
        for idx in range(lo, hi):
            rest, kk = divmod(idx, kt)
            rest, q = divmod(rest, n_inner)
            bb, o = divmod(rest, n_outer)
            i, j = (o, q) if t.order == "mn" else (q, o)
            nb = min(k.batch, (bb + 1) * t.tb) - bb * t.tb
            mi = min(k.m, (i + 1) * t.tm) - i * t.tm
            ni = min(k.n, (j + 1) * t.tn) - j * t.tn
            ki = min(k.k, (kk + 1) * t.tk) - kk * t.tk
            last = kk == kt - 1
            key = (nb, mi, ni, ki, last, kk == 0)
            f = geo.get(key)
            if f is None:
                p_, pc_, l1_, slot_, busy_ = dev._gemm_geometry(
                    df, R, C, rate, nb, mi, ni, ki, e, e_c, last=False
                )
                steps = systolic_steps(ki if df == "os" else mi, rate)
                if arrays > 1:
                    p_ = -(-p_ // arrays)
                out_bytes = nb * mi * ni * e_c
                extra = 0 if kt == 1 else out_bytes * (2 if kk else 1)
                f = geo[key] = (
                    p_,
                    steps,
                    l1_ + extra + (out_bytes if last else 0),
                    p_ * pc_,
                    out_bytes if last else 0,
                )
            facts.append(f)
        out.append(facts)
        lo = hi
    return out


def _tile_facts(dev: Device, k: GemmKernel) -> list[list[tuple[int, int, int, int, int]]]:
    """:func:`_gemm_facts` from the emulator's own tiles and partition (any schedule)."""
    tiles, groups = dev.tiles_of(k)
    shares = Device.partition(
        tiles, groups, dev.spec.compute.cores, dev.spec.compute.tile_schedule,
        [t.origin for t in tiles],
    )
    out = []
    for share in shares:
        facts = []
        for t in share:
            nb, mi, ni, _ = t.dims
            sb = nb * mi * ni * k.c.elem_bytes if t.stores else 0
            facts.append((t.passes, t.pass_steps, t.l1_bytes, t.array_cycles, sb))
        out.append(facts)
    return out


def _runs(facts: list[tuple[int, ...]]) -> list[tuple[tuple[int, ...], int]]:
    """``facts`` as (fact, count) runs of equal consecutive items."""
    out: list[tuple[tuple[int, ...], int]] = []
    prev, n = None, 0
    for f in facts:
        if f == prev:
            n += 1
        else:
            if n:
                out.append((prev, n))
            prev, n = f, 1
    if n:
        out.append((prev, n))
    return out


def cycles_lower_bound(
    kernel: GemmKernel, tiling: GemmTiling, spec: DeviceSpec
) -> int:
    """A lower bound, in cycles, of ``end_cycle - start_cycle`` of ``kernel`` with
    ``tiling`` run alone on a fresh ``Device(spec)``: the larger of

    * **a core's chain**, for every core: the kernel launch, its first operand load
      (at least ``setup + l2.latency + 1``: its L1 is empty, so the load crosses the
      L2 port), then its tiles back to back on the array as ``Device._core`` books
      them with no operand ever late (pipelined: a tile's first pass is accepted
      ``systolic_issue_interval`` after the previous tile's last pass and not before
      the L1 port has delivered the previous tile's bytes; its last pass is done
      ``systolic_tile_cycles`` after acceptance; not pipelined: each tile takes
      ``max(array cycles, L1 port cycles)``), then its last tile's result store when
      it has one (over the L2 port: ``setup + l2.latency + ceil(bytes / rate)``);
    * **HBM**: the launch, then the operands' bytes (every element of A, B and the
      bias crosses HBM at least once into the empty L2), at best spread evenly over
      the channels at their rate, then ``hbm.latency`` and the DMA setup. Counted
      only for operands laid out by their own shape (the first reference to their
      storage, without offset): a view that meets its storage first on a fresh device
      may map onto fewer blocks.

    Throttling, contention, refresh, misses and stalls only add cycles, so the
    emulator's count is never below this (``tests/test_fast_eval.py``). Costs a loop
    over the tiles' dimensions: a fraction of a millisecond for 256 tiles.
    """
    dev = _device(spec)
    k = replace(kernel, tiling=tiling)
    if spec.compute.tile_schedule == "contiguous":
        per_core = _gemm_facts(dev, k)
    else:
        per_core = _tile_facts(dev, k)
    m = spec.memory
    l1_rate = spec.bytes_per_cycle(m.l1.bandwidth_gbs)
    l2_rate = spec.bytes_per_cycle(m.l2.bandwidth_gbs)
    setup = spec.dma.setup_cycles
    l2_lat = m.l2.latency_cycles
    launch = dev._launch_cycles
    pipelined = dev._pipelined
    timing = dev._array_timing
    # an empty L1 misses, over the L2 port; a load of no block (a view whose offset
    # maps outside the layout its storage got) takes the L1 latency
    first_load = min(m.l1.latency_cycles, l2_lat + 1)
    # tensors laid out by their own shape on the fresh device: the first reference
    # of each storage name met (A, B, the bias, then C), when it has no offset
    own: dict[str, TensorRef] = {}
    for ref in (k.a, k.b, k.bias, k.c):
        if ref is not None and ref.name not in own:
            own[ref.name] = ref
    own = {n: r for n, r in own.items() if r.offset == 0}
    c_own = own.get(k.c.name) is k.c
    best = 0
    for facts in per_core:
        if not facts:
            continue
        t = launch + setup + first_load  # the first load
        prev_steps = 0
        cs = a_last = port_free = t  # first pass accepted; last pass; L1 port free
        comp_done = done = t  # all tiles computed; the last tile computed
        for (passes, steps, l1_bytes, array_cycles, _), n in _runs(facts):
            port = -(-l1_bytes * l1_rate.denominator // l1_rate.numerator)
            if pipelined and steps:
                cross, inner, lat, _ = timing(prev_steps, steps)
                if prev_steps:
                    cs = max(cs, a_last + cross, port_free)
                if n > 1:  # n - 1 more equal tiles: each one step later
                    same = timing(steps, steps)[0]
                    cs += (n - 1) * max((passes - 1) * inner + same, port)
                a_last = cs + (passes - 1) * inner
                port_free = cs + port
                done = max(a_last + lat, port_free)
                prev_steps = steps
            else:
                cs = max(cs, comp_done)
                done = cs + n * max(array_cycles, port)
                prev_steps = 0
            comp_done = max(comp_done, done)
        end = comp_done
        sb = facts[-1][4] if c_own else 0
        if sb:  # the last tile's results are stored once it is done
            end = max(end, done + setup + l2_lat + _cycles(sb, l2_rate))
        best = max(best, end)
    # HBM: every operand element once, at best evenly over the channels
    reads = {r.name: r.nbytes for r in (k.a, k.b, k.bias) if r is not None and own.get(r.name) is r}
    rate = spec.bytes_per_cycle(m.hbm.bandwidth_gbs)  # all channels together
    hbm_lat = math.ceil(m.hbm.latency_ns * spec.clock_ghz)
    hbm = sum(reads.values())
    return max(best, launch + hbm * rate.denominator // rate.numerator + hbm_lat + setup)


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
