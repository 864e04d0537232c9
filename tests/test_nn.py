"""tinyjax.nn activations and helpers: values against numpy references, JAX's derivatives at kinks (relu at 0,
softplus smooth), gradients against finite differences in float64, stability at large inputs."""
import math

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import nn
from tests.gradcheck import numeric_grad

RNG = np.random.default_rng(0)
X = RNG.uniform(-3, 3, (2, 5))


def _np_sigmoid(x): return 1 / (1 + np.exp(-x))


def _np_log_softmax(x, axis=-1):
  shifted = x - x.max(axis, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis, keepdims=True))


REFERENCES = [
  ("relu", nn.relu, lambda x: np.maximum(x, 0)),
  ("relu6", nn.relu6, lambda x: np.minimum(np.maximum(x, 0), 6)),
  ("sigmoid", nn.sigmoid, _np_sigmoid),
  ("softplus", nn.softplus, lambda x: np.logaddexp(x, 0)),
  ("silu", nn.silu, lambda x: x * _np_sigmoid(x)),
  ("gelu", nn.gelu, lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
  ("leaky_relu", nn.leaky_relu, lambda x: np.where(x >= 0, x, 0.01 * x)),
  ("elu", nn.elu, lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))),
  ("tanh", nn.tanh, np.tanh),
  ("softmax", nn.softmax, lambda x: np.exp(_np_log_softmax(x))),
  ("softmax_axis0", lambda x: nn.softmax(x, axis=0), lambda x: np.exp(_np_log_softmax(x, 0))),
  ("log_softmax", nn.log_softmax, _np_log_softmax),
  ("logsumexp", lambda x: nn.logsumexp(x, axis=1), lambda x: np.log(np.exp(x).sum(1))),
  ("logsumexp_all_keepdims", lambda x: nn.logsumexp(x, keepdims=True), lambda x: np.log(np.exp(x).sum(keepdims=True))),
  ("logsumexp_weighted", lambda x: nn.logsumexp(x, axis=0, b=tnp.arange(1.0, 6.0)),
   lambda x: np.log((np.exp(x) * np.arange(1.0, 6.0)).sum(0))),
  ("standardize", nn.standardize, lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)),
]


