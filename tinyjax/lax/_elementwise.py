"""Elementwise lax operations: arithmetic, transcendental functions, comparisons, bitwise ops and conversions.

Each one is an Op (`bind(Ops.X, ...)`) or a short composition of Ops. The operations JAX has as primitives (`exp`,
`abs`, `max`, `pow`, ...) are `Primitive`s named as JAX's (`exp_p`, ...) whose `impl` is that composition, with a
JVP rule of their own (`ad.jvp_rules`, at the end of this file) giving JAX's derivatives, kinks and ties included;
the public function checks its arguments and binds the primitive, and tinyjax.numpy binds the same primitives.
Operands must have equal shapes and dtypes (weak Python scalars adopt the other operand's dtype); results keep the
input shape. The transcendental compositions run in float32 for float16/bfloat16 inputs and round once at the end.
"""
from __future__ import annotations

import builtins
import functools
import math
from typing import Any, Callable

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import BOOL, FLOAT32, LOW_PRECISION_FLOATS, cast, lax_operands, like, to_array
from tinyjax.trace import ad, batching
from tinyjax.trace.core import Primitive, bind
from tinyjax.uop import Ops

LOG2_E = 1.4426950408889634
LN2 = 0.6931471805599453
PI = math.pi


# ------------------------------------------------------------------------------------------- primitives, unchecked

def _unary(op: Ops, x: Array) -> Array:
  return bind(op, x, weak_type=x.weak_type)


def _binary(op: Ops, x: Array, y: Array) -> Array:
  return bind(op, x, y, weak_type=x.weak_type and y.weak_type)


def _compare(op: Ops, x: Array, y: Array) -> Array:
  return bind(op, x, y, dtype=BOOL)


def _where(condition: Array, on_true: Array, on_false: Array) -> Array:
  return bind(Ops.WHERE, condition, on_true, on_false, dtype=on_true.dtype,
              weak_type=on_true.weak_type and on_false.weak_type)


def _not(x: Array) -> Array:
  return _binary(Ops.XOR, x, like(x, True)) if x.dtype == BOOL else _binary(Ops.XOR, x, like(x, _all_ones(x.dtype)))


def _all_ones(dtype: np.dtype) -> int:
  return -1 if dtype.kind == "i" else int(np.iinfo(dtype).max)


def _eq(x: Array, y: Array) -> Array: return _not(_compare(Ops.CMPNE, x, y))
def _lt(x: Array, y: Array) -> Array: return _compare(Ops.CMPLT, x, y)
def _and(x: Array, y: Array) -> Array: return _binary(Ops.AND, x, y)
def _or(x: Array, y: Array) -> Array: return _binary(Ops.OR, x, y)
def _add(x: Array, y: Array) -> Array: return _binary(Ops.ADD, x, y)
def _mul(x: Array, y: Array) -> Array: return _binary(Ops.MUL, x, y)
def _neg(x: Array) -> Array: return _unary(Ops.NEG, x)
def _sub(x: Array, y: Array) -> Array: return _add(x, _neg(y))
def _fdiv(x: Array, y: Array) -> Array: return _binary(Ops.FDIV, x, y)
def _max(x: Array, y: Array) -> Array: return _binary(Ops.MAX, x, y)
def _c(x: Array, value: Any) -> Array: return like(x, value)


def _min(x: Array, y: Array) -> Array:
  if x.dtype == BOOL: return _and(x, y)
  if x.dtype.kind in "iu": return _not(_max(_not(x), _not(y)))  # ~ reverses the order and cannot overflow
  return _neg(_max(_neg(x), _neg(y)))  # exact, and NaN propagates as through MAX


def _le(x: Array, y: Array) -> Array:
  if dtypes.is_inexact(x.dtype): return _or(_lt(x, y), _eq(x, y))  # NaN compares false both ways
  return _not(_lt(y, x))


def _isnan(x: Array) -> Array: return _compare(Ops.CMPNE, x, x)
def _abs_float(x: Array) -> Array: return _bits_op(x, lambda bits, mask: _and(bits, _not(mask)))


def _unsigned_of(dtype: np.dtype) -> np.dtype:
  return np.dtype(f"uint{dtype.itemsize * 8}")


def _bits_op(x: Array, fn: Callable[[Array, Array], Array]) -> Array:
  """Apply `fn(bits, sign_mask)` to the bits of a float array as unsigned ints and reinterpret back."""
  unsigned = _unsigned_of(x.dtype)
  bits = bind(Ops.BITCAST, x, dtype=unsigned, weak_type=x.weak_type)
  sign_mask = like(bits, 1 << (8 * x.dtype.itemsize - 1))
  return bind(Ops.BITCAST, fn(bits, sign_mask), dtype=x.dtype, weak_type=x.weak_type)


def _signbit(x: Array) -> Array:
  """True where the sign bit is set (-0.0 and negative NaNs included) for floats; x < 0 for ints."""
  if x.dtype.kind == "u" or x.dtype == BOOL: return like(x, False, BOOL)
  if x.dtype.kind == "i": return _lt(x, _c(x, 0))
  unsigned = _unsigned_of(x.dtype)
  bits = bind(Ops.BITCAST, x, dtype=unsigned)
  return _compare(Ops.CMPNE, _and(bits, like(bits, 1 << (8 * x.dtype.itemsize - 1))), like(bits, 0))


def _copysign(magnitude: Array, sign: Array) -> Array:
  """|magnitude| with the sign bit of `sign` (floats of one dtype)."""
  unsigned = _unsigned_of(magnitude.dtype)
  sign_bits = bind(Ops.BITCAST, sign, dtype=unsigned)
  return _bits_op(magnitude, lambda bits, mask: _or(_and(bits, _not(mask)), _and(sign_bits, mask)))


def _in_float32(fn: Callable[..., Array]) -> Callable[..., Array]:
  """Run a float composition in float32 for float16/bfloat16 operands and round the result once."""
  @functools.wraps(fn)
  def wrapped(*operands: Array) -> Array:
    dtype = operands[0].dtype
    if dtype not in LOW_PRECISION_FLOATS: return fn(*operands)
    return cast(fn(*(cast(x, FLOAT32) for x in operands)), dtype)
  return wrapped


# -------------------------------------------------------------------------------------------- float compositions

def _trunc(x: Array) -> Array: return _unary(Ops.TRUNC, x)


def _floor(x: Array) -> Array:
  truncated = _trunc(x)
  return _where(_lt(x, truncated), _sub(truncated, _c(x, 1)), truncated)


def _ceil(x: Array) -> Array:
  truncated = _trunc(x)
  return _where(_lt(truncated, x), _add(truncated, _c(x, 1)), truncated)


def _round_half_even(x: Array) -> Array:
  truncated = _trunc(x)
  fraction = _abs_float(_sub(x, truncated))  # exact
  step = _copysign(_c(x, 1), x)
  is_odd = _compare(Ops.CMPNE, _sub(truncated, _mul(_trunc(_mul(truncated, _c(x, 0.5))), _c(x, 2))), _c(x, 0))
  up = _or(_lt(_c(x, 0.5), fraction), _and(_eq(fraction, _c(x, 0.5)), is_odd))
  return _where(up, _add(truncated, step), truncated)


def _round_half_away(x: Array) -> Array:
  truncated = _trunc(x)
  up = _le(_c(x, 0.5), _abs_float(_sub(x, truncated)))
  return _where(up, _add(truncated, _copysign(_c(x, 1), x)), truncated)


