"""Sorting: `lax.sort` (several operands, `num_keys`), `sort_key_val` and `top_k`, as a bitonic sorting network.

There is no sort Op: the network is built from what exists, so sorting is differentiable (values move with the
selects that move them), batchable and works under jit with no rule of its own. The sorted axis is padded to a power
of two n = 2**m; the network's m(m+1)/2 stages are one `lax.scan` over a table of (block, distance): a stage reads
each element's partner (index XOR distance, a gather) and keeps the one its place should hold for its block's
direction. So a sort compiles one small loop body whatever n (not m(m+1)/2 kernels), and runs O(n log^2 n) work
inside one compiled loop.

Order: numbers ascending with NaN last (NaNs equal to each other; -0.0 equal to 0.0), as numpy and JAX; ties keep
their original order (the original position is the last key, so the sort is stable), and the padding sorts after
everything.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, expand_raw, full, reshape_raw, staged, to_array
from tinyjax.lax._elementwise import _and, _eq, _imag, _isnan, _lt, _not, _or, _real, _where
from tinyjax.lax._shape import concatenate, iota_along, pad_raw, permute_raw, shrink_raw
from tinyjax.trace.core import Primitive, bind
from tinyjax.uop import Ops


def total_less(x: Array, y: Array) -> Array:
  """x < y in numpy's sort order: NaN after every number; complex numbers by real part, then imaginary part (each
  part ordered so)."""
  if dtypes.is_complex(x.dtype):
    x_real, y_real = _real(x), _real(y)
    same_real = _and(_not(total_less(x_real, y_real)), _not(total_less(y_real, x_real)))
    return _or(total_less(x_real, y_real), _and(same_real, total_less(_imag(x), _imag(y))))
  if not dtypes.is_floating(x.dtype): return _lt(x, y)
  return _or(_lt(x, y), _and(_isnan(y), _not(_isnan(x))))


def _lexicographic_less(a: list[Array], b: list[Array], descending: bool) -> Array:
  """Whether key tuple a sorts before key tuple b (the last key, the original position, always ascending)."""
  result = None
  equal_so_far = None
  for position, (x, y) in enumerate(zip(a, b)):
    last = position == len(a) - 1
    before = total_less(y, x) if descending and not last else total_less(x, y)
    term = before if equal_so_far is None else _and(equal_so_far, before)
    result = term if result is None else _or(result, term)
    if not last:
      same = _and(_not(total_less(x, y)), _not(total_less(y, x)))
      equal_so_far = same if equal_so_far is None else _and(equal_so_far, same)
  return result


def _sort_last_axis(operands: list[Array], num_keys: int, descending: bool = False) -> list[Array]:
  """Sort `operands` (one shape, sorted along the last axis) by their first `num_keys`, stably: the `sort`
  primitive (below)."""
  return sort_p.bind(*operands, num_keys=num_keys, descending=bool(descending))


def _sort_network(*operands: Array, num_keys: int, descending: bool) -> list[Array]:
  """`sort_p`'s decomposition: a bitonic network over the last axis padded to a power of two, its stages a scan."""
  operands = list(operands)
  from tinyjax.lax._control_flow import scan
  from tinyjax.lax._slicing import gather_raw
  length = operands[0].shape[-1]
  if length <= 1: return operands
  batch = tuple(operands[0].shape[:-1])
  size = 1 << (length - 1).bit_length()
  # each element's original position comes along as the last operand (and key); the padding's positions are
  # `length` and beyond, which is how a stage tells padding from real elements
  arrays = [pad_raw(x, [(0, 0)] * len(batch) + [(0, size - length)]) for x in operands]
  arrays.append(iota_along(np.int32, (*batch, size), len(batch)))
  # the network's stages: (block, distance) for block = 2, 4, ..., size and distance = block / 2, ..., 1
  stages = [(1 << stage, 1 << sub) for stage in range(1, size.bit_length()) for sub in range(stage - 1, -1, -1)]
  # (built from literals, not host data: a primitive's decomposition is lowered over its program's own inputs)
  table = concatenate([reshape_raw(concatenate([full((1,), block, np.int32), full((1,), distance, np.int32)], 0),
                                   (1, 2)) for block, distance in stages], 0)
  shape = (*batch, size)
  index = iota_along(np.int32, (size,), 0)
  move_last_first = (len(batch), *range(len(batch)))

  def stage(carry: list[Array], block_distance: Array) -> tuple[list[Array], None]:
    block = expand_raw(reshape_raw(shrink_raw(block_distance, [(0, 1)]), ()), (size,))
    distance = expand_raw(reshape_raw(shrink_raw(block_distance, [(1, 2)]), ()), (size,))
    partner = bind(Ops.XOR, index, distance)
    # every operand read at the partner's place (along the last axis, the same for every batch row)
    gathered = []
    for x in carry:
      rows = gather_raw(permute_raw(x, (len(batch), *range(len(batch)))), reshape_raw(partner, (size, 1)), (1,))
      gathered.append(permute_raw(reshape_raw(rows, (size, *batch)), list(np.argsort(move_last_first))))
    real_self = _lt(carry[-1], full(shape, length, np.int32))
    real_partner = _lt(gathered[-1], full(shape, length, np.int32))
    keys_self = [real_self] + list(carry[:num_keys]) + [carry[-1]]
    keys_partner = [real_partner] + gathered[:num_keys] + [gathered[-1]]
    self_first = _lexicographic_less_with_pad(keys_self, keys_partner, descending)
    is_lower = expand_raw(_lt(index, partner), shape)
    ascending = expand_raw(_lt(bind(Ops.AND, index, block), full((size,), 1, np.int32)), shape)
    keep = _where(_eq(is_lower, ascending), self_first, _not(self_first))
    return [_where(keep, x, other) for x, other in zip(carry, gathered)], None

  arrays, _ = scan(stage, arrays, table)
  return [shrink_raw(x, [(0, d) for d in batch] + [(0, length)]) for x in arrays[:-1]]


