"""Derivatives where JAX makes a choice: kinks (abs, relu-like max), ties (max/min/maximum/minimum/clip split
0.5/0.5, reduce_max splits evenly, lax.clamp passes nothing at a bound), zero-derivative ops, special points of
sqrt/log/pow, NaNs from unused `where` branches, gradient dtypes (f16/bf16 stay f16/bf16). Expected values are
JAX's."""
import math

import ml_dtypes
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax

BF16 = np.dtype(ml_dtypes.bfloat16)


def grad_value(f, *args, argnums=0):
  result = tj.grad(f, argnums=argnums)(*args)
  return tuple(float(r) for r in result) if isinstance(result, tuple) else float(result)


@pytest.mark.parametrize("x", [0.0, -0.0])
def test_abs_at_zero_is_one(x):
  assert grad_value(lax.abs, x) == 1.0
  assert grad_value(tnp.abs, x) == 1.0
  assert grad_value(abs, tnp.float32(x)) == 1.0
  assert grad_value(tnp.abs, -2.0) == -1.0


def test_abs_forward_mode_and_nan():
  _, tangent = tj.jvp(lax.abs, (tnp.array([0.0, -1.0, 2.0]),), (tnp.array([3.0, 3.0, 3.0]),))
  np.testing.assert_array_equal(np.asarray(tangent), [3.0, -3.0, 3.0])
  assert grad_value(tnp.abs, math.nan) == -1.0  # JAX: select(x >= 0, t, -t) and NaN >= 0 is false


@pytest.mark.parametrize("fn", [lax.sign, lax.floor, lax.ceil, lax.round, tnp.sign, tnp.floor, tnp.ceil, tnp.trunc,
                                tnp.rint, tnp.round, lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)])
@pytest.mark.parametrize("x", [0.0, 0.5, -1.3])
def test_piecewise_constant_ops_have_zero_derivative(fn, x):
  assert grad_value(fn, x) == 0.0


@pytest.mark.parametrize("fn", [lax.max, lax.min, tnp.maximum, tnp.minimum, tnp.fmax, tnp.fmin])
def test_binary_ties_split_evenly(fn):
  assert grad_value(fn, 1.5, 1.5, argnums=(0, 1)) == (0.5, 0.5)
  assert grad_value(fn, 0.0, -0.0, argnums=(0, 1)) == (0.5, 0.5)


def test_max_min_away_from_ties_and_with_nan():
  assert grad_value(lax.max, 2.0, 1.0, argnums=(0, 1)) == (1.0, 0.0)
  assert grad_value(tnp.minimum, 2.0, 1.0, argnums=(0, 1)) == (0.0, 1.0)
  assert grad_value(lax.max, math.nan, 1.0, argnums=(0, 1)) == (0.0, 0.0)  # JAX's _balanced_eq


def test_clip_ties_split_but_clamp_bounds_pass_nothing():
  assert grad_value(lambda x: tnp.clip(x, 0.0, 1.0), 0.0) == 0.5
  assert grad_value(lambda x: tnp.clip(x, 0.0, 1.0), 1.0) == 0.5
  assert grad_value(lambda x: tnp.clip(x, 0.0, 1.0), 2.0) == 0.0
  assert grad_value(lambda x: x.clip(0.0, 1.0), 0.25) == 1.0
  # lax.clamp as JAX: operand strictly inside, the lower bound below it, the upper bound above it
  assert grad_value(lambda lo, x, hi: lax.clamp(lo, x, hi), 0.0, 0.0, 1.0, argnums=(0, 1, 2)) == (0.0, 0.0, 0.0)
  assert grad_value(lambda lo, x, hi: lax.clamp(lo, x, hi), 0.0, 1.0, 1.0, argnums=(0, 1, 2)) == (0.0, 0.0, 0.0)
  assert grad_value(lambda lo, x, hi: lax.clamp(lo, x, hi), 0.0, 0.5, 1.0, argnums=(0, 1, 2)) == (0.0, 1.0, 0.0)
  assert grad_value(lambda lo, x, hi: lax.clamp(lo, x, hi), 0.0, -1.0, 1.0, argnums=(0, 1, 2)) == (1.0, 0.0, 0.0)
  assert grad_value(lambda lo, x, hi: lax.clamp(lo, x, hi), 0.0, 2.0, 1.0, argnums=(0, 1, 2)) == (0.0, 0.0, 1.0)


