"""docs/BENCHMARKING.md: its Python examples run, and print what the page shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKING.md"


def _examples() -> list[tuple[str, str | None]]:
    """(python block, the output block right after it, if any)."""
    text = DOC.read_text()
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
    out = []
    for i, (lang, body) in enumerate(blocks):
        if lang == "python":
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            out.append((body, nxt[1] if nxt is not None and nxt[0] == "" else None))
    return out


@pytest.mark.parametrize("index", range(len(_examples())))
def test_example_runs_and_prints_what_the_page_shows(index, tmp_path, monkeypatch):
    code, shown = _examples()[index]
    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, f"BENCHMARKING.md example {index}", "exec"), {"__name__": "example"})
    printed = buf.getvalue().splitlines()
    if shown is None:
        return
    for line in shown.splitlines():
        # lines naming the example's file, and elided ones, depend on where it runs
        if "example.py" in line or line.strip() == "..." or not line.strip():
            continue
        assert line in printed, f"the page shows {line!r}; the example printed:\n" + "\n".join(
            printed
        )
