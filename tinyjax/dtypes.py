"""Dtypes and JAX's type promotion, weak types included.

A dtype is a numpy dtype object (`np.dtype('float32')`); bfloat16 and the float8 types come from ml_dtypes.
The module-level names (`float32`, `bfloat16`, ...) are the numpy/ml_dtypes scalar types, as in `jax.dtypes`;
`dtype(x)` turns any of them (or a string, a Python type, a value with `.dtype`) into an `np.dtype`.

Promotion follows JAX's lattice (jax._src.dtypes), not numpy's:

    bool -> int* -> u8 -> u16 -> u32 -> u64 -> float*        int* -> i8 -> i16 -> i32 -> i64 -> float*
    u8 -> i16,  u16 -> i32,  u32 -> i64 (x64 off: u32 -> i32)
    float* -> f16 -> f32 -> f64,  float* -> bf16 -> f32,  float* -> each float8 type (a dead end)

`int*` and `float*` are the weak types of Python scalars: they sit below every integer/float dtype, so
`u8 + 1 -> u8` and `bf16 + 1.0 -> bf16`. The result of two dtypes is their least upper bound.
Without x64 every result is canonicalised to 32 bits (int64 -> int32, uint64 -> uint32, float64 -> float32).
"""
from __future__ import annotations

import functools
import warnings
from typing import Any

import ml_dtypes
import numpy as np

from tinyjax.config import config
from tinyjax.helpers import user_stacklevel

# Scalar types, as `jax.dtypes` / `jax.numpy` expose them (np.dtype(float32) == float32 holds).
bool_ = np.bool_
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float16, float32, float64 = np.float16, np.float32, np.float64
complex64, complex128 = np.complex64, np.complex128
bfloat16 = ml_dtypes.bfloat16
float8_e4m3fn, float8_e5m2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
float8_e4m3fnuz, float8_e5m2fnuz = ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz
float8_e4m3b11fnuz = ml_dtypes.float8_e4m3b11fnuz
float8_e4m3, float8_e3m4 = ml_dtypes.float8_e4m3, ml_dtypes.float8_e3m4
FLOAT8_NAMES = ("float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                "float8_e5m2fnuz")

SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(scalar_type) for scalar_type in (
  bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64,
  float16, bfloat16, float32, float64, *(ml_dtypes.__dict__[name] for name in FLOAT8_NAMES), complex64, complex128))
_SUPPORTED_SET = frozenset(SUPPORTED_DTYPES)
FLOAT8_DTYPES = tuple(np.dtype(ml_dtypes.__dict__[name]) for name in FLOAT8_NAMES)
_FLOAT8 = frozenset(FLOAT8_DTYPES)
# Floating dtypes numpy does not know as floating (their kind is 'V').
_CUSTOM_FLOATS = frozenset({np.dtype(bfloat16), *_FLOAT8})
_FLOATING = frozenset({np.dtype(float16), np.dtype(float32), np.dtype(float64), *_CUSTOM_FLOATS})

_TO_32BIT = {np.dtype(int64): np.dtype(int32), np.dtype(uint64): np.dtype(uint32),
             np.dtype(float64): np.dtype(float32), np.dtype(complex128): np.dtype(complex64)}


class TypePromotionError(ValueError):
  """Raised when two dtypes have no implicit promotion (float8 with another float), as `jax.dtypes`."""


def _unsupported(dt: Any) -> TypeError:
  names = ", ".join(supported.name for supported in SUPPORTED_DTYPES)
  return TypeError(f"tinyjax does not support dtype {dt}; supported dtypes are {names}")


# ---------------------------------------------------------------- defaults and canonicalisation

def default_int_dtype() -> np.dtype:
  """int32, or int64 when jax_enable_x64 is on."""
  return np.dtype(int64) if config.jax_enable_x64 else np.dtype(int32)


def default_uint_dtype() -> np.dtype:
  """uint32, or uint64 when jax_enable_x64 is on."""
  return np.dtype(uint64) if config.jax_enable_x64 else np.dtype(uint32)


def default_float_dtype() -> np.dtype:
  """float32, or float64 when jax_enable_x64 is on."""
  return np.dtype(float64) if config.jax_enable_x64 else np.dtype(float32)


def default_complex_dtype() -> np.dtype:
  """complex64, or complex128 when jax_enable_x64 is on."""
  return np.dtype(complex128) if config.jax_enable_x64 else np.dtype(complex64)


def canonicalize_dtype(dt: Any) -> np.dtype:
  """The dtype an array of dtype `dt` really gets: 64-bit types become 32-bit ones unless x64 is on."""
  normal = dtype(dt)
  return normal if config.jax_enable_x64 else _TO_32BIT.get(normal, normal)


