"""`jit` and `make_jaxpr`: trace a function over pytrees of arrays into a UOp program, lower it once per input
signature, and replay the compiled kernels on later calls.

Tracing runs the Python function once with `Tracer`s standing for its array arguments (PARAM leaves); whatever it
builds through `bind` is the program. Arrays it closes over become extra inputs (never baked-in values), so calling
again with other data, or after the closed-over array changes identity, never retraces. A signature is the tree
structure, shapes, dtypes and weak types of the dynamic arguments plus the values of the static ones.

The hot path (a call with positional arguments only, no static ones, every leaf an Array): flatten the arguments once,
key the signature on the treedef and each leaf's buffer shape, dtype and weak type, and run the cached program in
one call into compiled code (`run_schedule`); nothing is traced, converted or lowered. Anything else takes the
general path (`_lookup`), which also fills the hot path's cache.

Donation (`donate_argnums`): which donated argument's buffer each output may be written into is decided once per
compiled program (lower/memory.py `donation_aliases`); each call then deletes the donated arrays, as JAX does, and
hands an output its donated buffer when nothing else can still see that buffer (the same array passed twice, a lazy
array computed from it, a numpy view of it: those calls write a new buffer instead).
"""
from __future__ import annotations

import functools
import inspect
import sys
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array, deleted_uop, realize_arrays
from tinyjax.devices.buffer import Buffer, DeletedBuffer, ShardedBuffer, is_exclusive, shard
from tinyjax.devices.device import (CPU, compute_device, default_device, place, placement_of, runnable,
                                    same_memory)
from tinyjax.helpers import LazyModule, gc_paused, open_profiles, user_stacklevel
from tinyjax.sharding import _mesh_stack
from tinyjax.trace.sharding_types import compiled, named_of
from tinyjax.trace.core import (EvalTrace, Primitive, PrimitiveCallRecord, StagingTrace, Tracer, bind, check_callable,
                                check_nans, current_trace, debug_nans, new_trace)
from tinyjax.uop import Ops, UOp

# what lowers and runs programs, imported by the first program (`import tinyjax` need not load it)
realize = LazyModule("tinyjax.lower.realize")
lowering = LazyModule("tinyjax.lower.schedule")
cpu_device = LazyModule("tinyjax.devices.cpu")
memory_plan = LazyModule("tinyjax.lower.memory")


def _leaf_to_array(leaf: Any) -> Array:
  """An argument leaf as an Array: Arrays as they are, numpy data and Python scalars converted as JAX does."""
  if isinstance(leaf, Array): return leaf
  if isinstance(leaf, (bool, int, float, complex)) and not isinstance(leaf, np.generic):
    dtype = dtypes.python_scalar_dtype(leaf)  # (weakly typed, but a bool: JAX's bool has no weak type)
    return Array.from_numpy(np.asarray(leaf, dtype=dtype), weak_type=dtypes.is_weakly_typed(leaf))
  if isinstance(leaf, (np.ndarray, np.generic)):
    dtype = dtypes.canonicalize_dtype(dtypes.dtype(leaf.dtype))
    return Array.from_numpy(np.asarray(leaf, dtype=dtype))
  _leaf_aval(leaf)  # raises TypeError naming what is wrong
  raise TypeError(f"Argument {leaf!r} of type {type(leaf).__name__} has no values to compute with")


class ShapeDtypeStruct:
  """An abstract array: a shape, a dtype and a weak type, no values (what `eval_shape` takes and returns)."""
  __slots__ = ("shape", "dtype", "weak_type", "sharding")

  def __init__(self, shape: Sequence[int], dtype: Any, weak_type: bool = False, sharding: Any = None):
    self.shape, self.dtype = tuple(int(d) for d in shape), dtypes.dtype(dtype)
    self.weak_type, self.sharding = weak_type, sharding

  @classmethod
  def like(cls, x: Any) -> ShapeDtypeStruct:
    """The abstract array of `x` (an array, a tracer, a numpy array or another ShapeDtypeStruct), as JAX's: its shape,
    dtype, weak type and sharding."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype") or isinstance(x, (np.ndarray, np.generic)):
      from tinyjax.lax._base import to_array  # (a Python scalar is weakly typed; 64-bit dtypes as the x64 setting says)
      x = to_array(x)
    return cls(x.shape, x.dtype, getattr(x, "weak_type", False), getattr(x, "sharding", None)
               if isinstance(x, ShapeDtypeStruct) else None)

  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def size(self) -> int: return int(np.prod(self.shape, dtype=np.int64))

  def __eq__(self, other: Any) -> bool:
    return (isinstance(other, ShapeDtypeStruct) and (self.shape, self.dtype, self.weak_type) ==
            (other.shape, other.dtype, other.weak_type))

  def __hash__(self) -> int: return hash((self.shape, self.dtype, self.weak_type))
  def __repr__(self) -> str:
    weak = ", weak_type=True" if self.weak_type else ""
    return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype.name}{weak})"


def _leaf_aval(leaf: Any) -> tuple[tuple[int, ...], np.dtype, bool]:
  """(shape, dtype, weak_type) of an argument leaf, without converting its data; TypeError for non-arrays."""
  if isinstance(leaf, (Array, ShapeDtypeStruct)): return (tuple(leaf.shape), leaf.dtype, leaf.weak_type)
  if type(leaf) in (bool, int, float, complex): return ((), *dtypes.dtype_and_weak_type(leaf))
  if isinstance(leaf, (np.ndarray, np.generic)):
    return (np.shape(leaf), dtypes.canonicalize_dtype(dtypes.dtype(leaf.dtype)), False)
  raise TypeError(f"Argument {leaf!r} of type {type(leaf).__name__} is not a valid tinyjax type: pass arrays, "
                  "numpy arrays, Python scalars or pytrees of them, or mark the argument static with static_argnums")


def _leaf_placement(leaf: Any) -> tuple:
  """Where an argument leaf lives, for `place` (host data: uncommitted, on the default device, where it will be
  put)."""
  if isinstance(leaf, Array): return placement_of(leaf.realize().uop.arg)
  device = default_device()
  return device, False, frozenset((device,)), None


def _leaf_signature(leaf: Any) -> tuple:
  """What a jitted program depends on of an argument leaf: its aval, and a sharded array's sharding (`shard_map`
  inside infers its in_specs from it)."""
  try: aval = _leaf_aval(leaf)
  except TypeError: return (type(leaf),)  # not an array: tracing raises with a message
  sharding = _leaf_sharding(leaf)
  return aval if sharding is None else (*aval, sharding)


def _leaf_sharding(leaf: Any) -> Any:
  """A sharded Array argument's NamedSharding, else None."""
  return named_of(leaf) if type(leaf) is Array else None


