"""Reading a sweep's results: best points per metric, the Pareto front, exports.

Functions return data; the PNG is drawn by :func:`plot_pareto` only (matplotlib is
imported there). Points of different workloads are never compared with each other:
every function works per workload label.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "MAXIMIZE",
    "PARETO_OBJECTIVES",
    "PARETO_PLOT_AXES",
    "better",
    "best_points",
    "pareto_front",
    "flat_rows",
    "write_csv",
    "write_parquet",
    "plot_pareto",
]

#: Metrics where larger is better; every other metric is better smaller.
MAXIMIZE = frozenset(
    {
        "throughput",
        "utilisation",
        "compute_utilization",
        "achieved_tflops",
        "peak_tflops",
        "memory_bandwidth_gbs",
        "cache_hits",
        "hits.l1",
        "hits.l2",
        "hits.hbm",
    }
)
#: The Pareto front's objectives (all minimised), when the points have them.
PARETO_OBJECTIVES = ("latency_ms", "energy_j", "area_mm2")
#: The Pareto plot's x and y (:func:`plot_pareto`).
PARETO_PLOT_AXES = ("latency_ms", "energy_j")


def better(metric: str) -> str:
    """``"max"`` or ``"min"``: which way ``metric`` improves."""
    return "max" if metric in MAXIMIZE else "min"


def _by_workload(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The ``ok`` rows by workload label, each point (``point_key``) once."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    seen: set[str] = set()
    for r in rows:
        if r["status"] == "ok" and r["metrics"] and r["point_key"] not in seen:
            seen.add(r["point_key"])
            out.setdefault(r["workload"], []).append(r)
    return out


def best_points(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Mapping[str, Any]]]:
    """workload -> metric -> the best ``ok`` row for it (ties: the smaller point_key)."""
    out: dict[str, dict[str, Mapping[str, Any]]] = {}
    for wl, rs in _by_workload(rows).items():
        metrics = sorted({m for r in rs for m in r["metrics"]})
        best = {}
        for m in metrics:
            have = [r for r in rs if isinstance(r["metrics"].get(m), (int, float))]
            if not have:
                continue
            sign = -1 if better(m) == "max" else 1
            best[m] = min(have, key=lambda r, m=m, s=sign: (s * r["metrics"][m], r["point_key"]))
        out[wl] = best
    return out


def pareto_front(
    rows: Iterable[Mapping[str, Any]], objectives: tuple[str, ...] | None = None
) -> dict[str, list[Mapping[str, Any]]]:
    """workload -> the ``ok`` rows no other row of that workload dominates, sorted by
    the first objective. A row dominates another when it is no worse in every
    objective and better in one (all minimised). ``objectives`` default: those of
    :data:`PARETO_OBJECTIVES` every row has; given, the rows without one of them are
    left out."""
    out = {}
    for wl, rs in _by_workload(rows).items():
        objs = objectives or tuple(
            o for o in PARETO_OBJECTIVES if all(o in r["metrics"] for r in rs)
        )
        rs = [r for r in rs if all(o in r["metrics"] for o in objs)]  # given: those that have them
        if len(objs) < 2:
            out[wl] = []
            continue
        vecs = [tuple(r["metrics"][o] for o in objs) for r in rs]
        front = []
        for i, v in enumerate(vecs):
            dominated = any(
                all(a <= b for a, b in zip(w, v, strict=True))
                and any(a < b for a, b in zip(w, v, strict=True))
                for j, w in enumerate(vecs)
                if j != i
            )
            if not dominated:
                front.append(rs[i])
        front.sort(key=lambda r: (tuple(r["metrics"][o] for o in objs), r["point_key"]))
        out[wl] = front
    return out


def flat_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) with one column per parameter (``param:<path>``) and per metric
    (``metric:<name>``) after the store's own columns."""
    rows = list(rows)
    params = sorted({k for r in rows for k in r["params"]})
    metrics = sorted({k for r in rows for k in (r["metrics"] or {})})
    base = ["point_key", "sweep_name", "workload", "status", "error", "wall_s", "finished_at"]
    cols = base + [f"param:{p}" for p in params] + [f"metric:{m}" for m in metrics]
    out = []
    for r in rows:
        d = {c: r[c] for c in base}
        d.update({f"param:{p}": r["params"].get(p) for p in params})
        d.update({f"metric:{m}": (r["metrics"] or {}).get(m) for m in metrics})
        out.append(d)
    return cols, out


def write_csv(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """All rows as CSV (columns of :func:`flat_rows`)."""
    cols, flat = flat_rows(rows)
    p = Path(path)
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(flat)
    return p


def write_parquet(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path | None:
    """All rows as Parquet; None (nothing written) when pyarrow is not installed.
    Parameter columns of mixed types are written as strings."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    cols, flat = flat_rows(rows)
    data = {}
    for c in cols:
        vals = [r[c] for r in flat]
        kinds = {type(v) for v in vals if v is not None}
        if len(kinds) > 1 and not kinds <= {int, float}:
            vals = [None if v is None else str(v) for v in vals]
        elif kinds == {int, float}:
            vals = [None if v is None else float(v) for v in vals]
        data[c] = vals
    p = Path(path)
    pq.write_table(pa.table(data), p)
    return p


def plot_pareto(
    rows: Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    x: str = PARETO_PLOT_AXES[0],
    y: str = PARETO_PLOT_AXES[1],
) -> Path:
    """A PNG: every ``ok`` point (``x`` against ``y``), one panel per workload, with
    its Pareto front drawn as a line (an SVG or PDF by ``path``'s suffix). The same
    rows give the same bytes: no date in an SVG or PDF, and a fixed id salt in an SVG
    (as ``report/_svg.py`` writes its plots). Needs matplotlib (``wia-hw[plot]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _by_workload(rows)
    fronts = pareto_front([r for rs in groups.values() for r in rs], (x, y))
    n = max(1, len(groups))
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False)
    for ax, (wl, rs) in zip(axes[0], sorted(groups.items()), strict=True):
        have = [r for r in rs if x in r["metrics"] and y in r["metrics"]]
        ax.scatter(
            [r["metrics"][x] for r in have],
            [r["metrics"][y] for r in have],
            s=14,
            color="0.6",
            label=f"points ({len(have)})",
        )
        fr = fronts.get(wl, [])
        ax.plot(
            [r["metrics"][x] for r in fr],
            [r["metrics"][y] for r in fr],
            "o-",
            color="C3",
            label=f"Pareto front ({len(fr)})",
        )
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(wl, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if not groups:
        axes[0][0].text(0.5, 0.5, "no finished points", ha="center", va="center")
    fig.tight_layout()
    p = Path(path)
    # matplotlib stamps an SVG's <dc:date> and a PDF's /CreationDate with the time, and
    # salts an SVG's ids at random: none of them, so a re-run compares equal
    metadata = {".svg": {"Date": None}, ".pdf": {"CreationDate": None}}.get(p.suffix.lower())
    with matplotlib.rc_context({"svg.hashsalt": "wia-hw-sweep"}):
        fig.savefig(p, dpi=110, metadata=metadata)
    plt.close(fig)
    return p
