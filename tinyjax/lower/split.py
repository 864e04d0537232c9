"""Split reductions: a long reduction with few outputs becomes two kernels, so that every core works on it.

A kernel is parallel over its outermost global range, the output's first axis longer than 1. A reduction with fewer
values of it than threads (`x.sum()`, a kernel with no global range at all; `sum(axis=1)` of a (2, 8M) array) would
run on one or two threads however long it is, and a handful of values per thread leaves the threads unbalanced. Such a
reduction of `length` elements is rewritten, at the array level, before fusion (the tinygrad split-reduce):

    partials[p, kept...] = reduce(x[kept..., p * chunk : (p + 1) * chunk])      chunk = length // P, P partials
    result[kept...]      = reduce(partials[:, kept...]) (+) reduce(x[kept..., P * chunk :])    the tail: < P elements

The first stage is its own kernel (the partials are CONTIGUOUS), parallel over its P contiguous chunks (a multiple of
the threads, a few per thread); the second is small and keeps the reduction's elementwise epilogue. The reduced axes
are moved last and flattened first, so any set of axes splits the same way, and the tail needs no padding (no gated
loads in the long loop). With one thread nothing splits; the schedule depends on the thread count, which is part of
the schedule cache's key (realize.py).

Accuracy: float32 (and float16 / bfloat16) sums keep their partials in float64, without rounding: the first stage is
a REDUCE_AXIS whose dtype (float64) is wider than its operand's, which codegen accumulates like any float32 sum
(float32 blocks added into float64) but stores unrounded; the second stage adds P float64 values and rounds once. So
a split sum is as accurate as the single-kernel one. Integer sums (wrapping) and MAX are exact in any order.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from tinyjax.codegen.opt import (CONTRACTION_SUM_BLOCK, GROUP_MIN_BLOCKS, GROUP_ROWS, PACK_BYTES, PANEL_BYTES,
                                 PANEL_GROUP_ROWS, STREAM_TILE, tile_geometry)
from tinyjax.uop import BOOL, Ops, UOp

# Split only when the reduction has fewer outputs than threads x SPLIT_OUTPUTS_PER_THREAD: with at least that many,
# the launch over the outputs alone keeps every thread busy (at most 1 / SPLIT_OUTPUTS_PER_THREAD idle at the end). A
# reduction over outer axes counts its stream tiles of STREAM_TILE outputs instead: sum(axis=0) of 8192x1024 float32
# was one tile on one thread (1.2 ms, JAX 0.85).
SPLIT_OUTPUTS_PER_THREAD = 8
# ... or when a contraction's launch units (its row groups, or the rows of taps before its rows) keep the busiest
# thread at work for more than 1 / SPLIT_MIN_BALANCE of an even share: split into partial sums, they ran up to twice
# as fast (`split_partials`); 9 groups of 30 rows (256 x 8192 x 256) ran faster unsplit.
SPLIT_MIN_BALANCE = 0.8
# The first stage is a launch over its P partial results per output (the outermost loop): P is a multiple of the
# threads, up to threads x SPLIT_PARTIALS_PER_THREAD so that the runtime can still balance a thread slowed down by
# other work (2 to 32 per thread measured the same on a 4096x4096 float32 sum on 2 cores) ...
SPLIT_PARTIALS_PER_THREAD = 4
# ... with at least SPLIT_MIN_CHUNK_WORK loop iterations per partial result, so that each is one long contiguous
# stream (64 KB of float32) whose horizontal reduction and store cost nothing next to it ...
SPLIT_MIN_CHUNK_WORK = 1 << 14
# ... and the partial sums of a contraction that reads each operand along its rows (`x @ w.T`: a dot tile, codegen/
# opt.py `_dot_plan`) each at least SPLIT_MIN_DOT_STEPS steps (as few as one per thread): in chunks of 512 steps, x @
# w.T of 8 x 4096 by 4096 x 4096 read each row of w in runs of 2 KB, far apart, which the prefetchers barely start on
# before they end (in-process A/B on Zen 3, best / median GFLOP/s: 55-58 / 51-55 -> 68-85 / 63-71 in 2 partials, JAX
# 61; 32 rows 60-97 / 56-77 -> 94-113 / 86-102, JAX 105). (Not `x @ w`, read across w's rows: 32 rows 88-97 -> 59-81.)
SPLIT_MIN_DOT_STEPS = 2048
# ... and the partial sums of a long contraction split because its row groups leave the threads uneven (`x.T @ g`,
# SPLIT_MIN_BALANCE) each at least SPLIT_MIN_GROUPED_STEPS steps (as few as one per thread), so that each runs in
# K-blocked row groups of its own (codegen/opt.py GROUP_MIN_BLOCKS): on Zen 3's 2 threads, best GFLOP/s over runs,
# 8 partials against 2: 16384x128x128 76-97 -> 104-144, 16384x96x96 92-125 -> 120-141, 16384x64x64 94-96 -> 120-128
# (32768x128x128 in 4: 107-143 -> 140-143); at 8192 steps 2 partials measured as 8 (56-157 against 61-147 over three
# shapes), and a CNN's dense layer (128 x 3136 x 128) slower in 2 (155-161 -> 146-149): shorter sums keep theirs.
SPLIT_MIN_GROUPED_STEPS = 8192
# A contraction whose output column is shorter than NARROW_COLUMN (one AVX-512 float32 vector) is computed transposed
# (schedule.py `_Scheduler.relayout`, `transposed_output`: a classifier's weight gradient h.T @ g, 10 columns): its
# launch units are the column tiles of its rows, which stay whole. Split into partials, it was no longer one
# two-range contraction to transpose, and each partial copied its chunk of h transposed first (A/B on Zen 3, best
# GFLOP/s: h.T @ g of 65536 x 512 x 10 16-17 -> 28-32, 16384 x 1024 x 10 10-11 -> 25, 32768 x 512 x 4 6-7 -> 32-36;
# JAX 13 and 9; then swept, codegen/opt.py SWEEP_ROWS).
NARROW_COLUMN = 16
# (a GPU's work-items are many and cheap: a partial result of GPU_SPLIT_MIN_CHUNK_WORK iterations is enough there; a
# column sum of 100000x8 was 8 work-items of 100000 strided steps each, 63 ms on PoCL)
GPU_SPLIT_MIN_CHUNK_WORK = 1 << 10
# ... and only for reductions of at least SPLIT_MIN_WORK loop iterations in all: below it, a second kernel and its
# launch cost about what the other cores would save (2^18 float32 elements are 1 MB, ~40 us on one thread).
SPLIT_MIN_WORK = 1 << 18
# The reductions that split: sums and maxima (min is max of a negation) of these dtypes.
SPLIT_OPS = (Ops.ADD, Ops.MAX)
_FLOAT16, _BFLOAT16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
SPLIT_DTYPES = frozenset({BOOL, _FLOAT16, _BFLOAT16, _F32, _F64} |
                         {np.dtype(f"{kind}{size}") for kind in "iu" for size in (1, 2, 4, 8)})
# A sum of these keeps its partial sums in float64 (see the module docstring).
WIDE_SUM_DTYPES = frozenset({_FLOAT16, _BFLOAT16, _F32})


def _element_cost(node: UOp, realized: set[UOp], memo: dict[UOp, int]) -> int:
  """Loop iterations to compute one element of `node` inside a kernel: 1 for a load (a PARAM or a node that is a
  buffer of its own), the reduced length times the operand's cost for a nested reduction, else its costliest source."""
  if node in memo: return memo[node]
  if node.op is Ops.PARAM or node in realized or not node.src: cost = 1
  elif node.op is Ops.REDUCE_AXIS:
    source = node.src[0]
    cost = math.prod(source.shape[axis] for axis in node.arg[1]) * _element_cost(source, realized, memo)
  else: cost = max(_element_cost(src, realized, memo) for src in node.src)
  memo[node] = cost
  return cost


