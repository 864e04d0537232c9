"""First-call latency of `jit(value_and_grad(loss))` for a 3-layer MLP (trace + lower + compile), in fresh
processes: once with a cold persistent cache, then with the cache warm. Prints milliseconds (never asserts).

    python benchmarks/first_call.py
"""
import os
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent("""
  import time
  start = time.perf_counter()
  import numpy as np
  import tinyjax as tj
  import tinyjax.numpy as tnp
  imported = time.perf_counter()
  rng = np.random.default_rng(0)
  sizes = (64, 128, 128, 10)
  params = [{"w": tnp.asarray((rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32)),
             "b": tnp.zeros(n)} for m, n in zip(sizes[:-1], sizes[1:])]
  x = tnp.asarray(rng.standard_normal((32, 64)).astype(np.float32))
  y = tnp.asarray(rng.standard_normal((32, 10)).astype(np.float32))

  def loss(params, x, y):
    hidden = x
    for i, layer in enumerate(params):
      hidden = hidden @ layer["w"] + layer["b"]
      if i < len(params) - 1: hidden = tnp.tanh(hidden)
    return ((hidden - y) ** 2).mean()

  step = tj.jit(tj.value_and_grad(loss))
  before = time.perf_counter()
  value, grads = step(params, x, y)
  value.block_until_ready()
  first = time.perf_counter()
  for _ in range(20): step(params, x, y)[0].block_until_ready()
  steady = (time.perf_counter() - first) / 20
  stats = tj.runtime_stats()
  print(f"{(imported - start) * 1e3:.0f} {(first - before) * 1e3:.1f} {steady * 1e3:.2f} "
        f"{stats['schedules_lowered']} {tj.compile_cache_stats()['misses']}")
""")


def run(cache_dir: str) -> list[str]:
  env = os.environ | {"TINYJAX_CACHE_DIR": cache_dir}
  out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
  return out.stdout.split()


if __name__ == "__main__":
  with tempfile.TemporaryDirectory(prefix="tinyjax-first-call-") as cache_dir:
    for label in ("cold cache", "warm cache", "warm cache"):
      imported, first, steady, lowered, compiled = run(cache_dir)
      print(f"jit(value_and_grad(mlp)) first call, {label:10s}: {first:>7s} ms  (import {imported} ms, then "
            f"{steady} ms per call; schedules lowered {lowered}, kernels compiled {compiled})")
