"""Array creation in tinyjax.numpy: array/asarray (host data in), zeros/ones/full/empty (+ *_like), arange,
linspace, eye, identity, and the dtype scalar types (`tnp.float32(1)` is a strongly typed Array, as in JAX).

Constant arrays are lazy CONSTs broadcast to their shape: they take no memory and fuse into their consumers."""
from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.placement import with_device
from tinyjax.lax import _elementwise as ew
from tinyjax.lax import _shape as lax_shape
from tinyjax.lax._base import LOW_PRECISION_FLOATS, cast, expand_raw, host_to_array, is_array, like, staged


def _shape_tuple(shape: int | Sequence[int]) -> tuple[int, ...]:
  if isinstance(shape, (int, np.integer)): shape = (shape,)
  try:
    out = tuple(operator.index(d) for d in shape)
  except TypeError as err:
    raise TypeError(f"Shapes must be 1D sequences of concrete values of integer type, got {shape!r}") from err
  if any(d < 0 for d in out): raise ValueError(f"negative dimensions are not allowed: {out}")
  return out


def _requested(dtype: Any, name: str) -> np.dtype | None:
  return None if dtype is None else dtypes.check_user_dtype_supported(dtype, name)


def _contains_array(value: Any) -> bool:
  if is_array(value): return True
  return isinstance(value, (list, tuple)) and any(_contains_array(item) for item in value)


@with_device
def asarray(a: Any, dtype: Any = None, order: str | None = None, copy: bool | None = None) -> Array:
  """An Array from `a` (Array, numpy array or scalar, Python scalar, nested lists/tuples of those).

  Without `dtype`, numpy data keeps its dtype (64-bit ones become 32-bit unless x64, silently), Python scalars get
  the default dtypes and are weakly typed, lists take the JAX result type of their elements. Arrays are returned
  as they are (converted if `dtype` is given). Complex, object and string data raise TypeError."""
  del order, copy  # arrays are immutable: copies are never observable
  target = _requested(dtype, "asarray")
  if is_array(a): return a if target is None else cast(a, target, weak_type=False)
  if isinstance(a, (list, tuple)) and _contains_array(a):
    from tinyjax.numpy._shape import stack  # noqa: PLC0415 (stack is built on asarray)
    if not a: raise ValueError("cannot build an array from an empty sequence containing arrays")
    return stack([asarray(item, target) for item in a])
  if isinstance(a, ScalarType):
    raise TypeError(f"cannot convert the dtype {a!r} itself to an array; call it instead: {a!r}(value)")
  return host_to_array(a, target)


@with_device
def array(object: Any, dtype: Any = None, copy: bool = True, order: str | None = "K",  # noqa: A002
          ndmin: int = 0) -> Array:
  """Like `asarray`, with `ndmin` leading size-1 axes added as needed."""
  out = asarray(object, dtype)
  if out.ndim < ndmin: out = lax_shape.reshape(out, (1,) * (ndmin - out.ndim) + out.shape)
  return out


@with_device
def full(shape: int | Sequence[int], fill_value: Any, dtype: Any = None) -> Array:
  """An array of `shape` filled with `fill_value` (scalar, or an array broadcast to `shape`). Without `dtype`, the
  fill value's dtype (Python scalars: default dtypes, weakly typed)."""
  shape = _shape_tuple(shape)
  if is_array(fill_value) or (isinstance(fill_value, (np.ndarray, list, tuple)) and np.ndim(fill_value) > 0):
    from tinyjax.numpy._shape import broadcast_to  # noqa: PLC0415
    return broadcast_to(asarray(fill_value, dtype), shape)
  return lax_shape.full(shape, fill_value, dtype)


@with_device
def zeros(shape: int | Sequence[int], dtype: Any = None) -> Array:
  """An array of `shape` filled with 0 (default dtype: float32, float64 under x64)."""
  return lax_shape.full(_shape_tuple(shape), 0, _requested(dtype, "zeros") or dtypes.default_float_dtype())


