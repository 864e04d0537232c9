"""Sorting and cumulative reductions of tinyjax.numpy: `sort`, `argsort`, `lexsort`, `cumsum`, `cumprod`, `cummax`,
`cummin`, `cumulative_sum`, `cumulative_prod`.

Sorting is lax's bitonic network (tinyjax/lax/_sort.py), cumulative reductions lax's log-step scan
(tinyjax/lax/_cumulative.py). Sums of 16-bit floats accumulate in float32; sums of bools and small ints take numpy's
result dtypes, as JAX.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, cast, full, reshape_raw, staged, to_array
from tinyjax.lax._shape import concatenate, pad_raw
from tinyjax.lax._cumulative import cumulative_raw
from tinyjax.lax._sort import argsort_raw, lexsort_raw, sort_raw


def _as_array(a: Any, name: str) -> Array:
  if isinstance(a, (list, tuple)):
    raise TypeError(f"{name} requires ndarray or scalar arguments, got {type(a).__name__}: use asarray first")
  return to_array(a)


@staged(static_argnames=("axis", "kind", "order", "stable", "descending"))
def sort(a: Any, axis: int | None = -1, *, kind: str | None = None, order: None = None, stable: bool = True,
         descending: bool = False) -> Array:
  """`a` sorted along `axis` (None: flattened), ascending (or `descending`), NaN last; stable."""
  if order is not None: raise TypeError("'order' argument to sort is not supported.")
  x = _as_array(a, "sort")
  if axis is None: x, axis = reshape_raw(x, (x.size,)), 0
  if x.ndim == 0: raise ValueError("sort requires an array with at least one dimension: use axis=None")
  return sort_raw(x, canonicalize_axis(axis, x.ndim), descending)


@staged(static_argnames=("axis", "kind", "order", "stable", "descending"))
def argsort(a: Any, axis: int | None = -1, *, kind: str | None = None, order: None = None, stable: bool = True,
            descending: bool = False) -> Array:
  """The indices (default int dtype) that sort `a` along `axis` (None: flattened); stable, ties in their original
  order."""
  if order is not None: raise TypeError("'order' argument to argsort is not supported.")
  x = _as_array(a, "argsort")
  if axis is None: x, axis = reshape_raw(x, (x.size,)), 0
  if x.ndim == 0: raise ValueError("argsort requires an array with at least one dimension: use axis=None")
  return cast(argsort_raw(x, canonicalize_axis(axis, x.ndim), descending), dtypes.default_int_dtype(), False)


@staged(static_argnames=("axis",))
def lexsort(keys: Sequence[Any], axis: int = -1) -> Array:
  """Indices sorting by the last key, ties broken by the one before, and so on (numpy's lexsort)."""
  arrays = [_as_array(k, "lexsort") for k in keys]
  if not arrays: raise TypeError("need sequence of keys with len > 0 in lexsort")
  shape = arrays[0].shape
  if any(k.shape != shape for k in arrays): raise ValueError("all keys need to be the same shape")
  if not shape: raise TypeError("lexsort keys must have at least one dimension")
  return cast(lexsort_raw(arrays, canonicalize_axis(axis, len(shape))), dtypes.default_int_dtype(), False)


@staged()
def sort_complex(a: Any) -> Array:
  """`a` sorted along its last axis as complex numbers (by real part, then imaginary part; NaNs last), in the
  complex dtype of its kind (float32 and smaller give complex64)."""
  x = _as_array(a, "sort_complex")
  if x.ndim == 0: raise ValueError("sort_complex requires an array with at least one dimension")
  x = sort_raw(x, x.ndim - 1)
  return cast(x, dtypes.complex_dtype(dtypes.to_inexact_dtype(x.dtype)), False)


# ------------------------------------------------------------------------------------------------ cumulative

def _accumulated_dtype(name: str, dtype: np.dtype) -> np.dtype:
  """The result dtype of a cumulative sum or product, as JAX's: bools become the default int; `cumulative_sum` (the
  array API's) widens narrow integers as `sum` does; `cumsum`, `cumprod` and `cumulative_prod` keep the dtype."""
  if name == "cumulative_sum": return dtypes.sum_dtype(dtype)
  return dtypes.default_int_dtype() if dtype == np.bool_ else dtype


def _cumulative(name: str, combine: str, a: Any, axis: int | None, dtype: Any, reverse: bool = False,
                include_initial: bool = False) -> Array:
  x = _as_array(a, name)
  if axis is None:
    x, axis = reshape_raw(x, (x.size,)), 0
  elif x.ndim == 0:
    raise ValueError(f"{name}: axis {axis} is out of bounds for array of dimension 0")
  axis = canonicalize_axis(axis, x.ndim)
  if dtype is not None: target = dtypes.check_user_dtype_supported(dtype, name)
  elif combine in ("add", "mul"): target = _accumulated_dtype(name, x.dtype)
  else: target = x.dtype
  accumulate = np.dtype(np.float32) if target in (np.dtype(np.float16), np.dtype(dtypes.bfloat16)) else target
  result = cast(cumulative_raw(cast(x, accumulate, False), axis, combine, reverse), target, False)
  if include_initial:  # a sum's leading 0
    padding = [(0, 0)] * result.ndim
    padding[axis] = (1, 0)
    result = pad_raw(result, padding)
  return result


def cumsum(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
  """Cumulative sum along `axis` (None: of the flattened array); bools and small ints sum in the default int."""
  return _cumulative("cumsum", "add", a, axis, dtype)


def cumprod(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
  """Cumulative product along `axis` (None: of the flattened array)."""
  return _cumulative("cumprod", "mul", a, axis, dtype)


def cumulative_sum(x: Any, /, *, axis: int | None = None, dtype: Any = None, include_initial: bool = False) -> Array:
  """The array API's cumulative sum (axis required above 1-D; `include_initial` prepends a 0)."""
  array = _as_array(x, "cumulative_sum")
  if axis is None and array.ndim > 1:
    raise ValueError("cumulative_sum: axis must be specified for arrays of more than one dimension")
  return _cumulative("cumulative_sum", "add", array, 0 if axis is None else axis, dtype,
                     include_initial=include_initial)


def cumulative_prod(x: Any, /, *, axis: int | None = None, dtype: Any = None, include_initial: bool = False) -> Array:
  """The array API's cumulative product (axis required above 1-D; `include_initial` prepends a 1)."""
  array = _as_array(x, "cumulative_prod")
  if axis is None and array.ndim > 1:
    raise ValueError("cumulative_prod: axis must be specified for arrays of more than one dimension")
  result = _cumulative("cumulative_prod", "mul", array, 0 if axis is None else axis, dtype)
  if not include_initial: return result
  axis = canonicalize_axis(0 if axis is None else axis, result.ndim)
  shape = list(result.shape)
  shape[axis] = 1
  ones = full(tuple(shape), 1, result.dtype)
  return concatenate([ones, result], axis)


def cummax(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
  """Running maximum along `axis` (NaN propagates)."""
  return _cumulative("cummax", "max", a, axis, dtype)


def cummin(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
  """Running minimum along `axis` (NaN propagates)."""
  return _cumulative("cummin", "min", a, axis, dtype)

