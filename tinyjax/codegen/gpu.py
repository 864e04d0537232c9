"""The GPU kernel model both GPU renderers share (codegen/llvm.py's `render_gpu` for NVPTX, codegen/opencl.py's
`render_opencl` for OpenCL C): how a kernel AST is spread over work-groups and work-items.

A kernel computes `outputs` output elements (the product of its global ranges, less the first `ordered` ones, which
are loops in each work-item: a scatter's batch axes). Two layouts:

  * one work-item per output (`group == 1`): work-item `gid` computes the elements of global index `gid` (the last
    global range varies fastest, so neighbouring work-items touch neighbouring elements: coalesced), its reductions
    are loops inside the work-item. Any work-group size.
  * a work-group per output (`group > 1`, a group reduction): the `group` work-items of work-group `g` compute output
    `g` together. Each top-level REDUCE's first range is dealt out to them (work-item `lane` takes `lane`,
    `lane + group`, ...: neighbouring work-items read neighbouring elements), each folds its share into a partial
    result, and the partials are combined in a tree in local (shared) memory, with a barrier between the levels.
    Every work-item then computes what follows the reductions; work-item 0 alone stores.

A third layout, a tiled matrix product (`GemmTile`, the classic shared-memory GEMM with register blocking): a kernel
whose one REDUCE sums, over a range k, a value made of factors that depend on (row, k) but not the column ("a") and
on (column, k) but not the row ("b") -- `a @ b` and whatever elementwise work is done to its operands; a sum over
several ranges (a convolution's channels and window) takes them as the digits of one k, and the global ranges that
no load of the column reads (a convolution's batch, height and width) as the digits of one row -- runs as
work-groups of BLOCK_ROWS x BLOCK_COLUMNS outputs, each work-item a THREAD_ROWS x THREAD_COLUMNS block of them in
registers. Per step of BLOCK_STEPS values of k, the work-group copies the a factors' BLOCK_ROWS x BLOCK_STEPS values
and the b factors' BLOCK_STEPS x BLOCK_COLUMNS values into local (shared) memory (each work-item a few, neighbouring
work-items reading neighbouring elements), waits at a barrier, and every work-item folds its block's products in
from there (each a value read once per step serves THREAD_COLUMNS or THREAD_ROWS products), then waits again.
Work-item (ty, tx) owns rows ty + i * (BLOCK_ROWS / THREAD_ROWS) and columns tx + j * (BLOCK_COLUMNS /
THREAD_COLUMNS) of its block, so neighbouring work-items store neighbouring columns. Sums are float32 (float64 for
float64) in plain order with fused multiply-adds, as cuBLAS and XLA's GPU GEMMs: not the CPU's float64 blocks.
Rows and columns past the matrix edge compute on the last row or column's values and store nothing; the last, short
step of k stages and folds only its values.
On a device with tensor cores (`mma`: NVIDIA sm_80 and later) a product of two float16 or bfloat16 operands
(`value = float32(a) * float32(b)`, nothing else done to them) runs on them instead (`GemmTile.mma`): the staged
values are the 16-bit operands themselves, and each warp of the work-group computes a WARP_ROWS x WARP_COLUMNS part
of the block as 16 x 8 tiles with `mma.sync.aligned.m16n8k16` (float32 sums; products exact), reading its
fragments from local memory (codegen/llvm.py `render_mma_gemm`); k past its end is staged as zeros.

`gpu_launch` chooses a group reduction when every top-level REDUCE's first range has at least MIN_GROUP_REDUCE steps,
every load it drives reads consecutive elements as it steps, and either each output reads data of its own (every such
load depends on every global range: a row sum, a softmax's max and sum) or there are fewer than FEW_OUTPUTS outputs
(a work-item each would leave the GPU idle). Not for a column sum (its work-items already read neighbouring columns)
nor for a large matmul (its outputs share rows and columns, which the caches serve to neighbouring work-items).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from tinyjax.codegen.opt import (BF16, F16, F32, F64, PERMUTED_STORE_MIN_REDUCE, accumulator_dtype, global_ranges_of,
                                 linear_strides)
from tinyjax.uop import Ops, UOp

GROUP_SIZE = 256  # work-items of a group reduction (fewer when the reduction is shorter)
MIN_GROUP_REDUCE = 64  # shorter reductions stay loops in a work-item
FEW_OUTPUTS = 4096  # fewer outputs than this get a group each even when they share their data


# a tiled matrix product's blocks (see the module docstring): big ones where they make enough work-groups to fill a
# GPU, else small ones; shorter rows or columns than MIN_TILE_SIDE, or fewer than MIN_TILE_OUTPUTS outputs, stay
# one work-item per output
# (float32 4096^3 on an H200, TFLOP/s: 128x128x16 34.4, 128x128x8 32.9, 64x128x8 31.3)
BIG_TILE = (128, 128, 16, 8, 8)  # block rows, block columns, block steps, thread rows, thread columns: 256 work-items
SMALL_TILE = (64, 64, 8, 4, 4)  # 256 work-items
MIN_BIG_TILE_GROUPS = 128
MIN_TILE_SIDE = 32
MIN_TILE_OUTPUTS = 1 << 14
TILE_PAD = 4  # local arrays' rows are padded: a step's writes of 8 values of k x 4 rows hit different banks
# tensor-core blocks: block rows, block columns, block steps, warps along the rows, warps along the columns (each warp
# (block rows / warps) x (block columns / warps) of 16 x 8 mma tiles): 8 warps of 64 x 32, or 4 of 32 x 32. On an
# H200, bfloat16 4096^3 (TFLOP/s, one run): 128x128x64 155, 256x128x32 (8 warps of 64x64) 137, 128x128x32 135,
# 128x256x32 125; 8192^3: 256x128x32 143, 128x128x32 140; 1024^3: 64x64x32 55, 256x128x32 30 (its 32 work-groups
# leave most SMs idle)
BIG_MMA_TILE = (128, 128, 64, 2, 4)
SMALL_MMA_TILE = (64, 64, 32, 2, 2)
MMA_PAD = 8  # 16-bit elements a row of k is padded by: a warp's fragment reads (8 rows x 4 pairs) hit 32 banks
MMA_VECTOR = 8  # 16-bit elements a work-item stages with one 16-byte load, where the operand's layout allows


class GemmTile(NamedTuple):
  """A kernel run as a tiled matrix product (module docstring): the REDUCE, the global ranges of its row (digits,
  the fastest last) and its column, the factors staged through local memory, the block sizes, and the summed ranges
  (`ks`)."""
  reduce: UOp
  rows: tuple[UOp, ...]
  column: UOp
  a: tuple[UOp, ...]  # maximal subexpressions of the REDUCE's value over (row, k), not the column
  b: tuple[UOp, ...]  # over (column, k), not the row
  sizes: tuple[int, int, int, int, int]  # BLOCK_ROWS, BLOCK_COLUMNS, BLOCK_STEPS, THREAD_ROWS, THREAD_COLUMNS
  mma: str = ""  # on tensor cores: the operands' PTX type ("bf16", "f16"), sizes then end in warps, not work-items
  ks: tuple[UOp, ...] = ()  # the REDUCE's ranges as the digits of one step index k, the fastest last

  @property
  def k(self) -> UOp:
    """The fastest of the ranges summed over (the only one of a matrix product's)."""
    return self.ks[-1]

  @property
  def steps(self) -> int: return math.prod(global_size(rng) for rng in self.ks)

  @property
  def row_count(self) -> int: return math.prod(global_size(rng) for rng in self.rows)

  @property
  def row_blocks(self) -> int: return -(-self.row_count // self.sizes[0])

  @property
  def column_blocks(self) -> int: return -(-global_size(self.column) // self.sizes[1])

  @property
  def threads(self) -> int:
    block_rows, block_columns, _, down, across = self.sizes
    return down * across * 32 if self.mma else block_rows // down * (block_columns // across)

  def __str__(self) -> str:
    block_rows, block_columns, steps, down, across = self.sizes
    if self.mma: return f"{block_rows}x{block_columns}x{steps} on tensor cores ({self.mma}), {down}x{across} warps"
    return f"{block_rows}x{block_columns}x{steps} tiles of {down}x{across}"


def vector_axis(operand: UOp, axes: tuple[UOp, ...], lanes: int) -> UOp | None:
  """The first of `axes` along which load `operand` can be read `lanes` elements at a time with aligned vector loads
  wherever a tiled product's work-group reads (from a multiple of `lanes` along it): a plain load, contiguous along
  it, the axis's length, the other strides and the offset multiples of `lanes` (buffers start 256-byte aligned);
  None if none."""
  if operand.op is not Ops.LOAD or len(operand.src) != 2: return None
  strides, nonlinear = linear_strides(operand.src[1])
  offset = _evaluate(operand.src[1], {})
  if nonlinear or offset is None or offset % lanes: return None
  for axis in axes:
    if strides.get(axis) == 1 and global_size(axis) % lanes == 0 and \
        all(stride % lanes == 0 for rng, stride in strides.items() if rng is not axis):
      return axis
  return None


def _mma_type(a: tuple[UOp, ...], b: tuple[UOp, ...], value: UOp) -> str:
  """The PTX type of a product's 16-bit operands when it can run on tensor cores (module docstring), else ''."""
  if len(a) != 1 or len(b) != 1 or value.op is not Ops.MUL or set(value.src) != {a[0], b[0]}: return ""
  if any(f.op is not Ops.CAST or f.dtype != F32 for f in (a[0], b[0])): return ""
  narrow = a[0].src[0].dtype
  return {BF16: "bf16", F16: "f16"}.get(narrow, "") if b[0].src[0].dtype == narrow else ""


class GpuLaunch(NamedTuple):
  """How a GPU kernel runs: `outputs` output elements, `group` work-items for each (1: one work-item per output);
  with a `tile`, `outputs` work-groups of `group` work-items, each a block of the tiled matrix product."""
  outputs: int
  group: int = 1
  tile: GemmTile | None = None

  @property
  def work_items(self) -> int: return self.outputs * self.group

  @property
  def group_reduction(self) -> bool:
    """Whether each work-group computes one output, its reductions shared out (not a tiled product's block)."""
    return self.group > 1 and self.tile is None

  def __str__(self) -> str:
    if self.tile is not None: return f"groups={self.outputs}x{self.group} gemm {self.tile}"
    return f"groups={self.outputs}x{self.group}" if self.group > 1 else f"work-items={self.outputs}"


def global_size(rng: UOp) -> int:
  if rng.src[0].op is not Ops.CONST:
    raise NotImplementedError("codegen: a GPU kernel's global ranges need constant sizes")
  return int(rng.src[0].arg)


def top_reduces(ast: UOp) -> list[UOp]:
  """The REDUCEs not inside another REDUCE's value (the ones a group reduction shares out)."""
  reduces = [n for n in ast.toposort if n.op is Ops.REDUCE and len(n.src) > 1]
  nested = {inner for outer in reduces for inner in outer.src[0].toposort if inner.op is Ops.REDUCE}
  return [n for n in reduces if n not in nested]


def _evaluate(node: UOp, env: dict[UOp, int]) -> int | None:
  """The value of integer index arithmetic `node` with the RANGEs set by `env` (others 0); None if it holds anything
  else."""
  memo: dict[UOp, int | None] = {}
  for n in node.toposort:
    values = [memo[s] for s in n.src]
    if any(v is None for v in values): memo[n] = None
    elif n.op is Ops.CONST and isinstance(n.arg, (int, bool)): memo[n] = int(n.arg)
    elif n.op is Ops.RANGE: memo[n] = env.get(n, 0)
    elif n.op is Ops.ADD: memo[n] = values[0] + values[1]
    elif n.op is Ops.MUL: memo[n] = values[0] * values[1]
    elif n.op is Ops.IDIV and values[1]: memo[n] = int(values[0] / values[1])
    elif n.op is Ops.MOD and values[1]: memo[n] = int(math.fmod(values[0], values[1]))
    elif n.op is Ops.NEG: memo[n] = -values[0]
    elif n.op is Ops.MAX: memo[n] = max(values)
    elif n.op is Ops.CMPLT: memo[n] = int(values[0] < values[1])
    elif n.op is Ops.WHERE: memo[n] = values[1] if values[0] else values[2]
    elif n.op is Ops.CAST: memo[n] = values[0]
    else: memo[n] = None
  return memo[node]


def _steps_by_one(index: UOp, rng: UOp) -> bool:
  """Whether `index` moves by exactly one element for each step of `rng` (checked at the first few steps)."""
  values = [_evaluate(index, {rng: step}) for step in range(4)]
  return None not in values and all(b - a == 1 for a, b in zip(values, values[1:]))


def _staged_factors(value: UOp, rows: tuple[UOp, ...], column: UOp, ks: tuple[UOp, ...]
                    ) -> tuple[list[UOp], list[UOp]] | None:
  """The maximal subexpressions of `value` over (row, k) without the column, and over (column, k) without the row;
  None if some load depends on both (no product of two operands) or a subexpression is boolean."""
  a: list[UOp] = []
  b: list[UOp] = []
  seen: set[UOp] = set()
  stack = [value]
  while stack:
    node = stack.pop()
    if node in seen: continue
    seen.add(node)
    ranges = {n for n in node.toposort if n.op is Ops.RANGE}
    row = not ranges.isdisjoint(rows)
    if ranges.isdisjoint(ks) or not row and column not in ranges: continue
    if row and column in ranges:
      if node.op in (Ops.LOAD, Ops.REDUCE): return None
      stack.extend(node.src)
      continue
    if node.dtype == np.dtype(bool): return None
    (a if row else b).append(node)
  return (a, b) if a and b else None


def gemm_tile(ast: UOp, mma: bool = False) -> GemmTile | None:
  """The tiled matrix product of kernel `ast` (module docstring), or None when it is not one: one STORE whose value
  holds the kernel's one REDUCE, a float sum of factors of a row and of a column (the last global range, contiguous
  in the STORE unless the sum is long) as `_staged_factors` finds them, at least MIN_TILE_SIDE rows and columns."""
  nodes = ast.toposort
  stores = [n for n in nodes if n.op is Ops.STORE]
  reduces = [n for n in nodes if n.op is Ops.REDUCE]
  if len(stores) != 1 or len(reduces) != 1: return None
  (store,), (reduce,) = stores, reduces
  if reduce.arg is not Ops.ADD or len(reduce.src) < 2 or reduce not in store.src[2].toposort: return None
  if reduce.dtype not in (F16, BF16, F32, F64) or accumulator_dtype(reduce) not in (F32, F64): return None
  global_ranges = global_ranges_of(ast)
  if len(global_ranges) < 2 or any(rng.src[0].op is not Ops.CONST for rng in global_ranges): return None
  column, ks = global_ranges[-1], tuple(reduce.src[1:])
  if any(k.src[0].op is not Ops.CONST for k in ks): return None
  # the STORE contiguous along the column (coalesced), or a long sum stored permuted (lower/schedule.py
  # `_contraction_order`: a channels-first convolution's output, one write instead of a product and its transpose)
  if linear_strides(store.src[1])[0].get(column) != 1 and \
      math.prod(global_size(k) for k in ks) < PERMUTED_STORE_MIN_REDUCE: return None
  column_loads = [n for n in reduce.src[0].toposort if n.op is Ops.LOAD and column in n.src[1].toposort]
  rows = tuple(rng for rng in global_ranges[:-1] if not any(rng in load.src[1].toposort for load in column_loads))
  if not rows or (factors := _staged_factors(reduce.src[0], rows, column, ks)) is None: return None
  # several ranges (a convolution's channels and window) are one step index, the one the a factors' loads read with
  # the smallest stride (the channels) fastest
  strides: dict[UOp, int] = {}
  for load in (n for factor in factors[0] for n in factor.toposort if n.op is Ops.LOAD):
    for rng, stride in linear_strides(load.src[1])[0].items(): strides[rng] = min(strides.get(rng, stride), abs(stride))
  ks = tuple(sorted(ks, key=lambda k: -strides.get(k, 0)))
  row_count, columns = math.prod(global_size(rng) for rng in rows), global_size(column)
  outputs = math.prod(global_size(rng) for rng in global_ranges)
  if row_count < MIN_TILE_SIDE or columns < MIN_TILE_SIDE or outputs < MIN_TILE_OUTPUTS: return None
  batch = outputs // (row_count * columns)
  a, b = tuple(factors[0]), tuple(factors[1])
  tensor = _mma_type(a, b, reduce.src[0]) if mma and accumulator_dtype(reduce) == F32 else ""
  big, small = (BIG_MMA_TILE, SMALL_MMA_TILE) if tensor else (BIG_TILE, SMALL_TILE)
  # (big blocks where they fill the GPU and are filled: 64 output channels of a convolution are half a big block)
  big_groups = batch * -(-row_count // big[0]) * -(-columns // big[1])
  use_big = big_groups >= MIN_BIG_TILE_GROUPS and row_count >= big[0] and columns >= big[1]
  return GemmTile(reduce, rows, column, a, b, big if use_big else small, tensor, ks)


def gpu_launch(ast: UOp, ordered: int = 0, groups: bool = True, mma: bool = False) -> GpuLaunch:
  """The launch of kernel `ast` (see the module docstring); `groups=False`: never a group reduction nor a tiled
  matrix product (a device whose work-items can't wait for each other); `mma`: the device has tensor cores."""
  spread = global_ranges_of(ast)[ordered:]
  outputs = math.prod(global_size(rng) for rng in spread)
  reduces = top_reduces(ast)
  if not groups or ordered or not reduces: return GpuLaunch(outputs)
  if (tile := gemm_tile(ast, mma)) is not None:  # (a work-group per block, for each value of the other ranges)
    batch = outputs // (tile.row_count * global_size(tile.column))
    return GpuLaunch(batch * tile.row_blocks * tile.column_blocks, tile.threads, tile)
  shortest = None
  for node in reduces:
    first = node.src[1]
    if first.src[0].op is not Ops.CONST or first.src[0].arg < MIN_GROUP_REDUCE: return GpuLaunch(outputs)
    loads = [n for n in node.src[0].toposort if n.op is Ops.LOAD and first in n.src[1].toposort]
    if not loads or not all(_steps_by_one(load.src[1], first) for load in loads): return GpuLaunch(outputs)
    shared = any(rng not in load.src[1].toposort for load in loads for rng in spread)
    if shared and outputs >= FEW_OUTPUTS: return GpuLaunch(outputs)
    shortest = first.src[0].arg if shortest is None else min(shortest, first.src[0].arg)
  return GpuLaunch(outputs, min(GROUP_SIZE, 1 << (shortest.bit_length() - 1)))
