"""Covariance and correlation in tinyjax.numpy: `cov` (with frequency and analytic weights) and `corrcoef`, as JAX's
(jnp compositions, differentiable)."""
from __future__ import annotations

from typing import Any

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import staged
from tinyjax.numpy import _elementwise as ew


def _weights(name: str, weights: Any, samples: int, integer: bool) -> Array:
  from tinyjax import numpy as jnp
  w = jnp.asarray(weights)
  if w.ndim > 1: raise RuntimeError(f"cannot handle multidimensional {name}")
  if w.shape[0] != samples: raise RuntimeError(f"incompatible numbers of samples and {name}")
  if integer and not dtypes.is_integer(w.dtype): raise TypeError(f"{name} must be integer.")
  return jnp.abs(w)  # (numpy raises for negative weights; a traced array cannot be checked)


@staged(static_argnames=("rowvar", "bias", "ddof"))
def cov(m: Any, y: Any = None, rowvar: bool = True, bias: bool = False, ddof: int | None = None,
        fweights: Any = None, aweights: Any = None) -> Array:
  """The covariance matrix of the variables in the rows of `m` (columns if not `rowvar`), with `y`'s variables
  appended: (n_vars, n_vars), squeezed (a 0-d array for one variable). Normalised by N - 1 (N with `bias`, N - ddof
  with `ddof`); `fweights` (integer counts) and `aweights` weigh the observations, as numpy. Integer inputs move to
  the default float dtype."""
  from tinyjax import numpy as jnp
  if y is not None:
    m, y = ew.promote("cov", m, y, inexact=True, broadcast=False)
    if y.ndim > 2: raise ValueError("y has more than 2 dimensions")
  else:
    (m,) = ew.promote("cov", jnp.asarray(m), inexact=True)
  if m.ndim > 2: raise ValueError("m has more than 2 dimensions")
  x = jnp.atleast_2d(m)
  if not rowvar and m.ndim != 1: x = x.T
  if x.shape[0] == 0: return jnp.zeros((0, 0), x.dtype)
  if y is not None:
    y_rows = jnp.atleast_2d(y)
    if not rowvar and y_rows.shape[0] != 1: y_rows = y_rows.T
    x = jnp.concatenate([x, y_rows], axis=0)
  if ddof is None: ddof = 0 if bias else 1
  weights = None
  if fweights is not None: weights = _weights("fweights", fweights, x.shape[1], integer=True)
  if aweights is not None:
    aweights = _weights("aweights", aweights, x.shape[1], integer=False)
    weights = aweights if weights is None else weights * aweights
  mean, weight_sum = jnp.average(x, axis=1, weights=weights, returned=True)
  weight_sum = weight_sum[0]
  if weights is None: normaliser = x.shape[1] - ddof
  elif ddof == 0: normaliser = weight_sum
  elif aweights is None: normaliser = weight_sum - ddof
  else: normaliser = weight_sum - ddof * jnp.sum(weights * aweights) / weight_sum
  centered = x - mean[:, None]
  weighted = centered if weights is None else centered * weights[None, :]
  return jnp.squeeze(jnp.true_divide(jnp.dot(centered, jnp.conj(weighted.T)), normaliser))


@staged(static_argnames=("rowvar",))
def corrcoef(x: Any, y: Any = None, rowvar: bool = True) -> Array:
  """The Pearson correlation coefficients of the variables (see `cov`), clipped to [-1, 1] (each part of a complex
  coefficient)."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  c = cov(x, y, rowvar)
  if c.ndim == 0: return c / c
  stddev = jnp.sqrt(jnp.real(jnp.diagonal(c))).astype(c.dtype)
  c = c / stddev[:, None] / stddev[None, :]
  real = jnp.clip(jnp.real(c), -1, 1)
  if dtypes.is_complex(c.dtype): return lax.complex(real, jnp.clip(jnp.imag(c), -1, 1))
  return real

