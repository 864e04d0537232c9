"""Gather and scatter: data-dependent reads and writes. The GATHER and SCATTER Ops (see tinyjax/uop.py), their JVP,
transpose and batching rules, and the lax functions built on them: `dynamic_slice`, `dynamic_update_slice` and their
`_in_dim` / `_index_in_dim` forms.

A GATHER reads, for each batch element of its indices (shape `(*batch, k)`), a window of fixed sizes starting at
those k positions in the operand's first k axes (clamped so the window fits); a SCATTER writes such windows of updates
into a copy of the operand, combining with `set`, `add`, `mul`, `min` or `max`, in order. Indexing `x[idx]`,
`x.at[idx]`, `take` and `dynamic_slice` are all one of the two (tinyjax/numpy/_indexing.py).

Differentiation: a gather is linear in its operand; its transpose is a scatter-add (clamped starts, as the gather
read them). A scatter-add is linear in operand and updates; its transpose reads the cotangent back with a gather.
The other modes are differentiated, as JAX, by rewriting their tangent with those two: `set` finds which update
won each element (by scattering the updates' ids), `min`/`max` share the tangent among the values equal to the
result, `mul` multiplies by the other factors (w.r.t. the updates only with `unique_indices`, as JAX).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, cast, expand_raw, full, is_array, reshape_raw, to_array
from tinyjax.lax._elementwise import _add, _and, _eq, _fdiv, _lt, _mul, _where
from tinyjax.lax._shape import concatenate, iota_along, shrink_raw
from tinyjax.trace import ad, batching
from tinyjax.devices.device import default_device
from tinyjax.trace.core import EvalTrace, bind, current_trace
from tinyjax.uop import Ops, ScatterArg

SCATTER_MODES = ("set", "add", "mul", "min", "max")


# ------------------------------------------------------------------------------------------- the Ops, unchecked

def gather_raw(operand: Array, indices: Array, window: Sequence[int]) -> Array:
  """GATHER: for each batch element of integer `indices` (shape `(*batch, k)`), the window of sizes `window` starting
  at those positions of `operand`'s first k axes (starts clamped so it fits). Shape `(*batch, *window, *rest)`."""
  return bind(Ops.GATHER, operand, indices, arg=tuple(int(s) for s in window), dtype=operand.dtype,
              weak_type=operand.weak_type)


def scatter_raw(operand: Array, indices: Array, updates: Array, mode: str, window: Sequence[int],
                unique_indices: bool = False, clip: bool = False) -> Array:
  """SCATTER: `operand` with each window of `updates` (shape `(*batch, *window, *rest)`) combined in at its start."""
  arg = ScatterArg(mode, tuple(int(s) for s in window), bool(unique_indices), bool(clip))
  return bind(Ops.SCATTER, operand, indices, updates, arg=arg, dtype=operand.dtype, weak_type=operand.weak_type)


def index_columns(indices: Array) -> list[Array]:
  """The k columns of `(*batch, k)` indices, each of shape `batch`."""
  batch = tuple(indices.shape[:-1])
  return [reshape_raw(shrink_raw(indices, [(0, d) for d in batch] + [(j, j + 1)]), batch)
          for j in range(indices.shape[-1])]


def stack_columns(columns: Sequence[Array]) -> Array:
  """`(*batch, k)` indices from k columns of shape `batch` (one dtype)."""
  return concatenate([reshape_raw(column, (*column.shape, 1)) for column in columns], len(columns[0].shape))


def window_fits(indices: Array, operand_shape: Sequence[int], window: Sequence[int]) -> Array:
  """Bool of shape `batch`: whether each start puts its whole window inside the operand (else a scatter drops it)."""
  fits = None
  for column, dim, size in zip(index_columns(indices), operand_shape, window):
    ok = _and(_lt(full(column.shape, -1, column.dtype), column),
              _lt(column, full(column.shape, dim - size + 1, column.dtype)))
    fits = ok if fits is None else _and(fits, ok)
  return fits


def _expand_batch(mask: Array, shape: Sequence[int]) -> Array:
  """A `batch`-shaped array broadcast over the trailing window and rest axes of an updates `shape`."""
  n_trailing = len(shape) - mask.ndim
  return expand_raw(reshape_raw(mask, (*mask.shape, *(1,) * n_trailing)), tuple(shape))


def _zeros(shape: Sequence[int], dtype: np.dtype) -> Array: return full(tuple(shape), 0, dtype)


# ------------------------------------------------------------------------------------------- differentiation

def _gather_jvp(primals, tangents, out, arg):
  (_, indices), (t_operand, _) = primals, tangents
  return None if t_operand is None else gather_raw(t_operand, indices, arg)


def _gather_transpose(ct, node, known):
  operand = node.src[0]
  return scatter_raw(_zeros(operand.shape, operand.dtype), known[1], ct, "add", node.arg, clip=True), None


