"""The communication layer's review findings: profiling windows, honest peaks, ring
orders, one-line errors, bounded schedules, spec paths and training's own time."""

from __future__ import annotations

import numpy as np
import pytest

import wia_hw


def _spec(n: int, topology: str, **links):
    return dict(
        schema_version=1,
        name=f"t{n}{topology}",
        devices=n,
        device="wia-npu",
        links=dict(topology=topology, bandwidth_gbs=100, latency_us=1.0, **links),
    )


# -- profiling: everything inside the session -----------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_profile_is_clipped_to_the_session(seed):
    """Work in flight when a session starts or stops counts only inside it: no link is
    busy more than the whole session, communication never outlasts it, and every record
    lies in it."""
    rng = np.random.default_rng(seed)
    comm = wia_hw.open_cluster(["wia-cluster-8", "wia-cluster-torus16"][seed % 2])
    before = comm.all_reduce(nbytes=int(rng.integers(8, 64)) << 20, async_op=True)
    comm.compute(None, int(rng.integers(1, 200_000)))  # the session starts mid-call
    s = wia_hw.start_comm_profiling(comm)
    work = [
        getattr(comm, op)(nbytes=int(rng.integers(1, 64)) << 20, async_op=True)
        for op in rng.choice(["all_reduce", "all_gather", "all_to_all"], size=3)
    ]
    comm.compute(None, int(rng.integers(1, 400_000)))  # and stops mid-call
    rep = wia_hw.stop_comm_profiling(s)
    assert max(rep.link_utilization.values()) <= 1.0
    assert rep.total_comm_time_s <= rep.duration_s + 1e-15
    for r in rep.records:
        assert rep.start_cycle <= r.start_cycle <= r.end_cycle <= rep.end_cycle
    for _, a, b, _ in rep.link_events:
        assert rep.start_cycle <= a < b <= rep.end_cycle
    before.wait()
    for w in work:
        w.wait()
