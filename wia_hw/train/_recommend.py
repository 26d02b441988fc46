"""The seed's "Inefficient Communication Pattern" recommendation for a training step.

:func:`recommend_communication` looks at a :class:`~._schedule.TrainingResult`: when its
data-parallel gradient all-reduces ran after the backward pass (``overlap=False``)
and so left communication exposed, it runs the same iteration again with bucketed,
overlapped all-reduces on a fresh copy of the cluster and reports the measured gain
``(t_serial - t_overlapped) / t_serial`` as ``estimated_improvement`` (confidence
``MEASURED``: both schedules ran on the emulator). ``wia_hw.analyze_performance``
accepts a TrainingResult and answers with this.
"""

from __future__ import annotations

from typing import Any

from ..profiling._recommend import (
    MEASURED,
    AnalysisConfig,
    Fix,
    PerformanceRecommendations,
    Priority,
    Recommendation,
    priority_for,
)

__all__ = ["recommend_communication"]


def recommend_communication(
    result: Any, cfg: AnalysisConfig | None = None
) -> PerformanceRecommendations:
    """Recommendations for a training iteration (see the module docstring); filtered
    by ``cfg``'s priority and confidence thresholds like ``analyze_performance``."""
    if not hasattr(result, "rerun"):  # duck-typed: _schedule imports this module
        raise TypeError(
            f"recommend_communication takes a TrainingResult, got {type(result).__name__}"
        )
    cfg = AnalysisConfig() if cfg is None else cfg
    found: list[Recommendation] = []
    exposed = result.iteration_cycles - result.compute_cycles
    if cfg.analyze_communication and not result.overlap and result.dp > 1 and exposed > 0:
        better = result.rerun(overlap=True)
        base, new = result.iteration_ms, better.iteration_ms
        gain = max(0.0, (base - new) / base) if base else 0.0
        serial = 1.0 - result.overlap_efficiency
        rr = getattr(result, "_rerun", {})
        extra = "".join(
            f", {k}={rr[k]!r}"
            for k in ("first_bucket_mb", "optimizer", "algorithm")
            if rr.get(k) is not None
        )
        fix = Fix(
            "api",
            # workload, run_kwargs: what was trained (train_iteration(workload, **run_kwargs))
            f"result = wia_hw.train_iteration(\n    workload, cluster={result.cluster!r}, "
            f"dp={result.dp}, tp={result.tp}, bucket_mb={result.bucket_mb:g}{extra},\n"
            "    overlap=True, **run_kwargs,\n)",
            "the same iteration with bucketed all-reduces overlapped with the backward pass",
        )
        found.append(
            Recommendation(
                priority=priority_for(gain),
                title="Inefficient Communication Pattern",
                description=(
                    f"All-reduce communication not overlapped with computation "
                    f"({100 * serial:.0f}% of {result.comm_ms:.3f} ms of communication "
                    "runs while no device computes)"
                ),
                impact=(
                    f"{result.exposed_comm_ms:.3f} ms of communication fully serialized "
                    f"with compute ({100 * result.exposed_comm_ms / base:.1f}% of the "
                    "iteration)"
                ),
                suggestion=(
                    "Split gradient all-reduce into layer-wise chunks and overlap with "
                    f"backward pass (DDP buckets of {result.bucket_mb:g} MiB: "
                    f"{len(better.buckets)} all-reduces issued as their layers' "
                    "gradients complete)"
                ),
                estimated_improvement=gain,
                confidence=MEASURED,
                confidence_basis=(
                    f"measured: the iteration re-run with overlapped buckets took "
                    f"{new:.3f} ms instead of {base:.3f} ms (overlap efficiency "
                    f"{100 * better.overlap_efficiency:.1f}% instead of "
                    f"{100 * result.overlap_efficiency:.1f}%)"
                ),
                code_example=fix.code,
                fix=fix,
                category="communication",
                baseline_ms=base,
                modified_ms=new,
            )
        )
    keep = [
        r
        for r in found
        if r.priority >= Priority(cfg.priority_threshold)
        and r.confidence >= cfg.confidence_threshold
    ]
    return PerformanceRecommendations(keep, found, result.iteration_ms)
