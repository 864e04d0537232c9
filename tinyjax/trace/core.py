"""The trace machinery: every operation on arrays goes through `bind`, which hands it to the current trace.

The design is Autodidax part 2 / JAX's "stackless" core: the current trace lives in a context variable and each
trace knows its parent. A transformation runs the user's function with its own trace current; its `process` rule
computes with the parent trace current, so nested transformations compose in any order.

- `EvalTrace` (the bottom): builds a lazy UOp over concrete arrays; nothing runs until a value is needed.
- `StagingTrace` (jit, make_jaxpr): values are `StagingTracer`s over PARAM leaves that can never be made concrete.
- `JVPTrace` and the linearize/transpose machinery live in trace/ad.py, `BatchTrace` in trace/batching.py.

Two kinds of operations are bound: UOp `Ops` (the small primitive set lower/ understands) and `Primitive`s,
named operations of tinyjax.lax (e.g. `abs`, `exp`) whose `impl` is a composition of Ops. A trace with a rule for
a Primitive uses it (that is how `grad(abs)(0.) == 1` and `exp`'s derivative stay what JAX gives); any other trace
just runs the impl, which binds Ops into the same trace.
"""
from __future__ import annotations

import weakref

import contextlib
import contextvars
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.config import config
from tinyjax.array import Array
from tinyjax.trace.sharding_types import _enabled as _sharding_enabled
from tinyjax.trace.sharding_types import named_of, sizes_str, type_sharding
from tinyjax.trace.sharding_types import propagate as propagate_sharding
from tinyjax.trace.sharding_types import propagate_primitive as propagate_primitive_sharding
from tinyjax.uop import BOOL, ELEMENTWISE, Ops, UOp, arg_key, shape_of, toposort_of


class ConcretizationTypeError(TypeError):
  """A traced value was used where Python needs a concrete one (`bool`, `float`, `int`, `item`, `np.asarray`)."""


class TracerBoolConversionError(ConcretizationTypeError):
  """`bool()` of a traced value (Python control flow on it), as JAX's."""


class TracerIntegerConversionError(ConcretizationTypeError):
  """`int()` or `__index__` of a traced value (a traced size or index), as JAX's."""


class TracerArrayConversionError(ConcretizationTypeError):
  """`np.asarray()` of a traced value, as JAX's."""


def _as(error: type, concrete: Callable[[], Any]) -> Any:
  """`concrete()`, its ConcretizationTypeError raised as the more specific `error` (the same message)."""
  try: return concrete()
  except ConcretizationTypeError as failure:
    if type(failure) is not ConcretizationTypeError: raise
    raise error(str(failure)) from None


class UnexpectedTracerError(TypeError):
  """A traced value was used after the transformation that made it had finished (it escaped, e.g. to a global)."""


def check_callable(fun: Any) -> None:
  """The TypeError JAX's transformations raise for something that is not a function (`grad(3)`)."""
  if not callable(fun): raise TypeError(f"Expected a callable value, got {fun!r}")


class Primitive:
  """A named operation whose default meaning is `impl` (a function of arrays built from `bind`s of Ops). Traces
  may have rules of their own for it, keyed by the Primitive object (e.g. `ad.jvp_rules[prim]`). A primitive with
  `multiple_results` returns a list of arrays (the control-flow primitives)."""

  def __init__(self, name: str, impl: Callable[..., Any], multiple_results: bool = False, fixed: bool = True):
    # fixed: the impl is tinyjax's own code (a user function's, as custom_jvp's, is not): a call of a primitive that
    # is not fixed is named in the persistent caches by what its impl computes, not by the primitive's name
    self.name, self.impl, self.multiple_results, self.fixed = name, impl, multiple_results, fixed

  def __repr__(self) -> str: return self.name

  def bind(self, *operands: Any, **params: Any) -> Any:
    out = current_trace.get().process_primitive(self, operands, params)
    if _sharding_enabled[0]: propagate_primitive_sharding(operands, out)
    return out


