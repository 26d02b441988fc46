"""Floating-point multiply-accumulate units with IEEE binary32 accumulation: ``FpMac``
(fp16 or bf16 inputs, combinational, one MAC per cycle) and ``Fp32Mac`` (binary32 inputs,
one MAC every four cycles through a 24 x 6-bit multiplier). Both share the product
rounding and the adder below; two components in one file because of that shared
datapath."""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._checks import check_choice

__all__ = [
    "FP_FORMATS",
    "FP_LAYOUTS",
    "FP32_CANONICAL_NAN",
    "FP32_PASSES",
    "FP32_SLICE_BITS",
    "Fp32Mac",
    "FpMac",
]

#: Input formats of the floating-point units (the same names as
#: ``wia_hw.emulator.golden.FP_FORMATS``): ``FpMac`` takes the 16-bit ones, ``Fp32Mac``
#: binary32.
FP_FORMATS = ("fp16", "bf16", "fp32")
#: Format -> (exponent bits, fraction bits) of its encoding.
FP_LAYOUTS = {"fp16": (5, 10), "bf16": (8, 7), "fp32": (8, 23)}
#: Cycles (multiplier passes) per ``Fp32Mac`` MAC, and the multiplier-operand bits per
#: pass: ``FP32_PASSES * FP32_SLICE_BITS`` covers binary32's 24-bit significand.
FP32_PASSES = 4
FP32_SLICE_BITS = 6
#: The only NaN the unit outputs (quiet, positive, zero payload).
FP32_CANONICAL_NAN = 0x7FC00000

# binary32: fraction bits, exponent bias, largest finite biased exponent.
_F32_FRAC = 23
_F32_BIAS = 127
_F32_EMAX = 254
# Significands are 24-bit integers; the adder keeps 3 bits below them (guard, round,
# sticky) and one carry bit above.
_SIG = _F32_FRAC + 1
_GRS = 3


@dataclass(frozen=True)
class _Operand:
    """A decoded IEEE value. Finite values are ``(-1)**sign * sig * 2**(exp - bias - frac)``
    with ``exp >= 1``: a subnormal has ``exp == 1`` and no hidden bit, so one formula
    covers normals, subnormals and zero (``sig == 0``)."""

    sign: Value
    exp: Value
    sig: Value
    is_zero: Value
    is_inf: Value
    is_nan: Value


def _decode(bits: Value, exp_bits: int, frac_bits: int) -> _Operand:
    frac = bits[:frac_bits]
    field = bits[frac_bits : frac_bits + exp_bits]
    all_ones = (1 << exp_bits) - 1
    return _Operand(
        sign=bits[-1],
        exp=Mux(field == 0, 1, field),
        sig=Cat(frac, field != 0),
        is_zero=(field == 0) & (frac == 0),
        is_inf=(field == all_ones) & (frac == 0),
        is_nan=(field == all_ones) & (frac != 0),
    )


def _stage(m: Module, name: str) -> Module:
    """A submodule for one stage of the datapath (see ``FpMac.elaborate``)."""
    stage = Module()
    m.submodules[name] = stage
    return stage


def _wire(stage: Module, shape: object, value: object, name: str) -> Signal:
    """A named signal of ``shape`` that ``stage`` drives with ``value``."""
    sig = Signal(shape, name=name)
    stage.d.comb += sig.eq(value)
    return sig


def _leading_zeros(value: Value) -> Value:
    """Count of zero bits above the highest one of ``value`` (``len(value)`` if zero)."""
    width = len(value)
    count: Value = Const(width, range(width + 1))
    for i in range(width):  # a higher set bit takes priority over the lower ones
        count = Mux(value[i], width - 1 - i, count)
    return count


def _clamp(amount: Value, limit: int) -> Value:
    return Mux(amount > limit, limit, amount)


