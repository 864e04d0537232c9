"""The Bernoulli distribution: logpmf, pmf, cdf (k in {0, 1}, p broadcast)."""
from __future__ import annotations

from typing import Any

from tinyjax import numpy as jnp
from tinyjax.array import Array
from tinyjax.scipy import special


def logpmf(k: Any, p: Any, loc: Any = 0) -> Array:
  k, p = jnp.asarray(k), jnp.asarray(p)
  k = k - jnp.asarray(loc)
  log_probability = special.xlogy(k, p) + special.xlog1py(1 - k, -p)
  return jnp.where((k == 0) | (k == 1), log_probability, -jnp.inf)


def pmf(k: Any, p: Any, loc: Any = 0) -> Array: return jnp.exp(logpmf(k, p, loc))


def cdf(k: Any, p: Any) -> Array:
  k, p = jnp.asarray(k), jnp.asarray(p)
  return jnp.where(k < 0, 0.0, jnp.where(k < 1, 1 - p, 1.0))
