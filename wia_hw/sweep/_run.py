"""Running a sweep: points out to an executor, results into the store as they finish.

The parent process is the store's only writer. Points already in the store are skipped
before anything is submitted, so a re-run (after a change of the file, or after the
sweep was killed) computes only what is missing.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._file import Point, Sweep, canonical_json, load_sweep
from ._store import SweepError, SweepStore
from ._worker import evaluate_point, init_worker

__all__ = ["sweep", "SweepSummary", "SweepInterrupted", "CONNECT_TIMEOUT_S"]

#: Seconds to wait for a Dask scheduler before giving up with one line.
CONNECT_TIMEOUT_S = 5.0

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SweepSummary:
    """What one call of :func:`sweep` did. ``points`` = ``skipped`` + ``computed``;
    ``computed`` = ``ok`` + ``failed``; ``filtered``: parameter sets the constraint
    removed before any point was made; ``cpu_s``: the workers' CPU seconds over the
    computed points (``wall_s`` is this call's wall time)."""

    sweep: str
    store: str
    executor: str
    points: int
    skipped: int
    computed: int
    ok: int
    failed: int
    filtered: int
    wall_s: float
    cpu_s: float = 0.0

    @property
    def points_per_min(self) -> float:
        return 60.0 * self.computed / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), points_per_min=self.points_per_min)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a sweep; every point finished before it is stored. ``str()`` is
    one line saying how many."""


def _task(sw: Sweep, p: Point) -> dict[str, Any]:
    return {
        "key": p.key,
        "base": sw.base,
        "params": p.params,
        "workload": p.workload_name,
        "args": p.workload_args,
        "workload_sha256": sw.workload_sha256.get(p.workload_name),
        "metrics": list(p.metrics),
    }


def _sigint_handler() -> Any:
    """This process's SIGINT handler, to put back after :func:`_ignore_sigint`; None
    off the main thread (no signal reaches it there) or when Python did not set it."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.getsignal(signal.SIGINT)


def _ignore_sigint() -> None:
    """Ignore Ctrl-C from now on: an interrupted sweep is shutting down (storing what
    finished, counting it, stopping the workers, closing the store), and a second
    Ctrl-C landing in that would end it with a traceback (or click's ``Aborted!``, or
    a threading error) instead of its one line. :func:`sweep` puts the handler back."""
    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except (ValueError, OSError):  # pragma: no cover -- no signals here
            pass


def _mp_context() -> Any:
    """``fork`` when this process has one thread (workers start at once with wia_hw
    imported, and a script needs no ``if __name__ == "__main__"`` guard); else
    ``forkserver`` with wia_hw preloaded (forking a threaded process is unsafe); else
    ``spawn``."""
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["wia_hw.sweep._worker", "wia_hw.runtime"])
        return ctx
    return mp.get_context("spawn")


