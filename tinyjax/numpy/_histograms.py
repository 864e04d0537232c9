"""Multidimensional histograms in tinyjax.numpy: `histogram_bin_edges`, `histogram2d` and `histogramdd`, as JAX's
(each sample's bin by searchsorted per dimension, the counts by one bincount of the flat bin index)."""
from __future__ import annotations

import builtins
import math
import operator
from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import staged
from tinyjax.numpy import _elementwise as ew


@staged(static_argnames=("bins", "range"))
def histogram_bin_edges(a: Any, bins: Any = 10, range: Any = None, weights: Any = None) -> Array:  # noqa: A002
  """The edges of `bins` equal bins over `range` (default: a's min to max; an empty range widened by 0.5 each
  side), or `bins` itself when it is 1-d; in a's inexact dtype. String bin rules are not supported (as JAX)."""
  from tinyjax import numpy as jnp
  del weights  # (only the string rules use them)
  if isinstance(bins, str): raise NotImplementedError("string values for `bins` not implemented.")
  array = ew.as_array(a, "histogram_bin_edges")
  dtype = dtypes.to_inexact_dtype(array.dtype)
  if np.ndim(bins) == 1: return jnp.asarray(bins, dtype=dtype)
  count = operator.index(bins)
  if count < 1: raise ValueError(f"`bins` must be positive, when an integer, got {count}")
  bounds = jnp.stack([jnp.min(array), jnp.max(array)]) if range is None else jnp.asarray(range)
  if bounds.shape != (2,): raise ValueError(f"`range` must be either None or a sequence of scalars, got {range}")
  bounds = bounds.astype(dtype)
  empty = bounds[1] == bounds[0]
  low, high = jnp.where(empty, bounds[0] - 0.5, bounds[0]), jnp.where(empty, bounds[1] + 0.5, bounds[1])
  return jnp.linspace(low, high, count + 1, dtype=dtype)


def histogramdd(sample: Any, bins: Any = 10, range: Sequence[Any] | None = None,  # noqa: A002
                weights: Any = None, density: bool | None = None) -> tuple[Array, list[Array]]:
  """The histogram of N points in D dimensions (`sample` of shape (N, D)): counts of shape (bins_0, ..., bins_D-1)
  (int32 without weights, the weights' dtype with them; probability densities with `density`) and the D arrays
  of edges. `bins`: one number or edge array for all dimensions, or one per dimension; `range`: one (low, high)
  pair or None per dimension. Each bin holds its left edge, the last also its right edge."""
  from tinyjax import numpy as jnp
  if weights is None: (points,) = ew.promote("histogramdd", sample, inexact=True)
  else:
    if np.shape(weights) != np.shape(sample)[:1]: raise ValueError("should have one weight for each sample.")
    points, weights = ew.promote("histogramdd", sample, weights, inexact=True, broadcast=False)
  if points.ndim != 2: raise ValueError(f"histogramdd: sample must have shape (N, D), got {points.shape}")
  n, d = points.shape
  if range is not None and (len(range) != d or any(r is not None and np.shape(r)[0] != 2 for r in range)):
    raise ValueError(f"For sample.shape={(n, d)}, range must be a sequence of {d} pairs or Nones; got range={range}")
  if not isinstance(bins, (list, tuple)) and np.ndim(bins) == 0: bins_per_dimension = [bins] * d
  else:
    if len(bins) != d: raise ValueError("should be a bin for each dimension.")
    bins_per_dimension = list(bins)
  indices, edges = [], []
  for i in builtins.range(d):
    column = points[:, i]
    column_edges = histogram_bin_edges(column, bins_per_dimension[i], None if range is None else range[i])
    index = jnp.searchsorted(column_edges, column, side="right")
    indices.append(jnp.where(column == column_edges[-1], index - 1, index))  # (the last bin holds its right edge)
    edges.append(column_edges)
  # bin 0 and bin len(edges) are the outliers on either side: counted, then cut off
  sizes = tuple(e.shape[0] + 1 for e in edges)
  flat = jnp.ravel_multi_index(tuple(indices), sizes, mode="clip")
  hist = jnp.reshape(jnp.bincount(flat, weights, length=math.prod(sizes)), sizes)[(slice(1, -1),) * d]
  if density:
    hist = hist.astype(points.dtype)
    hist = hist / jnp.sum(hist)
    for axis in builtins.range(d):
      hist = hist / jnp.reshape(jnp.diff(edges[axis]), tuple(-1 if i == axis else 1 for i in builtins.range(d)))
  return hist, edges



def histogram2d(x: Any, y: Any, bins: Any = 10, range: Sequence[Any] | None = None,  # noqa: A002
                weights: Any = None, density: bool | None = None) -> tuple[Array, Array, Array]:
  """The histogram of the points (x[i], y[i]) (see `histogramdd`) and the x and y edges. `bins`: a number or an
  edge array for both, or a pair of them."""
  from tinyjax import numpy as jnp
  try:
    pair = len(bins) == 2
  except TypeError:
    pair = False
  if not pair and not isinstance(bins, (int, np.integer)): bins = [jnp.asarray(bins)] * 2
  hist, edges = histogramdd(jnp.stack([jnp.asarray(x), jnp.asarray(y)], axis=1), bins, range, weights, density)
  return hist, edges[0], edges[1]
