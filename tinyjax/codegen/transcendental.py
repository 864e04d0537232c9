"""EXP2, LOG2 and SIN as branch-free LLVM IR: range reduction, a polynomial, and bit manipulation to rebuild the result.

The LLVM intrinsics (`llvm.exp2.f32`, ...) become scalar libm calls, which keep a loop that uses them scalar. What this
module emits is plain arithmetic (`fmul`, `fadd`, `llvm.fma`), integer operations on the float's bits and `select`s,
which the loop vectoriser turns into AVX2 / AVX-512 code like any other elementwise work. Used for float32 and for
float16 / bfloat16 (which compute in float32); float64 keeps the intrinsics (libm accuracy).

Accuracy (float32, against numpy's float64 functions): at most 1 ulp from the correctly rounded result for EXP2 and
LOG2, 0.5 ulp plus a hair (the float64 result rounded once) for SIN over the whole float32 range, huge arguments
included. Measured once over all 2^32 inputs, as the largest error against the exact value in ulps of the result:
EXP2 0.879 (0.28% of results not correctly rounded), LOG2 0.976 (0.54%), SIN 0.5013 (0.02%);
tests/test_transcendental.py checks dense sweeps of every binade, the special values and every 16-bit input.

  exp2(x)  n = round(x), f = x - n in [-1/2, 1/2] (exact); 2^f by a degree-6 polynomial; 2^n built as exponent bits
           and applied in two halves, so results in the subnormal range round once and 2^128 overflows to inf.
  log2(x)  x = 2^e * m with m in [sqrt(1/2), sqrt(2)) taken from the bits (subnormals scaled by 2^23 first);
           log2(m) = t / ln 2 + t * P(t) with t = m - 1 (exact), the leading product fused (one rounding); + e.
  sin(x)   computed in float64 on |x| (float32 values are exact there), sign restored at the end. Arguments of
           2^39 and more are first replaced by a smaller one with the same value modulo 2 pi (x = M * 2^(16 j) with an
           integer M < 2^40, and 2^(16 j) mod 2 pi is a constant from a 6-entry table), then x - q pi/2 is taken
           with a 3-part Cody-Waite constant (fused, the first product exact), and a sin or cos polynomial in the
           remainder is chosen by the quadrant q mod 4. No libm fallback: the reduction is exact enough over the
           whole float32 range (the closest float32 to a multiple of pi/2 is ~2^-30 away from it; the reduced
           argument is accurate to ~2^-60 absolute), so there is no bound beyond which results degrade.

`llvm.fma` is used where a single rounding matters (and for every polynomial step, so results are the same bits on
every target); on x86-64 it is one instruction with FMA3 (Haswell and later), elsewhere a libm `fmaf` call (slow but
right).

Polynomial coefficients are minimax fits computed for tinyjax with numpy (Lawson's iteratively reweighted least squares
over 20000 Chebyshev points, float64), then rounded to the working precision; the fit's error bound is stated with
each and checked by tests/test_transcendental.py.
"""
from __future__ import annotations

import functools
import math
import struct
from fractions import Fraction
from typing import Protocol


class Emitter(Protocol):
  """What this module needs from the renderer: append an instruction, call an intrinsic."""
  def emit(self, instruction: str, hint: str = "v") -> str: ...
  def call(self, intrinsic: str, ret_type: str, args: list[tuple[str, str]], flags: str = "") -> str: ...


# ---------------------------------------------------------------------------------------------------------------------
# constants

# exp2: 2^f ~ 1 + f * (c1 + c2 f + ... + c6 f^5) on [-1/2, 1/2], relative error 2^-28.3 (c1 ~ ln 2, c2 ~ ln(2)^2 / 2,
# ...; the coefficients rounded to float32 one at a time, the later ones refitted after each rounding)
EXP2_POLY = (0.6931472, 0.24022648, 0.0555036, 0.009618506, 0.0013390806, 0.00015326461)
# |x| beyond which exp2 is inf or 0 in float32 (2^-150 rounds to 0): clamping to it keeps n and the exponent bits small
EXP2_CLAMP = 160.0
# adding 1.5 * 2^23 rounds a float32 of magnitude < 2^22 to an integer (nearest even), which then sits in the low
# mantissa bits of the sum
F32_ROUNDING_BIAS = 12582912.0
F32_ROUNDING_BIAS_BITS = 0x4B400000

