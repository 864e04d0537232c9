"""tinyjax.lax against numpy: no implicit promotion, lax's integer division and rounding semantics, shape ops
(pad with interior and negative padding, strided slice, broadcast_in_dim, ...), reductions and dot_general."""
import ml_dtypes
import numpy as np
import pytest

import tinyjax.numpy as tnp
from tinyjax import lax

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, I32, U8, BOOL = (np.dtype(t) for t in (np.float16, np.float32, np.int32, np.uint8, np.bool_))
RNG = np.random.default_rng(1)


def array(host):
  return tnp.asarray(host)


def check(actual, expected, dtype, **tol):
  assert actual.dtype == np.dtype(dtype), (actual.dtype, dtype)
  expected = np.asarray(expected).astype(dtype)
  assert actual.shape == expected.shape, (actual.shape, expected.shape)
  got = np.asarray(actual)
  if got.dtype.kind in "biu": np.testing.assert_array_equal(got, expected)
  else: np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), equal_nan=True, **tol)


def test_no_implicit_promotion_but_weak_scalars():
  x, i = tnp.ones(3, dtype=tnp.float32), tnp.ones(3, dtype=tnp.int32)
  with pytest.raises(TypeError, match="same dtypes"):
    lax.add(x, i)
  with pytest.raises(TypeError):
    lax.add(i, 1.5)
  with pytest.raises(TypeError, match="incompatible shapes"):
    lax.mul(x, tnp.ones(4))
  check(lax.add(x, 1.0), np.full(3, 2.0), F32)
  check(lax.mul(tnp.ones(2, dtype=tnp.bfloat16), 3), np.full(2, 3.0), BF16)
  check(lax.sub(5, i), np.full(3, 4), I32)
  assert lax.add(1.0, 2.0).weak_type and lax.add(x, 1.0).weak_type is False


def test_integer_division_truncates_and_rem_follows_dividend():
  a = np.array([7, -7, 7, -7, 0], np.int32)
  b = np.array([2, 2, -2, -2, 3], np.int32)
  check(lax.div(array(a), array(b)), np.trunc(a / b), I32)
  check(lax.rem(array(a), array(b)), np.fmod(a, b), I32)
  fa, fb = a.astype(F32) + 0.5, b.astype(F32)
  check(lax.div(array(fa), array(fb)), fa / fb, F32)
  check(lax.rem(array(fa), array(fb)), np.fmod(fa, fb), F32)


def test_rounding_methods_and_integer_pow():
  x = array(np.array([0.5, 1.5, 2.5, -0.5, -2.5, 2.4, -2.6], F32))
  check(lax.round(x), [1, 2, 3, -1, -3, 2, -3], F32)
  check(lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), np.rint(np.asarray(x)), F32)
  check(lax.floor(x), np.floor(np.asarray(x)), F32)
  check(lax.ceil(x), np.ceil(np.asarray(x)), F32)
  host = RNG.uniform(0.5, 2, 10).astype(F32)
  for exponent in (0, 1, 2, 3, 7, -2):
    check(lax.integer_pow(array(host), exponent), host.astype(np.float64) ** exponent, F32, rtol=3e-6)
  check(lax.integer_pow(array(np.array([3, -2], np.int32)), 5), [243, -32], I32)


def test_math_and_low_precision_rounds_once():
  host = RNG.uniform(-3, 3, 200).astype(F32)
  for name, reference in (("exp", np.exp), ("logistic", lambda v: 1 / (1 + np.exp(-v))), ("tanh", np.tanh),
                          ("sin", np.sin), ("cos", np.cos), ("atan", np.arctan), ("cbrt", np.cbrt),
                          ("rsqrt", lambda v: 1 / np.sqrt(np.abs(v)))):
    values = np.abs(host) if name == "rsqrt" else host
    check(getattr(lax, name)(array(values)), reference(values.astype(np.float64)), F32, rtol=4e-6, atol=2e-7)
    for low in (F16, BF16):  # computed in float32, rounded once: within half an ulp of the low-precision result
      narrow = values.astype(low)
      expected = reference(narrow.astype(np.float64)).astype(low)
      got = np.asarray(getattr(lax, name)(array(narrow)))
      np.testing.assert_allclose(got.astype(F32), expected.astype(F32), rtol=float(ml_dtypes.finfo(low).eps),
                                 atol=float(ml_dtypes.finfo(low).eps) / 4)
  with pytest.raises(TypeError):
    lax.exp(tnp.ones(2, dtype=tnp.int32))