def _scatter_jvp(primals, tangents, out, arg: ScatterArg):
  (operand, indices, updates), (t_operand, _, t_updates) = primals, tangents
  if not dtypes.is_inexact(out.dtype): return None
  t_operand = ad.instantiate(t_operand, operand)
  t_updates = ad.instantiate(t_updates, updates)
  as_add = arg._replace(mode="add")
  if arg.mode == "add": return bind(Ops.SCATTER, t_operand, indices, t_updates, arg=arg, dtype=out.dtype)
  fits = None if arg.clip else _expand_batch(window_fits(indices, operand.shape, arg.window), updates.shape)
  if arg.mode == "set":
    # which update (numbered from 1 per element) each element of the result came from; 0: the operand
    ids = _add(_ids(updates.shape), full(updates.shape, 1, np.int32))
    winner = scatter_raw(_zeros(operand.shape, np.int32), indices, ids, "set", arg.window, arg.unique_indices, arg.clip)
    won = _eq(gather_raw(winner, indices, arg.window), ids)
    if fits is not None: won = _and(won, fits)
    zero_u, zero_x = _zeros(updates.shape, t_updates.dtype), _zeros(operand.shape, t_operand.dtype)
    kept = _where(_eq(winner, _zeros(operand.shape, np.int32)), t_operand, zero_x)
    return _add(kept, bind(Ops.SCATTER, zero_x, indices, _where(won, t_updates, zero_u), arg=as_add, dtype=out.dtype))
  if arg.mode == "mul":
    factors = scatter_raw(full(operand.shape, 1, operand.dtype), indices, updates, "mul", arg.window,
                          arg.unique_indices, arg.clip)
    tangent = _mul(t_operand, factors)
    if tangents[2] is not None:
      if not arg.unique_indices:
        raise NotImplementedError("scatter_mul gradients with respect to the updates are only implemented if "
                                  "`unique_indices=True` (as JAX)")
      scaled = _mul(t_updates, gather_raw(operand, indices, arg.window))
      tangent = _add(tangent, bind(Ops.SCATTER, _zeros(operand.shape, out.dtype), indices, scaled, arg=as_add,
                                   dtype=out.dtype))
    return tangent
  # min / max: the tangent is the mean of the tangents of the values equal to the result (ties share, as JAX)
  one, zero = full(out.shape, 1, out.dtype), _zeros(out.shape, out.dtype)
  operand_hit = _where(_eq(operand, out), one, zero)
  update_hit = _eq(updates, gather_raw(out, indices, arg.window))
  if fits is not None: update_hit = _and(update_hit, fits)
  update_hit = _where(update_hit, full(updates.shape, 1, out.dtype), _zeros(updates.shape, out.dtype))
  count = _add(operand_hit, bind(Ops.SCATTER, zero, indices, update_hit, arg=as_add, dtype=out.dtype))
  total = _add(_mul(t_operand, operand_hit),
               bind(Ops.SCATTER, zero, indices, _mul(t_updates, update_hit), arg=as_add, dtype=out.dtype))
  return _fdiv(total, count)


def _ids(shape: Sequence[int]) -> Array:
  """int32 0, 1, ... over the elements of `shape` in row-major order."""
  size = int(np.prod(shape, dtype=np.int64))
  return reshape_raw(iota_along(np.int32, (size,), 0), tuple(shape))


def _scatter_transpose(ct, node, known):
  operand, indices, updates = node.src
  arg: ScatterArg = node.arg
  if arg.mode != "add":
    raise NotImplementedError(f"transpose of scatter-{arg.mode}: it is not linear (its JVP is built from gathers and "
                              "scatter-adds)")
  # a known operand or known updates are zeros here (the JVP rules above scatter tangents into zeros)
  ct_updates = None
  if known[2] is None:
    ct_updates = gather_raw(ct, known[1], arg.window)
    if not arg.clip:
      fits = _expand_batch(window_fits(known[1], operand.shape, arg.window), updates.shape)
      ct_updates = _where(fits, ct_updates, _zeros(updates.shape, ct.dtype))
  return (ct if known[0] is None else None), None, ct_updates


ad.jvp_rules[Ops.GATHER] = _gather_jvp
ad.jvp_rules[Ops.SCATTER] = _scatter_jvp
ad.transpose_rules[Ops.GATHER] = _gather_transpose
ad.transpose_rules[Ops.SCATTER] = _scatter_transpose


# ------------------------------------------------------------------------------------------- batching

def _with_batch_index(indices: Array, size: int) -> Array:
  """Indices with the batch axis first and a first column counting 0..size-1 along it (to index a batched operand's
  batch axis, moved to the front)."""
  batch_column = iota_along(indices.dtype, indices.shape[:-1], 0)
  return stack_columns([batch_column, *index_columns(indices)])