@dataclass
class Jaxpr:
  """A traced program: a SINK over its outputs, PARAM 0..n_args-1 for the flattened arguments and PARAM n_args..
  for arrays the function closed over (`consts`). `str()` prints it one equation per line, as JAX's jaxprs read:
  the primitives the function bound (`calls`: each result node's PrimitiveCallRecord) under their names, with their
  parameters, and the Ops of the rest; the program itself holds the primitives' decompositions into Ops."""
  sink: UOp
  n_args: int
  consts: list[Buffer]
  out_weak_types: tuple[bool, ...]
  out_tree: Any
  in_avals: tuple = ()  # (shape, dtype, weak_type) of each argument, for printing ones the program never reads
  prints: tuple = ()  # debug.print calls: (format, tree, [("output", index) or ("static", value) per value])
  out_shardings: tuple = ()  # per output, the NamedSharding the operations gave it (trace/sharding_types.py) or None
  calls: Any = None  # {result node: PrimitiveCallRecord} of the primitives bound while tracing (normalised nodes)

  def __str__(self) -> str:
    names: dict[UOp, str] = {}
    calls = self.calls or {}

    def name_of(node: UOp) -> str:
      if (literal := _literal(node)) is not None: return literal
      return names[node]

    def operand_name(value: Any) -> str:
      if isinstance(value, UOp): return name_of(value)
      return f"{value!r}" if not isinstance(value, np.ndarray) else f"{value.tolist()!r}"

    def new_name() -> str: return _var_name(len(names) + n_inputs - len(params))

    # inputs first, in PARAM order (arguments, then the arrays closed over), then one name per equation
    params = {node.arg[0]: node for node in self.sink.toposort if node.op is Ops.PARAM}
    n_inputs = max([self.n_args, *(index + 1 for index in params)])
    inputs = []
    for index in range(n_inputs):
      name = _var_name(index)
      if index in params:
        names[params[index]] = name
        inputs.append(f"{name}:{_short(params[index])}")
      else:  # an argument the program never reads
        shape, dtype = self.in_avals[index][:2] if index < len(self.in_avals) else ((), np.dtype(np.float32))
        inputs.append(f"{name}:{_short_aval(shape, np.dtype(dtype))}")
    lines = []
    projections: dict[UOp, dict[int, UOp]] = {}
    for node in self.sink.toposort:
      if node.op is Ops.PROJECT: projections.setdefault(node.src[0], {})[node.arg[0]] = node
    in_program = set(self.sink.toposort)
    for item in _equations(self.sink, calls):
      if isinstance(item, tuple):  # a primitive call: its results named together (`_` for one the program drops)
        outs = []
        for out in item.outs:
          if out not in in_program:
            outs.append(f"_:{_short(out)}")
            continue
          names[out] = new_name()
          outs.append(f"{names[out]}:{_short(out)}")
        operands = " ".join(operand_name(value) for value in item.operands)
        lines.append(f"    {' '.join(outs)} = {item.prim.name}{_format_params(item.params)} {operands}")
        continue
      node = item
      operands = " ".join(name_of(src) for src in node.src)
      if node.op in (Ops.SCAN, Ops.WHILE, Ops.COND, Ops.CALLBACK) or \
          node.op is Ops.PRIMITIVE and node.arg.prim.multiple_results:
        outs = []
        for index, aval in enumerate(_loop_out_avals(node)):
          projection = projections.get(node, {}).get(index)
          name = new_name()
          names[projection if projection is not None else UOp(Ops.PROJECT, aval[1], (node,), (index, aval[0]))] = name
          outs.append(f"{name}:{_short_aval(*aval)}")
        if node.op is Ops.PRIMITIVE: lines.append(f"    {' '.join(outs)} = {node.arg.prim.name} {operands}")
        elif node.op is Ops.CALLBACK:
          lines.append(f"    {' '.join(outs)} = pure_callback[callback={node.arg.name}] {operands}")
        else: lines.append(f"    {' '.join(outs)} = {node.op.name.lower()}[{_loop_params(node)}] {operands}")
        continue
      names[node] = new_name()
      if node.op is Ops.PRIMITIVE:
        lines.append(f"    {names[node]}:{_short(node)} = {node.arg!r} {operands}")
        continue
      if node.op is Ops.WHERE:  # as JAX's select_n(predicate, on_false, on_true)
        operands = " ".join(name_of(src) for src in (node.src[0], node.src[2], node.src[1]))
      op_name, op_params = _op_equation(node)
      lines.append(f"    {names[node]}:{_short(node)} = {op_name}{_format_params(op_params)} {operands}")
    outputs = ", ".join(name_of(out) for out in self.sink.src)
    consts, args = inputs[self.n_args:], inputs[:self.n_args]
    header = (" ".join(consts) + " ; " if consts else "; ") + " ".join(args)
    outputs += "," if len(self.sink.src) == 1 else ""  # (JAX's tuple: `in (b,) }`, `in (b, c) }`)
    if not lines: return "{ lambda " + header + f". let  in ({outputs}) }}"  # (as JAX prints one without equations)
    return "{ lambda " + header + ". let\n" + "\n".join(lines) + f"\n  in ({outputs}) }}"

  __repr__ = __str__


# Ops printed under the names of JAX's primitives that do the same
_OP_NAMES = {Ops.FDIV: "div", Ops.IDIV: "div", Ops.MOD: "rem", Ops.CMPLT: "lt", Ops.CMPNE: "ne", Ops.WHERE: "select_n",
             Ops.EXPAND: "broadcast_in_dim", Ops.PERMUTE: "transpose", Ops.CAST: "convert_element_type",
             Ops.BITCAST: "bitcast_convert_type", Ops.RECIP: "reciprocal", Ops.SHRINK: "slice", Ops.FLIP: "rev"}


# primitives whose programs are one node (a loop, a branch, a host call) that prints its sub-programs itself
_SHOWN_AS_NODES = {"scan", "while", "cond", "pure_callback"}


def _literal(node: UOp) -> str | None:
  """A scalar constant, or one broadcast to a shape (a CONST under RESHAPE and EXPAND, as an operation's scalar
  operand is), made strongly typed (a CAST to its own dtype), or a float one negated (`x - 1.0` is an ADD of a NEG):
  printed as its value, as JAX prints a literal operand; None for any other node."""
  negated = node.op is Ops.NEG and dtypes.is_inexact(node.dtype)
  if negated: node = node.src[0]
  while node.op in (Ops.RESHAPE, Ops.EXPAND) or node.op is Ops.CAST and node.src[0].dtype == node.dtype:
    node = node.src[0]
  if node.op is not Ops.CONST: return None
  return f"{-node.arg if negated else node.arg!r}:{_short(node)}"


