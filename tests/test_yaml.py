"""The one YAML reader (``wia_hw._yaml``): every refusal is one ``file:line: message``
:class:`SpecError`, and through the CLI one line on stderr with exit status 2."""

from __future__ import annotations

import random
import re
from importlib import resources

import pytest
from click.testing import CliRunner

from wia_hw import SpecError
from wia_hw._yaml import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_INT_DIGITS,
    MAX_NODES,
    load_yaml_text,
    read_yaml_mapping,
)
from wia_hw.cli import cli
from wia_hw.spec import load_spec


def _laughs(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs" document: ``width ** levels`` scalars in a few hundred bytes."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _merge_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 {" + ", ".join(f"k{j}: {j}" for j in range(width)) + "}"]
    lines += [
        f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * width)}]}}" for i in range(1, levels)
    ]
    return "\n".join(lines) + "\n"


#: name -> (file bytes, message pattern, line of the error or None)
BAD: dict[str, tuple[bytes, str, int | None]] = {
    "recursive_alias": (b"schema_version: 1\na: &r [*r]\n", r"recursive alias \*r", 2),
    "recursive_mapping": (b"a: &m {b: {c: *m}}\n", r"recursive alias \*m", 1),
    "billion_laughs": (
        _laughs().encode(),
        rf"more than {MAX_NODES:,} nodes with aliases "
        "expanded",
        None,
    ),
    "merge_bomb": (_merge_bomb().encode(), rf"more than {MAX_NODES:,} nodes", None),
    "invalid_utf8": (
        b'schema_version: 1\nname: "caf\xe9"\n',
        r"not UTF-8: byte 0xe9 at byte offset 28",
        2,
    ),
    "control_character": (b'a: b\nc: "\x01"\n', r"character U\+0001 is not allowed", 2),
    "duplicate_key": (
        b"schema_version: 1\nname: a\nx: 1\nname: b\n",
        r"duplicate key 'name' \(first at line 2\)",
        4,
    ),
    "duplicate_int_key": (
        b"m:\n  1: a\n  0x1: b\n",
        r"duplicate key '0x1' \(first at "
        r"line 2\)",
        3,
    ),
    "deep_nesting": (
        b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n",
        rf"nesting deeper than {MAX_DEPTH} levels",
        1,
    ),
    "huge_integer": (
        b"a: " + b"9" * 5000 + b"\n",
        rf"integer of 5000 characters \(at most "
        rf"{MAX_INT_DIGITS}\)",
        1,
    ),
    "malformed": (b"a: [1, 2\nb: 3\n", r"malformed YAML", None),
    "two_documents": (b"a: 1\n---\nb: 2\n", r"malformed YAML: .*single document", None),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_refusal_names_file_and_line(tmp_path, name):
    content, message, line = BAD[name]
    p = tmp_path / f"{name}.yaml"
    p.write_bytes(content)
    with pytest.raises(SpecError, match=message) as info:
        read_yaml_mapping(p, "the.yaml", "a spec")
    e = info.value
    assert e.file == "the.yaml" and "\n" not in str(e)
    if line is not None:
        assert e.line == line and str(e).startswith(f"the.yaml:{line}: ")


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    p = tmp_path / "big.yaml"
    with open(p, "wb") as f:  # sparse: MAX_FILE_BYTES + 1 bytes without writing them
        f.truncate(MAX_FILE_BYTES + 1)
    reads = []
    real_open = open

    def spy(*args, **kwargs):
        fh = real_open(*args, **kwargs)
        real_read = fh.read
        fh.read = lambda *a: reads.append(a) or real_read(*a)  # noqa: B023
        return fh

    monkeypatch.setattr("builtins.open", spy)
    with pytest.raises(
        SpecError,
        match=rf"file is {MAX_FILE_BYTES + 1:,} bytes, larger "
        rf"than the maximum {MAX_FILE_BYTES:,} bytes",
    ):
        read_yaml_mapping(p, "big.yaml", "a spec")
    assert reads == []


def test_a_file_at_the_size_limit_is_read(tmp_path):
    head = b'description: "'
    p = tmp_path / "edge.yaml"
    p.write_bytes(head + b"x" * (MAX_FILE_BYTES - len(head) - 2) + b'"\n')
    assert p.stat().st_size == MAX_FILE_BYTES
    data, lines = read_yaml_mapping(p, "edge.yaml", "a spec")
    assert len(data["description"]) == MAX_FILE_BYTES - len(head) - 2
    assert lines == {"description": 1}


def test_node_limit_is_the_expanded_count(tmp_path):
    """Aliases count as the size of the node they name: a document just under the limit
    with aliases loads, one node more is refused."""
    width = 100
    # a0: 1 seq + width scalars; a1: seq of k aliases (k * (width + 1) expanded)
    # plus 2 mapping keys, 1 root mapping.
    k = (MAX_NODES - (width + 1) - 3 - 1) // (width + 1)
    text = f"a0: &a0 [{', '.join(['1'] * width)}]\na1: [{', '.join(['*a0'] * k)}]\n"
    data = load_yaml_text(text, "ok.yaml")
    assert len(data["a1"]) == k and data["a1"][0] is data["a0"]
    extra = MAX_NODES - (3 + (width + 1) + 1 + k * (width + 1))  # nodes left
    text_over = (
        f"a0: &a0 [{', '.join(['1'] * width)}]\n"
        f"a1: [{', '.join(['*a0'] * k + ['2'] * (extra + 1))}]\n"
    )
    with pytest.raises(SpecError, match="more than"):
        load_yaml_text(text_over, "over.yaml")
    text_at = (
        f"a0: &a0 [{', '.join(['1'] * width)}]\na1: [{', '.join(['*a0'] * k + ['2'] * extra)}]\n"
    )
    assert len(load_yaml_text(text_at, "at.yaml")["a1"]) == k + extra


def test_nesting_at_the_limit_loads():
    ok = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert load_yaml_text(f"a: {ok}", "x") is not None
    with pytest.raises(SpecError, match="nesting deeper"):
        load_yaml_text(f"a: [{ok}]", "x")


def test_merge_keys_may_override_without_being_duplicates():
    data = load_yaml_text("base: &b {x: 1, y: 2}\nd: {<<: *b, y: 3}\n", "m.yaml")
    assert data["d"] == {"x": 1, "y": 3}


def test_a_bom_and_plain_unicode_are_fine(tmp_path):
    p = tmp_path / "u.yaml"
    p.write_bytes('\ufeffname: "café"\n'.encode())
    assert read_yaml_mapping(p, "u.yaml", "a spec")[0] == {"name": "café"}


def test_set_and_arg_values_go_through_the_same_reader():
    from wia_hw.spec import parse_override

    assert parse_override("compute.array.rows=64") == ("compute.array.rows", 64)
    # a refused value stays the text it was (then validation names the field)
    assert parse_override("a=&r [*r]") == ("a", "&r [*r]")
    res = CliRunner().invoke(cli, ["run", "gemm", "-a", "M={a: 1, a: 2}"])
    assert res.exit_code == 2
    assert "--arg M:1: duplicate key 'a'" in res.output


def test_exponent_floats_are_numbers_as_in_yaml_1_2(tmp_path):
    # PyYAML reads YAML 1.1, where 1e-9 (no dot) is a string; users and YAML 1.2 read
    # a number, and a spec field, override or argument must take it as one
    rng = random.Random(5)
    for _ in range(200):
        mant = rng.choice(["", "-", "+"]) + str(rng.randint(0, 999)) + rng.choice(["", ".", ".25"])
        text = f"{mant}{rng.choice('eE')}{rng.choice(['', '-', '+'])}{rng.randint(0, 30)}"
        assert load_yaml_text(text, "x") == float(text)
    for text, want in [("123", 123), ("1_000", 1000), ("1.5", 1.5), ("0x10", 16)]:
        assert load_yaml_text(text, "x") == want  # integers and dotted floats as before
    for text in ("1e", "e5", "1e5x", "1.2.3e4"):
        assert load_yaml_text(text, "x") == text
    assert (
        load_spec("wia-npu", overrides={"clock_ghz": load_yaml_text("1.5e0", "x")}).clock_ghz == 1.5
    )
    p = tmp_path / "s.yaml"
    base = (resources.files("wia_hw.specs") / "wia-edge.yaml").read_text()
    p.write_text(base.replace("bandwidth_gbs: 51.2", "bandwidth_gbs: 5.12e1", 1))
    assert "5.12e1" in p.read_text()
    assert load_spec(str(p)).memory.hbm.bandwidth_gbs == 51.2
    res = CliRunner().invoke(
        cli, ["run", "gemm", "-a", "M=64", "--set", "memory.hbm.bandwidth_gbs=1e400"]
    )
    assert res.exit_code == 2
    assert "memory.hbm.bandwidth_gbs: must be a positive number, got inf" in res.output


@pytest.mark.parametrize("group", ["specs", "ext"])
@pytest.mark.parametrize(
    "name",
    [
        "recursive_alias",
        "billion_laughs",
        "invalid_utf8",
        "big",
        "duplicate_key",
        "deep_nesting",
        "huge_integer",
    ],
)
def test_cli_validate_refuses_with_one_line(tmp_path, group, name):
    p = tmp_path / f"{name}.yaml"
    if name == "big":
        with open(p, "wb") as f:
            f.truncate(50 * 1024 * 1024)
        message = "larger than the maximum"
    else:
        p.write_bytes(BAD[name][0])
        message = BAD[name][1]
    res = CliRunner().invoke(cli, [group, "validate", str(p)])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wia-hw: error: {p}")
    assert "Traceback" not in res.output
    assert re.search(message, lines[0])
