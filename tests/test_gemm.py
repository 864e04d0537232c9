"""Kernel optimisations of codegen/opt.py (reduce outside, register tiles for contractions, stream tiles for sums
over an outer axis) against numpy and against the plain loop nest of the same AST: odd shapes (tails in every
direction), dtypes, epilogues, thread chunks that are no multiple of a tile, and the kernels they must not touch."""
from __future__ import annotations

import ctypes
import os
import re

import numpy as np
import pytest
from test_codegen import (BF16, BOOL, F16, F32, F64, add, alu, assert_same, buffer, cast, compile_kernel, const,
                          global_range, kernel, load, mul, optimized_module, outer_bound, reduce, reduce_range, sample,
                          store, target_machine)

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax.array import Array
from tinyjax.codegen import llvm
from tinyjax.codegen.llvm import FLOAT32_BLOCKS, SUM_BLOCK, render_llvm
from tinyjax.codegen.opt import (CONTRACTION_SUM_BLOCK, DOT_MIN_REDUCE, GROUP_MIN_BLOCKS, GROUP_ROWS, PACK_BYTES,
                                 PACK_MIN_ROWS, PANEL_BYTES, PANEL_GROUP_ROWS, STREAM_TILE, TILE_SUM_BLOCK,
                                 TRANSPOSE_BLOCK, applied_opts, choose_opts, geometry_for, global_ranges_of,
                                 launch_grain, tile_geometry)
from tinyjax.devices.cpu import VECTOR_REGISTERS
from tinyjax.lower.schedule import kernels_of
from tinyjax.trace.core import bind
from tinyjax.uop import Ops, UOp

I32 = np.dtype(np.int32)
# The plans below are stated for AVX-512's register tiles (codegen/opt.py `geometry_for`), whatever the host has
# (`avx512_tiles`; tests/test_tile_geometry.py runs kernels of each geometry)
pytestmark = pytest.mark.usefixtures("avx512_tiles")
GEOMETRY = geometry_for(*VECTOR_REGISTERS["avx512"])
TILE_ROWS, WINDOW_TILE_ROWS, VECTOR_BYTES = GEOMETRY.tile_rows, GEOMETRY.window_tile_rows, GEOMETRY.vector_bytes


def run_kernel(ast: UOp, buffers: list[np.ndarray], optimize: bool, start: int = 0, end: int | None = None) -> None:
  """Render (with or without the opts), compile and run `ast` over outer iterations [start, end)."""
  function = compile_kernel(render_llvm("kernel", ast, optimize=optimize))
  addresses = [b.ctypes.data for b in buffers]
  function((ctypes.c_void_p * len(addresses))(*addresses), start, outer_bound(ast) if end is None else end)


def matmul_kernel(m: int, k: int, n: int, dtype: np.dtype, epilogue=None, reduce_op: Ops = Ops.ADD) -> UOp:
  """out[i, j] = epilogue(reduce_k a[i, k] * b[k, j], j), the kernel lower/ makes of a @ b (+ a bias)."""
  dtype = np.dtype(dtype)
  rows, cols, red = global_range(0, m), global_range(1, n), reduce_range(2, k)
  a_element = load(buffer(1, dtype), add(mul(rows, const(k)), red))
  b_element = load(buffer(2, dtype), add(mul(red, const(n)), cols))
  product = mul(a_element, b_element)
  result = reduce(reduce_op, product, red)
  if epilogue is not None: result = epilogue(result, cols)
  return kernel(store(buffer(0, dtype), add(mul(rows, const(n)), cols), result))


def column_reduce_kernel(op: Ops, dtype: np.dtype, rows: int, cols: int) -> UOp:
  """out[j] = reduce_i x[i, j]: x.sum(axis=0) and friends."""
  col, red = global_range(0, cols), reduce_range(1, rows)
  return kernel(store(buffer(0, dtype), col, reduce(op, load(buffer(1, dtype), add(mul(red, const(cols)), col)), red)))


def matmul_inputs(m: int, k: int, n: int, dtype: np.dtype, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  if dtype == I32: return rng.integers(-50, 50, (m, k)).astype(dtype), rng.integers(-50, 50, (k, n)).astype(dtype)
  return rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)


TOLERANCE = {F32: 1e-5, F64: 1e-12, F16: 2e-3, BF16: 1e-2, I32: 0.0}


# ---------------------------------------------------------------------------------------------------------------------
# which kernels get which opts

def test_matmul_gets_a_register_tile():
  opts = applied_opts(matmul_kernel(64, 64, 64, F32))
  assert ("reduce_outside", 2) in opts and ("upcast", 1, 64) in opts and ("upcast", 0, TILE_ROWS) in opts


def test_column_sum_gets_a_stream_tile():
  """A column sum too big for the caches streams its rows through a memory array of sums; one whose operand stays
  resident (RESIDENT_BYTES, an RNN step's h @ W) keeps its sums in registers, a column tile at a time."""
  from tinyjax.codegen.opt import RESIDENT_BYTES
  assert applied_opts(column_reduce_kernel(Ops.ADD, F32, 4096, 1024)) == \
      (("reduce_outside", 1), ("tile", 0, STREAM_TILE))
  assert 64 * 1024 * 4 <= RESIDENT_BYTES
  assert applied_opts(column_reduce_kernel(Ops.ADD, F32, 64, 1024)) == (("reduce_outside", 1), ("upcast", 0, 64))
  values = (sample(F32, n=64 * 1024, seed=14) / 8).astype(F32)
  out = np.zeros(1024, F32)
  run_kernel(column_reduce_kernel(Ops.ADD, F32, 64, 1024), [out, values], True)
  np.testing.assert_allclose(out, values.reshape(64, 1024).astype(F64).sum(0), rtol=1e-5, atol=1e-5)


def test_narrow_column_sum_keeps_its_sums_in_registers():
  """At most one register tile of columns (a vector-matrix product, a bias gradient): the sums stay in registers,
  unless the epilogue has an operation without a vector form (sin), which the stream tile's column loop vectorises."""
  assert applied_opts(column_reduce_kernel(Ops.ADD, F32, 64, 64)) == (("reduce_outside", 1), ("upcast", 0, 64))
  col, red = global_range(0, 64), reduce_range(1, 64)
  total = reduce(Ops.ADD, load(buffer(1, F32), add(mul(red, const(64)), col)), red)
  sin_epilogue = kernel(store(buffer(0, F32), col, alu(Ops.SIN, total)))
  assert applied_opts(sin_epilogue) == (("reduce_outside", 1), ("tile", 0, STREAM_TILE))


@pytest.mark.parametrize("epilogue", ["exp2", "log2", "sqrt", "recip", "trunc", "bits", "tanh"])
def test_vector_epilogue_of_transcendentals_is_accurate(epilogue):
  """A register tile's epilogue runs on its accumulator vectors, float32 transcendentals included (transcendental.py
  emitting vectors): numpy's float64 values within the functions' accuracy (the scalar code's bits are checked
  exhaustively in test_transcendental.py; the vector code is the same operations lane by lane)."""
  from tinyjax.codegen.llvm import vector_epilogue_ok
  from tinyjax.codegen.opt import choose_opts
  import tinyjax.numpy as tnp
  rows, cols = 48, 64
  col, red = global_range(0, cols), reduce_range(1, rows)
  total = reduce(Ops.ADD, load(buffer(1, F32), add(mul(red, const(cols)), col)), red)
  magnitude = alu(Ops.MAX, total, alu(Ops.NEG, total))
  values = (sample(F32, n=rows * cols, seed=13) / 16).astype(F32)
  sums = values.reshape(rows, cols).astype(F64).sum(0)
  if epilogue == "tanh":  # the whole of jnp.tanh, lowered as jit lowers it: bitcasts, exp2, log2, divisions
    compiled = tj.jit(lambda v: tnp.tanh(v.sum(0))).lower(values.reshape(rows, cols))._compiled.schedule.schedule
    (only,) = compiled.kernels
    ast, want = only.ast, np.tanh(sums)
  else:
    u32 = np.dtype(np.uint32)
    bits = alu(Ops.AND, UOp(Ops.BITCAST, u32, (total,)), const(0x7FFFFFFF, u32))  # |x| through the sign bit
    value, want = {"exp2": (alu(Ops.EXP2, total), np.exp2(sums)),
                   "log2": (alu(Ops.LOG2, magnitude), np.log2(abs(sums))),
                   "sqrt": (alu(Ops.SQRT, magnitude), np.sqrt(abs(sums))), "recip": (alu(Ops.RECIP, total), 1 / sums),
                   "trunc": (alu(Ops.TRUNC, mul(total, const(8.0, F32))), np.trunc(sums * 8)),
                   "bits": (UOp(Ops.BITCAST, F32, (bits,)), abs(sums))}[epilogue]
    ast = kernel(store(buffer(0, F32), col, value))
  plan = choose_opts(ast)
  assert plan is not None and not plan.stream
  from tinyjax.codegen.linearize import free_ranges
  assert vector_epilogue_ok(plan, free_ranges(ast), ast)
  out, kernel_sums = np.zeros(cols, F32), np.zeros(cols, F32)
  run_kernel(ast, [out, values], True)
  np.testing.assert_allclose(out, want, rtol=3e-5, atol=1e-6)  # (the float32 sums differ from float64's)
  # against the function of the float32 sums the kernel computed (same plan, same order): the epilogue alone
  run_kernel(kernel(store(buffer(0, F32), col, total)), [kernel_sums, values], True)
  x = kernel_sums.astype(F64)
  exact = {"exp2": np.exp2(x), "log2": np.log2(abs(x)), "sqrt": np.sqrt(abs(x)), "recip": 1 / x,
           "trunc": np.trunc(kernel_sums * np.float32(8)), "bits": abs(x), "tanh": np.tanh(x)}[epilogue]
  ulps = {"exp2": 1, "log2": 1, "tanh": 4}.get(epilogue, 0.5)  # correctly rounded: sqrt, 1/x, trunc, bits
  assert (abs(out - exact) <= ulps * np.spacing(abs(exact).astype(F32)).astype(F64)).all()


def test_opts_off_when_disabled():
  assert applied_opts(matmul_kernel(64, 64, 64, F32), enabled=False) == ()
  assert "; opts: []" in render_llvm("kernel", matmul_kernel(8, 8, 8, F32), optimize=False)


def test_plain_nest_kept_where_it_is_right():
  i, k = global_range(0, 8), reduce_range(1, 16)
  x = load(buffer(1, F32), add(mul(i, const(16)), k))
  assert applied_opts(kernel(store(buffer(0, F32), i, reduce(Ops.ADD, x, k)))) == ()  # row reduction: stride 1
  two_reduces = kernel(store(buffer(0, F32), i, add(reduce(Ops.ADD, x, k), reduce(Ops.MAX, x, k))))
  assert applied_opts(two_reduces) == ()
  col, red = global_range(0, 8), reduce_range(1, 16)
  gated = load(buffer(1, F32), add(mul(red, const(8)), col), alu(Ops.CMPLT, col, const(5)))
  assert applied_opts(kernel(store(buffer(0, F32), col, reduce(Ops.ADD, gated, red)))) == ()
  elementwise = global_range(0, 100)
  assert applied_opts(kernel(store(buffer(0, F32), elementwise, load(buffer(1, F32), elementwise)))) == ()


def test_matmul_inner_loop_has_vector_fmas():
  """A register tile's products and sums are vector FMAs: `llvm.fma` calls where the host has FMA (so that its IR
  has no `contract` flag and computes the same bits unoptimised), else a `contract`ed multiply and add."""
  ir = render_llvm("kernel", matmul_kernel(256, 256, 256, F32))
  optimized = str(optimized_module(ir))
  if tile_geometry().fma:
    assert re.search(r"call <(8|16) x float> @llvm\.fma\.v(8|16)f32", ir) and " contract " not in ir
  else:
    assert re.search(r"fmul contract <(8|16) x float>", optimized) and re.search(r"fadd contract <(8|16) x float>",
                                                                                   optimized)
  assembly = target_machine().emit_assembly(optimized_module(ir))
  if tile_geometry().fma: assert re.search(r"vfmadd\d+ps\s+.*%[yz]mm", assembly)


# ---------------------------------------------------------------------------------------------------------------------
# contractions against numpy and the plain nest

MATMUL_SHAPES = [(1, 1, 1), (7, 13, 5), (7, 5, 13), (5, 3, 70), (9, 31, 81), (4, 64, 64), (33, 17, 100), (3, 200, 17)]


@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, I32], ids=str)
@pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=str)
def test_matmul(shape: tuple[int, int, int], dtype: np.dtype):
  m, k, n = shape
  a, b = matmul_inputs(m, k, n, dtype, seed=sum(shape))
  ast = matmul_kernel(m, k, n, dtype)
  outputs = {}
  for optimize in (True, False):
    outputs[optimize] = np.zeros(m * n, dtype)
    run_kernel(ast, [outputs[optimize], a, b], optimize)
  if dtype == I32:
    expected = (a.astype(np.int64) @ b.astype(np.int64)).astype(dtype).reshape(-1)
    assert_same(outputs[True], expected)
    assert_same(outputs[False], expected)
  elif dtype in (F16, BF16):  # each product is rounded to the dtype, then summed in float32: like the plain nest
    assert_same(outputs[True], outputs[False], TOLERANCE[dtype] * np.sqrt(k))
  else:  # the error of a dot product grows with its length
    np.testing.assert_allclose(outputs[True].reshape(m, n), a.astype(F64) @ b.astype(F64),
                               rtol=TOLERANCE[dtype] * np.sqrt(k), atol=TOLERANCE[dtype] * np.sqrt(k))


@pytest.mark.parametrize("bounds", [(0, 1), (1, 6), (3, 4), (2, 31), (5, 33), (0, 33)], ids=str)
def test_matmul_chunk_of_rows(bounds: tuple[int, int]):
  """A thread runs rows [start, end): tiles of TILE_ROWS start at `start`, a chunk that is no multiple of them ends
  in a tile whose rows past the end repeat the last row without storing, and nothing outside the chunk is written."""
  m, k, n = 33, 19, 37
  start, end = bounds
  a, b = matmul_inputs(m, k, n, F32, seed=3)
  out = np.full(m * n, -7.0, F32)
  run_kernel(matmul_kernel(m, k, n, F32), [out, a, b], True, start, end)
  grid = out.reshape(m, n)
  np.testing.assert_allclose(grid[start:end], (a.astype(F64) @ b)[start:end], rtol=1e-5, atol=1e-5)
  assert (grid[:start] == -7.0).all() and (grid[end:] == -7.0).all()


@pytest.mark.parametrize("bounds", [(0, 33), (2, 31), (5, 9)], ids=str)
@pytest.mark.parametrize("k", [19, (GROUP_MIN_BLOCKS + 1) * CONTRACTION_SUM_BLOCK + 7], ids=["plain", "grouped"])
def test_clamped_rows_store_once_in_place(bounds: tuple[int, int], k: int):
  """out += a @ b in one kernel (an epilogue reading the element it stores, as a donated buffer's update does): the
  rows a chunk's last, clamped tile repeats must not store, or they would add the product again."""
  m, n = 33, 37
  start, end = bounds
  a, b = matmul_inputs(m, k, n, F32, seed=15)
  rows, cols, red = global_range(0, m), global_range(1, n), reduce_range(2, k)
  index = add(mul(rows, const(n)), cols)
  product = mul(load(buffer(1, F32), add(mul(rows, const(k)), red)),
                load(buffer(2, F32), add(mul(red, const(n)), cols)))
  ast = kernel(store(buffer(0, F32), index, add(reduce(Ops.ADD, product, red), load(buffer(0, F32), index))))
  assert choose_opts(ast).rows == TILE_ROWS and (end - start) % TILE_ROWS
  initial = sample(F32, m * n, seed=16)
  out = initial.copy()
  run_kernel(ast, [out, a, b], True, start, end)
  grid, before = out.reshape(m, n), initial.reshape(m, n).astype(F64)
  want = before + a.astype(F64) @ b.astype(F64)
  np.testing.assert_allclose(grid[start:end], want[start:end], rtol=1e-5 * np.sqrt(k), atol=1e-5 * np.sqrt(k))
  assert (grid[:start] == before[:start]).all() and (grid[end:] == before[end:]).all()


def test_matmul_epilogue_fused_at_the_store():
  """relu(a @ b + bias[j]) in one kernel: the epilogue runs per element after the reduce loop."""
  m, k, n = 11, 23, 45
  a, b = matmul_inputs(m, k, n, F32, seed=4)
  bias = sample(F32, n, seed=5)

  def epilogue(total: UOp, col: UOp) -> UOp:
    return alu(Ops.MAX, add(total, load(buffer(3, F32), col)), const(0.0, F32))

  ast = matmul_kernel(m, k, n, F32, epilogue)
  assert applied_opts(ast)
  out = np.zeros(m * n, F32)
  run_kernel(ast, [out, a, b, bias], True)
  np.testing.assert_allclose(out.reshape(m, n), np.maximum(a.astype(F64) @ b + bias, 0), rtol=1e-5, atol=1e-5)


def test_max_contraction_propagates_nan():
  m, k, n = 6, 9, 20
  a, b = matmul_inputs(m, k, n, F32, seed=6)
  a[2, 4] = np.nan
  ast = matmul_kernel(m, k, n, F32, reduce_op=Ops.MAX)
  assert applied_opts(ast)
  out = np.zeros(m * n, F32)
  run_kernel(ast, [out, a, b], True)
  expected = (a[:, :, None] * b[None, :, :]).max(1)
  np.testing.assert_array_equal(out.reshape(m, n), expected)
  assert np.isnan(out.reshape(m, n)[2]).all()


def test_batched_matmul():
  """out[h, i, j] = sum_k a[h, i, k] * b[h, k, j]: the batch range loops outside the tiles, [start, end) over it."""
  batch, m, k, n = 3, 9, 14, 21
  rng = np.random.default_rng(7)
  a, b = rng.standard_normal((batch, m, k)).astype(F32), rng.standard_normal((batch, k, n)).astype(F32)
  h, rows, cols, red = global_range(0, batch), global_range(1, m), global_range(2, n), reduce_range(3, k)
  a_index = add(add(mul(h, const(m * k)), mul(rows, const(k))), red)
  b_index = add(add(mul(h, const(k * n)), mul(red, const(n))), cols)
  out_index = add(add(mul(h, const(m * n)), mul(rows, const(n))), cols)
  product = mul(load(buffer(1, F32), a_index), load(buffer(2, F32), b_index))
  ast = kernel(store(buffer(0, F32), out_index, reduce(Ops.ADD, product, red)))
  assert ("upcast", 1, TILE_ROWS) in applied_opts(ast)
  out = np.zeros(batch * m * n, F32)
  run_kernel(ast, [out, a, b], True, 1, 3)
  np.testing.assert_allclose(out.reshape(batch, m, n)[1:], (a.astype(F64) @ b)[1:], rtol=1e-5, atol=1e-5)
  assert (out.reshape(batch, m, n)[0] == 0).all()


