"""GPU figures, on a machine with an NVIDIA GPU (the CUDA driver): matmul and 3x3 convolution TFLOP/s, softmax,
layernorm and column-sum GB/s, jit dispatch. With `--compare`, the same figures from JAX (and PyTorch) on the same
GPU, when they are installed. `--platform=opencl` takes them on an OpenCL device instead (PoCL on a CPU: a check that
the GPU path runs, not a speed figure).

    python benchmarks/gpu.py [--compare] [--platform=opencl]
"""
from __future__ import annotations

import sys
import time

import numpy as np

import tinyjax as tj
import tinyjax.numpy as tnp


def timed(fn, sync, repeat: int = 5) -> float:
  """Best seconds per call of `fn()` (asynchronous launches, waited for by `sync()`), after a warm-up call."""
  sync(fn())
  best = float("inf")
  for _ in range(repeat):
    start = time.perf_counter()
    sync(fn())
    best = min(best, time.perf_counter() - start)
  return best


def report(name: str, ours: str, theirs: dict[str, str]) -> None:
  print(f"{name:34s} {ours:>22s}  " + "  ".join(f"{who} {figure}" for who, figure in theirs.items()), flush=True)


def main() -> None:
  compare = "--compare" in sys.argv
  platform = next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith("--platform=")), "gpu")
  gpu = tj.devices(platform)[0]
  print(f"device: {gpu.device_kind} ({getattr(gpu, 'compute_capability', '')} {gpu.arch})")
  sync = tj.block_until_ready
  others = {}
  if compare:
    try:
      import jax
      import jax.numpy as jjnp
      others["jax"] = (jax, jjnp)
    except ImportError: pass
    try:
      import torch
      others["torch"] = torch
    except ImportError: pass
  rng = np.random.default_rng(0)

  for dtype, name in ((np.float32, "float32"), (tnp.bfloat16, "bfloat16"), (np.float16, "float16")):
    n = 4096 if platform == "gpu" else 512  # (PoCL runs the GPU kernels on the CPU: minutes at 4096)
    a, b = (rng.standard_normal((n, n)).astype(np.float32).astype(dtype) for _ in range(2))
    x, y = tj.device_put(a, gpu), tj.device_put(b, gpu)
    matmul = tj.jit(lambda u, v: u @ v)
    seconds = timed(lambda: matmul(x, y), sync)
    theirs = {}
    if "jax" in others:
      jax, jjnp = others["jax"]
      jx, jy = jax.device_put(a), jax.device_put(b)
      jm = jax.jit(lambda u, v: jnp_matmul(jjnp, u, v))
      theirs["jax"] = f"{2 * n ** 3 / timed(lambda: jm(jx, jy), lambda r: r.block_until_ready()) / 1e12:.2f}"
    report(f"matmul {n} {name} TFLOP/s", f"{2 * n ** 3 / seconds / 1e12:.2f}", theirs)

  # a 3x3 convolution (channels last), a tiled product over the window and the channels
  batch, side, channels = (32, 56, 64) if platform == "gpu" else (2, 16, 32)
  flops = 2 * batch * side * side * channels * channels * 9
  for dtype, name in ((np.float32, "float32"), (tnp.bfloat16, "bfloat16")):
    a = rng.standard_normal((batch, side, side, channels)).astype(np.float32).astype(dtype)
    w = (rng.standard_normal((3, 3, channels, channels)) / 24).astype(np.float32).astype(dtype)
    x, k = tj.device_put(a, gpu), tj.device_put(w, gpu)
    conv = tj.jit(lambda u, v: tj.lax.conv_general_dilated(u, v, (1, 1), "SAME",
                                                            dimension_numbers=("NHWC", "HWIO", "NHWC")))
    seconds = timed(lambda: conv(x, k), sync)
    theirs = {}
    if "jax" in others:
      jax, _ = others["jax"]
      jx, jk = jax.device_put(a), jax.device_put(w)
      jconv = jax.jit(lambda u, v: jax.lax.conv_general_dilated(u, v, (1, 1), "SAME", precision="highest",
                                                                 dimension_numbers=("NHWC", "HWIO", "NHWC")))
      theirs["jax"] = f"{flops / timed(lambda: jconv(jx, jk), lambda r: r.block_until_ready()) / 1e12:.2f}"
    report(f"conv 3x3 {batch}x{side}x{side}x{channels} {name} TFLOP/s", f"{flops / seconds / 1e12:.2f}", theirs)

  rows, cols = 8192, 4096
  a = rng.standard_normal((rows, cols)).astype(np.float32)
  x = tj.device_put(a, gpu)
  softmax = tj.jit(lambda u: tj.nn.softmax(u, axis=-1))
  layernorm = tj.jit(lambda u: (u - u.mean(-1, keepdims=True)) / tnp.sqrt(u.var(-1, keepdims=True) + 1e-5))
  for label, fn, jfn in (("softmax", softmax, "softmax"), ("layernorm", layernorm, "layernorm")):
    seconds = timed(lambda: fn(x), sync)
    theirs = {}
    if "jax" in others:
      jax, jjnp = others["jax"]
      jx = jax.device_put(a)
      f = jax.jit(lambda u: jax.nn.softmax(u, axis=-1)) if jfn == "softmax" else \
          jax.jit(lambda u: (u - u.mean(-1, keepdims=True)) / jjnp.sqrt(u.var(-1, keepdims=True) + 1e-5))
      theirs["jax"] = f"{2 * a.nbytes / timed(lambda: f(jx), lambda r: r.block_until_ready()) / 1e9:.0f}"
    report(f"{label} {rows}x{cols} GB/s", f"{2 * a.nbytes / seconds / 1e9:.0f}", theirs)

  # a long reduction with few outputs: split into partial results (lower/split.py, GPU_SPLIT_MIN_CHUNK_WORK)
  a = rng.standard_normal((1 << 17, 8)).astype(np.float32)  # (4 MB: the CPU-sized chunks would not split it)
  x = tj.device_put(a, gpu)
  column_sum = tj.jit(lambda u: u.sum(axis=0))
  seconds = timed(lambda: column_sum(x), sync)
  theirs = {}
  if "jax" in others:
    jax, _ = others["jax"]
    jx, f = jax.device_put(a), jax.jit(lambda u: u.sum(axis=0))
    theirs["jax"] = f"{a.nbytes / timed(lambda: f(jx), lambda r: r.block_until_ready()) / 1e9:.0f}"
  report("column sum 131072x8 GB/s", f"{a.nbytes / seconds / 1e9:.1f}", theirs)

  # jit dispatch, each library in a process of its own (in one process, after JAX's runs, tinyjax's calls measured
  # 87 us against 13.5 alone on an H200, not explained)
  theirs = {"jax": f"{_dispatch_in_a_process('jax', platform):.1f}"} if "jax" in others else {}
  report("jit dispatch us/call", f"{_dispatch_in_a_process('tinyjax', platform):.1f}", theirs)
  small = tj.device_put(np.ones(16, np.float32), gpu)
  add = tj.jit(lambda u: u + 1)
  calls = 2000
  out = add(small)
  # of which the driver's launch: the same kernel launched directly, no Python around it but ctypes
  program = add.lower(small)._compiled.schedule.programs[0]
  addresses = [out.uop.arg.address, small.uop.arg.address]
  program(addresses)
  gpu.synchronize()
  start = time.perf_counter()
  for _ in range(calls): program(addresses)
  gpu.synchronize()
  report("  of which the launch us/call", f"{(time.perf_counter() - start) / calls * 1e6:.1f}", {})


_DISPATCH = """
import time, numpy as np
if {jax!r}:
  import jax
  x, f, wait = jax.device_put(np.ones(16, np.float32)), jax.jit(lambda u: u + 1), lambda r: r.block_until_ready()
else:
  import tinyjax as tj
  x, f, wait = tj.device_put(np.ones(16, np.float32), tj.devices({platform!r})[0]), tj.jit(lambda u: u + 1), \\
      tj.block_until_ready
wait(f(x))
best = float("inf")
for _ in range(3):
  start = time.perf_counter()
  for _ in range(2000): out = f(x)
  wait(out)
  best = min(best, (time.perf_counter() - start) / 2000)
print(best * 1e6)
"""


def _dispatch_in_a_process(library: str, platform: str) -> float:
  """Microseconds per call of a jitted `u + 1` on a 16-element array, dispatched 2000 times and waited for once
  (best of 3), in a new Python process."""
  import subprocess
  code = _DISPATCH.format(jax=library == "jax", platform=platform)
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  return float(done.stdout.split()[-1])


def jnp_matmul(jjnp, u, v):
  return jjnp.matmul(u, v, precision="highest")


if __name__ == "__main__":
  main()
