"""Serving with dynamic batching (the seed's section 8.7 step 4).

* :func:`create_inference_server` with a :class:`BatchingConfig` gives an
  :class:`InferenceServer`: a SimPy model of Triton's dynamic batcher with a bounded
  request queue in front of one emulated device; each executed (batch, seq) shape is
  timed by the emulator once (:mod:`._server`, :mod:`._model`).
* :func:`benchmark_server` offers it a :class:`ServerWorkload` (Poisson arrivals, seeded,
  or a trace file, :func:`load_trace`) and reports P50/P90/P99 latency, throughput, the
  batch-size histogram, queue depth over time and rejections by reason; with a P99
  bound it finds the highest Poisson rate that meets it (:func:`find_max_rate`, MLPerf's
  Server scenario) (:mod:`._bench`).
"""

from __future__ import annotations

from ._bench import MaxRateResult, ServerBenchmarkResult, benchmark_server, find_max_rate
from ._config import (
    MAX_REQUESTS,
    REJECT_REASONS,
    BatchingConfig,
    PaddingStrategy,
    ServeError,
    ServerWorkload,
)
from ._model import ShapeTiming, graph_at
from ._server import InferenceServer, ServerRun, create_inference_server
from ._trace import Arrival, load_trace, poisson_arrivals

__all__ = [
    "MAX_REQUESTS",
    "REJECT_REASONS",
    "Arrival",
    "BatchingConfig",
    "InferenceServer",
    "MaxRateResult",
    "PaddingStrategy",
    "ServeError",
    "ServerBenchmarkResult",
    "ServerRun",
    "ServerWorkload",
    "ShapeTiming",
    "benchmark_server",
    "create_inference_server",
    "find_max_rate",
    "graph_at",
    "load_trace",
    "poisson_arrivals",
]
