"""One training iteration on a cluster: the schedule and its result (issue #11).

:func:`train_iteration` times the kernels of one step (:mod:`._backward`) on the
cluster's device and plays the step on the communicator's SimPy environment, all ranks
at once. Rank ``r`` is replica ``r // tp``, tensor-parallel rank ``r % tp``: a TP group
is ``tp`` consecutive ranks (inside a node of a hierarchical cluster when ``tp``
divides its node size), a DP group the ranks of one TP index across the replicas.

* **Forward**: the kernels in order; after a row-parallel linear every TP group
  all-reduces its ``[B, S, H]`` output and the next kernel waits for it.
* **Backward**: the gradient kernels in reverse layer order; the input gradient of a
  column-parallel linear is all-reduced in its TP group before the next kernel.
  Parameters fill DDP buckets in the order their gradients complete (the first bucket
  ``first_bucket_mb``, the next ``bucket_mb`` each, in MiB as PyTorch's
  ``bucket_cap_mb``; a bucket closes once it reaches its cap). With ``overlap`` each
  bucket is all-reduced (async, in every DP group) as soon as its last gradient is
  computed, one bucket at a time in order (NCCL's one communication stream), while
  the backward kernels go on; without it, all buckets are all-reduced after the
  backward pass.
* **Optimizer**: after the last bucket arrived, the optimizer kernels.

Before any kernel is timed the step's memory per device (:mod:`._memory`: weights,
gradients, optimizer state, saved activations, the largest kernel's workspace) is
checked against the device's: a step that does not fit is refused, naming the largest
per-replica batch that would.

Compute is booked on every rank with :meth:`Communicator.compute`, collectives run
on the link model, so ``start_comm_profiling(comm)`` around the call profiles the step.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..comm import ALGORITHMS, AUTO, CommError, Communicator, open_cluster
from ..emulator.errors import WorkloadError
from ..emulator.power import ThermalModel, ThermalWarning
from ..graph import Graph
from ..profiling._comm import interval_union, overlap_cycles
from ._backward import Kern, TrainingKernels, kernel_energy_j, time_kernels, training_kernels
from ._memory import GIB, TrainingMemory, training_memory
from ._parallel import shard_graph

__all__ = [
    "TrainingResult",
    "TrainingThermalWarning",
    "Bucket",
    "train_iteration",
    "DEFAULT_BUCKET_MB",
    "FIRST_BUCKET_MB",
]

#: PyTorch DDP's defaults: ``bucket_cap_mb=25`` and a first bucket of 1 MiB.
DEFAULT_BUCKET_MB = 25.0
FIRST_BUCKET_MB = 1.0


@dataclass(frozen=True)
class Bucket:
    """A DDP gradient bucket: its parameters (in gradient order) and bytes."""

    index: int
    params: tuple[str, ...]
    nbytes: int


class TrainingThermalWarning(ThermalWarning):
    """Sustained training at the iteration's power would hold the die above its
    throttle point (:attr:`TrainingResult.would_throttle`). The training step's
    :class:`~wia_hw.emulator.power.ThermalWarning` (filtering that one filters this
    too): its kernels are timed alone, from the spec's initial temperature, so it is
    judged on the step's sustained power (``ambient + P x R``), not on a run's peak."""


@dataclass
class TrainingResult:
    """One training iteration. Times in ms of device time (the cluster's clock).

    ``iteration_ms`` from the first forward kernel to the optimizer's end;
    ``forward_ms``/``backward_ms``/``optimizer_ms`` the compute of each phase (one
    rank; all ranks compute alike); ``exposed_comm_ms`` = iteration - compute, the
    communication nothing hides; ``comm_ms`` the union of all communication;
    ``overlap_efficiency`` Holistic Trace Analysis' (compute during communication /
    communication, over all ranks, as :func:`wia_hw.stop_comm_profiling` gives it).
    ``collective_bytes``/``sent_bytes``: per label (``dp.all_reduce``,
    ``tp.all_reduce.forward``, ``tp.all_reduce.backward``) the sizes the collectives
    were called with (nccl-tests' convention) and what their schedules sent, summed
    over every call and group. ``grad_bytes`` the gradient bytes one DP group
    all-reduces per iteration (= ``param_bytes``, one rank's parameters, when
    ``dp > 1``). ``memory``: what one device holds at the step's peak (weights,
    gradients, optimizer state, saved activations, workspace) and its capacity."""

    workload: str
    cluster: str
    dp: int
    tp: int
    batch: int | None
    seq: int | None
    overlap: bool
    bucket_mb: float
    optimizer: str
    clock_ghz: float
    start_cycle: int
    end_cycle: int
    forward_cycles: int
    backward_cycles: int
    optimizer_cycles: int
    comm_cycles: int
    overlap_cycles: int
    param_bytes: int
    grad_bytes: int
    buckets: list[Bucket]
    collective_bytes: dict[str, int]
    sent_bytes: dict[str, int]
    collective_calls: dict[str, int]
    #: per label, the algorithms its calls ran (in first-use order)
    collective_algorithms: dict[str, tuple[str, ...]]
    kernels: TrainingKernels = field(repr=False)
    comm: Communicator = field(repr=False)
    records: list[Any] = field(default_factory=list, repr=False)
    #: a device's mean power over the iteration (its kernels' energy, static power
    #: while it waits) and the die temperature that power holds it at when sustained
    #: (``ambient + P x R``); ``throttle_c``: the spec's throttle point
    mean_power_w: float = 0.0
    sustained_temperature_c: float = 0.0
    throttle_c: float = 0.0
    memory: TrainingMemory | None = None
    _rerun: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def would_throttle(self) -> bool:
        """Whether sustained training at this power would hold the die above its
        throttle point: the iteration time assumes an unthrottled clock (each kernel is
        timed alone from the spec's initial temperature), so it is then optimistic."""
        return self.sustained_temperature_c >= self.throttle_c

    def _ms(self, cycles: int) -> float:
        return cycles / (self.clock_ghz * 1e6)

    @property
    def iteration_cycles(self) -> int:
        return self.end_cycle - self.start_cycle

    @property
    def iteration_ms(self) -> float:
        return self._ms(self.iteration_cycles)

    @property
    def forward_ms(self) -> float:
        return self._ms(self.forward_cycles)

    @property
    def backward_ms(self) -> float:
        return self._ms(self.backward_cycles)

    @property
    def optimizer_ms(self) -> float:
        return self._ms(self.optimizer_cycles)

    @property
    def compute_cycles(self) -> int:
        return self.forward_cycles + self.backward_cycles + self.optimizer_cycles

    @property
    def exposed_comm_ms(self) -> float:
        return self._ms(self.iteration_cycles - self.compute_cycles)

    @property
    def comm_ms(self) -> float:
        return self._ms(self.comm_cycles)

    @property
    def overlap_efficiency(self) -> float:
        return self.overlap_cycles / self.comm_cycles if self.comm_cycles else 0.0

    @property
    def throughput(self) -> float:
        """Samples per second over the whole cluster (``batch`` per replica)."""
        b = self.batch or 1
        return b * self.dp / (self.iteration_ms * 1e-3) if self.iteration_ms else 0.0

    def breakdown(self) -> dict[str, float]:
        """Iteration time by phase (ms): forward, backward, optimizer, exposed comm."""
        return {
            "forward": self.forward_ms,
            "backward": self.backward_ms,
            "optimizer": self.optimizer_ms,
            "exposed_communication": self.exposed_comm_ms,
        }

    def summary(self) -> str:
        lines = [
            f"Training iteration: {self.workload} on {self.cluster} "
            f"(dp={self.dp}, tp={self.tp}, batch {self.batch} per replica, seq {self.seq}, "
            f"{self.optimizer}, {'overlapped' if self.overlap else 'not overlapped'})",
            f"  Iteration time: {self.iteration_ms:.3f} ms ({self.throughput:.1f} samples/s)",
        ]
        for k, v in self.breakdown().items():
            lines.append(
                f"  {k.replace('_', ' ').capitalize()}: {v:.3f} ms "
                f"({100 * v / self.iteration_ms:.1f}%)"
            )
        lines += [
            f"  Communication: {self.comm_ms:.3f} ms, overlap efficiency "
            f"{100 * self.overlap_efficiency:.1f}%",
            f"  Gradient buckets: {len(self.buckets)} "
            f"({self.grad_bytes / 2**20:.1f} MiB per replica)",
        ]
        if self.memory is not None:
            lines.append(f"  Memory: {self.memory.line()}")
        deg = "\N{DEGREE SIGN}C"
        lines.append(
            f"  Power: {self.mean_power_w:.1f} W per device; "
            + (
                f"unthrottled, the die would settle at {self.sustained_temperature_c:.1f} "
                f"{deg}, above its throttle point ({self.throttle_c:g} {deg}): a throttling "
                "clock would make each step slower than shown"
                if self.would_throttle
                else f"the die settles at {self.sustained_temperature_c:.1f} {deg} (throttle "
                f"at {self.throttle_c:g} {deg})"
            )
        )
        for k in sorted(self.collective_bytes):
            algos = self.collective_algorithms.get(k, ())
            lines.append(
                f"  {k}: {self.collective_calls[k]} calls, "
                f"{self.collective_bytes[k] / 2**20:.1f} MiB"
                + (f" ({', '.join(algos)})" if algos else "")
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "wia-hw.train/1",
            "workload": self.workload,
            "cluster": self.cluster,
            "dp": self.dp,
            "tp": self.tp,
            "batch": self.batch,
            "seq": self.seq,
            "overlap": self.overlap,
            "bucket_mb": self.bucket_mb,
            "optimizer": self.optimizer,
            "iteration_ms": self.iteration_ms,
            "breakdown_ms": self.breakdown(),
            "comm_ms": self.comm_ms,
            "overlap_efficiency": self.overlap_efficiency,
            "throughput": self.throughput,
            "param_bytes": self.param_bytes,
            "grad_bytes": self.grad_bytes,
            "buckets": [{"params": len(b.params), "nbytes": b.nbytes} for b in self.buckets],
            "collective_bytes": dict(self.collective_bytes),
            "sent_bytes": dict(self.sent_bytes),
            "collective_calls": dict(self.collective_calls),
            "collective_algorithms": {k: list(v) for k, v in self.collective_algorithms.items()},
            "mean_power_w": self.mean_power_w,
            "sustained_temperature_c": self.sustained_temperature_c,
            "throttle_c": self.throttle_c,
            "memory": self.memory.to_dict() if self.memory is not None else None,
        }

    def rerun(self, **changes: Any) -> TrainingResult:
        """The same iteration again on a fresh copy of the cluster, with ``changes``
        to :func:`train_iteration`'s arguments (``overlap=True``, ``bucket_mb=...``)."""
        return train_iteration(**dict(self._rerun, **changes))

    def communication_recommendations(self, cfg: Any = None) -> Any:
        """The profiler's recommendations for this iteration (``analyze_performance``
        of a TrainingResult): see :func:`wia_hw.train.recommend_communication`."""
        from ._recommend import recommend_communication

        return recommend_communication(self, cfg)


def _buckets(order: list[tuple[str, int]], bucket_mb: float, first_mb: float) -> list[Bucket]:
    out: list[Bucket] = []
    cur: list[str] = []
    size = 0
    cap = int(first_mb * 2**20)
    for name, nbytes in order:
        cur.append(name)
        size += nbytes
        if size >= cap:
            out.append(Bucket(len(out), tuple(cur), size))
            cur, size, cap = [], 0, int(bucket_mb * 2**20)
    if cur:
        out.append(Bucket(len(out), tuple(cur), size))
    return out


#: What a graph built for inference computes, by its ``phase`` (GPT-2's).
_INFERENCE_PHASES = {
    "prefill": "logits for the last token only",
    "decode": "one decode step over a KV cache",
}


def _training_kwargs(workload: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for a builder with a ``phase`` (GPT-2): ``phase="train"`` unless
    given, the forward pass with every position's logits (a causal-LM loss reads all
    of them; the inference prefill keeps the last token's only)."""
    if not isinstance(workload, str) or "phase" in kwargs:
        return kwargs
    from ..workloads import WORKLOADS, _norm

    fn = next((f for k, f in WORKLOADS.items() if _norm(k) == _norm(workload)), None)
    if fn is not None and "phase" in inspect.signature(fn).parameters:
        return dict(kwargs, phase="train")
    return kwargs


def _largest_batch(batch: int, mem: TrainingMemory, memory_at: Any) -> int:
    """The largest batch below ``batch`` (where the step needs ``mem``) whose step
    fits (0: none), by ``memory_at(b)`` (the step's memory at batch ``b``). Activations
    and workspace are about linear in the batch (``c + p b``): each guess is where the
    line through the two closest measured batches meets the capacity, kept inside
    the bracket (a bisection when it falls outside), so it takes few builds."""
    lo, hi = 0, batch  # the step fits at lo (0: nothing to fit), not at hi
    var = {batch: mem.activations + mem.workspace}
    room = mem.capacity - mem.fixed
    guess = room * batch // var[batch]
    while hi - lo > 1:
        b = guess if lo < guess < hi else (lo + hi) // 2
        m = memory_at(b)
        var[b] = m.activations + m.workspace
        if m.fits:
            lo = b
        else:
            hi = b
        a, c = (lo, hi) if lo else (hi, batch)
        slope = (var[c] - var[a]) / (c - a) if c != a else 0
        guess = a + math.floor((room - var[a]) / slope) if slope > 0 else 0
    return lo


def _positive(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise WorkloadError(f"train_iteration: {name} must be a positive integer, got {v!r}")
    return v


def train_iteration(
    workload: str | os.PathLike[str] | Graph = "bert-large",
    *,
    cluster: Any = "wia-cluster-8",
    dp: int | None = None,
    tp: int = 1,
    batch: int | None = None,
    seq: int | None = None,
    bucket_mb: float = DEFAULT_BUCKET_MB,
    first_bucket_mb: float = FIRST_BUCKET_MB,
    overlap: bool = True,
    optimizer: str = "adam",
    algorithm: str | None = None,
    **workload_kwargs: Any,
) -> TrainingResult:
    """Run one training iteration of ``workload`` on ``cluster``; see the module doc.

    ``workload``: a builder name (``bert-large``, ...), an ``.onnx`` path or a Graph
    (built with the per-replica ``batch``; ``batch``/``seq`` go to the builder).
    ``cluster``: a cluster spec (name, path, mapping, ClusterSpec) or an open
    :class:`~wia_hw.Communicator` (the iteration starts once every rank has finished
    the compute booked on it before, and counts only its own compute and collectives;
    a profiling session on it sees the step). ``dp`` defaults to ``devices // tp``;
    ``dp * tp`` must be the cluster's device count. ``algorithm``: the DP all-reduce's
    (default ``auto``: per bucket size, the one that ends first alone on idle links;
    the tensor-parallel all-reduces always choose so). A builder with a ``phase``
    (GPT-2) is built with ``phase="train"``: every position's logits, as a causal-LM
    loss needs. Raises :class:`~wia_hw.WorkloadError` (one line) for a bad degree,
    a TP degree that does not divide the heads, bad bucket sizes or optimizer, a graph
    built for inference (GPT-2's prefill or decode phase), and a step whose memory
    per device (:attr:`TrainingResult.memory`) exceeds the device's."""
    from ..runtime import resolve_workload

    comm = cluster if isinstance(cluster, Communicator) else open_cluster(cluster)
    n = comm.size
    tp = _positive("tp", tp)
    if dp is None:
        if n % tp:
            raise WorkloadError(
                f"train_iteration: tp={tp} does not divide the {n} devices of {comm.spec.name}"
            )
        dp = n // tp
    dp = _positive("dp", dp)
    if dp * tp > n:
        raise WorkloadError(
            f"train_iteration: dp x tp = {dp} x {tp} = {dp * tp} devices, {comm.spec.name} has {n}"
        )
    if dp * tp != n:
        raise WorkloadError(
            f"train_iteration: dp x tp = {dp} x {tp} = {dp * tp} leaves "
            f"{n - dp * tp} of the {n} devices of {comm.spec.name} idle "
            "(dp x tp must equal the device count)"
        )
    for nm, v in (("bucket_mb", bucket_mb), ("first_bucket_mb", first_bucket_mb)):
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not v > 0
            or not math.isfinite(v)
        ):
            raise WorkloadError(
                f"train_iteration: {nm} must be a positive finite number, got {v!r}"
            )
    if not isinstance(overlap, bool):
        raise WorkloadError(f"train_iteration: overlap must be a bool, got {overlap!r}")
    known = (AUTO, *ALGORITHMS["all_reduce"])
    if algorithm is not None and algorithm not in known:
        raise WorkloadError(
            f"train_iteration: unknown algorithm {algorithm!r} for the DP all-reduce "
            f"(known: {', '.join(known)})"
        )
    if (
        algorithm == "hierarchical"
        and dp > 1
        and (comm.topology.devices_per_node is None or tp > 1)
    ):
        raise WorkloadError(
            "train_iteration: the hierarchical all-reduce needs each DP group to be the "
            f"whole of a hierarchical cluster (dp={dp}, tp={tp} on {comm.spec.name}, "
            f"{comm.topology.kind}); use tp=1 on a hierarchical cluster or another algorithm"
        )
    workload_kwargs = _training_kwargs(workload, workload_kwargs)
    graph = resolve_workload(workload, batch=batch, seq=seq, **workload_kwargs)
    phase = graph.params.get("phase")
    if phase in _INFERENCE_PHASES:
        raise WorkloadError(
            f"train_iteration: graph {graph.name!r} is built for inference (phase={phase!r}: "
            f"{_INFERENCE_PHASES[phase]}); a training step's loss reads every position's "
            "logits: build it with phase='train'"
        )
    cap = comm.device.memory.hbm.size_bytes

    def memory_at(b: int | None) -> tuple[TrainingMemory, TrainingKernels]:
        g = graph if b is None else resolve_workload(workload, batch=b, seq=seq, **workload_kwargs)
        rank_graph, tpf, tpb = shard_graph(g, tp)
        k = training_kernels(rank_graph, optimizer=optimizer, tp_forward=tpf, tp_backward=tpb)
        return training_memory(k, cap), k

    mem, tk = memory_at(None)
    if not mem.fits:
        raise WorkloadError(
            _does_not_fit(graph, mem, comm.device.name, dp, tp, optimizer, workload, memory_at)
        )
    cyc = time_kernels(comm.device, tk.forward + tk.backward + tk.optimizer)
    order = [(t.name, t.nbytes) for t in tk.params]
    buckets = _buckets(order, bucket_mb, first_bucket_mb) if dp > 1 else []
    bucket_of = {p: b.index for b in buckets for p in b.params}
    left = [len(b.params) for b in buckets]
    tp_groups = [list(range(d * tp, (d + 1) * tp)) for d in range(dp)]
    dp_groups = [[d * tp + t for d in range(dp)] for t in range(tp)]

    env = comm.env
    # the step starts once every rank has finished the compute booked before it, and
    # counts only its own compute and collectives (earlier work still on the links
    # may slow it, but is not its communication)
    start = max(comm.now_cycles, comm.busy_until())
    own_compute: list[Any] = []
    labelled: list[tuple[str, Any]] = []
    ready = [env.event() for _ in buckets]
    phase_cycles = {"forward": 0, "backward": 0, "optimizer": 0}

    def collective(label: str, nbytes: int, groups: list[list[int]], algo: str | None) -> Any:
        if algo in (None, AUTO) and len(groups) > 1:  # the groups share links: chosen
            algo = comm.choose_all_reduce(groups, nbytes)  # as they run, together
        works = []
        for g in groups:
            try:
                works.append(comm.all_reduce(nbytes=nbytes, ranks=g, async_op=True, algorithm=algo))
            except CommError as e:
                raise WorkloadError(f"train_iteration: {e}") from None
        for w in works:
            w.event.callbacks.append(lambda ev, lb=label: labelled.append((lb, ev.value)))
        return env.all_of([w.event for w in works])

    def ddp_stream() -> Any:
        for b in buckets:
            yield ready[b.index]
            yield collective("dp.all_reduce", b.nbytes, dp_groups, algorithm)

    def compute(cycles: int, label: str) -> Any:
        phase_cycles[label] += cycles
        k = len(comm.compute_records)
        work = comm.compute(None, cycles, label=label, async_op=True)
        own_compute.extend(comm.compute_records[k:])
        return work.event

    def phase(kerns: list[Kern], label: str) -> Any:
        acc = 0
        for k in kerns:
            acc += cyc[k.signature]
            done = [bucket_of[p] for p in k.params if p in bucket_of]
            for b in done:
                left[b] -= 1
            fire = [b for b in done if not left[b]]
            if (fire and overlap) or k.tp_all_reduce_bytes:
                if acc:
                    yield compute(acc, label)
                    acc = 0
                for b in fire:
                    ready[b].succeed()
                if k.tp_all_reduce_bytes:
                    lb = f"tp.all_reduce.{label}"
                    yield collective(lb, k.tp_all_reduce_bytes, tp_groups, None)
            # without overlap, completed buckets are released after the backward pass
        if acc:
            yield compute(acc, label)

    def step() -> Any:
        if start > env.now:
            yield env.timeout(start - env.now)
        stream = env.process(ddp_stream()) if buckets else None
        yield from phase(tk.forward, "forward")
        yield from phase(tk.backward, "backward")
        for e in ready:
            if not e.triggered:
                e.succeed()
        if stream is not None:
            yield stream
        yield from phase(tk.optimizer, "optimizer")

    proc = env.process(step())
    while not proc.processed:
        env.step()
    end = comm.now_cycles
    recs = [r for _, r in labelled]
    comp = own_compute
    comm_u = interval_union((r.start_cycle, r.end_cycle) for r in recs)
    comp_u = interval_union((c.start_cycle, c.end_cycle) for c in comp)
    coll_bytes: dict[str, int] = {}
    sent: dict[str, int] = {}
    calls: dict[str, int] = {}
    algos: dict[str, dict[str, None]] = {}
    for lb, r in labelled:
        algos.setdefault(lb, {})[r.algorithm] = None
        coll_bytes[lb] = coll_bytes.get(lb, 0) + r.nbytes
        sent[lb] = sent.get(lb, 0) + r.sent_bytes
        calls[lb] = calls.get(lb, 0) + 1
    spec = comm.device
    iter_s = (end - start) / (comm.clock_ghz * 1e9)
    busy_s = sum(phase_cycles.values()) / (comm.clock_ghz * 1e9)
    energy = kernel_energy_j(spec, tk.forward + tk.backward + tk.optimizer)
    power = (energy + spec.static_power_w * max(0.0, iter_s - busy_s)) / iter_s if iter_s else 0.0
    th = spec.thermal
    sustained = ThermalModel(th).steady_state_c(power)
    if sustained >= th.throttle_c:  # as ThermalModel.throttling
        warnings.warn(
            f"train_iteration: {power:.1f} W per device would hold {spec.name}'s die at "
            f"{sustained:.1f} \N{DEGREE SIGN}C when sustained, above its throttle point "
            f"({th.throttle_c:g} \N{DEGREE SIGN}C); the iteration time assumes an "
            "unthrottled clock (kernels timed alone from the initial temperature), so a "
            "throttling device trains slower than shown",
            TrainingThermalWarning,
            stacklevel=2,
        )
    return TrainingResult(
        workload=graph.name,
        cluster=comm.spec.name,
        dp=dp,
        tp=tp,
        batch=graph.params.get("batch", batch),
        seq=graph.params.get("seq", seq),
        overlap=overlap,
        bucket_mb=float(bucket_mb),
        optimizer=optimizer,
        clock_ghz=comm.clock_ghz,
        start_cycle=start,
        end_cycle=end,
        forward_cycles=phase_cycles["forward"],
        backward_cycles=phase_cycles["backward"],
        optimizer_cycles=phase_cycles["optimizer"],
        comm_cycles=sum(b - a for a, b in comm_u),
        overlap_cycles=overlap_cycles(comm_u, comp_u),
        param_bytes=tk.param_bytes,
        grad_bytes=sum(b.nbytes for b in buckets),
        buckets=buckets,
        collective_bytes=coll_bytes,
        sent_bytes=sent,
        collective_calls=calls,
        collective_algorithms={k: tuple(v) for k, v in algos.items()},
        kernels=tk,
        comm=comm,
        records=recs,
        mean_power_w=power,
        sustained_temperature_c=sustained,
        throttle_c=th.throttle_c,
        memory=mem,
        _rerun=dict(
            workload=graph,
            cluster=comm.spec,
            dp=dp,
            tp=tp,
            bucket_mb=bucket_mb,
            first_bucket_mb=first_bucket_mb,
            optimizer=optimizer,
            algorithm=algorithm,
        ),
    )


def _does_not_fit(
    graph: Graph,
    mem: TrainingMemory,
    device: str,
    dp: int,
    tp: int,
    optimizer: str,
    workload: Any,
    memory_at: Any,
) -> str:
    """The one-line refusal of a step that does not fit: its memory, the device's, and
    the largest per-replica batch that would fit (rebuilt and checked when the
    workload is a builder name or a file; estimated from the batch's share of the
    memory for a Graph)."""
    batch, seq = graph.params.get("batch"), graph.params.get("seq")
    what = (
        f"a training step of {graph.name!r} ("
        + (f"batch {batch} per replica, " if batch is not None else "")
        + (f"seq {seq}, " if seq is not None else "")
        + f"dp={dp}, tp={tp}, {optimizer})"
    )
    head = f"train_iteration: {what} does not fit device memory ({device}): it needs {mem.line()}"
    if mem.fixed >= mem.capacity:
        return (
            f"{head}; the weights, gradients and optimizer state alone take "
            f"{mem.fixed / GIB:.2f} GiB, so no batch fits (split the layers over more "
            "devices with a larger tp, or train a smaller model)"
        )
    if not isinstance(batch, int):  # a graph without a batch: nothing to suggest
        return f"{head}; its activations and workspace must shrink"
    if batch < 2:
        return f"{head}; no batch fits (the activations of one sample do not)"
    why = "activations grow with the batch; weights, gradients and optimizer state do not"
    if isinstance(workload, Graph):
        est = (mem.capacity - mem.fixed) * batch // (mem.activations + mem.workspace)
        if est < 1:
            return f"{head}; no batch fits (the activations of one sample do not)"
        return (
            f"{head}; about batch {min(est, batch - 1)} per replica would fit ({why}: "
            "build the graph with it)"
        )
    try:
        best = _largest_batch(batch, mem, lambda b: memory_at(b)[0])
    except WorkloadError:  # a model whose batch is fixed
        return f"{head}; its batch cannot be changed"
    if best < 1:
        return f"{head}; no batch fits (the activations of one sample do not at this seq)"
    return f"{head}; the largest batch that fits is {best} per replica ({why})"
