"""``wia-hw bench WORKLOAD``: benchmark a workload on an emulated device and print the
seed's section 8.8 block; ``--save`` keeps the result as a baseline in an SQLite file,
``--compare`` compares it with the baseline there and exits with status 1 on a
significant regression larger than ``--noise-threshold`` (for CI pipelines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..bench import (
    BenchmarkConfig,
    BenchmarkError,
    OutlierMethod,
    benchmark_operation,
    compare_benchmarks,
    load_baseline_results,
    save_baseline,
)
from ..bench._baseline import check_baseline_file
from ..bench._operation import workload_key
from ..runtime import open_device, resolve_workload
from ._common import (
    TaskProgress,
    as_options,
    builder_args,
    check_writable,
    spec_overrides,
    task_progress,
    workload_options,
)

__all__ = ["bench_cmd"]


#: BenchmarkConfig's fields as this command's options (errors name the options)
_OPTIONS = {
    "warmup_iterations": "--warmup",
    "measurement_iterations": "-n/--iterations",
    "cooldown_iterations": "--cooldown",
    "outlier_threshold": "--threshold",
    "outlier_detection": "--outliers",
    "variation_sources": "--vary",
    "variation_seed": "--variation-seed",
}


@click.command(
    "bench",
    epilog="""\b
Examples:
  wia-hw bench gemm -a M=1024 -a N=1024 -a K=1024 -n 30 --save baseline.sqlite
  wia-hw bench gemm -a M=1024 -a N=1024 -a K=1024 -n 30 --compare baseline.sqlite
