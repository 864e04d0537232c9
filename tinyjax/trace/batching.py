"""Automatic batching: `vmap`, as in JAX, and the collectives over its named axes (`psum`, `pmean`, `pmax`, `pmin`,
`pvary`, `all_gather`, `psum_scatter`, `ppermute`, `all_to_all`, `axis_index`, `axis_size`), which are also those of
shard_map's mesh axes (a BatchTrace with `spmd`).

`vmap(f)` runs `f` once on a `BatchTrace`: each value is a `BatchTracer`, a value of the parent trace (`val`) that
carries one extra axis, the batch axis, at position `batch_dim`; its `shape` hides that axis, so `f` sees one example.
A value that does not depend on the mapped inputs is not wrapped at all: it stays a value of the parent trace, so
Python control flow on it works, and an operation whose operands are all unbatched runs on the parent unchanged.
Otherwise the Op's rule in `batch_rules` (applied with the parent trace current) computes the batched result and says
where its batch axis is. Rules keep the batch axis where it is when that is free (elementwise ops whose batched
operands agree, reductions, permutes, pads, ...) and move it to the front when an op needs it there (reshape).

Because rules are written with `bind`, they run on whatever the parent is: the eager evaluator, a jit trace, a JVP
trace or another vmap; that is what makes `jit(vmap(f))`, `vmap(grad(f))`, `grad(vmap(f))` and nested vmaps work.
"""
from __future__ import annotations

import collections
import functools
import inspect
import math
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array, print_hooks
from tinyjax.trace import ad
from tinyjax.trace.core import (ConcretizationTypeError, Primitive, StagingTrace, Trace, Tracer, bind, check_callable,
                                current_trace, new_trace, set_current_trace)
from tinyjax.uop import ELEMENTWISE, Ops, UOp

batch_rules: dict[Ops | Primitive, Callable] = {}


# ---------------------------------------------------------------------------------------------------------------------
# the trace

class BatchTracer(Tracer):
  """A value of a BatchTrace: `val` (a value of the parent trace) with the batch axis at `batch_dim`."""
  __slots__ = ("val", "batch_dim")

  def __init__(self, trace: BatchTrace, val: Any, batch_dim: int):
    Array.__init__(self, None, val.weak_type)
    self.trace, self.val, self.batch_dim = trace, val, batch_dim

  @property
  def shape(self) -> tuple[int, ...]:
    shape = self.val.shape
    return shape[:self.batch_dim] + shape[self.batch_dim + 1:]

  @property
  def dtype(self) -> np.dtype: return self.val.dtype

  def __str__(self) -> str: return device_blocks_str(self) or super().__str__()

  def concrete(self, what: str) -> Array:
    self.check_alive()
    raise ConcretizationTypeError(
      f"Abstract tracer value encountered where concrete value is expected: {what} of an array {self.aval_str()} "
      f"batched by `vmap` (one value per example, {self.trace.axis_size} of them). Python control flow cannot depend "
      "on a batched value: use tinyjax.numpy.where or lax.cond/select instead, or pass the value unbatched "
      "(in_axes=None) if it is the same for every example.")


def _device_blocks(x: Array) -> list[tuple] | None:
  """(device, axis names, mesh coordinates, numpy block) for each device of the eager shard_map running now, `x`'s
  block on it (a value the same on every device, too); None outside one, or for a staged value."""
  traces = [trace for trace in _named_traces() if trace.spmd and getattr(trace, "mesh", None) is not None]
  if not traces or isinstance(x, BatchTracer) and x.trace not in traces: return None
  value, chain = x, []
  for trace in traces:  # innermost first
    if isinstance(value, BatchTracer) and value.trace is trace:
      chain.append((trace, value.batch_dim))
      value = value.val
    else:
      chain.append((trace, None))
  if isinstance(value, Tracer): return None  # (staged: jit's tracers have no values)
  array = np.asarray(value)
  chain.reverse()  # outermost first: each trace's axis goes to the front, in mesh axis order
  for k, (trace, dim) in enumerate(chain):
    if dim is None: array = np.broadcast_to(np.expand_dims(array, k), array.shape[:k] + (trace.axis_size,) +
                                            array.shape[k:])
    else: array = np.moveaxis(array, k + dim, k)
  mesh, names = chain[0][0].mesh, [trace.axis_name for trace, _ in chain]
  out = []
  for coords in np.ndindex(*array.shape[:len(chain)]):
    position = dict(zip(names, coords))
    device = mesh.devices[tuple(position.get(name, 0) for name in mesh.axis_names)]
    out.append((device, names, coords, array[coords]))
  return out


def device_blocks_str(x: Array) -> str | None:
  """Inside an eager shard_map, `x` as JAX prints it there: each device's block; None elsewhere."""
  shards = _device_blocks(x)
  if shards is None: return None
  return "\n".join(f"On {device} at mesh coordinates ({', '.join(map(str, names))},) = {coords}:\n{block}\n"
                   for device, names, coords, block in shards)


print_hooks.append(device_blocks_str)


class BatchTrace(Trace):
  """Vectorisation over one axis of `axis_size` elements, named `axis_name` (for collectives) or None.

  `spmd`: the axis is a mesh axis of `shard_map` with check_vma (trace/shard_map.py), whose collectives follow JAX's
  varying/invariant typing: an unbatched value is invariant over the axis, a batched one varies, and reverse mode
  transposes `psum` of a varying value into a broadcast (not into another `psum`, as under `vmap`)."""
  fun_name = "vmap"
  # a shard_map mesh axis that spans processes (tinyjax.distributed.ProcessGroup): this trace's examples are this
  # process's positions along it, and collectives over it combine the processes' values through MPI
  processes: Any = None

  def __init__(self, parent: Trace, axis_size: int, axis_name: Hashable | None, spmd: bool = False):
    self.parent, self.axis_size, self.axis_name, self.active, self.spmd = parent, axis_size, axis_name, True, spmd

  def unpack(self, operands: Sequence[Any]) -> tuple[list[Any], list[int | None]]:
    """Each operand as (value of the parent trace, batch dim or None); values of other traces are unbatched."""
    vals, dims = [], []
    for x in operands:
      if isinstance(x, BatchTracer) and x.trace is self:
        vals.append(x.val)
        dims.append(x.batch_dim)
      else:
        if isinstance(x, Tracer): x.check_alive()
        vals.append(x)
        dims.append(None)
    return vals, dims

  def pack(self, val: Any, batch_dim: int | None) -> Any:
    return val if batch_dim is None else BatchTracer(self, val, batch_dim)

  def process(self, op: Ops, operands: tuple[Any, ...], arg: Any, dtype: np.dtype, weak_type: bool) -> Any:
    vals, dims = self.unpack(operands)
    with set_current_trace(self.parent):
      if all(d is None for d in dims): return bind(op, *vals, arg=arg, dtype=dtype, weak_type=weak_type)
      vals = self.meeting(vals, dims)
      rule = batch_rules.get(op)
      if rule is None: raise NotImplementedError(f"batching rule for {op.name} is not implemented")
      out, out_dim = rule(vals, dims, arg, dtype, weak_type)
    return self.pack(out, out_dim)

  def varying_nodes(self, program: UOp, n_inputs: int, consts: list[Any], primals: list[Any] | None) -> set | None:
    """Under spmd, the nodes of a linear program (`ad.transpose`) that vary over this axis: a tangent input as its
    primal does (unknown: it does), a const as it is, a psum / pmax / pmin over this axis does not, any other node if
    an operand does. None under vmap (no typing)."""
    if not self.spmd: return None
    varying: set[UOp] = set()
    for node in program.toposort:
      if node.op is Ops.PARAM:
        index = node.arg[0]
        value = consts[index - n_inputs] if index >= n_inputs else None if primals is None else primals[index]
        if value is None or _varies(value, self): varying.add(node)
      elif node.op is Ops.PRIMITIVE and node.arg.prim in (psum_p, pmax_p, pmin_p) and \
          dict(node.arg.params)["axis_name"] == self.axis_name: continue
      elif node.op is Ops.PRIMITIVE and node.arg.prim is pvary_p and \
          dict(node.arg.params)["axis_name"] == self.axis_name: varying.add(node)
      elif any(src in varying for src in node.src): varying.add(node)
    return varying

  def meeting(self, vals: list[Any], dims: list[int | None]) -> list[Any]:
    """An op's operands, where batched ones meet unbatched ones on an axis that spans processes: the unbatched ones
    (the same in every process) as values of this process's positions (`process_pvary`), so that reverse mode from
    outside the shard_map sums their cotangents over the processes. Called with the parent trace current."""
    if self.processes is None or all(d is None for d in dims) or all(d is not None for d in dims): return vals
    return [process_pvary(v, self.processes) if d is None and isinstance(v, Tracer) else v for v, d in zip(vals, dims)]

  def varies(self, x: Any) -> bool: return _varies(x, self)
  def psum(self, x: Any) -> Any: return psum_p.bind(x, axis_name=self.axis_name)

  def process_primitive(self, prim: Primitive, operands: tuple[Any, ...], params: dict) -> Any:
    """With a rule: apply it (even when nothing is batched: collectives need that). Without one: an unbatched call
    goes to the parent as the primitive itself (so an outer trace still sees it and applies its own rules); a batched
    call batches the primitive's decomposition into Ops, which gives the right values but hides the primitive from
    outer traces (e.g. its JVP rule under `grad(vmap(f))`): primitives register a rule (`defelementwise`)."""
    vals, dims = self.unpack(operands)
    rule = batch_rules.get(prim)
    if rule is None and any(d is not None for d in dims): return prim.impl(*operands, **params)
    with set_current_trace(self.parent):
      if rule is None: return prim.bind(*vals, **params)
      out, out_dim = rule(self, self.meeting(vals, dims), dims, **params)
    if prim.multiple_results: return [self.pack(o, d) for o, d in zip(out, out_dim)]
    return self.pack(out, out_dim)


