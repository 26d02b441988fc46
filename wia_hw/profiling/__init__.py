"""Profiling and analysis (WIA-AI-011 sections 8.2-8.4 and 8.6).

Sessions in four modes (sampling, instrumentation, hardware counters, trace; ``DETAILED``
is all of them) turn what the emulator does into a :class:`ProfilingReport`: a
versioned JSON report, a Chrome Trace Event timeline, a flamegraph. Kernel analysis
(:func:`profile_kernel`), roofline models (:func:`create_roofline`), memory profiling on
the device allocator (:func:`start_memory_profiling`) and automated recommendations
whose gains are measured by re-running the emulator (:func:`analyze_performance`)
build on it. Plots need matplotlib (``pip install 'wia-hw[plot]'``).
"""

from __future__ import annotations

from ._callsite import Frame
from ._comm import (
    CollectiveStats,
    CommProfileReport,
    CommProfilingConfig,
    CommProfilingSession,
    comm_trace_events,
    plot_comm_timeline,
    start_comm_profiling,
    stop_comm_profiling,
)
from ._config import SEED_COUNTERS, OutputFormat, ProfileMode, ProfilingConfig
from ._flamegraph import parse_collapsed, render_svg
from ._kernel import Assessment, KernelProfile, format_kernel_profile, profile_kernel
from ._memory import (
    AllocationSite,
    FragmentationAnalysis,
    MemoryLeak,
    MemoryProfileReport,
    MemoryProfilingConfig,
    MemoryProfilingSession,
    analyze_fragmentation,
    plot_memory_timeline,
    start_memory_profiling,
    stop_memory_profiling,
)
from ._metrics import DeviceInfo
from ._recommend import (
    AnalysisConfig,
    Fix,
    PerformanceRecommendations,
    Priority,
    Recommendation,
    analyze_performance,
)
from ._records import KernelStats, OpSpan, RunInfo, Sample
from ._report import (
    SCHEMA,
    Hotspot,
    ProfilingReport,
    load_profile_report,
    save_profile_report,
)
from ._roofline import (
    Roofline,
    RooflineAnalysis,
    RooflineConfig,
    RooflinePoint,
    RooflineRecommendation,
    RooflineSkipWarning,
    analyze_roofline,
    create_roofline,
    roofline_add_point,
    roofline_plot,
)
from ._session import ProfilingSession, start_profiling, stop_profiling
from ._timeline import check_trace_events

__all__ = [
    "SCHEMA",
    "RooflineSkipWarning",
    "CollectiveStats",
    "CommProfileReport",
    "CommProfilingConfig",
    "CommProfilingSession",
    "comm_trace_events",
    "plot_comm_timeline",
    "start_comm_profiling",
    "stop_comm_profiling",
    "AnalysisConfig",
    "Fix",
    "PerformanceRecommendations",
    "Priority",
    "Recommendation",
    "Roofline",
    "RooflineAnalysis",
    "RooflineConfig",
    "RooflinePoint",
    "RooflineRecommendation",
    "analyze_performance",
    "analyze_roofline",
    "create_roofline",
    "roofline_add_point",
    "roofline_plot",
    "SEED_COUNTERS",
    "AllocationSite",
    "Assessment",
    "DeviceInfo",
    "FragmentationAnalysis",
    "Frame",
    "Hotspot",
    "KernelProfile",
    "KernelStats",
    "MemoryLeak",
    "MemoryProfileReport",
    "MemoryProfilingConfig",
    "MemoryProfilingSession",
    "OpSpan",
    "OutputFormat",
    "ProfileMode",
    "ProfilingConfig",
    "ProfilingReport",
    "ProfilingSession",
    "RunInfo",
    "Sample",
    "analyze_fragmentation",
    "check_trace_events",
    "format_kernel_profile",
    "load_profile_report",
    "parse_collapsed",
    "plot_memory_timeline",
    "profile_kernel",
    "render_svg",
    "save_profile_report",
    "start_memory_profiling",
    "start_profiling",
    "stop_memory_profiling",
    "stop_profiling",
]
