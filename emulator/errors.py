"""Error types of wia-hw. They live in the lowest layer so every layer can raise them."""

from __future__ import annotations

__all__ = ["WiaError", "SpecError", "WorkloadError"]


class WiaError(Exception):
    """Base of every error wia-hw raises on bad input. ``str(err)`` is one line."""


class SpecError(WiaError, ValueError):
    """A device, cluster or extension spec is malformed or invalid.

    Carries where the fault is: ``file`` (path or spec name, may be ``None``), ``line``
    (1-based, ``None`` when unknown, e.g. for an override) and ``field`` (dotted path).
    ``str()`` reads ``file:line: field: message``.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        super().__init__(self._format())

    def _format(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}: " if self.line is not None else f"{self.file}: "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"

    def located(
        self, *, file: str | None = None, line: int | None = None, field_prefix: str | None = None
    ) -> SpecError:
        """A copy with location filled in where this one has none."""
        field = self.field
        if field_prefix:
            field = f"{field_prefix}.{field}" if field else field_prefix
        return SpecError(
            self.message,
            file=self.file or file,
            line=self.line if self.line is not None else line,
            field=field,
        )


class WorkloadError(WiaError, ValueError):
    """A workload (graph, builder arguments, ONNX file) is invalid; names the op/shape."""
