"""The page of one run: from a run report (``wia-hw.run/1``, what ``wia-hw run --json``
writes) or a profiling report (``wia-hw.profile/1``, what ``wia-hw profile -o`` and
:func:`~wia_hw.profiling.save_profile_report` write), given as their JSON dicts or as
the live :class:`~wia_hw.RunResult` / :class:`~wia_hw.profiling.ProfilingReport`.

Sections: the run summary (key figures, each a ``dd#fig-<name>`` with the exact value
in ``data-value``), the operation breakdown, the kernel table (one row per kernel
launch, hottest first, sortable), the roofline, the memory timeline (profiling
reports that hold memory events), the communication summary (profiling reports that
captured it), and the recommendations with their gains.

Recommendations come from, in order: the ``recommendations`` argument; a
``recommendations`` entry in the JSON (the form of
:meth:`PerformanceRecommendations.to_dict`); otherwise
:func:`~wia_hw.profiling.analyze_performance` run on the profiling report at the lowest
thresholds. On a live report that re-runs the emulator, so the gains are measured; a
report read back from JSON keeps no kernels to replay, so its gains are modelled
estimates (heuristics from the counters, which a measurement can exceed or fall short
of), and each recommendation says which (its ``confidence_basis``). A run report
has no profile to analyse and gets none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..emulator.errors import WiaError
from ._load import PROFILE_SCHEMA, RUN_SCHEMA, ReportError
from ._page import Col, esc, figures, fmt, page, plot, section, table

__all__ = ["report_kind", "run_report_html"]

_KERNEL_COLS_RUN = [
    Col("#", "index", num=True),
    Col("kernel", "name"),
    Col("op group", "group"),
    Col("kind", "kind"),
    Col("precision", "precision"),
    Col("provider", "provider"),
    Col("start (ms)", "start_ms", num=True, digits=4),
    Col("time (ms)", "time_ms", num=True, digits=4),
    Col("cycles", "cycles", num=True),
    Col("GFLOP", "gflop", num=True),
    Col("TFLOPS", "tflops", num=True),
    Col("util %", "compute_utilization", num=True),
    # a run report keeps no split of the HBM bytes: every byte that crossed during the
    # kernel, the L2's write-backs of earlier results included
    Col("HBM MB (incl. write-backs)", "hbm_mb", num=True),
    Col("FLOP/B (HBM, incl. write-backs)", "ai_hbm", num=True),
    Col("tiles", "tiles", num=True),
]
_KERNEL_COLS_PROFILE = [
    *(c for c in _KERNEL_COLS_RUN if c.key not in ("hbm_mb", "ai_hbm", "tiles")),
    # the kernel's own HBM traffic (what its intensity, floors and roofline point use),
    # and apart the L2's eager write-backs of earlier results that crossed HBM during it
    Col("HBM MB (own)", "hbm_mb", num=True),
    Col("FLOP/B (HBM)", "ai_hbm", num=True),
    Col("write-back MB", "writeback_mb", num=True),
    Col("tiles", "tiles", num=True),
    Col("bound", "bound"),
    Col("occupancy %", "occupancy", num=True),
    Col("L1 hit %", "l1_cache_hit_rate", num=True),
]


def _f(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _shape(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items() if k != "model")


# -- normalising the two report kinds ---------------------------------------------------
def _records(d: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """``d[key]`` as a list of objects (missing or null: empty); ReportError otherwise."""
    v = d.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, Mapping) for x in v):
        raise ReportError(f"{key!r} must be a list of objects, got {type(v).__name__}")
    for i, x in enumerate(v):
        for sub in ("counters", "profile", "params"):
            if x.get(sub) is not None and not isinstance(x[sub], Mapping):
                raise ReportError(f"{key}[{i}].{sub} must be an object")
    return v


def _obj(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``d[key]`` as an object (missing or null: empty); ReportError otherwise."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ReportError(f"{key!r} must be an object, got {type(v).__name__}")
    return v


def _run_spec(d: Mapping[str, Any]) -> tuple[Any, str]:
    """(the device spec a run report used, or None; why not). The spec is loaded as its
    ``provenance`` records it (source and ``--set`` overrides; the report's ``device``
    name without provenance) and must hash to the recorded ``spec_sha256``."""
    from ..runtime import spec_sha256
    from ..spec import load_spec

    prov = _obj(d, "provenance")
    source = prov.get("spec") or d.get("device")
    try:
        spec = load_spec(str(source), _obj(prov, "overrides") or None)
    except WiaError as e:
        return None, f"the device spec {source} cannot be loaded here ({e})"
    if not hasattr(spec, "peak_bandwidth_gbs"):
        return None, f"{source} is not a device spec"
    want = prov.get("spec_sha256")
    if want and spec_sha256(spec) != want:
        return None, (
            f"the spec {source} loaded here (sha256 {spec_sha256(spec)[:12]}) is not the one "
            f"the run used (sha256 {str(want)[:12]})"
        )
    return spec, ""


def _provenance(d: Mapping[str, Any]) -> str:
    prov = _obj(d, "provenance")
    if not prov:
        return '<p class="muted">Provenance not recorded in this report.</p>'
    sets = ", ".join(f"{k}={v}" for k, v in _obj(prov, "overrides").items())
    exts = prov.get("extensions") or []
    line = (
        f"spec {prov.get('spec')} (sha256 {str(prov.get('spec_sha256', '?'))[:12]})"
        + (f", --set {sets}" if sets else "")
        + (f", {len(exts)} extension(s)" if exts else "")
        + f", wia-hw {prov.get('wia_hw_version', '?')}, seed {prov.get('seed', '?')}"
    )
    return (
        f'<details id="provenance"><summary>{esc(line)}</summary>'
        f"<pre>{esc(json.dumps(prov, indent=1, sort_keys=True, default=str))}</pre></details>"
    )


def _run_view(d: Mapping[str, Any]) -> dict[str, Any]:
    kernels = []
    for i, k in enumerate(_records(d, "kernels")):
        flops = _f(k.get("flops"))
        t = _f(k.get("time_ms"))
        hbm = _f(((k.get("counters") or {}).get("bytes") or {}).get("hbm"))
        kernels.append(
            {
                "index": i,
                "name": k.get("name"),
                "group": k.get("group"),
                "kind": k.get("kind"),
                "precision": k.get("precision"),
                "provider": k.get("provider"),
                "start_ms": _f(k.get("start_ms")),
                "time_ms": t,
                "cycles": k.get("cycles"),
                "gflop": None if flops is None else flops / 1e9,
                "tflops": _div(flops, None if t is None else t * 1e-3 * 1e12),
                "compute_utilization": _f(k.get("compute_utilization")),
                "hbm_mb": None if hbm is None else hbm / 1e6,
                "ai_hbm": _div(flops, hbm),
                "tiles": k.get("tiles"),
            }
        )
    ops = [
        {
            "name": o.get("name"),
            "count": o.get("count"),
            "time_ms": _f(o.get("time_ms")),
            "pct": _f(o.get("pct")),
            "gflop": None if _f(o.get("flops")) is None else float(o["flops"]) / 1e9,
        }
        for o in _records(d, "ops")
    ]
    peak_bw = _f(_obj(_obj(d, "provenance"), "peaks").get("hbm_bandwidth_gbs"))
    if peak_bw is None:  # a report from before provenance: the spec as named now
        spec, _ = _run_spec(d)
        peak_bw = None if spec is None else float(spec.peak_bandwidth_gbs)
    e = _f(d.get("energy_j"))
    figs = [
        ("latency_ms", "latency", d.get("latency_ms"), f"{fmt(d.get('latency_ms'), 4)} ms"),
        ("throughput", "throughput", d.get("throughput"), f"{fmt(d.get('throughput'))} seq/s"),
        ("cycles", "cycles", d.get("cycles"), fmt(d.get("cycles"))),
        (
            "achieved_tflops",
            "achieved",
            d.get("achieved_tflops"),
            f"{fmt(d.get('achieved_tflops'))} TFLOPS",
        ),
        (
            "peak_tflops",
            "peak compute",
            d.get("peak_tflops"),
            f"{fmt(d.get('peak_tflops'))} TFLOPS",
        ),
        (
            "compute_utilization",
            "compute utilisation",
            d.get("compute_utilization"),
            f"{fmt(d.get('compute_utilization'))} %",
        ),
        (
            "memory_bandwidth_gbs",
            "HBM bandwidth",
            d.get("memory_bandwidth_gbs"),
            f"{fmt(d.get('memory_bandwidth_gbs'))} GB/s",
        ),
        ("peak_bandwidth_gbs", "peak HBM bandwidth", peak_bw, f"{fmt(peak_bw)} GB/s"),
        (
            "roofline_floor_ms",
            "roofline floor",
            d.get("roofline_floor_ms"),
            f"{fmt(d.get('roofline_floor_ms'), 4)} ms",
        ),
        ("energy_j", "energy", d.get("energy_j"), f"{fmt(None if e is None else e * 1e3)} mJ"),
        ("avg_power_w", "average power", d.get("avg_power_w"), f"{fmt(d.get('avg_power_w'))} W"),
        (
            "peak_temperature_c",
            "peak temperature",
            d.get("peak_temperature_c"),
            f"{fmt(d.get('peak_temperature_c'))} °C",
        ),
        ("flops", "work", d.get("flops"), f"{fmt(_div(_f(d.get('flops')), 1e9))} GFLOP"),
        ("kernels", "kernels", len(kernels), fmt(len(kernels))),
    ]
    return {
        "kind": "run",
        "title": f"{d.get('workload')} on {d.get('device')}",
        "subtitle": f"run report ({RUN_SCHEMA}): {_shape(_obj(d, 'params'))}; "
        f"{d.get('precision')}, {d.get('mode')} mode, seed {d.get('seed')}",
        "figures": figs,
        "ops": ops,
        "kernels": kernels,
        "kernel_cols": _KERNEL_COLS_RUN,
    }


def _profile_view(d: Mapping[str, Any]) -> dict[str, Any]:
    dev = _obj(d, "device")
    clock = _f(dev.get("clock_ghz")) or 0.0
    per_ms = clock * 1e6
    s = _obj(d, "summary")
    start = int(d.get("start_cycle") or 0)
    kernels = []
    for i, k in enumerate(_records(d, "kernels")):
        p = k.get("profile") or {}
        flops = _f(k.get("flop_count"))
        t = _f(p.get("duration_ms"))
        # the kernel's own HBM bytes, as its profile counts them: the counters less the
        # eager write-backs of earlier results during it (a report without the profile's
        # bytes: the same from the counters)
        crossed = _f(((k.get("counters") or {}).get("bytes") or {}).get("hbm"))
        eager = _f(k.get("eager_writeback_bytes")) or 0.0
        hbm = _f((p.get("bytes") or {}).get("hbm"))
        if hbm is None and crossed is not None:
            hbm = crossed - eager
        sc = _f(k.get("start_cycle"))
        kernels.append(
            {
                "index": i,
                "name": k.get("name"),
                "group": k.get("group"),
                "kind": k.get("kind"),
                "precision": k.get("precision"),
                "provider": k.get("provider"),
                "start_ms": None if sc is None or not per_ms else (sc - start) / per_ms,
                "time_ms": t,
                "cycles": p.get("cycles"),
                "gflop": None if flops is None else flops / 1e9,
                "tflops": _div(flops, None if t is None else t * 1e-3 * 1e12),
                "compute_utilization": _f(p.get("compute_utilization")),
                "hbm_mb": None if hbm is None else hbm / 1e6,
                "ai_hbm": _div(flops, hbm),
                "writeback_mb": None if crossed is None else eager / 1e6,
                "tiles": k.get("tiles"),
                "bound": p.get("bound"),
                "occupancy": _f(p.get("occupancy")),
                "l1_cache_hit_rate": _f(p.get("l1_cache_hit_rate")),
            }
        )
    groups: dict[str, dict[str, Any]] = {}
    ks = _records(d, "kernels")
    for o in _records(d, "ops"):
        g = groups.setdefault(
            str(o.get("group") or o.get("name")),
            {"name": o.get("group") or o.get("name"), "count": 0, "cycles": 0, "flops": 0.0},
        )
        g["count"] += 1
        g["cycles"] += int(o.get("end_cycle", 0)) - int(o.get("start_cycle", 0))
        g["flops"] += sum(
            float(ks[j].get("flop_count") or 0)
            for j in o.get("kernels") or []
            if isinstance(j, int) and 0 <= j < len(ks)
        )
    dur = _f(d.get("duration_ms")) or 0.0
    ops = []
    for g in sorted(groups.values(), key=lambda g: -g["cycles"]):
        t_ms = g["cycles"] / per_ms if per_ms else None
        ops.append(
            {
                "name": g["name"],
                "count": g["count"],
                "time_ms": t_ms,
                "pct": 100.0 * t_ms / dur if t_ms is not None and dur else None,
                "gflop": g["flops"] / 1e9,
            }
        )
    runs = _records(d, "runs")
    seqs = sum(int((r.get("params") or {}).get("batch") or 1) for r in runs)
    throughput = seqs / (dur * 1e-3) if dur and runs else None
    prec = s.get("precision") or "fp16"
    peak = _f(_obj(dev, "peak_flops").get(prec))
    # the peak over the session: its start (a die that cools from a hot start peaks
    # there) and every kernel's end, as a run's peak_temperature_c
    temps = [_f(k.get("temperature_c")) for k in ks]
    if any(t is not None for t in temps):
        temps.append(_f(d.get("start_temperature_c")))
    peak_temp = max((t for t in temps if t is not None), default=None)
    mem = _obj(d, "memory") or None
    e = _f(s.get("energy_j"))
    figs = [
        ("latency_ms", "duration", d.get("duration_ms"), f"{fmt(d.get('duration_ms'), 4)} ms"),
        ("throughput", "throughput", throughput, f"{fmt(throughput)} seq/s"),
        ("cycles", "cycles", d.get("cycles"), fmt(d.get("cycles"))),
        (
            "achieved_tflops",
            "achieved",
            s.get("achieved_tflops"),
            f"{fmt(s.get('achieved_tflops'))} TFLOPS",
        ),
        (
            "peak_tflops",
            f"peak compute ({prec})",
            None if peak is None else peak / 1e12,
            f"{fmt(None if peak is None else peak / 1e12)} TFLOPS",
        ),
        (
            "compute_utilization",
            "compute utilisation",
            s.get("compute_utilization"),
            f"{fmt(s.get('compute_utilization'))} %",
        ),
        (
            "memory_bandwidth_gbs",
            "HBM bandwidth",
            s.get("memory_bandwidth_gbs"),
            f"{fmt(s.get('memory_bandwidth_gbs'))} GB/s",
        ),
        (
            "peak_bandwidth_gbs",
            "peak HBM bandwidth",
            s.get("peak_bandwidth_gbs"),
            f"{fmt(s.get('peak_bandwidth_gbs'))} GB/s",
        ),
        (
            "l1_cache_hit_rate",
            "L1 hit rate",
            s.get("l1_cache_hit_rate"),
            f"{fmt(s.get('l1_cache_hit_rate'))} %",
        ),
        (
            "l2_cache_hit_rate",
            "L2 hit rate",
            s.get("l2_cache_hit_rate"),
            f"{fmt(s.get('l2_cache_hit_rate'))} %",
        ),
        ("energy_j", "energy", s.get("energy_j"), f"{fmt(None if e is None else e * 1e3)} mJ"),
        ("avg_power_w", "average power", s.get("avg_power_w"), f"{fmt(s.get('avg_power_w'))} W"),
        ("peak_temperature_c", "peak temperature", peak_temp, f"{fmt(peak_temp)} °C"),
        ("flops", "work", s.get("flops"), f"{fmt(_div(_f(s.get('flops')), 1e9))} GFLOP"),
        ("kernels", "kernels", len(kernels), fmt(len(kernels))),
    ]
    if mem:
        figs.append(
            (
                "peak_usage_gb",
                "peak device memory",
                mem.get("peak_usage_gb"),
                f"{fmt(mem.get('peak_usage_gb'))} GB",
            )
        )
    workloads = ", ".join(f"{r.get('workload')} ({_shape(r.get('params') or {})})" for r in runs)
    return {
        "kind": "profile",
        "title": f"{', '.join(str(r.get('workload')) for r in runs) or 'profile'} on "
        f"{dev.get('name')}",
        "subtitle": f"profiling report ({PROFILE_SCHEMA}), {d.get('mode')} mode: "
        f"{len(runs)} run(s): {workloads}",
        "figures": figs,
        "ops": ops,
        "kernels": kernels,
        "kernel_cols": _KERNEL_COLS_PROFILE,
    }


# -- sections ---------------------------------------------------------------------------
def _ops_section(ops: Sequence[dict[str, Any]]) -> str:
    cols = [
        Col("operation", "name"),
        Col("count", "count", num=True),
        Col("time (ms)", "time_ms", num=True, digits=4),
        Col("%", "pct", num=True),
        Col("GFLOP", "gflop", num=True),
    ]
    return section("ops", "Operation breakdown", table(cols, list(ops), table_id="ops-table"))


def _kernel_section(v: Mapping[str, Any]) -> str:
    rows = sorted(v["kernels"], key=lambda r: (-(r["time_ms"] or 0.0), r["index"]))
    body = (
        f'<p class="muted">{len(rows)} kernel launches, longest first; '
        "# is the launch order. Click a header to sort.</p>"
        + table(v["kernel_cols"], rows, table_id="kernel-table")
    )
    return section("kernels", "Kernels", body)


def _roofline_section(kind: str, d: Mapping[str, Any], report: Any) -> str:
    from ._svg import figure_data_uri, run_roofline_figure

    try:
        if kind == "profile":
            from ..profiling import Roofline

            rf = Roofline(_roofline_config(report.device))
            rf.add_report(report)
            fig = rf.figure()
            note = (
                "Kernels alike over layers are one point; each is judged against its "
                "own compute-side ceiling and the memory level that binds it."
            )
        else:
            spec, why = _run_spec(d)
            if spec is None:
                return section(
                    "roofline", "Roofline", f'<p class="muted">No roofline: {esc(why)}.</p>'
                )
            fig, rf = run_roofline_figure(spec, _records(d, "kernels"))
            note = (
                "A run report keeps no per-level floors: points sit at FLOP per HBM byte "
                "against the array ceilings (profile the run for each kernel's own ceilings)."
            )
        uri = figure_data_uri(fig)
    except WiaError as e:  # matplotlib missing
        return section("roofline", "Roofline", f'<p class="muted">No plot: {esc(e)}</p>')
    pd = rf.plot_data()
    times = {p.name: p.time_ms for p in rf.points}
    rows = [
        {
            "name": p["name"],
            "time_ms": times.get(p["name"]),
            "ai": p["x"],
            "tflops": p["y"] / 1e12,
            "roof": p["roof"] / 1e12,
            "pct": 100.0 * p["y"] / p["roof"] if p["roof"] else None,
            "bound": "memory" if p["memory_bound"] else "compute side",
            "level": p.get("level") or p.get("ceiling"),
        }
        for p in pd["points"]
    ]
    cols = [
        Col("kernel", "name"),
        Col("time (ms)", "time_ms", num=True, digits=4),
        Col("FLOP/byte", "ai", num=True),
        Col("TFLOPS", "tflops", num=True),
        Col("roof TFLOPS", "roof", num=True),
        Col("% of roof", "pct", num=True),
        Col("bound", "bound"),
        Col("level / ceiling", "level"),
    ]
    body = (
        f'<p class="muted">{esc(note)} Ridge point {fmt(rf.ridge_point())} FLOP/byte.</p>'
        + plot(uri, "roofline plot", "roofline-plot")
        + "<details><summary>points</summary>"
        + table(cols, rows, table_id="roofline-table")
        + "</details>"
    )
    return section("roofline", "Roofline", body)


def _roofline_config(dev: Any) -> Any:
    """The ceilings :meth:`RooflineConfig.from_spec` gives, from a report's stored
    :class:`DeviceInfo` (a report read from JSON has no spec)."""
    from ..profiling import RooflineConfig

    prec = "fp16" if "fp16" in dev.peak_macs_per_cycle else next(iter(dev.peak_macs_per_cycle))
    return RooflineConfig(
        peak_flops=dev.peak_flops(prec),
        peak_bandwidth=dev.hbm_bandwidth_gbs * 1e9,
        cache_sizes=(dev.l1_size_bytes * dev.cores, dev.l2_size_bytes),
        cache_bandwidths=(dev.level_bandwidth_gbs("l1") * 1e9, dev.l2_bandwidth_gbs * 1e9),
        cache_names=("L1", "L2"),
        precision=prec,
        precision_peaks={p: dev.peak_flops(p) for p in dev.peak_macs_per_cycle if p != prec},
        name=dev.name,
    )


def _memory_section(report: Any) -> str:
    mem = report.memory
    if mem is None:
        return ""
    from ..profiling import analyze_fragmentation

    parts = []
    try:
        from ..profiling._memory import memory_timeline_figure
        from ._svg import figure_data_uri

        parts.append(
            plot(
                figure_data_uri(memory_timeline_figure(mem)),
                "device memory over the allocator's calls",
                "memory-plot",
            )
        )
    except WiaError as e:
        parts.append(f'<p class="muted">No plot: {esc(e)}</p>')
    parts.append(f"<pre>{esc(mem.format())}\n\n{esc(analyze_fragmentation(mem).format())}</pre>")
    return section("memory", "Memory timeline", "".join(parts))


def _comm_section(comm: Mapping[str, Any] | None) -> str:
    if not comm:
        return ""
    events = [e for e in comm.get("events") or [] if isinstance(e, Mapping)]
    body = ""
    if comm.get("note"):
        body += f'<p class="muted">{esc(comm["note"])}</p>'
    if events:
        groups: dict[str, dict[str, Any]] = {}
        for e in events:
            name = str(e.get("collective") or e.get("kind") or e.get("name") or "message")
            g = groups.setdefault(name, {"name": name, "count": 0, "cycles": 0, "bytes": 0})
            g["count"] += 1
            g["cycles"] += int(e.get("end_cycle", 0)) - int(e.get("start_cycle", 0))
            g["bytes"] += int(e.get("nbytes", e.get("bytes", 0)) or 0)
        cols = [
            Col("collective / message", "name"),
            Col("count", "count", num=True),
            Col("cycles", "cycles", num=True),
            Col("bytes", "bytes", num=True),
        ]
        body += table(cols, list(groups.values()), table_id="comm-table")
    elif not comm.get("note"):
        body += '<p class="muted">No link messages.</p>'
    return section("communication", "Communication", body)


def _recs_from(obj: Any) -> list[dict[str, Any]] | None:
    if obj is None:
        return None
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if isinstance(obj, Mapping):
        obj = obj.get("recommendations")
    if not isinstance(obj, Sequence) or isinstance(obj, (str, bytes)):
        raise ReportError(
            "recommendations must be a PerformanceRecommendations, its to_dict() or a "
            f"list of Recommendation dicts, got {type(obj).__name__}"
        )
    return [dict(r.to_dict() if hasattr(r, "to_dict") else r) for r in obj]


def _recs_section(recs: list[dict[str, Any]] | None, why: str) -> str:
    if recs is None:
        return section("recommendations", "Recommendations", f'<p class="muted">{esc(why)}</p>')
    out = [f'<p class="muted">{esc(why)}</p>']
    if not recs:
        out.append("<p>No recommendation.</p>")
    for i, r in enumerate(recs):
        imp = _f(r.get("estimated_improvement"))
        conf = _f(r.get("confidence"))
        basis = str(r.get("confidence_basis") or "")
        how = basis.split(":", 1)[0] if ":" in basis else ""
        b, m = _f(r.get("baseline_ms")), _f(r.get("modified_ms"))
        gain = (
            f"{fmt(None if imp is None else imp * 100)} % of the profiled time"
            + (f" ({how})" if how else "")
            + (f": {fmt(b, 4)} ms -> {fmt(m, 4)} ms" if b is not None and m is not None else "")
        )
        pr = str(r.get("priority", ""))
        code = r.get("code_example")
        out.append(
            f'<div class="rec" id="rec-{i}" data-improvement="{esc("" if imp is None else repr(imp))}">'
            f'<h3><span class="tag {esc(pr)}">{esc(pr)}</span> {esc(r.get("title", ""))}</h3>'
            f"<p><b>Issue:</b> {esc(r.get('description', ''))}</p>"
            f"<p><b>Impact:</b> {esc(r.get('impact', ''))}</p>"
            f"<p><b>Suggestion:</b> {esc(r.get('suggestion', ''))}</p>"
            f'<p><b>Gain:</b> <span class="gain">{esc(gain)}</span>; confidence '
            f"{fmt(None if conf is None else conf * 100)} % ({esc(basis)})</p>"
            + (
                f"<details><summary>code example</summary><pre>{esc(code)}</pre></details>"
                if code
                else ""
            )
            + "</div>"
        )
    return section("recommendations", "Recommendations", "".join(out))


def _as_dict(report: Any) -> tuple[Any, Any]:
    """(live ProfilingReport or None, the JSON dict) of a report or its dict."""
    from ..profiling import ProfilingReport

    if isinstance(report, ProfilingReport):
        return report, report.to_dict()
    if hasattr(report, "to_dict") and not isinstance(report, Mapping):
        return None, report.to_dict()
    if not isinstance(report, Mapping):
        raise ReportError(
            f"a run page needs a report or its JSON dict, got {type(report).__name__}"
        )
    return None, report


def report_kind(report: Any) -> str:
    """``"run"`` or ``"profile"`` for a report (live or its JSON dict); raises
    :class:`ReportError` for anything else."""
    from ..profiling import ProfilingReport

    if isinstance(report, ProfilingReport):
        return "profile"
    d = (
        report.to_dict()
        if hasattr(report, "to_dict") and not isinstance(report, Mapping)
        else report
    )
    schema = d.get("schema") if isinstance(d, Mapping) else None
    if schema == RUN_SCHEMA:
        return "run"
    if schema == PROFILE_SCHEMA:
        return "profile"
    raise ReportError(
        f"not a run or profile report (schema {schema!r}; expected {RUN_SCHEMA!r} "
        f"or {PROFILE_SCHEMA!r})"
        if isinstance(d, Mapping)
        else f"a run page needs a report or its JSON dict, got {type(d).__name__}"
    )


def run_report_html(report: Any, *, recommendations: Any = None, analyze: bool = True) -> str:
    """The page of one run, as an HTML string. ``report`` is a run report or profiling
    report: the live :class:`~wia_hw.RunResult` / :class:`~wia_hw.profiling.ProfilingReport`
    or its JSON dict (schema ``wia-hw.run/1`` / ``wia-hw.profile/1``).

    ``recommendations`` (a :class:`~wia_hw.profiling.PerformanceRecommendations`, its
    ``to_dict()``, or a list of recommendations) are shown as given; without them, a
    ``recommendations`` entry of the JSON is used, else, with ``analyze``, a profiling
    report is analysed (:func:`~wia_hw.profiling.analyze_performance`, lowest
    thresholds: measured gains on a live report, modelled ones on a loaded one).
    Raises :class:`ReportError` for a dict of another schema. Needs matplotlib for the
    plots; without it the page says so where they would be."""
    from ..profiling import ProfilingReport

    live, d = _as_dict(report)
    kind = report_kind(d)
    v = _run_view(d) if kind == "run" else _profile_view(d)
    prof = None
    if kind == "profile":
        try:
            prof = live if live is not None else ProfilingReport.from_dict(dict(d))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ReportError(f"profile report is incomplete or malformed ({e!r})") from None
    recs = _recs_from(recommendations)
    why = "Recommendations as given."
    if recs is None and "recommendations" in d:
        recs, why = _recs_from(d["recommendations"]), "Recommendations stored in the report."
    if recs is None and kind == "profile" and analyze:
        from ..profiling import AnalysisConfig, analyze_performance

        res = analyze_performance(
            prof, AnalysisConfig(priority_threshold="low", confidence_threshold=0.0)
        )
        recs = _recs_from(res)
        why = (
            "Analysed now at the lowest thresholds; gains measured by re-running the "
            "session's kernels on the emulator."
            if live is not None and live.program
            else "Analysed now from the saved report, which keeps no kernels to re-run: "
            "gains are modelled estimates, heuristics from the counters that the measured "
            "gain can exceed or fall short of (for measured gains, write the page from the "
            "live session: wia_hw.report.write_report(report, path))."
        )
    if recs is None:
        why = (
            "A run report holds no profile to analyse: profile the run "
            "(wia-hw profile WORKLOAD -o profile.json) and make the page from that."
            if kind == "run"
            else "Not analysed."
        )
    sections = [
        section("summary", "Summary", figures(v["figures"]) + _provenance(d)),
        _ops_section(v["ops"]),
        _kernel_section(v),
        _roofline_section(kind, d, prof),
    ]
    if prof is not None:
        sections.append(_memory_section(prof))
        sections.append(_comm_section(_obj(d, "communication")))
    sections.append(_recs_section(recs, why))
    return page(v["title"], v["subtitle"], [s for s in sections if s], kind=kind)
