"""tinyjax.lax.linalg: JAX's linear algebra primitives, computed by LAPACK (lax/_lapack.py) on the host.

Each primitive is a host step of the program (a CALLBACK node under `jit`, as `pure_callback`; `DEBUG=1` prints it as
`host call <name>`) over matrices with any leading batch dimensions, and has the rules of JAX's primitive of the same
name: a JVP rule (so `grad`, `jvp`, `jacfwd`/`jacrev` work, composed with `jit` and `vmap`), and a batching rule that
makes the vmapped axis one more leading batch dimension of a single call. `triangular_solve` is linear in its
right-hand side and has a transpose rule, which is what the reverse mode of the others is built on.

Primitives: `cholesky_p`, `eigh_p` (eigenvectors, eigenvalues), `eig_p` (complex eigenvalues and eigenvectors; the
eigenvalues' derivative only, as JAX), `lu_p` (packed LU, pivots, permutation), `qr_p`, `svd_p` (singular values
first, then U and V^H when computed), `triangular_solve_p`. float32 / float64 (x64) and complex64 / complex128
matrices; float16 / bfloat16 raise NotImplementedError as JAX's CPU backend does.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax import _lapack, _small_linalg
from tinyjax.lax._base import to_array
from tinyjax.trace import ad, batching
from tinyjax.trace.callback import HostCallback, host_call
from tinyjax.trace.core import Primitive

INT32 = np.dtype(np.int32)


_REAL = (np.dtype(np.float32), np.dtype(np.float64))
_COMPLEX = (np.dtype(np.complex64), np.dtype(np.complex128))


def _operand(name: str, x: Any, *, square: bool = False) -> Array:
  """`x` as a float32/float64/complex64/complex128 array of rank >= 2 (square if asked), or JAX's errors."""
  x = to_array(x)
  if x.dtype not in _REAL + _COMPLEX:
    if dtypes.is_floating(x.dtype):
      raise NotImplementedError(f"{name}: unsupported dtype {x.dtype}; LAPACK works in float32 and float64: convert "
                                "the input with .astype(jnp.float32)")
    raise TypeError(f"{name} requires a floating-point array, got dtype {x.dtype}; convert it with "
                    ".astype(jnp.float32) (jnp.linalg's functions convert integers themselves)")
  if x.ndim < 2: raise TypeError(f"Input to {name} must have rank at least 2, but got shape={x.shape}")
  if square and x.shape[-1] != x.shape[-2]:
    raise ValueError(f"{name} requires square matrices (..., n, n), got shape {x.shape}")
  return x


def _host(name: str, fn: Any, operands: list[Any], out_avals: list[tuple], native: Any = None) -> list[Array]:
  """Run `fn` (numpy arrays in, a list of numpy arrays out) on the operands' values, as a host step (`native`: its
  compiled kernel, see HostCallback)."""
  return host_call(HostCallback(fn, tuple((tuple(shape), np.dtype(dtype)) for shape, dtype in out_avals), name,
                                checked=False, native=native), *operands)


def _batch_on_leading_axis(prim: Primitive) -> None:
  """vmap of a primitive over matrices with batch dimensions: the vmapped axis becomes the leading batch axis of
  every operand (broadcast where an operand is not batched), and of every result."""
  def rule(trace, vals, dims, **params):
    if all(d is None for d in dims):
      out = prim.bind(*vals, **params)
      return out, ([None] * len(out) if prim.multiple_results else None)
    size = batching.batch_size(vals, dims)
    out = prim.bind(*(batching.match_axis(v, d, 0, size) for v, d in zip(vals, dims)), **params)
    return out, ([0] * len(out) if prim.multiple_results else 0)
  batching.batch_rules[prim] = rule


# small helpers the rules are written with (jnp functions: they bind on the current trace)

def _jnp():
  from tinyjax import numpy as jnp
  return jnp


def _mT(x: Any) -> Any: return _jnp().swapaxes(x, -1, -2)


def _mH(x: Any) -> Any: return _jnp().conj(_mT(x))  # (the conjugate transpose; _mT for real x)


def _tril(x: Any, k: int = 0) -> Any: return _jnp().tril(x, k)


def _triu(x: Any, k: int = 0) -> Any: return _jnp().triu(x, k)


def _diagonal(x: Any) -> Any: return _jnp().diagonal(x, axis1=-2, axis2=-1)


# ---------------------------------------------------------------------------------------------------------------------
# triangular_solve: linear in b

