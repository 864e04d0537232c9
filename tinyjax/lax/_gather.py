"""XLA's general gather and scatter with dimension numbers (`lax.gather`, `lax.scatter`, `scatter_add`, `_mul`,
`_min`, `_max`, `scatter_apply`), as movement ops around the GATHER / SCATTER Ops.

Those Ops index the operand's first k axes with (*batch, k) starts and copy (or combine) whole windows whose other axes
span the operand. XLA's form is mapped onto them: the indexed axes (`start_index_map`, `scatter_dims_to_operand_dims`)
are permuted to the front, the other axes are cut to the slice sizes (their windows start at 0), batching dimensions
become one more index column counting along the indices' batch axis, and the result's axes are permuted and reshaped
into XLA's layout (offset / update window dims placed as the dimension numbers say, collapsed / inserted axes of size
1). Gradients and vmap come from the Ops' rules.
"""
from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import cast, expand_raw, full, reshape_raw, to_array
from tinyjax.lax._elementwise import _and, _lt, _where
from tinyjax.lax._shape import iota_along, pad_raw, permute_raw, shrink_raw
from tinyjax.lax._slicing import _expand_batch, gather_raw, index_columns, scatter_raw, stack_columns, window_fits


class GatherDimensionNumbers(NamedTuple):
  """How the axes of a gather's operand, start indices and output relate (XLA's GatherDimensionNumbers).
  offset_dims: the output axes that hold the slice's (uncollapsed) axes; collapsed_slice_dims: operand axes of slice
  size 1 left out of the output; start_index_map: the operand axis each index column starts; operand_batching_dims /
  start_indices_batching_dims: operand axes indexed by the position along an indices batch axis."""
  offset_dims: tuple[int, ...]
  collapsed_slice_dims: tuple[int, ...]
  start_index_map: tuple[int, ...]
  operand_batching_dims: tuple[int, ...] = ()
  start_indices_batching_dims: tuple[int, ...] = ()


class ScatterDimensionNumbers(NamedTuple):
  """How the axes of a scatter's operand, indices and updates relate (XLA's ScatterDimensionNumbers).
  update_window_dims: the updates axes that are window axes; inserted_window_dims: operand axes with an implicit window
  of size 1; scatter_dims_to_operand_dims: the operand axis each index column starts; operand_batching_dims /
  scatter_indices_batching_dims: as gather's."""
  update_window_dims: tuple[int, ...]
  inserted_window_dims: tuple[int, ...]
  scatter_dims_to_operand_dims: tuple[int, ...]
  operand_batching_dims: tuple[int, ...] = ()
  scatter_indices_batching_dims: tuple[int, ...] = ()


class GatherScatterMode(enum.Enum):
  """Out-of-bounds windows: CLIP clamps the start so the window fits; FILL_OR_DROP fills a gathered window with
  `fill_value` and drops a scattered one; PROMISE_IN_BOUNDS: clamped for gathers, dropped for scatters."""
  CLIP = enum.auto()
  FILL_OR_DROP = enum.auto()
  PROMISE_IN_BOUNDS = enum.auto()

  @staticmethod
  def from_any(mode: Any) -> GatherScatterMode:
    if isinstance(mode, GatherScatterMode): return mode
    if mode == "clip": return GatherScatterMode.CLIP
    if mode is None or mode in ("fill", "drop"): return GatherScatterMode.FILL_OR_DROP
    if mode == "promise_in_bounds": return GatherScatterMode.PROMISE_IN_BOUNDS
    raise ValueError(f'Unknown gather mode "{mode}": use "clip", "fill", "drop" or "promise_in_bounds"')


def _axes(name: str, what: str, values: Sequence[int], ndim: int) -> tuple[int, ...]:
  values = tuple(int(v) for v in values)
  if any(not 0 <= v < ndim for v in values) or len(set(values)) != len(values):
    raise TypeError(f"{name}: {what} must be distinct axes in [0, {ndim}), got {values}")
  return values


def _indices(name: str, start_indices: Any) -> Array:
  indices = to_array(start_indices)
  if indices.dtype.kind not in "iu":
    raise TypeError(f"{name}: indices must have an integer type, got {indices.dtype.name}")
  if indices.ndim == 0: raise TypeError(f"{name}: indices must have at least one axis (the index vector, last)")
  return indices


