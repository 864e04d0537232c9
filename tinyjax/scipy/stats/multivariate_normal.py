"""The multivariate normal distribution: logpdf and pdf, through a Cholesky factor of the covariance."""
from __future__ import annotations

import math
from typing import Any

from tinyjax import numpy as jnp
from tinyjax.array import Array
from tinyjax.scipy.linalg import solve_triangular


def logpdf(x: Any, mean: Any, cov: Any, allow_singular: None = None) -> Array:
  """log N(x; mean, cov) for x (..., n) (mean (n,), cov (n, n))."""
  x, mean, cov = jnp.asarray(x), jnp.asarray(mean), jnp.asarray(cov)
  dtype = jnp.result_type(x, mean, cov, 1.0)
  x, mean, cov = x.astype(dtype), mean.astype(dtype), cov.astype(dtype)
  n = cov.shape[-1]
  factor = jnp.linalg.cholesky(cov)
  centred = x - mean
  flat = centred.reshape(-1, n).T  # (n, batch)
  whitened = solve_triangular(factor, flat, lower=True)
  mahalanobis = jnp.sum(whitened * whitened, axis=0).reshape(centred.shape[:-1])
  log_det = 2 * jnp.sum(jnp.log(jnp.diagonal(factor)))
  return -0.5 * (n * math.log(2 * math.pi) + log_det + mahalanobis)


def pdf(x: Any, mean: Any, cov: Any) -> Array: return jnp.exp(logpdf(x, mean, cov))
