"""Functional mode: compute every tensor of a graph alongside the timing run.

Every GEMM-class op that the device runs as a built-in
:class:`~wia_hw.emulator.kernels.GemmKernel` is executed over the device's own tiles
(:meth:`Device.tiles_of <wia_hw.emulator.device.Device.tiles_of>`, the ones the timing
model runs) and array passes, through the golden models, in the RTL's tile and
accumulation order (:mod:`wia_hw.emulator.tiled_exec` states the arithmetic: int8 in
wrapping int32, fp16/bf16 through the PE's fp32-accumulating MAC, K chunks summed in
fp32 in K order, the bias added once after the last chunk). A GEMM an attached unit
took (analog, photonic: its kernel's ``attrs["unit_gemm"]``) runs through that unit's
noise model, seeded. Every other op, and a GEMM another extension lowered, is evaluated
by :func:`wia_hw.emulator.functional.evaluate`.

Float inputs and weights the user gives are stored in their tensor's dtype (rounded to
nearest even, as uploading them does). Those not given are drawn from a seeded
generator (float weights ``N(0, 1/fan_in)`` rounded to their dtype; token ids within
the vocabulary). Weights an imported model names but whose external data file is not
beside it (``params["weight_data_absent"]``) are drawn too, with a
:class:`WeightDataAbsentWarning`.

Memory: the executor holds every tensor's value (float ones as float32, whatever their
dtype), unless given ``keep`` (the names to keep besides the graph's results): then
weights load, or are drawn, when an op first reads them, and every value is freed after
its last reader, so a model holds about one layer at a time. Either way it refuses up
front, with a WorkloadError, when what it would hold (:func:`functional_bytes`) is more
than the memory available.

int8 graphs use dynamic per-tensor symmetric quantisation: a ``cast`` to int8 picks
``scale = max|x| / 127``; random int8 weights carry ``scale = 1 / (127 sqrt(fan_in))``;
an int8 x int8 GEMM accumulates exactly in int32 (bit-exact with the RTL) and its
result carries the product of its operands' scales (an int8 result is requantised the
same dynamic way); any float op dequantises its quantised inputs (``q * scale``) first. Data movement (reshape, slice, concat,
transpose) keeps the integers and their scale.

A graph made by :func:`wia_hw.quantize_model` carries static scales in its ops'
``attrs["quant"]``, and these win over the dynamic rule: a quantising ``cast`` (or a
vector op that writes int8 itself, ``output_scale``) uses its calibrated scale, and a
quantised GEMM accumulates its int8 codes and int32 bias exactly (as above) and its
epilogue writes ``acc * input_scale * weight_scale`` (per output channel) in the output's
dtype. Its codes and biases are the graph's ``weight_values``, so ``wia_hw.run(q,
mode="functional")`` computes what :class:`wia_hw.accuracy.GraphEvaluator` does.

Tensors with static parameters (``Graph.quant``: an imported QDQ model) hold codes
with a zero point: real value ``(q - zero_point) * scale``; uint8 codes are held minus
128, with their zero point, so every 8-bit code fits int8. An op writing such a tensor
requantises with its parameters (``clip(rint(y / scale) + zero_point)``); data
movement and gathers whose parameters agree move the codes themselves. A GEMM of two
such tensors, per-tensor on its first operand and per-tensor or per output channel on
its second, accumulates integers: zero points 0 on int8 codes run the RTL-exact int8
path above (a bias whose scale is the product of the operands' is added in int32);
other zero points are subtracted first and summed exactly in float64, as a chip's
zero-point correction would. Its result is scaled per output channel.

Whichever rule quantises (dynamic, calibrated or static), a NaN or infinity among the
values to code is refused with one WorkloadError line naming the op: no integer code
stands for it, and casting it would give finite codes, a confident answer where the
float graph gives NaN.
"""

from __future__ import annotations

import math
import os
import warnings
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .emulator.errors import WorkloadError
from .emulator.functional import cast_to, evaluate, gemm_operands, random_input
from .emulator.golden import round_to_precision
from .emulator.kernels import GemmKernel, Kernel
from .emulator.tiled_exec import execute_gemm
from .graph import GEMM_KINDS, MOVE_KINDS, Graph, Op, QuantParams, op_macs

if TYPE_CHECKING:
    from .emulator.device import Device

