"""The LLVM renderer: one kernel AST (a `SINK` of `STORE`s over `RANGE` loops, built by lower/) -> LLVM IR text.

ABI (the contract with devices/cpu.py): the module defines

    define void @<name>(ptr noalias %args, i64 %start, i64 %end)

where `%args` points to the kernel's buffer pointers in parameter order (`DEFINE_GLOBAL.arg`), and the function runs
iterations [start, end) of the outermost global range (a kernel without a global range runs once if start < end).
The exported function loads the pointers and calls an `alwaysinline` body that takes each buffer as its own
`ptr noalias` argument, so LLVM knows buffers don't alias and vectorises without runtime checks.

How a kernel is linearised (`linearize.Linearizer`, shared with the OpenCL renderer): every node is emitted at the
innermost loop it depends on, so work that does not depend on a loop's range is computed before the loop; the global
ranges nest in ascending id order with
the STOREs inside; a REDUCE opens its own loop nest, accumulates in an `alloca` (mem2reg turns it into phis) and its
value is available after the loop. Values are memoised per loop scope: what a loop body computed is forgotten when
the loop closes.

Values live in registers in a "compute type": bool is i1, integers iN, float32 `float`, float64 `double`, and float16 /
bfloat16 are `float` values that are exactly representable in the 16-bit type. Every op on them computes in float32
and rounds once to the 16-bit type (correct rounding: float32 has more than 2p+2 bits for p = 11 and 8). In memory
bool is i8 (0/1), float16 `half` and bfloat16 i16. bfloat16 <-> float32 is done with integer bit operations (no
libcalls, which MCJIT can't resolve); float16 <-> float32 is `fptrunc`/`fpext`, which become F16C instructions.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import struct
from typing import Any, Callable, Iterator

import numpy as np

from tinyjax.codegen import gemm, transcendental
from tinyjax.codegen.gpu import GpuLaunch, global_size, gpu_launch, top_reduces
from tinyjax.codegen.linearize import IDENTITY, Linearizer, dtype_kind, min_value
from tinyjax.codegen.opt import (AMX_BLOCK, AMX_K, AMX_SUM_BLOCK, BF16, F16, F32, F64, LINE_BYTES, ROW_PACK_PAD,
                                 SHORT_REDUCE, SWEEP_COLUMNS, VECTOR_UNARY, TilePlan, accumulator_dtype, applied_opts,
                                 big_output, block_stride, choose_opts, global_ranges_of, linear_strides,
                                 tile_geometry, transpose_block)
from tinyjax.helpers import DEBUG, NOOPT
from tinyjax.lower import symbolic
from tinyjax.uop import BOOL, Ops, UOp


# A float32 ADD reduction whose innermost loop runs more than SUM_BLOCK iterations is split into blocks of SUM_BLOCK:
# each block is summed in float32 (the vectorised loop, which keeps 16-64 partial sums in its lanes) and the block sums
# are added into a float64 accumulator. Error then grows like a sum of SUM_BLOCK elements, not like one running float32
# sum over millions: 16M x 0.1 summed as one (64-lane) running sum is off by 2.5e-3, blocked by 2048 by 3e-7 (4096:
# 6e-7). A block is still long enough that its horizontal reduction and float64 add cost nothing next to the loop.
# The loop over the blocks is kept a loop (no unrolling): a row of a few blocks fully unrolled has its blocks' loads
# interleaved by the scheduler, i.e. several memory streams a block apart instead of one, which the prefetchers serve
# far worse: sum(axis=1) of 4096x4096 float32 on one thread took 2.5-2.7 ms unrolled (2 streams; 1024-element
# blocks, 4 streams: 3.4 ms) and 1.5-2.4 ms as a loop, the same data's full sum 4.3-4.5 ms (partially unrolled) and
# 2.9-3.0 ms as a loop, on a machine where numpy takes 2.65 ms.
I64 = np.dtype(np.int64)
SUM_BLOCK = 2048
# A register tile's float32 block sums (opt.CONTRACTION_SUM_BLOCK steps each) are added up in float32 where there are
# at most FLOAT32_BLOCKS of them, in float64 beyond (and always in K-blocked row groups, opt.GROUP_MIN_BLOCKS):
# widening the tile's 24 vectors into 48 float64 ones (spilled) at every block's end cost the MLP step's GEMMs
# (K = 512 and 784, 2 and 4 blocks) about 3%. The blocks' own float32 error dominates: a float64 total of two float32
# sums rounded once is their float32 sum, and 512^3 / 784^3 / 1024^3 products of normal values (2, 4 and 4 blocks)
# keep their max error against float64 (5.3e-5 / 6.5e-5 / 7.0e-5 -> 7.2e-5).
FLOAT32_BLOCKS = 4
# A dot tile's rows go outside its columns where the column is at most DOT_ROWS_OUTSIDE values (each row tile runs all
# the column tiles while its rows are in L1, instead of each column tile streaming all the rows): W @ X of 4096 x
# 4096 by 4096 x 8, X laid out transposed, read W from memory once per column tile (51-65 -> 74-79 GFLOP/s best; JAX
# 78-102); the MLP step's classifier, 512 x 512 by 512 x 10, 129-133 -> 85-109 us.
DOT_ROWS_OUTSIDE = 16
# A stream tile (opt.py STREAM_TILE: a row-less sum over a wide column, `x.sum(axis=0)`, `v @ W`) folds STREAM_ROWS
# reduce steps into each column's sum at a time (`stream_sums`), in their order: as many rows of the operand stream
# from memory at once, where one row at a time left a core's prefetchers a single stream, and the sums are loaded and
# stored once per STREAM_ROWS rows. The same additions in the same order: the same bits. Zen 3 (2 cores, alternating
# processes, min of 15 / 21): v @ W of 4096 x 4096 3.95-4.46 -> 1.99-3.05 ms (JAX 3.1), of 4096 x 11008 7.8-9.1 ->
# 5.3-7.2 (JAX 6.7); x.sum(axis=0) of 4096 x 4096 2.16-2.72 -> 1.68-1.75, of 64 x 100000 0.65-0.89 -> 0.44-0.56.
STREAM_ROWS = 4
# A GPU work-item sums without vector lanes (one running float32 sum per block, not 16-64 of them), so its blocks are
# short: a sequential float32 sum of n terms is off by up to n/2 ulp (0.1 added 2048 times: 4e-5 relative).
GPU_SUM_BLOCK = 32
# The short ranges of a reduction's loop nest unrolled whole (a 7x7 window: 49 copies of its body) make at most this
# many copies; LLVM's optimiser grows worse than linearly in a function's size (an 8x14x14 nest: 69 s).
UNROLL_WHOLE = 64


# ---------------------------------------------------------------------------------------------------------------------
# dtypes

def compute_type(dtype: np.dtype) -> str:
  """The LLVM type a value of `dtype` has in registers."""
  kind = dtype_kind(dtype)
  if kind == "b": return "i1"
  if kind in "iu": return f"i{dtype.itemsize * 8}"
  return "double" if dtype == F64 else "float"


def memory_type(dtype: np.dtype) -> str:
  """The LLVM type of one element of a buffer of `dtype`."""
  if dtype == BOOL: return "i8"
  if dtype == F16: return "half"
  if dtype == BF16: return "i16"
  return compute_type(dtype)


def _suffix(llvm_type: str) -> str:
  """The overload suffix of an intrinsic for a type: float -> f32, i64 -> i64, <16 x float> -> v16f32."""
  if llvm_type.startswith("<"):
    lanes, _, scalar = llvm_type[1:-1].split(" ")
    return f"v{lanes}{_suffix(scalar)}"
  return {"half": "f16", "float": "f32", "double": "f64"}.get(llvm_type, llvm_type)


def vector_type(dtype: np.dtype, lanes: int) -> str:
  """The LLVM type of `lanes` values of `dtype` in registers: the compute type itself for one lane."""
  return compute_type(dtype) if lanes == 1 else f"<{lanes} x {compute_type(dtype)}>"


def _float_hex(value: float) -> str:
  """An exact LLVM float literal (the double's bits in hex; for `float` the value must be exact in float32)."""
  return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"


def literal(value, dtype: np.dtype) -> str:
  """The LLVM literal of a constant of `dtype`, in its compute type (floats rounded to the dtype first)."""
  kind = dtype_kind(dtype)
  if kind == "b": return "true" if value else "false"
  if kind in "iu":
    bits = dtype.itemsize * 8
    wrapped = int(value) % (1 << bits)
    return str(wrapped - (1 << bits) if wrapped >= 1 << (bits - 1) else wrapped)
  return _float_hex(float(dtype.type(value)))


# ---------------------------------------------------------------------------------------------------------------------
# op -> instruction tables

_INT_BINARY = {Ops.ADD: "add", Ops.MUL: "mul", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}
_BOOL_BINARY = {Ops.ADD: "or", Ops.MUL: "and", Ops.MAX: "or", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}
_FLOAT_BINARY = {Ops.ADD: "fadd", Ops.MUL: "fmul", Ops.FDIV: "fdiv", Ops.MOD: "frem"}
_FLOAT_BINARY_INTRINSIC = {Ops.MAX: "llvm.maximum", Ops.POW: "llvm.pow"}  # llvm.maximum propagates NaN
_INT_MAX_INTRINSIC = {"i": "llvm.smax", "u": "llvm.umax"}
# With NOOPT=1 transcendentals are LLVM intrinsics, libm calls that keep a loop scalar; otherwise the renderer emits
# the branch-free arithmetic of transcendental.py, which vectorises (float64 on the CPU too; POW stays libm's there).
_FLOAT_UNARY_INTRINSIC = {Ops.SQRT: "llvm.sqrt", Ops.EXP2: "llvm.exp2", Ops.LOG2: "llvm.log2", Ops.SIN: "llvm.sin",
                          Ops.COS: "llvm.cos", Ops.TRUNC: "llvm.trunc"}
# float ops whose float32 result must be rounded again for float16 / bfloat16 (the others are exact)
_DECOMPOSED_FLOAT32 = {Ops.EXP2: transcendental.exp2_f32, Ops.LOG2: transcendental.log2_f32}  # float32 in, float32 out
_DECOMPOSED_FLOAT64 = {Ops.SIN: transcendental.sin_f32, Ops.COS: transcendental.cos_f32}  # float32 in, float64 out
# float64 EXP2, LOG2, SIN and COS as arithmetic (on the GPU, which has no libm, so is POW: render_binary)
_FLOAT64_ARITHMETIC = {Ops.EXP2: transcendental.exp2_f64, Ops.LOG2: transcendental.log2_f64,
                       Ops.SIN: transcendental.sin_f64, Ops.COS: transcendental.cos_f64}
_ROUNDED_FLOAT_OPS = {Ops.ADD, Ops.MUL, Ops.FDIV, Ops.MOD, Ops.POW, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN,
                      Ops.COS}
# comparisons: float LT is ordered (NaN -> false), NE unordered (NaN != NaN is true); false < true for bool
_COMPARE = {(Ops.CMPLT, "i"): "icmp slt", (Ops.CMPLT, "u"): "icmp ult", (Ops.CMPLT, "b"): "icmp ult",
            (Ops.CMPLT, "f"): "fcmp olt", (Ops.CMPNE, "i"): "icmp ne", (Ops.CMPNE, "u"): "icmp ne",
            (Ops.CMPNE, "b"): "icmp ne", (Ops.CMPNE, "f"): "fcmp une"}
# how a REDUCE folds a value into its accumulator. `reassoc` on float accumulation (and nothing else: no nnan/ninf,
# NaN must propagate) lets the loop vectoriser keep partial results in vector lanes.
_FLOAT_ACCUMULATE = {Ops.ADD: "fadd reassoc", Ops.MUL: "fmul reassoc"}


# ---------------------------------------------------------------------------------------------------------------------
# the renderer

def vector_cast_ok(src: np.dtype, dst: np.dtype) -> bool:
  """Whether `_Renderer.vector_cast` converts `src` to `dst`: exactly, or rounding once (float32 to float16 /
  bfloat16 too, on vectors: a bfloat16 matmul's output cast, which made its epilogue scalar, 384 copies of the
  rounding, 339 KB of IR; not from other types, which would round twice, nor float -> int, which saturates)."""
  src_kind, dst_kind = dtype_kind(src), dtype_kind(dst)
  if src == dst or dst_kind == "b": return True
  if dst in (F16, BF16): return src == F32
  return not (src_kind == "f" and dst_kind in "iu")


_WORD_DTYPES = {F32, np.dtype(np.int32), np.dtype(np.uint32)}
# A kernel whose loop nest runs at most SMALL_KERNEL_STEPS iterations in all (a bias gradient's sums over 10 classes,
# a loss's 512x10 reduction, a scalar) is compiled without LLVM's vectorisers (render_llvm: `noimplicitfloat`, which
# the loop and SLP vectorisers both honour): their vector loops, remainders and runtime checks took half such a
# kernel's compile time (the MLP Adam step's loss 31 -> 10 ms; its first call from an empty cache 0.308 -> 0.301 s,
# medians of 5 interleaved runs), for a few microseconds of scalar work at run time (the step within noise).
# Not one with a float operation that is slow as a scalar (a transcendental's polynomial, a division, a square root,
# NaN-propagating max): scalar, the MLP's 512x10 softmax took 8 -> 32 us, its Adam update of 512x10 5 -> 13 us.
SMALL_KERNEL_STEPS = 8192
_COSTLY_SCALAR = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.SQRT, Ops.RECIP, Ops.FDIV, Ops.MAX, Ops.POW}
# operations that make a kernel compute-bound enough for the widest vectors (render_llvm's "prefer-vector-width")
_COMPUTE_HEAVY = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.REDUCE}


def _vector_nodes_ok(root: UOp, column: UOp, deps: dict[UOp, frozenset[UOp]], leaf: UOp | None = None,
                     packed: tuple[UOp, ...] = (), gates: str = "") -> bool:
  """Whether every node under `root` that depends on `column` (down to LOADs, the column itself and `leaf`) is an
  operation with a one-instruction vector form that rounds as the scalar code does (float16 and bfloat16 arithmetic
  rounds after every operation in several instructions), and every LOAD of them reads consecutive elements along
  the column (one vector load; a packed one is read from its pack) without a gate (lanes may not be readable), or
  with `gates` "uniform" through one that does not depend on the column (a padding's along another axis: all lanes
  or none, `_Renderer.vector_value` branches around the load), with "any" through any (the parts of a loop split at
  its gates' bounds, `gate_split`, which fix the bounds along the column). An epilogue reading another array
  transposed (`a @ b + c.T`) is scalar code."""
  stack, seen = [root], set()
  while stack:
    node = stack.pop()
    if node in seen or node is leaf or column not in deps[node]: continue
    seen.add(node)
    op, dtype = node.op, node.dtype
    if op is Ops.LOAD:
      if len(node.src) > 2 and node not in packed and (not gates or gates == "uniform" and column in deps[node.src[2]]):
        return False
      strides, nonlinear = linear_strides(node.src[1])
      if node not in packed and (column in nonlinear or strides.get(column) != 1): return False
      continue
    if op is Ops.RANGE: continue
    if op is Ops.CAST: ok = vector_cast_ok(node.src[0].dtype, dtype)
    elif op is Ops.BITCAST: ok = {node.src[0].dtype, dtype} <= _WORD_DTYPES  # float32 <-> 32-bit integer bits
    elif op in VECTOR_UNARY and op is not Ops.NEG: ok = dtype == F32  # TRUNC, SQRT, RECIP, EXP2, LOG2
    elif op in (Ops.WHERE, Ops.NEG, Ops.CMPLT, Ops.CMPNE, Ops.MAX): ok = True
    elif dtype_kind(dtype) == "f": ok = op in _FLOAT_BINARY and op is not Ops.MOD and dtype in (F32, F64)
    elif dtype_kind(dtype) == "b": ok = op in _BOOL_BINARY
    elif op in (Ops.SHL, Ops.SHR): ok = _constant_shift(node)  # (threefry's rotations)
    else: ok = op in _INT_BINARY
    if not ok: return False
    stack.extend(node.src)
  return True


def _constant_shift(node: UOp) -> bool:
  """Whether SHL / SHR `node` shifts by a constant amount within its operand's bit width (one instruction)."""
  amount = node.src[1]
  return amount.op is Ops.CONST and 0 <= int(amount.arg) < node.dtype.itemsize * 8


def vector_body_ok(plan: TilePlan | None, deps: dict[UOp, frozenset[UOp]]) -> bool:
  """Whether a register tile's REDUCE value can be computed on vectors of its columns (`_Renderer.vector_value`):
  between the column and the value only LOADs (contiguous along the column, as the plan requires), the column itself
  and operations `_vector_nodes_ok` admits."""
  if plan is None or plan.stream or plan.dot: return False
  return _vector_nodes_ok(plan.reduce.src[0], plan.column, deps, packed=plan.packed)


def vector_epilogue_ok(plan: TilePlan | None, deps: dict[UOp, frozenset[UOp]], ast: UOp) -> bool:
  """Whether a vector tile's epilogue (what the kernel computes from the REDUCE, and its STORE) can run on the
  accumulator vectors (`_Renderer.vector_store`): the STORE is contiguous along the column (not so in a contraction
  stored permuted), the REDUCE's result converts to its dtype in one instruction, whether its sum was blocked into
  float64 or not, and the rest is made of what `_vector_nodes_ok` admits."""
  if not vector_body_ok(plan, deps): return False
  (store,) = [n for n in ast.src if n.op is Ops.STORE]
  strides, other = linear_strides(store.src[1])
  if plan.column in other or strides.get(plan.column) != 1: return False  # (a contraction stored permuted)
  return vector_sums_ok(plan.reduce) and _vector_nodes_ok(store.src[2], plan.column, deps, leaf=plan.reduce)


def vector_sums_ok(node: UOp) -> bool:
  """Whether a vector tile's sums of REDUCE `node` convert to its dtype a vector at a time (one instruction), whether
  they were blocked into float64 or not."""
  inner = accumulator_dtype(node)
  blocked = node.arg is Ops.ADD and inner == F32  # (perhaps) summed in float32 blocks into float64
  return vector_cast_ok(inner, node.dtype) and not (blocked and not vector_cast_ok(F64, node.dtype))


def transposed_epilogue_ok(plan: TilePlan | None, deps: dict[UOp, frozenset[UOp]], ast: UOp) -> bool:
  """Whether a row group's float32 results are stored through register transposes (`_Renderer.store_sums_transposed`):
  a contraction stored permuted, contiguous along the row where it is strided along the column (an NCHW
  convolution's product: its positions the row, its channels the column), with an epilogue that computes on vectors
  along the row (`_vector_nodes_ok`). Row by row it was one scalar store per element, each channel's to a line of
  its own."""
  if plan is None or plan.row is None or not plan.group or plan.stream or plan.lanes != tile_geometry().transpose_lanes:
    return False
  node = plan.reduce
  if node.dtype != F32 or not vector_cast_ok(F64, F32): return False
  (store,) = [n for n in ast.src if n.op is Ops.STORE]
  strides, other = linear_strides(store.src[1])
  if plan.row in other or strides.get(plan.row) != 1 or (plan.column not in other and strides.get(plan.column) == 1):
    return False
  return _vector_nodes_ok(store.src[2], plan.row, deps, leaf=node)


def vector_lanes(ast: UOp, deps: dict[UOp, frozenset[UOp]], gated: bool = False) -> tuple[int, bool]:
  """For an elementwise kernel (no REDUCE) whose STOREs of 4- or 8-byte values are contiguous along its innermost
  global range, each value computed on vectors (`_vector_nodes_ok`: contiguous, ungated loads and one-instruction
  operations): the values per vector register (per 64-byte line where they go to memory non-temporally: one STORE
  writing at least opt.NONTEMPORAL_BYTES, opt.big_output), a vector of which its innermost loop computes and stores
  at a time (`_Renderer.render_vectors`), and whether they are stored so; else (0, False). Written as vectors, not
  left to LLVM's loop vectoriser, the loop is vector code unoptimised too (the first tier, devices/cpu.py
  `CompileStream`): the transformer step's GELU over 8x128x1024 took 11.8 ms as scalar code at -O0, 1.2 ms so, and
  1.1-1.4 ms at -O3. Gated loads too where their gates don't depend on that range (a padding along another axis: a
  CNN's 14x14x32 -> 16x16x32 padding took 3.9 ms as scalar code at -O0, 0.24 ms at -O3), or with `gated`, in the
  parts of a loop split at its loads' gates (`gate_split`), which fix the bounds along it (such a kernel is never
  stored non-temporally): a vector load each, branched around where the gate is false."""
  nodes = ast.toposort
  stores = [node for node in nodes if node.op is Ops.STORE]
  if not stores or any(node.op is Ops.REDUCE for node in nodes): return 0, False
  global_ranges = global_ranges_of(ast)
  if not global_ranges or any(rng.src[0].op is not Ops.CONST for rng in global_ranges): return 0, False
  column, itemsize = global_ranges[-1], stores[0].src[0].dtype.itemsize
  streamed = not gated and len(stores) == 1 and big_output(stores[0], global_ranges)
  lanes = (LINE_BYTES if streamed else tile_geometry().vector_bytes) // itemsize
  if itemsize not in (4, 8) or column.src[0].arg < 4 * lanes: return 0, False
  for store in stores:
    strides, nonlinear = linear_strides(store.src[1])
    if store.src[0].dtype.itemsize != itemsize or column in nonlinear or strides.get(column) != 1 or \
        not _vector_nodes_ok(store.src[2], column, deps, gates="any" if gated else "uniform"):
      return 0, False
  return lanes, streamed


def library_epilogue_lanes(ast: UOp, call: gemm.LibraryCall, deps: dict[UOp, frozenset[UOp]]) -> int:
  """The columns of a GEMM library call's products (`_Renderer.render_library_gemm`) its epilogue computes and stores
  at a time: a vector register's float32 values where every STORE is of 4-byte values contiguous along the column
  and computed on vectors from the product (`_vector_nodes_ok`), else 0 (one at a time). The library call is a first
  tier (devices/cpu.py `CompileStream`), compiled unoptimised: the transformer's GEMM with a GELU after it took 23 ms
  with its epilogue one value at a time, 8 ms so, and 6.5-7 ms as its own loops at -O3."""
  lanes = tile_geometry().vector_bytes // 4
  if call.column.src[0].arg < lanes: return 0
  for store in (node for node in ast.src if node.op is Ops.STORE):
    strides, nonlinear = linear_strides(store.src[1])
    if store.src[0].dtype.itemsize != 4 or call.column in nonlinear or strides.get(call.column) != 1 or \
        not _vector_nodes_ok(store.src[2], call.column, deps, leaf=call.reduce):
      return 0
  return lanes


# A float32 sum or maximum over one range of contiguous values (a softmax's or a layer norm's over each row) is written
# as vector code (`_Renderer.vector_reduce`): SUM_REGISTERS vector registers of running results (4: the adds of
# consecutive steps don't wait on each other's latency). Sums of at most SUM_BLOCK steps only: a longer one is cut
# into float32 blocks added into float64 (`reduce_loops`).
SUM_REGISTERS = 4


def reduce_lanes(node: UOp, deps: dict[UOp, frozenset[UOp]]) -> int:
  """The lanes of the running results of REDUCE `node` written as vector code (`_Renderer.vector_reduce`): a float32
  sum (of at most SUM_BLOCK steps) or maximum over one range of a constant length of at least those lanes, whose
  value computes on vectors along it (`_vector_nodes_ok`: contiguous, ungated loads); else 0."""
  value, *ranges = node.src
  if len(ranges) != 1 or node.arg not in (Ops.ADD, Ops.MAX) or accumulator_dtype(node) != F32: return 0
  (rng,) = ranges
  lanes = SUM_REGISTERS * tile_geometry().vector_bytes // 4
  if rng.src[0].op is not Ops.CONST or rng.src[0].arg < lanes or (node.arg is Ops.ADD and rng.src[0].arg > SUM_BLOCK):
    return 0
  return lanes if _vector_nodes_ok(value, rng, deps) else 0


def epilogue_prefetch_loads(plan: TilePlan | None, ast: UOp) -> list[UOp]:
  """The loads a register tile's epilogue makes that it prefetches before its sums (`_Renderer.prefetch_epilogue`):
  the ungated ones outside the REDUCE contiguous along the column, as the weights of an SGD update fused after a
  weight gradient, `w - lr * (h.T @ g)`. A column tile walked down its rows reads each row's line a page from the
  last (1024 float32 columns: 4 KB apart), where the hardware prefetchers don't follow, and the epilogue waited on
  memory: 128x1024x1024 with the update ran at 51-84 GFLOP/s, 83-102 with the prefetches, 138 without the update
  (AMD Zen 3, 2 cores)."""
  if plan is None or plan.stream: return []
  under = set(plan.reduce.toposort)
  loads = []
  for node in ast.toposort:
    if node.op is not Ops.LOAD or node in under or len(node.src) != 2: continue
    strides, nonlinear = linear_strides(node.src[1])
    if strides.get(plan.column) == 1 and plan.column not in nonlinear: loads.append(node)
  return loads


