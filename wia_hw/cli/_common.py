"""Option parsing shared by the ``wia-hw`` commands.

Two decorators give every command that runs a workload the same options:

* :func:`workload_options` adds ``WORKLOAD``, ``--device``, ``--batch``, ``--seq``,
  ``--precision``, ``--arg NAME=VALUE`` and ``--set PATH=VALUE`` as separate keyword
  arguments (kept for the commands written against it);
* :func:`run_options` adds the same plus ``--ext ID|FILE`` and ``--ext-param
  ID.NAME=VALUE``, and hands the command one :class:`RunOptions` argument ``opts``
  instead. A new command (bench, sweep, case-study, train...) needs only::

      @click.command("mine")
      @run_options
      @click.option("--seed", type=int, default=0)
      def mine(opts: RunOptions, seed: int) -> None:
          ctx = opts.open(seed=seed)  # spec, overrides and extensions applied
          result = ctx.run(opts.workload, **opts.run_kwargs())

:func:`make_console` gives tables their natural width when the output is a pipe or a
file (``--width`` to choose); :func:`width_option` adds that option.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._files import write_atomic
from .._yaml import load_yaml_text
from ..emulator.errors import SpecError, WiaError, WorkloadError
from ..spec import DEFAULT_DEVICE, parse_override

__all__ = [
    "builder_args",
    "spec_overrides",
    "workload_options",
    "run_options",
    "RunOptions",
    "extension_params",
    "make_console",
    "width_option",
    "check_suffix",
    "CSV_SUFFIXES",
    "can_plot",
    "NO_PLOT",
    "task_progress",
    "TaskProgress",
    "as_options",
]


@contextmanager
def as_options(names: Mapping[str, str]) -> Iterator[None]:
    """Errors raised in the block name the command's options, not the Python API's
    fields the options fill: ``names`` maps a field (``measurement_iterations``) or a
    class (``ServerWorkload``) to what the user typed (``--iterations``, ``serve``); a
    field is replaced with its ``Class.`` prefix (``bench -n 0`` said
    "BenchmarkConfig.measurement_iterations must be at least 1")."""
    try:
        yield
    except WiaError as e:
        msg = str(e)
        for name, option in names.items():
            msg = re.sub(rf"\b(?:[A-Z]\w*\.)?{re.escape(name)}\b", option, msg)
        if msg == str(e):
            raise
        raise type(e)(msg) from None


#: What a file of CSV text may be called.
CSV_SUFFIXES = (".csv", ".txt")
#: What a skipped plot says (one line on stderr).
NO_PLOT = "plotting needs matplotlib: pip install 'wia-hw[plot]'"

#: Width given to a console that is not a terminal: wide enough that no table is cut
#: (rich tables are not expanded, so each takes its natural width).
PIPE_WIDTH = 10_000


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


class ParamText(str):
    """An ``--ext-param`` value as typed on the command line: :meth:`RunOptions.open`
    reads it by the parameter's manifest type (a ``str`` parameter takes the text as
    given, any other reads it as YAML)."""


def extension_params(items: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``--ext-param ID.NAME=VALUE`` options as ``{id: {name: text}}``, each value a
    :class:`ParamText` typed when the extension is loaded (only its manifest knows the
    parameter's type). Raises :class:`SpecError` (field ``--ext-param``) on a malformed
    item."""
    out: dict[str, dict[str, Any]] = {}
    for s in items:
        key, eq, raw = s.partition("=")
        ext_id, dot, name = key.strip().partition(".")
        if not eq or not dot or not ext_id or not name:
            raise SpecError(
                f"{s!r} must read ID.NAME=VALUE, e.g. pim.banks=64", field="--ext-param"
            )
        out.setdefault(ext_id, {})[name.strip()] = ParamText(raw)
    return out


def _ext_param_value(ext: Any, name: str, value: Any) -> Any:
    """``value`` of parameter ``name`` of ``ext`` checked against its manifest type and
    range (command-line text read by that type); a refusal is one :class:`SpecError`
    naming ``--ext-param ID.NAME``, not the manifest's file and line."""
    where = f"--ext-param {ext.id}.{name}"
    p = ext.parameters[name]
    if isinstance(value, ParamText):
        value = str(value) if p.type == "str" else load_yaml_text(str(value), where)
    try:
        return p.check(value)
    except (TypeError, ValueError) as e:
        raise SpecError(str(e), field=where) from None


