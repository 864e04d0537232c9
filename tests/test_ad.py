"""The AD transformations as JAX's: grad/value_and_grad (argnums int or tuple, has_aux, pytrees), jvp, vjp (with
has_aux), linearize, higher order, Python control flow on concrete values, errors with JAX's messages, composition
with jit, and whole programs (an MLP loss over a dict of parameters, softmax cross-entropy, layer norm) against
finite differences in float64 and float32 against float64."""
import math

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax
from tinyjax.trace.core import Tracer

RNG = np.random.default_rng(0)


def close(actual, expected, rtol=1e-6, atol=1e-7):
  np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------- grad and friends

def test_grad_argnums_int_and_tuple():
  f = lambda x, y, z: x * x * y + tnp.sin(z)  # noqa: E731
  assert float(tj.grad(f)(3.0, 2.0, 0.0)) == 12.0
  assert float(tj.grad(f, argnums=1)(3.0, 2.0, 0.0)) == 9.0
  dx, dz = tj.grad(f, argnums=(0, 2))(3.0, 2.0, 0.0)
  assert (float(dx), float(dz)) == (12.0, 1.0)
  (single,) = tj.grad(f, argnums=(1,))(3.0, 2.0, 0.0)
  assert float(single) == 9.0
  with pytest.raises(TypeError, match="argnums=3 requires at least 4 positional arguments"):
    tj.grad(f, argnums=3)(1.0, 2.0, 3.0)


def test_grad_keyword_arguments_are_not_differentiated():
  f = lambda x, scale=1.0: scale * x * x  # noqa: E731
  assert float(tj.grad(f)(2.0, scale=3.0)) == 12.0


def test_has_aux_and_value_and_grad():
  def f(x):
    return tnp.sum(x * x), {"mean": tnp.mean(x), "n": 3}
  x = tnp.array([1.0, 2.0, 3.0])
  g, aux = tj.grad(f, has_aux=True)(x)
  close(g, [2, 4, 6])
  assert float(aux["mean"]) == 2.0 and aux["n"] == 3
  (value, aux), g = tj.value_and_grad(f, has_aux=True)(x)
  assert float(value) == 14.0 and float(aux["mean"]) == 2.0
  close(g, [2, 4, 6])
  value, (gx, gy) = tj.value_and_grad(lambda x, y: tnp.sum(x * y), argnums=(0, 1))(x, 2 * x)
  assert float(value) == 28.0
  close(gx, [2, 4, 6])
  close(gy, [1, 2, 3])


def test_jvp_has_aux_returns_primal_aux():
  out, tangent, aux = tj.jvp(lambda x: (tnp.sin(x), x * 3), (1.0,), (2.0,), has_aux=True)
  assert float(tangent) == pytest.approx(2 * math.cos(1.0), rel=1e-6)
  assert float(aux) == 3.0 and not isinstance(aux, Tracer)


def test_nested_derivatives_keep_perturbations_apart():
  # d/dx [x * d/dy (x + y)] = d/dx [x] = 1 (perturbation confusion would give 2)
  assert float(tj.grad(lambda x: x * tj.grad(lambda y: x + y)(1.0))(2.0)) == 1.0
  assert float(tj.grad(lambda x: tj.grad(lambda y: x * y)(3.0))(2.0)) == 1.0
  _, tangent = tj.jvp(lambda x: x * tj.jvp(lambda y: x + y, (1.0,), (1.0,))[1], (2.0,), (1.0,))
  assert float(tangent) == 1.0


def test_grad_over_pytrees():
  params = {"w": tnp.array([[1.0, 2.0], [3.0, 4.0]]), "b": (tnp.array([0.5, -0.5]), None), "scale": 2.0}
  def loss(params, x):
    w, (b, _) = params["w"], params["b"]
    return params["scale"] * tnp.sum((x @ w + b) ** 2)
  x = tnp.array([1.0, -1.0])
  grads = tj.grad(loss)(params, x)
  assert set(grads) == {"w", "b", "scale"} and grads["b"][1] is None
  y = np.array([1.0, -1.0]) @ np.array([[1.0, 2.0], [3.0, 4.0]]) + [0.5, -0.5]
  close(grads["w"], 2 * 2 * np.outer([1.0, -1.0], y))
  close(grads["b"][0], 2 * 2 * y)
  close(grads["scale"], np.sum(y ** 2))


