"""The CPU device: kernels in LLVM IR compiled for the host CPU by llvmlite, cached on disk, run on the runtime pool.

Kernel ABI (the contract with codegen/): each kernel is an LLVM IR module (text, opaque pointers) defining

    define void @<name>(ptr noalias %args, i64 %start, i64 %end)

where `%args` points to an array of buffer pointers in the kernel's parameter order, and the kernel computes
iterations [start, end) of its outermost loop. It may call LLVM intrinsics and libm. Renderers put
`cpu_target_triple()` and `cpu_data_layout()` in the module (or call `stamp_target(ir)`).

`compile_cpu(name, ir)` returns a `CPUProgram`. The path: in-process memo (same IR -> same program) -> disk cache
of relocatable object code (namespace "kernels", see cache.py) -> compile (llvm_compile.py: parse, O3 with loop and
SLP vectorisation for the host CPU name and features, emit an object) and store. Objects are loaded into one MCJIT
ExecutionEngine per process, so a disk hit does no IR parsing, optimisation or code generation.
`compile_cpu_many(kernels)` does the same for a program's kernels, compiling those it must in this process and in a
compile worker process at once (llvm_compile.py says why a process).

The kernel's symbol is renamed to `<name>__<key prefix>` and its other definitions made internal, so kernels
that share a name (or a helper) never clash in the one engine.
"""
from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import functools
import hashlib
import math
import operator
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Callable

from tinyjax.codegen.gemm import SYMBOL as gemm_symbol, SYMBOLS as library_symbols
from tinyjax.devices import runtime
from tinyjax.devices.cache import DiskCache
from tinyjax.helpers import DEBUG, LazyModule, getenv

llvmlite, llvm = LazyModule("llvmlite"), LazyModule("llvmlite.binding")  # (~35 ms to import: on first use)
llvm_compile = LazyModule("tinyjax.devices.llvm_compile")
TINYJAX_VERSION = "0.1.0"  # part of every object-code key; bump when the ABI or codegen contract changes
PARALLEL_GRAINS, SERIAL_CHUNKS = runtime.PARALLEL_GRAINS, runtime.SERIAL_CHUNKS  # how launches are chunked

_stats = {"hits": 0, "misses": 0, "memory_hits": 0, "rejected": 0, "compile_seconds": 0.0, "load_seconds": 0.0}
_kernel_cache = DiskCache("kernels")
_lock = threading.RLock()  # LLVM's global context and the engine are not thread-safe
_upgrade_lock = threading.Lock()  # a program's address and the launch lists that watch it (`CPUProgram.upgrade`)
# (name, IR, opt level) -> program. Not bounded: MCJIT cannot unload an object, so a program lives as long as its code.
_programs: dict[tuple[str, str, int], CPUProgram] = {}


def cache_stats() -> dict:
  """Return counters of the kernel compile cache (a copy).

  hits: kernels (and the runtime module) loaded from the disk cache; misses: kernels compiled; memory_hits:
  `compile_cpu` calls answered by
  the in-process memo (counted separately, not in hits); rejected: disk entries found corrupt or stored under
  another key (each is also a miss); compile_seconds: time spent compiling (parse, optimise, emit);
  load_seconds: time spent loading object code into the process (hits and misses).
  The GPU devices' own caches, once one was used: "ptx" (PTX for CUDA) and "opencl" (OpenCL binaries), each with
  hits, misses and compile_seconds.
  """
  return dict(_stats) | {name: dict(counters) for name, counters in _gpu_stats()}


def _gpu_stats() -> list[tuple[str, dict]]:
  """The counters of the GPU devices' compile caches, for those whose module is loaded (none is imported here)."""
  modules = (("ptx", "tinyjax.devices.cuda"), ("opencl", "tinyjax.devices.opencl"))
  return [(name, sys.modules[module].stats) for name, module in modules if module in sys.modules]


def reset_cache_stats() -> None:
  """Zero the counters returned by `cache_stats`."""
  for counters in (_stats, *(counters for _, counters in _gpu_stats())):
    for counter in counters: counters[counter] = 0.0 if counter.endswith("seconds") else 0


# ---- target

@functools.cache
def _initialize_llvm() -> None:
  llvm_compile.initialize()
  # Kernels call libm (expf, sinf, fmodf, ...) and the backend may emit compiler-runtime calls (__truncsfhf2,
  # __udivti3, __powisf2, ...): make both searchable for relocations, whatever Python itself was linked with.
  for library, soname in (("m", "libm.so.6"), ("gcc_s", "libgcc_s.so.1")):
    try: llvm.load_library_permanently(soname)
    except RuntimeError:  # not glibc's soname: ask ldconfig (slow, ~4 ms, so only as a fallback)
      path = ctypes.util.find_library(library)
      try:
        if path: llvm.load_library_permanently(path)
      except RuntimeError: pass


@functools.cache
def cpu_target_triple() -> str:
  """The LLVM target triple of the host, e.g. 'x86_64-unknown-linux-gnu'."""
  _initialize_llvm()
  return llvm.get_process_triple()


@functools.cache
def cpu_name() -> str:
  """The host CPU name LLVM tunes for, e.g. 'znver4'."""
  _initialize_llvm()
  return llvm.get_host_cpu_name()


@functools.cache
def cpu_features() -> str:
  """The host CPU feature string, e.g. '+avx2,+avx512f,...' (sorted)."""
  _initialize_llvm()
  return llvm.get_host_cpu_features().flatten()


@functools.cache
def host_fma() -> bool:
  """Whether the host has a fused multiply-add instruction (x86's FMA3, AArch64's): a register tile's products and
  sums are then `llvm.fma` calls (codegen/opt.py `TileGeometry.fma`), else a multiply and an add."""
  return "+fma" in cpu_features().split(",") or cpu_target_triple().startswith(("aarch64", "arm64"))


# The host's vector registers (`vector_registers`), by instruction set: (bytes per register, how many).
VECTOR_REGISTERS = {"avx512": (64, 32), "avx2": (32, 16), "neon": (16, 32), "sse": (16, 16)}


