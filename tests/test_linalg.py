"""Linear algebra on LAPACK: tinyjax.lax.linalg's primitives, tinyjax.numpy.linalg and tinyjax.scipy.linalg.

Values against numpy's float64 linalg (and identities: reconstructions, orthogonality, det(ab) = det(a) det(b),
expm(a) expm(-a) = 1), gradients of every rule against central differences in float64, the transformations composed
(jit(vmap(grad)), vmap(jit), grad(jit)), and JAX's behaviour on bad and singular input."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
import tinyjax.scipy.linalg as jsl
from tinyjax.lax import linalg as lax_linalg
from tests.gradcheck import numeric_grad, numeric_grad_complex

RNG = np.random.default_rng(20261127)


def _random(*shape, dtype=np.float32):
  return RNG.standard_normal(shape).astype(dtype)


def _spd(*batch, n=4, dtype=np.float32):
  a = RNG.standard_normal((*batch, n, n))
  return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)


def _symmetric(*batch, n=4, dtype=np.float32):
  a = RNG.standard_normal((*batch, n, n))
  return (a + np.swapaxes(a, -1, -2)).astype(dtype)


@pytest.fixture
def x64():
  with tj.config.override("jax_enable_x64", True): yield


def _check_grad(f, x, *, eps=1e-6, rtol=1e-6, atol=1e-7):
  """grad of sum(f(x) * w) for a random w against central differences, in float64, eagerly and under jit."""
  w = RNG.standard_normal(np.shape(np.asarray(f(jnp.asarray(x)))))
  scalar = lambda v: jnp.sum(f(v) * w)  # noqa: E731
  numeric = numeric_grad(lambda v: scalar(jnp.asarray(v)), np.asarray(x, np.float64), eps)
  np.testing.assert_allclose(np.asarray(tj.grad(scalar)(jnp.asarray(x))), numeric, rtol=rtol, atol=atol)
  np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(scalar))(jnp.asarray(x))), numeric, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------------------------------
# values against numpy

BATCHES = [(), (3,), (2, 3)]


@pytest.mark.parametrize("batch", BATCHES)
def test_square_functions_match_numpy(batch):
  a = _random(*batch, 5, 5)
  a64 = a.astype(np.float64)
  b = _random(*batch, 5, 2)
  np.testing.assert_allclose(np.asarray(jnp.linalg.inv(a)), np.linalg.inv(a64), rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(np.asarray(jnp.linalg.det(a)), np.linalg.det(a64), rtol=2e-5, atol=1e-5)
  sign, logdet = jnp.linalg.slogdet(a)
  want_sign, want_logdet = np.linalg.slogdet(a64)
  np.testing.assert_array_equal(np.asarray(sign), want_sign)
  np.testing.assert_allclose(np.asarray(logdet), want_logdet, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.linalg.solve(a, b)), np.linalg.solve(a64, b), rtol=2e-4, atol=2e-4)
  spd = _spd(*batch, n=5)
  factor = np.asarray(jnp.linalg.cholesky(spd))
  np.testing.assert_allclose(factor, np.linalg.cholesky(spd.astype(np.float64)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.linalg.cholesky(spd, upper=True)), np.swapaxes(factor, -1, -2))
  sym = _symmetric(*batch, n=5)
  values, vectors = jnp.linalg.eigh(sym)
  np.testing.assert_allclose(np.asarray(values), np.linalg.eigvalsh(sym.astype(np.float64)), rtol=1e-5, atol=1e-5)
  v = np.asarray(vectors, np.float64)
  np.testing.assert_allclose(v @ (np.asarray(values)[..., None] * np.swapaxes(v, -1, -2)), sym, atol=3e-5)
  np.testing.assert_allclose(np.swapaxes(v, -1, -2) @ v, np.broadcast_to(np.eye(5), v.shape), atol=2e-6)
  np.testing.assert_allclose(np.asarray(jnp.linalg.eigvalsh(sym)), np.asarray(values))
  np.testing.assert_allclose(np.asarray(jnp.linalg.cond(a)), np.linalg.cond(a64), rtol=1e-3)
  for p in (1, -1, np.inf, "fro", -2):
    np.testing.assert_allclose(np.asarray(jnp.linalg.cond(a, p)), np.linalg.cond(a64, p), rtol=1e-3)
  np.testing.assert_allclose(np.asarray(jnp.linalg.matrix_power(a, -3)), np.linalg.matrix_power(a64, -3),
                             rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (5, 5), (2, 6, 3), (2, 3, 6)])
def test_rectangular_functions_match_numpy(shape):
  a = _random(*shape)
  a64 = a.astype(np.float64)
  m, n = shape[-2:]
  k = min(m, n)
  for full in (True, False):
    u, s, vh = jnp.linalg.svd(a, full_matrices=full)
    want_u, want_s, want_vh = np.linalg.svd(a64, full_matrices=full)
    assert u.shape == want_u.shape and vh.shape == want_vh.shape
    np.testing.assert_allclose(np.asarray(s), want_s, rtol=1e-5, atol=1e-5)
    u, vh = np.asarray(u, np.float64), np.asarray(vh, np.float64)
    np.testing.assert_allclose((u[..., :, :k] * np.asarray(s)[..., None, :]) @ vh[..., :k, :], a64, atol=1e-5)
    np.testing.assert_allclose(np.swapaxes(u, -1, -2) @ u, np.broadcast_to(np.eye(u.shape[-1]), u.shape[:-2] +
                                                                           (u.shape[-1],) * 2), atol=2e-6)
  np.testing.assert_allclose(np.asarray(jnp.linalg.svdvals(a)), np.linalg.svd(a64, compute_uv=False), rtol=1e-5,
                             atol=1e-5)
  for mode in ("reduced", "complete"):
    q, r = jnp.linalg.qr(a, mode=mode)
    want_q, want_r = np.linalg.qr(a64, mode=mode)
    assert q.shape == want_q.shape and r.shape == want_r.shape
    q, r = np.asarray(q, np.float64), np.asarray(r, np.float64)
    np.testing.assert_allclose(q @ r, a64, atol=1e-5)
    np.testing.assert_array_equal(r, np.triu(r))
    np.testing.assert_allclose(np.abs(r), np.abs(want_r), atol=1e-5)  # unique up to the signs of its rows
  np.testing.assert_allclose(np.asarray(jnp.linalg.qr(a, mode="r")), np.asarray(jnp.linalg.qr(a).R))
  np.testing.assert_allclose(np.asarray(jnp.linalg.pinv(a)), np.linalg.pinv(a64), rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(np.asarray(jnp.linalg.matrix_rank(a)), np.linalg.matrix_rank(a64))
  for order in (2, -2, "nuc"):
    np.testing.assert_allclose(np.asarray(jnp.linalg.norm(a, order, axis=(-2, -1))),
                               np.linalg.norm(a64, order, axis=(-2, -1)), rtol=1e-5)


def test_lstsq_matches_numpy():
  for m, n in ((6, 3), (3, 6), (4, 4)):
    a, b = _random(m, n), _random(m, 2)
    x, residuals, rank, s = jnp.linalg.lstsq(a, b)
    want = np.linalg.lstsq(a.astype(np.float64), b.astype(np.float64), rcond=None)
    np.testing.assert_allclose(np.asarray(x), want[0], rtol=1e-4, atol=1e-4)
    assert int(rank) == want[2] and rank.dtype == np.int32
    np.testing.assert_allclose(np.asarray(s), want[3], rtol=1e-5)
    if m > n: np.testing.assert_allclose(np.asarray(residuals), want[1], rtol=1e-3)
    else: assert residuals.shape == (2,) and np.all(np.asarray(residuals) < 1e-8)  # JAX: always computed
    assert jnp.linalg.lstsq(a, b, numpy_resid=True)[1].shape == want[1].shape
  x, residuals, _, _ = jnp.linalg.lstsq(a, b[:, 0])
  assert x.shape == (n,) and residuals.shape == (1,)
  deficient = np.array([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]], np.float32)
  x, _, rank, _ = jnp.linalg.lstsq(deficient, np.array([1.0, 2.0, 3.0], np.float32))
  assert int(rank) == 1
  np.testing.assert_allclose(np.asarray(x), np.linalg.pinv(deficient.astype(np.float64)) @ [1, 2, 3], rtol=1e-5)


def test_other_functions_match_numpy():
  chain = [_random(3), _random(3, 5), _random(5, 2), _random(2, 7), _random(7)]
  np.testing.assert_allclose(np.asarray(jnp.linalg.multi_dot(chain)),
                             np.linalg.multi_dot([c.astype(np.float64) for c in chain]), rtol=1e-4)
  square = _random(6, 6).reshape(6, 2, 3)
  np.testing.assert_allclose(np.asarray(jnp.linalg.tensorinv(square, ind=1)),
                             np.linalg.tensorinv(square.astype(np.float64), ind=1), rtol=1e-3, atol=1e-3)
  a, b = _random(6, 2, 3), _random(6)
  np.testing.assert_allclose(np.asarray(jnp.linalg.tensorsolve(a, b)),
                             np.linalg.tensorsolve(a.astype(np.float64), b.astype(np.float64)), rtol=1e-3, atol=1e-3)
  batch_a, vector = _random(3, 4, 4), _random(4)
  np.testing.assert_allclose(np.asarray(jnp.linalg.solve(batch_a, vector)),
                             np.linalg.solve(batch_a.astype(np.float64), vector.astype(np.float64)), rtol=1e-3)
  np.testing.assert_allclose(np.asarray(jnp.linalg.solve(batch_a, _random(2, 1, 4, 3))).shape, (2, 3, 4, 3))
  integer = np.array([[2, 1], [1, 3]])
  assert jnp.linalg.inv(integer).dtype == np.float32 and jnp.linalg.det(integer).dtype == np.float32
  np.testing.assert_allclose(float(jnp.linalg.det(integer)), 5.0, rtol=1e-6)


def test_float64_under_x64(x64):
  a = _random(5, 5, dtype=np.float64)
  assert jnp.linalg.inv(a).dtype == np.float64
  np.testing.assert_allclose(np.asarray(jnp.linalg.inv(a)), np.linalg.inv(a), rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(jnp.linalg.svd(a, compute_uv=False)), np.linalg.svd(a, compute_uv=False),
                             rtol=1e-13)
  np.testing.assert_allclose(np.asarray(jnp.linalg.eigvalsh(a + a.T)), np.linalg.eigvalsh(a + a.T), rtol=1e-12,
                             atol=1e-12)


def test_identities():
  a, b = _random(4, 4).astype(np.float64) / 2, _random(4, 4).astype(np.float64) / 2
  np.testing.assert_allclose(float(jnp.linalg.det(a @ b)), float(jnp.linalg.det(a)) * float(jnp.linalg.det(b)),
                             rtol=1e-4)
  np.testing.assert_allclose(np.asarray(jnp.linalg.inv(a) @ a), np.eye(4), atol=1e-5)
  np.testing.assert_allclose(np.asarray(jsl.expm(a) @ jsl.expm(-a)), np.eye(4), atol=1e-5)
  tall = _random(5, 3).astype(np.float64)
  p = np.asarray(jnp.linalg.pinv(tall), np.float64)  # the Penrose conditions
  assert p.shape == (3, 5)
  np.testing.assert_allclose(tall @ p @ tall, tall, atol=1e-5)
  np.testing.assert_allclose(p @ tall @ p, p, atol=1e-5)
  np.testing.assert_allclose(tall @ p, (tall @ p).T, atol=1e-5)
  np.testing.assert_allclose(p @ tall, (p @ tall).T, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# gradients (float64, central differences)

def _sign_fixed(vectors):
  """Eigen/singular vectors with their first row made positive (they are unique only up to sign)."""
  return vectors * jnp.sign(vectors[..., :1, :])


def test_primitive_gradients(x64):
  spd, sym = _spd(n=4, dtype=np.float64), _symmetric(n=4, dtype=np.float64)
  _check_grad(lambda x: lax_linalg.cholesky(x), spd)
  _check_grad(lambda x: lax_linalg.eigh(x)[1], sym)
  _check_grad(lambda x: _sign_fixed(lax_linalg.eigh(x)[0]), sym)
  for shape in ((4, 4), (5, 3), (3, 5)):
    a = _random(*shape, dtype=np.float64)
    _check_grad(lambda x: lax_linalg.lu(x)[0], a)
    _check_grad(lambda x: lax_linalg.svd(x, compute_uv=False), a)
    _check_grad(lambda x: _sign_fixed(lax_linalg.svd(x, full_matrices=False)[0]), a)
    _check_grad(lambda x: lax_linalg.svd(x, full_matrices=False)[2] * jnp.sign(
      lax_linalg.svd(x, full_matrices=False)[0][..., :1, :]).mT, a)
    if shape[0] >= shape[1]:
      _check_grad(lambda x: jnp.concatenate([part.ravel() for part in lax_linalg.qr(x, full_matrices=False)]), a)
  triangle, rhs = np.tril(_random(4, 4, dtype=np.float64)) + 4 * np.eye(4), _random(4, 3, dtype=np.float64)
  for left_side in (True, False):
    for transpose_a in (True, False):
      for unit in (True, False):
        b = rhs if left_side else rhs.T
        params = dict(left_side=left_side, lower=True, transpose_a=transpose_a, unit_diagonal=unit)
        _check_grad(lambda x: lax_linalg.triangular_solve(x, b, **params), triangle)
        _check_grad(lambda x: lax_linalg.triangular_solve(triangle, x, **params), b)


def test_numpy_linalg_gradients(x64):
  a, b = _random(4, 4, dtype=np.float64), _random(4, 2, dtype=np.float64)
  _check_grad(jnp.linalg.inv, a)
  _check_grad(jnp.linalg.det, a)
  _check_grad(lambda x: jnp.linalg.slogdet(x).logabsdet, a)
  _check_grad(lambda x: jnp.linalg.solve(x, b), a)
  _check_grad(lambda x: jnp.linalg.solve(a, x), b)
  _check_grad(lambda x: jnp.linalg.solve(a, x), b[:, 0])
  _check_grad(jnp.linalg.pinv, _random(5, 3, dtype=np.float64))
  _check_grad(jnp.linalg.pinv, _random(3, 5, dtype=np.float64))
  _check_grad(lambda x: jnp.linalg.lstsq(x, b[:3].repeat(2, 0)[:5])[0], _random(5, 3, dtype=np.float64))
  _check_grad(lambda x: jnp.linalg.norm(x, 2), a)
  _check_grad(lambda x: jnp.linalg.norm(x, "nuc"), a)
  _check_grad(lambda x: jnp.linalg.eigvalsh(x), _symmetric(n=4, dtype=np.float64))
  _check_grad(lambda x: jnp.linalg.cholesky(x @ x.T + 4 * jnp.eye(4)), a)
  _check_grad(lambda x: jnp.linalg.matrix_power(x, -2), a + 3 * np.eye(4), rtol=1e-5)


def test_scipy_linalg_gradients(x64):
  a, b = _random(4, 4, dtype=np.float64) / 2, _random(4, 2, dtype=np.float64)
  _check_grad(jsl.expm, a, rtol=1e-5)
  _check_grad(jsl.expm, 4 * a, rtol=1e-5, atol=1e-6)  # with squarings
  _check_grad(lambda x: jsl.lu_solve(jsl.lu_factor(x), b), a)
  _check_grad(lambda x: jsl.lu_solve(jsl.lu_factor(x), b, trans=1), a)
  spd = _spd(n=4, dtype=np.float64)
  _check_grad(lambda x: jsl.cho_solve(jsl.cho_factor(x, lower=True), b), spd)
  _check_grad(lambda x: jsl.solve_triangular(x, b, lower=False, trans="T"), np.triu(a) + 3 * np.eye(4))
  _check_grad(lambda x: jsl.lu(x)[2], a)


def test_det_gradient_is_the_adjugate_also_when_singular(x64):
  a = _random(4, 4, dtype=np.float64)
  adjugate = np.linalg.det(a) * np.linalg.inv(a)
  np.testing.assert_allclose(np.asarray(tj.grad(jnp.linalg.det)(a)), adjugate.T, rtol=1e-10)
  singular = np.array([[1.0, 2.0], [2.0, 4.0]])  # rank 1 = n - 1: the gradient is the cofactor matrix
  np.testing.assert_allclose(np.asarray(tj.grad(jnp.linalg.det)(singular)), [[4.0, -2.0], [-2.0, 1.0]])
  rank_one_3 = np.outer([1.0, 2.0, 3.0], [1.0, -1.0, 2.0])  # rank 1 < n - 1: the adjugate is 0
  np.testing.assert_allclose(np.asarray(tj.grad(jnp.linalg.det)(rank_one_3)), np.zeros((3, 3)), atol=1e-12)
  rank_two = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 2.0]])
  cofactors = np.array([[1.0, 1.0, -1.0], [1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]])
  np.testing.assert_allclose(np.asarray(tj.grad(jnp.linalg.det)(rank_two)), cofactors, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# transformations composed

def test_vmap_jit_compositions():
  a = _random(5, 4, 4)
  b = _random(5, 4)
  solve_each = tj.vmap(jnp.linalg.solve)
  np.testing.assert_allclose(np.asarray(solve_each(a, b)), np.stack([np.linalg.solve(x, y) for x, y in
                                                                     zip(a.astype(np.float64), b)]), rtol=1e-3)
  np.testing.assert_allclose(np.asarray(tj.vmap(jnp.linalg.solve, in_axes=(None, 0))(a[0], b)),
                             np.linalg.solve(a[0].astype(np.float64), b.T).T, rtol=1e-3, atol=1e-4)
  grads = tj.jit(tj.vmap(tj.grad(jnp.linalg.det)))(a)
  want = np.stack([np.linalg.det(x) * np.linalg.inv(x).T for x in a.astype(np.float64)])
  np.testing.assert_allclose(np.asarray(grads), want, rtol=1e-3, atol=1e-4)
  svals = tj.vmap(tj.jit(lambda x: jnp.linalg.svd(x, compute_uv=False)), in_axes=2)(_random(3, 4, 6))
  assert svals.shape == (6, 3)
  sym = _symmetric(5, n=4)
  per_example = tj.vmap(tj.grad(lambda x: jnp.linalg.eigh(x).eigenvalues[-1]))(sym)
  for got, matrix in zip(np.asarray(per_example), sym.astype(np.float64)):
    top = np.linalg.eigh(matrix)[1][:, -1]
    np.testing.assert_allclose(got, np.outer(top, top), atol=1e-4)
  np.testing.assert_allclose(np.asarray(tj.grad(tj.jit(lambda x: jnp.linalg.slogdet(x)[1]))(a[0])),
                             np.linalg.inv(a[0].astype(np.float64)).T, rtol=1e-3, atol=1e-4)
  jacobian = tj.jacfwd(jnp.linalg.inv)(a[0])
  inverse = np.linalg.inv(a[0].astype(np.float64))
  np.testing.assert_allclose(np.asarray(jacobian), -np.einsum("ik,lj->ijkl", inverse, inverse), rtol=1e-3, atol=1e-3)
  hessian = tj.hessian(lambda x: jnp.linalg.slogdet(x)[1])(a[0])  # d2 log|det| = -(a^-T)_il (a^-T)_kj
  np.testing.assert_allclose(np.asarray(hessian), -np.einsum("li,jk->ijkl", inverse, inverse), rtol=1e-3, atol=1e-3)


def test_jit_runs_lapack_as_a_host_step(capsys, monkeypatch):
  from tinyjax.trace import callback
  a = _random(40, 40) + 10 * np.eye(40, dtype=np.float32)  # (beyond the compiled kernels' sizes: LAPACK)
  f = tj.jit(lambda x: jnp.linalg.inv(x) * 2 + 1)
  np.testing.assert_allclose(np.asarray(f(a)), np.linalg.inv(a.astype(np.float64)) * 2 + 1, rtol=1e-4, atol=1e-6)
  monkeypatch.setattr(callback, "DEBUG", 1)  # DEBUG=1 names each LAPACK call with its time
  np.testing.assert_allclose(np.asarray(f(a + 1)), np.linalg.inv(a.astype(np.float64) + 1) * 2 + 1, rtol=1e-4,
                             atol=1e-6)
  printed = capsys.readouterr().out
  assert "host call lu" in printed and printed.count("host call triangular_solve") == 2
  jaxpr = str(tj.make_jaxpr(jnp.linalg.inv)(a))
  assert " = lu a" in jaxpr and "= triangular_solve[left_side=True lower=True" in jaxpr


def test_jit_runs_small_matrices_in_compiled_kernels(monkeypatch, on_cpu):  # (the CPU runtime's launches)
  """A jitted program launches the small-matrix kernels (lax/_small_linalg.py) among its own, without calling into
  Python: LU, triangular solves and Cholesky inside a scan, their results as eagerly (where Python runs them)."""
  from tinyjax.lax import _lapack
  a = _spd(n=3)
  b = _random(8, 3)

  def step(x, y):
    chol = jnp.linalg.cholesky(a + jnp.outer(x, x))
    return jnp.linalg.solve(chol @ chol.T + jnp.eye(3), y + x) * 0.5, jnp.linalg.slogdet(chol)[1]
  eager = [np.asarray(v) for v in tj.lax.scan(step, jnp.zeros(3), b)]
  program = tj.jit(lambda b: tj.lax.scan(step, jnp.zeros(3), b))
  for name in ("getrf", "trsm", "potrf"):  # (the Python routines are not called by the program)
    monkeypatch.setattr(_lapack, name, lambda *args, name=name, **kwargs: pytest.fail(f"{name} called in Python"))
  for got, want in zip(program(b), eager): np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  x, y = np.zeros(3), b.astype(np.float64)
  for t in range(8):  # (against float64 numpy too)
    chol = np.linalg.cholesky(a.astype(np.float64) + np.outer(x, x))
    x = np.linalg.solve(chol @ chol.T + np.eye(3), y[t] + x) * 0.5
  np.testing.assert_allclose(np.asarray(program(b)[0]), x, rtol=1e-5, atol=1e-6)


def test_scan_over_solves():
  a = _random(4, 4) + 4 * np.eye(4, dtype=np.float32)

  def step(x, _):
    x = jnp.linalg.solve(a, x)
    return x / jnp.linalg.norm(x), jnp.linalg.norm(x)
  x, norms = tj.lax.scan(step, jnp.ones(4), None, length=6)  # inverse iteration
  want = np.ones(4)
  for _ in range(6): want = np.linalg.solve(a.astype(np.float64), want); want /= np.linalg.norm(want)
  np.testing.assert_allclose(np.asarray(x), want, rtol=1e-4, atol=1e-5)
  assert norms.shape == (6,)


# ---------------------------------------------------------------------------------------------------------------------
# scipy.linalg

def test_scipy_linalg_matches_numpy():
  a, b = _random(5, 5), _random(5, 2)
  a64 = a.astype(np.float64)
  for shape in ((5, 3), (3, 5), (4, 4)):
    x = _random(*shape)
    p, lower, upper = jsl.lu(x)
    k = min(shape)
    assert lower.shape == (shape[0], k) and upper.shape == (k, shape[1]) and p.shape == (shape[0],) * 2
    np.testing.assert_allclose(np.asarray(p) @ np.asarray(lower) @ np.asarray(upper), x, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(lower), np.tril(np.asarray(lower)))
    permuted_lower, upper_2 = jsl.lu(x, permute_l=True)
    np.testing.assert_allclose(np.asarray(permuted_lower) @ np.asarray(upper_2), x, atol=1e-5)
  factors = jsl.lu_factor(a)
  np.testing.assert_allclose(np.asarray(jsl.lu_solve(factors, b)), np.linalg.solve(a64, b), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(jsl.lu_solve(factors, b[:, 0], trans=1)), np.linalg.solve(a64.T, b[:, 0]),
                             rtol=1e-4, atol=1e-4)
  permutation = lax_linalg.lu(a)[2]
  np.testing.assert_array_equal(np.asarray(lax_linalg.lu_pivots_to_permutation(factors[1], 5)),
                                np.asarray(permutation))
  triangle = np.tril(_random(2, 5, 5)) + 5 * np.eye(5, dtype=np.float32)
  for trans in (0, 1, "T"):
    op = np.swapaxes(triangle, -1, -2) if trans else triangle
    np.testing.assert_allclose(np.asarray(jsl.solve_triangular(triangle, np.stack([b, -b]), lower=True, trans=trans)),
                               np.linalg.solve(op.astype(np.float64), np.stack([b, -b])), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jsl.solve_triangular(triangle[0], b[:, 0], lower=True, trans=trans)),
                               np.linalg.solve(op[0].astype(np.float64), b[:, 0]), rtol=1e-5, atol=1e-6)
    vectors = jsl.solve_triangular(triangle, b.T, lower=True, trans=trans)  # b.ndim == a.ndim - 1: vectors (JAX)
    np.testing.assert_allclose(np.asarray(vectors), np.linalg.solve(op.astype(np.float64), b.T[..., None])[..., 0],
                               rtol=1e-5, atol=1e-6)
  unit = jsl.solve_triangular(triangle[0], b, lower=True, unit_diagonal=True)
  np.testing.assert_allclose(np.asarray(unit), np.linalg.solve(np.tril(triangle[0], -1) + np.eye(5), b), rtol=1e-5)
  spd = _spd(n=5)
  for lower in (True, False):
    np.testing.assert_allclose(np.asarray(jsl.cho_solve(jsl.cho_factor(spd, lower=lower), b)),
                               np.linalg.solve(spd.astype(np.float64), b), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(jsl.solve(np.tril(spd) if lower else np.triu(spd), b, assume_a="pos",
                                                    lower=lower)), np.linalg.solve(spd.astype(np.float64), b),
                               rtol=1e-4)
  np.testing.assert_allclose(np.asarray(jsl.cholesky(spd)), np.linalg.cholesky(spd.astype(np.float64)).T, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(jsl.det(a)), np.linalg.det(a64), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(jsl.inv(a)), np.linalg.inv(a64), rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(np.asarray(jsl.solve(a, b)), np.linalg.solve(a64, b), rtol=1e-3, atol=1e-4)
  sym = _symmetric(n=5)
  np.testing.assert_allclose(np.asarray(jsl.eigh(sym, eigvals_only=True)), np.linalg.eigvalsh(sym.astype(np.float64)),
                             rtol=1e-5, atol=1e-5)
  assert [x.shape for x in jsl.qr(_random(5, 3))] == [(5, 5), (5, 3)]
  assert [x.shape for x in jsl.qr(_random(5, 3), mode="economic")] == [(5, 3), (3, 3)]
  assert [x.shape for x in jsl.qr(_random(5, 3), mode="r")] == [(5, 3)]
  u, s, vh = jsl.svd(a)
  np.testing.assert_allclose((np.asarray(u) * np.asarray(s)) @ np.asarray(vh), a, atol=1e-5)
  blocks = jsl.block_diag(np.ones((2, 2)), 3.0, np.arange(3.0))
  want = np.zeros((4, 6))
  want[:2, :2], want[2, 2], want[3, 3:] = 1, 3, np.arange(3)
  np.testing.assert_array_equal(np.asarray(blocks), want)


def _expm_reference(a):
  """exp(a) in float64 by its Taylor series on a / 2^s, squared back s times."""
  squarings = max(0, int(np.ceil(np.log2(max(np.abs(a).sum(axis=0).max(), 1e-300)))) + 1)
  scaled = a / 2.0 ** squarings
  term, total = np.eye(len(a)), np.eye(len(a))
  for k in range(1, 40):
    term = term @ scaled / k
    total = total + term
  for _ in range(squarings): total = total @ total
  return total


@pytest.mark.parametrize("scale", [0.01, 1.0, 8.0, 40.0])
def test_expm_matches_series(scale):
  a = _random(5, 5).astype(np.float64) * scale / 5
  np.testing.assert_allclose(np.asarray(jsl.expm(a.astype(np.float32))), _expm_reference(a), rtol=5e-4,
                             atol=5e-5 * np.abs(_expm_reference(a)).max())
  nilpotent = np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]], np.float32) * scale
  exact = np.eye(3) + nilpotent + nilpotent @ nilpotent / 2
  np.testing.assert_allclose(np.asarray(jsl.expm(nilpotent)), exact, rtol=1e-5, atol=1e-5)
  batch = np.stack([a, -a]).astype(np.float32)
  np.testing.assert_allclose(np.asarray(jsl.expm(batch)), np.stack([_expm_reference(a), _expm_reference(-a)]),
                             rtol=5e-4, atol=5e-5 * np.abs(_expm_reference(a)).max())


def test_expm_of_symmetric_is_exp_of_eigenvalues(x64):
  sym = _symmetric(n=4, dtype=np.float64) / 2
  w, v = np.linalg.eigh(sym)
  np.testing.assert_allclose(np.asarray(tj.jit(jsl.expm)(sym)), (v * np.exp(w)) @ v.T, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# singular and bad input

def test_singular_input_gives_values_not_exceptions():
  singular = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
  inverse = np.asarray(jnp.linalg.inv(singular))
  assert not np.all(np.isfinite(inverse))
  assert float(jnp.linalg.det(singular)) == 0.0 and not np.signbit(float(jnp.linalg.det(singular)))
  sign, logdet = jnp.linalg.slogdet(singular)
  assert float(sign) == 0.0 and float(logdet) == -np.inf
  assert np.isinf(float(jnp.linalg.cond(singular, 1)))
  not_positive = np.array([[1.0, 2.0], [2.0, 1.0]], np.float32)
  factor = np.asarray(jnp.linalg.cholesky(not_positive))  # JAX: NaN in the lower triangle
  assert np.all(np.isnan(factor[np.tril_indices(2)])) and factor[0, 1] == 0
  assert np.all(np.isnan(np.asarray(tj.jit(jnp.linalg.cholesky)(np.stack([not_positive] * 2)))[:, 1, 0]))
  mixed = np.stack([_spd(n=2), not_positive])
  out = np.asarray(jnp.linalg.cholesky(mixed))
  assert np.all(np.isfinite(out[0])) and np.all(np.isnan(out[1][np.tril_indices(2)]))


def test_bad_input_raises_jax_errors():
  with pytest.raises(ValueError, match=r"shape \[\.\.\., n, n\], got \(2, 3\)"):
    jnp.linalg.inv(np.ones((2, 3)))
  with pytest.raises(ValueError, match="shape"):
    jnp.linalg.det(np.ones(3))
  with pytest.raises(ValueError, match="solve"):
    jnp.linalg.solve(np.eye(3), np.ones(4))
  with pytest.raises(ValueError, match="Invalid shapes for solve"):
    jnp.linalg.solve(np.ones((2, 3, 3)), np.ones((2, 3)))
  with pytest.raises(ValueError, match=r"cholesky must have shape \[\.\.\., n, n\], got \(2, 3\)"):
    jnp.linalg.cholesky(np.ones((2, 3)))
  with pytest.raises(ValueError, match=r"eigh must have shape \[\.\.\., n, n\]"):
    jnp.linalg.eigh(np.ones((2, 3)))
  with pytest.raises(TypeError, match="rank at least 2"):
    jnp.linalg.svd(np.ones(3))
  with pytest.raises(ValueError, match="mode"):
    jnp.linalg.qr(np.ones((3, 3)), mode="economic")
  with pytest.raises(NotImplementedError, match="float16"):
    jnp.linalg.inv(np.eye(2, dtype=np.float16))
  with pytest.raises(NotImplementedError, match="derivatives of eigenvectors"):
    tj.grad(lambda x: jnp.sum(jnp.abs(jnp.linalg.eig(x)[1])))(np.eye(2, dtype=np.float32))
  with pytest.raises(TypeError, match="floating-point"):
    lax_linalg.cholesky(np.eye(2, dtype=np.int32))
  with pytest.raises(ValueError, match="batch dimensions"):
    lax_linalg.triangular_solve(np.eye(2, dtype=np.float32), np.ones((3, 2, 2), np.float32))
  with pytest.raises(NotImplementedError, match="full matrices"):
    tj.grad(lambda x: jnp.sum(jnp.linalg.svd(x)[0]))(np.eye(3, dtype=np.float32))
  with pytest.raises(NotImplementedError, match="QR"):
    tj.grad(lambda x: jnp.sum(jnp.linalg.qr(x)[1]))(np.ones((2, 3), np.float32))
  with pytest.raises(ValueError, match="trans"):
    jsl.solve_triangular(np.eye(2), np.ones(2), trans=3)
  with pytest.raises(ValueError, match="must be square"):
    jnp.linalg.cond(np.ones((2, 3)), 1)


def test_lapack_library_is_named():
  from tinyjax.lax import _lapack
  library = _lapack.lapack()
  assert "dgetrf" in library.mangle.format("dgetrf") and library.int_type in (_lapack.ctypes.c_int32,
                                                                              _lapack.ctypes.c_int64)


def test_batched_small_matrices_agree_with_lapack_per_matrix():
  """Small matrices take the compiled kernels (lax/_small_linalg.py), a batch at once, and agree with LAPACK's calls
  per matrix (lax/_lapack.py `_getrf_each`, `_potrf_each`, `_trsm_each`); eigh goes to numpy's batched routine."""
  from tinyjax.lax import _lapack

  def each(routine, *arrays, **params):  # LAPACK, one matrix at a time
    return getattr(_lapack, f"_{routine}_each")(*(x[None] for x in arrays), **params)
  a = _random(6, 4, 4)
  a[1] = [[1, 2, 3, 4], [2, 4, 6, 8], [0, 1, 0, 1], [1, 0, 0, 0]]  # singular: a zero pivot on the way
  spd = _spd(6, n=4)
  spd[2] = [[1, 2, 0, 0], [2, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]  # not positive-definite
  assert _lapack._batched(a) and not _lapack._batched(a[0])
  for shape in ((6, 4, 4), (5, 3, 6), (2, 3, 6, 4), (4, 4)):  # square, wide and tall, two batch axes, one matrix
    matrices = a if shape == (6, 4, 4) else _random(*shape)
    factors, pivots, permutation = _lapack.getrf(matrices)
    assert factors.shape == shape and pivots.shape == (*shape[:-2], min(shape[-2:]))
    assert permutation.shape == shape[:-1]
    for index in np.ndindex(shape[:-2]):
      single_factors, single_pivots = each("getrf", matrices[index])
      np.testing.assert_allclose(factors[index], single_factors[0], rtol=1e-5, atol=1e-6)
      np.testing.assert_array_equal(pivots[index], single_pivots[0])
      np.testing.assert_array_equal(permutation[index], _lapack.permutation_of(single_pivots, shape[-2])[0])
  chol = _lapack.potrf(spd)
  for index in range(6):
    np.testing.assert_allclose(chol[index], each("potrf", spd[index])[0], rtol=1e-5, atol=1e-6)
  triangle, rhs = np.tril(a) + 4 * np.eye(4, dtype=np.float32), _random(6, 4, 3)
  for left_side in (True, False):
    for transpose_a in (True, False):
      b = rhs if left_side else np.ascontiguousarray(np.swapaxes(rhs, -1, -2))
      params = dict(left_side=left_side, lower=True, transpose_a=transpose_a, unit_diagonal=False)
      batch = _lapack.trsm(triangle, b, **params)
      for index in range(6):
        np.testing.assert_allclose(batch[index], each("trsm", triangle[index], b[index], **params)[0], rtol=1e-5)
  values, _ = _lapack.syevd(spd)
  np.testing.assert_allclose(values[0], _lapack.syevd(spd[0])[0], rtol=1e-5)
  with_nan = a.copy()
  with_nan[3, 0, 0] = np.nan  # numpy's gufunc raises for it: the per-matrix loop takes over, NaN for that one
  s = _lapack.gesdd(with_nan, full_matrices=False, compute_uv=False)[0]
  assert np.all(np.isnan(s[3])) and np.all(np.isfinite(s[[0, 1, 2, 4, 5]]))


def test_eig_of_general_real_matrices():
  a = _random(3, 5, 5)
  # +-i and a Jordan block
  a[1] = [[0, -1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 2, 0, 0], [0, 0, 0, 3, 1], [0, 0, 0, 0, 3]]
  values, vectors = jnp.linalg.eig(a)
  assert values.dtype == np.complex64 and vectors.dtype == np.complex64 and vectors.shape == (3, 5, 5)
  for index in range(3):
    want = np.linalg.eigvals(a[index].astype(np.float64))
    np.testing.assert_allclose(np.sort_complex(np.asarray(values[index])), np.sort_complex(want), rtol=1e-4,
                               atol=1e-3 if index == 1 else 1e-5)  # (the Jordan block's eigenvalue is ill-conditioned)
    v = np.asarray(vectors[index], np.complex128)
    if index != 1:
      np.testing.assert_allclose(a[index] @ v, v * np.asarray(values[index]), atol=1e-5)
      np.testing.assert_allclose(np.linalg.norm(v, axis=0), np.ones(5), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.linalg.eigvals(a)), np.asarray(values))
  np.testing.assert_allclose(np.asarray(tj.jit(jnp.linalg.eigvals)(a)), np.asarray(values))
  np.testing.assert_allclose(np.asarray(tj.vmap(jnp.linalg.eigvals)(a)), np.asarray(values))
  w, left, right = lax_linalg.eig(a[0])
  np.testing.assert_allclose(np.conj(np.asarray(left)).T @ a[0], np.conj(np.asarray(left)).T * np.asarray(w)[:, None],
                             atol=1e-5)
  with tj.config.override("jax_enable_x64", True):
    assert jnp.linalg.eigvals(a[0].astype(np.float64)).dtype == np.complex128


