"""float8 arrays (lower/float8.py): conversions bit for bit against ml_dtypes, arithmetic as the float32 computation
rounded to float8 after each operation (what JAX 0.10 on the CPU gives: the literal values below are JAX's), under
eager, jit, vmap and grad, promotion and errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax import lax
from tinyjax.dtypes import TypePromotionError
from tinyjax.lower.float8 import FORMATS

FORMAT_NAMES = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
                "float8_e4m3", "float8_e3m4"]
E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)


def _dtype(name: str) -> np.dtype: return np.dtype(getattr(ml_dtypes, name))


def assert_same_bits(got, want):
  """Equal bit for bit (so -0 is not 0, and a NaN's sign and payload count)."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
  unsigned = np.dtype(f"u{got.dtype.itemsize}")
  bad = np.flatnonzero(got.view(unsigned) != want.view(unsigned))
  shown = bad[:5]
  assert bad.size == 0, f"{bad.size} differ, e.g. at {shown}: got {got.ravel()[shown]}, want {want.ravel()[shown]}"


def assert_same_values(got, want, label: str = ""):
  """Equal values with the same dtype, NaN where the other has NaN, -0 where the other has -0."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype and got.shape == want.shape, (label, got.dtype, want.dtype, got.shape, want.shape)
  g, w = got.astype(np.float64), want.astype(np.float64)
  np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=label)
  np.testing.assert_array_equal(np.where(np.isnan(g), 0, g), np.where(np.isnan(w), 0, w), err_msg=label)
  np.testing.assert_array_equal(np.signbit(g) & ~np.isnan(g), np.signbit(w) & ~np.isnan(w), err_msg=label)


def rounded(values, dtype) -> np.ndarray:
  """float32 values rounded to `dtype` by ml_dtypes (the reference of every operation's rounding)."""
  return np.asarray(values, np.float32).astype(dtype)


def all_codes(dtype: np.dtype) -> np.ndarray:
  return np.arange(256, dtype=np.uint8).view(dtype)


# ------------------------------------------------------------------------------------------------ conversions

@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_every_code_decodes_as_ml_dtypes(name):
  dtype = _dtype(name)
  codes = all_codes(dtype)
  want = codes.astype(np.float32)
  assert_same_bits(jnp.asarray(codes).astype(jnp.float32), want)
  assert_same_bits(tj.jit(lambda x: x.astype(jnp.float32))(codes), want)
  # (to 16-bit floats: NaN as NaN; OpenCL's float32 -> float16 conversion gives a NaN other bits than numpy's)
  assert_same_values(jnp.asarray(codes).astype(jnp.float16), codes.astype(np.float32).astype(np.float16))
  assert_same_values(jnp.asarray(codes).astype(jnp.bfloat16), codes.astype(np.float32).astype(ml_dtypes.bfloat16))
  # moving, selecting and gathering move the bytes: every code comes back as it was (NaN payloads and -0 included)
  assert_same_bits(tj.jit(lambda x: jnp.where(jnp.arange(256) % 2 == 0, x, x[::-1])[::-1].reshape(16, 16).T.ravel())(
    codes), np.where(np.arange(256) % 2 == 0, codes, codes[::-1])[::-1].reshape(16, 16).T.ravel())


def _float32_sweep(dtype: np.dtype) -> np.ndarray:
  """float32 values around every float8 value: the value, the ties between neighbours and one float32 step either
  side of them, subnormals of both types, beyond the largest value, and the specials (+-0, +-inf, NaN)."""
  finite = np.unique(all_codes(dtype).astype(np.float64))
  finite = finite[np.isfinite(finite)]
  ties = (finite[1:] + finite[:-1]) / 2
  points = np.concatenate([finite, ties, [2 * finite.max(), finite.max() * 1.0625, finite.max() * 1.0624]]).astype(
    np.float32)
  near = np.concatenate([points, np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(-np.inf))])
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, 3e38, 1e-8, 1e-20],
                      np.float32)
  # every float32 whose low 16 bits are zero (all exponents, 7 mantissa bits), and as many with random low bits
  high = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
  noise = np.random.default_rng(0).integers(0, 1 << 16, 1 << 16, dtype=np.uint32)
  jittered = ((np.arange(1 << 16, dtype=np.uint32) << 16) | noise).view(np.float32)
  values = np.concatenate([near, -near, specials, high, jittered])
  return values[~np.isnan(values) | (values.view(np.uint32) & 0x3FFFFF == 0)]  # (NaNs: the quiet ones without payload)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_float32_sweep_encodes_as_ml_dtypes(name):
  dtype = _dtype(name)
  values = _float32_sweep(dtype)
  assert_same_bits(jnp.asarray(values).astype(dtype), values.astype(dtype))
  assert_same_bits(tj.jit(lambda x: x.astype(dtype))(values), values.astype(dtype))


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_float16_bfloat16_and_float8_convert_through_float32(name):
  dtype = _dtype(name)
  rng = np.random.default_rng(1)
  wide = (rng.standard_normal(4096) * np.exp2(rng.integers(-20, 18, 4096))).astype(np.float32)
  for source in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
    with np.errstate(over="ignore"): narrow = wide.astype(source)
    assert_same_bits(jnp.asarray(narrow).astype(dtype), narrow.astype(np.float32).astype(dtype))
  for other_name in FORMAT_NAMES:
    other = all_codes(_dtype(other_name))
    want = other if other_name == name else other.astype(np.float32).astype(dtype)  # (to itself: no change at all)
    assert_same_bits(tj.jit(lambda x: x.astype(dtype))(other), want)


