"""More of tinyjax.numpy, composed of the rest: `split`, `array_split`, `hsplit`, `vsplit`, `rot90`, `meshgrid`,
`indices`, `diag`, `diagonal`, `trace`, `isclose`, `allclose`, `array_equal`, `kron` and `linalg.norm`."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax import _shape as lax_shape
from tinyjax.lax._base import canonicalize_axis, cast, reshape_raw
from tinyjax.numpy import _elementwise as ew
from tinyjax.numpy import _reductions as red
from tinyjax.numpy._elementwise import as_array
from tinyjax.numpy._shape import broadcast_to, flip, moveaxis, swapaxes


def _sections(length: int, indices_or_sections: Any, name: str, exact: bool) -> list[int]:
  """The split points of an axis of `length`: given, or `sections` equal parts (array_split: the first
  length % sections parts one longer)."""
  if isinstance(indices_or_sections, (int, np.integer)):
    sections = int(indices_or_sections)
    if sections <= 0: raise ValueError(f"number sections must be larger than 0, got {sections}")
    if exact and length % sections:
      raise ValueError("array split does not result in an equal division")
    base, extra = divmod(length, sections)
    sizes = [base + 1] * extra + [base] * (sections - extra)
    return list(np.cumsum(sizes)[:-1])
  if isinstance(indices_or_sections, Array): indices_or_sections = np.asarray(indices_or_sections)
  return [int(i) for i in indices_or_sections]


def _split(name: str, ary: Any, indices_or_sections: Any, axis: int, exact: bool) -> list[Array]:
  x = as_array(ary, name)
  axis = canonicalize_axis(axis, x.ndim)
  length = x.shape[axis]
  points = [0] + [min(max(p + length if p < 0 else p, 0), length) for p in
                  _sections(length, indices_or_sections, name, exact)] + [length]
  parts = []
  for start, stop in zip(points[:-1], points[1:]):
    bounds = [(0, d) for d in x.shape]
    bounds[axis] = (start, max(start, stop))
    parts.append(lax_shape.shrink_raw(x, bounds))
  return parts


def split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Array]:
  """`ary` cut along `axis` into equal sections or at the given indices (numpy's split)."""
  return _split("split", ary, indices_or_sections, axis, True)


def array_split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Array]:
  """As `split`, but a number of sections need not divide the axis."""
  return _split("array_split", ary, indices_or_sections, axis, False)


def hsplit(ary: Any, indices_or_sections: Any) -> list[Array]:
  x = as_array(ary, "hsplit")
  return split(x, indices_or_sections, axis=1 if x.ndim > 1 else 0)


def vsplit(ary: Any, indices_or_sections: Any) -> list[Array]:
  return split(ary, indices_or_sections, axis=0)


def rot90(m: Any, k: int = 1, axes: tuple[int, int] = (0, 1)) -> Array:
  """`m` rotated by 90 degrees `k` times in the plane of `axes` (from the first axis toward the second)."""
  x = as_array(m, "rot90")
  if len(axes) != 2: raise ValueError("len(axes) must be 2.")
  first, second = (canonicalize_axis(a, x.ndim) for a in axes)
  if first == second: raise ValueError("Axes must be different.")
  k = int(k) % 4
  if k == 0: return x
  if k == 2: return flip(flip(x, first), second)
  if k == 1: return swapaxes(flip(x, second), first, second)
  return flip(swapaxes(x, first, second), second)


def meshgrid(*xi: Any, copy: bool = True, sparse: bool = False, indexing: str = "xy") -> list[Array]:
  """Coordinate arrays from 1-D coordinate vectors (`indexing` "xy": the first two outputs' axes swapped, as
  numpy; "ij": matrix indexing); `sparse` keeps the broadcastable shapes."""
  if indexing not in ("xy", "ij"): raise ValueError(f"Valid values for indexing are 'xy' and 'ij', got {indexing}")
  arrays = [as_array(x, "meshgrid") for x in xi]
  for x in arrays:
    if x.ndim != 1:
      raise ValueError(f"Arguments to meshgrid must be 1D, got shape {x.shape}")
  shape = [x.size for x in arrays]
  if indexing == "xy" and len(arrays) >= 2: shape[0], shape[1] = shape[1], shape[0]
  outputs = []
  for i, x in enumerate(arrays):
    position = i
    if indexing == "xy" and len(arrays) >= 2 and i < 2: position = 1 - i
    view_shape = [1] * len(arrays)
    view_shape[position] = x.size
    view = reshape_raw(x, tuple(view_shape))
    outputs.append(view if sparse else broadcast_to(view, tuple(shape)))
  return outputs


