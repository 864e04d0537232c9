"""tinyjax.numpy against numpy: elementwise functions, promotion, reductions, movement, indexing, products, fusion
counts and errors. References are computed by numpy in float64 and rounded to the result dtype."""
import math
import warnings

import ml_dtypes
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import dtypes
from tinyjax.config import config
from tinyjax.lower.realize import counters

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, I32, I64, U8, BOOL = (np.dtype(t) for t in (np.int8, np.int32, np.int64, np.uint8, np.bool_))
FLOATS = [F32, F16, BF16]
SHAPES = [(), (0,), (3, 0), (1, 5), (7, 13, 5)]
RNG = np.random.default_rng(0)


def tolerance(dtype: np.dtype) -> dict:
  return {F32: dict(rtol=3e-6, atol=1e-6), F16: dict(rtol=2e-3, atol=1e-4), BF16: dict(rtol=1.6e-2, atol=1e-3),
          F64: dict(rtol=1e-13, atol=1e-14)}.get(np.dtype(dtype), dict(rtol=0, atol=0))


def make(shape, dtype, low=-5.0, high=5.0, rng=RNG) -> np.ndarray:
  dtype = np.dtype(dtype)
  if dtype == BOOL: return rng.random(shape) < 0.5
  if dtype.kind in "iu":
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, int(low * 10)), min(info.max, int(high * 10)) + 1, size=shape).astype(dtype)
  return rng.uniform(low, high, size=shape).astype(dtype)


def check(actual, expected, dtype=None, **tol):
  """Compare an Array to a numpy reference: same shape, same dtype (if given), values within the dtype's tolerance."""
  assert isinstance(actual, tj.Array), type(actual)
  expected = np.asarray(expected)
  if dtype is not None:
    assert actual.dtype == np.dtype(dtype), (actual.dtype, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
      expected = expected.astype(dtype)
  assert actual.shape == expected.shape, (actual.shape, expected.shape)
  got = np.asarray(actual)
  if got.dtype.kind in "biu" or got.dtype == np.dtype(bool):
    np.testing.assert_array_equal(got, expected)
  else:
    tol = tol or tolerance(got.dtype)
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), equal_nan=True, **tol)


# ---------------------------------------------------------------------------------------------- unary float math

UNARY = {  # name: (numpy reference, (low, high) of test inputs)
  "exp": (np.exp, (-20, 20)), "exp2": (np.exp2, (-20, 20)), "expm1": (np.expm1, (-3, 3)), "log": (np.log, (0.01, 100)),
  "log2": (np.log2, (0.01, 100)), "log10": (np.log10, (0.01, 100)), "log1p": (np.log1p, (-0.9, 10)),
  "sqrt": (np.sqrt, (0, 100)), "cbrt": (np.cbrt, (-100, 100)), "sin": (np.sin, (-10, 10)), "cos": (np.cos, (-10, 10)),
  "tan": (np.tan, (-1.4, 1.4)), "arcsin": (np.arcsin, (-1, 1)), "arccos": (np.arccos, (-1, 1)),
  "arctan": (np.arctan, (-20, 20)), "sinh": (np.sinh, (-5, 5)), "cosh": (np.cosh, (-5, 5)),
  "tanh": (np.tanh, (-5, 5)), "arcsinh": (np.arcsinh, (-100, 100)), "arccosh": (np.arccosh, (1, 100)),
  "arctanh": (np.arctanh, (-0.99, 0.99)), "floor": (np.floor, (-5, 5)), "ceil": (np.ceil, (-5, 5)),
  "trunc": (np.trunc, (-5, 5)), "rint": (np.rint, (-5, 5)), "round": (np.round, (-5, 5)),
  "negative": (np.negative, (-5, 5)), "positive": (np.positive, (-5, 5)), "abs": (np.abs, (-5, 5)),
  "sign": (np.sign, (-5, 5)), "reciprocal": (np.reciprocal, (0.5, 5)), "square": (np.square, (-5, 5)),
  "deg2rad": (np.deg2rad, (-360, 360)), "rad2deg": (np.rad2deg, (-7, 7)),
}
# absolute tolerances where the result crosses zero (relative error is meaningless there)
ABSOLUTE_NEAR_ZERO = {"sin", "cos", "tan", "sinh", "arcsin", "arctan", "arctanh", "arcsinh", "log", "log2", "log10",
                      "log1p", "expm1", "tanh", "cbrt"}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float(name, dtype):
  reference, (low, high) = UNARY[name]
  host = make((7, 13), dtype, low, high)
  if name in ("round", "rint"): host.flat[:6] = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 3.5]).astype(dtype)
  expected = reference(host.astype(F64))
  tol = dict(tolerance(dtype))
  if name in ABSOLUTE_NEAR_ZERO: tol["atol"] = max(tol["atol"], float(dtypes.finfo(dtype).eps) * 2)
  if name in ("exp", "exp2", "cosh", "sinh") and dtype == F32: tol["rtol"] = 4e-6
  if name == "tan": tol["rtol"] *= 4  # tan's condition number near +-1.4
  check(getattr(tnp, name)(tnp.asarray(host)), expected, dtype, **tol)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float64(name):
  reference, (low, high) = UNARY[name]
  host = make((5, 9), F64, low, high)
  tol = dict(rtol=2e-14, atol=1e-15)
  if name in ABSOLUTE_NEAR_ZERO: tol["atol"] = 1e-15
  if name in ("exp", "exp2", "cosh", "sinh", "tan"): tol["rtol"] = 2e-14
  with config.override("jax_enable_x64", True):
    check(getattr(tnp, name)(tnp.asarray(host)), reference(host), F64, **tol)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unary_shapes(shape):
  host = make(shape, F32)
  check(tnp.exp(tnp.asarray(host)), np.exp(host.astype(F64)), F32, rtol=4e-6)
  check(tnp.abs(tnp.asarray(host)), np.abs(host), F32)


def test_special_values():
  values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e-8, -1e-8, 88.0, -87.0, 89.0, -104.0,
                     1e30, -1e30, 0.5, -0.5, 2.5, -2.5], dtype=F32)
  x = tnp.asarray(values)
  with np.errstate(all="ignore"):
    for name in ("exp", "expm1", "log1p", "sqrt", "sin", "tanh", "sinh", "cosh", "arctan", "arcsinh", "cbrt", "floor",
                 "ceil", "trunc", "rint", "abs", "sign", "exp2", "log", "isnan", "isinf", "isfinite", "signbit"):
      reference = getattr(np, name)
      expected = reference(values.astype(F64)).astype(F32) if name not in ("isnan", "isinf", "isfinite", "signbit") \
        else reference(values)
      got = np.asarray(getattr(tnp, name)(x))
      np.testing.assert_allclose(got.astype(F64), expected.astype(F64), rtol=4e-6, atol=0, equal_nan=True,
                                 err_msg=name)
  # signs of zero survive abs, floor, ceil, round, trunc
  for name in ("abs", "floor", "ceil", "rint", "trunc"):
    got = np.asarray(getattr(tnp, name)(tnp.asarray(np.array([-0.0, -0.3, 0.3], F32))))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(getattr(np, name)(np.array([-0.0, -0.3, 0.3], F32))))