""",
)
@workload_options
@click.option(
    "-n", "--iterations", type=int, default=100, show_default=True, help="Measured iterations."
)
@click.option(
    "--warmup", type=int, default=10, show_default=True, help="Warm-up iterations (discarded)."
)
@click.option(
    "--cooldown", type=int, default=5, show_default=True, help="Cool-down iterations (discarded)."
)
@click.option(
    "--outliers",
    type=click.Choice([m.value for m in OutlierMethod]),
    default="iqr",
    show_default=True,
    help="Outlier removal.",
)
@click.option(
    "--threshold",
    type=float,
    default=1.5,
    show_default=True,
    help="Outlier threshold (IQR multiple, or MAD z-score).",
)
@click.option(
    "--vary",
    default="thermal",
    show_default=True,
    metavar="SOURCES",
    help="Variation sources, comma-separated: thermal, dram_refresh, "
    "arbitration_jitter; 'none' turns all off (identical runs).",
)
@click.option(
    "--variation-seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the --vary sources (and of the comparison's bootstrap).",
)
@click.option(
    "--save",
    "save",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append the result to this baseline SQLite file.",
)
@click.option(
    "--compare",
    "compare",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Compare with the baseline in this SQLite file; exit 1 on a significant regression.",
)
@click.option(
    "--alpha",
    type=float,
    default=0.05,
    show_default=True,
    help="Significance level of the comparison, in (0, 1).",
)
@click.option(
    "--noise-threshold",
    type=float,
    default=0.01,
    show_default=True,
    help="Smallest relative change of the mean called a regression (criterion's 1%).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def bench_cmd(
    workload: str,
    device: str,
    batch: int | None,
    seq: int | None,
    precision: str | None,
    args: tuple[str, ...],
    sets: tuple[str, ...],
    iterations: int,
    warmup: int,
    cooldown: int,
    outliers: str,
    threshold: float,
    vary: str,
    variation_seed: int,
    save: Path | None,
    compare: Path | None,
    alpha: float,
    noise_threshold: float,
    as_json: bool,
) -> None:
    """Benchmark WORKLOAD on an emulated device: warm-up, measured and cool-down
    iterations, statistics, and optionally a baseline saved or compared with.

    WORKLOAD is a built-in model (gemm, bert-base, ...), an .onnx file or a SCALE-Sim
    topology .csv; --device also takes a SCALE-Sim .cfg."""
    if not 0 < alpha < 1:  # checked with or without --compare, before measuring
        raise BenchmarkError(f"--alpha must be in (0, 1), got {alpha:g}")
    if not 0 <= noise_threshold < 1:
        raise BenchmarkError(f"--noise-threshold must be in [0, 1), got {noise_threshold:g}")
    with as_options(_OPTIONS):
        cfg = BenchmarkConfig(
            warmup_iterations=warmup,
            measurement_iterations=iterations,
            cooldown_iterations=cooldown,
            outlier_detection=outliers,
            outlier_threshold=threshold,
            variation_sources=()
            if vary.strip() == "none"
            else tuple(v.strip() for v in vary.split(",") if v.strip()),
            variation_seed=variation_seed,
        )
    # every store is checked before measuring, which can take minutes
    if compare is not None and not compare.is_file():
        raise BenchmarkError(f"no baseline file {compare}")
    if save is not None:
        check_writable("--save", save)
        check_baseline_file(save, "--save")
    ctx = open_device(device, overrides=spec_overrides(sets))
    kw: dict[str, Any] = dict(batch=batch, seq=seq, precision=precision)
    for name, value in builder_args(args).items():
        if kw.get(name) is not None and kw[name] != value:
            raise BenchmarkError(f"-a {name}={value} contradicts --{name} {kw[name]}")
        kw[name] = value
    run_kw = {k: kw.pop(k) for k in ("mode", "seed") if k in kw}  # ctx.run's, not the builder's
    graph = resolve_workload(workload, **kw)
    baseline = None
    if compare is not None:  # the store holds a baseline of this workload on this device
        baseline = load_baseline_results(compare, workload_key(graph), device=ctx)
    with task_progress("benchmarking", unit="iterations") as bar:
        watch = _IterationProgress(bar, cfg)
        ctx.observers.append(watch)
        try:
            result = benchmark_operation(ctx, graph, cfg, **run_kw)
        finally:
            ctx.observers.remove(watch)
    test = None
    if baseline is not None:
        test = compare_benchmarks(
            baseline, result, alpha=alpha, seed=variation_seed, noise_threshold=noise_threshold
        )
    if save is not None:
        save_baseline(result, save)
    if as_json:
        click.echo(
            json.dumps(
                {"result": result.to_dict(), "comparison": test.to_dict() if test else None},
                indent=2,
                sort_keys=True,
                default=str,
            )
        )
    else:
        click.echo(f"{result.name} on {result.device}")
        click.echo(result.format_text())
        if test is not None:
            click.echo("")
            click.echo(test.format_text())
    if test is not None and test.is_regression:
        if not as_json:
            click.echo(
                f"wia-hw: significant regression against {compare}: "
                f"{test.baseline_mean_ms:.6g} ms -> {test.result_mean_ms:.6g} ms "
                f"({100 * test.change:+.2f}%, above the {100 * noise_threshold:g}% noise "
                "threshold)",
                err=True,
            )
        raise SystemExit(1)


class _IterationProgress:
    """A context observer that shows which benchmark iteration runs (warm-up, measured,
    cool-down) on a :class:`TaskProgress`."""

    wants_trace = False

    def __init__(self, bar: TaskProgress, cfg: BenchmarkConfig) -> None:
        self.bar, self.runs = bar, 0
        self.phases = [
            ("warm-up", cfg.warmup_iterations),
            ("measuring", cfg.measurement_iterations),
            ("cool-down", cfg.cooldown_iterations),
        ]
        self.total = sum(n for _, n in self.phases)

    def run_begin(self, ctx: Any, graph: Any, lowered: Any) -> None:
        i = self.runs
        self.runs += 1
        for name, n in self.phases:
            if i < n:
                self.bar.update(self.runs - 1, self.total, f"{name} {i + 1}/{n}")
                return
            i -= n

    def op_begin(self, op: Any, kernels: Any, cycle: int) -> None:
        pass

    def op_end(self, op: Any, records: Any, cycle: int) -> None:
        pass

    def run_end(self, result: Any, trace: Any) -> None:
        if self.runs == self.total:
            self.bar.update(self.total, self.total, "")
