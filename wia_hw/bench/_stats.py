"""Sample statistics of a benchmark: outlier removal and the summary the seed prints."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._config import BenchmarkError, OutlierMethod

__all__ = ["tukey_fences", "outlier_mask", "as_samples"]


def as_samples(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    """``values`` as a 1-D float array; an empty or non-finite sample is a
    :class:`BenchmarkError` naming ``what``."""
    arr = np.asarray(values, dtype=float).ravel()
    if arr.size == 0:
        raise BenchmarkError(f"{what} is empty: no measurements to compute statistics on")
    if not np.all(np.isfinite(arr)):
        raise BenchmarkError(f"{what} holds a non-finite value ({arr[~np.isfinite(arr)][0]!r})")
    return arr


def tukey_fences(samples: np.ndarray, k: float) -> tuple[float, float]:
    """``(Q1 - k IQR, Q3 + k IQR)``, quartiles by linear interpolation."""
    q1, q3 = np.percentile(samples, [25.0, 75.0])
    iqr = q3 - q1
    return float(q1 - k * iqr), float(q3 + k * iqr)


def outlier_mask(samples: np.ndarray, method: OutlierMethod, threshold: float) -> np.ndarray:
    """True where a sample is an outlier under ``method`` (see :class:`OutlierMethod`).
    Never marks every sample: the median is always kept. A sample whose spread
    measure is 0 (IQR or MAD: at least half the samples are one value) has no outliers:
    the fences would otherwise collapse onto that value."""
    if method is OutlierMethod.NONE or samples.size < 3:
        return np.zeros(samples.shape, dtype=bool)
    if method is OutlierMethod.IQR:
        q1, q3 = np.percentile(samples, [25.0, 75.0])
        if q3 == q1:
            # half the samples or more are one value: the fences would collapse onto it
            # and every other sample, the modelled variation, would be called an outlier
            return np.zeros(samples.shape, dtype=bool)
        lo, hi = tukey_fences(samples, threshold)
        return (samples < lo) | (samples > hi)
    med = np.median(samples)
    mad = np.median(np.abs(samples - med))
    if mad == 0:
        return np.zeros(samples.shape, dtype=bool)
    return 0.6745 * np.abs(samples - med) / mad > threshold
