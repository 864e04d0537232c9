"""tinyjax.debug: `print` (values from inside transformed functions, as jax.debug.print) and
`visualize_array_sharding` (how an array is laid out over devices).

`print`: eagerly (and under grad, whose primal values are concrete) it prints at once. Under `jit` the values are extra,
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


def visualize_array_sharding(array: Any, *, use_color: bool = False, scale: float = 1.0, min_width: int = 9,
                             max_width: int = 80) -> None:
  """Print how a 1- or 2-dimensional array is laid out over devices, as a text table: one cell per block, naming
  the devices that hold it (as jax.debug.visualize_array_sharding, without colours)."""
  builtins.print(sharding_table(array, min_width))


def sharding_table(array: Any, min_width: int = 9) -> str:
  """The text table `visualize_array_sharding` prints."""
  if not isinstance(array, Array) or isinstance(array, Tracer):
    raise TypeError(f"visualize_array_sharding expects a concrete tinyjax Array, got {type(array).__name__}")
  if array.ndim not in (1, 2):
    raise ValueError(f"visualize_array_sharding can only show 1- and 2-dimensional arrays, got rank {array.ndim}")
  shape = tuple(array.shape) if array.ndim == 2 else (1, array.shape[0])
  index_map = array.sharding.devices_indices_map(tuple(array.shape))

  def bounds(index: slice, size: int) -> tuple[int, int]:
    start, stop, _ = index.indices(size)
    return start, stop

  cells: dict[tuple, list] = {}
  for device, index in index_map.items():
    rows = bounds(index[0], shape[0]) if array.ndim == 2 else (0, 1)
    columns = bounds(index[-1], shape[1])
    cells.setdefault((rows, columns), []).append(device)
  row_bounds = sorted({key[0] for key in cells})
  column_bounds = sorted({key[1] for key in cells})

  def label(devices: list) -> str:
    platform = devices[0].platform.upper()
    return f"{platform} {','.join(str(d.id) for d in sorted(devices, key=lambda d: d.id))}"

  width = max([min_width] + [len(label(devs)) + 2 for devs in cells.values()])
  rule = lambda left, middle, right: left + middle.join("─" * width for _ in column_bounds) + right  # noqa: E731
  lines = [rule("┌", "┬", "┐")]
  for number, rows in enumerate(row_bounds):
    lines.append("│" + "│".join(label(cells[(rows, columns)]).center(width) for columns in column_bounds) + "│")
    lines.append(rule("├", "┼", "┤") if number < len(row_bounds) - 1 else rule("└", "┴", "┘"))
  return "\n".join(lines)
