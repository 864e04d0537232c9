"""Array manipulation in tinyjax.numpy composed of the shape and indexing functions: `diagflat`, `ediff1d`,
`array_equiv`, `compress`, `extract`, `choose`, `resize`, `rollaxis`, `trim_zeros`, `vander`, `block`,
`put_along_axis`, `put`, `place`, `packbits`/`unpackbits`, `iterable`."""
from __future__ import annotations

import math
import operator
from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis, staged
from tinyjax.numpy._elementwise import as_array
from tinyjax.trace.core import ConcretizationTypeError, Tracer


def _concrete(name: str, x: Any, hint: str) -> np.ndarray:
  """The host value of `x`, or ConcretizationTypeError under a transformation."""
  if isinstance(x, Tracer):
    raise ConcretizationTypeError(f"{name}: a concrete value is needed here, got a traced array of shape "
                                  f"{x.shape}; {hint}")
  return np.asarray(x)


def diagflat(v: Any, k: int = 0) -> Array:
  """A 2-D array with the flattened `v` on its `k` diagonal (shape (n + |k|, n + |k|), n = v.size)."""
  from tinyjax import numpy as jnp
  return jnp.diag(jnp.ravel(as_array(v, "diagflat")), operator.index(k))


@staged()
def ediff1d(ary: Any, to_end: Any = None, to_begin: Any = None) -> Array:
  """The differences of the flattened `ary` (x[1:] - x[:-1]) between the flattened `to_begin` and `to_end`, all
  in `ary`'s dtype."""
  from tinyjax import numpy as jnp
  x = jnp.ravel(as_array(ary, "ediff1d"))
  result = x[1:] - x[:-1]
  if to_begin is not None: result = jnp.concatenate([jnp.ravel(as_array(to_begin, "ediff1d")).astype(x.dtype), result])
  if to_end is not None: result = jnp.concatenate([result, jnp.ravel(as_array(to_end, "ediff1d")).astype(x.dtype)])
  return result


def array_equiv(a1: Any, a2: Any) -> Array:
  """Whether the arrays broadcast together and are equal everywhere (a bool scalar; NaN is unequal)."""
  from tinyjax import numpy as jnp
  x, y = jnp.asarray(a1), jnp.asarray(a2)
  try:
    jnp.broadcast_shapes(x.shape, y.shape)
  except ValueError:
    return jnp.asarray(False)
  return jnp.all(x == y)


def compress(condition: Any, a: Any, axis: int | None = None, *, size: int | None = None, fill_value: Any = 0,
             out: None = None) -> Array:
  """The slices of `a` along `axis` (flattened `a` without one) where the 1-d `condition` is true. The result's
  length depends on the values: under jit pass `size=` (the result padded with `fill_value` or cut to that)."""
  from tinyjax import numpy as jnp
  if out is not None: raise NotImplementedError("The 'out' argument to jnp.compress is not supported.")
  mask = jnp.asarray(condition).astype(bool)
  if mask.ndim != 1: raise ValueError("condition must be a 1D array")
  array = jnp.ravel(jnp.asarray(a)) if axis is None else jnp.moveaxis(jnp.asarray(a), axis, 0)
  length = array.shape[0]
  mask, extra = mask[:length], mask[length:]
  if extra.shape[0] and not isinstance(extra, Tracer) and bool(jnp.any(extra)):
    raise ValueError("condition contains entries that are out of bounds")
  array = array[:mask.shape[0]]
  if size is None:
    positions = jnp.asarray(np.flatnonzero(_concrete("compress", mask, "pass size= (and fill_value=)")))
    result = array[positions.astype(np.int32)]
  else:
    size = operator.index(size)
    if not 0 <= size <= array.shape[0]:
      raise ValueError("size must be positive and not greater than the size of the array axis; got "
                       f"size={size} for a.shape[axis]={array.shape[0]}")
    (positions,) = jnp.nonzero(mask, size=size, fill_value=array.shape[0])
    result = jnp.take(array, positions, axis=0, mode="fill", fill_value=fill_value)
  return result if axis is None else jnp.moveaxis(result, 0, axis)


def extract(condition: Any, arr: Any, *, size: int | None = None, fill_value: Any = 0) -> Array:
  """The elements of the flattened `arr` where the flattened `condition` is true (`size=` as in `compress`)."""
  from tinyjax import numpy as jnp
  return compress(jnp.ravel(jnp.asarray(condition)), jnp.ravel(jnp.asarray(arr)), size=size, fill_value=fill_value)


