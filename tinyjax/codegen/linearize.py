"""What every renderer shares (codegen/llvm.py for the CPU and NVPTX, codegen/opencl.py for OpenCL C): the dtype
families, the REDUCE identities, and `Linearizer`, which decides where each node of a kernel AST is emitted.

A node is emitted at the innermost loop it depends on (`free_ranges`), so work that does not depend on a loop's
range is computed before the loop. Values are memoised per loop scope: what a loop body computed is forgotten when the
loop closes. A renderer subclasses `Linearizer`, opens its loops (pushing a scope that binds the RANGE), and renders
single nodes; `emit_ready` and `render_node` do the rest.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator

import numpy as np

from tinyjax.codegen.opt import BF16, F16, F32, F64
from tinyjax.uop import BOOL, Ops, UOp


def dtype_kind(dtype: np.dtype) -> str:
  """'b' bool, 'i' signed int, 'u' unsigned int, 'f' float (float16 and bfloat16 included)."""
  if dtype == BOOL: return "b"
  if dtype.kind in "iu": return dtype.kind
  if dtype in (F16, BF16, F32, F64): return "f"
  raise NotImplementedError(f"codegen: unsupported dtype {dtype}")


def min_value(dtype: np.dtype):
  kind = dtype_kind(dtype)
  if kind == "f": return -math.inf
  if kind == "i": return int(np.iinfo(dtype).min)
  return 0  # unsigned and bool


# identities of the REDUCE ops, per dtype
IDENTITY: dict[Ops, Callable[[np.dtype], object]] = {Ops.ADD: lambda dtype: 0, Ops.MUL: lambda dtype: 1,
                                                     Ops.MAX: min_value}


def free_ranges(ast: UOp) -> dict[UOp, frozenset[UOp]]:
  """For each node, the RANGEs whose loops it must be inside: its own and its sources', less those a REDUCE closes."""
  deps: dict[UOp, frozenset[UOp]] = {}
  for node in ast.toposort:
    if node.op is Ops.RANGE: deps[node] = frozenset({node})
    elif node.op is Ops.REDUCE:
      value, *ranges = node.src
      deps[node] = deps[value].difference(ranges).union(*(deps[r.src[0]] for r in ranges))
    else: deps[node] = frozenset().union(*(deps[s] for s in node.src))
  return deps


class Linearizer:
  """Places the nodes of kernel `ast` (see the module docstring). Subclasses render single nodes: `render_load`,
  `render_store`, `render_reduce`, `render_unary`, `render_binary`, `cast`, `bitcast`, `select`, and name a buffer
  parameter (`buffer_value`) and a constant (`constant`)."""

  def __init__(self, ast: UOp):
    self.ast = ast
    self.deps = free_ranges(ast)
    self.scopes: list[dict[UOp, str]] = [{}]  # memo of emitted values, one dict per open loop (innermost last)
    self.open_ranges: set[UOp] = set()
    self.counter = 0
    self.stores_emitted: set[UOp] = set()

  @contextlib.contextmanager
  def bound(self, rng: UOp | None, value: str) -> Iterator[None]:
    """A scope in which RANGE `rng` has the value `value` (what it computes is forgotten after); None: no scope."""
    if rng is None:
      yield
      return
    self.scopes.append({rng: value})
    self.open_ranges.add(rng)
    yield
    self.open_ranges.discard(rng)
    self.scopes.pop()

  def lookup(self, node: UOp) -> str | None:
    for scope in reversed(self.scopes):
      if (value := scope.get(node)) is not None: return value
    return None

  def value(self, node: UOp) -> str:
    if (value := self.lookup(node)) is None: raise RuntimeError(f"codegen: {node.op.name} used before it is emitted")
    return value

  def emit_ready(self, root: UOp) -> None:
    """Emit, at the current position, every node under `root` not yet emitted whose ranges are all open. Called
    before a loop opens (so loop-invariant work lands outside it) and inside each loop body."""
    for node in root.toposort:
      if self.deps[node] <= self.open_ranges and self.lookup(node) is None:
        self.scopes[-1][node] = self.render_node(node)

  def bind_work_item(self, spread: list[UOp], gid: str, remainder: Callable[[str, int], str],
                     quotient: Callable[[str, int], str]) -> None:
    """GPU: bind the global ranges `spread` to the digits of the flat index `gid` (the last range varying fastest, so
    neighbouring work-items touch neighbouring elements), with `remainder(value, size)` / `quotient(value, size)`
    emitting the index arithmetic. The bindings stay for the rest of the kernel."""
    from tinyjax.codegen.gpu import global_size
    rest, values = gid, {}
    for position, rng in enumerate(reversed(spread)):
      size = global_size(rng)
      if position == len(spread) - 1: values[rng] = rest
      else:
        values[rng] = remainder(rest, size)
        rest = quotient(rest, size)
    self.scopes.append(values)
    self.open_ranges.update(values)

  def check_stores(self) -> None:
    stores = sum(1 for n in self.ast.toposort if n.op is Ops.STORE)
    if len(self.stores_emitted) != stores:
      raise ValueError(f"codegen: {stores - len(self.stores_emitted)} STOREs depend on ranges that are never opened")

  def render_node(self, node: UOp) -> str:
    """Emit one node whose sources are emitted; return its value (a name or a literal)."""
    op = node.op
    if op is Ops.CONST: return self.constant(node.arg, node.dtype)
    if op is Ops.DEFINE_GLOBAL: return self.buffer_value(node.arg)
    if op is Ops.RANGE: raise RuntimeError("codegen: RANGE rendered outside its loop")
    if op is Ops.SINK: return ""
    if op is Ops.LOAD: return self.render_load(node)
    if op is Ops.STORE: return self.render_store(node)
    if op is Ops.REDUCE: return self.render_reduce(node)
    if op is Ops.WHERE: return self.select(*(self.value(s) for s in node.src), node.dtype)
    if op is Ops.CAST: return self.cast(self.value(node.src[0]), node.src[0].dtype, node.dtype)
    if op is Ops.BITCAST: return self.bitcast(self.value(node.src[0]), node.src[0].dtype, node.dtype)
    if len(node.src) == 1: return self.render_unary(node)
    if len(node.src) == 2: return self.render_binary(node)
    raise NotImplementedError(f"codegen: can't render {op.name}")
