"""`shard_map`, as JAX's: run a function on every shard of its inputs over a mesh, with collectives over the mesh's
axis names (`lax.psum`, `all_gather`, `ppermute`, ...).

`shard_map(f, mesh=, in_specs=, out_specs=)(*args)` splits each argument into blocks as its PartitionSpec says (a
dimension split over mesh axes (a, b) becomes (size(a), size(b), block)), runs `f` on the blocks, one call per mesh
position, and assembles the outputs as `out_specs` say. It is built on vmap's BatchTrace, one per mesh axis, nested
in the mesh's order: `f` is traced once, and each operation of it runs for all shards at once, in the same kernels
(on the CPU devices of one process, which share the host's memory and thread pool, the shards are the blocks of one
buffer). A value the trace of an axis leaves unbatched is the same on every shard along it (JAX's "invariant" under
check_vma), a batched one differs ("varying"); so with `check_vma` an output whose out_spec claims replication over
an axis it varies over is JAX's ValueError, and `grad` transposes `psum` as JAX does under check_vma (BatchTrace
`spmd`). Called outside any transformation it is compiled (`jit`) once per argument signature and its outputs carry
their NamedShardings; inside `jit`, `grad`, `vmap` it is inlined into the enclosing trace.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from tinyjax import tree_util
from tinyjax.array import Array
from tinyjax.trace.batching import BatchTrace, BatchTracer, _as_array, match_axis, process_pvary
from tinyjax.trace.core import EvalTrace, Tracer, bind, check_callable, current_trace, new_trace
from tinyjax.trace.sharding_types import relabelled
from tinyjax.uop import Ops

Label = tuple  # ("mesh", axis name) | ("block", dimension): what each axis of an expanded array stands for


def shard_map(f: Callable | None = None, /, *, out_specs: Any, in_specs: Any = None, mesh: Any = None,
              axis_names: Any = frozenset(), check_vma: bool = True, check_rep: bool | None = None) -> Callable:
  """Map `f` over the shards of its arguments on `mesh` (default: the mesh of an enclosing `with mesh:`).

  `in_specs`: a PartitionSpec per argument (a pytree prefix of the positional arguments; default: each argument's
  own NamedSharding spec, else P()); `out_specs`: the same for the outputs, which say how the per-shard results are
  put together (a mesh axis an output spec does not name must be one the output is the same along). `f` sees blocks
  of shape `sharding.shard_shape(shape)`. `axis_names`: the mesh axes `f` is mapped over (default: all). `check_vma`
  (`check_rep` is its old name): check out_specs' replication claims, and differentiate collectives as JAX does
  with it."""
  if f is None:
    return functools.partial(shard_map, out_specs=out_specs, in_specs=in_specs, mesh=mesh, axis_names=axis_names,
                             check_vma=check_vma, check_rep=check_rep)
  check_callable(f)
  if check_rep is not None: check_vma = check_rep
  return ShardMapped(f, mesh, in_specs, out_specs, frozenset(axis_names), check_vma)


class ShardMapped:
  """A function made by `shard_map`."""

  def __init__(self, f: Callable, mesh: Any, in_specs: Any, out_specs: Any, axis_names: frozenset, check_vma: bool):
    self.f, self.mesh, self.in_specs, self.out_specs = f, mesh, in_specs, out_specs
    self.axis_names, self.check_vma = axis_names, check_vma
    self._compiled: dict = {}  # (inferred in_specs or None, mesh) -> the jitted whole, for eager calls
    functools.update_wrapper(self, f, updated=())

  def _mesh(self):
    from tinyjax.sharding import Mesh, get_mesh
    mesh = self.mesh if self.mesh is not None else get_mesh()
    if mesh is None:
      raise ValueError("shard_map needs a mesh: pass mesh=tinyjax.make_mesh(...) or call it inside `with mesh:`")
    if not isinstance(mesh, Mesh): raise TypeError(f"shard_map mesh must be a tinyjax.sharding.Mesh, got {mesh!r}")
    return mesh

  def __call__(self, *args: Any) -> Any:
    if type(current_trace.get()) is not EvalTrace or \
        any(isinstance(leaf, Tracer) for leaf in tree_util.tree_leaves(args)):
      return self._mapped(None, *args)
    from tinyjax.placement import device_put
    from tinyjax.sharding import NamedSharding
    mesh = self._mesh()
    specs = None if self.in_specs is not None else tuple(self._in_specs(args, tree_util.tree_leaves(args), mesh))
    # eagerly, as JAX: `print` shows each device's block; the arrays are lazy, so every shard still runs in the same
    # fused kernels, compiled once (the compile cache keys them on their structure)
    out = self._mapped(specs, *args)
    if _local_block(mesh) is not None: return out  # (several processes: every one has the whole value)
    leaves, tree = tree_util.tree_flatten(out)
    specs = _flatten_specs(self.out_specs, out, "out_specs")
    return tree_util.tree_unflatten(tree, [device_put(leaf, NamedSharding(mesh, spec))
                                           for leaf, spec in zip(leaves, specs)])

  def _mapped(self, in_specs: tuple | None, *args: Any) -> Any:
    """The whole computation on the current trace: blocks in, the per-shard function over nested BatchTraces, the
    assembled outputs back. `in_specs`: one spec per argument leaf when they were inferred, else None."""
    from tinyjax.sharding import NamedSharding, PartitionSpec
    mesh = self._mesh()
    manual = [name for name in mesh.axis_names if not self.axis_names or name in self.axis_names]
    leaves, in_tree = tree_util.tree_flatten(args)
    specs = list(in_specs) if in_specs is not None else self._in_specs(args, leaves, mesh)
    # with several processes (tinyjax.distributed): this process's block of the mesh, its positions along each axis
    local = _local_block(mesh)
    counts = {name: size if local is None else local[name][1] - local[name][0] for name, size in mesh.shape.items()}
    expanded, labels = [], []
    for index, (leaf, spec) in enumerate(zip(leaves, specs)):
      array = _as_array(leaf)
      _check_spec(mesh, spec, array.shape, manual, f"argument {index} (shape {tuple(array.shape)})", "in_specs")
      if local is not None: array = _local_part(array, spec, mesh, local)
      shape, leaf_labels = [], []
      for dim, size in enumerate(array.shape):
        names = spec.axes_of(dim)
        block = size // int(np.prod([counts[name] for name in names], dtype=np.int64))
        shape += [counts[name] for name in names] + [block]
        leaf_labels += [("mesh", name) for name in names] + [("block", dim)]
      expanded.append(bind(Ops.RESHAPE, array, arg=tuple(shape), weak_type=array.weak_type)
                      if tuple(shape) != tuple(array.shape) else array)
      labels.append(leaf_labels)
    out_specs: list[PartitionSpec] = []  # per output leaf, filled in by the innermost call
    out_tree: list[Any] = []

    def innermost(values: list[Any]) -> list[Any]:
      out = self.f(*tree_util.tree_unflatten(in_tree, values))
      out_leaves, tree = tree_util.tree_flatten(out)
      out_tree.append(tree)
      out_specs.extend(_flatten_specs(self.out_specs, out, "out_specs"))
      for index, (leaf, spec) in enumerate(zip(out_leaves, out_specs)):
        _check_spec(mesh, spec, np.shape(leaf), manual, f"output {index} (per-shard shape {np.shape(leaf)})",
                    "out_specs", divides=False)
      return out_leaves

    def level(depth: int, values: list[Any], value_labels: list[list[Label]]) -> list[Any]:
      if depth == len(manual): return innermost(values)
      name = manual[depth]
      trace = BatchTrace(current_trace.get(), counts[name], name, spmd=self.check_vma)
      trace.mesh = mesh  # (printing a value of an eager shard_map names each block's device)
      if counts[name] < mesh.shape[name]:  # the other positions along the axis are other processes'
        from tinyjax.distributed import process_group
        trace.processes = process_group(mesh, name, local)
      with new_trace(trace):
        inputs = [BatchTracer(trace, _as_array(v), lbl.index(("mesh", name))) if ("mesh", name) in lbl else v
                  for v, lbl in zip(values, value_labels)]
        outs = level(depth + 1, inputs, [[x for x in lbl if x != ("mesh", name)] for lbl in value_labels])
      return [self._output(trace, leaf, spec, manual[depth:], mesh) for leaf, spec in zip(outs, out_specs)]

    outs = level(0, expanded, labels)
    results = []
    for leaf, spec in zip(outs, out_specs):
      leaf = _as_array(leaf)
      if local is not None:  # the other processes' positions along the axes the output is split over
        from tinyjax.distributed import process_group
        from tinyjax.trace.batching import _gather_processes
        layout = _expanded_labels(spec, len(_global_shape(leaf.shape, spec)))
        for position, label in enumerate(layout):
          if label[0] == "mesh" and counts[label[1]] < mesh.shape[label[1]]:
            leaf = _gather_processes(leaf, position, process_group(mesh, label[1], local))
      global_shape = _global_shape(leaf.shape, spec)
      leaf = bind(Ops.RESHAPE, leaf, arg=global_shape, weak_type=leaf.weak_type) \
          if tuple(global_shape) != tuple(leaf.shape) else leaf
      # laid out as out_specs say (with several processes, every process has the whole value)
      if local is None and isinstance(leaf, Tracer): leaf = relabelled(leaf, NamedSharding(mesh, spec))
      results.append(leaf)
    return tree_util.tree_unflatten(out_tree[0], results)

  def _in_specs(self, args: tuple, leaves: list[Any], mesh: Any) -> list[Any]:
    """One PartitionSpec per argument leaf: from `in_specs` (a pytree prefix of the arguments), else from each
    argument's NamedSharding on this mesh, else P()."""
    from tinyjax.sharding import NamedSharding, PartitionSpec
    if self.in_specs is not None: return _flatten_specs(self.in_specs, args, "in_specs")
    specs = []
    for leaf in leaves:
      if isinstance(leaf, Tracer):
        sharding = _traced_sharding(leaf)
        if sharding is None:
          raise ValueError("shard_map: in_specs cannot be inferred from traced arguments (inside grad, vmap, or jit "
                           "of an argument that is not sharded): pass in_specs")
      else:
        sharding = getattr(leaf.realize().uop.arg, "sharding", None) if type(leaf) is Array else None
      specs.append(sharding.spec if isinstance(sharding, NamedSharding) and sharding.mesh == mesh else PartitionSpec())
    return specs

  def _output(self, trace: BatchTrace, leaf: Any, spec: Any, inner_axes: list[Hashable], mesh: Any) -> Any:
    """An output leaf of the BatchTrace of mesh axis `inner_axes[0]` as a value of its parent: its shards along the
    axis stacked where the output's expanded layout has the axis (blocks, and the axes of the traces inside), or,
    for an axis its spec does not name, the value every shard holds."""
    name = inner_axes[0]
    if isinstance(leaf, BatchTracer) and leaf.trace is trace: val, dim = leaf.val, leaf.batch_dim
    else:
      if isinstance(leaf, Tracer): leaf.check_alive()
      val, dim = _as_array(leaf), None
    ndim = len(val.shape) - (dim is not None)
    present = {("mesh", axis) for axis in inner_axes}
    layout = [label for label in _expanded_labels(spec, ndim) if label[0] == "block" or label in present]
    if ("mesh", name) in layout:
      if dim is None and trace.processes is not None: val = process_pvary(val, trace.processes)
      return match_axis(val, dim, layout.index(("mesh", name)), trace.axis_size)
    if dim is None: return val
    if self.check_vma:
      raise ValueError(
        f"shard_map applied to the function {getattr(self.f, '__name__', repr(self.f))!r} was given out_specs which "
        f"require replication which can't be statically inferred given the mesh: out_specs is {spec} which implies "
        f"that the corresponding output value is replicated across mesh axis {name!r}, but it varies along that axis "
        f"(mesh {mesh}). Name the axis in out_specs, reduce over it (lax.psum, pmean, all_gather), or pass "
        "check_vma=False to take the first shard's value.")
    first = bind(Ops.SHRINK, val, arg=tuple((0, 1) if i == dim else (0, s) for i, s in enumerate(val.shape)),
                 weak_type=val.weak_type)
    return bind(Ops.RESHAPE, first, arg=tuple(s for i, s in enumerate(val.shape) if i != dim), weak_type=val.weak_type)


