"""Movement functions of tinyjax.numpy: reshape, ravel, transpose, moveaxis, swapaxes, broadcast_to,
broadcast_arrays, expand_dims, squeeze, concatenate, stack, pad, flip. All are movement primitives (free until
lowering), plus WHERE for pad values and concatenation."""
from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.placement import with_out_sharding
from tinyjax.trace.sharding_types import reshape_spec
from tinyjax.lax import _shape as lax_shape
from tinyjax.lax._base import canonicalize_axes, canonicalize_axis, cast, expand_raw, reshape_raw, staged
from tinyjax.numpy._creation import asarray
from tinyjax.numpy._elementwise import as_array


def _as_array(a: Any) -> Array:
  return asarray(a) if isinstance(a, (list, tuple)) else as_array(a)


def _resolve_shape(shape: Sequence[int], size: int, old_shape: tuple[int, ...]) -> tuple[int, ...]:
  shape = tuple(operator.index(d) for d in shape)
  unknown = [i for i, d in enumerate(shape) if d == -1]
  if len(unknown) > 1: raise TypeError(f"can only specify one unknown axis size with a `-1` value, got {tuple(shape)}")
  if any(d < -1 for d in shape): raise ValueError(f"negative dimensions not allowed in reshape: {shape}")
  if unknown:
    known = math.prod(d for d in shape if d != -1)
    if known == 0 or size % known:
      raise TypeError(f"cannot reshape array of shape {old_shape} (size {size}) into shape {shape}")
    shape = tuple(size // known if d == -1 else d for d in shape)
  if math.prod(shape) != size:
    raise TypeError(f"cannot reshape array of shape {old_shape} (size {size}) into shape {shape} "
                    f"(size {math.prod(shape)})")
  return shape


@with_out_sharding
def reshape(a: Any, shape: int | Sequence[int] | None = None, order: str = "C", *,
            newshape: int | Sequence[int] | None = None, copy: bool | None = None) -> Array:
  """The elements of `a` read and placed in row-major order (`order="C"`) or column-major order ("F"), in `shape`
  (one entry may be -1). TypeError if sizes differ. (`copy`: accepted, as JAX; arrays are immutable, so a copy and a
  view are indistinguishable.)"""
  if shape is None: shape = newshape
  if order not in ("C", "F"):
    raise NotImplementedError(f"reshape: order must be 'C' or 'F', got {order!r} (as JAX: 'A' is not supported)")
  x = _as_array(a)
  shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
  shape = _resolve_shape(shape, x.size, x.shape)
  if order == "F":  # column-major: the row-major reshape of the transposes
    reversed_x = lax_shape.permute_raw(x, tuple(range(x.ndim))[::-1])
    result = reshape_raw(reversed_x, shape[::-1])
    return lax_shape.permute_raw(result, tuple(range(len(shape)))[::-1])
  reshape_spec(x, shape)
  return reshape_raw(x, shape)


@with_out_sharding
def ravel(a: Any, order: str = "C") -> Array:
  """The elements of `a` as a 1-D array (row-major, or column-major with `order="F"`)."""
  x = _as_array(a)
  return reshape(x, (x.size,), order)


def transpose(a: Any, axes: Sequence[int] | None = None) -> Array:
  """Permute the axes (default: reverse them); output axis i is input axis axes[i]."""
  x = _as_array(a)
  if axes is None: return lax_shape.permute_raw(x, tuple(range(x.ndim))[::-1])
  return lax_shape.transpose(x, tuple(canonicalize_axis(i, x.ndim) for i in axes))


def matrix_transpose(x: Any) -> Array:
  """Swap the last two axes (arrays of rank >= 2)."""
  x = _as_array(x)
  if x.ndim < 2: raise ValueError(f"matrix_transpose requires at least 2 dimensions; got ndim={x.ndim}")
  return swapaxes(x, -1, -2)


def moveaxis(a: Any, source: int | Sequence[int], destination: int | Sequence[int]) -> Array:
  """Move axes `source` to positions `destination`, keeping the order of the others."""
  x = _as_array(a)
  sources = canonicalize_axes(source, x.ndim)
  targets = canonicalize_axes(destination, x.ndim)
  if len(sources) != len(targets): raise ValueError("moveaxis: source and destination must have the same length")
  order = [i for i in range(x.ndim) if i not in sources]
  for target, src in sorted(zip(targets, sources)): order.insert(target, src)
  return lax_shape.permute_raw(x, order)


def swapaxes(a: Any, axis1: int, axis2: int) -> Array:
  """Exchange two axes."""
  x = _as_array(a)
  order = list(range(x.ndim))
  i, j = canonicalize_axis(axis1, x.ndim), canonicalize_axis(axis2, x.ndim)
  order[i], order[j] = order[j], order[i]
  return lax_shape.permute_raw(x, order)


@with_out_sharding
def broadcast_to(array: Any, shape: int | Sequence[int]) -> Array:
  """`array` broadcast to `shape` by numpy's rules (ValueError if it does not fit)."""
  x = _as_array(array)
  shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(operator.index(d) for d in shape)
  if len(shape) < x.ndim or any(d not in (1, t) for d, t in zip(x.shape[::-1], shape[::-1])):
    raise ValueError(f"Incompatible shapes for broadcasting: {x.shape} and requested shape {shape}")
  return expand_raw(x, shape)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
  """The numpy broadcast of several shapes."""
  from tinyjax.lax._base import broadcast_shapes as broadcast  # noqa: PLC0415
  return broadcast("broadcast_shapes", *(tuple(s) for s in shapes))


def broadcast_arrays(*args: Any) -> list[Array]:
  """The arguments broadcast to their common shape (dtypes unchanged)."""
  arrays = [_as_array(a) for a in args]
  shape = broadcast_shapes(*(a.shape for a in arrays))
  return [expand_raw(a, shape) for a in arrays]


def expand_dims(a: Any, axis: int | Sequence[int]) -> Array:
  """Insert size-1 axes at positions `axis` of the result."""
  x = _as_array(a)
  axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
  return lax_shape.expand_dims(x, axes)


def squeeze(a: Any, axis: int | Sequence[int] | None = None) -> Array:
  """Remove size-1 axes (all of them, or those in `axis`, which must have size 1: ValueError otherwise)."""
  x = _as_array(a)
  if axis is None: return reshape_raw(x, [d for d in x.shape if d != 1])
  return lax_shape.squeeze(x, canonicalize_axes(axis, x.ndim))


def flip(m: Any, axis: int | Sequence[int] | None = None) -> Array:
  """Reverse the order of elements along `axis` (None: all axes)."""
  x = _as_array(m)
  return lax_shape.flip_raw(x, set(canonicalize_axes(axis, x.ndim)))


def fliplr(m: Any) -> Array:
  """Reverse along axis 1."""
  return flip(m, 1)


def flipud(m: Any) -> Array:
  """Reverse along axis 0."""
  return flip(m, 0)


@staged(static_argnames=("axis", "dtype"))
def concatenate(arrays: Sequence[Any], axis: int | None = 0, dtype: Any = None) -> Array:
  """Join arrays along an existing `axis` (None: flatten first), promoting their dtypes together."""
  if isinstance(arrays, Array): arrays = list(arrays)  # iterating splits along axis 0
  if not len(arrays): raise ValueError("Need at least one array to concatenate.")
  originals = [_as_array(a) for a in arrays]
  if dtype is None: out_dtype, weak = dtypes.result_type(*originals, return_weak_type_flag=True)
  else: out_dtype, weak = dtypes.check_user_dtype_supported(dtype, "concatenate"), False
  promoted = [cast(a, out_dtype, weak) for a in originals]
  if axis is None:
    promoted = [ravel(a) for a in promoted]
    axis = 0
  if promoted[0].ndim == 0: raise ValueError("Zero-dimensional arrays cannot be concatenated.")
  if any(a.ndim != promoted[0].ndim for a in promoted):  # a TypeError, as JAX's
    raise TypeError("Cannot concatenate arrays with different numbers of dimensions: got "
                    f"{', '.join(str(a.shape) for a in promoted)}.")
  return lax_shape.concatenate(promoted, canonicalize_axis(axis, promoted[0].ndim))


@staged(static_argnames=("axis", "dtype"))
def stack(arrays: Sequence[Any], axis: int = 0, dtype: Any = None) -> Array:
  """Join arrays of one shape along a new `axis`."""
  if isinstance(arrays, Array): arrays = list(arrays)  # iterating splits along axis 0
  if not len(arrays): raise ValueError("Need at least one array to stack.")
  arrays = [_as_array(a) for a in arrays]
  shapes = {a.shape for a in arrays}
  if len(shapes) != 1: raise ValueError(f"All input arrays must have the same shape, got {[a.shape for a in arrays]}")
  axis = canonicalize_axis(axis, arrays[0].ndim + 1)
  return concatenate([expand_dims(a, axis) for a in arrays], axis, dtype)


def ndim(a: Any) -> int:
  """The number of dimensions of an array, scalar or nested list."""
  return a.ndim if isinstance(a, Array) else int(np.ndim(a))


def shape(a: Any) -> tuple[int, ...]:
  """The shape of an array, scalar or nested list."""
  return a.shape if isinstance(a, Array) else tuple(np.shape(a))


def size(a: Any, axis: int | None = None) -> int:
  """The number of elements (along `axis`, if given)."""
  dims = shape(a)
  return math.prod(dims) if axis is None else dims[canonicalize_axis(axis, len(dims))]


def isscalar(element: Any) -> bool:
  """True for Python/numpy scalars (numpy's rule) and 0-d arrays (JAX counts a 0-d array as a scalar)."""
  if isinstance(element, Array): return element.ndim == 0
  return bool(np.isscalar(element))


def _at_least(minimum: int, arrays: tuple[Any, ...], expand: Any) -> Any:
  results = []
  for a in arrays:
    x = _as_array(a)
    results.append(expand(x) if x.ndim < minimum else x)
  return results[0] if len(results) == 1 else results


def atleast_1d(*arys: Any) -> Any:
  """Each argument as an array of at least one dimension (0-d becomes shape (1,)); one array, or a list of them."""
  return _at_least(1, arys, lambda x: reshape(x, (1,)))


def atleast_2d(*arys: Any) -> Any:
  """Each argument with at least two dimensions: 0-d -> (1, 1), (n,) -> (1, n)."""
  return _at_least(2, arys, lambda x: reshape(x, (1,) * (2 - x.ndim) + x.shape))


def atleast_3d(*arys: Any) -> Any:
  """Each argument with at least three dimensions: 0-d -> (1, 1, 1), (n,) -> (1, n, 1), (m, n) -> (m, n, 1)."""
  def expand(x: Array) -> Array:
    return reshape(x, {0: (1, 1, 1), 1: (1, x.size, 1)}.get(x.ndim, x.shape + (1,)))
  return _at_least(3, arys, expand)


def _as_list(tup: Any, name: str) -> list[Any]:
  if isinstance(tup, Array): return list(tup)  # iterating splits along axis 0, as JAX
  if not isinstance(tup, (list, tuple)): raise TypeError(f"{name} requires a sequence of arrays, got {type(tup)}")
  return list(tup)


@staged(static_argnames=("dtype",))
def vstack(tup: Sequence[Any], dtype: Any = None) -> Array:
  """Stack arrays vertically: 1-D arrays become rows (`atleast_2d`), then concatenate along axis 0."""
  return concatenate([atleast_2d(a) for a in _as_list(tup, "vstack")], 0, dtype)


@staged(static_argnames=("dtype",))
def hstack(tup: Sequence[Any], dtype: Any = None) -> Array:
  """Stack arrays horizontally: along axis 0 for 1-D arrays, along axis 1 otherwise."""
  arrays = [atleast_1d(a) for a in _as_list(tup, "hstack")]
  return concatenate(arrays, 0 if arrays and arrays[0].ndim == 1 else 1, dtype)


@staged()
def column_stack(tup: Sequence[Any]) -> Array:
  """Stack 1-D arrays as columns of a 2-D array (2-D arrays are taken as they are), along axis 1."""
  arrays = [_as_array(a) for a in _as_list(tup, "column_stack")]
  return concatenate([reshape(a, (a.size, 1)) if a.ndim < 2 else a for a in arrays], 1)


@staged(static_argnames=("dtype",))
def dstack(tup: Sequence[Any], dtype: Any = None) -> Array:
  """Stack arrays along a third axis (`atleast_3d`, then concatenate along axis 2)."""
  return concatenate([atleast_3d(a) for a in _as_list(tup, "dstack")], 2, dtype)


@staged(static_argnames=("reps",))
def tile(A: Any, reps: int | Sequence[int]) -> Array:  # noqa: N803
  """`A` repeated `reps` times along each axis (reps longer than A.ndim adds leading axes; shorter applies to the
  trailing axes): a broadcast and a reshape, no copy until used."""
  x = _as_array(A)
  reps = (operator.index(reps),) if not isinstance(reps, (tuple, list)) else tuple(operator.index(r) for r in reps)
  if any(r < 0 for r in reps): raise ValueError(f"tile: negative repetitions are not allowed, got {reps}")
  ndim = max(len(reps), x.ndim)
  reps = (1,) * (ndim - len(reps)) + reps
  x = reshape(x, (1,) * (ndim - x.ndim) + x.shape)
  interleaved = tuple(d for pair in zip(reps, x.shape) for d in pair)
  spread = expand_raw(reshape(x, tuple(d for dim in x.shape for d in (1, dim))), interleaved)
  return reshape(spread, tuple(r * d for r, d in zip(reps, x.shape)))


@with_out_sharding
@staged(static_argnames=("repeats", "axis", "total_repeat_length"))
def repeat(a: Any, repeats: Any, axis: int | None = None, *, total_repeat_length: int | None = None) -> Array:
  """Each element repeated `repeats` times along `axis` (None: of the flattened array). `repeats` may be an array of
  per-element counts: then output position j takes the element whose cumulative count first exceeds j (a binary
  search and a gather); traced counts need `total_repeat_length` (the output length), as JAX."""
  x = _as_array(a)
  if not isinstance(repeats, (int, np.integer)):
    from tinyjax.numpy._indexing import take
    from tinyjax.numpy._searching import searchsorted
    from tinyjax.numpy._sorting import cumsum
    from tinyjax.trace.core import Tracer
    counts = asarray(repeats)
    if axis is None: x, axis = ravel(x), 0
    axis = canonicalize_axis(axis, x.ndim)
    if counts.ndim == 0 or counts.shape == (1,): counts = broadcast_to(counts.reshape(()), (x.shape[axis],))
    if counts.shape != (x.shape[axis],):
      raise ValueError(f"repeat: repeats of shape {counts.shape} must match the axis length {x.shape[axis]}")
    if total_repeat_length is None:
      if isinstance(counts, Tracer):
        counts.concrete("repeat with traced repeats (pass total_repeat_length=)")
      total_repeat_length = int(np.asarray(counts).sum())
    ends = cumsum(counts)
    source = searchsorted(ends, lax_shape.iota(np.int32, int(total_repeat_length)), side="right")
    return take(x, source, axis=axis, mode="clip")
  repeats = operator.index(repeats)
  if repeats < 0: raise ValueError(f"repeat: repeats may not be negative, got {repeats}")
  if axis is None: x, axis = ravel(x), 0
  axis = canonicalize_axis(axis, x.ndim)
  if total_repeat_length is not None and total_repeat_length != x.shape[axis] * repeats:
    raise ValueError(f"repeat: total_repeat_length={total_repeat_length} does not match {x.shape[axis]} * {repeats}")
  spread = expand_dims(x, axis + 1)
  spread = broadcast_to(spread, spread.shape[:axis + 1] + (repeats,) + spread.shape[axis + 2:])
  return reshape(spread, x.shape[:axis] + (x.shape[axis] * repeats,) + x.shape[axis + 1:])


@staged(static_argnames=("shift", "axis"))
def roll(a: Any, shift: Any, axis: int | Sequence[int] | None = None) -> Array:
  """Elements shifted by `shift` along `axis` (None: of the flattened array, reshaped back), wrapping around. An
  array `shift` (a traced one under jit included) shifts by a value known when the program runs: the array joined
  to itself along the axis, then a dynamic slice of it, as JAX does."""
  x = _as_array(a)
  if axis is None: return reshape(roll(ravel(x), shift, 0), x.shape)
  axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
  if isinstance(shift, Array) or isinstance(shift, (tuple, list)) and any(isinstance(s, Array) for s in shift):
    return _roll_dynamic(x, shift, axes)
  shifts = (shift,) if not isinstance(shift, (tuple, list)) else tuple(shift)
  if len(shifts) == 1: shifts = shifts * len(axes)
  if len(axes) == 1: axes = axes * len(shifts)
  if len(shifts) != len(axes): raise ValueError(f"roll: shift {shift} and axis {axis} have different lengths")
  for step, ax in zip(shifts, axes):
    ax = canonicalize_axis(ax, x.ndim)
    size = x.shape[ax]
    if size == 0: continue
    cut = (-operator.index(step)) % size
    if cut == 0: continue
    head = lax_shape.slice_in_dim(x, cut, size, axis=ax)
    tail = lax_shape.slice_in_dim(x, 0, cut, axis=ax)
    x = lax_shape.concatenate([head, tail], ax)
  return x


def _roll_dynamic(x: Array, shift: Any, axes: tuple[int, ...]) -> Array:
  """`roll` by shifts only known when the program runs (see `roll`)."""
  from tinyjax.lax._slicing import dynamic_slice_in_dim  # noqa: PLC0415
  from tinyjax.numpy._elementwise import remainder, subtract  # noqa: PLC0415
  shifts = asarray(shift)
  if not dtypes.issubdtype(shifts.dtype, np.integer):
    raise TypeError(f"roll: shift must be an integer or an array of integers, got {shifts.dtype.name}")
  if shifts.ndim > 1: raise ValueError(f"roll: shift must be a scalar or 1-D, got shape {shifts.shape}")
  count = max(len(axes), shifts.size if shifts.ndim else 1)
  if len(axes) not in (1, count) or shifts.ndim and shifts.size not in (1, count):
    raise ValueError(f"roll: shift of shape {shifts.shape} and axis {axes} have different lengths")
  axes = axes * count if len(axes) == 1 else axes
  for i, ax in enumerate(axes):
    ax = canonicalize_axis(ax, x.ndim)
    size = x.shape[ax]
    if size == 0: continue
    step = shifts if not shifts.ndim else shifts[i if shifts.size > 1 else 0]
    start = subtract(size, remainder(step, size))  # (in [1, size]: the doubled array from there is the rolled one)
    x = dynamic_slice_in_dim(lax_shape.concatenate([x, x], ax), start, size, axis=ax)
  return x


@staged(static_argnames=("n", "axis"))
def diff(a: Any, n: int = 1, axis: int = -1, prepend: Any = None, append: Any = None) -> Array:
  """The n-th discrete difference along `axis`: a[1:] - a[:-1], n times (bools: a[1:] != a[:-1]), after `prepend`
  and `append` (scalars broadcast to one slice) are joined to `a` along `axis`."""
  from tinyjax.numpy._elementwise import not_equal, subtract  # noqa: PLC0415
  x = _as_array(a)
  n = operator.index(n)
  if n < 0: raise ValueError(f"diff: order must be non-negative, got {n}")
  if x.ndim == 0: raise ValueError("diff requires input that is at least one dimensional")
  axis = canonicalize_axis(axis, x.ndim)
  if prepend is not None or append is not None:
    def edge(value: Any) -> Array:
      value = _as_array(value)
      if value.ndim == 0: value = broadcast_to(value, tuple(1 if i == axis else d for i, d in enumerate(x.shape)))
      return value
    x = concatenate([part for part in (None if prepend is None else edge(prepend), x,
                                       None if append is None else edge(append)) if part is not None], axis=axis)
  for _ in range(n):
    size = x.shape[axis]
    upper = lax_shape.slice_in_dim(x, min(1, size), size, axis=axis)
    lower = lax_shape.slice_in_dim(x, 0, max(size - 1, 0), axis=axis)
    x = not_equal(upper, lower) if x.dtype == np.dtype(np.bool_) else subtract(upper, lower)
  return x


def _pad_widths(pad_width: Any, ndim: int) -> list[tuple[int, int]]:
  widths = np.asarray(pad_width)
  if widths.dtype.kind not in "iu": raise TypeError(f"pad_width must be integers, got {pad_width!r}")
  widths = np.broadcast_to(widths, (ndim, 2)) if widths.ndim < 2 or widths.shape[0] == 1 else widths
  if widths.shape != (ndim, 2): raise ValueError(f"pad_width {pad_width!r} does not fit an array of rank {ndim}")
  if (widths < 0).any(): raise ValueError(f"index can't contain negative values: pad_width={pad_width!r}")
  return [(int(lo), int(hi)) for lo, hi in widths]


@staged(static_argnames=("pad_width", "mode"))
def pad(array: Any, pad_width: Any, mode: str = "constant", constant_values: Any = 0) -> Array:
  """Pad each axis by (before, after) widths. Modes: 'constant' (scalar constant_values), 'edge', 'reflect',
  'symmetric', 'wrap' (the last three for widths up to the axis size)."""
  x = _as_array(array)
  widths = _pad_widths(pad_width, x.ndim)
  if mode == "constant":
    if np.ndim(constant_values) != 0 and not (isinstance(constant_values, Array) and constant_values.ndim == 0):
      raise NotImplementedError("pad: per-axis constant_values are not supported yet; pass a scalar")
    value = constant_values
    if isinstance(value, Array): value = cast(value, x.dtype, False)
    elif isinstance(value, (np.ndarray, np.generic)): value = value.item()
    if isinstance(value, (bool, int, float)) and value == 0 and not (isinstance(value, float) and
                                                                      math.copysign(1, value) < 0):
      return lax_shape.pad_raw(x, widths)
    from tinyjax.lax._base import full  # noqa: PLC0415
    if not isinstance(value, Array): value = full((), value if x.dtype.kind != "b" else bool(value), x.dtype)
    return lax_shape.pad(x, value, [(lo, hi, 0) for lo, hi in widths])
  for axis, (lo, hi) in enumerate(widths):
    size = x.shape[axis]
    if lo == hi == 0: continue
    if size == 0: raise ValueError(f"pad: can't extend empty axis {axis} using mode {mode!r}")
    pieces = [_edge_piece(x, axis, lo, True, mode), x, _edge_piece(x, axis, hi, False, mode)]
    x = lax_shape.concatenate([p for p in pieces if p.shape[axis] > 0], axis)
  return x


def _take_range(x: Array, axis: int, start: int, stop: int) -> Array:
  starts, limits = [0] * x.ndim, list(x.shape)
  starts[axis], limits[axis] = start, stop
  return lax_shape.shrink_raw(x, list(zip(starts, limits)))


def _edge_piece(x: Array, axis: int, width: int, before: bool, mode: str) -> Array:
  size = x.shape[axis]
  if width == 0: return _take_range(x, axis, 0, 0)
  if mode == "edge":
    edge = _take_range(x, axis, 0, 1) if before else _take_range(x, axis, size - 1, size)
    shape = list(x.shape)
    shape[axis] = width
    return expand_raw(edge, shape)
  limit = {"reflect": size - 1, "symmetric": size, "wrap": size}.get(mode)
  if limit is None: raise NotImplementedError(f"pad: mode {mode!r} is not supported")
  if width > limit:
    raise NotImplementedError(f"pad: mode {mode!r} with a width ({width}) larger than {limit} is not supported yet")
  if mode == "wrap":
    return _take_range(x, axis, size - width, size) if before else _take_range(x, axis, 0, width)
  offset = 1 if mode == "reflect" else 0
  piece = _take_range(x, axis, offset, offset + width) if before else _take_range(x, axis, size - offset - width,
                                                                                   size - offset)
  return lax_shape.flip_raw(piece, {axis})