__all__ = [
    "FunctionalExecutor",
    "FUNCTIONAL_MAC_LIMIT",
    "RandomInt8WeightsWarning",
    "WeightDataAbsentWarning",
    "functional_bytes",
]


class RandomInt8WeightsWarning(UserWarning):
    """Functional mode drew an int8 graph's weights as random int8 codes, so its outputs
    are not a quantised float model's (see :func:`wia_hw.quantize_model`)."""


class WeightDataAbsentWarning(UserWarning):
    """Functional mode drew weights of an imported model at random because the external
    data file holding them is not beside the model (a weight-stripped model): its
    outputs are not the model's."""


#: Above this many MACs in one op, functional mode refuses (it is for small sizes).
FUNCTIONAL_MAC_LIMIT = 2_000_000_000
_FLOATS = ("fp32", "fp16", "bf16")
#: Bytes per element a value is held in: floats as float32 whatever their dtype
#: (``cast_to`` keeps fp16 and bf16 values in float32)
_HELD_BYTES = {"int8": 1, "bool": 1, "int64": 8}
#: Elements rounded at a time when a weight is rounded to its dtype in place: the
#: temporaries of one chunk, not of the whole weight
_CHUNK = 1 << 20


def _held_bytes(dtype: str) -> int:
    return _HELD_BYTES.get(dtype, 4)


def _available_memory() -> int | None:
    """Bytes of memory available to allocate now (``MemAvailable``: free memory plus
    what the kernel can reclaim; else the free pages), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _last_readers(graph: Graph) -> dict[str, int]:
    """Tensor name -> the index of the last op that reads it."""
    last: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for n in op.inputs:
            last[n] = i
    return last


def _results(graph: Graph) -> set[str]:
    """What :meth:`FunctionalExecutor.outputs` returns: tensors written and never
    read, and the model's declared outputs."""
    written = {o for op in graph.ops for o in op.outputs}
    read = {i for op in graph.ops for i in op.inputs}
    keep = set(graph.declared_outputs)
    return {n for n in graph.tensors if n in written and (n not in read or n in keep)}


def functional_bytes(graph: Graph, keep: Collection[str] | None = None) -> int:
    """About how many bytes a functional run of ``graph`` holds at its peak: each value
    (its elements times the bytes it is held in) while it is held (``keep`` None:
    every tensor to the end; else from its first use to its last reader, as
    :class:`FunctionalExecutor` with ``keep`` does), plus the temporaries of the op
    running (its inputs converted, tiled or dequantised, and its result before the
    rounding to its dtype: 4 bytes an input element, 8 an output element)."""
    t = graph.tensors

    def size(name: str) -> int:
        return math.prod(t[name].shape) * _held_bytes(t[name].dtype)

    def numel(names: Sequence[str]) -> int:
        return sum(math.prod(t[n].shape) for n in names)

    temps = [4 * numel(op.inputs) + 8 * numel(op.outputs) for op in graph.ops]
    if keep is None:
        return sum(size(n) for n in t) + max(temps, default=0)
    # inputs and non-float weights are held from the start (drawn up front)
    lazy = {n for n, v in t.items() if v.kind == "weight" and v.dtype in _FLOATS}
    held = sum(size(n) for n, v in t.items() if v.kind in ("input", "weight") and n not in lazy)
    last, stay = _last_readers(graph), _results(graph) | set(keep)
    peak = held
    for i, op in enumerate(graph.ops):
        new = {n for n in op.inputs if n in lazy}
        lazy -= new
        held += sum(size(n) for n in new) + sum(size(n) for n in op.outputs)
        peak = max(peak, held + temps[i])
        held -= sum(
            size(n)
            for n in set(op.inputs) | set(op.outputs)
            if last.get(n, -1) <= i and n not in stay
        )
    return peak


def _rounded(arr: np.ndarray, dtype: str, own: bool = False) -> np.ndarray:
    """``cast_to(arr, dtype)`` for a float dtype, the same values, rounded a chunk at a
    time into one float32 array (``arr`` itself when ``own``: an array the executor
    drew, a C-contiguous float32 one): whole-weight temporaries of a large weight
    would double or triple what it holds."""
    a = np.asarray(arr)
    if dtype == "fp32" or a.ndim == 0:
        return cast_to(a, dtype)
    inplace = own and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
    out = a if inplace else np.empty(a.shape, np.float32)
    src, dst = a.reshape(-1), out.reshape(-1)
    for i in range(0, dst.size, _CHUNK):
        dst[i : i + _CHUNK] = round_to_precision(
            np.asarray(src[i : i + _CHUNK], dtype=np.float32), dtype
        )
    return out


