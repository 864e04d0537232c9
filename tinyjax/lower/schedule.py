"""Fusion and rangeify: an array-level UOp program becomes a list of kernels.

The program is a SINK over its outputs, with PARAM leaves for its inputs (lazy arrays are normalised to this form
by realize.py, jit traces straight into it). First, a long reduction with fewer outputs than threads becomes two
stages, partial results then their reduction, so that it runs on every core (split.py). Fusion then decides which
nodes become buffers:
  - every output, every CONTIGUOUS node and every SCATTER;
  - a reduction whose result is broadcast (EXPAND) before it is used, or read by a GATHER that reads more elements
    than it has (so some repeat): computing it inside its consumer would redo it for every element that reads it.
Everything else (elementwise chains, movement, gathers, reductions consumed without a broadcast) fuses into the
kernel of the buffer that consumes it. Rangeify then turns each kernel into scalar code: the output's index space
becomes RANGE loops, movement ops become index arithmetic (lower/symbolic.py folds it), reductions become REDUCE
loops, reads of buffers become LOADs, and a GATHER's indices are loaded values in the index of its operand's loads.

A SCATTER is two kernels over its buffer: a copy of the operand, then one sequential loop over the updates that
loads each target element, combines the update into it and stores it back (in order, so duplicate indices accumulate
and the last `set` wins, deterministically).
"""
from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import numpy as np

from tinyjax.codegen.gpu import gemm_tile
from tinyjax.codegen.opt import (BF16, F16, F32, SWEEP_COLUMNS, SWEEP_ROWS, VECTOR_UNARY, TilePlan, choose_opts,
                                 global_ranges_of, launch_grain, linear_strides, per_outer_value, permuted_store_pays,
                                 reads_across_rows, tile_geometry)
from tinyjax.devices import cpu_threads
from tinyjax.lower import symbolic
from tinyjax.lower.split import NARROW_COLUMN, SPLIT_MIN_CHUNK_WORK, leaves_threads_uneven, split_reductions
from tinyjax.uop import (BOOL, ELEMENTWISE, INDEX_DTYPE, MOVEMENT, Ops, PatternMatcher, ScatterArg, UOp, UPat, arg_key,
                         graph_rewrite, toposort_of)

REDUCE_IDENTITY = {Ops.ADD: 0, Ops.MUL: 1}
LOOPS = (Ops.SCAN, Ops.WHILE, Ops.COND, Ops.CALLBACK)  # control flow and host calls: operands read from buffers
COUNTER_DTYPE = np.dtype(np.int32)
# a kernel is split across threads only when it does at least this many loop iterations in all: below it, waking
# the workers costs more than the work
PARALLEL_MIN_WORK = 1 << 15


@dataclass(frozen=True)
class Kernel:
  """One fused kernel: its AST (a SINK of STOREs), the buffer slot of each DEFINE_GLOBAL, and its launch size."""
  name: str
  ast: UOp
  slots: tuple[int, ...]  # DEFINE_GLOBAL i reads/writes buffer slot slots[i]; parameter 0 is the output
  outer_size: int         # iterations of the outermost global range (1 when there is none)
  work: int               # loop iterations in all (outer x inner x reduce), to decide on threading
  grain: int = 1          # launch chunks keep this many outer iterations together (the codegen's tile, opt.py)
  sequential: bool = False  # iterations must run in order on one thread (a scatter's read-modify-write loop)
  # how many of the outermost global ranges carry that order (a scatter's batch axes: updates of different batch
  # indices may hit one element; and its window axes up to the last along which windows can overlap): a GPU runs
  # them as loops inside each work-item
  ordered: int = 0

  @property
  def parallel(self) -> bool:
    return not self.sequential and self.work >= PARALLEL_MIN_WORK and self.outer_size > self.grain


@dataclass(frozen=True)
class Loop:
  """Steps the runtime runs repeatedly, inside the one call that runs the program: `body` `trip` times, or (`trip`
  None) while the bool scalar in slot `flag_slot`, which the `cond` steps compute before each pass, is true. A counted
  loop with a `counter_slot` (an int32 scalar) gets the pass number, 0, 1, ..., written there by the runtime before
  each pass (a scan's body reads its slice of xs at it): no kernels to set and step a counter."""
  body: tuple[Kernel | Loop, ...]
  trip: int | None = None
  cond: tuple[Kernel | Loop, ...] = ()
  flag_slot: int = -1
  counter_slot: int = -1


@dataclass(frozen=True)
class Switch:
  """Steps of which the runtime runs one: the branch whose number is the int32 scalar in slot `index_slot`
  (clamped into range)."""
  index_slot: int
  branches: tuple[tuple[Kernel | Loop | Switch, ...], ...]


@dataclass(frozen=True)
class HostCall:
  """A host function (`pure_callback`) the runtime calls between kernels: `callback.run` gets the values of slots
  `slots[:n_in]` as numpy arrays and its results are written into slots `slots[n_in:]`."""
  name: str
  callback: Any
  slots: tuple[int, ...]
  n_in: int
  avals: tuple[tuple[tuple[int, ...], np.dtype], ...] = ()  # (shape, dtype) of each slot, in `slots` order


def kernels_of(steps: tuple) -> list[Kernel]:
  """Every kernel of a schedule's steps, loops' conditions and bodies and every branch included, in order."""
  out: list[Kernel] = []
  for step in steps:
    if isinstance(step, Loop): out += kernels_of(step.cond) + kernels_of(step.body)
    elif isinstance(step, Switch): out += [kernel for branch in step.branches for kernel in kernels_of(branch)]
    elif isinstance(step, Kernel): out.append(step)
  return out


def natives_of(steps: tuple) -> list:
  """The compiled kernels (HostCallback's `native`) of a schedule's host steps, loops and branches included."""
  out: list = []
  for step in steps:
    if isinstance(step, HostCall) and step.callback.native is not None: out.append(step.callback.native)
    elif isinstance(step, Loop): out += natives_of(step.cond) + natives_of(step.body)
    elif isinstance(step, Switch): out += [native for branch in step.branches for native in natives_of(branch)]
  return out


def has_host_calls(steps: tuple) -> bool:
  """Whether a schedule's steps (loops and branches included) call a host function."""
  for step in steps:
    if isinstance(step, HostCall): return True
    if isinstance(step, Loop) and has_host_calls((*step.cond, *step.body)): return True
    if isinstance(step, Switch) and any(has_host_calls(branch) for branch in step.branches): return True
  return False


@dataclass(frozen=True)
class Schedule:
  """A program's steps (kernels and loops of steps) over numbered buffer slots: slots [0, n_inputs) are the inputs
  in PARAM order, the rest are allocated per run with `slot_specs` (shape, dtype). `outputs` names the slot of each
  program output."""
  kernels: tuple[Kernel | Loop, ...]
  n_inputs: int
  slot_specs: tuple[tuple[tuple[int, ...], np.dtype], ...]
  outputs: tuple[int, ...]


def structure_key(root: UOp) -> str:
  """A hash of a graph's structure that is stable across processes (for names and the persistent caches)."""
  index: dict[UOp, int] = {}
  lines = []
  for node in root.toposort:
    index[node] = len(index)
    arg = node.arg.name if isinstance(node.arg, Ops) else node.arg
    lines.append(f"{node.op.name}|{_dtype_name(node.dtype)}|{[index[s] for s in node.src]}|{arg!r}\n")
  return hashlib.sha256("".join(lines).encode()).hexdigest()


@functools.cache
def _dtype_name(dtype: np.dtype) -> str:
  """A dtype's name (the str of every float8 type is '<V1'), looked up once: numpy's `dtype.name` is Python code."""
  return dtype.name


def _is_expanding(node: UOp) -> bool:
  return node.op is Ops.EXPAND and node.src[0].shape != node.shape


# An elementwise value read through a broadcast is computed once per broadcast element when fused: worth a buffer
# of its own when it contains one of these (or more than RECOMPUTE_OP_LIMIT ops), e.g. tanh's derivative feeding the
# contraction of a gradient, which would otherwise be evaluated M*N*K times instead of M*K (and unrolled into every
# register tile of the contraction). Not a scalar (Adam's bias corrections 1 / (1 - b1 ** count), a mean's 1 / n):
# it depends on no loop, so the renderer computes it once per kernel, before the loops, in every kernel that reads it
# (a kernel of its own cost more: a launch per step, a compile, and a break between the elementwise kernels that
# `merge_elementwise` would have merged, such as Adam's updates of one parameter).
COSTLY_OPS = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.SQRT, Ops.RECIP, Ops.FDIV, Ops.POW, Ops.IDIV, Ops.MOD}
RECOMPUTE_OP_LIMIT = 8
# Any elementwise operand of a reduction that reads each of its elements more than REREAD_LIMIT times (through a
# broadcast: relu(x @ w1 + b1) feeding `@ w2`, read once per output column) gets a buffer of its own, computed by the
# kernel that produces it: fused, even one op per element sits in the inner loop of the contraction's register tile
# beside its FMAs (the MLP's second layer forward ran at 106 GFLOP/s with the bias and ReLU of the first fused into
# it, 159 without).
REREAD_LIMIT = 64
# A kernel computes at most MAX_FUSED_DEPTH operations in a row: a longer chain (an eager loop of a few hundred
# updates, an unrolled recurrence) gets a buffer every MAX_FUSED_DEPTH elementwise operations. `_Rangeify.emit`
# builds a kernel by recursion over its operations, three Python frames each, under Python's limit of 1000; a chain
# of 400 fused operations raised RecursionError.
MAX_FUSED_DEPTH = 200
# Movement ops that read their operand at other places than the output's (a shift: `x[1:]`, a pad, a reversal).
SHIFTING = {Ops.PAD, Ops.SHRINK, Ops.FLIP}


def _read_shifted(sink: UOp, realize: set[UOp]) -> set[UOp]:
  """The reductions some of whose users read them shifted (through a pad, a slice, a reversal, under reshapes) and
  others not, or shifted differently: fused into one kernel, each place would compute the whole reduction again (a
  cumsum's first step `x + shifted(x)` of a matmul x: the matmul twice per element, in a plain loop nest, 658 ms
  against 8 for JAX's whole step). And the contractions read shifted at all, also through elementwise operations
  and permutes (the output gradient of a convolution after a ReLU, masked by its output, then padded): fused into
  the shifted reader's kernel, a gated loop nest over the padded shape, they get no register tile (a small NCHW CNN's
  step 3 -> 60 ms)."""
  users: dict[UOp, list[UOp]] = {}
  for node in sink.toposort:
    for src in node.src: users.setdefault(src, []).append(node)
  found = set()
  for node in users:
    if node.op is not Ops.REDUCE_AXIS: continue
    readers, stack = set(), [node]
    while stack:
      for user in users.get(stack.pop(), ()):
        if user.op is Ops.RESHAPE: stack.append(user)
        else: readers.add(user)
    if len(readers) > 1 and any(reader.op in SHIFTING for reader in readers): found.add(node)
    elif _is_contraction(node, realize) and _tiles_rows(node):
      top = node  # (its layout as read: the permutes and reshapes it is read through alone, `_contraction_order`)
      while len(above := users.get(top, ())) == 1 and above[0].op in (Ops.RESHAPE, Ops.PERMUTE): top = above[0]
      stack, seen = [node], set()
      while stack and top not in found:
        for user in users.get(stack.pop(), ()):
          if user.op in SHIFTING: found.add(top)
          elif user not in seen and user not in realize and (user.op in ELEMENTWISE or
                                                             user.op in (Ops.RESHAPE, Ops.PERMUTE)):
            seen.add(user)
            stack.append(user)
  return found


def _is_costly(node: UOp, realize: set[UOp], cost: dict[UOp, tuple[bool, int]]) -> bool:
  """Whether the fused elementwise computation of `node` (down to buffers) is too expensive to redo per broadcast
  element. `cost` memoises (has a costly op, op count) per node."""
  stack = [node]
  while stack:
    current = stack[-1]
    if current in cost: stack.pop(); continue
    inputs = [s for s in current.src if s not in realize and s.op is not Ops.PARAM]
    if missing := [s for s in inputs if s not in cost]: stack.extend(missing); continue
    stack.pop()
    is_op = current.op in ELEMENTWISE
    has_costly = (current.op in COSTLY_OPS) or any(cost[s][0] for s in inputs)
    cost[current] = (has_costly, int(is_op) + sum(cost[s][1] for s in inputs))
  has_costly, count = cost[node]
  return has_costly or count > RECOMPUTE_OP_LIMIT


def _is_contraction(node: UOp, realize: set[UOp]) -> bool:
  """Whether a reduction reads a broadcast (a matmul-like contraction, which codegen tiles into registers: an
  expensive epilogue fused after it would be unrolled into every register of the tile, so it gets its own kernel)."""
  stack, seen = [node.src[0]], set()
  while stack:
    current = stack.pop()
    if current in seen or current in realize or current.op is Ops.PARAM: continue
    seen.add(current)
    if _is_expanding(current): return True
    stack.extend(current.src)
  return False


# Costly operations a register tile's epilogue computes on its accumulator vectors, in float32 (codegen/llvm.py
# `vector_epilogue_ok`): fused after a contraction they cost a few vector instructions per tile row, not a kernel
# that reads the contraction's result back (tanh(x @ w): 1.10 -> 0.95 ms at 512^3). A contraction below a reduction
# (a loss summed over its logits) is always a buffer of its own: inside the reduction it would be a nested loop, not a
# tile (((g @ w) ** 2).sum() at 512^3: 58 ms, against 1 ms as a GEMM kernel and a sum).
VECTOR_COSTLY = (COSTLY_OPS & VECTOR_UNARY) | {Ops.FDIV}
NOT_COSTLY, VECTOR_COSTLY_LEVEL, SCALAR_COSTLY = 0, 1, 2


def _costliness(node: UOp) -> int:
  if node.op not in COSTLY_OPS: return NOT_COSTLY
  return VECTOR_COSTLY_LEVEL if node.op in VECTOR_COSTLY and node.dtype == np.dtype(np.float32) else SCALAR_COSTLY


def _tiles_rows(reduction: UOp) -> bool:
  """Whether a contraction's output has more than one axis longer than 1 (rows to tile in registers, with its
  epilogue unrolled into every register of the tile). A vector-matrix product (an RNN step's h @ w) has one: its
  epilogue (tanh) runs once per output element, vectorised, in the same kernel."""
  return sum(extent > 1 for extent in reduction.shape) > 1


def _widened_load(node: UOp, realize: set[UOp], gpu: bool) -> bool:
  """A bfloat16 buffer read as float32 (a contraction's operand): a shift where it is read, and what AMX tiles read
  directly (codegen/opt.py `_amx_plan`), so never a float32 copy of its own; on a GPU also a float16 one: one
  conversion instruction where it is read, and what tensor cores read (codegen/gpu.py), seen through movement ops
  (a transposed operand: GPU tiles read any layout)."""
  source = node.src[0] if node.op is Ops.CAST else None
  while gpu and source is not None and source.op in MOVEMENT and source not in realize: source = source.src[0]
  narrow = (BF16, F16) if gpu else (BF16,)
  return source is not None and node.dtype == np.dtype(np.float32) and source.dtype in narrow and \
      (source.op is Ops.PARAM or source in realize)


EARLY_OUTPUT_FRACTION = 0.75