def test_comparisons_select_clamp():
  a, b = RNG.normal(size=(3, 4)).astype(F32), RNG.normal(size=(3, 4)).astype(F32)
  a[0, 0] = np.nan
  for name, reference in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                          ("gt", np.greater), ("ge", np.greater_equal)):
    check(getattr(lax, name)(array(a), array(b)), reference(a, b), BOOL)
  check(lax.select_n(array(a > b), array(a), array(b)), np.where(a > b, b, a), F32)
  which = np.array([[0, 1, 2, 1]] * 3, np.int32)
  check(lax.select_n(array(which), array(a), array(b), array(a * 2)), np.choose(which, [a, b, a * 2]), F32)
  check(lax.clamp(-0.5, array(b), 0.5), np.clip(b, -0.5, 0.5), F32)
  check(lax.max(array(a), array(b)), np.maximum(a, b), F32)
  check(lax.min(array(a), array(b)), np.minimum(a, b), F32)


def test_bitwise_and_shifts():
  a = np.array([-8, 7, -1, 12345, np.iinfo(np.int32).min], np.int32)
  s = np.array([1, 3, 31, 4, 33], np.int32)
  check(lax.shift_left(array(a), array(s)), np.where(s < 32, a << (s % 32), 0), I32)
  check(lax.shift_right_arithmetic(array(a), array(s)), np.where(s < 32, a >> (s % 32), np.where(a < 0, -1, 0)), I32)
  logical = np.where(s < 32, (a.view(np.uint32) >> (s % 32).astype(np.uint32)).view(np.int32), 0)
  check(lax.shift_right_logical(array(a), array(s)), logical, I32)
  check(lax.bitwise_not(array(a)), ~a, I32)
  check(lax.bitwise_xor(array(a), array(s)), a ^ s, I32)


def test_conversions():
  host = np.array([1.7, -1.7, 0.0, np.nan, 300.0], F32)
  check(lax.convert_element_type(array(host[:3]), tnp.int32), [1, -1, 0], I32)
  check(lax.convert_element_type(array(host), tnp.bool_), host != 0, BOOL)
  check(lax.convert_element_type(array(host), tnp.bfloat16), host.astype(BF16), BF16)
  check(lax.bitcast_convert_type(array(host), tnp.int32), host.view(np.int32), I32)
  assert not lax.convert_element_type(2.0, tnp.float32).weak_type


def test_reductions_and_arg_reductions():
  host = RNG.integers(-5, 5, size=(4, 5, 6)).astype(F32)
  x = array(host)
  check(lax.reduce_sum(x, (0, 2)), host.sum(axis=(0, 2)), F32)
  check(lax.reduce_max(x, (1,)), host.max(axis=1), F32)
  check(lax.reduce_min(x, (0, 1, 2)), host.min(), F32)
  check(lax.reduce_prod(x[:, :2, :2], (1, 2)), host[:, :2, :2].prod(axis=(1, 2)), F32)
  check(lax.reduce_or(array(host > 3), (2,)), (host > 3).any(axis=2), BOOL)
  check(lax.reduce_and(array(host > -5), (0,)), (host > -5).all(axis=0), BOOL)
  check(lax.argmax(x, 1, tnp.int32), host.argmax(axis=1), I32)
  check(lax.argmin(x, 2, tnp.uint8), host.argmin(axis=2), U8)


def test_shape_ops():
  host = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
  x = array(host)
  check(lax.reshape(x, (6, 4)), host.reshape(6, 4), I32)
  check(lax.reshape(x, (4, 6), dimensions=(2, 0, 1)), host.transpose(2, 0, 1).reshape(4, 6), I32)
  check(lax.transpose(x, (2, 0, 1)), host.transpose(2, 0, 1), I32)
  check(lax.broadcast_in_dim(array(np.arange(3, dtype=np.int32)), (2, 3, 4), (1,)),
        np.broadcast_to(np.arange(3)[None, :, None], (2, 3, 4)), I32)
  check(lax.squeeze(array(host[:1]), (0,)), host[0], I32)
  check(lax.expand_dims(x, (0, 3)), host[None, :, :, None], I32)
  check(lax.rev(x, (0, 2)), host[::-1, :, ::-1], I32)
  check(lax.slice(x, (0, 1, 0), (2, 3, 4), (1, 1, 3)), host[:, 1:3, ::3], I32)
  check(lax.concatenate([x, x[:, :1]], 1), np.concatenate([host, host[:, :1]], 1), I32)
  check(lax.iota(tnp.int32, 37), np.arange(37), I32)
  check(lax.iota(tnp.float32, 5), np.arange(5.0), F32)
  check(lax.full((2, 3), 7, tnp.uint8), np.full((2, 3), 7), U8)
  check(lax.full_like(x, 1.5, tnp.float32), np.full(host.shape, 1.5), F32)
  assert lax.stop_gradient(x) is x


