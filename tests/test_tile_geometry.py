"""Register tiles sized for the host's vector registers (codegen/opt.py `tile_geometry`, devices/cpu.py
`vector_registers`): the shapes each instruction set gets, and kernels of every geometry against numpy in float64
(TINYJAX_VECTOR_BYTES picks one on any host; LLVM splits vectors wider than the host's). tests/test_gemm.py states
its plans for AVX-512's tiles."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import pinned_vectors
from test_conv import numpy_conv
from test_gemm import matmul_kernel

import tinyjax as tj
from tinyjax import lax
from tinyjax.codegen.llvm import render_llvm
from tinyjax.codegen.opt import applied_opts, geometry_for, global_ranges_of, tile_geometry
from tinyjax.devices.cpu import VECTOR_REGISTERS, vector_registers
from tinyjax.lower.schedule import kernels_of

F32 = np.dtype(np.float32)


@pytest.fixture(params=[64, 32, 16], ids=["avx512", "avx2", "sse"])
def width(request, monkeypatch):
  """The tests run with the register tiles of each vector width (conftest.py `pinned_vectors`)."""
  with pinned_vectors(monkeypatch, request.param): yield request.param


@pytest.mark.parametrize("isa,lanes,tile,rowless,dot", [
    ("avx512", 16, (6, 4), 4, (4, 4)), ("avx2", 8, (6, 2), 8, (3, 3)), ("neon", 4, (6, 4), 16, (4, 4)),
    ("sse", 4, (6, 2), 8, (3, 3))])
def test_geometry_fits_the_registers(isa, lanes, tile, rowless, dot):
  """A tile's accumulators, the vectors loaded per step and a broadcast value fit the registers (6 x 4 + 4 + 1 = 29 of
  AVX-512's 32, 6 x 2 + 2 + 1 = 15 of AVX2's 16), as do a row-less tile's (64 float32 columns where they fit in half
  the registers) and a dot tile's sums and its row and column loads; register transposes are squares of one vector's
  float32 lanes."""
  width, registers = VECTOR_REGISTERS[isa]
  geometry = geometry_for(width, registers)
  assert (geometry.vector_bytes, geometry.transpose_lanes) == (width, lanes)
  assert (geometry.tile_rows, geometry.tile_vectors) == tile and (geometry.dot_rows, geometry.dot_columns) == dot
  assert geometry.rowless_vectors == rowless and 2 * rowless <= registers
  assert geometry.tile_rows * geometry.tile_vectors + geometry.tile_vectors + 1 <= registers
  assert geometry.max_tile_rows + 2 <= registers and geometry.window_tile_rows <= geometry.tile_rows
  assert geometry.dot_rows * geometry.dot_columns + geometry.dot_rows + geometry.dot_columns <= registers


def test_vector_bytes_picks_the_instruction_set(width):
  assert vector_registers() == (width, {64: 32, 32: 16, 16: 16}[width]) and tile_geometry().vector_bytes == width
  tile_columns = tile_geometry().vector_bytes // 4 * tile_geometry().tile_vectors
  opts = applied_opts(matmul_kernel(64, 64, 64, F32))
  assert ("upcast", 1, tile_columns) in opts and ("upcast", 0, tile_geometry().tile_rows) in opts
  assert f'"prefer-vector-width"="{tile_geometry().vector_bytes * 8}"' in \
      render_llvm("kernel", matmul_kernel(64, 64, 64, F32))


def test_unknown_vector_bytes_is_a_clear_error(monkeypatch):
  with pinned_vectors(monkeypatch, 48), pytest.raises(ValueError, match="TINYJAX_VECTOR_BYTES=48: use 64, 32 or 16"):
    vector_registers()
  assert vector_registers() in VECTOR_REGISTERS.values()


def _check(got, want, tolerance=2e-5):
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tolerance, atol=tolerance)


def _check_dense_layer(a, w, bias):
  """relu(a @ w + bias) and the gradients of the sum of its squares against numpy in float64."""
  product = a.astype(np.float64) @ w + bias
  _check(tj.jit(lambda a, w, bias: tj.nn.relu(a @ w + bias))(a, w, bias), np.maximum(product, 0), 1e-4)
  ga, gw = tj.jit(tj.grad(lambda a, w: (tj.nn.relu(a @ w + bias) ** 2).sum(), argnums=(0, 1)))(a, w)
  ct = 2 * np.maximum(product, 0)
  _check(ga, ct @ w.T.astype(np.float64), 1e-3)
  _check(gw, a.T.astype(np.float64) @ ct, 1e-3)


@pytest.mark.parametrize("m,k,n", [(67, 45, 83), (130, 600, 96), (5, 3000, 40)])
def test_matmuls_with_epilogues(width, m, k, n):
  """Odd shapes (tails of rows, columns and blocks), a bias and relu epilogue, its gradients, and an int32 product."""
  rng = np.random.default_rng(m)
  a, b, bias = (rng.standard_normal(shape).astype(np.float32) for shape in ((m, k), (k, n), (n,)))
  _check_dense_layer(a, b, bias)
  ints = [rng.integers(-20, 20, shape).astype(np.int32) for shape in ((m, k), (k, n))]
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda x, y: x @ y)(*ints)), ints[0] @ ints[1])


@pytest.mark.parametrize("m,k,n", [(16, 700, 13), (300, 512, 256), (64, 2048, 64)])
def test_products_reading_both_operands_along_the_sum(width, m, k, n):
  """`a @ b.T`: a dot tile (few rows), or b packed in register-transposed squares (many rows, whole squares)."""
  rng = np.random.default_rng(k)
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
  _check(tj.jit(lambda a, b: a @ b.T)(a, b), a.astype(np.float64) @ b.T.astype(np.float64), 1e-4)
  _check(tj.jit(lambda a, b: a.T @ b)(a.T.copy(), b.T), a.astype(np.float64) @ b.T.astype(np.float64), 1e-4)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("window", [1, 3])
def test_convolutions_and_their_gradients(width, layout, window, on_cpu):
  """Convolutions, their gradients (exact directional derivatives: conv is bilinear) and the tile of the NCHW
  product (its column the output channels)."""
  rng = np.random.default_rng(window)
  x = rng.standard_normal((2, 32, 20, 20)).astype(np.float32)
  w = (rng.standard_normal((64, 32, window, window)) / 10).astype(np.float32)
  pads = ((window // 2, window // 2),) * 2
  numbers = ("NCHW", "OIHW", "NCHW") if layout == "NCHW" else ("NHWC", "OIHW", "NHWC")
  to = (lambda t: t) if layout == "NCHW" else (lambda t: np.moveaxis(t, 1, -1))
  back = (lambda t: t) if layout == "NCHW" else (lambda t: np.moveaxis(np.asarray(t), -1, 1))

  def conv(a, b): return lax.conv_general_dilated(a, b, (1, 1), pads, dimension_numbers=numbers)
  f = tj.jit(conv)
  want = numpy_conv(x, w, (1, 1), pads)
  _check(back(f(to(x), w)), want)
  if layout == "NCHW" and window == 3:
    (product,) = [kernel for kernel in kernels_of(f.lower(x, w)._compiled.schedule.schedule.kernels)
                  if kernel.name.startswith("r_")]
    column = global_ranges_of(product.ast)[-1]
    tile_columns = tile_geometry().vector_bytes // 4 * tile_geometry().tile_vectors
    assert ("upcast", column.arg[0], tile_columns) in applied_opts(product.ast)
  ct = rng.standard_normal(want.shape).astype(np.float32)
  gx, gw = tj.jit(tj.grad(lambda a, b: (conv(a, b) * to(ct)).sum(), argnums=(0, 1)))(to(x), w)
  dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
  np.testing.assert_allclose(np.sum(np.asarray(back(gx), np.float64) * dx),
                             np.sum(numpy_conv(dx, w, (1, 1), pads) * ct), rtol=1e-4)
  np.testing.assert_allclose(np.sum(np.asarray(gw, np.float64) * dw), np.sum(numpy_conv(x, dw, (1, 1), pads) * ct),
                             rtol=1e-4)


def test_sums_and_transposes(width):
  """Column sums (a stream tile, a register-resident one), a row-less vector-matrix product, register transposes."""
  rng = np.random.default_rng(3)
  x = rng.standard_normal((300, 1000)).astype(np.float32)
  _check(tj.jit(lambda x: x.sum(0))(x), x.astype(np.float64).sum(0), 1e-4)
  _check(tj.jit(lambda x: x[:, :64].sum(0))(x), x[:, :64].astype(np.float64).sum(0), 1e-4)
  v = rng.standard_normal(300).astype(np.float32)
  _check(tj.jit(lambda v, x: v @ x)(v, x), v.astype(np.float64) @ x, 1e-4)
  y = rng.standard_normal((97, 130)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda y: y.T * 2)(y)), y.T * 2)
  h = (rng.standard_normal((64, 64)) / 16).astype(np.float32)  # contracting: float32 rounding does not grow
  xs = rng.standard_normal((50, 64)).astype(np.float32)
  _, hs = tj.lax.scan(lambda c, x: (tj.numpy.tanh(c @ h + x),) * 2, np.zeros(64, np.float32), xs)
  c, want = np.zeros(64), []
  for step in xs:
    c = np.tanh(c @ h + step)
    want.append(c)
  _check(hs, np.stack(want), 1e-4)


def test_epilogue_loads_are_prefetched_before_the_sums(width):
  """A tile whose epilogue reads an array along its column (an SGD update fused after a weight gradient) prefetches
  each of its rows' lines before the sums (llvm.py `prefetch_epilogue`); the plain product prefetches nothing.
  Values against numpy in float64."""
  rng = np.random.default_rng(5)
  h, g = (rng.standard_normal((128, 256)).astype(np.float32) for _ in range(2))
  w = rng.standard_normal((256, 256)).astype(np.float32)

  def opts_of(f, *args):
    (product,) = [k for k in kernels_of(f.lower(*args)._compiled.schedule.schedule.kernels) if k.name.startswith("r_")]
    source = render_llvm(product.name, product.ast)
    return next(line for line in source.splitlines() if line.startswith("; opts")), product
  update = tj.jit(lambda w, h, g: w - 0.001 * (h.T @ g))
  line, product = opts_of(update, w, h, g)
  (reduce,) = [n for n in product.ast.toposort if n.op.name == "REDUCE"]
  (w_buffer,) = {n.src[0].arg for n in product.ast.toposort if n.op.name == "LOAD" and n not in reduce.toposort}
  assert f"('prefetch', {w_buffer})" in line
  assert "prefetch" not in opts_of(tj.jit(lambda h, g: h.T @ g), h, g)[0]
  _check(update(w, h, g), w - 0.001 * (h.T.astype(np.float64) @ g), 1e-4)


def _product_opts(f, *args) -> tuple:
  """The optimisations of the one contraction kernel of jitted `f` (its first stage, where the sum is split)."""
  return applied_opts(_product(f, *args).ast)


def _product(f, *args):
  products = [k for k in kernels_of(f.lower(*args)._compiled.schedule.schedule.kernels) if k.name.startswith("r_")]
  return max(products, key=lambda k: len(applied_opts(k.ast)))


def _prefetches(kernel) -> bool:
  """Whether the rendered kernel prefetches (its '; opts' line names the buffers)."""
  source = render_llvm(kernel.name, kernel.ast)
  return "prefetch" in next(line for line in source.splitlines() if line.startswith("; opts"))


def test_narrow_outputs_pack_every_column_tile(width):
  """A long sum into a narrow output (a weight gradient's 64 columns: 4 AVX2 tiles, one AVX-512 tile) packs every
  column tile of a panel at once and runs them one after the other (`TilePlan.tiles`, the 'panel' opt's 4th value),
  its row operand read across its rows copied per panel too ('pack_rows');
  a short one into a tall output packs them all first and runs each row tile over them ('tiles'). Rows that are no
  whole tiles, a bias + relu epilogue and the gradients, against numpy in float64."""
  rng = np.random.default_rng(6)
  tiles = 64 // (tile_geometry().vector_bytes // 4 * tile_geometry().tile_vectors)
  x, g = rng.standard_normal((49600, 70)).astype(np.float32), rng.standard_normal((49600, 64)).astype(np.float32)
  weight_gradient = tj.jit(lambda x, g: x.T @ g)
  opts = _product_opts(weight_gradient, x, g)
  panel = next(opt for opt in opts if opt[0] == "panel")
  assert panel[3:] == ((tiles,) if tiles > 1 else ())
  assert any(opt[0] == "pack_rows" for opt in opts) == (tiles > 1)  # (x read across its rows: copied per panel)
  assert _prefetches(_product(weight_gradient, x, g))  # (the next panel: per step, or in batches per tile)
  _check(weight_gradient(x, g), x.T.astype(np.float64) @ g, 1e-4)

  a, w, bias = rng.standard_normal((1500, 64)), rng.standard_normal((64, 64)) / 8, rng.standard_normal(64)
  a, w, bias = (t.astype(np.float32) for t in (a, w, bias))
  layer = tj.jit(lambda a, w, bias: tj.nn.relu(a @ w + bias))
  assert (("tiles", 1, tiles) in _product_opts(layer, a, w, bias)) == (tiles > 1)
  _check_dense_layer(a, w, bias)
  # per-example gradients (vmap of grad) and a jitted vmap: the same kernels batched
  per_example = tj.jit(tj.vmap(tj.grad(lambda w, a: (tj.nn.relu(a @ w + bias) ** 2).sum()), in_axes=(None, 0)))
  rows = a[:12].reshape(3, 4, 64)
  want = [a_i.T.astype(np.float64) @ (2 * np.maximum(a_i @ w.astype(np.float64) + bias, 0)) for a_i in rows]
  _check(per_example(w, rows), np.stack(want), 1e-3)


def test_longer_sums_into_narrow_outputs_pack_every_column_tile(width):
  """A sum of 512 steps into 64 columns beside a tall row operand: every column tile's pack (128 KB on AVX2) within
  opt.TILES_PACK_BYTES, so all of them are packed first and each row tile runs over them ('tiles'), the row operand
  read once. Against numpy in float64."""
  from tinyjax.codegen.opt import TILES_PACK_BYTES
  rng = np.random.default_rng(8)
  tiles = 64 // (tile_geometry().vector_bytes // 4 * tile_geometry().tile_vectors)
  a, w = rng.standard_normal((3001, 512)).astype(np.float32), (rng.standard_normal((512, 64)) / 20).astype(np.float32)
  assert 512 * 64 * 4 <= TILES_PACK_BYTES
  product = tj.jit(lambda a, w: a @ w)
  assert (("tiles", 1, tiles) in _product_opts(product, a, w)) == (tiles > 1)
  _check(product(a, w), a.astype(np.float64) @ w, 1e-4)


@pytest.mark.parametrize("llc", [1 << 20, 32 << 20])
def test_wide_gemms_overflowing_the_last_level_cache_launch_blocks_of_column_tiles(width, llc, monkeypatch):
  """A GEMM whose operands and output (1.7 MB) overflow the last-level cache (pinned to 1 MB) is launched over
  blocks of column tiles, each packing its tiles together (up to opt.TILES_PACK_BYTES, two launches per thread left)
  and running every row tile over them (schedule.py `_column_blocks`); with a 32 MB cache, over single tiles.
  A bias epilogue, rows that are no whole tiles, against numpy in float64."""
  from tinyjax.codegen import opt
  from tinyjax.devices import cpu
  from tinyjax.lower import realize
  from tinyjax.lower.schedule import schedule
  monkeypatch.setattr(cpu, "data_cache_bytes", lambda level: llc if level == 3 else 32 << 10)
  opt.tile_geometry.cache_clear()
  realize._memory_cache.clear()
  try:
    assert tile_geometry().llc_bytes == llc
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((383, 256)).astype(np.float32), rng.standard_normal((256, 512)).astype(np.float32)
    bias = rng.standard_normal(512).astype(np.float32)
    f = tj.jit(lambda a, b, bias: a @ b + bias)
    columns = tile_geometry().vector_bytes // 4 * tile_geometry().tile_vectors
    tiles, pack = 512 // columns, 256 * columns * 4
    block = max(n for n in (1, 2, 4, 8, 16) if n == 1 or tiles // n >= 4 and n * pack <= opt.TILES_PACK_BYTES) \
        if llc < 32 << 20 else 1
    (product,) = [k for k in schedule(f.lower(a, b, bias)._compiled.jaxpr.sink, threads=2).kernels
                  if k.name.startswith("r_")]
    assert block > 1 or llc == 32 << 20
    assert product.outer_size == tiles // block
    assert (("tiles", 2, block) in applied_opts(product.ast)) == (block > 1)
    _check(f(a, b, bias), a.astype(np.float64) @ b + bias, 1e-4)
  finally:
    monkeypatch.undo()
    opt.tile_geometry.cache_clear()
    realize._memory_cache.clear()


def test_three_by_three_weight_gradient_over_a_long_sum(width, on_cpu):
  """A 3x3 NHWC weight gradient over 8x72x72 positions: a flat GEMM whose panels pack every column tile, its kernel
  taps summed apart (spans); exact directional derivative against numpy (conv is bilinear)."""
  rng = np.random.default_rng(7)
  x = rng.standard_normal((8, 72, 72, 16)).astype(np.float32)
  w = (rng.standard_normal((3, 3, 16, 64)) / 10).astype(np.float32)
  numbers = ("NHWC", "HWIO", "NHWC")

  def conv(a, b): return lax.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=numbers)
  ct = rng.standard_normal((8, 72, 72, 64)).astype(np.float32)
  weight_gradient = tj.jit(tj.grad(lambda b: (conv(x, b) * ct).sum()))
  tiles = 64 // (tile_geometry().vector_bytes // 4 * tile_geometry().tile_vectors)
  opts = _product_opts(weight_gradient, w)
  assert next(opt for opt in opts if opt[0] == "panel")[3:] == ((tiles,) if tiles > 1 else ())
  assert any(opt[0] == "span" for opt in opts)
  assert _prefetches(_product(weight_gradient, w)) == (tiles == 1)  # (no batches with spans)
  gw = weight_gradient(w)
  dw = rng.standard_normal(w.shape)
  to_nchw = lambda t: np.moveaxis(t, -1, 1)
  directional = np.sum(numpy_conv(to_nchw(x), np.transpose(dw, (3, 2, 0, 1)), (1, 1), ((1, 1), (1, 1))) *
                       to_nchw(ct))
  np.testing.assert_allclose(np.sum(np.asarray(gw, np.float64) * dw), directional, rtol=1e-4)


def test_big_outputs_are_streamed_a_line_at_a_time(width, monkeypatch):
  """A register tile's big float32 output (opt.NONTEMPORAL_BYTES, lowered here) is stored non-temporally a whole
  64-byte line per store: AVX-512's vectors are lines, AVX2's are joined two at a time (`render_block`); SSE's tiles
  (8 columns) are half a line and keep plain stores, as do a tile's narrower remainder columns. Values against numpy
  in float64; a long sum's output stores through the caches."""
  from tinyjax.codegen import opt
  monkeypatch.setattr(opt, "NONTEMPORAL_BYTES", 1 << 10)
  rng = np.random.default_rng(8)
  a, b = rng.standard_normal((300, 64)).astype(np.float32), rng.standard_normal((64, 72)).astype(np.float32)
  f = tj.jit(lambda a, b: tj.nn.relu(a @ b))
  (product,) = [k for k in kernels_of(f.lower(a, b)._compiled.schedule.schedule.kernels) if k.name.startswith("r_")]
  lines = tile_geometry().vector_bytes * tile_geometry().tile_vectors % 64 == 0
  assert (("nontemporal",) in applied_opts(product.ast)) == lines
  ir = render_llvm(product.name, product.ast)
  assert ("store <16 x float> %" in ir and ", align 64, !nontemporal" in ir) == lines
  _check(f(a, b), np.maximum(a.astype(np.float64) @ b, 0), 1e-4)
  # a long sum (past opt.NONTEMPORAL_MAX_STEPS) stores through the caches: its output is little of its traffic
  long_a, long_b = (rng.standard_normal(shape).astype(np.float32) for shape in ((300, 1100), (1100, 64)))
  (product,) = [k for k in kernels_of(f.lower(long_a, long_b)._compiled.schedule.schedule.kernels)
                if k.name.startswith("r_")]
  assert ("nontemporal",) not in applied_opts(product.ast)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_channels_first_taps_in_blocks_that_fit_l1(width, layout, on_cpu):
  """A direct 3x3 convolution's taps for a column tile beyond what the host's L1 holds (less opt.WINDOW_L1_SPARE; at
  most WINDOW_BLOCK_BYTES) run in channel blocks for channels-first data; channels-last data blocks only past
  WINDOW_BLOCK_BYTES (opt.py `_window_chunk`). Values against numpy in float64."""
  from tinyjax.codegen.opt import WINDOW_BLOCK_BYTES, WINDOW_L1_SPARE
  rng = np.random.default_rng(9)
  x = rng.standard_normal((1, 64, 12, 12)).astype(np.float32)
  w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
  numbers = ("NCHW", "OIHW", "NCHW") if layout == "NCHW" else ("NHWC", "OIHW", "NHWC")
  to = (lambda t: t) if layout == "NCHW" else (lambda t: np.moveaxis(t, 1, -1))
  f = tj.jit(lambda a, b: lax.conv_general_dilated(a, b, (1, 1), "SAME", dimension_numbers=numbers))
  columns = tile_geometry().vector_bytes // 4 * tile_geometry().tile_vectors
  taps = 64 * 9 * columns * 4
  limit = min(WINDOW_BLOCK_BYTES, tile_geometry().l1_bytes - WINDOW_L1_SPARE) if layout == "NCHW" else \
      WINDOW_BLOCK_BYTES
  assert any(opt[0] == "chunk" for opt in _product_opts(f, to(x), w)) == (taps > limit)
  _check(f(to(x), w), to(numpy_conv(x, w, (1, 1), ((1, 1), (1, 1)))), 1e-4)


def test_channels_first_pointwise_product_launched_over_images(width, on_cpu):
  """An NCHW 1x1 convolution's product is launched over the images whatever the tiles (each image's input and output
  streamed through once); its input is read in place where a tile's columns are whole runs of
  opt.STEP_RUN_BYTES (AVX-512's 64), else packed in blocks of column tiles that make such runs ('tiles': 4 of AVX2's
  16 columns, 8 of SSE's 8), each row tile run over the block. Values and gradients against numpy in float64."""
  from tinyjax.codegen.opt import STEP_RUN_BYTES
  rng = np.random.default_rng(10)
  x = rng.standard_normal((3, 64, 56, 56)).astype(np.float32)
  w = (rng.standard_normal((48, 64, 1, 1)) / 8).astype(np.float32)
  ct = rng.standard_normal((3, 48, 56, 56)).astype(np.float32)

  def conv(a, b): return lax.conv_general_dilated(a, b, (1, 1), "VALID")
  f = tj.jit(conv)
  (product,) = kernels_of(f.lower(x, w)._compiled.schedule.schedule.kernels)
  columns = tile_geometry().vector_bytes // 4 * tile_geometry().tile_vectors
  assert product.outer_size == 3
  packed = columns * 4 % STEP_RUN_BYTES != 0
  assert any(opt[0] == "pack" for opt in applied_opts(product.ast)) == packed
  assert [opt[2] for opt in applied_opts(product.ast) if opt[0] == "tiles"] == \
      ([STEP_RUN_BYTES // (columns * 4)] if packed else [])
  _check(f(x, w), numpy_conv(x, w, (1, 1), ((0, 0), (0, 0))), 1e-4)
  gx, gw = tj.jit(tj.grad(lambda a, b: (conv(a, b) * ct).sum(), argnums=(0, 1)))(x, w)
  _check(gx, np.einsum("nohw,oc->nchw", ct.astype(np.float64), w[:, :, 0, 0].astype(np.float64)), 1e-4)
  _check(np.asarray(gw)[:, :, 0, 0], np.einsum("nohw,nchw->oc", ct.astype(np.float64), x.astype(np.float64)), 1e-3)