def test_log1p_expm1_small_arguments_are_accurate():
  small = np.array([1e-10, -1e-10, 1e-7, 3e-5, -2e-6], F32)
  check(tnp.log1p(tnp.asarray(small)), np.log1p(small.astype(F64)), F32, rtol=2e-7, atol=0)
  check(tnp.expm1(tnp.asarray(small)), np.expm1(small.astype(F64)), F32, rtol=2e-7, atol=0)


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_exp_evaluates_exp2_once_and_stays_accurate(dtype):
  """float32 exp is Cody-Waite n*ln2 + r with one EXP2 (of r), float64 exp fdlibm's rational form of e**r (no EXP2);
  2**n is built from exponent bits by float adds, a bitcast and integer multiply-adds, all vectorised (no saturating
  float-to-integer conversion). Within 1.5 ulp (float64: 0.9) of the exact value over a dense sweep of the finite
  range; overflow to inf, underflow to 0, inf / -inf / NaN / 0 as numpy."""
  limit = 88.7 if dtype == F32 else 709.0
  smallest = math.log(np.finfo(dtype).tiny) + 0.01  # (below it results are subnormal: flushed to 0, as in JAX)
  values = np.concatenate([np.linspace(smallest, limit, 400_001), [0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0]])
  special = np.array([np.inf, -np.inf, np.nan, limit + 1, -limit - 60], dtype)
  with config.override("jax_enable_x64", dtype == F64):
    f = tj.jit(tnp.exp)
    kernels = f.lower(tnp.asarray(values.astype(dtype)))._compiled.schedule.schedule.kernels
    assert sum(1 for k in kernels for n in k.ast.toposort if n.op.name == "EXP2") == (1 if dtype == F32 else 0)
    assert "fptosi" not in f.lower(tnp.asarray(values.astype(dtype))).as_text()
    got = np.asarray(f(tnp.asarray(values.astype(dtype))))
    got_special = np.asarray(f(tnp.asarray(special)))
  x = values.astype(dtype)
  exact = np.exp(x.astype(np.longdouble))
  ulps = np.abs(got.astype(np.longdouble) - exact) / np.spacing(exact.astype(dtype)).astype(np.longdouble)
  assert ulps.max() <= (1.5 if dtype == F32 else 0.9)
  np.testing.assert_array_equal(got_special, np.array([np.inf, 0, np.nan, np.inf, 0], dtype))


def test_atan2_quadrants_and_zeros():
  y = np.array([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, 1.0, -1.0, np.inf, -np.inf, np.inf, 3.0, 0.0, np.nan], F32)
  x = np.array([0.0, 0.0, -0.0, -0.0, 1.0, 1.0, -1.0, -1.0, np.inf, np.inf, -np.inf, 0.0, -2.0, 1.0], F32)
  got = np.asarray(tnp.arctan2(tnp.asarray(y), tnp.asarray(x)))
  expected = np.arctan2(y.astype(F64), x.astype(F64)).astype(F32)
  np.testing.assert_allclose(got, expected, rtol=3e-7, equal_nan=True)
  np.testing.assert_array_equal(np.signbit(got), np.signbit(expected))
  host_y, host_x = make((6, 7), F32), make((6, 7), F32)
  check(tnp.arctan2(tnp.asarray(host_y), tnp.asarray(host_x)), np.arctan2(host_y.astype(F64), host_x.astype(F64)),
        F32, rtol=4e-7, atol=1e-7)


@pytest.mark.parametrize("dtype", [I32, U8, I8, BOOL], ids=str)
def test_float_functions_of_integers_give_float32(dtype):
  host = make((4, 5), dtype, 0, 5)
  for name in ("exp", "sqrt", "sin", "log1p"):
    check(getattr(tnp, name)(tnp.asarray(host)), getattr(np, name)(host.astype(F64)), F32, rtol=4e-6)
  check(tnp.floor(tnp.asarray(host)), host, dtype)  # integers pass through rounding functions unchanged, as JAX


# ---------------------------------------------------------------------------------------------- binary, promotion

BINARY_FLOAT = {
  "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide, "maximum": np.maximum,
  "minimum": np.minimum, "power": np.power, "arctan2": np.arctan2, "hypot": np.hypot, "floor_divide": np.floor_divide,
  "remainder": np.remainder, "fmod": np.fmod, "copysign": np.copysign, "fmax": np.fmax, "fmin": np.fmin,
  "heaviside": np.heaviside,
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY_FLOAT))
def test_binary_float(name, dtype):
  a, b = make((4, 1, 5), dtype), make((3, 1), dtype, 0.5, 4)
  if name == "power": a = np.abs(a)
  if name in ("fmax", "fmin", "maximum", "minimum"): a.flat[0], b.flat[1] = np.nan, np.nan
  with np.errstate(all="ignore"):
    expected = getattr(np, name)(a.astype(F64), b.astype(F64))
  tol = dict(tolerance(dtype))
  if name in ("floor_divide", "remainder", "fmod"):  # a correctly rounded quotient may land on the other integer
    tol["atol"] = max(tol["atol"], 2 * float(dtypes.finfo(dtype).eps) * 8)
    expected = getattr(np, name)(a, b).astype(F64) if dtype != BF16 else expected
  check(getattr(tnp, name)(tnp.asarray(a), tnp.asarray(b)), expected, dtype, **tol)


INT_BINARY = {
  "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "floor_divide": np.floor_divide,
  "remainder": np.remainder, "maximum": np.maximum, "minimum": np.minimum, "bitwise_and": np.bitwise_and,
  "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor, "equal": np.equal, "not_equal": np.not_equal,
  "less": np.less, "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal,
  "power": np.power, "fmod": np.fmod,
}


@pytest.mark.parametrize("dtype", [I32, U8, I8], ids=str)
@pytest.mark.parametrize("name", sorted(INT_BINARY))
def test_binary_integer(name, dtype):
  a, b = make((6, 7), dtype, -12, 12), make((6, 7), dtype, -12, 12)
  if name in ("floor_divide", "remainder", "fmod"): b[b == 0] = 3
  if name == "power": b = np.abs(b) % 4
  expected = getattr(np, name)(a, b)
  check(getattr(tnp, name)(tnp.asarray(a), tnp.asarray(b)), expected, expected.dtype)


def test_integer_extremes():
  info = np.iinfo(np.int32)
  a = np.array([info.min, info.max, -7, 7, -7, 0], np.int32)
  b = np.array([info.max, info.min, 2, -2, -2, 5], np.int32)
  for name in ("minimum", "maximum", "floor_divide", "remainder"):
    check(getattr(tnp, name)(tnp.asarray(a), tnp.asarray(b)), getattr(np, name)(a, b), I32)
  shifts = np.array([0, 1, 31, 32, 40, 3], np.int32)
  check(tnp.left_shift(tnp.asarray(a), tnp.asarray(shifts)), np.where(shifts < 32, np.left_shift(a, shifts % 32), 0),
        I32)
  check(tnp.right_shift(tnp.asarray(a), tnp.asarray(shifts)),
        np.where(shifts < 32, np.right_shift(a, shifts % 32), np.where(a < 0, -1, 0)), I32)
  check(tnp.abs(tnp.asarray(a)), np.abs(a), I32)
  check(tnp.invert(tnp.asarray(a)), np.invert(a), I32)


@pytest.mark.parametrize("dtype", [BOOL], ids=str)
def test_bool_ops(dtype):
  a, b = make((5, 6), BOOL), make((5, 6), BOOL)
  for name in ("add", "multiply", "maximum", "minimum", "logical_and", "logical_or", "logical_xor", "bitwise_and",
               "bitwise_or", "bitwise_xor", "equal", "not_equal", "less", "greater_equal"):
    expected = getattr(np, name)(a, b)
    check(getattr(tnp, name)(tnp.asarray(a), tnp.asarray(b)), expected, expected.dtype)
  check(tnp.logical_not(tnp.asarray(a)), np.logical_not(a), BOOL)
  check(~tnp.asarray(a), ~a, BOOL)
  with pytest.raises(TypeError):
    tnp.subtract(tnp.asarray(a), tnp.asarray(b))


