"""Indexing: `x[...]`, `x.at[...]`, `take` and `take_along_axis`, with numpy's rules and JAX's out-of-bounds modes.

Basic indices (integers, slices with any step, None, Ellipsis) are movement ops: FLIP, SHRINK, PAD and RESHAPE,
free until lowering; eagerly, a block away from the start is read by a GATHER at starts held in an input
(lax/_slicing.py `slice_at`), so a Python loop over places is one program. Integer arrays and boolean masks
(concrete ones, turned into integer arrays with `nonzero`) are advanced indices: the basic part is applied first, then
one GATHER reads the indexed axes (moved to the front) at the broadcast index arrays, and the result's axes are laid
out as numpy does (the broadcast index shape replaces the indexed axes when they are adjacent in the index, else it
goes first). Reads clamp out-of-bounds indices, as JAX.

`x.at[index].set/add/...` is one SCATTER over every axis of x: integer arrays and integers index their axis, a slice
of step 1 is a window of the update, any other slice an index array of its own; updates are broadcast to the shape
`x[index]` has and laid out to match. Out-of-bounds updates are dropped (JAX's default), or clamped with `mode="clip"`.
"""
from __future__ import annotations

import functools
import operator
from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax import _shape as lax_shape
from tinyjax.lax._base import cast, expand_raw, full, reshape_raw, staged, to_array
from tinyjax.lax._elementwise import _add, _and, _lt, _where
from tinyjax.lax._slicing import gather_raw, scatter_raw, slice_at, stack_columns
from tinyjax.numpy._shape import broadcast_to
from tinyjax.trace.core import EvalTrace, Primitive, Tracer, current_trace


class NonConcreteBooleanIndexError(IndexError):
  """A boolean mask index whose values are not known while tracing (its result's shape would depend on them)."""


class _Advanced:
  """An integer array index on one axis (already broadcast-ready; negative values not yet normalised)."""
  __slots__ = ("array",)

  def __init__(self, array: Array):
    self.array = array


def _int_index(item: int) -> _Advanced:
  """An integer index as an index array (a 0-d int32 array: the layout of an integer's axis, its index block none)."""
  return _Advanced(to_array(np.int32(item)))


def _is_int_scalar(item: Any) -> bool:
  if isinstance(item, (bool, np.bool_)): return False
  if isinstance(item, (int, np.integer)): return True
  return isinstance(item, np.ndarray) and item.ndim == 0 and item.dtype.kind in "iu"


def _check_item(item: Any) -> None:
  if item is None or item is Ellipsis or isinstance(item, slice) or _is_int_scalar(item): return
  if isinstance(item, (bool, np.bool_)): return
  if isinstance(item, list):
    raise TypeError("Using a non-tuple sequence for multidimensional indexing is not allowed; use `arr[array(seq)]` "
                    "instead of `arr[seq]` (or `arr[tuple(seq)]` for one index per axis)")
  if isinstance(item, (Array, np.ndarray)):
    if item.dtype == np.bool_ or dtypes.issubdtype(item.dtype, np.integer): return
    raise TypeError(f"Indexer must have integer or boolean type, got indexer with type {item.dtype.name}")
  raise TypeError(f"invalid index {item!r} of type {type(item).__name__}: use integers, slices, None, Ellipsis, "
                  "integer arrays or boolean arrays")


def _mask_to_arrays(mask: Any, shape: tuple[int, ...], axis: int) -> list[_Advanced]:
  """A concrete boolean mask over the axes `axis, axis + mask.ndim, ...` as integer arrays (its `nonzero`)."""
  host = _concrete_mask(mask)
  indexed = shape[axis:axis + host.ndim]
  # (an empty mask selects nothing whatever the sizes of the axes its empty dimensions stand over, as JAX)
  if len(indexed) != host.ndim or any(m not in (d, 0) for m, d in zip(host.shape, indexed)) or \
      (host.size and host.shape != indexed):
    raise IndexError(f"boolean index of shape {host.shape} does not match the indexed array's shape "
                     f"{shape[axis:axis + host.ndim]} at axis {axis}")
  return [_Advanced(to_array(positions.astype(np.int32))) for positions in np.nonzero(host)]