def _images_kernel(batch: int, rows: int, steps: int, columns: int) -> UOp:
  """out[n, o, p] = sum_c w[o, c] * x[n, c, p]: an NCHW 1x1 convolution's product, image by image."""
  n, o, p, c = global_range(0, batch), global_range(1, rows), global_range(2, columns), reduce_range(3, steps)
  w = load(buffer(1, F32), add(mul(o, const(steps)), c))
  x = load(buffer(2, F32), add(add(mul(n, const(steps * columns)), mul(c, const(columns))), p))
  out_index = add(add(mul(n, const(rows * columns)), mul(o, const(columns))), p)
  return kernel(store(buffer(0, F32), out_index, reduce(Ops.ADD, mul(w, x), c)))


def test_images_read_in_place_and_stored_non_temporally(monkeypatch):
  """A batch of products whose column operand is each image's own (an NCHW 1x1 convolution) reads it in place, no
  pack per column tile (codegen/opt.py IN_PLACE_BYTES), and a big enough output is stored with non-temporal stores
  (NONTEMPORAL_BYTES, lowered here): one per 64-byte line where its address is a line's, a plain store elsewhere,
  fenced at the end. Values against float64 numpy for an output in aligned memory and one 16 bytes off it."""
  from tinyjax.codegen import opt
  batch, rows, steps, columns = 3, 20, 32, 192
  ast = _images_kernel(batch, rows, steps, columns)
  plan = choose_opts(ast)
  assert plan.row is not None and plan.packed == () and not plan.nontemporal
  # the same operand read across its rows at a stride that crowds L1 sets (2 KB: two sets' worth) is packed
  crowded = _images_kernel(batch, rows, steps, 512)
  assert choose_opts(crowded).packed != ()
  monkeypatch.setattr(opt, "NONTEMPORAL_BYTES", 1 << 10)
  assert ("nontemporal",) in applied_opts(ast) and choose_opts(ast).nontemporal
  ir = render_llvm("kernel", ast)
  assert "!nontemporal" in ir and "fence seq_cst" in ir
  rng = np.random.default_rng(3)
  w = rng.standard_normal((rows, steps)).astype(F32)
  x = rng.standard_normal((batch, steps, columns)).astype(F32)
  want = np.einsum("oc,ncp->nop", w.astype(F64), x.astype(F64))
  memory = np.zeros(batch * rows * columns + 32, F32)
  first = (-memory.ctypes.data % 64) // 4
  for offset in (first, first + 4):  # (a line's address, and 16 bytes past one)
    out = memory[offset:offset + batch * rows * columns]
    out[:] = np.nan
    run_kernel(ast, [out, w, x], True)
    np.testing.assert_allclose(out.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
  # an fp16 output (half a line per vector) keeps plain stores
  half = kernel(store(buffer(0, F16), ast.src[0].src[1], cast(ast.src[0].src[2], F16)))
  assert ("nontemporal",) not in applied_opts(half)


def test_launch_grain_keeps_tiles_whole():
  """A launch is cut into chunks of whole tiles when the tiled row or column is the outermost loop."""
  assert launch_grain(matmul_kernel(8, 64, 64, F32)) == TILE_ROWS  # rows of the register tile
  grain = launch_grain(matmul_kernel(64, 64, 64, F32))  # rows sharing a packed operand, whole tiles
  assert grain >= PACK_MIN_ROWS and grain % TILE_ROWS == 0 and grain - TILE_ROWS < PACK_MIN_ROWS
  assert launch_grain(column_reduce_kernel(Ops.ADD, F32, 4096, 1024)) == STREAM_TILE  # columns of the stream tile
  assert launch_grain(matmul_kernel(64, 64, 64, F32), enabled=False) == 1
  elementwise = global_range(0, 100)
  assert launch_grain(kernel(store(buffer(0, F32), elementwise, load(buffer(1, F32), elementwise)))) == 1


# float32 sums of 0.1 must be accurate (pairwise or blocked): relative error against float64 below this; a
# contraction's register tile flushes its float32 sums every CONTRACTION_SUM_BLOCK steps, within CONTRACTION_SUM_RTOL
TIGHT_SUM_RTOL = 1e-6
CONTRACTION_SUM_RTOL = 3e-6


def test_long_contraction_is_blocked():
  """k >> SUM_BLOCK: float32 sums are blocked (float64 between blocks) inside a tile too. Each accumulator of a tile
  is one running float32 sum per block (no vector lanes to spread it), so a contraction's tiles use short blocks
  (CONTRACTION_SUM_BLOCK, 256 steps): ~2.4e-6 for 0.1s (JAX's CPU GEMM: 5.1e-6 at k = 64K), where blocks of SUM_BLOCK
  would be off by ~1.6e-5 and one running sum over all of k by ~1e-3."""
  m, k, n = 5, SUM_BLOCK * 16 + 37, 17
  a = np.full((m, k), 0.1, F32)
  b = np.ones((k, n), F32)
  out = np.zeros(m * n, F32)
  ast = matmul_kernel(m, k, n, F32)
  assert choose_opts(ast).sum_block == CONTRACTION_SUM_BLOCK
  run_kernel(ast, [out, a, b], True)
  exact = float(np.float32(0.1)) * k
  assert np.abs(out.astype(F64) - exact).max() / exact < CONTRACTION_SUM_RTOL


def weight_gradient_kernel(c: int, kh: int, kw: int, o: int, n: int, h: int, w: int) -> UOp:
  """out[ci, a, b, oi] = sum_{ni, y, x} X[ni, ci, y + a, x + b] * G[ni, y, x, oi]: a 2-d convolution's kernel
  gradient, three reduce ranges and short window ranges between the reused channel range and the column."""
  ci, a, b, oi = global_range(0, c), global_range(1, kh), global_range(2, kw), global_range(3, o)
  ni, y, x = reduce_range(4, n), reduce_range(5, h), reduce_range(6, w)
  height, width = h + kh - 1, w + kw - 1
  x_index = add(add(add(mul(ni, const(c * height * width)), mul(ci, const(height * width))),
                    mul(add(y, a), const(width))), add(x, b))
  g_index = add(add(add(mul(ni, const(h * w * o)), mul(y, const(w * o))), mul(x, const(o))), oi)
  product = mul(load(buffer(1, F32), x_index), load(buffer(2, F32), g_index))
  out_index = add(add(add(mul(ci, const(kh * kw * o)), mul(a, const(kw * o))), mul(b, const(o))), oi)
  return kernel(store(buffer(0, F32), out_index, reduce(Ops.ADD, product, ni, y, x)))


@pytest.mark.parametrize("bounds", [(0, 9), (1, 6), (5, 6)], ids=str)
def test_row_tile_around_other_ranges(bounds):
  """The tile's row is the innermost reused range with a whole tile's values (the channels, not the 3-long window
  range): its tile loop runs outside the window loops, and launch chunks of it need not be whole tiles."""
  c, kh, kw, o, n, h, w = 9, 3, 3, 37, 2, 5, 6
  ast = weight_gradient_kernel(c, kh, kw, o, n, h, w)
  assert ("upcast", 0, TILE_ROWS) in applied_opts(ast) and launch_grain(ast) == TILE_ROWS
  rng = np.random.default_rng(11)
  images = rng.standard_normal((n, c, h + kh - 1, w + kw - 1)).astype(F32)
  grads = rng.standard_normal((n, h, w, o)).astype(F32)
  out = np.zeros(c * kh * kw * o, F32)
  run_kernel(ast, [out, images, grads], True, *bounds)
  windows = np.lib.stride_tricks.sliding_window_view(images.astype(F64), (h, w), axis=(2, 3))  # n c a b y x
  expected = np.einsum("ncabyx,nyxo->cabo", windows, grads.astype(F64))
  got = out.reshape(c, kh, kw, o)
  np.testing.assert_allclose(got[bounds[0]:bounds[1]], expected[bounds[0]:bounds[1]], rtol=1e-5, atol=1e-5)
  assert (got[:bounds[0]] == 0).all() and (got[bounds[1]:] == 0).all()


def test_nested_reduce_ranges_are_blocked_as_one_loop():
  """A float32 sum over several reduce ranges is blocked over the flattened nest: the window ranges (3 x 3) run whole
  inside a block and the range outside them is cut into chunks (CONTRACTION_SUM_BLOCK // 9 steps), so the sum stays
  accurate and the short window loops don't flush their accumulators every few steps."""
  c, kh, kw, o, n, h, w = 4, 3, 3, 16, 13, 40, 50  # 26000 steps per output
  ast = weight_gradient_kernel(c, kh, kw, o, n, h, w)
  source = render_llvm("kernel", ast, optimize=True)
  # one float32 and one float64 accumulator per tile element (not a float64 set per enclosing reduce loop)
  doubles, floats = (len(re.findall(rf"alloca (<\d+ x )?{kind}\b", source)) for kind in ("double", "float"))
  assert doubles == floats > 0
  images = np.full((n, c, h + kh - 1, w + kw - 1), 0.1, F32)
  grads = np.ones((n, h, w, o), F32)
  out = np.zeros(c * kh * kw * o, F32)
  run_kernel(ast, [out, images, grads], True)
  exact = float(np.float32(0.1)) * n * h * w
  assert np.abs(out.astype(F64) - exact).max() / exact < CONTRACTION_SUM_RTOL


# ---------------------------------------------------------------------------------------------------------------------
# reductions over an outer axis (stream tiles)

@pytest.mark.parametrize("dtype", [F32, F64, F16, BF16, I32, np.dtype(np.uint8), BOOL], ids=str)
@pytest.mark.parametrize("op", [Ops.ADD, Ops.MAX, Ops.MUL])
def test_column_reduce(op: Ops, dtype: np.dtype):
  rows, cols = 29, STREAM_TILE + 37  # a full tile and a short one
  values = sample(dtype, n=rows * cols, seed=8)
  if op is Ops.MUL and dtype.kind == "f": values = (1 + values.astype(F32) / 200).astype(dtype)
  ast = column_reduce_kernel(op, dtype, rows, cols)
  assert applied_opts(ast)
  outputs = {}
  for optimize in (True, False):
    outputs[optimize] = np.zeros(cols, dtype)
    run_kernel(ast, [outputs[optimize], values], optimize)
  rtol = {F16: 2e-3, BF16: 1e-2, F32: 1e-5, F64: 1e-12}.get(dtype, 0.0) if op is not Ops.MAX else 0.0
  assert_same(outputs[True], outputs[False], rtol)  # the plain nest is tested against numpy in test_codegen.py


@pytest.mark.parametrize("rows", [4096, SUM_BLOCK * 16 + 5, TILE_SUM_BLOCK * 3 + 1])
def test_column_sum_blocked_and_accurate(rows: int):
  cols = 19
  values = np.full(rows * cols, 0.1, F32)
  out = np.zeros(cols, F32)
  run_kernel(column_reduce_kernel(Ops.ADD, F32, rows, cols), [out, values], True)
  exact = float(np.float32(0.1)) * rows
  assert np.abs(out.astype(F64) - exact).max() / exact < TIGHT_SUM_RTOL


def test_long_float32_sums_through_numpy_api():
  """16M elements and 4096-row columns of 0.1 summed in float32 (the tiled and the plain paths) against float64."""
  from tinyjax import numpy as tnp
  tenth = float(np.float32(0.1))
  column_sums = np.asarray(tnp.asarray(np.full((4096, 64), 0.1, F32)).sum(axis=0))
  assert np.abs(column_sums.astype(F64) - 4096 * tenth).max() / (4096 * tenth) < TIGHT_SUM_RTOL
  total = float(tnp.asarray(np.full(1 << 24, 0.1, F32)).sum())
  assert abs(total - (1 << 24) * tenth) / ((1 << 24) * tenth) < TIGHT_SUM_RTOL


def test_column_max_propagates_nan():
  rows, cols = 7, 40
  values = sample(F32, n=rows * cols, seed=9)
  values[3 * cols + 11] = np.nan
  out = np.zeros(cols, F32)
  run_kernel(column_reduce_kernel(Ops.MAX, F32, rows, cols), [out, values], True)
  expected = values.reshape(rows, cols).max(0)
  np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("bounds", [(0, 1), (3, 20), (17, 18), (5, 40)], ids=str)
def test_column_reduce_chunk(bounds: tuple[int, int]):
  rows, cols = 13, 40
  start, end = bounds
  values = sample(F32, n=rows * cols, seed=10)
  out = np.full(cols, -7.0, F32)
  run_kernel(column_reduce_kernel(Ops.ADD, F32, rows, cols), [out, values], True, start, end)
  np.testing.assert_allclose(out[start:end], values.reshape(rows, cols).astype(F64).sum(0)[start:end], rtol=1e-5,
                             atol=1e-5)
  assert (out[:start] == -7.0).all() and (out[end:] == -7.0).all()


# ---------------------------------------------------------------------------------------------------------------------
# end to end: lower/ makes the kernels, the runtime splits them across threads

def array_matmul(a: Array, b: Array) -> Array:
  (m, k), (_, n) = a.shape, b.shape
  a3 = bind(Ops.EXPAND, bind(Ops.RESHAPE, a, arg=(m, k, 1)), arg=(m, k, n))
  b3 = bind(Ops.EXPAND, bind(Ops.RESHAPE, b, arg=(1, k, n)), arg=(m, k, n))
  return bind(Ops.RESHAPE, bind(Ops.REDUCE_AXIS, bind(Ops.MUL, a3, b3), arg=(Ops.ADD, (1,))), arg=(m, n))


@pytest.mark.parametrize("shape", [(7, 13, 5), (129, 67, 300), (1023, 65, 257), (300, 1023, 20)], ids=str)
def test_matmul_end_to_end(shape: tuple[int, int, int]):
  m, k, n = shape
  a_host, b_host = matmul_inputs(m, k, n, F32, seed=11)
  result = np.asarray(array_matmul(Array.from_numpy(a_host), Array.from_numpy(b_host)))
  np.testing.assert_allclose(result, a_host.astype(F64) @ b_host, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axis", [0, 1])
def test_sum_end_to_end(axis: int):
  host = np.random.default_rng(12).standard_normal((517, 1500)).astype(F32)
  x = Array.from_numpy(host)
  total = bind(Ops.RESHAPE, bind(Ops.REDUCE_AXIS, x, arg=(Ops.ADD, (axis,))), arg=(host.shape[1 - axis],))
  np.testing.assert_allclose(np.asarray(total), host.astype(F64).sum(axis), rtol=1e-5, atol=1e-4)


def test_opts_listed_in_the_module():
  assert "; opts: [('reduce_outside', 2)" in render_llvm("kernel", matmul_kernel(16, 16, 16, F32))
  assert choose_opts(matmul_kernel(16, 16, 16, F32)).contract


def test_kernels_ask_for_the_tiles_vector_width():
  """A tile is sized for VECTOR_BYTES registers: its kernel asks LLVM for vectors that wide (on AVX-512 parts LLVM
  prefers 256-bit vectors and split the tile into twice the accumulators, spilling some); so do kernels that compute
  more than they move (a transcendental), vectorised that wide; a plain copy is left to LLVM's choice."""
  attribute = f'"prefer-vector-width"="{VECTOR_BYTES * 8}"'
  assert attribute in render_llvm("kernel", matmul_kernel(64, 64, 64, F32))
  elementwise = global_range(0, 1 << 16)
  plain = kernel(store(buffer(0, F32), elementwise, alu(Ops.EXP2, load(buffer(1, F32), elementwise))))
  ir = render_llvm("kernel", plain)
  assert attribute in ir
  assert re.search(r"<(8|16) x float>", str(optimized_module(ir)))  # (16 where the CPU has AVX-512)
  copy = kernel(store(buffer(0, F32), elementwise, load(buffer(1, F32), elementwise)))
  assert "prefer-vector-width" not in render_llvm("kernel", copy)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("bounds", [(0, 70), (0, 1), (3, 41), (32, 70), (5, 6)], ids=str)
def test_k_blocked_row_groups(bounds: tuple[int, int], dtype: np.dtype, monkeypatch):
  """A float32 GEMM with a long reduce range runs its tiles in groups of GROUP_ROWS rows, block by block of the
  reduce range: full and partial groups, row tiles then single rows, vector then single columns, a partial last
  block, a chunk [start, end) of rows with an epilogue. Its block sums are the same operations in the same order as
  one tile's blocked loop, so the result is bit-identical to the plain tiles', and as close to float64."""
  m, k, n = 70, GROUP_MIN_BLOCKS * CONTRACTION_SUM_BLOCK + 44, 83
  start, end = bounds
  a, b = matmul_inputs(m, k, n, dtype, seed=8)
  bias = sample(F32, n, seed=9).astype(dtype)

  def epilogue(total: UOp, col: UOp) -> UOp:
    return alu(Ops.MAX, add(total, load(buffer(3, dtype), col)), const(0.0, dtype))

  ast = matmul_kernel(m, k, n, dtype, epilogue)
  outputs = {}
  for blocked in (True, False):
    monkeypatch.setattr(llvm._Renderer, "k_blocked", lambda self, blocked=blocked: blocked)
    outputs[blocked] = np.full(m * n, -7.0, dtype)
    run_kernel(ast, [outputs[blocked], a, b, bias], True, start, end)
  assert_same(outputs[True], outputs[False])
  grid = outputs[True].reshape(m, n).astype(F64)
  expected = np.maximum(a.astype(F64) @ b.astype(F64) + bias.astype(F64), 0)
  tolerance = TOLERANCE[dtype] * np.sqrt(k)
  np.testing.assert_allclose(grid[start:end], expected[start:end], rtol=tolerance, atol=tolerance)
  assert (grid[:start] == -7.0).all() and (grid[end:] == -7.0).all()


def test_k_blocking_applies_to_long_float32_sums_only():
  """Row groups for float32 sums over one range of more than GROUP_MIN_BLOCKS blocks; a launch chunk is then whole
  groups."""
  ast = matmul_kernel(64, (GROUP_MIN_BLOCKS + 1) * CONTRACTION_SUM_BLOCK, 64, F32)
  assert llvm._Renderer(ast, choose_opts(ast)).k_blocked()
  group = GROUP_ROWS // TILE_ROWS * TILE_ROWS  # whole tiles
  assert ("group", 0, group) in applied_opts(ast) and launch_grain(ast) == group
  for other in (matmul_kernel(64, GROUP_MIN_BLOCKS * CONTRACTION_SUM_BLOCK, 64, F32), matmul_kernel(64, 300, 64, F64),
                matmul_kernel(64, 300, 64, I32), matmul_kernel(64, 300, 64, F32, reduce_op=Ops.MAX)):
    assert not llvm._Renderer(other, choose_opts(other)).k_blocked()


# ---------------------------------------------------------------------------------------------------------------------
# the reused operand packed per column tile

def test_reused_operand_is_packed():
  """b of a @ b is packed (one load) when enough rows share it and its copy fits; not with few rows, nor for a load
  that depends on the row. A copy too big for the stack is packed in panels of whole reduce blocks where the sum is
  K-blocked (a float32 sum), by row groups of PANEL_GROUP_ROWS, and not packed otherwise (an int32 sum)."""
  assert ("pack", 1, 1) in applied_opts(matmul_kernel(PACK_MIN_ROWS, 64, 64, F32))
  assert not any(opt[0] == "pack" for opt in applied_opts(matmul_kernel(PACK_MIN_ROWS - 1, 64, 64, F32)))
  too_long = PACK_BYTES // (4 * 64) + 1
  panel = PANEL_BYTES // (4 * 64) // CONTRACTION_SUM_BLOCK * CONTRACTION_SUM_BLOCK
  opts = applied_opts(matmul_kernel(256, too_long, 64, F32))
  group = PANEL_GROUP_ROWS // TILE_ROWS * TILE_ROWS  # whole tiles
  assert ("pack", 1, 1) in opts and ("panel", 2, panel) in opts and ("group", 0, group) in opts
  assert ("panel", 2, panel) not in applied_opts(matmul_kernel(256, too_long - 1, 64, F32))
  assert not any(opt[0] in ("pack", "panel") for opt in applied_opts(matmul_kernel(64, too_long, 64, I32)))
  plan = choose_opts(matmul_kernel(64, 64, 64, F32))
  assert [load.src[0].arg for load in plan.packed] == [2]  # buffer 2 is b; a depends on the row


def conv_like_kernel(m: int, c: int, t: int, n: int, dtype: np.dtype) -> UOp:
  """out[i, j] = sum_{c, t} x[i, c * T + t] * w[c, t, j] + bias[j]: two reduce ranges (a convolution's channels and
  window)."""
  rows, cols, channel, tap = global_range(0, m), global_range(1, n), reduce_range(2, c), reduce_range(3, t)
  x = load(buffer(1, dtype), add(mul(rows, const(c * t)), add(mul(channel, const(t)), tap)))
  w = load(buffer(2, dtype), add(mul(add(mul(channel, const(t)), tap), const(n)), cols))
  total = add(reduce(Ops.ADD, mul(x, w), channel, tap), load(buffer(3, dtype), cols))
  return kernel(store(buffer(0, dtype), add(mul(rows, const(n)), cols), total))


def sliding_conv_kernel(n: int, width: int, taps: int, c: int, o: int) -> UOp:
  """out[b, x, j] = sum_{ci, t} x[b, x + t, ci] * w[t, ci, j]: a 1-d convolution read in place, its output position
  the tile's row and its taps a short reduce range that slides along it."""
  b, x, j = global_range(0, n), global_range(1, width), global_range(2, o)
  ci, t = reduce_range(3, c), reduce_range(4, taps)
  padded = width + taps - 1
  image = load(buffer(1, F32), add(add(mul(b, const(padded * c)), mul(add(x, t), const(c))), ci))
  weight = load(buffer(2, F32), add(mul(add(mul(t, const(c)), ci), const(o)), j))
  return kernel(store(buffer(0, F32), add(mul(add(mul(b, const(width)), x), const(o)), j),
                      reduce(Ops.ADD, mul(image, weight), ci, t)))


def test_sliding_window_tiles_are_shorter():
  """A tile whose row slides along a short reduce range (a convolution's taps, unrolled whole) is WINDOW_TILE_ROWS
  high: the unrolled taps of neighbouring rows read the same values, which LLVM keeps live across the copies (6 rows
  and 3 taps spilled accumulators). A GEMM and a weight gradient (its row the channels) keep TILE_ROWS. Values of the
  sliding kernel against float64, whole and partial row tiles."""
  ast = sliding_conv_kernel(2, 14, 3, 32, 64)
  assert choose_opts(ast).rows == WINDOW_TILE_ROWS < TILE_ROWS
  assert choose_opts(matmul_kernel(64, 64, 64, F32)).rows == TILE_ROWS
  assert choose_opts(weight_gradient_kernel(12, 3, 3, 64, 2, 5, 6)).rows == TILE_ROWS
  rng = np.random.default_rng(21)
  image = rng.standard_normal((2, 16, 32)).astype(F32)
  weight = rng.standard_normal((3, 32, 64)).astype(F32)
  out = np.zeros(2 * 14 * 64, F32)
  run_kernel(ast, [out, image, weight], True)
  windows = np.lib.stride_tricks.sliding_window_view(image.astype(F64), 3, axis=1)  # b x ci t
  np.testing.assert_allclose(out.reshape(2, 14, 64), np.einsum("bxct,tco->bxo", windows, weight.astype(F64)),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [
  ("matmul", 40, 300, 150, F32, (0, 40)),      # K-blocked row groups, a partial last block, column tails
  ("matmul", 40, 300, 150, F32, (3, 37)),      # a chunk of rows that is no multiple of a tile or a group
  ("matmul", 33, 70, 100, F32, (0, 33)),       # one block: plain row tiles
  ("matmul", 20, 50, 64, BF16, (0, 20)),       # bfloat16 operands, packed as float32
  ("matmul", 24, 40, 130, F64, (0, 24)),
  ("matmul", 17, 45, 70, I32, (1, 17)),
  ("conv", 36, 5, 9, 80, F32, (0, 36)),        # two reduce ranges, flattened into the pack
], ids=str)
def test_packed_operand_matches_unpacked(case, monkeypatch):
  """Reading the reused operand from its packed copy gives the same bits as reading it in place (same products, same
  order), and float64's values; rows outside the chunk are not written."""
  kind, *dims, dtype, (start, end) = case
  if kind == "matmul":
    m, k, n = dims
    a, b = matmul_inputs(m, k, n, dtype, seed=m + k)
    ast, expected = matmul_kernel(m, k, n, dtype), a.astype(F64) @ b.astype(F64)
    operands = [a, b]
  else:
    m, c, t, n = dims
    k = c * t
    x, w = matmul_inputs(m, k, n, dtype, seed=5)
    bias = sample(F32, n, seed=6).astype(dtype)
    ast, expected = conv_like_kernel(m, c, t, n, dtype), x.astype(F64) @ w.astype(F64) + bias
    operands = [x, w, bias]
  assert any(opt[0] == "pack" for opt in applied_opts(ast))
  outputs = {}
  for packed in (True, False):
    if not packed: monkeypatch.setattr(llvm._Renderer, "pack", lambda self, column_start: None)
    outputs[packed] = np.full(m * n, -7, dtype)
    run_kernel(ast, [outputs[packed], *operands], True, start, end)
  assert_same(outputs[True], outputs[False])
  grid = outputs[True].reshape(m, n).astype(F64)
  tolerance = TOLERANCE.get(dtype, 1e-5) * np.sqrt(k)
  np.testing.assert_allclose(grid[start:end], expected[start:end], rtol=tolerance, atol=tolerance)
  assert (grid[:start] == -7).all() and (grid[end:] == -7).all()


# ---------------------------------------------------------------------------------------------------------------------
# both operands read along the reduction (g @ w.T): the dot tile

def nt_kernel(m: int, k: int, n: int, dtype: np.dtype) -> UOp:
  """out[i, j] = sum_k a[i, k] * b[j, k]: a contraction with b transposed, both loads contiguous along k."""
  rows, cols, red = global_range(0, m), global_range(1, n), reduce_range(2, k)
  a_element = load(buffer(1, dtype), add(mul(rows, const(k)), red))
  b_element = load(buffer(2, dtype), add(mul(cols, const(k)), red))
  total = reduce(Ops.ADD, mul(a_element, b_element), red)
  return kernel(store(buffer(0, dtype), add(mul(rows, const(n)), cols), total))


@pytest.mark.parametrize("case", [(16, 300, 16, F32, (0, 16)), (13, 260, 11, F32, (0, 13)), (33, 513, 70, F32, (5, 30)),
                                  (9, 300, 7, F64, (0, 9)), (8, 256, 12, I32, (0, 8)), (12, 400, 9, BF16, (2, 11)),
                                  (2, 300, 9, F32, (0, 2)), (3, 260, 70, F32, (1, 3)), (40, 300, 10, F32, (7, 31)),
                                  (20, 300, 2, F32, (0, 20))],
                         ids=str)
def test_dot_tile(case):
  """Row and column tiles with a vectorised reduce loop: tails of rows and columns, a chunk of rows, dtypes, fewer
  rows or columns than a tile's (DOT_MIN_ROWS), a narrow column whose tiles run inside each row tile (llvm.py
  DOT_ROWS_OUTSIDE); against float64 and the plain nest."""
  m, k, n, dtype, (start, end) = case
  rng = np.random.default_rng(m * n)
  a, b = matmul_inputs(m, k, n, dtype, seed=k)
  b = np.ascontiguousarray(matmul_inputs(n, k, 1, dtype, seed=n)[0]) if dtype != I32 else \
      rng.integers(-50, 50, (n, k)).astype(dtype)
  ast = nt_kernel(m, k, n, dtype)
  assert ("dot", 1, min(4, n)) in applied_opts(ast)
  outputs = {}
  for optimize in (True, False):
    outputs[optimize] = np.full(m * n, -7, dtype)
    run_kernel(ast, [outputs[optimize], a, b], optimize, start, end)
  grid = outputs[True].reshape(m, n).astype(F64)
  if dtype == I32:
    expected = (a.astype(np.int64) @ b.T.astype(np.int64)).astype(F64)
    tolerance = 0.0
  else:
    expected = a.astype(F64) @ b.T.astype(F64)
    tolerance = TOLERANCE[dtype] * np.sqrt(k)
  np.testing.assert_allclose(grid[start:end], expected[start:end], rtol=tolerance, atol=tolerance)
  np.testing.assert_allclose(grid[start:end], outputs[False].reshape(m, n)[start:end].astype(F64), rtol=tolerance,
                             atol=tolerance)
  assert (grid[:start] == -7).all() and (grid[end:] == -7).all()


def test_dot_tile_only_for_long_reductions_with_reuse():
  """Short reductions keep the transposed copy and the register tile; a row reduction (no column to share) and a
  single-row contraction keep the plain nest."""
  assert not any(opt[0] == "dot" for opt in applied_opts(nt_kernel(16, DOT_MIN_REDUCE - 1, 16, F32)))
  assert applied_opts(nt_kernel(1, 512, 16, F32)) == ()
  row, red = global_range(0, 8), reduce_range(1, 512)
  row_sum = kernel(store(buffer(0, F32), row, reduce(Ops.ADD, load(buffer(1, F32), add(mul(row, const(512)), red)),
                                                     red)))
  assert applied_opts(row_sum) == ()


def test_transposed_weight_gradient_needs_no_copy():
  """x @ w.T with a long reduction (the input gradient of a dense layer) runs as one kernel, values as numpy's."""
  import tinyjax as tj
  rng = np.random.default_rng(4)
  x, w = rng.standard_normal((64, 512)).astype(F32), rng.standard_normal((96, 512)).astype(F32)
  lowered = tj.jit(lambda u, v: u @ v.T).lower(x, w)
  assert lowered.as_text().count("# kernel ") == 1
  np.testing.assert_allclose(np.asarray(tj.jit(lambda u, v: u @ v.T)(x, w)), x.astype(F64) @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch, rows, columns, reduce, dtype, plan", [
  ((), 256, 128, 300, F32, "pack"), ((), 255, 128, 300, F32, "dot"), ((), 256, 136, 300, F32, "dot"),
  ((), 256, 128, 5200, F32, "panel"), ((), 256, 128, 5200, I32, "copy"), ((), 128, 256, 512, F32, "pack"),
  ((), 64, 256, 512, F32, "pack"), ((), 63, 256, 512, F32, "dot"), ((), 128, 256, 500, F32, "dot"),
  ((), 128, 128, 512, F32, "dot"), ((), 128, 256, 512, I32, "dot"), ((3,), 64, 64, 512, F32, "pack"),
  ((3,), 32, 64, 512, F32, "dot")], ids=str)
def test_tall_transposed_contraction_packs_w_for_a_register_tile(batch, rows, columns, reduce, dtype, plan, on_cpu):
  """x @ w.T with DOT_MAX_ROWS rows or more and whole column tiles gets a register tile (faster there than the dot
  tile) that packs w's columns transposed, in one kernel (past PACK_BYTES, a float32 sum packs panel by panel);
  where it can't pack (an int32 sum past PACK_BYTES), w is copied transposed by a kernel of its own first. So does
  a float32 one from DOT_PACKED_ROWS rows, whole blocks of 16 summed, where every launch chunk holds all the rows:
  DOT_PACKED_COLUMNS columns or more (launched over column tiles), or a batch. Fewer rows, a column tail, too few
  columns unbatched, a sum not whole blocks of 16, or an int32 sum (below DOT_MAX_ROWS) keep the dot tile. numpy's
  values."""
  import tinyjax as tj
  from tinyjax.codegen.opt import DOT_MAX_ROWS, DOT_PACKED_COLUMNS, DOT_PACKED_ROWS, PACK_BYTES
  assert (DOT_MAX_ROWS, DOT_PACKED_ROWS, DOT_PACKED_COLUMNS) == (256, 64, 256)
  assert (reduce * 64 * 4 > PACK_BYTES) == (plan in ("panel", "copy"))
  rng = np.random.default_rng(rows + columns)
  x, w = rng.standard_normal((*batch, rows, reduce)), rng.standard_normal((*batch, columns, reduce))
  if dtype == I32: x, w = np.round(x * 3), np.round(w * 3)
  x, w = x.astype(dtype), w.astype(dtype)
  f = tj.jit(lambda u, v: jnp_relu(u @ v.swapaxes(-1, -2)))
  text = f.lower(x, w).as_text()
  assert text.count("# kernel ") == (2 if plan == "copy" else 1)
  assert ("('dot'," in text) == (plan == "dot") and ("('pack'," in text) == (plan in ("pack", "panel"))
  assert ("('panel'," in text) == (plan == "panel")
  expected = np.maximum(x.astype(F64) @ w.swapaxes(-1, -2).astype(F64), 0)
  if dtype == I32: np.testing.assert_array_equal(np.asarray(f(x, w)), expected.astype(I32))
  else: np.testing.assert_allclose(np.asarray(f(x, w)), expected, rtol=1e-4, atol=1e-4)


def jnp_relu(x):
  import tinyjax.numpy as tnp
  return tnp.maximum(x, 0)


@pytest.mark.parametrize("shape", [(32, 300, 512), (20, 64, 256), (128, 784, 512)], ids=str)
def test_wide_contraction_is_launched_over_column_tiles(shape):
  """Fewer rows than columns: the launch is cut into column tiles (each thread packs only its own), the tile index
  the new outermost range; every chunk of tiles gives numpy's values. A tall contraction keeps its rows outermost."""
  from tinyjax.lower.schedule import _split_columns
  m, k, n = shape
  a, b = matmul_inputs(m, k, n, F32, seed=m)
  split, tiles = _split_columns(matmul_kernel(m, k, n, F32), threads=2)
  assert tiles == n // 64 and outer_bound(split) == tiles and ("pack", 2, 1) in applied_opts(split)
  out = np.zeros(m * n, F32)
  for start in range(0, tiles, 3): run_kernel(split, [out, a, b], True, start, min(start + 3, tiles))
  np.testing.assert_allclose(out.reshape(m, n), a.astype(F64) @ b, rtol=1e-4, atol=1e-4)
  assert _split_columns(matmul_kernel(n, k, m, F32), threads=2) is None
  assert _split_columns(matmul_kernel(m, k, n, F32), threads=n // 64) is None  # too few tiles for the threads


def test_square_contractions_are_launched_over_column_tiles_unless_a_is_read_across():
  """As many rows as columns: split too (every chunk of rows would pack all of b again), each tile packed once, unless
  the row operand is read across its rows (a.T @ b, a weight gradient), which every column tile would reread with a
  stride."""
  from tinyjax.lower.schedule import _split_columns
  m = k = n = 256
  split, tiles = _split_columns(matmul_kernel(m, k, n, F32), threads=2)
  assert tiles == n // 64 and outer_bound(split) == tiles
  a, b = matmul_inputs(m, k, n, F32, seed=3)
  out = np.zeros(m * n, F32)
  for start in range(tiles): run_kernel(split, [out, a, b], True, start, start + 1)
  np.testing.assert_allclose(out.reshape(m, n), a.astype(F64) @ b, rtol=1e-4, atol=1e-4)
  rows, cols, red = global_range(0, m), global_range(1, n), reduce_range(2, k)
  transposed_a = load(buffer(1, F32), add(mul(red, const(m)), rows))
  b_element = load(buffer(2, F32), add(mul(red, const(n)), cols))
  total = reduce(Ops.ADD, mul(transposed_a, b_element), red)
  ast = kernel(store(buffer(0, F32), add(mul(rows, const(n)), cols), total))
  assert ("pack", 1, 1) in applied_opts(ast) and _split_columns(ast, threads=2) is None


def test_classifier_weight_gradient_is_launched_over_column_tiles():
  """A classifier's weight gradient computed transposed (out_t[c, m] = sum_k g[k, c] h[k, m], 10 rows c: too few
  launch chunks for the threads) is cut by column tiles, so that each thread reads its own part of h once; every
  chunk of tiles gives numpy's values. A tall one (512 rows) keeps its rows outermost, and one with a range before
  its rows is launched over that range."""
  from tinyjax.lower.schedule import _split_columns
  classes, m, k = 10, 512, 256

  def transposed_gradient(rows: int, leading: int = 1) -> UOp:
    """out_t[l, c, m] = sum_k g[l, k, c] h[l, k, m], with a range l before the rows where `leading` > 1."""
    first = 1 if leading > 1 else 0
    c, column, red = global_range(first, rows), global_range(first + 1, m), reduce_range(first + 2, k)
    g_index, h_index = add(mul(red, const(rows)), c), add(mul(red, const(m)), column)
    out_index = add(mul(c, const(m)), column)
    if leading > 1:
      outer = global_range(0, leading)
      g_index, h_index = add(mul(outer, const(k * rows)), g_index), add(mul(outer, const(k * m)), h_index)
      out_index = add(mul(outer, const(rows * m)), out_index)
    g, h = load(buffer(1, F32), g_index), load(buffer(2, F32), h_index)
    return kernel(store(buffer(0, F32), out_index, reduce(Ops.ADD, mul(g, h), red)))

  split, tiles = _split_columns(transposed_gradient(classes), threads=2)
  assert outer_bound(split) == tiles and tiles > 1
  rng = np.random.default_rng(5)
  g, h = rng.standard_normal((k, classes)).astype(F32), rng.standard_normal((k, m)).astype(F32)
  out = np.zeros(classes * m, F32)
  for start in range(0, tiles, 3): run_kernel(split, [out, g, h], True, start, min(start + 3, tiles))
  np.testing.assert_allclose(out.reshape(classes, m), g.T.astype(F64) @ h, rtol=1e-4, atol=1e-4)
  assert _split_columns(transposed_gradient(512), threads=2) is None
  assert _split_columns(transposed_gradient(3, leading=3), threads=2) is None  # (launched over the 3 first)


# ---------------------------------------------------------------------------------------------------------------------
# the register tile's body and epilogue as vector IR

def masked_matmul_kernel(m: int, k: int, n: int, out_dtype: np.dtype, in_dtype: np.dtype = F32) -> UOp:
  """out[i, j] = (sum_k a[i, k] * relu_mask(b[k, j])) * (j < 37 ? j : -1) + bias[j]: a prologue with a compare and a
  select, the column itself in the value and the epilogue, operands cast from `in_dtype`."""
  rows, cols, red = global_range(0, m), global_range(1, n), reduce_range(2, k)
  a_element = cast(load(buffer(1, in_dtype), add(mul(rows, const(k)), red)), F32)
  b_element = cast(load(buffer(2, in_dtype), add(mul(red, const(n)), cols)), F32)
  zero = const(0.0, F32)
  masked = alu(Ops.WHERE, alu(Ops.CMPLT, zero, b_element), b_element, zero)
  column = cast(cols, F32)
  scale = alu(Ops.WHERE, alu(Ops.CMPLT, cols, const(37)), column, const(-1.0, F32))
  result = add(mul(reduce(Ops.ADD, mul(a_element, masked), red), scale), load(buffer(3, F32), cols))
  return kernel(store(buffer(0, out_dtype), add(mul(rows, const(n)), cols), cast(result, out_dtype)))


@pytest.mark.parametrize("case", [
  ("matmul", 40, 300, 150, F32, None, (0, 40)),    # K-blocked row groups: vector block sums and epilogue
  ("matmul", 40, 300, 150, F32, None, (3, 37)),    # a chunk that is no multiple of a tile or a group
  ("matmul", 33, 70, 100, F32, "relu", (0, 33)),   # one block, a column bias and ReLU epilogue
  ("matmul", 24, 40, 130, F64, None, (0, 24)),     # 8 lanes of float64
  ("matmul", 17, 45, 70, I32, None, (1, 17)),      # integer lanes
  ("matmul", 20, 50, 64, BF16, None, (0, 20)),     # bfloat16 products round per operation: a scalar body
  ("max", 19, 33, 48, F32, None, (0, 19)),         # a max-reduction of products
  ("masked", 36, 290, 80, F32, F32, (0, 36)),      # prologue, column iota, epilogue loads
  ("masked", 21, 60, 48, F32, BF16, (2, 21)),      # bfloat16 operands cast to float32 in the vector body
  ("masked", 21, 60, 48, BF16, F32, (0, 21)),      # a bfloat16 result: rounded on vectors, as the scalars do
], ids=str)
def test_vector_tile_matches_scalar_tile(case, monkeypatch):
  """A register tile rendered as vector IR gives the bits of the same tile rendered as scalars for LLVM's SLP
  vectoriser (same operations per element, same order), and float64's values; rows outside the chunk are untouched."""
  kind, m, k, n, dtype, extra, (start, end) = case
  rng = np.random.default_rng(m * k)
  if kind == "masked":
    out_dtype, in_dtype = dtype, extra
    a, b = (rng.standard_normal(shape).astype(in_dtype) for shape in ((m, k), (k, n)))
    bias = rng.standard_normal(n).astype(F32)
    ast, operands = masked_matmul_kernel(m, k, n, out_dtype, in_dtype), [a, b, bias]
    columns = np.arange(n)
    expected = (a.astype(F64) @ np.maximum(b.astype(F64), 0)) * np.where(columns < 37, columns, -1) + bias
  else:
    out_dtype = dtype
    a, b = matmul_inputs(m, k, n, dtype, seed=m + k)
    relu = (lambda result, cols: alu(Ops.MAX, add(result, load(buffer(3, dtype), cols)), const(0.0, dtype)))
    bias = sample(F32, n, seed=3).astype(dtype)
    ast = matmul_kernel(m, k, n, dtype, relu if extra == "relu" else None,
                        Ops.MAX if kind == "max" else Ops.ADD)
    operands = [a, b] + ([bias] if extra == "relu" else [])
    products = a.astype(F64)[:, :, None] * b.astype(F64)[None]
    expected = products.max(axis=1) if kind == "max" else products.sum(axis=1)
    if extra == "relu": expected = np.maximum(expected + bias.astype(F64), 0)
  plan = choose_opts(ast)
  renderer = llvm._Renderer(ast, plan)
  assert renderer.vector_body == (dtype != BF16 or kind == "masked")
  assert renderer.vector_epilogue == renderer.vector_body
  if renderer.vector_body: assert f"<{plan.lanes} x " in render_llvm("kernel", ast)
  outputs = {}
  for vector in (True, False):
    if not vector:
      monkeypatch.setattr(llvm, "vector_body_ok", lambda *args: False)
      monkeypatch.setattr(llvm, "vector_epilogue_ok", lambda *args: False)
    outputs[vector] = np.full(m * n, -7, out_dtype)
    run_kernel(ast, [outputs[vector], *operands], True, start, end)
  assert_same(outputs[True], outputs[False])
  grid = outputs[True].reshape(m, n).astype(F64)
  tolerance = TOLERANCE.get(out_dtype, 1e-5) * np.sqrt(k) * (40 if kind == "masked" else 1)
  np.testing.assert_allclose(grid[start:end], expected[start:end], rtol=tolerance, atol=tolerance)
  assert (grid[:start] == -7).all() and (grid[end:] == -7).all()


def test_vector_tile_shrinks_the_ir():
  """The 6 x 64 float32 tile is 24 vector FMAs per reduce step, not 384 scalar multiplies for SLP to pack; the
  columns (512, static) have no tails, and the rows (the launch-chunked outermost range, 512 = 85 x 6 + 2) end in the
  same tile, clamped: one tile body in all."""
  ast = matmul_kernel(512, 512, 512, F32)
  source = render_llvm("kernel", ast)
  product = "call <16 x float> @llvm.fma.v16f32(" if tile_geometry().fma else "fmul contract <16 x float>"
  assert source.count(product) == TILE_ROWS * 4
  assert "fmul contract float" not in source and "call float @llvm.fma.f32(" not in source


def test_only_a_nests_short_ranges_are_unrolled_whole():
  """LLVM unrolls nothing unasked (devices/cpu.py PIPELINE); a convolution's short window range asks to be unrolled
  whole, a single reduce range (however short) and the channels don't; the result stays numpy's."""
  conv = conv_like_kernel(24, 20, 3, 64, F32)
  assert render_llvm("kernel", conv).count('!{!"llvm.loop.unroll.full"}') >= 1  # (one per tile height)
  assert "llvm.loop.unroll.full" not in render_llvm("kernel", matmul_kernel(24, 3, 64, F32))
  x, w = matmul_inputs(24, 60, 64, F32, seed=9)
  bias = sample(F32, 64, seed=10)
  out = np.zeros(24 * 64, F32)
  run_kernel(conv, [out, x, w, bias], True)
  np.testing.assert_allclose(out.reshape(24, 64), x.astype(F64) @ w + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k,n,rows", [(64, 300, 32, 8), (14, 9, 32, 7), (56, 600, 48, 8), (40, 600, 48, 8),
                                        (37, 20, 16, 8), (29, 700, 32, 8), (12, 40, 64, TILE_ROWS), (6, 30, 32, 6)])
@pytest.mark.parametrize("bounds", [None, (3, 11)], ids=["all", "chunk"])
def test_narrow_columns_get_taller_tiles(m, k, n, rows, bounds):
  """A column of fewer than TILE_VECTORS vectors (a 32-channel convolution's output) gets up to MAX_TILE_ROWS rows
  per tile, the tallest that divides the row count where one does (14 rows: 7), so the tile keeps at most as many
  accumulators as a 6 x 64 one; grouped GEMMs group whole tiles. Values against float64 for whole and partial row
  tiles, with and without K-blocked groups, and for a launch chunk that is no multiple of the tile."""
  ast = matmul_kernel(m, k, n, F32)
  opts = applied_opts(ast)
  assert ("upcast", 1, n) in opts and ("upcast", 0, rows) in opts
  group = next((opt[2] for opt in opts if opt[0] == "group"), None)
  assert group is None or group % rows == 0 and group <= GROUP_ROWS
  a, b = matmul_inputs(m, k, n, F32, seed=12)
  out = np.full(m * n, -7.0, F32)
  start, end = (min(bounds[0], m), min(bounds[1], m)) if bounds else (0, m)
  run_kernel(ast, [out, a, b], True, start, end)
  grid = out.reshape(m, n)
  expected = a.astype(F64) @ b.astype(F64)
  np.testing.assert_allclose(grid[start:end], expected[start:end], rtol=1e-5 * np.sqrt(k), atol=1e-5 * np.sqrt(k))
  assert (grid[:start] == -7.0).all() and (grid[end:] == -7.0).all()


def _shifted_gemm_kernel(outer: int, spans: int, b: int, o: int, q: int, width: int) -> UOp:
  """out[p, y, i, j] = sum_k rows[k + p * width + y, i] * taps[k, j]: a flat-GEMM weight gradient (lax/_conv.py)
  launched over p, with y between it and its row i; taps does not depend on p or y."""
  p, y, i, j, k = global_range(0, outer), global_range(1, spans), global_range(2, b), global_range(3, o), \
      reduce_range(4, q)
  shift = add(add(k, mul(p, const(width))), y)
  product = mul(load(buffer(1, F32), add(mul(shift, const(b)), i)), load(buffer(2, F32), add(mul(k, const(o)), j)))
  index = add(mul(add(mul(add(mul(p, const(spans)), y), const(b)), i), const(o)), j)
  return kernel(store(buffer(0, F32), index, reduce(Ops.ADD, product, k)))


@pytest.mark.parametrize("b,o,bounds", [(64, 64, None), (24, 32, (1, 3)), (13, 80, None)])
def test_row_groups_span_the_ranges_between_launch_and_row(b, o, bounds, monkeypatch):
  """A K-blocked GEMM whose reused operand depends on none of the ranges between its launch range and its row runs
  them inside each reduce block (`span`), with one group for the whole row where the sums fit: the same float64 sums
  in the same order as without spans (bit-identical), and float64-close to numpy."""
  from tinyjax.codegen import opt
  outer, spans, q, width = 3, 4, GROUP_MIN_BLOCKS * CONTRACTION_SUM_BLOCK + 17, 5
  ast = _shifted_gemm_kernel(outer, spans, b, o, q, width)
  assert ("span", 1) in applied_opts(ast)
  rng = np.random.default_rng(13)
  rows = rng.standard_normal((q + (outer - 1) * width + spans, b)).astype(F32)
  taps = rng.standard_normal((q, o)).astype(F32)
  outputs, spanned = {}, opt.SPAN_SUMS_BYTES
  for limit in (spanned, 0):
    monkeypatch.setattr(opt, "SPAN_SUMS_BYTES", limit)
    assert (("span", 1) in applied_opts(ast)) == bool(limit)
    outputs[limit] = np.full(outer * spans * b * o, -7.0, F32)
    run_kernel(ast, [outputs[limit], rows, taps], True, *(bounds or (0, outer)))
  assert_same(outputs[spanned], outputs[0])
  start, end = bounds or (0, outer)
  got = outputs[0].reshape(outer, spans, b, o)
  want = np.stack([np.stack([rows[p * width + y:p * width + y + q].astype(F64).T @ taps.astype(F64)
                             for y in range(spans)]) for p in range(outer)])
  np.testing.assert_allclose(got[start:end], want[start:end], rtol=1e-5 * np.sqrt(q), atol=1e-5 * np.sqrt(q))
  assert (got[:start] == -7.0).all() and (got[end:] == -7.0).all()


@pytest.mark.parametrize("b,q", [(7, 50), (14, 50), (7, GROUP_MIN_BLOCKS * CONTRACTION_SUM_BLOCK + 5), (30, 50)])
def test_fixed_length_row_ends_in_one_tile_of_the_rest(b, q):
  """A row that is not the launch range (a convolution's 7 or 14 output columns) runs in tiles of TILE_ROWS and one
  tile of the rest (14: 6 + 6 + 2), not smaller tiles; with and without K-blocked groups, against float64."""
  outer, spans, o, width = 2, 3, 64, 4
  ast = _shifted_gemm_kernel(outer, spans, b, o, q, width)
  assert ("upcast", 2, TILE_ROWS) in applied_opts(ast)
  rng = np.random.default_rng(14)
  rows = rng.standard_normal((q + (outer - 1) * width + spans, b)).astype(F32)
  taps = rng.standard_normal((q, o)).astype(F32)
  out = np.zeros(outer * spans * b * o, F32)
  run_kernel(ast, [out, rows, taps], True)
  want = np.stack([np.stack([rows[p * width + y:p * width + y + q].astype(F64).T @ taps.astype(F64)
                             for y in range(spans)]) for p in range(outer)])
  np.testing.assert_allclose(out.reshape(want.shape), want, rtol=1e-5 * np.sqrt(q), atol=1e-5 * np.sqrt(q))
  plan = choose_opts(ast)
  heights = llvm._Renderer(ast, plan).row_heights(global_range(0, outer))
  assert heights == ([TILE_ROWS, b % TILE_ROWS] if b % TILE_ROWS else [TILE_ROWS])


def transpose_kernel(rows: int, columns: int, dtype: np.dtype) -> UOp:
  """out[i, j] = in[j, i] * 2: the kernel of `x.T * 2` for an x of (columns, rows)."""
  i, j = global_range(0, rows), global_range(1, columns)
  value = load(buffer(1, dtype), add(mul(j, const(rows)), i))
  return kernel(store(buffer(0, dtype), add(mul(i, const(columns)), j), mul(value, const(2, dtype))))


@pytest.mark.parametrize("dtype", [F32, F16, I32, F64], ids=str)
@pytest.mark.parametrize("rows,columns,bounds", [(64, 64, None), (97, 130, None), (97, 130, (32, 96)),
                                                 (100, 70, (0, 100)), (64, 300, (3, 50))])
def test_transpose_runs_in_blocks(rows, columns, bounds, dtype):
  """An elementwise kernel reading across its columns runs in TRANSPOSE_BLOCK x TRANSPOSE_BLOCK blocks (partial at
  the ends, any launch chunk) with the same values as the plain loops; launch chunks are whole blocks of rows."""
  from tinyjax.codegen.opt import TRANSPOSE_BLOCK
  ast = transpose_kernel(rows, columns, dtype)
  assert applied_opts(ast) == (("transpose", TRANSPOSE_BLOCK),) and launch_grain(ast) == TRANSPOSE_BLOCK
  values = sample(dtype, n=rows * columns, seed=15)
  outputs = {}
  for optimize in (True, False):
    outputs[optimize] = np.zeros(rows * columns, dtype)
    run_kernel(ast, [outputs[optimize], values], optimize, *(bounds or (0, rows)))
  assert_same(outputs[True], outputs[False])
  start, end = bounds or (0, rows)
  got, want = outputs[True].reshape(rows, columns), (values.reshape(columns, rows).T * 2).astype(dtype)
  np.testing.assert_array_equal(got[start:end], want[start:end])
  assert (got[:start] == 0).all() and (got[end:] == 0).all()


def test_only_reads_across_columns_get_transpose_blocks():
  """Small kernels, contiguous copies and reads with a stride shorter than a cache line keep their plain loops."""
  assert applied_opts(transpose_kernel(40, 200, F32)) == ()  # fewer than two blocks of rows
  i, j = global_range(0, 128), global_range(1, 128)
  copy = kernel(store(buffer(0, F32), add(mul(i, const(128)), j), load(buffer(1, F32), add(mul(i, const(128)), j))))
  assert applied_opts(copy) == ()
  strided = kernel(store(buffer(0, F32), add(mul(i, const(128)), j),
                         load(buffer(1, F32), add(mul(i, const(4)), mul(j, const(8))))))
  assert applied_opts(strided) == ()  # 8 elements apart: two per line


def _opts_line(ast: UOp) -> str:
  return next(line for line in render_llvm("k", ast).splitlines() if line.startswith("; opts:"))


@pytest.mark.parametrize("dtype,lanes", [(F32, 16), (F64, 8), (I32, 16), (BF16, 32), (BOOL, 32)], ids=str)
@pytest.mark.parametrize("rows,columns,bounds", [(64, 64, None), (97, 130, None), (97, 130, (32, 96)),
                                                 (128, 200, (64, 128))])
def test_register_transposes(rows, columns, bounds, dtype, lanes):
  """Whole transpose blocks load a square of vectors along the source's rows and transpose them in registers (two-
  input shuffles), then compute and store each row as a vector; partial blocks keep the scalar loops. Values equal the
  plain loops' and numpy's for any launch chunk, with an operand read along the columns as well (a vector load)."""
  i, j = global_range(0, rows), global_range(1, columns)
  across = load(buffer(1, dtype), add(mul(j, const(rows)), i))
  along = load(buffer(2, dtype), add(mul(i, const(columns)), j))
  value = alu(Ops.ADD if dtype != BOOL else Ops.OR, across, along) if dtype not in (BF16,) else across
  ast = kernel(store(buffer(0, dtype), add(mul(i, const(columns)), j), value))
  assert f"('registers', {lanes})" in _opts_line(ast) and "shufflevector" in render_llvm("k", ast)
  first, second = sample(dtype, n=rows * columns, seed=15), sample(dtype, n=rows * columns, seed=16)
  outputs = {}
  for optimize in (True, False):
    outputs[optimize] = np.zeros(rows * columns, dtype)
    run_kernel(ast, [outputs[optimize], first, second], optimize, *(bounds or (0, rows)))
  assert_same(outputs[True], outputs[False])
  start, end = bounds or (0, rows)
  transposed = first.reshape(columns, rows).T
  want = transposed if dtype == BF16 else transposed | second.reshape(rows, columns) if dtype == BOOL else \
      transposed + second.reshape(rows, columns)  # (float32 or float64 sums, int32 wrapping, as the kernel's)
  got = outputs[True].reshape(rows, columns)
  np.testing.assert_array_equal(got[start:end], want[start:end])
  assert (got[:start] == 0).all() and (got[end:] == 0).all()


def test_big_register_transposes_store_non_temporally(monkeypatch):
  """A register transpose writing at least NONTEMPORAL_BYTES (lowered here) stores its whole-line rows non-temporally
  (`opt.big_output`), checked per store: values equal numpy's into line-aligned memory and 16 bytes off a line, and
  DEBUG's opts name it. A float16 transpose (half a line per vector) and a small one store plainly."""
  from tinyjax.codegen import opt
  rows, columns = 96, 128
  ast = transpose_kernel(rows, columns, F32)
  assert "nontemporal" not in _opts_line(ast)
  monkeypatch.setattr(opt, "NONTEMPORAL_BYTES", 1 << 12)
  assert "('nontemporal',)" in _opts_line(ast) and "!nontemporal" in render_llvm("k", ast)
  assert "nontemporal" not in render_llvm("k", transpose_kernel(rows, columns, F16))
  values = sample(F32, n=rows * columns, seed=17)
  memory = np.zeros(rows * columns + 32, F32)
  first = (-memory.ctypes.data % 64) // 4
  for offset in (first, first + 4):
    out = memory[offset:offset + rows * columns]
    out[:] = np.nan
    run_kernel(ast, [out, values], True)
    np.testing.assert_array_equal(out.reshape(rows, columns), values.reshape(columns, rows).T * 2)


@pytest.mark.parametrize("bounds", [(0, 1000), (3, 997), (17, 40), (5, 9)], ids=str)
def test_big_elementwise_outputs_are_streamed(monkeypatch, bounds):
  """An elementwise kernel writing at least NONTEMPORAL_BYTES (lowered here) runs its innermost loop a line of values
  at a time, each vector stored non-temporally (llvm.py `vector_lanes`, `render_vectors`), one value at a time up
  to the first line and after the last whole one: any launch chunk, an output 16 bytes off a line, float64 and int32
  give numpy's values. A value without a vector form (a float32 remainder) and a gated load keep the plain loop."""
  from tinyjax.codegen import opt
  monkeypatch.setattr(opt, "NONTEMPORAL_BYTES", 1 << 10)
  n = 1000
  i = global_range(0, n)
  for dtype in (F32, F64, I32):
    value = add(mul(load(buffer(1, dtype), i), const(3, dtype)), load(buffer(2, dtype), i))
    ast = kernel(store(buffer(0, dtype), i, value))
    assert "('nontemporal',)" in _opts_line(ast) and "!nontemporal" in render_llvm("k", ast)
    first, second = sample(dtype, n=n, seed=21), sample(dtype, n=n, seed=22)
    memory = np.zeros(n + 32, dtype)
    aligned = (-memory.ctypes.data % 64) // dtype.itemsize
    for offset in (aligned, aligned + 16 // dtype.itemsize):
      out = memory[offset:offset + n]
      out[:] = 0
      run_kernel(ast, [out, first, second], True, *bounds)
      start, end = bounds
      np.testing.assert_array_equal(out[start:end], (first * dtype.type(3) + second)[start:end])
      assert (out[:start] == 0).all() and (out[end:] == 0).all()
  remainder = kernel(store(buffer(0, F32), i, alu(Ops.MOD, load(buffer(1, F32), i), const(3.0, F32))))
  assert "nontemporal" not in _opts_line(remainder)
  gated = kernel(store(buffer(0, F32), i, load(buffer(1, F32), i, alu(Ops.CMPLT, i, const(500)))))
  assert "nontemporal" not in _opts_line(gated)


def test_register_transposes_need_rows_consecutive_in_each_block():
  """A load read across the columns is transposed in registers where each aligned block of rows is consecutive in
  memory (`block_stride`): flat rows (n, o) of a (2, 64, 100) output read from (2, 100, 64) are. Rows wrapping every
  58 are consecutive only between the wraps: the blocks that straddle one are checked at run time and take the
  scalar path (values against numpy). A gated load keeps the scalar transpose blocks."""
  from tinyjax.codegen.opt import block_stride
  rows, columns = 128, 100
  i, j = global_range(0, rows), global_range(1, columns)
  flat = add(add(mul(alu(Ops.IDIV, i, const(64)), const(6400)), mul(j, const(64))), alu(Ops.MOD, i, const(64)))
  assert block_stride(flat, i, 16) == 1 and block_stride(flat, i, 64) == 1 and block_stride(flat, i, 128) is None
  ast = kernel(store(buffer(0, F32), add(mul(i, const(columns)), j), load(buffer(1, F32), flat)))
  assert "('registers', 16)" in _opts_line(ast)
  values = sample(F32, n=rows * columns, seed=17)
  out = np.zeros(rows * columns, F32)
  run_kernel(ast, [out, values], True)
  np.testing.assert_array_equal(out.reshape(2, 64, 100), values.reshape(2, 100, 64).transpose(0, 2, 1))
  wrapping = add(add(mul(alu(Ops.IDIV, i, const(58)), const(5800)), mul(j, const(58))), alu(Ops.MOD, i, const(58)))
  assert block_stride(wrapping, i, 16) is None
  ast = kernel(store(buffer(0, F32), add(mul(i, const(columns)), j), load(buffer(1, F32), wrapping)))
  assert "('registers', 16)" in _opts_line(ast)
  values = sample(F32, n=3 * columns * 58, seed=19)
  out = np.zeros(rows * columns, F32)
  run_kernel(ast, [out, values], True)
  np.testing.assert_array_equal(out.reshape(rows, columns),
                                values.reshape(3, columns, 58).transpose(0, 2, 1).reshape(-1, columns)[:rows])
  gate = alu(Ops.CMPLT, j, const(90))
  ast = kernel(store(buffer(0, F32), add(mul(i, const(columns)), j), load(buffer(1, F32), add(mul(j, const(rows)), i),
                                                                             gate)))
  assert _opts_line(ast) == f"; opts: [('transpose', {TRANSPOSE_BLOCK})]"


def test_layout_changes_get_columns_over_several_axes():
  """An elementwise kernel reading across its flat order gets one column over as many trailing axes as its loads read
  linearly: NHWC -> NCHW has columns of H * W (so it runs in register transpose blocks), a padding copy keeps columns
  of its last axis. Values against numpy."""
  host = sample(F32, n=2 * 20 * 20 * 64, seed=18).reshape(2, 20, 20, 64)
  f = tj.jit(lambda x: x.transpose(0, 3, 1, 2) * 2)
  (copy,) = kernels_of(f.lower(host)._compiled.schedule.schedule.kernels)
  ranges = global_ranges_of(copy.ast)
  assert [rng.src[0].arg for rng in ranges] == [128, 400] and "('registers', 16)" in _opts_line(copy.ast)
  np.testing.assert_array_equal(np.asarray(f(host)), host.transpose(0, 3, 1, 2) * 2)
  g = tj.jit(lambda x: tnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))) * 2)
  (padded,) = kernels_of(g.lower(host)._compiled.schedule.schedule.kernels)
  assert global_ranges_of(padded.ast)[-1].src[0].arg == 64
  np.testing.assert_array_equal(np.asarray(g(host)), np.pad(host, ((0, 0), (1, 1), (1, 1), (0, 0))) * 2)