PROMOTION_DTYPES = [BOOL, U8, I8, I32, F16, BF16, F32]


@pytest.mark.parametrize("left", PROMOTION_DTYPES, ids=str)
@pytest.mark.parametrize("right", PROMOTION_DTYPES, ids=str)
def test_promotion_of_mixed_operands(left, right):
  a, b = make((3, 4), left, 0, 4), make((4,), right, 1, 4)
  x, y = tnp.asarray(a), tnp.asarray(b)
  expected_dtype = dtypes.result_type(left, right)
  got = x * y if BOOL not in (left, right) or expected_dtype != BOOL else x & y
  assert got.dtype == expected_dtype
  reference = (a.astype(F64) * b.astype(F64)) if expected_dtype != BOOL else (a & b)
  check(got, reference, expected_dtype)
  check(x < y, a.astype(F64).astype(expected_dtype) < b.astype(F64).astype(expected_dtype), BOOL)


# A weak scalar of a higher kind gives a weak result (JAX: `i32 + 1.5` is a weak float32, `bool + 1` a weak int32)
@pytest.mark.parametrize("dtype,scalar,expected,weak", [
  (F32, 1.0, F32, False), (U8, 1, U8, False), (I32, 1.5, F32, True), (BF16, 1.0, BF16, False), (BOOL, 1, I32, True),
  (F16, 2, F16, False), (I8, 3, I8, False), (U8, 2.5, F32, True), (BOOL, 1.5, F32, True),
])
def test_weak_python_scalars(dtype, scalar, expected, weak):
  host = make((2, 3), dtype, 0, 4)
  x = tnp.asarray(host)
  for got, reference in ((x + scalar, host.astype(F64) + scalar), (scalar * x, scalar * host.astype(F64)),
                         (x - scalar, host.astype(F64) - scalar)):
    assert got.dtype == expected and got.weak_type == weak
    wrap = expected.kind in "iu"
    check(got, reference.astype(np.int64).astype(expected) if wrap else reference, expected)


def test_weak_results_and_strong_scalar_types():
  assert tnp.asarray(1.0).weak_type and (tnp.asarray(1.0) + 2).weak_type
  one = tnp.float32(1)
  assert one.dtype == F32 and not one.weak_type and one.shape == ()
  assert (tnp.asarray(np.ones(3, np.float16)) + tnp.float32(1)).dtype == F32
  assert (tnp.asarray(np.ones(3, np.float16)) + tnp.asarray(1.0)).dtype == F16
  assert tnp.uint8(3).dtype == U8 and tnp.bfloat16(2.5).dtype == BF16 and tnp.bool_(1).dtype == BOOL
  assert tnp.asarray(np.ones(3), dtype=tnp.float16).dtype == F16
  assert np.dtype(tnp.float32) == F32 and tnp.dtype("bfloat16") == BF16


def test_promotion_lattice_sharp_edges():
  ones = {dt: tnp.ones(2, dt) for dt in (BF16, F16, I32, U8, I8)}
  assert (ones[BF16] + ones[F16]).dtype == F32
  assert (ones[I32] + ones[F16]).dtype == F16
  assert (ones[U8] + ones[I8]).dtype == np.dtype(np.int16)
  # a Python int must fit the default int type, then wraps into a narrower one (JAX 0.10: u8 + 300 adds 44)
  np.testing.assert_array_equal(tnp.ones(2, U8) + 300, np.array([45, 45], U8))
  np.testing.assert_array_equal(tnp.ones(2, U8) == -1, [False, False])
  for too_large in (lambda: tnp.ones(2, I32) + 2**31, lambda: tnp.ones(2, F16) + 2**40,
                    lambda: tnp.ones(2, U8) < -2**40):
    with pytest.raises(OverflowError):
      too_large()


def test_x64_types():
  with config.override("jax_enable_x64", True):
    a = np.arange(6, dtype=np.int64).reshape(2, 3) - 2
    x = tnp.asarray(a)
    assert x.dtype == I64 and (x + 1).dtype == I64 and (x / 2).dtype == F64
    check(x * 3 - 1, a * 3 - 1, I64)
    check(tnp.asarray(np.linspace(0, 1, 5)) + 1.0, np.linspace(0, 1, 5) + 1, F64)
    assert tnp.arange(3).dtype == I64 and tnp.zeros(2).dtype == F64
    check(tnp.sum(tnp.asarray(a)), a.sum(), I64)
  assert tnp.asarray(np.ones(3, np.float64)).dtype == F32  # silently truncated without x64, as JAX
  assert tnp.asarray(np.ones(3, np.int64)).dtype == I32
  with pytest.warns(UserWarning):
    assert tnp.zeros(2, dtype=np.float64).dtype == F32


@pytest.mark.parametrize("name", ["isnan", "isinf", "isfinite", "signbit"])
def test_float_predicates(name):
  host = np.array([[0.0, -0.0, np.inf], [-np.inf, np.nan, -3.5]], F32)
  for dtype in (F32, BF16, F16):
    check(getattr(tnp, name)(tnp.asarray(host.astype(dtype))), getattr(np, name)(host), BOOL)
  check(getattr(tnp, name)(tnp.asarray(np.array([1, -2], np.int32))), getattr(np, name)(np.array([1, -2])), BOOL)


def test_clip_where_and_rounding_decimals():
  host = make((5, 6), F32)
  x = tnp.asarray(host)
  check(tnp.clip(x, -1, 2), np.clip(host, -1, 2), F32)
  check(x.clip(None, 0.5), np.clip(host, None, 0.5), F32)
  check(tnp.where(x > 0, x, 0.0), np.where(host > 0, host, 0.0), F32)
  check(tnp.where(x > 0, 1, tnp.asarray(np.int8(2))), np.where(host > 0, 1, 2).astype(np.int8), I8)
  check(tnp.round(x, 2), np.round(host.astype(F64), 2), F32, rtol=1e-6, atol=1e-6)
  check(x.round(), np.round(host), F32)
  check(tnp.round(tnp.asarray(np.array([15, 25, -35, 123], np.int32)), -1), np.round(np.array([15, 25, -35, 123]),
                                                                                     -1), I32)
  for got, want in zip(tnp.where(x > 0), np.where(host > 0)): np.testing.assert_array_equal(got, want)


def test_power_forms():
  host = make((3, 4), F32, 0.5, 3)
  x = tnp.asarray(host)
  check(x ** 2, host * host, F32)
  check(x ** -1, 1 / host.astype(F64), F32)
  check(x ** 0.5, np.sqrt(host.astype(F64)), F32)
  check(2.0 ** x, 2.0 ** host.astype(F64), F32)
  ints = np.array([[2, -3, 0, 1]], np.int32)
  check(tnp.asarray(ints) ** 3, ints ** 3, I32)
  check(tnp.power(tnp.asarray(ints), tnp.asarray(np.array([10, 3, 0, 7], np.int32))),
        np.power(ints, np.array([10, 3, 0, 7])), I32)


# ---------------------------------------------------------------------------------------------- non-contiguous views

def _views(host):
  return {
    "transposed": (lambda a: a.T, lambda a: a.T),
    "stepped": (lambda a: a[::2, 1::3], lambda a: a[::2, 1::3]),
    "flipped": (lambda a: a[::-1, ::-2], lambda a: a[::-1, ::-2]),
    "broadcast": (lambda a: tnp.broadcast_to(a[:1], (4,) + a.shape[1:]), lambda a: np.broadcast_to(a[:1], (4,) +
                                                                                                      a.shape[1:])),
  }


