"""The LLVM renderer against numpy: kernel ASTs built by hand, compiled with a small llvmlite MCJIT harness (parse,
O3 with vectorisation for the host CPU, JIT, call through ctypes), outputs compared with numpy references."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
import re

import llvmlite.binding as llvm
import ml_dtypes
import numpy as np
import pytest

from tinyjax.codegen.llvm import SMALL_KERNEL_STEPS, SUM_BLOCK, render_llvm
from tinyjax.codegen.opt import tile_geometry
from tinyjax.uop import Ops, UOp

INDEX = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64)
INTS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)]
FLOATS = [F16, BF16, F32, F64]
ALL_DTYPES = [BOOL, *INTS, *FLOATS]
LOW_PRECISION = (F16, BF16)


# ---------------------------------------------------------------------------------------------------------------------
# the JIT harness

@functools.cache
def target_machine() -> llvm.TargetMachine:
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  llvm.initialize_native_asmparser()
  if libm := ctypes.util.find_library("m"): llvm.load_library_permanently(libm)
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=3, jit=True)


def optimized_module(llvm_ir: str) -> llvm.ModuleRef:
  """Parse, verify and run LLVM's O3 pipeline as tinyjax/devices/cpu.py does (PIPELINE: loop and SLP vectorisation,
  interleaving, no unrolling unless a loop asks) for the host CPU."""
  machine = target_machine()
  module = llvm.parse_assembly(llvm_ir)
  module.verify()
  module.triple, module.data_layout = llvm.get_process_triple(), str(machine.target_data)
  tuning = llvm.create_pipeline_tuning_options(speed_level=3)
  tuning.loop_vectorization = tuning.slp_vectorization = tuning.loop_interleaving = True
  tuning.loop_unrolling = False
  builder = llvm.create_pass_builder(machine, tuning)
  builder.getModulePassManager().run(module, builder)
  return module


_KERNEL_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_engines: list = []  # compiled code stays alive for the test session


@functools.cache
def compile_kernel(llvm_ir: str, name: str = "kernel"):
  module = optimized_module(llvm_ir)
  engine = llvm.create_mcjit_compiler(module, target_machine())
  engine.finalize_object()
  _engines.append(engine)
  return _KERNEL_SIGNATURE(engine.get_function_address(name))


def outer_bound(ast: UOp) -> int:
  ranges = [n for n in ast.toposort if n.op is Ops.RANGE and n.arg[1] == "global"]
  return min(ranges, key=lambda rng: rng.arg[0]).src[0].arg if ranges else 1


def run(ast: UOp, buffers: list, start: int = 0, end: int | None = None) -> None:
  """Render, compile and run kernel `ast` over outer iterations [start, end) on `buffers` (numpy arrays or raw
  addresses, in parameter order; outputs are written in place)."""
  kernel = compile_kernel(render_llvm("kernel", ast))
  addresses = [b if isinstance(b, int) else b.ctypes.data for b in buffers]
  kernel((ctypes.c_void_p * len(addresses))(*addresses), start, outer_bound(ast) if end is None else end)


# ---------------------------------------------------------------------------------------------------------------------
# AST builders

def const(value, dtype=INDEX) -> UOp: return UOp.const(np.dtype(dtype), value)
def buffer(index: int, dtype) -> UOp: return UOp(Ops.DEFINE_GLOBAL, np.dtype(dtype), (), index)
def global_range(range_id: int, bound: int) -> UOp: return UOp(Ops.RANGE, INDEX, (const(bound),), (range_id, "global"))
def reduce_range(range_id: int, bound: int) -> UOp: return UOp(Ops.RANGE, INDEX, (const(bound),), (range_id, "reduce"))
def alu(op: Ops, first: UOp, *rest: UOp) -> UOp: return first.alu(op, *rest)
def add(lhs: UOp, rhs: UOp) -> UOp: return alu(Ops.ADD, lhs, rhs)
def mul(lhs: UOp, rhs: UOp) -> UOp: return alu(Ops.MUL, lhs, rhs)
def cast(value: UOp, dtype) -> UOp: return UOp(Ops.CAST, np.dtype(dtype), (value,))
def reduce(op: Ops, value: UOp, *ranges: UOp) -> UOp: return UOp(Ops.REDUCE, value.dtype, (value, *ranges), op)
def kernel(*stores: UOp) -> UOp: return UOp(Ops.SINK, stores[0].dtype, stores)


def load(buf: UOp, index: UOp, gate: UOp | None = None) -> UOp:
  return UOp(Ops.LOAD, buf.dtype, (buf, index) if gate is None else (buf, index, gate))


def store(buf: UOp, index: UOp, value: UOp) -> UOp: return UOp(Ops.STORE, buf.dtype, (buf, index, value))


def elementwise(op: Ops, dtypes: list[np.dtype], out_dtype: np.dtype, n: int) -> UOp:
  """out[i] = op(in_0[i], in_1[i], ...) with out at parameter 0."""
  i = global_range(0, n)
  operands = [load(buffer(k + 1, dtype), i) for k, dtype in enumerate(dtypes)]
  node = UOp(op, np.dtype(out_dtype), tuple(operands))
  return kernel(store(buffer(0, out_dtype), i, node))


def run_elementwise(op: Ops, out_dtype, *inputs: np.ndarray) -> np.ndarray:
  out = np.zeros(len(inputs[0]), out_dtype)
  run(elementwise(op, [x.dtype for x in inputs], np.dtype(out_dtype), len(out)), [out, *inputs])
  return out


# ---------------------------------------------------------------------------------------------------------------------
# test values and references

def sample(dtype: np.dtype, n: int = 97, seed: int = 0, nonnegative: bool = False) -> np.ndarray:
  """Values of `dtype` with edge cases: bounds, zeros, negatives, and random ones."""
  rng = np.random.default_rng(seed)
  if dtype == BOOL: return rng.integers(0, 2, n).astype(BOOL)
  if dtype.kind in "iu":
    info = np.iinfo(dtype)
    low = 0 if nonnegative else int(info.min)
    edges = [v for v in (info.min, info.max, 0, 1, -1, 2, -2, 7, -7) if low <= v <= info.max]
    values = np.concatenate([np.array(edges, dtype), rng.integers(low, int(info.max), n - len(edges), dtype,
                                                                   endpoint=True)])
    return values
  values = rng.standard_normal(n) * 10
  if nonnegative: values = np.abs(values)
  return values.astype(dtype)


def to_f32(x: np.ndarray) -> np.ndarray: return x.astype(F32) if x.dtype in LOW_PRECISION else x


def wrap(values: list[int], dtype: np.dtype) -> np.ndarray:
  """Python ints -> dtype with two's complement wraparound."""
  bits = dtype.itemsize * 8
  return np.array([v % (1 << bits) for v in values], np.uint64).astype(dtype)


