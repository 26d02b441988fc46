"""Inputs users bring to ``wia_hw.run`` and generation that used to escape the checks:
a mapping of schedules (checked as a schedule file's entries are), and a generation
that ends at the model's last positions."""

from __future__ import annotations

import warnings

import pytest

import wia_hw
from wia_hw import GraphBuilder
from wia_hw.lowering import GemmTiling
from wia_hw.optimize import ScheduleError

KEY = "linear 1x64x256x256 fp16->2B b+bias"


def _graph():
    b = GraphBuilder("ffn", "fp16")
    x = b.input("x", (64, 256))
    y = b.linear("fc", x, 256)
    b.op("gelu", "act", [y])
    return b.graph()


def test_a_mapping_of_schedules_is_checked_like_a_file():
    g = _graph()
    base = wia_hw.run(g)
    good = wia_hw.run(g, schedules={KEY: GemmTiling(tm=64, tn=128, tk=128, order="nm")})
    as_dict = wia_hw.run(g, schedules={KEY: {"tm": 64, "tn": 128, "tk": 128, "order": "nm"}})
    assert good.provenance["run"]["schedules_used"] == 1
    assert as_dict.cycles == good.cycles and good.cycles != base.cycles
    bad = [
        ({KEY: GemmTiling(tm=7, tn=128, tk=128)}, r"tiling\.tm=7 is neither a multiple"),
        ({KEY: GemmTiling(tm=64, tn=256, tk=100000)}, r"tiling\.tk=100000 is above"),
        ({KEY: {"tm": 64, "tn": 128}}, r"a tiling maps tm, tn, tk"),
        ({KEY: {"tm": 64, "tn": 128, "tk": 128, "tz": 1}}, r"a tiling maps tm, tn, tk"),
        ({KEY: 5}, r"must be a GemmTiling or a mapping"),
        ({"linear": GemmTiling(tm=64, tn=128, tk=128)}, r"is not a GEMM kernel key"),
        ({3: GemmTiling(tm=64, tn=128, tk=128)}, r"is not a kernel key"),
        (5, r"schedules must be a path to a schedule file or a mapping"),
    ]
    for schedules, match in bad:
        with pytest.raises(ScheduleError, match=match) as e:
            wia_hw.run(g, schedules=schedules)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("prompt_len, new_tokens", [(1022, 2), (1023, 2), (1022, 3), (1021, 3)])
def test_generation_may_end_at_the_models_last_position(prompt_len, new_tokens):
    """GPT-2 has 1024 positions: a request that fits them runs (the decode probe read
    one and two positions past the first step, past the model's end)."""
    r = wia_hw.generate("gpt2", new_tokens=new_tokens, prompt_len=prompt_len, layers=1, batch=1)
    assert [s.kv_len for s in r.steps] == list(range(prompt_len, prompt_len + new_tokens - 1))
    exact = wia_hw.generate(
        "gpt2", new_tokens=new_tokens, prompt_len=prompt_len, layers=1, batch=1, method="exact"
    )
    for s, x in zip(r.steps, exact.steps, strict=True):
        if s.source == "emulated":  # emulated steps are the exact method's
            assert s.cycles == x.cycles
        else:  # the probe's cached steps are within its documented error (GENERATION.md:
            # 0.56% at most over 1,023 steps; a long cache fills the L2 the probe misses)
            assert abs(s.cycles - x.cycles) <= 6e-3 * x.cycles
    with pytest.raises(wia_hw.WorkloadError, match="generate: prompt_len"):
        wia_hw.generate(
            "gpt2", new_tokens=new_tokens + 1, prompt_len=1024 - new_tokens + 1, layers=1, batch=1
        )


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_vector_kernels_are_labelled_with_their_own_precision(precision):
    """A vector kernel's record names its output's dtype (an fp32 run's ReLU, adds and
    softmax were labelled fp16)."""
    r = wia_hw.run("bert-base", batch=1, seq=32, layers=1, precision=precision)
    assert {k.precision for k in r.kernels} == {precision}


def test_report_cli_names_the_missing_folder_as_the_docs_say(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from wia_hw.cli import cli

    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(
        cli, ["run", "gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64", "--json", "-o", "run.json"]
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["report", "run.json", "-o", "out/page.html"])
    assert r.exit_code == 2
    assert "cannot write out/page.html: no folder out" in r.output


def test_training_says_when_its_power_would_throttle_the_die():
    """Kernels are timed alone from the initial temperature; a step's mean power and
    the temperature it holds the die at are reported, and a device that would throttle
    under it is flagged (failed cooling trained exactly as fast, silently)."""
    from wia_hw.train import TrainingThermalWarning

    def cluster(device):
        return dict(
            schema_version=1,
            name=f"{device}-4",
            devices=4,
            device=device,
            links=dict(topology="ring", bandwidth_gbs=100, latency_us=2.0),
        )

    kw = dict(batch=4, seq=64, layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingThermalWarning)
        cool = wia_hw.train_iteration("bert-base", cluster=cluster("wia-npu"), **kw)
    assert not cool.would_throttle and "settles at" in cool.summary()
    spec = wia_hw.load_spec("wia-npu")
    assert cool.mean_power_w > spec.static_power_w
    th = spec.thermal
    assert cool.sustained_temperature_c == pytest.approx(
        th.ambient_c + cool.mean_power_w * th.resistance_c_per_w
    )
    with pytest.warns(TrainingThermalWarning, match="above its throttle point"):
        hot = wia_hw.train_iteration("bert-base", cluster=cluster("wia-npu-passive"), **kw)
    assert hot.would_throttle and "a throttling clock would make" in hot.summary()
    assert hot.to_dict()["sustained_temperature_c"] > hot.throttle_c
