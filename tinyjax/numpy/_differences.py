"""Differences along axes in tinyjax.numpy: `gradient` (second-order central differences inside, one-sided at the
edges, uniform or given coordinates) and `unwrap` (phase unwrapping), as JAX's."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, staged
from tinyjax.numpy import _elementwise as ew


def _slice_along(x: Array, axis: int, start: int | None, stop: int | None) -> Array:
  index = [slice(None)] * x.ndim
  index[axis] = slice(start, stop)
  return x[tuple(index)]


def _gradient_along_axis(a: Array, h: Array, axis: int) -> Array:
  from tinyjax import numpy as jnp
  upper_edge = _slice_along(a, axis, 1, 2) - _slice_along(a, axis, 0, 1)
  lower_edge = _slice_along(a, axis, -1, None) - _slice_along(a, axis, -2, -1)
  if h.ndim == 0:
    inner = (_slice_along(a, axis, 2, None) - _slice_along(a, axis, None, -2)) * 0.5 / h
    upper_edge, lower_edge = upper_edge / h, lower_edge / h
  elif h.ndim == 1:
    if h.shape[0] != a.shape[axis]:
      raise ValueError("Spacing arrays must have the same length as the dimension along which the gradient is "
                       "calculated.")
    coordinates = jnp.reshape(h, tuple(h.shape[0] if i == axis else 1 for i in range(a.ndim)))

    def at(start: int | None, stop: int | None) -> Array: return _slice_along(coordinates, axis, start, stop)
    upper_edge = upper_edge / (at(1, 2) - at(0, 1))
    lower_edge = lower_edge / (at(-1, None) - at(-2, -1))
    # the second-order formula for uneven steps dx1 (before a point) and dx2 (after it)
    dx1, dx2 = at(1, -1) - at(0, -2), at(2, None) - at(1, -1)
    before = -dx2 / (dx1 * (dx1 + dx2))
    middle = (dx2 - dx1) / (dx1 * dx2)
    after = dx1 / (dx2 * (dx1 + dx2))
    inner = (before * _slice_along(a, axis, 0, -2) + middle * _slice_along(a, axis, 1, -1) +
             after * _slice_along(a, axis, 2, None))
  else:
    raise ValueError("Spacing arrays must be 1D arrays or scalars.")
  return jnp.concatenate([upper_edge, inner, lower_edge], axis=axis)


def gradient(f: Any, *varargs: Any, axis: int | Sequence[int] | None = None, edge_order: int | None = None
             ) -> Array | list[Array]:
  """The gradient of the samples `f` along each axis in `axis` (all by default): central differences inside,
  first-order one-sided differences at the edges. `varargs`: one spacing for all axes, or one per axis (a scalar
  step or the 1-d coordinates). One array for one axis, else a list. `edge_order` is not supported (as JAX)."""
  if edge_order is not None: raise NotImplementedError("The 'edge_order' argument to jnp.gradient is not supported.")
  a, *spacing = ew.promote("gradient", f, *varargs, inexact=True, broadcast=False)
  axes = tuple(range(a.ndim)) if axis is None else tuple(
    canonicalize_axis(ax, a.ndim) for ax in ((axis,) if np.ndim(axis) == 0 else axis))
  if not axes: return []
  if min(a.shape[ax] for ax in axes) < 2:
    raise ValueError("Shape of array too small to calculate a numerical gradient, at least 2 elements are required.")
  if not spacing: steps = [ew.as_array(1.0)] * len(axes)
  elif len(spacing) == 1: steps = spacing * len(axes)
  elif len(spacing) == len(axes): steps = spacing
  else: raise TypeError(f"Invalid number of spacing arguments {len(spacing)} for axis={axis}")
  gradients = [_gradient_along_axis(a, h, ax) for ax, h in zip(axes, steps)]
  return gradients[0] if len(axes) == 1 else gradients


@staged(static_argnames=("discont", "axis", "period"))
def unwrap(p: Any, discont: Any = None, axis: int = -1, period: Any = 2 * np.pi) -> Array:
  """`p` with every jump between neighbours along `axis` larger than `discont` (default period / 2) replaced by
  its remainder modulo `period` (phase unwrapping; the first element kept). Integers stay integers when `period`
  and `discont` are integers too, as JAX."""
  from tinyjax import numpy as jnp
  x, period = ew.promote("unwrap", jnp.asarray(p), period, broadcast=False)
  if dtypes.is_complex(x.dtype): raise ValueError("jnp.unwrap does not support complex inputs.")
  axis = canonicalize_axis(axis, x.ndim)
  if x.shape[axis] == 0: return x
  if discont is None: discont = period / 2
  interval = period // 2 if dtypes.is_integer(x.dtype) else period / 2
  steps = jnp.diff(x, axis=axis)
  wrapped = jnp.mod(steps + interval, period) - interval
  wrapped = jnp.where((wrapped == -interval) & (steps > 0), interval, wrapped)
  correction = jnp.where(jnp.abs(steps) < discont, 0, wrapped - steps)
  return jnp.concatenate([_slice_along(x, axis, 0, 1),
                          _slice_along(x, axis, 1, None) + jnp.cumsum(correction, axis=axis)], axis=axis)