def c_division(lhs: np.ndarray, rhs: np.ndarray, remainder: bool) -> np.ndarray:
  """lax.div / lax.rem: truncating toward zero; x / 0 = -1, x % 0 = x; INT_MIN / -1 wraps to INT_MIN, % gives 0."""
  results = []
  for x, y in zip(lhs.tolist(), rhs.tolist()):
    if y == 0: results.append(x if remainder else -1); continue
    quotient = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
    results.append(x - quotient * y if remainder else quotient)
  return wrap(results, lhs.dtype)


def shift_reference(op: Ops, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
  bits = lhs.dtype.itemsize * 8
  results = []
  for x, amount in zip(lhs.tolist(), rhs.tolist()):
    if op is Ops.SHL: results.append(x << amount if 0 <= amount < bits else 0)
    else: results.append(x >> amount if 0 <= amount < bits else (-1 if x < 0 else 0))
  return wrap(results, lhs.dtype)


def nearest_bfloat16(values: np.ndarray) -> np.ndarray:
  """Correctly rounded float64 -> bfloat16 (ml_dtypes rounds twice, through float32): of the candidate and its two
  neighbours, the nearest, ties to an even bit pattern. Finite values in bfloat16's range only."""
  values = values.astype(F64)
  guess = values.astype(F32).astype(BF16).view(np.uint16).astype(np.int64)
  candidates = np.stack([guess - 1, guess, guess + 1]) % (1 << 16)
  as_f64 = candidates.astype(np.uint16).view(BF16).astype(F64)
  distance = np.abs(as_f64 - values)
  distance = np.where(np.isnan(distance), np.inf, distance)
  best = distance.min(axis=0)
  odd_penalty = (candidates % 2) * 1e-300  # among equal distances prefer the even pattern
  choice = np.argmin(np.where(distance == best, odd_penalty, np.inf), axis=0)
  return candidates[choice, np.arange(len(values))].astype(np.uint16).view(BF16)


def assert_same(actual: np.ndarray, expected: np.ndarray, rtol: float = 0.0) -> None:
  assert actual.dtype == expected.dtype
  if actual.dtype == BOOL: np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8))
  elif actual.dtype.kind in "iu": np.testing.assert_array_equal(actual, expected)
  elif rtol == 0.0: np.testing.assert_array_equal(actual.astype(F64), expected.astype(F64))
  else:
    np.testing.assert_allclose(actual.astype(F64), expected.astype(F64), rtol=rtol, atol=rtol)


# ---------------------------------------------------------------------------------------------------------------------
# elementwise

_NUMPY_BINARY = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.CMPLT: np.less,
                 Ops.CMPNE: np.not_equal, Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
                 Ops.FDIV: np.divide, Ops.POW: np.power}


def binary_reference(op: Ops, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
  """numpy's answer; float16 / bfloat16 computed in float32 and rounded once."""
  with np.errstate(all="ignore"):
    result = _NUMPY_BINARY[op](to_f32(lhs), to_f32(rhs))
  return result if op in (Ops.CMPLT, Ops.CMPNE) else result.astype(lhs.dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE])
def test_binary_arithmetic(op: Ops, dtype: np.dtype):
  lhs, rhs = sample(dtype, seed=1), sample(dtype, seed=2)
  rhs[:5] = lhs[:5]  # equal operands for the compares
  out_dtype = BOOL if op in (Ops.CMPLT, Ops.CMPNE) else dtype
  assert_same(run_elementwise(op, out_dtype, lhs, rhs), binary_reference(op, lhs, rhs))


@pytest.mark.parametrize("dtype", [BOOL, *INTS], ids=str)
@pytest.mark.parametrize("op", [Ops.AND, Ops.OR, Ops.XOR])
def test_bitwise(op: Ops, dtype: np.dtype):
  lhs, rhs = sample(dtype, seed=3), sample(dtype, seed=4)
  assert_same(run_elementwise(op, dtype, lhs, rhs), binary_reference(op, lhs, rhs))


