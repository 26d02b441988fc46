"""``wia-hw compare A.json B.json [...]``: reports side by side.

Takes run reports (``wia-hw run -o``) and profiling reports (``wia-hw profile -o``).
Prints what differs in how they were made (spec, its hash, overrides, extensions with
their parameters and the hashes of their files, wia_hw version, seed, workload and its
arguments with a model file's hash: from each report's ``provenance``; the graphs run
with their parameters, the resolved precision and a profile's mode: from the report
bodies; a field is compared only between the reports that record it), then the
totals, the time per op (a run's final write-back as one more) and per kernel (a kernel
of every layer grouped as one row, as in ``run``'s kernel table), each with its change
against the first report (``+12.3%``). ``--json`` prints the same as JSON.

The helpers :func:`read_report`, :func:`report_kind`, :func:`op_records` and
:func:`flatten` are shared with ``wia-hw export``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..emulator.errors import WiaError
from ._common import make_console, width_option

__all__ = [
    "compare_cmd",
    "compare_reports",
    "read_report",
    "report_kind",
    "op_records",
    "flatten",
]

#: Totals compared: (label, run-report key, profile-report summary key, unit).
TOTALS = (
    ("latency", "latency_ms", "duration_ms", "ms"),
    ("cycles", "cycles", "cycles", ""),
    ("throughput", "throughput", None, "seq/s"),
    ("achieved", "achieved_tflops", "achieved_tflops", "TFLOPS"),
    ("compute utilisation", "compute_utilization", "compute_utilization", "%"),
    ("HBM bandwidth", "memory_bandwidth_gbs", "memory_bandwidth_gbs", "GB/s"),
    ("roofline floor", "roofline_floor_ms", None, "ms"),
    ("energy", "energy_j", "energy_j", "J"),
    ("average power", "avg_power_w", "avg_power_w", "W"),
)


def read_report(path: Path) -> dict[str, Any]:
    """The JSON object of a ``wia-hw.run/1`` or ``wia-hw.profile/1`` report at
    ``path``; :class:`WiaError` naming the file when it cannot be read, is not JSON or
    is another kind of file."""
    try:
        d = json.loads(path.read_text())
    except OSError as e:
        raise WiaError(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WiaError(f"{path}: not JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(d, dict) or report_kind(d) is None:
        schema = d.get("schema") if isinstance(d, dict) else None
        raise WiaError(
            f"{path}: not a wia-hw run or profile report (schema {schema!r}; "
            "expected wia-hw.run/1 or wia-hw.profile/1)"
        )
    problem = _check_fields(d)
    if problem:
        raise WiaError(f"{path}: {problem}")
    return d


#: The report schemas this wia-hw reads, by kind (another version is refused).
SCHEMAS = {"run": "wia-hw.run/1", "profile": "wia-hw.profile/1"}


def report_kind(d: dict[str, Any]) -> str | None:
    """``"run"``, ``"profile"`` or None, from the report's ``schema`` (exactly
    ``wia-hw.run/1`` or ``wia-hw.profile/1``)."""
    schema = d.get("schema")
    for kind, name in SCHEMAS.items():
        if schema == name:
            return kind
    return None


def _short(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_fields(d: dict[str, Any]) -> str | None:
    """What is wrong with the fields ``compare`` and ``export`` read (a report that
    parses but was corrupted), naming the field; None when they are fine."""

    def bad(field: str, what: str, got: Any) -> str:
        return f"field {field} must be {what}, got {_short(got)}"

    def records(key: str, needs: dict[str, str]) -> str | None:
        if key not in d:
            return None
        v = d[key]
        if not isinstance(v, list):
            return bad(key, "a list of objects", v)
        for i, r in enumerate(v):
            if not isinstance(r, dict):
                return bad(f"{key}[{i}]", "an object", r)
            for f, kind in needs.items():
                x = r.get(f)
                if (kind == "str" and not isinstance(x, str)) or (kind == "num" and not _is_num(x)):
                    return bad(f"{key}[{i}].{f}", "a string" if kind == "str" else "a number", x)
        return None

    def mapping(key: str, v: Any) -> str | None:
        return None if isinstance(v, dict) else bad(key, "an object", v)

    if report_kind(d) == "run":
        for _, key, _, _ in TOTALS:
            if d.get(key) is not None and not _is_num(d[key]):
                return bad(key, "a number", d[key])
        problem = records("op_times", {"name": "str", "time_ms": "num"}) or records(
            "kernels", {"name": "str", "time_ms": "num"}
        )
    else:
        for key in ("summary", "device"):
            if key in d and (problem := mapping(key, d[key])):
                return problem
        for _, _, key, _ in TOTALS:
            v = d.get("summary", {}).get(key) if key else None
            if v is not None and not _is_num(v):
                return bad(f"summary.{key}", "a number", v)
        clock = d.get("device", {}).get("clock_ghz")
        if clock is not None and not (_is_num(clock) and clock > 0):
            return bad("device.clock_ghz", "a positive number", clock)
        cycles = {"name": "str", "start_cycle": "num", "end_cycle": "num"}
        problem = records("ops", cycles) or records("kernels", cycles)
    if problem:
        return problem
    if "counters" in d and d["counters"] is not None and (p := mapping("counters", d["counters"])):
        return p
    prov = d.get("provenance")
    if prov is None:
        return None
    if not isinstance(prov, dict):
        return bad("provenance", "an object", prov)
    for key in ("overrides", "peaks", "run"):
        if prov.get(key) is not None and (p := mapping(f"provenance.{key}", prov[key])):
            return p
    peaks = prov.get("peaks") or {}
    if peaks.get("peak_tflops") is not None and not isinstance(peaks["peak_tflops"], dict):
        return bad("provenance.peaks.peak_tflops", "an object", peaks["peak_tflops"])
    run = prov.get("run") or {}
    if run.get("kwargs") is not None and not isinstance(run["kwargs"], dict):
        return bad("provenance.run.kwargs", "an object", run["kwargs"])
    exts = prov.get("extensions")
    if exts is not None:
        if not isinstance(exts, list):
            return bad("provenance.extensions", "a list of objects", exts)
        for i, e in enumerate(exts):
            if not isinstance(e, dict) or not isinstance(e.get("id"), str):
                return bad(f"provenance.extensions[{i}]", "an object with an id", e)
            if e.get("parameters") is not None and not isinstance(e["parameters"], dict):
                return bad(f"provenance.extensions[{i}].parameters", "an object", e["parameters"])
    return None


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``counters.bytes.hbm``); lists as compact JSON
    text; scalars as they are."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        elif isinstance(v, list):
            out[key] = json.dumps(v, separators=(",", ":"))
        else:
            out[key] = v
    return out


def _layerless(name: str) -> str:
    return re.sub(r"^layer\d+\.", "", name)


def op_records(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The op records of a report: a run report's ``op_times`` (every graph op) and its
    final write-back of results (the ``writeback`` entry of ``ops`` that holds no op),
    so that their times add up to the latency; a profile report's ``ops``."""
    if report_kind(d) != "run":
        return list(d.get("ops") or [])
    tail = [
        o
        for o in d.get("ops") or []
        if isinstance(o, dict) and o.get("name") == "writeback" and not o.get("count")
    ]
    return list(d.get("op_times") or []) + tail


