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

Throttling is one fixed factor (``throttle_factor``) applied at ``throttle_c``. When the
power a device draws throttled would still hold it above that point
(``ambient + P R > throttle_c``), the die keeps heating without bound: a real device
would throttle deeper (DVFS steps) or shut down, so the timing past that point is not
physical. A run, profile or bench that goes there warns (:class:`ThermalWarning`,
:meth:`ThermalModel.excursion_warning`).
"""

from __future__ import annotations

import math

from .config import ThermalConfig

__all__ = ["ThermalModel", "ThermalWarning"]


class ThermalWarning(UserWarning):
    """The die rose above the spec's throttle point, and the power drawn throttled would
    hold it above that point: the one fixed throttle factor cannot hold it, so a real
    device would throttle deeper or shut down and the timing past that point is not
    physical (see the module doc)."""


class ThermalModel:
    """Die temperature and throttling state of one device."""

    def __init__(self, cfg: ThermalConfig) -> None:
        self.cfg = cfg
        self.temperature_c = cfg.initial_c if cfg.initial_c is not None else cfg.ambient_c
        self.peak_c = self.temperature_c
        self.throttled_s = 0.0
        #: a :class:`ThermalWarning` was given for the excursion above ``throttle_c``
        #: the die is in (cleared by a run that starts below the throttle point)
        self.warned = False

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

    def excursion_warning(
        self, what: str, start_c: float, peak_c: float, power_w: float, power_of: str
    ) -> str | None:
        """The :class:`ThermalWarning` line for a run of ``what`` that started at
        ``start_c`` and peaked at ``peak_c`` while drawing ``power_w`` throttled
        (``power_of`` says whose power that is), or None.

        A line when the peak is above ``throttle_c`` and ``power_w`` would hold the die
        above it (the fixed factor cannot hold it); at most one per excursion above the
        throttle point: a run that starts above it after a warning stays silent (a
        bench's or a profile's later runs), one that starts below it begins a new one."""
        cfg = self.cfg
        if start_c < cfg.throttle_c:
            self.warned = False
        settle = self.steady_state_c(power_w)
        if self.warned or peak_c <= cfg.throttle_c or settle <= cfg.throttle_c:
            return None
        self.warned = True
        deg = "\N{DEGREE SIGN}C"
        peak, steady = _above(peak_c, cfg.throttle_c), _above(settle, cfg.throttle_c)
        return (
            f"{what}: the die peaked at {peak} {deg}, above its throttle point "
            f"({cfg.throttle_c:g} {deg}), and at {power_w:.1f} W ({power_of}) it would "
            f"settle at {steady} {deg}: the fixed throttle factor "
            f"({cfg.throttle_factor:g}) cannot hold it; a real device would throttle deeper "
            "or shut down, so the timing past the throttle point is not physical"
        )


def _above(value: float, limit: float) -> str:
    """``value`` (above ``limit``) with one decimal, or as many more as show it above
    ``limit`` (95.004, not 95.0)."""
    for d in range(1, 7):
        shown = f"{value:.{d}f}"
        if float(shown) > limit:
            return shown
    return repr(value)