def _triangular_solve_impl(a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
  def run(a_value, b_value):
    return [_lapack.trsm(a_value, b_value, left_side=left_side, lower=lower, transpose_a=transpose_a,
                         unit_diagonal=unit_diagonal, conjugate_a=conjugate_a and a_value.dtype.kind == "c")]
  native = None
  if _small_linalg.compiled(a, b):
    sizes = _small_linalg.trsm_sizes(a.shape[-1], *b.shape[-2:], left_side=left_side, lower=lower,
                                     transpose_a=transpose_a, unit_diagonal=unit_diagonal)
    native = _small_linalg.native("trsm", a.dtype, math.prod(b.shape[:-2]), *sizes)
  return _host("triangular_solve", run, [a, b], [(b.shape, b.dtype)], native)[0]


triangular_solve_p = Primitive("triangular_solve", _triangular_solve_impl)


def _triangle(a: Any, lower: bool, unit_diagonal: bool) -> Any:
  """The part of `a` a triangular solve reads (strictly below / above the diagonal when it is taken as ones)."""
  k = (-1 if lower else 1) if unit_diagonal else 0
  return _tril(a, k) if lower else _triu(a, k)


def _triangular_solve_jvp_a(a_dot, x, a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
  """op(a) x = b gives op(a) x' = -op(a') x (x op(a) = b: x' op(a) = -x op(a')): one more solve with a."""
  a_dot = _triangle(a_dot, lower, unit_diagonal)
  if conjugate_a: a_dot = _jnp().conj(a_dot)
  op_a_dot = _mT(a_dot) if transpose_a else a_dot
  rhs = -(op_a_dot @ x) if left_side else -(x @ op_a_dot)
  return triangular_solve_p.bind(a, rhs, left_side=left_side, lower=lower, transpose_a=transpose_a,
                                 conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)


def _triangular_solve_jvp_b(b_dot, x, a, b, **params):
  return triangular_solve_p.bind(a, b_dot, **params)


def _triangular_solve_transpose(ct, node, known):
  """x = op(a)^-1 b (or b op(a)^-1) is linear in b; its transpose solves with op(a)^T: the other transpose_a."""
  a = known[0]
  params = dict(node.arg.params)
  params["transpose_a"] = not params["transpose_a"]
  return None, triangular_solve_p.bind(a, ct, **params)


ad.defjvp(triangular_solve_p, _triangular_solve_jvp_a, _triangular_solve_jvp_b)
ad.transpose_rules[triangular_solve_p] = _triangular_solve_transpose
ad.abstract_eval_rules[triangular_solve_p] = lambda a, b, **params: (tuple(b.shape), b.dtype, b.weak_type)
_batch_on_leading_axis(triangular_solve_p)


def triangular_solve(a: Any, b: Any, *, left_side: bool = False, lower: bool = False, transpose_a: bool = False,
                     conjugate_a: bool = False, unit_diagonal: bool = False) -> Array:
  """x with op(a) x = b (`left_side`) or x op(a) = b, for triangular a (..., k, k) (its `lower` or upper triangle is
  read; `unit_diagonal` takes its diagonal as ones) and b (..., m, n) with the same batch dimensions; op(a) is a^T
  when `transpose_a`. `conjugate_a` has no effect on real matrices."""
  a = _operand("triangular_solve", a, square=True)
  b = _operand("triangular_solve", b)
  if a.dtype != b.dtype: raise TypeError(f"triangular_solve: a and b must have one dtype, got {a.dtype} and {b.dtype}")
  if a.shape[:-2] != b.shape[:-2]:
    raise ValueError(f"triangular_solve: a and b must have equal batch dimensions, got shapes {a.shape} and {b.shape}")
  if b.shape[-2 if left_side else -1] != a.shape[-1]:
    raise ValueError(f"triangular_solve: b's {'rows' if left_side else 'columns'} must match a's size "
                     f"{a.shape[-1]} (left_side={left_side}), got shapes {a.shape} and {b.shape}")
  return triangular_solve_p.bind(a, b, left_side=bool(left_side), lower=bool(lower), transpose_a=bool(transpose_a),
                                 conjugate_a=bool(conjugate_a), unit_diagonal=bool(unit_diagonal))


# ---------------------------------------------------------------------------------------------------------------------
# cholesky

def _cholesky_impl(x):
  native = _small_linalg.native("potrf", x.dtype, math.prod(x.shape[:-2]), x.shape[-1]) \
      if _small_linalg.compiled(x) else None
  return _host("cholesky", lambda a: [_lapack.potrf(a)], [x], [(x.shape, x.dtype)], native)[0]


cholesky_p = Primitive("cholesky", _cholesky_impl)


def _cholesky_jvp(x_dot, factor, x):
  """a = L L^H gives L' = L phi(L^-1 a' L^-H), phi taking the lower triangle with its diagonal halved."""
  x_dot = (x_dot + _mH(x_dot)) * 0.5
  right = triangular_solve_p.bind(factor, x_dot, left_side=False, lower=True, transpose_a=True, conjugate_a=True,
                                  unit_diagonal=False)
  inner = triangular_solve_p.bind(factor, right, left_side=True, lower=True, transpose_a=False, conjugate_a=False,
                                  unit_diagonal=False)
  phi = _tril(inner, -1) + _tril(_triu(inner)) * 0.5
  return factor @ phi


ad.defjvp(cholesky_p, _cholesky_jvp)
_batch_on_leading_axis(cholesky_p)


def cholesky(x: Any, *, symmetrize_input: bool = True) -> Array:
  """The lower Cholesky factor L (..., n, n) of symmetric (Hermitian) positive-definite matrices, x = L L^H. Only x's
  lower triangle is read unless `symmetrize_input` (the default) first averages x with x^H. NaN where x is not
  positive-definite (no exception, as JAX)."""
  x = _operand("cholesky", x, square=True)
  if symmetrize_input: x = (x + _mH(x)) * 0.5
  return cholesky_p.bind(x)


# ---------------------------------------------------------------------------------------------------------------------
# lu

def _lu_impl(x):
  m, n = x.shape[-2:]

  def run(a):
    return list(_lapack.getrf(a))
  native = _small_linalg.native("getrf", x.dtype, math.prod(x.shape[:-2]), m, n) if _small_linalg.compiled(x) else None
  return _host("lu", run, [x], [(x.shape, x.dtype), ((*x.shape[:-2], min(m, n)), INT32), ((*x.shape[:-2], m), INT32)],
               native)


lu_p = Primitive("lu", _lu_impl, multiple_results=True)


def _lu_jvp(primals, tangents):
  """P a = L U gives L^-1 P a' U^-1 = L^-1 L' + U' U^-1, strictly lower plus upper: L' and U' are read off
  X = L^-1 P a' U^-1. Rectangular factors are completed to square ones with identity blocks first."""
  jnp = _jnp()
  (x,), (x_dot,) = primals, tangents
  factors, pivots, permutation = lu_p.bind(x)
  m, n = x.shape[-2:]
  k = min(m, n)
  lower = _tril(factors[..., :, :k], -1)
  if m > k: lower = jnp.concatenate([lower, jnp.zeros((*lower.shape[:-1], m - k), x.dtype)], axis=-1)
  lower = lower + jnp.eye(m, dtype=x.dtype)
  upper = _triu(factors[..., :k, :])
  if n > k:
    upper = jnp.concatenate([upper, jnp.zeros((*upper.shape[:-2], n - k, n), x.dtype)], axis=-2)
    upper = upper + jnp.pad(jnp.eye(n - k, dtype=x.dtype), ((k, 0), (k, 0)))
  permuted = jnp.take_along_axis(x_dot, permutation[..., :, None], axis=-2)
  solved = triangular_solve_p.bind(lower, permuted, left_side=True, lower=True, transpose_a=False, conjugate_a=False,
                                   unit_diagonal=True)
  solved = triangular_solve_p.bind(upper, solved, left_side=False, lower=False, transpose_a=False, conjugate_a=False,
                                   unit_diagonal=False)
  factors_dot = lower @ _tril(solved, -1) + _triu(solved) @ upper
  return [factors, pivots, permutation], [factors_dot, None, None]


ad.jvp_rules[lu_p] = _lu_jvp
_batch_on_leading_axis(lu_p)


def lu(x: Any) -> tuple[Array, Array, Array]:
  """LU decomposition with partial pivoting of (..., m, n): `(lu, pivots, permutation)`, where lu packs the
  unit-lower L below its diagonal and U on and above it, pivots (..., min(m, n)) int32 are the row swaps made in
  order, and permutation (..., m) int32 is the permutation they amount to: x[..., permutation, :] = L U. A singular
  matrix factors with a zero on U's diagonal (no exception, as JAX)."""
  return tuple(lu_p.bind(_operand("lu", x)))


def _pivots_to_permutation_impl(pivots, *, permutation_size):
  return _host("lu_pivots_to_permutation",
               lambda swaps: [_lapack.permutation_of(swaps.astype(np.int64), permutation_size)], [pivots],
               [((*pivots.shape[:-1], permutation_size), INT32)])[0]


lu_pivots_to_permutation_p = Primitive("lu_pivots_to_permutation", _pivots_to_permutation_impl)
_batch_on_leading_axis(lu_pivots_to_permutation_p)


def lu_pivots_to_permutation(pivots: Any, permutation_size: int) -> Array:
  """The permutation (..., permutation_size) int32 that the row swaps `pivots` (..., k) amount to (a host step, as
  `lu` computes its own permutation)."""
  pivots = to_array(pivots)
  if not dtypes.is_integer(pivots.dtype): raise TypeError(f"pivots must be integers, got dtype {pivots.dtype}")
  if pivots.ndim < 1 or pivots.shape[-1] > permutation_size:
    raise ValueError(f"pivots of shape {pivots.shape} need a permutation_size of at least their last dimension")
  return lu_pivots_to_permutation_p.bind(pivots, permutation_size=int(permutation_size))


# ---------------------------------------------------------------------------------------------------------------------
# eigh

def _eigh_impl(x, *, lower):
  def run(a):
    # (the upper triangle's Hermitian completion is the lower triangle of conj(a^T))
    values, vectors = _lapack.syevd(a if lower else np.conj(np.swapaxes(a, -1, -2)))
    return [vectors, values]
  return _host("eigh", run, [x], [(x.shape, x.dtype), (x.shape[:-1], dtypes.real_dtype(x.dtype))])


eigh_p = Primitive("eigh", _eigh_impl, multiple_results=True)


def _eigh_jvp(primals, tangents, *, lower):
  """a = V diag(w) V^H gives w' = re diag(V^H a' V) and V' = V (F * V^H a' V), F_ij = 1 / (w_j - w_i) off the
  diagonal, 0 on it (the eigenvalues must be distinct for V' to exist)."""
  jnp = _jnp()
  (x,), (x_dot,) = primals, tangents
  vectors, values = eigh_p.bind(x, lower=lower)
  eye = jnp.eye(x.shape[-1], dtype=values.dtype)
  gaps = eye + values[..., None, :] - values[..., :, None]
  inverse_gaps = (1.0 / gaps - eye).astype(x.dtype)
  projected = _mH(vectors) @ x_dot @ vectors
  return [vectors, values], [vectors @ (inverse_gaps * projected), jnp.real(_diagonal(projected))]


ad.jvp_rules[eigh_p] = _eigh_jvp
_batch_on_leading_axis(eigh_p)


def eigh(x: Any, *, lower: bool = True, symmetrize_input: bool = True, sort_eigenvalues: bool = True,
         subset_by_index: tuple[int, int] | None = None) -> tuple[Array, Array]:
  """Eigenvectors v (..., n, n) (columns) and eigenvalues w (..., n), ascending, of symmetric matrices: x = v diag(w)
  v^T. Reads x's `lower` (or upper) triangle; `symmetrize_input` first averages x with x^T. `subset_by_index=(lo,
  hi)` keeps eigenvalues lo..hi-1 and their vectors."""
  x = _operand("eigh", x, square=True)
  if symmetrize_input: x = (x + _mH(x)) * 0.5
  vectors, values = eigh_p.bind(x, lower=bool(lower))
  if subset_by_index is not None:
    low, high = subset_by_index
    if not 0 <= low <= high <= x.shape[-1]:
      raise ValueError(f"subset_by_index={subset_by_index} must satisfy 0 <= lo <= hi <= {x.shape[-1]}")
    vectors, values = vectors[..., low:high], values[..., low:high]
  return vectors, values


# ---------------------------------------------------------------------------------------------------------------------
# svd

def _svd_impl(x, *, full_matrices, compute_uv):
  m, n = x.shape[-2:]
  k = min(m, n)
  avals = [((*x.shape[:-2], k), dtypes.real_dtype(x.dtype))]
  if compute_uv:
    avals += [((*x.shape[:-2], m, m if full_matrices else k), x.dtype),
              ((*x.shape[:-2], n if full_matrices else k, n), x.dtype)]
  return _host("svd", lambda a: list(_lapack.gesdd(a, full_matrices=full_matrices, compute_uv=compute_uv)), [x],
               avals)


svd_p = Primitive("svd", _svd_impl, multiple_results=True)


def _svd_jvp(primals, tangents, *, full_matrices, compute_uv):
  """Of a = U diag(s) V^T (reduced): s' = diag(U^T a' V), and U', V' from the off-diagonal part of U^T a' V
  (F_ij = 1 / (s_j^2 - s_i^2)), plus the parts of a' outside U's / V's span for a tall / wide a."""
  (x,), (x_dot,) = primals, tangents
  if compute_uv and full_matrices:
    raise NotImplementedError("Singular value decomposition JVP not implemented for full matrices: use "
                              "full_matrices=False")
  jnp = _jnp()
  values, u, vt = svd_p.bind(x, full_matrices=False, compute_uv=True)
  v = _mH(vt)
  projected = _mH(u) @ x_dot @ v
  values_dot = jnp.real(_diagonal(projected))
  if not compute_uv: return [values], [values_dot]
  s_row = values[..., None, :]
  eye = jnp.eye(values.shape[-1], dtype=values.dtype)
  differences = (s_row + _mT(s_row)) * (s_row - _mT(s_row)) + eye
  inverse_differences = (1.0 / differences - eye).astype(x.dtype)
  s_row, s_column = s_row.astype(x.dtype), _mT(s_row).astype(x.dtype)
  u_inner = inverse_differences * (projected * s_row + _mH(projected * s_row))
  if jnp.iscomplexobj(x):  # the phase the diagonal leaves free: i Im(dS_ii) / s_i on U's side (JAX's convention)
    safe = jnp.where(values == 0, 1.0, values)
    u_inner = u_inner + (0.5 * (projected - _mH(projected))) * (eye / safe[..., None, :]).astype(x.dtype)
  u_dot = u @ u_inner
  v_dot = v @ (inverse_differences * (s_column * projected + _mH(s_column * projected)))
  m, n = x.shape[-2:]
  if m > n:
    applied = x_dot @ v
    u_dot = u_dot + (applied - u @ (_mH(u) @ applied)) / s_row
  if n > m:
    applied = _mH(x_dot) @ u
    v_dot = v_dot + (applied - v @ (vt @ applied)) / s_row
  return [values, u, vt], [values_dot, u_dot, _mH(v_dot)]


ad.jvp_rules[svd_p] = _svd_jvp
_batch_on_leading_axis(svd_p)


def svd(x: Any, *, full_matrices: bool = True, compute_uv: bool = True,
        subset_by_index: tuple[int, int] | None = None) -> Any:
  """Singular value decomposition of (..., m, n): `(u, s, vh)` with x = u diag(s) vh, s (..., k) descending (k =
  min(m, n)), u (..., m, m) and vh (..., n, n) (`full_matrices`) or (..., m, k) and (..., k, n); only s if not
  `compute_uv`. `subset_by_index=(lo, hi)` keeps singular values lo..hi-1 and their vectors."""
  x = _operand("svd", x)
  outs = svd_p.bind(x, full_matrices=bool(full_matrices), compute_uv=bool(compute_uv))
  if subset_by_index is not None:
    low, high = subset_by_index
    if not 0 <= low <= high <= min(x.shape[-2:]):
      raise ValueError(f"subset_by_index={subset_by_index} must satisfy 0 <= lo <= hi <= {min(x.shape[-2:])}")
    outs = [outs[0][..., low:high]] + ([outs[1][..., low:high], outs[2][..., low:high, :]] if compute_uv else [])
  if not compute_uv: return outs[0]
  values, u, vh = outs
  return u, values, vh


# ---------------------------------------------------------------------------------------------------------------------
# qr

def _qr_impl(x, *, full_matrices):
  m, n = x.shape[-2:]
  columns = m if full_matrices else min(m, n)
  return _host("qr", lambda a: list(_lapack.geqrf_orgqr(a, full_matrices=full_matrices)), [x],
               [((*x.shape[:-2], m, columns), x.dtype), ((*x.shape[:-2], columns, n), x.dtype)])


qr_p = Primitive("qr", _qr_impl, multiple_results=True)


def _qr_jvp(primals, tangents, *, full_matrices):
  """a = Q R (m >= n): with C = Q^T a' R^-1 and Omega = tril(C, -1) - tril(C, -1)^T (antisymmetric),
  Q' = Q (Omega - C) + a' R^-1 and R' = (C - Omega) R."""
  (x,), (x_dot,) = primals, tangents
  m, n = x.shape[-2:]
  if m < n or (full_matrices and m != n):
    raise NotImplementedError("Unimplemented case of QR decomposition derivative: it needs m >= n, and m == n when "
                              "full_matrices (mode='complete')")
  jnp = _jnp()
  q, r = qr_p.bind(x, full_matrices=full_matrices)
  right = triangular_solve_p.bind(r, x_dot, left_side=False, lower=False, transpose_a=False, conjugate_a=False,
                                  unit_diagonal=False)
  projected = _mH(q) @ right
  strictly_lower = _tril(projected, -1)
  omega = strictly_lower - _mH(strictly_lower)
  if jnp.iscomplexobj(x):  # (the diagonal's imaginary part: R's diagonal stays real)
    omega = omega + jnp.eye(x.shape[-1], dtype=x.dtype) * (projected - jnp.real(projected).astype(x.dtype))
  return [q, r], [q @ (omega - projected) + right, (projected - omega) @ r]


ad.jvp_rules[qr_p] = _qr_jvp
_batch_on_leading_axis(qr_p)


def qr(x: Any, *, pivoting: bool = False, full_matrices: bool = True) -> tuple[Array, Array]:
  """QR decomposition of (..., m, n): q with orthonormal columns and upper-triangular r, x = q r; q (..., m, m) and
  r (..., m, n) if `full_matrices`, else (..., m, k) and (..., k, n), k = min(m, n)."""
  if pivoting: raise NotImplementedError("qr with pivoting=True (LAPACK's geqp3) is not built in tinyjax")
  q, r = qr_p.bind(_operand("qr", x), full_matrices=bool(full_matrices))
  return q, r


# ---------------------------------------------------------------------------------------------------------------------
# eig (real input, complex results)

def _eig_impl(x, *, compute_left_eigenvectors, compute_right_eigenvectors):
  complex_dtype = dtypes.complex_dtype(x.dtype)
  avals = [(x.shape[:-1], complex_dtype)]
  avals += [(x.shape, complex_dtype)] * (int(compute_left_eigenvectors) + int(compute_right_eigenvectors))
  return _host("eig", lambda a: _lapack.geev(a, left=compute_left_eigenvectors, right=compute_right_eigenvectors),
               [x], avals)


eig_p = Primitive("eig", _eig_impl, multiple_results=True)


def _eig_jvp(primals, tangents, *, compute_left_eigenvectors, compute_right_eigenvectors):
  """The eigenvalues' derivative, as JAX's: a = V diag(w) V^-1 gives w' = diag(V^-1 a' V). Eigenvectors have none
  (JAX's error)."""
  if compute_left_eigenvectors or compute_right_eigenvectors:
    raise NotImplementedError("The derivatives of eigenvectors are not implemented, only eigenvalues (use "
                              "linalg.eigvals, or eigh for symmetric matrices, which is differentiable)")
  from tinyjax.numpy.linalg import solve
  (x,), (x_dot,) = primals, tangents
  values, vectors = eig_p.bind(x, compute_left_eigenvectors=False, compute_right_eigenvectors=True)
  projected = solve(vectors, x_dot.astype(vectors.dtype) @ vectors)
  return [values], [_diagonal(projected)]


ad.jvp_rules[eig_p] = _eig_jvp
_batch_on_leading_axis(eig_p)


def eig(x: Any, *, compute_left_eigenvectors: bool = True, compute_right_eigenvectors: bool = True) -> list[Array]:
  """Eigenvalues of general real square matrices (..., n, n) (complex, LAPACK's geev order) and their left and right
  eigenvectors (unit-norm complex columns): `[w, vl, vr]`, without the ones not asked for. The eigenvalues are
  differentiable (when no eigenvectors are computed, as JAX)."""
  x = _operand("eig", x, square=True)
  return list(eig_p.bind(x, compute_left_eigenvectors=bool(compute_left_eigenvectors),
                         compute_right_eigenvectors=bool(compute_right_eigenvectors)))


__all__ = ["cholesky", "cholesky_p", "eig", "eig_p", "eigh", "eigh_p", "lu", "lu_p", "lu_pivots_to_permutation",
           "lu_pivots_to_permutation_p", "qr", "qr_p", "svd", "svd_p", "triangular_solve", "triangular_solve_p"]
