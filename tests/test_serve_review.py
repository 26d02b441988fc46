"""Serving fixes from review: decoder models, workload validation, degenerate figures,
the max-rate search under any bound, contradictory configs, trace overflow."""

from __future__ import annotations

import numpy as np
import pytest

from wia_hw.serve import (
    BatchingConfig,
    ServeError,
    ServerWorkload,
    benchmark_server,
    create_inference_server,
    graph_at,
)
from wia_hw.workloads import build


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_decoder_model_is_served(seed):
    """GPT-2 (prefill) re-shapes to every executed (batch, seq): the prefill records
    kv_len=0, which must not reach the builder again."""
    rng = np.random.default_rng(seed)
    g = build("gpt2", seq=64, layers=1)
    b, s = int(rng.integers(1, 9)), int(rng.integers(1, 65))
    g2 = graph_at(g, b, s)
    assert (g2.params["batch"], g2.params["seq"], g2.params["phase"]) == (b, s, "prefill")
    srv = create_inference_server(
        "gpt2", BatchingConfig(max_batch_size=8, max_latency_ms=20.0), seq=64, layers=1
    )
    lengths = [int(x) for x in rng.integers(1, 65, 4)]
    r = benchmark_server(
        srv, ServerWorkload(rate_rps=200.0, duration_s=0.1, seed=seed, seq_lengths=lengths)
    )
    assert r.completed + r.rejected == r.offered > 0
    assert r.completed > 0 and all(s <= 64 for _, s in r.executed_shapes)