def _with_batching_columns(indices: Array, index_map: tuple[int, ...], operand_batching: tuple[int, ...],
                           indices_batching: tuple[int, ...]) -> tuple[Array, tuple[int, ...]]:
  """Indices with one more column per batching pair, counting along that indices batch axis, and the index map
  extended with the operand axes they index."""
  if not operand_batching: return indices, index_map
  batch_shape = indices.shape[:-1]
  columns = index_columns(indices) if indices.shape[-1] else []
  columns += [cast(iota_along(np.int32, batch_shape, axis), indices.dtype, False) for axis in indices_batching]
  return stack_columns(columns), index_map + operand_batching


def _default_fill(dtype: np.dtype) -> Any:
  if dtypes.is_floating(dtype): return np.nan
  if dtypes.is_complex(dtype): return complex(np.nan, np.nan)
  if dtype == np.bool_: return True
  return np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max


def gather(operand: Any, start_indices: Any, dimension_numbers: GatherDimensionNumbers, slice_sizes: Sequence[int], *,
           unique_indices: bool = False, indices_are_sorted: bool = False, mode: Any = None,
           fill_value: Any = None) -> Array:
  """XLA's Gather: for each index vector (the last axis of `start_indices`), the slice of `operand` of sizes
  `slice_sizes` starting there, laid out as `dimension_numbers` say. Out-of-bounds slices: `mode` (default: clamped
  as 'clip'; 'fill' fills them with `fill_value`, NaN for floats by default)."""
  name = "gather"
  x, indices = to_array(operand), _indices(name, start_indices)
  numbers = GatherDimensionNumbers(*dimension_numbers)
  mode = GatherScatterMode.PROMISE_IN_BOUNDS if mode is None else GatherScatterMode.from_any(mode)
  sizes = tuple(int(s) for s in slice_sizes)
  if len(sizes) != x.ndim:
    raise TypeError(f"{name}: slice_sizes must have one entry per operand axis ({x.ndim}), got {sizes}")
  if any(not 0 <= s <= d for s, d in zip(sizes, x.shape)):
    raise TypeError(f"{name}: slice_sizes {sizes} must lie in [0, operand shape {x.shape}]")
  index_map = _axes(name, "start_index_map", numbers.start_index_map, x.ndim)
  if len(index_map) != indices.shape[-1]:
    raise TypeError(f"{name}: start_index_map has {len(index_map)} entries but the index vectors (the last axis of "
                    f"start_indices, shape {indices.shape}) have {indices.shape[-1]}")
  operand_batching = _axes(name, "operand_batching_dims", numbers.operand_batching_dims, x.ndim)
  indices_batching = _axes(name, "start_indices_batching_dims", numbers.start_indices_batching_dims,
                           indices.ndim - 1)
  if len(operand_batching) != len(indices_batching):
    raise TypeError(f"{name}: operand_batching_dims and start_indices_batching_dims must have the same length")
  collapsed = _axes(name, "collapsed_slice_dims", numbers.collapsed_slice_dims, x.ndim)
  if any(sizes[d] > 1 for d in collapsed + operand_batching):
    raise TypeError(f"{name}: collapsed and batching operand axes must have slice size <= 1, got slice_sizes {sizes}")
  batch_shape = indices.shape[:-1]
  offset_axes = [d for d in range(x.ndim) if d not in collapsed and d not in operand_batching]
  out_rank = len(batch_shape) + len(offset_axes)
  offset_dims = _axes(name, "offset_dims", numbers.offset_dims, out_rank)
  if len(offset_dims) != len(offset_axes) or list(offset_dims) != sorted(offset_dims):
    raise TypeError(f"{name}: offset_dims must be {len(offset_axes)} sorted output axes, got {offset_dims}")
  indices, index_map = _with_batching_columns(indices, index_map, operand_batching, indices_batching)
  collapsed += operand_batching
  # the output, in XLA's layout
  out_shape = [0] * out_rank
  batch_positions = [p for p in range(out_rank) if p not in offset_dims]
  for p, d in zip(batch_positions, batch_shape): out_shape[p] = d
  for p, d in zip(offset_dims, offset_axes): out_shape[p] = sizes[d]
  if 0 in sizes or 0 in batch_shape or x.size == 0:
    return full(tuple(out_shape), 0, x.dtype, x.weak_type)
  rest = [d for d in range(x.ndim) if d not in index_map]
  sliced = shrink_raw(x, [(0, sizes[d]) if d in rest else (0, x.shape[d]) for d in range(x.ndim)])
  order = list(index_map) + rest
  window = tuple(sizes[d] for d in index_map)
  gathered = gather_raw(permute_raw(sliced, order), indices, window)  # (*batch, *slice axes in `order`)
  if mode is GatherScatterMode.FILL_OR_DROP and index_map:  # (no index columns: every window fits)
    fits = _expand_batch(window_fits(indices, [x.shape[d] for d in index_map], window), gathered.shape)
    fill = _default_fill(x.dtype) if fill_value is None else fill_value
    gathered = _where(fits, gathered, full(gathered.shape, fill, x.dtype))
  n_batch = len(batch_shape)
  kept = [i for i, d in enumerate(order) if d not in collapsed]  # slice axes left after collapsing, in `order`
  kept_sorted = sorted(kept, key=lambda i: order[i])  # ... in operand order (XLA's offset order)
  gathered = reshape_raw(gathered, (*batch_shape, *(gathered.shape[n_batch + i] for i in kept)))
  permutation = [0] * out_rank
  for p, b in zip(batch_positions, range(n_batch)): permutation[p] = b
  for p, i in zip(offset_dims, kept_sorted): permutation[p] = n_batch + kept.index(i)
  return permute_raw(gathered, permutation)


