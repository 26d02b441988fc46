"""Constant folding and static shapes for the ONNX importer.

The exporters write chains that compute shapes and masks at run time from the
inputs' shapes (``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``,
``ConstantOfShape``, ``Range``, ``Expand``, ``Where``, ``Equal``, ``Trilu`` ...). Once
every input dim is fixed those chains are constants; :func:`fold` evaluates them
before lowering so the importer sees only the compute.

Contract of :func:`fold` (``graph`` is a shape-inferred ``onnx.GraphProto``, changed
in place):

* ``Shape`` and ``Size`` of a tensor whose shape is static are constants (its shape).
* A node whose inputs are all constants is evaluated by ``onnx.reference.
  ReferenceEvaluator`` (one node at a time, memoised on op, attributes and input
  bytes, so the chain repeated in every layer is evaluated once), when its inputs and
  its output hold at most :data:`FOLD_MAX_ELEMENTS` elements each and no input is an
  initializer of more than :data:`INIT_MAX_ELEMENTS` elements (a weight).
* Not a GEMM-class node (:data:`GEMM_OPS`) that reads one of the model's float
  weights, even on constants only (learned queries through a Linear, an RNN's first
  recurrence on its zero state): that product is the model's compute (torch's FLOP
  counter counts it) and its operands are the model's parameters.
* ``CastLike`` of a constant is a ``Cast`` to its second input's element type (a
  run-time tensor's is known after shape inference).
* What folding computes from no model data (:data:`PLAIN` values: shapes, scalar and
  integer ``Constant`` nodes) is recorded (:data:`MADE`): a zero initial state or a
  mask built from shapes is a constant of the run, not a parameter of the model.
* A node on constants that is larger than that (a ``Transpose`` or ``Cast`` of a
  weight, say) is *shape-folded*: its output becomes a constant whose dims are known
  but whose values are not computed at import (the work happens once, when weights
  load, not per inference): timing needs only dims, and functional mode computes
  the values from the weights' when it asks (below).
* An ``If`` whose condition is a constant is the branch it takes: that branch's nodes
  and initializers replace it (the names the branch defines prefixed with the If's
  output, so they cannot meet the graph's); the nodes after read the branch's outputs
  in place of the If's (an ``Identity`` when the If's is a graph output). A branch
  that references the graph's values keeps doing so. (An exporter writes such an If
  for a test on shapes that are fixed once the input dims are.)
* A ``Loop`` whose trip count is a constant (at most :data:`UNROLL_MAX`) and whose
  condition is a constant true is unrolled: one renamed copy of the body per
  iteration, reading the iteration number as a constant and the previous iteration's
  values, the scan outputs stacked on a new axis 0. Every iteration's condition but
  the last must then fold to true (:func:`check_loops`): an early exit on run-time
  values is refused. (tf2onnx writes Keras's LSTM and GRU so: a loop over the time
  steps.)
* A shape-folded node on weights (the legacy exporter's Identity of a shared weight,
  a transposed weight, the rows of a position-embedding table gathered for the fixed
  sequence, a weight scaled by a constant) keeps how to compute its values from the
  weights''
  (``memo[DERIVED]``), which the importer reads for functional mode.
* Folded values that remaining nodes read become initializers; folded nodes go away.
  Random ops (``RandomNormal``...), ops of other domains than ONNX's and nodes with
  subgraphs are never folded.

Around the folding, :func:`sort_nodes` puts the nodes in topological order (as ONNX
Runtime does on load; ONNX requires it, graph-surgery tools do not always keep it) and
:func:`prune_dead` removes the nodes that no graph output depends on (a ``Transpose``
read only by a ``Shape`` that folded away, say). Both treat the names read inside a
node's subgraphs (``If``, ``Loop``, ``Scan``) from the enclosing scope as that node's
inputs.

Values of initializers stored in an external data file are read only when a folded
node needs them (small tensors); a missing data file is fine for everything else,
which is how the repository's weight-stripped fixtures are stored (the files a weight
asked for was in are recorded, ``memo[ABSENT]``, so functional mode can say it drew
those weights at random). A data file that is there but does not hold a tensor's
bytes (truncated, empty, unreadable, or outside the model's folder) is a
WorkloadError when the values are read (:func:`read_external`), never a traceback.
"""

from __future__ import annotations

import heapq
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..emulator.errors import WorkloadError
from ._onnx_qdq import keeps_integer, readers_of