@pytest.fixture(scope="module")
def bert2():
    cfg = BatchingConfig(max_batch_size=16, max_latency_ms=5.0)
    return create_inference_server("bert-large", cfg, seq=128, layers=2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_max_rate_search_under_a_bound_below_max_latency(bert2, seed):
    """A bound below max_latency_ms fails at low rates (a lone request waits for a fuller
    batch) and passes at high ones: the search must not report 'no rate' when a rate
    meets the bound, and the rate it reports meets it."""
    from wia_hw.serve import find_max_rate

    rng = np.random.default_rng(seed)
    bound = float(rng.uniform(3.9, 4.8))
    m = find_max_rate(bert2, bound, duration_s=0.3, seed=seed)
    check = benchmark_server(bert2, ServerWorkload(rate_rps=0.93 * m.capacity_rps, seed=seed))
    if check.rejected == 0 and check.p99_latency_ms <= bound:
        assert m.rate_rps > 0, m.reason
    passed = [s for s in m.steps if s[3]]
    assert passed and m.rate_rps == max(s[0] for s in passed)
    assert all(s[1] <= bound and s[2] == 0 for s in passed)
    assert "max_latency_ms" in m.search and "no rate down to" not in m.reason


def test_max_rate_search_goes_below_the_grid_when_no_grid_rate_passes():
    """Under a tight bound only low rates pass (a short queue delay keeps batches small);
    the search found none of its capacity x k/20 rates and stopped, reporting 0 where
    about 150 req/s meets the bound."""
    from wia_hw import BatchingConfig, create_inference_server
    from wia_hw.serve import find_max_rate

    server = create_inference_server(
        "bert-large",
        BatchingConfig(max_batch_size=16, max_latency_ms=5.0, max_queue_delay_ms=0.5),
        seq=128,
        layers=2,
    )
    m = find_max_rate(server, 1.1, duration_s=0.5)
    assert 0 < m.rate_rps < m.capacity_rps / 20, m.reason
    passed = [s for s in m.steps if s[3]]
    assert m.rate_rps == max(s[0] for s in passed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_workload_longer_than_the_model_is_refused_naming_the_field(bert2, seed):
    rng = np.random.default_rng(seed)
    too_long = int(rng.integers(129, 1000))
    for wl in (
        ServerWorkload(rate_rps=100.0, seq=too_long),
        ServerWorkload(p99_bound_ms=10.0, seq=too_long),
        ServerWorkload(rate_rps=100.0, seq_lengths=[16, too_long]),
    ):
        with pytest.raises(
            ServeError, match=rf"^ServerWorkload\.seq(_lengths)?: {too_long} tokens"
        ):
            benchmark_server(bert2, wl)


def test_the_max_rate_reason_names_rejections_when_they_failed_it():
    from wia_hw.serve import find_max_rate

    cfg = BatchingConfig(max_batch_size=16, max_latency_ms=0.3, max_queue_delay_ms=0)
    srv = create_inference_server("bert-large", cfg, seq=128, layers=2)
    m = find_max_rate(srv, 50.0, duration_s=0.2)
    assert m.rate_rps == 0 and "rejected (timeout" in m.reason
    assert "a lone request waits" not in m.reason


@pytest.fixture(scope="module")
def resnet():
    return create_inference_server(
        "resnet50", BatchingConfig(max_batch_size=16, max_latency_ms=50.0)
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_seq_options_are_refused_for_a_model_without_a_sequence(resnet, seed, tmp_path):
    rng = np.random.default_rng(seed)
    lengths = [int(x) for x in rng.integers(1, 6000, 3)]
    with pytest.raises(ServeError, match="ServerWorkload.seq_lengths: model .* no sequence"):
        benchmark_server(resnet, ServerWorkload(rate_rps=100.0, seq_lengths=lengths))
    with pytest.raises(ServeError, match="ServerWorkload.seq: model .* no sequence"):
        benchmark_server(resnet, ServerWorkload(rate_rps=100.0, seq=lengths[0]))
    trace = tmp_path / "t.csv"
    trace.write_text("".join(f"{i * 0.5},{n}\n" for i, n in enumerate(lengths)))
    with pytest.raises(ServeError, match="gives sequence lengths"):
        benchmark_server(resnet, ServerWorkload(trace=trace))
    r = benchmark_server(resnet, ServerWorkload(rate_rps=float(rng.uniform(50, 400)), seed=seed))
    assert 0 < r.padding_efficiency_pct <= 100.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_padding_efficiency_is_at_most_100_percent(bert2, seed):
    rng = np.random.default_rng(seed)
    lengths = [int(x) for x in rng.integers(1, 129, 5)]
    r = benchmark_server(
        bert2,
        ServerWorkload(
            rate_rps=float(rng.uniform(100, 8000)), duration_s=0.1, seed=seed, seq_lengths=lengths
        ),
    )
    assert 0 < r.padding_efficiency_pct <= 100.0


@pytest.mark.parametrize("t_ms", ["1e308", "9.3e12", "1e400"])
def test_a_huge_trace_timestamp_is_one_line(t_ms, tmp_path):
    from wia_hw.serve import load_trace

    p = tmp_path / "t.csv"
    p.write_text(f"0,16\n{t_ms},16\n")
    with pytest.raises(ServeError, match=r"t\.csv:2: "):
        load_trace(p, 128)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_contradictory_batching_configs_are_refused(seed):
    rng = np.random.default_rng(seed)
    mb = int(rng.integers(2, 64))
    lat = float(rng.uniform(1, 20))
    with pytest.raises(ServeError, match=r"^BatchingConfig\.max_queue_delay_ms .* must not exceed"):
        BatchingConfig(max_batch_size=mb, max_latency_ms=lat, max_queue_delay_ms=lat * 1.5)
    with pytest.raises(ServeError, match=r"^BatchingConfig\.max_queue \(\d+\) must be at least"):
        BatchingConfig(max_batch_size=mb, max_queue=int(rng.integers(1, mb)))
    BatchingConfig(max_batch_size=mb, max_latency_ms=lat, max_queue_delay_ms=lat, max_queue=mb)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_throughput_never_exceeds_the_offered_load_over_the_window(bert2, seed):
    """Throughput counts completions over the arrival window (or to the last
    completion): at low load it is at most what was offered, never one request over its
    own service time (1 req/s reported 225.9 seq/s)."""
    rng = np.random.default_rng(seed)
    rate, dur = float(rng.uniform(0.5, 50)), float(rng.uniform(0.2, 2.0))
    r = benchmark_server(bert2, ServerWorkload(rate_rps=rate, duration_s=dur, seed=seed))
    if r.offered:
        assert r.throughput <= r.offered / dur * (1 + 1e-9)
        assert r.throughput == pytest.approx(r.completed / (r.duration_ms / 1e3))
        assert r.duration_ms >= round(dur * 1e9) / 1e6


def test_cli_low_load_prints_n_a_not_nan(tmp_path):
    from click.testing import CliRunner

    from wia_hw.cli import cli

    args = ["serve", "bert-large", "-a", "layers=2", "-s", "128", "--max-batch-size", "16"]
    one = tmp_path / "one.csv"
    one.write_text("5\n")
    res = CliRunner().invoke(cli, [*args, "--trace", str(one)])
    assert res.exit_code == 0 and "nan" not in res.output
    assert "Offered 1 (n/a: every arrival at one instant)" in res.output
    rej = tmp_path / "rej.csv"  # longer than the model's 128 tokens: all rejected
    rej.write_text("0,200\n0.1,300\n")
    res = CliRunner().invoke(cli, [*args, "--trace", str(rej)])
    assert res.exit_code == 0 and "nan" not in res.output
    assert "P50 latency: n/a (no request completed)" in res.output
    assert "padding efficiency n/a (no batch ran)" in res.output
    assert "wia-hw: warning: no request completed: all 2 were rejected (seq_too_long 2)" in (
        res.output
    )


def test_cli_max_queue_follows_a_large_max_batch_size():
    """--max-queue defaults to 256 or --max-batch-size when larger: a batch limit of 512
    alone ran before the queue had to hold a full batch, and must still."""
    from click.testing import CliRunner

    from wia_hw.cli import cli

    args = ["serve", "bert-base", "-s", "32", "-a", "layers=1", "--rate", "500"]
    res = CliRunner().invoke(cli, [*args, "--max-batch-size", "512", "--duration", "0.05"])
    assert res.exit_code == 0, res.output
    assert "of 512; padding" in res.output
    res = CliRunner().invoke(cli, [*args, "--max-batch-size", "512", "--max-queue", "300"])
    assert res.exit_code == 2 and "--max-queue (300) must be at least --max-batch-size (512)" in (
        res.output
    )