# A reduction over a kernel's trailing axes that the kernel reads broadcast back along them (softmax's max and sum,
# layernorm's mean and variance) stays in that kernel: its loop nest has those axes innermost, so the reduction is
# computed once per row, before the row's loop, and the row is read again from the cache (`_row_reduction`). Only
# for rows of ROW_FUSE_MIN to ROW_FUSE_BYTES (per operand), and on the CPU: a short row's reductions cost little as
# kernels of their own, and fused into a classifier's 10-wide loss gradient (whose kernel the scheduler then lays out
# transposed, the row innermost) they were recomputed per element, in a kernel that took 161 ms to compile.
ROW_FUSE_MIN, ROW_FUSE_BYTES = 64, 1 << 16


def _row_reduction(expand: UOp, space: tuple[int, ...], root: UOp) -> tuple[int, ...] | None:
  """The axes an EXPAND broadcasts a per-row value along, when they are the trailing axes of the kernel's iteration
  `space` (and the kernel, if a reduction, reduces exactly those axes) and a row is short enough; else None."""
  source, shape = expand.src[0].shape, expand.shape
  if shape != space or len(source) != len(shape): return None
  axes = tuple(i for i, (a, b) in enumerate(zip(source, shape)) if a != b)
  if not axes or axes != tuple(range(axes[0], len(shape))) or any(source[i] != 1 for i in axes): return None
  if root.op is Ops.REDUCE_AXIS and tuple(root.arg[1]) != axes: return None
  # (rows to launch over: without them, each launch chunk would compute a whole-array reduction again)
  row, rows = math.prod(shape[axes[0]:]), math.prod(shape[:axes[0]])
  return axes if rows > 1 and ROW_FUSE_MIN <= row and row * 8 <= ROW_FUSE_BYTES else None


def find_buffers(sink: UOp, gpu: bool = False) -> list[UOp]:
  """The nodes that become buffers (kernel outputs), in an order where producers come before consumers. On the CPU
  per-row reductions stay in the kernels that read them (`_row_reduction`; its loop nests compute them once per row,
  where a GPU's work-item per output would compute them once per element); on a GPU float16 operands are read where
  they are used, as bfloat16 ones everywhere (`_widened_load`)."""
  realize = {out for out in sink.src if out.op is not Ops.PARAM}
  realize |= {node for node in sink.toposort if node.op in (Ops.CONTIGUOUS, Ops.SCATTER, Ops.PROJECT)}
  realize |= _read_shifted(sink, realize)
  # a loop reads its operands from buffers
  realize |= {src for node in sink.toposort if node.op in LOOPS for src in node.src if src.op is not Ops.PARAM}
  # kernels are explored in the program's order, never a set's: what is fused where must not depend on where the
  # nodes happen to lie in memory (a set of nodes iterates in address order; two processes lowering one program
  # once made 30 and 31 kernels)
  order = {node: position for position, node in enumerate(sink.toposort)}
  pending, visited, cost = sorted(realize, key=order.__getitem__), set(), {}
  regions = _Regions(realize, order)
  while pending:
    kernel_root = pending.pop()
    # (node, read through a broadcast, below how costly an op (_costliness), below a reduction, reread > REREAD_LIMIT
    # times by one, the axes of a per-row broadcast above it (`_row_reduction`) or None)
    root_state = (False, _costliness(kernel_root), kernel_root.op is Ops.REDUCE_AXIS, False, None)
    space = kernel_root.src[0].shape if kernel_root.op is Ops.REDUCE_AXIS else kernel_root.shape
    # (a PROJECT is written by its loop, not by a kernel: nothing to walk; but the passes below still run when it is
    # the last root: skipping them left a contraction computed in two kernels, one of them its reader's epilogue,
    # whose rounding differed, so relu's derivative (x == max(x, 0)) came out 0 in a data-parallel step over MPI)
    stack = [] if kernel_root.op is Ops.PROJECT else [(src, *root_state) for src in kernel_root.src]
    while stack:
      state = stack.pop()
      node, expanded, costly_above, reduced, reread, row = state
      if state in visited or node.op is Ops.PARAM: continue
      visited.add(state)
      if node in realize: continue
      if row is not None:  # below a per-row broadcast: elementwise per-row values, and the row's reduction
        if node.op is Ops.REDUCE_AXIS and tuple(node.arg[1]) == row and node.src[0].shape == space:
          stack.extend((src, False, costly_above, True, reread, None) for src in node.src)
          continue
        if node.op in ELEMENTWISE or node.op is Ops.CONST:
          stack.extend((src, expanded, costly_above, reduced, reread, row) for src in node.src)
          continue
        expanded, row = True, None  # anything else: as any broadcast
      if expanded and (node.op is Ops.REDUCE_AXIS or (node.op in ELEMENTWISE and math.prod(node.shape) > 1 and
                                                      not _widened_load(node, realize, gpu) and
                                                      (reread or _is_costly(node, realize, cost)))) or \
          ((costly_above == SCALAR_COSTLY or reduced) and node.op is Ops.REDUCE_AXIS and
           _is_contraction(node, realize) and _tiles_rows(node)):
        realize.add(node)
        pending.append(node)
        continue
      if node.op is Ops.PAD:
        padded = _padded_reductions(node, realize)
        realize.update(padded)
        pending.extend(padded)
      if _is_expanding(node):
        if not gpu and not expanded and (row := _row_reduction(node, space, kernel_root)) is not None:
          stack.extend((src, expanded, costly_above, reduced, reread, row) for src in node.src)
          continue
        expanded = True
        reread = reread or (reduced and math.prod(node.shape) > REREAD_LIMIT * math.prod(node.src[0].shape))
      costly_above = max(costly_above, _costliness(node))
      reduced = reduced or node.op is Ops.REDUCE_AXIS
      if node.op is Ops.GATHER:
        # its operand is read at data-dependent places, possibly many times: as through a broadcast, unless the gather
        # reads fewer elements than the operand has (then computing them where they are read costs less in any case)
        operand, indices = node.src
        rereads = math.prod(node.shape) > math.prod(operand.shape)
        stack.extend([(operand, expanded or rereads, costly_above, reduced, reread, None),
                      (indices, expanded, costly_above, reduced, reread, None)])
      else:
        stack.extend((src, expanded, costly_above, reduced, reread, None) for src in node.src)
    if not pending:
      pending = _shared_reductions(regions) or _sibling_contractions(regions) or \
          _costly_epilogue_contractions(regions) or _shared_elementwise(regions)
      realize.update(pending)
  _bound_depth(sink, realize)
  return [node for node in _outputs_first(sink) if node in realize]


# A reduction read through a PAD (a slice's or an index's transpose: the gradient of `params[i]`, or `jnp.pad` of a
# sum) is computed by a kernel of its own when it sums at least PADDED_REDUCE_MIN values per output: fused, its loops
# sat behind the pad's gate in the reader's loop nest, scalar and on one thread (the gradient of three scalars read
# from a parameter vector, each a sum over 128 x 24 x 24 values: one kernel of three gated sums, 3.6 ms).
PADDED_REDUCE_MIN = 256


def _padded_reductions(pad: UOp, realize: set[UOp]) -> list[UOp]:
  """The reductions a PAD reads through values no bigger than its operand (reshapes, a scalar's products) that are
  long enough to compute on their own (PADDED_REDUCE_MIN) and not yet buffers."""
  small = max(1, math.prod(pad.src[0].shape))
  found, stack, seen = [], [pad.src[0]], set()
  while stack:
    node = stack.pop()
    if node in seen or node in realize: continue
    seen.add(node)
    if node.op is Ops.REDUCE_AXIS:
      if math.prod(node.src[0].shape) >= PADDED_REDUCE_MIN * max(1, math.prod(node.shape)): found.append(node)
    elif node.op in ELEMENTWISE or node.op is Ops.RESHAPE:
      stack.extend(src for src in node.src if src.shape is not None and math.prod(src.shape) <= small)
  return found


def _bound_depth(sink: UOp, realize: set[UOp]) -> None:
  """Add to `realize` the elementwise nodes that keep every kernel's chain of operations at most MAX_FUSED_DEPTH
  long (counted from the kernel's inputs: buffers, parameters, constants)."""
  depth: dict[UOp, int] = {}
  for node in sink.toposort:
    if not node.src or node.op is Ops.PARAM:
      depth[node] = 0
      continue
    reach = 1 + max(depth[src] for src in node.src)
    if node in realize or reach > MAX_FUSED_DEPTH and node.op in ELEMENTWISE and node.shape is not None:
      realize.add(node)
      reach = 0
    depth[node] = reach


def _outputs_first(sink: UOp) -> list[UOp]:
  """The program's nodes, each after its sources, with the outputs far shallower than the others (a longest path from
  the inputs at most EARLY_OUTPUT_FRACTION of the deepest) computed first: a training step's loss (the forward pass
  only) before the parameters' updates (forward and backward), so that the kernels reading a parameter (the loss
  reads the last layer's bias) run before the update that may overwrite it in place (a donated argument,
  trace/jit.py) instead of after it. The others keep their order: each parameter's update beside its moments'
  (merge_elementwise). Depth, not the count of nodes an output depends on: that is a walk per output (ResNet-50's
  training step: 430 outputs over 20k nodes, 8 s)."""
  depth: dict[UOp, int] = {}
  for node in sink.toposort: depth[node] = 1 + max((depth[src] for src in node.src), default=0)
  largest = max((depth[node] for node in sink.src), default=0)
  early = [node for node in sink.src if depth[node] <= EARLY_OUTPUT_FRACTION * largest]
  return toposort_of(early + [node for node in sink.src if node not in early]) + [sink]


class _Regions:
  """The nodes that the kernel of each root in `realize` computes (down to buffers: realised nodes and PARAMs), as
  find_buffers' passes below walk them, the roots in program `order`. A root's region changes only when one of its
  own nodes becomes a buffer, so what a pass found in it is kept until then: each round of the passes walks the new
  and the changed regions only (the transformer step's 12 rounds walked every region 36 times, a quarter of its
  schedule's Python)."""

  def __init__(self, realize: set[UOp], order: dict[UOp, int]):
    self.realize, self.order = realize, order
    self.known: set[UOp] = set()  # the buffers when the kept findings were last checked
    self.nodes: dict[UOp, dict[UOp, None]] = {}  # root -> the nodes of its region, in the order walked
    self.found: dict[tuple[str, UOp], list] = {}  # (pass, root) -> what the pass found in the root's region

  def walk(self, name: str, visit: Callable[[UOp, list], bool] | None) -> Iterator[tuple[UOp, list]]:
    """(root, what `visit(node, found)` appended to `found` for the nodes of the root's region) for each root, in
    program order; the walk of a region goes below `node` when `visit` returns True. `name` names the pass (and
    `visit`: the findings are kept under it). Without `visit`: (root, its region's nodes)."""
    if new := self.realize - self.known:
      for root in [root for root, nodes in self.nodes.items() if root in new or not new.isdisjoint(nodes)]:
        del self.nodes[root]
        for key in [key for key in self.found if key[1] is root]: del self.found[key]
      self.known |= new
    for root in sorted(self.realize, key=self.order.__getitem__):
      if root.op is Ops.PROJECT: continue  # (written by its loop, not by a kernel)
      if (nodes := self.nodes.get(root)) is None: nodes = self.nodes[root] = self._region(root, None, [])
      if visit is None:
        yield root, list(nodes)
        continue
      if (found := self.found.get((name, root))) is None:
        found = self.found[(name, root)] = []
        self._region(root, visit, found)
      yield root, found

  def contractions(self) -> Iterator[tuple[UOp, list[UOp]]]:
    """(root, the contractions its kernel would compute, in the order walked) for each root: those that get a
    register tile (`_is_contraction`, `_tiles_rows`); the walk does not go below them."""
    def visit(node: UOp, found: list) -> bool:
      if node.op is Ops.REDUCE_AXIS and _is_contraction(node, self.realize) and _tiles_rows(node):
        found.append(node)
        return False
      return True
    return self.walk("contractions", visit)

  def _region(self, root: UOp, visit: Callable[[UOp, list], bool] | None, found: list) -> dict[UOp, None]:
    seen: dict[UOp, None] = {}  # (in the order walked)
    stack = list(root.src)
    while stack:
      node = stack.pop()
      if node in seen or node in self.realize or node.op is Ops.PARAM: continue
      seen[node] = None
      if visit is None or visit(node, found): stack.extend(node.src)
    return seen


def _shared_reductions(regions: _Regions) -> list[UOp]:
  """Reductions that two kernels would each compute (a gradient feeding both of Adam's moments): they get a buffer
  of their own, computed once. When every reader sees the reduction through the same reshape / permute (a weight
  gradient computed transposed), that view is what is stored, in the layout the readers read."""
  realize = regions.realize

  def visit(node: UOp, found: list) -> bool:
    base = node
    while base.op in (Ops.RESHAPE, Ops.PERMUTE) and base not in realize: base = base.src[0]
    if base.op is Ops.REDUCE_AXIS and base not in realize:
      found.append((base, node))
      return False
    return True
  readers: dict[UOp, dict[UOp, set[UOp]]] = {}  # reduction -> {top of the movement chain read: the kernels reading it}
  for root, found in regions.walk("reductions", visit):
    for base, node in found: readers.setdefault(base, {}).setdefault(node, set()).add(root)
  shared = []
  for base, views in readers.items():
    if len(set().union(*views.values())) < 2: continue
    shared.append(next(iter(views)) if len(views) == 1 else base)
  return shared


def _sibling_contractions(regions: _Regions) -> list[UOp]:
  """Contractions that would share a kernel with another (the input gradient where a residual block's two branches
  meet: the sum of two 1x1 convolutions' transposes), but the one found first: a kernel with two REDUCEs gets no
  register tile (codegen/opt.py), so each gets a kernel of its own, the last with the sum as its epilogue.
  ResNet-50's 8x55x55x64 sum of two: 14.6 ms at 14% of the FMA peak as one kernel."""
  return [node for _, contractions in regions.contractions() for node in contractions[1:]]


def _costly_epilogue_contractions(regions: _Regions) -> list[UOp]:
  """Contractions whose kernel computes a costly vector operation after them (a transcendental's polynomial, a
  division) from another operand of the product's size: a GELU's derivative times the gradient of the layer after
  it, `(g @ w.T) * gelu'(h)`. They get a buffer of their own, the rest a kernel that streams both. The register
  tile's epilogue read that operand a line per row, rows a page apart, in each column block, and its polynomial on
  the tile's vectors waited on those reads: the transformer step's 1024x256x1024 product took 5.9-6.8 ms with it,
  3.1-3.5 ms without and 1.1-1.2 ms for the epilogue on its own. (A costly value that reads no such operand, a
  random normal added to the product, stays in the epilogue.)"""
  realize = regions.realize

  def costly_epilogue(region: dict[UOp, None], contraction: UOp) -> bool:
    size = math.prod(contraction.shape)
    below, stack = set(), [contraction]  # (what the contraction reduces, in this kernel)
    while stack:
      node = stack.pop()
      if node in below or node not in region: continue
      below.add(node)
      stack.extend(node.src)
    # whether each node is computed from a buffer of at least `size` elements, not through the contraction (sources
    # first, iteratively: a chain can be thousands of nodes deep)
    reads: dict[UOp, bool] = {contraction: False}
    for top in (node for node in region if node not in below and _costliness(node) == VECTOR_COSTLY_LEVEL):
      work = [(top, False)]
      while work:
        node, sources_done = work.pop()
        if node in reads: continue
        if node in realize or node.op is Ops.PARAM: reads[node] = math.prod(node.shape) >= size
        elif sources_done: reads[node] = any(reads[source] for source in node.src)
        else:
          work.append((node, True))
          work.extend((source, False) for source in node.src if source not in reads)
      if reads[top]: return True
    return False
  chosen = []
  for root, contractions in regions.contractions():
    if len(contractions) != 1: continue
    if (kept := regions.found.get(("costly epilogue", root))) is None:  # (kept with the region's other findings)
      kept = regions.found[("costly epilogue", root)] = [costly_epilogue(regions.nodes[root], contractions[0])]
    if kept[0]: chosen.append(contractions[0])
  return chosen


