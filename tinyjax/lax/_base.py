"""Plumbing shared by tinyjax.lax and tinyjax.numpy: host data to Arrays, scalar constants, broadcasting, casts.

Everything here builds graphs through `bind` only; the one place that looks at host values is `host_to_array`
(what `asarray` does with numpy arrays, Python scalars and lists).
"""
from __future__ import annotations

import functools
import inspect
import itertools
import math
import threading
from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.config import config
from tinyjax.trace.core import EvalTrace, Primitive, bind, current_trace, debug_nans, eager_array, trace_impl
from tinyjax.uop import Ops

PYTHON_SCALARS = (bool, int, float, complex)
BOOL = np.dtype(np.bool_)
FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)
# floats whose compositions (transcendental functions, sums, products) run in float32 and round once
LOW_PRECISION_FLOATS = (np.dtype(np.float16), np.dtype(dtypes.bfloat16), *dtypes.FLOAT8_DTYPES)


def is_array(x: Any) -> bool:
  """True for tinyjax arrays (and, later, the tracers that stand in for them)."""
  return isinstance(x, Array)


def is_python_scalar(x: Any) -> bool:
  """True for Python bool, int, float and complex values (numpy scalars are not Python scalars)."""
  return type(x) in PYTHON_SCALARS


def canonicalize_axis(axis: int, ndim: int) -> int:
  """`axis` in [-ndim, ndim) as a non-negative axis; ValueError (numpy's AxisError message) otherwise."""
  axis = int(axis)
  if not -ndim <= axis < ndim:
    raise ValueError(f"axis {axis} is out of bounds for array of dimension {ndim}")
  return axis % ndim if ndim else axis