# a primitive without rules of its own: an eager sort is one node (trace/core.py `stage_call`), its scan traced when the
# program is lowered, not at each call (eager `jnp.median` of 64 floats: 682 us, the stage's trace each time; JAX
# 12), and differentiated and batched through that decomposition
sort_p = Primitive("sort", _sort_network, multiple_results=True)


def _lexicographic_less_with_pad(a: list[Array], b: list[Array], descending: bool) -> Array:
  """a before b: a real element before padding, then the keys, then the original position."""
  real_a, real_b = a[0], b[0]
  before_by_pad = _and(real_a, _not(real_b))
  same_pad = _not(_or(before_by_pad, _and(real_b, _not(real_a))))
  return _or(before_by_pad, _and(same_pad, _lexicographic_less(a[1:], b[1:], descending)))


def sort(operand: Any, dimension: int = -1, is_stable: bool = True, num_keys: int = 1) -> Any:
  """Sort `operand` (an array, or a sequence of arrays of one shape sorted together by the first `num_keys`) along
  `dimension`: ascending, NaN last, stable."""
  single = not isinstance(operand, (tuple, list))
  arrays = [to_array(operand)] if single else [to_array(x) for x in operand]
  if not arrays: raise TypeError("sort requires at least one operand")
  shape = arrays[0].shape
  for a in arrays:
    if a.shape != shape: raise TypeError(f"sort operands must have the same shape, got {[x.shape for x in arrays]}")
  if not 1 <= num_keys <= len(arrays):
    raise ValueError(f"num_keys={num_keys} must be between 1 and the number of operands {len(arrays)}")
  if not shape: raise TypeError("sort of a 0-dimensional array: give it an axis to sort")
  axis = canonicalize_axis(dimension, len(shape))
  order = [i for i in range(len(shape)) if i != axis] + [axis]
  inverse = list(np.argsort(order))
  moved = [permute_raw(a, order) for a in arrays]
  result = [permute_raw(a, inverse) for a in _sort_last_axis(moved, num_keys)]
  return result[0] if single else tuple(result)


@staged(static_argnames=("dimension", "is_stable"), multiple_results=True)
def sort_key_val(keys: Any, values: Any, dimension: int = -1, is_stable: bool = True) -> tuple[Array, Array]:
  """`values` reordered as `keys` sort along `dimension`, and the sorted keys."""
  return sort((keys, values), dimension, is_stable, num_keys=1)


@staged(static_argnames=("k",), multiple_results=True)
def top_k(operand: Any, k: int) -> tuple[Array, Array]:
  """The `k` largest entries along the last axis, largest first, and their int32 indices: floats in the IEEE total
  order, as JAX's (a NaN above +inf, one with its sign bit set below -inf, -0.0 below 0.0), ties in their order."""
  x = to_array(operand)
  if x.ndim == 0: raise TypeError("top_k operand must have at least one dimension")
  k = int(k)
  if not 0 <= k <= x.shape[-1]:
    raise ValueError(f"k argument to top_k must be nonnegative and at most the last dimension {x.shape[-1]}, got {k}")
  positions = iota_along(np.int32, x.shape, x.ndim - 1)
  key = _order_key(x)
  if k <= TOP_K_SELECT and key is not None: return _select_top_k(x, key, positions, k)
  # (sorted by the same total order where there is a key: NaNs by their sign, -0.0 below 0.0)
  values, indices = _sort_last_axis([x, positions] if key is None else [key, x, positions], 1, descending=True)[-2:]
  bounds = [(0, d) for d in x.shape[:-1]] + [(0, k)]
  return shrink_raw(values, bounds), shrink_raw(indices, bounds)


