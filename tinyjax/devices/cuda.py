"""The CUDA device: NVIDIA GPUs through the CUDA driver API (`libcuda`, by ctypes: no CUDA toolkit at run time).

Kernels are rendered for NVPTX (`codegen.llvm.render_gpu`), compiled to PTX by llvmlite's LLVM for the device's
architecture (`sm_XY` from its compute capability, capped at what LLVM knows), and the PTX is loaded by the driver,
which assembles it for the GPU (`cuModuleLoadDataEx`, its error log shown when that fails). PTX is cached on disk
(namespace "ptx") under a key of the IR, the architecture and the LLVM and tinyjax versions, like the CPU's object
code; the driver keeps its own cache of what it assembled.

Buffers live in device memory (`CUDABuffer`): data moves only when an array comes from the host or goes back to it
(`device_put`, `np.asarray`). A buffer's host copy, once read, is kept: buffers are immutable once computed.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import sys
import threading
import time

import llvmlite
import llvmlite.binding as llvm
import numpy as np

from tinyjax.devices.buffer import DeviceBuffer
from tinyjax.devices.cache import DiskCache
from tinyjax.helpers import DEBUG

TINYJAX_PTX_VERSION = "0.1.0"  # part of every PTX key; bump when the GPU kernel contract changes
BLOCK_SIZE = 256  # work-items per block of a launch
_ptx_cache = DiskCache("ptx")
_lock = threading.RLock()
stats = {"hits": 0, "misses": 0, "compile_seconds": 0.0}


class CUDAError(RuntimeError):
  """A CUDA driver call failed (its error name and message are in the text)."""


class _Driver:
  """libcuda's entry points, checked: each call raises CUDAError with the driver's own name for a failure."""

  def __init__(self):
    try: self.lib = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
      raise RuntimeError("no CUDA driver: libcuda.so.1 could not be loaded (install the NVIDIA driver, or choose "
                         "another platform with TINYJAX_PLATFORMS=cpu)") from error
    self.check(self.lib.cuInit(0), "cuInit")

  def error_text(self, result: int) -> str:
    name, message = ctypes.c_char_p(), ctypes.c_char_p()
    self.lib.cuGetErrorName(result, ctypes.byref(name))
    self.lib.cuGetErrorString(result, ctypes.byref(message))
    return f"{(name.value or b'CUDA_ERROR').decode()} ({result}): {(message.value or b'unknown error').decode()}"

  def check(self, result: int, what: str) -> None:
    if result != 0:
      if result == 2: raise MemoryError(f"{what}: out of GPU memory ({self.error_text(result)})")
      raise CUDAError(f"{what} failed: {self.error_text(result)}")

  def __call__(self, function: str, *args) -> None:
    self.check(getattr(self.lib, function)(*args), function)


@functools.cache
def driver() -> _Driver:
  return _Driver()


def device_count() -> int:
  """How many CUDA devices the driver sees (0 without a driver)."""
  try: lib = driver()
  except (RuntimeError, CUDAError): return 0
  count = ctypes.c_int()
  lib("cuDeviceGetCount", ctypes.byref(count))
  return count.value


# ---- compiling

@functools.cache
def _nvptx_target_machine(arch: str) -> llvm.TargetMachine:
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()
  target = llvm.Target.from_triple("nvptx64-nvidia-cuda")
  return target.create_target_machine(cpu=arch, opt=3)


def ptx_architecture(major: int, minor: int) -> str:
  """The `sm_XY` LLVM generates PTX for, for a device of compute capability major.minor: the device's own where
  LLVM knows it, else sm_80 (PTX for an older architecture runs on newer GPUs: the driver assembles it)."""
  arch = f"sm_{major}{minor}"
  known = ("sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87",
           "sm_89", "sm_90")
  return arch if arch in known else "sm_90" if (major, minor) > (9, 0) else "sm_80"


def compile_ptx(name: str, llvm_ir: str, arch: str = "sm_80") -> str:
  """PTX for an NVPTX module (`render_gpu`), optimised at O3 for `arch`; from the disk cache when it was made
  before."""
  key = hashlib.sha256("\x00".join([name, llvm_ir, arch, ".".join(map(str, llvm.llvm_version_info)),
                                    llvmlite.__version__, TINYJAX_PTX_VERSION]).encode()).hexdigest()
  if (cached := _ptx_cache.get(key)) is not None:
    stats["hits"] += 1
    return cached.decode()
  start = time.perf_counter()
  with _lock:
    machine = _nvptx_target_machine(arch)
    module = llvm.parse_assembly(llvm_ir)
    module.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(machine, tuning)
    builder.getModulePassManager().run(module, builder)
    ptx = machine.emit_assembly(module)
  stats["misses"] += 1
  stats["compile_seconds"] += time.perf_counter() - start
  _ptx_cache.put(key, ptx.encode())
  return ptx


# ---- the device

class CudaDevice:
  """One NVIDIA GPU: its primary context, memory, and the kernels loaded on it. `platform` is 'gpu' as in JAX."""
  platform = "gpu"

  def __init__(self, ordinal: int):
    self.id = ordinal
    lib = self.lib = driver()
    handle = ctypes.c_int()
    lib("cuDeviceGet", ctypes.byref(handle), ordinal)
    self.handle = handle.value
    name = ctypes.create_string_buffer(256)
    lib("cuDeviceGetName", name, 256, self.handle)
    self.device_kind = name.value.decode()
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib("cuDeviceGetAttribute", ctypes.byref(major), 75, self.handle)  # COMPUTE_CAPABILITY_MAJOR
    lib("cuDeviceGetAttribute", ctypes.byref(minor), 76, self.handle)
    self.compute_capability = (major.value, minor.value)
    self.arch = ptx_architecture(major.value, minor.value)
    # tensor cores with mma.sync's float16 / bfloat16 m16n8k16 (codegen/gpu.py GemmTile.mma): sm_80 and later
    self.mma = self.compute_capability >= (8, 0)
    context = ctypes.c_void_p()
    lib("cuDevicePrimaryCtxRetain", ctypes.byref(context), self.handle)
    self.context = context
    self._modules: dict[str, CUDAProgram] = {}
    self._pool: dict[int, list[int]] = {}  # nbytes -> free allocations
    self._events: tuple | None = None

  def __repr__(self) -> str: return f"CudaDevice(id={self.id})"

  def activate(self) -> None:
    """Make this device's context current on the calling thread (the driver's current context is per thread)."""
    self.lib("cuCtxSetCurrent", self.context)

  # memory
  def buffer(self, shape: tuple[int, ...], dtype: np.dtype, host: np.ndarray | None = None) -> CUDABuffer:
    return CUDABuffer(shape, dtype, self, host)

  def allocate(self, nbytes: int) -> int:
    if nbytes == 0: return 0
    if (free := self._pool.get(nbytes)): return free.pop()
    self.activate()
    pointer = ctypes.c_uint64()
    try: self.lib("cuMemAlloc_v2", ctypes.byref(pointer), nbytes)
    except MemoryError:  # give the pool back and try once more
      self.trim_pool()
      self.lib("cuMemAlloc_v2", ctypes.byref(pointer), nbytes)
    return pointer.value

  def release(self, address: int, nbytes: int) -> None:
    if address: self._pool.setdefault(nbytes, []).append(address)

  def trim_pool(self) -> None:
    self.activate()
    for addresses in self._pool.values():
      for address in addresses: self.lib("cuMemFree_v2", ctypes.c_uint64(address))
    self._pool.clear()

  def upload(self, address: int, host: np.ndarray) -> None:
    if host.nbytes:
      self.activate()
      self.lib("cuMemcpyHtoD_v2", ctypes.c_uint64(address), ctypes.c_void_p(host.ctypes.data), host.nbytes)

  def download(self, host: np.ndarray, address: int) -> None:
    if host.nbytes:
      self.activate()
      self.lib("cuMemcpyDtoH_v2", ctypes.c_void_p(host.ctypes.data), ctypes.c_uint64(address), host.nbytes)

  def read(self, buffer: CUDABuffer) -> np.ndarray:
    """A fresh host copy of `buffer` (not its kept one)."""
    host = np.empty(buffer.shape, buffer.dtype)
    self.download(host, buffer.address)
    return host

  def synchronize(self) -> None:
    self.activate()
    self.lib("cuCtxSynchronize")

  def events(self) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
    """Two CUDA events of this device, made once, to time a kernel between (`CUDAProgram.timed`)."""
    if self._events is None:
      self.activate()
      made = (ctypes.c_void_p(), ctypes.c_void_p())
      for event in made: self.lib("cuEventCreate", ctypes.byref(event), 0)  # CU_EVENT_DEFAULT: with timing
      self._events = made
    return self._events

  def memory_info(self) -> tuple[int, int]:
    """(free, total) bytes of device memory."""
    self.activate()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    self.lib("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value

  # kernels
  groups = True  # threads of a block can wait for each other (group reductions, codegen/gpu.py)

  def render(self, name: str, ast, launch, ordered: int = 0) -> str:
    """The NVPTX module (LLVM IR) of a kernel AST."""
    from tinyjax.codegen.llvm import render_gpu
    return render_gpu(name, ast, ordered, launch)

  def compile(self, name: str, llvm_ir: str, launch) -> CUDAProgram:
    """The loaded kernel of an NVPTX module (`render_gpu`) that runs `work_items` work-items."""
    key = f"{name}\x00{llvm_ir}"
    if (program := self._modules.get(key)) is None:
      program = self._modules[key] = CUDAProgram(self, name, compile_ptx(name, llvm_ir, self.arch), launch)
    return program


class CUDAProgram:
  """A kernel loaded on a device; call it with the device addresses of its buffers."""

  def __init__(self, device: CudaDevice, name: str, ptx: str, launch):
    self.device, self.name, self.src, self.launch = device, name, ptx, launch
    self.work_items = work_items = launch.work_items
    device.activate()
    log = ctypes.create_string_buffer(1 << 14)
    options = (ctypes.c_int * 2)(5, 6)  # CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
    values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
    module = ctypes.c_void_p()
    result = device.lib.lib.cuModuleLoadDataEx(ctypes.byref(module), ctypes.c_char_p(ptx.encode()), 2, options, values)
    if result != 0:
      if DEBUG >= 1: print(f"*** PTX of {name} that the driver rejected:\n{ptx}")
      raise CUDAError(f"loading kernel {name} failed: {device.lib.error_text(result)}\n"
                      f"{log.value.decode(errors='replace')}")
    self.module = module
    function = ctypes.c_void_p()
    device.lib("cuModuleGetFunction", ctypes.byref(function), module, name.encode())
    self.function = function
    # a group reduction runs a block of `launch.group` threads per output, the rest blocks of BLOCK_SIZE
    self.block_size = launch.group if launch.group > 1 else BLOCK_SIZE
    self.blocks = max(1, -(-work_items // self.block_size))
    self._launch = device.lib.lib.cuLaunchKernel

  def __call__(self, addresses: list[int]) -> None:
    """Launch (asynchronously, on the default stream) over buffers at `addresses`."""
    if self.work_items == 0: return
    count = max(1, len(addresses))
    values = (ctypes.c_uint64 * count)(*addresses)  # the kernel's parameters, and a pointer to each
    first = ctypes.addressof(values)
    params = (ctypes.c_void_p * count)(*range(first, first + 8 * count, 8))
    result = self._launch(self.function, self.blocks, 1, 1, self.block_size, 1, 1, 0, None, params, None)
    if result: self.device.lib.check(result, f"launching {self.name}")

  def timed(self, addresses: list[int]) -> float:
    """Run the kernel over buffers at `addresses` and wait for it; the seconds it ran on the GPU (between CUDA events
    recorded before and after it on its stream, not the launch's cost on the host), for DEBUG and profiles."""
    if self.work_items == 0: return 0.0
    start, end = self.device.events()
    lib = self.device.lib
    lib("cuEventRecord", start, None)
    self(addresses)
    lib("cuEventRecord", end, None)
    lib("cuEventSynchronize", end)
    milliseconds = ctypes.c_float()
    lib("cuEventElapsedTime", ctypes.byref(milliseconds), start, end)
    return milliseconds.value * 1e-3


class CUDABuffer(DeviceBuffer):
  """An array's storage in a CUDA device's memory (`address`: the device pointer); freed memory goes back to the
  device's pool."""
  __slots__ = ()

  def __del__(self):
    if sys is not None and getattr(self, "_address", 0) and self._base is None:  # (a view's memory is its base's)
      self.device.release(self._address, self.nbytes)


@functools.cache
def cuda_devices() -> tuple[CudaDevice, ...]:
  """The CUDA devices of this process, in driver order (RuntimeError without a driver)."""
  driver()
  return tuple(CudaDevice(i) for i in range(device_count()))