# A register tile's epilogue of more than this many operations (a random normal's threefry rounds and erf_inv added
# to a sum: DP-SGD's noised gradient) runs in loops over the tile's rows and columns (or vectors of columns) from the
# tile's sums in an array (a row group's: over its columns), not unrolled per element (8 x 32 scalar copies of ~200
# operations were 2.4 MB of IR, 3 s of LLVM; 8 x 2 vector copies 0.7 MB, 0.3 s). So does one whose operations times
# the tile's vectors exceed LOOPED_EPILOGUE_BUDGET, a transcendental counted as the polynomial it is rendered as
# (EPILOGUE_WEIGHTS): tanh after a layer's product (a PINN's layers, 31 operations with an EXP2, in 12 vectors and
# the remainders' copies) made 185 KB of IR per GEMM; looped, 38 KB, and the PINN's cold first call 1.93-2.10 ->
# 1.80-1.89 s, its steps unchanged within noise. An epilogue that can't run on vectors is copied per element, not per
# vector: the same PINN's weight update from its 64x64 gradient, transposed (10 operations, 96 scalar copies and
# the clamped rows' conditions), made 111 KB of IR and 0.42 s of LLVM alone.
LOOPED_EPILOGUE_OPS = 64
LOOPED_EPILOGUE_BUDGET = 512
EPILOGUE_WEIGHTS = {Ops.EXP2: 24, Ops.LOG2: 32, Ops.SIN: 40, Ops.COS: 40, Ops.POW: 64}


def looped_epilogue(plan: TilePlan | None, ast: UOp, vectors: bool) -> bool:
  """Whether a register tile's epilogue (what its STORE computes from the REDUCE) has more than LOOPED_EPILOGUE_OPS
  operations, or costs more than LOOPED_EPILOGUE_BUDGET over its copies, one per vector of the tile (`vectors`: it
  runs on vectors, `vector_epilogue_ok`) or per element (`_Renderer.render_block` then runs it in loops,
  `looped_store`)."""
  if plan is None or plan.stream: return False
  (store,) = [n for n in ast.src if n.op is Ops.STORE]
  below = set(plan.reduce.toposort)
  ops = [node.op for node in store.src[2].toposort if node not in below and node.op not in (Ops.CONST, Ops.RANGE)]
  weight = sum(EPILOGUE_WEIGHTS.get(op, 1) for op in ops)
  copies = plan.rows * plan.columns // (plan.lanes if vectors else 1)
  return len(ops) > LOOPED_EPILOGUE_OPS or weight * copies > LOOPED_EPILOGUE_BUDGET


def strided_only(reduce: UOp, rng: UOp) -> bool:
  """Whether REDUCE `reduce`'s loads along its range `rng` are all strided (or non-linear in it) and some are: LLVM's
  loop vectoriser then makes gathers or shuffles of scalar loads, and spends more compiling them than the loop saves
  (a PINN's column sums of 1024 rows of 64, two reductions in one kernel: 130 ms of LLVM), so the loop is left
  scalar."""
  reads = False
  for node in reduce.src[0].toposort:
    if node.op is not Ops.LOAD or len(node.src) != 2 or rng not in node.src[1].toposort: continue
    strides, nonlinear = linear_strides(node.src[1])
    if rng not in nonlinear and strides.get(rng, 0) in (0, 1, -1): return False
    reads = True
  return reads


