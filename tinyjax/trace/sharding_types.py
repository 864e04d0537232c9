"""Shardings carried by values, as JAX's sharding propagation: an array placed over a mesh (`device_put(x,
NamedSharding(mesh, spec))`) passes its layout on to what is computed from it, eagerly and under `jit`, by a rule per
operation: an elementwise result is split as its operands are (a dimension split differently by two of them is not
split), a broadcast dimension is not split, a permutation permutes the spec, a reduced dimension is no longer split,
a reshape keeps a split where the dimension survives as the major part of a merge or a split, slices and pads keep
the dimensions they leave whole. So `jnp.sin(x).T` of an `f32[8@X,4@Y]` is an `f32[4@Y,8@X]`, and a jitted
function's outputs come back laid out as the rules say (`jit(out_shardings=)` overrides them).

The rules here never fail: operations that tinyjax builds from these Ops (a matmul from a broadcast product and a
sum, say) meet layouts JAX's own rules would reject. Where JAX's API raises a `ShardingTypeError` for a layout it
cannot decide (a binary operation that would split two dimensions over one mesh axis, a matmul contracting a split
dimension, a reshape that splits the minor part of a split dimension), the numpy and lax functions check it before
building their Ops (`check_binary`, `dot_sharding`, `reshape_spec`), for meshes whose axes are Explicit (JAX's
`make_mesh` default).

In one process the devices of a mesh share the host's memory, so a sharding is a label on the array: computing
copies nothing, and each device's shard is a block of the one buffer (`Array.addressable_shards`)."""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Sequence

from tinyjax.array import Array
from tinyjax.devices.buffer import ShardedBuffer
from tinyjax.uop import ELEMENTWISE, Ops

Dims = tuple  # per dimension, the mesh axis names that split it (empty: not split)

_enabled = [False]  # set when the first array is placed with a NamedSharding: until then nothing is checked
_checking = [True]  # JAX's ShardingTypeErrors are raised (not inside `unchecked`)


def enable() -> None: _enabled[0] = True


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
  """No ShardingTypeErrors inside: an operation given its result's sharding (`out_sharding=`) is computed as the
  rules allow and then laid out as asked."""
  before, _checking[0] = _checking[0], False
  try: yield
  finally: _checking[0] = before


class ShardingTypeError(Exception):
  """An operation whose result's sharding JAX cannot decide by its rules (JAX's `ShardingTypeError`): pass the
  result's sharding (`out_sharding=`) or reshard an operand first."""


def named_of(x: Any) -> Any:
  """The NamedSharding `x` carries (a placed array's, or one computed by the rules), or None. (On every operation
  once shardings exist: the common cases first.)"""
  named = getattr(x, "_named", None)
  if named is not None: return named
  if type(x) is Array:
    uop = x.uop
    return uop.arg.sharding if uop.op is Ops.BUFFER and type(uop.arg) is ShardedBuffer else None
  primal = getattr(x, "primal", None)  # (a JVP tracer is laid out as its primal)
  return None if primal is None else named_of(primal)


def dims_of(named: Any, ndim: int) -> Dims:
  return tuple(named.spec.axes_of(dim) for dim in range(ndim))


def spec_of(dims: Dims) -> Any:
  from tinyjax.sharding import PartitionSpec
  return PartitionSpec(*[None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in dims])


def _axis_types(mesh: Any) -> dict:
  """{axis name: its type} for `mesh`, as the current mesh says when it is the same devices (auto_axes /
  explicit_axes switch the types of the current mesh's axes)."""
  from tinyjax.sharding import get_mesh
  current = get_mesh()
  if current is not None and current == mesh: mesh = current
  return {name: str(getattr(kind, "name", kind)) for name, kind in zip(mesh.axis_names, mesh.axis_types)}


def is_explicit(mesh: Any) -> bool: return "Explicit" in _axis_types(mesh).values()


def type_sharding(named: Any, ndim: int) -> Any:
  """The sharding `typeof` shows: over the abstract mesh, only the Explicit axes (JAX hides the Auto ones, the
  compiler's); with none, the current abstract mesh with nothing split."""
  from tinyjax.sharding import AbstractMesh, NamedSharding, get_abstract_mesh
  if named is None: return NamedSharding(get_abstract_mesh(), spec_of(((),) * ndim))
  types = _axis_types(named.mesh)
  dims = tuple(tuple(name for name in axes if types.get(name) == "Explicit") for axes in dims_of(named, ndim))
  base = named.mesh.abstract_mesh
  abstract = AbstractMesh(base.axis_sizes, base.axis_names, tuple(types.values()), platform=base.platform)
  return NamedSharding(abstract, spec_of(dims))