def test_float64_rounds_once_as_jax():
  """JAX rounds float64 -> float8 once; through float32 (ml_dtypes' float64 conversion) 1.0625 + 2^-40, just above the
  tie between 1 and 1.125, would round twice (to 1.0625, then to even 1)."""
  values = np.array([1.0625 + 2.0 ** -40, 1.0625 - 2.0 ** -40, 1.0625, 464.0 + 2.0 ** -30, 464.0, -np.inf, np.nan,
                     -0.0, 1e300, 2.0 ** -10 + 2.0 ** -40, 480 + 2.0 ** -30, 480.0, 2.0 ** -17 + 2.0 ** -50,
                     2.0 ** -17])
  with tj.config.override("jax_enable_x64", True):  # (JAX's values)
    assert_same_values(jnp.asarray(values).astype(jnp.float8_e4m3fn), np.array(
      [1.125, 1, 1, np.nan, 448, np.nan, np.nan, -0.0, np.nan, 2.0 ** -9, np.nan, np.nan, 0, 0], E4M3FN))
    assert_same_values(tj.jit(lambda x: x.astype(jnp.float8_e5m2))(values), np.array(
      [1, 1, 1, 448, 448, -np.inf, np.nan, -0.0, np.inf, 2.0 ** -10, 512, 512, 2.0 ** -16, 0], ml_dtypes.float8_e5m2))
    back = jnp.asarray(all_codes(E4M3FN)).astype(jnp.float64)
    assert back.dtype == np.float64
    assert_same_values(back, all_codes(E4M3FN).astype(np.float64))


def test_integer_conversions_as_jax():
  ints = np.array([17, 19, 100000, -7, 449, 464, 465], np.int32)
  assert_same_values(jnp.asarray(ints).astype(jnp.float8_e4m3fn),
                     np.array([16, 20, np.nan, -7, 448, 448, np.nan], E4M3FN))
  assert_same_values(jnp.asarray(ints).astype(jnp.float8_e5m2),
                     np.array([16, 20, np.inf, -7, 448, 448, 448], ml_dtypes.float8_e5m2))
  y = jnp.array([1.5, -2.5, 448, -448, np.nan], jnp.float8_e4m3fn)
  np.testing.assert_array_equal(y.astype(jnp.int8), [1, -2, 127, -128, 0])  # (saturating; NaN -> 0, as XLA)
  np.testing.assert_array_equal(y.astype(jnp.uint8), [1, 0, 255, 0, 0])
  np.testing.assert_array_equal(y.astype(jnp.int32), [1, -2, 448, -448, 0])
  np.testing.assert_array_equal(y.astype(jnp.bool_), [True] * 5)
  booleans = jnp.asarray(np.array([True, False]))
  np.testing.assert_array_equal(booleans.astype(jnp.float8_e5m2).astype(jnp.float32), [1, 0])


