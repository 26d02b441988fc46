"""Token generation (wia_hw.generate, wia-hw run --generate): prefill + decode steps
over a growing KV cache, the figures derived from them, the cached timing against
the exact whole-step emulation, the CLI labels and the one-line errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from wia_hw.emulator.errors import WorkloadError

import wia_hw
from wia_hw.cli import cli
from wia_hw.generate import DecodeStep, GenerationResult, _Probe, generate
from wia_hw.workloads import gpt2
from wia_hw.workloads._transformers import GPT2_SIZES

LAYERS = 2  # small enough for fast tests; every layer is alike
SMALL = GPT2_SIZES["small"]


@pytest.fixture(scope="module")
def exact_and_cached():
    """16 decode steps (kv_len 8..23) timed exactly and by the cache (bucket 1 and 8)."""
    kw = dict(prompt_len=8, new_tokens=17, layers=LAYERS)
    return (
        generate("gpt2", method="exact", **kw),
        generate("gpt2", kv_bucket=1, **kw),
        generate("gpt2", kv_bucket=8, **kw),
    )


# -- semantics -------------------------------------------------------------------------
@pytest.mark.parametrize(("precision", "elem_bytes"), [("fp16", 2), ("int8", 1)])
def test_kv_cache_grows_by_one_token_of_keys_and_values_per_step(precision, elem_bytes):
    batch, prompt = 3, 5
    g = generate(
        "gpt2", prompt_len=prompt, new_tokens=6, batch=batch, precision=precision, layers=LAYERS
    )
    # every layer keeps K and V of hidden = heads * head_dim values per token and sequence
    per_token = 2 * LAYERS * batch * SMALL.hidden * elem_bytes
    assert g.kv_bytes_per_token == per_token
    kv = g.kv_cache_bytes
    assert kv == [(prompt + i) * per_token for i in range(len(g.steps) + 1)]
    assert np.all(np.diff(kv) == per_token)
    # and it is what the decode graph of each step holds: its past plus the new token
    for s in g.steps[:2]:
        dg = gpt2(batch=batch, phase="decode", kv_len=s.kv_len, precision=precision, layers=LAYERS)
        past = sum(
            t.nbytes for n, t in dg.tensors.items() if n.endswith((".past_key", ".past_value"))
        )
        assert s.kv_cache_bytes == past + per_token
    assert [s.kv_len for s in g.steps] == list(range(prompt, prompt + 5))


def test_ttft_is_the_prefill_run_and_steps_follow_it():
    g = generate("gpt2", prompt_len=7, new_tokens=3, batch=2, layers=LAYERS)
    fresh = wia_hw.run("gpt2", batch=2, seq=7, layers=LAYERS)
    assert g.ttft_ms == fresh.latency_ms
    assert g.prefill.cycles == fresh.cycles
    assert g.prefill.params["phase"] == "prefill" and g.prefill.params["seq"] == 7
    assert len(g.steps) == 2 and [s.index for s in g.steps] == [1, 2]
    assert g.tokens == 2 * 3
    assert g.total_ms == pytest.approx(g.ttft_ms + sum(s.latency_ms for s in g.steps))


def test_exact_method_is_the_sequence_of_whole_step_runs():
    g = generate("gpt2", prompt_len=4, new_tokens=4, layers=LAYERS, method="exact")
    ctx = wia_hw.open_device()
    with ctx.same_program():  # one program's buffers, its KV cache growing
        ctx.run("gpt2", seq=4, layers=LAYERS)
        cycles = [
            ctx.run("gpt2", phase="decode", kv_len=k, layers=LAYERS).cycles for k in (4, 5, 6)
        ]
    assert [s.cycles for s in g.steps] == cycles
    assert {s.source for s in g.steps} == {"emulated"}


def _result(latencies_ms, batch=2, new_tokens=None):
    """A GenerationResult around given decode-step latencies (cycles at 1 GHz)."""
    pre = wia_hw.run("gemm", M=8, N=8, K=8)
    steps = [
        DecodeStep(i + 1, 10 + i, round(ms * 1e6), ms, 0, "cached")
        for i, ms in enumerate(latencies_ms)
    ]
    return GenerationResult(
        model="gpt2",
        device="wia-npu",
        precision="fp16",
        batch=batch,
        prompt_len=10,
        new_tokens=len(steps) + 1 if new_tokens is None else new_tokens,
        method="cached",
        kv_bucket=1,
        anchor_every=256,
        clock_ghz=1.0,
        prefill=pre,
        steps=steps,
        kv_bytes_per_token=4,
    )


def test_percentiles_and_throughputs_are_their_definitions():
    rng = np.random.default_rng(7)
    lat = list(rng.uniform(0.5, 2.0, size=37))
    g = _result(lat)
    s, n = sorted(lat), len(lat)

    def linear(q):  # the (n - 1) q rank, interpolated between its neighbours
        r = (n - 1) * q / 100
        lo = math.floor(r)
        return s[lo] + (r - lo) * (s[min(lo + 1, n - 1)] - s[lo])

    assert g.p50_ms == pytest.approx(linear(50))
    assert g.p99_ms == pytest.approx(linear(99))
    total_s = (g.prefill.latency_ms + sum(lat)) * 1e-3
    assert g.tokens_per_s == pytest.approx(2 * (n + 1) / total_s)
    assert g.decode_tokens_per_s == pytest.approx(2 * n / (sum(lat) * 1e-3))
    assert g.sequences_per_s == pytest.approx(2 / total_s)


def test_one_new_token_is_the_prefill_alone():
    g = generate("gpt2", prompt_len=3, new_tokens=1, layers=LAYERS)
    assert g.steps == [] and g.p50_ms is None and g.p99_ms is None
    assert g.decode_tokens_per_s is None
    assert g.tokens_per_s == pytest.approx(1 / (g.ttft_ms * 1e-3))
    assert g.kv_cache_bytes == [3 * g.kv_bytes_per_token]


def test_the_longest_generation_fits_the_positions():
    """GPT-2's 1024 positions: a 1-token prompt generates 1024 tokens, its last step
    attends to 1022 cached tokens; one more token is an error."""
    with pytest.raises(WorkloadError, match=r"prompt_len 2 \+ new_tokens 1024 - 1 = 1025"):
        generate("gpt2", prompt_len=2, new_tokens=1024, layers=LAYERS)


def test_the_probe_finds_the_kv_dependent_ops_from_the_graphs():
    gs = [gpt2(phase="decode", kv_len=k, layers=3) for k in (9, 10, 11)]
    p = _Probe(*gs, 9)
    assert p.roles == {
        f"attention_{r}": 3 for r in ("key_cache", "value_cache", "scores", "softmax", "context")
    }
    pg = p.graph(40)  # moved along the line: the cache inputs and the softmax's past
    assert pg.tensors["layer0.past_key"].shape == (SMALL.heads, 40, SMALL.head_dim)
    soft = next(o for o in pg.ops if o.name == "layer0.attention_softmax")
    assert soft.attrs == {"causal": True, "past": 40}
    assert pg.tensors["layer0.attention_scores"].shape == (SMALL.heads, 1, 41)


# -- cached timing against exact emulation ------------------------------------------------
#: Documented bounds (wia_hw/generate.py): per step, relative to the exact step.
BOUND_BUCKET_1 = 1e-4
BOUND_BUCKET_8 = 1e-3


def _rel_errors(cached, exact):
    assert [s.kv_len for s in cached.steps] == [s.kv_len for s in exact.steps]
    return [
        abs(c.cycles - e.cycles) / e.cycles for c, e in zip(cached.steps, exact.steps, strict=True)
    ]


def test_cached_timing_is_the_exact_emulation_within_its_bound(exact_and_cached):
    exact, one, eight = exact_and_cached
    assert one.ttft_ms == exact.ttft_ms
    assert one.steps[0] == exact.steps[0]  # the first decode step is the emulated anchor
    assert max(_rel_errors(one, exact)) <= BOUND_BUCKET_1
    assert max(_rel_errors(eight, exact)) <= BOUND_BUCKET_8
    assert [s.source for s in one.steps] == ["emulated"] + ["cached"] * 15
    # within a bucket the probe's time holds: a bucket's steps never run long
    for c, e in zip(eight.steps, exact.steps, strict=True):
        assert c.cycles <= e.cycles + BOUND_BUCKET_1 * e.cycles


def test_cached_timing_across_a_tile_boundary_of_the_scores():
    """kv_len 250..265: the scores' n = kv_len + 1 passes 256 (a new tile column)."""
    kw = dict(prompt_len=250, new_tokens=17, layers=LAYERS)
    exact = generate("gpt2", method="exact", **kw)
    cached = generate("gpt2", kv_bucket=8, **kw)
    errs = _rel_errors(cached, exact)
    assert max(errs) <= BOUND_BUCKET_8

    def jumps(g):
        return [b.cycles - a.cycles for a, b in zip(g.steps, g.steps[1:], strict=False)]

    jump = jumps(exact)
    assert max(jump) > 10 * np.median(jump)  # there is a jump, and the cache has it too
    assert np.argmax(jumps(cached)) == np.argmax(jump)
    assert exact.steps[int(np.argmax(jump)) + 1].kv_len == 256  # scores n: 256 -> 257


