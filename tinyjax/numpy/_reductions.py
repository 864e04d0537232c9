"""Reductions of tinyjax.numpy over any axes, with keepdims: sum, prod, max, min, mean, var, std, argmax, argmin,
any, all. Result dtypes follow jax.numpy (`sum(u8) -> u32`, `sum(bool) -> i32`, `mean(int) -> f32`); float16 and
bfloat16 accumulate in float32 and round once. Results are strongly typed, as JAX's, even for weak inputs."""
from __future__ import annotations

import builtins
import math
from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax import _elementwise as ew
from tinyjax.lax import _reductions as lax_red
from tinyjax.lax._base import (BOOL, FLOAT32, LOW_PRECISION_FLOATS, canonicalize_axes, cast, expand_raw, like,
                               reshape_raw)
from tinyjax.numpy._elementwise import add, as_array, maximum, minimum, multiply
from tinyjax.uop import Ops

Axis = int | Sequence[int] | None


def _unsupported(out: Any, where: Any, name: str) -> None:
  if out is not None: raise NotImplementedError(f"{name}: the out argument is not supported (arrays are immutable)")
  if where is not None: raise NotImplementedError(f"{name}: the where argument is not supported yet")


def _dtype_arg(dtype: Any, name: str) -> np.dtype | None:
  return None if dtype is None else dtypes.check_user_dtype_supported(dtype, name)


def _with_initial(result: Array, initial: Any, combine) -> Array:
  return result if initial is None else cast(combine(result, initial), result.dtype, weak_type=False)


def sum(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,  # noqa: A001
        initial: Any = None, where: None = None) -> Array:
  """Sum over `axis` (None: all; a tuple: several). Dtype: `dtype`, else bool/int8/int16 -> int32,
  uint8/uint16 -> uint32, others unchanged; float16/bfloat16 accumulate in float32."""
  _unsupported(out, where, "sum")
  x = as_array(a, "sum")
  out_dtype = _dtype_arg(dtype, "sum") or dtypes.sum_dtype(x.dtype)
  axes = canonicalize_axes(axis, x.ndim)
  result = lax_red.sum_raw(cast(x, out_dtype, False), axes, keepdims)
  return _with_initial(result, initial, add)


def prod(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
         initial: Any = None, where: None = None) -> Array:
  """Product over `axis`, with `sum`'s result dtypes."""
  _unsupported(out, where, "prod")
  x = as_array(a, "prod")
  out_dtype = _dtype_arg(dtype, "prod") or dtypes.sum_dtype(x.dtype)
  result = lax_red.prod_raw(cast(x, out_dtype, False), canonicalize_axes(axis, x.ndim), keepdims)
  return _with_initial(result, initial, multiply)


def _extreme(name: str, a: Any, axis: Axis, out: Any, keepdims: bool, initial: Any, where: Any, find_max: bool):
  _unsupported(out, where, name)
  x = as_array(a, name)
  axes = canonicalize_axes(axis, x.ndim)
  if initial is None and builtins.any(x.shape[i] == 0 for i in axes):
    raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
  result = (lax_red.max_raw if find_max else lax_red.min_raw)(cast(x, x.dtype, False), axes, keepdims)
  return _with_initial(result, initial, maximum if find_max else minimum)


def max(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, initial: Any = None,  # noqa: A001
        where: None = None) -> Array:
  """Maximum over `axis` (NaN propagates); same dtype. ValueError for an empty reduction without `initial`."""
  return _extreme("max", a, axis, out, keepdims, initial, where, True)


def min(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, initial: Any = None,  # noqa: A001
        where: None = None) -> Array:
  """Minimum over `axis` (NaN propagates); same dtype. ValueError for an empty reduction without `initial`."""
  return _extreme("min", a, axis, out, keepdims, initial, where, False)


amax, amin = max, min


