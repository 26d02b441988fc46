"""``wia-hw report SOURCE -o page.html``: one self-contained HTML page of a run report,
a profiling report or a sweep store (:mod:`wia_hw.report`).

Example::

    wia-hw run bert-large -b 32 -s 128 -o run.json && wia-hw report run.json -o run.html
    wia-hw profile bert-large -o prof.json && wia-hw report prof.json -o prof.html
    wia-hw report results.sqlite -o sweep.html
"""

from __future__ import annotations

from pathlib import Path

import click

from ..emulator.errors import WiaError
from ._common import write_file

__all__ = ["report_cmd"]


@click.command("report")
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The HTML file to write (default: SOURCE with the suffix .html).",
)
def report_cmd(source: Path, output: Path | None) -> None:
    """Write an HTML page of SOURCE: a run or profile report JSON, or a sweep store.

    The page makes no network request (inline CSS and script, plots as SVG data
    URIs), has sortable tables and fits a phone-width screen.
    """
    from ..report import render_report
    from ..report._load import ReportError

    out = output if output is not None else source.with_suffix(".html")
    if not out.parent.is_dir():  # before the page is rendered, as write_report does
        raise ReportError(f"cannot write {out}: no folder {out.parent}")
    kind, text = render_report(source)
    if out.resolve() == source.resolve():
        raise ReportError(f"{out}: the page would overwrite its source; name another -o")
    try:
        write_file(out, text)
    except WiaError as e:
        raise ReportError(str(e)) from None
    click.echo(f"wrote {out} ({kind} report, {len(text.encode()) / 1024:.0f} KiB)")
