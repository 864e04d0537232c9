"""A fake CUDA driver (`libcuda`) for the tests of the CUDA device's Python side on machines without an NVIDIA GPU.

It answers the driver entry points `tinyjax.devices.cuda` calls, with the driver's argument conventions (ctypes
pointers it writes through, result codes, error names) and its rules: memory calls need a current context, copies
must stay inside an allocation, a block has at most 1024 threads, allocations past the device's memory fail with
CUDA_ERROR_OUT_OF_MEMORY, PTX without the kernel's `.entry` is rejected with a log.

It cannot run PTX. `FakeLibcuda.record(ptx, llvm_ir)` (the tests wrap `cuda.compile_ptx` with it) tells it the NVPTX
module a PTX came from; a loaded module's kernel is that module's per-work-item body compiled for the CPU (as the
emulated GPU of gpu_emulator.py does), and a launch runs it for every thread of the grid the entry would let through
(`gid < outputs`), one at a time, the last first. So group kernels (threads that wait for each other at barriers)
can't run here: the device is used with `groups = False`.
"""
from __future__ import annotations

import ctypes
import re
import threading
import time

import numpy as np

from tinyjax.devices.cpu import compile_cpu

from gpu_emulator import cpu_module_of_gpu_kernel

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, INVALID_CONTEXT, INVALID_PTX, NOT_FOUND = 0, 1, 2, 201, 218, 500
ERRORS = {INVALID_VALUE: ("CUDA_ERROR_INVALID_VALUE", "invalid argument"),
          OUT_OF_MEMORY: ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
          INVALID_CONTEXT: ("CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
          INVALID_PTX: ("CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"),
          NOT_FOUND: ("CUDA_ERROR_NOT_FOUND", "named symbol not found")}


class FakeLibcuda:
  """One fake GPU ("Fake GPU", compute capability 8.0) with `total` bytes of memory."""

  def __init__(self, total: int = 1 << 30):
    self.total = total
    self.memory: dict[int, np.ndarray] = {}  # address -> its block
    self.sources: dict[str, str] = {}  # PTX -> the NVPTX module it was made from (`record`)
    self.modules: dict[int, tuple[str, str]] = {}  # handle -> (PTX, its NVPTX module)
    self.functions: dict[int, tuple] = {}  # handle -> (name, its CPU program, outputs, buffers)
    self.context = 0xC0DE
    self._current = threading.local()
    self.launches: list[tuple] = []  # (name, grid, block) of each launch
    self.events: dict[int, float | None] = {}  # handle -> when it was last recorded

  def record(self, ptx: str, llvm_ir: str) -> None:
    self.sources[ptx] = llvm_ir

  def __getattr__(self, name: str):
    raise AttributeError(f"the fake libcuda has no {name}: add it if the CUDA device now calls it")

  def _current_context(self) -> bool: return getattr(self._current, "context", 0) == self.context

  def _block_of(self, address: int, nbytes: int) -> bool:
    return any(start <= address and address + nbytes <= start + block.nbytes for start, block in self.memory.items())

  # ---- initialisation, devices, errors
  def cuInit(self, flags): return SUCCESS  # noqa: N802 (the driver's names)

  def cuGetErrorName(self, result, name):  # noqa: N802
    name._obj.value = ERRORS.get(result, ("CUDA_ERROR_UNKNOWN",))[0].encode()
    return SUCCESS if result in ERRORS else INVALID_VALUE

  def cuGetErrorString(self, result, text):  # noqa: N802
    text._obj.value = ERRORS.get(result, (None, "unknown error"))[1].encode()
    return SUCCESS if result in ERRORS else INVALID_VALUE

  def cuDeviceGetCount(self, count):  # noqa: N802
    count._obj.value = 1
    return SUCCESS

  def cuDeviceGet(self, handle, ordinal):  # noqa: N802
    if ordinal != 0: return INVALID_VALUE
    handle._obj.value = 0
    return SUCCESS

  def cuDeviceGetName(self, name, length, handle):  # noqa: N802
    name.value = b"Fake GPU"[:length - 1]
    return SUCCESS

  def cuDeviceGetAttribute(self, value, attribute, handle):  # noqa: N802
    known = {75: 8, 76: 0}  # COMPUTE_CAPABILITY_MAJOR / MINOR
    if attribute not in known: return INVALID_VALUE
    value._obj.value = known[attribute]
    return SUCCESS

  def cuDevicePrimaryCtxRetain(self, context, handle):  # noqa: N802
    context._obj.value = self.context
    return SUCCESS

  def cuCtxSetCurrent(self, context):  # noqa: N802
    self._current.context = context.value if isinstance(context, ctypes.c_void_p) else context
    return SUCCESS

  def cuCtxSynchronize(self):  # noqa: N802
    return SUCCESS if self._current_context() else INVALID_CONTEXT

  # ---- memory
  def cuMemGetInfo_v2(self, free, total):  # noqa: N802
    if not self._current_context(): return INVALID_CONTEXT
    total._obj.value = self.total
    free._obj.value = self.total - sum(block.nbytes for block in self.memory.values())
    return SUCCESS

  def cuMemAlloc_v2(self, pointer, nbytes):  # noqa: N802
    if not self._current_context(): return INVALID_CONTEXT
    if nbytes == 0: return INVALID_VALUE
    if sum(block.nbytes for block in self.memory.values()) + nbytes > self.total: return OUT_OF_MEMORY
    block = np.full(nbytes, 0xAB, np.uint8)  # garbage, as fresh device memory
    self.memory[block.ctypes.data] = block
    pointer._obj.value = block.ctypes.data
    return SUCCESS

  def cuMemFree_v2(self, address):  # noqa: N802
    if not self._current_context(): return INVALID_CONTEXT
    return SUCCESS if self.memory.pop(address.value, None) is not None else INVALID_VALUE

  def cuMemcpyHtoD_v2(self, device, host, nbytes):  # noqa: N802
    if not self._current_context(): return INVALID_CONTEXT
    if not self._block_of(device.value, nbytes): return INVALID_VALUE
    ctypes.memmove(device.value, host.value, nbytes)
    return SUCCESS

  def cuMemcpyDtoH_v2(self, host, device, nbytes):  # noqa: N802
    if not self._current_context(): return INVALID_CONTEXT
    if not self._block_of(device.value, nbytes): return INVALID_VALUE
    ctypes.memmove(host.value, device.value, nbytes)
    return SUCCESS

  # ---- events (timing)
  def cuEventCreate(self, event, flags):  # noqa: N802
    if not self._current_context(): return INVALID_CONTEXT
    event._obj.value = handle = 5000 + len(self.events)
    self.events[handle] = None
    return SUCCESS

  def cuEventRecord(self, event, stream):  # noqa: N802
    if event.value not in self.events: return INVALID_VALUE
    self.events[event.value] = time.perf_counter()  # launches run at once here: the host's clock is the device's
    return SUCCESS

  def cuEventSynchronize(self, event):  # noqa: N802
    return SUCCESS if self.events.get(event.value) is not None else INVALID_VALUE

  def cuEventElapsedTime(self, milliseconds, start, end):  # noqa: N802
    if self.events.get(start.value) is None or self.events.get(end.value) is None: return INVALID_VALUE
    milliseconds._obj.value = (self.events[end.value] - self.events[start.value]) * 1e3
    return SUCCESS

  # ---- kernels
  def cuModuleLoadDataEx(self, module, image, count, options, values):  # noqa: N802
    if not self._current_context(): return INVALID_CONTEXT
    ptx = image.value.decode()
    log = dict(zip(options[:count], values[:count]))
    if ptx not in self.sources or ".entry" not in ptx:
      message = b"ptxas fatal   : the fake driver knows no NVPTX module for this PTX\x00"
      if 5 in log and 6 in log: ctypes.memmove(log[5], message, min(len(message), log[6]))
      return INVALID_PTX
    handle = len(self.modules) + 1
    self.modules[handle] = (ptx, self.sources[ptx])
    module._obj.value = handle
    return SUCCESS

  def cuModuleGetFunction(self, function, module, name):  # noqa: N802
    ptx, llvm_ir = self.modules[module.value]
    name = name.decode()
    if f".entry {name}(" not in ptx and f".entry {name} (" not in ptx: return NOT_FOUND
    outputs = re.search(r"%live = icmp ult i64 %gid, (\d+)", llvm_ir)
    if outputs is None: return INVALID_PTX  # a group kernel: its threads would wait for each other (see above)
    buffers = re.search(r"define internal void \S+\((.*)\) alwaysinline", llvm_ir).group(1).count("ptr noalias")
    handle = 1000 + len(self.functions)
    self.functions[handle] = (name, compile_cpu(name, cpu_module_of_gpu_kernel(name, llvm_ir)), int(outputs.group(1)),
                              buffers)
    function._obj.value = handle
    return SUCCESS

  def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
    if not self._current_context(): return INVALID_CONTEXT
    if bx * by * bz > 1024 or min(gx, gy, gz, bx, by, bz) < 1: return INVALID_VALUE
    name, program, outputs, buffers = self.functions[function.value]
    addresses = [ctypes.c_uint64.from_address(params[i]).value for i in range(buffers)]
    if not all(self._block_of(address, 1) for address in addresses): return INVALID_VALUE
    self.launches.append((name, (gx, gy, gz), (bx, by, bz)))
    program(addresses, min(gx * gy * gz * bx * by * bz, outputs), False)
    return SUCCESS