@pytest.mark.parametrize("reduce", [lambda x: tnp.max(x), lambda x: lax.reduce_max(x, (0,)), lambda x: -tnp.min(-x),
                                    lambda x: -lax.reduce_min(-x, (0,))])
def test_reduce_max_ties_split_evenly(reduce):
  x = tnp.array([1.0, 3.0, -2.0, 3.0, 3.0, 0.5])
  np.testing.assert_allclose(np.asarray(tj.grad(reduce)(x)), [0, 1 / 3, 0, 1 / 3, 1 / 3, 0], rtol=1e-7)


def test_reduce_max_over_rows_with_keepdims():
  x = tnp.array([[1.0, 1.0], [2.0, 0.0]])
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda x: tnp.sum(tnp.max(x, axis=1, keepdims=True)))(x)),
                                [[0.5, 0.5], [1.0, 0.0]])


def test_reduce_prod_is_exact_at_zeros():
  prod = lambda x: tnp.prod(x)  # noqa: E731
  np.testing.assert_array_equal(np.asarray(tj.grad(prod)(tnp.array([2.0, 0.0, 3.0]))), [0.0, 6.0, 0.0])
  np.testing.assert_array_equal(np.asarray(tj.grad(prod)(tnp.array([0.0, 0.0, 3.0]))), [0.0, 0.0, 0.0])
  np.testing.assert_array_equal(np.asarray(tj.grad(prod)(tnp.array([2.0, 4.0, 3.0]))), [12.0, 6.0, 8.0])
  rows = tj.grad(lambda x: tnp.sum(tnp.prod(x, axis=1)))(tnp.array([[0.0, 5.0], [2.0, 3.0]]))
  np.testing.assert_array_equal(np.asarray(rows), [[5.0, 0.0], [3.0, 2.0]])


def test_reduce_prod_derivative_with_infinities_and_nans_is_jax():
  """The derivative at i is the product of the others, before i times after i (JAX 0.10's values below)."""
  inf, nan = math.inf, math.nan
  for values, want in (([2.0, inf, 3.0], [inf, 6.0, inf]), ([2.0, nan, 3.0], [nan, 6.0, nan]),
                       ([0.0, inf, 3.0], [inf, 0.0, nan]), ([-inf, 2.0], [2.0, -inf]), ([5.0], [1.0])):
    np.testing.assert_array_equal(np.asarray(tj.grad(tnp.prod)(tnp.array(values))), want)
  # over several axes, kept dimensions, under jit and vmap, against the products of the others
  x = np.random.default_rng(3).uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32)
  others = np.prod(x, axis=(0, 2), keepdims=True) / x
  f = tj.jit(tj.grad(lambda v: (tnp.prod(v, axis=(0, 2), keepdims=True) * tnp.arange(1.0, 5.0)[:, None]).sum()))
  np.testing.assert_allclose(np.asarray(f(x)), others * np.arange(1.0, 5.0)[None, :, None], rtol=1e-5)
  per_row = tj.vmap(tj.grad(tnp.prod))(tnp.asarray(x[:, :, 0]))
  np.testing.assert_allclose(np.asarray(per_row), np.prod(x[:, :, 0], axis=1, keepdims=True) / x[:, :, 0], rtol=1e-5)
  assert np.asarray(tj.grad(lambda v: tnp.prod(v[:0]))(tnp.ones(3))).tolist() == [0.0, 0.0, 0.0]


