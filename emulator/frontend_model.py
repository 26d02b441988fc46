"""Photonic/analog matmul core: digital front-end golden model, timing and core model.

An optical (or analog) core computes matrix-vector products on at most
``matrix_size_limit`` x ``matrix_size_limit`` elements at a time. Its digital front-end
(``wia_hw.rtl.FrontEnd``, checked against this module bit for bit and cycle for cycle)
does four things, each a function here:

1. :func:`dac_quantize`: an input sample (signed ``in_bits`` integer) becomes a DAC code
   of ``precision_bits``: ``clamp(round_half_up(x / 2**dac_shift), -(2**(p-1) - 1),
   2**(p-1) - 1)``. The range is symmetric because a modulator encodes ``+v`` and
   ``-v`` alike; out-of-range inputs clamp.
2. :func:`balanced_subtract`: the two photodiodes of a balanced detector are sampled as
   unsigned ``det_bits`` integers; the signed result is ``det_p - det_n``.
3. :func:`adc_quantize`: that difference becomes an ADC code of ``precision_bits``:
   ``saturate(round_half_up(d / 2**adc_shift), -2**(p-1), 2**(p-1) - 1)`` (two's
   complement range; out-of-range values saturate).
4. :func:`accumulate_tiles`: when ``K > matrix_size_limit`` the product is computed in
   ``ceil(K / matrix_size_limit)`` partial tiles whose ADC codes are summed digitally in
   a signed ``acc_bits`` accumulator (wrapping; it cannot wrap below 2**24 tiles).

``round_half_up(v / 2**s)`` is ``(v + (2**s >> 1)) >> s`` with an arithmetic shift
(exact integers, ties toward +infinity).

Timing (integer cycles; edge 0 = the rising edge that samples the input):

- DAC: a sample taken at edge 0 is on ``dac_out`` in cycle :data:`DAC_LATENCY_CYCLES` (1).
- ADC path: input register, subtraction, quantiser, accumulator: partial tiles streamed
  one per cycle, the first sampled at edge 0, give the accumulated result in cycle
  :func:`frontend_cycles` ``(tiles) = tiles + ADC_LATENCY_CYCLES - 1``.
- A whole matrix-vector product: :func:`frontend_matvec_cycles`.

The optical core itself is :class:`PhotonicCore` (MZI mesh with phase errors, insertion
loss, detector responsivity, shot and thermal noise, all seeded): the cocotb testbench
drives the RTL with it, and the photonic extension computes with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "DAC_LATENCY_CYCLES",
    "ADC_LATENCY_CYCLES",
    "dac_range",
    "adc_range",
    "round_shift",
    "dac_quantize",
    "balanced_subtract",
    "adc_quantize",
    "accumulate_tiles",
    "quantize_weights",
    "frontend_tiles",
    "frontend_cycles",
    "frontend_matvec_cycles",
    "PhotonicParams",
    "PhotonicCore",
    "FrontendConfig",
    "FrontendTrace",
    "frontend_matvec",
]

#: Cycles from sampling a DAC input to its code on ``dac_out``.
DAC_LATENCY_CYCLES = 1
#: Register stages after the sampling edge on the ADC path: subtraction, quantiser,
#: accumulator.
ADC_LATENCY_CYCLES = 3

_Q = 1.602176634e-19  # electron charge, C
_KB = 1.380649e-23  # Boltzmann constant, J/K


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return int(value)


def dac_range(precision_bits: int) -> tuple[int, int]:
    """``(lo, hi)`` of a DAC code: ``(-(2**(p-1) - 1), 2**(p-1) - 1)``."""
    p = _int("precision_bits", precision_bits, 2, 16)
    return -((1 << (p - 1)) - 1), (1 << (p - 1)) - 1


def adc_range(precision_bits: int) -> tuple[int, int]:
    """``(lo, hi)`` of an ADC code: ``(-2**(p-1), 2**(p-1) - 1)``."""
    p = _int("precision_bits", precision_bits, 2, 16)
    return -(1 << (p - 1)), (1 << (p - 1)) - 1


def round_shift(v: np.ndarray | int, shift: int) -> np.ndarray:
    """``round_half_up(v / 2**shift)`` on integers: ``(v + (2**shift >> 1)) >> shift``."""
    s = _int("shift", shift, 0, 62)
    v = np.asarray(v, dtype=np.int64)
    return (v + ((1 << s) >> 1)) >> s


def dac_quantize(
    x: np.ndarray | int, precision_bits: int, shift: int, in_bits: int = 16
) -> np.ndarray:
    """DAC codes of signed ``in_bits`` samples ``x`` (see the module docstring)."""
    ib = _int("in_bits", in_bits, 2, 32)
    _int("shift", shift, 0, ib)
    x = np.asarray(x, dtype=np.int64)
    if x.size and (x.min() < -(1 << (ib - 1)) or x.max() >= 1 << (ib - 1)):
        raise ValueError(f"DAC input outside signed {ib}-bit range: [{x.min()}, {x.max()}]")
    lo, hi = dac_range(precision_bits)
    return np.clip(round_shift(x, shift), lo, hi)


def balanced_subtract(
    det_p: np.ndarray | int, det_n: np.ndarray | int, det_bits: int = 16
) -> np.ndarray:
    """``det_p - det_n`` of two unsigned ``det_bits`` detector samples."""
    db = _int("det_bits", det_bits, 2, 32)
    p = np.asarray(det_p, dtype=np.int64)
    n = np.asarray(det_n, dtype=np.int64)
    for name, v in (("det_p", p), ("det_n", n)):
        if v.size and (v.min() < 0 or v.max() >= 1 << db):
            raise ValueError(f"{name} outside unsigned {db}-bit range: [{v.min()}, {v.max()}]")
    return p - n


def adc_quantize(diff: np.ndarray | int, precision_bits: int, shift: int) -> np.ndarray:
    """ADC codes of balanced-detector differences (see the module docstring)."""
    lo, hi = adc_range(precision_bits)
    return np.clip(round_shift(diff, shift), lo, hi)


def accumulate_tiles(codes: Sequence[np.ndarray], acc_bits: int = 32) -> np.ndarray:
    """Sum of the partial tiles' ADC codes in a signed ``acc_bits`` wrapping accumulator."""
    ab = _int("acc_bits", acc_bits, 8, 64)
    if len(codes) == 0:
        raise ValueError("accumulate_tiles needs at least one partial tile")
    total = np.sum(np.asarray(codes, dtype=np.int64), axis=0)
    half = 1 << (ab - 1)
    return (total + half) % (1 << ab) - half


