"""Derivatives of every lax primitive and every tinyjax.numpy operation: JVP against central finite differences in
float64 and VJP against JVP by the transposition identity <vjp(ct), t> == <ct, jvp(t)>. Kinks and ties are in
test_ad_kinks.py."""

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax

RNG = np.random.default_rng(0)
SHAPE = (2, 3)
EPS = 1e-6


@pytest.fixture(autouse=True)
def x64():
  with tj.config.override("jax_enable_x64", True):
    yield


def uniform(low, high, shape=SHAPE):
  return RNG.uniform(low, high, shape)


def _tree_vdot(a, b):
  return sum(float(np.vdot(np.asarray(x, np.float64), np.asarray(y, np.float64)))
             for x, y in zip(tj.tree_util.tree_leaves(a), tj.tree_util.tree_leaves(b)))


def check_derivatives(f, *args, rtol=1e-6, atol=1e-7, eps=EPS, transpose_rtol=1e-9):
  """f's JVP at args (numpy float64 arrays) against central differences along a random direction, and its VJP
  against its JVP by the transposition identity."""
  primals = tuple(tnp.asarray(a) for a in args)
  directions = [RNG.standard_normal(np.shape(a)) for a in args]
  out, tangent_out = tj.jvp(f, primals, tuple(tnp.asarray(d) for d in directions))
  plus = f(*(tnp.asarray(a + eps * d) for a, d in zip(args, directions)))
  minus = f(*(tnp.asarray(a - eps * d) for a, d in zip(args, directions)))
  finite_difference = (np.asarray(plus) - np.asarray(minus)) / (2 * eps)
  assert out.dtype == np.float64 and tangent_out.dtype == np.float64
  np.testing.assert_allclose(np.asarray(tangent_out), finite_difference, rtol=rtol, atol=atol)

  out_vjp, vjp_fn = tj.vjp(f, *primals)
  np.testing.assert_array_equal(np.asarray(out_vjp), np.asarray(out))
  cotangent = RNG.standard_normal(np.shape(out))
  input_cotangents = vjp_fn(tnp.asarray(cotangent))
  assert len(input_cotangents) == len(args)
  for ct, a in zip(input_cotangents, primals):
    assert ct.shape == a.shape and ct.dtype == a.dtype
  lhs = _tree_vdot(input_cotangents, directions)
  rhs = float(np.vdot(cotangent, np.asarray(tangent_out)))
  assert lhs == pytest.approx(rhs, rel=transpose_rtol, abs=1e-12)


# (name, function, argument ranges): ranges keep away from kinks and outside domains
UNARY = [
  ("neg", lax.neg, (-2, 2)), ("abs", lax.abs, (0.2, 2)), ("abs_negative", lax.abs, (-2, -0.2)),
  ("exp", lax.exp, (-2, 2)), ("exp2", lax.exp2, (-2, 2)), ("log", lax.log, (0.2, 3)), ("log1p", lax.log1p, (-0.5, 2)),
  ("expm1", lax.expm1, (-2, 2)), ("sin", lax.sin, (-3, 3)), ("cos", lax.cos, (-3, 3)), ("tan", lax.tan, (-1.2, 1.2)),
  ("atan", lax.atan, (-3, 3)), ("asin", lax.asin, (-0.9, 0.9)), ("acos", lax.acos, (-0.9, 0.9)),
  ("sinh", lax.sinh, (-2, 2)), ("cosh", lax.cosh, (-2, 2)), ("tanh", lax.tanh, (-2, 2)),
  ("asinh", lax.asinh, (-2, 2)), ("acosh", lax.acosh, (1.2, 3)), ("atanh", lax.atanh, (-0.9, 0.9)),
  ("logistic", lax.logistic, (-3, 3)), ("sqrt", lax.sqrt, (0.2, 3)), ("rsqrt", lax.rsqrt, (0.2, 3)),
  ("cbrt", lax.cbrt, (-3, 3)), ("square", lax.square, (-2, 2)), ("reciprocal", lax.reciprocal, (0.3, 2)),
  ("integer_pow_3", lambda x: lax.integer_pow(x, 3), (-2, 2)),
  ("integer_pow_-2", lambda x: lax.integer_pow(x, -2), (0.3, 2)),
  ("floor", lax.floor, (0.1, 0.9)), ("ceil", lax.ceil, (0.1, 0.9)), ("round", lax.round, (0.1, 0.4)),
  ("sign", lax.sign, (0.1, 2)),
  ("convert_element_type", lambda x: lax.convert_element_type(x, np.float32).astype(np.float64), (-1, 1)),
]


