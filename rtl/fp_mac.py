"""Floating-point multiply-accumulate: fp16 or bf16 inputs, IEEE binary32 accumulation."""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._checks import check_choice

__all__ = ["FP_FORMATS", "FP_LAYOUTS", "FP32_CANONICAL_NAN", "FpMac"]

#: Input formats of the unit (the same names as ``wia_hw.emulator.golden.FP_FORMATS``).
FP_FORMATS = ("fp16", "bf16")
#: Format -> (exponent bits, fraction bits) of its 16-bit encoding.
FP_LAYOUTS = {"fp16": (5, 10), "bf16": (8, 7)}
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
        self._fmt = check_choice("fmt", fmt, FP_FORMATS)
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
        bias = (1 << (exp_bits - 1)) - 1
        a = _decode(self.a, exp_bits, frac_bits)
        b = _decode(self.b, exp_bits, frac_bits)
        c = _decode(self.c, 8, _F32_FRAC)
        p_sign = a.sign ^ b.sign

        # ---- exact product: prod_int * 2**(a.exp + b.exp - 2*bias - 2*frac_bits) ----
        st = _stage(m, "multiply")
        prod_width = 2 * (frac_bits + 1)
        prod_int = _wire(st, prod_width, a.sig * b.sig, "prod_int")
        prod_lz = _wire(st, range(prod_width + 1), _leading_zeros(prod_int), "prod_lz")

        # ---- normalised to a 24-bit significand (leading one at bit 23), the product's
        # biased binary32 exponent is  a.exp + b.exp + offset - prod_lz ----
        st = _stage(m, "normalise_product")
        offset = _F32_BIAS - 2 * bias - 2 * frac_bits + prod_width - 1
        max_field = (1 << exp_bits) - 1  # inf/NaN fields give garbage, masked at the end
        prod_exp = _wire(
            st,
            range(2 + offset - prod_width, 2 * max_field + offset + 1),
            a.exp + b.exp + offset - prod_lz,
            "prod_exp",
        )
        prod_norm = _wire(
            st,
            _SIG,
            Cat(Const(0, _SIG - prod_width), (prod_int << prod_lz)[:prod_width]),
            "prod_norm",
        )
        # Exponent range for finite non-zero inputs, known when elaborating: fp16
        # products always are binary32 normals; bf16 ones can underflow or overflow.
        finite_exp_min = 2 + offset - (prod_width - 1)
        finite_exp_max = 2 * (max_field - 1) + offset
        under = (prod_exp < 1) if finite_exp_min < 1 else Const(0)
        p_overflow = (
            _wire(st, 1, (prod_exp > _F32_EMAX) & (prod_int != 0), "p_overflow")
            if finite_exp_max > _F32_EMAX
            else Const(0)
        )
        # The product in the decoded binary32 form (exp >= 1, no hidden bit below 2**-126).
        p_exp = _wire(st, range(_F32_EMAX + 2), Mux(under | (prod_int == 0), 1, prod_exp), "p_exp")

        # ---- round the product to binary32 (bf16 only): below 2**-126, shift right by
        # 1 - prod_exp keeping a guard and a sticky bit (2**-149 becomes the unit), then
        # round to nearest even; a carry out gives 2**23, the smallest normal, as is ----
        if finite_exp_min < 1:
            st = _stage(m, "round_product")
            width = _SIG + 2
            denorm_shift = _wire(
                st, range(width + 1), Mux(under, _clamp(1 - prod_exp, width), 0), "denorm_shift"
            )
            denorm = _shift_right_sticky(Cat(Const(0, 2), prod_norm), denorm_shift)
            p_sig = _wire(st, _SIG, denorm[2:] + (denorm[1] & (denorm[0] | denorm[2])), "p_sig")
        else:
            p_sig = prod_norm

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
            m.d.comb += self.y.eq(FP32_CANONICAL_NAN)
        with m.Elif(p_inf):
            m.d.comb += self.y.eq(_infinity(p_sign))
        with m.Elif(c.is_inf):
            m.d.comb += self.y.eq(self.c)
        with m.Elif(sum_exp > _F32_EMAX):
            m.d.comb += self.y.eq(_infinity(sum_sign))
        with m.Else():
            m.d.comb += self.y.eq(Cat(sum_sig[:_F32_FRAC], sum_field[:8], sum_sign))
        return m


def _infinity(sign: Value) -> Value:
    return Cat(Const(0, _F32_FRAC), Const(0xFF, 8), sign)
