"""Order statistics and weighted means: `quantile`, `percentile`, `median` and their nan- forms (a sort along the
reduced axes, then a gather at the quantile's position), `average`, `ptp`. Differentiable through the sort."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, cast, staged
from tinyjax.trace.core import Primitive

QUANTILE_METHODS = ("linear", "lower", "higher", "midpoint", "nearest")


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
  if axis is None: return tuple(range(ndim))
  axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
  return tuple(sorted({canonicalize_axis(int(a), ndim) for a in axes}))


def _quantile(name: str, a: Any, q: Any, axis: Any, method: str, keepdims: bool, ignore_nan: bool,
              weights: Any = None) -> Array:
  from tinyjax import numpy as jnp
  if method not in QUANTILE_METHODS:
    raise ValueError(f"{name}: method can only be {', '.join(map(repr, QUANTILE_METHODS))}, got {method!r}")
  if weights is not None: raise NotImplementedError(f"{name}: weights= is not supported by tinyjax yet")
  x = jnp.asarray(a)
  if dtypes.is_complex(x.dtype):
    raise ValueError(f"{name} does not support complex input: complex numbers have no natural ordering")
  x = cast(x, dtypes.to_inexact_dtype(x.dtype), False)
  q = cast(jnp.asarray(q), x.dtype, False)
  if q.ndim > 1: raise ValueError(f"{name}: q must be a scalar or 1-d, got shape {q.shape}")
  axes = _axes(axis, x.ndim)
  if any(x.shape[d] == 0 for d in axes):
    raise ValueError(f"{name}: cannot take a quantile over an empty axis of shape {x.shape}")
  return quantile_p.bind(x, q, axes=axes, method=method, keepdims=bool(keepdims), ignore_nan=bool(ignore_nan))


def _quantile_impl(x: Array, q: Array, *, axes: tuple[int, ...], method: str, keepdims: bool,
                   ignore_nan: bool) -> Array:
  """The quantiles q of x over `axes`: x sorted along them (flattened last), read at each quantile's position."""
  from tinyjax import numpy as jnp
  kept = [d for d in range(x.ndim) if d not in axes]
  # the reduced axes last, flattened into one: (kept..., n)
  moved = jnp.transpose(x, (*kept, *axes))
  n = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
  flat = jnp.reshape(moved, (*moved.shape[:len(kept)], n))
  ordered = jnp.sort(flat, axis=-1)  # NaN last
  nan = jnp.isnan(flat)
  count = (n - jnp.sum(nan, axis=-1, keepdims=True)) if ignore_nan else jnp.full(flat.shape[:-1] + (1,), n)
  # positions, with the q axis (if any) first: (q..., kept..., 1)
  q_b = jnp.reshape(q, q.shape + (1,) * flat.ndim)
  last = cast(jnp.maximum(count - 1, 0), x.dtype, False)
  position = q_b * last
  low = jnp.floor(position)
  high = jnp.ceil(position)
  if method == "nearest": low = high = jnp.round(position)  # half to even, as numpy
  elif method == "lower": high = low
  elif method == "higher": low = high

  def at(index: Array) -> Array:
    target = jnp.broadcast_to(ordered, q.shape + ordered.shape)
    index = jnp.broadcast_to(cast(index, np.int32, False), q.shape + ordered.shape[:-1] + (1,))
    return jnp.take_along_axis(target, index, axis=-1)[..., 0]
  below, above = at(low), at(high)
  if method == "linear":
    fraction = (position - low)[..., 0]
    result = below + (above - below) * fraction
  elif method == "midpoint":
    result = (below + above) / 2
  else:
    result = below
  if ignore_nan:
    result = jnp.where(count[..., 0] == 0, jnp.nan, result)  # an all-NaN slice
  else:
    result = jnp.where(jnp.any(nan, axis=-1), jnp.nan, result)  # a NaN anywhere makes the quantile NaN
  if keepdims:
    shape = [1 if d in axes else x.shape[d] for d in range(x.ndim)]
    result = jnp.reshape(result, q.shape + tuple(shape))
  return result


# a primitive without rules of its own: an eager median or quantile is one node (trace/core.py `stage_call`; built op
# by op, `float(jnp.median(x))` of 64 floats took 635 us, JAX 12), lowered, differentiated and batched through its
# decomposition
quantile_p = Primitive("quantile", _quantile_impl)


