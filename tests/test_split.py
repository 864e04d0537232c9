"""Split reductions (lower/split.py): a long reduction with few outputs runs as two kernels, a parallel first stage of
partial results and a small second stage. Values against numpy in float64 (odd and empty sizes, every reduced-axes
layout, the dtypes that split), accuracy of long float32 sums, NaN, and when a reduction splits (kernel counts).

The schedule depends on the number of threads a launch uses; the `threads` fixture lowers as if there were
SPLIT_THREADS of them (whatever this machine has), so the split is exercised on any machine. The kernels still run on
the real thread pool: only how the work is cut changes."""
import ml_dtypes
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax.lower import realize, split
from tinyjax.lower.realize import counters
from tinyjax.lower.schedule import schedule
from tinyjax.uop import Ops, UOp

SPLIT_THREADS = 4
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
BF16, I32, BOOL = np.dtype(ml_dtypes.bfloat16), np.dtype(np.int32), np.dtype(np.bool_)
RNG = np.random.default_rng(0)
LONG = 1_000_003  # prime: the chunks never divide it, so there is always a tail


@pytest.fixture
def threads(monkeypatch, on_cpu):
  """Lower as if launches ran on SPLIT_THREADS threads, with a memory cache of this test's own (the disk cache key
  includes the thread count); on the CPU, whose splitter this is (a GPU cuts reductions its own way)."""
  monkeypatch.setattr(realize, "cpu_threads", lambda: SPLIT_THREADS)
  monkeypatch.setattr(realize, "_memory_cache", {})
  return SPLIT_THREADS


def make(shape, dtype: np.dtype) -> np.ndarray:
  if dtype == BOOL: return RNG.random(shape) < 0.5
  if dtype.kind in "iu": return RNG.integers(-1000, 1000, size=shape).astype(dtype)
  if dtype == F16: return RNG.uniform(-1, 1, size=shape).astype(dtype)  # sums of a million stay finite
  return RNG.uniform(-1, 3, size=shape).astype(dtype)


def kernel_count(fn) -> int:
  counters.reset()
  np.asarray(fn())
  return counters.kernels_launched


def param(shape, dtype=F32) -> UOp: return UOp(Ops.PARAM, np.dtype(dtype), (), (0, tuple(shape)))


def reduce_axis(x: UOp, op: Ops, axes: tuple[int, ...]) -> UOp: return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, axes))


# ---------------------------------------------------------------------------------------------- when it splits

def test_fusion_is_worked_out_again_only_for_a_split_program(monkeypatch):
  """schedule() finds the buffers (fusion) of the program, then of the split one only where a reduction was split:
  a program with nothing to split (ResNet-50's training step) is walked once."""
  from tinyjax.lower import schedule as schedule_module
  calls = []
  find = schedule_module.find_buffers
  monkeypatch.setattr(schedule_module, "find_buffers", lambda sink, gpu=False: calls.append(sink) or find(sink, gpu))
  x = param((LONG,))
  long_sum = UOp(Ops.SINK, F32, (reduce_axis(x, Ops.ADD, (0,)),))
  assert len(schedule(long_sum, threads=SPLIT_THREADS).kernels) == 2 and len(calls) == 2 and calls[0] is not calls[1]
  calls.clear()
  rows = UOp(Ops.SINK, F32, (reduce_axis(param((64, 64)), Ops.ADD, (1,)),))
  assert len(schedule(rows, threads=SPLIT_THREADS).kernels) == 1 and len(calls) == 1


def test_full_sum_is_two_kernels_only_with_threads():
  x = param((LONG,))
  sink = UOp(Ops.SINK, F32, (reduce_axis(x, Ops.ADD, (0,)),))
  assert len(schedule(sink, threads=SPLIT_THREADS).kernels) == 2
  first, second = schedule(sink, threads=SPLIT_THREADS).kernels
  assert first.outer_size == SPLIT_THREADS * split.SPLIT_PARTIALS_PER_THREAD and first.parallel and not second.parallel
  assert len(schedule(sink, threads=1).kernels) == 1  # one thread: nothing to gain


