"""Flamegraphs: collapsed stacks (Brendan Gregg's format) and an SVG drawn from them.

Collapsed format: one line per distinct stack, frames joined by ``;`` from the root,
then a space and an integer count: here device cycles, so the counts add up to the
profiled time exactly. Stacks, root first:

* with kernel records: ``device; <the user's innermost Python frames (up to four),
  outermost first>; run <workload>; <op group>; <op without its layerN. prefix>;
  <kernel> [<kind>]`` (so one op's layers stack under one frame), plus ``...; run
  <workload>; writeback`` for each run's final write-back and ``device; [outside
  runs]`` for device time outside ``ctx.run`` (user allocations, direct launches);
* sampling only: ``device; <kernel>; computing|waiting`` (each sample's cycles split by
  the share of active cores computing) and ``device; [idle]``.
"""

from __future__ import annotations

import html
import os
import re
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["collapsed_stacks", "call_graph", "parse_collapsed", "render_svg", "render_png"]


def _f(s: str) -> str:
    return s.replace(";", ":").replace("\n", " ").strip() or "?"


def collapsed_stacks(report: Any) -> list[str]:
    """The report's stacks (see the module docstring), values in cycles."""
    return [f"{';'.join(k)} {v}" for k, (v, _) in _stacks(report).items()]


def call_graph(report: Any) -> dict[str, Any]:
    """The stacks as a tree: ``{"name", "cycles", "calls", "children": [...]}``, where
    ``calls`` counts kernel launches (or samples) under a frame and ``cycles`` is its
    inclusive time; children in first-seen order."""
    root: dict[str, Any] = {"name": "all", "cycles": 0, "calls": 0, "children": []}
    index: dict[tuple[str, ...], dict[str, Any]] = {(): root}
    for frames, (v, n) in _stacks(report).items():
        root["cycles"] += v
        root["calls"] += n
        for i in range(1, len(frames) + 1):
            node = index.get(frames[:i])
            if node is None:
                node = {"name": frames[i - 1], "cycles": 0, "calls": 0, "children": []}
                index[frames[: i - 1]]["children"].append(node)
                index[frames[:i]] = node
            node["cycles"] += v
            node["calls"] += n
    return root


def _stacks(report: Any) -> dict[tuple[str, ...], tuple[int, int]]:
    """stack -> (cycles, launches or samples)."""
    dev = report.device.name
    total = report.cycles
    stacks: dict[tuple[str, ...], tuple[int, int]] = {}

    def add(frames: list[str], v: int, n: int = 1) -> None:
        if v > 0:
            key = tuple(_f(x) for x in frames)
            c, k = stacks.get(key, (0, 0))
            stacks[key] = (c + v, k + n)

    if report.kernels:
        runs = {r.index: r for r in report.runs}

        def prefix(run: int) -> list[str]:
            r = runs.get(run)
            if r is None:
                return [dev, "[outside runs]"]
            return (
                [dev]
                + [f"{f.function} ({f.short})" for f in reversed(r.stack[:4])]
                + [f"run {r.workload}"]
            )

        covered = 0
        if report.ops:
            for op in report.ops:
                pre = prefix(op.run) + [op.group, re.sub(r"^layer\d+\.", "", op.name)]
                ksum = 0
                for i in op.kernels:
                    k = report.kernels[i]
                    add(pre + [f"{k.name} [{k.kind}]"], k.cycles)
                    ksum += k.cycles
                add(pre + [f"{op.name} [op overhead]"], op.end_cycle - op.start_cycle - ksum, 0)
                covered += op.end_cycle - op.start_cycle
        else:
            for k in report.kernels:
                add(
                    prefix(k.run)
                    + [k.group, re.sub(r"^layer\d+\.", "", k.op), f"{k.name} [{k.kind}]"],
                    k.cycles,
                )
                covered += k.cycles
        for r in report.runs:
            add(prefix(r.index) + ["writeback"], r.writeback_cycles, 0)
            covered += r.writeback_cycles
        add([dev, "[outside runs]"], total - covered, 0)
    elif report.samples:
        for s in report.samples:
            active = [k for k in s.kernels if k is not None]
            if not active:
                add([dev, "[idle]"], s.weight_cycles)
                continue
            name = max(sorted(set(active)), key=active.count)
            comp = s.weight_cycles * sum(s.computing) // len(active)
            add([dev, name, "computing"], comp)
            add([dev, name, "waiting"], s.weight_cycles - comp)
    else:
        add([dev, "[session]"], total, 0)
    return stacks


