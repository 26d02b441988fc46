"""Auto-tuning (issue #12): the search space, the measurement, the three methods, the
schedule file and its use by ``run``, and the errors.

Kernels are small (a few GEMMs of at most 512 x 1024 x 1024 and a two-layer BERT-Base
at batch 2, sequence 64) and budgets short, so the file runs in seconds.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from wia_hw.emulator.device import Device
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
from wia_hw.optimize._autotune import (
    _BOUNDS,
    _MEASURED,
    _SUSPENDED,
    _cache_key,
    candidate_pool,
    kernel_floor_cycles,
    measure_cycles,
    schedule_features,
)
from wia_hw.optimize._fast_eval import canonical_tiling
from wia_hw.optimize._schedules import spec_hash
from wia_hw.runtime import open_device, resolve_workload

SPEC = open_device("wia-npu").spec


def _gemm_kernel(m: int, n: int, k: int, batch: int = 1) -> GemmKernel:
    g = resolve_workload("gemm", M=m, N=n, K=k, batch=batch)
    (kern,) = [x for _, ks in lower(g, SPEC) for x in ks]
    assert isinstance(kern, GemmKernel)
    return kern


def _small_bert() -> wia_hw.Graph:
    return resolve_workload("bert-base", batch=2, seq=64, layers=2)


CFG = {"time_budget_seconds": None, "max_trials": 12, "seed": 3}


# -- the search space ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(512, 1024, 1024, 1), (256, 384, 4096, 1), (128, 64, 128, 16)])
def test_pool_fits_l1_and_is_canonical(shape):
    """Every candidate fits the double-buffered L1 as lowering's rule requires, has at
    most max_tiles tiles, and the pool is the same list every time, sorted."""
    m, n, k, b = shape
    kern = _gemm_kernel(m, n, k, b)
    pool = candidate_pool(kern, SPEC, max_tiles=64)
    assert len(pool) > 4
    l1 = SPEC.memory.l1.size_bytes
    e, eo = kern.a.elem_bytes, kern.c.elem_bytes
    for t in pool:
        assert t.tb * (t.tm + t.tn) * t.tk * e <= l1 // 2
        assert t.tb * t.tm * t.tn * eo <= l1 // 4
        assert t.tm <= m and t.tn <= n and t.tk <= k and t.tb <= b
        tiles = -(-b // t.tb) * -(-m // t.tm) * -(-n // t.tn) * -(-k // t.tk)
        assert tiles <= 64
    assert pool == candidate_pool(kern, SPEC, max_tiles=64)
    assert pool == sorted(pool, key=lambda t: (t.tm, t.tn, t.tk, t.tb, t.order))
    assert {t.order for t in pool} == {"mn", "nm"}
    assert len(schedule_features(kern, pool[0], SPEC)) == len(
        schedule_features(kern, pool[-1], SPEC)
    )


def test_pool_has_core_splits():
    """The core split: candidates with at least 1, 2 and 4 tiles per core exist."""
    kern = _gemm_kernel(512, 1024, 1024)
    cores = SPEC.compute.cores
    counts = {
        -(-kern.m // t.tm) * -(-kern.n // t.tn) * -(-kern.k // t.tk)
        for t in candidate_pool(kern, SPEC)
    }
    assert any(c < cores for c in counts) or min(counts) >= cores
    for per_core in (1, 2, 4):
        assert any(c >= per_core * cores for c in counts)


# -- measurement: the emulator itself, cached ----------------------------------------


def test_measurement_equals_the_emulator_on_random_candidates():
    """A candidate's cycles are exactly the emulator's for that kernel alone on a fresh
    device; the cache answers the second time with the same number."""
    rng = random.Random(7)
    sha = spec_hash(SPEC)
    for shape in [(512, 1024, 1024, 1), (128, 128, 64, 8), (300, 200, 700, 1)]:
        kern = _gemm_kernel(*shape)
        pool = candidate_pool(kern, SPEC, max_tiles=64)
        for t in rng.sample(pool, 4):
            _MEASURED.pop((sha, _cache_key(kern), canonical_tiling(kern, t)), None)
            cycles, hit = measure_cycles(kern, t, SPEC, sha)
            assert not hit
            rec = Device(SPEC).execute([replace(kern, tiling=t)])[0]
            assert cycles == rec.end_cycle - rec.start_cycle
            again, hit = measure_cycles(kern, t, SPEC, sha)
            assert hit and again == cycles


def test_every_candidate_is_at_least_its_floors():
    """Physics: no candidate beats any floor of the bound model (compute at peak, array
    issue, busiest core, and each memory level's bytes at its bandwidth)."""
    rng = random.Random(11)
    for shape in [(512, 1024, 1024, 1), (128, 64, 128, 16)]:
        kern = _gemm_kernel(*shape)
        for t in rng.sample(candidate_pool(kern, SPEC, max_tiles=64), 5):
            cycles, _ = measure_cycles(kern, t, SPEC)
            floors = kernel_floor_cycles(kern, t, SPEC)
            assert floors["compute"] == 2 * kern.macs / (
                2 * float(SPEC.peak_macs_per_cycle("fp16"))
            )
            assert set(floors) >= {"compute", "pipeline", "parallelism", "l1", "l2", "hbm"}
            assert cycles >= max(floors.values())


# -- the search -----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["grid", "random", "ml"])
def test_methods_improve_monotonically_and_stay_physical(method):
    g = resolve_workload("gemm", M=512, N=1024, K=1024)
    res = autotune_model(g, AutotuneConfig(method=method, **CFG))
    (t,) = res.kernels.values()
    assert t.key == gemm_key(_gemm_kernel(512, 1024, 1024))
    # the lowering's tiling (measured among its fewer-core and smaller-L1 choices: a
    # GEMM of the graph's inputs and weights, wia_hw._tiling._measured)
    (lowered,) = [x for _, ks in lower(g, SPEC) for x in ks if isinstance(x, GemmKernel)]
    assert t.default == lowered.tiling
    assert t.history[0] == t.default_cycles
    assert all(b <= a for a, b in zip(t.history, t.history[1:], strict=False))
    assert (
        t.best_cycles
        == t.history[-1]
        == measure_cycles(_gemm_kernel(512, 1024, 1024), t.best, SPEC)[0]
    )
    assert t.trials == min(CFG["max_trials"], t.pool_size) == len(t.history) - 1
    assert t.best_cycles >= t.floor_cycles > 0
    assert res.candidates == res.measured + res.pruned + res.cut + res.cache_hits >= t.trials + 1
    assert len(res.cold_walls_s) == res.cold


def test_ml_cost_models_are_deterministic_under_a_seed():
    g = resolve_workload("gemm", M=512, N=1024, K=1024)
    for model in ("gbt", "ridge"):
        cfg = AutotuneConfig(method="ml", cost_model=model, batch_size=4, **CFG)
        a, b = autotune_model(g, cfg), autotune_model(g, cfg)
        ka, kb = next(iter(a.kernels.values())), next(iter(b.kernels.values()))
        assert ka.history == kb.history and ka.best == kb.best
    # a shape whose default some candidates beat (512 x 1024 x 1024's default, measured
    # among the tiler's choices, is already the best of its pool: every walk is flat)
    g = resolve_workload("gemm", M=2048, N=2048, K=2048)
    r1 = autotune_model(g, AutotuneConfig(method="random", **CFG))
    r2 = autotune_model(g, AutotuneConfig(method="random", **{**CFG, "seed": 4}))
    h1, h2 = (next(iter(r.kernels.values())).history for r in (r1, r2))
    assert h1 != h2  # another seed, another walk


def test_identical_layers_share_one_kernel_key_and_names_select():
    g = _small_bert()
    res = autotune_model(g, AutotuneConfig(method="random", **{**CFG, "max_trials": 2}))
    by_op = {op: key for key, t in res.kernels.items() for op in t.ops}
    assert by_op["layer0.feed_forward_output"] == by_op["layer1.feed_forward_output"]
    layer_keys = [k for k, t in res.kernels.items() if t.ops[0].startswith("layer")]
    assert len(layer_keys) >= 5 and all(res.kernels[k].count >= 2 for k in layer_keys)
    assert len(res.kernels) < sum(t.count for t in res.kernels.values())
    key = by_op["layer0.attention_output_projection"]
    sel = autotune_model(
        g,
        AutotuneConfig(
            method="grid",
            kernels_to_tune=["layer1.feed_forward_output", key],
            **{**CFG, "max_trials": 2},
        ),
    )
    assert list(sel.kernels) == sorted(
        [by_op["layer1.feed_forward_output"], key],
        key=lambda k: (-res.kernels[k].count * _macs(res, k), k),
    )


def _macs(res, key):
    b, m, n, k = (int(x) for x in key.split()[1].split("x"))
    return b * m * n * k


# -- persistence and run ----------------------------------------------------------------


def test_schedules_file_round_trip_and_run_applies_them(tmp_path):
    g = _small_bert()
    res = autotune_model(g, AutotuneConfig(method="ml", **CFG))
    assert res.tuned_cycles < res.default_cycles
    path = res.save(tmp_path / "sched.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "wia-hw-schedules" and doc["version"] == 1
    assert {e["kernel"] for e in doc["entries"]} == set(res.schedules)
    assert all(e["spec_sha256"] == spec_hash(SPEC) for e in doc["entries"])
    assert load_schedules(path, SPEC) == res.schedules
    # another spec (half the L1) gets none of them
    other = open_device(
        "wia-npu", overrides={"memory.l1.size_kib": SPEC.memory.l1.size_bytes // 2048}
    )
    with pytest.warns(ScheduleDeviceWarning, match=r"no schedule for wia-npu"):
        assert load_schedules(path, other.spec) == {}
    # saving again merges (same bytes for the same schedules)
    before = path.read_bytes()
    res.save(path)
    assert path.read_bytes() == before
    # run applies them: tuned kernels carry the tuned tilings, the rest are unchanged
    tuned = lower(g, SPEC, schedules=load_schedules(path, SPEC))
    plain = lower(g, SPEC)
    for (_op, ks), (_, ks0) in zip(tuned, plain, strict=True):
        for k, k0 in zip(ks, ks0, strict=True):
            if isinstance(k, GemmKernel) and gemm_key(k) in res.schedules:
                assert k.tiling == res.schedules[gemm_key(k)]
            else:
                assert k == k0
    base = wia_hw.run(g)
    fast = wia_hw.run(g, schedules=path)
    assert fast.cycles < base.cycles
    assert fast.latency_ms >= fast.roofline_floor_ms
    assert wia_hw.run(g, schedules={}).to_json() == base.to_json()


def test_lowering_without_schedules_is_unchanged():
    g = _small_bert()
    assert lower(g, SPEC) == lower(g, SPEC, schedules=None) == lower(g, SPEC, schedules={})


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_trials": 0}, r"max_trials must be a positive integer, got 0: a budget of 0"),
        (
            {"time_budget_seconds": 0},
            r"time_budget_seconds must be positive .* got 0: a budget of 0",
        ),
        ({"time_budget_seconds": -1.0}, r"time_budget_seconds must be positive"),
        ({"method": "annealing"}, r"method must be one of grid, random, ml, got 'annealing'"),
        ({"cost_model": "xgb"}, r"cost_model must be one of gbt, ridge, got 'xgb'"),
        ({"batch_size": 0}, r"batch_size must be a positive integer, got 0"),
        ({"epsilon": 2.0}, r"epsilon must be in \[0, 1\], got 2.0"),
        ({"kernels_to_tune": "gemm"}, r"kernels_to_tune must be a list of names"),
    ],
)
def test_bad_config_is_one_line(kwargs, match):
    with pytest.raises(AutotuneError, match=match) as exc:
        AutotuneConfig(**kwargs)
    assert "\n" not in str(exc.value)


def test_unknown_kernel_name_is_one_line():
    g = resolve_workload("gemm", M=64, N=64, K=64)
    with pytest.raises(
        AutotuneError, match=r"kernels_to_tune: unknown kernel 'gemm2'.*'gemm'"
    ) as e:
        autotune_model(g, AutotuneConfig(kernels_to_tune=["gemm2"], **CFG))
    assert "\n" not in str(e.value)
    with pytest.raises(AutotuneError, match=r"config must be an AutotuneConfig, got dict"):
        autotune_model(g, {"method": "ml"})  # type: ignore[arg-type]
    with pytest.raises(AutotuneError, match=r"autotune_model takes a Graph, got str"):
        autotune_model("gemm", AutotuneConfig(**CFG))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", r"not a readable JSON schedule file"),
        ('{"format": "x"}', r"not a schedule file \(format must be 'wia-hw-schedules'\)"),
        ('{"format": "wia-hw-schedules", "version": 9, "entries": []}', r"version 9 is not 1"),
        (
            '{"format": "wia-hw-schedules", "version": 1, "entries": {}}',
            r"'entries' must be a list",
        ),
        (
            '{"format": "wia-hw-schedules", "version": 1, "entries": [3]}',
            r"entry 0 must be a mapping",
        ),
        (
            '{"format": "wia-hw-schedules", "version": 1, "entries": [{"kernel": "k"}]}',
            r"entry 0 needs a string 'spec_sha256'",
        ),
        (
            '{"format": "wia-hw-schedules", "version": 1, "entries": '
            '[{"kernel": "k", "spec_sha256": "h", "tiling": {"tm": 1}}]}',
            r"entry 0 \(k\): 'tiling' must map tm, tn, tk",
        ),
        (
            '{"format": "wia-hw-schedules", "version": 1, "entries": '
            '[{"kernel": "k", "spec_sha256": "h", "tiling": {"tm": 0, "tn": 1, "tk": 1}}]}',
            r"entry 0 \(k\): GemmTiling.tm must be a positive integer, got 0",
        ),
    ],
)
def test_bad_schedule_file_is_one_line(tmp_path, text, match):
    p = tmp_path / "s.json"
    p.write_text(text)
    with pytest.raises(ScheduleError, match=match) as e:
        load_schedules(p, SPEC)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_missing_schedule_file_in_run(tmp_path):
    g = resolve_workload("gemm", M=64, N=64, K=64)
    with pytest.raises(ScheduleError, match=r"nope.json: schedule file not found"):
        wia_hw.run(g, schedules=tmp_path / "nope.json")


