"""``wia-hw specs``: list, show and validate device specs."""

from __future__ import annotations

import click
import yaml
from rich.table import Table

from ..emulator.config import ClusterSpec, DeviceSpec, to_mapping
from ..spec import list_specs, load_spec
from ._common import make_console, spec_overrides, width_option

__all__ = ["specs"]


@click.group(
    "specs",
    epilog="""\b
Examples:
  wia-hw specs list
  wia-hw specs show wia-edge > my-npu.yaml && wia-hw specs validate my-npu.yaml
""",
)
def specs() -> None:
    """List, show and validate device specs."""


@specs.command("list")
@width_option
def specs_list(width: int | None) -> None:
    """The built-in specs with their peak figures."""
    console = make_console(width)
    t = Table()
    names = list_specs()
    t.add_column("name", no_wrap=True, min_width=max(map(len, names)))
    t.add_column("kind", no_wrap=True, min_width=len("cluster x16"))
    for col in ("FP16 TFLOPS", "INT8 TOPS", "HBM GB/s"):
        t.add_column(col, no_wrap=True, justify="right", min_width=6)
    # cut on a terminal only; a pipe or a file gets the whole text
    cut = max(8, width - 80) if width else (30 if console.is_terminal else None)
    t.add_column("description", no_wrap=True, overflow="ellipsis", max_width=cut)
    for name in names:
        s = load_spec(name)
        d = s.device if isinstance(s, ClusterSpec) else s
        n = s.devices if isinstance(s, ClusterSpec) else 1
        t.add_row(
            name,
            f"cluster x{n}" if n > 1 else "device",
            f"{n * d.peak_flops('fp16') / 1e12:.1f}" if d.supports("fp16") else "-",
            f"{n * d.peak_flops('int8') / 1e12:.1f}" if d.supports("int8") else "-",
            f"{n * d.peak_bandwidth_gbs:.0f}",
            s.description,
        )
    console.print(t)


@specs.command("show")
@click.argument("spec")
@click.option("--set", "sets", multiple=True, metavar="PATH=VALUE")
def specs_show(spec: str, sets: tuple[str, ...]) -> None:
    """Print a spec as validated YAML, with its derived peak figures (a cluster's: per
    device, then the cluster's totals)."""
    s = load_spec(spec, spec_overrides(sets))
    click.echo(yaml.safe_dump(to_mapping(s), sort_keys=False).rstrip())
    d = s.device if isinstance(s, ClusterSpec) else s
    assert isinstance(d, DeviceSpec)
    n = s.devices if isinstance(s, ClusterSpec) else 1
    if isinstance(s, ClusterSpec):  # the figures below are one device's: say so
        click.echo(f"# derived, per device (each of the {n} {d.name} devices of {s.name}):")
    else:
        click.echo("# derived:")
    for prec in d.compute.array.macs_per_pe_cycle:
        click.echo(f"#   peak {prec}: {d.peak_flops(prec) / 1e12:.2f} TFLOPS")
    click.echo(
        f"#   HBM: {d.peak_bandwidth_gbs} GB/s; ridge point (fp16): "
        f"{d.peak_flops('fp16') / (d.peak_bandwidth_gbs * 1e9):.1f} FLOP/byte"
        if d.supports("fp16")
        else f"#   HBM: {d.peak_bandwidth_gbs} GB/s"
    )
    en, parts, m = d.energy, d.static_power_breakdown_w, d.memory
    pes_per_core = d.pes // d.compute.cores
    l1_mib = m.l1.size_kib / 1024
    # a core's share of the derived terms: its PEs, and its L1's part of the SRAM term
    per_core_w = parts["pe"] / d.compute.cores + parts["sram"] * l1_mib / d.sram_mib
    click.echo(f"#   static power: {d.static_power_w:.2f} W (leakage and DRAM background)")
    click.echo(f"#     PEs:  {parts['pe']:.2f} W = {d.pes:,} PEs x {en.static_mw_per_pe:g} mW")
    click.echo(
        f"#     SRAM: {parts['sram']:.2f} W = {d.sram_mib:g} MiB x "
        f"{en.static_mw_per_mib_sram:g} mW/MiB ({d.compute.cores} x L1 {l1_mib:g} MiB "
        f"+ L2 {m.l2.size_kib / 1024:g} MiB)"
    )
    click.echo(
        f"#     HBM:  {parts['hbm']:.2f} W = {m.hbm.channels} channels x "
        f"{en.static_mw_per_hbm_channel:g} mW"
    )
    click.echo(
        f"#     per core: {per_core_w:.2f} W ({pes_per_core:,} PEs + L1), "
        f"{d.compute.cores} core{'s' if d.compute.cores > 1 else ''}"
    )
    if isinstance(s, ClusterSpec):
        click.echo(f"# derived, cluster {s.name} ({n} devices, totals):")
        for prec in d.compute.array.macs_per_pe_cycle:
            click.echo(
                f"#   peak {prec}: {n * d.peak_flops(prec) / 1e12:.2f} TFLOPS "
                f"({n} x {d.peak_flops(prec) / 1e12:.2f})"
            )
        click.echo(f"#   HBM: {n * d.peak_bandwidth_gbs:g} GB/s ({n} x {d.peak_bandwidth_gbs:g})")
        click.echo(
            f"#   static power: {n * d.static_power_w:.2f} W ({n} x {d.static_power_w:.2f} W)"
        )


@specs.command("validate")
@click.argument("files", nargs=-1, required=True)
def specs_validate(files: tuple[str, ...]) -> None:
    """Validate spec files; prints one line per file, exits 2 on the first error."""
    for f in files:
        s = load_spec(f)
        click.echo(f"{f}: ok ({type(s).__name__} {s.name!r})")
