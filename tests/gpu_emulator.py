"""A GPU device for the tests that runs GPU kernels on the CPU: proves the GPU path (work-item indexing, schedules run
from Python, device buffers, placement) on machines without a GPU.

Its kernels are the very modules `render_gpu` makes for NVPTX, less the NVPTX entry: the body function (the work of
one work-item, `@<name>.body(buffers..., i64 %gid)`) is compiled for the host and called for every work-item in turn,
the last first (so a kernel that relies on an order of its work-items fails here).
Its memory is host memory handed out by address, as a GPU's would be. It is no model of a GPU's speed or of
concurrency between work-items.
"""
from __future__ import annotations

import ctypes
import re
import time

import numpy as np

from tinyjax.codegen.llvm import render_gpu
from tinyjax.devices.cpu import compile_cpu
from tinyjax.devices.cuda import CUDABuffer


# the PTX instructions render_gpu writes as inline assembly, as functions of the CPU's IR
_PTX_ASM = {
  'asm "neg.f32 $0, $1;", "=f,f"':
    ("@ptx.neg.f32", "define internal float @ptx.neg.f32(float %x) {\n  %r = fneg float %x\n  ret float %r\n}"),
  'asm "cvt.f32.f16 $0, $1;", "=f,h"':
    ("@ptx.cvt.f32.f16", "define internal float @ptx.cvt.f32.f16(i16 %x) {\n  %h = bitcast i16 %x to half\n"
                         "  %r = fpext half %h to float\n  ret float %r\n}")}


def cpu_module_of_gpu_kernel(name: str, gpu_ir: str) -> str:
  """The CPU kernel (devices/cpu.py's ABI: iterations [start, end) are work-items) of a `render_gpu` module."""
  for assembly, (function, definition) in _PTX_ASM.items():
    if assembly in gpu_ir: gpu_ir = gpu_ir.replace(assembly, function) + "\n" + definition + "\n"
  kept, skipping = [], False
  entry = re.compile(rf'define void (@{re.escape(name)}|@"{re.escape(name)}")\(')
  for line in gpu_ir.splitlines():
    if entry.match(line): skipping = True
    if skipping:
      if line == "}": skipping = False
      continue
    if line.startswith(("target ", "!nvvm.annotations")) or "@llvm.nvvm." in line or '!"kernel"' in line: continue
    kept.append(line)
  body = re.search(r"define internal void (\S+)\((.*)\) alwaysinline", gpu_ir)
  assert body is not None, "render_gpu's body function not found"
  symbol, params = body.group(1), body.group(2)
  buffers = re.findall(r"ptr noalias %buf(\d+)", params)
  # work-items run last first: a GPU promises no order, and a kernel whose result depends on one must show it here
  wrapper = [f"define void @{name}(ptr noalias %args, i64 %start, i64 %end) {{", "entry:", "  br label %head", "head:",
             "  %i = phi i64 [ %start, %entry ], [ %next, %body ]", "  %more = icmp slt i64 %i, %end",
             "  br i1 %more, label %body, label %done", "body:", "  %from_end = sub i64 %i, %start",
             "  %last = sub i64 %end, 1", "  %gid = sub i64 %last, %from_end"]
  for index in buffers:
    wrapper += [f"  %slot{index} = getelementptr inbounds ptr, ptr %args, i64 {index}",
                f"  %buf{index} = load ptr, ptr %slot{index}"]
  arguments = "".join(f"ptr %buf{index}, " for index in buffers)
  wrapper += [f"  call void {symbol}({arguments}i64 %gid)", "  %next = add i64 %i, 1", "  br label %head", "done:",
              "  ret void", "}"]
  return "\n".join(kept + wrapper) + "\n"


class EmulatedProgram:
  def __init__(self, name: str, gpu_ir: str, work_items: int):
    self.name, self.src, self.work_items = name, gpu_ir, work_items
    self.program = compile_cpu(name, cpu_module_of_gpu_kernel(name, gpu_ir))

  def __call__(self, addresses: list[int]) -> None:
    if self.work_items: self.program(addresses, self.work_items, False)

  def timed(self, addresses: list[int]) -> float:
    start = time.perf_counter()
    self(addresses)
    return time.perf_counter() - start


class EmulatedGPU:
  """Looks like a `CudaDevice` to tinyjax (platform 'gpu', memory by address, `compile`, `read`)."""
  platform = "gpu"
  device_kind = "emulated GPU"
  arch = "sm_80"

  def __init__(self, ordinal: int = 0):
    self.id = ordinal
    self.memory: dict[int, np.ndarray] = {}
    self.programs: dict[tuple[str, str], EmulatedProgram] = {}
    self.launched = 0

  def __repr__(self) -> str: return f"EmulatedGPU(id={self.id})"

  def allocate(self, nbytes: int) -> int:
    if nbytes == 0: return 0
    block = np.full(nbytes, 0xAB, np.uint8)  # garbage, as fresh device memory: a kernel must write what it reads
    self.memory[block.ctypes.data] = block
    return block.ctypes.data

  def release(self, address: int, nbytes: int) -> None: self.memory.pop(address, None)

  def upload(self, address: int, host: np.ndarray) -> None:
    if host.nbytes: ctypes.memmove(address, host.ctypes.data, host.nbytes)

  def download(self, host: np.ndarray, address: int) -> None:
    if host.nbytes: ctypes.memmove(host.ctypes.data, address, host.nbytes)

  def read(self, buffer) -> np.ndarray:
    host = np.empty(buffer.shape, buffer.dtype)
    self.download(host, buffer.address)
    return host

  def synchronize(self) -> None: pass

  groups = False  # work-items run one after the other here: none can wait for another (no group reductions)
  mma = False

  def render(self, name: str, ast, launch, ordered: int = 0) -> str: return render_gpu(name, ast, ordered, launch)

  def buffer(self, shape, dtype, host=None): return CUDABuffer(shape, dtype, self, host)

  def compile(self, name: str, llvm_ir: str, launch) -> EmulatedProgram:
    if (program := self.programs.get((name, llvm_ir))) is None:
      program = self.programs[(name, llvm_ir)] = EmulatedProgram(name, llvm_ir, launch.work_items)
    return program