def _exp(x: Array) -> Array:
  """e**x with the exponent split as n*ln2 + r (Cody-Waite), so exp2 sees a small argument and large |x| stays
  accurate; the clip keeps n finite (x = +-inf give inf and 0). EXP2 is evaluated once, for r: 2**n is made from
  exponent bits (`_scale_by_pow2`), not by a second EXP2 (softmax over 8192x1024: 6.2 -> 5.3 ms).
  Complex: e**a (cos b + i sin b) from the parts (the angle b itself: scaled by log2 e and back, a large b would lose
  its value mod 2 pi), and b's zero kept on the real axis (e**(inf + 0j) is inf + 0j, not inf * 0)."""
  if dtypes.is_complex(x.dtype):
    a, b = _real(x), _imag(x)
    # where e**a overflows but e**a cos b may not, (e**(a/2) cos b) e**(a/2)
    large = _lt(_c(a, math.log(float(dtypes.finfo(a.dtype).max))), a)
    magnitude, half = _exp(a), _exp(_mul(a, _c(a, 0.5)))

    def times(part: Array) -> Array: return _where(large, _mul(_mul(half, part), half), _mul(magnitude, part))
    return _complex(times(_cos(b)), _where(_eq(b, _c(b, 0)), b, times(_sin(b))))
  if x.dtype != FLOAT32: return _exp_f64(x)
  ln2_hi, ln2_lo, limit = 0.693359375, -2.12194440e-4, 200.0
  scaled = _mul(x, _c(x, LOG2_E))
  n = _trunc(_min(_max(scaled, _c(x, -limit)), _c(x, limit)))
  reduced = _sub(_sub(x, _mul(n, _c(x, ln2_hi))), _mul(n, _c(x, ln2_lo)))
  return _scale_by_pow2(_unary(Ops.EXP2, _mul(reduced, _c(x, LOG2_E))), n)


# float64 exp and log as fdlibm's (e_exp.c, e_log.c: under 1 ulp): the reductions and rational forms below, in plain
# float64 arithmetic that vectorises (EXP2 / LOG2 of the result of a product would round twice: 1.3 / 1.5 ulp)
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # ln2_hi has 32 trailing zero bits
_EXP_F64_P = (1.66666666666666019037e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05,
              -1.65339022054652515390e-06, 4.13813679705723846039e-08)
_LOG_F64_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, 2.222219843214978396e-01,
               1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01)


def _horner(x: Array, coefficients: tuple[float, ...]) -> Array:
  """c0 + c1 x + c2 x^2 + ... (coefficients lowest degree first)."""
  value = _c(x, coefficients[-1])
  for coefficient in reversed(coefficients[:-1]): value = _add(_mul(value, x), _c(x, coefficient))
  return value


def _exp_f64(x: Array) -> Array:
  """e**x for float64: k = round(x / ln 2), r = x - k ln2 as hi - lo, e**r = 1 - ((lo - r c / (2 - c)) - hi) with
  c = r - r^2 P(r^2), times 2**k. x is clipped to [-746, 710] first (0 and inf beyond; NaN stays NaN)."""
  x = _min(_max(x, _c(x, -746.0)), _c(x, 710.0))
  k = _round_half_even(_mul(x, _c(x, LOG2_E)))
  hi = _sub(x, _mul(k, _c(x, _LN2_HI)))  # exact
  lo = _mul(k, _c(x, _LN2_LO))
  r = _sub(hi, lo)
  t = _mul(r, r)
  c = _sub(r, _mul(t, _horner(t, _EXP_F64_P)))
  y = _sub(_c(x, 1), _sub(_sub(lo, _fdiv(_mul(r, c), _sub(_c(x, 2), c))), hi))
  return _scale_by_pow2(y, k)


def _log_f64(x: Array) -> Array:
  """log(x) for float64: x = 2**k m with m in [sqrt(1/2), sqrt(2)) (k from the exponent bits, m = x 2**-k, so the
  derivative through m is 1 / 2**k), f = m - 1, s = f / (2 + f), log x = k ln2_hi - ((f^2/2 - (s (f^2/2 + R(s^2)) +
  k ln2_lo)) - f). Subnormal x are scaled by 2**54 first; 0 gives -inf, negative numbers NaN, inf itself."""
  tiny = _lt(x, _c(x, 2.0 ** -1022))
  scaled = _where(tiny, _mul(x, _c(x, 2.0 ** 54)), x)
  bits = bind(Ops.BITCAST, scaled, dtype=np.dtype(np.int64))
  mantissa = _and(bits, like(bits, (1 << 52) - 1, bits.dtype))
  exponent = _and(bind(Ops.SHR, bits, like(bits, 52, bits.dtype)), like(bits, 0x7FF, bits.dtype))
  above_root2 = _lt(like(bits, 0x6A09E667F3BCD, bits.dtype), mantissa)  # the mantissa of sqrt(2)
  exponent = _add(exponent, cast(above_root2, bits.dtype))
  # the integer as a float, exactly: 2^52 + e has e in its low mantissa bits
  k = _sub(bind(Ops.BITCAST, _or(exponent, like(bits, 0x4330000000000000, bits.dtype)), dtype=x.dtype),
           _c(x, 2.0 ** 52 + 1023))
  m = _scale_by_pow2(scaled, _neg(k))
  k = _where(tiny, _sub(k, _c(x, 54)), k)
  f = _sub(m, _c(x, 1))
  s = _fdiv(f, _add(_c(x, 2), f))
  z = _mul(s, s)
  w = _mul(z, z)
  odd = _mul(w, _horner(w, _LOG_F64_LG[1::2]))
  even = _mul(z, _horner(w, _LOG_F64_LG[0::2]))
  half_f_squared = _mul(_mul(_c(x, 0.5), f), f)
  inner = _add(_mul(s, _add(half_f_squared, _add(even, odd))), _mul(k, _c(x, _LN2_LO)))
  value = _sub(_mul(k, _c(x, _LN2_HI)), _sub(_sub(half_f_squared, inner), f))
  value = _where(_eq(x, _c(x, math.inf)), x, value)
  value = _where(_eq(x, _c(x, 0)), _c(x, -math.inf), value)
  return _where(_lt(x, _c(x, 0)), _c(x, math.nan), value)  # (NaN stays NaN through the arithmetic)


def _scale_by_pow2(value: Array, n: Array) -> Array:
  """value * 2**n for an integral float n (|n| <= 200 for float32, 2000 for float64), as value * 2**h * 2**(n - h)
  with h = trunc(n / 2): each factor a normal float built from its exponent bits, the first product exact for a
  `value` near 1, the second rounding once (into the subnormals, or to 0 or inf). The integer m of a factor is read
  from the low bits of m + 1.5 * 2**mantissa_bits (float addition, a bitcast, integer multiply-adds: all of which
  vectorise, where a float-to-integer conversion saturates and did not: softmax 3.5 -> 12 ms)."""
  if n.dtype == FLOAT32: integer, bias, mantissa_bits = np.dtype(np.int32), 127, 23
  else: integer, bias, mantissa_bits = np.dtype(np.int64), 1023, 52
  magic = 1.5 * 2.0 ** mantissa_bits
  magic_bits = int(np.array(magic, n.dtype).view(integer))
  half = _trunc(_mul(n, _c(n, 0.5)))
  for part in (half, _sub(n, half)):
    exponent = _add(bind(Ops.BITCAST, _add(part, _c(n, magic)), dtype=integer), like(n, bias - magic_bits, integer))
    factor = bind(Ops.BITCAST, _mul(exponent, like(n, 1 << mantissa_bits, integer)), dtype=n.dtype,
                  weak_type=n.weak_type)
    value = _mul(value, factor)
  return value