@pytest.mark.parametrize("shape,axes", [((300, 200), (1, 0)), ((3, 70, 90), (0, 2, 1)), ((64, 65), (1, 0))])
def test_transposes_through_jit_and_vmap_match_numpy(shape, axes):
  import tinyjax as tj
  import tinyjax.numpy as tnp
  host = sample(F32, n=int(np.prod(shape)), seed=16).reshape(shape)
  got = tj.jit(lambda x: tnp.transpose(x, axes) + 1)(tnp.asarray(host))
  np.testing.assert_array_equal(np.asarray(got), np.transpose(host, axes) + 1)
  batched = tj.vmap(tj.jit(lambda x: x.T * 3))(tnp.asarray(host.reshape(-1, *shape[-2:])))
  np.testing.assert_array_equal(np.asarray(batched), np.swapaxes(host.reshape(-1, *shape[-2:]), 1, 2) * 3)


# ---------------------------------------------------------------------------------------------------------------------
# bfloat16 contractions on AMX tiles (where the host has them)

def bf16_matmul_kernel(m: int, k: int, n: int, epilogue=None) -> UOp:
  """out[i, j] = epilogue(sum_k float32(a[i, k]) * float32(b[k, j])): the kernel of a bfloat16 `dot` with float32
  sums (`preferred_element_type=float32`)."""
  rows, cols, red = global_range(0, m), global_range(1, n), reduce_range(2, k)
  a_element = cast(load(buffer(1, BF16), add(mul(rows, const(k)), red)), F32)
  b_element = cast(load(buffer(2, BF16), add(mul(red, const(n)), cols)), F32)
  result = reduce(Ops.ADD, mul(a_element, b_element), red)
  if epilogue is not None: result = epilogue(result, cols)
  return kernel(store(buffer(0, F32), add(mul(rows, const(n)), cols), result))