def _split(mesh: Any, axes: tuple) -> int: return math.prod(mesh.shape[name] for name in axes)


def _fit(mesh: Any, dims: Dims, shape: Sequence[int]) -> Dims:
  """`dims` with each mesh axis splitting one dimension at most (the first) and only dimensions it divides."""
  seen: set = set()
  out = []
  for axes, size in zip(dims, shape):
    if any(name in seen for name in axes) or size % _split(mesh, axes): axes = ()
    seen.update(axes)
    out.append(axes)
  return tuple(out)


# ---- the rules: rule(operand dims, operand shapes, arg, out shape) -> out dims

def _elementwise(dims: list[Dims], shapes: list, arg: Any, shape: tuple) -> Dims:
  out = []
  for per_operand in zip(*dims):
    split = {axes for axes in per_operand if axes}
    out.append(split.pop() if len(split) == 1 else ())
  return tuple(out)


def _expand(dims: list[Dims], shapes: list, arg: Any, shape: tuple) -> Dims:
  return tuple(axes if before == after else () for axes, before, after in zip(dims[0], shapes[0], shape))


def _permute(dims: list[Dims], shapes: list, arg: Any, shape: tuple) -> Dims:
  return tuple(dims[0][axis] for axis in arg)


def _reduce(dims: list[Dims], shapes: list, arg: Any, shape: tuple) -> Dims:
  return tuple(() if dim in arg[1] else axes for dim, axes in enumerate(dims[0]))


def _shrink(dims: list[Dims], shapes: list, arg: Any, shape: tuple) -> Dims:
  return tuple(axes if bound == (0, size) else () for axes, bound, size in zip(dims[0], arg, shapes[0]))


def _keep(dims: list[Dims], shapes: list, arg: Any, shape: tuple) -> Dims: return dims[0]


def reshape_dims(dims: Dims, before: Sequence[int], after: Sequence[int], sizes: dict) -> Dims | None:
  """The split of each dimension of a reshape from `before` to `after` (`sizes`: the mesh axes' sizes), or None where
  JAX's rule has none: dimensions are grouped into the fewest runs of equal products; in a run of one dimension into
  several (a split) the dimension's axes go to the first part if they divide it, in several into one (a merge) the
  axes of its leading split dimensions (then unsplit ones only) are the merged dimension's; a run split otherwise
  has no rule. Dimensions of size 1 are never split."""
  out: list[tuple] = [()] * len(after)
  i = j = 0
  while i < len(before) or j < len(after):
    if i < len(before) and before[i] == 1:
      if dims[i]: return None
      i += 1
      continue
    if j < len(after) and after[j] == 1:
      j += 1
      continue
    start_i, start_j, left, right = i, j, before[i], after[j]
    i, j = i + 1, j + 1
    while left != right:
      if left < right:
        left *= before[i]
        i += 1
      else:
        right *= after[j]
        j += 1
    run = [axes for axes in dims[start_i:i]]
    if not any(run): continue
    if i - start_i == 1 and j - start_j == 1: out[start_j] = run[0]
    elif i - start_i == 1:  # a split: the major part keeps the axes
      if after[start_j] % math.prod(sizes[name] for name in run[0]): return None
      out[start_j] = run[0]
    elif j - start_j == 1:  # a merge: split dimensions first, whole ones after
      first_whole = next((k for k, axes in enumerate(run) if not axes), len(run))
      if any(run[first_whole:]): return None
      out[start_j] = tuple(name for axes in run for name in axes)
    else:
      return None
  return tuple(out)


def _reshape(dims: list[Dims], shapes: list, arg: Any, shape: tuple, sizes: dict) -> Dims:
  out = reshape_dims(dims[0], shapes[0], shape, sizes)
  return out if out is not None else ((),) * len(shape)


_RULES: dict[Ops, Callable] = {op: _elementwise for op in ELEMENTWISE}
_RULES.update({Ops.EXPAND: _expand, Ops.PERMUTE: _permute, Ops.REDUCE_AXIS: _reduce, Ops.SHRINK: _shrink,
               Ops.PAD: _keep, Ops.FLIP: _keep, Ops.CONTIGUOUS: _keep})


def _any_sharded(operands: Sequence[Any]) -> bool:
  """Whether some operand carries a sharding (`named_of`, its common cases inline)."""
  for x in operands:
    named = getattr(x, "_named", None)
    if named is None and type(x) is Array:
      uop = x.uop
      if uop.op is not Ops.BUFFER or type(uop.arg) is not ShardedBuffer: continue
    elif named is None and named_of(x) is None: continue
    return True
  return False


