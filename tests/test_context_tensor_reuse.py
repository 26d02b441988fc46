"""A used device meets a tensor named as an earlier run's but of another shape: it is
another tensor with its own storage, not a view of the old one. A 64x64 GEMM after a
4096x4096 one on one context wrote back 2 MiB of the old output's blocks (5.48 us
against 0.79 on a fresh device); a 2048^3 GEMM after a 64^3 one read 8 KB from HBM (its
operands collapsed onto the old blocks); bert-base b8 after b1 moved 226 MB, not 597. A
model run again still finds its tensors warm, and one program at several lengths
(``Context.same_program``, a decode loop) keeps its buffers."""

from __future__ import annotations

import numpy as np
import pytest

import wia_hw


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_another_tensor_of_an_old_name_runs_as_on_a_fresh_device(seed):
    rng = np.random.default_rng(seed)
    big = [int(x) for x in rng.choice([1024, 2048], size=3)]
    small = [int(x) for x in rng.choice([16, 64, 96, 128], size=3)]
    for first, second in ((big, small), (small, big)):
        ctx = wia_hw.open_device()
        ctx.run("gemm", M=first[0], N=first[1], K=first[2])
        after = ctx.run("gemm", M=second[0], N=second[1], K=second[2])
        fresh = wia_hw.open_device().run("gemm", M=second[0], N=second[1], K=second[2])
        assert after.cycles == fresh.cycles
        assert after.counters.bytes == fresh.counters.bytes
        assert [o.name for o in after.ops] == [o.name for o in fresh.ops]


def test_a_larger_batch_of_the_same_model_is_not_folded_onto_the_smaller():
    """Its weights (same shapes) may be warm; its activations are its own: at most the
    weights' bytes are saved against a fresh device (b1 then b8 moved 226 MB from HBM
    against 597 fresh, with 220 MB of weights)."""
    from wia_hw.workloads import build

    ctx = wia_hw.open_device()
    ctx.run("bert-base", batch=1, seq=128)
    after = ctx.run("bert-base", batch=8, seq=128)
    fresh = wia_hw.open_device().run("bert-base", batch=8, seq=128)
    weights = build("bert-base", batch=8, seq=128).weight_bytes
    assert fresh.counters.bytes["hbm"] - weights <= after.counters.bytes["hbm"]
    assert after.counters.bytes["hbm"] <= fresh.counters.bytes["hbm"]


def test_one_program_at_several_lengths_keeps_its_buffers():
    kw = dict(layers=1)
    ctx = wia_hw.open_device()
    with ctx.same_program():
        ctx.run("gpt2", phase="decode", kv_len=64, **kw)
        kept = ctx.run("gpt2", phase="decode", kv_len=65, **kw)
    ctx = wia_hw.open_device()
    ctx.run("gpt2", phase="decode", kv_len=64, **kw)
    other = ctx.run("gpt2", phase="decode", kv_len=65, **kw)
    assert kept.counters.bytes["hbm"] < other.counters.bytes["hbm"]  # the cache stays warm
