"""Token generation speed: wall time to emulate GPT-2 small generating 1,024 tokens
(a 1-token prompt, batch 1, wia-npu; ``wia-hw run gpt2 --generate 1024``), and the
cached timing's error against the exact whole-step emulation.

Prints, in order:

1. the wall and CPU time of ``wia_hw.generate`` with the default cached timing
   (target: <= 5 s for 1,024 tokens), with ``kv_bucket=1`` (a probe per KV length),
   and its emulated figures (TTFT, P50/P99 per token, tokens/s);
2. the error of the cached steps against the exact method (every step a whole-graph
   run on the device, in order) over the first ``--check`` decode steps, and over
   evenly spaced stretches of ``--check`` steps after prompts of 256, 512 and 768
   tokens (each an exact prefill + steps run); ``--full`` compares all 1,023 steps
   instead (about 0.3 s per exact step: several minutes).

Usage::

    python benchmarks/generation_speed.py [--tokens N] [--check N] [--full] [--quick]
"""

from __future__ import annotations

import argparse
import time

from wia_hw.generate import DEFAULT_ANCHOR_EVERY, DEFAULT_KV_BUCKET, generate


def _timed(**kw):
    c0, t0 = time.process_time(), time.perf_counter()
    g = generate("gpt2", **kw)
    return g, time.perf_counter() - t0, time.process_time() - c0


def _errors(prompt: int, steps: int, layers: int | None) -> tuple[int, float, int]:
    """(max |cycles| error, max relative error, steps compared) of the default cached
    timing and of kv_bucket=1 against exact, over ``steps`` decode steps."""
    kw = dict(prompt_len=prompt, new_tokens=steps + 1)
    if layers:
        kw["layers"] = layers
    exact = generate("gpt2", method="exact", **kw)
    out = []
    for bucket in (DEFAULT_KV_BUCKET, 1):
        g = generate("gpt2", kv_bucket=bucket, **kw)
        d = [abs(c.cycles - e.cycles) for c, e in zip(g.steps, exact.steps, strict=True)]
        rel = [x / e.cycles for x, e in zip(d, exact.steps, strict=True)]
        out.append((max(d), max(rel), len(d)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="new tokens (default 1024)")
    ap.add_argument("--check", type=int, default=16, help="exact steps per error sample")
    ap.add_argument("--full", action="store_true", help="compare every step against exact")
    ap.add_argument("--quick", action="store_true", help="2 layers, 128 tokens (smoke)")
    a = ap.parse_args()
    layers = 2 if a.quick else None
    tokens = 128 if a.quick else a.tokens
    extra = {"layers": layers} if layers else {}
    generate("gpt2", prompt_len=1, new_tokens=2, **extra)  # warm imports
    print(
        f"gpt2{' (2 layers)' if layers else ''}, prompt 1 token, {tokens} new tokens, "
        f"batch 1, wia-npu"
    )
    for label, kw in (
        (f"cached (kv_bucket={DEFAULT_KV_BUCKET}, anchor_every={DEFAULT_ANCHOR_EVERY})", {}),
        ("cached (kv_bucket=1)", {"kv_bucket": 1}),
    ):
        g, wall, cpu = _timed(prompt_len=1, new_tokens=tokens, **kw, **extra)
        verdict = "ok" if wall <= 5.0 else "OVER"
        print(
            f"  {label:<40} wall {wall:6.2f} s  cpu {cpu:6.2f} s  (target <= 5 s: {verdict}); "
            f"TTFT {g.ttft_ms:.3f} ms, P50 {g.p50_ms:.3f} ms, P99 {g.p99_ms:.3f} ms, "
            f"{g.tokens_per_s:,.0f} tokens/s; {g.timing_cache}"
        )
    print("error of the cached steps against exact emulation (cycles; relative):")
    if a.full:
        samples = [(1, tokens - 1)]
    else:
        samples = [(p, a.check) for p in (1, 256, 512, 768) if p + a.check <= 1024]
        samples = samples[:1] if a.quick else samples
    for prompt, steps in samples:
        (dmax, rmax, n), (d1, r1, _) = _errors(prompt, steps, layers)
        print(
            f"  kv_len {prompt}..{prompt + steps - 1} ({n} steps): "
            f"kv_bucket={DEFAULT_KV_BUCKET}: max {dmax} cycles ({100 * rmax:.4f}%); "
            f"kv_bucket=1: max {d1} cycles ({100 * r1:.4f}%)"
        )


if __name__ == "__main__":
    main()