def test_anchors_are_emulated_steps_and_the_cache_fills_the_rest():
    g = generate("gpt2", prompt_len=5, new_tokens=12, layers=LAYERS, kv_bucket=2, anchor_every=4)
    anchors = [s.kv_len for s in g.steps if s.source == "emulated"]
    assert anchors == [5, 8, 12]  # the first step, then kv_len a multiple of 4
    assert g.timing_cache["anchors"] == 3
    assert g.timing_cache["probe_runs"] == len({max(5, k - k % 2) for k in range(5, 16)})


def test_generation_is_deterministic():
    a = generate("gpt2", prompt_len=3, new_tokens=5, layers=LAYERS)
    b = generate("gpt2", prompt_len=3, new_tokens=5, layers=LAYERS)
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())


# -- CLI -------------------------------------------------------------------------------
def _cli(*args):
    return CliRunner().invoke(cli, list(args))


def test_cli_generate_prints_ttft_percentiles_and_labelled_throughput():
    res = _cli("run", "gpt2", "--generate", "6", "--prompt-len", "3", "-b", "2", "-a", "layers=2")
    assert res.exit_code == 0, res.output
    g = generate("gpt2", prompt_len=3, new_tokens=6, batch=2, layers=LAYERS)
    for text in (
        "generation (batch=2, prompt_len=3, new_tokens=6)",
        f"Time to first token: {g.ttft_ms:.3f} ms",
        f"P50 {g.p50_ms:.3f} ms, P99 {g.p99_ms:.3f} ms (over 5 decode steps)",
        f"{g.tokens_per_s:,.1f} tokens/s overall",
        f"{g.decode_tokens_per_s:,.1f} tokens/s decoding",
        f"{g.sequences_per_s:,.2f} sequences/s",
        f"({g.kv_bytes_per_token:,} B per token position)",
        "Decode steps",
    ):
        assert text in res.output, text
    assert "seq/sec" not in res.output


