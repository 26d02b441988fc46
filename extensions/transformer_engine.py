"""The transformer-engine extension: fused, flash and sparse attention (seed 8.9.1).

Seed::

    wia_transformer_attention_config_t attn_cfg = {.num_heads = 12, .head_dim = 64,
        .sequence_length = 128, .use_flash_attention = true,
        .attention_pattern = WIA_ATTENTION_CAUSAL};
    wia_multi_head_attention(ctx, queries, keys, values, output, &attn_cfg, stream);

Python::

    cfg = AttentionConfig(num_heads=12, head_dim=64, sequence_length=128,
                          use_flash_attention=True, attention_pattern=AttentionPattern.CAUSAL)
    res = multi_head_attention(ctx, q, k, v, output, cfg)   # q, k, v: [B, H, S, D]

Patterns (:class:`AttentionPattern`): ``FULL``; ``CAUSAL`` (query ``i`` sees keys
``j <= i + (S_kv - S_q)``: the triangle is aligned bottom-right, as in FlashAttention
2.1+ and the graphs' causal softmax, so a query block after a cached prefix sees the
prefix and the last query sees every key); ``LOCAL`` (a band, aligned the same way:
``|i + S_kv - S_q - j| <= window_size // 2``); ``BLOCK_SPARSE`` (a ``block_size``
grid of allowed blocks: ``block_layout`` given, or BigBird-like: the diagonal,
``num_global_blocks`` global columns and rows, and random blocks at
``block_density``, seeded). Every query row sees at least one key, which
:class:`AttentionConfig` validates: with fewer keys than queries, bottom-right
alignment would leave the first queries none, so ``CAUSAL`` needs
``kv_sequence_length >= sequence_length`` and ``LOCAL`` needs
``kv_sequence_length >= sequence_length - window_size // 2`` (anything else is
refused, never a NaN row); a ``block_layout`` needs a kept block in every block row.

Numerics (functional): inputs are rounded to ``precision``; both GEMMs accumulate in
float32 (as the array does); softmax runs in float32 with the running maximum
subtracted (so logits of any magnitude are safe); the probabilities are rounded to
``precision`` before the second GEMM, as the hardware feeds them to the array. *Flash*
attention computes the same thing tile by tile with an online softmax (running max
``m``, running sum ``l``, rescaled accumulator); *fast softmax* evaluates
``exp(x - m)`` as ``exp2((x - m) * log2(e))`` (the special-function unit's form).
Errors against a float64 reference (tests): below ``1e-5`` relative (max-norm) in fp32
for every pattern, including logits in the 1e4 range; ``FP16_REL_ERR`` and
``BF16_REL_ERR`` for the half formats (their input rounding dominates).

Timing (emulated): naive attention writes the ``S x S`` scores and probabilities to
memory (three kernels, O(S^2) HBM traffic). Flash attention is one kernel whose tiles
are (heads, query block of ``block_q`` rows, key/value chunk of ``block_kv`` rows): a
tile stages Q, K and V blocks through the caches, computes ``Q K^T`` and ``P V`` on the
array (cycles from the device's systolic cycle functions: each GEMM's passes run back
to back at the array's issue interval, pipelined if the array is), the online softmax
on the vector unit, and only the last chunk of a query block stores its ``O`` block:
O(S d) HBM traffic. Every pattern uses these tiles; causal, local and block-sparse
patterns skip the tiles their mask leaves entirely False (so a block-sparse layout with
every block kept costs exactly ``FULL``, and blocks smaller than a tile save a tile
only when all the blocks it covers are dropped). A query block shorter than the array
(decoding: one row per head) takes several heads per tile (their passes back to back,
two heads' ``P V`` in one pass), as many as the tile's estimated time per core favours.
Short queries take key/value chunks of ``decode_kv_chunk`` rows; when there are few
query blocks the chunks are cut so that every core gets two, spread over the cores
(flash-decoding), and a small combine pass merges the partial results. In a graph,
``cross_attention_optimized`` claims a chain only when that is faster than the built-in
kernels by its own estimate (:func:`cross_attention_estimate`), else it declines.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..emulator.config import DeviceSpec
from ..emulator.counters import Counter, Counters
from ..emulator.cycles import (
    systolic_sequence_counters,
    systolic_sequence_cycles,
    systolic_steps,
    vector_op_cycles,
)
from ..emulator.device import Device, KernelRecord
from ..emulator.enums import StrNamedEnum
from ..emulator.errors import WorkloadError
from ..emulator.extension_kernels import (
    CostedKernel,
    Tile,
    TiledKernel,
    execute_kernels,
    gemm_passes,
)
from ..emulator.golden import round_to_precision
from ..emulator.kernels import TensorRef, VectorKernel
from ..graph import DTYPE_BYTES, Graph, GraphBuilder, Op
from ..lowering import Storage, lower_op
from ..registry import (
    DeviceExtension,
    ExtensionId,
    chain_head,
    ensure_extension,
    match_chain,
)

__all__ = [
    "AttentionPattern",
    "AttentionConfig",
    "AttentionResult",
    "multi_head_attention",
    "attention_reference",
    "attention_mask",
    "multi_head_attention_impl",
    "self_attention_sparse_impl",
    "cross_attention_impl",
    "FP16_REL_ERR",
    "BF16_REL_ERR",
]

#: Documented max-norm relative error bound against float64 for fp16 inputs (input
#: rounding, 2**-11, amplified by the logits' spread) and for bf16 (2**-8).
FP16_REL_ERR = 3e-3
BF16_REL_ERR = 2.5e-2
_LOG2E = 1.4426950408889634


class AttentionPattern(StrNamedEnum):
    """Which keys each query attends to (the seed's ``WIA_ATTENTION_*``)."""

    FULL = "full"
    CAUSAL = "causal"
    LOCAL = "local"
    BLOCK_SPARSE = "block_sparse"


_PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """The seed's ``wia_transformer_attention_config_t`` plus the sparse patterns' shape.

    ``kv_sequence_length`` defaults to ``sequence_length`` (self-attention). ``scale``
    defaults to ``1/sqrt(head_dim)``. ``precision`` (``fp32``, ``fp16``, ``bf16``)
    defaults to the inputs' dtype (float16 -> fp16, otherwise fp32).
    """

    num_heads: int
    head_dim: int
    sequence_length: int
    use_flash_attention: bool = True
    attention_pattern: AttentionPattern = AttentionPattern.FULL
    window_size: int = 256
    block_size: int = 64
    block_layout: Any = None
    block_density: float = 0.2
    num_global_blocks: int = 1
    layout_seed: int = 0
    kv_sequence_length: int | None = None
    scale: float | None = None
    precision: str | None = None
    fast_softmax: bool = True

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "sequence_length", "window_size", "block_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"AttentionConfig.{name} must be a positive integer, got {v!r}")
        kv = self.kv_sequence_length
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
            raise ValueError(
                f"AttentionConfig.kv_sequence_length must be a positive integer, got {kv!r}"
            )
        if (
            isinstance(self.num_global_blocks, bool)
            or not isinstance(self.num_global_blocks, int)
            or self.num_global_blocks < 0
        ):
            raise ValueError(
                f"AttentionConfig.num_global_blocks must be an integer >= 0, "
                f"got {self.num_global_blocks!r}"
            )
        if not isinstance(self.block_density, (int, float)) or not 0 <= self.block_density <= 1:
            raise ValueError(
                f"AttentionConfig.block_density must be in [0, 1], got {self.block_density!r}"
            )
        try:
            object.__setattr__(self, "attention_pattern", AttentionPattern(self.attention_pattern))
        except ValueError:
            raise ValueError(
                f"AttentionConfig.attention_pattern must be one of "
                f"{', '.join(p.value for p in AttentionPattern)}, got "
                f"{self.attention_pattern!r}"
            ) from None
        sq, skv, p = self.sequence_length, self.kv_len, self.attention_pattern
        need = {
            AttentionPattern.CAUSAL: sq,
            AttentionPattern.LOCAL: sq - self.window_size // 2,
        }.get(p, 1)
        if skv < need:
            # bottom-right alignment (see the module docstring): query 0 sees keys up
            # to (or within window_size // 2 of) key skv - sq, which does not exist
            raise ValueError(
                f"AttentionConfig: a {p.value} pattern with kv_sequence_length {skv} < "
                f"{need} leaves the first {need - skv} queries (of sequence_length {sq}) "
                f"no key to attend to (the mask is aligned bottom-right); "
                f"kv_sequence_length must be >= {need}"
            )
        if self.precision is not None and self.precision not in _PRECISIONS:
            raise ValueError(
                f"AttentionConfig.precision must be one of "
                f"{', '.join(_PRECISIONS)}, got {self.precision!r}"
            )
        if self.scale is not None and (
            not isinstance(self.scale, (int, float)) or not math.isfinite(self.scale)
        ):
            raise ValueError(f"AttentionConfig.scale must be a finite number, got {self.scale!r}")
        if self.block_layout is not None:
            lay = np.asarray(self.block_layout, dtype=bool)
            nq = -(-self.sequence_length // self.block_size)
            nk = -(-self.kv_len // self.block_size)
            if lay.shape != (nq, nk):
                raise ValueError(
                    f"AttentionConfig.block_layout must be {nq} x {nk} blocks "
                    f"(sequence {self.sequence_length}, kv {self.kv_len}, "
                    f"block_size {self.block_size}), got shape {lay.shape}"
                )
            if not lay.any(axis=1).all():
                row = int(np.flatnonzero(~lay.any(axis=1))[0])
                raise ValueError(
                    f"AttentionConfig.block_layout: query block {row} attends to no key block"
                )
            object.__setattr__(self, "block_layout", lay)

    @property
    def kv_len(self) -> int:
        return self.kv_sequence_length or self.sequence_length

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else float(self.scale)

    def layout(self) -> np.ndarray:
        """The block layout of ``BLOCK_SPARSE`` (``nq x nk`` booleans)."""
        if self.block_layout is not None:
            return self.block_layout
        bs = self.block_size
        nq, nk = -(-self.sequence_length // bs), -(-self.kv_len // bs)
        rng = np.random.default_rng(self.layout_seed)
        lay = rng.random((nq, nk)) < self.block_density
        off = (self.kv_len - self.sequence_length) // bs
        for i in range(nq):
            lay[i, min(nk - 1, max(0, i + off))] = True  # the diagonal
        g = min(self.num_global_blocks, nk)
        lay[:, :g] = True
        lay[: min(self.num_global_blocks, nq), :] = True
        return lay


def attention_mask(
    cfg: AttentionConfig, sq: int | None = None, skv: int | None = None
) -> np.ndarray | None:
    """The ``sq x skv`` boolean mask of ``cfg``'s pattern (``None`` for FULL)."""
    sq = cfg.sequence_length if sq is None else sq
    skv = cfg.kv_len if skv is None else skv
    p = cfg.attention_pattern
    if p is AttentionPattern.FULL:
        return None
    i = np.arange(sq)[:, None] + (skv - sq)
    j = np.arange(skv)[None, :]
    if p is AttentionPattern.CAUSAL:
        return j <= i
    if p is AttentionPattern.LOCAL:
        return np.abs(i - j) <= cfg.window_size // 2
    bs = cfg.block_size
    lay = cfg.layout()
    return lay[np.arange(sq)[:, None] // bs, j // bs]


def _block_allowed(mask: np.ndarray | None, q0: int, q1: int, k0: int, k1: int) -> bool:
    return mask is None or bool(mask[q0:q1, k0:k1].any())


# -- numerics ---------------------------------------------------------------------------


def attention_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray | None = None
) -> np.ndarray:
    """Naive attention in float64: ``softmax(q k^T * scale, masked) v``."""
    q64, k64, v64 = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = (q64 @ np.swapaxes(k64, -1, -2)) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(axis=-1, keepdims=True)) @ v64


def _exp(x: np.ndarray, fast: bool) -> np.ndarray:
    return np.exp2(x * np.float32(_LOG2E)) if fast else np.exp(x)


def _naive(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    mask: np.ndarray | None,
    prec: str,
    fast: bool,
) -> np.ndarray:
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.float32(scale)
    if mask is not None:
        s = np.where(mask, s, np.float32(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    e = _exp(s - m, fast)
    p = e / e.sum(axis=-1, keepdims=True)
    return np.matmul(round_to_precision(p, prec), v)


def _flash(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    mask: np.ndarray | None,
    prec: str,
    fast: bool,
    br: int,
    bc: int,
) -> np.ndarray:
    sq, skv = q.shape[-2], k.shape[-2]
    out = np.empty(q.shape[:-1] + (v.shape[-1],), dtype=np.float32)
    sc = np.float32(scale)
    for q0 in range(0, sq, br):
        q1 = min(sq, q0 + br)
        qb = q[..., q0:q1, :]
        m = np.full(qb.shape[:-1] + (1,), -np.inf, dtype=np.float32)
        l_ = np.zeros_like(m)
        acc = np.zeros(qb.shape[:-1] + (v.shape[-1],), dtype=np.float32)
        for k0 in range(0, skv, bc):
            k1 = min(skv, k0 + bc)
            if not _block_allowed(mask, q0, q1, k0, k1):
                continue  # a masked tile is never computed
            s = np.matmul(qb, np.swapaxes(k[..., k0:k1, :], -1, -2)) * sc
            if mask is not None:
                s = np.where(mask[q0:q1, k0:k1], s, np.float32(-np.inf))
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            safe = np.where(np.isfinite(m_new), m_new, np.float32(0))
            p = _exp(s - safe, fast)
            alpha = np.where(np.isfinite(m), _exp(m - safe, fast), np.float32(0))
            l_ = alpha * l_ + p.sum(axis=-1, keepdims=True)
            acc = alpha * acc + np.matmul(round_to_precision(p, prec), v[..., k0:k1, :])
            m = m_new
        out[..., q0:q1, :] = acc / l_
    return out


# -- timing: kernels ----------------------------------------------------------------------


def _softmax_cpe(spec: DeviceSpec, ext: DeviceExtension | None, fast: bool) -> int:
    if fast and ext is not None and ext.param("fast_softmax"):
        return int(ext.param("fast_softmax_cycles_per_element"))
    return int(spec.compute.vector.cycles_per_element["softmax"])


@dataclass(frozen=True)
class _Shape:
    bh: int
    sq: int
    skv: int
    d: int
    dv: int
    e: int  # bytes per element of Q, K, V and P
    e_out: int  # bytes per element of O
    precision: str


def _gemm_run(
    spec: DeviceSpec, precision: str, heads: int, m: int, n: int, k: int, e: int
) -> tuple[int, int, int, int, int]:
    """(passes, cycles, L1 bytes the array reads, MAC slots, busy cycles) of ``heads``
    independent GEMMs ``[m, k] @ [k, n]`` that a tile runs back to back on its core.

    Heads whose blocks are smaller than the array share a pass block-diagonally
    (output-stationary: ``p`` heads side by side, ``p * m <= rows`` and ``p * n <=
    cols``; weight-stationary: ``p * k <= rows``, ``p * n <= cols``): the PEs of each
    diagonal block accumulate their own head, the others idle. A decoding step's one
    query row per head thus shares a ``P V`` pass with the next head (``head_dim = 64``
    of 128 columns). The passes are one back-to-back run whose issue interval is the
    array's (:func:`~wia_hw.emulator.cycles.systolic_sequence_cycles`: its
    ``pipelined`` flag decides whether a pass streams in while the previous drains),
    dealt to the core's ``arrays_per_core`` arrays in rounds, as the device runs its own
    passes. A tile's two GEMMs are two runs: ``P V`` waits for the softmax of ``Q K^T``.
    """
    a = spec.compute.array
    R, C, df = a.rows, a.cols, a.dataflow
    fit = min(R // m, C // n) if df == "os" else min(R // k, C // n)
    p = max(1, min(fit, heads))
    mm, nn, kk = (m * p, n * p, k) if df == "os" else (m, n * p, k * p)
    passes, _, l1, slot, _ = gemm_passes(spec, precision, -(-heads // p), mm, nn, kk, e, 4)
    arrays = spec.compute.arrays_per_core
    rounds = -(-passes // arrays)
    steps = systolic_steps(kk if df == "os" else mm, a.rate(precision))
    # equal passes back to back: the array's own sequence functions (the RTL's)
    depths = [steps] * rounds
    cycles = systolic_sequence_cycles(df, R, C, depths, pipelined=a.pipelined)
    busy = systolic_sequence_counters(df, R, C, depths, pipelined=a.pipelined)[Counter.BUSY_CYCLES]
    return rounds, cycles, l1, slot // passes * rounds * arrays, busy


def _heads_per_tile(
    spec: DeviceSpec,
    ext: DeviceExtension | None,
    s: _Shape,
    br: int,
    bc: int,
    fast: bool,
    resident: bool,
) -> int:
    """Heads one flash tile takes. A query block shorter than the array's rows
    (decoding: one row) leaves the array mostly idle per head, so a tile may take up to
    ``rows // query rows`` heads (their passes run back to back and ``P V`` passes are
    shared, see :func:`_gemm_run`), as long as its operands and score scratch fit half
    of L1 (the other half holds the next tile's operands). Among those counts the one
    with the least estimated time per core: the first tile's load, then each tile at
    the slower of its load and its compute (array runs and vector work), then the last
    tile's compute. Operands load at the core's share of the bandwidth of the level
    they sit in: L2 when ``resident``, else HBM."""
    rq, ck = min(br, s.sq), min(bc, s.skv)
    load = (rq * s.d + ck * (s.d + s.dv)) * s.e
    per_head = load + rq * ck * (4 + s.e) + rq * s.dv * 4
    cap = min(spec.compute.array.rows // rq, spec.memory.l1.size_bytes // 2 // per_head)
    if cap <= 1:
        return 1
    cores = spec.compute.cores
    # the level the operands sit in; each core loads at its share of its bandwidth
    level = spec.memory.l2 if resident else spec.memory.hbm
    bw = float(spec.bytes_per_cycle(level.bandwidth_gbs)) / cores
    v = spec.compute.vector
    cpe = _softmax_cpe(spec, ext, fast)
    blocks = -(-s.sq // br) * -(-s.skv // bc)  # tiles of one head group
    best, best_g = math.inf, 1
    for g in range(1, min(cap, s.bh) + 1):
        groups = -(-s.bh // g)
        tiles = -(-groups * blocks // cores)  # tiles per core
        comp = (
            _gemm_run(spec, s.precision, g, rq, ck, s.d, s.e)[1]
            + _gemm_run(spec, s.precision, g, rq, s.dv, ck, s.e)[1]
            + vector_op_cycles(g * rq * ck, v.lanes, cpe, v.pipeline_depth)
            + 2 * vector_op_cycles(g * rq * s.dv, v.lanes, 1, v.pipeline_depth)
        )
        ld = g * load / bw
        est = ld + (tiles - 1) * max(ld, comp) + comp
        if est < best:
            best, best_g = est, g
    return best_g


def flash_attention_kernels(
    spec: DeviceSpec,
    ext: DeviceExtension | None,
    *,
    name: str,
    op: str,
    group: str,
    shape: _Shape,
    q: TensorRef,
    k: TensorRef,
    v: TensorRef,
    o: TensorRef,
    mask: np.ndarray | None,
    br: int,
    bc: int,
    fast: bool,
    io: Any = ((), ()),
    operation: str = "multi_head_attention_fused",
    split_kv: bool = False,
    bias: tuple[TensorRef, list[int], bool] | None = None,
    resident: bool = False,
) -> list[Any]:
    """The flash-attention kernel(s) of ``bh`` heads (see the module docstring).

    ``mask`` (``sq x skv`` booleans, or None) decides which tiles exist. With
    ``split_kv`` the key/value chunks of a query block are spread over the cores and a
    combine pass (a vector kernel) merges their partial results. ``bias`` (an additive
    term of the scores: a padding mask, a position bias) is ``(its rows x skv, the
    first row of each head's slice, whether it has a row per query)``: each tile loads
    its block of it and adds it to the scores. ``resident``: Q, K and V sit in L2 (their
    producers just wrote them), which the choice of heads per tile assumes.
    """
    s = shape
    lanes = spec.compute.vector.lanes
    depth = spec.compute.vector.pipeline_depth
    cpe = _softmax_cpe(spec, ext, fast)
    hpt = _heads_per_tile(spec, ext, s, br, bc, fast, resident)
    tiles: list[Tile] = []
    groups: list[int] = []
    macs = 0
    vflops = 0
    geo: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {}
    possible = 0
    part_rows = 0
    part = TensorRef(f"{o.name}.partials", 1, s.dv + 2, 4) if split_kv else None

    def rows(ref: TensorRef, h0: int, h1: int, per: int, r0: int, r1: int, c1: int) -> list[Any]:
        # rows [r0, r1) of heads [h0, h1) of a [heads * per, c1] tensor: one region
        # when they are contiguous, else one per head
        if r0 == 0 and r1 == per:
            return [(ref, h0 * per, h1 * per, 0, c1)]
        return [(ref, h * per + r0, h * per + r1, 0, c1) for h in range(h0, h1)]

    for h0 in range(0, s.bh, hpt):
        h1 = min(s.bh, h0 + hpt)
        nh = h1 - h0
        for q0 in range(0, s.sq, br):
            q1 = min(s.sq, q0 + br)
            rq = q1 - q0
            kvs = [
                (k0, min(s.skv, k0 + bc))
                for k0 in range(0, s.skv, bc)
                if _block_allowed(mask, q0, q1, k0, min(s.skv, k0 + bc))
            ]
            possible += -(-s.skv // bc)  # a tile covers all nh heads of the group
            if not split_kv:
                groups.append(len(tiles))
            qregs = rows(q, h0, h1, s.sq, q0, q1, s.d)
            for n, (k0, k1) in enumerate(kvs):
                ck = k1 - k0
                key = (nh, rq, ck)
                g = geo.get(key)
                if g is None:
                    p1 = _gemm_run(spec, s.precision, nh, rq, ck, s.d, s.e)
                    p2 = _gemm_run(spec, s.precision, nh, rq, s.dv, ck, s.e)
                    g = geo[key] = tuple(a + b for a, b in zip(p1, p2, strict=True))
                passes, arr, l1_arr, slot, busy = g
                last = n == len(kvs) - 1
                vec = vector_op_cycles(nh * rq * ck, lanes, cpe, depth) + vector_op_cycles(
                    nh * rq * s.dv, lanes, 1, depth
                )
                vflops += nh * (5 * rq * ck + 2 * rq * s.dv)
                stores = []
                if split_kv:
                    groups.append(len(tiles))
                    stores.append((part, part_rows, part_rows + nh * rq, 0, s.dv + 2))
                    part_rows += nh * rq
                elif last:
                    vec += vector_op_cycles(nh * rq * s.dv, lanes, 1, depth)  # O / l
                    vflops += nh * rq * s.dv
                    stores.extend(rows(o, h0, h1, s.sq, q0, q1, s.dv))
                loads = [
                    *qregs,
                    *rows(k, h0, h1, s.skv, k0, k1, s.d),
                    *rows(v, h0, h1, s.skv, k0, k1, s.dv),
                ]
                if bias is not None:  # its block of the additive term, added to S
                    bref, base, per_query = bias
                    for b in range(h0, h1):
                        r0, r1 = (
                            (base[b] + q0, base[b] + q1) if per_query else (base[b], base[b] + 1)
                        )
                        loads.append((bref, r0, r1, k0, k1))
                    vec += vector_op_cycles(nh * rq * ck, lanes, 1, depth)
                    vflops += nh * rq * ck
                # L1 traffic: the array reads Q, K, V and P; S (fp32) and P go through L1
                # once each way; the fp32 accumulator of O is read-modified-written
                l1 = l1_arr + nh * (rq * ck * (4 * 2 + s.e) + rq * s.dv * 4 * 2)
                tmacs = nh * rq * ck * (s.d + s.dv)
                macs += tmacs
                tiles.append(Tile(loads, stores, arr, vec, l1, passes, tmacs, slot, busy))
    if not tiles:
        raise WorkloadError(f"op {op!r}: the attention mask leaves no tile to compute")
    kernels: list[Any] = []
    compulsory = q.nbytes + k.nbytes + v.nbytes + o.nbytes + (bias[0].nbytes if bias else 0)
    extra = {
        "operation": operation,
        "flash": True,
        "tiles": len(tiles),
        "skipped_tiles": possible - len(tiles),
    }
    if split_kv and part is not None:
        part = replace(part, rows=part_rows)
        tiles = [replace(t, stores=[(part,) + tuple(st[1:]) for st in t.stores]) for t in tiles]
    kernels.append(
        TiledKernel(
            name=name,
            op=op,
            group=group,
            op_kind="bmm",
            io=io,
            provider="transformer_engine",
            record_kind="gemm",
            precision=s.precision,
            tiles=tuple(tiles),
            groups=tuple(groups),
            macs=macs,
            flops=2 * macs + vflops,
            vector_flops=vflops,
            compulsory_bytes=compulsory,
            extra=extra,
        )
    )
    if split_kv and part is not None:
        rows = s.bh * s.sq
        elements = part_rows * (s.dv + 2)
        budget = spec.memory.l1.size_bytes // 4
        rpt = max(
            1,
            min(
                -(-rows // spec.compute.cores),
                budget // max(1, (s.dv + 2) * 4 * max(1, part_rows // rows)),
            ),
        )
        kernels.append(
            VectorKernel(
                name=f"{name}.combine",
                op=op,
                group=group,
                op_kind="bmm",
                io=io,
                provider="transformer_engine",
                vclass="elementwise",
                rows=rows,
                elements=elements,
                flops=3 * elements,
                inputs=(part,),
                outputs=(o,),
                rows_per_tile=rpt,
                precision=s.precision,
            )
        )
    return kernels


# -- lowering: the attention chain of a graph -------------------------------------------

_CHAIN = (("bmm",), ("softmax",), ("bmm",))


def _attention_chain_ok(graph: Graph) -> Any:
    def accept(chain: list[Op]) -> bool:
        scores, soft, ctx = chain
        if not scores.attrs.get("transpose_b") or ctx.attrs.get("transpose_b"):
            return False
        if soft.attrs.get("axis", -1) not in (-1, len(graph.tensors[soft.inputs[0]].shape) - 1):
            return False
        if soft.attrs.get("log"):  # a log-softmax is no attention's softmax
            return False
        if ctx.inputs[0] != soft.outputs[0]:
            return False
        qs = graph.tensors[scores.inputs[0]].shape
        vs = graph.tensors[ctx.inputs[1]].shape
        return len(qs) >= 3 and len(vs) == len(qs) and qs[:-2] == vs[:-2]

    return accept


def _attention_role(op: Op, graph: Graph) -> tuple[str, list[Op]] | None:
    """``("head", chain)`` when ``op`` starts an attention chain, ``("tail", chain)``
    when it is a later member of one, else ``None``."""
    accept = _attention_chain_ok(graph)
    chain = match_chain(graph, op, _CHAIN, accept)
    if chain is not None:
        return "head", chain
    hit = chain_head(graph, op, _CHAIN, accept)
    if hit is not None:
        chain = match_chain(graph, hit[0], _CHAIN, accept)
        if chain is not None:
            return "tail", chain
    return None


def _graph_attention(
    chain: list[Op],
    graph: Graph,
    spec: DeviceSpec,
    storage: Any,
    ext: DeviceExtension,
    operation: str,
    cross: bool,
) -> list[Any]:
    scores, soft, ctx = chain
    t = graph.tensors
    qs, ks, vs = (t[scores.inputs[0]].shape, t[scores.inputs[1]].shape, t[ctx.inputs[1]].shape)
    bh = math.prod(qs[:-2])
    sq, d, skv, dv = qs[-2], qs[-1], ks[-2], vs[-1]
    dtype = t[scores.inputs[0]].dtype
    prec = {"int8": "int8", "fp16": "fp16", "bf16": "bf16"}.get(dtype, "fp32")
    if not spec.supports(prec):
        return []  # pragma: no cover - the builder would have failed first
    shape = _Shape(
        bh, sq, skv, d, dv, DTYPE_BYTES[dtype], DTYPE_BYTES[t[ctx.outputs[0]].dtype], prec
    )
    mask = None
    if soft.attrs.get("causal"):
        mask = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
    q = storage.ref(scores.inputs[0], bh * sq, d)
    k = storage.ref(scores.inputs[1], bh * skv, d)
    v = storage.ref(ctx.inputs[1], bh * skv, dv)
    o = storage.ref(ctx.outputs[0], bh * sq, dv)
    io = ((scores.inputs[0], scores.inputs[1], ctx.inputs[1], *soft.inputs[1:]), ctx.outputs)
    name = f"{scores.name}+softmax+context"
    biased_keys = len(soft.inputs) > 1 and graph.tensors[soft.inputs[1]].shape[-1] != skv
    if not ext.param("use_flash_attention") or biased_keys:
        # (a bias broadcast along the keys has no key blocks to stream: three kernels)
        return _naive_graph_kernels(chain, graph, spec, storage, ext)
    bias = _bias_stream(graph, storage, soft, qs[:-2], sq, skv)
    br, bc = int(ext.param("block_q")), int(ext.param("block_kv"))
    split = False
    if cross:
        bc, split = _cross_chunks(spec, ext, bh, sq, skv, br, bc)
    # operands their producers just wrote (or the host put in L2) and that fit there
    kinds = [graph.tensors[n] for n in (scores.inputs[0], scores.inputs[1], ctx.inputs[1])]
    resident = sum(x.nbytes for x in kinds) <= spec.memory.l2.size_bytes and all(
        x.kind == "activation" or (x.kind == "input" and spec.memory.host_io == "l2") for x in kinds
    )
    return flash_attention_kernels(
        spec,
        ext,
        name=name,
        op=scores.name,
        group=scores.group,
        shape=shape,
        q=q,
        k=k,
        v=v,
        o=o,
        mask=mask,
        br=br,
        bc=bc,
        fast=True,
        io=io,
        operation=operation,
        split_kv=split,
        bias=bias,
        resident=resident,
    )


def _cross_chunks(
    spec: DeviceSpec, ext: DeviceExtension, bh: int, sq: int, skv: int, br: int, bc: int
) -> tuple[int, bool]:
    """Key/value rows per tile of cross-attention and decoding, and whether the chunks
    are split over the cores (flash-decoding). Short queries (one query block) take
    chunks of ``decode_kv_chunk`` rows: long chunks amortise the array's fill and drain
    of ``P V``. When there are fewer query blocks than twice the cores, the chunks are
    cut shorter (to the array's columns at the least) so that every core gets two, and
    are spread over the cores with a combine pass."""
    cores, cols = spec.compute.cores, spec.compute.array.cols
    qblocks = bh * -(-sq // br)
    if sq <= br:
        bc = int(ext.param("decode_kv_chunk"))
    if qblocks < 2 * cores:
        pieces = -(-2 * cores // qblocks)
        per = -(-skv // pieces)
        bc = min(bc, max(cols, -(-per // cols) * cols))
        return bc, skv > bc
    return bc, False


def _bias_stream(
    graph: Graph, storage: Any, soft: Op, lead: tuple[int, ...], sq: int, skv: int
) -> tuple[TensorRef, list[int], bool] | None:
    """The softmax's additive term (its second input, broadcast to the scores
    ``[*lead, sq, skv]``) as flash attention streams it: the tensor as rows of ``skv``,
    each head's first row, and whether it has a row per query."""
    if len(soft.inputs) < 2:
        return None
    shape = graph.tensors[soft.inputs[1]].shape
    full = (1,) * (len(lead) + 2 - len(shape)) + tuple(shape)
    blead, bq = full[: len(lead)], full[-2]
    rows = math.prod(full[:-1])
    ref = storage.ref(soft.inputs[1], rows, skv)
    base = []
    for idx in np.ndindex(*lead) if lead else [()]:
        flat = 0
        for i, n in zip(idx, blead, strict=True):
            flat = flat * n + (i if n > 1 else 0)
        base.append(flat * bq)
    return ref, base, bq > 1


def _naive_graph_kernels(
    chain: list[Op], graph: Graph, spec: DeviceSpec, storage: Any, ext: DeviceExtension
) -> list[Any]:
    """Fused (not flash) attention: the three kernels of the chain back to back, the
    softmax on the fast-softmax unit; the scores and probabilities go through memory."""
    out: list[Any] = []
    for o in chain:
        for kern in lower_op(o, graph, spec, storage):
            if isinstance(kern, VectorKernel) and kern.vclass == "softmax":
                kern = _fast_softmax_kernel(kern, spec, ext)
            out.append(replace(kern, provider="transformer_engine"))
    return out


def _fast_softmax_kernel(kern: VectorKernel, spec: DeviceSpec, ext: DeviceExtension | None) -> Any:
    cpe = _softmax_cpe(spec, ext, True)
    lanes, depth = spec.compute.vector.lanes, spec.compute.vector.pipeline_depth

    def cost(d: Any) -> tuple[int, int | None, float | None]:
        return vector_op_cycles(d["ELEMENTS"], lanes, cpe, depth), None, None

    return CostedKernel(
        name=kern.name,
        op=kern.op,
        group=kern.group,
        op_kind=kern.op_kind,
        io=kern.io,
        attrs=kern.attrs,
        provider="transformer_engine",
        inner=kern,
        tile_cost=cost,
        extra={"operation": "fast_softmax"},
    )


def _chain_operation(
    chain: list[Op], graph: Graph, spec: DeviceSpec, storage: Any, ext: DeviceExtension
) -> str | None:
    """Which operation lowers an attention chain: the same answer for the chain's head
    and its tail ops (a tail lowers to nothing only when the head is claimed).
    ``multi_head_attention_fused`` when queries and keys are equally long; else
    ``cross_attention_optimized`` if, by its own estimate
    (:func:`cross_attention_estimate`), it is faster than the built-in kernels; else
    none (the built-in lowering runs). A causal chain in which a query sees no key
    (more queries than keys) is left to the built-in softmax, whose masked rows are
    zeros."""
    sq = graph.tensors[chain[0].inputs[0]].shape[-2]
    skv = graph.tensors[chain[0].inputs[1]].shape[-2]
    if chain[1].attrs.get("causal") and skv < sq:
        return None
    if sq == skv:
        return "multi_head_attention_fused"
    est = cross_attention_estimate(chain, graph, spec, storage, ext)
    if (
        est["engine_cycles_estimate"] >= est["builtin_cycles_estimate"]
        or est["engine_warm_cycles_estimate"] >= est["builtin_warm_cycles_estimate"]
    ):
        return None  # by its own estimate the engine would be slower: built-in runs it
    return "cross_attention_optimized"


#: Recent :func:`cross_attention_estimate` results, by what decides them.
_ESTIMATES: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_ESTIMATES_KEPT = 8


def cross_attention_estimate(
    chain: list[Op], graph: Graph, spec: DeviceSpec, storage: Any, ext: DeviceExtension
) -> dict[str, int]:
    """The estimate ``cross_attention_optimized`` decides by (query length != key
    length: cross-attention, decoding with a KV cache): its kernels and the built-in
    lowering of the chain (two ``bmm`` and a ``softmax`` kernel) each run on an idle
    device of ``spec`` twice: caches cold (inputs in HBM), then warm (inputs where
    the first run left them), as the lowering runs before the caches' state is known.
    The engine claims the chain only when it is faster in both: ``engine_cycles_estimate``
    and ``builtin_cycles_estimate`` (cold), ``engine_warm_cycles_estimate`` and
    ``builtin_warm_cycles_estimate`` (warm); its kernel record reports all four. Chains
    of the same shapes on the same device and storage share one estimate (a model's
    layers: one run each, not one per layer)."""
    t = graph.tensors
    scores, soft, ctx = chain
    key = (
        id(spec),
        id(storage),
        tuple((t[n].shape, t[n].dtype) for n in (*scores.inputs, *soft.inputs, *ctx.inputs)),
        t[ctx.outputs[0]].dtype,
        repr(sorted(soft.attrs.items())),
        repr(sorted(ext.values.items())),
    )
    hit = _ESTIMATES.get(key)
    if hit is None or hit[0] is not spec or hit[1] is not storage:
        engine = _graph_attention(
            chain, graph, spec, storage, ext, "cross_attention_optimized", cross=True
        )
        builtin = [kern for o in chain for kern in lower_op(o, graph, spec, storage)]
        runs = []
        for kernels in (engine, builtin):
            dev = Device(spec)
            for _ in range(2):  # cold, then warm (the same kernels again)
                start = dev.now
                execute_kernels(dev, kernels)
                runs.append(dev.now - start)
        while len(_ESTIMATES) >= _ESTIMATES_KEPT:
            del _ESTIMATES[next(iter(_ESTIMATES))]
        hit = _ESTIMATES[key] = (spec, storage, *runs)
    return dict(zip(_ESTIMATE_NAMES, hit[2:], strict=True))


_ESTIMATE_NAMES = (
    "engine_cycles_estimate",
    "engine_warm_cycles_estimate",
    "builtin_cycles_estimate",
    "builtin_warm_cycles_estimate",
)


def multi_head_attention_impl(
    op: Op, graph: Graph, spec: DeviceSpec, storage: Any, ext: DeviceExtension
) -> list[Any] | None:
    """Lowering of ``multi_head_attention_fused``: a self-attention chain (``bmm``
    with ``transpose_b`` -> ``softmax`` -> ``bmm``, equal query and key lengths) becomes
    one flash-attention kernel on its first op; the other two ops lower to nothing."""
    role = _attention_role(op, graph)
    if role is None:
        return None
    kind, chain = role
    if _chain_operation(chain, graph, spec, storage, ext) != "multi_head_attention_fused":
        return None  # cross-attention / decoding, or the built-in's: not ours
    if kind == "tail":
        return []
    return _graph_attention(
        chain, graph, spec, storage, ext, "multi_head_attention_fused", cross=False
    )


def cross_attention_impl(
    op: Op, graph: Graph, spec: DeviceSpec, storage: Any, ext: DeviceExtension
) -> list[Any] | None:
    """Lowering of ``cross_attention_optimized``: an attention chain whose query length
    differs from its key length (cross-attention, decoding with a KV cache), when the
    engine's estimate beats the built-in kernels (:func:`cross_attention_estimate`;
    else it declines); short query blocks take several heads per tile and, when they
    are few, split the keys over the cores (flash-decoding)."""
    role = _attention_role(op, graph)
    if role is None:
        return None
    kind, chain = role
    if _chain_operation(chain, graph, spec, storage, ext) != "cross_attention_optimized":
        return None
    if kind == "tail":
        return []
    est = cross_attention_estimate(chain, graph, spec, storage, ext)  # the one decided by
    kernels = _graph_attention(
        chain, graph, spec, storage, ext, "cross_attention_optimized", cross=True
    )
    for i, kern in enumerate(kernels):  # the flash kernel (or fast softmax) reports it
        if isinstance(kern, (TiledKernel, CostedKernel)):
            kernels[i] = replace(kern, extra={**kern.extra, **est})
            break
    return kernels


def self_attention_sparse_impl(
    op: Op, graph: Graph, spec: DeviceSpec, storage: Any, ext: DeviceExtension
) -> list[Any] | None:
    """``self_attention_sparse``: graphs carry no sparse pattern, so it claims no graph
    op; :func:`multi_head_attention` runs it for ``LOCAL`` and ``BLOCK_SPARSE``."""
    return None


# -- the user API -------------------------------------------------------------------------


@dataclass
class AttentionResult:
    """What :func:`multi_head_attention` did: the output and its emulated cost.

    ``hbm_bytes``: bytes that crossed the HBM interface (reads and the write-back of
    the results); ``counters``: every counter's delta; ``kernels``: one record per kernel.
    """

    output: np.ndarray | None = field(repr=False)
    operation: str
    flash: bool
    cycles: int
    latency_ms: float
    hbm_bytes: int
    macs: int
    flops: int
    counters: Counters = field(repr=False)
    kernels: list[KernelRecord] = field(default_factory=list, repr=False)


_calls = itertools.count()


def _as_heads(name: str, x: np.ndarray, cfg: AttentionConfig, seq: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim == 3:
        arr = arr[None]
    want = (cfg.num_heads, seq, cfg.head_dim)
    if arr.ndim != 4 or arr.shape[1:] != want:
        raise WorkloadError(
            f"multi_head_attention: {name} has shape {list(np.shape(x))}, the "
            f"config needs [batch, {want[0]}, {want[1]}, {want[2]}] (num_heads, "
            f"sequence length, head_dim)"
        )
    if arr.dtype.kind != "f":
        raise WorkloadError(f"multi_head_attention: {name} must be a float array, got {arr.dtype}")
    return arr


def multi_head_attention(
    ctx: Any,
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    output: np.ndarray | None = None,
    cfg: AttentionConfig | None = None,
    stream: Any = None,
    *,
    functional: bool = True,
) -> AttentionResult:
    """Attention of ``queries`` over ``keys``/``values`` on ``ctx``'s device (the seed's
    ``wia_multi_head_attention``).

    Shapes: ``[batch, num_heads, S, head_dim]`` (or without the batch axis) for the
    queries, ``[batch, num_heads, S_kv, head_dim]`` for keys and values. ``output``,
    if given, receives the result (same shape as the queries). Registers the built-in
    transformer engine on ``ctx`` if it is not registered yet; its parameters
    (``block_q``, ``block_kv``, ``fast_softmax``...) shape the kernel. ``stream`` is
    accepted for the seed's signature; the emulator runs one stream. With
    ``functional=False`` only the timing is emulated (``output`` is left alone and the
    result's ``output`` is ``None``): shapes are all it needs. Raises
    :class:`~wia_hw.WorkloadError` when a shape disagrees with ``cfg``.
    """
    if cfg is None:
        raise WorkloadError("multi_head_attention: cfg (an AttentionConfig) is required")
    if not isinstance(cfg, AttentionConfig):
        raise TypeError(f"cfg must be an AttentionConfig, got {type(cfg).__name__}")
    q = _as_heads("queries", queries, cfg, cfg.sequence_length)
    k = _as_heads("keys", keys, cfg, cfg.kv_len)
    v = _as_heads("values", values, cfg, cfg.kv_len)
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise WorkloadError(
            f"multi_head_attention: batch sizes differ: queries "
            f"{q.shape[0]}, keys {k.shape[0]}, values {v.shape[0]}"
        )
    ext = ensure_extension(ctx, ExtensionId.TRANSFORMER_ENGINE)
    prec = cfg.precision or ("fp16" if q.dtype == np.float16 else "fp32")
    mask = attention_mask(cfg)
    sparse = cfg.attention_pattern in (AttentionPattern.LOCAL, AttentionPattern.BLOCK_SPARSE)
    # every pattern runs on the same block_q x block_kv tiles (the array's size), so a
    # sparse pattern runs a subset of the dense tiles: a tile is skipped when its mask
    # is all False (block-sparse blocks smaller than a tile save a tile only together)
    br, bc = int(ext.param("block_q")), int(ext.param("block_kv"))
    fast = cfg.fast_softmax and bool(ext.param("fast_softmax"))
    result_arr = None
    if functional:
        qr, kr, vr = (round_to_precision(a.astype(np.float32), prec) for a in (q, k, v))
        if cfg.use_flash_attention:
            out = _flash(qr, kr, vr, cfg.softmax_scale, mask, prec, fast, br, bc)
        else:
            out = _naive(qr, kr, vr, cfg.softmax_scale, mask, prec, fast)
        out = round_to_precision(out, prec)
        result_arr = out.reshape(np.shape(queries)).astype(
            np.float16 if prec == "fp16" and np.asarray(queries).dtype == np.float16 else np.float32
        )
        if output is not None:
            if np.shape(output) != np.shape(queries):
                raise WorkloadError(
                    f"multi_head_attention: output has shape "
                    f"{list(np.shape(output))}, it must match the queries "
                    f"{list(np.shape(queries))}"
                )
            output[...] = result_arr

    # -- timing on the emulated device
    spec = ctx.spec
    if not spec.supports(prec):
        raise WorkloadError(
            f"multi_head_attention: device {spec.name!r} has no {prec} "
            f"support (supported: {', '.join(spec.compute.array.macs_per_pe_cycle)})"
        )
    batch = q.shape[0]
    bh, sq, skv, d = batch * cfg.num_heads, cfg.sequence_length, cfg.kv_len, cfg.head_dim
    dtype = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}[prec]
    n = next(_calls)
    gb = GraphBuilder(f"mha{n}", dtype)
    tq = gb.input(f"mha{n}.q", (bh, sq, d))
    tk = gb.input(f"mha{n}.k", (bh, skv, d))
    tv = gb.input(f"mha{n}.v", (bh, skv, d))
    s_ = gb.op("bmm", f"mha{n}.scores", [tq, tk], transpose_b=True, scale=cfg.softmax_scale)
    attrs = {"causal": True} if cfg.attention_pattern is AttentionPattern.CAUSAL else {}
    p_ = gb.op("softmax", f"mha{n}.softmax", [s_], **attrs)
    o_ = gb.op("bmm", f"mha{n}.context", [p_, tv])
    graph = gb.graph()
    st = Storage(graph)
    e = DTYPE_BYTES[dtype]
    shape = _Shape(bh, sq, skv, d, d, e, e, prec)
    operation = (
        "self_attention_sparse"
        if sparse
        else ("multi_head_attention_fused" if sq == skv else "cross_attention_optimized")
    )
    if cfg.use_flash_attention:
        split = False
        if sq != skv and not sparse:
            bc, split = _cross_chunks(spec, ext, bh, sq, skv, br, bc)
        kernels = flash_attention_kernels(
            spec,
            ext,
            name="multi_head_attention",
            op="multi_head_attention",
            group="multi_head_attention",
            shape=shape,
            q=st.ref(tq, bh * sq, d),
            k=st.ref(tk, bh * skv, d),
            v=st.ref(tv, bh * skv, d),
            o=st.ref(o_, bh * sq, d),
            mask=mask,
            br=br,
            bc=bc,
            fast=fast,
            io=((tq, tk, tv), (o_,)),
            operation=operation,
            split_kv=split,
        )
    elif fast:
        kernels = _naive_graph_kernels(graph.ops, graph, spec, st, ext)
    else:
        kernels = [
            replace(kk, provider="transformer_engine")
            for o in graph.ops
            for kk in lower_op(o, graph, spec, st)
        ]
    dev = ctx.device
    start = dev.now
    before = dev.counters.copy()
    records = execute_kernels(dev, kernels)
    dev.flush()  # results (and naive S, P) reach HBM
    delta = dev.counters.delta(before)
    cycles = dev.now - start
    return AttentionResult(
        output=result_arr,
        operation=operation,
        flash=cfg.use_flash_attention,
        cycles=cycles,
        latency_ms=spec.cycles_to_ms(cycles),
        hbm_bytes=delta.bytes["hbm"],
        macs=delta.macs,
        flops=delta.flops,
        counters=delta,
        kernels=list(records),
    )