def test_small_or_wide_reductions_stay_one_kernel():
  small = param((7,))
  assert len(schedule(UOp(Ops.SINK, F32, (reduce_axis(small, Ops.ADD, (0,)),)), threads=SPLIT_THREADS).kernels) == 1
  rows = param((4096, 1024))  # enough outputs for every thread: the launch over the rows is parallel as it is
  assert len(schedule(UOp(Ops.SINK, F32, (reduce_axis(rows, Ops.ADD, (1,)),)), threads=SPLIT_THREADS).kernels) == 1
  product = param((LONG,))  # products don't split
  assert len(schedule(UOp(Ops.SINK, F32, (reduce_axis(product, Ops.MUL, (0,)),)), threads=SPLIT_THREADS).kernels) == 1


def test_partials_per_output():
  """A multiple of the threads, fewer when the reduction is short (each partial at least SPLIT_MIN_CHUNK_WORK)."""
  def partials(shape, axes, threads=SPLIT_THREADS):
    return split.split_partials(reduce_axis(param(shape), Ops.ADD, axes), threads, set())
  assert partials((LONG,), (0,)) == SPLIT_THREADS * split.SPLIT_PARTIALS_PER_THREAD
  assert partials((LONG,), (0,), threads=3) == 3 * split.SPLIT_PARTIALS_PER_THREAD
  assert partials((2, 1 << 17), (1,)) == 8  # 2^17 / SPLIT_MIN_CHUNK_WORK, a multiple of 4
  assert partials((1 << 17,), (0,)) == 0  # below SPLIT_MIN_WORK
  assert partials((2, 1024), (1,)) == 0
  assert partials((LONG,), (0,), threads=1) == 0
  # (chunks of SPLIT_MIN_CHUNK_WORK rounded: just under 16 of them still makes 16 partials, 15 makes 12)
  chunk = split.SPLIT_MIN_CHUNK_WORK
  assert partials((2, 16 * chunk - 32), (1,)) == 16 and partials((2, 15 * chunk), (1,)) == 12
  nested = reduce_axis(reduce_axis(param((2048, 512)), Ops.ADD, (1,)), Ops.ADD, (0,))  # 1M iterations over 2048
  assert split.split_partials(nested, SPLIT_THREADS, set()) == SPLIT_THREADS * split.SPLIT_PARTIALS_PER_THREAD


def test_reductions_over_outer_axes_split_by_stream_tiles():
  """sum(axis=0) streams its outputs in tiles of STREAM_TILE, one thread per tile: fewer tiles than threads x
  SPLIT_OUTPUTS_PER_THREAD split by rows; enough tiles, or a contraction (a broadcast product), don't."""
  from tinyjax.codegen.opt import STREAM_TILE
  def partials(shape, axes, source=None):
    return split.split_partials(reduce_axis(param(shape) if source is None else source, Ops.ADD, axes),
                                SPLIT_THREADS, set())
  assert partials((8192, 1024), (0,)) == SPLIT_THREADS * split.SPLIT_PARTIALS_PER_THREAD
  assert partials((64, 4, 1024), (0, 1)) == SPLIT_THREADS * split.SPLIT_PARTIALS_PER_THREAD
  many_tiles = STREAM_TILE * SPLIT_THREADS * split.SPLIT_OUTPUTS_PER_THREAD
  assert partials((64, many_tiles), (0,)) == 0
  x, g = param((512, 10)), UOp(Ops.PARAM, F32, (), (1, (512, 8)))
  product = UOp(Ops.MUL, F32, (UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (x,), (512, 10, 1)),), (512, 10, 8)),
                               UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (g,), (512, 1, 8)),), (512, 10, 8))))
  assert partials(None, (0,), product) == 0  # x.T @ g: a register tile's contraction, not a stream


def test_column_sums_match_numpy_when_split(threads):
  host = make((8192, 1024), F32)
  x = tnp.asarray(host)
  assert kernel_count(lambda: x.sum(axis=0)) == 2
  np.testing.assert_allclose(np.asarray(tj.jit(lambda x: x.sum(axis=0))(x)), host.astype(F64).sum(0), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(x.max(axis=0)), host.max(0))
  int_host = make((8192, 1024), I32)
  np.testing.assert_array_equal(np.asarray(tnp.asarray(int_host).sum(axis=0)), int_host.sum(0, dtype=np.int32))


