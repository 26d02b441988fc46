"""Make ``tests/data/onnx/tf/``: Keras models as tf2onnx writes them, the second
exporter users bring after torch's.

Needs tensorflow and tf2onnx (not wia-hw's own test extras):

    python -m venv /tmp/tfv && /tmp/tfv/bin/pip install tensorflow-cpu tf2onnx onnx
    /tmp/tfv/bin/python scripts/make_tf_fixtures.py [--out tests/data/onnx/tf]

tf2onnx converts the Keras model's ``tf.function`` (inference: ``training=False``) at
opset 13, with its own graph optimiser on (its default): NHWC convolutions between
Transposes that it pushes out of the way, a BatchNormalization folded into the Conv
before it or left as a Mul and an Add, Keras's ZeroPadding2D as a Pad, a mean over the
last axis as a GlobalAveragePool, TensorFlow's layer norm as its moments and
``x * inv + (beta - mean * inv)``, and einsum (Keras's MultiHeadAttention) as
Reshapes, Transposes and MatMuls.

With their weights (seeded, random; every BatchNormalization gets random statistics, so
folding it is not the identity), and Keras's own output in ``<name>.npz`` (``x``, ``y``):

* ``keras_cnn``: MobileNet-like blocks on a 32x32 RGB image: Rescaling, Conv2D (same
  padding, stride 2), BatchNormalization, ReLU6, ZeroPadding2D + DepthwiseConv2D,
  SeparableConv2D, squeeze-and-excitation (GlobalAveragePooling2D, 1x1 convolutions,
  sigmoid, multiply), swish, residual Add, MaxPooling2D, AveragePooling2D, Dense.
* ``keras_encoder``: a two-layer transformer encoder (hidden 32, 4 heads of 8, sequence
  8, batch 2): MultiHeadAttention (the second layer causal), LayerNormalization,
  Dense with GELU in its tanh form.
* ``keras_rnn``: LSTM (16 units, the whole sequence out) then GRU (16) over 12 steps of
  8 features, then Dense: tf2onnx writes each recurrent layer as a Loop over the time
  steps.

Without their weights (initializers above 4,096 elements keep only their dims), for the
MACs: ``keras_resnet50``, ``keras_mobilenetv2`` and ``keras_efficientnetb0`` from
``keras.applications`` (``weights=None``, 224x224). ``keras_macs.json`` holds each
one's MACs as counted from the Keras layers' own shapes (Conv2D, DepthwiseConv2D,
Dense), independently of ONNX.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402
from onnx import TensorProto  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OPSET = 13


def say(text: str) -> None:
    sys.stdout.write(text + "\n")


def gelu_tanh(t):
    return keras.activations.gelu(t, approximate=True)


def keras_cnn() -> keras.Model:
    layers = keras.layers
    inp = keras.Input((32, 32, 3))
    x = layers.Rescaling(1 / 127.5, offset=-1)(inp)
    x = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    y = layers.ZeroPadding2D(((0, 1), (0, 1)))(x)  # MobileNetV2's stride-2 blocks
    y = layers.DepthwiseConv2D(3, strides=2, padding="valid", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU(6.0)(y)
    y = layers.Conv2D(16, 1, use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    s = layers.GlobalAveragePooling2D(keepdims=True)(y)  # squeeze and excitation
    s = layers.Conv2D(4, 1, activation="swish")(s)
    s = layers.Conv2D(16, 1, activation="sigmoid")(s)
    y = layers.Multiply()([y, s])
    z = layers.SeparableConv2D(16, 3, padding="same")(y)
    z = layers.BatchNormalization()(z)
    z = layers.Activation("swish")(z)
    y = layers.Add()([y, z])
    y = layers.MaxPooling2D(2)(y)
    y = layers.Conv2D(24, 3, padding="valid", dilation_rate=1)(y)
    y = layers.AveragePooling2D(2, padding="same")(y)
    y = layers.GlobalAveragePooling2D()(y)
    return keras.Model(inp, layers.Dense(10)(y), name="keras_cnn")


def keras_encoder() -> keras.Model:
    layers = keras.layers
    inp = keras.Input((8, 32))
    x = inp
    for i in range(2):
        a = layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x, use_causal_mask=i == 1)
        x = layers.LayerNormalization(epsilon=1e-6)(x + a)
        f = layers.Dense(64, activation=gelu_tanh)(x)
        f = layers.Dense(32)(f)
        x = layers.LayerNormalization(epsilon=1e-6)(x + f)
    return keras.Model(inp, x, name="keras_encoder")


def keras_rnn() -> keras.Model:
    layers = keras.layers
    inp = keras.Input((12, 8))
    x = layers.LSTM(16, return_sequences=True)(inp)
    x = layers.GRU(16)(x)
    return keras.Model(inp, layers.Dense(4)(x), name="keras_rnn")


def randomise(model: keras.Model, seed: int) -> None:
    """Every weight seeded random; BatchNormalization's statistics too (variance
    positive), so folding it changes the weights."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        ws = layer.get_weights()
        if not ws:
            continue
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, var = ws
            ws = [
                rng.uniform(0.5, 1.5, gamma.shape),
                rng.normal(0, 0.2, beta.shape),
                rng.normal(0, 0.2, mean.shape),
                rng.uniform(0.5, 2.0, var.shape),
            ]
        else:
            ws = [
                rng.normal(0, 1 / np.sqrt(max(1, w.shape[0] if w.ndim else 1)), w.shape) for w in ws
            ]
        layer.set_weights([w.astype(np.float32) for w in ws])


