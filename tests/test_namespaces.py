"""The rest of the numeric surface and the namespaces JAX code imports: jnp additions (split, rot90, meshgrid,
diagonal, trace, isclose, norm, nan-reductions, where=, correction=, clip names), tinyjax.scipy (special, stats,
linalg), nn activations and initializers, test_util.check_grads, typeof, jacobian and lax.Precision; against numpy
and math references, finite differences and JAX's values."""
import math

import numpy as np
import pytest

import tinyjax as jax
import tinyjax.numpy as jnp
from tinyjax.test_util import check_grads

RNG = np.random.default_rng(2)
X = np.arange(24.0, dtype=np.float32).reshape(4, 6)


def test_import_tinyjax_as_jax_gives_the_namespaces():
  assert float(jax.scipy.special.logsumexp(jnp.zeros(4))) == pytest.approx(math.log(4))
  assert jax.nn.initializers.zeros(None, (2,)).shape == (2,)
  assert float(jax.random.uniform(jax.random.PRNGKey(0))) >= 0


def test_split_rotate_grid_diagonal():
  for got, want in [(jnp.split(X, 3, axis=1), np.split(X, 3, axis=1)), (jnp.array_split(X, 4, axis=1),
                    np.array_split(X, 4, axis=1)), (jnp.split(X, [1, 3]), np.split(X, [1, 3])),
                    (jnp.hsplit(X, 2), np.hsplit(X, 2)), (jnp.vsplit(X, 2), np.vsplit(X, 2))]:
    assert len(got) == len(want) and all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want))
  with pytest.raises(ValueError, match="equal division"):
    jnp.split(X, 5, axis=1)
  for k in range(-2, 5): np.testing.assert_array_equal(np.asarray(jnp.rot90(X, k)), np.rot90(X, k))
  for indexing in ("xy", "ij"):
    for sparse in (False, True):
      got = jnp.meshgrid(np.arange(3), np.arange(4), np.arange(2), indexing=indexing, sparse=sparse)
      want = np.meshgrid(np.arange(3), np.arange(4), np.arange(2), indexing=indexing, sparse=sparse)
      assert all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want))
  np.testing.assert_array_equal(np.asarray(jnp.indices((2, 3))), np.indices((2, 3)))
  for k in (-2, 0, 1, 3, 7):
    np.testing.assert_array_equal(np.asarray(jnp.diagonal(X, k)), np.diagonal(X, k))
    np.testing.assert_array_equal(np.asarray(jnp.diag(np.arange(3.0), k)), np.diag(np.arange(3.0), k))
    assert float(jnp.trace(X, k)) == np.trace(X, k)
  cube = np.arange(60.0).reshape(3, 4, 5)
  np.testing.assert_array_equal(np.asarray(jnp.diagonal(cube, 1, 2, 0)), np.diagonal(cube, 1, 2, 0))
  np.testing.assert_array_equal(np.asarray(jnp.kron(np.eye(2), X[:2, :2])), np.kron(np.eye(2), X[:2, :2]))
  grad = jax.grad(lambda m: jnp.trace(m @ m))(jnp.asarray(X[:3, :3]))
  np.testing.assert_allclose(np.asarray(grad), 2 * X[:3, :3].T)