def test_uint8_wraparound():
  lhs, rhs = np.array([250, 255, 128, 3], np.uint8), np.array([10, 1, 128, 200], np.uint8)
  assert_same(run_elementwise(Ops.ADD, np.uint8, lhs, rhs), np.array([4, 0, 0, 203], np.uint8))
  assert_same(run_elementwise(Ops.MUL, np.uint8, lhs, rhs), np.array([196, 255, 0, 88], np.uint8))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", [Ops.FDIV, Ops.POW])
def test_float_binary(op: Ops, dtype: np.dtype):
  lhs = sample(dtype, seed=5, nonnegative=op is Ops.POW)
  rhs = sample(dtype, seed=6) / (4 if op is Ops.POW else 1)
  rhs = rhs.astype(dtype)
  rhs[:3] = [0, -0.0, np.nan]
  rtol = 0.0 if op is Ops.FDIV else {F16: 1e-3, BF16: 8e-3, F32: 1e-6, F64: 1e-13}[dtype]
  assert_same(run_elementwise(op, dtype, lhs, rhs), binary_reference(op, lhs, rhs), rtol)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nan_propagation(dtype: np.dtype):
  lhs = np.array([np.nan, 1, np.nan, -np.inf, 2, np.inf], dtype)
  rhs = np.array([1, np.nan, np.nan, np.nan, 3, 1], dtype)
  np.testing.assert_array_equal(run_elementwise(Ops.MAX, dtype, lhs, rhs).astype(F64),
                                np.maximum(lhs.astype(F64), rhs.astype(F64)))
  np.testing.assert_array_equal(run_elementwise(Ops.CMPLT, BOOL, lhs, rhs), [False, False, False, False, True, False])
  np.testing.assert_array_equal(run_elementwise(Ops.CMPNE, BOOL, lhs, rhs), [True, True, True, True, True, True])


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD])
def test_integer_division(op: Ops, dtype: np.dtype):
  lhs, rhs = sample(dtype, seed=7), sample(dtype, seed=8)
  rhs[:12] = 0  # by zero, including INT_MIN / 0 and 0 / 0
  if dtype.kind == "i":
    lhs[12:16], rhs[12:16] = [np.iinfo(dtype).min, -7, 7, -7], [-1, 2, -2, -2]
  rhs[20:40] = (rhs[20:40] % 13).astype(dtype)  # small divisors
  assert_same(run_elementwise(op, dtype, lhs, rhs), c_division(lhs, rhs, remainder=op is Ops.MOD))


@pytest.mark.parametrize("divisor", [3, 4, -3, -1, 0])
def test_integer_division_by_constant(divisor: int):
  """Constant divisors skip the guards (index arithmetic); results must be the same."""
  values = np.array([-9, -8, -1, 0, 1, 7, 8, np.iinfo(np.int32).min, np.iinfo(np.int32).max], np.int32)
  i = global_range(0, len(values))
  x = load(buffer(2, np.int32), i)
  ast = kernel(store(buffer(0, np.int32), i, alu(Ops.IDIV, x, const(divisor, np.int32))),
               store(buffer(1, np.int32), i, alu(Ops.MOD, x, const(divisor, np.int32))))
  quotient, remainder = np.zeros_like(values), np.zeros_like(values)
  run(ast, [quotient, remainder, values])
  divisors = np.full_like(values, divisor)
  assert_same(quotient, c_division(values, divisors, remainder=False))
  assert_same(remainder, c_division(values, divisors, remainder=True))