def test_complex_cholesky_and_triangular_solves():
  """JAX's autodiff cookbook differentiates through the Cholesky factor of a Hermitian matrix (values: JAX 0.10.2)."""
  a = np.array([[5.0, 2 + 3j, 5j], [2 - 3j, 7.0, 1 + 7j], [-5j, 1 - 7j, 12.0]], np.complex64)
  factor = np.asarray(jnp.linalg.cholesky(a))
  np.testing.assert_allclose(factor, np.linalg.cholesky(a.astype(np.complex128)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jnp.linalg.cholesky(a, upper=True)), np.conj(factor).T)

  def f(x):
    lower = jnp.linalg.cholesky(x)
    return jnp.sum((lower - jnp.sin(lower)) ** 2)
  want = np.array([[-0.7534186, -3.0509028 - 10.940544j, 5.9896846 + 3.5423026j],
                   [-3.0509028 + 10.940544j, -8.904491, -5.1351523 - 6.559373j],
                   [5.9896846 - 3.5423026j, -5.1351523 + 6.559373j, 0.01320427]], np.complex64)
  np.testing.assert_allclose(np.asarray(tj.grad(f, holomorphic=True)(a)), want, rtol=1e-5, atol=1e-5)
  b = (RNG.standard_normal((3, 2)) + 1j * RNG.standard_normal((3, 2))).astype(np.complex64)
  wide_factor = factor.astype(np.complex128)
  for trans, op in ((0, wide_factor), (1, wide_factor.T), (2, np.conj(wide_factor).T)):
    np.testing.assert_allclose(np.asarray(jsl.solve_triangular(factor, b, lower=True, trans=trans)),
                               np.linalg.solve(op, b), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jsl.cho_solve((factor, True), b)), np.linalg.solve(a.astype(np.complex128), b),
                             rtol=1e-4, atol=1e-5)
  conjugated = lax_linalg.triangular_solve(factor, b, left_side=True, lower=True, conjugate_a=True)
  np.testing.assert_allclose(np.asarray(conjugated), np.linalg.solve(np.conj(wide_factor), b), rtol=1e-5, atol=1e-6)
  with pytest.raises(NotImplementedError, match="derivatives of eigenvectors"):
    tj.grad(lambda x: jnp.sum(jnp.abs(jnp.linalg.eig(x)[1])))(a)


