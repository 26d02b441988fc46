"""Hostile ONNX: real models (a quantised CNN and encoder, exported transformers) with
random attributes, rewired inputs and changed constants. Every import and run either
works or raises one WorkloadError line; nothing else escapes (seeded, so a failure
repeats)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

import wia_hw

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

SEEDS = 8
DATA = Path(__file__).parent / "data" / "onnx"
MODELS = [
    DATA / "quant" / "cnn.qdq_u8.onnx",
    DATA / "quant" / "cnn.dyn.onnx",
    DATA / "quant" / "encoder.qdq_s8_pc.onnx",
    DATA / "zoo" / "roberta.legacy.onnx",
    DATA / "zoo" / "t5enc.dynamo.onnx",
]


def mutate(m: object, rng: random.Random) -> None:
    nodes = list(m.graph.node)
    values = [o for n in nodes for o in n.output] + [t.name for t in m.graph.initializer]
    for _ in range(rng.randint(1, 3)):
        n = rng.choice(nodes)
        what = rng.random()
        if what < 0.4 and n.attribute:
            a = rng.choice(list(n.attribute))
            if a.type == onnx.AttributeProto.INT:
                a.i = rng.choice([-3, -1, 0, 1, 2, 7, 1000])
            elif a.type == onnx.AttributeProto.INTS and len(a.ints):
                a.ints[rng.randrange(len(a.ints))] = rng.choice([-2, 0, 1, 3, 64])
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = rng.choice([0.0, -1.0, 1e30, float("nan")])
        elif what < 0.7 and n.input:
            n.input[rng.randrange(len(n.input))] = rng.choice(values + [""])
        else:
            t = rng.choice(list(m.graph.initializer))
            if t.data_location == onnx.TensorProto.EXTERNAL or not 0 < np.prod(t.dims) <= 64:
                continue
            arr = numpy_helper.to_array(t).copy()
            flat = arr.reshape(-1)
            flat[rng.randrange(flat.size)] = (
                rng.choice([0, -1, 3, 1e9]) if arr.dtype.kind == "f" else rng.choice([0, 3, 127])
            )
            t.CopyFrom(numpy_helper.from_array(arr, t.name))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_mutated_models_work_or_raise_one_line(seed):
    rng = random.Random(seed)
    models = [onnx.load(str(p), load_external_data=False) for p in MODELS]
    outcomes = {"ran": 0, "refused": 0}
    for _ in range(60):
        m = type(models[0])()
        m.CopyFrom(rng.choice(models))
        mutate(m, rng)
        try:
            g = wia_hw.from_onnx(m)
            wia_hw.run(g, device="wia-npu")
            wia_hw.run(g, device="wia-npu", mode="functional")
            outcomes["ran"] += 1
        except wia_hw.WorkloadError as e:
            assert "\n" not in str(e).strip(), str(e)
            outcomes["refused"] += 1
    assert outcomes["ran"] and outcomes["refused"], outcomes