def test_nonnegative_index_division():
  """A non-negative dividend (a RANGE) by a positive constant may use unsigned division: same answers."""
  i = global_range(0, 50)
  ast = kernel(store(buffer(0, INDEX), i, add(mul(alu(Ops.IDIV, i, const(7)), const(100)), alu(Ops.MOD, i, const(7)))))
  out = np.zeros(50, INDEX)
  run(ast, [out])
  np.testing.assert_array_equal(out, np.arange(50) // 7 * 100 + np.arange(50) % 7)


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("op", [Ops.SHL, Ops.SHR])
def test_shifts(op: Ops, dtype: np.dtype):
  bits = dtype.itemsize * 8
  lhs = sample(dtype, n=64, seed=9)
  amounts = np.arange(-2, bits + 6)
  amounts = np.resize(amounts, 64) if dtype.kind == "i" else np.resize(amounts[amounts >= 0], 64)
  rhs = amounts.astype(dtype)
  assert_same(run_elementwise(op, dtype, lhs, rhs), shift_reference(op, lhs, rhs))


def test_shift_amount_of_another_dtype():
  """An int64 amount of 256 on int8 values shifts everything out (it must not be narrowed to 0 first)."""
  values, amounts = np.array([-100, 100, 3, -3], np.int8), np.array([256, 1, -1, 2], np.int64)
  for op in (Ops.SHL, Ops.SHR):
    i = global_range(0, 4)
    node = UOp(op, np.dtype(np.int8), (load(buffer(1, np.int8), i), load(buffer(2, np.int64), i)))
    out = np.zeros(4, np.int8)
    run(kernel(store(buffer(0, np.int8), i, node)), [out, values, amounts])
    assert_same(out, shift_reference(op, values, amounts))


_NUMPY_UNARY = {Ops.NEG: np.negative, Ops.RECIP: np.reciprocal, Ops.SQRT: np.sqrt, Ops.EXP2: np.exp2,
                Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.TRUNC: np.trunc}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", list(_NUMPY_UNARY))
def test_float_unary(op: Ops, dtype: np.dtype):
  values = sample(dtype, seed=10)
  if op is Ops.EXP2: values = (values / 2).astype(dtype)
  values[:4] = [np.nan, np.inf, -np.inf, 0]
  with np.errstate(all="ignore"):
    expected = _NUMPY_UNARY[op](to_f32(values)).astype(dtype)
  exact = op in (Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.TRUNC)
  rtol = 0.0 if exact else {F16: 1e-3, BF16: 8e-3, F32: 1e-6, F64: 1e-14}[dtype]
  assert_same(run_elementwise(op, dtype, values), expected, rtol)


@pytest.mark.parametrize("dtype", [*INTS], ids=str)
def test_integer_negation(dtype: np.dtype):
  values = sample(dtype, seed=11)
  assert_same(run_elementwise(Ops.NEG, dtype, values), wrap([-v for v in values.tolist()], dtype))


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_low_precision_rounds_once_per_op(dtype: np.dtype):
  """a * b + c on float16 / bfloat16: each op computes in float32 and rounds to the dtype (as ml_dtypes / numpy)."""
  a, b, c = (sample(dtype, n=1000, seed=s) for s in (12, 13, 14))
  i = global_range(0, 1000)
  product = mul(load(buffer(1, dtype), i), load(buffer(2, dtype), i))
  ast = kernel(store(buffer(0, dtype), i, add(product, load(buffer(3, dtype), i))))
  out = np.zeros(1000, dtype)
  run(ast, [out, a, b, c])
  expected = ((a.astype(F32) * b.astype(F32)).astype(dtype).astype(F32) + c.astype(F32)).astype(dtype)
  assert_same(out, expected)


def test_where():
  cond, lhs, rhs = sample(BOOL, seed=15), sample(F32, seed=16), sample(F32, seed=17)
  assert_same(run_elementwise(Ops.WHERE, F32, cond, lhs, rhs), np.where(cond, lhs, rhs))


# ---------------------------------------------------------------------------------------------------------------------
# casts

def cast_sample(src: np.dtype, dst: np.dtype) -> np.ndarray:
  """Values of `src` that convert without overflow to `dst`."""
  if src == BOOL: return sample(BOOL, seed=18)
  nonnegative = dst.kind == "u" or src.kind == "u"
  if src.kind in "iu" and dst.kind in "iu": return sample(src, seed=19, nonnegative=nonnegative)
  if src.kind in "iu":  # int -> float: big values, to exercise rounding
    values = sample(src, seed=20, nonnegative=nonnegative)
    if dst == F16 and src.itemsize > 2:  # float16 overflows above 65504
      values = values.astype(np.int64) % 60000 if nonnegative else values.astype(np.int64) % 120000 - 60000
    return values.astype(src)
  rng = np.random.default_rng(21)
  if dst.kind in "iu":  # float -> int: fractions, in range of the int type and exact in the float type
    high = min(float(np.iinfo(dst).max), 2000.0)
    values = rng.uniform(0 if dst.kind == "u" else -high, high, 200)
    return values.astype(src)
  if dst == BOOL: return np.array([0, -0.0, 1, -2.5, np.nan, np.inf, 1e-30], src)
  # float -> float: random bits of the source in a range the destination can hold (and some specials)
  scale = 1e4 if min(src.itemsize, dst.itemsize) == 2 and F16 in (src, dst) else 1e30
  values = (rng.standard_normal(200) * rng.choice([1e-3, 1, scale], 200)).astype(src)
  return np.concatenate([values, np.array([np.nan, np.inf, -np.inf, 0, -0.0], src)])


def cast_reference(values: np.ndarray, dst: np.dtype) -> np.ndarray:
  if dst == BF16 and values.dtype != BF16:
    finite = np.isfinite(values.astype(F64))
    exact = nearest_bfloat16(np.where(finite, values.astype(F64), 0))
    return np.where(finite, exact, values.astype(F32).astype(BF16))
  with np.errstate(all="ignore"): return values.astype(dst)


@pytest.mark.parametrize("dst", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("src", ALL_DTYPES, ids=str)
def test_cast(src: np.dtype, dst: np.dtype):
  values = cast_sample(src, dst)
  out = np.zeros(len(values), dst)
  run(elementwise(Ops.CAST, [src], dst, len(values)), [out, values])
  expected = cast_reference(values, dst)
  if dst in FLOATS:
    np.testing.assert_array_equal(out.astype(F64), expected.astype(F64))
    np.testing.assert_array_equal(np.signbit(out.astype(F64)), np.signbit(expected.astype(F64)))
  else: assert_same(out, expected)


@pytest.mark.parametrize("src", FLOATS, ids=str)
def test_float_to_int_saturates(src: np.dtype):
  """As XLA on CPU: out-of-range float -> int saturates, NaN gives 0 (never poison)."""
  values = np.array([np.nan, np.inf, -np.inf, 3e4, -3e4, -0.9, 0.9], src)
  for dst, expected in [(np.int32, [0, 2**31 - 1, -2**31, 30000, -30000, 0, 0]),
                        (np.int8, [0, 127, -128, 127, -128, 0, 0]),
                        (np.uint8, [0, 255, 0, 255, 0, 0, 0]),
                        (np.uint64, [0, 2**64 - 1, 0, 30000, 0, 0, 0])]:
    out = np.zeros(len(values), dst)
    run(elementwise(Ops.CAST, [src], dst, len(values)), [out, values])
    expected = np.array(expected, dst)
    if src == F16: expected[3:5] = np.array([30000, -30000]).astype(np.float16).astype(F64).clip(
      np.iinfo(dst).min, np.iinfo(dst).max).astype(dst)
    if src == BF16: expected[3:5] = np.array([3e4, -3e4]).astype(BF16).astype(F64).clip(
      np.iinfo(dst).min, np.iinfo(dst).max).astype(dst)
    assert_same(out, expected)


def test_double_rounding_avoided():
  """float64 -> 16-bit floats round once (a float32 step in between would round the midpoint down)."""
  values = np.array([1 + 2**-8 + 2**-40, 1 + 2**-11 + 2**-40, -(1 + 2**-8 + 2**-40)], F64)
  for dst, expected in [(BF16, [1 + 2**-7, 1, -(1 + 2**-7)]), (F16, [1 + 2**-8, 1 + 2**-10, -(1 + 2**-8)])]:
    out = np.zeros(3, dst)
    run(elementwise(Ops.CAST, [F64], dst, 3), [out, values])
    np.testing.assert_array_equal(out.astype(F64), expected)
  ints = np.array([2**24 + 2**16 + 1, -(2**24 + 2**16 + 1)], np.int32)
  out = np.zeros(2, BF16)
  run(elementwise(Ops.CAST, [np.dtype(np.int32)], BF16, 2), [out, ints])
  np.testing.assert_array_equal(out.astype(F64), [2**24 + 2**17, -(2**24 + 2**17)])


@pytest.mark.parametrize("src,dst", [(F32, np.int32), (np.int32, F32), (F16, np.uint16), (np.int16, BF16),
                                     (F64, np.uint64), (np.int8, np.uint8), (BF16, F16)], ids=str)
def test_bitcast(src, dst):
  src, dst = np.dtype(src), np.dtype(dst)
  values = sample(src, seed=22)
  out = np.zeros(len(values), dst)
  run(elementwise(Ops.BITCAST, [src], dst, len(values)), [out, values])
  np.testing.assert_array_equal(out.view(np.uint8), values.view(np.uint8))


# ---------------------------------------------------------------------------------------------------------------------
# memory: gated loads, sub-ranges, no global range

def guarded_array(values: np.ndarray):
  """`values` placed right before an unreadable page: touching one element past the end crashes the process."""
  page = mmap.PAGESIZE
  region = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
  base = ctypes.addressof(ctypes.c_char.from_buffer(region))
  libc = ctypes.CDLL(None, use_errno=True)
  libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  assert libc.mprotect(base + page, page, 0) == 0
  address = base + page - values.nbytes
  ctypes.memmove(address, values.ctypes.data, values.nbytes)
  return region, address


@pytest.mark.parametrize("dtype", [F32, BF16, np.dtype(np.int16), BOOL], ids=str)
def test_gated_load_pads_without_touching_memory(dtype: np.dtype):
  """out = pad(x, 3) along one axis: LOAD(x, i - 3, 3 <= i < n + 3); reads past the end would fault."""
  n, pad = 37, 3
  values = sample(np.dtype(dtype), n=n, seed=23)
  region, address = guarded_array(values)
  i = global_range(0, n + 2 * pad)
  gate = alu(Ops.AND, alu(Ops.CMPLT, const(pad - 1), i), alu(Ops.CMPLT, i, const(n + pad)))
  ast = kernel(store(buffer(0, dtype), i, load(buffer(1, dtype), add(i, const(-pad)), gate)))
  out = np.ones(n + 2 * pad, dtype)
  run(ast, [out, address])
  assert_same(out, np.pad(values, pad))
  region.close()


def test_start_end_subrange():
  n = 64
  values = sample(F32, n=n, seed=24)
  ast = elementwise(Ops.SQRT, [F32], F32, n)
  out = np.full(n, -1.0, F32)
  run(ast, [out, np.abs(values)], start=5, end=23)
  expected = np.full(n, -1.0, F32)
  expected[5:23] = np.sqrt(np.abs(values[5:23]))
  assert_same(out, expected)
  run(ast, [out, np.abs(values)], start=23, end=23)  # empty: nothing written
  assert_same(out, expected)


def test_no_global_range_runs_once():
  """A full reduction to a scalar: no global range, runs once when start < end, not at all otherwise."""
  values = sample(np.dtype(np.int32), n=1000, seed=25) % 1000
  k = reduce_range(0, 1000)
  ast = kernel(store(buffer(0, np.int32), const(0), reduce(Ops.ADD, load(buffer(1, np.int32), k), k)))
  out = np.zeros(1, np.int32)
  run(ast, [out, values], start=0, end=1)
  assert out[0] == values.sum()
  out[0] = 7
  run(ast, [out, values], start=1, end=1)
  assert out[0] == 7


# ---------------------------------------------------------------------------------------------------------------------
# reductions

def row_reduce_kernel(op: Ops, dtype: np.dtype, rows: int, cols: int) -> UOp:
  """out[i] = reduce_k x[i * cols + k]."""
  i, k = global_range(0, rows), reduce_range(1, cols)
  x = load(buffer(1, dtype), add(mul(i, const(cols)), k))
  return kernel(store(buffer(0, dtype), i, reduce(op, x, k)))


_NUMPY_REDUCE = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.int64),
                                   BOOL], ids=str)
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX, Ops.MUL])
def test_row_reduce(op: Ops, dtype: np.dtype):
  rows, cols = 13, 67
  values = sample(dtype, n=rows * cols, seed=26)
  if op is Ops.MUL and dtype in FLOATS: values = (1 + values.astype(F32) / 200).astype(dtype)
  out = np.zeros(rows, dtype)
  run(row_reduce_kernel(op, dtype, rows, cols), [out, values])
  grid = values.reshape(rows, cols)
  if dtype == BOOL: expected = {Ops.ADD: grid.any(1), Ops.MAX: grid.any(1), Ops.MUL: grid.all(1)}[op]
  elif dtype.kind in "iu": expected = _NUMPY_REDUCE[op](grid, axis=1).astype(dtype)  # wraps like the kernel
  else: expected = _NUMPY_REDUCE[op](grid.astype(F64), axis=1).astype(dtype)
  rtol = {F16: 2e-3, BF16: 1e-2, F32: 1e-5, F64: 1e-12}.get(dtype, 0.0) if op is not Ops.MAX else 0.0
  assert_same(out, expected, rtol)


