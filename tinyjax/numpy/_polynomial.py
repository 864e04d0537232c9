"""Polynomials of tinyjax.numpy, as coefficient arrays with the highest power first (numpy's legacy `poly*`
functions, as JAX's): `poly`, `polyadd`, `polysub`, `polymul`, `polydiv`, `polyder`, `polyint`, `polyfit` (least
squares by `linalg.lstsq`), `roots` (the eigenvalues of the companion matrix). `polyval` is in `_more`."""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import staged
from tinyjax.numpy import _elementwise as ew
from tinyjax.trace.core import ConcretizationTypeError, Tracer


def _coefficients(name: str, *args: Any, inexact: bool = True) -> list[Array]:
  """The arguments as 1-d arrays of one (inexact) dtype."""
  from tinyjax import numpy as jnp
  arrays = ew.promote(name, *(jnp.asarray(a) for a in args), inexact=inexact, broadcast=False)
  return [jnp.atleast_1d(a) for a in arrays]


@staged()
def poly(seq_of_zeros: Any) -> Array:
  """The coefficients of the monic polynomial with the given roots (or with the eigenvalues of a square matrix as
  roots: complex then, as JAX; numpy returns real coefficients for conjugate pairs)."""
  from tinyjax import numpy as jnp
  (zeros,) = ew.promote("poly", jnp.asarray(seq_of_zeros), inexact=True)
  if zeros.ndim == 2 and zeros.shape[0] == zeros.shape[1] and zeros.shape[0] != 0:
    zeros = jnp.linalg.eigvals(zeros)
  if zeros.ndim == 0: zeros = jnp.atleast_1d(zeros)
  if zeros.ndim != 1: raise ValueError("input must be 1d or non-empty square 2d array.")
  result = jnp.ones((1,), zeros.dtype)
  for k in range(zeros.shape[0]):
    result = jnp.convolve(result, jnp.stack([jnp.ones((), zeros.dtype), -zeros[k]]), mode="full")
  return result if zeros.shape[0] else jnp.ones((), zeros.dtype)


def polyadd(a1: Any, a2: Any) -> Array:
  """The sum of two polynomials (the shorter one aligned at the constant term). Dtypes promote (integers stay)."""
  x, y = _coefficients("polyadd", a1, a2, inexact=False)
  if y.shape[0] <= x.shape[0]: return x.at[x.shape[0] - y.shape[0]:].add(y)
  return y.at[y.shape[0] - x.shape[0]:].add(x)


def polysub(a1: Any, a2: Any) -> Array:
  """The difference of two polynomials."""
  x, y = _coefficients("polysub", a1, a2, inexact=False)
  return polyadd(x, -y)


def polymul(a1: Any, a2: Any, *, trim_leading_zeros: bool = False) -> Array:
  """The product of two polynomials (their convolution), in the inexact result dtype; `trim_leading_zeros` drops
  the leading zero coefficients first (needs concrete values)."""
  from tinyjax import numpy as jnp
  x, y = _coefficients("polymul", a1, a2)
  if trim_leading_zeros and (x.shape[0] > 1 or y.shape[0] > 1):
    x, y = jnp.trim_zeros(x, trim="f"), jnp.trim_zeros(y, trim="f")
  if x.shape[0] == 0: x = jnp.zeros((1,), y.dtype)
  if y.shape[0] == 0: y = jnp.zeros((1,), x.dtype)
  return jnp.convolve(x, y, mode="full")