def _concrete_mask(mask: Any) -> np.ndarray:
  """A boolean mask's values (NonConcreteBooleanIndexError for a traced one: the result's shape would depend on
  them)."""
  if isinstance(mask, Tracer):
    try:
      mask = mask.concrete("a boolean index")
    except TypeError:
      raise NonConcreteBooleanIndexError(
        f"Array boolean indices must be concrete; got {mask.dtype.name}{list(mask.shape)}. Under jit a boolean mask "
        "gives a result whose shape depends on the values: use tinyjax.numpy.where(mask, x, fill) or "
        "nonzero(mask, size=...) instead.") from None
  return np.asarray(mask)


def _expand_index(shape: tuple[int, ...], index: Any) -> list[Any]:
  """The index as one item per consumed axis or new axis: None, slice, int, _Advanced (boolean masks expanded, the
  Ellipsis filled in). A Python bool is a 0-d mask: a new axis of size 1 (True) or 0 (False), as numpy."""
  items = index if isinstance(index, tuple) else (index,)
  for item in items: _check_item(item)
  if sum(item is Ellipsis for item in items) > 1: raise IndexError("an index can only have a single ellipsis ('...')")

  def consumed(item: Any) -> int:
    if item is None or item is Ellipsis or isinstance(item, (bool, np.bool_)): return 0
    if isinstance(item, (Array, np.ndarray)) and item.dtype == np.bool_: return item.ndim
    return 1

  total = sum(consumed(item) for item in items)
  if total > len(shape):
    raise IndexError(f"Too many indices for array: {total} non-None/Ellipsis indices for dim {len(shape)}.")
  expanded: list[Any] = []
  axis = 0
  for item in items:
    if item is Ellipsis:
      expanded += [slice(None)] * (len(shape) - total)
      axis += len(shape) - total
    elif item is None:
      expanded.append(None)
    elif isinstance(item, (bool, np.bool_)):
      expanded.append(True if item else False)
    elif isinstance(item, (Array, np.ndarray)) and item.dtype == np.bool_ and item.ndim == 0:
      expanded.append(bool(_concrete_mask(item)))  # a 0-d mask is a Python bool: a new axis of size 1 or 0
    elif isinstance(item, (Array, np.ndarray)) and item.dtype == np.bool_:
      expanded += _mask_to_arrays(item, shape, axis)
      axis += item.ndim
    elif isinstance(item, (Array, np.ndarray)) and item.ndim > 0 or isinstance(item, Tracer):
      expanded.append(_Advanced(to_array(item)))
      axis += 1
    elif isinstance(item, Array):  # a concrete 0-d integer array
      expanded.append(int(item))
      axis += 1
    else:
      expanded.append(operator.index(item) if not isinstance(item, slice) else item)
      axis += 1
  if not any(item is Ellipsis for item in items): expanded += [slice(None)] * (len(shape) - total)
  return expanded


def _index_dtype(arrays: list[Array]) -> np.dtype:
  """The dtype index arrays are combined in: int64 if one of them is (x64), else int32."""
  return np.dtype(np.int64) if any(a.dtype == np.int64 or a.dtype == np.uint64 for a in arrays) else np.dtype(np.int32)


def _normalized(array: Array, size: int, dtype: np.dtype) -> Array:
  """Integer indices in `dtype` with negative values counted from the end (as numpy)."""
  unsigned = array.dtype.kind == "u"
  array = cast(array, dtype, False)
  if unsigned: return array
  zero = full(array.shape, 0, array.dtype)
  return _where(_lt(array, zero), _add(array, full(array.shape, size, array.dtype)), array)


def _in_bounds(array: Array, size: int) -> Array:
  return _and(_lt(full(array.shape, -1, array.dtype), array), _lt(array, full(array.shape, size, array.dtype)))


