"""How long importing a 24-layer BERT-Large ONNX export takes (target: at most 2 s).

The graphs are ``tests/data/onnx/bert_large_24l.{legacy,dynamo}.onnx``:
transformers' BertModel at BERT-Large's shape with all 24 layers, exported by both
torch exporters with symbolic ``batch`` and ``seq`` and the weights stripped
(``scripts/make_onnx_fixtures.py``). Each import runs the whole pipeline: shape
inference, folding of the shape and mask chains, mapping and pattern recognition.

    python benchmarks/onnx_import.py [--repeat 5] [--batch 1] [--seq 128]

Prints, per exporter, the first import's wall time (in a fresh process it also pays
for loading ``onnx.reference``), then the best and median over the repeats,
how many nodes folded, and the MACs against ``24 * b * s * (12 h^2 + 2 s h)``.

Then the quantised exports (``tests/data/onnx/quant/``: ONNX Runtime's static QDQ
per-channel and dynamic quantisation of the ResNet-18 and 2-layer BERT exports,
``scripts/make_quant_fixtures.py``): import time, how many GEMMs read integer
operands, weight bytes and wia-npu latency against the float export's (batch 1, the
BERT at ``--seq``).

Last, the other exporters' files: Keras models through tf2onnx, Hugging Face
Optimum's exports (BERT at batch 8 and sequence 128; LLaMA decoding one token after
63 cached ones at batch 8) and the ONNX Model Zoo's classic CNNs: import time, ops,
MACs and wia-npu latency against the roofline floor.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from wia_hw.workloads import from_onnx

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "onnx"
TARGET_S = 2.0
LAYERS, H = 24, 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    dims = {"batch": a.batch, "seq": a.seq}
    want = LAYERS * a.batch * a.seq * (12 * H * H + 2 * a.seq * H)
    for exporter in ("legacy", "dynamo"):
        path = DATA / f"bert_large_24l.{exporter}.onnx"
        if not path.exists():
            print(f"{path.name}: missing (run scripts/make_onnx_fixtures.py)")
            continue
        t0 = time.perf_counter()
        from_onnx(path, dims=dims)  # the first import also loads onnx.reference
        first = time.perf_counter() - t0
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            g = from_onnx(path, dims=dims)
            times.append(time.perf_counter() - t0)
        best, med = min(times), statistics.median(times)
        print(
            f"{path.name}: first {first:.3f} s, then best {best:.3f} s, median "
            f"{med:.3f} s over {a.repeat} "
            f"({'within' if med <= TARGET_S else 'OVER'} the {TARGET_S:.0f} s target); "
            f"{g.params['folded_nodes']} nodes folded, {len(g.ops)} ops; "
            f"{g.macs() / 1e9:.3f} GMAC (derived {want / 1e9:.3f}, "
            f"{'equal' if g.macs() == want else 'DIFFERENT'})"
        )

    quantised(a.seq)
    other_exporters()


def other_exporters() -> None:
    """Import time and wia-npu latency of the other exporters' files: Keras through
    tf2onnx (``tests/data/onnx/tf``), Hugging Face Optimum (``optimum``) and the ONNX
    Model Zoo's classic CNNs as the onnx package ships them (Caffe2, opset 9)."""
    import json

    import onnx

    import wia_hw

    opt_dims = {"sequence_length": 1, "past_sequence_length": 63}
    cases = [
        (DATA / "tf" / f"{n}.onnx", {})
        for n in json.loads((DATA / "tf" / "keras_macs.json").read_text())
    ]
    cases += [(DATA / "tf" / "keras_rnn.onnx", {}), (DATA / "tf" / "keras_encoder.onnx", {})]
    cases += [
        (DATA / "optimum" / "bert_cls.onnx", {"batch": 8, "dims": {"sequence_length": 128}}),
        (DATA / "optimum" / "llama_past.onnx", {"batch": 8, "dims": opt_dims}),
    ]
    zoo = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    cases += [(p, {}) for p in sorted(zoo.glob("light_*.onnx"))]
    for path, kw in cases:
        t0 = time.perf_counter()
        g = from_onnx(path, **kw)
        took = time.perf_counter() - t0
        r = wia_hw.run(g)
        print(
            f"{path.parent.name}/{path.name}: imported in {took:.3f} s, {len(g.ops)} ops, "
            f"{g.macs() / 1e9:.3f} GMAC; wia-npu {r.latency_ms:.4f} ms "
            f"(roofline floor {r.roofline_floor_ms:.4f} ms)"
        )


def quantised(seq: int) -> None:
    import wia_hw
    from wia_hw.graph import GEMM_KINDS

    for name, dims in (("resnet18", {"batch": 1}), ("bert_large_2l", {"batch": 1, "seq": seq})):
        f = from_onnx(DATA / f"{name}.legacy.onnx", dims=dims)
        f_ms = wia_hw.run(f).latency_ms
        for how in ("qdq_s8_pc", "dyn"):
            path = DATA / "quant" / f"{name}.{how}.onnx"
            t0 = time.perf_counter()
            q = from_onnx(path, dims=dims)
            took = time.perf_counter() - t0
            gemms = [o for o in q.ops if o.kind in GEMM_KINDS]
            ints = sum(
                all(i in q.quant or q.tensors[i].dtype == "int8" for i in o.inputs[:2])
                for o in gemms
            )
            q_ms = wia_hw.run(q).latency_ms
            print(
                f"{path.name}: imported in {took:.3f} s; {ints}/{len(gemms)} GEMMs on int8; "
                f"weights {q.weight_bytes / 2**20:.1f} MiB (fp32 export "
                f"{f.weight_bytes / 2**20:.1f}); wia-npu {q_ms:.4f} ms against "
                f"{f_ms:.4f} ms fp32 ({f_ms / q_ms:.2f}x); MACs "
                f"{'equal' if q.macs() == f.macs() else 'DIFFERENT'}"
            )


if __name__ == "__main__":
    main()
