"""tinyjax.scipy.linalg: jax.scipy.linalg's factorisations and solves on LAPACK (through tinyjax.lax.linalg's
primitives: batched, differentiable, batchable), and `expm` by Pade approximation with scaling and squaring.
Real float32 / float64 matrices (tinyjax has no complex dtypes yet)."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinyjax import numpy as jnp
from tinyjax.array import Array
from tinyjax.lax import linalg as lax_linalg
from tinyjax.numpy import linalg as np_linalg


def _float_operands(name: str, *arrays: Any) -> list[Array]:
  from tinyjax.numpy._elementwise import promote
  return promote(name, *arrays, inexact=True, broadcast=False)


def _square(name: str, a: Array) -> None:
  if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
    raise ValueError(f"{name}: expected a square matrix (..., n, n), got shape {a.shape}")


def cholesky(a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> Array:
  """The Cholesky factor of symmetric positive-definite matrices: upper U (scipy's default, a = U^T U) or `lower`."""
  return np_linalg.cholesky(a, upper=not lower)


def cho_factor(a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> tuple[Array, bool]:
  """(factor, lower), for `cho_solve`."""
  return cholesky(a, lower=lower), lower


def solve_triangular(a: Any, b: Any, trans: int | str = 0, lower: bool = False, unit_diagonal: bool = False,
                     overwrite_b: bool = False, debug: Any = None, check_finite: bool = True) -> Array:
  """x with a x = b (trans 0 / 'N'), a^T x = b (1 / 'T') or a^H x = b (2 / 'C'), for triangular a (..., n, n) and b
  (..., n) or (..., n, k), batch dimensions broadcast. Only a's `lower` (or upper) triangle is read."""
  a, b = _float_operands("solve_triangular", a, b)
  _square("solve_triangular", a)
  if trans in (1, 2, "T", "C"): transpose_a = True
  elif trans in (0, "N"): transpose_a = False
  else: raise ValueError(f"Invalid 'trans' value {trans!r}: use 0, 1, 2, 'N', 'T' or 'C'")
  conjugate_a = trans in (2, "C")
  n = a.shape[-1]
  vector = b.ndim == 1 or b.ndim == a.ndim - 1
  column = b[..., None] if vector else b
  if column.shape[-2] != n:
    raise ValueError(f"solve_triangular: incompatible shapes: a is {a.shape} and b is {b.shape}; b's rows must "
                     f"number {n}")
  batch = np.broadcast_shapes(a.shape[:-2], column.shape[:-2])
  x = lax_linalg.triangular_solve(jnp.broadcast_to(a, (*batch, n, n)),
                                  jnp.broadcast_to(column, (*batch, *column.shape[-2:])), left_side=True,
                                  lower=lower, transpose_a=transpose_a, conjugate_a=conjugate_a,
                                  unit_diagonal=unit_diagonal)
  return x[..., 0] if vector else x


def cho_solve(c_and_lower: tuple[Any, bool], b: Any, overwrite_b: bool = False, check_finite: bool = True) -> Array:
  """x with a x = b, given a's Cholesky factor `(c, lower)` from `cho_factor`."""
  c, lower = c_and_lower
  if lower:
    return solve_triangular(c, solve_triangular(c, b, lower=True), trans=2, lower=True)
  return solve_triangular(c, solve_triangular(c, b, trans=2, lower=False), lower=False)


def lu_factor(a: Any, overwrite_a: bool = False, check_finite: bool = True) -> tuple[Array, Array]:
  """`(lu, piv)`: the packed LU factors of (..., m, n) and its row swaps (int32, 0-based), for `lu_solve`."""
  (x,) = _float_operands("lu_factor", a)
  factors, pivots, _ = lax_linalg.lu(x)
  return factors, pivots


def lu_solve(lu_and_piv: tuple[Any, Any], b: Any, trans: int = 0, overwrite_b: bool = False,
             check_finite: bool = True) -> Array:
  """x with a x = b (trans 0) or a^T x = b (1, 2), given `lu_factor(a)`; b (n,) or (n, k), or batches of them."""
  factors, pivots = lu_and_piv
  factors, b = _float_operands("lu_solve", factors, b)
  _square("lu_solve", factors)
  n = factors.shape[-1]
  vector = b.ndim == 1 or b.ndim == factors.ndim - 1
  column = b[..., None] if vector else b
  if column.shape[-2] != n:
    raise ValueError(f"lu_solve: incompatible shapes: lu is {factors.shape} and b is {b.shape}")
  batch = np.broadcast_shapes(factors.shape[:-2], column.shape[:-2])
  factors = jnp.broadcast_to(factors, (*batch, n, n))
  column = jnp.broadcast_to(column, (*batch, *column.shape[-2:]))
  permutation = jnp.broadcast_to(lax_linalg.lu_pivots_to_permutation(pivots, n), (*batch, n))
  if trans == 0:
    y = jnp.take_along_axis(column, permutation[..., :, None], axis=-2)
    y = lax_linalg.triangular_solve(factors, y, left_side=True, lower=True, unit_diagonal=True)
    x = lax_linalg.triangular_solve(factors, y, left_side=True, lower=False)
  elif trans in (1, 2):  # a^T = U^T L^T P: solve with U^T, then L^T, then undo the row permutation
    y = lax_linalg.triangular_solve(factors, column, left_side=True, lower=False, transpose_a=True)
    y = lax_linalg.triangular_solve(factors, y, left_side=True, lower=True, transpose_a=True, unit_diagonal=True)
    x = jnp.take_along_axis(y, jnp.argsort(permutation, axis=-1)[..., :, None], axis=-2)
  else:
    raise ValueError(f"'trans' value must be 0, 1, or 2, got {trans!r}")
  return x[..., 0] if vector else x


def lu(a: Any, permute_l: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> tuple[Array, ...]:
  """`(p, l, u)` with a = p l u for (..., m, n): p a permutation matrix (..., m, m), l unit lower (..., m, k), u upper
  (..., k, n), k = min(m, n); `permute_l`: `(p l, u)`."""
  (x,) = _float_operands("lu", a)
  factors, _, permutation = lax_linalg.lu(x)
  m, n = x.shape[-2:]
  k = min(m, n)
  lower = jnp.tril(factors[..., :, :k], -1) + jnp.eye(m, k, dtype=x.dtype)
  upper = jnp.triu(factors[..., :k, :])
  # a[perm] = l u, so a = p l u with p[perm[i], i] = 1
  p = (permutation[..., None, :] == jnp.arange(m)[:, None]).astype(x.dtype)
  if permute_l: return p @ lower, upper
  return p, lower, upper


def det(a: Any, overwrite_a: bool = False, check_finite: bool = True) -> Array:
  """The determinants of square matrices (..., n, n)."""
  return np_linalg.det(a)


def inv(a: Any, overwrite_a: bool = False, check_finite: bool = True) -> Array:
  """The inverses of square matrices (..., n, n)."""
  return np_linalg.inv(a)


def solve(a: Any, b: Any, lower: bool = False, overwrite_a: bool = False, overwrite_b: bool = False,
          debug: bool = False, check_finite: bool = True, assume_a: str = "gen") -> Array:
  """x with a x = b for square a (n, n) and b (n,) or (n, k): by LU ('gen', 'sym'), or by Cholesky ('pos': a
  symmetric positive-definite, its `lower` or upper triangle read)."""
  if assume_a not in ("gen", "sym", "her", "pos"):
    raise ValueError(f"Unknown assume_a {assume_a!r}: use 'gen', 'sym', 'her' or 'pos'")
  a, b = _float_operands("solve", a, b)
  _square("solve", a)
  if assume_a == "pos":
    factor = lax_linalg.cholesky(a if lower else jnp.swapaxes(a, -1, -2), symmetrize_input=False)
    return cho_solve((factor, True), b)
  return np_linalg.solve(a, b)


def eigh(a: Any, b: Any = None, lower: bool = True, eigvals_only: bool = False, overwrite_a: bool = False,
         overwrite_b: bool = False, turbo: bool = True, eigvals: Any = None, type: int = 1,  # noqa: A002
         check_finite: bool = True) -> Any:
  """Eigenvalues (ascending) `w` and eigenvectors `v` (columns) of symmetric a: `(w, v)`, or `w` if `eigvals_only`.
  The generalised problem (b given) is not built."""
  if b is not None: raise NotImplementedError("scipy.linalg.eigh with b (the generalised eigenproblem) is not built")
  if eigvals is not None: raise NotImplementedError("eigh's `eigvals` argument is not supported")
  w, v = np_linalg.eigh(a, UPLO="L" if lower else "U", symmetrize_input=False)
  return w if eigvals_only else (w, v)


def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True, overwrite_a: bool = False,
        check_finite: bool = True, lapack_driver: str = "gesdd") -> Any:
  """`(u, s, vh)` with a = u diag(s) vh, or `s` if not `compute_uv` (see tinyjax.numpy.linalg.svd)."""
  if lapack_driver not in ("gesdd", "gesvd"): raise ValueError(f"Unknown lapack_driver {lapack_driver!r}")
  out = np_linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)
  return tuple(out) if compute_uv else out


def qr(a: Any, overwrite_a: bool = False, lwork: Any = None, mode: str = "full", pivoting: bool = False,
       check_finite: bool = True) -> tuple[Array, ...]:
  """scipy's modes: 'full' (q (m, m), r (m, n)), 'economic' (q (m, k), r (k, n)), 'r' (`(r,)`, as scipy)."""
  if pivoting: raise NotImplementedError("scipy.linalg.qr with pivoting=True is not built")
  if mode not in ("full", "economic", "r"):
    raise ValueError(f"Unsupported QR decomposition mode '{mode}': use 'full', 'economic' or 'r'")
  (x,) = _float_operands("qr", a)
  q, r = lax_linalg.qr(x, full_matrices=mode == "full" or (mode == "r" and x.shape[-2] > x.shape[-1]))
  return (r,) if mode == "r" else (q, r)


# Pade approximant of degree 13 to exp (Higham, "The scaling and squaring method for the matrix exponential
# revisited", SIAM J. Matrix Anal. Appl. 26(4), 2005): numerator coefficients b_0..b_13, and the largest 1-norm
# theta_13 for which it is accurate to double precision without scaling
_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
           10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0, 1.0)
