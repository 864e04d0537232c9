"""Realisation: run a lazy graph. Normalise it (buffers become numbered PARAMs, so the same program over other data
is the same graph), find its compiled schedule (in memory, else on disk, else lower + codegen + compile), then
launch the kernels over freshly allocated buffers.

Both caches are keyed by structure, so an eager Python loop of the same ops lowers and compiles once, and a second
process running the same program neither lowers nor compiles (the disk cache holds the schedule and the machine
code; the code itself goes through the device's compile cache).
"""
from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field

from tinyjax import __version__
from tinyjax.codegen.llvm import render_llvm
from tinyjax.devices import compile_cpu
from tinyjax.devices.buffer import Buffer
from tinyjax.devices.cache import DiskCache
from tinyjax.helpers import DEBUG
from tinyjax.lower.schedule import Kernel, Schedule, schedule, structure_key
from tinyjax.uop import Ops, UOp, pretty


@dataclass
class Counters:
  """Public counters of what realisation did (see `tinyjax.runtime_stats`)."""
  kernels_launched: int = 0
  schedules_lowered: int = 0   # Python lowering actually ran (memory and disk cache missed)
  schedule_disk_hits: int = 0
  launch_seconds: float = 0.0

  def reset(self) -> None:
    for name, value in Counters().__dict__.items(): setattr(self, name, value)


counters = Counters()


@dataclass
class CompiledSchedule:
  """A schedule whose kernels are compiled programs, ready to launch."""
  schedule: Schedule
  programs: list = field(default_factory=list)


_memory_cache: dict[UOp, CompiledSchedule] = {}
_MEMORY_CACHE_LIMIT = 4096  # distinct programs kept per process; beyond that the oldest are dropped
_disk_cache = DiskCache("schedule")


def normalize(roots: list[UOp]) -> tuple[UOp, list[Buffer]]:
  """Replace BUFFER leaves by PARAMs numbered in order of first use; return the SINK and the buffers."""
  sink = UOp(Ops.SINK, roots[0].dtype, tuple(roots))
  buffers: list[Buffer] = []
  replaced: dict[UOp, UOp] = {}
  for node in sink.toposort:
    if node.op is Ops.BUFFER:
      replaced[node] = UOp(Ops.PARAM, node.dtype, (), (len(buffers), node.shape))
      buffers.append(node.arg)
    elif node.src and any(replaced[s] is not s for s in node.src):
      replaced[node] = node.replace(src=tuple(replaced[s] for s in node.src))
    else:
      replaced[node] = node
  return replaced[sink], buffers


def _compile(sched: Schedule) -> CompiledSchedule:
  compiled = CompiledSchedule(sched)
  for kernel in sched.kernels:
    source = render_llvm(kernel.name, kernel.ast)
    if DEBUG >= 3: print(f"--- kernel {kernel.name} slots={kernel.slots}\n{pretty(kernel.ast)}")
    if DEBUG >= 4: print(f"--- LLVM IR of {kernel.name}\n{source}")
    compiled.programs.append(compile_cpu(kernel.name, source))
  return compiled


def get_schedule(sink: UOp) -> CompiledSchedule:
  """The compiled schedule of a normalised program, from the memory cache, the disk cache, or lowered now."""
  if (compiled := _memory_cache.get(sink)) is not None: return compiled
  key = f"{__version__}|{structure_key(sink)}"
  payload = _disk_cache.get(key)
  sched = None
  if payload is not None:
    try:
      sched = pickle.loads(payload)
      counters.schedule_disk_hits += 1
    except Exception:  # an entry from an incompatible version: lower again and replace it
      sched = None
  if sched is None:
    start = time.perf_counter()
    sched = schedule(sink)
    counters.schedules_lowered += 1
    _disk_cache.put(key, pickle.dumps(sched, protocol=pickle.HIGHEST_PROTOCOL))
    if DEBUG >= 2: _print_schedule(sched, time.perf_counter() - start)
  compiled = _compile(sched)
  if len(_memory_cache) >= _MEMORY_CACHE_LIMIT: del _memory_cache[next(iter(_memory_cache))]
  _memory_cache[sink] = compiled
  return compiled


def _print_schedule(sched: Schedule, seconds: float) -> None:
  print(f"*** schedule: {len(sched.kernels)} kernels, {sched.n_inputs} inputs, lowered in {seconds * 1e3:.2f} ms")
  for kernel in sched.kernels:
    print(f"  {kernel.name:40s} slots={list(kernel.slots)} outer={kernel.outer_size} work={kernel.work}"
          f"{' parallel' if kernel.parallel else ''}")


def run_schedule(compiled: CompiledSchedule, inputs: list[Buffer]) -> list[Buffer]:
  """Launch every kernel of a compiled schedule over `inputs` and new buffers; return the output buffers."""
  sched = compiled.schedule
  buffers = list(inputs) + [Buffer(shape, dtype) for shape, dtype in sched.slot_specs]
  for kernel, program in zip(sched.kernels, compiled.programs):
    addresses = [buffers[slot].address for slot in kernel.slots]
    start = time.perf_counter()
    program(addresses, kernel.outer_size, kernel.parallel)
    elapsed = time.perf_counter() - start
    counters.kernels_launched += 1
    counters.launch_seconds += elapsed
    if DEBUG >= 1: _print_launch(kernel, buffers, elapsed)
  return [buffers[slot] for slot in sched.outputs]


def _print_launch(kernel: Kernel, buffers: list[Buffer], seconds: float) -> None:
  nbytes = sum(buffers[slot].nbytes for slot in kernel.slots)
  print(f"*** CPU {counters.kernels_launched:4d} {kernel.name:40s} {seconds * 1e6:9.1f} us "
        f"{nbytes / max(seconds, 1e-9) / 1e9:7.2f} GB/s{'  threads' if kernel.parallel else ''}")


def realize(roots: list[UOp]) -> list[Buffer]:
  """Compute the given lazy nodes; return one buffer per root."""
  sink, inputs = normalize(roots)
  return run_schedule(get_schedule(sink), inputs)
