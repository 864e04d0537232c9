"""tinyjax.numpy.linalg: the parts of jax.numpy.linalg built so far: `norm`, `cholesky` and `qr` (triangular solves
are in tinyjax.scipy.linalg), and the array API extension's functions that need no factorisation (`vector_norm`,
`matrix_norm`, `matrix_power` for n >= 0, `trace` and `diagonal` over the last two axes, `cross`, `vecdot`, `outer`,
`matmul`, `tensordot`, `matrix_transpose`). Decompositions are written with the primitives (no LAPACK yet), O(n^3)
work, fine for the small matrices of covariances, Gaussian processes and weight initialisers, and differentiable like
any composition: `cholesky` unrolled over the static size, `qr` as Householder reflections in a fori_loop."""
from __future__ import annotations

from typing import Any

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, cast
from tinyjax.numpy import _elementwise as ew
from tinyjax.numpy._creation import asarray
from tinyjax.numpy._more import norm
from tinyjax.numpy._shape import stack


def cholesky(a: Any, *, upper: bool = False, symmetrize_input: bool = True) -> Array:
  """The lower Cholesky factor L of symmetric positive-definite matrices (..., n, n), a = L L^T (`upper`: L^T).
  The Cholesky-Banachiewicz recurrence, column by column over the static n; NaN where a is not positive-definite."""
  x = asarray(a)
  if not dtypes.is_floating(x.dtype): x = cast(x, dtypes.default_float_dtype(), False)
  if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
    raise ValueError(f"cholesky requires a square matrix (or a batch of them), got shape {x.shape}")
  if symmetrize_input: x = (x + ew.swap_last(x)) * 0.5
  n = x.shape[-1]
  columns: list[Array] = []
  for j in range(n):
    column = x[..., :, j]
    for previous in columns: column = column - previous * previous[..., j:j + 1]
    below = column / ew.sqrt(column[..., j:j + 1])
    mask = asarray([i >= j for i in range(n)])
    columns.append(ew.where(mask, below, 0.0))
  lower = stack(columns, axis=-1)
  return ew.swap_last(lower) if upper else lower


