"""The device configuration tree: frozen dataclasses, one per subsystem.

Loaded from versioned YAML (``schema_version: 1``) by :func:`wia_hw.load_spec`; each
class validates itself in ``__post_init__`` and raises :class:`SpecError` naming the
field (the loader adds the file and line). Derived figures (peak FLOPS, bytes per
cycle) are properties, never stored twice. The same tree feeds the emulator, the RTL
parameters and the docs.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .counters import LEVELS, PRECISIONS
from .cycles import DATAFLOWS
from .errors import SpecError

__all__ = [
    "SCHEMA_VERSION",
    "METADATA_FIELDS",
    "TILE_SCHEDULES",
    "ArrayConfig",
    "VectorConfig",
    "ControlConfig",
    "ComputeConfig",
    "CacheConfig",
    "HBMConfig",
    "MemoryConfig",
    "DMAConfig",
    "EnergyConfig",
    "ThermalConfig",
    "DeviceSpec",
    "LinkConfig",
    "ClusterSpec",
    "from_mapping",
    "to_mapping",
]

SCHEMA_VERSION = 1

#: Spec fields that are metadata: they name or describe a device and change no result
#: of a run. Every other leaf field of a shipped spec changes some output of a run when
#: it is perturbed (``tests/test_spec_fields.py`` checks this), or it is dead.
METADATA_FIELDS = frozenset({"schema_version", "name", "description"})
#: How a kernel's tiles are dealt to the cores (:class:`ComputeConfig`).
TILE_SCHEDULES = ("contiguous", "round_robin")
_RATES = (0.125, 0.25, 0.5, 1, 2, 4, 8)


#: The largest figure any spec field may hold (a count, size, rate, energy or time in
#: its field's unit): a value past it is a typo or a hostile file, and reports built on
#: it (a 300-digit latency, a clock whose cycle counts overflow) would be no answer.
MAX_FIGURE = 10**12


_FIGURE_WHY = "the largest figure a spec field may hold"


def _pos_int(obj: Any, name: str, most: float = MAX_FIGURE, why: str = _FIGURE_WHY) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(f"must be a positive integer, got {_show(v)}", field=name)
    _at_most(obj, name, most, why)


def _nonneg_int(obj: Any, name: str) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SpecError(f"must be a non-negative integer, got {_show(v)}", field=name)
    _at_most(obj, name, MAX_FIGURE, _FIGURE_WHY)


#: The most cores and HBM channels one device may have: the emulator keeps state per
#: core and per channel, and a value past this (a typo, a hostile file) would take the
#: machine's memory instead of giving an answer.
MAX_UNITS = 4096
#: The longest side (rows or columns) of a systolic array: 16x the largest built
#: (TPU v1's 256), and the RTL's cycle functions hold for any side.
MAX_ARRAY_SIDE = 4096
#: The hottest temperature the thermal model takes (°C), far above any die's failure.
MAX_TEMPERATURE_C = 1000.0
#: The least bandwidth (GB/s, 1 kB/s) a port may have: below it a transfer's cycles
#: outgrow a float.
MIN_BANDWIDTH_GBS = 1e-6
#: The slowest clock a device may have (1 kHz): below it times outgrow a float.
MIN_CLOCK_GHZ = 1e-6
#: The fastest clock a device may have (GHz).
MAX_CLOCK_GHZ = 1000


def _show(v: Any) -> str:
    """``repr(v)`` for an error message; an integer too long to read (the Python API
    takes any ``int``: ``10**400``) by its size instead, which ``repr`` may refuse."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**30:
        digits = int(abs(v).bit_length() * math.log10(2)) + 1
        return f"{'a negative' if v < 0 else 'an'} integer of about {digits:,} digits"
    try:
        return repr(v)
    except ValueError:  # an int past Python's str conversion limit inside a container
        return f"a {type(v).__name__} too large to show"


def _at_most(obj: Any, name: str, most: int, why: str) -> None:
    v = getattr(obj, name)
    if v > most:
        raise SpecError(f"must be at most {most:,} ({why}), got {_show(v)}", field=name)


def _spec_name(v: Any) -> None:
    """A spec's ``name``: printed in every report header, so printable text (no control
    characters: a terminal escape in a file would reach the user's terminal)."""
    if not isinstance(v, str) or not v.strip():
        raise SpecError(f"must be a non-empty string, got {_show(v)}", field="name")
    if not v.isprintable():
        raise SpecError(
            f"must be printable text without control characters, got {_show(v)}", field="name"
        )


def _pos_num(obj: Any, name: str) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == math.inf:
        raise SpecError(f"must be a positive number, got {_show(v)}", field=name)
    _at_most(obj, name, MAX_FIGURE, _FIGURE_WHY)