@pytest.mark.parametrize("view", ["transposed", "stepped", "flipped", "broadcast"])
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=str)
def test_noncontiguous_views(view, dtype):
  host = make((7, 13), dtype)
  ours, theirs = _views(host)[view]
  x, expected = ours(tnp.asarray(host)), theirs(host)
  check(x, expected, dtype)
  check(x * 2 + 1, expected.astype(F64) * 2 + 1 if dtype != I32 else expected * 2 + 1, dtype)
  check(x.sum(axis=0), expected.astype(F64).sum(axis=0) if dtype != I32 else expected.sum(axis=0), dtype,
        **(dict(rtol=2e-2, atol=0.1) if dtype == BF16 else {}))
  check(tnp.maximum(x, tnp.flip(x, 0)), np.maximum(expected, expected[::-1]), dtype)


# ---------------------------------------------------------------------------------------------- reductions

REDUCTIONS = ["sum", "prod", "max", "min", "mean", "var", "std", "any", "all"]


@pytest.mark.parametrize("dtype", [F32, F16, BF16, I32, U8, I8, BOOL], ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_dtypes(name, dtype):
  host = make((7, 13, 5), dtype, -2, 2) if name != "prod" else make((7, 3, 5), dtype, 0.5, 1.5)
  x = tnp.asarray(host)
  for axis, keepdims in ((None, False), (1, False), ((0, 2), True)):
    got = getattr(tnp, name)(x, axis=axis, keepdims=keepdims)
    if name in ("sum", "prod"): expected_dtype = dtypes.sum_dtype(dtype)
    elif name in ("mean", "var", "std"): expected_dtype = dtypes.mean_dtype(dtype)
    elif name in ("any", "all"): expected_dtype = BOOL
    else: expected_dtype = dtype
    assert got.dtype == expected_dtype, (name, dtype, got.dtype)
    if dtype.kind == "f" or dtype == BF16: wide = host.astype(F64)
    else: wide = host.astype(np.int64) if name in ("sum", "prod") else host
    if name in ("mean", "var", "std"): wide = host.astype(F64)
    expected = getattr(np, name)(wide, axis=axis, keepdims=keepdims)
    if expected_dtype.kind in "iu": expected = expected.astype(expected_dtype)
    tol = tolerance(expected_dtype)
    if expected_dtype == F32: tol = dict(rtol=2e-5, atol=2e-5)
    check(got, expected, expected_dtype, **tol)


def test_sum_accuracy_and_dtype_argument():
  host = RNG.uniform(0, 1, size=1 << 18).astype(F32)
  check(tnp.sum(tnp.asarray(host)), host.astype(F64).sum(), F32, rtol=1e-6)
  halves = np.full(4096, 0.1, F16)
  check(tnp.sum(tnp.asarray(halves)), halves.astype(F64).sum(), F16, rtol=1e-3)  # accumulates in float32
  check(tnp.sum(tnp.asarray(np.arange(10, dtype=np.int32)), dtype=tnp.float32), 45.0, F32)
  check(tnp.asarray(np.full((3, 300), 255, np.uint8)).sum(axis=1), np.full(3, 76500), np.uint32)


@pytest.mark.parametrize("shape", [(0,), (3, 0)], ids=str)
def test_empty_reductions(shape):
  x = tnp.zeros(shape)
  check(x.sum(), 0.0, F32)
  check(x.prod(axis=-1), np.ones(shape[:-1]), F32)
  check(tnp.all(x), True, BOOL)
  check(tnp.any(x, axis=0), np.zeros(shape[1:], bool), BOOL)
  with pytest.raises(ValueError):
    x.max()
  with pytest.raises(ValueError):
    tnp.argmax(x)
  check(tnp.max(x, initial=-1.0), -1.0, F32)


@pytest.mark.parametrize("dtype", [F32, I32, BOOL], ids=str)
def test_argmax_argmin(dtype):
  host = make((6, 9, 4), dtype, -2, 2)  # small range: many ties, the first index must win
  x = tnp.asarray(host)
  for axis in (None, 1, -1):
    for name in ("argmax", "argmin"):
      got = getattr(tnp, name)(x, axis=axis)
      check(got, getattr(np, name)(host, axis=axis), I32)
  check(x.argmax(axis=1, keepdims=True), np.argmax(host, axis=1, keepdims=True), I32)


def test_argmax_nan_and_integer_min():
  host = np.array([[1.0, np.nan, 3.0, np.nan], [-np.inf, -np.inf, 2.0, 2.0]], F32)
  check(tnp.argmax(tnp.asarray(host), axis=1), np.argmax(host, axis=1), I32)
  check(tnp.argmin(tnp.asarray(host), axis=1), np.argmin(host, axis=1), I32)
  check(tnp.max(tnp.asarray(host), axis=1), np.max(host, axis=1), F32)
  extremes = np.array([np.iinfo(np.int32).min, 5, np.iinfo(np.int32).max], np.int32)
  check(tnp.min(tnp.asarray(extremes)), extremes.min(), I32)
  check(tnp.min(tnp.asarray(np.array([0, 255, 7], np.uint8))), 0, U8)


def test_var_std_ddof_and_two_pass_accuracy():
  host = (RNG.standard_normal((5, 1000)) + 1e4).astype(F32)
  x = tnp.asarray(host)
  check(tnp.var(x, axis=1), np.var(host.astype(F64), axis=1), F32, rtol=2e-3)
  check(x.std(axis=0, ddof=1), np.std(host.astype(F64), axis=0, ddof=1), F32, rtol=1e-3, atol=1e-3)
  check(tnp.mean(tnp.asarray(np.arange(7, dtype=np.int32))), 3.0, F32)


# ---------------------------------------------------------------------------------------------- creation

def test_creation():
  check(tnp.zeros((2, 3)), np.zeros((2, 3)), F32)
  check(tnp.ones(4, dtype=tnp.int32), np.ones(4), I32)
  check(tnp.full((2, 2), 7), np.full((2, 2), 7), I32)
  assert tnp.full((2,), 1.5).weak_type
  check(tnp.full((2, 3), tnp.asarray(np.arange(3, dtype=np.float32))), np.tile(np.arange(3.0), (2, 1)), F32)
  check(tnp.empty((3,), dtype=BF16), np.zeros(3), BF16)
  host = make((3, 2), BF16)
  for name in ("zeros_like", "ones_like", "empty_like"):
    got = getattr(tnp, name)(tnp.asarray(host))
    assert got.dtype == BF16 and got.shape == (3, 2)
  check(tnp.full_like(tnp.asarray(host), 2, dtype=tnp.int8), np.full((3, 2), 2), I8)
  check(tnp.arange(10), np.arange(10), I32)
  check(tnp.arange(2, 11, 3), np.arange(2, 11, 3), I32)
  check(tnp.arange(5, -4, -2), np.arange(5, -4, -2), I32)
  check(tnp.arange(0.0, 1.0, 0.1), np.arange(0.0, 1.0, 0.1), F32)
  check(tnp.arange(1000), np.arange(1000), I32)
  check(tnp.arange(0), np.arange(0), I32)
  check(tnp.arange(3, dtype=tnp.uint8), np.arange(3), U8)
  check(tnp.linspace(0, 1, 7), np.linspace(0, 1, 7), F32)
  check(tnp.linspace(-2, 5, 10, endpoint=False), np.linspace(-2, 5, 10, endpoint=False), F32)
  check(tnp.linspace(0, 10, 4, dtype=tnp.int32), np.linspace(0, 10, 4).astype(np.int32), I32)
  check(tnp.linspace(tnp.asarray(np.zeros(2, np.float32)), 1.0, 3), np.linspace(np.zeros(2), 1.0, 3), F32)
  check(tnp.eye(3), np.eye(3), F32)
  check(tnp.eye(3, 5, k=1, dtype=tnp.int32), np.eye(3, 5, k=1), I32)
  check(tnp.eye(4, 2, k=-1), np.eye(4, 2, k=-1), F32)
  check(tnp.identity(2, dtype=bool), np.identity(2, bool), BOOL)


def test_asarray_conversions():
  assert tnp.asarray([1, 2, 3]).dtype == I32 and not tnp.asarray([1, 2]).weak_type
  assert tnp.asarray([1, 2.5]).dtype == F32
  assert tnp.asarray([[True, False]]).dtype == BOOL
  assert tnp.asarray(3).dtype == I32 and tnp.asarray(3).weak_type
  assert tnp.asarray(np.float16(2)).dtype == F16
  check(tnp.array([tnp.ones(2), tnp.zeros(2)]), np.array([[1, 1], [0, 0]]), F32)
  check(tnp.array([1, 2], ndmin=3), np.array([1, 2], ndmin=3), I32)
  x = tnp.asarray(np.arange(3.0))
  assert tnp.asarray(x) is x
  for bad in (np.array([1 + 2j], np.clongdouble), np.array(["a"]), np.array([object()], dtype=object)):
    with pytest.raises(TypeError):
      tnp.asarray(bad)


# ---------------------------------------------------------------------------------------------- movement

def test_movement():
  host = make((2, 3, 4), F32)
  x = tnp.asarray(host)
  check(tnp.reshape(x, (4, -1)), host.reshape(4, -1), F32)
  check(x.reshape(6, 4), host.reshape(6, 4), F32)
  check(x.reshape((24,)), host.reshape(24), F32)
  check(tnp.ravel(x.T), np.ravel(host.T), F32)
  check(x.flatten(), host.flatten(), F32)
  check(tnp.transpose(x, (1, 0, 2)), np.transpose(host, (1, 0, 2)), F32)
  check(x.transpose(2, 0, 1), host.transpose(2, 0, 1), F32)
  check(x.mT, np.swapaxes(host, -1, -2), F32)
  check(tnp.moveaxis(x, 0, -1), np.moveaxis(host, 0, -1), F32)
  check(tnp.moveaxis(x, (0, 1), (2, 0)), np.moveaxis(host, (0, 1), (2, 0)), F32)
  check(tnp.swapaxes(x, 0, 2), np.swapaxes(host, 0, 2), F32)
  check(tnp.broadcast_to(x[:, :1], (5, 2, 3, 4)), np.broadcast_to(host[:, :1], (5, 2, 3, 4)), F32)
  a, b = tnp.broadcast_arrays(tnp.ones((3, 1)), tnp.zeros(4))
  assert a.shape == b.shape == (3, 4)
  check(tnp.expand_dims(x, (0, -1)), np.expand_dims(host, (0, -1)), F32)
  check(tnp.squeeze(tnp.ones((1, 3, 1))), np.ones(3), F32)
  check(tnp.ones((1, 3, 1)).squeeze(axis=-1), np.ones((1, 3)), F32)
  check(tnp.flip(x, (0, 2)), np.flip(host, (0, 2)), F32)
  check(tnp.flip(x), np.flip(host), F32)
  check(tnp.concatenate([x, x[:, :1]], axis=1), np.concatenate([host, host[:, :1]], axis=1), F32)
  check(tnp.concatenate([x, tnp.asarray(np.ones((1, 3, 4), np.int32))]), np.concatenate([host, np.ones((1, 3, 4))]),
        F32)
  check(tnp.concatenate([x, x], axis=None), np.concatenate([host, host], axis=None), F32)
  check(tnp.stack([x, x * 2], axis=1), np.stack([host, host * 2], axis=1), F32)
  neg_zero = tnp.concatenate([tnp.asarray(np.array([-0.0], F32)), tnp.ones(1)])
  assert np.signbit(np.asarray(neg_zero))[0]


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric", "wrap"])
def test_pad(mode):
  host = make((3, 4), F32)
  widths = ((1, 2), (2, 0))
  check(tnp.pad(tnp.asarray(host), widths, mode=mode), np.pad(host, widths, mode=mode), F32)
  check(tnp.pad(tnp.asarray(host), 1, mode=mode), np.pad(host, 1, mode=mode), F32)
  if mode == "constant":
    check(tnp.pad(tnp.asarray(host), widths, constant_values=-3.5), np.pad(host, widths, constant_values=-3.5), F32)
    ints = np.arange(5, dtype=np.int32)
    check(tnp.pad(tnp.asarray(ints), (2, 1), constant_values=9), np.pad(ints, (2, 1), constant_values=9), I32)


# ---------------------------------------------------------------------------------------------- indexing

INDICES = [
  (1,), (-1,), (slice(None, None, 2),), (slice(1, -1),), (slice(None, None, -1),), (slice(-2, None, -3),),
  (Ellipsis, 0), (None, 1, Ellipsis, None), (2, slice(None), -3), (slice(10, 2, -2), None, slice(1, 4)),
  (slice(5, 1),), (Ellipsis,), (slice(None, None, 5), slice(None, None, -4), slice(3, 4)), (np.int64(2), np.int32(-1)),
]


@pytest.mark.parametrize("index", INDICES, ids=str)
def test_basic_indexing(index):
  host = make((7, 6, 5), F32)
  check(tnp.asarray(host)[index], host[index], F32)


def test_indexing_out_of_bounds_clamps_and_invalid_indices():
  host = np.arange(5, dtype=np.int32)
  x = tnp.asarray(host)
  check(x[10], 4, I32)
  check(x[-10], 0, I32)
  check(x[3:100], host[3:100], I32)
  with pytest.raises(TypeError, match="non-tuple sequence"):
    x[[0, 1]]
  with pytest.raises(TypeError, match="integer or boolean"):
    x[tnp.asarray(np.array([0.5]))]
  with pytest.raises(IndexError):
    x[1, 2]
  assert [int(v) for v in x] == host.tolist()


# ---------------------------------------------------------------------------------------------- products

@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                                    ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((1, 7), (7, 1)),
                                    ((3, 0), (0, 2)), ((13, 17), (17, 11))], ids=str)
