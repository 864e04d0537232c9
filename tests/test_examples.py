"""The training examples run end to end (on the built-in synthetic task, a few hundred examples, one epoch) and
learn something; a checkpoint they write loads back."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, *flags: str) -> str:
  result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), "--synthetic", "--epochs", "1",
                           *flags], capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.mark.parametrize("name", ["mlp.py", "cnn.py"])
def test_training_examples(name, tmp_path):
  checkpoint = tmp_path / "model.safetensors"
  out = run_example(name, "--limit", "1024", "--batch_size", "64", "--lr", "3e-3", "--checkpoint", str(checkpoint))
  accuracy = float(re.search(r"test acc ([0-9.]+)", out).group(1))
  assert accuracy > 0.3, out  # ten classes: chance is 0.1
  from tinyjax.nn import state
  flat = state.load(checkpoint)
  assert any(key.startswith("params/") for key in flat) and any(key.startswith("opt_state/") for key in flat)


def test_dp_sgd_example():
  out = run_example("dp_sgd.py", "--limit", "512", "--batch_size", "64")
  assert re.search(r"test accuracy [0-9.]+", out), out


def test_data_parallel_example_equals_one_device(on_cpu):
  """Training with the batch sharded over 2 CPU devices (shard_map + pmean) ends with the one-device parameters."""
  env = dict(os.environ, TINYJAX_CPU_DEVICES="2", TINYJAX_PLATFORMS="cpu")  # a mesh of 2 CPU devices
  result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "data_parallel.py"), "--steps", "8",
                           "--batch", "64"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "2 devices on the data axis (1 process)" in result.stdout, result.stdout
  difference = float(re.search(r"largest parameter difference from one-device training: (\S+)", result.stdout)[1])
  assert difference < 1e-5, result.stdout
  losses = re.search(r"loss (\S+) -> (\S+)", result.stdout)
  assert float(losses[2]) < float(losses[1]), result.stdout


def test_data_parallel_example_over_two_processes(tmp_path, on_cpu):
  """The same training over `mpiexec -n 2` (tinyjax.distributed over MPI, one CPU device per process), with a compile
  cache of its own."""
  try:
    import mpi4py  # noqa: F401
  except ImportError:
    pytest.skip("mpi4py is not installed (pip install 'tinyjax[mpi]'; make test installs it)")
  mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
  if not os.path.exists(mpiexec): pytest.skip("no mpiexec beside the Python (the mpich wheel of the mpi extra)")
  env = {key: value for key, value in os.environ.items() if key not in ("TINYJAX_CPU_DEVICES", "XLA_FLAGS")}
  env["TINYJAX_CACHE_DIR"], env["TINYJAX_PLATFORMS"] = str(tmp_path), "cpu"  # (processes share CPU devices only)
  result = subprocess.run([mpiexec, "-n", "2", sys.executable, os.path.join(ROOT, "examples", "data_parallel.py"),
                           "--steps", "8", "--batch", "64"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "2 devices on the data axis (2 processes)" in result.stdout, result.stdout
  losses = re.search(r"loss (\S+) -> (\S+)", result.stdout)
  assert float(losses[2]) < float(losses[1]), result.stdout
  # (it once ended 1.35e-2 away, now and then: lower/schedule.py explored kernels in the nodes' address order and
  # skipped its shared-contraction pass in some orders; tests/test_lower.py has both cases)
  difference = float(re.search(r"largest parameter difference from one-device training: (\S+)", result.stdout)[1])
  assert difference < 1e-5, result.stdout