def _summary(d: dict[str, Any]) -> dict[str, Any]:
    """Totals, per-op ms, per-kernel (launches, ms) and provenance of one report."""
    if report_kind(d) == "run":
        totals = {label: d.get(key) for label, key, _, _ in TOTALS}
        ops = {o["name"]: o["time_ms"] for o in op_records(d)}
        kern = [(k["name"], k["time_ms"]) for k in d.get("kernels") or []]
    else:
        s = d.get("summary") or {}
        totals = {label: s.get(key) if key else None for label, _, key, _ in TOTALS}
        clock = (d.get("device") or {}).get("clock_ghz") or 1.0

        def ms(c: int) -> float:
            return c / (clock * 1e6)

        ops = {}
        for o in d.get("ops") or []:
            ops[o["name"]] = ops.get(o["name"], 0.0) + ms(o["end_cycle"] - o["start_cycle"])
        kern = [(k["name"], ms(k["end_cycle"] - k["start_cycle"])) for k in d.get("kernels") or []]
    kernels: dict[str, list[float]] = {}
    for name, t in kern:
        k = kernels.setdefault(_layerless(name), [0, 0.0])
        k[0] += 1
        k[1] += t
    return {"totals": totals, "ops": ops, "kernels": kernels, "provenance": d.get("provenance")}


