"""Option parsing shared by the ``wia-hw`` commands."""

from __future__ import annotations

from typing import Any

import click
import yaml

from .spec import parse_override

__all__ = ["builder_args", "spec_overrides"]


def spec_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """``--set PATH=VALUE`` options as an overrides mapping (values read as YAML)."""
    return dict(parse_override(s) for s in items)


def builder_args(items: tuple[str, ...]) -> dict[str, Any]:
    """``-a NAME=VALUE`` options as workload-builder keyword arguments."""
    out = {}
    for s in items:
        if "=" not in s:
            raise click.BadParameter(f"{s!r} must read NAME=VALUE, e.g. M=4096",
                                     param_hint="--arg")
        k, _, v = s.partition("=")
        out[k.strip()] = yaml.safe_load(v)
    return out
