"""Shared test set-up."""

from __future__ import annotations

import os

# Amaranth prefers a system yosys when one is on PATH; pin the bundled one so every
# machine emits the same Verilog.
os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