def test_jvp_and_linearize_agree():
  def f(x, y):
    return {"a": tnp.sin(x) * y, "b": tnp.sum(x ** 3)}
  primals = (tnp.array([0.1, 0.7, -1.2]), tnp.array([2.0, -1.0, 0.5]))
  tangents = (tnp.array([1.0, 0.5, -2.0]), tnp.array([0.3, 0.0, 1.0]))
  out, tangent_out = tj.jvp(f, primals, tangents)
  out_lin, f_jvp = tj.linearize(f, *primals)
  close(out_lin["a"], out["a"])
  lin = f_jvp(*tangents)
  close(lin["a"], tangent_out["a"], rtol=1e-6)
  close(lin["b"], tangent_out["b"], rtol=1e-6)
  again = f_jvp(tnp.ones(3), tnp.zeros(3))  # the linear function can be reused
  close(again["b"], np.sum(3 * np.asarray(primals[0]) ** 2), rtol=1e-6)


def test_linearize_of_an_output_that_does_not_depend_on_the_input():
  _, f_jvp = tj.linearize(lambda x: (x * 2, tnp.ones((2, 3))), tnp.ones(4))
  doubled, zeros = f_jvp(tnp.ones(4))
  close(doubled, np.full(4, 2.0))
  assert zeros.shape == (2, 3)
  close(zeros, np.zeros((2, 3)))


def test_linear_transpose_is_the_adjoint():
  """`linear_transpose` of a linear map: <ct, f(x)> == <f^T(ct), x> for random x and ct (the adjoint identity), its
  matrix the transpose of f's (built column by column, float64); pytrees in and out, an output that ignores the input
  (zero cotangent), a constant term ignored (as JAX), integer -> integer, ShapeDtypeStruct primals; composed with jit
  and vmap; and JAX's errors: a non-linear function (NotImplementedError), float -> int and a cotangent of the wrong
  shape or dtype (TypeError)."""
  rng = np.random.default_rng(21)
  a = rng.standard_normal((4, 3)).astype(np.float32)

  def f(x): return tnp.asarray(a) @ x[::-1] + 2.0 * x.sum() - x[1]
  x, ct = rng.standard_normal(3).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  (back,) = tj.linear_transpose(f, x)(ct)
  np.testing.assert_allclose(np.dot(ct, np.asarray(f(x), np.float64)), np.dot(np.asarray(back, np.float64), x),
                             rtol=1e-5)
  matrix = np.stack([np.asarray(f(e), np.float64) for e in np.eye(3, dtype=np.float32)], axis=1)
  np.testing.assert_allclose(np.asarray(back), matrix.T @ ct, rtol=1e-5, atol=1e-6)
  (jitted,) = tj.jit(tj.linear_transpose(f, x))(ct)
  np.testing.assert_allclose(np.asarray(jitted), matrix.T @ ct, rtol=1e-5, atol=1e-6)
  (batched,) = tj.vmap(tj.linear_transpose(f, tj.ShapeDtypeStruct((3,), np.float32)))(np.stack([ct, 2 * ct]))
  np.testing.assert_allclose(np.asarray(batched), np.stack([matrix.T @ ct, 2 * matrix.T @ ct]), rtol=1e-5, atol=1e-5)

  g = tj.linear_transpose(lambda p, q: {"a": p + q, "b": p * 3.0, "zero": tnp.zeros(2)}, 1.0, 2.0)
  assert [float(v) for v in g({"a": 1.0, "b": 2.0, "zero": tnp.ones(2)})] == [7.0, 1.0]
  assert float(tj.linear_transpose(lambda p: p + 1.0, 1.0)(5.0)[0]) == 5.0
  (ints,) = tj.linear_transpose(lambda n: n * 3 - n, 1)(4)
  assert ints.dtype == np.int32 and int(ints) == 8
  with pytest.raises(NotImplementedError): tj.linear_transpose(tnp.sin, 1.0)(1.0)
  with pytest.raises(NotImplementedError, match="not linear"): tj.linear_transpose(lambda p: p * p, 1.0)(1.0)
  with pytest.raises(TypeError, match="integer -> integer"): tj.linear_transpose(lambda p: p.astype(np.int32), 1.0)
  with pytest.raises(TypeError, match="cotangent type does not match"): tj.linear_transpose(f, x)(np.ones(3))
  with pytest.raises(TypeError, match="cotangent type does not match"):
    tj.linear_transpose(f, x)(np.ones(4, np.float16))