def test_comparisons_norms_and_reductions():
  a = np.array([1.0, np.inf, np.nan, 1e-9, -np.inf], np.float32)
  b = np.array([1 + 1e-6, np.inf, np.nan, 0.0, np.inf], np.float32)
  np.testing.assert_array_equal(np.asarray(jnp.isclose(a, b)), np.isclose(a, b))
  np.testing.assert_array_equal(np.asarray(jnp.isclose(a, b, equal_nan=True)), np.isclose(a, b, equal_nan=True))
  assert bool(jnp.allclose(1.0, 1.0 + 1e-7)) and not bool(jnp.array_equal(X, X[:2]))
  v = np.arange(-3.0, 4.0, dtype=np.float32)
  for order in (None, 1, 2, np.inf, -np.inf, 0, 3):
    np.testing.assert_allclose(np.asarray(jnp.linalg.norm(v, order)), np.linalg.norm(v, order), rtol=1e-6)
  for order in (None, "fro", 1, -1, np.inf, -np.inf):
    np.testing.assert_allclose(np.asarray(jnp.linalg.norm(X, order)), np.linalg.norm(X, order), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jnp.linalg.norm(X, axis=1, keepdims=True)),
                             np.linalg.norm(X, axis=1, keepdims=True), rtol=1e-6)
  for order in (2, -2, "nuc"):  # by the singular values (LAPACK)
    np.testing.assert_allclose(np.asarray(jnp.linalg.norm(X, order)), np.linalg.norm(X.astype(np.float64), order),
                               rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="Invalid norm order"):
    jnp.linalg.norm(X, 3)
  host = RNG.standard_normal((3, 5)).astype(np.float32)
  host[0, 1] = host[1, :] = np.nan
  for name in ("nansum", "nanprod", "nanmax", "nanmin", "nanmean", "nanvar", "nanstd", "nanargmax", "nanargmin"):
    with np.errstate(all="ignore"), pytest.warns() if name in ("nanmean", "nanvar", "nanstd", "nanmax",
                                                                 "nanmin") else _no_warning():
      if name in ("nanargmax", "nanargmin"):
        want = np.array([getattr(np, name)(row) if not np.isnan(row).all() else -1 for row in host])
      else:
        want = getattr(np, name)(host.astype(np.float64), axis=1)
    np.testing.assert_allclose(np.asarray(getattr(jnp, name)(host, axis=1)), want, rtol=1e-5, atol=1e-6,
                               equal_nan=True)
  mask = np.arange(5) > 1
  assert float(jnp.sum(jnp.arange(5.0), where=mask)) == 9.0
  assert float(jnp.mean(jnp.arange(5.0), where=mask)) == 3.0
  assert float(jnp.max(jnp.arange(5.0), where=mask, initial=-1.0)) == 4.0
  with pytest.raises(ValueError, match="initial"):
    jnp.max(jnp.arange(5.0), where=mask)
  np.testing.assert_allclose(float(jnp.var(X, correction=1)), np.var(X, ddof=1), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jnp.std(X, axis=0, ddof=1)), np.std(X, axis=0, ddof=1), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(jnp.count_nonzero(np.array([[0, 1], [2, 0]]), axis=0)), [1, 1])
  np.testing.assert_array_equal(np.asarray(jnp.clip(jnp.arange(5), min=1, max=3)), [1, 1, 2, 3, 3])
  np.testing.assert_array_equal(np.asarray(jnp.clip(jnp.arange(5), a_max=2)), [0, 1, 2, 2, 2])


class _no_warning:
  def __enter__(self): return self
  def __exit__(self, *args): return False


def test_scipy_special():
  from tinyjax.scipy import special
  x = np.array([0.1, 0.5, 1.0, 2.5, 7.0, 30.0, -0.5, -2.5, 1e-3, 100.0], np.float32)
  np.testing.assert_allclose(np.asarray(special.gammaln(x)), [math.lgamma(float(v)) for v in x], rtol=1e-6,
                             atol=1e-6)
  digamma_reference = {1.0: -0.5772156649015329, 0.5: -1.9635100260214235, 10.0: 2.251752589066721,
                       -0.5: 0.03648997397857652}
  got = np.asarray(special.digamma(np.array(list(digamma_reference), np.float32)))
  np.testing.assert_allclose(got, list(digamma_reference.values()), rtol=1e-6, atol=1e-7)
  grad = jax.vmap(jax.grad(lambda v: special.gammaln(v)))(jnp.asarray(np.array([0.7, 3.0, 12.5], np.float32)))
  np.testing.assert_allclose(np.asarray(grad), np.asarray(special.digamma(np.array([0.7, 3.0, 12.5], np.float32))),
                             rtol=1e-4)
  assert float(special.xlogy(0.0, 0.0)) == 0.0 and float(special.xlog1py(0.0, -1.0)) == 0.0
  np.testing.assert_allclose(float(special.xlogy(2.0, 3.0)), 2 * math.log(3), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(special.entr(np.array([0.0, -1.0]))), [0.0, -np.inf])
  assert float(special.logit(0.25)) == pytest.approx(math.log(1 / 3), rel=1e-6)
  assert float(special.expit(0.0)) == 0.5
  assert float(special.ndtr(1.96)) == pytest.approx(0.9750021048517795, rel=1e-6)
  assert float(special.ndtri(0.975)) == pytest.approx(1.959963984540054, rel=1e-5)
  assert float(special.log_ndtr(-10.0)) == pytest.approx(-53.23128515051247, rel=1e-5)
  values = np.linspace(-4, 4, 33).astype(np.float32)
  np.testing.assert_allclose(np.asarray(special.erf(values)), [math.erf(v) for v in values], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.asarray(special.erfc(values)), [math.erfc(v) for v in values], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(special.erfinv(special.erf(values[8:25]))), values[8:25], rtol=1e-5,
                             atol=1e-6)
  grad = jax.grad(lambda v: special.erf(v))(0.3)
  assert float(grad) == pytest.approx(2 / math.sqrt(math.pi) * math.exp(-0.09), rel=1e-6)


