"""Reductions and contractions in lax: reduce_sum/max/min/prod/and/or, argmax/argmin, dot_general, dot.

Each is REDUCE_AXIS (ADD, MAX or MUL) over axes, with elementwise work around it. A contraction is movement
(PERMUTE + RESHAPE + EXPAND of both operands to one (batch, lhs free, rhs free, contracting) shape), MUL, and
REDUCE_AXIS(ADD) over the contracting axes: lower/ sees one reduction and fuses it into one kernel.

`reduce_sum/max/min/prod`, `argmax/argmin` and `dot_general` are Primitives (as in JAX) whose impl is that
composition; their JVP rules (end of file) give JAX's derivatives: max/min ties share the tangent evenly, products
are exact at zeros, `dot_general`'s tangent is two dot_generals (bilinear).
"""
from __future__ import annotations

import math

import enum

from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.trace import sharding_types
from tinyjax.lax._base import BOOL, FLOAT32, LOW_PRECISION_FLOATS, canonicalize_axes, canonicalize_axis, cast, \
  expand_raw, like, reshape_raw, to_array
from tinyjax.lax._elementwise import _eq, _fdiv, _isnan, _mul, _neg, _not, _where
from tinyjax.lax._shape import iota_along, permute_raw
from tinyjax.trace import ad, batching
from tinyjax.trace.core import Primitive, bind
from tinyjax.uop import Ops


def reduce_raw(x: Array, reduce_op: Ops, axes: Sequence[int], keepdims: bool = False) -> Array:
  """REDUCE_AXIS over `axes` (already canonical) in x's dtype; drops the axes unless `keepdims`."""
  axes = tuple(sorted(set(axes)))
  if not axes: return x
  reduced = bind(Ops.REDUCE_AXIS, x, arg=(reduce_op, axes), weak_type=x.weak_type)
  return reduced if keepdims else reshape_raw(reduced, [d for i, d in enumerate(x.shape) if i not in axes])


def _require_nonempty(name: str, x: Array, axes: Sequence[int]) -> None:
  if any(x.shape[a] == 0 for a in axes):
    raise ValueError(f"zero-size array to reduction operation {name} which has no identity")


def _canonical_reduce_params(axes: Sequence[int], keepdims: bool) -> dict:
  return {"axes": tuple(sorted({int(a) for a in axes})), "keepdims": bool(keepdims)}