def test_eager_kernel_counts(threads):
  x = tnp.asarray(make((512, 1024), F32))
  assert kernel_count(lambda: x.sum()) == 2
  assert kernel_count(lambda: (x * 2 + 1).sum() * 3) == 2  # producer fused into the first stage, epilogue the second
  assert kernel_count(lambda: (x * 2 + 1).sum(axis=1)) == 1
  assert kernel_count(lambda: x[:2].max(axis=1)) == 1  # 2048 elements: not worth a second kernel
  assert kernel_count(lambda: x.reshape(2, -1).max(axis=1)) == 2


# ---------------------------------------------------------------------------------------------- values

@pytest.mark.parametrize("dtype", [F32, I32, BOOL, F16, BF16], ids=str)
@pytest.mark.parametrize("size", [0, 1, 7, LONG])
def test_full_reductions_match_numpy(threads, size: int, dtype: np.dtype):
  host = make((size,), dtype)
  x = tnp.asarray(host)
  wide = host.astype(F64)
  got = x.sum()
  expected = wide.sum()
  if dtype == F32: np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6)
  elif dtype in (F16, BF16):  # accumulated in float64 partials, then rounded once to the dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected, dtype))
  else: np.testing.assert_array_equal(np.asarray(got), expected.astype(got.dtype))
  if size:
    np.testing.assert_array_equal(np.asarray(x.max()), host.max())
    np.testing.assert_array_equal(np.asarray(x.min()), host.min())


@pytest.mark.parametrize("dtype", [F32, I32, BOOL, F16], ids=str)
@pytest.mark.parametrize("shape, axis", [((3, LONG), 1), ((3, LONG), None), ((LONG, 3), 0), ((2, 5, 100_003), (0, 2)),
                                         ((4, 2, 65_537), (1, 2)), ((1, LONG), 1)])
def test_reductions_over_axes_match_numpy(threads, shape, axis, dtype: np.dtype):
  host = make(shape, dtype)
  x = tnp.asarray(host)
  expected = host.astype(F64).sum(axis=axis)
  got = np.asarray(x.sum(axis=axis))
  if dtype == F32: np.testing.assert_allclose(got, expected, rtol=1e-6)
  elif dtype == F16: np.testing.assert_array_equal(got, expected.astype(F16))
  else: np.testing.assert_array_equal(got, expected.astype(got.dtype))
  np.testing.assert_array_equal(np.asarray(x.max(axis=axis)), host.max(axis=axis))
  np.testing.assert_array_equal(np.asarray(x.min(axis=axis)), host.min(axis=axis))


def test_long_float32_sum_stays_accurate(threads):
  n = 1 << 24
  x = tnp.asarray(np.full(n, 0.1, F32))
  assert kernel_count(lambda: x.sum()) == 2
  exact = float(np.float32(0.1)) * n
  assert abs(float(np.asarray(x.sum())) - exact) / exact < 1e-6


def test_nan_in_a_chunk_and_in_the_tail(threads):
  for index in (5, LONG - 1):  # in the first stage, in the tail the second stage reduces
    host = make((LONG,), F32)
    host[index] = np.nan
    x = tnp.asarray(host)
    assert np.isnan(np.asarray(x.max())) and np.isnan(np.asarray(x.min())) and np.isnan(np.asarray(x.sum()))


def test_split_reduction_broadcast_back(threads):
  """A split reduction whose result is broadcast (softmax) stays a buffer of its own, and is right."""
  host = make((2, 300_007), F32)
  x = tnp.asarray(host)
  shifted = x - x.max(axis=1, keepdims=True)
  exps = tnp.exp(shifted)
  wide = np.exp(host.astype(F64) - host.max(1, keepdims=True))
  np.testing.assert_allclose(np.asarray(exps / exps.sum(axis=1, keepdims=True)), wide / wide.sum(1, keepdims=True),
                             rtol=1e-5, atol=1e-12)