def _shift_right_sticky(value: Value, amount: Value) -> Value:
    """``value >> amount`` with the OR of the bits shifted out ORed into bit 0 (the
    sticky bit). ``amount`` must be a narrow unsigned value in ``[0, len(value)]``."""
    shifted = value >> amount
    lost = (shifted << amount)[: len(value)] != value
    return shifted | lost


class FpMac(wiring.Component):
    """``y = fl32(c + fl32(a * b))``: one unfused floating-point MAC, combinational.

    Ports
        ``a``, ``b`` (in, 16 bits): raw fp16 (1/5/10) or bf16 (1/8/7) bit patterns.
        ``c`` (in, 32 bits): the accumulator, raw IEEE-754 binary32 bits.
        ``y`` (out, 32 bits): the new accumulator, raw binary32 bits.

    Latency: 0 cycles (purely combinational; no clock or reset).

    Arithmetic, bit-exact with ``wia_hw.emulator.golden.fp_mac_matmul`` (one step of its
    ``k`` loop): the product ``a * b`` is first rounded to binary32 (exact for fp16; a
    bf16 product can fall into binary32's subnormal range, where it is rounded, or past
    its largest finite value, where it becomes a signed infinity), then ``c + product``
    is rounded once to binary32. Rounding is round-to-nearest, ties-to-even. Subnormal
    inputs, products and sums are kept (no flush to zero). An exact zero sum is ``-0``
    only when both addends are ``-0``. ``inf - inf`` and ``0 * inf`` are invalid; any
    invalid operation or NaN input gives the canonical quiet NaN ``0x7FC00000``.

    Datapath: decode -> exact integer product and its leading-zero count -> normalise to
    a binary32 significand (denormalise and round for bf16 underflow) -> order the two
    addends by magnitude -> align the smaller with guard/round/sticky bits -> add or
    subtract -> normalise (leading-zero count, never below the subnormal exponent) ->
    round to nearest even -> encode; special values override the result last.

    Parameters
    ----------
    fmt:
        ``"fp16"`` or ``"bf16"``. ``TypeError`` if not a string, ``ValueError`` otherwise.
    """

    def __init__(self, fmt: str) -> None:
        self._fmt = check_choice("fmt", fmt, FP_FORMATS[:2])
        super().__init__({"a": In(16), "b": In(16), "c": In(32), "y": Out(32)})

    @property
    def fmt(self) -> str:
        """``"fp16"`` or ``"bf16"``."""
        return self._fmt

    def elaborate(self, platform: object) -> Module:
        # Each stage is its own submodule: the same hardware as one flat module, but
        # Amaranth's simulator then re-evaluates only the stages whose inputs changed
        # (a flat module is re-evaluated in full once per level of its signal chain,
        # which made the simulation about 3x slower).
        m = Module()
        exp_bits, frac_bits = FP_LAYOUTS[self._fmt]
        a = _decode(self.a, exp_bits, frac_bits)
        b = _decode(self.b, exp_bits, frac_bits)
        st = _stage(m, "multiply")
        prod_int = _wire(st, 2 * (frac_bits + 1), a.sig * b.sig, "prod_int")
        _mac_back_end(m, a, b, prod_int, exp_bits, frac_bits, self.c, self.y)
        return m


