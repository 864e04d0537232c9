"""A shape-generic float32 matrix product, compiled once per machine (devices/cpu.py: by the compile worker after the
runtime, kept in the disk cache): the first tier of a kernel whose contraction it can do (`library_call`, llvm.py
`render_library_gemm`) calls it instead of carrying its own copy of the register-tiled loops, so that a new matrix
shape costs LLVM the kernel's epilogue only while its own loops compile in the background (devices/cpu.py
`CompileStream`).

    void tj_sgemm(i64 M, i64 N, i64 K, ptr A, i64 am, i64 ak, ptr B, i64 bk, i64 bn, ptr C, i64 cm)

stores C[m * cm + n] = sum over k < K of A[m * am + k * ak] * B[k * bk + n * bn], for m < M and n < N (strides in
elements, any sign; M, N, K >= 1; C does not overlap A or B). It is the register tile of opt.py for the host's
vectors (`tile_geometry`: AVX2 6 x 16, AVX-512 6 x 64): for each panel of `columns` columns, B's values for every
step are packed into a contiguous array on the stack (K x columns float32: the caller keeps that within
opt.PACK_BYTES), the last panel padded with zeros; for each tile of `rows` rows (the last one repeating the last row),
the sums run in float32 vector registers over blocks of `block` steps, each block added into the tile's sums (float32
for a few blocks, else float64, as the kernels' own tiles do), which are rounded to float32 and stored (a partial
panel element by element). A row of A is read in place, one broadcast value per row and step: any strides, so a
transposed A costs no copy.

The same module defines the first tier of a transposing copy (a kernel of opt.py `transpose_block`: the copies that
lay out a contraction's operand, lower/schedule.py `relayout`), `library_copy`:

    void tj_copy32(i64 R, i64 C, ptr src, i64 sr, i64 sc, ptr dst, i64 dr)

stores dst[r * dr + c] = src[r * sr + c * sc] for r < R and c < C, 32-bit values, in blocks of COPY_BLOCK x
COPY_BLOCK (its own loops' 8 x 8 register transposes took 40-47 ms of LLVM for each such copy).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tinyjax.codegen.opt import (F32, PACK_BYTES, PACK_MIN_ROWS, TilePlan, global_ranges_of, tile_geometry,
                                 transpose_block)
from tinyjax.lower import symbolic
from tinyjax.uop import Ops, UOp

SYMBOL = "tj_sgemm"
SIGNATURE = "void @tj_sgemm(i64, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64)"
COPY_SYMBOL = "tj_copy32"
COPY_SIGNATURE = "void @tj_copy32(i64, i64, ptr, i64, i64, ptr, i64)"
SYMBOLS = (SYMBOL, COPY_SYMBOL)  # (what the library module defines)
COPY_BLOCK = 32


def library_ir(lanes: int, vectors: int, rows: int, block: int, float32_blocks: int, fma: bool = True) -> str:
  """The IR of `tj_sgemm` (above) for tiles of `rows` rows x `vectors` vectors of `lanes` float32 values, its
  float32 sums added up every `block` steps: in float32 where there are at most `float32_blocks` blocks, else in
  float64 (as a kernel's own register tile does, llvm.py FLOAT32_BLOCKS); each product and its sum one `llvm.fma`
  where the host has FMA (`fma`, as a kernel's own tile, llvm.py `fused_product`), else a `contract`ed multiply and
  add."""
  columns = lanes * vectors
  vf = f"<{lanes} x float>"
  align = min(64, lanes * 4)
  out = [
    f"define void @{SYMBOL}(i64 %M, i64 %N, i64 %K, ptr noalias %A, i64 %am, i64 %ak, ptr noalias %B, i64 %bk, "
    f'i64 %bn, ptr noalias %C, i64 %cm) nounwind "prefer-vector-width"="{lanes * 32}" {{',
    "entry:",
    f"  %packed = mul nsw i64 %K, {columns}",
    "  %pack = alloca float, i64 %packed, align 64",
    f"  %sums = alloca [{rows * columns} x double], align 64",
    f"  %sums32 = alloca [{rows * columns} x float], align 64",
    f"  %few = icmp sle i64 %K, {block * float32_blocks}",
    "  %mlast = sub nsw i64 %M, 1",
    "  br label %panel",
    # ---- a panel of `columns` columns: pack B's values for it, then its row tiles
    "panel:",
    "  %n0 = phi i64 [ 0, %entry ], [ %n0.next, %panel.next ]",
    "  %panel.more = icmp slt i64 %n0, %N",
    "  br i1 %panel.more, label %panel.body, label %exit",
    "panel.body:",
    "  %nleft = sub nsw i64 %N, %n0",
    f"  %nr = call i64 @llvm.smin.i64(i64 %nleft, i64 {columns})",
    f"  %whole = icmp eq i64 %nr, {columns}",
    "  %unit = icmp eq i64 %bn, 1",
    "  %contiguous = and i1 %whole, %unit",
    "  %bcol = mul nsw i64 %n0, %bn",
    "  %bbase = getelementptr float, ptr %B, i64 %bcol",
    "  br i1 %contiguous, label %packv, label %packs",
    # (a whole panel of contiguous columns: vector copies)
    "packv:",
    "  %kv = phi i64 [ 0, %panel.body ], [ %kv.next, %packv ]",
    "  %kv.row = mul nsw i64 %kv, %bk",
    "  %kv.src = getelementptr float, ptr %bbase, i64 %kv.row",
    f"  %kv.at = mul nsw i64 %kv, {columns}",
    "  %kv.dst = getelementptr float, ptr %pack, i64 %kv.at",
  ]
  for v in range(vectors):
    out += [f"  %kv.s{v} = getelementptr float, ptr %kv.src, i64 {v * lanes}",
            f"  %kv.x{v} = load {vf}, ptr %kv.s{v}, align 4",
            f"  %kv.d{v} = getelementptr float, ptr %kv.dst, i64 {v * lanes}",
            f"  store {vf} %kv.x{v}, ptr %kv.d{v}, align {align}"]
  out += [
    "  %kv.next = add nsw i64 %kv, 1",
    "  %kv.more = icmp slt i64 %kv.next, %K",
    "  br i1 %kv.more, label %packv, label %tiles.start",
    # (strided or partial: element by element, zeros past the last column)
    "packs:",
    "  %ks = phi i64 [ 0, %panel.body ], [ %ks.next, %packs.latch ]",
    "  %ks.row = mul nsw i64 %ks, %bk",
    f"  %ks.at = mul nsw i64 %ks, {columns}",
    "  br label %packj",
    "packj:",
    "  %j = phi i64 [ 0, %packs ], [ %j.next, %packj.latch ]",
    "  %j.in = icmp slt i64 %j, %nr",
    "  br i1 %j.in, label %packj.load, label %packj.latch",
    "packj.load:",
    "  %j.col = mul nsw i64 %j, %bn",
    "  %j.off = add nsw i64 %ks.row, %j.col",
    "  %j.src = getelementptr float, ptr %bbase, i64 %j.off",
    "  %j.value = load float, ptr %j.src, align 4",
    "  br label %packj.latch",
    "packj.latch:",
    "  %j.packed = phi float [ %j.value, %packj.load ], [ 0.0, %packj ]",
    "  %j.at = add nsw i64 %ks.at, %j",
    "  %j.dst = getelementptr float, ptr %pack, i64 %j.at",
    "  store float %j.packed, ptr %j.dst, align 4",
    "  %j.next = add nsw i64 %j, 1",
    f"  %j.more = icmp slt i64 %j.next, {columns}",
    "  br i1 %j.more, label %packj, label %packs.latch",
    "packs.latch:",
    "  %ks.next = add nsw i64 %ks, 1",
    "  %ks.more = icmp slt i64 %ks.next, %K",
    "  br i1 %ks.more, label %packs, label %tiles.start",
    "tiles.start:",
    "  br label %tile",
  ]
  out += _tiles(lanes, vectors, rows, block, fma)
  out += [
    "panel.next:",
    f"  %n0.next = add nsw i64 %n0, {columns}",
    "  br label %panel",
    "exit:",
    "  ret void",
    "}",
    "",
    *_copy_ir(),
    "",
    "declare i64 @llvm.smin.i64(i64, i64)",
    "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)",
    f"declare {vf} @llvm.fma.v{lanes}f32({vf}, {vf}, {vf})",
    "",
  ]
  return "\n".join(out)


def _copy_ir() -> list[str]:
  """`tj_copy32` (the module docstring): blocks of COPY_BLOCK rows x columns, a row of the block at a time (the
  block's lines of a transposed source stay in L1 across its rows)."""
  b = COPY_BLOCK
  return [
    f"define void @{COPY_SYMBOL}(i64 %R, i64 %C, ptr noalias %src, i64 %sr, i64 %sc, ptr noalias %dst, i64 %dr) "
    "nounwind {",
    "entry:",
    "  br label %rblock",
    "rblock:",
    "  %r0 = phi i64 [ 0, %entry ], [ %r0.next, %rblock.next ]",
    "  %r.more0 = icmp slt i64 %r0, %R",
    "  br i1 %r.more0, label %rblock.body, label %exit",
    "rblock.body:",
    f"  %r0.end = add nsw i64 %r0, {b}",
    "  %r1 = call i64 @llvm.smin.i64(i64 %r0.end, i64 %R)",
    "  br label %cblock",
    "cblock:",
    "  %c0 = phi i64 [ 0, %rblock.body ], [ %c0.next, %cblock.next ]",
    "  %c.more0 = icmp slt i64 %c0, %C",
    "  br i1 %c.more0, label %cblock.body, label %rblock.next",
    "cblock.body:",
    f"  %c0.end = add nsw i64 %c0, {b}",
    "  %c1 = call i64 @llvm.smin.i64(i64 %c0.end, i64 %C)",
    "  br label %row",
    "row:",
    "  %r = phi i64 [ %r0, %cblock.body ], [ %r.next, %row.next ]",
    "  %r.src = mul nsw i64 %r, %sr",
    "  %r.dst = mul nsw i64 %r, %dr",
    "  br label %column",
    "column:",
    "  %c = phi i64 [ %c0, %row ], [ %c.next, %column ]",
    "  %c.src = mul nsw i64 %c, %sc",
    "  %s.at = add nsw i64 %r.src, %c.src",
    "  %s.p = getelementptr i32, ptr %src, i64 %s.at",
    "  %value = load i32, ptr %s.p, align 4",
    "  %d.at = add nsw i64 %r.dst, %c",
    "  %d.p = getelementptr i32, ptr %dst, i64 %d.at",
    "  store i32 %value, ptr %d.p, align 4",
    "  %c.next = add nsw i64 %c, 1",
    "  %c.more = icmp slt i64 %c.next, %c1",
    "  br i1 %c.more, label %column, label %row.next",
    "row.next:",
    "  %r.next = add nsw i64 %r, 1",
    "  %r.more = icmp slt i64 %r.next, %r1",
    "  br i1 %r.more, label %row, label %cblock.next",
    "cblock.next:",
    f"  %c0.next = add nsw i64 %c0, {b}",
    "  br label %cblock",
    "rblock.next:",
    f"  %r0.next = add nsw i64 %r0, {b}",
    "  br label %rblock",
    "exit:",
    "  ret void",
    "}",
  ]


# A kernel calls the library where its tile plan is a register tile of a float32 product of two loads over one
# reduce range (not a dot tile, AMX, a convolution's window, or panels of a sum too long for one pack), over its (row,
# column) ranges, or ranges outside them (a batch, the column tiles of lower/schedule.py `_split_columns`, both): one
# call per value of those, all rows, or, where there are none, per block of a launch chunk's rows. Its own loops sum
# each element in the same order (float32 blocks of opt.CONTRACTION_SUM_BLOCK steps, added in float32 up to
# llvm.FLOAT32_BLOCKS of them, else in float64), so that its two tiers agree bit for bit. A
# kernel that stores the product as it is (a float32 output, contiguous along its columns) has the library write it
# there; else the library writes a launch chunk's products into an array on the stack (at most SCRATCH_BYTES: the rows
# a call takes where the kernel is launched over its rows), which the kernel's epilogue reads instead of the sums (the
# output may be where the epilogue reads, as in an update of the weights in place).
SCRATCH_BYTES = 256 << 10
# ... and where its sum has at least MIN_STEPS steps, or the whole product at most SMALL_PRODUCT multiply-adds: a tile's
# zeroing, block flush and stores through memory cost too much beside a short sum (a PINN's (2048 x 64) @ (64 x 64):
# 0.37-0.41 ms against its own loops' 0.21-0.22), but not in absolute terms for a small product (the MLP's
# (512 x 10) @ (10 x 512) gradient, whose own loops take 80 ms of LLVM).
MIN_STEPS = 128
SMALL_PRODUCT = 1 << 22


@dataclass(frozen=True)
class Operand:
  """A load of the library's A or B: its buffer, its index's constant, and its strides along the ranges it reads."""
  buffer: UOp
  offset: int
  strides: dict[UOp, int]


@dataclass(frozen=True)
class LibraryCall:
  """How a kernel calls `tj_sgemm` (`library_call`)."""
  reduce: UOp             # the kernel's REDUCE, whose value the library computes
  a: Operand              # the load along the row and the reduce range
  b: Operand              # the load along the reduce range and the column (and the ranges outside the row)
  row: UOp
  column: UOp
  outer: tuple[UOp, ...]  # the global ranges outside the row (a call per value of them), or () (launched over rows)
  rows: int               # rows per call (all of them where there are ranges outside)
  out: Operand | None     # the STORE the library writes, where it stores the product as it is (else an epilogue)


def _operand(load: UOp, allowed: set[UOp]) -> Operand | None:
  terms, offset = symbolic.linear_form(load.src[1])
  if not set(terms) <= allowed: return None
  return Operand(load.src[0], offset, terms)


def library_call(ast: UOp, plan: TilePlan | None) -> LibraryCall | None:
  """How kernel `ast` with tile plan `plan` calls the library, or None where it keeps its own loops (see above)."""
  if plan is None or plan.stream or plan.dot or plan.amx or plan.row is None or plan.panel or plan.row_packed or \
      plan.spans or plan.chunk: return None
  reduce, row, column = plan.reduce, plan.row, plan.column
  if reduce.arg is not Ops.ADD or reduce.dtype != F32 or len(reduce.src) != 2: return None
  (value, steps), ranges = reduce.src, global_ranges_of(ast)
  if value.op is not Ops.MUL or any(load.op is not Ops.LOAD or load.dtype != F32 or len(load.src) != 2
                                    for load in value.src): return None
  if ranges[-2:] != [row, column]: return None
  outer = tuple(ranges[:-2])
  first, second = value.src
  if row not in first.src[1].toposort: first, second = second, first
  a = _operand(first, {row, steps, *outer})
  b = _operand(second, {steps, column, *outer})
  geometry = tile_geometry()
  lanes = geometry.vector_bytes // 4
  size = steps.src[0].arg
  if a is None or b is None or size > PACK_BYTES // (lanes * geometry.tile_vectors * 4) or \
      size < MIN_STEPS and math.prod(rng.src[0].arg for rng in ranges) * size > SMALL_PRODUCT: return None
  width, height = column.src[0].arg, row.src[0].arg
  if outer:  # (a call per value of the ranges outside: all rows, at least PACK_MIN_ROWS to share B's pack)
    if height * width * 4 > SCRATCH_BYTES or height < PACK_MIN_ROWS: return None
    rows = height
  else:  # (a call per block of a launch chunk's rows)
    rows = SCRATCH_BYTES // (4 * width) // geometry.tile_rows * geometry.tile_rows
    if rows < geometry.tile_rows: return None
  (store,) = [node for node in ast.src if node.op is Ops.STORE]
  out = _operand(store, {row, column, *outer}) \
      if store.src[2] is reduce and store.dtype == F32 else None
  return LibraryCall(reduce, a, b, row, column, outer, min(rows, height), out if out and out.strides.get(column) == 1
                     else None)


@dataclass(frozen=True)
class LibraryCopy:
  """How a transposing copy kernel calls `tj_copy32` (`library_copy`): over its launch chunk of rows."""
  src: Operand
  dst: Operand
  row: UOp
  column: UOp


def library_copy(ast: UOp, plan: TilePlan | None) -> LibraryCopy | None:
  """How kernel `ast` (no tile plan) calls `tj_copy32`, or None: only a kernel of opt.py `transpose_block` that
  copies 32-bit values as they are, `dst[row, column] = src[...]` at linear indices, its store contiguous along the
  column."""
  if plan is not None or not transpose_block(ast): return None
  stores = [node for node in ast.src if node.op is Ops.STORE]
  if len(stores) != 1 or len(ast.src) != 1: return None
  (store,) = stores
  load = store.src[2]
  if load.op is not Ops.LOAD or len(load.src) != 2 or load.dtype != store.dtype or load.dtype.itemsize != 4:
    return None
  row, column = global_ranges_of(ast)
  src, dst = _operand(load, {row, column}), _operand(store, {row, column})
  if src is None or dst is None or dst.strides.get(column) != 1: return None
  return LibraryCopy(src, dst, row, column)


def _tiles(lanes: int, vectors: int, rows: int, block: int, fma: bool) -> list[str]:
  """The row tiles of a packed panel (`library_ir`): their block sums added up in the float32 array `%sums32` where
  there are few blocks (`%few`), else in the float64 array `%sums`. Only the steps and the blocks' sums are unrolled
  (rows x vectors registers); the sums are zeroed and stored in loops over the rows."""
  columns = lanes * vectors
  vf, vd = f"<{lanes} x float>", f"<{lanes} x double>"
  align = min(64, lanes * 4)
  tiles = [(r, v) for r in range(rows) for v in range(vectors)]
  out = [
    # ---- a tile of `rows` rows (past the last row: the last row again, not stored)
    "tile:",
    "  %mt = phi i64 [ 0, %tiles.start ], [ %mt.next, %tile.stored ]",
    "  %tile.more = icmp slt i64 %mt, %M",
    "  br i1 %tile.more, label %tile.body, label %panel.next",
    "tile.body:",
  ]
  for r in range(rows):
    out += [f"  %m{r} = add nsw i64 %mt, {r}",
            f"  %mc{r} = call i64 @llvm.smin.i64(i64 %m{r}, i64 %mlast)",
            f"  %ad{r} = sub nsw i64 %mc{r}, %mt",
            f"  %ao{r} = mul nsw i64 %ad{r}, %am",
            f"  %rb{r} = shl nsw i64 %ao{r}, 2"]  # (row r's offset from the tile's first row, in bytes)
  out += ["  %at = mul nsw i64 %mt, %am", "  %a.tile = getelementptr float, ptr %A, i64 %at",
          "  %akb = shl nsw i64 %ak, 2",
          f"  call void @llvm.memset.p0.i64(ptr align 64 %sums, i8 0, i64 {rows * columns * 8}, i1 false)",
          f"  call void @llvm.memset.p0.i64(ptr align 64 %sums32, i8 0, i64 {rows * columns * 4}, i1 false)",
          "  br label %block",
          "block:",
          "  %kb = phi i64 [ 0, %tile.body ], [ %kb.next, %block.next ]",
          "  %block.more = icmp slt i64 %kb, %K",
          "  br i1 %block.more, label %block.body, label %tile.store",
          "block.body:",
          "  %kb.off = mul nsw i64 %kb, %ak",
          "  %ka.first = getelementptr float, ptr %a.tile, i64 %kb.off",
          f"  %kb.end0 = add nsw i64 %kb, {block}",
          "  %kb.end = call i64 @llvm.smin.i64(i64 %kb.end0, i64 %K)",
          "  br label %step",
          # ---- one step: the panel's vectors, a broadcast value per row, rows x vectors multiply-adds
          "step:",
          "  %k = phi i64 [ %kb, %block.body ], [ %k.next, %step ]",
          "  %ka = phi ptr [ %ka.first, %block.body ], [ %ka.next, %step ]"]  # (row 0's value at step k)
  out += [f"  %c{r}_{v} = phi {vf} [ zeroinitializer, %block.body ], [ %c{r}_{v}.n, %step ]" for r, v in tiles]
  out += ["  %k.at = mul nsw i64 %k, " + str(columns)]
  for v in range(vectors):
    out += [f"  %k.at{v} = add nsw i64 %k.at, {v * lanes}",
            f"  %bp{v} = getelementptr inbounds float, ptr %pack, i64 %k.at{v}",
            f"  %b{v} = load {vf}, ptr %bp{v}, align {align}"]
  for r in range(rows):
    out += [f"  %ap{r} = getelementptr i8, ptr %ka, i64 %rb{r}",
            f"  %av{r} = load float, ptr %ap{r}, align 4",
            f"  %ai{r} = insertelement {vf} poison, float %av{r}, i64 0",
            f"  %as{r} = shufflevector {vf} %ai{r}, {vf} poison, <{lanes} x i32> zeroinitializer"]
    for v in range(vectors):
      if fma:
        out.append(f"  %c{r}_{v}.n = call {vf} @llvm.fma.v{lanes}f32({vf} %as{r}, {vf} %b{v}, {vf} %c{r}_{v})")
        continue
      out += [f"  %p{r}_{v} = fmul contract {vf} %as{r}, %b{v}",
              f"  %c{r}_{v}.n = fadd contract {vf} %c{r}_{v}, %p{r}_{v}"]
  out += ["  %ka.next = getelementptr i8, ptr %ka, i64 %akb",
          "  %k.next = add nsw i64 %k, 1",
          "  %k.more = icmp slt i64 %k.next, %kb.end",
          "  br i1 %k.more, label %step, label %block.flush",
          "block.flush:",  # (the block's float32 sums added into the tile's)
          "  br i1 %few, label %flush32, label %flush64",
          "flush32:"]
  for r, v in tiles:
    out += [f"  %y{r}_{v} = getelementptr inbounds float, ptr %sums32, i64 {r * columns + v * lanes}",
            f"  %g{r}_{v} = load {vf}, ptr %y{r}_{v}, align {align}",
            f"  %h{r}_{v} = fadd {vf} %g{r}_{v}, %c{r}_{v}.n",
            f"  store {vf} %h{r}_{v}, ptr %y{r}_{v}, align {align}"]
  out += ["  br label %block.next", "flush64:"]
  for r, v in tiles:
    out += [f"  %w{r}_{v} = fpext {vf} %c{r}_{v}.n to {vd}",
            f"  %z{r}_{v} = getelementptr inbounds double, ptr %sums, i64 {r * columns + v * lanes}",
            f"  %o{r}_{v} = load {vd}, ptr %z{r}_{v}, align 64",
            f"  %s{r}_{v} = fadd {vd} %o{r}_{v}, %w{r}_{v}",
            f"  store {vd} %s{r}_{v}, ptr %z{r}_{v}, align 64"]
  out += ["  br label %block.next",
          "block.next:",
          f"  %kb.next = add nsw i64 %kb, {block}",
          "  br label %block",
          # ---- the tile's rows that exist: whole vectors, or a partial panel's columns one by one
          "tile.store:",
          "  %rows.left = sub nsw i64 %M, %mt",
          f"  %rows = call i64 @llvm.smin.i64(i64 %rows.left, i64 {rows})",
          "  br label %row",
          "row:",
          "  %r = phi i64 [ 0, %tile.store ], [ %r.next, %row.done ]",
          "  %m = add nsw i64 %mt, %r",
          "  %co = mul nsw i64 %m, %cm",
          "  %cn = add nsw i64 %co, %n0",
          "  %cp = getelementptr float, ptr %C, i64 %cn",
          f"  %rs = mul nsw i64 %r, {columns}",
          "  br i1 %whole, label %row.vectors, label %row.scalars",
          "row.vectors:"]
  for v in range(vectors):
    out += [f"  %zo{v} = add nsw i64 %rs, {v * lanes}",
            f"  %zw{v} = getelementptr inbounds double, ptr %sums, i64 %zo{v}",
            f"  %tw{v} = load {vd}, ptr %zw{v}, align 64",
            f"  %fw{v} = fptrunc {vd} %tw{v} to {vf}",
            f"  %zn{v} = getelementptr inbounds float, ptr %sums32, i64 %zo{v}",
            f"  %fn{v} = load {vf}, ptr %zn{v}, align {align}",
            f"  %f{v} = select i1 %few, {vf} %fn{v}, {vf} %fw{v}",
            f"  %q{v} = getelementptr float, ptr %cp, i64 {v * lanes}",
            f"  store {vf} %f{v}, ptr %q{v}, align 4"]
  out += ["  br label %row.done",
          "row.scalars:",
          "  %e = phi i64 [ 0, %row ], [ %e.next, %row.scalars ]",
          "  %e.at = add nsw i64 %rs, %e",
          "  %e.w = getelementptr inbounds double, ptr %sums, i64 %e.at",
          "  %e.wide = load double, ptr %e.w, align 8",
          "  %e.rounded = fptrunc double %e.wide to float",
          "  %e.n = getelementptr inbounds float, ptr %sums32, i64 %e.at",
          "  %e.narrow = load float, ptr %e.n, align 4",
          "  %e.value = select i1 %few, float %e.narrow, float %e.rounded",
          "  %e.dst = getelementptr float, ptr %cp, i64 %e",
          "  store float %e.value, ptr %e.dst, align 4",
          "  %e.next = add nsw i64 %e, 1",
          "  %e.more = icmp slt i64 %e.next, %nr",
          "  br i1 %e.more, label %row.scalars, label %row.done",
          "row.done:",
          "  %r.next = add nsw i64 %r, 1",
          "  %r.more = icmp slt i64 %r.next, %rows",
          "  br i1 %r.more, label %row, label %tile.stored",
          "tile.stored:",
          f"  %mt.next = add nsw i64 %mt, {rows}",
          "  br label %tile"]
  return out