# ---------------------------------------------------------------------------------------------------------------------
# helpers the rules are written with (they bind on the current trace: the parent of the BatchTrace)

def move_axis(x: Any, source: int, destination: int) -> Any:
  """`x` with its axis `source` moved to position `destination` (a PERMUTE; none when nothing moves)."""
  if source == destination: return x
  perm = [i for i in range(len(x.shape)) if i != source]
  perm.insert(destination, source)
  return bind(Ops.PERMUTE, x, arg=tuple(perm), weak_type=x.weak_type)


def broadcast_axis(x: Any, axis: int, size: int) -> Any:
  """`x` with a new axis of `size` at `axis`, every slice equal to `x` (a RESHAPE and an EXPAND: no copy)."""
  shape = tuple(x.shape)
  x = bind(Ops.RESHAPE, x, arg=shape[:axis] + (1,) + shape[axis:], weak_type=x.weak_type)
  return bind(Ops.EXPAND, x, arg=shape[:axis] + (size,) + shape[axis:], weak_type=x.weak_type)


def match_axis(x: Any, batch_dim: int | None, destination: int, size: int) -> Any:
  """`x` with its batch axis at `destination`: moved there, or broadcast there if `x` is unbatched."""
  return broadcast_axis(x, destination, size) if batch_dim is None else move_axis(x, batch_dim, destination)


def batch_size(vals: Sequence[Any], dims: Sequence[int | None]) -> int:
  return next(v.shape[d] for v, d in zip(vals, dims) if d is not None)


def align_batch_axes(vals: Sequence[Any], dims: Sequence[int | None]) -> tuple[list[Any], int]:
  """Operands of equal example shapes with their batch axes at one position: where the batched operands already
  agree (no transpose), else the front; unbatched operands are broadcast along it. Returns them and the position."""
  batched = {d for d in dims if d is not None}
  out_dim = batched.pop() if len(batched) == 1 else 0
  size = batch_size(vals, dims)
  return [match_axis(v, d, out_dim, size) for v, d in zip(vals, dims)], out_dim


def insert_at(items: tuple, position: int, item: Any) -> tuple:
  return items[:position] + (item,) + items[position:]


# ---------------------------------------------------------------------------------------------------------------------
# batching rules: rule(vals, dims, arg, dtype, weak_type) -> (out, out batch dim); at least one dim is not None

def _elementwise_rule(op: Ops) -> Callable:
  def rule(vals, dims, arg, dtype, weak_type):
    operands, out_dim = align_batch_axes(vals, dims)
    return bind(op, *operands, arg=arg, dtype=dtype, weak_type=weak_type), out_dim
  return rule


def _same_dim_rule(op: Ops, batched_arg: Callable[[Any, int, int], Any] = lambda arg, dim, size: arg) -> Callable:
  """A one-operand op that keeps the batch axis where it is, with its arg rewritten for the batched operand."""
  def rule(vals, dims, arg, dtype, weak_type):
    (x,), (dim,) = vals, dims
    return bind(op, x, arg=batched_arg(arg, dim, x.shape[dim]), dtype=dtype, weak_type=weak_type), dim
  return rule


def _reduce_arg(arg: tuple, dim: int, size: int) -> tuple:
  reduce_op, axes = arg
  return reduce_op, tuple(a + (a >= dim) for a in axes)


def _permute_arg(perm: tuple, dim: int, size: int) -> tuple:
  """The example axes permuted as `perm`, the batch axis left at `dim`."""
  physical = tuple(a + (a >= dim) for a in perm)
  return insert_at(physical, dim, dim)


def _reshape_rule(vals, dims, arg, dtype, weak_type):
  (x,), (dim,) = vals, dims
  size = x.shape[dim]
  return bind(Ops.RESHAPE, move_axis(x, dim, 0), arg=(size,) + tuple(arg), dtype=dtype, weak_type=weak_type), 0


for _op in ELEMENTWISE:
  batch_rules[_op] = _elementwise_rule(_op)
batch_rules.update({
  Ops.CONTIGUOUS: _same_dim_rule(Ops.CONTIGUOUS),
  Ops.REDUCE_AXIS: _same_dim_rule(Ops.REDUCE_AXIS, _reduce_arg),
  Ops.RESHAPE: _reshape_rule,
  Ops.PERMUTE: _same_dim_rule(Ops.PERMUTE, _permute_arg),
  Ops.EXPAND: _same_dim_rule(Ops.EXPAND, lambda shape, dim, size: insert_at(tuple(shape), dim, size)),
  Ops.PAD: _same_dim_rule(Ops.PAD, lambda padding, dim, size: insert_at(tuple(padding), dim, (0, 0))),
  Ops.SHRINK: _same_dim_rule(Ops.SHRINK, lambda bounds, dim, size: insert_at(tuple(bounds), dim, (0, size))),
  Ops.FLIP: _same_dim_rule(Ops.FLIP, lambda flips, dim, size: insert_at(tuple(flips), dim, False)),
})


# Primitive rules: rule(trace, vals, dims, **params) -> (out, out batch dim), called even when nothing is batched.

