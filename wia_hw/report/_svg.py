"""Plots for report pages, as SVG data URIs (``data:image/svg+xml;base64,...``).

Figures come from the profiling package's own plotting (:meth:`Roofline.figure`,
``memory_timeline_figure``) or are drawn here (the sweep's Pareto plot), always on a
``matplotlib.figure.Figure`` with the Agg canvas (no pyplot state, no display).
Matplotlib writes text as paths (``svg.fonttype = "path"``), so a page needs no font
file; the SVG carries no date and a fixed hash salt, so the same input gives the same
bytes. An ``<img>`` with a data URI keeps each SVG's ids to itself (two inline SVGs
on one page could clash) and scales with ``max-width: 100%``.
"""

from __future__ import annotations

import base64
import io
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["figure_data_uri", "run_roofline_figure", "pareto_figure"]


def figure_data_uri(fig: Any) -> str:
    """``fig`` as an SVG data URI (text drawn as paths; no date; fixed id salt)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "wia-hw-report"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    # Any http(s) reference would be a network request the page must not make; the
    # only URLs matplotlib writes are XML namespace names and the creator's homepage
    # in <metadata>, which a browser does not fetch. Drop the metadata anyway.
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    return "data:image/svg+xml;base64," + base64.b64encode(text.encode("utf-8")).decode("ascii")


def run_roofline_figure(spec: Any, kernels: Sequence[Mapping[str, Any]]) -> tuple[Any, Any]:
    """(figure, :class:`~wia_hw.profiling.Roofline`) of a run report's kernels on the device's roofline: kernels
    that differ only by their ``layerN.`` prefix are one point (FLOPs, HBM bytes and
    time summed), at FLOP per HBM byte and achieved FLOP/s, judged against the array
    ceiling of their precision. A run report keeps no per-level floors, so this is
    the HBM-level view; a profile report's page plots each kernel's own ceilings."""
    from ..profiling import create_roofline

    rf = create_roofline(spec)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for k in kernels:
        groups.setdefault(re.sub(r"^layer\d+\.", "", str(k.get("name", ""))), []).append(k)
    cfg = rf.config
    for name, ks in groups.items():
        flops = sum(float(k.get("flops") or 0) for k in ks)
        hbm = sum(float(((k.get("counters") or {}).get("bytes") or {}).get("hbm") or 0) for k in ks)
        t_ms = sum(float(k.get("time_ms") or 0) for k in ks)
        if not (flops > 0 and hbm > 0 and t_ms > 0):
            continue
        prec = ks[0].get("precision")
        if prec != cfg.precision and prec not in cfg.precision_peaks:
            prec = None
        label = name + (f" (x{len(ks)})" if len(ks) > 1 else "")
        perf = flops / (t_ms * 1e-3)
        if not math.isfinite(perf):
            continue
        rf.add_point(flops / hbm, perf, label, precision=prec, time_ms=t_ms)
    fig = rf.figure(title=f"Roofline: {cfg.name} (HBM intensity; kernels alike over layers summed)")
    return fig, rf


def pareto_figure(
    by_workload: Mapping[str, Sequence[Mapping[str, Any]]],
    fronts: Mapping[str, Sequence[Mapping[str, Any]]],
    x: str = "latency_ms",
    y: str = "energy_j",
) -> Any:
    """One panel per workload: every ``ok`` point (grey) and its Pareto front of ``x``
    against ``y`` (both minimised; red, joined by a step line)."""
    from ..profiling._plot import new_figure

    names = list(by_workload)
    n = max(1, len(names))
    fig = new_figure((7.5, 3.6 * n))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    ys = 1e3 if y == "energy_j" else 1.0
    for ax, wl in zip(axes, names, strict=False):
        pts = [p for p in by_workload[wl] if x in p["metrics"] and y in p["metrics"]]
        ax.scatter(
            [p["metrics"][x] for p in pts],
            [p["metrics"][y] * ys for p in pts],
            s=16,
            color="0.6",
            label=f"points ({len(pts)})",
            gid="points",
        )
        fr = list(fronts.get(wl, []))
        if fr:
            ax.step(
                [p["metrics"][x] for p in fr],
                [p["metrics"][y] * ys for p in fr],
                where="post",
                color="tab:red",
                lw=1.0,
            )
            ax.scatter(
                [p["metrics"][x] for p in fr],
                [p["metrics"][y] * ys for p in fr],
                s=26,
                color="tab:red",
                edgecolors="black",
                linewidths=0.5,
                zorder=3,
                label=f"Pareto front ({len(fr)})",
                gid="front",
            )
        ax.set_title(wl, fontsize=9)
        ax.set_xlabel("latency (ms)" if x == "latency_ms" else x)
        ax.set_ylabel("energy (mJ)" if y == "energy_j" else y)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig
