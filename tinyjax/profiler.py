"""Where a program's time goes, against what the machine can do: the roofline.

`machine_limits()` measures this machine once and keeps the figures in the disk cache: the float32 FMA peak of all
the runtime's threads (a kernel of independent vector FMA chains) and the copy bandwidth of main memory (every
thread copying its share of a 128 MB buffer with vector loads and stores, as an elementwise kernel does, not libc's
memcpy, whose non-temporal stores bypass the cache; read and written bytes both count). `kernel_flops(ast)` counts
what one launch of a kernel does: its floating-point operations, each arithmetic UOp on float values (comparisons and
selects included) times the iterations of the loops it depends on, so that a matmul's are 2*M*N*K.

With DEBUG>=1 every launch prints its time, GFLOP/s and GB/s and the percentage of those limits it reached (the bytes
are those of the buffers it reads and writes, each counted once: the traffic it cannot avoid). `profile()` collects
the same as data:

    with tinyjax.profile() as prof:
      step(params, x, y)
    print(prof)            # a table, kernels sorted by time
    prof.kernels[0].gflops

While a profile is open every launch is timed on its own (as with DEBUG>=1), which adds a little Python per kernel.
"""
from __future__ import annotations

import contextlib
import functools
import json
import struct
import time
from dataclasses import dataclass, field

from tinyjax.helpers import open_profiles
from tinyjax.uop import Ops, UOp

# ---- the machine's limits

_FMA_CHAINS = 12        # independent accumulators: enough to cover the FMA latency on two ports
_FMA_STEPS = 1 << 16    # FMAs of each chain per iteration of the outer loop (25 MFLOP with 16 lanes)
_COPY_BYTES = 128 << 20  # per buffer: above most last-level caches
_COPY_BLOCK = 1 << 20   # bytes one outer iteration of the copy kernel moves
_PROBES_VERSION = 2     # part of the cache key: bump when the probes change (older figures are then measured again)


@dataclass(frozen=True)
class MachineLimits:
  """What this machine can do, measured: `flops` float32 FLOP/s (FMA = 2) and `bandwidth` bytes/s (copy: read plus
  write), both over `threads` threads with `vector_lanes`-wide float32 vectors."""
  flops: float
  bandwidth: float
  threads: int
  vector_lanes: int

  def __str__(self) -> str:
    return (f"{self.flops / 1e9:.0f} GFLOP/s float32 FMA peak, {self.bandwidth / 1e9:.1f} GB/s copy bandwidth "
            f"({self.threads} threads, {self.vector_lanes}-lane vectors)")


def _vector_lanes() -> int:
  from tinyjax.devices.cpu import vector_registers
  return vector_registers()[0] // 4


def _fma_probe_ir(lanes: int) -> str:
  vector = f"<{lanes} x float>"
  chains = range(_FMA_CHAINS)
  phis = "\n".join(f"  %a{c} = phi {vector} [ {_splat(lanes, 1.0 + c / 64)}, %outer ], [ %b{c}, %inner ]"
                   for c in chains)
  m, k = _splat(lanes, 0.999999), _splat(lanes, 1e-7)
  fmas = "\n".join(f"  %b{c} = call {vector} @llvm.fma.v{lanes}f32({vector} %a{c}, {vector} {m}, {vector} {k})"
                   for c in chains)
  sums = [f"%b{c}" for c in chains]
  adds = []
  while len(sums) > 1:
    name = f"%s{len(adds)}"
    adds.append(f"  {name} = fadd {vector} {sums[0]}, {sums[1]}")
    sums = sums[2:] + [name]
  add_lines = "\n".join(adds)
  width = lanes * 32
  return f"""
declare {vector} @llvm.fma.v{lanes}f32({vector}, {vector}, {vector})
declare float @llvm.vector.reduce.fadd.v{lanes}f32(float, {vector})

define void @tj_fma_probe(ptr noalias %args, i64 %start, i64 %end) #0 {{
entry:
  %out = load ptr, ptr %args
  br label %outer
outer:
  %i = phi i64 [ %start, %entry ], [ %i.next, %done ]
  br label %inner
inner:
  %j = phi i64 [ 0, %outer ], [ %j.next, %inner ]
{phis}
{fmas}
  %j.next = add i64 %j, 1
  %more = icmp ult i64 %j.next, {_FMA_STEPS}
  br i1 %more, label %inner, label %done
done:
{add_lines}
  %total = call float @llvm.vector.reduce.fadd.v{lanes}f32(float 0.0, {vector} {sums[0]})
  %slot = getelementptr float, ptr %out, i64 %i
  store float %total, ptr %slot
  %i.next = add i64 %i, 1
  %again = icmp ult i64 %i.next, %end
  br i1 %again, label %outer, label %exit
exit:
  ret void
}}

attributes #0 = {{ "prefer-vector-width"="{width}" "min-legal-vector-width"="{width}" }}
"""


