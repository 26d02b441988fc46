"""Published silicon, reproduced from published configuration figures only.

Prints, for each anchor, the measured figure, the emulated one and the error, and the
mean absolute percentage error (MAPE) per anchor set. No constant of the specs
(``specs/tpu-v1.yaml``, ``specs/a100-systolic.yaml``) is tuned to these measurements;
where an anchor is missed, the gap is printed and left standing.

Anchors
-------
TPU v1 (Jouppi et al., ISCA 2017, arXiv 1704.04760):
  * MLP0 (5 FC layers, 20M weights, batch 200): 12.3 TOPS measured
  * MLP1 (4 FC, 5M weights, batch 168): 9.7 TOPS
  * LSTM0 (24 FC + 34 vector layers, 52M weights, batch 64): 3.7 TOPS
  Layer shapes are not published: the stand-ins here are equal square layers with the
  published total weights, layer count and batch (LSTM0's vector layers are elementwise
  sigmoid/tanh/mul on the layer outputs), int8.
  * Section 7's tiling example (the paper's own performance model, not a measurement):
    LSTM1's 600 x 600 matrix takes 9 steps, 18 us, on the 256 x 256 array and 4 steps,
    32 us, on a 512 x 512 one. The TPU's software stores weights as whole array tiles
    (zero-padded), so the matrix is given padded to 768 x 768 and 1024 x 1024.
A100 (LLMCompass, ae/figure5/ab/real_hardware/matmul_A100.csv): 20 fp16 GEMMs timed
  with torch.bmm (median after 3 warm-ups, host launch included).
HBM streaming on a100-systolic: BabelStream on A100-SXM4-80GB, Copy 1,709.4 GB/s and
  Triad 1,724.8 GB/s of 2,039; emulated as the spec stands and with DRAM refresh on.

Usage: python benchmarks/silicon.py [--quick]   (--quick skips the A100 GEMMs over
10^12 MACs, which take minutes to emulate)
"""

from __future__ import annotations

import sys
import time

import wia_hw
from wia_hw.graph import GraphBuilder

# LLMCompass ae/figure5/ab/real_hardware/matmul_A100.csv: M, N, K, measured ms
A100_GEMMS = [
    (64, 12288, 12288, 0.1900),
    (128, 12288, 12288, 0.2003),
    (256, 12288, 12288, 0.3185),
    (512, 12288, 12288, 0.6118),
    (1024, 12288, 12288, 1.1990),
    (2048, 12288, 12288, 2.3586),
    (4096, 12288, 12288, 4.4576),
    (8192, 12288, 12288, 8.6216),
    (16384, 12288, 12288, 17.0307),
    (32768, 12288, 12288, 35.4407),
    (8192, 64, 64, 0.0296),
    (8192, 128, 128, 0.0310),
    (8192, 256, 256, 0.0356),
    (8192, 512, 512, 0.0471),
    (8192, 1024, 1024, 0.0927),
    (8192, 2048, 2048, 0.2818),
    (8192, 4096, 4096, 1.0210),
    (8192, 8192, 8192, 3.9614),
    (8192, 16384, 16384, 15.0087),
    (8192, 32768, 32768, 61.1346),
]
QUICK_MACS = 10**12


def err_pct(emulated: float, measured: float) -> float:
    return (emulated - measured) / measured * 100.0


def fc_stack(name: str, width: int, layers: int, batch: int, vector_layers: int = 0):
    """``layers`` square int8 FC layers of ``width``, and ``vector_layers`` elementwise
    layers (sigmoid, tanh, mul in turn) spread over them."""
    b = GraphBuilder(name, "int8")
    x = b.input("x", (batch, width))
    kinds = ("sigmoid", "tanh", "mul")
    v = 0
    for i in range(layers):
        x = b.op("matmul", f"fc{i}", [x, b.weight(f"w{i}", (width, width))])
        # the vector layers, as evenly as they go over the FC layers
        while v < vector_layers and v * layers < (i + 1) * vector_layers:
            kind = kinds[v % 3]
            ins = [x, x] if kind == "mul" else [x]
            x = b.op(kind, f"v{v}", ins)
            v += 1
    return b.graph()


