"""RTL speed benchmark: Icarus wall time of one systolic tile, and Verilog size per block.

Usage::

    AMARANTH_USE_YOSYS=builtin python benchmarks/rtl_speed.py            # 16x16, K=64
    python benchmarks/rtl_speed.py --rows 4 --cols 4 --depth 16          # quick smoke

For each dataflow it emits the array, compiles it with ``iverilog`` and runs ONE tile of
``depth`` steps under cocotb, timing (wall clock) the simulation from the edge that
accepts ``start`` to ``done``; it checks the result against ``int8_matmul`` and the cycle
count against ``systolic_tile_cycles``. Then it prints the emitted Verilog size (bytes,
lines) of every block at its default parameters. The same file is the cocotb test module
(the ``@cocotb.test`` below runs only inside the simulator).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH_ENV = "WIA_RTL_SPEED"

if os.environ.get(BENCH_ENV):  # imported by cocotb inside the simulator
    import cocotb
    import numpy as np
    from cocotb.clock import Clock
    from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge
    from wia_hw.emulator.cycles import systolic_tile_cycles
    from wia_hw.emulator.golden import int8_matmul

    @cocotb.test()
    async def one_tile(dut: object) -> None:
        cfg = json.loads(os.environ[BENCH_ENV])
        rows, cols, depth, df = cfg["rows"], cfg["cols"], cfg["depth"], cfg["dataflow"]
        rng = np.random.default_rng(0)
        if df == "os":
            a, b = rng.integers(-128, 128, (rows, depth)), rng.integers(-128, 128, (depth, cols))
            a_steps, b_steps, expected = list(a.T), list(b), int8_matmul(a, b)
        else:
            a, b = rng.integers(-128, 128, (depth, rows)), rng.integers(-128, 128, (rows, cols))
            a_steps, b_steps, expected = list(a), list(b[::-1]), int8_matmul(a, b)
        a_h = [getattr(dut, f"a__{i}") for i in range(rows)]
        b_h = [getattr(dut, f"b__{j}") for j in range(cols)]
        out_h = [getattr(dut, f"out__{j}") for j in range(cols)]
        for name, v in (("start", 0), ("depth", depth), ("stall", 0), ("ctr_addr", 0),
                        ("ctr_clear", 0), ("rst", 1)):
            getattr(dut, name).value = v
        for h in a_h + b_h:
            h.value = 0
        Clock(dut.clk, 10, unit="ns").start()
        await RisingEdge(dut.clk)
        dut.rst.value = 0
        ai = bi = 0
        rows_out = []
        c, accept, done = 0, None, None
        t0 = time.perf_counter()
        while done is None:
            await FallingEdge(dut.clk)
            c += 1
            dut.start.value = int(accept is None)
            if ai < len(a_steps):
                for h, v in zip(a_h, a_steps[ai], strict=True):
                    h.value = int(v)
            if bi < len(b_steps):
                for h, v in zip(b_h, b_steps[bi], strict=True):
                    h.value = int(v)
            await ReadOnly()
            if int(dut.out_valid.value):
                rows_out.append([h.value.to_signed() for h in out_h])
            if int(dut.done.value):
                done = c
            if accept is None and int(dut.idle.value):
                accept = c + 1  # start is sampled at the next rising edge
            ai += int(dut.a_ready.value)
            bi += int(dut.b_ready.value)
        cycles = done - accept
        wall_s = time.perf_counter() - t0
        assert np.array_equal(np.array(rows_out), expected), "wrong result"
        assert cycles == systolic_tile_cycles(df, rows, cols, depth), cycles
        Path(cfg["report"]).write_text(json.dumps({"wall_s": wall_s, "cycles": cycles}))


def run_tile(rows: int, cols: int, depth: int, dataflow: str, workdir: Path) -> dict:
    from cocotb_tools.runner import get_runner
    from wia_hw.rtl import emit

    build = workdir / f"systolic_{rows}x{cols}_{dataflow}"
    t0 = time.perf_counter()
    sources = emit("systolic_array", {"rows": rows, "cols": cols, "dataflow": dataflow,
                                      "max_depth": max(depth, 1)}, build)
    t_emit = time.perf_counter() - t0
    runner = get_runner("icarus")
    t0 = time.perf_counter()
    runner.build(sources=sources, hdl_toplevel="systolic_array", build_dir=build,
                 always=True, timescale=("1ns", "1ps"))
    t_compile = time.perf_counter() - t0
    report = build / "speed.json"
    cfg = {"rows": rows, "cols": cols, "depth": depth, "dataflow": dataflow,
           "report": str(report)}
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    t0 = time.perf_counter()
    runner.test(hdl_toplevel="systolic_array", test_module="rtl_speed", build_dir=build,
                test_dir=build, extra_env={BENCH_ENV: json.dumps(cfg)})
    t_run = time.perf_counter() - t0
    result = json.loads(report.read_text())
    return {"emit_s": t_emit, "compile_s": t_compile, "vvp_s": t_run, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--depth", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    os.environ.setdefault("COCOTB_LOG_LEVEL", "WARNING")
    os.environ.setdefault("GPI_LOG_LEVEL", "WARNING")
    from wia_hw.emulator.cycles import systolic_tile_cycles
    from wia_hw.rtl import BLOCKS, verilog_text

    if shutil.which("iverilog") is None:
        raise SystemExit("iverilog is not on PATH")
    shape = f"{args.rows}x{args.cols}x{args.depth}"
    print(f"Icarus wall time for one {shape} tile (cocotb driving every cycle):")
    with tempfile.TemporaryDirectory(prefix="wia_rtl_speed_") as tmp:
        for df in ("os", "ws"):
            r = run_tile(args.rows, args.cols, args.depth, df, Path(tmp))
            n = systolic_tile_cycles(df, args.rows, args.cols, args.depth)
            print(f"  {df}: {r['wall_s'] * 1e3:8.1f} ms for {r['cycles']} cycles "
                  f"(= systolic_tile_cycles {n}; {r['cycles'] / r['wall_s']:,.0f} cycles/s)  "
                  f"emit {r['emit_s']:.1f} s, iverilog {r['compile_s']:.1f} s, "
                  f"vvp process {r['vvp_s']:.1f} s")
    print("Emitted Verilog size per block (default parameters, and the array above):")
    cases = [(name, None) for name in BLOCKS] + [
        ("systolic_array", {"rows": args.rows, "cols": args.cols, "dataflow": df})
        for df in ("os", "ws")]
    for name, params in cases:
        text = verilog_text(name, params)
        label = name if params is None else f"{name} {params['rows']}x{params['cols']} " \
                                            f"{params['dataflow']}"
        print(f"  {label:28s} {len(text.encode()):>10,d} bytes {text.count(chr(10)):>8,d} lines")


if __name__ == "__main__":
    main()
