"""The seed's case study (section 8.7), run on the emulator: BERT-Large b32 s128 from a
profiled baseline through fusion, int8 PTQ, auto-tuning and dynamic batching, to a goal
met or not.

``wia_hw.case_study("bert-large", device="wia-npu")`` makes exactly the calls a user
would make, in the seed's order, each on a fresh device of the spec:

1. baseline: ``run(build(model, batch, seq))``;
2. fusion: ``apply_fusion(graph, FusionConfig())`` (every pattern: the seed's attention,
   layer-norm and residual fusions, and GELU epilogues), run;
3. int8 PTQ of the fused graph: ``quantize_model`` with ``QuantizationConfig(
   calibration_batches=...)`` calibrated on random token ids of the same model built at
   batch 1, sequence 16 (functional mode cannot run b32 s128), run; its accuracy delta
   is measured as the optimisations issue defines it: the cosine similarity and max abs
   error of the final hidden states, int8 against fp16, in functional mode on the model
   REDUCED to ``accuracy_layers`` layers (labelled so);
4. auto-tuning: ``wia_hw.optimize.autotune_model`` on the int8 graph (ML-guided, 32
   trials per kernel key, no wall-clock budget, seeded), run with its schedules; a row
   saying it is not available when the function is missing;
5. dynamic batching of the last graph and its schedules (they apply to the shapes
   they were tuned at; a kernel key holds the GEMM's shape): ``create_inference_server`` with
   ``BatchingConfig(max_batch_size, max_latency_ms=target, MULTIPLE_OF_8)`` and
   ``benchmark_server`` at the highest Poisson rate meeting P99 <= target (MLPerf
   Server, found by bisection).

Each row shows its roofline floor (the run's; for batching, the floor of the smallest
batch it executed) and the compute its throughput implies against the peak at its
precision. The seed's own figures are given beside them, and where a seed figure is
physically impossible on the device the report says so with the arithmetic.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bench._workflow import (
    apply_optimisation,
    autotune_schedules,
    autotuner,
    default_cost_model,
    functional_agreement,
)
from .emulator.config import DeviceSpec
from .emulator.errors import WorkloadError
from .graph import Graph
from .optimize import FusionConfig, apply_fusion
from .runtime import RunResult, run
from .serve import (
    BatchingConfig,
    PaddingStrategy,
    ServeError,
    ServerBenchmarkResult,
    ServerWorkload,
    benchmark_server,
    create_inference_server,
)
from .spec import DEFAULT_DEVICE, load_spec
from .workloads import build

__all__ = ["SEED_FIGURES", "CaseStudyResult", "CaseStudyRow", "case_study"]

#: The seed's section 8.7 figures (its NPU: 128 TFLOPS, 600 GB/s; BERT-Large b32 s128).
SEED_FIGURES: dict[str, float] = {
    "baseline_ms": 45.2,
    "baseline_throughput": 708.0,
    "fusion_ms": 33.5,
    "int8_ms": 20.1,
    "autotune_ms": 15.2,
    "p50_ms": 8.3,
    "p99_ms": 9.7,
    "throughput": 5432.0,
    "accuracy_delta_pct": 0.42,
    "target_ms": 10.0,
}


def _speedup(v: float | None) -> str:
    """A speedup as the table prints it: two decimals, three when two would round a
    change to 1.00x (a 0.3% slowdown is 0.997x, not 1.00x)."""
    if v is None:
        return "-"
    text = f"{v:.2f}"
    if text == "1.00" and v != 1.0:
        text = f"{v:.3f}"
    return text + "x"


@dataclass
class CaseStudyRow:
    """One step. ``latency_ms`` of the batch (for batching: the P50 per request),
    ``throughput`` sequences/s, ``floor_ms`` its roofline floor, ``speedup`` against the
    baseline latency, ``implied_tflops`` the model FLOPs its throughput implies and
    ``peak_tflops`` the device's peak at the step's precision. ``available`` is False
    for a step that could not run (``note`` says why)."""

    step: str
    available: bool
    precision: str = "fp16"
    latency_ms: float | None = None
    throughput: float | None = None
    floor_ms: float | None = None
    speedup: float | None = None
    implied_tflops: float | None = None
    peak_tflops: float | None = None
    seed_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class CaseStudyResult:
    """The case study's table (``rows``), the runs behind it (``runs``: step -> RunResult;
    ``server``: the batching benchmark), the accuracy measurement, the feasibility
    statements with their arithmetic, and the goal: ``goal_achieved`` is the seed's
    stated goal (the batch's latency after the last optimisation below the target);
    ``goal`` also gives the seed's printed test (batching P99 below the target)."""

    model: str
    device: str
    batch: int
    seq: int
    layers: int
    target_latency_ms: float
    rows: list[CaseStudyRow]
    runs: dict[str, RunResult] = field(repr=False)
    server: ServerBenchmarkResult | None = field(repr=False)
    #: the tuned GEMM schedules by kernel key (empty without auto-tuning)
    schedules: dict[str, Any] = field(repr=False)
    #: step -> the graph it ran (the baseline, fused, int8, tuned graphs)
    graphs: dict[str, Graph] = field(repr=False)
    accuracy: dict[str, Any] | None
    feasibility: list[str]
    goal_achieved: bool
    goal: str
    overall_speedup: float | None
    throughput_improvement: float | None
    model_gflop_per_seq: float

    def row(self, step: str) -> CaseStudyRow:
        return next(r for r in self.rows if r.step == step)

    # -- output ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "wia-hw.case-study/1",
            "model": self.model,
            "device": self.device,
            "batch": self.batch,
            "seq": self.seq,
            "layers": self.layers,
            "target_latency_ms": self.target_latency_ms,
            "rows": [r.to_dict() for r in self.rows],
            "breakdown": {
                k: [{"name": o.name, "time_ms": o.time_ms, "pct": o.pct} for o in r.ops]
                for k, r in self.runs.items()
            },
            "server": self.server.to_dict() if self.server else None,
            "accuracy": self.accuracy,
            "feasibility": self.feasibility,
            "goal_achieved": self.goal_achieved,
            "goal": self.goal,
            "overall_speedup": self.overall_speedup,
            "throughput_improvement": self.throughput_improvement,
            "model_gflop_per_seq": self.model_gflop_per_seq,
            "seed_figures": SEED_FIGURES,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def _table(self) -> list[list[str]]:
        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        out = []
        for r in self.rows:
            lat = r.latency_ms
            label = r.step + (" (P50)" if r.step == "dynamic batching" and r.available else "")
            implied = (
                f"{r.implied_tflops:.1f} / {r.peak_tflops:.0f}"
                if r.implied_tflops is not None and r.peak_tflops
                else "-"
            )
            out.append(
                [
                    label,
                    f(lat, ".2f") if r.available else "n/a",
                    f(r.floor_ms, ".2f"),
                    _speedup(r.speedup),
                    f(r.throughput, ",.0f"),
                    implied,
                    f(r.seed_ms, ".1f"),
                ]
            )
        return out

    _HEAD = [
        "step",
        "latency ms",
        "floor ms",
        "speedup",
        "seq/s",
        "TFLOP/s implied / peak",
        "seed ms",
    ]

    def format_text(self) -> str:
        """The seed's table, its breakdowns, batching figures, accuracy and goal, then
        the seed's own printout with this run's numbers (:meth:`_seed_printout`)."""
        rows = [self._HEAD, *self._table()]
        w = [max(len(r[i]) for r in rows) for i in range(len(self._HEAD))]
        lines = [
            f"Case study: {self.model} b{self.batch} s{self.seq} ({self.layers} layers) on "
            f"{self.device}, target < {self.target_latency_ms:g} ms",
            "",
        ]
        for i, r in enumerate(rows):
            lines.append(
                "  ".join(c.ljust(w[j]) if j == 0 else c.rjust(w[j]) for j, c in enumerate(r))
            )
            if i == 0:
                lines.append("  ".join("-" * x for x in w))
        for r in self.rows:
            if r.note:
                lines.append(f"  {r.step}: {r.note}")
        for key, title in (("baseline", "Baseline"), (self._last_run(), "Optimised")):
            res = self.runs.get(key)
            if res is None:
                continue
            lines += ["", f"{title} breakdown ({key}, {res.latency_ms:.2f} ms):"]
            lines += [f"  {o.name}: {o.time_ms:.2f} ms ({o.pct:.1f}%)" for o in res.ops]
        if self.accuracy:
            a = self.accuracy
            lines += [
                "",
                f"Accuracy (int8 vs fp16, {a['model']}; output {a['output']}): cosine "
                f"{a['cosine']:.6f}, 1 - cosine {100 * (1 - a['cosine']):.4f}%, max abs err "
                f"{a['max_abs_error']:.4f} (values up to {a['max_abs_reference']:.2f})",
            ]
        if self.server is not None:
            s = self.server
            lines += [
                "",
                f"Dynamic batching at {s.offered_rate_rps:,.0f} req/s offered "
                f"(highest Poisson rate with P99 <= {self.target_latency_ms:g} ms): P50 "
                f"{s.p50_latency_ms:.2f} ms, P90 {s.p90_latency_ms:.2f} ms, P99 "
                f"{s.p99_latency_ms:.3f} ms, {s.throughput:,.0f} seq/s completed, "
                f"{s.rejected} rejected; batches "
                + ", ".join(f"{k}x{v}" for k, v in s.batch_size_histogram.items()),
            ]
        lines += ["", "Feasibility:"] + [f"  {x}" for x in self.feasibility]
        lines += ["", f"Goal achieved: {'YES' if self.goal_achieved else 'NO'} ({self.goal})"]
        if self.overall_speedup is not None:
            lines.append(
                f"Overall speedup (seed's formula: baseline b{self.batch} latency / P50 per "
                f"request): {self.overall_speedup:.2f}x; throughput "
                f"{self.throughput_improvement:.2f}x"
            )
        lines += self._seed_printout()
        return "\n".join(lines)

    def _seed_printout(self) -> list[str]:
        """The seed's section 8.7 printout, its labels and formats exactly, with this
        run's numbers: the baseline and its breakdown, each step's latency and speedup
        against the baseline, the accuracy delta (here ``1 - cosine`` of the hidden
        states, int8 vs fp16, on the reduced model: :attr:`accuracy`), the batching
        server's P50/P99/throughput, the summary and the seed's goal test (batching
        P99 below the target). ``n/a`` where a step did not run or the accuracy was
        not measured."""
        base = self.runs["baseline"]

        def after(label: str, step: str) -> str:
            r = self.runs.get(step)
            if r is None:
                row = next((x for x in self.rows if x.step == step), None)
                return f"{label}: n/a ({row.note if row and row.note else 'not run'})"
            return f"{label}: {r.latency_ms:.2f} ms ({base.latency_ms / r.latency_ms:.1f}x speedup)"

        a = self.accuracy
        loss = None if not a else 1.0 - a["cosine"]
        out = [
            "",
            "The seed's printout (section 8.7) with this run's numbers:",
            "Baseline Performance:",
            f"  Latency: {base.latency_ms:.2f} ms",
            f"  Throughput: {base.throughput:.1f} seq/sec",
            "",
            "Operation Breakdown:",
            *(f"  {o.name}: {o.time_ms:.2f} ms ({o.pct:.1f}%)" for o in base.ops),
            after("After fusion", "fusion"),
            after("After quantization", "int8 quantisation"),
            "Accuracy delta: "
            + (
                "n/a (not measured)"
                if loss is None
                else f"{100 * loss:.3f}% (1 - cosine of the hidden states, int8 vs fp16, "
                f"{a['model']}; no labels, so not a task-accuracy loss)"
            ),
            after("After auto-tuning", "auto-tuning"),
            "With dynamic batching:",
        ]
        s = self.server
        target = self.target_latency_ms
        if s is None:
            note = next((r.note for r in self.rows if r.step == "dynamic batching"), "")
            out += [
                "  P50 latency: n/a",
                "  P99 latency: n/a",
                f"  Throughput: n/a ({note or 'no server result'})",
            ]
        else:
            out += [
                f"  P50 latency: {s.p50_latency_ms:.2f} ms",
                f"  P99 latency: {s.p99_latency_ms:.2f} ms",
                f"  Throughput: {s.throughput:.1f} seq/sec",
            ]
        out += ["", "Optimization Summary:", f"  Baseline latency: {base.latency_ms:.2f} ms"]
        if s is None:
            out += [
                "  Optimized latency: n/a",
                "  Overall speedup: n/a",
                "  Throughput improvement: n/a",
            ]
        else:
            out += [
                f"  Optimized latency: {s.p50_latency_ms:.2f} ms",
                f"  Overall speedup: {base.latency_ms / s.p50_latency_ms:.2f}x",
                f"  Throughput improvement: {s.throughput / base.throughput:.2f}x",
            ]
        out.append("  Accuracy impact: " + ("n/a" if loss is None else f"{100 * loss:.3f}%"))
        if s is None:
            goal = f"NO (the seed's test: no Poisson rate meets batching P99 <= {target:g} ms)"
        elif s.p99_latency_ms < target:
            goal = (
                f"YES ✓ (the seed's test: batching P99 {s.p99_latency_ms:.2f} ms < {target:g} ms)"
            )
        else:
            goal = (
                f"NO (the seed's test: batching P99 {s.p99_latency_ms:.2f} ms, not < {target:g} ms)"
            )
        out += ["", f"  Goal achieved: {goal}"]
        return out

    def _last_run(self) -> str:
        for k in ("auto-tuning", "int8 quantisation", "fusion"):
            if k in self.runs:
                return k
        return "baseline"

    def to_markdown(self, path: str | os.PathLike[str] | None = None, plots: bool = True) -> str:
        """The report as Markdown; with ``path`` it is written there, and with ``plots``
        (matplotlib installed) the breakdown and roofline before/after are saved beside
        it as PNG and linked."""
        md = [
            f"# Case study: {self.model} b{self.batch} s{self.seq} on {self.device}",
            "",
            f"{self.layers} layers; target < {self.target_latency_ms:g} ms. Every number "
            "is an emulator run; `seed ms` is the seed's figure for the same step.",
            "",
            "| " + " | ".join(self._HEAD) + " |",
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self._HEAD))) + "|",
        ]
        md += ["| " + " | ".join(r) + " |" for r in self._table()]
        md.append("")
        md += [f"* {r.step}: {r.note}" for r in self.rows if r.note]
        text = self.format_text().split("\n")
        start = next(i for i, x in enumerate(text) if x.startswith("Baseline breakdown"))
        md += ["", "```", *text[start:], "```", ""]
        if path is not None:
            p = Path(path)
            if plots:
                md += self._plots(p)
            p.write_text("\n".join(md) + "\n")
        return "\n".join(md) + "\n"

    def _plots(self, path: Path) -> list[str]:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return ["(plots skipped: matplotlib is not installed)"]
        before, after = self.runs["baseline"], self.runs[self._last_run()]
        out = []
        fig, ax = plt.subplots(figsize=(7, 3.5))
        names = [o.name for o in before.ops]
        for i, res in enumerate((before, after)):
            left = 0.0
            for o in res.ops:
                c = f"C{names.index(o.name) if o.name in names else len(names)}"
                ax.barh(i, o.time_ms, left=left, color=c, label=o.name if i == 0 else None)
                left += o.time_ms
        ax.set_yticks([0, 1], ["baseline", self._last_run()])
        ax.set_xlabel("ms")
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title("Breakdown before / after")
        fig.tight_layout()
        bp = path.with_name(path.stem + "_breakdown.png")
        fig.savefig(bp, dpi=100)
        plt.close(fig)
        out.append(f"![breakdown before and after]({bp.name})")
        fig, ax = plt.subplots(figsize=(6, 4))
        spec = load_spec(self.device)
        bw = spec.peak_bandwidth_gbs * 1e9
        import numpy as np

        xs = np.logspace(-1, 4, 100)
        for prec in ("fp16", "int8"):
            peak = spec.peak_flops(prec)
            ax.loglog(xs, np.minimum(peak, xs * bw) / 1e12, "--", lw=1, label=f"roof {prec}")
        for label, res, m in (("baseline", before, "o"), (self._last_run(), after, "^")):
            pts = [
                (k.flops / k.counters.bytes["hbm"], k.flops / (k.time_ms * 1e-3) / 1e12)
                for k in res.kernels
                if k.flops and k.counters.bytes.get("hbm") and k.time_ms
            ]
            if pts:
                ax.scatter(*zip(*pts, strict=True), marker=m, s=12, label=label, alpha=0.7)
        ax.set_xlabel("FLOP per HBM byte")
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=7)
        ax.set_title("Roofline before / after (one point per kernel)")
        fig.tight_layout()
        rp = path.with_name(path.stem + "_roofline.png")
        fig.savefig(rp, dpi=100)
        plt.close(fig)
        out.append(f"![roofline before and after]({rp.name})")
        return out


