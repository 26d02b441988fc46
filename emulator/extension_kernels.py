"""Kernels of device extensions: units that bring their own tile program.

The device (:class:`~wia_hw.emulator.device.Device`) cuts a built-in kernel
(:class:`~wia_hw.emulator.kernels.GemmKernel`, :class:`~wia_hw.emulator.kernels.VectorKernel`)
into tiles itself. An extension's unit (a flash-attention engine, a 2:4 sparse tensor
unit, a processing-in-memory stack, a photonic or analog core) works differently, so
its kernel carries its tiles ready-made:

* :class:`TiledKernel` runs on the cores' tile machinery: each :class:`Tile` is staged
  by the core's DMA engine through the cache hierarchy (so hits, misses and bytes at each
  level are counted exactly as for a built-in kernel), double-buffered against the
  compute of the previous tile, whose cycles the extension computed with the cycle
  functions of its unit. Tiles come in *groups* (for example the key/value chunks of
  one query block) that one core runs in order; groups are dealt to the cores in
  contiguous, balanced runs.
* :class:`MemoryKernel` runs inside the memory (PIM): no core works and no byte
  crosses the HBM interface, except that dirty cached copies of its tensors are
  written back first and its outputs' cached copies are dropped afterwards (the PIM
  unit changes them behind the caches). Its duration is given in device cycles.

Both are executed by :func:`execute_kernel` (the runtime calls it for any kernel that
has an ``execute_on`` method). MACs done outside the systolic array (``array=False``:
photonic, analog, PIM) are counted in ``macs`` and FLOPs but charged the energy the
extension reports (``energy_pj``) instead of the array's ``pj_per_mac``.

The executor drives the device's own per-core tile process and energy accounting, so a
core stalls, contends for L2 and HBM, heats up and throttles exactly as it does for a
built-in kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

from .counters import Counters
from .device import Device, KernelRecord, Tile
from .kernels import GemmKernel, TensorRef, VectorKernel, _KernelBase

__all__ = ["TiledKernel", "MemoryKernel", "CostedKernel", "ExtensionKernelRecord",
           "execute_kernel", "execute_kernels", "gemm_passes", "gemm_tile_dims",
           "vector_tile_dims", "extension_summary", "Tile"]


@dataclass
class ExtensionKernelRecord(KernelRecord):
    """A :class:`KernelRecord` with the figures the extension reports (``extra``)."""

    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TiledKernel(_KernelBase):
    """A kernel with a ready-made tile program (see the module docstring).

    ``tiles``: the work items in order; ``groups``: the index of the first tile of each
    group (a group is never split across cores; empty means every tile is a group).
    ``macs``/``flops``/``vector_flops``: what the kernel does (counted once, at the end).
    ``array``: whether the MACs run on the systolic array (charged ``pj_per_mac``) or on
    an extension unit (charged ``energy_pj``). ``record_kind`` names the unit in reports
    (``"gemm"``, ``"vector"``, ``"photonic"``, ...). ``extra``: figures to report.
    """

    record_kind: str = "gemm"
    precision: str = "fp16"
    tiles: tuple[Tile, ...] = ()
    groups: tuple[int, ...] = ()
    macs: int = 0
    flops: int = 0
    vector_flops: int = 0
    compulsory_bytes: int = 0
    array: bool = True
    energy_pj: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for n in ("macs", "flops", "vector_flops", "compulsory_bytes"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"TiledKernel.{n} must be a non-negative integer, got {v!r}")
        if not self.tiles:
            raise ValueError(f"TiledKernel {self.name!r} has no tiles")
        g = self.groups
        if g and (g[0] != 0 or any(b <= a for a, b in zip(g, g[1:], strict=False))
                  or g[-1] >= len(self.tiles)):
            raise ValueError(f"TiledKernel.groups must start at 0 and increase within the "
                             f"{len(self.tiles)} tiles, got {g[:8]}")

    def execute_on(self, device: Device) -> list[KernelRecord]:
        """Run on ``device``; one record."""
        return [execute_kernel(device, self)]


@dataclass(frozen=True)
class MemoryKernel(_KernelBase):
    """Work done inside the memory (processing in memory) for ``cycles`` device cycles.

    ``reads``: tensors the PIM units read (their dirty cached copies are written back
    first); ``writes``: tensors they modify (written back first too, and dropped from the
    caches after). ``commands``: bank commands the host issues (the ``instructions``
    counter). ``flops``: element operations done. ``energy_pj``: the memory's energy.
    """

    cycles: int = 0
    reads: tuple[TensorRef, ...] = ()
    writes: tuple[TensorRef, ...] = ()
    commands: int = 0
    flops: int = 0
    energy_pj: float = 0.0
    compulsory_bytes: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    record_kind: str = "pim"
    precision: str = "int16"

    def __post_init__(self) -> None:
        for n in ("cycles", "commands", "flops", "compulsory_bytes"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"MemoryKernel.{n} must be a non-negative integer, got {v!r}")

    @property
    def macs(self) -> int:
        return 0

    def execute_on(self, device: Device) -> list[KernelRecord]:
        """Run on ``device``; one record."""
        return [execute_kernel(device, self)]


#: A tile's cost: ``dims -> (cycles, macs or None, energy_pj or None)``. ``dims`` holds
#: ``B, M, N, K`` of a GEMM tile or ``ROWS, COLS, ELEMENTS`` of a vector chunk.
TileCost = Callable[[Mapping[str, int]], tuple[int, "int | None", "float | None"]]


@dataclass(frozen=True)
class CostedKernel(_KernelBase):
    """A built-in kernel's tiling and data movement with an extension's compute cost.

    The device tiles ``inner`` as usual (so every tile loads and stores what the
    built-in kernel would), then each tile's compute cycles, MACs and energy come from
    ``tile_cost`` (a YAML cost model). ``extra_inputs`` are operands of fused tail ops:
    one the size of the output is read tile by tile with the output's rows and columns,
    a smaller one whole by every tile that stores. ``extra_flops``: the fused tails'
    FLOPs (counted on the vector side).
    """

    inner: GemmKernel | VectorKernel | None = None
    tile_cost: TileCost | None = None
    extra_inputs: tuple[TensorRef, ...] = ()
    extra_flops: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def macs(self) -> int:     # the dense MACs of the op (executed MACs: the record)
        return self.inner.macs if self.inner is not None else 0

    @property
    def flops(self) -> int:
        return (self.inner.flops if self.inner is not None else 0) + self.extra_flops

    def execute_on(self, device: Device) -> list[KernelRecord]:
        """Tile ``inner`` on ``device``, cost every tile, run; one record."""
        inner = self.inner
        if inner is None or self.tile_cost is None:
            raise ValueError(f"CostedKernel {self.name!r} needs inner and tile_cost")
        gemm = isinstance(inner, GemmKernel)
        if gemm:
            tiles = device._gemm_tiles(inner)
            dims = gemm_tile_dims(inner)
        else:
            tiles = device._vector_tiles(inner)
            dims = vector_tile_dims(inner)
        out: list[Tile] = []
        macs = 0
        energy = 0.0
        own_energy = True
        cache: dict[tuple[int, ...], tuple[int, int | None, float | None]] = {}
        for tile, d in zip(tiles, dims, strict=True):
            key = tuple(d.values())
            got = cache.get(key)
            if got is None:
                got = cache[key] = self.tile_cost(d)
            cyc, m, e = got
            if gemm and tile.macs != d["B"] * d["M"] * d["N"] * d["K"]:
                raise RuntimeError("the device's GEMM tile order changed: update "
                                   "gemm_tile_dims to match Device._gemm_tiles")
            tmacs = (tile.macs if m is None else int(m)) if gemm else int(m or 0)
            macs += tmacs
            if e is None:
                own_energy = False
            else:
                energy += e
            loads = list(tile.loads)
            if self.extra_inputs and tile.stores:
                _, r0, r1, c0, c1 = tile.stores[0]
                for ref in self.extra_inputs:
                    out_ref = tile.stores[0][0]
                    if ref.rows * ref.cols == out_ref.rows * out_ref.cols:
                        loads.append((TensorRef(ref.name, out_ref.rows, out_ref.cols,
                                                ref.elem_bytes, ref.offset), r0, r1, c0, c1))
                    else:
                        loads.append((ref, 0, ref.rows, 0, ref.cols))
            out.append(Tile(loads, list(tile.stores), cyc if gemm else 0,
                            0 if gemm else cyc, tile.l1_bytes, tile.passes, tmacs,
                            tmacs if gemm else 0))
        vec = self.extra_flops + (0 if gemm else inner.flops)
        k = TiledKernel(
            name=self.name, op=self.op, group=self.group, op_kind=self.op_kind, io=self.io,
            attrs=self.attrs, provider=self.provider,
            record_kind="gemm" if gemm else "vector",
            precision=inner.precision if gemm else "fp16", tiles=tuple(out),
            macs=macs, flops=2 * macs + vec, vector_flops=vec,
            compulsory_bytes=inner.compulsory_bytes + sum(r.nbytes for r in self.extra_inputs),
            array=not own_energy, energy_pj=energy if own_energy else 0.0,
            extra={**self.extra, "dense_macs": self.macs, "executed_macs": macs})
        return [execute_kernel(device, k)]


def gemm_tile_dims(k: GemmKernel) -> list[dict[str, int]]:
    """``B, M, N, K`` of every tile of ``k``, in the order the device cuts them
    (:meth:`Device._gemm_tiles`: batch groups, output tiles in ``order``, K slices)."""
    t = k.tiling
    mt, nt = -(-k.m // t.tm), -(-k.n // t.tn)
    kt, bt = -(-k.k // t.tk), -(-k.batch // t.tb)
    outer, inner = (range(mt), range(nt)) if t.order == "mn" else (range(nt), range(mt))
    e = k.a.elem_bytes if k.a is not None else 2
    out = []
    for bb in range(bt):
        nb = min(k.batch, (bb + 1) * t.tb) - bb * t.tb
        for o in outer:
            for q in inner:
                i, j = (o, q) if t.order == "mn" else (q, o)
                mi = min(k.m, (i + 1) * t.tm) - i * t.tm
                ni = min(k.n, (j + 1) * t.tn) - j * t.tn
                for kk in range(kt):
                    ki = min(k.k, (kk + 1) * t.tk) - kk * t.tk
                    out.append({"B": nb, "M": mi, "N": ni, "K": ki, "E": e})
    return out


def vector_tile_dims(k: VectorKernel) -> list[dict[str, int]]:
    """``ROWS, COLS, ELEMENTS`` of every row chunk of ``k`` (:meth:`Device._vector_tiles`)."""
    rpt = max(1, k.rows_per_tile)
    cols = k.outputs[0].cols if k.outputs else 1
    e = k.inputs[0].elem_bytes if k.inputs else 2
    out = []
    for r0 in range(0, k.rows, rpt):
        rows = min(k.rows, r0 + rpt) - r0
        out.append({"ROWS": rows, "COLS": cols, "ELEMENTS": k.elements * rows // k.rows,
                    "E": e})
    return out


def gemm_passes(device_or_spec: Any, precision: str, batch: int, m: int, n: int, k: int,
                elem_bytes: int, out_bytes: int) -> tuple[int, int, int, int]:
    """(passes, cycles per pass, L1 bytes read by the array, MAC slots) of one GEMM tile
    ``batch x [m, k] @ [k, n]`` on the device's array: the device's own geometry rule
    (:meth:`Device._gemm_geometry`, built on :mod:`~wia_hw.emulator.cycles`)."""
    spec = getattr(device_or_spec, "spec", device_or_spec)
    a = spec.compute.array
    g = Device._gemm_geometry(a.dataflow, a.rows, a.cols, a.rate(precision), batch, m, n, k,
                              elem_bytes, out_bytes, last=False)
    return g[0], g[1], g[2], g[3]


def _partition(tiles: Sequence[Tile], groups: Sequence[int], cores: int) -> list[list[Tile]]:
    """Contiguous runs of whole groups, one run per core: a group goes to the core whose
    equal share of the tile count holds the group's midpoint."""
    starts = list(groups) or list(range(len(tiles)))
    bounds = starts[1:] + [len(tiles)]
    total = len(tiles)
    out: list[list[Tile]] = [[] for _ in range(cores)]
    done = 0
    for a, b in zip(starts, bounds, strict=True):
        core = min(cores - 1, (2 * done + (b - a)) * cores // (2 * total))
        out[core].extend(tiles[a:b])
        done += b - a
    return out


def _tiled(dev: Device, k: TiledKernel, out: list[KernelRecord]) -> Iterator[simpy.Event]:
    env = dev.env
    start = dev.now
    before = dev.counters.copy()
    factor = dev.thermal.frequency_factor
    cores = dev.spec.compute.cores
    shares = _partition(k.tiles, k.groups, cores)
    ctl = dev.spec.compute.control
    busy = [0] * cores
    procs = []
    for c, share in enumerate(shares):
        if not share:
            continue
        procs.append(env.process(dev._core(c, share, k, factor, busy)))  # type: ignore[arg-type]
        passes = [t.passes for t in share]
        dev.counters.instructions += (ctl.instructions_per_kernel
                                      + ctl.instructions_per_tile * len(share)
                                      + ctl.instructions_per_pass * sum(passes))
        pred = dev.predictors[c]
        br, mp = pred.run("tiles", len(share))
        dev.counters.branches += br
        dev.counters.branch_mispredicts += mp
        run_start = 0
        for idx in range(1, len(passes) + 1):        # runs of equal pass counts
            if idx == len(passes) or passes[idx] != passes[run_start]:
                if passes[run_start]:
                    br, mp = pred.run("passes", passes[run_start], idx - run_start)
                    dev.counters.branches += br
                    dev.counters.branch_mispredicts += mp
                run_start = idx
    if procs:
        yield env.all_of(procs)
    end = dev.now
    elapsed = end - start
    c_ = dev.counters
    for c, s in enumerate(shares):
        c_.stall_cycles["dependency"] += elapsed - busy[c] if s else 0
    c_.cycles += elapsed
    c_.macs += k.macs
    c_.macs_by_precision[k.precision] = c_.macs_by_precision.get(k.precision, 0) + k.macs
    c_.array_flops += k.flops - k.vector_flops
    c_.vector_flops += k.vector_flops
    c_.flops += k.flops
    c_.busy_cycles += sum(t.array_cycles for t in k.tiles)
    delta = c_.delta(before)
    power = _energy(dev, elapsed, delta, k.array, k.energy_pj)
    out.append(_record(dev, k, start, end, before, power,
                       slot=sum(t.slot_macs for t in k.tiles), tiles=len(k.tiles),
                       used=sum(1 for s in shares if s), busy=busy, factor=factor))


def _energy(dev: Device, cycles: int, delta: Counters, array: bool, extra_pj: float) -> float:
    """Account the interval's energy (the device's rule), minus what an extension unit did
    in place of the array or vector unit, plus the unit's own ``extra_pj``; returns W."""
    charged = delta.copy()
    if not array:
        charged.macs_by_precision = {}
        charged.vector_flops = 0
    power = dev._account_energy(cycles, charged)
    if extra_pj:
        dev.counters.energy_pj += extra_pj
        seconds = cycles / dev.spec.clock_hz
        if seconds > 0:
            power += extra_pj * 1e-12 / seconds
    return power


def _record(dev: Device, k: Any, start: int, end: int, before: Counters, power: float, *,
            slot: int, tiles: int, used: int, busy: list[int], factor: float,
            extra: Mapping[str, Any] | None = None) -> ExtensionKernelRecord:
    return ExtensionKernelRecord(
        name=k.name, op=k.op, group=k.group, kind=k.record_kind, provider=k.provider,
        precision=k.precision, start_cycle=start, end_cycle=end,
        counters=dev.counters.delta(before), flops=k.flops, macs=k.macs, slot_macs=slot,
        tiles=tiles, cores_used=used, compulsory_bytes=k.compulsory_bytes,
        frequency_factor=factor, temperature_c=dev.thermal.temperature_c, power_w=power,
        core_busy_cycles=busy, extra=dict(k.extra if extra is None else extra))


def _coherence(dev: Device, k: MemoryKernel, now: int) -> int:
    """Write back dirty cached blocks of the PIM kernel's tensors; drop the written ones
    from every cache. Returns the cycle the write-backs end."""
    mem = dev.memory
    hbm = [0] * len(mem.channels)
    drop = set()
    for ref in k.reads + k.writes:
        for key, _nb in mem.region_blocks([(ref, 0, ref.rows, 0, ref.cols)]):
            ent = mem.l2.get(key)
            if ent is not None and ent[1]:
                hbm[mem._channel(key)] += ent[0]
                dev.counters.bytes["l2"] += ent[0]
                dev.counters.bytes["hbm"] += ent[0]
                ent[1] = 0
    for ref in k.writes:
        drop.update(key for key, _ in mem.region_blocks([(ref, 0, ref.rows, 0, ref.cols)]))
    for key in drop:
        ent = mem.l2.pop(key, None)
        if ent is not None:
            mem.l2_used -= ent[0]
        for core, l1 in enumerate(mem.l1):
            nb = l1.pop(key, None)
            if nb is not None:
                mem.l1_used[core] -= nb
    return mem._hbm_transfer(now, hbm) if any(hbm) else now


def _in_memory(dev: Device, k: MemoryKernel, out: list[KernelRecord]) -> Iterator[simpy.Event]:
    env = dev.env
    start = dev.now
    before = dev.counters.copy()
    factor = dev.thermal.frequency_factor
    ready = _coherence(dev, k, start)
    # the PIM units run at the memory's clock: throttling of the NPU does not slow them
    end = ready + k.cycles
    for ch in dev.memory.channels:     # the banks are busy: nothing else uses HBM meanwhile
        ch.free_at = max(ch.free_at, end)
    if end > env.now:
        yield env.timeout(end - env.now)
    elapsed = end - start
    c_ = dev.counters
    c_.cycles += elapsed
    c_.instructions += k.commands
    c_.flops += k.flops
    c_.vector_flops += k.flops
    cores = dev.spec.compute.cores
    c_.stall_cycles["dependency"] += cores * elapsed     # the cores wait for the memory
    delta = c_.delta(before)
    power = _energy(dev, elapsed, delta, False, k.energy_pj)
    extra = dict(k.extra)
    if "npu_cycles_estimate" in extra:          # what running it on the cores would take
        extra["saved_cycles"] = extra["npu_cycles_estimate"] - elapsed
    if "npu_hbm_bytes_estimate" in extra:
        extra["saved_hbm_bytes"] = extra["npu_hbm_bytes_estimate"] - delta.bytes["hbm"]
    if dev.trace is not None:
        from .device import TraceEvent

        dev.trace.append(TraceEvent("compute", "pim", ready, end, k.name))
    out.append(_record(dev, k, start, end, before, power, slot=0, tiles=1, used=0,
                       busy=[0] * cores, factor=factor, extra=extra))


def execute_kernel(device: Device, kernel: TiledKernel | MemoryKernel) -> KernelRecord:
    """Run one extension kernel to completion on ``device``; returns its record."""
    out: list[KernelRecord] = []
    gen = _tiled(device, kernel, out) if isinstance(kernel, TiledKernel) \
        else _in_memory(device, kernel, out)
    proc = device.env.process(gen)
    device.env.run(until=proc)
    return out[0]


def execute_kernels(device: Device, kernels: Sequence[Any]) -> list[KernelRecord]:
    """Run kernels in order: extension kernels through their ``execute_on``, built-in
    ones through :meth:`Device.execute`."""
    out: list[KernelRecord] = []
    for k in kernels:
        run = getattr(k, "execute_on", None)
        out.extend(run(device) if run is not None else device.execute([k]))
    return out


def extension_summary(records: Sequence[KernelRecord]) -> dict[str, dict[str, float]]:
    """Per provider other than ``builtin``: ``kernels``, ``cycles`` and the sum of every
    numeric figure its kernels report (``saved_hbm_bytes``, ``saved_cycles``, ...)."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        if r.provider == "builtin":
            continue
        d = out.setdefault(r.provider, {"kernels": 0, "cycles": 0})
        d["kernels"] += 1
        d["cycles"] += r.cycles
        for name, v in getattr(r, "extra", {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                d[name] = d.get(name, 0) + v
    return out
