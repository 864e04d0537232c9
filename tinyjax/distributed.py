"""Several processes, as `jax.distributed`: `initialize()` joins the processes an MPI launcher started
(`mpirun -n 2 python train.py`), through mpi4py (`pip install 'tinyjax[mpi]'`: mpi4py and the MPICH wheel), or,
with JAX's `initialize(coordinator_address, num_processes, process_id)`, processes started by hand, over TCP
(tinyjax/tcp_comm.py: no MPI needed).

Each process owns its CPU devices (TINYJAX_CPU_DEVICES of them, the same number in every process); `devices()` lists
every process's, `local_devices()` this one's, and a mesh (`make_mesh`) spans them all. `shard_map` over such a mesh
runs in every process on its own devices' shards: each process takes its blocks of the (replicated) arguments, and a
collective over a mesh axis that spans processes combines the local shards' values in the compiled program, then the
processes' values through MPI (a host step: an all-reduce for psum / pmean / pmax / pmin, an all-gather of the
shards for all_gather, psum_scatter, ppermute and all_to_all, as tagged point-to-point messages: see ProcessGroup).
Outputs whose spec names such an axis are gathered from every process, so every process ends with the whole value
(JAX would return an array whose other shards live in the other processes). A process that dies of an exception
aborts the job; one that hangs makes the others give up after TINYJAX_MPI_TIMEOUT_S seconds.
"""
from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from tinyjax.devices import device as _device

__all__ = ["initialize", "is_initialized", "shutdown"]

_state: dict[str, Any] = {"comm": None}


def _mpi():
  try:
    from mpi4py import MPI
  except ImportError:
    raise ImportError("tinyjax.distributed needs mpi4py and an MPI library: pip install 'tinyjax[mpi]' (mpi4py and "
                      "the mpich wheel), then start the processes with mpirun -n N python ...") from None
  return MPI


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: Any = None, **kwargs: Any) -> None:
  """Join the processes of this job, as JAX's: with `coordinator_address` ('host:port', where process 0 listens),
  `num_processes` and `process_id`, the processes were started by hand and meet over TCP (tinyjax/tcp_comm.py);
  without, an MPI launcher started them (`mpirun -n 2 python ...`, mpi4py: `num_processes` / `process_id`, if
  given, must be what MPI says). Call it once, first, in every process. RuntimeError when called twice; ImportError
  saying what to install without mpi4py."""
  if _state["comm"] is not None: raise RuntimeError("tinyjax.distributed.initialize should only be called once.")
  if coordinator_address is not None:
    if num_processes is None or process_id is None:
      raise ValueError("initialize(coordinator_address=...) needs num_processes and process_id (started by hand, "
                       "the processes do not know them otherwise)")
    from tinyjax import tcp_comm
    comm, shared = tcp_comm.connect(coordinator_address, int(num_processes), int(process_id)), tcp_comm.COMM_TYPE_SHARED
  else:
    MPI = _mpi()
    comm, shared = MPI.COMM_WORLD, MPI.COMM_TYPE_SHARED
  rank, size = comm.Get_rank(), comm.Get_size()
  if num_processes is not None and num_processes != size:
    raise ValueError(f"initialize(num_processes={num_processes}), but MPI started {size} processes")
  if process_id is not None and process_id != rank:
    raise ValueError(f"initialize(process_id={process_id}), but MPI numbers this process {rank}")
  counts = comm.allgather(_device.cpu_device_count())
  if len(set(counts)) != 1:
    raise ValueError(f"every process needs the same number of CPU devices (TINYJAX_CPU_DEVICES), got {counts}")
  _state["comm"] = comm
  _device.join_processes(rank, size)
  _share_cores(comm, shared)
  _abort_on_uncaught_errors(comm)


def _abort_on_uncaught_errors(comm: Any) -> None:
  """A process that dies of an exception takes the job down (MPI Abort) after printing it, instead of leaving the
  others waiting in a collective forever."""
  import sys
  previous = sys.excepthook

  def hook(kind, value, traceback) -> None:
    previous(kind, value, traceback)
    sys.stderr.flush()
    comm.Abort(1)
  sys.excepthook = hook


