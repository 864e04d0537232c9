"""Elementwise functions of tinyjax.numpy composed of the basic ufuncs: `nan_to_num`, `float_power`, `divmod`,
`copy`, `spacing`, `bitwise_count`, `isposinf`/`isneginf`, `sinc` (with JAX's derivatives at 0) and `i0` (the
modified Bessel function of order 0, Cephes' Chebyshev expansions as numpy)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import full, staged
from tinyjax.numpy import _elementwise as ew


@staged(static_argnames=("copy", "nan", "posinf", "neginf"))
def nan_to_num(x: Any, copy: bool = True, nan: Any = 0.0, posinf: Any = None, neginf: Any = None) -> Array:
  """`x` with NaN replaced by `nan`, +inf by `posinf` and -inf by `neginf` (default: the dtype's largest and most
  negative finite values); a complex `x` has its parts replaced separately. Integer and bool arrays are returned
  as they are. The shape and dtype are `x`'s (a strongly typed result for a float `x`, as JAX)."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  del copy  # arrays are immutable
  array = jnp.asarray(x)
  if not dtypes.is_inexact(array.dtype): return array
  if dtypes.is_complex(array.dtype):
    return lax.complex(nan_to_num(jnp.real(array), nan=nan, posinf=posinf, neginf=neginf),
                       nan_to_num(jnp.imag(array), nan=nan, posinf=posinf, neginf=neginf))
  info = dtypes.finfo(array.dtype)
  posinf = info.max if posinf is None else posinf
  neginf = info.min if neginf is None else neginf

  def fill(value: Any) -> Array:  # (a number: a constant, no host data, so that an eager call stages as one node)
    return full((), value, array.dtype) if isinstance(value, (int, float, np.generic)) else \
        jnp.asarray(value, dtype=array.dtype)
  out = jnp.where(jnp.isnan(array), fill(nan), array)
  out = jnp.where(isposinf(out), fill(posinf), out)
  return jnp.where(isneginf(out), fill(neginf), out)


def float_power(x1: Any, x2: Any, /) -> Array:
  """Elementwise x1 ** x2 in floating point: integer and bool operands move to the default float dtype, floats keep
  theirs (JAX promotes to the inexact result type; numpy would compute in float64)."""
  from tinyjax import numpy as jnp
  base, exponent = ew.promote("float_power", x1, x2, inexact=True)
  return jnp.power(base, exponent)


@staged(multiple_results=True)
def divmod(x1: Any, x2: Any, /) -> tuple[Array, Array]:  # noqa: A001 (numpy's name)
  """(floor_divide(x1, x2), remainder(x1, x2)) with numpy's sign rules."""
  return ew.floor_divide(x1, x2), ew.remainder(x1, x2)


def copy(a: Any, order: Any = None) -> Array:
  """`a` as an array (Arrays are immutable, so a copy is never observable; Python scalars stay weakly typed)."""
  del order
  from tinyjax import numpy as jnp
  return jnp.asarray(a)


@staged()
def spacing(x: Any, /) -> Array:
  """The distance from x to the next float away from zero (negative for negative x; the smallest subnormal at 0;
  float16 steps toward +inf, as numpy). Integers and bools move to the default float dtype."""
  from tinyjax import numpy as jnp
  (value,) = ew.promote("spacing", x, inexact=True)
  if dtypes.is_complex(value.dtype): raise ValueError("jnp.spacing is not defined for complex inputs.")
  infinity = full((), math.inf, value.dtype)  # (constants, not host data: an eager call is one node)
  if value.dtype == np.float16: return jnp.nextafter(value, infinity) - value
  step = jnp.nextafter(value, jnp.copysign(infinity, value)) - value
  smallest = full((), dtypes.finfo(value.dtype).smallest_subnormal, value.dtype)
  return jnp.where(step == 0, jnp.copysign(smallest, value), step)


