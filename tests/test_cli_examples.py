"""Every ``wia-hw`` command line of the README and the docs pages runs and exits 0.

Issue #15: a newcomer who runs the README's quick start and then each CLI line of the
README (and of docs/*.md) must get exit status 0 from every one. This runner reads the
shell blocks of those pages (```sh, ```bash, ```console, and untagged blocks whose lines
start with ``wia-hw `` or ``$ wia-hw``), joins ``\\`` continuations, drops trailing
``# comments`` and, in blocks with ``$`` prompts, the output lines, splits ``&&`` chains
and runs each ``wia-hw ...`` command in order, in one fresh folder per block, in-process
through click's ``CliRunner`` on :data:`wia_hw.cli.cli` (so a later line reads what an
earlier line of the same block wrote). ``cmd > FILE`` writes the command's stdout to FILE;
``export NAME=VALUE`` sets an environment variable for the rest of the block.

Inputs the pages assume exist are provided in every block's folder:

- a ```yaml block whose paragraph names ``something.yaml`` (README: "``wia-hw specs show
  wia-edge > my-npu.yaml``", EXTENSIONS.md: "Save this as ``sparse_tensor_unit.yaml``")
  is written under that name, as a reader following the page would;
- ``model.onnx`` is the ResNet-50 export of ``tests/data/onnx`` (the pages use it as "your
  ONNX model" and run it with ``--batch`` alone, which fixes only a free leading dim:
  docs/ONNX.md);
- ``examples/`` is the repository's (sweep files are given by that relative path).

Not run (the project's CI runs them itself, or they are not ``wia-hw`` commands):
``scripts/setup`` (CI's own set-up), ``python -m pytest ...`` (the suite itself),
``gtkwave`` (a viewer), and the benchmarks, too slow for a test:
``python benchmarks/silicon.py`` and ``python benchmarks/silicon.py --quick``
(docs/VALIDATION.md). The few ``wia-hw`` lines that cannot run here are in :data:`SKIP`
with the reason.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from wia_hw.cli import cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"sh", "bash", "shell", "console", ""}
WIA_HW = {"wia-hw", ".venv/bin/wia-hw"}
SHELL_OPS = {"&&", ">", "|"}
ONNX_MODEL = ROOT / "tests" / "data" / "onnx" / "resnet50.legacy.onnx"

#: command line (its words as on the page, comment dropped) -> why it is not run here
SKIP = {
    "wia-hw sweep examples/sweeps/array-vs-hbm.yaml --scheduler HOST:8786 "
    "--store array-vs-hbm.sqlite": "needs a running Dask scheduler at HOST:8786; the same "
    "sweep with --workers 2 runs on the line before",
    "wia-hw sweep FILE [--workers N] [--scheduler HOST:PORT] [--store FILE] "
    "[--retry-failed] [--json]": "usage synopsis with placeholders, not a command",
}

#: commands that take over ~10 s on a shared 2-core machine (measured): their blocks are
#: marked ``slow`` (still run by plain ``pytest``, as CI does; ``-m "not slow"`` skips them)
SLOW = (
    "wia-hw case-study bert-large",  # 24 layers, auto-tuning, batching search: ~80 s
    "wia-hw sweep examples/sweeps/array-vs-hbm.yaml",  # 9 BERT-Large runs: 6-13 s
)


@dataclass(frozen=True)
class Block:
    page: str
    index: int  # the fenced block's position on its page, counting every fence
    lines: tuple[str, ...]  # the command lines, continuations joined, comments dropped


def _fences(text: str) -> list[tuple[str, str, str]]:
    """(language, body, the paragraph right before the fence) of every fenced block."""
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        before = text[: m.start()].rstrip().split("\n\n")[-1]
        out.append((m.group(1), m.group(2), before))
    return out


def _is_shell(lang: str, body: str) -> bool:
    if lang not in SHELL_LANGS:
        return False
    if lang:
        return True
    return any(ln.startswith(("wia-hw ", "$ wia-hw")) for ln in body.splitlines())


def _command_lines(body: str) -> list[str]:
    """The commands of a shell block, one string each, without prompts or output."""
    joined: list[str] = []
    cur = ""
    for raw in body.splitlines():
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        joined.append(cur + raw)
        cur = ""
    prompted = any(ln.startswith("$ ") for ln in joined)
    out = []
    for ln in joined:
        if prompted:
            if not ln.startswith("$ "):
                continue  # output shown under the command
            ln = ln[2:]
        elif not ln.strip() or ln.lstrip().startswith("#"):
            continue
        words = shlex.split(ln, comments=True)
        if words:
            out.append(" ".join(w if w in SHELL_OPS else shlex.quote(w) for w in words))
    return out


def _plain(line: str) -> str:
    """The line's words joined by single spaces, unquoted (the form :data:`SKIP` uses)."""
    return " ".join(shlex.split(line))


def _blocks() -> list[Block]:
    out = []
    for page in PAGES:
        for i, (lang, body, _) in enumerate(_fences(page.read_text())):
            if _is_shell(lang, body):
                lines = tuple(_command_lines(body))
                if any(_wia_hw_commands(ln) for ln in lines):
                    out.append(Block(page.relative_to(ROOT).as_posix(), i, lines))
    return out


