"""tinyjax.debug.print: print values from inside transformed functions, as jax.debug.print.

Eagerly (and under grad, whose primal values are concrete) it prints at once. Under `jit` the values are extra,
hidden outputs of the compiled program, printed after each call, so every call prints the values of that call (at
run time, not trace time). Under `vmap` the whole batch is printed as one array. Inside a `lax.scan` / `while_loop`
body or a `cond` branch printing is not supported yet (NotImplementedError).
"""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from tinyjax import tree_util
from tinyjax.array import Array
from tinyjax.trace.ad import JVPTracer
from tinyjax.trace.batching import BatchTracer
from tinyjax.trace.core import StagingTrace, StagingTracer, Tracer
from tinyjax.trace.jit import format_values


def _base(value: Any) -> Any:
  """The value under the transformations above jit's trace: JVP tracers give their primal, batch tracers their
  batched value."""
  while isinstance(value, Tracer):
    if isinstance(value, JVPTracer): value = value.primal
    elif isinstance(value, BatchTracer): value = value.val
    else: break
  return value


def print(fmt: str, *args: Any, ordered: bool = False, **kwargs: Any) -> None:  # noqa: A001
  """Print `fmt.format(*args, **kwargs)` with the arguments' values: now, or under jit each time it runs."""
  leaves, tree = tree_util.tree_flatten((args, kwargs))
  values = [_base(leaf) if isinstance(leaf, Array) else leaf for leaf in leaves]
  traced = [v for v in values if isinstance(v, Tracer)]
  if not traced:
    shown = [np.asarray(v) if isinstance(v, Array) else v for v in values]
    builtins.print(format_values(fmt, tree, shown))
    return
  trace = traced[0].trace
  if type(trace) is not StagingTrace or any(not isinstance(v, StagingTracer) or v.trace is not trace for v in traced):
    raise NotImplementedError("tinyjax.debug.print of values traced inside a lax.scan / while_loop body, a cond "
                              "branch or a linearized function is not supported yet")
  if not hasattr(trace, "prints"): trace.prints = []
  trace.prints.append((fmt, tree, values))


def callback(*args: Any, **kwargs: Any) -> None:
  raise NotImplementedError("tinyjax.debug.callback is not implemented yet; tinyjax.debug.print is")