@functools.cache
def vector_registers() -> tuple[int, int]:
  """The host's SIMD registers as (bytes per register, count), which size the kernels' register tiles
  (codegen/opt.py `tile_geometry`): AVX-512 32 x 64 bytes, AVX / AVX2 16 x 32, AArch64 NEON 32 x 16, else 16 x 16.
  TINYJAX_VECTOR_BYTES=64|32|16 picks the instruction set of that width instead (to test one host's tiles on
  another: LLVM splits vectors wider than the host's)."""
  if (wanted := getenv("TINYJAX_VECTOR_BYTES", 0)):
    isa = {64: "avx512", 32: "avx2", 16: "sse"}.get(wanted)
    if isa is None: raise ValueError(f"TINYJAX_VECTOR_BYTES={wanted}: use 64, 32 or 16")
    return VECTOR_REGISTERS[isa]
  features = cpu_features().split(",")
  if "+avx512f" in features: return VECTOR_REGISTERS["avx512"]
  if "+avx" in features: return VECTOR_REGISTERS["avx2"]
  if "+neon" in features or cpu_target_triple().startswith(("aarch64", "arm64")): return VECTOR_REGISTERS["neon"]
  return VECTOR_REGISTERS["sse"]


@functools.cache
def data_cache_bytes(level: int) -> int:
  """The host's data (or unified) cache of `level` in bytes, from Linux's sysfs: level 1 a core's, which sizes a direct
  convolution's channel blocks (codegen/opt.py `_window_chunk`), the last level the one whose overflow decides a
  GEMM's column blocks (lower/schedule.py `_split_columns`). 32 KB for level 1 and 32 MB otherwise where it can't be
  read (the largest level there is where `level` is above it)."""
  base = "/sys/devices/system/cpu/cpu0/cache"
  found = {}
  try:
    for index in sorted(name for name in os.listdir(base) if name.startswith("index")):
      def read(field: str, index: str = index) -> str:
        with open(f"{base}/{index}/{field}") as file: return file.read().strip()
      if read("type") in ("Data", "Unified"):
        size = read("size")
        found[int(read("level"))] = int(size[:-1]) << {"K": 10, "M": 20}[size[-1]] if size[-1] in "KM" else int(size)
  except (OSError, ValueError, KeyError): pass
  if level in found: return found[level]
  if found and level > max(found): return found[max(found)]
  return 32 << 10 if level == 1 else 32 << 20


@functools.cache
def amx_bf16() -> bool:
  """Whether kernels may use Intel AMX tiles for bfloat16 contractions (codegen/opt.py `amx_plan`): the host has
  AMX-TILE and AMX-BF16 and Linux grants this process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, once, for all
  its threads). TINYJAX_AMX=0 turns it off."""
  if not getenv("TINYJAX_AMX", 1) or not sys.platform.startswith("linux"): return False
  features = cpu_features().split(",")
  if "+amx-tile" not in features or "+amx-bf16" not in features: return False
  libc = ctypes.CDLL(None, use_errno=True)
  return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA (x86-64)


def target_machine(opt_level: int = 3) -> llvm.TargetMachine:
  """The llvmlite TargetMachine for the host CPU (name and features) at `opt_level` (0-3)."""
  return llvm_compile.target_machine(cpu_target_triple(), cpu_name(), cpu_features(), opt_level)


@functools.cache
def cpu_data_layout() -> str:
  """The LLVM data layout string of the host target machine."""
  return str(target_machine().target_data)


def stamp_target(llvm_ir: str) -> str:
  """Return `llvm_ir` with the host target triple and data layout lines prepended (unless it has its own)."""
  lines = []
  if "target triple" not in llvm_ir: lines.append(f'target triple = "{cpu_target_triple()}"')
  if "target datalayout" not in llvm_ir: lines.append(f'target datalayout = "{cpu_data_layout()}"')
  return "\n".join(lines + [llvm_ir]) if lines else llvm_ir


def default_opt_level() -> int:
  """3, or 0 when the NOOPT environment variable is set."""
  return 0 if getenv("NOOPT", 0) else 3


# ---- compiling and loading

class _Engine:
  """The process's one MCJIT ExecutionEngine; object files are added to it and never removed."""

  def __init__(self):
    _initialize_llvm()
    empty = llvm.parse_assembly(stamp_target(""))
    self.engine = llvm.create_mcjit_compiler(empty, target_machine())

  def load(self, object_code: bytes, symbol: str) -> int:
    """Load relocatable object code, resolve its relocations, and return the address of `symbol`."""
    self.engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
    self.engine.finalize_object()
    address = self.engine.get_function_address(symbol)
    if not address: raise RuntimeError(f"symbol {symbol} not found in its object code")
    return address


@functools.cache
def _engine() -> _Engine:
  engine = _Engine()
  # Worker threads and the SIGINT handler execute code in this engine until the process ends: never free it,
  # not even during interpreter shutdown (llvmlite would dispose it when the module's globals are cleared).
  _leaked_engines.append(engine)
  return engine


_leaked_engines: list[_Engine] = []
_loaded_symbols: dict[str, int] = {}  # symbol -> address of everything loaded into the engine (load each once)
_object_bytes: dict[int, int] = {}  # address of a loaded kernel -> size of its object code (memory_analysis)


def _check_external_functions(name: str, llvm_ir: str) -> None:
  """Raise if the kernel calls a function this process can't provide (MCJIT would abort the process on load)."""
  _engine()  # creating the engine makes the process's own symbols searchable
  for quoted, plain in _DECLARED.findall(llvm_ir):
    function = quoted or plain
    if function in library_symbols: _load_gemm_library()
    if not function.startswith("llvm.") and not llvm.address_of_symbol(function):
      raise ValueError(f"kernel {name} calls @{function}, which is not defined in this process")


_DECLARED = re.compile(r'^declare [^@\n]*@(?:"([^"]+)"|([\w.$-]+))\(', re.MULTILINE)  # its name, quoted or not


def _target() -> tuple[str, str, str, str]:
  return cpu_target_triple(), cpu_data_layout(), cpu_name(), cpu_features()


def compile_object(name: str, llvm_ir: str, symbol: str | None, opt_level: int) -> bytes:
  """Compile IR to relocatable object code for the host, kernel `name` exported as `symbol` (None: not renamed)."""
  with _lock:
    _initialize_llvm()
    _check_external_functions(name, llvm_ir)
    object_code, module = llvm_compile.compile_object(name, llvm_ir, symbol, opt_level, _target())
    if DEBUG >= 5: print(f"optimised LLVM IR of {name}:\n{module}")
    return object_code


