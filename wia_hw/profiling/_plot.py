"""matplotlib, imported lazily. Figures are made with ``matplotlib.figure.Figure`` and
drawn by the Agg canvas, so plotting never touches pyplot's global state or a display."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..emulator.errors import WiaError

__all__ = ["new_figure", "save"]


def new_figure(figsize: tuple[float, float] = (10, 6)) -> Any:
    """A ``matplotlib.figure.Figure`` on an Agg canvas; a clear error without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise WiaError("plotting needs matplotlib: pip install 'wia-hw[plot]'") from None
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def save(fig: Any, path: str | os.PathLike[str]) -> str:
    """Write ``fig`` as PNG to ``path``; returns the path. A path with another suffix
    is refused (:class:`~wia_hw.WiaError`): the file would be a PNG under a name that
    says otherwise."""
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise WiaError(f"cannot write {p}: plots are PNG images; give a path ending in .png")
    try:
        fig.savefig(p, dpi=110, bbox_inches="tight", format="png")
    except OSError as e:
        raise WiaError(f"cannot write {p}: {e.strerror}") from None
    return str(p)