def _elementwise_primitive_rule(prim: Primitive) -> Callable:
  def rule(trace: BatchTrace, vals, dims, **params):
    if all(d is None for d in dims): return prim.bind(*vals, **params), None
    operands, out_dim = align_batch_axes(vals, dims)
    return prim.bind(*operands, **params), out_dim
  return rule


def defelementwise(*prims: Primitive) -> None:
  """Register the batching rule of elementwise primitives (operands of equal shapes, result of that shape): the
  primitive itself applied to the batched operands, their batch axes aligned as for an elementwise Op. It stays one
  primitive under vmap, so outer traces apply their own rules to it (e.g. its JVP rule under `grad(vmap(f))`)."""
  for prim in prims: batch_rules[prim] = _elementwise_primitive_rule(prim)


def _reduction_primitive_rule(prim: Primitive) -> Callable:
  def rule(trace: BatchTrace, vals, dims, *, axes, keepdims=False, **params):
    (x,), (dim,) = vals, dims
    if dim is None: return prim.bind(x, axes=axes, keepdims=keepdims, **params), None
    out_dim = dim if keepdims else dim - sum(a < dim for a in axes)
    return prim.bind(x, axes=tuple(a + (a >= dim) for a in axes), keepdims=keepdims, **params), out_dim
  return rule


def defreduction(*prims: Primitive) -> None:
  """Register the batching rule of reductions `prim(x, *, axes, keepdims=False, **params)` (axes non-negative): the
  primitive itself over the same axes of the batched operand, the batch axis kept."""
  for prim in prims: batch_rules[prim] = _reduction_primitive_rule(prim)


defelementwise(ad.stop_gradient_p)


# ---------------------------------------------------------------------------------------------------------------------
# collectives over named axes
#
# A collective is a `Collective` primitive: its meaning is the batching rule of the BatchTraces it names. Reductions
# (psum, pmax, pmin) and pvary take one name (a tuple of names is a loop over them). all_gather, psum_scatter,
# ppermute and all_to_all mix the examples of a combined axis (a tuple of names, the first major) that no single
# BatchTrace holds: each named trace in turn makes its batch axis a leading axis of the operand (a view; its name goes
# to the `gathered` param), and the last one applies the collective's global rule to the stack of all examples,
# (N, *example shape) with N the combined axis size, and gives each trace its axis back as its batch axis.

def _named_traces() -> Iterator[BatchTrace]:
  """The named BatchTraces in the chain of traces from the current one down."""
  trace: Trace | None = current_trace.get()
  while trace is not None:
    if isinstance(trace, BatchTrace) and trace.axis_name is not None: yield trace
    trace = trace.parent


def _find_axis(axis_name: Hashable) -> BatchTrace:
  """The BatchTrace named `axis_name` in the chain of traces from the current one down; NameError if none."""
  for trace in _named_traces():
    if trace.axis_name == axis_name: return trace
  names = [trace.axis_name for trace in _named_traces()]
  raise NameError(f"unbound axis name: {axis_name}. The following axis names (e.g. defined by vmap) are available to "
                  f"collective operations: {names}")


def _axis_names(axis_name: Hashable | tuple) -> tuple:
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _as_array(x: Any) -> Any:
  return x if isinstance(x, Array) else ad._to_array(x)


def _chain(trace: Trace | None) -> set[int]:
  """The ids of `trace` and of the traces below it."""
  ids = set()
  while trace is not None:
    ids.add(id(trace))
    trace = trace.parent
  return ids


def _varies(x: Any, trace: BatchTrace) -> bool:
  """Whether `x` may differ between the examples of `trace` (JAX's "varying" under shard_map): a value of `trace`
  with its batch axis does, a value of a trace below it does not. Values of traces in between are looked through (a
  vmap's value, a JVP's primal: a tangent varies as its primal does); a staged value above it (a loop body, a
  linearized tangent) is taken as varying."""
  below = _chain(trace.parent)
  while isinstance(x, Tracer) and id(x.trace) not in below:
    if isinstance(x, BatchTracer) and x.trace is trace: return True
    if isinstance(x, BatchTracer): x = x.val
    elif isinstance(x, ad.JVPTracer): x = x.primal
    else: return True
  return False


class Collective(Primitive):
  """A collective over the axes `axis_name` (a name, or a tuple of names with the `gathered` param). On a trace with
  no rule for it (one between the current trace and the named BatchTraces, e.g. a staging trace) it goes straight to
  the topmost of the named traces it still has to visit, if its operand is a value of that trace or of one below."""

  def __init__(self, name: str):
    super().__init__(name, self._impl)

  def _impl(self, x: Any, **params: Any) -> Any:
    names = _axis_names(params["axis_name"])
    for name in names: _find_axis(name)  # NameError if unbound
    remaining = [name for name in names if name not in params.get("gathered", ())]
    target = next(trace for trace in _named_traces() if trace.axis_name in remaining)
    if isinstance(x, Tracer) and id(x.trace) not in _chain(target):
      raise NotImplementedError(
        f"{self.name} over the vmap axis {target.axis_name!r} of a value traced by "
        f"`{getattr(x.trace, 'fun_name', '?')}` inside that vmap is not supported (e.g. a collective in a loop body "
        "under vmap); apply the collective outside the inner transformation")
    return target.process_primitive(self, (x,), params)


def _reshape(x: Any, shape: tuple[int, ...]) -> Any:
  return x if tuple(x.shape) == tuple(shape) else bind(Ops.RESHAPE, x, arg=tuple(shape), weak_type=x.weak_type)


def _permute(x: Any, perm: Sequence[int]) -> Any:
  perm = tuple(int(a) for a in perm)
  return x if perm == tuple(range(len(perm))) else bind(Ops.PERMUTE, x, arg=perm, weak_type=x.weak_type)


def _reduce_away(x: Any, dim: int, reduce_op: Ops) -> Any:
  """`x` reduced with `reduce_op` over its axis `dim`, which is removed."""
  shape = tuple(x.shape)
  if shape[dim] == 1: return _reshape(x, shape[:dim] + shape[dim + 1:])  # (a mesh axis of one device: nothing to do)
  reduced = bind(Ops.REDUCE_AXIS, x, arg=(reduce_op, (dim,)), weak_type=x.weak_type)
  return _reshape(reduced, shape[:dim] + shape[dim + 1:])


def _order_reversed(x: Any) -> Any:
  """A value ordered as `x` reversed: -x for floats, ~x for integers and bools (no overflow at the minimum)."""
  if dtypes.is_floating(x.dtype): return ad.neg(x)
  all_ones = True if x.dtype == np.dtype(np.bool_) else -1 if x.dtype.kind == "i" else np.iinfo(x.dtype).max
  return bind(Ops.XOR, x, ad.full_like(x, all_ones), weak_type=x.weak_type)


# one name at a time: the reductions and pvary; rule(trace, vals, dims, *, axis_name) -> (out, out batch dim)

def _reduction_rule(prim: Collective, reduce_away: Callable[[Any, int], Any],
                    of_copies: Callable[[Any, int], Any], mpi_op: str) -> Callable:
  """Over this trace's axis: `reduce_away(x, dim)` removes the batch axis (the result is unbatched, as JAX); an
  unbatched operand is the same in every example: `of_copies(x, axis size)`. Over another name: the collective is
  elementwise along this trace's axis, so it passes to the parent with the batch dim unchanged. Over an axis that
  spans processes, the local result is then combined with the other processes' (`mpi_op`: MPI Allreduce)."""
  def rule(trace: BatchTrace, vals, dims, *, axis_name):
    (x,), (dim,) = vals, dims
    if axis_name != trace.axis_name: return prim.bind(x, axis_name=axis_name), dim
    x = _as_array(x)
    group = trace.processes
    if dim is None: return of_copies(x, trace.axis_size if group is None else group.size), None
    out = reduce_away(x, dim)
    if group is None: return out, None
    from tinyjax.distributed import next_tag
    return process_allreduce_p.bind(out, group=group, op=mpi_op, tag=next_tag()), None
  return rule


