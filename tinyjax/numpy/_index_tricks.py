"""numpy's index tricks in tinyjax.numpy: the grids `mgrid` and `ogrid`, the concatenators `r_` and `c_`, `s_` and
`index_exp` (numpy's own: they only build index tuples), `ix_` and `mask_indices`."""
from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from tinyjax.array import Array


def _concrete(value: Any, default: Any, name: str) -> Any:
  from tinyjax.trace.core import Tracer
  if value is None: return default
  if isinstance(value, Tracer):
    raise TypeError(f"{name}: slice bounds must be concrete (static) values, not traced arrays")
  return value.item() if isinstance(value, (np.ndarray, np.generic, Array)) else value


def _grid_from_slice(s: slice, name: str) -> Array:
  """start:stop:step as arange, or as `linspace(start, stop, |step|)` when the step is imaginary (numpy's rule)."""
  from tinyjax import numpy as jnp
  start, stop, step = _concrete(s.start, 0, name), _concrete(s.stop, None, name), _concrete(s.step, 1, name)
  if stop is None: raise ValueError(f"{name}: a slice needs a stop, got {s}")
  if isinstance(step, complex) or np.iscomplexobj(step): return jnp.linspace(start, stop, int(abs(step)))
  return jnp.arange(start, stop, step)


class _IndexGrid:
  """`mgrid[0:3, 0:2]`: the dense index grid of the slices (stacked on a new first axis); `ogrid`: the sparse
  one (a list of broadcastable arrays). A single slice gives one 1-d array."""

  def __init__(self, sparse: bool, name: str):
    self.sparse, self.name = sparse, name

  def __getitem__(self, key: slice | tuple[slice, ...]) -> Any:
    from tinyjax import numpy as jnp
    if isinstance(key, slice): return _grid_from_slice(key, self.name)
    grids = [_grid_from_slice(k, self.name) for k in key]
    dtype = jnp.result_type(*grids)
    grids = jnp.meshgrid(*(g.astype(dtype) for g in grids), indexing="ij", sparse=self.sparse)
    return list(grids) if self.sparse else jnp.stack(grids, 0)


class _AxisConcatenator:
  """`r_[...]` / `c_[...]`: the items (arrays, scalars, slices as grids) joined along `axis` after raising each to
  `ndmin` dimensions (a 1-d item's axis placed by `trans1d`); a leading string directive "axis,ndmin,trans1d", or
  "r" / "c" for a row or column matrix, changes those."""

  def __init__(self, axis: int, ndmin: int, trans1d: int, name: str):
    self.axis, self.ndmin, self.trans1d, self.name = axis, ndmin, trans1d, name

  def __getitem__(self, key: Any) -> Array:
    from tinyjax import numpy as jnp
    items = key if isinstance(key, tuple) else (key,)
    params = [self.axis, self.ndmin, self.trans1d, -1]
    if items and isinstance(items[0], str):
      directive, items = items[0], items[1:]
      if directive == "r": params[-1] = 0
      elif directive == "c": params[-1] = 1
      else:
        fields = directive.split(",")
        fields = fields + params[len(fields):] if len(fields) < 4 else fields[:3] + [params[-1]]
        try:
          params = [int(field) for field in fields]
        except ValueError as err:
          raise ValueError(f"could not understand directive {directive!r}") from err
    axis, ndmin, trans1d, matrix = params
    if not items: raise ValueError(f"{self.name}: nothing to concatenate")
    pieces = []
    for item in items:
      if isinstance(item, slice): piece, item_ndim = _grid_from_slice(item, self.name), 0
      elif isinstance(item, str): raise ValueError("string directive must be placed at the beginning")
      else:
        piece = jnp.asarray(item)
        item_ndim = piece.ndim
      if piece.ndim < ndmin: piece = jnp.reshape(piece, (1,) * (ndmin - piece.ndim) + piece.shape)
      if trans1d != -1 and ndmin - item_ndim > 0:
        order = tuple(range(ndmin))
        shifts = ndmin - abs(ndmin + trans1d + 1) % ndmin  # (numpy's left rotation of the axes)
        piece = jnp.transpose(piece, order[shifts:] + order[:shifts])
      pieces.append(piece)
    result = jnp.concatenate(pieces, axis=axis)
    if matrix != -1 and result.ndim == 1: result = jnp.expand_dims(result, matrix)
    return result

  def __len__(self) -> int: return 0


mgrid = _IndexGrid(sparse=False, name="mgrid")
ogrid = _IndexGrid(sparse=True, name="ogrid")
r_ = _AxisConcatenator(axis=0, ndmin=1, trans1d=-1, name="r_")
c_ = _AxisConcatenator(axis=-1, ndmin=2, trans1d=0, name="c_")
s_ = np.s_
index_exp = np.index_exp


def ix_(*args: Any) -> tuple[Array, ...]:
  """An open mesh from 1-d integer sequences: the i-th output has shape (1, ..., len(args[i]), ..., 1), so that
  x[ix_(rows, cols)] picks the cross product (boolean sequences are not supported, as JAX)."""
  from tinyjax import numpy as jnp
  outputs = []
  for i, a in enumerate(args):
    array = jnp.asarray(a)
    if array.ndim != 1:
      raise ValueError(f"Arguments to jax.numpy.ix_ must be 1-dimensional, got shape {array.shape}")
    if array.dtype == np.bool_: raise NotImplementedError("Boolean arguments to jax.numpy.ix_ are not implemented")
    shape = [1] * len(args)
    shape[i] = array.shape[0]
    if array.size == 0: array = array.astype(jnp.int32)  # (an empty index is an integer one, as numpy)
    outputs.append(jnp.reshape(array, tuple(shape)))
  return tuple(outputs)


def mask_indices(n: int, mask_func: Callable[[Array, int], Array], k: int = 0, *, size: int | None = None
                 ) -> tuple[Array, Array]:
  """The (row, column) indices where mask_func(ones((n, n)), k) is nonzero, e.g. `mask_indices(n, triu, 1)`."""
  from tinyjax import numpy as jnp
  rows, cols = jnp.nonzero(mask_func(jnp.ones((operator.index(n), operator.index(n))), k), size=size)
  return rows, cols