@pytest.mark.parametrize("name,fn,reference", REFERENCES, ids=[r[0] for r in REFERENCES])
def test_values_against_numpy(name, fn, reference):
  out = fn(tnp.asarray(X.astype(np.float32)))
  assert out.dtype == np.float32
  np.testing.assert_allclose(np.asarray(out), reference(X), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name,fn,reference", REFERENCES, ids=[r[0] for r in REFERENCES])
def test_gradients_against_finite_differences(name, fn, reference):
  with tj.config.override("jax_enable_x64", True):
    weights = RNG.standard_normal(np.shape(reference(X)))
    loss = lambda x: tnp.sum(fn(x) * weights)  # noqa: E731
    x = X + 0.01  # away from the kinks at 0 and 6 of the relus
    g = tj.grad(loss)(tnp.asarray(x))
    assert g.dtype == np.float64
    direction = RNG.standard_normal(x.shape)
    eps = 1e-6
    plus, minus = (float(loss(tnp.asarray(x + sign * eps * direction))) for sign in (1, -1))
    difference = (plus - minus) / (2 * eps)
    assert float(np.vdot(np.asarray(g), direction)) == pytest.approx(difference, rel=1e-6, abs=1e-8)


def test_derivatives_at_kinks_match_jax():
  assert float(tj.grad(nn.relu)(0.0)) == 0.0
  assert float(tj.grad(nn.relu)(-0.0)) == 0.0
  assert float(tj.grad(nn.relu)(2.0)) == 1.0
  assert float(tj.grad(nn.relu)(-3.0)) == 0.0 and float(tj.grad(nn.relu)(float("nan"))) == 0.0  # as JAX
  assert float(tj.grad(nn.relu6)(0.0)) == 0.0 and float(tj.grad(nn.relu6)(6.0)) == 0.0
  assert float(tj.grad(nn.relu6)(3.0)) == 1.0
  assert float(tj.grad(nn.softplus)(0.0)) == 0.5
  assert float(tj.grad(nn.leaky_relu)(0.0)) == 1.0
  assert float(tj.grad(tj.grad(nn.relu))(1.0)) == 0.0
  assert float(tj.grad(nn.elu)(-1.0)) == pytest.approx(math.exp(-1.0))


def test_relu_gradient_from_its_output_matches_float64():
  """relu's derivative is taken from its output (out > 0, the same as x > 0, NaN included), so the backward pass of
  relu(x @ w1 + b1) @ w2 needs only the activations (the first contraction's kernel can store relu(x @ w1 + b1) with
  bias and ReLU as its epilogue); the gradients are those of float64 numpy."""
  rng = np.random.default_rng(3)
  x, w1, b1, w2 = (rng.standard_normal(shape).astype(np.float32) for shape in ((64, 32), (32, 128), (128,), (128, 96)))

  def loss(w1, b1, w2): return ((nn.relu(tnp.asarray(x) @ w1 + b1) @ w2) ** 2).sum()
  step = tj.jit(tj.grad(loss, argnums=(0, 1, 2)))
  h = np.maximum(x.astype(np.float64) @ w1 + b1, 0)
  g_out = 2 * (h @ w2)
  g_h = g_out @ w2.T.astype(np.float64) * (h > 0)
  want = (x.T @ g_h, g_h.sum(0), h.T @ g_out)
  for got, expected in zip(step(w1, b1, w2), want):
    np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-4, atol=1e-2)
  jvp_out, jvp_tangent = tj.jvp(nn.relu, (tnp.asarray([-1.0, 0.0, 2.0, float("nan")]),), (tnp.ones(4),))
  np.testing.assert_array_equal(np.asarray(jvp_tangent), [0.0, 0.0, 1.0, 0.0])


def test_stability_at_large_inputs():
  big = tnp.array([1000.0, 0.0, -1000.0])
  np.testing.assert_allclose(np.asarray(nn.softmax(big)), [1.0, 0.0, 0.0])
  np.testing.assert_allclose(np.asarray(nn.log_softmax(big)), [0.0, -1000.0, -2000.0])
  assert float(nn.logsumexp(big)) == 1000.0
  np.testing.assert_allclose(np.asarray(nn.softplus(big)), [1000.0, math.log(2.0), 0.0], atol=1e-30)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda x: nn.logsumexp(x))(big)), [1.0, 0.0, 0.0])
  np.testing.assert_allclose(np.asarray(tj.grad(lambda x: tnp.sum(nn.softplus(x)))(big)), [1.0, 0.5, 0.0])
  assert float(nn.logsumexp(tnp.array([-np.inf, -np.inf]))) == -np.inf
  assert float(nn.logsumexp(tnp.array([np.inf, 1.0]))) == np.inf
  assert not np.any(np.isnan(np.asarray(nn.elu(tnp.array([-1000.0, 1000.0])))))
  x = np.linspace(-6, 6, 49)
  exact = np.asarray(nn.gelu(tnp.asarray(x.astype(np.float32)), approximate=False), np.float64)
  np.testing.assert_allclose(exact, [v / 2 * (1 + math.erf(v / math.sqrt(2))) for v in x], rtol=2e-6, atol=1e-7)


def test_logsumexp_return_sign():
  value, sign = nn.logsumexp(tnp.array([1.0, 2.0]), b=tnp.array([1.0, -2.0]), return_sign=True)
  total = math.e - 2 * math.e ** 2
  assert float(value) == pytest.approx(math.log(-total), rel=1e-6) and float(sign) == -1.0