@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0), (0, 3, 3)])
def test_empty_matrices_and_empty_batches(shape):
  """Found by array-api-tests: 0 x 0 matrices and empty batches (numpy's results)."""
  x = np.zeros(shape, np.float32)
  for name in ("cholesky", "inv", "det", "pinv", "eigvalsh", "svdvals", "matrix_rank"):
    got, want = np.asarray(getattr(jnp.linalg, name)(x)), getattr(np.linalg, name)(x.astype(np.float64))
    assert got.shape == want.shape, name
    np.testing.assert_allclose(got, want, err_msg=name)
  assert jnp.linalg.eigh(x).eigenvectors.shape == shape and jnp.linalg.qr(x).Q.shape == shape
  assert jnp.linalg.solve(x, x).shape == shape and jnp.linalg.slogdet(x).sign.shape == shape[:-2]


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5)])
def test_complex_svd_and_pinv(shape, x64):
  a = RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)
  u, s, vh = jnp.linalg.svd(a, full_matrices=False)
  assert s.dtype == np.float64 and u.dtype == np.complex128
  np.testing.assert_allclose((np.asarray(u) * np.asarray(s)) @ np.asarray(vh), a, atol=1e-12)
  np.testing.assert_allclose(np.asarray(s), np.linalg.svd(a, compute_uv=False), rtol=1e-12)
  np.testing.assert_allclose(np.asarray(jnp.linalg.pinv(a)), np.linalg.pinv(a), rtol=1e-10, atol=1e-12)
  weights = RNG.standard_normal(min(shape))
  nuclear = lambda x: jnp.sum(jnp.linalg.svd(x, compute_uv=False) * weights)  # noqa: E731
  np.testing.assert_allclose(np.asarray(tj.grad(nuclear)(a)),
                             numeric_grad_complex(lambda z: np.sum(np.linalg.svd(z, compute_uv=False) * weights), a),
                             rtol=1e-6, atol=1e-7)
  column_weights = RNG.standard_normal((shape[0], min(shape)))
  def on_u(x):  # |U_ij|^2 does not depend on the columns' free phases
    return jnp.sum(jnp.abs(jnp.linalg.svd(x, full_matrices=False)[0]) ** 2 * column_weights)
  host_u = lambda z: np.sum(np.abs(np.linalg.svd(z, full_matrices=False)[0]) ** 2 * column_weights)  # noqa: E731
  np.testing.assert_allclose(np.asarray(tj.grad(on_u)(a)), numeric_grad_complex(host_u, a), rtol=1e-5, atol=1e-6)
  target = RNG.standard_normal(shape[::-1]) + 1j * RNG.standard_normal(shape[::-1])
  on_pinv = lambda x: jnp.real(jnp.sum(jnp.linalg.pinv(x) * target))  # noqa: E731
  np.testing.assert_allclose(np.asarray(tj.grad(on_pinv)(a)),
                             numeric_grad_complex(lambda z: np.real(np.sum(np.linalg.pinv(z) * target)), a), rtol=1e-6,
                             atol=1e-7)