def _host_collective(x: Any, name: str, fn: Callable[[np.ndarray], np.ndarray], shape: tuple | None = None) -> Any:
  """`fn` of `x`'s value, called on the host (a host step under jit: an MPI exchange with the other processes).
  Elementwise along leading axes an outer vmap adds (`fn` sees them: it must keep them)."""
  from tinyjax.trace.callback import HostCallback, pure_callback_p
  aval = (tuple(x.shape) if shape is None else tuple(shape), np.dtype(x.dtype))
  (out,) = pure_callback_p.bind(x, callback=HostCallback(lambda v: [fn(v)], (aval,), name),
                                vmap_method="broadcast_all")
  return out


def _gather_processes(x: Any, axis: int, group: Any) -> Any:
  """`x` with its axis `axis` (this process's positions along a mesh axis) replaced by every process's, in order."""
  from tinyjax.distributed import next_tag
  return process_allgather_p.bind(x, group=group, from_end=len(x.shape) - axis, tag=next_tag())


# The exchanges between processes (tinyjax.distributed), as primitives with rules (the host step that does them,
# `_host_collective`, has none): JVP applies them to the tangents. Reverse mode from outside the shard_map (inside it,
# the collectives' own rules apply) keeps one invariant: the cotangent of a value every process holds the same (an
# argument, what is computed from the exchanges' results) is the whole cotangent, the same in every process; that of
# a value of this process's positions is its part. So an allreduce or allgather (this process's part -> the same
# everywhere) transposes without an exchange (the cotangent as it is, this process's slice of it), and where a value
# the same everywhere meets this process's positions (`process_pvary_p`: its slice of an argument, an invariant
# operand of a mesh-axis op) the parts of its cotangent are summed over the processes.

def _process_allreduce(x: Any, *, group: Any, op: str, tag: int) -> Any:
  return _host_collective(x, f"mpi_allreduce_{op}", lambda v: group.allreduce(v, op, tag))


def _process_allgather(x: Any, *, group: Any, from_end: int, tag: int) -> Any:
  shape = list(x.shape)
  shape[len(shape) - from_end] = group.size

  def gather(value: np.ndarray) -> np.ndarray:
    position = value.ndim - from_end  # (an outer vmap's leading axes shift it)
    return np.moveaxis(group.allgather(np.moveaxis(value, position, 0), tag), 0, position)
  return _host_collective(x, f"mpi_allgather_{group.name}", gather, tuple(shape))


process_allreduce_p = Primitive("process_allreduce", _process_allreduce)
process_allgather_p = Primitive("process_allgather", _process_allgather)


def _process_allreduce_jvp(primals, tangents, out, *, group, op, tag):
  if op != "sum":
    raise NotImplementedError(f"the derivative of p{op} over the mesh axis {group.name!r}, which spans processes, "
                              "outside its shard_map: take the gradient inside the shard_map")
  from tinyjax.distributed import next_tag
  return process_allreduce_p.bind(tangents[0], group=group, op=op, tag=next_tag())


def _process_allgather_jvp(primals, tangents, out, *, group, from_end, tag):
  from tinyjax.distributed import next_tag
  return process_allgather_p.bind(tangents[0], group=group, from_end=from_end, tag=next_tag())


def _process_allreduce_transpose(ct: Any, node: UOp, known: list) -> tuple:
  """The sum's cotangent, the same in every process, is each process's part's (only sums are linear)."""
  return (ct,)


def _process_allgather_transpose(ct: Any, node: UOp, known: list) -> tuple:
  """This process's positions of the gathered value's cotangent (the same in every process)."""
  params = dict(node.arg.params)
  axis = len(ct.shape) - params["from_end"]
  return (_local_positions(ct, axis, params["group"], node.src[0].shape[axis]),)


def process_pvary(x: Any, group: Any) -> Any:
  """`x`, a value every process holds the same, as the value of this process's positions along a mesh axis spanning
  the processes of `group`: the identity, whose transpose sums the processes' cotangents (JAX's pvary, over them)."""
  return process_pvary_p.bind(x, group=group)


def _process_pvary_transpose(ct: Any, node: UOp, known: list) -> tuple:
  from tinyjax.distributed import next_tag
  return (process_allreduce_p.bind(ct, group=dict(node.arg.params)["group"], op="sum", tag=next_tag()),)


process_pvary_p = Primitive("process_pvary", lambda x, *, group: x)
ad.jvp_rules[process_allreduce_p] = _process_allreduce_jvp
ad.jvp_rules[process_allgather_p] = _process_allgather_jvp
ad.jvp_rules[process_pvary_p] = lambda primals, tangents, out, *, group: process_pvary(tangents[0], group)
ad.transpose_rules[process_allreduce_p] = _process_allreduce_transpose
ad.transpose_rules[process_allgather_p] = _process_allgather_transpose
ad.transpose_rules[process_pvary_p] = _process_pvary_transpose
ad.abstract_eval_rules[process_allreduce_p] = ad.abstract_eval_rules[process_pvary_p] = lambda x, **params: (
  tuple(x.shape), np.dtype(x.dtype), bool(x.weak_type))


def _allgather_aval(x: Any, *, group: Any, from_end: int, tag: int) -> tuple:
  shape = list(x.shape)
  shape[len(shape) - from_end] = group.size
  return tuple(shape), np.dtype(x.dtype), bool(x.weak_type)


ad.abstract_eval_rules[process_allgather_p] = _allgather_aval
batch_rules[process_allreduce_p] = lambda trace, vals, dims, **params: (process_allreduce_p.bind(vals[0], **params),
                                                                        dims[0])
batch_rules[process_pvary_p] = lambda trace, vals, dims, **params: (process_pvary_p.bind(vals[0], **params), dims[0])
batch_rules[process_allgather_p] = lambda trace, vals, dims, **params: (
  process_allgather_p.bind(vals[0] if dims[0] is None else move_axis(vals[0], dims[0], 0), **params),
  None if dims[0] is None else 0)


def _local_positions(x: Any, axis: int, group: Any, count: int, pvary: bool = False) -> Any:
  """This process's `count` positions of `x` along `axis` (which holds every process's); with `pvary`, of a value
  every process holds the same (reverse mode then sums the processes' parts of the cotangent)."""
  bounds = tuple((group.offset, group.offset + count) if i == axis else (0, n) for i, n in enumerate(x.shape))
  return bind(Ops.SHRINK, process_pvary(x, group) if pvary else x, arg=bounds, weak_type=x.weak_type)


def _pvary_rule(trace: BatchTrace, vals, dims, *, axis_name):
  """Identity in value; over this trace's axis an unbatched operand becomes batched (a broadcast, no copy)."""
  (x,), (dim,) = vals, dims
  if axis_name != trace.axis_name: return pvary_p.bind(x, axis_name=axis_name), dim
  if dim is not None: return x, dim
  return broadcast_axis(x if trace.processes is None else process_pvary(x, trace.processes), 0, trace.axis_size), 0