def quantize_weights(w: np.ndarray, precision_bits: int) -> np.ndarray:
    """Weights in [-1, 1] rounded to the ``precision_bits`` grid of the phase DACs."""
    _, hi = dac_range(precision_bits)
    w = np.asarray(w, dtype=np.float64)
    if w.size and (np.abs(w).max() > 1 or not np.isfinite(w).all()):
        raise ValueError("weights must be finite and within [-1, 1]")
    return np.round(w * hi) / hi


def frontend_tiles(k: int, matrix_size_limit: int) -> int:
    """Partial tiles along the reduction: ``ceil(k / matrix_size_limit)``."""
    k = _int("k", k, 1, 1 << 40)
    n = _int("matrix_size_limit", matrix_size_limit, 1, 1 << 20)
    return -(-k // n)


def frontend_cycles(tiles: int) -> int:
    """Cycles of the ADC path for one output group of ``tiles`` partial tiles.

    The partial tiles' detector samples are sampled at edges ``0 .. tiles-1``; the
    accumulated result (``acc_valid``) is high in cycle ``tiles + ADC_LATENCY_CYCLES - 1``.
    """
    t = _int("tiles", tiles, 1, 1 << 40)
    return t + ADC_LATENCY_CYCLES - 1


def frontend_matvec_cycles(
    rows: int, k: int, matrix_size_limit: int, core_latency_cycles: int = 1
) -> int:
    """Cycles of a ``rows x k`` matrix times a vector through DAC, core and ADC path.

    ``ceil(rows/N) * ceil(k/N)`` tiles stream one per cycle; tile ``t``'s DAC inputs are
    sampled at edge ``t``, its codes appear after :data:`DAC_LATENCY_CYCLES`, the core
    settles in ``core_latency_cycles`` (>= 1), its detector samples are sampled at edge
    ``DAC_LATENCY_CYCLES + core_latency_cycles + t``; the ADC path then takes
    :func:`frontend_cycles` ``(tiles)`` from the first sample to the last group's
    result (``ADC_LATENCY_CYCLES`` after the last sample).
    """
    lat = _int("core_latency_cycles", core_latency_cycles, 1, 1 << 20)
    tiles = frontend_tiles(rows, matrix_size_limit) * frontend_tiles(k, matrix_size_limit)
    return DAC_LATENCY_CYCLES + lat + frontend_cycles(tiles)


# ---- the optical core ------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PhotonicParams:
    """Physical parameters of the photonic core (SI-prefixed units in the names).

    Each of the ``N`` outputs is a balanced detector pair. For a normalised result
    ``y = (W_eff @ x) / N`` in [-1, 1] the two arms receive optical powers
    ``P0 * L * (1 +- y) / 2`` with ``P0 = laser_power_mw`` and
    ``L = 10 ** (-insertion_loss_db / 10)``; photocurrent ``I = responsivity * P``; shot
    noise ``sqrt(2 q I B)`` and thermal noise ``sqrt(4 k T B / load_ohm)`` (standard
    deviations, independent per arm and sample, ``B = bandwidth_ghz``). A detector sample
    is ``round(I / (responsivity * P0) * (2**det_bits - 1))`` clipped to the unsigned
    range. Weights are realised by MZIs, ``w = cos(theta)``; every MZI has a static phase
    error drawn once per programmed matrix from ``N(0, mzi_phase_sigma_rad)``.
    """

    matrix_size_limit: int = 64
    precision_bits: int = 8
    laser_power_mw: float = 1.0
    insertion_loss_db: float = 3.0
    responsivity_a_per_w: float = 1.0
    mzi_phase_sigma_rad: float = 0.005
    bandwidth_ghz: float = 10.0
    temperature_k: float = 300.0
    load_ohm: float = 50.0
    shot_noise: bool = True
    thermal_noise: bool = True
    det_bits: int = 16

    def __post_init__(self) -> None:
        _int("matrix_size_limit", self.matrix_size_limit, 1, 4096)
        _int("precision_bits", self.precision_bits, 2, 16)
        _int("det_bits", self.det_bits, 2, 32)
        for name in (
            "laser_power_mw",
            "responsivity_a_per_w",
            "bandwidth_ghz",
            "temperature_k",
            "load_ohm",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        for name in ("insertion_loss_db", "mzi_phase_sigma_rad"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")

    @property
    def ideal(self) -> PhotonicParams:
        """The same core without noise or phase error."""
        from dataclasses import replace

        return replace(self, mzi_phase_sigma_rad=0.0, shot_noise=False, thermal_noise=False)


@dataclass
class PhotonicCore:
    """The optical matmul core with seeded noise (``numpy.random.Generator(seed)``).

    :meth:`program` sets an ``n x n`` weight tile (``n = matrix_size_limit``) and draws its
    MZI phase errors; :meth:`detect` returns the two detector samples of each output for
    one normalised input vector. The same seed and call sequence give the same samples.
    """

    params: PhotonicParams = field(default_factory=PhotonicParams)
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)
    _w_eff: np.ndarray | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    @property
    def size(self) -> int:
        return self.params.matrix_size_limit

    def program(self, w: np.ndarray) -> np.ndarray:
        """Program a weight tile (values in [-1, 1], at most ``N x N``, zero-padded).

        Returns the effective weights ``cos(arccos(w) + phase_error)`` that the core uses.
        """
        n = self.size
        w = np.asarray(w, dtype=np.float64)
        if w.ndim != 2 or w.shape[0] > n or w.shape[1] > n:
            raise ValueError(f"weight tile must be at most {n}x{n}, got shape {w.shape}")
        if w.size and (np.abs(w).max() > 1 or not np.isfinite(w).all()):
            raise ValueError("weights must be finite and within [-1, 1]")
        full = np.zeros((n, n))
        full[: w.shape[0], : w.shape[1]] = w
        theta = np.arccos(full)
        sigma = self.params.mzi_phase_sigma_rad
        if sigma > 0:
            theta = theta + self._rng.normal(0.0, sigma, theta.shape)
        self._w_eff = np.cos(theta)
        return self._w_eff.copy()

    def detect(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Detector samples ``(det_p, det_n)`` (unsigned ``det_bits`` ints, length ``N``)
        for a normalised input vector ``x`` (values in [-1, 1], at most ``N``, zero-padded).
        """
        if self._w_eff is None:
            raise RuntimeError("program() a weight tile before detect()")
        p = self.params
        n = self.size
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 1 or x.shape[0] > n:
            raise ValueError(f"input vector must have at most {n} elements, got shape {x.shape}")
        if x.size and np.abs(x).max() > 1:
            raise ValueError("normalised inputs must be within [-1, 1]")
        xf = np.zeros(n)
        xf[: x.shape[0]] = x
        y = np.clip(self._w_eff @ xf / n, -1.0, 1.0)
        p0_w = p.laser_power_mw * 1e-3
        loss = 10.0 ** (-p.insertion_loss_db / 10.0)
        bw_hz = p.bandwidth_ghz * 1e9
        full_scale_a = p.responsivity_a_per_w * p0_w
        top = (1 << p.det_bits) - 1
        out = []
        for sign in (1.0, -1.0):
            current = p.responsivity_a_per_w * p0_w * loss * (1.0 + sign * y) / 2.0
            noisy = current.copy()
            if p.shot_noise:
                noisy += self._rng.normal(0.0, 1.0, n) * np.sqrt(2 * _Q * current * bw_hz)
            if p.thermal_noise:
                noisy += self._rng.normal(
                    0.0, math.sqrt(4 * _KB * p.temperature_k * bw_hz / p.load_ohm), n
                )
            out.append(np.clip(np.round(noisy / full_scale_a * top), 0, top).astype(np.int64))
        return out[0], out[1]


# ---- the whole front-end ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FrontendConfig:
    """Configuration of the digital front-end (the RTL's parameters and shift inputs)."""

    precision_bits: int = 8
    matrix_size_limit: int = 64
    dac_shift: int = 8
    adc_shift: int = 8
    in_bits: int = 16
    det_bits: int = 16
    acc_bits: int = 32

    def __post_init__(self) -> None:
        _int("precision_bits", self.precision_bits, 2, 16)
        _int("matrix_size_limit", self.matrix_size_limit, 1, 4096)
        _int("in_bits", self.in_bits, 2, 32)
        _int("det_bits", self.det_bits, 2, 32)
        _int("acc_bits", self.acc_bits, 8, 64)
        _int("dac_shift", self.dac_shift, 0, self.in_bits)
        _int("adc_shift", self.adc_shift, 0, self.det_bits)
        if self.precision_bits > self.in_bits:
            raise ValueError(
                f"precision_bits ({self.precision_bits}) must not exceed in_bits ({self.in_bits})"
            )


@dataclass
class FrontendTrace:
    """Every intermediate of :func:`frontend_matvec`, tile by tile (tile order: for each
    block of ``N`` output rows, the ``K`` tiles in order; ``last[t]`` ends a group)."""

    dac_codes: np.ndarray  # (k_tiles, N) DAC codes of the input vector
    det_p: np.ndarray  # (tiles, N)
    det_n: np.ndarray  # (tiles, N)
    adc_codes: np.ndarray  # (tiles, N)
    last: np.ndarray  # (tiles,) bool
    result: np.ndarray  # (rows,) accumulated ADC codes


def frontend_matvec(
    w: np.ndarray, x: np.ndarray, config: FrontendConfig, core: PhotonicCore
) -> FrontendTrace:
    """Run ``w @ x`` through DAC, the photonic core and the ADC path (functional model).

    ``w`` is ``rows x k`` with values in [-1, 1] (rounded by :func:`quantize_weights`),
    ``x`` a length-``k`` vector of signed ``in_bits`` samples. The core's
    ``matrix_size_limit`` must equal the config's.
    """
    n = config.matrix_size_limit
    if core.size != n:
        raise ValueError(f"core matrix_size_limit {core.size} != front-end {n}")
    w = np.asarray(w, dtype=np.float64)
    x = np.asarray(x, dtype=np.int64)
    if w.ndim != 2 or x.ndim != 1 or w.shape[1] != x.shape[0]:
        raise ValueError(f"matvec shapes do not agree: W {w.shape} x x {x.shape}")
    rows, k = w.shape
    wq = quantize_weights(w, config.precision_bits)
    kt, mt = frontend_tiles(k, n), frontend_tiles(rows, n)
    xp = np.zeros(kt * n, dtype=np.int64)
    xp[:k] = x
    codes = dac_quantize(xp, config.precision_bits, config.dac_shift, config.in_bits)
    codes = codes.reshape(kt, n)
    _, hi = dac_range(config.precision_bits)
    dp, dn, adc, last = [], [], [], []
    result = np.zeros(mt * n, dtype=np.int64)
    for mb in range(mt):
        group = []
        for kb in range(kt):
            core.program(wq[mb * n : (mb + 1) * n, kb * n : (kb + 1) * n])
            p, q = core.detect(codes[kb] / hi)
            a = adc_quantize(
                balanced_subtract(p, q, config.det_bits), config.precision_bits, config.adc_shift
            )
            dp.append(p)
            dn.append(q)
            adc.append(a)
            last.append(kb == kt - 1)
            group.append(a)
        result[mb * n : (mb + 1) * n] = accumulate_tiles(group, config.acc_bits)
    return FrontendTrace(
        dac_codes=codes,
        det_p=np.array(dp),
        det_n=np.array(dn),
        adc_codes=np.array(adc),
        last=np.array(last),
        result=result[:rows],
    )
