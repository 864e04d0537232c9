"""Devices and placement: which device an array lives on and where a computation runs.

Platforms: `cpu` (always), `cuda` (NVIDIA GPUs through the driver API, devices/cuda.py; `gpu` names the same
backend) and `opencl` (any OpenCL device through pyopencl, devices/opencl.py; PoCL runs it on the CPU). The default
device is the first device of the first platform named by `jax_platforms` (the config option,
else the environment variable TINYJAX_PLATFORMS or JAX_PLATFORMS: a comma-separated list such as "cuda,cpu") that can
be started; without one it is the first CUDA GPU when the driver sees one, else the CPU, as JAX prefers a GPU (an
OpenCL device is the default only when named: PoCL is a CPU).

Arrays made from host data go to the default device; `device_put` moves them. A computation runs on the device of its
inputs; when they disagree, on the one device other than the default that they name (an array placed there
explicitly pulls the computation, the others are copied to it, as JAX does with uncommitted arrays); two such devices
is a ValueError.
"""
from __future__ import annotations

import os
import re

from tinyjax.config import config


class CpuDevice:
  """A CPU device. There is one unless `jax_num_cpu_devices` (or TINYJAX_CPU_DEVICES) asks for more: then the host is
  split into that many virtual devices, as JAX's `--xla_force_host_platform_device_count`, so that multi-device
  programs (meshes, `shard_map`) run on one machine. They share the host's memory and its thread pool: each kernel
  runs on all the cores, whichever device it is placed on, and code compiled for one serves them all."""
  platform = "cpu"
  device_kind = "cpu"
  process_index = 0
  host_id = 0

  def __init__(self, ordinal: int = 0):
    self.id = ordinal

  def __repr__(self) -> str: return f"CpuDevice(id={self.id})"
  def __str__(self) -> str: return f"cpu:{self.id}"

  @property
  def local_hardware_id(self) -> int: return self.id - self.process_index * (_processes["local"] or 1)

  def synchronize(self) -> None:
    """Kernels on the CPU have finished when their launch returns: nothing to wait for."""


CPU = CpuDevice(0)  # the first CPU device: the default, and the one CPU programs are compiled and cached for
_cpu_devices = [CPU]  # every CpuDevice made so far, by id (kept: arrays may live on them)


def cpu_device_count() -> int:
  """How many CPU devices there are: the `jax_num_cpu_devices` option, else TINYJAX_CPU_DEVICES, else JAX's
  `--xla_force_host_platform_device_count=N` in XLA_FLAGS (what JAX programs set to get N CPU devices), else 1."""
  from tinyjax.config import config
  count = config.jax_num_cpu_devices
  if count < 0:
    forced = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    count = int(os.environ.get("TINYJAX_CPU_DEVICES") or (forced[1] if forced else 1))
  if count < 1: raise ValueError(f"the number of CPU devices must be at least 1, got {count} (jax_num_cpu_devices / "
                                 "TINYJAX_CPU_DEVICES)")
  return count


# several processes (tinyjax.distributed): this one's index, their count and how many CPU devices each has
_processes = {"index": 0, "count": 1, "local": 0}
_remote_devices: list[CpuDevice] = []  # the other processes' CPU devices (descriptions: nothing runs on them here)


def cpu_devices() -> list[CpuDevice]:
  """This process's CPU devices, CPU first (ids from process_index * their count on, with several processes)."""
  count = _processes["local"] or cpu_device_count()
  first = _processes["index"] * count
  while len(_cpu_devices) < count: _cpu_devices.append(CpuDevice(first + len(_cpu_devices)))
  return _cpu_devices[:count]


def global_cpu_devices() -> list[CpuDevice]:
  """Every process's CPU devices, by id (this process's alone without tinyjax.distributed)."""
  if _processes["count"] == 1: return cpu_devices()
  return sorted(cpu_devices() + _remote_devices, key=lambda device: device.id)


def join_processes(index: int, count: int) -> None:
  """Make this process number `index` of `count` (tinyjax.distributed.initialize): its CPU devices get the global
  ids index * L ... (L: its CPU device count, the same in every process) and the others' devices are listed."""
  local = cpu_device_count()
  _processes.update(index=index, count=count, local=local)
  for ordinal, device in enumerate(cpu_devices()):
    device.id, device.process_index = index * local + ordinal, index
  _remote_devices[:] = []
  for process in range(count):
    if process == index: continue
    for ordinal in range(local):
      device = CpuDevice(process * local + ordinal)
      device.process_index = process
      _remote_devices.append(device)


def process_index() -> int: return _processes["index"]
def process_count() -> int: return _processes["count"]


def compute_device(device):
  """The device whose compiled programs run a computation placed on `device`: CPU for every CPU device (they share
  the host), the device itself otherwise."""
  return CPU if device.platform == "cpu" else device


_ALIASES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda", "opencl": "opencl"}