def _amx_available() -> bool:
  from tinyjax.codegen.opt import amx_bf16
  return amx_bf16()


@pytest.mark.parametrize("m,k,n,bounds", [(64, 64, 64, None), (70, 100, 83, None), (70, 100, 83, (5, 40)),
                                          (33, 32, 17, None), (40, 2100, 48, (0, 40)), (32, 32, 16, None),
                                          (96, 96, 100, (32, 96)), (40, 99, 40, None), (50, 33, 64, (7, 50))])
def test_bfloat16_contraction_on_amx(m, k, n, bounds, monkeypatch):
  """A bfloat16 matrix product with float32 sums runs on AMX tiles where the host has them: whole and partial row and
  column blocks, reductions with steps past the last tile product (100 = 96 + 4; odd: 99, 33) and one long enough
  for float64 block sums (2100), launch chunks that start anywhere; with a bias and ReLU epilogue. Against float64,
  and against the register tile it replaces (TINYJAX_AMX=0's plan)."""
  from tinyjax.codegen import opt

  def epilogue(total: UOp, col: UOp) -> UOp:
    return alu(Ops.MAX, add(total, load(buffer(3, F32), col)), const(0.0, F32))

  ast = bf16_matmul_kernel(m, k, n, epilogue)
  if _amx_available(): assert applied_opts(ast) == (("amx", 0, 1),)
  rng = np.random.default_rng(17)
  a, b = rng.standard_normal((m, k)).astype(BF16), rng.standard_normal((k, n)).astype(BF16)
  bias = rng.standard_normal(n).astype(F32)
  start, end = bounds or (0, m)
  outputs, available = {}, _amx_available()
  for amx in (True, False):
    monkeypatch.setattr(opt, "amx_bf16", lambda amx=amx: amx and available)
    outputs[amx] = np.full(m * n, -7.0, F32)
    run_kernel(ast, [outputs[amx], a, b, bias], True, start, end)
  want = np.maximum(a.astype(F64) @ b.astype(F64) + bias, 0)
  for got in outputs.values():
    grid = got.reshape(m, n)
    np.testing.assert_allclose(grid[start:end], want[start:end], rtol=2e-6 * np.sqrt(k), atol=2e-6 * np.sqrt(k))
    assert (grid[:start] == -7.0).all() and (grid[end:] == -7.0).all()