@pytest.mark.parametrize("config", [[(1, 2, 0)], [(0, 0, 2)], [(2, -1, 1)], [(-2, 3, 0)], [(-1, -1, 3)],
                                    [(0, 0, 0)]], ids=str)
def test_pad_with_interior_and_negative_widths(config):
  host = np.arange(1, 6, dtype=np.float32)
  low, high, interior = config[0]
  expanded = np.full(5 + 4 * interior, -9.0, F32)
  expanded[::interior + 1] = host
  padded = np.concatenate([np.full(max(low, 0), -9.0), expanded, np.full(max(high, 0), -9.0)])
  expected = padded[max(-low, 0):len(padded) - max(-high, 0)]
  check(lax.pad(array(host), -9.0, config), expected, F32)


def test_dot_general_layout_and_errors():
  lhs, rhs = RNG.normal(size=(2, 3, 4, 5)).astype(F32), RNG.normal(size=(2, 5, 6, 3)).astype(F32)
  # batch (0, 0) and (1, 3); contract lhs 3 with rhs 1: output (batch..., lhs free, rhs free) = (2, 3, 4, 6)
  got = lax.dot_general(array(lhs), array(rhs), (((3,), (1,)), ((0, 1), (0, 3))))
  expected = np.einsum("abcd,adeb->abce", lhs.astype(np.float64), rhs.astype(np.float64))
  check(got, expected, F32, rtol=1e-5, atol=1e-5)
  check(lax.dot(array(lhs[0, 0]), array(rhs[0, :, :, 0])), lhs[0, 0].astype(np.float64) @ rhs[0, :, :, 0], F32,
        rtol=1e-5, atol=1e-5)
  bf = lax.dot(tnp.ones((2, 300), dtype=tnp.bfloat16), tnp.ones((300,), dtype=tnp.bfloat16))
  check(bf, np.full(2, 300.0), BF16)  # accumulated in float32: exact, where bfloat16 steps would stall at 256
  check(lax.dot_general(tnp.ones((2, 3), dtype=tnp.int8), tnp.ones((3,), dtype=tnp.int8), (((1,), (0,)), ((), ())),
                        preferred_element_type=tnp.int32), np.full(2, 3), I32)
  with pytest.raises(TypeError):
    lax.dot(tnp.ones((2, 3)), tnp.ones((4,)))
  with pytest.raises(TypeError):
    lax.dot(tnp.ones((2, 3)), tnp.ones((3,), dtype=tnp.int32))


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.float32, np.float16, np.int16], ids=str)
@pytest.mark.parametrize("size", [1, 2, 255, 1000, 70000])
def test_iota_is_the_loop_index_in_every_kernel(dtype, size):
  """lax.iota is a leaf that a kernel computes from its loop index: numpy's arange in each dtype (float16 rounds
  past 2048 and uint8 wraps past 255 as a cast of the index does), no division or modulo and no buffer of its own in
  the kernels of arange, one_hot and a masked reduction; under jit, vmap and grad."""
  import tinyjax as tj
  from tinyjax.uop import Ops
  with np.errstate(over="ignore"): want = np.arange(size).astype(dtype)  # (float16 past 65504: inf, as the cast)
  np.testing.assert_array_equal(np.asarray(lax.iota(dtype, size)), want)
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda: lax.iota(dtype, size))()), want)
  labels = np.arange(7, dtype=np.int32) * 3 % max(size, 1)
  f = tj.jit(lambda y: tj.nn.one_hot(y, size))
  np.testing.assert_array_equal(np.asarray(f(labels)), labels[:, None] == np.arange(size)[None, :])
  for kernel in f.lower(labels)._compiled.schedule.schedule.kernels:  # (a tiny one is one flat loop: div / mod)
    assert size < 16 or not any(n.op in (Ops.IDIV, Ops.MOD) for n in kernel.ast.toposort)
    assert len(kernel.slots) == 2
  x = np.linspace(-1, 1, 3 * size, dtype=np.float32).reshape(3, size)
  masked = tj.jit(tj.vmap(lambda row: (row * (lax.iota(np.float32, size) < size / 2)).sum()))(x)
  np.testing.assert_allclose(np.asarray(masked), (x * (np.arange(size) < size / 2)).sum(axis=1), rtol=1e-5, atol=1e-5)
  grad = tj.grad(lambda row: (row * lax.iota(np.float32, size)).sum())(x[0])
  np.testing.assert_array_equal(np.asarray(grad), np.arange(size, dtype=np.float32))
