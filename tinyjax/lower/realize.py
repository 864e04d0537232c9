"""Realisation: run a lazy graph. Normalise it (buffers become numbered PARAMs, so the same program over other data
is the same graph), find its compiled schedule (in memory, else on disk, else lower + codegen + compile), then
launch the kernels over freshly allocated buffers.

A compiled schedule runs as one call into the runtime (`LaunchList`: every kernel in order, no Python per kernel),
with its output buffers allocated from specs planned once and its intermediates in one arena laid out once by
liveness (lower/memory.py), taken from the buffer pool for the run and given back after it. With DEBUG>=1 each kernel
is launched and timed on its own instead, so the printed times are per kernel. A GPU run still allocates every slot
on its own.

Both caches are keyed by structure, so an eager Python loop of the same ops lowers and compiles once, and a second
process running the same program neither lowers nor compiles (the disk cache holds the schedule and the machine
code; the code itself goes through the device's compile cache).
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import math
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tinyjax import __version__
from tinyjax.codegen.gpu import gpu_launch
from tinyjax.codegen.llvm import loop_steps, render_llvm
from tinyjax.codegen.opt import amx_bf16, choose_opts, plans_memoized, tile_geometry
from tinyjax.devices import CompileStream, LaunchList, compile_cpu, compile_cpu_many, compile_worker, cpu_threads
from tinyjax.devices.cpu import (BASELINE_MAX_TILE_WORK, BASELINE_MAX_WORK, HostProgram, count_run,
                                 same_bits_unoptimised)
from tinyjax.devices.device import placement_of, CPU, compute_device, default_device, host_buffer, place, runnable
from tinyjax.devices.runtime import MODE_PARALLEL, MODE_SERIAL, MODE_WHOLE
from tinyjax.devices.buffer import Buffer, allocate_buffers, give_block, reinterpret, take_block, shard
from tinyjax.devices.cache import DiskCache
from tinyjax.helpers import DEBUG, gc_paused
from tinyjax.lower.complex import has_complex, split_complex
from tinyjax.lower.float8 import has_float8, is_float8, split_float8
from tinyjax.lower.memory import MemoryPlan, plan_memory
from tinyjax.lower.split import GPU_SPLIT_MIN_CHUNK_WORK
from tinyjax.lower.schedule import (HostCall, Kernel, Loop, Schedule, Switch, expand_primitives, has_host_calls,
                                    kernels_of, natives_of, schedule, structure_key)
from tinyjax.profiler import kernel_flops, record_launch, roofline
from tinyjax.helpers import open_profiles as _profiles  # (a list: checking it is cheaper than a call)
from tinyjax.uop import MOVEMENT, Ops, UOp, arg_key, is_view, pretty, toposort_of


@dataclass
class Counters:
  """Public counters of what realisation did (see `tinyjax.runtime_stats`)."""
  kernels_launched: int = 0
  schedules_lowered: int = 0   # Python lowering actually ran (memory and disk cache missed)
  schedule_disk_hits: int = 0
  launch_seconds: float = 0.0  # measured per kernel with DEBUG>=1 only (the fast path runs all kernels in one call)

  def reset(self) -> None:
    for name, value in Counters().__dict__.items(): setattr(self, name, value)


counters = Counters()


def runtime_stats() -> dict:
  """What realisation has done in this process: kernels launched, schedules lowered, schedule disk-cache hits and
  seconds spent in kernel launches. `counters.reset()` starts over."""
  return dict(counters.__dict__)


@dataclass
class CompiledSchedule:
  """A schedule whose kernels are compiled programs, ready to launch: `launches` runs them all in one call,
  `slot_specs` are the (shape, dtype, nbytes) of its non-input slots and `plan` says where they live in a run."""
  schedule: Schedule
  programs: list = field(default_factory=list)
  device: object = CPU
  launches: LaunchList | None = None
  slot_specs: list = field(default_factory=list)
  plan: MemoryPlan | None = None

  def __post_init__(self):
    sched = self.schedule
    self.host_programs: list[HostProgram] = []  # (the CPU's: their exceptions are raised after each run)
    if self.device is CPU:
      self.launches = LaunchList(_launch_items(sched.kernels, iter(self.programs), self.host_programs))
    self.slot_specs = [(shape, dtype, math.prod(shape) * dtype.itemsize) for shape, dtype in sched.slot_specs]
    self.plan = plan_memory(sched)
    # (output index, shape, dtype) of each output computed in another dtype's memory and handed out as a view of it
    # (`typed_views`): a complex one as interleaved floats (lower/complex.py), a float8 one as bytes (lower/float8.py)
    self.typed_outputs: tuple = ()


def _launch_items(steps: tuple, programs, host_programs: list) -> list:
  """The LaunchList items of a schedule's steps, with the compiled programs in `kernels_of` order; a host step is
  a HostProgram (appended to `host_programs`)."""
  items = []
  for step in steps:
    if isinstance(step, Switch):
      items.append(("switch", step.index_slot, [_launch_items(branch, programs, host_programs)
                                                for branch in step.branches]))
    elif isinstance(step, Loop):
      cond = _launch_items(step.cond, programs, host_programs)
      items.append(("loop", step.trip, step.flag_slot if step.trip is None else step.counter_slot, cond,
                    _launch_items(step.body, programs, host_programs)))
    elif isinstance(step, HostCall) and step.callback.native is not None:  # (compiled: launched as a kernel)
      native = step.callback.native
      items.append((compile_cpu(*native.source()), step.slots, native.count, native.grain,
                    MODE_PARALLEL if native.count > native.grain else MODE_WHOLE))
    elif isinstance(step, HostCall):
      host_programs.append(HostProgram(step.name, step.callback.run, step.n_in, step.avals))
      items.append((host_programs[-1], step.slots, 1, 1, MODE_WHOLE))
    else:
      mode = MODE_PARALLEL if step.parallel else MODE_WHOLE if step.work < WHOLE_LAUNCH_WORK else MODE_SERIAL
      items.append((next(programs), step.slots, step.outer_size, step.grain, mode))
  return items


# A serial kernel of fewer loop iterations than this runs as one call, without the runtime's adaptive chunks (which
# time each chunk so that Ctrl-C is seen within milliseconds of a long kernel): a loop body's tiny kernels, run
# thousands of times, then cost a function call each.
WHOLE_LAUNCH_WORK = 1 << 16


# (normalised sink or `program_key`, device) -> compiled schedule (jit's calls look up the first, eager ones the second)
_memory_cache: dict[tuple, CompiledSchedule] = {}
_MEMORY_CACHE_LIMIT = 4096  # distinct programs kept per process; beyond that the oldest are dropped
_disk_cache = DiskCache("schedule")


@functools.cache
def _code_fingerprint() -> str:
  """A hash of the code that decides schedules and kernel source, so a changed tinyjax never reuses old entries: the
  whole package's (a program's named primitive calls are expanded by lax's and numpy's code when it is lowered). Read
  on the first program that misses the memory cache: hashing the package's sources takes ~10 ms."""
  import hashlib
  import pathlib
  package = pathlib.Path(__file__).resolve().parent.parent
  digest = hashlib.sha256(__version__.encode())
  for path in sorted(package.rglob("*.py")):
    digest.update(path.read_bytes())
  return digest.hexdigest()[:16]



