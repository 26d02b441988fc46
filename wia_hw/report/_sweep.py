"""The page of a sweep store: the points, the best point per metric, the Pareto front of
latency against energy, and the failed points with their errors.

Points of different workloads are never compared: best points and Pareto fronts are
per workload label (:func:`wia_hw.sweep.best_points`, :func:`wia_hw.sweep.pareto_front`;
a metric improves downwards unless it is in :data:`wia_hw.sweep.MAXIMIZE`). The plotted
front is of latency against energy: the ``ok`` points no other point of the same
workload dominates in those two (no worse in both, better in one), sorted by latency.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..emulator.errors import WiaError
from ..sweep import MAXIMIZE, best_points, pareto_front
from ._load import STORE_FORMAT, SweepData
from ._page import Col, esc, figures, fmt, page, plot, section, table

__all__ = ["sweep_report_html"]

PLOT_X, PLOT_Y = "latency_ms", "energy_j"


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ok_by_workload(points: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for p in points:
        if p.get("status") == "ok" and isinstance(p.get("metrics"), Mapping):
            out.setdefault(str(p.get("workload")), []).append(p)
    return out


def _latency_energy_front(
    points: Sequence[Mapping[str, Any]],
) -> dict[str, list[Mapping[str, Any]]]:
    """workload -> Pareto front of latency against energy (both minimised), over the
    ``ok`` points that have both."""
    have = [
        p
        for p in points
        if p.get("status") == "ok"
        and isinstance(p.get("metrics"), Mapping)
        and _num(p["metrics"].get(PLOT_X))
        and _num(p["metrics"].get(PLOT_Y))
    ]
    return pareto_front(have, (PLOT_X, PLOT_Y))


def _params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(params.items()))


def sweep_report_html(data: SweepData) -> str:
    """The page of a sweep store read by :func:`read_sweep_store`, as an HTML string.
    The Pareto plot needs matplotlib; without it the page says so there."""
    pts = data.points
    ok = [p for p in pts if p.get("status") == "ok" and isinstance(p.get("metrics"), Mapping)]
    failed = [p for p in pts if p not in ok]
    by_wl = _ok_by_workload(pts)
    params = sorted({k for p in pts for k in (p.get("params") or {})})
    metrics = sorted({m for p in ok for m, v in p["metrics"].items() if _num(v)})
    sweeps = data.sweeps()
    workloads = sorted({str(p.get("workload")) for p in pts})
    lat = [p["metrics"]["latency_ms"] for p in ok if _num(p["metrics"].get("latency_ms"))]
    best_lat = min(lat) if lat else None
    figs = [
        ("points", "points", len(pts), fmt(len(pts))),
        ("ok", "finished ok", len(ok), fmt(len(ok))),
        ("failed", "failed", len(failed), fmt(len(failed))),
        ("workloads", "workloads", len(workloads), fmt(len(workloads))),
        ("parameters", "parameters", len(params), fmt(len(params))),
        (
            "best_latency_ms",
            "best latency (any workload)",
            best_lat,
            f"{fmt(best_lat, 4)} ms",
        ),
    ]
    wall = [float(p["wall_s"]) for p in pts if _num(p.get("wall_s"))]
    if wall:
        figs.append(("wall_s", "worker time", sum(wall), f"{fmt(sum(wall))} s"))
    desc = "".join(
        f"<details><summary>sweep {esc(name)}</summary>"
        f"<pre>{esc(json.dumps(s, indent=1, sort_keys=True))}</pre></details>"
        for name, s in sweeps.items()
    )
    sections = [section("summary", "Summary", figures(figs) + desc)]

    # best points per workload and metric
    brow = []
    for wl, best in sorted(best_points(pts).items()):
        for m, r in best.items():
            brow.append(
                {
                    "workload": wl,
                    "metric": m,
                    "goal": "max" if m in MAXIMIZE else "min",
                    "value": r["metrics"][m],
                    "params": _params_text(r.get("params") or {}),
                    "point_key": r.get("point_key"),
                }
            )
    bcols = [
        Col("workload", "workload"),
        Col("metric", "metric"),
        Col("goal", "goal"),
        Col("best", "value", num=True, digits=4),
        Col("parameters", "params", wrap=True),
        Col("point", "point_key"),
    ]
    sections.append(
        section("best", "Best point per metric", table(bcols, brow, table_id="best-table"))
    )

    # Pareto front
    fronts = _latency_energy_front(pts)
    body = ""
    if any(fronts.values()):
        try:
            from ._svg import figure_data_uri, pareto_figure

            uri = figure_data_uri(pareto_figure(by_wl, fronts))
            body += plot(uri, "latency against energy, one panel per workload", "pareto-plot")
        except WiaError as e:
            body += f'<p class="muted">No plot: {esc(e)}</p>'
        frows = [
            {
                "workload": wl,
                "latency_ms": r["metrics"]["latency_ms"],
                "energy_mj": r["metrics"]["energy_j"] * 1e3,
                "params": _params_text(r.get("params") or {}),
                "point_key": r.get("point_key"),
            }
            for wl, fr in sorted(fronts.items())
            for r in fr
        ]
        fcols = [
            Col("workload", "workload"),
            Col("latency (ms)", "latency_ms", num=True, digits=4),
            Col("energy (mJ)", "energy_mj", num=True, digits=4),
            Col("parameters", "params", wrap=True),
            Col("point", "point_key"),
        ]
        body += table(fcols, frows, table_id="pareto-table")
    else:
        body = '<p class="muted">No point has both latency_ms and energy_j.</p>'
    sections.append(section("pareto", "Pareto front: latency against energy", body))

    # all ok points
    rows = []
    for i, p in enumerate(ok):
        r: dict[str, Any] = {
            "i": i,
            "workload": p.get("workload"),
            "wall_s": p.get("wall_s"),
            "point_key": p.get("point_key"),
            "sweep": p.get("sweep_name"),
        }
        for k in params:
            v = (p.get("params") or {}).get(k)
            r[f"param:{k}"] = v if _num(v) or v is None else json.dumps(v)
        for m in metrics:
            r[f"metric:{m}"] = p["metrics"].get(m)
        rows.append(r)
    num_params = {k for k in params if all(_num((p.get("params") or {}).get(k, 0)) for p in ok)}
    pcols = [
        Col("#", "i", num=True),
        Col("workload", "workload"),
        *[Col(k, f"param:{k}", num=k in num_params, digits=4) for k in params],
        *[Col(m, f"metric:{m}", num=True, digits=4) for m in metrics],
        Col("wall (s)", "wall_s", num=True),
        Col("sweep", "sweep"),
        Col("point", "point_key"),
    ]
    sections.append(
        section(
            "points",
            "Points",
            f'<p class="muted">{len(ok)} finished points, in the order they finished. '
            "Click a header to sort by it.</p>" + table(pcols, rows, table_id="points-table"),
        )
    )

    # failed points
    if failed:
        frows2 = [
            {
                "i": i,
                "workload": p.get("workload"),
                "params": _params_text(p.get("params") or {}),
                "error": p.get("error") or f"status {p.get('status')!r}",
                "wall_s": p.get("wall_s"),
                "point_key": p.get("point_key"),
            }
            for i, p in enumerate(failed)
        ]
        ecols = [
            Col("#", "i", num=True),
            Col("workload", "workload"),
            Col("parameters", "params", wrap=True),
            Col("error", "error", wrap=True),
            Col("wall (s)", "wall_s", num=True),
            Col("point", "point_key"),
        ]
        body = table(ecols, frows2, table_id="failed-table")
    else:
        body = "<p>None.</p>"
    sections.append(section("failed", "Failed points", body))
    title = "Sweep " + (", ".join(sweeps) if sweeps else data.path.name)
    sub = (
        f"sweep store {data.path.name} ({data.meta.get('format', STORE_FORMAT)}), "
        f"created {data.meta.get('created_at', '?')} by wia-hw "
        f"{data.meta.get('wia_hw_version', '?')}"
    )
    return page(title, sub, sections, kind="sweep")