class Trace:
  """A way of interpreting operations. `parent` is the trace below this one."""
  parent: Trace | None = None
  active: bool = True

  def process(self, op: Ops, operands: tuple[Any, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Any:
    raise NotImplementedError

  def process_primitive(self, prim: Primitive, operands: tuple[Any, ...], params: dict) -> Any:
    return prim.impl(*operands, **params)


class Tracer(Array):
  """An abstract value of a trace: shape, dtype and weak type are known; whether values are depends on the trace
  (`concrete()`). Subclasses say how they map to their trace's values."""
  __slots__ = ("trace",)

  def check_alive(self) -> None:
    if not self.trace.active:
      raise UnexpectedTracerError(
        f"Encountered an unexpected tracer: a value traced by `{getattr(self.trace, 'fun_name', 'a transformation')}`"
        f" ({self.aval_str()}) was used after that transformation finished. It escaped, for example through a global "
        "variable or a closure that outlived the call. Return it as an output of the transformed function instead.")

  def aval_str(self) -> str: return f"{self.dtype.name}{list(self.shape)}"

  def concrete(self, what: str) -> Array:
    """The concrete array this tracer stands for, or a ConcretizationTypeError saying why there is none."""
    raise NotImplementedError

  def realize(self) -> Array: return self.concrete("the values").realize()
  def block_until_ready(self) -> Array: return self.realize()
  def _value(self) -> np.ndarray: return self.concrete("the values")._value()
  def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    return _as(TracerArrayConversionError, lambda: self.concrete("np.asarray()")).__array__(dtype, copy)
  def __bool__(self) -> bool: return bool(_as(TracerBoolConversionError, lambda: self.concrete("bool()")))
  def __float__(self) -> float: return float(self.concrete("float()"))
  def __int__(self) -> int: return int(_as(TracerIntegerConversionError, lambda: self.concrete("int()")))
  def __complex__(self) -> complex: return complex(self.concrete("complex()"))
  def __index__(self) -> int:
    return _as(TracerIntegerConversionError, lambda: self.concrete("use as an index (__index__)")).__index__()
  def item(self, *args) -> Any: return self.concrete("item()").item(*args)
  def tolist(self) -> Any: return self.concrete("tolist()").tolist()
  def __repr__(self) -> str:  # as JAX 0.10's: JitTracer(~float32[]) for a weakly typed float32 scalar under jit
    return f"{self.kind_name()}({'~' if self.weak_type else ''}{self.dtype.name}[{','.join(map(str, self.shape))}])"

  def kind_name(self) -> str:
    """The tracer's name in its repr: its class's (JitTracer for a StagingTracer, as JAX names it)."""
    return type(self).__name__
  def __str__(self) -> str: return self.__repr__()
  def __format__(self, spec: str) -> str: return format(str(self), spec)  # ("{}".format(tracer), as JAX's)
  def __reduce__(self): return (Array.from_numpy, (self.concrete("pickling")._value(), self.weak_type))


# jax_debug_nans: check each eager operation's result for NaN (set by the config option; see `check_nans`)
debug_nans = [False]
# operations whose results are checked: those that compute values (movement and constants only move them)
_CHECKED = ELEMENTWISE | {Ops.REDUCE_AXIS}


def _jax_name(op: Ops, arg: Any) -> str:
  """The name JAX gives the operation an Op performs (for error messages)."""
  if op is Ops.REDUCE_AXIS: return {Ops.ADD: "reduce_sum", Ops.MAX: "reduce_max", Ops.MUL: "reduce_prod"}[arg[0]]
  names = {Ops.FDIV: "div", Ops.IDIV: "div", Ops.MOD: "rem", Ops.RECIP: "div", Ops.CMPLT: "lt", Ops.CMPNE: "ne",
           Ops.WHERE: "select_n", Ops.CAST: "convert_element_type", Ops.EXP2: "exp2", Ops.LOG2: "log2"}
  return names.get(op, op.name.lower())


def check_nans(name: str, values: Any) -> None:
  """FloatingPointError if a float result of operation `name` holds a NaN (jax_debug_nans)."""
  for value in values if isinstance(values, (list, tuple)) else (values,):
    if isinstance(value, Array) and not isinstance(value, Tracer) and value.dtype.kind == "f":
      if np.isnan(np.asarray(value._value(), dtype=np.float64)).any():
        raise FloatingPointError(f"invalid value (nan) encountered in {name}")


class EvalTrace(Trace):
  """The bottom trace: applies an op to concrete arrays by building a lazy UOp (nothing runs until needed). With
  jax_debug_nans, each named primitive's (or bare Op's) float result is computed at once and checked for NaN."""
  in_primitive = 0  # > 0 while a primitive's impl runs: its Ops are checked as the primitive

  def process(self, op: Ops, operands: tuple[Array, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Array:
    uops = []
    for operand in operands:
      if isinstance(operand, Tracer):
        operand.check_alive()
        raise UnexpectedTracerError(f"a {type(operand).__name__} reached the eager evaluator: a traced value was used "
                                    "outside the transformation that owns it")
      uops.append(operand.uop)
    node = UOp.unshared(op, dtype, tuple(uops), arg)
    node.__dict__["shape"] = shape_of(node)  # (asked by the next op or the read: computed here, where it is cheapest)
    result = eager_array(node, weak_type)
    if debug_nans[0] and not self.in_primitive and op in _CHECKED: check_nans(_jax_name(op, arg), result)
    return result

  def process_primitive(self, prim: Primitive, operands: tuple[Any, ...], params: dict) -> Any:
    if not debug_nans[0]:
      staged = self.stage_call(prim, operands, params)
      return staged if staged is not None else prim.impl(*operands, **params)
    self.in_primitive += 1
    try:
      result = prim.impl(*operands, **params)
    finally:
      self.in_primitive -= 1
    if not self.in_primitive: check_nans(prim.name, result)
    return result


  def stage_call(self, prim: Primitive, operands: tuple[Any, ...], params: dict) -> Any:
    """A call of one of tinyjax's own primitives on concrete arrays as one PRIMITIVE node (its results' PROJECTs for
    several), expanded into its Ops only where the program is lowered, so that an eager `tanh(x)` builds one node,
    not forty, and a program seen before is found in the schedule cache from a graph of a few nodes. The results'
    avals come from one abstract evaluation per signature (`_EAGER_CALLS`, which keeps the call too: one object, its
    hash computed once, for every call of that signature). None where the call is not staged: a user
    primitive (custom_jvp's), operands that are not arrays, params that cannot key a node, control flow and host calls
    (they run or check now), or an impl that needs concrete values (its abstract evaluation failed)."""
    if not prim.fixed or prim.name in _RUN_AT_ONCE or _sharding_enabled[0]: return None  # (shardings: op by op)
    avals, uops = [], []
    for x in operands:
      if type(x) is not Array: return None
      node = x.uop
      avals.append((node.shape, node.dtype, x.weak_type))
      uops.append(node)
    try:  # (keyed by the params in the caller's order: a call site passes them in one order)
      x64 = bool(config.jax_enable_x64)
      key = (prim, params_key(tuple(params.items())), tuple(avals), x64)
      call = _EAGER_CALLS.get(key, False)
    except TypeError:
      return None
    if call is False:
      out_avals = _abstract_eval(self, prim, operands, params)
      call = None if out_avals is None else PrimitiveCall(prim, tuple(sorted(params.items())), out_avals, x64=x64,
                                                          in_weak=tuple(weak for _, _, weak in avals))
      if len(_EAGER_CALLS) >= _EAGER_CALLS_MAX: _EAGER_CALLS.clear()
      _EAGER_CALLS[key] = call
    if call is None: return None
    out_avals, uops = call.out_avals, tuple(uops)
    if not prim.multiple_results:
      shape, dtype, weak = out_avals[0]
      node = UOp.unshared(Ops.PRIMITIVE, dtype, uops, call)
      node.__dict__["shape"] = shape  # (known: the first use of an eager result asks it)
      return eager_array(node, weak)
    node = UOp.unshared(Ops.PRIMITIVE, BOOL, uops, call)
    return [eager_array(UOp.unshared(Ops.PROJECT, dtype, (node,), (i, shape)), weak) for i, (shape, dtype, weak) in
            enumerate(out_avals)]


def eager_array(node: UOp, weak_type: bool) -> Array:
  """The Array an eager operation makes of its lazy `node`, recorded on the node (`held_by`: array.py realize_arrays
  keeps the values of arrays the user holds)."""
  result = Array(node, weak_type)
  node.__dict__["held_by"] = weakref.ref(result)
  return result


# primitives an eager call runs as it comes (control flow and host steps: they check and call back now)
_RUN_AT_ONCE = frozenset({"scan", "while", "cond", "pure_callback"})
# (primitive, params, operand avals, x64) -> the call (its results' avals), or None where the impl needs concrete values
_EAGER_CALLS: dict[tuple, Any] = {}
_EAGER_CALLS_MAX = 8192


def trace_impl(parent: Trace, prim: Primitive, operands: Sequence[Any], params: dict) -> tuple[list, StagingTrace]:
  """`prim`'s impl run on a scratch staging trace over arguments shaped as `operands` (arrays or avals): its results
  as a list (what it returns, not converted) and the trace."""
  scratch = StagingTrace(parent, [], f"abstract evaluation of {prim.name}")
  with new_trace(scratch):
    args = [scratch.new_arg(i, x.shape, x.dtype, x.weak_type) for i, x in enumerate(operands)]
    out = prim.impl(*args, **params)
  return (out if prim.multiple_results else [out]), scratch


def _abstract_eval(parent: Trace, prim: Primitive, operands: tuple[Array, ...], params: dict) -> tuple | None:
  """(shape, dtype, weak type) of each result of `prim` on arrays like `operands`, from its impl run on a scratch
  staging trace; None if the impl cannot run without concrete values (or raises: it then runs eagerly and says so),
  or reads host data of its own."""
  try: outs, scratch = trace_impl(parent, prim, operands, params)
  except Exception:  # noqa: BLE001 (the eager call runs the impl itself, and raises what it raises)
    return None
  if not all(isinstance(o, StagingTracer) and o.trace is scratch for o in outs): return None
  if any(o.uop.op is Ops.PARAM for o in outs): return None  # (a call returning an operand: nothing to stage)
  # (an impl that embeds host data, BUFFER leaves, runs eagerly: lowering expands calls over the program's PARAMs)
  if any(node.op is Ops.BUFFER for node in toposort_of([o.uop for o in outs])): return None
  return tuple((tuple(o.shape), np.dtype(o.dtype), bool(o.weak_type)) for o in outs)


class StagingTracer(Tracer):
  """A value of a StagingTrace: a UOp over the trace's PARAM leaves (and constants)."""
  __slots__ = ()

  def __init__(self, uop: UOp, weak_type: bool, trace: StagingTrace):
    super().__init__(uop, weak_type)
    self.trace = trace

  def kind_name(self) -> str: return "JitTracer"

  def concrete(self, what: str) -> Array:
    self.check_alive()
    params = sorted({node.arg[0] for node in self.uop.toposort if node.op is Ops.PARAM})
    names = ", ".join(self.trace.arg_names[i] for i in params if i < len(self.trace.arg_names)) or "its inputs"
    raise ConcretizationTypeError(
      f"Abstract tracer value encountered where concrete value is expected: {what} of a traced array "
      f"{self.aval_str()} inside `{self.trace.fun_name}`. The value depends on {names}. "
      "If that argument is a static value (a flag, a size, a Python number used for control flow), mark it with "
      "static_argnums or static_argnames; otherwise use tinyjax.numpy.where or lax.cond instead of Python control "
      "flow on it.")


class PrimitiveCallRecord(NamedTuple):
  """A primitive bound on a StagingTrace: its params, operands (tracers, arrays or Python values) and result nodes."""
  prim: Primitive
  params: dict
  operands: tuple
  outs: tuple


class StagingTrace(Trace):
  """The trace of `jit`/`make_jaxpr`: inputs are PARAM nodes and every result is a StagingTracer; concrete arrays
  the function closes over are embedded by their UOp (lower/ turns their buffers into inputs). `arg_names[i]` says
  which argument PARAM i came from, for error messages."""

  def __init__(self, parent: Trace, arg_names: list[str], fun_name: str):
    self.parent, self.arg_names, self.fun_name, self.active = parent, arg_names, fun_name, True
    self.arg_shardings: dict[int, Any] = {}  # PARAM index -> the NamedSharding of a sharded argument (jit's)
    # each result node of a primitive bound here -> the call (a PrimitiveCallRecord), for printing the program with
    # the primitives' names (the program itself holds their decompositions into Ops)
    self.calls: dict[UOp, PrimitiveCallRecord] = {}

  def process_primitive(self, prim: Primitive, operands: tuple[Any, ...], params: dict) -> Any:
    out = prim.impl(*operands, **params)
    outs = out if prim.multiple_results else [out]
    if all(isinstance(o, StagingTracer) and o.trace is self for o in outs):
      operand_nodes = {x.uop for x in operands if isinstance(x, Array)}
      if not any(o.uop in operand_nodes for o in outs):  # (a call that returns an operand prints as nothing)
        record = PrimitiveCallRecord(prim, params, tuple(operands), tuple(o.uop for o in outs))
        for o in outs: self.calls[o.uop] = record
    return out

  def process(self, op: Ops, operands: tuple[Array, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Tracer:
    uops = []
    for operand in operands:
      if isinstance(operand, Tracer) and operand.trace is not self:
        operand.check_alive()
        raise UnexpectedTracerError(f"a {type(operand).__name__} of another transformation reached the trace of "
                                    f"`{self.fun_name}`: jit inside a transformation is inlined, so this value escaped")
      uops.append(operand.uop)
    return StagingTracer(UOp(op, dtype, tuple(uops), arg), weak_type, self)

  def new_arg(self, index: int, shape: tuple[int, ...], dtype: np.dtype, weak_type: bool) -> StagingTracer:
    return StagingTracer(UOp(Ops.PARAM, np.dtype(dtype), (), (index, tuple(shape))), weak_type, self)


def is_key_dtype(dtype: Any) -> bool:
  """Whether `dtype` is a typed random key's (`key<fry>`, random.KeyDtype: not a numpy dtype)."""
  return getattr(dtype, "name", "").startswith("key<")


class ShapedArray:
  """An abstract value: shape, dtype and weak type (what `typeof` returns; prints like JAX's, `float32[3]`), the mesh
  axes it varies over inside a shard_map (`vma`, printed `{V:i}`) and the NamedSharding it carries (`sharding`:
  trace/sharding_types.py; dimensions split over Explicit mesh axes print as `8@X`)."""
  __slots__ = ("shape", "dtype", "weak_type", "vma", "sharding")

  def __init__(self, shape: tuple[int, ...], dtype: np.dtype, weak_type: bool = False, vma: frozenset = frozenset(),
               sharding: Any = None):
    # (a typed key array's dtype, `key<fry>`, is not a numpy dtype: it is kept as it is)
    dtype = dtype if is_key_dtype(dtype) else np.dtype(dtype)
    self.shape, self.dtype, self.weak_type, self.vma = tuple(shape), dtype, bool(weak_type), frozenset(vma)
    self.sharding = sharding

  @property
  def ndim(self) -> int: return len(self.shape)

  @property
  def manual_axis_type(self) -> Any:
    """JAX's spelling of the varying mesh axes: `.varying` is `vma`."""
    from types import SimpleNamespace
    return SimpleNamespace(varying=self.vma)

  def str_short(self) -> str:
    names = sorted(map(str, self.vma))
    varying = "" if not names else f"{{V:{names[0]}}}" if len(names) == 1 else f"{{V:({','.join(names)})}}"
    # (the split dimensions over Explicit axes: `type_sharding` keeps only those)
    dims = tuple(() if self.sharding is None else self.sharding.spec.axes_of(dim) for dim in range(len(self.shape)))
    return f"{self.dtype.name}[{sizes_str(self.shape, dims)}]{varying}"

  def __str__(self) -> str: return self.str_short()
  def __repr__(self) -> str: return f"ShapedArray({self.str_short()}{', weak_type=True' if self.weak_type else ''})"
  def __eq__(self, other: Any) -> bool:
    return isinstance(other, ShapedArray) and (self.shape, self.dtype, self.weak_type, self.vma) == (
      other.shape, other.dtype, other.weak_type, other.vma)
  def __hash__(self) -> int: return hash((self.shape, self.dtype, self.weak_type, self.vma))


def typeof(x: Any) -> ShapedArray:
  """The abstract value (shape, dtype, weak type) of an array, tracer or Python scalar."""
  if is_key_dtype(getattr(x, "dtype", None)):  # a typed key array (random.PRNGKeyArray): `key<fry>[]`
    return ShapedArray(x.shape, x.dtype)
  if not isinstance(x, Array):
    from tinyjax.lax._base import to_array
    x = to_array(x)
  from tinyjax.trace.batching import varying_axes  # (batching sits above core)
  return ShapedArray(x.shape, x.dtype, x.weak_type, varying_axes(x), type_sharding(named_of(x), len(x.shape)))


def params_key(items: tuple) -> tuple:
  """A primitive's params ((name, value) items) as a key that tells -0.0 from 0.0 and finds NaN equal to itself
  (`arg_key` of the floats among the values and in tuples of them): `fill_value=-0.0` and `fill_value=0.0` are two
  programs. The items themselves where they hold no float (the common case, checked first)."""
  for _, value in items:
    kind = type(value)
    if kind in _FLOAT_TYPES or kind is tuple and not _FLOAT_TYPES.isdisjoint(map(type, value)):
      return tuple((name, tuple(map(_float_key, value)) if type(value) is tuple else _float_key(value))
                   for name, value in items)
  return items


# Python's and numpy's float and complex scalar types (ml_dtypes' too: their scalars are numpy generics)
_FLOAT_TYPES = frozenset({float, complex, *(np.dtype(d).type for d in dtypes.SUPPORTED_DTYPES if d.kind in "fcV")})
def _float_key(value: Any) -> Any: return arg_key(value) if type(value) in _FLOAT_TYPES else value


class PrimitiveCall:
  """The arg of a PRIMITIVE node: the primitive, its params (a sorted tuple of items, hashable), its outputs'
  avals ((shape, dtype, weak_type) each) and which operands are weakly typed (`in_weak`). `expand` turns the call into
  Ops for lowering, by running the primitive's impl on a staging trace over the operands' nodes."""
  __slots__ = ("prim", "params", "out_avals", "fingerprint", "x64", "in_weak", "_hash")

  def __init__(self, prim: Primitive, params: tuple, out_avals: tuple, fingerprint: str = "", x64: bool | None = None,
               in_weak: tuple[bool, ...] = ()):
    self.prim, self.params, self.out_avals, self.fingerprint = prim, params, out_avals, fingerprint
    self.x64 = x64  # (an eager call's jax_enable_x64 when it was made: its impl is expanded under the same setting)
    # (the impl sees its operands as they were: a Python scalar of an eager `where(c, 0, x)` is a weakly typed operand,
    # which takes x's dtype; read as a strong one where the call was expanded, the int32 where of an x64 program
    # computed int64 under a node that said int32)
    self.in_weak = in_weak
    self._hash = None

  def _key(self) -> tuple:
    return (self.prim.name, id(self.prim), params_key(self.params), self.out_avals, self.fingerprint, self.x64,
            self.in_weak)

  def __hash__(self) -> int:
    if self._hash is None: self._hash = hash(self._key())
    return self._hash

  def __eq__(self, other: Any) -> bool:
    return self is other or (isinstance(other, PrimitiveCall) and hash(self) == hash(other) and
                             self._key() == other._key())
  def __reduce__(self):
    return (PrimitiveCall, (self.prim, self.params, self.out_avals, self.fingerprint, self.x64, self.in_weak))

  def __repr__(self) -> str:
    shown = [f"{name}={value!r}" for name, value in self.params if name != "out_avals"]
    if self.fingerprint: shown.append(f"impl={self.fingerprint}")  # (keys the persistent caches: see Primitive)
    return f"{self.prim.name}" + (f"[{' '.join(shown)}]" if shown else "")  # (as a jaxpr's equation reads)

  def expand(self, operands: tuple[UOp, ...]) -> list[UOp]:
    """The call's results as Ops over the operand nodes (one per output)."""
    trace = StagingTrace(current_trace.get(), [], f"lowering of {self.prim.name}")
    same_x64 = self.x64 is None or self.x64 == config.jax_enable_x64
    with new_trace(trace), (contextlib.nullcontext() if same_x64 else config.override("jax_enable_x64", self.x64)):
      weak = self.in_weak or (False,) * len(operands)
      args = [StagingTracer(uop, is_weak, trace) for uop, is_weak in zip(operands, weak)]
      out = self.prim.impl(*args, **dict(self.params))
    outs = out if self.prim.multiple_results else [out]
    return [o.uop for o in outs]


_eval_trace = EvalTrace()
current_trace: contextvars.ContextVar[Trace] = contextvars.ContextVar("current_trace", default=_eval_trace)


@contextlib.contextmanager
def set_current_trace(trace: Trace) -> Iterator[Trace]:
  """Make `trace` current for the duration of the block."""
  token = current_trace.set(trace)
  try:
    yield trace
  finally:
    current_trace.reset(token)


@contextlib.contextmanager
def new_trace(trace: Trace) -> Iterator[Trace]:
  """Run a transformation's trace: current for the block, and dead afterwards (its tracers must not be used)."""
  with set_current_trace(trace):
    try:
      yield trace
    finally:
      trace.active = False


def bind(op: Ops, *operands: Any, arg: Any = None, dtype: np.dtype | None = None, weak_type: bool = False) -> Any:
  """Apply primitive `op` to `operands` (arrays of the current trace) with static `arg`; the result has `dtype`
  (default: the first operand's) and `weak_type`."""
  out_dtype = operands[0].dtype if dtype is None else np.dtype(dtype)
  out = current_trace.get().process(op, operands, arg, out_dtype, weak_type)
  if _sharding_enabled[0]: propagate_sharding(op, operands, arg, out)
  return out
