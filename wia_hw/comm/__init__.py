"""Collectives on a cluster of emulated devices (WIA-AI-011 section 8.5; issue #11).

``wia_hw.open_cluster("wia-cluster-8")`` returns a :class:`Communicator` whose
collectives (``all_reduce`` with ring, tree or hierarchical algorithms, by default the
one that ends first for the call's size, ``all_gather``,
``reduce_scatter``, ``broadcast``, ``all_to_all``, ``send``/``recv``) run as schedules
of chunked point-to-point transfers on the cluster's SimPy link model. See
``docs/COMMUNICATION.md``.
"""

from __future__ import annotations

from ._communicator import (
    ALGORITHMS,
    AUTO,
    BUS_FACTORS,
    MAX_CHUNK_TRANSFERS,
    CollectiveRecord,
    CommError,
    Communicator,
    ComputeRecord,
    Work,
    open_cluster,
)
from ._schedule import Schedule, Transfer

__all__ = [
    "ALGORITHMS",
    "AUTO",
    "BUS_FACTORS",
    "MAX_CHUNK_TRANSFERS",
    "CollectiveRecord",
    "CommError",
    "Communicator",
    "ComputeRecord",
    "Schedule",
    "Transfer",
    "Work",
    "open_cluster",
]
