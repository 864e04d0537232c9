"""The OpenCL device: any OpenCL 1.2+ device through `pyopencl` (the optional extra `tinyjax[opencl]`), kernels as
OpenCL C (`codegen.opencl.render_opencl`).

On a machine without a GPU this runs the GPU kernel model for real on PoCL, a CPU OpenCL implementation (Debian's
`pocl-opencl-icd`): the test suite uses it to prove the GPU path. Programs are built with `codegen.opencl.
BUILD_OPTIONS`; the built binaries are cached on disk (namespace "opencl") under a key of the source, the options,
the device (platform, name, driver and OpenCL versions) and the tinyjax version, so a second process loads them
instead of building. A build that fails raises RuntimeError with the compiler's log (and prints the source at
DEBUG>=1).

Buffers live in device memory (`CLBuffer`); data moves only on `device_put`, `np.asarray` and for inputs from the host.
Kernels run in order on one in-order command queue; reading a buffer waits for the kernels before it.
"""
from __future__ import annotations

import functools
import hashlib
import threading
import time

import numpy as np

from tinyjax.codegen.gpu import GpuLaunch
from tinyjax.codegen.opencl import BUILD_OPTIONS, kernel_symbol, render_opencl
from tinyjax.devices.buffer import DeviceBuffer
from tinyjax.devices.cache import DiskCache
from tinyjax.helpers import DEBUG

TINYJAX_OPENCL_VERSION = "0.1.0"  # part of every binary's key; bump when the kernel contract changes
WORK_GROUP_SIZE = 64  # work-items per work-group of a launch (fewer for a smaller launch)
_binary_cache = DiskCache("opencl")
stats = {"hits": 0, "misses": 0, "compile_seconds": 0.0}
INSTALL_HINT = ("install an OpenCL driver (on Debian/Ubuntu, for the CPU: sudo apt-get install pocl-opencl-icd) and "
                "pyopencl (pip install 'tinyjax[opencl]')")


def _cl():
  try:
    import pyopencl
  except ImportError as error:
    raise RuntimeError(f"no OpenCL: pyopencl is not installed ({INSTALL_HINT})") from error
  return pyopencl


class OpenCLDevice:
  """One OpenCL device: its context, in-order queue, memory and the programs built for it."""
  platform = "opencl"
  language = "OpenCL C"  # what DEBUG=4 calls its kernels' source

  def __init__(self, ordinal: int, cl_device):
    cl = self.cl = _cl()
    self.id, self.cl_device = ordinal, cl_device
    self.device_kind = cl_device.name.strip()
    self.arch = (f"opencl:{cl_device.platform.name.strip()}:{self.device_kind}:{cl_device.driver_version}:"
                 f"{cl_device.version}")
    self.context = cl.Context([cl_device])
    # (profiling on: `CLProgram.timed` reads a kernel's start and end on the device from its event)
    self.queue = cl.CommandQueue(self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)
    self._programs: dict[str, CLProgram] = {}
    self._lock = threading.Lock()

  def __repr__(self) -> str: return f"OpenCLDevice(id={self.id})"

  # kernels
  groups = True  # work-items of a work-group can wait for each other (group reductions, codegen/gpu.py)
  mma = False  # no tensor-core instructions in OpenCL C (codegen/gpu.py GemmTile.mma)

  def render(self, name: str, ast, launch: GpuLaunch, ordered: int = 0) -> str:
    return render_opencl(name, ast, ordered, launch)

  def compile(self, name: str, source: str, launch: GpuLaunch) -> CLProgram:
    """The built kernel of an OpenCL C program (`render_opencl`) that runs as `launch`."""
    key = f"{name}\x00{source}"
    if (program := self._programs.get(key)) is None:
      program = self._programs[key] = CLProgram(self, name, source, launch)
    return program

  def build(self, name: str, source: str):
    """The `pyopencl.Program` of `source`, built: from the disk cache's binary, else from the source."""
    cl, options = self.cl, list(BUILD_OPTIONS)
    key = hashlib.sha256("\x00".join([source, " ".join(options), self.arch, cl.VERSION_TEXT,
                                      TINYJAX_OPENCL_VERSION]).encode()).hexdigest()
    if (binary := _binary_cache.get(key)) is not None:
      try:
        program = cl.Program(self.context, [self.cl_device], [binary]).build(options)
        stats["hits"] += 1
        return program
      except cl.Error:  # a binary this driver no longer takes: build from the source and replace it
        pass
    start = time.perf_counter()
    try:
      program = cl.Program(self.context, source).build(options, cache_dir=False)
    except cl.Error as error:
      if DEBUG >= 1: print(f"*** OpenCL C of {name} that failed to build:\n{source}")
      raise RuntimeError(f"building kernel {name} for {self.device_kind} failed:\n{error}") from None
    stats["misses"] += 1
    stats["compile_seconds"] += time.perf_counter() - start
    binaries = program.get_info(cl.program_info.BINARIES)
    if binaries and binaries[0]: _binary_cache.put(key, bytes(binaries[0]))
    return program

  # memory
  def buffer(self, shape: tuple[int, ...], dtype: np.dtype, host: np.ndarray | None = None) -> CLBuffer:
    return CLBuffer(shape, dtype, self, host)

  def allocate(self, nbytes: int):
    cl = self.cl
    try: return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))  # OpenCL has no empty buffers
    except cl.Error as error:
      if error.code in (cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_RESOURCES,
                        cl.status_code.OUT_OF_HOST_MEMORY, cl.status_code.INVALID_BUFFER_SIZE):
        raise MemoryError(f"allocating {nbytes} bytes: out of memory on {self.device_kind} ({error})") from None
      raise

  def upload(self, buffer, host: np.ndarray) -> None:
    if host.nbytes: self.cl.enqueue_copy(self.queue, buffer, host, is_blocking=True)

  def read(self, buffer: CLBuffer) -> np.ndarray:
    """A fresh host copy of `buffer` (waits for the kernels queued before)."""
    host = np.empty(buffer.shape, buffer.dtype)
    if host.nbytes: self.cl.enqueue_copy(self.queue, host, buffer.address, is_blocking=True)
    return host

  def synchronize(self) -> None:
    self.queue.finish()


