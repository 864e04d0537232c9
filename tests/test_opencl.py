"""The OpenCL device and its OpenCL C renderer, run for real on PoCL (a CPU OpenCL; `make test` installs Debian's
pocl-opencl-icd and pyopencl where it can). The GPU tests of results (tests/test_gpu.py) run on it too.

Each test of semantics computes the same program on the OpenCL device and on the CPU (whose kernels are checked
against numpy throughout the suite) and against numpy where numpy has the answer: the two backends must agree bit for
bit wherever the result is exact.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax.codegen.gpu import GpuLaunch, gpu_launch
from tinyjax.codegen.opencl import literal, render_opencl
from tinyjax.devices import opencl
from tinyjax.devices.device import CPU
from tinyjax.lower.realize import gpu_schedule
from tinyjax.lower.schedule import kernels_of, schedule

pytestmark = pytest.mark.skipif(
  not opencl.device_count(),
  reason="no OpenCL device: install PoCL and pyopencl (sudo apt-get install pocl-opencl-icd; "
         "pip install 'tinyjax[opencl]')")


@pytest.fixture(scope="module")
def cl():
  return opencl.opencl_devices()[0]


@pytest.fixture(autouse=True)
def x64():
  with tj.config.override("jax_enable_x64", True): yield


def both(f, *arrays, device):
  """f on the OpenCL device and on the CPU, as host arrays."""
  on_device = f(*(tj.device_put(np.asarray(a), device) for a in arrays))
  on_cpu = f(*(tj.device_put(np.asarray(a), CPU) for a in arrays))
  for out in tj.tree_util.tree_leaves(on_device): assert out.device is device
  return tj.tree_util.tree_map(np.asarray, on_device), tj.tree_util.tree_map(np.asarray, on_cpu)


def same(f, *arrays, device):
  """f on the OpenCL device equals f on the CPU: bit for bit (so -0.0 is not 0.0), NaN for NaN (any payload)."""
  got, want = both(f, *arrays, device=device)
  for g, w in zip(tj.tree_util.tree_leaves(got), tj.tree_util.tree_leaves(want)):
    assert g.dtype == w.dtype and g.shape == w.shape
    if g.dtype.kind == "f" or g.dtype in (ml_dtypes.bfloat16,):
      g, w = np.atleast_1d(g), np.atleast_1d(w)
      nan = np.isnan(g.astype(np.float64))
      np.testing.assert_array_equal(nan, np.isnan(w.astype(np.float64)))
      g, w = g[~nan].view(f"u{g.dtype.itemsize}"), w[~nan].view(f"u{w.dtype.itemsize}")
    np.testing.assert_array_equal(g, w)
  return got


INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_arithmetic_wraps_and_divides_as_xla(cl, dtype):
  info = np.iinfo(dtype)
  values = np.array([info.min, info.max, 0, 1, 7, info.max // 3, info.min + 1, 5], dtype)
  divisors = np.array([-1 if info.min else 3, 2, 0, 0, -2 if info.min else 2, 7, -1 if info.min else 1, 3], dtype)
  got = same(lambda a, b: (a + b, a * b, -a, a // b, a % b, tj.lax.div(a, b), tj.lax.rem(a, b), jnp.maximum(a, b),
                           a & b, a | b, a ^ b), values, divisors, device=cl)
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(got[0], values + divisors)
    np.testing.assert_array_equal(got[1], values * divisors)
  div = got[5]
  minus_one = np.array(-1).astype(dtype)
  assert div[2] == minus_one and div[3] == minus_one  # x / 0 = -1, as XLA
  assert got[6][2] == values[2] and got[6][3] == values[3]  # x % 0 = x
  if info.min: assert div[0] == info.min and got[6][0] == 0  # INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32], ids=lambda d: np.dtype(d).name)
def test_shifts_by_the_width_shift_everything_out(cl, dtype):
  bits = np.dtype(dtype).itemsize * 8
  values = np.array([1, -1 if np.iinfo(dtype).min else 200, 5, np.iinfo(dtype).max, 3, 3], dtype)
  amounts = np.array([0, 1, bits - 1, bits, bits + 3, 2], dtype)
  got = same(lambda a, s: (tj.lax.shift_left(a, s), tj.lax.shift_right_arithmetic(a, s),
                           tj.lax.shift_right_logical(a, s)), values, amounts, device=cl)
  assert got[0][3] == 0 and got[0][4] == 0


def test_float_specials_max_and_conversions(cl):
  special = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, -2.5, 3e9, -3e9, 1e-30, 65504.0, 7e4], np.float32)
  other = np.array([1.0, 0.0, -0.0, np.nan, 2.0, -1.0, -2.5, 1.0, 0.0, 0.0, 1.0, 1.0], np.float32)
  same(lambda a, b: (jnp.maximum(a, b), jnp.minimum(a, b), a / b, jnp.fmod(a, b), a < b, a != b,
                     a.astype(jnp.int32), a.astype(jnp.uint8), a.astype(jnp.int64), a.astype(jnp.bool_),
                     a.astype(jnp.float16), a.astype(jnp.bfloat16), a.astype(jnp.float64), jnp.trunc(a),
                     jnp.sqrt(jnp.abs(a)), jnp.where(a < b, a, b)), special, other, device=cl)
  got = np.asarray(tj.device_put(special, cl).astype(jnp.int32))
  np.testing.assert_array_equal(got[[0, 3, 4, 7, 8]], [0, 2**31 - 1, -2**31, 2**31 - 1, -2**31])  # saturating


def test_sixteen_bit_floats_round_once_per_op(cl):
  a = np.random.default_rng(1).standard_normal(300).astype(np.float32) * 300
  for dtype in (jnp.float16, jnp.bfloat16):
    x = a.astype(dtype)
    got = same(lambda u: (u * u + u, u / 3, jnp.sqrt(jnp.abs(u)), u.astype(jnp.float32), u.sum(), u.max()), x,
               device=cl)
    with np.errstate(over="ignore"):
      np.testing.assert_array_equal(got[0], ((x.astype(np.float32) * x.astype(np.float32)).astype(dtype)
                                             .astype(np.float32) + x.astype(np.float32)).astype(dtype))
  # float64 -> float16 rounds once (not through float32): 1 + 2^-11 + 2^-40 rounds up
  same(lambda u: (u.astype(jnp.float16), u.astype(jnp.bfloat16), u.astype(jnp.float32)),
       np.array([1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-8 + 2.0**-40, np.nan, -1e300], np.float64), device=cl)
  # integers to 16-bit floats
  same(lambda u: (u.astype(jnp.float16), u.astype(jnp.bfloat16)),
       np.array([2**31 - 1, -(2**24) - 1, 65519, 65520, 257], np.int32), device=cl)


def test_bitcasts_and_bools(cl):
  f = np.array([1.0, -0.0, np.nan, 3.5], np.float32)
  same(lambda u: (tj.lax.bitcast_convert_type(u, jnp.int32), tj.lax.bitcast_convert_type(u, jnp.uint32)), f,
       device=cl)
  h = np.array([1.0, -2.0, 65504.0, 6e-8], np.float16)
  same(lambda u: (tj.lax.bitcast_convert_type(u, jnp.int16),
                  tj.lax.bitcast_convert_type(tj.lax.bitcast_convert_type(u, jnp.uint16), jnp.float16),
                  tj.lax.bitcast_convert_type(u.astype(jnp.bfloat16), jnp.uint16)), h, device=cl)
  b = np.array([True, False, True, True])
  got = same(lambda u: (u & ~u, u | True, jnp.logical_xor(u, True), u.sum(), jnp.all(u), jnp.any(u), u.astype(jnp.int8),
                        jnp.where(u, 2.0, 3.0)), b, device=cl)
  assert got[3] == 3 and not got[4] and got[5]


def test_float64_and_transcendentals(cl):
  a = np.linspace(-30, 30, 257)
  got, _ = both(lambda u: (jnp.exp(u), jnp.log(jnp.abs(u) + 1), jnp.sin(u), jnp.tanh(u), u ** 2.5, jnp.abs(u) ** 0.3),
                a, device=cl)
  with np.errstate(invalid="ignore"): want = (np.exp(a), np.log(np.abs(a) + 1), np.sin(a), np.tanh(a), a ** 2.5,
                                              np.abs(a) ** 0.3)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-14, atol=1e-300)
  x = a.astype(np.float32)
  got, _ = both(lambda u: (jnp.exp(u / 4), jnp.log(jnp.abs(u) + 1), jnp.sin(u), jnp.abs(u) ** 1.7), x, device=cl)
  x64 = x.astype(np.float64)
  for g, w in zip(got, (np.exp(x64 / 4), np.log(np.abs(x64) + 1), np.sin(x64), np.abs(x64) ** 1.7)):
    np.testing.assert_allclose(g, w, rtol=3e-7, atol=1e-7)


def test_sums_are_blocked_and_reductions_mix(cl):
  tenths = np.full(1 << 20, 0.1, np.float32)
  got, _ = both(lambda u: u.sum(), tenths, device=cl)
  np.testing.assert_allclose(float(got), (1 << 20) * float(np.float32(0.1)), rtol=1e-6)
  a = np.random.default_rng(2).integers(-50, 50, (6, 33, 5)).astype(np.int8)
  same(lambda u: (u.sum(axis=1, dtype=jnp.int8), u.max(axis=(0, 2)), u.min(axis=1), jnp.prod(u[:, :3], axis=1),
                  u.astype(jnp.float32).mean(axis=2)), a, device=cl)


def test_composed_transformations(cl):
  w = np.random.default_rng(3).standard_normal((6, 3)).astype(np.float32)
  xs = np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32)

  def loss(w, x): return jnp.sum(jax_softplus(x @ w))

  def jax_softplus(v): return jnp.logaddexp(v, 0.0)

  f = tj.jit(tj.vmap(tj.grad(loss), in_axes=(None, 0)))
  g = tj.vmap(tj.jit(tj.grad(loss)), in_axes=(None, 0))
  got, want = both(f, w, xs, device=cl)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  got2, _ = both(g, w, xs, device=cl)
  np.testing.assert_allclose(got2, want, rtol=1e-6, atol=1e-7)
  # against float64 numpy: d/dw sum(softplus(x @ w)) = x^T sigmoid(x @ w)
  ref = np.stack([np.outer(x, 1 / (1 + np.exp(-(x.astype(np.float64) @ w)))) for x in xs])
  np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-6)


# ---- the renderer and the device

def _kernels(f, *args):
  sink = tj.jit(f).lower(*args)._compiled.jaxpr.sink
  return kernels_of(gpu_schedule(sink).kernels)


def test_source_reads_as_c():
  (kernel,) = _kernels(lambda a: (a * 2).sum(axis=1), jnp.ones((6, 10), jnp.float32))
  source = render_opencl(kernel.name, kernel.ast)
  assert "__kernel void" in source and "get_global_id(0)" in source and "if (gid >= 6L) return;" in source
  assert "for (long r" in source and "__global float *restrict buf0" in source
  assert literal(float("-inf"), np.dtype(np.float32)) == "((float)-INFINITY)"
  assert literal(-2**63, np.dtype(np.int64)) == "(-9223372036854775807L - 1L)"
  assert literal(1.5, np.dtype(ml_dtypes.bfloat16)) == "0x1.8000000000000p+0f"


def test_binaries_come_from_the_disk_cache(cl, tmp_path, monkeypatch):
  monkeypatch.setenv("TINYJAX_CACHE_DIR", str(tmp_path))
  source = "__kernel void k(__global float *restrict b) { b[get_global_id(0)] += 1.0f; }"
  before = tj.compile_cache_stats()["opencl"]
  cl.build("k", source)
  cl.build("k", source)
  after = tj.compile_cache_stats()["opencl"]
  assert after["misses"] == before["misses"] + 1 and after["hits"] == before["hits"] + 1
  assert after["compile_seconds"] > 0
  assert any(tmp_path.joinpath("opencl").rglob("*.bin"))


def test_kernel_times_are_the_devices(cl):
  """DEBUG's kernel times are the device's (the profiling queue's event of the kernel), not the host's launch and wait
  around it."""
  source = "__kernel void add_one(__global float *restrict b) { b[get_global_id(0)] += 1.0f; }"
  program = opencl.CLProgram(cl, "add_one", source, GpuLaunch(1 << 16))
  x = tj.device_put(np.zeros(1 << 16, np.float32), cl)
  start = time.perf_counter()
  seconds = program.timed([x.uop.arg.address])
  assert 0 < seconds <= time.perf_counter() - start
  assert np.asarray(cl.read(x.uop.arg)).tolist() == [1.0] * (1 << 16)
  with tj.profile() as prof:  # a profile names the platform the kernels ran on
    np.asarray(jnp.sin(x) * 2)
  assert prof.kernels and all(kernel.device == "opencl" and kernel.seconds > 0 for kernel in prof.kernels)
  assert jnp.ones(3, device=cl).device is cl and jnp.arange(3).astype(jnp.float32, device=cl).device is cl
  with pytest.raises(BufferError, match="only CPU arrays export DLPack"):
    np.from_dlpack(x)


def test_build_errors_show_the_log(cl, capsys):
  with pytest.raises(RuntimeError, match="building kernel broken .*failed"):
    cl.build("broken", "__kernel void broken(__global float *b) { b[0] = undefined_name; }")


def test_debug_prints_opencl_source():
  script = ("import numpy as np, tinyjax as tj\n"
            "x = tj.device_put(np.arange(4, dtype=np.float32), tj.devices('opencl')[0])\n"
            "print(np.asarray(x * 3 + 1))\n")
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "DEBUG": "4"})
  assert done.returncode == 0, done.stderr
  assert "--- OpenCL C of" in done.stdout and "__kernel void" in done.stdout
  assert "*** OpenCLDevice(id=0)" in done.stdout and "work-items=4" in done.stdout
  assert "[ 1.  4.  7. 10.]" in done.stdout


def test_platform_selection_and_errors(cl, monkeypatch):
  assert tj.devices("opencl")[0] is cl and cl.platform == "opencl"
  with tj.config.override("jax_platforms", "opencl"):
    assert tj.default_backend() == "opencl"
    y = jnp.arange(3.0) * 2
    assert y.device is cl and np.asarray(y).tolist() == [0.0, 2.0, 4.0]
  with pytest.raises(MemoryError, match="out of memory"):
    cl.allocate(1 << 62)
  monkeypatch.setitem(sys.modules, "pyopencl", None)  # as if pyopencl were not installed
  with pytest.raises(RuntimeError, match="pocl-opencl-icd"):
    opencl._cl()


# ---- group reductions (codegen/gpu.py): a work-group per output, partials combined in local memory

def test_row_reductions_are_group_reductions(cl):
  (kernel,) = _kernels(lambda a: a.sum(axis=1), jnp.ones((33, 1000), jnp.float32))
  assert gpu_launch(kernel.ast) == GpuLaunch(33, 256)
  source = render_opencl(kernel.name, kernel.ast)
  assert "__local double" in source and "barrier(CLK_LOCAL_MEM_FENCE)" in source
  assert "reqd_work_group_size(256" in source
  (column,) = _kernels(lambda a: a.sum(axis=0), jnp.ones((1000, 33), jnp.float32))
  assert gpu_launch(column.ast).group == 1  # work-items already read neighbouring columns
  small = _kernels(lambda a, b: a @ b, jnp.ones((8, 512), jnp.float32), jnp.ones((512, 8), jnp.float32))
  assert max(gpu_launch(kernel.ast).group for kernel in small) == 256  # 64 outputs: a group each
  large = _kernels(lambda a, b: a @ b, jnp.ones((128, 512), jnp.float32), jnp.ones((512, 128), jnp.float32))
  # (they share rows and columns: a tiled product, codegen/gpu.py GemmTile)
  assert [gpu_launch(kernel.ast).tile is not None for kernel in large] == [True]


def test_long_reductions_with_few_outputs_split_for_the_gpu(cl):
  """A column sum of 100000 x 8 was 8 work-items of 100000 strided steps each: it splits into partial sums of a
  GPU-sized chunk (split.GPU_SPLIT_MIN_CHUNK_WORK), thousands of work-items, where the CPU's chunks would not."""
  a = np.random.default_rng(5).standard_normal((100000, 8)).astype(np.float32)
  first, second = _kernels(lambda v: v.sum(axis=0), jnp.ones(a.shape, jnp.float32))
  assert gpu_launch(first.ast).work_items >= 4096 and gpu_launch(second.ast).work_items == 8
  assert len(kernels_of(schedule(tj.jit(lambda v: v.sum(axis=0)).lower(a)._compiled.jaxpr.sink, 128).kernels)) == 1
  x = tj.device_put(a, cl)
  for axis in (0, None):
    np.testing.assert_allclose(np.asarray(x.sum(axis=axis)), a.astype(np.float64).sum(axis=axis), rtol=1e-6,
                               atol=1e-4)
  np.testing.assert_allclose(np.asarray(jnp.max(x, axis=0)), a.max(axis=0))


@pytest.mark.parametrize("columns", [64, 100, 256, 1000, 4099])
def test_group_reductions_against_numpy(cl, columns):
  r = np.random.default_rng(columns)
  a = r.standard_normal((5, columns)).astype(np.float32)
  got, want = both(lambda u: (u.sum(axis=1), u.max(axis=1), u.min(axis=1), jnp.argmax(u, axis=1), (u > 0).any(axis=1),
                              (u > -3).all(axis=1), tj.nn.softmax(u), tj.nn.logsumexp(u, axis=1),
                              u.astype(jnp.float16).sum(axis=1), (u * 10).astype(jnp.int32).sum(axis=1)),
                   a, device=cl)
  a64 = a.astype(np.float64)
  np.testing.assert_allclose(got[0], a64.sum(axis=1), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(got[1], a.max(axis=1))
  np.testing.assert_array_equal(got[2], a.min(axis=1))
  np.testing.assert_array_equal(got[3], a.argmax(axis=1))
  np.testing.assert_array_equal(got[4], (a > 0).any(axis=1))
  np.testing.assert_array_equal(got[5], (a > -3).all(axis=1))
  softmax = np.exp(a64 - a64.max(axis=1, keepdims=True))
  np.testing.assert_allclose(got[6], softmax / softmax.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(got[7], np.log(np.exp(a64).sum(axis=1)), rtol=1e-6)
  np.testing.assert_allclose(got[8].astype(np.float64), a.astype(np.float16).astype(np.float64).sum(axis=1),
                             rtol=2e-3, atol=2e-2)
  np.testing.assert_array_equal(got[9], (a * 10).astype(np.int32).sum(axis=1))
  for g, w in zip(got, want):
    if g.dtype.kind in "biu": np.testing.assert_array_equal(g, w)


def test_group_reductions_under_transformations(cl):
  x = np.random.default_rng(7).standard_normal((4, 3, 300)).astype(np.float32)

  def layernorm(v):
    mean = v.mean(axis=-1, keepdims=True)
    return ((v - mean) / jnp.sqrt(((v - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)).sum()

  f = tj.jit(tj.vmap(tj.grad(layernorm)))
  got, want = both(f, x, device=cl)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  eps, x64 = 1e-6, x.astype(np.float64)

  def ln64(v):
    mean = v.mean(axis=-1, keepdims=True)
    return ((v - mean) / np.sqrt(((v - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)).sum()
  bumped = x64.copy()
  bumped[1, 2, 17] += eps
  numeric = (ln64(bumped[1]) - ln64(x64[1])) / eps
  np.testing.assert_allclose(got[1, 2, 17], numeric, atol=1e-3)


def test_complex_arrays_on_the_device(cl):
  """Complex arrays live on the device as their interleaved float pairs: programs compute them there, their results
  are complex views of the device buffers (no copy), and a view keeps its buffer's memory alive."""
  rng = np.random.default_rng(8)
  z = (rng.standard_normal((6, 6)) + 1j * rng.standard_normal((6, 6))).astype(np.complex64)
  w = (rng.standard_normal(6) + 1j * rng.standard_normal(6)).astype(np.complex64)

  def program(a, b):
    return (jnp.exp(a) * b, a @ b, jnp.abs(a).sum(axis=0), (a * b.conj()).real, jnp.fft.fft(b),
            jnp.linalg.solve(a, b), tj.grad(lambda v: jnp.abs(v @ v).sum())(b))
  got, want = both(tj.jit(program), z, w, device=cl)
  eager, _ = both(program, z, w, device=cl)
  z64, w64 = z.astype(np.complex128), w.astype(np.complex128)
  exact = (np.exp(z64) * w64, z64 @ w64, np.abs(z64).sum(axis=0), (z64 * w64.conj()).real, np.fft.fft(w64),
           np.linalg.solve(z64, w64))
  for g, e, r, x in zip(got, eager, want, exact + (None,)):
    assert g.dtype == r.dtype and g.shape == r.shape
    np.testing.assert_allclose(g, r, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(e, r, rtol=2e-5, atol=1e-5)
    if x is not None: np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-4)
  out = tj.jit(lambda a: a * 2j)(tj.device_put(w, cl))
  buffer = out.uop.arg
  assert out.dtype == np.complex64 and out.device is cl and buffer.device is cl
  assert buffer._base.dtype == np.float32 and buffer._base.shape == (6, 2) and buffer.address is buffer._base.address
  others = [tj.jit(lambda a: a + 1)(tj.device_put(np.zeros(12, np.float32), cl)) for _ in range(4)]
  np.testing.assert_array_equal(np.asarray(out), w * 2j)
  assert all(np.asarray(o).sum() == 12 for o in others)
