"""Digital front-end of a photonic/analog matmul core: DAC and ADC quantisers, accumulator."""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ._checks import check_int

__all__ = ["FrontEnd"]


def _round_shift(value, shift):
    """``(value + (2**shift >> 1)) >> shift`` (arithmetic shift, exact)."""
    bias = (Const(1, 1) << shift) >> 1
    return (value + bias) >> shift


def _clamp(value, lo: int, hi: int):
    return Mux(value > hi, hi, Mux(value < lo, lo, value))


class FrontEnd(wiring.Component):
    """DAC quantiser, balanced detection, ADC quantiser and partial-tile accumulator.

    The arithmetic is specified (and modelled bit for bit) in
    ``wia_hw.emulator.frontend_model``; ``p = precision_bits``, ``N = matrix_size_limit``
    lanes (one per core input / output):

    - DAC: ``dac_out[i] = clamp(round_half_up(dac_in[i] / 2**dac_shift),
      -(2**(p-1) - 1), 2**(p-1) - 1)``.
    - ADC: ``adc_out[i] = saturate(round_half_up((det_p[i] - det_n[i]) / 2**adc_shift),
      -2**(p-1), 2**(p-1) - 1)``.
    - Accumulator: ``acc_out[i]`` sums the ADC codes of the partial tiles of one output
      group (tiles up to and including one with ``det_last``), wrapping at ``acc_bits``.

    Timing (edge 0 = the rising edge that samples an input): a DAC sample taken with
    ``dac_valid`` at edge 0 is on ``dac_out`` with ``dac_out_valid`` in cycle 1
    (``frontend_model.DAC_LATENCY_CYCLES``). Detector samples taken with ``det_valid``
    at edge 0 give ``adc_out``/``adc_valid`` in cycle 2 and enter the accumulator at
    edge 3; a group of ``T`` tiles sampled at edges ``0..T-1`` has its sum on
    ``acc_out`` with ``acc_valid`` in cycle ``T + 2``
    (``frontend_model.frontend_cycles(T)``). Both paths accept one sample per cycle.

    Ports
    -----
    dac_valid (in, 1), dac_shift (in, ``range(in_bits + 1)``),
    dac_in (in, ``signed(in_bits)`` x N); dac_out (out, ``signed(p)`` x N), dac_out_valid.
    det_valid (in, 1), det_last (in, 1), adc_shift (in, ``range(det_bits + 1)``),
    det_p, det_n (in, ``unsigned(det_bits)`` x N); adc_out (out, ``signed(p)`` x N),
    adc_valid, adc_last (out, 1); acc_out (out, ``signed(acc_bits)`` x N), acc_valid.

    Parameters
    ----------
    precision_bits: DAC/ADC resolution, 2..16 and at most ``in_bits``.
    matrix_size_limit: lanes, 1..256.
    in_bits: DAC input width, 2..32 (default 16). det_bits: detector sample width,
    2..32 (default 16). acc_bits: accumulator width, 8..64 (default 32).
    """

    def __init__(
        self,
        precision_bits: int = 8,
        matrix_size_limit: int = 8,
        in_bits: int = 16,
        det_bits: int = 16,
        acc_bits: int = 32,
    ) -> None:
        self._p = check_int("precision_bits", precision_bits, 2, 16)
        self._n = check_int("matrix_size_limit", matrix_size_limit, 1, 256)
        self._in_bits = check_int("in_bits", in_bits, 2, 32)
        self._det_bits = check_int("det_bits", det_bits, 2, 32)
        self._acc_bits = check_int("acc_bits", acc_bits, 8, 64)
        if self._p > self._in_bits:
            raise ValueError(
                f"precision_bits ({self._p}) must not exceed in_bits ({self._in_bits})"
            )
        n, p = self._n, self._p
        super().__init__(
            {
                "dac_valid": In(1),
                "dac_shift": In(range(self._in_bits + 1)),
                "dac_in": In(signed(self._in_bits)).array(n),
                "dac_out": Out(signed(p)).array(n),
                "dac_out_valid": Out(1),
                "det_valid": In(1),
                "det_last": In(1),
                "adc_shift": In(range(self._det_bits + 1)),
                "det_p": In(unsigned(self._det_bits)).array(n),
                "det_n": In(unsigned(self._det_bits)).array(n),
                "adc_out": Out(signed(p)).array(n),
                "adc_valid": Out(1),
                "adc_last": Out(1),
                "acc_out": Out(signed(self._acc_bits)).array(n),
                "acc_valid": Out(1),
            }
        )

    @property
    def precision_bits(self) -> int:
        return self._p

    @property
    def matrix_size_limit(self) -> int:
        return self._n

    def elaborate(self, platform: object) -> Module:
        m = Module()
        n, p = self._n, self._p
        dac_hi = (1 << (p - 1)) - 1
        adc_lo, adc_hi = -(1 << (p - 1)), (1 << (p - 1)) - 1

        # ---- DAC: input register, then quantise ----------------------------------------
        x_r = [Signal(signed(self._in_bits), name=f"dac_x{i}") for i in range(n)]
        dac_shift_r = Signal.like(self.dac_shift)
        dac_v_r = Signal()
        m.d.sync += [dac_shift_r.eq(self.dac_shift), dac_v_r.eq(self.dac_valid)]
        m.d.sync += [x_r[i].eq(self.dac_in[i]) for i in range(n)]
        m.d.sync += self.dac_out_valid.eq(dac_v_r)
        for i in range(n):
            m.d.sync += self.dac_out[i].eq(
                _clamp(_round_shift(x_r[i], dac_shift_r), -dac_hi, dac_hi)
            )

        # ---- ADC path: input register, subtract, quantise, accumulate ------------------
        dp_r = [Signal(self._det_bits, name=f"det_p{i}_r") for i in range(n)]
        dn_r = [Signal(self._det_bits, name=f"det_n{i}_r") for i in range(n)]
        diff = [Signal(signed(self._det_bits + 1), name=f"diff{i}") for i in range(n)]
        acc = [Signal(signed(self._acc_bits), name=f"acc{i}") for i in range(n)]
        v0, last0, v1, last1 = Signal(), Signal(), Signal(), Signal()
        sh0, sh1 = Signal.like(self.adc_shift), Signal.like(self.adc_shift)
        fresh = Signal(init=1)  # the next tile starts a new group
        m.d.sync += [
            v0.eq(self.det_valid),
            last0.eq(self.det_last),
            sh0.eq(self.adc_shift),
            v1.eq(v0),
            last1.eq(last0),
            sh1.eq(sh0),
            self.adc_valid.eq(v1),
            self.adc_last.eq(last1),
            self.acc_valid.eq(self.adc_valid & self.adc_last),
        ]
        for i in range(n):
            m.d.sync += [
                dp_r[i].eq(self.det_p[i]),
                dn_r[i].eq(self.det_n[i]),
                diff[i].eq(dp_r[i] - dn_r[i]),
                self.adc_out[i].eq(_clamp(_round_shift(diff[i], sh1), adc_lo, adc_hi)),
            ]
        with m.If(self.adc_valid):
            m.d.sync += fresh.eq(self.adc_last)
            for i in range(n):
                m.d.sync += acc[i].eq(Mux(fresh, 0, acc[i]) + self.adc_out[i])
        m.d.comb += [self.acc_out[i].eq(acc[i]) for i in range(n)]
        return m