#: Largest tensor (elements) that folding evaluates; larger constants are shape-folded.
FOLD_MAX_ELEMENTS = 1 << 22
#: Largest initializer whose values folding reads; larger ones are weights (dims only).
INIT_MAX_ELEMENTS = 1 << 16
#: The memo key of the shape-folded nodes on weights that keep how to compute their
#: values (:meth:`_Folder.derive`): output -> a function giving them
DERIVED = ("derived weights",)
#: The memo key of the large inline initializers' bytes, held out of the proto while
#: the rounds of shape inference copy it (:func:`hold_weights`): name -> bytes
HELD = ("held weights",)
#: Initializers of more bytes than this are held (their values are never folded).
HOLD_BYTES = 4 * INIT_MAX_ELEMENTS
#: The memo key of the shape-folded nodes on weights that hold (part of, or a new
#: layout of) one weight of the model: output -> (that initializer's name, its
#: element count), for counting the model's parameters once (:meth:`_Folder.derive`)
SOURCES = ("weight sources",)
#: The memo key of the values that hold none of the model's data (``Shape``/``Size``
#: of a tensor, a ``Constant`` that is not a float tensor of several elements, and what
#: folding computes from those alone): names (:meth:`_Folder.note_data`)
PLAIN = ("plain constants",)
#: The memo key of the float values that folding computed from :data:`PLAIN` ones
#: alone (a zero initial state, a causal mask built from ``full`` and ``triu``, the
#: exporters' ``ConstantOfShape`` and ``Expand`` fills): names. They are constants of
#: the run, not the model's parameters (the importer keeps them out of
#: ``Graph.parameters``), and they change with the dims the model is imported at.
MADE = ("made constants",)
#: memo key: the external data files (locations) of weights whose values were asked
#: for and that are not beside the model (a weight-stripped model)
ABSENT = ("absent data files",)
#: GEMM-class ops: folding never evaluates one that reads one of the model's weights
#: (:meth:`_Folder.reads_weight`), since that product is the model's compute, which
#: torch's FLOP counter and the exporters' fused ops (an RNN's first recurrence on a
#: zero state) count, and its operands are the model's parameters.
GEMM_OPS = frozenset(
    {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger", "ConvInteger"}
)
#: Most iterations a Loop with a constant trip count is unrolled to.
UNROLL_MAX = 4096
#: The key, in the memo that the rounds of one import share, of the unrolled loops'
#: conditions: name -> (the Loop, its value once folded, else None)
LOOP_CONDS = ("loop conditions",)
_NEVER = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "If",
    "Loop",
    "Scan",
    "SequenceMap",
}


def _fallback(node: Any, inputs: list[Any]) -> list[Any] | None:
    """numpy for the one op whose reference implementation fails on valid input (onnx
    1.23's GatherElements on a data tensor with a size-1 axis): ``take_along_axis`` is
    its definition."""
    if node.op_type == "GatherElements" and len(inputs) == 2:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        data, idx = inputs
        idx = np.where(idx < 0, idx + data.shape[axis], idx)
        return [np.take_along_axis(data, idx.astype(np.int64), axis=axis)]
    return None


#: ONNX element types of weights: float, float16, double, bfloat16
_FLOAT_ELEMS = frozenset({1, 10, 11, 16})


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


