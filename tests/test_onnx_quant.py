"""Quantised ONNX models (wia_hw/workloads/_onnx_qdq.py): what ONNX Runtime's quantiser
writes (tests/data/onnx/quant, made by scripts/make_quant_fixtures.py) imports with its
integer tensors integer, times as int8, and computes in functional mode what ONNX's
reference evaluator computes, code for code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx_node_tests import run_node_cases  # noqa: E402

import wia_hw
from wia_hw import from_onnx
from wia_hw._functional import FunctionalExecutor
from wia_hw.graph import GEMM_KINDS
from wia_hw.workloads._onnx_qdq import QDQ_OPS

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

DATA = Path(__file__).parent / "data" / "onnx"
QUANT = DATA / "quant"
SMALL = [
    "cnn.qdq_u8",
    "cnn.qdq_s8_pc",
    "cnn.qop",
    "cnn.qop_all",
    "cnn.dyn",
    "encoder.qdq_u8",
    "encoder.qdq_s8_pc",
    "encoder.qop_all",
    "encoder.dyn",
]


def reference(model: object, feeds: dict, names: list[str] | None = None) -> list:
    """onnx.reference on ``model`` at opset 19 at least: it implements QuantizeLinear and
    DequantizeLinear from 19 on (the earlier versions differ only in the types they
    admit, none of which these models use)."""
    m = onnx.load(str(model)) if isinstance(model, (str, Path)) else model
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max(o.version, 19)
    return ReferenceEvaluator(m).run(names, feeds)


def codes_to_real(graph: wia_hw.Graph, name: str, codes: np.ndarray) -> np.ndarray:
    return graph.quant[name].real(codes)


@pytest.mark.parametrize("name", SMALL)
def test_functional_matches_onnx_reference_and_runtime(name):
    path = QUANT / f"{name}.onnx"
    data = np.load(QUANT / f"{name}.npz")
    graph = from_onnx(path)
    res = wia_hw.run(graph, device="wia-npu", mode="functional", inputs={"x": data["x"]})
    (y,) = res.outputs.values()
    if "qop_all" not in name:  # onnx.reference has no com.microsoft ops
        (want,) = reference(path, {"x": data["x"]})
        # the same codes everywhere; the last float ops round alike to within float32
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    # ONNX Runtime's own kernels (recorded when the model was made): equal, but where
    # its QDQ-fused softmax and layer norm round differently from the reference,
    # never by more than a few output steps
    err = np.abs(y - data["ort"]).max() / np.abs(data["ort"]).max()
    assert err <= (0.05 if name.startswith("encoder.qdq") else 1e-6), err


@pytest.mark.parametrize("name", ["encoder.qdq_u8", "cnn.qdq_s8_pc"])
def test_every_quantised_tensor_holds_the_reference_codes(name):
    """Tensor by tensor: each integer tensor of the graph holds the codes that the
    reference evaluator computes for the ONNX value of that name."""
    path = QUANT / f"{name}.onnx"
    x = np.load(QUANT / f"{name}.npz")["x"]
    graph = from_onnx(path)
    fx = FunctionalExecutor(graph, 0, {"x": x})
    for op in graph.ops:
        fx.step(op)
    m = onnx.load(str(path))
    names = [o for n in m.graph.node for o in n.output]
    ref = dict(zip(names, reference(m, {"x": x}, names), strict=True))
    checked = 0
    for op in graph.ops:
        out = op.outputs[0]
        if out in graph.quant and out in ref:
            np.testing.assert_array_equal(
                fx._dequantised(out), codes_to_real(graph, out, ref[out]), err_msg=out
            )
            checked += 1
    assert checked >= 8


def test_integer_tensors_stay_integer():
    g = from_onnx(QUANT / "cnn.qdq_s8_pc.onnx")
    gemms = [o for o in g.ops if o.kind in GEMM_KINDS]
    assert [o.kind for o in gemms] == ["conv2d"] * 3 + ["linear"]
    for o in gemms:
        a, w = (g.tensors[i] for i in o.inputs[:2])
        assert (a.dtype, w.dtype, w.kind) == ("int8", "int8", "weight"), o.name
        assert g.tensors[o.outputs[0]].dtype == "int8"  # the op requantises itself
        if len(o.inputs) > 2:
            assert g.tensors[o.inputs[2]].dtype == "int32"  # bias in accumulator units
    # per output channel: conv weights [O, 1, 1, 1]; the Gemm's [10, 8] weight is
    # transposed to [8, 10] at import and its scales follow it to the columns
    conv_w = g.quant[gemms[0].inputs[1]]
    assert conv_w.scale.shape == (8, 1, 1, 1)
    fc = g.quant[gemms[-1].inputs[1]]
    assert g.tensors[gemms[-1].inputs[1]].shape == (8, 10) and fc.scale.shape == (1, 10)
    # no Q/DQ pass is left but the input's quantisation and the output's dequantisation
    casts = [o for o in g.ops if o.kind == "cast"]
    assert len(casts) == 2


@pytest.mark.parametrize("how", ["qdq_s8_pc", "dyn"])
def test_exporter_models_quantised_time_as_int8(how):
    """ONNX Runtime's static (QDQ) and dynamic quantisation of the repository's
    ResNet-18 and BERT (2 layers) exports: the same MACs as the float exports, a
    quarter of the weight bytes, every GEMM int8 x int8, and a lower latency."""
    for name, dims in (("resnet18", {"batch": 1}), ("bert_large_2l", {"batch": 1, "seq": 128})):
        q = from_onnx(QUANT / f"{name}.{how}.onnx", dims=dims)
        f = from_onnx(DATA / f"{name}.legacy.onnx", dims=dims)
        assert q.macs() == f.macs(), name
        assert 0.24 < q.weight_bytes / f.weight_bytes < 0.26, name
        weights = [o for o in q.ops if o.kind in ("linear", "conv2d")]
        assert weights
        for o in weights:  # dynamic: the attention bmm's stay float, as ONNX Runtime's
            assert {q.tensors[i].dtype for i in o.inputs[:2]} == {"int8"}, o.name
            if o.kind == "conv2d" and how == "qdq_s8_pc":  # int32 biases (via Identity)
                assert q.tensors[o.inputs[2]].dtype == "int32", o.name
        assert wia_hw.run(q).latency_ms < wia_hw.run(f).latency_ms / 2, name


# -- models made here ------------------------------------------------------------------

F32, I8, U8, I32 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "q", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _arr(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def test_symmetric_int8_runs_the_rtl_path_bit_exact():
    """Zero points 0 on int8 codes: the device's int8 array computes the GEMM (over its
    tiles, in int32), the bias added in int32; the result equals ONNX's."""
    rng = np.random.default_rng(3)
    k, n = 96, 40
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    b = rng.integers(-5000, 5000, (n,)).astype(np.int32)
    sx, sw = np.float32(0.02), rng.uniform(0.001, 0.01, n).astype(np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=1),
        helper.make_node("DequantizeLinear", ["b", "sb"], ["bd"], axis=0),
        helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"]),
    ]
    inits = [
        _arr("sx", sx, np.float32),
        _arr("zx", 0, np.int8),
        _arr("w", w, np.int8),
        _arr("sw", sw, np.float32),
        _arr("zw", np.zeros(n), np.int8),
        _arr("b", b, np.int32),
        _arr("sb", sx * sw, np.float32),
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [24, k])],
        [helper.make_tensor_value_info("y", F32, [24, n])],
        inits,
    )
    x = rng.standard_normal((24, k)).astype(np.float32)
    g = from_onnx(m)
    lin = next(o for o in g.ops if o.kind == "linear")
    assert len(lin.inputs) == 3 and g.tensors[lin.inputs[2]].dtype == "int32"
    y = wia_hw.run(g, device="wia-npu", mode="functional", inputs={"x": x}).outputs["y"]
    xq = np.clip(np.rint(x / sx), -128, 127).astype(np.int64)
    exact = ((xq @ w.astype(np.int64) + b) * (np.float64(sx) * sw)).astype(np.float32)
    np.testing.assert_allclose(y, exact, rtol=1e-6)
    (want,) = reference(m, {"x": x})
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_qlinear_and_integer_ops_match_the_reference():
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (6, 20)).astype(np.uint8)
    bq = rng.integers(-128, 128, (20, 12)).astype(np.int8)
    xc = rng.integers(0, 256, (1, 3, 9, 9)).astype(np.uint8)
    wc = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    inits = [
        _arr("bq", bq, np.int8),
        _arr("as", 0.05, np.float32),
        _arr("az", 131, np.uint8),
        _arr("bs", rng.uniform(0.01, 0.02, 12), np.float32),
        _arr("bz", np.zeros(12), np.int8),
        _arr("ys", 0.4, np.float32),
        _arr("yz", 3, np.int8),
        _arr("wc", wc, np.int8),
        _arr("cz", 17, np.uint8),
        _arr("wz", 2, np.int8),
    ]
    nodes = [
        helper.make_node("QLinearMatMul", ["a", "as", "az", "bq", "bs", "bz", "ys", "yz"], ["yq"]),
        helper.make_node("MatMulInteger", ["a2", "bq", "az"], ["yi"]),
        helper.make_node("ConvInteger", ["xc", "wc", "cz", "wz"], ["ci"], pads=[1, 1, 1, 1]),
    ]
    m = _model(
        nodes,
        [
            helper.make_tensor_value_info("a", U8, [6, 20]),
            helper.make_tensor_value_info("a2", U8, [6, 20]),
            helper.make_tensor_value_info("xc", U8, [1, 3, 9, 9]),
        ],
        [
            helper.make_tensor_value_info("yq", I8, [6, 12]),
            helper.make_tensor_value_info("yi", I32, [6, 12]),
            helper.make_tensor_value_info("ci", I32, [1, 4, 9, 9]),
        ],
        inits,
    )
    g = from_onnx(m)
    assert [o.kind for o in g.ops] == ["linear", "linear", "conv2d"]
    feeds = {"a": a, "a2": a[::-1].copy(), "xc": xc}
    fx = FunctionalExecutor(g, 0, feeds)
    for op in g.ops:
        fx.step(op)
    want = dict(zip(["yq", "yi", "ci"], reference(m, feeds), strict=True))
    for name in ("yq", "yi", "ci"):
        np.testing.assert_array_equal(
            fx._dequantised(name), codes_to_real(g, name, want[name]), err_msg=name
        )
    assert g.tensors["ci"].dtype == "int32" and g.tensors["a"].dtype == "int8"


