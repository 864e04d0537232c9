"""The data-parallel MLP Adam step of benchmarks/suite.py (784-512-512-10, batch 512; shard_map + pmean over the
batch) timed in whatever process layout this runs in: one process over TINYJAX_CPU_DEVICES devices, or several
processes started by an MPI launcher (tinyjax.distributed over MPI). Process 0 prints the median step time.

    .venv/bin/python benchmarks/distributed.py                          # 1 process, 1 device
    TINYJAX_CPU_DEVICES=2 .venv/bin/python benchmarks/distributed.py    # 1 process, 2 devices
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/distributed.py   # 2 processes, 1 device each
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import suite  # noqa: E402

import tinyjax as tj  # noqa: E402
import tinyjax.numpy as jnp  # noqa: E402

if __name__ == "__main__":
  if any(name in os.environ for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK")): tj.distributed.initialize()
  step, state, batch = suite.train_step(tj, jnp, suite.mlp_problem, tj.device_count())
  for _ in range(3): *state, loss = step(*state, *batch)
  float(loss)
  rounds = []
  for _ in range(7):
    start = time.perf_counter()
    for _ in range(10): *state, loss = step(*state, *batch)
    float(loss)
    rounds.append((time.perf_counter() - start) / 10)
  if tj.process_index() == 0:
    seconds = statistics.median(rounds)
    print(f"{tj.process_count()} process(es) x {tj.local_device_count()} device(s): {seconds * 1e3:.2f} ms per step, "
          f"{1 / seconds:.1f} steps/s (loss {float(loss):.4f})")
