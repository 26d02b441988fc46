"""``wia-hw ext``: list, show, validate and register device extensions.

``wia-hw ext list`` shows every extension :func:`wia_hw.load_extension` finds by name;
``show ID|FILE`` prints a manifest as validated; ``validate FILE...`` checks manifests;
``register FILE`` checks that the extension registers on a device (no clash with the
extensions given by ``--with``), installs it into the user extension directory (unless
``--dry-run``) so that ``list``/``show``/``load_extension`` find it by id, and with
``--run WORKLOAD`` runs a workload with it and prints which extension ran each kernel.
Bad input exits with status 2 and one line naming the file, line and field.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from ..emulator.errors import SpecError, WiaError
from ..registry import (
    ExtensionId,
    extension_dirs,
    find_extensions,
    list_extensions,
    load_extension,
    manifest_id,
    register_device_extension,
)
from ..registry._manifest import read_manifest
from ..runtime import RunResult, open_device
from ..spec import DEFAULT_DEVICE, parse_override

__all__ = ["ext", "print_extension_summary"]


def _params(items: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for s in items:
        k, v = parse_override(s)
        out[k] = v
    return out


@click.group("ext")
def ext() -> None:
    """List, show, validate and register device extensions (seed 8.9)."""


@ext.command("list")
def ext_list() -> None:
    """Every extension found by id: built-in, user-installed, entry points."""
    t = Table()
    for col in ("id", "version", "source", "capabilities", "operations"):
        t.add_column(col)
    where = find_extensions()
    for name in list_extensions():
        try:
            e = load_extension(name)
        except WiaError as err:  # one broken manifest does not hide the others
            t.add_row(name, "?", where[name][0], f"[red]invalid: {err}[/red]", "")
            continue
        t.add_row(
            name,
            e.version,
            where[name][0],
            ", ".join(map(str, e.capabilities)),
            ", ".join(o.name for o in e.operations),
        )
    Console(width=160).print(t)


@ext.command("show")
@click.argument("extension")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a parameter, e.g. --set block_q=64.",
)
def ext_show(extension: str, sets: tuple[str, ...]) -> None:
    """Print an extension (id or manifest path) as validated YAML."""
    e = load_extension(extension, parameters=_params(sets))
    click.echo(yaml.safe_dump(e.to_dict(), sort_keys=False).rstrip())


@ext.command("validate")
@click.argument("files", nargs=-1, required=True)
def ext_validate(files: tuple[str, ...]) -> None:
    """Validate manifests; one line per file, exit 2 on the first error."""
    for f in files:
        e = load_extension(Path(f))
        click.echo(
            f"{f}: ok (extension {e.id!r} {e.version}, {len(e.operations)} "
            f"operation{'s' if len(e.operations) != 1 else ''})"
        )


def _check_module_free(src: Path, dest_dir: Path, ext_id: str) -> None:
    """Refuse to install the module ``src`` into ``dest_dir`` over a different file of
    that name that another installed extension's manifest names as its module (the
    other extension would silently run this one's code, or fail to load). Raises a
    WiaError naming both extensions and the manifest of the other."""
    target = dest_dir / src.name
    if not target.is_file() or target.resolve() == src.resolve():
        return
    try:
        if target.read_bytes() == src.read_bytes():
            return
    except OSError:
        pass
    for m in sorted(dest_dir.glob("*.yaml")):
        try:
            data, _ = read_manifest(m)
        except WiaError:  # a broken manifest names no module we could break
            continue
        other = data.get("extension_id")
        module = data.get("module")
        if other == ext_id or not isinstance(module, str):
            continue
        if module.removesuffix(".py") == src.stem:
            raise WiaError(
                f"{src}: installing extension {ext_id!r} would overwrite {target}, the "
                f"module of installed extension {other!r} ({m}); rename the module of "
                f"{ext_id!r} or use --force"
            )


def print_extension_summary(r: RunResult, console: Console) -> None:
    """Kernels, cycles and reported figures per provider of a run."""
    by: dict[str, list[Any]] = defaultdict(list)
    for k in r.kernels:
        by[k.provider].append(k)
    t = Table(title="Kernels by provider", title_justify="left")
    for col in ("provider", "kernels", "ms", "% of run", "figures"):
        t.add_column(col, justify="left" if col in ("provider", "figures") else "right")
    for prov in sorted(by):
        ks = by[prov]
        cyc = sum(k.cycles for k in ks)
        figs: dict[str, float] = defaultdict(float)
        for k in ks:
            for name, val in getattr(k.record, "extra", {}).items():
                if isinstance(val, (int, float)) and not isinstance(val, bool):
                    figs[name] += val
        t.add_row(
            prov,
            str(len(ks)),
            f"{r.clock_ghz and cyc / r.clock_ghz / 1e6:.3f}",
            f"{100.0 * cyc / r.cycles if r.cycles else 0:.1f}",
            ", ".join(f"{n}={v:,.6g}" for n, v in sorted(figs.items())),
        )
    console.print(t)


@ext.command("register")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-d",
    "--device",
    default=DEFAULT_DEVICE,
    show_default=True,
    help="Device to register on (spec name or YAML path).",
)
@click.option(
    "--with",
    "others",
    multiple=True,
    metavar="ID",
    help="Register these extensions first (claims must not clash).",
)
@click.option(
    "--set", "sets", multiple=True, metavar="NAME=VALUE", help="Set a parameter of the extension."
)
@click.option("--dry-run", is_flag=True, help="Check only; do not install.")
@click.option("--force", is_flag=True, help="Replace an installed manifest of the same id.")
@click.option(
    "--run",
    "workload",
    default=None,
    metavar="WORKLOAD",
    help="Run a workload with the extension and print the run.",
)
@click.option("-b", "--batch", type=int, default=None)
@click.option("-s", "--seq", type=int, default=None)
def ext_register(
    file: Path,
    device: str,
    others: tuple[str, ...],
    sets: tuple[str, ...],
    dry_run: bool,
    force: bool,
    workload: str | None,
    batch: int | None,
    seq: int | None,
) -> None:
    """Check that FILE registers on DEVICE, install it, optionally run a workload."""
    e = load_extension(file, parameters=_params(sets))
    ctx = open_device(device)
    for o in others:
        register_device_extension(ctx, o)
    register_device_extension(ctx, e)
    claims = sorted({c for o in e.operations for c in o.claims})
    click.echo(
        f"{file}: extension {e.id!r} {e.version} registers on {ctx.spec.name!r}"
        f"{' (claims ' + ', '.join(claims) + ')' if claims else ''}"
    )
    if not dry_run:
        try:
            ExtensionId(e.id)
            builtin = True
        except ValueError:
            builtin = False
        if builtin:
            raise WiaError(f"{file}: extension id {e.id!r} is a built-in id; choose another")
        dest_dir = extension_dirs()[0]
        # an installed manifest of this id under another file name is the one replaced
        same = [p for p in sorted(dest_dir.glob("*.yaml")) if manifest_id(p) == e.id]
        dest = same[0] if same else dest_dir / f"{e.id}.yaml"
        if dest.exists() and not force and dest.resolve() != file.resolve():
            raise WiaError(f"{dest} exists (an extension {e.id!r} is installed); use --force")
        if e.module and not force:
            _check_module_free(file.parent / f"{e.module}.py", dest_dir, e.id)
        try:
            dest_dir.mkdir(parents=True, exist_ok=True)
            if dest.resolve() != file.resolve():
                shutil.copyfile(file, dest)
            if e.module:
                src = file.parent / f"{e.module}.py"
                if src.resolve() != (dest_dir / src.name).resolve():
                    shutil.copyfile(src, dest_dir / src.name)
        except OSError as err:
            raise SpecError(
                f"cannot install into {dest_dir}: {err.strerror}", file=str(file)
            ) from None
        click.echo(f"installed as {dest}")
    if workload is not None:
        from ._run import print_run

        r = ctx.run(workload, batch=batch, seq=seq)
        console = Console(width=140)
        print_run(r, console, top_kernels=10)
        print_extension_summary(r, console)