def _bandwidth(obj: Any, name: str) -> None:
    _pos_num(obj, name)
    if getattr(obj, name) < MIN_BANDWIDTH_GBS:
        raise SpecError(
            f"must be at least {MIN_BANDWIDTH_GBS:g} GB/s, got {_show(getattr(obj, name))}",
            field=name,
        )


def _nonneg_num(obj: Any, name: str) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == math.inf:
        raise SpecError(f"must be a non-negative number, got {_show(v)}", field=name)
    _at_most(obj, name, MAX_FIGURE, _FIGURE_WHY)


def _pow2(obj: Any, name: str) -> None:
    v = getattr(obj, name)
    if v & (v - 1):
        raise SpecError(f"must be a power of two, got {v}", field=name)


def _per_key(obj: Any, name: str, keys: tuple[str, ...], check: str) -> None:
    m = getattr(obj, name)
    if not isinstance(m, Mapping):
        raise SpecError(f"must be a mapping of {', '.join(keys)}, got {_show(m)}", field=name)
    for k, v in m.items():
        if k not in keys:
            raise SpecError(f"unknown key {k!r} (known: {', '.join(keys)})", field=f"{name}.{k}")
        if check == "rate":
            if isinstance(v, bool) or v not in _RATES:
                raise SpecError(
                    f"must be one of {', '.join(map(str, _RATES))}, got {_show(v)}",
                    field=f"{name}.{k}",
                )
        elif (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not 0 <= v <= MAX_FIGURE  # NaN fails too
        ):
            raise SpecError(
                f"must be a non-negative number at most {MAX_FIGURE:,}, got {_show(v)}",
                field=f"{name}.{k}",
            )
    missing = [k for k in keys if k not in m]
    if missing and check == "energy":
        raise SpecError(f"missing {', '.join(missing)}", field=name)
    object.__setattr__(obj, name, types.MappingProxyType(dict(m)))


@dataclass(frozen=True, kw_only=True)
class ArrayConfig:
    """One systolic array per core: ``rows`` x ``cols`` PEs in dataflow ``os`` or ``ws``.

    ``macs_per_pe_cycle`` maps each supported precision to the MACs one PE performs per
    cycle (``0.25`` means one MAC every four cycles). A precision not listed is not
    supported by the array.

    ``pipelined``: the array has double-buffered accumulators (``os``) or weight
    registers (``ws``), so it accepts the next pass while the previous one drains, also
    across tile boundaries; the spacing of acceptances is
    :func:`~wia_hw.emulator.cycles.systolic_issue_interval`. ``False`` (the default for
    a user spec: the extra buffers are hardware the spec must claim, and an existing
    spec's results must not change under it) makes every pass pay its whole
    :func:`~wia_hw.emulator.cycles.systolic_tile_cycles`, fill and drain included.
    """

    rows: int
    cols: int
    dataflow: str = "os"
    macs_per_pe_cycle: Mapping[str, float] = field(
        default_factory=lambda: {"fp32": 0.25, "fp16": 1, "bf16": 1, "int8": 2}
    )
    pipelined: bool = False

    def __post_init__(self) -> None:
        for side in ("rows", "cols"):
            _pos_int(self, side, MAX_ARRAY_SIDE, "the largest array side modelled")
        if not isinstance(self.pipelined, bool):
            raise SpecError(f"must be true or false, got {self.pipelined!r}", field="pipelined")
        if self.dataflow not in DATAFLOWS:
            raise SpecError(
                f"must be one of {', '.join(DATAFLOWS)}, got {self.dataflow!r}", field="dataflow"
            )
        _per_key(self, "macs_per_pe_cycle", PRECISIONS, "rate")
        if not self.macs_per_pe_cycle:
            raise SpecError("must list at least one precision", field="macs_per_pe_cycle")

    def rate(self, precision: str) -> Fraction:
        if precision not in self.macs_per_pe_cycle:
            raise SpecError(
                f"the array does not support {precision!r} (supported: "
                f"{', '.join(self.macs_per_pe_cycle)})",
                field="macs_per_pe_cycle",
            )
        return Fraction(self.macs_per_pe_cycle[precision]).limit_denominator(64)


#: Vector-unit cycles per element issue for each op class (defaults).
DEFAULT_VECTOR_CYCLES = {
    "elementwise": 1,
    "activation": 4,
    "softmax": 6,
    "layer_norm": 5,
    "pool": 2,
    "copy": 1,
    "gather": 1,
}