def _share_cores(comm: Any, shared: Any) -> None:
  """Processes on one machine share its cores: unless TINYJAX_CPU_THREADS says otherwise, each runs its kernels on
  cores / (its processes there) threads (2 processes on 2 cores each with 2 threads: the MLP step 9.2 -> 7.3 ms).
  Only before the runtime has started (its threads are made on the first parallel launch)."""
  import os

  from tinyjax.devices import cpu
  from tinyjax.helpers import getenv
  if os.environ.get("TINYJAX_CPU_THREADS") or cpu._runtime is not None: return
  here = comm.Split_type(shared).Get_size()
  os.environ["TINYJAX_CPU_THREADS"] = str(max(1, cpu._cpu_count() // here))
  getenv.cache_clear()


def is_initialized() -> bool: return _state["comm"] is not None


def gather_objects(value: Any) -> list:
  """Every process's `value` (picklable), in process order (the process's own included)."""
  comm = _state["comm"]
  _wait(comm.Ibarrier(), "gathering data from every process")
  return comm.allgather(value)


def shutdown() -> None:
  """Leave the job: a barrier with the other processes (MPI itself finalizes at exit)."""
  if _state["comm"] is not None: _state["comm"].Barrier()


# ---- what shard_map uses

# how long a collective waits for the other processes before the job is aborted with a message (seconds)
TIMEOUT_S = float(__import__("os").environ.get("TINYJAX_MPI_TIMEOUT_S", "600"))
SPIN_S = 0.05  # polled without sleeping this long: a collective's usual wait is microseconds


def _wait(request: Any, what: str) -> None:
  """Wait for a non-blocking MPI operation, at most TIMEOUT_S; then say so and abort the job (a peer that died or
  hangs would otherwise block this process forever)."""
  import time
  start = time.perf_counter()
  idle = getattr(request, "idle", None)  # (over TCP: block until a message comes in, not spin)
  while True:
    try:
      if request.Test(): return
    except RuntimeError as error:  # (over TCP: a peer's connection closed, it exited or aborted)
      import sys
      print(f"{error}; {what} cannot finish: aborting", file=sys.stderr, flush=True)
      _state["comm"].Abort(2)
    waited = time.perf_counter() - start
    if waited > TIMEOUT_S:
      import sys
      print(f"tinyjax.distributed: {what} waited {TIMEOUT_S:.0f} s for the other processes (TINYJAX_MPI_TIMEOUT_S); "
            "one of them died or is stuck: aborting the job", file=sys.stderr, flush=True)
      time.sleep(0.5)  # (for the launcher to forward the message before the abort kills the job)
      _state["comm"].Abort(2)
    if idle is not None: idle(0.01)
    elif waited > SPIN_S: time.sleep(0.001)  # (a peer far behind: stop burning a core on it)


class ProcessGroup:
  """The processes that hold the other positions along one mesh axis (those whose devices share this process's
  coordinates on the other axes): an MPI sub-communicator, ordered along the axis. `offset` is this process's first
  position along the axis, `size` the axis's whole length.

  Its exchanges are point-to-point messages tagged with the collective's number (`next_tag`, given when the program
  is traced, in the same order in every process), not MPI collectives, which must be called in the same order
  everywhere: the compiled programs of two processes differ (each slices its own blocks), and so may the order in
  which they run independent host steps. Every process combines the values in process order: the same bits."""

  def __init__(self, comm: Any, offset: int, size: int, name: str):
    self.comm, self.offset, self.size, self.name = comm, offset, size, name

  def _exchange(self, value: np.ndarray, tag: int, what: str) -> list[np.ndarray]:
    """Every process's `value` (the same shape in all), in process order."""
    value = np.asarray(value, order="C")  # (ascontiguousarray would make a scalar 1-D)
    me, count = self.comm.Get_rank(), self.comm.Get_size()
    received = {rank: np.empty_like(value) for rank in range(count) if rank != me}
    requests = [self.comm.Isend(value, dest=rank, tag=tag) for rank in received]
    requests += [self.comm.Irecv(buffer, source=rank, tag=tag) for rank, buffer in received.items()]
    for request in requests: _wait(request, f"{what} over mesh axis {self.name!r}")
    return [value if rank == me else received[rank] for rank in range(count)]

  def allreduce(self, value: np.ndarray, op: str, tag: int) -> np.ndarray:
    combine = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    parts = self._exchange(value, tag, "an allreduce")
    total = parts[0].copy()
    for part in parts[1:]: combine(total, part, out=total)
    return total

  def allgather(self, value: np.ndarray, tag: int) -> np.ndarray:
    """Every process's `value` stacked along axis 0 in the order of their positions (each the same shape)."""
    parts = self._exchange(value, tag, "an allgather")
    return np.concatenate(parts) if value.ndim else np.stack(parts)


_tags = [0]


def next_tag() -> int:
  """The message tag of the next cross-process collective traced (MPI guarantees tags up to 32767)."""
  _tags[0] = (_tags[0] + 1) % 32768
  return _tags[0]


_groups: dict[tuple, ProcessGroup] = {}



def process_group(mesh: Any, axis: str, local_block: dict[str, tuple[int, int]]) -> ProcessGroup:
  """The ProcessGroup of mesh axis `axis` for this process, whose devices are the block `local_block` ({axis name:
  (start, stop)}) of the mesh. Made once per mesh axis (MPI's Comm_split is collective: every process calls it)."""
  key = (id(mesh), axis, tuple(sorted(local_block.items())))
  if key not in _groups:
    others = tuple((name, bounds) for name, bounds in sorted(local_block.items()) if name != axis)
    color = zlib.crc32(repr(others).encode()) & 0x7FFFFFFF
    world = _state["comm"]
    _wait(world.Ibarrier(), f"setting up mesh axis {axis!r}")  # (Split blocks: first make sure everyone is here)
    comm = world.Split(color, local_block[axis][0])
    _groups[key] = ProcessGroup(comm, local_block[axis][0], mesh.shape[axis], axis)
  return _groups[key]
