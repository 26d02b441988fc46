"""``wia-hw run WORKLOAD``: run a model on an emulated device and print the seed's
section 8.7 breakdown, totals, utilisation and hardware counters (:func:`print_run`).

``wia-hw run --replay report.json`` re-runs what produced a run report from its
``provenance`` (spec as given, overrides, extensions with their parameters, workload
and its arguments, seed): same wia_hw version, same report byte for byte.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..emulator.errors import WiaError
from ..profiling._report import spec_label
from ..registry import load_extension, register_device_extension
from ..runtime import (
    Context,
    RunResult,
    extension_files,
    file_provenance,
    open_device,
    spec_sha256,
)
from ._common import (
    RunOptions,
    emit_json,
    make_console,
    run_options,
    task_progress,
    width_option,
)
from ._generate import print_generation, run_generation, throughput_text

__all__ = [
    "run_cmd",
    "print_run",
    "replay_context",
    "describe_provenance",
    "fixed",
    "column_places",
]

#: The run report schema ``--replay`` reads (another version is refused).
RUN_SCHEMA = "wia-hw.run/1"
GENERATE_SCHEMA = "wia-hw.generate/1"
#: Options a replay takes from the report: giving one with ``--replay`` is refused.
_REPLAY_SETS = {
    "device": "--device",
    "batch": "--batch",
    "seq": "--seq",
    "precision": "--precision",
    "args": "--arg",
    "sets": "--set",
    "exts": "--ext",
    "ext_param": "--ext-param",
    "phase": "--phase",
    "kv_len": "--kv-len",
    "mode": "--mode",
    "seed": "--seed",
}


def fixed(v: float, places: int) -> str:
    """``v`` with ``places`` decimals, or, below 1, with 3 significant digits when
    ``places`` would show fewer (a 6 µs latency reads ``0.00645`` ms, not ``0.00``)."""
    if v == 0 or not math.isfinite(v) or abs(v) >= 1:
        return f"{v:.{places}f}"
    return f"{v:.{max(places, 2 - math.floor(math.log10(abs(v))))}f}"


def column_places(values: list[float], places: int) -> int:
    """Decimals for a column: ``places``, or more when its largest value is below 1, so
    that it shows 3 significant digits (a small model's rows are not all ``0.00``; a
    row far below the largest may still read 0)."""
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return places if top == 0 or top >= 1 else max(places, 2 - math.floor(math.log10(top)))


def describe_provenance(prov: dict[str, Any]) -> str:
    """One line naming the spec as used (:func:`wia_hw.profiling._report.spec_label`)."""
    return spec_label(prov)


def run_throughput_text(r: RunResult) -> str:
    """The run summary's throughput: the seed's ``seq/sec`` label (section 8.7 prints
    ``Throughput: %.1f seq/sec``) with the tokens/s it carries for a sequence model;
    a decode step's tokens/s and other workloads' samples/s as :func:`throughput_text`
    gives them."""
    p = r.params
    if p.get("phase") == "decode" or "seq" not in p:
        return throughput_text(r)
    seconds = r.latency_ms * 1e-3
    tps = r.sequences * int(p["seq"]) / seconds if seconds else 0.0
    return f"{r.throughput:,.1f} seq/sec ({tps:,.0f} tokens/s)"


def print_run(r: RunResult, console: Console, top_kernels: int = 10) -> None:
    """Print a run the way the seed's section 8.7 does, plus what a profiler adds."""
    shape = ", ".join(f"{k}={v}" for k, v in _dims_used(r).items())
    changed = r.provenance.get("overrides") or r.provenance.get("extensions")
    console.print(
        f"[bold]{escape(r.workload)}[/bold]{escape(f' ({shape})') if shape else ''} on "
        f"[bold]{escape(r.device)}[/bold]"
        + (" (modified)" if changed else "")
        + f", {r.precision}, {r.mode} mode",
        highlight=False,
    )
    console.print(f"  Spec: {describe_provenance(r.provenance)}", highlight=False, markup=False)
    t = Table(title="Operation Breakdown", title_justify="left")
    t.add_column("operation", no_wrap=True)
    t.add_column("time (ms)", justify="right")
    t.add_column("%", justify="right")
    t.add_column("GFLOP", justify="right")
    ms = column_places([o.time_ms for o in r.ops], 2)
    gf = column_places([o.flops / 1e9 for o in r.ops], 1)
    for o in r.ops:
        t.add_row(Text(o.name), f"{o.time_ms:.{ms}f}", f"{o.pct:.1f}", f"{o.flops / 1e9:.{gf}f}")
    console.print(t)
    console.print(f"  Latency:     {fixed(r.latency_ms, 2)} ms")
    console.print(f"  Throughput:  {run_throughput_text(r)}")
    console.print(
        f"  Compute:     {fixed(r.achieved_tflops, 1)} TFLOPS of {r.peak_tflops:.1f} peak "
        f"({r.compute_utilization:.1f}% utilisation)"
    )
    console.print(
        f"  Roofline floor: {fixed(r.roofline_floor_ms, 2)} ms (FLOPs at peak, HBM bytes "
        f"at {r.memory_bandwidth_gbs:.0f}/{_peak_bw(r)} GB/s)"
    )
    console.print(
        f"  Energy:      {fixed(r.energy_j * 1e3, 1)} mJ, {r.avg_power_w:.1f} W average, "
        f"peak {r.peak_temperature_c:.1f} °C"
    )
    for provider, d in sorted(getattr(r, "extensions", {}).items()):
        figures = ", ".join(
            f"{k} {v:,.0f}" for k, v in d.items() if k not in ("kernels", "cycles") and abs(v) >= 1
        )
        console.print(
            f"  Extension {provider}: {int(d['kernels'])} kernels, "
            f"{fixed(r.clock_ghz and d['cycles'] / (r.clock_ghz * 1e6), 2)} ms"
            + (f" ({figures})" if figures else "")
        )
    c = r.counters
    ct = Table(title="Hardware counters", title_justify="left")
    ct.add_column("counter")
    ct.add_column("value", justify="right")
    rows = [
        ("cycles", f"{c.cycles:,}"),
        ("instructions", f"{c.instructions:,}"),
        ("branch_mispredicts", f"{c.branch_mispredicts:,} of {c.branches:,} branches"),
        ("flops", f"{c.flops:,}"),
        ("macs", ", ".join(f"{k} {v:,}" for k, v in c.macs_by_precision.items() if v)),
        ("cache_misses", f"{c.cache_misses:,}"),
    ]
    for lvl in ("l1", "l2"):
        acc = c.accesses(lvl)
        rate = 100.0 * c.hits[lvl] / acc if acc else 0.0
        rows.append(
            (f"{lvl} hits / misses", f"{c.hits[lvl]:,} / {c.misses[lvl]:,} ({rate:.1f}% hit)")
        )
    for lvl, nb in c.bytes.items():
        rows.append((f"bytes {lvl}", f"{fixed(nb / 1e9, 3)} GB"))
    rows.append(("stall cycles", ", ".join(f"{k} {v:,}" for k, v in c.stall_cycles.items())))
    rows.append(("energy", f"{fixed(c.energy_j * 1e3, 2)} mJ"))
    for name, val in rows:
        ct.add_row(name, val)
    console.print(ct)
    if top_kernels and r.kernels:
        # the same kernel of every layer is one row: count, total and mean time
        alike: dict[str, list[Any]] = {}
        for k in r.kernels:
            alike.setdefault(re.sub(r"^layer\d+\.", "", k.name), []).append(k)
        kt = Table(
            title=f"Top {top_kernels} kernels (n: launches of it over the layers; ms: their total)",
            title_justify="left",
        )
        for col in ("kernel", "provider", "n", "ms", "mean", "util %", "tiles"):
            kt.add_column(
                col, justify="left" if col in ("kernel", "provider") else "right", no_wrap=True
            )
        shown = sorted(alike.items(), key=lambda kv: -sum(k.cycles for k in kv[1]))[:top_kernels]
        kms = column_places([sum(k.time_ms for k in ks) for _, ks in shown], 3)
        for name, ks in shown:
            total = sum(k.time_ms for k in ks)
            cyc = sum(k.cycles for k in ks)
            util = sum(k.compute_utilization * k.cycles for k in ks) / cyc if cyc else 0.0
            kt.add_row(
                Text(name),
                Text(ks[0].provider),
                str(len(ks)),
                f"{total:.{kms}f}",
                f"{total / len(ks):.{kms}f}",
                f"{util:.1f}",
                str(ks[0].tiles),
            )
        console.print(kt)


