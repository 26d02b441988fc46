"""Shareable HTML reports: one self-contained page per run, profile or sweep.

``wia-hw report SOURCE -o page.html`` (:func:`write_report`) reads a run report JSON
(``wia-hw run -o``), a profiling report JSON (``wia-hw profile -o``,
:func:`~wia_hw.profiling.save_profile_report`) or a sweep store (SQLite, format
``wia-hw-sweep/1``), detected from the file's content, and writes one HTML file that
makes no network request: CSS and the table-sorting script are inline, plots are SVG
data URIs, and a Content-Security-Policy forbids anything else. Every string from the
input is escaped. Tables sort by a clicked header (and read fine without JavaScript);
the page fits a phone-width screen. Plots need matplotlib (``wia-hw[plot]``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._load import ReportError, SweepData, load_source, read_sweep_store
from ._run import report_kind, run_report_html
from ._sweep import sweep_report_html

__all__ = [
    "ReportError",
    "SweepData",
    "load_source",
    "read_sweep_store",
    "render_report",
    "report_kind",
    "run_report_html",
    "sweep_report_html",
    "write_report",
]


def render_report(source: Any, *, recommendations: Any = None) -> tuple[str, str]:
    """(kind, HTML) of ``source``: a path (run/profile JSON or sweep store, detected
    from the content), a :class:`SweepData`, a live ``RunResult`` or
    ``ProfilingReport``, or a report's JSON dict. ``kind`` is ``run``, ``profile``
    or ``sweep``. Raises :class:`ReportError` (one line) for anything else."""
    if isinstance(source, (str, os.PathLike)):
        kind, data = load_source(source)
    elif isinstance(source, SweepData):
        kind, data = "sweep", source
    else:
        kind, data = report_kind(source), source
    if kind == "sweep":
        return kind, sweep_report_html(data)
    try:
        return kind, run_report_html(data, recommendations=recommendations)
    except ReportError as e:
        if isinstance(source, (str, os.PathLike)):  # name the file
            raise ReportError(f"{source}: {e}") from None
        raise


def write_report(source: Any, path: str | os.PathLike[str], *, recommendations: Any = None) -> Path:
    """Write the page of ``source`` (see :func:`render_report`) to ``path``; returns
    the path. With a live ``ProfilingReport`` the recommendations' gains are measured
    by re-running its kernels. Raises :class:`ReportError` when the input is not a
    report or the file cannot be written."""
    p = Path(path)
    if not p.parent.is_dir():
        raise ReportError(f"cannot write {p}: no folder {p.parent}")
    _, text = render_report(source, recommendations=recommendations)
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write {p}: {e.strerror}") from None
    return p
