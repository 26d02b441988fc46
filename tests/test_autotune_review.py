"""Auto-tuning review findings: config errors name the field with a message true for
the value given; schedule files are validated against the device and say which device
they were for; the tuner never hands back schedules that make the graph slower on the
device it tuned for."""

from __future__ import annotations

import random

import numpy as np
import pytest

from wia_hw.optimize import AutotuneConfig, AutotuneError

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
