"""``benchmark_server``: latency percentiles, throughput, batch sizes, queue depth and
rejections of a served workload; the highest Poisson rate meeting a P99 bound."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ._config import REJECT_REASONS, ServeError, ServerWorkload, check_request_count
from ._server import InferenceServer, ServerRun, percentile_ms
from ._trace import Arrival, load_trace, poisson_arrivals

__all__ = ["MaxRateResult", "ServerBenchmarkResult", "benchmark_server", "find_max_rate"]


@dataclass
class MaxRateResult:
    """The highest Poisson rate (requests/s) found to meet ``p99_bound_ms`` with nothing
    rejected (MLPerf Server): ``rate_rps`` (0 when even the lowest rate fails, ``reason``
    says why), the bisection's ``steps`` ``(rate_rps, p99_ms, rejected, passed,
    offered)`` and
    ``capacity_rps``, the rate the search started from (full batches back to back).
    ``search`` says how the rates were chosen (:func:`find_max_rate`)."""

    p99_bound_ms: float
    rate_rps: float
    capacity_rps: float
    steps: list[tuple[float, float, int, bool, int]] = field(default_factory=list)
    reason: str = ""
    search: str = "bisection"

    def to_dict(self) -> dict[str, Any]:
        return {
            "p99_bound_ms": self.p99_bound_ms,
            "rate_rps": self.rate_rps,
            "capacity_rps": self.capacity_rps,
            "steps": [list(s) for s in self.steps],
            "reason": self.reason,
            "search": self.search,
        }


@dataclass
class ServerBenchmarkResult:
    """The seed's ``wia_server_benchmark_result_t`` and more. Latencies in ms, from a
    request's arrival to its batch's completion, over completed requests.

    ``throughput``: completed requests (sequences) per second of emulated time over
    ``duration_ms``: from the start of the arrival window (0 for Poisson arrivals, the
    first arrival of a trace) to its end or the last completion, whichever is later, so
    it never exceeds the offered rate over the arrival window (at 1 req/s one request
    is 1 seq/s, not one over its own service time). ``offered_rate_rps``: requests
    offered per second of the arrival window (NaN, ``None`` in JSON, when all arrivals
    are at one instant). Latency percentiles and ``padding_efficiency_pct`` are NaN
    (``None`` in JSON) when nothing completed. ``batch_size_histogram``: requests per batch -> number
    of batches (real requests, before padding); ``executed_shapes``: padded
    ``(batch, seq)`` -> number of batches; ``shape_latency_ms`` the service time of each.
    ``queue_depth``: ``(time_ms, waiting requests)`` after every change.
    ``rejected_by_reason`` counts rejections by :data:`REJECT_REASONS` key.
    ``padding_efficiency_pct``: real tokens / executed tokens.
    ``offered == completed + rejected`` always holds.
    """

    offered: int
    completed: int
    rejected: int
    rejected_by_reason: dict[str, int]
    p50_latency_ms: float
    p90_latency_ms: float
    p99_latency_ms: float
    mean_latency_ms: float
    max_latency_ms: float
    throughput: float
    offered_rate_rps: float
    duration_ms: float
    batch_size_histogram: dict[int, int]
    executed_shapes: dict[tuple[int, int | None], int]
    shape_latency_ms: dict[tuple[int, int | None], float]
    queue_depth: list[tuple[float, int]]
    max_queue_depth: int
    padding_efficiency_pct: float
    max_rate: MaxRateResult | None = None

    def to_dict(self) -> dict[str, Any]:
        def key(k: tuple[int, int | None]) -> str:
            return f"{k[0]}x{k[1]}" if k[1] is not None else str(k[0])

        d = {k: v for k, v in vars(self).items() if k != "max_rate"}
        d["batch_size_histogram"] = {str(k): v for k, v in self.batch_size_histogram.items()}
        d["executed_shapes"] = {key(k): v for k, v in self.executed_shapes.items()}
        d["shape_latency_ms"] = {key(k): v for k, v in self.shape_latency_ms.items()}
        d["queue_depth"] = [list(x) for x in self.queue_depth]
        d["reject_reasons"] = {k: REJECT_REASONS[k] for k in self.rejected_by_reason}
        d["max_rate"] = self.max_rate.to_dict() if self.max_rate else None
        for k, v in d.items():
            if isinstance(v, float) and math.isnan(v):
                d[k] = None
        return d


def summarize(
    server: InferenceServer, run: ServerRun, window_ns: int, start_ns: int = 0
) -> ServerBenchmarkResult:
    """The figures of one simulation (see :class:`ServerBenchmarkResult`); the arrival
    window is ``[start_ns, start_ns + window_ns]``."""
    lat = run.latency_ns
    hist: dict[int, int] = {}
    shapes: dict[tuple[int, int | None], int] = {}
    for _, n, b, s, _ in run.batches:
        hist[n] = hist.get(n, 0) + 1
        shapes[(b, s)] = shapes.get((b, s), 0) + 1
    span_ns = max(run.last_event_ns, start_ns + window_ns) - start_ns
    return ServerBenchmarkResult(
        offered=run.offered,
        completed=run.completed,
        rejected=run.rejected_total,
        rejected_by_reason=dict(run.rejected),
        p50_latency_ms=percentile_ms(lat, 50),
        p90_latency_ms=percentile_ms(lat, 90),
        p99_latency_ms=percentile_ms(lat, 99),
        mean_latency_ms=sum(lat) / len(lat) / 1e6 if lat else math.nan,
        max_latency_ms=max(lat) / 1e6 if lat else math.nan,
        throughput=run.completed / (span_ns * 1e-9) if span_ns > 0 else 0.0,
        offered_rate_rps=run.offered / (window_ns * 1e-9) if window_ns > 0 else math.nan,
        duration_ms=span_ns / 1e6,
        batch_size_histogram=dict(sorted(hist.items())),
        executed_shapes=dict(sorted(shapes.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0))),
        shape_latency_ms={k: server.shape_timing(*k).latency_ms for k in sorted(shapes, key=str)},
        queue_depth=[(t / 1e6, d) for t, d in run.queue_depth],
        max_queue_depth=max((d for _, d in run.queue_depth), default=0),
        padding_efficiency_pct=100.0 * run.real_tokens / run.padded_tokens
        if run.padded_tokens
        else math.nan,
    )


def _search_duration_s(wl: ServerWorkload, rate: float) -> float:
    return max(wl.duration_s, wl.min_requests / rate)


def _poisson(
    server: InferenceServer, wl: ServerWorkload, rate: float, duration_s: float
) -> list[Arrival]:
    seq = wl.seq if wl.seq is not None else (server.max_seq or 1)
    return poisson_arrivals(rate, duration_s, wl.seed, seq, wl.seq_lengths)


#: The grid a bound below ``max_latency_ms`` is searched on: capacity x k / GRID.
GRID = 20


def find_max_rate(
    server: InferenceServer,
    p99_bound_ms: float,
    *,
    duration_s: float = 1.0,
    seq: int | None = None,
    seed: int = 0,
    tolerance: float = 0.01,
    min_requests: int = 1000,
) -> MaxRateResult:
    """The highest Poisson rate whose run (``max(duration_s, min_requests / rate)``
    seconds of arrivals, ``seed``) meets
    P99 latency <= ``p99_bound_ms`` with no request rejected, by bisection over
    ``(0, capacity]`` until the bracket is within ``tolerance`` of its top (every rate
    uses the same seed, so runs differ by the rate alone). Bisection assumes that a lower
    rate does no worse, which holds when the bound is at least ``max_latency_ms``; a
    tighter bound can fail at low rates (a lone request waits for a fuller batch) and
    pass at high ones (batches fill at once), so then the rates ``capacity x k / 20``
    (k = 19..1) are tried from the top first, and bisection runs between the highest
    that passes and the one above it (``search`` says so). Raises :class:`ServeError`
    on a bound <= 0, and when the run at capacity would offer more than
    :data:`~wia_hw.serve.MAX_REQUESTS` requests (capacity x ``duration_s``)."""
    wl = ServerWorkload(
        duration_s=duration_s,
        seq=seq,
        seed=seed,
        p99_bound_ms=p99_bound_ms,
        rate_tolerance=tolerance,
        min_requests=min_requests,
    )
    check_workload(server, wl)
    cap = server.capacity_rps(wl.seq)
    check_request_count(
        cap,
        duration_s,
        "ServerWorkload.duration_s: the P99 rate search starts at the capacity, ",
        "shorten the duration",
    )
    res = MaxRateResult(p99_bound_ms, 0.0, cap)

    def passes(rate: float) -> bool:
        arr = _poisson(server, wl, rate, _search_duration_s(wl, rate))
        if not arr:  # no request in the window: no evidence that the rate meets the bound
            res.steps.append((rate, math.nan, 0, False, 0))
            return False
        run = server.simulate(arr)
        p99 = percentile_ms(run.latency_ns, 99)
        ok = run.rejected_total == 0 and run.completed > 0 and p99 <= p99_bound_ms
        res.steps.append((rate, p99, run.rejected_total, ok, run.offered))
        rejections[rate] = dict(run.rejected)
        return ok

    rejections: dict[float, dict[str, int]] = {}

    lo, hi = 0.0, cap
    if passes(hi):
        res.rate_rps = hi
        return res
    monotone = p99_bound_ms >= server.config.max_latency_ms
    if not monotone:
        res.search = (
            f"bound below max_latency_ms ({server.config.max_latency_ms:g} ms), so a lower "
            f"rate can do worse: {GRID - 1} rates capacity x k/{GRID} tried from the top, "
            "then bisection above the highest that passed"
        )
        for k in range(GRID - 1, 0, -1):
            rate = cap * k / GRID
            if passes(rate):
                lo = rate
                break
            hi = rate
    # down to 1/1000 of capacity; below that a lone request already misses the bound
    # (under a tight bound with no grid rate passing, the bisection goes on below the
    # grid's lowest rate: rates that low can still pass)
    while hi - lo > tolerance * hi and not (lo == 0.0 and hi < cap * 1e-3):
        mid = (lo + hi) / 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    res.rate_rps = lo
    if lo == 0.0:
        lone = server.service_ms(1, wl.seq)
        wait = server.queue_delay_ns(wl.seq) / 1e6
        tried = (
            f"none of {len(res.steps)} rates tried, from {min(res.steps)[0]:.3g} req/s to capacity,"
        )
        low_rate, low_p99, low_rej = min(res.steps)[:3]
        if low_rej:  # name what failed the lowest rate: rejections, not latency
            why = ", ".join(f"{k} {v}" for k, v in rejections.get(low_rate, {}).items())
            cause = (
                f"at {low_rate:.3g} req/s {low_rej} requests were rejected ({why}); "
                f"P99 {low_p99:.3f} ms"
            )
        else:
            cause = (
                f"a lone request waits {wait:.3f} ms for a fuller batch, then takes "
                f"{lone:.3f} ms after padding"
            )
        res.reason = f"{tried} meets P99 <= {p99_bound_ms:g} ms with nothing rejected ({cause})"
    return res


def check_workload(server: InferenceServer, workload: ServerWorkload) -> None:
    """Refuse sequence options the server's model cannot take: ``seq``/``seq_lengths``
    on a model without a sequence dim, or longer than the model's (every such request
    would be rejected ``seq_too_long``)."""
    name = server.reference.name
    given = [(f, v) for f, v in (("seq", workload.seq), ("seq_lengths", workload.seq_lengths)) if v]
    if server.max_seq is None:
        if given:
            raise ServeError(
                f"ServerWorkload.{given[0][0]}: model {name!r} has no sequence dimension, so "
                "requests have no length"
            )
        return
    for f, v in given:
        longest = max(v) if isinstance(v, tuple) else v
        if longest > server.max_seq:
            raise ServeError(
                f"ServerWorkload.{f}: {longest} tokens is longer than the {server.max_seq} "
                f"the model {name!r} was built for (every such request would be rejected "
                "seq_too_long); build it with a longer seq"
            )


def benchmark_server(server: InferenceServer, workload: ServerWorkload) -> ServerBenchmarkResult:
    """The seed's ``wia_benchmark_server``: offer ``workload`` (:class:`ServerWorkload`) to
    ``server`` and report (:class:`ServerBenchmarkResult`). With ``p99_bound_ms`` the
    highest rate meeting it is searched first (:func:`find_max_rate`, attached as
    ``max_rate``); with ``rate_rps=None`` the reported run is at that rate.

    Raises ``TypeError`` on wrong argument types, :class:`ServeError` on a bad trace
    file (``file:line: ...``) or when no rate meets the bound and none was given."""
    if not isinstance(server, InferenceServer):
        raise TypeError(f"benchmark_server takes an InferenceServer, got {type(server).__name__}")
    if not isinstance(workload, ServerWorkload):
        raise TypeError(f"workload must be a ServerWorkload, got {type(workload).__name__}")
    check_workload(server, workload)
    max_rate = None
    if workload.p99_bound_ms is not None:
        max_rate = find_max_rate(
            server,
            workload.p99_bound_ms,
            duration_s=workload.duration_s,
            seq=workload.seq,
            seed=workload.seed,
            tolerance=workload.rate_tolerance,
            min_requests=workload.min_requests,
        )
    if workload.trace is not None:
        arrivals = load_trace(workload.trace, workload.seq or server.max_seq or 1)
        start_ns = arrivals[0].time_ns
        if server.max_seq is None and any(a.seq != 1 for a in arrivals):
            raise ServeError(
                f"ServerWorkload.trace: {workload.trace} gives sequence lengths, but model "
                f"{server.reference.name!r} has no sequence dimension"
            )
        window_ns = arrivals[-1].time_ns - arrivals[0].time_ns
    else:
        rate = workload.rate_rps
        duration_s = workload.duration_s
        if rate is None:
            assert max_rate is not None  # __post_init__: rate, trace or bound
            if max_rate.rate_rps <= 0:
                raise ServeError(max_rate.reason)
            rate = max_rate.rate_rps
            duration_s = _search_duration_s(workload, rate)
        arrivals = _poisson(server, workload, rate, duration_s)
        window_ns = round(duration_s * 1e9)
        start_ns = 0
    if not arrivals:
        raise ServeError(
            f"the workload offers no request (rate {workload.rate_rps} req/s over "
            f"{workload.duration_s} s)"
        )
    result = summarize(server, server.simulate(arrivals), window_ns, start_ns)
    result.max_rate = max_rate
    return result
