"""docs/EXTENSIONS.md: the worked YAML-only example registers and runs as written."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from wia_hw.cli import cli

DOC = (Path(__file__).resolve().parent.parent / "docs" / "EXTENSIONS.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)


def test_worked_example_registers_and_runs(tmp_path, monkeypatch):
    (manifest,) = [b for b in _blocks("yaml") if "extension_id: sparse_tensor_unit" in b]
    (tmp_path / "sparse_tensor_unit.yaml").write_text(manifest)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WIA_HW_EXTENSION_PATH", str(tmp_path / "installed"))
    python = _blocks("python")
    assert python, "the worked example has a python block"
    for i, code in enumerate(python):
        exec(compile(code, f"docs/EXTENSIONS.md python block {i}", "exec"), {})
    res = CliRunner().invoke(cli, ["ext", "validate", "sparse_tensor_unit.yaml"])
    assert res.exit_code == 0 and "ok (extension 'sparse_tensor_unit' 1.0" in res.output


def test_seed_mapping_names_exist():
    """Every Python name in the seed-mapping table resolves (``X.Y`` as an attribute)."""
    import importlib

    import wia_hw

    table = DOC.split("## Built-in extensions")[0]
    rows = [
        line.split("|")[2]
        for line in table.splitlines()
        if line.startswith("| `wia") or line.startswith("| `WIA")
    ]
    assert len(rows) >= 10
    checked = 0
    for cell in rows:
        cell = re.sub(r"\([^)]*\)", "", cell)
        for token in re.findall(r"`([\w.]+)`", cell):
            parts = token.split(".")
            obj = (
                importlib.import_module(".".join(parts[:3]))
                if parts[0] == "wia_hw" and len(parts) > 3
                else wia_hw
            )
            for attr in (
                parts[3:]
                if parts[0] == "wia_hw" and len(parts) > 3
                else parts[1:]
                if parts[0] == "wia_hw"
                else parts
            ):
                obj = getattr(obj, attr)
            checked += 1
    assert checked >= 20
