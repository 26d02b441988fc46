"""``wia-hw bench WORKLOAD``: benchmark a workload on an emulated device and print the
seed's section 8.8 block; ``--save`` keeps the result as a baseline in an SQLite file,
``--compare`` compares it with the baseline there and exits with status 1 on a
significant regression larger than ``--noise-threshold`` (for CI pipelines)."""

from __future__ import annotations

import json
from pathlib import Path

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
from ..runtime import open_device
from ._common import builder_args, spec_overrides, workload_options

__all__ = ["bench_cmd"]


@click.command("bench")
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
@click.option("--variation-seed", type=int, default=0, show_default=True)
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
    """Benchmark WORKLOAD (gemm, bert-base, ..., or an .onnx file) on a device."""
    if not 0 < alpha < 1:  # checked with or without --compare, before measuring
        raise BenchmarkError(f"--alpha must be in (0, 1), got {alpha:g}")
    if not 0 <= noise_threshold < 1:
        raise BenchmarkError(f"--noise-threshold must be in [0, 1), got {noise_threshold:g}")
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
    if compare is not None and not compare.is_file():  # fail before measuring
        raise BenchmarkError(f"no baseline file {compare}")
    ctx = open_device(device, overrides=spec_overrides(sets))
    result = benchmark_operation(
        ctx, workload, cfg, batch=batch, seq=seq, precision=precision, **builder_args(args)
    )
    test = None
    if compare is not None:
        baseline = load_baseline_results(compare, result.name, device=ctx)
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
