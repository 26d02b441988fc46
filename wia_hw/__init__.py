"""wia-hw: an open, verifiable AI-accelerator stack (WIA-AI-011, chapter 8).

Describe an NPU in YAML, run a model on its SimPy emulator (cycle-exact with the
Amaranth RTL where both exist), and see where the time goes::

    import wia_hw
    r = wia_hw.run("bert-large", batch=32, seq=128, device="wia-npu")
    r.latency_ms, r.throughput, r.ops, r.counters.cycles

The seed's C names map to these by dropping the ``wia_`` prefix (see API.md).
"""

from __future__ import annotations

from ._version import __version__
from .comm import CollectiveRecord, CommError, Communicator, open_cluster
from .bench import (
    BenchmarkConfig,
    BenchmarkError,
    BenchmarkResult,
    EnvironmentalData,
    EnvironmentalMonitoring,
    ModelBenchmark,
    OutlierMethod,
    SignificanceTest,
    benchmark_model,
    benchmark_operation,
    compare_benchmarks,
    load_baseline_results,
    save_baseline,
)
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
from .graph import Graph, GraphBuilder, Op, Tensor
from .profiling import (
    AllocationSite,
    AnalysisConfig,
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
    plot_memory_timeline,
    profile_kernel,
    roofline_add_point,
    roofline_plot,
    save_profile_report,
    start_memory_profiling,
    start_profiling,
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
from .spec import list_specs, load_spec
from .workloads import from_onnx, from_torch

__all__ = [
    "ClusterSpec",
    "Context",
    "Counter",
    "Counters",
    "DeviceSpec",
    "Graph",
    "GraphBuilder",
    "KernelTime",
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
    # many devices (seed 8.5)
    "CollectiveRecord",
    "CommError",
    "Communicator",
    "open_cluster",
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
]
