"""Shardings, as `jax.sharding`: `Mesh`, `PartitionSpec` (also `tinyjax.P`), `NamedSharding`, `SingleDeviceSharding`,
and `make_mesh`.

A `Mesh` is an n-dimensional array of devices with a name per axis; a `PartitionSpec` says, per dimension of an array,
which mesh axes (none, one, or a tuple of them, the first major) split it; a `NamedSharding(mesh, spec)` pairs them.
An array's shard on a device is the block of each dimension at that device's coordinates along the dimension's mesh
axes; mesh axes a spec does not name hold copies (replicas).

In one process the devices of a mesh are CPU devices (`jax_num_cpu_devices` / TINYJAX_CPU_DEVICES), which share the
host's memory: a sharded array keeps the whole array in one host buffer and each device's shard is a block of it
(`Array.addressable_shards`), so placing, assembling (`np.asarray`) and computing on sharded arrays copy nothing.
`shard_map` (trace/shard_map.py) runs a function per shard, all shards in the same kernels.
"""
from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import numpy as np

__all__ = ["AbstractMesh", "AxisType", "Mesh", "NamedSharding", "PartitionSpec", "Shard", "Sharding",
           "SingleDeviceSharding", "auto_axes", "explicit_axes", "get_abstract_mesh", "get_mesh", "make_mesh",
           "set_mesh", "use_abstract_mesh", "use_mesh"]


class PartitionSpec(tuple):
  """How an array's dimensions are split over mesh axes: one entry per leading dimension, each None (not split), a
  mesh axis name, or a tuple of names (split over their product, the first name major). Missing trailing entries
  are None. `P()` replicates the array over the whole mesh."""

  def __new__(cls, *partitions: Any) -> PartitionSpec:
    entries = []
    for entry in partitions:
      if isinstance(entry, (list, tuple)):
        entry = tuple(entry)
        if not all(isinstance(name, str) for name in entry):
          raise TypeError(f"PartitionSpec entries must be None, a mesh axis name or a tuple of names, got {entry!r}")
        entry = entry[0] if len(entry) == 1 else (entry or None)
      elif entry is not None and not isinstance(entry, str):
        raise TypeError(f"PartitionSpec entries must be None, a mesh axis name or a tuple of names, got {entry!r}")
      entries.append(entry)
    return super().__new__(cls, entries)

  def __repr__(self) -> str: return f"P({', '.join(map(repr, self))}{',' if len(self) == 1 else ''})"

  def axes_of(self, dim: int) -> tuple[str, ...]:
    """The mesh axes that split dimension `dim` (empty when it is not split)."""
    entry = self[dim] if dim < len(self) else None
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)

  def axis_names(self) -> tuple[str, ...]:
    """Every mesh axis the spec names, in order."""
    return tuple(name for dim in range(len(self)) for name in self.axes_of(dim))


P = PartitionSpec

_mesh_stack: list[Mesh] = []  # the meshes of enclosing `with mesh:` / `use_mesh` blocks


