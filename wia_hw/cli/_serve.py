"""``wia-hw serve WORKLOAD``: serve a workload with dynamic batching on an emulated
device and benchmark it (:mod:`wia_hw.serve`): Poisson arrivals at ``--rate``, a
``--trace`` file, or the highest rate meeting ``--p99-bound``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from ..runtime import open_device
from ..serve import (
    BatchingConfig,
    PaddingStrategy,
    ServerWorkload,
    benchmark_server,
    create_inference_server,
)
from ._common import as_options, builder_args, spec_overrides, task_progress, workload_options
from ._run import fixed

__all__ = ["serve_cmd"]


#: BatchingConfig's and ServerWorkload's fields as this command's options
_OPTIONS = {
    "max_batch_size": "--max-batch-size",
    "max_latency_ms": "--max-latency-ms",
    "padding_strategy": "--padding",
    "max_queue": "--max-queue",
    "rate_rps, trace": "--rate, --trace",  # "ServerWorkload needs rate_rps, trace or ..."
    "rate_rps": "--rate",
    "duration_s": "--duration",
    "ServerWorkload.trace": "--trace",
    "p99_bound_ms": "--p99-bound",
    "ServerWorkload.seed": "--seed",
    "ServerWorkload": "serve",  # after the fields: "ServerWorkload needs --rate, ..."
}


@click.command(
    "serve",
    epilog="""\b
Examples:
  wia-hw serve bert-large -a layers=2 --max-batch-size 16 --rate 500
  wia-hw serve bert-base -s 128 --p99-bound 20
""",
)
@workload_options
@click.option(
    "--max-batch-size",
    type=int,
    default=64,
    show_default=True,
    help="Most requests the batcher puts in one batch.",
)
@click.option(
    "--max-latency-ms",
    type=float,
    default=10.0,
    show_default=True,
    help="Latency target (ms): a request queued longer is rejected (timeout); the "
    "batcher waits for a fuller batch while a full one would still finish within it.",
)
@click.option(
    "--padding",
    type=click.Choice([p.value for p in PaddingStrategy]),
    default="multiple_of_8",
    show_default=True,
    help="How a batch is padded before it runs (batch and sequence rounded up).",
)
@click.option(
    "--max-queue",
    type=int,
    default=None,
    help="Most requests waiting; more are rejected (default: 256, or --max-batch-size "
    "when larger).",
)
@click.option("--rate", type=float, default=None, help="Poisson arrivals per second.")
@click.option(
    "--trace",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Arrivals from a file: 'timestamp_ms[,seq_len]' per line.",
)
@click.option(
    "--p99-bound", type=float, default=None, help="Find the highest rate with P99 <= this (ms)."
)
@click.option("--duration", type=float, default=1.0, show_default=True, help="Emulated seconds.")
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the Poisson arrivals."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def serve_cmd(
    workload: str,
    device: str,
    batch: int | None,
    seq: int | None,
    precision: str | None,
    args: tuple[str, ...],
    sets: tuple[str, ...],
    max_batch_size: int,
    max_latency_ms: float,
    padding: str,
    max_queue: int | None,
    rate: float | None,
    trace: Path | None,
    p99_bound: float | None,
    duration: float,
    seed: int,
    as_json: bool,
) -> None:
    """Serve WORKLOAD (bert-large, ...) with dynamic batching and report latency
    percentiles, throughput, batch sizes and rejections."""
    spec = open_device(device, overrides=spec_overrides(sets)).spec
    kw = builder_args(args)
    if seq is not None:
        kw["seq"] = seq
    if precision is not None:
        kw["precision"] = precision
    if batch is not None:
        kw["batch"] = batch
    with as_options(_OPTIONS):
        cfg = BatchingConfig(
            max_batch_size=max_batch_size,
            max_latency_ms=max_latency_ms,
            padding_strategy=padding,
            max_queue=max(256, max_batch_size) if max_queue is None else max_queue,
        )
        wl = ServerWorkload(
            rate_rps=rate, duration_s=duration, trace=trace, seed=seed, p99_bound_ms=p99_bound
        )
    server = create_inference_server(workload, cfg, device=spec, seed=seed, **kw)
    runs = [0]

    def show(kind: str, what: str) -> None:
        if kind == "run":
            runs[0] += 1
            what = f"{'rate search, run ' + str(runs[0]) if p99_bound else 'serving'}: {what}"
        bar.update(None, None, what)

    with task_progress("serving") as bar:
        server.on_work = show
        r = benchmark_server(server, wl)
        server.on_work = None
    if as_json:
        click.echo(json.dumps(r.to_dict(), indent=2, default=str))
        return
    click.echo(repr(server))
    if r.max_rate is not None:
        m = r.max_rate
        click.echo(
            f"Highest Poisson rate with P99 <= {m.p99_bound_ms:g} ms: {m.rate_rps:,.1f} req/s "
            f"(capacity {m.capacity_rps:,.1f} req/s, {len(m.steps)} runs){'; ' + m.reason if m.reason else ''}"
        )
        if m.search != "bisection":
            click.echo(f"  search: {m.search}")

    def ms(v: float) -> str:
        return "n/a (no request completed)" if math.isnan(v) else f"{fixed(v, 2)} ms"

    rate = (
        "n/a: every arrival at one instant"
        if math.isnan(r.offered_rate_rps)
        else f"{r.offered_rate_rps:,.1f} req/s"
    )
    click.echo(
        f"Offered {r.offered} ({rate}), completed {r.completed}, "
        f"rejected {r.rejected} {r.rejected_by_reason or ''}"
    )
    click.echo(
        f"P50 latency: {ms(r.p50_latency_ms)}\nP90 latency: {ms(r.p90_latency_ms)}\n"
        f"P99 latency: {ms(r.p99_latency_ms)}\nThroughput: {r.throughput:,.1f} seq/sec "
        f"(completed requests per emulated second, over {r.duration_ms / 1e3:.3g} s)"
    )
    click.echo("Batch sizes: " + ", ".join(f"{k}: {v}" for k, v in r.batch_size_histogram.items()))
    pad = (
        "n/a (no batch ran)"
        if math.isnan(r.padding_efficiency_pct)
        else f"{r.padding_efficiency_pct:.1f}%"
    )
    click.echo(f"Queue depth: max {r.max_queue_depth} of {cfg.max_queue}; padding efficiency {pad}")
    if r.completed == 0:
        why = ", ".join(f"{k} {v}" for k, v in r.rejected_by_reason.items())
        click.echo(
            f"wia-hw: warning: no request completed: all {r.offered} were rejected ({why})",
            err=True,
        )
