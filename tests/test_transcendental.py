"""EXP2, LOG2 and SIN as the renderer decomposes them (codegen/transcendental.py): accuracy in ulps against numpy's
float64 functions rounded to the dtype, special values, every float16 / bfloat16, vectorised code without libm calls,
and the constants and polynomial fits the module states."""
from __future__ import annotations

import ctypes
import math
import re
from fractions import Fraction

import numpy as np
import pytest
from test_codegen import BF16, F16, F32, F64, compile_kernel, elementwise, optimized_module, target_machine

from tinyjax.codegen import transcendental
from tinyjax.codegen.llvm import render_llvm
from tinyjax.uop import Ops

REFERENCE = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.COS: np.cos}
# how far (in steps of the dtype's ulp) a result may be from the correctly rounded one: float32 is within 1 ulp;
# float16 / bfloat16 round the float32 result of EXP2 / LOG2 once more (1 step), SIN rounds its float64 result once
MAX_STEPS = {(Ops.EXP2, F32): 1, (Ops.LOG2, F32): 1, (Ops.SIN, F32): 1, (Ops.EXP2, F16): 1, (Ops.LOG2, F16): 1,
             (Ops.SIN, F16): 0, (Ops.EXP2, BF16): 1, (Ops.LOG2, BF16): 1, (Ops.SIN, BF16): 0, (Ops.COS, F32): 1,
             (Ops.COS, F16): 0, (Ops.COS, BF16): 0}
# the largest error measured against the exact value, in ulps of the float32 result (SIN: the float64 result rounded)
MAX_ULPS_F32 = {Ops.EXP2: 1.0, Ops.LOG2: 1.02, Ops.SIN: 0.502, Ops.COS: 0.502}


def run_elementwise(op: Ops, dtype: np.dtype, values: np.ndarray) -> np.ndarray:
  """op(values) through the decomposition (rendered with `optimize=True`, whatever NOOPT says)."""
  out = np.zeros(len(values), dtype)
  kernel = compile_kernel(render_llvm("kernel", elementwise(op, [values.dtype], dtype, len(values)), optimize=True))
  kernel((ctypes.c_void_p * 2)(out.ctypes.data, values.ctypes.data), 0, len(values))
  return out


def reference(op: Ops, values: np.ndarray) -> np.ndarray:
  with np.errstate(all="ignore"): return REFERENCE[op](values.astype(F64))


def ordered_bits(values: np.ndarray) -> np.ndarray:
  """Float bits as integers that are consecutive for consecutive floats (-0 and +0 both 0)."""
  bits = values.view(np.int16 if values.itemsize == 2 else np.int32).astype(np.int64)
  magnitude = bits & (0x7FFF if values.itemsize == 2 else 0x7FFFFFFF)
  return np.where(bits < 0, -magnitude, magnitude)


def check(op: Ops, dtype: np.dtype, values: np.ndarray) -> float:
  """Run `op` on `values`: NaN and infinities where the reference has them, finite results within MAX_STEPS of the
  correctly rounded reference. Returns the largest error in ulps of the result against the exact value."""
  actual = run_elementwise(op, dtype, values)
  exact = reference(op, values)
  with np.errstate(over="ignore"): rounded = exact.astype(dtype)
  nan = np.isnan(rounded)
  np.testing.assert_array_equal(np.isnan(actual), nan, err_msg=f"NaN mismatch for {op.name}")
  infinite = np.isinf(rounded)
  np.testing.assert_array_equal(actual[infinite], rounded[infinite])
  finite = ~nan & ~infinite
  steps = np.abs(ordered_bits(actual[finite]) - ordered_bits(rounded[finite]))
  worst = int(np.argmax(steps)) if steps.size else 0
  assert steps.size == 0 or steps[worst] <= MAX_STEPS[(op, dtype)], \
    f"{op.name} {dtype}: {steps[worst]} ulp steps at x={values[finite][worst]!r}"
  spacing = np.spacing(np.abs(rounded[finite])).astype(F64)
  return float((np.abs(actual[finite].astype(F64) - exact[finite]) / spacing).max()) if steps.size else 0.0


