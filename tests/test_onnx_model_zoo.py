"""The ONNX Model Zoo's classic CNNs as the ``onnx`` package ships them
(``onnx/backend/test/data/light``: Caffe2's exports at opset 9, IR 3, initializers
listed as graph inputs, the weights rebuilt by ConstantOfShape, with ONNX's own output
for them): AlexNet, DenseNet-121, Inception v1 and v2, ResNet-50, ShuffleNet,
SqueezeNet, VGG-19 and ZFNet-512. Each imports, costs the MACs counted independently
from ONNX's shape inference, runs on wia-npu, and (the cheaper ones) computes in
functional mode the output ONNX stored."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import wia_hw

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.stem for p in LIGHT.glob("light_*.onnx"))
#: the models small enough to run in functional mode in a test (seconds each)
FUNCTIONAL = ["light_densenet121", "light_shufflenet", "light_squeezenet", "light_inception_v1"]


def test_the_zoo_models_are_there():
    assert len(MODELS) >= 9, MODELS


def independent_macs(path: Path) -> int:
    """Conv: output elements x (input channels per group x kernel); Gemm: M x N x K,
    from ONNX's shape inference of the file as it is."""
    m = onnx.shape_inference.infer_shapes(onnx.load(str(path)), data_prop=True)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*m.graph.input, *m.graph.value_info, *m.graph.output]
    }
    total = 0
    for n in m.graph.node:
        if n.op_type == "Conv":
            w = shapes[n.input[1]]
            total += math.prod(shapes[n.output[0]]) * math.prod(w[1:])
        elif n.op_type == "Gemm":
            a = {x.name: x.i for x in n.attribute}
            m_, k = shapes[n.input[0]][::-1] if a.get("transA") else shapes[n.input[0]]
            total += m_ * k * shapes[n.output[0]][1]
    return total


@pytest.mark.parametrize("name", MODELS)
def test_imports_with_its_macs_and_runs(name):
    path = LIGHT / f"{name}.onnx"
    g = wia_hw.from_onnx(path)
    assert g.macs() == independent_macs(path) > 0
    r = wia_hw.run(g, device="wia-npu")
    assert r.latency_ms >= r.roofline_floor_ms > 0


@pytest.mark.parametrize("name", FUNCTIONAL)
def test_computes_the_output_onnx_stored(name):
    """The stored output is ONNX's for the model's rebuilt weights and an input the
    data set does not ship: these CNNs' outputs do not depend on it (constant weights
    make every position alike), which the test checks with two inputs."""
    g = wia_hw.from_onnx(LIGHT / f"{name}.onnx")
    want = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"{name}_output_0.pb")))
    (inp,) = [t for t in g.tensors.values() if t.kind == "input"]
    for seed in (0, 1):
        x = np.random.default_rng(seed).standard_normal(inp.shape).astype(np.float32)
        y = wia_hw.run(g, mode="functional", inputs={inp.name: x}).outputs[g.declared_outputs[0]]
        assert y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