def test_nested_and_jitted(threads):
  host = make((2048, 512), F32)
  x = tnp.asarray(host)
  assert kernel_count(lambda: x.sum(axis=1).sum()) == 2  # the outer reduction splits, the inner fuses into it
  np.testing.assert_allclose(np.asarray(x.sum(axis=1).sum()), host.astype(F64).sum(), rtol=1e-6)
  squares = tj.jit(lambda a: (a * a).mean())
  for _ in range(2):  # traced and lowered, then the cached schedule
    np.testing.assert_allclose(np.asarray(squares(x)), (host.astype(F64) ** 2).mean(), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda a: (a * a).sum())(x)), 2 * host, rtol=1e-6)


def _contraction(rows: int, length: int, columns: int) -> UOp:
  """The broadcast product of a (rows, length) @ (length, columns) matmul, before its sum over axis 1."""
  a, b = param((rows, length)), UOp(Ops.PARAM, F32, (), (1, (length, columns)))
  shape = (rows, length, columns)
  return UOp(Ops.MUL, F32, (UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (a,), (rows, length, 1)),), shape),
                            UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (b,), (1, length, columns)),), shape)))


def test_contraction_read_along_its_rows_splits_into_long_chunks(threads):
  """`x @ w.T` (each operand read along its rows, through reshapes, expansions and a double transpose) splits into
  partial sums of at least SPLIT_MIN_DOT_STEPS steps, as few as one per thread; `x @ w`, whose w is read across its
  rows, and a sum of a transposed operand keep SPLIT_PARTIALS_PER_THREAD per thread. Values against numpy."""
  def dot(rows, length, columns, transposed=False):
    a = param((rows, length))
    b = UOp(Ops.PARAM, F32, (), (1, (length, columns) if transposed else (columns, length)))
    if transposed: b = UOp(Ops.PERMUTE, F32, (b,), (1, 0))
    shape = (rows, columns, length)
    product = UOp(Ops.MUL, F32, (UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (a,), (rows, 1, length)),), shape),
                                 UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (b,), (1, columns, length)),), shape)))
    return split.split_partials(reduce_axis(product, Ops.ADD, (2,)), SPLIT_THREADS, set())
  many = SPLIT_THREADS * split.SPLIT_PARTIALS_PER_THREAD
  assert dot(8, 4 * split.SPLIT_MIN_DOT_STEPS, 4096) == SPLIT_THREADS
  assert dot(8, 2 * SPLIT_THREADS * split.SPLIT_MIN_DOT_STEPS, 4096) == 2 * SPLIT_THREADS
  assert dot(8, 4 * split.SPLIT_MIN_DOT_STEPS, 4096, transposed=True) == many
  assert split.split_partials(reduce_axis(_contraction(8, 4 * split.SPLIT_MIN_DOT_STEPS, 4096), Ops.ADD, (1,)),
                              SPLIT_THREADS, set()) == many
  x, w = make((8, 8192), F32), make((512, 8192), F32)
  product = tj.jit(lambda x, w: x @ w.T)
  first, *_ = realize.kernels_of(product.lower(x, w)._compiled.schedule.schedule.kernels)
  assert first.outer_size == SPLIT_THREADS
  np.testing.assert_allclose(np.asarray(product(x, w)), x.astype(F64) @ w.T.astype(F64), rtol=1e-5, atol=1e-4)


def test_contraction_into_a_narrow_column_stays_whole(threads):
  """A contraction whose output column is narrower than NARROW_COLUMN (a classifier's weight gradient h.T @ g over a
  big batch) is computed transposed, launched over the column tiles of its rows: no partials (unless those are too
  few for the threads), which would each have copied their chunk of h transposed first. Against numpy in float64."""
  assert split.split_partials(reduce_axis(_contraction(2048, 1 << 16, 10), Ops.ADD, (1,)), SPLIT_THREADS, set()) == 0
  # (too few column tiles for the threads: it still splits)
  assert split.split_partials(reduce_axis(_contraction(64, 1 << 16, 10), Ops.ADD, (1,)), SPLIT_THREADS, set()) > 0
  h, g = make((1 << 14, 256), F32), make((1 << 14, 10), F32)
  gradient = tj.jit(lambda h, g: h.T @ g)
  kernels = realize.kernels_of(gradient.lower(h, g)._compiled.schedule.schedule.kernels)
  assert len(kernels) == 2  # (the transposed product and the copy of its output into place)
  from tinyjax.codegen.opt import choose_opts
  assert any((plan := choose_opts(k.ast)) is not None and plan.sweep for k in kernels)  # (10 rows: opt.SWEEP_ROWS)
  np.testing.assert_allclose(np.asarray(gradient(h, g)), h.astype(F64).T @ g.astype(F64), rtol=1e-5, atol=1e-3)


