"""The window of a 2-D convolution or pooling op: kernel, stride, padding on each
side, dilation and ceil mode, read from the op's attributes, with the output size rule
of ONNX and PyTorch. One reader for shape inference (:mod:`wia_hw.graph`), functional
mode (:mod:`.functional`) and the training graph.

Attributes: ``stride`` and ``dilation`` are an int or ``[h, w]``; ``pad`` an int,
``[h, w]`` or ``[top, left, bottom, right]`` (ONNX's ``pads`` order); a pool's
``kernel`` an int or ``[kh, kw]`` (its ``stride`` defaults to the kernel);
``ceil_mode``: the output size rounds up, the last window starting inside the input or
its top/left padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from .errors import WorkloadError

__all__ = ["Window", "parse_window"]


def _ints(value: Any) -> list[int] | None:
    """``value`` (an int or a list/tuple of them) as a list of ints; None if it is not."""
    vals = list(value) if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, Integral) and not isinstance(v, bool) for v in vals):
        return None
    return [int(v) for v in vals]


def _pair(op: str, kind: str, what: str, value: Any, low: int) -> tuple[int, int]:
    vals = _ints(value)
    if vals is not None and len(vals) == 1:
        vals *= 2
    if vals is None or len(vals) != 2:
        raise WorkloadError(f"op {op!r} ({kind}): {what} {value!r} is not an int or [h, w]")
    if min(vals) < low:
        raise WorkloadError(f"op {op!r} ({kind}): {what} {value!r} must be at least {low}")
    return vals[0], vals[1]


@dataclass(frozen=True)
class Window:
    """A 2-D convolution or pooling window: kernel ``(kh, kw)``, ``stride`` and
    ``dilation`` ``(h, w)``, ``pad`` ``(top, left, bottom, right)``, ``ceil_mode``."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]
    dilation: tuple[int, int] = (1, 1)
    ceil_mode: bool = False

    def output_hw(self, h: int, w: int) -> tuple[int, int]:
        """Output height and width on an ``h x w`` input (ONNX's and PyTorch's rule)."""
        out = []
        for x, k, s, d, lo, hi in zip(
            (h, w), self.kernel, self.stride, self.dilation, self.pad[:2], self.pad[2:], strict=True
        ):
            span = x + lo + hi - d * (k - 1) - 1
            if not self.ceil_mode:
                out.append(span // s + 1)
                continue
            o = -(-span // s) + 1
            if (o - 1) * s >= x + lo:  # the last window must start inside
                o -= 1
            out.append(o)
        return out[0], out[1]

    def transposed_span(self, h: int, w: int) -> tuple[int, int]:
        """The rows and columns a transposed convolution's windows cover on an ``h x
        w`` input, before its pads crop them and its output padding extends them:
        ``stride (n - 1) + dilation (k - 1) + 1`` per axis."""
        out = [
            s * (n - 1) + d * (k - 1) + 1
            for n, k, s, d in zip((h, w), self.kernel, self.stride, self.dilation, strict=True)
        ]
        return out[0], out[1]

    @property
    def area(self) -> int:
        return self.kernel[0] * self.kernel[1]


def parse_window(
    n: str, k: str, a: Mapping[str, Any], kernel: tuple[int, int] | None = None
) -> Window:
    """The window of op ``n`` of kind ``k`` (``conv2d``: ``kernel`` is its weight's
    ``(kh, kw)``; a pool reads its ``kernel`` attribute) from its attributes ``a``; a
    one-line :class:`WorkloadError` names the op and the malformed attribute."""
    if kernel is None:
        kernel = _pair(n, k, "kernel", a.get("kernel", 2), 1)
    stride = _pair(n, k, "stride", a.get("stride", 1 if k == "conv2d" else kernel), 1)
    dilation = _pair(n, k, "dilation", a.get("dilation", 1), 1)
    p = a.get("pad", 0)
    vals = _ints(p) or []
    if len(vals) in (1, 2):
        vals *= 4 // len(vals)
    if len(vals) != 4:
        raise WorkloadError(
            f"op {n!r} ({k}): pad {p!r} is not an int, [h, w] or [top, left, bottom, right]"
        )
    if min(vals) < 0:
        raise WorkloadError(f"op {n!r} ({k}): pad {p!r} must not be negative")
    return Window(
        kernel, stride, (vals[0], vals[1], vals[2], vals[3]), dilation, bool(a.get("ceil_mode"))
    )