class Mesh:
  """An n-dimensional array of devices (`devices`, a numpy object array) with a name per axis (`axis_names`).
  Usable as a context manager: inside `with mesh:` it is the mesh `shard_map` uses when none is given."""

  def __init__(self, devices: Any, axis_names: str | Sequence[str], axis_types: Any = None):
    devices = np.asarray(devices, dtype=object) if not isinstance(devices, np.ndarray) else devices
    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    if not all(isinstance(name, str) for name in names):
      raise TypeError(f"Mesh axis names must be strings, got {names!r}")
    if len(set(names)) != len(names): raise ValueError(f"Mesh axis names must be unique, got {names!r}")
    if devices.ndim != len(names):
      raise ValueError(f"Mesh requires the number of axis names ({len(names)}: {names!r}) to equal the rank of the "
                       f"devices array (shape {devices.shape})")
    ids = [device.id for device in devices.flat]
    if len(set(ids)) != len(ids): raise ValueError(f"Mesh devices must be distinct, got ids {ids}")
    self.devices, self.axis_names, self._hash = devices, names, None
    self.axis_types = tuple(axis_types) if isinstance(axis_types, (list, tuple)) else \
        (axis_types,) * len(names) if axis_types is not None else ("Auto",) * len(names)

  @property
  def shape(self) -> OrderedDict:
    """{axis name: size}, in axis order."""
    return OrderedDict(zip(self.axis_names, self.devices.shape))

  @property
  def axis_sizes(self) -> tuple[int, ...]: return tuple(self.devices.shape)
  @property
  def size(self) -> int: return int(self.devices.size)
  @property
  def empty(self) -> bool: return self.devices.size == 0
  @property
  def device_ids(self) -> np.ndarray: return np.vectorize(lambda device: device.id, otypes=[int])(self.devices)
  @property
  def local_devices(self) -> list: return list(self.devices.flat)
  @property
  def shape_tuple(self) -> tuple[tuple[str, int], ...]: return tuple(self.shape.items())

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, Mesh) and self.axis_names == other.axis_names and \
        self.devices.shape == other.devices.shape and all(a is b for a, b in zip(self.devices.flat, other.devices.flat))

  def __hash__(self) -> int:
    if self._hash is None:  # (once: jit's hot path hashes the current mesh on every call)
      self._hash = hash((self.axis_names, self.devices.shape, tuple(map(id, self.devices.flat))))
    return self._hash

  def __repr__(self) -> str:
    axes = ", ".join(f"{name!r}: {size}" for name, size in self.shape.items())
    types = ", ".join(str(getattr(t, "name", t)) for t in self.axis_types)
    return f"Mesh({axes}, axis_types=({types}{',' if len(self.axis_types) == 1 else ''}))"

  def __enter__(self) -> Mesh:
    _mesh_stack.append(self)
    return self

  def __exit__(self, *exc: Any) -> None: _mesh_stack.pop()

  @property
  def abstract_mesh(self) -> AbstractMesh:
    platform = getattr(self.devices.flat[0], "platform", None) if self.devices.size else None
    return AbstractMesh(self.axis_sizes, self.axis_names, self.axis_types, platform=platform)

  def coordinates(self) -> dict[Any, tuple[int, ...]]:
    """{device: its index along each mesh axis}."""
    return {device: index for index, device in np.ndenumerate(self.devices)}

  def check_spec(self, spec: PartitionSpec, ndim: int, what: str = "array") -> None:
    """ValueError unless `spec` fits an array of rank `ndim` on this mesh: no more entries than dimensions, only this
    mesh's axis names, each at most once."""
    _check_spec(self, spec, ndim, what)


def _check_spec(mesh: Mesh | AbstractMesh, spec: PartitionSpec, ndim: int, what: str) -> None:
  """`Mesh.check_spec`'s checks, for a mesh or an abstract mesh."""
  if len(spec) > ndim:
    raise ValueError(f"{spec} has {len(spec)} entries but the {what} has rank {ndim}: a PartitionSpec has at most "
                     "one entry per dimension")
  names = spec.axis_names()
  for name in names:
    if name not in mesh.axis_names:
      raise ValueError(f"Resource axis: {name} of {spec} is not found in mesh: {tuple(mesh.axis_names)}.")
  if len(set(names)) != len(names):
    raise ValueError(f"A mesh axis may split at most one dimension: {spec} names "
                     f"{sorted({n for n in names if names.count(n) > 1})} more than once")


@contextlib.contextmanager
def use_mesh(mesh: Mesh) -> Iterator[Mesh]:
  """Make `mesh` the current mesh inside the block (as `with mesh:`)."""
  with mesh: yield mesh


class set_mesh:  # noqa: N801  (a function in JAX's API that is also a context manager)
  """`set_mesh(mesh)` makes `mesh` the current mesh from now on (`shard_map` without `mesh=`, `device_put(x, P(...))`);
  `with set_mesh(mesh):` only inside the block."""

  def __init__(self, mesh: Mesh):
    if not isinstance(mesh, Mesh): raise TypeError(f"set_mesh expects a Mesh, got {type(mesh).__name__}")
    self.previous, self.mesh = list(_mesh_stack), mesh
    _mesh_stack.append(mesh)

  def __enter__(self) -> Mesh: return self.mesh
  def __exit__(self, *exc: Any) -> None: _mesh_stack[:] = self.previous


def get_mesh() -> Mesh | None:
  """The current concrete mesh (`set_mesh`, `with mesh:`), or None."""
  return _mesh_stack[-1] if _mesh_stack else None


def get_abstract_mesh() -> AbstractMesh:
  """The current mesh's `AbstractMesh` (its axis names, sizes and types); an empty one when no mesh is set."""
  return _mesh_stack[-1].abstract_mesh if _mesh_stack else AbstractMesh((), ())