def first_tier(k: Kernel, source: str) -> tuple[str, str | None]:
  """A CPU kernel's source and its first tier (devices/cpu.py `CompileStream`): the GEMM library's call for a
  contraction it can do, else the source itself (compiled unoptimised) where that computes the same bits and the
  kernel's loops run at most BASELINE_MAX_WORK iterations in all (a register tile's: BASELINE_MAX_TILE_WORK), else
  None."""
  if (library := render_llvm(k.name, k.ast, library=True)) is not None: return source, library
  plan = choose_opts(k.ast)
  limit = BASELINE_MAX_TILE_WORK if plan is not None and not plan.stream and not plan.dot else BASELINE_MAX_WORK
  return source, source if loop_steps(k.ast) <= limit and same_bits_unoptimised(source) else None


def normalize(roots: list[UOp], first_param: int = 0, replaced: dict[UOp, UOp] | None = None,
              order: list[UOp] | None = None, constants: bool = False) -> tuple[UOp, list]:
  """Replace BUFFER leaves by PARAMs numbered from `first_param` in order of first use; return the SINK and the
  buffers. (jit numbers its arguments 0.. and the arrays it closed over after them.) `replaced`, when given, is
  filled with each node's normalised node; `order`, when given, is the roots' nodes sources first (`toposort_of`
  them), so the graph is not walked again. With `constants` (an eager program: `realize`), CONST leaves are
  numbered inputs too (their nodes are in the list, where the buffers are), but for the literals that make code
  (`_literal_operand`): see `program_key`."""
  sink = UOp(Ops.SINK, roots[0].dtype, tuple(roots))
  buffers: list = []
  replaced = {} if replaced is None else replaced
  nodes = sink.toposort if order is None else [*order, sink]
  literal = _literal_constants(nodes) if constants else set()
  for node in nodes:
    if node.op is Ops.BUFFER or (constants and node.op is CONST and node not in literal):
      replaced[node] = UOp(Ops.PARAM, node.dtype, (), (first_param + len(buffers), node.shape))
      buffers.append(node.arg if node.op is Ops.BUFFER else node)
    elif node.src and any(replaced[s] is not s for s in node.src):
      replaced[node] = node.replace(src=tuple(replaced[s] for s in node.src))
    else:
      replaced[node] = node
  return replaced[sink], buffers


# A GPU schedule splits long reductions with few outputs (split.py) as if for this many threads: reductions of fewer
# than 8x as many outputs and at least 256K elements get up to 4x as many partial results of at least
# GPU_SPLIT_MIN_CHUNK_WORK steps each (a work-item or a work-group each).
GPU_SPLIT_THREADS = 128


def gpu_schedule(sink: UOp) -> Schedule:
  """The schedule of a program on a GPU device: reductions split for GPU_SPLIT_THREADS threads into partial results
  of GPU_SPLIT_MIN_CHUNK_WORK steps or more, per-row reductions in kernels of their own (a work-item per output would
  compute them once per element), float16 operands read where they are used as bfloat16 ones (one conversion
  instruction; what tensor cores read)."""
  return schedule(sink, GPU_SPLIT_THREADS, gpu=True, min_chunk_work=GPU_SPLIT_MIN_CHUNK_WORK)


