"""Sweep store and sweep CLI robustness: a Dask cluster that loses points, read-only
readers of a store a sweep is writing (or was killed writing), damaged and locked
stores, the progress bar off a terminal, a report of a sweep run again with fewer
points, and a second Ctrl-C while an interrupted sweep shuts down. Random inputs use
fixed seeds."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import signal
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import wia_hw
import wia_hw.cli._sweep as sweep_cli
import wia_hw.sweep._run as run_mod
import wia_hw.sweep._store as store_mod
from wia_hw.cli import cli
from wia_hw.sweep import SweepError, SweepInterrupted, SweepStore, load_sweep, open_store
from wia_hw.sweep._worker import evaluate_point

GEMM = {"gemm": {"M": 128, "N": 96, "K": 160}}


def _doc(name: str, rows: list[int], bws: list[int] | None = None) -> dict:
    grid: dict[str, list[int]] = {"compute.array.rows": rows}
    if bws:
        grid["memory.hbm.bandwidth_gbs"] = bws
    return {
        "schema_version": 1,
        "name": name,
        "base": "wia-npu",
        "grid": grid,
        "workloads": GEMM,
        "metrics": ["latency_ms", "energy_j"],
    }


def _one_line_exit_2(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    return lines[0]


def _rows(store: Path) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(store)) as c:
        return c.execute("SELECT point_key, status FROM points").fetchall()


@pytest.fixture(autouse=True)
def _keep_sigint():
    """The sweep CLI ignores SIGINT on its way out after a Ctrl-C (the process ends
    there); under CliRunner the test process goes on, so its handler is put back."""
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


# -- 1: a Dask cluster that loses points ----------------------------------------------


class _Future:
    def __init__(self, key: str, result=None, exc: BaseException | None = None, status="finished"):
        self.key, self._result, self._exc, self.status = key, result, exc, status

    def result(self):
        if self._exc is not None:
            raise self._exc
        return self._result

    def done(self) -> bool:
        return True


class _Client:
    """Stands for a dask.distributed Client: the first ``good`` points run at once (the
    same evaluate_point as a worker runs), the rest come back as ``lose(key)`` says."""

    scheduler = SimpleNamespace(address="tcp://fake:8786")

    def __init__(self, good: int, lose=None):
        self.good, self.lose, self.submitted, self.cancelled = good, lose, 0, []

    def scheduler_info(self) -> dict:
        return {}

    def submit(self, fn, task, key, pure):
        self.submitted += 1
        if self.submitted <= self.good or self.lose is None:
            return _Future(key, fn(task))
        exc, status = self.lose(key)
        return _Future(key, exc=exc, status=status)

    @contextlib.contextmanager
    def as_current(self):
        yield self

    def cancel(self, futures) -> None:
        self.cancelled.extend(futures)


def _cancelled(key):
    from distributed.client import FutureCancelledError

    return FutureCancelledError(key, "scheduler-connection-lost"), "cancelled"


def _comm_closed(key):
    from distributed.comm.core import CommClosedError

    return CommClosedError("in <TCP (closed) ConnectionPool.gather>: Stream is closed"), "finished"


def _killed(key):
    from distributed import KilledWorker

    return KilledWorker(key, SimpleNamespace(address="tcp://10.0.0.2:4000"), 3), "error"


@pytest.mark.parametrize("lose", [_cancelled, _comm_closed, _killed])
@pytest.mark.parametrize("seed", [0, 1])
def test_points_a_dask_cluster_loses_are_not_stored_and_a_rerun_computes_them(
    tmp_path, monkeypatch, lose, seed
):
    """A lost scheduler connection (every unfinished future cancelled), a closed
    connection or a killed worker was stored as a ``failed`` point, which a re-run
    skipped, and the run ended as a success."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(distributed, "as_completed", lambda fs: iter(list(fs)))
    rnd = random.Random(seed)
    rows = sorted(rnd.sample([8, 16, 24, 32, 48, 64, 96, 128], 5))
    good = rnd.randint(1, 3)
    store = tmp_path / "d.sqlite"
    client = _Client(good, lose)
    with pytest.raises(SweepError) as e:
        wia_hw.sweep(_doc("d", rows), executor=client, store=store)
    msg = str(e.value)
    assert "\n" not in msg and "lost a point" in msg and "run the sweep again" in msg
    assert "dask client tcp://fake:8786" in msg
    got = _rows(store)
    assert len(got) == good and {s for _, s in got} == {"ok"}  # nothing stored for them
    again = wia_hw.sweep(_doc("d", rows), executor=_Client(len(rows)), store=store)
    assert (again.skipped, again.computed, again.ok, again.failed) == (good, 5 - good, 5 - good, 0)
    assert len(_rows(store)) == 5


