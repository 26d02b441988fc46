"""Auto-tuning review findings: config errors name the field with a message true for
the value given; schedule files are validated against the device and say which device
they were for; the tuner never hands back schedules that make the graph slower on the
device it tuned for."""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest
from wia_hw.emulator.kernels import GemmKernel, GemmTiling

import wia_hw
from wia_hw.lowering import gemm_key, lower
from wia_hw.optimize import (
    AutotuneConfig,
    AutotuneError,
    ScheduleDeviceWarning,
    ScheduleError,
    autotune_model,
    load_schedules,
)
from wia_hw.optimize._autotune import candidate_pool
from wia_hw.optimize._schedules import FORMAT, spec_hash, tiling_fields
from wia_hw.runtime import open_device, resolve_workload

# -- AutotuneConfig errors --------------------------------------------------------------


def _bad_values(rng: random.Random, kind: str) -> list[object]:
    """Values that are not valid for a field of ``kind`` (int, seed, seconds)."""
    out: list[object] = [
        rng.uniform(0.1, 99.0),  # a float, even a whole one below
        float(rng.randint(1, 99)),
        str(rng.randint(1, 99)),
        [rng.randint(1, 9)],
        True,
        float("nan"),
    ]
    if kind in ("int", "seed"):
        out.append(-rng.randint(1, 2**31))
    if kind == "int":
        out.append(0)
    if kind == "seconds":
        out += [0, 0.0, -rng.uniform(0.1, 99.0), -rng.randint(1, 99), str(rng.uniform(1, 9))]
        out = [v for v in out if not (isinstance(v, float) and v > 0 and v == v)]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bad_numeric_fields_are_one_line_errors_true_for_the_value(seed):
    rng = random.Random(seed)
    fields = {
        "seed": "seed",
        "max_trials": "int",
        "batch_size": "int",
        "max_tiles": "int",
        "time_budget_seconds": "seconds",
    }
    for name, kind in fields.items():
        for v in _bad_values(rng, kind):
            with pytest.raises(AutotuneError) as e:
                AutotuneConfig(**{name: v})
            msg = str(e.value)
            assert "\n" not in msg
            assert msg.startswith(f"AutotuneConfig.{name} must be "), msg
            assert f"got {v!r}" in msg, msg
            # "a budget of 0" only where the value is a zero budget
            zero = name in ("max_trials", "time_budget_seconds") and (
                type(v) in (int, float) and v == 0
            )
            assert ("a budget of 0" in msg) == zero, msg


@pytest.mark.parametrize("seed", [0, 1])
def test_valid_seeds_are_kept_as_ints(seed):
    rng = random.Random(seed)
    for v in [0, rng.randint(1, 2**32), np.int64(rng.randint(0, 2**31))]:
        cfg = AutotuneConfig(seed=v)
        assert cfg.seed == int(v) and type(cfg.seed) is int


def test_bad_kernels_to_tune_is_one_line():
    cases = [
        ([], r"kernels_to_tune is empty, which tunes nothing \(None tunes every GEMM"),
        ((), r"kernels_to_tune is empty"),
        (["fc0", 3], r"kernels_to_tune must hold op names or kernel keys .*got 3 at index 1"),
        (5, r"kernels_to_tune must be a list of names \(or None .*\), got 5"),
        ("fc0", r"kernels_to_tune must be a list of names, got the string 'fc0'"),
    ]
    for v, match in cases:
        with pytest.raises(AutotuneError, match=match) as e:
            AutotuneConfig(kernels_to_tune=v)
        assert "\n" not in str(e.value)
    assert AutotuneConfig(kernels_to_tune=iter(["fc0"])).kernels_to_tune == ("fc0",)


def test_bad_epsilon_is_one_line():
    for v in ("0.5", float("nan"), -0.1, None):
        with pytest.raises(AutotuneError, match=r"epsilon must be in \[0, 1\], got ") as e:
            AutotuneConfig(epsilon=v)
        assert "\n" not in str(e.value)


# -- schedule files: validated against the device, duplicates refused --------------------

SPECS = ("wia-npu", "wia-edge", "tpu-v1", "a100-systolic")