def _advance_normal(rng: np.random.Generator, n: int) -> None:
    """Move ``rng`` past ``n`` float32 standard normals without holding them: the
    generator fills an array one element after another, so drawing in chunks leaves
    it where one draw of ``n`` would."""
    for i in range(0, n, _CHUNK):
        rng.standard_normal(min(_CHUNK, n - i), dtype=np.float32)


def _offset(p: QuantParams) -> int:
    """What is subtracted from codes to hold them: 128 for uint8, else 0."""
    return 128 if (p.lo, p.hi) == (0, 255) else 0


def _same(fx: FunctionalExecutor, name: str, p: QuantParams) -> bool:
    """Whether held codes ``name`` have the parameters ``p``."""
    return bool(
        np.shape(fx.scales[name]) == np.shape(p.scale)
        and np.array_equal(fx.scales[name], p.scale)
        and np.array_equal(fx.zeros[name], p.zero_point - _offset(p))
    )


def _agree(a: Any, b: Any) -> bool:
    """Whether two scales (scalars or per-channel vectors) are equal to float32
    rounding."""
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    n = max(a.size, b.size)
    if a.size not in (1, n) or b.size not in (1, n):
        return False
    return bool(np.allclose(np.broadcast_to(a, n), np.broadcast_to(b, n), rtol=1e-5, atol=0))


def _codable(op: Op, y: Any) -> np.ndarray:
    """``y`` (the real values ``op`` quantises to integer codes) as float32; else, when
    it holds a NaN or infinity, one WorkloadError line naming ``op``: no code means
    NaN, so the cast would give finite, arbitrary codes and a quantised graph a
    confident answer where the float one gives NaN (as :func:`wia_hw.quantize_model`
    refuses non-finite weights). An infinity is refused too: it would set a dynamic
    scale to infinity, a calibrated scale never saw one, and ``QuantParams.quantise``
    does not saturate it (its integer cast wraps)."""
    y = np.asarray(y, np.float32)
    if (bad := nonfinite(y)) is not None:
        raise WorkloadError(
            f"op {op.name!r} ({op.kind}): the values it quantises to integer codes hold "
            f"{bad[0]} NaN or inf {bad[1]}; a non-finite value has no code (check the inputs)"
        )
    return y


def nonfinite(a: np.ndarray) -> tuple[int, str] | None:
    """``None`` when every element of ``a`` is finite, else how many are not and where
    the first is: ``(3, "of 64 (first nan at [0, 5])")``."""
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    at = [int(i) for i in np.argwhere(bad)[0]]
    return int(bad.sum()), f"of {a.size} (first {a[tuple(at)]} at {at})"


