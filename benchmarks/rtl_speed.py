"""RTL speed benchmark: Icarus wall time of systolic tiles, and Verilog size per block.

Usage::

    AMARANTH_USE_YOSYS=builtin python benchmarks/rtl_speed.py            # 16x16, K=64
    python benchmarks/rtl_speed.py --rows 4 --cols 4 --depth 16          # quick smoke
    python benchmarks/rtl_speed.py --rows 128 --cols 128 --depth 128 --dataflows os

For each dataflow it emits the array, compiles it with ``iverilog`` and runs under
cocotb ONE tile of ``depth`` steps, then (pipelined array) a back-to-back sequence of
``--sequence`` tiles, timing (wall clock) each simulation from the edge that accepts the
first ``start`` to the last ``done``; it checks every result against ``int8_matmul``,
every tile's cycles against ``systolic_tile_cycles`` and the accept spacing against
``systolic_issue_interval``. It prints emit / compile / simulation times and the size of
the emitted Verilog. ``--sizes`` also prints the Verilog size of every block at its
default parameters. Not run in CI (a 128 x 128 array takes minutes to emit and compile).
The same file is the cocotb test module (the ``@cocotb.test`` below runs only inside
the simulator).
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
    from wia_hw.emulator.cycles import systolic_issue_interval, systolic_tile_cycles
    from wia_hw.emulator.golden import int8_matmul

    def _tile(rng, rows, cols, depth, df):
        if df == "os":
            a, b = rng.integers(-128, 128, (rows, depth)), rng.integers(-128, 128, (depth, cols))
            return list(a.T), list(b), int8_matmul(a, b)
        a, b = rng.integers(-128, 128, (depth, rows)), rng.integers(-128, 128, (rows, cols))
        return list(a), list(b[::-1]), int8_matmul(a, b)

    async def _run(dut, rows, cols, depths, df, pipelined):
        """Tiles back to back (start held high); returns (wall_s, first accept to last
        done in cycles)."""
        rng = np.random.default_rng(len(depths))
        tiles = [_tile(rng, rows, cols, d, df) for d in depths]
        a_h = [getattr(dut, f"a__{i}") for i in range(rows)]
        b_h = [getattr(dut, f"b__{j}") for j in range(cols)]
        out_h = [getattr(dut, f"out__{j}") for j in range(cols)]
        ai = [0] * len(tiles)
        bi = [0] * len(tiles)
        outs = [[] for _ in tiles]
        accepts, dones = [], []
        c = 0
        t0 = time.perf_counter()
        while len(dones) < len(tiles):
            await FallingEdge(dut.clk)
            c += 1
            n_acc = len(accepts)
            dut.start.value = int(n_acc < len(tiles))
            dut.depth.value = depths[n_acc] if n_acc < len(tiles) else 1
            ka = next((k for k in range(len(tiles)) if ai[k] < len(tiles[k][0])), None)
            kb = next((k for k in range(len(tiles)) if bi[k] < len(tiles[k][1])), None)
            if ka is not None:
                for h, v in zip(a_h, tiles[ka][0][ai[ka]], strict=True):
                    h.value = int(v)
            if kb is not None:
                for h, v in zip(b_h, tiles[kb][1][bi[kb]], strict=True):
                    h.value = int(v)
            await ReadOnly()
            if int(dut.out_valid.value):
                outs[len(dones)].append([h.value.to_signed() for h in out_h])
            if int(dut.done.value):
                dones.append(c)
            if n_acc < len(tiles) and int(dut.idle.value):
                accepts.append(c + 1)  # start is sampled at the next rising edge
            if int(dut.a_ready.value):
                ai[ka] += 1
            if int(dut.b_ready.value):
                bi[kb] += 1
        wall_s = time.perf_counter() - t0
        for k, (_, _, expected) in enumerate(tiles):
            assert np.array_equal(np.array(outs[k]), expected), f"tile {k}: wrong result"
            assert dones[k] - accepts[k] == systolic_tile_cycles(df, rows, cols, depths[k])
        for k in range(1, len(tiles)):
            assert accepts[k] - accepts[k - 1] == systolic_issue_interval(
                df, rows, cols, depths[k - 1], depths[k], pipelined=pipelined
            )
        return wall_s, dones[-1] - accepts[0]

    @cocotb.test()
    async def tiles(dut: object) -> None:
        cfg = json.loads(os.environ[BENCH_ENV])
        rows, cols, depth, df = cfg["rows"], cfg["cols"], cfg["depth"], cfg["dataflow"]
        for name, v in (
            ("start", 0),
            ("depth", depth),
            ("stall", 0),
            ("ctr_addr", 0),
            ("ctr_clear", 0),
            ("rst", 1),
        ):
            getattr(dut, name).value = v
        for i in range(rows):
            getattr(dut, f"a__{i}").value = 0
        for j in range(cols):
            getattr(dut, f"b__{j}").value = 0
        Clock(dut.clk, 10, unit="ns").start()
        await RisingEdge(dut.clk)
        dut.rst.value = 0
        report = {}
        report["one"] = await _run(dut, rows, cols, [depth], df, cfg["pipelined"])
        if cfg["sequence"] > 1:
            report["seq"] = await _run(
                dut, rows, cols, [depth] * cfg["sequence"], df, cfg["pipelined"]
            )
        Path(cfg["report"]).write_text(json.dumps(report))


def run_tiles(
    rows: int, cols: int, depth: int, dataflow: str, pipelined: bool, sequence: int, workdir: Path
) -> dict:
    from cocotb_tools.runner import get_runner
    from wia_hw.rtl import emit

    build = workdir / f"systolic_{rows}x{cols}_{dataflow}_{'pipe' if pipelined else 'single'}"
    t0 = time.perf_counter()
    sources = emit(
        "systolic_array",
        {
            "rows": rows,
            "cols": cols,
            "dataflow": dataflow,
            "max_depth": max(depth, 1),
            "pipelined": pipelined,
        },
        build,
    )
    t_emit = time.perf_counter() - t0
    runner = get_runner("icarus")
    t0 = time.perf_counter()
    runner.build(
        sources=sources,
        hdl_toplevel="systolic_array",
        build_dir=build,
        always=True,
        timescale=("1ns", "1ps"),
    )
    t_compile = time.perf_counter() - t0
    report = build / "speed.json"
    cfg = {
        "rows": rows,
        "cols": cols,
        "depth": depth,
        "dataflow": dataflow,
        "pipelined": pipelined,
        "sequence": sequence,
        "report": str(report),
    }
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    t0 = time.perf_counter()
    runner.test(
        hdl_toplevel="systolic_array",
        test_module="rtl_speed",
        build_dir=build,
        test_dir=build,
        extra_env={BENCH_ENV: json.dumps(cfg)},
    )
    t_run = time.perf_counter() - t0
    result = json.loads(report.read_text())
    return {
        "emit_s": t_emit,
        "compile_s": t_compile,
        "vvp_s": t_run,
        "verilog_bytes": sources[0].stat().st_size,
        "verilog_lines": sources[0].read_text().count("\n"),
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--dataflows", default="os,ws", help="comma-separated")
    parser.add_argument(
        "--sequence", type=int, default=4, help="tiles in the back-to-back pipelined run (1: none)"
    )
    parser.add_argument(
        "--sizes", action="store_true", help="also print every block's Verilog size at its defaults"
    )
    args = parser.parse_args()
    for name, lo, hi in (
        ("rows", 1, 256),
        ("cols", 1, 256),
        ("depth", 1, 65536),
        ("sequence", 1, 64),
    ):
        if not lo <= getattr(args, name) <= hi:
            parser.error(f"--{name} must be in {lo}..{hi}, got {getattr(args, name)}")
    bad = [d for d in args.dataflows.split(",") if d not in ("os", "ws")]
    if bad:
        parser.error(f"--dataflows: {', '.join(bad)} is not os or ws")
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    os.environ.setdefault("COCOTB_LOG_LEVEL", "WARNING")
    os.environ.setdefault("GPI_LOG_LEVEL", "WARNING")
    from wia_hw.emulator.cycles import systolic_sequence_cycles, systolic_tile_cycles
    from wia_hw.rtl import BLOCKS, verilog_text

    if shutil.which("iverilog") is None:
        raise SystemExit("iverilog is not on PATH")
    R, C, D = args.rows, args.cols, args.depth
    print(f"Icarus wall time, {R}x{C} array, depth {D} (cocotb driving every cycle):")
    with tempfile.TemporaryDirectory(prefix="wia_rtl_speed_") as tmp:
        for df in args.dataflows.split(","):
            for pipelined in (False, True):
                seq = args.sequence if pipelined else 1
                r = run_tiles(R, C, D, df, pipelined, seq, Path(tmp))
                wall, cyc = r["one"]
                n = systolic_tile_cycles(df, R, C, D)
                print(
                    f"  {df} {'pipelined' if pipelined else 'single   '}: Verilog "
                    f"{r['verilog_bytes']:,d} bytes / {r['verilog_lines']:,d} lines; emit "
                    f"{r['emit_s']:.1f} s, iverilog {r['compile_s']:.1f} s, vvp process "
                    f"{r['vvp_s']:.1f} s"
                )
                print(
                    f"      one tile: {wall * 1e3:9.1f} ms for {cyc} cycles (= "
                    f"systolic_tile_cycles {n}; {cyc / wall:,.0f} cycles/s)"
                )
                if "seq" in r:
                    wall, cyc = r["seq"]
                    want = systolic_sequence_cycles(df, R, C, [D] * seq, pipelined=True)
                    print(
                        f"      {seq} tiles back to back: {wall * 1e3:9.1f} ms for {cyc} "
                        f"cycles (= systolic_sequence_cycles {want}; unpipelined "
                        f"{systolic_sequence_cycles(df, R, C, [D] * seq, pipelined=False)})"
                    )
    if args.sizes:
        print("Emitted Verilog size per block (default parameters):")
        for name in BLOCKS:
            text = verilog_text(name)
            print(f"  {name:28s} {len(text.encode()):>10,d} bytes {text.count(chr(10)):>8,d} lines")


if __name__ == "__main__":
    main()
