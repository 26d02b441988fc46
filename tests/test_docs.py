"""The README's examples run as written, and CI runs the README's test command."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_readme_python_examples_run(index, tmp_path, monkeypatch):
    """Each block runs in a fresh folder holding the README's extension manifests."""
    for block in re.findall(r"```yaml\n(.*?)```", README, flags=re.S):
        found = re.search(r"^extension_id: (\w+)", block, flags=re.M)
        if found:
            (tmp_path / f"{found.group(1)}.yaml").write_text(block)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WIA_HW_EXTENSION_PATH", str(tmp_path / "installed"))
    code = _python_blocks()[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {})


def test_readme_spec_example_is_valid(tmp_path):
    import yaml

    from wia_hw.spec import load_spec

    block = next(
        b for b in re.findall(r"```yaml\n(.*?)```", README, flags=re.S) if "schema_version" in b
    )
    p = tmp_path / "my-npu.yaml"
    p.write_text(block)
    assert yaml.safe_load(block)["name"] == "my-npu"
    spec = load_spec(p)
    assert spec.peak_flops("fp16") == pytest.approx(2 * 64 * 64 * 2 * 1e9)


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in README
    assert "wia-hw run bert-large" in README


def test_lint_is_clean():
    ruff = shutil.which("ruff") or str(Path(__import__("sys").executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install 'wia-hw[test]')")
    res = subprocess.run(
        [ruff, "check", "--quiet", str(ROOT)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_formatting_is_clean():
    """`ruff format` has been applied to the whole tree (CI runs this check)."""
    ruff = shutil.which("ruff") or str(Path(__import__("sys").executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install 'wia-hw[test]')")
    res = subprocess.run(
        [ruff, "format", "--check", "--quiet", str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, "run `ruff format .`:\n" + res.stdout + res.stderr
