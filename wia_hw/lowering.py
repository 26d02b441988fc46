"""Lowering: graph ops to emulator kernels, with a documented tiling heuristic.

Each GEMM-class op (linear, matmul, bmm, conv2d via im2col) becomes one
:class:`~wia_hw.emulator.kernels.GemmKernel`; each elementwise, reduction, pooling,
gather or copy op one :class:`~wia_hw.emulator.kernels.VectorKernel`; views
(``reshape``, ``identity``, a contiguous ``slice``: :func:`wia_hw.graph.is_view`) cost
nothing. Views keep the storage name of the
tensor they view, so the cache model sees that they are the same bytes.

Tiling heuristic (``wia_hw._tiling``; the autotuner may replace it):

* The L1 of a core is double-buffered: a tile's operands may use half of it (the two
  buffers overlap with the results draining out, which may use a quarter).
* Output-stationary arrays: K is kept whole when a ``rows + cols`` wide pair of panels
  fits (``(R + C) * K * bytes <= L1/2``), else cut into the largest fitting slice; then
  the output tile grows from ``R x C`` by whole array multiples, the smaller side first,
  while A panel + B panel + output tile fit. Long K amortises the array's fill and drain
  (``2R + C - 2`` cycles per pass). A tile reads ``bytes x (1/tm + 1/tn)`` from L2 per
  MAC; when that outruns the L2 port with every array at its peak (a small L1 with
  long K: a GPU SM's 192 KiB), K is cut instead into slices of ``T``, the side of the
  largest square tile whose two ``T x T`` panels fit, and the output tile grows to it.
* Weight-stationary arrays: the streamed rows (``tm``) come first (they amortise the
  fill and drain), up to 4096; then the K slice grows by whole array heights (partial
  sums of one tile stay in the accumulators), then the output columns.
* Small batched matrices (attention heads) are grouped ``tb`` to a tile until the tile
  fills its half of L1.
* Tiles are then split until every core has at least one output tile, where the shape
  allows (an output tile's K slices run on one core, which keeps their partial sums)
  and a split does not give some cores a second output tile for no less work on the
  busiest (nor, when K is cut, for the same), and further, up to four tiles a core, while each still keeps its array busy for four times a
  tile's fixed cost (DMA setup, L2 latency, the array's fill and drain) and its panels
  do not outrun the core's share of the L2 port: a core's first load and its last
  computation overlap nothing, so a few large tiles expose more of them (a 1 x 4096 x
  4096 GEMV on ``wia-npu`` took 36% longer with 32 MiB of L1 than with 8).
* Finally the tiles are evened over the cores: of the tilings that cut batch, M or N
  into more, even tiles, the one whose busiest core has the fewest MAC slots (the
  larger tile on a tie), so a tiling that leaves one core more passes than its share
  is not kept because a bigger L1 allowed its larger tiles. Smaller tiles read more
  bytes per MAC, so a candidate may need at most half of a core's share of the L2
  port at the arrays' peak (or no more than the tiling it replaces), and may not grow
  the bytes it re-reads from HBM (a deep-K GEMM whose operands outgrow L2) by more
  than it evens the busiest core's work.
* Those rules count a tile's bytes as its elements, but a tile loads whole storage
  blocks. So each tiling the splits passed through is estimated too
  (:mod:`wia_hw._tile_estimate`: the first loads and the busiest core's array time,
  the blocks every core loads over the L2 port with its L1 keeping what it loaded,
  and the weights' blocks from HBM), and an earlier one is kept when its estimate is
  lower: attention's ``bmm`` reads each head as a few rows of the QKV projection's
  output, and tiles of fewer heads load the same blocks again (BERT-Base b8 s128 on
  64 cores of ``wia-npu``: 1.85 ms with tiles of 2 heads, 1.13 ms now; 1.09 on 12
  cores).
* A GEMM whose operands all come from HBM (the graph's inputs and weights) may run on
  fewer cores than the device has (``GemmTiling.cores``): the tiling the rules above
  make for each halving of the core count, and each power of two below it, is
  estimated on that many cores too, and taken where it is 5% lower, so more cores are
  never slower by the estimate (256 x 4096 x 4096 on ``wia-npu``: 0.0849 ms on 16
  cores in one 256 x 256 tile a core, 0.0765 by the estimate, as on 8;
  :func:`wia_hw._tiling.choose_gemm_tiling`).
* Such a GEMM, when short (the rules cut it into at most
  :data:`wia_hw._tiling.MEASURED_TILES` tiles for one core), is tiled by the emulator
  instead: the rules' tilings for every core count above and every halving of L1 down
  to four storage blocks each run alone on a fresh device at the nominal clock, cut at
  the best so far, and the one of least cycles plus the HBM time of its re-read bytes
  is kept (the rules' own on a tie; :func:`wia_hw._tiling._measured`). More cores, or
  more L1, are then no slower for it (384 x 256 x 4096 on ``wia-npu`` took 16,544
  cycles with its 8 MiB of L1, 11,532 with 4; now 11,283 with both).
* On a weight-stationary array, a tile whose B panel (B stored ``k x n``) uses at most
  half of each storage block it touches is widened to whole block columns, with K cut
  to fit (:func:`wia_hw._tiling._whole_blocks`).
* Loop order is row-major over output tiles (``mn``): consecutive tiles on a core share
  their A panel, which then hits in L1.
* Vector ops run in row chunks of at most L1/4 bytes (inputs + outputs), at least one
  chunk per core, but no thinner than half the rows of a storage block (a tile loads
  whole blocks, so thinner chunks load each block again; :func:`vector_rows_per_tile`).
  After a GEMM whose output outgrows half of L2, the chunks may instead follow its
  tiles (or run on the cores that hold their rows: ``VectorKernel.placement``), and a
  ``bmm`` after such an op take fewer heads a tile, so that each core reads what it
  wrote (:func:`_owner_aligned`, :func:`_gemm_owner_aligned`). An
  elementwise op of equal-sized operands reads its first input in the rows and
  columns its writer stored it in (a convolution's ``N*H*W x C``, not the graph's
  NCHW rows of ``W``; :func:`_writer_geometry`).
  Elementwise ops whose row chunks would cut blocks run in chunks of one block row by
  whole block columns instead (:func:`_block_chunks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from ._gemm_bound import device_for
from ._tile_estimate import gemm_estimate
from ._tiling import _ceil_to, choose_gemm_tiling
from .emulator.config import DeviceSpec
from .emulator.device import Device
from .emulator.errors import WorkloadError
from .emulator.kernels import GemmKernel, GemmTiling, Kernel, TensorRef, VectorKernel
from .emulator.memory import BlockLayout
from .graph import (
    BINARY_KINDS,
    DTYPE_BYTES,
    GEMM_KINDS,
    UNARY_KINDS,
    Graph,
    Op,
    gemm_dims,
    is_view,
)

__all__ = [
    "lower",
    "lower_op",
    "choose_gemm_tiling",
    "VIEW_KINDS",
    "Provider",
    "Storage",
    "ATTR_LOWERINGS",
    "gemm_key",
]

#: Op kinds that are views: no data moves, no kernel.
VIEW_KINDS = ("reshape", "identity")

_VCLASS = {
    "softmax": "softmax",
    "layer_norm": "layer_norm",
    "embedding": "gather",
    "maxpool": "pool",
    "avgpool": "pool",
    "global_avgpool": "pool",
    "col2im": "pool",
    "resize": "pool",
    "transpose": "copy",
    "concat": "copy",
    "slice": "copy",
    "cast": "elementwise",
    "where": "elementwise",
    "cumsum": "elementwise",
}

#: A provider lowers one op to kernels (the extension registry adds more).
Provider = Callable[[Op, Graph, DeviceSpec, "Storage"], list[Kernel]]

#: Lowerings keyed by an op attribute, registered by the graph transformations that set
#: it (``wia_hw.optimize`` registers ``"fusion"``), so lowering imports nothing above it.
ATTR_LOWERINGS: dict[str, Provider] = {}


def _precision_of(dtype: str) -> str:
    return {"int8": "int8", "fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}.get(dtype, "fp32")


def gemm_key(k: GemmKernel) -> str:
    """The key of a GEMM kernel's schedule: op kind, batch, M, N, K, precision, output
    element bytes, bias and B's layout; kernels of equal keys tile alike (the layers of
    a transformer share one), whatever their op names."""
    layout = "bT" if k.b_transposed else "b" if k.b_shared else "bB"
    bias = "+bias" if k.bias is not None else ""
    out = k.c.elem_bytes if k.c is not None else 0
    return f"{k.op_kind} {k.batch}x{k.m}x{k.n}x{k.k} {k.precision}->{out}B {layout}{bias}"


@dataclass
class Storage:
    """Maps graph tensor names to the storage they live in (views share storage); the
    ``storage`` argument every lowering function (built-in or extension) receives.
    ``schedules``: tilings by :func:`gemm_key` that replace the heuristic's (tuned by
    :func:`wia_hw.optimize.autotune_model`); ``None``: the heuristic everywhere."""

    graph: Graph
    schedules: Mapping[str, GemmTiling] | None = None

    def __post_init__(self) -> None:
        self.base: dict[str, tuple[str, int]] = {}
        #: storage name -> the last built-in GEMM or vector kernel lowered that writes it
        #: (:func:`lower` records them in order; :func:`_owner_aligned` reads them)
        self.writers: dict[str, GemmKernel | VectorKernel] = {}
        produced = {t for op in self.graph.ops for t in op.outputs}
        #: tensors no op produces (weights, the graph's inputs): they come from HBM
        self.cold = frozenset(t for t in self.graph.tensors if t not in produced)

    def name(self, tensor: str) -> str:
        return self.base.get(tensor, (tensor, 0))[0]

    def wrote(self, kernels: Sequence[Kernel]) -> None:
        """Record ``kernels`` (one op's, in order) as the writers of what they store."""
        for kern in kernels:
            if isinstance(kern, GemmKernel):
                outs: Sequence[TensorRef] = (kern.c,)
            elif isinstance(kern, VectorKernel):
                outs = kern.outputs
            else:  # another unit's kernel: what it writes has no known owner
                outs = ()
                for name in kern.io[1] if getattr(kern, "io", None) else ():
                    self.writers.pop(self.name(name), None)
            for ref in outs:
                self.writers[ref.name] = kern

    def offset(self, tensor: str) -> int:
        return self.base.get(tensor, (tensor, 0))[1]

    def alias(self, view: str, of: str, offset: int = 0) -> None:
        """Record that ``view`` is ``of``'s storage from element ``offset`` on."""
        self.base[view] = (self.name(of), self.offset(of) + offset)

    def ref(self, tensor: str, rows: int | None = None, cols: int | None = None) -> TensorRef:
        t = self.graph.tensors[tensor]
        if cols is None:
            cols = t.shape[-1] if t.shape else 1
        if rows is None:
            rows = max(1, t.numel // max(1, cols))
        return TensorRef(self.name(tensor), rows, cols, DTYPE_BYTES[t.dtype], self.offset(tensor))


def _gemm_kernel(op: Op, graph: Graph, spec: DeviceSpec, st: Storage) -> list[Kernel]:
    ins, outs = graph.shapes_of(op)
    batch, m, n, k = gemm_dims(op, ins)
    ta, tb_ = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    tc = graph.tensors[op.outputs[0]]
    prec = _precision_of(ta.dtype)
    if not spec.supports(prec):
        raise WorkloadError(
            f"op {op.name!r} ({op.kind}): device {spec.name!r} has no "
            f"{prec} support on its array (supported: "
            f"{', '.join(spec.compute.array.macs_per_pe_cycle)})"
        )
    e, eo = DTYPE_BYTES[ta.dtype], DTYPE_BYTES[tc.dtype]
    transposed = op.kind == "bmm" and bool(op.attrs.get("transpose_b"))
    bias = st.ref(op.inputs[2], 1, n) if len(op.inputs) == 3 else None
    if op.kind == "conv2d":
        # im2col: the patch matrix is formed by the DMA's address generator while it
        # streams the input (stored NHWC), so A's storage is the input tensor itself and
        # a tile reads the proportional part of it (halo rows are not counted).
        x = ins[0]
        a_ref = TensorRef(
            st.name(op.inputs[0]), x[0] * x[2] * x[3], x[1], e, st.offset(op.inputs[0])
        )
        b_ref = TensorRef(
            st.name(op.inputs[1]), batch * k, n, DTYPE_BYTES[tb_.dtype], st.offset(op.inputs[1])
        )
        c_ref = TensorRef(st.name(op.outputs[0]), batch * m, n, eo, st.offset(op.outputs[0]))
        shared = batch == 1
    elif op.kind in ("linear", "matmul"):
        a_ref = st.ref(op.inputs[0], m, k)
        b_ref = st.ref(op.inputs[1], k, n)
        c_ref = st.ref(op.outputs[0], m, n)
        shared = True
    else:  # bmm
        a_ref = st.ref(op.inputs[0], batch * m, k)
        b_ref = (
            st.ref(op.inputs[1], batch * n, k) if transposed else st.ref(op.inputs[1], batch * k, n)
        )
        c_ref = st.ref(op.outputs[0], batch * m, n)
        shared = False
    kern = GemmKernel(
        name=op.name,
        op=op.name,
        group=op.group,
        op_kind=op.kind,
        io=(op.inputs, op.outputs),
        attrs=dict(op.attrs),
        precision=prec,
        batch=batch,
        m=m,
        n=n,
        k=k,
        a=a_ref,
        b=b_ref,
        c=c_ref,
        bias=bias,
        b_shared=shared,
        b_transposed=transposed,
        tiling=GemmTiling(tm=1, tn=1, tk=1),
    )
    # the operands' storage as the run lays it out: a view's by its producer's output
    storage = tuple(
        st.ref(st.name(t)) for t in op.inputs[:2] if st.name(t) != t and st.name(t) in graph.tensors
    )
    estimate = gemm_estimate(spec, kern, storage, st.cold)
    kern = replace(
        kern,
        tiling=choose_gemm_tiling(
            spec, batch, m, n, k, e, eo, b_transposed=transposed, estimate=estimate
        ),
    )
    kern = _gemm_owner_aligned(spec, st, kern)
    if st.schedules:
        tuned = st.schedules.get(gemm_key(kern))
        if tuned is not None:
            kern = replace(kern, tiling=tuned)
    return [kern]


def _vector_kernel(op: Op, graph: Graph, spec: DeviceSpec, st: Storage) -> list[Kernel]:
    ins, outs = graph.shapes_of(op)
    out_t = graph.tensors[op.outputs[0]]
    if op.kind in UNARY_KINDS:
        vclass = "activation" if UNARY_KINDS[op.kind] > 1 else "elementwise"
    elif op.kind in BINARY_KINDS:
        vclass = "elementwise"
    else:
        vclass = _VCLASS[op.kind]
    shape = outs[0]
    if op.kind in ("maxpool", "avgpool", "global_avgpool", "col2im", "resize"):
        rows, cols = shape[0] * shape[1], shape[2] * shape[3]
        in_refs = tuple(
            TensorRef(
                st.name(i),
                s[0] * s[1],
                s[2] * s[3],
                DTYPE_BYTES[graph.tensors[i].dtype],
                st.offset(i),
            )
            for i, s in zip(op.inputs, ins, strict=True)
        )
    else:
        cols = shape[-1] if shape else 1  # a scalar is one row of one element
        rows = max(1, math.prod(shape) // cols)
        geo = _writer_geometry(st, op, graph) if vclass in ("elementwise", "activation") else None
        if geo is not None:
            rows, cols = geo
            in_refs = tuple(st.ref(i, rows, cols) for i in op.inputs)
        else:
            in_refs = tuple(st.ref(i) for i in op.inputs)
    out_refs = (
        TensorRef(
            st.name(op.outputs[0]), rows, cols, DTYPE_BYTES[out_t.dtype], st.offset(op.outputs[0])
        ),
    )
    row_bytes = vector_row_bytes(rows, out_refs, in_refs)
    budget = spec.memory.l1.size_bytes // 4
    rpt = vector_rows_per_tile(spec, rows, out_refs, in_refs)
    cpt = 0
    if vclass in ("elementwise", "activation") and all(r.cols == cols for r in in_refs):
        rpt, cpt = _block_chunks(spec, out_refs[0], rows, cols, row_bytes, rpt, budget)
    elif op.kind == "global_avgpool":
        rpt, cpt = _reduce_chunks(spec, in_refs[0], rows, rpt, budget)
    elements = math.prod(shape)
    if op.kind in ("maxpool", "avgpool", "global_avgpool", "col2im"):
        elements = math.prod(ins[0])  # every input element passes the vector unit
    kern = VectorKernel(
        name=op.name,
        op=op.name,
        group=op.group,
        op_kind=op.kind,
        io=(op.inputs, op.outputs),
        attrs=dict(op.attrs),
        vclass=vclass,
        rows=rows,
        elements=elements,
        flops=graph.flops(op),
        inputs=in_refs,
        outputs=out_refs,
        rows_per_tile=rpt,
        cols_per_tile=cpt,
        split_inputs=op.kind == "concat",  # its inputs are parts of its rows
        precision=out_t.dtype,
    )
    return [_owner_aligned(spec, st, kern, budget // max(1, row_bytes))]


def _writer_geometry(st: Storage, op: Op, graph: Graph) -> tuple[int, int] | None:
    """The (rows, columns) an elementwise op of equal-sized operands reads its first
    input in: as the kernel that wrote it stored it, when that differs from the op's
    own last-axis view (a convolution stores its output NHWC, ``N*H*W x C``, and a
    residual add after it saw ``N*C*H x W``); ``None`` to keep the op's own."""
    numel = graph.tensors[op.outputs[0]].numel
    if any(graph.tensors[i].numel != numel for i in op.inputs) or not op.inputs:
        return None
    first = op.inputs[0]
    prod = st.writers.get(st.name(first))
    if prod is None or st.offset(first):
        return None
    out = _written(prod)
    if out.rows * out.cols != numel or out.offset:
        return None
    return out.rows, out.cols


def _owner_aligned(
    spec: DeviceSpec, st: Storage, kern: VectorKernel, max_rows: int
) -> VectorKernel:
    """``kern``, or ``kern`` in row chunks of its producer's tiles (or an even part of
    them), when most of the input each core reads is then on the core that wrote it.

    A vector op reads its producer's output from the L1 of the core that wrote it only
    where its chunk lands on that core; elsewhere from L2, or from HBM once L2 has
    evicted it. Its own chunking (:func:`vector_rows_per_tile`: one chunk a core, in
    whole rounds) need not fall on the producer's tiles: BERT-Base b8 s512 on 64 cores
    ran its attention scores in 48 tiles of 2 heads, one a core, and the softmax in 64
    chunks of 1.5 heads, which read the scores from HBM (1,189 MB a run against 604 on
    32 cores): 7.62 ms against 5.54 on 32. In chunks of one head, two a core on the
    first cores, two thirds of the scores are where the softmax reads them, and the
    model takes 5.51 ms.

    The producer is a built-in GEMM of the input's shape whose output does not fit in
    half of L2 (else what another core's L1 holds, L2 holds too, and following the
    producer measured nothing but noise, some of it slower). The share of the input's
    elements each chunk finds on its own core is counted with the emulator's own tiles
    and partitions (:func:`_owned_share`); a chunking is taken when its share is above
    one half and the current one's, and its chunk fits the L1 budget (``max_rows``) and
    is no thinner than :func:`vector_rows_per_tile`'s floor (thinner chunks reload the
    blocks they cut).

    Chunks thinner than the producer's tiles, dealt by the schedule, fall on other
    cores: GPT-2 b8 s1024 on 64 cores ran 96 heads of 1,024 rows 2 or 1 a core, and its
    softmax, allowed 512 rows a chunk, 3 chunks a core (41% slower than on 48 cores).
    Such chunks are placed on the cores that hold their rows (:func:`_placed`) when
    every chunk then lies within one core's rows and no core gets more than half again
    the most work a core has under the schedule (a placement that followed an uneven
    producer measured up to 1.7% slower otherwise): 3.5% faster than on 48 cores."""
    for ref in kern.inputs:
        if not isinstance(st.writers.get(ref.name), GemmKernel):
            continue
        found = _producer_rows(spec, st, ref)
        if found is None:
            continue
        theirs, rows = found
        dev = device_for(spec)
        floor = _row_floor(spec, kern.outputs[0], kern.rows)  # as vector_rows_per_tile
        best, best_share = kern, _owned_share(_shares(dev, spec, kern), ref.name, theirs)
        for parts in (1, 2, 4, 8):  # the producer's tile, or an even part of it
            rpt = rows // parts
            if rows % parts or not floor <= rpt <= max_rows or rpt == kern.rows_per_tile:
                continue
            alt = replace(kern, rows_per_tile=rpt, cols_per_tile=0, placement=())
            share = _owned_share(_shares(dev, spec, alt), ref.name, theirs)
            # most of it from its own L1: a few percent more moved nothing measurable
            # (BERT-Base b8 s128 on 16 cores, the softmax 6% -> 10%: 0.03% slower)
            if share > max(best_share, Fraction(1, 2)):
                best, best_share = alt, share
            if best_share == 1:
                continue
            # placed on the cores that hold them, when each chunk lies within what one
            # core holds and no core gets more than half again the busiest's work now
            placed = _placed(dev, spec, alt, ref.name, theirs)
            shares = _shares(dev, spec, placed)
            if _owned_share(shares, ref.name, theirs) == 1 and 2 * _busiest(shares) <= 3 * _busiest(
                _shares(dev, spec, kern)
            ):
                best, best_share = placed, Fraction(1)
        return best
    return kern


def _busiest(shares: list[list[Any]]) -> int:
    """The most elements any core's tiles of a vector kernel process."""
    return max((sum(t.dims[2] if len(t.dims) > 2 else 0 for t in s) for s in shares), default=0)


def _placed(
    dev: Device,
    spec: DeviceSpec,
    kern: VectorKernel,
    name: str,
    theirs: list[list[tuple[int, int, int, int]]],
) -> VectorKernel:
    """``kern`` with each tile placed on the core that stored the most of what it reads
    of storage ``name`` (``theirs``: each core's stored regions), or where the schedule
    puts it when no core stored any (``VectorKernel.placement``)."""
    tiles, groups = dev.tiles_of(kern)
    dealt = {
        id(t): c
        for c, share in enumerate(Device.shares_of(kern, tiles, groups, spec))
        for t in share
    }
    placement = []
    for t in tiles:
        loads = [(r[1], r[2], r[3], r[4]) for r in t.loads if r[0].name == name]
        held = [sum(_overlap(x, h) for x in loads for h in regions) for regions in theirs]
        most = max(held, default=0)
        placement.append(held.index(most) if most else dealt[id(t)])
    return replace(kern, placement=tuple(placement))


def _gemm_owner_aligned(spec: DeviceSpec, st: Storage, kern: GemmKernel) -> GemmKernel:
    """``kern``, or the ``bmm`` ``kern`` with fewer batch entries a tile, when most of A
    is then on the core that wrote it (as :func:`_owner_aligned` does for a vector op,
    under the same conditions; the producer may be a GEMM or a vector op).

    BERT-Large b4 s512 on 64 cores: the softmax ran 2 heads a chunk, and the context
    ``bmm`` after it 4 heads a tile (the tiling estimate keeps heads together for the
    blocks of V they share), so half of each tile's probabilities sat in another core's
    L1 and came from HBM: 455,297 cycles a layer against 391,179 on 32 cores; in tiles
    of 2 heads, 397,903. Only fewer batch entries a tile are tried (a tile that fits
    still fits; rows cut within a matrix made GPT-2 slower)."""
    a = kern.a
    if a.rows != kern.batch * kern.m:  # an im2col view: rows map proportionally
        return kern
    found = _producer_rows(spec, st, a)
    if found is None:
        return kern
    theirs, rows = found
    dev = device_for(spec)
    t = kern.tiling
    cands = []
    for parts in (1, 2, 4, 8):  # the producer's tile rows, or an even part of them
        want = rows // parts
        if rows % parts or want < 1:
            continue
        if t.tm >= kern.m and want % kern.m == 0 and want // kern.m < t.tb:
            cands.append(replace(t, tb=want // kern.m))
    if not cands:
        return kern
    best, best_share = kern, _owned_share(_shares(dev, spec, kern), a.name, theirs)
    for cand in cands:
        alt = replace(kern, tiling=cand)
        share = _owned_share(_shares(dev, spec, alt), a.name, theirs)
        if share > max(best_share, Fraction(1, 2)):
            best, best_share = alt, share
    return best


def _written(kern: GemmKernel | VectorKernel) -> TensorRef:
    """The ref a GEMM or vector kernel stores its result in."""
    return kern.c if isinstance(kern, GemmKernel) else kern.outputs[0]


def _producer_rows(
    spec: DeviceSpec, st: Storage, ref: TensorRef
) -> tuple[list[list[tuple[int, int, int, int]]], int] | None:
    """For an operand ``ref`` that is exactly its writer's result (same storage, offset
    and shape) and does not fit in half of L2 (else what another core's L1 holds, L2
    holds too): each core's stored regions of it (:func:`_stored_by_core`) and the rows
    of the writer's largest tile. ``None`` otherwise."""
    prod = st.writers.get(ref.name)
    if prod is None:
        return None
    out = _written(prod)
    if (out.name, out.offset, out.rows, out.cols) != (ref.name, ref.offset, ref.rows, ref.cols):
        return None
    if 2 * out.nbytes <= spec.memory.l2.size_bytes:
        return None
    theirs = _stored_by_core(device_for(spec), spec, prod, ref.name)
    rows = max((r1 - r0 for regions in theirs for r0, r1, _, _ in regions), default=0)
    return (theirs, rows) if rows else None


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> int:
    """Elements two regions ``(r0, r1, c0, c1)`` of one storage share."""
    return max(0, min(a[1], b[1]) - max(a[0], b[0])) * max(0, min(a[3], b[3]) - max(a[2], b[2]))


def _stored_by_core(
    dev: Device, spec: DeviceSpec, kern: GemmKernel | VectorKernel, name: str
) -> list[list[tuple[int, int, int, int]]]:
    """Per core, the regions ``(r0, r1, c0, c1)`` of storage ``name`` that ``kern``'s
    tiles on that core store, as the device deals them (:meth:`Device.shares_of`)."""
    return [
        [(r[1], r[2], r[3], r[4]) for t in share for r in t.stores if r[0].name == name]
        for share in _shares(dev, spec, kern)
    ]


def _owned_share(
    shares: list[list[Any]], name: str, theirs: list[list[tuple[int, int, int, int]]]
) -> Fraction:
    """The share of the elements of storage ``name`` that the tiles of ``shares`` (per
    core) load on the core whose regions in ``theirs`` hold them."""
    own = total = 0
    for share, held in zip(shares, theirs, strict=True):
        for t in share:
            for r in t.loads:
                if r[0].name != name:
                    continue
                region = (r[1], r[2], r[3], r[4])
                total += _overlap(region, region)
                own += sum(_overlap(region, h) for h in held)
    return Fraction(own, total) if total else Fraction(0)


def _shares(dev: Device, spec: DeviceSpec, kern: GemmKernel | VectorKernel) -> list[list[Any]]:
    """The cores' shares of ``kern``'s tiles, as ``Device._kernel`` deals them."""
    tiles, groups = dev.tiles_of(kern)
    return Device.shares_of(kern, tiles, groups, spec)


def vector_row_bytes(rows: int, outputs: Sequence[TensorRef], inputs: Sequence[TensorRef]) -> int:
    """Bytes one row of a vector pass over ``rows`` rows reads and writes (inputs with
    fewer rows, broadcast, not counted)."""
    return sum(o.cols * o.elem_bytes for o in outputs) + sum(
        r.cols * r.elem_bytes * max(1, r.rows // rows) for r in inputs if r.rows >= rows
    )


#: A row chunk that cuts storage blocks is at least this share of a block's rows.
BLOCK_ROW_SHARES = 2


def vector_rows_per_tile(
    spec: DeviceSpec, rows: int, outputs: Sequence[TensorRef], inputs: Sequence[TensorRef]
) -> int:
    """The vector chunking: at most L1/4 bytes of rows per tile, one chunk per core, but
    no thinner than 1/BLOCK_ROW_SHARES of the rows a storage block of the output holds.

    A tile loads whole blocks (``memory.block_bytes``, the memory model's granularity),
    so every chunk thinner than a block's rows loads the whole block again: 128 x 768
    fp16 rows on ``wia-npu`` (one block row) cut one chunk per core moved the tensor 4
    times over on 4 cores and 64 times on 64 (1,020 against 9,268 cycles). With the
    floor, more cores than BLOCK_ROW_SHARES chunks per block row add no chunk, and
    cost no more."""
    budget = spec.memory.l1.size_bytes // 4
    row_bytes = vector_row_bytes(rows, outputs, inputs)
    cores = spec.compute.cores
    rpt = min(-(-rows // cores), budget // max(1, row_bytes))
    floor = 1
    if outputs:
        floor = _row_floor(spec, outputs[0], rows)
        rpt = max(rpt, min(floor, budget // max(1, row_bytes)))
    rpt = max(1, rpt)
    tiles = -(-rows // rpt)
    if tiles > cores and tiles % cores:
        # whole rounds over the cores: a last round on a few cores left the rest idle
        # and put the chunks on other cores than the producer's balanced tiles (BERT-Base
        # b8 s512's softmax: 48 chunks took 1.74 ms on 32 cores, 1.23 on 16)
        even = -(-rows // (-(-tiles // cores) * cores))
        if even >= floor:
            rpt = even
    return rpt


def _row_floor(spec: DeviceSpec, out: TensorRef, rows: int) -> int:
    """The thinnest row chunk of ``rows`` rows written to ``out``: 1/BLOCK_ROW_SHARES of
    the rows a storage block of it holds (a thinner chunk loads each block again)."""
    lay = BlockLayout.for_tensor(0, out, spec.memory.block_bytes)
    return -(-min(lay.br, rows) // BLOCK_ROW_SHARES)


def _block_chunks(
    spec: DeviceSpec, out: TensorRef, rows: int, cols: int, row_bytes: int, rpt: int, budget: int
) -> tuple[int, int]:
    """(rows, columns) per tile of an elementwise kernel: its row chunks as they are when
    they cover whole storage blocks (``memory.block_bytes``); else chunks of one block
    row by whole block columns, as many as fit the same L1 budget, or fewer so that
    every core gets a tile where the block columns allow (``0`` columns: no column
    cut). Row chunks that cut blocks load each block once per chunk; column chunks of
    whole blocks load it once (128 x 768 fp16 on ``wia-edge`` with 8 cores: 23,088
    cycles in 5 row chunks, 9,206 in 12 column chunks; it was column chunks on 4 cores
    and row chunks on 8)."""
    lay = BlockLayout.for_tensor(0, out, spec.memory.block_bytes)
    br, bc = lay.br, lay.bc
    if rpt % br == 0 or rpt >= rows or bc >= cols:
        return rpt, 0
    bytes_per_col = max(1, row_bytes // cols)
    cpt = budget // (br * bytes_per_col) // bc * bc
    if cpt < bc:
        return rpt, 0
    cpt = min(cpt, _ceil_to(cols, bc))
    row_blocks = -(-rows // br)
    if row_blocks * -(-cols // cpt) < spec.compute.cores:
        col_blocks = -(-cols // bc)
        chunks = min(col_blocks, -(-spec.compute.cores // row_blocks))  # per block row
        cpt = -(-col_blocks // chunks) * bc  # the block columns evenly over the chunks
    return br, cpt


def _reduce_chunks(
    spec: DeviceSpec, inp: TensorRef, rows: int, rpt: int, budget: int
) -> tuple[int, int]:
    """(rows, input columns) per tile of a reduction along the rows (each row of
    ``inp`` reduced to one value): its row chunks as they are when they cover whole
    storage blocks of ``inp`` or whole rows, or when all the rows fit in one block row
    that half of L2 holds (every core's chunk then reads the same blocks at once, so
    each is loaded once and the cores share the work); else bands of one block row by chunks of whole block
    columns that fit the L1 budget, reduced band by band on one core each
    (``Device._vector_reduce_tiles``; ``0`` columns: row chunks). A training step's bias
    and norm gradients are such reductions over its tokens: 1,024 rows of 65,536 took
    4.32 ms in 15-row chunks (18x the input from HBM: the cores' chunks of different
    block rows evicted the blocks each other's next chunk needed) against a 0.22 ms read
    floor; in bands 0.25 ms. The choice does not depend on the core count, nor on L2
    beyond whether one block row fits: choosing by them made more cores or a larger L2
    slower (+29% to +142%)."""
    lay = BlockLayout.for_tensor(0, inp, spec.memory.block_bytes)
    br, bc = lay.br, lay.bc
    one_row = rows <= br and rows * inp.cols * inp.elem_bytes <= spec.memory.l2.size_bytes // 2
    if rpt % br == 0 or rpt >= rows or bc >= inp.cols or one_row:
        return rpt, 0
    cpt = budget // (br * inp.elem_bytes) // bc * bc
    if cpt < bc:
        return rpt, 0
    return br, min(cpt, _ceil_to(inp.cols, bc))


def _builtin(op: Op, graph: Graph, spec: DeviceSpec, st: Storage) -> list[Kernel]:
    ins = [graph.tensors[i].shape for i in op.inputs]
    if op.kind in VIEW_KINDS or is_view(op, ins):
        offset = 0
        if op.kind == "slice":
            x = ins[0]
            axis = op.attrs.get("axis", 0) % len(x)
            offset = op.attrs.get("start", 0) * math.prod(x[axis + 1 :])
        st.alias(op.outputs[0], op.inputs[0], offset)
        return []
    if op.kind in GEMM_KINDS:
        return _gemm_kernel(op, graph, spec, st)
    return _vector_kernel(op, graph, spec, st)


def lower_op(
    op: Op,
    graph: Graph,
    spec: DeviceSpec,
    storage: Storage,
    providers: dict[str, tuple[str, Provider]] | None = None,
) -> list[Kernel]:
    """Kernels of one op. ``providers`` maps op kinds (or op names) to an extension's
    ``(extension id, lowering function)``; the default is the built-in lowering.

    The op's name is looked up first, then its kind. A lowering function may return
    ``None`` to decline the op (the next lookup, then the built-in lowering, runs).
    Kernels are stamped with the extension id unless the function stamped them already.
    An op carrying an attribute of :data:`ATTR_LOWERINGS` lowers through it before any
    provider (``"fusion"``: the chains :func:`wia_hw.optimize.apply_fusion` marks).
    """
    for key, fn in ATTR_LOWERINGS.items():
        if key in op.attrs:
            return fn(op, graph, spec, storage)
    if providers:
        for key in (op.name, op.kind):
            hit = providers.get(key)
            if hit is None:
                continue
            ext, fn = hit
            kernels = fn(op, graph, spec, storage)
            if kernels is not None:
                return [_with_provider(kern, ext) for kern in kernels]
    return _builtin(op, graph, spec, storage)


def _with_provider(k: Kernel, ext: str) -> Kernel:
    from dataclasses import replace

    return k if k.provider != "builtin" else replace(k, provider=ext)


def lower(
    graph: Graph,
    spec: DeviceSpec,
    providers: dict[str, tuple[str, Provider]] | None = None,
    schedules: Mapping[str, GemmTiling] | None = None,
) -> list[tuple[Op, list[Kernel]]]:
    """Every op of ``graph`` with its kernels, in execution order. ``schedules``: tuned
    tilings of built-in GEMM kernels by :func:`gemm_key` (see :class:`Storage`)."""
    st = Storage(graph, schedules)
    out = []
    for op in graph.ops:
        kernels = lower_op(op, graph, spec, st, providers)
        st.wrote(kernels)
        out.append((op, kernels))
    return out