psum_p, pmax_p, pmin_p, pvary_p = Collective("psum"), Collective("pmax"), Collective("pmin"), Collective("pvary")
batch_rules[psum_p] = _reduction_rule(psum_p, lambda x, dim: _reduce_away(x, dim, Ops.ADD),
                                      lambda x, size: ad.mul(x, ad.full_like(x, size)), "sum")
batch_rules[pmax_p] = _reduction_rule(pmax_p, lambda x, dim: _reduce_away(x, dim, Ops.MAX), lambda x, size: x,
                                      "max")
batch_rules[pmin_p] = _reduction_rule(
  pmin_p, lambda x, dim: _order_reversed(_reduce_away(_order_reversed(x), dim, Ops.MAX)), lambda x, size: x, "min")
batch_rules[pvary_p] = _pvary_rule


# a combined axis: global rules, rule(stack (N, *example shape), **params) -> (N, *example shape of the result)

def _all_gather_global(stack: Any, *, axis: int, tiled: bool) -> Any:
  """Every example gets the stack with its example axis at `axis` (tiled: merged into the example axis there)."""
  size, shape = stack.shape[0], tuple(stack.shape[1:])
  gathered = move_axis(stack, 0, axis)
  if tiled: gathered = _reshape(gathered, shape[:axis] + (size * shape[axis],) + shape[axis + 1:])
  return broadcast_axis(gathered, 0, size)