def _equations(sink: UOp, calls: dict) -> list:
  """What the printed program is made of, in an order where operands come first: primitive calls (their
  PrimitiveCallRecord: the Ops they decompose into are not shown) and the nodes outside them. Iterative: programs of
  thousands of equations print without recursion."""
  order: list = []
  done: set = set()
  stack: list[tuple[Any, bool]] = [(out, False) for out in reversed(sink.src)]
  while stack:
    item, expanded = stack.pop()
    key = id(item) if isinstance(item, tuple) else item
    if key in done: continue
    if expanded:
      done.add(key)
      order.append(item)
      continue
    if isinstance(item, UOp):
      if item.op in (Ops.PARAM, Ops.CONST) or _literal(item) is not None:
        done.add(key)
        continue
      record = calls.get(item)
      if record is not None and record.prim.name not in _SHOWN_AS_NODES:
        stack.append((record, False))
        continue
      if item.op is Ops.PROJECT:  # a multiple-result node's output: the node is printed with all of them
        stack.append((item.src[0], False))
        done.add(key)
        continue
      stack.append((item, True))
      stack.extend((src, False) for src in reversed(item.src))
    else:  # a primitive call: after its operands
      stack.append((item, True))
      stack.extend((value, False) for value in reversed(item.operands) if isinstance(value, UOp))
  return order


def _format_params(params: dict) -> str:
  """A primitive's parameters as JAX prints them: `[name=value ...]` (nothing without parameters)."""
  if not params: return ""
  return "[" + " ".join(f"{name}={_format_param(value)}" for name, value in params.items()) + "]"


def _format_param(value: Any) -> str:
  if isinstance(value, str): return value  # (as JAX prints them: name=inner)
  if isinstance(value, np.dtype): return value.name
  if isinstance(value, type) and issubclass(value, np.generic): return np.dtype(value).name
  if callable(value) and hasattr(value, "__name__"): return value.__name__
  return repr(value)


def _loop_out_avals(node: UOp) -> list[tuple[tuple[int, ...], np.dtype]]:
  """(shape, dtype) of each output of a SCAN (final carries, stacked ys), WHILE (final carries), COND or CALLBACK."""
  if node.op is Ops.WHILE: return [(tuple(c.shape), c.dtype) for c in node.src[:node.arg.n_carry]]
  if node.op is Ops.COND: return [(tuple(out.shape), out.dtype) for out in node.arg[0].src]
  if node.op is Ops.PRIMITIVE: return [(tuple(shape), dtype) for shape, dtype, _ in node.arg.out_avals]
  if node.op is Ops.CALLBACK: return [(tuple(shape), dtype) for shape, dtype in node.arg.out_avals]
  body, length, _, n_carry, _ = node.arg
  return [(tuple(out.shape), out.dtype) if i < n_carry else ((length, *out.shape), out.dtype)
          for i, out in enumerate(body.src)]


def _loop_params(node: UOp) -> str:
  """A loop's parameters and sub-programs, indented under its equation."""
  def program(sink: UOp) -> str:
    n_params = max((n.arg[0] + 1 for n in sink.toposort if n.op is Ops.PARAM), default=0)
    text = str(Jaxpr(sink, n_params, [], (False,) * len(sink.src), None))
    return text.replace("\n", "\n      ")
  if node.op is Ops.COND:
    return "branches=(\n        " + "\n        ".join(program(branch).replace("\n", "\n  ") for branch in node.arg) + \
        "\n      )"
  n_consts = len(node.src) - node.arg.n_carry - (node.arg.n_xs if node.op is Ops.SCAN else 0)
  if node.op is Ops.WHILE:
    return f"body_jaxpr={program(node.arg.body)}\n      cond_jaxpr={program(node.arg.cond)}\n      " \
           f"num_carry={node.arg.n_carry} num_consts={n_consts}"
  body, length, reverse, n_carry, n_xs = node.arg
  return f"jaxpr={program(body)}\n      length={length} num_carry={n_carry} num_consts={n_consts} reverse={reverse}"


def _var_name(index: int) -> str:
  letters = "abcdefghijklmnopqrstuvwxyz"
  name = ""
  index += 1
  while index:
    index, rest = divmod(index - 1, 26)
    name = letters[rest] + name
  return name


def _short(node: UOp) -> str: return _short_aval(node.shape, node.dtype)


def _short_aval(shape: tuple[int, ...], dtype: np.dtype) -> str:
  kind = {"f": "f", "i": "i", "u": "u", "b": "bool"}.get(dtype.kind, dtype.kind)
  if dtype.name == "bfloat16": short = "bf16"
  else: short = "bool" if kind == "bool" else f"{kind}{dtype.itemsize * 8}"
  return f"{short}[{','.join(map(str, shape))}]"


def _op_equation(node: UOp) -> tuple[str, dict]:
  """The name and parameters JAX gives the primitive an Op node performs (`slice[limit_indices=(2, 3)
  start_indices=(1, 0) strides=None]`, `reduce_max[axes=(0,)]`)."""
  op, arg = node.op, node.arg
  name = _OP_NAMES.get(op, op.name.lower())
  if op is Ops.RESHAPE: return name, {"dimensions": None, "new_sizes": arg}
  if op is Ops.EXPAND: return name, {"broadcast_dimensions": tuple(range(len(arg))), "shape": arg}
  if op is Ops.PERMUTE: return name, {"permutation": arg}
  if op is Ops.SHRINK:
    return name, {"limit_indices": tuple(end for _, end in arg), "start_indices": tuple(start for start, _ in arg),
                  "strides": None}
  if op is Ops.PAD: return name, {"padding_config": tuple((low, high, 0) for low, high in arg)}
  if op is Ops.FLIP: return name, {"dimensions": tuple(axis for axis, flipped in enumerate(arg) if flipped)}
  if op in (Ops.CAST, Ops.BITCAST): return name, {"new_dtype": node.dtype}
  if op is Ops.IOTA: return name, {"dimension": 0, "dtype": node.dtype, "shape": (arg,)}
  if op is Ops.REDUCE_AXIS:
    return {Ops.ADD: "reduce_sum", Ops.MAX: "reduce_max", Ops.MUL: "reduce_prod"}[arg[0]], {"axes": tuple(arg[1])}
  return name, ({} if arg is None else {"arg": arg})


def _flat_arg_names(fun: Callable, args: tuple, kwargs: dict, dynamic: list[int]) -> list[str]:
  """A readable name for each flattened dynamic argument leaf, e.g. "argument 'params'['w']"."""
  try: parameters = list(inspect.signature(fun).parameters)
  except (TypeError, ValueError): parameters = []
  names = []
  for position in dynamic:
    label = f"argument '{parameters[position]}'" if position < len(parameters) else f"positional argument {position}"
    for path, _ in tree_util.tree_flatten_with_path(args[position])[0]:
      names.append(label + tree_util.keystr(path))
  for key in sorted(kwargs):
    for path, _ in tree_util.tree_flatten_with_path(kwargs[key])[0]:
      names.append(f"argument '{key}'" + tree_util.keystr(path))
  return names