@with_device
def ones(shape: int | Sequence[int], dtype: Any = None) -> Array:
  """An array of `shape` filled with 1 (default dtype: float32, float64 under x64)."""
  return lax_shape.full(_shape_tuple(shape), 1, _requested(dtype, "ones") or dtypes.default_float_dtype())


@with_device
def empty(shape: int | Sequence[int], dtype: Any = None) -> Array:
  """As `zeros` (arrays are immutable, so an uninitialised array is never useful)."""
  return zeros(shape, dtype)


@with_device
def full_like(a: Any, fill_value: Any, dtype: Any = None, shape: Any = None) -> Array:
  """An array with the shape and dtype of `a` (unless given) filled with `fill_value`."""
  a = a if is_array(a) else asarray(a)
  out_shape = None if shape is None else _shape_tuple(shape)
  if is_array(fill_value) and fill_value.ndim:
    from tinyjax.numpy._shape import broadcast_to  # noqa: PLC0415
    target = _requested(dtype, "full_like") or a.dtype
    return broadcast_to(cast(fill_value, target, weak_type=False), out_shape or a.shape)
  return lax_shape.full_like(a, fill_value, _requested(dtype, "full_like"), out_shape)


@with_device
def zeros_like(a: Any, dtype: Any = None, shape: Any = None) -> Array:
  """Zeros with the shape and dtype of `a` (unless given)."""
  return full_like(a, 0, dtype, shape)


@with_device
def ones_like(a: Any, dtype: Any = None, shape: Any = None) -> Array:
  """Ones with the shape and dtype of `a` (unless given)."""
  return full_like(a, 1, dtype, shape)


@with_device
def empty_like(a: Any, dtype: Any = None, shape: Any = None) -> Array:
  """As `zeros_like`."""
  return full_like(a, 0, dtype, shape)


def _static_number(value: Any, name: str) -> int | float:
  if is_array(value):
    raise TypeError(f"{name}: arguments must be concrete Python or numpy scalars here, got an Array")
  if isinstance(value, (np.ndarray, np.generic)): value = value.item()
  return value


@with_device
@staged(static_argnames=("start", "stop", "step", "dtype"))
def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> Array:
  """[start, start + step, ...) below `stop` (static numbers). Dtype: `dtype`, else int32 for integer arguments
  and float32 if any is a float (64-bit under x64), as JAX."""
  if stop is None: start, stop = 0, start  # (numpy's rule: a lone start is the stop, whatever the step)
  step = 1 if step is None else step
  values = [_static_number(v, "arange") for v in (start, stop, step)]
  start, stop, step = values
  if step == 0: raise ValueError("arange: step must not be zero")
  if dtype is None:
    out_dtype = dtypes.result_type(*[type(v) if isinstance(v, (bool, int, float)) else v for v in values])
    if out_dtype == np.dtype(np.bool_): out_dtype = dtypes.default_int_dtype()
  else:
    out_dtype = dtypes.check_user_dtype_supported(dtype, "arange")
  if all(isinstance(v, (bool, int)) for v in values): size = len(range(start, stop, step))
  else: size = max(int(math.ceil((stop - start) / step)), 0)
  if dtypes.is_floating(out_dtype):
    compute = np.dtype(np.float32) if out_dtype in LOW_PRECISION_FLOATS else out_dtype
  else:
    compute = dtypes.default_int_dtype()
  index = lax_shape.iota(compute, size)
  if step != 1: index = ew._mul(index, like(index, step))
  if start != 0: index = ew._add(index, like(index, start))
  return cast(index, out_dtype, weak_type=False)