def float32_sweep(seed: int) -> np.ndarray:
  """~1.3M float32s: every 4093rd bit pattern (all binades, both signs, NaNs, subnormals), a dense run around 1 and
  random values of moderate size."""
  rng = np.random.default_rng(seed)
  strided = np.arange(0, 1 << 32, 4093, dtype=np.int64).astype(np.uint32).view(F32)
  near_one = np.arange(0x3F000000, 0x40000000, 97, dtype=np.int64).astype(np.uint32).view(F32)
  moderate = rng.uniform(-200, 200, 200_000).astype(F32)
  return np.concatenate([strided, near_one, moderate])


@pytest.mark.parametrize("op", list(REFERENCE), ids=lambda op: op.name)
def test_float32_sweep(op: Ops):
  assert check(op, F32, float32_sweep(seed=0)) <= MAX_ULPS_F32[op]


@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("op", list(REFERENCE), ids=lambda op: op.name)
def test_every_16_bit_value(op: Ops, dtype: np.dtype):
  check(op, dtype, np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype))


def test_exp2_special_values():
  integers = np.arange(-160, 161).astype(F32)
  with np.errstate(over="ignore"): expected = np.exp2(integers.astype(F64)).astype(F32)
  np.testing.assert_array_equal(run_elementwise(Ops.EXP2, F32, integers), expected)
  values = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, 127.99999, 128.0, -149.0, -149.5,
                     -150.0, -150.00002, 1e30, -1e30], F32)
  expected = np.array([1.0, 1.0, np.inf, 0.0, np.nan, 1.0, 1.0, 1.0, np.exp2(np.float64(np.float32(127.99999))),
                       np.inf, 2.0 ** -149, 2.0 ** -149, 0.0, 0.0, np.inf, 0.0], F32)
  np.testing.assert_array_equal(run_elementwise(Ops.EXP2, F32, values), expected)


def test_log2_special_values():
  powers = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(F32)
  np.testing.assert_array_equal(run_elementwise(Ops.LOG2, F32, powers), np.arange(-149, 128).astype(F32))
  values = np.array([0.0, -0.0, -1.0, -1e-45, -np.inf, np.inf, np.nan, 1.0, 3.4028235e38, 1e-45], F32)
  expected = np.array([-np.inf, -np.inf, np.nan, np.nan, np.nan, np.inf, np.nan, 0.0, 128.0, -149.0], F32)
  actual = run_elementwise(Ops.LOG2, F32, values)
  np.testing.assert_array_equal(actual, expected)
  assert not np.signbit(actual[7])  # log2(1) = +0


def test_sin_special_values():
  values = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-30, -3e-8, np.inf, -np.inf, np.nan], F32)
  actual = run_elementwise(Ops.SIN, F32, values)
  np.testing.assert_array_equal(actual[:6], values[:6])
  np.testing.assert_array_equal(np.signbit(actual[:6]), np.signbit(values[:6]))
  assert np.isnan(actual[6:]).all()


def test_sin_large_arguments():
  """Every binade up to float32's largest value, near multiples of pi / 2 included (no bound where it degrades)."""
  rng = np.random.default_rng(1)
  exponents = rng.integers(0, 128, 200_000)
  values = np.ldexp(rng.uniform(1, 2, exponents.size), exponents).astype(F32) * rng.choice([-1, 1], exponents.size)
  multiples = (np.arange(1, 100_000) * (np.pi / 2)).astype(F32)  # float32 values closest to k pi / 2
  extremes = np.array([np.finfo(F32).max, -np.finfo(F32).max, 2.0 ** 24, 2.0 ** 39, 2.0 ** 63, 1e5, 71476.0625], F32)
  assert check(Ops.SIN, F32, np.concatenate([values.astype(F32), multiples, extremes])) <= MAX_ULPS_F32[Ops.SIN]
  # cos: the same reduction one quadrant on, so its results near its zeros (odd multiples of pi / 2) keep their
  # relative accuracy (1 - 2 sin(x/2)^2 gave 6e-8 for cos(float32(pi/2)) = -4.37e-8)
  assert check(Ops.COS, F32, np.concatenate([values.astype(F32), multiples, extremes])) <= MAX_ULPS_F32[Ops.COS]
  cos_values = np.array([0.0, -0.0, 1e-45, -3e-8, np.pi / 2, np.inf, -np.inf, np.nan], F32)
  actual = run_elementwise(Ops.COS, F32, cos_values)
  np.testing.assert_array_equal(actual[:4], np.ones(4, F32))
  assert actual[4] == np.float32(np.cos(np.float64(np.float32(np.pi / 2)))) and np.isnan(actual[5:]).all()


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
@pytest.mark.parametrize("op", list(REFERENCE), ids=lambda op: op.name)
def test_vectorises_without_libm(op: Ops, dtype: np.dtype):
  """out[i] = op(in[i]) becomes vector code (AVX2 or AVX-512) and calls nothing."""
  module = optimized_module(render_llvm("kernel", elementwise(op, [dtype], dtype, 1 << 16), optimize=True))
  assert re.search(r"<(8|16|32) x float>", str(module))
  assert not re.search(r"call\s", target_machine().emit_assembly(module))