def _default_for_kind(dt: np.dtype) -> np.dtype:
  if dt in _CUSTOM_FLOATS or dt.kind == "f":
    return default_float_dtype()
  if dt.kind == "c":
    return default_complex_dtype()
  return {"b": np.dtype(bool_), "i": default_int_dtype(), "u": default_uint_dtype()}[dt.kind]


# ---------------------------------------------------------------- normalising anything to np.dtype

def python_scalar_dtype(x: Any) -> np.dtype:
  """Dtype of a Python scalar (or scalar type) under the current x64 setting: bool, int32/64, float32/64,
  complex64/128."""
  typ = x if isinstance(x, type) else type(x)
  if typ is bool:
    return np.dtype(bool_)
  if typ is int:
    return default_int_dtype()
  if typ is float:
    return default_float_dtype()
  if typ is complex:
    return default_complex_dtype()
  raise TypeError(f"{x!r} is not a Python scalar (bool, int, float or complex)")


_PYTHON_SCALAR_TYPES = (bool, int, float, complex)


def _is_python_scalar(x: Any) -> bool:
  return type(x) in _PYTHON_SCALAR_TYPES


def _is_python_scalar_type(x: Any) -> bool:
  return type(x) is type and x in _PYTHON_SCALAR_TYPES  # (a type: `in` compares an array elementwise)


def dtype(x: Any) -> np.dtype:
  """Normalises a dtype-like to a supported `np.dtype`.

  Accepts np.dtype, strings ('float32', 'bfloat16'), numpy/ml_dtypes scalar types, Python types and scalars
  (bool, int -> default int dtype, float -> default float dtype, complex -> default complex dtype) and anything
  with a `.dtype` (arrays). 64-bit dtypes are returned as they are (see `canonicalize_dtype`). Raises TypeError for
  dtypes tinyjax does not support (complex256, object, strings, datetimes, ...).
  """
  if isinstance(x, np.dtype) and x in _SUPPORTED_SET: return x  # (the common case first)
  if x is None:
    raise ValueError("Invalid argument to dtype: None.")
  if _is_python_scalar_type(x) or _is_python_scalar(x):
    return python_scalar_dtype(x)
  if isinstance(x, np.dtype):
    normal = x
  elif isinstance(x, (str, type)):
    try:
      normal = np.dtype(x)
    except TypeError as err:
      raise TypeError(f"Cannot interpret {x!r} as a dtype") from err
  elif getattr(x, "dtype", None) is not None:
    return dtype(x.dtype)
  else:
    try:
      normal = np.result_type(x)
    except TypeError as err:
      raise TypeError(f"Cannot determine dtype of {x!r}") from err
  if normal not in _SUPPORTED_SET:
    raise _unsupported(normal)
  return normal


def check_user_dtype_supported(dt: Any, fun_name: str | None = None) -> np.dtype:
  """Validates a dtype a user asked for (`dtype=` arguments) and returns the dtype arrays will really have.

  Python types map to the default dtypes without a warning. An unsupported dtype is a TypeError. A 64-bit
  dtype while jax_enable_x64 is off gives a UserWarning (as JAX) and the 32-bit dtype.
  """
  if _is_python_scalar_type(dt):
    return python_scalar_dtype(dt)
  requested = dtype(dt)
  canonical = canonicalize_dtype(requested)
  if canonical != requested:
    where = f" requested in {fun_name}" if fun_name else ""
    warnings.warn(
      f"Explicitly requested dtype {requested.name}{where} is not available, and will be truncated to dtype "
      f"{canonical.name}. To enable more dtypes, set the jax_enable_x64 configuration option or the "
      "JAX_ENABLE_X64 shell environment variable.", UserWarning, stacklevel=user_stacklevel())
  return canonical


# ---------------------------------------------------------------- kinds

_ABSTRACT_FLOAT_PARENTS = (np.floating, np.inexact, np.number, np.generic)


def issubdtype(arg1: Any, arg2: Any) -> bool:
  """`np.issubdtype` that also knows bfloat16 and float8 are floating (numpy sees them as void)."""
  if isinstance(arg2, type) and issubclass(arg2, np.generic) and arg2 in (
      np.generic, np.number, np.inexact, np.floating, np.integer, np.signedinteger, np.unsignedinteger,
      np.bool_, np.complexfloating, np.flexible, np.character):
    first = np.dtype(arg1)
    if first in _CUSTOM_FLOATS:
      return arg2 in _ABSTRACT_FLOAT_PARENTS
    return bool(np.issubdtype(first, arg2))
  return np.dtype(arg1) == np.dtype(arg2)