def _wia_hw_commands(line: str) -> list[list[str]]:
    """The ``wia-hw`` commands of one line (``a && b`` is two), each as its words."""
    words = shlex.split(line)
    cmds: list[list[str]] = [[]]
    for w in words:
        if w == "&&":
            cmds.append([])
        else:
            cmds[-1].append(w)
    return [c for c in cmds if c and c[0] in WIA_HW]


def _page_files(page: str) -> dict[str, str]:
    """name -> content of the YAML files a page tells its reader to save."""
    files = {}
    for lang, body, before in _fences((ROOT / page).read_text()):
        names = re.findall(r"[\w.-]+\.yaml", before)
        if lang == "yaml" and names:
            files[names[-1]] = body
    return files


BLOCKS = _blocks()


def _params():
    for b in BLOCKS:
        first = _wia_hw_commands(next(ln for ln in b.lines if _wia_hw_commands(ln)))[0]
        slow = any(c in ln for c in SLOW for ln in b.lines)
        marks = [pytest.mark.slow] if slow else []
        runnable = [ln for ln in b.lines if _wia_hw_commands(ln) and _plain(ln) not in SKIP]
        if not runnable:
            reasons = "; ".join(SKIP[_plain(ln)] for ln in b.lines if _plain(ln) in SKIP)
            marks.append(pytest.mark.skip(reason=reasons))
        yield pytest.param(b, id=f"{b.page}-block{b.index}-{first[1]}", marks=marks)


def test_the_pages_have_cli_examples():
    pages = {b.page for b in BLOCKS}
    assert "README.md" in pages
    # the README's quick start (after scripts/setup) is one of them
    assert any("wia-hw run bert-large --batch 32 --seq 128" in ln for b in BLOCKS for ln in b.lines)


def test_the_parser_reads_prompts_continuations_comments_and_chains():
    body = "$ wia-hw a --x 1 \\\n    --y 2   # note\n  output line\n$ wia-hw b && wia-hw c\n"
    lines = _command_lines(body)
    assert lines == ["wia-hw a --x 1 --y 2", "wia-hw b && wia-hw c"]
    assert _wia_hw_commands(lines[1]) == [["wia-hw", "b"], ["wia-hw", "c"]]
    assert _wia_hw_commands("scripts/setup && .venv/bin/wia-hw run x") == [
        [".venv/bin/wia-hw", "run", "x"]
    ]


def test_every_skip_and_slow_entry_is_a_line_of_a_page():
    lines = {_plain(ln) for b in BLOCKS for ln in b.lines}
    for line in SKIP:
        assert line in lines, f"SKIP names no command of the pages: {line}"
    for prefix in SLOW:
        assert any(prefix in ln for ln in lines), f"SLOW names no command of the pages: {prefix}"


def _files(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` (the ``examples`` link not followed)."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.relative_to(folder).as_posix().startswith("examples/")
    }


#: (command words, the named input files' bytes, exported variables) -> (stdout, files
#: the command wrote); an identical command on identical inputs already run in this
#: session (the README repeats a few lines of the docs) is not emulated again: wia-hw is
#: deterministic, and the one run asserted its exit status
_DONE: dict[tuple, tuple[str, dict[str, bytes]]] = {}


@pytest.mark.parametrize("block", list(_params()))
def test_cli_example_block_exits_0(block: Block, tmp_path, monkeypatch):
    for name, content in _page_files(block.page).items():
        (tmp_path / name).write_text(content)
    shutil.copyfile(ONNX_MODEL, tmp_path / "model.onnx")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    # `wia-hw ext register` installs here, not in the user's ~/.config
    monkeypatch.setenv("WIA_HW_EXTENSION_PATH", str(tmp_path / "installed-extensions"))
    runner = CliRunner()
    exported: dict[str, str] = {}
    ran = 0
    for line in block.lines:
        words = shlex.split(line)
        if words[0] == "export":
            for assignment in words[1:]:
                name, _, value = assignment.partition("=")
                monkeypatch.setenv(name, value)
                exported[name] = value
            continue
        if _plain(line) in SKIP:
            continue
        for cmd in _wia_hw_commands(line):
            target = None
            if ">" in cmd:
                at = cmd.index(">")
                cmd, target = cmd[:at], cmd[at + 1]
            assert "|" not in cmd, f"{block.page}: a pipe is not a wia-hw command: {line}"
            before = _files(tmp_path)
            inputs = tuple(sorted((w, before[w]) for w in cmd if w in before))
            key = (tuple(cmd[1:]), inputs, tuple(sorted(exported.items())))
            start = time.perf_counter()
            if key in _DONE:
                stdout, wrote = _DONE[key]
                for name, data in wrote.items():
                    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp_path / name).write_bytes(data)
                how = "(identical command already run: its files copied)"
            else:
                result = runner.invoke(cli, cmd[1:], env=dict(os.environ))
                assert result.exit_code == 0, (
                    f"{block.page} block {block.index}: `{shlex.join(cmd)}` exited "
                    f"{result.exit_code}\n{result.output}\n"
                    + "".join(
                        traceback.format_exception(*result.exc_info) if result.exc_info else []
                    )
                )
                stdout = result.stdout
                after = _files(tmp_path)
                wrote = {n: d for n, d in after.items() if before.get(n) != d}
                _DONE[key] = (stdout, wrote)
                how = ""
            print(f"{time.perf_counter() - start:7.2f} s  {shlex.join(cmd)} {how}")
            if target is not None:
                Path(target).write_text(stdout)
            ran += 1
    assert ran, f"{block.page} block {block.index} ran no command"
