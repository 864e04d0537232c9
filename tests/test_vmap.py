"""vmap: every Op family against a Python loop over the batch (stacked with numpy), in_axes/out_axes variants,
axis_size, nested vmap, composition with jit and grad in every order, collectives over axis names, and errors."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax
from tinyjax.trace import ad
from tinyjax.trace.ad import stop_gradient_p
from tinyjax.trace.batching import axis_index, defelementwise, defreduction, pmax, pmean, psum, vmap
from tinyjax.trace.core import Primitive, bind
from tinyjax.uop import Ops

B = 3  # batch size everywhere: kernels compile once per structure, so shared shapes keep the file fast
rng = np.random.default_rng(0)
X = rng.standard_normal((B, 4, 5)).astype(np.float32)
Y = rng.standard_normal((B, 4, 5)).astype(np.float32)
XI = rng.integers(-20, 20, (B, 4, 5)).astype(np.int32)
YI = rng.integers(1, 6, (B, 4, 5)).astype(np.int32)


def loop(f, *args, in_axes=0):
  """The reference: f on each example (sliced with numpy), results stacked along axis 0."""
  axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
  size = next(np.shape(a)[ax] for a, ax in zip(args, axes) if ax is not None)
  outs = [f(*(a if ax is None else np.take(a, i, axis=ax) for a, ax in zip(args, axes))) for i in range(size)]
  return np.stack([np.asarray(o) for o in outs])


def check(f, *args, in_axes=0, rtol=1e-5, atol=1e-6):
  out = vmap(f, in_axes=in_axes)(*args)
  expected = loop(f, *args, in_axes=in_axes)
  assert out.shape == expected.shape and out.dtype == expected.dtype, (out.shape, out.dtype, expected.shape)
  np.testing.assert_allclose(np.asarray(out), expected, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------------------ op families

@pytest.mark.parametrize("fn", [tnp.sin, tnp.exp, tnp.negative, tnp.abs, tnp.floor, tnp.tanh, tnp.reciprocal,
                                lambda x: tnp.sqrt(tnp.abs(x)), lambda x: tnp.log(tnp.abs(x) + 1)],
                         ids=["sin", "exp", "neg", "abs", "floor", "tanh", "recip", "sqrt", "log"])
def test_unary(fn):
  check(fn, X)


@pytest.mark.parametrize("fn", [tnp.add, tnp.multiply, tnp.maximum, tnp.divide, tnp.less, tnp.not_equal,
                                lambda a, b: tnp.power(tnp.abs(a), b)],
                         ids=["add", "mul", "max", "div", "lt", "ne", "pow"])
@pytest.mark.parametrize("case", ["both", "lhs", "rhs", "mixed-dims"])
def test_binary_float(fn, case):
  in_axes, x, y = {"both": (0, X, Y), "lhs": ((0, None), X, Y[0]), "rhs": ((None, 0), X[0], Y),
                   "mixed-dims": ((0, 1), X, np.moveaxis(Y, 0, 1))}[case]
  check(fn, x, y, in_axes=in_axes)


@pytest.mark.parametrize("fn", [tnp.floor_divide, tnp.remainder, tnp.bitwise_and, tnp.bitwise_xor, tnp.left_shift,
                                tnp.right_shift, lambda a, b: a // 3 + b % 2],
                         ids=["floordiv", "mod", "and", "xor", "shl", "shr", "scalars"])
def test_binary_int(fn):
  check(fn, XI, YI)


def test_where_with_each_operand_batched_or_not():
  cond = X > 0
  f = lambda c, a, b: tnp.where(c, a, b)
  check(f, cond, X, Y)
  check(f, cond, X[0], Y[0], in_axes=(0, None, None))
  check(f, cond[0], X, Y[0], in_axes=(None, 0, None))
  check(f, cond, X[0], np.moveaxis(Y, 0, 2), in_axes=(0, None, 2))


def test_casts_and_bitcast():
  check(lambda x: x.astype(tnp.int32), X * 10)
  check(lambda x: x.astype(tnp.bool_), XI)
  check(lambda x: x.astype(tnp.float16), X)
  check(lambda x: lax.bitcast_convert_type(x, tnp.int32), X)


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1), -1])
def test_reductions(axis):
  check(lambda x: tnp.sum(x, axis=axis), X)
  check(lambda x: tnp.max(x, axis=axis, keepdims=True), X)
  check(lambda x: tnp.prod(x, axis=axis), X)
  check(lambda x: tnp.mean(x, axis=axis), X, in_axes=2)


def test_argmax_and_integer_sums():
  check(lambda x: tnp.argmax(x, axis=1), X)
  check(lambda x: tnp.sum(x, axis=0), XI)


@pytest.mark.parametrize("fn", [
  lambda x: x.reshape(20), lambda x: x.reshape(2, 10), lambda x: x.T, lambda x: tnp.transpose(x[None], (2, 0, 1)),
  lambda x: tnp.broadcast_to(x[:, None], (4, 3, 5)), lambda x: tnp.pad(x, ((1, 2), (0, 3))),
  lambda x: x[1:3, ::2], lambda x: x[::-1, 2], lambda x: tnp.flip(x, 1), lambda x: tnp.concatenate([x, x * 2], 1),
  lambda x: tnp.expand_dims(x, 0).squeeze(0), lambda x: tnp.stack([x, -x], -1), lambda x: x[..., None, 1:]],
  ids=["flatten", "reshape", "T", "permute", "expand", "pad", "shrink", "flip-index", "flip", "concat", "squeeze",
       "stack", "newaxis"])
@pytest.mark.parametrize("in_axis", [0, 2])
def test_movement(fn, in_axis):
  check(fn, np.moveaxis(X, 0, in_axis), in_axes=in_axis)


def test_matmul_dot_softmax():
  w = rng.standard_normal((5, 2)).astype(np.float32)
  check(lambda x, w: x @ w, X, w, in_axes=(0, None))
  check(lambda x, w: x @ w, X[0], np.stack([w] * B) + 1, in_axes=(None, 0))
  check(lambda x, y: tnp.dot(x, y.T), X, Y)
  check(lambda x, y: tnp.dot(x[0], y[1]), X, np.moveaxis(Y, 0, 2), in_axes=(0, 2))

  def softmax(x):
    shifted = x - tnp.max(x, axis=-1, keepdims=True)
    return tnp.exp(shifted) / tnp.sum(tnp.exp(shifted), axis=-1, keepdims=True)
  check(softmax, X)
  check(softmax, X, in_axes=1)


def test_unbatched_operations_run_unbatched_and_python_control_flow_on_them_works():
  def f(x, scale):
    if scale > 1.0: return x * scale  # scale is unbatched: a concrete value
    return x - scale
  np.testing.assert_allclose(np.asarray(vmap(f, in_axes=(0, None))(X, 2.0)), X * 2, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(vmap(f, in_axes=(0, None))(X, 0.5)), X - 0.5, rtol=1e-6)
  with pytest.raises(tj.ConcretizationTypeError, match="vmap"):
    vmap(lambda x: x if x.sum() > 0 else -x)(X)


# ------------------------------------------------------------------------------------------------------ axes

def test_in_axes_negative_none_and_kwargs():
  check(lambda x: x * 2, np.moveaxis(X, 0, -1), in_axes=-1)
  out = vmap(lambda x, y: x + y, in_axes=(-2, None))(np.moveaxis(X, 0, 1), Y[0])
  np.testing.assert_allclose(np.asarray(out), X + Y[0], rtol=1e-6)
  out = vmap(lambda x, *, y: x - y)(X, y=Y)  # keyword arguments are mapped over axis 0, as JAX
  np.testing.assert_allclose(np.asarray(out), X - Y, rtol=1e-6)
  out = vmap(lambda x, y: x * y, in_axes=[0, None])(X, 3.0)  # a list is a tuple here, as JAX
  np.testing.assert_allclose(np.asarray(out), X * 3, rtol=1e-6)


def test_in_axes_pytree_prefixes():
  params = {"w": X, "b": Y[0, 0]}
  f = lambda p, xs: p["w"] * xs[0] + p["b"] + xs[1]
  out = vmap(f, in_axes=({"w": 0, "b": None}, [1, None]))(params, [np.moveaxis(Y, 0, 1), 1.0])
  np.testing.assert_allclose(np.asarray(out), X * Y + Y[0, 0] + 1.0, rtol=1e-6)
  out = vmap(lambda p: p["a"] + p["b"][0], in_axes=({"a": 0, "b": 1},))({"a": X, "b": (np.moveaxis(Y, 0, 1),)})
  np.testing.assert_allclose(np.asarray(out), X + Y, rtol=1e-6)


def test_out_axes_variants():
  f = lambda x: (x * 2, {"s": x.sum(0), "c": tnp.ones(2)})
  out = vmap(f, out_axes=(1, {"s": -1, "c": None}))(X)
  assert out[0].shape == (4, B, 5) and out[1]["s"].shape == (5, B) and out[1]["c"].shape == (2,)
  np.testing.assert_allclose(np.asarray(out[0]), np.moveaxis(X * 2, 0, 1), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(out[1]["s"]), X.sum(1).T, rtol=1e-5)
  # an unbatched output with an integer out_axes is broadcast along the mapped axis
  out = vmap(lambda x: (x, tnp.arange(4.0)), out_axes=(0, 1))(X)
  np.testing.assert_allclose(np.asarray(out[1]), np.broadcast_to(np.arange(4.0)[:, None], (4, B)))
  assert vmap(lambda x: x.sum(), out_axes=-1)(X).shape == (B,)


def test_axis_size_without_mapped_inputs():
  out = vmap(lambda c: c * 2.0, in_axes=None, axis_size=4)(1.5)
  np.testing.assert_allclose(np.asarray(out), np.full(4, 3.0))
  out = vmap(lambda: tnp.zeros(2), axis_size=3)()
  assert out.shape == (3, 2)
  np.testing.assert_allclose(np.asarray(vmap(lambda x: x + 1, axis_size=B)(X)), X + 1)


def test_nested_vmap():
  a, b = X[:, 0], Y[:, :, 0].T  # (B, 5) and (4, B)
  outer = vmap(vmap(lambda u, v: u * v, in_axes=(0, None)), in_axes=(None, 0))(a[0], b[:, 0])
  np.testing.assert_allclose(np.asarray(outer), b[:, 0][:, None] * a[0][None, :], rtol=1e-6)
  # both axes batched, different in_axes: out[i, j] = f(X[i, :, j], Y[j][i]) for X (B, 4, 5), Y' (5, B, 4)
  f = lambda u, v: tnp.dot(u, v) + u.max()
  yt = np.moveaxis(Y, 2, 0)  # (5, B, 4)
  out = vmap(vmap(f, in_axes=(1, 0)), in_axes=(0, 1))(X, yt)
  expected = np.array([[np.dot(X[i, :, j], yt[j, i]) + X[i, :, j].max() for j in range(5)] for i in range(B)])
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5)
  # the inner vmap closes over a value of the outer one
  out = vmap(lambda x: vmap(lambda row: row * x.sum())(x))(X)
  np.testing.assert_allclose(np.asarray(out), X * X.sum((1, 2), keepdims=True), rtol=1e-5)


# ------------------------------------------------------------------------------------------------------ composition

def loss(w, x):
  hidden = tnp.sin(x @ w["w1"] + w["b1"])
  return tnp.sum(tnp.log1p(hidden * hidden)) + tnp.max(hidden)


W = {"w1": rng.standard_normal((5, 3)).astype(np.float32), "b1": rng.standard_normal(3).astype(np.float32)}
XS = X[:, 0]  # (B, 5): one example per row


def per_example_grads_loop():
  grads = [tj.grad(loss)(W, x) for x in XS]
  return {k: np.stack([np.asarray(g[k]) for g in grads]) for k in W}


def assert_trees_close(got, expected, rtol=1e-5, atol=1e-6):
  for k in expected: np.testing.assert_allclose(np.asarray(got[k]), expected[k], rtol=rtol, atol=atol)


def test_grad_matches_finite_differences_in_float64():
  with tj.config.override("jax_enable_x64", True):
    w64 = {k: v.astype(np.float64) for k, v in W.items()}
    x64 = XS[0].astype(np.float64)
    g = tj.grad(loss)(w64, x64)
    eps = 1e-6
    for k in w64:
      for index in [(0,) * w64[k].ndim, (-1,) * w64[k].ndim]:
        plus, minus = {kk: vv.copy() for kk, vv in w64.items()}, {kk: vv.copy() for kk, vv in w64.items()}
        plus[k][index] += eps
        minus[k][index] -= eps
        numeric = (float(loss(plus, x64)) - float(loss(minus, x64))) / (2 * eps)
        assert abs(float(np.asarray(g[k])[index]) - numeric) < 1e-6 * max(1.0, abs(numeric))
    per_example = vmap(tj.grad(loss), in_axes=(None, 0))(w64, XS.astype(np.float64))
    assert per_example["w1"].dtype == np.float64
    np.testing.assert_allclose(np.asarray(per_example["w1"])[0], np.asarray(g["w1"]), rtol=1e-12)


def test_vmap_of_grad_per_example_gradients():
  expected = per_example_grads_loop()
  assert_trees_close(vmap(tj.grad(loss), in_axes=(None, 0))(W, XS), expected)
  assert_trees_close(tj.jit(vmap(tj.grad(loss), in_axes=(None, 0)))(W, XS), expected)
  assert_trees_close(vmap(tj.jit(tj.grad(loss)), in_axes=(None, 0))(W, XS), expected)
  assert_trees_close(vmap(tj.grad(tj.jit(loss)), in_axes=(None, 0))(W, XS), expected)


def test_grad_of_vmap_and_jit_of_vmap():
  batch_loss = lambda w: vmap(loss, in_axes=(None, 0))(w, XS).sum()
  expected = {k: v.sum(0) for k, v in per_example_grads_loop().items()}
  assert_trees_close(tj.grad(batch_loss)(W), expected, rtol=1e-4)
  assert_trees_close(tj.jit(tj.grad(batch_loss))(W), expected, rtol=1e-4)
  out = tj.jit(vmap(loss, in_axes=(None, 0)))(W, XS)
  np.testing.assert_allclose(np.asarray(out), [float(loss(W, x)) for x in XS], rtol=1e-5)
  # grad with respect to the batched argument: the gradient of the sum is each example's gradient
  gx = tj.grad(lambda xs: vmap(loss, in_axes=(None, 0))(W, xs).sum())(XS)
  np.testing.assert_allclose(np.asarray(gx), np.stack([np.asarray(tj.grad(loss, 1)(W, x)) for x in XS]), rtol=1e-5)


def test_jvp_under_vmap_and_vmap_under_jvp():
  f = lambda x: tnp.sin(x) * x
  t = np.ones_like(X)
  out, tangent = vmap(lambda x, t: tj.jvp(f, (x,), (t,)))(X, t)
  np.testing.assert_allclose(np.asarray(tangent), np.cos(X) * X + np.sin(X), rtol=1e-5)
  out, tangent = tj.jvp(vmap(f), (X,), (t,))
  np.testing.assert_allclose(np.asarray(tangent), np.cos(X) * X + np.sin(X), rtol=1e-5)


def test_hessian_diagonal_by_vmap_of_grad_of_grad():
  xs = np.linspace(-1, 1, 5).astype(np.float32)
  out = vmap(tj.grad(tj.grad(lambda x: x * x * x)))(xs)
  np.testing.assert_allclose(np.asarray(out), 6 * xs, rtol=1e-5)


def test_stop_gradient_under_vmap_inside_grad():
  f = lambda xs: vmap(lambda x: x * stop_gradient_p.bind(x))(xs).sum()  # (lax.stop_gradient is still the identity)
  np.testing.assert_allclose(np.asarray(tj.grad(f)(XS)), XS, rtol=1e-6)


def test_primitives_keep_their_rules_under_vmap():
  # a primitive whose JVP rule (3 * t) is not the derivative of its decomposition (x): outer traces must see it
  triple_grad_p = Primitive("triple_grad", lambda x: x * 1.0)
  ad.jvp_rules[triple_grad_p] = lambda primals, tangents, out: tangents[0] * 3.0
  f = lambda xs: vmap(lambda x, c: triple_grad_p.bind(x) + triple_grad_p.bind(c), in_axes=(0, None))(xs, 1.0).sum()
  with pytest.raises(AssertionError):  # without a batching rule the batched call runs the decomposition
    np.testing.assert_allclose(np.asarray(tj.grad(f)(XS[:, 0])), np.full(B, 3.0))
  defelementwise(triple_grad_p)
  np.testing.assert_allclose(np.asarray(tj.grad(f)(XS[:, 0])), np.full(B, 3.0))
  np.testing.assert_allclose(np.asarray(vmap(tj.grad(lambda x: triple_grad_p.bind(x)))(XS[:, 0])), np.full(B, 3.0))
  # unbatched under vmap, the primitive reaches the outer trace even without a rule of its own
  plain_p = Primitive("plain", lambda x: x * 1.0)
  ad.jvp_rules[plain_p] = lambda primals, tangents, out: tangents[0] * 3.0
  g = lambda c: vmap(lambda x: x + plain_p.bind(c))(XS[:, 0]).sum()
  np.testing.assert_allclose(float(tj.grad(g)(2.0)), 3.0 * B)


def test_reduction_primitive_rule():
  def impl(x, *, axes, keepdims=False):
    out = bind(Ops.REDUCE_AXIS, x, arg=(Ops.ADD, tuple(axes)))
    return out if keepdims else out.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))
  my_sum_p = Primitive("my_sum", impl)
  defreduction(my_sum_p)
  for axes, keepdims in [((0,), False), ((1,), True), ((0, 1), False), ((1,), False)]:
    f = lambda x: my_sum_p.bind(tnp.asarray(x), axes=axes, keepdims=keepdims)
    for in_axis in (0, 1, 2):
      check(f, np.moveaxis(X, 0, in_axis), in_axes=in_axis, rtol=1e-5)


def test_make_jaxpr_of_vmap_has_no_transposes_for_aligned_operands():
  jaxpr = tj.make_jaxpr(vmap(lambda x, y: tnp.sin(x) + y * 2))(X, Y)
  assert "permute" not in str(jaxpr)


# ------------------------------------------------------------------------------------------------------ collectives

def test_psum_pmean_pmax_axis_index():
  out = vmap(lambda x: x / psum(x, "i"), axis_name="i")(X)
  np.testing.assert_allclose(np.asarray(out), X / X.sum(0), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(vmap(lambda x: x - pmean(x, "i"), axis_name="i")(X)), X - X.mean(0),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(vmap(lambda x: pmax(x, "i"), axis_name="i")(X)),
                             np.broadcast_to(X.max(0), X.shape))
  np.testing.assert_array_equal(np.asarray(vmap(lambda x: axis_index("i"), axis_name="i")(X)), np.arange(B))
  assert int(vmap(lambda x: psum(1, "i"), axis_name="i", out_axes=None)(X)) == B
  assert vmap(lambda x: pmean(tnp.sum(x > 0), "i"), axis_name="i")(X).dtype == np.float32


def test_collectives_with_nested_vmaps_jit_and_grad():
  # psum over the outer axis from inside the inner vmap
  f = vmap(vmap(lambda x: x - psum(x, "rows"), axis_name="cols"), axis_name="rows")
  np.testing.assert_allclose(np.asarray(f(X[:, 0])), X[:, 0] - X[:, 0].sum(0), rtol=1e-5, atol=1e-6)
  g = vmap(vmap(lambda x: psum(x, ("rows", "cols")), axis_name="cols"), axis_name="rows")
  np.testing.assert_allclose(np.asarray(g(X[:, 0])), np.full((B, 5), X[:, 0].sum()), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.jit(vmap(lambda x: x / psum(x, "i"), axis_name="i"))(X)), X / X.sum(0),
                             rtol=1e-5)
  # grad of a vmapped function using psum, against the formula: d/dx sum_i (x_i / s)^2 with s = sum x
  h = lambda xs: tnp.sum(vmap(lambda x: (x / psum(x, "i")) ** 2, axis_name="i")(xs))
  xs = np.array([1.0, 2.0, 3.0], np.float32)
  s, sq = xs.sum(), (xs ** 2).sum()
  np.testing.assert_allclose(np.asarray(tj.grad(h)(xs)), 2 * xs / s ** 2 - 2 * sq / s ** 3, rtol=1e-5)
  # jvp inside vmap goes through psum's JVP rule
  _, tangent = vmap(lambda x: tj.jvp(lambda y: psum(y * y, "i"), (x,), (1.0,)), axis_name="i")(xs)
  np.testing.assert_allclose(np.asarray(tangent), np.full(3, 2 * xs.sum()), rtol=1e-5)


def test_collective_errors():
  with pytest.raises(NameError, match="unbound axis name: j"):
    vmap(lambda x: psum(x, "j"), axis_name="i")(X)
  with pytest.raises(NameError, match="unbound axis name: i"):
    psum(X, "i")


# ------------------------------------------------------------------------------------------------------ errors

def test_inconsistent_sizes_name_the_sizes():
  with pytest.raises(ValueError, match="vmap got inconsistent sizes for array axes to be mapped") as info:
    vmap(lambda x, y: x + y)(X, np.ones((4, 5), np.float32))
  assert "size 3" in str(info.value) and "size 4" in str(info.value) and "argument x" in str(info.value)
  with pytest.raises(ValueError, match="most axes|some axes"):
    vmap(lambda a, b, c: a)(X, Y, np.ones(2))
  with pytest.raises(ValueError, match="inconsistent sizes"):
    vmap(lambda x: x, axis_size=5)(X)


def test_bad_axes():
  with pytest.raises(ValueError, match="rank should be at least 4, but is only 3"):
    vmap(lambda x: x, in_axes=3)(X)
  with pytest.raises(ValueError, match="rank should be at least 4"):
    vmap(lambda x: x, in_axes=-4)(X)
  with pytest.raises(ValueError, match=r"len\(in_axes\)=2, len\(args\)=1"):
    vmap(lambda x: x, in_axes=(0, 0))(X)
  with pytest.raises(ValueError, match="vmap in_axes specification must be a tree prefix"):
    vmap(lambda p: p["a"], in_axes=({"a": 0, "b": 0},))({"a": X})
  with pytest.raises(TypeError, match="vmap in_axes must be an int, None, or"):
    vmap(lambda x: x, in_axes={"a": 0})
  with pytest.raises(TypeError, match="vmap in_axes must be an int, None, or"):
    vmap(lambda x: x, in_axes=(0.5,))
  with pytest.raises(ValueError, match="at least one non-None value in in_axes"):
    vmap(lambda x: x, in_axes=None)(X)
  with pytest.raises(ValueError, match="mapped output but out_axes is None"):
    vmap(lambda x: x, out_axes=None)(X)
  with pytest.raises(ValueError, match="out of bounds"):
    vmap(lambda x: x, out_axes=4)(X)
  with pytest.raises(ValueError, match="vmap out_axes specification must be a tree prefix"):
    vmap(lambda x: x, out_axes=(0, 0))(X)


def test_escaped_batch_tracer():
  leaked = []
  vmap(lambda x: leaked.append(x) or x)(X)
  with pytest.raises(tj.UnexpectedTracerError):
    leaked[0] + 1


@pytest.mark.parametrize("name", ["tanh", "abs", "relu", "clip", "maximum", "sqrt", "logsumexp"])
def test_grad_of_vmap_keeps_named_primitive_rules(name):
  import tinyjax.nn as nn
  fns = {"tanh": tnp.tanh, "abs": tnp.abs, "relu": nn.relu, "clip": lambda v: tnp.clip(v, 0.0, 0.5),
         "maximum": lambda v: tnp.maximum(v, 0.5), "sqrt": lambda v: tnp.sqrt(v * v + 1.0),
         "logsumexp": lambda v: nn.logsumexp(tnp.stack([v, v * 2.0]))}
  f = fns[name]
  x = np.array([-1.0, 0.0, 0.5, 2.0], np.float32)
  through_vmap = tj.grad(lambda v: tj.vmap(f)(v).sum())(x)
  per_example = tj.vmap(tj.grad(f))(x)
  loop = np.array([float(tj.grad(f)(float(v))) for v in x], np.float32)
  np.testing.assert_allclose(np.asarray(through_vmap), loop, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(per_example), loop, rtol=1e-6)