def test_floor_divide_has_zero_derivative_everywhere():
  """floor(x / y) is piecewise constant: JAX's derivative is 0 in both arguments, also at y == 0."""
  for x, y in ((3.0, 0.0), (-3.0, 0.0), (3.0, 2.0), (7.5, -2.0)):
    assert grad_value(tnp.floor_divide, x, y, argnums=(0, 1)) == (0.0, 0.0)


def test_sqrt_log_pow_special_points():
  assert grad_value(tnp.sqrt, 0.0) == math.inf
  assert grad_value(tnp.log, 0.0) == math.inf
  assert grad_value(lax.rsqrt, 4.0) == -1 / 16
  pow_grads = lambda x, y: grad_value(lax.pow, x, y, argnums=(0, 1))  # noqa: E731
  assert pow_grads(0.0, 2.0) == (0.0, 0.0)  # d/dy uses log(1) where x == 0, as JAX
  assert pow_grads(2.0, 3.0) == pytest.approx((12.0, 8.0 * math.log(2.0)))
  dx, dy = pow_grads(0.0, 0.0)
  assert math.isnan(dx) and dy == 0.0  # JAX: y * 0**(y-1) = 0 * inf
  assert grad_value(lambda x: x ** 0, 0.0) == 0.0  # integer_pow with y == 0
  assert grad_value(lambda x: x ** 2, 0.0) == 0.0
  assert grad_value(lambda x: x ** -1, 2.0) == -0.25
  assert grad_value(tnp.cbrt, 8.0) == pytest.approx(1 / 12)


def test_nan_from_unused_where_branch_propagates():
  # the cotangent of the unused branch is a real zero: 0 * inf and 0 / 0 are NaN, as in JAX
  assert math.isnan(grad_value(lambda x: tnp.where(x > 0, tnp.sqrt(x), 0.0), 0.0))
  assert math.isnan(grad_value(lambda x: tnp.where(x > 0, tnp.log(x), x), 0.0))
  assert math.isnan(grad_value(lambda x: tnp.log(x) * 0.0, 0.0))
  assert math.isnan(grad_value(lambda x: tnp.sqrt(x) * 0.0, 0.0))
  assert grad_value(lambda x: tnp.where(x > 0, tnp.sqrt(x), 0.0), 4.0) == 0.25
  # 0 * nan: the unused branch's derivative is NaN (sqrt of a negative number)
  assert math.isnan(grad_value(lambda x: tnp.where(x < 0, tnp.sqrt(x - 2.0), x), 1.0))
  assert math.isnan(grad_value(tj.jit(lambda x: tnp.where(x < 0, tnp.sqrt(x - 2.0), x)), 1.0))
  # forward mode selects the tangent itself: no NaN there
  _, tangent = tj.jvp(lambda x: tnp.where(x > 0, tnp.sqrt(x), 0.0), (0.0,), (1.0,))
  assert float(tangent) == 0.0


def test_stop_gradient():
  assert grad_value(lambda x: lax.stop_gradient(x) * x, 3.0) == 3.0
  assert grad_value(lambda x: lax.stop_gradient(x * x) + x, 3.0) == 1.0
  tree = lax.stop_gradient({"a": tnp.ones(2), "n": 3})
  assert tree["n"] == 3 and tree["a"].shape == (2,)
  _, tangent = tj.jvp(lambda x: lax.stop_gradient(tnp.sin(x)), (1.0,), (1.0,))
  assert float(tangent) == 0.0
  assert grad_value(tj.grad(lambda x: lax.stop_gradient(x) * x * x), 2.0) == 4.0