class AbstractMesh:
  """A mesh's shape without its devices (JAX's `AbstractMesh`): `axis_sizes`, `axis_names`, `axis_types`. Under
  `use_abstract_mesh` it renames or reshapes the current mesh's devices (the same number of them)."""

  def __init__(self, axis_sizes: Sequence[int], axis_names: Sequence[str], axis_types: Any = None, *,
               platform: str | None = None):
    self.axis_sizes, self.axis_names = tuple(int(s) for s in axis_sizes), tuple(axis_names)
    if len(self.axis_sizes) != len(self.axis_names):
      raise ValueError(f"AbstractMesh: {len(self.axis_sizes)} axis sizes but {len(self.axis_names)} axis names")
    self.axis_types = tuple(axis_types) if isinstance(axis_types, (list, tuple)) else \
        (axis_types,) * len(self.axis_names) if axis_types is not None else (AxisType.Auto,) * len(self.axis_names)
    self.platform = platform

  @property
  def shape(self) -> OrderedDict: return OrderedDict(zip(self.axis_names, self.axis_sizes))
  @property
  def size(self) -> int: return math.prod(self.axis_sizes)
  @property
  def empty(self) -> bool: return not self.axis_names
  @property
  def abstract_mesh(self) -> AbstractMesh: return self

  def check_spec(self, spec: PartitionSpec, ndim: int, what: str = "array") -> None: _check_spec(self, spec, ndim, what)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, AbstractMesh) and (self.axis_sizes, self.axis_names, self.axis_types) == (
      other.axis_sizes, other.axis_names, other.axis_types)

  def __hash__(self) -> int: return hash((self.axis_sizes, self.axis_names, self.axis_types))

  def __repr__(self) -> str:
    if self.empty: return "AbstractMesh((), axis_types=())"
    axes = ", ".join(f"{name!r}: {size}" for name, size in self.shape.items())
    types = ", ".join(str(getattr(t, "name", t)) for t in self.axis_types)
    device = f", device_kind={self.platform}, num_cores=None, platform={self.platform}" if self.platform else ""
    return f"AbstractMesh({axes}, axis_types=({types}{',' if len(self.axis_types) == 1 else ''}){device})"


@contextlib.contextmanager
def use_abstract_mesh(mesh: AbstractMesh) -> Iterator[Mesh]:
  """Inside the block, the current mesh's devices (in order) as `mesh` shapes, names and types them (as JAX's
  `use_abstract_mesh`: the number of devices must not change)."""
  current = get_mesh()
  if current is None: raise ValueError("use_abstract_mesh needs a current mesh: call tinyjax.set_mesh(mesh) first")
  if mesh.size != current.size:
    raise ValueError(f"use_abstract_mesh: {mesh} has {mesh.size} devices but the current mesh has {current.size}")
  with Mesh(current.devices.reshape(mesh.axis_sizes), mesh.axis_names, mesh.axis_types) as concrete: yield concrete


def _with_axis_types(f: Callable, axes: Any, kind: str, sharding_name: str, doc: str) -> Callable:
  """The decorator of `auto_axes` / `explicit_axes`: `f` called with the current mesh's `axes` (all by default)
  switched to `kind`, its inputs (explicit_axes' `in_sharding`) or output (auto_axes' `out_sharding`) laid out as the
  call says."""
  import functools

  from tinyjax import tree_util
  from tinyjax.placement import with_sharding_constraint

  @functools.wraps(f)
  def call(*args: Any, **kwargs: Any) -> Any:
    sharding = kwargs.pop(sharding_name, None)
    mesh = get_mesh()
    if mesh is None: raise ValueError(f"{kind.lower()}_axes needs a mesh: call tinyjax.set_mesh(mesh) first")
    names = mesh.axis_names if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    types = tuple(kind if name in names else t for name, t in zip(mesh.axis_names, mesh.axis_types))
    with Mesh(mesh.devices, mesh.axis_names, types):
      if sharding_name == "in_sharding" and sharding is not None:
        leaves, tree = tree_util.tree_flatten(args)
        args = tree_util.tree_unflatten(tree, [with_sharding_constraint(leaf, sharding) for leaf in leaves])
      out = f(*args, **kwargs)
    if sharding_name == "out_sharding" and sharding is not None: out = with_sharding_constraint(out, sharding)
    return out
  call.__doc__ = doc + (f"\n\n{f.__doc__}" if f.__doc__ else "")
  return call


