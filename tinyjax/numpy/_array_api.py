"""The array API standard's names (data-apis.org, 2024.12) that numpy spells otherwise, and its inspection namespace,
as jax.numpy has them: `acos` for `arccos`, `concat` for `concatenate`, `isdtype`, `unique_values`...,
`__array_namespace_info__()`. Complex dtypes are not built yet: the inspection namespace lists none."""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.devices.device import CPU, host_buffer
from tinyjax.numpy._elementwise import (arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh, invert, left_shift,
                                        multiply, power, right_shift)
from tinyjax.numpy._reductions import sum as _sum
from tinyjax.numpy._searching import unique
from tinyjax.numpy._shape import broadcast_shapes, concatenate, moveaxis, transpose
from tinyjax.uop import Ops, UOp

__array_api_version__ = "2024.12"

acos, acosh, asin, asinh, atan, atanh, atan2 = arccos, arccosh, arcsin, arcsinh, arctan, arctanh, arctan2
bitwise_invert, bitwise_left_shift, bitwise_right_shift = invert, left_shift, right_shift
concat, permute_dims, pow = concatenate, transpose, power  # noqa: A001 (the standard's name)

_KINDS = ("bool", "signed integer", "unsigned integer", "integral", "real floating", "complex floating", "numeric")


def _of_kind(dt: np.dtype, kind: str) -> bool:
  if kind == "bool": return dtypes.is_bool(dt)
  if kind == "signed integer": return dtypes.is_integer(dt) and not dtypes.is_unsigned(dt)
  if kind == "unsigned integer": return dtypes.is_unsigned(dt)
  if kind == "integral": return dtypes.is_integer(dt)
  if kind == "real floating": return dtypes.is_floating(dt)
  if kind == "complex floating": return dt.kind == "c"
  return dtypes.is_integer(dt) or dtypes.is_floating(dt) or dt.kind == "c"  # numeric


def isdtype(dtype: Any, kind: Any) -> bool:
  """Whether `dtype` is of `kind`: one of the standard's kind names ('bool', 'signed integer', 'unsigned integer',
  'integral', 'real floating', 'complex floating', 'numeric'), a dtype, or a tuple of them (any). bfloat16 and the
  float8 types are real floating, as in JAX."""
  dt = np.dtype(dtype)
  for one in kind if isinstance(kind, tuple) else (kind,):
    if isinstance(one, str) and one in _KINDS:
      if _of_kind(dt, one): return True
      continue
    try: other = np.dtype(one)
    except TypeError:
      raise ValueError(f"Unrecognized kind={one!r} expected one of {list(_KINDS)}, or a compatible input for "
                       "jnp.dtype()") from None
    if dt == other: return True
  return False


def can_cast(from_: Any, to: Any, casting: str = "safe") -> bool:
  """Whether numpy's casting rule `casting` allows a cast from `from_` (a dtype, or an array's dtype) to `to`."""
  source = from_ if isinstance(from_, (type, np.dtype, str)) else from_.dtype  # (an array or a tracer: its dtype)
  return bool(np.can_cast(np.dtype(source), np.dtype(to), casting=casting))


def unstack(x: Any, /, *, axis: int = 0) -> tuple[Array, ...]:
  """The slices of `x` along `axis`, in order, as a tuple."""
  from tinyjax.numpy._creation import asarray
  x = asarray(x)
  if x.ndim == 0: raise ValueError("unstack requires an array of at least one dimension, got a scalar")
  moved = moveaxis(x, axis, 0)
  return tuple(moved[i] for i in range(moved.shape[0]))


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1, precision: Any = None, preferred_element_type: Any = None) -> Array:
  """The dot product of `x1` and `x2` along `axis` (broadcasting the other axes): sum(conj(x1) * x2, axis)."""
  from tinyjax.numpy._creation import asarray
  x1, x2 = asarray(x1), asarray(x2)
  for x in (x1, x2):
    if not -x.ndim <= axis < x.ndim:
      raise ValueError(f"vecdot: axis {axis} is out of bounds for arrays of shapes {x1.shape} and {x2.shape}")
  if x1.shape[axis] != x2.shape[axis]:
    raise ValueError(f"axes must match; got shapes {x1.shape} and {x2.shape} with axis={axis}")
  broadcast_shapes(x1.shape, x2.shape)  # (its ValueError names both shapes)
  if x1.dtype.kind == "c":
    from tinyjax.numpy._elementwise import conjugate
    x1 = conjugate(x1)
  product = multiply(moveaxis(x1, axis, -1), moveaxis(x2, axis, -1))
  out = _sum(product, axis=-1, dtype=product.dtype)  # (the operands' type: no sum promotion of narrow integers)
  return out if preferred_element_type is None else out.astype(preferred_element_type)