def _dims_used(r: RunResult) -> dict[str, Any]:
    """The sizes a run used, for its header: batch, seq, phase, kv_len, image; an ONNX
    model's input dims as fixed (``-s`` and ``-a NAME=N``); and the other builder
    arguments given (``-a M=512``, ``-a layers=2``) as the builder took them."""
    p = r.params
    used = {k: p[k] for k in ("batch", "seq", "phase", "kv_len", "image") if p.get(k) is not None}
    dims = p.get("dims")
    for k, v in dims.items() if isinstance(dims, dict) else ():
        used.setdefault(k, v)
    given = (r.provenance.get("run") or {}).get("kwargs") or {}
    for k, v in given.items():
        v = p.get(k, v)
        if k not in used and isinstance(v, (int, float, str)) and k != "precision":
            used[k] = v
    return used


def _peak_bw(r: RunResult) -> str:
    """The resolved spec's peak HBM bandwidth, from the run's provenance."""
    bw = r.provenance.get("peaks", {}).get("hbm_bandwidth_gbs")
    return "?" if bw is None else f"{bw:.0f}"


def replay_context(path: Path) -> tuple[Context, dict[str, Any]]:
    """A fresh context as the run report at ``path`` was made (spec as given, overrides,
    extensions with their parameters, seed) and the run's recorded arguments.

    A file (spec, extension manifest, model, schedules) is read as the run gave it when that still
    names the same file from the current folder, so the replay's report is the same
    byte for byte; from another folder, at the absolute path the report recorded
    (:func:`_as_recorded`). Raises :class:`WiaError` (one line, naming the file) when
    the file is not a run report with provenance, when its run cannot be replayed (a
    Graph object, given inputs or schedules given as a mapping, or a context that had
    run before), when the spec resolves differently now (its hash differs), or when an
    extension's manifest or module, the model file or the schedules file holds other
    bytes now (their sha256 differ)."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise WiaError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise WiaError(f"{path}: not a wia-hw run report (not UTF-8 text: not JSON)") from None
    except json.JSONDecodeError as e:
        raise WiaError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") not in (RUN_SCHEMA, GENERATE_SCHEMA):
        raise WiaError(
            f"{path}: not a wia-hw run report (schema {data.get('schema')!r}; "
            f"expected {RUN_SCHEMA} or {GENERATE_SCHEMA})"
            if isinstance(data, dict)
            else f"{path}: not a wia-hw run report"
        )
    prov = data.get("provenance")
    if not isinstance(prov, dict) or not isinstance(prov.get("run"), dict):
        raise WiaError(f"{path}: the report has no provenance (made before wia_hw recorded it)")
    run = prov["run"]
    if data["schema"] == GENERATE_SCHEMA:  # its prefill's run, and the generation's own
        if not isinstance(prov.get("generate"), dict):
            raise WiaError(f"{path}: the generation report records no generation arguments")
        run = dict(run, generate=prov["generate"])
    if not run.get("replayable", False):
        raise WiaError(
            f"{path}: the run was of a Graph object, with given inputs or with schedules "
            "given as a mapping; it cannot be replayed"
        )
    if run.get("start_cycle", 0):
        raise WiaError(
            f"{path}: the run started at cycle {run['start_cycle']} of a context that had "
            "run before; only a run on a fresh device can be replayed"
        )
    spec = _as_recorded(prov["spec"], prov.get("spec_path"))
    ctx = open_device(spec, overrides=prov.get("overrides") or {}, seed=prov["seed"])
    for e in prov.get("extensions", []):
        ext = load_extension(_as_recorded(e["source"], e.get("path")), parameters=e["parameters"])
        now_ext = extension_files(ext)
        for key in ("manifest_sha256", "module_sha256"):
            _same_bytes(path, f"extension {e['id']!r} ({ext.file})", key, e, now_ext)
        register_device_extension(ctx, ext)
    now = spec_sha256(ctx.spec)
    if now != prov.get("spec_sha256"):
        raise WiaError(
            f"{path}: spec {prov['spec']!r} resolves differently now (sha256 {now[:12]}, "
            f"the report has {str(prov.get('spec_sha256'))[:12]})"
        )
    run = dict(run)
    for key in ("workload", "schedules"):  # a model file; a file of tuned tilings
        if run.get(f"{key}_sha256") is not None:
            run[key] = _as_recorded(run[key], run.get(f"{key}_path"))
            now_file = file_provenance(key, run[key])
            _same_bytes(path, f"{key} {run[key]}", f"{key}_sha256", run, now_file)
    return ctx, run


def _replay_generation(
    ctx: Context, rec: dict[str, Any], as_json: bool, output: Path | None, width: int | None
) -> None:
    """Generate again as the ``wia-hw.generate/1`` report's provenance says (its model,
    prompt, tokens, batch, precision, method and model arguments) on ``ctx``, and print
    or write it as ``run --generate`` does."""
    from ..generate import generate

    gen = rec["generate"]
    g = generate(
        rec["workload"] if rec.get("workload_sha256") else gen["model"],
        prompt_len=gen["prompt_len"],
        new_tokens=gen["new_tokens"],
        batch=gen["batch"],
        precision=rec.get("precision"),
        method=gen["method"],
        kv_bucket=gen["kv_bucket"],
        anchor_every=gen["anchor_every"],
        ctx=ctx,
        **gen.get("kwargs", {}),
    )
    if emit_json(json.dumps(g.to_dict(), indent=2), output, as_json):
        return
    print_generation(g, make_console(width))


def _as_recorded(given: str, recorded: str | None) -> str:
    """The file a report recorded as ``given`` (as the run gave it) at the absolute path
    ``recorded``: ``given`` when it still names that file from the current folder (the
    replay's report then names it alike), else ``recorded``; ``given`` when the report
    recorded no path (a built-in name or id, or a report made before wia_hw recorded
    paths)."""
    if recorded is None or Path(given).resolve() == Path(recorded):
        return given
    return recorded


def _same_bytes(
    report: Path, what: str, key: str, recorded: dict[str, Any], now: dict[str, str]
) -> None:
    """Refuse a replay whose file holds other bytes than when the report was made: the
    file hash ``key`` (``workload_sha256``, ``manifest_sha256``...) the report records
    against ``now``'s; a hash the report does not record (made before wia_hw recorded
    them) is not checked."""
    was, got = recorded.get(key), now.get(key)
    if was is None or got == was:
        return
    name = key.replace("_", " ")
    if got is None:
        raise WiaError(
            f"{report}: {what} cannot be read now (the report has {name} {str(was)[:12]})"
        )
    raise WiaError(
        f"{report}: {what} has changed since the report ({name} {got[:12]}, the report "
        f"has {str(was)[:12]})"
    )


def phase_options(f: Any) -> Any:
    """``--phase`` and ``--kv-len`` (GPT-2's prefill or decode step), as ``run`` and
    ``profile`` take them (shorthands of ``-a phase=`` and ``-a kv_len=``)."""
    f = click.option(
        "--kv-len",
        type=int,
        default=None,
        help="GPT-2 decode: cached tokens (kv_len + seq <= 1024 positions).",
    )(f)
    return click.option(
        "--phase",
        type=click.Choice(["prefill", "decode"]),
        default=None,
        help="GPT-2: prefill or decode.",
    )(f)


def phase_kwargs(kw: dict[str, Any], phase: str | None, kv_len: int | None) -> dict[str, Any]:
    """``kw`` with ``phase`` and ``kv_len`` set where given."""
    if phase is not None:
        kw["phase"] = phase
    if kv_len is not None:
        kw["kv_len"] = kv_len
    return kw


@click.command(
    "run",
    epilog="""\b
Examples:
  wia-hw run bert-large -b 32 -s 128
  wia-hw run gemm -a M=4096 -a N=4096 -a K=4096 --json -o run.json
  wia-hw run model.onnx -b 1 -a sequence_length=128
  wia-hw run examples/scalesim/resnet18.csv -d examples/scalesim/tpu_like.cfg
""",
)
@run_options(workload_required=False)
@phase_options
@click.option(
    "--mode",
    type=click.Choice(["timing", "functional"]),
    default="timing",
    show_default=True,
    help="timing: cycles only; functional: also compute the outputs (slower).",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the device and of functional mode's random inputs and weights.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report to stdout.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the JSON report to this file as well.",
)
@click.option(
    "--top", type=click.IntRange(min=0), default=10, show_default=True, help="Kernels to list."
)
@click.option(
    "--generate", type=int, default=None, help="Generate N tokens (gpt2): prefill + decode steps."
)
@click.option("--prompt-len", type=int, default=None, help="--generate: prompt tokens (default 1).")
@click.option(
    "--replay",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Re-run exactly what produced this JSON run report (no WORKLOAD then).",
)
@width_option
def run_cmd(
    opts: RunOptions | None,
    phase: str | None,
    kv_len: int | None,
    mode: str,
    seed: int,
    as_json: bool,
    output: Path | None,
    top: int,
    generate: int | None,
    prompt_len: int | None,
    replay: Path | None,
    width: int | None,
) -> None:
    """Run WORKLOAD on an emulated device and print its breakdown, totals and counters.

    WORKLOAD is a built-in model (bert-large, bert-base, gpt2, resnet50, gemm), an
    .onnx file or a SCALE-Sim topology .csv; --device takes a built-in spec name, a
    device YAML or a SCALE-Sim .cfg (docs/SCALESIM.md)."""
    if generate is not None or prompt_len is not None:
        given = {"--phase": phase, "--kv-len": kv_len, "--replay": replay}
        return run_generation(opts, generate, prompt_len, mode, seed, as_json, output, width, given)
    if replay is not None:
        if opts is not None:
            raise WiaError("--replay takes no WORKLOAD: the report names it")
        from click.core import ParameterSource

        ctx_ = click.get_current_context()
        given = [
            flag
            for name, flag in _REPLAY_SETS.items()
            if ctx_.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)
        ]
        if given:
            raise WiaError(
                f"--replay takes no {', '.join(given)}: the report records how the run was "
                "made (run it without --replay to change it)"
            )
        ctx, rec = replay_context(replay)
        if rec.get("generate") is not None:  # a --generate report: generate again
            return _replay_generation(ctx, rec, as_json, output, width)
        workload: str = rec["workload"]
        kw: dict[str, Any] = dict(
            batch=rec["batch"], seq=rec["seq"], precision=rec["precision"], **rec["kwargs"]
        )
        if rec.get("schedules") is not None:
            kw["schedules"] = rec["schedules"]
        mode, seed = rec["mode"], rec["seed"]
    elif opts is None:
        raise WiaError("missing WORKLOAD (or --replay REPORT.json)")
    else:
        kw = phase_kwargs(opts.run_kwargs(), phase, kv_len)
        ctx = opts.open(seed=seed)
        workload = opts.workload
    # the runtime reports between ops only: a one-op run (a large gemm) shows the
    # spinner and elapsed time, with the op it is in
    with task_progress("emulating", unit="ops") as bar:
        r = ctx.run(workload, mode=mode, seed=seed, progress=bar.update, **kw)
    text = r.to_json()
    if emit_json(text, output, as_json):
        return
    print_run(r, make_console(width), top)