def _layout(items: list[Any]) -> tuple[bool, int]:
  """Whether the advanced items are adjacent in the index (numpy then keeps their result where they were), and the
  position among the result's axes where they go."""
  positions = [i for i, item in enumerate(items) if isinstance(item, _Advanced)]
  adjacent = positions == list(range(positions[0], positions[-1] + 1))
  if not adjacent: return False, 0
  return True, sum(1 for item in items[:positions[0]] if not isinstance(item, _Advanced))


def _broadcast_indices(arrays: list[Array]) -> list[Array]:
  from tinyjax.lax._base import broadcast_shapes
  shape = broadcast_shapes("indexing", *(a.shape for a in arrays))
  return [expand_raw(a, shape) for a in arrays]


def _fill_value(dtype: np.dtype, fill_value: Any) -> Any:
  """JAX's default fill for out-of-bounds reads in mode='fill': NaN, the most negative int, the largest unsigned
  int, True."""
  if fill_value is not None: return fill_value
  if dtypes.is_floating(dtype): return float("nan")
  if dtypes.is_complex(dtype): return complex(float("nan"), float("nan"))
  if dtype == np.bool_: return True
  return int(np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max)


def getitem(x: Array, index: Any, mode: str | None = None, fill_value: Any = None) -> Array:
  """x[index] with numpy's semantics. `mode`: None or "clip"/"promise_in_bounds" clamp out-of-bounds indices (JAX's
  default for reads), "fill" gives `fill_value` there, "wrap" takes them modulo the axis size."""
  if mode not in (None, "clip", "promise_in_bounds", "fill", "wrap"):
    raise ValueError(f"invalid mode {mode!r} for indexing: use 'clip', 'fill', 'wrap' or 'promise_in_bounds'")
  items = _expand_index(x.shape, index)
  has_arrays = any(isinstance(item, _Advanced) for item in items)
  if has_arrays or mode in ("fill", "wrap"):  # integers are advanced indices too then (numpy's rule)
    items = [_int_index(item) if isinstance(item, int) and not isinstance(item, bool) else item
             for item in items]
  new_axis_sizes = {i: (0 if item is False else 1) for i, item in enumerate(items) if item is None or
                    isinstance(item, bool)}
  # the basic part: slices and integers as movement ops, advanced axes kept whole
  basic = [slice(None) if isinstance(item, _Advanced) else item for item in items
           if not (item is None or isinstance(item, bool))]
  y = _basic_getitem(x, basic)
  advanced_axes, arrays, kept = [], [], []
  # map y's axes to the items that made them
  y_axis = 0
  for item in items:
    if item is None or isinstance(item, bool): continue
    if isinstance(item, int): continue
    if isinstance(item, _Advanced):
      advanced_axes.append(y_axis)
      arrays.append(item.array)
    else:
      kept.append(y_axis)
    y_axis += 1
  if not advanced_axes: return _insert_new_axes(y, items, new_axis_sizes, None)
  arrays = _broadcast_indices(arrays)
  fill = _fill_value(x.dtype, fill_value) if mode == "fill" else None
  gathered = gather_p.bind(y, *arrays, advanced_axes=tuple(advanced_axes), kept_axes=tuple(kept), mode=mode,
                           fill_value=fill)
  return _insert_new_axes(gathered, items, new_axis_sizes, len(arrays[0].shape))


def _gather(y: Array, *arrays: Array, advanced_axes: tuple[int, ...], kept_axes: tuple[int, ...], mode: str | None,
            fill_value: Any) -> Array:
  """y's elements at the integer index arrays (one per axis of `advanced_axes`, broadcast to one shape), the
  `kept_axes` whole: (index dims..., kept axes...). Indices per `mode` as `getitem` says."""
  sizes = [y.shape[a] for a in advanced_axes]
  index_dtype = _index_dtype(list(arrays))
  if mode == "wrap": arrays = [_wrap(cast(a, index_dtype, False), size) for a, size in zip(arrays, sizes)]
  elif mode != "clip": arrays = [_normalized(a, size, index_dtype) for a, size in zip(arrays, sizes)]
  else: arrays = [cast(a, index_dtype, False) for a in arrays]
  index_shape = arrays[0].shape
  moved = lax_shape.permute_raw(y, list(advanced_axes) + list(kept_axes))
  gathered = gather_raw(moved, stack_columns(arrays), (1,) * len(arrays))
  rest = tuple(y.shape[a] for a in kept_axes)
  gathered = reshape_raw(gathered, index_shape + rest)
  if mode == "fill":
    ok = None
    for array, size in zip(arrays, sizes):
      inside = _in_bounds(array, size)
      ok = inside if ok is None else _and(ok, inside)
    ok = expand_raw(reshape_raw(ok, index_shape + (1,) * len(rest)), gathered.shape)
    gathered = _where(ok, gathered, full(gathered.shape, fill_value, y.dtype, y.weak_type))
  return gathered


