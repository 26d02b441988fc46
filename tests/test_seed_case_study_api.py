"""The seed's section 8.7 case study translated line by line (docs/OPTIMIZATION.md):
``kernels_to_tune`` takes the seed's kernel names (the names ``wia-hw run`` prints,
without ``layerN.``) and skips its vector op with a warning; ``benchmark_model`` takes a
graph at its own batch, ``schedules=`` and the ``AutotuneResult`` itself; and
``create_inference_server`` takes the ``AutotuneResult``.

Graphs are BERT-Large with one or two layers at small sizes, and searches are short and
seeded (no wall-clock budget), so every result is deterministic.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

import wia_hw
from wia_hw import (
    AutotuneConfig,
    AutotuneMethod,
    BatchingConfig,
    BenchmarkConfig,
    BenchmarkError,
    FusionConfig,
    apply_fusion,
    autotune_model,
    benchmark_model,
    create_inference_server,
)
from wia_hw.optimize import AutotuneError, AutotuneResult, _autotune
from wia_hw.runtime import open_device
from wia_hw.serve import ServeError
from wia_hw.workloads import bert_large

#: the seed's ``kernels_to_tune``, as written
SEED_NAMES = [
    "attention_qkv_projection",
    "attention_softmax",
    "attention_output_projection",
    "feed_forward_intermediate",
    "feed_forward_output",
]
GEMM_NAMES = [n for n in SEED_NAMES if n != "attention_softmax"]
SEED_FUSION = FusionConfig(
    fuse_attention=True, fuse_layer_norm=True, fuse_residual_connections=True
)
#: one fresh run's latency (no warm-up): what ``wia_hw.run`` measures
ONE_RUN = BenchmarkConfig(warmup_iterations=0, measurement_iterations=1, cooldown_iterations=0)


def _skipped(record) -> list[str]:
    return [
        str(w.message) for w in record if issubclass(w.category, _autotune.KernelSkippedWarning)
    ]


def _keys_of(graph, op_names):
    """The kernel keys of the built-in GEMM kernels of the named ops (exact names)."""
    ctx = open_device("wia-npu")
    found = _autotune._kernels_of(graph, ctx.spec, ctx.providers)
    return {key for key, (_, ops) in found.items() if set(ops) & set(op_names)}


# -- 1. kernels_to_tune takes the seed's names -----------------------------------------


def test_seed_kernel_names_select_their_op_in_every_layer():
    g = bert_large(batch=2, seq=16, layers=2)
    cfg = AutotuneConfig(
        method=AutotuneMethod.ML_GUIDED,
        time_budget_seconds=None,
        max_trials=1,
        kernels_to_tune=SEED_NAMES,
    )
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        res = autotune_model(g, cfg)
    exact = [f"layer{i}.{n}" for i in (0, 1) for n in GEMM_NAMES]
    assert set(res.kernels) == _keys_of(g, exact)
    assert len(res.kernels) == 4
    for t in res.kernels.values():  # the op of both layers shares the key
        assert {o.split(".")[0] for o in t.ops} == {"layer0", "layer1"}
    # the softmax is skipped with one warning naming it and why
    msgs = _skipped(rec)
    assert len(msgs) == 1
    assert re.search(r"'attention_softmax': a softmax op, not a GEMM", msgs[0])
    assert "GEMM tilings" in msgs[0]
    # the exact names (both layers) and kernel keys select the same, without a warning
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        by_exact = autotune_model(g, replace(cfg, kernels_to_tune=exact))
        by_key = autotune_model(g, replace(cfg, kernels_to_tune=list(res.kernels)))
    assert not _skipped(rec)
    assert set(by_exact.kernels) == set(by_key.kernels) == set(res.kernels)
    # a layer-prefixed name still selects that layer's op alone (its key, shared here)
    one = autotune_model(g, replace(cfg, kernels_to_tune=["layer1.feed_forward_output"]))
    assert set(one.kernels) == _keys_of(g, ["layer1.feed_forward_output"])


@pytest.mark.parametrize(("batch", "seq"), [(2, 16), (8, 64)])
def test_seed_names_on_the_fused_graph_and_fused_kernel_names(batch, seq):
    """After the seed's fusion, ``feed_forward_intermediate``'s kernel is named
    ``...+layer0.feed_forward_gelu``, and the attention chain is either three kernels of
    one op or one flash-attention kernel of the transformer engine (chosen per shape
    when lowered): the seed's names still select the GEMM keys there are, a kernel name
    as the run prints it selects its own GEMM, and a name with no built-in GEMM (the
    softmax; the attention's bmms when flash attention runs them) is skipped, naming
    why."""
    g = apply_fusion(bert_large(batch=batch, seq=seq, layers=2), SEED_FUSION)
    ctx = open_device("wia-npu")
    found = _autotune._kernels_of(g, ctx.spec, ctx.providers)

    def select(names):
        return _autotune._select(g, ctx.spec, ctx.providers, found, names)

    with pytest.warns(_autotune.KernelSkippedWarning, match=r"'attention_softmax'"):
        keys = select(SEED_NAMES)
    exact = [f"layer{i}.{n}" for i in (0, 1) for n in GEMM_NAMES]
    assert set(keys) == _keys_of(g, exact) and len(keys) == 4
    printed = {re.sub(r"^layer\d+\.", "", k.name): k for k in wia_hw.run(g).kernels}
    fused_ffn = "feed_forward_intermediate+layer0.feed_forward_gelu"
    assert printed[fused_ffn].provider == "builtin"
    assert select([fused_ffn]) == select(["feed_forward_intermediate"])
    for name in ("attention_scores", "attention_context"):
        k = printed.get(name)
        if k is not None and k.provider == "builtin":  # the unfused GEMMs won
            assert len(select([name])) == 1
        else:  # flash attention: no built-in GEMM of that name
            with pytest.raises(AutotuneError, match=rf"nothing to tune.*'{name}': a bmm op"):
                select([name])
    if printed.get("attention_scores") is not None:
        assert select(["attention_scores"]) != select(["attention_context"])


def test_kernels_to_tune_errors_are_one_line():
    g = bert_large(batch=2, seq=16, layers=1)
    cfg = dict(method="grid", time_budget_seconds=None, max_trials=1)
    cases = [
        (["attention_sofmax"], r"kernels_to_tune: unknown kernel 'attention_sofmax'.*layerN"),
        (
            ["attention_softmax"],
            r"kernels_to_tune: nothing to tune in graph 'bert-large': 'attention_softmax': "
            r"a softmax op, not a GEMM",
        ),
        (["attention_qkv_projection", "nope"], r"unknown kernel 'nope'"),
    ]
    for names, match in cases:
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            with pytest.raises(AutotuneError, match=match) as e:
                autotune_model(g, AutotuneConfig(kernels_to_tune=names, **cfg))
        assert "\n" not in str(e.value)
        assert not _skipped(rec)  # an error, not an error and a warning


# -- 2. and 3. benchmark_model: a graph at its own batch, schedules, an AutotuneResult --


def test_benchmark_model_takes_a_graph_at_its_own_batch():
    g = bert_large(batch=2, seq=16, layers=1)
    plain = benchmark_model(g).latency_ms
    assert benchmark_model(g, 2).latency_ms == plain
    assert benchmark_model(g, 2, seq=16).latency_ms == plain
    for kw, match in (
        ({"batch": 4}, r"graph 'bert-large' was built at batch 2, not 4"),
        ({"batch": 2, "seq": 32}, r"graph 'bert-large' was built at seq 16, not 32"),
        ({"layers": 3}, r"layers cannot be applied to graph 'bert-large'"),
    ):
        with pytest.raises(BenchmarkError, match=match) as e:
            benchmark_model(g, **kw)
        assert "\n" not in str(e.value) and "build the graph with them" not in str(e.value)


@pytest.fixture(scope="module")
def tuned():
    """The seed's fused BERT-Large (1 layer, batch 8, sequence 64) tuned with the seed's
    names: one schedule survives the in-graph check there and changes the latency."""
    fused = apply_fusion(bert_large(batch=8, seq=64, layers=1), SEED_FUSION)
    cfg = AutotuneConfig(
        method=AutotuneMethod.ML_GUIDED,
        time_budget_seconds=None,
        max_trials=8,
        kernels_to_tune=SEED_NAMES,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _autotune.KernelSkippedWarning)
        return fused, autotune_model(fused, cfg)


def test_autotune_result_holds_the_graph_it_tuned(tuned):
    fused, res = tuned
    assert res.workload is fused
    assert res.spec is not None and res.mismatch(res.spec) is None
    assert res.mismatch(open_device("wia-edge").spec) is not None
    assert res.schedules  # something to apply


def test_benchmark_model_runs_the_tuned_graph_with_its_schedules(tuned):
    fused, res = tuned
    fresh_tuned = wia_hw.run(fused, schedules=res.schedules).latency_ms
    fresh_default = wia_hw.run(fused).latency_ms
    assert fresh_tuned != fresh_default  # the schedules change the run
    # one fresh run: exactly wia_hw.run(graph, schedules=...)'s latency
    assert benchmark_model(res, 8, cfg=ONE_RUN).latency_ms == fresh_tuned
    assert benchmark_model(fused, 8, cfg=ONE_RUN, schedules=res.schedules).latency_ms == (
        fresh_tuned
    )
    assert benchmark_model(fused, 8, cfg=ONE_RUN).latency_ms == fresh_default
    # the default benchmark (a warm-up, 3 runs): the result is its graph with its schedules
    b = benchmark_model(res, 8)
    assert b.latency_ms == benchmark_model(fused, 8, schedules=res.schedules).latency_ms
    assert b.run.provenance["run"]["schedules_used"] == len(res.schedules)


def test_benchmark_model_schedule_file(tuned, tmp_path):
    fused, res = tuned
    path = res.save(tmp_path / "schedules.json")
    assert benchmark_model(fused, 8, cfg=ONE_RUN, schedules=path).latency_ms == (
        wia_hw.run(fused, schedules=res.schedules).latency_ms
    )


def test_benchmark_model_refuses_what_it_cannot_apply(tuned):
    fused, res = tuned
    for call, match in (
        (lambda: benchmark_model(res, 16), r"built at batch 8, not 16"),
        (lambda: benchmark_model(res, 8, schedules={}), r"schedules= was given with an "),
        (
            lambda: benchmark_model(res, 8, device="wia-edge"),
            r"tuned on 'wia-npu' .*not on 'wia-edge'",
        ),
        (
            lambda: benchmark_model(res, 8, ctx=open_device("wia-edge")),
            r"tuned on 'wia-npu'",
        ),
    ):
        with pytest.raises(BenchmarkError, match=match) as e:
            call()
        assert "\n" not in str(e.value)


def test_create_inference_server_serves_the_autotune_result(tuned):
    fused, res = tuned
    cfg = BatchingConfig(max_batch_size=8, max_latency_ms=10.0)
    server = create_inference_server(res, cfg)
    assert server.reference is fused
    assert server.schedules == res.schedules
    assert server.spec == res.spec
    assert server.service_ms(8) == wia_hw.run(fused, schedules=res.schedules).latency_ms
    plain = create_inference_server(fused, cfg)
    assert plain.service_ms(8) == wia_hw.run(fused).latency_ms != server.service_ms(8)
    for kw, match in (
        ({"schedules": res.schedules}, r"schedules= was given with an AutotuneResult"),
        ({"device": "wia-edge"}, r"tuned on 'wia-npu' .*not on 'wia-edge'"),
    ):
        with pytest.raises(ServeError, match=match) as e:
            create_inference_server(res, cfg, **kw)
        assert "\n" not in str(e.value)


# -- 4. the docs' translated section 8.7 runs as written --------------------------------


def _case_study_block() -> str:
    text = (Path(__file__).resolve().parent.parent / "docs" / "OPTIMIZATION.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    hits = [b for b in blocks if "tuned_model = autotune_model(" in b]
    assert len(hits) == 1, "docs/OPTIMIZATION.md has one translated section 8.7"
    return hits[0]


@pytest.mark.slow
def test_docs_section_8_7_runs_as_written(tmp_path, monkeypatch):
    code = _case_study_block()
    for line in (
        "baseline = benchmark_model(bert_large_model, batch_32)",
        "after_fusion = benchmark_model(fused_model, batch_32)",
        "tuned_model = autotune_model(quantized_model, tune_cfg)",
        "after_tuning = benchmark_model(tuned_model, batch_32)",
        "server = create_inference_server(tuned_model, batch_cfg)",
    ):
        assert line in code  # the seed's calls, as the seed makes them
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "example"}
    buf = io.StringIO()
    with warnings.catch_warnings(record=True) as rec, contextlib.redirect_stdout(buf):
        warnings.simplefilter("always")
        exec(compile(code, "OPTIMIZATION.md section 8.7", "exec"), ns)
    msgs = _skipped(rec)
    assert len(msgs) == 1 and "'attention_softmax'" in msgs[0]
    res = ns["tuned_model"]
    assert isinstance(res, AutotuneResult) and res.workload is ns["quantized_model"]
    assert len(res.kernels) == 4
    assert ns["server"].schedules == res.schedules
    assert ns["after_tuning"].run.provenance["run"].get("schedules_used", 0) == len(res.schedules)
    out = buf.getvalue()
    assert "After auto-tuning:" in out and "Goal achieved:" in out
