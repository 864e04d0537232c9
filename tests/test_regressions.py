"""Wrong answers found by random programs (issue 6 and `tests/fuzz`), one named test each.

Every case runs three ways, eagerly, under `jit` and under `vmap`, and checks dtype, weak type and values against a
float64 numpy reference and the answer JAX 0.10 gives.
"""
import ml_dtypes
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp

BF16 = np.dtype(ml_dtypes.bfloat16)
F32, I32, BOOL = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.bool_)


def three_ways(fun, *args):
  """fun(*args) eagerly, under jit, and as slice 1 of a vmap over two copies of the strongly typed array arguments
  (weak arguments stay unbatched, so their weak type reaches `fun`)."""
  batched = [isinstance(a, tj.Array) and not a.weak_type for a in args]
  stacked = [tnp.stack([tnp.zeros_like(a), a]) if b else a for a, b in zip(args, batched)]
  in_axes = tuple(0 if b else None for b in batched)
  vmapped = tj.vmap(fun, in_axes=in_axes, axis_size=2)(*stacked)
  return {"eager": fun(*args), "jit": tj.jit(fun)(*args), "vmap": vmapped[1]}


def check(fun, args, dtype, weak, expected, rtol=1e-6):
  for how, got in three_ways(fun, *args).items():
    assert got.dtype == dtype, (how, got.dtype, dtype)
    assert got.weak_type == weak, (how, got.weak_type, weak)
    np.testing.assert_allclose(np.asarray(got).astype(np.float64), np.asarray(expected, np.float64), rtol=rtol,
                               err_msg=how)


INTS = np.array([3, -2, 7], np.int32)
BOOLS = np.array([True, False, True])


# ------------------------------------------------------------------------------------ float-only functions of ints

FLOAT_ONLY = {
  "reciprocal": lambda v: 1 / v, "sqrt": np.sqrt, "cbrt": np.cbrt, "exp": np.exp, "exp2": np.exp2,
  "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sin": np.sin,
  "cos": np.cos, "tan": np.tan, "arctan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
  "arcsinh": np.arcsinh, "deg2rad": np.deg2rad, "rad2deg": np.rad2deg, "fabs": np.fabs, "rint": np.rint,
}


@pytest.mark.parametrize("name", sorted(FLOAT_ONLY))
@pytest.mark.parametrize("host", [np.array([3, 2, 7], np.int32), np.array([1, 4, 9], np.uint8), BOOLS],
                         ids=["int32", "uint8", "bool"])
def test_float_only_functions_promote_ints_and_bools(name, host):
  """reciprocal([3]) was [0] (int32): functions that are float-only in JAX promote ints and bools to float32."""
  with np.errstate(divide="ignore"):
    expected = FLOAT_ONLY[name](host.astype(np.float64))
  check(getattr(tnp, name), [tnp.asarray(host)], F32, False, expected, rtol=3e-6)


def test_float_only_functions_of_weak_ints_stay_weak():
  check(tnp.reciprocal, [tnp.asarray(4)], F32, True, 0.25)
  check(tnp.sqrt, [tnp.asarray(4)], F32, True, 2.0)
  # except where JAX builds the result with a strongly typed constant
  check(tnp.log2, [tnp.asarray(8)], F32, False, 3.0)
  check(tnp.rint, [tnp.asarray(8)], F32, False, 8.0)


# ------------------------------------------------------------------------------------ weak types flow through ops

def test_int_times_python_float_is_weak_and_defers_to_bfloat16():
  """(i32 * 1.5) + bf16 was float32: the weak float32 product must stay weak, so bfloat16 wins."""
  ints, halves = tnp.asarray(INTS), tnp.asarray(np.array([0.5, 1.0, 2.0], BF16))
  check(lambda i: i * 1.5, [ints], F32, True, INTS * 1.5)
  check(lambda i, h: (i * 1.5) + h, [ints, halves], BF16, False, INTS * 1.5 + [0.5, 1.0, 2.0], rtol=4e-3)


def test_weak_floats_from_bools_and_ints():
  """maximum(0.5, b), where(c, 0.3, i) and sqrt(b + 3) lost their weak type."""
  bools, ints = tnp.asarray(BOOLS), tnp.asarray(INTS)
  check(lambda b: tnp.maximum(0.5, b), [bools], F32, True, [1.0, 0.5, 1.0])
  check(lambda b, i: tnp.where(b, 0.3, i), [bools, ints], F32, True, [0.3, -2.0, 0.3])
  check(lambda b: tnp.sqrt(b + 3), [bools], F32, True, np.sqrt([4.0, 3.0, 4.0]))
  check(lambda b: b + 3, [bools], I32, True, [4, 3, 4])
  # ... and the weak result then defers to a narrower array, as in JAX
  check(lambda b: tnp.maximum(0.5, b) + tnp.ones(3, tnp.float16), [bools], np.dtype(np.float16), False,
        [2.0, 1.5, 2.0])