def propagate(op: Ops, operands: Sequence[Any], arg: Any, out: Any) -> None:
  """Give `out`, the result of `op` on `operands`, the sharding the rules say, when an operand carries one. (Called
  on every operation once shardings exist: the unsharded case returns after one look at each operand.)"""
  if not _any_sharded(operands) or not isinstance(out, Array) or out.shape is None: return
  shardings = [named_of(x) for x in operands]
  mesh = next(named.mesh for named in shardings if named is not None)
  shapes = [tuple(getattr(x, "shape", ())) for x in operands]
  dims = [dims_of(named, len(shape)) if named is not None and named.mesh == mesh else ((),) * len(shape)
          for shape, named in zip(shapes, shardings)]
  if op is Ops.RESHAPE: out_dims = _reshape(dims, shapes, arg, tuple(out.shape), dict(mesh.shape))
  elif (rule := _RULES.get(op)) is not None: out_dims = rule(dims, shapes, arg, tuple(out.shape))
  else: out_dims = ((),) * len(out.shape)  # (gathers, scatters, loops: replicated over the mesh)
  set_sharding(out, mesh, out_dims)


def propagate_primitive(operands: Sequence[Any], out: Any) -> None:
  """A named primitive's result (when it was not built from Ops here, as under a loop body's staging): laid out as
  its operands of the same shape are (an elementwise primitive), else replicated over their mesh."""
  if _any_sharded(operands) and isinstance(out, Array) and getattr(out, "_named", None) is None:
    same = [x for x in operands if isinstance(x, Array) and tuple(x.shape) == tuple(out.shape)]
    if same: propagate(Ops.ADD if len(same) > 1 else Ops.CONTIGUOUS, same, None, out)


def set_sharding(out: Array, mesh: Any, dims: Dims) -> None:
  """Label `out` as laid out over `mesh` as `dims` say (fitted: each axis once, only where it divides)."""
  from tinyjax.sharding import NamedSharding
  out._named = compiled(NamedSharding(mesh, spec_of(_fit(mesh, dims, out.shape))))


def compiled(named: Any) -> Any:
  """A sharding as a compiled program's result carries it: over Auto axes without the trailing unsplit entries, as
  JAX's compiler reports (`P('X',)`); over Explicit ones, its type's (one entry per dimension)."""
  if named is None or is_explicit(named.mesh) or not named.spec or named.spec[-1] is not None: return named
  from tinyjax.sharding import NamedSharding, PartitionSpec
  entries = list(named.spec)
  while entries and entries[-1] is None: entries.pop()
  return NamedSharding(named.mesh, PartitionSpec(*entries))


def relabelled(x: Array, sharding: Any) -> Array:
  """A traced value equal to `x`, carrying `sharding` (a sharding constraint inside jit or grad)."""
  from tinyjax.trace.core import bind
  out = bind(Ops.RESHAPE, x, arg=tuple(x.shape), weak_type=x.weak_type)
  out._named = sharding
  return out


# ---- JAX's checks, made where an API function knows the operation the user asked for

def check_binary(name: str, x: Array, y: Array) -> None:
  """ShardingTypeError where a binary operation on two broadcast operands of explicit layouts would split one
  dimension two ways or two dimensions over one mesh axis (JAX's rule: zipped dimensions split alike or not at all)."""
  if not (_enabled[0] and _checking[0]): return
  first, second = named_of(x), named_of(y)
  if first is None or second is None or first.mesh != second.mesh or not is_explicit(first.mesh): return
  a, b = dims_of(first, len(x.shape)), dims_of(second, len(y.shape))
  op = _LAX_NAMES.get(name, name)
  out = []
  for left, right in zip(a, b):
    if left and right and left != right:
      raise ShardingTypeError(f"{op} got incompatible shardings for broadcasting: {_entries(a)}, {_entries(b)}.")
    out.append(left or right)
  names = [axis for axes in out for axis in axes]
  if len(set(names)) != len(names):
    raise ShardingTypeError(f"{op} operation with inputs: {_short_type(x.dtype, x.shape, a)}, "
                            f"{_short_type(y.dtype, y.shape, b)} produces an illegally sharded result: "
                            f"{_short_type(x.dtype, x.shape, tuple(out))}")


