"""Statistical benchmarking (seed section 8.8): measure an operation many times, remove
outliers, report the seed's statistics and the device's temperature, power and clock,
compare against a baseline kept in SQLite.

::

    import wia_hw
    ctx = wia_hw.open_device("wia-npu")
    cfg = wia_hw.BenchmarkConfig(warmup_iterations=2, measurement_iterations=20)
    result = wia_hw.benchmark_operation(ctx, "gemm", cfg, M=256, N=256, K=256)
    print(result.format_text())

See ``docs/BENCHMARKING.md``.
"""

from __future__ import annotations

from ._baseline import load_baseline_results, save_baseline, spec_hash
from ._compare import SignificanceTest, cohens_d, compare_benchmarks, effect_label
from ._config import (
    VARIATION_SOURCES,
    BenchmarkConfig,
    BenchmarkError,
    EnvironmentalMonitoring,
    Metric,
    OutlierMethod,
)
from ._operation import ModelBenchmark, benchmark_model, benchmark_operation, workload_key
from ._result import BenchmarkResult, EnvironmentalData
from ._stats import outlier_mask, tukey_fences
from ._workflow import (
    OptimizationStrategy,
    OptimizationWorkflow,
    WorkflowBaseline,
    WorkflowProfiling,
    WorkflowResult,
    WorkflowStep,
    optimize_workload,
)

__all__ = [
    "BenchmarkConfig",
    "BenchmarkError",
    "BenchmarkResult",
    "EnvironmentalData",
    "EnvironmentalMonitoring",
    "Metric",
    "ModelBenchmark",
    "OptimizationStrategy",
    "OptimizationWorkflow",
    "OutlierMethod",
    "SignificanceTest",
    "VARIATION_SOURCES",
    "benchmark_model",
    "benchmark_operation",
    "cohens_d",
    "compare_benchmarks",
    "effect_label",
    "load_baseline_results",
    "outlier_mask",
    "save_baseline",
    "spec_hash",
    "tukey_fences",
    "workload_key",
    "WorkflowBaseline",
    "WorkflowProfiling",
    "WorkflowResult",
    "WorkflowStep",
    "optimize_workload",
]
