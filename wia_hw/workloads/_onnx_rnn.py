"""ONNX's recurrent ops (LSTM, GRU, RNN) unrolled over the sequence for the importer.

Each direction is one GEMM of the whole input by the input weights (``X W^T`` plus both
biases, as cuDNN and every inference runtime batch it), then per time step the GEMM of
the previous hidden state by the recurrence weights (``H R^T``) and the gates' vector
ops, as ONNX defines them (default activations; gate order i, o, f, c for LSTM and
z, r, h for GRU):

* LSTM: ``i, f, o = sigmoid(.)``, ``c~ = tanh(.)``, ``C = f * C + i * c~``,
  ``H = o * tanh(C)``;
* GRU: ``z, r = sigmoid(.)``, ``h~ = tanh(x_h + r * (H R_h^T + Rb_h))`` with
  ``linear_before_reset`` (what torch exports), else ``tanh(x_h + (r * H) R_h^T +
  Rb_h)``; ``H = h~ + z * (H - h~)``;
* RNN: ``H = tanh(x + H R^T)``.

LSTM peepholes add ``P * C`` to the i and f gates (the previous cell) and the o gate
(the new one). A zero initial state (no ``initial_h``/``initial_c``) skips the first
step's recurrence GEMM. The outputs are ``concat`` copies of the steps' hidden
states: ``Y`` ``[seq, dirs, batch, H]``, ``Y_h``/``Y_c`` ``[dirs, batch, H]``
(``layout`` 1, batch first: a ``transpose`` of the input and of each output).
Directions forward, reverse and bidirectional.

Refused, naming the node: other activations, ``clip``, LSTM's ``input_forget``, and
``sequence_lens`` that are not all the sequence length.
"""

from __future__ import annotations

from typing import Any

from ..emulator.errors import WorkloadError

__all__ = ["RNN_OPS", "map_rnn"]

RNN_OPS = ("LSTM", "GRU", "RNN")
#: gates per op type, in ONNX's weight order
_GATES = {"LSTM": "iofc", "GRU": "zrh", "RNN": "i"}
_DEFAULT_ACTS = {
    "LSTM": ["Sigmoid", "Tanh", "Tanh"],
    "GRU": ["Sigmoid", "Tanh"],
    "RNN": ["Tanh"],
}


def map_rnn(imp: Any, node: Any, name: str, a: dict[str, Any], grp: str, dt: str | None) -> None:
    """Add the unrolled ops of LSTM/GRU/RNN ``node`` (module docstring)."""
    _Unroll(imp, node, name, a, grp, dt).run()


