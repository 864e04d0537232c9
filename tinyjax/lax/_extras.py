"""More of jax.lax, composed of the rest: `associative_scan` (the work-efficient odd/even recursion over strided
slices), `cumlogsumexp`, the general `reduce` (any associative computation, as a halving tree), `broadcasted_iota`,
`population_count` and `clz` (bit tricks), `reduce_precision` (XLA's rounding on the float32 bits) and
`optimization_barrier`."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, full, to_array
from tinyjax.lax._shape import interleave_raw, iota_along, pad_raw
from tinyjax.trace import ad
from tinyjax.trace.core import Primitive, bind
from tinyjax.uop import Ops


def _materialize(x: Array) -> Array: return bind(Ops.CONTIGUOUS, x, weak_type=x.weak_type)


def broadcasted_iota(dtype: Any, shape: Sequence[int], dimension: int) -> Array:
  """0, 1, 2, ... along `dimension`, broadcast over the other axes of `shape`."""
  shape = tuple(int(d) for d in shape)
  if any(d < 0 for d in shape): raise TypeError(f"broadcasted_iota: shape must be non-negative, got {shape}")
  if not 0 <= int(dimension) < len(shape):
    raise ValueError(f"broadcasted_iota: dimension must be in [0, {len(shape)}), got {dimension}")
  return iota_along(dtypes.canonicalize_dtype(dtypes.dtype(dtype)), shape, int(dimension))


def optimization_barrier(operand: Any) -> Any:
  """The operand, unchanged (XLA uses it to stop reordering; tinyjax has nothing to stop)."""
  return tree_util.tree_map(to_array, operand)


def _integer(name: str, x: Any) -> Array:
  x = to_array(x)
  if x.dtype.kind not in "iu": raise TypeError(f"{name} requires an integer operand, got {x.dtype.name}")
  return x


def population_count(x: Any) -> Array:
  """The number of set bits of each element (in its own dtype), by the SWAR tree of bit-field sums."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  x = _integer("population_count", x)
  bits = x.dtype.itemsize * 8
  unsigned = np.dtype(f"uint{bits}")
  v = lax.bitcast_convert_type(x, unsigned)

  def const(pattern: int) -> Array: return full((), pattern & ((1 << bits) - 1), unsigned)  # (a constant, no host data)
  v = v - (jnp.right_shift(v, const(1)) & const(0x5555555555555555))
  v = (v & const(0x3333333333333333)) + (jnp.right_shift(v, const(2)) & const(0x3333333333333333))
  v = (v + jnp.right_shift(v, const(4))) & const(0x0F0F0F0F0F0F0F0F)
  if bits > 8:
    v = jnp.right_shift(v * const(0x0101010101010101), const(bits - 8))
  return lax.bitcast_convert_type(v, x.dtype) if x.dtype.kind == "i" else v