def test_long_contractions_split_by_their_first_axis():
  """A contraction's launch is over its output's first axis: a long one with few values there (a weight gradient's
  (3, 3, C, O) is 3) splits; one with many rows doesn't (its partials would be rows x columns x P float64 values)."""
  assert split.split_partials(reduce_axis(_contraction(3, 1 << 17, 64), Ops.ADD, (1,)), SPLIT_THREADS, set()) > 0
  assert split.split_partials(reduce_axis(_contraction(4096, 1 << 16, 64), Ops.ADD, (1,)), SPLIT_THREADS, set()) == 0
  # a row sum's rows are its launch units (not a register tile's columns): 40 long rows need no split
  assert split.split_partials(reduce_axis(param((40, 1 << 20)), Ops.ADD, (1,)), SPLIT_THREADS, set()) == 0


def test_contraction_packed_in_panels_splits_by_its_row_groups(threads):
  """A contraction whose reused operand packs in panels (a long sum: a 1x1 convolution's weight gradient, 64 x 64
  summed over 32x56x56) runs its rows in groups of PANEL_GROUP_ROWS, a launch unit each: 64 rows were one unit, on
  one thread, so it splits; with a short sum it packs whole, its rows are units, and it doesn't. Values against numpy
  in float64."""
  from tinyjax.codegen.opt import PANEL_GROUP_ROWS
  length = 1 << 16
  assert split.split_partials(reduce_axis(_contraction(64, length, 64), Ops.ADD, (1,)), SPLIT_THREADS, set()) > 0
  # (a chunk computes all 64 x 64 outputs: 8x56x56 positions split though one output's sum is short of two chunks)
  assert split.split_partials(reduce_axis(_contraction(64, 25088, 64), Ops.ADD, (1,)), SPLIT_THREADS, set()) > 0
  # (not on a GPU: its work-items are its outputs, not the CPU's row groups)
  assert split.split_partials(reduce_axis(_contraction(64, 25088, 64), Ops.ADD, (1,)), SPLIT_THREADS, set(),
                              gpu=True) == 0
  assert split.split_partials(reduce_axis(_contraction(64, 1 << 10, 64), Ops.ADD, (1,)), SPLIT_THREADS, set()) == 0
  many = split.SPLIT_OUTPUTS_PER_THREAD * SPLIT_THREADS * PANEL_GROUP_ROWS  # (row groups enough for the threads)
  assert split.split_partials(reduce_axis(_contraction(many, length, 64), Ops.ADD, (1,)), SPLIT_THREADS, set()) == 0
  x, g = make((length, 64), F32), make((length, 64), F32)
  want = x.astype(np.float64).T @ g.astype(np.float64)
  np.testing.assert_allclose(np.asarray(tj.jit(lambda a, b: a.T @ b)(x, g)), want, rtol=1e-6, atol=1e-3)



