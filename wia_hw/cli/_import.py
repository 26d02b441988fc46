"""``wia-hw import MODEL``: what an ONNX model becomes, before running it.

Prints the import report (:func:`wia_hw.workloads._import_report.format_report`): the
ops by kind with their FLOPs and MACs, then MACs, parameters and bytes. A model with
op types that have no mapping exits with status 2 and one line on stderr naming every
such op type with its node count; every other bad input (missing file, unresolved dim,
malformed ``--dim``) is the CLI's usual one-line error, status 2.
"""

from __future__ import annotations

import click

from ..emulator.errors import WorkloadError

__all__ = ["import_cmd", "parse_dim"]


def parse_dim(text: str) -> tuple[str, int]:
    """``"seq=128"`` -> ``("seq", 128)``; anything else is a WorkloadError."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value.isdigit() or int(value) < 1:
        raise WorkloadError(
            f"--dim {text!r}: expected NAME=VALUE with a positive integer VALUE, e.g. --dim seq=128"
        )
    return name, int(value)


@click.command(
    name="import",
    epilog="""\b
Examples:
  wia-hw import model.onnx
  wia-hw import model.onnx --dim batch=1 --dim seq=128
""",
)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--batch", type=int, default=None, help="Value of a still-symbolic leading input dim."
)
@click.option(
    "--dim",
    "dims",
    multiple=True,
    metavar="NAME=VALUE",
    help="Value of a named symbolic input dim (repeatable), e.g. --dim seq=128.",
)
@click.option(
    "--no-patterns",
    is_flag=True,
    help="Keep attention, layer norm and GELU as the exporter wrote them.",
)
def import_cmd(model: str, batch: int | None, dims: tuple[str, ...], no_patterns: bool) -> None:
    """Import an ONNX MODEL: ops by kind, MACs, parameters and bytes."""
    from ..workloads._import_report import format_report, import_report
    from ..workloads._onnx import unsupported_message

    report = import_report(
        model, batch=batch, dims=dict(parse_dim(d) for d in dims), recognise=not no_patterns
    )
    if report.unsupported:
        raise WorkloadError(unsupported_message(report.source, report.unsupported))
    click.echo(format_report(report))