def is_floating(dt: Any) -> bool:
  """True for float16, bfloat16, float32, float64 and the float8 types."""
  if isinstance(dt, np.dtype) and dt in _SUPPORTED_SET: return dt in _FLOATING  # (np.issubdtype costs ~1 us)
  return issubdtype(dt, np.floating)


def is_float8(dt: Any) -> bool:
  """True for the 8-bit float types (float8_e4m3fn, float8_e5m2, ...)."""
  return np.dtype(dt) in _FLOAT8


def is_complex(dt: Any) -> bool:
  """True for complex64 and complex128."""
  if isinstance(dt, np.dtype) and dt in _SUPPORTED_SET: return dt.kind == "c"
  return issubdtype(dt, np.complexfloating)


def is_inexact(dt: Any) -> bool:
  """True for the floating and complex dtypes."""
  return is_floating(dt) or is_complex(dt)


def is_integer(dt: Any) -> bool:
  """True for signed and unsigned integer dtypes (not bool)."""
  return issubdtype(dt, np.integer)


def is_unsigned(dt: Any) -> bool:
  """True for uint8/16/32/64."""
  return issubdtype(dt, np.unsignedinteger)


def is_bool(dt: Any) -> bool:
  """True for bool."""
  return issubdtype(dt, np.bool_)


def real_dtype(dt: Any) -> np.dtype:
  """The dtype of a complex dtype's parts (float32 for complex64, float64 for complex128); any other dtype itself."""
  normal = np.dtype(dt)
  if normal.kind != "c": return normal
  return np.dtype(float32) if normal == np.dtype(complex64) else np.dtype(float64)


def complex_dtype(dt: Any) -> np.dtype:
  """The complex dtype with parts of `dt`: complex128 for float64, complex64 for the other real dtypes (narrower
  floats, integers, bool), a complex dtype itself (not canonicalised for the x64 setting)."""
  normal = np.dtype(dt)
  if normal.kind == "c": return normal
  return np.dtype(complex128) if normal == np.dtype(float64) else np.dtype(complex64)


def finfo(dt: Any) -> ml_dtypes.finfo:
  """Machine limits of a floating dtype (bfloat16 and float8 included; a complex dtype's are its parts'): eps, max,
  min, tiny, bits, ..."""
  return ml_dtypes.finfo(real_dtype(dtype(dt)))


def iinfo(dt: Any) -> ml_dtypes.iinfo:
  """Machine limits of an integer dtype: min, max, bits."""
  return ml_dtypes.iinfo(dtype(dt))


# ---------------------------------------------------------------- the promotion lattice

# Nodes are dtype names, plus the weak nodes of Python int, float and complex.
_WEAK_INT, _WEAK_FLOAT, _WEAK_COMPLEX = "int*", "float*", "complex*"


def _lattice(x64: bool) -> dict[str, list[str]]:
  """Each node and the nodes immediately above it (jax._src.dtypes._type_promotion_lattice)."""
  return {
    "bool": [_WEAK_INT],
    _WEAK_INT: ["uint8", "int8"],
    "uint8": ["int16", "uint16"],
    "uint16": ["int32", "uint32"],
    # Without x64, JAX avoids forming a 64-bit type from 32-bit inputs: u32 + i32 -> i32.
    "uint32": ["int64", "uint64"] if x64 else ["int32", "uint64"],
    "uint64": [_WEAK_FLOAT],
    "int8": ["int16"],
    "int16": ["int32"],
    "int32": ["int64"],
    "int64": [_WEAK_FLOAT],
    _WEAK_FLOAT: [*FLOAT8_NAMES, "bfloat16", "float16", _WEAK_COMPLEX],
    **{name: [] for name in FLOAT8_NAMES},  # a float8 type promotes with nothing but weak types and itself.
    "bfloat16": ["float32"],
    "float16": ["float32"],
    "float32": ["float64", "complex64"],
    "float64": ["complex128"],
    _WEAK_COMPLEX: ["complex64"],
    "complex64": ["complex128"],
    "complex128": [],
  }


@functools.cache
def _upper_bounds(x64: bool) -> dict[str, frozenset[str]]:
  lattice = _lattice(x64)
  bounds = {}
  for node in lattice:
    reached, frontier = {node}, [node]
    while frontier:
      for above in lattice[frontier.pop()]:
        if above not in reached:
          reached.add(above)
          frontier.append(above)
    bounds[node] = frozenset(reached)
  return bounds


