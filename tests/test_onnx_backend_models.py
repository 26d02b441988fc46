"""The whole-model tests the ``onnx`` package ships (``onnx/backend/test/data``:
``pytorch-converted``, modules PyTorch exported in 2018 at opsets 6 to 9, among them
1-D, 2-D and 3-D convolutions and pools; ``pytorch-operator``; ``simple``), each with
its stored input and output: every one either computes in functional mode the output
ONNX stored, or is refused with one line saying what is not modelled. And 3-D
convolutions and pools, hand-built, against ONNX Runtime's semantics as ONNX's
reference evaluator computes them (or numpy where that evaluator is wrong)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import wia_hw

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
CASES = sorted(
    p.parent
    for sub in ("pytorch-converted", "pytorch-operator", "simple")
    for p in (DATA / sub).glob("*/model.onnx")
)
#: what a refusal may say: the kinds of model wia-hw does not compute
REFUSED = re.compile(
    r"unsupported ONNX op type|element type DOUBLE|dilations .* are not modelled for pooling|"
    r"shape inference failed|is not fixed"
)


def _tensors(folder: Path, kind: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


def run_case(folder: Path) -> str:
    """``match``, or the one-line refusal."""
    m = onnx.load(str(folder / "model.onnx"))
    data = folder / "test_data_set_0"
    inits = {i.name for i in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in inits]
    try:
        g = wia_hw.from_onnx(m)
    except wia_hw.WorkloadError as e:
        return str(e)
    used = {t.name for t in g.tensors.values() if t.kind == "input"}
    feeds = {n: v for n, v in zip(names, _tensors(data, "input"), strict=False) if n in used}
    with np.errstate(invalid="ignore"):  # sqrt and pow of negatives: NaN, as stored
        got = wia_hw.run(g, mode="functional", inputs=feeds).outputs
    for o, want in zip(m.graph.output, _tensors(data, "output"), strict=True):
        y = got[o.name]
        assert y.shape == want.shape, (folder.name, o.name)
        np.testing.assert_allclose(
            y.astype(np.float64), want, rtol=1e-3, atol=1e-4, equal_nan=True, err_msg=folder.name
        )
    return "match"


def test_every_shipped_model_matches_or_is_refused_in_one_line():
    results = {f"{c.parent.name}/{c.name}": run_case(c) for c in CASES}
    refused = {k: v for k, v in results.items() if v != "match"}
    for case, why in refused.items():
        assert "\n" not in why and REFUSED.search(why), (case, why)
    matched = set(results) - set(refused)
    assert len(matched) >= 116, sorted(refused)
    for name in (
        "Conv3d_groups",
        "Conv3d_dilated_strided",
        "MaxPool3d_stride_padding",
        "AvgPool3d_stride",
    ):
        assert f"pytorch-converted/test_{name}" in matched


# -- 3-D, hand-built ---------------------------------------------------------------------

X = (2, 4, 7, 6, 5)


def model(nodes, inits=()):
    g = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"strides": [2, 1, 2]},
        {"pads": [1, 0, 2, 2, 1, 0], "strides": [2, 2, 1]},
        {"dilations": [2, 1, 1]},
        {"group": 2},
        {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]},
    ],
)
def test_conv3d_is_one_conv2d_with_its_macs(attrs):
    rng = np.random.default_rng(3)
    cg = X[1] // attrs.get("group", 1)
    w = rng.standard_normal((6, cg, 3, 3, 3)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"),
    ]
    m = model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3, 3], **attrs)], inits
    )
    x = rng.standard_normal(X).astype(np.float32)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    g = wia_hw.from_onnx(m)
    assert [o.kind for o in g.ops].count("conv2d") == 1
    assert g.macs() == want.size * cg * 27  # every output: C/g x kd x kh x kw
    y = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def pool_numpy(x, op, k, s, pads, cip):
    """3-D pooling by definition: pad (-inf for max, 0 for an average), window, reduce;
    an average divides by the window's size, or by its unpadded elements."""
    pw = [(0, 0), (0, 0)] + [(pads[i], pads[i + 3]) for i in range(3)]
    xp = np.pad(x.astype(np.float64), pw, constant_values=-np.inf if op == "MaxPool" else 0)
    ones = np.pad(np.ones(x.shape[2:]), pw[2:])
    out = [(xp.shape[2 + i] - k[i]) // s[i] + 1 for i in range(3)]
    y = np.empty(x.shape[:2] + tuple(out))
    for d, h, w in np.ndindex(*out):
        sl = tuple(slice(o * st, o * st + kk) for o, st, kk in zip((d, h, w), s, k, strict=True))
        win = xp[(slice(None), slice(None), *sl)]
        if op == "MaxPool":
            y[:, :, d, h, w] = win.max(axis=(2, 3, 4))
        else:
            y[:, :, d, h, w] = win.sum(axis=(2, 3, 4)) / (np.prod(k) if cip else ones[sl].sum())
    return y


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(
    "k, s, pads, cip",
    [
        ([2, 2, 2], [2, 2, 2], [0] * 6, 0),
        ([3, 3, 3], [2, 1, 2], [1, 1, 1, 1, 1, 1], 1),
        ([3, 3, 3], [1, 1, 1], [0, 1, 1, 0, 1, 1], 0),
    ],
)
def test_pool3d_by_its_definition(op, k, s, pads, cip):
    attrs = {"kernel_shape": k, "strides": s, "pads": pads}
    if op == "AveragePool":
        attrs["count_include_pad"] = cip
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)])
    x = np.random.default_rng(4).standard_normal(X).astype(np.float32)
    y = wia_hw.run(wia_hw.from_onnx(m), mode="functional", inputs={"x": x}).outputs["y"]
    np.testing.assert_allclose(y, pool_numpy(x, op, k, s, pads, cip), rtol=1e-5, atol=1e-6)


def test_an_average_pool3d_leaving_depth_pads_out_of_the_divisor_is_refused():
    m = model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3, 3], pads=[1] * 6)])
    with pytest.raises(wia_hw.WorkloadError, match=r"depth pads left out of the divisor"):
        wia_hw.from_onnx(m)
