"""ResNet-50 v1.5 image-classification inference graph.

Topology (He et al. 2016, with the v1.5 change of torchvision and NVIDIA: the stride
of a downsampling bottleneck is on its 3x3 conv, not its first 1x1):

* stem: conv 7x7/2 (64) + ReLU, max pool 3x3/2;
* four stages of bottlenecks ``1x1 (w) -> 3x3 (w, stride) -> 1x1 (4w)`` with
  ``w = 64, 128, 256, 512`` and ``3, 4, 6, 3`` blocks; the first block of each stage
  has a 1x1 projection shortcut (stride 1 in stage 1, 2 after), the others an
  identity shortcut; ``out = relu(branch + shortcut)``;
* global average pool, flatten, fully connected 2048 -> 1000.

Batch norm is folded into the preceding conv at inference (its scale into the
weights, its shift into a per-channel bias), so every conv has a bias and there is no
batch-norm op. About 4.1 GMAC per 224x224 image.

Groups: ``conv`` (every conv and the ReLU fused after it), ``pool`` (max pool and
global average pool), ``residual`` (the shortcut adds and the ReLU after them),
``output`` (flatten and the classifier). With ``precision="int8"`` activations and
weights are int8 throughout (int32 conv biases, int32 accumulation, requantising
epilogues), as int8 CNN engines run them; only the logits are fp16.
"""

from __future__ import annotations

from ..graph import Graph, GraphBuilder
from ._common import check_int, precision_dtypes

#: (bottleneck width, blocks, stride of the first block) per stage.
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
EXPANSION = 4
CLASSES = 1000


def _conv(
    b: GraphBuilder, name: str, x: str, out_ch: int, k: int, stride: int = 1, *, relu: bool = True
) -> str:
    dt = b.tensor(x).dtype
    w = b.weight(f"{name}.weight", (out_ch, b.shape(x)[1], k, k), dt)
    bias = b.weight(f"{name}.bias", (out_ch,), "int32" if dt == "int8" else dt)
    y = b.op("conv2d", name, [x, w, bias], group="conv", stride=stride, pad=k // 2)
    return b.op("relu", f"{name}.relu", [y], group="conv") if relu else y


def resnet50(batch: int = 1, precision: str = "fp16", image: int = 224) -> Graph:
    """ResNet-50 v1.5 inference on ``batch`` RGB images of ``image x image`` pixels.

    ``batch >= 1``; ``image >= 32`` (five stride-2 steps); ``precision`` one of fp32,
    fp16, bf16, int8. Returns a graph with ``sequences = batch`` (images) and
    ``params`` model, batch, image, precision. Bad arguments raise
    :class:`~wia_hw.WorkloadError` naming the argument and its value.
    """
    w = "resnet50"
    batch = check_int(w, "batch", batch)
    image = check_int(w, "image", image, 32)
    gd, fd = precision_dtypes(w, precision)
    b = GraphBuilder(w, gd)

    x = b.input("image", (batch, 3, image, image), gd)
    x = _conv(b, "stem.conv", x, 64, 7, 2)
    x = b.op("maxpool", "stem.maxpool", [x], group="pool", kernel=3, stride=2, pad=1)
    for s, (width, blocks, stride) in enumerate(STAGES, start=1):
        for i in range(blocks):
            p = f"layer{s}.{i}"
            st = stride if i == 0 else 1
            y = _conv(b, f"{p}.conv1", x, width, 1)
            y = _conv(b, f"{p}.conv2", y, width, 3, st)
            y = _conv(b, f"{p}.conv3", y, width * EXPANSION, 1, relu=False)
            if i == 0:
                x = _conv(b, f"{p}.downsample", x, width * EXPANSION, 1, st, relu=False)
            x = b.op("add", f"{p}.residual", [y, x], group="residual")
            x = b.op("relu", f"{p}.residual_relu", [x], group="residual")
    x = b.op("global_avgpool", "avgpool", [x], group="pool")
    x = b.op("reshape", "flatten", [x], group="output", shape=(batch, b.shape(x)[1]))
    fc_w = b.weight("fc.weight", (b.shape(x)[1], CLASSES), gd)
    fc_b = b.weight("fc.bias", (CLASSES,), "int32" if gd == "int8" else gd)
    b.op("linear", "fc", [x, fc_w, fc_b], group="output", dtype=fd)
    return b.graph(
        sequences=batch,
        params={"model": w, "batch": batch, "image": image, "precision": precision.lower()},
    )