# numpy indexing's gather by integer arrays, as one primitive for its name in printed jaxprs (`gather[...]`);
# transformations differentiate and batch its decomposition
gather_p = Primitive("gather", _gather)


def _wrap(array: Array, size: int) -> Array:
  from tinyjax.numpy._elementwise import remainder
  return remainder(array, size) if size else array


def _insert_new_axes(result: Array, items: list[Any], new_axis_sizes: dict[int, int], n_index: int | None) -> Array:
  """Lay out the result of the advanced/basic parts as numpy: `result` is (index dims..., kept axes...) when there are
  advanced items (n_index of them first), else the basic result; None/bool items become new axes."""
  tokens = []  # per result axis in numpy's order: ("new", size) | ("kept", j) | ("index", None)
  kept = 0
  if n_index is not None:
    adjacent, _ = _layout(items)
    placed = False
    for item in items:
      if item is None or isinstance(item, bool): tokens.append(("new", 0 if item is False else 1))
      elif isinstance(item, _Advanced):
        if adjacent and not placed:
          tokens.append(("index", None))
          placed = True
      elif isinstance(item, slice):
        tokens.append(("kept", kept))
        kept += 1
    if not adjacent: tokens.insert(0, ("index", None))
    order = []
    for kind, value in tokens:
      if kind == "index": order += list(range(n_index))
      elif kind == "kept": order.append(n_index + value)
    result = lax_shape.permute_raw(result, order)
  else:
    for item in items:
      if item is None or isinstance(item, bool): tokens.append(("new", 0 if item is False else 1))
      elif isinstance(item, slice):
        tokens.append(("kept", kept))
        kept += 1
  shape, source = [], iter(result.shape)
  index_dims = n_index or 0
  for kind, value in tokens:
    if kind == "new": shape.append(1)
    elif kind == "index": shape += [next(source) for _ in range(index_dims)]
    else: shape.append(next(source))
  result = reshape_raw(result, tuple(shape))
  empty = [axis for axis, (kind, value) in enumerate(_expanded_tokens(tokens, index_dims)) if kind == "new" and
           value == 0]
  if empty:
    result = lax_shape.shrink_raw(result, [(0, 0) if a in empty else (0, d) for a, d in enumerate(result.shape)])
  return result


def _expanded_tokens(tokens: list[tuple[str, Any]], index_dims: int) -> list[tuple[str, Any]]:
  out = []
  for kind, value in tokens:
    out += [(kind, value)] * (index_dims if kind == "index" else 1)
  return out


def _basic_getitem(x: Array, items: list[Any]) -> Array:
  """x[items] for one int or slice per axis: ints clamp (JAX's out-of-bounds read), slices any step."""
  starts, limits, strides, flips, out_shape = [], [], [], set(), []
  for axis, item in enumerate(items):
    size = x.shape[axis]
    if isinstance(item, slice):
      start, stop, step = item.indices(size)
      count = len(range(start, stop, step))
      if step < 0:
        flips.add(axis)
        start, step = size - 1 - start, -step
      if count == 0: start = 0
      starts.append(start)
      limits.append(start + (count - 1) * step + 1 if count else 0)
      strides.append(step)
      out_shape.append(count)
    else:
      position = item
      if size == 0: raise IndexError(f"index {position} is out of bounds for axis {axis} with size 0")
      if position < 0: position += size
      position = min(max(position, 0), size - 1)  # out-of-bounds reads clamp, as JAX
      starts.append(position)
      limits.append(position + 1)
      strides.append(1)
  result = lax_shape.flip_raw(x, flips)
  if all(stride == 1 for stride in strides) and all(out_shape):  # (a block: eagerly read at starts, `slice_at`)
    result = slice_at(result, starts, [limit - start for start, limit in zip(starts, limits)])
  else:
    result = lax_shape.strided_slice_raw(result, starts, limits, strides)
  return reshape_raw(result, out_shape)