def _gather_batch(vals, dims, arg, dtype, weak_type):
  (operand, indices), (operand_dim, indices_dim) = vals, dims
  window = tuple(arg)
  k = len(window)
  if indices_dim is None:  # the batch axis becomes the first rest axis of the operand: it is copied with each window
    operand = batching.move_axis(operand, operand_dim, k)
    return gather_raw(operand, indices, window), indices.ndim - 1 + k
  size = indices.shape[indices_dim]
  indices = batching.move_axis(indices, indices_dim, 0)
  if operand_dim is None: return gather_raw(operand, indices, window), 0
  operand = batching.move_axis(operand, operand_dim, 0)
  out = gather_raw(operand, _with_batch_index(indices, size), (1, *window))
  n_batch = indices.ndim - 1
  return reshape_raw(out, out.shape[:n_batch] + out.shape[n_batch + 1:]), 0


def _scatter_batch(vals, dims, arg: ScatterArg, dtype, weak_type):
  size = batching.batch_size(vals, dims)
  operand, indices, updates = (batching.match_axis(v, d, 0, size) for v, d in zip(vals, dims))
  n_batch = indices.ndim - 1
  updates = reshape_raw(updates, (*updates.shape[:n_batch], 1, *updates.shape[n_batch:]))
  new_arg = arg._replace(window=(1, *arg.window))
  out = bind(Ops.SCATTER, operand, _with_batch_index(indices, size), updates, arg=new_arg, dtype=dtype,
             weak_type=weak_type)
  return out, 0


batching.batch_rules[Ops.GATHER] = _gather_batch
batching.batch_rules[Ops.SCATTER] = _scatter_batch


# ------------------------------------------------------------------------------------------- lax functions

def _start_indices(name: str, operand: Array, start_indices: Any) -> list[Array | int]:
  """The starts as a list of Python ints (concrete) or 0-d integer arrays, one per axis of `operand`."""
  if is_array(start_indices) or isinstance(start_indices, np.ndarray):
    array = to_array(start_indices)
    if array.ndim != 1:
      raise TypeError(f"{name}: start_indices must be a sequence of scalars or a 1-D array, got shape {array.shape}")
    starts = [reshape_raw(shrink_raw(array, [(i, i + 1)]), ()) for i in range(array.shape[0])]
  else:
    starts = list(start_indices)
  if len(starts) != operand.ndim:
    raise TypeError(f"{name}: got {len(starts)} start indices for an operand of rank {operand.ndim} (shape "
                    f"{operand.shape}); pass one start per axis")
  out = []
  for start in starts:
    if isinstance(start, (int, np.integer)) and not isinstance(start, (bool, np.bool_)):
      out.append(int(start))
      continue
    array = to_array(start)
    if array.ndim != 0 or not dtypes.issubdtype(array.dtype, np.integer):
      raise TypeError(f"{name}: start indices must be integer scalars, got {array.dtype.name}{list(array.shape)}")
    out.append(array)
  return out


def _starts_array(starts: list[Array | int], shape: Sequence[int]) -> Array:
  """The starts as a `(k,)` int32 index array; negative starts count from the end (as JAX)."""
  columns = []
  for start, dim in zip(starts, shape):
    if isinstance(start, int):
      columns.append(full((), start + dim if start < 0 else start, np.int32))
      continue
    start = cast(start, np.int32, False)
    columns.append(_where(_lt(start, full((), 0, np.int32)), _add(start, full((), dim, np.int32)), start))
  return stack_columns(columns)


def _check_sizes(name: str, operand: Array, sizes: Sequence[int]) -> tuple[int, ...]:
  sizes = tuple(int(s) for s in sizes)
  if len(sizes) != operand.ndim:
    raise TypeError(f"{name}: slice_sizes must have one entry per axis of the operand (shape {operand.shape}), got "
                    f"{sizes}")
  for size, dim in zip(sizes, operand.shape):
    if not 0 <= size <= dim:
      raise TypeError(f"{name}: slice_sizes {sizes} must be non-negative and fit the operand shape {operand.shape}")
  return sizes


def slice_at(operand: Array, starts: Sequence[int], sizes: Sequence[int]) -> Array:
  """The block of `sizes` at `starts` (in range: checked and clamped by the caller). Traced, a SHRINK (free: index
  arithmetic in whatever reads it). Eagerly, where some start is not 0, a GATHER at the starts held in a buffer, an
  input of the program as JAX's eager indexing takes its indices: `x[i]` or `x[i * n:(i + 1) * n]` in a Python loop
  is one program, not one lowered and compiled per `i` (~4 ms each). (Not of an array placed with a sharding: a slice
  keeps its operand's, trace/sharding_types.py.)"""
  if type(current_trace.get()) is not EvalTrace or not any(starts) or operand.ndim == 0 or \
      getattr(operand, "_named", None) is not None or getattr(operand.uop.arg, "sharding", None) is not None:
    return shrink_raw(operand, [(start, start + size) for start, size in zip(starts, sizes)])
  return gather_raw(operand, eager_indices(tuple(starts)), sizes)