def _local(tasks: list[dict[str, Any]], workers: int) -> Iterator[dict[str, Any]]:
    """Results of ``tasks`` on a process pool, as they finish (at most 2 per worker in
    flight, so the parent writes each result while the others compute).

    On Ctrl-C the results already finished are yielded first, then the workers are
    stopped at once (what they were computing is lost, nothing stored is) and the
    KeyboardInterrupt goes on; a further Ctrl-C is ignored until :func:`sweep` has shut
    down. A worker that dies is a :class:`SweepError`.

    Finished futures are announced on a queue by done-callbacks rather than waited for
    with :func:`concurrent.futures.wait`: that holds every pending future's lock while
    it registers and removes its waiter, and a Ctrl-C landing there left a lock held, so
    the pool's manager thread blocked on it for good and a waiting shutdown (or the
    interpreter's exit, which joins that thread) hung. A stopped pool is also shut down
    without waiting for its manager thread: no result is left to wait for."""
    ctx = _mp_context()
    threads = threading.active_count()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=init_worker)
    pending: set[Future[dict[str, Any]]] = set()
    finished: queue.SimpleQueue[Future[dict[str, Any]]] = queue.SimpleQueue()
    it = iter(tasks)
    completed = False
    try:
        while True:
            try:
                while len(pending) < 2 * workers:
                    t = next(it, None)
                    if t is None:
                        break
                    f = pool.submit(evaluate_point, t)
                    pending.add(f)
                    f.add_done_callback(finished.put)
                if not pending:
                    break
                f = finished.get()  # a Ctrl-C here leaves no lock held
                r = f.result()
                pending.discard(f)
            except KeyboardInterrupt:
                _ignore_sigint()  # a second Ctrl-C: the ready results are still stored
                for f in pending:
                    f.cancel()
                ready = [f for f in pending if f.done() and not f.cancelled()]
                pending = set()
                for f in ready:
                    if f.exception() is None:
                        yield f.result()
                raise
            yield r
        completed = True
    except BrokenProcessPool as e:
        why = f" ({str(e).rstrip('.')})" if str(e) else ""
        hint = ""
        if ctx.get_start_method() != "fork":
            hint = (
                f"; the workers were started by {ctx.get_start_method()} (this process had "
                f"{threads} threads), which imports the calling script "
                "again: guard the sweep call with if __name__ == '__main__':"
            )
        raise SweepError(
            f"a local worker process died{why}; the points finished before are stored{hint}"
        ) from None
    finally:
        if completed:
            pool.shutdown(wait=True)
        else:  # Ctrl-C, a dead worker, or the caller closed us: stop the workers now
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
            # the manager thread sees the workers gone and ends by itself; waiting for
            # it could hang (see above), and no result is left to wait for
            pool.shutdown(wait=False, cancel_futures=True)


def _record(st: SweepStore, sw: Sweep, p: Point, r: Mapping[str, Any]) -> None:
    st.record(
        point_key=p.key,
        sweep_name=sw.name,
        params=p.params,
        workload=p.workload,
        metrics=r["metrics"],
        status=r["status"],
        error=r["error"],
        wall_s=r["wall_s"],
    )