# ---------------------------------------------------------------------------------------------------------- x.at[...]

def _result_tokens(items: list[Any], has_arrays: bool) -> list[tuple[str, Any]]:
  """The axes of `x[items]` in numpy's order: ("new", size), ("index", None) for the broadcast index block, and
  ("slice", item position)."""
  tokens: list[tuple[str, Any]] = []
  adjacent = _layout(items)[0] if has_arrays else True
  placed = False
  for position, item in enumerate(items):
    if item is None or isinstance(item, bool): tokens.append(("new", 0 if item is False else 1))
    elif isinstance(item, _Advanced):
      if adjacent and not placed: tokens.append(("index", None))
      placed = True
    elif isinstance(item, slice): tokens.append(("slice", position))
  if has_arrays and not adjacent: tokens.insert(0, ("index", None))
  return tokens


def scatter_update(x: Array, index: Any, values: Any, mode: str, out_of_bounds: str | None = None,
                   unique_indices: bool = False) -> Array:
  """`x` with the elements `x[index]` combined with `values` (broadcast to that shape) by `mode` ("set", "add",
  "mul", "min", "max"). Out-of-bounds indices are dropped (JAX's default) or, with `out_of_bounds="clip"`, clamped."""
  if out_of_bounds not in (None, "drop", "fill", "clip", "promise_in_bounds"):
    raise ValueError(f"invalid mode {out_of_bounds!r} for an indexed update: use 'drop', 'clip' or "
                     "'promise_in_bounds'")
  values = to_array(values)
  if x.ndim == 0:  # as a 1-element array, so that every update is a scatter over at least one axis
    items = _expand_index((), index)
    flat = scatter_update(reshape_raw(x, (1,)), (slice(None), *items), values, mode, out_of_bounds, unique_indices)
    return reshape_raw(flat, ())
  items = _expand_index(x.shape, index)
  if type(current_trace.get()) is EvalTrace:  # eagerly, integers as index arrays held in inputs: `x.at[i].set(v)` in
    # a Python loop over i is one program, not one per place (their layout is an integer's: the index block has no axes)
    # (a buffer each, not `eager_indices`' shared ones: x.at[1, 1] would read one buffer twice, another program)
    items = [_int_index(item) if type(item) is int and -2 ** 31 <= item < 2 ** 31 else item for item in items]
  arrays = [item.array for item in items if isinstance(item, _Advanced)]
  return _SCATTERS[mode].bind(x, values, *arrays, index=IndexSpec.of(items), out_of_bounds=out_of_bounds,
                              unique_indices=unique_indices)


class IndexSpec(tuple):
  """The static part of an indexed update's index, a primitive's parameter: per item an int, None, a slice as
  (start, stop, step), "True" / "False" for a bool (a new axis of size 1 / 0: as a string, since True == 1 would make
  `x.at[True]` and `x.at[1]` one cached program), or ARRAY for the next index array operand; printed as the index
  reads (`[1, 2:, array]`)."""
  ARRAY = "array"

  @staticmethod
  def of(items: list[Any]) -> IndexSpec:
    return IndexSpec(IndexSpec.ARRAY if isinstance(item, _Advanced) else (item.start, item.stop, item.step)
                     if isinstance(item, slice) else str(item) if isinstance(item, bool) else item for item in items)

  def items(self, arrays: tuple[Array, ...]) -> list[Any]:
    """The index items again, with `arrays` in the ARRAY places."""
    arrays = iter(arrays)
    return [_Advanced(next(arrays)) if item == IndexSpec.ARRAY else slice(*item) if isinstance(item, tuple) else
            item == "True" if isinstance(item, str) else item for item in self]

  def __repr__(self) -> str:
    def shown(item: Any) -> str:
      if not isinstance(item, tuple): return str(item)
      start, stop, step = ("" if part is None else str(part) for part in item)
      return f"{start}:{stop}" + (f":{step}" if step else "")
    return "[" + ", ".join(shown(item) for item in self) + "]"