def test_one_hot():
  labels = tnp.array([0, 2, 5, -1])
  out = nn.one_hot(labels, 3)
  assert out.dtype == np.float32 and out.shape == (4, 3)
  np.testing.assert_array_equal(np.asarray(out), [[1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0]])
  np.testing.assert_array_equal(np.asarray(nn.one_hot(tnp.array([[1, 0]]), 2, axis=0)), [[[0, 1]], [[1, 0]]])
  assert nn.one_hot(tnp.array([1]), 4, dtype=tnp.int32).dtype == np.int32


def test_integer_inputs_become_floats():
  assert nn.sigmoid(tnp.array([0, 1])).dtype == np.float32
  np.testing.assert_allclose(np.asarray(nn.softmax(tnp.array([0, 0]))), [0.5, 0.5])
  assert nn.relu(tnp.array([-2, 3])).dtype == np.int32


def test_cross_entropy_training_step():
  logits_w = tnp.asarray(RNG.standard_normal((4, 3)).astype(np.float32))
  x = tnp.asarray(RNG.standard_normal((6, 4)).astype(np.float32))
  labels = nn.one_hot(tnp.array([0, 1, 2, 0, 1, 2]), 3)

  def loss(w):
    return -tnp.mean(tnp.sum(labels * nn.log_softmax(nn.gelu(x @ w)), axis=-1))
  value, g = tj.jit(tj.value_and_grad(loss))(logits_w)
  assert float(loss(logits_w - 0.1 * g)) < float(value)


def test_more_activations_against_numpy_and_jax():
  x = np.array([-80.0, -5.0, -1.0, -0.5, 0.0, 0.3, 1.0, 2.5, 30.0, 100.0])
  softplus = np.logaddexp(x, 0)
  references = {
    "mish": x * np.tanh(softplus),
    "squareplus": (x + np.sqrt(x * x + 4)) / 2,
    "soft_sign": x / (np.abs(x) + 1),
    "sparse_plus": np.where(x <= -1, 0, np.where(x >= 1, x, (x + 1) ** 2 / 4)),
    "sparse_sigmoid": 0.5 * np.clip(x + 1, 0, 2),
    "identity": x,
  }
  for name, want in references.items():
    got = np.asarray(getattr(nn, name)(tnp.asarray(x.astype(np.float32))))
    # (squareplus cancels at large negative x: float32's error there is about 1 ulp of x, in JAX too)
    atol = 2e-6 if name == "squareplus" else 1e-30
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=atol, err_msg=name)
  # JAX 0.10.2's mish gradient at these points (float32)
  mish_grad = [-1.4258325e-33, -0.0267475, 0.0592167, 0.2895107, 0.6, 0.7828273, 1.0490361, 1.0411294, 1.0, 1.0]
  np.testing.assert_allclose(np.asarray(tj.vmap(tj.grad(nn.mish))(tnp.asarray(x.astype(np.float32)))), mish_grad,
                             rtol=5e-6)
  positive = np.array([1e-6, 0.1, 0.6931, 0.7, 5.0, 50.0])
  np.testing.assert_allclose(np.asarray(nn.log1mexp(tnp.asarray(positive.astype(np.float32)))),
                             np.where(positive < np.log(2), np.log(-np.expm1(-positive)), np.log1p(-np.exp(-positive))),
                             rtol=2e-6)
  a = np.arange(12.0).reshape(3, 4) * 10
  np.testing.assert_allclose(np.asarray(nn.logmeanexp(tnp.asarray(a.astype(np.float32)), axis=1)),
                             np.log(np.exp(a).mean(axis=1)), rtol=1e-6)
  mask = a > 20
  want = [np.log(np.exp(a[:, j][mask[:, j]]).mean()) for j in range(4)]
  np.testing.assert_allclose(np.asarray(nn.logmeanexp(tnp.asarray(a.astype(np.float32)), axis=0, where=mask)), want,
                             rtol=1e-6)


