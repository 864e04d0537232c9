"""Fixtures shared by the test files."""
import contextlib

import pytest

import tinyjax as tj


@pytest.fixture
def on_cpu():
  """Make the CPU the default device for one test that checks the CPU runtime's own behaviour (its kernel counts,
  LLVM text, direct runners, loops run inside one call), whatever default the suite runs with
  (`TINYJAX_PLATFORMS=opencl` runs the whole suite on the GPU path)."""
  with tj.config.override("jax_platforms", "cpu"):
    yield


@pytest.fixture
def avx512_tiles(monkeypatch):
  """Size the register tiles for AVX-512 registers (32 of 64 bytes: codegen/opt.py `tile_geometry`) whatever the
  host has, for tests that state a plan's sizes for them; their kernels still run (LLVM splits vectors wider than the
  host's)."""
  with pinned_vectors(monkeypatch, 64): yield


@contextlib.contextmanager
def pinned_vectors(monkeypatch, width: int):
  """Within: TINYJAX_VECTOR_BYTES=`width` (devices/cpu.py `vector_registers`). Schedules lowered meanwhile are dropped
  from the memory cache on both sides (their disk cache key names the geometry)."""
  from tinyjax import helpers
  from tinyjax.codegen import opt
  from tinyjax.devices import cpu
  from tinyjax.lower import realize

  def forget():
    helpers.getenv.cache_clear()
    cpu.vector_registers.cache_clear()
    opt.tile_geometry.cache_clear()
    realize._memory_cache.clear()
  try:
    with monkeypatch.context() as patch:
      patch.setenv("TINYJAX_VECTOR_BYTES", str(width))
      forget()
      yield
  finally:
    forget()