def auto_axes(f: Callable | None = None, /, *, axes: Any = None, out_sharding: Any = None) -> Callable:
  """JAX's `auto_axes`: `f` runs with the current mesh's axes (or `axes`) Auto, so its shardings are not in types and
  raise no sharding type errors; its result is laid out as `out_sharding` (given here or at the call)."""
  if f is None: return lambda g: auto_axes(g, axes=axes, out_sharding=out_sharding)
  wrapped = _with_axis_types(f, axes, AxisType.Auto, "out_sharding", auto_axes.__doc__)
  if out_sharding is None: return wrapped
  return lambda *args, **kwargs: wrapped(*args, out_sharding=kwargs.pop("out_sharding", out_sharding), **kwargs)


def explicit_axes(f: Callable | None = None, /, *, axes: Any = None, in_sharding: Any = None) -> Callable:
  """JAX's `explicit_axes`: `f` runs with the current mesh's axes (or `axes`) Explicit, its arguments laid out as
  `in_sharding` (given here or at the call)."""
  if f is None: return lambda g: explicit_axes(g, axes=axes, in_sharding=in_sharding)
  wrapped = _with_axis_types(f, axes, AxisType.Explicit, "in_sharding", explicit_axes.__doc__)
  if in_sharding is None: return wrapped
  return lambda *args, **kwargs: wrapped(*args, in_sharding=kwargs.pop("in_sharding", in_sharding), **kwargs)


class AxisType:
  """How a mesh axis is partitioned (JAX's `AxisType`). Arrays over Explicit axes show their sharding in their type
  (`typeof(x)` prints `float32[8@X,4]`) and JAX's sharding type errors apply to them (trace/sharding_types.py); over
  Auto axes the same shardings are propagated silently. Manual is shard_map's."""
  Auto, Explicit, Manual = "Auto", "Explicit", "Manual"


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str], axis_types: Any = None, *,
              devices: Sequence | None = None) -> Mesh:
  """A mesh of the first prod(axis_shapes) devices (default: `tinyjax.devices()`) in order, shaped `axis_shapes`; its
  axes are Explicit unless `axis_types` says otherwise (as JAX's make_mesh; the Mesh constructor's default is Auto)."""
  from tinyjax.placement import devices as all_devices
  axis_shapes, axis_names = tuple(int(s) for s in axis_shapes), tuple(axis_names)
  if len(axis_shapes) != len(axis_names):
    raise ValueError(f"make_mesh: {len(axis_shapes)} axis shapes {axis_shapes} but {len(axis_names)} axis names")
  pool = list(all_devices() if devices is None else devices)
  count = math.prod(axis_shapes)
  if count > len(pool):
    raise ValueError(f"make_mesh: the mesh {axis_shapes} needs {count} devices but only {len(pool)} are available "
                     "(more CPU devices: jax_num_cpu_devices or TINYJAX_CPU_DEVICES)")
  grid = np.empty(count, dtype=object)
  grid[:] = pool[:count]
  return Mesh(grid.reshape(axis_shapes), axis_names, AxisType.Explicit if axis_types is None else axis_types)


class Sharding:
  """How an array is laid out over devices: `device_set`, `devices_indices_map(shape)` ({device: index of its
  shard, a tuple of slices}), `shard_shape(shape)`, `is_fully_replicated`."""
  memory_kind = "device"

  @property
  def addressable_devices(self) -> set: return self.device_set
  @property
  def num_devices(self) -> int: return len(self.device_set)

  def addressable_devices_indices_map(self, global_shape: tuple[int, ...]) -> dict:
    return self.devices_indices_map(global_shape)

  def blocks(self, ndim: int) -> tuple[int, ...]:
    """Into how many blocks each dimension of an array of rank `ndim` is split."""
    return (1,) * ndim

  def is_equivalent_to(self, other: Sharding, ndim: int) -> bool:
    shape = tuple(math.lcm(a, b) for a, b in zip(self.blocks(ndim), other.blocks(ndim)))  # (both divide it)
    return self.devices_indices_map(shape) == other.devices_indices_map(shape)


class SingleDeviceSharding(Sharding):
  """The whole array on one device."""

  def __init__(self, device: Any, *, memory_kind: str | None = None):
    self._device = device

  @property
  def device_set(self) -> set: return {self._device}
  @property
  def is_fully_replicated(self) -> bool: return True

  def devices_indices_map(self, global_shape: tuple[int, ...]) -> dict:
    return {self._device: (slice(None),) * len(global_shape)}

  def shard_shape(self, global_shape: tuple[int, ...]) -> tuple[int, ...]: return tuple(global_shape)
  def __eq__(self, other: Any) -> bool: return isinstance(other, SingleDeviceSharding) and other._device is self._device
  def __hash__(self) -> int: return hash(("single", id(self._device)))
  def __repr__(self) -> str: return f"SingleDeviceSharding(device={self._device!r}, memory_kind=device)"