def _qdq(extra_nodes, extra_inits, x_shape=(2, 4), opset=21):
    nodes = [helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"])] + extra_nodes
    inits = [_arr("s", 0.1, np.float32), _arr("z", 0, np.int8)] + extra_inits
    return _model(
        nodes,
        [helper.make_tensor_value_info("xq", I8, list(x_shape))],
        [helper.make_tensor_value_info("y", F32, None)],
        inits,
        opset,
    )


def test_refusals_name_the_node():
    # dynamic quantisation read other than by MatMulInteger/ConvInteger -> Cast -> Mul
    dyn = _model(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"], name="dql"),
            helper.make_node("DequantizeLinear", ["q", "qs", "qz"], ["y"], name="dq"),
        ],
        [helper.make_tensor_value_info("x", F32, [2, 4])],
        [helper.make_tensor_value_info("y", F32, [2, 4])],
        [],
    )
    with pytest.raises(
        wia_hw.WorkloadError,
        match=r"^ONNX node 'dql' \(DynamicQuantizeLinear\): its codes are read by DequantizeLinear",
    ):
        from_onnx(dyn)
    # a QuantizeLinear whose scale is a graph input
    runtime = _model(
        [helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="qr")],
        [
            helper.make_tensor_value_info("x", F32, [2, 4]),
            helper.make_tensor_value_info("s", F32, []),
        ],
        [helper.make_tensor_value_info("y", U8, [2, 4])],
        [],
    )
    with pytest.raises(wia_hw.WorkloadError, match=r"'qr'.*'s' is a graph input"):
        from_onnx(runtime)
    # blocked quantisation (opset 21's block_size)
    blocked = _qdq(
        [
            helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0, block_size=2),
            helper.make_node("MatMul", ["xd", "wd"], ["y"]),
        ],
        [_arr("w", np.ones((4, 3)), np.int8), _arr("ws", np.ones((2, 3)), np.float32)],
    )
    with pytest.raises(wia_hw.WorkloadError, match=r"\(DequantizeLinear\): blocked quantisation"):
        from_onnx(blocked)
    # int16 codes
    i16 = _model(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q16")],
        [helper.make_tensor_value_info("x", F32, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT16, [2, 4])],
        [_arr("s", 0.1, np.float32), _arr("z", 0, np.int16)],
    )
    with pytest.raises(wia_hw.WorkloadError, match=r"'q16'.*INT16"):
        from_onnx(i16)
    # the same codes dequantised with two different scales
    two = _qdq(
        [
            helper.make_node("DequantizeLinear", ["xq", "s2", "z"], ["xd2"], name="dq2"),
            helper.make_node("Add", ["xd", "xd2"], ["y"]),
        ],
        [_arr("s2", 0.2, np.float32)],
    )
    with pytest.raises(wia_hw.WorkloadError, match=r"'dq2' \(DequantizeLinear\): reads codes 'xq'"):
        from_onnx(two)


