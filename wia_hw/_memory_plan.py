"""How a run uses device memory: its weights, inputs, activations and workspaces live in
blocks of the context's caching allocator (:mod:`wia_hw.emulator.allocator`).

The runtime plans a run's memory before it executes (as an inference compiler does), so
these allocations cost the device no time: the allocator's segment reservations are
made ahead and counted only in the allocator's statistics. What a run holds, and when:

* **weights** and **inputs**: from the run's start to its end;
* **activations**: from the start of the op that writes them to the end of the last op
  that reads them (or of the run, for graph outputs); a view (``reshape``, a contiguous
  ``slice``) shares its base tensor's block and extends its lifetime;
* **workspaces**: for the duration of their op. A kernel's workspace is its command
  buffer, ``WORKSPACE_BYTES_PER_TILE`` bytes of DMA descriptors and tile program per
  tile, unless the kernel declares ``workspace_bytes`` itself (an extension may).

A user's own buffers come from ``ctx.allocate(nbytes)`` and go back with
``ctx.free(buffer)``; those calls are synchronous with the device (a segment
reservation or release stalls it, like ``cudaMalloc``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .emulator.allocator import Block, CachingAllocator, DeviceOutOfMemory
from .emulator.kernels import GemmKernel, Kernel, VectorKernel
from .graph import Graph, Op

__all__ = [
    "AllocInfo",
    "DeviceBuffer",
    "RunMemory",
    "kernel_workspace_bytes",
    "WORKSPACE_BYTES_PER_TILE",
]

#: Command-buffer bytes per tile: a load and a store descriptor and the tile program.
WORKSPACE_BYTES_PER_TILE = 64


@dataclass
class AllocInfo:
    """What a block holds: ``kind`` is ``weight``, ``input``, ``activation``,
    ``workspace`` or ``user``; ``name`` the tensor, kernel or user tag; ``workload`` the
    run's graph name (empty for user buffers); ``handle`` a weak reference to a user's
    :class:`DeviceBuffer` (dead when the user dropped the buffer without freeing it)."""

    kind: str
    name: str
    workload: str = ""
    handle: Any = None


class DeviceBuffer:
    """A user's device buffer from ``ctx.allocate``: ``nbytes`` asked for, ``size`` the
    block it got (rounded), at device ``address``. Free it with ``ctx.free``."""

    __slots__ = ("address", "nbytes", "size", "tag", "id", "_block", "__weakref__")

    def __init__(self, block: Block, nbytes: int, tag: str) -> None:
        self.address = block.address
        self.nbytes = nbytes
        self.size = block.size
        self.tag = tag
        self.id = block.id
        self._block = block

    def __repr__(self) -> str:
        return (
            f"DeviceBuffer(id={self.id}, address={self.address:#x}, nbytes={self.nbytes}, "
            f"tag={self.tag!r})"
        )


def kernel_workspace_bytes(k: Kernel) -> int:
    """The workspace a kernel needs during its op (see the module docstring)."""
    declared = getattr(k, "workspace_bytes", None)
    if declared is not None:
        return int(declared)
    if isinstance(k, GemmKernel):
        t = k.tiling
        tiles = -(-k.batch // t.tb) * -(-k.m // t.tm) * -(-k.n // t.tn) * -(-k.k // t.tk)
    elif isinstance(k, VectorKernel):
        tiles = -(-k.rows // max(1, k.rows_per_tile))
    else:
        tiles = 1
    return tiles * WORKSPACE_BYTES_PER_TILE


class RunMemory:
    """The allocation plan of one run, executed op by op on ``allocator``."""

    def __init__(
        self,
        allocator: CachingAllocator,
        graph: Graph,
        lowered: Sequence[tuple[Op, Sequence[Kernel]]],
    ) -> None:
        self.allocator = allocator
        self.graph = graph
        self.lowered = lowered
        root: dict[str, str] = {}
        last: dict[str, int] = {}
        for idx, (op, kernels) in enumerate(lowered):
            for i in op.inputs:
                r = root.get(i, i)
                last[r] = idx
            if not kernels and op.inputs:  # a view: its output is its input
                for o in op.outputs:
                    root[o] = root.get(op.inputs[0], op.inputs[0])
        self._root = root
        self._last = last
        self._frees: dict[int, list[str]] = {}
        t = graph.tensors
        for r, idx in last.items():
            if t[r].kind == "activation":
                self._frees.setdefault(idx, []).append(r)
        self._blocks: dict[str, Block] = {}
        self._workspaces: list[Block] = []
        self.done = False

    def _malloc(self, nbytes: int, kind: str, name: str, now: int) -> Block:
        try:
            blk, _ = self.allocator.malloc(
                max(1, nbytes), now=now, tag=kind, info=AllocInfo(kind, name, self.graph.name)
            )
        except DeviceOutOfMemory as e:
            raise DeviceOutOfMemory(
                f"{self.graph.name!r}: {kind} {name!r} does not fit: {e}"
            ) from None
        return blk

    def start(self, now: int) -> None:
        """Allocate the weights and inputs the run reads."""
        for name, t in self.graph.tensors.items():
            if t.kind in ("weight", "input") and name in self._last:
                self._blocks[name] = self._malloc(t.nbytes, t.kind, name, now)

    def before_op(self, idx: int, now: int) -> None:
        """Allocate op ``idx``'s outputs (unless views) and its kernels' workspaces."""
        op, kernels = self.lowered[idx]
        if not kernels:
            return
        for o in op.outputs:
            if o not in self._root and o not in self._blocks:
                self._blocks[o] = self._malloc(self.graph.tensors[o].nbytes, "activation", o, now)
        for k in kernels:
            ws = kernel_workspace_bytes(k)
            if ws > 0:
                self._workspaces.append(self._malloc(ws, "workspace", k.name, now))

    def after_op(self, idx: int, now: int) -> None:
        """Free op ``idx``'s workspaces and the activations it read last."""
        for blk in self._workspaces:
            self.allocator.free(blk, now=now)
        self._workspaces.clear()
        for r in self._frees.get(idx, ()):
            blk = self._blocks.pop(r, None)
            if blk is not None:
                self.allocator.free(blk, now=now)

    def finish(self, now: int) -> None:
        """Free everything the run still holds (weights, inputs, graph outputs)."""
        for blk in self._workspaces:
            self.allocator.free(blk, now=now)
        self._workspaces.clear()
        for blk in self._blocks.values():
            self.allocator.free(blk, now=now)
        self._blocks.clear()
        self.done = True

    def holds(self) -> dict[str, Any]:
        """Tensor name -> block, for what the run currently holds."""
        return dict(self._blocks)