def quantile(a: Any, q: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
             method: str = "linear", keepdims: bool = False, *, weights: Any = None) -> Array:
  """The q-th quantiles (q in [0, 1], a scalar or 1-d) over `axis`; NaN if a slice holds a NaN. The q axis, if any,
  comes first in the result (numpy's layout)."""
  return _quantile("quantile", a, q, axis, method, keepdims, False, weights)


def nanquantile(a: Any, q: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
                method: str = "linear", keepdims: bool = False, *, weights: Any = None) -> Array:
  """`quantile` ignoring NaNs (NaN only for an all-NaN slice)."""
  return _quantile("nanquantile", a, q, axis, method, keepdims, True, weights)


def percentile(a: Any, q: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
               method: str = "linear", keepdims: bool = False, *, weights: Any = None) -> Array:
  """`quantile` with q in percent."""
  from tinyjax import numpy as jnp
  return _quantile("percentile", a, jnp.asarray(q) / 100, axis, method, keepdims, False, weights)


def nanpercentile(a: Any, q: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
                  method: str = "linear", keepdims: bool = False, *, weights: Any = None) -> Array:
  """`nanquantile` with q in percent."""
  from tinyjax import numpy as jnp
  return _quantile("nanpercentile", a, jnp.asarray(q) / 100, axis, method, keepdims, True, weights)


def median(a: Any, axis: Any = None, out: None = None, overwrite_input: bool = False, keepdims: bool = False) -> Array:
  """The median over `axis` (the mean of the two middle values for an even count)."""
  return _quantile("median", a, 0.5, axis, "linear", keepdims, False)


def nanmedian(a: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
              keepdims: bool = False) -> Array:
  """`median` ignoring NaNs."""
  return _quantile("nanmedian", a, 0.5, axis, "linear", keepdims, True)


@staged(static_argnames=("axis", "returned", "keepdims"))
def average(a: Any, axis: Any = None, weights: Any = None, returned: bool = False,
            keepdims: bool = False) -> Array | tuple[Array, Array]:
  """The (weighted) mean over `axis`; `weights` of a's shape, or 1-d along a single `axis`. With `returned`, also the
  sum of the weights (broadcast to the result's shape)."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(a)
  if weights is None:
    result = jnp.mean(x, axis=axis, keepdims=keepdims)
    total = jnp.full(result.shape, np.prod([x.shape[d] for d in _axes(axis, x.ndim)]) if x.ndim else 1,
                     result.dtype)
    return (result, total) if returned else result
  w = jnp.asarray(weights)
  if w.shape != x.shape:
    if axis is None:
      raise ValueError(f"average: axis must be given when weights (shape {w.shape}) and a (shape {x.shape}) differ "
                       "in shape")
    if w.ndim != 1 or not isinstance(axis, (int, np.integer)):
      raise TypeError(f"average: 1-d weights of shape {w.shape} need one integer axis, got axis={axis!r}")
    axis = canonicalize_axis(int(axis), x.ndim)
    if w.shape[0] != x.shape[axis]:
      raise ValueError(f"average: weights of length {w.shape[0]} differ from a's axis {axis} of length "
                       f"{x.shape[axis]}")
    w = jnp.reshape(w, tuple(-1 if d == axis else 1 for d in range(x.ndim)))
  dtype = dtypes.to_inexact_dtype(dtypes.result_type(x, w))
  x, w = x.astype(dtype), jnp.broadcast_to(w.astype(dtype), x.shape)
  total = jnp.sum(w, axis=axis, keepdims=keepdims)
  result = jnp.sum(x * w, axis=axis, keepdims=keepdims) / total
  return (result, jnp.broadcast_to(total, result.shape)) if returned else result


@staged(static_argnames=("axis", "keepdims"))
def ptp(a: Any, axis: Any = None, out: None = None, keepdims: bool = False) -> Array:
  """Peak to peak: max - min over `axis`."""
  from tinyjax import numpy as jnp
  return jnp.max(a, axis=axis, keepdims=keepdims) - jnp.min(a, axis=axis, keepdims=keepdims)
