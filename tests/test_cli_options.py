"""One set of device, workload and extension options across commands (run_options),
output kinds by suffix, --json with -o, and table widths in a pipe (issue #15)."""

from __future__ import annotations

import json
import re

import click
import numpy as np
import pytest
from click.testing import CliRunner

from wia_hw import SpecError
from wia_hw.cli import cli
from wia_hw.cli._common import PIPE_WIDTH, RunOptions, make_console, run_options
from wia_hw.profiling._flamegraph import parse_collapsed

GEMM = ["gemm", "-a", "M=128", "-a", "N=128", "-a", "K=128"]


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def _one_line_error(args: list[str], match: str) -> None:
    code, out, err = _cli(*args)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.search(match, lines[0]), lines[0]


def test_run_options_decorator_is_reusable():
    """A new command gets every option from one decorator and one RunOptions."""
    seen: dict[str, object] = {}

    @click.command("mine")
    @run_options
    @click.option("--seed", type=int, default=0)
    def mine(opts: RunOptions, seed: int) -> None:
        ctx = opts.open(seed=seed)
        r = ctx.run(opts.workload, **opts.run_kwargs())
        seen.update(opts=opts, prov=r.provenance)

    res = CliRunner().invoke(
        mine,
        [
            *GEMM,
            "-d",
            "wia-edge",
            "--set",
            "compute.cores=2",
            "--ext",
            "transformer_engine",
            "--ext-param",
            "transformer_engine.block_kv=64",
            "--seed",
            "4",
        ],
    )
    assert res.exit_code == 0, res.output
    opts = seen["opts"]
    assert isinstance(opts, RunOptions)
    assert opts.device == "wia-edge" and opts.builder == {"M": 128, "N": 128, "K": 128}
    assert opts.overrides == {"compute.cores": 2}
    assert opts.ext_params == {"transformer_engine": {"block_kv": "64"}}  # typed by open()
    prov = seen["prov"]
    assert isinstance(prov, dict)
    assert prov["spec"] == "wia-edge" and prov["seed"] == 4
    assert prov["extensions"][0]["parameters"]["block_kv"] == 64


def test_run_and_profile_share_the_option_set():
    def names(cmd: str) -> set[str]:
        return {o for p in cli.commands[cmd].params for o in p.opts}

    shared = {
        "-d",
        "--device",
        "--batch",
        "--seq",
        "--precision",
        "--arg",
        "--set",
        "--ext",
        "--ext-param",
        "--seed",
        "--json",
        "-o",
    }
    assert shared <= names("run") and shared <= names("profile")


def test_profile_takes_ext_and_its_parameters():
    code, out, err = _cli(
        "profile",
        "bert-base",
        "-b",
        "1",
        "-s",
        "32",
        "-a",
        "layers=1",
        "--ext",
        "transformer_engine",
        "--ext-param",
        "transformer_engine.block_q=64",
        "--json",
    )
    assert code == 0, err
    d = json.loads(out)
    assert {k["provider"] for k in d["kernels"]} >= {"transformer_engine"}
    assert d["provenance"]["extensions"][0]["parameters"]["block_q"] == 64


@pytest.mark.parametrize("suffix", [".folded", ".txt"])
def test_flamegraph_collapsed_stacks(tmp_path, suffix):
    f = tmp_path / f"flame{suffix}"
    code, _, err = _cli("profile", *GEMM, "--flamegraph", str(f))
    assert code == 0, err
    stacks = parse_collapsed(f.read_text().splitlines())
    # the counts are device cycles: they add up to the profiled time
    code, out, _ = _cli("profile", *GEMM, "--json")
    assert sum(n for _, n in stacks) == json.loads(out)["cycles"]


