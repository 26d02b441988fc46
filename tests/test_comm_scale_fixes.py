"""Collectives on clusters of 1001 ranks and more: rings timed exactly without one
event per transfer, ``auto`` never picking a refused algorithm, refusals whose advice
the command can follow."""

from __future__ import annotations

import itertools
import math
import time

import pytest
import yaml
from click.testing import CliRunner

from wia_hw.cli import cli
from wia_hw.comm import CommError, Communicator, open_cluster


def _spec(n: int, topology: str = "ring", bw: float = 100, lat: float = 1.0, **links):
    return dict(
        schema_version=1,
        name=f"t{n}{topology}",
        devices=n,
        device="wia-npu",
        links=dict(topology=topology, bandwidth_gbs=bw, latency_us=lat, **links),
    )


@pytest.fixture
def ring1024(tmp_path):
    p = tmp_path / "ring1024.yaml"
    p.write_text(yaml.safe_dump(_spec(1024)))
    return p


def _state(comm):
    ports = [(p.free_at, p.busy_cycles, p.last_arrival) for p in comm.links.ports.values()]
    return ports, dict(comm.links.link_bytes)


def _key(r):
    return (r.start_cycle, r.end_cycle, r.sent_bytes, r.transfers, r.link_bytes, r.algorithm)


@pytest.mark.parametrize(
    "spec",
    [
        _spec(2),
        _spec(3, bw=33.3, lat=0.37),
        _spec(13),
        _spec(15, "torus2d", bw=37, lat=0.7, torus_dims=[3, 5]),
        "wia-cluster-2x8",
    ],
    ids=["ring2", "ring3", "ring13", "torus3x5", "2x8"],
)
def test_exact_ring_equals_the_simulation(spec, monkeypatch):
    """A blocking ring collective on idle links is timed by the recurrence (every call
    here takes it); an async one is simulated transfer by transfer. Records, link
    bookings and byte counts agree for empty, uneven, multi-chunk and 1-byte-chunk
    segments, and for a second call on links the first left booked."""
    exact = [0]
    times = Communicator._ring_times

    def counted(self, *a):
        out = times(self, *a)
        exact[0] += out is not None
        return out

    monkeypatch.setattr(Communicator, "_ring_times", counted)
    calls = 0
    sizes, chunks = [0, 1, 5, 17, 1000, 4103, 3 << 20], [1, 7, 1024, 1 << 20]
    for nbytes, chunk, op in itertools.product(
        sizes, chunks, ["all_reduce", "reduce_scatter", "all_gather"]
    ):
        if chunk == 1 and nbytes > 5000:
            continue
        kw = {"algorithm": "ring"} if op == "all_reduce" else {}
        a, b = open_cluster(spec, chunk_bytes=chunk), open_cluster(spec, chunk_bytes=chunk)
        ra = [getattr(a, op)(nbytes=nbytes, **kw) for _ in range(2)]
        rb = [getattr(b, op)(nbytes=nbytes, async_op=True, **kw).wait() for _ in range(2)]
        calls += 2
        assert [_key(r) for r in ra] == [_key(r) for r in rb], (op, nbytes, chunk)
        assert _state(a) == _state(b), (op, nbytes, chunk)
    assert exact[0] >= calls  # every blocking call (async ones too when too big to simulate)


def test_1024_rank_ring_runs_exactly_and_fast(ring1024):
    """2 x 1023 x 1024 transfers (over the simulation's limit whatever the size) run
    in well under a second and meet the ring's closed form: 2 (n-1) steps of one
    segment over one link plus its latency."""
    comm = open_cluster(str(ring1024))
    n = 1024
    bpc = 100 / comm.clock_ghz  # bytes per cycle
    lat = round(1.0 * 1e3 * comm.clock_ghz)
    for nbytes in (1 << 10, 1 << 20, 64 << 20):
        t = time.perf_counter()
        rec = comm.all_reduce(nbytes=nbytes, algorithm="ring")
        assert time.perf_counter() - t < 3.0
        seg = nbytes // n
        assert rec.duration_cycles == 2 * (n - 1) * (math.ceil(seg / bpc) + lat)
        assert rec.transfers == 2 * (n - 1) * n and rec.sent_bytes == 2 * (n - 1) * nbytes
    assert comm.reduce_scatter(nbytes=1 << 20).duration_cycles == (n - 1) * (
        math.ceil(1024 / bpc) + lat
    )