class Fp32Mac(wiring.Component):
    """``y = fl32(c + fl32(a * b))`` on binary32 operands, one MAC every
    :data:`FP32_PASSES` (4) cycles: the 24 x 24-bit significand product is built in four
    passes of one 24 x 6-bit multiplier, then rounded and added like :class:`FpMac`.

    Ports
        ``a``, ``b`` (in, 32 bits): raw binary32 operands, held for the four passes.
        ``c`` (in, 32 bits): the accumulator (raw binary32), read in pass 3 only.
        ``phase`` (in, 2 bits): the pass of this cycle, 0, 1, 2, 3 in consecutive cycles.
        ``y`` (out, 32 bits): the new accumulator, valid in the cycle of pass 3.

    Timing: pass ``p`` multiplies ``sig(a)`` by bits ``[6p, 6p+6)`` of ``sig(b)`` and adds
    it, shifted by ``6p``, to the partial product (register ``partial``, loaded every
    cycle; pass 0 starts it from 0). In pass 3 the last partial product completes the
    exact 48-bit product combinationally and ``y`` follows combinationally: a MAC
    presented in cycles ``t .. t+3`` has its result on ``y`` in cycle ``t+3`` (the PE
    registers it at the edge that ends it), and the next MAC may start in cycle ``t+4``.
    Throughput 1/4 MAC per cycle, the ``fp32`` rate the emulator charges
    (``macs_per_pe_cycle: {fp32: 0.25}``).

    Arithmetic, bit-exact with ``wia_hw.emulator.golden.fp_mac_matmul(..., "fp32")``: the
    exact product is rounded to binary32 (round to nearest, ties to even; into the
    subnormal range below 2**-126; to a signed infinity past the largest finite value),
    then ``c + product`` is rounded once more (two roundings, not a fused multiply-add,
    as numpy's ``float32`` ``a * b + c``). Subnormal inputs, products and sums are kept
    (no flush to zero); zeros, infinities and NaNs follow :class:`FpMac` (canonical NaN
    ``0x7FC00000``; an exact zero sum is ``-0`` only when both addends are ``-0``).
    """

    def __init__(self) -> None:
        super().__init__({"a": In(32), "b": In(32), "c": In(32), "phase": In(2), "y": Out(32)})

    @property
    def fmt(self) -> str:
        """``"fp32"``."""
        return "fp32"

    def elaborate(self, platform: object) -> Module:
        m = Module()
        a = _decode(self.a, 8, _F32_FRAC)
        b = _decode(self.b, 8, _F32_FRAC)
        k = FP32_SLICE_BITS
        # ---- one pass: sig(a) x 6 bits of sig(b), shifted into place, plus the partial
        # product of the previous passes (a 24 x 6 multiplier and a 48-bit adder) ----
        st = _stage(m, "multiply")
        part = _wire(st, _SIG + k, a.sig * b.sig.word_select(self.phase, k), "pass_product")
        placed = Signal(2 * _SIG, name="pass_placed")
        with st.Switch(self.phase):
            for p in range(FP32_PASSES):
                with st.Case(p):
                    st.d.comb += placed.eq(part << (k * p))
        partial = Signal((FP32_PASSES - 1) * k + _SIG, name="partial")
        prod_int = _wire(st, 2 * _SIG, Mux(self.phase == 0, 0, partial) + placed, "prod_int")
        st.d.sync += partial.eq(prod_int[: len(partial)])
        _mac_back_end(m, a, b, prod_int, 8, _F32_FRAC, self.c, self.y)
        return m