# log2: log2(1 + t) ~ t * LOG2_E_HI + t * P(t), P(t) = p0 + p1 t + ... + p9 t^9 on [sqrt(1/2) - 1, sqrt(2) - 1],
# absolute error of P 2^-27.1 (P ~ -0.72 t, so relative to log2(1 + t) ~ 1.44 t: 0.07 ulp; float32 coefficients
# rounded one at a time, as for exp2). p0 carries the part of 1 / ln 2 that LOG2_E_HI (1 / ln 2 in float32) misses.
LOG2_E_HI = 1.442695
LOG2_POLY = (2.0285729e-08, -0.72134733, 0.48089787, -0.3606985, 0.28858778, -0.23958382, 0.2042217, -0.19101472,
             0.18845013, -0.11267049)
# the float32 bits of 0.70710677 (~ sqrt(1/2)): subtracting them from x's bits makes the exponent field count from
# the mantissa interval [sqrt(1/2), sqrt(2)) instead of [1, 2)
SQRT_HALF_BITS = 0x3F3504F3
F32_MIN_NORMAL = 2.0 ** -126
F32_SUBNORMAL_SCALE = 2.0 ** 23  # makes a float32 subnormal normal, exactly

# sin (float64): sin(r) ~ r + r^3 * S(r^2), relative error 2^-37.2; cos(r) ~ 1 + r^2 * C(r^2), relative error 2^-33.6;
# both fitted for |r| <= 0.8 (pi / 4 plus the low part of a pre-reduced argument)
SIN_POLY = (-0.1666666663666436, 0.008333328832245124, -0.00019839162339899968, 2.7167121235214667e-06)
COS_POLY = (-0.4999999964457693, 0.041666614824682924, -0.001388651000474015, 2.4367701286883808e-05)
# adding 1.5 * 2^52 rounds a float64 of magnitude < 2^51 to an integer, which then sits in the low mantissa bits
F64_ROUNDING_BIAS = 6755399441055744.0
# arguments with a float32 exponent e >= SIN_SPLIT_BITS + 23 are pre-reduced: x = M * 2^(SIN_SPLIT_BITS * j),
# j = (e - 23) // SIN_SPLIT_BITS, so M < 2^(SIN_SPLIT_BITS + 24) is an integer and q = x * 2 / pi stays below 2^43,
# where the first Cody-Waite product is exact
SIN_SPLIT_BITS = 16
SIN_TABLE_SIZE = (127 - 23) // SIN_SPLIT_BITS + 1  # j = 0 (no pre-reduction) .. 6


