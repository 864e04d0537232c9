"""The device API, as JAX's: `devices()`, `device_count()`, `local_devices()`, `default_backend()`, `device_put`,
`device_get`. Which device arrays live on and where computations run is decided in devices/device.py."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.devices.buffer import ShardedBuffer, shard
from tinyjax.devices.device import backend_devices, default_backend, default_device, host_buffer, move
from tinyjax.devices.device import process_count as _process_count
from tinyjax.devices.device import process_index as _process_index
from tinyjax.uop import Ops, UOp

__all__ = ["default_backend", "device_count", "device_get", "device_put", "devices", "local_device_count",
           "local_devices", "make_array_from_callback", "make_array_from_process_local_data",
           "make_array_from_single_device_arrays", "process_count", "process_index", "reshard",
           "with_sharding_constraint"]


def devices(backend: str | None = None) -> list:
  """The devices of `backend` ('cpu', 'cuda' or 'gpu'; default: the default device's platform)."""
  return backend_devices(default_device().platform if backend is None else backend)


def effects_barrier() -> None:
  """Wait until the programs run so far have done their side effects (JAX's): a program's debug prints and host
  callbacks run within its call, and CPU kernels have finished when their launch returns, so this waits for what the
  default backend's devices still run."""
  for device in devices(): device.synchronize()


def local_devices(process_index: int | None = None, backend: str | None = None) -> list:
  """The devices of process `process_index` (default: this one; several only with tinyjax.distributed)."""
  index = _process_index() if process_index is None else process_index
  return [device for device in devices(backend) if getattr(device, "process_index", 0) == index]


def device_count(backend: str | None = None) -> int: return len(devices(backend))
def local_device_count(backend: str | None = None) -> int: return len(local_devices(backend=backend))
def process_index(backend: str | None = None) -> int: return _process_index()
def process_count(backend: str | None = None) -> int: return _process_count()


def _is_device(value: Any) -> bool:
  return hasattr(value, "platform") and hasattr(value, "id") and not isinstance(value, (Array, np.ndarray))


def device_put(x: Any, device: Any = None, *, src: Any = None, donate: bool = False, may_alias: bool | None = None
               ) -> Any:
  """`x` (a pytree of arrays, numpy arrays or scalars) with every leaf on `device` (default: the default device), or
  laid out as a `tinyjax.sharding` Sharding says (a NamedSharding splits each leaf into blocks over the mesh's
  devices), or per leaf as a pytree prefix of devices and shardings says. Arrays already there are returned as they
  are; others are copied (between CPU devices, which share the host's memory, nothing is)."""
  from tinyjax.sharding import NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding, get_mesh
  commit = device is not None  # (without a device, as JAX: on the default device, uncommitted)
  if device is None: device = default_device()

  def target_of(value: Any) -> Any:
    if isinstance(value, PartitionSpec):  # a spec alone: over the current mesh (set_mesh)
      mesh = get_mesh()
      if mesh is None: raise ValueError(f"device_put with a PartitionSpec {value} needs a mesh: use "
                                        "NamedSharding(mesh, spec) or tinyjax.set_mesh(mesh) first")
      return NamedSharding(mesh, value)
    if isinstance(value, SingleDeviceSharding): return next(iter(value.device_set))
    if _is_device(value) or isinstance(value, NamedSharding): return value
    raise TypeError(f"device_put: expected a device such as tinyjax.devices()[0] or a tinyjax.sharding Sharding, got "
                    f"{type(value).__name__}")

  def put(leaf: Any, target: Any) -> Array:
    from tinyjax.trace.core import Tracer
    if isinstance(leaf, Tracer): return _put_traced(leaf, target)
    if isinstance(target, NamedSharding): return _put_sharded(leaf, target)
    # (the result is committed to `target`, as JAX's device_put: computations with it run there)
    if isinstance(leaf, Array):
      buffer = leaf.realize().uop.arg
      if buffer.device is target and (buffer.committed or not commit) and not isinstance(buffer, ShardedBuffer):
        return leaf
      return Array(UOp(Ops.BUFFER, leaf.dtype, (), move(buffer, target, commit=commit)), leaf.weak_type)
    host, weak = _host_value(leaf)
    buffer = host_buffer(host, target)
    buffer.committed = commit
    return Array(UOp(Ops.BUFFER, host.dtype, (), buffer), weak)

  targets, target_tree = tree_util.tree_flatten(
    device, is_leaf=lambda v: _is_device(v) or isinstance(v, (Sharding, PartitionSpec)))
  try: subtrees = target_tree.flatten_up_to(x)
  except ValueError:
    raise ValueError(f"device_put: the devices / shardings must be a device, a Sharding, or a pytree prefix of x; got "
                     f"{target_tree} for a value of structure {tree_util.tree_structure(x)}") from None
  placed = [tree_util.tree_map(lambda leaf, target=target_of(t): put(leaf, target), subtree)
            for subtree, t in zip(subtrees, targets)]
  return tree_util.tree_unflatten(target_tree, placed)


def _put_traced(leaf: Any, target: Any) -> Any:
  """device_put inside a transformation (JAX's): the value, laid out as a NamedSharding target says from there on; a
  value whose sharding is over other devices than the target's is JAX's ValueError (a traced program cannot move data
  between meshes). A device target leaves the value as it is."""
  from tinyjax.sharding import NamedSharding
  from tinyjax.trace.sharding_types import named_of, relabelled
  if not isinstance(target, NamedSharding): return leaf
  current = named_of(leaf)
  if current is not None and set(current.mesh.devices.flat) != set(target.mesh.devices.flat):
    ids = sorted(d.id for d in current.mesh.devices.flat)
    raise ValueError(f"Received incompatible devices for jitted computation: an argument of shape "
                     f"{tuple(leaf.shape)} is on the devices with ids {ids} and device_put inside jit asks for the "
                     f"devices with ids {sorted(d.id for d in target.mesh.devices.flat)}; move it before the jit")
  target.check_shape(tuple(leaf.shape))
  return relabelled(leaf, target)


def _host_value(leaf: Any) -> tuple[np.ndarray, bool]:
  """A leaf that is not an Array as a read-only C-contiguous host copy in its canonical dtype, and its weak type."""
  if isinstance(leaf, (bool, int, float, complex)) and not isinstance(leaf, np.generic):
    host, weak = np.asarray(leaf, dtypes.python_scalar_dtype(leaf)), True
  else:
    host, weak = np.asarray(leaf), False
    host = host.astype(dtypes.canonicalize_dtype(dtypes.dtype(host.dtype)), copy=False)
  host = np.array(host, copy=True, order="C")
  host.flags.writeable = False
  return host, weak


def _put_sharded(leaf: Any, sharding: Any) -> Array:
  """`leaf` laid out as NamedSharding `sharding` (its mesh of CPU devices share the host's memory: no copy of an
  Array's buffer)."""
  shape = tuple(leaf.shape) if isinstance(leaf, Array) else np.shape(leaf)
  sharding.check_shape(shape)
  mesh_devices = list(sharding.mesh.devices.flat)
  if any(device.platform != "cpu" for device in mesh_devices):
    if len(mesh_devices) == 1: return device_put(leaf, mesh_devices[0])
    raise NotImplementedError("device_put: a sharding over several devices needs CPU devices (jax_num_cpu_devices "
                              "or TINYJAX_CPU_DEVICES); GPU meshes are not supported yet")
  if isinstance(leaf, Array):
    buffer, weak = leaf.realize().uop.arg, leaf.weak_type
    if isinstance(buffer, ShardedBuffer) and buffer.sharding == sharding: return leaf
    if buffer.device.platform != "cpu": buffer = move(buffer, mesh_devices[0])
  else:
    host, weak = _host_value(leaf)
    buffer = host_buffer(host, mesh_devices[0])
  return Array(UOp(Ops.BUFFER, buffer.dtype, (), shard(buffer, sharding)), weak)


def device_get(x: Any) -> Any:
  """`x` with every Array leaf copied to a numpy array on the host."""
  return tree_util.tree_map(lambda leaf: np.asarray(leaf) if isinstance(leaf, Array) else leaf, x)


# ---- global arrays from per-process (or per-device) data, as JAX's make_array_from_* functions

def _bounds(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """A device's index (a tuple of slices) as (start, stop) per dimension."""
  return tuple(piece.indices(size)[:2] for piece, size in zip(index, shape))


def _assemble(shape: tuple[int, ...], sharding: Any, pieces: list, dtype: Any) -> Array:
  """The global array from this process's pieces ((bounds, values) each) and, with several processes, every other
  process's (each process then holds the whole value: its shards are blocks of one host buffer), laid out as
  `sharding`. ValueError if some element is in no piece."""
  from tinyjax.devices.device import process_count
  if process_count() > 1:
    from tinyjax.distributed import gather_objects
    pieces = [piece for process_pieces in gather_objects(pieces) for piece in process_pieces]
  if dtype is None: dtype = pieces[0][1].dtype if pieces else np.float32
  dtype = dtypes.canonicalize_dtype(np.dtype(dtype))
  full = np.zeros(shape, dtype)
  covered = np.zeros(shape, bool)
  for bounds, values in pieces:
    region = tuple(slice(start, stop) for start, stop in bounds)
    if full[region].shape != np.shape(values):
      raise ValueError(f"a shard of shape {np.shape(values)} does not fit its place {region} in the global shape "
                       f"{shape} laid out as {sharding}")
    full[region] = values
    covered[region] = True
  if not covered.all():
    raise ValueError(f"the shards given cover only {int(covered.sum())} of the {covered.size} elements of the global "
                     f"shape {shape} laid out as {sharding}")
  return device_put(full, sharding)


def _local_index_map(shape: tuple[int, ...], sharding: Any) -> dict:
  """{this process's device: its index} for an array of `shape` laid out as `sharding`."""
  from tinyjax.devices.device import process_index
  return {device: index for device, index in sharding.devices_indices_map(shape).items()
          if getattr(device, "process_index", 0) == process_index()}


def make_array_from_callback(shape: tuple[int, ...], sharding: Any, data_callback: Any, dtype: Any = None) -> Array:
  """The array of `shape` laid out as `sharding` whose shard on each of this process's devices is
  `data_callback(index)` (index: a tuple of slices into the global array), as JAX's."""
  shape = tuple(int(d) for d in shape)
  pieces = [(_bounds(index, shape), np.asarray(data_callback(index)))
            for index in _local_index_map(shape, sharding).values()]
  return _assemble(shape, sharding, pieces, dtype)


def make_array_from_single_device_arrays(shape: tuple[int, ...], sharding: Any, arrays: Any, *,
                                         dtype: Any = None) -> Array:
  """The array of `shape` laid out as `sharding` from one array per device of this process (each on its device,
  holding that device's shard), as JAX's."""
  shape = tuple(int(d) for d in shape)
  index_map = _local_index_map(shape, sharding)
  pieces = []
  for array in arrays:
    device = array.device if isinstance(array, Array) else None
    if device not in index_map:
      raise ValueError(f"make_array_from_single_device_arrays: an array on {device} is not on one of this process's "
                       f"devices of {sharding}: {sorted(map(repr, index_map))}")
    pieces.append((_bounds(index_map[device], shape), np.asarray(array)))
  return _assemble(shape, sharding, pieces, dtype)


def make_array_from_process_local_data(sharding: Any, local_data: Any, global_shape: Any = None) -> Array:
  """The global array laid out as `sharding` of which this process holds `local_data`: the block its devices'
  shards cover (the whole array in one process), as JAX's. `global_shape` defaults to the local shape scaled by how
  many such blocks each dimension has."""
  local_data = np.asarray(local_data)
  ndim = local_data.ndim
  blocks = sharding.blocks(ndim)  # (an array of this shape has one element per block: indices are block numbers)
  mine = [_bounds(index, blocks) for index in _local_index_map(blocks, sharding).values()]
  lows = [min(bounds[d][0] for bounds in mine) for d in range(ndim)]
  highs = [max(bounds[d][1] for bounds in mine) for d in range(ndim)]
  if global_shape is None:
    global_shape = tuple(local_data.shape[d] * blocks[d] // (highs[d] - lows[d]) for d in range(ndim))
  global_shape = tuple(int(d) for d in global_shape)
  bounds = tuple((lows[d] * global_shape[d] // blocks[d], highs[d] * global_shape[d] // blocks[d])
                 for d in range(ndim))
  if tuple(stop - start for start, stop in bounds) != local_data.shape:
    raise ValueError(f"make_array_from_process_local_data: this process's data has shape {local_data.shape}, but its "
                     f"devices hold the block {bounds} of the global shape {global_shape} laid out as {sharding}")
  return _assemble(global_shape, sharding, [(bounds, local_data)], local_data.dtype)


def with_sharding_constraint(x: Any, shardings: Any) -> Any:
  """`x` laid out as `shardings` say (a Sharding, a PartitionSpec under `set_mesh`, or a pytree prefix of them), as
  JAX's `lax.with_sharding_constraint`: eagerly a `device_put`; inside a transformation the value itself, carrying
  that sharding from there on (trace/sharding_types.py; a traced program computes on whole arrays)."""
  from tinyjax.trace.core import Tracer
  if not any(isinstance(leaf, Tracer) for leaf in tree_util.tree_leaves(x)): return device_put(x, shardings)
  from tinyjax.sharding import NamedSharding, PartitionSpec, Sharding, get_mesh
  from tinyjax.trace.sharding_types import relabelled
  targets, target_tree = tree_util.tree_flatten(shardings, is_leaf=lambda v: isinstance(v, (Sharding, PartitionSpec)))
  subtrees = target_tree.flatten_up_to(x)

  def constrain(leaf: Any, target: Any) -> Any:
    if isinstance(target, PartitionSpec):
      mesh = get_mesh()
      if mesh is None: raise ValueError(f"a sharding constraint with a PartitionSpec {target} needs a mesh: use "
                                        "NamedSharding(mesh, spec) or tinyjax.set_mesh(mesh) first")
      target = NamedSharding(mesh, target)
    if not isinstance(target, NamedSharding) or not isinstance(leaf, Tracer): return leaf
    target.check_shape(tuple(leaf.shape), "with_sharding_constraint arguments")
    return relabelled(leaf, target)
  placed = [tree_util.tree_map(lambda leaf, target=t: constrain(leaf, target), subtree)
            for subtree, t in zip(subtrees, targets)]
  return tree_util.tree_unflatten(target_tree, placed)


reshard = with_sharding_constraint  # (JAX's `reshard` for explicit mesh axes: the same here)


def with_out_sharding(fn: Any, device: bool = False) -> Any:
  """`fn` with JAX's keyword `out_sharding=`: its result laid out so (a NamedSharding, or a PartitionSpec under
  `set_mesh`), computed without JAX's sharding type errors, which the given layout resolves. With `device`, also the
  keyword `device=` of JAX's (and the array API's) creation functions: the result is `device_put` there (a Device or
  a Sharding), committed, as JAX's."""
  import functools

  @functools.wraps(fn)
  def call(*args: Any, out_sharding: Any = None, **kwargs: Any) -> Any:
    target = kwargs.pop("device", None) if device else None
    if out_sharding is None: result = fn(*args, **kwargs)
    else:
      from tinyjax.trace.sharding_types import unchecked
      with unchecked(): result = fn(*args, **kwargs)
      result = with_sharding_constraint(result, out_sharding)
    return result if target is None else device_put(result, target)
  # the signature shows the keywords the wrapper adds (inspect.signature, the array API's signature tests)
  import inspect
  signature = inspect.signature(fn)
  params = list(signature.parameters.values())
  keyword_only = inspect.Parameter.KEYWORD_ONLY
  extra = [name for name in (("device", "out_sharding") if device else ("out_sharding",)) if name not in
           signature.parameters]
  variadic = [i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD]
  position = variadic[0] if variadic else len(params)
  params[position:position] = [inspect.Parameter(name, keyword_only, default=None) for name in extra]
  call.__signature__ = signature.replace(parameters=params)
  return call


def with_device(fn: Any) -> Any:
  """`with_out_sharding(fn, device=True)`: a creation function's `out_sharding=` and `device=` keywords."""
  return with_out_sharding(fn, device=True)