def trace_to_jaxpr(fun: Callable, args: tuple, kwargs: dict, static_argnums: Sequence[int] = ()) -> Jaxpr:
  """Run `fun` on tracers for its non-static arguments and return the traced program."""
  dynamic = [i for i in range(len(args)) if i not in static_argnums]
  leaves, in_tree = tree_util.tree_flatten(([args[i] for i in dynamic], kwargs))
  avals = [_leaf_aval(leaf) for leaf in leaves]
  trace = StagingTrace(current_trace.get(), _flat_arg_names(fun, args, kwargs, dynamic),
                       getattr(fun, "__name__", "function"))
  trace.arg_shardings = {i: sharding for i, leaf in enumerate(leaves) if (sharding := _leaf_sharding(leaf))}
  with new_trace(trace):
    tracers = [trace.new_arg(i, shape, dtype, weak) for i, (shape, dtype, weak) in enumerate(avals)]
    for i, sharding in trace.arg_shardings.items(): tracers[i]._named = sharding
    dynamic_args, traced_kwargs = tree_util.tree_unflatten(in_tree, tracers)
    call_args = list(args)
    for position, value in zip(dynamic, dynamic_args): call_args[position] = value
    out = fun(*call_args, **traced_kwargs)
    out_leaves, out_tree = tree_util.tree_flatten(out)
    out_arrays = [_scalar_output(leaf) if type(leaf) in _SCALAR_TYPES else _leaf_to_array(leaf) for leaf in out_leaves]
  for leaf in out_arrays:
    if isinstance(leaf, Tracer) and leaf.trace is not trace: leaf.check_alive()
  roots = [a.uop for a in out_arrays]
  # tinyjax.debug.print calls: their array values become extra outputs, printed after each run
  prints = []
  for fmt, tree, values in getattr(trace, "prints", []):
    slots = []
    for value in values:
      if isinstance(value, Array):
        slots.append(("output", len(roots)))
        roots.append(value.uop)
      else:
        slots.append(("static", value))
    prints.append((fmt, tree, slots))
  replaced: dict[UOp, UOp] = {}
  if roots:
    sink, consts = realize.normalize(roots, first_param=len(avals), replaced=replaced)
  else:
    sink, consts = UOp(Ops.SINK, np.dtype(np.bool_), ()), []
  out_shardings = tuple(compiled(named_of(a)) for a in out_arrays)
  return Jaxpr(sink, len(avals), consts, tuple(a.weak_type for a in out_arrays), out_tree, tuple(avals),
               tuple(prints), out_shardings if any(out_shardings) else (), _normalised_calls(trace.calls, replaced))


def _scalar_output(leaf: bool | int | float | complex) -> Array:
  """A Python scalar a traced function returns: a constant of the program (JAX's literal: `make_jaxpr(lambda: 1)()`
  is `{ lambda ; . let  in (1:i32[],) }`), weakly typed but a bool, not an array it closes over."""
  dtype = dtypes.python_scalar_dtype(leaf)
  return bind(Ops.CONST, arg=np.asarray(leaf, dtype=dtype).item(), dtype=dtype, weak_type=dtypes.is_weakly_typed(leaf))


def _normalised_calls(calls: dict, replaced: dict[UOp, UOp]) -> dict:
  """The primitive calls of a trace over the program's normalised nodes (operands as their nodes, or as the Python
  values they were); calls none of whose results are in the program are dropped."""
  out = {}
  for record in {id(record): record for record in calls.values()}.values():
    if not any(node in replaced for node in record.outs): continue
    operands = tuple(replaced.get(x.uop, x.uop) if isinstance(x, Array) else x for x in record.operands)
    normal = record._replace(operands=operands, outs=tuple(replaced.get(node, node) for node in record.outs))
    for node in normal.outs: out[node] = normal
  return out


def format_values(fmt: str, tree: Any, values: list[Any]) -> str:
  """`fmt.format(*args, **kwargs)` for the flattened (args, kwargs) of a debug.print call."""
  args, kwargs = tree_util.tree_unflatten(tree, values)
  return fmt.format(*args, **kwargs)


def block_until_ready(tree: Any) -> Any:
  """Compute every array in the pytree now, in one schedule (tinyjax arrays are lazy; work they share is done
  once), and return the pytree, as `jax.block_until_ready`. Traced values are left alone, as in JAX."""
  if type(tree) is Array:  # one array (not a tracer): no tree to walk
    tree.realize().uop.arg.device.synchronize()
    return tree
  arrays = [leaf for leaf in tree_util.tree_leaves(tree) if isinstance(leaf, Array) and not isinstance(leaf, Tracer)]
  realize_arrays(arrays)
  synchronized: set[int] = set()
  for array in arrays:
    device = array.uop.arg.device
    if id(device) not in synchronized:
      synchronized.add(id(device))
      device.synchronize()
  return tree


class Traced:
  """`jit(f).trace(*args)`: the traced program (`jaxpr`) and `lower()` for those arguments."""

  def __init__(self, jitted: JitWrapped, args: tuple, kwargs: dict):
    static, _, static_kwargs, dynamic_kwargs = jitted._split(args, kwargs)
    self.jaxpr = jitted._trace(args, static, static_kwargs, dynamic_kwargs)
    self._jitted, self._args, self._kwargs = jitted, args, kwargs

  def lower(self) -> Lowered: return self._jitted.lower(*self._args, **self._kwargs)


def make_jaxpr(fun: Callable, static_argnums: int | Sequence[int] = ()) -> Callable[..., Jaxpr]:
  """`make_jaxpr(f)(*args)` returns the UOp program `jit(f)` would compile for these arguments."""
  static = _normalize_argnums(static_argnums)

  @functools.wraps(fun, updated=())
  def traced(*args, **kwargs) -> Jaxpr:
    return trace_to_jaxpr(fun, args, kwargs, tuple(i % len(args) for i in static if -len(args) <= i < len(args)))
  return traced


def eval_shape(fun: Callable, *args: Any, **kwargs: Any) -> Any:
  """The shapes and dtypes `fun(*args, **kwargs)` would return, as a pytree of ShapeDtypeStruct, computed by
  tracing alone (nothing is compiled or run). Arguments may be arrays or ShapeDtypeStructs."""
  jaxpr = trace_to_jaxpr(fun, args, kwargs)
  outs = [ShapeDtypeStruct(node.shape, node.dtype, weak) for node, weak in zip(jaxpr.sink.src, jaxpr.out_weak_types)]
  return tree_util.tree_unflatten(jaxpr.out_tree, outs)


def _normalize_argnums(argnums: int | Sequence[int] | None) -> tuple[int, ...]:
  if argnums is None: return ()
  return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def _references_when_alone() -> int:
  """What `sys.getrefcount` says of an object held only by a list and a local variable, as `_Compiled.donate` holds a
  donated buffer (3 on CPython 3.11: the list, the variable and the call's argument; measured, since interpreters that
  borrow references count fewer)."""
  held = [object()]
  item = held[0]
  return sys.getrefcount(item)


_DONATED_REFERENCES = _references_when_alone()


