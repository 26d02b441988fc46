"""The serving configuration: the seed's ``wia_batching_config_t`` (section 8.7 step 4)
and the workload a server is benchmarked with."""

from __future__ import annotations

import enum
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..emulator.errors import WiaError

__all__ = [
    "MAX_REQUESTS",
    "MAX_TIME_NS",
    "BatchingConfig",
    "PaddingStrategy",
    "ServeError",
    "ServerWorkload",
    "REJECT_REASONS",
]

#: Emulated time is integer ns; a timestamp must stay below 2^63 ns (about 292 years).
MAX_TIME_NS = 2**63

#: The most requests one simulated Poisson run may be expected to offer (rate x
#: duration). Drawing and simulating a request takes about 10 us and 400 bytes (bert-base,
#: one layer, on a 2020s laptop core), so a run at the limit takes about a minute and 2 GB
#: of memory; a rate search makes one such run per rate it tries.
MAX_REQUESTS = 5_000_000

#: Why a request can be rejected (the keys of ``ServerBenchmarkResult.rejected_by_reason``).
REJECT_REASONS: dict[str, str] = {
    "queue_full": "the request queue held max_queue requests when it arrived",
    "timeout": "it waited in the queue longer than max_latency_ms (it could not finish "
    "on time; Triton's queue policy with timeout_action REJECT)",
    "seq_too_long": "its sequence is longer than the longest the model was built for",
}


class ServeError(WiaError, ValueError):
    """Bad serving input (a config value, a trace file, a workload). ``str(err)`` is one
    line naming the field, or the file and line."""


def check_request_count(
    rate_rps: float, duration_s: float, what: str, hint: str = "lower the rate or the duration"
) -> None:
    """Raise :class:`ServeError` when a Poisson run of ``rate_rps`` over ``duration_s``
    seconds would be expected to offer more than :data:`MAX_REQUESTS` requests. The
    message starts with ``what`` (the fields at fault) and ends with ``hint``."""
    expected = rate_rps * duration_s
    if expected > MAX_REQUESTS:
        raise ServeError(
            f"{what}{rate_rps:g} req/s x {duration_s:g} s = {expected:.4g} expected requests "
            f"is above the limit of {MAX_REQUESTS:,} one run may offer; {hint}"
        )


class PaddingStrategy(enum.Enum):
    """How a batch's requests are padded to one executed shape ``(batch, seq)``.

    ``NONE``: ``batch`` = requests in the batch, ``seq`` = the longest request's.
    ``MULTIPLE_OF_8`` (the seed's ``WIA_PAD_TO_MULTIPLE_OF_8``, also spelled
    ``PAD_TO_MULTIPLE_OF_8``): both rounded up to a multiple of 8 (``batch`` capped at
    ``max_batch_size``, ``seq`` at the model's length). ``BUCKETS``: ``seq`` rounded up
    to the smallest of ``seq_buckets`` that holds it, ``batch`` to a multiple of 8
    (capped). Padding keeps the number of distinct shapes (each timed once by the
    emulator) small, at the cost of padded work.
    """

    NONE = "none"
    MULTIPLE_OF_8 = "multiple_of_8"
    BUCKETS = "buckets"
    #: the seed's spelling, an alias: ``PAD_TO_MULTIPLE_OF_8 is MULTIPLE_OF_8``
    PAD_TO_MULTIPLE_OF_8 = "multiple_of_8"

    @classmethod
    def _missing_(cls, value: object) -> PaddingStrategy | None:
        if isinstance(value, str):
            v = value.lower().replace("-", "_")
            if v in ("pad_to_multiple_of_8", "wia_pad_to_multiple_of_8"):
                return cls.MULTIPLE_OF_8
            for m in cls:
                if m.value == v:
                    return m
        return None


