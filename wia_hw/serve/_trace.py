"""Request arrivals: a seeded Poisson process, or a trace file."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._config import MAX_TIME_NS, ServeError, check_request_count

__all__ = ["Arrival", "load_trace", "poisson_arrivals"]


@dataclass(frozen=True)
class Arrival:
    """One request: when it arrives (ns of emulated time from 0) and its tokens."""

    time_ns: int
    seq: int


def load_trace(path: str | os.PathLike[str], default_seq: int) -> list[Arrival]:
    """The requests of a trace file: one per line, ``timestamp_ms`` or
    ``timestamp_ms,seq_len`` (comma or blanks between them); blank lines and lines
    starting with ``#`` are skipped. Timestamps are milliseconds from the start and must
    not decrease (equal ones are a burst); a request without ``seq_len`` has
    ``default_seq`` tokens. Raises :class:`ServeError` ``file:line: ...`` on a
    non-monotonic timestamp, a malformed line, or an empty file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ServeError(f"{p}: cannot read trace file ({e.strerror})") from None
    out: list[Arrival] = []
    prev_ms: float | None = None
    for no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.replace(",", " ").split()
        try:
            if len(parts) not in (1, 2):
                raise ValueError
            t_ms = float(parts[0])
            seq = int(parts[1]) if len(parts) == 2 else default_seq
            if not math.isfinite(t_ms) or t_ms < 0 or seq < 1:
                raise ValueError
        except ValueError:
            raise ServeError(
                f"{p}:{no}: expected 'timestamp_ms[,seq_len]' with timestamp >= 0 and "
                f"seq_len >= 1, got {s!r}"
            ) from None
        if t_ms * 1e6 >= MAX_TIME_NS:  # integer ns of emulated time
            raise ServeError(
                f"{p}:{no}: timestamp {t_ms:g} ms is past the longest emulated time "
                f"({MAX_TIME_NS / 1e6:.4g} ms, 2^63 ns)"
            )
        if prev_ms is not None and t_ms < prev_ms:
            raise ServeError(
                f"{p}:{no}: timestamp {t_ms:g} ms is before the previous one ({prev_ms:g} ms); "
                "timestamps must not decrease"
            )
        prev_ms = t_ms
        out.append(Arrival(round(t_ms * 1e6), seq))
    if not out:
        raise ServeError(f"{p}: trace file has no requests")
    return out


def poisson_arrivals(
    rate_rps: float,
    duration_s: float,
    seed: int,
    seq: int,
    seq_lengths: Sequence[int] | None = None,
) -> list[Arrival]:
    """Arrivals of a Poisson process of ``rate_rps`` per second in ``[0, duration_s)``:
    exponential gaps of mean ``1/rate_rps`` (numpy ``default_rng(seed)``), rounded to
    whole ns; sequence lengths ``seq`` or drawn uniformly from ``seq_lengths``. Raises
    :class:`ServeError` when ``rate_rps x duration_s`` is above
    :data:`~wia_hw.serve.MAX_REQUESTS` (the arrays would not fit in memory)."""
    check_request_count(rate_rps, duration_s, "poisson_arrivals: rate_rps x duration_s: ")
    rng = np.random.default_rng(seed)
    n_guess = int(rate_rps * duration_s + 6 * math.sqrt(rate_rps * duration_s) + 16)
    times_s = np.cumsum(rng.exponential(1.0 / rate_rps, n_guess))
    while times_s[-1] < duration_s:  # rare: draw more
        more = np.cumsum(rng.exponential(1.0 / rate_rps, n_guess)) + times_s[-1]
        times_s = np.concatenate([times_s, more])
    times_s = times_s[times_s < duration_s]
    if seq_lengths:
        seqs = rng.choice(np.asarray(seq_lengths), size=len(times_s))
    else:
        seqs = np.full(len(times_s), seq)
    return [Arrival(round(t * 1e9), int(s)) for t, s in zip(times_s, seqs, strict=True)]