def choose(a: Any, choices: Sequence[Any], out: None = None, mode: str = "raise") -> Array:
  """choices[a[i]][i] for every i, `a` and the choices broadcast together. mode "raise" checks that the indices
  are in [0, len(choices)) (it needs concrete indices: under jit use "wrap" or "clip")."""
  from tinyjax import numpy as jnp
  if out is not None: raise NotImplementedError("The 'out' argument to jnp.choose is not supported.")
  index = as_array(a, "choose")
  choices = [as_array(c, "choose") for c in choices]
  if not dtypes.is_integer(index.dtype): raise ValueError("`a` array must be integer typed")
  count = len(choices)
  if mode == "raise":
    host = _concrete("choose", index, "jnp.choose was jit-compiled with mode='raise'. Use mode='wrap' or "
                     "mode='clip' instead.")
    if np.any((host < 0) | (host >= count)): raise ValueError("invalid entry in choice array")
  elif mode == "wrap": index = index % count
  elif mode == "clip": index = jnp.clip(index, 0, count - 1)
  else: raise ValueError(f"mode={mode!r} not understood. Must be 'raise', 'wrap', or 'clip'")
  index, *choices = jnp.broadcast_arrays(index, *choices)
  stacked = jnp.stack(choices)
  stacked = stacked.astype(stacked.dtype)  # (strongly typed, as JAX's)
  return jnp.take_along_axis(stacked, index[None], axis=0)[0]