def test_max_reduce_propagates_nan():
  values = np.arange(40, dtype=F32)
  values[17] = np.nan
  out = np.zeros(4, F32)
  run(row_reduce_kernel(Ops.MAX, F32, 4, 10), [out, values])
  np.testing.assert_array_equal(out, [9, np.nan, 29, 39])


def test_two_reduces_over_the_same_row():
  """out[i] = sum_k x[i, k] + max_k x[i, k], both REDUCEs over the same RANGE node: two loops, one after another."""
  rows, cols = 9, 100
  values = sample(F32, n=rows * cols, seed=27)
  i, k = global_range(0, rows), reduce_range(1, cols)
  x = load(buffer(1, F32), add(mul(i, const(cols)), k))
  ast = kernel(store(buffer(0, F32), i, add(reduce(Ops.ADD, x, k), reduce(Ops.MAX, x, k))))
  out = np.zeros(rows, F32)
  run(ast, [out, values])
  grid = values.reshape(rows, cols).astype(F64)
  assert_same(out, (grid.sum(1) + grid.max(1)).astype(F32), 1e-5)


def test_softmax_reduce_feeds_reduce_and_epilogue():
  """softmax over rows in one kernel: the max feeds the sum's body, both feed the elementwise epilogue over j."""
  rows, cols = 7, 300
  values = sample(F32, n=rows * cols, seed=28)
  i, j, k1, k2 = global_range(0, rows), global_range(1, cols), reduce_range(2, cols), reduce_range(3, cols)
  x = buffer(1, F32)
  row_max = reduce(Ops.MAX, load(x, add(mul(i, const(cols)), k1)), k1)

  def exp_shifted(col: UOp) -> UOp:
    shifted = add(load(x, add(mul(i, const(cols)), col)), alu(Ops.NEG, row_max))
    return alu(Ops.EXP2, mul(shifted, const(1.4426950408889634, F32)))

  total = reduce(Ops.ADD, exp_shifted(k2), k2)
  ast = kernel(store(buffer(0, F32), add(mul(i, const(cols)), j), mul(exp_shifted(j), alu(Ops.RECIP, total))))
  out = np.zeros(rows * cols, F32)
  run(ast, [out, values])
  grid = values.reshape(rows, cols).astype(F64)
  expected = np.exp(grid - grid.max(1, keepdims=True))
  expected /= expected.sum(1, keepdims=True)
  assert_same(out, expected.reshape(-1).astype(F32), 1e-5)


