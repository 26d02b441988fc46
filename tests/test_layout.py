"""The package layout: no import circles, and extensions and the emulator reach each
other and the runtime only through public names.

The import graph is read from the source with :mod:`ast` (every ``import`` statement,
module-level or inside a function, except those under ``if TYPE_CHECKING:``), so a
circle that only closes at call time is found too.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

PACKAGES = ("wia_hw", "wia_hw.emulator", "wia_hw.extensions", "wia_hw.rtl")


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, is a package) for every module of the distribution."""
    out: dict[str, tuple[Path, bool]] = {}
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        out[name] = (Path(pkg.__file__), True)
        for info in pkgutil.walk_packages(pkg.__path__, name + "."):
            spec = importlib.util.find_spec(info.name)
            assert spec is not None and spec.origin is not None
            out[info.name] = (Path(spec.origin), info.ispkg)
    return out


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for n in ast.walk(sub):
                    if hasattr(n, "lineno"):
                        lines.add(n.lineno)
    return lines


def _imports(
    name: str, file: Path, is_pkg: bool, known: set[str]
) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for each import of ``name``."""
    tree = ast.parse(file.read_text(), str(file))
    skip = _type_checking_lines(tree)
    package = name if is_pkg else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [a.name for a in node.names]
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in known]
            rest = [n for n in names if f"{mod}.{n}" not in known]
            out += [(s, [], node.lineno) for s in subs]
            if rest:
                out.append((mod, rest, node.lineno))
    return [(m, ns, ln) for m, ns, ln in out if m in known]


MODULES = _modules()
GRAPH = {m: _imports(m, f, p, set(MODULES)) for m, (f, p) in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_layout_has_the_expected_packages():
    for name in (
        "wia_hw.cli._run",
        "wia_hw.cli._specs",
        "wia_hw.cli._ext",
        "wia_hw.cli._profile",
        "wia_hw.cli._rtl",
        "wia_hw.registry._manifest",
        "wia_hw.registry._expr",
        "wia_hw.registry._yaml_ops",
        "wia_hw.registry._dispatch",
        "wia_hw.registry._sources",
        "wia_hw.registry._modules",
        "wia_hw.registry._chains",
        "wia_hw.registry._peaks",
    ):
        assert name in MODULES


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    graph = {m: {dep for dep, _, _ in deps if dep != m} for m, deps in GRAPH.items()}
    assert _cycles(graph) == []


@pytest.mark.parametrize("package", ["wia_hw.extensions", "wia_hw.emulator"])
def test_private_names_stay_inside_their_package(package):
    """A module of ``package`` imports no ``_private`` name or module from outside it."""
    bad = []
    for m, deps in GRAPH.items():
        if not (m == package or m.startswith(package + ".")):
            continue
        for dep, names, line in deps:
            if dep == package or dep.startswith(package + "."):
                continue
            private = [n for n in names if n.startswith("_")]
            if any(p.startswith("_") for p in dep.split(".")):
                private.append(dep)
            bad += [f"{MODULES[m][0].name}:{line}: {p}" for p in private]
    assert bad == []


@pytest.mark.parametrize("package", ["wia_hw.emulator", "wia_hw.registry"])
def test_layers_follow_the_package_docstring(package):
    """The package docstring lists its modules lowest layer first; no module imports one
    listed below it. The emulator imports nothing outside itself."""
    doc = importlib.import_module(package).__doc__
    order = re.findall(r"^\* (.*)$", doc, flags=re.M)
    rank = {m: i for i, line in enumerate(order) for m in re.findall(r":mod:`\.(\w+)`", line)}
    inside = {m.rpartition(".")[2] for m in MODULES if m.startswith(package + ".")}
    assert set(rank) == inside
    for m, deps in GRAPH.items():
        if not m.startswith(package + "."):
            continue
        for dep, _, line in deps:
            if package == "wia_hw.emulator":
                assert dep.startswith(package), f"{m}:{line} imports {dep}"
            if dep.startswith(package + "."):
                d = dep.rpartition(".")[2]
                assert rank[d] <= rank[m.rpartition(".")[2]], f"{m}:{line} imports {dep}"


def test_python_run_in_the_clones_root_imports_the_package():
    """From a clone's root the source directory ``wia_hw/`` shadows the installed
    package; it still imports, with the emulator, extensions and specs that the
    install maps from beside it, and runs (the README's Python examples, as a newcomer
    runs them right after ``git clone``)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    code = (  # as after a plain install: no editable-install finder maps the packages
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
        "if 'editable' not in repr(f).lower()]; "
        "import wia_hw, wia_hw.emulator, wia_hw.specs, wia_hw.extensions, wia_hw.rtl; "
        "r = wia_hw.run('gemm', M=64, N=64, K=64); print(r.latency_ms > 0)"
    )
    # the subpackages it maps are the ones pyproject's package-dir maps from beside it
    import tomllib

    import wia_hw

    dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {k.partition(".")[2] for k, v in dirs["package-dir"].items() if k != "wia_hw"}
    assert mapped == set(wia_hw.MAPPED_BESIDE)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]
