"""tinyjax.numpy.linalg: jax.numpy.linalg. The factorisations and what is built on them (`cholesky`, `qr`, `svd`,
`svdvals`, `eigh`, `eigvalsh`, `inv`, `solve`, `det`, `slogdet`, `lstsq`, `pinv`, `matrix_rank`, `cond`,
`tensorinv`, `tensorsolve`, a negative `matrix_power`, the 2 / nuclear matrix norms) run LAPACK through the primitives
of tinyjax.lax.linalg, over any leading batch dimensions, differentiable (JAX's rules: `solve`, `det`, `slogdet` and
`pinv` have their own JVPs, which also share one LU between the value and its derivative) and batchable. The array API
extension's functions that need no factorisation (`vector_norm`, `matrix_norm`, `trace`, `diagonal`, `cross`,
`vecdot`, `outer`, `matmul`, `tensordot`, `matrix_transpose`) are compositions of the other primitives.
`eig` / `eigvals` take real matrices and return complex results. The factorisations take real float32 / float64
matrices (complex ones are not factored yet)."""
from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax import linalg as lax_linalg
from tinyjax.lax._base import canonicalize_axis, staged
from tinyjax.numpy import _elementwise as ew
from tinyjax.numpy._creation import asarray
from tinyjax.numpy._more import norm
from tinyjax.trace.custom import custom_jvp
from tinyjax.trace.jit import jitted_eagerly


class EighResult(NamedTuple):
  eigenvalues: Array
  eigenvectors: Array


class QRResult(NamedTuple):
  Q: Array
  R: Array


class SVDResult(NamedTuple):
  U: Array
  S: Array
  Vh: Array


class SlogdetResult(NamedTuple):
  sign: Array
  logabsdet: Array


def _inexact(name: str, *arrays: Any) -> list[Array]:
  """The operands as arrays of one float dtype (integers and bools become the default float, as JAX)."""
  return ew.promote(name, *arrays, inexact=True, broadcast=False)


def _matrices(name: str, a: Any, *, square: bool = False) -> Array:
  (x,) = _inexact(name, a)
  if x.ndim < 2 or (square and x.shape[-1] != x.shape[-2]):
    raise ValueError(f"Argument to {name} must have shape [..., n, n], got {x.shape}." if square else
                     f"Argument to {name} must have at least 2 dimensions [..., m, n], got {x.shape}.")
  return x


def _adjoint(x: Array) -> Array:
  """The conjugate transpose of the last two axes (the transpose for real x)."""
  return ew.conjugate(ew.swap_last(x))


@staged(static_argnames=("upper", "symmetrize_input"))
def cholesky(a: Any, *, upper: bool = False, symmetrize_input: bool = True) -> Array:
  """The lower Cholesky factor L of symmetric positive-definite matrices (..., n, n), a = L L^T (`upper`: L^T).
  NaN where a is not positive-definite (no exception, as JAX)."""
  factor = lax_linalg.cholesky(_matrices("cholesky", a, square=True), symmetrize_input=symmetrize_input)
  return _adjoint(factor) if upper else factor


@staged(static_argnames=("mode",), multiple_results=True)
def qr(a: Any, mode: str = "reduced") -> Any:
  """The QR decomposition of (..., m, n) matrices: Q with orthonormal columns and upper-triangular R, a = Q R.
  mode 'reduced' (Q (m, k), R (k, n), k = min(m, n)), 'complete' (Q (m, m), R (m, n)) or 'r' (R only)."""
  if mode not in ("reduced", "complete", "r"):
    raise ValueError(f"Unsupported QR decomposition mode '{mode}': use 'reduced', 'complete' or 'r'")
  x = _matrices("qr", a)
  q, r = lax_linalg.qr(x, full_matrices=mode == "complete")
  return r if mode == "r" else QRResult(q, r)


