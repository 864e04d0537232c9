"""Shape and layout lax operations: reshape, transpose, broadcast, pad, slice, rev, concatenate, iota, select.

All are movement primitives (RESHAPE, PERMUTE, EXPAND, PAD, SHRINK, FLIP), which cost nothing until lowering turns
them into index arithmetic, plus WHERE where a pad value or a concatenation needs one. Strided slices and interior
padding use tinygrad's trick: pad to a multiple, reshape to split the axis, shrink away the extra rows.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.trace.sharding_types import reshape_spec
from tinyjax.lax._base import (BOOL, canonicalize_axis, cast, expand_raw, full as _full_const, is_array,
                               lax_operands, reshape_raw, to_array)
from tinyjax.lax._elementwise import _and, _lt, _max, _min, _where
from tinyjax.trace import ad, batching
from tinyjax.trace.core import Primitive, bind
from tinyjax.uop import Ops


# ------------------------------------------------------------------------------------------- primitives, unchecked

def permute_raw(x: Array, permutation: Sequence[int]) -> Array:
  permutation = tuple(int(p) for p in permutation)
  return x if permutation == tuple(range(x.ndim)) else bind(Ops.PERMUTE, x, arg=permutation, weak_type=x.weak_type)


def pad_raw(x: Array, padding: Sequence[tuple[int, int]]) -> Array:
  padding = tuple((int(lo), int(hi)) for lo, hi in padding)
  return x if all(p == (0, 0) for p in padding) else bind(Ops.PAD, x, arg=padding, weak_type=x.weak_type)


def shrink_raw(x: Array, bounds: Sequence[tuple[int, int]]) -> Array:
  bounds = tuple((int(lo), int(hi)) for lo, hi in bounds)
  if bounds == tuple((0, d) for d in x.shape): return x
  return bind(Ops.SHRINK, x, arg=bounds, weak_type=x.weak_type)


def flip_raw(x: Array, axes: Sequence[int]) -> Array:
  flags = tuple(i in axes and x.shape[i] > 1 for i in range(x.ndim))
  return bind(Ops.FLIP, x, arg=flags, weak_type=x.weak_type) if any(flags) else x


def strided_slice_raw(x: Array, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int]) -> Array:
  """x[start:limit:stride] on every axis, for in-bounds starts/limits and positive strides."""
  x = shrink_raw(x, list(zip(starts, limits)))
  if all(s == 1 for s in strides): return x
  out_sizes = [-(-d // s) for d, s in zip(x.shape, strides)]  # ceil(length / stride)
  x = pad_raw(x, [(0, n * s - d) for d, n, s in zip(x.shape, out_sizes, strides)])
  x = reshape_raw(x, [v for n, s in zip(out_sizes, strides) for v in (n, s)])
  x = shrink_raw(x, [b for n in out_sizes for b in ((0, n), (0, 1))])
  return reshape_raw(x, out_sizes)


def interleave_raw(pieces: Sequence[Array], axis: int, length: int) -> Array:
  """pieces[0][0], pieces[1][0], ..., pieces[0][1], pieces[1][1], ... along `axis` (pieces of one shape), the first
  `length` of them."""
  shape = pieces[0].shape
  stacked = concatenate([reshape_raw(p, (*shape[:axis + 1], 1, *shape[axis + 1:])) for p in pieces], axis + 1)
  merged = reshape_raw(stacked, (*shape[:axis], shape[axis] * len(pieces), *shape[axis + 1:]))
  if merged.shape[axis] == length: return merged
  bounds = [(0, size) for size in merged.shape]
  bounds[axis] = (0, length)
  return shrink_raw(merged, bounds)


def _interior_pad_raw(x: Array, interior: Sequence[int]) -> Array:
  """Insert `interior[i]` zeros between neighbouring elements along each axis i."""
  if all(i == 0 for i in interior): return x
  out_shape = [d + max(d - 1, 0) * i for d, i in zip(x.shape, interior)]
  if x.size == 0: return _full_const(out_shape, 0, x.dtype, x.weak_type)
  x = reshape_raw(x, [v for d in x.shape for v in (d, 1)])
  x = pad_raw(x, [p for i in interior for p in ((0, 0), (0, i))])
  x = reshape_raw(x, [d * (1 + i) for d, i in zip(x.shape[::2], interior)])
  return shrink_raw(x, [(0, d) for d in out_shape])


# ---------------------------------------------------------------------------------------------- public

def reshape(operand: Any, new_sizes: Sequence[int], dimensions: Sequence[int] | None = None) -> Array:
  """Reshape to `new_sizes` (same number of elements), after transposing by `dimensions` if given."""
  x = to_array(operand)
  new_sizes = tuple(int(d) for d in new_sizes)
  if math.prod(new_sizes) != x.size:
    raise TypeError(f"reshape total size must be unchanged, got new_sizes {new_sizes} (size {math.prod(new_sizes)}) "
                    f"for shape {x.shape} (size {x.size})")
  if dimensions is not None: x = transpose(x, dimensions)
  reshape_spec(x, new_sizes)
  return reshape_raw(x, new_sizes)


def transpose(operand: Any, permutation: Sequence[int]) -> Array:
  """Permute the axes: output axis i is input axis permutation[i]."""
  x = to_array(operand)
  permutation = tuple(int(p) for p in permutation)
  if sorted(permutation) != list(range(x.ndim)):
    raise TypeError(f"transpose permutation isn't a permutation of operand dimensions, got permutation "
                     f"{permutation} for operand shape {x.shape}")
  return permute_raw(x, permutation)


def broadcast_in_dim(operand: Any, shape: Sequence[int], broadcast_dimensions: Sequence[int]) -> Array:
  """Broadcast to `shape`: operand axis i becomes output axis broadcast_dimensions[i] (size equal or 1)."""
  x = to_array(operand)
  shape, dims = tuple(int(d) for d in shape), tuple(int(d) for d in broadcast_dimensions)
  if len(dims) != x.ndim or any(x.shape[i] not in (1, shape[d]) for i, d in enumerate(dims)) or \
      list(dims) != sorted(set(dims)):
    raise TypeError(f"broadcast_in_dim: cannot broadcast operand of shape {x.shape} to {shape} with "
                    f"broadcast_dimensions {dims}")
  keep = [1] * len(shape)
  for i, d in enumerate(dims): keep[d] = x.shape[i]
  return expand_raw(reshape_raw(x, keep), shape)


def squeeze(array: Any, dimensions: Sequence[int]) -> Array:
  """Remove the given axes, each of size 1 (ValueError otherwise)."""
  x = to_array(array)
  axes = {canonicalize_axis(d, x.ndim) for d in dimensions}
  for axis in axes:
    if x.shape[axis] != 1:
      raise ValueError(f"cannot select an axis to squeeze out which has size not equal to one, got shape={x.shape} "
                       f"and dimensions={tuple(dimensions)}")
  return reshape_raw(x, [d for i, d in enumerate(x.shape) if i not in axes])


def expand_dims(array: Any, dimensions: Sequence[int]) -> Array:
  """Insert size-1 axes at `dimensions` (positions in the output)."""
  x = to_array(array)
  ndim = x.ndim + len(dimensions)
  axes = sorted(canonicalize_axis(d, ndim) for d in dimensions)
  shape = list(x.shape)
  for axis in axes: shape.insert(axis, 1)
  return reshape_raw(x, shape)


def pad(operand: Any, padding_value: Any, padding_config: Sequence[tuple[int, int, int]]) -> Array:
  """Pad each axis with (low, high, interior) copies of `padding_value` (a scalar of the operand's dtype).

  Negative low/high crop, as in lax; interior inserts that many values between neighbouring elements."""
  x, value = to_array(operand), to_array(padding_value)
  if value.ndim != 0: raise TypeError(f"lax.pad: padding_value must be a scalar, got shape {value.shape}")
  if value.dtype != x.dtype:
    if not (value.weak_type and dtypes.result_type(x.dtype, value) == x.dtype):
      raise TypeError(f"lax.pad requires arguments to have the same dtypes, got {x.dtype.name}, {value.dtype.name}.")
    value = cast(value, x.dtype)
  config = [tuple(int(v) for v in c) for c in padding_config]
  if len(config) != x.ndim:
    raise ValueError(f"lax.pad: padding_config has {len(config)} entries for an operand of rank {x.ndim}")
  if any(interior < 0 for _, _, interior in config): raise ValueError("lax.pad: interior padding must be >= 0")
  mask = _full_const(x.shape, True, BOOL)
  results = []
  for array in (x, mask):
    array = _interior_pad_raw(array, [interior for _, _, interior in config])
    array = pad_raw(array, [(max(lo, 0), max(hi, 0)) for lo, hi, _ in config])
    bounds = []
    for size, (lo, hi, _) in zip(array.shape, config):
      start, end = max(-lo, 0), size - max(-hi, 0)
      if end < start: raise ValueError(f"lax.pad: negative padding {padding_config} crops more than operand {x.shape}")
      bounds.append((start, end))
    results.append(shrink_raw(array, bounds))
  padded, mask = results
  return _where(mask, padded, expand_raw(value, padded.shape))



def slice(operand: Any, start_indices: Sequence[int], limit_indices: Sequence[int],  # noqa: A001
          strides: Sequence[int] | None = None) -> Array:
  """operand[start:limit:stride] on every axis (0 <= start <= limit <= size, strides >= 1)."""
  x = to_array(operand)
  strides = [1] * x.ndim if strides is None else [int(s) for s in strides]
  starts, limits = [int(s) for s in start_indices], [int(s) for s in limit_indices]
  if not len(starts) == len(limits) == len(strides) == x.ndim:
    raise TypeError(f"slice: start_indices, limit_indices and strides must have one entry per axis of {x.shape}")
  for start, limit, stride, size in zip(starts, limits, strides, x.shape):
    if not 0 <= start <= limit <= size or stride < 1:
      raise TypeError(f"slice: invalid start_indices {tuple(starts)}, limit_indices {tuple(limits)}, strides "
                      f"{tuple(strides)} for operand shape {x.shape}")
  return strided_slice_raw(x, starts, limits, strides)


def slice_in_dim(operand: Any, start_index: int | None, limit_index: int | None, stride: int = 1,
                 axis: int = 0) -> Array:
  """`slice` along one axis: operand[..., start:limit:stride, ...] (None: the axis' start or end; negative indices
  count from the end)."""
  x = to_array(operand)
  axis = canonicalize_axis(axis, x.ndim)
  size = x.shape[axis]
  start = 0 if start_index is None else int(start_index) + (size if int(start_index) < 0 else 0)
  limit = size if limit_index is None else int(limit_index) + (size if int(limit_index) < 0 else 0)
  starts, limits, strides = [0] * x.ndim, list(x.shape), [1] * x.ndim
  starts[axis], limits[axis], strides[axis] = start, limit, int(stride)
  return slice(x, starts, limits, strides)


def rev(operand: Any, dimensions: Sequence[int]) -> Array:
  """Reverse the order of elements along `dimensions`."""
  x = to_array(operand)
  return flip_raw(x, {canonicalize_axis(d, x.ndim) for d in dimensions})


def concatenate(operands: Sequence[Any], dimension: int) -> Array:
  """Join arrays of one dtype along `dimension` (other axes equal). Built as pads selected by padded masks."""
  arrays = [to_array(x) for x in operands]
  if not arrays: raise ValueError("concatenate requires at least one operand")
  first = arrays[0]
  axis = canonicalize_axis(dimension, first.ndim) if first.ndim else None
  if axis is None: raise TypeError("concatenate does not accept 0-dimensional operands")
  for array in arrays:
    if array.dtype != first.dtype:
      raise TypeError(f"lax.concatenate requires arguments to have the same dtypes, got "
                      f"{', '.join(a.dtype.name for a in arrays)}.")
    if array.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(array.shape, first.shape)) if i != axis):
      raise TypeError(f"Cannot concatenate arrays with shapes that differ in dimensions other than the one being "
                      f"concatenated: concatenating along dimension {axis} for shapes "
                      f"{', '.join(str(a.shape) for a in arrays)}.")
  arrays = [a for a in arrays if a.shape[axis] > 0] or arrays[:1]
  if len(arrays) == 1: return arrays[0]
  return concatenate_p.bind(*arrays, dimension=axis)


def _concatenate_impl(*arrays: Array, dimension: int) -> Array:
  axis = dimension
  total = sum(a.shape[axis] for a in arrays)
  offsets = np.cumsum([0] + [a.shape[axis] for a in arrays]).tolist()
  result = None
  for array, offset in zip(reversed(arrays), reversed(offsets[:-1])):
    padding = [(0, 0)] * array.ndim
    padding[axis] = (offset, total - offset - array.shape[axis])
    padded = pad_raw(array, padding)
    if result is None:
      result = padded
      continue
    mask = pad_raw(_full_const(array.shape, True, BOOL), padding)
    result = _where(mask, padded, result)
  weak = all(a.weak_type for a in arrays)
  return result if result.weak_type == weak else cast(result, result.dtype, weak)


# a primitive for its name in printed jaxprs; transformations go through its decomposition (pads and selects)
concatenate_p = Primitive("concatenate", _concatenate_impl)


def iota(dtype: Any, size: int) -> Array:
  """[0, 1, ..., size - 1] in `dtype`, built without host data: a leaf that the kernels reading it compute from
  their loop index (lower/schedule.py), so it is never stored."""
  dtype = dtypes.canonicalize_dtype(dtypes.dtype(dtype))
  size = int(size)
  if size <= 1: return _full_const((size,), 0, dtype)
  return bind(Ops.IOTA, arg=size, dtype=dtype)


def iota_along(dtype: Any, shape: Sequence[int], axis: int) -> Array:
  """An array of `shape` whose values count 0, 1, ... along `axis` (iota broadcast over the other axes)."""
  shape = tuple(shape)
  keep = [1] * len(shape)
  keep[axis] = shape[axis]
  return expand_raw(reshape_raw(iota(dtype, shape[axis]), keep), shape)


def full(shape: Sequence[int], fill_value: Any, dtype: Any = None) -> Array:
  """An array of `shape` filled with `fill_value` (dtype: `dtype`, else the fill value's, weak for Python scalars)."""
  shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
  if any(d < 0 for d in shape): raise ValueError(f"negative dimensions are not allowed: {shape}")
  if is_array(fill_value):
    if fill_value.ndim: raise TypeError(f"full must be called with scalar fill_value, got shape {fill_value.shape}")
    value = fill_value if dtype is None else cast(fill_value, dtypes.canonicalize_dtype(dtypes.dtype(dtype)), False)
    return expand_raw(value, shape)
  if dtype is None:
    out_dtype, weak = dtypes.result_type(fill_value, return_weak_type_flag=True)
  else:
    out_dtype, weak = dtypes.check_user_dtype_supported(dtype, "full"), False
  if isinstance(fill_value, (np.ndarray, np.generic)):
    if np.ndim(fill_value): raise TypeError("full must be called with scalar fill_value")
    fill_value = fill_value.item()
  return _full_const(shape, fill_value, out_dtype, weak)


def full_like(x: Any, fill_value: Any, dtype: Any = None, shape: Sequence[int] | None = None) -> Array:
  """`full` with the shape and dtype of `x` unless given (weak if x is weak and no dtype is given)."""
  out_shape = tuple(np.shape(x)) if shape is None else tuple(shape)
  if dtype is None:
    out_dtype = dtypes.canonicalize_dtype(dtypes.dtype(x))
    weak = bool(getattr(x, "weak_type", False))
    if is_array(fill_value): return expand_raw(cast(fill_value, out_dtype, weak), out_shape)
    if isinstance(fill_value, (np.ndarray, np.generic)): fill_value = fill_value.item()
    return _full_const(out_shape, fill_value, out_dtype, weak)
  return full(out_shape, fill_value, dtype)


def _select_n_impl(which: Array, *cases: Array) -> Array:
  if which.dtype == BOOL: return _where(which, cases[-1], cases[0])
  result = cases[-1]
  for index in range(len(cases) - 2, -1, -1):
    result = _where(_lt(which, _full_const(which.shape, index + 1, which.dtype)), cases[index], result)
  return result


select_n_p = Primitive("select_n", _select_n_impl)


def select(pred: Any, on_true: Any, on_false: Any) -> Array:
  """`on_true` where the bool `pred` holds, else `on_false` (elementwise; same shapes and dtypes)."""
  return select_n(pred, on_false, on_true)


def select_n(which: Any, *cases: Any) -> Array:
  """cases[which] elementwise: `which` is bool (two cases) or int32 (any number of cases); same shapes."""
  if not cases: raise ValueError("select_n requires at least one case")
  arrays = lax_operands("select_n", *cases)
  which = to_array(which)
  if which.shape not in ((), arrays[0].shape):
    raise TypeError(f"select_n: which must be scalar or have the shape of the cases, got {which.shape} and "
                    f"{arrays[0].shape}")
  which = expand_raw(which, arrays[0].shape)
  if which.dtype == BOOL:
    if len(arrays) > 2: raise TypeError("select_n with a bool predicate takes at most 2 cases")
  elif which.dtype.kind not in "iu": raise TypeError(f"select_n: which must be bool or integer, got {which.dtype}")
  if len(arrays) == 1: return arrays[0]
  return select_n_p.bind(which, *arrays)


clamp_p = Primitive("clamp", lambda lo, x, hi: _min(_max(x, lo), hi))


def clamp(min: Any, x: Any, max: Any) -> Array:  # noqa: A002
  """Elementwise min(max(x, min), max) (NaN propagates); min and max are scalars or have x's shape."""
  x = to_array(x)
  lo, x_, hi = lax_operands("clamp", _match_shape(min, x), x, _match_shape(max, x))
  return clamp_p.bind(lo, x_, hi)


def _match_shape(bound: Any, x: Array) -> Any:
  if is_array(bound) and bound.ndim == 0 and x.ndim: return expand_raw(bound, x.shape)
  return bound


def stop_gradient(x: Any) -> Any:
  """The value of `x` (a pytree of arrays), treated as a constant by differentiation: its derivative is zero.
  Integer and bool leaves are returned as they are."""
  def stop(leaf: Any) -> Any:
    leaf = to_array(leaf)
    return ad.stop_gradient_p.bind(leaf) if dtypes.is_inexact(leaf.dtype) else leaf
  return tree_util.tree_map(stop, x)


# ---------------------------------------------------------------------------------------------- derivatives

def _select_n_rule(primals, tangents, out):
  which, *cases = primals
  if all(t is None for t in tangents[1:]): return None
  return select_n_p.bind(which, *(ad.instantiate(t, case) for t, case in zip(tangents[1:], cases)))


def _clamp_rule(primals, tangents, out):
  """JAX's: the operand's tangent strictly inside (lo, hi), lo's below it, hi's above it (a bound tied with the
  operand passes no tangent)."""
  (lo, x, hi), (t_lo, t_x, t_hi) = primals, tangents
  zero = ad.zeros_like(x)
  return ad.sum_tangents(
    None if t_lo is None else _where(_and(_lt(x, lo), _lt(lo, hi)), t_lo, zero),
    None if t_x is None else _where(_and(_lt(lo, x), _lt(x, hi)), t_x, zero),
    None if t_hi is None else _where(_lt(hi, x), t_hi, zero))


ad.jvp_rules[select_n_p] = _select_n_rule
ad.jvp_rules[clamp_p] = _clamp_rule


batching.defelementwise(select_n_p, clamp_p)