def test_scipy_stats_and_linalg():
  from tinyjax.scipy import linalg, stats
  assert float(stats.norm.logpdf(0.5, 1.0, 2.0)) == pytest.approx(-0.5 * 0.0625 - 0.5 * math.log(2 * math.pi)
                                                                  - math.log(2), rel=1e-6)
  assert float(stats.norm.cdf(0.0)) == 0.5 and float(stats.norm.ppf(0.5)) == 0.0
  assert float(stats.norm.sf(1.0)) == pytest.approx(0.15865525393145707, rel=1e-6)
  np.testing.assert_allclose(np.asarray(stats.bernoulli.logpmf(np.array([0, 1, 2]), 0.3)),
                             [math.log(0.7), math.log(0.3), -np.inf], rtol=1e-6)
  cov = np.array([[2.0, 0.5], [0.5, 1.0]], np.float32)
  points = np.array([[0.3, -0.2], [1.0, 1.0]], np.float32)
  inverse = np.linalg.inv(cov.astype(np.float64))
  want = [-0.5 * (2 * math.log(2 * math.pi) + math.log(np.linalg.det(cov)) + p @ inverse @ p) for p in points]
  np.testing.assert_allclose(np.asarray(stats.multivariate_normal.logpdf(points, np.zeros(2, np.float32), cov)),
                             want, rtol=1e-5)
  a = np.array([[2.0, 0, 0], [1.0, 3.0, 0], [0.5, -1, 4]], np.float32)
  b = RNG.standard_normal((3, 2)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(linalg.solve_triangular(a, b, lower=True)), np.linalg.solve(a, b), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(linalg.solve_triangular(a.T, b, lower=False)), np.linalg.solve(a.T, b),
                             rtol=1e-5)
  np.testing.assert_allclose(np.asarray(linalg.solve_triangular(a, b, trans="T", lower=True)),
                             np.linalg.solve(a.T, b), rtol=1e-5)
  spd = a @ a.T + np.eye(3, dtype=np.float32)
  np.testing.assert_allclose(np.asarray(linalg.cholesky(spd, lower=True)), np.linalg.cholesky(spd), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(linalg.cho_solve(linalg.cho_factor(spd), b)), np.linalg.solve(spd, b),
                             rtol=1e-4)
  check_grads(lambda m: linalg.cho_solve(linalg.cho_factor(m @ m.T + jnp.eye(3)), jnp.ones(3)).sum(), (a,), 1,
              modes=("rev",), atol=5e-2, rtol=5e-2)


def test_nn_activations_and_initializers():
  x = np.linspace(-5, 5, 41).astype(np.float32)
  alpha, scale = 1.6732632423543772, 1.0507009873554805
  np.testing.assert_allclose(np.asarray(jax.nn.selu(x)), scale * np.where(x > 0, x, alpha * np.expm1(x)),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.nn.log_sigmoid(x)), -np.logaddexp(0, -x.astype(np.float64)), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(jax.nn.celu(x)), np.maximum(x, 0) + np.minimum(np.expm1(x), 0), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.nn.hard_tanh(x)), np.clip(x, -1, 1))
  np.testing.assert_allclose(np.asarray(jax.nn.hard_silu(x)), x * np.clip(x + 3, 0, 6) / 6, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.asarray(jax.nn.glu(np.arange(4.0, dtype=np.float32))),
                             [0 / (1 + math.exp(-2)), 1 / (1 + math.exp(-3))], rtol=1e-6)
  key = jax.random.PRNGKey(0)
  init = jax.nn.initializers
  # JAX 0.10.2's values for the same key
  np.testing.assert_allclose(np.asarray(init.glorot_normal()(key, (3, 2))),
                             [[1.0468423, 1.2329134], [-0.29671577, -0.05394943], [0.12079362, -0.65617436]],
                             rtol=1e-6)
  np.testing.assert_allclose(np.asarray(init.he_uniform()(key, (2, 2))),
                             [[1.550764, 1.6578493], [-0.5809593, -0.10853563]], rtol=1e-6)
  weights = np.asarray(init.glorot_uniform()(key, (300, 200)), np.float64)
  limit = math.sqrt(6 / 500)
  assert np.abs(weights).max() <= limit and abs(weights.std() - limit / math.sqrt(3)) < 0.01 * limit
  assert np.asarray(init.normal(0.5)(key, (4,), jnp.bfloat16)).dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(init.constant(3.0)(key, (2,))), [3.0, 3.0])
  with pytest.raises(ValueError, match="at least 2D"):
    init.glorot_uniform()(key, (5,))
  with pytest.raises(ValueError, match="invalid mode"):
    init.variance_scaling(1.0, "fan_bogus", "normal")(key, (2, 2))