def object_code_key(name: str, llvm_ir: str, opt_level: int, rename: bool = True) -> str:
  """The disk-cache key of a kernel's object code: sha256 over everything that determines the machine code. With
  `rename` (the kernel is exported as `kernel_symbol(key)`), not over its name: kernels whose IR differs only in their
  names (the same elementwise loop over arrays of two sizes, as the loop's bounds are arguments) share one object."""
  parts = [llvm_ir.replace(name, "\x00") if rename else name + "\x00" + llvm_ir, cpu_target_triple(), cpu_name(),
           cpu_features(), ".".join(map(str, llvm.llvm_version_info)), llvmlite.__version__, TINYJAX_VERSION,
           f"O{opt_level}", llvm_compile.PIPELINE]
  return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def kernel_symbol(key: str) -> str:
  """The name a kernel whose object code has disk-cache key `key` is exported as (the same for every kernel sharing
  that object)."""
  return f"tj_kernel_{key[:24]}"


def load_or_compile(name: str, llvm_ir: str, opt_level: int, rename: bool = True,
                    compiled: bytes | None = None) -> int:
  """Return the address of kernel `name`, loading its object code from the disk cache or compiling and storing it
  (`compiled`: its object code, just compiled by `compile_cpu_many`, to store).

  With `rename` the kernel is exported as `kernel_symbol(key)`; without, the module keeps its symbols as written.
  """
  key = object_code_key(name, llvm_ir, opt_level, rename)
  symbol = kernel_symbol(key) if rename else name
  with _lock:
    if symbol in _loaded_symbols: return _loaded_symbols[symbol]
    object_code = compiled
    if object_code is None:
      rejected_before = _kernel_cache.stats["rejected"]
      object_code = _kernel_cache.get(key)
      _stats["rejected"] += _kernel_cache.stats["rejected"] - rejected_before
      if object_code is not None: _stats["hits"] += 1
      else:
        start = time.perf_counter()
        object_code = compiled = compile_object(name, llvm_ir, symbol if rename else None, opt_level)
        _stats["compile_seconds"] += time.perf_counter() - start
    if compiled is not None:
      _stats["misses"] += 1
      _kernel_cache.put(key, object_code)
    if name != gemm_symbol and any(f"@{symbol}(" in llvm_ir for symbol in library_symbols):
      _load_gemm_library()  # (its relocations need it)
    start = time.perf_counter()
    address = _engine().load(object_code, symbol)
    _stats["load_seconds"] += time.perf_counter() - start
    _loaded_symbols[symbol] = address
    _object_bytes[address] = len(object_code)
    return address


# ---- the runtime (thread pool, Ctrl-C)

# tj_parallel_for / tj_serial_for (fn, args, n, max_grains or first_chunk, grain) and tj_run_launches (records, count,
# launched)
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_int64)
_RUN_LAUNCHES = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)


class Runtime:
  """The compiled runtime module of this process: entry points for launches and the number of threads."""

  def __init__(self, nthreads: int):
    ir = _runtime_source()
    # (the compile worker's, started with it; and the GEMM library after it, so that the first tiers of contractions
    # are at hand from the first program on, `gemm_library_ready`)
    for thread in (_runtime_compile, _library_compile):
      if thread is not None: thread.join()
    load_or_compile("tj_parallel_for", ir, 3, rename=False, compiled=_runtime_object.pop(ir, None))
    engine = _engine().engine
    self.nthreads = nthreads
    self.parallel_for_address = engine.get_function_address("tj_parallel_for")
    self.serial_for_address = engine.get_function_address("tj_serial_for")
    self.abort_flag_address = engine.get_global_value_address("tj_abort")
    self.parallel_for = _LAUNCH(self.parallel_for_address)
    self.serial_for = _LAUNCH(self.serial_for_address)
    self.run_launches = _RUN_LAUNCHES(engine.get_function_address("tj_run_launches"))
    ctypes.CFUNCTYPE(None, ctypes.c_int64)(engine.get_function_address("tj_init"))(nthreads - 1)
    self._install_sigint = ctypes.CFUNCTYPE(ctypes.c_int32)(engine.get_function_address("tj_install_sigint"))
    self.sigint_installed = False
    # A forked child has none of the parent's worker threads: let its first parallel launch start its own.
    os.register_at_fork(after_in_child=ctypes.CFUNCTYPE(None)(engine.get_function_address("tj_after_fork")))
    self.install_sigint_handler()

  def install_sigint_handler(self) -> bool:
    """Make Ctrl-C abort running kernels: only from the main thread, and only while Python's handler is default."""
    if self.sigint_installed: return True
    if threading.current_thread() is not threading.main_thread(): return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler: return False
    self.sigint_installed = self._install_sigint() == 1
    return self.sigint_installed

  @property
  def aborted(self) -> bool:
    """Whether the last launch was cut short by SIGINT."""
    return ctypes.c_int32.from_address(self.abort_flag_address).value != 0


def _cpu_count() -> int:
  try: return max(1, len(os.sched_getaffinity(0)))
  except AttributeError: return max(1, os.cpu_count() or 1)


_runtime: Runtime | None = None


def cpu_threads() -> int:
  """The threads a parallel CPU launch runs on: TINYJAX_CPU_THREADS, default one per usable core; once the runtime
  has started, its own count. Lowering reads it (without starting the runtime) to decide how to split work."""
  if _runtime is not None: return max(1, _runtime.nthreads)
  return max(1, getenv("TINYJAX_CPU_THREADS", _cpu_count()))


def get_runtime() -> Runtime:
  """The process's runtime (compiled, or loaded from the cache, on first use); `cpu_threads()` threads."""
  global _runtime
  if _runtime is None:
    with _lock:
      if _runtime is None: _runtime = Runtime(cpu_threads())
  return _runtime