def indices(dimensions: Sequence[int], dtype: Any = None, sparse: bool = False) -> Any:
  """The index grid of `dimensions`: one array per axis counting along it."""
  dtype = dtypes.canonicalize_dtype(dtypes.dtype(dtypes.default_int_dtype() if dtype is None else dtype))
  dimensions = tuple(int(d) for d in dimensions)
  outputs = []
  for axis, size in enumerate(dimensions):
    if sparse:
      shape = [1] * len(dimensions)
      shape[axis] = size
      outputs.append(lax_shape.iota_along(dtype, tuple(shape), axis))
    else:
      outputs.append(lax_shape.iota_along(dtype, dimensions, axis))
  if sparse: return tuple(outputs)
  from tinyjax.numpy._shape import stack
  return stack(outputs) if outputs else lax_shape.full((0,), 0, dtype)


def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Array:
  """The `offset` diagonal of the planes (axis1, axis2), as a last axis."""
  x = as_array(a, "diagonal")
  if x.ndim < 2: raise ValueError("diagonal requires an array of at least two dimensions.")
  first, second = canonicalize_axis(axis1, x.ndim), canonicalize_axis(axis2, x.ndim)
  if first == second: raise ValueError("axis1 and axis2 must not be equal.")
  x = moveaxis(x, (first, second), (-2, -1))
  rows, cols = x.shape[-2:]
  offset = int(offset)
  start_row, start_col = (0, offset) if offset >= 0 else (-offset, 0)
  length = max(0, min(rows - start_row, cols - start_col))
  batch = x.shape[:-2]
  if length == 0: return lax_shape.full((*batch, 0), 0, x.dtype)
  # the flat positions start + i * (cols + 1): pad each row by one, flatten, take every (cols + 1)-th element
  x = lax_shape.shrink_raw(x, [(0, d) for d in batch] + [(start_row, start_row + length), (start_col, cols)])
  width = cols - start_col
  flat = reshape_raw(x, (*batch, length * width))
  padded = lax_shape.pad_raw(flat, [(0, 0)] * len(batch) + [(0, length * (width + 1) - length * width)])
  grid = reshape_raw(padded, (*batch, length, width + 1))
  return reshape_raw(lax_shape.shrink_raw(grid, [(0, d) for d in batch] + [(0, length), (0, 1)]), (*batch, length))


def diag(v: Any, k: int = 0) -> Array:
  """The `k` diagonal of a 2-D array, or a 2-D array with the 1-D `v` on its `k` diagonal."""
  x = as_array(v, "diag")
  if x.ndim == 2: return diagonal(x, k)
  if x.ndim != 1: raise ValueError("diag input must be 1d or 2d")
  k = int(k)
  n = x.size + abs(k)
  from tinyjax.numpy._creation import eye
  grid = eye(n, k=k, dtype=np.bool_)
  padded = lax_shape.pad_raw(x, [(0, abs(k))])
  # on the diagonal, row i holds v[i] (k >= 0); column j holds v[j] (k < 0)
  values = broadcast_to(reshape_raw(padded, (n, 1) if k >= 0 else (1, n)), (n, n))
  return ew.where(grid, values, lax_shape.full((n, n), 0, x.dtype))


def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None, out: None = None) -> Array:
  """Sum of the `offset` diagonal of the planes (axis1, axis2)."""
  return red.sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


def isclose(a: Any, b: Any, rtol: Any = 1e-05, atol: Any = 1e-08, equal_nan: bool = False) -> Array:
  """|a - b| <= atol + rtol |b| elementwise (infinities equal only to themselves; NaNs equal if `equal_nan`)."""
  x, y = ew.promote("isclose", a, b, inexact=True)
  shape = np.broadcast_shapes(x.shape, y.shape)
  x, y = broadcast_to(x, shape), broadcast_to(y, shape)
  close = ew.less_equal(ew.absolute(ew.subtract(x, y)), ew.add(atol, ew.multiply(rtol, ew.absolute(y))))
  either_inf = ew.logical_or(ew.isinf(x), ew.isinf(y))
  close = ew.where(either_inf, ew.equal(x, y), close)
  if equal_nan: close = ew.logical_or(close, ew.logical_and(ew.isnan(x), ew.isnan(y)))
  return close


