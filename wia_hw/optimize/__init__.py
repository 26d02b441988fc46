"""Optimisations that run on the emulator: operator fusion and post-training
quantisation (the seed's section 8.7 steps 1 and 2).

* :func:`apply_fusion` with a :class:`FusionConfig` marks fusable chains of a graph;
  lowering gives each chain one fused kernel (:mod:`._fusion`, :mod:`._kernels`).
* :func:`quantize_model` with a :class:`QuantizationConfig` (:class:`QuantMode`,
  :class:`Precision`, :class:`CalibrationMethod`) turns the linear/matmul ops of a
  float graph into int8 ones with scales calibrated on data (:mod:`._quant`).
* :func:`autotune_model` with an :class:`AutotuneConfig` searches each GEMM kernel's
  schedule (tiles, loop order, core split) on the emulator with a grid, random or
  ML-guided search; the :class:`AutotuneResult` saves them to a JSON file that
  ``wia_hw.run(..., schedules=path)`` applies (:mod:`._autotune`, :mod:`._schedules`).
"""

from __future__ import annotations

from ._autotune import (
    AutotuneConfig,
    AutotuneMethod,
    AutotuneResult,
    KernelSkippedWarning,
    KernelTuning,
    autotune_model,
)
from ._fusion import FUSION_PATTERNS, FusionConfig, apply_fusion
from ._quant import (
    CalibrationMethod,
    Precision,
    QuantExecutor,
    QuantizationConfig,
    QuantizedGraph,
    QuantMode,
    calibrate_threshold,
    quantize_model,
)
from ._schedules import (
    AutotuneError,
    ScheduleDeviceWarning,
    ScheduleError,
    Schedules,
    ScheduleUnusedWarning,
    load_schedules,
)

__all__ = [
    "FUSION_PATTERNS",
    "AutotuneConfig",
    "AutotuneError",
    "AutotuneMethod",
    "AutotuneResult",
    "KernelSkippedWarning",
    "KernelTuning",
    "ScheduleDeviceWarning",
    "ScheduleUnusedWarning",
    "ScheduleError",
    "Schedules",
    "autotune_model",
    "load_schedules",
    "CalibrationMethod",
    "FusionConfig",
    "Precision",
    "QuantExecutor",
    "QuantMode",
    "QuantizationConfig",
    "QuantizedGraph",
    "apply_fusion",
    "calibrate_threshold",
    "quantize_model",
]