def _splat(lanes: int, value: float) -> str:
  """An LLVM vector constant of `lanes` copies of `value` rounded to float32 (LLVM spells it as the double's bits)."""
  exact = struct.unpack(">f", struct.pack(">f", value))[0]
  return "<" + ", ".join(f"float 0x{struct.pack('>d', exact).hex().upper()}" for _ in range(lanes)) + ">"


_COPY_PROBE_IR = f"""
define void @tj_copy_probe(ptr noalias %args, i64 %start, i64 %end) {{
entry:
  %dst = load ptr, ptr %args
  %src.slot = getelementptr ptr, ptr %args, i64 1
  %src = load ptr, ptr %src.slot
  br label %block
block:
  %i = phi i64 [ %start, %entry ], [ %i.next, %block.end ]
  %first = mul i64 %i, {_COPY_BLOCK // 64}
  br label %copy
copy:
  %j = phi i64 [ 0, %block ], [ %j.next, %copy ]
  %k = add i64 %first, %j
  %from = getelementptr <16 x float>, ptr %src, i64 %k
  %to = getelementptr <16 x float>, ptr %dst, i64 %k
  %value = load <16 x float>, ptr %from, align 4
  %same = fadd <16 x float> %value, zeroinitializer
  store <16 x float> %same, ptr %to, align 4
  %j.next = add i64 %j, 1
  %more = icmp ult i64 %j.next, {_COPY_BLOCK // 64}
  br i1 %more, label %copy, label %block.end
block.end:
  %i.next = add i64 %i, 1
  %again = icmp ult i64 %i.next, %end
  br i1 %again, label %block, label %exit
exit:
  ret void
}}
"""


def _best_seconds(run, repeat: int) -> float:
  best = float("inf")
  for _ in range(repeat):
    start = time.perf_counter()
    run()
    best = min(best, time.perf_counter() - start)
  return best