def _round_product(
    m: Module, a: _Operand, b: _Operand, prod_int: Value, exp_bits: int, frac_bits: int
) -> tuple[Value, Value, Value]:
    """The exact product ``prod_int * 2**(a.exp + b.exp - 2*bias - 2*frac_bits)`` rounded
    to binary32 (nearest even), in the decoded form: ``(p_exp, p_sig, p_overflow)``.

    Normalise (leading one at bit 23 of a 24-bit significand); below 2**-126 shift right
    by ``1 - exp`` into the subnormal range; bits below the significand are kept as a
    guard and a sticky bit and rounded off (fp32 products always, bf16 ones only in the
    subnormal range, fp16 ones never: their 22-bit significands are normal binary32
    values). A rounding carry out of the top gives ``2**23`` and exponent + 1; past the
    largest finite exponent ``p_overflow`` is high (the product is a signed infinity)."""
    prod_width = len(prod_int)
    bias = (1 << (exp_bits - 1)) - 1
    st = _stage(m, "normalise_product")
    prod_lz = _wire(st, range(prod_width + 1), _leading_zeros(prod_int), "prod_lz")
    # normalised to a 24-bit significand (leading one at bit 23), the product's biased
    # binary32 exponent is  a.exp + b.exp + offset - prod_lz
    offset = _F32_BIAS - 2 * bias - 2 * frac_bits + prod_width - 1
    max_field = (1 << exp_bits) - 1  # inf/NaN fields give garbage, masked at the end
    prod_exp = _wire(
        st,
        range(2 + offset - prod_width, 2 * max_field + offset + 1),
        a.exp + b.exp + offset - prod_lz,
        "prod_exp",
    )
    shifted = (prod_int << prod_lz)[:prod_width]
    if prod_width <= _SIG:  # exact: pad below
        prod_norm = _wire(st, _SIG, Cat(Const(0, _SIG - prod_width), shifted), "prod_norm")
        ext = Cat(Const(0, 2), prod_norm)
    else:  # 24 bits kept, then a guard bit and the OR of the rest (sticky)
        norm_full = _wire(st, prod_width, shifted, "prod_norm")
        cut = prod_width - _SIG
        ext = Cat(norm_full[: cut - 1].any(), norm_full[cut - 1], norm_full[cut:])
    # Exponent range for finite non-zero inputs, known when elaborating: fp16 products
    # always are binary32 normals; bf16 and fp32 ones can underflow or overflow.
    finite_exp_min = 2 + offset - (prod_width - 1)
    finite_exp_max = 2 * (max_field - 1) + offset
    inexact = prod_width > _SIG
    under = (prod_exp < 1) if finite_exp_min < 1 else Const(0)
    carry: Value = Const(0)
    if finite_exp_min < 1 or inexact:
        # below 2**-126, shift right by 1 - prod_exp keeping the guard and a sticky bit
        # (2**-149 becomes the unit), then round to nearest even; a carry out of a
        # subnormal gives 2**23, the smallest normal, as is
        st = _stage(m, "round_product")
        width = _SIG + 2
        if finite_exp_min < 1:
            denorm_shift = _wire(
                st, range(width + 1), Mux(under, _clamp(1 - prod_exp, width), 0), "denorm_shift"
            )
            denorm = _shift_right_sticky(ext, denorm_shift)
        else:
            denorm = ext
        rounded = _wire(
            st, _SIG + 1, denorm[2:] + (denorm[1] & (denorm[0] | denorm[2])), "p_rounded"
        )
        if inexact:  # a normal significand of all ones rounds up to 2**24
            carry = rounded[_SIG]
            p_sig = _wire(st, _SIG, Mux(carry, rounded[1:], rounded[:_SIG]), "p_sig")
        else:
            p_sig = _wire(st, _SIG, rounded[:_SIG], "p_sig")
    else:
        p_sig = prod_norm
    p_overflow = (
        _wire(st, 1, (prod_exp + carry > _F32_EMAX) & (prod_int != 0), "p_overflow")
        if finite_exp_max + inexact > _F32_EMAX
        else Const(0)
    )
    # The product in the decoded binary32 form (exp >= 1, no hidden bit below 2**-126).
    p_exp = _wire(
        st, range(_F32_EMAX + 2), Mux(under | (prod_int == 0), 1, prod_exp + carry), "p_exp"
    )
    return p_exp, p_sig, p_overflow