def get_schedule(sink: UOp, device=CPU) -> CompiledSchedule:
  """The compiled schedule of a normalised program on `device`: from the memory cache, else from the disk cache
  (schedule and LLVM IR; the machine code then comes from the device's compile cache), else lowered and rendered
  now."""
  device = compute_device(device)
  if (compiled := _memory_cache.get((sink, device))) is not None: return compiled
  gpu = device is not CPU
  # the schedule depends on the thread count (split reductions), the register tiles' shapes (codegen/opt.py
  # `tile_geometry`) and the kernels on AMX (`_amx_plan`), so the disk cache key does too; asking for AMX also gets
  # this process the OS's permission to run its kernels, before any cached one is loaded
  threads = GPU_SPLIT_THREADS if gpu else cpu_threads()
  target = f"gpu={device.arch},groups={device.groups},mma={device.mma}" if gpu else \
      f"threads={threads},amx={int(amx_bf16())}"
  target += f",tiles={tile_geometry()}"
  key = f"{_code_fingerprint()}|{target}|{structure_key(sink)}"
  lowered = None
  if (payload := _disk_cache.get(key)) is not None:
    try:
      lowered = pickle.loads(payload)
      counters.schedule_disk_hits += 1
    except Exception:  # an entry this version cannot read: lower again and replace it
      lowered = None
  origin = "from the disk cache"
  programs = None
  if lowered is None:
    start = time.perf_counter()
    if not gpu: compile_worker()  # started now, it is ready to compile once the first kernel is rendered
    real_sink = expand_primitives(sink)  # (named calls, eager ones and loop bodies', as their Ops)
    if has_complex(real_sink): real_sink = split_complex(real_sink)  # (complex values as pairs of floats)
    if has_float8(real_sink): real_sink = split_float8(real_sink)  # (float8 values as bytes and float32 arithmetic)
    rendered: dict[tuple, tuple[str, str | None]] = {}  # a kernel several like blocks run is rendered once
    stream = None if gpu else CompileStream()  # (the CPU's kernels compile as they are rendered)

    def render(k: Kernel) -> tuple[str, str | None]:
      """The kernel's source, and on the CPU its first tier (`first_tier`)."""
      if (kernel_key := (k.name, k.ast, k.ordered)) not in rendered:
        rendered[kernel_key] = (device.render(k.name, k.ast, _launch_of(k, device), k.ordered), None) if gpu else \
            first_tier(k, render_llvm(k.name, k.ast))
      return rendered[kernel_key]

    def built(k: Kernel) -> None:  # (a contraction, rendered and compiling while the rest of the program is lowered)
      stream.prepare(k.name, *stream.tier(k.name, *render(k)))
    try:
      with plans_memoized():  # (each kernel's tile plan worked out once in this lowering)
        sched = gpu_schedule(real_sink) if gpu else schedule(real_sink, threads, built=built)
        kernels = kernels_of(sched.kernels)
        sources, quick = [], []
        for k in kernels:  # (each submitted as it is rendered: the worker compiles while the rest are)
          source, first = render(k)
          sources.append(source)
          quick.append(first)
          if stream is not None: stream.submit(k.name, source, first)
        for native in natives_of(sched.kernels) if stream is not None else ():  # (compiled along, loaded by launch)
          stream.include(*native.source())
      if stream is not None: programs = stream.finish()
    except BaseException:
      if stream is not None: stream.close()
      raise
    lowered = (sched, sources, quick)
    counters.schedules_lowered += 1
    # (a host function is this process's: such a schedule is not kept on disk, and no other one has its key)
    if not has_host_calls(sched.kernels): _disk_cache.put(key, pickle.dumps(lowered, protocol=pickle.HIGHEST_PROTOCOL))
    origin = f"lowered in {(time.perf_counter() - start) * 1e3:.2f} ms"
  sched, sources, quick = lowered
  if DEBUG >= 2: _print_schedule(sched, sources, origin, device)
  if gpu:
    programs = [device.compile(kernel.name, src, _launch_of(kernel, device))
                for kernel, src in zip(kernels_of(sched.kernels), sources)]
  elif programs is None:  # (from the disk cache)
    programs = compile_cpu_many([(k.name, src) for k, src in zip(kernels_of(sched.kernels), sources)], quick=quick)
  compiled = CompiledSchedule(sched, programs, device)
  compiled.typed_outputs = tuple((index, out.shape, out.dtype) for index, out in enumerate(sink.src)
                                 if out.dtype.kind == "c" or is_float8(out.dtype))
  if len(_memory_cache) >= _MEMORY_CACHE_LIMIT: del _memory_cache[next(iter(_memory_cache))]
  _memory_cache[(sink, device)] = compiled
  return compiled


def _launch_of(kernel: Kernel, device):
  """How a kernel runs on GPU `device` (codegen/gpu.py): worked out once per kernel, not at each of its renders,
  compiles and DEBUG launch lines."""
  return _gpu_launch_memo(kernel.ast, kernel.ordered, device.groups, device.mma)


_gpu_launch_memo = functools.lru_cache(maxsize=4096)(gpu_launch)


def _print_schedule(sched: Schedule, sources: list[str], origin: str, device) -> None:
  language = getattr(device, "language", "LLVM IR")
  kernels = kernels_of(sched.kernels)
  print(f"*** schedule: {len(kernels)} kernels, {sched.n_inputs} inputs, {origin}")
  sources_of = dict(zip((id(kernel) for kernel in kernels), sources))

  def show(steps: tuple, indent: str) -> None:
    for step in steps:
      if isinstance(step, Switch):
        for number, branch in enumerate(step.branches):
          print(f"{indent}  branch {number} (index in slot {step.index_slot}):")
          show(branch, indent + "    ")
        continue
      if isinstance(step, Loop):
        repeat = f"x{step.trip}" if step.trip is not None else f"while slot {step.flag_slot}"
        print(f"{indent}  loop {repeat}:")
        if step.cond:
          print(f"{indent}    condition:")
          show(step.cond, indent + "    ")
          print(f"{indent}    body:")
        show(step.body, indent + "    ")
        continue
      if isinstance(step, HostCall):
        native = " compiled" if step.callback.native is not None else ""
        print(f"{indent}  {step.name:40s} slots={list(step.slots)} (host{native}: reads {step.n_in}, writes the rest)")
        continue
      # (the CPU's launch: chunks of the outer range over its threads; a GPU's: work-items and work-groups)
      launch = f"outer={step.outer_size} work={step.work}{f' grain={step.grain}' if step.grain > 1 else ''}" \
          f"{' parallel' if step.parallel else ''}{' sequential' if step.sequential else ''}" if device is CPU else \
          f"work={step.work} {_launch_of(step, device)}"
      print(f"{indent}  {step.name:40s} slots={list(step.slots)} {launch}")
      if DEBUG >= 3: print(f"--- UOps of {step.name}\n{pretty(step.ast)}")
      if DEBUG >= 4: print(f"--- {language} of {step.name}\n{sources_of[id(step)]}")
  show(sched.kernels, "")


