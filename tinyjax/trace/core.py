"""The trace machinery: every operation on arrays goes through `bind`, which hands it to the current trace.

The bottom trace is the eager one: its rule builds a lazy UOp over its operands. `jit` traces with a `StagingTrace`,
whose values are `Tracer`s: Arrays over PARAM leaves that must never be made concrete. Transformations (jvp, vmap)
add traces here, each knowing its parent, with the current one in a context variable (the "stackless" design of
Autodidax part 2 and of JAX today).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import numpy as np

from tinyjax.array import Array
from tinyjax.uop import Ops, UOp


class ConcretizationTypeError(TypeError):
  """A traced value was used where Python needs a concrete one (`bool`, `float`, `int`, `item`, `np.asarray`)."""


class UnexpectedTracerError(TypeError):
  """A traced value was used after the transformation that made it had finished (it escaped, e.g. to a global)."""


class Trace:
  """A way of interpreting primitives. `parent` is the trace below this one."""
  parent: Trace | None = None

  def process(self, op: Ops, operands: tuple[Any, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Any:
    raise NotImplementedError


class EvalTrace(Trace):
  """The bottom trace: applies an op to concrete arrays by building a lazy UOp (nothing runs until needed)."""

  def process(self, op: Ops, operands: tuple[Array, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Array:
    for operand in operands:
      if isinstance(operand, Tracer) and operand.trace is not self: operand.check_alive()
    return Array(UOp(op, dtype, tuple(operand.uop for operand in operands), arg), weak_type)


class StagingTrace(EvalTrace):
  """The trace of `jit`/`make_jaxpr`: inputs are PARAM nodes, and every result is a `Tracer` of this trace.
  `arg_names[i]` says which argument PARAM i came from, for error messages."""

  def __init__(self, parent: Trace, arg_names: list[str], fun_name: str):
    self.parent, self.arg_names, self.fun_name, self.active = parent, arg_names, fun_name, True

  def process(self, op: Ops, operands: tuple[Array, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Tracer:
    for operand in operands:
      if isinstance(operand, Tracer) and operand.trace is not self: operand.check_alive()
    return Tracer(UOp(op, dtype, tuple(operand.uop for operand in operands), arg), weak_type, self)

  def new_arg(self, index: int, shape: tuple[int, ...], dtype: np.dtype, weak_type: bool) -> Tracer:
    return Tracer(UOp(Ops.PARAM, np.dtype(dtype), (), (index, tuple(shape))), weak_type, self)


class Tracer(Array):
  """An abstract value inside a transformation: shape, dtype and weak type are known, values are not."""
  __slots__ = ("trace",)

  def __init__(self, uop: UOp, weak_type: bool, trace: StagingTrace):
    super().__init__(uop, weak_type)
    self.trace = trace

  def check_alive(self) -> None:
    if not self.trace.active:
      raise UnexpectedTracerError(
        f"Encountered an unexpected tracer: a value traced by `{self.trace.fun_name}` ({self.aval_str()}) was used "
        "after that transformation finished. It escaped, for example through a global variable or a closure that "
        "outlived the call. Return it as an output of the transformed function instead.")

  def aval_str(self) -> str:
    return f"{self.dtype.name}{list(self.shape)}"

  def _concrete_error(self, what: str) -> TypeError:
    self.check_alive()
    params = sorted({node.arg[0] for node in self.uop.toposort if node.op is Ops.PARAM})
    names = ", ".join(self.trace.arg_names[i] for i in params if i < len(self.trace.arg_names)) or "its inputs"
    return ConcretizationTypeError(
      f"Abstract tracer value encountered where concrete value is expected: {what} of a traced array "
      f"{self.aval_str()} inside `{self.trace.fun_name}`. The value depends on {names}. "
      "If that argument is a static value (a flag, a size, a Python number used for control flow), mark it with "
      "static_argnums or static_argnames; otherwise use tinyjax.numpy.where or lax.cond instead of Python control "
      "flow on it.")

  def realize(self) -> Array: raise self._concrete_error("the values")
  def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray: raise self._concrete_error("np.asarray()")
  def __bool__(self) -> bool: raise self._concrete_error("bool()")
  def __float__(self) -> float: raise self._concrete_error("float()")
  def __int__(self) -> int: raise self._concrete_error("int()")
  def __complex__(self) -> complex: raise self._concrete_error("complex()")
  def __index__(self) -> int: raise self._concrete_error("use as an index (__index__)")
  def item(self, *args) -> Any: raise self._concrete_error("item()")
  def tolist(self) -> Any: raise self._concrete_error("tolist()")
  def __repr__(self) -> str: return f"Traced<{self.aval_str()}{', weak_type' if self.weak_type else ''}>"
  def __str__(self) -> str: return self.__repr__()
  def __reduce__(self): raise self._concrete_error("pickling")


_eval_trace = EvalTrace()
current_trace: contextvars.ContextVar[Trace] = contextvars.ContextVar("current_trace", default=_eval_trace)


@contextlib.contextmanager
def new_trace(trace: Trace) -> Iterator[Trace]:
  """Make `trace` current for the duration of the block; afterwards its tracers are dead."""
  token = current_trace.set(trace)
  try:
    yield trace
  finally:
    current_trace.reset(token)
    trace.active = False


def bind(op: Ops, *operands: Any, arg: Any = None, dtype: np.dtype | None = None, weak_type: bool = False) -> Any:
  """Apply primitive `op` to `operands` (arrays of the current trace) with static `arg`; the result has `dtype`
  (default: the first operand's) and `weak_type`."""
  out_dtype = operands[0].dtype if dtype is None else np.dtype(dtype)
  return current_trace.get().process(op, operands, arg, out_dtype, weak_type)