# An elementwise value that several kernels compute, each from the same L buffers of its size (K kernels), is
# computed once into a buffer of its own when that saves at least SHARED_MIN_SAVED_BYTES of memory traffic: K * L
# reads become L reads, one write and K reads. ResNet-50's backward pass adds the gradients of a residual block
# through its ReLUs' masks, a chain over 8 buffers of 24200x256 floats that each batch-norm reduction and the input
# gradient recomputed: the reductions read 200 MB each.
SHARED_MIN_SAVED_BYTES = 1 << 18


def _shared_elementwise(regions: _Regions) -> list[UOp]:
  """Elementwise values more than one kernel recomputes from several full-size buffers (SHARED_MIN_SAVED_BYTES),
  the topmost of each chain of such values: they get a buffer of their own."""
  realize, order = regions.realize, regions.order
  readers: dict[UOp, set[UOp]] = {}  # node -> the kernels (their roots) that compute it
  for root, nodes in regions.walk("elementwise", None):
    for node in nodes: readers.setdefault(node, set()).add(root)
  leaves: dict[UOp, frozenset[UOp]] = {}  # node -> the buffers it reads (through non-buffer nodes)

  def leaves_of(node: UOp) -> frozenset[UOp]:
    stack, seen = [(node, False)], set()
    while stack:  # (iterative, sources first: a chain can be thousands of nodes deep)
      current, sources_done = stack.pop()
      if current in leaves: continue
      if current in realize or current.op is Ops.PARAM: leaves[current] = frozenset((current,))
      elif sources_done: leaves[current] = frozenset().union(*(leaves[src] for src in current.src))
      elif current not in seen:
        seen.add(current)
        stack.append((current, True))
        stack.extend((src, False) for src in current.src)
    return leaves[node]

  def saved_bytes(node: UOp) -> int:
    kernels, size = len(readers[node]), math.prod(node.shape)
    loads = sum(1 for leaf in leaves_of(node) if math.prod(leaf.shape) >= size)
    return (kernels * loads - loads - 1 - kernels) * size * node.dtype.itemsize

  shared = {node for node, kernels in readers.items() if len(kernels) > 1 and node.op in ELEMENTWISE and
            math.prod(node.shape) > 1 and saved_bytes(node) >= SHARED_MIN_SAVED_BYTES}
  below_shared = {src for node in shared for src in node.src}  # (the topmost: no shared node reads them)
  return sorted((node for node in shared if node not in below_shared), key=order.__getitem__)


def _strides(shape: tuple[int, ...]) -> list[int]:
  strides, step = [], 1
  for dim in reversed(shape):
    strides.append(step)
    step *= dim
  return strides[::-1]


