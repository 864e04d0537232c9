"""Searching and counting: `nonzero`, `flatnonzero`, `argwhere`, one-argument `where`, `unique`, `searchsorted`,
`bincount`, `histogram`.

Functions whose result shape depends on the values (`nonzero`, `argwhere`, `unique`) need concrete input, as in JAX:
under `jit` they raise a ConcretizationTypeError that says to pass `size=` (supported for `nonzero`/`argwhere`/`where`
on concrete values; traced values with `size=` are not supported yet). `searchsorted` is a binary search of
ceil(log2(n + 1)) gather steps (NaN sorts last, as numpy), `bincount` a scatter-add, `histogram` both together: all
work under jit and vmap.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import cast, expand_raw, full, reshape_raw, staged, to_array
from tinyjax.lax._elementwise import _add, _and, _eq, _fdiv, _isnan, _lt, _mul, _not, _or, _sub, _where
from tinyjax.lax._shape import iota, pad_raw, shrink_raw
from tinyjax.lax._slicing import gather_raw
from tinyjax.lax._sort import total_less
from tinyjax.numpy._indexing import scatter_update
from tinyjax.trace.core import Tracer, bind
from tinyjax.uop import Ops


def _concrete(name: str, a: Any) -> np.ndarray:
  """The host value of `a`; a ConcretizationTypeError (from the tracer) naming `name` when it is traced."""
  if isinstance(a, Tracer): return np.asarray(a.concrete(f"{name}() (its result shape depends on the values)"))
  return np.asarray(a)


def _sized(positions: np.ndarray, size: int | None, fill_value: Any) -> np.ndarray:
  """`positions` truncated or padded with `fill_value` (default 0) to `size` entries."""
  if size is None: return positions
  size = int(size)
  if len(positions) >= size: return positions[:size]
  return np.concatenate([positions, np.full(size - len(positions), 0 if fill_value is None else fill_value,
                                            positions.dtype)])


def _traced_nonzero(x: Array, size: int, fill_value: Any) -> tuple[Array, ...]:
  """nonzero of a traced array with a static `size`: each non-zero element's rank among them (a cumulative sum)
  is where its flat index goes (a scatter); the rest is `fill_value`. Works under jit and vmap."""
  from tinyjax.numpy._sorting import cumsum
  flat = reshape_raw(x, (x.size,))
  mask = _not(_eq(flat, full(flat.shape, 0, flat.dtype))) if flat.dtype != np.bool_ else flat
  rank = _add(cumsum(mask), full(flat.shape, -1, np.int32))
  # elements that are zero, or beyond `size`, go to the dropped position `size`
  target = _where(_and(mask, _lt(rank, full(flat.shape, size, np.int32))), rank, full(flat.shape, size, np.int32))
  flat_index = iota(np.int32, flat.size)
  sentinel = -1
  positions = scatter_update(full((size,), sentinel, np.int32), target, flat_index, "set")
  fills = fill_value if isinstance(fill_value, (tuple, list)) else (0 if fill_value is None else fill_value,) * x.ndim
  found = _not(_eq(positions, full((size,), sentinel, np.int32)))
  out, remaining = [], positions
  strides = [int(np.prod(x.shape[i + 1:])) for i in range(x.ndim)]
  for stride, dim, fill in zip(strides, x.shape, fills):
    coordinate = _floor_div(remaining, stride) if stride > 1 else remaining
    coordinate = lax_rem(coordinate, dim) if dim else coordinate
    out.append(_where(found, coordinate, full((size,), fill, np.int32)))
  return tuple(cast(coordinate, dtypes.default_int_dtype(), False) for coordinate in out)


def _floor_div(x: Array, divisor: int) -> Array: return bind(Ops.IDIV, x, full(x.shape, divisor, x.dtype))
def lax_rem(x: Array, divisor: int) -> Array: return bind(Ops.MOD, x, full(x.shape, divisor, x.dtype))


def nonzero(a: Any, *, size: int | None = None, fill_value: Any = None) -> tuple[Array, ...]:
  """The indices of the non-zero elements, one array per axis (default int dtype; numpy's order). `size=` pads (with
  `fill_value`, default 0) or truncates to that many; with `size=` it works on traced values too (under jit)."""
  if isinstance(a, Tracer) and size is not None:
    if a.ndim == 0:
      raise ValueError("Calling nonzero on 0d arrays is not allowed. Use jnp.atleast_1d(scalar) instead.")
    return _traced_nonzero(a, int(size), fill_value)
  host = _concrete("nonzero", a)
  if host.ndim == 0:
    raise ValueError("Calling nonzero on 0d arrays is not allowed. Use jnp.atleast_1d(scalar) instead.")
  fills = fill_value if isinstance(fill_value, (tuple, list)) else (fill_value,) * host.ndim
  return tuple(to_array(_sized(axis.astype(dtypes.default_int_dtype()), size, fill))
               for axis, fill in zip(np.nonzero(host), fills))


def flatnonzero(a: Any, *, size: int | None = None, fill_value: Any = None) -> Array:
  """The indices of the non-zero elements of the flattened array."""
  if isinstance(a, Tracer) and size is not None: return nonzero(reshape_raw(a, (a.size,)), size=size,
                                                                fill_value=fill_value)[0]
  return nonzero(np.ravel(_concrete("flatnonzero", a)), size=size, fill_value=fill_value)[0]


def argwhere(a: Any, *, size: int | None = None, fill_value: Any = None) -> Array:
  """The indices of the non-zero elements as a (count, ndim) array of the default int dtype (traced values need
  `size=`)."""
  if isinstance(a, Tracer) and size is not None and a.ndim:
    from tinyjax.numpy._shape import stack
    return stack(_traced_nonzero(a, int(size), fill_value), axis=1)
  host = _concrete("argwhere", a)
  if host.ndim == 0: return to_array(np.zeros((int(bool(host)), 0), dtypes.default_int_dtype()))
  columns = [np.asarray(c) for c in nonzero(host, size=size, fill_value=fill_value)]
  return to_array(np.stack(columns, axis=1).astype(dtypes.default_int_dtype()))


@staged(static_argnames=("return_index", "return_inverse", "return_counts", "axis", "equal_nan", "size", "fill_value"),
        multiple_results=True)
def unique(ar: Any, return_index: bool = False, return_inverse: bool = False, return_counts: bool = False,
           axis: int | None = None, *, equal_nan: bool = True, size: int | None = None,
           fill_value: Any = None) -> Any:
  """The sorted unique values of a concrete array (as numpy; NaNs compared equal), with the optional indices, inverse
  and counts; `size=` pads with `fill_value` (default: the smallest unique value) or truncates."""
  if isinstance(ar, Tracer) and size is not None:
    if axis is not None: raise NotImplementedError("unique of a traced array with size= supports no axis= yet")
    return _traced_unique(ar, return_index, return_inverse, return_counts, equal_nan, int(size), fill_value)
  host = _concrete("unique", ar)
  results = np.unique(host, return_index=return_index, return_inverse=return_inverse, return_counts=return_counts,
                      axis=axis, equal_nan=equal_nan)
  results = list(results) if isinstance(results, tuple) else [results]
  if size is not None:
    values = results[0]
    fill = (values[0] if len(values) else 0) if fill_value is None else fill_value
    if axis is None:
      results[0] = _sized(values, size, fill)
    extras = 1
    if return_index:
      results[extras] = _sized(results[extras], size, 0)
      extras += 1
    if return_inverse: extras += 1
    if return_counts: results[extras] = _sized(results[extras], size, 0)
  index = dtypes.default_int_dtype()
  out = [to_array(r.astype(index if i > 0 else host.dtype)) for i, r in enumerate(results)]
  if return_inverse:
    position = 1 + int(return_index)
    out[position] = reshape_raw(out[position], host.shape if axis is None else out[position].shape)
  return out[0] if len(out) == 1 else tuple(out)


def _traced_unique(ar: Array, return_index: bool, return_inverse: bool, return_counts: bool, equal_nan: bool,
                   size: int, fill_value: Any) -> Any:
  """`unique` of a traced array with `size=` (as JAX): its flattened values sorted stably (`argsort`), a group
  starting where a value differs from the one before; the first `size` groups' values (the rest `fill_value`,
  default the smallest), their first positions in `ar` (the rest that of the smallest), each element's group
  (the inverse, in `ar`'s shape) and the groups' sizes (the rest 0)."""
  from tinyjax.numpy._sorting import argsort, cumsum
  n = ar.size
  flat = reshape_raw(ar, (n,))
  index_dtype = dtypes.default_int_dtype()
  if n == 0:
    fill = full((size,), 0 if fill_value is None else fill_value, ar.dtype)
    extras = [full((size,), 0, index_dtype)] * return_index + [reshape_raw(full((0,), 0, index_dtype), ar.shape)] * \
        return_inverse + [full((size,), 0, index_dtype)] * return_counts
    return (fill, *extras) if extras else fill
  def pick(values: Array, at: Array) -> Array:  # (values[at], of 1-D values by 1-D int32 positions)
    return reshape_raw(gather_raw(values, reshape_raw(at, (*at.shape, 1)), (1,)), at.shape)
  order = cast(argsort(flat), np.int32, False)
  ordered = pick(flat, order)
  previous = pad_raw(shrink_raw(ordered, [(0, n - 1)]), [(1, 0)])
  same = _eq(ordered, previous)
  if equal_nan and dtypes.is_floating(ordered.dtype): same = _or(same, _and(_isnan(ordered), _isnan(previous)))
  first = _or(_not(same), _lt(iota(np.int32, n), full((n,), 1, np.int32)))
  (positions,) = _traced_nonzero(first, size, -1)
  found = _not(_eq(positions, full(positions.shape, -1, np.int32)))
  starts = _where(found, positions, full(positions.shape, 0, np.int32))  # (the rest: the smallest value's group)
  values = pick(ordered, starts)
  fill = expand_raw(reshape_raw(shrink_raw(ordered, [(0, 1)]), ()), (size,)) if fill_value is None else \
      full((size,), fill_value, ordered.dtype)
  results = [_where(found, values, fill)]
  if return_index: results.append(cast(pick(order, starts), index_dtype, False))
  groups = _sub(cumsum(cast(first, np.int32, False)), full((n,), 1, np.int32))  # (each sorted element's group)
  if return_inverse:
    inverse = scatter_update(full((n,), 0, np.int32), order, groups, "set", unique_indices=True)
    results.append(cast(reshape_raw(inverse, ar.shape), index_dtype, False))
  if return_counts:  # (groups past `size` are dropped, as out-of-bounds updates are)
    counts = scatter_update(full((size,), 0, np.int32), groups, full((n,), 1, np.int32), "add")
    results.append(cast(counts, index_dtype, False))
  return results[0] if len(results) == 1 else tuple(results)


@staged(static_argnames=("side", "method"))
def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None, *, method: str = "scan") -> Array:
  """Where each value of `v` would be inserted in the sorted 1-D array `a` to keep it sorted (int32, v's shape):
  before equal elements (`side="left"`) or after them ("right"). A binary search: ceil(log2(len(a) + 1)) gathers."""
  if side not in ("left", "right"): raise ValueError(f"side must be 'left' or 'right', got {side!r}")
  if method not in ("scan", "scan_unrolled", "sort", "compare_all"):
    raise ValueError(f"method must be one of 'scan', 'scan_unrolled', 'sort', 'compare_all', got {method!r}")
  a, v = (to_array(np.asarray(x) if isinstance(x, (list, tuple)) else x) for x in (a, v))
  dtype = dtypes.result_type(a, v)
  a, v = cast(a, dtype, False), cast(v, dtype, False)
  if a.ndim != 1: raise ValueError(f"a should be 1-dimensional, got shape {a.shape}")
  if sorter is not None:
    from tinyjax.numpy._indexing import take
    a = take(a, sorter, mode="clip")
  n = a.shape[0]
  low, high = full(v.shape, 0, np.int32), full(v.shape, n, np.int32)
  if n == 0: return low
  flat_v = reshape_raw(v, (v.size,))
  low, high = reshape_raw(low, (v.size,)), reshape_raw(high, (v.size,))
  for _ in range(math.ceil(math.log2(n + 1))):
    middle = _floor_half(_add(low, high))
    value = gather_raw(a, reshape_raw(middle, (v.size, 1)), (1,))
    value = reshape_raw(value, (v.size,))
    goes_right = total_less(value, flat_v) if side == "left" else _not(total_less(flat_v, value))
    active = _lt(low, high)
    low = _where(_and(active, goes_right), _add(middle, full(middle.shape, 1, np.int32)), low)
    high = _where(_and(active, _not(goes_right)), middle, high)
  return reshape_raw(low, v.shape)


def _floor_half(x: Array) -> Array: return bind(Ops.SHR, x, full(x.shape, 1, x.dtype))  # x >= 0 here


def bincount(x: Any, weights: Any = None, minlength: int = 0, *, length: int | None = None) -> Array:
  """Counts (or summed `weights`) of each non-negative integer value of `x`, `length` of them (default: from the
  concrete values, max(x) + 1 and at least `minlength`); negative values count at 0 and values past the end are
  dropped, as JAX."""
  x = to_array(x)
  if not dtypes.issubdtype(x.dtype, np.integer):
    raise TypeError(f"bincount: x argument must have an integer type, got {x.dtype.name}")
  if x.ndim != 1: raise ValueError(f"bincount only accepts 1D arrays, got shape {x.shape}")
  if length is None:
    host = _concrete("bincount (pass length= under jit)", x)
    length = max(int(minlength), int(host.max()) + 1 if host.size else 0)
  length = int(length)
  if weights is None:
    weights = full(x.shape, 1, dtypes.default_int_dtype())
  else:
    weights = to_array(weights)
    if weights.shape != x.shape:
      raise ValueError(f"bincount: weights shape {weights.shape} must match x's shape {x.shape}")
  zero = full(x.shape, 0, x.dtype)
  clipped = _where(_lt(x, zero), zero, x)
  return scatter_update(full((length,), 0, weights.dtype), clipped, weights, "add")


@staged(static_argnames=("bins", "range", "density"), multiple_results=True)
def histogram(a: Any, bins: Any = 10, range: tuple[float, float] | None = None,  # noqa: A002
              weights: Any = None, density: bool | None = None) -> tuple[Array, Array]:
  """Counts of `a` in `bins` (a number of equal bins over `range`, default a's min to max, or an array of edges)
  and the bin edges, as numpy: each bin includes its left edge, the last also its right edge."""
  from tinyjax.numpy._elementwise import promote
  (a,) = promote("histogram", a, inexact=True)
  flat = reshape_raw(a, (a.size,))
  if isinstance(bins, (int, np.integer)):
    if bins < 1: raise ValueError(f"`bins` must be positive, when an integer, got {bins}")
    if range is None:
      from tinyjax.numpy._reductions import max as amax, min as amin
      low, high = (amin(flat), amax(flat)) if a.size else (full((), 0.0, a.dtype), full((), 1.0, a.dtype))
    else:
      if range[0] > range[1]: raise ValueError("max must be larger than min in range parameter.")
      low, high = full((), range[0], a.dtype), full((), range[1], a.dtype)
    span = _sub(high, low)
    positive = _lt(full((), 0.0, a.dtype), span)
    half = full((), 0.5, a.dtype)
    low = _where(positive, low, _sub(low, half))  # numpy widens an empty range to a width of 1
    high = _where(positive, high, _add(high, half))
    span = _where(positive, span, full((), 1.0, a.dtype))
    steps = _fdiv(iota(a.dtype, int(bins) + 1), full((int(bins) + 1,), float(bins), a.dtype))
    edges = _add(_broadcast(low, int(bins) + 1), _mul(steps, _broadcast(span, int(bins) + 1)))
    is_last = _lt(full((int(bins) + 1,), int(bins) - 1, np.int32), iota(np.int32, int(bins) + 1))
    edges = _where(is_last, _broadcast(high, int(bins) + 1), edges)  # the last edge is `high` exactly, as linspace
  else:
    edges = cast(to_array(bins), a.dtype, False)
    if edges.ndim != 1 or edges.shape[0] < 2: raise ValueError("bins must be a 1-D array of at least 2 edges")
  count = edges.shape[0] - 1
  right = searchsorted(edges, flat, side="right")
  last_edge = reshape_raw(gather_raw(edges, full((1,), count, np.int32), (1,)), ())
  at_end = _not(_or(_lt(flat, _broadcast(last_edge, flat.shape[0])), _lt(_broadcast(last_edge, flat.shape[0]), flat)))
  index = _where(at_end, full(right.shape, count, np.int32), right)
  index = _add(index, full(index.shape, -1, np.int32))  # -1 (below the first edge) and `count` (above) are dropped
  index = _where(_lt(index, full(index.shape, 0, np.int32)), full(index.shape, count, np.int32), index)
  counts_dtype = dtypes.default_int_dtype() if weights is None else to_array(weights).dtype
  w = full(flat.shape, 1, counts_dtype) if weights is None else reshape_raw(to_array(weights), (a.size,))
  counts = scatter_update(full((count,), 0, counts_dtype), index, w, "add")
  if density:
    from tinyjax.numpy._reductions import sum as total
    widths = _sub(shrink_raw(edges, [(1, count + 1)]), shrink_raw(edges, [(0, count)]))
    counts = cast(counts, a.dtype, False)
    counts = _fdiv(counts, _mul(_broadcast(total(counts), count), widths))
  return counts, edges


def _broadcast(x: Array, size: int) -> Array: return expand_raw(reshape_raw(x, (1,)), (size,))

