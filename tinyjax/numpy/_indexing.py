"""Basic indexing `x[...]`: integers (negative ones count from the end; out-of-bounds integers clamp, as JAX
reads), slices with any step (negative steps flip), None and Ellipsis. Built from FLIP, SHRINK, PAD and RESHAPE.

Integer-array and boolean-mask indexing need gather and are not supported yet (TypeError saying so); a Python list
as an index is a TypeError, as in JAX."""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from tinyjax.array import Array
from tinyjax.lax import _shape as lax_shape
from tinyjax.lax._base import reshape_raw


def _is_int_index(item: Any) -> bool:
  if isinstance(item, bool) or isinstance(item, np.bool_): return False
  if isinstance(item, (int, np.integer)): return True
  return isinstance(item, np.ndarray) and item.ndim == 0 and item.dtype.kind in "iu"


def _check_supported(item: Any) -> None:
  if item is None or item is Ellipsis or isinstance(item, slice) or _is_int_index(item): return
  if isinstance(item, list):
    raise TypeError("Using a non-tuple sequence for multidimensional indexing is not allowed; use `arr[tuple(seq)]` "
                    "instead of `arr[seq]` (or `arr[tinyjax.numpy.array(seq)]` once integer-array indexing lands)")
  if isinstance(item, (bool, np.bool_)):
    raise TypeError("boolean scalar indices (x[True]) are not supported yet")
  if isinstance(item, (Array, np.ndarray)):
    kind = "boolean-mask" if item.dtype == np.bool_ else "integer-array"
    raise TypeError(f"{kind} indexing (an index of shape {tuple(item.shape)} and dtype {item.dtype}) is not "
                    "supported yet: only integers, slices, None and Ellipsis are")
  raise TypeError(f"invalid index {item!r} of type {type(item).__name__}: only integers, slices, None and Ellipsis "
                  "are supported")


def getitem(x: Array, index: Any) -> Array:
  """x[index] for basic indices: ints, slices (any step), None, Ellipsis. Shape as numpy's."""
  items = index if isinstance(index, tuple) else (index,)
  for item in items: _check_supported(item)
  if sum(item is Ellipsis for item in items) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
  consumed = sum(1 for item in items if item is not None and item is not Ellipsis)
  if consumed > x.ndim:
    raise IndexError(f"Too many indices for array: {consumed} non-None/Ellipsis indices for dim {x.ndim}.")
  if any(item is Ellipsis for item in items):
    at = next(i for i, item in enumerate(items) if item is Ellipsis)
    items = items[:at] + (slice(None),) * (x.ndim - consumed) + items[at + 1:]
  else:
    items = items + (slice(None),) * (x.ndim - consumed)

  starts, limits, strides, flips, out_shape = [], [], [], set(), []
  axis = 0
  for item in items:
    if item is None:
      out_shape.append(1)
      continue
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
      position = operator.index(item)
      if size == 0: raise IndexError(f"index {position} is out of bounds for axis {axis} with size 0")
      if position < 0: position += size
      position = min(max(position, 0), size - 1)  # out-of-bounds reads clamp, as JAX
      starts.append(position)
      limits.append(position + 1)
      strides.append(1)
    axis += 1
  result = lax_shape.flip_raw(x, flips)
  result = lax_shape.strided_slice_raw(result, starts, limits, strides)
  return reshape_raw(result, out_shape)