def _broadcasts(source: UOp, realized: set[UOp]) -> bool:
  """Whether the expression `source` fuses into its kernel (down to buffers) has an EXPAND: a contraction."""
  seen, stack = set(), [source]
  while stack:
    node = stack.pop()
    if node in seen or node.op is Ops.PARAM or (node in realized and node is not source): continue
    if node.op is Ops.EXPAND: return True
    seen.add(node)
    stack.extend(node.src)
  return False


def leaves_threads_uneven(sizes: list[int], threads: int) -> bool:
  """Whether launch units of `sizes`, dealt largest first each to the least loaded of `threads` threads, keep the
  busiest at work for more than 1 / SPLIT_MIN_BALANCE of an even share."""
  loads = [0] * threads
  for size in sorted(sizes, reverse=True): loads[loads.index(min(loads))] += size
  return sum(sizes) < SPLIT_MIN_BALANCE * threads * max(loads)


def _read_along(node: UOp, axis: int, realized: set[UOp]) -> bool:
  """Whether every buffer that the expression `node` fuses down to reads `axis` of `node` as its own last axis (or
  not at all: broadcast along it), through expansions, permutations and reshapes that add or drop axes of size 1:
  each operand of a contraction read along its rows. False for any other view or op on the way."""
  if node.op is Ops.PARAM or node in realized: return axis == len(node.shape) - 1
  if not node.src: return True  # (a constant)
  source = node.src[0]
  if node.op is Ops.EXPAND: return source.shape[axis] == 1 or _read_along(source, axis, realized)
  if node.op is Ops.PERMUTE: return _read_along(source, node.arg[axis], realized)
  if node.op is Ops.RESHAPE:
    if node.shape[axis] == 1: return True
    kept = [i for i, size in enumerate(source.shape) if size != 1]
    if [node.shape[i] for i in range(len(node.shape)) if node.shape[i] != 1] != [source.shape[i] for i in kept]:
      return False
    return _read_along(source, kept[sum(1 for size in node.shape[:axis] if size != 1)], realized)
  if node.op in (Ops.MUL, Ops.ADD, Ops.CAST) and all(src.shape == node.shape for src in node.src):
    return all(_read_along(src, axis, realized) for src in node.src)
  return False