def _log(x: Array) -> Array:
  if dtypes.is_complex(x.dtype):  # log|z| + i arg(z), the principal branch
    return _complex(_log(_complex_abs(x)), _atan2(_imag(x), _real(x)))
  if x.dtype == np.dtype(np.float64): return _log_f64(x)
  return _mul(_unary(Ops.LOG2, x), _c(x, LN2))


def _log1p(x: Array) -> Array:
  """log(1 + x), accurate for small x: log(u) * x / (u - 1) with u = 1 + x corrects u's rounding."""
  if dtypes.is_complex(x.dtype): return _log(_plus_real(x, 1.0))
  u = _add(x, _c(x, 1))
  delta = _sub(u, _c(x, 1))
  general = _mul(_log(u), _fdiv(x, delta))
  return _where(_eq(delta, _c(x, 0)), x, _where(_eq(x, _c(x, math.inf)), x, general))


def _expm1(x: Array) -> Array:
  """e**x - 1, accurate for small x (Kahan): (u - 1) * x / log(u) with u = e**x."""
  if dtypes.is_complex(x.dtype): return _plus_real(_exp(x), -1.0)
  u = _exp(x)
  delta = _sub(u, _c(x, 1))
  general = _mul(delta, _fdiv(x, _log(u)))
  result = _where(_eq(delta, _c(x, -1)), _c(x, -1), _where(_eq(u, _c(x, math.inf)), u, general))
  return _where(_eq(u, _c(x, 1)), x, result)