@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS], ids=lambda op: op.name)
def test_float64_vectorises_without_libm(op: Ops):
  """float64 EXP2 / LOG2 / SIN / COS on the CPU are transcendental.py's float64 arithmetic (the GPU's): vector code
  that calls nothing (libm's scalar calls kept the loop scalar)."""
  module = optimized_module(render_llvm("kernel", elementwise(op, [F64], F64, 1 << 16), optimize=True))
  assert re.search(r"<(4|8) x double>", str(module))
  assert not re.search(r"call\s", target_machine().emit_assembly(module))


def test_noopt_keeps_libm():
  for op, intrinsic in ((Ops.EXP2, "llvm.exp2.f32"), (Ops.LOG2, "llvm.log2.f32"), (Ops.SIN, "llvm.sin.f32"),
                        (Ops.COS, "llvm.cos.f32"), (Ops.SIN, "llvm.sin.f64")):
    dtype = F64 if intrinsic.endswith("f64") else F32
    assert intrinsic in render_llvm("kernel", elementwise(op, [dtype], dtype, 64), optimize=False)
    assert intrinsic not in render_llvm("kernel", elementwise(op, [dtype], dtype, 64), optimize=True)


# ---------------------------------------------------------------------------------------------------------------------
# the constants

def test_pi_and_reduction_constants():
  pi = transcendental._machin_pi(400)
  fifty_digits = Fraction(314159265358979323846264338327950288419716939937510, 10 ** 50)
  assert float(pi) == math.pi and abs(pi - fifty_digits) < Fraction(1, 10 ** 50)
  constants = transcendental.sin_constants()
  parts = constants["half_pi"]
  assert abs(sum(map(Fraction, parts)) - pi / 2) < Fraction(1, 2 ** 158)
  for j, (hi, lo) in enumerate(zip(constants["table_hi"], constants["table_lo"])):
    power = Fraction(2) ** (transcendental.SIN_SPLIT_BITS * j)
    multiple = (power - Fraction(hi) - Fraction(lo)) / (2 * pi)  # 2^(16 j) - table value: a multiple of 2 pi
    assert abs(multiple - round(multiple)) < Fraction(1, 2 ** 100) and 0 <= hi < 2 * math.pi


# the stated error bound of each fit, and the function and variable it approximates on its interval
FITS = {
  "exp2": (transcendental.EXP2_POLY, 2 ** -28.3, -0.5, 0.5,
           lambda f, poly: np.abs(1 + f * poly(f) - np.exp2(f)) / np.exp2(f)),
  "log2": (transcendental.LOG2_POLY, 2 ** -27.1, math.sqrt(0.5) - 1, math.sqrt(2) - 1,
           lambda t, poly: np.abs(poly(t) - (np.log2(1 + t) - np.float32(transcendental.LOG2_E_HI) * t) / t)),
  "sin": (transcendental.SIN_POLY, 2 ** -37.2, 1e-3, 0.8,
          lambda r, poly: np.abs(r + r ** 3 * poly(r * r) - np.sin(r)) / np.sin(r)),
  "cos": (transcendental.COS_POLY, 2 ** -33.6, 1e-3, 0.8,
          lambda r, poly: np.abs(1 + r * r * poly(r * r) - np.cos(r)) / np.cos(r)),
}