@staged(static_argnames=("full_matrices", "compute_uv", "hermitian", "subset_by_index"), multiple_results=True)
def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False,
        subset_by_index: tuple[int, int] | None = None) -> Any:
  """Singular value decomposition a = U diag(S) Vh of (..., m, n): `SVDResult(U, S, Vh)`, S descending; U (..., m, m)
  and Vh (..., n, n) if `full_matrices`, else (..., m, k) and (..., k, n); only S if not `compute_uv`. (`hermitian`
  is accepted; the general algorithm gives the same factorisation of a symmetric matrix.)"""
  (x,) = _inexact("svd", a)
  if x.ndim < 2: raise TypeError(f"Input 0 to svd must have rank at least 2, but got shape={x.shape}")
  out = lax_linalg.svd(x, full_matrices=full_matrices, compute_uv=compute_uv, subset_by_index=subset_by_index)
  return SVDResult(*out) if compute_uv else out


def svdvals(x: Any, /) -> Array:
  """The singular values (..., min(m, n)) of (..., m, n), descending."""
  return svd(x, compute_uv=False)


@staged(static_argnames=("UPLO", "symmetrize_input"), multiple_results=True)
def eigh(a: Any, UPLO: str | None = None, symmetrize_input: bool = True) -> EighResult:  # noqa: N803 (numpy's name)
  """Eigenvalues (ascending) and eigenvectors (columns) of symmetric matrices (..., n, n): `EighResult(eigenvalues,
  eigenvectors)`. UPLO 'L' (the default) or 'U' says which triangle is read when not `symmetrize_input`."""
  if UPLO not in (None, "L", "U"): raise ValueError(f"UPLO must be 'L' or 'U', got {UPLO!r}")
  vectors, values = lax_linalg.eigh(_matrices("eigh", a, square=True), lower=UPLO != "U",
                                    symmetrize_input=symmetrize_input)
  return EighResult(values, vectors)


@staged(static_argnames=("UPLO", "symmetrize_input"))
def eigvalsh(a: Any, UPLO: str | None = "L", symmetrize_input: bool = True) -> Array:  # noqa: N803
  """The eigenvalues (ascending) of symmetric matrices (..., n, n)."""
  return eigh(a, UPLO, symmetrize_input).eigenvalues


class EigResult(NamedTuple):
  eigenvalues: Array
  eigenvectors: Array


def eig(a: Any) -> EigResult:
  """Eigenvalues and right eigenvectors (unit-norm columns) of general real square matrices (..., n, n), complex
  (complex64, complex128 with x64), by LAPACK's geev: `EigResult(eigenvalues, eigenvectors)`. Not differentiable
  yet (for symmetric matrices use `eigh`)."""
  x = _matrices("eig", a, square=True)
  values, vectors = lax_linalg.eig(x, compute_left_eigenvectors=False)
  return EigResult(values, vectors)


def eigvals(a: Any) -> Array:
  """The eigenvalues (complex) of general real square matrices (..., n, n)."""
  x = _matrices("eigvals", a, square=True)
  return lax_linalg.eig(x, compute_left_eigenvectors=False, compute_right_eigenvectors=False)[0]


# ---- solves and determinants, on one LU each

def _lu_solve(factors: Array, permutation: Array, b: Array) -> Array:
  """x with a x = b for b (..., n, k), given a's packed LU and row permutation (a[perm] = L U); linear in b."""
  from tinyjax.numpy._indexing import take_along_axis
  permuted = take_along_axis(b, permutation[..., :, None], axis=-2)
  y = lax_linalg.triangular_solve(factors, permuted, left_side=True, lower=True, unit_diagonal=True)
  return lax_linalg.triangular_solve(factors, y, left_side=True, lower=False)


@custom_jvp
def _solve(a: Array, b: Array) -> Array:
  factors, _, permutation = lax_linalg.lu(a)
  return _lu_solve(factors, permutation, b)


