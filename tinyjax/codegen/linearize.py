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
  """For each node, the RANGEs whose loops it must be inside: its own and its sources', less those a REDUCE closes.
  A LOAD of a buffer the kernel also stores into (a scatter's read-modify-write of its output) is inside the loops of
  those STOREs too: it reads what earlier iterations wrote. (A scatter into one element loaded it once, before its
  loop over the updates, so each update started from the old value: `zeros(1).at[[0, 0]].add(1)` gave 1.)"""
  def walk(extra: dict[UOp, frozenset[UOp]]) -> dict[UOp, frozenset[UOp]]:
    deps: dict[UOp, frozenset[UOp]] = {}
    for node in ast.toposort:
      if node.op is Ops.RANGE: deps[node] = frozenset({node})
      elif node.op is Ops.REDUCE:
        value, *ranges = node.src
        deps[node] = deps[value].difference(ranges).union(*(deps[r.src[0]] for r in ranges))
      else: deps[node] = frozenset().union(*(deps[s] for s in node.src))
      if node.op is Ops.LOAD and (written := extra.get(node.src[0])): deps[node] |= written
    return deps
  deps = walk({})
  written: dict[UOp, frozenset[UOp]] = {}
  for node in ast.toposort:
    if node.op is Ops.STORE: written[node.src[0]] = written.get(node.src[0], frozenset()) | deps[node]
  if not any(node.op is Ops.LOAD and not written.get(node.src[0], frozenset()) <= deps[node] for node in ast.toposort):
    return deps
  return walk(written)


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

  def bound(self, rng: UOp | None, value: str | None) -> contextlib.AbstractContextManager:
    """A scope in which RANGE `rng` has the value `value` (what it computes is forgotten after; `bindings`); None: no
    scope."""
    return contextlib.nullcontext() if rng is None else self.bindings({rng: value})

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

  def bind_work_item(self, spread: list[UOp], gid: str) -> None:
    """GPU: bind the global ranges `spread` to the digits of the flat index `gid` (`digits`: the last range varying
    fastest, so neighbouring work-items touch neighbouring elements). The bindings stay for the rest of the kernel."""
    values = self.digits(tuple(spread), gid)
    self.scopes.append(values)
    self.open_ranges.update(values)

  def emit_needed(self, root: UOp) -> str:
    """Emit what `root` needs that no open scope holds (not everything ready, as `emit_ready`: a tiled product's
    staged factors are bound to values read from local memory, and what computes them is not wanted), at the current
    position; return its value."""
    stack = [(root, False)]
    while stack:
      node, ready = stack.pop()
      if self.lookup(node) is not None: continue
      if ready:
        self.scopes[-1][node] = self.render_node(node)
        continue
      stack.append((node, True))
      stack.extend((source, False) for source in node.src if self.lookup(source) is None)
    return self.value(root)

  @contextlib.contextmanager
  def bindings(self, values: dict[UOp, str]) -> Iterator[None]:
    """A scope in which the nodes of `values` (RANGEs among them) have those values."""
    ranges = {node for node in values if node.op is Ops.RANGE} - self.open_ranges
    self.scopes.append(dict(values))
    self.open_ranges.update(ranges)
    yield
    self.open_ranges.difference_update(ranges)
    self.scopes.pop()

  @contextlib.contextmanager
  def rebound(self, root: UOp, values: dict[UOp, str]) -> Iterator[None]:
    """A scope in which RANGEs `values` have other values than in the loops open around it, and every node under
    `root` that depends on them is emitted again with those (a value emitted before, for the ranges' current values,
    would otherwise be found): `root`'s value there is that of the other point."""
    with self.bindings(values):
      for node in root.toposort:
        if node in values: continue
        if self.deps[node] & values.keys() or (self.lookup(node) is None and self.deps[node] <= self.open_ranges):
          self.scopes[-1][node] = self.render_node(node)
      yield

  def gemm_block(self, global_ranges: list[UOp]) -> tuple[str, str]:
    """A tiled matrix product's work-group (codegen/gpu.py `GemmTile`): bind the global ranges other than the row
    and the column to the digits of its index (other ranges..., row block, column block: the column block fastest);
    return its first row and first column."""
    tile = self.launch.tile
    block, _ = self.thread_ids()
    column_block = self.index("rem", block, tile.column_blocks)
    rest = self.index("div", block, tile.column_blocks)
    row_block = self.index("rem", rest, tile.row_blocks)
    others = [rng for rng in global_ranges if rng not in tile.rows and rng is not tile.column]
    if others: self.bind_work_item(others, self.index("div", rest, tile.row_blocks))
    return self.index("mul", row_block, tile.sizes[0]), self.index("mul", column_block, tile.sizes[1])

  def digits(self, ranges: tuple[UOp, ...], index: str) -> dict[UOp, str]:
    """The values of `ranges` (the fastest last) whose flat index is `index`, through the renderer's `index`."""
    from tinyjax.codegen.gpu import global_size
    values, rest = {}, index
    for position, rng in enumerate(reversed(ranges)):
      if position == len(ranges) - 1: values[rng] = rest
      else:
        values[rng] = self.index("rem", rest, global_size(rng))
        rest = self.index("div", rest, global_size(rng))
    return values

  def gemm_k(self, step: str) -> dict[UOp, str]:
    """The values of a tiled product's summed ranges at step `step` of its one step index (`GemmTile.ks`)."""
    return self.digits(self.launch.tile.ks, step)

  def gemm_stage(self, factors: tuple[UOp, ...], outer: tuple[UOp, ...], first: str, span: int, first_step: str,
                 count: int,
                 store: Callable[[UOp, str, str, str, str | None], None],
                 value_of: Callable[[UOp], str] | None = None,
                 store_lanes: Callable[[UOp, str, str, list[str]], None] | None = None) -> None:
    """Compute this work-item's share of the factors' values over `span` values of the ranges `outer` (the digits of
    one index, the fastest last) from `first` and BLOCK_STEPS steps of k from `first_step` (of which the first `count`
    are real), and hand each to `store(factor, step, offset, value, inside)` (`inside`: whether the step is real, None
    when all are). Neighbouring
    work-items take neighbouring steps when the factors' loads read consecutive elements along k, else neighbouring
    values of `outer`. Values past the edge of `outer` or k are computed at its last value (loads stay inside).
    `value_of(factor)` emits a factor's value (default `emit_needed`). A float32 operand loaded as it is goes
    `lanes` elements per vector load, along k or `outer` where it is contiguous; along `outer` they are handed on
    together to `store_lanes(factor, step, offset, values)` where there is one."""
    from tinyjax.codegen.gpu import global_size, vector_axis
    from tinyjax.codegen.opt import F32, linear_strides
    tile = self.launch.tile
    k, block_steps, threads = tile.k, tile.sizes[2], tile.threads
    size, steps = math.prod(global_size(rng) for rng in outer), tile.steps
    _, lane = self.thread_ids()
    each = span * block_steps // threads
    lanes = 4 if each % 4 == 0 else 2 if each % 2 == 0 else 1
    # a float32 operand loaded as it is: `lanes` elements per vector load, along k or `outer` where it is contiguous
    if value_of is None and count == block_steps and lanes > 1 and len(factors) == 1 and factors[0].dtype == F32 and \
        (axis := vector_axis(factors[0], (k, outer[-1]), lanes)) is not None:
      per_line = (block_steps if axis is k else span) // lanes
      for r in range(each // lanes):
        element = self.index("add", lane, r * threads)
        along = self.index("mul", self.index("rem", element, per_line), lanes)
        across = self.index("div", element, per_line)
        step, offset = (along, across) if axis is k else (across, along)
        position = self.index("add", first, offset)
        if size % span: position = self.index("min", position, size - (1 if axis is k else lanes))
        with self.bindings({**self.digits(outer, position), **self.gemm_k(self.index("add", first_step, step))}):
          values = self.load_lanes(factors[0], lanes)
        if axis is not k and store_lanes is not None:
          store_lanes(factors[0], step, offset, values)
          continue
        for index, value in enumerate(values):
          if axis is k: store(factors[0], self.index("add", step, index), offset, value, None)
          else: store(factors[0], step, self.index("add", offset, index), value, None)
      return
    loads = [n for factor in factors for n in factor.toposort if n.op is Ops.LOAD and k in n.src[1].toposort]
    along_k = all(linear_strides(load.src[1])[0].get(k) == 1 for load in loads)
    for r in range(each):
      element = self.index("add", lane, r * threads)
      if along_k: step, offset = self.index("rem", element, block_steps), self.index("div", element, block_steps)
      else: offset, step = self.index("rem", element, span), self.index("div", element, span)
      position = self.index("add", first, offset)
      if size % span: position = self.index("min", position, size - 1)
      at = self.index("add", first_step, step)
      inside = None
      if count < block_steps:
        inside = self.less(step, count)
        at = self.index("min", at, steps - 1)
      with self.bindings({**self.digits(outer, position), **self.gemm_k(at)}):
        for factor in factors: store(factor, step, offset, (value_of or self.emit_needed)(factor), inside)

  def gemm_steps(self, block: Callable[[str, int], None]) -> None:
    """Run `block(first_step, count)` over k in blocks of BLOCK_STEPS: a loop over the whole blocks, then the last,
    short one."""
    block_steps, steps = self.launch.tile.sizes[2], self.launch.tile.steps
    if whole := steps // block_steps:
      with self.loop("0", str(whole), None) as index: block(self.index("mul", index, block_steps), block_steps)
    if steps % block_steps: block(str(whole * block_steps), steps % block_steps)

  def gemm_store(self, row: str, column: str, total: str) -> None:
    """The epilogue and STORE of a tiled product's output (row, column), the REDUCE's value `total` (its dtype),
    if it lies inside the output."""
    from tinyjax.codegen.gpu import global_size
    tile = self.launch.tile
    rows, columns = tile.row_count, global_size(tile.column)
    inside = [self.less(row, rows)] if rows % tile.sizes[0] else []
    if columns % tile.sizes[1]: inside.append(self.less(column, columns))
    guard = self.both(*inside) if len(inside) == 2 else inside[0] if inside else None
    (store,) = [node for node in self.ast.src if node.op is Ops.STORE]
    with self.when(guard) if guard else contextlib.nullcontext(), \
        self.bindings({**self.digits(tile.rows, row), tile.column: column, tile.reduce: total}):
      self.emit_needed(store)

  def render_gemm(self, global_ranges: list[UOp]) -> None:
    """A kernel run as a tiled matrix product (codegen/gpu.py `GemmTile`), through the renderer's primitives:
    `thread_ids`, `index` (i64 arithmetic), `less`, `both`, `when`, `loop`, `local_array`, `local_store`,
    `local_load`, `load_lanes`, `local_store_lanes`, `barrier`, `new_sum`, `add_to_sum`, `sum_value`."""
    from tinyjax.codegen.gpu import TILE_PAD, global_size
    from tinyjax.codegen.opt import accumulator_dtype
    tile = self.launch.tile
    block_rows, block_columns, _, thread_rows, thread_columns = tile.sizes
    across, down = block_columns // thread_columns, block_rows // thread_rows  # work-items along columns, rows
    column, reduce = tile.column, tile.reduce
    rows, columns = tile.row_count, global_size(column)
    value, acc_dtype = reduce.src[0], accumulator_dtype(reduce)
    first_row, first_column = self.gemm_block(global_ranges)
    _, lane = self.thread_ids()
    tx, ty = self.index("rem", lane, across), self.index("div", lane, across)
    my_rows = [self.index("add", first_row, self.index("add", ty, i * down)) for i in range(thread_rows)]
    my_columns = [self.index("add", first_column, self.index("add", tx, j * across)) for j in range(thread_columns)]
    # (rows and columns past the edge compute on the last one's values: loads stay inside the operands)
    clamped_rows = my_rows if rows % block_rows == 0 else [self.index("min", r, rows - 1) for r in my_rows]
    clamped_columns = my_columns if columns % block_columns == 0 else \
        [self.index("min", c, columns - 1) for c in my_columns]
    row_values = [self.digits(tile.rows, r) for r in clamped_rows]
    pitch = {"a": block_rows + TILE_PAD, "b": block_columns + TILE_PAD}
    arrays = {factor: self.local_array(factor.dtype, tile.sizes[2] * pitch[side])
              for side, factors in (("a", tile.a), ("b", tile.b)) for factor in factors}
    accumulators = [[self.new_sum(acc_dtype) for _ in range(thread_columns)] for _ in range(thread_rows)]

    def stage(first_step: str, count: int) -> None:
      """Copy the factors' values of steps [first_step, first_step + count) into the local arrays, [step][row]."""
      for side, factors, outer, first, span in (("a", tile.a, tile.rows, first_row, block_rows),
                                                ("b", tile.b, (column,), first_column, block_columns)):
        def store(factor: UOp, step: str, offset: str, value: str, inside: str | None, side: str = side) -> None:
          slot = self.index("add", self.index("mul", step, pitch[side]), offset)
          self.local_store(arrays[factor], slot, value, factor.dtype)  # (a step past k's end is never read)

        def store_lanes(factor: UOp, step: str, offset: str, values: list[str], side: str = side) -> None:
          slot = self.index("add", self.index("mul", step, pitch[side]), offset)  # (neighbours: one vector store)
          self.local_store_lanes(arrays[factor], slot, values, factor.dtype)
        self.gemm_stage(factors, outer, first, span, first_step, count, store, store_lanes=store_lanes)

    def fold(first_step: str, count: int) -> None:
      """Fold steps [first_step, first_step + count) of the staged values into the accumulators."""
      for step in range(count):
        with self.bindings(self.gemm_k(self.index("add", first_step, step))):
          a_slots = [self.index("add", ty, step * pitch["a"] + i * down) for i in range(thread_rows)]
          b_slots = [self.index("add", tx, step * pitch["b"] + j * across) for j in range(thread_columns)]
          a_values = [{factor: self.local_load(arrays[factor], slot, factor.dtype) for factor in tile.a}
                      for slot in a_slots]
          b_values = [{factor: self.local_load(arrays[factor], slot, factor.dtype) for factor in tile.b}
                      for slot in b_slots]
          for i in range(thread_rows):
            for j in range(thread_columns):
              with self.bindings({**row_values[i], column: clamped_columns[j], **a_values[i], **b_values[j]}):
                part = self.cast(self.emit_needed(value), value.dtype, acc_dtype)
                self.add_to_sum(accumulators[i][j], acc_dtype, part)

    def block(first_step: str, count: int) -> None:
      stage(first_step, count)
      self.barrier()
      fold(first_step, count)
      self.barrier()

    self.gemm_steps(block)
    for i in range(thread_rows):
      for j in range(thread_columns):
        total = self.cast(self.sum_value(accumulators[i][j], acc_dtype), acc_dtype, reduce.dtype)
        self.gemm_store(my_rows[i], my_columns[j], total)

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