def test_nested_reduce():
  """out[i] = sum_j max_k x[i, j, k]: a REDUCE inside another REDUCE's body."""
  a, b, c = 5, 6, 7
  values = sample(F32, n=a * b * c, seed=29)
  i, j, k = global_range(0, a), reduce_range(1, b), reduce_range(2, c)
  x = load(buffer(1, F32), add(add(mul(i, const(b * c)), mul(j, const(c))), k))
  ast = kernel(store(buffer(0, F32), i, reduce(Ops.ADD, reduce(Ops.MAX, x, k), j)))
  out = np.zeros(a, F32)
  run(ast, [out, values])
  assert_same(out, values.reshape(a, b, c).astype(F64).max(2).sum(1).astype(F32), 1e-5)


def test_loop_invariant_reduce_inside_a_reduce_body():
  """out[i] = sum_k x[i, k] * max_j y[i, j]: the max doesn't depend on k, so it is computed once, before the k loop."""
  rows, cols = 6, 40
  x, y = sample(F64, n=rows * cols, seed=34), sample(F64, n=rows * cols, seed=35)
  i, j, k = global_range(0, rows), reduce_range(1, cols), reduce_range(2, cols)
  row_max = reduce(Ops.MAX, load(buffer(2, F64), add(mul(i, const(cols)), j)), j)
  ast = kernel(store(buffer(0, F64), i, reduce(Ops.ADD, mul(load(buffer(1, F64), add(mul(i, const(cols)), k)), row_max),
                                               k)))
  body = render_llvm("kernel", ast).split("define internal")[1]
  sum_loop_header = body.rindex("phi i64", 0, body.index("fadd reassoc double"))
  assert body.index("@llvm.maximum.f64(") < sum_loop_header  # the max loop runs before the k loop, not inside it
  out = np.zeros(rows, F64)
  run(ast, [out, x, y])
  assert_same(out, (x.reshape(rows, cols) * y.reshape(rows, cols).max(1, keepdims=True)).sum(1), 1e-12)


