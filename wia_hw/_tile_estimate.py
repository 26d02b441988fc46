"""An estimate of a GEMM kernel's cycles under a tiling, for the tiling heuristic's
choice between a tiling and the coarser ones it split it from
(:func:`wia_hw._tiling.choose_gemm_tiling`'s ``estimate``).

The heuristic's own rules count a tile's bytes as its operands' elements. The memory
model moves whole storage blocks (``memory.block_bytes``), so a tile smaller than the
blocks it reads moves more: the attention ``bmm`` of BERT reads its queries and keys
through views of the QKV projection's output, where one head's 128 x 64 matrix is a few
rows of that storage and every tile loads the whole rows of blocks they lie in. Split
over more cores into more, smaller tiles, each loads the same blocks again: BERT-Large
b8 s128 on 64 cores of wia-npu took 5.29 ms with tiles of 2 heads, and 3.73 ms with 16.

The estimate is the host's launch plus the largest of three figures, all from the
emulator's own tiles (``Device.tiles_of``), their partition over the cores
(``Device.shares_of``, on ``GemmTiling.cores`` of them), the blocks their regions map
to (``MemorySystem.runs``, with the operands' storage laid out as the run lays it out)
and the array's issue interval (``systolic_issue_interval``), the cores' tiles taken
in rounds (every core's first tile, then every core's second, ...):

* every core's first load (over the shared L2 port, and from HBM for what is not in
  L2; all start at once), then the busiest core's array time;
* the bytes every core loads over the L2 port, at its rate, where a core's L1 (LRU
  over blocks, its capacity) keeps blocks its earlier tiles loaded;
* the bytes HBM delivers, at its rate: the weights' and inputs' blocks when first
  met, and any block the L2 (LRU over blocks, its capacity; an op's output starts in
  it) has evicted by the time a core needs it again (256 x 4096 x 4096 on 32 cores of
  wia-npu: 128 x 256 tiles read B, 32 MiB, twice from HBM, where 256 x 256 read it
  once: 0.137 ms against 0.085).

Where every operand comes from HBM (``all_cold``: a GEMM of a graph's inputs and
weights, as it runs alone) it also counts

* the results the tiles store, over the L2 port in whole blocks (192 x 4096 x 128 in
  128 x 128 tiles on 64 cores stores 6 MiB of blocks for 1.5 MiB of results), and
  those of the busiest cores' last tiles after their array time (they end together
  and share the port; with one tile a core nothing overlaps them);
* the auto-tuner's lower bound of the emulator's cycles
  (:func:`wia_hw._gemm_bound.cycles_lower_bound`: the launch, the first
  loads' blocks, each core's chain of tiles with every latency, HBM's compulsory
  bytes), so the fixed costs the figures above leave out count where they dominate
  (a small kernel on many cores).

With these it is within a few percent of the emulator on such kernels (768 x 4096 x
64 on 8 cores of wia-npu: 4,683 against 4,718 cycles; 192 x 4096 x 128 on 32: 2,811
against 2,770), which the choice of fewer cores needs
(:func:`wia_hw._tiling.choose_gemm_tiling`). Elsewhere an operand is another op's
output, and where it sits (which cores' L1 hold it) moves the kernel more than these
terms do: counted there too, they changed tilings of BERT-Base, BERT-Large, GPT-2
and ResNet-50 on 4 to 64 cores for none faster and some slower (0.4% on geometric
mean; GPT-2 b4 s256 on 64 cores 5.7%), so they are left out there. Contention
beyond the ports' rates is left out: it ranks tilings of one kernel, which is all it
is used for, and it is not a cycle count.

Where a cycle count is wanted (a short GEMM of cold operands, whose tilings the
tiler compares by running them), :meth:`GemmEstimate.measure` is the emulator's own run
of the kernel alone, at the spec's nominal clock, cut at a limit
(:func:`wia_hw._tiling._measured`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction

from ._gemm_bound import cycles_lower_bound, device_for, layouts_for, run_within
from .emulator.config import DeviceSpec, ThermalConfig
from .emulator.cycles import systolic_issue_interval
from .emulator.device import Device
from .emulator.kernels import GemmKernel, GemmTiling, TensorRef

__all__ = ["GemmEstimate", "gemm_estimate", "operands_cold"]

#: per (spec id, the kernel's canonical signature, tiling): (spec, estimate)
_ESTIMATES: dict[tuple, tuple[DeviceSpec, float]] = {}
#: per (spec id, the kernel's canonical signature, tiling): (spec, cycles alone, HBM
#: bytes), or (spec, a lower bound of the cycles, None) for a run cut or pruned there
_MEASURED: dict[tuple, tuple[DeviceSpec, int, int | None]] = {}
#: per spec id: (spec, the spec at its nominal clock)
_NOMINAL: dict[int, tuple[DeviceSpec, DeviceSpec]] = {}


def gemm_estimate(
    spec: DeviceSpec,
    kernel: GemmKernel,
    storage: tuple[TensorRef, ...] = (),
    cold: frozenset[str] = frozenset(),
) -> GemmEstimate:
    """The estimate of the module docstring for ``kernel`` under a tiling.

    ``storage``: the refs that lay out the operands' storage first in the run (a view's
    storage is laid out by its producer's output, not by the view), in that order; an
    operand not among them is laid out by its own ref. ``cold``: the storage names
    whose blocks come from HBM (weights and the graph's inputs; an op's output is taken
    to be in L2, where its producer left it)."""
    # the same kernel in every layer is the same estimate: names made canonical
    names: dict[str, str] = {}

    def canon(ref: TensorRef | None) -> TensorRef | None:
        if ref is None:
            return None
        return replace(ref, name=names.setdefault(ref.name, f"t{len(names)}"))

    storage = tuple(canon(r) for r in storage)  # type: ignore[misc]
    kernel = replace(
        kernel, a=canon(kernel.a), b=canon(kernel.b), c=canon(kernel.c), bias=canon(kernel.bias)
    )
    cold_names = frozenset(names[n] for n in cold if n in names)
    sig = (
        id(spec),
        storage,
        cold_names,
        kernel.precision,
        kernel.batch,
        kernel.m,
        kernel.n,
        kernel.k,
        kernel.a,
        kernel.b,
        kernel.c,
        kernel.bias,
        kernel.b_shared,
        kernel.b_transposed,
    )
    dev = device_for(spec)
    # laid out as a run lays them out: the storage first, then the kernel's first
    # loads (A before B before the bias), then its output
    refs = storage + tuple(r for r in (kernel.a, kernel.b, kernel.bias, kernel.c) if r)
    mem = layouts_for(spec, refs)
    cold_slots = []  # [first, end) of the blocks of each cold storage
    for ref in refs:
        if ref.name in cold_names:
            lay = mem.layout(ref)
            first = mem.slot_of((lay.tid, 0, 0))
            cold_slots.append(range(first, first + lay.block_rows * lay.block_cols))
    # every operand from HBM: a kernel as it runs alone (see the module docstring)
    all_cold = operands_cold(kernel, cold_names)
    a = spec.compute.array
    l2_rate = Fraction(spec.bytes_per_cycle(spec.memory.l2.bandwidth_gbs))
    hbm_rate = Fraction(spec.bytes_per_cycle(spec.memory.hbm.bandwidth_gbs))
    cap = spec.memory.l1.size_bytes
    l2_cap = spec.memory.l2.size_bytes

    def estimate(tiling: GemmTiling) -> float:
        key = (sig, tiling)
        hit = _ESTIMATES.get(key)
        if hit is not None and hit[0] is spec:
            return hit[1]
        if len(_ESTIMATES) > 4096:
            _ESTIMATES.clear()
        out = _estimate(tiling)
        _ESTIMATES[key] = (spec, out)
        return out

    def _estimate(tiling: GemmTiling) -> float:
        k = replace(kernel, tiling=tiling)
        tiles, groups = dev.tiles_of(k)
        shares = [s for s in Device.shares_of(k, tiles, groups, spec) if s]
        lrus: list[OrderedDict[int, int]] = [OrderedDict() for _ in shares]
        used = [0] * len(shares)
        array = [0] * len(shares)
        l2: OrderedDict[int, int] = OrderedDict()  # blocks in L2, LRU first
        l2_used = 0
        seen: set[int] = set()  # blocks met so far
        port = [0, 0, 0]  # bytes over the L2 port: first tiles, all, last results
        hbm = [0, 0]  # bytes from HBM: first tiles, all
        interval: dict[int, int] = {}
        # the cores' tiles in rounds (every core's first, then every core's second, ...)
        longest = max(map(len, shares), default=0)
        for i in range(longest):
            for c, share in enumerate(shares):
                if i >= len(share):
                    continue
                t = share[i]
                lru = lrus[c]
                for slots, nb, nbs, _ in mem.runs(t.loads):
                    sizes = [nb] * len(slots) if nbs is None else nbs
                    for slot, size in zip(slots, sizes, strict=True):
                        if slot in lru:
                            lru.move_to_end(slot)
                            continue
                        lru[slot] = size
                        used[c] += size
                        port[1] += size
                        port[0] += size if i == 0 else 0
                        while used[c] > cap and len(lru) > 1:
                            used[c] -= lru.popitem(last=False)[1]
                        if slot in l2:
                            l2.move_to_end(slot)
                            continue
                        # from HBM: a cold block, or one L2 has evicted since (a warm
                        # block met first is where its producer left it, in L2)
                        if slot in seen or any(slot in r for r in cold_slots):
                            hbm[1] += size
                            hbm[0] += size if i == 0 else 0
                        seen.add(slot)
                        l2[slot] = size
                        l2_used += size
                        while l2_used > l2_cap and len(l2) > 1:
                            l2_used -= l2.popitem(last=False)[1]
                if all_cold:  # a kernel alone: its results over the port, whole blocks
                    stored = sum(r[3] for r in mem.runs(t.stores))
                    port[1] += stored
                    if i == longest - 1:  # the last tiles of the busiest cores: they
                        port[2] += stored  # end together, and their results contend
                step = interval.get(t.pass_steps)
                if step is None:
                    step = interval[t.pass_steps] = systolic_issue_interval(
                        a.dataflow,
                        a.rows,
                        a.cols,
                        t.pass_steps,
                        t.pass_steps,
                        pipelined=a.pipelined,
                    )
                array[c] += t.passes * step
        first = max(port[0] / l2_rate, hbm[0] / hbm_rate) + max(array, default=0)
        out = max(first + port[2] / l2_rate, port[1] / l2_rate, hbm[1] / hbm_rate)
        out += dev._launch_cycles  # all of it after the host's launch
        if all_cold:
            out = max(out, cycles_lower_bound(k, tiling, spec))
        return float(out)

    def measure(tiling: GemmTiling, limit: int | None = None) -> tuple[int, int] | None:
        key = (sig, tiling)
        hit = _MEASURED.get(key)
        if hit is not None and hit[0] is spec:
            if hit[2] is not None:  # a whole run's
                return (hit[1], hit[2]) if limit is None or hit[1] < limit else None
            if limit is not None and hit[1] >= limit:
                return None
        if len(_MEASURED) > 4096:
            _MEASURED.clear()
        nominal = _nominal(spec)
        k = replace(kernel, tiling=tiling)
        if limit is not None:
            bound = cycles_lower_bound(k, tiling, nominal, stop_at=limit)
            if bound >= limit:
                _MEASURED[key] = (spec, bound, None)
                return None
        rec = run_within(k, nominal, limit)
        if rec is None:  # cut at the limit (only a limit cuts a run)
            _MEASURED[key] = (spec, limit or 0, None)
            return None
        out = (rec.end_cycle - rec.start_cycle, rec.counters.bytes["hbm"])
        _MEASURED[key] = (spec, *out)
        return out

    return GemmEstimate(estimate, measure, all_cold, kernel.compulsory_bytes)


def _nominal(spec: DeviceSpec) -> DeviceSpec:
    """``spec`` with the thermal model's defaults (a die at 25 °C, far below its throttle
    point): the clock a tiling is chosen for. A compiler does not know the die's
    temperature when it runs; a tiling chosen at a throttled clock would change with a
    cooling fix that changes nothing else (kept per spec)."""
    hit = _NOMINAL.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_NOMINAL) > 64:
            _NOMINAL.clear()
        hit = _NOMINAL[id(spec)] = (spec, replace(spec, thermal=ThermalConfig()))
    return hit[1]


def operands_cold(kernel: GemmKernel, cold: frozenset[str]) -> bool:
    """Whether every operand of ``kernel`` (A, B, the bias) is stored in one of the
    ``cold`` storages (the graph's inputs and weights: ``lowering.Storage.cold``), so
    it comes from HBM and the kernel runs as it does alone on a fresh device."""
    return all(r.name in cold for r in (kernel.a, kernel.b, kernel.bias) if r is not None)


class GemmEstimate:
    """:func:`gemm_estimate`'s answer: called with a tiling, the estimate of the kernel's
    cycles under it; :meth:`measure`, the emulator's cycles of the kernel alone;
    ``all_cold``: :func:`operands_cold` of the kernel, which
    :func:`wia_hw._tiling.choose_gemm_tiling` reads before it tries fewer cores or
    measures; ``compulsory_bytes``: the kernel's (``GemmKernel.compulsory_bytes``)."""

    __slots__ = ("_measure", "_of", "all_cold", "compulsory_bytes")

    def __init__(
        self,
        of: Callable[[GemmTiling], float],
        measure: Callable[[GemmTiling, int | None], tuple[int, int] | None],
        all_cold: bool,
        compulsory_bytes: int,
    ) -> None:
        self._of, self._measure, self.all_cold = of, measure, all_cold
        self.compulsory_bytes = compulsory_bytes

    def __call__(self, tiling: GemmTiling) -> float:
        return self._of(tiling)

    def measure(self, tiling: GemmTiling, limit: int | None = None) -> tuple[int, int] | None:
        """The emulator's cycles and HBM bytes of the kernel under ``tiling``, alone on a
        fresh device of the spec at its nominal clock (:func:`_nominal`), as
        ``Device(spec).execute([kernel])`` counts them; ``None`` when the cycles are at
        least ``limit`` (the closed-form bound reaches it, or the run is cut there:
        :func:`wia_hw._gemm_bound.run_within`). Kept per kernel and tiling."""
        return self._measure(tiling, limit)