def _scatter(name: str, combine: str, operand: Any, scatter_indices: Any, updates: Any,
             dimension_numbers: ScatterDimensionNumbers, unique_indices: bool, mode: Any) -> Array:
  x, indices = to_array(operand), _indices(name, scatter_indices)
  values = to_array(updates)
  if values.dtype != x.dtype:
    raise TypeError(f"{name}: updates ({values.dtype.name}) must have the operand's dtype ({x.dtype.name})")
  numbers = ScatterDimensionNumbers(*(tuple(v) for v in dimension_numbers))
  mode = GatherScatterMode.from_any(mode)
  index_map = _axes(name, "scatter_dims_to_operand_dims", numbers.scatter_dims_to_operand_dims, x.ndim)
  if len(index_map) != indices.shape[-1]:
    raise TypeError(f"{name}: scatter_dims_to_operand_dims has {len(index_map)} entries but the index vectors (the "
                    f"last axis of scatter_indices, shape {indices.shape}) have {indices.shape[-1]}")
  window_dims = _axes(name, "update_window_dims", numbers.update_window_dims, values.ndim)
  inserted = _axes(name, "inserted_window_dims", numbers.inserted_window_dims, x.ndim)
  operand_batching = _axes(name, "operand_batching_dims", numbers.operand_batching_dims, x.ndim)
  indices_batching = _axes(name, "scatter_indices_batching_dims", numbers.scatter_indices_batching_dims,
                           indices.ndim - 1)
  if len(operand_batching) != len(indices_batching):
    raise TypeError(f"{name}: operand_batching_dims and scatter_indices_batching_dims must have the same length")
  window_axes = [d for d in range(x.ndim) if d not in inserted and d not in operand_batching]
  if len(window_dims) != len(window_axes):
    raise TypeError(f"{name}: {len(window_dims)} update_window_dims for {len(window_axes)} operand window axes")
  scatter_dims = [d for d in range(values.ndim) if d not in window_dims]
  batch_shape = indices.shape[:-1]
  if tuple(values.shape[d] for d in scatter_dims) != tuple(batch_shape):
    raise TypeError(f"{name}: the updates' scatter axes {tuple(values.shape[d] for d in scatter_dims)} must match the "
                    f"indices' batch shape {tuple(batch_shape)}")
  sizes = [1] * x.ndim
  for axis, d in zip(window_axes, window_dims): sizes[axis] = values.shape[d]
  if any(s > d for s, d in zip(sizes, x.shape)):
    raise TypeError(f"{name}: update window {tuple(sizes)} is larger than the operand {x.shape}")
  if 0 in batch_shape or 0 in sizes or x.size == 0: return x
  indices, index_map = _with_batching_columns(indices, index_map, operand_batching, indices_batching)
  # updates as (*batch, *window over every operand axis in `order`)
  values = permute_raw(values, scatter_dims + list(window_dims))
  full_window = [0] * x.ndim
  for axis, size in enumerate(sizes): full_window[axis] = size
  values = reshape_raw(values, (*batch_shape, *full_window))  # inserted / batching axes: size 1, in operand order
  rest = [d for d in range(x.ndim) if d not in index_map]
  order = list(index_map) + rest
  n_batch = len(batch_shape)
  values = permute_raw(values, list(range(n_batch)) + [n_batch + d for d in order])
  region = [(0, sizes[d]) if d in rest else (0, x.shape[d]) for d in range(x.ndim)]
  target = shrink_raw(x, region)
  window = tuple(sizes[d] for d in index_map)
  scattered = scatter_raw(permute_raw(target, order), indices, values, combine, window, unique_indices,
                          mode is GatherScatterMode.CLIP)
  scattered = permute_raw(scattered, list(np.argsort(order)))
  if target.shape == x.shape: return scattered
  # the window covers only the start of some non-indexed axes: the rest of the operand is kept
  padded = pad_raw(scattered, [(0, d - hi) for d, (_, hi) in zip(x.shape, region)])
  inside = None
  for axis, (_, hi) in enumerate(region):
    if hi == x.shape[axis]: continue
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    along = _lt(reshape_raw(iota_along(np.int32, (x.shape[axis],), 0), tuple(shape)), full(tuple(shape), hi, np.int32))
    along = expand_raw(along, x.shape)
    inside = along if inside is None else _and(inside, along)
  return _where(inside, padded, x)