def tpu_v1() -> list[float]:
    print("TPU v1 (tpu-v1), stand-in layer shapes (see the docstring)")
    errs = []
    for name, layers, weights, batch, vec, measured in (
        ("MLP0", 5, 20_000_000, 200, 0, 12.3),
        ("MLP1", 4, 5_000_000, 168, 0, 9.7),
        ("LSTM0", 24, 52_000_000, 64, 34, 3.7),
    ):
        width = round((weights / layers) ** 0.5)
        g = fc_stack(name.lower(), width, layers, batch, vec)
        r = wia_hw.run(g, device="tpu-v1")
        tops = 2 * width * width * layers * batch / (r.latency_ms * 1e-3) / 1e12
        e = err_pct(tops, measured)
        errs.append(abs(e))
        print(
            f"  {name:6s} {layers:2d} x {width}x{width} int8, batch {batch:3d}: "
            f"measured {measured:5.1f} TOPS, emulated {tops:5.2f} TOPS, error {e:+6.1f}%"
        )
    print("  section 7 tiling example (the paper's model): LSTM1's 600x600 matrix")
    for side, padded, steps, paper_us in ((256, 768, 9, 18.0), (512, 1024, 4, 32.0)):
        over = {}
        if side != 256:  # the paper's hypothetical 512x512 array, its FIFO 4 tiles deep
            tile = side * side
            over = {
                "compute.array.rows": side,
                "compute.array.cols": side,
                "memory.l1.size_kib": 4 * tile // 1024,
                "memory.block_bytes": tile,
            }
        b = GraphBuilder("lstm1_matrix", "int8")
        x = b.input("x", (64, padded))
        b.op("matmul", "fc", [x, b.weight("w", (padded, padded))])
        r = wia_hw.run(b.graph(), device="tpu-v1", overrides=over)
        us = r.latency_ms * 1e3
        e = err_pct(us, paper_us)
        errs.append(abs(e))
        print(
            f"    {side}x{side} array: {steps} steps, paper {paper_us:4.1f} us, "
            f"emulated {us:5.1f} us, error {e:+6.1f}%"
        )
    print(f"  TPU v1 MAPE {sum(errs) / len(errs):.1f}% over {len(errs)} anchors")
    return errs


def a100(quick: bool) -> list[float]:
    print("A100 fp16 GEMMs (a100-systolic) against LLMCompass's real-hardware table")
    errs = []
    for m, n, k, measured in A100_GEMMS:
        if quick and m * n * k > QUICK_MACS:
            print(f"  {m:5d}x{n:5d}x{k:5d}: skipped (--quick)")
            continue
        t0 = time.perf_counter()
        r = wia_hw.run("gemm", M=m, N=n, K=k, device="a100-systolic")
        wall = time.perf_counter() - t0
        e = err_pct(r.latency_ms, measured)
        errs.append(abs(e))
        tflops = 2 * m * n * k / (r.latency_ms * 1e-3) / 1e12
        print(
            f"  {m:5d}x{n:5d}x{k:5d}: measured {measured:8.4f} ms, emulated "
            f"{r.latency_ms:8.4f} ms ({tflops:5.1f} TFLOPS), error {e:+6.1f}%  "
            f"[{wall:.1f} s wall]",
            flush=True,
        )
    print(f"  A100 GEMM MAPE {sum(errs) / len(errs):.1f}% over {len(errs)} shapes")
    return errs


def hbm_streaming() -> list[float]:
    """Copy and Triad over 128 MiB arrays, as the spec stands, and with the DRAM
    refresh of ``benchmark_operation``'s ``dram_refresh`` variation source on (JEDEC
    HBM2 all-bank refresh of an 8 Gb die: tREFI 3.9 us, tRFC 350 ns; BenchmarkConfig's
    defaults, set before this benchmark existed): the spec itself does not model refresh.
    Returns the errors with refresh on."""
    from wia_hw.bench import BenchmarkConfig
    from wia_hw.bench._variation import install

    print("HBM streaming on a100-systolic (BabelStream, A100-SXM4-80GB)")
    n = 1 << 25  # 2^25 fp32 elements: 128 MiB arrays, far over the 40 MiB L2
    errs = []
    for name, measured, inputs in (("Copy", 1709.4, 1), ("Triad", 1724.8, 2)):
        b = GraphBuilder(name.lower(), "fp32")
        xs = [b.input(f"x{i}", (n // 1024, 1024)) for i in range(inputs)]
        if inputs == 1:
            b.op("cast", "copy", xs, dtype="fp32")
        else:
            b.op("add", "triad", xs)  # a = b + s * c: two arrays in, one out
        nbytes = (inputs + 1) * n * 4
        for refresh in (False, True):
            ctx = wia_hw.open_device("a100-systolic")
            if refresh:
                cfg = BenchmarkConfig(variation_sources=("dram_refresh",))
                install(ctx.device.memory, cfg, ctx.spec.clock_ghz)
            r = ctx.run(b.graph())
            launch_s = ctx.spec.compute.control.launch_overhead_ns * 1e-9
            secs = r.latency_ms * 1e-3 - launch_s  # BabelStream times the kernel alone
            gbs = nbytes / secs / 1e9
            e = err_pct(gbs, measured)
            if refresh:
                errs.append(abs(e))
            print(
                f"  {name:5s} {'with refresh' if refresh else 'spec as is  '}: measured "
                f"{measured:7.1f} GB/s, emulated {gbs:7.1f} GB/s ({gbs / 2039 * 100:4.1f}% "
                f"of 2,039), error {e:+6.1f}%"
            )
    return errs


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    tpu = tpu_v1()
    print()
    gem = a100(quick)
    print()
    hbm = hbm_streaming()
    print()
    print(
        f"summary: TPU v1 MAPE {sum(tpu) / len(tpu):.1f}% (max {max(tpu):.1f}%), "
        f"A100 GEMM MAPE {sum(gem) / len(gem):.1f}% (max {max(gem):.1f}%), "
        f"HBM streaming (with refresh) max error {max(hbm):.1f}%"
    )


if __name__ == "__main__":
    main()