@pytest.mark.parametrize("name", list(FITS))
def test_polynomial_fits(name: str):
  """Each polynomial, with its coefficients as the renderer writes them (float32 for exp2 / log2), evaluated in
  float64, stays within the error the module states (up to float64 evaluation noise)."""
  coefficients, bound, low, high, error = FITS[name]
  if name in ("exp2", "log2"): coefficients = tuple(float(np.float32(c)) for c in coefficients)
  points = np.linspace(low, high, 200_001)
  points = points[points != 0]
  worst = error(points, lambda x: np.polynomial.polynomial.polyval(x, coefficients)).max()
  assert worst <= bound * 1.02 + 1e-15


# ---------------------------------------------------------------------------------------------------------------------
# float64 and POW as the GPU renderer emits them (no libm there): the render_gpu body compiled for the CPU and called
# directly (IEEE subnormals: the CPU runtime would flush them), against long double references (x86's 64-bit
# mantissa: exact to ~2^-64, far below the float64 ulps measured)

EXACT = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.COS: np.cos, Ops.POW: np.power}
# the largest error measured against the exact value, in ulps of the result (float64; POW also for the float32 /
# 16-bit results, rounded once from float64)
MAX_ULPS_F64 = {Ops.EXP2: 0.77, Ops.LOG2: 0.502, Ops.SIN: 0.74, Ops.COS: 0.74, Ops.POW: 1.06}
MAX_ULPS_POW_NARROW = 0.501
needs_long_double = pytest.mark.skipif(np.finfo(np.longdouble).nmant < 63,
                                       reason="long double is no wider than float64")


def run_gpu_kernel(op: Ops, dtype: np.dtype, *inputs: np.ndarray) -> np.ndarray:
  from gpu_emulator import cpu_module_of_gpu_kernel

  from tinyjax.codegen.llvm import render_gpu
  out = np.zeros(len(inputs[0]), dtype)
  ir = cpu_module_of_gpu_kernel("kernel", render_gpu("kernel", elementwise(op, [x.dtype for x in inputs], dtype,
                                                                               len(out))))
  pointers = (ctypes.c_void_p * (1 + len(inputs)))(out.ctypes.data, *(x.ctypes.data for x in inputs))
  compile_kernel(ir)(pointers, 0, len(out))
  return out


def check_gpu(op: Ops, dtype: np.dtype, *inputs: np.ndarray) -> float:
  """op(inputs) on the GPU path: NaN and infinities where the exact result has them, finite results within one ulp
  step of the correctly rounded one; returns the largest error in ulps of the result."""
  actual = run_gpu_kernel(op, dtype, *inputs)
  with np.errstate(all="ignore"):
    exact = EXACT[op](*(x.astype(np.longdouble) for x in inputs))
    rounded = exact.astype(dtype)
  np.testing.assert_array_equal(np.isnan(actual), np.isnan(rounded), err_msg=f"NaN mismatch for {op.name}")
  infinite = np.isinf(rounded)
  np.testing.assert_array_equal(actual[infinite], rounded[infinite])
  finite = np.isfinite(rounded)
  spacing = np.spacing(np.abs(rounded[finite])).astype(np.longdouble)
  errors = np.abs(actual[finite].astype(np.longdouble) - exact[finite]) / spacing
  worst = int(np.argmax(errors))
  assert errors[worst] < 1.5, f"{op.name} {dtype}: {float(errors[worst])} ulp at {[x[finite][worst] for x in inputs]}"
  return float(errors[worst])


def binades(rng: np.random.Generator, n: int, low: int, high: int, signs: bool = True) -> np.ndarray:
  """n float64s spread over the binades [2^low, 2^high) (both signs)."""
  values = np.ldexp(rng.uniform(1, 2, n), rng.integers(low, high, n))
  return values * rng.choice([-1.0, 1.0], n) if signs else values


@needs_long_double
def test_float64_exp2():
  rng = np.random.default_rng(2)
  values = np.concatenate([rng.uniform(-1080, 1030, 100_000), rng.uniform(-1, 1, 30_000),
                           binades(rng, 30_000, -1074, 0), rng.uniform(-1075, -1021, 30_000)])  # the last: subnormals
  assert check_gpu(Ops.EXP2, F64, values) <= MAX_ULPS_F64[Ops.EXP2]
  integers = np.arange(-1080, 1030).astype(F64)
  with np.errstate(over="ignore"): expected = np.exp2(integers)
  np.testing.assert_array_equal(run_gpu_kernel(Ops.EXP2, F64, integers), expected)
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1023.9999999999999, 1024.0, -1074.0,
                       -1075.0, -1075.0000000000002, 1e300, -1e300])
  expected = np.array([1.0, 1.0, np.inf, 0.0, np.nan, 1.0, 1.0, np.exp2(1023.9999999999999), np.inf, 5e-324, 0.0, 0.0,
                       np.inf, 0.0])
  np.testing.assert_array_equal(run_gpu_kernel(Ops.EXP2, F64, specials), expected)


