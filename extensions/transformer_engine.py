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
``j <= i + (S_kv - S_q)``, so a query block after a cached prefix sees the prefix);
``LOCAL`` (a band: ``|i + S_kv - S_q - j| <= window_size // 2``); ``BLOCK_SPARSE``
(a ``block_size`` grid of allowed blocks: ``block_layout`` given, or BigBird-like:
the diagonal, ``num_global_blocks`` global columns and rows, and random blocks at
``block_density``, seeded). Every query row sees at least one key (validated).

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
are (head, query block of ``block_q`` rows, key/value chunk of ``block_kv`` rows): a
tile stages Q, K and V blocks through the caches, computes ``Q K^T`` and ``P V`` on the
array (cycles from the device's systolic cycle functions), the online softmax on the
vector unit, and only the last chunk of a query block stores its ``O`` block: O(S d)
HBM traffic. Causal, local and block-sparse patterns skip the tiles they mask entirely.
When a query block is short (decoding), key/value chunks are split over the cores
(flash-decoding) and a small combine pass merges the partial results.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..emulator.config import DeviceSpec
from ..emulator.counters import Counters
from ..emulator.cycles import vector_op_cycles
from ..emulator.device import KernelRecord
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
) -> list[Any]:
    """The flash-attention kernel(s) of ``bh`` heads (see the module docstring).

    ``mask`` (``sq x skv`` booleans, or None) decides which tiles exist. With
    ``split_kv`` the key/value chunks of a query block are spread over the cores and a
    combine pass (a vector kernel) merges their partial results. ``bias`` (an additive
    term of the scores: a padding mask, a position bias) is ``(its rows x skv, the
    first row of each head's slice, whether it has a row per query)``: each tile loads
    its block of it and adds it to the scores.
    """
    s = shape
    lanes = spec.compute.vector.lanes
    depth = spec.compute.vector.pipeline_depth
    cpe = _softmax_cpe(spec, ext, fast)
    tiles: list[Tile] = []
    groups: list[int] = []
    macs = 0
    vflops = 0
    geo: dict[tuple[int, int], tuple[int, int, int, int]] = {}
    possible = 0
    part_rows = 0
    part = TensorRef(f"{o.name}.partials", 1, s.dv + 2, 4) if split_kv else None
    for b in range(s.bh):
        for q0 in range(0, s.sq, br):
            q1 = min(s.sq, q0 + br)
            rq = q1 - q0
            kvs = [
                (k0, min(s.skv, k0 + bc))
                for k0 in range(0, s.skv, bc)
                if _block_allowed(mask, q0, q1, k0, min(s.skv, k0 + bc))
            ]
            possible += -(-s.skv // bc)
            if not split_kv:
                groups.append(len(tiles))
            qreg = (q, b * s.sq + q0, b * s.sq + q1, 0, s.d)
            for n, (k0, k1) in enumerate(kvs):
                ck = k1 - k0
                key = (rq, ck)
                g = geo.get(key)
                if g is None:
                    p1 = gemm_passes(spec, s.precision, 1, rq, ck, s.d, s.e, 4)
                    p2 = gemm_passes(spec, s.precision, 1, rq, s.dv, ck, s.e, 4)
                    g = geo[key] = (
                        p1[0] + p2[0],
                        p1[0] * p1[1] + p2[0] * p2[1],
                        p1[2] + p2[2],
                        p1[3] + p2[3],
                        p1[0] * p1[4] + p2[0] * p2[4],
                    )
                passes, arr, l1_arr, slot, busy = g
                last = n == len(kvs) - 1
                vec = vector_op_cycles(rq * ck, lanes, cpe, depth) + vector_op_cycles(
                    rq * s.dv, lanes, 1, depth
                )
                vflops += 5 * rq * ck + 2 * rq * s.dv
                stores = []
                if split_kv:
                    groups.append(len(tiles))
                    stores.append((part, part_rows, part_rows + rq, 0, s.dv + 2))
                    part_rows += rq
                elif last:
                    vec += vector_op_cycles(rq * s.dv, lanes, 1, depth)  # O / l
                    vflops += rq * s.dv
                    stores.append((o, b * s.sq + q0, b * s.sq + q1, 0, s.dv))
                loads = [
                    qreg,
                    (k, b * s.skv + k0, b * s.skv + k1, 0, s.d),
                    (v, b * s.skv + k0, b * s.skv + k1, 0, s.dv),
                ]
                if bias is not None:  # its block of the additive term, added to S
                    bref, base, per_query = bias
                    r0, r1 = (base[b] + q0, base[b] + q1) if per_query else (base[b], base[b] + 1)
                    loads.append((bref, r0, r1, k0, k1))
                    vec += vector_op_cycles(rq * ck, lanes, 1, depth)
                    vflops += rq * ck
                # L1 traffic: the array reads Q, K, V and P; S (fp32) and P go through L1
                # once each way; the fp32 accumulator of O is read-modified-written
                l1 = l1_arr + rq * ck * (4 * 2 + s.e) + rq * s.dv * 4 * 2
                tmacs = rq * ck * (s.d + s.dv)
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
    accept = _attention_chain_ok(graph)
    chain = match_chain(graph, op, _CHAIN, accept)
    if chain is not None:
        return "head", chain
    hit = chain_head(graph, op, _CHAIN, accept)
    if hit is not None:
        return "tail", []
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
        # short queries: long key chunks amortise the array's fill and drain of P V; when
        # there are few query blocks, the chunks are also spread over the cores
        qblocks = bh * -(-sq // br)
        chunk = int(ext.param("decode_kv_chunk"))
        split = qblocks < 2 * spec.compute.cores and skv > chunk
        if sq <= br:
            bc = chunk
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
    )


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
    if kind == "tail":
        return []
    qs = graph.tensors[chain[0].inputs[0]].shape
    ks = graph.tensors[chain[0].inputs[1]].shape
    if qs[-2] != ks[-2]:
        return None  # cross-attention / decoding: not ours
    return _graph_attention(
        chain, graph, spec, storage, ext, "multi_head_attention_fused", cross=False
    )


def cross_attention_impl(
    op: Op, graph: Graph, spec: DeviceSpec, storage: Any, ext: DeviceExtension
) -> list[Any] | None:
    """Lowering of ``cross_attention_optimized``: an attention chain whose query length
    differs from its key length (cross-attention, decoding with a KV cache); short query
    blocks split the keys over the cores (flash-decoding)."""
    role = _attention_role(op, graph)
    if role is None:
        return None
    kind, chain = role
    if kind == "tail":
        return []
    return _graph_attention(
        chain, graph, spec, storage, ext, "cross_attention_optimized", cross=True
    )


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
    if cfg.attention_pattern is AttentionPattern.BLOCK_SPARSE:
        br = bc = cfg.block_size
    else:
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
        chunk = int(ext.param("decode_kv_chunk"))
        split = False
        if sq != skv and not sparse:
            split = bh * -(-sq // br) < 2 * spec.compute.cores and skv > chunk
            if sq <= br:
                bc = chunk
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
