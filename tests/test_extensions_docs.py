"""docs/EXTENSIONS.md: the worked YAML-only example registers, runs as written and
prints what the page shows."""

from __future__ import annotations

import contextlib
import io
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
    blocks = re.findall(r"```(\w*)\n(.*?)```", DOC, flags=re.S)
    python = [i for i, (lang, _) in enumerate(blocks) if lang == "python"]
    assert python, "the worked example has a python block"
    for i in python:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(blocks[i][1], f"docs/EXTENSIONS.md block {i}", "exec"), {})
        if i + 1 < len(blocks) and blocks[i + 1][0] == "":  # the output the page shows
            assert buf.getvalue() == blocks[i + 1][1]
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


def test_a_sparse_unit_never_shows_more_than_peak(tmp_path):
    """Utilisation and the roofline floor count the MACs the unit executes: at 1 of 4
    weights kept, the dense-equivalent FLOPs would be 2.4x the array's peak."""
    import wia_hw

    (manifest,) = [b for b in _blocks("yaml") if "extension_id: sparse_tensor_unit" in b]
    (tmp_path / "sparse.yaml").write_text(manifest)
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(
        ctx, wia_hw.load_extension(tmp_path / "sparse.yaml"), parameters={"keep": 1}
    )
    r = ctx.run("gemm", M=2048, N=2048, K=2048)
    unit = r.extensions["sparse_tensor_unit"]
    assert unit["executed_macs"] * 4 == unit["dense_macs"]
    assert r.flops == 2 * unit["executed_macs"]
    assert 0 < r.compute_utilization <= 100
    assert r.latency_ms >= r.roofline_floor_ms