def resize(a: Any, new_shape: int | Sequence[int]) -> Array:
  """The flattened `a` repeated (or cut) to fill `new_shape` (zeros if `a` is empty)."""
  from tinyjax import numpy as jnp
  x = jnp.ravel(as_array(a, "resize"))
  shape = (operator.index(new_shape),) if np.ndim(new_shape) == 0 else tuple(operator.index(d) for d in new_shape)
  if any(d < 0 for d in shape): raise ValueError("all elements of `new_shape` must be non-negative")
  size = math.prod(shape)
  if x.size == 0 or size == 0: return jnp.zeros(shape, x.dtype)
  return jnp.reshape(jnp.tile(x, -(-size // x.size))[:size], shape)


def rollaxis(a: Any, axis: int, start: int = 0) -> Array:
  """`a` with `axis` moved to lie before `start` (numpy's older form of `moveaxis`)."""
  from tinyjax import numpy as jnp
  x = as_array(a, "rollaxis")
  axis = canonicalize_axis(axis, x.ndim)
  start = operator.index(start)
  if not -x.ndim <= start <= x.ndim: raise ValueError(f"start={start} must satisfy {-x.ndim}<=start<={x.ndim}")
  if start < 0: start += x.ndim
  if start > axis: start -= 1
  return jnp.moveaxis(x, axis, start)


def trim_zeros(filt: Any, trim: str = "fb", axis: int | Sequence[int] | None = None) -> Array:
  """`filt` without its leading ('f' in `trim`) and trailing ('b') zeros along each axis in `axis` (all by
  default; an axis is trimmed where every element across the other axes is zero). The result's shape depends on
  the values, so `filt` must be concrete (not traced)."""
  x = as_array(filt, "trim_zeros")
  host = _concrete("trim_zeros", x, "trim_zeros needs a concrete `filt` (its result's shape depends on it)")
  axes = range(x.ndim) if axis is None else [canonicalize_axis(a, x.ndim) for a in np.atleast_1d(axis)]
  trim = trim.lower()
  if "f" not in trim and "b" not in trim: return x
  slices = [slice(None)] * x.ndim
  for ax in axes:
    mask = np.any(host != 0, axis=tuple(i for i in range(x.ndim) if i != ax))
    if not mask.any():
      slices[ax] = slice(0, 0)
      continue
    start = int(mask.argmax()) if "f" in trim else None
    stop = x.shape[ax] - int(mask[::-1].argmax()) if "b" in trim else None
    slices[ax] = slice(start, stop)
  return x[tuple(slices)]


def vander(x: Any, N: int | None = None, increasing: bool = False) -> Array:  # noqa: N803 (numpy's name)
  """The Vandermonde matrix of the 1-d `x`: column j is x ** (N - 1 - j) (x ** j if `increasing`); N defaults
  to len(x). The dtype is x's."""
  from tinyjax import numpy as jnp
  v = as_array(x, "vander")
  if v.ndim != 1: raise ValueError("x must be a one-dimensional array")
  if v.dtype == np.bool_:
    raise TypeError("vander does not accept dtype bool: use an integer, floating or complex array")
  columns = v.shape[0] if N is None else operator.index(N)
  if columns < 0: raise ValueError("N must be nonnegative")
  powers = jnp.arange(columns, dtype=v.dtype)
  if not increasing: powers = (columns - 1) - powers
  return jnp.power(v[:, None], powers[None, :])


def _block(xs: Any) -> tuple[Array, int]:
  """The blocks of one nesting level joined along the axis of that depth, and the depth below."""
  from tinyjax import numpy as jnp
  if isinstance(xs, tuple): raise ValueError(f"jax.numpy.block does not allow tuples, got {xs}")
  if not isinstance(xs, list): return jnp.asarray(xs), 1
  if not xs: raise ValueError("jax.numpy.block does not allow empty list arguments")
  blocks, depths = zip(*(_block(x) for x in xs))
  if any(d != depths[0] for d in depths[1:]): raise ValueError("Mismatched list depths in jax.numpy.block")
  rank = max(depths[0], max(b.ndim for b in blocks))
  blocks = [jnp.reshape(b, (1,) * (rank - b.ndim) + b.shape) for b in blocks]
  return jnp.concatenate(blocks, axis=-depths[0]), depths[0] + 1


def block(arrays: Any) -> Array:
  """An array assembled from nested lists of blocks: the innermost lists join along the last axis, the next ones
  along the second last, ... (every block raised to the common number of dimensions first)."""
  return _block(arrays)[0]


def put_along_axis(arr: Any, indices: Any, values: Any, axis: int | None, inplace: bool = True, *,
                   mode: str | None = None) -> Array:
  """A copy of `arr` with `values` written at `indices` along `axis` (the counterpart of `take_along_axis`; the
  flattened `arr` without an axis). JAX arrays are immutable: `inplace=False` is required."""
  from tinyjax import numpy as jnp
  if inplace:
    raise ValueError("jax.numpy.put_along_axis cannot modify arrays in-place, because JAX arrays are immutable. "
                     "Pass inplace=False to instead return an updated array.")
  x, index, update = (as_array(v, "put_along_axis") for v in (arr, indices, values))
  shape = x.shape
  if axis is None: x, axis = jnp.ravel(x), 0
  if x.ndim != index.ndim:
    raise ValueError(f"put_along_axis arguments 'arr' and 'indices' must have same ndim. Got arr.ndim={x.ndim} and "
                     f"indices.ndim={index.ndim}.")
  if not dtypes.is_integer(index.dtype):
    raise TypeError(f"put_along_axis: indices must be integers, got {index.dtype}")
  try:
    update = jnp.broadcast_to(update, index.shape)
  except ValueError as err:
    raise ValueError("put_along_axis argument 'values' must be broadcastable to 'indices'. Got "
                     f"values.shape={update.shape} and indices.shape={index.shape}.") from err
  axis = canonicalize_axis(axis, x.ndim)
  grid = list(jnp.indices(x.shape, sparse=True))
  grid[axis] = index
  result = x.at[tuple(grid)].set(update, mode=mode)
  return jnp.reshape(result, shape)


def iterable(y: Any) -> bool:
  """Whether `iter(y)` works (False for 0-d arrays and scalars)."""
  try:
    iter(y)
  except TypeError:
    return False
  return True


def _check_bitorder(bitorder: str) -> None:
  if bitorder not in ("little", "big"): raise ValueError("'order' must be either 'little' or 'big'")


def packbits(a: Any, axis: int | None = None, bitorder: str = "big") -> Array:
  """The truth of the elements of `a` packed 8 to a uint8 along `axis` (flattened `a` without one; the last byte
  zero-padded), the first element in the highest bit ("big") or the lowest ("little")."""
  from tinyjax import numpy as jnp
  x = as_array(a, "packbits")
  if x.dtype.kind not in "iub": raise TypeError("Expected an input array of integer or boolean data type")
  _check_bitorder(bitorder)
  bits = (x != 0).astype(np.uint8)
  if axis is None: bits, axis = jnp.ravel(bits), 0
  bits = jnp.swapaxes(bits, axis, -1)
  remainder = bits.shape[-1] % 8
  if remainder: bits = jnp.pad(bits, [(0, 0)] * (bits.ndim - 1) + [(0, 8 - remainder)])
  bits = jnp.reshape(bits, bits.shape[:-1] + (bits.shape[-1] // 8, 8))
  shifts = jnp.arange(8, dtype=np.uint8)
  if bitorder == "big": shifts = shifts[::-1]
  packed = jnp.sum(bits << shifts, axis=-1).astype(np.uint8)
  return jnp.swapaxes(packed, axis, -1)


def unpackbits(a: Any, axis: int | None = None, count: int | None = None, bitorder: str = "big") -> Array:
  """The bits of the uint8 array `a` as a uint8 array of 0s and 1s, 8 per element along `axis` (flattened `a`
  without one), highest bit first ("big") or lowest ("little"); `count` keeps that many (or zero-pads to it)."""
  from tinyjax import numpy as jnp
  x = as_array(a, "unpackbits")
  if x.dtype != np.uint8: raise TypeError("Expected an input array of unsigned byte data type")
  _check_bitorder(bitorder)
  masks = jnp.left_shift(jnp.ones(8, np.uint8), jnp.arange(8, dtype=np.uint8))
  if bitorder == "big": masks = masks[::-1]
  if axis is None: x, axis = jnp.ravel(x), 0
  x = jnp.swapaxes(x, axis, -1)
  bits = ((x[..., None] & masks) > 0).astype(np.uint8)
  bits = jnp.reshape(bits, bits.shape[:-2] + (bits.shape[-1] * bits.shape[-2],))
  if count is not None:
    count = operator.index(count)
    if count > bits.shape[-1]: bits = jnp.pad(bits, [(0, 0)] * (bits.ndim - 1) + [(0, count - bits.shape[-1])])
    else: bits = bits[..., :count]
  return jnp.swapaxes(bits, axis, -1)


def _tiled(values: Array, size: int) -> Array:
  """`values` repeated (or cut) to `size` elements."""
  from tinyjax import numpy as jnp
  return jnp.tile(values, -(-size // values.shape[0]))[:size] if values.shape[0] != size else values


def place(arr: Any, mask: Any, vals: Any, *, inplace: bool = True) -> Array:
  """A copy of `arr` with the positions where `mask` is true set to the flattened `vals` in order (repeated as
  needed). JAX arrays are immutable: `inplace=False` is required."""
  from tinyjax import numpy as jnp
  if inplace:
    raise ValueError("jax.numpy.place cannot modify arrays in-place, because JAX arrays are immutable. Pass "
                     "inplace=False to instead return an updated array.")
  x, where_true, values = (as_array(v, "place") for v in (arr, mask, vals))
  values = jnp.ravel(values)
  if values.shape[0] == 0: raise ValueError("Cannot place values from an empty array")
  flat_mask = jnp.ravel(where_true)
  (positions,) = jnp.nonzero(flat_mask, size=flat_mask.shape[0], fill_value=flat_mask.shape[0])
  return jnp.reshape(jnp.ravel(x).at[positions].set(_tiled(values, positions.shape[0]), mode="drop"), x.shape)


def put(a: Any, ind: Any, v: Any, mode: str | None = None, *, inplace: bool = True) -> Array:
  """A copy of `a` with the flat positions `ind` set to `v` (repeated as needed). Positions go through
  `unravel_index` as in JAX (negative ones count from the end, others past the end clip), or are clipped / wrapped
  first with `mode`. JAX arrays are immutable: `inplace=False` is required."""
  from tinyjax import numpy as jnp
  if inplace:
    raise ValueError("jax.numpy.put cannot modify arrays in-place, because JAX arrays are immutable. Pass "
                     "inplace=False to instead return an updated array.")
  x, index, values = (as_array(value, "put") for value in (a, ind, v))
  index, values = jnp.ravel(index), jnp.ravel(values)
  if not x.size or not index.size or not values.size: return x
  values = _tiled(values, index.shape[0])
  if mode is None: scatter_mode = "drop"
  elif mode == "clip": index, scatter_mode = jnp.clip(index, 0, x.size - 1), "promise_in_bounds"
  elif mode == "wrap": index, scatter_mode = index % x.size, "promise_in_bounds"
  elif mode == "raise": raise NotImplementedError("The 'raise' mode to jnp.put is not supported.")
  else: raise ValueError(f"mode should be one of 'wrap' or 'clip'; got mode={mode!r}")
  return x.at[jnp.unravel_index(index, x.shape)].set(values, mode=scatter_mode)