def test_dequantised_codes_before_a_float_move_and_as_output():
    """A DequantizeLinear whose reader moves floats (no QuantizeLinear after), or whose
    output is the graph's, is a cast to float; values as ONNX's."""
    m = _qdq(
        [helper.make_node("Transpose", ["xd"], ["y"], perm=[1, 0])],
        [],
    )
    g = from_onnx(m)
    assert [o.kind for o in g.ops] == ["cast", "transpose"]
    xq = np.arange(-4, 4, dtype=np.int8).reshape(2, 4)
    y = wia_hw.run(g, mode="functional", inputs={"xq": xq}).outputs["y"]
    np.testing.assert_array_equal(y, reference(m, {"xq": xq})[0])


# -- ONNX's own node tests -------------------------------------------------------------

#: the inputs that stay run-time inputs (the rest, scales and zero points and weights,
#: become initializers: the importer needs quantisation parameters as constants)
RUNTIME_INPUTS = {"QLinearMatMul": (0, 3), "MatMulInteger": (0, 1), "ConvInteger": (0, 1)}


def test_onnx_node_tests_of_the_quantisation_ops():
    """Every node test the onnx package ships for these ops: the int8/uint8 ones give
    ONNX's expected outputs exactly (to float rounding, for the float16 variants);
    the others (int16, int4, float8, blocked) are refused naming what is not modelled."""
    matched, refused = run_node_cases(QDQ_OPS, RUNTIME_INPUTS)
    assert {
        "test_quantizelinear",
        "test_quantizelinear_axis",
        "test_dequantizelinear",
        "test_dequantizelinear_axis",
        "test_qlinearconv",
        "test_qlinearmatmul_2D_uint8_float32",
        "test_qlinearmatmul_3D_int8_float32",
        "test_matmulinteger",
        "test_convinteger_with_padding",
    } <= set(matched)
    assert {"test_quantizelinear_int16", "test_dequantizelinear_blocked"} <= set(refused)


