"""The device emulator (``wia_hw.emulator``): a SimPy discrete-event model of an NPU whose
cycle counts equal the RTL's where both exist, and which keeps the hardware counters.

Time inside the emulator is an integer count of device clock cycles. A SimPy event
stands for a tile, a DMA burst or a link message; closed-form cycle functions fill the
time between events (the emulator never steps clock by clock over a workload).

Modules, lowest layer first (each imports only modules above it in this list):

* :mod:`.errors`: ``WiaError``, ``SpecError``, ``WorkloadError`` (every layer raises them);
* :mod:`.enums`: string enums that accept a member's name or value in any case;
* :mod:`.counters`: counter identities (an enum) and the counter record;
* :mod:`.cycles`: one cycle function per block (systolic tile, vector op, transfer),
  shared with the cocotb testbenches: the single source of truth for latency;
* :mod:`.golden`: bit-exact reference models shared with the RTL testbenches;
* :mod:`.window`: a convolution or pooling window read from an op's attributes (kernel,
  strides, pads per side, dilation, ceil mode) and its output size;
* :mod:`.config`: the frozen configuration tree of a device or cluster, validated;
* :mod:`.kernels`: the kernel descriptors the runtime's lowering hands to the device;
* :mod:`.memory`, :mod:`.allocator`, :mod:`.control`, :mod:`.power`: the memory
  hierarchy (block LRU caches, ports, HBM channels), the device allocator, the control
  core (instructions, branch prediction) and energy/temperature;
* :mod:`.functional`, :mod:`.tiled_exec`: the numbers functional mode computes;
* :mod:`.device`: the SimPy model of one NPU (cores, DMA, memory, counters);
* :mod:`.cluster`: several devices on links (topologies, SimPy FIFO link servers);
* :mod:`.extension_kernels`, :mod:`.pim_model`, :mod:`.frontend_model`: the machinery
  device extensions run on (costed kernels, PIM banks, photonic/analog front-ends).

The emulator never imports the runtime (``wia_hw``) or the extensions; they reach it
through these modules' public names. The package re-exports nothing: import the module
you need, so that the lowest layers (errors, cycles, golden models) load without SimPy.
"""
