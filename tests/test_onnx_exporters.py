"""ONNX import of real exporter output: torchvision CNNs and transformers models,
exported by both torch exporters (``legacy`` TorchScript and ``dynamo``), committed
weight-stripped under ``tests/data/onnx/`` by ``scripts/make_onnx_fixtures.py``.

MACs are checked against figures derived without the importer: torchvision's
published operation counts (its weights' ``_ops`` metadata, GMACs to 3 decimals) and,
for the transformers, ``layers * b * s * (12 h^2 + 2 s h)``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import wia_hw
from wia_hw.workloads import build, from_onnx

pytest.importorskip("onnx")

DATA = Path(__file__).parent / "data" / "onnx"
EXPORTERS = ("legacy", "dynamo")
#: torchvision's published GMACs (``weights.meta["_ops"]``) at 224 x 224.
PUBLISHED_GMAC = {
    "resnet18": 1.814,
    "resnet50": 4.089,
    "mobilenet_v2": 0.301,
    "mobilenet_v3_large": 0.217,
    "efficientnet_b0": 0.386,
}
#: The fixtures' transformer shapes (scripts/make_onnx_fixtures.py).
BERT_H, BERT_LAYERS = 1024, 2
GPT2_H, GPT2_LAYERS = 768, 2
SDPA_H = 256
#: Ops that only compute shapes, indices or masks: none may survive folding (a Where
#: may: SDPA's NaN guard on the softmax is a run-time select).
FOLDED = {"Shape", "ConstantOfShape", "Range", "Equal", "Expand", "Unsqueeze", "Trilu"}


def fixture(name: str, exporter: str) -> Path:
    return DATA / f"{name}.{exporter}.onnx"


def fixtures_present() -> list[tuple[str, str]]:
    names = list(PUBLISHED_GMAC) + [
        "bert_large_2l",
        "gpt2_2l",
        "bert_sdpa_2l",
        "gpt2_sdpa_2l",
        "bert_mask_1l",
        "gpt2_mask_1l",
    ]
    return [(n, e) for n in names for e in EXPORTERS if fixture(n, e).exists()]


def transformer_macs(layers: int, b: int, s: int, h: int) -> int:
    """Per layer: Q, K, V, output projections 4 h^2 and the FFN 8 h^2 per token, and
    q k^T plus p v, 2 s h per token."""
    return layers * b * s * (12 * h * h + 2 * s * h)


def test_every_fixture_is_there():
    assert len(fixtures_present()) == 22
    assert sum(p.stat().st_size for p in DATA.glob("*.onnx")) < 4 << 20


@pytest.mark.parametrize("name", list(PUBLISHED_GMAC))
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_cnn_macs_match_the_published_counts(name, exporter):
    g = from_onnx(fixture(name, exporter), dims={"batch": 1})
    assert round(g.macs() / 1e9, 3) == PUBLISHED_GMAC[name]
    assert g.tensors[next(iter(t for t in g.tensors if g.tensors[t].kind == "input"))].shape == (
        1,
        3,
        224,
        224,
    )


@pytest.mark.parametrize("name", list(PUBLISHED_GMAC))
def test_both_exporters_give_the_same_work(name):
    a = from_onnx(fixture(name, "legacy"), dims={"batch": 2})
    b = from_onnx(fixture(name, "dynamo"), dims={"batch": 2})
    assert a.macs() == b.macs() == 2 * from_onnx(fixture(name, "legacy"), dims={"batch": 1}).macs()
    # the dynamo exporter's optimiser drops the all-zero biases that BN folding gives
    # with random weights (zero mean, zero shift): at most 1 % of the bytes
    assert b.weight_bytes <= a.weight_bytes <= 1.01 * b.weight_bytes


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("b,s", [(1, 128), (2, 64)])
def test_bert_macs_follow_the_layer_formula(exporter, b, s):
    g = from_onnx(fixture("bert_large_2l", exporter), dims={"batch": b, "seq": s})
    assert g.macs() == transformer_macs(BERT_LAYERS, b, s, BERT_H)
    kinds = [o.kind for o in g.ops]
    # recognised: 2 attention chains, 2 GELUs, 2 x 2 + 1 layer norms
    assert kinds.count("softmax") == 2 and kinds.count("gelu") == 2
    assert kinds.count("layer_norm") == 2 * BERT_LAYERS + 1
    assert all(
        o.attrs.get("transpose_b")
        for o in g.ops
        if o.kind == "bmm" and o.outputs[0] in {p.inputs[0] for p in g.ops if p.kind == "softmax"}
    )


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_gpt2_macs_and_causal_attention(exporter):
    path = fixture("gpt2_2l", exporter)
    if not path.exists():
        pytest.skip(f"{path.name} was not exported")
    g = from_onnx(path, dims={"batch": 2, "seq": 32})
    assert g.macs() == transformer_macs(GPT2_LAYERS, 2, 32, GPT2_H)
    soft = [o for o in g.ops if o.kind == "softmax"]
    assert len(soft) == GPT2_LAYERS and all(o.attrs.get("causal") for o in soft)
    # gelu_new, the tanh form, is recognised too
    assert [o.kind for o in g.ops].count("gelu") == GPT2_LAYERS


@pytest.mark.parametrize("name,causal", [("bert_sdpa_2l", False), ("gpt2_sdpa_2l", True)])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_sdpa_attention_is_recognised(name, exporter, causal):
    """transformers' default attention (SDPA): q and k^T each scaled by
    sqrt(1/sqrt(dh)), softmax guarded by where(isnan(p), 0, p); H 256, 4 heads."""
    g = from_onnx(fixture(name, exporter), dims={"batch": 2, "seq": 32})
    raw = from_onnx(fixture(name, exporter), dims={"batch": 2, "seq": 32}, recognise=False)
    assert g.macs() == raw.macs() == transformer_macs(2, 2, 32, SDPA_H)
    assert g.flops() == raw.flops()
    scores = [o for o in g.ops if o.kind == "bmm" and o.attrs.get("transpose_b")]
    assert len(scores) == 2
    assert all(o.attrs["scale"] == pytest.approx(1 / math.sqrt(SDPA_H // 4)) for o in scores)
    soft = [o for o in g.ops if o.kind == "softmax"]
    assert [bool(o.attrs.get("causal")) for o in soft] == [causal, causal]
    assert not any(o.kind == "isnan" for o in g.ops)


@pytest.mark.parametrize("name,ffn", [("bert_mask_1l", 256), ("gpt2_mask_1l", 512)])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_attention_mask_input(name, exporter, ffn):
    """An attention_mask input (H 128, 1 layer): the padding-mask arithmetic is
    run-time work; attention is still recognised, its softmax marked ``masked``."""
    b, s, h = 2, 16, 128
    g = from_onnx(fixture(name, exporter), dims={"batch": b, "seq": s})
    # per token: Q, K, V, output projections 4 h^2, the FFN 2 h ffn; attention 2 s h
    assert g.macs() == b * s * (4 * h * h + 2 * h * ffn + 2 * s * h)
    assert {g.tensors[t].shape for t in g.tensors if g.tensors[t].kind == "input"} == {(b, s)}
    soft = [o for o in g.ops if o.kind == "softmax"]
    assert len(soft) == 1 and soft[0].attrs.get("masked")
    raw = from_onnx(fixture(name, exporter), dims={"batch": b, "seq": s}, recognise=False)
    assert g.flops() == raw.flops()


@pytest.mark.parametrize("name", ["bert_large_2l", "gpt2_2l", "bert_sdpa_2l", "gpt2_sdpa_2l"])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_recognised_graph_has_the_same_flops(name, exporter):
    path = fixture(name, exporter)
    if not path.exists():
        pytest.skip(f"{path.name} was not exported")
    g = from_onnx(path, dims={"batch": 1, "seq": 64})
    raw = from_onnx(path, dims={"batch": 1, "seq": 64}, recognise=False)
    assert g.flops() == raw.flops() and g.macs() == raw.macs()
    assert len(g.ops) < len(raw.ops)


def test_no_shape_op_survives_folding():
    import onnx

    from wia_hw.workloads._onnx import _prepare

    for name, exporter in fixtures_present():
        if "_mask_" in name:
            continue  # a run-time attention_mask: its Expand and Equal stay
        dims = {"batch": 1, "seq": 128}
        proto, *_ = _prepare(onnx, fixture(name, exporter), None, dims)
        left = {n.op_type for n in proto.graph.node} & FOLDED
        assert not left, (name, exporter, left)


def test_bert_large_shape_has_the_builder_latency():
    """BertModel at BERT-Large's shape (2 layers), imported, against the ``bert-large``
    builder with 2 layers, both fp32 on wia-npu: within 5 %. What differs: the
    builder's fused QKV projection and its view-only head split against the export's
    three projections and copying head transposes, and the builder's pooler and
    classifier (the export returns the last hidden state)."""
    b, s = 2, 128
    g = from_onnx(fixture("bert_large_2l", "legacy"), dims={"batch": b, "seq": s})
    ref = build("bert-large", batch=b, seq=s, layers=BERT_LAYERS, precision="fp32")
    got, want = wia_hw.run(g).latency_ms, wia_hw.run(ref).latency_ms
    assert abs(got / want - 1) < 0.05, (got, want)


def test_imported_bert_attention_runs_on_the_transformer_engine():
    g = from_onnx(fixture("bert_large_2l", "dynamo"), dims={"batch": 1, "seq": 128})
    ctx = wia_hw.open_device("wia-npu")
    wia_hw.register_device_extension(ctx, "transformer_engine")
    r = ctx.run(g)
    te = [k for k in r.kernels if k.provider == "transformer_engine"]
    assert len(te) == BERT_LAYERS


def test_torch_export_route_recorded_macs_match():
    """scripts/make_onnx_fixtures.py recorded, with torch installed, the MACs of
    ``wia_hw.from_torch`` (torch.export) for each model; the ONNX route must agree."""
    record = json.loads((DATA / "torch_macs.json").read_text())
    assert set(PUBLISHED_GMAC) <= set(record)
    for name, r in record.items():
        seq = {"seq": r["shape"][0][1]} if name.startswith(("bert", "gpt2")) else {}
        g = from_onnx(fixture(name, "legacy"), dims={"batch": r["shape"][0][0], **seq})
        assert g.macs() == r["torch_export_macs"] == r["onnx_legacy_macs"], name


def test_from_torch_matches_the_onnx_route():
    torch = pytest.importorskip("torch")
    tvm = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    model = tvm.resnet18(weights=None)
    g = wia_hw.from_torch(model, (torch.randn(1, 3, 224, 224),))
    assert g.params["source"] == "torch.export"
    assert g.macs() == from_onnx(fixture("resnet18", "legacy"), dims={"batch": 1}).macs()


def test_from_torch_errors():
    torch = pytest.importorskip("torch")

    class Bad(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent branch: torch.export refuses it
                return x + 1
            return x - 1

    with pytest.raises(
        wia_hw.WorkloadError,
        match=r"^from_torch: expected a "
        r"torch.nn.Module, got str$",
    ):
        wia_hw.from_torch("resnet", (torch.zeros(1),))
    with pytest.raises(
        wia_hw.WorkloadError,
        match=r"^from_torch: example_args must be "
        r"a tuple of example inputs, got Tensor$",
    ):
        wia_hw.from_torch(torch.nn.ReLU(), torch.zeros(1))
    with pytest.raises(
        wia_hw.WorkloadError,
        match=r"^from_torch: torch.export of Bad "
        r"failed: ",
    ):
        wia_hw.from_torch(Bad(), (torch.zeros(2),))


def test_from_torch_translation_and_onnxscript_errors(monkeypatch):
    import sys

    torch = pytest.importorskip("torch")

    def refuse(*args, **kwargs):
        raise RuntimeError("no translation for aten::foo\nmore lines")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    with pytest.raises(
        wia_hw.WorkloadError,
        match=r"^from_torch: translating the "
        r"torch.export program of ReLU to ONNX "
        r"failed: no translation for aten::foo$",
    ):
        wia_hw.from_torch(torch.nn.ReLU(), (torch.zeros(2),))
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(
        wia_hw.WorkloadError,
        match=r"^from_torch needs onnxscript "
        r"\(torch's ONNX translator\): pip "
        r"install 'wia-hw\[torch\]'$",
    ):
        wia_hw.from_torch(torch.nn.ReLU(), (torch.zeros(2),))


def test_from_torch_without_torch_is_one_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(
        wia_hw.WorkloadError,
        match=r"^from_torch needs PyTorch: pip "
        r"install 'wia-hw\[torch\]'$",
    ):
        wia_hw.from_torch(object(), ())


def test_sequences_follow_the_batch_dim():
    assert from_onnx(fixture("resnet18", "legacy"), dims={"batch": 3}).sequences == 3
    assert from_onnx(fixture("resnet18", "legacy"), batch=2).sequences == 2