class _Folder:
    def __init__(
        self,
        onnx: Any,
        graph: Any,
        opsets: dict[str, int],
        base_dir: Path | None,
        memo: dict[Any, list[Any]],
        source: str = "",
    ) -> None:
        from onnx import numpy_helper

        self.onnx = onnx
        self.source = source  # the model, as errors name it
        self.nh = numpy_helper
        self.g = graph
        self.opsets = opsets
        self.base_dir = base_dir
        self.shapes: dict[str, tuple[int, ...] | None] = {}
        self.elem: dict[str, int] = {}
        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            if vi.type.HasField("tensor_type"):
                tt = vi.type.tensor_type
                self.elem[vi.name] = tt.elem_type
                if tt.HasField("shape"):
                    ds = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
                    self.shapes[vi.name] = tuple(ds) if all(d >= 0 for d in ds) else None
        self.inits: dict[str, Any] = {t.name: t for t in graph.initializer}
        for t in graph.initializer:
            self.shapes[t.name] = tuple(t.dims)
            self.elem[t.name] = t.data_type
        self.values: dict[str, Any] = {}  # name -> numpy value (known constants)
        self.shape_only: set[str] = set()  # constants whose values are not computed
        self.memo = memo  # shared by the rounds of one import
        self.evaluated = 0
        #: value -> the (node, input index) pairs that read it
        self.readers = readers_of(graph.node)

    # -- constants -------------------------------------------------------------------
    def is_const(self, name: str) -> bool:
        return name in self.values or name in self.shape_only or name in self.inits

    def value(self, name: str) -> Any | None:
        """The numpy value of constant ``name`` (None when not small or not readable)."""
        if name in self.values:
            return self.values[name]
        t = self.inits.get(name)
        if t is None or _numel(tuple(t.dims)) > INIT_MAX_ELEMENTS:
            return None  # a weight: its dims are all the importer needs
        if t.data_location == self.onnx.TensorProto.EXTERNAL:
            return None  # not readable: inline_small_external read all that were
        arr = self.nh.to_array(t)
        self.values[name] = arr
        return arr

    # -- one node --------------------------------------------------------------------
    def static_shape(self, node: Any) -> Any | None:

        shape = self.shapes.get(node.input[0])
        if shape is None:
            return None
        if node.op_type == "Size":
            return np.array(_numel(shape), dtype=np.int64)
        rank = len(shape)
        a = {x.name: x.i for x in node.attribute}
        start, end = a.get("start", 0), a.get("end", rank)
        start = max(0, min(rank, start + rank if start < 0 else start))
        end = max(0, min(rank, end + rank if end < 0 else end))
        return np.array(shape[start:end], dtype=np.int64)

    def _runnable(self, n: Any) -> Any:
        """``n`` alone, or, when the model's opset gives ``n`` an older version of its
        op than the newest (Unsqueeze's ``axes`` attribute before opset 13, say), ``n``
        in a one-node model at that opset: the reference evaluator runs a bare node at
        the newest version."""
        version = self.opsets.get(n.domain or "")
        if version is None:
            return n
        defs, helper = self.onnx.defs, self.onnx.helper
        try:
            then = defs.get_schema(n.op_type, version, n.domain or "").since_version
            now = defs.get_schema(n.op_type, n.domain or "").since_version
        except defs.SchemaError:
            return n
        if then == now:
            return n
        untyped = self.onnx.TypeProto()
        graph = helper.make_graph(
            [n],
            "fold",
            [helper.make_value_info(i, untyped) for i in n.input if i],
            [helper.make_value_info(o, untyped) for o in n.output],
        )
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.opsets.items()]
        )

    def evaluate(self, node: Any, inputs: list[Any], cache: bool = True) -> list[Any]:
        """``node``'s outputs on ``inputs`` (numpy values; None for an absent input),
        by ONNX's reference evaluator; memoised unless ``cache`` is false."""
        from onnx.reference import ReferenceEvaluator

        if not cache:
            key = None
        else:
            key = (
                node.op_type,
                node.domain,
                tuple(a.SerializeToString() for a in node.attribute),
                len(node.output),
                tuple(
                    ("", None) if x is None else (x.dtype.str, x.shape, x.tobytes()) for x in inputs
                ),
            )
        hit = self.memo.get(key) if key is not None else None
        if hit is not None:
            return hit
        names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
        outs = [f"o{k}" for k in range(len(node.output))]
        n = self.onnx.helper.make_node(node.op_type, names, outs, domain=node.domain)
        n.attribute.extend(node.attribute)
        feeds = {nm: x for nm, x in zip(names, inputs, strict=True) if nm}
        try:
            proto = self._runnable(n)
            opsets = self.opsets if proto is n else None
            try:
                got = ReferenceEvaluator(proto, opsets=opsets).run(None, feeds)
            except Exception:  # noqa: BLE001
                if proto is n or n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                    raise
                # onnx.reference implements these from opset 19 on; the versions
                # before differ only in the types they admit (float8, int4)
                got = ReferenceEvaluator(n).run(None, feeds)
        except Exception as e:  # noqa: BLE001 - the reference evaluator raises anything
            try:
                got = _fallback(node, inputs)
            except (ValueError, IndexError, TypeError):  # the inputs are wrong for it too
                got = None
            if got is not None:
                if key is not None:
                    self.memo[key] = got
                return got
            label = node.name or node.op_type
            raise WorkloadError(
                f"ONNX node {label!r} ({node.op_type}): constant folding "
                f"failed: {str(e).splitlines()[0] if str(e) else e!r}"
            ) from None
        self.evaluated += 1

        got = [np.asarray(x) for x in got]
        if key is not None:
            self.memo[key] = got
        return got

    def derive(self, node: Any, vals: list[Any]) -> None:
        """A node on large weights, shape-folded (a transposed weight, the legacy
        exporter's Identity of a shared one, position-embedding rows gathered for the
        fixed sequence, a weight scaled by a constant): its output's values are the
        node's on the weights', computed when functional mode asks
        (``memo[DERIVED]``: output -> a function giving them), so the model's values
        survive the folding."""
        if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER or len(node.output) != 1:
            return
        sources = {
            i: self.source_values(i)
            for i, v in zip(node.input, vals, strict=True)
            if i and v is None
        }
        if not sources or any(f is None for f in sources.values()):
            return
        copy = self.onnx.NodeProto()
        copy.CopyFrom(node)
        known = list(vals)

        def make() -> Any:
            ins = [
                sources[i]() if i in sources else v for i, v in zip(copy.input, known, strict=True)
            ]
            return self.evaluate(copy, ins, cache=False)[0]

        self.memo.setdefault(DERIVED, {})[node.output[0]] = make

    def reads_weight(self, name: str) -> bool:
        """Whether constant ``name`` is, or holds, one of the model's float weights: a
        float initializer that is not a :data:`PLAIN` value, a recorded source, or a
        shape-folded value (dims only: a weight's move)."""
        if name in self.memo.get(SOURCES, {}) or name in self.shape_only:
            return True
        t = self.inits.get(name)
        return (
            t is not None
            and t.data_type in _FLOAT_ELEMS
            and name not in self.memo.get(PLAIN, set())
        )

    def note_data(self, node: Any, computed: bool) -> None:
        """Record whether ``node``'s outputs hold any of the model's data: not when
        every input is a :data:`PLAIN` value (then they are plain too, and, when
        ``computed`` and float, :data:`MADE`); a ``Constant`` is plain unless it is a
        float tensor of several elements (a weight written inline)."""
        plain = self.memo.setdefault(PLAIN, set())
        made = self.memo.setdefault(MADE, set())
        if node.op_type == "Constant":
            v = self.values.get(node.output[0])
            if v is not None and not (v.dtype.kind == "f" and v.size > 1):
                plain.add(node.output[0])
            return
        if not all(i in plain for i in node.input if i):
            return
        for o in node.output:
            if not o:
                continue
            plain.add(o)
            v = self.values.get(o)
            if computed and v is not None and v.dtype.kind == "f":
                made.add(o)

    def record_source(self, node: Any, vals: list[Any]) -> None:
        """A shape-folded node reading one weight (the others small constants): its
        output holds that weight's values in another layout, or part of them
        (``memo[SOURCES]``: output -> (the model's initializer, its element count),
        through chains of such nodes), so the import counts that weight once."""
        big = [i for i, v in zip(node.input, vals, strict=True) if i and v is None]
        if len(big) == 1 and len(node.output) == 1:
            self._record(node, big, float_only=False)

    def record_small_source(self, node: Any) -> None:
        """A node folded whole whose one float input is a weight of the model (or holds
        one's values): its outputs hold that weight's values, in another layout, in
        part (position rows sliced to the sequence) or repeated (a class token expanded
        to the batch), so :attr:`Graph.parameters` counts the weight, once and whole,
        whatever dims the model is imported at (``memo[SOURCES]``)."""
        self._record(node, [i for i in node.input if i], float_only=True)

    def _record(self, node: Any, names: list[str], float_only: bool) -> None:
        """``node``'s outputs hold the one weight that ``names`` hold (a recorded
        source, or an initializer: a float one with ``float_only``); nothing when they
        hold none or several."""
        sources = self.memo.setdefault(SOURCES, {})
        found = set()
        for i in names:
            src = sources.get(i)
            t = self.inits.get(i)
            if src is None and t is not None and (not float_only or t.data_type in _FLOAT_ELEMS):
                src = (i, _numel(tuple(t.dims)))
            if src is not None:
                found.add(src)
        if len(found) == 1:
            src = found.pop()
            for o in node.output:
                if o:
                    sources[o] = src

    def source_values(self, name: str) -> Any | None:
        """A function giving weight ``name``'s values (from the model, its external
        data file, or a move of another weight's), or None when they are not there."""
        derived = self.memo.get(DERIVED, {})
        if name in derived:
            return derived[name]
        t = self.inits.get(name)
        if t is None:
            return None
        copy = self.onnx.TensorProto()
        copy.CopyFrom(t)
        held = self.memo.get(HELD, {})
        if name in held:  # its bytes, held out of the proto (hold_weights)

            def from_held() -> Any:
                full = self.onnx.TensorProto()
                full.CopyFrom(copy)
                del full.external_data[:]
                full.data_location = self.onnx.TensorProto.DEFAULT
                full.raw_data = held[name]
                return self.nh.to_array(full)

            return from_held
        where, state = external_state(self.onnx, t, self.base_dir)
        if state == "inline":
            return lambda: self.nh.to_array(copy)
        if state == "absent":
            if where and not where.startswith("<"):  # not a marker of the import's
                self.memo.setdefault(ABSENT, set()).add(where)
            return None
        base, source = self.base_dir, self.source
        return lambda: read_external(self.onnx, copy, base, source)

    def try_fold(self, node: Any) -> bool:
        """Fold ``node`` when it can be; True when its outputs are now constants."""
        if node.op_type == "Constant":
            from onnx import helper

            a = node.attribute[0] if node.attribute else None
            if a is None:
                return False
            v = helper.get_attribute_value(a)
            if a.name == "value":
                arr = self.nh.to_array(v)
            elif a.name in ("value_float", "value_floats", "value_int", "value_ints"):
                arr = np.asarray(v, np.float32 if "float" in a.name else np.int64)
            else:
                return False
            self.values[node.output[0]] = arr
            self.note_data(node, computed=False)
            return True
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
            v = self.static_shape(node)
            if v is None:
                return False
            self.values[node.output[0]] = v
            self.memo.setdefault(PLAIN, set()).add(node.output[0])  # a shape: no data
            return True
        if (
            node.op_type == "CastLike"
            and node.domain in ("", "ai.onnx")
            and len(node.input) == 2
            and self.is_const(node.input[0])
            and not self.is_const(node.input[1])
            and self.elem.get(node.input[1])
        ):  # its second input gives only the element type (the dynamo exporter's
            # attention scale cast like q): a Cast of the constant to it
            cast = self.onnx.helper.make_node(
                "Cast", [node.input[0]], list(node.output), node.name, to=self.elem[node.input[1]]
            )
            return self.try_fold(cast)
        ins = [i for i in node.input if i]
        if not ins:
            return False
        for i in ins:
            if not self.is_const(i):
                return False
        if (
            node.op_type in _NEVER
            or node.domain not in ("", "ai.onnx")
            or any(a.type in (5, 10) for a in node.attribute)
        ):
            return False  # random, a custom op, or has a subgraph (GRAPH(S) attribute)
        if node.op_type == "DequantizeLinear" and keeps_integer(node, self.readers):
            return False  # integer weights stay integer (the importer's _onnx_qdq)
        if node.op_type in GEMM_OPS and any(self.reads_weight(i) for i in ins):
            return False  # the model's compute on its weights (GEMM_OPS)
        vals = [self.value(i) if i else None for i in node.input]
        small = all(v is not None for v, i in zip(vals, node.input, strict=True) if i)
        if node.op_type == "QuantizeLinear" and not small and node.input[0] in self.inits:
            return False  # a float weight quantised in the model: the importer's (_onnx_qdq)
        outs_small = all(
            self.shapes.get(o) is not None and _numel(self.shapes[o]) <= FOLD_MAX_ELEMENTS  # type: ignore[arg-type]
            for o in node.output
            if o
        )
        unknown_out = any(self.shapes.get(o) is None for o in node.output if o)
        if small and (outs_small or unknown_out):
            got = self.evaluate(node, vals)
            for o, v in zip(node.output, got, strict=False):
                if o:
                    self.values[o] = v
                    self.shapes[o] = tuple(v.shape)
            self.record_small_source(node)
            self.note_data(node, computed=True)
            return True
        if unknown_out:
            return False
        self.derive(node, vals)
        self.record_source(node, vals)
        for o in node.output:
            if o:
                self.shape_only.add(o)
        return True

    def _copy(self, graph: Any, rename: dict[str, str], prefix: str) -> tuple[list[Any], list[Any]]:
        """``graph``'s nodes and initializers, renamed by ``rename`` (their outputs and
        initializers all are), node names prefixed."""
        nodes, inits = [], []
        for n in graph.node:
            c = self.onnx.NodeProto()
            c.CopyFrom(n)
            _rename_inputs(c, rename)
            for k, o in enumerate(c.output):
                if o:
                    c.output[k] = rename[o]
            if c.name:
                c.name = prefix + c.name
            nodes.append(c)
        for t in graph.initializer:
            c = self.onnx.TensorProto()
            c.CopyFrom(t)
            c.name = rename[t.name]
            inits.append(c)
        return nodes, inits

    def taken_branch(self, node: Any) -> tuple[list[Any], list[Any]] | None:
        """An ``If`` on a constant condition: (the nodes that replace it, the
        initializers they add), else None."""
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.input:
            return None
        cond = self.value(node.input[0])
        if cond is None or cond.size != 1:
            return None
        want = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        branch = next((a.g for a in node.attribute if a.name == want), None)
        if branch is None or len(branch.output) != len(node.output):
            return None
        prefix = f"{node.output[0]}/{want}/"
        defined = {o for n in branch.node for o in n.output if o} | {
            t.name for t in branch.initializer
        }
        nodes, inits = self._copy(branch, {name: prefix + name for name in defined}, prefix)
        for src, out in zip(branch.output, node.output, strict=True):
            if out:
                self._alias(prefix + src.name if src.name in defined else src.name, out, nodes)
        return nodes, inits

    def _alias(self, src: str, out: str, nodes: list[Any]) -> None:
        """``out`` (an If's or a Loop's output) is ``src``: the nodes after read
        ``src`` (a weight stays a weight, its values kept), or an Identity when ``out``
        is a graph output."""
        if out in {o.name for o in self.g.output}:
            nodes.append(self.onnx.helper.make_node("Identity", [src], [out], name=f"{out}/alias"))
        else:
            self.aliases[out] = src

    def unrolled_loop(
        self, node: Any
    ) -> tuple[list[Any], list[Any], dict[str, bool | None]] | None:
        """A ``Loop`` with a constant trip count (at most :data:`UNROLL_MAX`) and a
        constant true (or no) condition, unrolled: (the nodes that replace it, the
        initializers they add, each iteration's condition but the last's, which must
        fold to true: the importer checks, with its value where it is already known),
        else None. Iteration ``k`` is a copy of
        the body whose names are prefixed ``<output>/iter<k>/``, reading ``k`` as its
        iteration number and the previous iteration's values as its carried ones;
        the scan outputs are stacked on a new axis 0."""

        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            return None
        trip, cond = node.input[0], node.input[1]
        m = self.value(trip) if trip else None
        if m is None or m.size != 1 or not 1 <= int(m.reshape(-1)[0]) <= UNROLL_MAX:
            return None
        c0 = self.value(cond) if cond else None
        if cond and (c0 is None or c0.size != 1 or not bool(c0.reshape(-1)[0])):
            return None
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        carried = list(node.input[2:])
        if body is None or len(body.input) != len(carried) + 2 or "" in carried:
            return None
        n_scan = len(body.output) - 1 - len(carried)
        if n_scan < 0 or len(node.output) > len(carried) + n_scan:
            return None
        h = self.onnx.helper
        base = f"{node.output[0] or node.name}/iter"
        defined = {o for n in body.node for o in n.output if o} | {t.name for t in body.initializer}
        nodes: list[Any] = []
        inits: list[Any] = []
        conds: dict[str, bool | None] = {}
        true = {cond} if cond else set()  # the names known to hold true
        scans: list[list[str]] = [[] for _ in range(n_scan)]
        trips = int(m.reshape(-1)[0])
        for k in range(trips):
            prefix = f"{base}{k}/"
            rename = {name: prefix + name for name in defined}
            it = prefix + body.input[0].name
            inits.append(self.nh.from_array(np.array(k, np.int64), it))
            rename[body.input[0].name] = it
            if cond:
                rename[body.input[1].name] = cond
            else:
                rename[body.input[1].name] = prefix + body.input[1].name
                inits.append(self.nh.from_array(np.array(True), rename[body.input[1].name]))
                true.add(rename[body.input[1].name])
            for b_in, src in zip(body.input[2:], carried, strict=True):
                rename[b_in.name] = src  # the previous iteration's value, read directly
            more, more_inits = self._copy(body, rename, prefix)
            nodes += more
            inits += more_inits
            outs = [rename.get(o.name, o.name) for o in body.output]
            cond = outs[0]
            if k < trips - 1:
                conds[cond] = True if cond in true else None
            carried = outs[1 : 1 + len(carried)]
            for j in range(n_scan):
                scans[j].append(outs[1 + len(carried) + j])
        for out, src in zip(node.output, carried, strict=False):
            if out:
                self._alias(src, out, nodes)
        axes = f"{base}/axes0"
        new_axes = self.opsets.get("", 13) >= 13
        if new_axes and any(node.output[len(carried) :]):
            inits.append(self.nh.from_array(np.array([0], np.int64), axes))
        for j, out in enumerate(node.output[len(carried) :]):
            if not out:
                continue
            parts = []
            for k, src in enumerate(scans[j]):
                part = f"{out}/iter{k}"
                extra = {} if new_axes else {"axes": [0]}
                ins = [src, axes] if new_axes else [src]
                nodes.append(h.make_node("Unsqueeze", ins, [part], name=part, **extra))
                parts.append(part)
            nodes.append(h.make_node("Concat", parts, [out], name=f"{base}/{out}", axis=0))
        return nodes, inits, conds

    # -- the graph -------------------------------------------------------------------
    def run(self) -> tuple[int, bool]:
        kept, folded, branch_inits = [], 0, []
        conds = self.memo.setdefault(LOOP_CONDS, {})  # (a memo key no node has)
        self.aliases: dict[str, str] = {}  # an If's or a Loop's output -> what it is
        for node in self.g.node:
            if self.aliases:
                _rename_inputs(node, self.aliases)
            taken = self.taken_branch(node)
            loop = self.unrolled_loop(node) if taken is None else None
            if taken is not None:
                kept.extend(taken[0])
                branch_inits.extend(taken[1])
                folded += 1
            elif loop is not None:
                kept.extend(loop[0])
                branch_inits.extend(loop[1])
                conds.update({c: (node.name or node.output[0], v) for c, v in loop[2].items()})
                folded += 1
            elif self.try_fold(node):
                folded += 1
                for o in node.output:  # an unrolled iteration's condition, now known
                    if o in conds and o in self.values:
                        conds[o] = (conds[o][0], bool(np.asarray(self.values[o]).reshape(-1)[0]))
            else:
                kept.append(node)
        complete = all(self.shapes.get(o) is not None for n in kept for o in n.output if o)
        if not folded:
            return 0, complete
        needed = {i for n in kept for i in n.input} | {o.name for o in self.g.output}
        new_inits = []
        for name in sorted(needed):
            if name in self.inits or not (name in self.values or name in self.shape_only):
                continue
            if name in self.values:
                t = self.nh.from_array(self.values[name], name)
            else:
                t = self.onnx.TensorProto()
                t.name = name
                t.data_type = self.elem.get(name, 1)
                t.dims.extend(self.shapes[name] or ())
                # dims only: the values of a shape-folded weight are never computed
                t.data_location = self.onnx.TensorProto.EXTERNAL
                e = t.external_data.add()
                e.key, e.value = "location", "<shape-folded>"
            new_inits.append(t)
        used = needed | {vi.name for vi in self.g.input}
        keep_inits = [t for t in [*self.g.initializer, *branch_inits] if t.name in used]
        del self.g.node[:]
        self.g.node.extend(kept)
        del self.g.initializer[:]
        self.g.initializer.extend(keep_inits + new_inits)
        init_names = {t.name for t in self.g.initializer}
        vis = [v for v in self.g.value_info if v.name not in init_names]
        del self.g.value_info[:]
        self.g.value_info.extend(vis)
        return folded, complete


