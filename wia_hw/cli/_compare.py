"""``wia-hw compare A.json B.json [...]``: reports side by side.

Takes run reports (``wia-hw run -o``) and profiling reports (``wia-hw profile -o``).
Prints what differs in how they were made (spec, its hash, overrides, extensions and
their parameters, wia_hw version, seed, workload and its arguments: from each report's
``provenance``), then the totals, the time per op and per kernel (a kernel of every
layer grouped as one row, as in ``run``'s kernel table), each with its change against
the first report (``+12.3%``). ``--json`` prints the same as JSON.

The helpers :func:`read_report`, :func:`report_kind` and :func:`flatten` are shared
with ``wia-hw export``.
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

__all__ = ["compare_cmd", "compare_reports", "read_report", "report_kind", "flatten"]

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
    return d


def report_kind(d: dict[str, Any]) -> str | None:
    """``"run"``, ``"profile"`` or None, from the report's ``schema``."""
    schema = str(d.get("schema", ""))
    for kind in ("run", "profile"):
        if schema.startswith(f"wia-hw.{kind}/"):
            return kind
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


def _summary(d: dict[str, Any]) -> dict[str, Any]:
    """Totals, per-op ms, per-kernel (launches, ms) and provenance of one report."""
    if report_kind(d) == "run":
        totals = {label: d.get(key) for label, key, _, _ in TOTALS}
        ops = {o["name"]: o["time_ms"] for o in d.get("op_times", [])}
        kern = [(k["name"], k["time_ms"]) for k in d.get("kernels", [])]
    else:
        s = d.get("summary", {})
        totals = {label: s.get(key) if key else None for label, _, key, _ in TOTALS}
        clock = d.get("device", {}).get("clock_ghz") or 1.0

        def ms(c: int) -> float:
            return c / (clock * 1e6)

        ops = {}
        for o in d.get("ops", []):
            ops[o["name"]] = ops.get(o["name"], 0.0) + ms(o["end_cycle"] - o["start_cycle"])
        kern = [(k["name"], ms(k["end_cycle"] - k["start_cycle"])) for k in d.get("kernels", [])]
    kernels: dict[str, list[float]] = {}
    for name, t in kern:
        k = kernels.setdefault(_layerless(name), [0, 0.0])
        k[0] += 1
        k[1] += t
    return {"totals": totals, "ops": ops, "kernels": kernels, "provenance": d.get("provenance")}


def _made_with(prov: dict[str, Any] | None) -> dict[str, Any]:
    """How a report was made, as flat rows (what ``compare`` diffs)."""
    if not prov:
        return {"provenance": "not recorded"}
    rows: dict[str, Any] = {
        "spec": prov.get("spec"),
        "device": prov.get("device"),
        "spec sha256": str(prov.get("spec_sha256", ""))[:12],
    }
    for k, v in sorted(prov.get("overrides", {}).items()):
        rows[f"--set {k}"] = v
    for e in prov.get("extensions", []):
        rows[f"--ext {e['id']}"] = e.get("source")
        for k, v in sorted(e.get("parameters", {}).items()):
            rows[f"  {e['id']}.{k}"] = v
    for k, v in sorted(prov.get("peaks", {}).get("peak_tflops", {}).items()):
        rows[f"peak {k} TFLOPS"] = v
    rows["peak HBM GB/s"] = prov.get("peaks", {}).get("hbm_bandwidth_gbs")
    rows["wia_hw"] = prov.get("wia_hw_version")
    rows["seed"] = prov.get("seed")
    run = prov.get("run") or {}
    for k in ("workload", "batch", "seq", "precision", "mode"):
        if k in run:
            rows[k] = run[k]
    for k, v in sorted((run.get("kwargs") or {}).items()):
        rows[f"-a {k}"] = v
    return rows


def _delta(base: float | None, v: float | None) -> str:
    if base is None or v is None:
        return ""
    if base == 0:
        return "" if v == 0 else "new"
    return f"{100.0 * (v - base) / base:+.1f}%"


def compare_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison as data: ``made_with`` (rows that differ between the reports:
    name -> one value per report, ``None`` where absent), ``totals``, ``ops`` (ms) and
    ``kernels`` (``[launches, ms]``, a kernel of every layer as one), each name -> one
    value per report in the order of ``reports``; ops and kernels slowest first (by
    their largest time over the reports)."""
    sums = [_summary(d) for d in reports]
    made = [_made_with(s["provenance"]) for s in sums]
    keys = list(dict.fromkeys(k for m in made for k in m))
    differs = {
        k: [m.get(k) for m in made]
        for k in keys
        if len({json.dumps(m.get(k), sort_keys=True) for m in made}) > 1
    }
    totals = {label: [s["totals"].get(label) for s in sums] for label, *_ in TOTALS}
    totals = {k: v for k, v in totals.items() if any(x is not None for x in v)}
    op_names = list(dict.fromkeys(n for s in sums for n in s["ops"]))
    op_names.sort(key=lambda n: -max(s["ops"].get(n) or 0.0 for s in sums))
    ops = {n: [s["ops"].get(n) for s in sums] for n in op_names}
    k_names = list(dict.fromkeys(n for s in sums for n in s["kernels"]))
    k_names.sort(key=lambda n: -max(s["kernels"].get(n, [0, 0.0])[1] for s in sums))
    kernels = {n: [s["kernels"].get(n) for s in sums] for n in k_names}
    return {"made_with": differs, "totals": totals, "ops": ops, "kernels": kernels}


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
@click.option("--top", type=int, default=15, show_default=True, help="Kernels and ops to list.")
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
    if cmp["made_with"]:
        console.print(t)
    else:
        console.print("Made with: the same spec, overrides, extensions, version, seed and workload")

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
