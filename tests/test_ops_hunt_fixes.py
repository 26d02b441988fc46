"""Fixes for an operations bug hunt: serving workloads too large to simulate and
negative seeds, calibration data of the wrong dtype, and a sweep's Ctrl-C (its count of
stored points, and a shutdown that could hang)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw import GraphBuilder, QuantizationConfig, WorkloadError, quantize_model
from wia_hw.cli import cli
from wia_hw.serve import (
    MAX_REQUESTS,
    BatchingConfig,
    ServeError,
    ServerWorkload,
    create_inference_server,
    find_max_rate,
    poisson_arrivals,
)
from wia_hw.sweep import SweepInterrupted, open_store
from wia_hw.workloads import build

SERVE = ["serve", "bert-base", "-s", "32", "-a", "layers=1"]


def _one_line_exit_2(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    return lines[0]


# -- serve: a workload too large to simulate -----------------------------------------


def test_a_huge_rate_is_refused_naming_rate_duration_and_their_product():
    res = CliRunner().invoke(cli, [*SERVE, "--duration", "0.2", "--rate", "1e12"])
    line = _one_line_exit_2(res)
    assert line == (
        "wia-hw: error: --rate x --duration: 1e+12 req/s x 0.2 s = 2e+11 "
        f"expected requests is above the limit of {MAX_REQUESTS:,} one run may offer; "
        "lower the rate or the duration"
    )


def test_a_huge_duration_at_a_normal_rate_is_refused():
    res = CliRunner().invoke(cli, [*SERVE, "--duration", "1e9", "--rate", "10"])
    line = _one_line_exit_2(res)
    assert "--rate x --duration: 10 req/s x 1e+09 s = 1e+10 expected" in line


def test_a_duration_past_the_emulated_clock_is_refused():
    # 1e-9 req/s x 1e10 s is 10 requests, but 1e10 s is past 2^63 ns
    res = CliRunner().invoke(cli, [*SERVE, "--duration", "1e10", "--rate", "1e-9"])
    line = _one_line_exit_2(res)
    assert line.startswith("wia-hw: error: --duration must be below 9.223e+09 s")


def test_the_request_limit_itself_is_accepted_and_one_more_is_not():
    ServerWorkload(rate_rps=float(MAX_REQUESTS), duration_s=1.0)
    ServerWorkload(rate_rps=1e12, duration_s=1.0, trace="t.csv")  # a trace sets the rate
    with pytest.raises(ServeError, match=r"^ServerWorkload.rate_rps x duration_s: "):
        ServerWorkload(rate_rps=float(MAX_REQUESTS + 1), duration_s=1.0)
    with pytest.raises(ServeError, match=r"^ServerWorkload.min_requests: 5,000,001 is above"):
        ServerWorkload(p99_bound_ms=5.0, min_requests=MAX_REQUESTS + 1)
    with pytest.raises(ServeError, match=r"^poisson_arrivals: rate_rps x duration_s: 1e\+12"):
        poisson_arrivals(1e12, 1.0, 0, 16)


def test_a_p99_search_whose_run_at_capacity_is_too_large_is_refused():
    server = create_inference_server("bert-base", BatchingConfig(), seq=32, layers=1)
    cap = server.capacity_rps(32)
    duration_s = 2 * MAX_REQUESTS / cap
    with pytest.raises(ServeError) as e:
        find_max_rate(server, 5.0, duration_s=duration_s)
    msg = str(e.value)
    assert msg.startswith(
        "ServerWorkload.duration_s: the P99 rate search starts at the capacity, "
        f"{cap:g} req/s x {duration_s:g} s = "
    )
    assert msg.endswith("; shorten the duration") and "\n" not in msg


# -- serve: the seed ------------------------------------------------------------------


def test_a_negative_seed_is_one_line():
    res = CliRunner().invoke(cli, [*SERVE, "--duration", "0.2", "--rate", "10", "--seed", "-1"])
    line = _one_line_exit_2(res)
    assert line == "wia-hw: error: --seed must be a non-negative integer, got -1"


@pytest.mark.parametrize("seed", [-1, True, 1.5, "3"])
def test_a_bad_seed_is_refused(seed):
    with pytest.raises(ServeError, match=r"^ServerWorkload.seed must be a non-negative integer"):
        ServerWorkload(rate_rps=10.0, seed=seed)


def test_a_numpy_integer_seed_is_taken_as_an_int():
    wl = ServerWorkload(rate_rps=10.0, seed=np.int64(3))
    assert wl.seed == 3 and type(wl.seed) is int


# -- quantize_model: the dtype of calibration data --------------------------------------


def _bert(**over):
    b = {
        "input_ids": np.arange(16, dtype=np.int64).reshape(1, 16),
        "position_ids": np.arange(16),
        "token_type_ids": np.zeros((1, 16), np.int64),
    }
    b.update(over)
    return b


@pytest.mark.parametrize(
    "value, found",
    [
        (np.array(["a"] * 16).reshape(1, 16), "<U1"),
        (np.zeros((1, 16)), "float64"),
        (np.zeros((1, 16), np.complex64), "complex64"),
        (np.zeros((1, 16), bool), "bool"),
    ],
)
def test_calibration_ids_must_be_integers(value, found):
    g = build("bert-base", batch=1, seq=16, layers=1)
    with pytest.raises(WorkloadError) as e:
        quantize_model(g, QuantizationConfig(), [_bert(), _bert(input_ids=value)])
    assert str(e.value) == (
        f"calibration batch 1: input 'input_ids' has dtype {found}, the graph's int64 "
        "input needs integers (such as token ids)"
    )


def _mlp():
    b = GraphBuilder("mlp", "fp16")
    x = b.input("x", (8, 32))
    b.linear("fc", x, 16)
    return b.graph()


@pytest.mark.parametrize(
    "value, found",
    [
        (np.zeros((8, 32), np.complex128), "complex128"),
        (np.full((8, 32), "1.0"), "<U3"),
        (np.zeros((8, 32), object), "object"),
    ],
)
def test_calibration_data_for_a_float_input_must_be_real_numbers(value, found):
    with pytest.raises(WorkloadError) as e:
        quantize_model(_mlp(), QuantizationConfig(), [value])
    assert str(e.value) == (
        f"calibration batch 0: input 'x' has dtype {found}, the graph's fp16 input needs "
        "real numbers (integer or float, not complex)"
    )


def test_valid_calibration_data_still_quantises():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 32))
    q = quantize_model(
        _mlp(), QuantizationConfig(), [x, x.astype(np.float16), np.ones((8, 32), int)]
    )
    assert any(op.name == "fc" for op in q.ops)
    g = build("bert-base", batch=1, seq=16, layers=1)
    ids = _bert(input_ids=np.arange(16, dtype=np.int32).reshape(1, 16))
    assert quantize_model(g, QuantizationConfig(), [ids]).ops


# -- sweep: Ctrl-C --------------------------------------------------------------------


def _doc(name: str, rows: list[int]) -> dict:
    return {
        "schema_version": 1,
        "name": name,
        "base": "wia-npu",
        "grid": {"compute.array.rows": rows},
        "workloads": {"gemm": {"M": 128, "N": 96, "K": 160}},
        "metrics": ["latency_ms", "energy_j"],
    }


def _interrupt_recording(monkeypatch, nth: int, after_commit: bool) -> None:
    """Ctrl-C while the ``nth`` point is recorded: after its row is committed, or
    before."""
    import wia_hw.sweep._run as run_mod

    real = run_mod._record
    calls = [0]

    def record(*a, **kw):
        calls[0] += 1
        if calls[0] == nth and not after_commit:
            raise KeyboardInterrupt
        real(*a, **kw)
        if calls[0] == nth:
            raise KeyboardInterrupt

    monkeypatch.setattr(run_mod, "_record", record)


@pytest.mark.parametrize("after_commit, n", [(True, 2), (False, 1)])
def test_ctrl_c_counts_the_points_it_committed(tmp_path, monkeypatch, after_commit, n):
    store = tmp_path / "s.sqlite"
    doc = _doc("c", [16, 32, 48])
    _interrupt_recording(monkeypatch, 2, after_commit)
    with pytest.raises(SweepInterrupted) as e:
        wia_hw.sweep(doc, store=store, workers=1)
    assert len(open_store(store).points()) == n
    assert str(e.value).startswith(
        f"interrupted: {n} points computed and stored by this run, {n} of the sweep's 3 points"
    )
    monkeypatch.undo()
    again = wia_hw.sweep(doc, store=store, workers=1)
    assert (again.skipped, again.computed) == (n, 3 - n)


def test_ctrl_c_does_not_count_a_retried_point_it_did_not_commit(tmp_path, monkeypatch):
    store = tmp_path / "s.sqlite"
    doc = _doc("r", [16, 32])
    first = wia_hw.sweep(doc, store=store, workers=1)
    assert first.ok == 2
    with sqlite3.connect(store) as c:  # as if both had failed
        c.execute("UPDATE points SET status = 'failed', error = 'x', metrics = NULL")
    _interrupt_recording(monkeypatch, 2, after_commit=False)
    with pytest.raises(SweepInterrupted, match=r"^interrupted: 1 points computed and stored"):
        wia_hw.sweep(doc, store=store, workers=1, retry_failed=True)


def test_an_interrupted_pool_is_not_shut_down_waiting(tmp_path, monkeypatch):
    """Waiting for the pool's manager thread can hang for good (a Ctrl-C can leave a
    future's lock held, and the thread blocks on it): a stopped pool is shut down
    without waiting."""
    from concurrent.futures import ProcessPoolExecutor

    import wia_hw.sweep._run as run_mod

    calls: list[tuple[bool, bool]] = []

    class Pool(ProcessPoolExecutor):
        def shutdown(self, wait=True, *, cancel_futures=False):
            calls.append((wait, cancel_futures))
            super().shutdown(wait=wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(run_mod, "ProcessPoolExecutor", Pool)

    def progress(done, total):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(SweepInterrupted):
        wia_hw.sweep(
            _doc("p", [16, 32, 48, 64]), store=tmp_path / "p.sqlite", workers=1, progress=progress
        )
    assert calls == [(False, True)]
    calls.clear()
    wia_hw.sweep(_doc("p", [16, 32, 48, 64]), store=tmp_path / "p.sqlite", workers=1)
    assert calls == [(True, False)]  # a sweep that ran to its end waits for its pool


def test_an_interrupt_with_a_future_lock_held_does_not_hang(tmp_path):
    """The hang seen: a Ctrl-C left a future's lock held by the main thread, the pool's
    manager thread blocked on it cancelling that future, and a waiting shutdown joined
    that thread for ever. Here the lock is held on purpose, then released once the
    interrupted generator has returned (so the manager thread can end)."""
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            from concurrent.futures import ProcessPoolExecutor
            import wia_hw.sweep._run as run_mod

            futures = []

            class Pool(ProcessPoolExecutor):
                def submit(self, *a, **kw):
                    f = super().submit(*a, **kw)
                    futures.append(f)
                    return f

            def slow(task):  # a point that takes a while (forked workers find it)
                time.sleep(0.5)
                return {"key": task["key"], "status": "ok", "metrics": {}, "error": None,
                        "wall_s": 0.5, "cpu_s": 0.0}

            run_mod.ProcessPoolExecutor = Pool
            run_mod.evaluate_point = slow
            tasks = [{"key": f"k{i}"} for i in range(6)]
            gen = run_mod._local(tasks, 1)
            next(gen)
            held = [f for f in futures if not f.done()]
            for f in held:
                f._condition.acquire()
            try:
                gen.throw(KeyboardInterrupt)
            except KeyboardInterrupt:
                pass
            for f in held:
                f._condition.release()
            print("returned", len(held))
            """
        )
    )
    try:
        r = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the interrupted sweep hung shutting its pool down")
    assert r.returncode == 0, r.stderr
    held = int(r.stdout.split()[-1])
    if held == 0:
        pytest.skip("every point had finished: no lock to hold")
