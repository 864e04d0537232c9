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
                               reshape_raw, staged)
from tinyjax.numpy._elementwise import add, as_array, maximum, minimum, multiply
from tinyjax.trace.core import Primitive
from tinyjax.uop import Ops

Axis = int | Sequence[int] | None


def _unsupported(out: Any, where: Any, name: str) -> None:
  if out is not None: raise NotImplementedError(f"{name}: the out argument is not supported (arrays are immutable)")


def _masked(x: Array, where: Any, fill: Any) -> Array:
  """x with the elements where `where` (broadcast to x's shape) is False replaced by `fill` (the reduction's
  identity), so a reduction of it reduces only the selected elements."""
  if where is None: return x
  mask = cast(as_array(where, "where"), BOOL, False)
  from tinyjax.numpy._shape import broadcast_to
  return ew._where(broadcast_to(mask, x.shape), x, like(x, fill))


def _selected_count(x: Array, where: Any, axes: tuple[int, ...], keepdims: bool) -> Array | int:
  """How many elements each reduction over `axes` reduces: a constant, or (with `where`) a count of the mask."""
  if where is None: return _count(x.shape, axes)
  from tinyjax.numpy._shape import broadcast_to
  mask = broadcast_to(cast(as_array(where, "where"), BOOL, False), x.shape)
  return lax_red.sum_raw(cast(mask, dtypes.default_int_dtype(), False), axes, keepdims)


def _dtype_arg(dtype: Any, name: str) -> np.dtype | None:
  return None if dtype is None else dtypes.check_user_dtype_supported(dtype, name)


def _with_initial(result: Array, initial: Any, combine) -> Array:
  return result if initial is None else cast(combine(result, initial), result.dtype, weak_type=False)


@staged(static_argnames=("axis", "dtype", "keepdims", "initial"))
def sum(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,  # noqa: A001
        initial: Any = None, where: Any = None) -> Array:
  """Sum over `axis` (None: all; a tuple: several). Dtype: `dtype`, else bool/int8/int16 -> int32,
  uint8/uint16 -> uint32, others unchanged; float16/bfloat16 accumulate in float32."""
  _unsupported(out, where, "sum")
  x = as_array(a, "sum")
  out_dtype = _dtype_arg(dtype, "sum") or dtypes.sum_dtype(x.dtype)
  axes = canonicalize_axes(axis, x.ndim)
  result = lax_red.sum_raw(_masked(cast(x, out_dtype, False), where, 0), axes, keepdims)
  return _with_initial(result, initial, add)


@staged(static_argnames=("axis", "dtype", "keepdims", "initial"))
def prod(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
         initial: Any = None, where: Any = None) -> Array:
  """Product over `axis`, with `sum`'s result dtypes."""
  _unsupported(out, where, "prod")
  x = as_array(a, "prod")
  out_dtype = _dtype_arg(dtype, "prod") or dtypes.sum_dtype(x.dtype)
  result = lax_red.prod_raw(_masked(cast(x, out_dtype, False), where, 1), canonicalize_axes(axis, x.ndim), keepdims)
  return _with_initial(result, initial, multiply)


def _extreme(name: str, a: Any, axis: Axis, out: Any, keepdims: bool, initial: Any, where: Any, find_max: bool):
  _unsupported(out, where, name)
  x = as_array(a, name)
  axes = canonicalize_axes(axis, x.ndim)
  if initial is None and builtins.any(x.shape[i] == 0 for i in axes):
    raise ValueError(f"zero-size array to reduction operation {name} which has no identity")
  if where is not None:
    if initial is None:
      raise ValueError(f"reduction operation {name} does not have an identity, so to use a where mask one has to "
                       "specify 'initial'")
    x = _masked(x, where, initial)
  result = (lax_red.max_raw if find_max else lax_red.min_raw)(cast(x, x.dtype, False), axes, keepdims)
  return _with_initial(result, initial, maximum if find_max else minimum)


@staged(static_argnames=("axis", "keepdims", "initial"))
def max(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, initial: Any = None,  # noqa: A001
        where: Any = None) -> Array:
  """Maximum over `axis` (NaN propagates); same dtype. ValueError for an empty reduction without `initial`."""
  return _extreme("max", a, axis, out, keepdims, initial, where, True)


@staged(static_argnames=("axis", "keepdims", "initial"))
def min(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, initial: Any = None,  # noqa: A001
        where: Any = None) -> Array:
  """Minimum over `axis` (NaN propagates); same dtype. ValueError for an empty reduction without `initial`."""
  return _extreme("min", a, axis, out, keepdims, initial, where, False)