@needs_long_double
def test_float64_log2():
  rng = np.random.default_rng(3)
  values = np.concatenate([binades(rng, 100_000, -1074, 1024, signs=False), rng.uniform(0.5, 2, 30_000),
                           1 + rng.uniform(-1e-6, 1e-6, 20_000), rng.uniform(0, 1e6, 20_000)])
  assert check_gpu(Ops.LOG2, F64, values) <= MAX_ULPS_F64[Ops.LOG2]
  exponents = np.arange(-1074, 1024)
  np.testing.assert_array_equal(run_gpu_kernel(Ops.LOG2, F64, np.ldexp(1.0, exponents)), exponents.astype(F64))
  specials = np.array([0.0, -0.0, -1.0, -5e-324, -np.inf, np.inf, np.nan, 1.0, np.finfo(F64).max])
  actual = run_gpu_kernel(Ops.LOG2, F64, specials)
  np.testing.assert_array_equal(actual, [-np.inf, -np.inf, np.nan, np.nan, np.nan, np.inf, np.nan, 0.0, 1024.0])
  assert not np.signbit(actual[7])


@needs_long_double
def test_float64_sin():
  """Every binade up to float64's largest value, tiny results near multiples of pi / 2 (the reduction's precision)."""
  rng = np.random.default_rng(4)
  multiples = np.concatenate([np.arange(1, 20_000) * (np.pi / 2), rng.integers(1, 1 << 52, 20_000) * (np.pi / 2)])
  values = np.concatenate([rng.uniform(-10, 10, 50_000), binades(rng, 100_000, -40, 1024), multiples,
                           [6381956970095103.0 * 2.0 ** 797, np.finfo(F64).max, -np.finfo(F64).max, 2.0 ** -26, 1e22]])
  assert check_gpu(Ops.SIN, F64, values) <= MAX_ULPS_F64[Ops.SIN]
  assert check_gpu(Ops.COS, F64, values) <= MAX_ULPS_F64[Ops.COS]
  specials = np.array([0.0, -0.0, 5e-324, -5e-324, 1e-300, -2.0 ** -27, np.inf, -np.inf, np.nan])
  actual = run_gpu_kernel(Ops.SIN, F64, specials)
  np.testing.assert_array_equal(actual[:6], specials[:6])
  np.testing.assert_array_equal(np.signbit(actual[:6]), np.signbit(specials[:6]))
  assert np.isnan(actual[6:]).all()
  cosines = run_gpu_kernel(Ops.COS, F64, specials)
  np.testing.assert_array_equal(cosines[:6], [1.0] * 5 + [np.cos(2.0 ** -27)])
  assert np.isnan(cosines[6:]).all()


@needs_long_double
def test_pow_accuracy():
  """float64 (double-double logarithm and product) and float32 / 16-bit (computed in float64, rounded once)."""
  rng = np.random.default_rng(5)
  x = np.concatenate([rng.uniform(0, 4, 30_000), binades(rng, 30_000, -1074, 1024, signs=False),
                      1 + rng.uniform(-1e-3, 1e-3, 20_000)])
  with np.errstate(divide="ignore"): logs = np.log2(x)
  y = np.where(logs != 0, rng.uniform(-1100, 1100, x.size) / np.where(logs != 0, logs, 1), 1.0)  # all result sizes
  y = np.where(rng.random(x.size) < 0.3, rng.uniform(-10, 10, x.size), y)
  assert check_gpu(Ops.POW, F64, x, y) <= MAX_ULPS_F64[Ops.POW]
  assert check_gpu(Ops.POW, F64, -x[:20_000], np.round(y[:20_000])) <= MAX_ULPS_F64[Ops.POW]  # signed results
  for dtype in (F32, F16, BF16):
    with np.errstate(over="ignore"): narrow_x, narrow_y = x.astype(dtype), y.astype(dtype)
    narrow_y = np.where(rng.random(x.size) < 0.5, rng.uniform(-8, 8, x.size).astype(dtype), narrow_y)
    assert check_gpu(Ops.POW, dtype, narrow_x, narrow_y) <= MAX_ULPS_POW_NARROW, dtype