def test_complex_lu_solve_inv_det_slogdet(x64):
  a = RNG.standard_normal((3, 4, 4)) + 1j * RNG.standard_normal((3, 4, 4))
  b = RNG.standard_normal((3, 4, 2)) + 1j * RNG.standard_normal((3, 4, 2))
  np.testing.assert_allclose(np.asarray(jnp.linalg.solve(a, b)), np.linalg.solve(a, b), rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(jnp.linalg.inv(a)), np.linalg.inv(a), rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(jnp.linalg.det(a)), np.linalg.det(a), rtol=1e-12)
  sign, logabsdet = jnp.linalg.slogdet(a)
  want_sign, want_log = np.linalg.slogdet(a)
  assert logabsdet.dtype == np.float64 and sign.dtype == np.complex128
  np.testing.assert_allclose(np.asarray(sign), want_sign, rtol=1e-12)
  np.testing.assert_allclose(np.asarray(logabsdet), want_log, rtol=1e-12)
  p, lower, upper = jsl.lu(a[0])
  np.testing.assert_allclose(np.asarray(p) @ np.asarray(lower) @ np.asarray(upper), a[0], atol=1e-12)
  np.testing.assert_allclose(np.asarray(tj.grad(jnp.linalg.det, holomorphic=True)(a[0])),
                             (np.linalg.det(a[0]) * np.linalg.inv(a[0])).T, rtol=1e-10)
  for fn, host in ((lambda x: jnp.linalg.slogdet(x)[1], lambda z: np.linalg.slogdet(z)[1]),
                   (lambda x: jnp.real(jnp.linalg.slogdet(x)[0]), lambda z: np.real(np.linalg.slogdet(z)[0])),
                   (lambda x: jnp.real(jnp.sum(jnp.linalg.inv(x))), lambda z: np.real(np.sum(np.linalg.inv(z)))),
                   (lambda x: jnp.abs(jnp.linalg.det(x)), lambda z: np.abs(np.linalg.det(z))),
                   (lambda x: jnp.real(jnp.sum(jnp.linalg.solve(x, b[0]))),
                    lambda z: np.real(np.sum(np.linalg.solve(z, b[0]))))):
    np.testing.assert_allclose(np.asarray(tj.grad(fn)(a[0])), numeric_grad_complex(host, a[0]), rtol=1e-6, atol=1e-7)


