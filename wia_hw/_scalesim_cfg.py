"""SCALE-Sim ``.cfg`` configurations as device spec mappings, below :mod:`wia_hw.spec`
(which reads a ``.cfg`` given as a device through it); :mod:`wia_hw.scalesim` is the
public face and says how the fields map."""

from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import Any

from .emulator.config import DeviceSpec, to_mapping
from .emulator.errors import SpecError

__all__ = ["scalesim_config_mapping"]


def scalesim_config_mapping(
    path: str | os.PathLike[str], spec: DeviceSpec, *, word_bytes: int = 2
) -> dict[str, Any]:
    """The mapping of ``spec`` with a SCALE-Sim ``.cfg``'s array, SRAMs and interface
    bandwidth put in (:func:`wia_hw.scalesim.config_mapping` says how)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("no such SCALE-Sim configuration file", file=str(p))
    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read_string(p.read_text(encoding="utf-8-sig"), source=str(p))
    except (configparser.Error, UnicodeDecodeError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(f"not a SCALE-Sim configuration: {first}", file=str(p)) from None

    def get(section: str, key: str, label: str) -> str:
        if not cp.has_section(section):
            raise SpecError(f"section [{section}] is missing", file=str(p), field=section)
        if not cp.has_option(section, key):
            raise SpecError("is missing", file=str(p), field=f"{section}.{label}")
        return cp.get(section, key).strip()

    def positive(section: str, key: str, label: str) -> int:
        raw = get(section, key, label)
        try:
            v = int(raw)
        except ValueError:
            v = 0
        if v < 1:
            raise SpecError(
                f"must be a positive integer, got {raw!r}", file=str(p), field=f"{section}.{label}"
            )
        return v

    arch = "architecture_presets"
    rows = positive(arch, "arrayheight", "ArrayHeight")
    cols = positive(arch, "arraywidth", "ArrayWidth")
    sram = sum(
        positive(arch, k, label)
        for k, label in (
            ("ifmapsramszkb", "IfmapSramSzkB"),
            ("filtersramszkb", "FilterSramSzkB"),
            ("ofmapsramszkb", "OfmapSramSzkB"),
        )
    )
    df = get(arch, "dataflow", "Dataflow").lower()
    if df not in ("os", "ws"):
        raise SpecError(
            f"dataflow {df!r}: wia-hw models os and ws (not is)",
            file=str(p),
            field=f"{arch}.Dataflow",
        )
    mode = (
        get("run_presets", "interfacebandwidth", "InterfaceBandwidth").upper()
        if cp.has_section("run_presets")
        else "CALC"
    )
    if mode not in ("CALC", "USER"):
        raise SpecError(
            f"must be CALC or USER, got {mode!r}",
            file=str(p),
            field="run_presets.InterfaceBandwidth",
        )
    name = cp.get("general", "run_name", fallback=p.stem).strip() or p.stem
    data = to_mapping(spec)
    data["name"] = name
    data["compute"]["cores"] = 1
    array = data["compute"]["array"]
    array.update(rows=rows, cols=cols, dataflow=df, pipelined=False)
    mem = data["memory"]
    mem["l1"]["size_kib"] = sram
    block = mem["block_bytes"]
    while block > sram * 1024 // 4 and block > 1:
        block //= 2
    mem["block_bytes"] = block
    notes = [f"SCALE-Sim {p.name} over {spec.name}: {rows}x{cols} {df}, L1 {sram} KiB"]
    if mode == "USER":
        raw = get(arch, "bandwidth", "Bandwidth")
        try:
            words = [int(x) for x in raw.split(",") if x.strip()]
        except ValueError:
            words = []
        if not words or min(words) < 1 or len(set(words)) != 1:
            raise SpecError(
                f"must be one positive integer (words per cycle), got {raw!r}",
                file=str(p),
                field=f"{arch}.Bandwidth",
            )
        gbs = words[0] * word_bytes * spec.clock_ghz
        mem["hbm"]["bandwidth_gbs"] = gbs
        notes.append(f"DRAM {words[0]} words/cycle x {word_bytes} B = {gbs:g} GB/s")
    else:
        notes.append(f"InterfaceBandwidth CALC: {spec.name}'s memory kept")
    notes.append("no L2 in SCALE-Sim: the base spec's is kept")
    data["description"] = "; ".join(notes)
    return data