def test_cli_generate_json_goes_to_stdout_and_file(tmp_path):
    out = tmp_path / "gen.json"
    res = _cli("run", "gpt2", "--generate", "3", "-a", "layers=2", "--json", "-o", str(out))
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d == json.loads(out.read_text())
    assert d["schema"] == "wia-hw.generate/1" and d["prompt_len"] == 1
    assert len(d["steps"]) == 2 and d["ttft_ms"] == d["prefill"]["latency_ms"]


def test_run_throughput_says_what_it_counts():
    dec = _cli("run", "gpt2", "--phase", "decode", "-b", "4", "-a", "layers=1")
    assert dec.exit_code == 0, dec.output
    assert "tokens/s (batch 4, 1 new per sequence)" in dec.output and "seq/sec" not in dec.output
    enc = _cli("run", "bert-base", "-b", "2", "-s", "16", "-a", "layers=1")
    assert "seq/sec (" in enc.output and "tokens/s)" in enc.output
    gem = _cli("run", "gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64")
    assert "samples/s" in gem.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gpt2", "--generate", "0"], r"--generate must be a positive number of tokens, got 0"),
        (
            ["gpt2", "--generate", "4", "--prompt-len", "0"],
            r"--prompt-len must be a positive number of tokens, got 0",
        ),
        (["gpt2", "--prompt-len", "4"], r"--prompt-len needs --generate N"),
        (["--generate", "4"], r"--generate needs a MODEL \(gpt2\)"),
        (
            ["bert-large", "--generate", "4"],
            r"generate: 'bert-large' is not a decoder model .*decoder models: gpt2",
        ),
        (["gpt2", "--generate", "4", "--seq", "8"], r"--seq does not apply with --generate"),
        (["gpt2", "--generate", "4", "--phase", "decode"], r"--phase does not apply"),
        (["gpt2", "--generate", "4", "--mode", "functional"], r"--mode does not apply"),
        (
            ["gpt2", "--generate", "1025"],
            r"1025 token positions: gpt2: kv_len must be in 1\.\.1023",
        ),
    ],
)
def test_cli_generate_bad_input_is_one_line(args, message):
    res = _cli("run", *args)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wia-hw: error: ")
    assert __import__("re").search(message, lines[0]), lines[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"new_tokens": 0}, r"generate: new_tokens must be a positive integer, got 0"),
        ({"prompt_len": 0}, r"generate: prompt_len must be a positive integer, got 0"),
        ({"batch": 0}, r"generate: batch must be a positive integer, got 0"),
        ({"new_tokens": 2.5}, r"new_tokens must be a positive integer, got 2.5"),
        ({"method": "fast"}, r"method must be one of cached, exact, got 'fast'"),
        ({"kv_bucket": 0}, r"kv_bucket must be a positive integer, got 0"),
        (
            {"kv_bucket": 3, "anchor_every": 256},
            r"anchor_every \(256\) must be a multiple of kv_bucket \(3\)",
        ),
        ({"model": "bert-large"}, r"'bert-large' is not a decoder model"),
        ({"model": "resnet50"}, r"'resnet50' is not a decoder model"),
        # a bad model argument is the builder's error alone, not a token-positions one
        ({"size": "huge"}, r"^gpt2: size must be one of small, medium, large, xl, got 'huge'$"),
        ({"precision": "fp7"}, r"^gpt2: precision "),
        ({"layers": 0}, r"^gpt2: layers "),
    ],
)
def test_generate_bad_arguments(kwargs, message):
    kw = dict(model="gpt2", prompt_len=2, new_tokens=2, layers=1) | kwargs
    with pytest.raises(WorkloadError, match=message):
        generate(kw.pop("model"), **kw)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("method", ["cached", "exact"])