def test_complex_hermitian_eigh(x64):
  m = RNG.standard_normal((3, 4, 4)) + 1j * RNG.standard_normal((3, 4, 4))
  h = m + np.conj(np.swapaxes(m, -1, -2))
  values, vectors = jnp.linalg.eigh(h)
  assert values.dtype == np.float64 and vectors.dtype == np.complex128
  np.testing.assert_allclose(np.asarray(values), np.linalg.eigvalsh(h), rtol=1e-12, atol=1e-12)
  v = np.asarray(vectors)
  np.testing.assert_allclose(v @ (np.asarray(values)[..., None] * np.conj(np.swapaxes(v, -1, -2))), h, atol=1e-12)
  for uplo, triangle in (("L", np.tril(h[0])), ("U", np.triu(h[0]))):
    w, u = jnp.linalg.eigh(triangle, UPLO=uplo, symmetrize_input=False)
    np.testing.assert_allclose(np.asarray(w), np.linalg.eigvalsh(h[0]), rtol=1e-12, atol=1e-12)
    u = np.asarray(u)
    np.testing.assert_allclose(u @ (np.asarray(w)[:, None] * np.conj(u).T), h[0], atol=1e-12)
  weights, column_weights = RNG.standard_normal(4), RNG.standard_normal((4, 4))
  hermitian = lambda z: (z + np.conj(z.T)) / 2  # noqa: E731 (what symmetrize_input reads)
  np.testing.assert_allclose(
    np.asarray(tj.grad(lambda x: jnp.sum(jnp.linalg.eigvalsh(x) * weights))(h[0])),
    numeric_grad_complex(lambda z: np.sum(np.linalg.eigvalsh(hermitian(z)) * weights), h[0]), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(
    np.asarray(tj.grad(lambda x: jnp.sum(jnp.abs(jnp.linalg.eigh(x)[1]) ** 2 * column_weights))(h[0])),
    numeric_grad_complex(lambda z: np.sum(np.abs(np.linalg.eigh(hermitian(z))[1]) ** 2 * column_weights), h[0]),
    rtol=1e-6, atol=1e-7)


def test_complex_qr_eig_lstsq_norms(x64):
  for shape in ((4, 4), (5, 3), (3, 5)):
    a = RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)
    for mode in ("reduced", "complete"):
      q, r = (np.asarray(part) for part in jnp.linalg.qr(a, mode=mode))
      np.testing.assert_allclose(q @ r, a, atol=1e-12)
      np.testing.assert_allclose(np.conj(q).T @ q, np.eye(q.shape[1]), atol=1e-12)
      np.testing.assert_array_equal(r, np.triu(r))
  tall = RNG.standard_normal((5, 3)) + 1j * RNG.standard_normal((5, 3))
  weights_r, weights_q = RNG.standard_normal((3, 3)), RNG.standard_normal((5, 3))
  np.testing.assert_allclose(  # |R_ij|^2 and |Q_ij|^2 do not depend on the free phases
    np.asarray(tj.grad(lambda x: jnp.sum(jnp.abs(jnp.linalg.qr(x)[1]) ** 2 * weights_r))(tall)),
    numeric_grad_complex(lambda z: np.sum(np.abs(np.linalg.qr(z)[1]) ** 2 * weights_r), tall), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(
    np.asarray(tj.grad(lambda x: jnp.sum(jnp.abs(jnp.linalg.qr(x)[0]) ** 2 * weights_q))(tall)),
    numeric_grad_complex(lambda z: np.sum(np.abs(np.linalg.qr(z)[0]) ** 2 * weights_q), tall), rtol=1e-6, atol=1e-7)
  square = RNG.standard_normal((2, 4, 4)) + 1j * RNG.standard_normal((2, 4, 4))
  values, vectors = (np.asarray(part) for part in jnp.linalg.eig(square))
  np.testing.assert_allclose(square @ vectors, vectors * values[..., None, :], atol=1e-12)
  for index in range(2):
    np.testing.assert_allclose(np.sort_complex(values[index]), np.sort_complex(np.linalg.eigvals(square[index])),
                               atol=1e-12)
  b = RNG.standard_normal((5, 2)) + 1j * RNG.standard_normal((5, 2))
  x, residuals, rank, s = jnp.linalg.lstsq(tall, b)
  want = np.linalg.lstsq(tall, b, rcond=None)
  np.testing.assert_allclose(np.asarray(x), want[0], atol=1e-12)
  np.testing.assert_allclose(np.asarray(residuals), want[1], rtol=1e-10)
  assert int(rank) == 3 and s.dtype == np.float64 and residuals.dtype == np.float64
  for order in (None, "fro", 2, -2, "nuc", 1, -1, np.inf):
    np.testing.assert_allclose(float(jnp.linalg.norm(tall, order)), np.linalg.norm(tall, order), rtol=1e-12)
  for order in (None, 1, 3, np.inf, -np.inf, 0):
    np.testing.assert_allclose(float(jnp.linalg.norm(tall[:, 0], order)), np.linalg.norm(tall[:, 0], order),
                               rtol=1e-12)
  assert int(jnp.linalg.matrix_rank(tall)) == 3
  np.testing.assert_allclose(float(jnp.linalg.cond(square[0])), np.linalg.cond(square[0]), rtol=1e-10)


def test_eigenvalue_derivatives(x64):
  """w' = diag(V^-1 a' V), as JAX (eigenvalues only), against finite differences of real and complex matrices."""
  a = RNG.standard_normal((4, 4))
  host = lambda x: np.sum(np.abs(np.linalg.eigvals(x)) ** 2)  # noqa: E731 (no dependence on the eigenvalues' order)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda x: jnp.sum(jnp.abs(jnp.linalg.eigvals(x)) ** 2))(a)),
                             numeric_grad(host, a, 1e-6), rtol=1e-6, atol=1e-7)
  c = RNG.standard_normal((4, 4)) + 1j * RNG.standard_normal((4, 4))
  np.testing.assert_allclose(
    np.asarray(tj.grad(lambda x: jnp.sum(jnp.abs(jnp.linalg.eigvals(x)) ** 2))(c)), numeric_grad_complex(host, c),
    rtol=1e-6, atol=1e-7)
  direction = RNG.standard_normal((4, 4)) + 1j * RNG.standard_normal((4, 4))
  values, tangent = (np.asarray(part) for part in tj.jvp(jnp.linalg.eigvals, (c,), (direction,)))
  step = 1e-7
  plus, minus = np.linalg.eigvals(c + step * direction), np.linalg.eigvals(c - step * direction)
  for value, derivative in zip(values, tangent):  # each eigenvalue paired with its nearest perturbed ones
    moved = (plus[np.argmin(np.abs(plus - value))] - minus[np.argmin(np.abs(minus - value))]) / (2 * step)
    np.testing.assert_allclose(derivative, moved, rtol=1e-5, atol=1e-6)


