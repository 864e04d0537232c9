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

`gpu_launch` chooses a group reduction when every top-level REDUCE's first range has at least MIN_GROUP_REDUCE steps,
every load it drives reads consecutive elements as it steps, and either each output reads data of its own (every such
load depends on every global range: a row sum, a softmax's max and sum) or there are fewer than FEW_OUTPUTS outputs
(a work-item each would leave the GPU idle). Not for a column sum (its work-items already read neighbouring columns)
nor for a large matmul (its outputs share rows and columns, which the caches serve to neighbouring work-items).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from tinyjax.codegen.opt import global_ranges_of
from tinyjax.uop import Ops, UOp

GROUP_SIZE = 256  # work-items of a group reduction (fewer when the reduction is shorter)
MIN_GROUP_REDUCE = 64  # shorter reductions stay loops in a work-item
FEW_OUTPUTS = 4096  # fewer outputs than this get a group each even when they share their data


class GpuLaunch(NamedTuple):
  """How a GPU kernel runs: `outputs` output elements, `group` work-items for each (1: one work-item per output)."""
  outputs: int
  group: int = 1

  @property
  def work_items(self) -> int: return self.outputs * self.group

  def __str__(self) -> str:
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


def gpu_launch(ast: UOp, ordered: int = 0, groups: bool = True) -> GpuLaunch:
  """The launch of kernel `ast` (see the module docstring); `groups=False`: never a group reduction (a device whose
  work-items can't wait for each other)."""
  spread = global_ranges_of(ast)[ordered:]
  outputs = math.prod(global_size(rng) for rng in spread)
  reduces = top_reduces(ast)
  if not groups or ordered or not reduces: return GpuLaunch(outputs)
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