def _fan_in(shape: Sequence[int]) -> int:
    return shape[0] if len(shape) == 2 else max(1, math.prod(shape) // shape[0])


class FunctionalExecutor:
    """Holds the values (and int8 scales) of a graph while its ops execute in order."""

    def __init__(
        self,
        graph: Graph,
        seed: int,
        given: Mapping[str, np.ndarray] | None = None,
        *,
        keep: Collection[str] | None = None,
    ) -> None:
        """``given``: values of inputs and weights. ``keep``: None holds every tensor's
        value (``values``) to the end; else only the graph's results (:meth:`outputs`)
        and ``keep`` are held after their last reader, and float weights load (or are
        drawn, the same values) when an op first reads them (module docstring)."""
        self.graph = graph
        self.seed = seed
        self.values: dict[str, np.ndarray] = {}
        self.scales: dict[str, float] = {}
        rng = np.random.default_rng(seed)
        vocab = {
            op.inputs[0]: graph.tensors[op.inputs[1]].shape[0]
            for op in graph.ops
            if op.kind == "embedding"
        }
        given = dict(given or {})
        unknown = set(given) - {
            n for n, t in graph.tensors.items() if t.kind in ("input", "weight")
        }
        if unknown:
            raise WorkloadError(
                f"inputs {sorted(unknown)} are not inputs or weights of {graph.name!r}"
            )
        # before anything is allocated: a run that cannot fit is one line, not an
        # out-of-memory kill or a machine swapping for minutes
        need, avail = functional_bytes(graph, keep), _available_memory()
        if avail is not None and need > avail:
            raise WorkloadError(
                f"graph {graph.name!r}: functional mode would hold about "
                f"{need / 1e9:.2f} GB (its values and the largest op's temporaries), more "
                f"than the {avail / 1e9:.2f} GB of memory available; use mode='timing', "
                "or a smaller batch or sequence"
            )
        #: values not held yet: float weights loaded or drawn when an op first reads
        #: them (``keep``), name -> a function giving the value
        self._pending: dict[str, Callable[[], np.ndarray]] = {}
        #: tensors freed after their last reader (``keep``): op name -> names
        self._free: dict[str, list[str]] = {}
        random_int8: list[str] = []  # int8 weights drawn as random codes
        drawn: list[str] = []  # float weights drawn (none given, none in the model)
        supplied = set(given)  # values given, or the graph's own (codes as stored)
        for name, t in graph.tensors.items():
            if t.kind not in ("input", "weight"):
                continue
            value = graph.weight_values.get(name) if t.kind == "weight" else None
            if name not in given and value is not None:
                # the weight's own value from the graph (an ONNX model's), read when it
                # is needed and never held twice (its original format and rounded)
                if keep is not None and t.dtype in _FLOATS:
                    self._pending[name] = lambda n=name, v=value, t=t: self._own(n, t, v)
                    continue
                arr = self._own(name, t, value)
                if arr is not None:
                    self.values[name] = arr
                    supplied.add(name)
                    continue
            if name in given:
                arr = np.asarray(given[name])
                if tuple(arr.shape) != t.shape:
                    raise WorkloadError(
                        f"input {name!r}: shape {list(arr.shape)} given, the "
                        f"graph needs {list(t.shape)}"
                    )
                # stored in the tensor's dtype, as uploading it to the device does
                self.values[name] = _rounded(arr, t.dtype) if t.dtype in _FLOATS else arr
                continue
            if t.kind == "weight" and t.dtype in _FLOATS:
                drawn.append(name)
                if keep is not None:  # drawn again on first use, from this state
                    state = rng.bit_generator.state
                    _advance_normal(rng, math.prod(t.shape))
                    self._pending[name] = lambda s=state, t=t: self._normal(s, t)
                else:
                    self.values[name] = self._normal(rng, t)
                continue
            arr = random_input(rng, t.shape, t.dtype, vocab.get(name))
            if t.dtype == "int8":
                fan = _fan_in(t.shape) if t.kind == "weight" else 1
                self.scales[name] = 1.0 / (127.0 * math.sqrt(fan))
                if t.kind == "weight" and name not in graph.quant:
                    random_int8.append(name)
            self.values[name] = arr
        if keep is not None:
            stay = _results(graph) | set(keep)
            for n, i in _last_readers(graph).items():
                if n not in stay:
                    self._free.setdefault(graph.ops[i].name, []).append(n)
        if random_int8:
            warnings.warn(
                f"functional mode drew {len(random_int8)} int8 weight(s) of {graph.name!r} "
                f"as random codes (e.g. {random_int8[0]!r}), unrelated to the float "
                "model's weights at the same seed: its outputs are not the float model's "
                "quantised; to measure int8 error, quantise a float graph "
                "(wia_hw.quantize_model) or give the weights",
                RandomInt8WeightsWarning,
                stacklevel=2,
            )
        absent = graph.params.get("weight_data_absent")
        if absent and (drawn or random_int8):
            n = len(drawn) + len(random_int8)
            model = graph.params.get("source") or graph.name
            warnings.warn(
                f"functional mode drew {n} weight(s) of {model!r} at random "
                f"(e.g. {(drawn or random_int8)[0]!r}): the external data file "
                f"{absent!r} holding the model's weights is not beside it, so the "
                "outputs are not the model's; put the file beside the model, or give "
                "the weights",
                WeightDataAbsentWarning,
                stacklevel=2,
            )
        #: zero points of the tensors with static parameters (Graph.quant)
        self.zeros: dict[str, Any] = {}
        for name, p in graph.quant.items():
            t = graph.tensors[name]
            if t.kind in ("input", "weight"):
                raw = np.asarray(self.values[name])
                off = _offset(p)
                if name in supplied and off:  # codes as the model stores them
                    raw = raw.astype(np.int64) - off
                self.values[name] = raw.astype(np.int8 if p.hi - p.lo < 256 else np.int32)
                self.scales[name] = p.scale
                self.zeros[name] = p.zero_point - off

    def _own(self, name: str, t: Any, value: Callable[[], Any]) -> np.ndarray | None:
        """Weight ``name``'s value from the graph (``weight_values``), stored in its
        dtype. When its shape is not the tensor's it is drawn instead: None (the
        caller draws it in turn), or, loaded on first use (``keep``, the turn past),
        from a generator of its own seeded by the run's seed and its name."""
        arr = np.asarray(value())
        if tuple(arr.shape) == t.shape:
            return _rounded(arr, t.dtype) if t.dtype in _FLOATS else arr
        if name not in self._pending:
            return None
        return self._normal(np.random.default_rng([self.seed, zlib.crc32(name.encode())]), t)

    def _normal(self, rng: np.random.Generator | Mapping[str, Any], t: Any) -> np.ndarray:
        """A float weight ``N(0, 1/fan_in)`` rounded once to its dtype (the values it
        can hold), drawn from ``rng`` (a generator, or a bit generator's saved state),
        divided and rounded in place."""
        if not isinstance(rng, np.random.Generator):
            bits = getattr(np.random, rng["bit_generator"])()
            bits.state = rng
            rng = np.random.Generator(bits)
        arr = rng.standard_normal(t.shape, dtype=np.float32)
        arr /= np.float32(math.sqrt(_fan_in(t.shape)))
        return _rounded(arr, t.dtype, own=True)

    def _load(self, op: Op) -> None:
        """Hold the pending weights ``op`` reads (``keep``)."""
        for i in op.inputs:
            make = self._pending.get(i)
            if make is not None:
                self.values[i] = make()
                del self._pending[i]

    def _dequantised(self, name: str) -> np.ndarray:
        v = self.values[name]
        s = self.scales.get(name)
        if s is None:
            return v
        z = self.zeros.get(name)
        if z is not None:
            return ((v.astype(np.float64) - z) * s).astype(np.float32)
        return v.astype(np.float32) * np.float32(s)

    # -- static quantisation (Graph.quant) -----------------------------------------------
    def _requantise(self, op: Op, name: str, y: np.ndarray, p: QuantParams) -> None:
        off = _offset(p)
        q = p.quantise(_codable(op, y))
        self.values[name] = (q - off).astype(np.int8 if p.hi - p.lo < 256 else np.int32)
        self.scales[name] = p.scale
        self.zeros[name] = p.zero_point - off

    def _dynamic_quant(self, op: Op) -> None:
        """ONNX's DynamicQuantizeLinear: uint8 codes over ``[min(0, x), max(0, x)]``,
        the scale and zero point computed from this input in float32, as ONNX does (an
        all-zero input takes scale 1). Held minus 128, as every uint8 code."""
        x = _codable(op, self._dequantised(op.inputs[0]))
        lo = np.float32(min(0.0, float(x.min()))) if x.size else np.float32(0)
        hi = np.float32(max(0.0, float(x.max()))) if x.size else np.float32(0)
        scale = np.float32((hi - lo) / np.float32(255)) or np.float32(1)
        zero = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)).astype(np.int64)
        self._requantise(op, op.outputs[0], x, QuantParams(np.asarray(scale), zero, 0, 255))

    def _static_step(self, op: Op, kernels: Sequence[Kernel], device: Device | None) -> None:
        g = self.graph
        out_name = op.outputs[0]
        out = g.tensors[out_name]
        p = g.quant.get(out_name)
        data = [op.inputs[i] for i in ([1] if op.kind == "embedding" else range(len(op.inputs)))]
        coded = [i for i in data if i in self.zeros]
        ints = ("int8", "int32")
        if (
            op.kind in (*MOVE_KINDS, "embedding")
            and out.dtype in ints
            and all(g.tensors[i].dtype == out.dtype for i in data)
            and (coded or p is not None)
            and all(p is None or _same(self, c, p) for c in coded)
            and (len(coded) == len(data) or not coded)
        ):  # codes move unchanged: with their parameters, or (raw integers that a
            # DequantizeLinear reads after the move: ONNX Runtime's quantised Gather)
            # taking the output's
            ins = [self.values[i] for i in op.inputs]
            if not coded and _offset(p):  # raw uint8 codes: held minus 128 from here
                ins = [
                    (v.astype(np.int16) - _offset(p)).astype(np.int8) if i in data else v
                    for i, v in zip(op.inputs, ins, strict=True)
                ]
            self.values[out_name] = evaluate(op.kind, op.attrs, ins, out.shape, out.dtype)
            if coded:
                self.scales[out_name] = self.scales[coded[0]]
                self.zeros[out_name] = self.zeros[coded[0]]
            else:
                self.scales[out_name] = p.scale
                self.zeros[out_name] = p.zero_point - _offset(p)
            return
        y = self._static_gemm(op, kernels, device) if op.kind in GEMM_KINDS else None
        if y is None:
            ins = [self._dequantised(i) for i in op.inputs]
            y = (
                self._gemm(op, ins, "fp32", kernels, device)
                if op.kind in GEMM_KINDS
                else evaluate(op.kind, op.attrs, ins, out.shape, "fp32", None, op.name)
            )
        if p is not None:
            self._requantise(op, out_name, y, p)
        elif out.dtype == "int8":  # codes without static parameters: the dynamic rule
            self._dynamic_int8(op, out_name, np.asarray(y, np.float32))
        else:
            self.values[out_name] = cast_to(np.asarray(y, np.float32), out.dtype)

    def _calibrated_step(
        self, op: Op, q: Mapping[str, Any], kernels: Sequence[Kernel], device: Device | None
    ) -> None:
        """An op of a :func:`wia_hw.quantize_model` graph: a vector op that writes int8
        with its ``output_scale``, a quantising ``cast`` with its ``scale``, or an int8
        GEMM whose int32 accumulator (bias included) is scaled by ``input_scale *
        weight_scale``. The codes' scales are the calibrated ones, never the dynamic
        rule's: the weights' codes carry no scale of their own."""
        out = op.outputs[0]
        t = self.graph.tensors[out]
        if "output_scale" in q or op.kind == "cast":
            s = np.float32(q["output_scale"] if "output_scale" in q else q["scale"])
            if op.kind == "cast":
                y = self._dequantised(op.inputs[0]).astype(np.float32)
            else:
                ins = [self._dequantised(i) for i in op.inputs]
                y = evaluate(op.kind, op.attrs, ins, t.shape, "fp32", None, op.name)
            y = _codable(op, y)
            self.values[out] = np.clip(np.rint(y / s), -127, 127).astype(np.int8)
            self.scales[out] = float(s)
            return
        acc = self._gemm(op, [self.values[i] for i in op.inputs], "int32", kernels, device)
        sw = np.asarray(q["weight_scale"], dtype=np.float64)
        scale = (float(q["input_scale"]) * sw).astype(np.float32)
        self.values[out] = cast_to(acc.astype(np.float32) * scale, t.dtype)

    def _dynamic_int8(self, op: Op, name: str, x: np.ndarray) -> None:
        """Dynamic symmetric per-tensor int8: ``scale = max|x| / 127`` (``op`` writes
        ``name``; a NaN or infinity in ``x`` is refused, naming it)."""
        x = _codable(op, x)
        amax = float(np.max(np.abs(x))) if x.size else 0.0
        scale = amax / 127.0 if amax > 0 else 1.0
        self.values[name] = np.clip(np.rint(x / np.float32(scale)), -127, 127).astype(np.int8)
        self.scales[name] = scale

    def _static_gemm(
        self, op: Op, kernels: Sequence[Kernel], device: Device | None
    ) -> np.ndarray | None:
        """The real-valued result of a GEMM on codes (module docstring), or None when
        its parameters do not factor out of the sum (then it runs on dequantised
        values)."""
        g = self.graph
        a, b = op.inputs[:2]
        if a not in self.zeros or b not in self.zeros:
            return None
        sa, za = np.asarray(self.scales[a]), np.asarray(self.zeros[a])
        sb, zb = np.asarray(self.scales[b]), np.asarray(self.zeros[b])
        if sa.size != 1 or za.size != 1:
            return None
        wshape = g.tensors[b].shape
        if sb.size == 1 and zb.size == 1:
            out_scale = sa.reshape(()) * sb.reshape(())
        elif (
            op.kind in ("linear", "matmul")
            and sb.shape[-1:] == wshape[-1:]
            and sb.size == wshape[-1]
        ):
            out_scale = sa.reshape(()) * sb.reshape(-1)  # per output column
        elif op.kind == "conv2d" and sb.shape == (wshape[0], 1, 1, 1):
            out_scale = sa.reshape(()) * sb.reshape(-1, 1, 1)  # per output channel
        else:
            return None
        shape = g.tensors[op.outputs[0]].shape
        bias, extra = None, None
        if len(op.inputs) > 2:
            c = op.inputs[2]
            if c in self.zeros and not np.any(self.zeros[c]) and _agree(self.scales[c], out_scale):
                bias = self.values[c]  # in the accumulator's units: added in int32
            else:
                extra = self._dequantised(c)
        va, vb = self.values[a], self.values[b]
        if not za and not np.any(zb) and va.dtype == np.int8 and vb.dtype == np.int8:
            acc = self._gemm(
                op, [va, vb] + ([bias] if bias is not None else []), "int32", kernels, device
            )
            y = acc.astype(np.float64)
            if op.kind == "bmm" and op.attrs.get("scale") is not None:
                y = y * float(op.attrs["scale"])
        else:
            ins = [va.astype(np.float64) - za, vb.astype(np.float64) - zb]
            if bias is not None:
                ins.append(bias.astype(np.float64))
            ops = gemm_operands(op.kind, op.attrs, ins, shape)
            c3 = np.matmul(ops.a, ops.b)
            if ops.bias is not None:
                c3 = c3 + ops.bias[:, None, :]
            y = ops.finish(c3)
        y = y * out_scale
        if extra is not None:
            y = y + (extra.reshape(-1, 1, 1) if op.kind == "conv2d" else extra)
        return y.astype(np.float32)

    def _gemm(
        self,
        op: Op,
        ins: list[np.ndarray],
        out_dtype: str,
        kernels: Sequence[Kernel],
        device: Device | None,
    ) -> np.ndarray:
        """A GEMM-class op: over ``device``'s tiles when it was lowered to one built-in
        GemmKernel (integer operands -> int8 arithmetic, else the kernel's float
        precision; fp32 for an int8 kernel fed dequantised floats), else ``evaluate``."""
        shape = self.graph.tensors[op.outputs[0]].shape
        unit = next((k.attrs["unit_gemm"] for k in kernels if "unit_gemm" in k.attrs), None)
        if unit is not None:  # an attached unit (analog, photonic): its noisy model
            return self._unit_gemm(op, unit, ins, shape)
        gemms = [k for k in kernels if isinstance(k, GemmKernel)]
        if device is None or len(kernels) != 1 or not gemms:
            tk = gemms[0].tiling.tk if gemms else None
            return evaluate(op.kind, op.attrs, ins, shape, out_dtype, tk, op.name)
        kern = gemms[0]
        ops = gemm_operands(op.kind, op.attrs, ins, shape)
        a, b = ops.a, ops.b
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            arith = "int8"
            a, b = (np.clip(v, -128, 127).astype(np.int8) for v in (a, b))
        else:
            arith = kern.precision if kern.precision in _FLOATS else "fp32"
        # values held in the arithmetic's own format need no rounding (cast on the way in)
        held = all(
            self.graph.tensors[i].dtype == arith and i not in self.scales for i in op.inputs[:2]
        )
        tiles, _ = device.tiles_of(kern)
        arr = device.spec.compute.array
        c = execute_gemm(
            kern,
            tiles,
            a,
            b,
            ops.bias,
            dataflow=arr.dataflow,
            rows=arr.rows,
            cols=arr.cols,
            arithmetic=arith,
            round_operands=not held,
            arrays=device.spec.compute.arrays_per_core,
        )
        return ops.finish(c)  # int32, or float32 that step() rounds to the output dtype

    def _unit_gemm(
        self, op: Op, unit: Any, ins: list[np.ndarray], shape: tuple[int, ...]
    ) -> np.ndarray:
        """A GEMM an attached unit took: ``unit(a [m, k], b [k, n], seed)`` per batch
        entry (a conv2d's groups), seeded by the run's seed, the op's name and the entry;
        the bias is added digitally in float32."""
        ops = gemm_operands(op.kind, op.attrs, ins, shape)
        shared = ops.b.shape[0] == 1
        c = np.stack(
            [
                np.asarray(
                    unit(
                        ops.a[i].astype(np.float64),
                        ops.b[0 if shared else i].astype(np.float64),
                        zlib.crc32(f"{self.seed}:{op.name}:{i}".encode()),
                    ),
                    dtype=np.float32,
                )
                for i in range(ops.a.shape[0])
            ]
        )
        if ops.bias is not None:
            c = c + ops.bias.astype(np.float32)[:, None, :]
        return ops.finish(c)

    def step(self, op: Op, kernels: Sequence[Kernel] = (), device: Device | None = None) -> None:
        """Compute ``op``'s output. ``kernels``: what ``op`` was lowered to; ``device``:
        the device that ran them (its tiles and array shape drive the GEMM arithmetic;
        without it GEMMs are evaluated untiled). With ``keep``, the weights ``op`` reads
        load first and the values it read last are freed after."""
        self._load(op)
        self._step(op, kernels, device)
        for name in self._free.pop(op.name, ()):
            for held in (self.values, self.scales, self.zeros):
                held.pop(name, None)

    def _step(self, op: Op, kernels: Sequence[Kernel], device: Device | None) -> None:
        g = self.graph
        if op.kind in GEMM_KINDS and op_macs(op, g.shapes_of(op)[0]) > FUNCTIONAL_MAC_LIMIT:
            raise WorkloadError(
                f"op {op.name!r}: too large for functional mode "
                f"(> {FUNCTIONAL_MAC_LIMIT:.0e} MACs); use mode='timing'"
            )
        if "quant" in op.attrs:  # quantize_model's static scales (module docstring)
            self._calibrated_step(op, op.attrs["quant"], kernels, device)
            return
        if op.kind == "cast" and op.attrs.get("dynamic_quant"):
            self._dynamic_quant(op)
            return
        if g.quant and (op.outputs[0] in g.quant or any(i in self.zeros for i in op.inputs)):
            self._static_step(op, kernels, device)
            return
        out_name = op.outputs[0]
        out = g.tensors[out_name]
        int_gemm = op.kind in GEMM_KINDS and all(
            self.values[i].dtype == np.int8 for i in op.inputs[:2]
        )
        if op.kind in MOVE_KINDS:  # integers and their scale move unchanged
            self.values[out_name] = evaluate(
                op.kind,
                op.attrs,
                [self.values[i] for i in op.inputs],
                out.shape,
                out.dtype,
                None,
                op.name,
            )
            if op.inputs[0] in self.scales and out.dtype in ("int8", "int32"):
                self.scales[out_name] = self.scales[op.inputs[0]]
            return
        if int_gemm:  # exact int32 accumulation, as the array does
            acc = self._gemm(op, [self.values[i] for i in op.inputs], "int32", kernels, device)
            sa, sb = (self.scales.get(i) for i in op.inputs[:2])
            if out.dtype == "int32":  # stays integer; carries a scale if its inputs did
                self.values[out_name] = acc
                if sa is not None or sb is not None:
                    self.scales[out_name] = (sa or 1.0) * (sb or 1.0)
                return
            scale = (sa or 1.0) * (sb or 1.0)
            result = acc.astype(np.float32) * np.float32(scale)
        else:
            ins = [self._dequantised(i) for i in op.inputs]
            dt = "fp32" if out.dtype == "int8" else out.dtype
            result = (
                self._gemm(op, ins, dt, kernels, device)
                if op.kind in GEMM_KINDS
                else evaluate(op.kind, op.attrs, ins, out.shape, dt, None, op.name)
            )
        if out.dtype == "int8":  # dynamic symmetric requantisation
            self._dynamic_int8(op, out_name, np.asarray(result, dtype=np.float32))
        else:
            self.values[out_name] = cast_to(result, out.dtype)

    def outputs(self) -> dict[str, np.ndarray]:
        """The graph's results (tensors written and never read, and the model's declared
        outputs), dequantised where they carry a scale (an int8 GEMM on user-given
        integers returns its raw int32)."""
        results = _results(self.graph)  # an ONNX model's declared outputs, read or not
        return {n: self._dequantised(n) for n in self.graph.tensors if n in results}

    def value(self, name: str) -> Any:
        return self.values[name]
