"""shard_map programs run by tests/test_distributed.py: in one process over N CPU devices, and under `mpiexec -n P`
over P processes of N / P devices each (`python -m tests.mpi_worker DIR`, after tinyjax.distributed.initialize),
where each process writes its results to DIR/process<index>.json; every process must have the one-process values."""
from __future__ import annotations

import json
import sys

import numpy as np

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax import lax
from tinyjax.sharding import PartitionSpec as P


def _data(n: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def cases(count: int) -> dict:
  """name -> a function of no arguments computing a result, on meshes of `count` devices."""
  mesh = tj.make_mesh((count,), ("i",))
  x = _data(4 * count, 0)
  ring = [(k, (k + 1) % count) for k in range(count)]
  out = {
    "psum": lambda: tj.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(x),
    "pmax_pmin": lambda: tj.shard_map(lambda v: lax.pmax(v, "i") - lax.pmin(v, "i"), mesh=mesh, in_specs=P("i"),
                                      out_specs=P())(x),
    "axis_index": lambda: tj.shard_map(lambda v: v * lax.axis_index("i") + lax.axis_size("i"), mesh=mesh,
                                       in_specs=P("i"), out_specs=P("i"))(x),
    "all_gather": lambda: tj.shard_map(lambda v: lax.all_gather(v, "i", tiled=True) * 2, mesh=mesh, in_specs=P("i"),
                                       out_specs=P("i"))(x),
    "ppermute_jit": lambda: tj.jit(tj.shard_map(lambda v: lax.ppermute(v, "i", ring), mesh=mesh, in_specs=P("i"),
                                                out_specs=P("i")))(x),
    "psum_scatter": lambda: tj.shard_map(lambda v: lax.psum_scatter(v * (1 + lax.axis_index("i")), "i", tiled=True),
                                         mesh=mesh, in_specs=P(), out_specs=P("i"))(x),
    "all_to_all": lambda: tj.shard_map(lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True), mesh=mesh,
                                       in_specs=P("i"), out_specs=P("i"))(_data(count * count * 2, 1)),
    "data_parallel_grad": lambda: _data_parallel(mesh),
    "from_process_local_data": lambda: _from_local_data(mesh),
    "jvp_from_outside": lambda: _jvp_from_outside(mesh, x),
  }
  if count == 4:
    grid = tj.make_mesh((2, 2), ("x", "y"))
    a = _data(16, 2).reshape(4, 4)
    out["two_axes"] = lambda: tj.shard_map(lambda b: lax.psum(b, "y") + lax.psum(b, "x") * lax.axis_index("y"),
                                           mesh=grid, in_specs=P("x", "y"), out_specs=P("x", "y"))(a)
    out["two_axes_total"] = lambda: tj.jit(tj.shard_map(lambda b: lax.psum(b.sum(), ("x", "y")), mesh=grid,
                                                        in_specs=P("x", "y"), out_specs=P()))(a)
  return out


def _data_parallel(mesh) -> list:
  """The gradient of the pmean'ed loss of a small MLP, the batch split over the mesh."""
  rng = np.random.default_rng(3)
  params = {"w": rng.standard_normal((5, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}
  x = rng.standard_normal((8 * mesh.size, 5)).astype(np.float32)
  y = rng.standard_normal((8 * mesh.size, 4)).astype(np.float32)

  def loss(p, xb, yb):
    return ((jnp.tanh(xb @ p["w"] + p["b"]) - yb) ** 2).mean()

  def local(p, xb, yb):
    return tj.grad(lambda q: lax.pmean(loss(q, xb, yb), "i"))(p)
  grads = tj.jit(tj.shard_map(local, mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=P()))(params, x, y)
  return np.concatenate([np.asarray(grads["w"]).ravel(), np.asarray(grads["b"])]).tolist()


def _from_local_data(mesh) -> list:
  """A global batch made from each process's rows (make_array_from_process_local_data), reduced in a shard_map,
  and gathered back (multihost_utils.process_allgather)."""
  from tinyjax.experimental import multihost_utils
  from tinyjax.sharding import NamedSharding
  full = np.arange(8.0 * mesh.size, dtype=np.float32).reshape(4 * mesh.size, 2)
  rows = len(full) // tj.process_count()
  local = full[tj.process_index() * rows:(tj.process_index() + 1) * rows]
  batch = tj.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
  total = tj.shard_map(lambda b: lax.psum(b.sum(0), "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(batch)
  gathered = multihost_utils.process_allgather(batch)
  return np.concatenate([np.asarray(total), gathered.ravel()]).tolist()


def _jvp_from_outside(mesh, x: np.ndarray) -> list:
  """Forward mode through shard_maps from outside them (psum, all_gather); reverse mode from outside raises
  NotImplementedError over several processes (checked here: the value recorded is the same either way)."""
  gathered = tj.shard_map(lambda v: lax.all_gather(v, "i", tiled=True) * (1 + lax.axis_index("i")), mesh=mesh,
                          in_specs=P("i"), out_specs=P("i"))
  total = tj.shard_map(lambda v: lax.psum(v * v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
  ones = np.ones_like(x)
  _, first = tj.jvp(lambda v: (gathered(v) ** 2).sum(), (x,), (ones,))
  _, second = tj.jvp(lambda v: total(v).sum(), (x,), (ones,))
  try:
    tj.grad(lambda v: total(v).sum())(x)
    raised = tj.process_count() == 1
  except NotImplementedError:
    raised = tj.process_count() > 1
  return [float(first), float(second), float(raised)]


def run(count: int) -> dict:
  """Every case's result as nested lists."""
  results = {}
  for name, fn in cases(count).items():
    value = fn()
    results[name] = value if isinstance(value, list) else np.asarray(value).tolist()
  return results


def misbehave(mode: str) -> None:
  """Process 1 fails ("fail": an exception) or hangs ("stuck") before a psum the others wait in."""
  if tj.process_index() == 1:
    if mode == "fail": raise RuntimeError("process 1 fails on purpose")
    import time
    time.sleep(120)
  mesh = tj.make_mesh((tj.device_count(),), ("i",))
  tj.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(np.ones(4, np.float32))


if __name__ == "__main__":
  tj.distributed.initialize()
  if len(sys.argv) > 2:
    misbehave(sys.argv[2])
    sys.exit(0)
  from tinyjax.sharding import NamedSharding
  placed = tj.device_put(np.arange(4.0 * tj.device_count()), NamedSharding(tj.make_mesh((tj.device_count(),), ("i",)),
                                                                         P("i")))
  result = {"process": tj.process_index(), "processes": tj.process_count(), "devices": tj.device_count(),
            "local_devices": tj.local_device_count(), "results": run(tj.device_count()),
            "addressable_shards": [[shard.device.id, np.asarray(shard.data).tolist()]
                                   for shard in placed.addressable_shards]}
  with open(f"{sys.argv[1]}/process{tj.process_index()}.json", "w") as file: json.dump(result, file)