def _flat_index(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
  total = symbolic.const(0)
  for index, stride, dim in zip(idx, _strides(shape), shape):
    if dim != 1: total = symbolic.add(total, symbolic.mul(index, stride))
  return total


def _unflatten(flat: UOp, shape: tuple[int, ...]) -> tuple[UOp, ...]:
  return tuple(symbolic.const(0) if dim == 1 else symbolic.mod(symbolic.idiv(flat, stride), dim)
               for stride, dim in zip(_strides(shape), shape))


def _in_bounds(index: UOp, low: int, high: int) -> UOp | None:
  """`low <= index < high` as a bool UOp, None when always true."""
  return symbolic.logical_and(symbolic.ge(index, low), symbolic.lt(index, high))


# An elementwise kernel whose loads read across the output's flat order gets a loop over its last axis when that axis
# is at least this long (shorter rows would pay a loop's overhead for every few elements).
ROW_LOOP_MIN = 16


def _divides(value: UOp, flat: UOp) -> bool:
  """Whether the kernel `value` divides the flat output index (an IDIV or MOD of it, not of loaded data)."""
  return any(node.op in (Ops.IDIV, Ops.MOD) and flat in node.toposort and
             not any(n.op is Ops.LOAD for n in node.toposort) for node in value.toposort)


def _range_divisors(value: UOp) -> dict[UOp, set[int]]:
  """The global ranges `value` divides by constants (`r // c`, `r % c`), with their divisors."""
  divisors: dict[UOp, set[int]] = {}
  for node in value.toposort:
    if node.op in (Ops.IDIV, Ops.MOD) and node.src[0].op is Ops.RANGE and node.src[0].arg[1] == "global" and \
        node.src[1].op is Ops.CONST:
      divisors.setdefault(node.src[0], set()).add(node.src[1].arg)
  return divisors


def _divided_axes(value: UOp, idx: tuple[UOp, ...]) -> dict[int, list[int]]:
  """The axes whose global range (`idx`, one per axis) `value` reads through divisions by constants that cut it into
  factors (`r // 64`, `r % 64` of a range of 256: 4 x 64), as `_Rangeify.loop_nest`'s splits: axis -> its factors,
  outermost first. Not an axis whose divisors don't nest (`r // 6` and `r // 4`)."""
  divisors = _range_divisors(value)
  splits = {}
  for axis, rng in enumerate(idx):
    if rng not in divisors: continue
    size = rng.src[0].arg
    cuts = sorted(c for c in divisors[rng] if 1 < c < size and size % c == 0)
    if not cuts or any(outer % inner for inner, outer in zip(cuts, cuts[1:])): continue
    bounds = [1, *cuts, size]
    splits[axis] = [bounds[i + 1] // bounds[i] for i in reversed(range(len(bounds) - 1))]
  return splits


# A contraction over reduce ranges read through divisions (`_Scheduler.block_linear_alternative`) rather than a copy of
# its column operand, only where that operand's elements (columns x reduce steps) take at least this many bytes: on 2
# cores, einsum('nop,nip->oi') of (32, 64, 3136) 4.6 -> 2.6 ms, but (64, 128, 64) (2 MB) 0.34 -> 0.64 ms and
# (16, 256, 196) 1.0 -> 2.0 ms, where the copy stays in cache and its plain tile is the faster.
BLOCK_LINEAR_MIN_BYTES = 8 << 20
# A strided contraction operand is copied into a column-major-for-the-kernel layout (`_Scheduler.relayout`) only when
# the contraction does at least this many loop iterations per element copied.
RELAYOUT_WORK_RATIO = 16
# A register-tiled GEMM's row operand read across its rows is copied (`_Scheduler.relayout`) when it takes at least
# this many bytes, a core's L2 on AMD Zen 3: x.T @ g with x of (512, 512) ran at 92 -> 149 GFLOP/s copied first,
# (512, 256) 101 -> 131, (512, 128) level, (1024, 96) 111 -> 97 and (96, 64) 45 -> 38 (2 cores, AVX2).
RELAYOUT_ACROSS_BYTES = 512 << 10


def _substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`root` with the nodes in `mapping` replaced (and everything above them rebuilt)."""
  done: dict[UOp, UOp] = {}
  for node in root.toposort:
    if node in mapping: done[node] = mapping[node]
    elif node.src and any(done[s] is not s for s in node.src):
      done[node] = node.replace(src=tuple(done[s] for s in node.src))
    else: done[node] = node
  return done[root]


def _needs_loop_nest(root: UOp, loads: set[UOp]) -> bool:
  """Whether the kernel computing `root` (reading `loads` from buffers) contains a reduction or a gather: then its
  output gets one loop per axis (a reduction's loop goes inside them; a gathered row is one contiguous inner loop),
  not one flat loop."""
  stack, seen = [root], set()
  while stack:
    node = stack.pop()
    if node in seen or node in loads: continue
    seen.add(node)
    if node.op in (Ops.REDUCE_AXIS, Ops.GATHER): return True
    stack.extend(node.src)
  return False


def _contraction_order(root: UOp, loads: set[UOp]) -> list[int] | None:
  """A contraction stored permuted (a channels-first convolution's output) where that pays (codegen/opt.py
  `permuted_store_pays`) runs its loops in its own order, its last axis the register tile's contiguous column; the
  tile's epilogue then stores element by element, which is small next to the sums. 32x64x56x56 3x3 into 64 channels,
  NCHW (576 steps): a product and a transposing copy, 21.5-22.2 ms, became one kernel, 19.9-20.5 ms.
  For a PERMUTE of such a contraction (through reshapes of its length-1 axes) that moves its last axis, also under
  elementwise operations of the output's shape (an input gradient times a ReLU's or a pool's mask, read in the
  output's layout: 64x64x14x14 -> 32 channels in the output's order, 14-wide columns: 23.6 ms): the output's axes
  in the contraction's loop order, else None."""
  orders, stack, seen = set(), [root], set()
  while stack:
    node = stack.pop()
    if node in seen or node in loads: continue
    seen.add(node)
    if node.op in ELEMENTWISE and node.shape == root.shape: stack.extend(node.src)
    if node.op is not Ops.PERMUTE: continue
    axes, source = list(node.arg), node.src[0]
    while source.op is Ops.PERMUTE:  # (permutes composed: a weight gradient's (3, 3, C, O) as (C, O, 3, 3), then OIHW)
      axes, source = [source.arg[axis] for axis in axes], source.src[0]
    base = source
    while base.op in (Ops.RESHAPE, Ops.CAST) and [d for d in base.shape if d != 1] == [d for d in base.src[0].shape
                                                                                     if d != 1]:
      base = base.src[0]
    if axes[-1] == len(axes) - 1 or base.op is not Ops.REDUCE_AXIS or base.arg[0] is not Ops.ADD: continue
    steps = math.prod(base.src[0].shape[axis] for axis in base.arg[1])
    if permuted_store_pays(node.shape[-1], source.shape[-1], steps, math.prod(node.shape)):
      orders.add(tuple(int(axis) for axis in np.argsort(axes)))
  return list(orders.pop()) if len(orders) == 1 else None


class _Rangeify:
  """Builds the scalar AST of one kernel by pushing loop indices from its output down to its loads."""

  # reduced axes that are adjacent but not contiguous in memory (a sum over (N, H*W) of (N, C, H*W) data) may still be
  # one reduce range, read through divisions, when its innermost axis is whole squares of register transposes (opt.py
  # `tile_geometry`): the register tile packs such an operand in transposed blocks (codegen/llvm.py
  # `transposed_packs`, opt.py `block_stride`).
  # Asked for by `_Scheduler.block_linear_alternative` only.
  block_linear_reduce = False

  def __init__(self, root: UOp, slot_of: dict[UOp, int]):
    self.root, self.slot_of = root, slot_of
    self.params: list[int] = [slot_of[root]]
    self.globals: dict[int, UOp] = {}
    self.memo: dict[tuple, UOp] = {}
    self.range_count = 0
    self.work = 1

  def new_range(self, size: int, kind: str) -> UOp:
    rng = UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(size),), (self.range_count, kind))
    self.range_count += 1
    self.work *= size
    return rng

  def define_global(self, slot: int, dtype: np.dtype) -> UOp:
    if slot not in self.params: self.params.append(slot)
    return UOp(Ops.DEFINE_GLOBAL, dtype, (), self.params.index(slot))

  def loop_nest(self, shape: tuple[int, ...], splits: dict[int, list[int]] | None = None
                ) -> tuple[tuple[UOp, ...], UOp, int]:
    """One global range per axis of `shape` longer than 1, or per factor of an axis that `splits` cuts (axis -> its
    factors, outermost first: the axis's index is their flat index): the index per axis, the flat index and the outer
    size."""
    idx, sizes = [], []
    for axis, dim in enumerate(shape):
      factors = splits.get(axis, [dim]) if splits else [dim]
      parts = [self.new_range(factor, "global") for factor in factors if factor > 1]
      sizes += [factor for factor in factors if factor > 1]
      idx.append(_flat_index(tuple(parts), tuple(f for f in factors if f > 1)) if parts else symbolic.const(0))
    return tuple(idx), _flat_index(tuple(idx), shape), sizes[0] if sizes else 1

  def build(self) -> tuple[UOp, int]:
    """The kernel that computes the root's value (for a CONTIGUOUS or a SCATTER: its operand's) into its buffer."""
    root, shape = self.root, self.root.shape
    value_node = root.src[0] if root.op in (Ops.CONTIGUOUS, Ops.SCATTER) else root
    loads = {node for node in self.slot_of if node is not root}
    if not _needs_loop_nest(value_node, loads):  # elementwise: one flat loop, the best shape for threads and vectors
      size = int(np.prod(shape, dtype=np.int64))
      flat = self.new_range(size, "global") if size > 1 else symbolic.const(0)
      idx, out_index, outer = _unflatten(flat, shape), flat, size
      value = self.emit(value_node, idx, None, top=value_node is root)
      # the inner axes: the last, or the fewest last ones that make a row of ROW_LOOP_MIN elements (a copy into
      # (C, kh, kw, oh, ow, N) rows of an HWCN input: ow and N, 8 long, instead of five divisions per element)
      inner = next((k for k in range(1, len(shape) + 1) if math.prod(shape[-k:]) >= ROW_LOOP_MIN), 0)
      if size > 1 and inner and _divides(value, flat):
        # a load reads across the flat order (a pad, a transpose, a broadcast): a division and a modulo per element,
        # and gated loads the vectoriser leaves scalar. Rows instead: each inner axis is its own inner loop (the pad's
        # gate and the loads' strides are plain in them), the rows one flat loop (divisions once per row). More
        # trailing axes join the inner ones as one column while every load stays linear along it: (N, H, W, C) read
        # as (N, C, H, W) has columns of H * W, not W, and so its transpose blocks (codegen/opt.py `transpose_block`)
        built, chosen = self.rows_and_columns(value_node, inner, merge=False), None
        for count in range(inner + 1, len(shape)):
          trial = _Rangeify(root, self.slot_of)
          attempt = trial.rows_and_columns(value_node, count, merge=True)
          if _divides(attempt[0], attempt[-1]): break
          built, chosen = attempt, trial
        if chosen is not None: self.__dict__.update(chosen.__dict__)
        value, idx, out_index, outer, _ = built
    elif (order := _contraction_order(value_node, loads)) is not None and \
        (tiled := _Rangeify(root, self.slot_of).in_order(value_node, order)) is not None:
      # a contraction stored permuted (a channels-first convolution's output): its loops run in the contraction's
      # own order, its last axis the register tile's contiguous column, and the STORE writes the permuted layout
      self.__dict__.update(tiled[0].__dict__)
      return tiled[1]
    else:
      idx, out_index, outer = self.loop_nest(shape)
      value = self.emit(value_node, idx, None, top=value_node is root)
      if (splits := _divided_axes(value, idx)):
        # an output axis read through divisions (a reshape of heads: attention's (B, T, H * Dh) gradient of a
        # (B, H, T, Dh) product, read at d // Dh and d % Dh) gets a range per factor, so that the contraction's
        # indices are linear and its register tile takes it (a plain loop nest ran it at 1-2 GFLOP/s)
        trial = _Rangeify(root, self.slot_of)
        trial_idx, trial_index, trial_outer = trial.loop_nest(shape, splits)
        trial_value = trial.emit(value_node, trial_idx, None, top=value_node is root)
        if not _range_divisors(trial_value):
          self.__dict__.update(trial.__dict__)
          idx, out_index, outer, value = trial_idx, trial_index, trial_outer, trial_value
    store = UOp(Ops.STORE, root.dtype, (self.define_global(self.slot_of[root], root.dtype), out_index, value))
    return UOp(Ops.SINK, root.dtype, (store,)), outer

  def in_order(self, value_node: UOp, order: list[int]) -> tuple[_Rangeify, tuple[UOp, int]] | None:
    """The kernel of a contraction stored permuted, its loops in the contraction's order (`_contraction_order`), and
    this builder; None where its register tile would not take it (a gated load: the padded patches of ResNet's 7x7
    stride-2 convolution, whose weight gradient then ran as a plain loop nest)."""
    root, shape = self.root, self.root.shape
    loops, _, outer = self.loop_nest(tuple(shape[axis] for axis in order))
    idx = tuple(loops[order.index(axis)] for axis in range(len(shape)))
    value = self.emit(value_node, idx, None, top=value_node is root)
    store = UOp(Ops.STORE, root.dtype, (self.define_global(self.slot_of[root], root.dtype), _flat_index(idx, shape),
                                        value))
    ast = UOp(Ops.SINK, root.dtype, (store,))
    return (self, (ast, outer)) if choose_opts(symbolic.simplify(ast)) is not None else None

  def rows_and_columns(self, value_node: UOp, count: int, merge: bool
                       ) -> tuple[UOp, tuple[UOp, ...], UOp, int, UOp | None]:
    """The kernel's value built over rows (the leading axes as one flat range) and the last `count` axes, each its own
    range or (`merge`) all in one range, the column, also returned. Also the index per axis, the flat output index
    and the outer size."""
    self.__init__(self.root, self.slot_of)
    shape, root = self.root.shape, self.root
    rows = math.prod(shape[:-count])
    row = self.new_range(rows, "global") if rows > 1 else symbolic.const(0)
    column = None
    if merge:
      column = self.new_range(math.prod(shape[-count:]), "global")
      inner_idx = list(_unflatten(column, shape[-count:]))
    else: inner_idx = [self.new_range(dim, "global") if dim > 1 else symbolic.const(0) for dim in shape[-count:]]
    idx = (*_unflatten(row, shape[:-count]), *inner_idx)
    outer = rows if rows > 1 else next(dim for dim in shape[-count:] if dim > 1)
    value = self.emit(value_node, idx, None, top=value_node is root)
    return value, idx, _flat_index(idx, shape), outer, column

  def window_starts(self, indices: UOp, batch_idx: tuple[UOp, ...], window: tuple[int, ...]) -> list[UOp]:
    """The loaded window starts of a GATHER / SCATTER for one batch element, as int64 index expressions."""
    starts = []
    for axis in range(len(window)):
      start = self.emit(indices, (*batch_idx, symbolic.const(axis)), None)
      starts.append(start if start.dtype == INDEX_DTYPE else UOp(Ops.CAST, INDEX_DTYPE, (start,)))
    return starts

  def build_scatter(self) -> tuple[UOp, int, int]:
    """The second kernel of a SCATTER: for each update element in order, load the target element of the buffer,
    combine and store it back (a window that does not fit rewrites its target unchanged: dropped). Also returns how
    many of its outermost global ranges must run in order (`Kernel.ordered`)."""
    root = self.root
    operand, indices, updates = root.src
    mode, window, _, clip = root.arg
    idx, _, outer = self.loop_nest(updates.shape)
    n_batch = len(indices.shape) - 1
    starts = self.window_starts(indices, idx[:n_batch], window)
    fits, position = None, []
    for start, size, dim, offset in zip(starts, window, operand.shape, idx[n_batch:]):
      if not clip:
        inside = symbolic.logical_and(symbolic.ge(start, 0), symbolic.lt(start, dim - size + 1))
        fits = symbolic.logical_and(fits, inside)
      position.append(symbolic.add(symbolic.clamp(start, 0, dim - size), offset))
    position += idx[n_batch + len(window):]
    buffer = self.define_global(self.slot_of[root], root.dtype)
    target = _flat_index(tuple(position), root.shape)
    old = UOp(Ops.LOAD, root.dtype, (buffer, target))
    new = _combine(mode, old, self.emit(updates, idx, None))
    if fits is not None: new = UOp(Ops.WHERE, root.dtype, (fits, new, old))
    store = UOp(Ops.STORE, root.dtype, (buffer, target, new))
    # the ordered axes: the batch axes, and the window axes up to the last one along which two windows can overlap
    # (an indexed axis the window covers only in part: updates [1], [5], [0] of windows 3 long into 5 rows, clipped
    # to starts 1, 2, 0, hit row 2 from three window offsets, which must not run in different work-items)
    overlapping = [n_batch + axis for axis, (start, size, dim) in enumerate(zip(starts, window, operand.shape))
                   if 1 < size < dim and start.op is not Ops.CONST]
    prefix = max(overlapping, default=n_batch - 1) + 1
    return UOp(Ops.SINK, root.dtype, (store,)), outer, sum(1 for dim in updates.shape[:prefix] if dim > 1)

  def emit(self, node: UOp, idx: tuple[UOp, ...], valid: UOp | None, top: bool = False) -> UOp:
    key = (node, idx, valid)
    if key in self.memo: return self.memo[key]
    if 0 in node.shape:  # an empty value is only ever read under a PAD condition that is false: any value will do
      result = UOp.const(node.dtype, 0)
    elif not top and (node.op is Ops.PARAM or node in self.slot_of):
      buffer = self.define_global(self.slot_of[node], node.dtype)
      index = _flat_index(idx, node.shape)
      result = UOp(Ops.LOAD, node.dtype, (buffer, index) if valid is None else (buffer, index, valid))
    else:
      result = self._emit_op(node, idx, valid)
    self.memo[key] = result
    return result

  def _emit_op(self, node: UOp, idx: tuple[UOp, ...], valid: UOp | None) -> UOp:
    op, arg = node.op, node.arg
    if op is Ops.CONST: return UOp.const(node.dtype, arg)
    if op is Ops.IOTA: return UOp(Ops.CAST, node.dtype, (idx[0],))
    if op in ELEMENTWISE:
      return UOp(op, node.dtype, tuple(self.emit(src, idx, valid) for src in node.src), arg)
    src = node.src[0]
    if op is Ops.RESHAPE:
      flat = _flat_index(idx, node.shape)
      if valid is not None and (low := flat.vmin_vmax[0]) < 0:
        # under a pad's gate the index may be negative where the gate is false (it is in bounds where it is read),
        # and the reshape's div / mod fold only for a non-negative one. Where the index has terms the source's
        # strides divide (a padded NHWC activation's row, column and image terms around the channel), it is made
        # non-negative by a whole number of periods of the source's first axis, which the first coordinate takes off
        # again and the others (each modulo its axis) never see, and its terms fold one by one (a max-pool gradient
        # padded for the next convolution's input gradient in the CNN step: 3.0 -> 1.1 ms, its divisions out of the
        # channel loop). Otherwise it is clamped into range, and the coordinates' div / mod recombine where read
        # (the same gradient as a flat index: 11 nested MODs per element, 6.1 -> 1.9 ms).
        size, strides = math.prod(src.shape), _strides(src.shape)
        terms, _ = symbolic.linear_form(flat)
        if src.shape[0] != 1 and any(c % stride == 0 for c in terms.values() for stride in strides if stride > 1):
          periods = -(low // size)
          shifted = symbolic.add(flat, symbolic.const(periods * size))
          first = symbolic.add(symbolic.idiv(shifted, strides[0]), symbolic.const(-periods * src.shape[0]))
          return self.emit(src, (first, *_unflatten(shifted, src.shape)[1:]), valid)
        flat = symbolic.clamp(flat, 0, size - 1)
      return self.emit(src, _unflatten(flat, src.shape), valid)
    if op is Ops.PERMUTE:
      src_idx: list[UOp] = [symbolic.const(0)] * len(arg)
      for out_axis, src_axis in enumerate(arg): src_idx[src_axis] = idx[out_axis]
      return self.emit(src, tuple(src_idx), valid)
    if op is Ops.EXPAND:
      return self.emit(src, tuple(symbolic.const(0) if s == 1 else i for i, s in zip(idx, src.shape)), valid)
    if op is Ops.SHRINK:
      return self.emit(src, tuple(symbolic.add(i, symbolic.const(start)) for i, (start, _) in zip(idx, arg)), valid)
    if op is Ops.FLIP:
      return self.emit(src, tuple(symbolic.add(symbolic.mul(i, -1), symbolic.const(dim - 1)) if flip else i
                                  for i, dim, flip in zip(idx, src.shape, arg)), valid)
    if op is Ops.PAD:
      condition, src_idx = None, []
      for index, dim, (before, _) in zip(idx, src.shape, arg):
        condition = symbolic.logical_and(condition, _in_bounds(index, before, before + dim))
        src_idx.append(symbolic.add(index, symbolic.const(-before)))
      if condition is not None and condition.op is Ops.CONST and condition.arg is False:
        return UOp.const(node.dtype, 0)
      inner = self.emit(src, tuple(src_idx), symbolic.logical_and(valid, condition))
      if condition is None: return inner
      return UOp(Ops.WHERE, node.dtype, (condition, inner, UOp.const(node.dtype, 0)))
    if op is Ops.GATHER:
      operand, indices = node.src
      n_batch = len(indices.shape) - 1
      starts = self.window_starts(indices, idx[:n_batch], arg)
      position = [symbolic.add(symbolic.clamp(start, 0, dim - size), offset)
                  for start, size, dim, offset in zip(starts, arg, operand.shape, idx[n_batch:])]
      return self.emit(operand, (*position, *idx[n_batch + len(arg):]), valid)
    if op is Ops.REDUCE_AXIS:
      reduce_op, axes = arg
      if any(src.shape[axis] == 0 for axis in axes):
        return UOp.const(node.dtype, reduce_identity(reduce_op, node.dtype))
      long_axes = [axis for axis in sorted(axes) if src.shape[axis] > 1]
      runs = [[axis] for axis in long_axes[:1]]
      for axis in long_axes[1:]:
        if axis == runs[-1][-1] + 1: runs[-1].append(axis)
        else: runs.append([axis])
      # adjacent reduced axes that every index reads linearly (a sum over N, H, W of an NHWC batch norm) are one
      # reduce range: one loop (which the tile plans need) and no short inner loops; failing that, the axes after
      # each run's first (H, W where an operand is read per N alone)
      for merged in (runs, [part for run in runs for part in (run[:1], run[1:]) if part]):
        if all(len(run) == 1 for run in merged): break
        state = self.range_count, self.work
        value, ranges = self._reduce_value(src, idx, valid, axes, merged)
        if not any(_divides(value, rng) for rng in ranges) or self.block_linear_reduce and \
            all(src.shape[run[-1]] % tile_geometry().transpose_lanes == 0 for run in merged if len(run) > 1):
          return UOp(Ops.REDUCE, node.dtype, (value, *ranges), reduce_op)
        self.range_count, self.work = state
      value, ranges = self._reduce_value(src, idx, valid, axes, [[axis] for axis in long_axes])
      if ranges: return UOp(Ops.REDUCE, node.dtype, (value, *ranges), reduce_op)
      # every reduced axis has length 1: the value itself (in the reduction's dtype: a split sum's float64 partial)
      return value if value.dtype == node.dtype else UOp(Ops.CAST, node.dtype, (value,))
    raise NotImplementedError(f"rangeify: no rule for {op.name}")

  def _reduce_value(self, src: UOp, idx: tuple[UOp, ...], valid: UOp | None, axes: tuple[int, ...],
                    runs: list[list[int]]) -> tuple[UOp, list[UOp]]:
    """The value a REDUCE_AXIS over `axes` folds: `src` read with one reduce range per run of its long axes (the
    run's axes unflattened from it) and its other reduced axes at 0; and the ranges."""
    src_idx, ranges = list(idx), []
    for axis in axes: src_idx[axis] = symbolic.const(0)
    for run in runs:
      ranges.append(self.new_range(math.prod(src.shape[axis] for axis in run), "reduce"))
      for axis, index in zip(run, _unflatten(ranges[-1], tuple(src.shape[axis] for axis in run))): src_idx[axis] = index
    return self.emit(src, tuple(src_idx), valid), ranges


def _built(builder: _Rangeify) -> tuple[UOp, tuple[int, ...], int]:
  """The kernel `builder` builds, simplified, neighbouring ranges merged, its unread buffers dropped: its AST, slots
  and outer size."""
  ast, outer = builder.build()
  ast, outer = _merge_contiguous_ranges(symbolic.simplify(ast), outer)
  ast, slots = _drop_unread_buffers(ast, builder.params)
  return ast, slots, outer


def _combine(mode: str, old: UOp, update: UOp) -> UOp:
  """A scatter's new value of an element from its old value and an update."""
  if mode == "set": return update
  if mode == "add": return old.alu(Ops.ADD, update)
  if mode == "mul": return old.alu(Ops.MUL, update)
  if mode == "max": return old.alu(Ops.MAX, update)
  if old.dtype == BOOL: return old.alu(Ops.AND, update)  # min
  if old.dtype.kind == "f": return old.alu(Ops.NEG).alu(Ops.MAX, update.alu(Ops.NEG)).alu(Ops.NEG)  # NaN propagates
  return UOp(Ops.WHERE, old.dtype, (update.alu(Ops.CMPLT, old), update, old))


def reduce_identity(reduce_op: Ops, dtype: np.dtype):
  """The value a reduction over nothing returns."""
  if reduce_op is not Ops.MAX: return REDUCE_IDENTITY[reduce_op]
  if dtype == BOOL: return False
  if dtype.kind in "iu": return int(np.iinfo(dtype).min)
  return -float("inf")


def _global_range(size: int, index: int) -> UOp:
  """A kernel's global RANGE number `index` (its nesting position) of `size` iterations."""
  return UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(size),), (index, "global"))