def run_schedule(compiled: CompiledSchedule, inputs: list[Buffer], reuse: dict[int, Buffer] | None = None
                 ) -> list[Buffer]:
  """Launch every kernel of a compiled schedule over `inputs` (on its device), new output buffers and an arena for
  the intermediates; return the output buffers. `reuse` gives some output slots a buffer to write into instead of a
  new one (a donated input's: jit checked that the program may, `donation_aliases`)."""
  sched, plan = compiled.schedule, compiled.plan
  # inputs past the last one the program reads (unused jit arguments) have no slot
  if compiled.device is not CPU:
    device = compiled.device
    buffers = inputs[:sched.n_inputs] + [device.buffer(shape, dtype) for shape, dtype, _ in compiled.slot_specs]
    _run_steps(sched.kernels, iter(compiled.programs), buffers, device, timed=DEBUG >= 1 or bool(_profiles))
    return typed_views(compiled, [buffers[slot] for slot in sched.outputs])
  buffers = inputs[:sched.n_inputs]
  if reuse:
    buffers += [reuse[slot] if slot in reuse else allocate_buffers([spec])[0]
                for slot, spec in zip(plan.output_slots, plan.output_specs)]
  else:
    buffers += allocate_buffers(plan.output_specs)
  if DEBUG >= 1 or _profiles:
    arena = take_block(plan.arena_bytes)[0] if plan.arena_bytes else None
    _run_steps(sched.kernels, iter(compiled.programs), _slot_buffers(compiled, buffers, arena), CPU, timed=True)
    if arena is not None: give_block(arena, arena.ctypes.data)
    count_run(compiled.programs)  # (towards the first tiers' upgrades, as a launch list's run)
  elif plan.outputs_in_order:  # no intermediates (jit(lambda x: x + 1)): the slots are the inputs, then the outputs
    launches = compiled.launches
    launches([buffer._address for buffer in buffers])
    counters.kernels_launched += launches.launched
    if compiled.host_programs: _raise_host_errors(compiled)
  else:
    arena, base = take_block(plan.arena_bytes)
    addresses = [buffer._address for buffer in buffers[:sched.n_inputs]]
    addresses += [base + offset for offset in plan.offsets]
    for slot, buffer in zip(plan.output_slots, buffers[sched.n_inputs:]): addresses[slot] = buffer._address
    launches = compiled.launches
    launches(addresses)  # (runs to completion before returning: the arena is free again after it)
    give_block(arena, base)
    counters.kernels_launched += launches.launched
    if compiled.host_programs: _raise_host_errors(compiled)
  if compiled.typed_outputs: return typed_views(compiled, [buffers[index] for index in plan.output_index])
  if len(plan.output_index) == 1: return [buffers[plan.output_index[0]]]  # (a jitted call's common case)
  return [buffers[index] for index in plan.output_index]


def typed_views(compiled: CompiledSchedule, outputs: list[Buffer]) -> list[Buffer]:
  """The outputs, the complex ones (written as interleaved float pairs) viewed as complex arrays and the float8 ones
  (written as bytes) as float8 arrays (no copy)."""
  for index, shape, dtype in compiled.typed_outputs: outputs[index] = reinterpret(outputs[index], shape, dtype)
  return outputs


def direct_runner(compiled: CompiledSchedule, n_args: int, consts: list[Buffer]
                  ) -> Callable[[list[Buffer]], Buffer] | None:
  """For the commonest jitted program (on the CPU, one output, no intermediates: `jit(lambda x: x + 1)`), a function
  of the `n_args` argument buffers that does what `run_schedule` does for it with the constants' addresses and the
  output's spec bound once (with the hot path's other trims, a cache-hit `jit(x + 1)` call went 4.5 -> 3.6 us in
  benchmarks/suite.py). None for any other program, and while DEBUG times the kernels; a call made while a profile
  is open must take `run_schedule` (the caller checks `open_profiles`)."""
  sched, plan = compiled.schedule, compiled.plan
  if compiled.device is not CPU or DEBUG >= 1 or compiled.host_programs or not plan.outputs_in_order or \
      compiled.typed_outputs or \
      len(plan.output_specs) != 1 or \
      plan.output_index != (sched.n_inputs,) or n_args > sched.n_inputs: return None
  const_addresses = [buffer.address for buffer in consts[:sched.n_inputs - n_args]]
  if len(const_addresses) + n_args != sched.n_inputs: return None
  launches, specs = compiled.launches, plan.output_specs

  def run(inputs: list[Buffer]) -> Buffer:
    (out,) = allocate_buffers(specs)
    addresses = [buffer._address for buffer in inputs]
    if const_addresses: addresses += const_addresses
    addresses.append(out._address)
    launches(addresses)
    counters.kernels_launched += launches.launched
    return out
  return run


def _runner(compiled: CompiledSchedule, n_inputs: int) -> Callable[[list[Buffer]], Buffer]:
  """A function of an eager program's input buffers returning its one output: jit's direct runner where the program
  has one (`direct_runner`), else `run_schedule`."""
  return direct_runner(compiled, n_inputs, []) or (lambda buffers: run_schedule(compiled, buffers)[0])


