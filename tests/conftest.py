"""Fixtures shared by the test files."""
import pytest

import tinyjax as tj


@pytest.fixture
def on_cpu():
  """Make the CPU the default device for one test that checks the CPU runtime's own behaviour (its kernel counts,
  LLVM text, direct runners, loops run inside one call), whatever default the suite runs with
  (`TINYJAX_PLATFORMS=opencl` runs the whole suite on the GPU path)."""
  with tj.config.override("jax_platforms", "cpu"):
    yield