def parse_collapsed(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """``(frames, count)`` per line; raises ValueError on a malformed line."""
    out = []
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit() or not stack:
            raise ValueError(f"line {n}: expected 'frame;frame;... count', got {line!r}")
        out.append((stack.split(";"), int(count)))
    return out


class _Node:
    __slots__ = ("name", "value", "children")

    def __init__(self, name: str) -> None:
        self.name = name
        self.value = 0
        self.children: dict[str, _Node] = {}


def _color(name: str) -> str:
    """Warm 'hot' palette, a stable colour per frame name."""
    h = zlib.crc32(name.encode())
    r = 205 + (h & 0x3F) % 50
    g = (h >> 8) % 230
    b = (h >> 16) % 55
    return f"rgb({r},{g},{b})"


def render_svg(
    lines: Iterable[str],
    *,
    title: str = "Flame Graph",
    unit: str = "samples",
    width: int = 1200,
    frame_height: int = 16,
    font_size: int = 11,
) -> str:
    """An SVG flame graph (root at the bottom, width proportional to count) of
    collapsed stacks, with a tooltip (``<title>``) on every frame."""
    root = _Node("all")
    for frames, count in parse_collapsed(lines):
        root.value += count
        node = root
        for f in frames:
            node = node.children.setdefault(f, _Node(f))
            node.value += count
    depth = 0

    def measure(n: _Node, d: int) -> None:
        nonlocal depth
        depth = max(depth, d)
        for c in n.children.values():
            measure(c, d + 1)

    measure(root, 0)
    pad_top, pad_bottom, xpad = 40, 20, 10
    height = pad_top + (depth + 1) * frame_height + pad_bottom
    total = root.value or 1
    scale = (width - 2 * xpad) / total
    out = [
        '<?xml version="1.0" standalone="no"?>',
        f'<svg version="1.1" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f8f8f0"/>',
        f'<text x="{width / 2}" y="24" font-size="16" font-family="Verdana" '
        f'text-anchor="middle">{html.escape(title)}</text>',
    ]
    char_w = font_size * 0.6

    def draw(n: _Node, x: float, d: int) -> None:
        w = n.value * scale
        y = height - pad_bottom - (d + 1) * frame_height
        pct = 100.0 * n.value / total
        tip = html.escape(f"{n.name} ({n.value:,} {unit}, {pct:.2f}%)")
        fill = "rgb(200,200,200)" if d == 0 else _color(n.name)
        out.append(
            f'<g><title>{tip}</title><rect x="{x:.2f}" y="{y}" width="{max(w, 0.1):.2f}"'
            f' height="{frame_height - 1}" fill="{fill}" rx="2" ry="2"/>'
        )
        chars = int((w - 4) / char_w)
        if chars >= 3:
            label = n.name if len(n.name) <= chars else n.name[: chars - 2] + ".."
            out.append(
                f'<text x="{x + 3:.2f}" y="{y + frame_height - 4}" '
                f'font-size="{font_size}" font-family="Verdana">'
                f"{html.escape(label)}</text>"
            )
        out.append("</g>")
        cx = x
        for c in n.children.values():
            draw(c, cx, d + 1)
            cx += c.value * scale

    draw(root, xpad, 0)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_png(
    lines: Iterable[str],
    path: str | os.PathLike[str],
    *,
    title: str = "Flame Graph",
    max_depth: int = 40,
) -> Path:
    """Draw the collapsed stacks as a PNG flame graph (root at the bottom, width
    proportional to count, the same colours as :func:`render_svg`) with matplotlib;
    frames narrower than 0.05% of the total are left out. Raises
    :class:`~wia_hw.WiaError` without matplotlib or when ``path`` cannot be written."""
    from ._plot import new_figure, save

    fig = new_figure()  # fails first, in one line, without matplotlib
    from matplotlib.patches import Rectangle

    root = _Node("all")
    for frames, count in parse_collapsed(lines):
        root.value += count
        node = root
        for f in frames[:max_depth]:
            node = node.children.setdefault(f, _Node(f))
            node.value += count
    total = root.value or 1
    rects: list[tuple[float, int, float, str]] = []

    def walk(n: _Node, x: float, d: int) -> int:
        w = n.value / total
        if w < 5e-4:
            return d
        rects.append((x, d, w, n.name))
        deepest, cx = d, x
        for c in n.children.values():
            deepest = max(deepest, walk(c, cx, d + 1))
            cx += c.value / total
        return deepest

    depth = walk(root, 0.0, 0) + 1
    fig.set_size_inches(14, max(3.0, 0.28 * depth + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    for x, d, w, name in rects:
        rgb = tuple(int(v) / 255 for v in _color(name)[4:-1].split(","))
        face = (0.78, 0.78, 0.78) if d == 0 else rgb
        ax.add_patch(Rectangle((x, d), w, 0.92, facecolor=face, lw=0))
        chars = int(w * 220)
        if chars >= 4:
            label = name if len(name) <= chars else name[: chars - 2] + ".."
            ax.text(x + 0.002, d + 0.46, label, va="center", fontsize=7, clip_on=True)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, depth)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)
    save(fig, path)
    return Path(path)