def _row(
    step: str,
    r: RunResult,
    base: RunResult,
    gflop_per_seq: float,
    spec: DeviceSpec,
    seed_ms: float | None,
) -> CaseStudyRow:
    prec = "int8" if r.precision == "int8" else r.precision
    return CaseStudyRow(
        step=step,
        available=True,
        precision=prec,
        latency_ms=r.latency_ms,
        throughput=r.throughput,
        floor_ms=r.roofline_floor_ms,
        speedup=base.latency_ms / r.latency_ms,
        implied_tflops=r.throughput * gflop_per_seq / 1e3,
        peak_tflops=spec.peak_flops(prec) / 1e12,
        seed_ms=seed_ms,
    )


_CACHE: dict[tuple[Any, ...], CaseStudyResult] = {}


def case_study(
    model: str = "bert-large",
    *,
    device: str | os.PathLike[str] | DeviceSpec = DEFAULT_DEVICE,
    batch: int = 32,
    seq: int = 128,
    layers: int | None = None,
    target_latency_ms: float = 10.0,
    max_batch_size: int = 64,
    server_duration_s: float = 1.0,
    accuracy: bool = True,
    accuracy_layers: int = 2,
    calibration_batches: int = 2,
    seed: int = 0,
    cache: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
) -> CaseStudyResult:
    """Run the seed's case study (module docstring) and return its table.

    ``model``: a transformer builder workload (``bert-large``, ``bert-base``);
    ``layers`` builds it with fewer layers (faster, labelled in the report).
    ``server_duration_s``: emulated seconds of arrivals per rate tried by the batching
    search. ``accuracy=False`` skips the functional accuracy measurement. With ``cache``
    (and ``device`` given by name) a second call with the same arguments in the same
    process returns the same result object (the runs are deterministic).
    ``progress(done, total, step)`` is called as each step starts (``"baseline"``,
    ``"fusion"``, ``"int8 calibration"``, ...; ``step`` adds ``(ops i/n)`` while a
    step's run goes) and once at the end with ``done == total``.
    Raises :class:`~wia_hw.WorkloadError` on an unknown or non-transformer model.
    """
    key = (
        model,
        str(device),
        batch,
        seq,
        layers,
        target_latency_ms,
        max_batch_size,
        server_duration_s,
        accuracy,
        accuracy_layers,
        calibration_batches,
        seed,
    )
    if cache and not isinstance(device, DeviceSpec) and key in _CACHE:
        return _CACHE[key]
    # the batching step's settings, checked before the runs (minutes): a bad one was
    # recorded as the step's note after them, and the goal then read "no Poisson rate
    # meets" a target no rate was tried against
    BatchingConfig(max_batch_size=max_batch_size, max_latency_ms=target_latency_ms)
    ServerWorkload(p99_bound_ms=target_latency_ms, duration_s=server_duration_s, seed=seed)
    if accuracy and (
        isinstance(accuracy_layers, bool)
        or not isinstance(accuracy_layers, int)
        or accuracy_layers < 1
    ):
        raise WorkloadError(f"accuracy_layers must be an integer >= 1, got {accuracy_layers!r}")
    spec = device if isinstance(device, DeviceSpec) else load_spec(device)
    kw: dict[str, Any] = {"batch": batch, "seq": seq}
    if layers is not None:
        kw["layers"] = layers
    g = build(model, **kw)
    if "seq" not in g.params or "layers" not in g.params:
        raise WorkloadError(
            f"case_study needs a transformer workload with seq and layers (bert-large, "
            f"bert-base), got {model!r}"
        )
    steps = ["baseline", "fusion", "int8 calibration", "int8 quantisation"]
    steps += ["accuracy"] if accuracy else []
    steps += ["auto-tuning"] if autotuner() is not None else []
    steps += ["dynamic batching"]

    def step(name: str) -> Callable[[int, int, str], None] | None:
        """Report that step ``name`` starts; the run progress callback within it."""
        if progress is None:
            return None
        i = steps.index(name)
        progress(i, len(steps), name)
        return lambda d, n, _op: progress(i, len(steps), f"{name} (ops {d}/{n})")

    runs: dict[str, RunResult] = {}
    graphs: dict[str, Graph] = {"baseline": g}
    base = runs["baseline"] = run(g, device=spec, seed=seed, progress=step("baseline"))
    gflop = base.flops / batch / 1e9
    rows = [_row("baseline", base, base, gflop, spec, SEED_FIGURES["baseline_ms"])]

    fused = apply_fusion(g, FusionConfig())
    graphs["fusion"] = fused
    rf = runs["fusion"] = run(fused, device=spec, seed=seed, progress=step("fusion"))
    rows.append(_row("fusion", rf, base, gflop, spec, SEED_FIGURES["fusion_ms"]))
    rows[-1].note = "fused chains: " + ", ".join(
        f"{k} {v}" for k, v in fused.params.get("fusion", {}).items()
    )

    step("int8 calibration")
    q = apply_optimisation("int8", fused, spec, calibration_batches, seed)
    graphs["int8 quantisation"] = q
    rq = runs["int8 quantisation"] = run(
        q, device=spec, seed=seed, progress=step("int8 quantisation")
    )
    rows.append(_row("int8 quantisation", rq, base, gflop, spec, SEED_FIGURES["int8_ms"]))
    acc = None
    if accuracy:
        step("accuracy")
        a = functional_agreement(
            g,
            ["fusion", "int8"],
            spec=spec,
            layers=accuracy_layers,
            seed=seed,
            calibration_batches=calibration_batches,
        )
        acc = a.to_dict()
        rows[-1].note = (
            f"hidden-state cosine int8 vs fp16 {a.cosine:.6f} on {a.model} (the seed's "
            f"'accuracy delta {SEED_FIGURES['accuracy_delta_pct']}%' is on labelled data)"
        )

    final: Graph = q
    schedules: dict[str, Any] = {}
    if autotuner() is not None:
        tuned_run = step("auto-tuning")
        schedules, tres = autotune_schedules(q, spec, seed=seed)
        graphs["auto-tuning"] = q
        rt = runs["auto-tuning"] = run(
            q, device=spec, seed=seed, schedules=schedules or None, progress=tuned_run
        )
        rows.append(_row("auto-tuning", rt, base, gflop, spec, SEED_FIGURES["autotune_ms"]))
        cost_model = {  # autotune_schedules' choice: the trees need scikit-learn
            "gbt": "gradient-boosted trees",
            "ridge": "ridge regression, scikit-learn not installed",
        }[default_cost_model()]
        rows[-1].note = (
            f"ML-guided search ({cost_model}), 32 trials per kernel key: {len(schedules)} of "
            f"{len(tres.kernels)} GEMM kernel keys got a faster tiling "
            f"({tres.default_cycles:,} -> {tres.tuned_cycles:,} kernel cycles, each alone)"
        )
    else:
        rows.append(
            CaseStudyRow(
                step="auto-tuning",
                available=False,
                seed_ms=SEED_FIGURES["autotune_ms"],
                note="not available: wia_hw.optimize.autotune_model is not in this build",
            )
        )

    server = create_inference_server(
        final,
        BatchingConfig(
            max_batch_size=max_batch_size,
            max_latency_ms=target_latency_ms,
            padding_strategy=PaddingStrategy.MULTIPLE_OF_8,
        ),
        device=spec,
        seed=seed,
        schedules=schedules,
    )
    sb: ServerBenchmarkResult | None = None
    step("dynamic batching")
    prec = rows[-1].precision if rows[-1].available else rows[-2].precision
    try:
        sb = benchmark_server(
            server,
            ServerWorkload(
                p99_bound_ms=target_latency_ms, duration_s=server_duration_s, seq=seq, seed=seed
            ),
        )
    except ServeError as e:
        rows.append(
            CaseStudyRow(
                step="dynamic batching",
                available=False,
                note=str(e),
                seed_ms=SEED_FIGURES["p50_ms"],
            )
        )
    if sb is not None:
        smallest = min(sb.executed_shapes, key=lambda k: k[0])
        rows.append(
            CaseStudyRow(
                step="dynamic batching",
                available=True,
                precision=prec,
                latency_ms=sb.p50_latency_ms,
                throughput=sb.throughput,
                floor_ms=server.shape_timing(*smallest).roofline_floor_ms,
                speedup=base.latency_ms / sb.p50_latency_ms,
                implied_tflops=sb.throughput * gflop / 1e3,
                peak_tflops=spec.peak_flops(prec) / 1e12,
                seed_ms=SEED_FIGURES["p50_ms"],
                p50_ms=sb.p50_latency_ms,
                p90_ms=sb.p90_latency_ms,
                p99_ms=sb.p99_latency_ms,
                note=(
                    "speedup is per-request P50 latency against the baseline batch's (the "
                    f"seed's formula); throughput {sb.throughput / base.throughput:.2f}x the "
                    f"baseline's; P99 {sb.p99_latency_ms:.3f} ms (seed {SEED_FIGURES['p99_ms']}), "
                    f"{sb.throughput:,.0f} seq/s (seed {SEED_FIGURES['throughput']:,.0f}); "
                    f"floor of the smallest batch ({smallest[0]}x{smallest[1]}); the "
                    f"smallest padded batch takes {server.service_ms(1, seq):.2f} ms and a "
                    "request arriving during a batch waits for it first; full "
                    f"batches of {max_batch_size} back to back would give "
                    f"{server.capacity_rps(seq):,.0f} seq/s at "
                    f"{server.service_ms(max_batch_size, seq):.2f} ms per batch"
                ),
            )
        )

    if progress is not None:
        progress(len(steps), len(steps), "")

    # feasibility, with the arithmetic
    p16, p8 = spec.peak_flops("fp16") / 1e12, spec.peak_flops("int8") / 1e12
    seed_tp = SEED_FIGURES["throughput"]
    need = seed_tp * gflop / 1e3
    verdict = (
        f"impossible on {spec.name} ({need / p8:.2f}x its int8 peak)"
        if need > p8
        else f"needs {100 * need / p8:.0f}% of its int8 peak"
    )
    need_b = batch * gflop * 1e9 / (target_latency_ms * 1e-3) / 1e12
    feas = [
        f"model: {gflop:.2f} GFLOP per sequence of {seq} tokens ({gflop / seq:.3f} GFLOP "
        f"per token, the emulator's FLOP count{'' if layers is None else f', {layers} layers'})",
        f"the seed's {seed_tp:,.0f} seq/s needs {seed_tp:,.0f} x {gflop:.2f} GFLOP = "
        f"{need:.0f} TFLOP/s; {spec.name} peaks at {p16:.0f} TFLOP/s fp16 and {p8:.0f} "
        f"TOPS int8: {verdict}",
        f"b{batch} in < {target_latency_ms:g} ms needs {batch} x {gflop:.2f} GFLOP / "
        f"{target_latency_ms:g} ms = {need_b:.0f} TFLOP/s ({100 * need_b / p8:.0f}% of the "
        f"int8 peak); the best b{batch} roofline floor here is "
        f"{min(r.floor_ms for r in rows[:-1] if r.floor_ms is not None):.2f} ms",
    ]
    last = [r for r in rows if r.available and r.step != "dynamic batching"][-1]
    achieved = last.latency_ms < target_latency_ms
    goal = (
        f"the stated goal, b{batch} s{seq} in < {target_latency_ms:g} ms: "
        f"{last.latency_ms:.2f} ms after {last.step}"
    )
    if sb is not None:
        ok = sb.p99_latency_ms < target_latency_ms
        goal += (
            f"; the seed's printed test, batching P99 < {target_latency_ms:g} ms: "
            f"{'yes' if ok else 'no'} ({sb.p99_latency_ms:.3f} ms at {sb.throughput:,.0f} seq/s)"
        )
        overall = base.latency_ms / sb.p50_latency_ms
        tput = sb.throughput / base.throughput
    else:
        goal += f"; no Poisson rate meets batching P99 <= {target_latency_ms:g} ms"
        overall = tput = None
    result = CaseStudyResult(
        model=model,
        device=spec.name,
        batch=batch,
        seq=seq,
        layers=int(g.params["layers"]),
        target_latency_ms=target_latency_ms,
        rows=rows,
        runs=runs,
        server=sb,
        schedules=schedules,
        graphs=graphs,
        accuracy=acc,
        feasibility=feas,
        goal_achieved=achieved,
        goal=goal,
        overall_speedup=overall,
        throughput_improvement=tput,
        model_gflop_per_seq=gflop,
    )
    if cache and not isinstance(device, DeviceSpec):
        _CACHE[key] = result
    return result