def test_auto_runs_what_it_picks_on_1024_ranks(ring1024):
    """``auto`` used to drop the tree (rough hop bound) and fall back to the ring, which
    was always refused; now every candidate runs and the call does."""
    comm = open_cluster(str(ring1024))
    for nbytes in (1 << 10, 64 << 20):
        cands = comm.auto_candidates("all_reduce", range(1024), nbytes, 1)
        assert cands and all(comm.refused("all_reduce", a, nbytes) is None for a in cands)
        assert comm.all_reduce(nbytes=nbytes).algorithm in cands


def test_refusals_name_what_can_change(ring1024, tmp_path):
    """Where no size or chunk can bring a call under the limit, its advice does not
    suggest them: the CLI names another algorithm or a smaller cluster."""
    big = tmp_path / "ring4096.yaml"
    big.write_text(yaml.safe_dump(_spec(4096)))
    run = CliRunner().invoke
    r = run(cli, ["collectives", "-c", str(ring1024), "--op", "all_reduce", "--min", "1K",
                  "--max", "1K", "--chunk", "1G"])  # fmt: skip
    assert r.exit_code == 0 and "ring" in r.output, r.output
    r = run(cli, ["collectives", "-c", str(big), "--op", "all_reduce", "--algo", "tree",
                  "--min", "1K", "--max", "1K"])  # fmt: skip
    assert r.exit_code == 2 and "use --algo ring" in r.output and "--chunk" not in r.output
    r = run(cli, ["collectives", "-c", str(big), "--op", "all_to_all", "--min", "1K",
                  "--max", "1K"])  # fmt: skip
    assert r.exit_code == 2 and "no size or chunk runs it" in r.output
    comm = open_cluster(str(big))
    with pytest.raises(CommError, match="at any size and chunk; use fewer ranks$"):
        comm.all_to_all(nbytes=1024)


def test_a_held_ring_refuses_traffic_on_its_links(ring1024):
    """An async ring too large to simulate is timed exactly while it holds its links:
    it ends as the blocking call does, and a call that would share its links while
    it is in flight is refused in one line instead of being timed wrongly."""
    a, b = open_cluster(str(ring1024)), open_cluster(str(ring1024))
    a.compute(0, 10, async_op=True)  # something else scheduled: not "alone"
    w = a.all_reduce(nbytes=1 << 20, algorithm="ring", async_op=True)
    with pytest.raises(CommError, match=r"^send: .* wait for it first$"):
        a.send(0, 1, nbytes=8)
    ref = b.all_reduce(nbytes=1 << 20, algorithm="ring")
    assert w.wait().duration_cycles == ref.duration_cycles
    assert a.send(0, 1, nbytes=8).duration_cycles > 0  # free again once it ended


def test_train_refusal_advises_train_options(ring1024):
    """``train``'s refusal names its own options, never chunk_bytes."""
    from wia_hw.cli._train import train_cmd

    r = CliRunner().invoke(
        train_cmd,
        ["gemm", "-a", "M=64", "-a", "N=4096", "-a", "K=4096", "-c", str(ring1024),
         "--dp", "1024", "--algo", "tree", "--bucket-mb", "64"],
    )  # fmt: skip
    assert r.exit_code != 0
    msg = str(r.exception) + r.output
    assert "chunk_bytes" not in msg and "--algo auto" in msg and "--bucket-mb" in msg