@dataclass(frozen=True)
class RunOptions:
    """The device, workload and extension options of one command line.

    ``workload`` as given; ``device`` a built-in spec name or a YAML path; ``overrides``
    the ``--set`` fields; ``builder`` the ``--arg`` keyword arguments; ``extensions``
    the ``--ext`` ids or manifest paths in order; ``ext_params`` ``{id: {name:
    value}}`` from ``--ext-param``.
    """

    workload: str
    device: str = DEFAULT_DEVICE
    batch: int | None = None
    seq: int | None = None
    precision: str | None = None
    builder: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    extensions: tuple[str, ...] = ()
    ext_params: dict[str, dict[str, Any]] = field(default_factory=dict)

    def open(self, seed: int = 0) -> Any:
        """A :class:`~wia_hw.runtime.Context` on the device with the overrides, and the
        extensions registered with their parameters. Raises :class:`SpecError` when an
        ``--ext-param`` names an id no ``--ext`` registers, or a parameter the
        extension does not have."""
        from ..registry import load_extension, register_device_extension
        from ..runtime import open_device

        if self.workload.lower().endswith(".onnx"):
            if not Path(self.workload).is_file():
                raise WorkloadError(f"no such ONNX file: {self.workload}")
        ctx = open_device(self.device, overrides=self.overrides, seed=seed)
        used: set[str] = set()
        for source in self.extensions:
            ext = load_extension(source)
            params = self.ext_params.get(ext.id)
            if params:
                used.add(ext.id)
                unknown = sorted(set(params) - set(ext.parameters))
                if unknown:
                    raise SpecError(
                        f"extension {ext.id!r} has no parameter {unknown[0]!r} "
                        f"(it has: {', '.join(sorted(ext.parameters)) or 'none'})",
                        field="--ext-param",
                    )
                params = {n: _ext_param_value(ext, n, v) for n, v in params.items()}
                ext = load_extension(source, parameters=params)  # checked with them
            register_device_extension(ctx, ext)
        stray = sorted(set(self.ext_params) - used)
        if stray:
            raise SpecError(
                f"{stray[0]!r} is not an extension given with --ext "
                f"(given: {', '.join(self.extensions) or 'none'})",
                field="--ext-param",
            )
        return ctx

    def run_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``ctx.run`` for the workload: batch, seq, precision
        and the builder arguments (``-a batch=...`` stands for ``--batch`` when that is
        not given; both at once is a one-line error)."""
        kw: dict[str, Any] = dict(batch=self.batch, seq=self.seq, precision=self.precision)
        for name, value in self.builder.items():
            if kw.get(name) is not None and kw[name] != value:
                raise WorkloadError(
                    f"-a {name}={value} contradicts --{name} {kw[name]}; give one of them"
                )
            kw[name] = value
        return kw


def can_plot() -> bool:
    """Whether matplotlib imports (the plots are optional: without it a command skips
    each with one line, :data:`NO_PLOT`, and prints everything else)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def check_suffix(option: str, path: str | Path, suffixes: tuple[str, ...], kinds: str) -> None:
    """Refuse, before any work, an output file ``path`` of ``option`` whose suffix is not
    one of ``suffixes`` (``-``, stdout, passes): the suffix says what a file holds, and
    ``kinds`` says which suffix writes what."""
    suffix = Path(path).suffix
    if str(path) != "-" and suffix.lower() not in suffixes:
        raise WiaError(f"{option} {path}: unknown kind {suffix or '(no suffix)'!r}: {kinds}")


def check_writable(option: str, path: str | Path | None) -> None:
    """Refuse, before any work, an output file ``path`` of ``option`` that cannot be
    written: its folder does not exist, or it is a folder (``None`` and ``-`` pass)."""
    if path is None or str(path) == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise WiaError(f"{option} {p}: is a folder, not a file")
    folder = p.parent
    if not folder.is_dir():
        raise WiaError(f"{option} {p}: no folder {folder}")


