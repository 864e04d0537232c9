"""custom_jvp, custom_vjp and checkpoint: the user's rules replace differentiation of the body, compose with jit and
higher-order grad, and checkpoint gives the same gradients as plain differentiation."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp

X = np.array([0.0, 0.5, -1.25, 2.0], np.float32)


@tj.custom_jvp
def scaled_sin(x):
  return tnp.sin(x)


@scaled_sin.defjvp
def _scaled_sin_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return scaled_sin(x), 2.0 * tnp.cos(x) * t  # deliberately twice the true derivative


def test_custom_jvp_rule_replaces_the_body_in_forward_and_reverse_mode():
  out, tangent = tj.jvp(scaled_sin, (X,), (np.ones(4, np.float32),))
  np.testing.assert_allclose(np.asarray(out), np.sin(X), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tangent), 2 * np.cos(X), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda x: scaled_sin(x).sum())(X)), 2 * np.cos(X), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(lambda x: scaled_sin(x).sum()))(X)), 2 * np.cos(X), rtol=1e-6)


def test_custom_jvp_rule_is_itself_differentiated_for_higher_order():
  second = tj.grad(tj.grad(lambda x: scaled_sin(x)))(0.5)
  np.testing.assert_allclose(float(second), -2 * np.sin(0.5), rtol=1e-6)


def test_custom_jvp_defjvps_and_missing_rule():
  @tj.custom_jvp
  def cube(x): return x * x * x
  cube.defjvps(lambda g, ans, x: 3.0 * x * x * g)
  np.testing.assert_allclose(float(tj.grad(cube)(2.0)), 12.0)

  @tj.custom_jvp
  def no_rule(x): return x
  with pytest.raises(AttributeError, match="No JVP defined"):
    no_rule(1.0)


@tj.custom_vjp
def clipped_identity(x):
  return x


def _clip_fwd(x):
  return x, None


def _clip_bwd(_, g):
  return (tnp.clip(g, -1.0, 1.0),)


clipped_identity.defvjp(_clip_fwd, _clip_bwd)


def test_custom_vjp_bwd_gives_the_gradient():
  grads = tj.grad(lambda x: (clipped_identity(x) * 3.0).sum())(X)
  np.testing.assert_array_equal(np.asarray(grads), np.ones(4, np.float32))  # 3 clipped to 1
  np.testing.assert_array_equal(np.asarray(tj.jit(tj.grad(lambda x: (clipped_identity(x) * 3.0).sum()))(X)),
                                np.ones(4, np.float32))


def test_custom_vjp_several_inputs_outputs_and_nondiff_argnums():
  def f(scale, x, y): return x * y * scale, x + y
  f = tj.custom_vjp(f, nondiff_argnums=(0,))

  def fwd(scale, x, y): return f(scale, x, y), (x, y)

  def bwd(scale, residuals, cts):
    x, y = residuals
    ct_product, ct_sum = cts
    return ct_product * y * scale + ct_sum, ct_product * x * scale + ct_sum
  f.defvjp(fwd, bwd)
  y = np.arange(4, dtype=np.float32)
  gx, gy = tj.grad(lambda x, y: (f(2.0, x, y)[0] + f(2.0, x, y)[1]).sum(), argnums=(0, 1))(X, y)
  np.testing.assert_allclose(np.asarray(gx), y * 2 + 1, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(gy), X * 2 + 1, rtol=1e-6)


def test_custom_vjp_under_forward_mode_is_a_type_error():
  with pytest.raises(TypeError, match="forward-mode"):
    tj.jvp(clipped_identity, (X,), (X,))


def test_checkpoint_matches_plain_gradients_at_every_order():
  def f(x): return tnp.sin(x) * tnp.exp(x * 0.5)
  remat_f = tj.checkpoint(f)
  plain = tj.grad(lambda x: f(x).sum())(X)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda x: remat_f(x).sum())(X)), np.asarray(plain), rtol=1e-6)
  np.testing.assert_allclose(float(tj.grad(tj.grad(remat_f))(0.3)), float(tj.grad(tj.grad(f))(0.3)), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(remat_f(X)), np.asarray(f(X)), rtol=1e-6)
  static_remat = tj.remat(lambda x, power: x ** power, static_argnums=(1,))
  np.testing.assert_allclose(float(tj.grad(lambda x: static_remat(x, 3))(2.0)), 12.0, rtol=1e-6)


def test_custom_jvp_rule_survives_vmap_in_every_order():
  expected = 2 * np.cos(X)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda x: tj.vmap(scaled_sin)(x).sum())(X)), expected, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.vmap(tj.grad(scaled_sin))(X)), expected, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.jacfwd(tj.vmap(scaled_sin))(X)), np.diag(expected), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.vmap(scaled_sin)(X)), np.sin(X), rtol=1e-6)


def test_custom_vjp_rule_survives_vmap_and_sums_unbatched_cotangents():
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda x: (tj.vmap(clipped_identity)(x) * 3.0).sum())(X)),
                                np.ones(4, np.float32))
  np.testing.assert_array_equal(np.asarray(tj.vmap(tj.grad(lambda x: clipped_identity(x) * 3.0))(X)),
                                np.ones(4, np.float32))

  @tj.custom_vjp
  def scale(w, x): return w * x
  scale.defvjp(lambda w, x: (w * x, (w, x)), lambda res, g: (g * res[1] * 10.0, g * res[0]))
  dw, dx = tj.grad(lambda w, x: tj.vmap(scale, in_axes=(None, 0))(w, x).sum(), argnums=(0, 1))(np.float32(2.0), X)
  np.testing.assert_allclose(float(dw), 10 * X.sum(), rtol=1e-6)   # per-example cotangents of w, summed
  np.testing.assert_array_equal(np.asarray(dx), np.full(4, 2.0, np.float32))
  remat_grad = tj.grad(lambda x: tj.vmap(tj.checkpoint(lambda v: tnp.sin(v) * v))(x).sum())(X)
  np.testing.assert_allclose(np.asarray(remat_grad), np.cos(X) * X + np.sin(X), rtol=1e-5, atol=1e-6)


def test_custom_jvp_rule_that_calls_the_function_differentiates_twice():
  """A rule that calls the custom function itself (as jax.nn's do) is applied again at every order: grad(grad(h)),
  jvp of grad, jit(grad(grad)) and hessian use the rule, not the body's own derivative (JAX's values)."""
  @tj.custom_jvp
  def h(x): return tnp.sin(x)

  @h.defjvp
  def h_jvp(primals, tangents):
    return h(primals[0]), h(primals[0]) * 10 * tangents[0]

  x = 0.3
  # h' = 10 h, so h'' = 100 h and h''' = 1000 h
  np.testing.assert_allclose(float(tj.grad(h)(x)), 10 * np.sin(x), rtol=1e-6)
  np.testing.assert_allclose(float(tj.grad(tj.grad(h))(x)), 100 * np.sin(x), rtol=1e-6)
  np.testing.assert_allclose(float(tj.jit(tj.grad(tj.grad(h)))(x)), 100 * np.sin(x), rtol=1e-6)
  np.testing.assert_allclose(float(tj.grad(tj.grad(tj.grad(h)))(x)), 1000 * np.sin(x), rtol=1e-5)
  np.testing.assert_allclose(float(tj.jvp(tj.grad(h), (x,), (1.0,))[1]), 100 * np.sin(x), rtol=1e-6)
  np.testing.assert_allclose(float(tj.hessian(lambda v: h(v).sum())(tnp.asarray([x]))[0, 0]), 100 * np.sin(x),
                             rtol=1e-6)
  per_example = tj.vmap(tj.grad(tj.grad(h)))(tnp.asarray([0.1, 0.2, x]))
  np.testing.assert_allclose(np.asarray(per_example), 100 * np.sin([0.1, 0.2, x]), rtol=1e-5)
