"""Design-space sweeps: device variants x workloads, on a process pool or on Dask,
with every finished point in a durable SQLite store.

``wia_hw.sweep("sweep.yaml", executor="local", store="results.sqlite", workers=2)``
runs a sweep file (see :mod:`._file` and ``docs/SWEEPS.md``); this package is callable
as that function, and also holds the rest of the API:

* :func:`load_sweep` reads and checks a sweep file; ``.points()`` lists its points;
* :func:`sweep` (the same as calling the package) runs the points not yet stored;
* :func:`open_store` reads a store: ``.meta`` and ``.points()`` (the schema is in
  :mod:`._store`; ``wia-hw report`` reads it);
* :func:`best_points`, :func:`pareto_front`, :func:`write_csv`, :func:`write_parquet`
  and :func:`plot_pareto` summarise a store's rows.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ._file import (
    DEFAULT_METRICS,
    MAX_POINTS,
    RUN_METRICS,
    SAMPLERS,
    SWEEP_SCHEMA_VERSION,
    Point,
    Sweep,
    load_sweep,
    metric_names,
    point_key,
)
from ._report import (
    MAXIMIZE,
    PARETO_OBJECTIVES,
    PARETO_PLOT_AXES,
    best_points,
    better,
    pareto_front,
    plot_pareto,
    write_csv,
    write_parquet,
)
from ._run import CONNECT_TIMEOUT_S, SweepInterrupted, SweepSummary, sweep
from ._store import STORE_FORMAT, SweepError, SweepStore, open_store

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_METRICS",
    "MAXIMIZE",
    "MAX_POINTS",
    "PARETO_OBJECTIVES",
    "PARETO_PLOT_AXES",
    "RUN_METRICS",
    "SAMPLERS",
    "STORE_FORMAT",
    "SWEEP_SCHEMA_VERSION",
    "Point",
    "Sweep",
    "SweepError",
    "SweepInterrupted",
    "SweepStore",
    "SweepSummary",
    "best_points",
    "better",
    "load_sweep",
    "metric_names",
    "open_store",
    "pareto_front",
    "plot_pareto",
    "point_key",
    "sweep",
    "write_csv",
    "write_parquet",
]


class _CallableModule(types.ModuleType):
    """``wia_hw.sweep(...)`` calls :func:`sweep`; ``wia_hw.sweep.open_store`` and the
    other names stay reachable as attributes of the package."""

    def __call__(self, *args: Any, **kwargs: Any) -> SweepSummary:
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
