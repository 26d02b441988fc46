"""``wia-hw case-study MODEL``: the seed's section 8.7 case study on an emulated device
(:func:`wia_hw.case_study`): the table, breakdowns, batching figures, feasibility
arithmetic and goal, then the seed's printout (its labels: ``Baseline Performance:`` to
``Goal achieved:``) with the run's numbers; ``--json`` for the JSON form, ``--markdown
FILE`` for a report with plots."""

from __future__ import annotations

import os
from pathlib import Path

import click

from .._case_study import case_study
from ..emulator.errors import WiaError
from ..spec import DEFAULT_DEVICE
from ._common import as_options, task_progress

__all__ = ["case_study_cmd"]


#: case_study's settings (and the configs they fill) as this command's options
_OPTIONS = {
    "BatchingConfig.max_latency_ms": "--target-ms",
    "ServerWorkload.p99_bound_ms": "--target-ms",
    "max_batch_size": "--max-batch-size",
    "duration_s": "--duration",
    "accuracy_layers": "--accuracy-layers",
}


@click.command(
    "case-study",
    epilog="""\b
Examples:
  wia-hw case-study bert-large --device wia-npu --markdown report.md
  wia-hw case-study bert-base -b 8 --layers 2 --no-accuracy --json
""",
)
@click.argument("model", default="bert-large")
@click.option(
    "-d", "--device", default=DEFAULT_DEVICE, show_default=True, help="Spec name or path."
)
@click.option("-b", "--batch", type=int, default=32, show_default=True, help="Batch size.")
@click.option("-s", "--seq", type=int, default=128, show_default=True, help="Sequence length.")
@click.option(
    "--layers", type=int, default=None, help="Build the model with fewer layers (faster)."
)
@click.option(
    "--target-ms", type=float, default=10.0, show_default=True, help="Latency target (ms)."
)
@click.option(
    "--max-batch-size", type=int, default=64, show_default=True, help="Server's largest batch."
)
@click.option(
    "--duration",
    type=float,
    default=1.0,
    show_default=True,
    help="Emulated seconds of arrivals per rate the batching search tries.",
)
@click.option("--no-accuracy", is_flag=True, help="Skip the functional accuracy measurement.")
@click.option(
    "--accuracy-layers",
    type=int,
    default=2,
    show_default=True,
    help="Layers of the reduced model the accuracy is measured on.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "--markdown",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a Markdown report (with PNG plots beside it when matplotlib is installed).",
)
def case_study_cmd(
    model: str,
    device: str,
    batch: int,
    seq: int,
    layers: int | None,
    target_ms: float,
    max_batch_size: int,
    duration: float,
    no_accuracy: bool,
    accuracy_layers: int,
    as_json: bool,
    markdown: Path | None,
) -> None:
    """Run the seed's case study for MODEL (default bert-large) on a device."""
    if markdown is not None:  # checked before the run, which takes minutes
        _check_output(markdown)
    with task_progress("case study", unit="steps") as bar, as_options(_OPTIONS):
        res = case_study(
            model,
            device=device,
            batch=batch,
            seq=seq,
            layers=layers,
            target_latency_ms=target_ms,
            max_batch_size=max_batch_size,
            server_duration_s=duration,
            accuracy=not no_accuracy,
            accuracy_layers=accuracy_layers,
            progress=bar.update,
        )
    click.echo(res.to_json() if as_json else res.format_text())
    if markdown is not None:  # after the table is out: a failed write loses nothing
        try:
            res.to_markdown(markdown)
        except OSError as e:
            raise WiaError(f"--markdown {markdown}: cannot write ({e.strerror})") from None


def _check_output(path: Path) -> None:
    """Refuse a --markdown path that cannot be written (its plots go beside it)."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise WiaError(f"--markdown {path}: is a directory")
    if not parent.is_dir():
        raise WiaError(f"--markdown {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise WiaError(f"--markdown {path}: not writable")