def _traced_sharding(leaf: Tracer) -> Any:
  """The NamedSharding of a jit argument that was a sharded array, if `leaf` is that argument itself."""
  from tinyjax.trace.ad import JVPTracer
  from tinyjax.trace.core import StagingTracer
  while isinstance(leaf, JVPTracer): leaf = leaf.primal  # (grad of a jitted shard_map: its primal is the argument)
  if type(leaf) is not StagingTracer or leaf.uop.op is not Ops.PARAM: return None
  return getattr(leaf.trace, "arg_shardings", {}).get(leaf.uop.arg[0])


def _local_block(mesh: Any) -> dict[str, tuple[int, int]] | None:
  """This process's devices' block of `mesh` ({axis name: (first, stop)}), or None when every device is its own.
  ValueError if it has none; NotImplementedError if they are not one block."""
  from tinyjax.devices.device import process_index
  me = process_index()
  coords = [index for index, device in np.ndenumerate(mesh.devices) if getattr(device, "process_index", 0) == me]
  if len(coords) == mesh.size: return None
  if not coords: raise ValueError(f"shard_map: the mesh {mesh} has no device of this process ({me})")
  block = {name: (min(c[i] for c in coords), max(c[i] for c in coords) + 1) for i, name in enumerate(mesh.axis_names)}
  if len(coords) != int(np.prod([stop - start for start, stop in block.values()])):
    raise NotImplementedError(f"shard_map over several processes needs each process's devices to be one block of "
                              f"the mesh {mesh} (make_mesh lays them out so, process by process)")
  return block