def _rename_inputs(node: Any, rename: dict[str, str]) -> None:
    """Rename ``node``'s inputs, and those of the nodes of its subgraphs (which may
    read the enclosing scope), by ``rename``, in place."""
    for k, i in enumerate(node.input):
        if i in rename:
            node.input[k] = rename[i]
    for a in node.attribute:
        for g in [a.g] if a.HasField("g") else list(a.graphs):
            for n in g.node:
                _rename_inputs(n, rename)


def hold_weights(onnx: Any, proto: Any) -> dict[str, bytes]:
    """Take the bytes of ``proto``'s inline initializers above :data:`HOLD_BYTES` out of
    it (each left as a weight with dims and an external-data marker, as shape
    inference and folding need no more), in place; returns them by name. A model
    with its weights embedded is then not copied whole at every round of shape
    inference; the importer puts them back once."""
    held: dict[str, bytes] = {}
    for t in proto.graph.initializer:
        if (
            t.data_location != onnx.TensorProto.EXTERNAL
            and len(t.raw_data) > HOLD_BYTES
            and _numel(tuple(t.dims)) > INIT_MAX_ELEMENTS  # never read by folding
        ):
            held[t.name] = t.raw_data
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            e = t.external_data.add()
            e.key, e.value = "location", "<held>"
    return held


