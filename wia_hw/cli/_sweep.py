"""``wia-hw sweep FILE``: run a design-space sweep into an SQLite store, with a progress
bar (points done, rate, ETA); ``wia-hw sweep-report STORE``: the best points per metric
and the Pareto front of latency against energy, as tables, a PNG, CSV and Parquet."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..emulator.errors import WiaError
from ..sweep import (
    PARETO_OBJECTIVES,
    PARETO_PLOT_AXES,
    SweepInterrupted,
    best_points,
    better,
    load_sweep,
    open_store,
    pareto_front,
    plot_pareto,
    sweep,
    write_csv,
    write_parquet,
)
from ._common import CSV_SUFFIXES, NO_PLOT, can_plot, check_suffix

__all__ = ["sweep_cmd", "sweep_report_cmd"]

#: What matplotlib draws the Pareto plot as, by the file's suffix.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _scheduler(address: str) -> str:
    a = address.strip()
    for prefix in ("dask://", "tcp://"):
        if a.startswith(prefix):
            a = a[len(prefix) :]
    return "dask://" + a


@click.command("sweep")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "-w",
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Local worker processes (default: the CPU count).",
)
@click.option(
    "--scheduler",
    default=None,
    metavar="ADDRESS",
    help="Run on a Dask scheduler (HOST:PORT, tcp://HOST:PORT or dask://HOST:PORT).",
)
@click.option(
    "--store",
    default="results.sqlite",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="SQLite store; points already in it are skipped.",
)
@click.option("--retry-failed", is_flag=True, help="Compute again the points stored as failed.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the summary as one JSON line on stdout."
)
@click.option(
    "--no-progress",
    is_flag=True,
    help="No progress bar (there is none when stderr is not a terminal).",
)
def sweep_cmd(
    file: str,
    workers: int | None,
    scheduler: str | None,
    store: str,
    retry_failed: bool,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Run the points of sweep FILE not yet in the store."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    err = Console(stderr=True)
    executor: Any = _scheduler(scheduler) if scheduler else "local"
    # the bar redraws itself on a terminal; into a file or a pipe (``2> err.txt``) it
    # would leave its last frame among the messages, so it is drawn on a terminal only
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err,
        disable=no_progress or not err.is_terminal,
        auto_refresh=False,  # no refresh thread: the local pool may then fork
    )
    state: dict[str, Any] = {}

    def progress(done: int, total: int) -> None:
        if "task" not in state:
            state["t0"] = time.perf_counter()
            state["task"] = bar.add_task("points", total=total, rate="")
        elapsed = time.perf_counter() - state["t0"]
        rate = f"{60 * done / elapsed:,.0f} points/min" if elapsed > 0 else ""
        bar.update(state["task"], completed=done, rate=rate, refresh=True)

    def expanding(stage: str, done: int, total: int) -> None:
        if total < 20_000:
            return
        if "expand" not in state:
            state["expand"] = bar.add_task("checking the constraint", total=total, rate="")
        bar.update(state["expand"], completed=done, refresh=True)

    previous = _first_ctrl_c_only()
    try:
        with bar:
            sw = load_sweep(file, progress=expanding)
            s = sweep(
                sw,
                executor=executor,
                store=store,
                workers=workers,
                retry_failed=retry_failed,
                progress=progress,
            )
    except KeyboardInterrupt as e:
        # exiting: Python puts the default SIGINT handler back as it ends, and a Ctrl-C
        # in the rest of its exit killed it by SIGINT (status -2), not 130
        _set_sigint(signal.SIG_IGN)
        if isinstance(e, SweepInterrupted):
            click.echo(f"wia-hw: {e}", err=True)
        else:  # before the sweep ran (reading the file, opening the store)
            click.echo("wia-hw: interrupted", err=True)
        raise SystemExit(130) from None
    finally:
        if previous is not None and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            _set_sigint(previous)
    if as_json:
        click.echo(json.dumps(s.to_dict(), sort_keys=True))
        return
    filtered = f"; {s.filtered} filtered out by the constraint" if s.filtered else ""
    click.echo(
        f"sweep {s.sweep}: {s.points} points, {s.skipped} already stored, {s.computed} "
        f"computed ({s.ok} ok, {s.failed} failed){filtered}, {s.wall_s:.1f} s "
        f"({s.points_per_min:,.0f} points/min) on {s.executor} -> {s.store}"
    )


def _set_sigint(handler: Any) -> None:
    try:
        signal.signal(signal.SIGINT, handler)
    except (ValueError, OSError):  # not the main thread: no signal reaches it
        pass


def _first_ctrl_c_only() -> Any:
    """Make the first Ctrl-C a KeyboardInterrupt and ignore the ones after it: a second
    Ctrl-C while an interrupted sweep stops its workers and closes its store (a
    fraction of a second) used to end it with click's ``Aborted!``, a threading
    traceback or a kill by SIGINT instead of its one line and status 130. Returns the
    handler it replaced (None when it replaced none: off the main thread, or in a
    process started with Ctrl-C ignored, a shell's background job, which stays so)."""
    fired: list[bool] = []

    def first_only(signum: int, frame: Any) -> None:
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt

    try:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return None
        return signal.signal(signal.SIGINT, first_only)
    except (ValueError, OSError):
        return None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _params(r: dict[str, Any]) -> str:
    """The point's parameters, markup escaped (they are the user's text)."""
    return escape(", ".join(f"{k}={_fmt(v)}" for k, v in sorted(r["params"].items())))


def _check_folder(option: str, path: str) -> None:
    """One line before anything runs when ``path``'s folder does not exist."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise WiaError(f"{option} {path}: cannot write it: no folder {folder}")


def _write(path: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args, path)
    except OSError as e:
        raise WiaError(f"cannot write {path}: {e.strerror or e}") from None


@click.command("sweep-report")
@click.argument("store", type=click.Path(dir_okay=False))
@click.option("--sweep", "sweep_name", default=None, help="Only this sweep of the store.")
@click.option(
    "--png",
    default=None,
    type=click.Path(dir_okay=False),
    help="Pareto plot: *.png, *.svg or *.pdf.",
)
@click.option(
    "--superseded",
    is_flag=True,
    help="Also the rows of earlier definitions of the sweep (parameter values, base spec, "
    "metrics, workloads).",
)
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False), help="CSV.")
@click.option(
    "--parquet", default=None, type=click.Path(dir_okay=False), help="Parquet (needs pyarrow)."
)
def sweep_report_cmd(
    store: str,
    sweep_name: str | None,
    superseded: bool,
    png: str | None,
    csv_path: str | None,
    parquet: str | None,
) -> None:
    """Best points per metric and the Pareto front (latency vs energy) of STORE."""
    if png:
        check_suffix("--png", png, PLOT_SUFFIXES, "the Pareto plot is drawn as .png, .svg or .pdf")
    if csv_path:
        check_suffix("--csv", csv_path, CSV_SUFFIXES, "the points are CSV text: .csv or .txt")
    if parquet:
        check_suffix("--parquet", parquet, (".parquet",), "the points are Parquet: .parquet")
    for option, path in (("--png", png), ("--csv", csv_path), ("--parquet", parquet)):
        if path:
            _check_folder(option, path)
    st = open_store(store)
    try:
        rows = st.points(sweep_name, superseded=superseded)
        hidden = 0 if superseded else st.superseded(sweep_name)
    finally:
        st.close()
    out = Console(highlight=False, width=160)
    ok = sum(r["status"] == "ok" for r in rows)
    out.print(f"{store}: {len(rows)} points ({ok} ok, {len(rows) - ok} failed)", markup=False)
    if hidden:
        out.print(
            f"{hidden} superseded rows (of an earlier definition of the sweep: other "
            "parameter values, base spec, metrics, workloads or wia-hw version) not shown; "
            "--superseded includes them"
        )
    best = best_points(rows)
    fronts = pareto_front(rows)
    for wl in sorted(best):
        t = Table(title=f"best points: {escape(wl)}", title_justify="left")
        for c in ("metric", "best", "value", "parameters"):
            t.add_column(c, justify="right" if c == "value" else "left")
        for m, r in best[wl].items():
            t.add_row(escape(m), better(m), _fmt(r["metrics"][m]), _params(r))
        out.print(t)
        front = fronts.get(wl, [])
        if front:
            objs = [o for o in PARETO_OBJECTIVES if o in front[0]["metrics"]]
            t = Table(
                title=f"Pareto front ({' vs '.join(objs)}): {escape(wl)}", title_justify="left"
            )
            for c in (*objs, "parameters"):
                t.add_column(c, justify="left" if c == "parameters" else "right")
            for r in front:
                t.add_row(*(_fmt(r["metrics"][o]) for o in objs), _params(r))
            out.print(t)
    failed = [r for r in rows if r["status"] == "failed"]
    for r in failed[:10]:
        out.print(
            f"failed: {r['workload']} {', '.join(f'{k}={_fmt(v)}' for k, v in sorted(r['params'].items()))}: {r['error']}",
            markup=False,
        )
    if len(failed) > 10:
        out.print(f"... and {len(failed) - 10} more failed points")
    if png:
        axes = PARETO_PLOT_AXES
        missing = [m for m in axes if not any(m in (r["metrics"] or {}) for r in rows)]
        if not ok:
            click.echo(f"wia-hw: skipped {png}: no point succeeded, nothing to plot", err=True)
        elif missing:
            click.echo(
                f"wia-hw: skipped {png}: the Pareto plot is {' against '.join(axes)}, and "
                f"no point has {' or '.join(missing)} (add it to the sweep's metrics)",
                err=True,
            )
        elif not can_plot():
            click.echo(f"wia-hw: skipped {png}: {NO_PLOT}", err=True)
        else:
            _write(png, plot_pareto, rows)
            click.echo(f"wrote {png}")
    if csv_path:
        _write(csv_path, write_csv, rows)
        click.echo(f"wrote {csv_path}")
    if parquet:
        if _write(parquet, write_parquet, rows) is None:
            click.echo(f"parquet export skipped ({parquet}): pyarrow is not installed")
        else:
            click.echo(f"wrote {parquet}")
