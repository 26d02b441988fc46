"""The dynamic-batching inference server: a SimPy model of Triton's dynamic batcher in
front of one emulated device.

Time is integer nanoseconds of emulated time. Requests arrive (:mod:`._trace`) into a
FIFO queue bounded at ``max_queue``; one executor takes batches from its head:

* when at least ``max_batch_size`` requests wait, it takes ``max_batch_size`` at once;
* otherwise it waits until the oldest waiting request has waited ``max_queue_delay_ms``
  (or until the queue reaches ``max_batch_size``), then takes all that wait;
* before each decision, requests that have waited longer than ``max_latency_ms`` leave
  the queue rejected (``timeout``); an arrival that finds ``max_queue`` waiting is
  rejected (``queue_full``), one longer than the model's sequence (``seq_too_long``).

A batch of ``n`` requests runs as one executed shape ``(batch, seq)`` after padding
(:class:`PaddingStrategy`); its service time is the emulator's latency of the model at
that shape on a fresh device, timed once per shape and cached, so a long emulated run
costs one emulator run per distinct shape plus the event loop. Every request is
either completed or rejected: ``completed + rejected == offered``.
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from ..emulator.config import DeviceSpec
from ..graph import Graph
from ..optimize._autotune import AutotuneResult
from ..optimize._schedules import AutotuneError
from ..spec import DEFAULT_DEVICE, load_spec
from ._config import BatchingConfig, PaddingStrategy, ServeError
from ._model import ShapeTiming, model_factory, time_shape
from ._trace import Arrival

__all__ = ["InferenceServer", "ServerRun", "create_inference_server"]


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@dataclass
class ServerRun:
    """The raw record of one simulation (times in ns). ``latency_ns`` and ``batch_of``
    are per completed request (in completion order); ``batches`` per executed batch
    ``(dispatch_ns, requests, batch, seq, service_ns)``; ``queue_depth`` the waiting
    requests after each change ``(time_ns, depth)``; ``rejected`` per reason."""

    offered: int
    latency_ns: list[int] = field(default_factory=list)
    batch_of: list[int] = field(default_factory=list)
    batches: list[tuple[int, int, int, int | None, int]] = field(default_factory=list)
    queue_depth: list[tuple[int, int]] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    first_arrival_ns: int = 0
    last_event_ns: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0

    @property
    def completed(self) -> int:
        return len(self.latency_ns)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


class InferenceServer:
    """A model served on an emulated device with dynamic batching (module docstring).
    Made by :func:`create_inference_server`; :func:`wia_hw.serve.benchmark_server`
    offers it a workload."""

    def __init__(
        self,
        factory: Callable[[int, int | None], Graph],
        reference: Graph,
        config: BatchingConfig,
        spec: DeviceSpec,
        seed: int = 0,
        schedules: Mapping[str, Any] | None = None,
        extensions: Sequence[Any] = (),
    ) -> None:
        self.factory = factory
        self.schedules = dict(schedules or {})
        #: device extensions registered on the device every shape is timed on (those of
        #: the context an AutotuneResult was tuned on)
        self.extensions = tuple(extensions)
        self.reference = reference
        self.config = config
        self.spec = spec
        self.seed = seed
        self.max_seq: int | None = reference.params.get("seq")
        self._shapes: dict[tuple[int, int | None], ShapeTiming] = {}
        #: called with what the server starts now when set (progress for long serving
        #: work): ``("shape", text)`` before timing a shape on the emulator, ``("run",
        #: text)`` before a simulated run
        self.on_work: Callable[[str, str], None] | None = None

    def __repr__(self) -> str:
        c = self.config
        return (
            f"InferenceServer({self.reference.name!r} on {self.spec.name}, max_batch_size="
            f"{c.max_batch_size}, max_latency_ms={c.max_latency_ms}, "
            f"padding={c.padding_strategy.value}, max_queue={c.max_queue})"
        )

    # -- shapes ------------------------------------------------------------------------
    def executed_shape(self, requests: int, seq: int | None) -> tuple[int, int | None]:
        """The padded ``(batch, seq)`` a batch of ``requests`` whose longest sequence is
        ``seq`` runs as (:class:`PaddingStrategy`)."""
        c = self.config
        if requests < 1 or requests > c.max_batch_size:
            raise ServeError(f"a batch holds 1..{c.max_batch_size} requests, got {requests}")
        if c.padding_strategy is PaddingStrategy.NONE:
            return requests, seq
        b = min(_round_up(requests, 8), c.max_batch_size)
        if seq is None or self.max_seq is None:
            return b, seq
        if c.padding_strategy is PaddingStrategy.MULTIPLE_OF_8:
            return b, min(_round_up(seq, 8), self.max_seq)
        s = next((x for x in c.seq_buckets if x >= seq), self.max_seq)
        return b, min(s, self.max_seq)

    def shape_timing(self, batch: int, seq: int | None) -> ShapeTiming:
        """The emulator's timing of the model at ``(batch, seq)`` (cached per shape)."""
        key = (batch, seq)
        t = self._shapes.get(key)
        if t is None:
            if self.on_work is not None:
                shape = f"{batch}" if seq is None else f"{batch}x{seq}"
                self.on_work("shape", f"timing batch {shape} ({len(self._shapes)} timed)")
            t = self._shapes[key] = time_shape(
                self.factory(batch, seq), self.spec, self.seed, self.schedules, self.extensions
            )
        return t

    def service_ms(self, requests: int, seq: int | None = None) -> float:
        """Service time of a batch of ``requests`` requests of ``seq`` tokens (default:
        the model's), after padding."""
        seq = self.max_seq if seq is None else seq
        return self.shape_timing(*self.executed_shape(requests, seq)).latency_ms

    @property
    def timed_shapes(self) -> dict[tuple[int, int | None], ShapeTiming]:
        """Every shape timed so far."""
        return dict(self._shapes)

    def capacity_rps(self, seq: int | None = None) -> float:
        """The most requests per second the executor can complete: full batches back to
        back, ``max_batch_size / service time of a full batch``."""
        n = self.config.max_batch_size
        return n / (self.service_ms(n, seq) * 1e-3)

    def queue_delay_ns(self, seq: int | None = None) -> int:
        """How long the batcher waits for a fuller batch (:class:`BatchingConfig`)."""
        c = self.config
        if c.max_queue_delay_ms is not None:
            return round(c.max_queue_delay_ms * 1e6)
        full = self.service_ms(c.max_batch_size, seq)
        return round(max(0.0, c.max_latency_ms - full) * 1e6)

    # -- simulation --------------------------------------------------------------------
    def simulate(self, arrivals: Sequence[Arrival]) -> ServerRun:
        """Serve ``arrivals`` (sorted by time) to the end; returns the raw record."""
        if self.on_work is not None:
            self.on_work("run", f"{len(arrivals):,} requests")
        c = self.config
        env = simpy.Environment()
        out = ServerRun(offered=len(arrivals))
        out.first_arrival_ns = arrivals[0].time_ns if arrivals else 0
        queue: collections.deque[Arrival] = collections.deque()
        max_wait_ns = round(c.max_latency_ms * 1e6)
        delay_ns = self.queue_delay_ns()
        wake: list[Any] = [env.event()]
        rejected: collections.Counter[str] = collections.Counter()

        def depth() -> None:
            out.queue_depth.append((int(env.now), len(queue)))

        def purge() -> None:
            n0 = len(queue)
            while queue and env.now - queue[0].time_ns > max_wait_ns:
                queue.popleft()
                rejected["timeout"] += 1
            if len(queue) != n0:
                depth()

        def arrive() -> Any:
            for a in arrivals:
                if a.time_ns > env.now:
                    yield env.timeout(a.time_ns - env.now)
                purge()
                if self.max_seq is not None and a.seq > self.max_seq:
                    rejected["seq_too_long"] += 1
                    continue
                if len(queue) >= c.max_queue:
                    rejected["queue_full"] += 1
                    continue
                queue.append(a)
                depth()
                if not wake[0].triggered:
                    wake[0].succeed()

        def execute() -> Any:
            while True:
                purge()
                if not queue:
                    if arriving.triggered:  # the arrival process ended
                        return
                    wake[0] = env.event()
                    yield wake[0] | arriving
                    continue
                if len(queue) < c.max_batch_size:
                    due = queue[0].time_ns + delay_ns
                    if env.now < due:
                        wake[0] = env.event()
                        yield wake[0] | env.timeout(due - env.now)
                        continue
                n = min(c.max_batch_size, len(queue))
                batch = [queue.popleft() for _ in range(n)]
                depth()
                longest = max(a.seq for a in batch) if self.max_seq is not None else None
                b, s = self.executed_shape(n, longest)
                service_ns = round(self.shape_timing(b, s).latency_ms * 1e6)
                out.batches.append((int(env.now), n, b, s, service_ns))
                # a model without a sequence dim: a request is one item, whatever its seq
                out.real_tokens += sum(a.seq for a in batch) if s is not None else n
                out.padded_tokens += b * (s or 1)
                yield env.timeout(service_ns)
                for a in batch:
                    out.latency_ns.append(int(env.now) - a.time_ns)
                    out.batch_of.append(n)

        arriving = env.process(arrive())
        env.process(execute())
        env.run()
        out.last_event_ns = int(env.now)
        out.rejected = dict(sorted(rejected.items()))
        if out.completed + out.rejected_total != out.offered:  # an invariant, not input
            raise AssertionError(
                f"server lost requests: {out.completed} completed + "
                f"{out.rejected_total} rejected != {out.offered} offered"
            )
        return out