class NamedSharding(Sharding):
  """An array split over `mesh` as `spec` says (see the module docstring)."""

  def __init__(self, mesh: Mesh | AbstractMesh, spec: PartitionSpec, *, memory_kind: str | None = None):
    if not isinstance(mesh, (Mesh, AbstractMesh)):
      raise TypeError(f"NamedSharding expects a Mesh, got {type(mesh).__name__}")
    if not isinstance(spec, PartitionSpec):
      if spec is None: spec = PartitionSpec()
      elif isinstance(spec, (tuple, list)): spec = PartitionSpec(*spec)
      else: raise TypeError(f"NamedSharding expects a PartitionSpec, got {type(spec).__name__}: {spec!r}")
    mesh.check_spec(spec, len(spec))
    self.mesh, self.spec, self._hash = mesh, spec, None
    from tinyjax.trace.sharding_types import enable
    enable()  # (arrays carry shardings through operations from now on)

  @property
  def device_set(self) -> set: return set(self.mesh.devices.flat)
  @property
  def is_fully_replicated(self) -> bool: return not self.spec.axis_names()

  def _split(self, dim: int) -> int:
    """Into how many blocks dimension `dim` is split."""
    return math.prod(self.mesh.shape[name] for name in self.spec.axes_of(dim))

  def blocks(self, ndim: int) -> tuple[int, ...]: return tuple(self._split(dim) for dim in range(ndim))

  def check_shape(self, global_shape: tuple[int, ...], what: str = "device_put args") -> None:
    """ValueError unless every split dimension of `global_shape` divides evenly over its mesh axes."""
    self.mesh.check_spec(self.spec, len(global_shape))
    for dim, size in enumerate(global_shape):
      if size % self._split(dim):
        raise ValueError(f"One of {what} was given the sharding of {self}, which implies that the global size of its "
                         f"dimension {dim} should be divisible by {self._split(dim)}, but it is equal to {size} (full "
                         f"shape: {tuple(global_shape)})")

  def shard_shape(self, global_shape: tuple[int, ...]) -> tuple[int, ...]:
    self.check_shape(global_shape)
    return tuple(size // self._split(dim) for dim, size in enumerate(global_shape))

  def devices_indices_map(self, global_shape: tuple[int, ...]) -> dict:
    block = self.shard_shape(global_shape)
    axis_index = {name: i for i, name in enumerate(self.mesh.axis_names)}
    out = {}
    for device, coords in self.mesh.coordinates().items():
      index = []
      for dim in range(len(global_shape)):
        number = 0
        for name in self.spec.axes_of(dim):  # the first name is major
          number = number * self.mesh.shape[name] + coords[axis_index[name]]
        index.append(slice(number * block[dim], (number + 1) * block[dim]) if self.spec.axes_of(dim) else slice(None))
      out[device] = tuple(index)
    return out

  def _entries(self) -> tuple:
    """The spec without its trailing Nones, which don't matter: P('x') and P('x', None) lay an array out alike."""
    entries = list(self.spec)
    while entries and entries[-1] is None: entries.pop()
    return tuple(entries)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, NamedSharding) and self.mesh == other.mesh and self._entries() == other._entries()

  def __hash__(self) -> int:
    if self._hash is None: self._hash = hash((self.mesh, self._entries()))  # (jit's fast path hashes it every call)
    return self._hash
  def __repr__(self) -> str:
    if isinstance(self.mesh, AbstractMesh): return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r})"
    return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r}, memory_kind=device)"


class Shard:
  """One device's block of an array (`Array.addressable_shards`): `device`, `index` (a tuple of slices into the
  array), `replica_id` and `data` (the block as an Array on `device`, made when first asked for)."""

  def __init__(self, device: Any, index: tuple, replica_id: int, array: Any, data: Any = None):
    self.device, self.index, self.replica_id, self._array, self._data = device, index, replica_id, array, data

  @property
  def data(self) -> Any:
    if self._data is None:
      from tinyjax.placement import device_put
      self._data = device_put(np.asarray(self._array)[self.index], self.device)
    return self._data

  def __repr__(self) -> str:
    return f"Shard(device={self.device!r}, index={self.index}, replica_id={self.replica_id}, data={self.data})"