# `top_k` of at most TOP_K_SELECT entries picks them one at a time (a maximum and the first place holding it, k
# times: O(k n)) instead of sorting the whole axis (a bitonic network of log2(n)^2 / 2 stages in a scan): a training
# step's loss over the top 8 of 256x512 logits took 11.4 ms (JAX 0.68).
TOP_K_SELECT = 16
_INT32_MIN = int(np.iinfo(np.int32).min)


def _order_key(x: Array) -> Array | None:
  """int32 keys ordered as JAX's top_k orders `x`, for floats up to 32 bits the IEEE total order (a NaN above +inf,
  one with its sign bit below -inf, -0.0 below 0.0: the float32 bits, the negative ones' flipped), integers that fit
  int32 as themselves; None for other dtypes."""
  if x.dtype in (np.dtype(np.float16), np.dtype(dtypes.bfloat16), np.dtype(np.float32)):
    f = bind(Ops.CAST, x, dtype=np.float32) if x.dtype != np.float32 else x
    bits = bind(Ops.BITCAST, f, dtype=np.int32)
    flip = bind(Ops.AND, bind(Ops.SHR, bits, full(bits.shape, 31, np.int32)), full(bits.shape, 0x7FFFFFFF, np.int32))
    return bind(Ops.XOR, bits, flip)
  if x.dtype.kind in "iu" and x.dtype.itemsize < 4 or x.dtype == np.int32:
    return bind(Ops.CAST, x, dtype=np.int32) if x.dtype != np.int32 else x
  return None


def _select_top_k(x: Array, key: Array, positions: Array, k: int) -> tuple[Array, Array]:
  """top_k by selection: k times, the largest key not yet taken and the first place holding it (ties keep their
  order); the values gathered from `x` there (so they carry its gradient)."""
  from tinyjax.lax._reductions import max_raw, min_raw
  from tinyjax.numpy._indexing import take_along_axis
  last = x.ndim - 1
  length = x.shape[-1]
  if k == 0:
    empty = [(0, d) for d in x.shape[:-1]] + [(0, 0)]
    return shrink_raw(x, empty), shrink_raw(positions, empty)
  taken = full(x.shape, False, np.bool_)
  picks = []
  for _ in range(k):
    best = max_raw(_where(taken, full(x.shape, _INT32_MIN, np.int32), key), [last], keepdims=True)
    here = _and(_eq(key, expand_raw(best, x.shape)), _not(taken))
    pick = min_raw(_where(here, positions, full(x.shape, length, np.int32)), [last], keepdims=True)
    # (each pick a buffer: fused, the k picks nested their row reductions k deep in one kernel, and the gradient's
    # scatter recomputed them per update: 1.2 s to compile, 5.9 ms to run at 256x512, k = 8)
    pick = bind(Ops.CONTIGUOUS, pick)
    taken = _or(taken, _eq(positions, expand_raw(pick, x.shape)))
    picks.append(pick)
  indices = bind(Ops.CONTIGUOUS, concatenate(picks, last))
  return take_along_axis(x, indices, axis=last), indices


def argsort_raw(x: Array, axis: int, descending: bool = False) -> Array:
  """Stable int32 indices that sort `x` along `axis` (descending keeps ties in their original order)."""
  order = [i for i in range(x.ndim) if i != axis] + [axis]
  moved = permute_raw(x, order)
  positions = iota_along(np.int32, moved.shape, moved.ndim - 1)
  _, indices = _sort_last_axis([moved, positions], 1, descending)
  return permute_raw(indices, list(np.argsort(order)))


def sort_raw(x: Array, axis: int, descending: bool = False) -> Array:
  order = [i for i in range(x.ndim) if i != axis] + [axis]
  (values,) = _sort_last_axis([permute_raw(x, order)], 1, descending)
  return permute_raw(values, list(np.argsort(order)))


def lexsort_raw(keys: Sequence[Array], axis: int) -> Array:
  """Indices sorting by the last key, then the one before, ..., as numpy's lexsort."""
  ordered = list(reversed(keys))
  order = [i for i in range(ordered[0].ndim) if i != axis] + [axis]
  moved = [permute_raw(k, order) for k in ordered]
  positions = iota_along(np.int32, moved[0].shape, moved[0].ndim - 1)
  *_, indices = _sort_last_axis([*moved, positions], len(moved))
  return permute_raw(indices, list(np.argsort(order)))

