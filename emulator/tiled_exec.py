"""Tiled GEMM execution: the values of a :class:`~wia_hw.emulator.kernels.GemmKernel`
computed tile by tile and array pass by array pass, as the device runs it.

Functional mode hands this module the tiles the timing model runs
(:meth:`Device.tiles_of <wia_hw.emulator.device.Device.tiles_of>`, each with its
``dims = (nb, mi, ni, ki)`` and ``origin = (b0, m0, n0, k0)``), so a tiling bug changes
the computed values, or raises, instead of going unseen.

The arithmetic (``C[b] = A[b] @ B[b]`` for every batch entry ``b``, ``A[b]`` m x k,
``B[b]`` k x n; ``B`` is one matrix for all entries when shared):

1. **Tiles**, in the order given. A tile covers batch entries ``[b0, b0+nb)``, output
   rows ``[m0, m0+mi)``, output columns ``[n0, n0+ni)`` over the K range
   ``[k0, k0+ki)``.
2. **Array passes** inside a tile (:func:`tile_passes`), for an ``R`` x ``C`` array:

   * output-stationary (``os``): per batch entry, one pass per ``(<=R) x (<=C)`` block
     of the tile's outputs (row blocks, then column blocks), each over the tile's
     whole K range;
   * weight-stationary (``ws``): per batch entry and ``(<=C)``-wide column block, one
     pass per ``(<=R)``-long K slice (in K order) that streams all the tile's rows.

   Their number equals the ``passes`` the timing model charged for the tile (checked).
3. **Within a pass**, from a zero accumulator, sequentially over the pass's K:
   int8 -> :func:`~wia_hw.emulator.golden.int8_matmul` (int32, wrapping); fp16/bf16
   -> :func:`~wia_hw.emulator.golden.fp_mac_matmul` (``acc = fl32(acc + fl32(a*b))``
   for ``k = k0, k0+1, ...``: the order of the OS accumulator and of the WS column of
   partial sums, top to bottom); fp32 -> the same model with binary32 inputs (the
   multi-cycle fp32 PE mode; not numpy's ``@``, whose blocked BLAS sum differs in the
   last bits). Operands are first rounded to the
   arithmetic's format (round to nearest even), as storing them in it does.
4. **Across passes and tiles that split K**, outside the array, in K order::

       running = fl32(running + pass)        # floats: IEEE binary32, RNE
       running = wrap32(running + pass)      # int8 GEMMs: int32, modulo 2**32

   ``running`` starts at +0 (a pass never yields -0, so this equals starting from the
   first pass); every NaN is the canonical quiet NaN ``0x7FC00000``, like the PE's.
5. **Bias**, after the last K chunk of an output, once: floats
   ``fl32(running + bias)`` with the bias as stored (its own dtype's values, held in
   binary32); integer GEMMs add an integer bias modulo 2**32 (a float bias is rounded
   to the nearest integer first). The caller rounds the result to the output dtype.

A pass that maps onto part of the array (edge tiles) computes only its real rows and
columns: padding the missing ones with zeros gives the same values (padded outputs are
separate sums; padded K steps add ``fl32(0*0) = +0`` to an accumulator that is never
-0), which the tests check on a padded against an unpadded pass.

Each output's value depends only on the sequence of K ranges folded into it. Before
any arithmetic, :func:`execute_gemm` replays the passes in order and checks that every
output receives contiguous K ranges covering ``[0, K)`` exactly once and in increasing
order (``ValueError`` otherwise). Given that, passes with the same batch entry and K
range are independent sums of the same length, so by default they are evaluated in one
call over the block they cover (``group_passes=True``): bit-identical to running them
one at a time (``group_passes=False``, tested), and it keeps a 256 x 256 x 256 fp16
GEMM well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .golden import fp_mac_matmul, int8_matmul, round_to_precision, wrap_int32
from .kernels import GemmKernel, Tile

__all__ = ["ARITHMETICS", "ArrayPass", "tile_passes", "execute_gemm"]

#: Arithmetics of :func:`execute_gemm`.
ARITHMETICS = ("int8", "fp16", "bf16", "fp32")

_CANONICAL_NAN = np.uint32(0x7FC00000)


@dataclass(frozen=True)
class ArrayPass:
    """One pass of the array: batch entry ``b``, outputs ``[m0, m1) x [n0, n1)``, over
    ``K`` in ``[k0, k1)`` (half-open ranges, in the kernel's coordinates)."""

    b: int
    m0: int
    m1: int
    n0: int
    n1: int
    k0: int
    k1: int


def tile_passes(tile: Tile, dataflow: str, rows: int, cols: int) -> list[ArrayPass]:
    """The array passes of one GEMM tile on a ``rows`` x ``cols`` array, in issue order
    (see the module docstring). Raises ``ValueError`` for a tile without GEMM
    ``dims``/``origin`` or an unknown dataflow."""
    if dataflow not in ("os", "ws"):
        raise ValueError(f"dataflow must be 'os' or 'ws', got {dataflow!r}")
    if len(tile.dims) != 4 or len(tile.origin) != 4:
        raise ValueError(
            f"not a GEMM tile: dims {tile.dims}, origin {tile.origin} (both "
            "must be 4-tuples: (batch, m, n, k) and (b0, m0, n0, k0))"
        )
    nb, mi, ni, ki = tile.dims
    b0, m0, n0, k0 = tile.origin
    m_end, n_end, k_end = m0 + mi, n0 + ni, k0 + ki
    out = []
    for b in range(b0, b0 + nb):
        if dataflow == "os":
            for r in range(m0, m_end, rows):
                for c in range(n0, n_end, cols):
                    out.append(
                        ArrayPass(b, r, min(r + rows, m_end), c, min(c + cols, n_end), k0, k_end)
                    )
        else:
            for c in range(n0, n_end, cols):
                for kk in range(k0, k_end, rows):
                    out.append(
                        ArrayPass(b, m0, m_end, c, min(c + cols, n_end), kk, min(kk + rows, k_end))
                    )
    return out


def _canonical_nan(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32)
    bits[np.isnan(x)] = _CANONICAL_NAN
    return x


def _check_order(
    name: str,
    tiles: Sequence[Tile],
    passes: list[list[ArrayPass]],
    batch: int,
    m: int,
    n: int,
    k: int,
) -> None:
    """Replay the passes: every output gets contiguous K ranges, in order, up to K."""
    reached = np.zeros((batch, m, n), np.int64)
    for t, tile_p in enumerate(passes):
        for p in tile_p:
            if not (
                0 <= p.b < batch
                and 0 <= p.m0 < p.m1 <= m
                and 0 <= p.n0 < p.n1 <= n
                and 0 <= p.k0 < p.k1 <= k
            ):
                raise ValueError(
                    f"kernel {name!r}: tile {t} (dims {tiles[t].dims}, origin "
                    f"{tiles[t].origin}) has a pass outside the GEMM "
                    f"(batch {batch}, m {m}, n {n}, k {k}): {p}"
                )
            blk = reached[p.b, p.m0 : p.m1, p.n0 : p.n1]
            if not np.all(blk == p.k0):
                got = sorted({int(v) for v in np.unique(blk)})[:4]
                raise ValueError(
                    f"kernel {name!r}: tile {t} (dims {tiles[t].dims}, origin "
                    f"{tiles[t].origin}) accumulates K [{p.k0}, {p.k1}) into batch {p.b}, "
                    f"rows [{p.m0}, {p.m1}), cols [{p.n0}, {p.n1}), whose K so far "
                    f"reaches {got}: the tiles do not cover K in order"
                )
            blk[...] = p.k1
    short = reached != k
    if short.any():
        b, i, j = (int(v) for v in np.argwhere(short)[0])
        raise ValueError(
            f"kernel {name!r}: the tiles leave {int(short.sum())} of "
            f"{short.size} outputs short of K={k} (first: batch {b}, row {i}, "
            f"col {j} reaches k={int(reached[b, i, j])})"
        )


def _groups(passes: list[list[ArrayPass]], group: bool) -> list[list[ArrayPass]]:
    """Units of arithmetic: one pass each, or every pass sharing (b, k0, k1), in order
    of k0 (each output's K ranges stay in increasing order)."""
    flat = [p for tile_p in passes for p in tile_p]
    if not group:
        return [[p] for p in flat]
    by: dict[tuple[int, int, int], list[ArrayPass]] = {}
    for p in flat:
        by.setdefault((p.k0, p.b, p.k1), []).append(p)
    return [by[key] for key in sorted(by, key=lambda t: t[0])]


def _blocks(group: list[ArrayPass]) -> list[tuple[int, int, int, int]]:
    """Output blocks to compute for a group: its bounding box when the passes tile it
    exactly (they are disjoint once the order check passed), else one per pass."""
    m0, m1 = min(p.m0 for p in group), max(p.m1 for p in group)
    n0, n1 = min(p.n0 for p in group), max(p.n1 for p in group)
    area = sum((p.m1 - p.m0) * (p.n1 - p.n0) for p in group)
    if area == (m1 - m0) * (n1 - n0):
        return [(m0, m1, n0, n1)]
    return [(p.m0, p.m1, p.n0, p.n1) for p in group]


def execute_gemm(
    kernel: GemmKernel,
    tiles: Sequence[Tile],
    a: np.ndarray,
    b: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    dataflow: str,
    rows: int,
    cols: int,
    arithmetic: str | None = None,
    group_passes: bool = True,
    round_operands: bool = True,
    arrays: int = 1,
) -> np.ndarray:
    """``C[b] = A[b] @ B[b]`` (+ bias) executed over ``tiles`` as the module docstring
    describes; returns ``[batch, m, n]`` int32 (``arithmetic="int8"``) or float32.

    ``a``: ``[batch, m, k]``; ``b``: ``[1, k, n]`` (one matrix for every batch entry)
    or ``[batch, k, n]`` (already transposed when the kernel's B is stored transposed);
    ``bias``: ``[1 or batch, n]`` or ``None``. ``tiles``: the kernel's tiles with
    ``dims`` and ``origin`` (``Device.tiles_of``). ``dataflow``, ``rows``, ``cols``:
    the systolic array's; ``arrays``: the arrays per core, which the timing model deals
    a tile's passes to in rounds (its ``passes`` field counts rounds). ``arithmetic``:
    one of :data:`ARITHMETICS`, default the
    kernel's precision. ``round_operands=False`` skips rounding ``a`` and ``b`` to a
    float format when the caller holds them in it already (the golden model still
    rejects a value that is not representable).

    Raises ``ValueError`` when a shape disagrees with the kernel, when a tile's pass
    count differs from the one its ``passes`` field (the timing model) states, or when
    the tiles do not cover every output's K exactly once in increasing order.
    """
    name = kernel.name
    arith = kernel.precision if arithmetic is None else arithmetic
    if arith not in ARITHMETICS:
        raise ValueError(f"kernel {name!r}: arithmetic must be one of {ARITHMETICS}, got {arith!r}")
    if (
        isinstance(rows, bool)
        or not isinstance(rows, int)
        or rows < 1
        or isinstance(cols, bool)
        or not isinstance(cols, int)
        or cols < 1
    ):
        raise ValueError(
            f"kernel {name!r}: array rows and cols must be positive integers, "
            f"got {rows!r} x {cols!r}"
        )
    batch, m, n, k = kernel.batch, kernel.m, kernel.n, kernel.k
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != (batch, m, k) or b.shape not in ((1, k, n), (batch, k, n)):
        raise ValueError(
            f"kernel {name!r} (batch {batch}, m {m}, n {n}, k {k}): operands A "
            f"{list(a.shape)} and B {list(b.shape)} do not match; A must be "
            f"[{batch}, {m}, {k}] and B [1 or {batch}, {k}, {n}]"
        )
    if bias is not None:
        bias = np.asarray(bias)
        if bias.shape not in ((1, n), (batch, n)):
            raise ValueError(
                f"kernel {name!r}: bias {list(bias.shape)} must be [1 or {batch}, {n}]"
            )
    passes = [tile_passes(t, dataflow, rows, cols) for t in tiles]
    for idx, (t, p) in enumerate(zip(tiles, passes, strict=True)):
        if -(-len(p) // arrays) != t.passes:
            raise ValueError(
                f"kernel {name!r}: tile {idx} (dims {t.dims}) makes {len(p)} "
                f"passes on a {rows}x{cols} {dataflow} array"
                + (f" ({-(-len(p) // arrays)} rounds over {arrays} arrays)" if arrays > 1 else "")
                + f", but the timing model charged {t.passes}"
            )
    _check_order(name, tiles, passes, batch, m, n, k)

    if arith == "int8":
        a_op, b_op = a, b
        acc = np.zeros((batch, m, n), np.int32)
    else:
        a_op, b_op = (
            round_to_precision(np.asarray(v, np.float32), arith)
            if round_operands
            else np.asarray(v, np.float32)
            for v in (a, b)
        )
        acc = np.zeros((batch, m, n), np.float32)
    shared = b_op.shape[0] == 1
    for group in _groups(passes, group_passes):
        bi, k0, k1 = group[0].b, group[0].k0, group[0].k1
        bm = b_op[0 if shared else bi]
        for m0, m1, n0, n1 in _blocks(group):
            x, y = a_op[bi, m0:m1, k0:k1], bm[k0:k1, n0:n1]
            if arith == "int8":
                part = int8_matmul(x, y)
                acc[bi, m0:m1, n0:n1] = wrap_int32(acc[bi, m0:m1, n0:n1].astype(np.int64) + part)
            else:
                part = fp_mac_matmul(x, y, arith)
                with np.errstate(all="ignore"):
                    acc[bi, m0:m1, n0:n1] = acc[bi, m0:m1, n0:n1] + part
    if bias is not None:
        if arith == "int8":
            bz = bias if bias.dtype.kind in "iu" else np.rint(bias.astype(np.float64))
            acc = wrap_int32(acc.astype(np.int64) + bz.astype(np.int64)[:, None, :])
        else:
            with np.errstate(all="ignore"):
                acc = acc + bias.astype(np.float32)[:, None, :]
    return acc if arith == "int8" else _canonical_nan(np.asarray(acc, np.float32))
