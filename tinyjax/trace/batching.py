"""Automatic batching: `vmap`, as in JAX, and the collectives over its named axes (`psum`, `pmean`, `pmax`,
`axis_index`).

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
from typing import Any, Callable, Hashable, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.trace import ad
from tinyjax.trace.core import (ConcretizationTypeError, Primitive, Trace, Tracer, bind, check_callable, current_trace,
                                new_trace, set_current_trace)
from tinyjax.uop import ELEMENTWISE, Ops

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

  def concrete(self, what: str) -> Array:
    self.check_alive()
    raise ConcretizationTypeError(
      f"Abstract tracer value encountered where concrete value is expected: {what} of an array {self.aval_str()} "
      f"batched by `vmap` (one value per example, {self.trace.axis_size} of them). Python control flow cannot depend "
      "on a batched value: use tinyjax.numpy.where or lax.cond/select instead, or pass the value unbatched "
      "(in_axes=None) if it is the same for every example.")


class BatchTrace(Trace):
  """Vectorisation over one axis of `axis_size` elements, named `axis_name` (for collectives) or None.

  `spmd`: the axis is a mesh axis of `shard_map` with check_vma (trace/shard_map.py), whose collectives follow JAX's
  varying/invariant typing: an unbatched value is invariant over the axis, a batched one varies, and reverse mode
  transposes `psum` of a varying value into a broadcast (not into another `psum`, as under `vmap`)."""
  fun_name = "vmap"

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
      rule = batch_rules.get(op)
      if rule is None: raise NotImplementedError(f"batching rule for {op.name} is not implemented")
      out, out_dim = rule(vals, dims, arg, dtype, weak_type)
    return self.pack(out, out_dim)

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
      out, out_dim = rule(self, vals, dims, **params)
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
# collectives over a vmap axis name

def _find_axis(axis_name: Hashable) -> BatchTrace:
  """The BatchTrace named `axis_name` in the chain of traces from the current one down; NameError if none."""
  trace: Trace | None = current_trace.get()
  names = []
  while trace is not None:
    if isinstance(trace, BatchTrace) and trace.axis_name is not None:
      if trace.axis_name == axis_name: return trace
      names.append(trace.axis_name)
    trace = trace.parent
  raise NameError(f"unbound axis name: {axis_name}. The following axis names (e.g. defined by vmap) are available to "
                  f"collective operations: {names}")


def _collective_impl(name: str) -> Callable:
  """What a collective does on a trace with no rule for it (one between the current trace and the named vmap):
  apply the named vmap's rule directly if the operand is a value of that trace or of one below it."""
  def impl(x: Any, *, axis_name: Hashable) -> Any:
    target = _find_axis(axis_name)
    below, trace = set(), target
    while trace is not None:
      below.add(id(trace))
      trace = trace.parent
    if isinstance(x, Tracer) and id(x.trace) not in below:
      raise NotImplementedError(
        f"{name} over the vmap axis {axis_name!r} of a value traced by `{getattr(x.trace, 'fun_name', '?')}` inside "
        "that vmap is not supported (e.g. reverse-mode differentiation through a collective); apply the collective "
        "outside the inner transformation")
    return target.process_primitive(prim_of[name], (x,), {"axis_name": axis_name})
  return impl


psum_p = Primitive("psum", _collective_impl("psum"))
pmax_p = Primitive("pmax", _collective_impl("pmax"))
prim_of = {"psum": psum_p, "pmax": pmax_p}


def _collective_rule(prim: Primitive, reduce_op: Ops) -> Callable:
  """Over this trace's axis: reduce the batch axis away (the result is unbatched, as JAX); over another axis name:
  the collective is elementwise along this trace's axis, so pass it to the parent with the batch dim unchanged."""
  def rule(trace: BatchTrace, vals, dims, *, axis_name):
    (x,), (dim,) = vals, dims
    if axis_name != trace.axis_name: return prim.bind(x, axis_name=axis_name), dim
    x = _as_array(x)
    if dim is None:  # every example holds the same x
      return (ad.mul(x, ad.full_like(x, trace.axis_size)) if reduce_op is Ops.ADD else x), None
    reduced = bind(Ops.REDUCE_AXIS, x, arg=(reduce_op, (dim,)), weak_type=x.weak_type)
    shape = tuple(x.shape)
    return bind(Ops.RESHAPE, reduced, arg=shape[:dim] + shape[dim + 1:], weak_type=x.weak_type), None
  return rule


batch_rules[psum_p] = _collective_rule(psum_p, Ops.ADD)
batch_rules[pmax_p] = _collective_rule(pmax_p, Ops.MAX)
ad.jvp_rules[psum_p] = lambda primals, tangents, out, axis_name: psum_p.bind(tangents[0], axis_name=axis_name)


def _axis_names(axis_name: Hashable | tuple) -> tuple:
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _as_array(x: Any) -> Any:
  return x if isinstance(x, Array) else ad._to_array(x)


def psum(x: Any, axis_name: Hashable | tuple) -> Any:
  """The sum of `x` (a pytree of arrays) over the examples of the vmap named `axis_name` (or several names);
  the result is the same for every example. `psum(1, name)` is the axis size."""
  def one(leaf: Any) -> Any:
    for name in _axis_names(axis_name): leaf = psum_p.bind(_as_array(leaf), axis_name=name)
    return leaf
  return tree_util.tree_map(one, x)


def pmax(x: Any, axis_name: Hashable | tuple) -> Any:
  """The maximum of `x` (a pytree of arrays) over the examples of the vmap named `axis_name` (or several names)."""
  def one(leaf: Any) -> Any:
    for name in _axis_names(axis_name): leaf = pmax_p.bind(_as_array(leaf), axis_name=name)
    return leaf
  return tree_util.tree_map(one, x)


def pmean(x: Any, axis_name: Hashable | tuple) -> Any:
  """The mean of `x` (a pytree of arrays) over the examples of the vmap named `axis_name` (or several names);
  integers give floats, as JAX."""
  size = 1
  for name in _axis_names(axis_name): size *= _find_axis(name).axis_size

  def one(leaf: Any) -> Any:
    total = psum(leaf, axis_name)
    if not dtypes.is_floating(total.dtype): total = ad.cast(total, dtypes.default_float_dtype())
    return ad.div(total, ad.full_like(total, size))
  return tree_util.tree_map(one, x)


def axis_index(axis_name: Hashable) -> Any:
  """The index of the current example along the vmap named `axis_name`: an int32 scalar per example."""
  trace = _find_axis(axis_name)
  return BatchTracer(trace, Array.from_numpy(np.arange(trace.axis_size, dtype=np.int32)), 0)


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
