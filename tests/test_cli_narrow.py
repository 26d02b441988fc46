"""On a narrow console (``--width``, a narrow terminal) tables keep every number whole:
rich shrank numeric columns with an ellipsis, so 2,039 GB/s read ``2`` and +1005.8%
read ``+100…``; text columns wrap instead, and a table that cannot fit is printed at
the width it needs."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from wia_hw.cli import cli


def _peaks(output: str) -> list[tuple[str, ...]]:
    """The FP16, INT8 and HBM cells of each row of ``specs list``."""
    rows = [r for r in output.splitlines() if r.startswith("│")]
    return [tuple(c.strip() for c in r.strip("│").split("│")[2:5]) for r in rows]


@pytest.mark.parametrize("width", [40, 60, 79])
def test_specs_list_keeps_its_numbers_at_any_width(width):
    wide = CliRunner().invoke(cli, ["specs", "list", "--width", "200"])
    narrow = CliRunner().invoke(cli, ["specs", "list", "--width", str(width)])
    assert wide.exit_code == narrow.exit_code == 0, narrow.output
    assert ("311.9", "623.7", "2039") in _peaks(wide.output)  # a100-systolic
    assert _peaks(narrow.output) == _peaks(wide.output)


def test_run_top_kernels_keep_their_counts_and_times():
    res = CliRunner().invoke(cli, ["run", "bert-base", "-b", "1", "-s", "32", "--width", "60"])
    assert res.exit_code == 0, res.output
    table = res.output[res.output.index("Top ") :]
    rows = [r for r in table.splitlines() if r.startswith("│") and "builtin" in r]
    assert rows
    for r in rows:
        cells = [c.strip() for c in r.strip("│").split("│")]
        n, ms, mean = cells[2], cells[3], cells[4]
        assert re.fullmatch(r"\d+", n), r
        assert re.fullmatch(r"\d+\.\d+", ms) and re.fullmatch(r"\d+\.\d+", mean), r


def test_a_right_justified_text_column_still_wraps():
    """The counters table's value column is right-justified text ("memory 484,163,
    dependency ..."): it wraps at --width 60 and the counter names stay whole."""
    res = CliRunner().invoke(cli, ["run", "bert-base", "-a", "layers=1", "--width", "60"])
    assert res.exit_code == 0, res.output
    table = res.output[res.output.index("Hardware counters") :].split("└")[0]
    assert max(len(line) for line in table.splitlines()) <= 60
    for name in ("instructions", "branch_mispredicts", "cache_misses"):
        assert f"│ {name}" in table