def _psum_scatter_global(stack: Any, *, scatter_dimension: int, tiled: bool) -> Any:
  """The sum over the examples, split along `scatter_dimension` into N chunks: chunk k to example k (not tiled: the
  dimension, of size N, is removed)."""
  size, shape, dim = stack.shape[0], tuple(stack.shape[1:]), scatter_dimension
  total = bind(Ops.REDUCE_AXIS, stack, arg=(Ops.ADD, (0,)), weak_type=stack.weak_type)
  chunk = (shape[dim] // size,) if tiled else ()
  return move_axis(_reshape(total, shape[:dim] + (size,) + chunk + shape[dim + 1:]), dim, 0)


def _ppermute_global(stack: Any, *, perm: tuple) -> Any:
  """Example `destination` gets example `source`'s value for each pair, zeros where nothing arrives: one slice and
  pad per run of pairs that shift by the same offset (a cyclic shift is two)."""
  size, rest = stack.shape[0], [(0, n) for n in stack.shape[1:]]
  out = None
  for source, destination, length in _shift_runs(perm):
    piece = bind(Ops.SHRINK, stack, arg=((source, source + length), *rest), weak_type=stack.weak_type)
    piece = bind(Ops.PAD, piece, arg=((destination, size - destination - length), *[(0, 0)] * len(rest)),
                 weak_type=stack.weak_type)
    out = piece if out is None else ad.add(out, piece)
  return ad.zeros_like(stack) if out is None else out


def _shift_runs(perm: tuple) -> list[tuple[int, int, int]]:
  """`perm`'s pairs as runs (source, destination, length) of consecutive sources going to consecutive destinations."""
  runs: list[list[int]] = []
  for source, destination in sorted(perm):
    if runs and runs[-1][0] + runs[-1][2] == source and runs[-1][1] + runs[-1][2] == destination: runs[-1][2] += 1
    else: runs.append([source, destination, 1])
  return [tuple(run) for run in runs]


def _all_to_all_global(stack: Any, *, split_axis: int, concat_axis: int, tiled: bool) -> Any:
  """Example s splits its `split_axis` into N chunks and sends chunk d to example d, which concatenates what it gets
  along `concat_axis` in the order of s (not tiled: the split axis, of size N, is removed and the received values
  stacked along a new axis at `concat_axis`). A transpose of the (sender, chunk) axes, and a reshape when tiled."""
  size, shape = stack.shape[0], tuple(stack.shape[1:])
  if tiled: stack = _reshape(stack, (size,) + shape[:split_axis] + (size, shape[split_axis] // size) +
                             shape[split_axis + 1:])
  received = move_axis(move_axis(stack, 1 + split_axis, 0), 1, 1 + concat_axis)  # (receiver, ..., sender, ...)
  if not tiled: return received
  out_shape = tuple(received.shape)
  return _reshape(received, out_shape[:1 + concat_axis] + (size * out_shape[2 + concat_axis],) +
                  out_shape[3 + concat_axis:])


def _apply_global(global_rule: Callable, x: Any, axis_name: tuple, gathered: tuple, params: dict) -> Any:
  """`x` has a leading axis per name of `gathered` (in that order) and the example shape; the collective over the
  combined axis `axis_name` (first name major) as its global rule on the stack, with the same leading axes."""
  count = len(gathered)
  order = [gathered.index(name) for name in axis_name]
  sizes = [x.shape[i] for i in order]
  stack = _permute(x, order + list(range(count, len(x.shape))))
  out = global_rule(_reshape(stack, (math.prod(sizes),) + tuple(x.shape[count:])), **params)
  out = _reshape(out, tuple(sizes) + tuple(out.shape[1:]))
  return _permute(out, list(np.argsort(order)) + list(range(count, len(out.shape))))


def _combined_rule(prim: Collective, global_rule: Callable, axis_params: tuple[str, ...]) -> Callable:
  """Over another name: elementwise along this trace's axis, which goes to the parent as the first example axis
  (`axis_params`, the params that are example axes, shift by one). Over a name of `axis_name`: this trace's batch
  axis becomes the operand's first axis; the last of the names applies the global rule."""
  def rule(trace: BatchTrace, vals, dims, *, axis_name, gathered, **params):
    (x,), (dim,) = vals, dims
    if trace.axis_name not in axis_name:
      if dim is None: return prim.bind(x, axis_name=axis_name, gathered=gathered, **params), None
      shifted = {key: value + 1 if key in axis_params else value for key, value in params.items()}
      x = move_axis(x, dim, len(gathered))
      return prim.bind(x, axis_name=axis_name, gathered=gathered, **shifted), len(gathered)
    # an axis spanning processes: every process's positions along it (MPI Allgather), this process's of the result
    group = trace.processes
    if group is not None and dim is None: x = process_pvary(x, group)
    x, gathered = match_axis(x, dim, 0, trace.axis_size), (trace.axis_name,) + gathered
    if group is not None: x = _gather_processes(x, 0, group)
    if len(gathered) < len(axis_name): out = prim.bind(x, axis_name=axis_name, gathered=gathered, **params)
    else: out = _apply_global(global_rule, x, axis_name, gathered, params)
    return (out if group is None else _local_positions(out, 0, group, trace.axis_size, pvary=True)), 0
  return rule


all_gather_p, psum_scatter_p = Collective("all_gather"), Collective("psum_scatter")
ppermute_p, all_to_all_p = Collective("ppermute"), Collective("all_to_all")
_GLOBAL_RULES: dict[Collective, tuple[Callable, tuple[str, ...]]] = {  # the rule and its params that are axes
  all_gather_p: (_all_gather_global, ("axis",)),
  psum_scatter_p: (_psum_scatter_global, ("scatter_dimension",)),
  ppermute_p: (_ppermute_global, ()),
  all_to_all_p: (_all_to_all_global, ("split_axis", "concat_axis")),
}
for _prim, (_global_rule, _axis_params) in _GLOBAL_RULES.items():
  batch_rules[_prim] = _combined_rule(_prim, _global_rule, _axis_params)


# ---------------------------------------------------------------------------------------------------------------------
# differentiating collectives: JVP rules, avals for staging them in linear programs, transpose rules

def _combined_aval(prim: Collective) -> Callable:
  """The result's (shape, dtype, weak_type) of a combined-axis collective: its global rule on a staged stack."""
  global_rule = _GLOBAL_RULES[prim][0]

  def aval(x: Any, *, axis_name: tuple, gathered: tuple, **params: Any) -> tuple:
    count = len(gathered)
    # (the gathered axes are already whole: an axis spanning processes is gathered from them first)
    size = math.prod(x.shape[:count]) * axis_size(tuple(name for name in axis_name if name not in gathered))
    scratch = StagingTrace(current_trace.get(), [], f"abstract evaluation of {prim.name}")
    with new_trace(scratch):
      out = global_rule(scratch.new_arg(0, (size,) + tuple(x.shape[count:]), x.dtype, x.weak_type), **params)
    return tuple(x.shape[:count]) + tuple(out.shape[1:]), np.dtype(x.dtype), bool(x.weak_type)
  return aval


def _linear_jvp(prim: Collective) -> Callable:
  return lambda primals, tangents, out, **params: prim.bind(tangents[0], **params)


def _extremum_jvp(primals, tangents, out, *, axis_name):
  """pmax/pmin: the tangent of the example holding the result, shared evenly between ties (as reduce_max's JVP; JAX
  0.10 has no rule). An invariant operand under shard_map is its own result."""
  (x,), (t,) = primals, tangents
  trace = _find_axis(axis_name)
  if trace.spmd and not _varies(x, trace): return t
  hits = ad.cast(ad.eq(x, out), x.dtype)
  share = ad.div(hits, psum_p.bind(hits, axis_name=axis_name))
  return psum_p.bind(ad.mul(t, share), axis_name=axis_name)


def _psum_transpose(ct: Any, *, axis_name: Hashable) -> Any:
  """Under vmap, psum (as JAX). Under shard_map (spmd), each shard gets the cotangent once: pvary, a broadcast (a
  varying cotangent of the psum's invariant result was summed first: ad.transpose)."""
  trace = _find_axis(axis_name)
  if not trace.spmd: return psum_p.bind(ct, axis_name=axis_name)
  return pvary_p.bind(ct, axis_name=axis_name)


def _deftranspose(prim: Collective, rule: Callable) -> None:
  """Register `rule(ct, **params)`, the cotangent of a collective's operand, for its PRIMITIVE nodes."""
  ad.transpose_rules[prim] = lambda ct, node, known: (rule(ct, **dict(node.arg.params)),)


for _prim in (psum_p, pvary_p, *_GLOBAL_RULES): ad.jvp_rules[_prim] = _linear_jvp(_prim)
ad.jvp_rules[pmax_p] = ad.jvp_rules[pmin_p] = _extremum_jvp
ad.abstract_eval_rules[psum_p] = ad.abstract_eval_rules[pvary_p] = ad.abstract_eval_rules[pmax_p] = \
    ad.abstract_eval_rules[pmin_p] = lambda x, **params: (
  tuple(x.shape), np.dtype(x.dtype), bool(x.weak_type))
for _prim in _GLOBAL_RULES: ad.abstract_eval_rules[_prim] = _combined_aval(_prim)
_deftranspose(psum_p, _psum_transpose)
_deftranspose(pvary_p, lambda ct, *, axis_name: psum_p.bind(ct, axis_name=axis_name))
_deftranspose(all_gather_p, lambda ct, *, axis, **params: psum_scatter_p.bind(ct, scatter_dimension=axis, **params))
_deftranspose(psum_scatter_p, lambda ct, *, scatter_dimension, **params: all_gather_p.bind(
  ct, axis=scatter_dimension, **params))
_deftranspose(ppermute_p, lambda ct, *, perm, **params: ppermute_p.bind(
  ct, perm=tuple((destination, source) for source, destination in perm), **params))
_deftranspose(all_to_all_p, lambda ct, *, split_axis, concat_axis, **params: all_to_all_p.bind(
  ct, split_axis=concat_axis, concat_axis=split_axis, **params))


# ---------------------------------------------------------------------------------------------------------------------
# the collectives' API (jax.lax's): each takes a name or a tuple of names (the combined axis, first name major) and a
# pytree of arrays

def axis_size(axis_name: Hashable | tuple) -> int:
  """The number of examples along the vmap (or shard_map mesh axis) named `axis_name`; for a tuple of names, the
  product of their sizes."""
  return math.prod(_global_size(_find_axis(name)) for name in _axis_names(axis_name))


def _global_size(trace: BatchTrace) -> int:
  """The length of a trace's axis (across processes, for a mesh axis that spans them)."""
  return trace.axis_size if trace.processes is None else trace.processes.size


def _reduce_each_name(prim: Collective, x: Any, axis_name: Hashable | tuple) -> Any:
  def one(leaf: Any) -> Any:
    leaf = _as_array(leaf)
    for name in _axis_names(axis_name):
      trace = _find_axis(name)
      # shard_map: an invariant value becomes varying first (JAX's pvary), so reverse mode gives it one cotangent
      if prim is psum_p and trace.spmd and not _varies(leaf, trace): leaf = pvary_p.bind(leaf, axis_name=name)
      leaf = prim.bind(leaf, axis_name=name)
    return leaf
  return tree_util.tree_map(one, x)


def psum(x: Any, axis_name: Hashable | tuple) -> Any:
  """The sum of `x` (a pytree of arrays) over the examples of the named axis (or axes); the result is the same for
  every example. `psum(1, name)` is the axis size."""
  return _reduce_each_name(psum_p, x, axis_name)


def pmax(x: Any, axis_name: Hashable | tuple) -> Any:
  """The maximum of `x` (a pytree of arrays) over the examples of the named axis (or axes)."""
  return _reduce_each_name(pmax_p, x, axis_name)


def pmin(x: Any, axis_name: Hashable | tuple) -> Any:
  """The minimum of `x` (a pytree of arrays) over the examples of the named axis (or axes)."""
  return _reduce_each_name(pmin_p, x, axis_name)


def pmean(x: Any, axis_name: Hashable | tuple) -> Any:
  """The mean of `x` (a pytree of arrays) over the examples of the named axis (or axes); integers give floats, as
  JAX."""
  size = axis_size(axis_name)

  def one(leaf: Any) -> Any:
    total = psum(leaf, axis_name)
    if not dtypes.is_floating(total.dtype): total = ad.cast(total, dtypes.default_float_dtype())
    return ad.div(total, ad.full_like(total, size))
  return tree_util.tree_map(one, x)


def pcast(x: Any, axis_name: Hashable | tuple, *, to: str) -> Any:
  """JAX 0.10's cast of a value's varying type over mesh axes: `to='varying'` is `pvary`. ('invariant' would need
  the value to be the same along the axes: use psum / pmean / all_gather instead.)"""
  if to != "varying":
    raise ValueError(f"pcast to={to!r} is not supported: only to='varying' (a value becomes invariant over an axis "
                     "through a collective, e.g. lax.psum or lax.pmean)")
  return pvary(x, axis_name)


def varying_axes(x: Any) -> frozenset:
  """The shard_map mesh axes (spmd BatchTraces) along which `x` may differ: JAX's `typeof(x).vma`."""
  axes = set()
  while isinstance(x, Tracer):
    if isinstance(x, BatchTracer):
      if x.trace.spmd: axes.add(x.trace.axis_name)
      x = x.val
    elif isinstance(x, ad.JVPTracer): x = x.primal
    else: break
  return frozenset(axes)


def pvary(x: Any, axis_name: Hashable | tuple) -> Any:
  """`x` (a pytree of arrays) unchanged in value, made varying over the named axes: an unbatched (invariant) value
  becomes batched, a broadcast without copy. Under shard_map that decides reverse mode: each shard's copy gets its own
  cotangent and they are summed (pvary transposes to psum). JAX 0.10 spells it `pcast(x, axis_name, to='varying')`."""
  def one(leaf: Any) -> Any:
    leaf = _as_array(leaf)
    for name in _axis_names(axis_name):
      _find_axis(name)
      leaf = pvary_p.bind(leaf, axis_name=name)
    return leaf
  return tree_util.tree_map(one, x)


def axis_index(axis_name: Hashable | tuple) -> Any:
  """The index of the current example along the named axis: an int32 scalar per example. For a tuple of names, the
  index along the combined axis, the first name major: `axis_index(('x', 'y')) == ix * ny + iy`."""
  index = None
  for name in _axis_names(axis_name):
    trace = _find_axis(name)
    first = 0 if trace.processes is None else trace.processes.offset  # (this process's first position)
    own = BatchTracer(trace, Array.from_numpy(np.arange(first, first + trace.axis_size, dtype=np.int32)), 0)
    index = own if index is None else ad.add(ad.mul(index, ad.full_like(index, _global_size(trace))), own)
  return index


def _canonical_axis(axis: int, bound: int) -> int:
  """`axis` (negative counts from the end) as a position in [0, bound); ValueError outside."""
  if not -bound <= axis < bound:
    raise ValueError(f"axis {axis} is out of bounds for array of dimension {bound}")
  return axis % bound


def _combined(prim: Collective, x: Any, axis_name: Hashable | tuple, check: Callable[[Any, int], dict]) -> Any:
  """Apply `prim` over the combined axis to each leaf of `x`; `check(leaf, axis size)` validates the leaf and
  returns the primitive's params."""
  names = _axis_names(axis_name)
  size = axis_size(names)

  def one(leaf: Any) -> Any:
    leaf = _as_array(leaf)
    return prim.bind(leaf, axis_name=names, gathered=(), **check(leaf, size))
  return tree_util.tree_map(one, x)


def all_gather(x: Any, axis_name: Hashable | tuple, *, axis: int = 0, tiled: bool = False) -> Any:
  """Every example's `x` (a pytree of arrays) stacked over the named axis (or axes) along a new axis at `axis`, the
  same for every example: shape (..., N, ...) with N the axis size; `tiled`: concatenated along the existing `axis`
  instead (its size times N). Transposes to psum_scatter."""
  def check(leaf: Any, size: int) -> dict:
    return {"axis": _canonical_axis(axis, len(leaf.shape) + (not tiled)), "tiled": bool(tiled)}
  return _combined(all_gather_p, x, axis_name, check)


def psum_scatter(x: Any, axis_name: Hashable | tuple, *, scatter_dimension: int = 0, tiled: bool = False) -> Any:
  """The sum of `x` (a pytree of arrays) over the named axis (or axes), of which example k keeps the k-th of N
  chunks along `scatter_dimension`: `tiled`, a chunk of size dim / N (dim divisible by N); not tiled, the dimension
  must be N and is removed. Transposes to all_gather."""
  def check(leaf: Any, size: int) -> dict:
    dim = _canonical_axis(scatter_dimension, len(leaf.shape))
    if tiled and leaf.shape[dim] % size:
      raise ValueError(f"tiled reduce_scatter operand scatter dimension size {leaf.shape[dim]} must be divisible by "
                       f"shard_count {size}")
    if not tiled and leaf.shape[dim] != size:
      raise ValueError(f"reduce_scatter operand scatter dimension size {leaf.shape[dim]} must match shard count "
                       f"{size}")
    return {"scatter_dimension": dim, "tiled": bool(tiled)}
  return _combined(psum_scatter_p, x, axis_name, check)


def ppermute(x: Any, axis_name: Hashable | tuple, perm: Sequence[tuple[int, int]]) -> Any:
  """`x` (a pytree of arrays) sent along the named axis (or axes): for each pair (source, destination) of `perm`,
  example `destination` gets example `source`'s value; examples that receive nothing get zeros. Sources and
  destinations are each distinct indices into the axis. Transposes to the inverse permutation."""
  pairs = tuple((int(source), int(destination)) for source, destination in perm)

  def check(leaf: Any, size: int) -> dict:
    sources, destinations = [s for s, _ in pairs], [d for _, d in pairs]
    if len(set(sources)) < len(sources) or len(set(destinations)) < len(destinations):
      raise ValueError(f"ppermute sources and destinations must be unique, got {pairs}.")
    if not all(0 <= i < size for i in sources + destinations):
      raise ValueError(f"ppermute indices must be in [0, {size}) for the axis {axis_name!r} of size {size}, got "
                       f"{pairs}.")
    return {"perm": pairs}
  return _combined(ppermute_p, x, axis_name, check)


def all_to_all(x: Any, axis_name: Hashable | tuple, split_axis: int, concat_axis: int, *, tiled: bool = False) -> Any:
  """Each example splits `x` (a pytree of arrays) into N chunks along `split_axis` and sends chunk k to example k,
  which concatenates the chunks it receives along `concat_axis`, in the order of their senders. `tiled`: the split
  axis (divisible by N) shrinks N times and the concat axis grows N times; not tiled: the split axis must be N and is
  removed, and the N received values are stacked along a new axis at `concat_axis`. Transposes to all_to_all with the
  two axes swapped."""
  def check(leaf: Any, size: int) -> dict:
    ndim = len(leaf.shape)
    split = _canonical_axis(split_axis, ndim)
    concat = _canonical_axis(concat_axis, ndim)
    if tiled and leaf.shape[split] % size:
      raise ValueError(f"The size of all_to_all split_axis ({leaf.shape[split]}) has to be divisible by the size of "
                       f"the named axis {axis_name} ({size})")
    if not tiled and leaf.shape[split] != size:
      raise ValueError("all_to_all requires the size of the mapped axis axis_name to equal x.shape[split_axis], but "
                       f"they are {size} and {leaf.shape[split]} respectively.")
    return {"split_axis": split, "concat_axis": concat, "tiled": bool(tiled)}
  return _combined(all_to_all_p, x, axis_name, check)


# ---------------------------------------------------------------------------------------------------------------------
# vmap

_NONE_AXIS = object()  # stands for None in an axes tree while flattening it (None is an empty subtree in a pytree)


def _flatten_axes(what: str, tree: Any, axes: Any) -> list[int | None]:
  """One axis per leaf of `tree`: `axes` is a tree prefix of `tree` whose leaves are ints or None."""
  marked = tree_util.tree_map(lambda a: _NONE_AXIS if a is None else a, axes, is_leaf=lambda a: a is None)
  axes_leaves, axes_def = tree_util.tree_flatten(marked)
  try:
    subtrees = axes_def.flatten_up_to(tree)
  except ValueError:
    raise ValueError(f"{what} specification must be a tree prefix of the corresponding value, got specification "
                     f"{axes} for value tree {tree_util.tree_structure(tree)}.") from None
  flat = []
  for axis, subtree in zip(axes_leaves, subtrees):
    flat.extend([None if axis is _NONE_AXIS else axis] * len(tree_util.tree_leaves(subtree)))
  return flat


def _check_axes_type(what: str, axes: Any) -> None:
  leaves = tree_util.tree_leaves(axes)
  if not all(type(leaf) is int for leaf in leaves):
    raise TypeError(f"vmap {what} must be an int, None, or (nested) container with those types as leaves, but got "
                    f"{axes}.")


def _short_type(x: Any) -> str:
  try: return f"{dtypes.dtype(x.dtype).name}{list(np.shape(x))}".replace(" ", "")
  except Exception:  # noqa: BLE001 -- only for the message
    return type(x).__name__


def _leaf_names(fun: Callable, args: tuple, kwargs: dict) -> list[str]:
  """A readable name for each leaf of (args, kwargs), e.g. "argument 'params'['w']", for error messages."""
  try:
    bound = inspect.signature(fun).bind(*args, **kwargs).arguments
    return [f"argument {name}{tree_util.keystr(path)}" for name, value in bound.items()
            for path, _ in tree_util.tree_flatten_with_path(value)[0]]
  except (TypeError, ValueError):
    return ([f"args{tree_util.keystr(path)}" for path, _ in tree_util.tree_flatten_with_path(args)[0]] +
            [f"kwargs{tree_util.keystr(path)}" for path, _ in tree_util.tree_flatten_with_path(kwargs)[0]])


def _inconsistent_sizes(fun: Callable, args: tuple, kwargs: dict, leaves: list[Any], axes: list[int | None],
                        axis_size: int | None) -> ValueError:
  """JAX's message: which sizes were found, how often, and one argument with each."""
  names = _leaf_names(fun, args, kwargs)
  sizes = [None if a is None else np.shape(leaf)[a] for leaf, a in zip(leaves, axes)]
  message = "vmap got inconsistent sizes for array axes to be mapped:\n"
  if axis_size is not None: message += f"  * axis_size was given as {axis_size};\n"
  for size, count in collections.Counter(s for s in sizes if s is not None).most_common():
    index = sizes.index(size)
    where = f"axis {axes[index]} of {names[index] if index < len(names) else 'an argument'} of type " \
            f"{_short_type(leaves[index])}"
    if count == 1: message += f"  * one axis had size {size}: {where};\n"
    else: message += f"  * some axes ({count} of them) had size {size}, e.g. {where};\n"
  return ValueError(message[:-2])


def _canonical_in_axis(leaf: Any, axis: int | None) -> int | None:
  if axis is None: return None
  ndim = len(np.shape(leaf))
  if not -ndim <= axis < ndim:
    min_rank = axis + 1 if axis >= 0 else -axis
    raise ValueError(f"vmap was requested to map its argument along axis {axis}, which implies that its rank should "
                     f"be at least {min_rank}, but is only {ndim} (its shape is {tuple(np.shape(leaf))})")
  return axis % ndim


def _output(trace: BatchTrace, leaf: Any, out_axis: int | None) -> Any:
  """One output leaf with its batch axis at `out_axis` (unbatched outputs are broadcast; None keeps them as they
  are, and is an error for a batched output)."""
  if isinstance(leaf, BatchTracer) and leaf.trace is trace: val, dim = leaf.val, leaf.batch_dim
  else:
    if isinstance(leaf, Tracer): leaf.check_alive()
    val, dim = _as_array(leaf), None
  if out_axis is None:
    if dim is not None:
      raise ValueError("vmap has mapped output but out_axes is None: an output that depends on a mapped input "
                       "needs an integer out_axes")
    return val
  ndim = len(val.shape) + (dim is None)
  if not -ndim <= out_axis < ndim:
    raise ValueError(f"vmap out_axes={out_axis} is out of bounds for an output of rank {ndim} (its shape with the "
                     f"mapped axis is {insert_at(tuple(val.shape), 0, trace.axis_size) if dim is None else val.shape})")
  return match_axis(val, dim, out_axis % ndim, trace.axis_size)


def vmap(fun: Callable, in_axes: int | None | Sequence[Any] = 0, out_axes: Any = 0, axis_name: Hashable | None = None,
         axis_size: int | None = None) -> Callable:
  """Vectorise `fun` over an axis of its inputs: `vmap(f)(xs)` stacks `f(x)` over the slices `x` of `xs`.

  `in_axes`: per positional argument, which axis to map (an int, negative counting from the end, or None for an
  argument that is the same for every example): one int/None for all, or a tuple with one entry per argument, each
  an int/None or a pytree prefix of that argument (dicts, lists, ...). Keyword arguments are mapped over axis 0.
  `out_axes`: where the mapped axis goes in each output (int, negative, pytree prefix of the output; None only for
  outputs that do not depend on a mapped input). `axis_size`: the size of the mapped axis, required when no input is
  mapped. `axis_name`: a name for the axis, for `psum`/`pmean`/`pmax`/`axis_index` inside `fun`.
  Mapped axes of different sizes are a ValueError naming them."""
  return batched(fun, in_axes, out_axes, axis_name, axis_size)


def batched(fun: Callable, in_axes: int | None | Sequence[Any] = 0, out_axes: Any = 0,
            axis_name: Hashable | None = None, axis_size: int | None = None, spmd: bool = False) -> Callable:
  """`vmap` whose BatchTrace has `spmd` (a shard_map mesh axis, see BatchTrace)."""
  check_callable(fun)
  if isinstance(in_axes, list): in_axes = tuple(in_axes)  # as JAX: lists and tuples are interchangeable here
  if not (in_axes is None or type(in_axes) in (int, tuple)):
    raise TypeError("vmap in_axes must be an int, None, or a tuple of entries corresponding to the positional "
                    f"arguments passed to the function, but got {in_axes}.")
  _check_axes_type("in_axes", in_axes)
  _check_axes_type("out_axes", out_axes)

  @functools.wraps(fun, updated=())  # not a wrapped jit's attributes (its `fun` would replace vmap's)
  def vmap_f(*args: Any, **kwargs: Any) -> Any:
    if isinstance(in_axes, tuple) and len(in_axes) != len(args):
      raise ValueError("vmap in_axes must be an int, None, or a tuple of entries corresponding to the positional "
                       f"arguments passed to the function, but got len(in_axes)={len(in_axes)}, len(args)={len(args)}")
    leaves, in_tree = tree_util.tree_flatten((args, kwargs))
    axes = _flatten_axes("vmap in_axes", args, in_axes) + [0] * len(tree_util.tree_leaves(kwargs))
    axes = [_canonical_in_axis(leaf, axis) for leaf, axis in zip(leaves, axes)]
    sizes = {np.shape(leaf)[axis] for leaf, axis in zip(leaves, axes) if axis is not None}
    if axis_size is None and not sizes:
      if not leaves:
        raise ValueError(f"vmap wrapped function must be passed at least one argument containing an array, got empty "
                         f"*args={args} and **kwargs={kwargs}")
      raise ValueError("vmap must have at least one non-None value in in_axes")
    if len(sizes) > 1 or (axis_size is not None and sizes and sizes != {axis_size}):
      raise _inconsistent_sizes(fun, args, kwargs, leaves, axes, axis_size)
    size = axis_size if axis_size is not None else sizes.pop()

    trace = BatchTrace(current_trace.get(), size, axis_name, spmd)
    with new_trace(trace):
      inputs = [leaf if axis is None else BatchTracer(trace, _as_array(leaf), axis) for leaf, axis in zip(leaves, axes)]
      call_args, call_kwargs = tree_util.tree_unflatten(in_tree, inputs)
      out = fun(*call_args, **call_kwargs)
      out_leaves, out_tree = tree_util.tree_flatten(out)
      flat_out_axes = _flatten_axes("vmap out_axes", out, out_axes)
    return tree_util.tree_unflatten(out_tree, [_output(trace, leaf, axis)
                                               for leaf, axis in zip(out_leaves, flat_out_axes)])
  return vmap_f