def check_loops(memo: dict[Any, Any], source: str) -> None:
    """Refuse an unrolled Loop (:meth:`_Folder.unrolled_loop`) one of whose iterations'
    conditions did not fold to true: the loop would exit early, or on run-time
    values."""
    for name, (loop, value) in memo.get(LOOP_CONDS, {}).items():
        if value is not True:
            why = "is false: it exits early" if value is False else "depends on run-time values"
            raise WorkloadError(
                f"{source}: ONNX node {loop!r} (Loop): an iteration's condition ({name!r}) "
                f"{why}; only loops that run their whole trip count are modelled"
            )


def inline_small_external(onnx: Any, proto: Any, base_dir: Path | None) -> None:
    """Read the values of the small (at most :data:`INIT_MAX_ELEMENTS`) initializers
    stored in external data into the model, when the data file is there: shape
    inference needs the constants that give shapes (a Reshape's target, say)."""
    if base_dir is None:
        return
    from onnx.external_data_helper import load_external_data_for_tensor

    for t in proto.graph.initializer:
        if (
            t.data_location == onnx.TensorProto.EXTERNAL
            and _numel(tuple(t.dims)) <= INIT_MAX_ELEMENTS
        ):
            try:
                load_external_data_for_tensor(t, str(base_dir))
            except (OSError, ValueError, onnx.checker.ValidationError):
                continue  # the data file is absent (a weight-stripped model)
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]