def _dask_client(executor: Any) -> tuple[Any, bool, str]:
    """(client, whether we opened it, a name for it)."""
    if not isinstance(executor, str):
        if not (hasattr(executor, "submit") and hasattr(executor, "scheduler_info")):
            raise SweepError(
                f"executor must be 'local', 'dask://HOST:PORT' or a dask.distributed "
                f"Client, got {type(executor).__name__}"
            )
        return executor, False, f"dask client {getattr(executor.scheduler, 'address', '?')}"
    address = "tcp://" + executor[len("dask://") :]
    if len(executor) <= len("dask://") or ":" not in executor[len("dask://") :]:
        raise SweepError(f"scheduler address must read dask://HOST:PORT, got {executor!r}")
    try:
        from distributed import Client
    except ImportError:
        raise SweepError(
            "a Dask executor needs dask.distributed (pip install 'wia-hw[sweep]')"
        ) from None
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except (OSError, TimeoutError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SweepError(
            f"cannot reach the Dask scheduler at {executor} within {CONNECT_TIMEOUT_S:g} s "
            f"({why[:160]})"
        ) from None
    return client, True, executor


def _lost(f: Any, e: BaseException) -> bool:
    """Whether the Dask future ``f``, whose result raised ``e``, was lost to the
    cluster rather than failed by its point: cancelled (the scheduler connection went,
    or someone cancelled it), a worker killed under it (``KilledWorker``), a closed
    connection or a timeout (``OSError``), or a future that did not end in ``error``.
    :func:`evaluate_point` never raises, so a point's own error is a row, not this."""
    from concurrent.futures import CancelledError

    try:
        from distributed import KilledWorker
    except ImportError:  # pragma: no cover -- older dask.distributed
        KilledWorker = ()  # type: ignore[assignment]  # noqa: N806
    if getattr(f, "status", "error") != "error":
        return True
    return isinstance(e, (CancelledError, KilledWorker, OSError, TimeoutError))


def _close_client(client: Any) -> None:
    """Close a Dask client this sweep opened. One that lost its scheduler is still
    trying to reconnect (status ``connecting``): closing it cancels that, which
    dask.distributed logs as an ERROR with a CancelledError traceback saying nothing
    the sweep's one line does not, so its client logger is quiet meanwhile, and a
    failure to close such a client does not hide why the sweep stopped."""
    import logging

    if getattr(client, "status", "running") == "running":
        client.close()
        return
    log = logging.getLogger("distributed.client")
    was = log.disabled
    log.disabled = True
    try:
        client.close()
    except Exception:  # noqa: BLE001 -- no scheduler left to close it with
        pass
    finally:
        log.disabled = was


def _dask(
    tasks: list[dict[str, Any]], client: Any, where: str = "Dask"
) -> Iterator[dict[str, Any]]:
    """Results of ``tasks`` on a Dask cluster, as they finish. A point the cluster
    loses (:func:`_lost`: the scheduler connection gone, a killed worker) is no result
    and is not stored: the sweep stops there with a :class:`SweepError`, the points
    finished before are stored and a re-run computes the rest. An exception the point
    itself raised is a ``failed`` row, and the sweep goes on."""
    from distributed import as_completed

    futures = [
        client.submit(evaluate_point, t, key=f"wia-hw-point-{t['key']}", pure=False) for t in tasks
    ]
    try:
        with client.as_current():  # as_completed finds the client this way
            finished = as_completed(futures)
        for f in finished:
            try:
                r = f.result()
            except Exception as e:  # noqa: BLE001 -- sorted below: lost, or the point's own
                why = str(e).splitlines()[0] if str(e) else ""
                if _lost(f, e):
                    reason = getattr(e, "reason", None)
                    if reason:  # a cancelled future's text starts with its long key
                        why = f"cancelled for reason: {reason}"
                    raise SweepError(
                        f"{where} lost a point ({type(e).__name__}: {why.rstrip('.')}); "
                        "the points finished before are stored, the lost ones are not: "
                        "run the sweep again to compute them"
                    ) from None
                key = f.key.removeprefix("wia-hw-point-") if isinstance(f.key, str) else ""
                r = {
                    "key": key,
                    "status": "failed",
                    "metrics": None,
                    "error": f"{type(e).__name__}: {why}".rstrip(": "),
                    "wall_s": 0.0,
                    "cpu_s": 0.0,
                }
            yield r
    finally:
        try:
            client.cancel([f for f in futures if not f.done()])
        except Exception:  # noqa: BLE001 -- a client without its scheduler: nothing to cancel
            pass


def sweep(
    sweep: Sweep | str | os.PathLike[str] | Mapping[str, Any],
    executor: Any = "local",
    store: str | os.PathLike[str] = "results.sqlite",
    workers: int | None = None,
    *,
    retry_failed: bool = False,
    progress: Progress | None = None,
) -> SweepSummary:
    """Run every point of ``sweep`` not yet in ``store``; write each as it finishes.

    ``sweep`` is a sweep file path, a mapping of the same form or a loaded
    :class:`Sweep`. ``executor`` is ``"local"`` (a process pool of ``workers``
    processes, default: the CPU count), ``"dask://HOST:PORT"`` (a Dask scheduler; the
    connection times out after :data:`CONNECT_TIMEOUT_S` seconds) or a
    ``dask.distributed.Client``. ``store`` is the SQLite file (created when missing).
    Points with a row already (``ok`` or ``failed``; only ``ok`` with
    ``retry_failed=True``) are skipped. ``progress(done, total)`` is called after each
    computed point. Returns a :class:`SweepSummary`.

    Raises :class:`~wia_hw.SpecError` for a bad sweep file and :class:`SweepError` for
    a store that is not a sweep store (or is damaged or locked), a bad executor, an
    unreachable scheduler, or a worker or scheduler lost while the sweep runs (the
    points finished before are stored; nothing is stored for the lost ones). A point
    whose values the spec refuses is stored as ``failed`` and the sweep goes on.
    """
    sw = sweep if isinstance(sweep, Sweep) else load_sweep(sweep)
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise SweepError(f"workers must be a positive integer, got {workers!r}")
    is_local = isinstance(executor, str) and executor == "local"
    if isinstance(executor, str) and not is_local and not executor.startswith("dask://"):
        raise SweepError(f"executor must be 'local' or 'dask://HOST:PORT', got {executor!r}")
    t0 = time.perf_counter()
    points = sw.points()
    by_key = {p.key: p for p in points}
    # the scheduler is reached before the store is touched: an unreachable one leaves
    # no file behind
    client, owned, dask_name = (None, False, "") if is_local else _dask_client(executor)
    try:
        st = SweepStore.create(store)
    except BaseException:
        if owned:
            _close_client(client)
        raise
    sigint = _sigint_handler()  # put back after an interrupted sweep's shutdown
    try:
        done = st.finished_keys(by_key, include_failed=not retry_failed)
        todo = [p for p in points if p.key not in done]
        definition = sw.definition  # hashes the point keys: once
        st.set_meta(
            f"sweep:{sw.name}",
            canonical_json(
                {
                    "file": sw.file,
                    "base": sw.base_name,
                    "base_hash": sw.base_hash,
                    "definition": definition,
                    "sampler": sw.sampler,
                    "parameters": list(sw.parameters),
                    "workloads": [[w, a] for w, a in sw.workloads],
                    **({"workload_sha256": dict(sw.workload_sha256)} if sw.workload_sha256 else {}),
                    "metrics": list(sw.metrics),
                    "points": len(points),
                }
            ),
        )
        st.add_members(sw.name, definition, by_key)
        tasks = [_task(sw, p) for p in todo if p.error is None]
        refused = [  # the constraint could not be evaluated: failed without running
            {"key": p.key, "status": "failed", "metrics": None, "error": p.error, "wall_s": 0.0}
            for p in todo
            if p.error is not None
        ]
        ok = failed = 0
        cpu_s = 0.0
        if not tasks:
            name = "local" if is_local else dask_name
            results: Iterator[dict[str, Any]] = iter(())
        elif is_local:
            n = workers or os.cpu_count() or 1
            name = f"local pool ({min(n, len(tasks))} workers)"
            results = _local(tasks, min(n, len(tasks)))
        else:
            name = dask_name
            results = _dask(tasks, client, f"the Dask executor ({dask_name})")
        # a Ctrl-C can land after a point's row is committed and before it is counted:
        # the point being recorded is counted then if its row is new (a retried failed
        # point has a row already, with an earlier finished_at)
        before = st.finished_at(p.key for p in todo)
        recording: str | None = None
        try:
            for i, r in enumerate(itertools.chain(refused, results), 1):
                recording = r["key"]
                _record(st, sw, by_key[r["key"]], r)
                cpu_s += r.get("cpu_s", 0.0)
                if r["status"] == "ok":
                    ok += 1
                else:
                    failed += 1
                recording = None
                if progress is not None:
                    progress(i, len(todo))
        except KeyboardInterrupt:
            _ignore_sigint()  # until the pool is stopped and the store closed
            computed = ok + failed
            if recording is not None:
                stamp = st.finished_at([recording]).get(recording)
                if stamp is not None and stamp != before.get(recording):
                    computed += 1
            stored = len(st.finished_keys(by_key))
            raise SweepInterrupted(
                f"interrupted: {computed} points computed and stored by this run, "
                f"{stored} of the sweep's {len(points)} points in {store}; run it again "
                "to go on"
            ) from None
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()  # an interrupted sweep: cancel what is queued, stop the pool
    finally:
        try:
            st.close()
            if owned and client is not None:
                _close_client(client)
        finally:
            if sigint is not None and signal.getsignal(signal.SIGINT) is not sigint:
                signal.signal(signal.SIGINT, sigint)
    return SweepSummary(
        sweep=sw.name,
        store=str(Path(store)),
        executor=name,
        points=len(points),
        skipped=len(points) - len(todo),
        computed=ok + failed,
        ok=ok,
        failed=failed,
        filtered=sw.filtered,
        wall_s=time.perf_counter() - t0,
        cpu_s=cpu_s,
    )


def summary_json(s: SweepSummary) -> str:
    return json.dumps(s.to_dict(), sort_keys=True)