def _machin_pi(bits: int) -> Fraction:
  """pi to `bits` bits (error < 2^-bits), by Machin's formula pi = 16 atan(1/5) - 4 atan(1/239) in integers."""
  scale = 1 << (bits + 16)

  def arctan_inverse(n: int) -> int:  # atan(1 / n) * scale
    total, term, k, sign = 0, scale // n, 1, 1
    while term:
      total += sign * (term // k)
      term, k, sign = term // (n * n), k + 2, -sign
    return total
  return Fraction(16 * arctan_inverse(5) - 4 * arctan_inverse(239), scale)


@functools.cache
def sin_constants() -> dict[str, tuple[float, ...]]:
  """The float64 constants of the sin reduction, from pi to 400 bits: 2 / pi; pi / 2 as three parts (each the
  remainder of the previous ones, rounded); and for each j the pair (hi, lo) of 2^(16 j) mod 2 pi (j = 0: 1, 0)."""
  pi = _machin_pi(400)
  half_pi, parts = pi / 2, []
  for _ in range(3): parts.append(float(half_pi - sum(map(Fraction, parts), Fraction(0))))
  table_hi, table_lo = [1.0], [0.0]
  for j in range(1, SIN_TABLE_SIZE):
    power = Fraction(2) ** (SIN_SPLIT_BITS * j)
    remainder = power - math.floor(power / (2 * pi)) * 2 * pi
    table_hi.append(float(remainder))
    table_lo.append(float(remainder - Fraction(table_hi[-1])))
  return {"two_over_pi": (float(2 / pi),), "half_pi": tuple(parts), "table_hi": tuple(table_hi),
          "table_lo": tuple(table_lo)}


# ---------------------------------------------------------------------------------------------------------------------
# emitting

def _double_hex(value: float) -> str:
  return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"


class _Builder:
  """Named instructions over one float type ("float" or "double"), so the algorithms below read like formulas."""

  def __init__(self, out: Emitter, llvm_type: str):
    self.out, self.type = out, llvm_type
    self.int_type = "i32" if llvm_type == "float" else "i64"
    self.suffix = "f32" if llvm_type == "float" else "f64"

  def const(self, value: float) -> str:
    """A float literal (rounded to float32 first for `float`: LLVM wants it exact)."""
    if self.type == "float": value = struct.unpack("<f", struct.pack("<f", value))[0]
    return _double_hex(value)

  def op(self, instruction: str, lhs: str, rhs: str, llvm_type: str | None = None) -> str:
    return self.out.emit(f"{instruction} {llvm_type or self.type} {lhs}, {rhs}")

  def add(self, lhs: str, rhs: str) -> str: return self.op("fadd", lhs, rhs)
  def sub(self, lhs: str, rhs: str) -> str: return self.op("fsub", lhs, rhs)
  def mul(self, lhs: str, rhs: str) -> str: return self.op("fmul", lhs, rhs)
  def neg(self, value: str) -> str: return self.out.emit(f"fneg {self.type} {value}")
  def cmp(self, predicate: str, lhs: str, rhs: str) -> str: return self.op(f"fcmp {predicate}", lhs, rhs)

  def fma(self, a: str, b: str, c: str) -> str:
    """a * b + c with one rounding."""
    return self.out.call(f"llvm.fma.{self.suffix}", self.type, [(self.type, a), (self.type, b), (self.type, c)])

  def fabs(self, value: str) -> str: return self.out.call(f"llvm.fabs.{self.suffix}", self.type, [(self.type, value)])

  def select(self, cond: str, if_true: str, if_false: str, llvm_type: str | None = None) -> str:
    llvm_type = llvm_type or self.type
    return self.out.emit(f"select i1 {cond}, {llvm_type} {if_true}, {llvm_type} {if_false}")

  def horner(self, x: str, coefficients: tuple[float, ...]) -> str:
    """c0 + c1 x + c2 x^2 + ... (highest coefficient first in the fused chain)."""
    result = self.const(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]): result = self.fma(result, x, self.const(coefficient))
    return result

  def to_bits(self, value: str) -> str: return self.out.emit(f"bitcast {self.type} {value} to {self.int_type}")
  def from_bits(self, bits: str) -> str: return self.out.emit(f"bitcast {self.int_type} {bits} to {self.type}")
  def int_op(self, instruction: str, lhs: str, rhs: str) -> str: return self.op(instruction, lhs, rhs, self.int_type)


def exp2_f32(out: Emitter, x: str) -> str:
  """2^x for a float32 value `x`; returns a float32 value."""
  b = _Builder(out, "float")
  # clamp to +-EXP2_CLAMP (NaN passes through both compares unchanged and propagates)
  clamped = b.select(b.cmp("ogt", x, b.const(EXP2_CLAMP)), b.const(EXP2_CLAMP), x)
  clamped = b.select(b.cmp("olt", clamped, b.const(-EXP2_CLAMP)), b.const(-EXP2_CLAMP), clamped)
  biased = b.add(clamped, b.const(F32_ROUNDING_BIAS))
  n_float = b.sub(biased, b.const(F32_ROUNDING_BIAS))
  n = b.int_op("sub", b.to_bits(biased), str(F32_ROUNDING_BIAS_BITS))
  fraction = b.sub(clamped, n_float)  # exact, in [-1/2, 1/2]
  power = b.fma(fraction, b.horner(fraction, EXP2_POLY), b.const(1.0))  # 2^f; exactly 1 for f = 0
  # 2^n as two factors 2^(n // 2) and 2^(n - n // 2), each a normal float32 for |n| <= EXP2_CLAMP: the first product is
  # exact, the second rounds once (also into the subnormals, or to inf)
  half = b.int_op("ashr", n, "1")
  rest = b.int_op("sub", n, half)
  for part in (half, rest):
    scale = b.from_bits(b.int_op("shl", b.int_op("add", part, "127"), "23"))
    power = b.mul(power, scale)
  return power


