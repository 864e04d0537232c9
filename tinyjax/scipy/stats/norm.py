"""The normal distribution: logpdf, pdf, cdf, logcdf, ppf, sf, logsf (loc and scale broadcast)."""
from __future__ import annotations

import math
from typing import Any

from tinyjax import numpy as jnp
from tinyjax.array import Array
from tinyjax.scipy import special

_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)


def _standardized(x: Any, loc: Any, scale: Any) -> tuple[Array, Array]:
  x, loc, scale = jnp.asarray(x), jnp.asarray(loc), jnp.asarray(scale)
  dtype = jnp.result_type(x, loc, scale, 1.0)
  x, loc, scale = x.astype(dtype), loc.astype(dtype), scale.astype(dtype)
  return (x - loc) / scale, scale


def logpdf(x: Any, loc: Any = 0, scale: Any = 1) -> Array:
  z, scale = _standardized(x, loc, scale)
  return -0.5 * z * z - _HALF_LOG_TWO_PI - jnp.log(scale)


def pdf(x: Any, loc: Any = 0, scale: Any = 1) -> Array: return jnp.exp(logpdf(x, loc, scale))


def cdf(x: Any, loc: Any = 0, scale: Any = 1) -> Array: return special.ndtr(_standardized(x, loc, scale)[0])


def logcdf(x: Any, loc: Any = 0, scale: Any = 1) -> Array: return special.log_ndtr(_standardized(x, loc, scale)[0])


def sf(x: Any, loc: Any = 0, scale: Any = 1) -> Array: return special.ndtr(-_standardized(x, loc, scale)[0])


def logsf(x: Any, loc: Any = 0, scale: Any = 1) -> Array: return special.log_ndtr(-_standardized(x, loc, scale)[0])


def ppf(q: Any, loc: Any = 0, scale: Any = 1) -> Array:
  q = jnp.asarray(q)
  return jnp.asarray(loc) + jnp.asarray(scale) * special.ndtri(q)