def _kernel(spec, m: int, n: int, k: int, batch: int = 1) -> GemmKernel:
    prec = "fp16" if spec.supports("fp16") else "int8"
    g = resolve_workload("gemm", M=m, N=n, K=k, batch=batch, precision=prec)
    (kern,) = [x for _, ks in lower(g, spec) for x in ks]
    assert isinstance(kern, GemmKernel)
    return kern


def _file(path, entries) -> str:
    path.write_text(json.dumps({"format": FORMAT, "version": 1, "entries": entries}))
    return path


def _entry(key: str, spec, t: GemmTiling, device: str | None = None) -> dict:
    return {
        "kernel": key,
        "device": device or spec.name,
        "spec_sha256": spec_hash(spec),
        "tiling": tiling_fields(t),
    }


def _fits(spec, kern: GemmKernel, t: GemmTiling) -> bool:
    a = spec.compute.array
    e, eo, l1 = kern.a.elem_bytes, kern.c.elem_bytes, spec.memory.l1.size_bytes
    ok = t.tb * (t.tm + t.tn) * t.tk * e <= l1 // 2 and t.tb * t.tm * t.tn * eo <= l1 // 4
    for v, unit, ext in ((t.tm, a.rows, kern.m), (t.tn, a.cols, kern.n), (t.tk, a.rows, kern.k)):
        ok = ok and (v % unit == 0 or v == ext) and v <= -(-ext // unit) * unit
    whole = t.tm >= kern.m and t.tn >= kern.n
    return ok and t.tb <= kern.batch and (t.tb == 1 or whole)


@pytest.mark.parametrize("name", SPECS)
def test_every_tuner_candidate_loads_from_a_file(tmp_path, name):
    """The file's rule is the tuner's: every candidate of the pool (random shapes, fixed
    seed) is accepted by load_schedules on its spec."""
    spec = open_device(name).spec
    rng = random.Random(11)
    for i in range(6):
        b = rng.choice([1, 1, 2, 12])
        m, n, k = (rng.choice([1, 7, 64, 100, 128, 384, 1000]) for _ in range(3))
        kern = _kernel(spec, m, n, k, b)
        pool = candidate_pool(kern, spec, max_tiles=64)
        for t in rng.sample(pool, min(8, len(pool))):
            p = _file(tmp_path / f"s{i}.json", [_entry(gemm_key(kern), spec, t)])
            assert load_schedules(p, spec) == {gemm_key(kern): t}


@pytest.mark.parametrize("name", ["wia-npu", "wia-edge"])
def test_hand_edited_tilings_outside_the_device_rule_are_one_line(tmp_path, name):
    """Random tilings: accepted exactly when they are aligned to the array (or whole),
    within the extents and fit the double-buffered L1; refused with one line naming the
    file, the entry and its kernel key, and the field."""
    spec = open_device(name).spec
    rng = random.Random(5)
    refused = accepted = 0
    for _ in range(200):
        b = rng.choice([1, 4])
        m, n, k = (rng.choice([3, 64, 128, 512, 1024, 2304]) for _ in range(3))
        kern = _kernel(spec, m, n, k, b)
        key = gemm_key(kern)
        r, c = spec.compute.array.rows, spec.compute.array.cols
        t = GemmTiling(
            tm=rng.choice([7, r, r, 2 * r, 4 * r, m, m, 2048]),
            tn=rng.choice([13, c, c, 2 * c, 4 * c, n, n, 2304]),
            tk=rng.choice([5, r, 2 * r, 6 * r, k, k]),
            tb=rng.choice([1, 1, 1, 2, 4, 8]),
            order=rng.choice(["mn", "nm"]),
        )
        other = _entry("linear 1x2x2x2 fp16->2B b", spec, GemmTiling(2, 2, 2))
        p = _file(tmp_path / "s.json", [other, _entry(key, spec, t)])
        if _fits(spec, kern, t):
            accepted += 1
            assert load_schedules(p, spec)[key] == t
            continue
        refused += 1
        with pytest.raises(ScheduleError) as e:
            load_schedules(p, spec)
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith(f"{p}: entry 1 ({key}): tiling"), msg
        assert any(f in msg for f in ("tiling.tm=", "tiling.tn=", "tiling.tk=", "tiling.tb=")) or (
            "does not fit the double-buffered L1" in msg
        ), msg
    assert refused > 50 and accepted > 5


def test_the_reviewers_files_are_refused(tmp_path):
    spec = open_device("wia-npu").spec
    kern = _kernel(spec, 1024, 2304, 768)
    key = gemm_key(kern)
    # 1024 x 2304 x 768 fp16 double-buffered: 2 x 5.1 MB > 8 MiB
    p = _file(tmp_path / "l1.json", [_entry(key, spec, GemmTiling(1024, 2304, 768))])
    with pytest.raises(ScheduleError, match=r"does not fit the double-buffered L1 of wia-npu"):
        load_schedules(p, spec)
    p = _file(tmp_path / "odd.json", [_entry(key, spec, GemmTiling(7, 13, 5))])
    with pytest.raises(
        ScheduleError, match=r"entry 0 \(matmul 1x1024x2304x768 .*\): tiling.tm=7 is neither"
    ):
        load_schedules(p, spec)


@pytest.mark.parametrize("seed", [0, 1])
def test_duplicate_entries_are_refused(tmp_path, seed):
    """Two entries of one kernel and spec (same or different tilings, anywhere in the
    file) are one line naming both; the same kernel on two specs is not a duplicate."""
    spec = open_device("wia-npu").spec
    other = open_device("wia-npu", overrides={"memory.l1.size_kib": 4096}).spec
    rng = random.Random(seed)
    keys = [gemm_key(_kernel(spec, 128 * rng.randint(1, 4), 128, 128)) for _ in range(4)]
    keys = list(dict.fromkeys(keys))
    entries = [_entry(k, spec, GemmTiling(128, 128, 128)) for k in keys]
    entries += [_entry(k, other, GemmTiling(128, 128, 128)) for k in keys]
    assert len(load_schedules(_file(tmp_path / "ok.json", entries), spec)) == len(keys)
    i = rng.randrange(len(keys))
    dup = _entry(keys[i], spec, GemmTiling(128, 128, 128, order=rng.choice(["mn", "nm"])))
    at = rng.randint(len(keys), len(entries))
    entries.insert(at, dup)
    p = _file(tmp_path / "dup.json", entries)
    with pytest.raises(ScheduleError) as e:
        load_schedules(p, spec)
    assert str(e.value) == (
        f"{p}: entry {at} ({keys[i]}): 'kernel' repeats entry {i} for the same spec "
        f"({spec_hash(spec)[:12]}): one schedule per kernel and spec; remove one of them"
    )


# -- schedule files of another device ---------------------------------------------------


def test_a_file_for_another_device_warns_and_counts(tmp_path):
    npu, edge = open_device("wia-npu").spec, open_device("wia-edge").spec
    rng = random.Random(2)
    n_npu, n_edge = rng.randint(1, 4), rng.randint(1, 3)
    ents = [
        _entry(gemm_key(_kernel(npu, 128 * (j + 1), 128, 128)), npu, GemmTiling(128, 128, 128))
        for j in range(n_npu)
    ]
    p = _file(tmp_path / "npu.json", ents)
    with pytest.warns(ScheduleDeviceWarning) as w:
        got = load_schedules(p, edge)
    assert got == {} and got.applied == 0 and got.other_spec == n_npu
    assert got.other_devices == ("wia-npu",)
    (msg,) = [str(x.message) for x in w]
    assert msg == (
        f"{p}: no schedule for wia-edge (spec {spec_hash(edge)[:12]}): its {n_npu} entries "
        "are for another spec (wia-npu); the run uses the default tilings"
    )
    # in a run too
    g = resolve_workload("gemm", M=128, N=128, K=128)
    with pytest.warns(ScheduleDeviceWarning, match="no schedule for wia-edge"):
        wia_hw.run(g, device="wia-edge", schedules=p)
    # with entries for this device too: they apply, the others are counted, no warning
    ents += [
        _entry(gemm_key(_kernel(edge, 32 * (j + 1), 32, 32)), edge, GemmTiling(32, 32, 32))
        for j in range(n_edge)
    ]
    p = _file(tmp_path / "both.json", ents)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = load_schedules(p, edge)
    assert (got.applied, got.other_spec, got.device, got.path) == (
        n_edge,
        n_npu,
        "wia-edge",
        str(p),
    )
    # an empty file warns too
    with pytest.warns(ScheduleDeviceWarning, match=r"it has no entries"):
        load_schedules(_file(tmp_path / "empty.json", []), edge)


# -- the tuner never hands back schedules that make the graph slower ---------------------


def _mlp(rng: random.Random) -> wia_hw.Graph:
    b = wia_hw.GraphBuilder(f"mlp{rng.randint(0, 999)}", "fp16")
    x = b.input("x", (rng.choice([2, 64, 128, 200]), rng.choice([64, 256, 768])))
    h = b.linear("fc0", x, rng.choice([128, 512, 1000]))
    h = b.op("gelu", "act", [h])
    b.linear("fc1", h, rng.choice([64, 384]))
    return b.graph()


def _in_graph(res: wia_hw.RunResult, graph, spec) -> dict[str, int]:
    keys = {
        k.name: gemm_key(k) for _, ks in lower(graph, spec) for k in ks if isinstance(k, GemmKernel)
    }
    out: dict[str, int] = {}
    for k in res.kernels:
        if k.name in keys:
            out[keys[k.name]] = out.get(keys[k.name], 0) + k.cycles
    return out


def _assert_never_slower(graph, device: str, cfg: AutotuneConfig, tmp_path) -> None:
    spec = open_device(device).spec
    r = autotune_model(graph, cfg, device=device)
    path = r.save(tmp_path / f"{graph.name}-{device}-{cfg.seed}.json")
    base = wia_hw.run(graph, device=device)
    if r.schedules:
        tuned = wia_hw.run(graph, device=device, schedules=path)
    else:  # nothing to apply: the file has no entry for the device, and says so
        with pytest.warns(ScheduleDeviceWarning, match=r"it has no entries"):
            tuned = wia_hw.run(graph, device=device, schedules=path)
    assert tuned.cycles <= base.cycles, r.table()
    per0, per1 = _in_graph(base, graph, spec), _in_graph(tuned, graph, spec)
    for key in r.schedules:
        assert per1[key] <= per0[key], (key, r.table())
    if r.schedules:
        assert (r.graph_default_cycles, r.graph_tuned_cycles) == (base.cycles, tuned.cycles)
    for key, t in r.kernels.items():
        assert (key in r.schedules) == t.applied
        if t.dropped:
            assert any(n.startswith(f"dropped {key}: ") or "dropped all" in n for n in r.notes)
            assert "DROPPED" in r.table()
    saved = {e["kernel"] for e in json.loads(path.read_text())["entries"]}
    assert saved == set(r.schedules)
    assert r.tuned_cycles <= r.default_cycles


def test_bert_on_edge_is_not_slower_with_its_schedules(tmp_path):
    """The reviewer's case: bert-base b2 s64 (one layer) tuned on wia-edge ran 2,035,540
    -> 2,266,741 cycles with its schedules (the attention bmm 24,992 -> 225,080 in the
    graph); the keys slower in the graph are dropped and say why."""
    g = resolve_workload("bert-base", batch=2, seq=64, layers=1)
    cfg = AutotuneConfig(method="ml", time_budget_seconds=None, max_trials=12, seed=0)
    _assert_never_slower(g, "wia-edge", cfg, tmp_path)
    r = autotune_model(g, cfg, device="wia-edge")
    assert r.graph_tuned_cycles < r.graph_default_cycles
    dropped = [k for k, t in r.kernels.items() if t.dropped]
    assert "bmm 24x64x64x64 fp16->2B bT" in dropped
    assert all("slower in the graph" in r.kernels[k].dropped for k in dropped)


@pytest.mark.parametrize("device", ["wia-npu", "wia-edge"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_graphs_are_never_slower_with_their_schedules(tmp_path, device, seed):
    rng = random.Random(100 * seed + len(device))
    g = _mlp(rng)
    cfg = AutotuneConfig(
        method=rng.choice(["ml", "random", "grid"]),
        time_budget_seconds=None,
        max_trials=rng.choice([4, 8]),
        seed=seed,
    )
    _assert_never_slower(g, device, cfg, tmp_path)


def test_a_slower_whole_graph_drops_every_schedule(monkeypatch):
    """When no key's kernels get slower but the whole run does, every schedule is
    dropped and the result says so."""
    from wia_hw.optimize import _autotune

    real = _autotune._graph_run

    def slower(graph, ctx, schedules, keys):
        cycles, per = real(graph, ctx, {}, keys)  # each key exactly as without schedules
        return cycles + (1000 if schedules else 0), per

    monkeypatch.setattr(_autotune, "_graph_run", slower)
    g = resolve_workload("bert-base", batch=2, seq=64, layers=1)
    r = autotune_model(g, AutotuneConfig(time_budget_seconds=None, max_trials=4, seed=1))
    assert r.schedules == {} and r.entries() == []
    assert r.tuned_cycles == r.default_cycles
    assert r.graph_tuned_cycles == r.graph_default_cycles
    (note,) = r.notes
    assert note.startswith("dropped all ") and "the whole graph was slower" in note
    assert all(t.dropped for t in r.kernels.values() if t.best_cycles < t.default_cycles)


def test_schedules_that_match_no_kernel_of_the_graph_warn_and_are_counted(tmp_path):
    """Tilings tuned for this device but for another model's kernels change nothing: the
    run says so (it used the defaults silently) and its provenance counts what it used."""
    from wia_hw.optimize import ScheduleUnusedWarning

    npu = open_device("wia-npu").spec
    rng = random.Random(5)
    m = 128 * rng.randint(2, 6)
    ents = [_entry(gemm_key(_kernel(npu, m, 256, 128)), npu, GemmTiling(128, 128, 128))]
    p = _file(tmp_path / "s.json", ents)
    other = resolve_workload("gemm", M=128, N=128, K=128)
    with pytest.warns(
        ScheduleUnusedWarning, match=r"none of the 1 tuned tiling\(s\) for 'wia-npu'"
    ):
        r = wia_hw.run(other, schedules=p)
    assert r.provenance["run"]["schedules_used"] == 0
    same = resolve_workload("gemm", M=m, N=256, K=128)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleUnusedWarning)
        r = wia_hw.run(same, schedules=p)
    assert r.provenance["run"]["schedules_used"] == 1


def test_a_core_count_round_trips_through_both_files(tmp_path):
    """A tiling on fewer cores than the device's is written with its ``cores`` (and one
    on all of them without), read back equal, and a count above the device's is one
    line naming the field."""
    spec = open_device("wia-npu").spec
    kern = _kernel(spec, 256, 4096, 4096, 1)
    key = gemm_key(kern)
    t = GemmTiling(tm=128, tn=256, tk=4096, cores=2)
    assert tiling_fields(t)["cores"] == 2 and "cores" not in tiling_fields(GemmTiling(1, 1, 1))
    p = _file(tmp_path / "s.json", [_entry(key, spec, t)])
    assert load_schedules(p, spec) == {key: t}
    bad = GemmTiling(tm=128, tn=256, tk=4096, cores=spec.compute.cores + 1)
    p = _file(tmp_path / "b.json", [_entry(key, spec, bad)])
    with pytest.raises(ScheduleError, match=r"entry 0 .*tiling.cores=5 is above the 4 cores"):
        load_schedules(p, spec)
    # the measurements file keeps the count (a 12th field), and an old row without it
    from wia_hw.optimize._autotune import _MEASURED, load_measurements, save_measurements

    sha = spec_hash(spec)
    _MEASURED.clear()
    _MEASURED[(sha, key, t)] = (1234, (1, 2, 3))
    _MEASURED[(sha, key, GemmTiling(tm=128, tn=256, tk=4096))] = (1500, (4, 5, 6))
    m = save_measurements(tmp_path / "m.json", sha)
    rows = json.loads(m.read_text())["entries"]
    assert sorted(len(r) for r in rows) == [11, 12]
    _MEASURED.clear()
    assert load_measurements(m) == 2
    assert _MEASURED[(sha, key, t)] == (1234, (1, 2, 3))
    assert _MEASURED[(sha, key, GemmTiling(tm=128, tn=256, tk=4096))][0] == 1500
    _MEASURED.clear()