def backend_devices(platform: str) -> list:
  """The devices of one platform ('cpu', 'cuda', 'gpu' or 'opencl'); RuntimeError for an unknown name, and saying
  what to install when the platform can't start."""
  name = _ALIASES.get(platform.strip().lower())
  if name is None:
    raise RuntimeError(f"Unknown backend {platform!r}. Known platforms are: cpu, cuda (alias gpu), opencl")
  if name == "cpu": return global_cpu_devices()
  if name == "cuda":
    from tinyjax.devices.cuda import cuda_devices as devices_of_platform
  else:
    from tinyjax.devices.opencl import opencl_devices as devices_of_platform
  try: found = list(devices_of_platform())
  except RuntimeError as error:  # no driver, or a driver call failed (CUDAError)
    raise RuntimeError(f"Unable to initialize backend {name!r}: {error}") from None
  if not found: raise RuntimeError(f"Unable to initialize backend {name!r}: the driver sees no device")
  return found


def _requested_platforms() -> list[str]:
  value = config.jax_platforms or os.environ.get("TINYJAX_PLATFORMS") or os.environ.get("JAX_PLATFORMS") or ""
  return [name.strip() for name in value.split(",") if name.strip()]


# [the default device] once looked up. The environment variables are read then, as JAX reads JAX_PLATFORMS when its
# backends start (reading them at each lookup cost 2 us of every eager read of constants); a change of the
# jax_platforms option clears it.
_default: list = []
config.on_change(lambda name, value: _default.clear() if name == "jax_platforms" else None)


def default_device():
  """The device arrays from the host go to and computations without inputs run on."""
  if _default: return _default[0]
  requested = _requested_platforms()
  device, errors = None, []
  for platform in requested:
    try:
      device = backend_devices(platform)[0]
      break
    except RuntimeError as error:
      errors.append(str(error))
      if _ALIASES.get(platform.strip().lower()) is None: raise
  if device is None:
    if requested: raise RuntimeError("; ".join(errors))
    device = _first_gpu() or CPU
  _default[:] = [device]
  return device


def _first_gpu():
  """The first CUDA device, or None without a driver that sees one."""
  from tinyjax.devices import cuda
  if not cuda.device_count(): return None
  try: return backend_devices("cuda")[0]
  except RuntimeError: return None


def default_backend() -> str:
  """The platform of the default device: 'cpu', 'gpu' or 'opencl'."""
  return default_device().platform


def placement_of(buffer) -> tuple:
  """(device, committed, the devices it is committed to, its sharding or None) of an input buffer, for `place`: a
  sharded buffer's devices are its mesh's."""
  sharding = getattr(buffer, "sharding", None)
  devices = frozenset(sharding.mesh.devices.flat) if sharding is not None else frozenset((buffer.device,))
  return buffer.device, getattr(buffer, "committed", False), devices, sharding


def place(placements: list) -> tuple:
  """Where a computation over inputs placed as `placements` says (`placement_of` each) runs, as JAX decides: (device,
  whether its results are committed, the sharding its unsharded results get). On the devices its committed inputs
  are committed to (all the same ones, else JAX's ValueError), its uncommitted inputs following; results over a mesh
  are replicated over it, as JAX's compiler places them. Without committed inputs: on the device they share, else on
  the one that is not the default (an array moved there), else the default device."""
  committed = [placement for placement in placements if placement[1]]
  if committed:
    first = committed[0][2]
    if any(devices != first for _, _, devices, _ in committed):
      ids = sorted({tuple(sorted(d.id for d in devices)) for _, _, devices, _ in committed})
      raise ValueError("Received incompatible devices for the computation: its inputs are committed to the devices "
                       f"with ids {ids}; device_put them onto one device or mesh first")
    mesh = next((sharding.mesh for *_, sharding in committed if sharding is not None), None)
    replicated = None
    if mesh is not None and len(first) > 1:
      from tinyjax.sharding import NamedSharding, PartitionSpec
      replicated = NamedSharding(mesh, PartitionSpec())
    return committed[0][0], True, replicated
  if not placements: return default_device(), False, None
  first = placements[0][0]
  if all(placement[0] is first for placement in placements): return first, False, None
  default = default_device()
  others = {id(placement[0]): placement[0] for placement in placements if placement[0] is not default}
  if len(others) > 1:
    raise ValueError("Received incompatible devices for the computation: its inputs live on "
                     f"{sorted(map(repr, others.values()))}; move them to one device with device_put first")
  return next(iter(others.values())), False, None


def move(buffer, device, commit: bool = False):
  """`buffer` on `device`: itself when it is there (and committed, with `commit`), else a copy (through the host;
  between CPU devices, which share the host's memory, the same memory under the other device's name)."""
  committed = commit or getattr(buffer, "committed", False)
  if buffer.device is device and (committed == getattr(buffer, "committed", False)): return buffer
  out = host_buffer(buffer.numpy(), device)
  out.committed = committed
  return out


def same_memory(device, other) -> bool:
  """Whether buffers on `device` can be read where `other`'s programs run: the same device, or two CPU devices (they
  share the host's memory)."""
  return device is other or device.platform == other.platform == "cpu"


def runnable(buffer, device):
  """`buffer` where the programs of a computation placed on `device` can read it: as it is when it is in the same
  memory (`same_memory`), else moved (`move`)."""
  return buffer if same_memory(buffer.device, device) else move(buffer, device)


def host_buffer(host, device=None):
  """A buffer holding host array `host` (C-contiguous, not to be written after) on `device` (default: the default
  device)."""
  device = default_device() if device is None else device
  if device.platform == "cpu":
    from tinyjax.devices.buffer import Buffer
    return Buffer(host.shape, host.dtype, host, device)
  return device.buffer(host.shape, host.dtype, host)