def export(model: keras.Model, batch: int, path: Path) -> tf.function:
    spec = [tf.TensorSpec((batch, *model.input_shape[1:]), tf.float32, name="x")]

    @tf.function(input_signature=spec)
    def f(x):
        return model(x, training=False)

    proto, _ = tf2onnx.convert.from_function(f, input_signature=spec, opset=OPSET)
    proto.producer_version = tf2onnx.__version__
    onnx.save(proto, str(path))
    return f


def strip_weights(path: Path) -> None:
    """Drop the values of initializers above 4,096 elements (keep their dims)."""
    m = onnx.load(str(path))
    for t in m.graph.initializer:
        if int(np.prod(t.dims)) > 4096:
            t.ClearField("raw_data")
            t.ClearField("float_data")
            t.data_location = TensorProto.EXTERNAL
            e = t.external_data.add()
            e.key, e.value = "location", f"{path.name}.data"
    onnx.save(m, str(path))


def keras_macs(model: keras.Model) -> int:
    """MACs of the Conv2D, DepthwiseConv2D and Dense layers from their output shapes
    and kernels (batch 1)."""
    total = 0
    for layer in model.layers:
        if isinstance(
            layer, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D, keras.layers.Dense)
        ):
            out = int(np.prod(layer.output.shape[1:]))
            kernel = layer.get_weights()[0].shape
            if isinstance(layer, keras.layers.DepthwiseConv2D):
                total += out * kernel[0] * kernel[1]
            elif isinstance(layer, keras.layers.Conv2D):
                total += out * kernel[0] * kernel[1] * kernel[2] // layer.groups
            else:
                total += out * kernel[0]
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "onnx" / "tf"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    for make, batch, shape, scale in (
        (keras_cnn, 2, (32, 32, 3), 127.5),
        (keras_encoder, 2, (8, 32), 1.0),
        (keras_rnn, 2, (12, 8), 1.0),
    ):
        model = make()
        randomise(model, seed=1)
        f = export(model, batch, out / f"{model.name}.onnx")
        x = (rng.standard_normal((batch, *shape)) * scale).astype(np.float32)
        np.savez_compressed(out / f"{model.name}.npz", x=x, y=np.asarray(f(x)))
        say(f"{model.name}: {(out / f'{model.name}.onnx').stat().st_size:,} B")
    macs = {}
    apps = keras.applications
    for name, make in (
        ("keras_resnet50", apps.ResNet50),
        ("keras_mobilenetv2", apps.MobileNetV2),
        ("keras_efficientnetb0", apps.EfficientNetB0),
    ):
        model = make(weights=None, input_shape=(224, 224, 3), classifier_activation=None)
        path = out / f"{name}.onnx"
        export(model, 1, path)
        strip_weights(path)
        macs[name] = keras_macs(model)
        say(f"{name}: {path.stat().st_size:,} B, {macs[name]:,} MACs")
    (out / "keras_macs.json").write_text(json.dumps(macs, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