def test_amx_only_for_bfloat16_products_it_can_tile():
  """Float32 operands, a short reduction (< 32 steps), fewer rows than a block (b's pack would serve too few) and
  a transposed a (its reduce steps strided) keep the register tile."""
  assert not any(opt[0] == "amx" for opt in applied_opts(matmul_kernel(64, 64, 64, F32)))
  assert not any(opt[0] == "amx" for opt in applied_opts(bf16_matmul_kernel(64, 16, 64)))
  assert not any(opt[0] == "amx" for opt in applied_opts(bf16_matmul_kernel(16, 1024, 1024)))
  rows, cols, red = global_range(0, 64), global_range(1, 64), reduce_range(2, 64)
  strided = cast(load(buffer(1, BF16), add(mul(red, const(64)), rows)), F32)  # a.T @ b
  other = cast(load(buffer(2, BF16), add(mul(red, const(64)), cols)), F32)
  ast = kernel(store(buffer(0, F32), add(mul(rows, const(64)), cols), reduce(Ops.ADD, mul(strided, other), red)))
  assert not any(opt[0] == "amx" for opt in applied_opts(ast))


def test_bfloat16_matmul_through_jit_grad_and_vmap():
  """`jnp.dot` of bfloat16 arrays (float32 or bfloat16 results), its gradient and a vmapped product, against numpy
  in float64: the bfloat16 operands stay bfloat16 up to the kernel, where AMX reads them (a register tile's row
  operand gets a float32 copy of its own: `test_half_row_operand_is_widened_once`)."""
  import tinyjax as tj
  import tinyjax.numpy as tnp
  from tinyjax import lax
  rng = np.random.default_rng(18)
  a, b = rng.standard_normal((96, 200)).astype(BF16), rng.standard_normal((200, 72)).astype(BF16)
  want = a.astype(F64) @ b.astype(F64)
  got = tj.jit(lambda x, y: lax.dot(x, y, preferred_element_type=np.float32))(tnp.asarray(a), tnp.asarray(b))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
  rounded = tj.jit(lambda x, y: x @ y)(tnp.asarray(a), tnp.asarray(b))
  assert rounded.dtype == BF16
  np.testing.assert_allclose(np.asarray(rounded).astype(F64), want, rtol=1e-2, atol=1e-1)
  grad = tj.jit(tj.grad(lambda x, y: lax.dot(x, y, preferred_element_type=np.float32).sum()))(
    tnp.asarray(a), tnp.asarray(b))
  np.testing.assert_allclose(np.asarray(grad).astype(F64), np.ones((96, 72)) @ b.astype(F64).T, rtol=1e-2, atol=1e-1)
  stacked = rng.standard_normal((3, 40, 64)).astype(BF16)
  batched = tj.vmap(lambda x: lax.dot(x, b[:64], preferred_element_type=np.float32))(tnp.asarray(stacked))
  np.testing.assert_allclose(np.asarray(batched), stacked.astype(F64) @ b[:64].astype(F64), rtol=1e-5, atol=1e-4)


def _half_loads(ast: UOp) -> list[UOp]:
  return [node for node in ast.toposort if node.op is Ops.LOAD and node.dtype in (BF16, F16)]


@pytest.mark.parametrize("case", ["bf16", "f16", "bf16_rounded", "bf16_x_f32", "f32_x_bf16", "transposed", "batched",
                                  "tall"])
def test_half_row_operand_is_widened_once(case, on_cpu):
  """A register tile broadcasts each value of its row operand; read as bfloat16 or float16, each such value took a
  load, a conversion and a broadcast (a 1024^3 bfloat16 product with float32 sums ran at 60% of the float32 one). The
  row operand is now copied as float32 first (a kernel of its own, reading it once) and the column operand converted
  where it is packed, so the contraction reads one half-precision operand, or none. Not on AMX tiles, which read
  bfloat16. Values against numpy in float64."""
  rng = np.random.default_rng(len(case))
  m, k, n = (600, 96, 80) if case == "tall" else (96, 200, 72)
  half = F16 if case == "f16" else BF16
  a_dtype = F32 if case == "f32_x_bf16" else half
  b_dtype = F32 if case == "bf16_x_f32" else half
  a, b = rng.standard_normal((m, k)).astype(a_dtype), rng.standard_normal((k, n)).astype(b_dtype)
  if case == "transposed":
    a = np.ascontiguousarray(a.T)
    f = tj.jit(lambda x, y: tj.lax.dot(x.T, y, preferred_element_type=np.float32))
  elif case == "batched":
    a = rng.standard_normal((3, m, k)).astype(a_dtype)
    f = tj.jit(tj.vmap(lambda x, y: tj.lax.dot(x, y, preferred_element_type=np.float32), in_axes=(0, None)))
  elif case in ("bf16_rounded", "bf16_x_f32", "f32_x_bf16"):  # (mixed: the half operand promoted to float32)
    f = tj.jit(lambda x, y: x @ y)
  else:
    f = tj.jit(lambda x, y: tj.lax.dot(x, y, preferred_element_type=np.float32))
  kernels = kernels_of(f.lower(a, b)._compiled.schedule.schedule.kernels)
  (product,) = [kernel for kernel in kernels if kernel.name.startswith("r_")]
  copies = [kernel for kernel in kernels if kernel.name.startswith("e_")]
  if not _amx_available():
    # (float16 buffers are read as float32 copies of their own on the CPU anyway: lower/schedule.py `_widened_load`)
    widened = (a_dtype != F32) + (b_dtype == F16)
    assert len(copies) == widened
    for copy in copies:
      (store,) = [node for node in copy.ast.toposort if node.op is Ops.STORE]
      assert store.src[2].op is Ops.CAST and store.src[2].dtype == F32 and len(_half_loads(copy.ast)) == 1
    # (what is left: the column operand, converted as it is packed)
    assert len(_half_loads(product.ast)) == (b_dtype == BF16)
    assert any(opt[0] == "upcast" for opt in applied_opts(product.ast))
  wide_a, wide_b = a.astype(F64), b.astype(F64)
  want = (wide_a.T if case == "transposed" else wide_a) @ wide_b
  got = np.asarray(f(a, b)).astype(F64)
  if case == "bf16_rounded": np.testing.assert_allclose(got, want.astype(BF16).astype(F64), rtol=1e-2, atol=1e-2)
  else: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("stride", [1, 2])
def test_half_convolution_input_is_widened_as_laid_out(stride, on_cpu):
  """A bfloat16 convolution's input is read through overlapping sliding windows: widened like a GEMM's row operand,
  it is copied as float32 as it is laid out, the span its windows read (the padded input), not the 3x3 patches (9
  times the input), and the tile reads that copy (3x3 NHWC 32x56x56x64 -> 64 on AVX2: 118 -> 146 GFLOP/s, float32's
  143). Values against numpy in float64, strides 1 and 2."""
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 12, 12, 16)).astype(BF16)
  w = (rng.standard_normal((3, 3, 16, 32)) / 12).astype(BF16)
  f = tj.jit(lambda x, w: tj.lax.conv_general_dilated(x, w, (stride, stride), ((1, 1), (1, 1)),
                                                      dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                      preferred_element_type=np.float32))
  padded_size = 2 * 14 * 14 * 16
  widening = []
  for step in kernels_of(f.lower(x, w)._compiled.schedule.schedule.kernels):
    stores = [node for node in step.ast.toposort if node.op is Ops.STORE]
    if any(store.src[2].op is Ops.CAST and store.dtype == np.float32 for store in stores): widening.append(step)
    if step.name.startswith("r_"):  # (the tile reads the float32 copy; only the packed weights are bfloat16)
      assert sum(node.op is Ops.LOAD and node.dtype == BF16 for node in step.ast.toposort) <= 1
  assert len(widening) == 1 and widening[0].work <= padded_size, [(k.name, k.work) for k in widening]
  padded = np.pad(x.astype(F64), ((0, 0), (1, 1), (1, 1), (0, 0)))
  want = sum(np.einsum("nhwc,co->nhwo", padded[:, i:i + 12, j:j + 12], w[i, j].astype(F64))
             for i in range(3) for j in range(3))
  np.testing.assert_allclose(np.asarray(f(x, w)), want[:, ::stride, ::stride], rtol=1e-5, atol=1e-4)