def _local_part(array: Any, spec: Any, mesh: Any, local: dict[str, tuple[int, int]]) -> Any:
  """This process's blocks of an argument every process holds whole: along each split dimension, the blocks of its
  devices' positions (a contiguous run: the dimension's minor mesh axes must be the process's whole)."""
  bounds = []
  for dim, size in enumerate(array.shape):
    names = spec.axes_of(dim)
    if not names:
      bounds.append((0, size))
      continue
    block = size // int(np.prod([mesh.shape[name] for name in names], dtype=np.int64))
    numbers = [0]
    for name in names:  # the block numbers of this process's positions, the first name major
      numbers = [number * mesh.shape[name] + c for number in numbers for c in range(*local[name])]
    first, last = min(numbers), max(numbers) + 1
    if last - first != len(numbers):
      raise NotImplementedError(f"shard_map: dimension {dim} of an argument split over {names} would give this "
                                "process blocks that are not contiguous; put the mesh axes that span processes first")
    bounds.append((first * block, last * block))
  if all(bound == (0, size) for bound, size in zip(bounds, array.shape)): return array
  # (its blocks are this process's: reverse mode sums the processes' blocks of the cotangent into the argument's)
  from tinyjax.distributed import process_group
  for name in {name for dim in range(len(array.shape)) for name in spec.axes_of(dim)}:
    if local[name] != (0, mesh.shape[name]): array = process_pvary(array, process_group(mesh, name, local))
  return bind(Ops.SHRINK, array, arg=tuple(bounds), weak_type=array.weak_type)