amax, amin = max, min


def _count(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
  return math.prod(shape[i] for i in axes)


@staged(static_argnames=("axis", "dtype", "keepdims"))
def mean(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
         where: Any = None) -> Array:
  """Arithmetic mean over `axis`. Dtype: `dtype`, else floats unchanged and integers/bools -> float32 (64-bit ints
  -> float64 under x64); float16/bfloat16 are computed in float32."""
  _unsupported(out, where, "mean")
  x = as_array(a, "mean")
  out_dtype = _dtype_arg(dtype, "mean") or dtypes.mean_dtype(x.dtype)
  axes = canonicalize_axes(axis, x.ndim)
  compute = dtypes.accumulation_dtype(out_dtype) if dtypes.is_floating(out_dtype) else out_dtype
  values = _masked(cast(x, compute), where, 0)
  total = lax_red.sum_raw(values, axes, keepdims)
  count = _selected_count(x, where, axes, keepdims)
  if not isinstance(count, int):
    return cast(ew._fdiv(total, cast(count, total.dtype, False)), out_dtype, weak_type=False)
  result = ew._fdiv(total, like(total, count)) if dtypes.is_inexact(compute) else \
    ew._binary(Ops.IDIV, total, like(total, builtins.max(count, 1)))
  return cast(result, out_dtype, weak_type=False)


def var(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, ddof: int = 0, keepdims: bool = False,
        *, where: Any = None, correction: int | float | None = None) -> Array:
  """Variance over `axis`: mean of squared deviations from the mean (two passes), divided by N - correction
  (`correction`, or numpy's `ddof`). Dtypes as `mean` (complex input: the real part's dtype, the mean of |x - mean|^2);
  float16/bfloat16 are computed in float32. (Without `where`, one `var` primitive: see `_statistic`.)"""
  return _statistic(var_p, "var", a, axis, dtype, out, ddof, keepdims, where, correction)


def std(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, ddof: int = 0, keepdims: bool = False,
        *, where: Any = None, correction: int | float | None = None) -> Array:
  """Standard deviation over `axis`: sqrt(var(a, axis, ddof=ddof)). Dtypes as `mean`."""
  return _statistic(std_p, "std", a, axis, dtype, out, ddof, keepdims, where, correction)


def _statistic(prim: Primitive, name: str, a: Any, axis: Axis, dtype: Any, out: None, ddof: Any, keepdims: bool,
               where: Any, correction: Any) -> Array:
  """`var` / `std` with their arguments checked: without `where`, a call of their primitive (`prim`), so that an eager
  call is one node (trace/core.py `stage_call`: `float(jnp.std(x))` built 15 nodes op by op, 67 us against JAX's
  12) whose decomposition is lowered, differentiated and batched as if it had been written out."""
  _unsupported(out, where, name)
  if correction is not None:
    if ddof: raise ValueError("ddof and correction can't be provided simultaneously.")
    ddof = correction
  x = as_array(a, name)
  axes, dtype = canonicalize_axes(axis, x.ndim), _dtype_arg(dtype, name)
  if where is not None: return _var(x, axes, dtype, ddof, bool(keepdims), where, prim is std_p)
  return prim.bind(x, axes=axes, dtype=dtype, ddof=ddof, keepdims=bool(keepdims))


def _var(x: Array, axes: tuple[int, ...], dtype: np.dtype | None, ddof: Any, keepdims: bool, where: Any = None,
         root: bool = False) -> Array:
  out_dtype = dtype or dtypes.mean_dtype(x.dtype)
  if not dtypes.is_floating(out_dtype): out_dtype = dtypes.mean_dtype(out_dtype)
  compute = FLOAT32 if out_dtype in LOW_PRECISION_FLOATS else out_dtype
  values = _masked(cast(x, compute), where, 0)
  total = lax_red.sum_raw(values, axes, keepdims=True)
  count = _selected_count(x, where, axes, True)
  count = like(total, count) if isinstance(count, int) else cast(count, compute, False)
  centre = ew._fdiv(total, count)
  deviations = _masked(ew._sub(values, expand_raw(centre, values.shape)), where, 0)
  if dtypes.is_complex(compute):  # |d|^2: the variance of complex numbers is real (numpy's and JAX's)
    real, imag = ew._real(deviations), ew._imag(deviations)
    squared, out_dtype = ew._add(ew._mul(real, real), ew._mul(imag, imag)), dtypes.real_dtype(out_dtype)
    count = ew._real(count)
  else:
    squared = ew._mul(deviations, deviations)
  squares = lax_red.sum_raw(squared, axes, keepdims=True)
  divisor = ew._max(ew._sub(count, like(count, ddof)), like(count, 0))
  result = ew._fdiv(squares, divisor)
  if not keepdims: result = reshape_raw(result, tuple(d for i, d in enumerate(x.shape) if i not in axes))
  result = cast(result, out_dtype, weak_type=False)
  return ew._in_float32(ew._sqrt)(result) if root else result


var_p = Primitive("var", lambda x, *, axes, dtype, ddof, keepdims: _var(x, axes, dtype, ddof, keepdims))
std_p = Primitive("std", lambda x, *, axes, dtype, ddof, keepdims: _var(x, axes, dtype, ddof, keepdims, root=True))


def _arg_extreme(name: str, a: Any, axis: int | None, keepdims: bool, find_max: bool) -> Array:
  x = as_array(a, name)
  if dtypes.is_complex(x.dtype):  # (JAX's rule; sort_complex / argsort order complex numbers)
    raise TypeError(f"{name} does not accept dtype {x.dtype.name}: complex numbers have no natural ordering "
                    "(argsort orders them lexicographically)")
  index_dtype = dtypes.default_int_dtype()
  if axis is None:
    if x.size == 0: raise ValueError(f"attempt to get {name} of an empty sequence")
    flat = reshape_raw(x, (x.size,))
    result = lax_red.arg_extreme_raw(flat, 0, find_max, index_dtype)
    return reshape_raw(result, (1,) * x.ndim) if keepdims else result
  (axis,) = canonicalize_axes(axis, x.ndim)
  if x.shape[axis] == 0: raise ValueError(f"attempt to get {name} of an empty sequence")
  return lax_red.arg_extreme_raw(x, axis, find_max, index_dtype, keepdims)


@staged(static_argnames=("axis", "keepdims"))
def argmax(a: Any, axis: int | None = None, out: None = None, keepdims: bool = False) -> Array:
  """Index of the first maximum along `axis` (None: of the flattened array), default int dtype; NaN is maximal."""
  _unsupported(out, None, "argmax")
  return _arg_extreme("argmax", a, axis, keepdims, True)


@staged(static_argnames=("axis", "keepdims"))
def argmin(a: Any, axis: int | None = None, out: None = None, keepdims: bool = False) -> Array:
  """Index of the first minimum along `axis` (None: of the flattened array), default int dtype; NaN is minimal."""
  _unsupported(out, None, "argmin")
  return _arg_extreme("argmin", a, axis, keepdims, False)


@staged(static_argnames=("axis", "keepdims"))
def any(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, where: Any = None) -> Array:  # noqa: A001
  """Whether any element along `axis` is nonzero (bool)."""
  _unsupported(out, where, "any")
  x = as_array(a, "any")
  return lax_red.max_raw(_masked(cast(x, BOOL, False), where, False), canonicalize_axes(axis, x.ndim), keepdims)


@staged(static_argnames=("axis", "keepdims"))
def all(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, where: Any = None) -> Array:  # noqa: A001
  """Whether every element along `axis` is nonzero (bool; True for an empty reduction)."""
  _unsupported(out, where, "all")
  x = as_array(a, "all")
  return lax_red.min_raw(_masked(cast(x, BOOL, False), where, True), canonicalize_axes(axis, x.ndim), keepdims)


# ------------------------------------------------------------------------------------------ NaN-ignoring reductions

def _isnan(x: Array) -> Array: return ew._isnan(x) if dtypes.is_floating(x.dtype) else like(x, False, BOOL)


@staged(static_argnames=("axis", "dtype", "keepdims", "initial"))
def nansum(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
           initial: Any = None, where: Any = None) -> Array:
  """`sum` with NaNs counted as 0."""
  x = as_array(a, "nansum")
  return sum(ew._where(_isnan(x), like(x, 0), x), axis, dtype, out, keepdims, initial, where)


@staged(static_argnames=("axis", "dtype", "keepdims", "initial"))
def nanprod(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
            initial: Any = None, where: Any = None) -> Array:
  """`prod` with NaNs counted as 1."""
  x = as_array(a, "nanprod")
  return prod(ew._where(_isnan(x), like(x, 1), x), axis, dtype, out, keepdims, initial, where)


def _nan_extreme(name: str, a: Any, axis: Axis, keepdims: bool, find_max: bool) -> Array:
  x = as_array(a, name)
  if not dtypes.is_floating(x.dtype): return (max if find_max else min)(x, axis, keepdims=keepdims)
  fill = -math.inf if find_max else math.inf
  result = (max if find_max else min)(ew._where(ew._isnan(x), like(x, fill), x), axis, keepdims=keepdims)
  all_nan = all(ew._isnan(x), axis, keepdims=keepdims)
  return ew._where(all_nan, like(result, math.nan), result)


@staged(static_argnames=("axis", "keepdims", "initial"))
def nanmax(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, initial: Any = None,
           where: Any = None) -> Array:
  """Maximum ignoring NaNs (NaN where every element is NaN)."""
  _unsupported(out, None, "nanmax")
  if initial is not None or where is not None:
    raise NotImplementedError("nanmax: initial= and where= are not supported")
  return _nan_extreme("nanmax", a, axis, keepdims, True)


@staged(static_argnames=("axis", "keepdims", "initial"))
def nanmin(a: Any, axis: Axis = None, out: None = None, keepdims: bool = False, initial: Any = None,
           where: Any = None) -> Array:
  """Minimum ignoring NaNs (NaN where every element is NaN)."""
  _unsupported(out, None, "nanmin")
  if initial is not None or where is not None:
    raise NotImplementedError("nanmin: initial= and where= are not supported")
  return _nan_extreme("nanmin", a, axis, keepdims, False)


@staged(static_argnames=("axis", "dtype", "keepdims"))
def nanmean(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, keepdims: bool = False,
            where: Any = None) -> Array:
  """Mean of the non-NaN elements (NaN where there are none)."""
  x = as_array(a, "nanmean")
  keep = ew._not(_isnan(x))
  if where is not None: keep = ew._and(keep, cast(as_array(where, "where"), BOOL, False))
  return mean(x, axis, dtype, out, keepdims, where=keep)


@staged(static_argnames=("axis", "dtype", "ddof", "keepdims"))
def nanvar(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, ddof: int = 0, keepdims: bool = False,
           where: Any = None, correction: int | float | None = None) -> Array:
  """Variance of the non-NaN elements."""
  x = as_array(a, "nanvar")
  keep = ew._not(_isnan(x))
  if where is not None: keep = ew._and(keep, cast(as_array(where, "where"), BOOL, False))
  return var(x, axis, dtype, out, ddof, keepdims, where=keep, correction=correction)


@staged(static_argnames=("axis", "dtype", "ddof", "keepdims"))
def nanstd(a: Any, axis: Axis = None, dtype: Any = None, out: None = None, ddof: int = 0, keepdims: bool = False,
           where: Any = None, correction: int | float | None = None) -> Array:
  """Standard deviation of the non-NaN elements."""
  return ew._in_float32(ew._sqrt)(nanvar(a, axis, dtype, out, ddof, keepdims, where, correction))


def _nan_arg(name: str, a: Any, axis: int | None, keepdims: bool, find_max: bool) -> Array:
  x = as_array(a, name)
  if not dtypes.is_floating(x.dtype): return _arg_extreme(name, x, axis, keepdims, find_max)
  fill = -math.inf if find_max else math.inf
  result = _arg_extreme(name, ew._where(ew._isnan(x), like(x, fill), x), axis, keepdims, find_max)
  all_nan = all(ew._isnan(x), axis, keepdims=keepdims)
  return ew._where(all_nan, like(result, -1), result)


@staged(static_argnames=("axis", "keepdims"))
def nanargmax(a: Any, axis: int | None = None, out: None = None, keepdims: bool = False) -> Array:
  """Index of the maximum ignoring NaNs (-1 where every element is NaN, as JAX)."""
  return _nan_arg("nanargmax", a, axis, keepdims, True)


@staged(static_argnames=("axis", "keepdims"))
def nanargmin(a: Any, axis: int | None = None, out: None = None, keepdims: bool = False) -> Array:
  """Index of the minimum ignoring NaNs (-1 where every element is NaN, as JAX)."""
  return _nan_arg("nanargmin", a, axis, keepdims, False)


@staged(static_argnames=("axis", "keepdims"))
def count_nonzero(a: Any, axis: Axis = None, keepdims: bool = False) -> Array:
  """How many elements are nonzero along `axis` (int32)."""
  x = as_array(a, "count_nonzero")
  return sum(cast(x, BOOL, False), axis, dtype=dtypes.default_int_dtype(), keepdims=keepdims)