def bitwise_count(x: Any, /) -> Array:
  """The number of set bits of |x| (integers and bools), as uint8."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  (value,) = ew.promote("bitwise_count", x)
  if value.dtype.kind not in "iub":
    raise TypeError(f"bitwise_count requires integer or bool arguments, got {value.dtype}")
  if value.dtype == np.bool_: return value.astype(np.uint8)
  return lax.population_count(jnp.abs(value)).astype(np.uint8)


def _is_signed_inf(name: str, x: Any, sign: float) -> Array:
  from tinyjax import numpy as jnp
  (value,) = ew.promote(name, x)
  if dtypes.is_complex(value.dtype): raise ValueError("isposinf/isneginf are not well defined for complex types")
  if not dtypes.is_floating(value.dtype): return jnp.zeros(value.shape, np.bool_)
  return value == full((), sign * math.inf, value.dtype)  # (a constant, not host data)


def isposinf(x: Any, /, out: None = None) -> Array:
  """Elementwise x == +inf (bool; all False for integers; complex raises ValueError)."""
  return _is_signed_inf("isposinf", x, 1.0)


def isneginf(x: Any, /, out: None = None) -> Array:
  """Elementwise x == -inf (bool; all False for integers; complex raises ValueError)."""
  return _is_signed_inf("isneginf", x, -1.0)


# sin(t) / t = sum_n (-1)^n t^(2n) / (2n + 1)!: near 0 the series (its first 7 terms: error below 1e-21 for |t| < 0.1)
# replaces the quotient, so that every derivative at 0 is right (JAX gets them from a custom JVP rule)
_SINC_SERIES_BOUND = 0.1
_SINC_SERIES = tuple((-1) ** n / math.factorial(2 * n + 1) for n in range(7))


@staged()
def sinc(x: Any, /) -> Array:
  """sin(pi x) / (pi x), 1 at x = 0, elementwise; its derivatives at 0 are the limits (grad(sinc)(0) is 0, the
  second derivative -pi^2 / 3), as JAX's. Integers move to the default float dtype."""
  from tinyjax import numpy as jnp
  (value,) = ew.promote("sinc", x, inexact=True)
  t = value * np.pi
  near_zero = jnp.abs(t) < _SINC_SERIES_BOUND
  safe = jnp.where(near_zero, jnp.ones_like(t), t)
  t_squared = t * t
  series = jnp.zeros_like(t)
  for coefficient in reversed(_SINC_SERIES): series = series * t_squared + coefficient
  return jnp.where(near_zero, series, jnp.sin(safe) / safe)


# Cephes' Chebyshev coefficients of exp(-x) I0(x) on [0, 8] (in x / 2 - 2) and of exp(-x) sqrt(x) I0(x) on (8, inf)
# (in 32 / x - 2), as numpy.i0
_I0_SMALL = (
  -4.41534164647933937950E-18, 3.33079451882223809783E-17, -2.43127984654795469359E-16, 1.71539128555513303061E-15,
  -1.16853328779934516808E-14, 7.67618549860493561688E-14, -4.85644678311192946090E-13, 2.95505266312963983461E-12,
  -1.72682629144155570723E-11, 9.67580903537323691224E-11, -5.18979560163526290666E-10, 2.65982372468238665035E-9,
  -1.30002500998624804212E-8, 6.04699502254191894932E-8, -2.67079385394061173391E-7, 1.11738753912010371815E-6,
  -4.41673835845875056359E-6, 1.64484480707288970893E-5, -5.75419501008210370398E-5, 1.88502885095841655729E-4,
  -5.76375574538582365885E-4, 1.63947561694133579842E-3, -4.32430999505057594430E-3, 1.05464603945949983183E-2,
  -2.37374148058994688156E-2, 4.93052842396707084878E-2, -9.49010970480476444210E-2, 1.71620901522208775349E-1,
  -3.04682672343198398683E-1, 6.76795274409476084995E-1)
_I0_LARGE = (
  -7.23318048787475395456E-18, -4.83050448594418207126E-18, 4.46562142029675999901E-17, 3.46122286769746109310E-17,
  -2.82762398051658348494E-16, -3.42548561967721913462E-16, 1.77256013305652638360E-15, 3.81168066935262242075E-15,
  -9.55484669882830764870E-15, -4.15056934728722208663E-14, 1.54008621752140982691E-14, 3.85277838274214270114E-13,
  7.18012445138366623367E-13, -1.79417853150680611778E-12, -1.32158118404477131188E-11, -3.14991652796324136454E-11,
  1.18891471078464383424E-11, 4.94060238822496958910E-10, 3.39623202570838634515E-9, 2.26666899049817806459E-8,
  2.04891858946906374183E-7, 2.89137052083475648297E-6, 6.88975834691682398426E-5, 3.36911647825569408990E-3,
  8.04490411014108831608E-1)


def _chebyshev(t: Array, coefficients: tuple[float, ...]) -> Array:
  """The Chebyshev series sum_i c_i T_i(t / 2) by Clenshaw's recurrence (Cephes' chbevl)."""
  b0, b1, b2 = t * 0 + coefficients[0], t * 0, t * 0
  for c in coefficients[1:]:
    b2, b1 = b1, b0
    b0 = t * b1 - b2 + c
  return (b0 - b2) * 0.5


@staged()
def i0(x: Any) -> Array:
  """The modified Bessel function of the first kind of order 0, elementwise (real x; integers move to the default
  float dtype). Differentiable: its derivative is I1(x), 0 at x = 0."""
  from tinyjax import numpy as jnp
  (value,) = ew.promote("i0", x, inexact=True)
  if dtypes.is_complex(value.dtype): raise TypeError("i0 does not support complex-valued inputs.")
  magnitude = jnp.where(value == 0, value * 0, jnp.abs(value))  # (so that the derivative at 0 is exactly 0)
  small = magnitude <= 8.0
  safe_large = jnp.where(small, jnp.full_like(magnitude, 8.0), magnitude)
  scaled = jnp.where(small, _chebyshev(magnitude / 2.0 - 2.0, _I0_SMALL),
                     _chebyshev(32.0 / safe_large - 2.0, _I0_LARGE) / jnp.sqrt(safe_large))
  return jnp.exp(magnitude) * scaled