def test_flamegraph_drawn_as_svg_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    svg, png = tmp_path / "f.svg", tmp_path / "f.png"
    code, _, err = _cli("profile", *GEMM, "--flamegraph", str(svg))
    assert code == 0, err
    assert svg.read_text().startswith("<?xml") and "<svg" in svg.read_text()
    code, _, err = _cli("profile", *GEMM, "--flamegraph", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", ["flame.html", "flame"])
def test_flamegraph_unknown_kind_is_an_error_before_running(tmp_path, name):
    f = tmp_path / name
    _one_line_error(
        ["profile", *GEMM, "--flamegraph", str(f)],
        r"unknown kind .*\.svg or \.png draw it, \.folded or \.txt",
    )
    assert not f.exists()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--timeline", "{tmp}/no/t.json"], r"--timeline .*/no/t\.json: no folder .*/no$"),
        (
            ["--roofline", "{tmp}/r.svg"],
            r"--roofline .*r\.svg: unknown kind '\.svg': plots are PNG",
        ),
        (["--memory-timeline", "{tmp}/m.jpg"], r"--memory-timeline .*: unknown kind '\.jpg'"),
        (["--flamegraph", "{tmp}/no/f.svg"], r"--flamegraph .*: no folder"),
    ],
)
def test_profile_outputs_are_checked_before_running(tmp_path, args, match):
    """An output that cannot be written is refused before the profile runs (it was
    found only after the whole run)."""
    _one_line_error(["profile", *GEMM, *[a.format(tmp=tmp_path) for a in args]], match)


@pytest.mark.parametrize(
    "args", [["--confidence", "2"], ["--confidence", "-1"], ["--kernels", "-1"]]
)
def test_profile_option_ranges(args):
    res = CliRunner().invoke(cli, ["profile", *GEMM, *args])
    assert res.exit_code == 2 and "is not in the range" in res.output


def test_save_flamegraph_refuses_unknown_suffix(tmp_path):
    import wia_hw
    from wia_hw import WiaError
    from wia_hw.profiling import ProfilingConfig

    r = wia_hw.run("gemm", M=64, N=64, K=64, profile=ProfilingConfig())
    with pytest.raises(WiaError, match=r"unknown flamegraph kind '\.png8'"):
        r.profile.save_flamegraph(tmp_path / "x.png8")


@pytest.mark.parametrize("cmd", ["run", "profile"])
def test_json_goes_to_stdout_and_o_writes_a_file_too(tmp_path, cmd):
    f = tmp_path / "r.json"
    code, out, err = _cli(cmd, *GEMM, "--json", "-o", str(f))
    assert code == 0, err
    assert json.loads(out) == json.loads(f.read_text())


def test_run_text_with_o_writes_the_json_and_prints_the_text(tmp_path):
    f = tmp_path / "r.json"
    code, out, _ = _cli("run", *GEMM, "-o", str(f))
    assert code == 0 and "Operation Breakdown" in out
    assert json.loads(f.read_text())["workload"] == "gemm"


def test_tables_take_their_natural_width_in_a_pipe():
    # CliRunner's output is not a terminal: no cell is cut with an ellipsis
    code, out, _ = _cli("specs", "list")
    assert code == 0 and "…" not in out
    assert max(map(len, out.splitlines())) > 80
    code, out, _ = _cli("run", "bert-base", "-b", "1", "-s", "32", "-a", "layers=2")
    assert code == 0 and "…" not in out
    assert not make_console().is_terminal and make_console().width == PIPE_WIDTH


def test_width_option_sets_the_table_width():
    code, out, _ = _cli("specs", "list", "--width", "100")
    assert code == 0
    assert max(map(len, out.splitlines())) <= 100
    assert _cli("specs", "list", "--width", "10")[0] == 2  # below 40 columns: refused


def test_run_groups_identical_kernels_across_layers():
    code, out, _ = _cli("run", "bert-base", "-b", "1", "-s", "32", "-a", "layers=3", "--top", "50")
    assert code == 0
    rows = [ln for ln in out.splitlines() if ln.startswith("│ ")]
    assert not any(re.match(r"│ layer\d+\.", r) for r in rows)
    ffn = [r for r in rows if "feed_forward_intermediate" in r]
    assert len(ffn) == 1 and re.search(r"│\s+3\s+│", ffn[0])  # n = 3 layers