def fold(
    onnx: Any,
    proto: Any,
    base_dir: Path | None,
    memo: dict[Any, list[Any]] | None = None,
    source: str = "",
) -> tuple[int, bool]:
    """Fold the constant and static-shape subgraphs of ``proto`` (shape-inferred) in
    place. Returns (nodes folded away, whether every remaining value has a static
    shape: if not, another round of shape inference and folding may fold more).
    ``memo`` carries evaluated nodes from one round to the next; ``source`` names the
    model in errors. See the module docstring."""
    opsets = {(o.domain or ""): o.version for o in proto.opset_import}
    memo = {} if memo is None else memo
    return _Folder(onnx, proto.graph, opsets, base_dir, memo, source).run()


def external_state(onnx: Any, t: Any, base_dir: Path | None) -> tuple[str, str]:
    """Where initializer ``t``'s elements are: ``("", "inline")`` in the model, else
    its external data file's location and ``"present"``, ``"absent"`` (no such file
    beside the model, as in a weight-stripped model; or an import's marker such as
    ``<shape-folded>``) or ``"outside"`` (an absolute location, or one that leaves
    the model's folder: ONNX refuses to read it, and a model must not make us read
    files elsewhere)."""
    if t.data_location != onnx.TensorProto.EXTERNAL:
        return "", "inline"
    where = {e.key: e.value for e in t.external_data}.get("location", "")
    if not where or where.startswith("<") or base_dir is None:
        return where, "absent"
    base = os.path.normpath(os.path.abspath(base_dir))
    path = os.path.normpath(os.path.join(base, where))
    if os.path.isabs(where) or os.path.commonpath([base, path]) != base:
        return where, "outside"
    return where, ("present" if os.path.isfile(path) else "absent")


