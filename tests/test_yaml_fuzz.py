"""Fuzzing the spec and manifest loaders with mutated copies of the built-in files.

Each case takes a built-in spec or extension manifest, applies one to three seeded
mutations (byte flips, truncation, duplicated keys, deep nesting, type swaps, huge and
odd numbers, aliases including recursive ones, deleted, swapped and inserted lines,
invalid bytes) and loads it in-process. The property: every case either loads or raises
:class:`~wia_hw.SpecError`, whose text is one line; never any other exception.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from wia_hw import SpecError, load_extension, load_spec
from wia_hw.registry import find_extensions
from wia_hw.spec import list_specs, spec_path

CASES_PER_FILE = 160
SCALARS = [
    "0",
    "-1",
    "1e400",
    "-1e400",
    ".nan",
    ".inf",
    "1" + "0" * 300,
    "1" * 150,
    "0x7fffffffffffffff",
    "true",
    "null",
    "~",
    "''",
    "[]",
    "{}",
    "[1, [2]]",
    "{a: 1}",
    '"x"',
    "2.5",
    "1_000",
    "0o17",
    "2001-12-14",
    "!!binary aGk=",
    "!!python/object:os.system {}",
    "*undefined",
    "&a 1",
    "'\\u0000'",
    '"\\x01"',
]


def _sources() -> list[tuple[str, Path]]:
    out = [("spec", spec_path(n)) for n in list_specs()]
    out += [
        ("ext", where)
        for _, (kind, where) in sorted(find_extensions().items())
        if kind == "builtin"
    ]
    return [(k, p) for k, p in out if p is not None]


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _mutate(text: str, rng: random.Random) -> bytes:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    kind = rng.randrange(12)
    if kind == 0:  # flip bytes
        raw = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(raw)
    if kind == 1:  # truncate
        raw = text.encode()
        return raw[: rng.randrange(len(raw))]
    if kind == 2:  # duplicate a line (a key, mostly)
        lines.insert(i, lines[i])
    elif kind == 3:  # deep nesting of a value
        if ":" in lines[i]:
            k, _, v = lines[i].partition(":")
            d = rng.choice([5, 50, 99, 150, 2000])
            lines[i] = f"{k}: {'[' * d}{v.strip() or '1'}{']' * d}"
    elif kind in (4, 5):  # type swap / odd number
        if ":" in lines[i]:
            k, _, _ = lines[i].partition(":")
            lines[i] = f"{k}: {rng.choice(SCALARS)}"
    elif kind == 6:  # alias to another value
        js = [j for j, ln in enumerate(lines) if ":" in ln and ln.split(":", 1)[1].strip()]
        if len(js) >= 2:
            a, b = rng.sample(js, 2)
            ka, _, va = lines[a].partition(":")
            kb, _, _ = lines[b].partition(":")
            if "#" not in va:
                lines[a] = f"{ka}: &anc {va.strip()}"
                lines[b] = f"{kb}: *anc"
    elif kind == 7:  # recursive alias
        if ":" in lines[i]:
            k, _, _ = lines[i].partition(":")
            lines[i] = f"{k}: &rec [1, *rec]"
    elif kind == 8:  # delete a line
        del lines[i]
    elif kind == 9:  # swap two lines
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == 10:  # insert garbage
        lines.insert(
            i,
            rng.choice(
                [
                    "- x",
                    "  :",
                    "? [a]\n: 1",
                    "\t a: 1",
                    "a: [",
                    "%YAML 1.1",
                    "---",
                    "...",
                    "&x",
                    "  - " * 5,
                    "<<: *nope",
                ]
            ),
        )
    else:  # invalid bytes
        raw = text.encode()
        at = rng.randrange(len(raw))
        return raw[:at] + rng.choice([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80"]) + raw[at:]
    return "\n".join(lines).encode()


@pytest.mark.parametrize("kind,source", _sources(), ids=lambda v: getattr(v, "name", v))
def test_mutated_files_load_or_raise_spec_error(tmp_path, kind, source):
    text = source.read_text()
    rng = random.Random(f"{source.name}-fuzz")
    if kind == "ext":  # the module beside the manifest
        for py in source.parent.glob("*.py"):
            shutil.copy(py, tmp_path / py.name)
    target = tmp_path / source.name
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(CASES_PER_FILE):
        content = text
        raw = b""
        for _ in range(rng.randint(1, 3)):
            raw = _mutate(content, rng)
            content = raw.decode("utf-8", "replace")
        target.write_bytes(raw)
        try:
            if kind == "spec":
                load_spec(target)
            else:
                load_extension(target)
            outcomes["loaded"] += 1
        except SpecError as e:
            assert "\n" not in str(e), (case, raw)
            assert str(e).startswith(str(target)), (case, str(e))
            outcomes["refused"] += 1
        except Exception as e:  # noqa: BLE001 - the property under test
            pytest.fail(
                f"case {case}: {type(e).__name__}: {e}\n--- input ---\n"
                f"{raw.decode('utf-8', 'replace')}"
            )
    # the mutations reach both outcomes: the fuzzer is not only producing garbage
    assert outcomes["refused"] > 0 and outcomes["loaded"] > 0, outcomes


def test_there_are_enough_cases():
    assert CASES_PER_FILE * len(_sources()) >= 1000