def _scatter(x: Array, values: Array, *arrays: Array, index: IndexSpec, out_of_bounds: str | None,
             unique_indices: bool, mode: str) -> Array:
  """The indexed update `scatter_update` binds: `x` with `values` combined into the elements the index picks."""
  items = index.items(arrays)
  has_arrays = bool(arrays)
  if has_arrays:
    items = [_int_index(item) if isinstance(item, int) and not isinstance(item, bool) else item
             for item in items]
  axis_items = [item for item in items if not (item is None or isinstance(item, bool))]
  # the broadcast index block
  advanced = [(axis, item.array) for axis, item in enumerate(axis_items) if isinstance(item, _Advanced)]
  arrays = _broadcast_indices([array for _, array in advanced]) if advanced else []
  index_dtype = _index_dtype(arrays)
  arrays = [_normalized(array, x.shape[axis], index_dtype) for (axis, _), array in zip(advanced, arrays)]
  index_shape = arrays[0].shape if arrays else ()
  # slices: step 1 is a window, any other step an index array of its own (a batch axis)
  slice_info = {}
  for axis, item in enumerate(axis_items):
    if isinstance(item, slice):
      start, stop, step = item.indices(x.shape[axis])
      slice_info[axis] = (start, step, len(range(start, stop, step)))
  strided = [axis for axis, (_, step, _) in slice_info.items() if step != 1]
  batch_shape = tuple(index_shape) + tuple(slice_info[axis][2] for axis in strided)
  window = tuple(slice_info[axis][2] if axis in slice_info and slice_info[axis][1] == 1 else 1
                 for axis in range(x.ndim))
  # the updates: broadcast to x[index]'s shape, then laid out as (index block, strided slices, windows)
  tokens = _result_tokens(items, has_arrays)
  result_shape = []
  for kind, value in tokens:
    if kind == "new": result_shape.append(value)
    elif kind == "index": result_shape += list(index_shape)
    else: result_shape.append(slice_info[_axis_of(items, value)][2])
  try:
    updates = broadcast_to(cast(values, x.dtype, x.weak_type), tuple(result_shape))
  except (TypeError, ValueError):
    raise ValueError(f"Incompatible shapes for broadcasting: values of shape {values.shape} cannot be broadcast to "
                     f"the indexed shape {tuple(result_shape)}") from None
  if 0 in result_shape: return x
  dims, shape_without_new = [], []
  for kind, value in tokens:  # drop the new axes (size 1)
    if kind == "index":
      dims += [("index", i) for i in range(len(index_shape))]
      shape_without_new += list(index_shape)
    elif kind == "slice":
      dims.append(("slice", _axis_of(items, value)))
      shape_without_new.append(slice_info[_axis_of(items, value)][2])
  updates = reshape_raw(updates, tuple(shape_without_new))
  order = [i for i, d in enumerate(dims) if d[0] == "index"]
  order += [dims.index(("slice", axis)) for axis in strided]
  order += [dims.index(("slice", axis)) for axis in slice_info if axis not in strided]
  updates = reshape_raw(lax_shape.permute_raw(updates, order), batch_shape + window)
  # one index column per axis of x, over the batch shape
  columns = []
  n_index = len(index_shape)
  advanced_arrays = dict(zip((axis for axis, _ in advanced), arrays))
  for axis, item in enumerate(axis_items):
    if axis in advanced_arrays:
      column = reshape_raw(advanced_arrays[axis], index_shape + (1,) * len(strided))
    elif axis in strided:
      start, step, count = slice_info[axis]
      position = strided.index(axis)
      shape = [1] * len(batch_shape)
      shape[n_index + position] = count
      counting = lax_shape.iota_along(np.int32, (count,), 0)
      column = reshape_raw(_add(full((count,), start, np.int32), _mul_int(counting, step)), tuple(shape))
    else:
      start = slice_info[axis][0] if axis in slice_info else item + x.shape[axis] * (item < 0)
      column = full((1,) * len(batch_shape), start, np.int32)
    columns.append(column)
  columns = [expand_raw(cast(c, index_dtype, False), batch_shape) for c in columns]
  return scatter_raw(x, stack_columns(columns), updates, mode, window, unique_indices, out_of_bounds == "clip")