def _sin(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _times_i(_complex_sinh(_times_i(x)), -1.0)  # sin z = -i sinh(i z)
  return _unary(Ops.SIN, x)


def _cos(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _complex_cosh(_times_i(x))  # cos z = cosh(i z)
  return _unary(Ops.COS, x)


# Cephes atan: a polynomial for float32, a rational function for float64, after reducing |x| to [0, 0.66].
_ATAN_F32 = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)
_TAN_3PI_8 = 2.41421356237309504880
_ATAN_MOREBITS = 6.123233995736765886130e-17


def _polynomial(z: Array, coefficients: tuple[float, ...], leading_one: bool = False) -> Array:
  result = _add(z, _c(z, coefficients[0])) if leading_one else _c(z, coefficients[0])
  for coefficient in coefficients[1:]: result = _add(_mul(result, z), _c(z, coefficient))
  return result


def _atan(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _times_i(_complex_atanh(_times_i(x)), -1.0)  # -i atanh(i z)
  magnitude = _abs_float(x)
  big = _lt(_c(x, _TAN_3PI_8), magnitude)
  middle = _lt(_c(x, 0.66 if x.dtype != FLOAT32 else 0.4142135623730950), magnitude)
  reduced = _where(big, _neg(_fdiv(_c(x, 1), magnitude)),
                   _where(middle, _fdiv(_sub(magnitude, _c(x, 1)), _add(magnitude, _c(x, 1))), magnitude))
  offset = _where(big, _c(x, PI / 2), _where(middle, _c(x, PI / 4), _c(x, 0)))
  z = _mul(reduced, reduced)
  if x.dtype == FLOAT32:
    tail = _mul(_mul(_polynomial(z, _ATAN_F32), z), reduced)
  else:
    tail = _mul(reduced, _fdiv(_mul(z, _polynomial(z, _ATAN_P)), _polynomial(z, _ATAN_Q, leading_one=True)))
    offset = _add(offset, _where(big, _c(x, _ATAN_MOREBITS), _where(middle, _c(x, 0.5 * _ATAN_MOREBITS), _c(x, 0))))
  return _copysign(_add(offset, _add(tail, reduced)), x)


def _atan2(y: Array, x: Array) -> Array:
  abs_x, abs_y = _abs_float(x), _abs_float(y)
  larger, smaller = _max(abs_x, abs_y), _min(abs_x, abs_y)
  angle = _atan(_fdiv(smaller, larger))
  angle = _where(_eq(larger, _c(x, 0)), _c(x, 0), angle)
  both_inf = _and(_eq(abs_x, _c(x, math.inf)), _eq(abs_y, _c(x, math.inf)))
  angle = _where(both_inf, _c(x, PI / 4), angle)
  angle = _where(_lt(abs_x, abs_y), _sub(_c(x, PI / 2), angle), angle)
  angle = _where(_signbit(x), _sub(_c(x, PI), angle), angle)
  return _copysign(angle, y)


def _sqrt(x: Array) -> Array: return _unary(Ops.SQRT, x)
def _one_minus_square(x: Array) -> Array: return _mul(_sub(_c(x, 1), x), _add(_c(x, 1), x))


def _large_threshold(x: Array) -> float:
  return 1.0 / math.sqrt(float(dtypes.finfo(x.dtype).eps))


def _plus_real(z: Array, value: float) -> Array:
  """z + value with the imaginary part untouched (adding 0j would turn a -0 into +0: the other side of a branch
  cut)."""
  return _complex(_add(_real(z), _c(_real(z), value)), _imag(z))


def _times_i(z: Array, sign: float = 1.0) -> Array:
  """i z (or -i z with sign -1), by swapping the parts: no product with 0 that would make NaNs of infinities."""
  re, im = _real(z), _imag(z)
  return _complex(_neg(im), re) if sign > 0 else _complex(im, _neg(re))


def _far(z: Array) -> Array:
  """|z| beyond 1 / eps: where asinh, acosh and atanh take their asymptotic forms (and infinities their limits)."""
  return _lt(_c(_real(z), 1.0 / float(dtypes.finfo(z.dtype).eps)), _complex_abs(z))


def _complex_asinh(z: Array) -> Array:
  """log(z + sqrt(z^2 + 1)) on the half-plane re(z) >= 0 (no cancellation there; -0 counts as negative, so the
  function is odd in signed zeros too), odd symmetry for the other; log(2z) far out (infinities included)."""
  negative = _signbit(_real(z))
  w = _where(negative, _neg(z), z)
  near = _log(_add(w, _sqrt(_plus_real(_mul(w, w), 1.0))))
  value = _where(_far(w), _plus_real(_log(w), LN2), near)
  return _where(negative, _neg(value), value)


def _complex_acosh(z: Array) -> Array:
  """log(z + sqrt(z + 1) sqrt(z - 1)) (log(2z) far out), then the principal branch's signs: real part >= 0, imaginary
  part with the sign of z's (C99's cacosh; the product's zero imaginary part on the cut has no reliable sign)."""
  near = _log(_add(z, _mul(_sqrt(_plus_real(z, 1.0)), _sqrt(_plus_real(z, -1.0)))))
  value = _where(_far(z), _plus_real(_log(z), LN2), near)
  return _complex(_abs_float(_real(value)), _copysign(_abs_float(_imag(value)), _imag(z)))


def _complex_atanh(z: Array) -> Array:
  """(log1p(z) - log1p(-z)) / 2; far out re(1 / z) + i pi/2 sign(im z) (0 + i pi/2 at infinities, C99's catanh)."""
  near = _halved(_sub(_log1p(z), _log1p(_neg(z))))
  a, b = _real(z), _imag(z)
  modulus = _complex_abs(z)
  infinite = _eq(modulus, _c(modulus, math.inf))
  real_far = _where(infinite, _copysign(_c(a, 0), a), _fdiv(_fdiv(a, modulus), modulus))
  far = _complex(real_far, _copysign(_c(b, math.pi / 2), b))
  return _where(_far(z), far, near)


def _asin(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _times_i(_complex_asinh(_times_i(x)), -1.0)  # -i asinh(i z)
  return _atan2(x, _sqrt(_one_minus_square(x)))


def _acos(x: Array) -> Array:
  if dtypes.is_complex(x.dtype):  # pi / 2 - asin(z)
    w = _asin(x)
    return _complex(_sub(_c(_real(w), math.pi / 2), _real(w)), _neg(_imag(w)))
  return _atan2(_sqrt(_one_minus_square(x)), x)


def _asinh(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _complex_asinh(x)
  a = _abs_float(x)
  big = _add(_log(a), _c(x, LN2))
  small = _log1p(_add(a, _fdiv(_mul(a, a), _add(_c(x, 1), _sqrt(_add(_c(x, 1), _mul(a, a)))))))
  return _copysign(_where(_lt(_c(x, _large_threshold(x)), a), big, small), x)


def _acosh(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _complex_acosh(x)
  t = _sub(x, _c(x, 1))
  small = _log1p(_add(t, _sqrt(_add(_mul(_c(x, 2), t), _mul(t, t)))))
  value = _where(_lt(_c(x, _large_threshold(x)), x), _add(_log(x), _c(x, LN2)), small)
  return _where(_lt(x, _c(x, 1)), _c(x, math.nan), value)  # (for x << -1, t + sqrt(t^2 + 2t) rounds to 0)


def _atanh(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _complex_atanh(x)
  return _mul(_c(x, 0.5), _log1p(_fdiv(_mul(_c(x, 2), x), _sub(_c(x, 1), x))))


def _half_exp_large(a: Array) -> Array:
  """e**a / 2 for large a >= 0 where e**a itself overflows but the half does not: (e**(a/2) / 2) * e**(a/2)."""
  root = _exp(_mul(a, _c(a, 0.5)))
  return _mul(_mul(root, _c(a, 0.5)), root)


def _sinh(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _complex_sinh(x)
  a = _abs_float(x)
  em1 = _expm1(a)
  value = _mul(_c(x, 0.5), _add(em1, _fdiv(em1, _add(em1, _c(x, 1)))))
  return _copysign(_where(_eq(em1, _c(x, math.inf)), _half_exp_large(a), value), x)


def _cosh(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _complex_cosh(x)
  a = _abs_float(x)
  e = _exp(a)
  return _where(_eq(e, _c(x, math.inf)), _half_exp_large(a), _add(_mul(_c(x, 0.5), e), _fdiv(_c(x, 0.5), e)))


# float32 tanh in two pieces, branch-free (~40 operations; through expm1 it took ~150, 4.5x slower than XLA's):
# |x| < _TANH_SMALL: x + x^3 P(x^2), P fitted to tanh's relative error on [0, 0.625] (least squares reweighted toward
# minimax, Lawson); beyond it 1 - 2 / (2^(2 log2(e) |x|) + 1), whose argument's rounding costs little where the result
# is not already 1. Over 4M points of [0, 10]: at most 0.8 ulp below 0.625, 1.7 ulp above.
_TANH_SMALL = 0.625
_TANH_F32 = (-0.3333328068256378, 0.13331443071365356, -0.05373978242278099, 0.020639315247535706,
             -0.005705247167497873)


def _complex_sinh(x: Array) -> Array:
  """sinh(a + ib) = sinh a cos b + i cosh a sin b, from the real functions (no overflow of e**a where the result is
  finite); on the real axis the imaginary part is b itself where a is infinite (not inf * 0)."""
  a, b = _real(x), _imag(x)
  im = _where(_eq(b, _c(b, 0)), b, _mul(_cosh(a), _sin(b)))  # (cosh a > 0: b's signed zero)
  return _complex(_mul(_sinh(a), _cos(b)), im)


def _complex_cosh(x: Array) -> Array:
  """cosh(a + ib) = cosh a cos b + i sinh a sin b, as `_complex_sinh` (on the real axis: the zero of sign a * b)."""
  a, b = _real(x), _imag(x)
  im = _where(_eq(b, _c(b, 0)), _mul(_copysign(_c(a, 1), a), b), _mul(_sinh(a), _sin(b)))
  return _complex(_mul(_cosh(a), _cos(b)), im)


def _is_finite(x: Array) -> Array: return _lt(_abs_float(x), _c(x, math.inf))


def _halved(z: Array) -> Array:
  """z / 2 part by part (a product with 0.5 + 0j would turn inf + 0j into inf + NaN j)."""
  return _complex(_mul(_real(z), _c(_real(z), 0.5)), _mul(_imag(z), _c(_imag(z), 0.5)))


def _complex_tanh(x: Array) -> Array:
  """tanh(a + ib) = (tanh a (1 + t^2) + i t (1 - tanh^2 a)) / (1 + tanh^2 a t^2), t = tan b: no overflow for large a
  (the result tends to +-1 + 0i); b = 0 keeps the real tanh and b's zero, a = +-inf gives +-1 + 0i."""
  a, b = _real(x), _imag(x)
  th, t = _tanh(a), _fdiv(_sin(b), _cos(b))
  th2, t2 = _mul(th, th), _mul(t, t)
  denominator = _add(_c(a, 1), _mul(th2, t2))
  re = _fdiv(_mul(th, _add(_c(a, 1), t2)), denominator)
  im = _fdiv(_mul(t, _sub(_c(a, 1), th2)), denominator)
  infinite = _eq(_abs_float(a), _c(a, math.inf))
  on_axis = _eq(b, _c(b, 0))
  re = _where(_or(infinite, on_axis), th, re)
  im = _where(infinite, _copysign(_c(b, 0), _where(_isnan(b), _c(b, 0), _sin(_mul(b, _c(b, 2))))),
              _where(on_axis, b, im))
  return _complex(re, im)


# Cephes' float64 tanh on |x| < 0.625: P highest degree first; Q's leading coefficient 1 is implied
_TANH_F64_P = (-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3)
_TANH_F64_Q = (1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3)


def _tanh(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return _complex_tanh(x)
  a = _abs_float(x)
  if x.dtype == FLOAT32:
    square = _mul(a, a)
    p = _c(x, _TANH_F32[-1])
    for coefficient in reversed(_TANH_F32[:-1]): p = _add(_mul(p, square), _c(x, coefficient))
    small = _add(a, _mul(_mul(a, square), p))
    large = _sub(_c(x, 1), _fdiv(_c(x, 2), _add(_unary(Ops.EXP2, _mul(a, _c(x, 2 * LOG2_E))), _c(x, 1))))
    return _copysign(_where(_lt(a, _c(x, _TANH_SMALL)), small, large), x)
  # float64: |x| < 0.625: Cephes' x + x^3 P(x^2) / Q(x^2); beyond: 1 - 2 / (e^2|x| + 1) (e^2|x| by `_exp`, accurate
  # for large arguments; tanh rounds to 1 beyond 20, where the clip keeps e^2|x| finite), `_one_minus_two_over`
  square = _mul(a, a)
  numerator, denominator = _c(x, _TANH_F64_P[0]), _add(square, _c(x, _TANH_F64_Q[0]))
  for coefficient in _TANH_F64_P[1:]: numerator = _add(_mul(numerator, square), _c(x, coefficient))
  for coefficient in _TANH_F64_Q[1:]: denominator = _add(_mul(denominator, square), _c(x, coefficient))
  small = _add(a, _mul(_mul(a, square), _fdiv(numerator, denominator)))
  large = _one_minus_two_over(_exp(_mul(_min(a, _c(x, 20.0)), _c(x, 2))))
  return _copysign(_where(_lt(a, _c(x, _TANH_SMALL)), small, large), x)


def _split(a: Array) -> tuple[Array, Array]:
  """Dekker's split of a float64 into a high part of 26 significant bits and the exact rest."""
  scaled = _mul(a, _c(a, 134217729.0))  # 2^27 + 1
  high = _sub(scaled, _sub(scaled, a))
  return high, _sub(a, high)


def _one_minus_two_over(e: Array) -> Array:
  """1 - 2 / (e + 1) for float64 e >= 1, rounded once: e + 1 as an exact sum of two floats, the quotient q corrected
  by its residual (2 - q (e + 1), with q's product with the sum exact by Dekker's splits: our IR has no FMA), and
  1 - q as an exact sum too. In plain float arithmetic 1 - 2 / (e^2x + 1) is tanh's rounded three times where the
  quotient is near 1/2 (1.27 ulp just above |x| = 0.625); so, e's own error aside (< 0.87 ulp, of which the quotient
  keeps less than a half), under 0.8 ulp."""
  one, two = _c(e, 1), _c(e, 2)
  total = _add(e, one)
  total_low = _sub(one, _sub(total, e))  # (Fast2Sum: e >= 1)
  quotient = _fdiv(two, total)
  product = _mul(quotient, total)
  (q_high, q_low), (t_high, t_low) = _split(quotient), _split(total)
  product_low = _add(_add(_add(_sub(_mul(q_high, t_high), product), _mul(q_high, t_low)), _mul(q_low, t_high)),
                     _mul(q_low, t_low))
  residual = _sub(_sub(_sub(two, product), product_low), _mul(quotient, total_low))  # (2 - product is exact)
  difference = _sub(one, quotient)
  difference_low = _sub(_neg(quotient), _sub(difference, one))  # (Fast2Sum: 1 >= quotient)
  return _add(difference, _sub(difference_low, _mul(_mul(residual, quotient), _c(e, 0.5))))  # (residual / total)


def _cbrt(x: Array) -> Array:
  a = _abs_float(x)
  guess = _unary(Ops.EXP2, _mul(_unary(Ops.LOG2, a), _c(x, 1 / 3)))
  refined = _sub(guess, _mul(_sub(guess, _fdiv(a, _mul(guess, guess))), _c(x, 1 / 3)))  # one Newton step
  special = _or(_eq(a, _c(x, 0)), _or(_eq(a, _c(x, math.inf)), _isnan(a)))
  return _copysign(_where(special, a, refined), x)


# ------------------------------------------------------------------------------------------------- public: checks

def _require(name: str, x: Array, kinds: str) -> None:
  kind = "f" if dtypes.is_floating(x.dtype) else x.dtype.kind
  if kind not in kinds:
    wanted = {"f": "floating", "i": "signed integer", "u": "unsigned integer", "b": "bool", "c": "complex"}
    allowed = ", ".join(wanted[k] for k in kinds)
    raise TypeError(f"lax.{name} does not accept dtype {x.dtype.name}. Accepted dtypes are subtypes of {allowed}.")


def _unary_op(name: str, kinds: str, fn: Callable[[Array], Array], doc: str) -> Callable[[Any], Array]:
  def op(x: Any) -> Array:
    x = to_array(x)
    _require(name, x, kinds)
    return fn(x)
  op.__name__ = op.__qualname__ = name
  op.__doc__ = doc
  return op


def _binary_op(name: str, kinds: str, fn: Callable[[Array, Array], Array], doc: str) -> Callable[[Any, Any], Array]:
  def op(x: Any, y: Any) -> Array:
    x, y = lax_operands(name, x, y)
    _require(name, x, kinds)
    return fn(x, y)
  op.__name__ = op.__qualname__ = name
  op.__doc__ = doc
  return op


NUMBER = "fiu"
COMPLEX = "c"
FLOAT = "f"
INTEGER = "iub"

# ---------------------------------------------------------------------------------------------- arithmetic


def _sign(x: Array) -> Array:
  if dtypes.is_complex(x.dtype):  # z / |z|, and 0 at 0
    zero = _eq(x, _c(x, 0))
    return _where(zero, x, _fdiv(x, _complex(_where(zero, _c(_real(x), 1), _complex_abs(x)), _c(_real(x), 0))))
  if x.dtype.kind == "u": return cast(_compare(Ops.CMPNE, x, _c(x, 0)), x.dtype)
  positive, negative = _lt(_c(x, 0), x), _lt(x, _c(x, 0))
  if x.dtype.kind == "i": return _where(positive, _c(x, 1), _where(negative, _c(x, -1), _c(x, 0)))
  return _where(positive, _c(x, 1), _where(negative, _c(x, -1), x))  # keeps +-0 and NaN


def _abs(x: Array) -> Array:
  if dtypes.is_floating(x.dtype): return _abs_float(x)
  if dtypes.is_complex(x.dtype): return _complex_abs(x)
  if x.dtype.kind == "u": return x
  return _where(_lt(x, _c(x, 0)), _neg(x), x)


def _div(x: Array, y: Array) -> Array:
  return _fdiv(x, y) if dtypes.is_inexact(x.dtype) else _binary(Ops.IDIV, x, y)


# ---------------------------------------------------------------------------------------------- complex numbers
# (lower/complex.py computes complex nodes as pairs of floats; these pick or pair the parts)

def _real(x: Array) -> Array:
  if not dtypes.is_complex(x.dtype): return x
  return bind(Ops.REAL, x, dtype=dtypes.real_dtype(x.dtype), weak_type=x.weak_type)


def _imag(x: Array) -> Array:
  if dtypes.is_complex(x.dtype): return bind(Ops.IMAG, x, dtype=dtypes.real_dtype(x.dtype), weak_type=x.weak_type)
  return _c(x, 0)


def _complex(x: Array, y: Array) -> Array:
  return bind(Ops.COMPLEX, x, y, dtype=dtypes.complex_dtype(x.dtype), weak_type=x.weak_type and y.weak_type)


def _conj(x: Array) -> Array:
  return _complex(_real(x), _neg(_imag(x))) if dtypes.is_complex(x.dtype) else x


def _complex_abs(x: Array) -> Array:
  """|a + ib| = m sqrt((a / m)^2 + (b / m)^2), m = max(|a|, |b|): no overflow or underflow on the way."""
  a, b = abs_p.bind(_real(x)), abs_p.bind(_imag(x))  # (abs_p: differentiable, as bit operations are not)
  largest, smallest = _max(a, b), _min(a, b)
  safe = _where(_eq(largest, _c(largest, 0)), _c(largest, 1), largest)
  ratio = _fdiv(smallest, safe)
  magnitude = _mul(largest, _sqrt(_add(_c(ratio, 1), _mul(ratio, ratio))))
  # an infinite part makes the modulus inf, even with a NaN in the other (C99's hypot)
  infinite = _or(_eq(a, _c(a, math.inf)), _eq(b, _c(b, math.inf)))
  return _where(infinite, _c(a, math.inf), _where(_eq(largest, _c(largest, math.inf)), largest, magnitude))


def _rem(x: Array, y: Array) -> Array: return _binary(Ops.MOD, x, y)  # floats: C fmod, exact


add = _binary_op("add", NUMBER + COMPLEX, _add, "Elementwise x + y (same shapes and dtypes; integers wrap).")
sub_p = Primitive("sub", _sub)  # (x + -y as Ops; a primitive for its name in jaxprs: `sub a b`, as JAX's)
sub = _binary_op("sub", NUMBER + COMPLEX, sub_p.bind, "Elementwise x - y (same shapes and dtypes).")
mul = _binary_op("mul", NUMBER + COMPLEX, _mul, "Elementwise x * y (same shapes and dtypes).")
div = _binary_op("div", NUMBER + COMPLEX, _div,
                 "Elementwise x / y: float division, or integer division rounding toward zero.")
neg = _unary_op("neg", NUMBER + COMPLEX, _neg, "Elementwise -x.")
reciprocal = _unary_op("reciprocal", FLOAT, lambda x: _unary(Ops.RECIP, x), "Elementwise 1 / x.")

# the primitives: impl = the composition of Ops that computes it
rem_p = Primitive("rem", _rem)  # floats: C fmod, exact
max_p = Primitive("max", _max)
min_p = Primitive("min", _min)
abs_p = Primitive("abs", _abs)
sign_p = Primitive("sign", _sign)
square_p = Primitive("square", lambda x: _mul(x, x))
exp_p = Primitive("exp", _in_float32(_exp))
exp2_p = Primitive("exp2", _in_float32(lambda x: _unary(Ops.EXP2, x)))
log_p = Primitive("log", _in_float32(_log))
log1p_p = Primitive("log1p", _in_float32(_log1p))
expm1_p = Primitive("expm1", _in_float32(_expm1))
sin_p = Primitive("sin", _in_float32(_sin))
cos_p = Primitive("cos", _in_float32(_cos))
tan_p = Primitive("tan", _in_float32(lambda x: _times_i(_complex_tanh(_times_i(x)), -1.0) if dtypes.is_complex(x.dtype)
                                      else _fdiv(_sin(x), _cos(x))))  # (tan z = -i tanh(i z): no inf / inf)
atan_p = Primitive("atan", _in_float32(_atan))
asin_p = Primitive("asin", _in_float32(_asin))
acos_p = Primitive("acos", _in_float32(_acos))
atan2_p = Primitive("atan2", _in_float32(_atan2))
sinh_p = Primitive("sinh", _in_float32(_sinh))
cosh_p = Primitive("cosh", _in_float32(_cosh))
tanh_p = Primitive("tanh", _in_float32(_tanh))
asinh_p = Primitive("asinh", _in_float32(_asinh))
acosh_p = Primitive("acosh", _in_float32(_acosh))
atanh_p = Primitive("atanh", _in_float32(_atanh))
logistic_p = Primitive("logistic", _in_float32(lambda x: _unary(Ops.RECIP, _add(_c(x, 1), _exp(_neg(x))))))
sqrt_p = Primitive("sqrt", _sqrt)
rsqrt_p = Primitive("rsqrt", _in_float32(lambda x: _unary(Ops.RECIP, _sqrt(x))))
cbrt_p = Primitive("cbrt", _in_float32(_cbrt))
floor_p = Primitive("floor", _floor)
ceil_p = Primitive("ceil", _ceil)
is_finite_p = Primitive("is_finite", _is_finite)
pow_p = Primitive("pow", _in_float32(lambda x, y: _binary(Ops.POW, x, y)))

rem = _binary_op("rem", NUMBER, rem_p.bind, "Elementwise remainder of `div` (C fmod: the sign of x).")
max = _binary_op("max", NUMBER + "b" + COMPLEX, max_p.bind,  # noqa: A001
                "Elementwise maximum; NaN propagates; complex numbers compare lexicographically.")
min = _binary_op("min", NUMBER + "b" + COMPLEX, min_p.bind,  # noqa: A001
                "Elementwise minimum; NaN propagates; complex numbers compare lexicographically.")
abs = _unary_op("abs", NUMBER + COMPLEX,  # noqa: A001
                lambda x: _complex_abs(x) if dtypes.is_complex(x.dtype) else abs_p.bind(x),
                "Elementwise |x| (|-0.0| is 0.0; integers wrap at the minimum; a complex x's modulus, a float).")
sign = _unary_op("sign", NUMBER + COMPLEX, sign_p.bind,
                "Elementwise sign: -1, 0 or 1 in x's dtype (floats keep -0.0 and NaN); z / |z| for complex z.")
square = _unary_op("square", NUMBER, square_p.bind, "Elementwise x * x.")
exp = _unary_op("exp", FLOAT + COMPLEX, exp_p.bind, "Elementwise e**x.")
exp2 = _unary_op("exp2", FLOAT, exp2_p.bind, "Elementwise 2**x.")
log = _unary_op("log", FLOAT + COMPLEX, log_p.bind, "Elementwise natural logarithm.")
log1p = _unary_op("log1p", FLOAT + COMPLEX, log1p_p.bind, "Elementwise log(1 + x), accurate for small x.")
expm1 = _unary_op("expm1", FLOAT + COMPLEX, expm1_p.bind, "Elementwise e**x - 1, accurate for small x.")
sin = _unary_op("sin", FLOAT + COMPLEX, sin_p.bind, "Elementwise sine.")
cos = _unary_op("cos", FLOAT + COMPLEX, cos_p.bind, "Elementwise cosine.")
tan = _unary_op("tan", FLOAT + COMPLEX, tan_p.bind, "Elementwise tangent.")
atan = _unary_op("atan", FLOAT + COMPLEX, atan_p.bind, "Elementwise arc tangent, in (-pi/2, pi/2).")
asin = _unary_op("asin", FLOAT + COMPLEX, asin_p.bind, "Elementwise arc sine, in [-pi/2, pi/2] (NaN outside [-1, 1]).")
acos = _unary_op("acos", FLOAT + COMPLEX, acos_p.bind, "Elementwise arc cosine, in [0, pi] (NaN outside [-1, 1]).")
atan2 = _binary_op("atan2", FLOAT, atan2_p.bind, "Elementwise arc tangent of y / x using both signs.")
sinh = _unary_op("sinh", FLOAT + COMPLEX, sinh_p.bind, "Elementwise hyperbolic sine.")
cosh = _unary_op("cosh", FLOAT + COMPLEX, cosh_p.bind, "Elementwise hyperbolic cosine.")
tanh = _unary_op("tanh", FLOAT + COMPLEX, tanh_p.bind, "Elementwise hyperbolic tangent.")
asinh = _unary_op("asinh", FLOAT + COMPLEX, asinh_p.bind, "Elementwise inverse hyperbolic sine.")
acosh = _unary_op("acosh", FLOAT + COMPLEX, acosh_p.bind, "Elementwise inverse hyperbolic cosine (NaN below 1).")
atanh = _unary_op("atanh", FLOAT + COMPLEX, atanh_p.bind,
                  "Elementwise inverse hyperbolic tangent (NaN outside [-1, 1]).")
logistic = _unary_op("logistic", FLOAT, logistic_p.bind, "Elementwise logistic sigmoid 1 / (1 + e**-x).")
sqrt = _unary_op("sqrt", FLOAT + COMPLEX, sqrt_p.bind, "Elementwise square root (NaN for negative x).")
rsqrt = _unary_op("rsqrt", FLOAT, rsqrt_p.bind, "Elementwise 1 / sqrt(x).")
cbrt = _unary_op("cbrt", FLOAT, cbrt_p.bind, "Elementwise real cube root (negative for negative x).")
floor = _unary_op("floor", FLOAT, floor_p.bind, "Elementwise floor (round toward -inf).")
ceil = _unary_op("ceil", FLOAT, ceil_p.bind, "Elementwise ceiling (round toward +inf).")
is_finite = _unary_op("is_finite", FLOAT, is_finite_p.bind,
                      "Elementwise test for finite values (bool; NaN and +-inf are False).")
pow = _binary_op("pow", FLOAT, pow_p.bind,  # noqa: A001
                 "Elementwise x ** y for floats of one dtype (see `integer_pow` for static integer exponents).")


def _nextafter(x: Array, y: Array) -> Array:
  """The float next to x in the direction of y: one step of x's bit pattern (away from or towards zero), the
  smallest subnormal with y's sign from zero, y itself when equal, NaN when either is."""
  unsigned = _unsigned_of(x.dtype)
  bits = bind(Ops.BITCAST, x, dtype=unsigned)
  one = like(bits, 1)
  away = _eq(_lt(x, y), _lt(_c(x, 0), x))  # a step up in magnitude (the bit pattern grows), or down
  stepped = bind(Ops.BITCAST, _where(away, _add(bits, one), _sub(bits, one)), dtype=x.dtype)
  tiny = _copysign(bind(Ops.BITCAST, one, dtype=x.dtype), y)
  result = _where(_eq(x, _c(x, 0)), tiny, stepped)
  result = _where(_eq(x, y), y, result)
  nan = _or(_isnan(x), _isnan(y))
  return _where(nan, _add(x, y), result)


nextafter = _binary_op("nextafter", FLOAT, _nextafter, "Elementwise next float after x1 towards x2.")


class RoundingMethod:
  """How `round` breaks ties: AWAY_FROM_ZERO (lax's default) or TO_NEAREST_EVEN (numpy's)."""
  AWAY_FROM_ZERO = 0
  TO_NEAREST_EVEN = 1


def _round(x: Array, rounding_method: int) -> Array:
  return _round_half_even(x) if rounding_method == RoundingMethod.TO_NEAREST_EVEN else _round_half_away(x)


round_p = Primitive("round", _round)


def round(x: Any, rounding_method: int = RoundingMethod.AWAY_FROM_ZERO) -> Array:  # noqa: A001
  """Elementwise rounding to the nearest integer value (same float dtype); ties away from zero by default."""
  x = to_array(x)
  _require("round", x, FLOAT)
  return round_p.bind(x, rounding_method=int(rounding_method))


def _integer_pow(x: Array, y: int) -> Array:
  result, base, remaining = None, x, builtins.abs(y)
  while remaining:
    if remaining & 1: result = base if result is None else _mul(result, base)
    remaining >>= 1
    if remaining: base = _mul(base, base)
  if result is None: result = _c(x, 1)
  return _unary(Ops.RECIP, result) if y < 0 else result


integer_pow_p = Primitive("integer_pow", _integer_pow)


def integer_pow(x: Any, y: int) -> Array:
  """Elementwise x ** y for a static Python int y, by repeated squaring (negative y: the reciprocal, floats only)."""
  x = to_array(x)
  _require("integer_pow", x, NUMBER + COMPLEX)
  exponent = int(y)
  if exponent < 0 and not dtypes.is_inexact(x.dtype):
    raise TypeError(f"lax.integer_pow: negative exponent {exponent} needs a floating dtype, got {x.dtype.name}")
  return integer_pow_p.bind(x, y=exponent)


def integer_power_array(x: Array, y: Array) -> Array:
  """x ** y for integer arrays of one dtype and shape, by binary exponentiation over the bits of y (y < 0 gives 0,
  except for bases 1 and -1)."""
  result, base, exponent = _c(x, 1), x, y
  for _ in range(8 * x.dtype.itemsize):
    odd = _compare(Ops.CMPNE, _and(exponent, _c(y, 1)), _c(y, 0))
    result = _where(odd, _mul(result, base), result)
    base = _mul(base, base)
    exponent = _binary(Ops.SHR, exponent, _c(y, 1))
  if x.dtype.kind == "i":
    negative = _lt(y, _c(y, 0))
    minus_one_result = _where(_eq(_and(y, _c(y, 1)), _c(y, 0)), _c(x, 1), _c(x, -1))
    special = _where(_eq(x, _c(x, 1)), _c(x, 1), _where(_eq(x, _c(x, -1)), minus_one_result, _c(x, 0)))
    result = _where(negative, special, result)
  return result


# ---------------------------------------------------------------------------------------------- comparisons

# (lt and ne are single Ops, printed under those names; the others are primitives for their names in jaxprs: `x >= 0`
# is one `ge`, not the four Ops that compute it)
eq_p = Primitive("eq", _eq)
gt_p = Primitive("gt", lambda x, y: _lt(y, x))
le_p = Primitive("le", _le)
ge_p = Primitive("ge", lambda x, y: _le(y, x))
eq = _binary_op("eq", NUMBER + "b" + COMPLEX, eq_p.bind, "Elementwise x == y (bool).")
ne = _binary_op("ne", NUMBER + "b" + COMPLEX, lambda x, y: _compare(Ops.CMPNE, x, y), "Elementwise x != y (bool).")
lt = _binary_op("lt", NUMBER + "b", _lt, "Elementwise x < y (bool).")
gt = _binary_op("gt", NUMBER + "b", gt_p.bind, "Elementwise x > y (bool).")
le = _binary_op("le", NUMBER + "b", le_p.bind, "Elementwise x <= y (bool; False with NaN).")
ge = _binary_op("ge", NUMBER + "b", ge_p.bind, "Elementwise x >= y (bool; False with NaN).")

# ---------------------------------------------------------------------------------------------- bitwise

bitwise_and = _binary_op("bitwise_and", INTEGER, _and, "Elementwise x & y for integers and bools.")
bitwise_or = _binary_op("bitwise_or", INTEGER, _or, "Elementwise x | y for integers and bools.")
bitwise_xor = _binary_op("bitwise_xor", INTEGER, lambda x, y: _binary(Ops.XOR, x, y),
                         "Elementwise x ^ y for integers and bools.")
bitwise_not = _unary_op("bitwise_not", INTEGER, _not, "Elementwise ~x for integers (logical not for bools).")


def _shift_amount(x: Array, y: Array) -> tuple[Array, Array]:
  """The shift where it is in [0, bits) and bits - 1 elsewhere (so the primitive never sees an out-of-range shift,
  and an arithmetic right shift by a negative or too large amount fills with the sign bit, as XLA), and whether it
  was in range."""
  bits = 8 * x.dtype.itemsize
  in_range = _and(_le(_c(y, 0), y), _lt(y, _c(y, bits))) if y.dtype.kind == "i" else _lt(y, _c(y, bits))
  return _where(in_range, y, _c(y, bits - 1)), in_range


def _shift_left(x: Array, y: Array) -> Array:
  amount, in_range = _shift_amount(x, y)
  return _where(in_range, _binary(Ops.SHL, x, amount), _c(x, 0))


def _shift_right_arithmetic(x: Array, y: Array) -> Array:
  if x.dtype.kind == "u": return _shift_right_logical(x, y)
  amount, _ = _shift_amount(x, y)  # shifting by bits - 1 already gives 0 or -1, what an out-of-range shift means
  return _binary(Ops.SHR, x, amount)


def _shift_right_logical(x: Array, y: Array) -> Array:
  amount, in_range = _shift_amount(x, y)
  if x.dtype.kind == "i":
    unsigned = _unsigned_of(x.dtype)
    shifted = _binary(Ops.SHR, bind(Ops.BITCAST, x, dtype=unsigned), bind(Ops.BITCAST, amount, dtype=unsigned))
    shifted = bind(Ops.BITCAST, shifted, dtype=x.dtype, weak_type=x.weak_type)
  else:
    shifted = _binary(Ops.SHR, x, amount)
  return _where(in_range, shifted, _c(x, 0))


shift_left = _binary_op("shift_left", "iu", _shift_left, "Elementwise x << y (0 when y is out of [0, bits)).")
shift_right_arithmetic = _binary_op("shift_right_arithmetic", "iu", _shift_right_arithmetic,
                                    "Elementwise x >> y, filling with the sign bit.")
shift_right_logical = _binary_op("shift_right_logical", "iu", _shift_right_logical,
                                 "Elementwise x >> y, filling with zeros (0 when y is out of [0, bits)).")


# ---------------------------------------------------------------------------------------------- conversions

def convert_element_type(operand: Any, new_dtype: Any) -> Array:
  """Elementwise conversion to `new_dtype` (same shape; a strongly typed result). Float to int truncates toward zero;
  anything to bool is `!= 0`."""
  x = to_array(operand)
  return cast(x, dtypes.canonicalize_dtype(dtypes.dtype(new_dtype)), weak_type=False)


def bitcast_convert_type(operand: Any, new_dtype: Any) -> Array:
  """Reinterpret the bits of each element as `new_dtype` (same itemsize only; same shape)."""
  x = to_array(operand)
  target = dtypes.canonicalize_dtype(dtypes.dtype(new_dtype))
  if target.itemsize != x.dtype.itemsize:
    raise TypeError(f"lax.bitcast_convert_type between {x.dtype.name} and {target.name} (different itemsizes) is not "
                    "supported yet")
  return x if target == x.dtype else bind(Ops.BITCAST, x, dtype=target)


# ---------------------------------------------------------------------------------------------- derivatives
# One row per primitive, JAX's rules: `rule(t, out, *primals, **params)` is the output tangent contributed by
# operand tangent t. Tangents enter only linearly (multiplied or divided by primal values, negated, added, selected
# by a primal condition), so reverse mode can transpose them. Primal factors use the primitives (cos_p, rsqrt_p,
# ...) so that higher derivatives use these rules too.

def _one(x: Array) -> Array: return _c(x, 1)
def _ge_zero(x: Array) -> Array: return _le(_c(x, 0), x)
def _replace_zero(x: Array) -> Array: return _where(_eq(x, _c(x, 0)), _one(x), x)


def _min_max_rule(this_operand: int, largest: bool) -> Callable[..., Array]:
  def rule(t, out, x, y):
    this, other = (x, y) if this_operand == 0 else (y, x)
    return _mul(t, ad.balanced_eq(this, other, largest))  # ties split 0.5 / 0.5; NaN results get 0
  return rule


ad.defjvp(abs_p, lambda t, out, x: _where(_ge_zero(x), t, _neg(t)))  # grad(abs)(0.) == 1, as JAX
for _prim in (sign_p, floor_p, ceil_p, round_p, is_finite_p): ad.defjvp_zero(_prim)
ad.defjvp(max_p, _min_max_rule(0, True), _min_max_rule(1, True))
ad.defjvp(min_p, _min_max_rule(0, False), _min_max_rule(1, False))
ad.defjvp(rem_p, lambda t, out, x, y: t,
          lambda t, out, x, y: _mul(_neg(t), _mul(_sign(_fdiv(x, y)), _floor(_abs(_fdiv(x, y))))))
ad.defjvp(square_p, lambda t, out, x: _mul(t, _mul(_c(x, 2), x)))
ad.defjvp(integer_pow_p, lambda t, out, x, *, y: None if y == 0 else
          _mul(t, _mul(_c(x, y), x if y == 2 else integer_pow_p.bind(x, y=y - 1))))
ad.defjvp(exp_p, lambda t, out, x: _mul(t, out))
ad.defjvp(exp2_p, lambda t, out, x: _mul(_c(x, LN2), _mul(t, out)))
ad.defjvp(log_p, lambda t, out, x: _fdiv(t, x))
ad.defjvp(log1p_p, lambda t, out, x: _fdiv(t, _add(x, _one(x))))
ad.defjvp(expm1_p, lambda t, out, x: _mul(t, _add(out, _one(out))))
ad.defjvp(sin_p, lambda t, out, x: _mul(t, cos_p.bind(x)))
ad.defjvp(cos_p, lambda t, out, x: _neg(_mul(t, sin_p.bind(x))))
ad.defjvp(tan_p, lambda t, out, x: _mul(t, _add(_one(x), _mul(out, out))))
ad.defjvp(asin_p, lambda t, out, x: _mul(t, rsqrt_p.bind(_sub(_one(x), _mul(x, x)))))
ad.defjvp(acos_p, lambda t, out, x: _mul(t, _neg(rsqrt_p.bind(_sub(_one(x), _mul(x, x))))))
ad.defjvp(atan_p, lambda t, out, x: _fdiv(t, _add(_one(x), _mul(x, x))))
ad.defjvp(atan2_p, lambda t, out, x, y: _mul(t, _fdiv(y, _add(_mul(x, x), _mul(y, y)))),
          lambda t, out, x, y: _fdiv(_mul(t, _neg(x)), _add(_mul(x, x), _mul(y, y))))
ad.defjvp(sinh_p, lambda t, out, x: _mul(t, cosh_p.bind(x)))
ad.defjvp(cosh_p, lambda t, out, x: _mul(t, sinh_p.bind(x)))
ad.defjvp(tanh_p, lambda t, out, x: _mul(_add(t, _mul(t, out)), _sub(_one(x), out)))
ad.defjvp(asinh_p, lambda t, out, x: _mul(t, rsqrt_p.bind(_add(_mul(x, x), _one(x)))))
# (1 / (sqrt(x - 1) sqrt(x + 1)): the principal branch's derivative for complex x too, where 1 / sqrt(x^2 - 1) is not)
ad.defjvp(acosh_p, lambda t, out, x: _mul(t, _mul(rsqrt_p.bind(_sub(x, _one(x))), rsqrt_p.bind(_add(x, _one(x))))))
ad.defjvp(atanh_p, lambda t, out, x: _mul(_unary(Ops.RECIP, _add(_one(x), x)), _fdiv(t, _sub(_one(x), x))))
ad.defjvp(logistic_p, lambda t, out, x: _mul(t, _mul(out, _sub(_one(out), out))))
ad.defjvp(sqrt_p, lambda t, out, x: _mul(t, _fdiv(_c(x, 0.5), out)))
ad.defjvp(rsqrt_p, lambda t, out, x: _mul(t, _mul(_c(x, -0.5), _fdiv(out, x))))
ad.defjvp(cbrt_p, lambda t, out, x: _mul(t, _mul(_c(x, 1 / 3), integer_pow_p.bind(out, y=-2))))
ad.defjvp(pow_p, lambda t, out, x, y: _mul(t, _mul(y, pow_p.bind(x, _sub(y, _one(y))))),
          lambda t, out, x, y: _mul(t, _mul(log_p.bind(_replace_zero(x)), out)))


# batching: every elementwise primitive stays one primitive under vmap (so grad(vmap(f)) sees its JVP rule)
batching.defelementwise(
  abs_p, acos_p, acosh_p, asin_p, asinh_p, atan2_p, atan_p, atanh_p, cbrt_p, ceil_p, cos_p, cosh_p, exp2_p, exp_p,
  expm1_p, floor_p, integer_pow_p, is_finite_p, log1p_p, log_p, logistic_p, max_p, min_p, pow_p, rem_p, round_p,
  rsqrt_p, sign_p, sin_p, sinh_p, sqrt_p, square_p, tan_p, tanh_p)


real = _unary_op("real", COMPLEX, _real, "The real part of a complex array (a float array).")
imag = _unary_op("imag", COMPLEX, _imag, "The imaginary part of a complex array (a float array).")
conj = _unary_op("conj", COMPLEX + FLOAT, _conj, "The complex conjugate.")


def complex(x: Any, y: Any) -> Array:  # noqa: A001 (lax's name)
  """The complex array x + iy, from float32 (-> complex64) or float64 (-> complex128) arrays of one shape."""
  x, y = lax_operands("complex", x, y)
  _require("complex", x, FLOAT)
  if x.dtype not in (FLOAT32, np.dtype(np.float64)):
    raise TypeError(f"lax.complex needs float32 or float64 parts, got {x.dtype.name}")
  return _complex(x, y)