def test_vjp_with_has_aux_and_pytree_cotangents():
  def f(x):
    return (tnp.sin(x), x * 2), tnp.cos(x)
  x = tnp.array([0.0, 1.0])
  (s, d), vjp_fn, aux = tj.vjp(f, x, has_aux=True)
  close(aux, np.cos([0.0, 1.0]))
  (g,) = vjp_fn((tnp.ones(2), tnp.array([1.0, 0.0])))
  close(g, np.cos([0.0, 1.0]) + [2.0, 0.0], rtol=1e-6)
  with pytest.raises(ValueError, match="tree structure"):
    vjp_fn(tnp.ones(2))


def test_jvp_argument_errors():
  with pytest.raises(TypeError, match="tuples or lists"):
    tj.jvp(tnp.sin, tnp.ones(2), tnp.ones(2))
  with pytest.raises(ValueError, match="shapes"):
    tj.jvp(tnp.sin, (tnp.ones(2),), (tnp.ones(3),))
  with pytest.raises(TypeError, match="same tree structure"):
    tj.jvp(lambda a, b: a, (tnp.ones(2), tnp.ones(2)), (tnp.ones(2),))


def test_grad_errors_match_jax():
  with pytest.raises(TypeError, match=r"Gradient only defined for scalar-output functions. Output had shape: \(3,\)"):
    tj.grad(lambda x: x * 2)(tnp.ones(3))
  with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs .* but got int32"):
    tj.grad(lambda x: x * 2)(3)
  with pytest.raises(TypeError, match="but got int32"):
    tj.grad(lambda x: tnp.sum(x * 1.0))(tnp.arange(3))
  with pytest.raises(TypeError, match="real-valued outputs"):
    tj.grad(lambda x: (x > 0).astype(np.int32))(1.0)


# ---------------------------------------------------------------------------------------------- higher order

def test_higher_order_polynomial_and_sin():
  cube = lambda x: x * x * x  # noqa: E731
  assert float(tj.grad(tj.grad(cube))(2.0)) == 12.0
  assert float(tj.grad(tj.grad(tj.grad(cube)))(2.0)) == 6.0
  assert float(tj.grad(tj.grad(tj.grad(tj.grad(cube))))(2.0)) == 0.0
  poly = lambda x: 3 * x ** 4 - 2 * x ** 2 + x  # noqa: E731
  assert float(tj.grad(tj.grad(tj.grad(poly)))(1.5)) == pytest.approx(72 * 1.5)
  x = 0.7
  assert float(tj.grad(tj.grad(tnp.sin))(x)) == pytest.approx(-math.sin(x), rel=1e-6)
  assert float(tj.grad(tj.grad(tj.grad(tnp.sin)))(x)) == pytest.approx(-math.cos(x), rel=1e-6)
  assert float(tj.grad(tj.grad(tnp.exp))(x)) == pytest.approx(math.exp(x), rel=1e-6)
  assert float(tj.grad(tj.grad(tnp.tanh))(x)) == pytest.approx(-2 * math.tanh(x) * (1 - math.tanh(x) ** 2), rel=1e-5)


def test_higher_order_mixed_modes_and_hessian_vector_product():
  f = lambda x: tnp.sum(tnp.sin(x) * x ** 2)  # noqa: E731
  x, v = tnp.array([0.3, -1.1, 2.0]), tnp.array([1.0, 0.5, -0.25])
  _, hvp = tj.jvp(tj.grad(f), (x,), (v,))  # forward over reverse
  h = np.asarray(x, np.float64)
  hessian_diag = -np.sin(h) * h ** 2 + 4 * h * np.cos(h) + 2 * np.sin(h)
  close(hvp, hessian_diag * np.asarray(v), rtol=1e-5, atol=1e-6)
  reverse_over_forward = tj.grad(lambda x: tnp.vdot(tj.jvp(f, (x,), (v,))[1], 1.0))(x)
  close(reverse_over_forward, hvp, rtol=1e-5, atol=1e-6)
  d2 = tj.grad(lambda x, y: tj.grad(lambda x: tnp.sin(x * y))(x), argnums=1)(0.5, 2.0)
  assert float(d2) == pytest.approx(math.cos(1.0) - 1.0 * math.sin(1.0), rel=1e-6)  # d/dy (y cos(xy))