def polydiv(u: Any, v: Any, *, trim_leading_zeros: bool = False) -> tuple[Array, Array]:
  """(quotient, remainder) of polynomial long division u / v. The remainder keeps u's length (leading zeros), as
  JAX, unless `trim_leading_zeros` (then coefficients below sqrt(eps) are dropped from its front, as numpy; needs
  concrete values)."""
  from tinyjax import numpy as jnp
  dividend, divisor = _coefficients("polydiv", u, v)
  m, n = dividend.shape[0] - 1, divisor.shape[0] - 1
  scale = 1.0 / divisor[0]
  quotient = jnp.zeros(max(m - n + 1, 1), dividend.dtype)
  for k in range(m - n + 1):
    d = scale * dividend[k]
    quotient = quotient.at[k].set(d)
    dividend = dividend.at[k:k + n + 1].add(-d * divisor)
  if trim_leading_zeros:
    if isinstance(dividend, Tracer):
      raise ConcretizationTypeError("polydiv: trim_leading_zeros needs concrete coefficients (not under jit)")
    small = np.abs(np.asarray(dividend)) < np.sqrt(float(dtypes.finfo(dividend.dtype).eps))
    dividend = dividend[int(np.argmin(small)) if not small.all() else dividend.shape[0]:]
  return quotient, dividend


def polyder(p: Any, m: int = 1) -> Array:
  """The `m`-th derivative of the polynomial p (inexact dtype)."""
  from tinyjax import numpy as jnp
  (coefficients,) = _coefficients("polyder", p)
  m = operator.index(m)
  if m < 0: raise ValueError("Order of derivative must be positive")
  if m == 0: return coefficients
  # coefficient of x^j (j >= m) times j (j - 1) ... (j - m + 1) (constants of the shape, computed on the host)
  powers = np.arange(m, coefficients.shape[0], dtype=np.float64)
  factors = np.prod(powers[None, :] - np.arange(m)[:, None], axis=0)[::-1]
  return coefficients[:-m] * jnp.asarray(factors, coefficients.dtype)


def polyint(p: Any, m: int = 1, k: Any = None) -> Array:
  """The `m`-th antiderivative of the polynomial p, with the integration constants `k` (a scalar for all m, or m
  of them, the first for the first integration: it becomes the highest of the new low-order coefficients)."""
  from tinyjax import numpy as jnp
  m = operator.index(m)
  (coefficients,) = _coefficients("polyint", p)
  if m < 0: raise ValueError("Order of integral must be positive (see polyder)")
  constants = jnp.atleast_1d(jnp.asarray(0 if k is None else k, dtype=coefficients.dtype))
  if constants.shape[0] == 1: constants = jnp.full((m,), constants[0])
  if constants.shape != (m,): raise ValueError("k must be a scalar or a rank-1 array of length 1 or m.")
  if m == 0: return coefficients
  # the divisor of each coefficient of the result: j (j - 1) ... (j - m + 1) for power j (each factor at least 1;
  # constants of the shape, computed on the host)
  grid = np.arange(coefficients.shape[0] + m, dtype=np.float64)[None, :] - np.arange(m)[:, None]
  divisors = np.prod(np.maximum(1, grid), axis=0)[::-1]
  return jnp.true_divide(jnp.concatenate([coefficients, constants]), jnp.asarray(divisors, coefficients.dtype))