@functools.cache
def _least_upper_bound(x64: bool, nodes: frozenset[str]) -> str:
  bounds = _upper_bounds(x64)
  common = frozenset.intersection(*(bounds[node] for node in nodes))
  least = [candidate for candidate in common if common <= bounds[candidate]]
  if len(least) == 1:
    return least[0]
  assert not least, f"promotion lattice is ill-formed at {sorted(nodes)}"
  names = tuple(sorted(node for node in nodes))
  if any(node in FLOAT8_NAMES for node in nodes):
    raise TypePromotionError(
      f"Input dtypes {names} have no available implicit dtype promotion path. To avoid unintended "
      "promotion, 8-bit floats do not support implicit promotion. If you'd like your inputs to be promoted "
      "to another type, you can do so explicitly using e.g. x.astype('float32')")
  raise TypePromotionError(f"Input dtypes {names} have no available implicit dtype promotion path. "
                           "Try explicitly casting inputs to the desired output type.")


_NODE_DTYPES = {supported.name: supported for supported in SUPPORTED_DTYPES}
_NODE_DTYPES.update({_WEAK_INT: np.dtype(int64), _WEAK_FLOAT: np.dtype(float64), _WEAK_COMPLEX: np.dtype(complex128)})


def _node_dtype(node: str) -> np.dtype:
  return _NODE_DTYPES[node]


def _promotion_node(x: Any) -> str:
  if x is int:
    return _WEAK_INT
  if x is float:
    return _WEAK_FLOAT
  if x is complex:
    return _WEAK_COMPLEX
  if x is bool:
    return "bool"
  return dtype(x).name


def promote_types(a: Any, b: Any) -> np.dtype:
  """The dtype a binary operation casts `a` and `b` to, on JAX's lattice (`jnp.promote_types`).

  The result is not canonicalised: `promote_types('int64', 'int32')` is int64 even without x64 (use
  `result_type` for what an operation produces). Python `int`/`float` are weak: `promote_types('uint8', int)`
  is uint8. Raises TypePromotionError (a ValueError) for float8 with another float.
  """
  return _node_dtype(_least_upper_bound(config.jax_enable_x64, frozenset((_promotion_node(a), _promotion_node(b)))))


# ---------------------------------------------------------------- weak types and result_type

def is_weakly_typed(x: Any) -> bool:
  """True for Python int and float (not bool) and for arrays whose `.weak_type` is True."""
  if _is_python_scalar(x) and type(x) is not bool:
    return True
  return bool(getattr(x, "weak_type", False))


def dtype_and_weak_type(x: Any) -> tuple[np.dtype, bool]:
  """(canonical dtype, weak_type) of one `result_type` argument; see `result_type`."""
  if x is None:
    return default_float_dtype(), False
  if _is_python_scalar_type(x):
    return python_scalar_dtype(x), x is not bool  # the types int and float are weak, as their values
  if _is_python_scalar(x):
    return python_scalar_dtype(x), is_weakly_typed(x)
  if isinstance(x, (str, np.dtype, type)):
    # An explicitly named dtype: a 64-bit one without x64 warns, as in JAX.
    return check_user_dtype_supported(x, "dtype"), False
  return canonicalize_dtype(x), is_weakly_typed(x)


def _weak_node(dt: np.dtype) -> str:
  if dt.kind == "b":
    return "bool"
  if dt.kind in "iu":
    return _WEAK_INT
  if dt.kind == "c":
    return _WEAK_COMPLEX
  return _WEAK_FLOAT


def result_type(*args: Any, return_weak_type_flag: bool = False) -> np.dtype | tuple[np.dtype, bool]:
  """The dtype of an operation on `args` under JAX's promotion rules, canonicalised for the x64 setting.

  `args` may be dtypes (np.dtype, str, scalar types), numpy arrays and scalars, Python bool/int/float (and the
  types bool/int/float), None (the default float dtype) and anything with `.dtype` and an optional
  `.weak_type` (tinyjax Arrays). Python int/float and weak arrays are weakly typed: they don't widen a
  strongly typed operand (`f32 + 1.0 -> f32`, `u8 + 1 -> u8`, `i32 + 1.5 -> f32`). A weakly typed result
  gets the default dtype of its kind. With `return_weak_type_flag=True` returns `(dtype, weak_type)`.
  Inputs are canonicalised first; an explicitly named 64-bit dtype (str, np.dtype, scalar type) warns without
  x64, as in JAX, while arrays and Python scalars don't.
  Python complex and unsupported dtypes are TypeError; float8 with another float is TypePromotionError.
  """
  if not args:
    raise ValueError("at least one array or dtype is required")
  key = _result_type_key(args)
  if key is not None and (cached := _result_type_cache.get(key)) is not None:
    return cached if return_weak_type_flag else cached[0]
  result = _result_type(args)
  if key is not None and len(_result_type_cache) < _RESULT_TYPE_CACHE_LIMIT: _result_type_cache[key] = result
  return result if return_weak_type_flag else result[0]


