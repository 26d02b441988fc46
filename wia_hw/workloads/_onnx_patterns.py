"""Pattern recognition on an imported ONNX graph: what exporters decompose, put back.

:func:`recognise` rewrites a graph made by the ONNX importer; every rewrite keeps the
graph's FLOPs (a fused op carries the FLOPs of the ops it replaces in
``attrs["flops"]`` when its own count differs), its MACs and its outputs' names and
shapes:

* **linear + bias**: a ``linear`` without bias whose only reader is an ``add`` of a
  ``[N]`` weight becomes a ``linear`` with that bias (2 MAC FLOPs + 1 per output:
  the same count).
* **GELU**: ``x / sqrt(2)`` (or ``x * (1/sqrt(2))``) -> ``erf`` -> ``+ 1`` ->
  ``* x`` (or ``* (0.5 x)``) -> optionally ``* 0.5``, or ``* 0.5`` -> ``* x`` (the
  dynamo exporter's order), is one ``gelu``; so is the tanh
  form ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (GPT-2's ``gelu_new``;
  ``x^3`` as ``pow`` or ``x * x * x``).
* **SiLU**: ``x * sigmoid(x)`` is one ``swish``; so is QuickGELU ``x * sigmoid(a x)``
  (``alpha`` a).
* **Layer norm**: ``mean(x)`` -> ``d = x - mean`` -> ``d ** 2`` (or ``d * d``) ->
  ``mean`` -> ``+ eps`` -> ``sqrt`` -> ``d / std`` -> optionally ``* gamma [H]`` ->
  ``+ beta [H]`` (means over the last axis) is one ``layer_norm`` (``eps`` recorded).
* **RMS norm**: ``x * x`` (or ``x ** 2``) -> ``mean`` -> ``+ eps`` -> ``sqrt`` ->
  ``x / r`` (or ``x * reciprocal(r)``) -> optionally ``* gamma [H]`` (LLaMA's and T5's
  RMSNorm) is one ``layer_norm`` with ``rms``.
* **Attention**: ``bmm(q, transpose(k))`` -> ``* scale`` or ``/ scale`` -> masking
  (``add`` of a mask, or the ops of a ``Where``) -> ``softmax`` (last axis) ->
  (SDPA's NaN guard ``where(isnan(p), 0, p)`` and a same-type ``cast``, absorbed)
  -> ``bmm(p, v)`` becomes ``bmm(q, k, transpose_b=True, scale=s)`` -> ``softmax`` ->
  ``bmm``, the chain the transformer engine claims. A constant mask equal to the causal
  triangle sets ``causal=True`` on the softmax; an all-zero one is dropped; any other
  additive mask or bias (a padding mask, T5's position bias) becomes the softmax's
  second input, added before it, and sets ``masked=True``; a mask written any other
  way (a select on a run-time condition) leaves the chain as it is. The transpose of k is kept with its
  last two axes swapped back (or dropped when that leaves the identity). Views
  (``reshape``) that regroup the leading axes between the scores bmm and the ops
  before the softmax, and between the softmax and the context bmm (tf2onnx's einsum),
  are dropped when the two bmms' shapes agree: the softmax runs on the bmm's shape
  (then no bias is taken over). TensorFlow's ``where(m, s, c)`` written as
  ``s * m + c`` (0/1 constant ``m``, ``c`` zero where kept and at most -1e4 elsewhere)
  is the additive mask ``c``.

Constants' values (the scale, eps, mask) are read from the ONNX constants when the
model carries them; a weight-stripped model is matched on structure alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..graph import Graph, Op

_SCALAR_MAX = 1


class _Rewriter:
    def __init__(self, graph: Graph, imp: Any) -> None:
        self.g = graph
        self.imp = imp
        self.ops: list[Op | None] = list(graph.ops)
        self.index = {id(o): i for i, o in enumerate(graph.ops)}
        self.prod: dict[str, Op] = {t: o for o in graph.ops for t in o.outputs}
        self.cons: dict[str, list[Op]] = {}
        for o in graph.ops:
            for i in dict.fromkeys(o.inputs):
                self.cons.setdefault(i, []).append(o)
        self.new_tensors: dict[str, Any] = {}
        self.outputs = set(imp.g.output[i].name for i in range(len(imp.g.output)))

    # -- helpers ---------------------------------------------------------------------
    def t(self, name: str) -> Any:
        return self.new_tensors.get(name) or self.g.tensors[name]

    def weight(self, name: str) -> bool:
        return self.t(name).kind == "weight"

    def scalar(self, name: str) -> bool:
        return self.weight(name) and self.t(name).numel <= _SCALAR_MAX

    def value(self, name: str) -> Any | None:
        try:
            return self.imp.const_values(name)
        except Exception:  # noqa: BLE001 - an unreadable constant is matched on structure
            return None

    def scalar_value(self, name: str) -> float | None:
        v = self.value(name)
        return None if v is None else float(v.reshape(-1)[0])

    def only_reader(self, tensor: str) -> Op | None:
        """The single live op reading ``tensor`` (None if 0 or 2+, or a graph output)."""
        if tensor in self.outputs:
            return None
        r = [o for o in self.cons.get(tensor, []) if self.alive(o)]
        return r[0] if len(r) == 1 else None

    def alive(self, op: Op) -> bool:
        return self.ops[self.index[id(op)]] is op

    def other(self, op: Op, tensor: str) -> str:
        return op.inputs[1] if op.inputs[0] == tensor else op.inputs[0]

    def flops(self, ops: Iterable[Op]) -> int:
        return sum(self.g.flops(o) for o in ops)

    def replace(self, remove: list[Op], at: Op, new: list[Op]) -> None:
        """Drop ``remove``; put ``new`` where ``at`` was (``at`` is in ``remove``).
        Not when a dropped op writes integer codes that the pattern would skip (a
        quantised model rounds there: fusing would change its numbers)."""
        kept = {t for o in new for t in o.outputs}
        if any(t in self.imp.qparams and t not in kept for o in remove for t in o.outputs):
            self.refused = True
            return
        for o in remove:
            if o is not at:
                self.ops[self.index[id(o)]] = None
        pos = self.index[id(at)]
        self.ops[pos] = None
        self.pending.setdefault(pos, []).extend(new)

    def fused(
        self,
        name: str,
        kind: str,
        inputs: list[str],
        out: str,
        group: str,
        flops: int,
        own: int,
        **attrs: Any,
    ) -> Op:
        if flops != own:
            attrs["flops"] = flops
        return Op(name, kind, tuple(inputs), (out,), group, attrs)

    # -- linear + bias ---------------------------------------------------------------
    def linear_bias(self, op: Op) -> None:
        if op.kind != "linear" or len(op.inputs) != 2:
            return
        add = self.only_reader(op.outputs[0])
        if add is None or add.kind != "add" or add.inputs[0] == add.inputs[1]:
            return
        bias = self.other(add, op.outputs[0])
        n = self.t(op.inputs[1]).shape[1]
        if (
            not self.weight(bias)
            or self.t(bias).shape != (n,)
            or self.t(add.outputs[0]).shape != self.t(op.outputs[0]).shape
        ):
            return
        new = Op(op.name, "linear", (*op.inputs, bias), add.outputs, op.group, op.attrs)
        self.replace([op, add], add, [new])

    # -- GELU ------------------------------------------------------------------------
    def gelu_input(self, act: Op) -> tuple[str, list[Op]] | None:
        """The GELU input x and the ops from x to ``act`` (an erf or tanh), when ``act``
        reads ``x / sqrt(2)`` (erf form) or ``sqrt(2/pi) * (x + 0.044715 x^3)`` (tanh
        form, GPT-2's ``gelu_new``)."""
        pre = self.prod.get(act.inputs[0])
        if (
            pre is None
            or pre.kind not in ("div", "mul")
            or not self.alive(pre)
            or self.only_reader(pre.outputs[0]) is not act
        ):
            return None
        c = next((i for i in pre.inputs if self.scalar(i)), None)
        if c is None:
            return None
        inner = self.other(pre, c)
        cv = self.scalar_value(c)
        if act.kind == "erf":
            if cv is not None and not math.isclose(
                cv if pre.kind == "div" else 1 / cv, math.sqrt(2), rel_tol=1e-3
            ):
                return None
            return inner, [pre]
        # tanh form: inner = x + 0.044715 * x^3
        if cv is not None and not math.isclose(
            cv if pre.kind == "mul" else 1 / cv, math.sqrt(2 / math.pi), rel_tol=1e-3
        ):
            return None
        add = self.prod.get(inner)
        if add is None or add.kind != "add" or self.only_reader(inner) is not pre:
            return None
        for x in add.inputs:
            cube = self.prod.get(self.other(add, x))
            if cube is None or cube.kind != "mul" or self.only_reader(cube.outputs[0]) is not add:
                continue
            k = next((i for i in cube.inputs if self.scalar(i)), None)
            kv = self.scalar_value(k) if k is not None else None
            if k is None or kv is not None and not math.isclose(kv, 0.044715, rel_tol=1e-3):
                continue
            cubed = self.cubed(self.other(cube, k), x, cube)
            if cubed is not None:
                return x, [*cubed, cube, add, pre]
        return None

    def cubed(self, t: str, x: str, reader: Op) -> list[Op] | None:
        """The ops that make ``t`` = ``x ** 3`` (``pow(x, 3)``, or ``x * x * x`` in
        either grouping), each read only by the next and the last by ``reader``."""
        p = self.prod.get(t)
        if p is None or self.only_reader(t) is not reader:
            return None
        if p.kind == "pow":
            ok = (
                p.inputs[0] == x
                and self.scalar(p.inputs[1])
                and self.scalar_value(p.inputs[1]) in (3.0, None)  # None: a stripped constant
            )
            return [p] if ok else None
        if p.kind != "mul" or x not in p.inputs:
            return None
        sq = self.prod.get(self.other(p, x))
        if (
            sq is None
            or sq.kind != "mul"
            or sq.inputs != (x, x)
            or self.only_reader(sq.outputs[0]) is not p
        ):
            return None
        return [sq, p]

    def gelu(self, erf: Op) -> None:
        if erf.kind not in ("erf", "tanh"):
            return
        found = self.gelu_input(erf)
        if found is None:
            return
        x, head = found
        add = self.only_reader(erf.outputs[0])
        if add is None or add.kind != "add" or not any(self.scalar(i) for i in add.inputs):
            return
        mul = self.only_reader(add.outputs[0])
        if mul is None or mul.kind != "mul":
            return
        cluster = [*head, erf, add, mul]
        half = self.other(mul, add.outputs[0])
        if half != x and self.scalar(half):  # x * (0.5 * (1 + erf)): torch.export's order
            last = self.only_reader(mul.outputs[0])
            if last is None or last.kind != "mul" or self.other(last, mul.outputs[0]) != x:
                return
            cluster.append(last)
        elif half != x:  # 0.5 x computed first
            h = self.prod.get(half)
            if (
                h is None
                or h.kind != "mul"
                or x not in h.inputs
                or not self.scalar(self.other(h, x))
                or self.only_reader(half) is not mul
            ):
                return
            cluster.insert(0, h)
            last = mul
        else:  # (x * (1 + erf)) * 0.5
            last = self.only_reader(mul.outputs[0])
            if (
                last is None
                or last.kind != "mul"
                or not self.scalar(self.other(last, mul.outputs[0]))
            ):
                return
            cluster.append(last)
        out = last.outputs[0]
        if self.t(out).shape != self.t(x).shape:
            return
        numel = self.t(out).numel
        from ..graph import UNARY_KINDS

        new = self.fused(
            last.name,
            "gelu",
            [x],
            out,
            last.group,
            self.flops(cluster),
            UNARY_KINDS["gelu"] * numel,
            **({"approximate": "tanh"} if erf.kind == "tanh" else {}),
        )
        self.replace(cluster, last, [new])

    def silu(self, sig: Op) -> None:
        """``x * sigmoid(x)`` (SiLU, as both exporters write it: LLaMA's gated MLP), or
        ``x * sigmoid(a x)`` (QuickGELU), is one ``swish`` (``alpha``)."""
        if sig.kind != "sigmoid":
            return
        x, cluster, alpha = sig.inputs[0], [sig], None
        pre = self.prod.get(x)
        if (  # x * sigmoid(a x): QuickGELU (CLIP's), a = 1.702
            pre is not None
            and pre.kind == "mul"
            and self.only_reader(x) is sig
            and any(self.scalar(i) for i in pre.inputs)
        ):
            c = next(i for i in pre.inputs if self.scalar(i))
            alpha = self.scalar_value(c)
            if alpha is None:
                return
            x = self.other(pre, c)
            cluster.insert(0, pre)
        mul = self.only_reader(sig.outputs[0])
        if mul is None or mul.kind != "mul" or self.other(mul, sig.outputs[0]) != x:
            return
        out = mul.outputs[0]
        if self.t(out).shape != self.t(x).shape:
            return
        from ..graph import UNARY_KINDS

        cluster.append(mul)
        new = self.fused(
            mul.name,
            "swish",
            [x],
            out,
            mul.group,
            self.flops(cluster),
            UNARY_KINDS["swish"] * self.t(out).numel,
            **({"alpha": alpha} if alpha is not None else {}),
        )
        self.replace(cluster, mul, [new])

    # -- layer norm ------------------------------------------------------------------
    def mean_unit(self, tensor: str) -> tuple[str, list[Op]] | None:
        """If ``tensor`` is a mean over the last axis of some x: (x, the ops)."""
        o = self.prod.get(tensor)
        ops: list[Op] = []
        if o is not None and o.kind == "reshape":
            ops.append(o)
            o = self.prod.get(o.inputs[0])
        if o is None or o.kind != "global_avgpool" or o.attrs.get("reduce", "mean") != "mean":
            return None
        ops.append(o)
        src = o.inputs[0]
        r = self.prod.get(src)
        # ReduceMean's view (1, rows, L, 1) or GlobalAveragePool's of a 3-D x (N, C, 1, L)
        # (tf2onnx writes a mean over the last axis that way): the pool's window must be
        # exactly the last axis
        if r is None or r.kind != "reshape" or len(self.t(src).shape) != 4:
            return None
        ops.append(r)
        src = r.inputs[0]
        if math.prod(self.t(r.outputs[0]).shape[2:]) != self.t(src).shape[-1]:
            return None  # reduces more than the last axis
        if any(not self.alive(p) for p in ops):
            return None
        return src, ops

    def layer_norm(self, sub: Op) -> None:
        if sub.kind != "sub":
            return
        x, m = sub.inputs
        mu = self.mean_unit(m)
        if mu is None or mu[0] != x:
            return
        cluster = list(mu[1]) + [sub]
        d = sub.outputs[0]
        readers = [o for o in self.cons.get(d, []) if self.alive(o)]
        sq = next((o for o in readers if self.squares(o, d)), None)
        div = next((o for o in readers if o.kind == "div" and o.inputs[0] == d), None)
        found = self.mean_plus_eps(sq) if sq is not None else None
        if found is None:
            return
        if readers == [sq]:  # d only for the variance: TensorFlow's form
            self.tf_layer_norm(cluster + [sq], x, m, found)
            return
        if div is None or len(readers) != 2:
            return
        ops, add, eps = found
        sqrt = self.only_reader(add.outputs[0])
        if sqrt is None or sqrt.kind != "sqrt" or self.only_reader(sqrt.outputs[0]) is not div:
            return
        cluster += [sq, *ops, sqrt, div]
        self.norm_with_affine(cluster, div, x, eps, rms=False)

    def tf_layer_norm(
        self, cluster: list[Op], x: str, mean: str, found: tuple[list[Op], Op, float | None]
    ) -> None:
        """TensorFlow's layer norm (``tf.nn.batch_normalization`` after
        ``tf.nn.moments``, and Keras's ``LayerNormalization``), as tf2onnx writes it:
        ``inv = reciprocal(sqrt(var + eps))`` (``* gamma``), then
        ``x * inv + (-mean * inv + beta)`` or ``x * inv + (beta - mean * inv)``
        (``x * inv - mean * inv`` without beta). ``cluster`` holds the mean, ``x -
        mean`` and its square; ``found`` is :meth:`mean_plus_eps` of the square."""
        ops, add, eps = found
        sqrt = self.only_reader(add.outputs[0])
        rec = (
            self.only_reader(sqrt.outputs[0]) if sqrt is not None and sqrt.kind == "sqrt" else None
        )
        if rec is None or not (
            rec.kind == "reciprocal"
            or rec.kind == "div"
            and rec.inputs[1] == sqrt.outputs[0]
            and self.scalar(rec.inputs[0])
            and self.scalar_value(rec.inputs[0]) == 1.0
        ):
            return
        cluster += [*ops, sqrt, rec]
        hdim = self.t(x).shape[-1]
        inv, ins = rec.outputs[0], [x]
        g = self.only_reader(inv)
        if g is not None and g.kind == "mul" and self.affine(self.other(g, inv), hdim):
            cluster.append(g)
            ins.append(self.affine_vector(self.other(g, inv), hdim))
            inv = g.outputs[0]
        readers = [o for o in self.cons.get(inv, []) if self.alive(o)]
        if len(readers) != 2 or inv in self.outputs or any(o.kind != "mul" for o in readers):
            return
        xm = next((o for o in readers if self.other(o, inv) == x), None)
        mm = next((o for o in readers if o is not xm), None)
        if xm is None or mm is None:
            return
        # mean's readers: x - mean, and mean * inv or -mean (then -mean * inv)
        neg = self.prod.get(self.other(mm, inv))
        negated = neg is not None and neg.kind == "neg" and neg.inputs[0] == mean
        if negated:
            if self.only_reader(neg.outputs[0]) is not mm:
                return
            cluster.append(neg)
        elif self.other(mm, inv) != mean:
            return
        m_readers = [o for o in self.cons.get(mean, []) if self.alive(o)]
        if len(m_readers) != 2 or mean in self.outputs:
            return
        cluster += [xm, mm]
        res, last = mm.outputs[0], self.only_reader(mm.outputs[0])
        if last is None:
            return
        beta = self.other(last, res) if last.kind in ("add", "sub") else None
        if (
            beta is not None
            and self.affine(beta, hdim)
            and (negated and last.kind == "add" or not negated and last.inputs == (beta, res))
        ):  # -mean * inv + beta, or beta - mean * inv
            if len(ins) == 1:
                return  # beta without gamma: layer_norm takes gamma first
            ins.append(self.affine_vector(beta, hdim))
            cluster.append(last)
            res, last = last.outputs[0], self.only_reader(last.outputs[0])
            if last is None:
                return
            final = last.kind == "add" and set(last.inputs) == {xm.outputs[0], res}
        elif negated:  # no beta: x * inv + (-mean * inv)
            final = last.kind == "add" and set(last.inputs) == {xm.outputs[0], res}
        else:  # no beta: x * inv - mean * inv
            final = last.kind == "sub" and last.inputs == (xm.outputs[0], res)
        if not final or self.only_reader(xm.outputs[0]) is not last:
            return
        cluster.append(last)
        if self.t(last.outputs[0]).shape != self.t(x).shape:
            return
        self.fused_norm(cluster, last, ins, eps, rms=False)

    def affine(self, name: str, hdim: int) -> bool:
        """Whether ``name`` is a float weight of ``hdim`` values along the last axis
        (``[H]``, or ``[1, ..., 1, H]`` as tf2onnx writes gamma and beta)."""
        t = self.t(name)
        return (
            t.kind == "weight"
            and t.numel == hdim
            and t.shape[-1] == hdim
            and name not in self.imp.qparams
        )

    def affine_vector(self, name: str, hdim: int) -> str:
        """The ``[H]`` weight for an :meth:`affine` one: itself, or a new view of its
        values."""
        from ..graph import Tensor

        t = self.t(name)
        if t.shape == (hdim,):
            return name
        new = f"{name}.vector"
        self.new_tensors[new] = Tensor(new, (hdim,), t.dtype, "weight")
        values = self.imp.values.get(name)
        if values is not None:
            self.imp.values[new] = lambda: values().reshape(hdim)
        return new

    def squares(self, o: Op, x: str) -> bool:
        """Whether ``o`` is ``x * x`` or ``x ** 2``."""
        if o.kind == "mul":
            return o.inputs == (x, x)
        return (
            o.kind == "pow"
            and o.inputs[0] == x
            and self.scalar(o.inputs[1])
            and self.scalar_value(o.inputs[1]) in (2.0, None)  # None: a stripped constant
        )

    def mean_plus_eps(self, sq: Op) -> tuple[list[Op], Op, float | None] | None:
        """``sq``'s mean over the last axis (reshape -> global_avgpool -> reshape) plus
        a scalar ``eps``: (the ops from the mean to the add, the add, eps's value)."""
        r2 = self.only_reader(sq.outputs[0])
        tail = self.only_reader(r2.outputs[0]) if r2 is not None and r2.kind == "reshape" else None
        end = self.only_reader(tail.outputs[0]) if tail is not None else None
        if end is None or end.kind != "reshape":
            return None
        mv = self.mean_unit(end.outputs[0])
        if mv is None or mv[0] != sq.outputs[0]:
            return None
        add = self.only_reader(end.outputs[0])
        if add is None or add.kind != "add" or not self.scalar(self.other(add, end.outputs[0])):
            return None
        return [*mv[1], add], add, self.scalar_value(self.other(add, end.outputs[0]))

    def norm_with_affine(
        self, cluster: list[Op], norm: Op, x: str, eps: float | None, rms: bool
    ) -> None:
        """Finish a norm whose normalised ``x`` ``norm`` writes: a same-type Cast after
        it (LLaMA's ``.to(input_dtype)``), ``* gamma [H]`` and ``+ beta [H]`` when there,
        then the one fused ``layer_norm``."""
        last, ins, hdim = norm, [x], self.t(x).shape[-1]
        g = self.only_reader(norm.outputs[0])
        if (
            g is not None
            and g.kind == "cast"
            and self.t(g.outputs[0]).dtype == self.t(norm.outputs[0]).dtype
        ):  # free
            cluster.append(g)
            last, g = g, self.only_reader(g.outputs[0])
        for kind in ("mul", "add"):  # gamma, then beta
            if (
                g is None
                or g.kind != kind
                or not self.weight(self.other(g, last.outputs[0]))
                or self.t(self.other(g, last.outputs[0])).shape != (hdim,)
            ):
                break
            ins.append(self.other(g, last.outputs[0]))
            cluster.append(g)
            last, g = g, self.only_reader(g.outputs[0])
        if self.t(last.outputs[0]).shape != self.t(x).shape:
            return
        self.fused_norm(cluster, last, ins, eps, rms)

    def fused_norm(
        self, cluster: list[Op], last: Op, ins: list[str], eps: float | None, rms: bool
    ) -> None:
        """Replace ``cluster`` (ending in ``last``) by one ``layer_norm`` of ``ins``
        (``rms``: RMS norm) carrying the cluster's FLOPs."""
        from ..graph import LAYER_NORM_FLOPS_PER_ELEMENT, RMS_NORM_FLOPS_PER_ELEMENT

        attrs: dict[str, Any] = {"rms": True} if rms else {}
        if eps is not None:
            attrs["eps"] = eps
        out = last.outputs[0]
        own = RMS_NORM_FLOPS_PER_ELEMENT if rms else LAYER_NORM_FLOPS_PER_ELEMENT
        new = self.fused(
            last.name,
            "layer_norm",
            ins,
            out,
            last.group,
            self.flops(cluster),
            own * self.t(out).numel,
            **attrs,
        )
        self.replace(cluster, last, [new])

    def rms_norm(self, sq: Op) -> None:
        """``x * x`` (or ``pow(x, 2)``) -> mean over the last axis -> ``+ eps`` ->
        ``sqrt`` -> ``x / r`` or ``x * reciprocal(r)`` -> optionally ``* gamma [H]``
        (LLaMA's and T5's RMSNorm as the exporters write it): one ``layer_norm`` with
        ``rms``."""
        if not sq.inputs or not self.squares(sq, sq.inputs[0]):
            return
        x = sq.inputs[0]
        found = self.mean_plus_eps(sq)
        if found is None:
            return
        ops, add, eps = found
        sqrt = self.only_reader(add.outputs[0])
        if sqrt is None or sqrt.kind != "sqrt":
            return
        nxt = self.only_reader(sqrt.outputs[0])
        cluster = [sq, *ops, sqrt]
        one_over = (  # 1 / r, as the legacy exporter writes torch.rsqrt
            nxt is not None
            and nxt.kind == "div"
            and nxt.inputs[1] == sqrt.outputs[0]
            and self.scalar(nxt.inputs[0])
            and self.scalar_value(nxt.inputs[0]) == 1.0
        )
        if nxt is not None and (nxt.kind == "reciprocal" or one_over):
            cluster.append(nxt)
            norm = self.only_reader(nxt.outputs[0])
            if norm is None or norm.kind != "mul" or self.other(norm, nxt.outputs[0]) != x:
                return
        elif nxt is not None and nxt.kind == "div" and nxt.inputs == (x, sqrt.outputs[0]):
            norm = nxt
        else:
            return
        cluster.append(norm)
        self.norm_with_affine(cluster, norm, x, eps, rms=True)

    # -- attention -------------------------------------------------------------------
    def attention(self, soft: Op) -> None:
        self.viewed: set[str] = set()
        if soft.kind != "softmax" or soft.attrs.get("log"):
            return
        rank = len(self.t(soft.inputs[0]).shape)
        if soft.attrs.get("axis", -1) % rank != rank - 1:
            return
        probs, after = soft.outputs[0], []  # ops between softmax and the context bmm
        readers = [o for o in self.cons.get(probs, []) if self.alive(o)]
        if len(readers) == 2 and probs not in self.outputs:
            # SDPA's NaN guard: where(isnan(p), 0, p), mapped as isnan + a select
            nan = next((o for o in readers if o.kind == "isnan"), None)
            sel = next((o for o in readers if o is not nan), None)
            if (
                nan is None
                or sel is None
                or sel.kind != "where"
                or {i for i in sel.inputs if not self.weight(i)} != {probs, nan.outputs[0]}
                or self.only_reader(nan.outputs[0]) is not sel
            ):
                return
            after, probs = [nan, sel], sel.outputs[0]
        ctx = self.only_reader(probs)
        if (
            ctx is not None
            and ctx.kind in ("cast", "identity")
            and self.t(ctx.outputs[0]).dtype == self.t(probs).dtype
        ):
            after.append(ctx)  # a same-type Cast the exporter left: free
            probs = ctx.outputs[0]
            ctx = self.only_reader(probs)
        # views that regroup the leading (batch, head) axes between softmax and the
        # context bmm, and between the scores bmm and the ops before the softmax
        # (tf2onnx's einsum): dropped, the softmax computed on the bmm's own shape
        views: list[Op] = []
        while ctx is not None and ctx.kind == "reshape" and not after and len(views) < 4:
            views.append(ctx)
            probs = ctx.outputs[0]
            ctx = self.only_reader(probs)
        if (
            ctx is None
            or ctx.kind != "bmm"
            or ctx.inputs[0] != probs
            or ctx.attrs.get("transpose_b")
        ):
            return
        chain: list[Op] = []  # the ops between the scores bmm and softmax
        free: list[Op] = []  # same-type casts among them (as transformers 4 writes)
        cur = soft.inputs[0]
        scores = None
        viewed = False  # past a view: only views until the scores bmm
        for _ in range(10):
            p = self.prod.get(cur)
            if p is None or not self.alive(p) or self.only_reader(cur) is None:
                return
            if p.kind == "bmm":
                scores = p
                break
            if (
                p.kind in ("cast", "identity")
                and not viewed
                and self.t(p.inputs[0]).dtype == self.t(cur).dtype
            ):
                free.append(p)
                cur = p.inputs[0]
                continue
            if p.kind == "reshape" and not after:
                views.append(p)
                viewed = True
                cur = p.inputs[0]
                continue
            if viewed or p.kind not in ("add", "sub", "mul", "div", "max", "min"):
                return
            # the chain input: the operand with the scores' shape that a bmm leads to
            nxt = [
                i for i in p.inputs if self.t(i).shape == self.t(cur).shape and not self.weight(i)
            ]
            if len(nxt) != 1 and p.inputs[0] != p.inputs[1]:
                nxt = [i for i in nxt if self._reaches_bmm(i)]
            if len(nxt) != 1:
                return
            chain.append(p)
            cur = nxt[0]
        if scores is None or scores.attrs.get("transpose_b"):
            return
        if views and self.t(scores.outputs[0]).shape != self.t(probs).shape:
            return  # the softmax would not read and write one shape
        self.viewed = {v.outputs[0] for v in [*views, *free]}
        q, kt = scores.inputs
        scale, mask_ops, causal, masked = 1.0, [], False, False
        scale_ops = []
        # SDPA scales q and k^T by sqrt(scale) each before the product: fold those in
        for side in (0, 1):
            x = scores.inputs[side]
            p = self.prod.get(x)
            c = (
                next((i for i in p.inputs if self.scalar(i)), None)
                if p is not None and p.kind in ("mul", "div") and self.only_reader(x) is scores
                else None
            )
            if c is None or p is None:
                continue
            v = self.scalar_value(c)
            if v is not None:
                scale = scale * v if p.kind == "mul" else scale / v
            scale_ops.append(p)
            if side == 0:
                q = self.other(p, c)
            else:
                kt = self.other(p, c)
        untr = self.untranspose(
            kt,
            scale_ops[-1] if scale_ops and scale_ops[-1].outputs[0] == scores.inputs[1] else scores,
        )
        if untr is None:
            return
        k_name, k_old, k_new = untr
        for p in chain:
            through = [i for i in p.inputs if i in self._chain_tensors(chain, scores)]
            other = [i for i in p.inputs if i not in through]
            if p.kind in ("mul", "div") and other and self.scalar(other[0]):
                v = self.scalar_value(other[0])
                if v is not None:
                    scale = scale * v if p.kind == "mul" else scale / v
                scale_ops.append(p)
            else:
                mask_ops.append(p)
        biases = []
        inside = self._chain_tensors(chain, scores)
        selects = self._selects(mask_ops, inside)
        for p in [o for o in mask_ops if o not in selects or selects[o] is not None]:
            kind = self._mask_kind(p, chain, scores, selects.get(p))
            if kind == "causal":
                causal = True
            elif kind != "none":
                masked = True
                other = [i for i in p.inputs if i not in inside]
                if p.kind != "add" or len(other) != 1:
                    return  # a mask written otherwise (a run-time select): the ops stay
                biases.append(other[0])
        if len(biases) > 1 or biases and views:
            return  # several additive terms, or one over regrouped axes: the ops stay
        if biases and any(  # (the chain runs from the softmax back to the scores)
            chain.index(s) < chain.index(m) for s in scale_ops if s in chain for m in mask_ops
        ):
            return  # a scale after the mask would scale the bias too: the ops stay
        if not all(
            self.alive(o)
            for o in [*k_old, scores, soft, ctx, *chain, *after, *scale_ops, *views, *free]
        ):
            return
        attrs = dict(scores.attrs)
        attrs.update(transpose_b=True, scale=scale)
        own_scores = self.g.flops(scores)
        s_flops = own_scores + self.flops(scale_ops)
        bmm = self.fused(
            scores.name,
            "bmm",
            [q, k_name],
            scores.outputs[0],
            scores.group,
            s_flops,
            own_scores,
            **attrs,
        )
        sattrs = {k: v for k, v in soft.attrs.items() if k != "flops"}
        if causal:
            sattrs["causal"] = True
        if masked:
            sattrs["masked"] = True
        own_soft = self.g.flops(soft)
        sm = self.fused(
            soft.name,
            "softmax",
            [scores.outputs[0], *biases],
            probs if views else soft.outputs[0],
            soft.group,
            own_soft + self.flops(mask_ops) + self.flops(after),
            own_soft,
            **sattrs,
        )
        self.replace(k_old, k_old[-1], k_new)
        self.replace([scores] + [o for o in scale_ops if o not in chain], scores, [bmm])
        self.replace(chain + [soft] + views + free, soft, [sm])
        if after:
            self.replace(after, after[-1], [])
            self.replace(
                [ctx],
                ctx,
                [
                    Op(
                        ctx.name,
                        ctx.kind,
                        (soft.outputs[0], *ctx.inputs[1:]),
                        ctx.outputs,
                        ctx.group,
                        ctx.attrs,
                    )
                ],
            )

    def untranspose(self, kt: str, reader: Op) -> tuple[str, list[Op], list[Op]] | None:
        """``kt`` is k with its last two axes swapped: (k's tensor, the ops that made
        ``kt`` from it, the ops that replace them), or None.

        The ops from k to ``kt`` are optionally a ``reshape`` that merges k's leading
        axes, a run of ``transpose`` ops, composed into one permutation that moves the
        last two axes of what it reads (nothing else, once those two are swapped back,
        or any other permutation, which stays as one ``transpose``), and optionally a
        ``reshape`` that regroups the leading axes only: one transpose (eager
        attention), the dynamo exporter's 3-D ``reshape -> transpose -> reshape``, and
        its optimised form where the heads' ``transpose(1, 0, 2)`` runs straight into
        the ``transpose(0, 2, 1)`` of k (``nn.MultiheadAttention``). The replacement is
        the remaining permutation (if any), then a ``reshape`` to ``kt``'s leading axes
        when they differ (Hugging Face's repeat_kv: ``[B, n_kv, n_rep, T, d]`` read as
        ``[B, H, d, T]``)."""
        from ..graph import Tensor

        p = self.prod.get(kt)
        if p is None or self.only_reader(kt) is not reader:
            return None
        old: list[Op] = []
        tail = None  # the reshape after the transposes
        if p.kind == "reshape":
            tail, cur = p, p.inputs[0]
            old.append(p)
            p = self.prod.get(cur)
            if p is None or self.only_reader(cur) is not tail:
                return None
        perm: list[int] | None = None  # the transposes' composition, on their input
        while p is not None and p.kind == "transpose" and self.alive(p):
            step = list(p.attrs["perm"])
            perm = step if perm is None else [step[i] for i in perm]
            old.insert(0, p)
            cur = p.inputs[0]
            p = self.prod.get(cur)
            if p is None or self.only_reader(cur) is not old[0]:
                break
        if perm is None:
            return None
        src = old[0].inputs[0]  # what the first transpose reads
        back = list(perm)  # the permutation with the last two axes swapped back
        back[-2], back[-1] = back[-1], back[-2]
        ss = self.t(src).shape
        u = tuple(ss[i] for i in back)  # k, the transposes' output with its last two swapped
        kts = self.t(kt).shape
        if (
            len(kts) < 2
            or kts[-2:] != (u[-1], u[-2])  # a tail reshape keeps the last two axes
            or math.prod(kts[:-2]) != math.prod(u[:-2])
        ):
            return None
        identity = back == sorted(back)
        r1 = self.prod.get(src)
        if (
            identity
            and tail is not None
            and r1 is not None
            and r1.kind == "reshape"
            and self.only_reader(src) is old[0]
            and self.t(r1.inputs[0]).shape[-2:] == ss[-2:]  # merges leading axes only
        ):
            old.insert(0, r1)
            src = r1.inputs[0]
        k, new = src, []
        if not identity:
            name = f"{kt}.untransposed" if u[:-2] == kts[:-2] else f"{kt}.untransposed.t"
            self.new_tensors[name] = Tensor(name, u, self.t(kt).dtype)
            t0 = old[-2] if tail is not None else old[-1]
            new.append(Op(t0.name, "transpose", (src,), (name,), t0.group, {"perm": tuple(back)}))
            k = name
        ks = self.t(k).shape
        if ks[:-2] != kts[:-2]:  # k's leading axes regrouped as kt's: a view stays
            name = f"{kt}.untransposed"
            shape = kts[:-2] + ks[-2:]
            self.new_tensors[name] = Tensor(name, shape, self.t(kt).dtype)
            at = tail or old[-1]
            new.append(Op(at.name, "reshape", (k,), (name,), at.group, {"shape": shape}))
            k = name
        return k, old, new

    def _reaches_bmm(self, tensor: str) -> bool:
        for _ in range(6):
            p = self.prod.get(tensor)
            if p is None:
                return False
            if p.kind == "bmm":
                return True
            acts = [i for i in p.inputs if not self.weight(i)]
            if not acts:
                return False
            tensor = acts[0]
        return False

    def _chain_tensors(self, chain: list[Op], scores: Op) -> set[str]:
        """The tensors from the scores bmm to the softmax (views and free casts
        included)."""
        return {scores.outputs[0]} | {p.outputs[0] for p in chain} | self.viewed

    def _selects(self, mask_ops: list[Op], inside: set[str]) -> dict[Op, Any]:
        """``where(m, s, c)`` as tf2onnx writes TensorFlow's SelectV2 on the scores:
        ``s * m + c`` with constants ``m`` of 0s and 1s and ``c`` zero where ``m`` is 1
        and at most -1e4 where it is 0: the same softmax as the additive mask ``c``.
        Each such ``add`` -> the positions it keeps (``m == 1``); its ``mul`` is in
        the result too (-> None), absorbed with it."""
        import numpy as np

        found: dict[Op, Any] = {}
        for mul in mask_ops:
            other = [i for i in mul.inputs if i not in inside]
            add = self.only_reader(mul.outputs[0])
            if mul.kind != "mul" or len(other) != 1 or add not in mask_ops or add.kind != "add":
                continue
            c = [i for i in add.inputs if i != mul.outputs[0]]
            m = self.value(other[0]) if self.weight(other[0]) else None
            cv = self.value(c[0]) if len(c) == 1 and self.weight(c[0]) else None
            if m is None or cv is None:
                continue
            m, cv = np.asarray(m, np.float64), np.asarray(cv, np.float64)
            try:
                m, cv = np.broadcast_arrays(m, cv)
            except ValueError:
                continue
            keep = m == 1
            if np.all((m == 0) | keep) and np.all(np.where(keep, cv == 0, cv <= -1e4)):
                found[add], found[mul] = keep, None
        return found

    def _mask_kind(self, p: Op, chain: list[Op], scores: Op, allowed: Any = None) -> str:
        """``none`` (all-zero constant), ``causal`` or ``other``; ``allowed``: the
        positions a select keeps (:meth:`_selects`), when ``p`` is its add."""
        import numpy as np

        inside = self._chain_tensors(chain, scores)
        other = [i for i in p.inputs if i not in inside]
        if len(other) != 1 or not self.weight(other[0]):
            return "other"
        if allowed is None:
            allowed = self.imp.mask_allowed.get(other[0])
        if allowed is None:
            v = self.value(other[0])
            if v is None or p.kind != "add":
                return "other"
            v = np.asarray(v, dtype=np.float64)
            if not np.all((v == 0) | (v <= -1e4)):
                return "other"
            allowed = v == 0
        allowed = np.asarray(allowed, dtype=bool)
        if allowed.all():
            return "none"
        if allowed.ndim < 2:
            return "other"
        stack = allowed.reshape(-1, *allowed.shape[-2:])
        if not (stack == stack[:1]).all():
            return "other"  # differs between batch rows or heads
        a2 = stack[0]
        sq, skv = self.t(scores.outputs[0]).shape[-2:]
        if a2.shape[0] not in (1, sq) or a2.shape[1] != skv or a2.shape[0] != sq:
            return "other"
        tril = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        return "causal" if np.array_equal(a2, tril) else "other"

    # -- the pass --------------------------------------------------------------------
    def run(self) -> Graph:
        self.pending: dict[int, list[Op]] = {}
        for o in list(self.g.ops):
            if self.alive(o):
                self._step(self.linear_bias, o)
        self._commit()
        for step in (self.gelu, self.silu, self.layer_norm, self.rms_norm, self.attention):
            self.pending = {}
            for o in list(self.g.ops):
                if self.alive(o):
                    self._step(step, o)
            self._commit()
        self.g.validate()
        return self.g

    def _step(self, step: Any, o: Op) -> None:
        """One pattern at ``o``; in a quantised model, undone as a whole when one of its
        replacements was refused (:meth:`replace`)."""
        if not self.imp.qparams:
            step(o)
            return
        saved = (
            list(self.ops),
            {k: list(v) for k, v in self.pending.items()},
            dict(self.new_tensors),
        )
        self.refused = False
        step(o)
        if self.refused:
            self.ops, self.pending, self.new_tensors = saved

    def _commit(self) -> None:
        if not self.pending:
            self.pending = {}
            return
        ops: list[Op] = []
        for i, o in enumerate(self.ops):
            ops.extend(self.pending.get(i, []))
            if o is not None:
                ops.append(o)
        tensors = dict(self.g.tensors)
        tensors.update(self.new_tensors)
        used = {n for o in ops for n in o.inputs + o.outputs}
        keep = [t for t in tensors.values() if t.name in used or t.kind == "input"]
        self.g = Graph(
            self.g.name, keep, ops, sequences=self.g.sequences, params=self.g.params, validate=False
        )
        self.__init__(self.g, self.imp)  # type: ignore[misc]
        self.pending = {}


def recognise(graph: Graph, imp: Any) -> Graph:
    """``graph`` with the module docstring's patterns fused (a new Graph)."""
    return _Rewriter(graph, imp).run()