def create_inference_server(
    model: str | Graph | Callable[[int, int | None], Graph] | AutotuneResult,
    config: BatchingConfig,
    *,
    device: str | os.PathLike[str] | DeviceSpec | None = None,
    seed: int = 0,
    schedules: Mapping[str, Any] | None = None,
    **workload_kwargs: Any,
) -> InferenceServer:
    """The seed's ``wia_create_inference_server``: ``model`` (a workload name built with
    ``workload_kwargs``, e.g. ``seq=128``; a :class:`~wia_hw.Graph`, re-shaped per batch
    as :func:`wia_hw.serve.graph_at` says; a callable ``(batch, seq) -> Graph``; or the
    :class:`~wia_hw.AutotuneResult` of :func:`wia_hw.autotune_model`, the seed's
    ``tuned_model``: its graph served with its schedules and the extensions of the
    context it was tuned on, on the spec it was tuned on unless ``device`` names
    another, which is refused) served on ``device`` (default ``wia-npu``) with dynamic
    batching by ``config``. The model's ``seq`` is the
    longest a request may have. Nothing is timed until a shape is needed.
    ``schedules``: tuned GEMM schedules by kernel key (:func:`wia_hw.optimize.
    autotune_model`), applied to every shape whose kernels they were tuned for (a
    kernel key holds the GEMM's shape, so other batch sizes run the default tilings).

    Raises ``TypeError`` when ``config`` is not a :class:`BatchingConfig`,
    :class:`ServeError` on a bad model, :class:`~wia_hw.SpecError` on a bad device.
    """
    if not isinstance(config, BatchingConfig):
        raise TypeError(f"config must be a BatchingConfig, got {type(config).__name__}")
    extensions: list[Any] = []
    if device is None:
        device = (
            model.spec
            if isinstance(model, AutotuneResult) and model.spec is not None
            else DEFAULT_DEVICE
        )
    spec = device if isinstance(device, DeviceSpec) else load_spec(device)
    if isinstance(model, AutotuneResult):
        if schedules is not None:
            raise ServeError(
                "create_inference_server: schedules= was given with an AutotuneResult, "
                "which carries its own (result.schedules); to serve others, pass "
                "result.workload"
            )
        if model.workload is None:
            raise ServeError(
                "create_inference_server: the AutotuneResult holds no graph (not made by "
                "autotune_model): pass the graph with schedules=result.schedules"
            )
        why = model.mismatch(spec)
        if why is not None:
            raise ServeError(f"create_inference_server: {why}")
        try:  # the tuning context's extensions: every shape is timed with them
            extensions = model.tuning_extensions()
        except AutotuneError as exc:
            raise ServeError(f"create_inference_server: {exc}") from None
        model, schedules = model.workload, model.schedules
    factory, ref = model_factory(model, **workload_kwargs)
    return InferenceServer(factory, ref, config, spec, seed, schedules, extensions)


def percentile_ms(latency_ns: Sequence[int], q: float) -> float:
    """The ``q``-th percentile (linear interpolation, numpy's default) in ms; NaN if empty."""
    if not len(latency_ns):
        return math.nan
    return float(np.percentile(np.asarray(latency_ns, dtype=np.float64), q)) / 1e6