def test_import_report_says_how_much_runs_on_integers():
    from wia_hw.workloads._import_report import format_report, import_report

    text = format_report(import_report(QUANT / "cnn.qdq_u8.onnx"))
    assert "Quantised:   " in text and "4 of 4 GEMMs on integer operands" in text
    # dynamic quantisation: codes with run-time scales count too (the attention's
    # activation x activation products stay float, as ONNX Runtime leaves them)
    text = format_report(import_report(QUANT / "zoo_llama.dyn.onnx"))
    assert "14 of 18 GEMMs on integer operands" in text
    plain = format_report(import_report(DATA / "resnet18.legacy.onnx", batch=1))
    assert "Quantised" not in plain


def test_fusion_keeps_the_models_values_and_quantisation():
    """apply_fusion only marks ops: the fused graph of an imported model computes what
    the model computes (its weights, its codes), and its fused kernels time faster."""
    from wia_hw import FusionConfig, apply_fusion

    for name in ("encoder.qdq_u8", "encoder.dyn"):
        x = np.load(QUANT / f"{name}.npz")["x"]
        g = from_onnx(QUANT / f"{name}.onnx")
        fused = apply_fusion(g, FusionConfig())
        assert (
            fused.quant.keys() == g.quant.keys()
            and fused.weight_values.keys() == g.weight_values.keys()
        )
        assert sum(fused.params["fusion"].values()) >= 1, name
        y0 = wia_hw.run(g, mode="functional", inputs={"x": x}).outputs["y"]
        y1 = wia_hw.run(fused, mode="functional", inputs={"x": x}).outputs["y"]
        np.testing.assert_allclose(y1, y0, rtol=1e-6, atol=1e-6 * np.abs(y0).max())
        assert wia_hw.run(fused).latency_ms < wia_hw.run(g).latency_ms, name


