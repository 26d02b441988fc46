"""``wia-hw train``: one training iteration of a workload on a cluster.

``wia-hw train bert-large --cluster wia-cluster-8 --dp 8 --tp 1 [--batch 32] [--seq
128] [-a NAME=VALUE ...] [--bucket-mb 25] [--no-overlap] [--optimizer adam] [--algo auto]
[--json]`` prints the iteration time, its breakdown (forward, backward, optimizer,
exposed communication), the communication time and its overlap efficiency, the memory
per device, and the bytes each kind of collective moved (``--json``: the result's
``to_dict()``). ``-a`` passes other workload-builder arguments, as ``run``'s does
(``-a M=4096`` for gemm, ``-a size=medium -a layers=4`` for gpt2). With ``--no-overlap`` it
also prints the "Inefficient Communication Pattern" recommendation, whose improvement
is measured by running the overlapped schedule too. Bad input exits with status 2 and
one line (see :mod:`wia_hw.cli`).
"""

from __future__ import annotations

import inspect
import json
import warnings

import click

from ..comm import ALGORITHMS, AUTO
from ..emulator.errors import WiaError
from ..train import DEFAULT_BUCKET_MB, OPTIMIZERS, TrainingThermalWarning, train_iteration
from ._common import RunOptions, builder_args

__all__ = ["train_cmd"]

#: train_iteration's arguments and the options of this command that set them
_OPTIONS = {
    "workload": "WORKLOAD",
    "cluster": "--cluster",
    "dp": "--dp",
    "tp": "--tp",
    "bucket_mb": "--bucket-mb",
    "overlap": "--no-overlap",
    "optimizer": "--optimizer",
    "algorithm": "--algo",
}


@click.command(
    "train",
    epilog="""\b
Examples:
  wia-hw train bert-large --cluster wia-cluster-8 --dp 8 --tp 1 --batch 32 --seq 128
  wia-hw train bert-large --cluster wia-cluster-8 --dp 8 --tp 1 --no-overlap
  wia-hw train gpt2 -a size=medium -a layers=4 --batch 8 --seq 512
  wia-hw train gemm -a M=4096 -a N=4096 -a K=4096
""",
)
@click.argument("workload")
@click.option(
    "-c",
    "--cluster",
    default="wia-cluster-8",
    show_default=True,
    help="Built-in cluster spec name or path to a cluster YAML.",
)
@click.option("--dp", type=int, default=None, help="Data-parallel degree [devices / tp].")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel degree.")
@click.option("-b", "--batch", type=int, default=None, help="Batch size per replica.")
@click.option("-s", "--seq", type=int, default=None, help="Sequence length.")
@click.option(
    "-a",
    "--arg",
    "args",
    multiple=True,
    metavar="NAME=VALUE",
    help="Other builder arguments, e.g. -a M=4096 for gemm, -a size=medium for gpt2; "
    "for an .onnx file, a symbolic input dim, e.g. -a sequence_length=128.",
)
@click.option(
    "--bucket-mb",
    type=float,
    default=DEFAULT_BUCKET_MB,
    show_default=True,
    help="DDP gradient bucket size (MiB).",
)
@click.option("--no-overlap", is_flag=True, help="All-reduce the gradients after backward.")
@click.option(
    "--optimizer",
    type=click.Choice(tuple(OPTIMIZERS)),
    default="adam",
    show_default=True,
    help="Optimizer whose weight update (and state traffic) the iteration includes.",
)
@click.option(
    "--algo",
    type=click.Choice((AUTO, *ALGORITHMS["all_reduce"])),
    default=AUTO,
    show_default=True,
    help="The gradient all-reduce's algorithm (auto: per bucket size, the one that ends first).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def train_cmd(
    workload: str,
    cluster: str,
    dp: int | None,
    tp: int,
    batch: int | None,
    seq: int | None,
    args: tuple[str, ...],
    bucket_mb: float,
    no_overlap: bool,
    optimizer: str,
    algo: str,
    as_json: bool,
) -> None:
    """One training iteration of WORKLOAD (e.g. bert-large) on a cluster."""
    # -a batch=... stands for --batch as in run (both at once: one line if they differ)
    kw = RunOptions(workload, batch=batch, seq=seq, builder=builder_args(args)).run_kwargs()
    kw_ok = ("batch", "seq")  # the builder's and train_iteration's both
    if kw["precision"] is None:  # train has no --precision; -a precision=fp32 is kept
        del kw["precision"]
    own = [n for n in inspect.signature(train_iteration).parameters if n in kw and n not in kw_ok]
    if own:
        n = own[0]
        how = _OPTIONS.get(n)
        raise WiaError(
            f"-a {n}={kw[n]}: {n} is not a builder argument but the training step's own"
            + (f" (give it as {how})" if how else " (not set from the command line)")
        )
    with warnings.catch_warnings():  # the summary's Power line says it
        warnings.simplefilter("ignore", TrainingThermalWarning)
        try:
            r = train_iteration(
                workload,
                cluster=cluster,
                dp=dp,
                tp=tp,
                bucket_mb=bucket_mb,
                overlap=not no_overlap,
                optimizer=optimizer,
                algorithm=algo,
                **kw,
            )
        except WiaError as e:
            # the communicator's size limit advises its own arguments (chunk_bytes),
            # which this command does not have: say what its options can do
            head, sep, _ = str(e).partition(" modelled; ")
            if not sep:
                raise
            raise WiaError(
                f"{head} modelled; use "
                + ("--algo auto (it picks an algorithm that runs), " if algo != AUTO else "")
                + "a smaller --bucket-mb or a smaller --dp"
            ) from None
    recs = r.communication_recommendations() if no_overlap else None
    if as_json:
        d = r.to_dict()
        if recs is not None:
            d["recommendations"] = [x.to_dict() for x in recs.recommendations]
        click.echo(json.dumps(d, indent=2))
        return
    click.echo(r.summary())
    if recs is not None and recs.recommendations:
        click.echo("")
        click.echo(recs.format().rstrip())
