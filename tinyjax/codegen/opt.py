"""Kernel optimisation choices: which loop transformations a kernel gets, decided from its AST and kept as data.

The renderer's plain loop nest (global ranges outside in id order, each REDUCE's loop innermost with a scalar
accumulator) is right for elementwise kernels and row reductions: the innermost loop walks memory with stride 1 and
LLVM vectorises it. It is slow when the reduce range has a large stride in the loads, as in `x.sum(axis=0)` or a
contraction `out[m, n] = sum_k a[m, k] * b[k, n]`. For those, `choose_opts` returns a `TilePlan`:

  reduce_outside  the reduce loop moves outside a tile of output elements: one accumulator per element of the tile,
                  each updated once per reduce iteration; the epilogue (whatever the kernel computes from the REDUCE)
                  and the STORE run per element after the reduce loop.
  upcast col N    the tile spans N consecutive elements of the innermost global range ("column"), which has stride 1
                  in the STORE and stride 0 or 1 in every load under the REDUCE: the N accumulators are N / lanes
                  vector registers and the loads are contiguous vectors. The renderer emits them as vector IR where
                  the value and epilogue allow (llvm.py `vector_body_ok`), else as unrolled scalar code that LLVM's
                  SLP vectoriser packs (float16 / bfloat16 arithmetic).
  tile col N      without a row to tile (a sum over an outer axis, as sum(axis=0): a pure stream, nothing to reuse),
                  the accumulators are an array of N elements of the column in memory (L1), updated by a loop over
                  the column that LLVM's loop vectoriser vectorises; each reduce step then reads N contiguous elements
                  (a wide tile: fewer pages and streams per step than a register tile would touch).
  upcast row M    the tile also spans M consecutive values of another global range ("row"), used when some load under
                  the REDUCE does not depend on it (as b in a @ b): each such load is reused M times from a register.
                  With both, the tile is the M x N register block of a GEMM microkernel: per reduce step, M broadcasts,
                  N / lanes vector loads and M * N / lanes FMAs. The row is the innermost such range with at least M
                  values; when it is not the range just outside the column, the loops of the ranges between them run
                  inside the row's tile loop.

Every choice is a plain tuple in `TilePlan.opts` (printed with DEBUG>=3, compared in tests) and NOOPT=1 turns them
all off. A kernel that doesn't meet a precondition keeps the plain nest.

A tile also constrains how a launch may be cut into chunks (`launch_grain`): when the row or the column is the
kernel's outermost loop, a chunk [start, end) that is no multiple of the tile ends in slow partial tiles, and a stream
tile cut into narrow column chunks reads each row in pieces far apart in memory (4096x4096 sum(axis=0) in 2048-column
chunks measured 2x slower than in whole rows: the prefetchers fetch past each piece). The runtime then claims chunks
of whole grains only.
"""
from __future__ import annotations

import contextlib
import functools
import math
import threading
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from tinyjax.helpers import NOOPT
from tinyjax.lower import symbolic
from tinyjax.uop import INDEX_DTYPE, UNARY, Ops, UOp

F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)

# The register budget of a tile is the host's vector registers (devices/cpu.py `vector_registers`); `tile_geometry`
# sizes the tiles from them. With 32 registers (AVX-512: 64 bytes each) a tile of tile_rows x tile_vectors
# accumulators (6 x 4 = 24 registers) leaves room for the tile_vectors loaded vectors of the reused operand and a
# broadcast value: no spills, and 24 independent FMA chains per reduce step hide FMA latency. The FMA loop alone,
# operands in L1 (one thread, AVX-512): 4 x 4 182 GFLOP/s, 5 x 4 195, 6 x 4 205-225, 8 x 3 211, 14 x 2 223 of a 244
# peak; 4 x 4 does 16 FMAs per 8 loads, 6 x 4 24 per 10. In the GEMM kernels 6 x 4 paid once its blocks' float64 flush
# was halved (CONTRACTION_SUM_BLOCK): 512^3 285-308 -> 318-350 GFLOP/s on 2 cores. With 16 registers (AVX2: 32 bytes
# each) the tile is 6 x 2 (12 accumulators, 2 loaded vectors, a broadcast: 15 registers): the 6 x 4 tile of 64-byte
# vectors there is 48 ymm accumulators, mostly spilled (AMD Zen 3, 2 cores, 191 GFLOP/s peak: 512^3 / 1024^3 / 2048^3
# at 55 / 55 / 58 GFLOP/s, 6 x 2 of 32 bytes 125-175 / 120-160 / 115-150 over runs on a noisy machine; one thread
# 83 GFLOP/s at best, 87% of a core's peak). A dot tile's sums and its row and column loads fit the registers too: 4 x 4
# (+ 4 + 4) with 32, 3 x 3 (+ 3 + 3) with 16 (sized so, not measured against other shapes).
# A launch chunk's rows past its last whole tile (512 rows: 2) go in one tile whose rows past the end repeat the last
# row (llvm.py `row_tiles`). A tile whose row slides along a window (a convolution's 3 x 3 taps, unrolled whole) has
# window_tile_rows rows: LLVM keeps the broadcast values that neighbouring taps share live across the unrolled copies
# (6 rows + 2 taps: 8), and 6 x 4 then spilled 7 accumulators (the CNN's 3x3 convolution 3.4 -> 3.8 ms).
# Kernels with a tile ask LLVM for vectors of vector_bytes (llvm.py): where it prefers 256-bit vectors (Intel AVX-512
# parts) the tile became 32 ymm accumulators, 11 of them spilled: 128x512x512 matmul 139 -> 231 GFLOP/s with zmm.
# Launching a small-batch GEMM along its columns (each thread reads half the weights) measured slower than along its
# rows. A column narrower than tile_vectors vectors gets taller tiles instead, at most max_tile_rows (`_tile_rows`).


@dataclass(frozen=True)
class TileGeometry:
  """The register tiles' shapes for the host's vector registers."""
  vector_bytes: int      # one vector register
  tile_rows: int         # a register tile's rows
  tile_vectors: int      # its columns, in vectors
  rowless_vectors: int   # the columns of a tile without a row (nothing reused across rows: one vector per column)
  window_tile_rows: int  # the rows of a tile sliding along a window
  max_tile_rows: int     # the rows of a tile whose column is narrower than tile_vectors vectors, at most
  dot_rows: int          # a dot tile's rows and columns (`_dot_plan`)
  dot_columns: int
  transpose_lanes: int   # float32 lanes of a vector: the side of the register transposes' squares (llvm.py)
  l1_bytes: int = 32 << 10  # a core's L1 data cache (devices/cpu.py `data_cache_bytes`: `_window_chunk`)
  llc_bytes: int = 32 << 20  # the last-level cache (lower/schedule.py `_split_columns`' column blocks)
  fma: bool = True  # the host multiplies and adds in one rounding (FMA3, NEON): a tile's products are `llvm.fma`s


@functools.cache
def tile_geometry() -> TileGeometry:
  """The tile shapes for the host's vector registers (devices/cpu.py `vector_registers`)."""
  from tinyjax.devices.cpu import data_cache_bytes, host_fma, vector_registers
  return geometry_for(*vector_registers(), data_cache_bytes(1), data_cache_bytes(3), host_fma())