@dataclass(frozen=True, kw_only=True)
class VectorConfig:
    """The vector unit of a core: ``lanes`` values per issue, per-op-class issue cost."""

    lanes: int
    pipeline_depth: int = 8
    cycles_per_element: Mapping[str, float] = field(
        default_factory=lambda: dict(DEFAULT_VECTOR_CYCLES)
    )

    def __post_init__(self) -> None:
        _pos_int(self, "lanes")
        _nonneg_int(self, "pipeline_depth")
        merged = dict(DEFAULT_VECTOR_CYCLES)
        merged.update(self.cycles_per_element)
        object.__setattr__(self, "cycles_per_element", merged)
        _per_key(self, "cycles_per_element", tuple(DEFAULT_VECTOR_CYCLES), "num")
        for k, v in self.cycles_per_element.items():
            if isinstance(v, float) and not v.is_integer() or v < 1:
                raise SpecError(
                    f"must be a positive integer, got {_show(v)}", field=f"cycles_per_element.{k}"
                )
        # integral floats (``6.0``) are kept as integers: cycles are integers
        merged = {k: int(v) for k, v in self.cycles_per_element.items()}
        object.__setattr__(self, "cycles_per_element", types.MappingProxyType(merged))


@dataclass(frozen=True, kw_only=True)
class ControlConfig:
    """The control core that issues the tile program.

    ``instructions_per_tile``: instructions to set up one tile (DMA descriptors, waits,
    address arithmetic); ``instructions_per_pass``: per array pass (issue + loop);
    ``predictor``: branch predictor of the loop branches (``2bit`` saturating counters,
    or ``static_taken``).

    ``launch_overhead_ns``: fixed time from a kernel's launch to its first tile, paid
    once per kernel with every core idle (counted as ``launch`` stall cycles): the host
    driver, the command queue and the grid set-up of an accelerator driven kernel by
    kernel from a host, as GPUs are. ``0`` (the default) for a device whose control
    core runs the whole graph's program without the host.
    """

    instructions_per_kernel: int = 16
    instructions_per_tile: int = 6
    instructions_per_pass: int = 2
    predictor: str = "2bit"
    launch_overhead_ns: float = 0.0

    def __post_init__(self) -> None:
        for n in ("instructions_per_kernel", "instructions_per_tile", "instructions_per_pass"):
            _nonneg_int(self, n)
        _nonneg_num(self, "launch_overhead_ns")
        if self.predictor not in ("2bit", "static_taken"):
            raise SpecError(
                f"must be 2bit or static_taken, got {self.predictor!r}", field="predictor"
            )


@dataclass(frozen=True, kw_only=True)
class ComputeConfig:
    """``cores`` cores, each with ``arrays_per_core`` identical systolic arrays
    (``array``), one vector unit and one control core.

    The arrays of a core share its L1 port and work on one tile at a time: the tile's
    array passes are dealt to them in rounds of ``arrays_per_core`` (an A100 SM's four
    tensor cores on one thread block's tile, in LLMCompass's abstraction), so a tile of
    ``p`` passes takes ``ceil(p / arrays_per_core)`` pass times, and the arrays left
    without a pass in the last round are mapping loss.

    ``tile_schedule``: how a kernel's tiles are dealt to the cores. ``contiguous`` (the
    default: a compiler's static split) gives each core one run of consecutive tiles;
    ``round_robin`` (a GPU's thread-block scheduler) deals them in turn, a GEMM's
    output tile with all its K slices at a time, so the tiles the cores run together are
    neighbours and meet in L2 on their shared A and B panels.
    """

    cores: int
    array: ArrayConfig
    vector: VectorConfig
    control: ControlConfig = field(default_factory=ControlConfig)
    arrays_per_core: int = 1
    tile_schedule: str = "contiguous"

    def __post_init__(self) -> None:
        _pos_int(self, "cores", MAX_UNITS, "the emulator keeps state per core")
        _pos_int(self, "arrays_per_core", MAX_UNITS, "the emulator keeps state per array")
        if self.tile_schedule not in TILE_SCHEDULES:
            raise SpecError(
                f"must be one of {', '.join(TILE_SCHEDULES)}, got {self.tile_schedule!r}",
                field="tile_schedule",
            )


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """An on-chip SRAM level: ``size_kib``, port ``bandwidth_gbs``, ``latency_cycles``.

    L1 is per core (a software-managed scratchpad modelled as an LRU cache of blocks);
    L2 is shared by all cores.
    """

    size_kib: int
    bandwidth_gbs: float
    latency_cycles: int = 1

    def __post_init__(self) -> None:
        _pos_int(self, "size_kib")
        _bandwidth(self, "bandwidth_gbs")
        _nonneg_int(self, "latency_cycles")

    @property
    def size_bytes(self) -> int:
        return self.size_kib * 1024


