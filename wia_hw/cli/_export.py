"""``wia-hw export REPORT.json --csv FILE [--what kernels|ops|counters]``: a report's
records as CSV.

* ``kernels``: one row per kernel launch, every field of the report's kernel record
  with nested counters as dotted columns (``counters.bytes.hbm``);
* ``ops``: one row per graph op (a run report's ``op_times``, then a ``writeback`` row
  for the final write-back of results, so that ``time_ms`` adds up to the latency; a
  profile report's ``ops``);
* ``counters``: one ``counter,value`` row per counter of the whole run or session
  (dotted names for per-level and per-precision counters).

Several ``--csv`` files take several ``--what`` in the same order; without ``--what``
a file named after a kind (``ops.csv``) holds that kind, any other single file the
kernels. ``--csv -`` writes to stdout.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import click

from ..emulator.errors import WiaError
from ._common import CSV_SUFFIXES, check_suffix, write_file
from ._compare import flatten, op_records, read_report

__all__ = ["export_cmd", "export_rows", "WHAT"]

WHAT = ("kernels", "ops", "counters")


def export_rows(d: dict[str, Any], what: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of ``what`` (:data:`WHAT`) in the report ``d``; columns in
    first-seen order over the rows."""
    if what == "kernels":
        records = d.get("kernels") or []
    elif what == "ops":
        records = op_records(d)
    elif what == "counters":
        flat = flatten(d.get("counters") or {})
        return ["counter", "value"], [{"counter": k, "value": v} for k, v in flat.items()]
    else:
        raise WiaError(f"--what must be one of {', '.join(WHAT)}, got {what!r}")
    rows = [flatten(r) for r in records]
    cols = list(dict.fromkeys(k for r in rows for k in r))
    first = [k for k in ("index", "name", "op", "group", "kind", "provider") if k in cols]
    return first + [k for k in cols if k not in first], rows


def _csv_text(cols: list[str], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n", restval="")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if v is None else v for k, v in r.items()})
    return buf.getvalue()


@click.command("export")
@click.argument("report", type=click.Path(path_type=Path))
@click.option(
    "--csv",
    "csv_files",
    multiple=True,
    required=True,
    metavar="FILE",
    help="CSV file to write, *.csv or *.txt (repeatable; - for stdout).",
)
@click.option(
    "--what",
    multiple=True,
    type=click.Choice(WHAT),
    help="What each --csv file holds, in order (default: from the file name, else kernels).",
)
def export_cmd(report: Path, csv_files: tuple[str, ...], what: tuple[str, ...]) -> None:
    """Export the kernels, ops or counters of a run or profile REPORT as CSV."""
    for f in csv_files:
        check_suffix("--csv", f, CSV_SUFFIXES, "export writes CSV text: *.csv or *.txt, or -")
    seen: dict[Path, str] = {}
    for f in csv_files:
        if f == "-":
            continue
        key = Path(f).resolve()
        if key in seen:
            raise WiaError(f"--csv {f}: the same file as --csv {seen[key]}: give each file once")
        seen[key] = f
    d = read_report(report)
    if what and len(what) != len(csv_files):
        raise WiaError(
            f"{len(csv_files)} --csv file(s) but {len(what)} --what: give one --what per "
            "file, in the same order"
        )
    kinds = list(what)
    if not kinds:
        for f in csv_files:
            stem = Path(f).stem.lower()
            if stem in WHAT:
                kinds.append(stem)
            elif len(csv_files) == 1:
                kinds.append("kernels")
            else:
                raise WiaError(
                    f"--csv {f}: say what it holds with --what (or name it "
                    f"{', '.join(w + '.csv' for w in WHAT)})"
                )
    for f, kind in zip(csv_files, kinds, strict=True):
        cols, rows = export_rows(d, kind)
        text = _csv_text(cols, rows)
        if f == "-":
            click.echo(text, nl=False)
            continue
        write_file(f, text)
        # records, not lines: a quoted field may hold a newline (a name with one)
        click.echo(f"wrote {f} ({kind}, {len(rows)} rows)", err=True)