def _split_columns(ast: UOp, threads: int) -> tuple[UOp, int] | None:
  """A packed register-tiled contraction with enough column tiles for the threads gets its column range cut into
  tiles, as the new outermost range: out[tile, row, column] with the tile's columns innermost. Cut by rows, every
  launch chunk packs all of b (the operand reused across the rows) again, and a thread claims many chunks; cut by
  column tiles, each tile is packed once and the threads reread a (the row operand) instead, from L2 or L3. On 2
  cores (float32): 128x784x512 187 -> 243 GFLOP/s, 512x784x512 270 -> 305-341, 1024^3 270 -> 360-370, 2048^3 218 ->
  337-358. Not when the rows outnumber the columns and the row operand is read across its rows (`a.T @ b`, a weight
  gradient): every column tile then rereads it with a stride, 264 -> 250-257 at 784x512x512. Ranges before the row
  (a 3x3 weight gradient's (kh, kw, C, O)) stay between the tiles and the row; such a kernel, launched over kh alone,
  kept one of two threads idle a third of the time (14x14x256: 11.0 -> 8.0 ms, 28x28x128: 9.9 -> 7.5), and is cut
  whatever its row operand's strides, into as few as one tile per thread. Otherwise it needs twice as many column
  tiles as threads, and a column count that is a multiple of the tile. Where the operands overflow the last-level
  cache, a launch takes a block of column tiles instead (`_column_blocks`). Returns the new AST and its outer
  size, or None."""
  plan = choose_opts(ast)
  if plan is None or plan.stream or plan.dot or plan.row is None: return None
  global_ranges = global_ranges_of(ast)
  if global_ranges[-2:] != [plan.row, plan.column]: return None
  leading = global_ranges[:-2]
  # (unpacked, only when the rows are one launch chunk, or with no ranges before them too few chunks for the threads:
  # a classifier's transposed weight gradient, 10 rows, two 6-row tiles on AVX2. Launched over those rows, each thread
  # streamed all of the operand read in place, a line a reduce step, and the second one's tile was 6 rows clamped
  # over 4; cut by column tiles, each reads its part once, and from L1 for its second row tile. MLP step's 512x512x10
  # on Zen 3, in-process A/B, best / median us: operand in L2 171 / 487 -> 135 / 267, from memory 810 / 1029 -> 468 /
  # 583. A kernel launched over ranges before its rows keeps them: the CNN step's first 3x3 weight gradient, split
  # sums over (kh, kw), ran 2.1-2.4 -> 2.8-4.1 ms cut by columns)
  if not plan.packed and plan.row.src[0].arg > plan.grain and \
      (leading or -(-plan.row.src[0].arg // plan.grain) >= 2 * threads):
    return None
  # (a plan packing several column tiles runs them one after the other inside each launch chunk, opt.PANEL_BYTES and
  # opt.TILES_PACK_BYTES, unless that launch would be a few values of ranges outside the row: a 3x3 weight gradient's
  # 3 of kh for 2 threads)
  if plan.tiles > 1 and (plan.panel or not leading or math.prod(rng.src[0].arg for rng in leading) >= 2 * threads):
    return None
  rows, columns = plan.row.src[0].arg, plan.column.src[0].arg
  tiles = columns // plan.columns
  # (with ranges before the row, as few tiles as threads do: each thread one tile, the same work)
  if columns % plan.columns or tiles < 2 * threads and not (leading and tiles % threads == 0): return None
  reduce_ranges = list(plan.reduce.src[1:])
  # (a pack that is each leading value's own, an NCHW convolution's image, is packed as often either way: cut by
  # column tiles, the leading range would only move inside them, each tile reading every image)
  if per_outer_value(plan.packed, leading): return None
  row_loads = [n for n in plan.reduce.src[0].toposort if n.op is Ops.LOAD and plan.row in n.src[1].toposort]
  if not leading and rows >= columns and \
      any(linear_strides(load.src[1])[0].get(reduce_ranges[-1]) != 1 for load in row_loads):
    return None

  def cut(width: int) -> UOp:
    tile = _global_range(columns // width, 0)
    mapping = {rng: _global_range(rng.src[0].arg, 1 + i) for i, rng in enumerate(leading)}
    mapping[plan.row] = _global_range(rows, 1 + len(leading))
    mapping[plan.column] = symbolic.add(symbolic.mul(tile, width), _global_range(width, 2 + len(leading)))
    for i, rng in enumerate(reduce_ranges): mapping[rng] = rng.replace(arg=(3 + len(leading) + i, rng.arg[1]))
    return symbolic.simplify(_substitute(ast, mapping))
  # (a few rows that sweep their column, opt.py SWEEP_ROWS: blocks of at most SWEEP_COLUMNS columns, as many for each
  # thread, each a launch that sweeps its block)
  if not leading and rows <= SWEEP_ROWS and (n := _sweep_block(plan, tiles, threads)) and \
      (swept := choose_opts(split := cut(n * plan.columns))) is not None and swept.sweep:
    return split, tiles // n
  # (a block of column tiles, the most whose plan packs them all first, else one tile)
  for n in _column_blocks(plan, tiles, threads) if not leading else ():
    if (block := choose_opts(split := cut(n * plan.columns))) is not None and block.tiles == n and not block.panel:
      return split, tiles // n
  return cut(plan.columns), tiles


def _split_stream(ast: UOp, threads: int) -> tuple[UOp, int] | None:
  """A streamed contraction whose column is the kernel's only global range (a vector times a matrix, `v @ W`: a
  language model's decode step, a batch of one) is launched over its stream tiles (opt.py STREAM_TILE), fewer than
  the threads or unevenly many (4096 columns: one tile, on one thread; 11008: 4096 + 4096 + 2816 on 2). Its column
  is cut into the fewest equal tiles, a multiple of the threads, each whole vectors and at most a stream tile, as the
  new outermost range; each launch streams its tile's part of every row. On 2 cores, with the stream tile's rows
  folded 4 at a time (codegen/llvm.py STREAM_ROWS), one thread's streams read about what the two do (v @ W of 4096 x
  4096: 2.6-2.9 against 2.0-3.1 ms, noise); with more cores than one core's bandwidth feeds, each takes a share.
  Returns the new AST and its outer size, or None."""
  plan = choose_opts(ast)
  if plan is None or not plan.stream or global_ranges_of(ast) != [plan.column] or \
      sum(node.op is Ops.REDUCE for node in ast.toposort) != 1:
    return None
  columns = plan.column.src[0].arg
  if columns % plan.columns == 0 and (columns // plan.columns) % threads == 0: return None
  lanes = tile_geometry().vector_bytes // 4
  count = next((n for n in range(threads, 4 * threads + 1, threads)
                if columns % n == 0 and columns // n % lanes == 0 and columns // n <= plan.columns), None)
  if count is None: return None
  width = columns // count
  mapping = {plan.column: symbolic.add(symbolic.mul(_global_range(count, 0), width), _global_range(width, 1))}
  for i, rng in enumerate(plan.reduce.src[1:]): mapping[rng] = rng.replace(arg=(2 + i, rng.arg[1]))
  return symbolic.simplify(_substitute(ast, mapping)), count


BATCH_ROWS_MIN_WORK = 1 << 21  # (loop iterations, `_split_batch_rows`)
# (and rows per chunk, each of which packs again: an NCHW 1x1 convolution's 48 output channels over 3 images, cut
# into chunks of 24, would read each image twice, a pack per 24 rows)
BATCH_ROWS_MIN_HEIGHT = 128


def _split_batch_rows(ast: UOp, threads: int) -> tuple[UOp, int] | None:
  """A register-tiled contraction launched over a range before its rows (a batch of products: 3 members of a vmapped
  ensemble, 5 heads) whose values leave the threads uneven (SPLIT_MIN_BALANCE: 3 on 2 threads kept one idle a third
  of the time; `_split_columns` keeps such a kernel whole where its pack is each batch value's own) gets that range
  merged with equal chunks of its rows, batch * parts + part, as the new outermost range: `parts` chunks of the rows
  make the launches a multiple of the threads. Each chunk packs its batch value's operand again, as any launch chunk
  of rows does: only where the plan packs one (an NCHW 1x1 convolution's images, read in place, stream through
  once) and the chunks' plan does too. 3 x 512x512x512 on Zen 3 (2 cores, alternating processes, best / median of
  15): 95-126 / 68-100 -> 128-140 / 86-116 GFLOP/s. Returns the new AST and its outer size, or None."""
  plan = choose_opts(ast)
  if plan is None or plan.stream or plan.row is None or not plan.packed: return None
  global_ranges = global_ranges_of(ast)
  if math.prod(rng.src[0].arg for rng in global_ranges + list(plan.reduce.src[1:])) < BATCH_ROWS_MIN_WORK:
    return None  # (a few microseconds: a split sum's second stage)
  if len(global_ranges) < 3 or global_ranges[-2:] != [plan.row, plan.column]: return None
  outer, rows = global_ranges[0], plan.row.src[0].arg
  count = outer.src[0].arg
  if not leaves_threads_uneven([1] * count, threads): return None
  parts = threads // math.gcd(count, threads)
  if rows % parts or rows // parts < BATCH_ROWS_MIN_HEIGHT: return None
  height = rows // parts
  merged = _global_range(count * parts, outer.arg[0])
  mapping = {outer: symbolic.idiv(merged, parts),
             plan.row: symbolic.add(symbolic.mul(symbolic.mod(merged, parts), height),
                                    _global_range(height, plan.row.arg[0]))}
  cut = symbolic.simplify(_substitute(ast, mapping))
  # (the chunks keep the plan's kind: a packed register tile, not a dot tile for fewer rows)
  return (cut, count * parts) if (chunk := choose_opts(cut)) is not None and chunk.packed and not chunk.dot else None


def _column_blocks(plan: TilePlan, tiles: int, threads: int) -> list[int]:
  """The column tiles a launch of a wide GEMM may take (`_split_columns`), most first: none where the operands and
  the output fit the last-level cache, else the block sizes that leave two launches per thread. One tile a launch
  streams the row operand through the caches once per tile: from memory where it doesn't stay in the last level, at
  2 x 16 float32 columns (AVX2) per 6-row tile about the machine's bandwidth. A block packs its tiles together and runs
  each row tile over all of them (opt.py `TILES_PACK_BYTES`). Zen 3 (2 cores, 32 MB L3, in-process A/B, best /
  median GFLOP/s): 2048^3 (of 16) 126 / 113 -> 141 / 124 in blocks of 4 tiles (512 KB), 129 / 117 in blocks of 2;
  where everything fits (1024^3, the MLP step's GEMMs) blocks measured level or slower; and a long sum's K-blocked row
  groups over panels of a block's tiles (opt.py `PANEL_BYTES`) slower too (of 8: 512x8192x512 109 / 92 -> 97 / 81,
  1024x6144x1024 102 / 95 -> 101 / 75), so those keep one tile a launch."""
  steps = math.prod(rng.src[0].arg for rng in plan.reduce.src[1:])
  rows, columns = plan.row.src[0].arg, plan.column.src[0].arg
  if (rows * steps + steps * columns + rows * columns) * 4 <= tile_geometry().llc_bytes: return []
  return [n for n in range(tiles // (2 * threads), 1, -1) if tiles % n == 0]


def _sweep_block(plan: TilePlan, tiles: int, threads: int) -> int:
  """The column tiles of a launch of a contraction that sweeps its column (`_split_columns`): the most that make at
  most SWEEP_COLUMNS columns and a count of launches that is a multiple of the threads (0 where none does)."""
  return next((n for n in range(SWEEP_COLUMNS // plan.columns, 0, -1)
               if tiles % n == 0 and (tiles // n) % threads == 0), 0)


def _row_split_grain(ast: UOp, threads: int) -> int | None:
  """A packed register tile cut by rows (its outermost range: `_split_columns` kept it, as a weight gradient's
  `x.T @ g`) runs as one chunk of rows per thread: every chunk packs all of the reused operand again, so chunks of a
  group's rows each (claimed as the runtime's adaptive chunks grow) packed it ~10 times per thread. So does an AMX
  plan's (it packs b per column block). Its launch grain, or None for other kernels."""
  plan = choose_opts(ast)
  if plan is None or not (plan.packed or plan.amx) or plan.row is not global_ranges_of(ast)[0]: return None
  rows = plan.row.src[0].arg
  return max(plan.grain, -(-rows // (threads * plan.rows)) * plan.rows)


def _merge_contiguous_ranges(ast: UOp, outer: int) -> tuple[UOp, int]:
  """A reduction kernel's neighbouring global ranges (r1, r2) merged into one range of their sizes' product where
  every load and store reads them as one (r1's stride is r2's times r2's size) and nothing else uses them (a gate, a
  value): a 1x1 convolution's (N, H, W, C) output over NHWC data is then the (N*H*W, C) matrix product it is, whose
  register tiles and launch chunks span the rows of all of them (forward 2.4 -> 1.8 ms at 32x56x56x64 -> 64: a row
  tile of W = 56 left partial tiles and a launch over N alone). Returns the AST and its outer size."""
  nodes = ast.toposort
  if not any(node.op is Ops.REDUCE for node in nodes): return ast, outer
  ranges = global_ranges_of(ast)
  if len(ranges) < 2: return ast, outer
  indexed = [node for node in nodes if node.op in (Ops.LOAD, Ops.STORE)]
  inside = set().union(*(node.src[1].toposort for node in indexed))
  used_elsewhere: set[UOp] = set()
  for node in nodes:
    if node in inside: continue
    for position, source in enumerate(node.src):
      if source in inside and not (node.op in (Ops.LOAD, Ops.STORE) and position == 1):
        used_elsewhere |= {n for n in source.toposort if n.op is Ops.RANGE}
  forms = {node: symbolic.linear_form(node.src[1]) for node in indexed}

  def reads_as_one(first: UOp, second: UOp) -> bool:
    if first in used_elsewhere or second in used_elsewhere: return False
    for terms, _ in forms.values():
      if any(rng in atom.toposort for atom in terms if atom not in (first, second) for rng in (first, second)):
        return False  # (inside a division, a modulo, a product of ranges)
      if terms.get(first, 0) != terms.get(second, 0) * second.src[0].arg: return False
    return True

  groups: list[list[UOp]] = [[ranges[0]]]
  for rng in ranges[1:]:
    if reads_as_one(groups[-1][-1], rng): groups[-1].append(rng)
    else: groups.append([rng])
  if len(groups) == len(ranges): return ast, outer
  merged = {group[-1]: _global_range(math.prod(r.src[0].arg for r in group), group[0].arg[0])
            for group in groups if len(group) > 1}
  gone = {rng for group in groups if len(group) > 1 for rng in group[:-1]}
  replaced: dict[UOp, UOp] = {}
  for node, (terms, constant) in forms.items():
    new_terms = {merged.get(atom, atom): coefficient for atom, coefficient in terms.items() if atom not in gone}
    replaced[node.src[1]] = symbolic._build(new_terms, constant)
  rebuilt: dict[UOp, UOp] = {}
  for node in nodes:
    sources = tuple(rebuilt[source] for source in node.src)
    if node.op in (Ops.LOAD, Ops.STORE): sources = (sources[0], replaced[node.src[1]], *sources[2:])
    rebuilt[node] = node if sources == node.src else node.replace(src=sources)
  first = groups[0]
  return rebuilt[ast], math.prod(r.src[0].arg for r in first) if first[0] is ranges[0] and len(first) > 1 else outer


def _drop_unread_buffers(ast: UOp, slots: list[int]) -> tuple[UOp, tuple[int, ...]]:
  """Renumber the kernel's DEFINE_GLOBALs 0..n-1 after simplification removed some loads (`where(c, x, x)` no longer
  reads `c`), and keep only the slots still read or written."""
  used = sorted({node.arg for node in ast.toposort if node.op is Ops.DEFINE_GLOBAL})
  if used == list(range(len(slots))): return ast, tuple(slots)
  rebuilt: dict[UOp, UOp] = {}
  for node in ast.toposort:
    if node.op is Ops.DEFINE_GLOBAL: rebuilt[node] = node.replace(arg=used.index(node.arg))
    else: rebuilt[node] = node.replace(src=tuple(rebuilt[src] for src in node.src)) if node.src else node
  return rebuilt[ast], tuple(slots[index] for index in used)


def schedule(sink: UOp, threads: int | None = None, gpu: bool = False,
             min_chunk_work: int = SPLIT_MIN_CHUNK_WORK, built: Callable[[Kernel], None] | None = None) -> Schedule:
  """Lower a program (SINK over outputs, PARAM inputs) to kernels over buffer slots, for a device that runs a parallel
  launch on `threads` threads (default: `cpu_threads()`; long reductions with few outputs split for them into partial
  results of at least `min_chunk_work` iterations, split.py). `gpu`: for the GPU kernel model (codegen/gpu.py): the
  buffers of `find_buffers(gpu=True)`, and tiled products (codegen/gpu.py `gemm_tile`) as they are, without the CPU's
  relayout copies (`_Scheduler.relayout`: they read any layout) nor its column tiles (`_split_columns`). `built` is
  called with each kernel that has a reduction as soon as it is built (it is in the schedule as it is: only
  elementwise kernels are merged after, `merge_elementwise`), so that its compile can start while the rest is
  lowered."""
  threads = cpu_threads() if threads is None else threads
  sink = reduce_invariant_axes(merge_sums(prune_scans(expand_primitives(sink))))
  buffers = find_buffers(sink, gpu)
  # (found again only where reductions were split: ResNet-50's training step has none to split, 0.5 s saved)
  if (split := split_reductions(sink, threads, set(buffers), min_chunk_work, gpu)) is not sink:
    sink, buffers = split, find_buffers(split, gpu)
  params = sorted({node for node in sink.toposort if node.op is Ops.PARAM}, key=lambda node: node.arg[0])
  n_inputs = max((p.arg[0] + 1 for p in params), default=0)
  builder = _Scheduler(n_inputs, threads, gpu)
  builder.slot_of.update({p: p.arg[0] for p in params})
  projections: dict[UOp, list[UOp]] = {}
  for node in sink.toposort:
    if node.op is Ops.PROJECT: projections.setdefault(node.src[0], []).append(node)
  for node in buffers:
    if node.op is Ops.PROJECT:
      if node not in builder.slot_of:
        builder.steps += builder.loop(node.src[0], projections[node.src[0]])
        builder.copies.clear()
      continue
    builder.slot_of[node] = builder.new_slot(node.shape, node.dtype)
    steps = builder.kernels(node)
    builder.steps += steps
    for step in steps if built is not None else ():
      if isinstance(step, Kernel) and any(n.op is Ops.REDUCE for n in step.ast.toposort): built(step)
  outputs = tuple(builder.slot_of[out] for out in sink.src)
  return Schedule(tuple(merge_elementwise(builder.steps)), n_inputs, tuple(builder.specs), outputs)


def _flat_range(kernel: Kernel) -> UOp | None:
  """The one loop of an elementwise kernel that stores only at that loop's index (None for any other kernel)."""
  if kernel.sequential or kernel.ordered: return None
  nodes = kernel.ast.toposort
  ranges = [node for node in nodes if node.op is Ops.RANGE]
  if len(ranges) != 1 or any(node.op is Ops.REDUCE for node in nodes): return None
  if any(node.op is Ops.STORE and node.src[1] is not ranges[0] for node in nodes): return None
  return ranges[0]


def _merged(first: Kernel, second: Kernel) -> Kernel | None:
  """One kernel doing `first` then `second` element by element, when both are elementwise over the same loop and
  `second` reads what `first` writes only at the element it is at (that value is then used without a load), and
  `first` reads nothing `second` writes. None when they can't be merged."""
  rng = _flat_range(first)
  if rng is None or _flat_range(second) is not rng: return None
  first_stores = [node for node in first.ast.src if node.op is Ops.STORE]
  second_stores = [node for node in second.ast.src if node.op is Ops.STORE]
  written = {first.slots[store.src[0].arg]: store.src[2] for store in first_stores}
  second_written = {second.slots[store.src[0].arg] for store in second_stores}
  if second_written & set(written) or any(node.op is Ops.LOAD and first.slots[node.src[0].arg] in second_written
                                          for node in first.ast.toposort):
    return None
  slots = list(first.slots) + [slot for slot in dict.fromkeys(second.slots) if slot not in first.slots]
  mapping: dict[UOp, UOp] = {}
  for node in second.ast.toposort:
    if node.op is Ops.DEFINE_GLOBAL:
      mapping[node] = node.replace(arg=slots.index(second.slots[node.arg]))
    elif node.op is Ops.LOAD and second.slots[node.src[0].arg] in written:
      if len(node.src) > 2 or node.src[1] is not rng: return None
      mapping[node] = written[second.slots[node.src[0].arg]]
  stores = [_substitute(store, mapping) for store in second_stores]
  ast = UOp(Ops.SINK, first.ast.dtype, (*first_stores, *stores))
  ast, merged_slots = _drop_unread_buffers(ast, slots)
  name = f"{first.name.rsplit('_', 1)[0]}_{structure_key(ast)[:8]}"
  return replace(first, name=name, ast=ast, slots=merged_slots, grain=launch_grain(ast))


def merge_elementwise(steps: list[Kernel | Loop | Switch]) -> list[Kernel | Loop | Switch]:
  """Consecutive elementwise kernels over the same loop become one kernel with several outputs (`_merged`): an
  optimizer's updates of one parameter (Adam's two moments and the parameter) read the gradient and the moments once
  and launch once, instead of three kernels that each stream their operands through memory."""
  out: list[Kernel | Loop | Switch] = []
  for step in steps:
    if out and isinstance(step, Kernel) and isinstance(out[-1], Kernel) and (merged := _merged(out[-1], step)):
      out[-1] = merged
    else:
      out.append(step)
  return out


def _size_one_axes_only(source: tuple[int, ...], target: tuple[int, ...]) -> dict[int, int] | None:
  """For a RESHAPE from `source` to `target` that only inserts or removes axes of length 1: {target axis: source
  axis} for the axes longer than 1 (None for any other reshape)."""
  long_source = [i for i, d in enumerate(source) if d != 1]
  long_target = [i for i, d in enumerate(target) if d != 1]
  if [source[i] for i in long_source] != [target[i] for i in long_target]: return None
  return dict(zip(long_target, long_source))


def merge_sums(sink: UOp) -> UOp:
  """The program with each sum of a sum (through permutes and reshapes of length-1 axes only, each node read once)
  made one sum over both sets of axes: sum over the shards of the per-shard contractions of a shard_map's weight
  gradient is one contraction over the whole batch, not a buffer per shard and a second pass (a data-parallel MLP
  step over 2 devices: 2 x 512x784 partial gradients and their sum, ~0.9 ms per step)."""
  users: dict[UOp, int] = {}
  for node in sink.toposort:
    for src in node.src: users[src] = users.get(src, 0) + 1
  done: dict[UOp, UOp] = {}
  for node in sink.toposort:
    merged = _merged_sum(node, users, done) if node.op is Ops.REDUCE_AXIS and node.arg[0] is Ops.ADD else None
    done[node] = merged if merged is not None else node.replace(src=tuple(done[src] for src in node.src)) \
        if node.src and any(done[src] is not src for src in node.src) else node
  return done[sink]


def _merged_sum(outer: UOp, users: dict[UOp, int], done: dict[UOp, UOp]) -> UOp | None:
  """`outer` (a sum of the original program) as one sum with the sum below it, if there is one (see `merge_sums`),
  over the rewritten (`done`) source of that one; None otherwise."""
  chain, axes, node = [], set(outer.arg[1]), outer.src[0]
  while node.op in (Ops.PERMUTE, Ops.RESHAPE) and users.get(node, 0) <= 1:
    below = node.src[0]
    if node.op is Ops.PERMUTE: axes = {node.arg[i] for i in axes}
    else:
      mapping = _size_one_axes_only(tuple(below.shape), tuple(node.shape))
      if mapping is None: return None
      axes = {mapping[i] for i in axes if node.shape[i] != 1}
    chain.append(node)
    node = below
  if node.op is not Ops.REDUCE_AXIS or node.arg[0] is not Ops.ADD or node.dtype != outer.dtype or \
      users.get(node, 0) > 1 or not chain:
    return None
  merged = UOp(Ops.REDUCE_AXIS, outer.dtype, (done[node.src[0]],),
               (Ops.ADD, tuple(sorted(set(node.arg[1]) | axes))))
  # the same moves above it, their shapes with the newly summed axes of length 1
  value = merged
  for step in reversed(chain):
    if step.op is Ops.PERMUTE: value = UOp(Ops.PERMUTE, value.dtype, (value,), step.arg)
    else:
      source_of = _size_one_axes_only(tuple(step.src[0].shape), tuple(step.shape))
      shape = tuple(1 if d != 1 and value.shape[source_of[i]] == 1 else d for i, d in enumerate(step.shape))
      value = UOp(Ops.RESHAPE, value.dtype, (value,), shape)
  return value if value.shape == outer.shape else None


_INVARIANCE_KEEPING = {Ops.EXPAND, Ops.PERMUTE, Ops.RESHAPE, Ops.SHRINK, Ops.FLIP, Ops.REDUCE_AXIS}


def _invariant_axes(root: UOp, memo: dict[UOp, frozenset[int]]) -> frozenset[int]:
  """The axes of `root` (longer than 1) along which its value does not change: those its broadcasts made, kept
  through elementwise operations, permutes, reshapes of length-1 axes, slices and reductions. (Sources first, by a
  stack: a long elementwise chain would overflow Python's recursion.)"""
  stack = [root]
  while stack:
    node = stack[-1]
    if node in memo:
      stack.pop()
      continue
    op, shape = node.op, node.shape
    sources = node.src if op in ELEMENTWISE else node.src[:1] if op in _INVARIANCE_KEEPING else ()
    if (waiting := [src for src in sources if src not in memo]):
      stack.extend(waiting)
      continue
    stack.pop()
    if op is Ops.CONST: found = frozenset(range(len(shape)))
    elif op in ELEMENTWISE: found = frozenset.intersection(*(memo[src] for src in sources))
    elif op is Ops.EXPAND:
      below = node.src[0].shape
      found = memo[node.src[0]] | {i for i, (d, s) in enumerate(zip(shape, below)) if s == 1 and d > 1}
    elif op is Ops.PERMUTE: found = frozenset(i for i, axis in enumerate(node.arg) if axis in memo[node.src[0]])
    elif op is Ops.RESHAPE:
      mapping = _size_one_axes_only(tuple(node.src[0].shape), tuple(shape))
      found = frozenset() if mapping is None else \
          frozenset(i for i, axis in mapping.items() if axis in memo[node.src[0]])
    elif op in (Ops.SHRINK, Ops.FLIP): found = memo[node.src[0]]
    elif op is Ops.REDUCE_AXIS: found = memo[node.src[0]] | set(node.arg[1])
    else: found = frozenset()
    memo[node] = frozenset(i for i in found if shape[i] > 1)
  return memo[root]


def reduce_invariant_axes(sink: UOp) -> UOp:
  """The program with each reduction whose operand does not change along some of the axes it keeps (a contraction
  with a broadcast operand: the ones that `grad` of `f(x).sum()` sends back, `ones @ w.T`) computed once over those
  axes (at length 1) and broadcast: `grad(lambda w1, w2: (gelu(x @ w1) @ w2).sum())` at 1024x256x1024 reduced
  1024x1024x256 terms for a result that is one row repeated (14.3 ms -> a row sum)."""
  memo: dict[UOp, frozenset[int]] = {}
  done: dict[UOp, UOp] = {}
  for node in sink.toposort:
    rebuilt = node.replace(src=tuple(done[src] for src in node.src)) \
        if node.src and any(done[src] is not src for src in node.src) else node
    if node.op is Ops.REDUCE_AXIS:
      source = rebuilt.src[0]
      kept = _invariant_axes(source, memo) - set(node.arg[1])
      if kept:
        bounds = tuple((0, 1) if i in kept else (0, d) for i, d in enumerate(source.shape))
        narrow = UOp(Ops.SHRINK, source.dtype, (source,), bounds)
        reduced = UOp(Ops.REDUCE_AXIS, node.dtype, (narrow,), node.arg)
        rebuilt = UOp(Ops.EXPAND, node.dtype, (reduced,), tuple(node.shape))
    done[node] = rebuilt
  return done[sink]


def expand_primitives(sink: UOp) -> UOp:
  """The program with each named PRIMITIVE call (kept whole in loop bodies) replaced by its Ops."""
  if not any(node.op is Ops.PRIMITIVE for node in sink.toposort): return sink
  done: dict[UOp, Any] = {}
  for node in sink.toposort:
    sources = [done[src] for src in node.src]
    if node.op is Ops.PRIMITIVE:
      results = node.arg.expand(tuple(sources))
      done[node] = results if node.arg.prim.multiple_results else results[0]
    elif node.op is Ops.PROJECT and isinstance(sources[0], list): done[node] = sources[0][node.arg[0]]
    elif node.src and any(a is not b for a, b in zip(sources, node.src)): done[node] = node.replace(src=tuple(sources))
    else: done[node] = node
  return done[sink]


class _Scheduler:
  """The steps of one program over its slots: kernels for buffer nodes, loops for SCAN / WHILE nodes (whose bodies
  are scheduled as programs of their own and linked in: their input slots are the loop's slots, their other slots
  new slots of this program)."""

  def __init__(self, n_inputs: int, threads: int, gpu: bool = False):
    self.n_inputs, self.threads, self.gpu = n_inputs, threads, gpu
    self.slot_of: dict[UOp, int] = {}
    self.specs: list[tuple[tuple[int, ...], np.dtype]] = []
    self.steps: list[Kernel | Loop] = []
    # relayout copies made so far, (copy AST, source slot) -> their slot: a weight read transposed by the forward and
    # the backward pass is copied once. Forgotten for a slot written again (in place), and all at a loop or switch.
    self.copies: dict[tuple[UOp, int], int] = {}
    self.built: dict[tuple, tuple] = {}  # region_key -> (AST, its slots' numbers in the key, outer size, work)

  def new_slot(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
    self.specs.append((tuple(shape), np.dtype(dtype)))
    return self.n_inputs + len(self.specs) - 1

  def placeholder(self, slot: int, shape: tuple[int, ...], dtype: np.dtype) -> UOp:
    """A leaf node that reads slot `slot` (in kernels built here)."""
    node = UOp(Ops.PARAM, np.dtype(dtype), (), (("slot", slot), tuple(shape)))
    self.slot_of[node] = slot
    return node

  def kernels(self, node: UOp, out_slot: int | None = None, scatter_only: bool = False) -> list[Kernel]:
    """The kernels that compute buffer node `node` into its slot (or `out_slot`): one, or a SCATTER's two (the
    copy of its operand, then the scatter; only the scatter with `scatter_only`, for an update in place)."""
    if out_slot is not None:
      self.slot_of[node] = out_slot
      self.copies = {key: slot for key, slot in self.copies.items() if key[1] != out_slot}
    if 0 in node.shape: return []  # nothing to compute
    builders = [] if scatter_only else [(_Rangeify(node, self.slot_of), False)]
    if node.op is Ops.SCATTER and 0 not in node.src[2].shape: builders.append((_Rangeify(node, self.slot_of), True))
    kernels: list[Kernel] = []
    for builder, is_scatter in builders:
      after: list[Kernel] = []  # kernels to run after this one (a contraction computed transposed: its copy)
      if is_scatter:
        ast, outer, ordered = builder.build_scatter()
        ast, slots = _drop_unread_buffers(symbolic.simplify(ast), builder.params)
      else:
        ast, slots, outer = self.build(node, builder)
        if not self.gpu and (alternative := self.block_linear_alternative(node, ast)) is not None:
          ast, slots, outer, builder = alternative
        ordered = 0
        # (a GPU's tiled product reads its operands in any layout: no copies for it, nor the CPU's column tiles)
        if not self.gpu or gemm_tile(ast) is None:
          ast, slots, copies, after = self.relayout(ast, slots, builder.work)
          kernels += copies
          if after: outer = global_ranges_of(ast)[0].src[0].arg  # (computed transposed: launched over its columns)
          # (an operand copied in order may make neighbouring ranges one: a 3x3 weight gradient's (C, kh, kw) read
          # from its patches copied with the sum innermost, a GEMM's 288 columns rather than a 3-wide column)
          elif copies: ast, outer = _merge_contiguous_ranges(ast, outer)
        if not self.gpu and (split := _split_columns(ast, self.threads) or _split_stream(ast, self.threads) or
                             _split_batch_rows(ast, self.threads)) is not None:
          ast, outer = split
      kind = "s" if is_scatter else "r" if any(n.op is Ops.REDUCE for n in ast.toposort) else "e"
      name = f"{kind}_{'_'.join(map(str, node.shape)) or 'scalar'}_{structure_key(ast)[:8]}"
      grain = 1 if is_scatter else _row_split_grain(ast, self.threads) or launch_grain(ast)
      kernels.append(Kernel(name, ast, slots, outer, builder.work, grain, sequential=is_scatter, ordered=ordered))
      kernels += after
    return kernels

  def build(self, node: UOp, builder: _Rangeify) -> tuple[UOp, tuple[int, ...], int]:
    """The simplified AST of the kernel computing buffer node `node`, its slots and outer size (`builder.work` set):
    built once per structure (`region_key`), the same AST for each of ResNet-50's like blocks with its own slots."""
    key, slot_list = self.region_key(node)
    try: hit = self.built.get(key)
    except TypeError: key = hit = None  # an unhashable arg: built every time
    if hit is not None:
      ast, numbers, outer, builder.work = hit
      return ast, tuple(slot_list[number] for number in numbers), outer
    ast, slots, outer = _built(builder)
    if key is not None:
      number_of = {slot: number for number, slot in reversed(list(enumerate(slot_list)))}
      self.built[key] = (ast, tuple(number_of[slot] for slot in slots), outer, builder.work)
    return ast, slots, outer

  def block_linear_alternative(self, node: UOp, ast: UOp) -> tuple[UOp, tuple[int, ...], int, _Rangeify] | None:
    """A contraction that no register tile takes over its separate reduce ranges, built again with them as one range
    read through divisions (`_Rangeify.block_linear_reduce`) where that one gets a tile: `einsum('nop,nip->oi')` over
    (32, 64, 3136), a batched weight gradient, was a relayout copy of x (1.8 ms) and a product (2.3 ms). Its AST,
    slots, outer size and builder; None otherwise."""
    reduces = [n for n in ast.toposort if n.op is Ops.REDUCE]
    if len(reduces) != 1 or len(reduces[0].src) < 3 or choose_opts(ast) is not None: return None
    trial = _Rangeify(node, self.slot_of)
    trial.block_linear_reduce = True
    built, slots, outer = _built(trial)
    if sum(len(n.src) - 1 for n in built.toposort if n.op is Ops.REDUCE) >= len(reduces[0].src) - 1: return None
    ranges = global_ranges_of(built)
    if len(ranges) < 2 or ranges[-2].src[0].op is not Ops.CONST: return None
    # (only where the column operand, copied, would not stay in cache: below it, the copy and a plain tile won)
    if trial.work // ranges[-2].src[0].arg * reduces[0].src[0].dtype.itemsize < BLOCK_LINEAR_MIN_BYTES: return None
    return (built, slots, outer, trial) if choose_opts(built) is not None else None

  def region_key(self, root: UOp) -> tuple[tuple, list[int]]:
    """The structure of what the kernel computing buffer node `root` evaluates, down to the buffers it reads
    (`_Rangeify.emit`'s leaves, numbered by their slot in order of first appearance, `root`'s first), and those slots:
    two nodes with equal keys get the same kernel AST over their own slots."""
    slots, number = [self.slot_of[root]], {self.slot_of[root]: 0}
    index: dict[UOp, int] = {}
    entries: list[tuple] = []
    value = root.src[0] if root.op in (Ops.CONTIGUOUS, Ops.SCATTER) else root
    stack = [(value, False)]
    while stack:
      node, ready = stack.pop()
      if node in index: continue
      if node is not root and (node.op is Ops.PARAM or node in self.slot_of):
        slot = self.slot_of[node]
        if slot not in number:
          number[slot] = len(slots)
          slots.append(slot)
        index[node] = len(entries)
        entries.append((number[slot], node.shape, node.dtype))
      elif not ready:
        stack.append((node, True))
        stack.extend((src, False) for src in reversed(node.src) if src not in index)
      else:
        index[node] = len(entries)
        entries.append((node.op, node.dtype, node.shape, arg_key(node.arg), tuple(index[src] for src in node.src)))
    return (root.op, root.dtype, root.shape, tuple(entries)), slots

  def relayout(self, ast: UOp, slots: tuple[int, ...], work: int
               ) -> tuple[UOp, tuple[int, ...], list[Kernel], list[Kernel]]:
    """A contraction kernel slowed by operands read against its layout: its new AST and slots, with the kernels to
    run before it and after it. A narrow one (`transposed_output`) computes its output transposed, then copies it
    into place. Otherwise, such an operand is copied first, by a kernel of its own, into a new buffer laid out as the
    contraction wants it:
    - read with a stride along the output column (W in `ct @ W.T`, a matmul's gradient) where the register tile
      can't pack it (codegen/opt.py: a column tile cut short, an integer sum too long for one pack), which keeps the
      kernel off the tile: the copy has the column innermost, and the rewritten kernel must get the tile;
    - with a column narrower than a vector (a classifier's 10 outputs), read with a stride along the innermost
      reduction: the copy has the reduction innermost, so the plain loop nest vectorises each dot product;
    - a register-tiled GEMM's row operand read across its rows (x in `x.T @ g`, a weight gradient: each reduce step
      reads a few values of a line a whole row from the last, lines that alias in L1 where a row is a power of two
      bytes; RELAYOUT_ACROSS_BYTES or more of it): the copy has the reduction innermost, as the row operand of `a @ b`
      is read. On AMD Zen 3 (AVX2, 2 cores): 512x512x512 80-95 -> 130-150 GFLOP/s, 1024^3 69-77 -> 125.
    Only when the copy is small next to the contraction (RELAYOUT_WORK_RATIO)."""
    nodes = ast.toposort
    reduces = [n for n in nodes if n.op is Ops.REDUCE]
    ranges = global_ranges_of(ast)
    if len(reduces) != 1 or reduces[0].arg is not Ops.ADD or not ranges: return ast, slots, [], []
    column, inner = ranges[-1], reduces[0].src[-1]
    plan = choose_opts(ast)
    narrow = column.src[0].op is Ops.CONST and column.src[0].arg < NARROW_COLUMN
    across = plan is not None and not narrow and plan.row is not None and not plan.dot and len(ranges) == 2 and \
        len(reduces[0].src) == 2
    widened = self.widened_row_operand(ast, plan, column, inner) if plan is not None and not narrow else {}
    if plan is not None and not narrow and not across and not widened: return ast, slots, [], []
    if narrow and (transposed := self.transposed_output(ast, slots)) is not None: return transposed
    axis = inner if narrow or across or widened else column  # the range the copy makes innermost
    strided = []
    for load in (n for n in reduces[0].src[0].toposort if n.op is Ops.LOAD):
      strides, nonlinear = linear_strides(load.src[1])
      if widened:  # (the row operand alone, read across its rows or not)
        if load in widened: strided.append((load, strides))
        continue
      if across and (not reads_across_rows(load, plan.row, column, inner) or
                     plan.row.src[0].arg * inner.src[0].arg * load.dtype.itemsize < RELAYOUT_ACROSS_BYTES):
        continue  # (only the row operand, read across its rows)
      if len(load.src) == 2 and not nonlinear and strides.get(axis, 0) not in (0, 1): strided.append((load, strides))
    if not strided or (not narrow and len(strided) != 1): return ast, slots, [], []
    plans = []
    for load, strides in strided:
      order = sorted((r for r in strides if r is not axis), key=lambda r: r.arg[0]) + [axis]
      if any(r.src[0].op is not Ops.CONST for r in order): return ast, slots, [], []
      extents = [r.src[0].arg for r in order]
      low, high = load.src[1].vmin_vmax
      if load in widened and high - low + 1 < math.prod(extents):  # (overlapping windows: the span, as laid out)
        order, extents = None, [high - low + 1]
      plans.append((load, order, extents, low))
    ratio = RELAYOUT_WORK_RATIO // 4 if narrow else RELAYOUT_WORK_RATIO  # (a narrow strided kernel is the slower)
    if sum(math.prod(extents) for _, _, extents, _ in plans) * ratio > work: return ast, slots, [], []
    # the contraction, reading each copy (a new parameter) at its flat index over its `order`, or where it read the
    # span (a widened one's in place of its CAST: the copy is of the cast values)
    replacements = {}
    for i, (load, order, extents, low) in enumerate(plans):
      read = widened.get(load, load)
      copy_param = UOp(Ops.DEFINE_GLOBAL, read.dtype, (), len(slots) + i)
      if order is None: flat = symbolic.add(load.src[1], symbolic.const(-low))  # (the span, as laid out)
      else:
        flat = symbolic.const(0)
        for rng, stride in zip(order, _strides(tuple(extents))): flat = symbolic.add(flat, symbolic.mul(rng, stride))
      replacements[read] = UOp(Ops.LOAD, read.dtype, (copy_param, flat))
    rewritten = symbolic.simplify(_substitute(ast, replacements))
    if narrow: wanted = all(linear_strides(n.src[1])[0].get(inner, 0) in (0, 1) for n in rewritten.toposort
                            if n.op is Ops.LOAD and inner in n.src[1].toposort)
    else: wanted = choose_opts(rewritten) is not None
    if not wanted: return ast, slots, [], []
    copies, copy_slots = [], []
    for load, order, extents, low in plans:
      # the copy kernel: one global range per axis of the copy, reading the operand where the contraction did (a
      # transpose gets the blocks and register transposes of codegen/opt.py `transpose_block`: x.T of 512x784 in the
      # MLP step took 380-780 us in 16 x 16 blocks of its own, 180-270 us so), or one over the span it read
      copy_ranges = [_global_range(e, i) for i, e in enumerate(extents)]
      source_index = symbolic.add(copy_ranges[0], symbolic.const(low)) if order is None else \
          _substitute(load.src[1], dict(zip(order, copy_ranges)))
      target_index = symbolic.const(0)
      for rng, stride in zip(copy_ranges, _strides(tuple(extents))):
        target_index = symbolic.add(target_index, symbolic.mul(rng, stride))
      value = UOp(Ops.LOAD, load.dtype, (UOp(Ops.DEFINE_GLOBAL, load.dtype, (), 1), source_index))
      if (cast := widened.get(load)) is not None: value = UOp(Ops.CAST, cast.dtype, (value,))
      store = UOp(Ops.STORE, value.dtype, (UOp(Ops.DEFINE_GLOBAL, value.dtype, (), 0), target_index, value))
      copy_ast = symbolic.simplify(UOp(Ops.SINK, value.dtype, (store,)))
      source_slot = slots[load.src[0].arg]
      if (copy_slot := self.copies.get((copy_ast, source_slot))) is None:  # made for an earlier kernel: reused
        copy_slot = self.copies[(copy_ast, source_slot)] = self.new_slot(tuple(extents), value.dtype)
        name = f"e_{'_'.join(map(str, extents))}_{structure_key(copy_ast)[:8]}"
        outer = next(n.src[0].arg for n in copy_ast.toposort if n.op is Ops.RANGE and n.arg[0] == 0)
        copies.append(Kernel(name, copy_ast, (copy_slot, source_slot), outer, math.prod(extents),
                             launch_grain(copy_ast)))
      copy_slots.append(copy_slot)
    rewritten, new_slots = _drop_unread_buffers(rewritten, [*slots, *copy_slots])
    return rewritten, tuple(new_slots), copies, []

  def widened_row_operand(self, ast: UOp, plan: TilePlan, column: UOp, inner: UOp) -> dict[UOp, UOp]:
    """The row operand of a CPU register tile read as bfloat16 or float16 and cast to float32 ({its load: the
    CAST}), which `relayout` copies as float32 first: the tile converts each of its row values where it broadcasts
    it, a few instructions per FMA row (a 1024^3 bfloat16 GEMM with float32 sums ran at 60% of the float32 one),
    where the column operand is converted once, as it is packed. Only an operand read linearly along the reduction
    (read in overlapping windows, a convolution's input, `relayout` copies the span it reads as it is laid out, not
    the windows); {} otherwise, on a GPU, on AMX tiles (which read bfloat16) and for dot tiles."""
    if self.gpu or plan.row is None or plan.dot or plan.amx or plan.stream: return {}
    casts = {node.src[0]: node for node in ast.toposort if node.op is Ops.CAST and node.dtype == F32 and
             node.src[0].op is Ops.LOAD and node.src[0].dtype in (BF16, F16)}
    widened = {}
    for load, cast in casts.items():
      strides, nonlinear = linear_strides(load.src[1])
      if len(load.src) != 2 or nonlinear or column in strides or plan.row not in strides or inner not in strides:
        continue
      if any(load in node.src for node in ast.toposort if node is not cast): continue  # (read as it is elsewhere)
      widened[load] = cast
    return widened if len(widened) == 1 else {}

  def transposed_output(self, ast: UOp, slots: tuple[int, ...]
                        ) -> tuple[UOp, tuple[int, ...], list[Kernel], list[Kernel]] | None:
    """A contraction out[r, c] with a column narrower than a vector (a classifier's weight gradient h.T @ g: 10
    columns, its operand h read along the rows r) computed as out_t[c, r] (a new buffer) by a register tile over the
    rows, then copied into place: the copy is of the small output, not of the operand (h.T, read against its layout
    along the reduction; the MLP step's 512x512 h2: 122 us). None where the transposed kernel gets no tile."""
    ranges = global_ranges_of(ast)
    stores = [n for n in ast.toposort if n.op is Ops.STORE]
    if len(ranges) != 2 or len(stores) != 1 or any(r.src[0].op is not Ops.CONST for r in ranges): return None
    row, column = ranges
    (store,) = stores
    rows, columns = row.src[0].arg, column.src[0].arg
    if linear_strides(store.src[1]) != ({row: columns, column: 1}, set()): return None
    new_column, new_row = _global_range(rows, 1), _global_range(columns, 0)
    value = _substitute(store.src[2], {row: new_column, column: new_row})
    index = symbolic.add(symbolic.mul(new_row, rows), new_column)
    transposed = UOp(Ops.SINK, ast.dtype, (UOp(Ops.STORE, store.dtype, (store.src[0], index, value)),))
    transposed = symbolic.simplify(transposed)
    if choose_opts(transposed) is None: return None
    dtype = store.src[0].dtype
    temp = self.new_slot((columns, rows), dtype)
    # the copy into place: out[r, c] = out_t[c, r]
    r, c = _global_range(rows, 0), _global_range(columns, 1)
    read = UOp(Ops.LOAD, dtype, (UOp(Ops.DEFINE_GLOBAL, dtype, (), 1), symbolic.add(symbolic.mul(c, rows), r)))
    target = symbolic.add(symbolic.mul(r, columns), c)
    write = UOp(Ops.STORE, dtype, (UOp(Ops.DEFINE_GLOBAL, dtype, (), 0), target, read))
    copy_ast = symbolic.simplify(UOp(Ops.SINK, dtype, (write,)))
    copy = Kernel(f"e_{rows}_{columns}_{structure_key(copy_ast)[:8]}", copy_ast, (slots[0], temp), rows,
                  rows * columns, launch_grain(copy_ast))
    return transposed, (temp, *slots[1:]), [], [copy]

  def copy(self, source: UOp, out_slot: int) -> list[Kernel]:
    """Kernels writing the value of `source` into slot `out_slot` (a CONTIGUOUS whose arg names the slot, so that it
    is never the same node as one of the program's own)."""
    return self.kernels(UOp(Ops.CONTIGUOUS, source.dtype, (source,), ("into", out_slot)), out_slot)

  def link(self, program: UOp, input_slots: list[int]) -> tuple[list[Kernel | Loop], list[int]]:
    """Schedule sub-program `program` (a loop's body or condition) and map it into this program's slots: its input
    i reads slot input_slots[i], its own buffers get new slots. Returns its steps and its outputs' slots."""
    sub = schedule(program, self.threads, self.gpu)
    mapping = {i: input_slots[i] for i in range(sub.n_inputs)}
    for index, (shape, dtype) in enumerate(sub.slot_specs): mapping[sub.n_inputs + index] = self.new_slot(shape, dtype)
    return _remap(sub.kernels, mapping), [mapping[slot] for slot in sub.outputs]

  def operand_slot(self, node: UOp) -> int: return self.slot_of[node]

  def init_carries(self, loop_node: UOp, n_carry: int) -> tuple[list[Kernel], list[int]]:
    """New slots for a loop's carries, and the kernels that copy the initial values into them."""
    steps, slots = [], []
    for init in loop_node.src[:n_carry]:
      slots.append(self.new_slot(init.shape, init.dtype))
      steps += self.copy(init, slots[-1])
    return steps, slots

  def update_carries(self, carry_slots: list[int], new_slots: list[int], body_steps: list[Kernel | Loop],
                     input_slots: list[int]) -> list[Kernel]:
    """Kernels that copy a pass's new carries into the carry slots (through a temporary where a new carry is
    another carry's slot, which the copies may overwrite first). A new carry computed elementwise from the old one
    needs no copy: its kernel writes the carry slot itself (`_write_in_place`, which edits `body_steps`), unless the
    old value is another carry's new one (`(a, b) -> (b, a + b)`: b must be copied before a + b overwrites it)."""
    new_slots = list(new_slots)
    for k, (carry, new) in enumerate(zip(carry_slots, new_slots)):
      passed_on = any(other == carry for j, other in enumerate(new_slots) if j != k)
      if new != carry and new not in input_slots and new_slots.count(new) == 1 and not passed_on and \
          _write_in_place(body_steps, new, carry):
        new_slots[k] = carry
    steps, moves = [], []
    for slot, new in zip(carry_slots, new_slots):
      if slot == new: continue
      shape, dtype = self.spec(slot)
      if new in carry_slots:
        temporary = self.new_slot(shape, dtype)
        steps += self.copy(self.placeholder(new, shape, dtype), temporary)
        new = temporary
      moves.append((slot, new, shape, dtype))
    for slot, new, shape, dtype in moves: steps += self.copy(self.placeholder(new, shape, dtype), slot)
    return steps

  def spec(self, slot: int) -> tuple[tuple[int, ...], np.dtype]: return self.specs[slot - self.n_inputs]

  def loop(self, node: UOp, projections: list[UOp]) -> list[Kernel | Loop | Switch]:
    """The steps of a SCAN, WHILE, COND or CALLBACK node; assigns its PROJECT nodes their slots."""
    if node.op is Ops.CALLBACK: return [self.host_call(node, projections)]
    if node.op is Ops.COND: return self.cond(node, projections)
    return self.scan(node, projections) if node.op is Ops.SCAN else self.while_loop(node, projections)

  def host_call(self, node: UOp, projections: list[UOp]) -> HostCall:
    """The step of a CALLBACK node: its operands' slots in, a new slot per result out (the PROJECTs get theirs)."""
    by_index = {projection.arg[0]: projection for projection in projections}
    out_slots = []
    for index, (shape, dtype) in enumerate(node.arg.out_avals):
      out_slots.append(self.new_slot(shape, dtype))
      if index in by_index: self.slot_of[by_index[index]] = out_slots[-1]
    in_slots = [self.slot_of[src] for src in node.src]
    avals = tuple((tuple(src.shape), np.dtype(src.dtype)) for src in node.src) + tuple(
      (tuple(shape), np.dtype(dtype)) for shape, dtype in node.arg.out_avals)
    return HostCall(f"callback_{node.arg.name}", node.arg, (*in_slots, *out_slots), len(in_slots), avals)

  def cond(self, node: UOp, projections: list[UOp]) -> list[Kernel | Switch]:
    index, *operands = node.src
    branches = node.arg
    outs = branches[0].src
    out_slots = [self.new_slot(out.shape, out.dtype) for out in outs]
    for projection in projections: self.slot_of[projection] = out_slots[projection.arg[0]]
    inputs = [self.operand_slot(o) for o in operands]
    branch_steps = []
    for branch in branches:
      steps, results = self.link(branch, inputs)
      for out_slot, result, out in zip(out_slots, results, outs):
        steps += self.copy(self.placeholder(result, out.shape, out.dtype), out_slot)
      branch_steps.append(tuple(steps))
    return [Switch(self.operand_slot(index), tuple(branch_steps))]

  def scan(self, node: UOp, projections: list[UOp]) -> list[Kernel | Loop]:
    body, length, reverse, n_carry, n_xs = node.arg
    xs, consts = node.src[n_carry:n_carry + n_xs], node.src[n_carry + n_xs:]
    steps, carry_slots = self.init_carries(node, n_carry)
    y_nodes = body.src[n_carry:]
    ys_slots = [self.new_slot((length, *y.shape), y.dtype) for y in y_nodes]
    for projection in projections:
      index = projection.arg[0]
      self.slot_of[projection] = carry_slots[index] if index < n_carry else ys_slots[index - n_carry]
    if length == 0: return steps
    counter_slot = self.new_slot((), COUNTER_DTYPE)  # the pass number, written by the runtime (Loop.counter_slot)
    counter = self.placeholder(counter_slot, (), COUNTER_DTYPE)
    position = counter if not reverse else \
      UOp(Ops.ADD, COUNTER_DTYPE, (UOp.const(COUNTER_DTYPE, length - 1), UOp(Ops.NEG, COUNTER_DTYPE, (counter,))))
    index = UOp(Ops.RESHAPE, COUNTER_DTYPE, (position,), (1,))
    # the body reads this pass's slice of each x straight from xs (a GATHER at the counter, fused into its kernels)
    n_in = n_carry + n_xs + len(consts)
    counter_param = UOp(Ops.PARAM, COUNTER_DTYPE, (), (n_in + n_xs, ()))
    body_position = counter_param if not reverse else UOp(Ops.ADD, COUNTER_DTYPE, (
      UOp.const(COUNTER_DTYPE, length - 1), UOp(Ops.NEG, COUNTER_DTYPE, (counter_param,))))
    body_index = UOp(Ops.RESHAPE, COUNTER_DTYPE, (body_position,), (1,))
    slices = {}
    for j, x in enumerate(xs):
      full = UOp(Ops.PARAM, x.dtype, (), (n_in + j, x.shape))
      gathered = UOp(Ops.GATHER, x.dtype, (full, body_index), (1,))
      slices[n_carry + j] = UOp(Ops.RESHAPE, x.dtype, (gathered,), x.shape[1:])
    body = _replace_params(body, slices)
    inputs = carry_slots + [self.operand_slot(x) for x in xs] + [self.operand_slot(c) for c in consts]
    body_steps, out_slots = self.link(body, inputs + [self.operand_slot(x) for x in xs] + [counter_slot])
    for ys_slot, y_slot, y in zip(ys_slots, out_slots[n_carry:], y_nodes):  # this pass's y, written in place
      ys = self.placeholder(ys_slot, (length, *y.shape), y.dtype)
      update = UOp(Ops.RESHAPE, y.dtype, (self.placeholder(y_slot, y.shape, y.dtype),), (1, *y.shape))
      write = UOp(Ops.SCATTER, y.dtype, (ys, index, update), ScatterArg("set", (1,), True, True))
      body_steps += self.kernels(write, ys_slot, scatter_only=True)
    body_steps += self.update_carries(carry_slots, out_slots[:n_carry], body_steps,
                                      inputs + [self.operand_slot(x) for x in xs] + [counter_slot])
    reads_counter = any(counter_slot in kernel.slots for kernel in kernels_of(tuple(body_steps)))
    return steps + [Loop(tuple(body_steps), trip=length, counter_slot=counter_slot if reads_counter else -1)]

  def while_loop(self, node: UOp, projections: list[UOp]) -> list[Kernel | Loop]:
    cond, body, n_carry = node.arg
    steps, carry_slots = self.init_carries(node, n_carry)
    for projection in projections: self.slot_of[projection] = carry_slots[projection.arg[0]]
    inputs = carry_slots + [self.operand_slot(c) for c in node.src[n_carry:]]
    cond_steps, (flag_slot,) = self.link(cond, inputs)
    body_steps, out_slots = self.link(body, inputs)
    body_steps += self.update_carries(carry_slots, out_slots, body_steps, inputs)
    return steps + [Loop(tuple(body_steps), None, tuple(cond_steps), flag_slot)]


def _write_in_place(steps: list[Kernel | Loop], new: int, carry: int) -> bool:
  """Make the kernel that writes slot `new` (a loop pass's new carry) write slot `carry` instead, when that is safe:
  it is the last writer of `new`, reads `carry` only at the element it writes, and no later step reads `carry` (the
  old value). Later steps then read `carry` for `new`. Returns whether it did."""
  def store_of(step: Kernel | Loop | Switch) -> UOp | None:
    if not isinstance(step, Kernel): return None
    return next((node for node in step.ast.src if node.op is Ops.STORE and step.slots[node.src[0].arg] == new), None)
  writers = [i for i, step in enumerate(steps) if store_of(step) is not None]
  if any(isinstance(step, Switch) for step in steps): return False
  if not writers: return False
  position = writers[-1]
  writer, later = steps[position], steps[position + 1:]
  if writer.sequential or any(isinstance(step, Loop) or carry in step.slots for step in later): return False
  sink, store = writer.ast, store_of(writer)
  reads = [j for j, slot in enumerate(writer.slots) if slot == carry]
  # with several STOREs (merged kernels), a load of the carry feeding a later STORE could run after it is overwritten
  if reads and sum(node.op is Ops.STORE for node in sink.src) > 1: return False
  for node in sink.toposort:
    if node.op is Ops.LOAD and node.src[0].arg in reads and (len(node.src) > 2 or node.src[1] is not store.src[1]):
      return False
  if any(node.op is Ops.STORE and node.src[1] is not store.src[1] for node in sink.src): return False
  output = store.src[0]
  ast = graph_rewrite(sink, PatternMatcher([(UPat(Ops.DEFINE_GLOBAL, name="g"),
                                             lambda g: output if g.arg in reads else None)]))
  ast, slots = _drop_unread_buffers(ast, [carry if slot == new else slot for slot in writer.slots])
  steps[position] = replace(writer, ast=ast, slots=slots)
  for i in range(position + 1, len(steps)):
    steps[i] = replace(steps[i], slots=tuple(carry if slot == new else slot for slot in steps[i].slots))
  return True


def prune_scans(sink: UOp) -> UOp:
  """The program with each SCAN's unread parts dropped, as JAX's dead-code elimination of a scan does: the ys no
  PROJECT reads (and their computation in the body), then the xs and consts its body no longer reads, so that an
  earlier scan's ys read only by those go too, until nothing changes. A gradient's forward pass stacks residuals of
  which its backward pass may read only some (an HMM's log-likelihood, the reduce_max mask of `logsumexp`: 6 of the
  14 kernels of each forward pass computed and stored unread ones). Bodies are pruned first."""
  while True:
    nodes = sink.toposort
    if not any(node.op is Ops.SCAN for node in nodes): return sink
    projections: dict[UOp, list[UOp]] = {}
    for node in nodes:
      if node.op is Ops.PROJECT: projections.setdefault(node.src[0], []).append(node)
    done: dict[UOp, UOp] = {}
    outputs: dict[UOp, dict[int, int]] = {}  # a pruned scan -> its outputs' new indices
    for node in nodes:
      src = tuple(done[s] for s in node.src)
      if node.op is Ops.SCAN: done[node], outputs[node] = _pruned_scan(node, src, projections.get(node, []))
      elif node.op is Ops.PROJECT and node.src[0] in outputs:
        done[node] = node.replace(src=src, arg=(outputs[node.src[0]][node.arg[0]], *node.arg[1:]))
      else: done[node] = node.replace(src=src) if src != node.src else node
    if done[sink] is sink: return sink
    sink = done[sink]


def _pruned_scan(node: UOp, src: tuple[UOp, ...], projections: list[UOp]) -> tuple[UOp, dict[int, int]]:
  """(`node` with operands `src`, its body pruned and without the ys none of `projections` reads and the xs and consts
  its body doesn't read; the new index of each output read)."""
  body, _, _, n_carry, n_xs = node.arg
  pruned = prune_scans(body)
  read = {projection.arg[0] for projection in projections}
  ys = [k for k in range(n_carry, len(pruned.src)) if k in read]
  if len(ys) < len(pruned.src) - n_carry:
    pruned = pruned.replace(src=(*pruned.src[:n_carry], *(pruned.src[k] for k in ys)))
  params = {n.arg[0] for n in pruned.toposort if n.op is Ops.PARAM}
  operands = [i for i in range(len(src)) if i < n_carry or i in params]
  indices = {i: i for i in range(n_carry)} | {k: n_carry + j for j, k in enumerate(ys)}
  if pruned is body and len(operands) == len(src): return (node.replace(src=src) if src != node.src else node), indices
  if len(operands) < len(src): pruned = _renumber_params(pruned, {old: new for new, old in enumerate(operands)})
  arg = node.arg._replace(body=pruned, n_xs=sum(n_carry <= i < n_carry + n_xs for i in operands))
  return node.replace(src=tuple(src[i] for i in operands), arg=arg), indices


def _renumber_params(program: UOp, numbers: dict[int, int]) -> UOp:
  """`program` with PARAM i numbered numbers[i]."""
  return _replace_params(program, {n.arg[0]: n.replace(arg=(numbers[n.arg[0]], *n.arg[1:]))
                                   for n in program.toposort if n.op is Ops.PARAM})


def _replace_params(program: UOp, replacements: dict[int, UOp]) -> UOp:
  """`program` with PARAM i replaced by the node replacements[i] (others kept)."""
  done: dict[UOp, UOp] = {}
  for node in program.toposort:
    if node.op is Ops.PARAM and node.arg[0] in replacements: done[node] = replacements[node.arg[0]]
    elif node.src: done[node] = node.replace(src=tuple(done[s] for s in node.src))
    else: done[node] = node
  return done[program]


def _remap(steps: tuple[Kernel | Loop, ...], mapping: dict[int, int]) -> list[Kernel | Loop]:
  """Steps of a sub-program with their slots renamed by `mapping`."""
  out: list[Kernel | Loop | Switch] = []
  for step in steps:
    if isinstance(step, Loop):
      out.append(Loop(tuple(_remap(step.body, mapping)), step.trip, tuple(_remap(step.cond, mapping)),
                      mapping[step.flag_slot] if step.flag_slot >= 0 else -1,
                      mapping[step.counter_slot] if step.counter_slot >= 0 else -1))
    elif isinstance(step, Switch):
      out.append(Switch(mapping[step.index_slot], tuple(tuple(_remap(b, mapping)) for b in step.branches)))
    else:
      out.append(replace(step, slots=tuple(mapping[slot] for slot in step.slots)))
  return out