def test_bitcasts():
  y = jnp.array([1.5, -2.25, 20.0, 0.1], jnp.float8_e4m3fn)
  np.testing.assert_array_equal(lax.bitcast_convert_type(y, jnp.uint8), [60, 193, 90, 29])
  assert_same_bits(lax.bitcast_convert_type(jnp.array([0x7F, 0x80, 1], jnp.uint8), jnp.float8_e4m3fn),
                   np.array([0x7F, 0x80, 1], np.uint8).view(E4M3FN))


# ------------------------------------------------------------------------------------------------ arithmetic

def _operands(dtype: np.dtype, seed: int, shape=(6, 40)) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rounded(rng.standard_normal(shape) * 2.0 ** rng.integers(-3, 4, shape), dtype)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_arithmetic_is_float32_rounded_after_each_operation(name):
  dtype = _dtype(name)
  x, y = _operands(dtype, 2), _operands(dtype, 3)
  x32, y32 = x.astype(np.float32), y.astype(np.float32)
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"): cases = {
    "add": (lambda a, b: a + b, x32 + y32), "sub": (lambda a, b: a - b, x32 - y32),
    "mul": (lambda a, b: a * b, x32 * y32), "div": (lambda a, b: a / b, x32 / y32),
    "max": (jnp.maximum, np.maximum(x32, y32)), "neg": (lambda a, b: -a, -x32),
    "chain": (lambda a, b: (a * b + a) * b, rounded(rounded(rounded(x32 * y32, dtype).astype(np.float32) + x32, dtype)
                                                    .astype(np.float32) * y32, dtype).astype(np.float32)),
    "sum": (lambda a, b: jnp.sum(a * b, axis=1), rounded(x32 * y32, dtype).astype(np.float32).sum(axis=1)),
    "max over axis": (lambda a, b: jnp.max(a, axis=0), x32.max(axis=0)),
  }
  for label, (f, want) in cases.items():
    expected = rounded(want, dtype)
    assert_same_values(f(jnp.asarray(x), jnp.asarray(y)), expected, label)
    assert_same_values(tj.jit(f)(x, y), expected, f"jit {label}")
  # functions of lax run in float32 and round once: the same as computing them in float32 here
  for f in (jnp.exp, jnp.tanh, jnp.sin, lambda a: jnp.sqrt(jnp.abs(a)), lambda a: jnp.log(jnp.abs(a))):
    assert_same_values(f(jnp.asarray(x)), np.asarray(f(jnp.asarray(x32))).astype(dtype))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_matmul_accumulates_in_float32_and_rounds_once(name):
  dtype = _dtype(name)
  rng = np.random.default_rng(4)
  a = rounded(rng.integers(-8, 9, (5, 16)) * 0.25, dtype)  # (products and sums exact in float32)
  b = rounded(rng.integers(-8, 9, (16, 3)) * 0.5, dtype)
  exact = a.astype(np.float32) @ b.astype(np.float32)
  assert_same_values(jnp.asarray(a) @ jnp.asarray(b), rounded(exact, dtype))
  assert_same_values(tj.jit(jnp.matmul)(a, b), rounded(exact, dtype))
  wide = jnp.dot(jnp.asarray(a), jnp.asarray(b), preferred_element_type=jnp.float32)
  assert wide.dtype == np.float32
  np.testing.assert_array_equal(wide, exact)