# the indexed updates as primitives named as JAX's (`x.at[1].set(2.0)` prints one `scatter[index=[1, :] ...]`);
# transformations differentiate and batch their decomposition
_SCATTERS = {mode: Primitive(name, functools.partial(_scatter, mode=mode)) for mode, name in (
  ("set", "scatter"), ("add", "scatter-add"), ("mul", "scatter-mul"), ("min", "scatter-min"), ("max", "scatter-max"))}


def _axis_of(items: list[Any], position: int) -> int:
  """The axis of x that item `position` indexes (new axes consume none)."""
  return sum(1 for item in items[:position] if not (item is None or isinstance(item, bool)))


def _mul_int(x: Array, factor: int) -> Array:
  from tinyjax.lax._elementwise import _mul
  return _mul(x, full(x.shape, factor, x.dtype))


class _IndexUpdateRef:
  """`x.at[index]`: the pure forms of `x[index] = v`, `x[index] += v`, ... (each returns a new array)."""
  __slots__ = ("array", "index")

  def __init__(self, array: Array, index: Any):
    self.array, self.index = array, index

  def __repr__(self) -> str: return f"_IndexUpdateRef({self.array!r}, {self.index!r})"

  def get(self, *, indices_are_sorted: bool = False, unique_indices: bool = False, mode: str | None = None,
          fill_value: Any = None) -> Array:
    """`x[index]`; mode="fill" gives `fill_value` (default NaN / min int / True) for out-of-bounds indices."""
    return getitem(self.array, self.index, mode=mode, fill_value=fill_value)

  def set(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
          mode: str | None = None) -> Array:
    """`x[index] = values` (with duplicate indices the last update wins)."""
    return scatter_update(self.array, self.index, values, "set", mode, unique_indices)

  def add(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
          mode: str | None = None) -> Array:
    """`x[index] += values` (duplicate indices accumulate)."""
    return scatter_update(self.array, self.index, values, "add", mode, unique_indices)

  def subtract(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
               mode: str | None = None) -> Array:
    """`x[index] -= values`."""
    from tinyjax.numpy._elementwise import negative
    values = negative(cast(to_array(values), self.array.dtype, self.array.weak_type))
    return scatter_update(self.array, self.index, values, "add", mode, unique_indices)

  def multiply(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
               mode: str | None = None) -> Array:
    """`x[index] *= values`."""
    return scatter_update(self.array, self.index, values, "mul", mode, unique_indices)

  mul = multiply

  def divide(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
             mode: str | None = None) -> Array:
    """`x[index] /= values` (as JAX: x divided by the product of the values scattered into ones)."""
    from tinyjax.numpy._elementwise import divide
    ones = full(self.array.shape, 1, self.array.dtype, self.array.weak_type)
    return divide(self.array, scatter_update(ones, self.index, values, "mul", mode, unique_indices))

  def power(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Array:
    """`x[index] **= values` (as JAX: x to the power of the product of the values scattered into ones)."""
    from tinyjax.numpy._elementwise import power
    ones = full(self.array.shape, 1, self.array.dtype, self.array.weak_type)
    return power(self.array, scatter_update(ones, self.index, values, "mul", mode, unique_indices))

  def min(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
          mode: str | None = None) -> Array:
    """`x[index] = minimum(x[index], values)`."""
    return scatter_update(self.array, self.index, values, "min", mode, unique_indices)

  def max(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
          mode: str | None = None) -> Array:
    """`x[index] = maximum(x[index], values)`."""
    return scatter_update(self.array, self.index, values, "max", mode, unique_indices)

  def apply(self, func: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Array:
    """`x[index] = func(x[index])`, func applied once per update (twice to an element indexed twice, as JAX)."""
    from tinyjax.lax._gather import apply_counted
    counts = scatter_update(full(self.array.shape, 0, np.int32), self.index, 1, "add", mode, unique_indices)
    return apply_counted(self.array, counts, func)


class _IndexUpdateHelper:
  """The `x.at` property: `x.at[index]` is an `_IndexUpdateRef`."""
  __slots__ = ("array",)

  def __init__(self, array: Array):
    self.array = array

  def __getitem__(self, index: Any) -> _IndexUpdateRef: return _IndexUpdateRef(self.array, index)
  def __repr__(self) -> str: return f"_IndexUpdateHelper({self.array!r})"


# ---------------------------------------------------------------------------------------------------------- take

def _index_array(name: str, indices: Any) -> Array:
  if isinstance(indices, list): indices = np.asarray(indices)
  indices = to_array(indices)
  if not dtypes.issubdtype(indices.dtype, np.integer):
    raise TypeError(f"{name}: indices must be of integer type, got {indices.dtype.name}")
  return indices


@staged(static_argnames=("axis", "mode", "unique_indices", "indices_are_sorted", "fill_value"))
def take(a: Any, indices: Any, axis: int | None = None, out: None = None, mode: str | None = None,
         unique_indices: bool = False, indices_are_sorted: bool = False, fill_value: Any = None) -> Array:
  """Elements of `a` at `indices` along `axis` (flattened `a` when None). mode: "fill" (default, as JAX:
  out-of-bounds indices give `fill_value`, NaN for floats), "clip" (clamped) or "wrap" (modulo the axis size)."""
  if out is not None: raise NotImplementedError("The 'out' argument to take is not supported.")
  from tinyjax.numpy._shape import ravel
  a, indices = to_array(a), _index_array("take", indices)
  if axis is None: a, axis = ravel(a), 0
  from tinyjax.lax._base import canonicalize_axis
  axis = canonicalize_axis(axis, a.ndim)
  mode = "fill" if mode is None else mode
  if mode not in ("fill", "clip", "wrap", "promise_in_bounds"):
    raise ValueError(f"take: invalid mode {mode!r}; use 'fill', 'clip' or 'wrap'")
  return getitem(a, (slice(None),) * axis + (indices,), mode=mode, fill_value=fill_value)


def take_along_axis(arr: Any, indices: Any, axis: int | None, mode: str | None = None,
                    fill_value: Any = None) -> Array:
  """`arr` read at `indices` along `axis` (the other axes broadcast between the two, as numpy); out-of-bounds
  indices give `fill_value` (NaN for floats) unless mode="clip"."""
  from tinyjax.numpy._shape import ravel
  arr, indices = to_array(arr), _index_array("take_along_axis", indices)
  if axis is None:
    if indices.ndim != 1:
      raise ValueError(f"take_along_axis with axis=None requires 1-D indices, got shape {indices.shape}")
    arr, axis = ravel(arr), 0
  if indices.ndim != arr.ndim:
    raise ValueError(f"indices and arr must have the same number of dimensions; {indices.ndim} vs. {arr.ndim}")
  from tinyjax.lax._base import broadcast_shapes, canonicalize_axis
  axis = canonicalize_axis(axis, arr.ndim)
  other = [d for d in range(arr.ndim) if d != axis]
  shape = list(broadcast_shapes("take_along_axis", *(tuple(s[d] for d in other) for s in (arr.shape, indices.shape))))
  out_shape = list(shape)
  out_shape.insert(axis, indices.shape[axis])
  out_shape = tuple(out_shape)
  items = []
  for d in range(arr.ndim):
    if d == axis: items.append(expand_raw(indices, out_shape))
    elif arr.shape[d] == 1: items.append(full(out_shape, 0, np.int32))
    else: items.append(lax_shape.iota_along(np.int32, out_shape, d))
  return getitem(arr, tuple(items), mode="fill" if mode is None else mode, fill_value=fill_value)
