"""The ``wia-hw`` command line: one module per command group.

``wia-hw run WORKLOAD`` runs a model on an emulated device and prints the seed's
section 8.7 breakdown (:mod:`._run`); ``specs`` lists, shows and validates device specs
(:mod:`._specs`); ``ext`` lists, shows, validates and registers device extensions
(:mod:`._ext`); ``profile`` profiles a workload (:mod:`._profile`); ``rtl`` lists the RTL
blocks and emits their Verilog (:mod:`._rtl`); ``import`` shows what an ONNX model
becomes and lists every unsupported op (:mod:`._import`). Options shared by several commands live
in :mod:`._common`. Bad input exits with status 2 and one line on stderr naming what is
wrong (every :class:`~wia_hw.WiaError`, and every usage error click finds in a
subcommand's arguments, becomes that line).
"""

from __future__ import annotations

import warnings
from typing import Any, NoReturn

import click

from ..emulator.errors import WiaError
from ._bench import bench_cmd
from ._case_study import case_study_cmd
from ._collectives import collectives
from ._compare import compare_cmd
from ._export import export_cmd
from ._ext import ext
from ._import import import_cmd
from ._profile import profile
from ._report import report_cmd
from ._rtl import rtl
from ._run import print_run, run_cmd
from ._serve import serve_cmd
from ._specs import specs
from ._sweep import sweep_cmd, sweep_report_cmd
from ._train import train_cmd

__all__ = ["main", "cli", "print_run"]

#: click's "no arguments: show the help" (a usage error whose message is the help)
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _Cli(click.Group):
    """Turns every WiaError, and every usage error of a subcommand (an unknown command
    or option, a bad option value), into one line on stderr and exit status 2; Ctrl-C
    into one line and exit status 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WiaError as e:
            click.echo(f"wia-hw: error: {e}", err=True)
            ctx.exit(2)
        except click.UsageError as e:
            _usage_error(e, ctx)
        except KeyboardInterrupt:
            # Ctrl-C: one line and the shell's status for SIGINT (128 + 2), not click's
            # "Aborted!" with status 1, which a CI job would read as a failed check
            # (bench --compare exits 1 on a regression)
            click.echo("wia-hw: interrupted", err=True)
            ctx.exit(130)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:  # the top level's own options (wia-hw --bogus)
            _usage_error(e, ctx)


def _usage_error(e: click.UsageError, ctx: click.Context) -> NoReturn:
    """One line on stderr for a usage error, naming the command's help; exit status 2.
    A group run without a command shows its help, as click does."""
    if isinstance(e, _NO_ARGS_IS_HELP):
        raise e
    where = e.ctx.command_path if e.ctx is not None else ctx.command_path
    msg = "; ".join(x.strip() for x in e.format_message().splitlines() if x.strip())
    click.echo(f"wia-hw: error: {msg} (see '{where} --help')", err=True)
    ctx.exit(2)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wia-hw")
def cli() -> None:
    """wia-hw: an open, verifiable AI-accelerator stack (WIA-AI-011 chapter 8)."""


for _command in (
    run_cmd,
    specs,
    rtl,
    ext,
    profile,
    bench_cmd,
    collectives,
    import_cmd,
    sweep_cmd,
    sweep_report_cmd,
    report_cmd,
    train_cmd,
    serve_cmd,
    case_study_cmd,
    compare_cmd,
    export_cmd,
):
    cli.add_command(_command)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A warning as one line on stderr, as errors are (``wia-hw: warning: ...``), not
    Python's two lines naming the source line that raised it."""
    click.echo(f"wia-hw: warning: {message}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``wia-hw`` console script."""
    warnings.showwarning = _show_warning
    cli.main(args=argv, prog_name="wia-hw", standalone_mode=True)
