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


if __name__ == "__main__":
    main()