@dataclass
class _Compiled:
  """A traced program and its compiled schedule (None: no outputs), with what a run needs planned: for each output
  whether its buffer is new on every run (not an input, not an earlier output) and its weak type, and which donated
  argument (by flat index) may give its buffer to which output slot (`aliases`)."""
  jaxpr: Jaxpr
  schedule: realize.CompiledSchedule | None
  device: Any = CPU
  moves: bool = False  # some argument lives on another device than the program's: copied to it on each call
  donated: tuple[int, ...] = ()  # flat indices of the donated arguments
  committed: bool = False  # some argument is committed to its device: so are the results (JAX's rule)
  replicated: Any = None  # ... to a mesh: the sharding of the results the operations did not split (replicated)

  def __post_init__(self):
    self.consts = [runnable(buffer, self.device) for buffer in self.jaxpr.consts]
    self.single_leaf = self.jaxpr.out_tree.num_nodes == 1 and self.jaxpr.out_tree.num_leaves == 1
    self.outputs: list[tuple[bool, bool]] = []
    self.aliases: list[tuple[int, int, UOp]] = []  # (donated argument, output slot, what the argument holds after)
    self.direct = None  # run_schedule for the commonest program, `direct_runner`
    # each output's sharding: the one its operations gave it (trace/sharding_types.py), else, for a program over
    # arguments committed to a mesh, replicated over it (as JAX's compiler places results)
    outs = len(self.jaxpr.out_weak_types)
    self.layouts = tuple(named or self.replicated for named in self.jaxpr.out_shardings or (None,) * outs) \
        if self.jaxpr.out_shardings or self.replicated is not None else ()
    if self.schedule is None: return
    sched, seen = self.schedule.schedule, set()
    for slot, weak in zip(sched.outputs, self.jaxpr.out_weak_types):
      self.outputs.append((slot >= sched.n_inputs and slot not in seen, weak))
      seen.add(slot)
    if self.donated: self._plan_donation()
    if self.single_leaf and self.outputs[0][0] and self.device is CPU and not self.aliases and not self.jaxpr.prints \
        and not self.layouts and not self.committed:
      self.direct = realize.direct_runner(self.schedule, len(self.jaxpr.in_avals), self.consts)

  def _plan_donation(self) -> None:
    """Decide which donated argument gives its buffer to which output, and warn (as JAX) about those none can use.
    Only on the CPU; elsewhere donation is accepted and does nothing."""
    sched, avals = self.schedule.schedule, self.jaxpr.in_avals
    if compute_device(self.device) is not CPU or self.moves: return
    aliases = memory_plan.donation_aliases(sched, self.donated, [aval[:2] for aval in avals])
    self.aliases = [(index, slot, deleted_uop(avals[index][0], avals[index][1])) for index, slot in aliases.items()]
    unusable = [index for index in self.donated if index < sched.n_inputs and index not in aliases]
    if unusable:
      names = ", ".join(f"{'~' if avals[i][2] else ''}{np.dtype(avals[i][1]).name}[{','.join(map(str, avals[i][0]))}]"
                        for i in unusable)
      warnings.warn(f"Some donated buffers were not usable: {names}.", stacklevel=user_stacklevel())

  def donate(self, inputs: list[Buffer], arrays: list[Array]) -> dict[int, Buffer]:
    """Delete the donated arrays of a call and return {output slot: donated buffer} for those whose buffer nothing
    else can see. Raises first if any argument was deleted before."""
    for buffer in inputs:
      if type(buffer) is DeletedBuffer: buffer.numpy()  # raises RuntimeError("Array has been deleted ...")
    for index, _, deleted in self.aliases:
      array = arrays[index]
      array.uop.__dict__.pop("toposort", None)  # (a BUFFER node's cached toposort holds the node: it would live on)
      array.uop = deleted
    reuse = {}
    for index, slot, _ in self.aliases:
      buffer = inputs[index]
      if slot != index and sys.getrefcount(buffer) == _DONATED_REFERENCES and is_exclusive(buffer):
        reuse[slot] = buffer
    return reuse

  def run(self, inputs: list[Buffer], arrays: list[Array] | None = None) -> Any:
    """Run the program on the flattened arguments' buffers (`arrays`: the Arrays holding them, for donation); return
    the outputs as the traced pytree."""
    if self.direct is not None and not open_profiles:
      buffer = self.direct(inputs)
      array = object.__new__(Array)  # (Array(...) without its __init__ call)
      array.uop, array.weak_type = UOp.new_buffer(buffer.dtype, buffer), self.outputs[0][1]
      return array
    jaxpr = self.jaxpr
    if self.schedule is None: return tree_util.tree_unflatten(jaxpr.out_tree, [])
    if self.moves: inputs = [runnable(buffer, self.device) for buffer in inputs]
    reuse = self.donate(inputs, arrays) if self.aliases else None
    buffers = realize.place_outputs(realize.run_schedule(self.schedule, inputs + self.consts, reuse), inputs,
                                    self.device, self.committed)
    for fmt, tree, slots in jaxpr.prints:  # debug.print: the values of this run
      shown = [buffers[value].numpy() if kind == "output" else value for kind, value in slots]
      print(format_values(fmt, tree, shown))
    if self.layouts:  # laid out as the operations computing them say, or replicated over the inputs' mesh
      buffers = [b if layout is None or b.device.platform != "cpu" else shard(b, layout)
                 for b, layout in zip(buffers, self.layouts)] + buffers[len(self.layouts):]
    if self.single_leaf:  # (the common case, without the list and the tree)
      buffer, (fresh, weak) = buffers[0], self.outputs[0]  # (debug.print's values may follow in `buffers`)
      return Array(UOp.new_buffer(buffer.dtype, buffer) if fresh else UOp(Ops.BUFFER, buffer.dtype, (), buffer), weak)
    # (UOp.new_buffer and Array(...) inlined: a training step's state of hundreds of leaves, 0.6 -> 0.45 us each)
    new, ref, outputs = object.__new__, weakref.ref, []
    for b, (fresh, weak) in zip(buffers, self.outputs):
      if fresh:
        node = new(UOp)
        node.op, node.dtype, node.src, node.arg = Ops.BUFFER, b.dtype, (), b
        b._node = ref(node)
      else:
        node = UOp(Ops.BUFFER, b.dtype, (), b)
      array = new(Array)
      array.uop, array.weak_type, array._named = node, weak, None
      outputs.append(array)
    return tree_util.tree_unflatten(jaxpr.out_tree, outputs)


def _fast_signature(leaves: list[Any]) -> tuple[tuple, list[Buffer], list[Array]] | None:
  """The hot path's signature of flattened arguments (shape, dtype, weak type of each leaf), their buffers and the
  arrays holding them; None unless every leaf is an Array or a Python scalar (lazy arrays are realised here, scalars
  put in host buffers as `_leaf_to_array` does: a training step's `step(i, state, batch)`)."""
  signature, buffers, arrays = [], [], leaves
  for k, leaf in enumerate(leaves):
    kind = type(leaf)
    if kind is not Array:
      if kind not in _SCALAR_TYPES: return None
      if arrays is leaves: arrays = list(leaves)
      leaf = arrays[k] = _scalar_argument(leaf)
    uop = leaf.uop
    if uop.op is not Ops.BUFFER:  # the lazy leaves are computed together (see JitWrapped._lookup)
      realize_arrays([other for other in arrays if type(other) is Array])
      uop = leaf.uop
    buffer = uop.arg
    signature += (buffer.shape, buffer.dtype, leaf.weak_type, buffer.device, buffer.committed,
                  buffer.sharding if type(buffer) is ShardedBuffer else None)
    buffers.append(buffer)
  return tuple(signature), buffers, arrays


