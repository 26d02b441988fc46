"""``wia-hw collectives``: an nccl-tests-style sweep of the collectives on a cluster.

``wia-hw collectives --cluster wia-cluster-8 [--op all_reduce] [--algo ring]
[--min 1K --max 1G]`` runs each collective (or the one ``--op`` names) in timing mode
on sizes from ``--min`` to ``--max``, doubling, and prints per size: bytes, element
count (float32), time (us), algorithm and bus bandwidth (GB/s; nccl-tests'
definitions, see ``docs/COMMUNICATION.md``), then the average bus bandwidth. ``--algo``
applies to the collectives that have that algorithm (the others keep their default).
By default (``auto``) each size runs the algorithm that ends first for it alone on idle
links, as NCCL's tuner picks one per size; the ``algo`` column then says which.
"""

from __future__ import annotations

import re

import click

from ..comm import ALGORITHMS, AUTO, MAX_CHUNK_TRANSFERS, open_cluster
from ._common import spec_overrides

__all__ = ["collectives", "parse_size", "sweep_sizes"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def parse_size(text: str, param: str = "--min") -> int:
    """``"1K"`` -> 1024, ``"64M"`` -> 67108864, ``"4096"`` -> 4096 (binary units, as
    nccl-tests' ``-b``/``-e``)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGTB]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise click.BadParameter(f"{text!r} is not a size (e.g. 1K, 64M, 1G)", param_hint=param)
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def sweep_sizes(lo: int, hi: int) -> list[int]:
    """``lo, 2 lo, 4 lo, ...`` up to ``hi`` (inclusive)."""
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


@click.command(
    "collectives",
    epilog="""\b
Examples:
  wia-hw collectives --cluster wia-cluster-8 --op all_reduce --min 1K --max 1G
  wia-hw collectives --cluster wia-cluster-8 --op all_reduce --algo ring --min 64M --max 256M
""",
)
@click.option(
    "-c",
    "--cluster",
    default="wia-cluster-8",
    show_default=True,
    help="Built-in cluster spec name or path to a cluster YAML.",
)
@click.option(
    "--op",
    type=click.Choice(("all",) + OPS),
    default="all",
    show_default=True,
    help="The collective to sweep.",
)
@click.option(
    "--algo",
    default=AUTO,
    show_default=True,
    help="Algorithm: ring, tree, hierarchical, or auto (per size, the one that ends first).",
)
@click.option("--min", "min_size", default="1K", show_default=True, help="Smallest size.")
@click.option("--max", "max_size", default="1G", show_default=True, help="Largest size.")
@click.option("--chunk", default="1M", show_default=True, help="Link chunk and pipelining unit.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="PATH=VALUE",
    help="Override a cluster spec field, e.g. --set links.bandwidth_gbs=200.",
)
def collectives(
    cluster: str,
    op: str,
    algo: str,
    min_size: str,
    max_size: str,
    chunk: str,
    sets: tuple[str, ...],
) -> None:
    """Time the collectives on a cluster, nccl-tests style (size, count, time, algbw,
    busbw)."""
    lo, hi = parse_size(min_size, "--min"), parse_size(max_size, "--max")
    if lo < 1 or hi < lo:
        raise click.BadParameter(
            f"need 1 <= min <= max, got {lo} and {hi}", param_hint="--min/--max"
        )
    ops = OPS if op == "all" else (op,)
    if algo != AUTO and not any(algo in ALGORITHMS[o] for o in ops):
        known = [AUTO, *sorted({a for o in ops for a in ALGORITHMS[o]})]
        raise click.BadParameter(
            f"{algo!r} is not an algorithm of {', '.join(ops)} (known: {', '.join(known)})",
            param_hint="--algo",
        )
    chunk_bytes = parse_size(chunk, "--chunk")
    if chunk_bytes < 1:
        raise click.BadParameter(
            f"the chunk must be at least 1 byte, got {chunk!r}", param_hint="--chunk"
        )
    comm = open_cluster(cluster, overrides=spec_overrides(sets), chunk_bytes=chunk_bytes)
    hierarchical = comm.topology.devices_per_node is not None
    if algo == "hierarchical" and not hierarchical:
        raise click.BadParameter(
            f"the hierarchical algorithm needs a hierarchical cluster; "
            f"{comm.spec.name} is {comm.topology.kind}",
            param_hint="--algo",
        )

    def algorithm(name: str) -> str:
        return algo if algo in ALGORITHMS[name] else AUTO

    for name in ops:  # the largest size first: refuse before printing anything
        a = algorithm(name)
        if a == AUTO and comm.auto_candidates(name, range(comm.size), hi, 1):
            continue  # auto runs one of them
        x = ALGORITHMS[name][0] if a == AUTO else a
        too = comm.refused(name, x, hi)
        if too is None:
            continue
        work, floor = too
        if floor <= MAX_CHUNK_TRANSFERS:
            advice, hint = "lower --max or raise --chunk", "--max/--chunk"
        else:  # one chunk per message is already too many: only the algorithm can help
            others = [o for o in ALGORITHMS[name] if o != x and comm.refused(name, o, hi) is None]
            advice = (
                f"use --algo {' or '.join(others)}"
                if others
                else f"no size or chunk runs it on {comm.size} ranks; "
                + ("leave it out with --op or use" if op == "all" else "use")
                + " a smaller cluster"
            )
            hint = "--algo" if others else "--cluster"
        raise click.BadParameter(
            f"{name} of {hi:,} B over {comm.size} ranks in chunks of {chunk_bytes:,} B "
            f"would take {work:,} chunk transfers, more than the {MAX_CHUNK_TRANSFERS:,} "
            f"modelled; {advice}",
            param_hint=hint,
        )
    topo = comm.topology
    click.echo(
        f"# {comm.spec.name}: {comm.size} ranks, {topo.kind} topology, peak link "
        f"{comm.peak_link_bandwidth_gbs:g} GB/s; sizes {lo} to {hi} bytes, float32"
    )
    for name in ops:
        a = algorithm(name)
        several = a == AUTO and len(ALGORITHMS[name]) > 1
        shown = a if a != AUTO or several else ALGORITHMS[name][0]
        click.echo(f"#\n# {name} (algorithm {shown})")
        col = f" {'algo':>12}" if several else ""
        click.echo(
            f"# {'size':>12} {'count':>12} {'type':>7} {'time':>10} {'algbw':>8} {'busbw':>8}" + col
        )
        click.echo(
            f"# {'(B)':>12} {'(elements)':>12} {'':>7} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}"
        )
        busbws = []
        for size in sweep_sizes(lo, hi):
            rec = getattr(comm, name)(nbytes=size, algorithm=a)
            busbws.append(rec.busbw_gbs)
            click.echo(
                f"  {size:>12} {size // 4:>12} {'float':>7} {rec.time_s * 1e6:>10.2f} "
                f"{rec.algbw_gbs:>8.2f} {rec.busbw_gbs:>8.2f}"
                + (f" {rec.algorithm:>12}" if several else "")
            )
        click.echo(f"# Avg bus bandwidth: {sum(busbws) / len(busbws):.3f} GB/s")
