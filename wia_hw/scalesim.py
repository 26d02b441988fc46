"""SCALE-Sim's inputs, read as wia-hw's: a topology CSV becomes a :class:`Graph`, a
``.cfg`` configuration a device spec, so a SCALE-Sim user runs the same layers on the
same array with ``wia-hw run topology.csv --device config.cfg``.

**Topologies** (SCALE-Sim v2/v3 ``topologies/``). The format is told by the header:

* convolution (``Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width,
  Channels, Num Filter, Strides[, Stride Width]``): each row is a ``conv2d`` of
  ``[batch, Channels, H, W]`` by ``Num Filter`` filters, strides as given (one stride
  serves both directions; SCALE-Sim v2 reads a ninth column as the stride in width,
  v3 as an ``N:M`` sparsity ratio: an ``N:M`` is kept as the op's ``sparsity``
  attribute, metadata, the layer running dense), without padding but for SCALE-Sim's
  rounding: its ofmap
  is ``ceil((ifmap - filter + stride) / stride)``, so where the stride does not divide
  ``ifmap - filter`` the last window runs past the input, over zero padding at the
  bottom or right (the MACs are SCALE-Sim's ``ofmap x filter x channels x filters``). A layer whose name contains ``DP`` is depthwise, as
  SCALE-Sim reads it: each channel is convolved alone by ``Num Filter`` filters (a
  grouped ``conv2d``, ``groups = Channels``, same MACs as SCALE-Sim's per-channel
  layers).
* GEMM (``Layer, M, N, K``): each row is a ``linear`` ``[M, K] x [K, N]`` whose
  ``K x N`` operand is the weight (SCALE-Sim's filter).

SCALE-Sim runs each layer on its own from memory, so every layer reads its own input
tensor (``<layer>.ifmap``) and weight (``<layer>.filter``); layers do not feed each
other. Rows end with a comma or not; blank lines are skipped.

**Configurations** (``.cfg``, read with :mod:`configparser`). ``[architecture_presets]``
gives the array (``ArrayHeight`` rows, ``ArrayWidth`` columns, ``Dataflow`` ``os`` or
``ws``; wia-hw does not model ``is``), the three SRAMs (``IfmapSramSzkB`` +
``FilterSramSzkB`` + ``OfmapSramSzkB`` = the core's L1) and, with ``[run_presets]
InterfaceBandwidth: USER``, ``Bandwidth`` in words per cycle (the DRAM interface:
``words x word_bytes x clock`` GB/s). Everything else (the clock, L2, HBM channels and
latency, the vector unit, DMA, energy) comes from a base spec (default ``wia-npu``),
with one core and ``pipelined: false``: SCALE-Sim runs a layer's folds one after
another, each filling and draining the array. What does not map is said in the spec's
``description``: with ``InterfaceBandwidth: CALC`` SCALE-Sim reports the bandwidth a
stall-free run needs instead of taking one, so the base spec's memory stays;
SCALE-Sim has no shared L2; the SRAM offsets, ``MemoryBanks`` and the request buffers
are addresses and queue sizes wia-hw does not model.

How the two count cycles differs in one place, measured in ``docs/SCALESIM.md`` and
``benchmarks/scalesim_compare.py``: on a weight-stationary array wia-hw's fold takes
exactly SCALE-Sim's ``2R + C + T - 2`` cycles; on an output-stationary one wia-hw's RTL
also shifts the ``R`` rows of results out of the array (SCALE-Sim's fold is ``R + C + T
- 2``), unless the array is ``pipelined`` (double-buffered accumulators).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._scalesim_cfg import scalesim_config_mapping
from .emulator.errors import WorkloadError
from .graph import Graph, GraphBuilder

__all__ = ["read_topology", "config_mapping", "fold_cycles", "CONV_COLUMNS", "GEMM_COLUMNS"]

#: The columns of a convolution topology, in order (the last is optional).
CONV_COLUMNS = (
    "Layer name",
    "IFMAP Height",
    "IFMAP Width",
    "Filter Height",
    "Filter Width",
    "Channels",
    "Num Filter",
    "Strides",
    "Stride Width",
)
#: The columns of a GEMM topology.
GEMM_COLUMNS = ("Layer", "M", "N", "K")


def _fields(line: str) -> list[str]:
    """A CSV row's fields, stripped, without the trailing empty one(s) a final comma
    leaves, or a comment after the final comma (SCALE-Sim ignores whatever follows the
    last comma: its own ``mobilnet_paper.csv`` marks depthwise rows ``...,1,#dw``)."""
    out = [f.strip() for f in line.strip().split(",")]
    if len(out) > 1 and out[-1].startswith("#"):
        out.pop()
    while out and out[-1] == "":
        out.pop()
    return out


def read_topology(path: str | os.PathLike[str], *, batch: int = 1, dtype: str = "fp16") -> Graph:
    """Read a SCALE-Sim topology CSV (convolution or GEMM, told by its header) as a
    graph of independent layers (see the module text). ``batch`` images per conv
    layer (SCALE-Sim's are one); ``dtype`` of every tensor.

    Raises :class:`~wia_hw.WorkloadError` naming the file, line, layer and column for a
    missing file, an unknown header, a row with too few or too many fields, a value that
    is not a positive integer, or a filter larger than its input.
    """
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"{p}: no such SCALE-Sim topology file")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise WorkloadError(f"batch must be a positive integer, got {batch!r}")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{p}: cannot be read as text ({e})") from None
    rows = [(i + 1, _fields(line)) for i, line in enumerate(text.splitlines()) if line.strip()]
    if not rows:
        raise WorkloadError(f"{p}: empty; a SCALE-Sim topology has a header and one row per layer")
    (hline, header), body = rows[0], rows[1:]
    names = [h.lower() for h in header]
    gemm = len(names) >= 4 and [n.lower() for n in GEMM_COLUMNS[1:]] == names[1:4]
    if not gemm and not (len(names) >= 8 and "ifmap" in names[1] and "filter" in names[3]):
        raise WorkloadError(
            f"{p}:{hline}: header {', '.join(header)!r} is neither a SCALE-Sim convolution "
            f"topology ({', '.join(CONV_COLUMNS[:8])}[, Stride Width]) nor a GEMM one "
            f"({', '.join(GEMM_COLUMNS)})"
        )
    if not body:
        raise WorkloadError(f"{p}: has a header but no layer rows")
    b = GraphBuilder(p.stem, dtype)
    seen: set[str] = set()
    for lineno, f in body:
        cols = GEMM_COLUMNS if gemm else CONV_COLUMNS
        lo, hi = (4, 4) if gemm else (8, 9)
        name = f[0] if f else ""
        if not lo <= len(f) <= hi:
            raise WorkloadError(
                f"{p}:{lineno}: layer {name!r}: {len(f)} fields, a "
                f"{'GEMM' if gemm else 'convolution'} row has "
                f"{lo if lo == hi else f'{lo} or {hi}'} ({', '.join(cols[:hi])})"
            )
        sparsity = None
        if not gemm and len(f) == 9 and ":" in f[8]:  # SCALE-Sim v3: a sparsity ratio
            sparsity = f.pop()
            parts = sparsity.split(":")
            if len(parts) != 2 or not all(x.strip().isdigit() and int(x) > 0 for x in parts):
                raise WorkloadError(
                    f"{p}:{lineno}: layer {name!r}: sparsity {sparsity!r} is not N:M"
                )
        vals = []
        for col, raw in zip(cols[1:], f[1:], strict=False):
            try:
                v = int(raw)
            except ValueError:
                v = 0
            if v < 1:
                raise WorkloadError(
                    f"{p}:{lineno}: layer {name!r}: {col} {raw!r} is not a positive integer"
                )
            vals.append(v)
        if not name.isprintable():  # printed in every report: no terminal escapes
            raise WorkloadError(
                f"{p}:{lineno}: layer name {name!r} has control characters (a layer "
                "name must be printable text)"
            )
        op = name or f"layer{lineno}"
        if op in seen:
            op = f"{op}@{lineno}"
        seen.add(op)
        if gemm:
            m, n, k = vals
            x = b.input(f"{op}.ifmap", (m, k))
            w = b.weight(f"{op}.filter", (k, n))
            b.op("linear", op, [x, w], group="gemm", out=f"{op}.ofmap")
            continue
        h, w_, fh, fw, c, nf, sh, *rest = vals
        sw = rest[0] if rest else sh
        for what, fdim, idim in (("Height", fh, h), ("Width", fw, w_)):
            if fdim > idim:
                raise WorkloadError(
                    f"{p}:{lineno}: layer {name!r}: Filter {what} {fdim} is larger than "
                    f"IFMAP {what} {idim}"
                )
        x = b.input(f"{op}.ifmap", (batch, c, h, w_))
        depthwise = "DP" in name
        wt = b.weight(f"{op}.filter", (c * nf, 1, fh, fw) if depthwise else (nf, c, fh, fw))
        # SCALE-Sim's ofmap rounds up (ceil((ifmap - filter + stride) / stride)): the
        # last window may run past the input, over zeros at the far side
        oh, ow = -(-(h - fh + sh) // sh), -(-(w_ - fw + sw) // sw)
        pb, pr = (oh - 1) * sh + fh - h, (ow - 1) * sw + fw - w_
        b.op(
            "conv2d",
            op,
            [x, wt],
            group="conv",
            out=f"{op}.ofmap",
            stride=sh if sh == sw else [sh, sw],
            pad=[0, 0, pb, pr] if pb or pr else 0,
            groups=c if depthwise else 1,
            **({"sparsity": sparsity} if sparsity else {}),
        )
    fmt = "gemm" if gemm else "conv"
    return b.graph(sequences=batch, params={"source": str(p), "format": f"scalesim-{fmt}"})


def fold_cycles(
    dataflow: str, rows: int, cols: int, m: int, n: int, k: int, *, drain: bool = False
) -> int:
    """A GEMM layer (``m`` output pixels, ``n`` filters, a window of ``k``) timed as
    SCALE-Sim folds it onto a ``rows x cols`` array: ``os`` ``ceil(m/rows) x
    ceil(n/cols)`` folds of ``k`` steps, ``ws`` ``ceil(k/rows) x ceil(n/cols)`` folds of
    ``m`` steps, each fold one pass of wia-hw's RTL-exact array
    (:func:`~wia_hw.emulator.cycles.systolic_tile_cycles`), less one. Without ``drain``
    an output-stationary fold leaves out the ``rows`` cycles wia-hw's RTL spends
    shifting its results out, as SCALE-Sim counts (``tests/test_scalesim.py`` holds this
    equal to SCALE-Sim's own cycles); with it, what a non-pipelined wia-hw array takes."""
    from .emulator.cycles import systolic_tile_cycles

    if dataflow not in ("os", "ws"):
        raise ValueError(f"fold_cycles: dataflow must be os or ws, got {dataflow!r}")
    for arg, v in (("rows", rows), ("cols", cols), ("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"fold_cycles: {arg} must be a positive integer, got {v!r}")
    sr, sc, t = (m, n, k) if dataflow == "os" else (k, n, m)  # spatial x spatial, temporal
    folds = -(-sr // rows) * -(-sc // cols)
    off = rows if dataflow == "os" and not drain else 0
    return folds * (systolic_tile_cycles(dataflow, rows, cols, t) - off) - 1


def config_mapping(
    path: str | os.PathLike[str], *, base: str = "wia-npu", word_bytes: int = 2
) -> dict[str, Any]:
    """A device spec mapping from a SCALE-Sim ``.cfg`` over the spec ``base`` (see the
    module text); ``word_bytes`` per SCALE-Sim word (2: wia-hw's default fp16) for a
    USER interface bandwidth. :func:`wia_hw.spec.load_spec` validates it (and does
    this, over ``wia-npu``, for a ``.cfg`` path given as a device).

    Raises :class:`~wia_hw.SpecError` naming the file and ``section.Key`` at fault: a
    missing file, section or key, a value that is not a positive integer, the ``is``
    dataflow, an ``InterfaceBandwidth`` other than ``CALC`` or ``USER``.
    """
    from .spec import load_spec

    return scalesim_config_mapping(path, load_spec(base), word_bytes=word_bytes)
