"""``wia-hw run WORKLOAD``: run a model on an emulated device and print the seed's
section 8.7 breakdown, totals, utilisation and hardware counters (:func:`print_run`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..emulator.errors import WiaError
from ..registry import register_device_extension
from ..runtime import RunResult, open_device
from ..spec import load_spec
from ._common import builder_args, spec_overrides, workload_options

__all__ = ["run_cmd", "print_run"]


def _progress(console: Console) -> tuple[Callable[[int, int, str], None], Callable[[], None]]:
    """A progress callback that shows a bar only once a run has taken over a second."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    state: dict[str, Any] = {"t0": time.monotonic(), "bar": None, "task": None}

    def update(done: int, total: int, name: str) -> None:
        if state["bar"] is None:
            if time.monotonic() - state["t0"] < 1.0 or not console.is_terminal:
                return
            bar = Progress(
                TextColumn("[bold]emulating"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} ops"),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task(name, total=total)
        state["bar"].update(state["task"], completed=done, description=name)

    def close() -> None:
        if state["bar"] is not None:
            state["bar"].stop()

    return update, close


def print_run(r: RunResult, console: Console, top_kernels: int = 10) -> None:
    """Print a run the way the seed's section 8.7 does, plus what a profiler adds."""
    p = r.params
    shape = ", ".join(f"{k}={p[k]}" for k in ("batch", "seq", "phase", "kv_len", "image") if k in p)
    console.print(
        f"[bold]{r.workload}[/bold] ({shape}) on [bold]{r.device}[/bold], "
        f"{r.precision}, {r.mode} mode"
    )
    t = Table(title="Operation Breakdown", title_justify="left")
    t.add_column("operation", no_wrap=True)
    t.add_column("time (ms)", justify="right")
    t.add_column("%", justify="right")
    t.add_column("GFLOP", justify="right")
    for o in r.ops:
        t.add_row(o.name, f"{o.time_ms:.2f}", f"{o.pct:.1f}", f"{o.flops / 1e9:.1f}")
    console.print(t)
    console.print(f"  Latency:     {r.latency_ms:.2f} ms")
    console.print(f"  Throughput:  {r.throughput:.1f} seq/sec")
    console.print(
        f"  Compute:     {r.achieved_tflops:.1f} TFLOPS of {r.peak_tflops:.1f} peak "
        f"({r.compute_utilization:.1f}% utilisation)"
    )
    console.print(
        f"  Roofline floor: {r.roofline_floor_ms:.2f} ms (FLOPs at peak, HBM bytes "
        f"at {r.memory_bandwidth_gbs:.0f}/{_peak_bw(r)} GB/s)"
    )
    console.print(
        f"  Energy:      {r.energy_j * 1e3:.1f} mJ, {r.avg_power_w:.1f} W average, "
        f"peak {r.peak_temperature_c:.1f} °C"
    )
    for provider, d in sorted(getattr(r, "extensions", {}).items()):
        figures = ", ".join(
            f"{k} {v:,.0f}" for k, v in d.items() if k not in ("kernels", "cycles") and abs(v) >= 1
        )
        console.print(
            f"  Extension {provider}: {int(d['kernels'])} kernels, "
            f"{r.clock_ghz and d['cycles'] / (r.clock_ghz * 1e6):.2f} ms"
            + (f" ({figures})" if figures else "")
        )
    c = r.counters
    ct = Table(title="Hardware counters", title_justify="left")
    ct.add_column("counter")
    ct.add_column("value", justify="right")
    rows = [
        ("cycles", f"{c.cycles:,}"),
        ("instructions", f"{c.instructions:,}"),
        ("branch_mispredicts", f"{c.branch_mispredicts:,} of {c.branches:,} branches"),
        ("flops", f"{c.flops:,}"),
        ("macs", ", ".join(f"{k} {v:,}" for k, v in c.macs_by_precision.items() if v)),
        ("cache_misses", f"{c.cache_misses:,}"),
    ]
    for lvl in ("l1", "l2"):
        acc = c.accesses(lvl)
        rate = 100.0 * c.hits[lvl] / acc if acc else 0.0
        rows.append(
            (f"{lvl} hits / misses", f"{c.hits[lvl]:,} / {c.misses[lvl]:,} ({rate:.1f}% hit)")
        )
    for lvl, nb in c.bytes.items():
        rows.append((f"bytes {lvl}", f"{nb / 1e9:.3f} GB"))
    rows.append(("stall cycles", ", ".join(f"{k} {v:,}" for k, v in c.stall_cycles.items())))
    rows.append(("energy", f"{c.energy_j * 1e3:.2f} mJ"))
    for name, val in rows:
        ct.add_row(name, val)
    console.print(ct)
    if top_kernels and r.kernels:
        # the same kernel of every layer is one row: count, total and mean time
        alike: dict[str, list[Any]] = {}
        for k in r.kernels:
            alike.setdefault(re.sub(r"^layer\d+\.", "", k.name), []).append(k)
        kt = Table(
            title=f"Top {top_kernels} kernels (n: launches of it over the layers; ms: their total)",
            title_justify="left",
        )
        for col in ("kernel", "provider", "n", "ms", "mean", "util %", "tiles"):
            kt.add_column(
                col, justify="left" if col in ("kernel", "provider") else "right", no_wrap=True
            )
        for name, ks in sorted(alike.items(), key=lambda kv: -sum(k.cycles for k in kv[1]))[
            :top_kernels
        ]:
            total = sum(k.time_ms for k in ks)
            cyc = sum(k.cycles for k in ks)
            util = sum(k.compute_utilization * k.cycles for k in ks) / cyc if cyc else 0.0
            kt.add_row(
                name,
                ks[0].provider,
                str(len(ks)),
                f"{total:.3f}",
                f"{total / len(ks):.3f}",
                f"{util:.1f}",
                str(ks[0].tiles),
            )
        console.print(kt)


def _peak_bw(r: RunResult) -> str:
    try:
        return f"{load_spec(r.device).peak_bandwidth_gbs:.0f}"  # type: ignore[union-attr]
    except WiaError:
        return "?"


@click.command("run")
@workload_options
@click.option(
    "--phase",
    type=click.Choice(["prefill", "decode"]),
    default=None,
    help="GPT-2: prefill or decode.",
)
@click.option(
    "--kv-len",
    type=int,
    default=None,
    help="GPT-2 decode: cached tokens (kv_len + seq <= 1024 positions).",
)
@click.option(
    "--mode", type=click.Choice(["timing", "functional"]), default="timing", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report to stdout.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the JSON report to this file.",
)
@click.option("--top", type=int, default=10, show_default=True, help="Kernels to list.")
@click.option(
    "--ext",
    "exts",
    multiple=True,
    metavar="ID|FILE",
    help="Register a device extension first (built-in id or manifest path).",
)
def run_cmd(
    workload: str,
    device: str,
    batch: int | None,
    seq: int | None,
    precision: str | None,
    phase: str | None,
    kv_len: int | None,
    args: tuple[str, ...],
    sets: tuple[str, ...],
    mode: str,
    seed: int,
    as_json: bool,
    output: Path | None,
    top: int,
    exts: tuple[str, ...],
) -> None:
    """Run WORKLOAD (bert-large, bert-base, gpt2, resnet50, gemm, or an .onnx file)."""
    extra = builder_args(args)
    if phase is not None:
        extra["phase"] = phase
    if kv_len is not None:
        extra["kv_len"] = kv_len
    if workload.lower().endswith(".onnx") and not Path(workload).is_file():
        raise WiaError(f"no such ONNX file: {workload}")
    ctx = open_device(device, overrides=spec_overrides(sets), seed=seed)
    for source in exts:
        register_device_extension(ctx, source)
    err = Console(stderr=True)
    update, close = _progress(err)
    try:
        r = ctx.run(
            workload,
            batch=batch,
            seq=seq,
            precision=precision,
            mode=mode,
            seed=seed,
            progress=update,
            **extra,
        )
    finally:
        close()
    text = r.to_json()
    if output is not None:
        try:
            output.write_text(text + "\n")
        except OSError as e:
            raise WiaError(f"cannot write {output}: {e.strerror}") from None
    if as_json:
        if output is None:
            click.echo(text)
        return
    print_run(r, Console(), top)