def test_reduce_over_two_ranges_and_invariant_operand():
  """out[i] = sum_{j,k} x[j, k] * y[i]: y[i] doesn't depend on the reduce ranges (hoisted), two ranges in one REDUCE."""
  rows, b, c = 4, 30, 50
  x, y = sample(F64, n=b * c, seed=30), sample(F64, n=rows, seed=31)
  i, j, k = global_range(0, rows), reduce_range(1, b), reduce_range(2, c)
  value = mul(load(buffer(1, F64), add(mul(j, const(c)), k)), load(buffer(2, F64), i))
  ast = kernel(store(buffer(0, F64), i, reduce(Ops.ADD, value, j, k)))
  out = np.zeros(rows, F64)
  run(ast, [out, x, y])
  assert_same(out, x.sum() * y, 1e-12)


def test_long_float32_sum_is_accurate():
  """16M x 0.1 summed in float32: blocked summation keeps the relative error near float32's epsilon."""
  n = 1 << 24
  assert n > SUM_BLOCK
  values = np.full(n, 0.1, F32)
  k = reduce_range(0, n)
  ast = kernel(store(buffer(0, F32), const(0), reduce(Ops.ADD, load(buffer(1, F32), k), k)))
  out = np.zeros(1, F32)
  run(ast, [out, values])
  exact = float(np.float32(0.1)) * n
  assert abs(float(out[0]) - exact) / exact < 1e-6


def test_blocked_sum_with_remainder():
  """A reduce length that isn't a multiple of SUM_BLOCK: the last block is short."""
  rows, cols = 3, 3 * SUM_BLOCK + 123
  values = sample(F32, n=rows * cols, seed=32)
  out = np.zeros(rows, F32)
  run(row_reduce_kernel(Ops.ADD, F32, rows, cols), [out, values])
  assert_same(out, values.reshape(rows, cols).astype(F64).sum(1).astype(F32), 1e-5)


def test_widening_float32_sum_is_stored_unrounded():
  """A float32 sum into float64 (the partial sums of a split reduction): float32 blocks added in float64, and the
  float64 total stored as is. 2**24 in one block and 1 in the next add up to 2**24 + 1, which float32 can't hold."""
  n = 2 * SUM_BLOCK
  values = np.zeros(n, F32)
  values[0], values[SUM_BLOCK] = 2.0 ** 24, 1.0
  k = reduce_range(0, n)
  ast = kernel(store(buffer(0, F64), const(0), UOp(Ops.REDUCE, F64, (load(buffer(1, F32), k), k), Ops.ADD)))
  out = np.zeros(1, F64)
  run(ast, [out, values])
  assert out[0] == 2.0 ** 24 + 1


def test_sum_block_loop_stays_a_loop():
  """The loop over a row's SUM_BLOCK blocks is not unrolled: unrolled, the blocks' loads interleave into several
  memory streams (slower, see SUM_BLOCK)."""
  source = render_llvm("kernel", row_reduce_kernel(Ops.ADD, F32, 64, 2 * SUM_BLOCK))
  assert '!{!"llvm.loop.unroll.disable"}' in source
  values = sample(F32, n=64 * 2 * SUM_BLOCK, seed=33)
  out = np.zeros(64, F32)
  run(row_reduce_kernel(Ops.ADD, F32, 64, 2 * SUM_BLOCK), [out, values])
  rows = values.reshape(64, -1).astype(F64)
  # Rows of N(0, 10) values cancel: the error bound is relative to the sum of magnitudes, not to the (small) sum.
  np.testing.assert_array_less(np.abs(out - rows.sum(1)), 1e-6 * np.abs(rows).sum(1))


