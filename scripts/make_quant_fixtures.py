"""Make the quantised ONNX fixtures of ``tests/data/onnx/quant/`` with ONNX Runtime's
quantiser, the tool users quantise their models with.

Needs onnxruntime (not one of wia-hw's own extras):

    python -m venv /tmp/ortenv && /tmp/ortenv/bin/pip install onnxruntime onnx numpy
    /tmp/ortenv/bin/python scripts/make_quant_fixtures.py [--out tests/data/onnx/quant]

Two float models are built with seeded random weights (nothing is downloaded): ``cnn``
(Conv, Relu, MaxPool, a residual Add, GlobalAveragePool, Gemm) and ``encoder`` (one
transformer encoder layer: Q/K/V projections, two heads, Softmax attention, output
projection, residual, LayerNormalization, a Relu MLP). Each is calibrated on 8 seeded
random batches and quantised by ``onnxruntime.quantization.quantize_static`` as:

* ``qdq_u8``: QDQ, uint8 activations with zero points, int8 weights per tensor;
* ``qdq_s8_pc``: QDQ, int8 activations with zero points, int8 weights per channel
  (ONNX Runtime's defaults but per channel);
* ``qop`` (``cnn`` only): QOperator format for Conv and MatMul only (QLinearConv,
  QLinearMatMul between QuantizeLinear and DequantizeLinear);
* ``qop_all``: QOperator format for every op ONNX Runtime quantises, its contrib ops
  (``com.microsoft``: QLinearAdd, QLinearGlobalAveragePool, QLinearSoftmax ...)
  included;
* ``dyn``: ``quantize_dynamic`` (int8 weights; activations quantised at run time by
  DynamicQuantizeLinear, then MatMulInteger/ConvInteger, Cast and Mul by the scales).

It also quantises two of the repository's exporter fixtures (``resnet18`` and
``bert_large_2l``, ``legacy`` exports, given seeded random weights) as ``qdq_s8_pc`` and
as ``dyn``, and saves them weight-stripped like those: the weights' values are dropped, their dims
and every scale and zero point kept (``<name>.qdq_s8_pc.onnx``, no ``.npz``).

And it quantises three of ``tests/data/onnx/zoo``'s transformers (LLaMA and ViT from the
legacy exporter, T5's encoder from the dynamo one; run scripts/make_zoo_fixtures.py
first) dynamically (``zoo_<name>.dyn``) and statically per channel (``zoo_<name>.qdq``,
calibrated on the fixture's own input), with ONNX Runtime's outputs beside them.

The small models keep their weights. Beside each model, ``<name>.npz`` holds the
input the tests feed and ONNX Runtime's own output for it, so the tests compare wia-hw
with the runtime the model was quantised for as well as with ``onnx.reference``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent


def say(text: str) -> None:
    sys.stdout.write(text + "\n")


def _w(rng: np.random.Generator, name: str, shape: tuple[int, ...], fan_in: int) -> Any:
    return numpy_helper.from_array(
        (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name
    )


def cnn(rng: np.random.Generator) -> onnx.ModelProto:
    inits = [
        _w(rng, "w1", (8, 3, 3, 3), 27),
        _w(rng, "b1", (8,), 27),
        _w(rng, "w2", (8, 8, 3, 3), 72),
        _w(rng, "b2", (8,), 72),
        _w(rng, "w3", (8, 8, 1, 1), 8),
        _w(rng, "b3", (8,), 8),
        _w(rng, "fc", (10, 8), 8),
        _w(rng, "fcb", (10,), 8),
    ]
    N = helper.make_node
    nodes = [
        N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        N("Relu", ["c1"], ["r1"]),
        N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        N("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        N("Relu", ["c2"], ["r2"]),
        N("Conv", ["r2", "w3", "b3"], ["c3"]),
        N("Add", ["c3", "p1"], ["s"]),
        N("Relu", ["s"], ["r3"]),
        N("GlobalAveragePool", ["r3"], ["gp"]),
        N("Flatten", ["gp"], ["f"]),
        N("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    g = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def encoder(rng: np.random.Generator) -> onnx.ModelProto:
    h, heads, seq, ffn = 32, 2, 8, 64
    d = h // heads
    inits = [_w(rng, f"w{k}", (h, h), h) for k in "qkvo"]
    inits += [_w(rng, f"b{k}", (h,), h) for k in "qkvo"]
    inits += [_w(rng, "w1", (h, ffn), h), _w(rng, "b1", (ffn,), h)]
    inits += [_w(rng, "w2", (ffn, h), ffn), _w(rng, "b2", (h,), ffn)]
    inits += [
        numpy_helper.from_array(np.ones(h, np.float32), "gamma"),
        numpy_helper.from_array(np.zeros(h, np.float32), "beta"),
        numpy_helper.from_array(np.array([1, seq, heads, d], np.int64), "split_shape"),
        numpy_helper.from_array(np.array([1, seq, h], np.int64), "merge_shape"),
        numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "sqrt_d"),
    ]
    N = helper.make_node
    nodes = []
    for k in "qkv":
        nodes += [
            N("MatMul", ["x", f"w{k}"], [f"{k}m"]),
            N("Add", [f"{k}m", f"b{k}"], [f"{k}a"]),
            N("Reshape", [f"{k}a", "split_shape"], [f"{k}r"]),
        ]
    nodes += [
        N("Transpose", ["qr"], ["qt"], perm=[0, 2, 1, 3]),
        N("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1]),
        N("Transpose", ["vr"], ["vt"], perm=[0, 2, 1, 3]),
        N("MatMul", ["qt", "kt"], ["scores"]),
        N("Div", ["scores", "sqrt_d"], ["scaled"]),
        N("Softmax", ["scaled"], ["probs"], axis=-1),
        N("MatMul", ["probs", "vt"], ["ctx"]),
        N("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        N("Reshape", ["ctx_t", "merge_shape"], ["ctx_m"]),
        N("MatMul", ["ctx_m", "wo"], ["om"]),
        N("Add", ["om", "bo"], ["oa"]),
        N("Add", ["oa", "x"], ["res"]),
        N("LayerNormalization", ["res", "gamma", "beta"], ["ln"], axis=-1),
        N("MatMul", ["ln", "w1"], ["f1"]),
        N("Add", ["f1", "b1"], ["f1b"]),
        N("Relu", ["f1b"], ["f1r"]),
        N("MatMul", ["f1r", "w2"], ["f2"]),
        N("Add", ["f2", "b2"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, h])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "onnx" / "quant"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)

    class Reader(CalibrationDataReader):
        def __init__(self, shape: list[int], seed: int) -> None:
            rng = np.random.default_rng(seed)
            self.it = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

        def get_next(self) -> dict | None:
            return next(self.it, None)

    variants = {
        "qdq_u8": dict(
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=False,
        ),
        "qdq_s8_pc": dict(
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
        ),
        "qop": dict(
            quant_format=QuantFormat.QOperator,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=False,
            op_types_to_quantize=["Conv", "MatMul"],
        ),
        "qop_all": dict(
            quant_format=QuantFormat.QOperator,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=False,
        ),
    }
    for mname, build in (("cnn", cnn), ("encoder", encoder)):
        model = build(np.random.default_rng(0))
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(99).standard_normal(shape).astype(np.float32)
        with tempfile.TemporaryDirectory() as tmp:
            fp32 = Path(tmp) / f"{mname}.onnx"
            onnx.save(model, fp32)
            for vname, kw in [*variants.items(), ("dyn", None)]:
                if vname == "qop" and mname != "cnn":
                    continue  # the encoder's qop_all has the same QLinearMatMuls
                path = out / f"{mname}.{vname}.onnx"
                if kw is None:
                    quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8)
                else:
                    quantize_static(str(fp32), str(path), Reader(shape, 1), **kw)
                sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                (y,) = sess.run(None, {"x": x})
                np.savez(out / f"{mname}.{vname}.npz", x=x, ort=y)
                ops = sorted({n.op_type for n in onnx.load(str(path)).graph.node})
                say(f"{path.name}: {path.stat().st_size} bytes; {', '.join(ops)}")
    zoo = ROOT / "tests" / "data" / "onnx" / "zoo"
    for src in ("llama.legacy", "t5enc.dynamo", "vit.legacy"):
        name = src.split(".")[0]
        data = np.load(zoo / f"{name}.npz")
        feeds = {k[3:]: data[k] for k in data.files if k.startswith("in_")}

        class Once(CalibrationDataReader):
            def __init__(self, feeds: dict) -> None:
                self.it = iter([feeds])

            def get_next(self) -> dict | None:
                return next(self.it, None)

        for how in ("dyn", "qdq"):
            path = out / f"zoo_{name}.{how}.onnx"
            if how == "dyn":
                quantize_dynamic(str(zoo / f"{src}.onnx"), str(path), weight_type=QuantType.QInt8)
            else:
                quantize_static(
                    str(zoo / f"{src}.onnx"),
                    str(path),
                    Once(),
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                )
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            (y,) = sess.run(None, feeds)
            np.savez(
                out / f"zoo_{name}.{how}.npz", ort=y, **{f"in_{k}": v for k, v in feeds.items()}
            )
            say(f"{path.name}: {path.stat().st_size} bytes")
    for name in ("resnet18", "bert_large_2l"):
        model = exported(name, np.random.default_rng(0))
        feeds = []
        for vi in model.graph.input:
            if vi.name in {t.name for t in model.graph.initializer}:
                continue
            tt = vi.type.tensor_type
            feeds.append(
                (
                    vi.name,
                    [d.dim_value for d in tt.shape.dim],
                    helper.tensor_dtype_to_np_dtype(tt.elem_type),
                )
            )

        class Feeds(CalibrationDataReader):
            def __init__(self, feeds: list) -> None:
                rng = np.random.default_rng(1)
                self.it = iter(
                    [
                        {
                            n: rng.standard_normal(s).astype(dt)
                            if dt.kind == "f"
                            else rng.integers(0, 100, s).astype(dt)
                            for n, s, dt in feeds
                        }
                        for _ in range(2)
                    ]
                )

            def get_next(self) -> dict | None:
                return next(self.it, None)

        with tempfile.TemporaryDirectory() as tmp:
            fp32 = Path(tmp) / f"{name}.onnx"
            onnx.save(model, fp32)
            path = out / f"{name}.qdq_s8_pc.onnx"
            quantize_static(str(fp32), str(path), Feeds(feeds), **variants["qdq_s8_pc"])
            dyn = out / f"{name}.dyn.onnx"
            quantize_dynamic(str(fp32), str(dyn), weight_type=QuantType.QInt8)
        for p in (path, dyn):
            strip_weights(p)
            say(f"{p.name}: {p.stat().st_size} bytes (weights stripped)")


def exported(name: str, rng: np.random.Generator) -> onnx.ModelProto:
    """An exporter fixture (weight-stripped) with seeded random weights, its dims fixed
    (batch 1, seq 128)."""
    m = onnx.load(
        str(ROOT / "tests" / "data" / "onnx" / f"{name}.legacy.onnx"), load_external_data=False
    )
    for init in m.graph.initializer:
        if init.data_location != TensorProto.EXTERNAL:
            continue
        dt = helper.tensor_dtype_to_np_dtype(init.data_type)
        dims = tuple(init.dims)
        fan = int(np.prod(dims[1:])) if len(dims) > 1 else dims[0]
        arr = (
            (rng.standard_normal(dims) / np.sqrt(max(fan, 1))).astype(dt)
            if dt.kind == "f"
            else np.zeros(dims, dt)
        )
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
    for vi in m.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = {"batch": 1, "seq": 128}.get(d.dim_param, 1)
    return m


def strip_weights(path: Path) -> None:
    """Drop the values of the weights (initializers of more than 4,096 elements: the
    int8 weights and any float table left); keep their dims, and every scale and zero
    point."""
    m = onnx.load(str(path))
    for t in m.graph.initializer:
        if int(np.prod(t.dims)) > 4096:
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            e = t.external_data.add()
            e.key, e.value = "location", f"{path.name}.data"
    onnx.save(m, str(path))


if __name__ == "__main__":
    main()