# result_type is on every eager operation's path: remember answers for arrays (dtype, weak_type) and Python scalars
_result_type_cache: dict[tuple, tuple[np.dtype, bool]] = {}
_RESULT_TYPE_CACHE_LIMIT = 4096


def _result_type_key(args: tuple) -> tuple | None:
  """A cache key for `result_type(*args)`, or None when an argument is not an array or Python scalar (dtypes named
  explicitly may warn, so they always take the full path)."""
  key: list[Any] = [config.jax_enable_x64]
  for arg in args:
    if type(arg) in (bool, int, float, complex): key.append(type(arg))
    elif isinstance(getattr(arg, "dtype", None), np.dtype) and not isinstance(arg, (np.ndarray, np.generic)):
      key.append((arg.dtype, bool(getattr(arg, "weak_type", False))))
    else: return None
  return tuple(key)


def _result_type(args: tuple) -> tuple[np.dtype, bool]:
  dtypes, weak_types = zip(*(dtype_and_weak_type(arg) for arg in args))
  if len(dtypes) == 1:
    out_dtype, out_weak = dtypes[0], weak_types[0]
  elif len(set(dtypes)) == 1 and not all(weak_types):
    out_dtype, out_weak = dtypes[0], False
  else:
    x64 = config.jax_enable_x64
    if all(weak_types):
      # All weak: promote the strong dtypes and mark the result weak (avoids odd weak widths).
      node = _least_upper_bound(x64, frozenset(dt.name for dt in dtypes))
      out_weak = True
    else:
      nodes = frozenset(_weak_node(dt) if weak else dt.name for dt, weak in zip(dtypes, weak_types))
      node = _least_upper_bound(x64, nodes)
      out_weak = node in (_WEAK_INT, _WEAK_FLOAT, _WEAK_COMPLEX)
    out_dtype = canonicalize_dtype(_node_dtype(node))
  out_weak = out_weak and out_dtype != np.dtype(bool_)
  if out_weak:
    out_dtype = _default_for_kind(out_dtype)
  return out_dtype, out_weak


# ---------------------------------------------------------------- reductions

_TO_INEXACT = {np.dtype(name): np.dtype(float32) for name in (
  "bool", "int8", "int16", "int32", "uint8", "uint16", "uint32")}
_TO_INEXACT.update({np.dtype(int64): np.dtype(float64), np.dtype(uint64): np.dtype(float64)})


def to_inexact_dtype(dt: Any) -> np.dtype:
  """The float dtype a function like `sin` or `/` gives for `dt`: bool and ints up to 32 bits -> float32,
  64-bit ints -> float64 (float32 without x64); floats unchanged."""
  normal = dtype(dt)
  return canonicalize_dtype(_TO_INEXACT.get(normal, normal))


def sum_dtype(dt: Any) -> np.dtype:
  """Result dtype of `sum`/`prod` of an array of dtype `dt` (no `dtype=` given), as `jnp.sum`.

  bool and narrower signed ints -> default int (int32, int64 under x64); narrower unsigned ints -> default
  uint; everything else (floats included) keeps its dtype. See `accumulation_dtype` for the compute dtype.
  """
  normal = canonicalize_dtype(dt)
  if normal.kind == "b":
    return default_int_dtype()
  if normal.kind == "u" and normal.itemsize < default_uint_dtype().itemsize:
    return default_uint_dtype()
  if normal.kind == "i" and normal.itemsize < default_int_dtype().itemsize:
    return default_int_dtype()
  return normal


def mean_dtype(dt: Any) -> np.dtype:
  """Result dtype of `mean`/`var`/`std` of an array of dtype `dt`, as `jnp.mean`: `to_inexact_dtype(dt)`.

  Note int32 -> float32 even under x64 (only 64-bit ints give float64), as in JAX.
  """
  return to_inexact_dtype(canonicalize_dtype(dt))


def accumulation_dtype(dt: Any) -> np.dtype:
  """The dtype a float reduction computes in: float16 and bfloat16 accumulate in float32; others in themselves.

  (JAX does not upcast float8 sums, XLA accumulates them in float8; tinyjax's lowering sums float8 in float32 and
  rounds once, lower/float8.py.)
  """
  normal = dtype(dt)
  return np.dtype(float32) if normal in (np.dtype(float16), np.dtype(bfloat16)) else normal