def test_check_grads_typeof_jacobian_precision():
  check_grads(lambda v: jnp.sin(v) * v ** 2, (np.float32(0.7),), order=2)
  check_grads(lambda m, v: (jnp.tanh(m) @ v).sum(), (np.ones((2, 3), np.float32), np.ones(3, np.float32)), order=1)
  wrong = jax.custom_jvp(lambda v: v ** 2)
  wrong.defjvp(lambda primals, tangents: (primals[0] ** 2, 3 * primals[0] * tangents[0]))
  with pytest.raises(AssertionError):
    check_grads(wrong, (1.0,), 1)
  assert str(jax.typeof(jnp.ones(3))) == "float32[3]"
  assert repr(jax.typeof(1.0)) == "ShapedArray(float32[], weak_type=True)"
  assert jax.typeof(jnp.ones((2, 3), jnp.int32)).shape == (2, 3)
  np.testing.assert_array_equal(np.asarray(jax.jacobian(lambda v: v ** 2)(jnp.arange(3.0))), np.diag([0.0, 2, 4]))
  product = jnp.dot(jnp.ones(3), jnp.ones(3), precision=jax.lax.Precision.HIGHEST)
  assert float(product) == 3.0 and str(jax.lax.Precision.HIGH) == "HIGH"


def test_debug_nans_names_the_operation():
  with jax.config.override("jax_debug_nans", True):
    with pytest.raises(FloatingPointError, match="nan.*log"):
      jnp.log(jnp.asarray([-1.0, 1.0]))
    with pytest.raises(FloatingPointError, match="div"):
      jnp.zeros(3) / jnp.zeros(3)
    with pytest.raises(FloatingPointError, match="sqrt"):  # under jit: re-run op by op to find the operation
      jax.jit(lambda v: jnp.sqrt(v) * 2)(jnp.asarray([-1.0, 4.0]))
    with pytest.raises(FloatingPointError):
      jax.grad(lambda v: jnp.sqrt(v).sum())(jnp.asarray([-1.0, 4.0]))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: jnp.sqrt(v))(jnp.asarray([4.0]))), [2.0])
    assert float(jnp.exp(0.0)) == 1.0
  assert np.isnan(np.asarray(jnp.log(jnp.asarray([-1.0])))).all()  # off again: NaN flows


def _full_convolution(a, b):
  out = np.zeros(tuple(n + k - 1 for n, k in zip(a.shape, b.shape)))
  for index in np.ndindex(b.shape):
    out[tuple(slice(i, i + n) for i, n in zip(index, a.shape))] += b[index] * a
  return out


def test_scipy_signal_convolve_and_correlate():
  from tinyjax.scipy import signal
  a = RNG.standard_normal((7, 6))
  b = RNG.standard_normal((3, 4))
  for kernel, fn in ((b, signal.convolve), (b[::-1, ::-1], signal.correlate)):
    full = _full_convolution(a, kernel)
    starts = [(k - 1) // 2 for k in b.shape]
    same = full[tuple(slice(s, s + n) for s, n in zip(starts, a.shape))]
    valid = full[tuple(slice(k - 1, n) for k, n in zip(b.shape, a.shape))]
    for mode, want in (("full", full), ("same", same), ("valid", valid)):
      got = np.asarray(fn(a.astype(np.float32), b.astype(np.float32), mode))
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{fn.__name__} {mode}")
  with pytest.raises(ValueError, match="dimensionality"):
    signal.convolve(np.ones(3), np.ones((2, 2)))


def test_debug_print_prints_at_run_time(capsys):
  def f(x):
    y = jnp.sin(x) * 2
    jax.debug.print("y = {}, total = {total}", y, total=x.sum())
    return y.sum()
  f(jnp.arange(3.0))
  compiled = jax.jit(f)
  compiled(jnp.arange(3.0))
  compiled(jnp.ones(3))  # the second call prints its own values: not traced again
  jax.vmap(f)(jnp.arange(6.0).reshape(2, 3))
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0] == lines[1] and lines[0].startswith("y = [0.") and lines[0].endswith("total = 3.0")
  assert lines[2].startswith("y = [1.682") and lines[2].endswith("total = 3.0")
  assert lines[-1].endswith("total = [ 3. 12.]")
  with pytest.raises(NotImplementedError, match="scan"):
    jax.lax.scan(lambda c, x: (jax.debug.print("{}", x) or c, None), 0.0, jnp.arange(2.0))
