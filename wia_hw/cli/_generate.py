"""``wia-hw run MODEL --generate N [--prompt-len P]``: token generation on the CLI.

:func:`run_generation` runs :func:`wia_hw.generate` with the ``run`` command's device,
workload and extension options and prints :func:`print_generation` (or the JSON
report). :func:`throughput_text` labels a run's throughput with what it counts
(tokens, sequences or samples per second).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..emulator.errors import WiaError
from ..generate import GenerationResult, generate
from ..profiling._report import spec_label
from ..runtime import RunResult
from ._common import RunOptions, emit_json, make_console

__all__ = ["run_generation", "print_generation", "throughput_text"]

#: Rows of the per-step table (evenly spaced steps, the first and the last included).
TABLE_ROWS = 16

#: The command-line options that set :func:`wia_hw.generate`'s own arguments (``-a``
#: gives model arguments only; ``batch`` and ``precision`` are the model's too).
_OWN_OPTIONS = {
    "new_tokens": "--generate N",
    "prompt_len": "--prompt-len P",
    "device": "--device",
    "overrides": "--set PATH=VALUE",
    "seed": "--seed",
    "model": "MODEL",
}


def throughput_text(r: RunResult) -> str:
    """``r.throughput`` with its unit: tokens/s for a decode step (every sequence
    gets ``seq`` new tokens), sequences/s with the tokens/s they carry for a sequence
    model, samples/s otherwise."""
    p = r.params
    seconds = r.latency_ms * 1e-3
    if p.get("phase") == "decode":
        tokens = r.sequences * int(p.get("seq", 1))
        tps = tokens / seconds if seconds else 0.0
        return f"{tps:,.1f} tokens/s (batch {r.sequences}, {p.get('seq', 1)} new per sequence)"
    if "seq" in p:
        tps = r.sequences * int(p["seq"]) / seconds if seconds else 0.0
        return f"{r.throughput:,.1f} sequences/s ({tps:,.0f} tokens/s)"
    return f"{r.throughput:,.1f} samples/s"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,} B"


def print_generation(g: GenerationResult, console: Console) -> None:
    """The generation report: TTFT, per-token P50/P99, tokens/s and sequences/s, the
    KV cache, and a table of sampled steps (latency and KV-cache bytes over time)."""
    how = (
        "exact timing (every step emulated)"
        if g.method == "exact"
        else f"cached timing (KV bucket {g.kv_bucket}, an emulated anchor every "
        f"{g.anchor_every} tokens)"
    )
    console.print(
        f"[bold]{g.model}[/bold] generation (batch={g.batch}, prompt_len={g.prompt_len}, "
        f"new_tokens={g.new_tokens}) on [bold]{g.device}[/bold], {g.precision}, {how}",
        highlight=False,
    )
    console.print(f"  Spec: {spec_label(g.provenance)}", highlight=False, markup=False)
    console.print(
        f"  Time to first token: {g.ttft_ms:.3f} ms (prefill of {g.prompt_len} prompt "
        f"token{'s' if g.prompt_len != 1 else ''})"
    )
    if g.steps:
        console.print(
            f"  Per-token latency:   P50 {g.p50_ms:.3f} ms, P99 {g.p99_ms:.3f} ms "
            f"(over {len(g.steps)} decode steps)"
        )
        console.print(
            f"  Throughput:          {g.tokens_per_s:,.1f} tokens/s overall, "
            f"{g.decode_tokens_per_s:,.1f} tokens/s decoding, "
            f"{g.sequences_per_s:,.2f} sequences/s"
        )
    else:
        console.print("  Per-token latency:   none (one new token: the prefill made it)")
        console.print(
            f"  Throughput:          {g.tokens_per_s:,.1f} tokens/s, "
            f"{g.sequences_per_s:,.2f} sequences/s"
        )
    console.print(f"  Total:               {g.total_ms:.3f} ms for {g.tokens:,} tokens")
    kv = g.kv_cache_bytes
    console.print(
        f"  KV cache:            {_bytes(kv[0])} after the prefill -> {_bytes(kv[-1])} "
        f"after the last step ({g.kv_bytes_per_token:,} B per token position)"
    )
    if not g.steps:
        return
    t = Table(title="Decode steps (sampled)", title_justify="left")
    for col in ("step", "kv_len", "latency (ms)", "KV cache", "timing"):
        t.add_column(col, justify="left" if col == "timing" else "right", no_wrap=True)
    n = len(g.steps)
    picks = sorted({round(i * (n - 1) / (TABLE_ROWS - 1)) for i in range(TABLE_ROWS)})
    for i in picks if n > TABLE_ROWS else range(n):
        s = g.steps[i]
        t.add_row(
            str(s.index), str(s.kv_len), f"{s.latency_ms:.4f}", _bytes(s.kv_cache_bytes), s.source
        )
    console.print(t)


def run_generation(
    opts: RunOptions | None,
    new_tokens: int | None,
    prompt_len: int | None,
    mode: str,
    seed: int,
    as_json: bool,
    output: Path | None,
    width: int | None,
    given: dict[str, Any],
) -> None:
    """``wia-hw run MODEL --generate N [--prompt-len P]``: checks the options (``given``:
    other ``run`` options that do not apply when set, such as ``--phase``), generates,
    writes ``-o`` and prints the report or, with ``--json``, the JSON. Raises
    :class:`WiaError` (one line) on a bad or inapplicable option."""
    import json

    if new_tokens is None:
        raise WiaError("--prompt-len needs --generate N")
    if new_tokens < 1:
        raise WiaError(f"--generate must be a positive number of tokens, got {new_tokens}")
    if prompt_len is not None and prompt_len < 1:
        raise WiaError(f"--prompt-len must be a positive number of tokens, got {prompt_len}")
    if opts is None:
        raise WiaError("--generate needs a MODEL (gpt2)")
    given = dict(given, **{"--seq": opts.seq, "--mode": None if mode == "timing" else mode})
    for name, value in given.items():
        if value is not None:
            raise WiaError(f"{name} does not apply with --generate")
    own = inspect.signature(generate).parameters
    for name, value in opts.builder.items():
        if name in own and name not in ("batch", "precision"):
            how = _OWN_OPTIONS.get(name)
            raise WiaError(
                f"-a {name}={value}: {name} is not a model argument but generation's own"
                + (f" (give it as {how})" if how else " (not set from the command line)")
            )
    ctx = opts.open(seed=seed)
    # -a seq, phase or kv_len reach generate(), which refuses them (--seq was refused)
    kw = {k: v for k, v in opts.run_kwargs().items() if v is not None}
    g = generate(
        opts.workload,
        prompt_len=1 if prompt_len is None else prompt_len,
        new_tokens=new_tokens,
        ctx=ctx,
        **kw,
    )
    text = json.dumps(g.to_dict(), indent=2)
    if emit_json(text, output, as_json):
        return
    print_generation(g, make_console(width))