def geometry_for(width: int, registers: int, l1_bytes: int = 32 << 10, llc_bytes: int = 32 << 20,
                 fma: bool = True) -> TileGeometry:
  """The tile shapes for `registers` vector registers of `width` bytes. A tile without a row keeps one accumulator
  per vector of columns: 64 float32 columns (256 bytes) where half the registers hold them (4 with AVX-512, 8 with
  AVX2: a 64-wide RNN step's h @ w as 4 tiles of 16 columns took a 1000-step scan from 0.33 to 0.58 ms on Zen 3)."""
  tile_vectors, dot = (4, 4) if registers >= 32 else (2, 3)
  rowless = max(tile_vectors, min(registers // 2, 256 // width))
  return TileGeometry(width, 6, tile_vectors, rowless, 4, 8, dot, dot, width // 4, l1_bytes, llc_bytes, fma)


# Without a row to tile, the accumulator array spans STREAM_TILE elements of the column: each reduce step reads that
# many contiguous elements, so a 4096-wide row is read start to end, one sequential stream (1024 measured 1.8x slower
# on sum(axis=0) of 4096x4096 float32). The float32 block sums (16 KB) stay in L1; the float64 array beside them is
# touched once per SUM_BLOCK steps.
STREAM_TILE = 4096
# A contraction over a few rows (at most SWEEP_ROWS) whose reused operand is read in place along its columns, its rows
# at least SWEEP_STEP_BYTES apart, and spans at least SWEEP_MIN_BYTES (a few activations through a large weight matrix:
# a small-batch decode's `x @ w`, 8 x 4096 by 4096 x 4096) sweeps its column: SWEEP_STEPS reduce steps at a time, every
# row tile runs them over each column tile of a chunk of SWEEP_COLUMNS columns, its sums kept in an array between
# sweeps (llvm.py `render_sweep`; schedule.py `_split_columns` launches it over blocks of that many columns). Tile after
# tile instead (each column tile all its steps, then the next), a step read one line of each of the operand's rows,
# 16 KB apart, which the prefetchers don't follow: one Zen 3 core read such a matrix at 7 GB/s in those lines, 22 GB/s
# 16 rows at a time across the columns (a C model of the loops). A/B on 2 cores (best of 7, GFLOP/s, three runs):
# 2x4096x4096 8-11 -> 20-32, 4x4096x4096 17-21 -> 37-45, 6x4096x4096 25-30 -> 39-57, 8x4096x4096 34-38 -> 50-76,
# 8x2048x4096 21-23 -> 51-102, 4x1024x8192 17-20 -> 54-67, 8x4096x11008 39-45 -> 42-48 (numpy 11-12, 20-24, 21-24,
# 39-60, 51-65, 21-25, 48-53; JAX 14, 16, 26, 27, 28, 17, 30). A classifier's weight gradient over a big batch (h.T
# @ g into 10 classes, computed transposed: 10 rows, lower/schedule.py `transposed_output`) sweeps h: 16384x1024x10
# 25 -> 87-92 GFLOP/s, 65536x512x10 28 -> 50-67 (numpy 52-56, JAX 9-13). More rows measured slower swept (in-process
# A/B, best GFLOP/s, x @ w over 4096 x 4096: 10 rows 55 -> 58, 12 rows 56 -> 53, 16 rows 57-61 -> 51-54, 32 rows 65-83
# -> 44-46: each line of the operand feeds more FMAs, and a sweep's loads and stores of the sums cost more than the
# stream saves), as did 16 and 32 steps a sweep (8 rows: 66-71 at 8 steps, 45-51 at 16, 42-43 at 32; 4 steps 46-69).
SWEEP_ROWS = 10
SWEEP_STEPS = 8
SWEEP_COLUMNS = 1024
SWEEP_MIN_BYTES = 1 << 21
SWEEP_STEP_BYTES = 1024
# A row-less contraction whose operand (reduce steps x columns) is at most RESIDENT_BYTES stays in L2 while register
# tiles of its columns reread it one after the other: it keeps its sums in registers instead of streaming (a 256-wide
# RNN step's h @ W: 200 steps 0.67 -> 0.56 ms); a bigger one streams through the array (sum(axis=0) of 8192x1024).
RESIDENT_BYTES = 1 << 18

# An innermost reduce loop shorter than this is not worth vectorising on its own (a 3x3 convolution's window row):
# such kernels get the tile plan even when every load is contiguous along it.
SHORT_REDUCE = 16

# The register tiles accumulate each output element in one running float32 sum (no vector lanes to spread it over), so
# their float32 sums flush into float64 every TILE_SUM_BLOCK steps instead. Measured on sums of 0.1 (4096 rows, 1M
# rows, a k=64K contraction; relative error vs float64): blocks of 2048 1.6e-5, 256 2.4e-6, 128 9.7e-7, 64 6.0e-7,
# 32 3.0e-7. The flush (one float64 add per accumulator per block) cost nothing measurable at 64 on the 4096x4096
# column sum or the 1024^3 matmul (both within this machine's noise); 32 made the column sum ~1.5x slower.
TILE_SUM_BLOCK = 128
# A contraction's register tile (a GEMM's, a convolution's) flushes every CONTRACTION_SUM_BLOCK steps instead: its
# flush (24 vectors stored, widened, added, 48 stored) and the restart of its FMA chains cost 10-14% of a 6 x 4 tile's
# 128-step block (one thread, 480x512x512: 164 GFLOP/s, 256 steps 182, one block 190). Max error of a float32 GEMM of
# normal values against float64, 512^3 / 1024^3 / 2048^3: 128 steps 3.4e-5 / 4.6e-5 / 5.5e-5, 256 steps 5.0e-5 /
# 6.7e-5 / 1.0e-4; JAX 9.4e-5 / 1.1e-4 / 1.7e-4, numpy (OpenBLAS) 5.0e-5 / 9.8e-5 / 1.3e-4. A k=64K contraction of
# 0.1s: 2.4e-6 relative (JAX 5.1e-6).
CONTRACTION_SUM_BLOCK = 256
# A register tile's float32 GEMM runs in groups of GROUP_ROWS rows (whole tiles: 30) (`render_row_groups`): the reused
# operand's block (sum_block x 64 x 4 = 32 or 64 KB) stays in L1 or L2 while the group's tiles read it, beside the
# group's float64 sums (30 rows x 64 columns x 8 bytes = 15 KB, touched once per tile and block) and its rows of the
# other operand; groups of 12 rows, or no groups up to K = 2048, measured within noise of it (4 x 4 tiles: 16 and 64
# rows no better).
GROUP_ROWS = 32
# Row groups pay for a sum of more than GROUP_MIN_BLOCKS blocks (K > 2048 at CONTRACTION_SUM_BLOCK), or where they
# span ranges (`_spans`, more than two blocks). Below, since few block sums add up in float32 (llvm.py
# FLOAT32_BLOCKS), the plain tiles ran faster (three runs each, 2 cores, % of the FMA peak: 512x784x512 87-90 ->
# 94-95, 1024^3 90-91 -> 94-95, 512x1536x512 89-90 -> 90-91, 2048^3 85-87 -> 86-89); above, they lost (512x4096x512
# 87-88 -> 82-83, 1024x4096x1024 87 -> 81-83).
GROUP_MIN_BLOCKS = 8
# A direct convolution's tiles run in row groups of WINDOW_GROUP_ROWS, its channels in blocks (WINDOW_BLOCKS, or more
# where those are too big) whose taps (channels x window x the tile's columns, at most WINDOW_BLOCK_BYTES) stay in L1
# for the group (`_window_chunk`). Channels-first data (its channels a plane apart) takes blocks that leave
# WINDOW_L1_SPARE of the host's L1 free instead where that is less: on Zen 3 (32 KB L1, AVX2's 16-column tiles: 36 KB
# of taps, which 40 KB let through unblocked) the NCHW 3x3 convolution of 32x64x56x56 into 64 ran 74-86 -> 58-64 ms
# forward, 144-165 -> 132-140 backward. Channels-last data keeps WINDOW_BLOCK_BYTES there: its blocks cut each
# position's contiguous channels, and the NHWC one ran 52-55 -> 69-79 ms in blocks of 24 KB.
WINDOW_GROUP_ROWS = 64
WINDOW_BLOCKS = 4
WINDOW_BLOCK_BYTES = 40 << 10
WINDOW_L1_SPARE = 8 << 10
# A row group's float64 sums for the values of the ranges it spans (`_spans`) stay in L2: at most SPAN_SUMS_BYTES.
SPAN_SUMS_BYTES = 1 << 19
# The reused operand of a register-tiled contraction (b in a @ b) is packed per column tile: its values for every
# reduce step and the tile's columns are copied once into a contiguous array (on the stack, at most PACK_BYTES), which
# every row tile then reads. Read in place, a 64-column slice of a row-major b walks memory with the row's stride
# (2 KB for 512 float32 columns), so the rows of a K block land in a few L1 sets and evict each other: packed, the
# same GEMMs ran 1.35-1.8x faster (128x784x512 173 -> 239 GFLOP/s, 512^3 137-185 -> 249-279; 2 cores, AVX-512).
# Packing pays when at least PACK_MIN_ROWS rows share a pack: a launch chunk keeps that many rows together.
# The pack lives on the stack: 1.25 MB (K up to 5120 float32 steps of 64 columns) leaves a thread's stack (8 MB, or
# glibc's 2 MB at least) room; 256 KB left 2048^3 and K=1040 unpacked, at half the speed (156 -> 223 GFLOP/s, 158 ->
# 270), and 1 MB left ResNet's 3x3x512 im2col GEMM (K=4608) unpacked (13.1 -> 6.8 ms).
# A load under a REDUCE whose index spans fewer than TABLE_VALUES values reads a table (L1-resident), not an operand
# a register tile would share across its rows (`choose_opts`).
TABLE_VALUES = 64
PACK_BYTES = 1280 * 1024
PACK_MIN_ROWS = 16
# A pack serves the row tiles of one column tile. Where the operand differs for each value of a range outside the row
# (an NCHW 1x1 convolution's image: out[n, o, p] = sum_c w[o, c] x[n, c, p]), it serves those of that one value only,
# and the tiles read it in place instead when a tile's reduce steps of it (their lines) take at most IN_PLACE_BYTES
# and no L1 set more than IN_PLACE_WAYS of their lines (`_in_place`; a model of a 64-set L1): the kernel is launched
# over that range, each image's input and output then stream through once, where a pack per column tile inside a
# launch over the tiles read a few lines of each of 64 channels' rows per image, far apart. 32x64x56x56 -> 64 (1x1,
# with NONTEMPORAL stores): 2.3-2.5 -> 1.8-2.0 ms (66 -> 78-86% of the FMA peak); packed per tile, launched over the
# images: 1.96-2.15 ms.
IN_PLACE_BYTES = 32 << 10
IN_PLACE_WAYS = 6
# ... and each step's columns are whole runs of STEP_RUN_BYTES: an AVX2 tile's 16 columns are one line a step, all
# 64 steps' lines in a quarter of L1's sets (the rows 12.5 KB apart), beside the row operand's and the output's lines.
# Packed instead (each image's own pack, the kernel still launched over the images), the NCHW 1x1 convolution of
# 32x64x56x56 into 64 on Zen 3, in-process A/B (min / median of 10): backward 21.8 / 22.9 -> 19.0 / 20.0 ms, forward
# level (7.7 / 8.1 against 8.0 / 8.8). Such a pack takes blocks of as many column tiles as make a step's columns a run
# of STEP_RUN_BYTES (`_run_tiles`: 4 of AVX2's), packed together first and each row tile run over them (llvm.py
# `render_packed_row_tiles`), so that each step's row streams from memory a few lines at a time, not one line per
# tile from each of 64 rows: the same convolution (min / median of 12) forward 9.00 / 9.62 -> 7.70 / 8.57 ms,
# backward 19.7 / 20.5 -> 18.8 / 20.0 (blocks of 512 and 1024 bytes: slower); batched matmuls within noise.
STEP_RUN_BYTES = 256
L1_SETS, LINE_BYTES = 64, 64
# Beyond PACK_BYTES (K over 5120 float32 steps), the K-blocked row groups pack panels of PANEL_BYTES of the reduce
# steps, each row group every panel in turn (`TilePlan.panel`), BLIS's kc x nc panels: the groups grow to
# PANEL_GROUP_ROWS rows, so that a pack serves that many rows. Unpacked, such GEMMs ran at about half the speed (a
# 1x1 convolution's weight gradient over 8x55x55 positions: K = 24200). A panel that stays in L2 beside the group's
# rows beats one as big as the stack allows (256 KB against 1.25 MB: 256x8192x256 207 -> 250 GFLOP/s, 64x24200x256
# 203 -> 240, 512x6272x128 255 -> 280); groups of 512 rows ran the larger GEMMs faster but cut launches of 512 rows
# into one chunk, on one thread. Panels where one pack fits: slower (1568x4608x512 277 -> 207: a pack per group).
# With the next panel's lines prefetched while a panel runs (llvm.py `panel_prefetch`), the current and the next panel's
# lines share L2: 128 KB panels measured as 256 KB ones on those GEMMs (noise 10%), and the 1x1 weight gradient
# (64x100352x64) 360 -> 380 GFLOP/s.
PANEL_GROUP_ROWS = 128
PANEL_BYTES = 1 << 17
# Where the whole output is a few column tiles (AVX2's 16-column tiles of a 64-channel weight gradient), one loop over
# the column tiles outside everything read the row operand once per column tile, from memory: a panel of every column
# tile's sum_block steps that fits PANEL_BYTES packs them all (`TilePlan.tiles`), and its row groups run the tiles one
# after the other (llvm.py `render_row_groups`), the row operand's panel read from memory once and from L2 by the
# other tiles. Such kernels are launched over their ranges outside the row, not cut by column tiles
# (lower/schedule.py `_split_columns`). AVX2 (Zen 3, 2 cores): x.T @ g at 64x107648x64 26.8 -> 10.9 ms, the 1x1 NHWC
# weight gradient of 32x56x56x64 -> 64 18-25 -> 10-12 ms, its 3x3 one 110 -> 54-62 ms. A sum short enough for one
# pack whose every column tile's pack fits TILES_PACK_BYTES, beside a row operand bigger than RESIDENT_BYTES, packs all
# the tiles first and runs each row tile over all of them (llvm.py `render_packed_row_tiles`): the 1x1 convolution's
# (100352 x 64) @ (64 x 64) 7.4-12.3 -> 6.4-6.8 ms. TILES_PACK_BYTES is L2-sized: at 64 KB, longer sums (K = 512 into
# 64 columns) went back to the loop over tiles; at 512 KB (in-process A/B, best / median GFLOP/s on Zen 3, 2 cores)
# 100352x512x64 71 / 59 -> 118 / 107, 32768x1024x128 99 / 85 -> 141 / 127, 8192x256x128 78 / 57 -> 135 / 102 (256 KB and
# 1 MB measured between), and the convolutions of `benchmarks/run.py conv_layouts` level or up to 10% faster.
# `_split_columns` (lower/schedule.py) cuts a wide GEMM whose operands overflow the last-level cache into blocks of
# column tiles that take such packs.
TILES_PACK_BYTES = 512 << 10
# Such a panel also copies its row operand where that is read across its rows (`x.T @ g`'s x: each step a tile's rows
# in one line, the next step's a row further), its steps one after the other with ROW_PACK_PAD values of padding
# between (a row of 64 float32 is 256 bytes, whose multiples crowded the tiles' lines into a quarter of L1's sets,
# and their rereads by each row tile and column tile missed L1).
ROW_PACK_PAD = 16
# A bfloat16 contraction with float32 sums runs on AMX tiles where the host has them (`_amx_plan`, llvm.py
# `render_amx`): blocks of AMX_BLOCK x AMX_BLOCK outputs (2 x 2 tiles of 16 x 16 float32), AMX_K reduce steps per tile
# product (32 bfloat16 = a 64-byte tile row); the tiles' float32 sums are added into float64 every AMX_SUM_BLOCK steps
# (a tile product adds 32 products at once, so a block is 32 float32 additions per element).
AMX_K, AMX_BLOCK, AMX_SUM_BLOCK = 32, 32, 1024
# A contraction reading both operands along its reduction (`g @ w.T`) gets a tile of dot_rows x dot_columns output
# elements (`tile_geometry`: 4 x 4 with 32 vector registers), each a vector of partial sums over the reduce loop: per
# vector step dot_rows + dot_columns loads feed dot_rows * dot_columns FMAs, and no transposed copy of w is made
# (`_dot_plan`). 128x512x512: 341 us, against 526 us for the copy plus the register tile. The vector partial sums of
# each element are added up after the loop, which costs too much next to reductions shorter than DOT_MIN_REDUCE
# (512x64x512: 279 us, against 165 us).
DOT_MIN_REDUCE = 256
# A dot tile takes a row and a column of at least DOT_MIN_ROWS values, fewer than its own rows and columns too (one
# tile of what there is): a 2-row `x @ w.T` against a 4096 x 4096 w kept the plain nest, which read all of w once per
# row, from memory (7-8 GFLOP/s; its dot tile 18, JAX 17); W @ X of 4096 x 4096 by 4096 x 2 (X laid out transposed)
# one dot product after the other, 28-30 -> 44 (JAX 26-38).
DOT_MIN_ROWS = 2
# With DOT_MAX_ROWS rows or more (and whole column tiles) the transposed copy of w is small next to the contraction and
# the register tile after it beats the dot tile's horizontal sums: a @ b.T at 512x512x512 ran at 289-296 GFLOP/s
# against 212-215, 256x1024x256 at 274 against 251, 128x512x512 at 200-205 against 216-238 (2 cores).
DOT_MAX_ROWS = 256
# A packed operand read across (`g @ w.T`'s w) is packed in squares of transpose_lanes x transpose_lanes float32
# values (`tile_geometry`: one vector per row, 16 with AVX-512) transposed in registers (llvm.py `pack_transposed`).
# Since w packs in transposed 16x16 blocks (llvm.py `pack_transposed`), the register tile also wins from
# DOT_PACKED_ROWS rows where every launch chunk keeps its pack for all of them: launched over column tiles (at least
# DOT_PACKED_COLUMNS columns: 4 tiles, lower/schedule.py `_split_columns`) or over ranges outside the row (a batch, a
# split sum's partials), and the sum is whole float32 blocks of 16 (2 cores, us, dot tile -> register tile: 128x512x512
# 198-218 -> 173, 100x784x512 226-291 -> 171-188, 200x784x256 210-244 -> 164, batched 8x64x512x64 101-179 -> 90-93,
# 8x64x3136x64 765-832 -> 488-497: an NCHW 1x1 weight gradient's partial sums). With fewer column tiles the launch
# cuts the rows, each chunk packing w again: 64x2048x64 55-62 -> 83-136; and with fewer rows the pack is paid for
# too few of them (8x16x4096x64: 256 -> 400).
DOT_PACKED_ROWS, DOT_PACKED_COLUMNS = 64, 256

# An elementwise kernel reading across its columns (a transpose) runs in blocks of TRANSPOSE_BLOCK rows x columns
# (`transpose_block`): 32 x 32 float32 reads 32 lines of 128 bytes and writes 32 such rows per block. A 4096x4096
# float32 transpose: 69 -> 15.8 ms (16: 24.5, 64: 14.5; 512x512: 115 -> 58 us, 64: 75), 2 cores.
TRANSPOSE_BLOCK = 32

# A kernel whose output takes at least NONTEMPORAL_BYTES (`big_output`) stores it with non-temporal (streaming) stores,
# each vector a whole 64-byte line (llvm.py `store_vector`): a register tile's float output, a register transpose's,
# an elementwise kernel's whose value has vector forms (llvm.py `vector_lanes`). The line goes to memory without
# being read first (a store that misses reads its line, a third of such a kernel's traffic) and without evicting what
# the kernel reads; an output this big is not in the caches for the next kernel anyway. NCHW 1x1 convolution of
# 32x64x56x56 into 64 channels (25.7 MB out): 2.02-2.12 -> 1.82-2.02 ms read in place; NHWC and the GEMMs within
# noise. With AVX2 a line is two vectors, stored as one (the write-combining buffers send the two halves as one
# line): the same convolution 12.0-12.8 -> 9.8-11.7 ms on Zen 3.
NONTEMPORAL_BYTES = 16 << 20
# ... for a register tile, where its sum has at most NONTEMPORAL_MAX_STEPS steps (its output a real share of its
# traffic): the 2048^3 matmul, whose output is 16 MB, ran slower streamed on Zen 3 (in-process A/B, best / median of
# 14: 123 / 102 GFLOP/s against 134 / 121); AVX-512's measured within noise.
NONTEMPORAL_MAX_STEPS = 1024

# A register tile may store a STORE that is not contiguous along its column (element by element) when its sum has at
# least this many steps (`permuted_store_pays`, lower/schedule.py `_contraction_order`).
PERMUTED_STORE_MIN_REDUCE = 256
PERMUTED_STORE_MIN_SIZE = 1 << 16
# (or smaller, with at least this many products in all: a 3x3 weight gradient over 64x16x16 positions, (3, 3, 32, 64)
# summed over 16384 steps and stored as (64, 32, 3, 3), ran in the output's order, 3-wide columns, at 41 GFLOP/s)
PERMUTED_STORE_MIN_WORK = 1 << 26


def permuted_store_pays(last: int, column: int, steps: int, size: int) -> bool:
  """Whether a float32 contraction of `size` elements whose output is stored permuted, its own last axis `column`
  long and the output's `last`, runs in its own loop order (`column` the register tile's column, the STORE element
  by element) rather than in the output's order or computed and then copied: the sum has PERMUTED_STORE_MIN_REDUCE
  steps or more, `column` is whole vectors, `last` fills no whole column tiles, and the output is big enough
  (PERMUTED_STORE_MIN_SIZE) for a copy of it to cost more than compiling the element-by-element stores (the IR of a
  6 x 64 tile's: 37 -> 155 KB, 25 -> 90 ms of LLVM), or its sums long enough (PERMUTED_STORE_MIN_WORK). A
  channels-first convolution's output (N, O, H, W) from its (N, H, W, O) product: 56 wide rows, 64 channels. Not a
  weight gradient computed as (out, in) and stored (in, out) with whole tiles both ways: the MLP step's 512x512 ones
  stored element by element took its step from 280 to 170 per second."""
  geometry = tile_geometry()
  lanes = geometry.vector_bytes // 4
  big = size >= PERMUTED_STORE_MIN_SIZE or size * steps >= PERMUTED_STORE_MIN_WORK
  return steps >= PERMUTED_STORE_MIN_REDUCE and big and column % lanes == 0 and \
      last % (lanes * geometry.tile_vectors) != 0

Opt = tuple  # ("reduce_outside", range id) | ("upcast", range id, amount)


@dataclass(frozen=True)
class TilePlan:
  """How to render a kernel whose single REDUCE is computed for a tile of output elements at once."""
  reduce: UOp              # the kernel's one REDUCE node
  column: UOp              # the innermost global range: stride 1 in the STORE, vectorised
  row: UOp | None          # the global range just outside it, tiled for reuse (None: not tiled)
  columns: int             # tile width (elements of `column`), a multiple of `lanes`
  stream: bool             # accumulators in a memory array of `columns` (tile col), not registers (upcast col)
  rows: int                # tile height (values of `row`; 1 without a row)
  lanes: int               # elements per vector register for the accumulator type
  contract: bool           # a float product feeds the ADD reduce: multiply-add may fuse into an FMA
  opts: tuple[Opt, ...]    # what was applied, as data
  grain: int = 1           # outer iterations a launch chunk keeps together (a tile's rows or columns; see launch_grain)
  group: int = 0           # rows per K-blocked row group (GROUP_ROWS, in whole tiles), 0 when tiles run one by one
  packed: tuple[UOp, ...] = ()  # loads of the reused operand copied into a contiguous array per column tile
  dot: bool = False        # the reduce loop is the vectorised loop, `columns` scalar columns (`_dot_plan`)
  spans: tuple[UOp, ...] = ()  # global ranges a row group runs inside each reduce block (`_spans`)
  panel: int = 0           # reduce steps per pack when all of them would not fit in PACK_BYTES (0: one pack)
  tiles: int = 1           # column tiles packed at once: the column's or a block's (PANEL_BYTES, TILES_PACK_BYTES)
  row_packed: tuple[UOp, ...] = ()  # loads of the row operand a panel copies, read across its rows (ROW_PACK_PAD)
  sum_block: int = TILE_SUM_BLOCK  # float32 steps per flush into float64 (CONTRACTION_SUM_BLOCK for a contraction)
  amx: tuple[UOp, ...] = ()  # a bfloat16 contraction on AMX tiles: its (row operand, column operand) loads
  chunk: int = 0           # a windowed sum's row groups: its outer reduce range's values per block (`_window_chunk`)
  nontemporal: bool = False  # the STORE's vectors are whole lines, stored non-temporally (NONTEMPORAL_BYTES)
  reduces: tuple[UOp, ...] = ()  # a stream tile's REDUCEs where it has several (`_streams_plan`; else just `reduce`)
  sweep: int = 0           # reduce steps per sweep of the column (SWEEP_STEPS: `_sweeps`), 0 when each tile runs whole


def accumulator_dtype(node: UOp) -> np.dtype:
  """The dtype a REDUCE accumulates its innermost loop in: float32 for float16 / bfloat16, and for a float32 (or
  16-bit float) sum into float64, the widening REDUCE of a split reduction's partial sums (lower/split.py), whose
  float32 blocks then add into float64 like any float32 sum's and whose result is stored unrounded."""
  value_dtype = node.src[0].dtype
  if node.arg is Ops.ADD and node.dtype == F64 and value_dtype in (F16, BF16, F32): return F32
  return F32 if node.dtype in (F16, BF16) else node.dtype


def linear_strides(index: UOp) -> tuple[dict[UOp, int], set[UOp]]:
  """The index as a linear form: {RANGE: coefficient}, plus the RANGEs it also depends on non-linearly (inside a
  division, a modulo, a product of ranges, ...), whose strides are unknown."""
  if index.op is Ops.CONST: return {}, set()
  if index.op is Ops.RANGE: return {index: 1}, set()
  if index.op is Ops.ADD:
    (left, left_other), (right, right_other) = (linear_strides(src) for src in index.src)
    strides = dict(left)
    for rng, coefficient in right.items(): strides[rng] = strides.get(rng, 0) + coefficient
    return {rng: c for rng, c in strides.items() if c != 0}, left_other | right_other
  if index.op is Ops.MUL and index.src[1].op is Ops.CONST:
    strides, other = linear_strides(index.src[0])
    factor = index.src[1].arg
    return {rng: c * factor for rng, c in strides.items() if c * factor != 0}, other
  return {}, {node for node in index.toposort if node.op is Ops.RANGE}


def block_stride(index: UOp, rng: UOp, block: int) -> int | None:
  """The stride of `rng` in `index` inside each aligned block of `block` consecutive values of it (`rng` = block *
  b + i, 0 <= i < block): the index rebuilt over b and i by symbolic's division folding, i's coefficient; None where
  it stays non-linear in i. A transpose's flat rows (n, o) of (32, 64, 3136) read (r // 64) * 200704 + r % 64: stride
  1 within blocks of 16 rows, though not across them."""
  outer = UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(-(-rng.src[0].arg // block)),), (-1, "block"))
  inner = UOp(Ops.RANGE, INDEX_DTYPE, (symbolic.const(block),), (-2, "block"))
  done: dict[UOp, UOp] = {rng: symbolic.add(symbolic.mul(outer, block), inner)}
  for node in index.toposort:
    if node in done: continue
    sources = [done.get(source, source) for source in node.src]
    divisor = node.src[1].arg if len(node.src) == 2 and node.src[1].op is Ops.CONST else None
    if node.op in (Ops.CONST, Ops.RANGE): done[node] = node
    elif node.op is Ops.ADD: done[node] = symbolic.add(*sources)
    elif node.op is Ops.MUL and divisor is not None: done[node] = symbolic.mul(sources[0], divisor)
    elif node.op is Ops.IDIV and divisor is not None and divisor > 0: done[node] = symbolic.idiv(sources[0], divisor)
    elif node.op is Ops.MOD and divisor is not None and divisor > 0: done[node] = symbolic.mod(sources[0], divisor)
    else: return None
  strides, other = linear_strides(done[index])
  return None if inner in other else strides.get(inner, 0)


def global_ranges_of(ast: UOp) -> list[UOp]:
  """A kernel's global RANGEs in nesting order (outermost first)."""
  return sorted((n for n in ast.toposort if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda rng: rng.arg[0])


def _stride(index: UOp, rng: UOp) -> int | None:
  """The stride of `rng` in `index`; None when the index depends on it non-linearly."""
  strides, other = linear_strides(index)
  return None if rng in other else strides.get(rng, 0)


def _contracts(reduce: UOp) -> bool:
  """Whether a float product feeds the ADD reduce, so that multiply and add may fuse into an FMA."""
  value = reduce.src[0]
  return reduce.arg is Ops.ADD and value.op is Ops.MUL and value.dtype.kind == "f" and value.dtype.itemsize >= 4


def _accumulator_bytes(reduce: UOp) -> int:
  """Bytes of one accumulator in registers, at least 4: float16 / bfloat16 accumulate in float32, as do the float64
  partial sums of a split float32 reduction (lower/split.py: their tile is as wide as the unsplit one's), and narrower
  integers and bool are counted as 4 so that a tile is never wider than a float32 tile (code size)."""
  return max(4, accumulator_dtype(reduce).itemsize)


_memo = threading.local()  # `plans_memoized`: this thread's lowering's plans, by kernel AST


@contextlib.contextmanager
def plans_memoized():
  """Within (on this thread): `choose_opts` keeps each kernel AST's plan. A lowering asks for a kernel's plan 8-17
  times (relayout copies, column splits, launch grains, both tiers' rendering): 233 calls in the MLP step's, 14.5 ms
  of its 0.52 s first call; 1018 and 51 ms in the transformer step's. Only within one lowering, as what a plan depends
  on beside the AST (the tile geometry, AMX, the module's sizes) may change between lowerings (tests set them)."""
  outer = getattr(_memo, "plans", None)
  _memo.plans = {} if outer is None else outer
  try: yield
  finally: _memo.plans = outer


def choose_opts(ast: UOp, enabled: bool = not NOOPT) -> TilePlan | None:
  """The tile plan for a kernel AST (a SINK of STOREs), or None for the plain loop nest."""
  if not enabled: return None
  if (plans := getattr(_memo, "plans", None)) is None: return _choose_opts(ast)
  if ast not in plans: plans[ast] = _choose_opts(ast)
  return plans[ast]


def _choose_opts(ast: UOp) -> TilePlan | None:
  nodes = ast.toposort
  stores = [node for node in nodes if node.op is Ops.STORE]
  reduces = [node for node in nodes if node.op is Ops.REDUCE]
  # correctness preconditions: one STORE whose value uses the kernel's only REDUCE, constant global bounds
  if len(stores) == 1 and len(reduces) > 1: return _streams_plan(ast, stores[0], reduces)
  if len(stores) != 1 or len(reduces) != 1: return None
  (store,), (reduce,) = stores, reduces
  _, store_index, _ = store.src
  value, *reduce_ranges = reduce.src
  if not reduce_ranges or reduce not in store.src[2].toposort: return None
  global_ranges = global_ranges_of(ast)
  if not global_ranges or any(rng.src[0].op is not Ops.CONST for rng in global_ranges + reduce_ranges): return None
  column = global_ranges[-1]
  value_nodes = value.toposort
  if column not in value_nodes: return None  # each output element reduces the same values: nothing to share
  # profitability: the column is contiguous in the STORE and in every load (or not used), and the plain nest's inner
  # loop (the innermost reduce range) is strided in some load; gated loads would put branches into the tile
  loads = [node for node in value_nodes if node.op is Ops.LOAD]
  reduce_steps = math.prod(rng.src[0].arg for rng in reduce_ranges)
  # (or the STORE is not contiguous but the sum long: a contraction stored permuted, lower/schedule.py
  # `_contraction_order`, whose epilogue stores element by element)
  permuted = _stride(store_index, column) != 1
  if permuted and reduce_steps < PERMUTED_STORE_MIN_REDUCE or any(len(load.src) > 2 for load in loads): return None
  if not permuted and (plan := _amx_plan(reduce, global_ranges, reduce_ranges)) is not None: return plan
  innermost = reduce_ranges[-1]
  # the plain nest is right when its inner loop (the innermost reduce range) is contiguous and long enough to
  # vectorise; a short one (a convolution's kernel width) leaves it a scalar loop of a few iterations per output
  short = innermost.src[0].arg < SHORT_REDUCE
  # loads strided along the column (w in `g @ w.T`) are only read where the operand is packed (`_packed_loads`)
  across = [load for load in loads if _stride(load.src[1], column) not in (0, 1)]
  if all(_stride(load.src[1], innermost) in (0, 1) for load in loads) and not short and not permuted:
    plan = _dot_plan(reduce, column, global_ranges, loads, reduce_ranges)
    if plan is not None or not across: return plan
  geometry = tile_geometry()
  lanes = max(1, geometry.vector_bytes // _accumulator_bytes(reduce))
  # the row: a global range some load under the REDUCE does not depend on (that load is reused across the rows), the
  # innermost one long enough for a whole tile (a weight gradient's (C, kh, kw, O) tiles C, not the 3-long kw)
  # (a load of the operand, read along the reduction: not a bias read once per column, as a split sum's partials
  # would otherwise be taken for rows)
  # (a table of a few values, as a max-pool gradient's window offsets, is no operand to share: it stays in L1, and
  # taking its rows for a tile's left a split bias gradient's 8 partial sums in a 6-row tile and its 2-row remainder,
  # one thread doing three quarters of the work)
  operand = [load for load in loads if any(rng in load.src[1].toposort for rng in reduce_ranges) and
             load.src[1].vmin_vmax[1] - load.src[1].vmin_vmax[0] >= TABLE_VALUES]
  # (nor one that an operand reads along with the column: each of the tile's elements would load a vector of its own
  # and repeat its own part of the sum's operand; a language model's layer-norm gain gradient, gathered embeddings
  # normalised inside a column sum split 8 ways, took the 8 partial sums for a 6-row tile and its 2-row remainder:
  # its operand 16 times over, 0.3 s of LLVM)
  reused = [rng for rng in reversed(global_ranges[:-1])
            if rng in value_nodes and any(rng not in load.src[1].toposort for load in operand) and
            not any(rng in load.src[1].toposort and column in load.src[1].toposort for load in operand)]
  # (preferably one that a load along the column does not depend on: its vectors are then reused across the tile's
  # rows; attention's projection gradient out[d, h, e] = sum x[b, t, d] dq[b, h, t, e] tiled the 4 heads h, a vector
  # load of dq per FMA, at 24 GFLOP/s, where the rows d share them)
  along = [load for load in operand if column in load.src[1].toposort]
  reused = [rng for rng in reused if any(rng not in load.src[1].toposort for load in along)] or reused
  row = next((rng for rng in reused if rng.src[0].arg >= geometry.window_tile_rows), reused[0] if reused else None)
  height = geometry.tile_rows if row is not None and row.src[0].arg >= geometry.tile_rows and \
      not _slides(loads, row, reduce_ranges) else geometry.window_tile_rows
  # without a row, a column of at most one register tile's width (a vector-matrix product, an RNN step's h @ w) keeps
  # its sums in registers: in the stream tile's memory array each step's adds wait on the last step's stores (64x64:
  # 180 -> 90 ns). Not when the epilogue has an operation without a vector form (tanh's exp2): the register tile
  # would run it per element, where the stream tile's loop over its columns is vectorised.
  resident = reduce_steps * column.src[0].arg * _accumulator_bytes(reduce) <= RESIDENT_BYTES
  stream = row is None and (column.src[0].arg > lanes * geometry.rowless_vectors and not resident or
                            not _vector_epilogue(store, reduce))
  # the stream tile handles one reduce range (and its blocking); over several (a batch-norm sum over N and H x W, N
  # read alone by a broadcast operand) the columns go in register tiles, each walking the nest over its columns
  if stream and len(reduce_ranges) != 1: stream = False
  width = column.src[0].arg  # a column of fewer whole vectors than a tile's is one tile of its width
  rows = 1 if stream else _tile_rows(row, width, lanes, height)
  tile_width = lanes * (geometry.tile_vectors if row is not None else geometry.rowless_vectors)
  columns = STREAM_TILE if stream else width if width < tile_width and width % lanes == 0 else tile_width
  contract = _contracts(reduce)
  sum_block = CONTRACTION_SUM_BLOCK if contract and not stream else TILE_SUM_BLOCK
  opts: list[Opt] = [("reduce_outside", innermost.arg[0]), ("tile" if stream else "upcast", column.arg[0], columns)]
  if row is not None: opts.append(("upcast", row.arg[0], rows))
  if not stream and _sweeps(loads, row, column, reduce, global_ranges, columns):
    opts.append(("sweep", innermost.arg[0], SWEEP_STEPS))
    grain = columns if column is global_ranges[0] else 1
    return TilePlan(reduce, column, row, columns, False, rows, lanes, contract, tuple(opts), grain, sum_block=sum_block,
                    sweep=SWEEP_STEPS)
  # a float32 sum over one range longer than two blocks, its row just outside its column: K-blocked row groups, where
  # they span ranges (`_spans`) or the sum has more than GROUP_MIN_BLOCKS blocks
  group = GROUP_ROWS // rows * rows if row is not None and row is global_ranges[-2] and reduce.arg is Ops.ADD and \
      accumulator_dtype(reduce) == F32 and len(reduce_ranges) == 1 and innermost.src[0].arg > 2 * sum_block \
      else 0
  spans = _spans(loads, row, global_ranges, group * columns) if group else ()
  if not spans and innermost.src[0].arg <= GROUP_MIN_BLOCKS * sum_block: group = 0
  if spans:  # the sums are in L2 anyway: the group grows to the whole row where they fit (one pass, not two)
    values = math.prod(rng.src[0].arg for rng in spans)
    whole = -(-row.src[0].arg // rows) * rows
    group = max(group, min(whole, SPAN_SUMS_BYTES // (values * columns * 8) // rows * rows))
  packed, panel, tiles = _packed_loads(loads, row, column, reduce_ranges, columns, global_ranges, group > 0, sum_block)
  if panel and not spans: group = max(group, min(-(-row.src[0].arg // rows) * rows, PANEL_GROUP_ROWS // rows * rows))
  if spans and tiles > 1:  # (every column tile's sums for the spans, in SPAN_SUMS_BYTES)
    group = max(rows, min(group, SPAN_SUMS_BYTES // (values * columns * tiles * 8) // rows * rows))
  row_packed = _row_packed(loads, row, column, innermost) if panel and tiles > 1 and not spans else ()
  # every tile must then be packed: whole column tiles, and a row tile that runs inside the column tile's pack
  if across and (stream or column.src[0].arg % columns or not set(across) <= set(packed)): return None
  windowed = not group and not stream and row is not None and row is global_ranges[-2]
  chunk = _window_chunk(reduce, reduce_ranges, columns, loads) if windowed else 0
  if chunk:
    group = min(-(-row.src[0].arg // rows) * rows, WINDOW_GROUP_ROWS // rows * rows)
    opts.append(("chunk", reduce_ranges[0].arg[0], chunk))
  if group: opts.append(("group", row.arg[0], group))
  if spans: opts.append(("span", *(rng.arg[0] for rng in spans)))
  if packed: opts.append(("pack", column.arg[0], len(packed)))
  if panel: opts.append(("panel", innermost.arg[0], panel) + ((tiles,) if tiles > 1 else ()))
  if row_packed: opts.append(("pack_rows", row.arg[0], len(row_packed)))
  elif tiles > 1: opts.append(("tiles", column.arg[0], tiles))
  nontemporal = _nontemporal(store, reduce, global_ranges, columns, lanes, stream or permuted)
  if nontemporal: opts.append(("nontemporal",))
  outermost = global_ranges[0]
  # a launch chunk of a grouped GEMM is whole groups: each chunk streams all of the reused operand through the cache
  # once per group, so chunks of a single tile's rows would stream it once per tile; a packed one packs per chunk
  # (whole tiles: a chunk's last tile is clamped, llvm.py `row_tiles`, so one of 16 rows of 6-row tiles computed 18)
  grain = columns if outermost is column else \
      max(group or rows, -(-PACK_MIN_ROWS // rows) * rows if packed else 1) if outermost is row else 1
  return TilePlan(reduce, column, row, columns, stream, rows, lanes, contract, tuple(opts), grain, group, packed,
                  spans=spans, panel=panel, tiles=tiles, row_packed=row_packed, sum_block=sum_block, chunk=chunk,
                  nontemporal=nontemporal)


def _sweeps(loads: list[UOp], row: UOp | None, column: UOp, reduce: UOp, global_ranges: list[UOp],
            columns: int) -> bool:
  """Whether a register-tiled contraction sweeps its column (SWEEP_ROWS): a float32 sum over one reduce range of a few
  rows (not the launch range), just outside a column of several whole tiles, whose reused operand (the loads along the
  column and the reduction) is read in place, contiguous along the column, and spans at least SWEEP_MIN_BYTES (the
  extent of its index: a launch's column block or a split sum's chunk counts the whole operand)."""
  if row is None or row is global_ranges[0] or row is not global_ranges[-2] or row.src[0].arg > SWEEP_ROWS: return False
  if len(reduce.src) != 2 or reduce.arg is not Ops.ADD or accumulator_dtype(reduce) != F32: return False
  steps, width = reduce.src[1], column.src[0].arg
  if width % columns or width < 2 * columns or steps.src[0].arg < 2 * SWEEP_STEPS: return False
  operand = [load for load in loads if column in load.src[1].toposort and steps in load.src[1].toposort]
  if not operand or any(row in load.src[1].toposort or _stride(load.src[1], column) != 1 or
                        abs(_stride(load.src[1], steps) or 0) * load.src[0].dtype.itemsize < SWEEP_STEP_BYTES
                        for load in operand):
    return False
  low, high = operand[0].src[1].vmin_vmax
  return (high - low + 1) * operand[0].src[0].dtype.itemsize >= SWEEP_MIN_BYTES


def _streams_plan(ast: UOp, store: UOp, reduces: list[UOp]) -> TilePlan | None:
  """The stream tile of a kernel that combines several REDUCEs per output element (a bias gradient of a PINN's
  second derivatives: three column sums of products added, 1024 x 64 each), whose plain nest walks each sum's loads
  down their columns with the row's stride, one element per cache line. The sums run one after the other, each the
  plan's reduce loop outside a vectorised loop over its own accumulator array (llvm.py `render_stream_tile`), and
  the epilogue per column. Needs the column contiguous in the STORE and in every load (or not read), constant
  bounds, no REDUCE inside another's value and no gated load; None otherwise, or where every sum's innermost loop
  is contiguous already (the plain nest vectorises it)."""
  global_ranges = global_ranges_of(ast)
  if not global_ranges: return None
  column = global_ranges[-1]
  value = store.src[2].toposort
  if _stride(store.src[1], column) != 1 or not all(reduce in value for reduce in reduces): return None
  ranges = global_ranges + [rng for reduce in reduces for rng in reduce.src[1:]]
  if any(rng.src[0].op is not Ops.CONST for rng in ranges): return None
  strided = False
  for reduce in reduces:
    nodes = reduce.src[0].toposort
    loads = [node for node in nodes if node.op is Ops.LOAD]
    if any(node.op is Ops.REDUCE for node in nodes) or \
        any(len(load.src) > 2 or _stride(load.src[1], column) not in (0, 1) for load in loads): return None
    strided = strided or any(_stride(load.src[1], reduce.src[-1]) not in (0, 1) for load in loads)
  if not strided: return None
  lanes = max(1, tile_geometry().vector_bytes // max(_accumulator_bytes(reduce) for reduce in reduces))
  opts = tuple(("reduce_outside", reduce.src[-1].arg[0]) for reduce in reduces) + \
      (("tile", column.arg[0], STREAM_TILE),)
  grain = STREAM_TILE if column is global_ranges[0] else 1
  return TilePlan(reduces[0], column, None, STREAM_TILE, True, 1, lanes, False, opts, grain, reduces=tuple(reduces))


def _nontemporal(store: UOp, reduce: UOp, global_ranges: list[UOp], columns: int, lanes: int, skip: bool) -> bool:
  """Whether a register tile stores its output non-temporally (NONTEMPORAL_BYTES): a float output of that size, in
  the accumulators' own width, stored along the column a whole 64-byte line at a time (a tile of whole lines: its
  vectors of `lanes` values joined where they are narrower, llvm.py `render_block`; `skip`: a stream tile's or a
  permuted STORE's are not)."""
  dtype = store.src[0].dtype
  if skip or dtype.kind != "f" or LINE_BYTES % (dtype.itemsize * lanes) or columns * dtype.itemsize % LINE_BYTES:
    return False
  if math.prod(rng.src[0].arg for rng in reduce.src[1:]) > NONTEMPORAL_MAX_STEPS: return False
  return accumulator_dtype(reduce) == dtype and big_output(store, global_ranges)


def big_output(store: UOp, global_ranges: list[UOp]) -> bool:
  """Whether the kernel writes at least NONTEMPORAL_BYTES through `store` (one element per global iteration): its
  whole-line vector stores go to memory non-temporally (a register tile's, `_nontemporal`; a register transpose's,
  llvm.py `render_register_transpose`: NCHW -> NHWC of 32x64x56x56 1.05 -> 0.72-0.78 ms; a streamed elementwise
  kernel's, llvm.py `vector_lanes`)."""
  return math.prod(rng.src[0].arg for rng in global_ranges) * store.src[0].dtype.itemsize >= NONTEMPORAL_BYTES


def _window_chunk(reduce: UOp, reduce_ranges: list[UOp], columns: int, loads: list[UOp]) -> int:
  """A float32 sum over a window (a direct convolution's channels, then its short taps) whose taps for the tile's
  columns do not fit WINDOW_BLOCK_BYTES (or the host's L1 less WINDOW_L1_SPARE for channels-first data): the
  channels per block of its row groups (`llvm.py render_row_groups`),
  so that a block's taps stay in L1 for all the group's tiles: WINDOW_BLOCKS blocks where those fit (their sums then
  float32), else as many channels as fit (float64 sums); 0 where that does not apply. 32x56x56x64 3x3 into 64 (147 KB
  of taps), NHWC: 18.2-18.7 -> 16.9-17.1 ms forward; 8x28x28x128 into 128 (295 KB, 8 blocks of 17): 5.84-5.90 ->
  5.21-5.22 ms. Taps that fit already (examples/cnn.py's first convolution, 1 channel) ran 2x slower in blocks of one
  row of the window."""
  if reduce.arg is not Ops.ADD or accumulator_dtype(reduce) != F32 or len(reduce_ranges) < 2: return 0
  outer, window = reduce_ranges[0].src[0].arg, math.prod(rng.src[0].arg for rng in reduce_ranges[1:])
  # (channels-first: no load reads along the channels, WINDOW_L1_SPARE)
  limit = WINDOW_BLOCK_BYTES
  if all(_stride(load.src[1], reduce_ranges[0]) != 1 for load in loads):
    limit = min(limit, tile_geometry().l1_bytes - WINDOW_L1_SPARE)
  if window > SHORT_REDUCE * SHORT_REDUCE or outer * window * columns * 4 <= limit: return 0  # (in L1)
  chunk = -(-outer // WINDOW_BLOCKS)
  if chunk * window * columns * 4 > limit: chunk = limit // (window * columns * 4)
  return chunk if chunk >= 1 and outer >= 2 * chunk else 0


def amx_bf16() -> bool:
  """Whether this process may run bfloat16 contractions on AMX tiles (devices/cpu.py `amx_bf16`)."""
  from tinyjax.devices import cpu  # the host's CPU features and the OS's permission
  return cpu.amx_bf16()


def _amx_plan(reduce: UOp, global_ranges: list[UOp], reduce_ranges: list[UOp]) -> TilePlan | None:
  """The AMX plan of a bfloat16 matrix product with float32 sums, out[i, j] = epilogue(sum_k a[i, k] * b[k, j]): a
  read along the reduction (its tiles load in place), b with any strides (packed into pairs of reduce steps per
  column, AMX's layout; `g @ w.T` reads w across its rows), over (rows, columns) or, for a batch of products (vmap,
  attention's heads), (batch, rows, columns), and one reduce range of at least AMX_K steps; None otherwise or without
  AMX (see llvm.py `render_amx`)."""
  if len(global_ranges) not in (2, 3) or len(reduce_ranges) != 1 or reduce.arg is not Ops.ADD or reduce.dtype != F32:
    return None
  (row, column), (k,) = global_ranges[-2:], reduce_ranges
  value = reduce.src[0]
  if value.op is not Ops.MUL or any(src.op is not Ops.CAST or src.src[0].op is not Ops.LOAD or
                                    src.src[0].dtype != BF16 or len(src.src[0].src) != 2 for src in value.src):
    return None
  forms = [linear_strides(src.src[0].src[1]) for src in value.src]
  if any(other for _, other in forms): return None
  (a, a_strides), (b, b_strides) = ((src.src[0], form[0]) for src, form in zip(value.src, forms))
  if a_strides.get(k) != 1 or column in a_strides: a, b, a_strides, b_strides = b, a, b_strides, a_strides
  if a_strides.get(k) != 1 or column in a_strides or row in b_strides or not b_strides.get(column) or \
      not b_strides.get(k):
    return None
  steps = k.src[0].arg // AMX_K * AMX_K
  # fewer rows than a block leave b's pack (all of b, a column block at a time) unused for most of its rows: 16 x
  # 1024 x 1024 ran 314 us on AMX, 237 us in the register tile
  if steps == 0 or row.src[0].arg < AMX_BLOCK or steps * AMX_BLOCK * 2 > PACK_BYTES or not amx_bf16(): return None
  opts = (("amx", row.arg[0], column.arg[0]),)
  grain = AMX_BLOCK if row is global_ranges[0] else 1  # a batch of products is launched over the batch
  return TilePlan(reduce, column, row, AMX_BLOCK, False, AMX_BLOCK, 16, True, opts, grain, amx=(a, b))


def _spans(loads: list[UOp], row: UOp, global_ranges: list[UOp], group_sums: int) -> tuple[UOp, ...]:
  """The global ranges between a K-blocked GEMM's launch range and its row that its row groups run inside each
  reduce block (after the row's tiles), when the reused operand depends on none of them and the group's float64 sums
  for all their values fit in SPAN_SUMS_BYTES: each block of the reused operand is then read once from memory for all
  of them, not once per value. A flat-GEMM weight gradient's (3, 3, C, O) output (lax/_conv.py) reads its output
  gradient's block once for the 9 kernel taps instead of 9 times. () when there are none, or they don't qualify."""
  spans = tuple(global_ranges[1:-2])
  reused = [load for load in loads if row not in load.src[1].toposort]
  if not spans or any(rng in load.src[1].toposort for load in reused for rng in spans): return ()
  return spans if math.prod(rng.src[0].arg for rng in spans) * group_sums * 8 <= SPAN_SUMS_BYTES else ()


def _slides(loads: list[UOp], row: UOp, reduce_ranges: list[UOp]) -> bool:
  """Whether a load reads along the row as it reads along a short range of a reduce nest (a convolution's input at x
  + kw: the unrolled taps of neighbouring rows read the same values)."""
  if len(reduce_ranges) < 2: return False
  short = [rng for rng in reduce_ranges if rng.src[0].arg <= SHORT_REDUCE]
  for load in loads:
    strides, _ = linear_strides(load.src[1])
    if strides.get(row) and any(strides.get(rng) == strides[row] for rng in short): return True
  return False


def _tile_rows(row: UOp | None, width: int, lanes: int, height: int) -> int:
  """The register tile's height: `height` (tile_rows, or window_tile_rows over a window), or for a column of fewer
  than tile_vectors whole vectors (a 32-channel convolution with AVX-512: 2) up to max_tile_rows rows, so that the
  tile keeps at most height x tile_vectors accumulators (a 6 x 16-column tile has 6 FMAs per 7 loads; 8 x 32
  columns, 16 per 10; 12 x 32 measured no better than 8 x 32 on the CNN step). The tallest height from `height` up
  that divides the row's length is taken (14 rows: 7), else the tallest."""
  vectors, geometry = width // lanes, tile_geometry()
  if row is None or width % lanes or vectors >= geometry.tile_vectors: return height
  tallest = min(geometry.max_tile_rows, height * geometry.tile_vectors // vectors, row.src[0].arg)
  if tallest <= height: return height
  return next((rows for rows in range(tallest, height, -1) if row.src[0].arg % rows == 0), tallest)


# The unary operations the renderer has a vector form of (llvm.py `_vector_nodes_ok`, which also checks dtypes: the
# float ones on float32 only, EXP2 and LOG2 as transcendental.py's polynomials); SIN and COS are scalar code.
VECTOR_UNARY = {Ops.NEG, Ops.CAST, Ops.BITCAST, Ops.TRUNC, Ops.SQRT, Ops.RECIP, Ops.EXP2, Ops.LOG2}


def _vector_epilogue(store: UOp, reduce: UOp) -> bool:
  """Whether what a kernel computes from its REDUCE (the STORE's value above it) has no unary operation without a
  vector form."""
  stack, seen = [store.src[2]], set()
  while stack:
    node = stack.pop()
    if node in seen or node is reduce: continue
    seen.add(node)
    if node.op in UNARY and node.op not in VECTOR_UNARY: return False
    stack.extend(node.src)
  return True


def _packed_loads(loads: list[UOp], row: UOp | None, column: UOp, reduce_ranges: list[UOp], columns: int,
                  global_ranges: list[UOp], blocked: bool, sum_block: int) -> tuple[tuple[UOp, ...], int, int]:
  """The loads a register tile packs per column tile (see PACK_BYTES): those of the reused operand (they depend on
  the column and the reduce, not the row), when the row loop runs inside the column tile (the row is the range just
  outside the column) and at least PACK_MIN_ROWS rows share the pack; and the panel: 0 when the copies of all the
  reduce steps fit in PACK_BYTES, else, for K-blocked row groups (`blocked`), how many steps one pack holds (whole
  blocks of `sum_block`; each row group packs each panel in turn), and the column tiles packed at once (see
  PANEL_BYTES). ((), 0, 1) when nothing is packed."""
  if row is None or row is not global_ranges[-2] or row.src[0].arg < PACK_MIN_ROWS: return (), 0, 1
  packed = tuple(load for load in loads if row not in load.src[1].toposort and column in load.src[1].toposort and
                 any(rng in load.src[1].toposort for rng in reduce_ranges))
  if not packed or _in_place(packed, global_ranges[:-2], reduce_ranges, columns): return (), 0, 1
  step_bytes = columns * sum(max(4, load.dtype.itemsize) for load in packed)
  # (the whole column's pack for a block within PANEL_BYTES: a panel packs every column tile, `TilePlan.tiles`)
  tiles = column.src[0].arg // columns if column.src[0].arg % columns == 0 else 1
  if tiles * step_bytes * sum_block > PANEL_BYTES: tiles = 1
  steps = math.prod(rng.src[0].arg for rng in reduce_ranges)
  if steps * step_bytes * tiles <= PACK_BYTES:
    # (every column tile's pack in TILES_PACK_BYTES beside a row operand that does not stay in L2: each row tile
    # runs all the column tiles)
    small = not blocked and steps * step_bytes * tiles <= TILES_PACK_BYTES and row.src[0].arg * steps * 4 > \
        RESIDENT_BYTES
    if small or blocked: return packed, 0, tiles if small else 1
    return packed, 0, _run_tiles(packed, column.src[0].arg // columns if column.src[0].arg % columns == 0 else 0,
                                 columns, step_bytes, steps, global_ranges[:-2])
  if not blocked: return (), 0, 1
  return packed, max(sum_block, PANEL_BYTES // (step_bytes * tiles) // sum_block * sum_block), tiles


def _run_tiles(packed: tuple[UOp, ...], count: int, columns: int, step_bytes: int, steps: int, outer: list[UOp]) -> int:
  """The column tiles (of `count`, 0 where the column is no whole tiles) packed together where the pack is each
  value's own of the ranges `outer` (outside the row, `per_outer_value`: an NCHW image) and a tile's step is
  narrower than STEP_RUN_BYTES: as many as make a step's columns that long, where the column is whole blocks of them
  and their packs (`step_bytes` a step for one tile) fit TILES_PACK_BYTES; else 1."""
  block = STEP_RUN_BYTES // (columns * max(max(4, load.dtype.itemsize) for load in packed))
  if block < 2 or not count or count % block or steps * step_bytes * block > TILES_PACK_BYTES: return 1
  return block if per_outer_value(packed, outer) else 1


def per_outer_value(packed: tuple[UOp, ...], outer: list[UOp]) -> bool:
  """Whether a register tile's pack is each value's own of the ranges `outer` (outside its row: an NCHW
  convolution's image), so that every such value packs it again."""
  return any(rng in load.src[1].toposort for load in packed for rng in outer)


def reads_across_rows(load: UOp, row: UOp, column: UOp, steps: UOp) -> bool:
  """Whether `load` is a register tile's row operand read across its rows: linear, along the row (stride 1), not
  along the column, and a line or more apart from one reduce step to the next (`x.T @ g`'s x). Such an operand is
  copied per panel (ROW_PACK_PAD) or whole first (lower/schedule.py `relayout`)."""
  strides, other = linear_strides(load.src[1])
  return not other and column not in strides and strides.get(row) == 1 and \
      abs(strides.get(steps, 0)) * load.dtype.itemsize >= LINE_BYTES


def _row_packed(loads: list[UOp], row: UOp, column: UOp, steps: UOp) -> tuple[UOp, ...]:
  """The row operand's loads that a panel of every column tile copies (ROW_PACK_PAD, `reads_across_rows`)."""
  return tuple(load for load in loads if reads_across_rows(load, row, column, steps))


def _in_place(packed: tuple[UOp, ...], outer: list[UOp], reduce_ranges: list[UOp], columns: int) -> bool:
  """Whether a column tile's reduce steps of the would-be packed operand are read in place (see IN_PLACE_BYTES):
  it depends on a global range outside the row (`outer`), its index is linear in one reduce range, and that range's
  steps of `columns` values fit IN_PLACE_BYTES and spread over the L1 sets."""
  if len(reduce_ranges) != 1: return False
  (steps_range,) = reduce_ranges
  steps = steps_range.src[0].arg
  for load in packed:
    strides, other = linear_strides(load.src[1])
    if other or not any(rng in strides for rng in outer): return False
    width, stride = columns * load.dtype.itemsize, strides.get(steps_range, 0) * load.dtype.itemsize
    if steps * width > IN_PLACE_BYTES or stride % LINE_BYTES or width % STEP_RUN_BYTES: return False
    lines: dict[int, int] = {}
    for step in range(steps):
      for line in range(width // LINE_BYTES):
        where = (step * stride // LINE_BYTES + line) % L1_SETS
        lines[where] = lines.get(where, 0) + 1
    if max(lines.values()) > IN_PLACE_WAYS: return False
  return True


def _dot_plan(reduce: UOp, column: UOp, global_ranges: list[UOp], loads: list[UOp],
              reduce_ranges: list[UOp]) -> TilePlan | None:
  """A contraction whose loads are all contiguous along its one reduce range (`g @ w.T`: both operands read along
  the reduction): a dot_rows x dot_columns tile of output elements whose reduce loop is the vectorised loop of the
  plain nest, with a vector of partial sums per element; each loaded vector is used by a whole row or column of the
  tile. None when no load is shared along both a row and the column."""
  if len(reduce_ranges) != 1 or reduce.arg is not Ops.ADD or reduce_ranges[0].src[0].arg < DOT_MIN_REDUCE: return None
  if reduce.dtype.kind not in "fiu" and reduce.dtype != BF16: return None
  uses_column = [column in load.src[1].toposort for load in loads]  # some loads are shared along the column
  if all(uses_column) or not any(uses_column): return None
  geometry = tile_geometry()
  tall, wide = geometry.dot_rows, geometry.dot_columns
  rows = [rng for rng in reversed(global_ranges[:-1]) if rng.src[0].arg >= DOT_MIN_ROWS and
          any(rng not in load.src[1].toposort for load in loads)]
  if not rows or rows[0] is not global_ranges[-2] or column.src[0].arg < DOT_MIN_ROWS: return None
  wide = min(wide, column.src[0].arg)
  row = rows[0]
  whole_tiles = column.src[0].arg % (geometry.vector_bytes // _accumulator_bytes(reduce) * geometry.tile_vectors) == 0
  packed_whole = reduce_ranges[0].src[0].arg % geometry.transpose_lanes == 0 and \
      all(load.dtype == F32 for load in loads) and \
      (column.src[0].arg >= DOT_PACKED_COLUMNS or row is not global_ranges[0])
  if whole_tiles and (row.src[0].arg >= DOT_MAX_ROWS or row.src[0].arg >= DOT_PACKED_ROWS and packed_whole):
    return None  # the register tile instead, w packed (or copied by lower/ where it can't be)
  opts = (("dot", column.arg[0], wide), ("upcast", row.arg[0], tall))
  grain = tall if row is global_ranges[0] else 1
  return TilePlan(reduce, column, row, wide, False, tall, 1, _contracts(reduce), opts, grain, dot=True)


def transpose_block(ast: UOp, enabled: bool = not NOOPT) -> int:
  """TRANSPOSE_BLOCK for an elementwise kernel over (rows, columns) that stores along its columns and reads some
  load across them (a stride of a cache line or more: a transpose, a layout change), else 0. Its loops then run in
  blocks of that many rows and columns, so that the lines a block reads along its rows are still in L1 when the next
  rows of the block use them: a 4096x4096 float32 transpose read one element per line (and per page) per step."""
  if not enabled: return 0
  nodes = ast.toposort
  ranges = global_ranges_of(ast)
  if len(ranges) != 2 or any(node.op is Ops.REDUCE for node in nodes): return 0
  row, column = ranges
  if row.src[0].op is not Ops.CONST or column.src[0].op is not Ops.CONST: return 0
  if min(row.src[0].arg, column.src[0].arg) < 2 * TRANSPOSE_BLOCK: return 0
  if any(node.op is Ops.STORE and _stride(node.src[1], column) != 1 for node in nodes): return 0
  strides = [_stride(node.src[1], column) for node in nodes if node.op is Ops.LOAD]
  return TRANSPOSE_BLOCK if any(s is not None and abs(s) * 4 >= 64 for s in strides) else 0


def applied_opts(ast: UOp, enabled: bool = not NOOPT) -> tuple[Opt, ...]:
  """The optimisations `choose_opts` applies to a kernel, as data (empty for the plain nest)."""
  plan = choose_opts(ast, enabled)
  if plan is None: return (("transpose", TRANSPOSE_BLOCK),) if transpose_block(ast, enabled) else ()
  return plan.opts


def launch_grain(ast: UOp, enabled: bool = not NOOPT) -> int:
  """How many consecutive iterations of the kernel's outermost loop a launch chunk must keep together (chunks start
  at multiples of it): the tile's height when the tiled row is outermost, its width when the column is, else 1."""
  plan = choose_opts(ast, enabled)
  return (transpose_block(ast, enabled) or 1) if plan is None else plan.grain