_SCALAR_TYPES = frozenset({bool, int, float, complex})


def _scalar_argument(leaf: bool | int | float | complex) -> Array:
  """A Python scalar argument as `_leaf_to_array` makes it, its buffer made once per value, dtype and default device
  (`random.uniform(key, shape)` passes its bounds 0.0 and 1.0 to a jitted program: two host buffers per call were
  10 us of its 23). The buffer is never written: donating it copies, as it is referenced here."""
  dtype = dtypes.python_scalar_dtype(leaf)
  key = (type(leaf), repr(leaf), dtype, default_device())  # (repr: -0.0 is not 0.0, NaN is itself)
  made = _SCALAR_ARGUMENTS.get(key)
  if made is None:
    if len(_SCALAR_ARGUMENTS) >= _SCALAR_ARGUMENTS_MAX: _SCALAR_ARGUMENTS.clear()
    array = _leaf_to_array(leaf)
    made = _SCALAR_ARGUMENTS[key] = (array.uop.arg, array.weak_type)
  buffer, weak = made
  return Array(UOp(Ops.BUFFER, buffer.dtype, (), buffer), weak)


_SCALAR_ARGUMENTS: dict[tuple, tuple[Buffer, bool]] = {}
_SCALAR_ARGUMENTS_MAX = 4096


@dataclass(frozen=True)
class CompiledMemoryStats:
  """The memory a compiled program takes per call, in bytes, with the fields of JAX's `CompiledMemoryStats`:
  arguments (the flattened arguments and the arrays the function closed over), outputs, `alias` (outputs written into
  donated arguments' buffers, counted in both), `temp` (the arena of intermediates, lower/memory.py) and the kernels'
  object code. `peak_memory_in_bytes` = arguments + outputs - alias + temp: what a call holds at once, since the arena
  and the outputs are allocated for the whole run (XLA's figure comes from its heap simulation and can be lower).
  The host_* fields are 0, as JAX's on a CPU."""
  generated_code_size_in_bytes: int
  argument_size_in_bytes: int
  output_size_in_bytes: int
  alias_size_in_bytes: int
  temp_size_in_bytes: int
  peak_memory_in_bytes: int
  host_generated_code_size_in_bytes: int = 0
  host_argument_size_in_bytes: int = 0
  host_output_size_in_bytes: int = 0
  host_alias_size_in_bytes: int = 0
  host_temp_size_in_bytes: int = 0


def _nbytes(shape: Sequence[int], dtype: Any) -> int:
  return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


class Lowered:
  """What `jit(f).lower(*args)` returns: the traced program and its kernels; `as_text()` prints them,
  `memory_analysis()` sizes their memory. `compile()` returns it (it is compiled already)."""

  def __init__(self, compiled: _Compiled):
    self._compiled = compiled

  def as_text(self) -> str:
    parts = [f"# jaxpr\n{self._compiled.jaxpr}"]
    if self._compiled.schedule is not None:
      sched = self._compiled.schedule
      kernels = lowering.kernels_of(sched.schedule.kernels)
      loops = len(kernels) - len(sched.schedule.kernels) if len(kernels) > len(sched.schedule.kernels) else 0
      parts.append(f"# {len(kernels)} kernels" + (" (some inside loops)" if loops else ""))
      # (a contraction's first tier runs until its own loops are compiled: the text is of the kernels' own code)
      if any(getattr(program, "watchers", None) is not None for program in sched.programs):
        cpu_device.wait_for_upgrades(sched.programs)
      for kernel, program in zip(kernels, sched.programs):
        parts.append(f"# kernel {kernel.name} buffers={list(kernel.slots)}\n{program.src}")
    return "\n".join(parts)

  def compile(self) -> Lowered: return self

  def memory_analysis(self) -> CompiledMemoryStats:
    """The bytes a call of this program takes (arguments, outputs, donated and reused, intermediates, code)."""
    compiled = self._compiled
    jaxpr = compiled.jaxpr
    arguments = sum(_nbytes(*aval[:2]) for aval in jaxpr.in_avals) + sum(buffer.nbytes for buffer in compiled.consts)
    outputs = sum(_nbytes(out.shape, out.dtype) for out in jaxpr.sink.src)
    alias = sum(_nbytes(*jaxpr.in_avals[index][:2]) for index, _, _ in compiled.aliases)
    temp = code = 0
    if compiled.schedule is not None:
      temp = compiled.schedule.plan.arena_bytes
      code = sum(getattr(program, "object_bytes", 0) for program in compiled.schedule.programs)
    return CompiledMemoryStats(code, arguments, outputs, alias, temp, arguments + outputs - alias + temp)


# The compiled programs of each function, per jit options, held as long as the function lives: `jit(f)` made twice
# (e.g. `jit(f)(x)` in a loop) traces f once, as JAX. A function that cannot be weakly referenced gets caches of its
# own per wrapper.
_caches_by_function: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _function_caches(fun: Callable, options: tuple) -> tuple[dict, dict]:
  """(signature -> program, hot-path signature -> program) shared by every jit of `fun` with these options."""
  try:
    per_options = _caches_by_function.setdefault(fun, {})
  except TypeError:
    return {}, {}
  return per_options.setdefault(options, ({}, {}))