POW_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, 7.0, -7.0,
                1e-30, -1e-30, 1e30, -1e30, 2.0 ** 24 + 2, 2.0 ** 24 - 1, -(2.0 ** 24 - 1), 0.9999999, 1.0000001]


@pytest.mark.parametrize("dtype", [F64, F32, F16, BF16], ids=str)
def test_pow_special_values(dtype: np.dtype):
  """C99 Annex F's pow (as XLA): every pair of special values against numpy's float64 pow (libm); exact where that
  is NaN, an infinity, a zero or +-1 (sign included), within an ulp elsewhere."""
  with np.errstate(all="ignore"):
    wide = [5e-324, -5e-324, 2.0 ** 53 - 1, -(2.0 ** 53 - 1), 1e308] if dtype == F64 else []
    values = np.array(POW_SPECIALS + wide, dtype)
    x, y = (grid.ravel() for grid in np.meshgrid(values, values, indexing="ij"))
    expected = np.power(x.astype(F64), y.astype(F64)).astype(dtype)
  actual = run_gpu_kernel(Ops.POW, dtype, x, y)
  exact = np.isnan(expected) | np.isinf(expected) | (expected == 0) | (np.abs(expected) == 1)
  np.testing.assert_array_equal(actual[exact].astype(F64), expected[exact].astype(F64))
  signed = exact & ~np.isnan(expected)
  np.testing.assert_array_equal(np.signbit(actual[signed]), np.signbit(expected[signed]))
  close = np.abs(actual[~exact].astype(F64) - expected[~exact]) <= np.spacing(np.abs(expected[~exact])).astype(F64)
  assert close.all(), list(zip(x[~exact][~close], y[~exact][~close]))


def test_float64_and_pow_constants():
  constants = transcendental.f64_constants()
  ln2 = transcendental._ln2(200)
  assert abs(ln2 - Fraction(6931471805599453094172321214581765680755, 10 ** 40)) < Fraction(1, 10 ** 39)
  assert abs(sum(map(Fraction, constants["ln2"])) - ln2) < Fraction(1, 2 ** 105)
  assert abs(sum(map(Fraction, constants["log2_e"])) * ln2 - 1) < Fraction(1, 2 ** 104)
  # the 2 / pi words: (2 / pi) * 2^(64 * words) truncated, two zero words in front
  words = constants["two_over_pi"]
  assert words[:transcendental.TWO_OVER_PI_PAD] == (0, 0) and all(0 <= word < 2 ** 64 for word in words)
  bits = Fraction(sum(word << (64 * (len(words) - 1 - i)) for i, word in enumerate(words)), 2 ** (64 * len(words)))
  assert 0 <= 2 / transcendental._machin_pi(1300) * Fraction(1, 2 ** 128) - bits < Fraction(1, 2 ** (64 * len(words)))
  # the Taylor series' first omitted terms, as the module states
  assert (math.log(2) / 2) ** (transcendental.EXP2_F64_DEGREE + 1) / math.factorial(16) < 2 ** -63
  s = (math.sqrt(2) - 1) / (math.sqrt(2) + 1)
  assert s ** (2 * transcendental.LOG2_F64_TERMS) / (2 * transcendental.LOG2_F64_TERMS + 1) < 2 ** -70
  r = math.pi / 4 + 1e-3
  assert r ** (transcendental.SIN_F64_DEGREE + 1) / math.factorial(transcendental.SIN_F64_DEGREE + 2) < 2 ** -62
  assert r ** (transcendental.COS_F64_DEGREE + 2) / math.factorial(transcendental.COS_F64_DEGREE + 2) < 2 ** -67


# the largest error of tinyjax.numpy's float64 functions on the CPU measured over the sweep below, in ulps of the
# result (normal results; numpy's, by the same measure: 0.69, 0.59, 0.52, 0.52, 1.16)
MAX_ULPS_NUMPY_F64 = {"exp": 0.87, "log": 0.83, "sin": 0.73, "cos": 0.74, "tanh": 0.82}