def canonicalize_axes(axis: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
  """A tuple of distinct non-negative axes; None means all axes."""
  if axis is None: return tuple(range(ndim))
  axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
  normal = tuple(canonicalize_axis(a, ndim) for a in axes)
  if len(set(normal)) != len(normal): raise ValueError(f"repeated axis in {axis}")
  return normal


# ---------------------------------------------------------------------------------------------------------- host data

def check_int_range(value: int, dtype: np.dtype) -> None:
  low, high = _int_range(dtype)
  if not low <= value <= high:
    raise OverflowError(f"Python int {value} too large to convert to {dtype.name}")


@functools.cache
def _int_range(dtype: np.dtype) -> tuple[int, int]:
  """An integer dtype's (min, max) as Python ints (np.iinfo costs ~1 us: every eager op with a Python int asks)."""
  info = np.iinfo(dtype)
  return int(info.min), int(info.max)


def scalar_value(value: Any, dtype: np.dtype) -> bool | int | float | complex:
  """`value` converted to `dtype` as JAX's convert_element_type does, as a Python value for a CONST node: floats
  round once; a float becomes an int as XLA converts (truncated, NaN is 0, out of range saturates); an int wraps
  into a narrower int dtype (`full(2, 300, int8)` is 44)."""
  if dtype == BOOL: return bool(value)
  if dtype.kind == "c": return complex(np.asarray(value).astype(dtype).item())
  if isinstance(value, complex): value = value.real  # (a complex value converted to a real dtype: its real part)
  if dtype.kind in "iu":
    info = np.iinfo(dtype)
    if isinstance(value, float):
      if math.isnan(value): return 0
      return int(min(max(value, info.min), info.max))  # int() truncates toward zero; the clamp saturates +-inf too
    bits = 8 * dtype.itemsize
    wrapped = int(value) & ((1 << bits) - 1)
    return wrapped - (1 << bits) if info.min < 0 and wrapped > info.max else wrapped
  with np.errstate(over="ignore"):  # out of range for a narrow float: inf, as JAX, without numpy's warning
    return float(np.asarray(value, dtype=np.float64).astype(dtype).astype(np.float64))


def _leaves(value: Any) -> list[Any]:
  if isinstance(value, (list, tuple)): return [leaf for item in value for leaf in _leaves(item)]
  return [value]


def host_to_array(value: Any, dtype: Any = None, weak_type: bool | None = None) -> Array:
  """A realised Array holding host data (numpy array or scalar, Python scalar, nested lists/tuples of those).

  Without `dtype`: Python scalars get the default dtypes and are weakly typed; numpy data keeps its dtype,
  canonicalised (float64 -> float32 unless x64, silently, as JAX); lists take the JAX result type of their leaves.
  With `dtype`: the values are converted to it (a 64-bit request without x64 warns and gives the 32-bit type).
  Unsupported dtypes (object, strings) raise TypeError.
  """
  target = None if dtype is None else dtypes.check_user_dtype_supported(dtype, "asarray")
  if is_python_scalar(value):
    if weak_type is None: weak_type = target is None and type(value) is not bool
    out_dtype = target if target is not None else dtypes.python_scalar_dtype(value)
    if out_dtype.kind in "iu" and isinstance(value, int) and target is None: check_int_range(value, out_dtype)
    return Array.from_numpy(np.asarray(value, dtype=out_dtype), bool(weak_type))  # OverflowError as numpy's
  if isinstance(value, (list, tuple)):
    leaves = _leaves(value)
    if target is None:
      target = dtypes.result_type(*leaves) if leaves else dtypes.default_float_dtype()
    host = np.asarray(value, dtype=target)  # a Python int out of the dtype's range is an OverflowError, as JAX
  else:
    if not isinstance(value, (np.ndarray, np.generic)):
      raise TypeError(f"cannot convert {type(value).__name__} to a tinyjax Array")
    host = value
    dtypes.dtype(host.dtype)  # TypeError for object, strings, ...
    if target is None: target = dtypes.canonicalize_dtype(host.dtype)
  if host.dtype.kind in "OUSVc" and host.dtype not in dtypes.SUPPORTED_DTYPES:
    raise TypeError(f"tinyjax does not support dtype {host.dtype}")
  return Array.from_numpy(np.asarray(host).astype(target), bool(weak_type))


def python_scalar(x: bool | int | float, dtype: np.dtype, weak_type: bool) -> Array:
  """A Python scalar operand as a 0-d array of `dtype`, as JAX converts it: a Python int must fit the default int
  dtype (OverflowError otherwise), and then wraps into a narrower integer dtype (`uint8_array + 300` adds 44)."""
  if type(x) is int: check_int_range(x, dtypes.default_int_dtype())
  return full((), x, dtype, weak_type)


def to_array(x: Any) -> Array:
  """An Array for an operand: Arrays as they are, Python scalars weakly typed, numpy data strongly typed.

  Lists and other objects are a TypeError (as JAX: convert with `asarray` first)."""
  if is_array(x): return x
  if is_python_scalar(x): return python_scalar(x, dtypes.python_scalar_dtype(x), type(x) is not bool)
  if isinstance(x, (np.ndarray, np.generic)): return host_to_array(x)
  raise TypeError(f"expected an array or a scalar, got {type(x).__name__}: use tinyjax.numpy.asarray for lists")


# ---------------------------------------------------------------------------------------------------------- shapes

def reshape_raw(x: Array, shape: tuple[int, ...]) -> Array:
  """RESHAPE to `shape` (same size), skipped when the shape does not change."""
  if x.shape == shape: return x
  shape = tuple(int(d) for d in shape)
  return x if x.shape == shape else bind(Ops.RESHAPE, x, arg=shape, weak_type=x.weak_type)


def expand_raw(x: Array, shape: tuple[int, ...]) -> Array:
  """Broadcast `x` to `shape` by numpy's rules (leading axes added, size-1 axes stretched); no checks."""
  if x.shape == shape: return x
  shape = tuple(int(d) for d in shape)
  if x.shape == shape: return x
  x = reshape_raw(x, (1,) * (len(shape) - x.ndim) + x.shape)
  return x if x.shape == shape else bind(Ops.EXPAND, x, arg=shape, weak_type=x.weak_type)


def full(shape: Sequence[int], value: Any, dtype: Any, weak_type: bool = False) -> Array:
  """An array of `shape` filled with the Python scalar `value` (a CONST broadcast: no memory, fuses anywhere).
  Eagerly, the broadcast constant's node is looked up (`_EAGER_CONSTANTS`) instead of built op by op."""
  dtype = np.dtype(dtype)
  eager = type(current_trace.get()) is EvalTrace
  if eager:
    key = (tuple(shape), type(value), repr(value), dtype, weak_type)  # (repr: -0.0 is not 0.0, NaN is itself)
    if (node := _EAGER_CONSTANTS.get(key)) is not None: return eager_array(node, weak_type)
  const = bind(Ops.CONST, arg=scalar_value(value, dtype), dtype=dtype, weak_type=weak_type)
  result = expand_raw(const, tuple(shape))
  if eager:
    if len(_EAGER_CONSTANTS) >= _EAGER_CONSTANTS_MAX: _EAGER_CONSTANTS.clear()
    _EAGER_CONSTANTS[key] = result.uop
  return result


# eager broadcast constants by (shape, value, dtype, weak type): `x * 2.0` in a Python loop builds its 2.0 once
_EAGER_CONSTANTS: dict[tuple, Any] = {}
_EAGER_CONSTANTS_MAX = 4096


def staged(static_argnames: Sequence[str] = (), multiple_results: bool = False) -> Callable[[Callable], Callable]:
  """Decorate a library function (`jnp.take`, `jnp.clip`, `nn.one_hot`...) so that an eager call of it builds one
  PRIMITIVE node named after it, as JAX's jitted library functions make one dispatch: the call's signature (its
  arrays' avals and its static arguments) finds the result's aval from one abstract evaluation (`stage_call`), and
  the function's own Python runs only where a program reading the node is lowered (`jnp.take(x, i)` built 246 Python
  calls each time). Arrays and Python scalars are the operands (a scalar as a weakly typed 0-d constant, as jit
  takes it: a loop over its values runs one program); the `static_argnames`, None and strings are params (keyed by
  value). Anything else (lists and tuples other than of arrays, numpy data, tracers), a trace other than the eager
  one, or a call that does not stage (its abstract evaluation failed: it needs values, or raises) runs the function
  itself; so transformations and jaxprs see the function's body, and errors are what it raises.

  `multiple_results`: the function returns a flat sequence of arrays (a tuple, a list, a namedtuple such as
  `slogdet`'s) or, for some arguments, one array. The node then has one result per array, and the container is found
  once per call signature (`_containers`) by tracing the function on the arguments' avals."""
  static = frozenset(static_argnames)

  def decorate(fn: Callable) -> Callable:
    read: list = []  # (names by position, positional-only names, variadic: einsum's *operands, "*" in the layout)

    def parameters() -> tuple[list[str], list[str], bool]:
      """fn's parameters, read from its signature on the first call (at import, ~110 functions took ~4 ms)."""
      if not read:
        ps = list(inspect.signature(fn).parameters.values())
        read.append(([p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
                     [p.name for p in ps if p.kind is p.POSITIONAL_ONLY], any(p.kind is p.VAR_POSITIONAL for p in ps)))
      return read[0]

    def impl(*operands: Array, _layout: tuple, **params: Any) -> Any:
      names, positional_only, _ = parameters()
      arguments, k = params, 0
      for entry in _layout:  # a name: one operand; (name, n, kind): a list or tuple of n operands
        if type(entry) is str:
          arguments[entry], k = operands[k], k + 1
        else:
          name, n, kind = entry
          arguments[name], k = kind(operands[k:k + n]), k + n
      if "*" in arguments:  # (every parameter before the variadic one was passed by position)
        out = fn(*[arguments.pop(name) for name in names], *arguments.pop("*"), **arguments)
      else:
        out = fn(*[arguments.pop(name) for name in positional_only if name in arguments], **arguments)
      if not multiple_results: return out
      returned.container = None if isinstance(out, Array) else type(out)
      return [out] if returned.container is None else list(out)  # (a nested result fails the abstract evaluation)
    returned = threading.local()  # (the container of this thread's last result: `call` reads it after tracing)
    if fn.__name__ in _STAGED_NAMES:  # (a call is named by its function in the persistent caches' keys)
      raise ValueError(f"a staged function named {fn.__name__} exists already")
    _STAGED_NAMES.add(fn.__name__)
    prim = Primitive(fn.__name__, impl, multiple_results=multiple_results)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
      trace = current_trace.get()
      if type(trace) is not EvalTrace or debug_nans[0]: return fn(*args, **kwargs)
      operands, layout, params = [], [], {}
      names, _, variadic = parameters()
      if len(args) > len(names):
        extra = args[len(names):]
        if not variadic or not all(type(v) is Array for v in extra): return fn(*args, **kwargs)
        operands.extend(extra)
        layout.append(("*", len(extra), tuple))
      for name, value in itertools.chain(zip(names, args), kwargs.items()):
        kind = type(value)
        if kind is Array:
          operands.append(value)
          layout.append(name)
        elif name in static or value is None or kind is str: params[name] = value
        elif kind in PYTHON_SCALARS:
          if (operand := _scalar_operand(kind, value)) is None: return fn(*args, **kwargs)
          operands.append(operand)
          layout.append(name)
        elif (kind is list or kind is tuple) and value and all(type(v) is Array for v in value):
          operands.extend(value)
          layout.append((name, len(value), kind))
        else: return fn(*args, **kwargs)
      params["_layout"] = tuple(layout)
      staged_call = trace.stage_call(prim, tuple(operands), params)
      if staged_call is None: return fn(*args, **kwargs)
      if not multiple_results: return staged_call
      if not staged_call: return fn(*args, **kwargs)  # (no results: `meshgrid()`)
      signature = staged_call[0].uop.src[0].arg  # (the PROJECTs' call: one per signature, keyed by value)
      if (container := _containers.get(signature, False)) is False:
        trace_impl(trace, prim, operands, params)  # (traced, nothing computed: a host step is not run)
        if len(_containers) >= _CONTAINERS_MAX: _containers.clear()
        container = _containers[signature] = returned.container
      if container is None: return staged_call[0]
      return container._make(staged_call) if hasattr(container, "_make") else container(staged_call)
    call.staged_primitive = prim
    return call
  return decorate


def _scalar_operand(kind: type, value: Any) -> Array | None:
  """A staged call's Python scalar operand: its weakly typed 0-d Array, made once per value and x64 setting and
  kept (`jnp.clip(x, 1, 5)` made two each call, 3 of its 10 us); None where it doesn't convert (an int out of
  range)."""
  key = (kind, value if kind is int or kind is bool else repr(value), config.jax_enable_x64)  # (repr: -0.0, NaN)
  if (operand := _SCALAR_OPERANDS.get(key)) is None:
    try: operand = to_array(value)
    except (OverflowError, TypeError): return None
    if len(_SCALAR_OPERANDS) >= _EAGER_CONSTANTS_MAX: _SCALAR_OPERANDS.clear()
    _SCALAR_OPERANDS[key] = operand
  return operand


_SCALAR_OPERANDS: dict[tuple, Array] = {}
_STAGED_NAMES: set[str] = set()
# a multiple-result staged call's signature -> the type of sequence its function returns (None: one array)
_containers: dict[Any, type | None] = {}
_CONTAINERS_MAX = 4096


def like(x: Array, value: Any, dtype: Any = None) -> Array:
  """`value` filled to the shape of `x`, in x's dtype (or `dtype`) and weak type."""
  return full(x.shape, value, x.dtype if dtype is None else dtype, x.weak_type and dtype is None)


def cast(x: Array, dtype: Any, weak_type: bool | None = None) -> Array:
  """Convert values to `dtype` (numbers to bool are `!= 0`, NaN included); no node when nothing changes."""
  dtype = np.dtype(dtype)
  weak = x.weak_type if weak_type is None else weak_type
  if dtype == x.dtype:
    return x if weak == x.weak_type else bind(Ops.CAST, x, dtype=dtype, weak_type=weak)
  if dtype == BOOL: return bind(Ops.CMPNE, x, like(x, 0), dtype=BOOL)
  return bind(Ops.CAST, x, dtype=dtype, weak_type=weak)


def broadcast_shapes(name: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
  """numpy's broadcast of `shapes`. Same-rank mismatch: TypeError naming the shapes (as JAX); else ValueError."""
  first = shapes[0] if shapes else ()
  if type(first) is tuple and all(s == first for s in shapes): return first  # (the common case: one shape)
  ndim = max((len(s) for s in shapes), default=0)
  padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
  out = []
  for sizes in zip(*padded):
    non_one = {d for d in sizes if d != 1}
    if len(non_one) > 1:
      listed = ", ".join(str(tuple(s)) for s in shapes)
      if len({len(s) for s in shapes}) == 1:
        raise TypeError(f"{name} got incompatible shapes for broadcasting: {listed}.")
      raise ValueError(f"Incompatible shapes for broadcasting: shapes=[{listed}]")
    out.append(non_one.pop() if non_one else 1)
  return tuple(out)


def lax_operands(name: str, *operands: Any) -> list[Array]:
  """Operands of a lax elementwise op: equal shapes and dtypes required (no promotion, TypeError otherwise).

  Python scalars (and weakly typed arrays of shape ()) take the dtype and shape of the strongly typed operands,
  provided that fits without widening (`lax.add(f32, 1.0)` is fine, `lax.add(i32, 1.5)` is a TypeError)."""
  arrays = [to_array(x) for x in operands]
  strong = [a for a in arrays if not (a.weak_type and a.ndim == 0)] or [arrays[0]]
  dtype = strong[0].dtype
  for a in strong:
    if a.dtype != dtype:
      got = ", ".join(a.dtype.name for a in arrays)
      raise TypeError(f"lax.{name} requires arguments to have the same dtypes, got {got}.")
  shape = strong[0].shape
  for a in strong:
    if a.shape != shape:
      got = ", ".join(str(a.shape) for a in arrays)
      raise TypeError(f"{name} got incompatible shapes for broadcasting: {got}.")
  out = []
  for a in arrays:
    if a.dtype != dtype:
      if dtypes.result_type(dtype, a) != dtype:
        raise TypeError(f"lax.{name} requires arguments to have the same dtypes, got {dtype.name} and a weakly typed "
                        f"{a.dtype.name} that does not fit in it.")
      a = cast(a, dtype)
    out.append(expand_raw(a, shape))
  return out