@_solve.defjvp
def _solve_jvp(primals, tangents):
  """x = a^-1 b: x' = a^-1 (b' - a' x), with the one LU of a."""
  (a, b), (a_dot, b_dot) = primals, tangents
  factors, _, permutation = lax_linalg.lu(a)
  x = _lu_solve(factors, permutation, b)
  return x, _lu_solve(factors, permutation, b_dot - a_dot @ x)


@staged()
def solve(a: Any, b: Any) -> Array:
  """x with a x = b for a (..., n, n) and b (n,) or (..., n, k), batch dimensions broadcast (numpy 2's rule: b is a
  vector only when it is 1-D). A singular a gives inf / NaN, no exception."""
  from tinyjax.numpy._shape import broadcast_to
  a, b = _inexact("solve", a, b)
  if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
    raise ValueError(f"Argument to solve must have shape [..., n, n], got {a.shape}.")
  n = a.shape[-1]
  if b.ndim == 1:
    if b.shape[0] != n: raise ValueError(f"solve: b of shape {b.shape} does not match a of shape {a.shape}")
    column = broadcast_to(b[:, None], (*a.shape[:-2], n, 1))
    return _solve(a, column)[..., 0]
  if b.shape[-2] != n:
    raise ValueError(f"Invalid shapes for solve: {a.shape}, {b.shape}: b must be (n,) or (..., n, k) with n = {n} "
                     "(for a batch of vectors use solve(a, b[..., None])[..., 0])")
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  return _solve(broadcast_to(a, (*batch, n, n)), broadcast_to(b, (*batch, *b.shape[-2:])))


@staged()
def inv(a: Any) -> Array:
  """The inverses of square matrices (..., n, n) (inf / NaN where singular, as JAX)."""
  from tinyjax.numpy._creation import eye
  from tinyjax.numpy._shape import broadcast_to
  x = _matrices("inv", a, square=True)
  return _solve(x, broadcast_to(eye(x.shape[-1], dtype=x.dtype), x.shape))


def _unsigned_zero(x: Array) -> Array:
  """x with -0.0 as 0.0 (a singular matrix's determinant and sign are 0, whatever the permutation's parity)."""
  from tinyjax import numpy as jnp
  return jnp.where(x == 0, jnp.zeros_like(x), x)


def _lu_determinant_parts(a: Array) -> tuple[Array, Array, Array, Array]:
  """a's LU (factors, permutation), U's diagonal, and the permutation's sign."""
  from tinyjax import numpy as jnp
  factors, pivots, permutation = lax_linalg.lu(a)
  diagonal_u = jnp.diagonal(factors, axis1=-2, axis2=-1)
  swaps = jnp.sum(pivots != jnp.arange(pivots.shape[-1], dtype=pivots.dtype), axis=-1)
  parity = jnp.where(swaps % 2 == 1, -1.0, 1.0).astype(a.dtype)
  return factors, permutation, diagonal_u, parity


@custom_jvp
def _det(a: Array) -> Array:
  from tinyjax import numpy as jnp
  _, _, diagonal_u, parity = _lu_determinant_parts(a)
  return _unsigned_zero(parity * jnp.prod(diagonal_u, axis=-1))