def test_a_generation_whose_last_step_does_not_fit_memory_is_refused(seed, method):
    """The longest KV cache is checked against device memory before any step runs, by
    the rule a single run applies: the step it names is the first whose single run does
    not fit, and the step before it fits."""
    from wia_hw.emulator.allocator import DeviceOutOfMemory

    rng = np.random.default_rng(seed)
    batch, prompt = int(rng.integers(16, 33)), int(rng.integers(1, 64))
    ov = {"memory.hbm.size_gib": float(rng.uniform(0.15, 0.2))}
    with pytest.raises(WorkloadError) as ei:
        generate(
            "gpt2",
            prompt_len=prompt,
            new_tokens=1024 - prompt,
            batch=batch,
            layers=LAYERS,
            overrides=ov,
            method=method,
        )
    msg = str(ei.value)
    assert "\n" not in msg and "does not fit device memory" in msg
    k = int(msg.split("(kv_len ")[1].split(")")[0])
    step = int(msg.split("decode step ")[1].split()[0])
    assert step == k - prompt + 1 and f"new_tokens={step}" in msg
    kw = dict(batch=batch, seq=1, phase="decode", layers=LAYERS, device="wia-npu", overrides=ov)
    with pytest.raises(DeviceOutOfMemory):
        wia_hw.run("gpt2", kv_len=k, **kw)
    if k > prompt:
        wia_hw.run("gpt2", kv_len=k - 1, **kw)


def test_cli_generate_past_device_memory_is_one_line():
    res = CliRunner().invoke(
        cli,
        ["run", "gpt2", "--generate", "1024", "-b", "32", "-a", "layers=2"]
        + ["--set", "memory.hbm.size_gib=0.2"],
    )
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "does not fit device memory" in lines[0]
