"""tinyjax.numpy.linalg: the parts of jax.numpy.linalg built so far: `norm` and `cholesky` (triangular solves are in
tinyjax.scipy.linalg). Decompositions are written with the primitives (no LAPACK yet): unrolled over the static
matrix size, O(n^3) work, fine for the small matrices of covariances and Gaussian processes, and differentiable like
any composition."""
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


__all__ = ["cholesky", "norm"]