@_det.defjvp
def _det_jvp(primals, tangents):
  """det'(a)[g] = tr(adj(a) g). With P a = L U, adj(a) = sign(P) adj(U) L^-1 P, and adj(U) = p U1^-1 D, where U1 is U
  with its last diagonal entry set to 1, p the product of U's other diagonal entries and D = diag(u_nn, ..., u_nn,
  1): defined also when u_nn = 0, so a matrix of rank n - 1 (its zero pivot last, as partial pivoting leaves it) gets
  its adjugate. Where U1 is singular as well (rank < n - 1) the adjugate is 0."""
  from tinyjax import numpy as jnp
  from tinyjax.numpy._indexing import take_along_axis
  (a,), (a_dot,) = primals, tangents
  factors, permutation, diagonal_u, parity = _lu_determinant_parts(a)
  determinant = _unsigned_zero(parity * jnp.prod(diagonal_u, axis=-1))
  n = a.shape[-1]
  if n == 0: return determinant, jnp.zeros_like(determinant)
  last = jnp.arange(n) == n - 1
  factors_1 = jnp.where(last[:, None] & last[None, :], 1.0, factors).astype(a.dtype)
  others = jnp.prod(jnp.where(last, 1.0, diagonal_u).astype(a.dtype), axis=-1)
  scale = jnp.where(last, 1.0, diagonal_u[..., -1:]).astype(a.dtype)
  probe = lax_linalg.triangular_solve(factors_1, jnp.ones((*a.shape[:-1], 1), a.dtype), left_side=True, lower=False)
  regular = jnp.all(jnp.isfinite(probe), axis=(-2, -1))
  # where U1 is singular the tangent is 0: solve with the identity there, so no 0 / 0 reaches a cotangent either
  factors_1 = jnp.where(regular[..., None, None], factors_1, jnp.eye(n, dtype=a.dtype))
  y = take_along_axis(a_dot, permutation[..., :, None], axis=-2)
  y = lax_linalg.triangular_solve(factors, y, left_side=True, lower=True, unit_diagonal=True)
  y = lax_linalg.triangular_solve(factors_1, y * scale[..., :, None], left_side=True, lower=False)
  tangent = parity * others * jnp.trace(y, axis1=-2, axis2=-1)
  return determinant, jnp.where(regular, tangent, 0.0).astype(a.dtype)


@staged()
def det(a: Any) -> Array:
  """The determinants (...) of square matrices (..., n, n), by LU; differentiable also where a is singular."""
  (x,) = _inexact("det", a)
  if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
    raise ValueError(f"Argument to _det() must have shape [..., n, n], got {x.shape}")
  return _det(x)


def _sign_and_log(a: Array) -> tuple[Array, Array, Array, Array]:
  """(sign, log|det|) of a by LU, and the LU (factors, permutation); a complex sign is det / |det| (0 if singular)."""
  from tinyjax import numpy as jnp
  factors, permutation, diagonal_u, parity = _lu_determinant_parts(a)
  magnitude = jnp.abs(diagonal_u)
  if dtypes.is_complex(a.dtype):
    phases = jnp.where(magnitude == 0, 0, diagonal_u / jnp.where(magnitude == 0, 1, magnitude).astype(a.dtype))
  else:
    phases = jnp.sign(diagonal_u)
  sign = _unsigned_zero(parity * jnp.prod(phases, axis=-1))
  return sign, jnp.sum(jnp.log(magnitude), axis=-1), factors, permutation


@custom_jvp
def _slogdet(a: Array) -> tuple[Array, Array]:
  sign, logabsdet, _, _ = _sign_and_log(a)
  return sign, logabsdet


@_slogdet.defjvp
def _slogdet_jvp(primals, tangents):
  """d log det a = tr(a^-1 a'): its real part is log|det|'s derivative; a real sign is piecewise constant, a complex
  one turns by i Im(tr) (JAX's rule)."""
  from tinyjax import numpy as jnp
  (a,), (a_dot,) = primals, tangents
  sign, logabsdet, factors, permutation = _sign_and_log(a)
  trace = jnp.trace(_lu_solve(factors, permutation, a_dot), axis1=-2, axis2=-1)
  if not dtypes.is_complex(a.dtype): return (sign, logabsdet), (jnp.zeros_like(sign), trace)
  return (sign, logabsdet), ((trace - jnp.real(trace).astype(a.dtype)) * sign, jnp.real(trace))


@staged(static_argnames=("method",), multiple_results=True)
def slogdet(a: Any, *, method: str | None = None) -> SlogdetResult:
  """`SlogdetResult(sign, logabsdet)` of square matrices (..., n, n): det = sign * exp(logabsdet), without overflow.
  A singular matrix gives sign 0 and logabsdet -inf."""
  if method not in (None, "lu"): raise ValueError(f"Unknown slogdet method '{method}'; only 'lu' is built")
  x = _matrices("slogdet", a, square=True)
  return SlogdetResult(*_slogdet(x))


