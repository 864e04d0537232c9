"""More of tinyjax.numpy, composed of the rest: `split`, `array_split`, `hsplit`, `vsplit`, `rot90`, `meshgrid`,
`indices`, `diag`, `diagonal`, `trace`, `isclose`, `allclose`, `array_equal`, `kron`, `linalg.norm`; `select`,
`piecewise`, `interp`, `polyval`, `digitize`, `cross`, `trapezoid`, `nancumsum`/`nancumprod`, `partition`; `insert`,
`delete`, `append` (concrete positions); `unravel_index`, `ravel_multi_index`, `tri*_indices`, `diag_indices`,
`fill_diagonal`; the set functions (`isin`, `union1d`, `setdiff1d`, `setxor1d`, `intersect1d`)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax import _shape as lax_shape
from tinyjax.lax._base import canonicalize_axis, cast, full, reshape_raw, staged
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


@staged(static_argnames=("indices_or_sections", "axis"), multiple_results=True)
def split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Array]:
  """`ary` cut along `axis` into equal sections or at the given indices (numpy's split)."""
  return _split("split", ary, indices_or_sections, axis, True)


@staged(static_argnames=("indices_or_sections", "axis"), multiple_results=True)
def array_split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Array]:
  """As `split`, but a number of sections need not divide the axis."""
  return _split("array_split", ary, indices_or_sections, axis, False)


def hsplit(ary: Any, indices_or_sections: Any) -> list[Array]:
  x = as_array(ary, "hsplit")
  return split(x, indices_or_sections, axis=1 if x.ndim > 1 else 0)


def vsplit(ary: Any, indices_or_sections: Any) -> list[Array]:
  return split(ary, indices_or_sections, axis=0)


@staged(static_argnames=("k", "axes"))
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


@staged(static_argnames=("copy", "sparse", "indexing"), multiple_results=True)
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


@staged(static_argnames=("offset", "axis1", "axis2"))
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


@staged(static_argnames=("k",))
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


@staged(static_argnames=("offset", "axis1", "axis2", "dtype"))
def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None, out: None = None) -> Array:
  """Sum of the `offset` diagonal of the planes (axis1, axis2)."""
  return red.sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


@staged(static_argnames=("rtol", "atol", "equal_nan"))
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


@staged(static_argnames=("rtol", "atol", "equal_nan"))
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


@staged()
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


@staged(static_argnames=("ord", "axis", "keepdims"))
def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Array:  # noqa: A002
  """Vector norms (ord None/2, 1, inf, -inf, 0, any p) over one axis, matrix norms ('fro', 1, -1, inf, -inf; 'nuc',
  2, -2 by the singular values) over two (None: the 2-norm of the flattened array, or 'fro' for matrices, as numpy)."""
  array = as_array(x, "norm")
  matrix = (axis is None and array.ndim == 2) or (axis is not None and np.ndim(axis) == 1 and len(axis) == 2)
  if dtypes.is_complex(array.dtype) and not (ord in (2, -2, "nuc") and matrix):
    array = ew.absolute(array)  # (every norm but the spectral ones depends on the magnitudes only)
  if not dtypes.is_inexact(array.dtype): array = cast(array, dtypes.default_float_dtype(), False)
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
    elif ord in (2, -2, "nuc"):
      from tinyjax.lax.linalg import svd
      from tinyjax.numpy._shape import moveaxis
      values = svd(moveaxis(array, (row, col), (-2, -1)), compute_uv=False)
      reduced = red.sum(values, axis=-1) if ord == "nuc" else (red.max if ord == 2 else red.min)(values, axis=-1)
      if not keepdims: return reduced
      return reshape_raw(reduced, tuple(1 if i in axes else d for i, d in enumerate(array.shape)))
    else:
      raise ValueError(f"Invalid norm order {ord!r} for matrices: use 'fro', 'nuc', 1, -1, 2, -2, inf or -inf")
    return result if keepdims else reshape_raw(result, tuple(d for i, d in enumerate(array.shape) if i not in axes))
  raise ValueError(f"Improper number of axes for norm: {axes}")



# ---------------------------------------------------------------------------------------------------------------------
# element selection and piecewise functions