def _slot_buffers(compiled: CompiledSchedule, buffers: list[Buffer], arena) -> list[Buffer]:
  """A buffer for every slot (what `_run_steps` launches over): the inputs, the outputs, and views into the arena
  for the intermediates."""
  n_inputs, plan = compiled.schedule.n_inputs, compiled.plan
  slots = buffers[:n_inputs]
  for (shape, dtype, nbytes), offset in zip(compiled.slot_specs, plan.offsets):
    slots.append(None if offset < 0 else Buffer(shape, dtype, arena[offset:offset + nbytes].view(dtype).reshape(shape)))
  for slot, buffer in zip(plan.output_slots, buffers[n_inputs:]): slots[slot] = buffer
  return slots


def _run_steps(steps: tuple, programs, buffers: list[Buffer], device, timed: bool) -> None:
  """Launch the kernels one by one from Python (loops and switches read their flags back from the buffers): the GPU
  path, and the CPU's with DEBUG>=1 or a profile open, which times each launch, prints it (DEBUG>=1) and records it
  into the open profiles (`timed`; a GPU launch is then waited for)."""
  for step in steps:
    if isinstance(step, Switch):
      branch_programs = [[next(programs) for _ in kernels_of(branch)] for branch in step.branches]
      chosen = min(max(int(_read(buffers[step.index_slot])), 0), len(step.branches) - 1)
      _run_steps(step.branches[chosen], iter(branch_programs[chosen]), buffers, device, timed)
      continue
    if isinstance(step, Loop):
      cond, body = list(step.cond), list(step.body)
      cond_programs = [next(programs) for _ in kernels_of(step.cond)]
      body_programs = [next(programs) for _ in kernels_of(step.body)]
      passes = 0
      while step.trip is None or passes < step.trip:
        if step.trip is None:
          _run_steps(tuple(cond), iter(cond_programs), buffers, device, timed)
          if not bool(_read(buffers[step.flag_slot])): break
        if step.counter_slot >= 0: _write_counter(buffers[step.counter_slot], passes)
        _run_steps(tuple(body), iter(body_programs), buffers, device, timed)
        passes += 1
      continue
    if isinstance(step, HostCall):
      start = time.perf_counter()
      _run_host_call(step, buffers)
      if timed:  # (a profile's row: its time and the bytes it reads and writes; DEBUG=1 printed it as the call ran)
        record_launch(f"host {step.callback.name}", time.perf_counter() - start, 0,
                      sum(buffers[slot].nbytes for slot in step.slots), device.platform)
      continue
    program = next(programs)
    addresses = [buffers[slot].address for slot in step.slots]
    if device is not CPU and not timed:
      program(addresses)
      counters.kernels_launched += 1
      continue
    if device is not CPU: elapsed = program.timed(addresses)  # the device's own time of the kernel (its events)
    else:
      start = time.perf_counter()
      if step.outer_size > 0: program(addresses, step.outer_size, step.parallel, grain=step.grain)
      elapsed = time.perf_counter() - start
    counters.kernels_launched += 1
    counters.launch_seconds += elapsed
    _report_launch(step, buffers, elapsed, device, first_tier=getattr(program, "watchers", None) is not None)


def _raise_host_errors(compiled: CompiledSchedule) -> None:
  """Raise the first exception a host step of the last run kept (HostProgram), forgetting all of them."""
  errors = [host.error for host in compiled.host_programs if host.error is not None]
  for host in compiled.host_programs: host.error = None
  if errors: raise errors[0]


def _run_host_call(step: HostCall, buffers: list[Buffer]) -> None:
  """Call a host function on the values of its input slots and write its results into its output slots."""
  inputs = [_read(buffers[slot]) for slot in step.slots[:step.n_in]]
  for slot, value in zip(step.slots[step.n_in:], step.callback.run(inputs)):
    buffer = buffers[slot]
    if buffer.device.platform == "cpu": np.copyto(buffer._typed(), value)
    else: buffer.device.upload(buffer.address, np.ascontiguousarray(value))
  counters.kernels_launched += 1


def _read(buffer: Buffer) -> np.ndarray:
  """The current values of a buffer that the kernels of this run may write (a host step's operand, a loop's flag, a
  switch's index): a GPU buffer is read from the device each time, not from its kept host copy."""
  if buffer.device.platform == "cpu": return buffer.numpy()
  return buffer.device.read(buffer)


def _write_counter(buffer: Buffer, value: int) -> None:
  """Write a counted loop's pass number into its int32 counter buffer (what the CPU runtime does before each pass)."""
  if buffer.device.platform == "cpu": ctypes.c_int32.from_address(buffer.address).value = value
  else: buffer.device.upload(buffer.address, np.array(value, np.int32))


def _report_launch(kernel: Kernel, buffers: list[Buffer], seconds: float, device=CPU,
                   first_tier: bool = False) -> None:
  """Record a timed launch into the open profiles and, with DEBUG>=1, print it with its roofline figures (and
  whether it ran a first tier: a GEMM library call or an unoptimised build, devices/cpu.py `CompileStream`)."""
  nbytes, flops = sum(buffers[slot].nbytes for slot in kernel.slots), kernel_flops(kernel.ast)
  record_launch(kernel.name, seconds, flops, nbytes, device.platform)
  if DEBUG < 1: return
  where = "CPU" if device is CPU else repr(device)
  launch = ("  threads" if kernel.parallel else "") + ("  first tier" if first_tier else "")
  if device is not CPU: launch = f"  {_launch_of(kernel, device)}"
  print(f"*** {where} {counters.kernels_launched:4d} {kernel.name:40s} {seconds * 1e6:9.1f} us "
        f"{roofline(seconds, flops, nbytes, cpu=device is CPU)}{launch}")