# ---- built on the SVD

def _default_rtol(x: Array, factor: float) -> float:
  return factor * max(x.shape[-2:]) * float(dtypes.finfo(x.dtype).eps)


@custom_jvp
def _pinv(a: Array, rtol: Any) -> Array:
  from tinyjax import numpy as jnp
  u, s, vh = lax_linalg.svd(a, full_matrices=False)
  cutoff = jnp.asarray(rtol, s.dtype)[..., None] * s[..., :1]
  s_inv = jnp.where(s > cutoff, 1.0 / jnp.where(s > cutoff, s, 1.0), 0.0).astype(s.dtype)
  return (_adjoint(vh) * s_inv[..., None, :].astype(a.dtype)) @ _adjoint(u)


@_pinv.defjvp
def _pinv_jvp(primals, tangents):
  """The pseudo-inverse's derivative at fixed rank (Golub and Pereyra): p' = -p a' p + p p^T a'^T (1 - a p)
  + (1 - p a) a'^T p^T p."""
  (a, rtol), (a_dot, _) = primals, tangents
  p = _pinv(a, rtol)
  a_dot_t = _adjoint(a_dot)
  p_t = _adjoint(p)
  left = p @ (p_t @ (a_dot_t - a_dot_t @ (a @ p)))
  right = (a_dot_t - (p @ a) @ a_dot_t) @ (p_t @ p)
  return p, -(p @ (a_dot @ p)) + left + right


@jitted_eagerly
def pinv(a: Any, rtol: Any = None, hermitian: bool = False, *, rcond: Any = None) -> Array:
  """The Moore-Penrose pseudo-inverses (..., n, m) of (..., m, n), from the SVD: singular values at most `rtol`
  times the largest (default 10 * max(m, n) * eps) count as zero."""
  x = _matrices("pinv", a)
  if rcond is not None: rtol = rcond
  if x.size == 0:
    from tinyjax.numpy._creation import zeros
    return zeros((*x.shape[:-2], x.shape[-1], x.shape[-2]), x.dtype)
  if rtol is None: rtol = _default_rtol(x, 10.0)
  from tinyjax.numpy._shape import broadcast_to
  return _pinv(x, broadcast_to(asarray(rtol, dtypes.real_dtype(x.dtype)), x.shape[:-2]))


@jitted_eagerly
def matrix_rank(M: Any, rtol: Any = None, *, tol: Any = None) -> Array:  # noqa: N803 (numpy's name)
  """The number of singular values above `tol` (default: `rtol`, itself max(m, n) * eps by default, times the
  largest singular value), per matrix (..., m, n); for a 1-D input, 1 if any entry is non-zero."""
  from tinyjax import numpy as jnp
  (x,) = _inexact("matrix_rank", M)
  if x.ndim < 2: return jnp.any(x != 0).astype(np.int32)
  s = svdvals(x)
  if tol is None:
    if rtol is None: rtol = _default_rtol(x, 1.0)
    threshold = jnp.max(s, axis=-1, keepdims=True, initial=0.0) * jnp.asarray(rtol, s.dtype)[..., None]
  else:
    threshold = jnp.asarray(tol, s.dtype)[..., None]
  return jnp.sum(s > threshold, axis=-1).astype(np.int32)