def register_transposes(ast: UOp, deps: dict[UOp, frozenset[UOp]], block: int) -> tuple[int, tuple[UOp, ...]]:
  """For a kernel run in transpose blocks of `block` (opt.py `transpose_block`): the lanes of its register transposes
  and the LOADs read that way, or (0, ()). Each lanes x lanes square of a whole block then loads, per column, the
  lanes rows of a LOAD read across the columns as one vector (consecutive in memory within aligned row blocks:
  `block_stride`), transposes these vectors in registers (`_Renderer.transposed_vectors`) and computes and stores
  each row as one vector along the columns (`vector_value`), instead of an element per load and store. Needs one
  STORE, those LOADs without a gate, and the rest of the value on vectors as `_vector_nodes_ok` admits. A LOAD whose
  rows are consecutive in memory only between boundaries that aligned row blocks may straddle (a transpose of
  (N, C, 58 * 58) into (N, 58 * 58, C): rows (r // 3364) * C * 3364 + r % 3364) is read so where a block's rows
  are consecutive, checked per block (`_Renderer.render_transpose_blocks`); its column stride must be fixed."""
  stores = [node for node in ast.src if node.op is Ops.STORE]
  if not block or len(stores) != 1: return 0, ()
  row, column = global_ranges_of(ast)
  (store,) = stores
  value = store.src[2]
  loads = [node for node in value.toposort if node.op is Ops.LOAD and column in deps[node]]
  across = []
  for load in loads:
    strides, other = linear_strides(load.src[1])
    if column in other or strides.get(column) != 1: across.append(load)
  lanes = min(block, tile_geometry().vector_bytes // max(node.src[0].dtype.itemsize for node in (store, *loads)))
  if not across or block % lanes or any(len(load.src) > 2 or (block_stride(load.src[1], row, lanes) != 1 and (
      column in linear_strides(load.src[1])[1])) for load in across):
    return 0, ()
  if not _vector_nodes_ok(value, column, deps, packed=tuple(across)): return 0, ()
  return lanes, tuple(across)


def unrolled_whole(ranges: list[UOp]) -> set[UOp]:
  """The short ranges of a reduction's nest (a convolution's window) that are unrolled whole (see loop_hints),
  innermost first while their product stays at most UNROLL_WHOLE: LLVM took 69 s on an 8x14x14 nest unrolled into
  1568 copies."""
  whole, copies = set(), 1
  for rng in reversed(ranges):
    if rng.src[0].op is Ops.CONST and rng.src[0].arg <= SHORT_REDUCE and copies * rng.src[0].arg <= UNROLL_WHOLE:
      whole.add(rng)
      copies *= rng.src[0].arg
  return whole


# The most parts a loop is split into by its loads' gates (`gate_split`): a padding's three, a few concatenated parts.
GATE_SPLIT_PARTS = 5


def gate_split(ast: UOp, rng: UOp) -> list[tuple[int, int, dict[UOp, bool]]] | None:
  """For a kernel's innermost loop `rng` (constant length) and the gates of its loads that depend on it: where each
  gate is an AND of conditions that don't and bounds `rng + c < k` / `k < rng + c` that do (a padding's window along
  its last axis, a concatenation's parts), the parts of the loop between the bounds' thresholds (at most
  GATE_SPLIT_PARTS), each with every bound's value there; None otherwise. The loop then runs part by part
  (`open_global_loops`), each gate a constant: a (32, 64, 56, 56) -> (32, 64, 58, 58) padding copy's loads were masked
  vector loads with 64-bit index compares, 1.41 ms; unconditional in the middle part, 0.64 ms."""
  if rng.src[0].op is not Ops.CONST: return None
  size = rng.src[0].arg
  bounds: dict[UOp, tuple[bool, int]] = {}  # bound -> (true below the threshold, the threshold)
  for load in (node for node in ast.toposort if node.op is Ops.LOAD and len(node.src) > 2):
    stack = [load.src[2]]
    while stack:
      node = stack.pop()
      if rng not in node.toposort or node in bounds: continue
      if node.op is Ops.AND:
        stack.extend(node.src)
        continue
      if node.op is not Ops.CMPLT or node.dtype != BOOL: return None
      side = 0 if rng in node.src[0].toposort else 1
      (terms, offset), constant = symbolic.linear_form(node.src[side]), node.src[1 - side]
      if terms != {rng: 1} or constant.op is not Ops.CONST: return None
      # rng + offset < k: true below k - offset; k < rng + offset: true from k - offset + 1 on
      bounds[node] = (True, constant.arg - offset) if side == 0 else (False, constant.arg - offset + 1)
  cuts = sorted({min(max(threshold, 0), size) for _, threshold in bounds.values()} | {0, size})
  if not bounds or len(cuts) - 1 > GATE_SPLIT_PARTS: return None
  return [(first, last, {bound: (first < threshold) == below for bound, (below, threshold) in bounds.items()})
          for first, last in zip(cuts, cuts[1:]) if first < last]


def _symbol(name: str) -> str:
  return f"@{name}" if re.fullmatch(r"[A-Za-z_.$][\w.$]*", name) else f'@"{name}"'


@dataclasses.dataclass(frozen=True)
class PrefetchStream:
  """The lines one load reads over `fast_count` values of range `fast` from value `fast_first` and `slow_count` of
  `slow` from `slow_first` (`_Renderer.prefetch_stream`): `slow_count` runs of `fast_lines` lines, `per_line` values
  of `fast` per line."""
  load: UOp
  fast: UOp
  fast_first: str
  slow: UOp
  slow_first: str
  per_line: int
  fast_lines: int
  slow_count: int


@dataclasses.dataclass(frozen=True)
class Prefetches:
  """The lines a tile's steps prefetch (`_Renderer.panel_prefetch`, `column_prefetch`): those of `streams` taken in
  turn, one per step, counted in the i64 at `cursor`."""
  cursor: str
  streams: list[PrefetchStream]


class _Renderer(Linearizer):
  """Emits the body function of one kernel: a list of IR lines, plus allocas for the entry block and declarations."""

  def __init__(self, ast: UOp, plan: TilePlan | None = None, decompose: bool = True, gpu: bool = False,
               ordered: int = 0, launch: GpuLaunch | None = None, transpose: int = 0, stream: bool = False,
               library: gemm.LibraryCall | gemm.LibraryCopy | None = None):
    super().__init__(ast)
    self.plan, self.gpu, self.ordered = plan, gpu, ordered
    # A small kernel's short sums (at most SMALL_KERNEL_STEPS iterations in all, at most SHORT_REDUCE steps each: a
    # softmax's over 10 classes) run in order: vectorising them would save microseconds, and without `reassoc` the
    # kernel's IR may compute the same bits unoptimised, as its first tier (devices/cpu.py `same_bits_unoptimised`;
    # the MLP step's softmax sum: 22 ms of LLVM at -O3). Not a longer sum, which is more accurate in vector lanes (a
    # loss summed over 1152 values in order moved a float32 finite-difference gradient check by 10%). A register tile
    # keeps its own order anyway.
    self.in_order_sums = plan is None and not gpu and loop_steps(ast) <= SMALL_KERNEL_STEPS
    # A register tile's product and its accumulation as one `llvm.fma` where the host has FMA (`fused_product`), not
    # a `contract`ed multiply and add that codegen fuses at -O3 only: the kernel's IR then computes the same bits
    # unoptimised (devices/cpu.py `same_bits_unoptimised`). Not a dot tile's (LLVM vectorises its sums) nor a stream
    # tile's (its sums in memory are added apart).
    self.fused_products = not gpu and plan is not None and plan.contract and not plan.dot and not plan.stream and \
        tile_geometry().fma
    self.products: dict[str, tuple[str, str]] = {}  # a deferred product's name -> its factors (`fused_product`)
    # the product computed by the GEMM library (`render_library_gemm`), or the copy (`render_library_copy`), or None
    self.library = library
    # (`stream`: an elementwise kernel's innermost loop may run on vectors, perhaps stored non-temporally,
    # `vector_lanes`; so may the parts of a loop split at its loads' gates, `gate_split`)
    self.elementwise_vectors = stream and plan is None and not transpose and not gpu
    self.vector_lanes, self.streamed = vector_lanes(ast, self.deps) if self.elementwise_vectors else (0, False)
    self.gate_values: dict[UOp, str] = {}  # the gates' bounds in the part of such a loop that is open
    self.transpose = transpose  # the block of an elementwise kernel's (rows, columns) loops (opt.transpose_block)
    self.transpose_lanes, self.across = register_transposes(ast, self.deps, transpose)
    # (a register transpose of a big output stores its rows non-temporally: opt.big_output)
    self.transposes_streamed = bool(self.across) and big_output(
        next(node for node in ast.src if node.op is Ops.STORE), global_ranges_of(ast))
    self.gate_parts: tuple[int, int] | None = None  # (range id, parts) of a loop split at its gates (`gate_split`)
    self.launch = launch or GpuLaunch(1)
    self.shared = set(top_reduces(ast)) if self.launch.group_reduction else set()  # REDUCEs done as group reductions
    self.decompose = decompose  # float32 transcendentals as polynomials (transcendental.py), not libm intrinsics
    self.lines: list[str] = []
    self.allocas: list[str] = []
    self.declarations: set[str] = set()
    self.metadata: list[str] = []  # module-level metadata nodes (loop hints)
    self.block = "entry"  # the basic block being emitted (phis name their predecessors)
    # (first row, height, clamp) of the row tile open around the column loops (`row_tiles`)
    self.row_tile: tuple[str, int, str | None] | None = None
    self.packs: dict[UOp, str] = {}  # the plan's packed loads -> their arrays, while a packed column tile is open
    # the row-packed loads -> (array, stride, first row), while a panel's copy is open (`copy_rows`)
    self.row_packs: dict[UOp, tuple[str, int, str]] = {}
    self.pack_origin = "0"  # the reduce step at the packed arrays' start (a panel's first, `pack`)
    self.vector_body = vector_body_ok(plan, self.deps)  # a register tile's body emitted on vectors (tile_body)
    self.vector_epilogue = vector_epilogue_ok(plan, self.deps, ast)  # and its epilogue (vector_store)
    self.looped_epilogue = looped_epilogue(plan, ast, self.vector_epilogue)  # a long one: in loops (looped_store)
    self.transposed_epilogue = transposed_epilogue_ok(plan, self.deps, ast)  # (store_sums_transposed)
    self.transpose_square = tile_geometry().transpose_lanes  # the side of a pack's or an epilogue's register transposes
    self.epilogue_loads = epilogue_prefetch_loads(plan, ast)  # prefetched before a tile's sums (prefetch_epilogue)
    self.stored_transposed = False  # a row group's results went out through register transposes (as emitted)
    self.prefetched: set[int] = set()  # the buffers whose lines the tile steps prefetch (`Prefetches`, as emitted)
    self.transposed_streamed = self.transposed_epilogue and big_output(
        next(node for node in ast.src if node.op is Ops.STORE), global_ranges_of(ast))
    self.nontemporal = ""  # the !nontemporal metadata node, once a STORE is non-temporal (`vector_store`)

  # ---- low level: names, instructions, blocks

  def fresh(self, hint: str = "v") -> str:
    self.counter += 1
    return f"%{hint}{self.counter}"

  def emit(self, instruction: str, hint: str = "v") -> str:
    """Append `<new name> = instruction` and return the new name."""
    name = self.fresh(hint)
    self.lines.append(f"  {name} = {instruction}")
    return name

  def line(self, text: str) -> None: self.lines.append(f"  {text}")

  def label(self, block: str) -> None:
    self.lines.append(f"{block}:")
    self.block = block

  def call(self, intrinsic: str, ret_type: str, args: list[tuple[str, str]], flags: str = "") -> str:
    """Call an intrinsic by its full name (declared on first use); `args` are (type, value) pairs."""
    self.declarations.add(f"declare {ret_type} @{intrinsic}({', '.join(t for t, _ in args)})")
    flags = f"{flags} " if flags else ""
    return self.emit(f"call {flags}{ret_type} @{intrinsic}({', '.join(f'{t} {v}' for t, v in args)})")

  def alloca(self, llvm_type: str, align: int | None = None) -> str:
    name = self.fresh("acc")
    self.allocas.append(f"  {name} = alloca {llvm_type}{f', align {align}' if align else ''}")
    return name

  @contextlib.contextmanager
  def loop(self, start: str, end: str, binds: UOp | None, step: int = 1, vectorize: bool = True,
           whole: bool = True, unroll: bool | str = True) -> Iterator[str]:
    """A canonical counted loop `for (i = start; i < end; i++)` (i64, `icmp slt`, one latch). Code emitted inside the
    `with` is the body; `binds` is the RANGE whose value is the induction variable. Yields the variable's name.
    With `step` > 1 it is `for (i = start; i + step <= end; i += step)`: whole steps only (`whole=False`: the last
    step may be partial, `i < end`). After the loop the
    variable's name holds where it stopped (the header dominates the exit), where a remainder loop starts.
    `vectorize=False` tells the loop vectoriser to leave this loop alone (its body is vectorised already);
    `unroll=False` tells the unroller to keep the loop a loop, `unroll="full"` asks for it to be unrolled whole."""
    self.counter += 1
    loop_id = self.counter
    header, body, latch, done = (f"loop{loop_id}", f"loop{loop_id}.body", f"loop{loop_id}.latch",
                                 f"loop{loop_id}.end")
    index, next_index = f"%i{loop_id}", f"%i{loop_id}.next"
    preheader = self.block
    self.line(f"br label %{header}")
    self.label(header)
    self.line(f"{index} = phi i64 [ {start}, %{preheader} ], [ {next_index}, %{latch} ]")
    last = index if step == 1 or not whole else self.emit(f"add nsw i64 {index}, {step - 1}", "last")
    in_range = self.emit(f"icmp slt i64 {last}, {end}", "cond")
    self.line(f"br i1 {in_range}, label %{body}, label %{done}")
    self.label(body)
    self.scopes.append({} if binds is None else {binds: index})
    if binds is not None: self.open_ranges.add(binds)
    yield index
    if binds is not None: self.open_ranges.discard(binds)
    self.scopes.pop()
    self.line(f"br label %{latch}")
    self.label(latch)
    self.line(f"{next_index} = add nsw i64 {index}, {step}")
    self.line(f"br label %{header}{self.loop_hints(vectorize, bool(unroll), unroll == 'full')}")
    self.label(done)

  def loop_hints(self, vectorize: bool, unroll: bool, full: bool = False) -> str:
    """Loop metadata (for a latch's branch) that turns the loop vectoriser and / or the unroller off for that loop,
    or (`full`) asks for it to be unrolled whole: LLVM unrolls no other loop (devices/cpu.py PIPELINE), and the CNN
    step of examples/cnn.py ran 4-5% slower with its 3x3 windows' loops rolled. '' when none applies."""
    hints = ([] if vectorize else ['!{!"llvm.loop.vectorize.enable", i1 false}']) + \
            ([] if unroll else ['!{!"llvm.loop.unroll.disable"}']) + (['!{!"llvm.loop.unroll.full"}'] if full else [])
    if not hints: return ""
    loop_node = f"!{len(self.metadata)}"
    hint_nodes = [f"!{len(self.metadata) + 1 + i}" for i in range(len(hints))]
    self.metadata.append(f"{loop_node} = distinct !{{{', '.join([loop_node, *hint_nodes])}}}")
    self.metadata += [f"{node} = {hint}" for node, hint in zip(hint_nodes, hints)]
    return f", !llvm.loop {loop_node}"

  def render_kernel(self) -> None:
    """Emit the whole kernel: the global loop nest (or a run-once guard) with everything inside it."""
    sink = self.ast
    global_ranges = global_ranges_of(sink)
    if self.gpu and self.launch.tile is not None:
      (self.render_mma_gemm if self.launch.tile.mma else self.render_gemm)(global_ranges)
    elif self.gpu: self.bind_thread_index(global_ranges)
    elif isinstance(self.library, gemm.LibraryCopy): self.render_library_copy(self.library)
    elif self.library is not None: self.render_library_gemm(self.library)
    elif not global_ranges:
      run = self.emit("icmp slt i64 %start, %end", "run")
      self.line(f"br i1 {run}, label %once, label %done")
      self.label("once")
      self.emit_ready(sink)
      self.line("br label %done")
      self.label("done")
    else:
      self.open_global_loops(global_ranges, 0)
    # (non-temporal stores are weakly ordered: visible to the thread that runs the next kernel once fenced)
    if self.nontemporal: self.line("fence seq_cst")
    self.line("ret void")
    self.check_stores()

  def render_library_copy(self, copy: gemm.LibraryCopy) -> None:
    """A transposing copy done by the library's `tj_copy32` (codegen/gemm.py): one call for the launch chunk's rows."""
    self.declarations.add(f"declare {gemm.COPY_SIGNATURE}")
    self.stores_emitted.update(node for node in self.ast.src if node.op is Ops.STORE)
    rows, width = self.emit("sub nsw i64 %end, %start"), copy.column.src[0].arg

    def at(operand: gemm.Operand) -> str:  # (its first row's address)
      first = self.emit(f"mul nsw i64 %start, {operand.strides.get(copy.row, 0)}")
      offset = self.emit(f"add nsw i64 {operand.offset}, {first}")
      return self.emit(f"getelementptr i32, ptr {self.value(operand.buffer)}, i64 {offset}", "addr")
    self.emit_ready(self.ast)
    src, dst = at(copy.src), at(copy.dst)
    sr, sc, dr = (copy.src.strides.get(copy.row, 0), copy.src.strides.get(copy.column, 0),
                  copy.dst.strides.get(copy.row, 0))
    self.line(f"call void @{gemm.COPY_SYMBOL}(i64 {rows}, i64 {width}, ptr {src}, i64 {sr}, i64 {sc}, ptr {dst}, "
              f"i64 {dr})")

  def render_library_gemm(self, call: gemm.LibraryCall) -> None:
    """A kernel whose product the GEMM library computes (codegen/gemm.py): per value of the ranges outside its row (a
    batch, a column tile; else per block of a launch chunk's rows, `call.rows` at a time) one call of `tj_sgemm`, into
    the output where the kernel stores the product as it is, else into an array of the products, then the epilogue
    and the STORE per element, the REDUCE's value read from that array."""
    self.declarations.add(f"declare {gemm.SIGNATURE}")
    reduce, row, column, (steps,) = call.reduce, call.row, call.column, call.reduce.src[1:]
    width = column.src[0].arg
    self.emit_ready(self.ast)
    a, b, out = call.a, call.b, call.out
    products = None if out else self.alloca(f"[{call.rows * width} x float]", align=LINE_BYTES)
    stores = [node for node in self.ast.src if node.op is Ops.STORE]
    if out: self.stores_emitted.update(stores)
    lanes = 0 if out else library_epilogue_lanes(self.ast, call, self.deps)

    def operand(load: gemm.Operand, bound: dict[UOp, str]) -> str:
      """The address of the load's element at the ranges `bound` (the others at 0)."""
      offset = str(load.offset)
      for rng, value in bound.items():
        if (stride := load.strides.get(rng)): offset = self.emit(f"add nsw i64 {offset}, "
                                                                 f"{self.emit(f'mul nsw i64 {value}, {stride}')}")
      return self.emit(f"getelementptr float, ptr {self.value(load.buffer)}, i64 {offset}", "addr")

    def product(first: str, rows: str, outer: dict[UOp, str]) -> None:
      """The library's products of rows [first, first + rows) (at the values `outer` of the ranges outside the row),
      into the output or the products' array, then the epilogue per element."""
      c = f"ptr {operand(out, {row: first, **outer})}, i64 {out.strides.get(row, 0)}" if out else \
          f"ptr {products}, i64 {width}"
      self.line(f"call void @{gemm.SYMBOL}(i64 {rows}, i64 {width}, i64 {steps.src[0].arg}, "
                f"ptr {operand(a, {row: first, **outer})}, i64 {a.strides.get(row, 0)}, i64 {a.strides.get(steps, 0)}, "
                f"ptr {operand(b, outer)}, i64 {b.strides.get(steps, 0)}, i64 {b.strides.get(column, 0)}, {c})")
      if out: return
      with self.loop(first, self.emit(f"add nsw i64 {first}, {rows}"), binds=row) as index:
        self.emit_ready(self.ast)
        at = self.emit(f"mul nsw i64 {self.emit(f'sub nsw i64 {index}, {first}')}, {width}")
        def product_vector(offset: str) -> dict[UOp, str]:  # (the REDUCE's values at `offset` on)
          address = self.emit(f"getelementptr inbounds float, ptr {products}, i64 "
                              f"{self.emit(f'add nsw i64 {at}, {offset}')}", "addr")
          return {reduce: self.emit(f"load <{lanes} x float>, ptr {address}, align 4")}
        offset = "0"
        if lanes:  # (a vector's columns at a time, `library_epilogue_lanes`)
          offset = self.render_vector_steps(column, "0", str(width), lanes, False, product_vector)
          self.stores_emitted.update(stores)
        if lanes and width % lanes == 0: return  # (the columns are whole vectors: none left)
        with self.loop(offset, str(width), binds=column) as offset:
          address = self.emit(f"getelementptr inbounds float, ptr {products}, i64 "
                              f"{self.emit(f'add nsw i64 {at}, {offset}')}", "addr")
          self.scopes[-1][reduce] = self.emit(f"load float, ptr {address}")
          self.emit_ready(self.ast)

    def outside(depth: int, bound: dict[UOp, str]) -> None:
      """The loops of the ranges outside the row (the first over the launch chunk), a call per value of them."""
      if depth == len(call.outer):
        product("0", str(row.src[0].arg), bound)
        return
      rng = call.outer[depth]
      with self.loop(*(("%start", "%end") if depth == 0 else ("0", str(rng.src[0].arg))), binds=rng) as index:
        self.emit_ready(self.ast)
        outside(depth + 1, {**bound, rng: index})
    if call.outer:
      outside(0, {})
      return
    with self.loop("%start", "%end", None, step=call.rows, whole=False) as first:
      rows = self.call("llvm.smin.i64", "i64", [("i64", str(call.rows)),
                                                ("i64", self.emit(f"sub nsw i64 %end, {first}"))])
      product(first, rows, {})

  def bind_thread_index(self, global_ranges: list[UOp]) -> None:
    """GPU: the global ranges take their values from the work-item's flat index `%gid` (the entry guarantees
    `%gid < launch.outputs`), the last range varying fastest so that neighbouring work-items touch neighbouring
    elements (coalesced); what lies under them is emitted once, reductions as loops inside the work-item. The first
    `self.ordered` global ranges (a scatter's batch axes) are loops inside every work-item instead, run in order."""
    ordered, spread = global_ranges[:self.ordered], global_ranges[self.ordered:]
    self.bind_work_item(spread, "%gid")

    def loops(depth: int) -> None:
      self.emit_ready(self.ast)
      if depth < len(ordered):
        with self.loop("0", str(global_size(ordered[depth])), binds=ordered[depth]): loops(depth + 1)
    loops(0)

  def open_global_loops(self, global_ranges: list[UOp], depth: int) -> None:
    self.emit_ready(self.ast)
    if depth == len(global_ranges): return
    if self.transpose:
      self.render_transpose_blocks(*global_ranges)
      return
    if self.plan is not None and self.plan.amx:
      self.render_amx(*global_ranges)
      return
    rng = global_ranges[depth]
    if self.plan is not None and rng is self.plan.row and rng is not global_ranges[-2]:
      self.render_row_tiles(global_ranges, depth)
      return
    if self.plan is not None and rng in (self.plan.row, self.plan.column):
      self.render_tiles(global_ranges, depth)
      return
    if self.plan is not None and rng in self.plan.spans:  # opened by the row groups, inside each reduce block
      self.open_global_loops(global_ranges, depth + 1)
      return
    start, end = ("%start", "%end") if depth == 0 else ("0", self.value(rng.src[0]))
    if self.vector_lanes and depth == len(global_ranges) - 1:
      self.render_vectors(global_ranges, depth, start, end)
      return
    if self.plan is None and depth == len(global_ranges) - 1 and depth and (parts := gate_split(self.ast, rng)):
      # the innermost loop of a copy through a padding, in parts between its gates' bounds, each bound a constant in
      # each part (a load inside the padding's window, unconditional, vectorises without masks); a vector at a time
      # where its values compute on vectors (`vector_lanes`, each gated load branched around on its gate, the same for
      # every lane in the part: vector code unoptimised too, the first tier)
      self.gate_parts = (rng.arg[0], len(parts))
      lanes = vector_lanes(self.ast, self.deps, gated=True)[0] if self.elementwise_vectors else 0
      for first, last, values in parts:
        self.gate_values = {bound: "true" if value else "false" for bound, value in values.items()}
        with self.bindings(self.gate_values):
          whole = (last - first) // lanes * lanes if lanes else 0
          if whole: self.render_vector_steps(rng, str(first), str(first + whole), lanes, False)
          if first + whole < last:
            with self.loop(str(first + whole), str(last), binds=rng): self.open_global_loops(global_ranges, depth + 1)
        self.gate_values = {}
      self.stores_emitted.update(node for node in self.ast.src if node.op is Ops.STORE)
      return
    with self.loop(start, end, binds=rng):
      self.open_global_loops(global_ranges, depth + 1)

  def render_vectors(self, global_ranges: list[UOp], depth: int, start: str, end: str) -> None:
    """The innermost loop [start, end) of an elementwise kernel whose values compute on vectors (`vector_lanes`): a
    vector at a time (`vector_value`, the STOREs' values sharing what they have in common), then one value at a time
    for what is left. Stored non-temporally (`store_vector`: a line goes to memory unread), it first runs one value at
    a time up to the first element whose address is a 64-byte line's."""
    rng, lanes = global_ranges[depth], self.vector_lanes
    stores = [node for node in self.ast.src if node.op is Ops.STORE]
    aligned = start
    if self.streamed:
      aligned = self.first_line(rng, start, end)
      with self.loop(start, aligned, binds=rng): self.open_global_loops(global_ranges, depth + 1)
    position = self.render_vector_steps(rng, aligned, end, lanes, self.streamed)
    if depth == 0 or self.streamed or rng.src[0].arg % lanes:  # (no values left where the range is whole vectors)
      with self.loop(position, end, binds=rng): self.open_global_loops(global_ranges, depth + 1)
    self.stores_emitted.update(stores)

  def render_vector_steps(self, rng: UOp, start: str, end: str, lanes: int, nontemporal: bool,
                          known: Callable[[str], dict[UOp, str]] = lambda position: {}) -> str:
    """The whole vectors of `lanes` values of the innermost range `rng` in [start, end): each STORE's value on vectors
    (`vector_value`, what they have in common computed once, starting from `known(position)`: a library call's
    products) and stored (`store_vector`); returns the loop variable, where the whole vectors stopped."""
    with self.loop(start, end, None, step=lanes, vectorize=False) as position, self.bound(rng, position):
      memo = known(position)
      for store in (node for node in self.ast.src if node.op is Ops.STORE):
        buffer, index, value = store.src
        stored = self.to_memory(self.vector_value(value, lanes, {}, memo, rng), buffer.dtype, lanes)
        self.emit_ready(index)
        self.store_vector(stored, lanes, buffer.dtype, self.address(buffer, index), nontemporal)
    return position

  def first_line(self, rng: UOp, start: str, end: str, others: dict[UOp, str] | None = None) -> str:
    """The first value of `rng` in [start, end] (`end` if none) where the STORE's element, `rng` its contiguous range
    and the ranges of `others` at those values, is the first of a 64-byte line."""
    (store,) = [node for node in self.ast.src if node.op is Ops.STORE]
    buffer, index, _ = store.src
    with self.rebound(index, {rng: start, **(others or {})}):
      first = self.emit(f"ptrtoint ptr {self.address(buffer, index)} to i64")
    to_line = self.emit(f"and i64 {self.emit(f'sub i64 0, {first}')}, {LINE_BYTES - 1}")  # (bytes to the next line)
    values = self.emit(f"lshr i64 {to_line}, {buffer.dtype.itemsize.bit_length() - 1}")  # (values before it)
    return self.call("llvm.smin.i64", "i64", [("i64", self.emit(f"add nsw i64 {start}, {values}")), ("i64", end)])

  def render_amx(self, *ranges: UOp) -> None:
    """A bfloat16 matrix product on AMX tiles (opt.py `_amx_plan`): over rows [start, end) of the launch, or for a
    batch of them (a batch range first: each of its values in [start, end) over all rows)."""
    if len(ranges) == 2:
      self.render_amx_rows(*ranges, "%start", "%end")
      return
    batch, row, column = ranges
    with self.loop("%start", "%end", batch):
      self.emit_ready(self.ast)
      self.render_amx_rows(row, column, "0", str(row.src[0].arg))

  def render_amx_rows(self, row: UOp, column: UOp, start: str, end: str) -> None:
    """Rows [start, end) of a bfloat16 matrix product on AMX tiles. Per block of AMX_BLOCK columns, b's values for the
    block are packed as AMX wants them (pairs of reduce steps per column, zeros past the last column and the last
    step); per block of AMX_BLOCK rows, 2 x 2 tiles of 16 x 16 float32 sums run the reduce steps in tile products of
    AMX_K, a's tiles loaded in place (a chunk's last, partial row block from a zero-padded copy of it). The tiles'
    sums are added into float64 every AMX_SUM_BLOCK steps; the steps past the last whole AMX_K are one more tile
    product from a zero-padded copy of a's last columns; then the epilogue and STORE run per element."""
    plan = self.plan
    assert plan is not None
    node = plan.reduce
    (k,), (a, b) = node.src[1:], plan.amx
    size, columns = k.src[0].arg, column.src[0].arg
    steps, block, half = size // AMX_K * AMX_K, AMX_BLOCK, AMX_BLOCK // 2
    rest = size - steps  # reduce steps past the last whole tile product
    padded = steps + (AMX_K if rest else 0)
    lda = linear_strides(a.src[1])[0].get(row, 0)
    b_strides = linear_strides(b.src[1])[0]
    ldb, column_stride = b_strides[k], b_strides[column]
    packed = self.alloca(f"[{padded * block} x i16]", align=LINE_BYTES)
    tail = self.alloca(f"[{block * steps} x i16]", align=LINE_BYTES)
    last_columns = self.alloca(f"[{block * AMX_K} x i16]", align=LINE_BYTES)
    tiles = self.alloca(f"[{block * block} x float]", align=LINE_BYTES)
    rest_tiles = self.alloca(f"[{block * block} x float]", align=LINE_BYTES)
    sums = self.alloca(f"[{block * block} x double]", align=LINE_BYTES)
    self.declarations.add("declare x86_amx @llvm.x86.tdpbf16ps.internal(i16, i16, i16, x86_amx, x86_amx, x86_amx)")
    self.declarations.add("declare void @llvm.x86.tilestored64.internal(i16, i16, ptr, i64, x86_amx)")

    def element(load: UOp, bindings: list[tuple[UOp, str]]) -> str:
      """The address of `load`'s element with the given ranges bound."""
      with contextlib.ExitStack() as stack:
        for rng, value in bindings: stack.enter_context(self.bound(rng, value))
        self.emit_ready(load.src[1])
        return self.address(load.src[0], load.src[1])

    def i16_slot(array: str, index: str) -> str:
      return self.emit(f"getelementptr inbounds i16, ptr {array}, i64 {index}")

    def tile(op: str, *args: tuple[str, str]) -> str:
      return self.call(f"llvm.x86.{op}.internal", "x86_amx", [("i16", "16"), ("i16", "64"), *args])

    def products(first: str, last: str, a_start: str, a_stride: str, origin: str, into: str) -> None:
      """Tile products over reduce steps [first, last), AMX_K at a time: a's rows from `a_start` (step `origin`),
      `a_stride` bytes apart, b from the pack; the 2 x 2 tiles' sums stored as 32 x 32 float32 into `into`."""
      lower_half = self.emit(f"mul nsw i64 {a_stride}, {half}")
      a_lower = self.emit(f"getelementptr inbounds i8, ptr {a_start}, i64 {lower_half}")
      zero = self.call("llvm.x86.tilezero.internal", "x86_amx", [("i16", "16"), ("i16", "64")])
      entry = self.block
      self.counter += 1
      header, body, done = f"amx{self.counter}", f"amx{self.counter}.body", f"amx{self.counter}.end"
      position, after = f"%amxk{self.counter}", f"%amxk{self.counter}.next"
      sums_in = [f"%amxc{self.counter}.{i}" for i in range(4)]
      sums_out = [f"%amxc{self.counter}.{i}.next" for i in range(4)]
      self.line(f"br label %{header}")
      self.label(header)
      self.line(f"{position} = phi i64 [ {first}, %{entry} ], [ {after}, %{body} ]")
      for current, updated in zip(sums_in, sums_out):
        self.line(f"{current} = phi x86_amx [ {zero}, %{entry} ], [ {updated}, %{body} ]")
      self.line(f"br i1 {self.emit(f'icmp slt i64 {position}, {last}')}, label %{body}, label %{done}")
      self.label(body)
      offset = self.emit(f"mul nsw i64 {self.emit(f'sub nsw i64 {position}, {origin}')}, 2")
      a_tiles = [tile("tileloadd64", ("ptr", self.emit(f"getelementptr inbounds i8, ptr {base}, i64 {offset}")),
                      ("i64", a_stride)) for base in (a_start, a_lower)]
      pairs = self.emit(f"mul nsw i64 {position}, {2 * block}")  # (position / 2) pairs of 2 * block i16 values
      b_tiles = [tile("tileloadd64", ("ptr", self.emit(f"getelementptr inbounds i8, ptr {packed}, i64 "
                                                      f"{self.emit(f'add nsw i64 {pairs}, {64 * part}')}")),
                      ("i64", str(4 * block))) for part in (0, 1)]
      for i, (current, updated) in enumerate(zip(sums_in, sums_out)):
        self.line(f"{updated} = call x86_amx @llvm.x86.tdpbf16ps.internal(i16 16, i16 64, i16 64, x86_amx "
                  f"{current}, x86_amx {a_tiles[i // 2]}, x86_amx {b_tiles[i % 2]})")
      self.line(f"{after} = add nsw i64 {position}, {AMX_K}")
      self.line(f"br label %{header}")
      self.label(done)
      for i, current in enumerate(sums_in):
        corner = self.emit(f"getelementptr inbounds float, ptr {into}, i64 {(i // 2) * half * block + (i % 2) * half}")
        self.line(f"call void @llvm.x86.tilestored64.internal(i16 16, i16 64, ptr {corner}, i64 {4 * block}, "
                  f"x86_amx {current})")

    def copy_rows(first_row: str, rows: str, first_step: int, count: int, into: str, width: int) -> None:
      """a's rows [first_row, first_row + rows) x steps [first_step, first_step + count) into a zeroed array of
      AMX_BLOCK rows of `width` values."""
      with self.loop("0", str(block * width), None) as i: self.line(f"store i16 0, ptr {i16_slot(into, i)}")
      with self.loop("0", rows, None) as r, self.loop("0", str(count), None) as c:
        address = element(a, [(row, self.emit(f"add nsw i64 {first_row}, {r}")),
                              (k, self.emit(f"add nsw i64 {c}, {first_step}"))])
        slot = self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {r}, {width}')}, {c}")
        self.line(f"store i16 {self.emit(f'load i16, ptr {address}')}, ptr {i16_slot(into, slot)}")

    whole = self.emit(f"and i64 {self.emit(f'sub nsw i64 {end}, {start}')}, {-block}")
    full_end = self.emit(f"add nsw i64 {start}, {whole}")
    with self.when(self.emit(f"icmp slt i64 {full_end}, {end}")):  # the partial last row block, zero-padded
      copy_rows(full_end, self.emit(f"sub nsw i64 {end}, {full_end}"), 0, steps, tail, steps)
    with self.loop("0", str(columns), None, step=block, whole=False) as column_block:
      # b's rows 2p and 2p+1 interleaved: packed[p][j][0 / 1]; the columns past the last are zeros
      width = self.emit(f"sub nsw i64 {self.capped(column_block, block, str(columns))}, {column_block}")
      b_base = element(b, [(k, "0"), (column, column_block)])
      with self.loop("0", str(block * padded), None) as i: self.line(f"store i16 0, ptr {i16_slot(packed, i)}")
      def pack(pairs: int, odd_steps: int, first_pair: int) -> None:
        """Pairs [first_pair, first_pair + pairs) of b's steps into the pack (of each pair, the first `odd_steps`)."""
        with self.loop("0", str(pairs), None) as pair, self.loop("0", width, None) as j:
          along = j if column_stride == 1 else self.emit(f"mul nsw i64 {j}, {column_stride}")
          pair = self.emit(f"add nsw i64 {pair}, {first_pair}")
          for odd in range(odd_steps):
            step = self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {pair}, 2')}, {odd}")
            offset = self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {step}, {ldb}')}, {along}")
            value = self.emit(f"load i16, ptr {i16_slot(b_base, offset)}")
            within = self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {j}, 2')}, {odd}")
            slot = self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {pair}, {2 * block}')}, {within}")
            self.line(f"store i16 {value}, ptr {i16_slot(packed, slot)}")
      pack(size // 2, 2, 0)
      if size % 2: pack(1, 1, size // 2)  # the last step alone
      with self.loop(start, end, None, step=block, whole=False) as row_block:
        rows_here = self.capped(row_block, block, end)
        blocked = steps > AMX_SUM_BLOCK  # else the tiles' float32 sums are the totals
        in_tail = self.emit(f"icmp sge i64 {row_block}, {full_end}")
        a_start = self.emit(f"select i1 {in_tail}, ptr {tail}, ptr {element(a, [(row, row_block), (k, '0')])}")
        a_stride = self.emit(f"select i1 {in_tail}, i64 {2 * steps}, i64 {2 * lda}")
        if blocked:
          with self.loop("0", str(block * block), None) as i:
            self.line(f"store double 0.0, ptr {self.slot(sums, F64, i)}")
        with self.loop("0", str(-(-steps // AMX_SUM_BLOCK)), None, vectorize=False) as sum_block:
          first, last = self.block_bounds(sum_block, AMX_SUM_BLOCK, str(steps))
          products(first, last, a_start, a_stride, "0", tiles)
          if blocked:
            with self.loop("0", str(block * block), None) as i:
              total = self.emit(f"fadd double {self.emit(f'load double, ptr {self.slot(sums, F64, i)}')}, "
                                f"{self.cast(self.emit(f'load float, ptr {self.slot(tiles, F32, i)}'), F32, F64)}")
              self.line(f"store double {total}, ptr {self.slot(sums, F64, i)}")
        if rest:
          copy_rows(row_block, self.emit(f"sub nsw i64 {rows_here}, {row_block}"), steps, rest, last_columns, AMX_K)
          products(str(steps), str(padded), last_columns, str(2 * AMX_K), str(steps), rest_tiles)
        columns_here = self.capped(column_block, block, str(columns))
        with self.loop(row_block, rows_here, row) as row_index:
          with self.loop(column_block, columns_here, column) as column_index:
            row_in_block = self.emit(f"sub nsw i64 {row_index}, {row_block}")
            slot = self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {row_in_block}, {block}')}, "
                             f"{self.emit(f'sub nsw i64 {column_index}, {column_block}')}")
            total = self.emit(f"load double, ptr {self.slot(sums, F64, slot)}") if blocked else \
                self.cast(self.emit(f"load float, ptr {self.slot(tiles, F32, slot)}"), F32, F64)
            if rest:
              part = self.cast(self.emit(f"load float, ptr {self.slot(rest_tiles, F32, slot)}"), F32, F64)
              total = self.emit(f"fadd double {total}, {part}")
            self.scopes[-1][node] = self.cast(total, F64, node.dtype)
            self.emit_ready(self.ast)

  def render_transpose_blocks(self, row: UOp, column: UOp) -> None:
    """An elementwise kernel's (rows, columns) loops in blocks of `self.transpose` x `self.transpose` (the last ones
    partial): rows of a block outside, its columns inside, one block of columns after the other. With register
    transposes (`register_transposes`) a whole block is squares of `self.transpose_lanes` done on vectors."""
    block, columns = self.transpose, self.value(column.src[0])
    with self.loop("%start", "%end", None, step=block, whole=False) as row_block:
      row_end = self.capped(row_block, block, "%end")
      with self.loop("0", columns, None, step=block, whole=False) as column_block:
        column_end = self.capped(column_block, block, columns)
        partial = "true"
        if self.transpose_lanes:
          whole = self.both(self.emit(f"icmp eq i64 {row_end}, {self.emit(f'add nsw i64 {row_block}, {block}')}"),
                            self.emit(f"icmp eq i64 {column_end}, {self.emit(f'add nsw i64 {column_block}, {block}')}"))
          for load in self.across:
            if block_stride(load.src[1], row, self.transpose_lanes) == 1: continue
            # (rows consecutive only between boundaries: the block's rows are, if its last is block - 1 after its first)
            with self.bound(column, column_block):
              ends = []
              for value in (row_block, self.emit(f"add nsw i64 {row_block}, {block - 1}")):
                with self.rebound(load.src[1], {row: value}): ends.append(self.value(load.src[1]))
            span = self.emit(f"sub i64 {ends[1]}, {ends[0]}")
            whole = self.both(whole, self.emit(f"icmp eq i64 {span}, {block - 1}"))
          # (the block's squares in a loop over its rows of squares and one over each row's: 16 squares of 8 x 8 per
          # 32 x 32 block unrolled were 1900 lines of IR, 0.5 s of LLVM for a transpose; each row's squares unrolled
          # 30 KB of IR and 74-117 ms, none 10 KB and 44-66 ms, and ran the same or faster: 512x512 97 / 136 -> 86 /
          # 116 us min / median, 784x512 142 / 201 -> 114 / 147, 4096x4096 16.5 / 20.0 -> 17.3 / 19.9 ms)
          lanes = self.transpose_lanes
          with self.when(whole), \
              self.loop(row_block, self.emit(f"add nsw i64 {row_block}, {block}"), None, step=lanes, vectorize=False,
                        unroll=False) as first_row, \
              self.loop(column_block, self.emit(f"add nsw i64 {column_block}, {block}"), None, step=lanes,
                        vectorize=False, unroll=False) as first_column:
            self.render_register_transpose(row, column, first_row, first_column)
          partial = self.emit(f"xor i1 {whole}, true")
        with self.when(partial), self.loop(row_block, row_end, row):
          self.emit_ready(self.ast)
          with self.loop(column_block, column_end, column): self.emit_ready(self.ast)

  def render_register_transpose(self, row: UOp, column: UOp, first_row: str, first_column: str) -> None:
    """One lanes x lanes square from (first_row, first_column): each LOAD read across the columns as one vector per
    column (the square's rows are consecutive in memory), transposed in registers into one vector per row; then each
    row's value as vectors along the columns (`vector_value`) and one vector STORE."""
    lanes = self.transpose_lanes
    rows_of: dict[UOp, list[str]] = {}
    with self.bound(row, first_row):
      for load in self.across:
        element = memory_type(load.src[0].dtype)
        vectors = []
        for column_value in self.offsets(first_column, lanes):
          with self.bound(column, column_value):
            vectors.append(self.emit(f"load <{lanes} x {element}>, ptr {self.address_of(load)}, "
                                     f"align {load.src[0].dtype.itemsize}"))
        rows_of[load] = self.transposed_vectors(vectors, element)
    (store,) = [node for node in self.ast.src if node.op is Ops.STORE]
    buffer, index, value = store.src
    for i, row_value in enumerate(self.offsets(first_row, lanes)):
      with self.bound(row, row_value), self.bound(column, first_column):
        packed = {load: self.from_memory(vectors[i], load.src[0].dtype, lanes) for load, vectors in rows_of.items()}
        stored = self.to_memory(self.vector_value(value, lanes, packed, {}, column), buffer.dtype, lanes)
        self.emit_needed(index)
        self.store_vector(stored, lanes, buffer.dtype, self.address(buffer, index), self.transposes_streamed)
    self.stores_emitted.add(store)

  def transposed_vectors(self, vectors: list[str], element: str) -> list[str]:
    """The transpose of a square held as vectors (vector j's lane i is element (i, j)): vector i's lane j is element
    (i, j). log2(lanes) rounds of two-input shuffles; round `bit` swaps that bit of the row and of the column of every
    element (vectors a and a | bit trade their lanes k with bit set for lanes k ^ bit of the other)."""
    lanes = len(vectors)
    vector = f"<{lanes} x {element}>"
    rows, bit = list(vectors), 1
    while bit < lanes:
      low = [k if not k & bit else lanes + (k ^ bit) for k in range(lanes)]
      high = [k ^ bit if not k & bit else lanes + k for k in range(lanes)]
      result = list(rows)
      for a in range(lanes):
        if a & bit: continue
        for target, mask in ((a, low), (a | bit, high)):
          indices = ", ".join(f"i32 {k}" for k in mask)
          result[target] = self.emit(f"shufflevector {vector} {rows[a]}, {vector} {rows[a | bit]}, "
                                     f"<{lanes} x i32> <{indices}>")
      rows, bit = result, bit * 2
    return rows

  # ---- nodes

  def constant(self, value, dtype: np.dtype) -> str: return literal(value, dtype)

  def buffer_value(self, index: int) -> str: return f"%buf{index}"

  # ---- the primitives of a tiled matrix product (Linearizer.render_gemm; GPU)

  def thread_ids(self) -> tuple[str, str]: return "%gid", "%lane"

  def index(self, op: str, left: str | int, right: str | int) -> str:
    """i64 index arithmetic on non-negative values: op is add, mul, div, rem or min."""
    if op == "min": return self.call("llvm.umin.i64", "i64", [("i64", str(left)), ("i64", str(right))])
    instruction = {"add": "add nuw nsw", "mul": "mul nuw nsw", "div": "udiv", "rem": "urem"}[op]
    return self.emit(f"{instruction} i64 {left}, {right}", "idx")

  def less(self, left: str | int, right: str | int) -> str: return self.emit(f"icmp ult i64 {left}, {right}")

  def both(self, first: str, second: str) -> str: return self.emit(f"and i1 {first}, {second}")

  def local_array(self, dtype: np.dtype, size: int) -> str:
    self.counter += 1
    array = f"@shared{self.counter}"
    self.declarations.add(f"{array} = internal addrspace(3) global [{size} x {compute_type(dtype)}] undef, align 16")
    return array

  def local_address(self, array: str, index: str, element: str) -> str:
    """The address of element `index` (of LLVM type `element`) of a local (shared, addrspace 3) array."""
    return self.emit(f"getelementptr inbounds {element}, ptr addrspace(3) {array}, i64 {index}", "addr")

  def local_store(self, array: str, index: str, value: str, dtype: np.dtype) -> None:
    address = self.local_address(array, index, compute_type(dtype))
    self.line(f"store {compute_type(dtype)} {value}, ptr addrspace(3) {address}")

  def local_load(self, array: str, index: str, dtype: np.dtype) -> str:
    address = self.local_address(array, index, compute_type(dtype))
    return self.emit(f"load {compute_type(dtype)}, ptr addrspace(3) {address}")

  def local_store_lanes(self, array: str, index: str, values: list[str], dtype: np.dtype) -> None:
    """Store neighbouring values into a local array with one vector store (`index` a multiple of their count)."""
    vector_type_name, vector = f"<{len(values)} x {compute_type(dtype)}>", "poison"
    for position, value in enumerate(values):
      vector = self.emit(f"insertelement {vector_type_name} {vector}, {compute_type(dtype)} {value}, i64 {position}")
    address = self.local_address(array, index, compute_type(dtype))
    self.line(f"store {vector_type_name} {vector}, ptr addrspace(3) {address}, align {len(values) * dtype.itemsize}")

  def address_of(self, load: UOp) -> str:
    """The address a plain LOAD reads, what it needs emitted first (`emit_needed`: in a tiled product's stage)."""
    self.emit_needed(load.src[0])
    self.emit_needed(load.src[1])
    return self.address(*load.src)

  def load_lanes(self, load: UOp, lanes: int) -> list[str]:
    """The `lanes` elements of a buffer from LOAD `load`'s index on (one aligned vector load: gpu.py `vector_axis`),
    in their compute type."""
    element = memory_type(load.dtype)
    alignment = lanes * load.dtype.itemsize
    vector = self.emit(f"load <{lanes} x {element}>, ptr {self.address_of(load)}, align {alignment}")
    return [self.from_memory(self.emit(f"extractelement <{lanes} x {element}> {vector}, i64 {index}"), load.dtype)
            for index in range(lanes)]

  def barrier(self) -> None:
    self.declarations.add("declare void @llvm.nvvm.barrier0()")
    self.line("call void @llvm.nvvm.barrier0()")

  def new_sum(self, dtype: np.dtype) -> str:
    accumulator = self.alloca(compute_type(dtype))
    self.line(f"store {compute_type(dtype)} {literal(0, dtype)}, ptr {accumulator}")
    return accumulator

  def add_to_sum(self, accumulator: str, dtype: np.dtype, part: str) -> None:
    """Add `part` to a tiled product's sum: in order, fused with the product into an FMA where it is one."""
    current = self.emit(f"load {compute_type(dtype)}, ptr {accumulator}")
    total = self.combine(Ops.ADD, dtype, current, part, ordered=True, contract=True)
    self.line(f"store {compute_type(dtype)} {total}, ptr {accumulator}")

  def sum_value(self, accumulator: str, dtype: np.dtype) -> str:
    return self.emit(f"load {compute_type(dtype)}, ptr {accumulator}")

  def render_mma_gemm(self, global_ranges: list[UOp]) -> None:
    """A tiled matrix product on tensor cores (codegen/gpu.py `GemmTile.mma`): per block of BLOCK_STEPS values of k,
    the work-group stages its 16-bit operands' rows of a and columns of b into local memory as [row][k] and
    [column][k] (k contiguous, rows padded by MMA_PAD, k past its end as zeros), then each warp runs
    `mma.sync.aligned.m16n8k16.row.col.f32.<type>.<type>.f32` over its 16 x 8 tiles, for each 16 values of k,
    its fragments read as pairs of values (lane = 4 * group + pair: a's rows group and group + 8, pairs of k at
    2 * pair and 2 * pair + 8; b's column group, the same k; the sums' rows group and group + 8 and columns 2 * pair
    and 2 * pair + 1, as PTX lays the m16n8k16 fragments out)."""
    from tinyjax.codegen.gpu import MMA_PAD, MMA_VECTOR, global_size, vector_axis
    tile = self.launch.tile
    block_rows, block_columns, block_steps, warps_down, warps_across = tile.sizes
    warp_rows, warp_columns = block_rows // warps_down, block_columns // warps_across
    (a,), (b,) = tile.a, tile.b
    narrow = a.src[0].dtype
    pitch = block_steps + MMA_PAD
    first_row, first_column = self.gemm_block(global_ranges)
    _, lane = self.thread_ids()
    warp, in_warp = self.index("div", lane, 32), self.index("rem", lane, 32)
    group, pair = self.index("div", in_warp, 4), self.index("rem", in_warp, 4)
    warp_row = self.index("mul", self.index("div", warp, warps_across), warp_rows)
    warp_column = self.index("mul", self.index("rem", warp, warps_across), warp_columns)
    i16 = np.dtype(np.int16)
    arrays = {a: self.local_array(i16, block_rows * pitch), b: self.local_array(i16, block_columns * pitch)}
    tiles = [(m, n) for m in range(warp_rows // 16) for n in range(warp_columns // 8)]
    sums = {(m, n): [self.new_sum(F32) for _ in range(4)] for m, n in tiles}

    def bits(factor: UOp) -> str:
      """The 16 bits of a factor's operand (a plain load's element as it is in memory)."""
      operand = factor.src[0]
      if operand.op is Ops.LOAD and len(operand.src) == 2:
        raw = self.emit(f"load {memory_type(narrow)}, ptr {self.address_of(operand)}")
      else: raw = self.to_memory(self.emit_needed(operand), narrow)
      return self.emit(f"bitcast half {raw} to i16") if narrow == F16 else raw

    def store(factor: UOp, step: str, offset: str, value: str, inside: str | None) -> None:
      if inside is not None: value = self.emit(f"select i1 {inside}, i16 {value}, i16 0")
      self.local_store(arrays[factor], self.index("add", self.index("mul", offset, pitch), step), value, i16)

    def pair_at(array: str, line: str, step: int) -> str:
      """Two neighbouring 16-bit values (k = step + 2 * pair and the next) of row `line` of a staged array, as i32."""
      slot = self.index("add", self.index("mul", line, pitch), self.index("add", self.index("mul", pair, 2), step))
      return self.emit(f"load i32, ptr addrspace(3) {self.local_address(array, slot, 'i16')}, align 4")

    def stage_vectors(factor: UOp, outer: tuple[UOp, ...], first: str, span: int, first_step: str, axis: UOp) -> None:
      """Stage a factor's block MMA_VECTOR elements per load (codegen/gpu.py `vector_axis`): along k, stored as they
      are into its row; along `outer`, one element into each of MMA_VECTOR rows."""
      vector = f"<{MMA_VECTOR} x i16>"
      for r in range(span * block_steps // MMA_VECTOR // tile.threads):
        element = self.index("add", lane, r * tile.threads)
        if axis is tile.k:  # neighbouring work-items: neighbouring groups of a row (16-byte stores into it)
          per_line = block_steps // MMA_VECTOR
          step = self.index("mul", self.index("rem", element, per_line), MMA_VECTOR)
          offset = self.index("div", element, per_line)
        else:  # neighbouring values of k: their single stores into MMA_VECTOR rows hit neighbouring banks (with
          # neighbouring groups they hit one bank: 4096^3 bfloat16 88 -> 76 TFLOP/s on an H200)
          step = self.index("rem", element, block_steps)
          offset = self.index("mul", self.index("div", element, block_steps), MMA_VECTOR)
        position = self.index("add", first, offset)
        if (size := math.prod(global_size(rng) for rng in outer)) % span:  # (past the edge: the last whole group)
          position = self.index("min", position, size - (1 if axis is tile.k else MMA_VECTOR))
        with self.bindings({**self.digits(outer, position), **self.gemm_k(self.index("add", first_step, step))}):
          values = self.emit(f"load <{MMA_VECTOR} x {memory_type(narrow)}>, ptr {self.address_of(factor.src[0])}, "
                             "align 16")
        if narrow == F16: values = self.emit(f"bitcast <{MMA_VECTOR} x half> {values} to {vector}")
        if axis is tile.k:
          address = self.local_address(arrays[factor], self.index("add", self.index("mul", offset, pitch), step), "i16")
          self.line(f"store {vector} {values}, ptr addrspace(3) {address}, align 16")
          continue
        for index in range(MMA_VECTOR):
          slot = self.index("add", self.index("mul", self.index("add", offset, index), pitch), step)
          self.local_store(arrays[factor], slot, self.emit(f"extractelement {vector} {values}, i64 {index}"), i16)

    def stage(factor: UOp, outer: tuple[UOp, ...], first: str, span: int, first_step: str, count: int) -> None:
      if count == block_steps and (axis := vector_axis(factor.src[0], (tile.k, outer[-1]), MMA_VECTOR)) is not None:
        stage_vectors(factor, outer, first, span, first_step, axis)
      else: self.gemm_stage((factor,), outer, first, span, first_step, count, store, bits)

    instruction = f"mma.sync.aligned.m16n8k16.row.col.f32.{tile.mma}.{tile.mma}.f32 " \
                  "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};"
    constraints = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"

    def block(first_step: str, count: int) -> None:
      stage(a, tile.rows, first_row, block_rows, first_step, count)
      stage(b, (tile.column,), first_column, block_columns, first_step, count)
      self.barrier()
      for k16 in range(0, block_steps, 16):
        fragments_a = {}
        for m in range(warp_rows // 16):  # (rows group and group + 8 of the warp's m-th 16)
          top = self.index("add", warp_row, self.index("add", group, m * 16))
          bottom = self.index("add", top, 8)
          fragments_a[m] = [pair_at(arrays[a], top, k16), pair_at(arrays[a], bottom, k16),
                            pair_at(arrays[a], top, k16 + 8), pair_at(arrays[a], bottom, k16 + 8)]
        fragments_b = {}
        for n in range(warp_columns // 8):
          line = self.index("add", self.index("add", warp_column, n * 8), group)
          fragments_b[n] = [pair_at(arrays[b], line, k16), pair_at(arrays[b], line, k16 + 8)]
        for m, n in tiles:
          current = [self.sum_value(total, F32) for total in sums[(m, n)]]
          operands = [f"i32 {v}" for v in fragments_a[m] + fragments_b[n]] + [f"float {v}" for v in current]
          result = self.emit(f'call {{float, float, float, float}} asm sideeffect "{instruction}", '
                             f'"{constraints}"({", ".join(operands)})')
          for index, total in enumerate(sums[(m, n)]):
            self.line(f"store float {self.emit(f'extractvalue {{float, float, float, float}} {result}, {index}')}, "
                      f"ptr {total}")
      self.barrier()

    self.gemm_steps(block)
    my_row = self.index("add", self.index("add", first_row, warp_row), group)
    my_column = self.index("add", self.index("add", first_column, warp_column), self.index("mul", pair, 2))
    for m, n in tiles:
      for index, total in enumerate(sums[(m, n)]):
        row = self.index("add", my_row, m * 16 + index // 2 * 8)
        column = self.index("add", my_column, n * 8 + index % 2)
        self.gemm_store(row, column, self.cast(self.sum_value(total, F32), F32, tile.reduce.dtype))

  def select(self, cond: str, if_true: str, if_false: str, dtype: np.dtype) -> str:
    return self.emit(f"select i1 {cond}, {compute_type(dtype)} {if_true}, {compute_type(dtype)} {if_false}")

  def address(self, buffer: UOp, index: UOp) -> str:
    return self.emit(f"getelementptr inbounds {memory_type(buffer.dtype)}, ptr {self.value(buffer)}, "
                     f"i64 {self.value(index)}", "addr")

  def load_element(self, buffer: UOp, index: UOp) -> str:
    raw = self.emit(f"load {memory_type(buffer.dtype)}, ptr {self.address(buffer, index)}")
    return self.from_memory(raw, buffer.dtype)

  def render_load(self, node: UOp) -> str:
    buffer, index, *gate = node.src
    if not gate: return self.load_element(buffer, index)
    # gated: branch around the load, so a false gate touches no memory (the vectoriser turns this into masked loads)
    self.counter += 1
    then_block, merge_block, before = f"gate{self.counter}", f"gate{self.counter}.end", self.block
    self.line(f"br i1 {self.value(gate[0])}, label %{then_block}, label %{merge_block}")
    self.label(then_block)
    loaded = self.load_element(buffer, index)
    loaded_block = self.block
    self.line(f"br label %{merge_block}")
    self.label(merge_block)
    return self.emit(f"phi {compute_type(node.dtype)} [ {literal(0, node.dtype)}, %{before} ], "
                     f"[ {loaded}, %{loaded_block} ]")

  def render_store(self, node: UOp) -> str:
    buffer, index, value = node.src
    stored = self.to_memory(self.value(value), buffer.dtype)
    address = self.address(buffer, index)
    if self.launch.group_reduction:  # the group's work-items all hold the value: work-item 0 stores it
      with self.when(self.emit("icmp eq i64 %lane, 0")):
        self.line(f"store {memory_type(buffer.dtype)} {stored}, ptr {address}")
    else: self.line(f"store {memory_type(buffer.dtype)} {stored}, ptr {address}")
    self.stores_emitted.add(node)
    return "store"

  @contextlib.contextmanager
  def when(self, condition: str) -> Iterator[None]:
    """Code emitted inside the `with` runs only if `condition` (an i1) holds; it defines no value used after."""
    self.counter += 1
    then_block, done_block = f"when{self.counter}", f"when{self.counter}.end"
    self.line(f"br i1 {condition}, label %{then_block}, label %{done_block}")
    self.label(then_block)
    yield
    self.line(f"br label %{done_block}")
    self.label(done_block)

  def render_unary(self, node: UOp) -> str:
    (operand,) = node.src
    value, kind, llvm_type, op = self.value(operand), dtype_kind(node.dtype), compute_type(node.dtype), node.op
    if op is Ops.NEG:
      if kind == "f" and self.gpu and llvm_type == "float":  # (NVPTX's neg.ftz.f32 would flush a subnormal)
        return self.emit(f'call float asm "neg.f32 $0, $1;", "=f,f"(float {value})')
      if kind == "f": return self.emit(f"fneg {llvm_type} {value}")
      if kind == "b": return self.emit(f"xor i1 {value}, true")  # logical not
      return self.emit(f"sub {llvm_type} 0, {value}")
    if kind != "f":
      if op is Ops.TRUNC: return value
      raise NotImplementedError(f"codegen: {op.name} on {node.dtype}")
    if op is Ops.RECIP: result = self.emit(f"fdiv {llvm_type} {_float_hex(1.0)}, {value}")
    elif self.decompose and llvm_type == "double" and op in _FLOAT64_ARITHMETIC:
      return _FLOAT64_ARITHMETIC[op](self, value)
    elif self.decompose and llvm_type == "float" and op in _DECOMPOSED_FLOAT64:
      return self.cast(_DECOMPOSED_FLOAT64[op](self, value), F64, node.dtype)  # one rounding to the dtype
    elif self.decompose and llvm_type == "float" and op in _DECOMPOSED_FLOAT32:
      result = _DECOMPOSED_FLOAT32[op](self, value)
    else: result = self.call(f"{_FLOAT_UNARY_INTRINSIC[op]}.{_suffix(llvm_type)}", llvm_type, [(llvm_type, value)])
    return self.round(result, node.dtype) if op in _ROUNDED_FLOAT_OPS else result

  def render_binary(self, node: UOp) -> str:
    lhs, rhs = node.src
    op, dtype = node.op, lhs.dtype
    kind, llvm_type = dtype_kind(dtype), compute_type(dtype)
    left, right = self.value(lhs), self.value(rhs)
    if op in (Ops.CMPLT, Ops.CMPNE): return self.emit(f"{_COMPARE[(op, kind)]} {llvm_type} {left}, {right}")
    if kind == "b":
      if op not in _BOOL_BINARY: raise NotImplementedError(f"codegen: {op.name} on bool")
      return self.emit(f"{_BOOL_BINARY[op]} i1 {left}, {right}")
    if kind == "f":
      if op not in _FLOAT_BINARY and op not in _FLOAT_BINARY_INTRINSIC:
        raise NotImplementedError(f"codegen: {op.name} on {dtype}")
      if op is Ops.POW and self.gpu:  # no libm: float64 arithmetic (transcendental.py), rounded once to the dtype
        if llvm_type == "double": return transcendental.pow_f64(self, left, right)
        wide = [self.emit(f"fpext float {value} to double") for value in (left, right)]
        return self.cast(transcendental.pow_f64(self, *wide), F64, node.dtype)
      if op in _FLOAT_BINARY_INTRINSIC:
        result = self.call(f"{_FLOAT_BINARY_INTRINSIC[op]}.{_suffix(llvm_type)}", llvm_type,
                           [(llvm_type, left), (llvm_type, right)])
      else:
        # the product of a contraction may fuse with its accumulation into an FMA (one rounding instead of two)
        contract = self.plan is not None and self.plan.contract and node is self.plan.reduce.src[0] or \
            self.launch.tile is not None and node is self.launch.tile.reduce.src[0]
        if contract and (fused := self.fused_product(node, left, right)) is not None: return fused
        result = self.emit(f"{_FLOAT_BINARY[op]}{' contract' if contract else ''} {llvm_type} {left}, {right}")
        if op is Ops.MOD and self.gpu:  # NVPTX's frem gives x for fmod(±inf, ±inf), which is NaN
          magnitude = self.call(f"llvm.fabs.{_suffix(llvm_type)}", llvm_type, [(llvm_type, left)])
          infinite = self.emit(f"fcmp oeq {llvm_type} {magnitude}, {_float_hex(float('inf'))}")
          result = self.emit(f"select i1 {infinite}, {llvm_type} {_float_hex(float('nan'))}, {llvm_type} {result}")
      return self.round(result, node.dtype) if op in _ROUNDED_FLOAT_OPS else result
    if op in _INT_BINARY: return self.emit(f"{_INT_BINARY[op]} {llvm_type} {left}, {right}")
    if op is Ops.MAX:
      return self.call(f"{_INT_MAX_INTRINSIC[kind]}.{llvm_type}", llvm_type, [(llvm_type, left), (llvm_type, right)])
    if op in (Ops.IDIV, Ops.MOD): return self.int_division(op, lhs, rhs)
    if op in (Ops.SHL, Ops.SHR): return self.shift(op, lhs, rhs)
    raise NotImplementedError(f"codegen: {op.name} on {dtype}")

  def int_division(self, op: Ops, lhs: UOp, rhs: UOp) -> str:
    """IDIV / MOD truncating toward zero with XLA's answers where C has UB: x / 0 = -1, x % 0 = x,
    INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0."""
    dtype, llvm_type = lhs.dtype, compute_type(lhs.dtype)
    signed = dtype_kind(dtype) == "i"
    left, right = self.value(lhs), self.value(rhs)
    instruction = {(Ops.IDIV, True): "sdiv", (Ops.IDIV, False): "udiv", (Ops.MOD, True): "srem",
                   (Ops.MOD, False): "urem"}[(op, signed)]
    if rhs.op is Ops.CONST:  # index arithmetic: a constant divisor needs no guards
      divisor = int(rhs.arg)
      if divisor == 0: return literal(-1, dtype) if op is Ops.IDIV else left
      if signed and divisor == -1: return self.emit(f"sub {llvm_type} 0, {left}") if op is Ops.IDIV else "0"
      if signed and divisor > 0 and lhs.vmin_vmax[0] >= 0: instruction = "u" + instruction[1:]  # shifts and masks
      return self.emit(f"{instruction} {llvm_type} {left}, {right}")
    by_zero = self.emit(f"icmp eq {llvm_type} {right}, 0")
    unsafe = by_zero
    if signed:
      overflows = self.emit(f"and i1 {self.emit(f'icmp eq {llvm_type} {left}, {literal(min_value(dtype), dtype)}')}, "
                            f"{self.emit(f'icmp eq {llvm_type} {right}, -1')}")
      unsafe = self.emit(f"or i1 {by_zero}, {overflows}")
    safe_divisor = self.emit(f"select i1 {unsafe}, {llvm_type} 1, {llvm_type} {right}")  # INT_MIN / 1 = INT_MIN
    result = self.emit(f"{instruction} {llvm_type} {left}, {safe_divisor}")
    by_zero_result = "-1" if op is Ops.IDIV else left
    return self.emit(f"select i1 {by_zero}, {llvm_type} {by_zero_result}, {llvm_type} {result}")

  def shift(self, op: Ops, lhs: UOp, rhs: UOp) -> str:
    """SHL / SHR (arithmetic for signed, logical for unsigned); amounts >= the bit width (or negative) shift
    everything out: 0, or -1 for a negative signed SHR."""
    dtype, llvm_type = lhs.dtype, compute_type(lhs.dtype)
    bits = dtype.itemsize * 8
    left, amount = self.value(lhs), self.value(rhs)
    instruction = "shl" if op is Ops.SHL else ("ashr" if dtype_kind(dtype) == "i" else "lshr")
    constant_in_range = rhs.op is Ops.CONST and 0 <= int(rhs.arg) < bits
    # compared in the amount's own type, before it is narrowed: a negative amount is a huge unsigned one
    too_far = None if constant_in_range else self.emit(f"icmp uge {compute_type(rhs.dtype)} {amount}, {bits}")
    amount = self.cast(amount, rhs.dtype, np.dtype(f"u{dtype.itemsize}"))
    if too_far is None: return self.emit(f"{instruction} {llvm_type} {left}, {amount}")
    in_range = self.emit(f"select i1 {too_far}, {llvm_type} {bits - 1}, {llvm_type} {amount}")
    shifted = self.emit(f"{instruction} {llvm_type} {left}, {in_range}")
    if instruction == "ashr": return shifted  # shifting by bits - 1 already gives 0 or -1
    return self.emit(f"select i1 {too_far}, {llvm_type} 0, {llvm_type} {shifted}")

  # ---- reductions

  def render_reduce(self, node: UOp) -> str:
    """Accumulate the REDUCE's value over its loop nest; emitted here, its value is available after the loops."""
    value, *ranges = node.src
    if not ranges: return self.value(value)
    if node in self.shared: return self.group_reduce(node)
    if not self.gpu and self.plan is None and (lanes := reduce_lanes(node, self.deps)):
      return self.vector_reduce(node, lanes)

    def body() -> list[tuple[str, np.dtype]]:
      self.emit_ready(value)
      return [(self.value(value), value.dtype)]

    return self.reduce_loops(node, 1, body)[0]

  def vector_reduce(self, node: UOp, lanes: int) -> str:
    """A float32 sum or maximum over one range of contiguous values (`reduce_lanes`) in an order written out: `lanes`
    running results, a vector of the range's steps folded in at a time (the steps past the last whole vector by masked
    loads, the other lanes folding in the identity), then added up in halves (the first half's lanes with the
    second's, again and again down to one). The IR has no `reassoc` for LLVM to vectorise by, so it computes the same
    bits unoptimised (the first tier, devices/cpu.py `CompileStream`) as vector code."""
    value, rng = node.src
    steps, op = rng.src[0].arg, node.arg
    whole, llvm_type = steps // lanes * lanes, vector_type(F32, lanes)
    identity = self.splat(literal(IDENTITY[op](F32), F32), F32, lanes)
    accumulator = self.alloca(llvm_type)
    self.line(f"store {llvm_type} {identity}, ptr {accumulator}")

    def fold(position: str, mask: str | None) -> None:
      with self.bound(rng, position):
        part = self.cast(self.vector_value(value, lanes, {}, {}, rng, mask), value.dtype, F32, lanes)
      if mask is not None: part = self.emit(f"select <{lanes} x i1> {mask}, {llvm_type} {part}, {llvm_type} {identity}")
      current = self.emit(f"load {llvm_type}, ptr {accumulator}")
      self.line(f"store {llvm_type} {self.combine(op, F32, current, part, ordered=True, lanes=lanes)}, "
                f"ptr {accumulator}")
    with self.loop("0", str(whole), None, step=lanes, vectorize=False) as position: fold(position, None)
    if whole < steps:
      fold(str(whole), "<" + ", ".join(f"i1 {'true' if whole + lane < steps else 'false'}" for lane in range(lanes)) +
           ">")
    total, width = self.emit(f"load {llvm_type}, ptr {accumulator}"), lanes
    while width > 1:
      half, vector = width // 2, vector_type(F32, width)
      low, high = (self.emit(f"shufflevector {vector} {total}, {vector} poison, <{half} x i32> <" +
                             ", ".join(f"i32 {lane}" for lane in range(first, first + half)) + ">")
                   for first in (0, half))
      if half == 1: low, high = (self.emit(f"extractelement <1 x float> {v}, i64 0") for v in (low, high))
      total, width = self.combine(op, F32, low, high, ordered=True, lanes=half), half
    return self.cast(total, F32, node.dtype)

  def group_reduce(self, node: UOp) -> str:
    """A REDUCE shared by the work-group (GPU, codegen/gpu.py): work-item `%lane` folds steps lane, lane + group, ...
    of the first range (the other ranges whole) into a partial result; the partials are combined in a tree in shared
    memory (addrspace 3) with a barrier after each level. A float32 sum's partials are float64 (few terms each)."""
    value, first, *inner = node.src
    group, size = self.launch.group, int(first.src[0].arg)
    inner_dtype = accumulator_dtype(node)
    acc_dtype = F64 if node.arg is Ops.ADD and inner_dtype == F32 else inner_dtype
    llvm_type = compute_type(acc_dtype)
    accumulator = self.alloca(llvm_type)
    self.line(f"store {llvm_type} {literal(IDENTITY[node.arg](acc_dtype), acc_dtype)}, ptr {accumulator}")

    def level(depth: int) -> None:
      if depth == len(inner):
        self.emit_ready(value)
        part = self.cast(self.cast(self.value(value), value.dtype, inner_dtype), inner_dtype, acc_dtype)
        current = self.emit(f"load {llvm_type}, ptr {accumulator}")
        self.line(f"store {llvm_type} {self.combine(node.arg, acc_dtype, current, part)}, ptr {accumulator}")
        return
      with self.loop("0", self.value(inner[depth].src[0]), inner[depth]): level(depth + 1)

    with self.loop("0", str(-(-size // group)), None, vectorize=False) as step:
      position = self.emit(f"add nuw nsw i64 {self.emit(f'mul nuw nsw i64 {step}, {group}')}, %lane", "idx")
      inside = self.emit(f"icmp slt i64 {position}, {size}") if size % group else "true"
      with self.when(inside), self.bound(first, position): level(0)
    partial = self.emit(f"load {llvm_type}, ptr {accumulator}")
    # shared memory: booleans as i8
    shared_type = "i8" if acc_dtype == BOOL else llvm_type
    self.counter += 1
    array = f"@shared{self.counter}"
    self.declarations.add(f"{array} = internal addrspace(3) global [{group} x {shared_type}] undef, align 8")
    self.declarations.add("declare void @llvm.nvvm.barrier0()")

    def slot(index: str) -> str:
      return self.emit(f"getelementptr inbounds [{group} x {shared_type}], ptr addrspace(3) {array}, i64 0, "
                       f"i64 {index}", "addr")

    def store(value: str, address: str) -> None:
      if acc_dtype == BOOL: value = self.emit(f"zext i1 {value} to i8")
      self.line(f"store {shared_type} {value}, ptr addrspace(3) {address}")

    def load(address: str) -> str:
      loaded = self.emit(f"load {shared_type}, ptr addrspace(3) {address}")
      return self.emit(f"icmp ne i8 {loaded}, 0") if acc_dtype == BOOL else loaded

    mine = slot("%lane")
    store(partial, mine)
    self.line("call void @llvm.nvvm.barrier0()")
    half = group // 2
    while half:
      with self.when(self.emit(f"icmp ult i64 %lane, {half}")):
        other = load(slot(self.emit(f"add nuw nsw i64 %lane, {half}", "idx")))
        store(self.combine(node.arg, acc_dtype, load(mine), other), mine)
      self.line("call void @llvm.nvvm.barrier0()")
      half //= 2
    return self.cast(load(slot("0")), acc_dtype, node.dtype)

  def reduce_loops(self, node: UOp, count: int, body: Callable[[], list[tuple[str, np.dtype]]],
                   tiled: bool = False, contract: bool = False, lanes: int = 1, vectors: bool = False) -> list[str]:
    """Emit the loop nest of REDUCE `node` over its ranges, folding the `count` values `body()` emits per innermost
    iteration into `count` accumulators; return their final values in `node.dtype`. float16 / bfloat16 accumulate in
    float32, rounded once at the end (`accumulator_dtype`). A float32 sum is blocked: the flattened loop nest is cut
    into blocks of at most SUM_BLOCK steps (the plan's `sum_block` for a tile), each summed in float32 and added into
    float64 accumulators. The innermost ranges whose product fits a block run whole inside it, the range just outside
    them is cut into chunks of block // product iterations, and the ranges further out only add block sums up: one set
    of float32 accumulators per block whatever the nesting (a 3x3 convolution's window loops don't flush every 3 steps).
    `tiled`: the accumulators are a tile (vectors, or scalars SLP vectorises), so the loops are not vectorised over the
    reduce range and float accumulation keeps its order, as a small kernel's short sum does (`in_order_sums`);
    `contract` lets a float product and its accumulation fuse into an FMA. With `lanes` > 1 `body()` emits vectors of
    that many values (a vector tile body) and the `count` accumulators are vectors; the results are one value per
    element, `count * lanes` of them, or with `vectors` the `count` vectors themselves."""
    ranges = list(node.src[1:])
    inner_dtype = accumulator_dtype(node)
    block = self.plan.sum_block if tiled else GPU_SUM_BLOCK if self.gpu else SUM_BLOCK
    ordered = tiled or self.in_order_sums and all(rng.src[0].op is Ops.CONST for rng in ranges) and \
        math.prod(rng.src[0].arg for rng in ranges) <= SHORT_REDUCE

    whole = unrolled_whole(ranges) if len(ranges) > 1 else set()

    def loops(over: list[UOp]) -> list[tuple[str, str, UOp | None, bool | str]]:
      return [("0", self.value(rng.src[0]), rng, "full" if rng in whole else True) for rng in over]

    def innermost(_: list[str]) -> tuple[list[str], np.dtype]:
      return [self.cast(part, part_dtype, inner_dtype, lanes) for part, part_dtype in body()], inner_dtype

    def finish(results: list[str], dtype: np.dtype) -> list[str]:
      if lanes == 1 or vectors: return [self.cast(result, dtype, node.dtype, lanes) for result in results]
      llvm_type = vector_type(dtype, lanes)
      return [self.cast(self.emit(f"extractelement {llvm_type} {result}, i64 {lane}"), dtype, node.dtype)
              for result in results for lane in range(lanes)]

    float32_sum = node.arg is Ops.ADD and inner_dtype == F32
    split, product = len(ranges), 1
    while float32_sum and split and ranges[split - 1].src[0].op is Ops.CONST and \
        product * ranges[split - 1].src[0].arg <= block:
      split -= 1
      product *= ranges[split].src[0].arg
    if not float32_sum or split == 0 or ranges[split - 1].src[0].op is not Ops.CONST:  # one block: no float64
      results = self.accumulate(node, inner_dtype, count, loops(ranges), innermost, tiled, contract, lanes, ordered)
      return finish(results, inner_dtype)
    outer, chunked, inner = ranges[:split - 1], ranges[split - 1], ranges[split:]
    chunk, size = block // product, chunked.src[0].arg

    def block_sum(indices: list[str]) -> tuple[list[str], np.dtype]:
      chunk_start, chunk_end = self.block_bounds(indices[-1], chunk, str(size))
      return self.accumulate(node, inner_dtype, count, [(chunk_start, chunk_end, chunked, True), *loops(inner)],
                             innermost, tiled, contract, lanes, ordered), inner_dtype

    # the block loop is kept a loop, one memory stream (see SUM_BLOCK); a tile's blocks are short (plan.sum_block) and
    # its loop nest is laid out by hand, so its block loop is left to LLVM
    block_loop = ("0", str(-(-size // chunk)), None, tiled)
    blocks = -(-size // chunk) * math.prod(rng.src[0].arg for rng in outer)
    total = F32 if tiled and blocks <= FLOAT32_BLOCKS else F64  # (a tile's few block sums: FLOAT32_BLOCKS)
    results = self.accumulate(node, total, count, [*loops(outer), block_loop], block_sum, tiled, lanes=lanes,
                              ordered=ordered)
    return finish(results, total)

  def accumulate(self, node: UOp, acc_dtype: np.dtype, count: int, nest: list[tuple[str, str, UOp | None, bool]],
                 body: Callable[[list[str]], tuple[list[str], np.dtype]], tiled: bool = False,
                 contract: bool = False, lanes: int = 1, ordered: bool = False,
                 initial: list[str] | None = None) -> list[str]:
    """One accumulation of a reduction over a loop nest (each level (start, end, RANGE bound or None, unroll)):
    `count` accumulators of `acc_dtype` (vectors of `lanes`) start at the identity (or at the values `initial`) and
    fold in the values of `body(indices)` in the innermost loop, in order where `tiled` or `ordered`; returns the
    accumulators' final values (see `reduce_loops`)."""
    llvm_type = vector_type(acc_dtype, lanes)
    accumulators = [self.alloca(llvm_type) for _ in range(count)]
    identity = self.splat(literal(IDENTITY[node.arg](acc_dtype), acc_dtype), acc_dtype, lanes)
    for i, accumulator in enumerate(accumulators):
      self.line(f"store {llvm_type} {identity if initial is None else initial[i]}, ptr {accumulator}")

    def level(depth: int, indices: list[str]) -> None:
      if depth == len(nest):
        parts, part_dtype = body(indices)
        for accumulator, part in zip(accumulators, parts):
          part = self.cast(part, part_dtype, acc_dtype, lanes)
          current = self.emit(f"load {llvm_type}, ptr {accumulator}")
          combined = self.combine(node.arg, acc_dtype, current, part, ordered=tiled or ordered, contract=contract,
                                  lanes=lanes)
          self.line(f"store {llvm_type} {combined}, ptr {accumulator}")
        return
      start, end, binds, unroll = nest[depth]
      vectorize = not tiled and not (depth == len(nest) - 1 and binds is not None and strided_only(node, binds))
      with self.loop(start, end, binds, vectorize=vectorize, unroll=unroll) as index:
        level(depth + 1, [*indices, index])

    level(0, [])
    return [self.emit(f"load {llvm_type}, ptr {accumulator}") for accumulator in accumulators]

  # ---- tiles: the reduce loop outside a block of output elements (see opt.py)

  def render_tiles(self, global_ranges: list[UOp], depth: int) -> None:
    """Emit the plan's row and column loops (the last global ranges) as loops over tiles. Columns go in tiles of
    `plan.columns`, then of one vector, then one by one; rows (inside) in tiles of `plan.rows`, then one by one. Each
    tile is a block (`render_block`); the first global range runs [start, end) whatever its role, so a chunk that
    is no multiple of a tile just ends in smaller tiles."""
    plan = self.plan
    assert plan is not None

    def bounds(rng: UOp) -> tuple[str, str]:
      return ("%start", "%end") if rng is global_ranges[0] else ("0", self.value(rng.src[0]))

    column_start, column_end = bounds(plan.column)
    if plan.stream:
      with self.loop(column_start, column_end, None, step=plan.columns, whole=False) as tile_start:
        width = self.call("llvm.smin.i64", "i64", [("i64", str(plan.columns)),
                                                    ("i64", self.emit(f"sub nsw i64 {column_end}, {tile_start}"))])
        self.render_stream_tile(tile_start, width)
      return
    outermost = global_ranges[0]
    row_heights = None if plan.row is None else self.row_heights(outermost)
    if plan.tiles > 1 and plan.panel:  # (a panel packs every column tile: `render_row_groups` runs them all)
      self.render_row_groups(*bounds(plan.row), column_start, plan.columns, row_heights)
      self.packs = {}
      return
    if plan.sweep:
      self.render_sweep(self.value(plan.row.src[0]), column_start, column_end, row_heights)
      return
    if plan.tiles > 1:  # (every column tile packed first, then each row tile runs them all)
      with self.loop(column_start, column_end, None, step=plan.tiles * plan.columns) as block_start:
        self.render_packed_row_tiles(*bounds(plan.row), block_start, row_heights)
      return
    if plan.dot and plan.column is not outermost and plan.column.src[0].arg <= DOT_ROWS_OUTSIDE:
      for row_index, height, clamp in self.row_tiles(*bounds(plan.row), row_heights):
        start = column_start
        for width in self.tile_sizes(plan.column, plan.columns, outermost, plan.lanes):
          with self.loop(start, column_end, None, step=width) as column_index:
            self.render_block(row_index, height, column_index, width, clamp)
          start = column_index
      return
    for width in self.tile_sizes(plan.column, plan.columns, outermost, plan.lanes):
      with self.loop(column_start, column_end, None, step=width) as column_index:
        if width == plan.columns and plan.packed and not plan.panel: self.pack(column_index)
        if self.row_tile is not None:  # the row's tile loop is open further out (render_row_tiles)
          row_index, height, clamp = self.row_tile
          self.render_block(row_index, height, column_index, width, clamp)
        elif plan.row is None:
          self.render_block(None, 1, column_index, width)
        elif self.k_blocked():
          self.render_row_groups(*bounds(plan.row), column_index, width, row_heights)
        else:
          row_start, row_end = bounds(plan.row)
          prefetches = self.column_prefetch(column_index) if width == plan.columns else None
          for row_index, height, clamp in self.row_tiles(row_start, row_end, row_heights):
            self.render_block(row_index, height, column_index, width, clamp, prefetches)
        self.packs = {}
      column_start = column_index

  def render_sweep(self, rows: str, column_start: str, column_end: str, heights: list[int]) -> None:
    """The register tiles of a plan that sweeps its column (opt.py SWEEP_ROWS), in chunks of SWEEP_COLUMNS columns:
    `plan.sweep` reduce steps at a time, every row tile runs them over each column tile of the chunk, its float32
    sums loaded from the chunk's array where the block's first steps are past (else from zero) and stored back; at
    each block's end (`plan.sum_block` steps) the block sums are added into the totals, float32 for a few blocks, else
    float64; then the epilogue and STORE from the array, row by row. The same operations in the same order as a tile
    that runs its steps whole (`reduce_loops`): the same bits."""
    plan = self.plan
    assert plan is not None and plan.row is not None
    node = plan.reduce
    (rng,) = node.src[1:]
    size, block, count = rng.src[0].arg, plan.sum_block, plan.row.src[0].arg
    width = min(SWEEP_COLUMNS, plan.column.src[0].arg)
    blocks = -(-size // block)
    total_dtype = None if blocks == 1 else F32 if blocks <= FLOAT32_BLOCKS else F64
    sums = self.alloca(f"[{count * width} x float]", align=LINE_BYTES)
    totals = None if total_dtype is None else \
        self.alloca(f"[{count * width} x {compute_type(total_dtype)}]", align=LINE_BYTES)

    def element(row: str, offset: str) -> str:  # (row `row`, column `offset` of the chunk, in the arrays)
      return self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {row}, {width}')}, {offset}")

    def zeroed(array: str, dtype: np.dtype) -> None:
      with self.loop("0", str(count * width), None) as slot:
        self.line(f"store {compute_type(dtype)} {literal(0, dtype)}, ptr {self.slot(array, dtype, slot)}")

    with self.loop(column_start, column_end, None, step=width, whole=False, vectorize=False) as chunk:
      chunk_end = self.capped(chunk, width, column_end)
      zeroed(sums, F32)  # (the columns past a short chunk's end: zeros, folded and never stored)
      if totals is not None: zeroed(totals, total_dtype)
      with self.loop("0", str(blocks), None, vectorize=False) as index:
        block_start, block_end = self.block_bounds(index, block, str(size))
        with self.loop(block_start, block_end, None, step=plan.sweep, whole=False, vectorize=False) as sweep:
          sweep_end = self.capped(sweep, plan.sweep, block_end)
          first = self.emit(f"icmp eq i64 {sweep}, {block_start}")
          with self.loop(chunk, chunk_end, None, step=plan.columns, vectorize=False) as column_index:
            offset = self.emit(f"sub nsw i64 {column_index}, {chunk}")
            for row_index, height, _ in self.row_tiles("0", rows, heights):
              row_values = self.tile_rows(row_index, height, None)
              body, lanes = self.tile_body(row_values, self.offsets(column_index, plan.columns))
              vector, zero = vector_type(F32, lanes), self.splat(literal(0, F32), F32, lanes)
              slots = [self.slot(sums, F32, element(row, self.emit(f"add nsw i64 {offset}, {j * lanes}")))
                       for row in row_values for j in range(plan.columns // lanes)]
              initial = [self.emit(f"select i1 {first}, {vector} {zero}, {vector} "
                                   f"{self.emit(f'load {vector}, ptr {slot}, align 4')}") for slot in slots]

              def step(_, body=body, lanes=lanes):
                return [self.cast(part, dtype, F32, lanes) for part, dtype in body()], F32
              parts = self.accumulate(node, F32, len(slots), [(sweep, sweep_end, rng, True)], step, tiled=True,
                                      contract=plan.contract, lanes=lanes, initial=initial)
              for slot, part in zip(slots, parts): self.line(f"store {vector} {part}, ptr {slot}, align 4")
        if totals is not None:
          with self.loop("0", str(count * width), None) as slot:
            kept = self.emit(f"load {compute_type(total_dtype)}, ptr {self.slot(totals, total_dtype, slot)}")
            part = self.cast(self.emit(f"load float, ptr {self.slot(sums, F32, slot)}"), F32, total_dtype)
            self.line(f"store {compute_type(total_dtype)} "
                      f"{self.combine(Ops.ADD, total_dtype, kept, part, ordered=True)}, "
                      f"ptr {self.slot(totals, total_dtype, slot)}")
      result, result_dtype = (sums, F32) if totals is None else (totals, total_dtype)
      with self.loop("0", rows, None, vectorize=False) as row, self.bound(plan.row, row):
        with self.loop(chunk, chunk_end, None, step=plan.columns, vectorize=False) as column_index:
          first_slot = element(row, self.emit(f"sub nsw i64 {column_index}, {chunk}"))
          self.store_sums_row(result, result_dtype, first_slot, column_index, plan.columns)

  @contextlib.contextmanager
  def column_tiles(self, column_start: str, tiles: int, arrays: dict[Any, tuple[str, np.dtype, int]]) \
      -> Iterator[tuple[str, dict[Any, str]]]:
    """A loop over `tiles` column tiles of the plan's from `column_start` (none for one tile): each one's first column
    and its part of each of `arrays` (key -> (array, dtype, values per tile): the tiles' packs or sums side by side,
    `opt.TilePlan.tiles`)."""
    plan = self.plan
    assert plan is not None
    if tiles == 1:
      yield column_start, {key: array for key, (array, _, _) in arrays.items()}
      return
    with self.loop("0", str(tiles), None, vectorize=False) as tile:
      yield self.emit(f"add nsw i64 {column_start}, {self.emit(f'mul nsw i64 {tile}, {plan.columns}')}"), \
          {key: self.slot(array, dtype, self.emit(f"mul nsw i64 {tile}, {size}"))
           for key, (array, dtype, size) in arrays.items()}

  def render_packed_row_tiles(self, row_start: str, row_end: str, column_start: str, heights: list[int]) -> None:
    """The plan's `tiles` column tiles packed side by side first (`opt.TilePlan.tiles`: all of them in L1), then
    each row tile runs every column tile: the row operand is read once, where a loop over the column tiles outside
    the rows read it once per column tile."""
    plan = self.plan
    assert plan is not None
    steps, columns = math.prod(rng.src[0].arg for rng in plan.reduce.src[1:]), plan.columns
    arrays = {load: self.alloca(f"[{plan.tiles * steps * columns} x {compute_type(load.dtype)}]", align=LINE_BYTES)
              for load in plan.packed}
    self.pack(column_start, packs=arrays, tiles=plan.tiles)
    for row_index, height, clamp in self.row_tiles(row_start, row_end, heights):
      with self.column_tiles(column_start, plan.tiles, {load: (array, load.dtype, steps * columns)
                                                        for load, array in arrays.items()}) as (first, self.packs):
        self.render_block(row_index, height, first, columns, clamp)
    self.packs = {}

  def tile_sizes(self, rng: UOp, tile: int, outermost: UOp, narrower: int = 1) -> list[int]:
    """The tile sizes, widest first, that a loop over the plan's column runs in: `tile`, then `narrower` and 1 for
    what is left. A range of a multiple of `tile` values leaves nothing (a GEMM's 512 columns in tiles of 64), so only
    whole tiles are emitted: less IR for LLVM to optimise (a 512^3 matmul kernel's body had 405 multiplies for its
    256-multiply tile). The kernel's outermost range runs a launch chunk [start, end), whose bounds are multiples of
    the plan's grain in every launch the runtime makes; it keeps a one-by-one loop after its tiles, so that any chunk
    is still computed right."""
    size = rng.src[0].arg
    if size % tile == 0: return sorted({tile, 1}, reverse=True) if rng is outermost else [tile]
    # (tiles wider than the range never run: a 10-class classifier's 64- and 16-column tiles were 3/4 of its IR)
    return sorted({width for width in (tile, narrower, 1) if width <= size}, reverse=True)

  def row_heights(self, outermost: UOp) -> list[int]:
    """The tile heights, tallest first, that the plan's row runs in: a row of fixed length in tiles of `plan.rows`
    and one tile of exactly what is left (14 rows: 6, 6 and 2); the launch range in tiles of `plan.rows` only, the
    last one clamped where the chunk ends inside it ([], see `row_tiles`): one tile body for LLVM to compile, where
    tiles of 2 and 1 rows for the rest made the MLP's GEMM kernels twice the IR (cold first call +40 ms)."""
    plan = self.plan
    assert plan is not None and plan.row is not None
    size, tile = plan.row.src[0].arg, plan.rows
    if plan.row is outermost: return []
    return [tile, size % tile] if size % tile else [tile]

  def row_tiles(self, row_start: str, row_end: str, heights: list[int]) -> Iterator[tuple[str, int, str | None]]:
    """Loops over row tiles of [row_start, row_end) in the `heights` (`row_heights`): yields (first row, height,
    clamp) inside each loop, for the caller's `for` body to emit the tile there. With no heights (the launch range)
    it is one loop over tiles of `plan.rows`, the last one partial where the chunk ends inside it: its rows past the
    end read the last row again (`clamp`, the last row, bounds each row value; `tile_rows`) and don't store
    (`render_block`)."""
    plan = self.plan
    assert plan is not None
    if not heights:
      last = self.emit(f"sub nsw i64 {row_end}, 1")
      with self.loop(row_start, row_end, None, step=plan.rows, whole=False) as row_index:
        yield row_index, plan.rows, last
      return
    for height in heights:
      with self.loop(row_start, row_end, None, step=height) as row_index:
        yield row_index, height, None
      row_start = row_index

  def tile_rows(self, row_start: str, height: int, clamp: str | None) -> list[str]:
    """The row values of a tile: row_start + i, each at most `clamp` (the last row of the chunk) when clamped."""
    rows = self.offsets(row_start, height)
    if clamp is None: return rows
    return rows[:1] + [self.call("llvm.smin.i64", "i64", [("i64", row), ("i64", clamp)]) for row in rows[1:]]

  def pack(self, column_start: str, panel: tuple[str, str] | None = None, packs: dict[UOp, str] | None = None,
           tiles: int = 1) -> None:
    """Copy the plan's packed loads (the reused operand) for the column tile at `column_start` into arrays, one
    contiguous row of `plan.columns` values per reduce step in loop-nest order (values in their compute type), which
    the tile bodies then read (`tile_body`) instead of the operand itself (see opt.PACK_BYTES). With `panel`, only
    the reduce steps [start, end) of its one reduce range (`plan.panel` at most), from the array's start; with
    `packs` and `tiles`, into those arrays, that many column tiles from `column_start` one after the other (each
    step's tiles copied together: the operand's rows read along, `opt.TilePlan.tiles`)."""
    plan = self.plan
    assert plan is not None
    ranges = plan.reduce.src[1:]
    steps = plan.panel if panel else math.prod(rng.src[0].arg for rng in ranges)
    packs = packs or {load: self.alloca(f"[{steps * plan.columns} x {compute_type(load.dtype)}]", align=LINE_BYTES)
                      for load in plan.packed}
    self.pack_origin = panel[0] if panel else "0"

    transposed = self.transposed_packs(packs, steps)
    per_tile = {load: (array, load.dtype, steps * plan.columns) for load, array in packs.items()}

    def column_tiles() -> contextlib.AbstractContextManager[tuple[str, dict[UOp, str]]]:
      return self.column_tiles(column_start, tiles, per_tile)

    def nest(depth: int) -> None:
      if depth < len(ranges):
        start, end = panel if panel else ("0", str(ranges[depth].src[0].arg))
        if transposed and depth == len(ranges) - 1:
          with self.loop(start, end, None, step=self.transpose_square, vectorize=False) as step:
            with column_tiles() as (first_column, arrays):
              self.pack_transposed(arrays, ranges[depth], step, first_column)
          return
        with self.loop(start, end, ranges[depth]): nest(depth + 1)
        return
      first = self.emit(f"mul nsw i64 {self.pack_row()}, {plan.columns}")
      with column_tiles() as (first_column, arrays), self.loop("0", str(plan.columns), None) as j:
        with self.bound(plan.column, self.emit(f"add nsw i64 {first_column}, {j}", "idx")):
          for load, array in arrays.items():
            self.emit_ready(load)
            address = self.slot(array, load.dtype, self.emit(f"add nsw i64 {first}, {j}"))
            self.line(f"store {compute_type(load.dtype)} {self.value(load)}, ptr {address}")
    nest(0)
    self.packs = packs

  def copy_rows(self, arrays: dict[UOp, str], stride: int, group: str, group_end: str, first: str, last: str) -> None:
    """Copy the plan's row-packed loads (opt.ROW_PACK_PAD) for the rows [group, group_end) and the reduce steps
    [first, last) of its one reduce range into `arrays`, step after step `stride` values apart, which the tile bodies
    then read (`tile_body`) instead of the operand: a contiguous copy of each step's rows."""
    plan = self.plan
    assert plan is not None and plan.row is not None
    rng = plan.reduce.src[1]
    with self.loop(first, last, rng) as step, self.loop(group, group_end, plan.row) as row:
      offset = self.emit(f"sub nsw i64 {step}, {first}")
      at = self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {offset}, {stride}')}, "
                     f"{self.emit(f'sub nsw i64 {row}, {group}')}")
      for load, array in arrays.items():
        self.emit_ready(load)
        self.line(f"store {compute_type(load.dtype)} {self.value(load)}, ptr {self.slot(array, load.dtype, at)}")
    self.row_packs = {load: (array, stride, group) for load, array in arrays.items()}

  def transposed_packs(self, packs: dict[UOp, str], steps: int) -> bool:
    """Whether the packed loads are read across (strided along the column, contiguous along the innermost reduce
    range in its aligned blocks of `transpose_square` steps: `g @ w.T`'s w, or an NCHW 1x1 convolution's weight
    gradient's input, whose flat (n, h*w) reduce range reads (r // 3136) * 200704 + r % 3136) by float32 loads whose
    pack can be made in squares of `transpose_square` (`pack_transposed`)."""
    plan = self.plan
    assert plan is not None
    innermost, lanes = plan.reduce.src[-1], self.transpose_square
    if plan.columns % lanes or steps % lanes or innermost.src[0].arg % lanes: return False
    for load in packs:
      strides, nonlinear = linear_strides(load.src[1])
      if len(load.src) != 2 or load.dtype != F32 or plan.column in nonlinear or \
          strides.get(plan.column, 0) in (0, 1) or block_stride(load.src[1], innermost, lanes) != 1:
        return False
    return True

  def pack_transposed(self, packs: dict[UOp, str], innermost: UOp, step: str, column_start: str) -> None:
    """Pack `transpose_square` steps of the innermost reduce range from `step` on, for loads read across
    (`transposed_packs`): per block of as many columns, one vector load along the steps from each column's row, a
    transpose in registers (log2(lanes) rounds of shuffles, pairs of rows interleaved in halves, quarters, ...), one
    vector store per step into its pack row. A 512x512 `g @ w.T` packed w.T one element at a time, a load from a
    different row each: its GEMM ran at 75% of the peak, the others at 86-88%."""
    plan = self.plan
    assert plan is not None
    lanes = self.transpose_square
    vector = f"<{lanes} x float>"
    with self.loop("0", str(plan.columns), None, step=lanes, vectorize=False) as column_block:
      for load, array in packs.items():
        rows = []
        for r in range(lanes):
          column = self.emit(f"add nsw i64 {column_start}, {self.emit(f'add nsw i64 {column_block}, {r}')}", "idx")
          with self.bound(plan.column, column), self.bound(innermost, step):
            self.emit_ready(load.src[1])
            rows.append(self.emit(f"load {vector}, ptr {self.address(load.src[0], load.src[1])}, align 4"))
        half = lanes // 2
        while half:  # (row i of each pair (i, i + half) takes the low halves of both, row i + half the high ones)
          low = ", ".join(f"i32 {p if (p // half) % 2 == 0 else lanes + p - half}" for p in range(lanes))
          high = ", ".join(f"i32 {p + half if (p // half) % 2 == 0 else lanes + p}" for p in range(lanes))
          mixed = list(rows)
          for i in range(lanes):
            if (i // half) % 2: continue
            for target, mask in ((i, low), (i + half, high)):
              mixed[target] = self.emit(f"shufflevector {vector} {rows[i]}, {vector} {rows[i + half]}, "
                                        f"<{lanes} x i32> <{mask}>")
          rows, half = mixed, half // 2
        for t in range(lanes):
          with self.bound(innermost, self.emit(f"add nsw i64 {step}, {t}", "idx")):
            first = self.emit(f"mul nsw i64 {self.pack_row()}, {plan.columns}")
          address = self.slot(array, F32, self.emit(f"add nsw i64 {first}, {column_block}"))
          self.line(f"store {vector} {rows[t]}, ptr {address}, align {lanes * 4}")

  def pack_row(self) -> str:
    """The packed arrays' row at the current reduce step (`pack`)."""
    step = self.reduce_step()
    return step if self.pack_origin == "0" else self.emit(f"sub nsw i64 {step}, {self.pack_origin}")

  def reduce_step(self) -> str:
    """The plan's reduce ranges, at their current values, as one step number (row-major over the loop nest): where a
    packed array keeps that step's values."""
    plan = self.plan
    assert plan is not None
    step = "0"
    for rng in plan.reduce.src[1:]:
      step = self.value(rng) if step == "0" else \
          self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {step}, {rng.src[0].arg}')}, {self.value(rng)}")
    return step

  def packed_loads(self, columns: int, lanes: int = 1) -> list[dict[UOp, str]]:
    """Inside a packed tile body: for each of the tile's `columns` columns (vectors of `lanes` columns), each packed
    load's value there at the current reduce step, read from its array (no values when no column tile is packed)."""
    if not self.packs: return [{} for _ in range(columns)]
    plan = self.plan
    assert plan is not None
    first = self.emit(f"mul nsw i64 {self.pack_row()}, {plan.columns}")
    return [{load: self.emit(f"load {vector_type(load.dtype, lanes)}, ptr "
                             f"{self.slot(array, load.dtype, self.emit(f'add nsw i64 {first}, {j * lanes}'))}"
                             f"{f', align {load.dtype.itemsize}' if lanes > 1 else ''}")
             for load, array in self.packs.items()} for j in range(columns)]

  def render_row_tiles(self, global_ranges: list[UOp], depth: int) -> None:
    """The plan's row, when other global ranges lie between it and the column: a loop over tiles of `plan.rows` rows
    (then one by one), the loops of the ranges after it inside, the column's tiles innermost (`render_tiles`)."""
    plan = self.plan
    assert plan is not None and plan.row is not None
    row_start, row_end = ("%start", "%end") if depth == 0 else ("0", self.value(plan.row.src[0]))
    for row_index, height, clamp in self.row_tiles(row_start, row_end, self.row_heights(global_ranges[0])):
      self.row_tile = (row_index, height, clamp)
      self.open_global_loops(global_ranges, depth + 1)
      self.row_tile = None

  def tile_body(self, row_values: list[str | None],
                column_values: list[str]) -> tuple[Callable[[], list[tuple[str, np.dtype]]], int]:
    """The body of a tile's reduce loop and how many lanes its values have: the REDUCE's value for each element of the
    tile, row-major (fully unrolled: values that don't depend on the column are emitted once per row, those that
    depend on neither once per step). Where the value can be computed on vectors (`vector_body_ok`) and the tile is
    whole vectors wide, the body emits one vector per `plan.lanes` columns (`vector_value`): LLVM gets the tile as
    the vector code it is to become instead of scalars for its SLP vectoriser to pack, a quarter of the IR."""
    plan = self.plan
    assert plan is not None
    value = plan.reduce.src[0]
    lanes = plan.lanes if self.vector_body and len(column_values) % plan.lanes == 0 else 1
    if lanes > 1: column_values = column_values[::lanes]

    def body() -> list[tuple[str, np.dtype]]:
      self.emit_ready(value)
      packed = self.packed_loads(len(column_values), lanes)
      # (the row-packed loads' step, `copy_rows`: each row's value its row in the group from there)
      step_starts = {load: self.emit(f"mul nsw i64 {self.pack_row()}, {stride}")
                     for load, (_, stride, _) in self.row_packs.items()}
      parts = []
      for row_value in row_values:
        with self.bound(plan.row, row_value):
          for load, (array, _, group) in self.row_packs.items():
            at = self.emit(f"add nsw i64 {step_starts[load]}, {self.emit(f'sub nsw i64 {row_value}, {group}')}")
            address = self.slot(array, load.dtype, at)
            self.scopes[-1][load] = self.emit(f"load {compute_type(load.dtype)}, ptr {address}")
          self.emit_ready(value)
          for j, column_value in enumerate(column_values):
            with self.bound(plan.column, column_value):
              if lanes > 1:
                parts.append((self.vector_value(value, lanes, packed[j], {}), value.dtype))
                continue
              self.scopes[-1].update(packed[j])
              self.emit_ready(value)
              parts.append((self.value(value), value.dtype))
      return parts
    return body, lanes

  # ---- vector tile bodies

  def splat(self, value: str, dtype: np.dtype, lanes: int) -> str:
    """`lanes` copies of scalar `value` as a vector (the value itself for one lane)."""
    if lanes == 1: return value
    scalar, llvm_type = compute_type(dtype), vector_type(dtype, lanes)
    if not value.startswith("%"):  # a literal: a constant vector
      return "zeroinitializer" if value in ("0", "false") or value == _float_hex(0.0) else \
          "<" + ", ".join(f"{scalar} {value}" for _ in range(lanes)) + ">"
    first = self.emit(f"insertelement {llvm_type} poison, {scalar} {value}, i64 0")
    return self.emit(f"shufflevector {llvm_type} {first}, {llvm_type} poison, <{lanes} x i32> zeroinitializer")

  def vector_value(self, node: UOp, lanes: int, packed: dict[UOp, str], memo: dict[UOp, str],
                   column: UOp | None = None, mask: str | None = None) -> str:
    """`node` for `lanes` consecutive columns (the plan's, or `column`), the column bound to the first one's value: a
    LOAD contiguous along the column is one vector load (from its pack if it has one; with `mask`, a vector of i1,
    a masked load of the lanes it sets, zeros in the others), what doesn't depend on the column is a scalar made a
    splat, and the operations between are vector instructions (the subset `vector_body_ok` admits)."""
    plan = self.plan
    if column is None:
      assert plan is not None
      column = plan.column
    if column not in self.deps[node]:
      self.emit_ready(node)
      return self.splat(self.value(node), node.dtype, lanes)
    if (done := memo.get(node)) is not None: return done
    if (constant := self.gate_values.get(node)) is not None: return self.splat(constant, BOOL, lanes)
    op, dtype = node.op, node.dtype
    llvm_type = vector_type(dtype, lanes)
    if op is Ops.LOAD and node in packed: result = packed[node]
    elif op is Ops.LOAD:
      buffer, index, *gate = node.src
      # (a gate is the same for every lane, `_vector_nodes_ok`: made of conditions along other axes and the bounds a
      # part of a loop split at its gates fixes; a false one reads nothing, as the scalar code's branch)
      known = self.gate_constant(gate[0]) if gate else True
      memory, align = memory_type(buffer.dtype), buffer.dtype.itemsize
      vector = f"<{lanes} x {memory}>"

      def load() -> str:
        self.emit_ready(index)
        address = self.address(buffer, index)
        if mask is None: return self.emit(f"load {vector}, ptr {address}, align {align}")
        return self.call(f"llvm.masked.load.{_suffix(vector)}.p0", vector, [("ptr", address), ("i32", str(align)),
                         (f"<{lanes} x i1>", mask), (vector, "zeroinitializer")])
      if known is False: raw = "zeroinitializer"
      elif known: raw = load()
      else:
        self.emit_ready(gate[0])
        self.counter += 1
        then_block, merge_block, before = f"gate{self.counter}", f"gate{self.counter}.end", self.block
        self.line(f"br i1 {self.value(gate[0])}, label %{then_block}, label %{merge_block}")
        self.label(then_block)
        with self.bindings({}): loaded = load()  # (what it computes stays in its block)
        loaded_block = self.block
        self.line(f"br label %{merge_block}")
        self.label(merge_block)
        raw = self.emit(f"phi {vector} [ zeroinitializer, %{before} ], [ {loaded}, %{loaded_block} ]")
      result = self.from_memory(raw, buffer.dtype, lanes)
    elif op is Ops.RANGE:  # the column itself: its first value plus 0 .. lanes-1
      steps = "<" + ", ".join(f"i64 {lane}" for lane in range(lanes)) + ">"
      result = self.emit(f"add nsw <{lanes} x i64> {self.splat(self.value(node), dtype, lanes)}, {steps}")
    else:
      sources = [self.vector_value(source, lanes, packed, memo, column, mask) for source in node.src]
      if op is Ops.CAST: result = self.vector_cast(sources[0], node.src[0].dtype, dtype, lanes)
      elif op is Ops.BITCAST: result = self.emit(f"bitcast {vector_type(node.src[0].dtype, lanes)} {sources[0]} to "
                                                 f"{llvm_type}")
      elif op in _DECOMPOSED_FLOAT32: result = _DECOMPOSED_FLOAT32[op](self, sources[0], lanes)
      elif op is Ops.RECIP: result = self.emit(f"fdiv {llvm_type} {self.splat(_float_hex(1.0), dtype, lanes)}, "
                                               f"{sources[0]}")
      elif op in (Ops.TRUNC, Ops.SQRT):
        result = self.call(f"{_FLOAT_UNARY_INTRINSIC[op]}.{_suffix(llvm_type)}", llvm_type, [(llvm_type, sources[0])])
      elif op is Ops.WHERE:
        result = self.emit(f"select <{lanes} x i1> {sources[0]}, {llvm_type} {sources[1]}, {llvm_type} {sources[2]}")
      elif op in (Ops.SHL, Ops.SHR):  # (by a constant in range: `_constant_shift`)
        instruction = "shl" if op is Ops.SHL else ("ashr" if dtype_kind(dtype) == "i" else "lshr")
        result = self.emit(f"{instruction} {llvm_type} {sources[0]}, "
                           f"{self.splat(str(int(node.src[1].arg)), dtype, lanes)}")
      elif op is Ops.NEG:
        kind = dtype_kind(dtype)
        result = self.emit(f"fneg {llvm_type} {sources[0]}") if kind == "f" else \
            self.emit(f"xor {llvm_type} {sources[0]}, {self.splat('true', dtype, lanes)}") if kind == "b" else \
            self.emit(f"sub {llvm_type} zeroinitializer, {sources[0]}")
      else:
        operand_dtype = node.src[0].dtype
        kind, operand_type = dtype_kind(operand_dtype), vector_type(operand_dtype, lanes)
        left, right = sources
        if op in (Ops.CMPLT, Ops.CMPNE): result = self.emit(f"{_COMPARE[(op, kind)]} {operand_type} {left}, {right}")
        elif kind == "b": result = self.emit(f"{_BOOL_BINARY[op]} {llvm_type} {left}, {right}")
        elif op is Ops.MAX:
          name = "llvm.maximum" if kind == "f" else _INT_MAX_INTRINSIC[kind]
          result = self.call(f"{name}.{_suffix(llvm_type)}", llvm_type, [(llvm_type, left), (llvm_type, right)])
        elif kind == "f":
          contract = plan is not None and plan.contract and node is plan.reduce.src[0]
          if not contract or (result := self.fused_product(node, left, right)) is None:
            result = self.emit(f"{_FLOAT_BINARY[op]}{' contract' if contract else ''} {llvm_type} {left}, {right}")
        else: result = self.emit(f"{_INT_BINARY[op]} {llvm_type} {left}, {right}")
    memo[node] = result
    return result

  def gate_constant(self, gate: UOp) -> bool | None:
    """A gate's value where it is made of the bounds a part of a loop split at its gates fixes (`gate_split`,
    `gate_values`), ANDed (and with conditions that don't hold, false); None where it is not known so."""
    if (value := self.gate_values.get(gate)) is not None: return value == "true"
    if gate.op is not Ops.AND: return None
    parts = [self.gate_constant(source) for source in gate.src]
    return False if False in parts else None if None in parts else True

  def vector_store(self, result: str, lanes: int) -> None:
    """The epilogue and STORE of `lanes` consecutive columns of a vector tile, the column bound to the first one's
    value, the REDUCE's results there in vector `result` (see `vector_epilogue_ok`)."""
    plan = self.plan
    assert plan is not None
    (store,) = [node for node in self.ast.src if node.op is Ops.STORE]
    buffer, index, value = store.src
    stored = self.to_memory(self.vector_value(value, lanes, {}, {plan.reduce: result}), buffer.dtype, lanes)
    self.emit_ready(index)
    self.store_vector(stored, lanes, buffer.dtype, self.address(buffer, index), plan.nontemporal)
    self.stores_emitted.add(store)

  def concatenated(self, vectors: list[str], lanes: int, dtype: np.dtype) -> str:
    """One vector of `vectors` (each `lanes` values of `dtype`) end to end."""
    while len(vectors) > 1:
      vector, order = vector_type(dtype, lanes), ", ".join(f"i32 {i}" for i in range(2 * lanes))
      vectors = [self.emit(f"shufflevector {vector} {a}, {vector} {b}, <{2 * lanes} x i32> <{order}>")
                 for a, b in zip(vectors[::2], vectors[1::2])]
      lanes *= 2
    return vectors[0]

  def store_vector(self, value: str, lanes: int, dtype: np.dtype, address: str, nontemporal: bool) -> None:
    """Store vector `value` of `lanes` values of `dtype` at `address`; with `nontemporal`, where the vector is a
    whole 64-byte line, streamed to memory (opt.NONTEMPORAL_BYTES). The instruction needs the line's address, which
    a block of the pool has, and a host array given to a donated argument may not: checked per store."""
    vector = f"<{lanes} x {memory_type(dtype)}>"
    if not nontemporal or lanes * dtype.itemsize != LINE_BYTES:
      self.line(f"store {vector} {value}, ptr {address}, align {dtype.itemsize}")
      return
    if not self.nontemporal:
      self.metadata.append(f"!{len(self.metadata)} = !{{i32 1}}")
      self.nontemporal = f"!{len(self.metadata) - 1}"
    offset = self.emit(f"and i64 {self.emit(f'ptrtoint ptr {address} to i64')}, {LINE_BYTES - 1}")
    streamed, plain, done = self.fresh("streamed")[1:], self.fresh("plain")[1:], self.fresh("stored")[1:]
    self.line(f"br i1 {self.emit(f'icmp eq i64 {offset}, 0')}, label %{streamed}, label %{plain}")
    self.label(streamed)
    self.line(f"store {vector} {value}, ptr {address}, align {LINE_BYTES}, !nontemporal {self.nontemporal}")
    self.line(f"br label %{done}")
    self.label(plain)
    self.line(f"store {vector} {value}, ptr {address}, align {dtype.itemsize}")
    self.line(f"br label %{done}")
    self.label(done)

  def vector_cast(self, value: str, src: np.dtype, dst: np.dtype, lanes: int) -> str:
    """`cast` for vectors of `lanes` values: the conversions that round nothing or once in one instruction
    (`vector_cast_ok`)."""
    src_kind, dst_kind = dtype_kind(src), dtype_kind(dst)
    src_type, dst_type = vector_type(src, lanes), vector_type(dst, lanes)
    if src == F32 and dst in (F16, BF16): return self.round(value, dst, lanes)  # (one rounding, `round`)
    if src_type == dst_type: return value  # float16 / bfloat16 values are exact floats; same-width integers
    if dst_kind == "b":
      compare = "fcmp une" if src_kind == "f" else "icmp ne"
      return self.emit(f"{compare} {src_type} {value}, zeroinitializer")
    if src_kind == "b": return self.emit(f"{'uitofp' if dst_kind == 'f' else 'zext'} {src_type} {value} to {dst_type}")
    if src_kind in "iu" and dst_kind in "iu":
      instruction = "trunc" if dst.itemsize < src.itemsize else "sext" if src_kind == "i" else "zext"
      return self.emit(f"{instruction} {src_type} {value} to {dst_type}")
    if src_kind in "iu":
      return self.emit(f"{'sitofp' if src_kind == 'i' else 'uitofp'} {src_type} {value} to {dst_type}")
    return self.emit(f"{'fpext' if dst == F64 else 'fptrunc'} {src_type} {value} to {dst_type}")

  def render_block(self, row_start: str | None, rows: int, column_start: str, columns: int,
                   clamp: str | None = None, prefetches: Prefetches | None = None) -> None:
    """One tile: rows x columns accumulators of the plan's REDUCE, updated in one pass of its loop nest
    (`tile_body`; with `prefetches`, each step also prefetches a line, `prefetch_step`), then the epilogue and STORE
    of each element. A clamped tile's rows past `clamp` repeat the last row's values and store nothing (an epilogue
    may read what the store overwrites: a donated buffer)."""
    plan = self.plan
    assert plan is not None
    row_values = [None] if row_start is None else self.tile_rows(row_start, rows, clamp)
    column_values = self.offsets(column_start, columns)
    body, lanes = self.tile_body(row_values, column_values)
    if prefetches is not None:
      tile_body = body

      def body():
        self.prefetch_step(prefetches)
        return tile_body()
    # (a looped epilogue reads its sums from an array: they are stored there a vector at a time, converted, even where
    # the epilogue runs per element)
    vectors = lanes > 1 and (self.vector_epilogue or self.looped_epilogue and vector_sums_ok(plan.reduce))
    self.prefetch_epilogue(row_values, column_start, columns)
    results = iter(self.reduce_loops(plan.reduce, rows * columns // lanes, body, tiled=not plan.dot,
                                     contract=plan.contract, lanes=lanes, vectors=vectors))
    if self.looped_epilogue:
      self.looped_store(results, row_start, rows, column_start, columns, clamp, lanes if vectors else 1)
      return
    for i, row_value in enumerate(row_values):
      with contextlib.ExitStack() as stack:
        if clamp is not None and i > 0:
          stack.enter_context(self.when(self.emit(f"icmp sle i64 {self.emit(f'add nsw i64 {row_start}, {i}')}, "
                                                  f"{clamp}")))
        with self.bound(plan.row, row_value):
          if vectors:
            # (a non-temporal store is a whole line: vectors narrower than one stored a line at a time, AVX2's
            # two ymm halves, which the write-combining buffers send to memory as one line)
            per = LINE_BYTES // (lanes * plan.reduce.dtype.itemsize) if plan.nontemporal else 1
            per = per if len(column_values) % (lanes * per) == 0 else 1
            for column_value in column_values[::lanes * per]:
              with self.bound(plan.column, column_value):
                self.vector_store(self.concatenated([next(results) for _ in range(per)], lanes,
                                                    plan.reduce.dtype), lanes * per)
            continue
          for column_value in column_values:
            with self.bound(plan.column, column_value):
              self.scopes[-1][plan.reduce] = next(results)
              self.emit_ready(self.ast)

  def prefetch_epilogue(self, row_values: list[str | None], column_start: str, columns: int) -> None:
    """Before a register tile's sums: a prefetch of every line its epilogue will load (`epilogue_prefetch_loads`),
    each row's lines along the tile's columns."""
    plan = self.plan
    assert plan is not None
    for load in self.epilogue_loads:
      per_line = max(1, LINE_BYTES // load.src[0].dtype.itemsize)
      for row_value in row_values if plan.row in self.deps[load] else [None]:  # (a bias: one row's lines)
        for offset in range(0, columns, per_line):
          values = {plan.column: self.emit(f"add nsw i64 {column_start}, {offset}")}
          if row_value is not None: values[plan.row] = row_value
          self.prefetch_line(load, values)
      self.prefetched.add(load.src[0].arg)

  def prefetch_line(self, load: UOp, values: dict[UOp, str]) -> None:
    """Prefetch the line `load` reads where the RANGEs `values` have those values (`rebound`). (A plain GEP: the
    address may leave the buffer, which a prefetch may: it never faults.)"""
    with self.rebound(load.src[1], values):
      address = self.emit(f"getelementptr {memory_type(load.src[0].dtype)}, ptr {self.value(load.src[0])}, "
                          f"i64 {self.value(load.src[1])}")
    self.declarations.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    self.line(f"call void @llvm.prefetch.p0(ptr {address}, i32 0, i32 3, i32 1)")

  def looped_store(self, results: Iterator[str], row_start: str | None, rows: int, column_start: str, columns: int,
                   clamp: str | None, lanes: int = 1) -> None:
    """A tile's epilogue and STORE in loops over its rows (those up to `clamp`) and columns (vectors of `lanes`
    columns where the epilogue runs on vectors), each element's sum read from an array of the tile's sums
    (`looped_epilogue`)."""
    plan = self.plan
    assert plan is not None
    dtype = plan.reduce.dtype
    element, vector = compute_type(dtype), vector_type(dtype, lanes)
    align = f", align {dtype.itemsize}" if lanes > 1 else ""
    sums = self.alloca(f"[{rows * columns} x {element}]", align=LINE_BYTES)
    for k, value in enumerate(results):
      self.line(f"store {vector} {value}, ptr {self.slot(sums, dtype, str(k * lanes))}{align}")
    count = str(rows)
    if clamp is not None:  # (a clamped tile's rows past the chunk's last store nothing)
      last = self.emit(f"sub nsw i64 {clamp}, {row_start}")
      count = self.call("llvm.smin.i64", "i64", [("i64", count), ("i64", self.emit(f"add nsw i64 {last}, 1"))])
    with self.loop("0", count, None, vectorize=False) as i:
      row = None if row_start is None else self.emit(f"add nsw i64 {row_start}, {i}", "idx")
      with self.bound(plan.row, row):
        self.store_sums_row(sums, dtype, self.emit(f"mul nsw i64 {i}, {columns}"), column_start, columns)

  def k_blocked(self) -> bool:
    """Whether the plan's register tiles run in row groups with the reduce range cut into blocks (`render_row_groups`,
    chosen by opt.py)."""
    return self.plan is not None and self.plan.group > 0

  def render_row_groups(self, row_start: str, row_end: str, column_start: str, columns: int,
                        heights: list[int]) -> None:
    """The register tiles of one column tile in row groups of `plan.group` rows, the reduction cut into blocks: for
    each block every tile of the group runs the block (float32 accumulators in registers) and adds its sums into the
    group's sums in an array, so that the block's slice of the reused operand is read from a near cache by all the
    group's tiles instead of from a far one by each. The blocks are
    - a GEMM's (one reduce range) of `plan.sum_block` steps, its sums float64 (K-blocked; a pack too big for
      PACK_BYTES is made a panel of `plan.panel` steps at a time, per group; spans, `opt._spans`, sum apart);
    - a direct convolution's (channels, then its taps, `opt._window_chunk`) of `plan.chunk` channels, the taps whole
      (as `reduce_loops` unrolls them), its sums float32 for at most FLOAT32_BLOCKS blocks, else float64: its block's
      taps are then read from L1.
    The float32 block sums and their total are the same operations, in the same order, as `reduce_loops` performs
    for a single tile of that many blocks. Then the epilogue and STORE per element, row by row."""
    plan = self.plan
    assert plan is not None and plan.row is not None
    outer = plan.reduce.src[1]
    size, block = outer.src[0].arg, plan.chunk or plan.sum_block
    total_dtype = F32 if plan.chunk and -(-size // block) <= FLOAT32_BLOCKS else F64
    span_count = math.prod(span.src[0].arg for span in plan.spans)
    panel = plan.panel if plan.panel and columns == plan.columns else size
    # (a panel of every column tile, `opt.TilePlan.tiles`: the tiles' packs and sums side by side, the tiles run one
    # after the other from `column_start`)
    tiles = plan.tiles if panel < size else 1
    tile_sums = span_count * plan.group * columns
    sums = self.alloca(f"[{tiles * tile_sums} x {compute_type(total_dtype)}]", align=LINE_BYTES)
    packs = {load: self.alloca(f"[{tiles * panel * columns} x {compute_type(load.dtype)}]", align=LINE_BYTES)
             for load in plan.packed} if tiles > 1 else None
    # (the row operand's panel, each step's group of rows ROW_PACK_PAD values apart: `copy_rows`)
    row_stride = plan.group + ROW_PACK_PAD
    row_packs = {load: self.alloca(f"[{panel * row_stride} x {compute_type(load.dtype)}]", align=LINE_BYTES)
                 for load in plan.row_packed} if panel < size else {}

    # (each column tile's sums, under None, and packs)
    per_tile = {None: (sums, total_dtype, tile_sums),
                **{load: (array, load.dtype, panel * columns) for load, array in (packs or {}).items()}}

    with self.loop(row_start, row_end, None, step=plan.group, whole=False) as group:
      group_end = self.capped(group, plan.group, row_end)
      with self.loop("0", str(tiles * tile_sums), None) as slot:
        self.line(f"store {compute_type(total_dtype)} {literal(0, total_dtype)}, "
                  f"ptr {self.slot(sums, total_dtype, slot)}")

      def row_slots(span: str, row_index: str) -> str:
        row_in_group = self.emit(f"sub nsw i64 {row_index}, {group}")
        if span != "0":
          row_in_group = self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {span}, {plan.group}')}, {row_in_group}")
        return self.emit(f"mul nsw i64 {row_in_group}, {columns}")

      with contextlib.ExitStack() as panels:
        if panel < size:
          index = panels.enter_context(self.loop("0", str(-(-size // panel)), None, vectorize=False))
          panel_start, panel_end = self.block_bounds(index, panel, str(size))
          self.pack(column_start, (panel_start, panel_end), packs, tiles)
          if row_packs: self.copy_rows(row_packs, row_stride, group, group_end, panel_start, panel_end)
          first_block = self.emit(f"sdiv i64 {panel_start}, {block}")
          last_block = self.emit(f"sdiv i64 {self.emit(f'add nsw i64 {panel_end}, {block - 1}')}, {block}")
        else:
          first_block, last_block = "0", str(-(-size // block))
        # (a panel of every column tile is read from L2 by all but the first: a prefetch per tile step cost more than
        # it saved there, 3x3 weight gradient 85-99 -> 54-62 ms on AVX2; the next panel's lines are prefetched in
        # batches instead, `batch` after each tile's block, all of them over the panel's tiles: NCHW 1x1 weight
        # gradient (64 x 100352 x 64) in-process A/B, min / median of 16, 19.1 / 21.0 -> 17.3 / 19.3 ms and 21.3 /
        # 22.5 -> 19.7 / 20.9; NHWC's level; a 3x3 one's (spans) 6% slower, so not with spans)
        prefetches, batch = None, 0
        if panel < size and tiles > 1 and not plan.spans and \
            (prefetches := self.panel_prefetch(group, column_start, panel_end, panel, tiles)) is not None:
          lines = sum(stream.fast_lines * stream.slow_count for stream in prefetches.streams)
          batch = -(-lines // (-(-panel // block) * -(-plan.group // plan.rows) * tiles))
        with self.column_tiles(column_start, tiles, per_tile) as (first, parts):
          tile_sums_at = parts.pop(None)
          if parts: self.packs = parts
          if panel < size and tiles == 1: prefetches = self.panel_prefetch(group, first, panel_end, panel)
          self.render_group_blocks(first_block, last_block, group, group_end, first, columns, heights, tile_sums_at,
                                   total_dtype, row_slots, prefetches, batch)
      self.row_packs = {}
      with self.column_tiles(column_start, tiles, {None: per_tile[None]}) as (first, parts), \
          self.span_loops() as span:
        tile_sums_at = parts[None]
        rest = group
        lanes = self.transpose_square
        if self.transposed_epilogue and columns % lanes == 0:
          if self.transposed_streamed:  # (rows one by one up to the first whose element is a line's first)
            rest = self.first_line(plan.row, group, group_end, {plan.column: first})
            with self.loop(group, rest, None) as row_index, self.bound(plan.row, row_index):
              self.store_sums_row(tile_sums_at, total_dtype, row_slots(span, row_index), first, columns)
          with self.loop(rest, group_end, None, step=lanes, vectorize=False) as rest:
            slots = [row_slots(span, row) for row in self.offsets(rest, lanes)]
            self.store_sums_transposed(tile_sums_at, total_dtype, slots, rest, first, columns)
        with self.loop(rest, group_end, None) as row_index, self.bound(plan.row, row_index):
          self.store_sums_row(tile_sums_at, total_dtype, row_slots(span, row_index), first, columns)

  def store_sums_row(self, sums: str, dtype: np.dtype, first: str, column_start: str, columns: int) -> None:
    """The epilogue and STORE of one row (the row bound) of a row group's or a looped tile's sums in an array (of
    `dtype`, the row's from slot `first` on), a vector at a time where the epilogue allows; over the columns in a loop
    where the epilogue is long (`looped_epilogue`), else unrolled."""
    plan = self.plan
    assert plan is not None
    lanes = plan.lanes if self.vector_epilogue and columns % plan.lanes == 0 else 1

    def store(column_value: str, offset: str) -> None:
      with self.bound(plan.column, column_value):
        address = self.slot(sums, dtype, self.emit(f"add nsw i64 {first}, {offset}"))
        total = self.emit(f"load {vector_type(dtype, lanes)}, ptr {address}, align {dtype.itemsize}")
        if lanes > 1: self.vector_store(self.cast(total, dtype, plan.reduce.dtype, lanes), lanes)
        else:
          self.scopes[-1][plan.reduce] = self.cast(total, dtype, plan.reduce.dtype)
          self.emit_ready(self.ast)
    if self.looped_epilogue:  # (a long epilogue: in a loop over the columns, `looped_epilogue`)
      with self.loop("0", str(columns), None, step=lanes, vectorize=lanes == 1) as j:
        store(self.emit(f"add nsw i64 {column_start}, {j}", "idx"), j)
      return
    for j, column_value in enumerate(self.offsets(column_start, columns // lanes, lanes)):
      store(column_value, str(j * lanes))

  def store_sums_transposed(self, sums: str, dtype: np.dtype, firsts: list[str], first_row: str, column_start: str,
                            columns: int) -> None:
    """The epilogue and STORE of `transpose_square` rows from `first_row` of a row group's sums (of `dtype`, row i's
    from slot `firsts[i]` on), in squares of as many columns: the rows' vectors converted to float32 and
    transposed in registers (`transposed_vectors`), then each column's epilogue on a vector along the rows
    (`vector_value`) and one vector store (`transposed_epilogue_ok`)."""
    plan = self.plan
    assert plan is not None
    lanes = self.transpose_square
    (store,) = [node for node in self.ast.src if node.op is Ops.STORE]
    buffer, index, value = store.src
    self.stored_transposed = True
    for j in range(0, columns, lanes):
      rows = []
      for first in firsts:
        address = self.slot(sums, dtype, self.emit(f"add nsw i64 {first}, {j}"))
        total = self.emit(f"load {vector_type(dtype, lanes)}, ptr {address}, align {dtype.itemsize}")
        rows.append(self.cast(total, dtype, F32, lanes))
      for k, column_sums in enumerate(self.transposed_vectors(rows, "float")):
        with self.bound(plan.column, self.emit(f"add nsw i64 {column_start}, {j + k}", "idx")), \
            self.bound(plan.row, first_row):
          stored = self.vector_value(value, lanes, {}, {plan.reduce: column_sums}, plan.row)
          self.emit_ready(index)
          self.store_vector(self.to_memory(stored, buffer.dtype, lanes), lanes, buffer.dtype,
                            self.address(buffer, index), self.transposed_streamed)
    self.stores_emitted.add(store)

  def render_group_blocks(self, first_block: str, last_block: str, group: str, group_end: str, column_start: str,
                          columns: int, heights: list[int], sums: str, total_dtype: np.dtype,
                          row_slots: Callable[[str, str], str], prefetches: Prefetches | None = None,
                          batch: int = 0) -> None:
    """Blocks [first_block, last_block) of a row group (`render_row_groups`): every tile of the group runs each block,
    its float32 sums added into the group's sums (`total_dtype`). With `prefetches`, each step of a tile also
    prefetches one line of what the next panel reads (`prefetch_step`), or with `batch` each tile that many lines
    after its block."""
    plan = self.plan
    assert plan is not None
    node = plan.reduce
    outer, window = node.src[1], list(node.src[2:])
    size, block = outer.src[0].arg, plan.chunk or plan.sum_block
    whole = unrolled_whole(window)
    taps = [("0", self.value(rng.src[0]), rng, "full" if rng in whole else True) for rng in window]
    with self.loop(first_block, last_block, None, vectorize=False) as index, self.span_loops() as span:
      block_start, block_end = self.block_bounds(index, block, str(size))
      # (a clamped tile's rows past the group's end add into the group's unused sums: the group is whole tiles)
      for row_index, height, clamp in self.row_tiles(group, group_end, heights):
        row_values, column_values = self.tile_rows(row_index, height, clamp), self.offsets(column_start, columns)
        body, lanes = self.tile_body(row_values, column_values)

        def step(_, body=body, lanes=lanes):
          if prefetches and not batch: self.prefetch_step(prefetches)
          return [self.cast(part, dtype, F32, lanes) for part, dtype in body()], F32
        parts = self.accumulate(node, F32, height * columns // lanes, [(block_start, block_end, outer, True), *taps],
                                step, tiled=True, contract=plan.contract, lanes=lanes)
        first = row_slots(span, row_index)
        for i, part in enumerate(parts):
          address = self.slot(sums, total_dtype, self.emit(f"add nsw i64 {first}, {i * lanes}"))
          kept = self.emit(f"load {vector_type(total_dtype, lanes)}, ptr {address}, align {total_dtype.itemsize}")
          total = self.combine(Ops.ADD, total_dtype, kept, self.cast(part, F32, total_dtype, lanes), ordered=True,
                               lanes=lanes)
          self.line(f"store {vector_type(total_dtype, lanes)} {total}, ptr {address}, align {total_dtype.itemsize}")
        if prefetches and batch:
          with self.loop("0", str(batch), None, vectorize=False, unroll=False): self.prefetch_step(prefetches)

  def panel_prefetch(self, group: str, column_start: str, panel_end: str, steps: int,
                     tiles: int = 1) -> Prefetches | None:
    """What the tiles of a row group prefetch while they run a panel: the lines the next panel (`steps` reduce steps
    from `panel_end`) will read of the row operand (the group's rows) and of the packed operand (the columns of `tiles`
    column tiles from `column_start`), one line per tile step in all (`prefetch_step`), so that they are in the caches
    when that panel starts and its pack. A weight gradient reads both operands across, each row a short run of lines far
    from the next row's: a 1x1 convolution's (64 x 100352 x 64, NCHW) read 128 runs of 2 KB per panel, which the
    hardware prefetchers don't follow, and its tiles waited on memory: 2.5 ms unprefetched, 2.05 now (a C model of its
    loops: 2.3 ms with the row operand's lines only). The lines' addresses are the loads' indices evaluated there
    (`rebound`), so a flat (n, h*w) reduce range is prefetched too. A pack along rows is a sequential copy, which the
    prefetchers stream, but it still waited at each panel's start where both operands stream from memory: x.T @ g (64 x
    100352 x 64, NHWC) 394-399 -> 417-429 GFLOP/s; 64x24200x256 and 256x8192x256 within noise."""
    plan = self.plan
    assert plan is not None and plan.row is not None
    rng = plan.reduce.src[1]
    operands = [(load, plan.row, group, plan.group) for load in plan.reduce.src[0].toposort
                if load.op is Ops.LOAD and load not in plan.packed and rng in self.deps[load]
                and plan.row in self.deps[load] and plan.column not in self.deps[load]]
    if plan.packed:
      operands += [(load, plan.column, column_start, tiles * plan.columns) for load in plan.packed]
    return self.prefetches([self.prefetch_stream(load, member, first, members, rng, panel_end, steps)
                            for load, member, first, members in operands])

  def column_prefetch(self, column_start: str) -> Prefetches | None:
    """What a column tile's register tiles prefetch while they run (one line per tile step, `prefetch_step`): the
    lines the next column tile will read of an operand read in place across its rows (each reduce step a row of its
    own, a line or more from the next: opt.py `_in_place`'s, an NCHW 1x1 convolution's input, each image's 64
    channel rows 12.5 KB apart), which the hardware prefetchers, following one stream per row, don't keep up with:
    32x64x56x56 -> 64 channels 1.9-2.0 -> 1.6-1.7 ms (a C model of its loops: 2.0-2.2 -> 1.7). Only where that operand
    also depends on a range outside the tile's row and column (an image: a stream through memory, not a small
    operand that stays in cache)."""
    plan = self.plan
    assert plan is not None
    if plan.packed or len(plan.reduce.src) != 2: return None
    rng, outer = plan.reduce.src[1], set(global_ranges_of(self.ast)) - {plan.row, plan.column}
    streams = []
    for load in plan.reduce.src[0].toposort:
      if load.op is not Ops.LOAD or len(load.src) > 2 or {rng, plan.column} - self.deps[load] or \
          plan.row in self.deps[load] or not outer & self.deps[load]: continue
      strides, other = linear_strides(load.src[1])
      if other or abs(strides.get(rng, 0)) * load.src[0].dtype.itemsize < LINE_BYTES: continue
      following = self.emit(f"add nsw i64 {column_start}, {plan.columns}")
      streams.append(self.prefetch_stream(load, plan.column, following, plan.columns, rng, "0", rng.src[0].arg))
    return self.prefetches(streams)

  def prefetches(self, streams: list[PrefetchStream | None]) -> Prefetches | None:
    """The prefetches of `streams` (those not None), their cursor at 0; None without any."""
    if not (streams := [stream for stream in streams if stream is not None]): return None
    self.prefetched.update(stream.load.src[0].arg for stream in streams)
    cursor = self.alloca("i64")
    self.line(f"store i64 0, ptr {cursor}")
    return Prefetches(cursor, streams)

  def prefetch_stream(self, load: UOp, member: UOp, first: str, members: int, rng: UOp, rng_first: str,
                      steps: int) -> PrefetchStream | None:
    """The lines of `load` over `members` values of range `member` from `first` and `steps` values of reduce range
    `rng` from `rng_first` (strides linear, or `rng`'s within blocks of `transpose_square` steps), walked along the
    range of the shorter stride first, a line's values at a time; None where a stride is unknown."""
    strides, nonlinear = linear_strides(load.src[1])
    if member in nonlinear: return None
    step_stride = block_stride(load.src[1], rng, self.transpose_square) if rng in nonlinear else strides.get(rng)
    if not step_stride or not strides.get(member): return None
    itemsize = load.src[0].dtype.itemsize
    dims = [(abs(step_stride) * itemsize, steps, rng, rng_first), (abs(strides[member]) * itemsize, members, member,
                                                                      first)]
    (fast_bytes, fast_count, fast, fast_first), (_, slow_count, slow, slow_first) = sorted(dims, key=lambda d: d[0])
    per_line = max(1, LINE_BYTES // fast_bytes)
    return PrefetchStream(load, fast, fast_first, slow, slow_first, per_line, -(-fast_count // per_line), slow_count)

  def prefetch_step(self, prefetch: Prefetches) -> None:
    """One tile step's prefetch (`Prefetches`): the cursor's next line, the streams' lines taken in turn."""
    count = self.emit(f"load i64, ptr {prefetch.cursor}")
    self.line(f"store i64 {self.emit(f'add nuw nsw i64 {count}, 1')}, ptr {prefetch.cursor}")
    streams = prefetch.streams
    which = self.emit(f"urem i64 {count}, {len(streams)}") if len(streams) > 1 else "0"
    position = self.emit(f"udiv i64 {count}, {len(streams)}") if len(streams) > 1 else count
    for i, stream in enumerate(streams):
      due = self.emit(f"icmp ult i64 {position}, {stream.fast_lines * stream.slow_count}")
      if len(streams) > 1: due = self.both(due, self.emit(f"icmp eq i64 {which}, {i}"))
      with self.when(due):
        fast = self.emit(f"mul nuw nsw i64 {self.emit(f'urem i64 {position}, {stream.fast_lines}')}, "
                         f"{stream.per_line}")
        slow = self.emit(f"udiv i64 {position}, {stream.fast_lines}")
        self.prefetch_line(stream.load, {stream.fast: self.emit(f"add nsw i64 {stream.fast_first}, {fast}"),
                                         stream.slow: self.emit(f"add nsw i64 {stream.slow_first}, {slow}")})

  @contextlib.contextmanager
  def span_loops(self) -> Iterator[str]:
    """Loops over the plan's spans (`opt._spans`), each bound to its range, outermost first; yields their values'
    flat (row-major) number, "0" without spans."""
    plan = self.plan
    assert plan is not None
    with contextlib.ExitStack() as stack:
      flat = "0"
      for rng in plan.spans:
        index = stack.enter_context(self.loop("0", str(rng.src[0].arg), rng))
        flat = index if flat == "0" else \
            self.emit(f"add nsw i64 {self.emit(f'mul nsw i64 {flat}, {rng.src[0].arg}')}, {index}")
      yield flat

  def render_stream_tile(self, tile_start: str, width: str) -> None:
    """One stream tile: the plan's REDUCEs (`TilePlan.reduces`, or its one `reduce`) for `width` <= plan.columns
    consecutive columns, each with accumulators in an array of its own: its reduce loops outside (in the order of its
    ranges), a vectorisable loop over the columns inside (and the same float32 blocking as `reduce_loops`, over its
    first range, with an array of float64 block sums), one REDUCE after the other; then the epilogue per column."""
    plan = self.plan
    assert plan is not None

    def columns(body: Callable[[str], None]) -> None:
      """`body(slot)` for each column of the tile, the column range bound to its value."""
      with self.loop("0", width, None) as slot:
        with self.bound(plan.column, self.emit(f"add nsw i64 {tile_start}, {slot}", "idx")):
          body(slot)

    reduces = plan.reduces or (plan.reduce,)
    results = [self.stream_sums(node, columns) for node in reduces]

    def epilogue(slot: str) -> None:
      for node, (result, result_dtype) in zip(reduces, results):
        total = self.emit(f"load {compute_type(result_dtype)}, ptr {self.slot(result, result_dtype, slot)}")
        self.scopes[-1][node] = self.cast(total, result_dtype, node.dtype)
      self.emit_ready(self.ast)
    columns(epilogue)

  def stream_sums(self, node: UOp, columns: Callable[[Callable[[str], None]], None]) -> tuple[str, np.dtype]:
    """A stream tile's sums of REDUCE `node` for the tile's columns (`render_stream_tile`): the array that holds
    them and its dtype."""
    plan = self.plan
    assert plan is not None
    value, first, *inner = node.src
    inner_dtype = accumulator_dtype(node)
    steps = math.prod(rng.src[0].arg for rng in inner)  # (the inner ranges' steps per step of the first)
    blocked = node.arg is Ops.ADD and inner_dtype == F32 and first.src[0].arg * steps > plan.sum_block

    def accumulators(dtype: np.dtype) -> str:
      array = self.alloca(f"[{plan.columns} x {compute_type(dtype)}]", align=LINE_BYTES)
      identity = literal(IDENTITY[node.arg](dtype), dtype)
      columns(lambda slot: self.line(f"store {compute_type(dtype)} {identity}, ptr {self.slot(array, dtype, slot)}"))
      return array

    def fold(array: str, dtype: np.dtype, slot: str, parts: list[str], part_dtype: np.dtype) -> None:
      """Add `parts` (of `part_dtype`), in order, into element `slot` of the sums `array`: one load and one store."""
      address, llvm_type = self.slot(array, dtype, slot), compute_type(dtype)
      total = self.emit(f"load {llvm_type}, ptr {address}")
      for part in parts:
        total = self.combine(node.arg, dtype, total, self.cast(part, part_dtype, dtype), ordered=True)
      self.line(f"store {llvm_type} {total}, ptr {address}")

    def step(array: str, rng: UOp, others: tuple[str, ...] = ()) -> None:
      """Fold the value at the range's current step, then at each of `others` (its next steps), into every column's
      sum, in that order."""
      def element(slot: str) -> None:
        self.emit_ready(value)
        parts = [self.value(value)]
        for other in others:
          with self.rebound(value, {rng: other}): parts.append(self.value(value))
        fold(array, inner_dtype, slot, parts, value.dtype)
      columns(element)

    def reduce_range(array: str, start: str, end: str, ranges: tuple[UOp, ...]) -> None:
      rng, *rest = ranges
      if rest:
        with self.loop(start, end, rng, vectorize=False):
          self.emit_ready(value)  # what doesn't depend on the column, once per step
          reduce_range(array, "0", self.value(rest[0].src[0]), tuple(rest))
        return
      # (the innermost range STREAM_ROWS steps at a time, each column's sum folding them in order: as many rows
      # streamed at once, and a load and store of the sum per STREAM_ROWS of them; then the steps left one by one)
      if rng.src[0].op is Ops.CONST and rng.src[0].arg >= 2 * STREAM_ROWS:
        with self.loop(start, end, rng, step=STREAM_ROWS, vectorize=False) as first_step:
          self.emit_ready(value)
          step(array, rng, tuple(self.emit(f"add nsw i64 {first_step}, {i}", "idx") for i in range(1, STREAM_ROWS)))
        start = first_step
      with self.loop(start, end, rng, vectorize=False):
        self.emit_ready(value)
        step(array, rng)

    bound = self.value(first.src[0])
    if not blocked:
      result = accumulators(inner_dtype)
      reduce_range(result, "0", bound, (first, *inner))
      return result, inner_dtype
    result = accumulators(F64)
    block = max(1, plan.sum_block // steps)  # (steps of the first range per block)
    with self.loop("0", str(-(-first.src[0].arg // block)), None, vectorize=False) as index:
      block_start, block_end = self.block_bounds(index, block, bound)
      block_sums = accumulators(F32)
      reduce_range(block_sums, block_start, block_end, (first, *inner))
      columns(lambda slot: fold(result, F64, slot, [self.emit(f"load float, ptr {self.slot(block_sums, F32, slot)}")],
                                F32))
    return result, F64

  def slot(self, array: str, dtype: np.dtype, index: str) -> str:
    """The address of element `index` of an accumulator array of `dtype`."""
    return self.emit(f"getelementptr inbounds {compute_type(dtype)}, ptr {array}, i64 {index}", "addr")

  def capped(self, start: str, count: int, limit: str) -> str:
    """min(start + count, limit)."""
    return self.call("llvm.smin.i64", "i64", [("i64", self.emit(f"add nsw i64 {start}, {count}")), ("i64", limit)])

  def block_bounds(self, block: str, size: int, limit: str) -> tuple[str, str]:
    """[block * size, min((block + 1) * size, limit)): block number `block` of `size` steps of a range [0, limit)."""
    start = self.emit(f"mul nsw i64 {block}, {size}")
    return start, self.capped(start, size, limit)

  def offsets(self, start: str, count: int, step: int = 1) -> list[str]:
    """`start + i * step` for i in [0, count)."""
    return [start] + [self.emit(f"add nsw i64 {start}, {i * step}", "idx") for i in range(1, count)]

  def fused_product(self, node: UOp, left: str, right: str) -> str | None:
    """A register tile's product (`node`, the plan's REDUCE's value) that its accumulation computes with one rounding:
    a name that stands for it, its factors kept for `combine`'s `llvm.fma` (no instruction of its own), where
    `fused_products` and it is a multiply in the accumulator's dtype; else None (a `contract`ed multiply)."""
    plan = self.plan
    if not self.fused_products or plan is None or node is not plan.reduce.src[0] or node.op is not Ops.MUL or \
        node.dtype != accumulator_dtype(plan.reduce): return None
    name = self.fresh("product")
    self.products[name] = (left, right)
    return name

  def combine(self, op: Ops, dtype: np.dtype, acc: str, part: str, ordered: bool = False,
              contract: bool = False, lanes: int = 1) -> str:
    """Fold `part` into accumulator value `acc` (vectors of `lanes` values). Float ADD / MUL are `reassoc`
    (vectorisable) unless `ordered`; `contract` allows an FMA."""
    kind, llvm_type = dtype_kind(dtype), vector_type(dtype, lanes)
    if kind == "b": return self.emit(f"{_BOOL_BINARY[op]} {llvm_type} {acc}, {part}")
    if kind == "f":
      if op is Ops.MAX: return self.call(f"llvm.maximum.{_suffix(llvm_type)}", llvm_type,
                                         [(llvm_type, acc), (llvm_type, part)], flags="reassoc")
      if contract and op is Ops.ADD and part in self.products:  # (a tile's product: one rounding, `fused_product`)
        left, right = self.products[part]
        return self.call(f"llvm.fma.{_suffix(llvm_type)}", llvm_type, [(llvm_type, left), (llvm_type, right),
                                                                       (llvm_type, acc)])
      instruction = {Ops.ADD: "fadd", Ops.MUL: "fmul"}[op] if ordered else _FLOAT_ACCUMULATE[op]
      return self.emit(f"{instruction}{' contract' if contract else ''} {llvm_type} {acc}, {part}")
    if op is Ops.MAX: return self.call(f"{_INT_MAX_INTRINSIC[kind]}.{_suffix(llvm_type)}", llvm_type,
                                       [(llvm_type, acc), (llvm_type, part)])
    return self.emit(f"{_INT_BINARY[op]} {llvm_type} {acc}, {part}")

  # ---- conversions

  def round(self, value: str, dtype: np.dtype, lanes: int = 1) -> str:
    """Round a float32 value (a vector of `lanes`) to `dtype` (float16 / bfloat16, nearest even, NaN stays NaN); the
    identity otherwise."""
    floats, ints, flags = ((f"<{lanes} x {t}>" if lanes > 1 else t) for t in ("float", "i32", "i1"))
    if dtype == F16:
      if lanes == 1: return self.half_to_float(self.emit(f"fptrunc float {value} to half"))
      halves = self.emit(f"fptrunc {floats} {value} to <{lanes} x half>")
      return self.emit(f"fpext <{lanes} x half> {halves} to {floats}")
    if dtype != BF16: return value

    def word(number: int) -> str: return self.splat(str(number), np.dtype(np.int32), lanes)
    bits = self.emit(f"bitcast {floats} {value} to {ints}")
    lowest_kept_bit = self.emit(f"and {ints} {self.emit(f'lshr {ints} {bits}, {word(16)}')}, {word(1)}")
    rounded = self.emit(f"add {ints} {bits}, {self.emit(f'add {ints} {lowest_kept_bit}, {word(32767)}')}")
    is_nan = self.emit(f"fcmp uno {floats} {value}, {'zeroinitializer' if lanes > 1 else '0.0'}")
    quiet_nan = self.emit(f"or {ints} {bits}, {word(4194304)}")  # sets the quiet bit, so truncating keeps it a NaN
    chosen = self.emit(f"select {flags} {is_nan}, {ints} {quiet_nan}, {ints} {rounded}")
    return self.emit(f"bitcast {ints} {self.emit(f'and {ints} {chosen}, {word(-65536)}')} to {floats}")

  def half_to_float(self, value: str) -> str:
    """A float16 value as a float32 (exact). On the GPU through PTX's `cvt.f32.f16` itself: with float32 subnormals
    flushed (`render_gpu`), NVPTX emits `cvt.ftz.f32.f16` and float16 arithmetic with `.ftz`, which flush float16's
    subnormals too (normal numbers in float32, kept on the CPU and by XLA)."""
    if not self.gpu: return self.emit(f"fpext half {value} to float")
    return self.emit(f'call float asm "cvt.f32.f16 $0, $1;", "=f,h"(i16 {self.emit(f"bitcast half {value} to i16")})')

  def double_to_float_round_to_odd(self, value: str) -> str:
    """float64 -> float32 rounding to odd: rounding that to float16 / bfloat16 is then correctly rounded (a plain
    float64 -> float32 -> 16-bit path rounds twice)."""
    nearest = self.emit(f"fptrunc double {value} to float")
    back = self.emit(f"fpext float {nearest} to double")
    inexact = self.emit(f"fcmp one double {back}, {value}")  # false for NaN
    bits = self.emit(f"bitcast float {nearest} to i32")
    is_even = self.emit(f"icmp eq i32 {self.emit(f'and i32 {bits}, 1')}, 0")
    abs_back = self.call("llvm.fabs.f64", "double", [("double", back)])
    abs_value = self.call("llvm.fabs.f64", "double", [("double", value)])
    rounded_away = self.emit(f"fcmp ogt double {abs_back}, {abs_value}")
    # the odd neighbour is one step toward the value (bits of same-signed floats are monotone in the magnitude)
    odd_bits = self.emit(f"add i32 {bits}, {self.emit(f'select i1 {rounded_away}, i32 -1, i32 1')}")
    use_odd = self.emit(f"and i1 {inexact}, {is_even}")
    return self.emit(f"bitcast i32 {self.emit(f'select i1 {use_odd}, i32 {odd_bits}, i32 {bits}')} to float")

  def cast(self, value: str, src: np.dtype, dst: np.dtype, lanes: int = 1) -> str:
    """Value conversion with numpy / JAX semantics. float -> int truncates toward zero and saturates (NaN -> 0), as
    XLA on CPU; float -> bool is x != 0 (NaN -> True); every conversion to a float rounds once. Vectors of `lanes`
    values: the conversions of a vector tile body (`vector_cast_ok`)."""
    if src == dst: return value
    if lanes > 1: return self.vector_cast(value, src, dst, lanes)
    src_kind, dst_kind = dtype_kind(src), dtype_kind(dst)
    src_type, dst_type = compute_type(src), compute_type(dst)
    if dst_kind == "b":
      return self.emit(f"fcmp une {src_type} {value}, 0.0" if src_kind == "f" else f"icmp ne {src_type} {value}, 0")
    if src_kind == "b": return self.emit(f"{'uitofp' if dst_kind == 'f' else 'zext'} i1 {value} to {dst_type}")
    if src_kind in "iu" and dst_kind in "iu":
      src_bits, dst_bits = src.itemsize * 8, dst.itemsize * 8
      if src_bits == dst_bits: return value
      if dst_bits < src_bits: return self.emit(f"trunc {src_type} {value} to {dst_type}")
      return self.emit(f"{'sext' if src_kind == 'i' else 'zext'} {src_type} {value} to {dst_type}")
    if dst_kind in "iu":
      saturating = "llvm.fptosi.sat" if dst_kind == "i" else "llvm.fptoui.sat"
      return self.call(f"{saturating}.{dst_type}.{_suffix(src_type)}", dst_type, [(src_type, value)])
    if src_kind in "iu":
      convert = "sitofp" if src_kind == "i" else "uitofp"
      if dst in (F32, F64): return self.emit(f"{convert} {src_type} {value} to {dst_type}")
      # float16: ints below 2**24 are exact in float32 and larger ones overflow float16 anyway, so one rounding.
      # bfloat16: through float64 (exact for ints up to 2**53), then rounded once.
      if dst == F16: return self.round(self.emit(f"{convert} {src_type} {value} to float"), F16)
      return self.cast(self.emit(f"{convert} {src_type} {value} to double"), F64, dst)
    # float -> float; float16 / bfloat16 / float32 values are all exact in `float`
    if dst == F64: return self.emit(f"fpext float {value} to double")
    if src == F64:
      if dst == F32: return self.emit(f"fptrunc double {value} to float")
      value = self.double_to_float_round_to_odd(value)
    return self.round(value, dst)

  def bitcast(self, value: str, src: np.dtype, dst: np.dtype) -> str:
    """Reinterpret the bits (through the memory representation; itemsizes must match)."""
    if src.itemsize != dst.itemsize: raise ValueError(f"codegen: BITCAST {src} -> {dst} changes the itemsize")
    raw, src_memory, dst_memory = self.to_memory(value, src), memory_type(src), memory_type(dst)
    if src_memory != dst_memory: raw = self.emit(f"bitcast {src_memory} {raw} to {dst_memory}")
    return self.from_memory(raw, dst)

  def from_memory(self, raw: str, dtype: np.dtype, lanes: int = 1) -> str:
    """A loaded element (memory type) -> its compute type (vectors of `lanes` elements)."""
    typed = (lambda scalar: scalar if lanes == 1 else f"<{lanes} x {scalar}>")
    if dtype == BOOL: return self.emit(f"icmp ne {typed('i8')} {raw}, {self.splat('0', np.dtype(np.int8), lanes)}")
    if dtype == F16 and lanes == 1: return self.half_to_float(raw)
    if dtype == F16: return self.emit(f"fpext {typed('half')} {raw} to {typed('float')}")
    if dtype == BF16:
      widened = self.emit(f"zext {typed('i16')} {raw} to {typed('i32')}")
      shifted = self.emit(f"shl {typed('i32')} {widened}, {self.splat('16', np.dtype(np.int32), lanes)}")
      return self.emit(f"bitcast {typed('i32')} {shifted} to {typed('float')}")
    return raw

  def to_memory(self, value: str, dtype: np.dtype, lanes: int = 1) -> str:
    """A value in its compute type -> the memory type (float16 / bfloat16 values are already rounded: exact), vectors
    of `lanes` values."""
    typed = (lambda scalar: scalar if lanes == 1 else f"<{lanes} x {scalar}>")
    if dtype == BOOL: return self.emit(f"zext {typed('i1')} {value} to {typed('i8')}")
    if dtype == F16: return self.emit(f"fptrunc {typed('float')} {value} to {typed('half')}")
    if dtype == BF16:
      bits = self.emit(f"bitcast {typed('float')} {value} to {typed('i32')}")
      shifted = self.emit(f"lshr {typed('i32')} {bits}, {self.splat('16', np.dtype(np.int32), lanes)}")
      return self.emit(f"trunc {typed('i32')} {shifted} to {typed('i16')}")
    return value


# ---------------------------------------------------------------------------------------------------------------------
# the module

# Intrinsics the NVPTX backend cannot lower without libm: the GPU renderer emits arithmetic for all of them (see
# _FLOAT64_ARITHMETIC and render_binary's POW), this guards against one slipping through (named in the error).
_GPU_UNSUPPORTED = ("@llvm.pow.", "@llvm.exp2.", "@llvm.log2.", "@llvm.sin.", "@llvm.cos.")
NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
NVPTX_DATA_LAYOUT = "e-p6:32:32-i64:64-i128:128-v16:16-v32:32-n16:32:64"
_NVPTX_IDS = ("tid.x", "ctaid.x", "ntid.x")


def render_gpu(name: str, ast: UOp, ordered: int = 0, launch: GpuLaunch | None = None) -> str:
  """Render kernel `ast` as an LLVM IR module for the NVPTX target (PTX through llvmlite), defining the kernel

      define void @<name>(ptr noalias %buf0, ...)

  run as `launch` (default `gpu_launch(ast, ordered)`, codegen/gpu.py). One work-item per output: a 1-D grid of any
  block size, work-item `gid = ctaid.x * ntid.x + tid.x` computes the output elements of global index `gid` (see
  `_Renderer.bind_thread_index`; the first `ordered` global ranges are loops in each work-item), the work-items past
  the last do nothing, reductions run as loops inside the work-item. A group reduction: blocks of exactly
  `launch.group` threads, block `gid = ctaid.x` computes output `gid`, thread `lane = tid.x` a share of each
  reduction (`_Renderer.group_reduce`), thread 0 stores. The same IR as the CPU's otherwise, except that there is no
  libm: EXP2, LOG2, SIN and COS of every float dtype and POW are the arithmetic of transcendental.py (the CPU calls
  libm for POW)."""
  if ast.op is not Ops.SINK: raise ValueError(f"codegen: a kernel AST is rooted at a SINK, got {ast.op.name}")
  launch = gpu_launch(ast, ordered) if launch is None else launch
  grouped = launch.group > 1
  buffers = sorted((n for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL), key=lambda buffer: buffer.arg)
  renderer = _Renderer(ast, None, decompose=True, gpu=True, ordered=ordered, launch=launch)
  renderer.render_kernel()
  body = "\n".join(renderer.lines)
  if (missing := [op for op in _GPU_UNSUPPORTED if op in body]):
    raise NotImplementedError(f"codegen: kernel {name} needs {', '.join(sorted(missing))}, which the GPU backend does "
                              "not provide (no libm on the GPU); run it on the CPU device")
  symbol, body_symbol = _symbol(name), _symbol(f"{name}.body")
  params = ", ".join(f"ptr noalias %buf{buffer.arg}" for buffer in buffers)
  lines = [f'target triple = "{NVPTX_TRIPLE}"', f'target datalayout = "{NVPTX_DATA_LAYOUT}"']
  lines += sorted(renderer.declarations | {f"declare i32 @llvm.nvvm.read.ptx.sreg.{sreg}()" for sreg in _NVPTX_IDS})
  # float32 subnormals flush to zero, as on the CPU (devices/runtime.py) and in XLA's GPU code: `.ftz` instructions;
  # a function that waits at barriers is `convergent` (no transformation may make the barrier depend on more values)
  attributes = f'nounwind{" convergent" if grouped else ""} "denormal-fp-math-f32"="preserve-sign,preserve-sign"'
  indices = "i64 %gid, i64 %lane" if grouped else "i64 %gid"
  lines += [f"define internal void {body_symbol}({params}{', ' if params else ''}{indices}) alwaysinline "
            f"{attributes} {{", "entry:", *renderer.allocas, *renderer.lines, "}", ""]
  lines += renderer.metadata
  lines += [f"define void {symbol}({params}) {attributes} {{", "entry:"]
  for sreg in _NVPTX_IDS:
    short = sreg.split(".")[0]
    lines += [f"  %{short}.32 = call i32 @llvm.nvvm.read.ptx.sreg.{sreg}()",
              f"  %{short} = zext i32 %{short}.32 to i64"]
  call = f"  call void {body_symbol}({''.join(f'ptr %buf{buffer.arg}, ' for buffer in buffers)}"
  if grouped:  # every block is a whole output: all threads run (and reach the barriers)
    lines += [f"{call}i64 %ctaid, i64 %tid)", "  ret void", "}", ""]
  else:
    lines += ["  %first = mul nuw nsw i64 %ctaid, %ntid", "  %gid = add nuw nsw i64 %first, %tid",
              f"  %live = icmp ult i64 %gid, {launch.outputs}", "  br i1 %live, label %run, label %done", "run:",
              f"{call}i64 %gid)", "  br label %done", "done:", "  ret void", "}", ""]
  annotation = f"!{len(renderer.metadata)}"
  lines += [f"!nvvm.annotations = !{{{annotation}}}", f'{annotation} = !{{ptr {symbol}, !"kernel", i32 1}}', ""]
  return "\n".join(lines)


def _costly_scalar_loop(ast: UOp) -> bool:
  """Whether a kernel runs a float operation of _COSTLY_SCALAR, or a float max reduction, in a loop (per element or
  per reduce step; a mean's one division after its sum doesn't count)."""
  open_ranges: dict[UOp, frozenset[UOp]] = {}  # the loops a node runs in (a REDUCE's result: after its own)
  for node in ast.toposort:
    ranges = frozenset({node}) if node.op is Ops.RANGE else frozenset().union(*(open_ranges[s] for s in node.src))
    open_ranges[node] = ranges - set(node.src[1:]) if node.op is Ops.REDUCE else ranges
    if dtype_kind(node.dtype) != "f": continue
    if node.op is Ops.REDUCE and node.arg is Ops.MAX or node.op in _COSTLY_SCALAR and open_ranges[node]: return True
  return False


def loop_steps(ast: UOp) -> float:
  """The iterations of a kernel's loop nest: the product of its ranges' lengths (inf where one isn't constant)."""
  ranges = [node for node in ast.toposort if node.op is Ops.RANGE]
  if any(rng.src[0].op is not Ops.CONST for rng in ranges): return math.inf
  return math.prod(rng.src[0].arg for rng in ranges)


def render_llvm(name: str, ast: UOp, target_triple: str | None = None, data_layout: str | None = None,
                optimize: bool | None = None, library: bool = False) -> str | None:
  """Render kernel `ast` (a SINK of STOREs, see the module docstring) as a complete LLVM IR module defining
  `void @<name>(ptr noalias %args, i64 %start, i64 %end)`. Triple and data layout are written only when given.
  `optimize` applies the loop optimisations of opt.py (default: unless NOOPT=1); they are listed in a comment at the
  top of the module and printed with DEBUG>=3. It also turns float32 / 16-bit EXP2, LOG2 and SIN into the vectorisable
  arithmetic of transcendental.py (without it they are libm intrinsics). With `library`, the kernel as a call of the
  GEMM library (codegen/gemm.py: cheap to compile, the first tier of a contraction, devices/cpu.py `CompileStream`),
  or None where it has none."""
  if ast.op is not Ops.SINK: raise ValueError(f"codegen: a kernel AST is rooted at a SINK, got {ast.op.name}")
  buffers = sorted((n for n in ast.toposort if n.op is Ops.DEFINE_GLOBAL), key=lambda buffer: buffer.arg)
  if [buffer.arg for buffer in buffers] != list(range(len(buffers))):
    raise ValueError(f"codegen: DEFINE_GLOBAL indices must be 0..n-1, got {[buffer.arg for buffer in buffers]}")
  enabled = not NOOPT if optimize is None else optimize
  plan = choose_opts(ast, enabled=enabled)
  library_call = (gemm.library_call(ast, plan) or gemm.library_copy(ast, plan)) if library and enabled else None
  if library and library_call is None: return None
  transpose = 0 if plan is not None else transpose_block(ast, enabled)
  renderer = _Renderer(ast, plan, decompose=enabled, transpose=transpose, stream=enabled, library=library_call)
  renderer.render_kernel()
  opts = [("library", gemm.COPY_SYMBOL if isinstance(library_call, gemm.LibraryCopy) else gemm.SYMBOL)] \
      if library_call else \
      [opt for opt in applied_opts(ast, enabled) if opt != ("nontemporal",)] + \
      ([("registers", renderer.transpose_lanes)] if renderer.across else []) + \
      ([("gate_split", *renderer.gate_parts)] if renderer.gate_parts else []) + \
      ([("store_transposed", renderer.transpose_square)] if renderer.stored_transposed else []) + \
      ([("prefetch", *sorted(renderer.prefetched))] if renderer.prefetched else []) + \
      ([("nontemporal",)] if renderer.nontemporal else [])  # (as emitted: a tile's or a register transpose's)
  if DEBUG >= 3: print(f"*** opts of {name}{' (first tier)' if library_call else ''}: {opts}")
  # kernels that compute more than they move ask for the tiles' vectors (opt.py `tile_geometry`), which LLVM would
  # otherwise not use on CPUs where it prefers 256-bit vectors (Intel's AVX-512 parts): a tile sized for them became
  # 32 half-width accumulators, a third of them spilled to the stack, and transcendental and reducing kernels ran at
  # half width (4M exp 1.92 -> 1.46 ms, log 0.98 -> 0.71, softmax over 8192x1024 8.6 -> 6.5). A stream of a few
  # operations per element stays at LLVM's choice: 512-bit, the 16M-element ((x*2+1)*x-3)*0.5 ran at 4.2 ms instead
  # of 3.35, and Adam's update (seven streams, a square root and a division) of 784x512 at 0.35 ms instead of 0.25.
  wide = plan is not None or any(node.op in _COMPUTE_HEAVY and any(n.op is Ops.RANGE for n in node.toposort)
                                 for node in ast.toposort)  # (a scalar computed once, before the loops, doesn't count)
  attributes = f' "prefer-vector-width"="{tile_geometry().vector_bytes * 8}"' if wide else ""
  if plan is None and not transpose and loop_steps(ast) <= SMALL_KERNEL_STEPS and not _costly_scalar_loop(ast):
    attributes += " noimplicitfloat"

  symbol, body_symbol = _symbol(name), _symbol(f"{name}.body")
  params = ", ".join(f"ptr noalias %buf{buffer.arg}" for buffer in buffers)
  lines = []
  if target_triple: lines.append(f'target triple = "{target_triple}"')
  if data_layout: lines.append(f'target datalayout = "{data_layout}"')
  lines += sorted(renderer.declarations)
  lines.append(f"; opts: {opts}")
  lines += [f"define internal void {body_symbol}({params}{', ' if params else ''}i64 %start, i64 %end) "
            f"alwaysinline nounwind{attributes} {{", "entry:", *renderer.allocas, *renderer.lines, "}", ""]
  lines += renderer.metadata
  lines += [f"define void {symbol}(ptr noalias %args, i64 %start, i64 %end) nounwind{attributes} {{", "entry:"]
  for buffer in buffers:
    lines.append(f"  %slot{buffer.arg} = getelementptr inbounds ptr, ptr %args, i64 {buffer.arg}")
    lines.append(f"  %buf{buffer.arg} = load ptr, ptr %slot{buffer.arg}")
  call_args = "".join(f"ptr %buf{buffer.arg}, " for buffer in buffers)
  lines += [f"  call void {body_symbol}({call_args}i64 %start, i64 %end)", "  ret void", "}", ""]
  return "\n".join(lines)