@dataclass(frozen=True, kw_only=True)
class BatchingConfig:
    """The seed's ``wia_batching_config_t`` with Triton's dynamic-batcher knobs.

    ``max_batch_size``: most requests in one batch (>= 1). ``max_latency_ms``: the
    latency target; a request that has waited longer than this in the queue is rejected
    (reason ``timeout``), so a completed request's latency is at most ``max_latency_ms``
    plus the service time of the batch it ran in. ``padding_strategy``: see
    :class:`PaddingStrategy`; ``seq_buckets`` its buckets (tokens). ``max_queue``: the
    bound of the request queue (requests waiting, not the batch running); an arrival that
    finds it full is rejected (reason ``queue_full``). ``max_queue_delay_ms``: how long
    the batcher waits for more requests once the oldest waiting one arrived (Triton's
    ``max_queue_delay_microseconds``) when fewer than ``max_batch_size`` wait; ``None``
    means ``max(0, max_latency_ms - service time of a full batch)``, the longest wait
    that still lets a full batch finish within the target.

    Raises :class:`ServeError` naming the field and the bad value, and on the
    contradictions ``max_queue_delay_ms > max_latency_ms`` (every request left to wait
    for a fuller batch times out first) and ``max_queue < max_batch_size`` (no batch
    could fill).
    """

    max_batch_size: int = 64
    max_latency_ms: float = 10.0
    padding_strategy: PaddingStrategy | str = PaddingStrategy.MULTIPLE_OF_8
    max_queue: int = 256
    max_queue_delay_ms: float | None = None
    seq_buckets: Sequence[int] = (16, 32, 64, 128, 256, 384, 512)

    def __post_init__(self) -> None:
        def positive_int(name: str) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ServeError(f"BatchingConfig.{name} must be an integer >= 1, got {v!r}")

        positive_int("max_batch_size")
        positive_int("max_queue")
        v = self.max_latency_ms
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ServeError(
                f"BatchingConfig.max_latency_ms must be a finite number > 0, got {v!r}"
            )
        d = self.max_queue_delay_ms
        if d is not None and (
            isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0
        ):
            raise ServeError(f"BatchingConfig.max_queue_delay_ms must be a number >= 0, got {d!r}")
        if d is not None and d > v:
            raise ServeError(
                f"BatchingConfig.max_queue_delay_ms ({d:g}) must not exceed max_latency_ms "
                f"({v:g}): a request waiting for a fuller batch would time out first"
            )
        if self.max_queue < self.max_batch_size:
            raise ServeError(
                f"BatchingConfig.max_queue ({self.max_queue}) must be at least max_batch_size "
                f"({self.max_batch_size}): a batch takes waiting requests, so none could "
                f"hold more than {self.max_queue}"
            )
        try:
            object.__setattr__(self, "padding_strategy", PaddingStrategy(self.padding_strategy))
        except ValueError:
            raise ServeError(
                "BatchingConfig.padding_strategy must be one of "
                f"{', '.join(m.value for m in PaddingStrategy)}, got {self.padding_strategy!r}"
            ) from None
        b = tuple(self.seq_buckets)
        if not b or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in b):
            raise ServeError(
                f"BatchingConfig.seq_buckets must be integers >= 1, got {self.seq_buckets!r}"
            )
        object.__setattr__(self, "seq_buckets", tuple(sorted(set(b))))


@dataclass(frozen=True, kw_only=True)
class ServerWorkload:
    """What :func:`benchmark_server` offers the server.

    Arrivals: a Poisson process of ``rate_rps`` requests per second over ``duration_s``
    seconds of emulated time, seeded by ``seed`` (each request's sequence length is
    ``seq``, or drawn uniformly from ``seq_lengths``; default: the model's), or the
    requests of a ``trace`` file (:func:`load_trace`; rate and duration then come from it).
    ``p99_bound_ms``: also search the highest Poisson rate whose P99 latency meets this
    bound with nothing rejected (MLPerf's Server scenario, by bisection to
    ``rate_tolerance`` relative); with ``rate_rps=None`` the reported run is at that rate.
    Each rate the search tries (and the run at the rate found) lasts
    ``max(duration_s, min_requests / rate)`` seconds, so a P99 rests on at least
    ``min_requests`` samples (MLPerf asks a minimum query count for the same reason); a
    run at a given ``rate_rps`` lasts ``duration_s``.

    Raises :class:`ServeError` naming the field and the bad value; also when
    ``rate_rps x duration_s`` (the expected request count) or ``min_requests`` is above
    :data:`MAX_REQUESTS`, or ``duration_s`` reaches 2^63 ns of emulated time.
    """

    rate_rps: float | None = None
    duration_s: float = 1.0
    seq: int | None = None
    seq_lengths: Sequence[int] | None = None
    trace: str | os.PathLike[str] | None = None
    seed: int = 0
    p99_bound_ms: float | None = None
    rate_tolerance: float = 0.01
    min_requests: int = 1000

    def __post_init__(self) -> None:
        def number(name: str, lo: float, strict: bool) -> None:
            v = getattr(self, name)
            bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            if bad or (v <= lo if strict else v < lo):
                op = ">" if strict else ">="
                raise ServeError(
                    f"ServerWorkload.{name} must be a finite number {op} {lo:g}, got {v!r}"
                )

        if self.rate_rps is not None:
            number("rate_rps", 0, True)
        number("duration_s", 0, True)
        number("rate_tolerance", 0, True)
        if self.p99_bound_ms is not None:
            number("p99_bound_ms", 0, True)
        if self.duration_s * 1e9 >= MAX_TIME_NS:  # integer ns of emulated time
            raise ServeError(
                f"ServerWorkload.duration_s must be below {MAX_TIME_NS / 1e9:.4g} s "
                f"(2^63 ns of emulated time), got {self.duration_s!r}"
            )
        if self.rate_rps is None and self.trace is None and self.p99_bound_ms is None:
            raise ServeError("ServerWorkload needs rate_rps, trace or p99_bound_ms")
        for name in ("seq", "min_requests"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ServeError(f"ServerWorkload.{name} must be an integer >= 1, got {v!r}")
        if self.min_requests > MAX_REQUESTS:
            raise ServeError(
                f"ServerWorkload.min_requests: {self.min_requests:,} is above the limit of "
                f"{MAX_REQUESTS:,} requests one run may offer"
            )
        v = self.seed
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            raise ServeError(f"ServerWorkload.seed must be a non-negative integer, got {v!r}")
        object.__setattr__(self, "seed", int(v))
        if self.rate_rps is not None and self.trace is None:
            check_request_count(
                self.rate_rps, self.duration_s, "ServerWorkload.rate_rps x duration_s: "
            )
        if self.seq_lengths is not None:
            s = tuple(self.seq_lengths)
            if not s or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in s):
                raise ServeError(
                    f"ServerWorkload.seq_lengths must be integers >= 1, got {self.seq_lengths!r}"
                )
            object.__setattr__(self, "seq_lengths", s)