@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=str)
def test_matmul(shapes, dtype):
  a, b = make(shapes[0], dtype, -2, 2), make(shapes[1], dtype, -2, 2)
  expected = np.matmul(a.astype(F64), b.astype(F64)) if dtype != I32 else np.matmul(a, b)
  check(tnp.asarray(a) @ tnp.asarray(b), expected, dtype, **(dict(rtol=1e-5, atol=1e-5) if dtype == F32 else {}))


def test_dot_family():
  a, b = make((3, 4), F32), make((4, 5), F32)
  v, w = make(4, F32), make(4, F32)
  check(tnp.dot(a, b), a.astype(F64) @ b, F32, rtol=1e-5, atol=1e-5)
  check(tnp.asarray(a).dot(v), a.astype(F64) @ v, F32, rtol=1e-5, atol=1e-5)
  check(tnp.dot(make((2, 3, 4), F32), make((5, 4, 2), F32)).shape and tnp.dot(tnp.ones((2, 3, 4)), tnp.ones((5, 4, 2))),
        np.dot(np.ones((2, 3, 4)), np.ones((5, 4, 2))), F32)
  check(tnp.dot(2.0, tnp.asarray(v)), 2.0 * v, F32)
  check(tnp.vdot(a, a), np.vdot(a.astype(F64), a), F32, rtol=1e-5)
  check(tnp.inner(v, w), np.inner(v.astype(F64), w), F32, rtol=1e-5, atol=1e-6)
  check(tnp.inner(a, make((2, 4), F32)).shape and tnp.inner(tnp.ones((3, 4)), tnp.ones((2, 4))), np.full((3, 2), 4.0),
        F32)
  check(tnp.outer(v, w), np.outer(v, w), F32)
  check(tnp.tensordot(tnp.ones((2, 3, 4)), tnp.ones((3, 4, 5))), np.tensordot(np.ones((2, 3, 4)), np.ones((3, 4, 5))),
        F32)
  check(tnp.matmul(tnp.ones((2, 3), dtype=tnp.int8), tnp.ones(3, dtype=tnp.float16)), np.full(2, 3.0), F16)
  check(tnp.asarray(np.ones((2, 3), bool)) @ tnp.asarray(np.ones((3, 2), bool)), np.ones((2, 2), bool), BOOL)
  check(v @ tnp.asarray(w), v.astype(F64) @ w, F32, rtol=1e-5, atol=1e-6)  # numpy array on the left: reflected