def select(condlist: Sequence[Any], choicelist: Sequence[Any], default: Any = 0) -> Array:
  """The element of the first choice whose condition holds, else `default`."""
  from tinyjax import numpy as jnp
  if len(condlist) != len(choicelist):
    raise ValueError(f"select: condlist and choicelist must have the same length, got {len(condlist)} and "
                     f"{len(choicelist)}")
  if not condlist: raise ValueError("select: condlist must not be empty")
  conditions = [jnp.asarray(c) for c in condlist]
  if any(c.dtype != np.bool_ for c in conditions):
    raise TypeError("select: every condition must be a boolean array")
  choices = ew.promote("select", *choicelist, default, broadcast=False)
  result = choices[-1]
  for condition, choice in zip(reversed(conditions), reversed(choices[:-1])):
    result = jnp.where(condition, choice, result)
  return result


def piecewise(x: Any, condlist: Any, funclist: Sequence[Any], *args: Any, **kw: Any) -> Array:
  """funclist[i](x) where condlist[i] holds (a later condition wins, as numpy); one extra function is the default.
  Every function is evaluated on all of x (no data-dependent branching)."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(x)
  conditions = [jnp.asarray(c) for c in (condlist if isinstance(condlist, (list, tuple)) else list(condlist))]
  if len(funclist) not in (len(conditions), len(conditions) + 1):
    raise ValueError(f"piecewise: funclist must have {len(conditions)} or {len(conditions) + 1} entries, got "
                     f"{len(funclist)}")

  def evaluate(f: Any) -> Array:
    value = f(x, *args, **kw) if callable(f) else f
    return jnp.broadcast_to(jnp.asarray(value).astype(x.dtype), x.shape)
  result = evaluate(funclist[-1]) if len(funclist) > len(conditions) else jnp.zeros_like(x)
  for condition, f in zip(conditions, funclist):
    result = jnp.where(condition, evaluate(f), result)
  return result


@staged(static_argnames=("period",))
def interp(x: Any, xp: Any, fp: Any, left: Any = None, right: Any = None, period: Any = None) -> Array:
  """Linear interpolation of (xp, fp) (xp increasing) at x; left/right: the values outside (fp's ends by default);
  `period`: xp is periodic."""
  from tinyjax import numpy as jnp
  x, xp, fp = (jnp.asarray(v) for v in (x, xp, fp))
  if xp.ndim != 1 or fp.ndim != 1 or xp.shape != fp.shape:
    raise ValueError(f"interp: xp and fp must be 1-d of the same length, got shapes {xp.shape} and {fp.shape}")
  dtype = dtypes.to_inexact_dtype(dtypes.result_type(x, xp, fp))
  x, xp, fp = x.astype(dtype), xp.astype(dtype), fp.astype(dtype)
  if period is not None:
    if left is not None or right is not None: raise ValueError("interp: left/right have no meaning with period")
    x, xp = x % period, xp % period
    order = jnp.argsort(xp)
    xp, fp = xp[order], fp[order]
    xp = jnp.concatenate([xp[-1:] - period, xp, xp[:1] + period])
    fp = jnp.concatenate([fp[-1:], fp, fp[:1]])
  i = jnp.clip(jnp.searchsorted(xp, x, side="right"), 1, xp.shape[0] - 1)
  dx = xp[i] - xp[i - 1]
  delta = x - xp[i - 1]
  step = jnp.where(dx == 0, 0, delta / jnp.where(dx == 0, 1, dx))
  result = fp[i - 1] + step * (fp[i] - fp[i - 1])
  if period is None:
    result = jnp.where(x < xp[0], fp[0] if left is None else left, result)
    result = jnp.where(x > xp[-1], fp[-1] if right is None else right, result)
  return result.astype(dtype)


@staged(static_argnames=("unroll",))
def polyval(p: Any, x: Any, *, unroll: int = 16) -> Array:
  """The polynomial with coefficients p (highest power first) at x, by Horner's rule."""
  from tinyjax import numpy as jnp
  p, x = ew.promote("polyval", p, x, broadcast=False)
  if p.ndim != 1: raise ValueError(f"polyval: p must be 1-d, got shape {p.shape}")
  result = jnp.zeros_like(x)
  for i in range(p.shape[0]): result = result * x + p[i]
  return result


def digitize(x: Any, bins: Any, right: bool = False, *, method: str | None = None) -> Array:
  """The index of the bin each x falls in (bins increasing or decreasing, as numpy)."""
  from tinyjax import numpy as jnp
  x, bins = jnp.asarray(x), jnp.asarray(bins)
  if bins.ndim != 1: raise ValueError(f"digitize: bins must be 1-d, got shape {bins.shape}")
  if bins.shape[0] == 0: return jnp.zeros(x.shape, np.int32)
  side = "left" if right else "right"
  increasing = jnp.searchsorted(bins, x, side=side)
  decreasing = bins.shape[0] - jnp.searchsorted(bins[::-1], x, side=side)
  return jnp.where(bins[-1] >= bins[0], increasing, decreasing).astype(np.int32)


@staged(static_argnames=("axisa", "axisb", "axisc", "axis"))
def cross(a: Any, b: Any, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis: int | None = None) -> Array:
  """The cross product of 2- or 3-vectors along the given axes (2-vectors have a zero third component)."""
  from tinyjax import numpy as jnp
  if axis is not None: axisa = axisb = axisc = axis
  a, b = ew.promote("cross", a, b, broadcast=False)
  a, b = jnp.moveaxis(a, axisa, -1), jnp.moveaxis(b, axisb, -1)
  if a.shape[-1] not in (2, 3) or b.shape[-1] not in (2, 3):
    raise ValueError(f"cross: vectors must have 2 or 3 components, got {a.shape[-1]} and {b.shape[-1]}")
  if a.shape[-1] == 2 and b.shape[-1] == 2:
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]
  a0, a1, a2 = a[..., 0], a[..., 1], (a[..., 2] if a.shape[-1] == 3 else jnp.zeros_like(a[..., 0]))
  b0, b1, b2 = b[..., 0], b[..., 1], (b[..., 2] if b.shape[-1] == 3 else jnp.zeros_like(b[..., 0]))
  c = jnp.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)
  return jnp.moveaxis(c, -1, axisc)