def test_cached_amx_kernels_run_in_a_fresh_process(tmp_path):
  """A process that finds a bfloat16 product's schedule and kernels in the disk cache (no lowering, no rendering)
  still asks the OS for AMX's tile state before running them: the cache key says whether AMX was used, and looking
  it up asks (an AMX instruction without the permission kills the process with SIGILL)."""
  import subprocess
  import sys
  script = ("import numpy as np, ml_dtypes, tinyjax as tj, tinyjax.numpy as tnp\n"
            "a = tnp.asarray(np.ones((64, 64), ml_dtypes.bfloat16))\n"
            "print(float(tj.jit(lambda x: tj.lax.dot(x, x, preferred_element_type=np.float32))(a).sum()))\n")
  env = {**os.environ, "TINYJAX_CACHE_DIR": str(tmp_path)}
  for _ in range(2):  # lowered and compiled, then everything from the cache
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout) == 64.0 ** 3


@pytest.mark.parametrize("batch,m,k,n,bounds", [(3, 40, 64, 72, None), (5, 33, 100, 17, (1, 4)),
                                                (2, 32, 1100, 40, None)])
def test_batched_bfloat16_contraction_on_amx(batch, m, k, n, bounds):
  """A batch of bfloat16 products (out[p, i, j] = sum_k a[p, i, k] * b[p, k, j], a vmapped matmul or attention's
  heads) runs on AMX tiles too, launched over the batch: partial blocks, a reduce tail, float64 block sums, a chunk of
  the batch; against float64."""
  p, rows, cols, red = global_range(0, batch), global_range(1, m), global_range(2, n), reduce_range(3, k)
  a_element = cast(load(buffer(1, BF16), add(add(mul(p, const(m * k)), mul(rows, const(k))), red)), F32)
  b_element = cast(load(buffer(2, BF16), add(add(mul(p, const(k * n)), mul(red, const(n))), cols)), F32)
  out_index = add(add(mul(p, const(m * n)), mul(rows, const(n))), cols)
  ast = kernel(store(buffer(0, F32), out_index, reduce(Ops.ADD, mul(a_element, b_element), red)))
  if _amx_available(): assert applied_opts(ast) == (("amx", 1, 2),) and launch_grain(ast) == 1
  rng = np.random.default_rng(19)
  a, b = rng.standard_normal((batch, m, k)).astype(BF16), rng.standard_normal((batch, k, n)).astype(BF16)
  out = np.full(batch * m * n, -7.0, F32)
  start, end = bounds or (0, batch)
  run_kernel(ast, [out, a, b], True, start, end)
  got, want = out.reshape(batch, m, n), np.einsum("pik,pkj->pij", a.astype(F64), b.astype(F64))
  np.testing.assert_allclose(got[start:end], want[start:end], rtol=2e-6 * np.sqrt(k), atol=2e-6 * np.sqrt(k))
  assert (got[:start] == -7.0).all() and (got[end:] == -7.0).all()


@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (70, 100, 83), (40, 1100, 33)])
def test_bfloat16_product_with_a_transposed_b_on_amx(m, k, n):
  """`g @ w.T` (b read across its rows: stride k along the columns) packs b for AMX as well; against float64."""
  rows, cols, red = global_range(0, m), global_range(1, n), reduce_range(2, k)
  a_element = cast(load(buffer(1, BF16), add(mul(rows, const(k)), red)), F32)
  b_element = cast(load(buffer(2, BF16), add(mul(cols, const(k)), red)), F32)
  ast = kernel(store(buffer(0, F32), add(mul(rows, const(n)), cols), reduce(Ops.ADD, mul(a_element, b_element), red)))
  if _amx_available(): assert applied_opts(ast) == (("amx", 0, 1),)
  rng = np.random.default_rng(20)
  a, w = rng.standard_normal((m, k)).astype(BF16), rng.standard_normal((n, k)).astype(BF16)
  out = np.zeros(m * n, F32)
  run_kernel(ast, [out, a, w], True)
  want = a.astype(F64) @ w.astype(F64).T
  np.testing.assert_allclose(out.reshape(m, n), want, rtol=2e-6 * np.sqrt(k), atol=2e-6 * np.sqrt(k))


@pytest.mark.parametrize("form", ["a @ b", "a.T @ b", "a @ b.T"])
def test_packs_in_panels_past_pack_bytes_match_numpy(form, on_cpu):
  """A GEMM whose reused operand's pack would pass PACK_BYTES (K = 5120 + 165 float32 steps, not a whole number of
  blocks; 300 rows, not a whole number of row groups) packs it panel by panel in one kernel: numpy's values for a
  plain, a transposed-a (copied first: schedule.py RELAYOUT_ACROSS_BYTES) and a transposed-b (packed across its rows)
  product, also through jit(grad)."""
  import tinyjax as tj
  m, k, n = 300, PACK_BYTES // (4 * 64) + 165, 128
  rng = np.random.default_rng(7)
  a, b = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32)
  args = {"a @ b": (a, b), "a.T @ b": (np.ascontiguousarray(a.T), b), "a @ b.T": (a, np.ascontiguousarray(b.T))}[form]
  product = {"a @ b": lambda x, y: x @ y, "a.T @ b": lambda x, y: x.T @ y, "a @ b.T": lambda x, y: x @ y.T}[form]
  f = tj.jit(product)
  text = f.lower(*args).as_text()
  assert text.count("# kernel ") == (2 if form == "a.T @ b" else 1) and text.count("# kernel r_") == 1
  assert "('panel'," in text
  expected = a.astype(F64) @ b.astype(F64)
  tolerance = 1e-5 * np.abs(expected).max()
  np.testing.assert_allclose(np.asarray(f(*args), F64), expected, atol=tolerance)
  # d/dy of sum(product(x, y) * c) through the same kernels' transposes
  c = rng.standard_normal((m, n)).astype(F32)
  grad_y = tj.jit(tj.grad(lambda x, y: (product(x, y) * c).sum(), argnums=1))(*args)
  want = a.astype(F64).T @ c.astype(F64)
  np.testing.assert_allclose(np.asarray(grad_y, F64), want.T if form == "a @ b.T" else want,
                             atol=1e-5 * np.abs(want).max())


def _prefetched_buffers(ir: str) -> list[str]:
  """The kernel parameters (%bufN) whose elements an LLVM IR's prefetches address, one entry per prefetch."""
  addresses = dict(re.findall(r"(%\w+) = getelementptr \w+, ptr (%buf\d+),", ir))
  return [addresses[address] for address in re.findall(r"call void @llvm\.prefetch\.p0\(ptr (%\w+),", ir)]


def _reduce_kernel_ir(fun, *args) -> str:
  compiled = tj.jit(fun).lower(*args)._compiled
  kernels = [kernel for kernel in kernels_of(compiled.schedule.schedule.kernels) if kernel.name.startswith("r_")]
  kernel = max(kernels, key=lambda kernel: len(kernel.ast.toposort))
  return render_llvm(kernel.name, kernel.ast)


def test_panelled_gemm_prefetches_the_next_panel():
  """A GEMM packed panel by panel prefetches, one line per tile step, what the next panel reads of its row operand
  and of its packed operand (llvm.py `panel_prefetch`): `x.T @ y`'s x and y, a 1x1 NCHW convolution's weight
  gradient's two operands (both read along their rows, the flat (n, h*w) reduce range non-linear in their indices).
  A GEMM whose pack holds every step has no panels and no prefetches. The prefetches change no value (against
  numpy)."""
  long_k, short_k = PACK_BYTES // (4 * 64) + 165, 512
  irs = {k: _reduce_kernel_ir(lambda x, y: x.T @ y, tnp.zeros((k, 300)), tnp.zeros((k, 64)))
         for k in (long_k, short_k)}
  assert set(_prefetched_buffers(irs[long_k])) == {"%buf1", "%buf2"}  # (x: the row operand; y packed)
  assert "llvm.prefetch" not in irs[short_k]

  rng = np.random.default_rng(3)
  x, g = (rng.standard_normal((16, 64, 56, 56)).astype(F32) for _ in range(2))
  w = (rng.standard_normal((64, 64, 1, 1)) / 8).astype(F32)

  def weight_gradient(x, w, g):
    conv = lambda w: tj.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return tj.grad(lambda w: (conv(w) * g).sum())(w)
  assert len(set(_prefetched_buffers(_reduce_kernel_ir(weight_gradient, x, w, g)))) == 2
  want = np.einsum("ncp,nop->oc", x.reshape(16, 64, -1).astype(F64), g.reshape(16, 64, -1).astype(F64))
  np.testing.assert_allclose(np.asarray(tj.jit(weight_gradient)(x, w, g))[:, :, 0, 0], want, rtol=1e-4, atol=1e-3)