def test_python_control_flow_on_concrete_values():
  def f(x):
    if x > 0:
      y = x * x
    else:
      y = -x
    while y < 100.0:
      y = y * 2.0
    for _ in range(int(x) if x > 0 else 1):
      y = y + tnp.sin(x)
    return y
  assert float(tj.grad(f)(3.0)) == pytest.approx(2 * 3 * 16 + 3 * math.cos(3.0), rel=1e-6)  # 9 -> 144: 4 doublings
  assert float(tj.grad(f)(-2.0)) == pytest.approx(-64 + math.cos(-2.0), rel=1e-6)  # 2 -> 128: 6 doublings
  assert float(tj.grad(tj.grad(f))(3.0)) == pytest.approx(32 - 3 * math.sin(3.0), rel=1e-6)


def test_traced_control_flow_under_jit_and_escaped_tracers():
  with pytest.raises(tj.ConcretizationTypeError):
    tj.jit(tj.grad(lambda x: x if x > 0 else -x))(1.0)
  leaked = []
  tj.grad(lambda x: leaked.append(x * 2) or x)(1.0)
  with pytest.raises(tj.UnexpectedTracerError):
    leaked[0] + 1


# ---------------------------------------------------------------------------------------------- with jit

def _loss(w, x):
  return tnp.sum(tnp.tanh(x @ w) ** 2) + tnp.max(w)


def test_jit_of_grad_and_grad_of_jit_equal_grad():
  w = tnp.asarray(RNG.standard_normal((3, 2)).astype(np.float32))
  x = tnp.asarray(RNG.standard_normal((4, 3)).astype(np.float32))
  expected = np.asarray(tj.grad(_loss)(w, x))
  close(tj.jit(tj.grad(_loss))(w, x), expected, rtol=1e-5, atol=1e-6)
  close(tj.grad(tj.jit(_loss))(w, x), expected, rtol=1e-5, atol=1e-6)
  close(tj.jit(tj.grad(tj.jit(_loss)))(w, x), expected, rtol=1e-5, atol=1e-6)
  value, grads = tj.jit(tj.value_and_grad(_loss, argnums=(0, 1)))(w, x)
  close(value, _loss(w, x), rtol=1e-6)
  close(grads[0], expected, rtol=1e-5, atol=1e-6)
  assert float(tj.jit(tj.grad(tj.grad(lambda x: x * x * x)))(2.0)) == 12.0
  assert float(tj.grad(tj.jit(tj.grad(lambda x: tnp.sin(x) * x)))(1.0)) == pytest.approx(
    2 * math.cos(1.0) - math.sin(1.0), rel=1e-6)


def test_jvp_and_vjp_under_jit():
  f = lambda x: tnp.exp(x) * tnp.abs(x)  # noqa: E731
  x, t = tnp.array([0.0, -1.0, 2.0]), tnp.array([1.0, 2.0, 3.0])
  _, eager = tj.jvp(f, (x,), (t,))
  _, jitted = tj.jit(lambda x, t: tj.jvp(f, (x,), (t,)))(x, t)
  close(jitted, eager, rtol=1e-6)
  vjp_jitted = tj.jit(lambda x, ct: tj.vjp(f, x)[1](ct)[0])(x, t)
  close(vjp_jitted, tj.vjp(f, x)[1](t)[0], rtol=1e-6)


# ---------------------------------------------------------------------------------------------- whole programs

def _mlp_params(dtype):
  sizes = [(4, 8), (8, 8), (8, 3)]
  return {f"layer{i}": {"w": (RNG.standard_normal(s) / math.sqrt(s[0])).astype(dtype), "b": (0.1 * RNG.standard_normal(
    s[1])).astype(dtype)} for i, s in enumerate(sizes)}


def _log_softmax(logits):
  shifted = logits - lax.stop_gradient(tnp.max(logits, axis=-1, keepdims=True))
  return shifted - tnp.log(tnp.sum(tnp.exp(shifted), axis=-1, keepdims=True))


def _mlp_loss(params, x, labels):
  h = x
  for name in sorted(params):
    h = h @ params[name]["w"] + params[name]["b"]
    if name != "layer2": h = tnp.maximum(h, 0.0) * 0.9 + tnp.tanh(h) * 0.1
  return -tnp.mean(tnp.sum(labels * _log_softmax(h), axis=-1))


