"""Energy and temperature: energy per MAC and per byte, a one-node RC thermal model.

Energy is counted where work happens (the device adds ``pj_per_mac`` per MAC, ``pj_per_byte``
per byte crossing a level, ``pj_per_vector_op`` per vector FLOP); static power is added
over elapsed time. Temperature follows ``C dT/dt = P - (T - T_amb) / R``, integrated
exactly over each interval of constant power:
``T(t) = T_amb + P R + (T0 - T_amb - P R) exp(-t / (R C))``.

The device steps this model along its timeline, within kernels: at the first tile issued
at least ``R C / 10^4`` after the last step, with the power of that interval (static
power plus the energy booked meanwhile: the MACs of the tiles issued and the bytes
counted at every level); at the end of every kernel it hands over the rest of the
kernel's energy, so the model integrates exactly the energy the counters hold. A tile
issued while ``throttling`` runs at ``frequency_factor`` of the clock.
"""

from __future__ import annotations

import math

from .config import ThermalConfig

__all__ = ["ThermalModel"]


class ThermalModel:
    """Die temperature and throttling state of one device."""

    def __init__(self, cfg: ThermalConfig) -> None:
        self.cfg = cfg
        self.temperature_c = cfg.initial_c if cfg.initial_c is not None else cfg.ambient_c
        self.peak_c = self.temperature_c
        self.throttled_s = 0.0

    @property
    def throttling(self) -> bool:
        return self.temperature_c >= self.cfg.throttle_c

    @property
    def frequency_factor(self) -> float:
        """Fraction of nominal clock the device runs at now."""
        return self.cfg.throttle_factor if self.throttling else 1.0

    def steady_state_c(self, power_w: float) -> float:
        return self.cfg.ambient_c + power_w * self.cfg.resistance_c_per_w

    def advance(self, seconds: float, power_w: float) -> float:
        """Integrate over ``seconds`` at constant ``power_w``; returns the new temperature."""
        if seconds < 0 or power_w < 0:
            raise ValueError(f"seconds and power must be >= 0, got {seconds}, {power_w}")
        if self.throttling:
            self.throttled_s += seconds
        tau = self.cfg.resistance_c_per_w * self.cfg.capacitance_j_per_c
        target = self.steady_state_c(power_w)
        # T0 + (target - T0) (1 - exp(-t / tau)), with expm1: exact also when tau >> t
        self.temperature_c += (target - self.temperature_c) * -math.expm1(-seconds / tau)
        self.peak_c = max(self.peak_c, self.temperature_c)
        return self.temperature_c
