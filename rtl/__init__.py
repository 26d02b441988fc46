"""The NPU's digital blocks in Amaranth HDL, emitted as Verilog and verified with cocotb.

One :class:`amaranth.lib.wiring.Component` per module: :class:`ProcessingElement`,
:class:`SystolicArray`, :class:`PerfCounters`, :class:`PimBank`, :class:`FrontEnd`,
:class:`FpMac`, :class:`Fp32Mac`.
:func:`emit` writes the Verilog of a block from the :data:`BLOCKS` registry. Cycle
functions and golden models live in ``wia_hw.emulator`` (``cycles``, ``golden``,
``pim_model``, ``frontend_model``); the RTL does not import them, the tests check both.
"""

from .emit import BLOCKS, BlockInfo, build, emit, verilog_text
from .fp_mac import FP_FORMATS, Fp32Mac, FpMac
from .frontend import FrontEnd
from .pe import ACC_BITS, DATA_BITS, DATAFLOWS, ProcessingElement
from .perf_counters import REGISTER_MAP, PerfCounters
from .pim_bank import PimBank
from .systolic_array import SystolicArray

__all__ = [
    "ACC_BITS",
    "BLOCKS",
    "BlockInfo",
    "DATAFLOWS",
    "DATA_BITS",
    "FP_FORMATS",
    "Fp32Mac",
    "FpMac",
    "FrontEnd",
    "PerfCounters",
    "PimBank",
    "ProcessingElement",
    "REGISTER_MAP",
    "SystolicArray",
    "build",
    "emit",
    "verilog_text",
]
