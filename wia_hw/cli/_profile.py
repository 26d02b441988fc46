"""``wia-hw profile``: profile a workload, write the timeline, flamegraph and plots, and
print where the time goes and what to change.

Example::

    wia-hw profile bert-large -b 32 -s 128 --mode trace --timeline out.json \\
        --flamegraph out.svg --roofline roofline.png --recommend

``--apply N`` applies recommendation N (1-based, as printed) through its fix
(:class:`wia_hw.profiling.Fix`: the API code or the extension manifest it prints) on a
fresh context of the same device, options and extensions, runs the workload again and
prints before and after: latency, throughput, the kernels that changed, and the
measured gain next to the promised ``estimated_improvement``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

from ..emulator.errors import WiaError
from ..profiling import (
    AnalysisConfig,
    ProfileMode,
    ProfilingConfig,
    analyze_fragmentation,
    analyze_performance,
    analyze_roofline,
    create_roofline,
    plot_memory_timeline,
    save_profile_report,
    start_profiling,
    stop_profiling,
)
from ._common import (
    NO_PLOT,
    RunOptions,
    can_plot,
    check_suffix,
    check_writable,
    run_options,
    write_file,
)
from ._generate import throughput_text
from ._run import phase_kwargs, phase_options

__all__ = ["profile"]


#: Flamegraph file kinds by suffix: drawn, or collapsed stacks.
FLAMEGRAPH_SUFFIXES = (".svg", ".png", ".folded", ".txt")


@click.command(
    "profile",
    epilog="""\b
Examples:
  wia-hw profile bert-large -b 32 -s 128 -o profile.json
  wia-hw profile bert-base -b 2 -s 128 -a layers=2 --mode counters --apply 1