class CLProgram:
  """A kernel built for a device; call it with its buffers' `cl.Buffer`s (their `address`)."""

  def __init__(self, device: OpenCLDevice, name: str, source: str, launch: GpuLaunch):
    self.device, self.name, self.src, self.launch = device, name, source, launch
    self.work_items = work_items = launch.work_items
    self.kernel = device.cl.Kernel(device.build(name, source), kernel_symbol(name))
    if launch.group > 1: self.local_size = launch.group
    else: self.local_size = min(WORK_GROUP_SIZE, 1 << max(0, work_items - 1).bit_length())
    self.global_size = -(-work_items // self.local_size) * self.local_size
    self._enqueue = device.cl.enqueue_nd_range_kernel

  def __call__(self, buffers: list):
    """Queue the kernel over `buffers` (asynchronously); its event."""
    if self.work_items == 0: return None
    with self.device._lock:
      if buffers: self.kernel.set_args(*buffers)
      return self._enqueue(self.device.queue, self.kernel, (self.global_size,), (self.local_size,))

  def timed(self, buffers: list) -> float:
    """Run the kernel over `buffers` and wait for it; the seconds it ran on the device (its event's profile: the
    time between its start and end, not the launch's cost on the host), for DEBUG and profiles."""
    if self.work_items == 0: return 0.0
    event = self(buffers)
    event.wait()
    return (event.profile.end - event.profile.start) * 1e-9


class CLBuffer(DeviceBuffer):
  """An array's storage in an OpenCL device's memory (`address`: its `cl.Buffer`, released when the last kernel
  queued over it has finished)."""
  __slots__ = ()


@functools.cache
def opencl_devices() -> tuple[OpenCLDevice, ...]:
  """The OpenCL devices of every platform, GPUs first (RuntimeError without pyopencl or an OpenCL platform)."""
  cl = _cl()
  try: platforms = cl.get_platforms()
  except cl.Error as error:  # e.g. the ICD loader finds no platform
    raise RuntimeError(f"no OpenCL platform ({error}): {INSTALL_HINT}") from None
  found = [device for platform in platforms for device in platform.get_devices()]
  found.sort(key=lambda device: not device.type & cl.device_type.GPU)
  if not found: raise RuntimeError(f"no OpenCL device: {INSTALL_HINT}")
  return tuple(OpenCLDevice(i, device) for i, device in enumerate(found))


def device_count() -> int:
  """How many OpenCL devices there are (0 without pyopencl or a platform)."""
  try: return len(opencl_devices())
  except RuntimeError: return 0