def _mac_back_end(
    m: Module,
    a: _Operand,
    b: _Operand,
    prod_int: Value,
    exp_bits: int,
    frac_bits: int,
    c_bits: Value,
    y: Value,
) -> None:
    """Drive ``y = fl32(c + fl32(a * b))`` from the exact integer product ``prod_int =
    a.sig * b.sig`` (see :class:`FpMac`): round the product, then the adder."""
    c = _decode(c_bits, 8, _F32_FRAC)
    p_sign = a.sign ^ b.sign
    p_exp, p_sig, p_overflow = _round_product(m, a, b, prod_int, exp_bits, frac_bits)

    # ---- order the addends, |x| >= |y| (the decoded form is monotone in (exp, sig)) --
    st = _stage(m, "order")
    swap = Cat(c.sig, c.exp) < Cat(p_sig, p_exp)
    x_sign = _wire(st, 1, Mux(swap, p_sign, c.sign), "x_sign")
    y_sign = _wire(st, 1, Mux(swap, c.sign, p_sign), "y_sign")
    x_exp = _wire(st, range(_F32_EMAX + 2), Mux(swap, p_exp, c.exp), "x_exp")
    y_exp = _wire(st, range(_F32_EMAX + 2), Mux(swap, c.exp, p_exp), "y_exp")
    x_sig = _wire(st, _SIG, Mux(swap, p_sig, c.sig), "x_sig")
    y_sig = _wire(st, _SIG, Mux(swap, c.sig, p_sig), "y_sig")

    # ---- align y to x with guard/round/sticky bits, add or subtract (x - y >= 0) ----
    st = _stage(m, "add")
    width = _SIG + _GRS
    align = _wire(st, range(width + 1), _clamp(x_exp - y_exp, width), "align_shift")
    x_ext = Cat(Const(0, _GRS), x_sig)
    y_ext = _shift_right_sticky(Cat(Const(0, _GRS), y_sig), align)
    total = _wire(
        st,
        width + 1,  # one carry bit above the significand
        Mux(x_sign ^ y_sign, x_ext - y_ext, x_ext + y_ext),
        "sum",
    )

    # ---- normalise: carry -> shift right by one; else shift left by the leading
    # zeros, but never below the subnormal exponent 1 ----
    st = _stage(m, "normalise")
    carry = total[width]
    sum_lz = _wire(st, range(width + 1), _leading_zeros(total[:width]), "sum_lz")
    left = _wire(st, range(width + 1), Mux(sum_lz < x_exp - 1, sum_lz, x_exp - 1), "norm_shift")
    norm = _wire(
        st,
        width,
        Mux(carry, Cat(total[0] | total[1], total[2:]), (total[:width] << left)[:width]),
        "norm",
    )
    norm_exp = _wire(st, range(_F32_EMAX + 2), Mux(carry, x_exp + 1, x_exp - left), "norm_exp")

    # ---- round to nearest even on guard / (round | sticky); a carry out of the
    # rounding gives 2**24 -> 2**23 and exponent + 1 ----
    st = _stage(m, "round")
    kept = norm[_GRS:]
    guard, rest = norm[_GRS - 1], norm[: _GRS - 1].any()
    rounded = _wire(st, _SIG + 1, kept + (guard & (rest | kept[0])), "rounded")
    sum_sig = Mux(rounded[_SIG], rounded[1:], rounded[:_SIG])
    sum_exp = norm_exp + rounded[_SIG]
    # An exact zero is -0 only if both addends are negative (RNE); a non-zero exact
    # sum of two binary32 values never rounds to zero.
    sum_sign = Mux(total == 0, x_sign & y_sign, x_sign)
    sum_field = Mux(sum_sig[_F32_FRAC], sum_exp, 0)  # no hidden bit: subnormal/zero

    # ---- encode; special values override, in priority order ----
    p_inf = a.is_inf | b.is_inf | p_overflow
    invalid = (
        a.is_nan
        | b.is_nan
        | c.is_nan
        | (a.is_zero & b.is_inf)
        | (a.is_inf & b.is_zero)
        | (p_inf & c.is_inf & (p_sign != c.sign))
    )
    with m.If(invalid):
        m.d.comb += y.eq(FP32_CANONICAL_NAN)
    with m.Elif(p_inf):
        m.d.comb += y.eq(_infinity(p_sign))
    with m.Elif(c.is_inf):
        m.d.comb += y.eq(c_bits)
    with m.Elif(sum_exp > _F32_EMAX):
        m.d.comb += y.eq(_infinity(sum_sign))
    with m.Else():
        m.d.comb += y.eq(Cat(sum_sig[:_F32_FRAC], sum_field[:8], sum_sign))


def _infinity(sign: Value) -> Value:
    return Cat(Const(0, _F32_FRAC), Const(0xFF, 8), sign)