#: Default HBM interleave granularity: 64 B, one HBM2 request. DRAMsim3's HBM2 model
#: (umd-memsys/DRAMsim3 ``configs/HBM2_8Gb_x128.ini``: ``bus_width = 128``, ``BL = 4``)
#: moves ``128 / 8 * 4 = 64`` bytes per request, and Ramulator's default address mapping
#: ``RoBaRaCoCh`` (CMU-SAFARI/ramulator, ``Memory.h``) puts the channel bits right above
#: the request offset, so consecutive requests go to consecutive channels. Fine-grain
#: interleaving is what keeps many channels busy on one stream (Cabarcas et al.,
#: "Interleaving Granularity on High Bandwidth Memory Architecture for CMPs", SAMOS
#: 2010: up to 50% loss with coarse granularity). Coarser maps (DRAMsim3's HBM2 file
#: uses ``rorabgbachco``: 1 KiB, one row per channel) favour row-buffer hits, which this
#: model does not represent; set ``interleave_bytes`` to study them.
DEFAULT_INTERLEAVE_BYTES = 64


@dataclass(frozen=True, kw_only=True)
class HBMConfig:
    """Off-chip memory: ``size_gib``, aggregate ``bandwidth_gbs`` over ``channels``.

    Physical addresses are interleaved over the channels in units of
    ``interleave_bytes`` (a power of two; see :func:`~wia_hw.emulator.memory.channel_of`);
    each channel moves ``bandwidth_gbs / channels``. ``latency_ns``: from the last byte
    of a transfer leaving its channel to the data being usable.

    ``refresh_interval_ns`` (tREFI) and ``refresh_cycle_ns`` (tRFC): DRAM refresh. Every
    tREFI each channel is blocked for tRFC (all-bank refresh), so a channel moves
    ``1 - tRFC / tREFI`` of its nominal rate: the emulator's channels run at that rate
    (both in whole cycles; a tREFI shorter than 1024 cycles is stretched to 1024 with
    tRFC in proportion, see :func:`~wia_hw.emulator.memory.refresh_windows`), the
    refresh's mean cost, which keeps a kernel's time
    independent of where on the timeline it runs (cached and replayed timings stay
    exact). The windows themselves, where a transfer that meets one pauses until its
    end, are the benchmark's ``dram_refresh`` variation source (run-to-run variation).
    The defaults are
    HBM2's, as DRAMsim3 has them for an 8 Gb x128 die (umd-memsys/DRAMsim3
    ``configs/HBM2_8Gb_x128.ini``: ``tCK = 1`` ns, ``tREFI = 3900``, ``tRFC = 260``
    cycles). DDR3 (JESD79-3) has tREFI 7.8 us and tRFC 160/260/350 ns for 2/4/8 Gb
    dies. Both 0: refresh is not modelled (a channel streams at its nominal rate).
    """

    size_gib: float
    bandwidth_gbs: float
    channels: int
    latency_ns: float = 100.0
    interleave_bytes: int = DEFAULT_INTERLEAVE_BYTES
    refresh_interval_ns: float = 3900.0
    refresh_cycle_ns: float = 260.0

    def __post_init__(self) -> None:
        _pos_num(self, "size_gib")
        _bandwidth(self, "bandwidth_gbs")
        _pos_int(self, "channels", MAX_UNITS, "the emulator keeps state per channel")
        _nonneg_num(self, "latency_ns")
        _pos_int(self, "interleave_bytes")
        _pow2(self, "interleave_bytes")
        _nonneg_num(self, "refresh_interval_ns")
        _nonneg_num(self, "refresh_cycle_ns")
        if (self.refresh_interval_ns > 0) != (self.refresh_cycle_ns > 0):
            raise SpecError(
                "refresh_interval_ns and refresh_cycle_ns are set together (both 0: no "
                f"refresh), got {self.refresh_interval_ns} and {self.refresh_cycle_ns}",
                field="refresh_cycle_ns",
            )
        if self.refresh_cycle_ns >= self.refresh_interval_ns > 0:
            raise SpecError(
                f"must be below refresh_interval_ns ({self.refresh_interval_ns}), "
                f"got {self.refresh_cycle_ns}",
                field="refresh_cycle_ns",
            )

    @property
    def size_bytes(self) -> int:
        return int(self.size_gib * (1 << 30))


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """The hierarchy. ``block_bytes`` is the granularity of the LRU model: tensors are
    stored in a tiled layout of blocks of that size, and a block is what hits or misses.

    ``host_io``: where the host puts a run's inputs and takes its results. ``dram`` (the
    default): inputs start in HBM and the run ends by writing dirty L2 data back to HBM.
    ``l2``: the host writes the inputs into L2 over its own interface before the run (as
    far as they fit) and reads the results from L2, so neither crosses HBM; a TPU's host
    reads and writes its Unified Buffer over PCIe this way.

    ``eager_writeback``: the L2 controller writes dirty blocks back to HBM while the
    channels and the L2 port would otherwise idle (eager write-back, Lee, Tyson and
    Farrens, MICRO 2000), least recently used first, so that evicting them later costs
    nothing. After each kernel, the dirty blocks the kernel did not store are written
    back in the kernel's idle channel and L2-port time, as far as it reaches (see
    :meth:`~wia_hw.emulator.memory.MemorySystem.eager_writeback`). ``false``: dirty
    blocks are written back only when evicted (or at the end of a run).
    """

    l1: CacheConfig
    l2: CacheConfig
    hbm: HBMConfig
    block_bytes: int = 65536
    host_io: str = "dram"
    eager_writeback: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.eager_writeback, bool):
            raise SpecError(
                f"must be true or false, got {self.eager_writeback!r}", field="eager_writeback"
            )
        if self.host_io not in ("dram", "l2"):
            raise SpecError(f"must be dram or l2, got {self.host_io!r}", field="host_io")
        _pos_int(self, "block_bytes")
        _pow2(self, "block_bytes")
        if self.block_bytes > self.l1.size_bytes // 4:
            raise SpecError(
                f"must be at most a quarter of l1 ({self.l1.size_bytes // 4} "
                f"bytes), got {self.block_bytes}",
                field="block_bytes",
            )


