"""Several processes (tinyjax.distributed over MPI): shard_map programs run under `mpiexec -n 2` give, in every
process, the values the same programs give in one process over as many CPU devices (tests/mpi_worker.py)."""
import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import tinyjax as tj

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# several processes share CPU devices only (no GPU meshes yet): these run on the CPU, here and in the processes they
# start, whatever the suite's default device
pytestmark = pytest.mark.usefixtures("on_cpu")


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


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]


def _start(launcher: str, processes: int, env: dict, args: list[str], timeout: float) -> tuple[int, str, str]:
  """Run `python -m tests.mpi_worker *args` in `processes` processes: under mpiexec, or started here one by one and
  joined over TCP through a coordinator address (tinyjax.distributed.initialize's JAX signature). Returns the job's
  exit status (the first failing process's), stdout and stderr (all processes')."""
  command = [sys.executable, "-m", "tests.mpi_worker", *args]
  if launcher == "mpi":
    done = subprocess.run([_skip_without_mpi(), "-n", str(processes), *command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr
  port = _free_port()
  jobs = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(env, TINYJAX_TEST_COORDINATOR=f"127.0.0.1:{port} {processes} {rank}"))
          for rank in range(processes)]
  outputs = [job.communicate(timeout=timeout) for job in jobs]
  codes = [job.returncode for job in jobs]
  return next((code for code in codes if code), 0), "".join(o for o, _ in outputs), "".join(e for _, e in outputs)


def _run_processes(processes: int, devices_each: int, directory, launcher: str = "mpi") -> list[dict]:
  # (on the CPU whatever the suite's default device: several processes share CPU devices only, no GPU meshes yet)
  env = dict(os.environ, TINYJAX_CPU_DEVICES=str(devices_each), PYTHONPATH=ROOT, TINYJAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  code, out, err = _start(launcher, processes, env, [str(directory)], 300)
  assert code == 0, out[-2000:] + err[-4000:]
  return [json.loads((directory / f"process{number}.json").read_text()) for number in range(processes)]


@pytest.mark.parametrize("processes,devices_each,launcher", [(2, 1, "mpi"), (2, 2, "mpi"), (2, 1, "tcp"),
                                                             (3, 1, "tcp")])
def test_processes_give_the_one_process_values(processes, devices_each, launcher, tmp_path):
  outputs = _run_processes(processes, devices_each, tmp_path, launcher)
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


@pytest.mark.parametrize("launcher", ["mpi", "tcp"])
@pytest.mark.parametrize("mode", ["fail", "stuck"])
def test_a_failed_or_stuck_process_ends_the_job(mode, launcher, tmp_path):
  """A process that dies of an exception aborts the job at once (the others are waiting in a psum; over TCP they see
  its connection close); one that hangs makes the others give up after TINYJAX_MPI_TIMEOUT_S with a message. Neither
  leaves the job running."""
  env = dict(os.environ, TINYJAX_CPU_DEVICES="1", PYTHONPATH=ROOT, TINYJAX_MPI_TIMEOUT_S="3", TINYJAX_PLATFORMS="cpu")
  segments = set(glob.glob("/dev/shm/mpich_shm_*"))
  start = time.perf_counter()
  code, _, err = _start(launcher, 2, env, [str(tmp_path), mode], 100)
  elapsed = time.perf_counter() - start
  for segment in set(glob.glob("/dev/shm/mpich_shm_*")) - segments:  # an aborted MPICH job leaves its 2 MB behind
    with contextlib.suppress(OSError): os.unlink(segment)
  assert code != 0 and elapsed < 60
  if mode == "fail":
    assert "process 1 fails on purpose" in err, err[-3000:]
  else:  # (the launcher may drop the message when the abort kills the job: then the abort's own exit status, 2)
    assert elapsed >= 3
    assert "waited 3 s for the other processes" in err or code == 2, err[-3000:]