# ---------------------------------------------------------------------------------------------- operators

def test_operators_and_reflected_forms():
  host = make((3, 4), I32, 1, 5)
  x = tnp.asarray(host)
  pairs = [(x + 2, host + 2), (2 + x, 2 + host), (x - 1, host - 1), (10 - x, 10 - host), (x * 3, host * 3),
           (x // 3, host // 3), (-7 // x, -7 // host), (x % 3, host % 3), (7 % x, 7 % host), (x ** 2, host ** 2),
           (x & 6, host & 6), (5 | x, 5 | host), (x ^ 3, host ^ 3), (x << 2, host << 2), (x >> 1, host >> 1),
           (1 << x, 1 << host), (-x, -host), (+x, host), (abs(-x), host), (~x, ~host), (x == 2, host == 2),
           (x != 2, host != 2), (x < 2, host < 2), (x <= 2, host <= 2), (x > 2, host > 2), (x >= 2, host >= 2),
           (3 > x, 3 > host), (np.int32(2) * x, 2 * host)]
  for got, expected in pairs:
    check(got, expected, expected.dtype if expected.dtype != np.int64 else I32)
  check(x / 2, host / 2, F32)
  check(2 / x, 2 / host, F32)
  quotient, remainder = divmod(x, 3)
  check(quotient, host // 3, I32)
  check(remainder, host % 3, I32)
  with pytest.raises(TypeError):
    x + [1, 2, 3, 4]
  with pytest.raises(TypeError):
    x + "a"


def test_array_methods():
  host = make((4, 5), F32)
  x = tnp.asarray(host)
  check(x.astype(tnp.int32), host.astype(np.int32), I32)
  check(x.astype("bfloat16"), host.astype(BF16), BF16)
  check(x.sum(), host.astype(F64).sum(), F32, rtol=1e-5, atol=1e-5)
  check(x.mean(axis=0), host.astype(F64).mean(axis=0), F32, rtol=1e-5, atol=1e-6)
  check(x.max(axis=1), host.max(axis=1), F32)
  check(x.min(), host.min(), F32)
  check(x.prod(axis=1), host.astype(F64).prod(axis=1), F32, rtol=1e-5)
  check(x.var(), host.astype(F64).var(), F32, rtol=1e-5)
  check(x.std(axis=1), host.astype(F64).std(axis=1), F32, rtol=1e-5)
  check(x.argmin(axis=0), host.argmin(axis=0), I32)
  check((x > 0).any(axis=0), (host > 0).any(axis=0), BOOL)
  check((x > 0).all(), (host > 0).all(), BOOL)
  check(x.swapaxes(0, 1), host.swapaxes(0, 1), F32)
  check(x.ravel(), host.ravel(), F32)
  check(x.T, host.T, F32)


# ---------------------------------------------------------------------------------------------- fusion

def _kernels(fn):
  counters.reset()
  np.asarray(fn())
  return counters.kernels_launched


def test_fusion_counts():
  x = tnp.asarray(make((64, 48), F32))
  assert _kernels(lambda: x * 2 + 1) == 1
  assert _kernels(lambda: (x * 2 + 1).sum(axis=1)) == 1

  def softmax():
    shifted = x - x.max(axis=-1, keepdims=True)
    exps = tnp.exp(shifted)
    return exps / exps.sum(axis=-1, keepdims=True)
  assert _kernels(softmax) <= 3
  host = np.asarray(x).astype(F64)
  expected = np.exp(host - host.max(-1, keepdims=True))
  check(softmax(), expected / expected.sum(-1, keepdims=True), F32, rtol=1e-5, atol=1e-7)
  b = tnp.asarray(make((48, 32), F32))
  assert _kernels(lambda: x @ b) == 1
  assert _kernels(lambda: tnp.tanh(x[::2, ::-1].T) * 3 - tnp.abs(x.T[::-1, ::2])) == 1


# ---------------------------------------------------------------------------------------------- errors

def test_errors():
  with pytest.raises(TypeError, match=r"\(3, 4\), \(4, 3\)"):
    tnp.ones((3, 4)) + tnp.ones((4, 3))
  with pytest.raises(ValueError, match=r"\(3,\).*\(2, 4\)"):
    tnp.ones(3) + tnp.ones((2, 4))
  with pytest.raises(TypeError, match=r"\(2, 3\).*\(4, 5\)"):
    tnp.ones((2, 3)) @ tnp.ones((4, 5))
  with pytest.raises(TypeError, match=r"cannot reshape array of shape \(2, 3\) \(size 6\) into shape \(4,\)"):
    tnp.ones((2, 3)).reshape(4)
  with pytest.raises(ValueError, match="out of bounds"):
    tnp.ones((2, 3)).sum(axis=2)
  with pytest.raises(ValueError, match="out of bounds"):
    tnp.moveaxis(tnp.ones(2), 1, 0)
  with pytest.raises(TypeError, match="complex256"):
    tnp.asarray(np.ones(2, np.clongdouble))
  with pytest.raises(ValueError):
    tnp.squeeze(tnp.ones((2, 3)), axis=0)
  with pytest.raises(ValueError):
    tnp.broadcast_to(tnp.ones(3), (4, 2))
  with pytest.raises(TypeError):
    tnp.concatenate([tnp.ones((2, 3)), tnp.ones((2, 4))])


def test_dtype_helpers():
  assert tnp.promote_types(tnp.int8, tnp.uint8) == np.dtype(np.int16)
  assert tnp.result_type(tnp.float16, 1.0) == F16
  assert tnp.finfo(tnp.bfloat16).bits == 16 and tnp.iinfo(tnp.uint8).max == 255
  assert float(tnp.finfo(np.float32).eps) == float(np.finfo(np.float32).eps)
  assert tnp.issubdtype(BF16, np.floating)


def test_warnings_free_for_inputs():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    tnp.asarray(np.ones(3))  # float64 data: silently float32, no warning (only explicit dtype= requests warn)
    assert math.isclose(float(tnp.asarray(2.0) * 3), 6.0)


def test_shape_error_kinds_as_jax():
  with pytest.raises(ValueError, match="Incompatible shapes"):  # where: ValueError whatever the ranks
    tnp.where(tnp.ones((2, 3)) > 0, tnp.ones((2, 3)), tnp.ones((2, 4)))
  with pytest.raises(ValueError, match="Incompatible types for matmul"):  # batch dims that do not broadcast
    tnp.ones((2, 3, 4)) @ tnp.ones((3, 4, 5))
  with pytest.raises(TypeError, match="one unknown axis"):
    tnp.ones(6).reshape(-1, -1)


@pytest.mark.parametrize("name", ["atleast_1d", "atleast_2d", "atleast_3d"])
def test_atleast_nd_against_numpy(name):
  for host in (np.float32(3.0), np.arange(3, dtype=np.int32), np.ones((2, 3), np.int8), np.ones((2, 1, 2), BOOL)):
    got = getattr(tnp, name)(tnp.asarray(host))
    np.testing.assert_array_equal(got, getattr(np, name)(host))
    assert got.dtype == host.dtype
  first, second = getattr(tnp, name)(tnp.asarray(1.0), tnp.arange(2))
  assert first.shape == getattr(np, name)(1.0).shape and second.shape == getattr(np, name)(np.arange(2)).shape


def test_stacking_helpers_against_numpy_and_under_transformations():
  rows, ints = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(3, dtype=np.int8)
  for name, args in (("vstack", [rows, ints]), ("hstack", [ints, ints]), ("hstack", [rows, rows]),
                     ("column_stack", [ints, ints]), ("column_stack", [rows.T, ints]), ("dstack", [rows, rows])):
    got = getattr(tnp, name)([tnp.asarray(a) for a in args])
    want = getattr(np, name)(args)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == tnp.result_type(*[tnp.asarray(a) for a in args]), name
  # they are concatenations: differentiable and batchable
  grad = tj.grad(lambda x: (tnp.vstack([x, 2 * x]) ** 2).sum())(tnp.asarray(rows[0]))
  np.testing.assert_allclose(grad, 10 * rows[0])
  batched = tj.jit(tj.vmap(lambda x: tnp.hstack([x, x[::-1]])))(tnp.asarray(rows))
  np.testing.assert_array_equal(batched, np.hstack([rows, rows[:, ::-1]]))
  assert (tnp.ndim(rows), tnp.shape(rows), tnp.size(rows), tnp.size(rows, -1)) == (2, (2, 3), 6, 3)
  assert tnp.isscalar(tnp.asarray(1.0)) and tnp.isscalar(2) and not tnp.isscalar(tnp.arange(2))


def test_tree_namespace():
  tree = {"b": [2, 3], "a": 1}
  assert tj.tree.map(lambda x: x * 2, tree) == {"a": 2, "b": [4, 6]}
  assert tj.tree.leaves(tree) == [1, 2, 3] and tj.tree.reduce(lambda x, y: x + y, tree) == 6
  leaves, treedef = tj.tree.flatten(tree)
  assert tj.tree.unflatten(treedef, leaves) == tree and tj.tree.structure(tree) == treedef
  assert tj.tree.all({"a": True, "b": [1]}) and not tj.tree.all([True, 0])


def test_roll_by_a_traced_shift():
  """`roll` by an array shift, traced under jit (JAX's dynamic roll: the array joined to itself, then a dynamic
  slice): against numpy for scalar and per-axis shifts, negative and larger than the axis, flattened; compiled once
  for every shift; batched per row under vmap, and its gradient the roll back. Bad shifts raise as JAX's do."""
  host = np.arange(12, dtype=np.float32).reshape(3, 4)
  x = tnp.asarray(host)
  rolled = tj.jit(lambda v, s: tnp.roll(v, s))
  by_axes = tj.jit(lambda v, s: tnp.roll(v, s, axis=(0, 1)))
  for shift in (0, 1, -5, 13, 24):
    np.testing.assert_array_equal(rolled(x, shift), np.roll(host, shift))
    np.testing.assert_array_equal(tnp.roll(x, tnp.asarray(shift), axis=1), np.roll(host, shift, axis=1))
  for shifts in ((1, -1), (-4, 7), (3, 4)):
    np.testing.assert_array_equal(by_axes(x, tnp.asarray(shifts)), np.roll(host, shifts, axis=(0, 1)))
  assert rolled._cache_size() == 1
  rows = tj.vmap(lambda row, s: tnp.roll(row, s))(x, tnp.asarray([0, 1, -2]))
  np.testing.assert_array_equal(rows, np.stack([np.roll(host[i], s) for i, s in enumerate((0, 1, -2))]))
  weights = np.arange(12.0, dtype=np.float32).reshape(3, 4)
  grad = tj.jit(tj.grad(lambda v, s: (tnp.roll(v, s, axis=1) * weights).sum()))(x, 3)
  np.testing.assert_array_equal(grad, np.roll(weights, -3, axis=1))
  with pytest.raises(TypeError):
    tnp.roll(x, tnp.asarray(1.5))
  with pytest.raises(ValueError):
    tnp.roll(x, tnp.asarray([1, 2, 3]), axis=(0, 1))


def test_tile_repeat_roll_diff_triangles_against_numpy():
  host = np.arange(12, dtype=np.float32).reshape(3, 4)
  x = tnp.asarray(host)
  for reps in (2, (2, 1), (1, 3, 2), (0, 2)):
    np.testing.assert_array_equal(tnp.tile(x, reps), np.tile(host, reps))
  for repeats, axis in ((2, None), (3, 0), (1, 1), (0, -1)):
    np.testing.assert_array_equal(tnp.repeat(x, repeats, axis), np.repeat(host, repeats, axis))
  for shift, axis in ((1, None), (-5, 0), (2, 1), ((1, 2), (0, 1)), (7, -1)):
    np.testing.assert_array_equal(tnp.roll(x, shift, axis), np.roll(host, shift, axis))
  for n, axis in ((1, -1), (2, 0), (3, 1), (0, 1)):
    np.testing.assert_array_equal(tnp.diff(x, n, axis), np.diff(host, n, axis=axis))
  bools = np.array([True, True, False, True])
  np.testing.assert_array_equal(tnp.diff(tnp.asarray(bools)), np.diff(bools))
  for k in (-1, 0, 2):
    np.testing.assert_array_equal(tnp.tril(x, k), np.tril(host, k))
    np.testing.assert_array_equal(tnp.triu(x, k), np.triu(host, k))
    np.testing.assert_array_equal(tnp.tri(3, 5, k), np.tri(3, 5, k))
  assert tnp.tri(2, dtype=tnp.int32).dtype == np.int32 and tnp.tile(tnp.ones(2, tnp.int8), 2).dtype == np.int8
  np.testing.assert_array_equal(tnp.repeat(x, tnp.asarray([1, 0, 2]), 0), np.repeat(host, [1, 0, 2], 0))
  with pytest.raises(ValueError):
    tnp.tril(tnp.ones(3))
  # they are movement and selection: batchable and differentiable
  batched = tj.jit(tj.vmap(lambda row: tnp.roll(tnp.tile(row, 2), 1)))(x)
  np.testing.assert_array_equal(batched, np.roll(np.tile(host, 2), 1, axis=1))
  grad = tj.grad(lambda v: (tnp.repeat(v, 3) * tnp.arange(12.0)).sum())(tnp.ones(4))
  np.testing.assert_array_equal(grad, np.arange(12.0).reshape(4, 3).sum(1))


@pytest.mark.parametrize("name,reference", [("logaddexp", np.logaddexp), ("logaddexp2", np.logaddexp2)])
def test_logaddexp_against_numpy_and_finite_differences(name, reference):
  fun = getattr(tnp, name)
  a = np.array([0.0, 1.0, -3.0, 100.0, -np.inf, np.inf, np.inf, 20.0, np.nan], np.float32)
  b = np.array([0.0, 2.0, 50.0, 100.0, -np.inf, np.inf, -np.inf, -700.0, 1.0], np.float32)
  got = fun(tnp.asarray(a), tnp.asarray(b))
  with np.errstate(invalid="ignore"):  # inf - inf inside numpy's reference
    np.testing.assert_allclose(got, reference(a.astype(np.float64), b.astype(np.float64)), rtol=2e-6)
  assert fun(tnp.ones(2, tnp.bfloat16), 1).dtype == tnp.bfloat16 and fun(tnp.arange(3), 1).dtype == np.float32
  assert fun(2.0, 3).weak_type
  with config.override("jax_enable_x64", True):
    for x, y in ((0.3, -1.2), (2.0, 2.0), (40.0, -3.0)):
      dx, dy = tj.grad(fun, argnums=(0, 1))(np.float64(x), np.float64(y))
      eps = 1e-6
      at = lambda u, v: float(fun(np.float64(u), np.float64(v)))  # noqa: E731
      fd_x, fd_y = (at(x + eps, y) - at(x - eps, y)) / (2 * eps), (at(x, y + eps) - at(x, y - eps)) / (2 * eps)
      np.testing.assert_allclose([float(dx), float(dy)], [fd_x, fd_y], rtol=1e-6, atol=1e-9)
  # the tie: d/dx logaddexp(x, x) is exactly 1/2 (the composition's max/abs kinks would give 0)
  assert float(tj.grad(lambda v: fun(v, v * 1.0 + 0.0))(1.5)) == pytest.approx(1.0)
  assert float(tj.grad(fun)(1.5, 1.5)) == pytest.approx(0.5)
  np.testing.assert_allclose(tj.vmap(fun)(tnp.asarray(a[:4]), tnp.asarray(b[:4])), np.asarray(got)[:4])


def test_float32_tanh_is_within_two_ulps():
  """float32 tanh is a fitted odd polynomial below 0.625 and 1 - 2 / (e^2|x| + 1) above (lax/_elementwise.py): at
  most 2 ulp from the correctly rounded value over dense sweeps of every binade and of [-12, 12]; the signs of zero,
  infinities and NaN as numpy's."""
  x = np.concatenate([np.linspace(-12, 12, 2_000_001, dtype=np.float32),
                      np.geomspace(np.finfo(np.float32).tiny, 12, 500_000).astype(np.float32)])
  got = np.asarray(tnp.tanh(tnp.asarray(x))).astype(np.float64)
  want = np.tanh(x.astype(np.float64))
  assert (np.abs(got - want) <= 2 * np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)).all()
  specials = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 0.625, -0.625, 3e38])
  got = np.asarray(tnp.tanh(tnp.asarray(specials)))
  np.testing.assert_array_equal(np.signbit(got[:2]), [False, True])
  np.testing.assert_array_equal(got[2:4], [1.0, -1.0])
  assert np.isnan(got[4]) and got[7] == 1.0
  np.testing.assert_allclose(got[5:7], np.tanh(specials[5:7].astype(np.float64)), rtol=3e-7)