@needs_long_double
@pytest.mark.parametrize("name", list(MAX_ULPS_NUMPY_F64))
def test_float64_functions_end_to_end(name, on_cpu):
  """exp and log (fdlibm's reductions and rational forms in float64 arithmetic), sin and cos (Payne-Hanek) and tanh
  as tinyjax.numpy computes them under x64 on the CPU, against long double references. (An OpenCL device computes SIN
  and COS with its own built-ins.)"""
  import tinyjax as tj
  import tinyjax.numpy as tnp
  rng = np.random.default_rng(9)
  sweeps = {"exp": np.concatenate([np.linspace(-745, 709.7, 200_001), rng.uniform(-1, 1, 50_000)]),
            "log": np.concatenate([np.geomspace(1e-300, 1e300, 200_001), rng.uniform(0.5, 2, 50_000)]),
            "sin": np.concatenate([np.linspace(-100, 100, 200_001), np.geomspace(1e-300, 1e300, 50_001)]),
            "tanh": np.concatenate([np.linspace(-25, 25, 200_001), np.geomspace(1e-300, 20, 50_001)])}
  values = sweeps.get(name, sweeps["sin"])
  with tj.config.override("jax_enable_x64", True):
    actual = np.asarray(getattr(tnp, name)(values))
  exact = getattr(np, name)(values.astype(np.longdouble))
  normal = np.isfinite(exact) & (np.abs(exact) >= np.finfo(F64).tiny)
  spacing = np.spacing(np.abs(exact[normal]).astype(F64)).astype(np.longdouble)
  errors = np.abs(actual[normal].astype(np.longdouble) - exact[normal]) / spacing
  assert float(errors.max()) <= MAX_ULPS_NUMPY_F64[name], (name, float(errors.max()), values[normal][errors.argmax()])
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan])
  with tj.config.override("jax_enable_x64", True), np.errstate(all="ignore"):
    np.testing.assert_array_equal(np.asarray(getattr(tnp, name)(specials)), getattr(np, name)(specials))


def test_error_function_in_each_precision():
  """`lax.erf` of float32 is evaluated in float32 (lax/_special.py): within 2.5 ulp of the exact value over a dense
  sweep (JAX 0.10.2's float32 erf: 5.3), saturating at +-1 and keeping NaN, signed zeros and the infinities; float64
  within a few ulp of math.erf (evaluated in float64, not float32); bfloat16 through float32; its derivative is
  2/sqrt(pi) exp(-x^2)."""
  import ml_dtypes

  import tinyjax as tj
  x = np.concatenate([np.linspace(-9, 9, 400001), np.geomspace(1e-30, 9, 40000), -np.geomspace(1e-30, 9, 40000)])
  x32 = x.astype(np.float32)
  exact = np.array([math.erf(float(v)) for v in x32])
  got = np.asarray(tj.jit(tj.lax.erf)(x32)).astype(np.float64)
  assert (np.abs(got - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)).max() <= 2.5
  specials = np.array([np.nan, np.inf, -np.inf, 5.0, -5.0, 0.0, -0.0], np.float32)
  out = np.asarray(tj.jit(tj.lax.erf)(specials))
  assert np.isnan(out[0]) and list(out[1:5]) == [1, -1, 1, -1] and np.signbit(out[6]) and not np.signbit(out[5])
  with tj.config.override("jax_enable_x64", True):
    got64 = np.asarray(tj.jit(tj.lax.erf)(x))
  assert got64.dtype == np.float64
  exact64 = np.array([math.erf(v) for v in x])
  assert (np.abs(got64 - exact64) / np.spacing(np.abs(exact64))).max() <= 4.0  # (Cephes' rational: 3 ulp measured)
  half = np.asarray(tj.lax.erf(x32[::1000].astype(ml_dtypes.bfloat16))).astype(np.float64)
  np.testing.assert_allclose(half, exact[::1000], rtol=8e-3, atol=1e-30)
  slope = np.asarray(tj.jit(tj.vmap(tj.grad(tj.lax.erf)))(x32[::100])).astype(np.float64)
  np.testing.assert_allclose(slope, 2 / math.sqrt(math.pi) * np.exp(-x32[::100].astype(np.float64) ** 2), rtol=2e-6,
                             atol=1e-30)
