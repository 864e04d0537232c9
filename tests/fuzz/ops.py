"""The operations random programs are made of: one row each, with JAX's result-dtype rule and a float64 numpy
reference.

An `Operand` is a value of the program (its host data in its own dtype, with dtype name and weak type) or a scalar
(Python or numpy). Each row says what the operation gives (`aval`: shape, dtype, weak type, or the error kind JAX
raises) and computes the expected values from the operands' values: exactly for integers and bools (wrapping as the
dtype does), in float64 rounded once to the result dtype for floats. Operations whose JAX result is undefined or
backend-specific (integer division by zero, shifts out of range, negative integer powers) make the program invalid
rather than expected.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tests.fuzz.promotion import BOOL, FLOATS, kind, np_dtype, result_type, sum_dtype, to_inexact, to_numeric


class Invalid(Exception):
  """The operation has no defined JAX answer for these operands (the program is dropped, not checked)."""


class ExpectedError(Exception):
  """JAX raises this kind of error for the operation (`kind` is TypeError or ValueError)."""
  def __init__(self, kind: type):
    super().__init__(kind.__name__)
    self.kind = kind


@dataclass(frozen=True)
class Aval:
  shape: tuple[int, ...]
  dtype: str
  weak: bool

  def __str__(self) -> str: return f"{self.dtype}{list(self.shape)}{' weak' if self.weak else ''}"


@dataclass
class Operand:
  """A value in a program (an input or an op's result) or a Python scalar. `host` holds exact values in the dtype."""
  aval: Aval
  host: np.ndarray | None = None
  scalar: Any = None
  seed: int | None = None  # a large input's values are random_values(default_rng(seed), ...) (see programs.py)

  @property
  def is_scalar(self) -> bool: return self.aval.shape == () and self.scalar is not None


CANONICAL_NUMPY = {"int64": "int32", "uint64": "uint32", "float64": "float32"}


def scalar_operand(value: Any) -> Operand:
  """A scalar operand. Python: bool is a strong bool, int and float are weak. numpy scalars are strongly typed, in
  their dtype narrowed to 32 bits (np.float64 acts as float32), as JAX's."""
  if isinstance(value, np.generic):
    dtype = CANONICAL_NUMPY.get(value.dtype.name, value.dtype.name)
    return Operand(Aval((), dtype, False), np.asarray(value).astype(np_dtype(dtype)), value)
  dtype = BOOL if type(value) is bool else ("int32" if type(value) is int else "float32")
  return Operand(Aval((), dtype, type(value) is not bool), np.asarray(value, np_dtype(dtype)), value)


# ---------------------------------------------------------------------------------------------- value conversion

def exact(values: np.ndarray, dtype: str) -> np.ndarray:
  """Values of an array in `dtype` as float64 (floats) or Python ints in an object array (ints, bools)."""
  if kind(dtype) == "f": return np.asarray(values, np_dtype(dtype)).astype(np.float64)
  return np.asarray(values, np_dtype(dtype)).astype(object) if kind(dtype) != "b" else \
    np.asarray(values, np.bool_).astype(object).astype(int).astype(object)


def round_to(values: Any, dtype: str) -> np.ndarray:
  """Float64 or Python-int results as an array of `dtype`: floats rounded once, ints wrapped, bools != 0."""
  values = np.asarray(values)
  if kind(dtype) == "b": return (values != 0).astype(np.bool_)
  if kind(dtype) == "f":
    with np.errstate(over="ignore", invalid="ignore"):
      return values.astype(np.float64).astype(np_dtype(dtype))
  bits = 8 * np_dtype(dtype).itemsize
  signed = kind(dtype) == "i"
  wrapped = [((int(v) + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1)) if signed else int(v) % (1 << bits)
             for v in values.ravel()]
  return np.array(wrapped, dtype=np_dtype(dtype)).reshape(values.shape)


def convert(operand: Operand, dtype: str) -> np.ndarray:
  """The operand's values converted to `dtype` as JAX's convert_element_type: floats round, ints wrap, floats to
  ints truncate (NaN is 0, out of range saturates), anything to bool is != 0."""
  values = exact(operand.host, operand.aval.dtype)
  if type(operand.scalar) in (int, float):  # a Python number converts from its own value
    values = np.asarray(float(operand.scalar)) if type(operand.scalar) is float else np.asarray(operand.scalar, object)
  if kind(dtype) in "iu" and kind(operand.aval.dtype) == "f":
    info = np.iinfo(np_dtype(dtype))
    values = np.array([0 if math.isnan(v) else int(min(max(v, info.min), info.max)) for v in values.ravel()],
                      dtype=object).reshape(values.shape)
  return round_to(values, dtype)


# ---------------------------------------------------------------------------------------------- the rows

@dataclass(frozen=True)
class Op:
  """One operation: `call(tnp, *operands, **params)` runs it on tinyjax; `aval(*avals, **params)` gives the
  result aval or raises ExpectedError/Invalid; `reference(result_aval, *operands, **params)` the expected host
  values; `tolerance` in units of the result dtype's epsilon (0: exact); `scale` the magnitude errors are relative
  to (default: the result's)."""
  name: str
  arity: int
  call: Callable[..., Any]
  aval: Callable[..., Aval]
  reference: Callable[..., np.ndarray]
  code: str
  tolerance: float = 0
  scale: Callable[..., np.ndarray] | None = None
  params: Callable[[Any, tuple[Aval, ...]], dict] = field(default=lambda rng, avals: {})
  reads_nan_sign: bool = False  # the result depends on the sign of a NaN operand, which fusion may change


def broadcast(name: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
  """numpy's broadcast, with JAX's error kinds: same-rank mismatch TypeError, else ValueError."""
  try:
    return tuple(np.broadcast_shapes(*shapes))
  except ValueError:
    raise ExpectedError(TypeError if len({len(s) for s in shapes}) == 1 else ValueError) from None


def _check_kinds(dtype: str, kinds: str) -> None:
  if kind(dtype) not in kinds: raise ExpectedError(TypeError)


def _promoted(*avals: Aval, inexact: bool = False, numeric: bool = False) -> tuple[str, bool]:
  dtype, weak = result_type(*((a.dtype, a.weak) for a in avals))
  if inexact: dtype = to_inexact(dtype)
  if numeric: dtype = to_numeric(dtype)
  return dtype, weak


def elementwise(name: str, code: str, compute: Callable[..., Any], arity: int, *, inexact: bool = False,
                numeric: bool = False, kinds: str = "biuf", out: str | None = None, tolerance: float = 0,
                weak_rule: Callable[..., bool] | None = None, scale: Callable[..., Any] | None = None,
                bool_compute: Callable[..., Any] | None = None, call: Callable[..., Any] | None = None) -> Op:
  """An elementwise jnp function: promote (JAX's rule; `inexact` moves ints/bools to float32, `numeric` bools to
  int32), check the dtype kind, compute in float64/exact ints on the promoted values, round to the result dtype
  (`out`: 'bool' for predicates). A single operand is not promoted unless `inexact`/`numeric` (as JAX).
  `weak_rule(*avals)` says whether a weak promoted type stays weak (JAX composes some functions with strongly typed
  constants)."""
  def aval(*avals: Aval) -> Aval:
    shape = broadcast(name, *(a.shape for a in avals))
    if arity == 1 and not (inexact or numeric): dtype, weak = avals[0].dtype, avals[0].weak
    else: dtype, weak = _promoted(*avals, inexact=inexact, numeric=numeric)
    _check_kinds(dtype, kinds)
    if weak_rule is not None: weak = weak and weak_rule(*avals)
    if out == BOOL: return Aval(shape, BOOL, False)
    return Aval(shape, dtype, weak and dtype != BOOL)

  def reference(result: Aval, *operands: Operand) -> np.ndarray:
    if arity == 1 and not (inexact or numeric): dtype = operands[0].aval.dtype
    else: dtype = _promoted(*(o.aval for o in operands), inexact=inexact, numeric=numeric)[0]
    values = [np.broadcast_to(exact(convert(o, dtype), dtype), result.shape) for o in operands]
    with np.errstate(all="ignore"):
      computed = bool_compute(*values) if bool_compute is not None and dtype == BOOL else compute(dtype, *values)
    return round_to(computed, result.dtype)

  def run(tnp: Any, *args: Any) -> Any: return getattr(tnp, name)(*args)
  return Op(name, arity, call or run, aval, reference, code, tolerance, scale,
            reads_nan_sign=name in ("signbit", "copysign"))


def _ints(values: np.ndarray) -> list[int]: return [int(v) for v in np.asarray(values).ravel()]


def _per_element(fn: Callable[..., Any]) -> Callable[..., Any]:
  """An exact integer function applied element by element (Python ints, no overflow)."""
  def apply(*values: np.ndarray) -> np.ndarray:
    shape = np.asarray(values[0]).shape
    return np.array([fn(*items) for items in zip(*(_ints(v) for v in values))], dtype=object).reshape(shape)
  return apply


def _arith(float_fn: Callable, int_fn: Callable) -> Callable[..., Any]:
  def compute(dtype: str, *values: np.ndarray) -> Any:
    if kind(dtype) == "f": return float_fn(*(np.asarray(v, np.float64) for v in values))
    return _per_element(int_fn)(*values)
  return compute


def _float_only(fn: Callable) -> Callable[..., Any]:
  return lambda dtype, *values: fn(*(np.asarray(v, np.float64) for v in values))


def _no_zero_divisor(a: int, b: int, fn: Callable[[int, int], int]) -> int:
  if b == 0: raise Invalid("integer division by zero is backend-defined")
  return fn(a, b)


def _floor_div(a: int, b: int) -> int: return _no_zero_divisor(a, b, lambda a, b: a // b)
def _remainder(a: int, b: int) -> int: return 0 if b == 0 else a % b  # JAX: an integer % 0 is 0
def _fmod(a: int, b: int) -> int: return 0 if b == 0 else int(math.fmod(a, b))


def _int_power(a: int, b: int) -> int:
  if b < 0 or b > 24: raise Invalid("JAX's integer power of a negative or large exponent is backend-defined")
  return a ** b


def _shift(left: bool) -> Callable[[str, np.ndarray, np.ndarray], Any]:
  def compute(dtype: str, a: np.ndarray, b: np.ndarray) -> Any:
    bits = 8 * np_dtype(dtype).itemsize
    def one(x: int, y: int) -> int:
      if not 0 <= y < bits: raise Invalid("shift out of range")
      return x << y if left else x >> y  # Python's >> is arithmetic, as for signed; unsigned values are >= 0
    return _per_element(one)(a, b)
  return compute


def _all_weak(*avals: Aval) -> bool: return all(a.weak for a in avals)
def _all_scalars(*avals: Aval) -> bool: return all(a.shape == () for a in avals)
def _first_scalar(*avals: Aval) -> bool: return avals[0].shape == ()


def _trig_scale(result: Aval, *operands: Operand) -> np.ndarray:
  """sin/cos/tan are accurate relative to max(1, |x|) (argument reduction), not to a result near a zero."""
  return np.maximum(1.0, np.abs(exact(operands[0].host, operands[0].aval.dtype)))


def _power_weak(*avals: Aval) -> bool:
  """JAX's jnp.power: an integer result, or an integer exponent array, is weak only if both operands are weak."""
  base, exponent = avals
  return _all_weak(*avals) or (kind(_promoted(*avals, numeric=True)[0]) == "f" and kind(exponent.dtype) not in "iu")


BINARY = [
  elementwise("add", "{0} + {1}", _arith(np.add, lambda a, b: a + b), 2, bool_compute=np.logical_or),
  elementwise("subtract", "{0} - {1}", _arith(np.subtract, lambda a, b: a - b), 2, kinds="iuf"),
  elementwise("multiply", "{0} * {1}", _arith(np.multiply, lambda a, b: a * b), 2, bool_compute=np.logical_and),
  elementwise("divide", "{0} / {1}", _float_only(np.divide), 2, inexact=True, tolerance=1),
  elementwise("floor_divide", "{0} // {1}", _arith(np.floor_divide, _floor_div), 2, numeric=True, tolerance=1),
  elementwise("remainder", "{0} % {1}", _arith(np.remainder, _remainder), 2, numeric=True, tolerance=1,
              scale=lambda result, a, b: np.abs(exact(convert(b, result.dtype), result.dtype))),
  elementwise("fmod", "tnp.fmod({0}, {1})", _arith(np.fmod, _fmod), 2, numeric=True, tolerance=1,
              scale=lambda result, a, b: np.abs(exact(convert(b, result.dtype), result.dtype))),
  elementwise("power", "{0} ** {1}", _arith(np.power, _int_power), 2, numeric=True, tolerance=8, weak_rule=_power_weak),
  elementwise("maximum", "tnp.maximum({0}, {1})", _arith(np.maximum, max), 2, bool_compute=np.logical_or),
  elementwise("minimum", "tnp.minimum({0}, {1})", _arith(np.minimum, min), 2, bool_compute=np.logical_and),
  elementwise("arctan2", "tnp.arctan2({0}, {1})", _float_only(np.arctan2), 2, inexact=True, tolerance=4),
  elementwise("logaddexp", "tnp.logaddexp({0}, {1})", _float_only(np.logaddexp), 2, inexact=True, tolerance=4),
  elementwise("hypot", "tnp.hypot({0}, {1})", _float_only(np.hypot), 2, inexact=True, tolerance=2,
              weak_rule=_all_scalars),  # JAX's hypot is weak only for 0-d operands

  elementwise("copysign", "tnp.copysign({0}, {1})", _float_only(np.copysign), 2, inexact=True),
  elementwise("heaviside", "tnp.heaviside({0}, {1})", _float_only(np.heaviside), 2, inexact=True,
              weak_rule=_first_scalar),  # ... heaviside only for a 0-d x1
  elementwise("equal", "{0} == {1}", _arith(np.equal, lambda a, b: a == b), 2, out=BOOL),
  elementwise("not_equal", "{0} != {1}", _arith(np.not_equal, lambda a, b: a != b), 2, out=BOOL),
  elementwise("less", "{0} < {1}", _arith(np.less, lambda a, b: a < b), 2, out=BOOL),
  elementwise("less_equal", "{0} <= {1}", _arith(np.less_equal, lambda a, b: a <= b), 2, out=BOOL),
  elementwise("greater", "{0} > {1}", _arith(np.greater, lambda a, b: a > b), 2, out=BOOL),
  elementwise("logical_and", "tnp.logical_and({0}, {1})", _arith(np.logical_and, lambda a, b: bool(a and b)), 2,
              out=BOOL),
  elementwise("logical_xor", "tnp.logical_xor({0}, {1})", _arith(np.logical_xor, lambda a, b: bool(a) != bool(b)), 2,
              out=BOOL),
  elementwise("bitwise_and", "{0} & {1}", _arith(None, lambda a, b: a & b), 2, kinds="biu"),
  elementwise("bitwise_or", "{0} | {1}", _arith(None, lambda a, b: a | b), 2, kinds="biu"),
  elementwise("bitwise_xor", "{0} ^ {1}", _arith(None, lambda a, b: a ^ b), 2, kinds="biu"),
  elementwise("left_shift", "tnp.left_shift({0}, {1})", _shift(True), 2, numeric=True, kinds="iu"),
  elementwise("right_shift", "tnp.right_shift({0}, {1})", _shift(False), 2, numeric=True, kinds="iu"),
]


def _clip_aval(x: Aval, low: Aval, high: Aval) -> Aval:
  """jnp.clip is minimum(maximum(x, low), high): two promotions in turn, not one of all three operands."""
  raised = BINARY_BY_NAME["maximum"].aval(x, low)
  return BINARY_BY_NAME["minimum"].aval(raised, high)


def _clip_reference(result: Aval, x: Operand, low: Operand, high: Operand) -> np.ndarray:
  maximum, minimum = BINARY_BY_NAME["maximum"], BINARY_BY_NAME["minimum"]
  raised_aval = maximum.aval(x.aval, low.aval)
  raised = Operand(raised_aval, maximum.reference(raised_aval, x, low))
  return minimum.reference(result, raised, high)


BINARY_BY_NAME = {op.name: op for op in BINARY}
CLIP = Op("clip", 3, lambda tnp, x, low, high: tnp.clip(x, low, high), _clip_aval, _clip_reference,
          "tnp.clip({0}, {1}, {2})")


def _rint_aval_rule(*avals: Aval) -> bool: return kind(avals[0].dtype) == "f"  # rint of an int is strong


UNARY = [
  elementwise("negative", "-{0}", _arith(np.negative, lambda a: -a), 1, kinds="iuf"),
  elementwise("positive", "tnp.positive({0})", lambda dtype, a: a, 1),
  elementwise("absolute", "tnp.abs({0})", _arith(np.abs, abs), 1, bool_compute=lambda a: a),
  elementwise("sign", "tnp.sign({0})", _arith(np.sign, lambda a: (a > 0) - (a < 0)), 1, kinds="iuf"),
  elementwise("square", "tnp.square({0})", _arith(np.square, lambda a: a * a), 1, numeric=True),
  elementwise("reciprocal", "tnp.reciprocal({0})", _float_only(np.reciprocal), 1, inexact=True, tolerance=1),
  elementwise("sqrt", "tnp.sqrt({0})", _float_only(np.sqrt), 1, inexact=True, tolerance=1),
  elementwise("cbrt", "tnp.cbrt({0})", _float_only(np.cbrt), 1, inexact=True, tolerance=4),
  elementwise("exp", "tnp.exp({0})", _float_only(np.exp), 1, inexact=True, tolerance=4),
  elementwise("exp2", "tnp.exp2({0})", _float_only(np.exp2), 1, inexact=True, tolerance=4),
  elementwise("expm1", "tnp.expm1({0})", _float_only(np.expm1), 1, inexact=True, tolerance=4),
  elementwise("log", "tnp.log({0})", _float_only(np.log), 1, inexact=True, tolerance=4),
  elementwise("log2", "tnp.log2({0})", _float_only(np.log2), 1, inexact=True, tolerance=4,
              weak_rule=lambda a: False),
  elementwise("log10", "tnp.log10({0})", _float_only(np.log10), 1, inexact=True, tolerance=4,
              weak_rule=lambda a: False),
  elementwise("log1p", "tnp.log1p({0})", _float_only(np.log1p), 1, inexact=True, tolerance=4),
  elementwise("sin", "tnp.sin({0})", _float_only(np.sin), 1, inexact=True, tolerance=4, scale=_trig_scale),
  elementwise("cos", "tnp.cos({0})", _float_only(np.cos), 1, inexact=True, tolerance=4, scale=_trig_scale),
  elementwise("tanh", "tnp.tanh({0})", _float_only(np.tanh), 1, inexact=True, tolerance=4),
  elementwise("arctan", "tnp.arctan({0})", _float_only(np.arctan), 1, inexact=True, tolerance=4),
  elementwise("sinh", "tnp.sinh({0})", _float_only(np.sinh), 1, inexact=True, tolerance=4),
  elementwise("fabs", "tnp.fabs({0})", _float_only(np.fabs), 1, inexact=True),
  elementwise("floor", "tnp.floor({0})", _arith(np.floor, lambda a: a), 1),
  elementwise("ceil", "tnp.ceil({0})", _arith(np.ceil, lambda a: a), 1),
  elementwise("trunc", "tnp.trunc({0})", _arith(np.trunc, lambda a: a), 1),
  elementwise("rint", "tnp.rint({0})", _float_only(np.rint), 1, inexact=True, weak_rule=_rint_aval_rule),
  elementwise("isnan", "tnp.isnan({0})", _arith(np.isnan, lambda a: False), 1, out=BOOL),
  elementwise("isfinite", "tnp.isfinite({0})", _arith(np.isfinite, lambda a: True), 1, out=BOOL),
  elementwise("signbit", "tnp.signbit({0})", _arith(np.signbit, lambda a: a < 0), 1, out=BOOL),
  elementwise("logical_not", "tnp.logical_not({0})", _arith(np.logical_not, lambda a: not a), 1, out=BOOL),
  elementwise("invert", "~{0}", _arith(None, lambda a: ~a), 1, kinds="biu", bool_compute=np.logical_not),
]


# ---------------------------------------------------------------------------------------------- other rows

def _where_aval(cond: Aval, x: Aval, y: Aval) -> Aval:
  shape = broadcast("where", cond.shape, x.shape, y.shape)
  dtype, weak = _promoted(x, y)
  return Aval(shape, dtype, weak)


def _where_reference(result: Aval, cond: Operand, x: Operand, y: Operand) -> np.ndarray:
  condition = np.broadcast_to(convert(cond, BOOL), result.shape)
  return np.where(condition, np.broadcast_to(convert(x, result.dtype), result.shape),
                  np.broadcast_to(convert(y, result.dtype), result.shape))


WHERE = Op("where", 3, lambda tnp, c, x, y: tnp.where(c, x, y), _where_aval, _where_reference,
           "tnp.where({0}, {1}, {2})")


def _integer_pow_aval(x: Aval, *, y: int) -> Aval:
  dtype = to_numeric(x.dtype)
  if y < 0 and kind(dtype) != "f": raise ExpectedError(TypeError)
  return Aval(x.shape, dtype, x.weak and dtype != BOOL)


def _integer_pow_reference(result: Aval, x: Operand, *, y: int) -> np.ndarray:
  values = exact(convert(x, result.dtype), result.dtype)
  if kind(result.dtype) != "f": return round_to(_per_element(lambda a: a ** y)(values), result.dtype)
  with np.errstate(all="ignore"):
    return round_to(np.power(values.astype(np.float64), float(y)), result.dtype)


INTEGER_POW = Op("integer_pow", 1, lambda tnp, x, *, y: x ** y, _integer_pow_aval, _integer_pow_reference,
                 "{0} ** {y}", tolerance=8, params=lambda rng, avals: {"y": int(rng.choice([0, 1, 2, 3, -1, -2]))})


def _astype_aval(x: Aval, *, dtype: str) -> Aval: return Aval(x.shape, dtype, False)
def _astype_reference(result: Aval, x: Operand, *, dtype: str) -> np.ndarray: return convert(x, dtype)


ALL_DTYPES = (BOOL, "int8", "int16", "int32", "uint8", "uint32") + FLOATS
ASTYPE = Op("astype", 1, lambda tnp, x, *, dtype: x.astype(np_dtype(dtype)), _astype_aval, _astype_reference,
            "{0}.astype(tnp.{dtype})", params=lambda rng, avals: {"dtype": str(rng.choice(ALL_DTYPES))})


# reductions: (result dtype rule, float64/exact reference over the axes)
def _reduction_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  ndim = len(avals[0].shape)
  axis = None if ndim == 0 or rng.random() < 0.3 else int(rng.integers(-ndim, ndim))
  return {"axis": axis, "keepdims": bool(rng.random() < 0.3)}


def _reduced_shape(shape: tuple[int, ...], axis: int | None, keepdims: bool) -> tuple[int, ...]:
  axes = range(len(shape)) if axis is None else [axis % len(shape)]
  if keepdims: return tuple(1 if i in axes else d for i, d in enumerate(shape))
  return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduction(name: str, dtype_rule: Callable[[str], str], float_fn: Callable, int_fn: Callable | None,
               tolerance: float, empty_error: bool = False) -> Op:
  def aval(x: Aval, *, axis: int | None, keepdims: bool) -> Aval:
    axes = range(len(x.shape)) if axis is None else [axis % len(x.shape)]
    if empty_error and any(x.shape[i] == 0 for i in axes): raise ExpectedError(ValueError)
    return Aval(_reduced_shape(x.shape, axis, keepdims), dtype_rule(x.dtype), False)

  def reference(result: Aval, x: Operand, *, axis: int | None, keepdims: bool) -> np.ndarray:
    compute = dtype_rule(x.aval.dtype) if name not in ("max", "min", "argmax", "argmin") else x.aval.dtype
    if name in ("any", "all"): compute = BOOL
    values = exact(convert(x, compute), compute)
    if kind(compute) == "f" or int_fn is None:
      with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's warning for the mean or variance of nothing
        out = float_fn(values.astype(np.float64), axis=axis, keepdims=keepdims)
    else:
      out = int_fn(values, axis=axis, keepdims=keepdims)
    return round_to(out, result.dtype)

  code = "tnp." + name + "({0}, axis={axis}, keepdims={keepdims})"
  scale = {"sum": _sum_scale, "mean": _sum_scale, "var": _var_scale, "std": _std_scale}.get(name)
  return Op(name, 1, lambda tnp, x, **params: getattr(tnp, name)(x, **params), aval, reference, code,
            tolerance, scale, params=_reduction_params)


def _sum_scale(result: Aval, x: Operand, *, axis: int | None, keepdims: bool) -> np.ndarray:
  """A sum is accurate relative to the sum of magnitudes (and the count of terms), not to a cancelled result."""
  values = np.abs(exact(x.host, x.aval.dtype).astype(np.float64))
  return np.maximum(np.sum(values, axis=axis, keepdims=keepdims), 1e-30)


def _var_scale(result: Aval, x: Operand, *, axis: int | None, keepdims: bool) -> np.ndarray:
  """A variance is accurate relative to the mean square (the two terms that cancel), not to the result."""
  values = exact(convert(x, result.dtype), result.dtype).astype(np.float64)
  return np.maximum(np.mean(values * values, axis=axis, keepdims=keepdims), 1e-30) if values.size else 1.0


def _std_scale(result: Aval, x: Operand, *, axis: int | None, keepdims: bool) -> np.ndarray:
  """A standard deviation is accurate relative to the root mean square."""
  return np.sqrt(_var_scale(result, x, axis=axis, keepdims=keepdims))


def _object_reduce(fn: Callable) -> Callable:
  def reduce(values: np.ndarray, axis: int | None, keepdims: bool) -> np.ndarray:
    return np.asarray(fn(values, axis=axis, keepdims=keepdims), dtype=object)
  return reduce


REDUCTIONS = [
  _reduction("sum", sum_dtype, np.sum, _object_reduce(np.sum), 4),
  _reduction("prod", sum_dtype, np.prod, _object_reduce(np.prod), 8),
  _reduction("mean", to_inexact, np.mean, None, 4),
  _reduction("var", to_inexact, np.var, None, 16),
  _reduction("max", lambda d: d, np.max, _object_reduce(np.max), 0, empty_error=True),
  _reduction("min", lambda d: d, np.min, _object_reduce(np.min), 0, empty_error=True),
  _reduction("argmax", lambda d: "int32", np.argmax, _object_reduce(np.argmax), 0, empty_error=True),
  _reduction("argmin", lambda d: "int32", np.argmin, _object_reduce(np.argmin), 0, empty_error=True),
  _reduction("std", to_inexact, np.std, None, 16),
  _reduction("any", lambda d: BOOL, np.any, _object_reduce(np.any), 0),
  _reduction("all", lambda d: BOOL, np.all, _object_reduce(np.all), 0),
]


# movement: shapes change, dtype and weak type stay (concatenate/stack promote their operands)
def _movement(name: str, code: str, shape_fn: Callable[..., tuple[int, ...]], move: Callable[..., np.ndarray],
              params: Callable, call: Callable) -> Op:
  def aval(x: Aval, **params: Any) -> Aval: return Aval(shape_fn(x.shape, **params), x.dtype, x.weak)
  def reference(result: Aval, x: Operand, **params: Any) -> np.ndarray: return move(x.host, **params)
  return Op(name, 1, call, aval, reference, code, params=params)


def _reshape_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  size = math.prod(avals[0].shape)
  choices = [(size,), (1, size), (size, 1)] + [(d, size // d) for d in range(2, 8) if d and size % d == 0]
  if size == 0: choices += [(0, 3), (2, 0, 1)]
  choices += [(d, 1, size // d) for d in range(2, 5) if size % d == 0]
  return {"shape": tuple(int(s) for s in choices[int(rng.integers(len(choices)))])}


def _transpose_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  return {"axes": tuple(int(a) for a in rng.permutation(len(avals[0].shape)))}


def _slice_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  slices = []
  for dim in avals[0].shape:
    start = None if rng.random() < 0.5 else int(rng.integers(-dim - 1, dim + 2))
    stop = None if rng.random() < 0.5 else int(rng.integers(-dim - 1, dim + 2))
    slices.append((start, stop, int(rng.choice([1, 1, 2, -1, -2, 3]))))
  return {"slices": tuple(slices)}


def _as_slices(slices: tuple) -> tuple[slice, ...]: return tuple(slice(*s) for s in slices)


def _expand_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  return {"axis": int(rng.integers(-len(avals[0].shape) - 1, len(avals[0].shape) + 1))}


def _broadcast_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  shape = tuple(int(rng.choice([1, 2, 3])) if d == 1 and rng.random() < 0.5 else d for d in avals[0].shape)
  return {"shape": (int(rng.choice([1, 2])),) * int(rng.integers(0, 2)) + shape}


def _flip_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  return {"axis": None if not avals[0].shape or rng.random() < 0.3 else int(rng.integers(len(avals[0].shape)))}


def _pad_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  if not avals[0].shape: raise Invalid("jnp.pad of a 0-d array is JAX's own error")
  return {"widths": tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in avals[0].shape)}


def _tile_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  return {"reps": tuple(int(r) for r in rng.integers(0, 3, int(rng.integers(1, len(avals[0].shape) + 2))))}


def _repeat_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  ndim = len(avals[0].shape)
  return {"repeats": int(rng.integers(0, 4)), "axis": None if not ndim or rng.random() < 0.3 else
          int(rng.integers(-ndim, ndim))}


def _roll_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  ndim = len(avals[0].shape)
  return {"shift": int(rng.integers(-7, 8)), "axis": None if not ndim or rng.random() < 0.3 else
          int(rng.integers(-ndim, ndim))}


def _squeeze_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  ones = [i for i, d in enumerate(avals[0].shape) if d == 1]
  if not ones: raise Invalid("no axis of size 1 to squeeze")
  return {"axis": tuple(int(i) for i in ones if rng.random() < 0.7)}


def _two_axes_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  ndim = len(avals[0].shape)
  if not ndim: raise Invalid("no axes to move")
  return {"source": int(rng.integers(-ndim, ndim)), "destination": int(rng.integers(-ndim, ndim))}


def _moved_shape(shape: tuple[int, ...], source: int, destination: int) -> tuple[int, ...]:
  return np.moveaxis(np.empty(shape), source, destination).shape


MOVEMENT = [
  _movement("reshape", "{0}.reshape({shape})", lambda s, shape: shape, lambda h, shape: h.reshape(shape),
            _reshape_params, lambda tnp, x, shape: x.reshape(shape)),
  _movement("transpose", "tnp.transpose({0}, {axes})", lambda s, axes: tuple(s[a] for a in axes),
            lambda h, axes: np.transpose(h, axes), _transpose_params, lambda tnp, x, axes: tnp.transpose(x, axes)),
  _movement("getitem", "{0}[{slices}]", lambda s, slices: np.empty(s)[_as_slices(slices)].shape,
            lambda h, slices: h[_as_slices(slices)], _slice_params, lambda tnp, x, slices: x[_as_slices(slices)]),
  _movement("expand_dims", "tnp.expand_dims({0}, {axis})", lambda s, axis: np.expand_dims(np.empty(s), axis).shape,
            lambda h, axis: np.expand_dims(h, axis), _expand_params, lambda tnp, x, axis: tnp.expand_dims(x, axis)),
  _movement("broadcast_to", "tnp.broadcast_to({0}, {shape})", lambda s, shape: shape,
            lambda h, shape: np.broadcast_to(h, shape), _broadcast_params,
            lambda tnp, x, shape: tnp.broadcast_to(x, shape)),
  _movement("flip", "tnp.flip({0}, {axis})", lambda s, axis: s, lambda h, axis: np.flip(h, axis), _flip_params,
            lambda tnp, x, axis: tnp.flip(x, axis)),
  _movement("squeeze", "tnp.squeeze({0}, {axis})", lambda s, axis: np.squeeze(np.empty(s), axis).shape,
            lambda h, axis: np.squeeze(h, axis), _squeeze_params, lambda tnp, x, axis: tnp.squeeze(x, axis)),
  _movement("moveaxis", "tnp.moveaxis({0}, {source}, {destination})", _moved_shape,
            lambda h, source, destination: np.moveaxis(h, source, destination), _two_axes_params,
            lambda tnp, x, source, destination: tnp.moveaxis(x, source, destination)),
  _movement("tile", "tnp.tile({0}, {reps})", lambda s, reps: np.tile(np.empty(s), reps).shape,
            lambda h, reps: np.tile(h, reps), _tile_params, lambda tnp, x, reps: tnp.tile(x, reps)),
  _movement("repeat", "tnp.repeat({0}, {repeats}, {axis})",
            lambda s, repeats, axis: np.repeat(np.empty(s), repeats, axis).shape,
            lambda h, repeats, axis: np.repeat(h, repeats, axis), _repeat_params,
            lambda tnp, x, repeats, axis: tnp.repeat(x, repeats, axis)),
  _movement("roll", "tnp.roll({0}, {shift}, {axis})", lambda s, shift, axis: s,
            lambda h, shift, axis: np.roll(h, shift, axis), _roll_params,
            lambda tnp, x, shift, axis: tnp.roll(x, shift, axis)),
  _movement("pad", "tnp.pad({0}, {widths})", lambda s, widths: tuple(d + lo + hi for d, (lo, hi) in zip(s, widths)),
            lambda h, widths: np.pad(h, widths), _pad_params, lambda tnp, x, widths: tnp.pad(x, widths)),
]


def _join_aval(name: str) -> Callable[..., Aval]:
  def aval(x: Aval, y: Aval, *, axis: int) -> Aval:
    dtype, weak = _promoted(x, y)
    if name == "stack":
      if x.shape != y.shape: raise ExpectedError(ValueError)
      return Aval(x.shape[:axis % (len(x.shape) + 1)] + (2,) + x.shape[axis % (len(x.shape) + 1):], dtype, weak)
    if not x.shape: raise ExpectedError(ValueError)  # zero-dimensional arrays cannot be concatenated
    if len(x.shape) != len(y.shape): raise ExpectedError(TypeError)
    axis %= len(x.shape)
    if any(a != b for i, (a, b) in enumerate(zip(x.shape, y.shape)) if i != axis): raise ExpectedError(TypeError)
    return Aval(x.shape[:axis] + (x.shape[axis] + y.shape[axis],) + x.shape[axis + 1:], dtype, weak)
  return aval


def _join_reference(name: str) -> Callable[..., np.ndarray]:
  def reference(result: Aval, x: Operand, y: Operand, *, axis: int) -> np.ndarray:
    join = np.stack if name == "stack" else np.concatenate
    return join([convert(x, result.dtype), convert(y, result.dtype)], axis=axis)
  return reference


def _join_params(rng: Any, avals: tuple[Aval, ...]) -> dict:
  ndim = len(avals[0].shape)
  return {"axis": int(rng.integers(-ndim, ndim)) if ndim else 0}


JOINS = [
  Op("concatenate", 2, lambda tnp, x, y, *, axis: tnp.concatenate([x, y], axis=axis), _join_aval("concatenate"),
     _join_reference("concatenate"), "tnp.concatenate([{0}, {1}], axis={axis})", params=_join_params),
  Op("stack", 2, lambda tnp, x, y, *, axis: tnp.stack([x, y], axis=axis), _join_aval("stack"),
     _join_reference("stack"), "tnp.stack([{0}, {1}], axis={axis})", params=_join_params),
]

def _gram_aval(x: Aval) -> Aval:
  """x @ swapaxes(x, -1, -2) (a vector: x @ x): a contraction of promoted (here: equal) dtypes."""
  if not x.shape: raise Invalid("swapaxes of a 0-d array")
  shape = () if len(x.shape) == 1 else x.shape[:-1] + (x.shape[-2],)
  return Aval(shape, x.dtype, x.weak)


def _gram_values(values: np.ndarray) -> np.ndarray:
  other = values if values.ndim == 1 else np.swapaxes(values, -1, -2)
  with np.errstate(all="ignore"):  # inf * 0 is NaN, as in the product being checked
    return np.matmul(values, other)


def _gram_reference(result: Aval, x: Operand) -> np.ndarray:
  values = exact(x.host, x.aval.dtype)
  if kind(x.aval.dtype) == "f": return round_to(_gram_values(values.astype(np.float64)), result.dtype)
  product = _gram_values(values)  # object arrays: exact Python ints
  return round_to(product != 0 if x.aval.dtype == BOOL else product, result.dtype)


def _gram_scale(result: Aval, x: Operand) -> np.ndarray:
  """A contraction is accurate relative to the sum of the magnitudes of its products."""
  return _gram_values(np.abs(exact(x.host, x.aval.dtype).astype(np.float64)))


GRAM = Op("gram", 1, lambda tnp, x: tnp.matmul(x, x if x.ndim == 1 else tnp.swapaxes(x, -1, -2)), _gram_aval,
          _gram_reference, "tnp.matmul({0}, tnp.swapaxes({0}, -1, -2))", tolerance=8, scale=_gram_scale)

OPS: dict[str, Op] = {op.name: op for op in BINARY + UNARY + REDUCTIONS + MOVEMENT + JOINS +
                      [WHERE, CLIP, INTEGER_POW, ASTYPE, GRAM]}