def _ran(d: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """What a report ran, from its body: (graph name, graph parameters) of a run report,
    of each run of a profile report (``runs``); what is not recorded is left out."""
    recs = [d] if report_kind(d) == "run" else d.get("runs")
    out = []
    for r in recs if isinstance(recs, list) else ():
        if isinstance(r, dict) and isinstance(r.get("workload"), str):
            params = r.get("params")
            out.append((r["workload"], params if isinstance(params, dict) else {}))
    return out


def _made_with(d: dict[str, Any]) -> dict[str, Any]:
    """How a report was made, as flat rows (what ``compare`` diffs): the spec as used,
    the run as given (run reports), the graphs run with their parameters and the
    resolved precision (run and profile reports), the profile mode (profiles)."""
    prov = d.get("provenance")
    rows: dict[str, Any] = {}
    if not prov:
        rows["provenance"] = "not recorded"
    else:
        rows["spec"] = prov.get("spec")
        rows["device"] = prov.get("device")
        rows["spec sha256"] = str(prov.get("spec_sha256", ""))[:12]
        for k, v in sorted((prov.get("overrides") or {}).items()):
            rows[f"--set {k}"] = v
        for e in prov.get("extensions") or []:
            rows[f"--ext {e['id']}"] = e.get("source")
            for k, v in sorted((e.get("parameters") or {}).items()):
                rows[f"  {e['id']}.{k}"] = v
            # an edited manifest or module keeps its version: its bytes tell
            for f in ("manifest", "module"):
                if e.get(f"{f}_sha256") is not None:
                    rows[f"  {e['id']} {f} sha256"] = str(e[f"{f}_sha256"])[:12]
        peaks = prov.get("peaks") or {}
        for k, v in sorted((peaks.get("peak_tflops") or {}).items()):
            rows[f"peak {k} TFLOPS"] = v
        rows["peak HBM GB/s"] = peaks.get("hbm_bandwidth_gbs")
        rows["wia_hw"] = prov.get("wia_hw_version")
        rows["seed"] = prov.get("seed")
        run = prov.get("run") or {}
        for k in _RUN_ROWS:
            if k in run:
                rows[k] = run[k]
        if run.get("workload_sha256") is not None:
            rows["workload sha256"] = str(run["workload_sha256"])[:12]
        for k, v in sorted((run.get("kwargs") or {}).items()):
            rows[f"-a {k}"] = v
    ran = _ran(d)
    if ran:
        rows["graph"] = ", ".join(name for name, _ in ran)
        for k in dict.fromkeys(k for _, p in ran for k in p if k != "precision"):
            vals = [p.get(k) for _, p in ran]
            rows[f"graph {k}"] = vals[0] if len(vals) == 1 else vals
    # the precision the run resolved to: a run without -p is at its default, which
    # ``-p`` of that same precision makes the same run
    precisions = (
        [d.get("precision")] if report_kind(d) == "run" else [p.get("precision") for _, p in ran]
    )
    if precisions and all(isinstance(p, str) for p in precisions):
        rows["precision"] = ", ".join(dict.fromkeys(precisions))
    if report_kind(d) == "profile" and d.get("mode") is not None:
        rows["profile mode"] = d.get("mode")
    return rows


#: A field of a report that does not record it (a run field of a report whose
#: provenance has no ``run``, a profile's mode of a run report).
NOT_RECORDED = "not recorded"
#: The run as given (``provenance.run``): recorded by run reports only.
_RUN_ROWS = ("workload", "batch", "seq", "mode")
#: Rows recorded by the reports that have them only (from the report body).
_BODY_ROWS = ("graph", "precision", "profile mode")


def _is_run_row(k: str) -> bool:
    return k in _RUN_ROWS or k == "workload sha256" or k.startswith("-a ")


def _is_body_row(k: str) -> bool:
    return k in _BODY_ROWS or k.startswith("graph ")


def _delta(base: float | None, v: float | None) -> str:
    if base is None or v is None:
        return ""
    if base == 0:
        return "" if v == 0 else "new"
    return f"{100.0 * (v - base) / base:+.1f}%"


def compare_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison as data: ``made_with`` (rows that differ between the reports:
    name -> one value per report, ``None`` where absent, ``"not recorded"`` for a field
    a report does not record: a run field of a report without a recorded run, such as a
    profile, or a profile's mode of a run report; a row is compared between the reports
    that record it), ``not_recorded_by_all`` (of ``spec``, ``workload as given``,
    ``graph``, ``precision``: what some report does not record, so no sameness is
    claimed for it), ``totals``, ``ops`` (ms) and ``kernels`` (``[launches, ms]``, a
    kernel of every layer as one), each name -> one value per report in the order of
    ``reports``; ops and kernels slowest first (by their largest time over the
    reports)."""
    sums = [_summary(d) for d in reports]
    made = [_made_with(d) for d in reports]
    # a profile's provenance records no run: its workload, batch, ... are not recorded,
    # and compare only between the reports that record them (so do the graphs run, the
    # precision and the profile mode, from the report bodies)
    has_run = [isinstance((s["provenance"] or {}).get("run"), dict) for s in sums]
    keys = list(dict.fromkeys(k for m in made for k in m))
    differs = {}
    for k in keys:
        vals = [m.get(k) for m in made]
        if _is_run_row(k):
            vals = [v if h else NOT_RECORDED for v, h in zip(vals, has_run, strict=True)]
        elif _is_body_row(k):  # a graph parameter: recorded by a report that has graphs
            has = "graph" if k.startswith("graph ") else k
            vals = [m.get(k) if has in m else NOT_RECORDED for m in made]
        recorded = [v for v in vals if v is not NOT_RECORDED]
        if len({json.dumps(v, sort_keys=True) for v in recorded}) > 1:
            differs[k] = vals
    # what no row may be said to be the same in: not recorded by every report
    unknown = [
        what
        for what, ok in (
            ("spec", all(s["provenance"] for s in sums)),
            ("workload as given", all(has_run)),
            ("graph", all("graph" in m for m in made)),
            ("precision", all("precision" in m for m in made)),
            # a mode only profiles have: named when a run report is beside one
            (
                "profile mode",
                all("profile mode" in m for m in made)
                or not any("profile mode" in m for m in made),
            ),
        )
        if not ok
    ]
    totals = {label: [s["totals"].get(label) for s in sums] for label, *_ in TOTALS}
    totals = {k: v for k, v in totals.items() if any(x is not None for x in v)}
    op_names = list(dict.fromkeys(n for s in sums for n in s["ops"]))
    op_names.sort(key=lambda n: -max(s["ops"].get(n) or 0.0 for s in sums))
    ops = {n: [s["ops"].get(n) for s in sums] for n in op_names}
    k_names = list(dict.fromkeys(n for s in sums for n in s["kernels"]))
    k_names.sort(key=lambda n: -max(s["kernels"].get(n, [0, 0.0])[1] for s in sums))
    kernels = {n: [s["kernels"].get(n) for s in sums] for n in k_names}
    return {
        "made_with": differs,
        "not_recorded_by_all": unknown,
        "totals": totals,
        "ops": ops,
        "kernels": kernels,
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


@click.command("compare")
@click.argument("reports", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=15,
    show_default=True,
    help="Kernels and ops to list.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@width_option
def compare_cmd(reports: tuple[Path, ...], top: int, as_json: bool, width: int | None) -> None:
    """Compare run or profile REPORTS (JSON): what differs in how they were made, totals,
    per-op and per-kernel times, each against the first report."""
    if len(reports) < 2:
        raise WiaError("compare needs at least two reports")
    data = [read_report(p) for p in reports]
    cmp = compare_reports(data)
    if as_json:
        click.echo(json.dumps(dict(cmp, reports=[str(p) for p in reports]), indent=1))
        return
    console = make_console(width)
    names = [escape(p.name) for p in reports]  # names and values are the user's text
    t = Table(title="Made with (what differs)", title_justify="left")
    t.add_column("", no_wrap=True)
    for n in names:
        t.add_column(n, no_wrap=True)
    for k, vs in cmp["made_with"].items():
        t.add_row(escape(k), *(escape(_fmt(v)) for v in vs))
    unknown = cmp["not_recorded_by_all"]
    if cmp["made_with"]:
        console.print(t)
    else:  # the same in what every report records, and only that
        same = [
            what
            for what, ok in (
                ("spec, overrides, extensions, version, seed", "spec" not in unknown),
                ("workload and its arguments", "workload as given" not in unknown),
                ("graph and its parameters", "graph" not in unknown),
                ("precision", "precision" not in unknown),
                ("profile mode", all(report_kind(d) == "profile" for d in data)),
            )
            if ok
        ]
        console.print(f"Made with: the same {'; '.join(same) or 'nothing recorded by all'}")
    if unknown:
        console.print(f"Not compared (not recorded in every report): {', '.join(unknown)}")

    def side(title: str, rows: dict[str, list[Any]], unit: str, limit: int | None) -> None:
        t = Table(title=title, title_justify="left")
        t.add_column("", no_wrap=True)
        for i, n in enumerate(names):
            t.add_column(n + (f" ({unit})" if unit else ""), justify="right", no_wrap=True)
            if i:
                t.add_column("vs first", justify="right", no_wrap=True)
        for k, vs in list(rows.items())[:limit]:
            cells = []
            for i, v in enumerate(vs):
                cells.append(escape(_fmt(v)))
                if i:
                    cells.append(_delta(vs[0], v))
            t.add_row(escape(k), *cells)
        console.print(t)

    t = Table(title="Totals", title_justify="left")
    t.add_column("", no_wrap=True)
    for i, n in enumerate(names):
        t.add_column(n, justify="right", no_wrap=True)
        if i:
            t.add_column("vs first", justify="right", no_wrap=True)
    units = {label: unit for label, _, _, unit in TOTALS}
    for k, vs in cmp["totals"].items():
        cells = []
        for i, v in enumerate(vs):
            cells.append(_fmt(v) + (f" {units[k]}" if v is not None and units[k] else ""))
            if i:
                cells.append(_delta(vs[0], v))
        t.add_row(escape(k), *cells)
    console.print(t)
    side("Per op", cmp["ops"], "ms", top)
    kern = {n: [None if v is None else v[1] for v in vs] for n, vs in cmp["kernels"].items()}
    side("Per kernel (a kernel of every layer as one row: total)", kern, "ms", top)