def test_values_jax_gives():
  x = jnp.array([1.5, -2.25, 300, 0.1], jnp.float8_e4m3fn)
  assert_same_values(x, np.array([1.5, -2.25, 288, 0.1015625], E4M3FN))
  assert_same_values(x * x, np.array([2.25, 5, np.nan, 0.009765625], E4M3FN))  # (288^2 overflows to NaN)
  assert_same_values(x + x, np.array([3, -4.5, np.nan, 0.203125], E4M3FN))
  assert_same_values(jnp.exp(x), np.array([4.5, 0.1015625, np.nan, 1.125], E4M3FN))
  assert_same_values(x / 3, np.array([0.5, -0.75, 96, 0.03515625], E4M3FN))
  assert_same_values(jnp.array([1.5, 2.5], jnp.float8_e4m3fn) + 1.7, np.array([3.25, 4], E4M3FN))
  e5 = jnp.array([1.5, -2.25, 300, 0.1, 60000], jnp.float8_e5m2)
  assert_same_values(e5 ** 2, np.array([2, 4, np.inf, 0.0078125, np.inf], ml_dtypes.float8_e5m2))
  y = jnp.array([1.5, -2.25, 20.0, 0.1], jnp.float8_e4m3fn)
  assert_same_values(jnp.cumsum(jnp.array([1.5, 2.25, 3.5, 0.125], jnp.float8_e4m3fn)), np.array([1.5, 3.75, 7.5, 7],
                                                                                                    E4M3FN))
  assert_same_values(jnp.sort(y), np.array([-2.25, 0.1015625, 1.5, 20], E4M3FN))
  assert int(jnp.argmax(y)) == 2
  assert_same_values(jnp.round(y), np.array([2, -2, 20, 0], E4M3FN))
  assert_same_values(jnp.floor(y), np.array([1, -3, 20, 0], E4M3FN))
  assert_same_values(jnp.linspace(0, 1, 5, dtype=jnp.float8_e4m3fn), np.array([0, 0.25, 0.5, 0.75, 1], E4M3FN))
  # gathers and scatters (duplicates of an add accumulate: 1.5 + 1 + 1; 20 + 1 rounds to even 20)
  index = jnp.array([0, 0, 2])
  assert_same_values(y[jnp.array([3, 0, 3])], np.array([0.1015625, 1.5, 0.1015625], E4M3FN))
  assert_same_values(y.at[index].add(jnp.ones(3, jnp.float8_e4m3fn)), np.array([3.5, -2.25, 20, 0.1015625], E4M3FN))
  assert_same_values(y.at[1].set(7.0), np.array([1.5, 7, 20, 0.1015625], E4M3FN))


# ------------------------------------------------------------------------------------------------ transformations

def test_jit_vmap_and_control_flow():
  y = jnp.array([1.5, -2.25, 20.0, 0.1], jnp.float8_e4m3fn)

  def f(r): return r * r + r
  want = np.array([[3.75, 2.75], [416, 0.109375]], E4M3FN)
  assert_same_values(tj.vmap(f)(y.reshape(2, 2)), want)
  assert_same_values(tj.jit(tj.vmap(f))(y.reshape(2, 2)), want)
  assert_same_values(f(y).reshape(2, 2), want)

  def body(carry, x):
    carry = carry * jnp.array(1.5, jnp.float8_e4m3fn) + x
    return carry, carry
  final, ys = lax.scan(body, jnp.array(1.0, jnp.float8_e4m3fn), jnp.array([0.5, 1.0, 2.0, 100.0], jnp.float8_e4m3fn))
  assert_same_values(final, np.array(112, E4M3FN))
  assert_same_values(ys, np.array([2, 4, 8, 112], E4M3FN))
  grown = lax.while_loop(lambda c: c < 100, lambda c: c * jnp.array(3.0, jnp.float8_e4m3fn),
                         jnp.array(1.1, jnp.float8_e4m3fn))
  assert_same_values(grown, np.array(256, E4M3FN))  # 1.125 -> 3.375 -> 10 -> 30 -> 88 -> 256 (each product rounded)
  picked = tj.jit(lambda i, a: lax.cond(i > 0, lambda v: v * v, lambda v: -v, a))
  assert_same_values(picked(1, y), np.array([2.25, 5, 400, 0.009765625], E4M3FN))
  assert_same_values(picked(0, y), np.array([-1.5, 2.25, -20, -0.1015625], E4M3FN))
  # a host call gets and returns float8 arrays
  called = tj.jit(lambda a: tj.pure_callback(lambda v: (v.astype(np.float32) * 2).astype(v.dtype),
                                             tj.ShapeDtypeStruct(a.shape, a.dtype), a))(y)
  assert_same_values(called, np.array([3, -4.5, 40, 0.203125], E4M3FN))