class _Unroll:
    def __init__(
        self, imp: Any, node: Any, name: str, a: dict[str, Any], grp: str, dt: str | None
    ) -> None:
        import numpy as np

        self.imp, self.node, self.name, self.grp, self.dt = imp, node, name, grp, dt
        t = self.t = node.op_type
        ins = list(node.input) + [""] * 8
        self.x_in, self.w_in, self.r_in, self.b_in, lens_in, self.h0_in = ins[:6]
        self.c0_in = ins[6] if t == "LSTM" else ""
        acts = [s.decode() if isinstance(s, bytes) else s for s in a.get("activations", [])]
        direction = a.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        self.order = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(
            direction
        )
        if self.order is None:
            raise self.fail(f"direction {direction!r} is not forward, reverse or bidirectional")
        if acts and acts != _DEFAULT_ACTS[t] * len(self.order):
            raise self.fail(f"activations {acts} are not modelled (only the defaults)")
        if a.get("clip") is not None:
            raise self.fail("clip is not modelled")
        if a.get("input_forget", 0):
            raise self.fail("input_forget is not modelled")
        self.layout = a.get("layout", 0)
        self.p_in = ins[7] if t == "LSTM" else ""
        consts = (self.w_in, self.r_in) + tuple(v for v in (self.b_in, self.p_in) if v)
        for i in consts:
            if i not in imp.consts:
                raise self.fail(f"weight {i!r} must be a constant")
        shape = imp.shape(self.x_in)
        self.seq, self.batch, self.inp = (shape[1], shape[0], shape[2]) if self.layout else shape
        self.hidden = imp.shape(self.r_in)[-1]
        if lens_in:
            lens = imp.const_values(lens_in)
            if lens is None or np.any(np.asarray(lens) != self.seq):
                raise self.fail("sequence_lens must be constants equal to the sequence length")
        self.before_reset = bool(a.get("linear_before_reset", 0))

    def fail(self, why: str) -> WorkloadError:
        return WorkloadError(f"ONNX node {self.name!r} ({self.t}): {why}")

    def add(self, kind: str, tag: str, args: list[str], **attrs: Any) -> str:
        n = f"{self.name}.{tag}"
        return self.imp.add(kind, n, args, n, self.grp, self.dt, **attrs)

    def view(self, src: str, shape: tuple[int, ...], tag: str) -> str:
        n = f"{self.name}.{tag}"
        return self.imp.view(src, shape, n, n, self.grp)

    def weight(self, value: str, tag: str, shape: tuple[int, ...], make: Any) -> str:
        return self.imp.const_weight(value, shape, tag, self.name, make=make)

    def run(self) -> None:
        x = self.imp.value(self.x_in, self.name)
        if self.layout:  # batch first: [batch, seq, in] -> [seq, batch, in]
            x = self.add("transpose", "x_t", [x], perm=(1, 0, 2))
        x2 = self.view(x, (self.seq * self.batch, self.inp), "x2d")
        ys, hs, cs = [], [], []
        for d, backward in enumerate(self.order):
            steps, h, c = self.direction(d, backward, x2)
            ys.append(steps)
            hs.append(h)
            cs.append(c)
        _outputs(self, ys, hs, cs)

    def weights(self, d: int) -> tuple[str, tuple[str, ...], str | None, str | None]:
        """Direction ``d``'s ``W^T``, recurrence weights, input-side bias (both biases
        but GRU's ``Rb_h``) and GRU's ``Rb_h``."""
        import numpy as np

        hid, ng = self.hidden, len(_GATES[self.t])
        n2 = ng * hid
        w = self.weight(self.w_in, f"WT{d}", (self.inp, n2), lambda v: v[d].T)
        rec: tuple[str, ...] = (self.weight(self.r_in, f"RT{d}", (hid, n2), lambda v: v[d].T),)
        if self.t == "GRU" and not self.before_reset:  # r * H goes through R_h alone
            rec = (
                self.weight(self.r_in, f"RZR{d}", (hid, 2 * hid), lambda v: v[d, : 2 * hid].T),
                self.weight(self.r_in, f"RH{d}", (hid, hid), lambda v: v[d, 2 * hid :].T),
            )
        if not self.b_in:
            return w, rec, None, None
        if self.t != "GRU":
            return (
                w,
                rec,
                self.weight(self.b_in, f"BX{d}", (n2,), lambda v: v[d, :n2] + v[d, n2:]),
                None,
            )
        keep = np.ones(n2, np.float32)
        keep[2 * hid :] = 0  # Rb_h stays with the recurrence (it is inside r * (.))
        bx = self.weight(self.b_in, f"BX{d}", (n2,), lambda v: v[d, :n2] + v[d, n2:] * keep)
        bh = self.weight(self.b_in, f"BH{d}", (hid,), lambda v: v[d, n2 + 2 * hid :])
        return w, rec, bx, bh

    def state(self, value: str, d: int, tag: str) -> str | None:
        """Direction ``d``'s initial state ``[batch, H]`` (None: zero)."""
        if not value:
            return None
        s = self.imp.value(value, self.name)
        ax = 1 if self.layout else 0  # [dirs, batch, H], or [batch, dirs, H]
        if self.imp.shape(value)[ax] != 1:
            s = self.add("slice", f"{tag}.s", [s], axis=ax, start=d, stop=d + 1)
        return self.view(s, (self.batch, self.hidden), tag)

    def peepholes(self, d: int) -> tuple[str, ...] | None:
        """Direction ``d``'s LSTM peephole weights ``(P_i, P_o, P_f)``, each ``[H]``."""
        if not self.p_in:
            return None
        hid = self.hidden
        return tuple(
            self.weight(self.p_in, f"P{g}{d}", (hid,), lambda v, j=j: v[d, j * hid : (j + 1) * hid])
            for j, g in enumerate("iof")
        )

    def direction(self, d: int, backward: bool, x2: str) -> tuple[list[str], str, str | None]:
        w, rec, bias_x, bias_h = self.weights(d)
        p = f"d{d}"
        xw = self.add("linear", f"{p}.xw", [x2, w] + ([bias_x] if bias_x else []))
        h = self.state(self.h0_in, d, f"{p}.h0")
        c = self.state(self.c0_in, d, f"{p}.c0")
        peep = self.peepholes(d)
        outs: dict[int, str] = {}
        b = self.batch
        for k in reversed(range(self.seq)) if backward else range(self.seq):
            step = _Step(self, f"{p}.t{k}")
            row = step.add("slice", "x", [xw], axis=0, start=k * b, stop=(k + 1) * b)
            if self.t == "GRU":
                h = _gru_step(step, row, h, rec, bias_h, self.before_reset)
            else:
                pre = (
                    row
                    if h is None
                    else step.add("add", "pre", [row, step.add("linear", "hr", [h, rec[0]])])
                )
                if self.t == "RNN":
                    h = step.add("tanh", "h", [pre])
                else:
                    h, c = _lstm_step(step, pre, c, peep)
            outs[k] = h
        assert h is not None
        return [outs[k] for k in range(self.seq)], h, c


