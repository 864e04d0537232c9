"""The CUDA device's Python side (tinyjax/devices/cuda.py) against a fake libcuda (tests/fake_libcuda.py), on machines
without a CUDA driver: device discovery, contexts per thread, memory and its pool, out-of-memory, PTX loading and its
error log, launch geometry and parameters, placement. Where a real driver is present these skip: test_gpu.py runs
every result test on the real GPU instead."""
from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax.codegen.gpu import GpuLaunch
from tinyjax.devices import cuda
from tinyjax.devices import device as device_module
from tinyjax.devices.device import CPU

from fake_libcuda import FakeLibcuda

rng = np.random.default_rng(0)


@pytest.fixture
def fake(monkeypatch, on_cpu):
  """(the fake driver, the CudaDevice on it); the CPU is the default device (the references)."""
  if cuda.device_count(): pytest.skip("a real CUDA driver is present: test_gpu.py runs on it")
  lib = FakeLibcuda(total=64 << 20)
  real_cdll, real_compile = ctypes.CDLL, cuda.compile_ptx
  monkeypatch.setattr(ctypes, "CDLL", lambda name, *args, **kwargs:
                      lib if name == "libcuda.so.1" else real_cdll(name, *args, **kwargs))

  def compile_ptx(name, llvm_ir, arch="sm_80"):
    ptx = real_compile(name, llvm_ir, arch)
    lib.record(ptx, llvm_ir)
    return ptx
  monkeypatch.setattr(cuda, "compile_ptx", compile_ptx)
  cuda.driver.cache_clear()
  cuda.cuda_devices.cache_clear()
  device = cuda.cuda_devices()[0]
  device.groups = False  # the fake runs a kernel's threads one at a time: none may wait for another
  yield lib, device
  cuda.driver.cache_clear()
  cuda.cuda_devices.cache_clear()
  device_module._default.clear()


def test_discovery(fake):
  lib, device = fake
  assert cuda.device_count() == 1 and cuda.cuda_devices() == (device,)
  assert device.device_kind == "Fake GPU" and device.compute_capability == (8, 0) and device.arch == "sm_80"
  assert device.platform == "gpu" and repr(device) == "CudaDevice(id=0)"
  assert device.memory_info() == (64 << 20, 64 << 20)


def test_a_gpu_is_the_default_device_unless_a_platform_is_named(fake, monkeypatch):
  """As JAX: without `jax_platforms` / TINYJAX_PLATFORMS / JAX_PLATFORMS the default device is the first GPU the
  driver sees; naming a platform (JAX_PLATFORMS=cpu) keeps the CPU."""
  lib, device = fake
  for name in ("TINYJAX_PLATFORMS", "JAX_PLATFORMS"): monkeypatch.delenv(name, raising=False)
  try:
    with tj.config.override("jax_platforms", None):
      device_module._default.clear()
      assert tj.default_backend() == "gpu" and device_module.default_device() is device
      assert jnp.asarray(np.ones(3, np.float32)).device is device
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    device_module._default.clear()  # (the environment is read when the default device is first looked up, as JAX's)
    with tj.config.override("jax_platforms", None):
      assert tj.default_backend() == "cpu"
    with tj.config.override("jax_platforms", "cuda"):  # (the option, unlike the environment, applies at once)
      assert tj.default_backend() == "gpu"
    assert tj.default_backend() == "cpu"
  finally:
    device_module._default.clear()


def test_results_match_the_cpu(fake):
  lib, device = fake
  a = rng.standard_normal((33, 65)).astype(np.float32)
  b = rng.standard_normal(65).astype(np.float32)
  x, y = tj.device_put(a, device), tj.device_put(b, device)
  out = jnp.exp(x) * y - jnp.tanh(x)
  assert out.device is device
  np.testing.assert_allclose(np.asarray(out), np.exp(a.astype(np.float64)) * b - np.tanh(a.astype(np.float64)),
                             rtol=2e-6, atol=2e-6)
  np.testing.assert_allclose(np.asarray(x.sum(axis=1)), a.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(x @ x.T), a.astype(np.float64) @ a.T.astype(np.float64), rtol=1e-4, atol=1e-4)

  def loss(w, v): return jnp.mean(jnp.tanh(v @ w) ** 2)
  w = rng.standard_normal((65, 7)).astype(np.float32)
  step = tj.jit(tj.vmap(tj.grad(loss), in_axes=(None, 0)))
  got = step(tj.device_put(w, device), x.reshape(3, 11, 65))
  want = step(jnp.asarray(w), jnp.asarray(a.reshape(3, 11, 65)))
  assert got.device is device and want.device is CPU
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  # every launch: blocks of BLOCK_SIZE threads at most, enough of them for the kernel's work-items
  assert lib.launches and all(block[0] <= cuda.BLOCK_SIZE and grid[1:] == (1, 1) for _, grid, block in lib.launches)
  counts = tj.jit(lambda i: jnp.zeros(5, jnp.int32).at[i].add(1))(tj.device_put(np.array([1, 3, 3, 0, 3]), device))
  np.testing.assert_array_equal(np.asarray(counts), [1, 1, 0, 3, 0])


