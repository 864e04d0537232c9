"""EXP2, LOG2, SIN and COS as branch-free LLVM IR: range reduction, a polynomial, and bit manipulation to rebuild
the result.

The LLVM intrinsics (`llvm.exp2.f32`, ...) become scalar libm calls, which keep a loop that uses them scalar. What this
module emits is plain arithmetic (`fmul`, `fadd`, `llvm.fma`), integer operations on the float's bits and `select`s,
which the loop vectoriser turns into AVX2 / AVX-512 code like any other elementwise work. Used for float32 and for
float16 / bfloat16 (which compute in float32), and for float64 EXP2 / LOG2 / SIN / COS (the float64 functions at the end
of this module: exp2_f64, log2_f64, sin_f64, cos_f64; double-double arithmetic where float64 alone would lose bits).
The GPU has no libm: there POW of every float dtype is pow_f64 too (the CPU calls libm's pow). COS is SIN one quadrant
on (the same reduction), so it keeps its relative accuracy near its own zeros.

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

float64 (exp2_f64, log2_f64, sin_f64, pow_f64), measured over ~18M inputs per function against x86 long double
(64-bit mantissa) references, as the largest error in ulps of the result: EXP2 0.60 (normal results; 0.77 for
subnormal ones, rounded twice), LOG2 0.502, SIN 0.74 over the whole range (Payne-Hanek: no bound where it degrades;
tiny results at multiples of pi / 2 included), POW 1.05 (y log2|x| to ~2^-64 relative as a double-double); POW's
float32 / 16-bit results (float64 rounded once) were correctly rounded in every case measured. Subnormal float64
inputs and results are IEEE (a GPU keeps them; the CPU runtime flushes them, so the tests call these kernels bare).

  exp2_f64  n = round(x), f = x - n; 2^f = 1 + f ln2 + f^2 Q(f) with 1 + f ln2 as an exact sum of two doubles; a
            double-double argument hi + lo (POW) multiplies by 1 + lo ln 2; 2^n in two halves as for float32.
  log2_f64  m in [sqrt(1/2), sqrt(2)) from the bits, s = (m - 1) / (m + 1) as s + s_lo (exact residual), ln m =
            2 s + 2 s^3 / 3 (exact double-double) + s^5 R(s^2) + 2 s_lo (1 + s^2); times 1 / ln 2 (double-double), + e.
  sin_f64   |x| = m 2^(E - 11) with a 64-bit integer m; x 2/pi mod 4 as m times a 192-bit window of 2/pi's bits
            (from a table of 18 64-bit words made with _machin_pi at import; picked by selects, shifted), 128-bit
            products in integers; the quadrant and 126 fraction bits, rounded to the nearest quadrant, then r = f pi/2
            as a double-double and Taylor sin / cos of it. |x| < 2^-26: sin x = x.
  pow_f64   2^(y log2|x|) with both as double-doubles; the sign for odd integer y; C99 Annex F special cases by selects.

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
  """Named instructions over one float type ("float" or "double"), so the algorithms below read like formulas. With
  `lanes` > 1, over vectors of that many floats (a register tile's epilogue, emitted as vector IR): the same
  instructions lane by lane, literals splatted."""

  def __init__(self, out: Emitter, llvm_type: str, lanes: int = 1):
    self.out, self.lanes = out, lanes
    scalar_int = "i32" if llvm_type == "float" else "i64"
    self.scalar_type, self.scalar_int = llvm_type, scalar_int
    self.type = llvm_type if lanes == 1 else f"<{lanes} x {llvm_type}>"
    self.int_type = scalar_int if lanes == 1 else f"<{lanes} x {scalar_int}>"
    self.bool_type = "i1" if lanes == 1 else f"<{lanes} x i1>"
    self.suffix = ("f32" if llvm_type == "float" else "f64") if lanes == 1 else \
        f"v{lanes}{'f32' if llvm_type == 'float' else 'f64'}"

  def splat(self, literal: str, scalar_type: str) -> str:
    """A literal as an operand of this width (itself for scalars, a constant vector of it for vectors)."""
    if self.lanes == 1 or literal.startswith("%"): return literal
    return "<" + ", ".join(f"{scalar_type} {literal}" for _ in range(self.lanes)) + ">"

  def const(self, value: float) -> str:
    """A float literal (rounded to float32 first for `float`: LLVM wants it exact)."""
    if self.scalar_type == "float": value = struct.unpack("<f", struct.pack("<f", value))[0]
    return self.splat(_double_hex(value), self.scalar_type)

  def op(self, instruction: str, lhs: str, rhs: str, llvm_type: str | None = None) -> str:
    if llvm_type == self.int_type: lhs, rhs = self.splat(lhs, self.scalar_int), self.splat(rhs, self.scalar_int)
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
    if llvm_type == self.scalar_int:  # an integer select (of literals)
      llvm_type, if_true, if_false = self.int_type, self.splat(if_true, llvm_type), self.splat(if_false, llvm_type)
    llvm_type = llvm_type or self.type
    return self.out.emit(f"select {self.bool_type} {cond}, {llvm_type} {if_true}, {llvm_type} {if_false}")

  def int_to_float(self, value: str) -> str: return self.out.emit(f"sitofp {self.int_type} {value} to {self.type}")

  def horner(self, x: str, coefficients: tuple[float, ...]) -> str:
    """c0 + c1 x + c2 x^2 + ... (highest coefficient first in the fused chain)."""
    result = self.const(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]): result = self.fma(result, x, self.const(coefficient))
    return result

  def to_bits(self, value: str) -> str: return self.out.emit(f"bitcast {self.type} {value} to {self.int_type}")
  def from_bits(self, bits: str) -> str: return self.out.emit(f"bitcast {self.int_type} {bits} to {self.type}")
  def int_op(self, instruction: str, lhs: str, rhs: str) -> str: return self.op(instruction, lhs, rhs, self.int_type)


def exp2_f32(out: Emitter, x: str, lanes: int = 1) -> str:
  """2^x for a float32 value `x` (a vector of `lanes` of them); returns a float32 value (vector)."""
  b = _Builder(out, "float", lanes)
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


def log2_f32(out: Emitter, x: str, lanes: int = 1) -> str:
  """log2(x) for a float32 value `x` (a vector of `lanes` of them; NaN below 0, -inf at +-0, inf at inf); returns a
  float32 value (vector)."""
  b = _Builder(out, "float", lanes)
  subnormal = b.cmp("olt", x, b.const(F32_MIN_NORMAL))
  scaled = b.select(subnormal, b.mul(x, b.const(F32_SUBNORMAL_SCALE)), x)
  offset = b.to_bits(scaled)
  offset = b.int_op("sub", offset, str(SQRT_HALF_BITS))
  exponent = b.int_op("ashr", offset, "23")
  exponent = b.int_op("sub", exponent, b.select(subnormal, "23", "0", "i32"))
  mantissa = b.from_bits(b.int_op("add", b.int_op("and", offset, str(0x7FFFFF)), str(SQRT_HALF_BITS)))
  t = b.sub(mantissa, b.const(1.0))  # exact: the mantissa is in [sqrt(1/2), sqrt(2))
  log_mantissa = b.fma(t, b.const(LOG2_E_HI), b.mul(t, b.horner(t, LOG2_POLY)))
  result = b.add(b.int_to_float(exponent), log_mantissa)
  result = b.select(b.cmp("oeq", x, b.const(math.inf)), b.const(math.inf), result)
  result = b.select(b.cmp("oeq", x, b.const(0.0)), b.const(-math.inf), result)
  return b.select(b.cmp("ult", x, b.const(0.0)), b.const(math.nan), result)  # negative or NaN


def sin_f32(out: Emitter, x: str, cosine: bool = False) -> str:
  """sin(x) (or cos(x), `cosine`) for a float32 value `x`, computed in float64; returns the float64 result (round it
  once to the dtype). cos(x) = sin(|x| + pi/2): the same reduction one quadrant on, so it keeps its relative accuracy
  near its own zeros (1 - 2 sin(x/2)^2 would not)."""
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
  polynomial_quadrant = out.emit(f"add i32 {quadrant}, 1") if cosine else quadrant
  minus_q = b.sub(b.const(F64_ROUNDING_BIAS), biased)
  remainder = reduced_hi
  for part in constants["half_pi"]: remainder = b.fma(minus_q, b.const(part), remainder)
  remainder = b.add(remainder, reduced_lo)
  square = b.mul(remainder, remainder)
  sin_r = b.fma(b.mul(remainder, square), b.horner(square, SIN_POLY), remainder)
  cos_r = b.fma(square, b.horner(square, COS_POLY), b.const(1.0))
  odd = out.emit(f"icmp ne i32 {out.emit(f'and i32 {polynomial_quadrant}, 1')}, 0")
  value = b.select(odd, cos_r, sin_r)
  # sin(x) = sign(x) * sin(|x|) (cos is even), and the quadrants 2 and 3 flip the sign again
  flip = out.emit(f"icmp ne i32 {out.emit(f'and i32 {polynomial_quadrant}, 2')}, 0")
  if not cosine: flip = out.emit(f"xor i1 {flip}, {out.emit(f'icmp slt i32 {x_bits}, 0')}")
  value = b.select(flip, b.neg(value), value)
  return b.select(finite, value, b.const(math.nan))


# ---------------------------------------------------------------------------------------------------------------------
# float64: EXP2, LOG2, SIN and POW without libm (the GPU has none)
#
# Every polynomial here is a truncated Taylor series with exact coefficients (rounded once to float64), its truncation
# bound stated with it; the working precision comes from double-double arithmetic (a value as an unevaluated sum
# hi + lo, products split exactly with `llvm.fma`) where the float64 result alone would lose bits.

# exp2: 2^f - 1 = f ln2 + f^2 Q(f), Q(f) = sum_{k=2..14} ln2^k f^(k-2) / k! on [-1/2, 1/2]; the first omitted term
# (ln2 / 2)^15 / 15! < 2^-63 relative to 2^f >= 2^-1/2
EXP2_F64_DEGREE = 14
# |x| beyond which float64 exp2 is inf or 0 (2^-1076 rounds to 0): clamping keeps n and the exponent bits small
EXP2_F64_CLAMP = 1100.0
# log2: m = (1 + s) / (1 - s) with |s| <= (sqrt 2 - 1) / (sqrt 2 + 1) = 0.1716; ln m = 2 s + 2 s^3 / 3 + s^5 R(s^2),
# R(w) = sum_{k=2..13} 2 w^(k-2) / (2k + 1); the first omitted term 2 s^27 / 27 < 2^-70 relative to 2 s
LOG2_F64_TERMS = 13
SQRT_HALF_BITS_F64 = 0x3FE6A09E667F3BCD  # the float64 bits of sqrt(1/2), rounded down
F64_MIN_NORMAL = 2.0 ** -1022
F64_SUBNORMAL_SCALE = 2.0 ** 52
# sin / cos of the reduced argument |r| <= pi / 4 (+ a hair): Taylor through r^17 (sin, first omitted term relative to
# r below 2^-62) and r^18 (cos, below 2^-67)
SIN_F64_DEGREE, COS_F64_DEGREE = 17, 18
# below this |x|, sin(x) = x (the x^3 / 6 term is under 2^-54 of x); above, the Payne-Hanek reduction
SIN_F64_TINY = 2.0 ** -26
# the 2 / pi bits of the reduction: 64-bit words, two zero words in front (a window for arguments down to 2^-63)
TWO_OVER_PI_PAD, TWO_OVER_PI_WORDS = 2, 18


def _ln2(bits: int) -> Fraction:
  """ln 2 to `bits` bits (error < 2^-bits): 2 atanh(1/3) = sum 2 / ((2k + 1) 3^(2k + 1)), in integers."""
  scale, total, power, k = 1 << (bits + 16), 0, 3, 0
  while scale // power:
    total += 2 * scale // ((2 * k + 1) * power)
    power, k = power * 9, k + 1
  return Fraction(total, scale)


def _split(value: Fraction, parts: int = 2) -> tuple[float, ...]:
  """`value` as a sum of `parts` float64s, each the rounded remainder of the ones before."""
  out: list[float] = []
  for _ in range(parts): out.append(float(value - sum(map(Fraction, out), Fraction(0))))
  return tuple(out)


@functools.cache
def f64_constants() -> dict[str, tuple]:
  """The float64 constants, from ln 2 and pi to 1300 bits: ln 2 and 1 / ln 2 and pi / 2 as double-doubles, 2 / 3 as a
  double-double, the Taylor coefficients, and the 64-bit words of 2 / pi (with TWO_OVER_PI_PAD zero words first)."""
  ln2, pi = _ln2(200), _machin_pi(1300)
  words = math.floor(2 / pi * Fraction(2) ** (64 * TWO_OVER_PI_WORDS))
  table = [0] * TWO_OVER_PI_PAD + [(words >> (64 * (TWO_OVER_PI_WORDS - 1 - i))) & (2 ** 64 - 1)
                                   for i in range(TWO_OVER_PI_WORDS)]
  return {"ln2": _split(ln2), "log2_e": _split(1 / ln2), "half_pi": _split(pi / 2),
          "two_thirds": _split(Fraction(2, 3)),
          "exp2_q": tuple(float(ln2 ** k / math.factorial(k)) for k in range(2, EXP2_F64_DEGREE + 1)),
          "log_r": tuple(float(Fraction(2, 2 * k + 1)) for k in range(2, LOG2_F64_TERMS + 1)),
          "sin": tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(1, SIN_F64_DEGREE // 2 + 1)),
          "cos": tuple((-1) ** k / math.factorial(2 * k) for k in range(2, COS_F64_DEGREE // 2 + 1)),
          "two_over_pi": tuple(table)}


class _DoubleBuilder(_Builder):
  """float64 `_Builder` with the error-free transformations of double-double arithmetic."""

  def __init__(self, out: Emitter):
    super().__init__(out, "double")

  def two_prod(self, a: str, b: str) -> tuple[str, str]:
    """(p, e) with p = fl(a b) and p + e = a b exactly."""
    p = self.mul(a, b)
    return p, self.fma(a, b, self.neg(p))

  def fast_two_sum(self, a: str, b: str) -> tuple[str, str]:
    """(s, e) with s = fl(a + b) and s + e = a + b exactly, for |a| >= |b| (or a = 0)."""
    s = self.add(a, b)
    return s, self.sub(b, self.sub(s, a))

  def two_sum(self, a: str, b: str) -> tuple[str, str]:
    """(s, e) with s = fl(a + b) and s + e = a + b exactly, any magnitudes."""
    s = self.add(a, b)
    b_part = self.sub(s, a)
    a_part = self.sub(s, b_part)
    return s, self.add(self.sub(a, a_part), self.sub(b, b_part))

  def trunc(self, value: str) -> str: return self.out.call("llvm.trunc.f64", "double", [("double", value)])

  def i64(self, instruction: str, lhs: str, rhs: str) -> str: return self.int_op(instruction, lhs, rhs)

  def select_int(self, cond: str, if_true: str, if_false: str) -> str:
    return self.select(cond, if_true, if_false, "i64")


def _exp2_double_double(b: _DoubleBuilder, hi: str, lo: str) -> str:
  """2^(hi + lo) for |lo| <= ulp(hi) (lo ignored where hi is clamped, inf or NaN)."""
  constants = f64_constants()
  clamped = b.select(b.cmp("ogt", hi, b.const(EXP2_F64_CLAMP)), b.const(EXP2_F64_CLAMP), hi)
  clamped = b.select(b.cmp("olt", clamped, b.const(-EXP2_F64_CLAMP)), b.const(-EXP2_F64_CLAMP), clamped)
  lo = b.select(b.cmp("oeq", clamped, hi), lo, b.const(0.0))  # also 0 for NaN and inf
  biased = b.add(clamped, b.const(F64_ROUNDING_BIAS))
  n_float = b.sub(biased, b.const(F64_ROUNDING_BIAS))
  n = b.i64("sub", b.to_bits(biased), str(struct.unpack("<q", struct.pack("<d", F64_ROUNDING_BIAS))[0]))
  f = b.sub(clamped, n_float)  # exact, in [-1/2, 1/2]
  ln2_hi, ln2_lo = (b.const(part) for part in constants["ln2"])
  # 2^f (1 + lo ln 2) = 1 + f ln2 + f^2 Q(f) + 2^f lo ln2: 1 + the leading product exactly, the rest as a small tail
  lead, lead_error = b.two_prod(f, ln2_hi)
  one_plus, sum_error = b.fast_two_sum(b.const(1.0), lead)
  tail = b.add(sum_error, b.fma(b.mul(f, f), b.horner(f, constants["exp2_q"]), b.fma(f, ln2_lo, lead_error)))
  tail = b.fma(b.mul(lo, ln2_hi), b.add(one_plus, tail), tail)  # + 2^f lo ln 2
  power = b.add(one_plus, tail)
  # 2^n as two normal factors 2^(n // 2) and 2^(n - n // 2): the first product is exact, the second rounds once
  half = b.i64("ashr", n, "1")
  for part in (half, b.i64("sub", n, half)):
    power = b.mul(power, b.from_bits(b.i64("shl", b.i64("add", part, "1023"), "52")))
  return power


def exp2_f64(out: Emitter, x: str) -> str:
  """2^x for a float64 value `x` (inf above 1024, 0 below -1075, subnormal results rounded once)."""
  b = _DoubleBuilder(out)
  return _exp2_double_double(b, x, b.const(0.0))


def _log2_double_double(b: _DoubleBuilder, x: str) -> tuple[str, str]:
  """log2(x) as a double-double (hi, lo), relative error below 2^-64 (NaN below 0, -inf at +-0, inf at inf; lo = 0
  for those)."""
  constants = f64_constants()
  subnormal = b.cmp("olt", x, b.const(F64_MIN_NORMAL))
  scaled = b.select(subnormal, b.mul(x, b.const(F64_SUBNORMAL_SCALE)), x)
  offset = b.i64("sub", b.to_bits(scaled), str(SQRT_HALF_BITS_F64))
  exponent = b.i64("sub", b.i64("ashr", offset, "52"), b.select_int(subnormal, "52", "0"))
  m = b.from_bits(b.i64("add", b.i64("and", offset, str((1 << 52) - 1)), str(SQRT_HALF_BITS_F64)))
  # s = (m - 1) / (m + 1) as s + s_lo: u = m - 1 is exact, and the residual u - s (u + 2) = (u - 2 s) - s u is
  # one rounding of a tiny value (u - 2 s exact: 2 s / u is within [0.8, 1.2])
  u = b.sub(m, b.const(1.0))
  v = b.add(m, b.const(1.0))
  s = b.op("fdiv", u, v)
  s_lo = b.op("fdiv", b.fma(b.neg(s), u, b.sub(u, b.add(s, s))), v)
  # ln m = 2 s + (2/3) s^3 + s^5 R(s^2) + 2 s_lo (1 + s^2); 2 s + (2/3) s^3 exactly as a double-double
  square, square_error = b.two_prod(s, s)
  cube, cube_error = b.two_prod(square, s)
  cube_error = b.fma(square_error, s, cube_error)
  two_thirds_hi, two_thirds_lo = (b.const(part) for part in constants["two_thirds"])
  cubic, cubic_error = b.two_prod(cube, two_thirds_hi)
  cubic_error = b.fma(cube, two_thirds_lo, b.fma(cube_error, two_thirds_hi, cubic_error))
  twice = b.add(s, s)
  log_hi, log_lo = b.fast_two_sum(twice, cubic)
  fifth = b.mul(b.mul(cube, square), b.horner(square, constants["log_r"]))
  corrections = b.fma(b.add(s_lo, s_lo), b.add(square, b.const(1.0)), b.add(cubic_error, fifth))
  log_lo = b.add(log_lo, corrections)
  # log2 m = ln m / ln 2, then + the exponent (|exponent| >= 1 >= |log2 m|, or exponent = 0)
  log2_e_hi, log2_e_lo = (b.const(part) for part in constants["log2_e"])
  product, product_error = b.two_prod(log_hi, log2_e_hi)
  product_error = b.fma(log_lo, log2_e_hi, b.fma(log_hi, log2_e_lo, product_error))
  total, total_error = b.fast_two_sum(b.out.emit(f"sitofp i64 {exponent} to double"), product)
  hi, lo = b.fast_two_sum(total, b.add(total_error, product_error))
  # special values: inf, zeros, negatives and NaN
  special = b.cmp("uge", x, b.const(math.inf))
  hi = b.select(special, x, hi)
  zero = b.cmp("oeq", x, b.const(0.0))
  hi = b.select(zero, b.const(-math.inf), hi)
  negative = b.cmp("ult", x, b.const(0.0))
  hi = b.select(negative, b.const(math.nan), hi)
  lo = b.select(b.out.emit(f"or i1 {special}, {b.out.emit(f'or i1 {zero}, {negative}')}"), b.const(0.0), lo)
  return hi, lo


def log2_f64(out: Emitter, x: str) -> str:
  """log2(x) for a float64 value `x` (NaN below 0, -inf at +-0, inf at inf)."""
  b = _DoubleBuilder(out)
  hi, lo = _log2_double_double(b, x)
  return b.add(hi, lo)


def _sin_cos_kernels(b: _DoubleBuilder, hi: str, lo: str) -> tuple[str, str]:
  """(sin, cos) of the double-double hi + lo, |hi| <= pi / 4 (+ a hair)."""
  constants = f64_constants()
  square, square_error = b.two_prod(hi, hi)
  # sin(hi + lo) = hi + hi^3 S(hi^2) + lo (1 - hi^2 / 2)
  sine_tail = b.fma(b.mul(hi, square), b.horner(square, constants["sin"]),
                    b.mul(lo, b.fma(square, b.const(-0.5), b.const(1.0))))
  sine = b.add(hi, sine_tail)
  # cos(hi + lo) = 1 - hi^2 / 2 + hi^4 C(hi^2) - hi lo; 1 - hi^2 / 2 as w + its exact rounding error
  half_square = b.mul(square, b.const(0.5))
  w = b.sub(b.const(1.0), half_square)
  w_error = b.sub(b.sub(b.const(1.0), w), half_square)
  cosine_tail = b.fma(b.mul(square, square), b.horner(square, constants["cos"]),
                      b.neg(b.fma(hi, lo, b.mul(square_error, b.const(0.5)))))
  cosine = b.add(w, b.add(w_error, cosine_tail))
  return sine, cosine


def _umul(b: _DoubleBuilder, lhs: str, rhs: str) -> tuple[str, str]:
  """The 128-bit product of two unsigned i64s as (high, low) i64s."""
  wide = b.out.emit(f"mul i128 {b.out.emit(f'zext i64 {lhs} to i128')}, {b.out.emit(f'zext i64 {rhs} to i128')}")
  high = b.out.emit(f"trunc i128 {b.out.emit(f'lshr i128 {wide}, 64')} to i64")
  return high, b.out.emit(f"trunc i128 {wide} to i64")


def cos_f32(out: Emitter, x: str) -> str:
  """cos(x) for a float32 value `x` (`sin_f32` one quadrant on), computed and returned in float64."""
  return sin_f32(out, x, cosine=True)


def cos_f64(out: Emitter, x: str) -> str:
  """cos(x) for a float64 value `x` (`sin_f64` one quadrant on)."""
  return sin_f64(out, x, cosine=True)


def sin_f64(out: Emitter, x: str, cosine: bool = False) -> str:
  """sin(x) (or cos(x), `cosine`: the same reduction one quadrant on) for a float64 value `x`, over the whole range
  (Payne-Hanek reduction, no bound where it degrades)."""
  constants = f64_constants()
  b = _DoubleBuilder(out)
  bits = b.i64("and", b.to_bits(x), str((1 << 63) - 1))  # |x|
  # x = M 2^E with the integer M = m 2^-11 in [2^52, 2^53), E = biased exponent - 1075. x 2/pi mod 4 needs the bits of
  # 2/pi from bit E - 13 on (the earlier ones make multiples of 4): a 192-bit window W of them, m W 2^-190 mod 4
  # (quadrant: bits 191, 190 of m W; fraction below). The 2 / pi table has two zero words first: window start p + 128.
  biased_exponent = b.i64("lshr", bits, "52")
  m = b.i64("or", b.i64("shl", bits, "11"), str(-(1 << 63)))
  start = b.i64("sub", biased_exponent, str(1075 + 13 - 64 * TWO_OVER_PI_PAD))
  start = b.out.call("llvm.smax.i64", "i64", [("i64", start), ("i64", "0")])
  index, shift = b.i64("lshr", start, "6"), b.i64("and", start, "63")
  table = constants["two_over_pi"]
  words = []
  for k in range(4):  # table[index + k], by a chain of selects (index <= 16 for finite x)
    word = str(_signed64(table[k]))
    for i in range(1, len(table) - 3):
      word = b.select_int(b.out.emit(f"icmp eq i64 {index}, {i}"), str(_signed64(table[i + k])), word)
    words.append(word)
  window = []
  for k in range(3):  # (words[k] << shift) | (words[k + 1] >> (64 - shift)), for shift = 0 too
    low_part = b.i64("lshr", b.i64("lshr", words[k + 1], "1"), b.i64("sub", "63", shift))
    window.append(b.i64("or", b.i64("shl", words[k], shift), low_part))
  high2, low2 = _umul(b, m, window[2])
  high1, low1 = _umul(b, m, window[1])
  _, low0 = _umul(b, m, window[0])
  word1 = b.i64("add", high2, low1)
  carry = b.out.emit(f"zext i1 {b.out.emit(f'icmp ult i64 {word1}, {high2}')} to i64")
  word2 = b.i64("add", b.i64("add", high1, low0), carry)
  # the fraction, rounded to the nearest quadrant: its top 64 bits A as a signed number (A < 0: quadrant + 1, fraction
  # - 1), then 64 more bits B: fraction = A 2^-64 + B 2^-128, as a double-double in exact pieces
  top = b.i64("or", b.i64("shl", word2, "2"), b.i64("lshr", word1, "62"))
  more = b.i64("or", b.i64("shl", word1, "2"), b.i64("lshr", low2, "62"))
  quadrant = b.i64("add", b.i64("lshr", word2, "62"), b.i64("lshr", top, "63"))
  top_high = b.out.emit(f"sitofp i64 {b.i64('and', top, str(-2048))} to double")  # 53 bits: exact
  top_low = b.out.emit(f"uitofp i64 {b.i64('and', top, '2047')} to double")
  more_high = b.mul(b.out.emit(f"uitofp i64 {b.i64('lshr', more, '11')} to double"), b.const(2.0 ** -53))
  more_low = b.mul(b.out.emit(f"uitofp i64 {b.i64('and', more, '2047')} to double"), b.const(2.0 ** -64))
  low_sum, low_error = b.two_sum(top_low, more_high)
  fraction, fraction_error = b.fast_two_sum(top_high, low_sum)
  fraction_lo = b.add(fraction_error, b.add(low_error, more_low))
  fraction, fraction_lo = b.mul(fraction, b.const(2.0 ** -64)), b.mul(fraction_lo, b.const(2.0 ** -64))
  # r = fraction * pi / 2 as a double-double
  half_pi_hi, half_pi_lo = (b.const(part) for part in constants["half_pi"])
  r, r_error = b.two_prod(fraction, half_pi_hi)
  r_lo = b.fma(fraction_lo, half_pi_hi, b.fma(fraction, half_pi_lo, r_error))
  r, r_lo = b.fast_two_sum(r, r_lo)
  if cosine: quadrant = b.i64("add", quadrant, "1")
  sin_r, cos_r = _sin_cos_kernels(b, r, r_lo)
  value = b.select(b.out.emit(f"icmp ne i64 {b.i64('and', quadrant, '1')}, 0"), cos_r, sin_r)
  # quadrants 2 and 3 negate; sin(-x) = -sin(x) (cos is even)
  flip = b.i64("shl", b.i64("and", quadrant, "2"), "62")
  if not cosine: flip = b.i64("xor", flip, b.i64("and", b.to_bits(x), str(-(1 << 63))))
  value = b.from_bits(b.i64("xor", b.to_bits(value), flip))
  # tiny |x|: sin x = x (also keeps -0 and subnormals), cos x = 1 - x^2 / 2 (one rounding)
  tiny_value = b.fma(b.mul(x, b.const(-0.5)), x, b.const(1.0)) if cosine else x
  value = b.select(b.cmp("olt", b.fabs(x), b.const(SIN_F64_TINY)), tiny_value, value)
  return b.select(b.cmp("olt", b.fabs(x), b.const(math.inf)), value, b.const(math.nan))


def _signed64(word: int) -> int:
  return word - (1 << 64) if word >= 1 << 63 else word


def pow_f64(out: Emitter, x: str, y: str) -> str:
  """pow(x, y) for float64 values with C99 / XLA semantics: 2^(y log2|x|) with log2|x| and the product as
  double-doubles, the sign from x for odd integer y, and the special cases of C99 Annex F (pow(x, +-0) = 1 and
  pow(1, y) = 1 even for NaN, pow(-1, +-inf) = 1, NaN for a finite x < 0 and finite non-integer y, zeros and
  infinities by the sign of y). Also the float32 / 16-bit POW (their values extended to float64, the result rounded
  once): exact results (3^7) come out exact, so rounding them to the dtype breaks ties as a correctly rounded pow."""
  b = _DoubleBuilder(out)
  log_hi, log_lo = _log2_double_double(b, b.fabs(x))
  product, product_error = b.two_prod(y, log_hi)
  product_error = b.fma(y, log_lo, product_error)
  finite = b.cmp("olt", b.fabs(product), b.const(math.inf))
  hi, lo = b.fast_two_sum(product, b.select(finite, product_error, b.const(0.0)))  # (NaN from inf - inf)
  result = _exp2_double_double(b, b.select(finite, hi, product), b.select(finite, lo, b.const(0.0)))
  # y is an integer (inf counts as an even one) / an odd integer (|y| < 2^53)
  integer = b.cmp("oeq", b.trunc(y), y)
  half = b.mul(y, b.const(0.5))
  odd = b.out.emit(f"and i1 {integer}, {b.cmp('une', b.trunc(half), half)}")
  negative_x = b.out.emit(f"icmp slt i64 {b.to_bits(x)}, 0")
  result = b.select(b.out.emit(f"and i1 {odd}, {negative_x}"), b.neg(result), result)
  finite_negative = b.out.emit(f"and i1 {b.cmp('olt', x, b.const(0.0))}, {b.cmp('ogt', x, b.const(-math.inf))}")
  not_integer = b.out.emit(f"xor i1 {integer}, true")  # NaN y too (the result is NaN anyway)
  result = b.select(b.out.emit(f"and i1 {finite_negative}, {not_integer}"), b.const(math.nan), result)
  minus_one_inf = b.out.emit(f"and i1 {b.cmp('oeq', x, b.const(-1.0))}, {b.cmp('oeq', b.fabs(y), b.const(math.inf))}")
  one = b.out.emit(f"or i1 {b.cmp('oeq', x, b.const(1.0))}, {b.cmp('oeq', y, b.const(0.0))}")
  return b.select(b.out.emit(f"or i1 {one}, {minus_one_inf}"), b.const(1.0), result)