def test_delta_orthogonal_matches_jax():
  w = np.asarray(nn.initializers.delta_orthogonal()(tj.random.PRNGKey(3), (3, 3, 2, 4)))
  centre = [-0.7113, 0.18812, -0.28903, -0.61248, 0.45312, 0.84866, 0.01464, -0.27247]  # JAX 0.10.2, same key
  np.testing.assert_allclose(w[1, 1].ravel(), centre, atol=2e-5)
  assert np.count_nonzero(w) == 8
  with pytest.raises(ValueError, match="fan_in"):
    nn.initializers.delta_orthogonal()(tj.random.PRNGKey(0), (3, 3, 4, 2))


def test_composite_functions_are_one_eager_node(monkeypatch):
  """softmax, log_softmax, logsumexp, jnp.var and jnp.std are primitives without rules of their own: an eager call
  builds one PRIMITIVE node (trace/core.py stage_call), printed by name in jaxprs, while values (float64 numpy),
  gradients (finite differences), vmap and jit come from their decompositions as before."""
  import tinyjax.numpy as jnp
  from tinyjax.trace import core, sharding_types
  from tinyjax.uop import Ops
  # (once a test placed a NamedSharding, primitives run op by op)
  monkeypatch.setattr(sharding_types, "_enabled", [False])
  monkeypatch.setattr(core, "_sharding_enabled", sharding_types._enabled)
  rng = np.random.default_rng(7)
  x64 = rng.standard_normal((3, 6))
  x = jnp.asarray(x64.astype(np.float32))
  shifted = x64 - x64.max(axis=1, keepdims=True)
  expected = {
    "softmax": (lambda v: tj.nn.softmax(v, axis=1), np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True)),
    "log_softmax": (lambda v: tj.nn.log_softmax(v), shifted - np.log(np.exp(shifted).sum(1, keepdims=True))),
    "logsumexp": (lambda v: tj.nn.logsumexp(v, axis=0), np.log(np.exp(x64).sum(0))),
    "var": (lambda v: jnp.var(v, axis=1, ddof=1), x64.var(axis=1, ddof=1)),
    "std": (lambda v: jnp.std(v, keepdims=True), x64.std(keepdims=True)),
  }
  for name, (fn, want) in expected.items():
    out = fn(x)
    assert out.uop.op is Ops.PRIMITIVE and out.uop.arg.prim.name == name, name
    np.testing.assert_allclose(np.asarray(out), want, rtol=2e-6, atol=2e-6, err_msg=name)
    np.testing.assert_allclose(np.asarray(tj.jit(fn)(x)), want, rtol=2e-6, atol=2e-6, err_msg=name)
    rows = np.stack([np.asarray(fn(x[i:i + 1]))[0] if name not in ("logsumexp", "std") else np.asarray(fn(x[i]))
                     for i in range(3)])
    batched = tj.vmap(lambda r: fn(r[None])[0] if name not in ("logsumexp", "std") else fn(r))(x)
    np.testing.assert_allclose(np.asarray(batched), rows, rtol=2e-6, atol=2e-6, err_msg=name)
    assert f"{name}[" in str(tj.make_jaxpr(fn)(x)), name
    with tj.config.override("jax_enable_x64", True):
      weights = rng.standard_normal(np.shape(want))
      loss = lambda v, fn=fn, weights=weights: (fn(v) * weights).sum()
      analytic = np.asarray(tj.grad(loss)(jnp.asarray(x64)))
      numeric = numeric_grad(lambda v: float(loss(jnp.asarray(v))), x64, eps=1e-6)
      np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7, err_msg=name)
  with pytest.raises(ValueError, match="ddof and correction"):
    jnp.var(x, ddof=1, correction=1)
  masked = jnp.var(x, axis=1, where=x > 0)  # (with `where`: written out, no primitive)
  np.testing.assert_allclose(np.asarray(masked), [np.var(r[r > 0]) for r in x64.astype(np.float32)], rtol=1e-5)