def split_partials(reduction: UOp, threads: int, realized: set[UOp], memo: dict[UOp, int] | None = None,
                   min_chunk_work: int = SPLIT_MIN_CHUNK_WORK, gpu: bool = False) -> int:
  """How many partial results per output REDUCE_AXIS `reduction` is split into on a machine running `threads`
  threads per launch (`gpu`: work-items, not the CPU's register tiles), each of at least `min_chunk_work` loop
  iterations; 0 when it stays one kernel. `realized`: the nodes fusion makes buffers of."""
  reduce_op, axes = reduction.arg
  if threads < 2 or reduce_op not in SPLIT_OPS or reduction.dtype not in SPLIT_DTYPES: return 0
  outputs = math.prod(reduction.shape)
  source = reduction.src[0]
  # over outer axes only (`x.sum(axis=0)`), a kernel streams its outputs in tiles of STREAM_TILE, its unit of
  # parallelism (codegen/opt.py); a contraction (a broadcast product) gets a register tile instead, when it has a
  # row: a kept axis besides the last (a batch-norm sum of x times a per-channel scale, over N, H and W, has none:
  # it streams, and one unsplit stream tile of ResNet-50's 8x55x55x256 ran on one thread at 18 GB/s)
  kept = [axis for axis in range(len(source.shape)) if axis not in axes and source.shape[axis] > 1]
  streamed = len(source.shape) - 1 not in axes and (len(kept) <= 1 or not _broadcasts(source, realized))
  # otherwise the launch is over the output's first axis longer than 1 (a weight gradient's (3, 3, C, O): 3 units);
  # when that is the only one and the source's last axis (a contraction's column, register-tiled), over its tiles (a
  # bias gradient's 32 columns: 1 unit; a row sum's rows stay units of their own)
  column = kept == [len(source.shape) - 1]
  geometry = tile_geometry()
  tile_width = geometry.vector_bytes // 4 * geometry.tile_vectors  # a float32 register tile's columns
  units = -(-outputs // STREAM_TILE) if streamed else \
      -(-outputs // (geometry.vector_bytes // 4 * geometry.rowless_vectors)) if column else \
      source.shape[kept[0]] if kept else 1
  length = math.prod(source.shape[axis] for axis in axes)
  # a float32 contraction summing more than GROUP_MIN_BLOCKS blocks runs its rows in K-blocked groups (codegen/opt.py
  # GROUP_ROWS), a launch unit each; where its reused operand (the sum's steps x the column tiles packed together,
  # `_packed_loads`) takes more than PACK_BYTES, it packs in panels and the groups grow to PANEL_GROUP_ROWS. Where
  # those groups leave the threads uneven (`SPLIT_MIN_BALANCE`) it splits, counted by a partial's whole work (each
  # computes all the outputs): a weight gradient x.T @ g of 64 x 64 outputs summed over 8192 positions was one group
  # on one thread (42-46 GFLOP/s; split 83-97), 128 x 128 over 8192 a group of 126 rows and one of 2 (53-61; split
  # 74-86), a 1x1 convolution's over 32x56x56 positions one group (6.2 ms; split into 4 partial GEMMs: 3.1 ms).
  # A panel of every column tile (more than one) keeps the kernel launched over its first axis when there are ranges
  # before the row (schedule.py `_split_columns`): a 3x3 convolution's weight gradient (3, 3, 32, 64) summed over
  # 64x16x16 positions ran over its 3 rows of taps on 2 threads (7.5-9.2 ms; split 5.1-6.1).
  sizes: list[int] = []
  contraction = not gpu and not streamed and not column and len(kept) >= 2
  if contraction and len(kept) == 2 and source.shape[kept[-1]] < NARROW_COLUMN:
    units = -(-source.shape[kept[-2]] // tile_width)  # (computed transposed: over the column tiles of its rows)
  elif contraction and length > GROUP_MIN_BLOCKS * CONTRACTION_SUM_BLOCK:
    rows, width = source.shape[kept[-2]], source.shape[kept[-1]]
    tiles = width // tile_width if width % tile_width == 0 else 1
    if tiles * tile_width * 4 * CONTRACTION_SUM_BLOCK > PANEL_BYTES: tiles = 1
    panelled = length * min(width, tile_width) * 4 * tiles > PACK_BYTES
    if len(kept) == 2:
      group = (PANEL_GROUP_ROWS if panelled else GROUP_ROWS) // geometry.tile_rows * geometry.tile_rows
      units = -(-rows // group)
      sizes = [group] * (rows // group) + [rows % group]
    elif panelled and tiles > 1 and units < threads * SPLIT_OUTPUTS_PER_THREAD:
      sizes = [1] * units
  uneven = bool(sizes) and leaves_threads_uneven(sizes, threads)
  if units >= threads * SPLIT_OUTPUTS_PER_THREAD and not uneven: return 0
  per_output = length * _element_cost(source, realized, {} if memo is None else memo)
  if outputs * per_output < SPLIT_MIN_WORK: return 0  # also an empty reduction
  # (a streamed chunk reads all its outputs' columns too; counted by one output's steps, a 1x1 weight gradient over
  # 8x56x56 positions, 64 x 25088 x 64, stayed one kernel on one thread: 0.84 -> 0.59 ms; 128x8192x256 2.0 -> 1.4)
  chunk_work = outputs * per_output if streamed or uneven else per_output
  # (chunks of at least 2 elements: a partial result per element is the input copied; chunks of min_chunk_work
  # rounded, not floored: a flat convolution's weight gradient over 32736 steps, 0.1% short of 2 chunks, stayed one
  # kernel launched over its 3 rows of taps on 2 threads, 5.6 ms, where 32768 steps split in 2 took 4.3)
  partials = min(threads * SPLIT_PARTIALS_PER_THREAD, (2 * chunk_work + min_chunk_work) // (2 * min_chunk_work),
                 length // 2) // threads * threads
  if uneven and len(kept) == 2 and length >= threads * SPLIT_MIN_GROUPED_STEPS:
    partials = min(partials, length // SPLIT_MIN_GROUPED_STEPS // threads * threads)
  if not gpu and len(axes) == 1 and length < partials * SPLIT_MIN_DOT_STEPS and _broadcasts(source, realized) and \
      _read_along(source, axes[0], realized):
    partials = max(threads, length // SPLIT_MIN_DOT_STEPS // threads * threads)
  # a count that divides the first reduced axis splits that axis alone (`split_reduction`): prefer one if there is
  leading = source.shape[min(axes)]
  return next((p for p in range(partials, 0, -threads) if leading % p == 0), partials)


def _node(op: Ops, src: UOp, arg=None, dtype: np.dtype | None = None) -> UOp:
  return UOp(op, src.dtype if dtype is None else dtype, (src,), arg)


def split_reduction(reduction: UOp, partials: int, contiguous: bool) -> UOp:
  """The two-stage form of REDUCE_AXIS `reduction` (same shape, dtype and value, up to reassociation) with `partials`
  partial results per output; CONTIGUOUS when the original was a buffer of its own (broadcast after it)."""
  reduce_op, axes = reduction.arg
  axes = tuple(sorted(axes))
  source = reduction.src[0]
  kept = [axis for axis in range(len(source.shape)) if axis not in axes]
  kept_shape = tuple(source.shape[axis] for axis in kept)
  n_kept = len(kept_shape)
  length = math.prod(source.shape[axis] for axis in axes)
  wide = _F64 if reduce_op is Ops.ADD and reduction.dtype in WIDE_SUM_DTYPES else reduction.dtype
  order = (*kept, *axes)
  moved = source if order == tuple(range(len(order))) else _node(Ops.PERMUTE, source, order)
  first, *others = (source.shape[axis] for axis in axes)
  tail = None
  if len(axes) > 1 and first % partials == 0:
    # the first reduced axis alone is cut into (partials, rest), so the first stage keeps one loop per reduced axis
    # with plain strides (a bias gradient's (N, H, W) sum: flattened, H and W were a division and a modulo each)
    body = _node(Ops.RESHAPE, moved, (*kept_shape, partials, first // partials, *others))
    reduced = tuple(range(n_kept + 1, n_kept + 2 + len(others)))
  else:  # the reduced axes flattened into chunks, and a tail that no chunk covers
    chunk = length // partials
    body_length = chunk * partials
    full = tuple((0, dim) for dim in kept_shape)
    flat = _node(Ops.RESHAPE, moved, (*kept_shape, length))
    body = flat if body_length == length else _node(Ops.SHRINK, flat, (*full, (0, body_length)))
    body = _node(Ops.RESHAPE, body, (*kept_shape, partials, chunk))
    reduced = (n_kept + 1,)
    if body_length < length: tail = _node(Ops.SHRINK, flat, (*full, (body_length, length)))
  # first stage: (P, kept...) partial results, P outermost so that the launch is parallel over the chunks
  body = _node(Ops.PERMUTE, body, (n_kept, *range(n_kept), *reduced))
  stage1 = UOp(Ops.REDUCE_AXIS, wide, (body,), (reduce_op, reduced))
  partial_results = _node(Ops.CONTIGUOUS, _node(Ops.RESHAPE, stage1, (partials, *kept_shape)))
  # second stage: the partial results, and the tail
  total = _node(Ops.RESHAPE, _node(Ops.REDUCE_AXIS, partial_results, (reduce_op, (0,))), kept_shape)
  if tail is not None:
    if wide != tail.dtype: tail = _node(Ops.CAST, tail, dtype=wide)
    tail = _node(Ops.RESHAPE, _node(Ops.REDUCE_AXIS, tail, (reduce_op, (n_kept,))), kept_shape)
    total = UOp(reduce_op, wide, (total, tail))
  if wide != reduction.dtype: total = _node(Ops.CAST, total, dtype=reduction.dtype)
  result = _node(Ops.RESHAPE, total, reduction.shape)
  return _node(Ops.CONTIGUOUS, result) if contiguous else result


def split_reductions(sink: UOp, threads: int, realized: set[UOp], min_chunk_work: int = SPLIT_MIN_CHUNK_WORK,
                     gpu: bool = False) -> UOp:
  """Rewrite every reduction of program `sink` that `split_partials` splits into its two-stage form. `realized`: the
  nodes that fusion makes buffers of (`find_buffers` of the original program)."""
  if threads < 2: return sink
  replaced: dict[UOp, UOp] = {}
  memo: dict[UOp, int] = {}
  for node in sink.toposort:
    new = node
    if node.src and any(replaced[src] is not src for src in node.src):
      new = node.replace(src=tuple(replaced[src] for src in node.src))
    if node.op is Ops.REDUCE_AXIS and (partials := split_partials(node, threads, realized, memo, min_chunk_work, gpu)):
      new = split_reduction(new, partials, contiguous=node in realized and node not in sink.src)
    replaced[node] = new
  return replaced[sink]