def from_dlpack(x: Any, /, *, device: Any = None, copy: bool | None = None) -> Array:
  """An array of the DLPack-exporting object `x` (a numpy array, a torch tensor, a tinyjax array... on the CPU). Its
  memory is shared, not copied, when it is C-contiguous in a dtype tinyjax uses as it is (as JAX's, the array then
  aliases the producer's memory: the producer must not write it); `copy=True` copies, and so does a dtype that
  becomes another (float64 without `jax_enable_x64`). `device=` places the result (`device_put`)."""
  if not hasattr(x, "__dlpack__"):
    raise TypeError(f"from_dlpack: {type(x).__name__} does not export DLPack (no __dlpack__ method)")
  host = np.from_dlpack(x, copy=copy)
  target = dtypes.canonicalize_dtype(host.dtype)  # (TypeError for a dtype tinyjax has not; float64 -> float32 as JAX)
  shared = (copy is not True and target == host.dtype and host.flags.c_contiguous and
            host.ctypes.data % max(host.dtype.itemsize, 1) == 0)
  # shared: a view we mark read-only (the producer's own array stays writable); else a copy of our own
  host = host.view() if shared else np.array(host, dtype=target, order="C")
  host.flags.writeable = False
  result = Array(UOp(Ops.BUFFER, host.dtype, (), host_buffer(host, CPU)))  # on the CPU, where the producer's data is
  if device is None: return result
  from tinyjax.placement import device_put
  return device_put(result, device)


class UniqueAllResult(NamedTuple):
  values: Array
  indices: Array
  inverse_indices: Array
  counts: Array


class UniqueCountsResult(NamedTuple):
  values: Array
  counts: Array


class UniqueInverseResult(NamedTuple):
  values: Array
  inverse_indices: Array


def unique_all(x: Any, /, *, size: int | None = None, fill_value: Any = None) -> UniqueAllResult:
  """The sorted unique values of `x`, the first index of each, the inverse indices (shaped as `x`) and the counts."""
  values, indices, inverse, counts = unique(x, return_index=True, return_inverse=True, return_counts=True,
                                            size=size, fill_value=fill_value)
  return UniqueAllResult(values, indices, inverse.reshape(np.shape(x)), counts)


def unique_counts(x: Any, /, *, size: int | None = None, fill_value: Any = None) -> UniqueCountsResult:
  """The sorted unique values of `x` and how often each occurs."""
  values, counts = unique(x, return_counts=True, size=size, fill_value=fill_value)
  return UniqueCountsResult(values, counts)


def unique_inverse(x: Any, /, *, size: int | None = None, fill_value: Any = None) -> UniqueInverseResult:
  """The sorted unique values of `x` and, shaped as `x`, the index of each element's value among them."""
  values, inverse = unique(x, return_inverse=True, size=size, fill_value=fill_value)
  return UniqueInverseResult(values, inverse.reshape(np.shape(x)))


def unique_values(x: Any, /, *, size: int | None = None, fill_value: Any = None) -> Array:
  """The sorted unique values of `x`."""
  return unique(x, size=size, fill_value=fill_value)


class ArrayNamespaceInfo:
  """The standard's inspection namespace of tinyjax.numpy (`__array_namespace_info__()`)."""

  def capabilities(self) -> dict:
    # boolean indexing and data-dependent shapes need concrete values (as in JAX: not under jit)
    return {"boolean indexing": False, "data-dependent shapes": False, "max dimensions": 64}

  def default_device(self) -> None:
    return None  # as JAX: arrays go to the default device chosen at creation (`jax_platforms`)

  def devices(self) -> list:
    from tinyjax.devices.device import default_device
    return [None, default_device()]

  def default_dtypes(self, *, device: Any = None) -> dict:
    return {"real floating": dtypes.default_float_dtype(), "complex floating": dtypes.default_complex_dtype(),
            "integral": dtypes.default_int_dtype(), "indexing": dtypes.default_int_dtype()}

  def dtypes(self, *, device: Any = None, kind: Any = None) -> dict:
    """The standard's dtypes tinyjax has (64-bit ones with `jax_enable_x64`), those of `kind` when given."""
    from tinyjax.config import config
    names = ["bool", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float32", "complex64"]
    if config.jax_enable_x64: names += ["int64", "uint64", "float64", "complex128"]
    found = {name: np.dtype(name) for name in names}
    return found if kind is None else {name: dt for name, dt in found.items() if isdtype(dt, kind)}


def __array_namespace_info__() -> ArrayNamespaceInfo:  # noqa: N807 (the standard's name)
  return ArrayNamespaceInfo()