def allclose(a: Any, b: Any, rtol: Any = 1e-05, atol: Any = 1e-08, equal_nan: bool = False) -> Array:
  """Whether `isclose` holds everywhere (a bool scalar)."""
  return red.all(isclose(a, b, rtol, atol, equal_nan))


def array_equal(a1: Any, a2: Any, equal_nan: bool = False) -> Array:
  """Whether the arrays have one shape and equal elements."""
  x, y = as_array(a1, "array_equal"), as_array(a2, "array_equal")
  if x.shape != y.shape: return lax_shape.full((), False, np.bool_)
  equal = ew.equal(x, y)
  if equal_nan: equal = ew.logical_or(equal, ew.logical_and(ew.isnan(x), ew.isnan(y)))
  return red.all(equal)


def kron(a: Any, b: Any) -> Array:
  """The Kronecker product: every element of a times b, as blocks."""
  x, y = ew.promote("kron", a, b, broadcast=False)
  ndim = max(x.ndim, y.ndim)
  x = reshape_raw(x, (1,) * (ndim - x.ndim) + x.shape)
  y = reshape_raw(y, (1,) * (ndim - y.ndim) + y.shape)
  x_view = reshape_raw(x, tuple(d for s in x.shape for d in (s, 1)))
  y_view = reshape_raw(y, tuple(d for s in y.shape for d in (1, s)))
  product = ew.multiply(x_view, y_view)
  return reshape_raw(product, tuple(p * q for p, q in zip(x.shape, y.shape)))


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A002
  """Vector norms (ord None/2, 1, inf, -inf, 0, any p) over one axis, matrix norms ('fro', 1, -1, inf, -inf) over two
  (None: the 2-norm of the flattened array, or 'fro' for matrices, as numpy)."""
  array = as_array(x, "norm")
  if not dtypes.is_floating(array.dtype): array = cast(array, dtypes.default_float_dtype(), False)
  if axis is None:
    if ord is None:
      return ew.sqrt(red.sum(ew.multiply(array, array), keepdims=keepdims))
    axes = tuple(range(array.ndim))
  else:
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
  axes = tuple(canonicalize_axis(a, array.ndim) for a in axes)
  magnitude = ew.absolute(array)
  if len(axes) == 1:
    if ord is None or ord == 2: return ew.sqrt(red.sum(ew.multiply(array, array), axis=axes, keepdims=keepdims))
    if ord == np.inf: return red.max(magnitude, axis=axes, keepdims=keepdims)
    if ord == -np.inf: return red.min(magnitude, axis=axes, keepdims=keepdims)
    if ord == 0:
      return red.sum(cast(ew.not_equal(array, 0), array.dtype, False), axis=axes, keepdims=keepdims)
    if ord == 1: return red.sum(magnitude, axis=axes, keepdims=keepdims)
    if isinstance(ord, str): raise ValueError(f"Invalid norm order '{ord}' for vectors")
    p = float(ord)
    return ew.power(red.sum(ew.power(magnitude, p), axis=axes, keepdims=keepdims), 1.0 / p)
  if len(axes) == 2:
    row, col = axes
    if ord is None or ord == "fro":
      return ew.sqrt(red.sum(ew.multiply(array, array), axis=axes, keepdims=keepdims))
    if ord in (1, -1):
      sums = red.sum(magnitude, axis=row, keepdims=True)
      result = (red.max if ord == 1 else red.min)(sums, axis=col, keepdims=True)
    elif ord in (np.inf, -np.inf):
      sums = red.sum(magnitude, axis=col, keepdims=True)
      result = (red.max if ord == np.inf else red.min)(sums, axis=row, keepdims=True)
    else:
      raise NotImplementedError(f"matrix norm ord={ord!r} needs singular values (linalg.svd), which tinyjax does "
                                "not have yet; 'fro', 1, -1, inf and -inf are supported")
    return result if keepdims else reshape_raw(result, tuple(d for i, d in enumerate(array.shape) if i not in axes))
  raise ValueError(f"Improper number of axes for norm: {axes}")