def lstsq(a: Any, b: Any, rcond: Any = None, *, numpy_resid: bool = False) -> tuple[Array, Array, Array, Array]:
  """The least-squares solution x of a x = b for a (m, n) and b (m,) or (m, k), by the SVD: `(x, residuals, rank,
  singular values)`. Singular values below `rcond` (default max(m, n) * eps) times the largest are dropped. The
  residuals are the squared column norms of b - a x, always (JAX's rule; `numpy_resid=True` gives numpy's empty
  array where the rank is deficient or m <= n)."""
  from tinyjax import numpy as jnp
  a, b = _inexact("lstsq", a, b)
  if a.ndim != 2: raise TypeError(f"{a.ndim}-dimensional array given. Array must be two-dimensional")
  if b.ndim not in (1, 2): raise TypeError(f"{b.ndim}-dimensional array given. Array must be one or two-dimensional")
  if a.shape[0] != b.shape[0]:
    raise ValueError(f"Leading dimensions of input arrays must match, got shapes {a.shape} and {b.shape}")
  vector = b.ndim == 1
  if vector: b = b[:, None]
  m, n = a.shape
  if a.size == 0:
    s, rank, x = jnp.zeros((0,), jnp.real(a).dtype), jnp.asarray(0, np.int32), jnp.zeros((n, b.shape[1]), a.dtype)
  else:
    if rcond is None: rcond = _default_rtol(a, 1.0)
    else: rcond = jnp.where(jnp.asarray(rcond) < 0, float(dtypes.finfo(a.dtype).eps), rcond)
    u, s, vh = lax_linalg.svd(a, full_matrices=False)
    kept = (s > 0) & (s >= jnp.asarray(rcond, s.dtype) * s[0])
    rank = jnp.sum(kept).astype(np.int32)
    s_inv = jnp.where(kept, 1.0 / jnp.where(kept, s, 1.0), 0.0).astype(a.dtype)
    x = _adjoint(vh) @ (s_inv[:, None] * (_adjoint(u) @ b))
  if numpy_resid and (int(rank) < n or m <= n):
    residuals = jnp.zeros((0,), jnp.real(a).dtype)
  else:
    residuals = jnp.sum(jnp.abs(b - a @ x) ** 2, axis=0)
  return (x[:, 0] if vector else x), residuals, rank, s


@jitted_eagerly
def cond(x: Any, p: Any = None) -> Array:
  """The condition numbers of (..., m, n) in the `p` norm (None / 2 / -2: by the singular values; 1, -1, inf, -inf,
  'fro': norm(x) * norm(inv(x)), square x only); inf where x is singular."""
  from tinyjax import numpy as jnp
  (array,) = _inexact("cond", x)
  if array.ndim < 2: raise ValueError(f"jnp.linalg.cond: input array must be at least 2D; got {array.shape=}")
  if array.shape[-1] == 0 or array.shape[-2] == 0:
    raise ValueError(f"jnp.linalg.cond: input array must not be empty; got {array.shape=}")
  if p is None or p == 2:
    s = svdvals(array)
    return s[..., 0] / s[..., -1]
  if p == -2:
    s = svdvals(array)
    ratio = s[..., -1] / s[..., 0]
  else:
    if array.shape[-1] != array.shape[-2]:
      raise ValueError(f"jnp.linalg.cond: for {p=}, array must be square; got {array.shape=}")
    ratio = norm(array, p, axis=(-2, -1)) * norm(inv(array), p, axis=(-2, -1))
  has_nan = jnp.any(jnp.isnan(array), axis=(-2, -1))
  return jnp.where(jnp.isnan(ratio) & ~has_nan, np.inf, ratio).astype(ratio.dtype)


def tensorinv(a: Any, ind: int = 2) -> Array:
  """The inverse of `a` as a linear map from its first `ind` axes' space onto its remaining ones': shaped
  a.shape[ind:] + a.shape[:ind]."""
  from tinyjax.numpy._shape import reshape
  (x,) = _inexact("tensorinv", a)
  ind = operator.index(ind)
  if ind <= 0: raise ValueError(f"ind must be a positive integer, got {ind}")
  rows, columns = x.shape[:ind], x.shape[ind:]
  if math.prod(rows) != math.prod(columns):
    raise ValueError(f"tensorinv: the product of the first {ind} axes {rows} must equal that of the rest {columns}")
  return reshape(inv(reshape(x, (math.prod(rows), -1))), (*columns, *rows))


