"""Manifest checks (issue #15 item 5): unknown keys named with a suggestion, and cost
expressions that divide by zero or go negative for some in-range parameter value or
tile refused at validate time, with file, line and field."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from wia_hw import SpecError
from wia_hw.cli import cli
from wia_hw.registry import load_extension
from wia_hw.registry._expr import ExprError, compile_expr

BASE = """\
schema_version: 1
extension_id: checked_unit
version: "1.0"
parameters:
  tile: {type: int, default: 16, min: 1, max: 128}
operations:
  - name: checked_linear
    claims: [linear, matmul]
    compose: [matmul]
    cost:
      cycles: "B * ceil(M / array_rows) * ceil(N / array_cols) * (ceil(K / rate) + 2 * array_rows + array_cols - 2) + tile"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "m.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def _line(p: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(p.read_text().splitlines(), 1) if needle in ln)


def _refused(p: Path, field: str, pattern: str, needle: str) -> SpecError:
    with pytest.raises(SpecError, match=pattern) as ei:
        load_extension(p)
    e = ei.value
    assert e.file == str(p) and e.field == field and e.line == _line(p, needle), e
    assert str(e).startswith(f"{p}:{e.line}: {field}: ") and "\n" not in str(e)
    # the CLI: one line, exit 2
    r = CliRunner().invoke(cli, ["ext", "validate", str(p)])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert re.search(pattern, r.stderr)
    return e


def test_the_base_manifest_is_valid(tmp_path):
    p = _write(tmp_path, BASE)
    assert load_extension(p).id == "checked_unit"
    r = CliRunner().invoke(cli, ["ext", "validate", str(p)])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    ("old", "new", "field", "pattern", "needle"),
    [
        (
            "      cycles:",
            "      cycle:",
            "operations.0.cost.cycle",
            r"unknown key 'cycle' \(did you mean 'cycles'\?\)",
            "cycle:",
        ),
        (
            "    compose:",
            "    compse:",
            "operations.0.compse",
            r"unknown key 'compse' \(did you mean 'compose'\?\)",
            "compse:",
        ),
        (
            "parameters:",
            "paramters:",
            "paramters",
            r"unknown field 'paramters' \(did you mean 'parameters'\?\)",
            "paramters:",
        ),
        (
            "min: 1,",
            "mn: 1,",
            "parameters.tile.mn",
            r"unknown key 'mn' \(did you mean 'min'\?\)",
            "mn: 1",
        ),
        (
            "      cycles:",
            "      flops: '1'\n      cycles:",
            "operations.0.cost.flops",
            r"unknown key 'flops' \(known: cycles, macs, energy_pj\)",
            "flops:",
        ),
    ],
)
def test_unknown_keys_are_named(tmp_path, old, new, field, pattern, needle):
    p = _write(tmp_path, BASE.replace(old, new, 1))
    _refused(p, field, pattern, needle)


@pytest.mark.parametrize(
    ("cost", "pattern"),
    [
        # the parameter's own lower bound divides by zero
        ('"M * K / (tile - 1) + 1"', r"division by zero .* for K=1, M=1, tile=1"),
        # a one-row tile of the grid divides by zero, whatever the parameter
        ('"K / (M - 1) + tile"', r"division by zero .* for K=1, M=1, tile=16"),
        # negative on a small tile: 1 - 100 cycles
        ('"M * N * K - 100"', r"is negative \(-99\) for K=1, M=1, N=1"),
        # negative only at the top of the parameter's range
        ('"M * N * K * (64 - tile)"', r"is negative .* tile=128"),
        ('"log2(M - 1) + 1"', r"log2 of a non-positive number"),
    ],
)
def test_cost_expressions_checked_over_their_domain(tmp_path, cost, pattern):
    text = re.sub(r'cycles: ".*"', f"cycles: {cost}", BASE)
    p = _write(tmp_path, text)
    e = _refused(p, "operations.0.cost.cycles", pattern, "cycles:")
    assert "every in-range parameter value and tile" in e.message


def test_same_expression_with_a_safe_range_passes(tmp_path):
    cost = "B * M * N * K / (array_rows * array_cols * rate) * tile / (tile - 1) + 1"
    text = re.sub(r'cycles: ".*"', f'cycles: "{cost}"', BASE)
    text = text.replace("min: 1, max: 128", "min: 2, max: 128")
    assert load_extension(_write(tmp_path, text)).param("tile") == 16


def test_negative_energy_is_refused(tmp_path):
    text = BASE.replace("      cycles:", '      energy_pj: "M * N * K * 0.5 - tile"\n      cycles:')
    p = _write(tmp_path, text)
    _refused(
        p,
        "operations.0.cost.energy_pj",
        r"is negative \(-15\.5\) for K=1, M=1, N=1, tile=16",
        "energy_pj:",
    )


def test_non_numeric_parameter_in_a_cost_is_refused(tmp_path):
    text = BASE.replace(
        "  tile: {type: int", "  fast: {type: bool, default: true}\n  tile: {type: int"
    ).replace("+ tile", "+ tile * fast")
    p = _write(tmp_path, text)
    _refused(p, "operations.0.cost.cycles", r"'fast' is not a number", "cycles:")


def test_negative_default_without_min_is_flagged(tmp_path):
    text = BASE.replace(
        "  tile: {type: int", "  offset: {type: float, default: -3.0}\n  tile: {type: int"
    )
    p = _write(tmp_path, text)
    _refused(
        p,
        "parameters.offset.default",
        r"negative default -3\.0 with no min: declare the range",
        "offset:",
    )
    ok = text.replace("default: -3.0}", "default: -3.0, min: -10}")
    assert load_extension(_write(tmp_path, ok)).param("offset") == -3.0


def test_unknown_name_in_an_expression_suggests_the_closest():
    with pytest.raises(
        ExprError, match=r"unknown name 'tiles' \(did you mean 'tile'\? known: M, tile\)"
    ):
        compile_expr("tiles * 2", {"tile", "M"})


def test_builtin_and_docs_manifests_still_load():
    from wia_hw.registry import list_extensions

    for name in list_extensions():
        assert load_extension(name).id == name