def measure_machine_limits() -> MachineLimits:
  """Measure the limits now (about half a second; `machine_limits()` measures once per machine and caches)."""
  import numpy as np

  from tinyjax.devices.cpu import compile_cpu, cpu_threads
  threads, lanes = cpu_threads(), _vector_lanes()
  fma = compile_cpu("tj_fma_probe", _fma_probe_ir(lanes))
  iterations = 64 * threads * 16 // lanes  # ~20 ms of FMAs at 4 GHz: threads start and end, timers tick, unseen
  sink = np.zeros(iterations, np.float32)
  seconds = _best_seconds(lambda: fma([sink.ctypes.data], iterations, parallel=True), 3)
  flops = iterations * _FMA_STEPS * _FMA_CHAINS * lanes * 2 / seconds
  copy = compile_cpu("tj_copy_probe", _COPY_PROBE_IR)
  source = np.ones(_COPY_BYTES // 4, np.float32)
  destination = np.zeros_like(source)
  blocks = _COPY_BYTES // _COPY_BLOCK
  addresses = [destination.ctypes.data, source.ctypes.data]
  seconds = _best_seconds(lambda: copy(addresses, blocks, parallel=True), 4)
  return MachineLimits(flops, 2 * _COPY_BYTES / seconds, threads, lanes)


def _limits_key() -> str:
  from tinyjax.devices.cpu import TINYJAX_VERSION, cpu_features, cpu_name, cpu_threads
  return f"limits|{_PROBES_VERSION}|{TINYJAX_VERSION}|{cpu_name()}|{cpu_features()}|threads={cpu_threads()}|" \
      f"lanes={_vector_lanes()}"


@functools.cache
def machine_limits() -> MachineLimits:
  """This machine's float32 FMA peak and copy bandwidth over the runtime's threads: measured on the first call on a
  machine (about half a second), then read from the disk cache (see also `limits_for`)."""
  from tinyjax.devices.cache import DiskCache
  cache, key = DiskCache("machine"), _limits_key()
  payload = cache.get(key)
  if payload is not None:
    try: return MachineLimits(**json.loads(payload))
    except (ValueError, TypeError): pass  # unreadable: measure again and replace it
  limits = measure_machine_limits()
  cache.put(key, json.dumps(limits.__dict__).encode())
  return limits


_remeasured = [False]


def limits_for(flops_per_second: float) -> MachineLimits:
  """`machine_limits()`, measured again (once per process) when a CPU kernel has just run more than 5% above its FMA
  peak: the stored peak was then measured while something else used the cores (one measured at 264 GFLOP/s on a
  488 GFLOP/s machine made GEMMs read 140-170% of the peak). The larger of the two measurements is kept, in memory
  and on disk."""
  limits = machine_limits()
  if flops_per_second <= limits.flops * 1.05 or _remeasured[0]: return limits
  _remeasured[0] = True
  fresh = measure_machine_limits()
  if fresh.flops <= limits.flops: return limits
  from tinyjax.devices.cache import DiskCache
  better = MachineLimits(fresh.flops, max(limits.bandwidth, fresh.bandwidth), limits.threads, limits.vector_lanes)
  DiskCache("machine").put(_limits_key(), json.dumps(better.__dict__).encode())
  machine_limits.cache_clear()
  return machine_limits()


# ---- what a kernel does

_ARITHMETIC = {Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TRUNC, Ops.ADD, Ops.MUL, Ops.MAX,
               Ops.FDIV, Ops.MOD, Ops.POW, Ops.CMPLT, Ops.CMPNE, Ops.WHERE}


def _is_float(dtype) -> bool:
  return getattr(dtype, "kind", "") == "f" or str(dtype) == "bfloat16"


@functools.lru_cache(maxsize=4096)
def kernel_flops(ast: UOp) -> int:
  """The floating-point operations of one launch of kernel `ast` (a SINK of STOREs): every arithmetic UOp on float
  values, and every step of a REDUCE of them, times the iterations of the loops it depends on."""
  ranges: dict[UOp, frozenset] = {}
  flops = 0
  for node in ast.toposort:
    if node.op is Ops.RANGE: depends = frozenset((node,))
    elif node.op is Ops.REDUCE: depends = ranges[node.src[0]] | frozenset(node.src[1:])
    else: depends = frozenset().union(*(ranges[s] for s in node.src))
    operand = node.src[-1] if node.op is Ops.WHERE else node.src[0] if node.src else node
    if (node.op in _ARITHMETIC or node.op is Ops.REDUCE) and _is_float(operand.dtype):
      count = 1
      for loop in depends: count *= loop.src[0].arg if loop.src[0].op is Ops.CONST else 1
      flops += count
    ranges[node] = depends - frozenset(node.src[1:]) if node.op is Ops.REDUCE else depends
  return flops


# ---- profiles

@dataclass
class KernelProfile:
  """One kernel's launches in a profile, on a device of platform `device` ('cpu', 'gpu' for CUDA, 'opencl'): `calls`
  launches took `seconds` in all; each did `flops` floating-point operations over buffers of `bytes` bytes. `compute`
  and `bandwidth` are the fractions of the machine's limits reached (None on a device without measured limits)."""
  name: str
  device: str
  calls: int = 0
  seconds: float = 0.0
  flops: int = 0
  bytes: int = 0
  compute: float | None = None
  bandwidth: float | None = None

  @property
  def gflops(self) -> float: return self.flops * self.calls / max(self.seconds, 1e-12) / 1e9

  @property
  def gbytes_per_second(self) -> float: return self.bytes * self.calls / max(self.seconds, 1e-12) / 1e9


@dataclass
class Profile:
  """The kernels launched while a `profile()` was open, sorted by total time (slowest first) once it has closed."""
  kernels: list[KernelProfile] = field(default_factory=list)
  limits: MachineLimits | None = None
  _by_key: dict = field(default_factory=dict, repr=False)

  @property
  def seconds(self) -> float:
    """Time spent in kernels (launch overhead included, Python between launches not)."""
    return sum(k.seconds for k in self.kernels)

  def record(self, name: str, device: str, seconds: float, flops: int, nbytes: int) -> None:
    entry = self._by_key.get((name, device))
    if entry is None:
      entry = self._by_key[(name, device)] = KernelProfile(name, device, flops=flops, bytes=nbytes)
      self.kernels.append(entry)
    entry.calls += 1
    entry.seconds += seconds
    if device == "cpu" and self.limits is not None:
      self.limits = limits_for(flops / max(seconds, 1e-12))
      self._fractions(entry)

  def _fractions(self, entry: KernelProfile) -> None:
    entry.compute = entry.flops * entry.calls / max(entry.seconds, 1e-12) / self.limits.flops
    entry.bandwidth = entry.bytes * entry.calls / max(entry.seconds, 1e-12) / self.limits.bandwidth

  def __str__(self) -> str:
    lines = [f"{len(self.kernels)} kernels, {sum(k.calls for k in self.kernels)} launches, "
             f"{self.seconds * 1e3:.3f} ms" + (f"; machine: {self.limits}" if self.limits else ""),
             f"{'kernel':44s} {'calls':>6s} {'total ms':>9s} {'us/call':>9s} {'GFLOP/s':>8s} {'peak':>5s} "
             f"{'GB/s':>7s} {'bw':>5s}"]
    for k in self.kernels:
      percent = (lambda f: "" if f is None else f"{f * 100:4.0f}%")
      lines.append(f"{k.name[:44]:44s} {k.calls:6d} {k.seconds * 1e3:9.3f} {k.seconds / k.calls * 1e6:9.1f} "
                   f"{k.gflops:8.1f} {percent(k.compute):>5s} {k.gbytes_per_second:7.2f} {percent(k.bandwidth):>5s}")
    return "\n".join(lines)


# open_profiles (helpers.py): the profiles open now; realize times launches one by one while it is not empty


@contextlib.contextmanager
def profile():
  """Time every kernel launched inside the block (in any thread) and yield a `Profile` that, once the block has
  ended, lists them with their roofline figures, slowest first. Nests: every open profile records each launch."""
  result = Profile(limits=machine_limits())
  open_profiles.append(result)
  try:
    yield result
  finally:
    open_profiles.remove(result)
    result.kernels.sort(key=lambda k: -k.seconds)
    for entry in result.kernels:  # (against the final limits: `limits_for` may have measured them again meanwhile)
      if entry.device == "cpu" and result.limits is not None: result._fractions(entry)


def record_launch(name: str, seconds: float, flops: int, nbytes: int, platform: str) -> None:
  """Record a timed launch on a device of `platform` ('cpu', 'gpu', 'opencl') into every open profile."""
  for result in open_profiles: result.record(name, platform, seconds, flops, nbytes)


def roofline(seconds: float, flops: int, nbytes: int, cpu: bool) -> str:
  """The roofline part of a DEBUG=1 launch line: GFLOP/s and GB/s, and on the CPU the fractions of the limits."""
  rate, bandwidth = flops / max(seconds, 1e-9), nbytes / max(seconds, 1e-9)
  text = f"{rate / 1e9:8.2f} GFLOP/s {bandwidth / 1e9:7.2f} GB/s"
  if not cpu: return text
  limits = limits_for(rate)
  return f"{text}  ({rate / limits.flops * 100:3.0f}% of peak, {bandwidth / limits.bandwidth * 100:3.0f}% of bandwidth)"


__all__ = ["KernelProfile", "MachineLimits", "Profile", "kernel_flops", "limits_for", "machine_limits",
           "measure_machine_limits", "profile", "record_launch", "roofline"]
