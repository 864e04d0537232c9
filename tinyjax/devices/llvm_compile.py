"""LLVM IR to relocatable object code for the host CPU, with llvmlite: the compiling half of the CPU device, which a
compile worker process runs too.

A program's kernels are compiled at once when it is lowered (a training step: ~30 kernels, ~0.5 s of LLVM work), and
llvmlite serialises its calls behind one lock, so threads can't share that work. The CPU device (cpu.py) therefore
starts one worker process on a machine with more than one core, the first time it lowers a program, and compiles
each program's kernels here in this process and there at once, each taking the next kernel, largest first. The worker
runs this file as a script (`serve`): it imports llvmlite and nothing of tinyjax, so it is ready in ~50 ms (a process
importing tinyjax would take ~130 ms), while the parent is still tracing and lowering. Both sides build the same
target machine (triple, CPU name and features sent by the parent) and run the same pipeline, so an object is the same
bytes wherever it was compiled, and the parent keys and caches it as its own.

Protocol, over the worker's stdin / stdout as pickles: first the target (triple, data layout, CPU name, features),
then jobs (job id, kernel name, IR, symbol or None, opt level) each answered by (job id, ok, object code or error
text, seconds). The worker ends at the end of its input (the parent closed it or exited).
"""
from __future__ import annotations

import functools
import pickle
import sys
import time

import llvmlite.binding as llvm

# LLVM's pipeline: its standard one at the opt level, loop and SLP vectorisation and interleaving on, loop unrolling
# only where a loop asks for it. Unrolling doubled the compile time of the tiled kernels (whose tiles are unrolled by
# the renderer already): the 36 kernels of an MLP Adam step compiled in 0.83 s with it and 0.56 s without, and ran
# the same (GEMMs, elementwise, transcendental and sum kernels, the step itself, within this machine's noise).
# Code generation sinks loop-invariant values back into a loop where hoisting them would spill (LLVM's MachineLICM
# option `sink-insts-to-avoid-spills`): a register tile's looped epilogue (tanh, GELU: ~10 vector constants of its
# polynomials) had its constants hoisted out of the tile's loops, held in registers through the FMA loop, whose
# accumulators were spilled instead. 1024x256 @ 256x1024 on AVX2 (2 cores): with tanh 9.1 -> 5.9 ms, with GELU
# 14.4 -> 6.2 ms (3.8-4.5 ms alone). Part of every object-code key.
CODEGEN_OPTIONS = ("-sink-insts-to-avoid-spills=true",)
PIPELINE = "vectorize,slp,interleave,no-unroll," + ",".join(CODEGEN_OPTIONS)


@functools.cache
def initialize() -> None:
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  llvm.initialize_native_asmparser()
  for option in CODEGEN_OPTIONS: llvm.set_option("tinyjax", option)  # (once per process: LLVM parses each once)


@functools.cache
def target_machine(triple: str, cpu: str, features: str, opt_level: int) -> llvm.TargetMachine:
  """The TargetMachine for `triple` with CPU `cpu` and `features` at `opt_level` (0-3)."""
  initialize()
  return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=opt_level,
                                                               reloc="static", codemodel="jitdefault", jit=True)


def optimize(module: llvm.ModuleRef, machine: llvm.TargetMachine, opt_level: int) -> None:
  """Run LLVM's standard pipeline at `opt_level` as PIPELINE says."""
  if opt_level == 0: return
  tuning = llvm.create_pipeline_tuning_options(speed_level=opt_level)
  tuning.loop_vectorization = True
  tuning.slp_vectorization = True
  tuning.loop_unrolling = False
  tuning.loop_interleaving = True
  builder = llvm.create_pass_builder(machine, tuning)
  builder.getModulePassManager().run(module, builder)


def parse(name: str, llvm_ir: str, symbol: str | None, triple: str, data_layout: str) -> llvm.ModuleRef:
  """Parse and verify a module and stamp the target; with `symbol`, rename kernel `name` to it and make the module's
  other definitions internal (so they can't clash with other kernels in the one engine)."""
  initialize()
  module = llvm.parse_assembly(llvm_ir)
  module.verify()
  module.triple, module.data_layout = triple, data_layout
  if symbol is None: return module
  kernel = module.get_function(name)
  if kernel.is_declaration: raise ValueError(f"kernel module does not define @{name}")
  for function in module.functions:
    if not function.is_declaration and function.name != name: function.linkage = "internal"
  for variable in module.global_variables:
    if not variable.is_declaration: variable.linkage = "internal"
  kernel.name = symbol
  return module


def compile_object(name: str, llvm_ir: str, symbol: str | None, opt_level: int,
                   target: tuple[str, str, str, str]) -> tuple[bytes, llvm.ModuleRef]:
  """Object code of kernel `name` (exported as `symbol`; None: not renamed) for `target` (triple, data layout, CPU
  name, features), and the optimised module."""
  triple, data_layout, cpu, features = target
  machine = target_machine(triple, cpu, features, opt_level)
  module = parse(name, llvm_ir, symbol, triple, data_layout)
  optimize(module, machine, opt_level)
  return machine.emit_object(module), module


def serve(requests, replies) -> None:
  """The compile worker: answer jobs from the `requests` stream on `replies` until the input ends."""
  try: target = pickle.load(requests)
  except EOFError: return
  while True:
    try: job_id, name, llvm_ir, symbol, opt_level = pickle.load(requests)
    except EOFError: return
    start = time.perf_counter()
    try: ok, result = True, compile_object(name, llvm_ir, symbol, opt_level, target)[0]
    except Exception as error:  # the parent compiles this one itself, and raises what it gets
      ok, result = False, f"{type(error).__name__}: {error}"
    pickle.dump((job_id, ok, result, time.perf_counter() - start), replies, protocol=pickle.HIGHEST_PROTOCOL)
    replies.flush()


if __name__ == "__main__":
  serve(sys.stdin.buffer, sys.stdout.buffer)
