"""The Python examples of the user docs run, and print what the page shows.

One runner for every page: each ```python block runs in a fresh folder; when the block
right after it is an untagged one, that is the output the page shows, and every shown
line must be printed (blank lines, ``...`` and lines naming the example's own file,
which depend on where it runs, are skipped).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: page -> whether every example must show its output
PAGES = {
    "PROFILING.md": False,
    "BENCHMARKING.md": False,
    "OPTIMIZATION.md": True,
    "COMMUNICATION.md": False,
    "SERVING.md": True,
    "SWEEPS.md": True,
    "REPORTS.md": False,
    "GENERATION.md": True,
    "SCALESIM.md": True,
}


def _examples(page: str) -> list[tuple[str, str | None]]:
    """(python block, the output block right after it, if any)."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", (DOCS / page).read_text(), flags=re.S)
    out = []
    for i, (lang, body) in enumerate(blocks):
        if lang == "python":
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            out.append((body, nxt[1] if nxt is not None and nxt[0] == "" else None))
    return out


CASES = [(page, i) for page in PAGES for i in range(len(_examples(page)))]


def test_every_page_has_examples():
    for page in PAGES:
        assert _examples(page), f"docs/{page} has no python example"


@pytest.mark.parametrize(("page", "index"), CASES, ids=[f"{p}-{i}" for p, i in CASES])
def test_example_runs_and_prints_what_the_page_shows(page, index, tmp_path, monkeypatch):
    code, shown = _examples(page)[index]
    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, f"{page} example {index}", "exec"), {"__name__": "example"})
    printed = buf.getvalue().splitlines()
    if PAGES[page]:
        assert shown is not None, f"every example of {page} shows its output"
    for line in (shown or "").splitlines():
        if "example.py" in line or line.strip() == "..." or not line.strip():
            continue
        assert line in printed, f"the page shows {line!r}; the example printed:\n" + "\n".join(
            printed
        )