def realize(roots: list[UOp], order: list[UOp] | None = None) -> list[Buffer]:
  """Compute the given lazy nodes on the device of their inputs (`place`); return one buffer per root. (`order`:
  as `normalize`'s.) The compiled schedule is found by the graph's `program_key`; the normalised graph is only built
  when that misses."""
  key, inputs, constants = program_key(roots, order)
  buffers = [inputs[i] for i in range(len(inputs)) if i not in constants] if constants else inputs
  if buffers and all(type(buffer) is Buffer and buffer.device is CPU and not buffer.committed for buffer in buffers):
    device, committed, replicated = CPU, False, None  # (`place`'s answer for plain host buffers, found cheaply)
  else:
    device, committed, replicated = place([placement_of(buffer) for buffer in buffers])
    inputs = [buffer if i in constants else runnable(buffer, device) for i, buffer in enumerate(inputs)]
  for i in constants: inputs[i] = constant_buffer(inputs[i], device)
  outputs = run_schedule(_eager_schedule(key, roots, order, device), inputs)
  return place_outputs(outputs, inputs, device, committed, replicated)


def _eager_schedule(key: tuple, roots: list[UOp], order: list[UOp] | None, device) -> CompiledSchedule:
  """The compiled schedule of an eager graph whose `program_key` is `key`: from the memory cache (the oldest entry
  dropped when it is full), else normalised and compiled."""
  if (compiled := _memory_cache.get((key, device))) is None:
    with gc_paused(): compiled = get_schedule(normalize(roots, order=order, constants=True)[0], device)
    if len(_memory_cache) >= _MEMORY_CACHE_LIMIT: del _memory_cache[next(iter(_memory_cache))]
    _memory_cache[(key, device)] = compiled
  return compiled


# Operations whose second operand, when it is constants alone, is kept a literal of an eager program (its value part
# of the key, not an input): LLVM makes code of its value, pow(x, 2.0) an x * x and a division by 3 a multiply and
# shifts (eagerly on 1M elements: 3.8 ms -> 79 us and 849 -> 164 us). Everywhere else a constant is an input.
_LITERAL_OPERAND_OPS = frozenset({Ops.POW, Ops.IDIV, Ops.MOD})
_LITERAL_OPERAND_PRIMITIVES = frozenset({"pow"})
_LITERAL_CANDIDATES = _LITERAL_OPERAND_OPS | {Ops.PRIMITIVE}  # (ops worth asking `_keeps_literal`)


def _keeps_literal(node: UOp) -> bool:
  """Whether `node` keeps a second operand of constants a literal (`_LITERAL_OPERAND_OPS`, the pow primitive)."""
  return node.op in _LITERAL_OPERAND_OPS or node.op is PRIMITIVE and node.arg.prim.name in _LITERAL_OPERAND_PRIMITIVES


def _literal_operand(node: UOp) -> set[UOp] | None:
  """The CONST leaves of `node`'s second operand when `node` keeps it a literal (`_keeps_literal`) and that operand is
  computed from constants alone (a few nodes: a broadcast scalar, the safe divisor of floor_divide); else None."""
  if not _keeps_literal(node): return None
  leaves, stack, seen = set(), [node.src[1]], set()
  while stack:
    current = stack.pop()
    if current in seen: continue
    seen.add(current)
    if current.op is CONST: leaves.add(current)
    elif not current.src or len(seen) > 64: return None  # (a buffer, a parameter, an iota: not constants alone)
    else: stack.extend(current.src)
  return leaves


def _literal_constants(nodes: list[UOp]) -> set[UOp]:
  """The CONST nodes of a program that stay literals (`_literal_operand`)."""
  literal: set[UOp] = set()
  for node in nodes:
    if (found := _literal_operand(node)) is not None: literal |= found
  return literal


# (op, dtype, arg, operands' signatures) -> the function running that one-operation program on its inputs
_one_op_programs: dict[tuple, Callable[[list], Buffer]] = {}


def run_one_op(node: UOp) -> Buffer | None:
  """Compute `node`, one operation over host buffers, constants and views of them (movement ops: an index `x[0]`, a
  broadcast scalar, a transpose), or a view of such an operation's result (the reshape of `x[i]`'s gather), at least
  one a buffer: its result's buffer, or None for any other graph. The program is found by the operation's signature
  (one tuple, no walk of the graph) and run through jit's direct runner, skipping `realize`'s per-node walks, keys and
  placement: `float(x.sum())` on an array already computed 12.6 -> 9.6 us, `np.asarray(y * 2)` 13.5 -> 8.4 us. (A
  second operand that stays a literal, `_literal_operand`, is named by its value.)"""
  core, view = node, ()
  while core.op in MOVEMENT:
    view += (core.op, core.arg)
    core = core.src[0]
  if core.op is BUFFER or core.op is CONST: core, view = node, ()  # (a view of a buffer: the view is the operation)
  signature, inputs, leaves = [view, core.op, core.dtype, core.arg], [], []
  buffers = False
  literal = _keeps_literal(core)  # (its second operand's constant is named by its value)
  for src in core.src:
    leaf, chain = src, ()
    while leaf.op in MOVEMENT:
      chain += (leaf.op, leaf.arg)
      leaf = leaf.src[0]
    if leaf in leaves: signature.append((leaves.index(leaf), chain))  # (read twice, x * x.T: one input)
    elif leaf.op is BUFFER:
      buffer = leaf.arg
      if type(buffer) is not Buffer or buffer.device is not CPU or buffer.committed: return None
      signature.append((buffer.dtype, buffer.shape, chain))
      inputs.append(buffer)
      leaves.append(leaf)
      buffers = True
    elif leaf.op is CONST:
      if literal and src is core.src[1]: signature.append((leaf.dtype, chain, arg_key(leaf.arg)))
      else:
        signature.append((leaf.dtype, chain))
        inputs.append(constant_buffer(leaf, CPU))
        leaves.append(leaf)
    else:
      return None
  if not buffers: return None  # (constants alone: where they go is the default device's to say)
  if type(signature[3]) is not tuple and signature[3] is not None: signature[3] = arg_key(signature[3])
  key = tuple(signature)
  if _profiles or DEBUG >= 1:  # (each launch timed and recorded)
    return run_schedule(get_schedule(normalize([node], constants=True)[0], CPU), inputs)[0]
  if (run := _one_op_programs.get(key)) is None:
    compiled = get_schedule(normalize([node], constants=True)[0], CPU)
    run = _runner(compiled, len(inputs))
    if len(_one_op_programs) >= _MEMORY_CACHE_LIMIT: _one_op_programs.clear()
    _one_op_programs[key] = run
  return run(inputs)