def write_file(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it,
    then renamed over it, so an interrupted command (Ctrl-C, a full disk) never leaves a
    half-written report where a complete one was expected. ``WiaError`` (one line) when
    it cannot be written."""
    try:
        write_atomic(path, text)
    except OSError as e:
        raise WiaError(f"cannot write {path}: {e.strerror}") from None


def emit_json(text: str, output: Path | None, as_json: bool) -> bool:
    """Write a report's JSON ``text`` to ``output`` (when given, whole or not at all:
    :func:`write_file`) and to stdout (with ``--json``); returns whether it went to
    stdout (the command then prints no text)."""
    if output is not None:
        write_file(output, text + "\n")
    if as_json:
        click.echo(text)
    return as_json


F = TypeVar("F", bound=Callable[..., Any])


def _workload_and_device() -> list[Callable[[Any], Any]]:
    return [
        click.argument("workload"),
        click.option(
            "-d",
            "--device",
            default=DEFAULT_DEVICE,
            show_default=True,
            help="Built-in spec name, or path to a device YAML or a SCALE-Sim .cfg.",
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
            help="Other builder arguments, e.g. -a M=4096 for gemm; for an .onnx "
            "file, a symbolic input dim, e.g. -a sequence_length=128.",
        ),
        click.option(
            "--set",
            "sets",
            multiple=True,
            metavar="PATH=VALUE",
            help="Override a spec field, e.g. --set compute.array.rows=64.",
        ),
    ]


def _apply(fn: Any, options: list[Callable[[Any], Any]]) -> Any:
    for option in reversed(options):
        fn = option(fn)
    return fn


def workload_options(fn: F) -> F:
    """The options every command that runs a workload takes: ``WORKLOAD``, ``--device``,
    ``--batch``, ``--seq``, ``--precision``, ``--arg NAME=VALUE``, ``--set PATH=VALUE``,
    each passed as its own keyword argument (``args`` and ``sets`` raw tuples)."""
    return _apply(fn, _workload_and_device())  # type: ignore[no-any-return]


_RUN_KEYS = ("workload", "device", "batch", "seq", "precision", "args", "sets", "exts", "ext_param")


def run_options(fn: Any = None, *, workload_required: bool = True) -> Any:
    """The device, workload and extension options of :func:`workload_options` plus
    ``--ext ID|FILE`` (repeatable) and ``--ext-param ID.NAME=VALUE`` (repeatable),
    passed to the command as one keyword argument ``opts`` (:class:`RunOptions`).
    Place it right under ``@click.command``; the command's own options go below.
    ``@run_options(workload_required=False)`` makes ``WORKLOAD`` optional: ``opts`` is
    then ``None`` when it is not given (``run --replay`` uses that)."""
    if fn is None:
        return functools.partial(run_options, workload_required=workload_required)

    @functools.wraps(fn)
    def wrapper(**kw: Any) -> Any:
        given = {k: kw.pop(k) for k in _RUN_KEYS}
        if given["workload"] is None:
            return fn(opts=None, **kw)
        opts = RunOptions(
            workload=given["workload"],
            device=given["device"],
            batch=given["batch"],
            seq=given["seq"],
            precision=given["precision"],
            builder=builder_args(given["args"]),
            overrides=spec_overrides(given["sets"]),
            extensions=tuple(given["exts"]),
            ext_params=extension_params(given["ext_param"]),
        )
        return fn(opts=opts, **kw)

    wrapper.__click_params__ = list(getattr(fn, "__click_params__", []))  # type: ignore[attr-defined]
    options = _workload_and_device() + [
        click.option(
            "--ext",
            "exts",
            multiple=True,
            metavar="ID|FILE",
            help="Register a device extension first (built-in id or manifest path).",
        ),
        click.option(
            "--ext-param",
            "ext_param",
            multiple=True,
            metavar="ID.NAME=VALUE",
            help="Set a parameter of an --ext extension, e.g. pim.banks=64.",
        ),
    ]
    if not workload_required:
        options[0] = click.argument("workload", required=False)
    return _apply(wrapper, options)


def width_option(fn: F) -> F:
    """``--width N``: the width of printed tables (default: the terminal's, or the
    natural width of each table when the output is a pipe or a file)."""
    return click.option(  # type: ignore[no-any-return]
        "--width",
        type=click.IntRange(min=40),
        default=None,
        help="Table width in columns (default: the terminal's; natural in a pipe).",
    )(fn)


#: Columns a table's text column keeps at least on a narrow console (it wraps there).
TEXT_MIN = 10
#: Letters a cell of a numeric column may hold (a unit: "ms", "GB/s", "n/a", "x").
MAX_UNIT_LETTERS = 4


def _keep_numbers(table: Table) -> int:
    """Make ``table`` give way on a narrow console without changing a number: its
    right-justified columns of numbers (cells of digits and at most a short unit) are
    never narrower than their widest cell (rich
    shrank them with an ellipsis: 2039 GB/s read ``2``, +1005.8% read ``+100…``), and
    its left-justified text columns wrap instead of being cut (unless they set their own
    ``max_width``: a description cut on purpose), down to :data:`TEXT_MIN` columns.
    Returns the width the table needs at least."""
    need = 1  # the left border
    for col in table.columns:
        cells = [c.cell_len if isinstance(c, Text) else cell_len(str(c)) for c in col._cells]
        widest = max([cell_len(str(col.header)), *cells], default=0)
        numeric = all(sum(ch.isalpha() for ch in str(c)) <= MAX_UNIT_LETTERS for c in col._cells)
        if col.justify == "right" and numeric:
            col.min_width = max(col.min_width or 0, widest)
            col.no_wrap = True
            w = col.min_width
        elif col.max_width is not None:
            w = min(widest, col.max_width)
        else:
            col.no_wrap = False
            col.overflow = "fold"
            w = min(widest, max(TEXT_MIN, col.min_width or 0))
        need += w + 3  # a space each side and a border
    return need


class _Console(Console):
    """A Console whose tables keep every number whole on a narrow terminal
    (:func:`_keep_numbers`); a table that cannot fit is printed at the width it needs,
    for the terminal to wrap, rather than squeezed or cropped."""

    def print(self, *objects: Any, **kw: Any) -> None:  # noqa: A003 - rich's name
        need = max((_keep_numbers(o) for o in objects if isinstance(o, Table)), default=0)
        if need <= self.width:
            super().print(*objects, **kw)
            return
        width = self.width  # rich caps print(width=) at the console's: widen it
        self.width = need
        try:
            super().print(*objects, **{"crop": False, **kw})
        finally:
            self.width = width


def make_console(width: int | None = None, *, stderr: bool = False) -> Console:
    """A rich Console: ``width`` columns when given; else the terminal's width, or, when
    the output is not a terminal, wide enough that tables take their natural width.
    Its tables never cut a number (:class:`_Console`)."""
    if width is not None:
        return _Console(width=width, stderr=stderr)
    c = _Console(stderr=stderr)
    if not c.is_terminal:
        c = _Console(width=PIPE_WIDTH, stderr=stderr)
    return c


#: Seconds a command runs before its progress line appears (short runs show none).
PROGRESS_DELAY = 1.0


def progress_console() -> Console:
    """The console progress goes to: stderr (tests replace this to see it)."""
    return make_console(stderr=True)


class TaskProgress:
    """A progress line on stderr for a long command: a spinner, ``label``, a bar (a
    pulsing one while the total is unknown), ``done/total unit``, what runs now and the
    elapsed time. It appears only when stderr is a terminal and the work has taken
    over :data:`PROGRESS_DELAY` seconds (a timer thread shows it, so a single long step
    shows it too), and it is erased when closed: piped output is unchanged.
    :meth:`update` may be called from any thread; use it as a context manager."""

    def __init__(self, label: str, *, unit: str = "", console: Console | None = None) -> None:
        self.unit = unit
        self._lock = threading.Lock()
        self._shown = self._closed = False
        self._bar: Any = None
        self._timer: threading.Timer | None = None
        console = progress_console() if console is None else console
        if not console.is_terminal:
            return
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(
            SpinnerColumn(),
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TextColumn("{task.description}", markup=False),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = self._bar.add_task("", total=None, count="")
        if PROGRESS_DELAY <= 0:
            self._show()
            return
        self._timer = threading.Timer(PROGRESS_DELAY, self._show)
        self._timer.daemon = True
        self._timer.start()

    def _show(self) -> None:
        with self._lock:
            if not self._closed and not self._shown:
                self._bar.start()
                self._shown = True

    def update(self, done: int | None = None, total: int | None = None, what: str = "") -> None:
        """``done`` of ``total`` (either may be None: unknown) and what runs now."""
        if self._bar is None:
            return
        count = "" if done is None else f"{done}/{total}" if total else f"{done}"
        if count and self.unit:
            count += f" {self.unit}"
        self._bar.update(
            self._task, completed=done or 0, total=total or None, description=what, count=count
        )

    def close(self) -> None:
        """Stop the timer and erase the line (it may be called more than once)."""
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self._shown and not self._closed:
                self._bar.stop()
            self._closed = True

    def __enter__(self) -> TaskProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def task_progress(label: str, *, unit: str = "") -> TaskProgress:
    """A :class:`TaskProgress` on :func:`progress_console` (stderr)."""
    return TaskProgress(label, unit=unit)
