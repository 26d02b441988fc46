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
    """Inside same_program a tensor that shrinks (a decode step after the prefill)
    keeps its buffer; one that grows (the KV cache) is laid out at its new size, so a
    step reads its whole cache: at 1,005 cached tokens it read 277 MB from HBM, less
    than the 297 MB of KV cache, as the 8-token step did."""
    kw = dict(layers=1, batch=8)
    ctx = wia_hw.open_device()
    with ctx.same_program():
        ctx.run("gpt2", seq=16, phase="prefill", **kw)
        kept = ctx.run("gpt2", seq=1, phase="decode", kv_len=16, **kw)
        grown = ctx.run("gpt2", seq=1, phase="decode", kv_len=512, **kw)
    other = wia_hw.open_device()
    other.run("gpt2", seq=16, phase="prefill", **kw)
    apart = other.run("gpt2", seq=1, phase="decode", kv_len=16, **kw)
    # the decode step after its own prefill: its buffers reused (views of the prefill's,
    # mapped by whole storage rows: a few % more bytes than fresh storage, never less
    # than the step's own weights and cache)
    assert kept.counters.bytes["hbm"] != apart.counters.bytes["hbm"]
    assert abs(kept.cycles - apart.cycles) <= 0.05 * apart.cycles
    # the grown step reads at least its KV cache (2 x layers x batch x kv x d x 2 bytes)
    cache = 2 * 1 * 8 * 512 * 768 * 2
    assert grown.counters.bytes["hbm"] >= cache
    fresh = wia_hw.open_device().run("gpt2", seq=1, phase="decode", kv_len=512, **kw)
    assert abs(grown.cycles - fresh.cycles) <= 0.05 * fresh.cycles