# An eager node's signature (`signature_of`, kept on the node as "sig") says what its small program is, so that
# reading the node back finds and runs the compiled program without `realize`'s walks and keys (`run_signed`): a tuple
# (sid, leaves, alive, size) where `sid` numbers the program's structure (equal numbers: programs that compute the same
# from the same inputs), `leaves` are its inputs (BUFFER and CONST nodes, in the order `normalize` numbers them),
# `alive` the lazy nodes below it whose arrays were alive when it was made (if one still is, its value must be kept
# too, `held_arrays`, and the walk of `realize` is taken, unless it is a view of buffers or constants, which stays
# lazy: `np.asarray(jnp.exp(jnp.ones(64)))` 51 -> 18 us; an array that has died can't come back, nor its node be
# computed), and `size` its count of lazy nodes. A graph gets one while it has at most this many inputs and lazy nodes
# (a longer chain of eager ops is read back by `realize`'s walk: its launch is not what it costs). (A node below that
# was computed since, while this one stays lazy, leaves its old inputs in the signature until this one is computed:
# at most SIGNATURE_LEAVES buffers.)
SIGNATURE_LEAVES, SIGNATURE_NODES = 8, 24
# (op, dtype, arg, its sources' signature numbers and leaf positions) -> signature number. Numbers are never reused:
# when the table is full it starts again (and so does `_signed_programs`), and a number still on a node misses.
_signature_numbers: dict[tuple, int] = {}
_sids = itertools.count()  # (next() of it is one step under the GIL: two threads never get one number)
_signed_programs: dict[int, Callable[[list], Buffer]] = {}  # signature number -> runner of its compiled program


def signature_of(node: UOp, depth: int = 0) -> tuple | None:
  """The signature (above) of lazy `node`, made from its sources' (found the same way, and kept on each node: a node
  read back again, or built on, costs a lookup); None for a graph past the sizes above, or with an operation that
  keeps a literal operand (`_keeps_literal`: its value is part of the key), or an arg that can't key."""
  recorded = node.__dict__
  if (signature := recorded.get("sig", False)) is not False: return signature
  if depth > SIGNATURE_NODES: return None  # (a long chain: not kept, as the nodes below may have signatures)
  op, arg, sources = node.op, node.arg, node.src
  if op is BUFFER or op is CONST: return None  # (a leaf: what a program reads, not one to run)
  signature = None
  if op is PRIMITIVE:
    literal = arg.prim.name in _LITERAL_OPERAND_PRIMITIVES  # (its arg, a call, keys as it is)
  else:
    literal = op in _LITERAL_OPERAND_OPS
    if arg is not None and type(arg) is not tuple: arg = arg_key(arg)
  if not literal:
    if len(sources) == 1 and (src := sources[0]).op is not BUFFER and src.op is not CONST:  # (unary, a reduction)
      if (below := src.__dict__.get("sig", False)) is False: below = signature_of(src, depth + 1)
      if below is not None:
        held = src.__dict__.get("held_by")
        signature = _numbered((op, node.dtype, arg, below[0]), below[1],
                              below[2] + (src,) if held is not None and held() is not None else below[2], below[3] + 1)
      elif "sig" not in src.__dict__: return None  # (past the depth: not kept)
    else:
      parts: list = [op, node.dtype, arg]
      leaves: list[UOp] = []
      alive: tuple = ()
      size = 1
      for src in sources:
        if src.op is BUFFER or src.op is CONST:
          if src in leaves: parts.append((leaves.index(src),))  # (a tuple: a bare int is a lazy source's number)
          else:
            parts.append((len(leaves), src.dtype, src.shape))
            leaves.append(src)
          continue
        if (below := src.__dict__.get("sig", False)) is False: below = signature_of(src, depth + 1)
        if below is None:
          if "sig" not in src.__dict__: return None  # (past the depth: not kept)
          break
        if leaves:  # (where its leaves are among this node's)
          where = []
          for leaf in below[1]:
            if leaf in leaves: where.append(leaves.index(leaf))
            else:
              where.append(len(leaves))
              leaves.append(leaf)
          parts.append((below[0], tuple(where)))
        else:  # (its leaves first: numbered as they are)
          leaves.extend(below[1])
          parts.append(below[0])
        if below[2]: alive += below[2]
        held = src.__dict__.get("held_by")
        if held is not None and held() is not None: alive += (src,)
        size += below[3]
      else:  # (`_numbered` says None for a graph past the sizes)
        signature = _numbered(tuple(parts), tuple(leaves), alive, size)
  recorded["sig"] = signature
  return signature