def eager_indices(values: tuple[int, ...]) -> Array:
  """An int32 array of the Python ints `values` on the default device, as eager indexing takes its indices; made once
  per values and device (`x[0]` read again and again builds its buffer once)."""
  key = (values, default_device())
  if (indices := _EAGER_INDICES.get(key)) is None:
    if len(_EAGER_INDICES) >= _EAGER_INDICES_MAX: _EAGER_INDICES.clear()
    indices = _EAGER_INDICES[key] = Array.from_numpy(np.array(values, np.int32))
  return indices


_EAGER_INDICES: dict[tuple, Array] = {}
_EAGER_INDICES_MAX = 4096


def dynamic_slice(operand: Any, start_indices: Any, slice_sizes: Sequence[int]) -> Array:
  """The slice of `operand` of shape `slice_sizes` starting at `start_indices` (traced values allowed; negative
  starts count from the end; each start is clamped so the slice fits, as JAX)."""
  operand = to_array(operand)
  sizes = _check_sizes("dynamic_slice", operand, slice_sizes)
  starts = _start_indices("dynamic_slice", operand, start_indices)
  if all(isinstance(s, int) for s in starts):  # concrete starts: a plain slice (or a gather eagerly: `slice_at`)
    starts = [min(max(start + dim if start < 0 else start, 0), dim - size)
              for start, size, dim in zip(starts, sizes, operand.shape)]
    return slice_at(operand, starts, sizes)
  if operand.ndim == 0: return operand
  return gather_raw(operand, _starts_array(starts, operand.shape), sizes)


def dynamic_update_slice(operand: Any, update: Any, start_indices: Any) -> Array:
  """`operand` with the block `update` written at `start_indices` (clamped so the block fits, as JAX)."""
  operand, update = to_array(operand), to_array(update)
  if update.dtype != operand.dtype:
    raise TypeError(f"dynamic_update_slice: update dtype {update.dtype.name} must match the operand's "
                    f"{operand.dtype.name}")
  if update.ndim != operand.ndim or any(u > d for u, d in zip(update.shape, operand.shape)):
    raise TypeError(f"dynamic_update_slice: update shape {update.shape} must have the operand's rank and fit its shape "
                    f"{operand.shape}")
  starts = _start_indices("dynamic_update_slice", operand, start_indices)
  if operand.ndim == 0: return update
  return scatter_raw(operand, _starts_array(starts, operand.shape), update, "set", update.shape, unique_indices=True,
                     clip=True)


def _axis_starts(operand: Array, index: Any, axis: int) -> list[Any]:
  starts: list[Any] = [0] * operand.ndim
  starts[axis] = index
  return starts


def dynamic_slice_in_dim(operand: Any, start_index: Any, slice_size: int, axis: int = 0) -> Array:
  """`dynamic_slice` along one axis: `slice_size` elements from `start_index`."""
  operand = to_array(operand)
  axis = _axis(operand, axis)
  sizes = list(operand.shape)
  sizes[axis] = int(slice_size)
  return dynamic_slice(operand, _axis_starts(operand, start_index, axis), sizes)


def dynamic_index_in_dim(operand: Any, index: Any, axis: int = 0, keepdims: bool = True) -> Array:
  """The element `index` along `axis` (clamped), keeping that axis with size 1 unless `keepdims=False`."""
  operand = to_array(operand)
  axis = _axis(operand, axis)
  result = dynamic_slice_in_dim(operand, index, 1, axis)
  return result if keepdims else reshape_raw(result, operand.shape[:axis] + operand.shape[axis + 1:])


def dynamic_update_slice_in_dim(operand: Any, update: Any, start_index: Any, axis: int) -> Array:
  """`dynamic_update_slice` along one axis (the update covers the other axes whole)."""
  operand = to_array(operand)
  axis = _axis(operand, axis)
  return dynamic_update_slice(operand, update, _axis_starts(operand, start_index, axis))


def dynamic_update_index_in_dim(operand: Any, update: Any, index: Any, axis: int) -> Array:
  """Write `update` (the operand's shape without `axis`, or with it of size 1) at `index` along `axis`."""
  operand, update = to_array(operand), to_array(update)
  axis = _axis(operand, axis)
  if update.ndim == operand.ndim - 1: update = reshape_raw(update, update.shape[:axis] + (1,) + update.shape[axis:])
  return dynamic_update_slice_in_dim(operand, update, index, axis)


def _axis(operand: Array, axis: int) -> int: return canonicalize_axis(axis, operand.ndim)