@dataclass(frozen=True, kw_only=True)
class DMAConfig:
    """The DMA engines of a core.

    ``engines_per_core``: how many transfers a core has in flight at once; an engine is
    held from a transfer's issue to its completion. A core issues two in-order streams,
    its operand loads and its result stores: with one engine they take turns, with two
    or more a result drains while the next operands load (more than ``loads_in_flight``
    + 1 change nothing). ``loads_in_flight``: how many of the operand loads may be in
    flight at once (each on an engine): with 1 a load issues when the previous one has
    completed, so the memory's latency and the set-up fall between every two; with 2
    the next tile's operands are asked for while the current tile's still arrive (a
    prefetching fetcher, such as a FIFO-fed weight fetcher), and they queue behind them
    at the memory. A load still waits for its operand buffer (double-buffered: the
    tile two back must be done, so more than 2 change nothing). ``setup_cycles``: the
    fixed cost of one descriptor, added to every transfer's completion (and to the
    engine's busy time).
    """

    engines_per_core: int = 1
    loads_in_flight: int = 1
    setup_cycles: int = 32

    def __post_init__(self) -> None:
        _pos_int(self, "engines_per_core")
        _pos_int(self, "loads_in_flight")
        _nonneg_int(self, "setup_cycles")


@dataclass(frozen=True, kw_only=True)
class EnergyConfig:
    """Energy per MAC by precision (pJ), per byte moved at each level (pJ), per vector
    element op (pJ), and the coefficients of static power (mW).

    ``pj_per_mac`` lists exactly the precisions the array supports (checked by
    :class:`DeviceSpec`: an energy for a precision the array lacks would change nothing).

    Static power is derived, never stated (:attr:`DeviceSpec.static_power_w`): the
    power the device draws whether or not it works, charged over every cycle of a run.
    ``static_mw_per_pe``: leakage of one PE's datapath (multiplier and accumulator
    adder); ``static_mw_per_mib_sram``: leakage of one MiB of on-chip SRAM (every
    core's L1 and the L2); ``static_mw_per_hbm_channel``: background (standby) and
    refresh power of one off-chip DRAM channel with its dies. Dynamic energy (per MAC,
    byte, vector op) is not part of it. The defaults are ``wia-npu``'s figures (see
    ``specs/wia-npu.yaml`` and ``docs/POWER.md`` for their sources).
    """

    pj_per_mac: Mapping[str, float]
    pj_per_byte: Mapping[str, float]
    pj_per_vector_op: float = 0.5
    static_mw_per_pe: float = 0.0201
    static_mw_per_mib_sram: float = 264.4
    static_mw_per_hbm_channel: float = 63.6

    def __post_init__(self) -> None:
        _per_key(self, "pj_per_mac", PRECISIONS, "num")
        _per_key(self, "pj_per_byte", LEVELS, "energy")
        _nonneg_num(self, "pj_per_vector_op")
        _nonneg_num(self, "static_mw_per_pe")
        _nonneg_num(self, "static_mw_per_mib_sram")
        _nonneg_num(self, "static_mw_per_hbm_channel")