class _Step:
    """The ops of one time step, named ``<node>.<prefix>.<tag>``."""

    def __init__(self, u: _Unroll, prefix: str) -> None:
        self.u, self.prefix = u, prefix

    def add(self, kind: str, tag: str, args: list[str], **attrs: Any) -> str:
        return self.u.add(kind, f"{self.prefix}.{tag}", args, **attrs)

    def gate(self, src: str, j: int, tag: str) -> str:
        """Gate ``j``'s columns ``[batch, H]`` of ``src`` ``[batch, gates * H]``."""
        hid = self.u.hidden
        return self.add("slice", tag, [src], axis=1, start=j * hid, stop=(j + 1) * hid)


def _lstm_step(
    step: _Step, pre: str, c: str | None, peep: tuple[str, ...] | None
) -> tuple[str, str]:
    """One LSTM step from the pre-activations (gate order i, o, f, c) and the previous
    cell state (None: zero); with peepholes ``(P_i, P_o, P_f)``, ``P_i * C`` and
    ``P_f * C`` join the i and f gates and ``P_o * C_new`` the o gate. (H, C)."""

    def peeped(tag: str, j: int, p: int, cell: str | None) -> str:
        g = step.gate(pre, j, f"p{tag}")
        if peep is None or cell is None:
            return g
        return step.add("add", f"q{tag}", [g, step.add("mul", f"m{tag}", [peep[p], cell])])

    i_ = step.add("sigmoid", "i", [peeped("i", 0, 0, c)])
    # a zero previous cell state needs no forget gate: f * 0 adds nothing
    f_ = None if c is None else step.add("sigmoid", "f", [peeped("f", 2, 2, c)])
    cc = step.add("tanh", "cc", [step.gate(pre, 3, "pc")])
    ic = step.add("mul", "ic", [i_, cc])
    c = (
        ic
        if c is None or f_ is None
        else step.add("add", "c", [step.add("mul", "fc", [f_, c]), ic])
    )
    o_ = step.add("sigmoid", "o", [peeped("o", 1, 1, c)])
    return step.add("mul", "h", [o_, step.add("tanh", "tc", [c])]), c


