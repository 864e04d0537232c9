"""The trace machinery: every operation on arrays goes through `bind`, which hands it to the current trace.

For now there is one trace, the eager one, whose rule builds a lazy UOp over its operands. Transformations (jit,
jvp, vmap) add traces here, each knowing its parent, with the current one in a context variable (the "stackless"
design of Autodidax part 2 and of JAX today).
"""
from __future__ import annotations

import contextvars
from typing import Any

import numpy as np

from tinyjax.array import Array
from tinyjax.uop import Ops, UOp


class Trace:
  """A way of interpreting primitives. `parent` is the trace below this one."""
  parent: Trace | None = None

  def process(self, op: Ops, operands: tuple[Any, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Any:
    raise NotImplementedError


class EvalTrace(Trace):
  """The bottom trace: applies an op to concrete arrays by building a lazy UOp (nothing runs until needed)."""

  def process(self, op: Ops, operands: tuple[Array, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Array:
    return Array(UOp(op, dtype, tuple(operand.uop for operand in operands), arg), weak_type)


current_trace: contextvars.ContextVar[Trace] = contextvars.ContextVar("current_trace", default=EvalTrace())


def bind(op: Ops, *operands: Any, arg: Any = None, dtype: np.dtype | None = None, weak_type: bool = False) -> Any:
  """Apply primitive `op` to `operands` (arrays of the current trace) with static `arg`; the result has `dtype`
  (default: the first operand's) and `weak_type`."""
  out_dtype = operands[0].dtype if dtype is None else np.dtype(dtype)
  return current_trace.get().process(op, operands, arg, out_dtype, weak_type)