def clz(x: Any) -> Array:
  """The number of leading zero bits of each element: the width minus the population count of the bits smeared
  right from the highest set one."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  x = _integer("clz", x)
  bits = x.dtype.itemsize * 8
  unsigned = np.dtype(f"uint{bits}")
  v = lax.bitcast_convert_type(x, unsigned)
  shift = 1
  while shift < bits:
    v = v | jnp.right_shift(v, full((), shift, unsigned))
    shift *= 2
  count = full((), bits, unsigned) - population_count(v)
  return lax.bitcast_convert_type(count, x.dtype) if x.dtype.kind == "i" else count


def associative_scan(fn: Callable, elems: Any, reverse: bool = False, axis: int = 0) -> Any:
  """All prefix combinations of `elems` (a pytree of arrays of one length along `axis`) under the associative `fn`:
  out[i] = fn(... fn(elems[0], elems[1]) ..., elems[i]). Work-efficient: the pairs (0,1), (2,3), ... are combined,
  their prefixes computed recursively, and the even positions filled in from them (O(n) fn calls on slices,
  O(log n) depth)."""
  from tinyjax import lax
  leaves, tree = tree_util.tree_flatten(elems)
  leaves = [to_array(leaf) for leaf in leaves]
  if not leaves: raise ValueError("associative_scan needs at least one array")
  axis = canonicalize_axis(axis, leaves[0].ndim)
  n = leaves[0].shape[axis]
  if any(leaf.shape[axis] != n for leaf in leaves):
    raise ValueError(f"associative_scan: every array needs the same length along axis {axis}, got "
                     f"{[leaf.shape[axis] for leaf in leaves]}")

  def cut(x: Array, start: int, stop: int | None = None, step: int = 1) -> Array:
    return lax.slice_in_dim(x, start, x.shape[axis] if stop is None else stop, step, axis)

  def combine(a: list[Array], b: list[Array]) -> list[Array]:
    out = tree_util.tree_leaves(fn(tree_util.tree_unflatten(tree, a), tree_util.tree_unflatten(tree, b)))
    if len(out) != len(a): raise ValueError("associative_scan: fn must return a pytree like its inputs")
    # each level is materialised: fused, the strided views of the levels above would be recomputed per element
    # (a graph that grows with n log n and compiles in minutes)
    return [_materialize(to_array(o)) for o in out]

  def scan(xs: list[Array]) -> list[Array]:
    length = xs[0].shape[axis]
    if length < 2: return xs
    reduced = combine([cut(x, 0, length - 1, 2) for x in xs], [cut(x, 1, None, 2) for x in xs])
    odd = scan(reduced)
    if length % 2 == 0:
      even = combine([cut(o, 0, o.shape[axis] - 1) for o in odd], [cut(x, 2, None, 2) for x in xs])
    else:
      even = combine(odd, [cut(x, 2, None, 2) for x in xs])
    even = [lax.concatenate([cut(x, 0, 1), e], axis) for x, e in zip(xs, even)]
    # (materialised too: fused, every level's interleave became one kernel choosing among all the levels' buffers
    # per element, each read for every element: a sum over 4096x256, 5.3 -> 1.2 ms, JAX 0.10.2 1.2)
    return [_materialize(_interleave(e, o, axis, length)) for e, o in zip(even, odd)]

  if reverse: leaves = [lax.rev(x, (axis,)) for x in leaves]
  out = scan(leaves)
  if reverse: out = [lax.rev(x, (axis,)) for x in out]
  return tree_util.tree_unflatten(tree, out)


def _interleave(even: Array, odd: Array, axis: int, length: int) -> Array:
  """even[0], odd[0], even[1], odd[1], ... along axis, `length` elements in all (even has the extra one)."""
  if even.shape[axis] > odd.shape[axis]:
    padding = [(0, 0)] * odd.ndim
    padding[axis] = (0, 1)
    odd = pad_raw(odd, padding)
  return interleave_raw([even, odd], axis, length)


def cumlogsumexp(operand: Any, axis: int = 0, reverse: bool = False) -> Array:
  """log(cumsum(exp(x))) along axis, stably (a logaddexp scan)."""
  from tinyjax import numpy as jnp
  x = to_array(operand)
  if not dtypes.is_floating(x.dtype): raise TypeError(f"cumlogsumexp requires a float operand, got {x.dtype.name}")
  return associative_scan(jnp.logaddexp, x, reverse=reverse, axis=axis)


def reduce(operands: Any, init_values: Any, computation: Callable, dimensions: Sequence[int]) -> Any:
  """Reduce `operands` (an array or a pytree of arrays of one shape) over `dimensions` with the associative
  `computation`, then combine the result once with `init_values` (an empty reduction gives `init_values`), as JAX.
  lax.add/mul/max/min use the fused reductions; any other computation runs as a halving tree of slices (log2(n)
  rounds, an unpaired last element carried to the next round)."""
  from tinyjax import lax
  leaves, tree = tree_util.tree_flatten(operands)
  inits, init_tree = tree_util.tree_flatten(init_values)
  if init_tree != tree:
    raise ValueError(f"reduce: init_values must have the structure of the operands, got {init_tree} and {tree}")
  leaves = [to_array(leaf) for leaf in leaves]
  inits = [to_array(v) for v in inits]
  if not leaves: raise ValueError("reduce needs at least one operand")
  if any(v.ndim for v in inits): raise ValueError("reduce: init_values must be scalars")
  inits = [v.astype(leaf.dtype) for v, leaf in zip(inits, leaves)]
  if any(leaf.shape != leaves[0].shape for leaf in leaves):
    raise ValueError(f"reduce: operands must have one shape, got {[leaf.shape for leaf in leaves]}")
  ndim = leaves[0].ndim
  dims = [int(d) for d in dimensions]
  if any(not 0 <= d < ndim for d in dims) or len(set(dims)) != len(dims):
    raise ValueError(f"reduce: dimensions must be distinct axes in [0, {ndim}), got {tuple(dimensions)}")
  if not dims: return tree_util.tree_unflatten(tree, leaves)
  out_shape = tuple(d for i, d in enumerate(leaves[0].shape) if i not in dims)
  if any(leaves[0].shape[d] == 0 for d in dims):  # nothing to reduce: the init values
    return tree_util.tree_unflatten(tree, [lax.broadcast_in_dim(v, out_shape, ()) for v in inits])
  monoids = {lax.add: lax.reduce_sum, lax.mul: lax.reduce_prod, lax.max: lax.reduce_max, lax.min: lax.reduce_min}
  if len(leaves) == 1 and computation in monoids:
    reduced = monoids[computation](leaves[0], dims)
    return tree_util.tree_unflatten(tree, [computation(reduced, lax.broadcast_in_dim(inits[0], reduced.shape, ()))])

  def apply(a: list[Array], b: list[Array]) -> list[Array]:
    out = computation(tree_util.tree_unflatten(tree, a), tree_util.tree_unflatten(tree, b))
    return [_materialize(to_array(o)) for o in tree_util.tree_leaves(out)]
  for d in sorted(dims, reverse=True):
    while leaves[0].shape[d] > 1:
      size = leaves[0].shape[d]
      pairs = apply([lax.slice_in_dim(x, 0, size - size % 2, 2, d) for x in leaves],
                    [lax.slice_in_dim(x, 1, size - size % 2, 2, d) for x in leaves])
      if size % 2: pairs = [lax.concatenate([p, lax.slice_in_dim(x, size - 1, size, 1, d)], d)
                            for p, x in zip(pairs, leaves)]
      leaves = pairs
    leaves = [lax.squeeze(x, (d,)) for x in leaves]
  return tree_util.tree_unflatten(tree, apply([lax.broadcast_in_dim(v, x.shape, ()) for v, x in zip(inits, leaves)],
                                              leaves))


def _reduce_precision(x: Array, *, exponent_bits: int, mantissa_bits: int) -> Array:
  """XLA's ReducePrecision on the bits of x's own width (float64 as float64, the 16-bit floats as float32)."""
  from tinyjax import lax
  from tinyjax import numpy as jnp
  wide_dtype = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
  mantissa_width, exponent_width = (52, 11) if wide_dtype == np.float64 else (23, 8)
  unsigned = np.dtype(f"uint{wide_dtype.itemsize * 8}")
  wide = x.astype(wide_dtype)
  bits = lax.bitcast_convert_type(wide, unsigned)
  mask = (1 << (wide_dtype.itemsize * 8)) - 1

  def u(value: int) -> Array: return to_array(np.array(value & mask, unsigned))
  if mantissa_bits < mantissa_width:
    last_bit = 1 << (mantissa_width - mantissa_bits)
    last = jnp.right_shift(bits & u(last_bit), u(mantissa_width - mantissa_bits))
    bits = (bits + last + u((last_bit >> 1) - 1)) & u(~(last_bit - 1))
  if exponent_bits < exponent_width:
    bias = (1 << (exponent_width - 1)) - 1
    exponent_mask = u(((1 << exponent_width) - 1) << mantissa_width)
    reduced_bias = (1 << (exponent_bits - 1)) - 1
    exponent = bits & exponent_mask
    overflow = exponent > u((bias + reduced_bias) << mantissa_width)
    underflow = exponent <= u((bias - reduced_bias) << mantissa_width)
    signed_zero = bits & u(1 << (wide_dtype.itemsize * 8 - 1))
    bits = jnp.where(overflow, signed_zero | exponent_mask, jnp.where(underflow, signed_zero, bits))
  result = lax.bitcast_convert_type(bits, wide_dtype)
  return jnp.where(wide != wide, wide, result).astype(x.dtype)  # NaN stays NaN


reduce_precision_p = Primitive("reduce_precision", _reduce_precision)
ad.defjvp(reduce_precision_p, lambda t, out, x, **params: t)  # as JAX: the rounding's derivative is taken as 1


def reduce_precision(operand: Any, exponent_bits: int, mantissa_bits: int) -> Array:
  """Round each float to the precision of a float with `exponent_bits` and `mantissa_bits` (XLA's ReducePrecision:
  round to nearest even, overflow to infinity, underflow to zero, NaN kept), in its own dtype; differentiable as
  the identity."""
  x = to_array(operand)
  if not dtypes.is_floating(x.dtype):
    raise TypeError(f"reduce_precision requires a float operand, got {x.dtype.name}")
  if not isinstance(exponent_bits, (int, np.integer)) or not isinstance(mantissa_bits, (int, np.integer)):
    raise TypeError(f"reduce_precision: exponent_bits and mantissa_bits must be ints, got {exponent_bits!r}, "
                    f"{mantissa_bits!r}")
  if exponent_bits < 1 or mantissa_bits < 0:
    raise ValueError(f"reduce_precision needs exponent_bits >= 1 and mantissa_bits >= 0, got {exponent_bits}, "
                     f"{mantissa_bits}")
  return reduce_precision_p.bind(x, exponent_bits=int(exponent_bits), mantissa_bits=int(mantissa_bits))
