"""Make ``tests/data/onnx/functions/``: a model as torch's exporter writes it with
``export_modules_as_functions``, its modules as ONNX model-local functions.

Needs torch and onnx (not wia-hw's own test extras):

    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch onnx
    /tmp/tv/bin/python scripts/make_function_fixtures.py [--out tests/data/onnx/functions]

``blocks.onnx``: two pre-norm MLP blocks (LayerNorm, Linear, GELU, Linear, residual)
and a ``torch.nn.MultiheadAttention``, exported by the legacy (TorchScript) exporter at
opset 17 with ``export_modules_as_functions={Block, LayerNorm}``: the graph calls the
functions ``Block`` and ``Block.1`` (domain ``__main__``), which call ``LayerNorm``
(domain ``torch.nn.modules.normalization``). Seeded random weights; ``blocks.npz`` holds
the input (``x``) and PyTorch's output (``y``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.att = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(x)
        return self.att(x, x, x, need_weights=False)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "onnx" / "functions"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 8, 32)
    torch.onnx.export(
        net,
        (x,),
        str(out / "blocks.onnx"),
        opset_version=17,
        dynamo=False,
        export_modules_as_functions={Block, torch.nn.LayerNorm},
        input_names=["x"],
        output_names=["y"],
    )
    with torch.no_grad():
        np.savez_compressed(out / "blocks.npz", x=x.numpy(), y=net(x).numpy())
    sys.stdout.write(f"blocks.onnx: {(out / 'blocks.onnx').stat().st_size:,} B\n")


if __name__ == "__main__":
    main()