def _layer_norm_loss(params, x):
  mean = tnp.mean(x, axis=-1, keepdims=True)
  var = tnp.var(x, axis=-1, keepdims=True)
  y = (x - mean) * lax.rsqrt(var + 1e-5) * params["scale"] + params["bias"]
  return tnp.sum(y * tnp.cos(y))


def _finite_difference_check(loss, params, *args, eps=1e-6, rtol=1e-6, atol=1e-8):
  """The gradient against central differences along random directions (all leaves at once and each leaf alone)."""
  grads = tj.grad(loss)(params, *args)
  jitted_loss = tj.jit(loss)  # one compilation for all the shifted evaluations
  leaves, tree = tj.tree_util.tree_flatten(params)
  grad_leaves = tj.tree_util.tree_leaves(grads)
  for only in [None, *range(len(leaves))]:
    directions = [RNG.standard_normal(np.shape(leaf)) if only in (None, i) else np.zeros(np.shape(leaf))
                  for i, leaf in enumerate(leaves)]
    shifted = lambda sign: tj.tree_util.tree_unflatten(tree, [  # noqa: E731
      tnp.asarray(np.asarray(leaf) + sign * eps * d) for leaf, d in zip(leaves, directions)])
    difference = (float(jitted_loss(shifted(1), *args)) - float(jitted_loss(shifted(-1), *args))) / (2 * eps)
    predicted = sum(float(np.vdot(np.asarray(g), d)) for g, d in zip(grad_leaves, directions))
    assert predicted == pytest.approx(difference, rel=rtol, abs=atol)
  return grads


def _program_cases():
  x = RNG.standard_normal((5, 4))
  labels = np.eye(3)[RNG.integers(0, 3, 5)]
  ln_params = {"scale": RNG.uniform(0.5, 1.5, 6), "bias": 0.1 * RNG.standard_normal(6)}
  return [("mlp", _mlp_loss, _mlp_params(np.float64), (x, labels)),
          ("layer_norm", _layer_norm_loss, ln_params, (RNG.standard_normal((3, 6)),)),
          ("softmax_cross_entropy", lambda logits, labels: -tnp.sum(labels * _log_softmax(logits)),
           RNG.standard_normal((5, 3)) * 3, (labels,))]


@pytest.mark.parametrize("name,loss,params,args", _program_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_whole_programs_against_finite_differences_and_float32(name, loss, params, args):
  with tj.config.override("jax_enable_x64", True):
    params64 = tj.tree_util.tree_map(tnp.asarray, params)
    args64 = tuple(tnp.asarray(a) for a in args)
    grads64 = _finite_difference_check(loss, params64, *args64)
    assert all(g.dtype == np.float64 for g in tj.tree_util.tree_leaves(grads64))
    value64 = float(loss(params64, *args64))
  params32 = tj.tree_util.tree_map(lambda p: tnp.asarray(np.asarray(p, np.float32)), params)
  args32 = tuple(tnp.asarray(np.asarray(a, np.float32)) for a in args)
  value32, grads32 = tj.value_and_grad(loss)(params32, *args32)
  assert float(value32) == pytest.approx(value64, rel=1e-5, abs=1e-6)
  for g32, g64 in zip(tj.tree_util.tree_leaves(grads32), tj.tree_util.tree_leaves(grads64)):
    assert g32.dtype == np.float32
    close(g32, g64, rtol=1e-4, atol=1e-5)
  jitted_value, jitted_grads = tj.jit(tj.value_and_grad(loss))(params32, *args32)
  assert float(jitted_value) == pytest.approx(float(value32), rel=1e-6)
  for a, b in zip(tj.tree_util.tree_leaves(jitted_grads), tj.tree_util.tree_leaves(grads32)):
    close(a, b, rtol=1e-5, atol=1e-6)


def test_softmax_cross_entropy_gradient_is_softmax_minus_labels():
  logits = tnp.asarray(np.array([[2.0, 1.0, 0.1], [0.0, 0.0, 50.0]], np.float32))
  labels = tnp.asarray(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], np.float32))
  g = tj.grad(lambda z: -tnp.sum(labels * _log_softmax(z)))(logits)
  z = np.asarray(logits, np.float64)
  softmax = np.exp(z - z.max(-1, keepdims=True))
  softmax /= softmax.sum(-1, keepdims=True)
  close(g, softmax - np.asarray(labels), rtol=1e-5, atol=1e-6)