def test_in_place_column_operand_prefetches_the_next_column_tile():
  """A register tile reading its column operand in place across rows (an NCHW 1x1 convolution's input: each channel
  a row of its own, launched over the images) prefetches, one line per tile step, what the next column tile reads of
  it (llvm.py `column_prefetch`); an operand without a range outside the tile (a plain `a @ b`) gets none. The
  prefetches change no value (against numpy)."""
  rng = np.random.default_rng(4)
  x = rng.standard_normal((3, 64, 24, 24)).astype(F32)
  w = (rng.standard_normal((64, 64, 1, 1)) / 8).astype(F32)

  def conv(x, w): return tj.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
  ir = _reduce_kernel_ir(conv, x, w)
  assert "; opts: [('reduce_outside'" in ir and "'pack'" not in ir  # (read in place: opt.py `_in_place`)
  assert set(_prefetched_buffers(ir)) == {"%buf2"}  # (the input; buf1 is the kernel's taps)
  assert "llvm.prefetch" not in _reduce_kernel_ir(lambda a, b: a @ b, tnp.zeros((96, 64)), tnp.zeros((64, 128)))
  want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(F64), x.astype(F64))
  np.testing.assert_allclose(np.asarray(tj.jit(conv)(x, w)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epilogue", ["add", "mul", "where"])
def test_register_tile_epilogue_reading_an_array_transposed(epilogue):
  """A contraction's epilogue that reads another array across the column (`a @ b + c.T`) is computed per element:
  the vector epilogue loaded 16 consecutive elements of c's row instead of its column (wrong values). Against
  numpy."""
  import tinyjax as tj
  import tinyjax.numpy as tnp
  rng = np.random.default_rng(12)
  a, b, c = (rng.standard_normal((64, 64)).astype(F32) for _ in range(3))
  fun = {"add": lambda a, b, c: a @ b + c.T, "mul": lambda a, b, c: (a @ b) * c.T,
         "where": lambda a, b, c: tnp.where(c.T > 0, a @ b, 0.0)}[epilogue]
  a64, b64, c64 = (x.astype(F64) for x in (a, b, c))
  want = {"add": a64 @ b64 + c64.T, "mul": (a64 @ b64) * c64.T, "where": np.where(c64.T > 0, a64 @ b64, 0.0)}[epilogue]
  np.testing.assert_allclose(np.asarray(tj.jit(fun)(a, b, c)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k, n", [(512, 512, 512), (384, 256, 320), (256, 8192, 64), (64, 200, 128)])
def test_operand_read_across_is_packed_in_transposed_blocks(m, k, n, on_cpu):
  """`g @ w.T`: w is read across (strided along the output column, contiguous along the sum) and packed per column
  tile; where the tile and the sum (or its panel) are whole blocks of 16, in 16x16 blocks transposed in registers
  (shuffles), else element by element (k = 200). Values against numpy in float64."""
  rng = np.random.default_rng(k)
  g, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
  f = tj.jit(lambda a, b: a @ b.T)
  compiled = f.lower(g, w)._compiled.schedule.schedule
  (kernel,) = [kernel for kernel in kernels_of(compiled.kernels) if kernel.name.startswith("r_")]
  assert any(opt[0] == "pack" for opt in applied_opts(kernel.ast))
  butterfly = "<16 x i32> <i32 0, i32 16, i32 2, i32 18, i32 4, i32 20,"  # (the transpose's last round of shuffles)
  assert (butterfly in render_llvm(kernel.name, kernel.ast)) == (k % 16 == 0)
  np.testing.assert_allclose(np.asarray(f(g, w)), g.astype(np.float64) @ w.T.astype(np.float64), rtol=2e-5, atol=2e-4)


@pytest.mark.parametrize("n, c, h, w, o, blocks", [(4, 64, 12, 12, 48, True), (24, 64, 16, 16, 64, True),
                                                    (3, 32, 7, 7, 32, False), (5, 32, 4, 6, 16, False)])
def test_flat_reduce_read_across_is_packed_in_transposed_blocks(n, c, h, w, o, blocks, on_cpu):
  """An NCHW 1x1 convolution's weight gradient sums over the flat (n, h*w) range r, reading its input at
  (r // (h*w)) * c*h*w + r % (h*w): contiguous inside aligned blocks of 16 steps where h*w is a multiple of 16, so the
  input's pack is made in transposed 16x16 blocks there (also per panel: 24x16x16 steps), and element by element
  (gathers) for 7x7 and 4x6 grids. Values against numpy in float64."""
  rng = np.random.default_rng(h * w)
  x, g = rng.standard_normal((n, c, h, w)).astype(F32), rng.standard_normal((n, o, h, w)).astype(F32)
  f = tj.jit(lambda x, g: tj.lax.conv_general_dilated(x, g, (1, 1), "VALID",
                                                      dimension_numbers=("CNHW", "IOHW", "CNHW")))
  compiled = f.lower(x, g)._compiled.schedule.schedule
  (kernel,) = [kernel for kernel in kernels_of(compiled.kernels) if kernel.name.startswith("r_") and
               any(opt[0] == "pack" for opt in applied_opts(kernel.ast))]
  butterfly = "<16 x i32> <i32 0, i32 16, i32 2, i32 18, i32 4, i32 20,"
  assert (butterfly in render_llvm(kernel.name, kernel.ast)) == blocks
  want = np.einsum("ncp,nop->oc", x.reshape(n, c, -1).astype(F64), g.reshape(n, o, -1).astype(F64))
  np.testing.assert_allclose(np.asarray(f(x, g)).reshape(o, c), want, rtol=2e-5, atol=2e-4)


@pytest.mark.parametrize("blocks", [1, 2, FLOAT32_BLOCKS, FLOAT32_BLOCKS + 1, 4 * FLOAT32_BLOCKS])
def test_few_block_sums_add_up_in_float32(blocks: int):
  """A register tile's float32 block sums are added up in float32 where there are at most FLOAT32_BLOCKS of them
  (no float64 in the kernel: widening the tile at every block's end cost the MLP's GEMMs ~3%), in float64 beyond
  (the K-blocked row groups of the longest: always). Both stay as close to float64 as the blocks allow: products of
  normal values within 1e-6 * sqrt(k) * scale, and a long sum of 0.1s within CONTRACTION_SUM_RTOL."""
  m, k, n = 40, blocks * CONTRACTION_SUM_BLOCK - 3, 32
  ast = matmul_kernel(m, k, n, F32)
  assert llvm._Renderer(ast, choose_opts(ast)).k_blocked() == (blocks > GROUP_MIN_BLOCKS)
  source = render_llvm("kernel", ast, optimize=True)
  assert ("double" in source) == (blocks > FLOAT32_BLOCKS)
  a, b = matmul_inputs(m, k, n, F32, seed=3)
  out = np.zeros(m * n, F32)
  run_kernel(ast, [out, a, b], True)
  expected = a.astype(F64) @ b.astype(F64)
  scale = np.abs(a).astype(F64) @ np.abs(b).astype(F64)
  assert (np.abs(out.reshape(m, n) - expected) / scale).max() < 1e-6 * np.sqrt(k)
  tenths = np.full((m, k), 0.1, F32)
  run_kernel(ast, [out, tenths, np.ones((k, n), F32)], True)
  exact = float(np.float32(0.1)) * k
  assert np.abs(out.astype(F64) - exact).max() / exact < CONTRACTION_SUM_RTOL


def test_tiles_wider_than_their_column_are_not_emitted():
  """A 10-column product's 64- and 16-column tiles could never run: only its one-column tiles are rendered (a sixth
  of the multiplies for LLVM to compile), and the values are numpy's."""
  m, k, n = 64, 48, 10
  ast = matmul_kernel(m, k, n, F32)
  source = render_llvm("kernel", ast, optimize=True)
  assert choose_opts(ast).columns > n and "x float>" not in source
  a, b = matmul_inputs(m, k, n, F32, seed=4)
  out = np.zeros(m * n, F32)
  run_kernel(ast, [out, a, b], True)
  np.testing.assert_allclose(out.reshape(m, n), a.astype(F64) @ b.astype(F64), rtol=1e-5, atol=1e-5)


def test_padding_and_concatenation_copies_split_their_inner_loop_at_the_gates(on_cpu):
  """The innermost loop of a copy through a padding or a concatenation runs in parts between its gates' bounds
  (`gate_split`), every gate a constant in each part: the padding's window [3, 33) of 37 and the two parts of a
  concatenation. Values against numpy, with and without the loop optimisations (NOOPT's plain loops)."""
  from tinyjax.codegen.llvm import gate_split
  host = sample(F32, n=3 * 5 * 20 * 30, seed=19).reshape(3, 5, 20, 30)
  other = sample(F32, n=3 * 5 * 20 * 7, seed=20).reshape(3, 5, 20, 7)
  cases = [(lambda x, y: tnp.pad(x, ((0, 0), (0, 0), (1, 2), (3, 4))) * 2, [(0, 3), (3, 33), (33, 37)],
            np.pad(host, ((0, 0), (0, 0), (1, 2), (3, 4))) * 2),
           (lambda x, y: tnp.concatenate([x, y + 1], axis=-1), [(0, 30), (30, 37)],
            np.concatenate([host, other + 1], axis=-1))]
  for f, parts, want in cases:
    (copy,) = kernels_of(tj.jit(f).lower(host, other)._compiled.schedule.schedule.kernels)
    split = gate_split(copy.ast, global_ranges_of(copy.ast)[-1])
    assert [(first, last) for first, last, _ in split] == parts
    assert f"('gate_split', {global_ranges_of(copy.ast)[-1].arg[0]}, {len(parts)})" in _opts_line(copy.ast)
    if len(parts) == 3:  # each bound of the window: false before it, true inside, false after it for one of them
      assert [sorted(values.values()) for _, _, values in split] == [[False, True], [True, True], [False, True]]
    np.testing.assert_array_equal(np.asarray(tj.jit(f)(host, other)), want)
    for optimize in (True, False):
      out = np.zeros(want.size, F32)
      run_kernel(copy.ast, [out, host, other] if len(copy.slots) == 3 else [out, host], optimize,
                 0, copy.outer_size)
      np.testing.assert_array_equal(out.reshape(want.shape), want)


def test_register_transposes_fuse_casts_broadcasts_and_selects(on_cpu):
  """Transposes with what fuses into them (a cast to bfloat16, a row or column broadcast, a select, a comparison) in
  register transpose blocks, against numpy; their gradients (transposes again) against the identity d/dx sum(f^2) =
  2 f f'; vmap(jit) against a loop; float64 and int64 under x64 (8 lanes)."""
  import ml_dtypes
  rng = np.random.default_rng(21)
  x = rng.standard_normal((96, 130)).astype(F32)
  b, c = rng.standard_normal(96).astype(F32), rng.standard_normal(130).astype(F32)
  cases = [(lambda a: a.T.astype(tnp.bfloat16), lambda a: a.T.astype(ml_dtypes.bfloat16), True),  # (rounded on
           (lambda a: a.T + b[None, :], lambda a: a.T + b[None, :], True),  # the vectors, as the scalar code does)
           (lambda a: tnp.where(a.T > 0, a.T * 2, c[:, None]), lambda a: np.where(a.T > 0, a.T * 2, c[:, None]), True),
           (lambda a: (a.T > 0).astype(tnp.int32), lambda a: (a.T > 0).astype(np.int32), True)]
  for f, g, registers in cases:
    (copy,) = kernels_of(tj.jit(f).lower(x)._compiled.schedule.schedule.kernels)
    assert ("('registers'," in _opts_line(copy.ast)) == registers
    np.testing.assert_array_equal(np.asarray(tj.jit(f)(x)), g(x))
  grad = np.asarray(tj.jit(tj.grad(lambda a: (tnp.sin(a.T) * c[:, None]).sum()))(x))
  np.testing.assert_allclose(grad, (np.cos(x.T.astype(F64)) * c[:, None]).T, rtol=1e-5, atol=1e-6)
  stacked = np.stack([x, -x])
  np.testing.assert_array_equal(np.asarray(tj.vmap(tj.jit(lambda a: a.T * 3))(stacked)), stacked.transpose(0, 2, 1) * 3)
  with tj.config.override("jax_enable_x64", True):
    for host in (rng.standard_normal((70, 100)), rng.integers(-5, 5, (64, 64))):
      (copy,) = kernels_of(tj.jit(lambda a: a.T + 1).lower(host)._compiled.schedule.schedule.kernels)
      assert "('registers', 8)" in _opts_line(copy.ast)
      np.testing.assert_array_equal(np.asarray(tj.jit(lambda a: a.T + 1)(host)), host.T + 1)


@pytest.mark.parametrize("kind", ["vectors", "scalars", "dot", "groups"])
def test_contraction_with_a_random_epilogue(kind, on_cpu, monkeypatch):
  """A sum with a random normal added in its epilogue (DP-SGD's noised gradient: threefry's 20 rounds of integer
  adds, rotations and xors, then erf_inv) stays one kernel of modest IR: the rotations are vector shifts, so the
  epilogue runs on the tile's vectors, in a loop over the tile's rows from an array of its sums (`looped_epilogue`);
  where it can't run on vectors (it also reads an array transposed), or in a dot tile (`a @ b.T`, 40 rows), in loops
  over the tile's elements; in K-blocked row groups (4096 steps), over each row's columns; not unrolled per element
  (256 scalar copies: 2.4 MB of IR, 3 s of LLVM; a dot tile's 16: 150 KB; a row group's: 621 KB). Launch chunks
  ending inside a tile (40 rows of 6-row tiles) store only their own rows. The noise equals random.normal's own
  kernel's, the sum numpy's in float64. (Lowered for one thread: with more, the two row groups of 30 and 10 rows
  would leave one idle, and the sum would split, its epilogue going to the second stage, lower/split.py.)"""
  from tinyjax import random
  from tinyjax.lower import realize
  monkeypatch.setattr(realize, "cpu_threads", lambda: 1)
  monkeypatch.setattr(realize, "_memory_cache", {})
  m, k, n = 40, {"dot": 512, "groups": 4096}.get(kind, 64), 48
  rng = np.random.default_rng(5)
  a, c = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((n, m)).astype(F32)
  b = rng.standard_normal((n, k) if kind == "dot" else (k, n)).astype(F32)
  key = random.key(3)

  def f(a, b, c, key):
    total = (a @ b.T if kind == "dot" else a @ b) + random.normal(key, (m, n))
    return total + c.T if kind == "scalars" else total
  compiled = tj.jit(f).lower(a, b, c, key)._compiled.schedule.schedule
  (kernel,) = [kernel for kernel in kernels_of(compiled.kernels) if kernel.name.startswith("r_")]
  plan = llvm.choose_opts(kernel.ast)
  renderer = llvm._Renderer(kernel.ast, plan)
  assert renderer.vector_epilogue == (kind in ("vectors", "groups")) and renderer.looped_epilogue
  assert plan.dot == (kind == "dot") and (plan.group > 0) == (kind == "groups")
  source = render_llvm(kernel.name, kernel.ast)
  assert len(source) < 100_000 and ("lshr <16 x i32>" in source) == (kind in ("vectors", "groups"))
  noise = np.asarray(random.normal(key, (m, n)))
  want = a.astype(F64) @ (b.T if kind == "dot" else b).astype(F64) + noise + (c.T if kind == "scalars" else 0)
  np.testing.assert_allclose(np.asarray(tj.jit(f)(a, b, c, key)), want, rtol=1e-5, atol=1e-4)


def test_transcendental_epilogue_is_looped(on_cpu):
  """A layer's tanh after its product (31 operations with an EXP2) is too costly to unroll into every vector of the
  register tile (a PINN's GEMMs were 185 KB of IR each): it runs in a loop over the tile's rows (`looped_epilogue`,
  LOOPED_EPILOGUE_BUDGET), while a ReLU and bias stays unrolled; both against numpy in float64."""
  rng = np.random.default_rng(11)
  x, w, b = rng.standard_normal((256, 64)).astype(F32), rng.standard_normal((64, 64)).astype(F32) / 8, \
      rng.standard_normal(64).astype(F32)
  for activation, looped, reference in ((tnp.tanh, True, np.tanh), (lambda v: tnp.maximum(v, 0), False,
                                                                     lambda v: np.maximum(v, 0))):
    f = tj.jit(lambda x, w, b, activation=activation: activation(x @ w + b))
    (kernel,) = [k for k in kernels_of(f.lower(x, w, b)._compiled.schedule.schedule.kernels) if k.name.startswith("r_")]
    plan = llvm.choose_opts(kernel.ast)
    assert llvm._Renderer(kernel.ast, plan).looped_epilogue == looped
    if looped: assert len(render_llvm(kernel.name, kernel.ast)) < 60_000
    want = reference(x.astype(F64) @ w.astype(F64) + b)
    np.testing.assert_allclose(np.asarray(f(x, w, b)), want, rtol=2e-5, atol=2e-5)


def _loop_blocks(assembly: str) -> list[str]:
  """The assembly's basic blocks that end in a backward branch to their own label (a loop's body)."""
  blocks, label, lines = [], None, []
  for line in assembly.splitlines():
    if re.match(r"^\.?\w+:", line):
      label, lines = line.rstrip(":"), []
      continue
    lines.append(line)
    if label and re.search(rf"\sj\w+\s+{re.escape(label)}\s*$", line): blocks.append("\n".join(lines))
  return blocks


@pytest.mark.parametrize("activation", ["tanh", "gelu", "gelu_grad"])
@pytest.mark.parametrize("n", [96, 88])
def test_long_epilogue_leaves_the_tile_its_registers(activation, n, on_cpu, monkeypatch):
  """A looped epilogue's constants (tanh's and GELU's polynomials, ~10-20 vectors) are not held in registers through
  the register tile's FMA loop: LLVM hoisted them out of the tile's loops, and the FMA loop spilled accumulators to
  the stack instead (1024x256 @ 256x1024 with tanh 9.1 ms against 3.8 without; llvm_compile.CODEGEN_OPTIONS sinks
  them back). With the host's own tiles, the FMA loop (the loop with a whole tile's FMAs) touches no stack slot in
  the code the project's pipeline makes. Values against numpy in float64, 96 columns and 88 (a partial tile)."""
  from conftest import pinned_vectors

  from tinyjax.devices import cpu, llvm_compile
  features = cpu.cpu_features().split(",")
  if "+fma" not in features: pytest.skip("the check reads x86 FMA assembly (vfmadd231ps); this host has no FMA")
  rng = np.random.default_rng(n)
  x, w = rng.standard_normal((64, 256)).astype(F32), (rng.standard_normal((256, n)) / 16).astype(F32)
  z, b = rng.standard_normal((64, n)).astype(F32), rng.standard_normal(n).astype(F32)
  exact = {"tanh": np.tanh, "gelu": lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))}
  if activation == "gelu_grad":  # (GELU's derivative at the product: from another operand of its size, the
    # product would get a kernel of its own, lower/schedule.py `_costly_epilogue_contractions`)
    f = tj.jit(lambda x, w, z, b: tj.vjp(tj.nn.gelu, x @ w + b)[1](tnp.ones_like(z))[0])
    u = x.astype(F64) @ w.astype(F64) + b
    inner = np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)
    want = 0.5 * (1 + np.tanh(inner)) + 0.5 * u * (1 - np.tanh(inner) ** 2) * np.sqrt(2 / np.pi) * \
        (1 + 3 * 0.044715 * u ** 2)
  else:
    f = tj.jit(lambda x, w, z, b: (tnp.tanh if activation == "tanh" else tj.nn.gelu)(x @ w + b))
    want = exact[activation](x.astype(F64) @ w.astype(F64) + b)
  with pinned_vectors(monkeypatch, 64 if "+avx512f" in features else 32):
    (kernel,) = [k for k in kernels_of(f.lower(x, w, z, b)._compiled.schedule.schedule.kernels)
                 if k.name.startswith("r_")]
    plan = llvm.choose_opts(kernel.ast)
    assert llvm._Renderer(kernel.ast, plan).looped_epilogue and plan.row is not None
    source = render_llvm(kernel.name, kernel.ast)
    np.testing.assert_allclose(np.asarray(f(x, w, z, b)), want, rtol=2e-5, atol=2e-5)
  triple, data_layout, name, features = cpu._target()
  machine = llvm_compile.target_machine(triple, name, features, 3)
  module = llvm_compile.parse(kernel.name, source, None, triple, data_layout)
  llvm_compile.optimize(module, machine, 3)
  fma_loops = [block for block in _loop_blocks(machine.emit_assembly(module))
               if len(re.findall(r"vfmadd231ps", block)) >= plan.rows * plan.columns // plan.lanes]
  assert fma_loops and not any("rsp" in block for block in fma_loops)


def test_scalar_epilogue_is_looped_per_element(on_cpu):
  """An epilogue that can't run on vectors (it reads an array transposed: a PINN's weight update from its gradient)
  is copied per element, not per vector, so LOOPED_EPILOGUE_BUDGET counts it so: its 9 operations over a 6 x 16 tile
  (96 copies, and the clamped rows' conditions) were 88 KB of IR, looped 18 KB; the sums go to the loop's array a
  converted vector at a time, not element by element. Read along the column, the same update stays unrolled on
  vectors. Both against numpy in float64."""
  rng = np.random.default_rng(12)
  p, c = (rng.standard_normal((64, 64)).astype(F32) for _ in range(2))
  x, g = (rng.standard_normal((1024, 64)).astype(F32) for _ in range(2))
  for transposed in (True, False):
    f = tj.jit(lambda p, x, g, c, t=transposed: p - 1e-3 * (x.T @ g + (c.T if t else c) * 2 + 1) * p)
    (kernel,) = kernels_of(f.lower(p, x, g, c)._compiled.schedule.schedule.kernels)
    renderer = llvm._Renderer(kernel.ast, llvm.choose_opts(kernel.ast))
    assert (renderer.vector_epilogue, renderer.looped_epilogue) == (not transposed, transposed)
    source = render_llvm(kernel.name, kernel.ast)
    if transposed: assert len(source) < 40_000 and "extractelement" not in source
    want = p - 1e-3 * (x.astype(F64).T @ g + (c.T if transposed else c) * 2 + 1) * p
    np.testing.assert_allclose(np.asarray(f(p, x, g, c)), want, rtol=1e-6, atol=1e-6)


def test_column_sums_in_one_kernel_share_a_stream_tile(on_cpu):
  """Two column sums in one kernel (a PINN's bias gradients) take one stream tile (`opt._streams_plan`): each sum's
  reduce loop outside a vectorised loop over its own accumulator array, then the epilogue per column; two row sums,
  read along the row, keep the plain nest, vectorised. Values against numpy in float64, with sums long enough for
  float64 blocks (1024 rows) and short (5)."""
  rng = np.random.default_rng(13)
  for rows in (1024, 5):
    x, y = (rng.standard_normal((rows, 64)).astype(F32) for _ in range(2))
    for axis in (0, 1):
      f = tj.jit(lambda x, y, axis=axis: (x * y).sum(axis) + (x + 2 * y).max(axis))
      (kernel,) = kernels_of(f.lower(x, y)._compiled.schedule.schedule.kernels)
      want_opts = (("reduce_outside", 1), ("reduce_outside", 2), ("tile", 0, STREAM_TILE)) if axis == 0 else ()
      assert applied_opts(kernel.ast) == want_opts
      x64, y64 = x.astype(F64), y.astype(F64)
      np.testing.assert_allclose(np.asarray(f(x, y)), (x64 * y64).sum(axis) + (x64 + 2 * y64).max(axis), rtol=1e-5,
                                 atol=1e-4)
  # (a sum over two ranges, as a vmapped jacobian's (1024, 2) rows, and a batch range outside the column)
  x, y = rng.standard_normal((3, 512, 2, 48)).astype(F32), rng.standard_normal((3, 512, 48)).astype(F32)
  f = tj.jit(lambda x, y: x.sum((1, 2)) * 2 + (y * y).sum(1))
  (kernel,) = kernels_of(f.lower(x, y)._compiled.schedule.schedule.kernels)
  assert len(choose_opts(kernel.ast).reduces) == 2
  x64, y64 = x.astype(F64), y.astype(F64)
  np.testing.assert_allclose(np.asarray(f(x, y)), x64.sum((1, 2)) * 2 + (y64 * y64).sum(1), rtol=1e-5, atol=1e-4)



def test_stream_tile_folds_several_rows_in_order(on_cpu, monkeypatch):
  """A stream tile (v @ W over 4096 columns, a column sum) folds STREAM_ROWS rows into each column's sum at a time,
  in order: the same bits as one row after the other, float32 blocks of TILE_SUM_BLOCK rows added up in float64
  (emulated in numpy, each product rounded to float32 first); 1003 rows leave blocks and a last one that are no
  multiple of STREAM_ROWS. Lowered for one thread (unsplit); for two, v @ W's one stream tile is cut into two
  launches of 2048 columns (`schedule._split_stream`), with numpy's values."""
  from tinyjax.codegen.llvm import STREAM_ROWS
  from tinyjax.codegen.opt import TILE_SUM_BLOCK
  from tinyjax.lower import realize
  monkeypatch.setattr(realize, "cpu_threads", lambda: 1)
  monkeypatch.setattr(realize, "_memory_cache", {})
  rng = np.random.default_rng(17)
  rows = 1003
  assert rows % STREAM_ROWS and rows % TILE_SUM_BLOCK % STREAM_ROWS
  v, w = rng.standard_normal(rows).astype(F32), rng.standard_normal((rows, 4096)).astype(F32)

  def in_order(products: np.ndarray) -> np.ndarray:
    total = np.zeros(products.shape[1], F64)
    for start in range(0, rows, TILE_SUM_BLOCK):
      block = np.zeros(products.shape[1], F32)
      for row in products[start:start + TILE_SUM_BLOCK]: block = block + row
      total += block
    return total.astype(F32)
  vector_matrix = tj.jit(lambda v, w: v @ w)
  (kernel,) = kernels_of(vector_matrix.lower(v, w)._compiled.schedule.schedule.kernels)
  assert choose_opts(kernel.ast).stream
  # (the float32 adds of the rows folded together, and of the remainder loop's one)
  assert render_llvm(kernel.name, kernel.ast).count("fadd float") == STREAM_ROWS + 1
  np.testing.assert_array_equal(np.asarray(vector_matrix(v, w)), in_order(v[:, None] * w))
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda w: w.sum(0))(w)), in_order(w))
  monkeypatch.setattr(realize, "cpu_threads", lambda: 2)
  monkeypatch.setattr(realize, "_memory_cache", {})
  vector_matrix = tj.jit(lambda v, w: v @ w)
  (kernel,) = kernels_of(vector_matrix.lower(v, w)._compiled.schedule.schedule.kernels)
  assert kernel.outer_size == 2 and kernel.parallel
  np.testing.assert_allclose(np.asarray(vector_matrix(v, w)), v.astype(F64) @ w.astype(F64), rtol=1e-4, atol=1e-4)


def partial_products_kernel(parts: int, m: int, k: int, n: int, epilogue=None, across: bool = False) -> UOp:
  """out[p, i, j] = epilogue(sum_k a[i, p * k + k'] * b[p * k + k', j]): the partial products of a @ b (m x parts*k by
  parts*k x n) over `parts` chunks of its sum, as lower/split.py splits a long one (each chunk a launch); with
  `across`, b read transposed (b[j, p * k + k'])."""
  part, rows, cols, red = global_range(0, parts), global_range(1, m), global_range(2, n), reduce_range(3, k)
  step = add(mul(part, const(k)), red)
  a_element = load(buffer(1, F32), add(mul(rows, const(parts * k)), step))
  b_index = add(mul(cols, const(parts * k)), step) if across else add(mul(step, const(n)), cols)
  result = reduce(Ops.ADD, mul(a_element, load(buffer(2, F32), b_index)), red)
  if epilogue is not None: result = epilogue(result, cols)
  return kernel(store(buffer(0, F32), add(mul(part, const(m * n)), add(mul(rows, const(n)), cols)), result))