def test_tiling_in_file_is_used_verbatim(tmp_path):
    """A hand-written entry applies to its kernel on its spec."""
    kern = _gemm_kernel(256, 256, 256)
    t = GemmTiling(tm=128, tn=256, tk=128, tb=1, order="nm")
    p = tmp_path / "s.json"
    p.write_text(
        json.dumps(
            {
                "format": "wia-hw-schedules",
                "version": 1,
                "entries": [
                    {
                        "kernel": gemm_key(kern),
                        "spec_sha256": spec_hash(SPEC),
                        "tiling": {"tm": 128, "tn": 256, "tk": 128, "tb": 1, "order": "nm"},
                    }
                ],
            }
        )
    )
    g = resolve_workload("gemm", M=256, N=256, K=256)
    res = wia_hw.run(g, schedules=p)
    alone = Device(SPEC).execute([replace(kern, tiling=t)])[0]
    (kt,) = [k for k in res.kernels if k.kind == "gemm"]
    assert kt.cycles == alone.end_cycle - alone.start_cycle


def test_measurements_file_makes_a_later_session_a_lookup(tmp_path):
    """Measurements written by one session answer the next one's every candidate it
    ran whole: no whole emulator run, the same schedules and histories (the candidates
    pruned or cut are decided again, the same way)."""
    g = resolve_workload("gemm", M=256, N=512, K=512)
    cfg = AutotuneConfig(method="random", **CFG)
    mfile = tmp_path / "m.json"
    first = autotune_model(g, cfg, measurements_file=mfile)
    text = mfile.read_text()
    _MEASURED.clear()
    _BOUNDS.clear()
    _SUSPENDED.clear()
    again = autotune_model(g, cfg, measurements_file=mfile)
    # what the first measured whole is a look-up now, as are its own look-ups (a
    # candidate equivalent to one measured before)
    assert again.measured == 0 and again.cache_hits == first.measured + first.cache_hits
    assert (again.pruned, again.cut) == (first.pruned, first.cut)
    (a,), (b,) = first.kernels.values(), again.kernels.values()
    assert a.history == b.history and a.best == b.best
    assert mfile.read_text() == text  # nothing new: the same bytes