@with_device
@staged(static_argnames=("num", "endpoint", "retstep", "dtype", "axis"))
def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, retstep: bool = False,
             dtype: Any = None, axis: int = 0) -> Array | tuple[Array, Array]:
  """`num` evenly spaced values from `start` to `stop` (included if `endpoint`), along a new axis `axis` when
  start/stop are arrays. Dtype: `dtype`, else the default float dtype (or start/stop's float dtype)."""
  from tinyjax.numpy._elementwise import promote  # noqa: PLC0415
  from tinyjax.numpy._shape import moveaxis  # noqa: PLC0415
  num = operator.index(num)
  if num < 0: raise ValueError(f"Number of samples, {num}, must be non-negative.")
  start_array, stop_array = promote("linspace", start, stop, inexact=True)
  compute = start_array.dtype
  out_dtype = dtypes.check_user_dtype_supported(dtype, "linspace") if dtype is not None else compute
  if compute in LOW_PRECISION_FLOATS: compute = np.dtype(np.float32)
  start_array, stop_array = cast(start_array, compute, False), cast(stop_array, compute, False)
  bshape = start_array.shape
  divisor = (num - 1) if endpoint else num
  out_shape = (num,) + bshape
  start_b, stop_b = expand_raw(start_array, out_shape), expand_raw(stop_array, out_shape)
  delta = ew._sub(stop_b, start_b)
  positions = lax_shape.iota(compute, num)
  column_shape = (num,) + (1,) * len(bshape)
  index = expand_raw(lax_shape.reshape(positions, column_shape), out_shape)
  if divisor > 0:
    values = ew._add(start_b, ew._mul(index, ew._fdiv(delta, like(delta, divisor))))
    if endpoint and num > 1:  # the last value is exactly `stop`, as numpy
      is_last = expand_raw(lax_shape.reshape(ew._eq(positions, like(positions, num - 1)), column_shape), out_shape)
      values = ew._where(is_last, stop_b, values)
    step = ew._fdiv(ew._sub(stop_array, start_array), like(stop_array, divisor))
  else:
    values = start_b
    step = like(start_array, math.nan)
  if dtypes.is_integer(out_dtype): values = ew._floor(values)
  out = cast(values, out_dtype, weak_type=False)
  if axis != 0 and out.ndim > 1: out = moveaxis(out, 0, axis)
  return (out, cast(step, out_dtype, False)) if retstep else out



@with_device
@staged(static_argnames=("num", "endpoint", "base", "dtype", "axis"))
def logspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, base: Any = 10.0, dtype: Any = None,
             axis: int = 0) -> Array:
  """base ** linspace(start, stop, num): `num` points evenly spaced on a log scale. Dtype: `dtype`, else the
  inexact result type of start and stop."""
  from tinyjax.numpy._elementwise import power, promote  # noqa: PLC0415
  target = dtypes.to_inexact_dtype(dtypes.result_type(start, stop)) if dtype is None else \
    dtypes.check_user_dtype_supported(dtype, "logspace")
  compute = dtypes.to_inexact_dtype(target)
  start_array, stop_array = (cast(x, compute, False) for x in promote("logspace", start, stop, broadcast=False))
  exponents = linspace(start_array, stop_array, num, endpoint=endpoint, axis=axis)
  return cast(power(base, exponents), target, weak_type=False)


@with_device
@staged(static_argnames=("num", "endpoint", "dtype", "axis"))
def geomspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, dtype: Any = None,
              axis: int = 0) -> Array:
  """`num` points from `start` to `stop` evenly spaced on a log scale (a geometric progression; both ends of one
  sign; complex ends are not supported yet). Dtype: `dtype`, else the inexact result type of start and stop."""
  from tinyjax.numpy._elementwise import log10, promote, sign  # noqa: PLC0415
  from tinyjax.numpy._shape import moveaxis  # noqa: PLC0415
  target = dtypes.to_inexact_dtype(dtypes.result_type(start, stop)) if dtype is None else \
    dtypes.check_user_dtype_supported(dtype, "geomspace")
  compute = dtypes.to_inexact_dtype(target)
  start_array, stop_array = (cast(x, compute, False) for x in promote("geomspace", start, stop, broadcast=False))
  direction = sign(start_array)
  result = direction * logspace(log10(start_array / direction), log10(stop_array / direction), num,
                                endpoint=endpoint, base=10.0, dtype=compute, axis=0)
  if axis != 0: result = moveaxis(result, 0, axis)
  return cast(result, target, weak_type=False)