def scatter(operand: Any, scatter_indices: Any, updates: Any, dimension_numbers: ScatterDimensionNumbers, *,
            indices_are_sorted: bool = False, unique_indices: bool = False, mode: Any = None) -> Array:
  """XLA's Scatter, overwriting: `operand` with each window of `updates` written at its index vector (duplicates: the
  last one wins here; XLA leaves the order unspecified). Out-of-bounds windows are dropped (`mode='clip'` clamps)."""
  return _scatter("scatter", "set", operand, scatter_indices, updates, dimension_numbers, unique_indices, mode)


def scatter_add(operand: Any, scatter_indices: Any, updates: Any, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode: Any = None) -> Array:
  """`scatter` adding the updates (duplicates accumulate)."""
  return _scatter("scatter_add", "add", operand, scatter_indices, updates, dimension_numbers, unique_indices, mode)


def scatter_sub(operand: Any, scatter_indices: Any, updates: Any, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode: Any = None) -> Array:
  """`scatter` subtracting the updates."""
  from tinyjax.lax._elementwise import _neg
  return _scatter("scatter_sub", "add", operand, scatter_indices, _neg(to_array(updates)), dimension_numbers,
                  unique_indices, mode)


def scatter_mul(operand: Any, scatter_indices: Any, updates: Any, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode: Any = None) -> Array:
  """`scatter` multiplying by the updates."""
  return _scatter("scatter_mul", "mul", operand, scatter_indices, updates, dimension_numbers, unique_indices, mode)


def scatter_min(operand: Any, scatter_indices: Any, updates: Any, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode: Any = None) -> Array:
  """`scatter` keeping the minimum."""
  return _scatter("scatter_min", "min", operand, scatter_indices, updates, dimension_numbers, unique_indices, mode)


def scatter_max(operand: Any, scatter_indices: Any, updates: Any, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode: Any = None) -> Array:
  """`scatter` keeping the maximum."""
  return _scatter("scatter_max", "max", operand, scatter_indices, updates, dimension_numbers, unique_indices, mode)


def apply_counted(x: Array, counts: Array, func: Callable[[Array], Array]) -> Array:
  """`func` applied to each element of x as many times as `counts` says (a scatter's hits per element): unrolled when
  the counts are concrete (so it differentiates), else a while_loop up to their maximum."""
  from tinyjax import numpy as jnp
  from tinyjax.lax._control_flow import while_loop
  from tinyjax.trace.core import Tracer
  if not isinstance(counts, Tracer):
    result = x
    for i in range(int(np.asarray(counts).max(initial=0))):
      result = jnp.where(counts > i, func(result), result)
    return result
  most = jnp.max(counts) if counts.size else 0

  def body(carry):
    i, value = carry
    return i + 1, jnp.where(counts > i, func(value), value)
  return while_loop(lambda carry: carry[0] < most, body, (jnp.asarray(0, np.int32), x))[1]


def scatter_apply(operand: Any, scatter_indices: Any, func: Callable[[Array], Array],
                  dimension_numbers: ScatterDimensionNumbers, *, update_shape: Sequence[int] = (),
                  indices_are_sorted: bool = False, unique_indices: bool = False, mode: Any = None) -> Array:
  """`operand` with `func` applied to every element a window hits (as often as it is hit, as XLA's combiner)."""
  x = to_array(operand)
  counts = _scatter("scatter_apply", "add", full(x.shape, 0, np.int32), scatter_indices,
                    full(tuple(update_shape), 1, np.int32), dimension_numbers, unique_indices, mode)
  return apply_counted(x, counts, func)