def read_external(onnx: Any, t: Any, base_dir: Path | None, source: str) -> Any:
    """Initializer ``t``'s elements, from its external data file beside the model
    (:func:`external_state` ``"present"`` or ``"outside"``). A file that does not hold
    them (outside the model's folder, shorter than the tensor's offset and length,
    empty, unreadable) is a WorkloadError naming the model, the file and the tensor:
    reading on would be a traceback, or values that are not the model's."""
    from onnx import numpy_helper

    where, state = external_state(onnx, t, base_dir)
    what = f"{source or 'ONNX model'}: weight {t.name!r}: its external data file {where!r}"
    if state == "outside":
        raise WorkloadError(
            f"{what} is outside the model's folder {str(base_dir)!r}; ONNX reads external "
            "data only from the model's folder"
        )
    if state != "present":
        raise WorkloadError(f"{what} is not beside the model")
    path = os.path.join(os.fspath(base_dir), where)
    info = {e.key: e.value for e in t.external_data}
    try:
        size = os.path.getsize(path)
        offset, length = int(info.get("offset") or 0), int(info.get("length") or -1)
    except (OSError, ValueError) as e:
        raise WorkloadError(f"{what} cannot be read: {e}") from None
    if offset + max(length, 0) > size or (length < 0 and offset >= size):
        need = f"bytes {offset} to {offset + length}" if length >= 0 else f"bytes from {offset}"
        held = f"holds {size} bytes" if size else "is empty"
        raise WorkloadError(
            f"{what} is truncated: it {held}, the tensor's are {need} (a partial download or copy?)"
        )
    try:
        return numpy_helper.to_array(t, base_dir=os.fspath(base_dir))
    except (OSError, ValueError, onnx.checker.ValidationError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkloadError(f"{what} cannot be read: {why}") from None


def _subgraph_reads(node: Any) -> set[str]:
    """The names ``node``'s subgraphs (If's branches, Loop's and Scan's bodies, at any
    depth) read from the enclosing scope: what they read less what they define."""
    reads: set[str] = set()
    for a in node.attribute:
        for g in [a.g] if a.HasField("g") else list(a.graphs):
            defined = {v.name for v in g.input} | {t.name for t in g.initializer}
            defined |= {o for n in g.node for o in n.output if o}
            inner = {i for n in g.node for i in n.input if i}
            inner |= {o.name for o in g.output}
            for n in g.node:
                inner |= _subgraph_reads(n)
            reads |= inner - defined
    return reads


def node_reads(node: Any) -> set[str]:
    """The values ``node`` reads: its inputs and what its subgraphs read from the
    enclosing scope."""
    reads = {i for i in node.input if i}
    if any(a.type in (5, 10) for a in node.attribute):  # GRAPH, GRAPHS
        reads |= _subgraph_reads(node)
    return reads


def sort_nodes(graph: Any, source: str) -> bool:
    """Put ``graph``'s nodes in topological order, in place, keeping the file's order
    among the nodes that are ready (a sorted graph is left as it is); returns whether
    the order changed. A value no node produces (a graph input, an initializer, or a
    name nothing defines, which shape inference reports) is ready from the start.

    Raises :class:`~wia_hw.WorkloadError` naming a node of a cycle when there is one.
    """
    nodes = list(graph.node)
    producer: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer.setdefault(o, k)
    deps = [{producer[i] for i in node_reads(n) if i in producer} for n in nodes]
    if all(d < k for k, ds in enumerate(deps) for d in ds):
        return False
    waiting = [len(ds) for ds in deps]
    readers: dict[int, list[int]] = {}
    for k, ds in enumerate(deps):
        for d in ds:
            readers.setdefault(d, []).append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for r in readers.get(k, []):
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) < len(nodes):
        k = next(k for k, w in enumerate(waiting) if w)
        seen: list[int] = []
        while k not in seen:  # walk back along unscheduled producers until one repeats
            seen.append(k)
            k = min(d for d in deps[k] if waiting[d])
        n, reader = nodes[k], nodes[seen[-1]]  # seen[-1] reads an output of k
        value = next(o for o in n.output if o and o in node_reads(reader))
        by = (
            "itself"
            if reader is n
            else f"{reader.name or reader.op_type!r} ({reader.op_type}), which depends on it"
        )
        raise WorkloadError(
            f"{source}: ONNX node {n.name or n.op_type!r} ({n.op_type}) is in a cycle: "
            f"its output {value!r} is read by {by}"
        )
    del graph.node[:]
    graph.node.extend(nodes[k] for k in order)
    return True