#: 0 K in degrees Celsius: no temperature of the thermal model is below it
ABSOLUTE_ZERO_C = -273.15


@dataclass(frozen=True, kw_only=True)
class ThermalConfig:
    """A one-node RC thermal model with throttling.

    ``dT/dt = (P - (T - ambient_c) / resistance_c_per_w) / capacitance_j_per_c``. Above
    ``throttle_c`` the clock runs at ``throttle_factor`` of nominal until the die cools.
    """

    ambient_c: float = 25.0
    resistance_c_per_w: float = 0.15
    capacitance_j_per_c: float = 20.0
    throttle_c: float = 95.0
    throttle_factor: float = 0.75
    initial_c: float | None = None

    def __post_init__(self) -> None:
        for name in ("ambient_c", "throttle_c", "initial_c"):
            v = getattr(self, name)
            if v is None and name == "initial_c":
                continue
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or isinstance(v, float)
                and not math.isfinite(v)
            ):
                raise SpecError(f"must be a temperature in °C, got {_show(v)}", field=name)
            if v < ABSOLUTE_ZERO_C:
                raise SpecError(
                    f"must be at least absolute zero ({ABSOLUTE_ZERO_C} °C), got {_show(v)}",
                    field=name,
                )
            if v > MAX_TEMPERATURE_C:
                raise SpecError(
                    f"must be at most {MAX_TEMPERATURE_C:g} °C (far above any die's "
                    f"failure), got {_show(v)}",
                    field=name,
                )
        _pos_num(self, "resistance_c_per_w")
        _pos_num(self, "capacitance_j_per_c")
        if not 0 < self.throttle_factor <= 1:
            raise SpecError(
                f"must be in (0, 1], got {_show(self.throttle_factor)}", field="throttle_factor"
            )
        if self.throttle_c <= self.ambient_c:
            raise SpecError(
                f"must be above ambient_c ({self.ambient_c}), got {self.throttle_c}",
                field="throttle_c",
            )


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """A whole NPU. Peak figures are derived: see :meth:`peak_flops`."""

    schema_version: int
    name: str
    clock_ghz: float
    compute: ComputeConfig
    memory: MemoryConfig
    energy: EnergyConfig
    thermal: ThermalConfig = field(default_factory=ThermalConfig)
    dma: DMAConfig = field(default_factory=DMAConfig)
    description: str = ""

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise SpecError(
                f"unsupported schema_version {self.schema_version!r} "
                f"(this wia-hw reads {SCHEMA_VERSION})",
                field="schema_version",
            )
        _spec_name(self.name)
        _pos_num(self, "clock_ghz")
        if self.clock_ghz < MIN_CLOCK_GHZ:
            raise SpecError(
                f"must be at least {MIN_CLOCK_GHZ:g} GHz (1 kHz), got {_show(self.clock_ghz)}",
                field="clock_ghz",
            )
        _at_most(self, "clock_ghz", MAX_CLOCK_GHZ, "1 THz, past any digital clock")
        supported, mac_pj = self.compute.array.macs_per_pe_cycle, self.energy.pj_per_mac
        missing = [p for p in supported if p not in mac_pj]
        if missing:
            raise SpecError(
                f"missing {', '.join(missing)} (the array supports "
                f"{'it' if len(missing) == 1 else 'them'})",
                field="energy.pj_per_mac",
            )
        for p in mac_pj:
            if p not in supported:
                raise SpecError(
                    f"the array does not support {p} (supported: "
                    f"{', '.join(supported)}): its energy would never be used",
                    field=f"energy.pj_per_mac.{p}",
                )

    @property
    def clock_hz(self) -> float:
        return self.clock_ghz * 1e9

    @property
    def pes(self) -> int:
        c = self.compute
        return c.cores * c.arrays_per_core * c.array.rows * c.array.cols

    def supports(self, precision: str) -> bool:
        return precision in self.compute.array.macs_per_pe_cycle

    def peak_macs_per_cycle(self, precision: str) -> Fraction:
        return self.pes * self.compute.array.rate(precision)

    def peak_flops(self, precision: str = "fp16") -> float:
        """cores x arrays per core x rows x cols x MACs/PE/cycle x 2 FLOP/MAC x clock."""
        return float(2 * self.peak_macs_per_cycle(precision)) * self.clock_hz

    def blended_peak_flops(self, flops_by_precision: Mapping[str, float]) -> float:
        """The array's peak over a mix of work at several precisions: the work over the
        time each part takes at its own precision's peak (a weighted harmonic mean), so
        ``work / blended_peak_flops`` is the sum of the parts' ideal times and a run of
        the mix is never above 100% of it. Equal to :meth:`peak_flops` for one
        precision; 0 when some part's precision is not supported (it has no peak)."""
        return blended_peak(
            flops_by_precision, lambda p: self.peak_flops(p) if self.supports(p) else 0.0
        )

    @property
    def peak_bandwidth_gbs(self) -> float:
        return self.memory.hbm.bandwidth_gbs

    @property
    def sram_mib(self) -> float:
        """On-chip SRAM in MiB: every core's L1 plus the shared L2."""
        m = self.memory
        return (self.compute.cores * m.l1.size_kib + m.l2.size_kib) / 1024

    @property
    def static_power_breakdown_w(self) -> dict[str, float]:
        """Static power by source, in W: ``pe`` (PEs x ``static_mw_per_pe``), ``sram``
        (:attr:`sram_mib` x ``static_mw_per_mib_sram``) and ``hbm`` (HBM channels x
        ``static_mw_per_hbm_channel``). Each term grows with its resource, so more
        cores, PEs, SRAM or channels never lower static power."""
        en = self.energy
        return {
            "pe": self.pes * en.static_mw_per_pe * 1e-3,
            "sram": self.sram_mib * en.static_mw_per_mib_sram * 1e-3,
            "hbm": self.memory.hbm.channels * en.static_mw_per_hbm_channel * 1e-3,
        }

    @property
    def static_power_w(self) -> float:
        """The device's static power in W: the sum of :attr:`static_power_breakdown_w`.
        Charged over every cycle of a run (energy) and fed to the thermal model."""
        return sum(self.static_power_breakdown_w.values())

    def bytes_per_cycle(self, bandwidth_gbs: float) -> Fraction:
        """A bandwidth in GB/s (1e9 B/s) as an exact fraction of bytes per device cycle."""
        return Fraction(str(bandwidth_gbs)) / Fraction(str(self.clock_ghz))

    def cycles_to_ms(self, cycles: int | float) -> float:
        return cycles / self.clock_hz * 1e3


