"""Data-parallel training with `shard_map`: the batch is split over a mesh axis "data", each device computes the
loss of its shard, `lax.pmean` averages the losses, the gradient of that with respect to the replicated parameters is
the whole batch's gradient on every device, and every device applies the same Adam update to its copy of the
parameters. The result equals training on one device with the whole batch (checked at the end).

    TINYJAX_CPU_DEVICES=2 .venv/bin/python examples/data_parallel.py          # 2 CPU devices in this process
    TINYJAX_CPU_DEVICES=4 .venv/bin/python examples/data_parallel.py --steps 50 --batch 256
    .venv/bin/mpiexec -n 2 .venv/bin/python examples/data_parallel.py        # 2 processes (pip install '.[mpi]')
    .venv/bin/python examples/data_parallel.py --coordinator 127.0.0.1:7777 --processes 2 --process-id 0 &
    .venv/bin/python examples/data_parallel.py --coordinator 127.0.0.1:7777 --processes 2 --process-id 1  # over TCP

Under an MPI launcher, `tinyjax.distributed.initialize()` joins the processes: the mesh spans every process's devices,
each process computes the gradient of its shards of the batch, and `pmean` combines them through MPI.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax import lax, nn
from tinyjax.sharding import NamedSharding
from tinyjax.sharding import PartitionSpec as P

SIZES = (64, 128, 128, 10)


def init(seed: int) -> list[dict]:
  rng = np.random.default_rng(seed)
  return [{"w": (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32),
           "b": np.zeros(n_out, np.float32)} for n_in, n_out in zip(SIZES[:-1], SIZES[1:])]


def loss_fn(params: list[dict], x, y):
  for layer in params[:-1]: x = jnp.maximum(x @ layer["w"] + layer["b"], 0)
  logits = x @ params[-1]["w"] + params[-1]["b"]
  return -(nn.log_softmax(logits) * nn.one_hot(y, SIZES[-1])).sum(-1).mean()


def make_step(optimizer, mesh=None):
  """The jitted training step; with a mesh, each device computes the loss of its shard of the batch, `pmean` makes
  it the whole batch's mean loss, and its gradient with respect to the replicated parameters is the same on every
  device (under shard_map's check_vma the parameters' cotangents are summed over the shards, as in JAX)."""
  def grads_of(params, x, y):
    if mesh is None: return tj.value_and_grad(loss_fn)(params, x, y)
    return tj.value_and_grad(lambda p: lax.pmean(loss_fn(p, x, y), "data"))(params)

  if mesh is not None:
    grads_of = tj.shard_map(grads_of, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())

  @tj.jit
  def step(params, opt_state, x, y):
    loss, grads = grads_of(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return nn.optim.apply_updates(params, updates), opt_state, loss
  return step


def train(steps: int, batch: int, mesh=None, seed: int = 0) -> tuple[list[dict], list[float], float]:
  """Train on a fixed synthetic task; return the parameters, the losses and the seconds per step (after the first)."""
  rng = np.random.default_rng(seed + 1)
  teacher = rng.standard_normal((SIZES[0], SIZES[-1])).astype(np.float32)
  optimizer = nn.optim.adam(1e-3)
  params = tj.device_put(init(seed))
  opt_state = optimizer.init(params)
  if mesh is not None:  # the state replicated over the mesh from the start, as the step returns it (committed to the
    # mesh, as JAX's: otherwise the second step's arguments are laid out differently from the first's, and jit
    # traces the step again for them)
    params, opt_state = tj.device_put((params, opt_state), NamedSharding(mesh, P()))
  step = make_step(optimizer, mesh)
  losses, start = [], None
  for number in range(steps):
    x = rng.standard_normal((batch, SIZES[0])).astype(np.float32)
    y = (x @ teacher).argmax(-1).astype(np.int32)
    params, opt_state, loss = step(params, opt_state, x, y)
    losses.append(float(loss))
    if number == 0: start = time.perf_counter()
  seconds = (time.perf_counter() - start) / max(steps - 1, 1)
  return params, losses, seconds


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--devices", type=int, default=0, help="devices on the data axis (default: all)")
  parser.add_argument("--coordinator", help="host:port of process 0, for processes started by hand (over TCP)")
  parser.add_argument("--processes", type=int, default=1, help="how many processes, with --coordinator")
  parser.add_argument("--process-id", type=int, default=0, help="this process's number, with --coordinator")
  args = parser.parse_args()
  if args.coordinator:  # started by hand: JAX's initialize(coordinator_address, num_processes, process_id)
    tj.distributed.initialize(args.coordinator, args.processes, args.process_id)
  elif any(name in os.environ for name in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK")):  # started by mpirun
    tj.distributed.initialize()
  count = args.devices or tj.device_count()
  if args.batch % count:
    raise SystemExit(f"--batch {args.batch} must be divisible by the {count} devices of the data axis")
  mesh = tj.make_mesh((count,), ("data",))
  say = print if tj.process_index() == 0 else (lambda *_: None)
  say(f"{count} devices on the data axis ({tj.process_count()} process{'es' if tj.process_count() > 1 else ''}): "
      f"{mesh}")
  sharded, losses, seconds = train(args.steps, args.batch, mesh)
  single, single_losses, single_seconds = train(args.steps, args.batch)
  say(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} steps")
  say(f"step: {seconds * 1e3:.2f} ms sharded over {count} devices, {single_seconds * 1e3:.2f} ms on one device")
  difference = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                   for a, b in zip(tj.tree_util.tree_leaves(sharded), tj.tree_util.tree_leaves(single)))
  say(f"largest parameter difference from one-device training: {difference:.2e}")


if __name__ == "__main__":
  main()
