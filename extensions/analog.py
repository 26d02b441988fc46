"""The analog extension: hybrid digital-analog matrix products on PCM crossbars (seed 8.9.3).

Seed::

    wia_analog_config_t analog_cfg = {.analog_precision_bits = 6,
        .digital_precision_bits = 8, .noise_compensation = true};
    wia_hybrid_matmul(ctx, &analog_cfg, A, B, C, stream);

Python: ``hybrid_matmul(ctx, AnalogConfig(...), A, B, C)``.

**Data path** of ``C = A @ B`` (``A`` is ``M x K`` activations, ``B`` ``K x N`` weights
held in crossbars of ``tile_size x tile_size`` PCM cells; the digital converters are
the front-end golden model of :mod:`wia_hw.emulator.frontend_model`):

1. *Digital*: each row of ``A`` is scaled by its ``max|.|`` to signed
   ``digital_precision_bits`` integers; each column of ``B`` by its ``max|.|`` to
   ``digital_precision_bits`` weights (the programming targets).
2. *DAC*: ``dac_quantize`` keeps the top ``dac_bits`` of each input (round half up,
   clamp): the analog domain's input resolution (default 7, aihwkit's).
3. *Crossbar*: a weight ``w`` in [-1, 1] is a differential pair ``G+ - G-`` of target
   conductances ``|w| g_max`` on one side, 0 on the other. The cells follow the PCM
   statistical model of Nandakumar et al. (ICECS 2019) in the form IBM's aihwkit uses
   (``PCMLikeNoiseModel``): programming noise ``sigma(g_T) = c0 + c1 g_T/g_max +
   c2 (g_T/g_max)**2`` with ``c = (0.26348, 1.9650, -1.1731)`` uS at ``g_max = 25`` uS;
   drift ``g(t) = g_prog (t / t0)**(-nu)``, ``t = t_inference + t0``, ``t0 = 20`` s, ``nu ~
   |N(mu(g), s(g))|`` with ``mu = clip(-0.0155 ln g_rel + 0.0244, 0.049, 0.1)``, ``s =
   clip(-0.0125 ln g_rel - 0.0059, 0.008, 0.045)``; read (1/f) noise ``g(t) Q_s
   sqrt(ln((t + t_read) / (2 t_read)))``, ``Q_s = min(0.0088 / g_rel**0.65, 0.2)``, drawn
   afresh for every read. Column currents sum ``x_k (G+ - G-)_kn`` over a tile, plus
   Gaussian output (summation) noise of ``output_noise`` (aihwkit's ``out_noise``,
   default 0.06) in units of a full-scale single-row current, drawn for every read.
4. *ADC*: ``adc_quantize`` at ``adc_bits`` (default 9, aihwkit's) with a power-of-two
   gain fixed when the crossbar is programmed, from its weights and the input range
   alone (:func:`adc_full_scale`), never from the product being computed: a chip has
   no oracle of its outputs. Outputs beyond the range saturate.
5. *Digital*: the reads' codes are averaged, compensated and rounded (the same
   rounding for one read as for several), partial tiles along ``K`` are summed
   (``accumulate_tiles``) and scaled back.

``analog_precision_bits`` (the seed's single width) sets each converter whose own
width (``dac_bits``/``adc_bits``) is not given; a width given explicitly is honoured
(in the manifest, 0 means not given).

**Noise compensation** (``noise_compensation=True``): global drift compensation (a
fixed calibration input is read right after programming and again at inference; the
ratio of the summed absolute outputs rescales every output of the crossbar, undoing
the drift's average decay) and ``repeated_reads`` reads of every product averaged
(read noise variance / ``repeated_reads``, at that many times the time and energy).

**Timing** (:func:`analog_read_ns`, :func:`analog_timing_ns`), from the periphery of
IBM's HERMES core (Khaddam-Aljameh et al., "HERMES-Core: a 1.59-TOPS/mm2 PCM on 14-nm
CMOS in-memory compute core using 300-ps/LSB linearized CCO-based ADCs", IEEE JSSC 2022;
Le Gallo et al., "A 64-core mixed-signal in-memory compute chip based on phase-change
memory", Nature Electronics 2023), as three pipelined stages of one read (one
matrix-vector product of a tile):

1. *Input*: pulse-width-modulated inputs: a code of magnitude up to
   ``2**(b-1) - 1`` (``b`` = the DAC's bits) drives its row for that many
   ``dac_lsb_ns``; the column currents integrate meanwhile, then settle
   (``settle_ns``): ``t_in = (2**(b-1) - 1) * dac_lsb_ns + settle_ns``.
2. *Conversion*: ramp/CCO ADCs count over the full range, ``2**b * adc_lsb_ns`` per
   conversion (``b`` the ADC's bits; HERMES: 300 ps/LSB); ``adcs_per_tile`` ADCs serve the ``tile_size``
   columns, so ``t_adc = ceil(tile_size / adcs_per_tile) * 2**b * adc_lsb_ns``.
3. A sample-and-hold between them lets read ``i + 1`` integrate while read ``i``
   converts: a stream of ``r`` reads takes ``t_in + t_adc + (r - 1) * max(t_in, t_adc)``.

Every row of ``A`` is ``reads`` reads of every tile; ``crossbars`` tiles work in
parallel; a product needing more tiles than that runs in rounds, the crossbars
reprogrammed in between (``program_time_us``, PCM iterative program-and-verify). So more
bits cost time (the input pulses and the conversions are exponential in ``b``), and
more ADCs or crossbars never cost any.

**Energy** (:func:`analog_energy_pj`): converters grow with their bits. An ADC
conversion costs the Walden figure of merit times its conversion steps,
``adc_fom_fj_per_step * 2**adc_bits`` (default 20 fJ/step, within the 5-50 fJ band of
~1 GS/s Nyquist ADCs in B. Murmann's ADC Performance Survey,
github.com/bmurmann/ADC-survey: 10.2 pJ at 9 bits, 1.3 pJ at 6); a DAC conversion
(one input driven for one read) ``dac_fom_fj_per_step * 2**dac_bits`` (default 5
fJ/step, an assumption of the same form: a PWM driver's pulse grows as ``2**(b-1)``).
``dac_energy_pj``/``adc_energy_pj``, when set, replace the model with a fixed energy
per conversion. Plus ``cell_energy_fj`` per MAC and read, ``digital_energy_pj`` per
partial sum, ``program_energy_pj`` per cell written.

**Graph routing** (:func:`analog_linear`): with ``policy`` other than ``none`` the
extension takes ``linear``, ``matmul`` and ``conv2d`` ops of a graph (``all``,
``all_but_first_last`` or ``names:a,b``); see :mod:`._offchip`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..emulator.errors import SpecError
from ..emulator.frontend_model import (
    accumulate_tiles,
    adc_quantize,
    adc_range,
    dac_quantize,
    dac_range,
)
from ..graph import Graph, Op, gemm_dims
from ..registry import (
    DeviceExtension,
    ExtensionId,
)
from ._offchip import (
    ensure_unit,
    gemm_unit_kernel,
    parse_policy,
    policy_selects,
    product_operands,
    run_offchip_unit,
    write_product,
)

__all__ = [
    "AnalogConfig",
    "AnalogResult",
    "PCMModel",
    "hybrid_matmul",
    "analog_linear",
    "analog_energy_pj",
    "adc_full_scale",
    "analog_timing_ns",
    "analog_read_ns",
    "PROG_COEFF_US",
    "G_MAX_REF_US",
    "CURRENT_RESOLUTION",
    "DEFAULT_DAC_BITS",
    "DEFAULT_ADC_BITS",
    "ADC_FOM_FJ_PER_STEP",
    "DAC_FOM_FJ_PER_STEP",
]

#: Column currents are integers in units of ``1 / CURRENT_RESOLUTION`` of a full-scale
#: (all inputs and weights 1) single-row current before the ADC.
CURRENT_RESOLUTION = 1 << 24
#: Programming-noise polynomial (uS) of the PCM model, fitted at ``G_MAX_REF_US``.
PROG_COEFF_US = (0.26348, 1.9650, -1.1731)
G_MAX_REF_US = 25.0
#: aihwkit's default converter resolutions (``IOParameters``: ``inp_res = 1/(2**7 - 2)``,
#: ``out_res = 1/(2**9 - 2)``).
#: Graph op kinds the extension claims (its ``policy`` picks among them).
_CLAIMS = ("linear", "matmul", "conv2d")
DEFAULT_DAC_BITS = 7
DEFAULT_ADC_BITS = 9
#: Walden figure of merit of the ADC, fJ per conversion step: ``E = FOM * 2**ENOB`` per
#: conversion. 20 fJ lies in the 5-50 fJ/conv-step band of Nyquist ADCs sampling near
#: 1 GS/s in B. Murmann's "ADC Performance Survey 1997-2024"
#: (github.com/bmurmann/ADC-survey); the survey's best designs (at low rates) are below
#: 1 fJ. ENOB is taken as the nominal bits (an ideal converter; a real one loses ~1 bit).
ADC_FOM_FJ_PER_STEP = 20.0
#: The DAC's energy per input in the same form, ``FOM * 2**bits``: a PWM row driver
#: charges its line for up to ``2**(bits-1)`` LSB pulses. 5 fJ/step is an assumption of
#: the same order as the ADC's (0.64 pJ per 7-bit input), not a survey value.
DAC_FOM_FJ_PER_STEP = 5.0


@dataclass(frozen=True, kw_only=True)
class AnalogConfig:
    """The analog tile (the seed's ``wia_analog_config_t`` plus its device physics).

    ``dac_bits`` and ``adc_bits`` (2..16; default 7 and 9 as aihwkit, or both
    ``analog_precision_bits``, the seed's single width, when that is given):
    converter resolutions (:attr:`dac_precision_bits`, :attr:`adc_precision_bits`);
    ``digital_precision_bits`` (at least the DAC's bits, at most 16; default 8, or the
    DAC's bits when finer): inputs' and weights' digital resolution; ``noise_compensation``: drift compensation and
    repeated reads. Each noise source can be switched off (``programming_noise``,
    ``read_noise``, ``drift``, ``output_noise=0``) or scaled. ``adc_headroom``: the ADC
    range in L2 norms of a column's weights (:func:`adc_full_scale`). ``policy``: which
    graph ops the extension takes (``none``, ``all``, ``all_but_first_last``,
    ``names:a,b``). Raises ValueError/TypeError naming the field.
    """

    analog_precision_bits: int | None = None
    dac_bits: int | None = None
    adc_bits: int | None = None
    digital_precision_bits: int | None = None
    noise_compensation: bool = True
    tile_size: int = 256
    g_max_us: float = 25.0
    programming_noise: bool = True
    read_noise: bool = True
    drift: bool = True
    prog_noise_scale: float = 1.0
    read_noise_scale: float = 1.0
    drift_scale: float = 1.0
    t_inference_s: float = 3600.0
    t0_s: float = 20.0
    t_read_s: float = 250e-9
    repeated_reads: int = 4
    crossbars: int = 64
    dac_lsb_ns: float = 0.5
    adc_lsb_ns: float = 0.3
    adcs_per_tile: int = 256
    settle_ns: float = 5.0
    program_time_us: float = 1000.0
    dac_energy_pj: float | None = None
    adc_energy_pj: float | None = None
    dac_fom_fj_per_step: float = DAC_FOM_FJ_PER_STEP
    adc_fom_fj_per_step: float = ADC_FOM_FJ_PER_STEP
    output_noise: float = 0.06
    adc_headroom: float = 3.0
    cell_energy_fj: float = 1.0
    digital_energy_pj: float = 0.1
    program_energy_pj: float = 100.0
    acc_bits: int = 32
    policy: str = "none"

    def __post_init__(self) -> None:
        def ints(name: str, lo: int, hi: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"AnalogConfig.{name} must be an integer in {lo}..{hi}, got {v!r}")

        for name in ("analog_precision_bits", "dac_bits", "adc_bits"):
            if getattr(self, name) is not None:
                ints(name, 2, 16)
        dac = self.dac_precision_bits
        if self.digital_precision_bits is None:  # 8 bits, or the DAC's when finer
            object.__setattr__(self, "digital_precision_bits", max(8, dac))
        d = self.digital_precision_bits
        if isinstance(d, bool) or not isinstance(d, int) or not dac <= d <= 16:
            raise ValueError(
                f"AnalogConfig.digital_precision_bits must be an integer from the DAC's "
                f"{dac} bits to 16, got {d!r}"
            )
        ints("tile_size", 1, 4096)
        ints("repeated_reads", 1, 1024)
        ints("crossbars", 1, 1 << 20)
        ints("adcs_per_tile", 1, 4096)
        ints("acc_bits", 16, 64)
        for name in ("g_max_us", "t0_s", "t_read_s", "dac_lsb_ns", "adc_lsb_ns"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not v > 0
                or not math.isfinite(v)
            ):
                raise ValueError(f"AnalogConfig.{name} must be a positive number, got {v!r}")
        for name in (
            "prog_noise_scale",
            "read_noise_scale",
            "drift_scale",
            "t_inference_s",
            "program_time_us",
            "settle_ns",
            "dac_fom_fj_per_step",
            "adc_fom_fj_per_step",
            "output_noise",
            "cell_energy_fj",
            "digital_energy_pj",
            "program_energy_pj",
        ):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not v >= 0
                or not math.isfinite(v)
            ):
                raise ValueError(f"AnalogConfig.{name} must be a number >= 0, got {v!r}")
        for name in ("dac_energy_pj", "adc_energy_pj"):
            v = getattr(self, name)
            if v is not None and (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not v >= 0
                or not math.isfinite(v)
            ):
                raise ValueError(
                    f"AnalogConfig.{name} must be None (the Walden model) or a number >= 0, "
                    f"got {v!r}"
                )
        h = self.adc_headroom
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 < h <= 1e6:
            raise ValueError(
                f"AnalogConfig.adc_headroom must be a number > 0 and at most 1e6 "
                f"(ADC range in L2 norms of a column's weights), got {h!r}"
            )
        for name in ("noise_compensation", "programming_noise", "read_noise", "drift"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"AnalogConfig.{name} must be a bool, got {getattr(self, name)!r}")
        parse_policy(self.policy, "AnalogConfig.policy")

    @property
    def dac_precision_bits(self) -> int:
        """The DAC's resolution: ``dac_bits``, else ``analog_precision_bits``, else 7
        (aihwkit's default input resolution, ``inp_res = 1 / (2**7 - 2)``)."""
        for v in (self.dac_bits, self.analog_precision_bits):
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return DEFAULT_DAC_BITS

    @property
    def adc_precision_bits(self) -> int:
        """The ADC's resolution: ``adc_bits``, else ``analog_precision_bits``, else 9
        (aihwkit's default output resolution, ``out_res = 1 / (2**9 - 2)``)."""
        for v in (self.adc_bits, self.analog_precision_bits):
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return DEFAULT_ADC_BITS

    @property
    def dac_conversion_pj(self) -> float:
        """Energy of one DAC conversion (one input driven for one read): ``dac_energy_pj``
        if set, else ``dac_fom_fj_per_step * 2**dac_bits`` (fJ -> pJ)."""
        if self.dac_energy_pj is not None:
            return float(self.dac_energy_pj)
        return self.dac_fom_fj_per_step * (1 << self.dac_precision_bits) * 1e-3

    @property
    def adc_conversion_pj(self) -> float:
        """Energy of one ADC conversion: ``adc_energy_pj`` if set, else the Walden figure
        of merit times the conversion steps, ``adc_fom_fj_per_step * 2**adc_bits``."""
        if self.adc_energy_pj is not None:
            return float(self.adc_energy_pj)
        return self.adc_fom_fj_per_step * (1 << self.adc_precision_bits) * 1e-3

    @property
    def reads(self) -> int:
        """Reads averaged per product (``repeated_reads`` with compensation, else 1)."""
        return self.repeated_reads if self.noise_compensation else 1

    @classmethod
    def from_extension(cls, ext: DeviceExtension) -> AnalogConfig:
        """The tile described by the analog extension's parameters. In the manifest
        ``0`` means unset for ``dac_bits``, ``adc_bits`` and ``analog_precision_bits``
        (their default): a converter whose own width is unset takes
        ``analog_precision_bits`` when that is set, else aihwkit's 7 (DAC) or 9 (ADC);
        a width given explicitly is honoured, whatever its value.
        ``digital_precision_bits: 0`` means the default (8, or the DAC's bits)."""
        names = set(cls.__dataclass_fields__)
        vals = {k: v for k, v in ext.values.items() if k in names}
        for k in ("digital_precision_bits", "analog_precision_bits", "dac_bits", "adc_bits"):
            if vals.get(k) == 0:  # 0: unset (the defaults above)
                vals.pop(k)
        try:
            return cls(**vals)
        except ValueError as e:  # a parameter value the unit cannot take: one line
            raise SpecError(str(e), field=f"extension {ext.id!r} parameters") from None


class PCMModel:
    """The PCM cell statistics (see the module docstring), with a seeded generator."""

    def __init__(self, cfg: AnalogConfig, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.rng = rng

    def program(self, g_target: np.ndarray) -> np.ndarray:
        """Programmed conductances (uS): target plus programming noise, >= 0."""
        c = self.cfg
        if not c.programming_noise or c.prog_noise_scale == 0:
            return g_target.copy()
        rel = g_target / c.g_max_us
        sig = PROG_COEFF_US[0] + PROG_COEFF_US[1] * rel + PROG_COEFF_US[2] * rel**2
        sig = sig * c.g_max_us / G_MAX_REF_US
        g = g_target + c.prog_noise_scale * sig * self.rng.standard_normal(g_target.shape)
        return np.maximum(g, 0.0)

    def drift_nu(self, g_target: np.ndarray) -> np.ndarray:
        """Drift exponents ``nu`` (one per cell)."""
        c = self.cfg
        rel = np.maximum(np.abs(g_target / c.g_max_us), 1e-7)
        mu = np.clip(-0.0155 * np.log(rel) + 0.0244, 0.049, 0.1)
        sd = np.clip(-0.0125 * np.log(rel) - 0.0059, 0.008, 0.045)
        return np.abs(mu + sd * self.rng.standard_normal(rel.shape)) * c.drift_scale

    def at(self, g_prog: np.ndarray, nu: np.ndarray, t_inference_s: float) -> np.ndarray:
        """Conductances at ``t_inference_s`` after programming (drift, no read noise)."""
        c = self.cfg
        if not c.drift or t_inference_s <= 0:
            return g_prog
        t = t_inference_s + c.t0_s
        return g_prog * (t / c.t0_s) ** (-nu)

    def read(self, g: np.ndarray, g_prog: np.ndarray, t_inference_s: float) -> np.ndarray:
        """One read of conductances ``g``: 1/f read noise drawn for this read."""
        c = self.cfg
        if not c.read_noise or c.read_noise_scale == 0:
            return g
        t = t_inference_s + c.t0_s
        qs = np.minimum(0.0088 / np.maximum(np.abs(g_prog) / c.g_max_us, 1e-3) ** 0.65, 0.2)
        sig = qs * math.sqrt(math.log((t + c.t_read_s) / (2 * c.t_read_s)))
        return np.maximum(
            g + np.abs(g) * c.read_noise_scale * sig * self.rng.standard_normal(g.shape), 0.0
        )


@dataclass
class AnalogResult:
    """The product and its cost; ``drift_alpha`` the compensation factors applied;
    ``adc_shifts[n_tile, k_tile]`` the ADC gains fixed at programming (an ADC code is
    ``2**shift / CURRENT_RESOLUTION`` of a full-scale single-row current);
    ``program_energy_pj`` the part of ``energy_pj`` spent writing the cells."""

    output: np.ndarray = field(repr=False)
    time_ns: float
    latency_ms: float
    energy_pj: float
    energy_per_mac_pj: float
    macs: int
    tiles: int
    reads: int
    drift_alpha: np.ndarray = field(repr=False, default_factory=lambda: np.ones(0))
    adc_shifts: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, int))
    device_cycles: int = 0
    dac_bits: int = DEFAULT_DAC_BITS
    adc_bits: int = DEFAULT_ADC_BITS
    program_energy_pj: float = 0.0


def _quantize_sym(v: np.ndarray, bits: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Signed integers of ``bits`` bits scaled per slice along ``axis`` (codes, scale)."""
    hi = (1 << (bits - 1)) - 1
    peak = np.abs(v).max(axis=axis, keepdims=True)
    peak[peak == 0] = 1.0
    return np.rint(v / peak * hi).astype(np.int64), peak / hi


def analog_read_ns(cfg: AnalogConfig) -> tuple[float, float]:
    """``(t_in, t_adc)``: the input (PWM + integration + settling) and conversion stage
    times of one read of a tile, in ns (see the module docstring); the input stage
    follows the DAC's bits, the conversion the ADC's."""
    t_in = ((1 << (cfg.dac_precision_bits - 1)) - 1) * cfg.dac_lsb_ns + cfg.settle_ns
    t_adc = -(-cfg.tile_size // cfg.adcs_per_tile) * (1 << cfg.adc_precision_bits) * cfg.adc_lsb_ns
    return t_in, t_adc


def analog_timing_ns(cfg: AnalogConfig, m: int, k: int, n: int) -> tuple[float, int]:
    """(time in ns, weight tiles) of an ``m x k`` by ``k x n`` product: per round of at
    most ``crossbars`` tiles (in parallel), ``m * reads`` pipelined reads; rounds after
    the first wait for the crossbars to be reprogrammed."""
    tiles = -(-k // cfg.tile_size) * -(-n // cfg.tile_size)
    rounds = -(-tiles // cfg.crossbars)
    t_in, t_adc = analog_read_ns(cfg)
    stream = t_in + t_adc + (m * cfg.reads - 1) * max(t_in, t_adc)
    program = (rounds - 1) * cfg.program_time_us * 1e3
    return rounds * stream + program, tiles


def adc_full_scale(cfg: AnalogConfig, w_tile: np.ndarray) -> float:
    """The ADC full scale of one crossbar, fixed when it is programmed, in units of a
    full-scale single-row current (input 1, weight 1): from the programmed weights
    ``w_tile`` (``[rows, cols]`` in [-1, 1]) and the input range [-1, 1] alone, never
    from the product being computed. No column's output can exceed its L1 norm; inputs
    of independent signs spread it about its L2 norm, so the range is
    ``min(max_n sum_k |w_kn|, adc_headroom * max_n sqrt(sum_k w_kn**2))`` (outputs beyond
    it saturate)."""
    if w_tile.size == 0:
        return 1.0
    l1 = float(np.abs(w_tile).sum(axis=0).max())
    l2 = float(np.sqrt((w_tile**2).sum(axis=0)).max())
    return min(l1, cfg.adc_headroom * l2) or 1.0


def _product(
    cfg: AnalogConfig, a: np.ndarray, b: np.ndarray, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pcm = PCMModel(cfg, rng)
    ab, db, ts = cfg.dac_precision_bits, cfg.digital_precision_bits, cfg.tile_size
    m, k = a.shape
    n = b.shape[1]
    _, dhi = dac_range(ab)
    shift_in = db - ab
    # digital inputs: each row's max maps to the DAC's top code (no clamping)
    apeak = np.abs(a).max(axis=1, keepdims=True)
    apeak[apeak == 0] = 1.0
    xq = np.rint(a / apeak * (dhi << shift_in)).astype(np.int64)
    codes = dac_quantize(xq, ab, shift_in, db)  # analog-resolution inputs
    x = codes / dhi  # in [-1, 1]
    wq, wscale = _quantize_sym(b, db, axis=0)  # [k, n] digital weights
    whi = (1 << (db - 1)) - 1
    w = wq / whi
    _, ahi = adc_range(cfg.adc_precision_bits)
    kt, nt = -(-k // ts), -(-n // ts)
    fine = CURRENT_RESOLUTION
    out = np.zeros((m, n))
    alphas = []
    shifts = np.zeros((nt, kt), dtype=int)
    calib = np.ones(ts) / ts
    out_sigma = cfg.output_noise
    for nb in range(nt):
        cols = slice(nb * ts, min(n, (nb + 1) * ts))
        partial = []
        for kb in range(kt):
            rows = slice(kb * ts, min(k, (kb + 1) * ts))
            wt = w[rows, cols]
            xt = x[:, rows]
            gp_t = np.maximum(wt, 0) * cfg.g_max_us
            gn_t = np.maximum(-wt, 0) * cfg.g_max_us
            gp, gn = pcm.program(gp_t), pcm.program(gn_t)
            nup, nun = pcm.drift_nu(gp_t), pcm.drift_nu(gn_t)
            # the ADC gain is fixed at programming, from the weights and the input range
            full = adc_full_scale(cfg, wt)
            shift = max(0, math.ceil(math.log2(full * fine / ahi)))
            shifts[nb, kb] = shift
            gp_t0, gn_t0 = pcm.at(gp, nup, 0.0), pcm.at(gn, nun, 0.0)
            gp_t1 = pcm.at(gp, nup, cfg.t_inference_s)
            gn_t1 = pcm.at(gn, nun, cfg.t_inference_s)
            alpha = 1.0
            if cfg.noise_compensation and cfg.drift:
                cal = calib[: wt.shape[0]]
                ref = np.abs(cal @ (pcm.read(gp_t0, gp, 0.0) - pcm.read(gn_t0, gn, 0.0))).sum()
                now = np.abs(
                    cal
                    @ (
                        pcm.read(gp_t1, gp, cfg.t_inference_s)
                        - pcm.read(gn_t1, gn, cfg.t_inference_s)
                    )
                ).sum()
                alpha = ref / now if now > 0 else 1.0
            alphas.append(alpha)
            acc = np.zeros((m, wt.shape[1]))
            for _ in range(cfg.reads):
                g = (
                    pcm.read(gp_t1, gp, cfg.t_inference_s) - pcm.read(gn_t1, gn, cfg.t_inference_s)
                ) / cfg.g_max_us
                y = xt @ g
                if out_sigma > 0:  # summation noise at each column (aihwkit's out_noise)
                    y = y + out_sigma * rng.standard_normal(y.shape)
                current = np.rint(y * fine).astype(np.int64)
                acc += adc_quantize(current, cfg.adc_precision_bits, shift) * alpha
            # mean of the reads, compensated, rounded to the accumulator's integers (the
            # same rounding for one read as for several)
            partial.append(np.rint(acc / cfg.reads * (1 << shift)).astype(np.int64))
        summed = accumulate_tiles(partial, cfg.acc_bits)
        out[:, cols] = summed / fine
    return out * apeak * (wscale * whi), np.asarray(alphas), shifts


def analog_energy_pj(
    cfg: AnalogConfig, m: int, k: int, n: int, *, resident: bool = False
) -> tuple[float, float]:
    """``(energy_pj, program_energy_pj)`` of an ``m x k`` by ``k x n`` product. Every
    read of a weight tile converts its driven rows (``dac_conversion_pj`` each) and its
    used columns (``adc_conversion_pj`` each, plus ``digital_energy_pj`` for the partial
    sum); every MAC costs ``cell_energy_fj`` per read. Programming writes two cells per
    weight (``program_energy_pj``); ``resident=True`` (graph weights programmed once at
    load) charges it only when the product needs more tiles than ``crossbars`` and so
    rewrites them on every call."""
    ts = cfg.tile_size
    kt, nt = -(-k // ts), -(-n // ts)
    reads = m * cfg.reads
    dac = reads * k * nt * cfg.dac_conversion_pj
    adc = reads * n * kt * (cfg.adc_conversion_pj + cfg.digital_energy_pj)
    cells = m * k * n * cfg.reads * cfg.cell_energy_fj * 1e-3
    rounds = -(-(kt * nt) // cfg.crossbars)
    program = 0.0 if resident and rounds == 1 else k * n * 2 * cfg.program_energy_pj
    return dac + adc + cells + program, program


def hybrid_matmul(
    ctx: Any,
    cfg: AnalogConfig,
    A: np.ndarray,
    B: np.ndarray,  # noqa: N803
    C: np.ndarray | None = None,
    stream: Any = None,
    *,
    seed: int = 0,
) -> AnalogResult:
    """``C = A @ B`` on PCM crossbars with digital periphery (the seed's
    ``wia_hybrid_matmul``). ``A``: ``M x K`` inputs, ``B``: ``K x N`` weights. ``C``, if
    given, receives the result. Noise is drawn from ``seed``. On a context the product
    also runs on its device (A and B staged through the memory hierarchy, the analog
    tiles' time, C written back; the counters count its MACs at the tiles' energy).
    Raises :class:`~wia_hw.WorkloadError` on shape mismatch."""
    if not isinstance(cfg, AnalogConfig):
        raise TypeError(f"cfg must be an AnalogConfig, got {type(cfg).__name__}")
    a, b = product_operands("hybrid_matmul", A, B)
    out, alphas, shifts = _product(cfg, a, b, seed)
    if C is not None:
        write_product("hybrid_matmul", C, out)
    m, k = a.shape
    n = b.shape[1]
    time_ns, tiles = analog_timing_ns(cfg, m, k, n)
    macs = m * k * n
    energy, program = analog_energy_pj(cfg, m, k, n)
    res = AnalogResult(
        output=out,
        time_ns=time_ns,
        latency_ms=time_ns * 1e-6,
        energy_pj=energy,
        energy_per_mac_pj=energy / macs,
        macs=macs,
        tiles=tiles,
        reads=cfg.reads,
        drift_alpha=alphas,
        adc_shifts=shifts,
        dac_bits=cfg.dac_precision_bits,
        adc_bits=cfg.adc_precision_bits,
        program_energy_pj=program,
    )
    if ctx is not None:
        ensure_unit(ctx, ExtensionId.ANALOG)
        res.device_cycles = run_offchip_unit(
            ctx,
            "analog",
            "hybrid_matmul",
            m,
            k,
            n,
            1,
            time_ns,
            macs,
            energy,
            {"analog_time_ns": time_ns, "energy_per_mac_pj": energy / macs, "tiles": tiles},
        )
    return res


def analog_linear(op: Op, graph: Graph, spec: Any, storage: Any, ext: DeviceExtension) -> Any:
    """The analog extension's graph operation (claims ``linear``, ``matmul``,
    ``conv2d``): the ops its ``policy`` parameter selects run on the PCM tiles, the
    others decline (``None``: the built-in lowering runs them).

    A taken op is one device kernel (:func:`~._offchip.gemm_unit_kernel`): the tile's
    time is :func:`analog_timing_ns` per GEMM (a conv2d's groups one after another),
    its energy :func:`analog_energy_pj` with the weights resident (programmed once at
    load; a ``matmul`` whose B is an activation is programmed on every call, in time
    and energy). Functional mode computes it with :func:`hybrid_matmul`'s model, seeded
    per run, op and batch entry."""
    cfg = AnalogConfig.from_extension(ext)
    if op.kind not in _CLAIMS or not policy_selects(cfg.policy, op, graph, "analog"):
        return None
    ins, _ = graph.shapes_of(op)
    dims = gemm_dims(op, ins)
    batch, m, n, k = dims
    resident = graph.tensors[op.inputs[1]].kind == "weight"
    t_ns, tiles = analog_timing_ns(cfg, m, k, n)
    if not resident:
        t_ns += cfg.program_time_us * 1e3  # B is written into the crossbars first
    energy, program = analog_energy_pj(cfg, m, k, n, resident=resident)
    macs = batch * m * n * k

    def unit_gemm(a: np.ndarray, b: np.ndarray, seed: int) -> np.ndarray:
        return _product(cfg, np.asarray(a, np.float64), np.asarray(b, np.float64), seed)[0]

    extra = {
        "analog_time_ns": batch * t_ns,
        "tiles": batch * tiles,
        "unit_energy_pj": batch * energy,
        "unit_macs": macs,
        "program_energy_pj": batch * program,
    }
    return [
        gemm_unit_kernel(
            op, graph, spec, storage, "analog", dims, batch * t_ns, batch * energy, extra, unit_gemm
        )
    ]
