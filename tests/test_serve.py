"""The dynamic-batching server: conservation, bounded queue, latency bound, batching
rules, padding, trace files, the max-rate search and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from wia_hw.serve import (
    Arrival,
    BatchingConfig,
    PaddingStrategy,
    ServeError,
    ServerWorkload,
    benchmark_server,
    create_inference_server,
    find_max_rate,
    graph_at,
    load_trace,
    poisson_arrivals,
)
from wia_hw.workloads import build


@pytest.fixture(scope="module")
def server():
    """BERT-Large reduced to 4 layers, sequences of up to 128 tokens (cheap shapes)."""
    cfg = BatchingConfig(max_batch_size=16, max_latency_ms=5.0, max_queue=32)
    return create_inference_server("bert-large", cfg, seq=128, layers=4)


def _check_run(srv, run):
    """Invariants every simulation holds."""
    c = srv.config
    assert run.completed + run.rejected_total == run.offered
    assert max(d for _, d in run.queue_depth) <= c.max_queue
    for _, n, b, s, service_ns in run.batches:
        assert 1 <= n <= c.max_batch_size and n <= b <= c.max_batch_size
        assert service_ns == round(srv.shape_timing(b, s).latency_ms * 1e6)


def test_overload_two_times_capacity_for_ten_seconds(server):
    cap = server.capacity_rps()
    wl = ServerWorkload(rate_rps=2 * cap, duration_s=10.0, seed=3)
    arrivals = poisson_arrivals(2 * cap, 10.0, 3, 128)
    run = server.simulate(arrivals)
    _check_run(server, run)
    r = benchmark_server(server, wl)
    assert r.offered == len(arrivals) and r.completed + r.rejected == r.offered
    assert r.completed == run.completed  # same seed, same run
    assert r.max_queue_depth <= server.config.max_queue
    assert r.rejected > 0.4 * r.offered  # half the load cannot be served
    assert set(r.rejected_by_reason) <= {"queue_full", "timeout"}
    # every completed request: waited at most max_latency_ms, then one batch's service
    worst_service_ms = max(server.shape_timing(*k).latency_ms for k in r.executed_shapes)
    assert r.p99_latency_ms <= server.config.max_latency_ms + worst_service_ms
    assert r.max_latency_ms <= server.config.max_latency_ms + worst_service_ms
    # the executor never idles while overloaded: throughput near capacity (full batches)
    assert r.throughput == pytest.approx(cap, rel=0.02)
    assert r.batch_size_histogram[16] >= 0.99 * sum(r.batch_size_histogram.values())


def test_overload_rejects_by_timeout_when_the_queue_is_deep():
    """A queue of 8 batches takes longer than max_latency_ms to drain: the oldest
    requests time out, and the latency bound still holds."""
    cfg = BatchingConfig(max_batch_size=8, max_latency_ms=1.0, max_queue=64)
    srv = create_inference_server("bert-large", cfg, seq=128, layers=2)
    cap = srv.capacity_rps()
    r = benchmark_server(srv, ServerWorkload(rate_rps=2 * cap, duration_s=1.0, seed=1))
    assert r.rejected_by_reason.get("timeout", 0) > 0
    assert r.completed + r.rejected == r.offered
    assert r.max_latency_ms <= 1.0 + srv.service_ms(8)


def test_burst_all_at_once(server, tmp_path):
    """200 requests at the same instant: the queue fills to its bound, the rest is
    rejected, the queue drains in full batches, and nothing is lost."""
    trace = tmp_path / "burst.csv"
    trace.write_text("# burst\n" + "5.0,100\n" * 200 + "\n")
    r = benchmark_server(server, ServerWorkload(trace=trace))
    c = server.config
    assert r.offered == 200 and r.completed + r.rejected == 200
    assert r.max_queue_depth == c.max_queue
    # simultaneous arrivals all reach the queue before the batcher runs
    assert r.rejected_by_reason == {"queue_full": 200 - c.max_queue}
    # the queue drains in full batches of 16 (seq 100 padded to 104)
    assert r.batch_size_histogram == {16: c.max_queue // 16}
    assert set(r.executed_shapes) == {(16, 104)}
    assert r.padding_efficiency_pct == pytest.approx(100 * 100 / 104)


def test_batch_waits_for_queue_delay_then_leaves_partial():
    cfg = BatchingConfig(max_batch_size=8, max_latency_ms=5.0, max_queue_delay_ms=0.5)
    srv = create_inference_server("bert-large", cfg, seq=64, layers=1)
    arrivals = [Arrival(0, 64), Arrival(100_000, 64), Arrival(200_000, 64)]
    run = srv.simulate(arrivals)
    # the oldest waited 0.5 ms: one batch of 3 dispatched at 500_000 ns
    assert [(t, n) for t, n, *_ in run.batches] == [(500_000, 3)]
    service_ns = round(srv.service_ms(3, 64) * 1e6)
    assert run.latency_ns == [500_000 + service_ns - a.time_ns for a in arrivals]


def test_full_batch_leaves_without_waiting():
    cfg = BatchingConfig(max_batch_size=4, max_latency_ms=5.0, max_queue_delay_ms=3.0)
    srv = create_inference_server("bert-large", cfg, seq=64, layers=1)
    run = srv.simulate([Arrival(1000 * i, 64) for i in range(4)])
    assert [(t, n) for t, n, *_ in run.batches] == [(3000, 4)]


def test_default_queue_delay_is_the_slack_of_a_full_batch():
    cfg = BatchingConfig(max_batch_size=8, max_latency_ms=5.0)
    srv = create_inference_server("bert-large", cfg, seq=64, layers=1)
    assert srv.queue_delay_ns() == round((5.0 - srv.service_ms(8)) * 1e6)


def test_padding_strategies():
    mk = lambda p: create_inference_server(  # noqa: E731
        "bert-large", BatchingConfig(max_batch_size=12, padding_strategy=p), seq=200, layers=1
    )
    assert mk("none").executed_shape(5, 37) == (5, 37)
    assert mk("multiple_of_8").executed_shape(5, 37) == (8, 40)
    assert mk("multiple_of_8").executed_shape(11, 199) == (12, 200)  # capped
    assert mk(PaddingStrategy.BUCKETS).executed_shape(5, 37) == (8, 64)
    assert mk("buckets").executed_shape(9, 129) == (12, 200)  # bucket 256 > model's 200


def test_seq_too_long_is_rejected_with_its_reason(server):
    run = server.simulate([Arrival(0, 129), Arrival(0, 128)])
    assert run.rejected == {"seq_too_long": 1} and run.completed == 1


def test_cached_shape_timing_equals_a_run():
    import wia_hw

    srv = create_inference_server("bert-large", BatchingConfig(max_batch_size=8), seq=32, layers=1)
    t = srv.shape_timing(8, 32)
    r = wia_hw.run(build("bert-large", batch=8, seq=32, layers=1))
    assert t.latency_ms == r.latency_ms and t.roofline_floor_ms == r.roofline_floor_ms
    assert srv.shape_timing(8, 32) is t  # cached


def test_graph_at_reapplies_fusion_and_quantisation():
    from wia_hw import FusionConfig, QuantizationConfig, apply_fusion, quantize_model
    from wia_hw.bench._workflow import shrink_vocab

    g = shrink_vocab(build("bert-large", batch=2, seq=16, layers=1))[0]  # cheap calibration
    rng = np.random.default_rng(0)
    data = [
        {
            "input_ids": rng.integers(0, 1024, (2, 16)),
            "position_ids": np.arange(16),
            "token_type_ids": np.zeros((2, 16), np.int64),
        }
    ]
    q = quantize_model(
        apply_fusion(g, FusionConfig()), QuantizationConfig(calibration_batches=1), data
    )
    big = graph_at(q, 8, 32)
    direct = quantize_model(
        apply_fusion(build("bert-large", batch=8, seq=32, layers=1)),
        QuantizationConfig(calibration_batches=1),
        data,
        calibration_graph=g,
    )
    assert [(o.name, o.kind, o.attrs.get("fusion")) for o in big.ops] == [
        (o.name, o.kind, o.attrs.get("fusion")) for o in direct.ops
    ]
    assert big.params["fusion"] == direct.params["fusion"]
    assert graph_at(q, 2, 16) is q


def test_max_rate_search_meets_its_bound(server):
    m = find_max_rate(server, 4.0, duration_s=0.3, seed=0, tolerance=0.02)
    assert 0 < m.rate_rps < m.capacity_rps
    passed = [s for s in m.steps if s[3]]
    assert passed and max(s[0] for s in passed) == m.rate_rps
    assert all(s[1] <= 4.0 and s[2] == 0 for s in passed)
    assert any(not s[3] and s[0] <= m.rate_rps * 1.03 for s in m.steps)  # bracket is tight
    # each P99 rests on about max(rate x 0.3 s, 1000) requests (Poisson: within 5 sd)
    for rate, _, _, _, offered in m.steps:
        mean = max(rate * 0.3, 1000)
        assert abs(offered - mean) < 5 * mean**0.5
    r = benchmark_server(
        server, ServerWorkload(p99_bound_ms=4.0, duration_s=0.3, rate_tolerance=0.02)
    )
    assert r.max_rate.rate_rps == m.rate_rps and r.rejected == 0 and r.p99_latency_ms <= 4.0


def test_max_rate_zero_when_one_request_misses_the_bound(server):
    m = find_max_rate(server, 0.01, duration_s=0.1)
    assert m.rate_rps == 0 and "a lone request waits" in m.reason
    with pytest.raises(ServeError, match=r"none of \d+ rates tried, from .* meets P99 <= 0.01 ms"):
        benchmark_server(server, ServerWorkload(p99_bound_ms=0.01, duration_s=0.1))


def test_poisson_arrivals_are_seeded():
    a = poisson_arrivals(1000.0, 2.0, 7, 128)
    assert a == poisson_arrivals(1000.0, 2.0, 7, 128) != poisson_arrivals(1000.0, 2.0, 8, 128)
    assert all(x.time_ns <= y.time_ns for x, y in zip(a, a[1:], strict=False))
    assert abs(len(a) - 2000) < 4 * 2000**0.5  # Poisson count: mean 2000, sd ~45


# -- bad input -----------------------------------------------------------------------


def test_max_batch_size_zero_is_one_line():
    with pytest.raises(
        ServeError, match=r"^BatchingConfig.max_batch_size must be an integer >= 1, got 0$"
    ):
        BatchingConfig(max_batch_size=0)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"max_queue": 0}, "max_queue must be an integer >= 1, got 0"),
        ({"max_latency_ms": -1.0}, "max_latency_ms must be a finite number > 0, got -1.0"),
        ({"max_queue_delay_ms": -1}, "max_queue_delay_ms must be a number >= 0"),
        ({"padding_strategy": "pow2"}, "padding_strategy must be one of none, multiple_of_8"),
        ({"seq_buckets": ()}, "seq_buckets must be integers >= 1"),
    ],
)
def test_bad_batching_config(kw, msg):
    with pytest.raises(ServeError, match=msg):
        BatchingConfig(**kw)


def test_bad_workload():
    with pytest.raises(ServeError, match="needs rate_rps, trace or p99_bound_ms"):
        ServerWorkload()
    with pytest.raises(ServeError, match="rate_rps must be a finite number > 0, got 0"):
        ServerWorkload(rate_rps=0)
    with pytest.raises(ServeError, match="seq_lengths must be integers >= 1"):
        ServerWorkload(rate_rps=1.0, seq_lengths=[0])


def test_non_monotonic_trace_names_file_and_line(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("# ms,seq\n0.0,16\n1.5,32\n\n1.2,16\n")
    with pytest.raises(
        ServeError, match=r"t\.csv:5: timestamp 1\.2 ms is before the previous one \(1\.5 ms\)"
    ):
        load_trace(p, 128)
    p.write_text("0.0\nabc\n")
    with pytest.raises(ServeError, match=r"t\.csv:2: expected 'timestamp_ms\[,seq_len\]'"):
        load_trace(p, 128)
    p.write_text("# nothing\n")
    with pytest.raises(ServeError, match="trace file has no requests"):
        load_trace(p, 128)


def test_trace_reads_times_and_lengths(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("0 16\n0.25\n0.25,64\n")
    assert load_trace(p, 128) == [Arrival(0, 16), Arrival(250_000, 128), Arrival(250_000, 64)]


def test_graph_not_from_a_builder_cannot_be_reshaped():
    from wia_hw import GraphBuilder

    b = GraphBuilder("mine", "fp16")
    b.linear("fc", b.input("x", (4, 64)), 64)
    srv = create_inference_server(b.graph(), BatchingConfig(max_batch_size=8))
    with pytest.raises(ServeError, match="was not built by a workload builder"):
        srv.service_ms(8)
    with pytest.raises(TypeError, match="config must be a BatchingConfig"):
        create_inference_server("bert-large", {"max_batch_size": 8})


def test_cli_serve(tmp_path):
    import json

    from click.testing import CliRunner

    from wia_hw.cli import cli

    args = ["serve", "bert-large", "-a", "layers=2", "-s", "128", "--max-batch-size", "16"]
    res = CliRunner().invoke(cli, [*args, "--rate", "2000", "--duration", "0.2", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["completed"] + d["rejected"] == d["offered"] > 0
    res = CliRunner().invoke(cli, [*args, "--rate", "2000", "--duration", "0.2"])
    assert "P99 latency:" in res.output and "seq/sec (completed requests" in res.output
    trace = tmp_path / "t.csv"
    trace.write_text("0\n2\n1\n")
    res = CliRunner().invoke(cli, [*args, "--trace", str(trace)])
    assert res.exit_code == 2 and res.output.strip().endswith("timestamps must not decrease")
    assert f"{trace}:3:" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(cli, ["serve", "bert-large", "--max-batch-size", "0", "--rate", "1"])
    assert res.exit_code == 2
    assert res.output.strip() == ("wia-hw: error: --max-batch-size must be an integer >= 1, got 0")


def test_an_onnx_model_is_imported_again_for_every_batch_size():
    """A served .onnx file with symbolic dims runs each executed batch size from its own
    import (MACs scale with the batch); one whose batch dim is fixed says so."""
    pytest.importorskip("onnx")
    from pathlib import Path

    from wia_hw.workloads import from_onnx

    data = Path(__file__).parent / "data" / "onnx"
    ref = build(str(data / "bert_large_2l.legacy.onnx"), batch=1, seq=32)
    g4 = graph_at(ref, 4, 32)
    assert g4.macs() == 4 * ref.macs() and g4.params["dims"]["seq"] == 32
    assert graph_at(ref, 2, 16).macs() < 2 * ref.macs()  # shorter sequences too
    fixed = from_onnx(data / "quant" / "resnet18.qdq_s8_pc.onnx")
    with pytest.raises(
        ServeError,
        match=r"^resnet18.qdq_s8_pc.onnx: batch 8: no input has a free leading dim \(input 'x' is "
        r"\[1, 3, 224, 224\]: the file fixes its batch\)",
    ):
        graph_at(fixed, 8, None)
    cfg = BatchingConfig(max_batch_size=4, max_latency_ms=2.0)
    srv = create_inference_server(str(data / "resnet18.legacy.onnx"), cfg)
    r = benchmark_server(srv, ServerWorkload(rate_rps=2000, duration_s=0.02, seed=1))
    assert r.completed > 0 and max(r.batch_size_histogram) > 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "bert-base"], "serve needs --rate, --trace or --p99-bound"),
        (["serve", "bert-base", "--rate", "inf"], "--rate must be a finite number > 0, got inf"),
        (["serve", "bert-base", "--rate", "5", "--duration", "-1"], "--duration must be a finite"),
        (["serve", "bert-base", "--rate", "5", "--max-batch-size", "0"], "--max-batch-size must"),
        (["serve", "bert-base", "--rate", "5", "--seed", "-2"], "--seed must be a non-negative"),
        (["bench", "gemm", "-n", "0"], "-n/--iterations must be at least 1, got 0"),
        (["bench", "gemm", "--warmup", "-1"], "--warmup must be at least 0, got -1"),
    ],
)
def test_cli_config_errors_name_the_options_typed(args, message):
    """The command line's errors name its options, not the API fields they fill
    (``bench -n 0`` said "BenchmarkConfig.measurement_iterations must be at least 1")."""
    from click.testing import CliRunner

    from wia_hw.cli import cli

    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.output
    assert "Config" not in lines[0] and "ServerWorkload" not in lines[0]
