"""Elementwise functions of tinyjax.numpy (numpy's ufuncs with JAX's promotion and weak types).

Operands are promoted to one dtype (`tinyjax.dtypes.result_type`, weak Python scalars included) and broadcast to
one shape (numpy's rules), then handed to the lax compositions; functions like `sin` or `/` first move integers to
the default float dtype (`to_inexact_dtype`).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.trace.sharding_types import check_binary
from tinyjax.lax import _elementwise as ew
from tinyjax.lax._base import (BOOL, broadcast_shapes, cast, check_int_range, expand_raw, full, host_to_array, is_array,
                               is_python_scalar, like, python_scalar, staged)
from tinyjax.trace import ad, batching
from tinyjax.trace.core import Primitive
from tinyjax.uop import Ops


# ---------------------------------------------------------------------------------------------- promotion

def _operand(x: Any, name: str) -> Any:
  if is_array(x) or is_python_scalar(x): return x
  if isinstance(x, (np.ndarray, np.generic)): return host_to_array(x)
  raise TypeError(f"{name} requires ndarray or scalar arguments, got {type(x).__name__} (lists and tuples must be "
                  "converted with tinyjax.numpy.asarray first)")


def promote(name: str, *args: Any, inexact: bool = False, numeric: bool = False, broadcast: bool = True
            ) -> list[Array]:
  """Arrays of one dtype and weak type (JAX's promotion of `args`, weak scalars included) broadcast to one shape
  (kept in their own shapes without `broadcast`).

  Every operand gets the result's weak type, so a weak result stays weak through the operation (`i32 * 1.5` is a
  weak float32, and adding it to a bfloat16 array gives bfloat16). With `inexact`, integer and bool results move to
  the default float dtype (as `true_divide`, `sin`, ...); with `numeric`, bools move to the default int dtype (as
  `square`, `floor_divide`, `power`). A single operand without either is taken as it is."""
  if len(args) == 1 and type(args[0]) is Array:  # (eager code's common case: an array already in a fitting dtype)
    kind = _kind(args[0].dtype)
    if not (inexact and kind not in "fc" or numeric and kind == "b"): return [args[0]]
  operands = [_operand(x, name) for x in args]
  if len(operands) == 1 and not (inexact or numeric):
    (x,) = operands
    return [x if is_array(x) else python_scalar(x, dtypes.python_scalar_dtype(x), type(x) is not bool)]
  dtype, weak = dtypes.result_type(*operands, return_weak_type_flag=True)
  if inexact: dtype = dtypes.to_inexact_dtype(dtype)
  if numeric and dtype == BOOL: dtype = dtypes.default_int_dtype()
  arrays = [python_scalar(x, dtype, weak) if is_python_scalar(x) else cast(x, dtype, weak) for x in operands]
  if not broadcast: return arrays
  shape = broadcast_shapes(name, *(x.shape for x in arrays))
  return [expand_raw(x, shape) for x in arrays]


def as_array(x: Any, name: str = "function") -> Array:
  """One operand as an Array (Python scalars weakly typed)."""
  (array,) = promote(name, x)
  return array


# ---------------------------------------------------------------------------------------------- helpers

def _all_weak(*args: Any) -> bool: return all(dtypes.is_weakly_typed(x) for x in args)
def _never_weak(*args: Any) -> bool: return False


# dtype kinds a ufunc accepts: float, int, uint, bool by default; the ones defined for complex numbers take all
ALL_KINDS = "fiubc"


def _same_dtype_operands(x1: Any, x2: Any, inexact: bool, numeric: bool) -> tuple[Array, Array] | None:
  """`promote`'s result where it needs no promotion lattice: two arrays of one shape, dtype and weak type, or an
  array and a Python int / float its dtype already holds (an inexact array, or an integer array and an int), the
  scalar broadcast as a constant. None otherwise (the general path). (Eager code's common case: `x * 2.0 + 1`.)"""
  first, second = type(x1), type(x2)
  if first is Array or isinstance(x1, Array):
    array, other, scalar_first = x1, x2, False
  elif second is Array or isinstance(x2, Array):
    array, other, scalar_first = x2, x1, True
  else:
    return None
  dtype = array.dtype
  kind = "f" if dtype in _INEXACT_REAL else dtype.kind
  if kind == "b" or (inexact and kind not in "fc"): return None
  if isinstance(other, Array):
    if other.dtype != dtype or other.weak_type != array.weak_type or other.shape != array.shape: return None
    return x1, x2
  scalar_type = type(other)
  if not (scalar_type is float and kind in "fc" or scalar_type is int and kind in "fciu"): return None
  if scalar_type is int: check_int_range(other, dtypes.default_int_dtype())  # (as JAX: also beside a float array)
  constant = full(array.shape, other, dtype, array.weak_type)
  return (constant, array) if scalar_first else (array, constant)


_INEXACT_REAL = frozenset(np.dtype(d) for d in (np.float16, dtypes.bfloat16, np.float32, np.float64))


def _binary(name: str, fn: Callable[[Array, Array], Array], doc: str, inexact: bool = False, kinds: str = "fiub",
            numeric: bool = False, weak_if: Callable[..., bool] | None = None, stage: bool = False
            ) -> Callable[[Any, Any], Array]:
  """A binary ufunc: promote (see `promote`), check the dtype kind, apply `fn`. `weak_if(x1, x2)`, for the functions
  JAX composes with strongly typed constants, says whether a weak result stays weak (e.g. only when every operand
  was weak). `stage`: `fn` is several operations, and an eager call is one node (lax/_base.py `staged`)."""
  def ufunc(x1: Any, x2: Any, /) -> Array:
    operands = _same_dtype_operands(x1, x2, inexact, numeric)
    a, b = operands if operands is not None else promote(name, x1, x2, inexact=inexact, numeric=numeric)
    _check_kind(name, a.dtype, kinds)
    check_binary(name, a, b)
    result = fn(a, b)
    return result if weak_if is None or weak_if(x1, x2) else cast(result, result.dtype, False)
  ufunc.__name__ = ufunc.__qualname__ = name
  ufunc.__doc__ = doc
  return staged()(ufunc) if stage else ufunc


def _unary(name: str, fn: Callable[[Array], Array], doc: str, inexact: bool = False, kinds: str = "fiub",
           numeric: bool = False, weak_if: Callable[..., bool] | None = None, stage: bool = False
           ) -> Callable[[Any], Array]:
  """A unary ufunc, as `_binary`."""
  def ufunc(x: Any, /) -> Array:
    (a,) = promote(name, x, inexact=inexact, numeric=numeric)
    _check_kind(name, a.dtype, kinds)
    result = fn(a)
    return result if weak_if is None or weak_if(x) else cast(result, result.dtype, False)
  ufunc.__name__ = ufunc.__qualname__ = name
  ufunc.__doc__ = doc
  return staged()(ufunc) if stage else ufunc


def _kind(dtype: np.dtype) -> str:
  """The dtype's numpy kind, "f" for every float (bfloat16 and float8 included)."""
  kind = _KINDS.get(dtype)
  if kind is None: kind = _KINDS[dtype] = "f" if dtypes.is_floating(dtype) else dtype.kind
  return kind


def _check_kind(name: str, dtype: np.dtype, kinds: str) -> None:
  kind = _kind(dtype)
  if kind not in kinds:
    if kind == "c": raise TypeError(f"{name} does not accept dtype {dtype.name}: it is not defined for complex numbers")
    raise TypeError(f"{name} does not support dtype {dtype.name}")


_KINDS: dict[np.dtype, str] = {}  # dtype -> "f" for every float (bfloat16, float8 included), else its numpy kind


def _is_float(x: Array) -> bool: return dtypes.is_floating(x.dtype)


# ---------------------------------------------------------------------------------------------- arithmetic

def _add(a: Array, b: Array) -> Array: return ew._or(a, b) if a.dtype == BOOL else ew._add(a, b)
def _multiply(a: Array, b: Array) -> Array: return ew._and(a, b) if a.dtype == BOOL else ew._mul(a, b)


def _subtract(a: Array, b: Array) -> Array:
  if a.dtype == BOOL: raise TypeError("subtract: numpy boolean subtract is not supported, use logical_xor")
  return ew.sub_p.bind(a, b)


def _floor_divide(a: Array, b: Array) -> Array:
  if _is_float(a): return _float_floor_divide_p.bind(a, b)
  quotient = ew._binary(Ops.IDIV, a, b)  # x // 0 is -1 (all ones unsigned), as XLA
  if a.dtype.kind == "u": return quotient
  remainder = ew._binary(Ops.MOD, a, b)
  adjust = ew._and(ew._compare(Ops.CMPNE, remainder, like(a, 0)), ew._compare(Ops.CMPNE, ew._sign(a), ew._sign(b)))
  return ew._where(adjust, ew._sub(quotient, like(a, 1)), quotient)


def _float_divmod(x: Array, y: Array) -> tuple[Array, Array]:
  """numpy's float floor_divide and remainder (sign of the divisor), from C fmod as numpy computes them."""
  mod = ew._binary(Ops.MOD, x, y)
  div = ew._fdiv(ew._sub(x, mod), y)
  fix = ew._and(ew._compare(Ops.CMPNE, mod, like(x, 0)), ew._compare(Ops.CMPNE, ew._signbit(y), ew._signbit(mod)))
  mod = ew._where(fix, ew._add(mod, y), mod)
  div = ew._where(fix, ew._sub(div, like(x, 1)), div)
  mod = ew._where(ew._eq(mod, like(x, 0)), ew._copysign(like(x, 0), y), mod)
  floor_div = ew._floor(div)
  floor_div = ew._where(ew._lt(like(x, 0.5), ew._sub(div, floor_div)), ew._add(floor_div, like(x, 1)), floor_div)
  floor_div = ew._where(ew._eq(div, like(x, 0)), ew._copysign(like(x, 0), ew._fdiv(x, y)), floor_div)
  return ew._where(ew._eq(y, like(y, 0)), ew._fdiv(x, y), floor_div), mod


# float floor_divide is piecewise constant: its derivative is 0 everywhere, y == 0 included, as JAX's
_float_floor_divide_p = Primitive("floor_divide", ew._in_float32(lambda x, y: _float_divmod(x, y)[0]))
ad.defjvp_zero(_float_floor_divide_p)

# float remainder has JAX's derivative everywhere, exact multiples included (where the value is a signed zero):
# d/dx = 1, d/dy = -floor(x / y)
_float_remainder_p = Primitive("remainder", lambda a, b: _float_divmod(a, b)[1])
ad.defjvp(_float_remainder_p, lambda t, out, x, y: t,
          lambda t, out, x, y: ew._mul(ew._neg(t), ew.floor_p.bind(ew._fdiv(x, y))))


def _nonzero_divisor(b: Array) -> Array:
  """An integer divisor with zeros replaced by ones: integer `remainder` and `fmod` by zero are 0, as JAX."""
  return ew._where(ew._eq(b, like(b, 0)), like(b, 1), b)


def _log_add_exp(base_two: bool) -> Callable[[Array, Array], Array]:
  """log(e**x + e**y) (or log2(2**x + 2**y)) without overflow: max(x, y) + log1p(e**-|x - y|); x + y where x - y is
  NaN (equal infinities, NaN inputs). Complex: m + log1p(e**(x + y - 2m)) with m the lexicographic maximum, its
  imaginary part wrapped into [-pi, pi] (in units of ln 2 for base two), as JAX."""
  def compute(x: Array, y: Array) -> Array:
    if dtypes.is_complex(x.dtype): return _complex_log_add_exp(x, y, base_two)
    larger, delta = ew._max(x, y), ew._sub(x, y)
    smaller_part = ew._neg(ew._abs_float(delta))
    if base_two: correction = ew._mul(ew._log1p(ew._unary(Ops.EXP2, smaller_part)), like(x, 1 / math.log(2)))
    else: correction = ew._log1p(ew._exp(smaller_part))
    return ew._where(ew._isnan(delta), ew._add(x, y), ew._add(larger, correction))
  return ew._in_float32(compute)


def _complex_log_add_exp(x: Array, y: Array, base_two: bool) -> Array:
  larger = ew._max(x, y)
  delta = ew._sub(ew._add(x, y), ew._mul(larger, like(larger, 2)))
  if base_two: sum_ = ew._add(larger, ew._mul(ew._log1p(ew.exp2_p.bind(delta)), like(delta, 1 / math.log(2))))
  else: sum_ = ew._add(larger, ew._log1p(ew._exp(delta)))
  half_turn = math.pi / math.log(2) if base_two else math.pi
  angle = ew._add(ew._imag(sum_), like(ew._imag(sum_), half_turn))
  turns = ew._rem(angle, like(angle, 2 * half_turn))
  turns = ew._where(ew._lt(turns, like(turns, 0)), ew._add(turns, like(turns, 2 * half_turn)), turns)
  return ew._complex(ew._real(sum_), ew._sub(turns, like(turns, half_turn)))


# JVP rules as JAX's: d/dx = e**(x - out) (2**(x - out) for base two), so ties and large gaps are exact
_logaddexp_p = Primitive("logaddexp", _log_add_exp(False))
_logaddexp2_p = Primitive("logaddexp2", _log_add_exp(True))
ad.defjvp(_logaddexp_p, lambda t, out, x, y: ew._mul(t, ew.exp_p.bind(ew._sub(x, out))),
          lambda t, out, x, y: ew._mul(t, ew.exp_p.bind(ew._sub(y, out))))
ad.defjvp(_logaddexp2_p, lambda t, out, x, y: ew._mul(t, ew.exp2_p.bind(ew._sub(x, out))),
          lambda t, out, x, y: ew._mul(t, ew.exp2_p.bind(ew._sub(y, out))))


def _remainder(a: Array, b: Array) -> Array:
  if _is_float(a): return _float_remainder_p.bind(a, b)
  b = _nonzero_divisor(b)
  remainder = ew._binary(Ops.MOD, a, b)
  if a.dtype.kind == "u": return remainder
  fix = ew._and(ew._compare(Ops.CMPNE, remainder, like(a, 0)),
                ew._compare(Ops.CMPNE, ew._lt(remainder, like(a, 0)), ew._lt(b, like(b, 0))))
  return ew._where(fix, ew._add(remainder, b), remainder)


def _fmod(a: Array, b: Array) -> Array:
  return ew._binary(Ops.MOD, a, b if _is_float(a) else _nonzero_divisor(b))


def power(x1: Any, x2: Any, /) -> Array:
  """Elementwise x1 ** x2 with promotion (bools count as ints). A static integer exponent (a Python or numpy int)
  uses repeated multiplication in x1's dtype (as JAX's integer_pow); integer arrays use exact binary exponentiation;
  floats use pow."""
  if isinstance(x2, (int, np.integer)) and not is_array(x2):
    (a,) = promote("power", x1, numeric=True)
    if x2 < 0 and not dtypes.is_inexact(a.dtype):
      raise TypeError(f"Integers cannot be raised to negative powers, got integer_pow({a.dtype.name}{list(a.shape)}, "
                      f"{int(x2)})")
    return ew.integer_pow(a, int(x2))
  a, b = promote("power", x1, x2, numeric=True)
  integer_exponent = dtypes.dtype(x2).kind in "iu"
  if dtypes.is_complex(a.dtype):  # exp(b log a), the principal branch; 0 ** b is 1 for b == 0, else 0 where b's
    at_zero = ew._eq(a, like(a, 0))  # real part is positive, else NaN (numpy's values)
    safe = ew._where(at_zero, like(a, 1), a)
    value = ew._exp(ew._mul(b, ew._log(safe)))
    of_zero = ew._where(ew._lt(like(ew._real(b), 0), ew._real(b)), like(a, 0), like(a, complex(math.nan, math.nan)))
    return ew._where(at_zero, ew._where(ew._eq(b, like(b, 0)), like(a, 1), of_zero), value)
  if not _is_float(a): result = ew.integer_power_array(a, b)
  elif integer_exponent:  # x**0 is 1 with derivative 0 (also at x == 0, where y * x**(y-1) is NaN), as JAX
    is_zero = ew._eq(b, like(b, 0))
    result = ew._where(is_zero, like(a, 1), ew.pow_p.bind(a, ew._where(is_zero, like(b, 1), b)))
  else: result = ew.pow_p.bind(a, b)
  # as JAX's weak types: an integer result, or an integer exponent array, is weak only if both operands are weak
  if _all_weak(x1, x2) or (_is_float(a) and not integer_exponent): return result
  return cast(result, result.dtype, False)


def _true_divide(a: Array, b: Array) -> Array: return ew._fdiv(a, b)


def _negative(a: Array) -> Array:
  if a.dtype == BOOL: raise TypeError("negative: the numpy boolean negative, the `-` operator, is not supported, use "
                                      "the `~` operator or the logical_not function instead")
  return ew._neg(a)


def _fmax(a: Array, b: Array) -> Array:
  if not dtypes.is_inexact(a.dtype): return ew.max_p.bind(a, b)
  return ew._where(_isnan(a), b, ew._where(_isnan(b), a, ew.max_p.bind(a, b)))


def _fmin(a: Array, b: Array) -> Array:
  if not dtypes.is_inexact(a.dtype): return ew.min_p.bind(a, b)
  return ew._where(_isnan(a), b, ew._where(_isnan(b), a, ew.min_p.bind(a, b)))


def _maximum(a: Array, b: Array) -> Array: return ew._or(a, b) if a.dtype == BOOL else ew.max_p.bind(a, b)
def _minimum(a: Array, b: Array) -> Array: return ew._and(a, b) if a.dtype == BOOL else ew.min_p.bind(a, b)


def _hypot(a: Array, b: Array) -> Array:
  def compute(x: Array, y: Array) -> Array:  # differentiable: abs, max, min and sqrt are the primitives
    x, y = ew.abs_p.bind(x), ew.abs_p.bind(y)
    larger, smaller = ew.max_p.bind(x, y), ew.min_p.bind(x, y)
    ratio = ew._fdiv(smaller, ew._where(ew._eq(larger, like(x, 0)), like(x, 1), larger))
    result = ew._mul(larger, ew.sqrt_p.bind(ew._add(like(x, 1), ew._mul(ratio, ratio))))
    is_inf = ew._or(ew._eq(x, like(x, math.inf)), ew._eq(y, like(y, math.inf)))
    return ew._where(is_inf, like(x, math.inf), result)
  return ew._in_float32(compute)(a, b)


def _heaviside(a: Array, b: Array) -> Array:
  zero = like(a, 0)
  result = ew._where(ew._lt(a, zero), zero, ew._where(ew._lt(zero, a), like(a, 1), b))
  return ew._where(ew._isnan(a), a, result) if _is_float(a) else result


def _copysign(a: Array, b: Array) -> Array:
  """|a| with the sign of b, as JAX: where(signbit(b), -abs(a), abs(a)) (so its derivative is abs's)."""
  magnitude = ew.abs_p.bind(a)
  return ew._where(ew._signbit(b), ew._neg(magnitude), magnitude)


def _float_only(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
  return ew._in_float32(fn)


def _by_parts(fn: Callable[[Array], Array], a: Array) -> Array:
  """fn of a float array; of a complex one, fn of each part."""
  if not dtypes.is_complex(a.dtype): return fn(a)
  return ew._complex(fn(ew._real(a)), fn(ew._imag(a)))


def _log_base(a: Array, base: int) -> Array:
  """log2 / log10: LOG2 for floats (scaled for base 10); log(z) / ln(base) for complex z, part by part (log(0) is
  -inf + 0j: a complex product by 1 / ln(base) would make its 0 a NaN)."""
  if dtypes.is_complex(a.dtype):
    return _by_parts(lambda part: ew._mul(part, like(part, 1 / math.log(base))), ew.log_p.bind(a))
  log2 = ew._unary(Ops.LOG2, a)
  return log2 if base == 2 else ew._mul(log2, like(a, math.log10(2)))


def _arctan2(y: Array, x: Array) -> Array:
  """atan2(y, x); of complex numbers, -i log((x + iy) / sqrt(x^2 + y^2)) (JAX's extension: the angle of (x, y))."""
  if not dtypes.is_complex(y.dtype): return ew.atan2_p.bind(y, x)
  i = like(x, 1j)
  ratio = ew._fdiv(ew._add(x, ew._mul(i, y)), ew.sqrt_p.bind(ew._add(ew._mul(x, x), ew._mul(y, y))))
  return ew._mul(ew._neg(i), ew.log_p.bind(ratio))


def _integer_identity(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
  """floor/ceil/trunc/round of integers and bools are the values themselves, as JAX."""
  return lambda a: a if not _is_float(a) else fn(a)


def _isnan(a: Array) -> Array:
  if dtypes.is_complex(a.dtype): return ew._or(_isnan(ew._real(a)), _isnan(ew._imag(a)))
  return ew._isnan(a) if _is_float(a) else like(a, False, BOOL)


def _isinf(a: Array) -> Array:
  if dtypes.is_complex(a.dtype): return ew._or(_isinf(ew._real(a)), _isinf(ew._imag(a)))
  return ew._eq(ew._abs_float(a), like(a, math.inf)) if _is_float(a) else like(a, False, BOOL)


def _isfinite(a: Array) -> Array:
  if dtypes.is_complex(a.dtype): return ew._and(_isfinite(ew._real(a)), _isfinite(ew._imag(a)))
  return ew._is_finite(a) if _is_float(a) else like(a, True, BOOL)


def _logical(fn: Callable[[Array, Array], Array]) -> Callable[[Array, Array], Array]:
  return lambda a, b: fn(cast(a, BOOL, False), cast(b, BOOL, False))


def _bitwise_not(a: Array) -> Array:
  return ew._not(a)


add = _binary("add", _add, "Elementwise x1 + x2 (bools: logical or), with promotion and broadcasting.", kinds=ALL_KINDS)
subtract = _binary("subtract", _subtract, "Elementwise x1 - x2, with promotion and broadcasting.", kinds=ALL_KINDS)
multiply = _binary("multiply", _multiply, "Elementwise x1 * x2 (bools: logical and).", kinds=ALL_KINDS)
divide = _binary("divide", _true_divide, "Elementwise x1 / x2 in floating point (ints -> default float).", True,
                 kinds=ALL_KINDS)
true_divide = divide
floor_divide = _binary("floor_divide", _floor_divide, "Elementwise floor(x1 / x2) with numpy's sign rules (bools "
                       "count as ints).", numeric=True)
remainder = _binary("remainder", _remainder, "Elementwise remainder with the sign of the divisor (numpy's %; bools "
                    "count as ints).", numeric=True)
mod = remainder
fmod = _binary("fmod", _fmod, "Elementwise C fmod: remainder with the sign of the dividend.", numeric=True)
# (complex numbers are ordered lexicographically, by real part and then imaginary part, as JAX and numpy order them)
maximum = _binary("maximum", _maximum, "Elementwise maximum; NaN propagates.", kinds=ALL_KINDS)
minimum = _binary("minimum", _minimum, "Elementwise minimum; NaN propagates.", kinds=ALL_KINDS)
fmax = _binary("fmax", _fmax, "Elementwise maximum ignoring NaN (NaN only if both are NaN).", kinds=ALL_KINDS,
               stage=True)
fmin = _binary("fmin", _fmin, "Elementwise minimum ignoring NaN (NaN only if both are NaN).", kinds=ALL_KINDS,
               stage=True)
arctan2 = _binary("arctan2", _arctan2, "Elementwise atan2(x1, x2) (angle of (x2, x1)).", True, "fc")
nextafter = _binary("nextafter", ew._nextafter, "Elementwise next float after x1 in the direction of x2.", True, "f",
                    stage=True)
hypot = _binary("hypot", _hypot, "Elementwise sqrt(x1**2 + x2**2) without undue overflow.", True, "f",
                weak_if=lambda x1, x2: np.ndim(x1) == np.ndim(x2) == 0, stage=True)  # JAX: weak only for scalars
copysign = _binary("copysign", _copysign, "Elementwise |x1| with the sign of x2 (floats).", True, "f", stage=True)
heaviside = _binary("heaviside", _heaviside, "Elementwise step: 0 for x1 < 0, x2 for x1 == 0, 1 for x1 > 0 (ints "
                    "-> default float).", True,
                    weak_if=lambda x1, x2: np.ndim(x1) == 0, stage=True)  # JAX: weak only for a scalar x1

logaddexp = _binary("logaddexp", _logaddexp_p.bind, "Elementwise log(exp(x1) + exp(x2)), without overflow.", True,
                    "fc")
logaddexp2 = _binary("logaddexp2", _logaddexp2_p.bind, "Elementwise log2(2**x1 + 2**x2), without overflow.", True,
                     "fc")

negative = _unary("negative", _negative, "Elementwise -x.", kinds=ALL_KINDS)
positive = _unary("positive", lambda a: a, "Elementwise +x (the input, promoted).", kinds=ALL_KINDS)
absolute = _unary("absolute", lambda a: a if a.dtype == BOOL else ew.abs(a), "Elementwise |x| (a complex x's modulus).",
                   kinds=ALL_KINDS)
abs = absolute  # noqa: A001
fabs = _unary("fabs", ew.abs_p.bind, "Elementwise |x| in floating point (ints -> default float).", True)
sign = _unary("sign", ew.sign_p.bind, "Elementwise sign: -1, 0, 1 (NaN for NaN; z / |z| for complex z); not for "
              "bools.", kinds="fiuc")
reciprocal = _unary("reciprocal", lambda a: ew._unary(Ops.RECIP, a), "Elementwise 1 / x (ints -> default float).",
                    True, kinds=ALL_KINDS)
square = _unary("square", ew.square_p.bind, "Elementwise x * x (bools count as ints).", numeric=True, kinds=ALL_KINDS)
sqrt = _unary("sqrt", ew.sqrt_p.bind, "Elementwise square root (ints -> default float).", True, kinds=ALL_KINDS)
cbrt = _unary("cbrt", ew.cbrt_p.bind, "Elementwise real cube root.", True)
exp = _unary("exp", ew.exp_p.bind, "Elementwise e**x.", True, kinds=ALL_KINDS)
exp2 = _unary("exp2", ew.exp2_p.bind, "Elementwise 2**x.", True, kinds=ALL_KINDS)
expm1 = _unary("expm1", ew.expm1_p.bind, "Elementwise e**x - 1, accurate for small x.", True, kinds=ALL_KINDS)
log = _unary("log", ew.log_p.bind, "Elementwise natural logarithm.", True, kinds=ALL_KINDS)
log2 = _unary("log2", _float_only(lambda a: _log_base(a, 2)), "Elementwise base-2 logarithm.", True,
              weak_if=_never_weak, kinds=ALL_KINDS)
log10 = _unary("log10", _float_only(lambda a: _log_base(a, 10)), "Elementwise base-10 logarithm.", True,
               weak_if=_never_weak, kinds=ALL_KINDS, stage=True)
log1p = _unary("log1p", ew.log1p_p.bind, "Elementwise log(1 + x), accurate for small x.", True, kinds=ALL_KINDS)
sin = _unary("sin", ew.sin_p.bind, "Elementwise sine.", True, kinds=ALL_KINDS)
cos = _unary("cos", ew.cos_p.bind, "Elementwise cosine.", True, kinds=ALL_KINDS)
tan = _unary("tan", ew.tan_p.bind, "Elementwise tangent.", True, kinds=ALL_KINDS)
arcsin = _unary("arcsin", ew.asin_p.bind, "Elementwise inverse sine.", True, kinds=ALL_KINDS)
arccos = _unary("arccos", ew.acos_p.bind, "Elementwise inverse cosine.", True, kinds=ALL_KINDS)
arctan = _unary("arctan", ew.atan_p.bind, "Elementwise inverse tangent.", True, kinds=ALL_KINDS)
sinh = _unary("sinh", ew.sinh_p.bind, "Elementwise hyperbolic sine.", True, kinds=ALL_KINDS)
cosh = _unary("cosh", ew.cosh_p.bind, "Elementwise hyperbolic cosine.", True, kinds=ALL_KINDS)
tanh = _unary("tanh", ew.tanh_p.bind, "Elementwise hyperbolic tangent.", True, kinds=ALL_KINDS)
arcsinh = _unary("arcsinh", ew.asinh_p.bind, "Elementwise inverse hyperbolic sine.", True, kinds=ALL_KINDS)
arccosh = _unary("arccosh", ew.acosh_p.bind, "Elementwise inverse hyperbolic cosine.", True, kinds=ALL_KINDS)
arctanh = _unary("arctanh", ew.atanh_p.bind, "Elementwise inverse hyperbolic tangent.", True, kinds=ALL_KINDS)
floor = _unary("floor", _integer_identity(ew.floor_p.bind), "Elementwise floor (integers unchanged).")
ceil = _unary("ceil", _integer_identity(ew.ceil_p.bind), "Elementwise ceiling (integers unchanged).")
trunc = _unary("trunc", _integer_identity(ew._trunc), "Elementwise rounding toward zero (integers unchanged).")
rint = _unary("rint", lambda a: _by_parts(ew._round_half_even, a) if dtypes.is_inexact(a.dtype) else
              cast(a, dtypes.default_float_dtype(), False),
              "Elementwise rounding to the nearest integer, ties to even (ints -> a strongly typed default float; "
              "complex: each part).", kinds=ALL_KINDS, stage=True)
deg2rad = _unary("deg2rad", lambda a: ew._mul(a, like(a, math.pi / 180)), "Degrees to radians.", True,
                 kinds=ALL_KINDS)
rad2deg = _unary("rad2deg", lambda a: ew._mul(a, like(a, 180 / math.pi)), "Radians to degrees.", True,
                 kinds=ALL_KINDS)
radians, degrees = deg2rad, rad2deg
signbit = _unary("signbit", ew._signbit, "Elementwise test of the sign bit (True for -0.0; bool result).", stage=True)
isnan = _unary("isnan", _isnan, "Elementwise test for NaN (bool).", kinds=ALL_KINDS)
isinf = _unary("isinf", _isinf, "Elementwise test for +-inf (bool).", kinds=ALL_KINDS, stage=True)
isfinite = _unary("isfinite", _isfinite, "Elementwise test for finite values (bool).", kinds=ALL_KINDS, stage=True)

equal = _binary("equal", ew.eq_p.bind, "Elementwise x1 == x2 (bool).", kinds=ALL_KINDS)
not_equal = _binary("not_equal", lambda a, b: ew._compare(Ops.CMPNE, a, b), "Elementwise x1 != x2 (bool).",
                    kinds=ALL_KINDS)
# (complex numbers compare lexicographically: by real part, then by imaginary part, as in JAX and numpy)
less = _binary("less", ew._lt, "Elementwise x1 < x2 (bool).", kinds=ALL_KINDS)
less_equal = _binary("less_equal", ew.le_p.bind, "Elementwise x1 <= x2 (bool).", kinds=ALL_KINDS)
greater = _binary("greater", ew.gt_p.bind, "Elementwise x1 > x2 (bool).", kinds=ALL_KINDS)
greater_equal = _binary("greater_equal", ew.ge_p.bind, "Elementwise x1 >= x2 (bool).", kinds=ALL_KINDS)

logical_and = _binary("logical_and", _logical(ew._and), "Elementwise truth of x1 and x2 (bool).", kinds=ALL_KINDS,
                      stage=True)
logical_or = _binary("logical_or", _logical(ew._or), "Elementwise truth of x1 or x2 (bool).", kinds=ALL_KINDS,
                     stage=True)
logical_xor = _binary("logical_xor", _logical(lambda a, b: ew._binary(Ops.XOR, a, b)),
                      "Elementwise truth of x1 xor x2 (bool).", kinds=ALL_KINDS, stage=True)
logical_not = _unary("logical_not", lambda a: ew._not(cast(a, BOOL, False)), "Elementwise not x (bool).",
                     kinds=ALL_KINDS, stage=True)

bitwise_and = _binary("bitwise_and", ew._and, "Elementwise x1 & x2 (integers and bools).", kinds="iub")
bitwise_or = _binary("bitwise_or", ew._or, "Elementwise x1 | x2 (integers and bools).", kinds="iub")
bitwise_xor = _binary("bitwise_xor", lambda a, b: ew._binary(Ops.XOR, a, b), "Elementwise x1 ^ x2.", kinds="iub")
bitwise_not = _unary("bitwise_not", _bitwise_not, "Elementwise ~x (integers and bools).", kinds="iub")
invert = bitwise_not
left_shift = _binary("left_shift", ew._shift_left, "Elementwise x1 << x2 (0 when shifted out; bools count as ints).",
                     kinds="iu", numeric=True)
right_shift = _binary("right_shift", ew._shift_right_arithmetic, "Elementwise x1 >> x2 (arithmetic for signed; bools "
                      "count as ints).", kinds="iu", numeric=True)


@staged(static_argnames=("decimals",))
def round(a: Any, decimals: int = 0, out: None = None) -> Array:  # noqa: A001
  """Round to `decimals` decimal places, ties to even (as numpy); same dtype. Integers with decimals >= 0 are
  unchanged; negative decimals round to multiples of 10**-decimals."""
  if out is not None: raise NotImplementedError("round: the out argument is not supported (arrays are immutable)")
  (x,) = promote("round", a)
  decimals = int(decimals)
  if dtypes.is_complex(x.dtype): return _by_parts(lambda part: _round_float(part, decimals), x)
  if not _is_float(x):
    if decimals >= 0: return x
    as_float = cast(x, dtypes.default_float_dtype(), weak_type=False)
    return cast(_round_float(as_float, decimals), x.dtype, weak_type=x.weak_type)
  return ew._in_float32(lambda v: _round_float(v, decimals))(x)


def _round_float(x: Array, decimals: int) -> Array:
  if decimals == 0: return ew._round_half_even(x)
  factor = like(x, 10.0 ** (decimals if decimals > 0 else -decimals))
  if decimals > 0: return ew._fdiv(ew._round_half_even(ew._mul(x, factor)), factor)
  return ew._mul(ew._round_half_even(ew._fdiv(x, factor)), factor)


around = round


@staged()
def clip(arr: Any = None, /, min: Any = None, max: Any = None, *, a: Any = None,  # noqa: A002
         a_min: Any = None, a_max: Any = None) -> Array:
  """Elementwise min(max(arr, min), max) with promotion (either bound may be None); NaN propagates. numpy's older
  names `a`, `a_min`, `a_max` are accepted too."""
  if arr is None: arr = a
  if arr is None: raise TypeError("clip() missing the array argument")
  low = min if min is not None else a_min
  high = max if max is not None else a_max
  (x,) = promote("clip", arr)
  if any(bound is not None and dtypes.is_complex(dtypes.dtype(bound)) for bound in (x, low, high)):
    raise ValueError("clip received a complex value (as the array or a bound): complex numbers have no natural "
                     "ordering; clip the real and imaginary parts separately (jnp.real / jnp.imag)")
  if low is not None: x = maximum(x, low)
  if high is not None: x = minimum(x, high)
  return x


@staged(static_argnames=("size", "fill_value"))
def where(condition: Any, x: Any = None, y: Any = None, /, *, size: int | None = None,
          fill_value: Any = None) -> Array:
  """Elementwise `x` where `condition` is true, else `y` (promoted and broadcast together). With only `condition`:
  `nonzero(condition, size=size, fill_value=fill_value)`."""
  if x is None and y is None:
    from tinyjax.numpy._searching import nonzero
    return nonzero(condition, size=size, fill_value=fill_value)
  if x is None or y is None: raise ValueError("Either both or neither of the x and y arguments should be provided.")
  (cond,) = promote("where", condition)
  shapes = [np.shape(v) if not is_array(v) else v.shape for v in (cond, x, y)]
  try:
    if not shapes[0] == shapes[1] == shapes[2]: np.broadcast_shapes(*shapes)
  except ValueError:  # a ValueError whatever the ranks, as JAX's where
    raise ValueError(f"Incompatible shapes for broadcasting: shapes={shapes}") from None
  a, b = _same_dtype_operands(x, y, False, False) or promote("where", x, y)
  shape = broadcast_shapes("where", cond.shape, a.shape)
  cond, a, b = (expand_raw(v, shape) for v in (cast(cond, BOOL, False), a, b))
  return ew._where(cond, a, b)


def astype(x: Any, dtype: Any, /, *, copy: bool = False, device: Any = None) -> Array:
  """The values of x converted to `dtype` (a strongly typed result; float -> int truncates, -> bool is != 0), on
  `device` when given (`device_put`). `copy` changes nothing: arrays are immutable."""
  if device is not None:
    from tinyjax.placement import device_put
    return device_put(astype(x, dtype), device)
  (a,) = promote("astype", x)
  target = dtypes.check_user_dtype_supported(dtype, "astype")
  return cast(a, target, weak_type=False)


batching.defelementwise(_float_floor_divide_p, _float_remainder_p, _logaddexp_p, _logaddexp2_p)


def swap_last(x: Array) -> Array:
  """x with its last two axes swapped (the matrix transpose of a batch)."""
  from tinyjax.lax._shape import permute_raw
  return permute_raw(x, (*range(x.ndim - 2), x.ndim - 1, x.ndim - 2))


# ---------------------------------------------------------------------------------------------- complex numbers

def real(val: Any, /) -> Array:
  """The real part (a float array; a real input is returned as it is)."""
  (a,) = promote("real", val)
  return ew._real(a)


def imag(val: Any, /) -> Array:
  """The imaginary part (a float array; zeros for a real input)."""
  (a,) = promote("imag", val)
  return ew._imag(a)


def conjugate(x: Any, /) -> Array:
  """The complex conjugate (a real input is returned as it is)."""
  (a,) = promote("conjugate", x)
  return ew._conj(a)


conj = conjugate


@staged(static_argnames=("deg",))
def angle(z: Any, deg: bool = False) -> Array:
  """The argument of each complex number, atan2(imag, real), in radians (degrees with `deg`); of a real number, 0 or
  pi (ints -> default float)."""
  (a,) = promote("angle", z, inexact=True)
  result = ew.atan2_p.bind(ew._imag(a), ew._real(a))
  return ew._mul(result, like(result, 180 / math.pi)) if deg else result


def iscomplexobj(x: Any) -> bool:
  """Whether `x`'s dtype is complex (whatever its values)."""
  return dtypes.is_complex(dtypes.result_type(x) if not hasattr(x, "dtype") else np.dtype(x.dtype))


def isrealobj(x: Any) -> bool:
  """Whether `x`'s dtype is not complex."""
  return not iscomplexobj(x)


def iscomplex(x: Any) -> Array:
  """Elementwise: a non-zero imaginary part (bool)."""
  (a,) = promote("iscomplex", x)
  if not dtypes.is_complex(a.dtype): return like(a, False, BOOL)
  return ew._compare(Ops.CMPNE, ew._imag(a), like(ew._imag(a), 0))


@staged()
def isreal(x: Any) -> Array:
  """Elementwise: a zero imaginary part (bool)."""
  return logical_not(iscomplex(x))