def test_lu_permutation_for_few_and_many_matrices():
  """The permutation of LAPACK's row swaps is built in Python lists for a few matrices and as numpy steps over all of
  them for many (linalg.FEW_PERMUTATIONS): the same permutations either way, each a permutation with P a = L U, and
  `lu_pivots_to_permutation` of random swaps against swaps applied one by one."""
  from tinyjax.lax import _lapack
  rng = np.random.default_rng(3)
  for batch in (1, 3, _lapack.FEW_PERMUTATIONS + 5):
    a = rng.standard_normal((batch, 6, 6)).astype(np.float32)
    factors, pivots, permutation = (np.asarray(v) for v in lax_linalg.lu(jnp.asarray(a)))
    for m in range(batch):
      assert sorted(permutation[m]) == list(range(6))
      lower, upper = np.tril(factors[m], -1) + np.eye(6), np.triu(factors[m])
      np.testing.assert_allclose(a[m][permutation[m]], lower @ upper, atol=1e-5)
  for batch in (2, _lapack.FEW_PERMUTATIONS + 1):
    swaps = np.stack([rng.integers(i, 7, batch) for i in range(5)], axis=-1).astype(np.int32)  # (batch, 5) into 7
    got = np.asarray(lax_linalg.lu_pivots_to_permutation(jnp.asarray(swaps), 7))
    for m in range(batch):
      expected = list(range(7))
      for i, target in enumerate(swaps[m]): expected[i], expected[target] = expected[target], expected[i]
      np.testing.assert_array_equal(got[m], expected)