def test_platform_selection(fake):
  lib, device = fake
  with tj.config.override("jax_platforms", "cuda"):
    assert tj.default_backend() == "gpu" and tj.devices() == [device] and tj.devices("gpu") == [device]
    x = jnp.arange(6.0)
    assert x.device is device
    np.testing.assert_array_equal(np.asarray(x * 2), np.arange(6.0) * 2)
    back = tj.device_put(x, CPU)
    assert back.device is CPU and np.asarray(back).tolist() == list(np.arange(6.0))


def test_memory_pool_and_out_of_memory(fake):
  lib, device = fake
  address = device.allocate(1 << 20)
  assert device.memory_info()[0] == (63 << 20)
  device.release(address, 1 << 20)
  assert device.allocate(1 << 20) == address  # from the pool: no new driver allocation
  with pytest.raises(MemoryError, match="out of GPU memory .*CUDA_ERROR_OUT_OF_MEMORY"):
    device.allocate(128 << 20)
  # pooled blocks go back to the driver when an allocation would not fit otherwise
  blocks = [device.allocate(8 << 20) for _ in range(6)]
  for block in blocks: device.release(block, 8 << 20)
  big = device.allocate(40 << 20)
  assert big and not device._pool and len(lib.memory) == 2
  device.release(big, 40 << 20)
  device.release(address, 1 << 20)
  device.trim_pool()
  assert not lib.memory and device.memory_info()[0] == 64 << 20


def test_buffers_and_copies(fake):
  lib, device = fake
  values = rng.standard_normal((5, 7)).astype(np.float32)
  x = tj.device_put(values, device)
  np.testing.assert_array_equal(np.asarray(x), values)
  np.testing.assert_array_equal(device.read(x.uop.arg), values)
  empty = tj.device_put(np.zeros((0, 3), np.float32), device)
  assert np.asarray(empty).shape == (0, 3)
  del x
  assert device._pool  # the buffer's memory went back to the pool


def test_a_thread_gets_the_context(fake):
  """The driver's current context is per thread: each call makes the device's current first."""
  lib, device = fake
  results = []
  worker = threading.Thread(target=lambda: results.append(np.asarray(tj.device_put(np.arange(4.0), device) + 1)))
  worker.start()
  worker.join()
  assert results and results[0].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_rejected_ptx_shows_the_log(fake):
  lib, device = fake
  rejected = r"(?s)loading kernel broken failed: CUDA_ERROR_INVALID_PTX \(218\).*ptxas fatal"  # the driver's log
  with pytest.raises(cuda.CUDAError, match=rejected):
    cuda.CUDAProgram(device, "broken", ".version 7.0\n.target sm_80\n", GpuLaunch(4))


def test_debug_times_kernels_with_events(fake, capsys, monkeypatch):
  """DEBUG>=1 prints each kernel's time as the device's events measure it (CUDAProgram.timed)."""
  lib, device = fake
  from tinyjax.lower import realize
  monkeypatch.setattr(realize, "DEBUG", 1)
  x = tj.device_put(np.arange(4096, dtype=np.float32), device)
  np.asarray(jnp.sin(x) * x)
  shown = capsys.readouterr().out
  assert "*** CudaDevice(id=0)" in shown and " us " in shown and "work-items=4096" in shown
  assert len(lib.events) == 2 and all(when is not None for when in lib.events.values())  # two events, reused
  program = next(iter(device._modules.values()))
  out = device.allocate(4096 * 4)
  assert 0 < program.timed([out, x.uop.arg.address]) < 1.0
  device.release(out, 4096 * 4)

