"""Files several processes update at once: the autotuner's schedules file (and its
measurements file, through the same :func:`wia_hw._files.update_locked`). Two
processes each merging 40 entries into one file kept 34 to 53 of the 80, and could
leave a file that did not parse; now every entry of both is kept."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from wia_hw._files import update_locked, write_atomic
from wia_hw.optimize._schedules import read_entries, save_schedules

ENTRY = {
    "kernel": "linear 1x128x3072x768 fp16->2B b+bias",
    "precision": "fp16",
    "device": "wia-npu",
    "spec_sha256": "18edc9261e8fca41073e7c24f3de1afe3a3a1d4d2942373b090a3fe9649bcd9e",
    "dataflow": "os",
    "tiling": {"tm": 128, "tn": 512, "tk": 128, "tb": 1, "order": "nm"},
    "cycles": 10428,
    "default_cycles": 11489,
    "floor_cycles": 8010.0,
    "trials": 4,
    "method": "random",
    "seed": 0,
    "graph": "bert-base",
    "graph_default_cycles": 11144,
    "graph_cycles": 10084,
}


def _saver(proc: int, path: str, n: int, q) -> None:
    errors = []
    for i in range(n):
        e = dict(ENTRY, kernel=f"linear 1x{128 * (proc + 1)}x{128 * (i + 1)}x768 fp16->2B b+bias")
        try:
            save_schedules(path, [e])
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")
    q.put(errors)


def _race(target, path: str) -> list[str]:
    """Two forked processes each running ``target(proc, path, 40, queue)`` at once; the
    errors they met."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(k, path, 40, q)) for k in range(2)]
    for p in procs:
        p.start()
    errors = [e for _ in procs for e in q.get(timeout=120)]
    for p in procs:
        p.join(timeout=120)
    return errors


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_two_processes_saving_schedules_keep_every_entry(tmp_path):
    path = str(tmp_path / "schedules.json")
    assert _race(_saver, path) == []
    kernels = {e["kernel"] for e in read_entries(path)}
    assert len(kernels) == 80
    # no temporary file left beside it
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_a_failed_update_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "f.json"
    write_atomic(path, "old\n")

    def broken() -> str:
        raise RuntimeError("merge failed")

    with pytest.raises(RuntimeError):
        update_locked(path, broken)
    assert path.read_text() == "old\n"
    update_locked(path, lambda: path.read_text() + "new\n")
    assert path.read_text() == "old\nnew\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def _measurer(proc: int, path: str, n: int, q) -> None:
    from wia_hw.emulator.kernels import GemmTiling

    from wia_hw.optimize import _autotune as A

    errors = []
    sha = f"spec{proc}"
    for i in range(n):
        t = GemmTiling(tm=128, tn=128, tk=128, tb=1, order="mn")
        A._MEASURED[(sha, f"k{i}", t)] = (1000 + i, (1, 2, 3))
        try:
            A.save_measurements(path, sha)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")
    q.put(errors)


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_two_processes_saving_measurements_keep_every_row(tmp_path):
    import json

    path = str(tmp_path / "measurements.json")
    assert _race(_measurer, path) == []
    assert len(json.loads(open(path).read())["entries"]) == 80


def test_an_interrupted_search_keeps_its_measurements(tmp_path, monkeypatch):
    """Ctrl-C during autotune_model lost every measurement (the file was written only at
    the end); a schedules path it could not save to was found only after the search."""
    import json

    from wia_hw.optimize import AutotuneConfig, ScheduleError, autotune_model
    from wia_hw.optimize import _autotune as A
    from wia_hw.workloads import build

    g = build("bert-base", batch=2, seq=32, layers=1)
    cfg = AutotuneConfig(method="random", max_trials=40, time_budget_seconds=None, seed=0)
    real = A._Evaluator.__call__
    calls = []

    def interrupting(self, *a, **k):
        calls.append(1)
        if len(calls) == 30:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(A._Evaluator, "__call__", interrupting)
    A._MEASURED.clear()
    meas = tmp_path / "m.json"
    with pytest.raises(KeyboardInterrupt):
        autotune_model(g, cfg, device="wia-npu", measurements_file=meas)
    assert len(json.loads(meas.read_text())["entries"]) > 0
    monkeypatch.setattr(A._Evaluator, "__call__", real)
    calls.clear()
    (tmp_path / "d").mkdir()
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    (tmp_path / "afile").write_text("x")
    for bad, why in [
        ("d", "is a directory"),
        ("other.json", "not a schedule file"),
        ("afile/s.json", "afile is a file, not a folder"),
    ]:
        with pytest.raises(ScheduleError, match=why):
            autotune_model(g, cfg, device="wia-npu", schedules_file=tmp_path / bad)
    for bad, why in [("d", "is a directory"), ("afile/m.json", "afile is a file, not a folder")]:
        with pytest.raises(ScheduleError, match=why):
            autotune_model(g, cfg, device="wia-npu", measurements_file=tmp_path / bad)