def test_argmax_and_comparisons_have_zero_derivative():
  x = tnp.array([1.0, 5.0, 2.0])
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda x: x[1] * tnp.argmax(x))(x)), [0.0, 1.0, 0.0])
  assert grad_value(lambda x: tnp.where(x > 1, 2.0, 3.0) * 1.0, 2.0) == 0.0


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float32])
def test_gradients_keep_the_input_dtype(dtype):
  def loss(x):
    return tnp.sum(tnp.tanh(x) * tnp.exp(x) + tnp.abs(x) + tnp.maximum(x, 0.5)) + x @ x
  host = np.array([0.5, -1.0, 2.0], dtype)
  g = tj.grad(loss)(tnp.asarray(host))
  assert g.dtype == np.dtype(dtype)
  x = host.astype(np.float64)
  t = np.tanh(x)
  expected = (1 - t * t) * np.exp(x) + t * np.exp(x) + np.sign(x) + np.array([0.5, 0.0, 1.0]) + 2 * x
  np.testing.assert_allclose(np.asarray(g).astype(np.float64), expected, rtol=2e-2 if dtype != np.float32 else 1e-5)
  _, vjp_fn = tj.vjp(lambda x: tnp.sin(x), tnp.asarray(host))
  assert vjp_fn(tnp.ones(3, dtype=np.float32))[0].dtype == np.dtype(dtype)


def test_dot_general_gradient_of_low_precision_accumulates_in_float32():
  a = tnp.asarray(np.full((4, 64), 0.1, np.float16))
  b = tnp.asarray(np.full((64, 3), 0.1, np.float16))
  ga, gb = tj.grad(lambda a, b: tnp.sum(a @ b), argnums=(0, 1))(a, b)
  assert ga.dtype == gb.dtype == np.float16
  np.testing.assert_allclose(np.asarray(ga).astype(np.float64), np.full((4, 64), 0.3), rtol=1e-2)
  np.testing.assert_allclose(np.asarray(gb).astype(np.float64), np.full((64, 3), 0.4), rtol=1e-2)


@pytest.mark.parametrize("x,y,expected", [(4.0, 2.0, (1.0, -2.0)), (-4.0, 2.0, (1.0, 2.0)), (5.0, 2.0, (1.0, -2.0)),
                                          (-5.0, 2.0, (1.0, 3.0)), (5.0, -2.0, (1.0, 3.0))])
def test_remainder_derivative_including_exact_multiples(x, y, expected):
  assert grad_value(lambda a, b: a % b, x, y, argnums=(0, 1)) == expected
  assert grad_value(tnp.fmod, x, y, argnums=(0, 1)) == (1.0, -float(int(x / y)))
  assert grad_value(lax.rem, x, y, argnums=(0, 1)) == (1.0, -float(int(x / y)))
  assert grad_value(lambda a, b: a // b, x, y, argnums=(0, 1)) == (0.0, 0.0)


def test_max_min_weights_as_jax_and_independent_of_the_results_bits():
  """maximum / minimum weight their operands as JAX 0.10.2 does (NaN, signed-zero ties) by comparing the operands
  with each other, not with the result: a result recomputed with another rounding (a value computed in two kernels)
  must not turn relu's derivative into 0."""
  xs = np.array([-1.0, 0.0, 2.0, np.nan, 3.0, -0.0], np.float32)
  ys = np.array([1.0, 0.0, 1.0, 1.0, np.nan, 0.0], np.float32)
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda x: tnp.maximum(x, ys).sum())(xs)), [0, 0.5, 1, 0, 0, 0.5])
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda y: tnp.maximum(xs, y).sum())(ys)), [1, 0.5, 0, 0, 0, 0.5])
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda x: tnp.minimum(x, ys).sum())(xs)), [1, 0.5, 0, 0, 0, 0.5])
  from tinyjax.trace import ad
  from tinyjax.uop import Ops
  x, y = tnp.asarray(np.array([0.3, -2.0, 5.0], np.float32)), tnp.zeros(3)
  off_by_an_ulp = tnp.asarray(np.nextafter(np.maximum(np.asarray(x), 0), np.float32(np.inf)))
  tangent = ad.jvp_rules[Ops.MAX]((x, y), (tnp.ones(3), None), off_by_an_ulp, None)
  np.testing.assert_array_equal(np.asarray(tangent), [1.0, 0.0, 1.0])