def tensorsolve(a: Any, b: Any, axes: tuple[int, ...] | None = None) -> Array:
  """x with tensordot(a, x, x.ndim) = b, where x is shaped as a's axes after b.ndim (`axes` of a moved last first)."""
  from tinyjax.numpy._shape import moveaxis, reshape
  a, b = _inexact("tensorsolve", a, b)
  if axes is not None:
    axes = tuple(canonicalize_axis(axis, a.ndim) for axis in axes)
    a = moveaxis(a, axes, tuple(range(a.ndim - len(axes), a.ndim)))
  solution_shape = a.shape[b.ndim:]
  size = math.prod(solution_shape)
  if math.prod(a.shape[:b.ndim]) != size or a.shape[:b.ndim] != b.shape:
    raise ValueError(f"tensorsolve: a of shape {a.shape} and b of shape {b.shape} do not make a square system")
  return reshape(solve(reshape(a, (size, size)), reshape(b, (size,))), solution_shape)


def multi_dot(arrays: Any, *, precision: Any = None) -> Array:
  """The product of a chain of matrices (the first may be 1-D, a row; the last 1-D, a column), multiplied in the
  order with the fewest flops (the textbook matrix-chain dynamic program)."""
  from tinyjax.numpy._linalg import matmul as _matmul
  chain = [asarray(x) for x in arrays]
  if len(chain) < 2: raise ValueError(f"multi_dot expects at least two arrays, got {len(chain)}")
  if len(chain) == 2: return _matmul(chain[0], chain[1], precision=precision)
  first_vector, last_vector = chain[0].ndim == 1, chain[-1].ndim == 1
  if first_vector: chain[0] = chain[0][None, :]
  if last_vector: chain[-1] = chain[-1][:, None]
  if any(x.ndim != 2 for x in chain):
    raise ValueError("multi_dot: the arrays must be 2-D (the first and last may be 1-D)")
  dims = [chain[0].shape[0]] + [x.shape[1] for x in chain]
  count = len(chain)
  cost = [[0] * count for _ in range(count)]
  split = [[0] * count for _ in range(count)]
  for length in range(1, count):
    for i in range(count - length):
      j = i + length
      cost[i][j], split[i][j] = min((cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1], k)
                                    for k in range(i, j))

  def product(i: int, j: int) -> Array:
    if i == j: return chain[i]
    return _matmul(product(i, split[i][j]), product(split[i][j] + 1, j), precision=precision)
  result = product(0, count - 1)
  if first_vector: result = result[0]
  if last_vector: result = result[..., 0]
  return result


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
  """The matrix `a` (each in the last two axes) raised to the integer power `n`, by repeated squaring (of the
  inverse for a negative `n`)."""
  import operator
  array = asarray(a)
  n = operator.index(n)
  if array.ndim < 2 or array.shape[-1] != array.shape[-2]:
    raise ValueError(f"matrix_power: the last two axes must be square, got shape {array.shape}")
  if n < 0: array, n = inv(array), -n
  from tinyjax.numpy._creation import eye
  from tinyjax.numpy._shape import broadcast_to
  result, square = None, array
  while n:
    if n & 1: result = square if result is None else matmul(result, square)
    n >>= 1
    if n: square = matmul(square, square)
  if result is None: result = broadcast_to(eye(array.shape[-1], dtype=array.dtype), array.shape)
  return result


__all__ = ["EigResult", "EighResult", "QRResult", "SVDResult", "SlogdetResult", "cholesky", "cond", "cross", "det",
           "diagonal",
           "eig", "eigh", "eigvals", "eigvalsh", "inv", "lstsq", "matmul", "matrix_norm", "matrix_power",
           "matrix_rank", "matrix_transpose", "multi_dot", "norm", "outer", "pinv", "qr", "slogdet", "solve", "svd",
           "svdvals", "tensordot", "tensorinv", "tensorsolve", "trace", "vecdot", "vector_norm"]