def test_cache_key_separates_layouts():
    """Two kernels of one key whose operands are laid out differently (here B a view
    into another tensor) are measured apart."""
    kern = _gemm_kernel(128, 128, 128)
    moved = replace(kern, b=replace(kern.b, offset=64))
    assert gemm_key(moved) == gemm_key(kern)
    assert _cache_key(moved) != _cache_key(kern)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[", r"not a readable JSON measurements file"),
        ('{"format": "wia-hw-schedules", "version": 1}', r"not a measurements file"),
        (
            '{"format": "wia-hw-measurements", "version": 1, "entries": 3}',
            r"'entries' must be a list",
        ),
        (
            '{"format": "wia-hw-measurements", "version": 1, "entries": [["h", "k", 1]]}',
            r"entry 0: a row has 11 or 12 fields, got \[.h., .k., 1\]",
        ),
        (
            '{"format": "wia-hw-measurements", "version": 1, "entries": '
            '[["h", "k", 1, 1, 1, 1, "mn", -5, 0, 0, 0]]}',
            r"entry 0: cycles and bytes must be non-negative integers",
        ),
    ],
)
def test_bad_measurements_file_is_one_line(tmp_path, text, match):
    p = tmp_path / "m.json"
    p.write_text(text)
    g = resolve_workload("gemm", M=64, N=64, K=64)
    with pytest.raises(ScheduleError, match=match) as e:
        autotune_model(g, AutotuneConfig(**CFG), measurements_file=p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_method_takes_the_seed_enum_and_its_spellings():
    from wia_hw.optimize import AutotuneMethod

    for m in (AutotuneMethod.ML_GUIDED, "ml", "ML_GUIDED", "ml-guided"):
        assert AutotuneConfig(method=m).method == "ml"
    assert AutotuneConfig(method=AutotuneMethod.GRID).method == "grid"


def test_a_spent_time_budget_keeps_the_defaults():
    """A budget that runs out at once measures only the defaults and keeps them."""
    g = resolve_workload("gemm", M=256, N=256, K=256)
    res = autotune_model(
        g, AutotuneConfig(method="ml", time_budget_seconds=1e-9, max_trials=50, seed=0)
    )
    (t,) = res.kernels.values()
    assert t.trials == 0 and t.best == t.default and t.history == [t.default_cycles]
    assert res.schedules == {} and res.entries() == []


def test_gbt_without_scikit_learn_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.ensemble", None)
    g = resolve_workload("gemm", M=64, N=64, K=64)
    with pytest.raises(AutotuneError, match=r"cost_model='gbt' needs scikit-learn .*'ridge'"):
        autotune_model(g, AutotuneConfig(method="ml", **CFG))
    res = autotune_model(g, AutotuneConfig(method="ml", cost_model="ridge", **CFG))
    assert next(iter(res.kernels.values())).trials >= 1