def _numbered(key: tuple, leaves: tuple, alive: tuple, size: int) -> tuple | None:
  """The signature of a node of structure `key` (its number, from `_signature_numbers`), or None past the sizes."""
  if len(leaves) > SIGNATURE_LEAVES or size > SIGNATURE_NODES: return None
  try:
    sid = _signature_numbers.get(key)
  except TypeError:  # (an arg that does not hash)
    return None
  if sid is None:
    if len(_signature_numbers) >= 16 * _MEMORY_CACHE_LIMIT:
      _signature_numbers.clear()
      _signed_programs.clear()
    sid = _signature_numbers[key] = next(_sids)
  return sid, leaves, alive, size


def run_signed(node: UOp) -> tuple[Buffer, bool] | None:
  """Compute eager `node` from its signature (above): its compiled program found by the signature's number and run
  over its leaves' buffers; the result's buffer, and whether some leaf was a buffer (else the node stays a graph of
  constants: array.py `_keep`), without `realize`'s walks (`float(jnp.sum(jnp.sin(x) * 2.0 + x))`: 38 -> 28 us). None
  where the walk is needed: the array of a lazy node below is alive (its value is kept too), or was and its node has
  been computed since (it reads that buffer now), an input is not a plain host buffer, the inputs are constants alone
  and the default device is not the CPU (they run there), or launches are timed."""
  if (signature := signature_of(node)) is None: return None
  sid, leaves, alive, _ = signature
  for below in alive:
    if below.op is BUFFER or below.__dict__["held_by"]() is not None and not is_view(below): return None
  inputs, buffers = [], False
  for leaf in leaves:
    if leaf.op is BUFFER:
      buffer = leaf.arg
      if type(buffer) is not Buffer or buffer.device is not CPU or buffer.committed: return None
      inputs.append(buffer)
      buffers = True
    else:
      inputs.append(constant_buffer(leaf, CPU))
  if _profiles or DEBUG >= 1 or not buffers and default_device() is not CPU: return None
  if (run := _signed_programs.get(sid)) is None:
    compiled = _eager_schedule(program_key([node])[0], [node], None, CPU)
    run = _runner(compiled, len(inputs))
    _signed_programs[sid] = run
  return run(inputs), buffers


def program_key(roots: list[UOp], order: list[UOp] | None = None) -> tuple[tuple, list, set[int]]:
  """What `normalize(constants=True)` gives, as a tuple instead of a graph (eager code realises a new graph each
  time; building its normalised copy node by node cost more than the rest of an eager op): one entry per node,
  sources first, naming its sources by position and each buffer by its dtype and shape alone (they are numbered in
  order of first use, as normalize numbers its PARAMs), then the roots' positions; the inputs; and which of them are
  constants (their CONST nodes, for `constant_buffer`).

  A constant is an input like a buffer, named by its dtype alone: eager `x * 2.0` takes its 2.0 as JAX's eager
  operations take a Python scalar, as an argument, so `x * i` in a Python loop over `i` is one program, compiled
  once, not a program per value. (jit's programs keep theirs as literals, as JAX's jaxprs do; so does an eager
  program where a literal makes code: `_literal_operand`.)"""
  index: dict[UOp, int] = {}
  position = index.__getitem__
  entries: list[tuple] = []
  inputs: list = []
  constants: set[int] = set()
  literal: set[UOp] | None = None
  for node in (toposort_of(roots) if order is None else order):
    op, arg = node.op, node.arg
    if op is BUFFER:
      entries.append((BUFFER, node.dtype, node.shape))
      inputs.append(arg)
    elif op is CONST:
      entries.append((CONST, node.dtype))
      constants.add(len(inputs))
      inputs.append(node)
    else:
      entries.append((op, node.dtype, tuple(map(position, node.src)), arg_key(arg)))
      if op in _LITERAL_CANDIDATES and (found := _literal_operand(node)):
        literal = found if literal is None else literal | found
    index[node] = len(index)
  entries.append(tuple(map(position, roots)))
  if literal:  # (constants that make code: their values in the key, not inputs)
    for node in literal: entries[index[node]] = (CONST, node.dtype, arg_key(node.arg))
    kept = [(i, x) for i, x in enumerate(inputs) if i not in constants or x not in literal]
    inputs, constants = [x for _, x in kept], {j for j, (i, _) in enumerate(kept) if i in constants}
  return tuple(entries), inputs, constants


def constant_buffer(node: UOp, device) -> Buffer:
  """A 0-d buffer on `device` holding the value of CONST `node`, made once per node and device (eager code reuses its
  constants' nodes: lax/_base.py `full`). Never written: a program reads its inputs, and an output that is an input
  is handed out as it is (donating it copies: jit sees the reference kept here)."""
  made = node.__dict__.get("buffers")
  if made is None: made = node.__dict__["buffers"] = {}
  buffer = made.get(device)
  if buffer is None:
    host = np.array(node.arg, node.dtype)
    host.flags.writeable = False
    buffer = made[device] = host_buffer(host, device)
  return buffer


BUFFER, CONST, PRIMITIVE = Ops.BUFFER, Ops.CONST, Ops.PRIMITIVE


def place_outputs(outputs: list[Buffer], inputs: list[Buffer], device, committed: bool = False,
                  replicated: Any = None) -> list[Buffer]:
  """The new output buffers of a computation placed on `device`: there (a CPU device other than CPU ran CPU's
  programs), committed when some input was (JAX's rule), replicated over the committed inputs' mesh when they are on
  one (`replicated`, a sharding); inputs passed through are left as they are."""
  if not committed and (device is CPU or device.platform != "cpu"): return outputs
  passed = {id(buffer) for buffer in inputs}
  for k, buffer in enumerate(outputs):
    if id(buffer) in passed: continue
    if device.platform == "cpu": buffer.device = device
    buffer.committed = committed
    if replicated is not None and device.platform == "cpu" and getattr(buffer, "sharding", None) is None:
      outputs[k] = shard(buffer, replicated)
  return outputs