def sum_raw(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
  """Sum over `axes`, accumulating float16/bfloat16 in float32 and rounding once; bools count as integers."""
  return reduce_sum_p.bind(x, **_canonical_reduce_params(axes, keepdims))


def prod_raw(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
  """Product over `axes` (float16/bfloat16 in float32)."""
  return reduce_prod_p.bind(x, **_canonical_reduce_params(axes, keepdims))


def max_raw(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
  """Maximum over `axes` (NaN propagates; bools: any)."""
  return reduce_max_p.bind(x, **_canonical_reduce_params(axes, keepdims))


def min_raw(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
  """Minimum over `axes`: -max(-x) for floats, ~max(~x) for integers (no overflow at the minimum)."""
  return reduce_min_p.bind(x, **_canonical_reduce_params(axes, keepdims))


def _sum_impl(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
  if x.dtype in LOW_PRECISION_FLOATS:
    return cast(reduce_raw(cast(x, FLOAT32), Ops.ADD, axes, keepdims), x.dtype)
  if x.dtype == BOOL: return cast(reduce_raw(cast(x, np.int32), Ops.ADD, axes, keepdims), BOOL)
  return reduce_raw(x, Ops.ADD, axes, keepdims)


def _complex_prod(x: Array, axes: Sequence[int], keepdims: bool) -> Array:
  """A product of complex numbers over `axes` as a tree of pairwise products (log2 n steps of elementwise complex
  multiplication; the lowering of complex values has no product reduction)."""
  from tinyjax.lax._base import full
  from tinyjax.lax._shape import concatenate, permute_raw, reshape_raw
  kept = [i for i in range(x.ndim) if i not in axes]
  count = math.prod(x.shape[i] for i in axes)
  values = reshape_raw(permute_raw(x, (*kept, *axes)), (*(x.shape[i] for i in kept), count))
  while values.shape[-1] > 1:
    if values.shape[-1] % 2:
      values = concatenate([values, full((*values.shape[:-1], 1), 1, x.dtype)], values.ndim - 1)
    pairs = reshape_raw(values, (*values.shape[:-1], values.shape[-1] // 2, 2))
    first = reshape_raw(_shrink_last(pairs, 0), pairs.shape[:-1])
    second = reshape_raw(_shrink_last(pairs, 1), pairs.shape[:-1])
    values = _mul(first, second)
  if count == 0: values = full((*values.shape[:-1], 1), 1, x.dtype)
  shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keepdims else [x.shape[i] for i in kept]
  return reshape_raw(values, tuple(shape))


def _shrink_last(x: Array, index: int) -> Array:
  """x[..., index:index + 1]."""
  from tinyjax.lax._shape import shrink_raw
  return shrink_raw(x, tuple((0, d) for d in x.shape[:-1]) + ((index, index + 1),))


def _prod_impl(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
  if dtypes.is_complex(x.dtype): return _complex_prod(x, axes, keepdims)
  if x.dtype in LOW_PRECISION_FLOATS:
    return cast(reduce_raw(cast(x, FLOAT32), Ops.MUL, axes, keepdims), x.dtype)
  if x.dtype == BOOL: return min_raw(x, axes, keepdims)
  return reduce_raw(x, Ops.MUL, axes, keepdims)


def _max_impl(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
  if x.dtype == BOOL: return cast(reduce_raw(cast(x, np.uint8), Ops.MAX, axes, keepdims), BOOL)
  return reduce_raw(x, Ops.MAX, axes, keepdims)


def _min_impl(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
  if x.dtype == BOOL or x.dtype.kind in "iu": return _not(max_raw(_not(x), axes, keepdims))
  return _neg(max_raw(_neg(x), axes, keepdims))


reduce_sum_p = Primitive("reduce_sum", _sum_impl)
reduce_prod_p = Primitive("reduce_prod", _prod_impl)
reduce_max_p = Primitive("reduce_max", _max_impl)
reduce_min_p = Primitive("reduce_min", _min_impl)


def _reduction(name: str, raw, needs_identity: bool):
  def reduce(operand: Any, axes: Sequence[int]) -> Array:
    x = to_array(operand)
    axes = canonicalize_axes(tuple(axes), x.ndim)
    if needs_identity: _require_nonempty(name, x, axes)
    return raw(x, axes)
  reduce.__name__ = reduce.__qualname__ = name
  return reduce


reduce_sum = _reduction("reduce_sum", sum_raw, False)
reduce_sum.__doc__ = "Sum over `axes` (removed from the shape); same dtype (f16/bf16 accumulate in f32)."
reduce_prod = _reduction("reduce_prod", prod_raw, False)
reduce_prod.__doc__ = "Product over `axes` (removed from the shape); same dtype."
reduce_max = _reduction("reduce_max", max_raw, False)
reduce_max.__doc__ = "Maximum over `axes` (removed from the shape); NaN propagates; -inf / dtype min when empty."
reduce_min = _reduction("reduce_min", min_raw, False)
reduce_min.__doc__ = "Minimum over `axes` (removed from the shape); NaN propagates; inf / dtype max when empty."


def reduce_and(operand: Any, axes: Sequence[int]) -> Array:
  """Logical (bool) or bitwise (integers: not supported yet) AND over `axes`."""
  x = to_array(operand)
  if x.dtype != BOOL: raise TypeError(f"reduce_and supports bool operands only for now, got {x.dtype}")
  return min_raw(x, canonicalize_axes(tuple(axes), x.ndim))


def reduce_or(operand: Any, axes: Sequence[int]) -> Array:
  """Logical OR over `axes` of a bool array."""
  x = to_array(operand)
  if x.dtype != BOOL: raise TypeError(f"reduce_or supports bool operands only for now, got {x.dtype}")
  return max_raw(x, canonicalize_axes(tuple(axes), x.ndim))


def arg_extreme_raw(x: Array, axis: int, find_max: bool, index_dtype: np.dtype, keepdims: bool = False) -> Array:
  """Index of the first maximum (or minimum) along `axis`; NaN counts as the extreme, as numpy."""
  prim = argmax_p if find_max else argmin_p
  return prim.bind(x, axes=(int(axis),), index_dtype=np.dtype(index_dtype), keepdims=bool(keepdims))


def _arg_extreme_impl(x: Array, axis: int, find_max: bool, index_dtype: np.dtype, keepdims: bool) -> Array:
  if x.dtype == BOOL: x = cast(x, np.int32)
  extreme = (max_raw if find_max else min_raw)(x, (axis,), keepdims=True)
  extreme = expand_raw(extreme, x.shape)
  is_extreme = _eq(x, extreme)
  if dtypes.is_floating(x.dtype): is_extreme = _where(_isnan(extreme), _isnan(x), is_extreme)
  size = x.shape[axis]
  count_dtype = np.dtype(np.int32) if size < 2**31 - 1 else np.dtype(np.int64)
  # the first index wins: score (size - index) where extreme, 0 elsewhere; the largest score is the first index
  scores = bind(Ops.ADD, _neg(iota_along(count_dtype, x.shape, axis)), like(is_extreme, size, count_dtype))
  scores = _where(is_extreme, scores, like(is_extreme, 0, count_dtype))
  best = reduce_raw(scores, Ops.MAX, (axis,), keepdims)
  index = bind(Ops.ADD, _neg(best), like(best, size, count_dtype))
  return cast(index, index_dtype)


argmax_p = Primitive("argmax", lambda x, *, axes, index_dtype, keepdims=False:
                     _arg_extreme_impl(x, axes[0], True, index_dtype, keepdims))
argmin_p = Primitive("argmin", lambda x, *, axes, index_dtype, keepdims=False:
                     _arg_extreme_impl(x, axes[0], False, index_dtype, keepdims))


def _arg_extreme(name: str, operand: Any, axis: int, index_dtype: Any, find_max: bool) -> Array:
  x = to_array(operand)
  axis = canonicalize_axis(axis, x.ndim)
  if x.shape[axis] == 0: raise ValueError(f"attempt to get {name} of an empty sequence")
  return arg_extreme_raw(x, axis, find_max, dtypes.canonicalize_dtype(dtypes.dtype(index_dtype)))


def argmax(operand: Any, axis: int, index_dtype: Any) -> Array:
  """Index of the first maximum along `axis` (removed from the shape), in `index_dtype`; NaN counts as maximal."""
  return _arg_extreme("argmax", operand, axis, index_dtype, True)


def argmin(operand: Any, axis: int, index_dtype: Any) -> Array:
  """Index of the first minimum along `axis` (removed from the shape), in `index_dtype`; NaN counts as minimal."""
  return _arg_extreme("argmin", operand, axis, index_dtype, False)


# ---------------------------------------------------------------------------------------------- contractions

def dot_general_raw(lhs: Array, rhs: Array, contracting: tuple[Sequence[int], Sequence[int]],
                    batch: tuple[Sequence[int], Sequence[int]], out_dtype: np.dtype) -> Array:
  """The contraction of `dot_general` for checked operands of one dtype; result (batch, lhs free, rhs free)."""
  dimension_numbers = (tuple(tuple(int(a) for a in axes) for axes in contracting),
                       tuple(tuple(int(a) for a in axes) for axes in batch))
  out = dot_general_p.bind(lhs, rhs, dimension_numbers=dimension_numbers, preferred_element_type=np.dtype(out_dtype))
  if sharding_types._enabled[0] and (layout := sharding_types.dot_sharding(lhs, rhs, *dimension_numbers)) is not None:
    sharding_types.set_sharding(out, *layout)  # (JAX's rule for the product, not the one of the Ops building it)
  return out


def _dot_general_impl(lhs: Array, rhs: Array, *, dimension_numbers: Any, preferred_element_type: np.dtype) -> Array:
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  out_dtype = preferred_element_type
  lhs_free = [i for i in range(lhs.ndim) if i not in lhs_contract and i not in lhs_batch]
  rhs_free = [i for i in range(rhs.ndim) if i not in rhs_contract and i not in rhs_batch]
  batch_shape = [lhs.shape[i] for i in lhs_batch]
  lhs_free_shape, rhs_free_shape = [lhs.shape[i] for i in lhs_free], [rhs.shape[i] for i in rhs_free]
  contract_shape = [lhs.shape[i] for i in lhs_contract]
  n_batch, n_lhs, n_rhs, n_contract = len(batch_shape), len(lhs_free), len(rhs_free), len(contract_shape)
  compute = out_dtype
  if out_dtype in LOW_PRECISION_FLOATS: compute = FLOAT32
  elif out_dtype == BOOL: compute = np.dtype(np.int32)
  lhs, rhs = cast(lhs, compute), cast(rhs, compute)
  full_shape = batch_shape + lhs_free_shape + rhs_free_shape + contract_shape
  lhs = permute_raw(lhs, list(lhs_batch) + lhs_free + list(lhs_contract))
  lhs = reshape_raw(lhs, batch_shape + lhs_free_shape + [1] * n_rhs + contract_shape)
  rhs = permute_raw(rhs, list(rhs_batch) + rhs_free + list(rhs_contract))
  rhs = reshape_raw(rhs, batch_shape + [1] * n_lhs + rhs_free_shape + contract_shape)
  product = bind(Ops.MUL, expand_raw(lhs, full_shape), expand_raw(rhs, full_shape))
  first_contract = n_batch + n_lhs + n_rhs
  result = reduce_raw(product, Ops.ADD, range(first_contract, first_contract + n_contract))
  return cast(result, out_dtype, weak_type=lhs.weak_type and rhs.weak_type)  # weak only from weak operands, as JAX


dot_general_p = Primitive("dot_general", _dot_general_impl)


def dot_general(lhs: Any, rhs: Any, dimension_numbers: Any, precision: Any = None,
                preferred_element_type: Any = None) -> Array:
  """General contraction. dimension_numbers = ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)).

  The output shape is (batch dims, lhs free dims, rhs free dims), as JAX. Operands must share a dtype (no
  promotion); float16/bfloat16 accumulate in float32. `preferred_element_type` sets the result dtype."""
  del precision
  lhs, rhs = to_array(lhs), to_array(rhs)
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  lhs_contract = tuple(canonicalize_axis(a, lhs.ndim) for a in lhs_contract)
  rhs_contract = tuple(canonicalize_axis(a, rhs.ndim) for a in rhs_contract)
  lhs_batch = tuple(canonicalize_axis(a, lhs.ndim) for a in lhs_batch)
  rhs_batch = tuple(canonicalize_axis(a, rhs.ndim) for a in rhs_batch)
  if lhs.dtype != rhs.dtype:
    raise TypeError(f"lax.dot_general requires arguments to have the same dtypes, got {lhs.dtype.name}, "
                    f"{rhs.dtype.name}.")
  if len(lhs_contract) != len(rhs_contract) or len(lhs_batch) != len(rhs_batch):
    raise TypeError("dot_general requires equal numbers of lhs and rhs contracting and batch dimensions, got "
                    f"{dimension_numbers}")
  if [lhs.shape[i] for i in lhs_contract] != [rhs.shape[i] for i in rhs_contract]:
    raise TypeError(f"dot_general requires contracting dimensions to have the same shape, got "
                    f"{tuple(lhs.shape[i] for i in lhs_contract)} and {tuple(rhs.shape[i] for i in rhs_contract)} "
                    f"(lhs shape {lhs.shape}, rhs shape {rhs.shape}).")
  if [lhs.shape[i] for i in lhs_batch] != [rhs.shape[i] for i in rhs_batch]:
    raise TypeError(f"dot_general requires lhs batch dimensions and rhs batch dimensions to have the same shape, got "
                    f"{tuple(lhs.shape[i] for i in lhs_batch)} and {tuple(rhs.shape[i] for i in rhs_batch)}.")
  out_dtype = lhs.dtype if preferred_element_type is None else dtypes.canonicalize_dtype(
    dtypes.dtype(preferred_element_type))
  if sharding_types._enabled[0]:  # JAX's sharding type errors (the derivatives' products pass their layouts)
    sharding_types.dot_sharding(lhs, rhs, (lhs_contract, rhs_contract), (lhs_batch, rhs_batch), errors=True)
  return dot_general_raw(lhs, rhs, (lhs_contract, rhs_contract), (lhs_batch, rhs_batch), out_dtype)


def dot(lhs: Any, rhs: Any, precision: Any = None, preferred_element_type: Any = None) -> Array:
  """Vector/matrix products: (n,)·(n,) -> (), (m,n)·(n,) -> (m,), (n,)·(n,k) -> (k,), (m,n)·(n,k) -> (m,k)."""
  lhs, rhs = to_array(lhs), to_array(rhs)
  if lhs.ndim not in (1, 2) or rhs.ndim not in (1, 2):
    raise TypeError(f"dot accepts 1-D or 2-D operands, got shapes {lhs.shape} and {rhs.shape}")
  return dot_general(lhs, rhs, (((lhs.ndim - 1,), (0,)), ((), ())), precision, preferred_element_type)


# ---------------------------------------------------------------------------------------------- derivatives

def _expand_reduced(out: Array, x: Array, axes: tuple[int, ...], keepdims: bool) -> Array:
  """A reduction's result broadcast back to the operand's shape."""
  if not keepdims: out = reshape_raw(out, [1 if i in axes else d for i, d in enumerate(x.shape)])
  return expand_raw(out, x.shape)


def _chooser_rule(primals, tangents, out, *, axes, keepdims):
  """reduce_max/min: the tangent at the chosen element; ties share it evenly (as JAX); a NaN result gets NaN."""
  (x,), (t,) = primals, tangents
  if not dtypes.is_inexact(x.dtype): return None
  hits = cast(_eq(x, _expand_reduced(out, x, axes, keepdims)), x.dtype)
  counts = _sum_impl(hits, axes, keepdims)
  return _fdiv(_sum_impl(_mul(t, hits), axes, keepdims), counts)


def _prod_rule(primals, tangents, out, *, axes, keepdims):
  """d prod = sum_i t_i prod_{j != i} x_j, the product of the others being the products before and after i
  (exclusive cumulative products), as JAX computes it: exact with zeros, and JAX's values with infinities and NaNs
  (prod [2, inf, 3] has the derivative [inf, 6, inf])."""
  from tinyjax.lax._cumulative import _shifted, cumulative_raw
  from tinyjax.lax._shape import flip_raw
  (x,), (t,) = primals, tangents
  if not dtypes.is_inexact(x.dtype): return None
  count = math.prod(x.shape[i] for i in axes)
  if count == 0: return _sum_impl(t, axes, keepdims)  # (the empty product is 1: its derivative is 0)
  kept = [i for i in range(x.ndim) if i not in axes]
  rows = (*(x.shape[i] for i in kept), count)

  def flat(v: Array) -> Array: return reshape_raw(permute_raw(v, (*kept, *axes)), rows)
  last = len(rows) - 1
  values = flat(x)
  before = _shifted(cumulative_raw(values, last, "mul"), last, 1, 1)
  after = flip_raw(_shifted(cumulative_raw(flip_raw(values, [last]), last, "mul"), last, 1, 1), [last])
  tangent = _sum_impl(_mul(flat(t), _mul(before, after)), (last,))
  return reshape_raw(tangent, out.shape)


def _dot_general_rule(primals, tangents, out, **params):
  """Bilinear: d(lhs . rhs) = t_lhs . rhs + lhs . t_rhs, each again a dot_general."""
  (lhs, rhs), (t_lhs, t_rhs) = primals, tangents
  if not (dtypes.is_inexact(lhs.dtype) and dtypes.is_inexact(out.dtype)): return None
  return ad.sum_tangents(None if t_lhs is None else dot_general_p.bind(t_lhs, rhs, **params),
                         None if t_rhs is None else dot_general_p.bind(lhs, t_rhs, **params))


ad.jvp_rules.update({
  reduce_sum_p: lambda primals, tangents, out, **params: reduce_sum_p.bind(tangents[0], **params),
  reduce_max_p: _chooser_rule, reduce_min_p: _chooser_rule, reduce_prod_p: _prod_rule,
  dot_general_p: _dot_general_rule,
})
ad.defjvp_zero(argmax_p)
ad.defjvp_zero(argmin_p)


batching.defreduction(reduce_sum_p, reduce_prod_p, reduce_max_p, reduce_min_p, argmax_p, argmin_p)


class Precision(enum.Enum):
  """Precision requests of dot/matmul/einsum/conv (as jax.lax.Precision). tinyjax computes float32 products in
  float32 with float32 accumulation at every level, so DEFAULT, HIGH and HIGHEST give the same (full float32)
  results: a precision request never changes float32 results."""
  DEFAULT = 0
  HIGH = 1
  HIGHEST = 2

  def __str__(self) -> str: return self.name
