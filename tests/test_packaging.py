"""A non-editable ``pip install .`` ships every package of the source tree.

``pyproject.toml`` lists the packages by hand (the ``package-dir`` mapping puts ``rtl/``,
``emulator/``, ``extensions/`` and ``specs/`` under ``wia_hw``), so a new package that is
not listed works in the editable install the tests use and breaks the installed
``wia-hw`` command. This test walks the tree and checks the list.
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python 3.11")
def test_every_package_directory_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for pkg, folder in cfg["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            name = ".".join((pkg, *rel.parts)) if rel.parts else pkg
            if "__pycache__" not in name:
                found.add(name)
    missing = sorted(found - listed)
    assert not missing, (
        f"packages missing from pyproject.toml [tool.setuptools] packages: {missing}"
    )
    assert not sorted(listed - found), "pyproject.toml lists packages that do not exist"
