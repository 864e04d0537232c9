"""Cumulative reductions of lax: `cumsum`, `cumprod`, `cummax`, `cummin`, as a log-step scan (Hillis-Steele):
ceil(log2 n) steps, step s combining each element with the one 2**s before it, each step materialised, so n
elements cost O(n log n) work in log n kernels (not a Python loop, not an n x n mask). Differentiable and batchable as
compositions of Ops."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, full, to_array
from tinyjax.lax._elementwise import _add, _max, _min, _mul
from tinyjax.lax._shape import flip_raw, pad_raw, shrink_raw
from tinyjax.trace.core import Primitive, bind
from tinyjax.uop import Ops


def _shifted(x: Array, axis: int, distance: int, fill: Any) -> Array:
  """x moved `distance` places along `axis` (toward higher indices), the first places filled with `fill`."""
  length = x.shape[axis]
  bounds = [(0, d) for d in x.shape]
  bounds[axis] = (0, length - distance)
  padding = [(0, 0)] * x.ndim
  padding[axis] = (distance, 0)
  moved = pad_raw(shrink_raw(x, bounds), padding)
  if fill == 0: return moved
  mask_bounds = [(0, 0)] * x.ndim
  mask_bounds[axis] = (distance, 0)
  shape = list(x.shape)
  shape[axis] = length - distance
  inside = pad_raw(full(tuple(shape), True, np.bool_), mask_bounds)
  return bind(Ops.WHERE, inside, moved, full(x.shape, fill, x.dtype), dtype=x.dtype, weak_type=x.weak_type)


def cumulative_raw(x: Array, axis: int, combine: str, reverse: bool = False) -> Array:
  """The inclusive scan of `x` along `axis` with "add", "mul", "max" or "min": its primitive (`cumsum_p`, ...:
  without rules of their own, an eager call is one node, trace/core.py `stage_call`; `np.asarray(jnp.cumsum(x))` of
  64 floats built its 6 steps eagerly, 107 us against JAX's 15)."""
  return _CUMULATIVE_PRIMITIVES[combine].bind(x, axis=int(axis), reverse=bool(reverse))


def _cumulative_steps(x: Array, *, axis: int, reverse: bool, combine: str) -> Array:
  """The primitives' decomposition: log2(n) materialised steps, each combining x with itself shifted."""
  combiners = {"add": (_add, 0), "mul": (_mul, 1), "max": (_max, None), "min": (_min, None)}
  fn, identity = combiners[combine]
  if identity is None:  # max/min: the identity is the dtype's lowest/highest value
    if x.dtype == np.bool_: identity = combine == "min"
    elif dtypes.is_floating(x.dtype): identity = -np.inf if combine == "max" else np.inf
    elif dtypes.is_complex(x.dtype):  # (ordered lexicographically)
      identity = complex(-np.inf, -np.inf) if combine == "max" else complex(np.inf, np.inf)
    else:
      info = np.iinfo(x.dtype)
      identity = int(info.min if combine == "max" else info.max)
  if reverse: x = flip_raw(x, [axis])
  length = x.shape[axis]
  distance = 1
  while distance < length:
    x = bind(Ops.CONTIGUOUS, fn(x, _shifted(x, axis, distance, identity)), weak_type=x.weak_type)
    distance *= 2
  return flip_raw(x, [axis]) if reverse else x



_CUMULATIVE_PRIMITIVES = {combine: Primitive(name, functools.partial(_cumulative_steps, combine=combine))
                          for combine, name in (("add", "cumsum"), ("mul", "cumprod"), ("max", "cummax"),
                                                ("min", "cummin"))}


# lax's forms: no promotion, an axis and a direction
def _lax_cumulative(combine: str, name: str):
  def fn(operand: Any, axis: int = 0, reverse: bool = False) -> Array:
    x = to_array(operand)
    if x.ndim == 0: raise ValueError(f"lax.{name} requires an operand with at least one dimension")
    return cumulative_raw(x, canonicalize_axis(axis, x.ndim), combine, reverse)
  fn.__name__ = fn.__qualname__ = name
  fn.__doc__ = f"Inclusive {combine} scan of `operand` along `axis` (from the end with `reverse`), in its dtype."
  return fn


cumsum = _lax_cumulative("add", "cumsum")
cumprod = _lax_cumulative("mul", "cumprod")
cummax = _lax_cumulative("max", "cummax")
cummin = _lax_cumulative("min", "cummin")