def _householder(a: Array, mode: str) -> Any:
  """QR of one (m, n) matrix by k = min(m, n) Householder reflections H_j = I - 2 v_j v_j^T (v_j zero above row j),
  each chosen so that it maps column j's part from row j down onto e_j (sign opposite to the pivot, for stability).
  R is the reflected matrix; Q = H_0 ... H_{k-1} applied to the first k (or all m) columns of the identity."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  m, n = a.shape
  k = min(m, n)
  rows = jnp.arange(m)

  def reflect(j, state):
    r, vectors = state
    column = jnp.where(rows >= j, lax.dynamic_index_in_dim(r, j, axis=1, keepdims=False), 0)
    pivot = lax.dynamic_index_in_dim(column, j, keepdims=False)
    alpha = -jnp.where(pivot < 0, -1.0, 1.0).astype(r.dtype) * jnp.sqrt(jnp.sum(column * column))
    v = column - jnp.where(rows == j, alpha, 0)
    length = jnp.sqrt(jnp.sum(v * v))
    v = jnp.where(length > 0, v / jnp.where(length > 0, length, 1), 0)
    r = r - 2 * v[:, None] * (v @ r)[None, :]
    return r, jnp.where(jnp.arange(k)[None, :] == j, v[:, None], vectors)
  r, vectors = lax.fori_loop(0, k, reflect, (a, jnp.zeros((m, k), a.dtype)))
  r = jnp.where(rows[:, None] <= jnp.arange(n)[None, :], r, 0)  # exact zeros below the diagonal
  if mode == "r": return r[:k] if m > n else r

  def apply(i, q):
    v = lax.dynamic_index_in_dim(vectors, k - 1 - i, axis=1, keepdims=False)
    return q - 2 * v[:, None] * (v @ q)[None, :]
  q = lax.fori_loop(0, k, apply, jnp.eye(m, m if mode == "complete" else k, dtype=a.dtype))
  if mode == "complete": return q, r
  return q, (r[:k] if m > n else r)


def qr(a: Any, mode: str = "reduced") -> Any:
  """The QR decomposition of (..., m, n) matrices: Q with orthonormal columns and upper-triangular R, a = Q R.
  mode 'reduced' (Q (m, k), R (k, n), k = min(m, n)), 'complete' (Q (m, m), R (m, n)) or 'r' (R only)."""
  from tinyjax.trace.batching import vmap
  x = asarray(a)
  if mode not in ("reduced", "complete", "r"):
    raise ValueError(f"qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
  if x.ndim < 2: raise ValueError(f"qr requires an array of at least 2 dimensions, got shape {x.shape}")
  if not dtypes.is_floating(x.dtype): x = cast(x, dtypes.default_float_dtype(), False)
  fun = lambda matrix: _householder(matrix, mode)  # noqa: E731
  for _ in range(x.ndim - 2): fun = vmap(fun)
  return fun(x)


# ---- the array API's linalg extension that needs no factorisation

from tinyjax.numpy._linalg import matmul, outer, tensordot  # noqa: E402 (re-exported: the standard's names)
from tinyjax.numpy._shape import matrix_transpose  # noqa: E402


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1) -> Array:
  """The dot product of `x1` and `x2` along `axis` (as `tinyjax.numpy.vecdot`)."""
  from tinyjax.numpy._array_api import vecdot as _vecdot
  return _vecdot(x1, x2, axis=axis)


def cross(x1: Any, x2: Any, /, *, axis: int = -1) -> Array:
  """The cross product of 3-vectors along `axis` (ValueError for another length, as JAX's linalg.cross)."""
  from tinyjax.numpy._more import cross as _cross
  a, b = asarray(x1), asarray(x2)
  if a.shape[axis] != 3 or b.shape[axis] != 3:
    raise ValueError(f"Both input arrays must be (arrays of) 3-dimensional vectors, but they have shape[{axis}] = "
                     f"{a.shape[axis]} and {b.shape[axis]}")
  return _cross(a, b, axis=axis)


def diagonal(x: Any, /, *, offset: int = 0) -> Array:
  """The `offset` diagonal of each matrix in the last two axes of `x`."""
  from tinyjax.numpy._more import diagonal as _diagonal
  return _diagonal(x, offset, -2, -1)


def trace(x: Any, /, *, offset: int = 0, dtype: Any = None) -> Array:
  """The sum of the `offset` diagonal of each matrix in the last two axes of `x`."""
  from tinyjax.numpy._more import trace as _trace
  return _trace(x, offset, -2, -1, dtype)


def vector_norm(x: Any, /, *, axis: Any = None, keepdims: bool = False, ord: Any = 2) -> Array:  # noqa: A002
  """The vector `ord`-norm of `x` over `axis` (None: all of it, as one vector; a tuple: those axes as one vector)."""
  from tinyjax.numpy._shape import moveaxis, reshape
  array = asarray(x)
  axes = tuple(range(array.ndim)) if axis is None else (axis,) if isinstance(axis, int) else tuple(axis)
  axes = tuple(canonicalize_axis(a, array.ndim) for a in axes)
  kept = [d for i, d in enumerate(array.shape) if i not in axes]
  flat = reshape(moveaxis(array, axes, tuple(range(-len(axes), 0))), (*kept, -1))
  out = norm(flat, ord, axis=-1)
  if keepdims: out = reshape(out, tuple(1 if i in axes else d for i, d in enumerate(array.shape)))
  return out


def matrix_norm(x: Any, /, *, keepdims: bool = False, ord: Any = "fro") -> Array:  # noqa: A002
  """The matrix `ord`-norm ('fro', 1, -1, inf, -inf) of each matrix in the last two axes of `x`."""
  return norm(x, ord, axis=(-2, -1), keepdims=keepdims)


def matrix_power(a: Any, n: int) -> Array:
  """The matrix `a` (each in the last two axes) raised to the integer power `n` >= 0, by repeated squaring."""
  import operator
  array = asarray(a)
  n = operator.index(n)
  if array.ndim < 2 or array.shape[-1] != array.shape[-2]:
    raise ValueError(f"matrix_power: the last two axes must be square, got shape {array.shape}")
  if n < 0: raise NotImplementedError("matrix_power with a negative power needs linalg.inv, not built yet")
  from tinyjax.numpy._creation import eye
  from tinyjax.numpy._shape import broadcast_to
  result, square = None, array
  while n:
    if n & 1: result = square if result is None else matmul(result, square)
    n >>= 1
    if n: square = matmul(square, square)
  if result is None: result = broadcast_to(eye(array.shape[-1], dtype=array.dtype), array.shape)
  return result


__all__ = ["cholesky", "cross", "diagonal", "matmul", "matrix_norm", "matrix_power", "matrix_transpose", "norm",
           "outer", "qr", "tensordot", "trace", "vecdot", "vector_norm"]
