"""tinyjax.numpy.linalg: the parts of jax.numpy.linalg built so far: `norm`, `cholesky` and `qr` (triangular solves
are in tinyjax.scipy.linalg). Decompositions are written with the primitives (no LAPACK yet), O(n^3) work, fine for
the small matrices of covariances, Gaussian processes and weight initialisers, and differentiable like any
composition: `cholesky` unrolled over the static size, `qr` as Householder reflections in a fori_loop."""
from __future__ import annotations

from typing import Any

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import cast
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


__all__ = ["cholesky", "norm", "qr"]