@pytest.mark.parametrize("shape", [(4, 6), (24,), (3, 2, 4), (2, -1), (1, 24, 1)])
def test_reshape_in_column_major_order_matches_numpy(shape):
  host = RNG.standard_normal((2, 3, 4)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(tnp.reshape(host, shape, order="F")), np.reshape(host, shape, order="F"))
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: v.reshape(shape, order="F"))(host)),
                                host.reshape(shape, order="F"))
  np.testing.assert_array_equal(np.asarray(tnp.ravel(host, order="F")), np.ravel(host, order="F"))
  # the gradient of a weighted sum: the weights put back where each element came from
  weights = RNG.standard_normal(24).astype(np.float32)
  grad = tj.grad(lambda v: (tnp.reshape(v, (24,), order="F") * weights).sum())(host)
  np.testing.assert_array_equal(np.asarray(grad), np.reshape(weights, (2, 3, 4), order="F"))
  with pytest.raises(NotImplementedError, match="'C' or 'F'"):
    tnp.reshape(host, shape, order="A")


def test_eager_scalar_operands_take_the_short_path_with_the_lattice_s_results():
  """`x * 2.0` eagerly skips the promotion lattice where the array's dtype holds the scalar, and builds the broadcast
  constant once (`lax._base._EAGER_CONSTANTS`): the results are the lattice's, for every dtype and weak type, and
  constants that compare equal but differ (-0.0 and 0.0, NaN) stay apart."""
  from tinyjax.numpy._elementwise import _same_dtype_operands
  for dtype in (np.float16, dtypes.bfloat16, np.float32, np.int32, np.uint8, np.int8, np.bool_, np.complex64):
    for weak in (False, True):
      x = tnp.asarray(np.ones(3, dtype))
      if weak: x = x.astype(dtype) * 1 if dtype != np.bool_ else x
      for scalar in (2, -3, 2.5, True, 1j, -0.0):
        for a, b in ((x, scalar), (scalar, x)):
          short = _same_dtype_operands(a, b, False, False)
          try: want = tnp.result_type(a, b)
          except Exception: continue
          got = tnp.add(a, b)
          assert got.dtype == want, (dtype, weak, scalar)
          if short is not None: assert short[0].dtype == short[1].dtype == x.dtype and isinstance(scalar, (int, float))
  x = tnp.asarray(np.ones(4, np.float32))
  assert not np.signbit(np.asarray(x * 0.0)).any() and np.signbit(np.asarray(x * -0.0)).all()
  assert np.isnan(np.asarray(x * float("nan"))).all() and np.asarray(x + (2**31 - 1)).dtype == np.float32
  with pytest.raises(OverflowError):
    x + 2**31
  # the constant reused across calls and traces: jit and grad see their own
  f = tj.jit(lambda v: v * 3.0 + 1.0)
  np.testing.assert_array_equal(np.asarray(f(x)), np.full(4, 4.0, np.float32))
  np.testing.assert_array_equal(np.asarray(x * 3.0 + 1.0), np.full(4, 4.0, np.float32))
  assert float(tj.grad(lambda v: (v * 3.0).sum())(x)[0]) == 3.0