@dataclass(frozen=True, kw_only=True)
class LinkConfig:
    """Device-to-device links (see ``docs/COMMUNICATION.md``).

    ``bandwidth_gbs`` (GB/s, one direction of one link) and ``latency_us`` (per hop,
    microseconds) of every device link; ``topology``: ``ring``, ``fully_connected``,
    ``switch`` (every device on one switch whose fabric moves ``switch_bandwidth_gbs``
    in all, default devices x ``bandwidth_gbs``), ``torus2d`` (``torus_dims: [rows,
    cols]``, default the squarest factorisation), ``hierarchical`` (nodes of
    ``devices_per_node`` fully connected devices; device ``j`` of each node on a ring of
    the nodes' devices ``j`` with ``inter_node_bandwidth_gbs`` and
    ``inter_node_latency_us``) or ``custom`` (``edges: [[a, b], ...]``, bidirectional).
    The cluster checks that every link names a device and that the graph is connected.
    """

    bandwidth_gbs: float
    latency_us: float = 1.0
    topology: str = "ring"
    switch_bandwidth_gbs: float | None = None
    torus_dims: list[int] | None = None
    devices_per_node: int | None = None
    inter_node_bandwidth_gbs: float | None = None
    inter_node_latency_us: float | None = None
    edges: list[list[int]] | None = None

    def __post_init__(self) -> None:
        _bandwidth(self, "bandwidth_gbs")
        _nonneg_num(self, "latency_us")
        topologies = ("ring", "fully_connected", "switch", "torus2d", "hierarchical", "custom")
        if self.topology not in topologies:
            raise SpecError(
                f"must be one of {', '.join(topologies)}, got {self.topology!r}", field="topology"
            )
        owner = {
            "switch_bandwidth_gbs": "switch",
            "torus_dims": "torus2d",
            "devices_per_node": "hierarchical",
            "inter_node_bandwidth_gbs": "hierarchical",
            "inter_node_latency_us": "hierarchical",
            "edges": "custom",
        }
        for name, topo in owner.items():
            if getattr(self, name) is not None and self.topology != topo:
                raise SpecError(
                    f"only a {topo} topology takes it (topology is {self.topology})", field=name
                )
        if self.switch_bandwidth_gbs is not None:
            _bandwidth(self, "switch_bandwidth_gbs")
        if self.inter_node_latency_us is not None:
            _nonneg_num(self, "inter_node_latency_us")
        if self.topology == "hierarchical":
            for name in ("devices_per_node", "inter_node_bandwidth_gbs"):
                if getattr(self, name) is None:
                    raise SpecError("a hierarchical topology needs it", field=name)
            _pos_int(self, "devices_per_node")
            _bandwidth(self, "inter_node_bandwidth_gbs")
        if self.topology == "custom" and self.edges is None:
            raise SpecError("a custom topology needs its edges ([[a, b], ...])", field="edges")
        for name, n in (("torus_dims", 2), ("edges", None)):
            v = getattr(self, name)
            items = v if name == "torus_dims" else None
            if v is None:
                continue
            if not isinstance(v, list) or (n is not None and len(v) != n):
                raise SpecError(
                    f"must be a list{f' of {n} integers' if n else ''}, got {_show(v)}", field=name
                )
            if items is not None and not all(
                isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in items
            ):
                raise SpecError(f"must be positive integers, got {_show(v)}", field=name)
        for i, e in enumerate(self.edges or ()):
            if not (
                isinstance(e, list)
                and len(e) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in e)
            ):
                raise SpecError(
                    f"must be a pair of device indices [a, b], got {_show(e)}", field=f"edges[{i}]"
                )


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Several identical devices joined by links. The topology itself (devices exist,
    graph connected) is checked by :func:`emulator.cluster.build_topology`, which
    :func:`wia_hw.load_spec` and the communicator call."""

    schema_version: int
    name: str
    devices: int
    device: DeviceSpec
    links: LinkConfig
    description: str = ""

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise SpecError(
                f"unsupported schema_version {self.schema_version!r} "
                f"(this wia-hw reads {SCHEMA_VERSION})",
                field="schema_version",
            )
        _spec_name(self.name)
        _pos_int(self, "devices")
        if self.devices < 2:
            raise SpecError(
                f"a cluster needs at least 2 devices, got {self.devices}", field="devices"
            )


# -- generic mapping <-> dataclass ---------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(t: Any) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


def _check_type(value: Any, hint: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
        origin = typing.get_origin(hint)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"must be an integer, got {_show(value)}", field=path)
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"must be a number, got {_show(value)}", field=path)
    elif hint is str:
        if not isinstance(value, str):
            raise SpecError(f"must be a string, got {_show(value)}", field=path)
    elif origin in (Mapping, dict, typing.Mapping) or hint is Mapping:
        if not isinstance(value, Mapping):
            raise SpecError(f"must be a mapping, got {_show(value)}", field=path)
    return value


def from_mapping(cls: type, data: Any, path: str = "") -> Any:
    """Build dataclass ``cls`` from nested mappings, checking fields and types.

    Unknown fields, missing required fields and wrong types raise :class:`SpecError`
    whose ``field`` is the dotted path; ``__post_init__`` errors get the path prefixed.
    """
    if not isinstance(data, Mapping):
        raise SpecError(f"must be a mapping, got {_show(data)}", field=path or None)
    hints = _hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise SpecError(
                f"unknown field (known: {', '.join(known)})",
                field=f"{path}.{key}" if path else str(key),
            )
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        sub = f"{path}.{name}" if path else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SpecError("missing required field", field=sub)
            continue
        hint = hints[name]
        value = data[name]
        if _is_dataclass_type(hint):
            kwargs[name] = from_mapping(hint, value, sub)
        else:
            kwargs[name] = _check_type(value, hint, sub)
    try:
        return cls(**kwargs)
    except SpecError as e:
        raise e.located(field_prefix=path or None) from None


def to_mapping(obj: Any) -> dict[str, Any]:
    """The plain-dict form of a config dataclass (inverse of :func:`from_mapping`)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            out[f.name] = to_mapping(v)
        elif isinstance(v, Mapping):
            out[f.name] = dict(v)
        else:
            out[f.name] = v
    return out


def blended_peak(work: Mapping[str, float], peak: Callable[[str], float]) -> float:
    """The peak rate over a mix of ``work`` (per precision, in any unit) when each part
    runs at ``peak(precision)``: the work over the sum of the parts' ideal times (a
    weighted harmonic mean); the part's own peak for one part; 0 when a part has no peak.
    :meth:`DeviceSpec.blended_peak_flops` and the profiler's utilisation of a mix."""
    parts = {p: w for p, w in work.items() if w > 0}
    peaks = {p: peak(p) for p in parts}
    if not parts or not all(peaks.values()):
        return 0.0
    if len(parts) == 1:
        return next(iter(peaks.values()))
    return sum(parts.values()) / sum(w / peaks[p] for p, w in parts.items())