@pytest.mark.parametrize("name,fn,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary_lax_primitive(name, fn, domain):
  # a float32 round trip is linear: larger steps keep its rounding out of the difference quotient
  float32_round_trip = {"eps": 1e-2, "rtol": 1e-4, "transpose_rtol": 1e-6}
  check_derivatives(fn, uniform(*domain), **(float32_round_trip if name == "convert_element_type" else {}))


BINARY = [
  ("add", lax.add, (-2, 2), (-2, 2)), ("sub", lax.sub, (-2, 2), (-2, 2)), ("mul", lax.mul, (-2, 2), (-2, 2)),
  ("div", lax.div, (-2, 2), (0.5, 2)), ("rem", lax.rem, (2.1, 2.9), (0.7, 0.9)), ("max", lax.max, (-2, 0), (0, 2)),
  ("max_swapped", lax.max, (0, 2), (-2, 0)), ("min", lax.min, (-2, 0), (0, 2)), ("pow", lax.pow, (0.5, 2), (-2, 2)),
  ("atan2", lax.atan2, (-2, 2), (0.5, 2)), ("atan2_left", lax.atan2, (0.5, 2), (-2, -0.5)),
]


@pytest.mark.parametrize("name,fn,domain_x,domain_y", BINARY, ids=[b[0] for b in BINARY])
def test_binary_lax_primitive(name, fn, domain_x, domain_y):
  check_derivatives(fn, uniform(*domain_x), uniform(*domain_y))


OTHER = [
  ("clamp", lambda lo, x, hi: lax.clamp(lo, x, hi), [(-3, -1), (-2, 2), (1, 3)]),
  ("clamp_clipped", lambda lo, x, hi: lax.clamp(lo, x, hi), [(0, 1), (-3, -2), (2, 3)]),
  ("select_n", lambda a, b: lax.select_n(lax.lt(a, b * 0), a, b), [(-1, 1), (-1, 1)]),
  ("reduce_sum", lambda x: lax.reduce_sum(x, (1,)), [(-1, 1)]),
  ("reduce_max", lambda x: lax.reduce_max(x, (0,)), [(-1, 1)]),
  ("reduce_min", lambda x: lax.reduce_min(x, (0, 1)), [(-1, 1)]),
  ("reduce_prod", lambda x: lax.reduce_prod(x, (1,)), [(0.5, 2)]),
  ("argmax", lambda x: x * lax.argmax(x, 1, np.int32).astype(np.float64)[:, None], [(-1, 1)]),
  ("dot_general", lambda a, b: lax.dot_general(a, b, (((1,), (1,)), ((), ()))), [(-1, 1), (-1, 1)]),
  ("dot_general_batch",
   lambda a, b: lax.dot_general(a.reshape(2, 3, 1), b.reshape(2, 3, 1), (((2,), (2,)), ((0,), (0,)))),
   [(-1, 1), (-1, 1)]),
  ("broadcast_in_dim", lambda x: lax.broadcast_in_dim(x, (4, 2, 3), (1, 2)), [(-1, 1)]),
  ("reshape_transpose", lambda x: lax.transpose(lax.reshape(x, (3, 2)), (1, 0)), [(-1, 1)]),
  ("pad", lambda x: lax.pad(x, 0.5, [(1, -1, 1), (0, 2, 0)]), [(-1, 1)]),
  ("slice_rev", lambda x: lax.rev(lax.slice(x, (0, 0), (2, 3), (1, 2)), (1,)), [(-1, 1)]),
  ("concatenate", lambda a, b: lax.concatenate([a, b, a], 1), [(-1, 1), (-1, 1)]),
  ("squeeze_expand_dims", lambda x: lax.squeeze(lax.expand_dims(x, (0,)), (0,)), [(-1, 1)]),
]


@pytest.mark.parametrize("name,fn,domains", OTHER, ids=[o[0] for o in OTHER])
def test_other_lax_primitive(name, fn, domains):
  check_derivatives(fn, *(uniform(*d) for d in domains))


NUMPY = [
  ("add", lambda a, b: a + b), ("subtract", lambda a, b: a - b), ("multiply", lambda a, b: a * b),
  ("divide", lambda a, b: a / (b + 3)), ("remainder", lambda a, b: (a + 3) % (b + 2)),
  ("floor_divide", lambda a, b: (a + 3) // (b + 2) * a), ("fmod", lambda a, b: tnp.fmod(a + 3, b + 2)),
  ("power", lambda a, b: (a + 2) ** b), ("power_int", lambda a, b: a ** 3 + b ** 2), ("maximum", tnp.maximum),
  ("minimum", tnp.minimum), ("fmax", tnp.fmax), ("fmin", tnp.fmin), ("hypot", tnp.hypot),
  ("copysign", tnp.copysign), ("arctan2", tnp.arctan2), ("where", lambda a, b: tnp.where(a > b, a * b, a - b)),
  ("clip", lambda a, b: tnp.clip(a, -0.5, b)), ("heaviside", lambda a, b: tnp.heaviside(a, b) * b),
  ("logaddexp_like", lambda a, b: tnp.log(tnp.exp(a) + tnp.exp(b))), ("matmul", lambda a, b: a @ b.T),
  ("dot", lambda a, b: tnp.dot(a.T, b)), ("tensordot", lambda a, b: tnp.tensordot(a, b, 2)),
  ("inner", tnp.inner), ("outer", tnp.outer), ("vdot", tnp.vdot),
  ("concatenate_stack", lambda a, b: tnp.stack([tnp.concatenate([a, b], 0), tnp.concatenate([b, a], 0)])),
]
NUMPY_UNARY = [
  ("absolute", tnp.abs), ("sign", tnp.sign), ("negative", lambda x: -x), ("sqrt", lambda x: tnp.sqrt(x + 3)),
  ("cbrt", tnp.cbrt), ("exp", tnp.exp), ("exp2", tnp.exp2), ("expm1", tnp.expm1), ("log", lambda x: tnp.log(x + 3)),
  ("log2", lambda x: tnp.log2(x + 3)), ("log10", lambda x: tnp.log10(x + 3)), ("log1p", tnp.log1p),
  ("sin", tnp.sin), ("cos", tnp.cos), ("tan", tnp.tan), ("arcsin", lambda x: tnp.arcsin(x / 2)),
  ("arccos", lambda x: tnp.arccos(x / 2)), ("arctan", tnp.arctan), ("sinh", tnp.sinh), ("cosh", tnp.cosh),
  ("tanh", tnp.tanh), ("arcsinh", tnp.arcsinh), ("arccosh", lambda x: tnp.arccosh(x + 3)),
  ("arctanh", lambda x: tnp.arctanh(x / 2)), ("square", tnp.square), ("reciprocal", lambda x: tnp.reciprocal(x + 3)),
  ("deg2rad", tnp.deg2rad), ("floor_ceil_trunc_rint_round", lambda x: x * (tnp.floor(x) + tnp.ceil(x) + tnp.trunc(x)
                                                                           + tnp.rint(x) + tnp.round(x, 1))),
  ("sum", lambda x: tnp.sum(x, axis=1, keepdims=True) * x), ("prod", lambda x: tnp.prod(x + 2, axis=0)),
  ("max", lambda x: tnp.max(x, axis=1)), ("min", lambda x: tnp.min(x)), ("mean", lambda x: tnp.mean(x, axis=0)),
  ("var", lambda x: tnp.var(x, axis=1)), ("std", lambda x: tnp.std(x)), ("argmax", lambda x: x[0] * tnp.argmax(x)),
  ("getitem", lambda x: x[1, ::-2] * x[:, None, 0:1].sum()), ("reshape_T", lambda x: x.reshape(3, 2).T * x),
  ("moveaxis_swapaxes", lambda x: tnp.moveaxis(x[None], 0, 2) + tnp.swapaxes(x, 0, 1)[None].transpose(2, 1, 0)),
  ("flip_pad", lambda x: tnp.pad(tnp.flip(x, 1), ((1, 0), (0, 2)))),
  ("broadcast_to", lambda x: tnp.broadcast_to(x, (4, 2, 3))),
  ("expand_squeeze_ravel", lambda x: tnp.squeeze(tnp.expand_dims(x, 0)).ravel()),
  ("astype", lambda x: x.astype(np.float32).astype(np.float64) * x),
]


@pytest.mark.parametrize("name,fn", NUMPY, ids=[n[0] for n in NUMPY])
def test_numpy_binary(name, fn):
  check_derivatives(fn, uniform(-1, 1), uniform(-1, 1))


@pytest.mark.parametrize("name,fn", NUMPY_UNARY, ids=[n[0] for n in NUMPY_UNARY])
def test_numpy_unary(name, fn):
  float32_round_trip = {"eps": 1e-2, "rtol": 1e-4, "atol": 1e-4, "transpose_rtol": 1e-6} if name == "astype" else {}
  check_derivatives(fn, uniform(-1, 1) + 0.013, **float32_round_trip)