# numpy's names of binary functions -> the lax primitives JAX's errors name
_LAX_NAMES = {"multiply": "mul", "subtract": "sub", "maximum": "max", "minimum": "min", "divide": "div",
              "true_divide": "div", "power": "pow", "floor_divide": "div", "remainder": "rem", "equal": "eq",
              "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt", "greater_equal": "ge",
              "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "logical_and": "and", "logical_or": "or",
              "logical_xor": "xor", "arctan2": "atan2"}


def _entries(dims: Dims) -> tuple:
  return tuple(None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in dims)


def reshape_spec(x: Array, shape: Sequence[int]) -> None:
  """ShardingTypeError where JAX's reshape rule (`reshape_dims`) has no layout for `x` reshaped to `shape`."""
  if not (_enabled[0] and _checking[0]): return
  named = named_of(x)
  if named is None or not is_explicit(named.mesh): return
  dims = dims_of(named, len(x.shape))
  if reshape_dims(dims, tuple(x.shape), tuple(shape), dict(named.mesh.shape)) is None:
    raise ShardingTypeError(f"This reshape is not supported. Please specify the sharding of the output via the "
                            f"`out_sharding` argument of jax.lax.reshape. Got operand type: {_type_str(x, dims)}, "
                            f"new sizes: {tuple(shape)}")


def dot_sharding(lhs: Array, rhs: Array, contracting: tuple, batch: tuple, errors: bool = False) -> Any:
  """The layout (mesh, dims) of `dot_general(lhs, rhs)` by JAX's rule: batch dimensions as the operands split them,
  then lhs's free dimensions, then rhs's, as each splits them; None when neither operand carries a sharding. With
  `errors`, on an Explicit mesh: ShardingTypeError where a contracting dimension is split in both operands
  (ambiguous: JAX asks for out_sharding) or the result would split two dimensions over one mesh axis (without,
  such a result is split where it can be). `contracting` / `batch`: ((lhs dims), (rhs dims)) each."""
  first, second = named_of(lhs), named_of(rhs)
  named = first or second
  if named is None: return None
  mesh = named.mesh
  a = dims_of(first, len(lhs.shape)) if first is not None and first.mesh == mesh else ((),) * len(lhs.shape)
  b = dims_of(second, len(rhs.shape)) if second is not None and second.mesh == mesh else ((),) * len(rhs.shape)
  explicit = errors and _checking[0] and is_explicit(mesh)
  (lc, rc), (lb, rb) = contracting, batch
  if explicit and any(a[i] and b[j] for i, j in zip(lc, rc)):
    raise ShardingTypeError(
      "Contracting dimensions are sharded and it is ambiguous how the output should be sharded. Please specify the "
      f"output sharding via the `out_sharding` parameter. Got lhs_contracting_spec="
      f"{tuple(name for i in lc for name in a[i])} and rhs_contracting_spec={tuple(name for j in rc for name in b[j])}")
  out: list[tuple] = []
  for i, j in zip(lb, rb):
    if explicit and a[i] and b[j] and a[i] != b[j]:
      raise ShardingTypeError(f"dot_general requires lhs batch dimensions and rhs batch dimensions to have the same "
                              f"sharding, got {a[i]} and {b[j]}")
    out.append(a[i] or b[j])
  out += [a[i] for i in range(len(lhs.shape)) if i not in lc and i not in lb]
  out += [b[j] for j in range(len(rhs.shape)) if j not in rc and j not in rb]
  names = [name for axes in out for name in axes]
  if explicit and len(set(names)) != len(names):
    raise ShardingTypeError(f"dot_general's result would split two dimensions over one mesh axis: {spec_of(tuple(out))}"
                            "; pass out_sharding")
  return mesh, tuple(out)


def sizes_str(shape: Sequence[int], dims: Dims) -> str:
  """A type's dimensions as JAX prints them: `8@X,4@(Y,Z),2`."""
  return ",".join(f"{size}@{axes[0] if len(axes) == 1 else '(' + ','.join(axes) + ')'}" if axes else str(size)
                  for size, axes in zip(shape, dims))


def _type_str(x: Array, dims: Dims) -> str: return f"{x.dtype.name}[{sizes_str(x.shape, dims)}]"


_SHORT = {"bfloat16": "bf16", "bool": "bool"}


def _short_type(dtype: Any, shape: Sequence[int], dims: Dims) -> str:
  """JAX's short form of a type in its sharding errors: `f32[4@X,4]`."""
  name = dtype.name
  return f"{_SHORT.get(name) or name[0] + ''.join(c for c in name if c.isdigit())}[{sizes_str(shape, dims)}]"
