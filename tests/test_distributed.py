"""Several processes (tinyjax.distributed over MPI): shard_map programs run under `mpiexec -n 2` give, in every
process, the values the same programs give in one process over as many CPU devices (tests/mpi_worker.py)."""
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import tinyjax as tj

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mpiexec() -> str | None:
  beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
  return beside if os.path.exists(beside) else shutil.which("mpiexec")


def _skip_without_mpi() -> str:
  try:
    import mpi4py  # noqa: F401
  except ImportError:
    pytest.skip("mpi4py is not installed (pip install 'tinyjax[mpi]'; make test installs it)")
  mpiexec = _mpiexec()
  if mpiexec is None: pytest.skip("no mpiexec (the mpich wheel of the mpi extra provides one)")
  return mpiexec


def _run_processes(processes: int, devices_each: int, directory) -> list[dict]:
  mpiexec = _skip_without_mpi()
  env = dict(os.environ, TINYJAX_CPU_DEVICES=str(devices_each), PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  done = subprocess.run([mpiexec, "-n", str(processes), sys.executable, "-m", "tests.mpi_worker", str(directory)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
  return [json.loads((directory / f"process{number}.json").read_text()) for number in range(processes)]


@pytest.mark.parametrize("processes,devices_each", [(2, 1), (2, 2)])
def test_processes_give_the_one_process_values(processes, devices_each, tmp_path):
  outputs = _run_processes(processes, devices_each, tmp_path)
  total = processes * devices_each
  for number, output in enumerate(outputs):
    assert (output["process"], output["processes"]) == (number, processes)
    assert (output["devices"], output["local_devices"]) == (total, devices_each)
    # its own devices' shards only: devices number * devices_each + k, each holding its 4 values
    ids = [number * devices_each + k for k in range(devices_each)]
    assert output["addressable_shards"] == [[i, [4.0 * i + j for j in range(4)]] for i in ids]
  from tests.mpi_worker import run
  tj.config.update("jax_num_cpu_devices", total)
  try:
    expected = run(total)
  finally:
    tj.config.update("jax_num_cpu_devices", -1)
  for output in outputs:
    assert sorted(output["results"]) == sorted(expected)
    for name, value in expected.items():
      np.testing.assert_allclose(np.asarray(output["results"][name], dtype=np.float64),
                                 np.asarray(value, dtype=np.float64), rtol=2e-5, atol=1e-6, err_msg=name)


def test_initialize_without_mpi4py_says_what_to_install(monkeypatch):
  import builtins
  real_import = builtins.__import__

  def no_mpi(name, *args, **kwargs):
    if name.startswith("mpi4py"): raise ImportError("no mpi4py")
    return real_import(name, *args, **kwargs)
  monkeypatch.setattr(builtins, "__import__", no_mpi)
  with pytest.raises(ImportError, match=r"tinyjax\[mpi\]"):
    tj.distributed.initialize()
  assert not tj.distributed.is_initialized()


@pytest.mark.parametrize("mode", ["fail", "stuck"])
def test_a_failed_or_stuck_process_ends_the_job(mode, tmp_path):
  """A process that dies of an exception aborts the job at once (the others are waiting in a psum); one that hangs
  makes the others give up after TINYJAX_MPI_TIMEOUT_S with a message. Neither leaves the job running."""
  mpiexec = _skip_without_mpi()
  env = dict(os.environ, TINYJAX_CPU_DEVICES="1", PYTHONPATH=ROOT, TINYJAX_MPI_TIMEOUT_S="3")
  segments = set(glob.glob("/dev/shm/mpich_shm_*"))
  start = time.perf_counter()
  done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "tests.mpi_worker", str(tmp_path), mode], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=100)
  elapsed = time.perf_counter() - start
  for segment in set(glob.glob("/dev/shm/mpich_shm_*")) - segments:  # an aborted MPICH job leaves its 2 MB behind
    with contextlib.suppress(OSError): os.unlink(segment)
  assert done.returncode != 0 and elapsed < 60
  if mode == "fail":
    assert "process 1 fails on purpose" in done.stderr, done.stderr[-3000:]
  else:  # (the launcher may drop the message when the abort kills the job: then the abort's own exit status, 2)
    assert elapsed >= 3
    assert "waited 3 s for the other processes" in done.stderr or done.returncode == 2, done.stderr[-3000:]