class JitWrapped:
  """A jitted function: call it like the original. Retraces for a new signature (tree structure, shapes, dtypes,
  weak types, static argument values) and never otherwise; wrappers of one function with the same options share
  their programs."""

  def __init__(self, fun: Callable, static_argnums: tuple[int, ...], static_argnames: tuple[str, ...],
               donate_argnums: tuple[int, ...]):
    self.fun, self.static_argnums, self.static_argnames = fun, static_argnums, static_argnames
    self.donate_argnums = donate_argnums
    self._fast_calls = 0  # calls answered by the hot path (tests check it is taken)
    self._static_positions: dict[int, frozenset[int]] = {}  # argument count -> the static arguments' positions
    functools.update_wrapper(self, fun, updated=())  # the name and docstring, not another wrapper's attributes
    try: parameters = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError): parameters = []
    # static arguments by position and by name, whichever way the call passes them
    self.static_argnums = tuple(sorted(set(static_argnums) | {parameters.index(n) for n in static_argnames
                                                                if n in parameters}))
    self.static_argnames = tuple(sorted(set(static_argnames) | {parameters[i] for i in static_argnums
                                                                  if -len(parameters) <= i < len(parameters)}))
    if set(donate_argnums) & set(self.static_argnums) or {parameters[i] for i in donate_argnums
                                                          if -len(parameters) <= i < len(parameters)} & set(
                                                            self.static_argnames):
      raise ValueError(f"static_argnums and donate_argnums cannot intersect: static_argnums={self.static_argnums}, "
                       f"donate_argnums={donate_argnums}")
    # (signature -> program) and the hot path's (treedef of args, _fast_signature) -> the same programs
    self._cache, self._fast_cache = _function_caches(fun, (self.static_argnums, self.static_argnames,
                                                           tuple(sorted(set(donate_argnums)))))

  def __get__(self, instance: Any, owner: type | None = None):
    return self if instance is None else functools.partial(self, instance)

  def _split(self, args: tuple, kwargs: dict) -> tuple[tuple[int, ...], tuple, dict, dict]:
    static = tuple(sorted({i % len(args) for i in self.static_argnums if -len(args) <= i < len(args)}))
    static_kwargs = {k: v for k, v in kwargs.items() if k in self.static_argnames}
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
    static_values = tuple(args[i] for i in static) + tuple(sorted(static_kwargs.items()))
    try: hash(static_values)
    except TypeError as error:
      raise ValueError(f"Non-hashable static arguments are not supported: {error}. Static arguments (static_argnums="
                       f"{self.static_argnums}, static_argnames={self.static_argnames}) must be hashable, e.g. a "
                       "tuple instead of a list; pass arrays as non-static arguments") from None
    return static, static_values, static_kwargs, dynamic_kwargs

  def _lookup(self, args: tuple, kwargs: dict) -> tuple[_Compiled, list[Any]]:
    static, static_values, static_kwargs, dynamic_kwargs = self._split(args, kwargs)
    leaves, in_tree = tree_util.tree_flatten(([args[i] for i in range(len(args)) if i not in static], dynamic_kwargs))
    # lazy arguments are computed together: they often share work (stax's parameters all come from one chain of
    # random.split keys, which computed per leaf is redone for each: ResNet-50's first step took 48 s on this)
    realize_arrays([leaf for leaf in leaves if isinstance(leaf, Array)])
    placements = tuple(_leaf_placement(leaf) for leaf in leaves)
    key = (in_tree, tuple(_leaf_signature(leaf) for leaf in leaves), static, static_values, placements,
           _mesh_stack[-1] if _mesh_stack else None)  # (shard_map without mesh= takes set_mesh's: JAX keys on it too)
    compiled = self._cache.get(key)
    if compiled is None:
      with gc_paused():
        jaxpr = self._trace(args, static, static_kwargs, dynamic_kwargs)
        device, committed, replicated = place([*placements, *(placement_of(buffer) for buffer in jaxpr.consts)])
        moves = any(not same_memory(placement[0], device) for placement in placements)
        compiled = _Compiled(jaxpr, realize.get_schedule(jaxpr.sink, device) if jaxpr.sink.src else None, device, moves,
                             self._donated_leaves(args, static), committed, replicated)
      self._cache[key] = compiled
    return compiled, leaves

  def _trace(self, args: tuple, static: tuple[int, ...], static_kwargs: dict, dynamic_kwargs: dict) -> Jaxpr:
    """The program of the function for these arguments (`_split`'s parts)."""
    fun = functools.partial(self.fun, **static_kwargs) if static_kwargs else self.fun
    if static_kwargs: functools.update_wrapper(fun, self.fun)
    return trace_to_jaxpr(fun, args, dynamic_kwargs, static)

  def _donated_leaves(self, args: tuple, static: tuple[int, ...]) -> tuple[int, ...]:
    """The flat indices of the leaves of the donated positional arguments (every leaf of a donated pytree)."""
    if not self.donate_argnums: return ()
    donated = {i % len(args) for i in self.donate_argnums if -len(args) <= i < len(args)}
    indices, start = [], 0
    for position in (i for i in range(len(args)) if i not in static):
      count = len(tree_util.tree_leaves(args[position]))
      if position in donated: indices += range(start, start + count)
      start += count
    return tuple(indices)

  def __call__(self, *args, **kwargs) -> Any:
    if type(current_trace.get()) is not EvalTrace:  # inside another trace: inline (it traces into the outer program)
      if type(current_trace.get()) is StagingTrace: return self._staged_call(args, kwargs)
      return self.fun(*args, **kwargs)
    fast_key = None
    if not kwargs:
      dynamic, static_values = args, ()
      if self.static_argnums:  # (static arguments by position: their values join the key)
        if (static := self._static_positions.get(len(args))) is None:
          static = self._static_positions[len(args)] = frozenset(
            i % len(args) for i in self.static_argnums if -len(args) <= i < len(args))
        dynamic = tuple(arg for i, arg in enumerate(args) if i not in static)
        static_values = (len(args), *(args[i] for i in sorted(static)))
      for arg in dynamic:  # a flat call (every argument an Array) has no tree to walk (optree's flatten: ~0.5 us)
        if type(arg) is not Array:
          leaves, in_tree = tree_util.tree_flatten(dynamic)
          break
      else: leaves, in_tree = dynamic, len(dynamic)  # (its key: the count; hashing a tree structure takes 0.15 us)
      if (fast := _fast_signature(leaves)) is not None:
        signature, inputs, arrays = fast
        fast_key = (in_tree, signature, static_values, _mesh_stack[-1] if _mesh_stack else None)  # (mesh: _lookup)
        try: compiled = self._fast_cache.get(fast_key)
        except TypeError: compiled = fast_key = None  # (an unhashable static value: `_lookup` says so)
        if compiled is not None and not debug_nans[0]:
          self._fast_calls += 1
          return compiled.run(inputs, arrays)
        fast = inputs = arrays = None  # (the list of the argument buffers would count as a reference to a donated one)
    compiled, leaves = self._lookup(args, kwargs)
    if fast_key is not None: self._fast_cache[fast_key] = compiled
    arrays = [_leaf_to_array(leaf).realize() for leaf in leaves]
    result = compiled.run([array.uop.arg for array in arrays], arrays)
    if debug_nans[0]: self._check_nans(result, args, kwargs)
    return result

  def _staged_call(self, args: tuple, kwargs: dict) -> Any:
    """A call inside a jit's or make_jaxpr's trace: inlined into that program, and recorded as one `jit` equation
    over the array arguments (as JAX prints a nested jit: `jit[name=inner jaxpr={...}] a b`). Calls with static
    arguments, non-array arguments or results, or results that are arguments print inline, as they trace."""
    trace = current_trace.get()
    out = self.fun(*args, **kwargs)
    if kwargs or self.static_argnums: return out
    in_leaves, out_leaves = tree_util.tree_leaves(args), tree_util.tree_leaves(out)
    if not out_leaves or not all(isinstance(x, Array) for x in in_leaves) or \
        not all(isinstance(x, Tracer) and getattr(x, "trace", None) is trace for x in out_leaves): return out
    operand_nodes = {x.uop for x in in_leaves}
    if any(x.uop in operand_nodes for x in out_leaves) or _closes_over_tracers(self.fun): return out
    avals = [ShapeDtypeStruct(x.shape, x.dtype, x.weak_type) for x in in_leaves]
    inner = _InnerJaxpr(self.fun, tree_util.tree_unflatten(tree_util.tree_structure(args), avals))
    record = PrimitiveCallRecord(_JIT_CALL, {"name": getattr(self.fun, "__name__", "fun"), "jaxpr": inner},
                                 tuple(in_leaves), tuple(x.uop for x in out_leaves))
    for leaf in out_leaves: trace.calls[leaf.uop] = record  # (over the calls recorded inside it)
    return out

  def _check_nans(self, result: Any, args: tuple, kwargs: dict) -> None:
    """jax_debug_nans: a NaN in the outputs re-runs the function without jit, op by op, to name the operation that
    made it (as JAX does); if that finds none (NaN came in), the error names the jitted function."""
    try:
      check_nans(f"jit({getattr(self.fun, '__name__', 'fun')})", tree_util.tree_leaves(result))
    except FloatingPointError as error:
      self.fun(*args, **kwargs)
      raise error

  def lower(self, *args, **kwargs) -> Lowered:
    """Trace and compile for these arguments without running; `.as_text()` prints the program and kernels."""
    return Lowered(self._lookup(args, kwargs)[0])

  def trace(self, *args, **kwargs) -> Traced:
    """Trace for these arguments (JAX's AOT `trace`): `.jaxpr` is the program, `.lower()` compiles it."""
    return Traced(self, args, kwargs)

  def _cache_size(self) -> int: return len(self._cache)


