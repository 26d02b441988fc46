"""One GEMM kernel alone on a fresh device: a lower bound of its cycles, in closed form
(:func:`cycles_lower_bound`); the per-spec devices and storage layouts it and the
tiling estimate read (:func:`device_for`, :func:`layouts_for`); an equivalent tiling
(:func:`canonical_tiling`); and the emulator's own run of it, stoppable at a cycle and
continued later (:class:`PartialRun`, :func:`run_within`).

The auto-tuner prunes candidates with the bound (:mod:`wia_hw.optimize._fast_eval`,
whose docstring says why a bound and not the cycles), and the tiling estimate
(:mod:`wia_hw._tile_estimate`) counts it for a kernel whose operands all come from
HBM. The bound reads the emulator's own tiling (``Device._gemm_geometry``,
``Device._a_region``, or ``Device.tiles_of`` and ``Device.partition`` for schedules
other than contiguous), array timing and block layout, so it follows them as they
change; where it re-derives the tiles' dimensions and first regions in closed form, a
test compares them with ``Device.tiles_of`` (``tests/test_fast_eval.py``).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby
from typing import Any

from .emulator.config import DeviceSpec
from .emulator.counters import Counters
from .emulator.cycles import systolic_steps
from .emulator.device import Device
from .emulator.kernels import GemmKernel, GemmTiling, TensorRef
from .emulator.memory import MemorySystem

__all__ = [
    "PartialRun",
    "canonical_tiling",
    "cycles_lower_bound",
    "device_for",
    "layouts_for",
    "run_within",
]

#: per spec (by id, the spec kept): a Device for its tiles (and the auto-tuner's bound)
#: and a MemorySystem per set of storage layouts
_DEVICES: dict[int, tuple[DeviceSpec, Device]] = {}
_MEMORY: dict[tuple, tuple[DeviceSpec, MemorySystem]] = {}


def device_for(spec: DeviceSpec) -> Device:
    """A ``Device(spec)`` kept per spec, for its tiling and timing functions (not run)."""
    hit = _DEVICES.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_DEVICES) > 64:
            _DEVICES.clear()
        hit = _DEVICES[id(spec)] = (spec, Device(spec))
    return hit[1]


def layouts_for(spec: DeviceSpec, refs: tuple[TensorRef, ...]) -> MemorySystem:
    """A MemorySystem of a fresh ``Device(spec)`` with ``refs`` laid out in that order
    (each storage by the first ref of its name, as a run meets them), kept per spec
    and refs; only its layouts (block slots and bytes) are used."""
    key = (id(spec), refs)
    hit = _MEMORY.get(key)
    if hit is None or hit[0] is not spec:
        if len(_MEMORY) > 256:
            _MEMORY.clear()
        mem = MemorySystem(spec, Counters())
        for ref in refs:
            mem.layout(ref)
        hit = _MEMORY[key] = (spec, mem)
    return hit[1]


#: per spec (by id, the spec kept): the figures of _consts
_CONSTS: dict[int, tuple[DeviceSpec, dict[str, Any]]] = {}


def _rest(dev: Device, facts: list[tuple[int, int, int, int, int]], store: bool) -> int:
    """Cycles from a core's first operand load's end to its end at the earliest: its
    tiles back to back on the array, then (``store``) its last tile's result store."""
    c = _consts(dev.spec)
    l1_num, l1_den = c["l1_rate"]
    timing = dev._array_timing
    prev_steps = 0
    cs = a_last = port_free = 0  # first pass accepted; last pass; L1 port free
    comp_done = done = 0  # all tiles computed; the last tile computed
    for (passes, steps, l1_bytes, array_cycles, _), g in groupby(facts):
        n = sum(1 for _ in g)
        port = -(-l1_bytes * l1_den // l1_num)
        if dev._pipelined and steps:
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
    sb = facts[-1][4] if store else 0
    if sb:  # the last tile's results are stored once it is done
        num, den = c["l2_rate"]
        end = max(end, done + c["setup"] + c["l2_lat"] + -(-sb * den // num))
    return end


def _consts(spec: DeviceSpec) -> dict[str, Any]:
    """The figures the bound uses, read from a fresh device's memory system (its ports'
    rates, as (numerator, denominator) bytes per cycle, and its latencies), once per
    spec. HBM's rate is the sum of its channels' (what they move per cycle, refresh
    included when the emulator charges it as a rate)."""
    hit = _CONSTS.get(id(spec))
    if hit is None or hit[0] is not spec:
        mem = device_for(spec).memory

        def rate(r: Any) -> tuple[int, int]:
            return r.numerator, r.denominator

        hit = _CONSTS[id(spec)] = (
            spec,
            {
                "l1_rate": rate(mem.l1_ports[0].bytes_per_cycle),
                "l2_rate": rate(mem.l2_port.bytes_per_cycle),
                "hbm_rate": rate(sum(ch.bytes_per_cycle for ch in mem.channels)),
                "setup": spec.dma.setup_cycles,
                "l1_lat": mem.l1_latency,
                "l2_lat": mem.l2_latency,
                "hbm_lat": mem.hbm_latency,
            },
        )
    return hit[1]


def _gemm_facts(dev: Device, k: GemmKernel) -> list[list[tuple[int, int, int, int, int]]]:
    """Per core, in order, each tile's (passes, pass steps, L1 bytes, array cycles, result
    data bytes or 0), as ``Device._gemm_tiles`` and ``Device.partition`` (contiguous
    schedule) make them, from the tiles' dimensions alone (no regions built)."""
    t = k.tiling
    spec = dev.spec
    R, C, df = dev._rows, dev._cols, dev._df
    rate = spec.compute.array.rate(k.precision)
    arrays = spec.compute.arrays_per_core
    e, e_c = k.a.elem_bytes, k.c.elem_bytes

    def sides(extent: int, tile: int) -> list[int]:
        return [min(extent, (i + 1) * tile) - i * tile for i in range(-(-extent // tile))]

    bs, ms, ns, ks = sides(k.batch, t.tb), sides(k.m, t.tm), sides(k.n, t.tn), sides(k.k, t.tk)
    kt = len(ks)
    geo: dict[tuple[int, int, int, int, int], tuple[int, int, int, int, int]] = {}

    def fact(nb: int, mi: int, ni: int, ki: int, kk: int) -> tuple[int, int, int, int, int]:
        last = kk == kt - 1
        p_, pc_, l1_, _, _ = dev._gemm_geometry(df, R, C, rate, nb, mi, ni, ki, e, e_c, last=False)
        steps = systolic_steps(ki if df == "os" else mi, rate)
        if arrays > 1:  # passes dealt to the core's arrays in rounds
            p_ = -(-p_ // arrays)
        out_bytes = nb * mi * ni * e_c
        extra = 0 if kt == 1 else out_bytes * (2 if kk else 1)  # partial sums in L1
        return (
            p_,
            steps,
            l1_ + extra + (out_bytes if last else 0),
            p_ * pc_,
            out_bytes if last else 0,
        )

    facts = []
    app = facts.append
    mn = t.order == "mn"
    outer, inner = (ms, ns) if mn else (ns, ms)
    for nb in bs:
        for od in outer:
            for idim in inner:
                mi, ni = (od, idim) if mn else (idim, od)
                for kk, ki in enumerate(ks):
                    key = (nb, mi, ni, ki, kk if kk < 2 or kk == kt - 1 else 1)
                    f = geo.get(key)
                    if f is None:
                        f = geo[key] = fact(nb, mi, ni, ki, kk)
                    app(f)
    cores = t.active_cores(spec.compute.cores)
    return [facts[lo:hi] for lo, hi in _shares(len(facts), kt, cores)]


def _shares(total: int, kt: int, cores: int) -> list[tuple[int, int]]:
    """Each core's ``[start, end)`` of ``total`` GEMM tiles under the contiguous
    schedule, the K slices of an output tile (``kt`` of them) one group, as
    ``Device.tiles_of`` and ``Device.partition`` make them."""
    return Device.contiguous_shares(range(0, total, kt) if kt > 1 else (), total, cores)


def _first_loads(k: GemmKernel, cores: int) -> list[list[tuple]]:
    """The operand regions of each core's first tile, as ``Device._gemm_tiles`` makes
    them, under the contiguous schedule (core ``c``'s first tile is the first of its
    share in loop order, :func:`_shares`); ``[]`` for a core without tiles."""
    t = k.tiling
    mt, nt = -(-k.m // t.tm), -(-k.n // t.tn)
    kt, bt = -(-k.k // t.tk), -(-k.batch // t.tb)
    n_outer, n_inner = (mt, nt) if t.order == "mn" else (nt, mt)
    out: list[list[tuple]] = []
    for lo, hi in _shares(bt * mt * nt * kt, kt, cores):
        if hi == lo:
            out.append([])
            continue
        rest, kk = divmod(lo, kt)
        rest, q = divmod(rest, n_inner)
        bb, o = divmod(rest, n_outer)
        i, j = (o, q) if t.order == "mn" else (q, o)
        b0, b1 = bb * t.tb, min(k.batch, (bb + 1) * t.tb)
        nb = b1 - b0
        m0, m1 = i * t.tm, min(k.m, (i + 1) * t.tm)
        n0, n1 = j * t.tn, min(k.n, (j + 1) * t.tn)
        k0, k1 = kk * t.tk, min(k.k, (kk + 1) * t.tk)
        ar = (b0 * k.m, b1 * k.m) if t.tb > 1 or nb > 1 else (b0 * k.m + m0, b0 * k.m + m1)
        b_key = Device._b_key(k, b0, b1, k0, k1, n0, n1)
        loads = [Device._a_region(k, ar, k0, k1), (k.b, *b_key)]
        if kk == kt - 1 and k.bias is not None:
            loads.append((k.bias, 0, 1, n0, n1))
        out.append(loads)
    return out


def _tile_facts(dev: Device, k: GemmKernel) -> list[list[tuple[int, int, int, int, int]]]:
    """:func:`_gemm_facts` from the emulator's own tiles and partition (any schedule)."""
    tiles, groups = dev.tiles_of(k)
    shares = Device.partition(
        tiles,
        groups,
        k.tiling.active_cores(dev.spec.compute.cores),
        dev.spec.compute.tile_schedule,
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


def cycles_lower_bound(
    kernel: GemmKernel,
    tiling: GemmTiling,
    spec: DeviceSpec,
    stop_at: int | None = None,
    chains_only: bool = False,
) -> int:
    """A lower bound, in cycles, of ``end_cycle - start_cycle`` of ``kernel`` with
    ``tiling`` run alone on a fresh ``Device(spec)``: the largest of

    * **each core's chain**: the kernel launch, the core's first operand load, then its
      tiles back to back on the array as ``Device._core`` books them with no operand
      ever late (pipelined: a tile's first pass is accepted ``systolic_issue_interval``
      after the previous tile's last pass and not before the L1 port has delivered the
      previous tile's bytes; its last pass is done ``systolic_tile_cycles`` after
      acceptance; not pipelined: each tile takes ``max(array cycles, L1 port
      cycles)``), then its last tile's result store when it has one (over the L2 port:
      ``setup + l2.latency + ceil(bytes / rate)``). The first loads: every core issues
      its first load at the launch's end, in core order, into an empty L1 and L2, so
      core ``c``'s ends no earlier than the DMA setup plus the later of ``l2.latency``
      after the L2 port has moved the first tiles' blocks of cores ``0..c`` (each a
      booking of its distinct blocks' bytes, rounded up) and, when core ``c`` is the
      first to touch some blocks, ``hbm.latency`` after HBM has moved those, over all
      channels at best evenly; and the last of the loads that read HBM ends no earlier
      than ``hbm.latency`` after HBM has moved every block the first tiles touch, so
      the kernel also ends no earlier than that plus the shortest of those cores'
      chains after it;
    * **HBM**: the launch, then the operands' bytes (every element of A, B and the
      bias crosses HBM at least once into the empty L2), at best spread evenly over
      the channels at their rate, then ``hbm.latency`` and the DMA setup. Counted
      only for operands laid out by their own shape (the first reference to their
      storage, without offset): a view that meets its storage first on a fresh device
      may map onto fewer blocks.

    Throttling, contention, refresh, misses and stalls only add cycles, so the
    emulator's count is never below this (``tests/test_fast_eval.py``). With
    ``stop_at``, the first-load terms (which need the tiles' blocks) are left out when
    the rest already reaches ``stop_at``. With ``chains_only``, only the cores' chains
    (after a first load from L1 at the earliest): a bound wherever the operands are,
    warm in L1 or L2 (a kernel in a graph) or not. Costs a fraction of a millisecond (a loop
    over the tiles' dimensions; the first loads, over the emulator's own tiles).
    """
    dev = device_for(spec)
    k = replace(kernel, tiling=tiling)
    contiguous = spec.compute.tile_schedule == "contiguous"
    per_core = _gemm_facts(dev, k) if contiguous else _tile_facts(dev, k)
    c = _consts(spec)
    l2_num, l2_den = c["l2_rate"]
    hbm_num, hbm_den = c["hbm_rate"]
    setup, l2_lat, hbm_lat = c["setup"], c["l2_lat"], c["hbm_lat"]
    launch = dev._launch_cycles
    # tensors laid out by their own shape on the fresh device: the first reference
    # of each storage name met (A, B, the bias, then C), when it has no offset
    own: dict[str, TensorRef] = {}
    for ref in (k.a, k.b, k.bias, k.c):
        if ref is not None and ref.name not in own:
            own[ref.name] = ref
    own = {n: r for n, r in own.items() if r.offset == 0}
    rests = [_rest(dev, facts, own.get(k.c.name) is k.c) if facts else None for facts in per_core]
    # an empty L1 misses, over the L2 port; a load of no block (a view whose offset
    # maps outside the layout its storage got) takes the L1 latency
    first_load = launch + setup + min(c["l1_lat"], l2_lat + 1)
    best = max(first_load + r for r in rests if r is not None)
    if chains_only:
        return best
    # HBM: every operand element once, at best evenly over the channels
    reads = {r.name: r.nbytes for r in (k.a, k.b, k.bias) if r is not None and own.get(r.name) is r}
    hbm = sum(reads.values())
    best = max(best, launch + hbm * hbm_den // hbm_num + hbm_lat + setup)
    if stop_at is not None and best >= stop_at:
        return best
    # the first loads: their regions, and the emulator's blocks of them
    if contiguous:
        firsts = _first_loads(k, tiling.active_cores(spec.compute.cores))
    else:
        tiles, groups = dev.tiles_of(k)
        shares = Device.partition(
            tiles,
            groups,
            tiling.active_cores(spec.compute.cores),
            spec.compute.tile_schedule,
            [t.origin for t in tiles],
        )
        firsts = [share[0].loads if share else [] for share in shares]
    # k's tensors laid out as a fresh device running k does (A before B before the
    # bias, then C); only their slots and bytes are used
    mem = layouts_for(spec, tuple(r for r in (k.a, k.b, k.bias, k.c) if r is not None))
    seen: dict[int, int] = {}  # blocks the first loads touched so far: their bytes
    l2_end = 0  # the L2 port's bookings so far, from the launch's end
    after: list[int] = []  # the chains of the cores whose first load reads HBM
    for loads, rest in zip(firsts, rests, strict=True):
        if not loads or rest is None:
            continue
        blocks: dict[int, int] = {}
        for slots, nb, nbs, _ in mem.runs(loads):
            blocks.update(zip(slots, [nb] * len(slots) if nbs is None else nbs, strict=True))
        if not blocks:
            continue
        l2_end += -(-sum(blocks.values()) * l2_den // l2_num)
        new = sum(b for s, b in blocks.items() if s not in seen)
        seen.update(blocks)
        ld = launch + setup + l2_lat + l2_end
        if new:  # blocks no earlier core touched: this load fetches them from HBM
            ld = max(ld, launch + setup + hbm_lat + new * hbm_den // hbm_num)
        best = max(best, ld + rest)
        if new:
            after.append(rest)
    if after:  # the first load that ends last moved the last of all their HBM bytes
        union = sum(seen.values())
        last = launch + setup + hbm_lat + union * hbm_den // hbm_num
        best = max(best, last + min(after))
    return best


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