def prune_dead(onnx: Any, proto: Any) -> int:
    """Remove the nodes of ``proto``'s graph that no graph output depends on, and the
    initializers only they read, in place; returns the number of nodes removed. The
    optional outputs that nothing reads are dropped from the nodes kept (an LSTM's
    ``Y_h`` and ``Y_c`` when only ``Y`` is used: the importer then builds no copies
    for them). A graph that declares no outputs is left as it is."""
    graph = proto.graph
    needed = {o.name for o in graph.output}
    if not needed:
        return 0
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    live: set[int] = set()
    todo = list(needed)
    while todo:
        k = producer.get(todo.pop())
        if k is None or k in live:
            continue
        live.add(k)
        reads = node_reads(graph.node[k])
        todo.extend(reads - needed)
        needed |= reads
    opsets = {(o.domain or ""): o.version for o in proto.opset_import}
    for k in live:
        _drop_unread_outputs(onnx, graph.node[k], needed, opsets)
    removed = len(graph.node) - len(live)
    if not removed:
        return 0
    kept = [n for k, n in enumerate(graph.node) if k in live]
    del graph.node[:]
    graph.node.extend(kept)
    inputs = {v.name for v in graph.input}
    inits = [t for t in graph.initializer if t.name in needed or t.name in inputs]
    if len(inits) < len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(inits)
    return removed


def _drop_unread_outputs(onnx: Any, node: Any, needed: set[str], opsets: dict[str, int]) -> None:
    """Blank ``node``'s outputs that nothing reads and that its op's schema marks
    optional (the first only for the recurrent ops, whose outputs all are)."""
    if all(o in needed for o in node.output if o):
        return
    domain = "" if node.domain == "ai.onnx" else node.domain
    version = opsets.get(domain)
    if version is None:
        return
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        return
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    params = schema.outputs
    for k, o in enumerate(node.output):
        if (
            o
            and o not in needed
            and k < len(params)
            and params[k].option == optional
            and (k > 0 or node.op_type in ("LSTM", "GRU", "RNN"))
        ):
            node.output[k] = ""