def _gru_step(
    step: _Step,
    row: str,
    h: str | None,
    rec: tuple[str, ...],
    bias_h: str | None,
    before_reset: bool,
) -> str:
    """One GRU step from the input projection ``row`` ``[batch, 3H]`` and the state
    ``h`` (None: zero); ``rec`` is ``(R^T,)`` with ``linear_before_reset``, else
    ``(R_zr^T, R_h^T)``. Returns the new state."""
    op, gate = step.add, step.gate
    xz, xr, xh = gate(row, 0, "xz"), gate(row, 1, "xr"), gate(row, 2, "xh")
    if h is None:  # zero state: no recurrence GEMM
        z = op("sigmoid", "z", [xz])
        r = op("sigmoid", "r", [xr])
        inner = op("mul", "rb", [r, bias_h]) if bias_h and before_reset else None
        pre = xh if inner is None and not bias_h else op("add", "ph", [xh, inner or bias_h])
        hh = op("tanh", "hh", [pre])
        return op("sub", "h", [hh, op("mul", "zh", [z, hh])])
    if before_reset:
        hr = op("linear", "hr", [h, rec[0]])
        z = op("sigmoid", "z", [op("add", "pz", [xz, gate(hr, 0, "hz")])])
        r = op("sigmoid", "r", [op("add", "pr", [xr, gate(hr, 1, "hrr")])])
        hrh = gate(hr, 2, "hh_")
        if bias_h:
            hrh = op("add", "hb", [hrh, bias_h])
        pre = op("add", "ph", [xh, op("mul", "rh", [r, hrh])])
    else:
        hzr = op("linear", "hzr", [h, rec[0]])
        z = op("sigmoid", "z", [op("add", "pz", [xz, gate(hzr, 0, "hz")])])
        r = op("sigmoid", "r", [op("add", "pr", [xr, gate(hzr, 1, "hrr")])])
        rh = op("linear", "rh", [op("mul", "rxh", [r, h]), rec[1]])
        if bias_h:
            rh = op("add", "hb", [rh, bias_h])
        pre = op("add", "ph", [xh, rh])
    hh = op("tanh", "hh", [pre])
    return op("add", "h", [hh, op("mul", "zd", [z, op("sub", "d", [h, hh])])])


def _outputs(u: _Unroll, ys: list[list[str]], hs: list[str], cs: list[str | None]) -> None:
    """Y ``[seq, dirs, batch, H]``, Y_h and Y_c ``[dirs, batch, H]`` from the steps'
    states: views and ``concat`` copies (a direction's last state is its Y_h)."""
    imp, node, name, grp, dt = u.imp, u.node, u.name, u.grp, u.dt
    b, hid = u.batch, u.hidden
    outs = list(node.output) + ["", ""]
    if outs[0]:
        parts = []
        for d, steps in enumerate(ys):
            views = [u.view(s, (1, 1, b, hid), f"y{d}.{k}") for k, s in enumerate(steps)]
            parts.append(views[0] if len(views) == 1 else u.add("concat", f"y{d}", views, axis=0))
        y = outs[0] if not u.layout else f"{name}.Y.seq_first"
        if len(parts) == 1:
            imp.add("identity", f"{name}.Y", parts, y, grp, dt)
        else:
            imp.add("concat", f"{name}.Y", parts, y, grp, dt, axis=1)
        if u.layout:  # [seq, dirs, batch, H] -> [batch, seq, dirs, H]
            imp.add("transpose", f"{name}.Y_t", [y], outs[0], grp, dt, perm=(2, 0, 1, 3))
    for value, states, tag in ((outs[1], hs, "Y_h"), (outs[2], cs, "Y_c")):
        if not value:
            continue
        views = [u.view(s, (1, b, hid), f"{tag}{d}") for d, s in enumerate(states) if s]
        y = value if not u.layout else f"{name}.{tag}.seq_first"
        if len(views) == 1:
            imp.add("identity", f"{name}.{tag}", views, y, grp, dt)
        else:
            imp.add("concat", f"{name}.{tag}", views, y, grp, dt, axis=0)
        if u.layout:  # [dirs, batch, H] -> [batch, dirs, H]
            imp.add("transpose", f"{name}.{tag}_t", [y], value, grp, dt, perm=(1, 0, 2))
