"""Regenerate ``tests/data/scalesim/compute_report.csv``: SCALE-Sim's own cycle counts
for the topologies and configurations in that folder, which ``tests/test_scalesim.py``
and ``benchmarks/scalesim_compare.py`` compare wia-hw with.

SCALE-Sim is not a dependency of wia-hw. Give this script a Python that has it:

    python -m venv /tmp/ss && /tmp/ss/bin/pip install scalesim==3.0.0 "numpy<2"
    python scripts/scalesim_reference.py --python /tmp/ss/bin/python

(scalesim 3.0.0 fails under numpy 2: ``int()`` of a one-element array.) Each
configuration runs each topology once (``python -m scalesim.scale -c CFG -t TOPO -l
layout.csv -i gemm|conv -s N``); the rows of every run's ``COMPUTE_REPORT.csv`` are
written with the configuration and topology that made them.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def say(text: str) -> None:
    sys.stdout.write(text + "\n")


DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "scalesim"
TOPOLOGIES = {"gemm.csv": "gemm", "conv.csv": "conv"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable, help="a Python with scalesim installed")
    ap.add_argument("--out", type=Path, default=DATA / "compute_report.csv")
    args = ap.parse_args(argv)
    version = subprocess.run(
        [
            args.python,
            "-c",
            "import importlib.metadata as m; "
            "print(m.version('scalesim'), '(numpy', m.version('numpy') + ')')",
        ],
        capture_output=True,
        text=True,
    )
    if version.returncode:
        why = (version.stderr.strip().splitlines() or ["it did not run"])[-1]
        say(f"{args.python} has no scalesim: {why}")
        return 2
    rows = []
    for cfg in sorted(DATA.glob("*.cfg")):
        for topo, kind in TOPOLOGIES.items():
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                run = subprocess.run(
                    [args.python, "-m", "scalesim.scale", "-c", str(cfg), "-t", str(DATA / topo)]
                    + ["-l", str(DATA / "layout.csv"), "-p", tmp, "-i", kind, "-s", "N"],
                    capture_output=True,
                    text=True,
                )
                wall = time.perf_counter() - t0
                if run.returncode:
                    say(f"{cfg.name} {topo}: scalesim failed:\n{run.stderr[-2000:]}")
                    return 1
                (report,) = Path(tmp).glob("*/COMPUTE_REPORT.csv")
                with report.open() as f:
                    body = [r for r in csv.reader(f)][1:]
            for r in body:
                rows.append([cfg.stem, topo, int(r[0]), int(r[1]), int(r[2]), int(r[3])])
            say(f"{cfg.name} {topo}: {len(body)} layers in {wall:.1f} s")
    with args.out.open("w", newline="") as f:
        f.write(f"# scalesim {version.stdout.strip()}, scripts/scalesim_reference.py\n")
        w = csv.writer(f)
        w.writerow(["config", "topology", "layer_id", "cycles_with_prefetch", "cycles", "stalls"])
        w.writerows(rows)
    say(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
