"""jacfwd, jacrev and hessian against float64 finite differences and closed forms, on arrays and pytrees, composed
with jit."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import config


def numeric_jacobian(f, x, eps=1e-6):
  x = np.asarray(x, np.float64)
  columns = []
  for i in range(x.size):
    step = np.zeros(x.size)
    step[i] = eps
    plus = np.asarray(f(x + step.reshape(x.shape)), np.float64)
    minus = np.asarray(f(x - step.reshape(x.shape)), np.float64)
    columns.append(((plus - minus) / (2 * eps)).reshape(-1))
  return np.stack(columns, axis=-1).reshape(np.shape(f(x)) + x.shape)


def nonlinear(x):
  return tnp.tanh(x) * x[0] + tnp.exp(x * 0.3).sum()


@pytest.mark.parametrize("jacobian", [tj.jacfwd, tj.jacrev])
@pytest.mark.parametrize("shape", [(3,), (2, 3)])
def test_jacobian_matches_finite_differences(jacobian, shape):
  with config.override("jax_enable_x64", True):
    x = np.random.default_rng(0).standard_normal(shape)
    f = (lambda x: nonlinear(x.reshape(-1)).reshape(shape)) if len(shape) > 1 else nonlinear
    np.testing.assert_allclose(np.asarray(jacobian(f)(x)), numeric_jacobian(f, x), rtol=1e-6, atol=1e-8)


def test_hessian_of_a_polynomial_is_exact():
  x = np.array([0.5, 1.0, 2.0], np.float32)
  cubes = (x ** 3).sum()
  expected = np.diag(6 * x * x[1])
  expected[:, 1] += 3 * x ** 2
  expected[1, :] += 3 * x ** 2
  np.testing.assert_allclose(np.asarray(tj.hessian(lambda x: (x ** 3).sum() * x[1])(x)), expected, rtol=1e-6)
  assert cubes > 0


def test_pytree_jacobian_structure_is_output_of_inputs():
  x = np.array([0.5, 1.0, 2.0], np.float32)

  def f(p): return {"a": p["u"] * 2.0, "b": (p["u"] * p["v"]).sum()}
  for jacobian in (tj.jacfwd, tj.jacrev):
    result = jacobian(f)({"u": x, "v": x})
    assert tj.tree_util.tree_map(lambda leaf: leaf.shape, result) == {"a": {"u": (3, 3), "v": (3, 3)},
                                                                      "b": {"u": (3,), "v": (3,)}}
    np.testing.assert_allclose(np.asarray(result["a"]["u"]), 2 * np.eye(3))
    np.testing.assert_allclose(np.asarray(result["b"]["v"]), x)


def test_jacobians_compose_with_jit_and_argnums():
  x, y = np.array([1.0, 2.0], np.float32), np.array([3.0, -1.0], np.float32)
  f = lambda x, y: x * y + tnp.sin(y)
  dx, dy = tj.jit(tj.jacrev(f, argnums=(0, 1)))(x, y)
  np.testing.assert_allclose(np.asarray(dx), np.diag(y), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(dy), np.diag(x + np.cos(y)), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.jacfwd(tj.jacrev(lambda v: (v * v).sum()))(x)), 2 * np.eye(2))


def test_jacobian_of_integer_input_is_a_type_error():
  with pytest.raises(TypeError, match="real-valued"):
    tj.jacrev(lambda x: x * 2)(np.arange(3))
