"""Option parsing shared by the ``wia-hw`` commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from .._yaml import load_yaml_text
from ..spec import DEFAULT_DEVICE, parse_override

__all__ = ["builder_args", "spec_overrides", "workload_options"]


def spec_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """``--set PATH=VALUE`` options as an overrides mapping (values read as YAML)."""
    return dict(parse_override(s) for s in items)


def builder_args(items: tuple[str, ...]) -> dict[str, Any]:
    """``-a NAME=VALUE`` options as workload-builder keyword arguments."""
    out = {}
    for s in items:
        if "=" not in s:
            raise click.BadParameter(f"{s!r} must read NAME=VALUE, e.g. M=4096", param_hint="--arg")
        k, _, v = s.partition("=")
        out[k.strip()] = load_yaml_text(v, f"--arg {k.strip()}")
    return out


F = TypeVar("F", bound=Callable[..., Any])


def workload_options(fn: F) -> F:
    """The options every command that runs a workload takes: ``WORKLOAD``, ``--device``,
    ``--batch``, ``--seq``, ``--precision``, ``--arg NAME=VALUE``, ``--set PATH=VALUE``."""
    for option in reversed(
        [
            click.argument("workload"),
            click.option(
                "-d",
                "--device",
                default=DEFAULT_DEVICE,
                show_default=True,
                help="Built-in spec name or path to a device YAML.",
            ),
            click.option("-b", "--batch", type=int, default=None, help="Batch size."),
            click.option("-s", "--seq", type=int, default=None, help="Sequence length."),
            click.option(
                "-p",
                "--precision",
                type=click.Choice(["fp32", "fp16", "bf16", "int8"]),
                default=None,
                help="Compute precision of the model.",
            ),
            click.option(
                "-a",
                "--arg",
                "args",
                multiple=True,
                metavar="NAME=VALUE",
                help="Other builder arguments, e.g. -a M=4096 for gemm.",
            ),
            click.option(
                "--set",
                "sets",
                multiple=True,
                metavar="PATH=VALUE",
                help="Override a spec field, e.g. --set compute.array.rows=64.",
            ),
        ]
    ):
        fn = option(fn)
    return fn
