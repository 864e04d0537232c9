"""Several processes, as `jax.distributed`: `initialize()` joins the processes an MPI launcher started
(`mpirun -n 2 python train.py`), through mpi4py (`pip install 'tinyjax[mpi]'`: mpi4py and the MPICH wheel).

Each process owns its CPU devices (TINYJAX_CPU_DEVICES of them, the same number in every process); `devices()` lists
every process's, `local_devices()` this one's, and a mesh (`make_mesh`) spans them all. `shard_map` over such a mesh
runs in every process on its own devices' shards: each process takes its blocks of the (replicated) arguments, and a
collective over a mesh axis that spans processes combines the local shards' values in the compiled program, then the
processes' values through MPI (a host step: Allreduce for psum / pmean / pmax / pmin, Allgather of the shards for
all_gather, psum_scatter, ppermute and all_to_all). Outputs whose spec names such an axis are gathered from every
process, so every process ends with the whole value (JAX would return an array whose other shards live in the other
processes).
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
  """Join the processes of this MPI job (JAX's signature: `coordinator_address` is not needed with MPI, which knows
  its processes; `num_processes` / `process_id`, if given, must be what MPI says). Call it once, first, in every
  process. RuntimeError when called twice; ImportError saying what to install without mpi4py."""
  if _state["comm"] is not None: raise RuntimeError("tinyjax.distributed.initialize should only be called once.")
  MPI = _mpi()
  comm = MPI.COMM_WORLD
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
  _share_cores(comm, MPI)


def _share_cores(comm: Any, MPI: Any) -> None:
  """Processes on one machine share its cores: unless TINYJAX_CPU_THREADS says otherwise, each runs its kernels on
  cores / (its processes there) threads (2 processes on 2 cores each with 2 threads: the MLP step 9.2 -> 7.3 ms).
  Only before the runtime has started (its threads are made on the first parallel launch)."""
  import os

  from tinyjax.devices import cpu
  from tinyjax.helpers import getenv
  if os.environ.get("TINYJAX_CPU_THREADS") or cpu._runtime is not None: return
  here = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
  os.environ["TINYJAX_CPU_THREADS"] = str(max(1, cpu._cpu_count() // here))
  getenv.cache_clear()


def is_initialized() -> bool: return _state["comm"] is not None


def shutdown() -> None:
  """Leave the job: a barrier with the other processes (MPI itself finalizes at exit)."""
  if _state["comm"] is not None: _state["comm"].Barrier()


# ---- what shard_map uses

class ProcessGroup:
  """The processes that hold the other positions along one mesh axis (those whose devices share this process's
  coordinates on the other axes): an MPI sub-communicator, ordered along the axis. `offset` is this process's first
  position along the axis, `size` the axis's whole length."""

  def __init__(self, comm: Any, offset: int, size: int, name: str):
    self.comm, self.offset, self.size, self.name = comm, offset, size, name

  def allreduce(self, value: np.ndarray, op: str) -> np.ndarray:
    MPI = _mpi()
    out = np.empty_like(value)
    self.comm.Allreduce(np.ascontiguousarray(value), out, op={"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op])
    return out

  def allgather(self, value: np.ndarray) -> np.ndarray:
    """Every process's `value` stacked along axis 0 in the order of their positions (each the same shape)."""
    value = np.ascontiguousarray(value)
    out = np.empty((self.comm.Get_size(), *value.shape), value.dtype)
    self.comm.Allgather(value, out)
    return out.reshape((-1, *value.shape[1:])) if value.ndim else out


_groups: dict[tuple, ProcessGroup] = {}


def process_group(mesh: Any, axis: str, local_block: dict[str, tuple[int, int]]) -> ProcessGroup:
  """The ProcessGroup of mesh axis `axis` for this process, whose devices are the block `local_block` ({axis name:
  (start, stop)}) of the mesh. Made once per mesh axis (MPI's Comm_split is collective: every process calls it)."""
  key = (id(mesh), axis, tuple(sorted(local_block.items())))
  if key not in _groups:
    others = tuple((name, bounds) for name, bounds in sorted(local_block.items()) if name != axis)
    color = zlib.crc32(repr(others).encode()) & 0x7FFFFFFF
    comm = _state["comm"].Split(color, local_block[axis][0])
    _groups[key] = ProcessGroup(comm, local_block[axis][0], mesh.shape[axis], axis)
  return _groups[key]
