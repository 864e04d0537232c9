"""shard_map programs run by tests/test_distributed.py: in one process over N CPU devices, and under `mpiexec -n P`
(or P processes started by hand, joined over TCP through a coordinator address) over P processes of N / P devices
each (`python -m tests.mpi_worker DIR`, after tinyjax.distributed.initialize),
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
    "grad_from_outside": lambda: _grad_from_outside(mesh, x),
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
  """Forward mode through shard_maps from outside them (psum, all_gather)."""
  gathered = tj.shard_map(lambda v: lax.all_gather(v, "i", tiled=True) * (1 + lax.axis_index("i")), mesh=mesh,
                          in_specs=P("i"), out_specs=P("i"))
  total = tj.shard_map(lambda v: lax.psum(v * v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
  ones = np.ones_like(x)
  _, first = tj.jvp(lambda v: (gathered(v) ** 2).sum(), (x,), (ones,))
  _, second = tj.jvp(lambda v: total(v).sum(), (x,), (ones,))
  return [float(first), float(second)]


def _grad_from_outside(mesh, x: np.ndarray) -> dict:
  """Reverse mode through shard_maps from outside them: every collective, arguments split over the processes or the
  same in all of them, values the same in every process used by each process's shards and by every process whole
  (their cotangents must be summed over the processes once, not once per process), eagerly and under jit."""
  w = _data(4, 5)
  ring = [(k, (k + 1) % mesh.size) for k in range(mesh.size)]
  maps = {
    "psum": (lambda v, w: lax.psum(v * v * w.sum(), "i"), P(), (P("i"), P())),
    "gather": (lambda v, w: lax.all_gather(v * w[0], "i", tiled=True) * (1 + lax.axis_index("i")), P("i"),
               (P("i"), P())),
    "scatter": (lambda v, w: lax.psum_scatter(v * w[1], "i", tiled=True), P("i"), (P(), P())),
    "ppermute": (lambda v, w: lax.ppermute(jnp.sin(v), "i", ring) * w[2], P("i"), (P("i"), P())),
    "all_to_all": (lambda v, w: lax.all_to_all(jnp.tile(v, mesh.size).reshape(mesh.size, -1), "i", 0, 0,
                                               tiled=True) * w[3], P("i"), (P("i"), P())),
    # w both meets the shards and is used whole by every process (an output that is not split)
    "mixed": (lambda v, w: (lax.psum(v * w[0], "i") + w[1] * w[2], w * 3.0), (P(), P()), (P("i"), P())),
    "pmean_loss": (lambda v, w: lax.pmean(((jnp.tanh(v * w[0]) - w[1]) ** 2).mean(), "i"), P(), (P("i"), P())),
  }
  results = {}
  for name, (fn, out_specs, in_specs) in maps.items():
    mapped = tj.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)

    def loss(v, w, mapped=mapped):
      out = mapped(v, w)
      return sum(jnp.cos(leaf).sum() for leaf in tj.tree_util.tree_leaves(out)) + (v * w.sum()).sum()
    eager = tj.grad(loss, argnums=(0, 1))(x, w)
    jitted = tj.jit(tj.value_and_grad(loss, argnums=(0, 1)))(x, w)
    results[name] = np.concatenate([np.asarray(g).ravel() for g in eager] +
                                   [np.ravel(jitted[0])] + [np.asarray(g).ravel() for g in jitted[1]]).tolist()
  return results


def run(count: int) -> dict:
  """Every case's result as nested lists."""
  results = {}
  for name, fn in cases(count).items():
    value = fn()
    if isinstance(value, dict): results.update({f"{name}.{key}": part for key, part in value.items()})
    else: results[name] = value if isinstance(value, list) else np.asarray(value).tolist()
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
  # started by mpiexec, or by hand: TINYJAX_TEST_COORDINATOR="host:port processes process_id" (over TCP)
  coordinator = __import__("os").environ.get("TINYJAX_TEST_COORDINATOR")
  if coordinator:
    address, processes, process_id = coordinator.split()
    tj.distributed.initialize(address, int(processes), int(process_id))
  else:
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
