"""tinyjax.scipy.special: erf, erfc, erfinv, logsumexp, expit, logit, xlogy, xlog1py, entr, gammaln, digamma, ndtr,
ndtri, log_ndtr, as jax.scipy.special.

`gammaln` is the Lanczos approximation (g = 7, 9 terms; relative error ~1e-15) with the reflection formula below 1/2,
`digamma` the asymptotic series after shifting the argument above 6 (and reflection below 1/2); both compute in
float64 and round to the input's float dtype.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyjax import dtypes, lax
from tinyjax import numpy as jnp
from tinyjax.array import Array
from tinyjax.lax import erf as _lax_erf, erf_inv as _lax_erf_inv, erfc as _lax_erfc
from tinyjax.lax._base import cast, full, like, staged
from tinyjax.nn.functions import logsumexp, sigmoid

_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
            12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7)


def _float(x: Any) -> Array:
  array = jnp.asarray(x)
  return array if dtypes.is_floating(array.dtype) else cast(array, dtypes.default_float_dtype(), False)


def _in_float64(fn):
  def wrapped(x: Any) -> Array:
    array = _float(x)
    return cast(fn(cast(array, np.float64, False)), array.dtype, array.weak_type)
  wrapped.__name__ = wrapped.__qualname__ = fn.__name__.strip("_").removesuffix("64")  # (_gammaln64: gammaln)
  return staged()(wrapped)


def erf(x: Any) -> Array:
  """The error function."""
  return _lax_erf(_float(x))


def erfc(x: Any) -> Array:
  """The complementary error function 1 - erf(x), accurate in its tail."""
  return _lax_erfc(_float(x))


def erfinv(x: Any) -> Array:
  """The inverse error function."""
  return _lax_erf_inv(_float(x))


def expit(x: Any) -> Array:
  """The logistic sigmoid 1 / (1 + exp(-x))."""
  return sigmoid(x)


@staged()
def logit(x: Any) -> Array:
  """log(x / (1 - x))."""
  x = _float(x)
  return jnp.log(x / (1 - x))


@staged()
def xlogy(x: Any, y: Any) -> Array:
  """x * log(y), 0 where x == 0 (also for y == 0)."""
  x, y = jnp.asarray(x), jnp.asarray(y)
  x, y = (_float(v) for v in jnp.broadcast_arrays(*(v.astype(jnp.result_type(x, y, 1.0)) for v in (x, y))))
  safe_y = jnp.where(x == 0, 1.0, y)
  return jnp.where(x == 0, 0.0, x * jnp.log(safe_y))


@staged()
def xlog1py(x: Any, y: Any) -> Array:
  """x * log1p(y), 0 where x == 0."""
  x, y = jnp.asarray(x), jnp.asarray(y)
  x, y = (_float(v) for v in jnp.broadcast_arrays(*(v.astype(jnp.result_type(x, y, 1.0)) for v in (x, y))))
  safe_y = jnp.where(x == 0, 0.0, y)
  return jnp.where(x == 0, 0.0, x * jnp.log1p(safe_y))


@staged()
def entr(x: Any) -> Array:
  """-x log(x) for x > 0, 0 at 0, -inf below."""
  x = _float(x)
  safe = jnp.where(x > 0, x, 1.0)
  return jnp.where(x > 0, -x * jnp.log(safe), jnp.where(x == 0, 0.0, -jnp.inf))


# In float64 with lax (no promotion, so the computation stays float64 whatever jax_enable_x64 says)
def _c(x: Array, value: float) -> Array: return like(x, value)


def _lgamma_positive(x: Array) -> Array:
  """log Gamma(x) for x >= 1/2 (Lanczos)."""
  z = lax.sub(x, _c(x, 1.0))
  total = _c(x, _LANCZOS[0])
  for k, coefficient in enumerate(_LANCZOS[1:], start=1):
    total = lax.add(total, lax.div(_c(x, coefficient), lax.add(z, _c(x, k))))
  t = lax.add(z, _c(x, _LANCZOS_G + 0.5))
  return lax.add(lax.sub(lax.add(_c(x, 0.5 * math.log(2 * math.pi)), lax.mul(lax.add(z, _c(x, 0.5)), lax.log(t))), t),
                 lax.log(total))


def _is_pole(x: Array) -> Array: return lax.bitwise_and(lax.le(x, _c(x, 0.0)), lax.eq(x, lax.floor(x)))


def _gammaln64(x: Array) -> Array:
  small = lax.lt(x, _c(x, 0.5))
  value = _lgamma_positive(lax.select(small, lax.sub(_c(x, 1.0), x), x))
  sine = lax.abs(lax.sin(lax.mul(_c(x, math.pi), x)))
  reflection = lax.sub(lax.sub(_c(x, math.log(math.pi)), lax.log(lax.select(small, sine, _c(x, 1.0)))), value)
  return lax.select(_is_pole(x), _c(x, math.inf), lax.select(small, reflection, value))


def _digamma64(x: Array) -> Array:
  small = lax.lt(x, _c(x, 0.5))
  z = lax.select(small, lax.sub(_c(x, 1.0), x), x)
  shift = _c(x, 0.0)
  for _ in range(6):  # psi(z) = psi(z + 1) - 1/z until z >= 6
    below = lax.lt(z, _c(x, 6.0))
    shift = lax.sub(shift, lax.select(below, lax.div(_c(x, 1.0), z), _c(x, 0.0)))
    z = lax.select(below, lax.add(z, _c(x, 1.0)), z)
  inverse = lax.div(_c(x, 1.0), z)
  inverse2 = lax.mul(inverse, inverse)
  series = _c(x, 1 / 132)
  for coefficient in (1 / 240, 1 / 252, 1 / 120, 1 / 12):  # Bernoulli-number terms, innermost first
    series = lax.sub(_c(x, coefficient), lax.mul(inverse2, series))
  value = lax.add(lax.sub(lax.sub(lax.log(z), lax.mul(_c(x, 0.5), inverse)), lax.mul(inverse2, series)), shift)
  reflected = lax.sub(value, lax.div(_c(x, math.pi), lax.tan(lax.mul(_c(x, math.pi), x))))
  return lax.select(_is_pole(x), _c(x, math.nan), lax.select(small, reflected, value))


gammaln = _in_float64(_gammaln64)
gammaln.__doc__ = "log |Gamma(x)| (Lanczos; inf at the poles 0, -1, -2, ...)."
digamma = _in_float64(_digamma64)
digamma.__doc__ = "The digamma function psi(x) = d/dx log Gamma(x) (NaN at the poles)."


@staged()
def ndtr(x: Any) -> Array:
  """The standard normal CDF, 0.5 erfc(-x / sqrt(2))."""
  x = _float(x)
  return 0.5 * _lax_erfc(-x * full((), 1 / math.sqrt(2), x.dtype))  # (a strongly typed constant, not host data)


@staged()
def log_ndtr(x: Any) -> Array:
  """log of the standard normal CDF (through erfc, accurate far into the lower tail)."""
  return jnp.log(ndtr(x))


@staged()
def ndtri(p: Any) -> Array:
  """The standard normal quantile function (inverse of ndtr)."""
  p = _float(p)
  return math.sqrt(2) * _lax_erf_inv(2 * p - 1)


__all__ = ["digamma", "entr", "erf", "erfc", "erfinv", "expit", "gammaln", "log_ndtr", "logit", "logsumexp", "ndtr",
           "ndtri", "xlog1py", "xlogy"]