class CPUProgram:
  """A compiled kernel loaded into this process. Call it with buffer addresses and the outer loop's trip count."""

  def __init__(self, name: str, src: str, fn_addr: int, opt_level: int):
    self.name, self.src, self.fn_addr, self.opt_level = name, src, fn_addr, opt_level
    self.runtime = get_runtime()
    # (a first tier, its own loops compiling in the background: the launch lists to retarget then, `upgrade`, and
    # what that compile waits for, `_upgrade_later`)
    self.watchers: weakref.WeakSet | None = None
    self.pending: _Upgrade | None = None
    self._parallel_for, self._serial_for = self.runtime.parallel_for, self.runtime.serial_for

  def upgrade(self, src: str, fn_addr: int, opt_level: int) -> None:
    """Run the kernel compiled from `src` (its own loops) at `opt_level` from now on, in this program and in the
    launch lists that run it (`LaunchList.retarget`): the second tier of a kernel that started as a GEMM library call
    or unoptimised (`CompileStream`)."""
    with _upgrade_lock:
      self.src, self.fn_addr, self.opt_level = src, fn_addr, opt_level
      self.__dict__.pop("asm", None)  # (the first tier's, if it was asked for)
      for launches in list(self.watchers or ()): launches.retarget(self)
      self.watchers = None

  @property
  def object_bytes(self) -> int:
    """The size of the kernel's relocatable object code (what `memory_analysis` reports as generated code)."""
    return _object_bytes.get(self.fn_addr, 0)

  @functools.cached_property
  def asm(self) -> str:
    """The assembly of the kernel (compiled again on first access; for DEBUG output)."""
    with _lock:
      _, module = llvm_compile.compile_object(self.name, self.src, self.name, self.opt_level, _target())
      return target_machine(self.opt_level).emit_assembly(module)

  def __call__(self, buffers: list[int], n: int, parallel: bool = True, wait: bool = True, grain: int = 1) -> None:
    """Run the kernel over outer iterations [0, n) with `buffers` (raw addresses, e.g. `array.ctypes.data`).

    Splits the range across the runtime's threads when `parallel`, else runs it on the calling thread; either way
    in chunks of a multiple of `grain` iterations starting at multiples of it (the kernel's tile, see
    codegen/opt.py `launch_grain`). Runs synchronously (`wait` is accepted for API symmetry with asynchronous
    devices). The GIL is released. Raises KeyboardInterrupt if SIGINT cut the launch short.
    """
    if n <= 0: return
    args = (ctypes.c_void_p * len(buffers))(*buffers)
    if parallel: aborted = self._parallel_for(self.fn_addr, args, n, PARALLEL_GRAINS, grain)  # serial if 1 thread
    else: aborted = self._serial_for(self.fn_addr, args, n, n // SERIAL_CHUNKS, grain)
    # Cut short by Ctrl-C: the outputs are partial. Python's own handler raises KeyboardInterrupt in the main thread
    # as the call returns; any other thread lands here, and must not carry on with partial results either.
    if aborted: raise KeyboardInterrupt(f"kernel {self.name} interrupted")

  def __repr__(self) -> str:
    return f"CPUProgram({self.name!r}, fn_addr=0x{self.fn_addr:x}, O{self.opt_level})"


_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


class HostProgram:
  """A host step (lower/schedule.py HostCall: `pure_callback`, an MPI exchange) as a launch of the runtime: a C
  function pointer with a kernel's ABI (`fn(args, start, end)`, args: its slots' addresses) that calls back into
  Python, so a program with host steps still runs in one call (launched with mode MODE_WHOLE, on the calling thread).
  An exception it raises is kept in `error` (ctypes can't pass it through C) for the caller to raise."""
  watchers = None  # (never a first tier: `CPUProgram.upgrade`)

  def __init__(self, name: str, run: Callable[[list], list], n_in: int, avals: tuple):
    self.name, self.run, self.n_in, self.avals = name, run, n_in, avals
    import numpy as np  # (not at the top: compile workers import this module without it)
    # (bytes, dtype, shape) per slot, sized once: np.prod per slot and call was a third of a small LU's host step
    self._specs = [(math.prod(shape) * np.dtype(dtype).itemsize, np.dtype(dtype), tuple(shape))
                   for shape, dtype in avals]
    self.error: BaseException | None = None
    self._addresses = ctypes.c_void_p * len(self._specs)  # (the launch's args, as made from their address)
    self._fn = _HOST_FN(self._call)  # (kept: the runtime holds only its address)
    self.fn_addr = ctypes.cast(self._fn, ctypes.c_void_p).value
    # (slot, address) -> the numpy view of that slot's memory there: a program's buffers come from the pool, so the
    # same addresses come back call after call (a view was ~1.2 us; a small LU's host step has four). A view made for
    # a slot's size is valid whenever the slot's buffer is at that address again.
    self._views: dict[tuple[int, int], Any] = {}

  def _call(self, args: int, start: int, end: int) -> None:
    import numpy as np
    try:
      addresses = self._addresses.from_address(args)
      views, arrays = self._views, []
      for slot, address in enumerate(addresses):
        if (view := views.get((slot, address))) is None:
          nbytes, dtype, shape = self._specs[slot]
          raw = (ctypes.c_char * nbytes).from_address(address) if nbytes else bytearray(dtype.itemsize)
          view = np.frombuffer(raw, dtype, nbytes // dtype.itemsize).reshape(shape)
          if len(views) >= HOST_VIEWS: views.clear()
          views[(slot, address)] = view
        arrays.append(view)
      for out, value in zip(arrays[self.n_in:], self.run(arrays[:self.n_in])): np.copyto(out, value)
    except BaseException as error:  # noqa: BLE001 -- raised again by the caller, after the launch returns
      self.error = self.error or error


HOST_VIEWS = 64  # (views a host step keeps; a loop body's step sees a few addresses per slot)


class LaunchList:
  """The kernel launches of one program, run in order by one call into the runtime (`tj_run_launches`).

  Built once per compiled program from `items`: kernel launches (program, parameter slots, n, grain, mode), loops
  ("loop", trip or None, flag slot (a counted loop: its counter slot, or -1), condition items, body items) whose
  launches the runtime repeats, and switches
  ("switch", index slot, [items of each branch]) of which the runtime runs the branch the index picks. The launch
  records and one table of argument pointers (every kernel's parameters, one after another, and each while loop's
  flag buffer) are ctypes arrays made here; a run only writes the slots' addresses into the table and makes the call.
  A second thread running the same program meanwhile gets arrays of its own (the records point into the table, which
  the first run is reading). `launched` is how many kernels the last run launched."""

  def __init__(self, items: list):
    self._items = items
    self.slots: list[int] = []  # the table's entries, as buffer slots
    self.programs: list[CPUProgram] = []
    self._records_of: list[tuple[CPUProgram, int]] = []  # each kernel launch's program and record number
    fields: list[tuple] = []  # records, with table offsets where the table's address goes
    self._flatten(items, fields)
    self.count = len(fields)
    self.table = (ctypes.c_void_p * max(1, len(self.slots)))()
    self._table_size = len(self.slots)
    # addresses -> the table's entries in one C call (itemgetter of one index returns the item, not a tuple)
    self._gather = (operator.itemgetter(*self.slots) if len(self.slots) > 1 else
                    (lambda addresses, slot=self.slots[0]: (addresses[slot],)) if self.slots else (lambda _: ()))
    table_address, pointer_bytes = ctypes.addressof(self.table), ctypes.sizeof(ctypes.c_void_p)
    values = []
    for fn, table_offset, n, grain, mode in fields:
      values += [fn, 0 if table_offset is None else table_address + table_offset * pointer_bytes, n, grain, mode]
    self.records = (ctypes.c_int64 * max(1, len(values)))(*values)
    self._pending: set[_Upgrade] = set()  # (what this program's runs count towards: `_upgrade_later`)
    with _upgrade_lock:  # (a program whose own loops are compiling: retargeted once they are loaded)
      for program, record in self._records_of:
        if program.watchers is None: continue
        program.watchers.add(self)
        self.records[record * len(runtime.LAUNCH_FIELDS)] = program.fn_addr
        if program.pending is not None: self._pending.add(program.pending)
    self._launched = ctypes.c_int64(0)
    self._launched_address = ctypes.addressof(self._launched)
    self.launched = 0
    self._run_launches = get_runtime().run_launches
    self._lock = threading.Lock()

  def _flatten(self, items: list, fields: list[tuple]) -> None:
    for item in items:
      if item[0] == "switch":  # ("switch", index slot, [items of each branch])
        _, index_slot, branches = item
        header = len(fields)
        fields.append(None)
        index_offset = len(self.slots)
        self.slots.append(index_slot)
        for branch in branches: self._flatten([("loop", 1, -1, [], branch)], fields)
        fields[header] = (0, index_offset, -2, len(branches), len(fields) - header - 1)
        continue
      if item[0] == "loop":
        _, trip, flag_slot, cond, body = item  # flag_slot: a while loop's flag, or a counted loop's counter (or -1)
        header = len(fields)
        fields.append(None)
        flag_offset = None
        if trip is None or flag_slot >= 0:
          flag_offset = len(self.slots)
          self.slots.append(flag_slot)
        cond_start = len(fields)
        self._flatten(cond, fields)
        body_start = len(fields)
        self._flatten(body, fields)
        n_cond, n_body = body_start - cond_start, len(fields) - body_start
        fields[header] = (0, flag_offset, -1 if trip is None else trip, n_body, n_cond)
        continue
      program, slots, n, grain, mode = item
      if n <= 0: continue
      self._records_of.append((program, len(fields)))
      fields.append((program.fn_addr, len(self.slots), n, grain, int(mode)))
      self.slots += list(slots)
      self.programs.append(program)

  def retarget(self, program: CPUProgram) -> None:
    """Launch `program` at its new address from now on (`CPUProgram.upgrade`; an aligned 8-byte store, which a run
    on another thread reads whole, before or after)."""
    for launched, record in self._records_of:
      if launched is program: self.records[record * len(runtime.LAUNCH_FIELDS)] = program.fn_addr

  def __call__(self, addresses: list[int]) -> None:
    """Run every launch with buffer slot i at `addresses[i]`. Raises KeyboardInterrupt if SIGINT cut one short."""
    if not self._lock.acquire(False):  # another thread is running this program: use arrays of our own
      other = LaunchList(self._items)
      other(addresses)
      self.launched = other.launched
      return
    try:
      self.table[:self._table_size] = self._gather(addresses)
      aborted = self._run_launches(self.records, self.count, self._launched_address)  # (it zeroes the count first)
      self.launched = self._launched.value
    finally:
      self._lock.release()
    if self._pending:  # (a run of its first tiers: their own loops compile after enough of them)
      self._pending = {pending for pending in self._pending if not pending.ran()}
    if aborted: raise KeyboardInterrupt(f"program of {self.count} launch records interrupted")


def compile_cpu(name: str, llvm_ir: str, opt_level: int | None = None, compiled: bytes | None = None) -> CPUProgram:
  """Compile (or fetch from the in-process memo or the disk cache) kernel `name` from LLVM IR text (`compiled`: its
  object code, compiled by `compile_cpu_many`).

  `opt_level` defaults to 3 (0 when NOOPT=1). With DEBUG>=4 the IR is printed (DEBUG>=5 also the optimised IR).
  """
  opt_level = default_opt_level() if opt_level is None else opt_level
  memo_key = (name, llvm_ir, opt_level)
  program = _programs.get(memo_key)
  if program is None:
    runtime_ = get_runtime()
    if not runtime_.sigint_installed: runtime_.install_sigint_handler()
    with _lock:  # a second thread asking for the same kernel meanwhile waits here, then finds it in the memo
      program = _programs.get(memo_key)
      if program is None:
        if DEBUG >= 4: print(f"LLVM IR of {name}:\n{llvm_ir}")
        program = CPUProgram(name, llvm_ir, load_or_compile(name, llvm_ir, opt_level, compiled=compiled), opt_level)
        _programs[memo_key] = program
        return program
  _stats["memory_hits"] += 1
  return program


def compile_cpu_many(kernels: list[tuple[str, str]], opt_level: int | None = None,
                     quick: list[str | None] | None = None) -> list[CPUProgram]:
  """`compile_cpu` of each (name, LLVM IR) of a program: a `CompileStream` given them all at once (`quick`: each
  kernel's first tier, or None, see `CompileStream.tier`)."""
  stream = CompileStream(opt_level)
  try:
    for (name, llvm_ir), first in zip(kernels, quick or [None] * len(kernels)): stream.submit(name, llvm_ir, first)
  except BaseException:
    stream.close()
    raise
  return stream.finish()


# A kernel's IR without fast-math flags (no FMA contraction, no reassociated sums: llvm.py writes a register tile's
# FMAs out, `fused_product`) computes the same bits at -O0 as at -O3, so such a kernel's first tier is its own IR at
# -O0 (BASELINE_OPT), which LLVM compiles ~8x faster (the MLP Adam step's kernels: 0.85 -> 0.10 s) and which runs
# elementwise work 1.1-4x slower where llvm.py writes it as vector code (`vector_lanes`, `vector_reduce`: its Adam
# update of 784x512 values 0.42 -> 1.05 ms; as scalar code it took 1.5 ms), a plain loop nest up to 25x slower:
# where the kernel's loops run at most BASELINE_MAX_WORK iterations in all (lower/realize.py `first_tier`). A
# register tile, vector code as the renderer writes it, runs ~2x slower unoptimised (the MLP's 10 x 512 weight
# gradient over 512 rows: 119 -> 211 us, its LLVM 54-73 -> 17-21 ms; the transformer's tiles of 33-67M iterations
# 3.6-4.8x): up to BASELINE_MAX_TILE_WORK. Its time to the 42nd step in fresh processes, against 1M for
# tiles too: the CNN's 2.7-3.0 s either way (its first call 0.95-1.03 -> 0.60-0.70 s), the transformer's and the
# LM's within noise (one run each way better), their first calls 0.95-1.46 -> 1.09-1.20 s and 1.37 -> 1.19 s.
# A library call's kernel (its loops around the call) is built unoptimised too where that computes the same bits.
BASELINE_OPT = 0
BASELINE_MAX_WORK = 1 << 20
BASELINE_MAX_TILE_WORK = 1 << 22
_FAST_MATH = re.compile(r"\b(?:fast|reassoc|contract|nnan|ninf|nsz|arcp|afn)\b|@llvm\.fmuladd")
# (a max or min reduction's `reassoc` lets LLVM vectorise it; its value is the same in any order)
_ORDER_FREE = re.compile(r"call reassoc ([^@]*@llvm\.(?:maximum|minimum)\.)")


def same_bits_unoptimised(llvm_ir: str) -> bool:
  """Whether kernel IR compiles at -O0 to code computing what its -O3 code computes, bit for bit (NaN payloads
  aside, which LLVM does not keep): no fast-math flags (which let -O3 fuse and reorder floating-point operations; but
  on a max or min, which has the same value in any order) and no `llvm.fmuladd` (fused or not at codegen's will)."""
  return _FAST_MATH.search(_ORDER_FREE.sub(r"call \1", llvm_ir)) is None


class CompileStream:
  """A program's kernels compiled as they are handed over (`submit`), then loaded (`finish`: their CPUPrograms, in
  order). Those that neither the memo nor the disk cache holds are compiled here and by the compile worker at the
  same time (llvm_compile.py), each side taking the largest kernel waiting: the worker starts on the first one while
  the lowering renders the rest (get_schedule submits each kernel as it is rendered), and this thread joins in at
  `finish`. A job the worker fails (it crashed, or the kernel doesn't compile) is compiled here, so an error is
  raised as if there were no worker.

  A kernel may come with a first tier (`quick`): a contraction that the GEMM library can compute (codegen/gemm.py)
  with a call of the library, which compiles in a fraction of the time of its own register-tiled loops; a small
  kernel whose IR computes the same bits unoptimised (`same_bits_unoptimised`) with that IR itself, compiled at
  BASELINE_OPT. Where its own loops at the stream's opt level are neither loaded nor in the disk cache, the first
  tier is what the program runs at first, and its own loops compile in the background once it has run
  (`_upgrade_later`) and replace it once loaded (DEBUG>=1 says so): a new program's first call does not wait for
  them, and its later calls run them. (With one core, or no compile worker, the kernels compile as before.)"""

  def __init__(self, opt_level: int | None = None):
    self.opt_level = default_opt_level() if opt_level is None else opt_level
    self.kernels: list[tuple[str, str, int]] = []  # (name, IR, opt level) of each kernel, as the program runs it first
    self.upgrades: list[tuple[int, str, str]] = []  # (kernel number, name, IR of its own loops) run as a first tier
    self.extra: list[tuple[str, str]] = []  # (`include`)
    self.jobs: list[tuple[str, str, str, int]] = []  # (name, IR, symbol, opt level) of each kernel to compile
    self.keys: set[str] = set()
    self.results: dict[int, bytes] = {}
    self.pending: list[int] = []
    self.condition = threading.Condition()
    self.closed = False
    self.thread: threading.Thread | None = None

  def tier(self, name: str, llvm_ir: str, quick: str | None) -> tuple[str, int]:
    """What to compile now, and at which opt level, of a kernel whose own loops are `llvm_ir` and whose first tier is
    `quick` (None: it has none; `llvm_ir` itself: at BASELINE_OPT, as is a library call's kernel whose IR computes
    the same bits so): the first tier where the own loops are not at hand (in this process or the disk cache) and a
    compile worker can build them in the background, else the own loops."""
    own = llvm_ir, self.opt_level
    if quick is None or (name, llvm_ir, self.opt_level) in _programs: return own
    baseline = quick == llvm_ir
    if self.opt_level <= BASELINE_OPT and baseline or not baseline and not gemm_library_ready(): return own
    key = object_code_key(name, llvm_ir, self.opt_level)
    if kernel_symbol(key) in _loaded_symbols or os.path.exists(_kernel_cache.path(key)) or compile_worker() is None:
      return own
    # (a library call's kernel too is built unoptimised where that computes the same bits: only its loops around the
    # call, the epilogue, are its own)
    return (quick, BASELINE_OPT) if baseline or same_bits_unoptimised(quick) else (quick, self.opt_level)

  def submit(self, name: str, llvm_ir: str, quick: str | None = None) -> None:
    """Hand over the program's next kernel (`finish` returns their programs in this order), and its first tier."""
    now, level = self.tier(name, llvm_ir, quick)
    if (now, level) != (llvm_ir, self.opt_level): self.upgrades.append((len(self.kernels), name, llvm_ir))
    self.kernels.append((name, now, level))
    self.prepare(name, now, level)

  def include(self, name: str, llvm_ir: str) -> None:
    """Compile a kernel the program launches by its own means (a host step's `native` kernel) along with its own:
    `finish` loads it (later `compile_cpu` calls find it) but doesn't return it."""
    self.extra.append((name, llvm_ir))
    self.prepare(name, llvm_ir)

  def prepare(self, name: str, llvm_ir: str, opt_level: int | None = None) -> None:
    """Start compiling a kernel that a later `submit` hands over (at `opt_level`, default the stream's): a program's
    contractions, while the lowering still works out the rest (`get_schedule`)."""
    opt_level = self.opt_level if opt_level is None else opt_level
    if (name, llvm_ir, opt_level) in _programs: return
    key = object_code_key(name, llvm_ir, opt_level)
    symbol = kernel_symbol(key)
    if key in self.keys or symbol in _loaded_symbols or os.path.exists(_kernel_cache.path(key)): return
    self.keys.add(key)
    if self.thread is None:
      if (worker := compile_worker()) is None: return  # (compiled one by one at `finish`, by compile_cpu)
      self.thread = threading.Thread(target=self._remote, args=(worker,), name="tinyjax-compile-worker", daemon=True)
      self.thread.start()
    with _lock:
      _initialize_llvm()
      _check_external_functions(name, llvm_ir)  # (before the worker's loads)
    with self.condition:
      self.jobs.append((name, llvm_ir, symbol, opt_level))
      self.pending.append(len(self.jobs) - 1)
      self.condition.notify()

  def _take(self, wait: bool) -> int | None:
    """The largest kernel waiting (None when there is none, and with `wait` once `finish` has begun)."""
    with self.condition:
      while wait and not self.pending and not self.closed: self.condition.wait()
      if not self.pending: return None
      largest = max(self.pending, key=lambda i: len(self.jobs[i][1]))
      self.pending.remove(largest)
      return largest

  def _remote(self, worker: _CompileWorker) -> None:
    while (i := self._take(wait=True)) is not None:
      if (reply := worker.compile(*self.jobs[i])) is None: return  # it died: the rest is done here
      ok, result, seconds = reply
      if ok: self.results[i] = result
      _stats["compile_seconds"] += seconds

  def close(self, wait: bool = True) -> None:
    """Stop the worker's side (what it has not taken is left) and, with `wait`, wait for it: what a lowering that
    failed half-way calls, and `finish`'s first and last steps."""
    with self.condition:
      self.closed = True
      self.condition.notify_all()
    if wait and self.thread is not None: self.thread.join()

  def finish(self) -> list[CPUProgram]:
    self.close(wait=False)
    try:
      while (i := self._take(wait=False)) is not None: self.results[i] = _timed_compile(*self.jobs[i])
    finally:
      self.close()
    compiled = {symbol: self.results[i] if i in self.results else _timed_compile(name, llvm_ir, symbol, level)
                for i, (name, llvm_ir, symbol, level) in enumerate(self.jobs)}
    programs = [compile_cpu(name, llvm_ir, level, compiled.get(kernel_symbol(object_code_key(name, llvm_ir, level))))
                for name, llvm_ir, level in self.kernels + [(*extra, self.opt_level) for extra in self.extra]]
    if self.upgrades:
      _upgrade_later([(programs[i], name, llvm_ir) for i, name, llvm_ir in self.upgrades], self.opt_level)
    return programs[:len(self.kernels)]


_upgrades: set[threading.Thread] = set()  # the background compiles of first tiers' own loops (`wait_for_upgrades`)
_exiting = False  # set at exit: a background compile then loads nothing more


# A first tier's own loops start compiling once the program has run UPGRADE_AFTER_RUNS times: its first run has both
# cores, where the compile worker would take one (the MLP step's first call from an empty cache, alternating fresh
# processes: its run 38-46 -> 17-29 ms), and a program run once (a test's, a script's) costs no second compile,
# which would keep the worker from the next program's kernels (a script of 17 small jitted functions, each called
# once: one of them waited 130 ms more behind the others' upgrades).
UPGRADE_AFTER_RUNS = 2


class _Upgrade:
  """The first-tier programs of one lowered program waiting for their own loops: (program, name, IR) jobs, compiled at
  `opt_level` on the compile worker in a thread of their own (`_compile_upgrades`) once `ran` has counted
  UPGRADE_AFTER_RUNS runs of the program (by `LaunchList`, or `count_run`), or `wait_for_upgrades` asks for them."""

  def __init__(self, jobs: list[tuple[CPUProgram, str, str]], opt_level: int):
    self.jobs, self.opt_level, self.runs = jobs, opt_level, 0
    self.thread: threading.Thread | None = None

  def ran(self) -> bool:
    """Count a run; start compiling at the UPGRADE_AFTER_RUNS-th. Whether the compile has started."""
    self.runs += 1  # (two threads' runs may count as one: the compile starts a run later)
    if self.runs >= UPGRADE_AFTER_RUNS: self.start()
    return self.thread is not None

  def start(self) -> None:
    with _upgrade_lock:  # (started before `wait_for_upgrades` can see it, to join it)
      if self.thread is not None: return
      self.thread = threading.Thread(target=_upgrade, args=(self,), name="tinyjax-upgrade", daemon=True)
      self.thread.start()
      _upgrades.add(self.thread)


def _upgrade_later(jobs: list[tuple[CPUProgram, str, str]], opt_level: int) -> None:
  """Compile the own loops (IR) of first-tier programs in the background once the program has run UPGRADE_AFTER_RUNS
  times (`_Upgrade`), and `upgrade` each program to them once loaded (a program already waiting for its own is not
  queued twice)."""
  with _upgrade_lock:
    jobs = [(program, name, llvm_ir) for program, name, llvm_ir in jobs if program.watchers is None]
    if not jobs: return
    pending = _Upgrade(jobs, opt_level)
    for program, _, _ in jobs: program.watchers, program.pending = weakref.WeakSet(), pending


def count_run(programs: list) -> None:
  """A run of a program's kernels made without its launch list (DEBUG's and profiles' timed launches): counted
  towards their upgrades as a `LaunchList` run is."""
  for pending in {program.pending for program in programs if getattr(program, "pending", None) is not None}:
    pending.ran()


def _upgrade(pending: _Upgrade) -> None:
  try: _compile_upgrades(pending)
  finally: _upgrades.discard(threading.current_thread())


def _compile_upgrades(pending: _Upgrade) -> None:
  opt_level = pending.opt_level
  for program, _, _ in pending.jobs: program.pending = None
  for program, name, llvm_ir in pending.jobs:
    key = object_code_key(name, llvm_ir, opt_level)
    start = time.perf_counter()
    worker = compile_worker()
    reply = None if worker is None else worker.compile(name, llvm_ir, kernel_symbol(key), opt_level)
    address = None
    with _lock:
      if not _exiting and reply is not None and reply[0]:
        address = load_or_compile(name, llvm_ir, opt_level, compiled=reply[1])
        if (memo_key := (name, llvm_ir, opt_level)) not in _programs:
          _programs[memo_key] = CPUProgram(name, llvm_ir, address, opt_level)
    if address is None:  # (the worker failed or the process is ending: the first tier stays)
      with _upgrade_lock: program.watchers = None
      continue
    swapped = f"its -O{opt_level} build in place of its -O{program.opt_level} one" if program.src == llvm_ir else \
        "its own loops in place of the library call"
    program.upgrade(llvm_ir, address, opt_level)
    if DEBUG >= 1:
      print(f"*** CPU upgraded {name}: {swapped} (compiled in the background in "
            f"{(time.perf_counter() - start) * 1e3:.0f} ms)")


def wait_for_upgrades(programs: list | None = None) -> None:
  """Wait until the first tiers of `programs` run their own loops (or stay, where those failed to compile), starting
  their compiles where the programs have not run often enough yet; without `programs`, wait for the compiles started
  so far."""
  for pending in {program.pending for program in programs or () if getattr(program, "pending", None) is not None}:
    pending.start()
  while _upgrades: _upgrades.pop().join()


@atexit.register
def _stop_upgrades() -> None:
  global _exiting
  with _lock: _exiting = True


def _timed_compile(name: str, llvm_ir: str, symbol: str, opt_level: int) -> bytes:
  start = time.perf_counter()
  object_code = compile_object(name, llvm_ir, symbol, opt_level)
  _stats["compile_seconds"] += time.perf_counter() - start
  return object_code


class _CompileWorker:
  """A process compiling kernels for this one (llvm_compile.py `serve`), one job at a time; `compile` returns None
  once it has failed (and it is not used again)."""

  def __init__(self):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llvm_compile.py")
    # loaded by path, not as tinyjax.devices.llvm_compile: importing the package would cost the worker ~80 ms, and
    # running it as a script would put this directory (cache.py, runtime.py, ...) first on the worker's sys.path
    loader = ("import importlib.util as u, sys; spec = u.spec_from_file_location('tinyjax_llvm_compile', sys.argv[1]);"
              " module = u.module_from_spec(spec); spec.loader.exec_module(module);"
              " module.serve(sys.stdin.buffer, sys.stdout.buffer)")
    self.process = subprocess.Popen([sys.executable, "-c", loader, path], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    self.lock = threading.Lock()
    self.jobs = 0
    self.failed = False
    self._send(_target())

  def _send(self, message) -> None:
    pickle.dump(message, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
    self.process.stdin.flush()

  def compile(self, name: str, llvm_ir: str, symbol: str, opt_level: int) -> tuple[bool, bytes | str, float] | None:
    """(compiled, object code or error text, seconds the worker took) of one kernel; None if the worker died."""
    with self.lock:
      if self.failed: return None
      self.jobs += 1
      try:
        self._send((self.jobs, name, llvm_ir, symbol, opt_level))
        job, ok, result, seconds = pickle.load(self.process.stdout)
      except Exception:  # it died (or wrote something else): not used again
        job = None
      if job != self.jobs:
        self.close()
        return None
      return ok, result, seconds

  def close(self) -> None:
    """End the worker (it exits at the end of its input)."""
    self.failed = True
    try: self.process.stdin.close()
    except OSError: pass
    try: self.process.wait(timeout=5)
    except subprocess.TimeoutExpired: self.process.kill()


_worker: _CompileWorker | None = None
_worker_lock = threading.Lock()
_worker_starts = 0
MAX_WORKER_STARTS = 3  # a worker that keeps dying (a kernel crashing LLVM) is not started again


def _runtime_source() -> str: return runtime.runtime_ir(cpu_target_triple(), cpu_data_layout())


@functools.cache
def _library_source() -> str:
  """The GEMM library's module (codegen/gemm.py) for this host's register tiles and sums."""
  from tinyjax.codegen import gemm
  from tinyjax.codegen.llvm import FLOAT32_BLOCKS
  from tinyjax.codegen.opt import CONTRACTION_SUM_BLOCK, tile_geometry
  geometry = tile_geometry()
  return stamp_target(gemm.library_ir(geometry.vector_bytes // 4, geometry.tile_vectors, geometry.tile_rows,
                                      CONTRACTION_SUM_BLOCK, FLOAT32_BLOCKS, geometry.fma))


_runtime_compile: threading.Thread | None = None  # the worker compiling the runtime module
_library_compile: threading.Thread | None = None  # ... and then the GEMM library's
_runtime_object: dict[str, bytes] = {}  # their IR -> the object code it made


def _cached(name: str, ir: str) -> bool:
  return os.path.exists(_kernel_cache.path(object_code_key(name, ir, 3, rename=False)))


def _compile_runtime_on(worker: _CompileWorker) -> None:
  """Have a newly started compile worker compile the runtime module first, where neither this process nor the disk
  cache has it: its ~0.2 s of LLVM then overlap the first program's lowering (Runtime takes the object code); and
  then the GEMM library's (~0.15 s), for the first tiers of contractions (`gemm_library_ready`)."""
  global _runtime_compile, _library_compile

  def compile_on_worker(name: str, ir: str, after: threading.Thread | None) -> None:
    if after is not None: after.join()
    reply = worker.compile(name, ir, None, 3)
    if reply is not None and reply[0]: _runtime_object[ir] = reply[1]
  if _runtime is None and not _cached("tj_parallel_for", ir := _runtime_source()):
    _runtime_compile = threading.Thread(target=compile_on_worker, args=("tj_parallel_for", ir, None),
                                        name="tinyjax-runtime-compile", daemon=True)
    _runtime_compile.start()
  if gemm_symbol not in _loaded_symbols and not _cached(gemm_symbol, library := _library_source()):
    _library_compile = threading.Thread(target=compile_on_worker, args=(gemm_symbol, library, _runtime_compile),
                                        name="tinyjax-library-compile", daemon=True)
    _library_compile.start()


def gemm_library_ready() -> bool:
  """Whether the GEMM library is loaded, or its object code at hand (made by the compile worker, or on disk): a first
  tier may call it (`CompileStream.tier`) without waiting for its compile."""
  if gemm_symbol in _loaded_symbols: return True
  ir = _library_source()
  return ir in _runtime_object or _cached(gemm_symbol, ir)


def _load_gemm_library() -> None:
  """Load the GEMM library (from the worker's object code, the disk cache or compiled here) and give kernels its
  symbol."""
  if gemm_symbol in _loaded_symbols: return
  ir = _library_source()
  if _library_compile is not None: _library_compile.join()
  load_or_compile(gemm_symbol, ir, 3, rename=False, compiled=_runtime_object.pop(ir, None))
  for symbol in library_symbols:  # (the copy's too, `tj_copy32`)
    llvm.add_symbol(symbol, _engine().engine.get_function_address(symbol))


def compile_worker() -> _CompileWorker | None:
  """The compile worker, started on first use (lowering calls this early, so it starts while Python lowers) and again
  if it died; None on a single core, with TINYJAX_COMPILE_WORKER=0, with DEBUG>=5 (the optimised IR is printed
  here), or once it has died MAX_WORKER_STARTS times."""
  global _worker, _worker_starts
  if _cpu_count() < 2 or not getenv("TINYJAX_COMPILE_WORKER", 1) or DEBUG >= 5 or not sys.executable: return None
  with _worker_lock:
    if (_worker is None or _worker.failed) and _worker_starts < MAX_WORKER_STARTS:
      _worker_starts += 1
      try: _worker = _CompileWorker()
      except (OSError, ValueError):
        return None
      atexit.register(_worker.close)
      _compile_runtime_on(_worker)
  return None if _worker is None or _worker.failed else _worker


def _forget_worker() -> None:
  """In a forked child: the parent's worker is the parent's (it shares its pipes); the child starts its own."""
  global _worker, _worker_starts, _runtime_compile, _library_compile
  _worker, _worker_starts, _runtime_compile, _library_compile = None, 0, None, None


os.register_at_fork(after_in_child=_forget_worker)
