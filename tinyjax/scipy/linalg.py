"""tinyjax.scipy.linalg: `cholesky`, `cho_factor`, `cho_solve`, `solve_triangular` for real float matrices, written
with the primitives (no LAPACK yet): unrolled over the static size n (O(n^2) vector steps for a solve), fine for
the small systems of Gaussian processes and covariances, and differentiable like any composition."""
from __future__ import annotations

from typing import Any

from tinyjax import numpy as jnp
from tinyjax.array import Array


def cholesky(a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> Array:
  """The Cholesky factor of a symmetric positive-definite matrix: upper (scipy's default) or `lower`."""
  return jnp.linalg.cholesky(a, upper=not lower)


def cho_factor(a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> tuple[Array, bool]:
  """(factor, lower), for `cho_solve`."""
  return cholesky(a, lower=lower), lower


def solve_triangular(a: Any, b: Any, trans: int | str = 0, lower: bool = False, unit_diagonal: bool = False,
                     overwrite_b: bool = False, check_finite: bool = True) -> Array:
  """x with a x = b (trans 0 / 'N'), a^T x = b (1 / 'T' / 2 / 'C') for triangular a (n, n) and b (n,) or (n, k)."""
  a, b = jnp.asarray(a), jnp.asarray(b)
  dtype = jnp.result_type(a, b, 1.0)
  a, b = a.astype(dtype), b.astype(dtype)
  if a.ndim != 2 or a.shape[0] != a.shape[1]: raise ValueError(f"expected a square matrix, got shape {a.shape}")
  if b.shape[0] != a.shape[0]:
    raise ValueError(f"incompatible shapes: a is {a.shape} and b is {b.shape}; b's first axis must be {a.shape[0]}")
  if trans in (1, 2, "T", "C"): a, lower = a.T, not lower
  elif trans not in (0, "N"): raise ValueError(f"invalid trans {trans!r}: use 0, 1, 2, 'N', 'T' or 'C'")
  n = a.shape[0]
  order = range(n) if lower else range(n - 1, -1, -1)
  solution: dict[int, Array] = {}
  for i in order:
    value = b[i]
    for j, x_j in solution.items(): value = value - a[i, j] * x_j
    solution[i] = value if unit_diagonal else value / a[i, i]
  return jnp.stack([solution[i] for i in range(n)])


def cho_solve(c_and_lower: tuple[Any, bool], b: Any, overwrite_b: bool = False, check_finite: bool = True) -> Array:
  """x with a x = b, given a's Cholesky factor `(c, lower)` from `cho_factor`."""
  c, lower = c_and_lower
  if lower:
    return solve_triangular(c, solve_triangular(c, b, lower=True), trans=1, lower=True)
  return solve_triangular(c, solve_triangular(c, b, trans=1, lower=False), lower=False)


__all__ = ["cho_factor", "cho_solve", "cholesky", "solve_triangular"]