def test_reductions_of_weak_values_are_strong():
  weak = tnp.asarray(3.0)
  for reduce in (tnp.sum, tnp.mean, tnp.max, tnp.min, tnp.prod):
    check(reduce, [weak], F32, False, 3.0)


# ------------------------------------------------------------------------------------ bools count as ints

def test_square_and_integer_powers_of_bools_are_int32():
  bools = tnp.asarray(BOOLS)
  check(tnp.square, [bools], I32, False, [1, 0, 1])
  check(lambda b: b ** 2, [bools], I32, False, [1, 0, 1])
  check(lambda b: b ** True, [bools], I32, False, [1, 0, 1])
  check(lambda b: b ** b, [bools], I32, False, [1, 1, 1])
  check(lambda b: -tnp.square(b), [bools], I32, False, [-1, 0, -1])
  check(lambda b: b * b, [bools], BOOL, False, BOOLS)  # multiply stays logical


def test_sign_and_negative_of_bools_raise_type_error():
  bools = tnp.asarray(BOOLS)
  for fun in (tnp.sign, tnp.negative, lambda b: b - b):
    with pytest.raises(TypeError):
      fun(bools)


def test_floor_divide_remainder_and_shifts_of_bools_are_int32():
  bools = tnp.asarray(BOOLS)
  ones = tnp.asarray(np.array([True, True, True]))
  check(lambda b, o: b // o, [bools, ones], I32, False, [1, 0, 1])
  check(lambda b, o: b % o, [bools, ones], I32, False, [0, 0, 0])
  check(lambda b, o: tnp.left_shift(b, o), [bools, ones], I32, False, [2, 0, 2])
  check(lambda b, o: tnp.right_shift(b, o), [bools, ones], I32, False, [0, 0, 0])


def test_integer_remainder_by_zero_is_zero_and_shifts_out_of_range_fill():
  """JAX defines integer `%` and fmod by zero as 0; an arithmetic right shift by a negative amount fills with the
  sign bit (it was the unshifted value)."""
  ints, zeros = tnp.asarray(INTS), tnp.zeros(3, tnp.int32)
  check(lambda x, y: x % y, [ints, zeros], I32, False, [0, 0, 0])
  check(tnp.fmod, [ints, zeros], I32, False, [0, 0, 0])
  check(lambda x: x >> tnp.asarray(np.array([-2, -2, 40], np.int32)), [ints], I32, False, [0, -1, 0])


def test_integer_power_with_negative_static_exponent_is_a_type_error():
  with pytest.raises(TypeError, match="negative powers"):
    tnp.asarray(INTS) ** -1


# ------------------------------------------------------------------------------------ lowering crashes

def test_where_with_one_buffer_on_both_branches():
  """where(c <= 1.0, s, s) crashed in codegen (DEFINE_GLOBAL indices [0, 2]): simplification removed the only load
  of `c`, and the kernel's parameters kept a hole."""
  c = tnp.asarray(np.array([[0.5, 2.0, 1.0]], np.float32))
  s = tnp.asarray(np.float32(2.0))
  check(lambda c, s: tnp.where(c <= 1.0, s, s), [c, s], F32, False, [[2.0, 2.0, 2.0]])
  check(lambda c, s: tnp.where(c <= 1.0, s.reshape(1, 1), s.reshape(1)), [c, s], F32, False, [[2.0, 2.0, 2.0]])
  check(lambda c, x: tnp.where(c > 0, x, x) + c, [c, c], F32, False, [[1.0, 4.0, 2.0]])


def test_zero_size_values_inside_kernels():
  """Index folding divided by a zero extent (ZeroDivisionError) when a kernel read an empty value through a pad."""
  check(lambda z: tnp.pad(z.reshape(3, 0), ((1, 0), (0, 1))), [tnp.zeros((0, 1))], F32, False, np.zeros((4, 1)))
  grad = tj.grad(lambda a: a[::2, 1:].sum())
  check(grad, [tnp.ones((4, 1))], F32, False, np.zeros((4, 1)))
  check(lambda x: tnp.concatenate([x[:, :0], x], axis=1) * 2, [tnp.ones((2, 3))], F32, False, 2 * np.ones((2, 3)))


def test_transpose_with_a_repeated_axis_is_a_type_error():
  for transpose in (tnp.transpose, tj.lax.transpose):
    with pytest.raises(TypeError, match="permutation"):
      transpose(tnp.ones((2, 2)), (0, 0))


def test_python_ints_wrap_into_narrow_integer_dtypes():
  """uint8_array + 300 raised OverflowError; JAX checks the int fits int32, then wraps it into uint8 (300 -> 44)."""
  small = tnp.asarray(np.array([1, 2, 250], np.uint8))
  check(lambda x: x + 300, [small], np.dtype(np.uint8), False, [45, 46, 38])
  check(lambda x: tnp.where(x > 1, x, -1), [small], np.dtype(np.uint8), False, [255, 2, 250])
  check(lambda x: x < 300, [small], BOOL, False, [True, True, False])
  for too_large in (lambda: tnp.negative(2**40), lambda: tnp.sqrt(2**40), lambda: tj.lax.add(small, 2**40)):
    with pytest.raises(OverflowError):
      too_large()


def test_gradients_and_products_keep_weak_types():
  """grad of a Python float was a strong float32 (JAX: the cotangent has its primal's weak type); dot of weak
  values was strong."""
  grad = tj.grad(lambda x: x * 2.0)(3.0)
  assert grad.dtype == F32 and grad.weak_type and float(grad) == 2.0
  assert not tj.grad(lambda x: x * 2.0)(tnp.float32(3.0)).weak_type
  weak = tnp.broadcast_to(tnp.asarray(2.0), (3,))
  check(lambda w: tnp.dot(w, w), [weak], F32, True, 12.0)
  # (a zero gradient too: an unused Python float's, a custom rule's point, JAX's docs' `Point(1., 2.)`)
  unused = tj.grad(lambda p: tnp.sin(p[0]))((1.0, 2.0, tnp.float32(3.0), tnp.ones(2)))
  assert [g.weak_type for g in unused] == [True, True, False, False] and float(unused[1]) == 0.0
  assert tj.jvp(lambda x, y: (x, 3.0 * y), (1.0, 2.0), (1.0, 0.0))[1][1].weak_type
  assert tj.vjp(lambda x, y: x, 1.0, 2.0)[1](tnp.float32(1.0))[1].weak_type
  check(lambda w: tnp.dot(w, w) + tnp.ones((), tnp.bfloat16), [weak], BF16, False, 13.0)


def test_import_tinyjax_gives_nn():
  assert tj.nn.relu(tnp.asarray(-1.0)) == 0.0


def test_fill_values_convert_as_jax():
  """full(2, 1.5, int32) raised TypeError and full(2, 300, int8) OverflowError: JAX converts fill values as
  convert_element_type does (floats truncate and saturate, NaN is 0; ints wrap)."""
  cases = [(1.5, np.int32, 1), (-2.7, np.uint8, 0), (float("nan"), np.int32, 0), (float("inf"), np.int8, 127),
           (1e10, np.uint8, 255), (300, np.int8, 44), (-1, np.uint8, 255), (2**40, np.int32, 0)]
  for value, dtype, expected in cases:
    got = tnp.full((2,), value, dtype=dtype)
    assert got.dtype == np.dtype(dtype) and np.asarray(got).tolist() == [expected] * 2, (value, dtype)
  np.testing.assert_array_equal(tnp.full_like(tnp.ones(2, tnp.int8), 1.5), [1, 1])
  np.testing.assert_array_equal(tnp.pad(tnp.ones(2, tnp.uint8), 1, constant_values=-1), [255, 1, 1, 255])
  # ... while asarray of a Python int that does not fit the requested dtype is numpy's OverflowError
  for value in (300, [300], [np.uint8(1), 300]):
    with pytest.raises(OverflowError):
      tnp.asarray(value, dtype=tnp.uint8 if not isinstance(value, list) or len(value) == 1 else None)


def test_jvp_tangents_keep_weak_types_and_pow_derivative_at_zero_exponent():
  primal, tangent = tj.jvp(lambda x: x * 2, (2.0,), (1.0,))
  assert primal.weak_type and tangent.weak_type and float(tangent) == 2.0
  # d/dx x**0 is 0, also at x == 0 (it was 0 * 0**-1 = NaN)
  grad = tj.grad(lambda x: (x ** tnp.arange(2)).sum())
  check(grad, [tnp.asarray(np.array([0.0, 2.0], np.float32))], F32, False, [0.0, 1.0])


def test_transformations_of_a_jitted_function_keep_their_own_wrapper():
  """jit(vmap(jit(f))) ran jit(f) unbatched (per-example gradients of JAX's README example came back summed): the
  outer jit copied the inner jit's attributes, `fun` included, through functools.update_wrapper."""
  def predict(params, inputs):
    for weights, bias in params:
      outputs = tnp.dot(inputs, weights) + bias
      inputs = tnp.tanh(outputs)
    return outputs

  def loss(params, inputs, targets):
    return tnp.sum((predict(params, inputs) - targets) ** 2)

  rng = np.random.default_rng(0)
  normal = lambda *shape: tnp.asarray(rng.normal(size=shape).astype(np.float32))  # noqa: E731
  params = [(normal(m, n), normal(n)) for m, n in ((5, 7), (7, 3))]
  inputs, targets = normal(4, 5), normal(4, 3)
  grad_loss = tj.jit(tj.grad(loss))
  per_example = tj.jit(tj.vmap(grad_loss, in_axes=(None, 0, 0)))(params, inputs, targets)
  for i in range(4):
    one = grad_loss(params, inputs[i], targets[i])
    for got, want in zip(tj.tree_util.tree_leaves(per_example), tj.tree_util.tree_leaves(one)):
      np.testing.assert_allclose(np.asarray(got)[i], np.asarray(want), rtol=1e-5, atol=1e-6)
  assert tj.jit(tj.vmap(tj.jit(tnp.sum)))(tnp.ones((3, 2))).shape == (3,)
  square = tj.custom_jvp(tj.jit(lambda x: x * x))
  square.defjvp(lambda primals, tangents: (square(primals[0]), 2 * primals[0] * tangents[0]))
  assert float(tj.grad(square)(3.0)) == 6.0


def test_weak_types_of_functions_jax_composes_with_constants():
  """hypot is weak only for 0-d operands, heaviside only for a 0-d first operand, power with an integer exponent
  array only when both operands are weak (JAX 0.10's answers; a weak result defers to a narrower float later)."""
  ints = tnp.asarray(np.array([1, 2, 3], np.int8))
  weak_vector = tnp.broadcast_to(tnp.asarray(2.0), (3,))
  assert tnp.hypot(3, 4.0).weak_type and float(tnp.hypot(3, 4.0)) == 5.0
  assert not tnp.hypot(weak_vector, weak_vector).weak_type
  assert tnp.heaviside(0.5, ints).weak_type and not tnp.heaviside(ints, 0.5).weak_type
  assert not (2.5 ** ints).weak_type and (ints ** 2.5).weak_type and (2.5 ** tnp.asarray(2)).weak_type


def test_kernels_flush_float32_subnormals_as_xla():
  """Kernels run with subnormals flushed to zero, inputs and results, as XLA runs JAX's CPU programs (JAX 0.10's
  values below); the calling thread's float mode is restored, so numpy keeps IEEE subnormals. float16 goes through
  float32, where its subnormals are normal numbers: kept, as JAX."""
  x = np.array([1e-40, -2e-39, 1e-30], np.float32)
  expected = np.array([0.0, -0.0, 2e-30], np.float32)
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: v * 2.0)(x)), expected)
  np.testing.assert_array_equal(np.asarray(tnp.asarray(x) * 2.0), expected)
  assert np.asarray(tj.jit(lambda v: v * np.float32(1e-8))(np.array([1e-31], np.float32)))[0] == 0.0
  big = np.full(1 << 20, 1e-40, np.float32)  # a threaded launch: the workers flush too
  assert not np.asarray(tj.jit(lambda v: v * 3.0)(big)).any()
  assert np.float32(1e-40) * np.float32(2) != 0  # numpy on this thread still sees subnormals
  half = np.array([np.finfo(np.float16).tiny / 8], np.float16)
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: v * 2)(half)), half * 2)


def test_gated_loads_stay_out_of_vector_tiles():
  """A product over a grid made from aranges, divided into a concatenation (whose loads are gated: each part is read
  only where it lies) crashed the vector tile's renderer under jit; gated loads keep a tile scalar."""
  def f(c, k):
    grid = tnp.arange(5, dtype=np.float32)[None, :] - tnp.arange(2, dtype=np.float32)[:, None]
    return tnp.concatenate([c, k]) / tnp.prod(grid, axis=0)
  c, k = np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0], np.float32)
  grid = np.arange(5.0)[None, :] - np.arange(2.0)[:, None]
  with np.errstate(divide="ignore"):
    want = (np.concatenate([c, k]) / np.prod(grid, axis=0)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(tj.jit(f)(c, k)), want)
  np.testing.assert_array_equal(np.asarray(f(c, k)), want)