def _closes_over_tracers(fun: Callable) -> bool:
  """Whether `fun`'s closure holds traced values (its program, traced again on its own, could not read them)."""
  cells = getattr(fun, "__closure__", None) or ()
  for cell in cells:
    try: contents = cell.cell_contents
    except ValueError: continue  # (an empty cell)
    if any(isinstance(leaf, Tracer) for leaf in tree_util.tree_leaves(contents)): return True
  return False


class _InnerJaxpr:
  """A nested jit's program as its `jit` equation prints it: traced again over the arguments' avals when printed (the
  outer program holds the inner one's Ops inline)."""

  def __init__(self, fun: Callable, args: tuple):
    self.fun, self.args = fun, args

  def __repr__(self) -> str:
    try: text = str(trace_to_jaxpr(self.fun, self.args, {}))
    except Exception as error:  # (a function whose second trace fails: printing the outer program must not)
      return f"<not shown: tracing it again raised {type(error).__name__}>"
    return text.replace("\n", "\n      ")


_JIT_CALL = Primitive("jit", lambda *args, **params: None)  # (names the records of nested jit calls; never bound)


class ShardedJitWrapped(JitWrapped):
  """A jitted function with `in_shardings` / `out_shardings`: its arguments are placed as in_shardings say (a pytree
  prefix of the positional arguments; None leaves an argument as it is) and its outputs as out_shardings say, with
  `device_put` (on the CPU devices, which share the host's memory, that copies nothing). The program itself computes
  on whole arrays; only `shard_map` computes per shard."""

  def __init__(self, fun: Callable, static_argnums: tuple[int, ...], static_argnames: tuple[str, ...],
               donate_argnums: tuple[int, ...], in_shardings: Any, out_shardings: Any):
    super().__init__(fun, static_argnums, static_argnames, donate_argnums)
    self.in_shardings, self.out_shardings = in_shardings, out_shardings

  def __call__(self, *args, **kwargs) -> Any:
    from tinyjax.placement import device_put
    if type(current_trace.get()) is not EvalTrace: return self.fun(*args, **kwargs)
    if self.in_shardings is not None:
      shardings = self.in_shardings if isinstance(self.in_shardings, (tuple, list)) else \
          (self.in_shardings,) * len(args)
      if len(shardings) != len(args):
        raise ValueError(f"jit in_shardings has {len(shardings)} entries for {len(args)} positional arguments")
      args = tuple(arg if i in self.static_argnums or sharding is None else device_put(arg, sharding)
                   for i, (arg, sharding) in enumerate(zip(args, shardings)))
    out = super().__call__(*args, **kwargs)
    return out if self.out_shardings is None else device_put(out, self.out_shardings)


def jit(fun: Callable | None = None, *, static_argnums: int | Sequence[int] | None = None,
        static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None, in_shardings: Any = None, out_shardings: Any = None) -> Any:
  """Compile `fun` with tinyjax: trace once per input signature into a UOp program, fuse it into kernels, compile
  them, and replay them on later calls. Usable as `jit(f)`, `@jit` and `@jit(static_argnums=...)`.
  `in_shardings` / `out_shardings` place the arguments and outputs (see ShardedJitWrapped)."""
  if fun is None:
    return lambda f: jit(f, static_argnums=static_argnums, static_argnames=static_argnames,
                         donate_argnums=donate_argnums, in_shardings=in_shardings, out_shardings=out_shardings)
  check_callable(fun)
  names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames or ())
  if in_shardings is not None or out_shardings is not None:
    return ShardedJitWrapped(fun, _normalize_argnums(static_argnums), names, _normalize_argnums(donate_argnums),
                             in_shardings, out_shardings)
  return JitWrapped(fun, _normalize_argnums(static_argnums), names, _normalize_argnums(donate_argnums))


def jitted_eagerly(fn: Callable) -> Callable:
  """`fn(a, ...)` whose eager call on an array runs as a jitted program, its other arguments static (compiled once per
  shape and arguments), as JAX jits its library functions: for functions whose impl holds host constants (an FFT's
  DFT matrices, an SVD's tolerance), which a staged eager node can't (lax/_base.py `staged`). Lists among the other
  arguments become tuples. A transformation's trace, a first argument other than an Array, or an unhashable
  argument runs the function itself."""
  parameters = list(inspect.signature(fn).parameters.values())[1:]
  names = [p.name for p in parameters]

  def by_name(a: Any, *static: Any) -> Any:  # (keyword-only parameters too)
    return fn(a, **dict(zip(names, static)))
  by_name.__name__ = by_name.__qualname__ = fn.__name__
  jitted = jit(by_name, static_argnums=tuple(range(1, len(names) + 1)))

  @functools.wraps(fn)
  def call(a: Any, *args: Any, **kwargs: Any) -> Any:
    if type(a) is not Array or type(current_trace.get()) is not EvalTrace or len(args) > len(parameters):
      return fn(a, *args, **kwargs)
    given = dict(zip(names, args))
    if set(given) & set(kwargs) or not set(kwargs) <= set(names): return fn(a, *args, **kwargs)  # (its TypeError)
    given.update(kwargs)
    static = [given.get(p.name, p.default) for p in parameters]
    static = [tuple(value) if type(value) is list else value for value in static]
    try: hash(tuple(static))
    except TypeError: return fn(a, *args, **kwargs)
    return jitted(a, *static)
  return call