def test_contraction_whose_row_groups_leave_a_thread_idle_splits(threads):
  """A contraction's K-blocked row groups are its launch units: where they leave the busiest thread with more than
  1 / SPLIT_MIN_BALANCE of an even share, it splits into partial sums counted by their whole work. A weight gradient
  x.T @ g of 64 x 64 outputs over 8192 positions was one group of 126 rows (one thread), 128 x 128 one group of 126
  and one of 2; 256 rows in groups share the threads evenly and stay one kernel; a longer sum splits into partials
  of at least SPLIT_MIN_GROUPED_STEPS steps. Values against numpy in float64;
  a dense layer over a flattened (7, 7, 64) image reads its partials' chunks at a linear index."""
  from tinyjax.codegen.opt import linear_strides
  def partials(rows, columns): return split.split_partials(
      reduce_axis(_contraction(rows, 8192, columns), Ops.ADD, (1,)), SPLIT_THREADS, set())
  assert partials(64, 64) >= SPLIT_THREADS and partials(128, 128) >= SPLIT_THREADS
  assert partials(256, 256) == 0
  # (a longer sum's partials each at least SPLIT_MIN_GROUPED_STEPS, as few as one per thread; 8192 keeps its own)
  def on_two(length): return split.split_partials(reduce_axis(_contraction(128, length, 128), Ops.ADD, (1,)), 2, set())
  assert on_two(2 * split.SPLIT_MIN_GROUPED_STEPS) == 2 and on_two(4 * split.SPLIT_MIN_GROUPED_STEPS) == 4
  assert on_two(split.SPLIT_MIN_GROUPED_STEPS) == 2 * split.SPLIT_PARTIALS_PER_THREAD
  x, g = make((8192, 64), F32), make((8192, 64), F32)
  np.testing.assert_allclose(np.asarray(tj.jit(lambda a, b: a.T @ b)(x, g)), x.astype(F64).T @ g.astype(F64),
                             rtol=1e-6, atol=1e-4)
  image, w = make((128, 7, 7, 64), F32), make((3136, 128), F32)
  dense = tj.jit(lambda a, b: a.reshape(128, 3136) @ b)
  np.testing.assert_allclose(np.asarray(dense(image, w)), image.astype(F64).reshape(128, 3136) @ w.astype(F64),
                             rtol=1e-6, atol=1e-4)
  first, *_ = realize.kernels_of(dense.lower(image, w)._compiled.schedule.schedule.kernels)
  assert first.outer_size % SPLIT_THREADS == 0 and 3136 % first.outer_size == 0
  assert all(not linear_strides(n.src[1])[1] for n in first.ast.toposort if n.op is Ops.LOAD)



def test_weight_gradient_over_few_rows_of_taps_splits(threads):
  """A 3x3 convolution's weight gradient (3, 3, 32, 64) summed over 64x16x16 positions packs panels of all its column
  tiles, so it is launched over its 3 rows of taps, which leave threads idle (3 units on 2 threads: 7.5-9.2 -> 5.1-6.1
  ms on Zen 3): it splits, each partial summing a chunk of the positions for every tap. Against numpy in float64, both
  layouts."""
  from tinyjax import lax
  image, taps = make((64, 16, 16, 32), F32), make((3, 3, 32, 64), F32)
  out_grad = make((64, 16, 16, 64), F32)
  windows = np.lib.stride_tricks.sliding_window_view(np.pad(image.astype(F64), ((0, 0), (1, 1), (1, 1), (0, 0))),
                                                     (3, 3), axis=(1, 2))  # (n, h, w, c, kh, kw)
  want = np.einsum("nhwcij,nhwo->ijco", windows, out_grad.astype(F64))
  first = (0, 3, 1, 2)  # (NHWC -> NCHW)
  for numbers, x, g, w, order in ((("NHWC", "HWIO", "NHWC"), image, out_grad, taps, (0, 1, 2, 3)),
                                  (("NCHW", "OIHW", "NCHW"), image.transpose(first), out_grad.transpose(first),
                                   taps.transpose(3, 2, 0, 1), (3, 2, 0, 1))):
    def loss(w, x, g, numbers=numbers):
      return (lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=numbers) * g).sum()
    gradient = tj.jit(tj.grad(loss))
    np.testing.assert_allclose(np.asarray(gradient(w, x, g)), want.transpose(order), rtol=1e-5, atol=1e-2)
    kernels = list(realize.kernels_of(gradient.lower(w, x, g)._compiled.schedule.schedule.kernels))
    assert any(k.name.startswith("r_") and k.outer_size % SPLIT_THREADS == 0 and k.outer_size >= SPLIT_THREADS and
               k.work >= 64 * 16 * 16 * 9 * 32 * 64 for k in kernels)

