"""The GPU path: kernels rendered for NVPTX, run on a GPU device.

Every test of results runs on each GPU device there is: the emulated one of tests/gpu_emulator.py (the same kernels'
per-work-item code compiled for the CPU, on every machine), and each CUDA device when the CUDA driver is present.
PTX is checked on every machine by llvmlite's NVPTX backend, and assembled with `ptxas` when it is on PATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax.codegen import llvm
from tinyjax.codegen.gpu import BIG_MMA_TILE, BIG_TILE, SMALL_MMA_TILE, SMALL_TILE, GpuLaunch, gpu_launch
from tinyjax.codegen.llvm import render_gpu
from tinyjax.devices import cuda, opencl
from tinyjax.devices.device import CPU
from tinyjax.lower.realize import gpu_schedule
from tinyjax.lower.schedule import kernels_of

from gpu_emulator import EmulatedGPU, cpu_module_of_gpu_kernel

EMULATED = EmulatedGPU()
GPUS = [EMULATED] + list(cuda.cuda_devices() if cuda.device_count() else []) + \
    list(opencl.opencl_devices() if opencl.device_count() else [])


@pytest.fixture(params=GPUS, ids=repr)
def gpu(request):
  return request.param


def on(device, *values):
  return [tj.device_put(np.asarray(value), device) for value in values]


rng = np.random.default_rng(0)


# ---- results against numpy (float64 references)

def test_elementwise_and_broadcast(gpu):
  a, b = rng.standard_normal((33, 65)).astype(np.float32), rng.standard_normal(65).astype(np.float32)
  x, y = on(gpu, a, b)
  out = jnp.exp(x) * y - jnp.sin(x) / (1 + jnp.abs(y)) + jnp.tanh(x)
  assert out.device is gpu
  a64 = a.astype(np.float64)
  ref = np.exp(a64) * b - np.sin(a64) / (1 + np.abs(b)) + np.tanh(a64)
  np.testing.assert_allclose(np.asarray(out), ref, rtol=2e-6, atol=2e-6)


def test_reductions(gpu):
  a = rng.standard_normal((7, 300, 5)).astype(np.float32)
  (x,) = on(gpu, a)
  np.testing.assert_allclose(np.asarray(x.sum(axis=1)), a.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(x.max(axis=(0, 2))), a.max(axis=(0, 2)))
  np.testing.assert_array_equal(np.asarray(jnp.argmax(x, axis=1)), a.argmax(axis=1))
  # long enough to split into partial sums (two kernels)
  big = rng.standard_normal(1 << 22).astype(np.float32)
  (xb,) = on(gpu, big)
  # one work-item's long float32 sum is blocked (float32 blocks of 32 added in float64): 0.1 a million times is
  # within 1e-6, where one running float32 sum is off by 1e-4 relative
  (tenths,) = on(gpu, np.full(1 << 20, 0.1, np.float32))
  np.testing.assert_allclose(float(tenths.sum()), (1 << 20) * float(np.float32(0.1)), rtol=1e-6)
  # (the GPU adds in another order than the CPU: bounded by the sum of magnitudes, not the cancelled result)
  np.testing.assert_allclose(float(xb.sum()), big.astype(np.float64).sum(), atol=1e-7 * np.abs(big).sum())


def test_float32_subnormals_flush_to_zero_as_on_the_cpu(gpu):
  tiny = np.array([1e-30, -3e-31, 1.0], np.float32)
  (x,) = on(gpu, tiny)
  got = np.asarray(x * np.float32(1e-10))
  np.testing.assert_array_equal(got, np.asarray(jnp.asarray(tiny) * np.float32(1e-10)))
  assert got[0] == 0 and got[1] == 0 and got[2] == np.float32(1e-10)


def test_float16_subnormals_and_signs_are_kept_as_on_the_cpu(gpu):
  """float16's subnormals are normal float32 numbers: kept, as on the CPU, although float32 subnormals flush (NVPTX's
  float16 conversions and arithmetic flush them under that mode); a negation flips the sign of a float32 subnormal
  without flushing it (spacing(-0.0)); fmod of two infinities is NaN (NVPTX's frem gives the dividend)."""
  info = np.finfo(np.float16)
  half = np.array([info.tiny / 8, -info.tiny / 2, info.smallest_subnormal, 3.0], np.float16)
  (x,) = on(gpu, half)
  np.testing.assert_array_equal(np.asarray(x * 2), half * 2)
  np.testing.assert_array_equal(np.asarray(-x), -half)
  np.testing.assert_array_equal(np.asarray(x.astype(jnp.float32)), half.astype(np.float32))
  mantissa, exponent = jnp.frexp(x)
  np.testing.assert_array_equal(np.asarray(jnp.ldexp(mantissa, exponent)), half)
  np.testing.assert_array_equal(np.asarray(jnp.spacing(on(gpu, np.zeros(1, np.float16))[0])),
                                np.array([info.smallest_subnormal], np.float16))
  (negative_zero,) = on(gpu, np.array([-0.0], np.float32))
  np.testing.assert_array_equal(np.asarray(jnp.spacing(negative_zero)), -np.array([1e-45], np.float32))
  for dtype in (np.float16, np.float32):
    infinities = np.array([np.inf, -np.inf, np.inf, 5.0, -7.5], dtype)
    divisors = np.array([np.inf, -np.inf, 2.0, np.inf, -2.0], dtype)
    got = np.asarray(jnp.fmod(*on(gpu, infinities, divisors)))
    with np.errstate(invalid="ignore"):
      np.testing.assert_array_equal(got, np.fmod(infinities, divisors))


def test_matmul_and_dtypes(gpu):
  a, b = rng.standard_normal((40, 70)).astype(np.float32), rng.standard_normal((70, 30)).astype(np.float32)
  x, y = on(gpu, a, b)
  np.testing.assert_allclose(np.asarray(x @ y), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
  h = np.asarray((x.astype(jnp.bfloat16) * 3).astype(jnp.float32))
  np.testing.assert_array_equal(h, (np.asarray(a.astype(jnp.bfloat16)) * 3).astype(jnp.bfloat16).astype(np.float32))
  i = rng.integers(-1000, 1000, (50,)).astype(np.int32)
  (xi,) = on(gpu, i)
  np.testing.assert_array_equal(np.asarray(xi // 7 + xi % 5), i // 7 + i % 5)
  assert np.asarray(xi > 0).dtype == np.bool_


def _tiled_products():
  """(name, function, operands, float64 reference, tolerance) of matrix products a GPU runs tiled (GemmTile): edges
  of rows, columns and k that are no multiple of the blocks, transposed operands, an epilogue, a batch, 16-bit
  dtypes, elementwise work on the operands, a weight gradient, blocks of both sizes."""
  r = np.random.default_rng(7)
  a, b = r.standard_normal((300, 77)).astype(np.float32), r.standard_normal((77, 200)).astype(np.float32)
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  bias = r.standard_normal(200).astype(np.float32)
  yield "edges", lambda u, v: u @ v, (a, b), a64 @ b64, 1e-5
  yield "a.T", lambda u, v: u.T @ v, (np.ascontiguousarray(a.T), b), a64 @ b64, 1e-5
  yield "b.T", lambda u, v: u @ v.T, (a, np.ascontiguousarray(b.T)), a64 @ b64, 1e-5
  yield "bias relu", lambda u, v, c: jnp.maximum(u @ v + c, 0), (a, b, bias), np.maximum(a64 @ b64 + bias, 0), 1e-5
  batch_a = r.standard_normal((3, 130, 40)).astype(np.float32)
  batch_b = r.standard_normal((3, 40, 150)).astype(np.float32)
  yield "batched", lambda u, v: u @ v, (batch_a, batch_b), batch_a.astype(np.float64) @ batch_b, 1e-5
  for dtype, tolerance in ((jnp.bfloat16, 1e-2), (jnp.float16, 2e-3)):
    narrow_a, narrow_b = a.astype(dtype), b.astype(dtype)
    yield np.dtype(dtype).name, lambda u, v: u @ v, (narrow_a, narrow_b), \
        narrow_a.astype(np.float64) @ narrow_b.astype(np.float64), tolerance
  yield "tanh(a) @ exp(b)", lambda u, v: jnp.tanh(u) @ jnp.exp(v * 0.1), (a, b), np.tanh(a64) @ np.exp(b64 * 0.1), 1e-5
  w, x = r.standard_normal((64, 256)).astype(np.float32), r.standard_normal((256, 100)).astype(np.float32)
  yield "weight gradient", lambda w_, x_: tj.grad(lambda q: jnp.sum(jnp.tanh(q @ x_)))(w_), (w, x), \
      (1 - np.tanh(w.astype(np.float64) @ x) ** 2) @ x.T.astype(np.float64), 1e-5
  big_a, big_b = r.standard_normal((1300, 20)).astype(np.float32), r.standard_normal((20, 1700)).astype(np.float32)
  yield "big blocks", lambda u, v: u @ v, (big_a, big_b), big_a.astype(np.float64) @ big_b, 1e-5
  # a 3x3 convolution and its gradients: sums over the window and the channels, rows over (batch, height, width)
  x, w = r.standard_normal((2, 16, 16, 40)).astype(np.float32), r.standard_normal((3, 3, 40, 48)).astype(np.float32)
  g = r.standard_normal((2, 16, 16, 48)).astype(np.float32)
  x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), g.astype(np.float64)
  padded = np.pad(x64, ((0, 0), (1, 1), (1, 1), (0, 0)))
  windows = [(i, j, padded[:, i:i + 16, j:j + 16]) for i in range(3) for j in range(3)]

  def conv(u, v): return tj.lax.conv_general_dilated(u, v, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  yield "conv", conv, (x, w), sum(np.einsum("nhwc,co->nhwo", view, w64[i, j]) for i, j, view in windows), 1e-5
  grad_x = np.zeros_like(padded)
  for i, j, _ in windows: grad_x[:, i:i + 16, j:j + 16] += np.einsum("nhwo,co->nhwc", g64, w64[i, j])
  yield "conv input gradient", lambda u, v, c: tj.grad(lambda q: (conv(q, v) * c).sum())(u), (x, w, g), \
      grad_x[:, 1:-1, 1:-1], 1e-5
  grad_w = np.stack([np.einsum("nhwc,nhwo->co", view, g64) for _, _, view in windows]).reshape(w.shape)
  yield "conv weight gradient", lambda u, v, c: tj.grad(lambda q: (conv(u, q) * c).sum())(v), (x, w, g), grad_w, 1e-5
  x16, w16 = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  windows16 = [(i, j, np.pad(x16.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))[:, i:i + 16, j:j + 16])
               for i in range(3) for j in range(3)]
  yield "16-bit conv", conv, (x16, w16), \
      sum(np.einsum("nhwc,co->nhwo", view, w16.astype(np.float64)[i, j]) for i, j, view in windows16), 1e-2
  # 16-bit operands (tensor cores where there are some): float32 sums of exact products, rounded once at the end
  def narrow(*arrays, dtype=jnp.bfloat16): return [x.astype(dtype) for x in arrays]
  def wide(*arrays): return [x.astype(np.float64) for x in arrays]
  u16, v16 = narrow(big_a[:, :40].repeat(2, axis=1), big_b.repeat(2, axis=0))
  yield "16-bit big blocks", lambda u, v: u @ v, (u16, v16), np.matmul(*wide(u16, v16)), 1e-2
  u16, v16 = narrow(np.ascontiguousarray(a.T), b, dtype=jnp.float16)
  yield "16-bit a.T", lambda u, v: u.T @ v, (u16, v16), wide(u16)[0].T @ wide(v16)[0], 2e-3
  u16, v16 = narrow(batch_a, batch_b)
  yield "16-bit batched", lambda u, v: u @ v, (u16, v16), np.matmul(*wide(u16, v16)), 1e-2
  u16, v16, c16 = narrow(a, b, bias)
  yield "16-bit bias relu", lambda u, v, c: jnp.maximum(u @ v + c, 0), (u16, v16, c16), \
      np.maximum(np.matmul(*wide(u16, v16)) + wide(c16)[0], 0), 1e-2


@pytest.mark.parametrize("case", list(_tiled_products()), ids=lambda case: case[0])
def test_tiled_matmuls(gpu, case):
  """Matrix products tiled into local memory (codegen/gpu.py GemmTile) on devices whose work-items wait at barriers
  (the others run them one work-item per output): values against numpy in float64, relative to the largest."""
  name, f, operands, want, tolerance = case
  args = on(gpu, *operands)
  jitted = tj.jit(f)
  kernels = kernels_of(jitted.lower(*args)._compiled.schedule.schedule.kernels)
  tiles = [gpu_launch(k.ast, k.ordered, gpu.groups, gpu.mma).tile for k in kernels]
  assert any(tile is not None for tile in tiles) == gpu.groups, name
  if gpu.groups and name == "big blocks": assert {tile.sizes for tile in tiles if tile} == {BIG_TILE}
  if gpu.mma and name in ("bfloat16", "float16") or name.startswith("16-bit"):
    assert any(tile is not None and tile.mma for tile in tiles) == gpu.mma, name
  got = np.asarray(jitted(*args)).astype(np.float64)
  assert np.abs(got - want).max() <= tolerance * np.abs(want).max(), name


def test_tiled_float64_matmul_sums_in_float64(gpu):
  """Under x64 a float64 product is tiled too (float64 sums), an integer one stays one work-item per output."""
  r = np.random.default_rng(3)
  a, b = r.standard_normal((300, 77)), r.standard_normal((77, 200))
  with tj.config.override("jax_enable_x64", True):
    x, y = on(gpu, a, b)
    f = tj.jit(lambda u, v: u @ v)
    (kernel,) = kernels_of(f.lower(x, y)._compiled.schedule.schedule.kernels)
    assert (gpu_launch(kernel.ast, 0, gpu.groups).tile is not None) == gpu.groups
    np.testing.assert_allclose(np.asarray(f(x, y)), a @ b, rtol=1e-12, atol=1e-12)
    i, j = on(gpu, np.arange(300 * 77).reshape(300, 77) % 7, np.arange(77 * 200).reshape(77, 200) % 5)
    (kernel,) = kernels_of(f.lower(i, j)._compiled.schedule.schedule.kernels)
    assert gpu_launch(kernel.ast, 0, gpu.groups).tile is None
    np.testing.assert_array_equal(np.asarray(f(i, j)), (np.arange(300 * 77).reshape(300, 77) % 7) @
                                  (np.arange(77 * 200).reshape(77, 200) % 5))


def test_pow_every_float_dtype(gpu):
  """POW (no libm on the GPU: transcendental.pow_f64) against the CPU's libm pow, special values included."""
  specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0], [2.5, -3.0, 0.0, np.inf, 3.0, np.nan, 7.0]
  base = np.concatenate([rng.uniform(0, 3, 200), -rng.integers(1, 5, 20), specials[0]])
  exponent = np.concatenate([rng.uniform(-6, 6, 200), rng.integers(-5, 6, 20), specials[1]])
  for dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
    a, b = base.astype(dtype), exponent.astype(dtype)
    x, y = on(gpu, a, b)
    got, want = np.asarray(x ** y).astype(np.float64), np.asarray(jnp.asarray(a) ** jnp.asarray(b)).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # libm's powf rounds to float32 before the 16-bit rounding, the GPU once from float64: a step apart at most
    np.testing.assert_allclose(got, want, rtol=2 * float(jnp.finfo(dtype).eps), atol=0)
  # Adam's bias correction: b ** t with a traced integer step
  (t,) = on(gpu, np.float32(7))
  np.testing.assert_allclose(float(tj.jit(lambda t: 1 - 0.999 ** t)(t)), 1 - float(np.float32(0.999)) ** 7, rtol=1e-4)


def test_float64_on_the_gpu(gpu):
  """float64 EXP2 / LOG2 / SIN / POW (transcendental.py) within an ulp or two of the CPU's libm, through exp, log,
  sin, tanh, ** and a gradient under jit."""
  with tj.config.override("jax_enable_x64", True):
    a = np.concatenate([rng.uniform(-30, 30, 300), [1e-310, 1e300, -1e22, 0.0, -0.0, np.inf, np.nan]])
    (x,) = on(gpu, a)
    # (not cos: 1 - 2 sin(x / 2)^2 turns the ulp of either sin into many where cos is small)
    for f in (jnp.exp, jnp.sin, jnp.tanh, lambda v: jnp.log(jnp.abs(v)), lambda v: jnp.abs(v) ** 1.7):
      got, want = np.asarray(f(x)), np.asarray(f(jnp.asarray(a)))
      assert got.dtype == np.float64
      # (the CPU flushes subnormals, inputs and results; the GPU keeps float64's)
      finite = np.isfinite(want) & (np.abs(want) > 1e-300) & ~((a != 0) & (np.abs(a) < 1e-300))
      np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
      np.testing.assert_allclose(got[finite], want[finite], rtol=5e-16, atol=0)
    g = tj.jit(tj.grad(lambda v: (jnp.abs(v) ** 3.5 + jnp.sin(v) * jnp.exp(-v * v)).sum()))
    # (OpenCL's built-in pow / exp may differ from libm by an ulp: 2e-16 absolute where terms of size 1 cancel)
    np.testing.assert_allclose(np.asarray(g(x[:300])), np.asarray(g(jnp.asarray(a[:300]))), rtol=2e-15, atol=1e-15)


def test_grad_of_pow_under_jit(gpu):
  a = rng.uniform(0.1, 3, 100).astype(np.float32)
  (x,) = on(gpu, a)
  f = tj.jit(tj.grad(lambda v: (v ** 3.5).sum()))
  np.testing.assert_allclose(np.asarray(f(x)), np.asarray(f(jnp.asarray(a))), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(f(x)), 3.5 * a.astype(np.float64) ** 2.5, rtol=1e-6)


def test_jit_grad_vmap_compose(gpu):
  w = rng.standard_normal((8, 4)).astype(np.float32)
  xs = rng.standard_normal((5, 8)).astype(np.float32)

  def loss(w, x): return jnp.sum(jnp.tanh(x @ w) ** 2)

  per_example = tj.jit(tj.vmap(tj.grad(loss), in_axes=(None, 0)))
  gw, gx = on(gpu, w, xs)
  got = per_example(gw, gx)
  assert got.device is gpu
  want = np.stack([np.asarray(tj.grad(loss)(w, x)) for x in xs])  # on the CPU
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  # finite differences of one entry
  eps, x0 = 1e-3, xs[0].astype(np.float64)
  w_plus, w_minus = w.astype(np.float64).copy(), w.astype(np.float64).copy()
  w_plus[2, 1] += eps
  w_minus[2, 1] -= eps
  numeric = (np.sum(np.tanh(x0 @ w_plus) ** 2) - np.sum(np.tanh(x0 @ w_minus) ** 2)) / (2 * eps)
  # (atol: float32 sums of terms near 1 round at ~1e-7, so an entry near 0 is checked absolutely)
  np.testing.assert_allclose(np.asarray(got)[0, 2, 1], numeric, rtol=1e-3, atol=1e-6)


def test_control_flow_reads_flags_from_the_device(gpu):
  (x,) = on(gpu, np.float32(1.0))
  out = tj.jit(lambda v: tj.lax.while_loop(lambda c: c[1] < 100.0, lambda c: (c[0] + 1, c[1] * 2), (0, v)))(x)
  assert int(out[0]) == 7 and float(out[1]) == 128.0
  steps = tj.lax.fori_loop(0, 10, lambda i, c: c + i, x)
  assert float(steps) == 46.0
  branch = tj.lax.cond(x > 0, lambda v: v * 3, lambda v: v - 3, x)
  assert float(branch) == 3.0


def test_sort_gather_scatter_random(gpu):
  a = rng.standard_normal((4, 37)).astype(np.float32)
  (x,) = on(gpu, a)
  np.testing.assert_array_equal(np.asarray(jnp.sort(x, axis=1)), np.sort(a, axis=1))
  index = np.array([3, 0, 3, 1])
  np.testing.assert_array_equal(np.asarray(x[jnp.asarray(index)]), a[index])
  np.testing.assert_allclose(np.asarray(x.at[jnp.asarray(index)].add(1.0)), _scatter_add(a, index), rtol=1e-6)
  # duplicates: every update lands (add), the last one wins (set), whatever order the work-items run in
  values = rng.standard_normal((4, 37)).astype(np.float32)
  (v,) = on(gpu, values)
  expected = a.copy()
  for row, update in zip(index, values): expected[row] = update
  np.testing.assert_array_equal(np.asarray(x.at[jnp.asarray(index)].set(v)), expected)
  # windows that overlap (3 rows long at clipped starts 1 and 0 of 4 rows): the later update wins where both write
  dn = tj.lax.ScatterDimensionNumbers((1, 2), (), (0,))
  windows = rng.standard_normal((2, 3, 37)).astype(np.float32)
  w, starts = on(gpu, windows, np.array([[5], [0]], np.int32))
  expected = a.copy()
  expected[1:4], expected[0:3] = windows[0], windows[1]
  np.testing.assert_array_equal(np.asarray(tj.lax.scatter(x, starts, w, dn, mode="clip")), expected)
  flat = rng.integers(0, 5, 200)
  counts = tj.jit(lambda i: jnp.zeros(5, jnp.int32).at[i].add(1))(tj.device_put(flat, gpu))
  np.testing.assert_array_equal(np.asarray(counts), np.bincount(flat, minlength=5))
  key = tj.device_put(tj.random.PRNGKey(42), gpu)
  np.testing.assert_array_equal(np.asarray(tj.random.uniform(key, (1000,))),
                                np.asarray(tj.random.uniform(tj.random.PRNGKey(42), (1000,))))


def _scatter_add(a, index):
  out = a.copy()
  np.add.at(out, index, 1.0)
  return out


def test_conv(gpu):
  a, k = rng.standard_normal((2, 3, 9, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  x, w = on(gpu, a, k)
  got = tj.lax.conv(x, w, (1, 1), "SAME")
  want = tj.lax.conv(jnp.asarray(a), jnp.asarray(k), (1, 1), "SAME")
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


# ---- placement

def test_placement_follows_the_inputs(gpu):
  a = np.arange(6, dtype=np.float32)
  (x,) = on(gpu, a)
  assert x.devices() == {gpu} and tj.device_get(x).tolist() == a.tolist()
  with tj.config.override("jax_platforms", "cpu"):  # (the suite may run with a GPU as the default device)
    y = jnp.asarray(a)  # default device: the CPU
    assert y.device is CPU
    mixed = x + y  # the explicitly placed array pulls the computation; the other is copied
    assert mixed.device is gpu
    np.testing.assert_array_equal(np.asarray(mixed), 2 * a)
    back = tj.device_put(mixed, CPU)
    assert back.device is CPU and np.asarray(back).tolist() == (2 * a).tolist()
    assert tj.device_put(x, gpu) is x
    f = tj.jit(lambda u: u * 2)
    assert f(x).device is gpu and f(y).device is CPU  # one function, compiled for each device
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(f(y)))


def test_two_explicit_devices_is_an_error():
  other = EmulatedGPU(1)
  (x,) = on(EMULATED, np.ones(3, np.float32))
  (y,) = on(other, np.ones(3, np.float32))
  with pytest.raises(ValueError, match="incompatible devices"):
    np.asarray(x + y)


def test_device_api_errors():
  with tj.config.override("jax_platforms", "cpu"):
    assert tj.devices() == [CPU] and tj.default_backend() == "cpu" and tj.device_count() == 1
  with pytest.raises(RuntimeError, match="Unknown backend"):
    tj.devices("tpu")
  with pytest.raises(TypeError, match="expected a device"):
    tj.device_put(np.ones(2), "gpu")
  if not cuda.device_count():
    with pytest.raises(RuntimeError, match="Unable to initialize backend 'cuda'"):
      tj.devices("gpu")
    with tj.config.override("jax_platforms", "cuda"), pytest.raises(RuntimeError, match="libcuda"):
      np.asarray(jnp.ones(3) + 1)
  with tj.config.override("jax_platforms", "cuda,cpu"):  # falls back to what can start
    assert tj.default_backend() == ("gpu" if cuda.device_count() else "cpu")


# ---- PTX, on every machine

def _programs():
  x, w = jnp.ones((64, 128)), jnp.ones((128, 32))
  yield "elementwise", lambda a: jnp.exp(a) + jnp.log(a) * jnp.sin(a), (x,)
  yield "matmul", lambda a, b: a @ b, (x, w)
  yield "softmax", lambda a: tj.nn.softmax(a), (x,)
  yield "split sum", lambda a: a.sum(), (jnp.ones(1 << 22),)
  yield "float16 bfloat16 int", lambda a: ((a.astype(jnp.bfloat16) * 2).astype(jnp.float16),
                                           a.astype(jnp.int32) // 3), (x,)
  yield "grad", tj.grad(lambda a: (jnp.tanh(a @ w) ** 2).sum()), (x,)
  yield "sort", lambda a: jnp.sort(a, axis=1), (x,)
  yield "random", lambda k: tj.random.normal(k, (100,)), (tj.random.PRNGKey(0),)
  yield "pow", lambda a: a ** (a * 0.5) + a.astype(jnp.bfloat16) ** 2.5, (x,)
  big, edge = jnp.ones((256, 256)), jnp.ones((300, 77))
  yield "tiled matmul", lambda a, b: jnp.maximum(a @ b + 1, 0), (big, big)
  yield "tiled matmul edges", lambda a, b: (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).T, (edge, edge.T)
  yield "tiled matmul big", lambda a, b: a @ b, (jnp.ones((2048, 64)), jnp.ones((64, 2048)))
  yield "tensor cores big", lambda a, b: a @ b, (jnp.ones((2048, 64), jnp.float16), jnp.ones((64, 2048), jnp.float16))
  yield "tensor cores edges", lambda a, b: jnp.tanh(a @ b), (jnp.ones((300, 77), jnp.bfloat16),
                                                             jnp.ones((77, 200), jnp.bfloat16))
  # (NCHW, 73728 outputs of 360 steps: one product storing channels first, lower/schedule.py `_contraction_order`)
  yield "tensor cores conv", lambda a, b: tj.lax.conv_general_dilated(a, b, (1, 1), "SAME"), \
      (jnp.ones((6, 40, 16, 16), jnp.bfloat16), jnp.ones((48, 40, 3, 3), jnp.bfloat16))


def _float64_programs():
  x = jnp.ones(64, jnp.float64)
  yield "float64", lambda a: jnp.exp(a) + jnp.log(a) * jnp.sin(a) + a ** 1.5, (x,)


def _gpu_launches():
  """(program name, kernel, launch) of every kernel of the programs, launched on a GPU without tensor cores and, where
  that differs, on one with them."""
  for name, kernel in _gpu_kernels():
    plain = gpu_launch(kernel.ast, kernel.ordered)
    yield name, kernel, plain
    if (tensor := gpu_launch(kernel.ast, kernel.ordered, mma=True)) != plain: yield name, kernel, tensor


def _gpu_kernels():
  for name, f, args in _programs():
    sink = tj.jit(f).lower(*args)._compiled.jaxpr.sink
    for kernel in kernels_of(gpu_schedule(sink).kernels):
      yield name, kernel
  with tj.config.override("jax_enable_x64", True):
    for name, f, args in _float64_programs():
      sink = tj.jit(f).lower(*args)._compiled.jaxpr.sink
      for kernel in kernels_of(gpu_schedule(sink).kernels):
        yield name, kernel


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_to_ptx(arch, tmp_path, on_cpu):
  ptxas = shutil.which("ptxas")
  count = 0
  grouped = 0
  tiled = {}
  before = tj.compile_cache_stats()["ptx"]
  tensor = {}
  for name, kernel, launch in _gpu_launches():
    ir = render_gpu(kernel.name, kernel.ast, kernel.ordered, launch)
    assert "!nvvm.annotations" in ir and "@llvm.nvvm.read.ptx.sreg.ctaid.x" in ir
    ptx = cuda.compile_ptx(kernel.name, ir, arch)
    assert f".target {arch}" in ptx and f".entry {kernel.name}" in ptx, name
    assert ".extern" not in ptx, f"{name}: the PTX calls a function the GPU doesn't have"
    if name == "elementwise": assert ".ftz.f32" in ptx  # float32 subnormals flush, as on the CPU
    if launch.group > 1:  # a group reduction or a tiled product: shared memory and barriers
      assert ".shared" in ptx and "bar.sync" in ptx, name
      grouped += 1
    if launch.tile is not None and launch.tile.mma:  # the 16-bit operands' products on tensor cores
      assert "mma.sync.aligned.m16n8k16.row.col.f32" in ptx and "ld.shared" in ptx, name
      tensor[name] = launch.tile.sizes
    elif launch.tile is not None:  # operands staged in shared memory, products fused in multiply-adds
      assert "ld.shared" in ptx and ("fma.rn.f32" in ptx or "fma.rn.ftz.f32" in ptx), name
      tiled[name] = launch.tile.sizes
    if ptxas:
      path = tmp_path / f"{kernel.name}.ptx"
      path.write_text(ptx)
      done = subprocess.run([ptxas, f"-arch={arch}", str(path), "-o", os.devnull], capture_output=True, text=True)
      assert done.returncode == 0, f"ptxas rejected {kernel.name} ({name}):\n{done.stderr}"
    count += 1
  assert count >= 20 and grouped >= 3
  assert tiled == {"tiled matmul": SMALL_TILE, "tiled matmul edges": SMALL_TILE, "tiled matmul big": BIG_TILE,
                   "tensor cores big": BIG_TILE, "tensor cores edges": SMALL_TILE, "tensor cores conv": SMALL_TILE}
  assert tensor == {"tensor cores big": BIG_MMA_TILE, "tensor cores edges": SMALL_MMA_TILE,
                    "tensor cores conv": SMALL_MMA_TILE}
  after = tj.compile_cache_stats()["ptx"]  # each kernel made (a miss) or found in the disk cache (a hit)
  assert (after["hits"] + after["misses"]) - (before["hits"] + before["misses"]) == count
  if not ptxas: print("ptxas is not on PATH: PTX generated by LLVM but not assembled")


def test_work_items_cover_the_outputs():
  sink = tj.jit(lambda a: a.sum(axis=1)).lower(jnp.ones((6, 10, 7)))._compiled.jaxpr.sink
  (kernel,) = kernels_of(gpu_schedule(sink).kernels)
  assert gpu_launch(kernel.ast) == GpuLaunch(42, 1) and gpu_launch(kernel.ast).work_items == 42
  cpu_ir = cpu_module_of_gpu_kernel(kernel.name, render_gpu(kernel.name, kernel.ast))
  assert "nvvm" not in cpu_ir and "nvptx" not in cpu_ir


def test_unsupported_ops_name_themselves(monkeypatch):
  """A libm intrinsic in a GPU kernel is an error that names it (none is left: POW and the float64
  transcendentals are arithmetic, transcendental.py; here they are made intrinsics again)."""
  with tj.config.override("jax_enable_x64", True):
    sink = tj.jit(lambda a: a ** 2.5 + jnp.sin(a)).lower(jnp.ones(8, jnp.float64))._compiled.jaxpr.sink
  (kernel,) = kernels_of(gpu_schedule(sink).kernels)
  ir = render_gpu(kernel.name, kernel.ast)
  assert "@llvm.pow" not in ir and "@llvm.sin" not in ir
  monkeypatch.setattr(llvm, "_FLOAT64_ARITHMETIC", {})
  with pytest.raises(NotImplementedError, match="llvm.sin"):
    render_gpu(kernel.name, kernel.ast)


@pytest.mark.skipif(not cuda.device_count(), reason="no CUDA device (the CUDA driver is absent or sees no GPU)")
def test_cuda_out_of_memory_is_a_python_error():
  device = cuda.cuda_devices()[0]
  free, total = device.memory_info()
  assert 0 < free <= total
  with pytest.raises(MemoryError, match="out of GPU memory"):
    device.allocate(2 * total)
