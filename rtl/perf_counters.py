"""Performance-counter block: cycles, busy cycles, MACs and stall cycles of one unit."""

from __future__ import annotations

from amaranth.hdl import Array, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._checks import check_int

__all__ = ["REGISTER_MAP", "PerfCounters"]

#: Register map: address ``i`` reads the counter named ``REGISTER_MAP[i]``. The names are
#: the values of the emulator's ``wia_hw.emulator.counters.Counter`` members
#: (``Counter(REGISTER_MAP[i])`` gives the identity), so RTL and emulator agree on what
#: each register counts. The RTL does not import the emulator; a test checks the names.
REGISTER_MAP: tuple[str, ...] = ("cycles", "busy_cycles", "macs", "stall_cycles")


class PerfCounters(wiring.Component):
    """Four free-running event counters behind a read-only register interface.

    Counting (at every rising edge, unless ``clear`` is high):

    - ``cycles`` (address 0): ``+1`` if ``enable`` was high in the cycle;
    - ``busy_cycles`` (address 1): ``+1`` if ``enable`` and ``macs != 0`` (with
      ``busy_port``: if ``enable`` and ``busy``);
    - ``macs`` (address 2): ``+macs`` if ``enable``;
    - ``stall_cycles`` (address 3): ``+1`` if ``enable`` and ``stall``.

    Every counter is ``width`` bits and wraps modulo ``2**width``. ``clear`` high in a
    cycle sets all four to zero at the next edge (the events of that cycle are dropped).

    Ports
    -----
    enable (in, 1): the counted unit is active (e.g. a tile is in flight).
    macs (in, ``range(max_macs_per_cycle + 1)``): MACs performed in this cycle.
    stall (in, 1): the unit is active but waiting (operands not ready).
    busy (in, 1; only with ``busy_port=True``): the unit works in this cycle, for units
    whose MACs take several cycles (``macs`` then counts the MACs completing).
    clear (in, 1): synchronous clear of all counters.
    addr (in, ``range(4)``): register to read (see :data:`REGISTER_MAP`).
    rdata (out, ``width``): registered read data, latency 1 cycle: in cycle ``c + 1`` it
    shows the value that register ``addr`` (as presented in cycle ``c``) held in cycle
    ``c`` (before that cycle's events were added).

    Parameters
    ----------
    max_macs_per_cycle:
        Largest value on ``macs`` (``rows * cols`` for an array), 1 to 2**20.
    width:
        Counter width in bits, 8 to 64 (default 48).
    busy_port:
        Add the ``busy`` input (default ``False``); ``TypeError`` if not a bool.
    """

    def __init__(
        self, max_macs_per_cycle: int = 1, width: int = 48, busy_port: bool = False
    ) -> None:
        self._max_macs = check_int("max_macs_per_cycle", max_macs_per_cycle, 1, 1 << 20)
        self._width = check_int("width", width, 8, 64)
        if not isinstance(busy_port, bool):
            raise TypeError(f"busy_port must be a bool, got {busy_port!r}")
        self._busy_port = busy_port
        members = {
            "enable": In(1),
            "macs": In(range(self._max_macs + 1)),
            "stall": In(1),
            "clear": In(1),
            "addr": In(range(len(REGISTER_MAP))),
            "rdata": Out(self._width),
        }
        if busy_port:
            members["busy"] = In(1)
        super().__init__(members)

    @property
    def width(self) -> int:
        """Counter width in bits."""
        return self._width

    @property
    def max_macs_per_cycle(self) -> int:
        """Largest MAC count accepted per cycle."""
        return self._max_macs

    def elaborate(self, platform: object) -> Module:
        m = Module()
        regs = {name: Signal(self._width, name=name) for name in REGISTER_MAP}
        m.d.sync += self.rdata.eq(Array(regs.values())[self.addr])
        with m.If(self.clear):
            m.d.sync += [r.eq(0) for r in regs.values()]
        with m.Elif(self.enable):
            m.d.sync += [
                regs["cycles"].eq(regs["cycles"] + 1),
                regs["macs"].eq(regs["macs"] + self.macs),
            ]
            with m.If(self.busy if self._busy_port else self.macs != 0):
                m.d.sync += regs["busy_cycles"].eq(regs["busy_cycles"] + 1)
            with m.If(self.stall):
                m.d.sync += regs["stall_cycles"].eq(regs["stall_cycles"] + 1)
        return m
