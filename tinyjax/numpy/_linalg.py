"""Products of tinyjax.numpy: matmul (and `@`), dot, vdot, inner, outer, tensordot, with numpy's shape rules and
JAX's dtype promotion. Each is one `dot_general` contraction: movement + MUL + REDUCE_AXIS(ADD), one kernel."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.placement import with_out_sharding
from tinyjax.lax import _reductions as lax_red
from tinyjax.lax._base import canonicalize_axis, cast, expand_raw, reshape_raw, staged
from tinyjax.numpy._elementwise import _operand, multiply
from tinyjax.trace import sharding_types


def _promoted_pair(name: str, a: Any, b: Any) -> tuple[Array, Array]:
  """Both operands as Arrays of their promoted dtype and weak type (shapes untouched)."""
  if type(a) is Array and type(b) is Array and a.dtype == b.dtype and a.weak_type == b.weak_type: return a, b
  from tinyjax.numpy._creation import asarray  # noqa: PLC0415
  a, b = (asarray(_operand(x, name)) for x in (a, b))
  dtype, weak = dtypes.result_type(a, b, return_weak_type_flag=True)
  return cast(a, dtype, weak), cast(b, dtype, weak)


def _contract(a: Array, b: Array, contracting: tuple[Sequence[int], Sequence[int]],
              batch: tuple[Sequence[int], Sequence[int]] = ((), ())) -> Array:
  return lax_red.dot_general_raw(a, b, contracting, batch, a.dtype)


def _placed(result: Array, out_sharding: Any) -> Array:
  """`result` laid out as `out_sharding` (JAX's `out_sharding=` of the products: see lax.with_sharding_constraint)."""
  if out_sharding is None: return result
  from tinyjax.placement import with_sharding_constraint
  return with_sharding_constraint(result, out_sharding)


@staged(static_argnames=("precision", "preferred_element_type"))
def matmul(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None,
           out_sharding: Any = None) -> Array:
  """Matrix product with numpy's rules: (..., m, k) @ (..., k, n) -> (..., m, n) with broadcast batch axes; a 1-D
  operand is a row (left) or column (right) vector whose axis is removed from the result.
  Inner dimension mismatch: TypeError naming both shapes. `out_sharding`: how the result is laid out."""
  if out_sharding is not None:
    with sharding_types.unchecked():
      result = matmul(a, b, precision=precision, preferred_element_type=preferred_element_type)
    return _placed(result, out_sharding)
  del precision
  a, b = _promoted_pair("matmul", a, b)
  if a.ndim == 0 or b.ndim == 0:
    raise ValueError(f"matmul: operands must be at least 1-D, got shapes {a.shape} and {b.shape}")
  a_vector, b_vector = a.ndim == 1, b.ndim == 1
  if a_vector: a = reshape_raw(a, (1,) + a.shape)
  if b_vector: b = reshape_raw(b, b.shape + (1,))
  if a.shape[-1] != b.shape[-2]:
    raise TypeError(f"matmul: inner dimensions differ for shapes {a.shape if not a_vector else a.shape[1:]} and "
                    f"{b.shape if not b_vector else b.shape[:1]} ({a.shape[-1]} != {b.shape[-2]})")
  try: batch = a.shape[:-2] if a.shape[:-2] == b.shape[:-2] else tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
  except ValueError:  # batch dimensions that do not broadcast: a ValueError, as JAX's
    raise ValueError(f"Incompatible types for matmul arguments: {a.dtype.name}{list(a.shape)} and "
                     f"{b.dtype.name}{list(b.shape)}") from None
  a, b = expand_raw(a, batch + a.shape[-2:]), expand_raw(b, batch + b.shape[-2:])
  n_batch = len(batch)
  out_dtype = a.dtype if preferred_element_type is None else dtypes.canonicalize_dtype(
    dtypes.dtype(preferred_element_type))
  dimension_numbers = ((n_batch + 1,), (n_batch,)), (tuple(range(n_batch)), tuple(range(n_batch)))
  if sharding_types._enabled[0]: sharding_types.dot_sharding(a, b, *dimension_numbers, errors=True)
  result = lax_red.dot_general_raw(a, b, *dimension_numbers, out_dtype)
  if a_vector: result = reshape_raw(result, result.shape[:-2] + result.shape[-1:])
  if b_vector: result = reshape_raw(result, result.shape[:-1])
  return result


@staged(static_argnames=("precision", "preferred_element_type"))
def dot(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None, out_sharding: Any = None
        ) -> Array:
  """numpy's dot: scalars multiply; 1-D·1-D is the inner product; otherwise the sum over the last axis of `a` and
  the second-to-last of `b` (the last if b is 1-D): shape a.shape[:-1] + b.shape[:-2] + b.shape[-1:].
  `out_sharding`: how the result is laid out."""
  if out_sharding is not None:
    with sharding_types.unchecked():
      result = dot(a, b, precision=precision, preferred_element_type=preferred_element_type)
    return _placed(result, out_sharding)
  del precision
  a, b = _promoted_pair("dot", a, b)
  if a.ndim == 0 or b.ndim == 0: return multiply(a, b)
  b_axis = 0 if b.ndim == 1 else b.ndim - 2
  if a.shape[-1] != b.shape[b_axis]:
    raise TypeError(f"dot: shapes {a.shape} and {b.shape} are not aligned: {a.shape[-1]} (dim {a.ndim - 1}) != "
                    f"{b.shape[b_axis]} (dim {b_axis})")
  out_dtype = a.dtype if preferred_element_type is None else dtypes.canonicalize_dtype(
    dtypes.dtype(preferred_element_type))
  if sharding_types._enabled[0]: sharding_types.dot_sharding(a, b, ((a.ndim - 1,), (b_axis,)), ((), ()), errors=True)
  return lax_red.dot_general_raw(a, b, ((a.ndim - 1,), (b_axis,)), ((), ()), out_dtype)


@staged(static_argnames=("precision",))
def vdot(a: Any, b: Any, *, precision: Any = None) -> Array:
  """The inner product of the flattened operands, the first conjugated (for complex operands)."""
  del precision
  a, b = _promoted_pair("vdot", a, b)
  if a.dtype.kind == "c":
    from tinyjax.lax._elementwise import _conj
    a = _conj(a)
  if a.size != b.size: raise TypeError(f"vdot: operands have different sizes, shapes {a.shape} and {b.shape}")
  return _contract(reshape_raw(a, (a.size,)), reshape_raw(b, (b.size,)), ((0,), (0,)))


@staged(static_argnames=("precision",))
def inner(a: Any, b: Any, *, precision: Any = None) -> Array:
  """Sum over the last axes of both: shape a.shape[:-1] + b.shape[:-1] (scalars multiply)."""
  del precision
  a, b = _promoted_pair("inner", a, b)
  if a.ndim == 0 or b.ndim == 0: return multiply(a, b)
  if a.shape[-1] != b.shape[-1]:
    raise TypeError(f"inner: last dimensions differ for shapes {a.shape} and {b.shape}")
  return _contract(a, b, ((a.ndim - 1,), (b.ndim - 1,)))


@staged()
def outer(a: Any, b: Any) -> Array:
  """All products of the flattened operands: shape (a.size, b.size)."""
  a, b = _promoted_pair("outer", a, b)
  return multiply(reshape_raw(a, (a.size, 1)), reshape_raw(b, (1, b.size)))


@with_out_sharding
@staged(static_argnames=("axes", "precision"))
def tensordot(a: Any, b: Any, axes: int | Sequence[Any] = 2, *, precision: Any = None) -> Array:
  """Sum over `axes` (an int n: the last n of a with the first n of b; or a pair of axis lists): shape
  (a's other axes, b's other axes)."""
  del precision
  a, b = _promoted_pair("tensordot", a, b)
  if isinstance(axes, int):
    if axes < 0 or axes > min(a.ndim, b.ndim): raise TypeError(f"tensordot: axes={axes} out of range")
    a_axes, b_axes = tuple(range(a.ndim - axes, a.ndim)), tuple(range(axes))
  else:
    a_axes, b_axes = axes
    a_axes = (a_axes,) if isinstance(a_axes, int) else tuple(a_axes)
    b_axes = (b_axes,) if isinstance(b_axes, int) else tuple(b_axes)
  a_axes = tuple(canonicalize_axis(i, a.ndim) for i in a_axes)
  b_axes = tuple(canonicalize_axis(i, b.ndim) for i in b_axes)
  if [a.shape[i] for i in a_axes] != [b.shape[i] for i in b_axes]:
    raise TypeError(f"tensordot: contracted dimensions differ for shapes {a.shape} and {b.shape}, axes {axes}")
  return _contract(a, b, (a_axes, b_axes))


def _check_core(name: str, signature: str, x1: Array, x2: Array, matrix_first: bool) -> None:
  matrix, vector = (x1, x2) if matrix_first else (x2, x1)
  error_context = f"on vectorized function with excluded=frozenset() and signature={signature!r}"
  for operand, core in ((x1, 2 if matrix_first else 1), (x2, 1 if matrix_first else 2)):
    if operand.ndim < core:
      raise ValueError(f"{name}: input with shape {operand.shape} does not have enough dimensions for the core "
                       f"dimensions of {signature!r} {error_context}")
  shared = matrix.shape[-1] if matrix_first else matrix.shape[-2]
  if shared != vector.shape[-1]:
    raise ValueError(f"{name}: inconsistent size for the shared core dimension: {vector.shape[-1]} vs {shared} "
                     f"{error_context}")


@staged()
def matvec(x1: Any, x2: Any, /) -> Array:
  """The matrix-vector product of stacks: (..., n, m) with (..., m) -> (..., n), batch axes broadcast (numpy 2's
  gufunc; no conjugation)."""
  a, b = _promoted_pair("matvec", x1, x2)
  _check_core("matvec", "(n,m),(m)->(n)", a, b, matrix_first=True)
  return matmul(a, b[..., None])[..., 0]


@staged()
def vecmat(x1: Any, x2: Any, /) -> Array:
  """The vector-matrix product of stacks: (..., n) with (..., n, m) -> (..., m), batch axes broadcast; a complex
  vector is conjugated (numpy 2's gufunc, as JAX)."""
  from tinyjax.numpy._elementwise import conjugate
  a, b = _promoted_pair("vecmat", x1, x2)
  _check_core("vecmat", "(n),(n,m)->(m)", a, b, matrix_first=False)
  if dtypes.is_complex(a.dtype): a = conjugate(a)
  return matmul(a[..., None, :], b)[..., 0, :]