def test_plots_without_matplotlib_are_skipped_in_one_line_each(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    roof, flame, folded = tmp_path / "r.png", tmp_path / "f.png", tmp_path / "f.folded"
    code, out, err = _cli(
        "profile", *GEMM, "--roofline", str(roof), "--flamegraph", str(flame), "--recommend"
    )
    assert code == 0, err
    assert not roof.exists() and not flame.exists()
    skipped = [ln for ln in err.splitlines() if "skipped" in ln]
    assert len(skipped) == 2 and all("pip install 'wia-hw[plot]'" in ln for ln in skipped)
    # everything else is printed: the roofline analysis and the recommendations
    assert "Roofline analysis:" in out and "Recommendations" in out
    code, _, err = _cli("profile", *GEMM, "--flamegraph", str(folded))
    assert code == 0 and folded.read_text().strip() and "skipped" not in err


def test_json_with_plots_writes_them_too(tmp_path):
    pytest.importorskip("matplotlib")
    roof = tmp_path / "r.png"
    code, out, err = _cli("profile", *GEMM, "--roofline", str(roof), "--json")
    assert code == 0, err
    assert json.loads(out)["schema"] == "wia-hw.profile/1"
    assert roof.read_bytes()[:4] == b"\x89PNG"


def test_builder_arguments_stand_for_the_workload_options() -> None:
    from click.testing import CliRunner

    from wia_hw.cli import cli

    gemm = ["run", "gemm", "-a", "M=64", "-a", "N=64", "-a", "K=64"]
    ok = CliRunner().invoke(cli, [*gemm, "-a", "precision=int8", "--json"])
    assert ok.exit_code == 0, ok.output
    assert '"precision": "int8"' in ok.output
    bad = CliRunner().invoke(cli, [*gemm, "-a", "precision=int8", "--precision", "fp16"])
    assert bad.exit_code == 2
    assert bad.output.strip() == (
        "wia-hw: error: -a precision=int8 contradicts --precision fp16; give one of them"
    )


_TAGGED = """\
schema_version: 1
extension_id: tagged
version: "1.0"
requires: {wia_hw: ">=0.1, <1.0"}
capabilities: [structured_sparsity]
parameters:
  tag: {type: str, default: "none"}
  keep: {type: int, default: 2, min: 1, max: 4}
  scale: {type: float, default: 1.0, min: 0}
  flag: {type: bool, default: false}
operations:
  - name: tagged_linear
    claims: [linear, matmul]
    compose: [matmul]
    cost:
      cycles: "B * ceil(M / array_rows) * ceil(N / array_cols) * (ceil(K * keep / rate) + 2 * array_rows + array_cols - 2)"
      macs: "B * M * N * K"
"""


def _tagged(tmp_path, *items: str):
    from wia_hw.cli._common import extension_params

    p = tmp_path / "tagged.yaml"
    p.write_text(_TAGGED)
    opts = RunOptions("gemm", extensions=(str(p),), ext_params=extension_params(items))
    return p, opts


def test_ext_param_of_a_str_parameter_is_the_text_as_given(tmp_path):
    # seeded texts YAML would read as a mapping, list, number, bool, null or comment
    rng = np.random.default_rng(7)
    alphabet = list("ab:,{}[]#&*!|>'\" -0123.") + ["yes", "null", "~", "names:"]
    texts = ["names:", "a: b", "[1, 2]", "{x: 1}", "12", "true", "~", "", " spaced "]
    texts += ["".join(rng.choice(alphabet, rng.integers(1, 12))) for _ in range(40)]
    for text in texts:
        _, opts = _tagged(tmp_path, f"tagged.tag={text}", "tagged.keep=3")
        ext = opts.open().extensions["tagged"]
        assert ext.values["tag"] == text and type(ext.values["tag"]) is str
        assert ext.values["keep"] == 3


@pytest.mark.parametrize(
    "item, match",
    [
        ("tagged.keep=abc", r"must be an integer, got 'abc'"),
        ("tagged.keep=names:", r"must be an integer, got \{'names': None\}"),
        ("tagged.keep=9", r"value 9 is above the maximum 4"),
        ("tagged.scale=-1", r"value -1\.0 is below the minimum 0"),
        ("tagged.flag=maybe", r"must be true or false, got 'maybe'"),
    ],
)
def test_a_bad_ext_param_value_names_the_option_not_the_manifest(tmp_path, item, match):
    p, opts = _tagged(tmp_path, item)
    name = item.partition("=")[0]
    with pytest.raises(SpecError, match=rf"^--ext-param {re.escape(name)}: {match}") as e:
        opts.open()
    assert str(p) not in str(e.value) and "\n" not in str(e.value)


def test_an_empty_analog_policy_name_list_is_one_line():
    _one_line_error(
        [
            "run",
            "bert-base",
            "-b",
            "1",
            "-s",
            "8",
            "-a",
            "layers=1",
            "--ext",
            "analog",
            "--ext-param",
            "analog.policy=names:",
        ],
        r"error: .*policy must be one of none, all, all_but_first_last, names:OP\[,OP\.\.\.\]; "
        r"got 'names:'$",
    )


@pytest.fixture
def terminal_progress(monkeypatch):
    """Progress shown at once on a fake terminal; returns its buffer."""
    import io

    from rich.console import Console

    import wia_hw.cli._common as common

    buf = io.StringIO()
    monkeypatch.setattr(common, "PROGRESS_DELAY", 0)
    monkeypatch.setattr(
        common, "progress_console", lambda: Console(file=buf, force_terminal=True, width=150)
    )
    return buf


def test_progress_is_silent_when_stderr_is_not_a_terminal():
    import io

    from rich.console import Console

    from wia_hw.cli._common import TaskProgress

    buf = io.StringIO()
    with TaskProgress("emulating", console=Console(file=buf)) as bar:
        bar.update(1, 2, "gemm")
    assert buf.getvalue() == ""


def test_progress_on_a_terminal_shows_label_count_and_step(terminal_progress):
    from wia_hw.cli._common import task_progress

    with task_progress("measuring", unit="iterations") as bar:
        bar.update(3, 10, "warm-up")
        bar._bar.refresh()
    shown = terminal_progress.getvalue()
    assert "measuring" in shown and "3/10 iterations" in shown and "warm-up" in shown


def test_run_progress_shows_while_a_one_op_run_runs(terminal_progress):
    """A one-op run (the runtime reports between ops only) still shows the line at
    once (a timer shows it, not the next op); stdout is unchanged."""
    plain = _cli("run", *GEMM)
    code, out, _ = _cli("run", *GEMM)
    assert code == 0 and out == plain[1]
    shown = terminal_progress.getvalue()
    assert "emulating" in shown and "1/1 ops" in shown


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["rnu"], r"No such command 'rnu'\. Did you mean 'run'\? \(see '(?:wia-hw|cli) --help'\)"),
        (
            ["run", "gemm", "--bach", "3"],
            r"No such option '--bach'.*\(see '(?:wia-hw|cli) run --help'\)",
        ),
        (
            ["run", "gemm", "-b", "abc"],
            r"Invalid value for '-b' / '--batch': 'abc' is not a valid integer.*'(?:wia-hw|cli) run --help'",
        ),
        (["specs", "shwo"], r"No such command 'shwo'.*\(see '(?:wia-hw|cli) specs --help'\)"),
        (["--bogus"], r"No such option '--bogus'\. \(see '(?:wia-hw|cli) --help'\)"),
    ],
)
def test_usage_errors_are_one_line(args, match):
    """click's usage errors (unknown command or option, a bad value) were four lines
    (usage, a hint, a blank, the error); the README promises one."""
    _one_line_error(args, r"^wia-hw: error: " + match)