def polyfit(x: Any, y: Any, deg: int, rcond: float | None = None, full: bool = False, w: Any = None,
            cov: bool | str = False) -> Any:
  """The least-squares fit of a degree-`deg` polynomial to the points (x, y) (y may hold several columns): its
  coefficients; with `full`, also (residuals, rank, singular values, rcond); with `cov`, also the covariance of
  the coefficients ("unscaled": not scaled by the residual variance). `w` weighs the points."""
  from tinyjax import numpy as jnp
  x, y = ew.promote("polyfit", jnp.asarray(x), jnp.asarray(y), inexact=True, broadcast=False)
  deg = operator.index(deg)
  order = deg + 1
  if deg < 0: raise ValueError("expected deg >= 0")
  if x.ndim != 1: raise TypeError("expected 1D vector for x")
  if x.size == 0: raise TypeError("expected non-empty vector for x")
  if y.ndim < 1 or y.ndim > 2: raise TypeError("expected 1D or 2D array for y")
  if x.shape[0] != y.shape[0]: raise TypeError("expected x and y to have same length")
  if rcond is None: rcond = x.shape[0] * float(dtypes.finfo(x.dtype).eps)
  lhs, rhs = jnp.vander(x, order), y
  if w is not None:
    (weights,) = ew.promote("polyfit", jnp.asarray(w), inexact=True)
    if weights.ndim != 1: raise TypeError("expected a 1-d array for weights")
    if weights.shape[0] != y.shape[0]: raise TypeError("expected w and y to have the same length")
    lhs = lhs * weights[:, None]
    rhs = rhs * (weights[:, None] if rhs.ndim == 2 else weights)
  scale = jnp.sqrt(jnp.sum(lhs * lhs, axis=0))  # (columns of unit norm: a better conditioned system)
  lhs = lhs / scale[None, :]
  coefficients, residuals, rank, singular_values = jnp.linalg.lstsq(lhs, rhs, rcond)
  coefficients = (coefficients.T / scale).T
  if full: return coefficients, residuals, rank, singular_values, jnp.asarray(rcond)
  if not cov: return coefficients
  base = jnp.linalg.inv(jnp.dot(lhs.T, lhs)) / jnp.outer(scale, scale)
  if cov == "unscaled": factor = 1
  else:
    if x.shape[0] <= order:
      raise ValueError("the number of data points must exceed order to scale the covariance matrix")
    factor = residuals / (x.shape[0] - order)
    if y.ndim == 1: factor = factor[0]
  return coefficients, (base * factor if y.ndim == 1 else base[:, :, None] * factor)


def _roots_no_zeros(p: Array) -> Array:
  """The roots of p (p[0] != 0): the eigenvalues of its companion matrix."""
  from tinyjax import numpy as jnp
  if p.shape[0] < 2: return jnp.zeros((0,), dtypes.complex_dtype(p.dtype))
  companion = jnp.diag(jnp.ones((p.shape[0] - 2,), p.dtype), -1)
  companion = companion.at[0, :].set(-p[1:] / p[0])
  return jnp.linalg.eigvals(companion)


def roots(p: Any, *, strip_zeros: bool = True) -> Array:
  """The complex roots of the polynomial p. `strip_zeros` drops leading zero coefficients first (needs concrete
  values); without it, as under jit, each leading zero gives a NaN root at the end instead."""
  from tinyjax import numpy as jnp
  (coefficients,) = _coefficients("roots", p)
  if coefficients.ndim != 1: raise ValueError("Input must be a rank-1 array.")
  if coefficients.shape[0] < 2: return jnp.zeros((0,), dtypes.complex_dtype(coefficients.dtype))
  is_zero = coefficients == 0
  leading_zeros = jnp.where(jnp.all(is_zero), coefficients.shape[0], jnp.argmin(is_zero))
  if strip_zeros:
    if isinstance(leading_zeros, Tracer):
      raise ConcretizationTypeError("The error occurred in the jnp.roots() function. To use this within a "
                                    "JIT-compiled context, pass strip_zeros=False, but be aware that leading zeros "
                                    "will result in some returned roots being set to NaN.")
    return _roots_no_zeros(coefficients[int(leading_zeros):])
  # leading zeros rolled to the end (all-zero coefficients replaced by ones); the zero roots they add sorted last
  # and replaced by NaN
  safe = jnp.where(leading_zeros == coefficients.shape[0], jnp.ones_like(coefficients), coefficients)
  size = coefficients.shape[0]
  found = _roots_no_zeros(safe[(jnp.arange(size) + leading_zeros) % size])
  order = jnp.argsort((found == 0).astype(np.int32), stable=True)
  found = found[order]
  keep = jnp.arange(found.shape[0]) < found.shape[0] - leading_zeros
  return jnp.where(keep, found, jnp.asarray(complex(np.nan, np.nan), found.dtype))
