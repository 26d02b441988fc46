"""Training iterations on a cluster of emulated devices (WIA-AI-011 section 8.5; issue #11).

:func:`train_iteration` runs one forward, backward and optimizer step of a workload
graph on every device of a cluster, data-parallel (DDP gradient buckets all-reduced as
their layers' backward finishes) and tensor-parallel (Megatron column/row splits), with
the kernels timed by the single-device emulator and the collectives by the cluster's
link model, after checking that the step's memory per device fits (:mod:`._memory`).
See ``docs/COMMUNICATION.md``, section "Training".
"""

from __future__ import annotations

from ._backward import (
    GRAD_FLOPS,
    OPTIMIZERS,
    Kern,
    TrainingKernels,
    time_kernels,
    training_kernels,
)
from ._memory import TrainingMemory, training_memory
from ._parallel import TPError, shard_graph
from ._schedule import (
    DEFAULT_BUCKET_MB,
    FIRST_BUCKET_MB,
    Bucket,
    TrainingResult,
    TrainingThermalWarning,
    train_iteration,
)

__all__ = [
    "DEFAULT_BUCKET_MB",
    "FIRST_BUCKET_MB",
    "Bucket",
    "TPError",
    "TrainingMemory",
    "TrainingResult",
    "TrainingThermalWarning",
    "shard_graph",
    "train_iteration",
    "GRAD_FLOPS",
    "OPTIMIZERS",
    "Kern",
    "TrainingKernels",
    "time_kernels",
    "training_kernels",
    "training_memory",
]