_THETA13 = 5.371920351148152


def expm(A: Any, *, upper_triangular: bool = False, max_squarings: int = 16) -> Array:  # noqa: N803 (scipy's name)
  """The matrix exponential of square matrices (..., n, n): the degree-13 Pade approximant of exp(A / 2^s), squared
  s times, with s the fewest halvings that bring A's 1-norm under theta_13 (at most `max_squarings`; a matrix that
  needs more gives NaN, as JAX). Differentiable (through the solve and products) and jit-able: s is a value, and the
  squarings run as a fixed loop of `max_squarings` steps that keep their input once s is reached."""
  from tinyjax import lax
  (a,) = _float_operands("expm", A)
  _square("expm", a)
  n = a.shape[-1]
  if n == 0: return a
  norm_1 = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)
  squarings = jnp.maximum(0.0, jnp.ceil(jnp.log2(norm_1 / _THETA13)))
  squarings = jnp.where(jnp.isfinite(squarings), squarings, 0.0)
  scaled = a / jnp.exp2(squarings)[..., None, None].astype(a.dtype)
  b = _PADE13
  eye = jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), a.shape)
  a2 = scaled @ scaled
  a4 = a2 @ a2
  a6 = a4 @ a2
  u = scaled @ (a6 @ (b[13] * a6 + b[11] * a4 + b[9] * a2) + b[7] * a6 + b[5] * a4 + b[3] * a2 + b[1] * eye)
  v = a6 @ (b[12] * a6 + b[10] * a4 + b[8] * a2) + b[6] * a6 + b[4] * a4 + b[2] * a2 + b[0] * eye
  result = np_linalg.solve(v - u, v + u)

  def square(i, r):
    return jnp.where((i < squarings)[..., None, None], r @ r, r)
  result = lax.fori_loop(0, max_squarings, square, result)
  return jnp.where((squarings > max_squarings)[..., None, None], np.nan, result).astype(a.dtype)


def block_diag(*arrs: Any) -> Array:
  """The block-diagonal matrix of the given matrices (scalars and 1-D arrays count as 1-row blocks)."""
  if not arrs: return jnp.zeros((1, 0))
  blocks = [jnp.atleast_2d(jnp.asarray(x)) for x in arrs]
  if any(x.ndim != 2 for x in blocks): raise ValueError("block_diag: arguments must have at most 2 dimensions")
  dtype = jnp.result_type(*blocks)
  columns = sum(x.shape[1] for x in blocks)
  rows, start = [], 0
  for x in blocks:
    rows.append(jnp.pad(x.astype(dtype), ((0, 0), (start, columns - start - x.shape[1]))))
    start += x.shape[1]
  return jnp.concatenate(rows, axis=0)


__all__ = ["block_diag", "cho_factor", "cho_solve", "cholesky", "det", "eigh", "expm", "inv", "lu", "lu_factor",
           "lu_solve", "qr", "solve", "solve_triangular", "svd"]