@pytest.mark.usefixtures("avx512_tiles")  # (plans sized for AVX-512 registers)
def test_split_contraction_keeps_the_full_register_tile():
  """The first stage of a split float32 contraction sums into float64 partials, accumulated in float32 vectors: its
  register tile is 64 float32 columns wide (4 x 16 lanes), as the unsplit contraction's, not 32 (8 doubles)."""
  from tinyjax.codegen.opt import applied_opts
  sink = UOp(Ops.SINK, F32, (reduce_axis(_contraction(3, 1 << 17, 64), Ops.ADD, (1,)),))
  first = schedule(sink, threads=SPLIT_THREADS).kernels[0]
  assert first.outer_size > 1 and any(opt[0] == "upcast" and opt[2] == 64 for opt in applied_opts(first.ast))


def test_bias_gradient_splits_only_its_leading_axis(threads):
  """A sum over (N, H, W) into at most a register tile's columns (a bias gradient: one launch unit) splits, and
  into partials of N alone when they divide it: the first stage's reduced axes, adjacent in memory, are one loop
  with a plain stride (no division per element), and it is launched over its partials, not tiled across them (a
  32-wide bias read once per column is no reused operand). Values against numpy."""
  from tinyjax.codegen.opt import applied_opts
  shape = (64, 32, 32, 16)
  x, bias = param(shape), UOp(Ops.PARAM, F32, (), (1, (16,)))
  broadcast = UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (bias,), (1, 1, 1, 16)),), shape)
  value = UOp(Ops.MUL, F32, (UOp(Ops.ADD, F32, (x, broadcast)), x))
  sink = UOp(Ops.SINK, F32, (reduce_axis(value, Ops.ADD, (0, 1, 2)),))
  first, second = schedule(sink, threads=SPLIT_THREADS).kernels
  assert 64 % first.outer_size == 0 and first.outer_size % SPLIT_THREADS == 0
  nodes = first.ast.toposort
  assert not any(n.op in (Ops.IDIV, Ops.MOD) for n in nodes)
  assert sum(n.op is Ops.RANGE and n.arg[1] == "reduce" for n in nodes) == 1
  assert not any(opt[0] == "upcast" and opt[1] == 0 for opt in applied_opts(first.ast))  # the partials aren't rows
  host, bias_host = make(shape, F32), make((16,), F32)
  got = tj.jit(lambda a, b: ((a + b) * a).sum(axis=(0, 1, 2)))(tnp.asarray(host), tnp.asarray(bias_host))
  want = ((host.astype(F64) + bias_host) * host).sum(axis=(0, 1, 2))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
  assert kernel_count(lambda: tj.jit(lambda a: a.sum(axis=(0, 1, 2)))(tnp.asarray(host))) == 2


def test_batch_norm_sum_with_a_per_channel_scale_streams_and_splits(threads):
  """A sum over (N, H, W) of x times a per-channel vector (a batch-norm gradient's) into more channels than one
  register tile reads a broadcast operand, but has no row to tile: it is a stream over its channels, split by rows
  across the threads (unsplit, ResNet-50's ran on one thread). A contraction with a row still doesn't split.
  Values against numpy."""
  shape = (16, 16, 16, 256)
  x, scale = param(shape), UOp(Ops.PARAM, F32, (), (1, (256,)))
  broadcast = UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (scale,), (1, 1, 1, 256)),), shape)
  value = UOp(Ops.MUL, F32, (x, broadcast))
  assert split.split_partials(reduce_axis(value, Ops.ADD, (0, 1, 2)), SPLIT_THREADS, set()) > 0
  assert len(schedule(UOp(Ops.SINK, F32, (reduce_axis(value, Ops.ADD, (0, 1, 2)),)), threads=SPLIT_THREADS).kernels) \
      == 2
  host, scale_host = make(shape, F32), make((256,), F32)
  got = tj.jit(lambda a, s: (a * s).sum(axis=(0, 1, 2)))(tnp.asarray(host), tnp.asarray(scale_host))
  want = (host.astype(np.float64) * scale_host).sum(axis=(0, 1, 2))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)