def test_contrib_concat_requantises_and_channels_last_is_refused():
    """com.microsoft::QLinearConcat of inputs with their own parameters: each is
    requantised to the output's, as ONNX Runtime defines it."""
    ms = "com.microsoft"
    a = np.array([[0, 100, 255]], np.uint8)
    b = np.array([[7, 9]], np.uint8)
    inits = [
        _arr("ys", 0.5, np.float32),
        _arr("yz", 10, np.uint8),
        _arr("as", 0.1, np.float32),
        _arr("az", 128, np.uint8),
        _arr("bs", 2.0, np.float32),
        _arr("bz", 8, np.uint8),
    ]
    node = helper.make_node(
        "QLinearConcat", ["ys", "yz", "a", "as", "az", "b", "bs", "bz"], ["y"], axis=1, domain=ms
    )
    g = helper.make_graph(
        [node],
        "c",
        [
            helper.make_tensor_value_info("a", U8, [1, 3]),
            helper.make_tensor_value_info("b", U8, [1, 2]),
        ],
        [helper.make_tensor_value_info("y", U8, [1, 5])],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)]
    )
    graph = from_onnx(m)
    fx = FunctionalExecutor(graph, 0, {"a": a, "b": b})
    for op in graph.ops:
        fx.step(op)
    real = np.concatenate([(a.astype(np.float64) - 128) * 0.1, (b.astype(np.float64) - 8) * 2.0], 1)
    codes = np.clip(np.rint(real / 0.5) + 10, 0, 255)
    np.testing.assert_array_equal(fx._dequantised("y"), ((codes - 10) * 0.5).astype(np.float32))
    pool = helper.make_node(
        "QLinearGlobalAveragePool",
        ["a4", "as", "az", "ys", "yz"],
        ["p"],
        channels_last=1,
        domain=ms,
        name="gap",
    )
    g = helper.make_graph(
        [pool],
        "p",
        [helper.make_tensor_value_info("a4", U8, [1, 2, 2, 3])],
        [helper.make_tensor_value_info("p", U8, None)],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)]
    )
    with pytest.raises(
        wia_hw.WorkloadError, match=r"^ONNX node 'gap' .*channels_last is not modelled$"
    ):
        from_onnx(m)


def test_qat_export_float_weights_quantised_in_the_model():
    """A QAT-style export (pytorch-quantization, torch.ao): float weights, each through
    QuantizeLinear -> DequantizeLinear. A weight too large to fold becomes an int8
    constant whose codes the import computes from the float weight when functional
    mode asks; the result is ONNX's."""
    rng = np.random.default_rng(11)
    k, n = 320, 256  # 81,920 elements: above what constant folding reads
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    sw = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("QuantizeLinear", ["w", "sw", "zw"], ["wq"], axis=1),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
    ]
    inits = [
        _arr("sx", 0.03, np.float32),
        _arr("zx", 0, np.int8),
        numpy_helper.from_array(w, "w"),
        _arr("sw", sw, np.float32),
        _arr("zw", np.zeros(n), np.int8),
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [4, k])],
        [helper.make_tensor_value_info("y", F32, [4, n])],
        inits,
    )
    g = from_onnx(m)
    lin = next(o for o in g.ops if o.kind == "linear")
    assert g.tensors[lin.inputs[1]].dtype == "int8" and lin.inputs[1] in g.weight_values
    x = rng.standard_normal((4, k)).astype(np.float32)
    y = wia_hw.run(g, device="wia-npu", mode="functional", inputs={"x": x}).outputs["y"]
    (want,) = reference(m, {"x": x})
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["llama", "t5enc", "vit"])
def test_quantised_transformers_from_the_zoo(name):
    """ONNX Runtime's dynamic and static (QDQ, per channel) quantisation of the zoo's
    LLaMA, T5 encoder and ViT (with their weights): the dynamic ones equal ONNX Runtime
    to float32 rounding; the static ones equal ONNX's reference evaluator exactly (ONNX
    Runtime's fused QDQ kernels round differently, within a few output steps)."""
    for how in ("dyn", "qdq"):
        path = QUANT / f"zoo_{name}.{how}.onnx"
        data = np.load(QUANT / f"zoo_{name}.{how}.npz")
        feeds = {k[3:]: data[k] for k in data.files if k.startswith("in_")}
        g = from_onnx(path)
        used = {t.name for t in g.tensors.values() if t.kind == "input"}
        out = wia_hw.run(g, mode="functional", inputs={k: feeds[k] for k in used}).outputs
        (y,) = out.values()
        ort = data["ort"]
        err = np.abs(y - ort).max() / np.abs(ort).max()
        if how == "dyn":
            assert err < 1e-5, (name, err)
            assert sum(bool(o.attrs.get("dynamic_quant")) for o in g.ops) >= 4
        else:
            assert err < 0.08, (name, err)
            (want,) = reference(path, feeds)
            np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
        assert all(
            {g.tensors[i].dtype for i in o.inputs[:2]} == {"int8"}
            for o in g.ops
            if o.kind == "linear"
        ), (name, how)