def _expanded_labels(spec: Any, ndim: int) -> list[Label]:
  """The axes of an output of rank `ndim` laid out as `spec` says, before its mesh axes merge into its dimensions."""
  return [label for dim in range(ndim) for label in [("mesh", name) for name in spec.axes_of(dim)] + [("block", dim)]]


def _global_shape(expanded_shape: Sequence[int], spec: Any) -> tuple[int, ...]:
  """The shape of an expanded output with its mesh axes merged into the dimensions they split."""
  shape, position = [], 0
  dims = 0
  while position < len(expanded_shape):
    count = len(spec.axes_of(dims)) + 1
    shape.append(int(np.prod(expanded_shape[position:position + count], dtype=np.int64)))
    position, dims = position + count, dims + 1
  return tuple(shape)


def _flatten_specs(specs: Any, tree: Any, what: str) -> list[Any]:
  """One PartitionSpec per leaf of `tree`: `specs` is a pytree prefix of it whose leaves are PartitionSpecs (None
  stands for P())."""
  from tinyjax.sharding import PartitionSpec
  is_spec = lambda value: isinstance(value, PartitionSpec) or value is None  # noqa: E731
  spec_leaves, spec_tree = tree_util.tree_flatten(specs, is_leaf=is_spec)
  for spec in spec_leaves:
    if not is_spec(spec):
      raise TypeError(f"shard_map {what} must be a pytree of PartitionSpec (tinyjax.P) leaves, got {spec!r}")
  try: subtrees = spec_tree.flatten_up_to(tree)
  except ValueError:
    raise ValueError(f"shard_map {what} must be a tree prefix of the corresponding value: got specs with structure "
                     f"{spec_tree} for a value with structure {tree_util.tree_structure(tree)}") from None
  flat = []
  for spec, subtree in zip(spec_leaves, subtrees):
    flat += [PartitionSpec() if spec is None else spec] * len(tree_util.tree_leaves(subtree))
  return flat


def _check_spec(mesh: Any, spec: Any, shape: tuple[int, ...], manual: list[Hashable], what: str, kind: str,
                divides: bool = True) -> None:
  """ValueError unless `spec` fits `shape` and names only the mapped mesh axes (and, with `divides`, splits its
  dimensions evenly)."""
  mesh.check_spec(spec, len(shape), what)
  for name in spec.axis_names():
    if name not in manual:
      raise ValueError(f"shard_map {kind} for {what} names mesh axis {name!r}, which is not one of the axes it maps "
                       f"over: {manual}")
  for dim, size in enumerate(shape if divides else ()):
    split = int(np.prod([mesh.shape[name] for name in spec.axes_of(dim)], dtype=np.int64))
    if size % split:
      raise ValueError(f"shard_map {kind} {spec} for {what}: dimension {dim} of size {size} is split over mesh axes "
                       f"{spec.axes_of(dim)} of total size {split}, which does not divide it evenly")