def _count(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
  return math.prod(shape[i] for i in axes)


def mean(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
         where: None = None) -> Array:
  """Arithmetic mean over `axis`. Dtype: `dtype`, else floats unchanged and integers/bools -> float32 (64-bit ints
  -> float64 under x64); float16/bfloat16 are computed in float32."""
  _unsupported(out, where, "mean")
  x = as_array(a, "mean")
  out_dtype = _dtype_arg(dtype, "mean") or dtypes.mean_dtype(x.dtype)
  axes = canonicalize_axes(axis, x.ndim)
  compute = dtypes.accumulation_dtype(out_dtype) if dtypes.is_floating(out_dtype) else out_dtype
  total = lax_red.reduce_raw(cast(x, compute), Ops.ADD, axes, keepdims) if compute != BOOL else \
    lax_red.sum_raw(cast(x, compute), axes, keepdims)
  count = _count(x.shape, axes)
  result = ew._fdiv(total, like(total, count)) if dtypes.is_floating(compute) else \
    ew._binary(Ops.IDIV, total, like(total, builtins.max(count, 1)))
  return cast(result, out_dtype, weak_type=False)


def var(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, ddof: int = 0, keepdims: bool = False,
        where: None = None) -> Array:
  """Variance over `axis`: mean of squared deviations from the mean (two passes), divided by N - ddof.
  Dtypes as `mean`; float16/bfloat16 are computed in float32."""
  _unsupported(out, where, "var")
  x = as_array(a, "var")
  out_dtype = _dtype_arg(dtype, "var") or dtypes.mean_dtype(x.dtype)
  if not dtypes.is_floating(out_dtype): out_dtype = dtypes.mean_dtype(out_dtype)
  compute = FLOAT32 if out_dtype in LOW_PRECISION_FLOATS else out_dtype
  axes = canonicalize_axes(axis, x.ndim)
  values = cast(x, compute)
  count = _count(x.shape, axes)
  total = lax_red.reduce_raw(values, Ops.ADD, axes, keepdims=True)
  centre = ew._fdiv(total, like(total, count))
  deviations = ew._sub(values, expand_raw(centre, values.shape))
  squares = lax_red.reduce_raw(ew._mul(deviations, deviations), Ops.ADD, axes, keepdims)
  result = ew._fdiv(squares, like(squares, builtins.max(count - ddof, 0)))
  return cast(result, out_dtype, weak_type=False)


def std(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, ddof: int = 0, keepdims: bool = False,
        where: None = None) -> Array:
  """Standard deviation over `axis`: sqrt(var(a, axis, ddof=ddof)). Dtypes as `mean`."""
  variance = var(a, axis, dtype, out, ddof, keepdims, where)
  return ew._in_float32(ew._sqrt)(variance)


def _arg_extreme(name: str, a: Any, axis: int | None, keepdims: bool, find_max: bool) -> Array:
  x = as_array(a, name)
  index_dtype = dtypes.default_int_dtype()
  if axis is None:
    if x.size == 0: raise ValueError(f"attempt to get {name} of an empty sequence")
    flat = reshape_raw(x, (x.size,))
    result = lax_red.arg_extreme_raw(flat, 0, find_max, index_dtype)
    return reshape_raw(result, (1,) * x.ndim) if keepdims else result
  (axis,) = canonicalize_axes(axis, x.ndim)
  if x.shape[axis] == 0: raise ValueError(f"attempt to get {name} of an empty sequence")
  return lax_red.arg_extreme_raw(x, axis, find_max, index_dtype, keepdims)


def argmax(a: Any, axis: int | None = None, out: None = None, keepdims: bool = False) -> Array:
  """Index of the first maximum along `axis` (None: of the flattened array), default int dtype; NaN is maximal."""
  _unsupported(out, None, "argmax")
  return _arg_extreme("argmax", a, axis, keepdims, True)


def argmin(a: Any, axis: int | None = None, out: None = None, keepdims: bool = False) -> Array:
  """Index of the first minimum along `axis` (None: of the flattened array), default int dtype; NaN is minimal."""
  _unsupported(out, None, "argmin")
  return _arg_extreme("argmin", a, axis, keepdims, False)


def any(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, where: None = None) -> Array:  # noqa: A001
  """Whether any element along `axis` is nonzero (bool)."""
  _unsupported(out, where, "any")
  x = as_array(a, "any")
  return lax_red.max_raw(cast(x, BOOL, False), canonicalize_axes(axis, x.ndim), keepdims)


def all(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, where: None = None) -> Array:  # noqa: A001
  """Whether every element along `axis` is nonzero (bool; True for an empty reduction)."""
  _unsupported(out, where, "all")
  x = as_array(a, "all")
  return lax_red.min_raw(cast(x, BOOL, False), canonicalize_axes(axis, x.ndim), keepdims)