def test_few_rows_against_a_big_operand_sweep_its_columns():
  """A contraction over at most SWEEP_ROWS rows whose column operand is read in place along its columns, more than
  SWEEP_MIN_BYTES with rows at least SWEEP_STEP_BYTES apart, sweeps its column (opt.py `_sweeps`); more rows, a
  narrower operand, a smaller one or one read across don't, nor rows that are the launch range."""
  from tinyjax.codegen.opt import SWEEP_MIN_BYTES, SWEEP_ROWS, SWEEP_STEP_BYTES, SWEEP_STEPS
  width = 5 * GEOMETRY.vector_bytes // 4 * GEOMETRY.tile_vectors  # (5 column tiles)
  steps = -(-SWEEP_MIN_BYTES // (2 * width * 4))
  assert width * 4 >= SWEEP_STEP_BYTES
  plan = choose_opts(partial_products_kernel(2, SWEEP_ROWS, steps, width))
  assert plan.sweep == SWEEP_STEPS and plan.row.src[0].arg == SWEEP_ROWS and not plan.packed and not plan.group
  assert ("sweep", 3, SWEEP_STEPS) in plan.opts
  assert not choose_opts(partial_products_kernel(2, SWEEP_ROWS + 1, steps, width)).sweep
  assert not choose_opts(partial_products_kernel(2, SWEEP_ROWS, steps // 2, width)).sweep  # (1 MB)
  narrow = SWEEP_STEP_BYTES // 8
  assert not choose_opts(partial_products_kernel(2, SWEEP_ROWS, steps * width // narrow, narrow)).sweep
  assert not choose_opts(partial_products_kernel(2, SWEEP_ROWS, steps, width, across=True)).sweep
  assert not choose_opts(matmul_kernel(SWEEP_ROWS, 2 * steps, width, F32)).sweep  # (its rows are launched)


@pytest.mark.parametrize("m,k", [(3, 203), (7, 700), (8, 1500)])
def test_swept_tiles_compute_the_same_bits_as_whole_tiles(monkeypatch, m, k):
  """A swept plan (`render_sweep`) against numpy in float64, and bit for bit against the same kernel with its tiles
  run whole (SWEEP_ROWS 0): row tiles of 6 and a remainder, a sum of one block and a last sweep of 3 steps (203),
  three blocks added in float32 (700) and six in float64 (1500); 17 column tiles, a chunk of SWEEP_COLUMNS and one
  of one tile; a bias and relu epilogue; and a launch of the second part alone, which leaves the others unwritten."""
  from tinyjax.codegen import opt
  tile = GEOMETRY.vector_bytes // 4 * GEOMETRY.tile_vectors
  width, parts = 17 * tile, 3
  assert width > opt.SWEEP_COLUMNS and width * 4 * k * parts >= opt.SWEEP_MIN_BYTES
  rng = np.random.default_rng(m)
  a = rng.standard_normal((m, parts * k)).astype(F32)
  b = rng.standard_normal((parts * k, width)).astype(F32)
  bias = rng.standard_normal(width).astype(F32)
  ast = partial_products_kernel(parts, m, k, width,
                                lambda value, cols: alu(Ops.MAX, add(value, load(buffer(3, F32), cols)), const(0.0)))
  assert choose_opts(ast).sweep
  swept = np.zeros((parts, m, width), F32)
  run_kernel(ast, [swept, a, b, bias], optimize=True)
  expected = np.maximum(np.stack([a[:, p * k:(p + 1) * k].astype(F64) @ b[p * k:(p + 1) * k] for p in range(parts)])
                        + bias, 0)
  np.testing.assert_allclose(swept, expected, rtol=1e-5, atol=1e-4)
  second = np.zeros_like(swept)
  run_kernel(ast, [second, a, b, bias], optimize=True, start=1, end=2)
  assert not second[0].any() and not second[2].any()
  np.testing.assert_array_equal(second[1], swept[1])
  monkeypatch.setattr(opt, "SWEEP_ROWS", 0)
  assert not choose_opts(ast).sweep
  whole = np.zeros_like(swept)
  run_kernel(ast, [whole, a, b, bias], optimize=True)
  np.testing.assert_array_equal(swept, whole)


def test_few_rows_product_is_launched_over_blocks_of_columns(on_cpu, monkeypatch):
  """jit(a @ b) over a few rows of a big b (its rows the kernel's first range): launched over blocks of columns, as
  many for each thread (`schedule._sweep_blocks`), each a swept plan; with a long sum split into partial sums
  (lower/split.py), each partial sweeps. Against numpy in float64."""
  from tinyjax.codegen.opt import SWEEP_COLUMNS
  from tinyjax.lower import realize
  monkeypatch.setattr(realize, "cpu_threads", lambda: 2)
  monkeypatch.setattr(realize, "_memory_cache", {})
  rng = np.random.default_rng(29)
  for m, k, n, launches in ((6, 1024, 2 * SWEEP_COLUMNS, 2), (5, 4096, 1024, 0)):
    a, b = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32)
    product = tj.jit(lambda a, b: a @ b)
    swept = [kernel for kernel in kernels_of(product.lower(a, b)._compiled.schedule.schedule.kernels)
             if (plan := choose_opts(kernel.ast)) is not None and plan.sweep]
    assert len(swept) == 1 and (not launches or swept[0].outer_size == launches)
    np.testing.assert_allclose(np.asarray(product(a, b)), a.astype(F64) @ b, rtol=1e-4, atol=1e-4)


def test_uneven_batch_of_products_is_launched_over_chunks_of_rows(on_cpu, monkeypatch):
  """A batch of 3 products on 2 threads (one idle a third of the time) is launched over batch x 2 chunks of rows
  (`schedule._split_batch_rows`): 6 launches, each row chunk a whole register-tiled product of its own, in all three
  operand layouts; a batch of 4 stays launched over the batch, and a small batch of products (a few microseconds)
  too. Against numpy in float64."""
  from tinyjax.lower import realize
  monkeypatch.setattr(realize, "cpu_threads", lambda: 2)
  monkeypatch.setattr(realize, "_memory_cache", {})
  rng = np.random.default_rng(23)
  for batch, size, launches in ((3, 384, 6), (4, 384, 4), (3, 64, 3)):
    a, b = (rng.standard_normal((batch, size, size)).astype(F32) for _ in range(2))
    for f in (lambda a, b: a @ b, lambda a, b: a @ b.swapaxes(1, 2), lambda a, b: a.swapaxes(1, 2) @ b):
      product = tj.jit(f)
      (kernel,) = [k for k in kernels_of(product.lower(a, b)._compiled.schedule.schedule.kernels)
                   if k.name.startswith("r_")]
      assert kernel.outer_size == launches and choose_opts(kernel.ast).row.src[0].arg == size * batch // launches
      np.testing.assert_allclose(np.asarray(product(a, b)), f(a.astype(F64), b.astype(F64)), rtol=1e-5, atol=1e-4)

def test_strided_reduce_loops_are_left_scalar(on_cpu):
  """Two column sums of every other column (no tile plan: the column is strided in the loads) read their rows with
  a stride: their loops are left scalar (`strided_only`: LLVM's gathers cost more to compile than they save)."""
  rng = np.random.default_rng(13)
  x, y = (rng.standard_normal((1024, 128)).astype(F32) for _ in range(2))
  f = tj.jit(lambda x, y: (x[:, ::2] * y[:, ::2]).sum(0) + (x[:, ::2] + 2 * y[:, ::2]).sum(0))
  (program,) = f.lower(x, y)._compiled.schedule.programs
  assert program.src.count('!{!"llvm.loop.vectorize.enable", i1 false}') == 2 and "; opts: []" in program.src
  x64, y64 = x[:, ::2].astype(F64), y[:, ::2].astype(F64)
  np.testing.assert_allclose(np.asarray(f(x, y)), (x64 * y64).sum(0) + (x64 + 2 * y64).sum(0), rtol=1e-5, atol=1e-4)


def test_a_small_table_is_no_operand_to_share_across_tile_rows(on_cpu):
  """A conv bias's gradient through ReLU and a 2x2 max pool (the CNN example's): its sums read the pool's window
  offsets, a table of 4 values no split partial depends on. Taken for an operand to share, it made the 8 partial sums
  the rows of a 6-row register tile and a 2-row remainder (one thread doing three quarters of the work, 3.6 ms of the
  CNN step; 1.5 ms without); a table under TABLE_VALUES values is not one (`choose_opts`). Values against numpy in
  float64."""
  from tinyjax import lax
  rng = np.random.default_rng(5)
  x = rng.standard_normal((32, 28, 28, 32)).astype(F32)
  g = rng.standard_normal((32, 14, 14, 32)).astype(F32)
  b = rng.standard_normal(32).astype(F32)

  def pool(v): return lax.reduce_window(v, -np.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
  f = tj.jit(tj.grad(lambda b: (pool(tnp.maximum(x + b, 0)) * g).sum()))
  plans = [llvm.choose_opts(k.ast) for k in kernels_of(f.lower(b)._compiled.schedule.schedule.kernels)
           if k.name.startswith("r_")]
  assert plans and all(plan is None or plan.row is None for plan in plans)
  y = np.maximum(x.astype(F64) + b, 0).reshape(32, 14, 2, 14, 2, 32)
  picked = (y == y.max(axis=(2, 4), keepdims=True)) * (y > 0) * g[:, :, None, :, None, :]
  np.testing.assert_allclose(np.asarray(f(b)), picked.sum(axis=(0, 1, 2, 3, 4)), rtol=2e-5, atol=2e-4)


def test_no_tile_rows_where_an_operand_reads_along_them_and_the_column(on_cpu):
  """A layer norm's gain gradient over gathered embeddings plus positions (a language model's first layer norm): a
  column sum over batch x time split into 8 partial sums, which every operand but the positions reads along with the
  column. Taken for a tile's rows (the positions are shared across them), each element of a 6-row tile and its 2-row
  remainder loaded vectors of its own and repeated the gather and the normalisation: 0.3 s of LLVM per kernel, and
  slower (0.21 -> 0.14 ms in the LM step). Such a range is no row (`choose_opts`). Values against numpy in float64."""
  from tinyjax import lax
  rng = np.random.default_rng(6)
  vocab, batch, steps, width = 200, 32, 64, 128
  emb, pos = rng.standard_normal((vocab, width)).astype(F32), rng.standard_normal((steps, width)).astype(F32)
  tokens = rng.integers(0, vocab, (batch, steps)).astype(np.int32)
  g = rng.standard_normal((batch, steps, width)).astype(F32)
  gain = (1 + 0.1 * rng.standard_normal(width)).astype(F32)

  def layer_norm(x, gain):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * gain
  f = tj.jit(tj.grad(lambda gain: (layer_norm(tnp.asarray(emb)[tokens] + pos, gain) * g).sum()))
  plans = [llvm.choose_opts(k.ast) for k in kernels_of(f.lower(gain)._compiled.schedule.schedule.kernels)
           if k.name.startswith("r_")]
  assert any(plan is not None for plan in plans) and all(plan is None or plan.row is None for plan in plans)
  x = emb.astype(F64)[tokens] + pos
  normalised = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(np.asarray(f(gain)), (normalised * g).sum((0, 1)), rtol=2e-5, atol=2e-4)


def test_register_tile_rows_share_the_column_loads(on_cpu):
  """Attention's projection gradient out[d, h, e] = sum over (b, t) of x[b, t, d] dq[b, h, t, e]: the tile's rows are
  d, which dq (read along the column e) does not depend on, so each of its vectors serves all the rows; tiling the 4
  heads h (the innermost range a load is reused over) loaded a vector of dq per FMA (2.84 -> 0.73 ms at 16x128x256,
  4 heads of 64). Values against numpy in float64."""
  from tinyjax.codegen.opt import choose_opts
  rng = np.random.default_rng(9)
  x, dq = rng.standard_normal((4, 32, 96)).astype(F32), rng.standard_normal((4, 4, 32, 64)).astype(F32)
  f = tj.jit(lambda a, b: tnp.einsum("btd,bhte->dhe", a, b))
  (kernel,) = [k for k in kernels_of(f.lower(x, dq)._compiled.schedule.schedule.kernels) if k.name.startswith("r_")]
  plan = choose_opts(kernel.ast)
  assert plan.row.src[0].arg == 96 and plan.column.src[0].arg == 64 and plan.rows == 6
  want = np.einsum("btd,bhte->dhe", x.astype(F64), dq.astype(F64))
  np.testing.assert_allclose(np.asarray(f(x, dq)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_low_precision_output_of_a_register_tile_rounds_on_vectors(dtype, on_cpu):
  """A float32 matmul cast to bfloat16 / float16 (a mixed-precision matmul's output) rounds on the tile's vectors,
  once, to nearest even (NaN stays NaN): its epilogue was scalar, 384 copies of the rounding per tile (339 KB of IR,
  0.31 s of LLVM for 512x512). Values against numpy's float64 product rounded by ml_dtypes, within one unit of the
  last place (the float32 sum rounds first); the tile's NaN, inf and exact ties round as numpy's."""
  m, k, n = 48, 64, 96
  rng = np.random.default_rng(6)
  a, b = rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32)
  c = np.zeros((m, n), F32)
  c[0, :4] = [np.nan, np.inf, -np.inf, 1.0 + 2.0 ** -8]  # (the last, exact, a tie between two bfloat16 neighbours)
  (kernel,) = [kr for kr in kernels_of(tj.jit(lambda u, v: (u @ v).astype(dtype)).lower(a, b)._compiled.schedule
                                       .schedule.kernels) if kr.name.startswith("r_")]
  assert llvm._Renderer(kernel.ast, llvm.choose_opts(kernel.ast)).vector_epilogue
  assert len(render_llvm(kernel.name, kernel.ast)) < 150_000
  got = np.asarray(tj.jit(lambda u, v: (u @ v).astype(dtype))(a, b)).astype(F64)
  want = (a.astype(F64) @ b.astype(F64)).astype(dtype).astype(F64)
  ulp = 2.0 ** (-7 if dtype == BF16 else -10)
  np.testing.assert_allclose(got, want, rtol=ulp, atol=1e-5)  # (atol: the float32 sum's own error where it cancels)
  special = np.asarray(tj.jit(lambda u, v, w: (u @ v * 0.0 + w).astype(dtype))(a, b, c))
  np.testing.assert_array_equal(special[0, 1:4].astype(F64), c[0, 1:4].astype(dtype).astype(F64))
  assert np.isnan(special[0, 0].astype(F64)) and not np.isnan(special[1:].astype(F64)).any()


def test_batch_summed_product_reads_its_operand_through_divisions(on_cpu):
  """einsum('nop,nip->oi') sums over (n, p), adjacent but not contiguous in memory (o lies between): where the
  column operand is big (schedule.BLOCK_LINEAR_MIN_BYTES), the product is built over one reduce range read through
  divisions and packs it in transposed blocks, instead of a relayout copy of x first; p not a multiple of the packs'
  16 steps, or a small operand, keeps the copy. Values against float64 numpy either way."""
  from tinyjax.lower import schedule as schedule_module
  rng = np.random.default_rng(5)
  # (32 images: split 8 ways, each partial sums over 4 of them, more steps than one pack holds)
  for p, copied in ((2048, False), (2052, True)):
    g = rng.standard_normal((32, 64, p)).astype(np.float32)
    x = rng.standard_normal((32, 64, p)).astype(np.float32)
    assert x.nbytes >= schedule_module.BLOCK_LINEAR_MIN_BYTES
    f = tj.jit(lambda g, x: tnp.einsum("nop,nip->oi", g, x))
    got = np.asarray(f(tnp.asarray(g), tnp.asarray(x)))
    want = np.einsum("nop,nip->oi", g.astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-3)
    (compiled,) = f._fast_cache.values()
    kernels = compiled.schedule.schedule.kernels
    assert any(k.name.startswith("e_") for k in kernels) == copied, [k.name for k in kernels]
    if not copied:
      product = next(k for k in kernels if sum(n.op is Ops.REDUCE for n in k.ast.toposort))
      (reduce,) = [n for n in product.ast.toposort if n.op is Ops.REDUCE]
      assert len(reduce.src) == 2 and any(n.op is Ops.IDIV for n in product.ast.toposort)


@pytest.mark.parametrize("heads,head_size", [(4, 32), (2, 48)])
def test_contraction_read_through_a_head_split_gets_a_register_tile(heads, head_size, on_cpu):  # (CPU tiles)
  """Attention's value gradient P^T @ dO with dO split into heads from (B, T, H * Dh) and the result merged back: the
  output axis read as d // Dh and d % Dh gets a range per factor (`schedule._divided_axes`), so the contraction is a
  register tile (it ran as a plain loop nest); values against numpy, the jaxpr's gradient against finite differences
  of the same function."""
  batch, steps = 2, 64
  width = heads * head_size
  rng = np.random.default_rng(heads)
  p = rng.random((batch, heads, steps, steps)).astype(F32)
  g = rng.standard_normal((batch, steps, width)).astype(F32)

  def value_gradient(p, g):
    per_head = g.reshape(batch, steps, heads, head_size).transpose(0, 2, 1, 3)
    return (p.transpose(0, 1, 3, 2) @ per_head).transpose(0, 2, 1, 3).reshape(batch, steps, width)

  f = tj.jit(value_gradient)
  text = f.lower(p, g).as_text()
  assert "('upcast'," in text and " udiv " not in text and " urem " not in text
  expected = np.einsum("bhst,bshd->bthd", p.astype(F64), g.astype(F64).reshape(batch, steps, heads, head_size))
  np.testing.assert_allclose(np.asarray(f(p, g)), expected.reshape(batch, steps, width), rtol=1e-5, atol=1e-5)
  # its gradient with respect to g (the same contraction with p transposed back) against a central difference
  weights = rng.standard_normal((batch, steps, width)).astype(F32)
  grad = np.asarray(tj.jit(tj.grad(lambda g: (value_gradient(p, g) * weights).sum()))(g))
  direction = rng.standard_normal(g.shape)
  eps = 1e-3
  loss = lambda g: float((np.einsum("bhst,bshd->bthd", p.astype(F64), g.reshape(batch, steps, heads, head_size))
                          .reshape(batch, steps, width) * weights).sum())
  numeric = (loss(g.astype(F64) + eps * direction) - loss(g.astype(F64) - eps * direction)) / (2 * eps)
  np.testing.assert_allclose((grad.astype(F64) * direction).sum(), numeric, rtol=1e-4)