def test_short_reduce_nest_unrolls_whole_within_a_bound():
  """The short ranges of a reduction's nest are unrolled whole, innermost first, while their product stays at most
  UNROLL_WHOLE: a 3x3 window both ways, of an 8x14x14 nest only the 14 (LLVM took 69 s on its 1568 copies)."""
  from tinyjax.codegen.llvm import UNROLL_WHOLE

  def nest(sizes: tuple[int, ...]) -> UOp:
    ranges = [reduce_range(1 + axis, size) for axis, size in enumerate(sizes)]
    flat = const(0)
    for rng, size in zip(ranges, sizes): flat = add(mul(flat, const(size)), rng)
    i = global_range(0, 4)
    x = load(buffer(1, F32), add(mul(i, const(math.prod(sizes))), flat))
    return kernel(store(buffer(0, F32), i, UOp(Ops.REDUCE, F32, (x, *ranges), Ops.ADD)))

  assert 3 * 3 <= UNROLL_WHOLE < 8 * 14
  for sizes, whole in (((3, 3), 2), ((8, 14, 14), 1)):
    ast = nest(sizes)
    assert render_llvm("kernel", ast).count('!{!"llvm.loop.unroll.full"}') == whole
    values = sample(F32, n=4 * math.prod(sizes), seed=34)
    out = np.zeros(4, F32)
    run(ast, [out, values])
    np.testing.assert_allclose(out, values.reshape(4, -1).astype(F64).sum(1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# what LLVM makes of it: vectorised loops, F16C, no libcalls

def test_elementwise_float32_vectorises():
  i = global_range(0, 1 << 16)
  ast = kernel(store(buffer(0, F32), i, mul(add(load(buffer(1, F32), i), load(buffer(2, F32), i)), const(2.0, F32))))
  optimized = str(optimized_module(render_llvm("kernel", ast)))
  assert "<8 x float>" in optimized or "<16 x float>" in optimized


@pytest.mark.parametrize("rows", [SMALL_KERNEL_STEPS // 8, SMALL_KERNEL_STEPS // 8 + 1])
def test_small_kernels_compile_without_the_vectorisers(rows: int):
  """A kernel of at most SMALL_KERNEL_STEPS loop iterations is rendered `noimplicitfloat`: LLVM's loop and SLP
  vectorisers leave it scalar (half its compile time), and it computes the same. A bigger one is vectorised; so is a
  small one with an operation that is slow as a scalar (a square root), and a small register-tiled product, whose
  vector tile the renderer writes itself."""
  size = rows * 8
  i, k = global_range(0, rows), reduce_range(1, 8)
  x_value = load(buffer(1, F32), add(mul(i, const(8)), k))
  ast = kernel(store(buffer(0, F32), i, reduce(Ops.ADD, mul(add(x_value, const(0.5, F32)), x_value), k)))
  source = render_llvm("kernel", ast)
  small = size <= SMALL_KERNEL_STEPS
  assert ("noimplicitfloat" in source) == small
  assert bool(re.search(r"<(4|8|16) x float>", str(optimized_module(source)))) != small
  x = np.random.default_rng(2).standard_normal(size).astype(F32)
  out = np.zeros(rows, F32)
  run(ast, [out, x])
  x64 = x.astype(F64)
  np.testing.assert_allclose(out, ((x64 + 0.5) * x64).reshape(rows, 8).sum(1), rtol=2e-6, atol=1e-6)
  roots = kernel(store(buffer(0, F32), i, reduce(Ops.ADD, alu(Ops.SQRT, x_value), k)))
  assert "noimplicitfloat" not in render_llvm("kernel", roots)  # (a square root per element)
  row_means = kernel(store(buffer(0, F32), i, alu(Ops.SQRT, reduce(Ops.ADD, x_value, k))))
  assert "noimplicitfloat" not in render_llvm("kernel", row_means)  # (one per row)
  j = reduce_range(2, rows)
  total = reduce(Ops.ADD, load(buffer(1, F32), add(mul(j, const(8)), k)), j, k)
  mean = kernel(store(buffer(0, F32), const(0), alu(Ops.FDIV, total, const(float(size), F32))))
  assert ("noimplicitfloat" in render_llvm("kernel", mean)) == small  # (one division, after the loop)
  m = global_range(0, 16)
  n, r = global_range(1, 16), reduce_range(2, 16)
  product = mul(load(buffer(1, F32), add(mul(m, const(16)), r)), load(buffer(2, F32), add(mul(r, const(16)), n)))
  tiled = render_llvm("kernel", kernel(store(buffer(0, F32), add(mul(m, const(16)), n), reduce(Ops.ADD, product, r))))
  assert "noimplicitfloat" not in tiled and f"<{tile_geometry().vector_bytes // 4} x float>" in tiled


@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX])
def test_float32_reduction_vectorises(op: Ops):
  optimized = str(optimized_module(render_llvm("kernel", row_reduce_kernel(op, F32, 64, 1024))))
  assert "<8 x float>" in optimized or "<16 x float>" in optimized


def test_blocked_float32_sum_vectorises():
  k = reduce_range(0, 1 << 20)
  ast = kernel(store(buffer(0, F32), const(0), reduce(Ops.ADD, load(buffer(1, F32), k), k)))
  optimized = str(optimized_module(render_llvm("kernel", ast)))
  assert "<8 x float>" in optimized or "<16 x float>" in optimized


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_low_precision_uses_no_libcalls(dtype: np.dtype):
  """float16 <-> float32 becomes F16C instructions, bfloat16 integer bit operations: no __extendhfsf2 & co."""
  i = global_range(0, 1024)
  value = add(mul(load(buffer(1, dtype), i), load(buffer(2, dtype), i)), cast(load(buffer(3, F64), i), dtype))
  ast = kernel(store(buffer(0, dtype), i, value), store(buffer(4, F32), i, cast(value, F32)))
  assembly = target_machine().emit_assembly(optimized_module(render_llvm("kernel", ast)))
  assert not any(f"__{libcall}" in assembly for libcall in ("extendhfsf2", "truncsfhf2", "truncdfhf2", "truncsfbf2",
                                                            "truncdfbf2", "extendbfsf2"))
  if dtype == F16: assert "vcvtps2ph" in assembly and "vcvtph2ps" in assembly


def test_module_shape():
  """The exported function has the ABI signature; the body is internal, alwaysinline, with noalias buffers."""
  ir = render_llvm("my_kernel", elementwise(Ops.ADD, [F32, F32], F32, 8), target_triple=llvm.get_process_triple())
  assert "define void @my_kernel(ptr noalias %args, i64 %start, i64 %end)" in ir
  assert "alwaysinline" in ir and "ptr noalias %buf1" in ir
  assert ir.startswith("target triple")
  assert "target triple" not in render_llvm("my_kernel", elementwise(Ops.ADD, [F32, F32], F32, 8))


def test_through_compile_cpu():
  """The same kernels through the CPU device (parallel launch over the outer range), if it is there."""
  cpu = pytest.importorskip("tinyjax.devices.cpu")
  rows, cols = 64, 500
  values = sample(F32, n=rows * cols, seed=33)
  out = np.zeros(rows, F32)
  program = cpu.compile_cpu("row_sum", render_llvm("row_sum", row_reduce_kernel(Ops.ADD, F32, rows, cols)))
  program([out.ctypes.data, values.ctypes.data], rows)
  assert_same(out, values.reshape(rows, cols).astype(F64).sum(1).astype(F32), 1e-5)