def test_svd_based_functions_run_eagerly_as_jitted_programs():
  """pinv, cond and matrix_rank (an SVD and a tolerance held as host data) run an eager call on an array as a jitted
  program (trace/jit.py `jitted_eagerly`): computed at once, the same values as the function run op by op and as
  numpy, keyword-only arguments included, and the same program for a second matrix of the shape."""
  from tinyjax.lower.realize import counters
  from tinyjax.uop import Ops
  rng = np.random.default_rng(14)
  host = rng.standard_normal((6, 4)).astype(np.float32)
  square = rng.standard_normal((5, 5)).astype(np.float32)
  cases = [(jnp.linalg.pinv, (host,), {}, np.linalg.pinv(host.astype(np.float64))),
           (jnp.linalg.pinv, (host,), {"rcond": 0.5}, np.linalg.pinv(host.astype(np.float64), rcond=0.5)),
           (jnp.linalg.cond, (square,), {}, np.linalg.cond(square.astype(np.float64))),
           (jnp.linalg.cond, (square, "fro"), {}, np.linalg.cond(square.astype(np.float64), "fro")),
           (jnp.linalg.matrix_rank, (host @ host.T,), {}, 4),
           (jnp.linalg.matrix_rank, (host,), {"tol": 1e9}, 0)]
  for fn, (matrix, *rest), kwargs, want in cases:
    out = fn(jnp.asarray(matrix), *rest, **kwargs)
    assert out.uop.op is Ops.BUFFER, fn.__name__
    np.testing.assert_array_equal(np.asarray(out), np.asarray(fn.__wrapped__(jnp.asarray(matrix), *rest, **kwargs)))
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2e-4, atol=2e-5)
  lowered = counters.schedules_lowered
  other = rng.standard_normal((6, 4)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(jnp.linalg.pinv(jnp.asarray(other))), np.linalg.pinv(other.astype(np.float64)),
                             rtol=2e-4, atol=2e-5)
  assert counters.schedules_lowered == lowered
  with pytest.raises(TypeError):
    jnp.linalg.pinv(jnp.asarray(host), bogus=1)