def test_the_dask_cli_ends_with_one_line_and_a_nonzero_status(tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(distributed, "as_completed", lambda fs: iter(list(fs)))
    monkeypatch.setattr(run_mod, "_dask_client", lambda ex: (_Client(1, _cancelled), True, ex))
    monkeypatch.setattr(_Client, "close", lambda self: None, raising=False)
    (tmp_path / "s.yaml").write_text(json.dumps(_doc("d", [16, 32, 48])))
    store = tmp_path / "d.sqlite"
    res = CliRunner().invoke(
        cli, ["sweep", str(tmp_path / "s.yaml"), "--scheduler", "h:1", "--store", str(store)]
    )
    line = _one_line_exit_2(res)
    assert line.startswith("wia-hw: error: the Dask executor (dask://h:1) lost a point (")
    assert "FutureCancelledError: cancelled for reason: scheduler-connection-lost" in line
    assert len(_rows(store)) == 1


def test_closing_a_client_that_lost_its_scheduler_is_quiet(caplog):
    """Closing a client still trying to reconnect cancels that, which dask.distributed
    logged as an ERROR with a CancelledError traceback under the sweep's one line."""
    import logging

    class Lost:
        status = "connecting"

        def close(self):
            logging.getLogger("distributed.client").error("reconnect cancelled\nTraceback")
            raise OSError("no scheduler")

    with caplog.at_level(logging.DEBUG):
        run_mod._close_client(Lost())
    assert not [r for r in caplog.records if r.name == "distributed.client"]
    assert not logging.getLogger("distributed.client").disabled  # only while closing

    class Running:
        status, closed = "running", 0

        def close(self):
            self.closed += 1

    c = Running()
    run_mod._close_client(c)
    assert c.closed == 1


def test_a_point_that_raises_on_dask_is_still_a_failed_row(tmp_path, monkeypatch):
    """The point's own exception (not the cluster's) stays a ``failed`` row and the
    sweep goes on."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(distributed, "as_completed", lambda fs: iter(list(fs)))
    client = _Client(2, lambda key: (RuntimeError("the model broke\nmore"), "error"))
    store = tmp_path / "d.sqlite"
    s = wia_hw.sweep(_doc("d", [16, 32, 48, 64]), executor=client, store=store)
    assert (s.computed, s.ok, s.failed) == (4, 2, 2)
    with contextlib.closing(sqlite3.connect(store)) as c:
        errors = {r[0] for r in c.execute("SELECT error FROM points WHERE status = 'failed'")}
    assert errors == {"RuntimeError: the model broke"}


# -- 2: read-only readers of a store in use, or left by a killed sweep ----------------


def _not_writable(monkeypatch) -> None:
    """What a user without write permission gets (this runs as any user)."""
    real = store_mod.os.access
    monkeypatch.setattr(
        store_mod.os, "access", lambda p, mode, **k: mode != store_mod.os.W_OK and real(p, mode)
    )


def _record(st: SweepStore, i: int) -> None:
    st.record(
        point_key=f"k{i:04d}",
        sweep_name="w",
        params={"compute.array.rows": 8 * (i + 1)},
        workload="gemm(K=1, M=1, N=1)",
        metrics={"latency_ms": float(i)},
        status="ok",
        error=None,
        wall_s=0.0,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_read_only_reader_sees_the_rows_in_the_wal(tmp_path, monkeypatch, seed):
    """A store a sweep is writing holds its newest rows (a new store: its tables too)
    in the -wal file; the read-only open (immutable) ignored it: 'not a sweep store'
    for a valid store, or silently fewer rows."""
    n = random.Random(seed).randint(3, 40)
    path = tmp_path / "w.sqlite"
    writer = SweepStore.create(path)  # stays open: nothing is checkpointed into the file
    try:
        for i in range(n):
            _record(writer, i)
        assert Path(f"{path}-wal").stat().st_size > 0
        # a sweep killed now leaves the file and its -wal: a copy of both is that store
        killed = tmp_path / "k.sqlite"
        for suffix in ("", "-wal"):
            shutil.copy(f"{path}{suffix}", f"{killed}{suffix}")
        _not_writable(monkeypatch)
        for p in (path, killed):
            st = open_store(p)
            try:
                assert len(st.points()) == n and st.meta["format"] == "wia-hw-sweep/1"
            finally:
                st.close()
        res = CliRunner().invoke(cli, ["sweep-report", str(killed)])
        assert res.exit_code == 0 and f"{n} points ({n} ok, 0 failed)" in res.output
    finally:
        writer.close()


def test_a_wal_store_that_cannot_be_read_without_write_access_says_so(tmp_path, monkeypatch):
    """Where SQLite cannot make the -shm file it needs to read the -wal (a folder the
    user cannot write), one line says so and names the files, rather than a partial
    store."""
    path = tmp_path / "w.sqlite"
    writer = SweepStore.create(path)
    try:
        _record(writer, 0)
        _not_writable(monkeypatch)
        real = sqlite3.connect

        def connect(database, *a, **k):
            if k.get("uri") and "immutable" not in str(database):
                raise sqlite3.OperationalError("unable to open database file")
            return real(database, *a, **k)

        monkeypatch.setattr(store_mod.sqlite3, "connect", connect)
        with pytest.raises(SweepError) as e:
            open_store(path)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{path}: cannot read the store without write")
        assert "w.sqlite-wal" in msg and "w.sqlite-shm" in msg and str(tmp_path) in msg
    finally:
        writer.close()


# -- 3: damaged and locked stores -------------------------------------------------------


def _damage(src: Path, dst: Path, page: int) -> None:
    shutil.copy(src, dst)
    with open(dst, "r+b") as f:
        f.seek((page - 1) * 4096)
        f.write(b"\x07" * 4096)


def test_a_damaged_store_is_one_line_never_a_traceback(tmp_path):
    """One damaged page (a bad sector, a partial copy) gave a sqlite3.DatabaseError
    traceback from points / sweeps / finished_keys / add_members."""
    doc = _doc("s", [8, 16, 24, 32, 48, 64], [300, 600, 900, 1200])
    (tmp_path / "s.yaml").write_text(json.dumps(doc))
    good = tmp_path / "good.sqlite"
    wia_hw.sweep(doc, store=good, workers=1)
    pages = good.stat().st_size // 4096
    assert pages >= 5
    damaged_errors = 0
    for page in range(2, pages + 1):
        bad = tmp_path / f"bad{page}.sqlite"
        _damage(good, bad, page)
        for args in (["sweep-report", str(bad)], ["sweep", str(tmp_path / "s.yaml")]):
            if args[0] == "sweep":
                _damage(good, bad, page)  # the report may not have read it all
                args = [*args, "--store", str(bad), "--workers", "1", "--no-progress"]
            res = CliRunner().invoke(cli, args)
            assert res.exception is None or isinstance(res.exception, SystemExit), (
                page,
                args[0],
                res.exception,
            )
            if res.exit_code != 0:
                line = _one_line_exit_2(res)
                assert line.startswith(f"wia-hw: error: {bad}: "), line
                damaged_errors += "malformed" in line
        _damage(good, bad, page)
        try:  # the library: SweepError too
            st = open_store(bad)
            try:
                st.points()
                st.superseded()
                len(st)
            finally:
                st.close()
        except SweepError as e:
            assert "\n" not in str(e) and str(e).startswith(f"{bad}: ")
    assert damaged_errors >= 2  # some pages did hold what these read


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("BEGIN IMMEDIATE")
    c.execute("INSERT OR REPLACE INTO meta VALUES ('x', 'y')")
    return c


def test_a_locked_store_is_one_line_naming_the_lock(tmp_path, monkeypatch):
    """Another connection holding the store's write lock gave, after 30 s, a
    sqlite3.OperationalError traceback."""
    monkeypatch.setattr(store_mod, "BUSY_TIMEOUT_S", 0.2, raising=False)
    doc = _doc("s", [16, 32])
    store = tmp_path / "s.sqlite"
    wia_hw.sweep(doc, store=store, workers=1)
    doc["grid"]["compute.array.rows"].append(48)
    (tmp_path / "s.yaml").write_text(json.dumps(doc))
    holder = _hold_write_lock(store)
    try:
        with pytest.raises(SweepError) as e:
            wia_hw.sweep(doc, store=store, workers=1)
        assert str(e.value) == (
            f"{store}: cannot write its meta table: database is locked: another process "
            "holds it (waited 0.2 s)"
        )
        res = CliRunner().invoke(
            cli, ["sweep", str(tmp_path / "s.yaml"), "--store", str(store), "--no-progress"]
        )
        assert _one_line_exit_2(res).endswith(
            "database is locked: another process holds it (waited 0.2 s)"
        )
        # each write a sweep makes
        writer = store_mod.SweepStore(store, sqlite3.connect(store, timeout=0.2))
        with pytest.raises(SweepError, match=r"cannot store a finished point: database is locked"):
            _record(writer, 0)
        with pytest.raises(SweepError, match=r"cannot record the sweep's points: database is"):
            writer.add_members("s", "d", ["k"])
        writer.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # a store locked for reading too (a rollback-journal store under an exclusive lock)
    journal = tmp_path / "j.sqlite"
    shutil.copy(store, journal)
    with contextlib.closing(sqlite3.connect(journal)) as c:
        c.execute("PRAGMA journal_mode = DELETE")
    holder = sqlite3.connect(journal, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        line = _one_line_exit_2(CliRunner().invoke(cli, ["sweep-report", str(journal)]))
        assert line == (
            f"wia-hw: error: {journal}: cannot read the store: database is locked: another "
            "process holds it (waited 0.2 s)"
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# -- 4: the progress bar only on a terminal --------------------------------------------


@pytest.mark.parametrize("terminal", [False, True])
def test_the_progress_bar_is_drawn_on_a_terminal_only(tmp_path, monkeypatch, terminal):
    """``wia-hw sweep --json 2> err.txt`` left the bar's last frame in the file."""
    from rich.console import Console

    monkeypatch.setattr(Console, "is_terminal", property(lambda self: terminal))
    (tmp_path / "s.yaml").write_text(json.dumps(_doc("p", [16, 32, 48])))
    before = signal.getsignal(signal.SIGINT)
    res = CliRunner().invoke(
        cli,
        ["sweep", str(tmp_path / "s.yaml"), "--store", str(tmp_path / "p.sqlite"), "--json"],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["computed"] == 3
    drawn = "points/min" in res.stderr or "━" in res.stderr
    assert drawn == terminal, res.stderr
    if not terminal:
        assert res.stderr == ""
    assert signal.getsignal(signal.SIGINT) is before  # a run that ended puts it back


# -- 5: a report of a sweep run again with fewer points ---------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_report_shows_the_points_of_the_current_file_only(tmp_path, seed):
    """A sweep run again under the same name with fewer values showed every stored
    point of the name, the dropped values included."""
    rnd = random.Random(seed)
    rows = sorted(rnd.sample([8, 16, 24, 32, 48, 64, 96, 128], 4))
    bws = sorted(rnd.sample([300, 600, 900, 1200, 1500], rnd.randint(1, 3)))
    narrow = sorted(rnd.sample(rows, rnd.randint(1, 3)))
    store = tmp_path / "s.sqlite"
    wia_hw.sweep(_doc("s", rows, bws), store=store, workers=2)
    s = wia_hw.sweep(_doc("s", narrow, bws), store=store, workers=1)
    assert (s.skipped, s.computed) == (len(narrow) * len(bws), 0)  # nothing to compute
    st = open_store(store)
    try:
        got = st.points("s")
        assert sorted({r["params"]["compute.array.rows"] for r in got}) == narrow
        assert len(got) == len(narrow) * len(bws) == len(st.points())
        left_out = (len(rows) - len(narrow)) * len(bws)
        assert st.superseded("s") == left_out == st.superseded()
        assert len(st.points("s", superseded=True)) == len(rows) * len(bws)  # none lost
    finally:
        st.close()
    out = CliRunner().invoke(cli, ["sweep-report", str(store)]).output
    assert f"{len(narrow) * len(bws)} points (" in out
    assert (
        f"{left_out} superseded rows (of an earlier definition of the sweep: other parameter" in out
    )
    for v in set(rows) - set(narrow):
        assert f"compute.array.rows={v}," not in out
    out = CliRunner().invoke(cli, ["sweep-report", str(store), "--superseded"]).output
    assert f"{len(rows) * len(bws)} points (" in out
    # the wider file again: every row is current, nothing computed, nothing left out
    s = wia_hw.sweep(_doc("s", rows, bws), store=store, workers=1)
    assert s.computed == 0
    st = open_store(store)
    try:
        assert len(st.points("s")) == len(rows) * len(bws) and st.superseded("s") == 0
    finally:
        st.close()


def test_the_definition_hashes_the_point_set():
    a = load_sweep(_doc("s", [16, 32]))
    b = load_sweep(_doc("s", [32, 16]))
    c = load_sweep(_doc("s", [16]))
    assert a.definition == b.definition != c.definition
    a.points()  # cached keys: the same definition
    assert a.definition == b.definition


# -- 6: a second Ctrl-C while an interrupted sweep shuts down --------------------------


def _interrupt_first(done: int, total: int) -> None:
    if done == 1:
        raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["counting", "stopping the pool"])
def test_a_second_ctrl_c_during_the_shutdown_is_ignored(tmp_path, monkeypatch, where):
    """A second SIGINT while the interrupted sweep counted what it stored, or stopped
    its pool, escaped as a bare KeyboardInterrupt (click's 'Aborted!', status 1)."""
    from concurrent.futures import ProcessPoolExecutor

    before = signal.getsignal(signal.SIGINT)
    seen: list[object] = []
    if where == "counting":
        real = SweepStore.finished_keys
        calls = [0]

        def finished_keys(self, keys, **kw):
            calls[0] += 1
            if calls[0] == 2:  # the first is before the run, the second counts it
                seen.append(signal.getsignal(signal.SIGINT))
                signal.raise_signal(signal.SIGINT)
            return real(self, keys, **kw)

        monkeypatch.setattr(SweepStore, "finished_keys", finished_keys)
    else:

        class Pool(ProcessPoolExecutor):
            def shutdown(self, wait=True, *, cancel_futures=False):
                seen.append(signal.getsignal(signal.SIGINT))
                signal.raise_signal(signal.SIGINT)
                super().shutdown(wait=wait, cancel_futures=cancel_futures)

        monkeypatch.setattr(run_mod, "ProcessPoolExecutor", Pool)
    store = tmp_path / "c.sqlite"
    with pytest.raises(KeyboardInterrupt) as e:
        wia_hw.sweep(_doc("c", [16, 32, 48, 64]), store=store, workers=1, progress=_interrupt_first)
    assert e.type is SweepInterrupted, e.value
    assert str(e.value).startswith("interrupted: 1 points computed and stored by this run")
    assert seen == [signal.SIG_IGN]
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back
    assert len(_rows(store)) >= 1


def test_the_cli_ends_a_twice_interrupted_sweep_with_one_line_and_130(tmp_path, monkeypatch):
    """The CLI's first Ctrl-C stops the sweep; the ones after it are ignored to the
    process's end (Python's exit, joining the stopped pool's thread, was killed by a
    second SIGINT: status -2)."""
    (tmp_path / "s.yaml").write_text(json.dumps(_doc("c", [16, 32])))

    def interrupted_sweep(*a, **k):
        try:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C
        except KeyboardInterrupt:
            signal.raise_signal(signal.SIGINT)  # and again, while stopping
            raise SweepInterrupted(
                "interrupted: 0 points computed and stored by this run, 0 of the sweep's "
                "2 points in c.sqlite; run it again to go on"
            ) from None
        raise AssertionError("the first Ctrl-C was not a KeyboardInterrupt")

    monkeypatch.setattr(sweep_cli, "sweep", interrupted_sweep)
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.yaml"), "--no-progress"])
    assert res.exit_code == 130, res.output
    assert res.output.strip().splitlines() == [
        "wia-hw: interrupted: 0 points computed and stored by this run, 0 of the sweep's "
        "2 points in c.sqlite; run it again to go on"
    ]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # to the process's end

    def interrupted_early(*a, **k):  # a Ctrl-C before any point ran
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(sweep_cli, "sweep", interrupted_early)
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.yaml"), "--no-progress"])
    assert res.exit_code == 130 and res.output.strip() == "wia-hw: interrupted", res.output


def test_evaluate_point_never_raises_so_dask_errors_are_the_clusters():
    """What test 1 leans on: a point's own error is a failed result, not an exception."""
    r = evaluate_point(
        {
            "key": "k",
            "base": "wia-npu",
            "params": {"compute.array.rows": -8},
            "workload": "gemm",
            "args": {"M": 8, "N": 8, "K": 8},
            "metrics": ["latency_ms"],
        }
    )
    assert r["status"] == "failed" and r["metrics"] is None and r["error"]


def test_a_store_this_user_cannot_write_is_not_called_not_a_store(tmp_path):
    """Run as another user, a valid store read-only to them gave "not a sweep store
    (attempt to write a readonly database)"; it says it cannot be written."""
    import sqlite3

    from wia_hw.sweep._store import SweepStore

    class ReadOnly:
        def execute(self, *a, **k):
            raise sqlite3.OperationalError("attempt to write a readonly database")

    path = tmp_path / "s.sqlite"
    with pytest.raises(SweepError) as e:
        SweepStore._check(path, ReadOnly())
    msg = str(e.value)
    assert msg.startswith(f"{path}: cannot write to this sweep store (attempt to write")
    assert "not a sweep store" not in msg and "\n" not in msg
