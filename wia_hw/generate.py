"""Token generation: a prefill, then decode steps over a growing KV cache.

``generate("gpt2", prompt_len=P, new_tokens=N, batch=B)`` runs the prefill of ``P``
prompt tokens (it yields the first new token: its latency is the *time to first
token*), then ``N - 1`` decode steps; decode step ``i`` (1-based) feeds the token the
step before produced and attends to ``kv_len = P + i - 1`` cached tokens. GPT-2 has
1024 positions, so ``P + N - 1 <= 1024``; the default prompt is one token (GPT-2's
``<|endoftext|>`` that starts unconditional sampling), so ``N`` may be 1024.

The result reports the time to first token, the per-token latency (the decode steps:
P50 and P99 by linear interpolation, numpy's default, as :mod:`wia_hw.bench` does),
throughput in **tokens/s** (generated tokens of every sequence over the whole time;
``decode_tokens_per_s`` over the decode steps only) and in **sequences/s**, and the
KV-cache bytes after the prefill and after every step (``kv_len + 1`` tokens of every
layer's keys and values for the whole batch).

Timing (``method``):

* ``"exact"``: every decode step is a whole graph run (:meth:`Context.run`) on one
  device, in order, so caches, time and temperature carry from step to step as on a
  real device. About 0.3 s of wall time per GPT-2 small step.
* ``"cached"`` (default): the ops whose shapes do not depend on the KV length (every
  projection, the MLP, layer norms, embeddings, the LM head) are lowered and timed
  once, inside an *anchor*: a whole decode step run exactly on the device (the first
  decode step, then each step whose ``kv_len`` is a multiple of ``anchor_every``).
  The ops whose shapes grow with the KV length (each layer's key/value cache concat,
  scores, softmax, context; found by comparing the decode graphs at three KV
  lengths, not by name) are timed on a scratch device as a *probe*: one layer's
  KV-dependent ops, with the views that feed them, lowered and run in order, each
  probe warm from the one before. Layers are alike, so one layer's probe stands for
  all of them (times their count). A step at ``kv_len`` K then takes
  ``anchor + layers x (probe(K') - probe(K_anchor))`` cycles, with ``K'`` the start
  of K's bucket (``K - K % kv_bucket``, the prompt length at least): the probe runs
  once per bucket and its time holds for the whole bucket (a step function, no
  interpolation). Buckets start at multiples of ``kv_bucket``, so a tile boundary of
  the scores (``kv_len + 1`` past a multiple of the tile width) starts a bucket rather
  than falling inside one. ``kv_bucket=1`` probes every length.

  The approximation, and how it is bounded: the KV-independent ops take in every step
  the cycles they took in the anchor (the device state they meet, L2 contents and HBM
  queues, is taken to be the anchor's), and the KV-dependent ops change from the
  anchor by what they change in the warm probe, one layer's on a scratch device. Each
  step reads its whole KV cache (laid out at its length: ``Context.same_program``),
  so the probe misses the L2 the other layers' caches fill, and the error grows with
  the cache until the next anchor. Measured against the exact method over all 1,023
  steps of a 1,024-token generation (GPT-2 small, wia-npu, batch 1, 1-token prompt):
  ``kv_bucket=1`` is within 2,784 cycles of each exact step (0.46%), the default
  ``kv_bucket=4`` within 3,480 (0.56%: a bucket's later steps are also short by their
  ops' growth within the bucket). ``benchmarks/generation_speed.py`` prints samples
  of it (and all of it with ``--full``). ``tests/test_generate.py`` holds
  ``kv_bucket=1`` to 1e-4 and 8 to 1e-3 of the exact step over 16 steps from a short
  prompt. 1,024 tokens take about 1.9 s of CPU (the prefill, 4 anchors and 256
  probes), against about 5 minutes for the exact method. Energy and temperature are
  reported for the prefill only.

Errors (:class:`~wia_hw.WorkloadError`, one line): ``new_tokens``, ``prompt_len`` or
``batch`` not a positive integer; a model that is not a decoder (no decode phase with a
KV cache, e.g. ``bert-large``); a model argument its builder does not take, or one
that generation sets itself (``seq``, ``phase``, ``kv_len``: :data:`GENERATION_SET`);
``prompt_len + new_tokens - 1`` past the model's
positions; ``method``, ``kv_bucket`` or ``anchor_every`` invalid; a last decode step
whose KV cache, weights and activations do not fit device memory (checked before any
step runs, by the memory plan a single run applies; the error names the first step
that does not fit).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .emulator.config import DeviceSpec
from .emulator.device import Device
from .emulator.errors import WorkloadError
from .emulator.extension_kernels import execute_kernels
from .graph import Graph, GraphBuilder, Tensor, is_view
from .lowering import lower
from .runtime import Context, RunResult, _release_other_tensors, open_device
from .spec import DEFAULT_DEVICE
from .workloads import WORKLOADS
from .workloads import build as build_workload

__all__ = [
    "generate",
    "GenerationResult",
    "DecodeStep",
    "DECODER_MODELS",
    "GENERATION_METHODS",
    "DEFAULT_KV_BUCKET",
    "DEFAULT_ANCHOR_EVERY",
    "GENERATION_SET",
]

#: Workloads that generate: their builder has a decode phase over a KV cache.
DECODER_MODELS: tuple[str, ...] = tuple(
    n for n, f in WORKLOADS.items() if {"phase", "kv_len"} <= set(inspect.signature(f).parameters)
)
GENERATION_METHODS = ("cached", "exact")
#: KV lengths per probe bucket of the cached method (see the module docstring).
DEFAULT_KV_BUCKET = 4
#: Tokens between two exactly emulated anchor steps of the cached method.
DEFAULT_ANCHOR_EVERY = 256

_LAYER = re.compile(r"^layer\d+\.")

#: The model arguments generation sets itself, and how (a keyword argument naming one
#: is refused: it would contradict the prefill and the decode steps).
GENERATION_SET: dict[str, str] = {
    "seq": "the prefill runs prompt_len tokens (--prompt-len) and every decode step one",
    "phase": "generation runs the prefill, then the decode steps",
    "kv_len": "decode step i attends to prompt_len + i - 1 cached tokens",
}


@dataclass(frozen=True)
class DecodeStep:
    """One decode step: it feeds one token per sequence and yields the next.

    ``kv_len``: cached tokens it attends to; ``cycles``/``latency_ms``: its time;
    ``kv_cache_bytes``: the cache after it (``kv_len + 1`` tokens, whole batch);
    ``source``: ``"emulated"`` (a whole step run on the device: every step of the
    exact method, the anchors of the cached one) or ``"cached"``.
    """

    index: int
    kv_len: int
    cycles: int
    latency_ms: float
    kv_cache_bytes: int
    source: str


@dataclass
class GenerationResult:
    """A generation: the prefill's run, the decode steps and the figures from them.

    Times in ms, throughputs per second of device time, bytes raw. ``prefill`` is the
    whole :class:`~wia_hw.RunResult` of the prefill; ``steps`` the ``new_tokens - 1``
    decode steps in order. ``timing_cache``: for the cached method, the ``anchors``
    (emulated whole steps), ``probe_runs`` (KV lengths probed), ``probe_kernels_timed``
    and ``cached_steps`` (steps timed from the anchor and the probes).
    """

    model: str
    device: str
    precision: str
    batch: int
    prompt_len: int
    new_tokens: int
    method: str
    kv_bucket: int
    anchor_every: int
    clock_ghz: float
    prefill: RunResult
    steps: list[DecodeStep]
    kv_bytes_per_token: int  # every layer's K and V of one token position, whole batch
    timing_cache: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def ttft_ms(self) -> float:
        """Time to first token: the prefill's latency."""
        return self.prefill.latency_ms

    @property
    def token_latencies_ms(self) -> list[float]:
        """Per-token latency: each decode step's time (the first token is the TTFT)."""
        return [s.latency_ms for s in self.steps]

    def _pct(self, q: float) -> float | None:
        lat = self.token_latencies_ms
        return float(np.percentile(lat, q)) if lat else None

    @property
    def p50_ms(self) -> float | None:
        """Median per-token latency over the decode steps (None without any)."""
        return self._pct(50.0)

    @property
    def p99_ms(self) -> float | None:
        """99th-percentile per-token latency (linear interpolation; None without steps)."""
        return self._pct(99.0)

    @property
    def decode_ms(self) -> float:
        return sum(self.token_latencies_ms)

    @property
    def total_ms(self) -> float:
        """Prefill plus every decode step."""
        return self.ttft_ms + self.decode_ms

    @property
    def tokens(self) -> int:
        """Generated tokens over the batch: ``batch * new_tokens``."""
        return self.batch * self.new_tokens

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens (whole batch) per second over prefill and decode."""
        return self.tokens / (self.total_ms * 1e-3) if self.total_ms else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens per second of the decode steps alone (None without steps)."""
        if not self.steps or not self.decode_ms:
            return None
        return self.batch * len(self.steps) / (self.decode_ms * 1e-3)

    @property
    def sequences_per_s(self) -> float:
        """Whole sequences (prompt + ``new_tokens``) completed per second."""
        return self.batch / (self.total_ms * 1e-3) if self.total_ms else 0.0

    @property
    def kv_cache_bytes(self) -> list[int]:
        """The KV cache after the prefill, then after every decode step."""
        return [self.prompt_len * self.kv_bytes_per_token] + [s.kv_cache_bytes for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (schema ``wia-hw.generate/1``): plain types only."""
        return {
            "schema": "wia-hw.generate/1",
            "model": self.model,
            "device": self.device,
            "precision": self.precision,
            "batch": self.batch,
            "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens,
            "method": self.method,
            "kv_bucket": self.kv_bucket,
            "anchor_every": self.anchor_every,
            "ttft_ms": self.ttft_ms,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "total_ms": self.total_ms,
            "tokens_per_s": self.tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "sequences_per_s": self.sequences_per_s,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "prefill": {
                "cycles": self.prefill.cycles,
                "latency_ms": self.prefill.latency_ms,
                "kv_cache_bytes": self.prompt_len * self.kv_bytes_per_token,
                "energy_j": self.prefill.energy_j,
            },
            "steps": [dataclasses.asdict(s) for s in self.steps],
            "timing_cache": dict(self.timing_cache),
            "provenance": self.provenance,
        }


# -- the probe -------------------------------------------------------------------------
class _Probe:
    """One layer's KV-dependent ops as a small graph, rebuilt for any KV length.

    Built from the decode graphs at two KV lengths ``k0`` and ``k0 + 1``: the ops
    whose input or output shapes differ are KV-dependent; the probe keeps those of one
    layer and the views feeding them, and takes everything else they read as inputs.
    Every shape and integer attribute that differs between the two graphs is affine
    in the KV length (checked against a third graph), so the probe at any length is
    the one at ``k0`` moved along that line.
    """

    def __init__(self, g0: Graph, g1: Graph, g2: Graph, k0: int) -> None:
        self.k0 = k0
        ops1 = {o.name: o for o in g1.ops}
        ops2 = {o.name: o for o in g2.ops}
        dep = [
            o.name
            for o in g0.ops
            if g0.shapes_of(o) != g1.shapes_of(ops1[o.name]) or o.attrs != ops1[o.name].attrs
        ]
        if not dep:
            raise WorkloadError(f"generate: no op of {g0.name!r} depends on the KV length")
        #: KV-dependent ops by role (the op name without its layer prefix): count
        self.roles: dict[str, int] = {}
        for n in dep:
            role = _LAYER.sub("", n)
            self.roles[role] = self.roles.get(role, 0) + 1
        layer = _LAYER.match(dep[0])
        prefix = layer.group(0) if layer else ""
        mine = {n for n in dep if n.startswith(prefix)}
        if {_LAYER.sub("", n) for n in mine} != set(self.roles):
            raise WorkloadError(
                f"generate: the KV-dependent ops of {g0.name!r} differ between layers"
            )
        by_name = {o.name: o for o in g0.ops}
        producer = {t: o for o in g0.ops for t in o.outputs}
        keep = set(mine)
        stack = [t for n in mine for t in by_name[n].inputs]
        while stack:  # the views feeding the probe keep their storage (no copy)
            p = producer.get(stack.pop())
            if p is not None and p.name not in keep and is_view(p, g0.shapes_of(p)[0]):
                keep.add(p.name)
                stack.extend(p.inputs)
        self.ops = [o for o in g0.ops if o.name in keep]
        produced = {t for o in self.ops for t in o.outputs}
        self.inputs: list[tuple[Tensor, tuple[int, ...]]] = []  # (tensor at k0, slope)
        seen: set[str] = set()
        for o in self.ops:
            for t in o.inputs:
                if t in produced or t in seen:
                    continue
                seen.add(t)
                a, b, c = g0.tensors[t], g1.tensors[t], g2.tensors[t]
                slope = tuple(y - x for x, y in zip(a.shape, b.shape, strict=True))
                if tuple(z - y for y, z in zip(b.shape, c.shape, strict=True)) != slope:
                    raise WorkloadError(
                        f"generate: {t!r} does not grow linearly with the KV length"
                    )
                kind = "weight" if a.kind == "weight" else "input"
                self.inputs.append((Tensor(a.name, a.shape, a.dtype, kind), slope))
        self.attr_slopes: dict[str, dict[str, int]] = {}
        for o in self.ops:
            o1, o2 = ops1[o.name], ops2[o.name]
            for k, v in o.attrs.items():
                if v != o1.attrs.get(k):
                    d = o1.attrs[k] - v
                    if not isinstance(v, int) or o2.attrs.get(k) - o1.attrs[k] != d:
                        raise WorkloadError(
                            f"generate: attribute {k!r} of {o.name!r} does not grow "
                            "linearly with the KV length"
                        )
                    self.attr_slopes.setdefault(o.name, {})[k] = d
        self.dtypes = {t: g0.tensors[t].dtype for o in self.ops for t in o.outputs}
        self.name = g0.name

    def graph(self, kv_len: int) -> Graph:
        """The probe at ``kv_len`` cached tokens."""
        dk = kv_len - self.k0
        b = GraphBuilder(f"{self.name}.kv_probe")
        for t, slope in self.inputs:
            shape = tuple(s + dk * d for s, d in zip(t.shape, slope, strict=True))
            (b.weight if t.kind == "weight" else b.input)(t.name, shape, t.dtype)
        for o in self.ops:
            attrs = dict(o.attrs)
            for k, d in self.attr_slopes.get(o.name, {}).items():
                attrs[k] = attrs[k] + dk * d
            b.op(
                o.kind,
                o.name,
                list(o.inputs),
                group=o.group,
                dtype=self.dtypes[o.outputs[0]],
                out=o.outputs[0],
                **attrs,
            )
        return b.graph()


class _ProbeTimer:
    """Runs probes on a scratch device (same spec and providers as the context) in
    increasing KV length, each warm from the one before (the first after a probe one
    position shorter), as one program (its growing tensors laid out again, as
    ``Context.same_program`` does for the steps), and keeps the cycles of every probe
    op role per KV length."""

    def __init__(self, ctx: Context, probe: _Probe) -> None:
        self.spec: DeviceSpec = ctx.spec
        self.providers = ctx.providers
        self.probe = probe
        self.device = Device(ctx.spec)
        self.timed = 0
        self._by_len: dict[int, dict[str, int]] = {}
        # the probes are one program, as the steps they time are (Context.same_program):
        # a tensor that grows (the KV cache) gets storage of its new size
        self._shapes: dict[str, tuple] = {}
        self._program: set[str] = set()

    @property
    def runs(self) -> int:
        return len(self._by_len)

    def cycles(self, kv_len: int) -> dict[str, int]:
        """Cycles of every probe op role at ``kv_len`` (lowered and run once)."""
        got = self._by_len.get(kv_len)
        if got is None:
            if not self._by_len:  # a first probe one position shorter warms the device,
                # so the first timed one, like every step, meets its KV cache grown
                warm = self.probe.graph(max(1, kv_len - 1))
                _release_other_tensors(self.device.memory, warm, self._shapes, self._program)
                for _, ks in lower(warm, self.spec, self.providers):
                    execute_kernels(self.device, ks)
            graph = self.probe.graph(kv_len)
            _release_other_tensors(self.device.memory, graph, self._shapes, self._program)
            lowered = lower(graph, self.spec, self.providers)
            got = self._by_len[kv_len] = {}
            for op, ks in lowered:
                role = _LAYER.sub("", op.name)
                got[role] = got.get(role, 0) + sum(
                    r.cycles for r in execute_kernels(self.device, ks)
                )
                self.timed += len(ks)
        return got


# -- the API ---------------------------------------------------------------------------
def _check_pos(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise WorkloadError(f"generate: {name} must be a positive integer, got {value!r}")
    return int(value)


def generate(
    model: str = "gpt2",
    *,
    prompt_len: int = 1,
    new_tokens: int = 128,
    batch: int = 1,
    device: str | os.PathLike[str] | DeviceSpec = DEFAULT_DEVICE,
    overrides: Mapping[str, Any] | None = None,
    precision: str | None = None,
    seed: int = 0,
    method: str = "cached",
    kv_bucket: int = DEFAULT_KV_BUCKET,
    anchor_every: int = DEFAULT_ANCHOR_EVERY,
    ctx: Context | None = None,
    **model_kwargs: Any,
) -> GenerationResult:
    """Generate ``new_tokens`` tokens per sequence after a ``prompt_len``-token prompt.

    ``model`` is a decoder workload (:data:`DECODER_MODELS`: ``gpt2``); extra keyword
    arguments go to its builder (``size="medium"``, ``layers=2``; not those
    generation sets, :data:`GENERATION_SET`). ``device``,
    ``overrides`` and ``seed`` open the device as :func:`wia_hw.run` does, or ``ctx``
    is a context to run on (with its extensions; its state carries over). ``method``
    is ``"cached"`` or ``"exact"`` (module docstring); ``kv_bucket`` (>= 1) and
    ``anchor_every`` (a multiple of ``kv_bucket``) tune the cached method. Returns a
    :class:`GenerationResult`; bad arguments raise :class:`~wia_hw.WorkloadError`.
    """
    if not isinstance(model, str) or model.strip().lower() not in DECODER_MODELS:
        raise WorkloadError(
            f"generate: {model!r} is not a decoder model (token generation needs a decode "
            f"phase over a KV cache; decoder models: {', '.join(DECODER_MODELS)})"
        )
    model = model.strip().lower()
    new_tokens = _check_pos("new_tokens", new_tokens)
    prompt_len = _check_pos("prompt_len", prompt_len)
    batch = _check_pos("batch", batch)
    if method not in GENERATION_METHODS:
        raise WorkloadError(
            f"generate: method must be one of {', '.join(GENERATION_METHODS)}, got {method!r}"
        )
    kv_bucket = _check_pos("kv_bucket", kv_bucket)
    anchor_every = _check_pos("anchor_every", anchor_every)
    if anchor_every % kv_bucket:
        raise WorkloadError(
            f"generate: anchor_every ({anchor_every}) must be a multiple of kv_bucket ({kv_bucket})"
        )
    for name in model_kwargs:
        if name in GENERATION_SET:
            raise WorkloadError(
                f"generate: {name} is not a model argument here: {GENERATION_SET[name]}"
            )

    def build(**a: Any) -> Graph:  # refuses an argument the builder does not take
        return build_workload(model, **a)

    kw = dict(model_kwargs, batch=batch, precision=precision)
    kw = {k: v for k, v in kw.items() if v is not None}
    kv_lens = list(range(prompt_len, prompt_len + new_tokens - 1))
    build(seq=1, phase="prefill", **kw)  # the model's own arguments (size=, layers=, ...)
    try:
        build(seq=prompt_len, phase="prefill", **kw)
        if kv_lens:
            build(seq=1, phase="decode", kv_len=kv_lens[-1], **kw)
    except WorkloadError as e:
        raise WorkloadError(
            f"generate: prompt_len {prompt_len} + new_tokens {new_tokens} - 1 = "
            f"{prompt_len + new_tokens - 1} token positions: {e}"
        ) from None
    if ctx is None:
        ctx = open_device(device, overrides=overrides, seed=seed)
    if kv_lens:
        _check_memory(ctx, build, kw, prompt_len, kv_lens)
    # the prefill and the decode steps are one program whose buffers are reused (its
    # KV cache one position longer each step), not new tensors at each length
    with ctx.same_program():
        prefill = ctx.run(model, seq=prompt_len, phase="prefill", **kw)
        spec = ctx.spec
        per_token = _kv_bytes_per_token(build, 1, kw)
        steps: list[DecodeStep] = []
        stats: dict[str, int] = {}

        def step(i: int, k: int, cycles: int, source: str) -> DecodeStep:
            return DecodeStep(i, k, cycles, spec.cycles_to_ms(cycles), (k + 1) * per_token, source)

        gs = None
        if method != "exact" and kv_lens:
            try:  # the probe's three decode graphs, one and two positions past the first
                gs = [build(seq=1, phase="decode", kv_len=kv_lens[0] + d, **kw) for d in (0, 1, 2)]
            except WorkloadError:  # past the model's positions (its last one or two steps):
                gs = None  # those few steps are emulated whole
        if gs is None:
            for i, k in enumerate(kv_lens, 1):
                r = ctx.run(model, seq=1, phase="decode", kv_len=k, **kw)
                steps.append(step(i, k, r.cycles, "emulated"))
        else:
            first = kv_lens[0]
            probe = _Probe(gs[0], gs[1], gs[2], first)
            timer = _ProbeTimer(ctx, probe)
            anchor_cycles, anchor_probe = 0, {}
            for i, k in enumerate(kv_lens, 1):
                cyc = timer.cycles(max(first, k - k % kv_bucket))
                if k == first or k % anchor_every == 0:
                    r = ctx.run(model, seq=1, phase="decode", kv_len=k, **kw)
                    anchor_cycles, anchor_probe = r.cycles, cyc
                    steps.append(step(i, k, r.cycles, "emulated"))
                    stats["anchors"] = stats.get("anchors", 0) + 1
                    continue
                delta = sum(n * (cyc[role] - anchor_probe[role]) for role, n in probe.roles.items())
                steps.append(step(i, k, anchor_cycles + delta, "cached"))
            stats.update(
                probe_runs=timer.runs,
                probe_kernels_timed=timer.timed,
                cached_steps=sum(s.source == "cached" for s in steps),
            )
        params = prefill.params
        return GenerationResult(
            model=prefill.workload,
            device=spec.name,
            precision=prefill.precision,
            batch=batch,
            prompt_len=prompt_len,
            new_tokens=new_tokens,
            method=method,
            kv_bucket=kv_bucket,
            anchor_every=anchor_every,
            clock_ghz=spec.clock_ghz,
            prefill=prefill,
            steps=steps,
            kv_bytes_per_token=per_token,
            timing_cache=stats,
            provenance=dict(
                prefill.provenance,
                generate={
                    "model": model,
                    "prompt_len": prompt_len,
                    "new_tokens": new_tokens,
                    "batch": batch,
                    "method": method,
                    "kv_bucket": kv_bucket,
                    "anchor_every": anchor_every,
                    "kwargs": {k: v for k, v in model_kwargs.items()},
                    "layers": params.get("layers"),
                },
            ),
        )


def _memory_error(ctx: Context, graph: Graph) -> str | None:
    """Why one run of ``graph`` on ``ctx`` would not fit its device memory (the run's
    memory plan, :class:`~wia_hw._memory_plan.RunMemory`, replayed on an allocator of
    the same size holding the context's live buffers), or ``None`` when it fits."""
    from ._memory_plan import RunMemory
    from .emulator.allocator import CachingAllocator, DeviceOutOfMemory

    live = ctx.allocator
    alloc = CachingAllocator(live.capacity_bytes, live.config)
    lowered = lower(graph, ctx.spec, ctx.providers)
    try:
        for blk in live.live_blocks:
            alloc.malloc(max(1, blk.requested))
        mem = RunMemory(alloc, graph, lowered)
        mem.start(0)
        for idx in range(len(lowered)):
            mem.before_op(idx, 0)
            mem.after_op(idx, 0)
    except DeviceOutOfMemory as e:
        return str(e)
    return None


def _check_memory(
    ctx: Context, build: Any, kw: dict[str, Any], prompt_len: int, kv_lens: list[int]
) -> None:
    """Refuse a generation whose last decode step (the longest KV cache) would not fit
    device memory, as a single run of that step does, naming the first step that does
    not fit (the cache only grows, so the steps before it fit)."""

    def err(k: int) -> str | None:
        return _memory_error(ctx, build(seq=1, phase="decode", kv_len=k, **kw))

    why = err(kv_lens[-1])
    if why is None:
        return
    lo, hi = 0, len(kv_lens) - 1  # kv_lens[hi] does not fit
    if err(kv_lens[0]) is not None:
        hi = 0
    else:
        while hi - lo > 1:  # kv_lens[lo] fits, kv_lens[hi] does not
            mid = (lo + hi) // 2
            if err(kv_lens[mid]) is None:
                lo = mid
            else:
                hi = mid
        why = err(kv_lens[hi])
    fits = (
        f"the most that fit are new_tokens={hi + 1} (prompt_len {prompt_len})"
        if hi > 0
        else "no decode step fits"
    )
    raise WorkloadError(
        f"generate: decode step {hi + 1} of {len(kv_lens)} (kv_len {kv_lens[hi]}) does not "
        f"fit device memory ({ctx.spec.name}): {why}; {fits}"
    )


def _kv_bytes_per_token(build: Any, kv_len: int, kw: dict[str, Any]) -> int:
    """Bytes one more cached token adds (every layer's keys and values, whole batch):
    the growth of the decode graph's cache inputs from one KV length to the next,
    checked to be linear (the cache at ``kv_len`` holds ``kv_len`` times that)."""
    g0, g1 = (build(seq=1, phase="decode", kv_len=k, **kw) for k in (kv_len, kv_len + 1))
    grown = [
        n for n, t in g0.tensors.items() if t.kind == "input" and t.shape != g1.tensors[n].shape
    ]
    per = sum(g1.tensors[n].nbytes - g0.tensors[n].nbytes for n in grown)
    if sum(g0.tensors[n].nbytes for n in grown) != g0.params["kv_len"] * per:
        raise WorkloadError(f"generate: the KV cache of {g0.name!r} is not linear in its length")
    return per
