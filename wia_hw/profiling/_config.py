"""Profiling configuration: the seed's ``wia_profiling_config_t`` and its enums."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..emulator.counters import Counter
from ..emulator.enums import NamedEnum

__all__ = ["ProfileMode", "OutputFormat", "ProfilingConfig", "SEED_COUNTERS", "FACETS"]


_LowerEnum = NamedEnum


class ProfileMode(_LowerEnum):
    """What a session records (the seed's section 8.2.1 table).

    ``SAMPLING``: a sampler reads the device state every ``sampling_interval_us``
    (which kernel each core runs, whether it computes, queue depths): coarse, cheap.
    ``INSTRUMENTATION``: exact enter/exit of every run, op and kernel with the call
    graph and the user's Python call site. ``COUNTERS``: the requested hardware counters
    read at every kernel boundary (deltas per kernel). ``TRACE``: instrumentation and
    counters plus every device event (tile computes, DMA bursts with their cache misses,
    HBM channel transfers). ``DETAILED``: all of the above at once.
    """

    DETAILED = "detailed"
    SAMPLING = "sampling"
    INSTRUMENTATION = "instrumentation"
    COUNTERS = "counters"
    TRACE = "trace"

    @staticmethod
    def _aliases() -> dict[str, str]:
        return {
            "hardware_counters": "counters",
            "instrumented": "instrumentation",
            "sample": "sampling",
        }


class OutputFormat(_LowerEnum):
    """How :func:`save_profile_report` writes a report: ``JSON`` (the versioned report),
    ``CHROME_TRACE`` (the timeline, Trace Event Format JSON for Perfetto and
    chrome://tracing), ``COLLAPSED`` (flamegraph stacks, Brendan Gregg's format),
    ``TEXT`` (the human summary)."""

    JSON = "json"
    CHROME_TRACE = "chrome_trace"
    COLLAPSED = "collapsed"
    TEXT = "text"

    @staticmethod
    def _aliases() -> dict[str, str]:
        return {
            "perfetto": "chrome_trace",
            "trace": "chrome_trace",
            "folded": "collapsed",
            "txt": "text",
        }


#: The seed's six counters (section 8.2).
SEED_COUNTERS: tuple[Counter, ...] = (
    Counter.CYCLES,
    Counter.INSTRUCTIONS,
    Counter.CACHE_MISSES,
    Counter.BANDWIDTH,
    Counter.FLOPS,
    Counter.BRANCH_MISPREDICTS,
)

#: What each mode records.
FACETS: dict[ProfileMode, frozenset[str]] = {
    ProfileMode.SAMPLING: frozenset({"samples"}),
    ProfileMode.INSTRUMENTATION: frozenset({"instrumentation"}),
    ProfileMode.COUNTERS: frozenset({"counters"}),
    ProfileMode.TRACE: frozenset({"instrumentation", "counters", "trace"}),
    ProfileMode.DETAILED: frozenset({"samples", "instrumentation", "counters", "trace"}),
}


@dataclass(frozen=True, kw_only=True)
class ProfilingConfig:
    """The seed's ``wia_profiling_config_t``.

    ``mode`` and ``output_format`` take the enum or its lower-case name.
    ``hardware_counters`` lists :class:`~wia_hw.Counter` identities (or names) read per
    kernel in the counter-reading modes (``CACHE_MISSES`` also reads the accesses, so a
    hit rate follows). ``capture_kernels=False`` keeps only session totals (and samples);
    ``capture_memory`` adds a memory profile of the session (every allocation);
    ``capture_power`` adds power and temperature per kernel; ``capture_communication``
    records link messages (none yet: multi-device runs do not exist). ``output_file``:
    where :func:`stop_profiling` saves the report in ``output_format``; with
    ``timeline_enabled`` / ``flamegraph_enabled`` it also writes ``<stem>.trace.json``
    and ``<stem>.folded`` + ``<stem>.svg`` beside it. ``sampling_interval_us``: the
    sampler's period in device time (not in the seed). ``keep_library_frames``: keep the
    frames of wia-hw itself and of the standard library and installed packages (e.g.
    ``click``) in call stacks, flamegraphs and allocation sites (skipped by default).
    ``num_counters``: the seed's count of ``hardware_counters`` (its C array's length);
    optional (``None``: taken from the list), checked when given against the distinct
    counters listed, and it changes nothing else (a copy made with
    ``dataclasses.replace`` that changes the counters passes the new count or None).
    """

    mode: ProfileMode | str = ProfileMode.DETAILED
    capture_kernels: bool = True
    capture_memory: bool = True
    capture_communication: bool = True
    capture_power: bool = True
    hardware_counters: Sequence[Counter | str] = field(default=SEED_COUNTERS)
    num_counters: int | None = None
    output_format: OutputFormat | str = OutputFormat.JSON
    output_file: str | os.PathLike[str] | None = None
    timeline_enabled: bool = False
    flamegraph_enabled: bool = False
    sampling_interval_us: float = 100.0
    keep_library_frames: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", ProfileMode(self.mode))
        except ValueError:
            raise ValueError(
                f"mode must be one of {', '.join(m.value for m in ProfileMode)}, got {self.mode!r}"
            ) from None
        try:
            object.__setattr__(self, "output_format", OutputFormat(self.output_format))
        except ValueError:
            raise ValueError(
                "output_format must be one of "
                f"{', '.join(m.value for m in OutputFormat)}, "
                f"got {self.output_format!r}"
            ) from None
        for n in (
            "capture_kernels",
            "capture_memory",
            "capture_communication",
            "capture_power",
            "timeline_enabled",
            "flamegraph_enabled",
            "keep_library_frames",
        ):
            if not isinstance(getattr(self, n), bool):
                raise TypeError(f"{n} must be a bool, got {getattr(self, n)!r}")
        if isinstance(self.hardware_counters, (str, Counter)):
            raise TypeError(
                f"hardware_counters must be a sequence of counters, got {self.hardware_counters!r}"
            )
        counters = []
        for c in self.hardware_counters:
            try:
                counters.append(Counter(c))
            except ValueError:
                raise ValueError(
                    f"hardware_counters: unknown counter {c!r} (known: "
                    f"{', '.join(m.value for m in Counter)})"
                ) from None
        object.__setattr__(self, "hardware_counters", tuple(dict.fromkeys(counters)))
        distinct = len(self.hardware_counters)
        n = self.num_counters
        if n is None:
            object.__setattr__(self, "num_counters", distinct)
        elif isinstance(n, bool) or not isinstance(n, int) or n != distinct:
            dup = " distinct" if distinct != len(counters) else ""
            raise ValueError(
                f"ProfilingConfig.num_counters must equal the {distinct}{dup} "
                f"hardware_counters listed, got {n!r}"
            )
        v = self.sampling_interval_us
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"sampling_interval_us must be a positive number, got {v!r}")
        if self.output_file is not None and not isinstance(self.output_file, (str, os.PathLike)):
            raise TypeError(f"output_file must be a path, got {self.output_file!r}")

    @property
    def facets(self) -> frozenset[str]:
        """What this mode records: ``samples``, ``instrumentation``, ``counters``,
        ``trace``."""
        return FACETS[ProfileMode(self.mode)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": ProfileMode(self.mode).value,
            "capture_kernels": self.capture_kernels,
            "capture_memory": self.capture_memory,
            "capture_communication": self.capture_communication,
            "capture_power": self.capture_power,
            "hardware_counters": [Counter(c).value for c in self.hardware_counters],
            "output_format": OutputFormat(self.output_format).value,
            "output_file": None if self.output_file is None else os.fspath(self.output_file),
            "timeline_enabled": self.timeline_enabled,
            "flamegraph_enabled": self.flamegraph_enabled,
            "sampling_interval_us": self.sampling_interval_us,
            "keep_library_frames": self.keep_library_frames,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProfilingConfig:
        return cls(**d)
