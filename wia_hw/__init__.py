"""wia-hw: an open, verifiable AI-accelerator stack (WIA-AI-011, chapter 8).

Describe an NPU in YAML, run a model on its SimPy emulator (cycle-exact with the
Amaranth RTL where both exist), and see where the time goes::

    import wia_hw
    r = wia_hw.run("bert-large", batch=32, seq=128, device="wia-npu")
    r.latency_ms, r.throughput, r.ops, r.counters.cycles

The seed's C names map to these by dropping the ``wia_`` prefix (see API.md).
"""

from __future__ import annotations

from .emulator.config import ClusterSpec, DeviceSpec
from .emulator.counters import Counter, Counters
from .emulator.errors import SpecError, WiaError, WorkloadError
from .graph import Graph, GraphBuilder, Op, Tensor
from .runtime import Context, KernelTime, OpTime, RunResult, open_device, run
from .spec import list_specs, load_spec

__version__ = "0.1.0"

__all__ = [
    "ClusterSpec",
    "Context",
    "Counter",
    "Counters",
    "DeviceSpec",
    "Graph",
    "GraphBuilder",
    "KernelTime",
    "Op",
    "OpTime",
    "RunResult",
    "SpecError",
    "Tensor",
    "WiaError",
    "WorkloadError",
    "__version__",
    "list_specs",
    "load_spec",
    "open_device",
    "run",
]
