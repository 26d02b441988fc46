"""The photonic extension: matrix products on an optical core (seed 8.9.3).

Seed::

    wia_photonic_config_t photonic_cfg = {.wavelength_channels = 64,
        .modulation_bandwidth_ghz = 100, .matrix_size_limit = 256, .precision_bits = 8};
    wia_photonic_matmul_t photonic_mm = {.input_encoding = WIA_PHOTONIC_INTENSITY,
        .computation_mode = WIA_PHOTONIC_COHERENT, .output_detection = WIA_PHOTONIC_BALANCED};
    wia_photonic_matmul(ctx, &photonic_cfg, &photonic_mm, A, B, C, stream);

Python: ``photonic_matmul(ctx, PhotonicConfig(...), PhotonicMatmul(...), A, B, C)``.

**Data path** (everything below the optics is the front-end golden model of
:mod:`wia_hw.emulator.frontend_model`, the RTL's reference; the optics is its
:class:`~wia_hw.emulator.frontend_model.PhotonicCore`). ``C = A @ B`` with ``A``
(``M x K``) the weights programmed into an ``n x n`` MZI mesh (``n =
matrix_size_limit``) tile by tile, and the ``N`` columns of ``B`` streamed through it
as input vectors, ``wavelength_channels`` at a time:

1. Each row of ``A`` is scaled by its ``max|.|`` into [-1, 1] and rounded to the
   ``precision_bits`` grid of
   the phase DACs (``quantize_weights``); the mesh realises ``cos(theta + error)`` with a
   static phase error of ``mzi_phase_sigma_rad`` per MZI, drawn when a tile is
   programmed.
2. Each column of ``B`` is scaled by its ``max|.|`` into signed ``in_bits`` samples and
   converted by the DAC
   to ``precision_bits`` codes (``dac_quantize``: round, clamp).
3. The core's two detectors per output see ``P0 L (1 +- y) / 2`` with ``y = W x / n``
   (``L`` the insertion loss of ``insertion_loss_db_per_component`` over the
   ``matrix_size_limit + 3`` components of a path: the mesh columns, the modulator and
   two couplers), with shot noise (``sqrt(2 q I B)``) and thermal noise
   (``sqrt(4 k T B / R)``), ``B = modulation_bandwidth_ghz``.
4. ``BALANCED`` detection subtracts the two samples (``balanced_subtract``); ``SINGLE``
   uses one detector and subtracts the known bias ``L * full_scale / 2`` digitally (twice
   the noise of one arm, and the shot noise follows the signal).
5. The ADC (``adc_quantize``) rounds with a power-of-two gain ``2**-adc_shift`` chosen
   from the product's range (a per-call calibration: the largest shift that does not
   saturate); partial tiles along ``K`` are summed digitally (``accumulate_tiles``).

Encodings and modes: ``PHASE`` encodes signed inputs as phase 0 or pi (``COHERENT``
only); ``INTENSITY`` encodes magnitudes, so signed inputs take two passes (``x+`` and
``x-``) subtracted digitally. ``COHERENT`` meshes realise signed weights by interference;
``INCOHERENT`` (intensity-weight banks, one wavelength per channel, no interference)
realise non-negative weights only, so ``W = W+ - W-`` takes two passes too.

**Timing**: per programmed tile, ``reprogram_ns`` then the input vectors streamed one
sample per front-end cycle (a cycle is one symbol at ``modulation_bandwidth_ghz``),
``wavelength_channels`` vectors per symbol, through the front-end pipeline
(``frontend_matvec_cycles``). At the seed's 100 GHz the detectors' shot noise is large
against ``y = W x / n`` of typical data (a few per cent of full scale): the photon
budget, not the ADC, then limits accuracy; raise ``laser_power_mw`` or lower
``modulation_bandwidth_ghz`` to trade energy or speed for it. **Energy**: lasers (``laser_power_mw`` per channel at
``laser_wall_plug_efficiency``) and MZI tuning (``tuning_power_mw_per_mzi``) over the
busy time (``P0 = laser_power_mw`` is launched toward each of the ``n`` outputs on
every channel, and ``P0`` times the path's transmission reaches a detector, as the noise
budget has it: the loss is charged once, in the light delivered), ``dac_energy_pj`` per input sample, ``adc_energy_pj`` per detector sample,
``program_energy_pj_per_mzi`` per reprogrammed MZI; reported per MAC.

**Precision delivered** (:func:`photonic_snr`, :func:`photonic_enob`): a full-scale
output (``y = 1``) is the current ``R P0 L``; per pass (phase encoding one, intensity
two, intensity on an incoherent mesh four: the passes' results are summed, so their
noise adds in variance while the full-scale signal they share does not grow) and per
tile along ``K``, the detectors add shot noise (``2 q I B`` per arm) and thermal noise
(``4 k T B / R_load`` per arm), round to ``det_bits`` samples of the unattenuated ``R
P0`` (``step**2 / 12`` each) and the ADC rounds their difference to its
``precision_bits`` codes at the calibrated gain ``2**-adc_shift`` (a power of two: its
step is between 1 and 2 times the product's per-pass peak over ``2**(p-1) - 1``);
once per product the weights and inputs round to ``precision_bits`` DAC codes
(``step**2 / 12`` each, reaching an output through ``y = W x / n``) and the MZIs' phase
error perturbs the weights (``sigma**2 (1 - w**2)``); so ``SNR = (R P0 L)**2 / 2 /
sigma**2`` for a full-scale sine and ``ENOB = (SNR_dB - 1.76) / 6.02``
(:func:`_noise_terms`). Everything but shot and thermal noise grows with the light like
the signal: the converters and the mesh bound the bits whatever the laser. At full
scale the DAC rounding and phase error are counted at their largest; a product's
``effective_bits`` counts them, the ADC's step at its own gain and its tiles from its
operands (:func:`_product_bits`), over the range its outputs span. The bits are not
capped at ``precision_bits``: the budget holds the converters. When the bits delivered
fall short of ``precision_bits`` a :class:`PhotonicPrecisionWarning` says so
(configured against delivered bits; once per configuration).
:func:`laser_power_for_bits` sizes the laser for a number of bits and
:func:`size_laser_power` reports the energy a product takes at that power (or says in
one line that the converters alone cannot reach the bits). The seed's configuration
(64 channels, 100 GHz, 256 x 256, 8 bits, 10 mW) delivers 6.36 bits at full scale with
its intensity encoding (6.86 with phase encoding); its converters alone leave 6.78
(7.27): the ADC's gain shift puts its step at 1/77.6 of full scale, not 1/127, so no
laser reaches 8; 16.6 mW reach 6.5.

**Graph routing** (:func:`photonic_linear`): with ``policy`` other than ``none`` the
extension takes ``linear``, ``matmul`` and ``conv2d`` ops of a graph (``all``,
``all_but_first_last`` or ``names:a,b``); see :mod:`._offchip`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..emulator.enums import StrNamedEnum
from ..emulator.errors import SpecError
from ..emulator.frontend_model import (
    PhotonicCore,
    PhotonicParams,
    accumulate_tiles,
    adc_quantize,
    adc_range,
    balanced_subtract,
    dac_quantize,
    dac_range,
    frontend_matvec_cycles,
    quantize_weights,
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
    "PhotonicEncoding",
    "PhotonicMode",
    "PhotonicDetection",
    "PhotonicConfig",
    "PhotonicMatmul",
    "PhotonicResult",
    "photonic_matmul",
    "photonic_timing_ns",
    "photonic_snr",
    "photonic_enob",
    "laser_power_for_bits",
    "size_laser_power",
    "LaserSizing",
    "PhotonicPrecisionWarning",
    "MAX_PATH_LOSS_DB",
    "photonic_linear",
    "run_offchip_unit",
]

_Q = 1.602176634e-19  # electron charge, C
_KB = 1.380649e-23  # Boltzmann constant, J/K
#: Graph op kinds the extension claims (its ``policy`` picks among them).
_CLAIMS = ("linear", "matmul", "conv2d")
#: The largest optical path loss a configuration may have, in dB (a factor 1e10). Past
#: it no usable light reaches the detectors: even the largest laser the manifest allows
#: (10 W per output and channel) would deliver 1 nW, below the detectors' thermal noise
#: at the default 100 GHz and 1 kOhm (1.3 uA rms against 1 nA of signal), and the
#: lasers would have to emit 1e10 times the power the detectors receive. A
#: configuration whose ``insertion_loss_db_per_component * (matrix_size_limit + 3)``
#: exceeds it is refused (a ValueError naming both and the total).
MAX_PATH_LOSS_DB = 100.0


class PhotonicPrecisionWarning(UserWarning):
    """The photonic core delivers fewer effective bits than its ``precision_bits``."""


_Enum = StrNamedEnum


class PhotonicEncoding(_Enum):
    """How inputs ride the light (the seed's ``WIA_PHOTONIC_INTENSITY``, ``_PHASE``)."""

    INTENSITY = "intensity"
    PHASE = "phase"


class PhotonicMode(_Enum):
    """How the mesh computes (the seed's ``WIA_PHOTONIC_COHERENT``, ``_INCOHERENT``)."""

    COHERENT = "coherent"
    INCOHERENT = "incoherent"


class PhotonicDetection(_Enum):
    """How outputs are read (the seed's ``WIA_PHOTONIC_BALANCED``, ``_SINGLE``)."""

    BALANCED = "balanced"
    SINGLE = "single"


def _pos(obj: Any, name: str, integer: bool = False, zero_ok: bool = False) -> None:
    v = getattr(obj, name)
    kind = int if integer else (int, float)
    ok = (
        not isinstance(v, bool)
        and isinstance(v, kind)
        and math.isfinite(v)
        and (v >= 0 if zero_ok else v > 0)
    )
    if not ok:
        what = "an integer" if integer else "a number"
        raise ValueError(
            f"{type(obj).__name__}.{name} must be {what} {'>= 0' if zero_ok else '> 0'}, got {v!r}"
        )


@dataclass(frozen=True, kw_only=True)
class PhotonicConfig:
    """The photonic accelerator (the seed's ``wia_photonic_config_t`` plus its physics).

    Seed fields: ``wavelength_channels`` (WDM), ``modulation_bandwidth_ghz`` (symbol
    rate, also the detectors' noise bandwidth), ``matrix_size_limit`` (mesh size ``n``),
    ``precision_bits`` (DAC/ADC resolution, 2..16). Physics: see the module docstring.
    ``policy``: which graph ops the extension takes (``none``, ``all``,
    ``all_but_first_last``, ``names:a,b``).
    """

    wavelength_channels: int = 64
    modulation_bandwidth_ghz: float = 100.0
    matrix_size_limit: int = 256
    precision_bits: int = 8
    laser_power_mw: float = 10.0
    insertion_loss_db_per_component: float = 0.02
    detector_responsivity_a_per_w: float = 1.0
    mzi_phase_sigma_rad: float = 0.005
    temperature_k: float = 300.0
    load_ohm: float = 1000.0
    shot_noise: bool = True
    thermal_noise: bool = True
    in_bits: int = 16
    det_bits: int = 16
    core_latency_cycles: int = 1
    reprogram_ns: float = 10.0
    laser_wall_plug_efficiency: float = 0.2
    tuning_power_mw_per_mzi: float = 0.0
    program_energy_pj_per_mzi: float = 1.0
    dac_energy_pj: float = 0.5
    adc_energy_pj: float = 1.0
    policy: str = "none"

    def __post_init__(self) -> None:
        parse_policy(self.policy, "PhotonicConfig.policy")
        for n in ("wavelength_channels", "matrix_size_limit", "core_latency_cycles"):
            _pos(self, n, integer=True)
        for n in (
            "modulation_bandwidth_ghz",
            "laser_power_mw",
            "detector_responsivity_a_per_w",
            "temperature_k",
            "load_ohm",
            "laser_wall_plug_efficiency",
        ):
            _pos(self, n)
        for n in (
            "insertion_loss_db_per_component",
            "mzi_phase_sigma_rad",
            "reprogram_ns",
            "tuning_power_mw_per_mzi",
            "program_energy_pj_per_mzi",
            "dac_energy_pj",
            "adc_energy_pj",
        ):
            _pos(self, n, zero_ok=True)
        if (
            isinstance(self.precision_bits, bool)
            or not isinstance(self.precision_bits, int)
            or not 2 <= self.precision_bits <= 16
        ):
            raise ValueError(
                f"PhotonicConfig.precision_bits must be an integer in 2..16, "
                f"got {self.precision_bits!r}"
            )
        # type first: a comparison of a str or float would raise a TypeError naming no field
        for n, lo in (("in_bits", self.precision_bits), ("det_bits", 2)):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= 32:
                low = f"precision_bits ({lo})" if n == "in_bits" else f"{lo}"
                raise ValueError(f"PhotonicConfig.{n} must be an integer in {low}..32, got {v!r}")
        if self.matrix_size_limit > 4096:
            raise ValueError(
                f"PhotonicConfig.matrix_size_limit must be at most 4096, got "
                f"{self.matrix_size_limit}"
            )
        if self.laser_wall_plug_efficiency > 1:
            raise ValueError(
                f"PhotonicConfig.laser_wall_plug_efficiency must be in (0, 1], "
                f"got {self.laser_wall_plug_efficiency}"
            )
        loss_db = self.insertion_loss_db
        if loss_db > MAX_PATH_LOSS_DB:
            # in dB: the delivered power itself may underflow a float
            delivered_dbm = 10 * math.log10(self.laser_power_mw) - loss_db
            raise ValueError(
                f"PhotonicConfig: insertion_loss_db_per_component="
                f"{self.insertion_loss_db_per_component:g} over matrix_size_limit + 3 = "
                f"{self.matrix_size_limit + 3} components is a {loss_db:.4g} dB optical path "
                f"loss, above the {MAX_PATH_LOSS_DB:g} dB at which no usable light reaches "
                f"the detectors (laser_power_mw={self.laser_power_mw:g} would deliver "
                f"{delivered_dbm:.4g} dBm); lower the loss per component or the mesh size"
            )

    @property
    def insertion_loss_db(self) -> float:
        """Loss of one light path: the mesh's columns, the modulator, two couplers (at
        most :data:`MAX_PATH_LOSS_DB`, checked on construction)."""
        return self.insertion_loss_db_per_component * (self.matrix_size_limit + 3)

    @property
    def transmission(self) -> float:
        return 10.0 ** (-self.insertion_loss_db / 10.0)

    def core_params(self) -> PhotonicParams:
        """The front-end model's parameters of this core."""
        return PhotonicParams(
            matrix_size_limit=self.matrix_size_limit,
            precision_bits=self.precision_bits,
            laser_power_mw=self.laser_power_mw,
            insertion_loss_db=self.insertion_loss_db,
            responsivity_a_per_w=self.detector_responsivity_a_per_w,
            mzi_phase_sigma_rad=self.mzi_phase_sigma_rad,
            bandwidth_ghz=self.modulation_bandwidth_ghz,
            temperature_k=self.temperature_k,
            load_ohm=self.load_ohm,
            shot_noise=self.shot_noise,
            thermal_noise=self.thermal_noise,
            det_bits=self.det_bits,
        )

    @classmethod
    def from_extension(cls, ext: DeviceExtension) -> PhotonicConfig:
        """The core described by the photonic extension's parameters."""
        names = {f for f in cls.__dataclass_fields__}
        try:
            return cls(**{k: v for k, v in ext.values.items() if k in names})
        except ValueError as e:  # a parameter value the unit cannot take: one line
            raise SpecError(str(e), field=f"extension {ext.id!r} parameters") from None


@dataclass(frozen=True, kw_only=True)
class PhotonicMatmul:
    """How the product is encoded (the seed's ``wia_photonic_matmul_t``)."""

    input_encoding: PhotonicEncoding = PhotonicEncoding.INTENSITY
    computation_mode: PhotonicMode = PhotonicMode.COHERENT
    output_detection: PhotonicDetection = PhotonicDetection.BALANCED

    def __post_init__(self) -> None:
        for name, enum_ in (
            ("input_encoding", PhotonicEncoding),
            ("computation_mode", PhotonicMode),
            ("output_detection", PhotonicDetection),
        ):
            try:
                object.__setattr__(self, name, enum_(getattr(self, name)))
            except ValueError:
                raise ValueError(
                    f"PhotonicMatmul.{name} must be one of "
                    f"{', '.join(m.value for m in enum_)}, got "
                    f"{getattr(self, name)!r}"
                ) from None
        if (
            self.input_encoding is PhotonicEncoding.PHASE
            and self.computation_mode is PhotonicMode.INCOHERENT
        ):
            raise ValueError(
                "PhotonicMatmul: phase encoding needs coherent computation "
                "(an incoherent mesh adds intensities and loses the phase)"
            )

    @property
    def input_passes(self) -> int:
        return 2 if self.input_encoding is PhotonicEncoding.INTENSITY else 1

    @property
    def weight_passes(self) -> int:
        return 2 if self.computation_mode is PhotonicMode.INCOHERENT else 1


@dataclass
class PhotonicResult:
    """The product and its cost. ``time_ns`` on the photonic core; ``energy_pj`` of the
    core (lasers, tuning, DACs, ADCs, programming); ``adc_shift`` the calibrated gain.
    ``enob``: effective bits delivered at full scale (:func:`photonic_enob`: the
    detectors' noise over the product's passes, the converters' rounding, the ADC's
    step at a full-scale gain, the mesh's phase error); ``effective_bits``: those
    delivered over the range this product's outputs span (its peak ``|y|``, ``y = W x
    / n`` the normalised output summed over passes and tiles along ``K``, against its
    own budget: :func:`_product_bits`; timing-only calls report ``enob``);
    ``precision_bits``: configured. Neither is capped at ``precision_bits``: the
    converters' rounding is in the budget, which leaves at most about
    ``precision_bits`` for one tile's outputs, while the tiles along ``K`` that sum
    into an output average their ADCs' rounding and can deliver more (``log2(tiles) /
    2`` more for outputs that grow with the tiles)."""

    output: np.ndarray = field(repr=False)
    time_ns: float
    latency_ms: float
    energy_pj: float
    energy_per_mac_pj: float
    macs: int
    tiles: int
    passes: int
    adc_shift: int
    device_cycles: int = 0
    precision_bits: int = 8
    enob: float = math.inf
    effective_bits: float = math.inf


def photonic_timing_ns(
    cfg: PhotonicConfig, mm: PhotonicMatmul, m: int, k: int, n: int
) -> tuple[float, int, int]:
    """(time in ns, weight tiles, passes per tile) of an ``m x k`` by ``k x n`` product."""
    s = cfg.matrix_size_limit
    tiles = -(-m // s) * -(-k // s)
    passes = mm.input_passes * mm.weight_passes
    symbols = -(-n // cfg.wavelength_channels) * mm.input_passes
    stream = frontend_matvec_cycles(s, s * symbols, s, cfg.core_latency_cycles)
    per_program = cfg.reprogram_ns + stream / cfg.modulation_bandwidth_ghz
    return tiles * mm.weight_passes * per_program, tiles, passes


def _energy_pj(
    cfg: PhotonicConfig, mm: PhotonicMatmul, time_ns: float, tiles: int, m: int, k: int, n: int
) -> float:
    s = cfg.matrix_size_limit
    busy_s = time_ns * 1e-9
    # P0 is launched toward each of the s outputs on each channel (the core model's
    # normalisation): the optics deliver P0 x transmission to a detector (the noise
    # budget's R P0 L), so the lasers emit s x channels x P0, drawing that over their
    # wall-plug efficiency; the path's loss is in what reaches the detectors, once
    laser_w = (
        cfg.laser_power_mw * 1e-3 * s * cfg.wavelength_channels / cfg.laser_wall_plug_efficiency
    )
    tuning_w = cfg.tuning_power_mw_per_mzi * 1e-3 * s * s
    programs = tiles * mm.weight_passes
    samples_in = programs * s * n * mm.input_passes
    detectors = 2 if mm.output_detection is PhotonicDetection.BALANCED else 1
    samples_out = programs * s * n * mm.input_passes * detectors
    return (
        (laser_w + tuning_w) * busy_s * 1e12
        + samples_in * cfg.dac_energy_pj
        + samples_out * cfg.adc_energy_pj
        + programs * s * s * cfg.program_energy_pj_per_mzi
    )


def _adc_shift(cfg: PhotonicConfig, pass_peak: float) -> int:
    """The ADC's calibrated gain ``2**-shift``: the largest shift at which a pass whose
    ideal output peaks at ``pass_peak`` (units of one tile's full scale) does not saturate
    the ``precision_bits`` codes. Independent of the laser: the detector samples are
    normalised to the unattenuated ``R P0``."""
    _, hi_adc = adc_range(cfg.precision_bits)
    full = cfg.transmission * ((1 << cfg.det_bits) - 1) * max(pass_peak, 1e-12)
    return int(min(cfg.det_bits, max(0, math.ceil(math.log2(full / hi_adc)))))


@dataclass(frozen=True)
class _Spread:
    """What a product's rounding and mesh errors depend on, in units of one tile's full
    scale (``y = W x / n = 1``, ``n = matrix_size_limit``; ``w``, ``x`` the weights and
    inputs scaled into [-1, 1] per row and column, as the DACs see them).

    ``out_peak``: the largest ``|y|`` of the summed outputs (passes and tiles along ``K``
    added: the range the delivered bits are judged over); ``pass_peak``: the largest
    ``|y|`` of any single pass (the ADC's gain is calibrated on it, :func:`_adc_shift`);
    ``tiles``: tiles along ``K`` summed into an output, each with its own detections;
    ``pass_values``: every detection's ideal ``y`` (each pass of each tile of each
    output, ``outputs`` of them in all), which the ADC rounds with the detectors' noise
    on it, or ``None``: each detection's signal spans many ADC steps, its rounding
    ``step**2 / 12``; ``x_sq``, ``w_sq``: the mean over outputs of ``sum_k x_k**2 / n**2`` and
    ``sum_k w_k**2 / n**2`` (the weights' rounding reaches an output through the inputs,
    the inputs' through the weights); ``phase_sq``: the mean of ``sum_k (1 - w_k**2)
    x_k**2 / n**2`` summed over the programmed parts (``W``; ``W+`` and ``W-`` on an
    incoherent mesh, each an MZI per weight with its own phase error)."""

    out_peak: float
    pass_peak: float
    tiles: int
    x_sq: float
    w_sq: float
    phase_sq: float
    pass_values: np.ndarray | None = field(default=None, repr=False)
    outputs: int = 1


def _full_scale(cfg: PhotonicConfig, mm: PhotonicMatmul, fraction: float = 1.0) -> _Spread:
    """The spread the config-level figures assume (:func:`photonic_enob`,
    :func:`laser_power_for_bits`): one tile whose outputs and every pass peak at
    ``fraction`` of full scale (the ADC calibrated for them), each pass's signal spanning
    many ADC steps, and the rounding and phase errors at their largest for any data in [-1, 1] (``x**2
    = w**2 = 1``, ``1 - w**2 = 1``: ``1 / n`` each, per programmed part)."""
    n = cfg.matrix_size_limit
    return _Spread(
        out_peak=fraction,
        pass_peak=fraction,
        tiles=1,
        x_sq=1.0 / n,
        w_sq=1.0 / n,
        phase_sq=mm.weight_passes / n,
    )


def _photonic_product(
    cfg: PhotonicConfig, mm: PhotonicMatmul, a: np.ndarray, b: np.ndarray, seed: int
) -> tuple[np.ndarray, int, _Spread]:
    """The computed ``a @ b`` (float64) through quantisers, optics and noise; the adc
    shift; the product's :class:`_Spread` (what its noise budget depends on)."""
    s = cfg.matrix_size_limit
    p = cfg.precision_bits
    m, k = a.shape
    n = b.shape[1]
    # per-row weight and per-column input scales use each DAC's whole range
    amax = np.abs(a).max(axis=1, keepdims=True)
    amax[amax == 0] = 1.0
    bmax = np.abs(b).max(axis=0, keepdims=True)
    bmax[bmax == 0] = 1.0
    wq = quantize_weights(np.clip(a / amax, -1.0, 1.0), p)
    _, hi = dac_range(p)
    dshift = cfg.in_bits - p
    x_int = np.rint(b / bmax * hi * (1 << dshift)).astype(np.int64)
    codes = dac_quantize(x_int, p, dshift, cfg.in_bits)  # [k, n]
    loss = cfg.transmission
    top = (1 << cfg.det_bits) - 1
    mt, kt = -(-m // s), -(-k // s)
    signs = [1, -1] if mm.input_encoding is PhotonicEncoding.INTENSITY else [0]
    wsigns = [1, -1] if mm.computation_mode is PhotonicMode.INCOHERENT else [0]

    def part(v: np.ndarray, sign: int) -> np.ndarray:
        return v if sign == 0 else np.maximum(sign * v, 0)

    # the ADC gain: the largest shift for which no pass's ideal difference saturates
    x_norm = codes / hi
    peak, out_peak, values = 0.0, 0.0, []
    for mb in range(mt):
        total = 0.0
        for kb in range(kt):
            w = wq[mb * s : (mb + 1) * s, kb * s : (kb + 1) * s]
            xs = x_norm[kb * s : (kb + 1) * s]
            for ws in wsigns:
                for xsign in signs:
                    y = part(w, ws) @ part(xs, xsign) / s
                    peak = max(peak, float(np.abs(y).max()))
                    values.append(y.ravel())
                    total = total + (1 if ws >= 0 else -1) * (1 if xsign >= 0 else -1) * y
        out_peak = max(out_peak, float(np.abs(total).max()))
    shift = _adc_shift(cfg, peak)
    # the errors' reach (see _Spread): mean squares of the scaled operands, per k
    x2 = (x_norm**2).mean(axis=1)  # over outputs' columns
    w2 = (wq**2).mean(axis=0)  # over outputs' rows
    rest = sum((1.0 - part(wq, ws) ** 2).mean(axis=0) for ws in wsigns)
    spread = _Spread(
        out_peak=out_peak,
        pass_peak=peak,
        tiles=kt,
        x_sq=float(x2.sum()) / s**2,
        w_sq=float(w2.sum()) / s**2,
        phase_sq=float(rest @ x2) / s**2,
        pass_values=np.concatenate(values),
        outputs=m * n,
    )
    core = PhotonicCore(params=cfg.core_params(), seed=seed)
    bias = round(loss * top)
    result = np.zeros((mt * s, n), dtype=np.int64)

    def detect(xv: np.ndarray) -> np.ndarray:
        dp, dn = core.detect(xv)
        if mm.output_detection is PhotonicDetection.BALANCED:
            diff = balanced_subtract(dp, dn, cfg.det_bits)
        else:
            diff = 2 * np.asarray(dp, dtype=np.int64) - bias
        return adc_quantize(diff, p, shift)

    for mb in range(mt):
        partial: list[np.ndarray] = []
        for kb in range(kt):
            w = wq[mb * s : (mb + 1) * s, kb * s : (kb + 1) * s]
            xs = codes[kb * s : (kb + 1) * s]
            tile = np.zeros((s, n), dtype=np.int64)
            for ws in wsigns:
                core.program(part(w, ws))
                for xsign in signs:
                    xin = part(xs, xsign)
                    for j in range(n):
                        code = detect(xin[:, j] / hi)
                        tile[:, j] += (1 if ws >= 0 else -1) * (1 if xsign >= 0 else -1) * code
            partial.append(tile)
        result[mb * s : (mb + 1) * s] = np.stack(
            [accumulate_tiles([t[:, j] for t in partial]) for j in range(n)], axis=1
        )
    scale = (1 << shift) * s / (loss * top)
    return result[:m].astype(np.float64) * scale * amax * bmax, shift, spread


def photonic_matmul(
    ctx: Any,
    cfg: PhotonicConfig,
    mm: PhotonicMatmul,
    A: np.ndarray,  # noqa: N803
    B: np.ndarray,
    C: np.ndarray | None = None,
    stream: Any = None,
    *,  # noqa: N803
    seed: int = 0,
    functional: bool = True,
) -> PhotonicResult:
    """``C = A @ B`` on the photonic core (the seed's ``wia_photonic_matmul``).

    ``A`` (``M x K``) and ``B`` (``K x N``) are real matrices; matrices larger than the
    mesh are tiled. ``C``, if given, receives the result. Noise is drawn from ``seed``
    (same seed, same result). On a context the product also runs on its device: A and
    B are read through the memory hierarchy, the photonic core's time passes, C is
    written back, and the counters count the MACs with the core's energy. ``ctx`` may be
    ``None`` (the model alone). ``functional=False`` computes time and energy only
    (``output`` is then empty and ``C`` untouched). Raises :class:`~wia_hw.WorkloadError`
    on shape mismatch.
    """
    if not isinstance(cfg, PhotonicConfig):
        raise TypeError(f"cfg must be a PhotonicConfig, got {type(cfg).__name__}")
    if not isinstance(mm, PhotonicMatmul):
        raise TypeError(f"mm must be a PhotonicMatmul, got {type(mm).__name__}")
    a, b = product_operands("photonic_matmul", A, B)
    enob = photonic_enob(cfg, mm)
    if functional:
        out, shift, spread = _photonic_product(cfg, mm, a, b, seed)
        eff = _product_bits(cfg, mm, spread)
    else:
        out, shift, eff = np.zeros((0, 0)), 0, enob
    _warn_precision(cfg, mm, enob, eff)
    if C is not None and functional:
        write_product("photonic_matmul", C, out)
    m, k = a.shape
    n = b.shape[1]
    time_ns, tiles, passes = photonic_timing_ns(cfg, mm, m, k, n)
    energy = _energy_pj(cfg, mm, time_ns, tiles, m, k, n)
    macs = m * k * n
    res = PhotonicResult(
        output=out,
        time_ns=time_ns,
        latency_ms=time_ns * 1e-6,
        energy_pj=energy,
        energy_per_mac_pj=energy / macs,
        macs=macs,
        tiles=tiles,
        passes=passes,
        adc_shift=shift,
        precision_bits=cfg.precision_bits,
        enob=enob,
        effective_bits=eff,
    )
    if ctx is not None:
        ensure_unit(ctx, ExtensionId.PHOTONIC)
        res.device_cycles = run_offchip_unit(
            ctx,
            "photonic",
            "photonic_matmul",
            m,
            k,
            n,
            2,
            time_ns,
            macs,
            energy,
            {"photonic_time_ns": time_ns, "energy_per_mac_pj": energy / macs, "tiles": tiles},
        )
    return res


# -- precision delivered: the detectors' and converters' noise budget ----------------------


def _passes(mm: PhotonicMatmul) -> int:
    """Detections summed into one output per tile: ``x+``/``x-`` of an intensity
    encoding times ``W+``/``W-`` of an incoherent mesh (1 to 4)."""
    return mm.input_passes * mm.weight_passes


def _noise_terms(
    cfg: PhotonicConfig, mm: PhotonicMatmul | None, spread: _Spread | None = None
) -> tuple[float, float, float, float]:
    """``(c, a, b, d)`` in SI units: a full-scale output (``y = 1``) is the current
    ``c * P0`` and the noise variance of one output of a product with ``spread`` (default
    :func:`_full_scale`), every pass, tile and converter counted, is ``a * P0 + b + d *
    P0**2`` (``P0`` in W).

    Per detection (a pass of a tile along ``K``: :func:`_passes` times
    ``spread.tiles``, independent and summed, so their variances add while the signal
    they split does not grow): the detectors' shot noise (``a``, at ``y = 0``) and
    thermal noise (``b``), and the rounding of their ``det_bits`` samples of the
    unattenuated ``R P0`` (``step**2 / 12`` each, a step ``R P0 / (2**det_bits - 1)``).
    Per detection too, the ADC's rounding of the integer difference to multiples of
    ``2**shift`` samples (``(4**shift - 1) / 12`` sample steps squared, a signal
    spanning many steps; ``shift`` calibrated on ``spread.pass_peak``, so its step is
    fixed against the product's peak, not against full scale); for a product with
    ``spread.pass_values`` it is left out here and counted from the values by
    :func:`_adc_read_var`. Once per product (before
    the passes split it): the rounding of the weights (``quantize_weights``) and of the
    inputs (``in_bits`` samples re-rounded to DAC codes, one rounding to the codes' step
    in all) to ``precision_bits`` codes, a step ``1 / (2**(precision_bits - 1) - 1)`` of
    their [-1, 1] range, ``step**2 / 12`` each, reaching an output through ``y = W x /
    n`` as ``step**2 / 12 * spread.x_sq`` and ``* spread.w_sq``; and the MZIs' static
    phase error, ``cos(theta + e) - cos(theta) ~ -sin(theta) e`` with ``sin(theta)**2 =
    1 - w**2``: ``mzi_phase_sigma_rad**2 * spread.phase_sq``. All but shot and thermal
    noise are in ``d``: they grow with the light like the signal, so no laser beats
    them."""
    mm = PhotonicMatmul() if mm is None else mm
    sp = _full_scale(cfg, mm) if spread is None else spread
    detections = _passes(mm) * sp.tiles
    bw_hz = cfg.modulation_bandwidth_ghz * 1e9
    r = cfg.detector_responsivity_a_per_w
    c = r * cfg.transmission
    shot = 2 * _Q * c * bw_hz if cfg.shot_noise else 0.0  # one arm at y=0 carries c P0 / 2
    thermal = 4 * _KB * cfg.temperature_k * bw_hz / cfg.load_ohm if cfg.thermal_noise else 0.0
    lsb2 = (r / ((1 << cfg.det_bits) - 1)) ** 2  # one detector sample step, per W, squared
    det = lsb2 / 12  # one sample's rounding
    if mm.output_detection is PhotonicDetection.SINGLE:  # one arm doubled: 4x its variance
        a, b, d = 4 * shot / 2, 4 * thermal, 4 * det
    else:  # balanced: the two arms' variances add
        a, b, d = shot, 2 * thermal, 2 * det
    shift = _adc_shift(cfg, sp.pass_peak)
    # a known product's ADC reads are counted from its values (_adc_read_var)
    adc = lsb2 * ((1 << (2 * shift)) - 1) / 12 if sp.pass_values is None else 0.0
    step = 1.0 / dac_range(cfg.precision_bits)[1]
    mesh = step**2 / 12 * (sp.x_sq + sp.w_sq) + cfg.mzi_phase_sigma_rad**2 * sp.phase_sq
    return c, detections * a, detections * b, detections * (d + adc) + c**2 * mesh


def photonic_snr(
    cfg: PhotonicConfig, mm: PhotonicMatmul | None = None, *, signal_fraction: float = 1.0
) -> float:
    """Signal-to-noise ratio (linear, power) of one output of a product (one tile):
    a sine of amplitude ``signal_fraction`` of full scale (``y = 1``: current ``R P0
    L``) against the noise budget of :func:`_noise_terms` (the detectors' shot noise,
    ``2 q I B`` per arm, and thermal noise, ``4 k T B / R_load`` per arm, ``B =
    modulation_bandwidth_ghz``, and the rounding of their ``det_bits`` samples and of
    the ADC's codes, all once per pass of ``mm``, default :class:`PhotonicMatmul`:
    intensity encoding, two passes; the DAC codes' rounding of weights and inputs and
    the mesh's phase error at their largest), the ADC's gain calibrated for outputs
    peaking at ``signal_fraction``: ``SNR = (f R P0 L)**2 / 2 / sigma**2``. Balanced
    detection sums both arms' variances (the shot part is then independent of ``y``);
    single detection doubles one arm (4x its variance). Infinite without noise."""
    spread = _full_scale(cfg, PhotonicMatmul() if mm is None else mm, signal_fraction)
    c, a, b, d = _noise_terms(cfg, mm, spread)
    p0 = cfg.laser_power_mw * 1e-3
    var = a * p0 + b + d * p0**2
    sig = (signal_fraction * c * p0) ** 2 / 2
    return math.inf if var == 0 else sig / var


def _snr_bits(snr: float) -> float:
    if snr <= 0:
        return -math.inf
    return math.inf if math.isinf(snr) else (10 * math.log10(snr) - 1.76) / 6.02


def photonic_enob(
    cfg: PhotonicConfig, mm: PhotonicMatmul | None = None, *, signal_fraction: float = 1.0
) -> float:
    """Effective number of bits delivered: ``(SNR_dB - 1.76) / 6.02`` with
    :func:`photonic_snr` (full scale unless ``signal_fraction`` < 1: outputs spanning a
    fraction ``f`` of full scale get up to ``log2(1 / f)`` bits fewer, fewer than that
    where the ADC's gain shift recovers some). ``mm`` (default :class:`PhotonicMatmul`)
    sets the passes: phase encoding one, intensity encoding two (half a bit fewer),
    intensity on an incoherent mesh four (one bit fewer)."""
    return _snr_bits(photonic_snr(cfg, mm, signal_fraction=signal_fraction))


def _converter_bits(
    cfg: PhotonicConfig, mm: PhotonicMatmul | None, signal_fraction: float = 1.0
) -> float:
    """The bits the converters' rounding and the mesh's phase error alone leave (any
    laser power) for outputs spanning ``signal_fraction`` of full scale."""
    spread = _full_scale(cfg, PhotonicMatmul() if mm is None else mm, signal_fraction)
    c, _, _, d = _noise_terms(cfg, mm, spread)
    return _snr_bits(math.inf if d == 0 else (signal_fraction * c) ** 2 / 2 / d)


def _erfc(x: np.ndarray) -> np.ndarray:
    """``erfc`` elementwise (Abramowitz and Stegun 7.1.26, absolute error below 1.5e-7:
    ample for probabilities of a rounding's codes; numpy has none)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    r = poly * np.exp(-z * z)
    return np.where(x >= 0, r, 2.0 - r)


def _adc_read_var(values: np.ndarray, noise: float, step: float) -> float:
    """The summed mean square of ``Q(y + e) - y - e`` over the ideal ``values`` ``y``,
    ``e`` Gaussian noise of variance ``noise`` and ``Q`` rounding to a grid of
    ``step`` (all in one unit): what an ADC adds to the noise of detections reading
    ``values``. ``step**2 / 12`` each once the noise spans steps (Sheppard); short of
    that it depends on where the values fall: a value well within half a step of a code,
    undithered, is read as that code (an error of its own distance to it, the noise
    rounded away with it). Exactly ``sum_k (k step - y)**2 P(Q = k step) - noise``."""
    sigma = math.sqrt(noise)
    if sigma >= 3 * step:
        return values.size * step**2 / 12
    u = values / step
    if sigma == 0:
        return float(np.sum((np.rint(u) - u) ** 2)) * step**2
    sd = sigma / step
    j = np.arange(-math.ceil(8 * sd) - 1, math.ceil(8 * sd) + 2)
    total = 0.0
    for chunk in np.array_split(u, max(1, u.size * j.size // 4_000_000)):
        k = np.rint(chunk)[:, None] + j[None, :]
        edge = np.sqrt(2) * sd
        prob = 0.5 * (
            _erfc((k - 0.5 - chunk[:, None]) / edge) - _erfc((k + 0.5 - chunk[:, None]) / edge)
        )
        total += float(np.sum((k - chunk[:, None]) ** 2 * prob))
    return total * step**2 - values.size * noise


def _product_bits(cfg: PhotonicConfig, mm: PhotonicMatmul, spread: _Spread) -> float:
    """The bits delivered over the range a product's outputs span: its peak ``|y|``
    (``spread.out_peak``, units of one tile's full scale, up to the tiles along ``K``
    summed) against its own noise budget (:func:`_noise_terms` with ``spread``: each
    tile's detections, the ADC's step at this product's gain, the DAC rounding and
    phase error its operands see). A product of zeros reports :func:`photonic_enob`."""
    if spread.out_peak <= 0:
        return photonic_enob(cfg, mm)
    c, a, b, d = _noise_terms(cfg, mm, spread)
    p0 = cfg.laser_power_mw * 1e-3
    var = a * p0 + b + d * p0**2
    shift = _adc_shift(cfg, spread.pass_peak)
    if spread.pass_values is not None and shift > 0:
        # the ADC's reads of this product's values, in units of y = 1 (current c P0)
        # under one detection's noise (shot, thermal, its samples' rounding)
        lsb = 1.0 / (cfg.transmission * ((1 << cfg.det_bits) - 1))
        samples = 2 if mm.output_detection is PhotonicDetection.BALANCED else 4
        detections = _passes(mm) * spread.tiles
        noise = (a * p0 + b) / detections / (c * p0) ** 2 + samples * lsb**2 / 12
        adc = _adc_read_var(spread.pass_values, noise, (1 << shift) * lsb)
        var += adc / spread.outputs * (c * p0) ** 2
    sig = (spread.out_peak * c * p0) ** 2 / 2
    return _snr_bits(math.inf if var == 0 else sig / var)


def laser_power_for_bits(
    cfg: PhotonicConfig,
    mm: PhotonicMatmul | None = None,
    *,
    bits: float | None = None,
    signal_fraction: float = 1.0,
) -> float:
    """The laser power (mW per output and channel, ``laser_power_mw``) at which
    :func:`photonic_enob` reaches ``bits`` (default ``precision_bits``) for outputs
    spanning ``signal_fraction`` of full scale, with ``mm``'s passes (default
    :class:`PhotonicMatmul`): the root of ``(f c P)**2 / 2 = SNR (a P + b + d P**2)``
    (:func:`_noise_terms`; the ADC's gain calibrated for outputs and passes peaking at
    ``signal_fraction``, the DAC rounding and phase error at their largest). Raises
    ValueError for a fraction outside (0, 1], for ``bits`` not a finite number,
    when the converters' rounding and the mesh's phase error alone leave fewer than
    ``bits`` (they grow with the light like the signal: no laser power helps; the
    message says how many bits they leave), or when no finite laser power reaches ``bits`` (the power would overflow)."""
    if (
        isinstance(signal_fraction, bool)
        or not isinstance(signal_fraction, (int, float))
        or not 0 < signal_fraction <= 1
    ):
        raise ValueError(f"signal_fraction must be in (0, 1], got {signal_fraction!r}")
    bits = cfg.precision_bits if bits is None else bits
    if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not math.isfinite(bits):
        raise ValueError(f"bits must be a finite number, got {bits!r}")
    spread = _full_scale(cfg, PhotonicMatmul() if mm is None else mm, signal_fraction)
    c, a, b, d = _noise_terms(cfg, mm, spread)
    try:
        snr = 10 ** ((6.02 * bits + 1.76) / 10)
        # (f c)**2 / 2 - SNR d: the signal's P**2 coefficient less the converters'
        lead = (signal_fraction * c) ** 2 / 2 - snr * d
        if lead <= 0:
            conv = _converter_bits(cfg, mm, signal_fraction)
            raise ValueError(
                f"no finite laser power reaches {bits:g} bits at signal_fraction="
                f"{signal_fraction:g}: the converters' rounding alone leaves {conv:.2f} bits "
                f"(precision_bits={cfg.precision_bits} DAC and ADC codes, the ADC at gain "
                f"2**-{_adc_shift(cfg, signal_fraction)}; det_bits={cfg.det_bits} detector "
                f"samples over the unattenuated laser power, a {cfg.insertion_loss_db:.4g} dB "
                f"path loss; mzi_phase_sigma_rad={cfg.mzi_phase_sigma_rad:g}); raise "
                "precision_bits or det_bits, or lower the loss"
            )
        p_w = (snr * a + math.sqrt((snr * a) ** 2 + 4 * lead * snr * b)) / (2 * lead)
    except (OverflowError, ZeroDivisionError):
        p_w = math.inf
    if not math.isfinite(p_w):
        raise ValueError(
            f"no finite laser power reaches {bits:g} bits at signal_fraction="
            f"{signal_fraction:g} with a {cfg.insertion_loss_db:.4g} dB path loss"
        )
    return p_w * 1e3


@dataclass(frozen=True)
class LaserSizing:
    """The laser power a product needs for ``bits`` and what it costs."""

    bits: float
    laser_power_mw: float
    enob: float
    energy_pj: float
    energy_per_mac_pj: float


def size_laser_power(
    cfg: PhotonicConfig,
    mm: PhotonicMatmul,
    m: int,
    k: int,
    n: int,
    *,
    bits: float | None = None,
    signal_fraction: float = 1.0,
) -> LaserSizing:
    """Size ``laser_power_mw`` for ``bits`` (default ``precision_bits``) with
    :func:`laser_power_for_bits` and report the energy of an ``m x k`` by ``k x n``
    product at that power (the module's energy model, lasers included)."""
    bits = cfg.precision_bits if bits is None else bits
    p = laser_power_for_bits(cfg, mm, bits=bits, signal_fraction=signal_fraction)
    sized = replace(cfg, laser_power_mw=p)
    time_ns, tiles, _ = photonic_timing_ns(sized, mm, m, k, n)
    e = _energy_pj(sized, mm, time_ns, tiles, m, k, n)
    return LaserSizing(bits, p, photonic_enob(sized, mm), e, e / (m * k * n))


def _warn_precision(cfg: PhotonicConfig, mm: PhotonicMatmul, enob: float, eff: float) -> None:
    """One PhotonicPrecisionWarning per configuration (the text depends on the
    configuration only, so Python's default filter shows it once) when the bits
    delivered over a product's range (``eff``) fall short of ``precision_bits``. The
    text gives the bits at full scale (``enob``) and what would reach
    ``precision_bits`` there: a laser power, or nothing when the converters' rounding
    and the mesh's phase error alone leave fewer (always so for one tile: the ADC's
    rounding alone leaves a little under ``precision_bits``)."""
    if eff >= cfg.precision_bits:
        return
    p = cfg.laser_power_mw
    snr = photonic_snr(cfg, mm)
    snr_text = f"{10 * math.log10(snr):.1f} dB" if snr > 0 else "no signal"
    conv = _converter_bits(cfg, mm)
    if conv < cfg.precision_bits:
        need = (
            f"no laser power reaches {cfg.precision_bits} bits: the precision_bits="
            f"{cfg.precision_bits} DAC and ADC codes (the ADC at gain "
            f"2**-{_adc_shift(cfg, 1.0)}), the det_bits={cfg.det_bits} detector samples "
            f"and the mesh's phase error alone leave {conv:.2f} bits"
        )
    else:
        try:
            need = (
                f"laser_power_mw={laser_power_for_bits(cfg, mm):.3g} would reach "
                f"{cfg.precision_bits} bits"
            )
        except ValueError:
            need = f"no finite laser power reaches {cfg.precision_bits} bits"
    msg = (
        f"photonic core configured for precision_bits={cfg.precision_bits} delivers "
        f"{enob:.2f} effective bits at full scale: the detectors' shot and thermal "
        f"noise over {_passes(mm)} pass(es) at laser_power_mw={p:g}, the converters' "
        f"rounding and the mesh's phase error leave an SNR of {snr_text} ({need} at full "
        "scale; outputs spanning less of it get fewer: PhotonicResult.effective_bits)"
    )
    warnings.warn(msg, PhotonicPrecisionWarning, stacklevel=3)


# -- graph routing ---------------------------------------------------------------------


def photonic_linear(op: Op, graph: Graph, spec: Any, storage: Any, ext: DeviceExtension) -> Any:
    """The photonic extension's graph operation (claims ``linear``, ``matmul``,
    ``conv2d``): the ops its ``policy`` parameter selects run on the optical core, the
    others decline (``None``: the built-in lowering runs them).

    ``X @ W`` is computed as ``(W^T X^T)^T``: the weights are the mesh's matrix, the
    rows of ``X`` stream through it as input vectors (coherent mesh, intensity
    encoding, balanced detection: the seed's ``wia_photonic_matmul_t``). Time and energy
    are :func:`photonic_timing_ns` and the module's energy model per GEMM (a conv2d's
    groups one after another); functional mode computes the product through the
    optics and its noise, seeded per run, op and batch entry."""
    cfg = PhotonicConfig.from_extension(ext)
    if op.kind not in _CLAIMS or not policy_selects(cfg.policy, op, graph, "photonic"):
        return None
    mm = PhotonicMatmul()
    ins, _ = graph.shapes_of(op)
    dims = gemm_dims(op, ins)
    batch, m, n, k = dims
    t_ns, tiles, _ = photonic_timing_ns(cfg, mm, n, k, m)
    energy = _energy_pj(cfg, mm, t_ns, tiles, n, k, m)
    enob = photonic_enob(cfg, mm)

    def unit_gemm(a: np.ndarray, b: np.ndarray, seed: int) -> np.ndarray:
        out, _, spread = _photonic_product(cfg, mm, np.asarray(b).T, np.asarray(a).T, seed)
        _warn_precision(cfg, mm, enob, _product_bits(cfg, mm, spread))
        return out.T

    extra = {
        "photonic_time_ns": batch * t_ns,
        "tiles": batch * tiles,
        "unit_energy_pj": batch * energy,
        "unit_macs": batch * m * n * k,
    }
    return [
        gemm_unit_kernel(
            op,
            graph,
            spec,
            storage,
            "photonic",
            dims,
            batch * t_ns,
            batch * energy,
            extra,
            unit_gemm,
        )
    ]
