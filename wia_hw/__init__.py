"""wia-hw: an open, verifiable AI-accelerator stack (WIA-AI-011, chapter 8).

Describe an NPU in YAML, run a model on its SimPy emulator (cycle-exact with the
Amaranth RTL where both exist), and see where the time goes::

    import wia_hw
    r = wia_hw.run("bert-large", batch=32, seq=128, device="wia-npu")
    r.latency_ms, r.throughput, r.ops, r.counters.cycles

The seed's C names map to these by dropping the ``wia_`` prefix (docs/ARCHITECTURE.md,
"Names follow the seed").
"""

from __future__ import annotations

import importlib.util as _util
import os as _os
import sys as _sys

# Run from a clone's root after a plain (not editable) install, this directory shadows
# the installed package, and the subpackages that the install maps from beside it
# (pyproject's package-dir: emulator, extensions, specs, rtl) are not inside it: a
# finder maps them from there, as the install does.
#: the subpackages pyproject's package-dir maps from beside this directory
MAPPED_BESIDE = ("emulator", "extensions", "specs", "rtl")
if _util.find_spec(f"{__name__}.emulator") is None:
    import importlib.abc as _abc

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))

    class _BesideFinder(_abc.MetaPathFinder):
        """``wia_hw.<sub>`` from ``<clone>/<sub>`` for each mapped subpackage."""

        def find_spec(self, name: str, path: object = None, target: object = None) -> object:
            prefix, _, sub = name.partition(".")
            if prefix != __name__ or sub not in MAPPED_BESIDE:
                return None
            where = _os.path.join(_root, sub)
            init = _os.path.join(where, "__init__.py")
            return _util.spec_from_file_location(name, init, submodule_search_locations=[where])

    _sys.meta_path.append(_BesideFinder())

from . import sweep  # the package is callable: wia_hw.sweep(file, ...)
from ._case_study import CaseStudyResult, CaseStudyRow, case_study
from ._version import __version__
from .accuracy import verify_accuracy
from .bench import (
    BenchmarkConfig,
    BenchmarkError,
    BenchmarkResult,
    EnvironmentalData,
    EnvironmentalMonitoring,
    ModelBenchmark,
    OptimizationStrategy,
    OptimizationWorkflow,
    OutlierMethod,
    SignificanceTest,
    WorkflowBaseline,
    WorkflowProfiling,
    WorkflowResult,
    WorkflowStep,
    benchmark_model,
    benchmark_operation,
    compare_benchmarks,
    load_baseline_results,
    optimize_workload,
    save_baseline,
)
from .bench._config import Metric
from .comm import CollectiveRecord, CommError, Communicator, open_cluster
from .emulator.config import ClusterSpec, DeviceSpec
from .emulator.counters import Counter, Counters
from .emulator.errors import SpecError, WiaError, WorkloadError
from .extensions.analog import AnalogConfig, AnalogResult, hybrid_matmul
from .extensions.photonic import (
    PhotonicConfig,
    PhotonicDetection,
    PhotonicEncoding,
    PhotonicMatmul,
    PhotonicMode,
    PhotonicResult,
    photonic_matmul,
)
from .extensions.pim import (
    ElementwiseOp,
    PIMConfig,
    PIMKernel,
    PIMKernelType,
    PIMOperation,
    PIMOpType,
    PIMResult,
    PIMType,
    pim_execute,
)
from .extensions.transformer_engine import (
    AttentionConfig,
    AttentionPattern,
    AttentionResult,
    multi_head_attention,
)
from .generate import DecodeStep, GenerationResult, generate
from .graph import Graph, GraphBuilder, Op, Tensor
from .optimize import (
    AutotuneConfig,
    AutotuneError,
    AutotuneMethod,
    AutotuneResult,
    CalibrationMethod,
    FusionConfig,
    Precision,
    QuantizationConfig,
    QuantMode,
    apply_fusion,
    autotune_model,
    quantize_model,
)
from .profiling import (
    AllocationSite,
    AnalysisConfig,
    CollectiveStats,
    CommProfileReport,
    CommProfilingConfig,
    CommProfilingSession,
    FragmentationAnalysis,
    KernelProfile,
    MemoryLeak,
    MemoryProfileReport,
    MemoryProfilingConfig,
    MemoryProfilingSession,
    OutputFormat,
    PerformanceRecommendations,
    Priority,
    ProfileMode,
    ProfilingConfig,
    ProfilingReport,
    ProfilingSession,
    Recommendation,
    Roofline,
    RooflineAnalysis,
    RooflineConfig,
    analyze_fragmentation,
    analyze_performance,
    analyze_roofline,
    create_roofline,
    load_profile_report,
    plot_comm_timeline,
    plot_memory_timeline,
    profile_kernel,
    roofline_add_point,
    roofline_plot,
    save_profile_report,
    start_comm_profiling,
    start_memory_profiling,
    start_profiling,
    stop_comm_profiling,
    stop_memory_profiling,
    stop_profiling,
)
from .registry import (
    Capability,
    DeviceExtension,
    ExtensionId,
    list_extensions,
    load_extension,
    register_device_extension,
    unregister_device_extension,
)
from .runtime import Context, KernelTime, OpTime, RunResult, open_device, run
from .serve import (
    BatchingConfig,
    InferenceServer,
    PaddingStrategy,
    ServeError,
    ServerBenchmarkResult,
    ServerWorkload,
    benchmark_server,
    create_inference_server,
)
from .spec import list_specs, load_spec
from .train import TrainingResult, train_iteration
from .workloads import from_onnx, from_torch

