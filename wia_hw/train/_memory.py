"""Device memory of one training step, per device (issue #11).

:func:`training_memory` adds up what one rank holds at the step's peak, the end of
the forward pass (where the backward pass starts), from the kernels of
:mod:`._backward` themselves, so the account and the step cannot disagree:

* **weights**: the rank's weight tensors (after the tensor-parallel split);
* **gradients**: one per parameter, in the dtype the optimizer kernels read it in
  (the parameter's);
* **optimizer state**: the per-parameter state the optimizer kernels read and write
  besides the parameter and its gradient (Adam's two moments in fp32; none for SGD);
* **activations**: the forward tensors some backward kernel reads (its
  :attr:`~._backward.Kern.reads`: a linear's input, a softmax's output, ...), all
  alive at the end of the forward pass. A view (a reshape, a contiguous slice) keeps
  the tensor it views alive, so each saved tensor counts its storage once;
* **workspace**: the largest set of operands one kernel needs besides those: a forward
  kernel's output that nothing saves (the logits, a softmax's input) and its inputs
  of that kind; a backward kernel's gradient inputs and output (an output that is a
  parameter's gradient is in ``gradients`` already).

This is the layout of Korthikanti et al. ("Reducing Activation Recomputation in
Large Transformer Models", 2022): a transformer layer saves ``s b h (32 + 2 a s /
h)`` bytes in fp16 here, their ``s b h (34 + 5 a s / h)`` without dropout (its masks
and the attention dropout's output). Activations and workspace grow with the batch;
the rest does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..graph import DTYPE_BYTES, is_view
from ._backward import OPTIMIZERS, Kern, TrainingKernels, operand_dtypes

__all__ = ["TrainingMemory", "training_memory"]

GIB = float(1 << 30)


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes one device holds at a training step's peak (see the module doc) and the
    device's memory ``capacity``."""

    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    workspace: int
    capacity: int

    @property
    def fixed(self) -> int:
        """What does not depend on the batch: weights, gradients, optimizer state."""
        return self.weights + self.gradients + self.optimizer_state

    @property
    def total(self) -> int:
        return self.fixed + self.activations + self.workspace

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def line(self) -> str:
        """``X GiB of Y GiB per device (weights a, grads b, ...)``."""
        return (
            f"{self.total / GIB:.2f} GiB of {self.capacity / GIB:.2f} GiB per device "
            f"(weights {self.weights / GIB:.2f}, grads {self.gradients / GIB:.2f}, "
            f"optimizer {self.optimizer_state / GIB:.2f}, activations "
            f"{self.activations / GIB:.2f}, workspace {self.workspace / GIB:.2f} GiB)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
            "activations": self.activations,
            "workspace": self.workspace,
            "total": self.total,
            "capacity": self.capacity,
        }


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * DTYPE_BYTES[dtype]


def training_memory(tk: TrainingKernels, capacity: int) -> TrainingMemory:
    """The per-device memory of the training step ``tk`` (one rank's kernels) on a
    device of ``capacity`` bytes."""
    g = tk.graph
    tensors = g.tensors
    root: dict[str, str] = {}  # a view's output -> the tensor whose storage it is
    for op in g.ops:
        ins, _ = g.shapes_of(op)
        if op.inputs and is_view(op, ins):
            for o in op.outputs:
                root[o] = root.get(op.inputs[0], op.inputs[0])

    def storage(name: str) -> str:
        return root.get(name, name)

    weights = sum(t.nbytes for t in tensors.values() if t.kind == "weight")
    roles = {r for _, reads, writes, _ in OPTIMIZERS[tk.optimizer_name] for r in (*reads, writes)}
    gradients = state = 0
    for p in tk.params:
        dt = operand_dtypes(p.dtype)
        gradients += p.numel * DTYPE_BYTES[dt["g"]]
        state += sum(p.numel * DTYPE_BYTES[dt[r]] for r in roles - {"p", "g"})
    saved = {
        storage(n)
        for k in tk.backward
        for n in k.reads
        if n is not None and tensors[storage(n)].kind != "weight"
    }
    activations = sum(tensors[n].nbytes for n in saved)

    def transient(names: list[str]) -> int:
        held = {storage(n) for n in names} - saved
        return sum(tensors[n].nbytes for n in held if tensors[n].kind != "weight")

    workspace = 0
    for op in g.ops:  # the forward kernels, one per op
        ins, _ = g.shapes_of(op)
        if not is_view(op, ins):
            workspace = max(workspace, transient([*op.inputs, *op.outputs]))
    for k in tk.backward:
        workspace = max(workspace, _backward_workspace(k, tk))
    return TrainingMemory(weights, gradients, state, activations, workspace, capacity)


def _backward_workspace(k: Kern, tk: TrainingKernels) -> int:
    """A backward kernel's gradient operands: its inputs that are no graph tensor and
    its output, unless that is a parameter's gradient (held in ``gradients``)."""
    out = _nbytes(*k.output)
    numel = math.prod(k.output[0])
    if any(tk.graph.tensors[p].numel == numel for p in k.params):
        out = 0
    reads = k.reads or (None,) * len(k.inputs)
    return out + sum(_nbytes(s, d) for (s, d), n in zip(k.inputs, reads, strict=True) if n is None)