def test_a_group_without_a_command_still_shows_its_help():
    res = CliRunner().invoke(cli, ["specs"])
    assert "Usage: cli specs" in res.output or "Usage: wia-hw specs" in res.output


def test_serve_progress_shows_the_rate_search_on_a_terminal_only(terminal_progress):
    args = ["serve", "bert-base", "-a", "layers=1", "-s", "16", "--p99-bound", "20"]
    args += ["--duration", "0.05", "--max-batch-size", "8", "--json"]
    code, out, _ = _cli(*args)
    assert code == 0 and json.loads(out)["max_rate"]
    shown = terminal_progress.getvalue()
    assert "serving" in shown and "rate search, run " in shown


MAIN = ["run", "bench", "case-study", "serve", "train", "import", "collectives", "specs", "profile"]


@pytest.mark.parametrize("command", MAIN)
def test_help_has_examples_and_every_option_a_description(command):
    code, out, _ = _cli(command, "--help")
    assert code == 0 and "Examples:\n" in out and f"wia-hw {command} " in out
    cmd = cli.commands[command]
    bare = [p.name for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert not bare, bare


def test_run_help_names_every_kind_of_workload_and_device():
    _, out, _ = _cli("run", "--help")
    flat = " ".join(out.split())
    assert ".onnx file" in flat and "SCALE-Sim topology .csv" in flat and ".cfg" in flat