def log2_f32(out: Emitter, x: str) -> str:
  """log2(x) for a float32 value `x` (NaN below 0, -inf at +-0, inf at inf); returns a float32 value."""
  b = _Builder(out, "float")
  subnormal = b.cmp("olt", x, b.const(F32_MIN_NORMAL))
  scaled = b.select(subnormal, b.mul(x, b.const(F32_SUBNORMAL_SCALE)), x)
  offset = b.to_bits(scaled)
  offset = b.int_op("sub", offset, str(SQRT_HALF_BITS))
  exponent = b.int_op("ashr", offset, "23")
  exponent = b.int_op("sub", exponent, b.select(subnormal, "23", "0", "i32"))
  mantissa = b.from_bits(b.int_op("add", b.int_op("and", offset, str(0x7FFFFF)), str(SQRT_HALF_BITS)))
  t = b.sub(mantissa, b.const(1.0))  # exact: the mantissa is in [sqrt(1/2), sqrt(2))
  log_mantissa = b.fma(t, b.const(LOG2_E_HI), b.mul(t, b.horner(t, LOG2_POLY)))
  result = b.add(b.out.emit(f"sitofp i32 {exponent} to float"), log_mantissa)
  result = b.select(b.cmp("oeq", x, b.const(math.inf)), b.const(math.inf), result)
  result = b.select(b.cmp("oeq", x, b.const(0.0)), b.const(-math.inf), result)
  return b.select(b.cmp("ult", x, b.const(0.0)), b.const(math.nan), result)  # negative or NaN


def sin_f32(out: Emitter, x: str) -> str:
  """sin(x) for a float32 value `x`, computed in float64; returns the float64 result (round it once to the dtype)."""
  constants = sin_constants()
  b, i32 = _Builder(out, "double"), "i32"
  wide = out.emit(f"fpext float {x} to double")
  magnitude = b.fabs(wide)
  finite = b.cmp("olt", magnitude, b.const(math.inf))
  magnitude = b.select(finite, magnitude, b.const(0.0))  # inf and NaN: the result is replaced by NaN at the end
  # pre-reduction of huge arguments: magnitude = M * 2^(16 j), reduced to M * (2^(16 j) mod 2 pi) as hi + lo
  x_bits = out.emit(f"bitcast float {x} to i32")
  exponent = out.emit(f"and i32 {out.emit(f'lshr i32 {x_bits}, 23')}, 255")
  j = out.emit(f"sdiv i32 {out.emit(f'sub i32 {exponent}, {127 + 23}')}, {SIN_SPLIT_BITS}")  # < 0 -> 0 below
  j = out.call("llvm.smax.i32", i32, [(i32, j), (i32, "0")])
  unscale_exponent = out.emit(f"sub i32 1023, {out.emit(f'mul i32 {j}, {SIN_SPLIT_BITS}')}")
  unscale = b.from_bits(b.int_op("shl", out.emit(f"zext i32 {unscale_exponent} to i64"), "52"))
  whole = b.mul(magnitude, unscale)  # an integer when j > 0
  table_hi, table_lo = b.const(1.0), b.const(0.0)
  for index in range(1, SIN_TABLE_SIZE):
    is_index = out.emit(f"icmp eq i32 {j}, {index}")
    table_hi = b.select(is_index, b.const(constants["table_hi"][index]), table_hi)
    table_lo = b.select(is_index, b.const(constants["table_lo"][index]), table_lo)
  reduced_hi = b.mul(whole, table_hi)
  reduced_lo = b.fma(whole, table_lo, b.fma(whole, table_hi, b.neg(reduced_hi)))
  # Cody-Waite: r = reduced - q pi/2 with q = round(reduced * 2/pi); q mod 4 from the low bits of the biased sum
  biased = b.add(b.mul(reduced_hi, b.const(constants["two_over_pi"][0])), b.const(F64_ROUNDING_BIAS))
  quadrant = out.emit(f"trunc i64 {b.to_bits(biased)} to i32")
  minus_q = b.sub(b.const(F64_ROUNDING_BIAS), biased)
  remainder = reduced_hi
  for part in constants["half_pi"]: remainder = b.fma(minus_q, b.const(part), remainder)
  remainder = b.add(remainder, reduced_lo)
  square = b.mul(remainder, remainder)
  sine = b.fma(b.mul(remainder, square), b.horner(square, SIN_POLY), remainder)
  cosine = b.fma(square, b.horner(square, COS_POLY), b.const(1.0))
  odd = out.emit(f"icmp ne i32 {out.emit(f'and i32 {quadrant}, 1')}, 0")
  value = b.select(odd, cosine, sine)
  # sin(x) = sign(x) * sin(|x|), and the quadrants 2 and 3 flip the sign again
  upper_half = out.emit(f"icmp ne i32 {out.emit(f'and i32 {quadrant}, 2')}, 0")
  flip = out.emit(f"xor i1 {upper_half}, {out.emit(f'icmp slt i32 {x_bits}, 0')}")
  value = b.select(flip, b.neg(value), value)
  return b.select(finite, value, b.const(math.nan))