#: The seed's ``wia_model_t``: a workload graph bound to its weights and precision
#: (what ``apply_fusion``, ``quantize_model`` and ``autotune_model`` take and return).
Model = Graph
#: The seed's ``WIA_OPTIMIZE_*`` family name: ``OptimizeStrategy.ITERATIVE``.
OptimizeStrategy = OptimizationStrategy
# The seed's ``WIA_OP_RELU`` is ``Op.RELU``, and ``wia_hw.Op`` is the graph op class:
# the PIM elementwise ops are class attributes of it (not dataclass fields, so graph ops
# are unchanged), ``Op.RELU is ElementwiseOp.RELU``.
for _m in ElementwiseOp:
    setattr(Op, _m.name, _m)
del _m

__all__ = [
    "ClusterSpec",
    "Context",
    "Counter",
    "Counters",
    "DeviceSpec",
    "Graph",
    "GraphBuilder",
    "KernelTime",
    "Model",
    "Op",
    "OpTime",
    "RunResult",
    "SpecError",
    "Tensor",
    "WiaError",
    "WorkloadError",
    "__version__",
    "list_specs",
    "load_spec",
    "from_onnx",
    "from_torch",
    "open_device",
    "run",
    # design-space sweeps (wia_hw.sweep(...), wia_hw.sweep.open_store(...))
    "sweep",
    # many devices (seed 8.5)
    "CollectiveRecord",
    "CommError",
    "Communicator",
    "open_cluster",
    "train_iteration",
    "TrainingResult",
    "CollectiveStats",
    "CommProfileReport",
    "CommProfilingConfig",
    "CommProfilingSession",
    "plot_comm_timeline",
    "start_comm_profiling",
    "stop_comm_profiling",
    # extensions (seed 8.9)
    "AttentionConfig",
    "AttentionPattern",
    "AttentionResult",
    "Capability",
    "DeviceExtension",
    "ExtensionId",
    "list_extensions",
    "load_extension",
    "multi_head_attention",
    "register_device_extension",
    "unregister_device_extension",
    "ElementwiseOp",
    "PIMConfig",
    "PIMKernel",
    "PIMKernelType",
    "PIMOperation",
    "PIMOpType",
    "PIMResult",
    "PIMType",
    "pim_execute",
    "PhotonicConfig",
    "PhotonicDetection",
    "PhotonicEncoding",
    "PhotonicMatmul",
    "PhotonicMode",
    "PhotonicResult",
    "photonic_matmul",
    "AnalogConfig",
    "AnalogResult",
    "hybrid_matmul",
    # profiling and analysis (seed 8.2-8.4, 8.6)
    "AllocationSite",
    "AnalysisConfig",
    "FragmentationAnalysis",
    "KernelProfile",
    "MemoryLeak",
    "MemoryProfileReport",
    "MemoryProfilingConfig",
    "MemoryProfilingSession",
    "OutputFormat",
    "PerformanceRecommendations",
    "Priority",
    "ProfileMode",
    "ProfilingConfig",
    "ProfilingReport",
    "ProfilingSession",
    "Recommendation",
    "Roofline",
    "RooflineAnalysis",
    "RooflineConfig",
    "analyze_fragmentation",
    "analyze_performance",
    "analyze_roofline",
    "create_roofline",
    "load_profile_report",
    "plot_memory_timeline",
    "profile_kernel",
    "roofline_add_point",
    "roofline_plot",
    "save_profile_report",
    "start_memory_profiling",
    "start_profiling",
    "stop_memory_profiling",
    "stop_profiling",
    # benchmarking (seed 8.7, 8.8)
    "BenchmarkConfig",
    "BenchmarkError",
    "BenchmarkResult",
    "EnvironmentalData",
    "EnvironmentalMonitoring",
    "ModelBenchmark",
    "OutlierMethod",
    "SignificanceTest",
    "benchmark_model",
    "benchmark_operation",
    "compare_benchmarks",
    "load_baseline_results",
    "save_baseline",
    # optimisation (seed 8.7): fusion and post-training quantisation
    "CalibrationMethod",
    "FusionConfig",
    "Precision",
    "QuantMode",
    "QuantizationConfig",
    "apply_fusion",
    "autotune_model",
    "AutotuneConfig",
    "AutotuneError",
    "AutotuneMethod",
    "AutotuneResult",
    "quantize_model",
    # serving, the optimisation workflow and the case study (seed 8.1, 8.7)
    "BatchingConfig",
    "InferenceServer",
    "PaddingStrategy",
    "ServeError",
    "ServerBenchmarkResult",
    "ServerWorkload",
    "benchmark_server",
    "create_inference_server",
    "Metric",
    "OptimizationStrategy",
    "OptimizeStrategy",
    "OptimizationWorkflow",
    "WorkflowBaseline",
    "WorkflowProfiling",
    "WorkflowResult",
    "WorkflowStep",
    "optimize_workload",
    "CaseStudyResult",
    "CaseStudyRow",
    "case_study",
    "verify_accuracy",
    "generate",
    "GenerationResult",
    "DecodeStep",
]