def test_grad_through_float8():
  """JAX's values: the cotangent of a cast is cast back (2 * 288 = 576 overflows float8_e4m3fn to NaN)."""
  x = jnp.array([1.1, 2.3, 300.0], jnp.float32)
  g = tj.grad(lambda v: (v.astype(jnp.float8_e4m3fn).astype(jnp.float32) ** 2).sum())(x)
  assert g.dtype == np.float32
  assert_same_values(g, np.array([2.25, 4.5, np.nan], np.float32))
  y = jnp.array([1.5, -2.25, 20.0, 0.1], jnp.float8_e4m3fn)
  g = tj.grad(lambda v: (v * v).astype(jnp.float32).sum())(y)
  assert_same_values(g, np.array([3, -4.5, 40, 0.203125], E4M3FN))
  assert_same_values(tj.jit(tj.grad(lambda v: jnp.sum(jnp.exp(v)).astype(jnp.float32)))(y),
                     np.array([4.5, 0.1015625, np.nan, 1.125], E4M3FN))
  # the same value cast twice: two casts, each cotangent cast back to float32 before they meet (JAX: 576, not NaN)
  def twice(v): return (v.astype(jnp.float8_e4m3fn) * v.astype(jnp.float8_e4m3fn)).astype(jnp.float32).sum()
  for transformed in (tj.grad(twice), tj.jit(tj.grad(twice)), tj.grad(tj.jit(twice))):
    assert_same_values(transformed(x), np.array([2.25, 4.5, 576.0], np.float32))


# ------------------------------------------------------------------------------------------------ dtypes

@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_promotion_finfo_and_names(name):
  dtype = _dtype(name)
  scalar_type = getattr(jnp, name)
  assert np.dtype(scalar_type) == dtype and name in jnp.__all__ and jnp.issubdtype(dtype, jnp.floating)
  for other in ("bool", "int8", "uint8", "int32", name):
    assert jnp.promote_types(dtype, other) == dtype
  assert jnp.promote_types(dtype, int) == dtype and jnp.promote_types(dtype, float) == dtype
  for other in ("float16", "bfloat16", "float32", "float64", *(n for n in FORMAT_NAMES if n != name)):
    with pytest.raises(TypePromotionError, match="8-bit floats do not support implicit promotion"):
      jnp.promote_types(dtype, other)
  x = jnp.ones(3, dtype)
  with pytest.raises(ValueError, match="no available implicit dtype promotion path"):
    x + jnp.ones(3, jnp.float32)
  assert (x + 1.5).dtype == dtype and (x * jnp.ones(3, jnp.int32)).dtype == dtype
  info, want = jnp.finfo(dtype), ml_dtypes.finfo(dtype)
  assert (float(info.max), float(info.eps), float(info.tiny), info.bits) == (float(want.max), float(want.eps),
                                                                            float(want.tiny), 8)
  fmt = FORMATS[dtype]  # the lowering's parameters give the same largest value
  max_code = np.array(fmt.max_code, np.uint8).view(dtype)
  assert float(max_code) == float(want.max)


def test_schedules_are_not_shared_between_formats():
  """Every float8 dtype's str is '<V1': programs that differ only in the format must not share a compiled schedule."""
  y = jnp.array([1.5, -2.25, 20.0, 0.1], jnp.float8_e4m3fn)
  for name in FORMAT_NAMES:
    dtype = _dtype(name)
    assert_same_values(y.astype(dtype), np.asarray(y).astype(np.float32).astype(dtype))


def test_opencl_device_computes_as_the_cpu():
  """The lowering leaves no float8 value to a backend: a float8 program on the OpenCL device (PoCL in tests) gives the
  CPU's bytes, and its float8 results live on the device."""
  from tinyjax.devices import opencl
  from tinyjax.devices.device import CPU
  if not opencl.device_count(): pytest.skip("no OpenCL device (PoCL and pyopencl)")
  device = opencl.opencl_devices()[0]
  x, y = _operands(E4M3FN, 5, (8, 24)), _operands(np.dtype(ml_dtypes.float8_e5m2), 6, (24, 4))

  def program(a, b):
    c = a.astype(jnp.float8_e5m2) @ b
    return (a * a + a, jnp.exp(a), jnp.sum(a, axis=1), c, c.astype(jnp.float32), (a / 3).astype(jnp.float8_e4m3fnuz),
            jnp.where(a > 0, a, -a)[::-1])
  for f in (program, tj.jit(program)):
    on_device = f(tj.device_put(x, device), tj.device_put(y, device))
    on_cpu = f(tj.device_put(x, CPU), tj.device_put(y, CPU))
    for got, want in zip(on_device, on_cpu):
      assert got.device is device
      assert_same_bits(np.asarray(got), np.asarray(want))