# ---------------------------------------------------------------------------------------------------------------------
# the compiled kernels for batches of small matrices (lax/_small_linalg.py)

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7, 1, 1), (5, 3, 3), (9, 16, 16), (6, 32, 32), (5, 7, 4), (6, 3, 9)])
def test_small_lu_kernel_factors_against_float64(dtype, shape):
  """P a = L U to the precision's rounding, the pivots LAPACK's (per matrix), a batch not a whole number of the
  kernel's lanes, tall and wide matrices."""
  from tinyjax.lax import _lapack, _small_linalg
  a = _random(*shape, dtype=dtype)
  factors, pivots, permutation = _small_linalg.getrf(a)
  m, n = shape[-2:]
  k = min(m, n)
  tolerance = 2e-5 if dtype == np.float32 else 1e-13
  for index in range(shape[0]):
    lower = np.tril(factors[index], -1)[:, :k].astype(np.float64) + np.eye(m, k)
    upper = np.triu(factors[index])[:k, :].astype(np.float64)
    np.testing.assert_allclose(lower @ upper, a[index][permutation[index]].astype(np.float64), atol=tolerance * n)
    assert np.abs(lower).max() <= 1  # partial pivoting: every multiplier at most 1
    lapack_factors, lapack_pivots = _lapack._getrf_each(a[index:index + 1])
    np.testing.assert_array_equal(pivots[index], lapack_pivots[0])
    np.testing.assert_allclose(factors[index], lapack_factors[0], rtol=tolerance * 10, atol=tolerance * n)


def test_small_lu_kernel_singular_ties_subnormal_and_nan():
  """Zero columns keep their zero pivot (no swap, no division), ties pick the first row, subnormal values read as
  zero (kernels run with subnormals flushed, as JAX's CPU programs: its LU of this matrix is the same), and a NaN
  stays in its own matrix."""
  from tinyjax.lax import _lapack, _small_linalg
  a = np.zeros((6, 4, 4), np.float32)
  a[0] = [[0, 1, 2, 3], [0, 4, 5, 6], [0, 7, 8, 10], [0, 1, 1, 1]]  # first column zero
  a[1] = [[1, 2, 0, 0], [-1, 0, 3, 0], [1, 0, 0, 4], [-1, 5, 0, 0]]  # |1| four times: row 0 stays
  a[2] = np.eye(4) * 1e-39  # subnormal pivots
  a[2, 1, 0] = 3e-39
  a[3] = _random(4, 4)
  a[3, 2, 1] = np.nan
  a[4] = _random(4, 4)
  a[5] = np.ones((4, 4))  # rank one
  factors, pivots, _ = _small_linalg.getrf(a)
  for index in (0, 1, 4, 5):
    lapack_factors, lapack_pivots = _lapack._getrf_each(a[index:index + 1])
    np.testing.assert_array_equal(pivots[index], lapack_pivots[0])
    np.testing.assert_allclose(factors[index], lapack_factors[0], rtol=1e-6, atol=1e-6)
  assert pivots[0, 0] == 0 and np.all(factors[0, :, 0] == 0)
  assert pivots[1, 0] == 0
  np.testing.assert_array_equal(pivots[2], [0, 1, 2, 3])  # (JAX 0.10.2: the same pivots and factors)
  np.testing.assert_array_equal(factors[2, :, 0], a[2, :, 0])  # (unscaled: the pivot read as zero)
  assert np.isnan(factors[3]).any() and np.isfinite(factors[4]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose_a", [True, False])
@pytest.mark.parametrize("unit_diagonal", [True, False])
@pytest.mark.parametrize("nrhs", [5, 13])
def test_small_triangular_solve_kernel_against_float64(dtype, left_side, lower, transpose_a, unit_diagonal, nrhs):
  """Both ways of the kernel: a few right-hand sides column by column, many (lax/_small_linalg.py WIDE_RHS) along
  the rows of x, whole vectors and then the rest."""
  from tinyjax.lax import _lapack
  k = 11
  a = _random(9, k, k, dtype=dtype) + 3 * np.eye(k, dtype=dtype)
  b = _random(9, k, nrhs, dtype=dtype) if left_side else _random(9, nrhs, k, dtype=dtype)
  x = _lapack.trsm(a, b, left_side=left_side, lower=lower, transpose_a=transpose_a, unit_diagonal=unit_diagonal)
  triangle = np.tril(a) if lower else np.triu(a)
  if unit_diagonal: triangle[:, np.arange(k), np.arange(k)] = 1
  op = np.swapaxes(triangle, -1, -2) if transpose_a else triangle
  op64, b64 = op.astype(np.float64), b.astype(np.float64)
  want = np.linalg.solve(op64, b64) if left_side else np.swapaxes(
      np.linalg.solve(np.swapaxes(op64, -1, -2), np.swapaxes(b64, -1, -2)), -1, -2)
  np.testing.assert_allclose(x, want, rtol=2e-4 if dtype == np.float32 else 1e-11,
                             atol=2e-5 if dtype == np.float32 else 1e-12)


def test_small_triangular_solve_kernel_rows_and_columns_agree_bit_for_bit():
  """Solved along the rows of x (many right-hand sides) or column by column (one at a time), each element takes the
  same operations in the same order: the same bits."""
  from tinyjax.lax import _small_linalg
  a = _random(6, 20, 20) + 4 * np.eye(20, dtype=np.float32)
  b = _random(6, 20, 21)
  for lower in (True, False):
    for transpose in (True, False):
      params = dict(left_side=True, lower=lower, transpose_a=transpose, unit_diagonal=False)
      together = _small_linalg.trsm(a, b, **params)
      apart = np.concatenate([_small_linalg.trsm(a, b[..., c:c + 1], **params) for c in range(21)], axis=-1)
      np.testing.assert_array_equal(together, apart)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_cholesky_kernel_against_float64_and_failures_stay_in_their_matrix(dtype):
  """Matrices that are not positive-definite (an indefinite one, a NaN) give NaN on and below the diagonal and zeros
  above, as JAX; their neighbours in the kernel's lanes are untouched."""
  for n in (1, 5, 20, 32):
    spd = _spd(10, n=n, dtype=dtype)
    spd[3] = -spd[3]
    spd[6, n - 1, n - 1] = np.nan
    with tj.config.override("jax_enable_x64", dtype == np.float64):
      got = np.asarray(jnp.linalg.cholesky(jnp.asarray(spd)))
    assert got.dtype == dtype
    for index in range(10):
      if index in (3, 6):
        assert np.isnan(got[index][np.tril_indices(n)]).all() and (np.triu(got[index], 1) == 0).all()
        continue
      want = np.linalg.cholesky(spd[index].astype(np.float64))
      np.testing.assert_allclose(got[index], want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                 atol=1e-5 if dtype == np.float32 else 1e-12)


def test_small_kernels_compile_once_for_every_batch():
  """The kernels are compiled for a matrix size and launched over any number of matrices: one program per routine,
  dtype and size, whatever the batch (eager calls and programs share it)."""
  from tinyjax.devices import cpu
  for batch in (2, 5, 13, 24):
    np.asarray(tj.vmap(jnp.linalg.solve)(jnp.asarray(_spd(batch, n=7)), jnp.asarray(_random(batch, 7))))
    np.asarray(tj.jit(jnp.linalg.cholesky)(jnp.asarray(_spd(batch, n=7))))
  names = [program.name for program in cpu._programs.values() if program.name.startswith("tj_")]
  assert names.count("tj_getrf_f32_7_7") == 1 and names.count("tj_potrf_f32_7") == 1


def test_vmapped_solve_and_cholesky_gradients_compose_with_jit():
  """jit(vmap(grad)) and vmap(jit(grad)) of solve and Cholesky over a batch of 20x20 systems (compiled kernels on the
  forward and the transposed solves) against central differences in float64."""
  a, b = _spd(5, n=20, dtype=np.float64), _random(5, 20, dtype=np.float64)
  with tj.config.override("jax_enable_x64", True):
    def loss(a, b): return jnp.sum(jnp.linalg.solve(a, b) ** 2) + jnp.sum(jnp.sin(jnp.linalg.cholesky(a)))
    for transformed in (tj.jit(tj.vmap(tj.grad(loss))), tj.vmap(tj.jit(tj.grad(loss)))):
      got = np.asarray(transformed(jnp.asarray(a), jnp.asarray(b)))
      for index in (0, 4):
        want = numeric_grad(lambda m: float(loss(jnp.asarray(m), jnp.asarray(b[index]))), a[index].copy(), 1e-6)
        np.testing.assert_allclose(got[index], want, rtol=1e-6, atol=1e-7)