""",
)
@run_options
@phase_options
@click.option(
    "--mode",
    type=click.Choice([m.value for m in ProfileMode]),
    default="detailed",
    show_default=True,
    help="Profiling mode.",
)
@click.option(
    "--counters",
    default=None,
    metavar="NAME,...",
    help="Hardware counters to read per kernel (default: the seed's six).",
)
@click.option(
    "--interval-us",
    type=float,
    default=100.0,
    show_default=True,
    help="Sampling period (device microseconds).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the JSON report to this file as well.",
)
@click.option(
    "--timeline",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the Chrome Trace Event timeline (open in ui.perfetto.dev).",
)
@click.option(
    "--flamegraph",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the flamegraph: .svg/.png draw it, .folded/.txt write collapsed stacks.",
)
@click.option(
    "--roofline",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Plot the roofline (PNG) and print its analysis.",
)
@click.option(
    "--memory-timeline",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Plot device memory over time (PNG).",
)
@click.option(
    "--recommend",
    is_flag=True,
    help="Analyse and print recommendations (gains measured by re-running).",
)
@click.option(
    "--priority",
    default="medium",
    show_default=True,
    type=click.Choice(["low", "medium", "high", "critical"]),
    help="Lowest priority of recommendations to print.",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.0, 1.0),
    default=0.7,
    show_default=True,
    help="Lowest confidence of recommendations to print.",
)
@click.option(
    "--kernels",
    "top_kernels",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Print the seed's kernel profile for this many hottest kernels.",
)
@click.option(
    "--keep-library-frames",
    is_flag=True,
    help="Keep frames of wia-hw, the standard library and installed packages "
    "(click, ...) in call stacks, the flamegraph and allocation sites.",
)
@click.option(
    "--apply",
    "apply_n",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Apply recommendation N (as printed; implies --recommend), run again, and "
    "print before and after.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the emulated device.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report to stdout.")
def profile(
    opts: RunOptions,
    phase: str | None,
    kv_len: int | None,
    seed: int,
    mode: str,
    counters: str | None,
    interval_us: float,
    output: Path | None,
    timeline: Path | None,
    flamegraph: Path | None,
    roofline: Path | None,
    memory_timeline: Path | None,
    recommend: bool,
    priority: str,
    confidence: float,
    top_kernels: int,
    keep_library_frames: bool,
    as_json: bool,
    apply_n: int | None = None,
) -> None:
    """Profile WORKLOAD (bert-large, bert-base, gpt2, resnet50, gemm, an .onnx file or a
    SCALE-Sim topology .csv; --device also takes a SCALE-Sim .cfg)."""
    kw: dict[str, Any] = {}
    if counters:
        kw["hardware_counters"] = [c.strip() for c in counters.split(",") if c.strip()]
    try:
        cfg = ProfilingConfig(
            mode=mode,
            sampling_interval_us=interval_us,
            keep_library_frames=keep_library_frames,
            **kw,
        )
    except (TypeError, ValueError) as e:
        raise click.BadParameter(str(e)) from None
    if flamegraph is not None:
        check_suffix(
            "--flamegraph",
            flamegraph,
            FLAMEGRAPH_SUFFIXES,
            ".svg or .png draw it, .folded or .txt write collapsed stacks",
        )
    for option, path in (
        ("--roofline", roofline),
        ("--memory-timeline", memory_timeline),
    ):
        if path is not None:
            check_suffix(option, path, (".png",), "plots are PNG images")
    for option, path in (
        ("-o", output),
        ("--timeline", timeline),
        ("--flamegraph", flamegraph),
        ("--roofline", roofline),
        ("--memory-timeline", memory_timeline),
    ):
        check_writable(option, path)
    if apply_n is not None and as_json:
        raise click.UsageError("--apply prints before and after as text; drop --json")
    run_kw = phase_kwargs(opts.run_kwargs(), phase, kv_len)
    ctx = opts.open(seed=seed)
    session = start_profiling(ctx, cfg)
    try:
        before = ctx.run(opts.workload, **run_kw)
    finally:
        report = stop_profiling(session)
    if output is not None:
        save_profile_report(report, output, "json")
    if timeline is not None:
        report.save_timeline(timeline)
    plottable = can_plot()
    skipped: list[Path] = []

    def plot(path: Path, draw: Any) -> None:
        if plottable:
            draw(path)
        else:
            skipped.append(path)
            click.echo(f"wia-hw: skipped {path}: {NO_PLOT}", err=True)

    if flamegraph is not None:
        if flamegraph.suffix.lower() == ".png":
            plot(flamegraph, report.save_flamegraph)
        else:
            report.save_flamegraph(flamegraph)
    if as_json:  # the JSON alone on stdout; the files asked for are written all the same
        if roofline is not None:
            rf = create_roofline(ctx)
            rf.add_report(report)
            plot(roofline, rf.plot)
        if memory_timeline is not None and report.memory is not None:
            plot(memory_timeline, lambda p: plot_memory_timeline(report.memory, p))
        click.echo(report.to_json(indent=1))
        return
    click.echo(report.format_text())
    groups: dict[str, list[Any]] = {}
    for p in report.kernel_profiles():
        groups.setdefault(re.sub(r"^layer\d+\.", "", p.name), []).append(p)
    hot = sorted(groups.values(), key=lambda ps: -sum(p.cycles for p in ps))[:top_kernels]
    for ps in hot:
        p = max(ps, key=lambda p: p.cycles)
        click.echo("")
        if len(ps) > 1:
            click.echo(
                f"(the longest of {len(ps)} like it, "
                f"{sum(q.duration_ms for q in ps):.3f} ms together)"
            )
        click.echo(p.format())
    if roofline is not None:
        rf = create_roofline(ctx)
        rf.add_report(report)
        plot(roofline, rf.plot)
        click.echo("\nRoofline analysis:")
        click.echo(analyze_roofline(rf).format())
    if report.memory is not None:
        click.echo("")
        click.echo(report.memory.format())
        click.echo(analyze_fragmentation(report.memory).format())
        if memory_timeline is not None:
            plot(memory_timeline, lambda p: plot_memory_timeline(report.memory, p))
    if recommend or apply_n is not None:
        recs = analyze_performance(
            report, AnalysisConfig(priority_threshold=priority, confidence_threshold=confidence)
        )
        click.echo("")
        click.echo(recs.format())
        if output is not None:  # the report file carries them, measured gains and all
            data = json.loads(Path(output).read_text())
            data["recommendations"] = recs.to_dict()
            write_file(output, json.dumps(data, indent=1))
        if apply_n is not None:
            _apply(opts, seed, run_kw, recs.recommendations, apply_n, before)
    written = [
        p
        for p in (output, timeline, flamegraph, roofline, memory_timeline)
        if p and p not in skipped
    ]
    if written:
        click.echo("wrote " + ", ".join(str(p) for p in written))


def _apply(
    opts: RunOptions, seed: int, run_kw: dict[str, Any], recs: list[Any], n: int, before: Any
) -> None:
    """Apply recommendation ``n`` (1-based) of ``recs`` on a fresh context and print
    before (the profiled run: profiling adds no device cycles) and after."""
    if n > len(recs):
        raise WiaError(
            f"--apply {n}: there {'is' if len(recs) == 1 else 'are'} {len(recs)} "
            "recommendation(s) at these thresholds (numbered as printed; see --priority, "
            "--confidence)"
        )
    rec = recs[n - 1]
    if rec.fix is None:
        raise WiaError(
            f"--apply {n}: {rec.title!r} has no fix the emulator can apply ({rec.confidence_basis})"
        )
    after = rec.fix.apply(opts.open(seed=seed), opts.workload, run_kw)
    click.echo(f"Applied recommendation {n}: {rec.title} ({rec.fix.kind}: {rec.fix.description})")
    gain = (before.cycles - after.cycles) / before.cycles if before.cycles else 0.0
    click.echo(
        f"  Latency:    {before.latency_ms:.4f} ms -> {after.latency_ms:.4f} ms "
        f"({-100 * gain:+.2f}%; {before.cycles:,} -> {after.cycles:,} cycles)"
    )
    click.echo(f"  Throughput: {throughput_text(before)} -> {throughput_text(after)}")
    old = {k.name: k for k in before.kernels}
    new = {k.name: k for k in after.kernels}
    rows = [
        (k.name, k.time_ms, new[k.name].time_ms if k.name in new else None)
        for k in before.kernels
        if k.name not in new or new[k.name].cycles != k.cycles
    ]
    rows += [(k.name, None, k.time_ms) for k in after.kernels if k.name not in old]
    rows.sort(key=lambda r: -abs((r[2] or 0.0) - (r[1] or 0.0)))
    click.echo(f"  Changed kernels: {len(rows)} (the 10 that changed most):")
    for name, t0, t1 in rows[:10]:
        a = "-" if t0 is None else f"{t0:.4f} ms"
        b = "removed" if t1 is None else f"{t1:.4f} ms"
        click.echo(f"    {name}: {a} -> {b}")
    promised = rec.estimated_improvement
    ratio = f" ({gain / promised:.2f}x the promise)" if promised > 0 else ""
    click.echo(
        f"  Gain: measured {100 * gain:.2f}% of the run, promised {100 * promised:.2f}% "
        f"(estimated_improvement, {rec.confidence_basis.split(':')[0]}){ratio}"
    )