def test_where_with_a_python_scalar_promotes_as_jax():
  """`jnp.where(c, x, 0)` takes the ufuncs' shortcut for an array and a Python scalar its dtype holds, and otherwise
  the promotion lattice: the dtypes and weak types JAX gives, values against numpy, either side, broadcast."""
  import ml_dtypes
  condition = np.array([True, False, True, False])
  f32 = np.array([1.5, -2.0, 3.0, 4.0], np.float32)
  i32 = np.array([1, 2, 3, 4], np.int32)
  cases = [  # (x, y, dtype, weak)
    (f32, 0, np.float32, False), (0, f32, np.float32, False), (f32, 2.5, np.float32, False),
    (i32, 7, np.int32, False), (i32, 2.5, np.float32, True), (True, i32, np.int32, False),
    (f32.astype(ml_dtypes.bfloat16), 1.0, ml_dtypes.bfloat16, False), (f32[:1], i32, np.float32, False),
  ]
  for x, y, dtype, weak in cases:
    got = tnp.where(tnp.asarray(condition), x if np.isscalar(x) else tnp.asarray(x),
                    y if np.isscalar(y) else tnp.asarray(y))
    assert got.dtype == np.dtype(dtype) and got.weak_type == weak, (x, y, got.dtype, got.weak_type)
    want = np.where(condition, np.asarray(x, np.float64), np.asarray(y, np.float64))
    np.testing.assert_array_equal(np.asarray(got, np.float64), want.astype(dtype).astype(np.float64))