@staged(static_argnames=("dx", "axis"))
def trapezoid(y: Any, x: Any = None, dx: Any = 1.0, axis: int = -1) -> Array:
  """The integral of y (samples at x, or spaced dx) by the trapezoidal rule along `axis`."""
  from tinyjax import numpy as jnp
  y = jnp.moveaxis(jnp.asarray(y), axis, -1)
  y = y.astype(dtypes.to_inexact_dtype(y.dtype))
  widths = jnp.diff(jnp.moveaxis(jnp.asarray(x), axis, -1) if x is not None and jnp.ndim(x) > 1 else x) \
    if x is not None else dx
  return jnp.sum(widths * (y[..., 1:] + y[..., :-1]) / 2, axis=-1)


@staged(static_argnames=("axis", "dtype"))
def nancumsum(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
  """cumsum with NaNs counted as zero."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(a)
  return jnp.cumsum(jnp.where(jnp.isnan(x), 0, x) if dtypes.is_floating(x.dtype) else x, axis=axis, dtype=dtype)


@staged(static_argnames=("axis", "dtype"))
def nancumprod(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
  """cumprod with NaNs counted as one."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(a)
  return jnp.cumprod(jnp.where(jnp.isnan(x), 1, x) if dtypes.is_floating(x.dtype) else x, axis=axis, dtype=dtype)


def partition(a: Any, kth: int, axis: int = -1) -> Array:
  """The kth element in its sorted place, smaller ones before it, larger after (here: fully sorted, which is one
  valid partition; numpy and JAX leave the order within each side unspecified)."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(a)
  axis = canonicalize_axis(axis, x.ndim)
  if not -x.shape[axis] <= int(kth) < x.shape[axis]:
    raise ValueError(f"partition: kth={kth} is out of bounds for an axis of length {x.shape[axis]}")
  return jnp.sort(x, axis=axis)


def argpartition(a: Any, kth: int, axis: int = -1) -> Array:
  """Indices that would partition `a` (see `partition`: a stable argsort here)."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(a)
  axis = canonicalize_axis(axis, x.ndim)
  if not -x.shape[axis] <= int(kth) < x.shape[axis]:
    raise ValueError(f"argpartition: kth={kth} is out of bounds for an axis of length {x.shape[axis]}")
  return jnp.argsort(x, axis=axis)


# ---------------------------------------------------------------------------------------------------------------------
# inserting and deleting (the positions are concrete: they decide the result's shape)

def _concrete_positions(name: str, obj: Any, length: int) -> tuple[np.ndarray, bool]:
  """obj as int64 positions (a slice expanded over `length`), and whether it was a scalar."""
  if isinstance(obj, slice): return np.arange(length)[obj], False
  if isinstance(obj, Array):
    from tinyjax.trace.core import Tracer
    if isinstance(obj, Tracer):
      raise TypeError(f"{name}: the positions must be concrete (they decide the result's shape); got a traced "
                      "value: pass a Python int, slice or a numpy array")
    obj = np.asarray(obj)
  positions = np.asarray(obj)
  if positions.dtype.kind == "b":
    raise TypeError(f"{name}: boolean positions are not supported; use jnp.nonzero(mask)[0] or jnp.where")
  if positions.dtype.kind not in "iu" and positions.size:
    raise TypeError(f"{name}: positions must be integers, got {positions.dtype}")
  return positions.astype(np.int64), positions.ndim == 0


def insert(arr: Any, obj: Any, values: Any, axis: int | None = None) -> Array:
  """`values` inserted before the positions `obj` along `axis` (flattened without one)."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(arr)
  if axis is None: x, axis = jnp.ravel(x), 0
  axis = canonicalize_axis(axis, x.ndim)
  n = x.shape[axis]
  positions, scalar = _concrete_positions("insert", obj, n + 1)
  if ((positions < -n) | (positions > n)).any():
    raise IndexError(f"insert: index {positions[(positions < -n) | (positions > n)][0]} is out of bounds for an "
                     f"axis of length {n}")
  positions = np.where(positions < 0, positions + n, positions)
  values = jnp.asarray(values).astype(x.dtype)
  values = jnp.reshape(values, (1,) * (x.ndim - values.ndim) + values.shape)  # numpy's ndmin=arr.ndim
  block = list(x.shape)
  if scalar or positions.size == 1:  # every value goes in at one position (their count: values' first axis)
    values = jnp.moveaxis(values, 0, axis)
    block[axis] = values.shape[axis]
    positions = np.full(block[axis], positions.reshape(-1)[0])
  else:
    block[axis] = positions.size
  values = jnp.broadcast_to(values, tuple(block))
  order = np.argsort(positions, kind="stable")
  new_positions = positions[order] + np.arange(positions.size)  # where each inserted value lands
  total = n + positions.size
  source = np.empty(total, np.int64)
  is_new = np.zeros(total, bool)
  is_new[new_positions] = True
  source[is_new] = n + order
  source[~is_new] = np.arange(n)
  joined = jnp.concatenate([x, values], axis=axis)
  return jnp.take(joined, jnp.asarray(source.astype(np.int32)), axis=axis)


def delete(arr: Any, obj: Any, axis: int | None = None, *, assume_unique_indices: bool = False) -> Array:
  """`arr` without the entries at positions `obj` along `axis` (flattened without one)."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(arr)
  if axis is None: x, axis = jnp.ravel(x), 0
  axis = canonicalize_axis(axis, x.ndim)
  n = x.shape[axis]
  positions, _ = _concrete_positions("delete", obj, n)
  if ((positions < -n) | (positions >= n)).any():
    raise IndexError(f"delete: index {positions[(positions < -n) | (positions >= n)][0]} is out of bounds for an "
                     f"axis of length {n}")
  keep = np.ones(n, bool)
  keep[np.where(positions < 0, positions + n, positions)] = False
  return jnp.take(x, jnp.asarray(np.nonzero(keep)[0].astype(np.int32)), axis=axis)


@staged(static_argnames=("axis",))
def append(arr: Any, values: Any, axis: int | None = None) -> Array:
  """`values` appended to `arr` along `axis` (both flattened without one)."""
  from tinyjax import numpy as jnp
  if axis is None: return jnp.concatenate([jnp.ravel(jnp.asarray(arr)), jnp.ravel(jnp.asarray(values))])
  return jnp.concatenate([arr, values], axis=axis)


# ---------------------------------------------------------------------------------------------------------------------
# index helpers

def unravel_index(indices: Any, shape: Sequence[int]) -> tuple[Array, ...]:
  """Flat indices as coordinates in `shape` (as JAX: negative indices count from the end, out-of-bounds ones clip)."""
  from tinyjax import numpy as jnp
  x = jnp.asarray(indices)
  if x.dtype.kind not in "iu": raise TypeError(f"unravel_index: indices must be integers, got {x.dtype}")
  shape = tuple(int(d) for d in shape)
  size = int(np.prod(shape, dtype=np.int64))
  x = jnp.clip(x, -size, size - 1)
  x = jnp.where(x < 0, x + size, x)
  coordinates = []
  for stride, dim in zip(_strides(shape), shape):
    coordinates.append((x // stride) % dim if dim else x * 0)
  return tuple(coordinates)


def _strides(shape: Sequence[int]) -> list[int]:
  strides, step = [], 1
  for dim in reversed(shape):
    strides.append(step)
    step *= dim
  return strides[::-1]


def ravel_multi_index(multi_index: Sequence[Any], dims: Sequence[int], mode: str = "raise", order: str = "C") -> Array:
  """Coordinates in `dims` as flat indices; mode 'clip' or 'wrap' for out-of-bounds ones ('raise' checks concrete
  values)."""
  from tinyjax import numpy as jnp
  if order not in ("C", "F"): raise ValueError(f"ravel_multi_index: order must be 'C' or 'F', got {order!r}")
  if len(multi_index) != len(dims):
    raise ValueError(f"ravel_multi_index: {len(multi_index)} coordinate arrays for {len(dims)} dimensions")
  coordinates = [jnp.asarray(c) for c in multi_index]
  if any(c.dtype.kind not in "iu" for c in coordinates):
    raise TypeError("ravel_multi_index: coordinates must be integer arrays")
  dims = [int(d) for d in dims]
  if mode == "raise":
    from tinyjax.trace.core import Tracer
    if any(isinstance(c, Tracer) for c in coordinates):
      raise TypeError("ravel_multi_index: mode='raise' needs concrete coordinates; under jit use mode='clip' or "
                      "'wrap'")
    for c, d in zip(coordinates, dims):
      if c.size and (np.asarray(c).min() < 0 or np.asarray(c).max() >= d):
        raise ValueError("ravel_multi_index: invalid entry in coordinates array (use mode='clip' or 'wrap')")
  elif mode == "clip": coordinates = [jnp.clip(c, 0, d - 1) for c, d in zip(coordinates, dims)]
  elif mode == "wrap": coordinates = [c % d for c, d in zip(coordinates, dims)]
  else: raise ValueError(f"ravel_multi_index: mode must be 'raise', 'clip' or 'wrap', got {mode!r}")
  strides = _strides(dims) if order == "C" else _strides(dims[::-1])[::-1]
  total = 0
  for c, stride in zip(coordinates, strides): total = total + c.astype(np.int32) * stride
  return jnp.asarray(total).astype(np.int32)


def _index_pair(rows: np.ndarray, cols: np.ndarray) -> tuple[Array, Array]:
  from tinyjax import numpy as jnp
  return jnp.asarray(rows.astype(np.int32)), jnp.asarray(cols.astype(np.int32))


def triu_indices(n: int, k: int = 0, m: int | None = None) -> tuple[Array, Array]:
  """Row and column indices of the upper triangle (from diagonal k) of an n x m array."""
  return _index_pair(*np.triu_indices(int(n), int(k), None if m is None else int(m)))


def tril_indices(n: int, k: int = 0, m: int | None = None) -> tuple[Array, Array]:
  """Row and column indices of the lower triangle (to diagonal k) of an n x m array."""
  return _index_pair(*np.tril_indices(int(n), int(k), None if m is None else int(m)))


def triu_indices_from(arr: Any, k: int = 0) -> tuple[Array, Array]:
  shape = np.shape(arr)
  if len(shape) != 2: raise ValueError(f"triu_indices_from: arr must be 2-d, got shape {shape}")
  return triu_indices(shape[0], k, shape[1])


def tril_indices_from(arr: Any, k: int = 0) -> tuple[Array, Array]:
  shape = np.shape(arr)
  if len(shape) != 2: raise ValueError(f"tril_indices_from: arr must be 2-d, got shape {shape}")
  return tril_indices(shape[0], k, shape[1])


def diag_indices(n: int, ndim: int = 2) -> tuple[Array, ...]:
  """The indices of the main diagonal of an n x ... x n array (`ndim` of them)."""
  from tinyjax import numpy as jnp
  if int(n) < 0: raise ValueError(f"diag_indices: n must be non-negative, got {n}")
  return (jnp.asarray(np.arange(int(n), dtype=np.int32)),) * int(ndim)


def diag_indices_from(arr: Any) -> tuple[Array, ...]:
  shape = np.shape(arr)
  if len(shape) < 2 or len(set(shape)) != 1:
    raise ValueError(f"diag_indices_from: arr must have at least 2 equal dimensions, got shape {shape}")
  return diag_indices(shape[0], len(shape))


def fill_diagonal(a: Any, val: Any, wrap: bool = False, *, inplace: bool = True) -> Array:
  """A copy of `a` with its main diagonal set to `val` (repeated as needed); `inplace=False` is required."""
  from tinyjax import numpy as jnp
  if inplace: raise NotImplementedError("JAX arrays are immutable, must use inplace=False")
  x = jnp.asarray(a)
  if x.ndim < 2: raise ValueError(f"fill_diagonal: array must be at least 2-d, got shape {x.shape}")
  if x.ndim > 2 and len(set(x.shape)) != 1:
    raise ValueError(f"fill_diagonal: an array of more than 2 dimensions needs equal dimensions, got {x.shape}")
  flat = jnp.ravel(x)
  # numpy's stride between diagonal elements in the flat array; a tall matrix stops after its square part (no wrap)
  step = x.shape[1] + 1 if x.ndim == 2 else 1 + int(np.sum(np.cumprod(x.shape[:-1])))
  end = flat.shape[0] if wrap or x.ndim > 2 else min(x.shape[1] * x.shape[1], flat.shape[0])
  positions = np.arange(0, end, step)
  values = jnp.ravel(jnp.asarray(val).astype(x.dtype))
  if values.shape[0] == 0: return x
  values = jnp.take(values, jnp.asarray((np.arange(positions.size) % values.shape[0]).astype(np.int32)))
  return jnp.reshape(flat.at[jnp.asarray(positions.astype(np.int32))].set(values), x.shape)


# ---------------------------------------------------------------------------------------------------------------------
# set operations (on sorted values; size= makes them work on traced arrays, as JAX)

@staged(static_argnames=("assume_unique", "invert", "method"))
def isin(element: Any, test_elements: Any, assume_unique: bool = False, invert: bool = False, *,
         method: str = "auto") -> Array:
  """Whether each element occurs in `test_elements` (a binary search in their sorted values)."""
  from tinyjax import numpy as jnp
  x, tests = ew.promote("isin", element, test_elements, broadcast=False)
  tests = jnp.sort(jnp.ravel(tests))
  if tests.shape[0] == 0: found = jnp.zeros(x.shape, bool)
  else:
    position = jnp.clip(jnp.searchsorted(tests, x), 0, tests.shape[0] - 1)
    found = tests[position] == x
  return ~found if invert else found


def _first_of_runs(ordered: Array) -> Array:
  """True at the first element of each run of equal values in a sorted 1-d array (NaNs equal, as unique)."""
  from tinyjax import numpy as jnp
  if ordered.shape[0] == 0: return jnp.zeros((0,), bool)
  same = ordered[1:] == ordered[:-1]
  if dtypes.is_floating(ordered.dtype): same = same | (jnp.isnan(ordered[1:]) & jnp.isnan(ordered[:-1]))
  return jnp.concatenate([jnp.ones((1,), bool), ~same])


def _selected(name: str, ordered: Array, keep: Array, size: int | None, fill_value: Any) -> tuple[Array, Array]:
  """The kept values of `ordered` (in order) and their positions: as many as there are (concrete `keep`), or
  `size` of them padded with `fill_value` (default 0; positions padded with 0)."""
  from tinyjax import numpy as jnp
  if size is None:
    from tinyjax.trace.core import Tracer
    if isinstance(keep, Tracer):
      raise TypeError(f"{name}: the size of the result depends on the values; under jit pass size= (and "
                      "fill_value=)")
    positions = jnp.asarray(np.nonzero(np.asarray(keep))[0].astype(np.int32))
    return ordered[positions], positions
  (positions,) = jnp.nonzero(keep, size=int(size), fill_value=-1)
  found = positions >= 0
  positions = jnp.where(found, positions, 0)
  values = jnp.where(found, ordered[positions] if ordered.shape[0] else jnp.zeros((int(size),), ordered.dtype),
                     0 if fill_value is None else fill_value)
  return values.astype(ordered.dtype), positions


def union1d(ar1: Any, ar2: Any, *, size: int | None = None, fill_value: Any = None) -> Array:
  """The sorted unique values of both arrays."""
  from tinyjax import numpy as jnp
  x, y = ew.promote("union1d", ar1, ar2, broadcast=False)
  return jnp.unique(jnp.concatenate([jnp.ravel(x), jnp.ravel(y)]), size=size, fill_value=fill_value)


def setdiff1d(ar1: Any, ar2: Any, assume_unique: bool = False, *, size: int | None = None,
              fill_value: Any = None) -> Array:
  """The sorted unique values of ar1 that are not in ar2."""
  from tinyjax import numpy as jnp
  x, y = ew.promote("setdiff1d", ar1, ar2, broadcast=False)
  ordered = jnp.sort(jnp.ravel(x))
  keep = _first_of_runs(ordered) & ~isin(ordered, y)
  return _selected("setdiff1d", ordered, keep, size, fill_value)[0]


def setxor1d(ar1: Any, ar2: Any, assume_unique: bool = False, *, size: int | None = None,
             fill_value: Any = None) -> Array:
  """The sorted unique values in exactly one of the arrays."""
  from tinyjax import numpy as jnp
  x, y = ew.promote("setxor1d", ar1, ar2, broadcast=False)
  x, y = jnp.ravel(x), jnp.ravel(y)
  ordered = jnp.sort(jnp.concatenate([x, y]))
  keep = _first_of_runs(ordered) & (isin(ordered, x) != isin(ordered, y))
  return _selected("setxor1d", ordered, keep, size, fill_value)[0]


def intersect1d(ar1: Any, ar2: Any, assume_unique: bool = False, return_indices: bool = False, *,
                size: int | None = None, fill_value: Any = None) -> Array | tuple[Array, Array, Array]:
  """The sorted unique values in both arrays; with `return_indices`, also where each first occurs in ar1 and ar2."""
  from tinyjax import numpy as jnp
  x, y = ew.promote("intersect1d", ar1, ar2, broadcast=False)
  x, y = jnp.ravel(x), jnp.ravel(y)
  order1 = jnp.argsort(x)  # stable: a run's first element is that value's first occurrence
  ordered = x[order1]
  keep = _first_of_runs(ordered) & isin(ordered, y)
  values, positions = _selected("intersect1d", ordered, keep, size, fill_value)
  if not return_indices: return values
  order2 = jnp.argsort(y)
  in_y = jnp.clip(jnp.searchsorted(y[order2], values), 0, max(y.shape[0] - 1, 0))
  indices1 = order1[positions] if x.shape[0] else jnp.zeros(positions.shape, np.int32)
  indices2 = order2[in_y] if y.shape[0] else jnp.zeros(positions.shape, np.int32)
  return values, indices1.astype(np.int32), indices2.astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------------
# integer and floating-point decompositions

def _integers(name: str, *args: Any) -> list[Array]:
  arrays = ew.promote(name, *args)
  if arrays[0].dtype.kind not in "iu":
    raise TypeError(f"{name} requires integer arguments, got {arrays[0].dtype}")
  return arrays


def gcd(x1: Any, x2: Any) -> Array:
  """The greatest common divisor of |x1| and |x2| (0 for two zeros), by Euclid's algorithm in a while_loop."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  x, y = _integers("gcd", x1, x2)
  x, y = jnp.abs(x), jnp.abs(y)

  def step(pair):
    a, b = pair
    nonzero = b != 0
    return jnp.where(nonzero, b, a), jnp.where(nonzero, a % jnp.where(nonzero, b, 1), 0)
  return lax.while_loop(lambda pair: jnp.any(pair[1] != 0), step, (x, y))[0]


def lcm(x1: Any, x2: Any) -> Array:
  """The least common multiple of |x1| and |x2| (0 if either is 0)."""
  from tinyjax import numpy as jnp
  x, y = _integers("lcm", x1, x2)
  divisor = gcd(x, y)
  return jnp.where(divisor == 0, 0, jnp.abs(x // jnp.where(divisor == 0, 1, divisor) * y))


@staged(multiple_results=True)
def frexp(x: Any, /) -> tuple[Array, Array]:
  """x = mantissa * 2 ** exponent with |mantissa| in [0.5, 1) (0, inf and NaN: themselves and exponent 0), from the
  bits of the float alone: kernels flush subnormals to zero (as XLA), so a subnormal is normalised with integer
  shifts (its highest mantissa bit found by clz), not by a float multiply."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  (value,) = ew.promote("frexp", x, inexact=True)
  info = dtypes.finfo(value.dtype)
  width = value.dtype.itemsize * 8
  bits_dtype = np.dtype(f"int{width}")
  mantissa_bits, bias = int(info.nmant), int(info.maxexp) - 1

  def const(v: int) -> Array: return full((), v, bits_dtype)  # (a constant, not host data: an eager call is one node)
  bits = lax.bitcast_convert_type(value, bits_dtype)
  exponent_field = (bits >> mantissa_bits) & const(2 * bias + 1)
  fraction = bits & const((1 << mantissa_bits) - 1)
  subnormal = (exponent_field == 0) & (fraction != 0)
  # a subnormal's highest set bit p: value = 1.f * 2 ** (p - mantissa_bits - bias + 1) = 0.1f * 2 ** (that + 1)
  highest = (width - 1) - lax.clz(jnp.where(subnormal, fraction, const(1)))
  shifted = jnp.where(subnormal, lax.shift_left(fraction, const(mantissa_bits) - highest), fraction)
  exponent = jnp.where(subnormal, highest.astype(np.int32) - (mantissa_bits + bias - 2),
                       exponent_field.astype(np.int32) - (bias - 1))
  # sign, the (normalised) fraction, and the exponent field of [0.5, 1)
  sign = bits & const(-(1 << (width - 1)))
  mantissa = lax.bitcast_convert_type(sign | (shifted & const((1 << mantissa_bits) - 1)) |
                                      const((bias - 1) << mantissa_bits), value.dtype)
  special = ((exponent_field == 0) & (fraction == 0)) | (exponent_field == const(2 * bias + 1))
  return jnp.where(special, value, mantissa), jnp.where(special, 0, exponent).astype(np.int32)


def ldexp(x1: Any, x2: Any, /) -> Array:
  """x1 * 2 ** x2 (x2 integer), scaled in steps within the exponent range so that no step overflows early."""
  from tinyjax import numpy as jnp
  (x,) = ew.promote("ldexp", x1, inexact=True)
  n = jnp.asarray(x2)
  if n.dtype.kind not in "iu": raise TypeError(f"ldexp: the exponent must be an integer, got {n.dtype}")
  x, n = jnp.broadcast_arrays(x, n.astype(np.int32))
  info = dtypes.finfo(x.dtype)
  low, high = int(info.minexp), int(info.maxexp) - 1
  result, rest = x, n
  for _ in range(3):
    part = jnp.clip(rest, low, high)
    result = result * jnp.exp2(part.astype(x.dtype))  # an exact power of two within the normal range
    rest = rest - part
  return result


@staged(multiple_results=True)
def modf(x: Any, /, out: None = None) -> tuple[Array, Array]:
  """The fractional and integral parts of x (x - trunc(x), trunc(x)), as JAX (inf gives a NaN fraction)."""
  from tinyjax import numpy as jnp
  (value,) = ew.promote("modf", x, inexact=True)
  whole = jnp.trunc(value)
  return value - whole, whole