@with_device
def eye(N: int, M: int | None = None, k: int = 0, dtype: Any = None) -> Array:  # noqa: N803
  """An (N, M) array with ones on the k-th diagonal and zeros elsewhere (default dtype float32/64)."""
  rows = operator.index(N)
  cols = rows if M is None else operator.index(M)
  if rows < 0 or cols < 0: raise ValueError(f"negative dimensions are not allowed: ({rows}, {cols})")
  out_dtype = _requested(dtype, "eye") or dtypes.default_float_dtype()
  shape = (rows, cols)
  column = lax_shape.iota_along(np.int32, shape, 1)
  row = lax_shape.iota_along(np.int32, shape, 0)
  on_diagonal = ew._eq(ew._sub(column, row), like(column, operator.index(k)))
  return cast(on_diagonal, out_dtype, weak_type=False)


def _lower_triangle(rows: int, cols: int, k: int) -> Array:
  """Bool (rows, cols): True where column - row <= k."""
  column = lax_shape.iota_along(np.int32, (rows, cols), 1)
  row = lax_shape.iota_along(np.int32, (rows, cols), 0)
  return ew._le(ew._sub(column, row), like(column, k))


def tri(N: int, M: int | None = None, k: int = 0, dtype: Any = None) -> Array:  # noqa: N803
  """An (N, M) array with ones at and below the k-th diagonal (default dtype float32/64)."""
  rows = operator.index(N)
  cols = rows if M is None else operator.index(M)
  if rows < 0 or cols < 0: raise ValueError(f"negative dimensions are not allowed: ({rows}, {cols})")
  return cast(_lower_triangle(rows, cols, operator.index(k)), _requested(dtype, "tri") or
              dtypes.default_float_dtype(), weak_type=False)


def _triangle(m: Any, k: int, lower: bool, name: str) -> Array:
  x = asarray(m)
  if x.ndim < 2: raise ValueError(f"{name} requires an array of at least 2 dimensions, got shape {x.shape}")
  k = operator.index(k)
  keep = _lower_triangle(*x.shape[-2:], k) if lower else ew._not(_lower_triangle(*x.shape[-2:], k - 1))
  return ew._where(expand_raw(keep, x.shape), x, like(x, 0))


@staged(static_argnames=("k",))
def tril(m: Any, k: int = 0) -> Array:
  """`m` with the elements above the k-th diagonal of its last two axes set to 0."""
  return _triangle(m, k, True, "tril")


@staged(static_argnames=("k",))
def triu(m: Any, k: int = 0) -> Array:
  """`m` with the elements below the k-th diagonal of its last two axes set to 0."""
  return _triangle(m, k, False, "triu")


def identity(n: int, dtype: Any = None) -> Array:
  """The (n, n) identity matrix."""
  return eye(n, dtype=dtype)


# ---------------------------------------------------------------------------------------------- scalar types

class ScalarType:
  """A dtype name usable as a constructor, as JAX's `jnp.float32`: `tnp.float32(1)` is a strongly typed 0-d
  Array; `tnp.float32` works wherever a dtype is expected (it has `.dtype`)."""

  def __init__(self, scalar_type: type):
    self.type = scalar_type
    self.dtype = np.dtype(scalar_type)
    self.__name__ = self.__qualname__ = self.dtype.name if self.dtype.name != "bool" else "bool_"

  def __call__(self, x: Any) -> Array:
    return asarray(x, dtype=self.dtype)

  def __repr__(self) -> str: return f"tinyjax.numpy.{self.__name__}"
  def __eq__(self, other: Any) -> bool:
    try:
      return self.dtype == dtypes.dtype(other)
    except (TypeError, ValueError):
      return NotImplemented
  def __hash__(self) -> int: return hash(self.dtype)


SCALAR_TYPES = {name: ScalarType(getattr(dtypes, name)) for name in (
  "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
  "float32", "float64", *dtypes.FLOAT8_NAMES, "complex64", "complex128")}
