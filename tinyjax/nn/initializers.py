"""tinyjax.nn.initializers: jax.nn.initializers. Each builder returns `init(key, shape, dtype) -> array`, with JAX's
formulas, so the same key gives JAX's parameters (the samplers are tinyjax.random's, bit-exact with JAX's)."""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import dtypes, random
from tinyjax import numpy as jnp

Initializer = Callable[..., Any]
_TRUNCATED_NORMAL_STDDEV = 0.87962566103423978  # stddev of the standard normal truncated to (-2, 2)


def _float_dtype(dtype: Any) -> np.dtype:
  return dtypes.canonicalize_dtype(dtypes.dtype(dtypes.default_float_dtype() if dtype is None else dtype))


def zeros(key: Any, shape: Sequence[int], dtype: Any = None) -> Any:
  """An array of zeros (the key is unused)."""
  return jnp.zeros(shape, _float_dtype(dtype))


def ones(key: Any, shape: Sequence[int], dtype: Any = None) -> Any:
  """An array of ones (the key is unused)."""
  return jnp.ones(shape, _float_dtype(dtype))


def constant(value: Any, dtype: Any = None) -> Initializer:
  """An initializer filling arrays with `value`."""
  def init(key: Any, shape: Sequence[int], dtype: Any = dtype) -> Any:
    return jnp.full(shape, value, dtype=_float_dtype(dtype))
  return init


def uniform(scale: float = 1e-2, dtype: Any = None) -> Initializer:
  """Uniform in [0, scale)."""
  def init(key: Any, shape: Sequence[int], dtype: Any = dtype) -> Any:
    dtype = _float_dtype(dtype)
    return random.uniform(key, shape, dtype) * jnp.array(scale, dtype)
  return init


def normal(stddev: float = 1e-2, dtype: Any = None) -> Initializer:
  """Normal with mean 0 and standard deviation `stddev`."""
  def init(key: Any, shape: Sequence[int], dtype: Any = dtype) -> Any:
    dtype = _float_dtype(dtype)
    return random.normal(key, shape, dtype) * jnp.array(stddev, dtype)
  return init


def truncated_normal(stddev: float = 1e-2, dtype: Any = None, lower: float = -2.0, upper: float = 2.0) -> Initializer:
  """`stddev` times a standard normal truncated to (lower, upper)."""
  def init(key: Any, shape: Sequence[int], dtype: Any = dtype) -> Any:
    dtype = _float_dtype(dtype)
    return random.truncated_normal(key, lower, upper, shape, dtype) * jnp.array(stddev, dtype)
  return init


def _fans(shape: tuple[int, ...], in_axis: Any, out_axis: Any, batch_axis: Any) -> tuple[float, float]:
  """Effective input and output sizes of a weight: the in/out axes times the receptive field (the other axes)."""
  if isinstance(in_axis, int) and in_axis == -2 and len(shape) <= 1:
    raise ValueError(f"Can't compute input and output sizes of a {len(shape)}-dimensional weights tensor with default "
                     "in_axis. Must be at least 2D or specify in_axis explicitly.")
  def size(axes: Any) -> int: return shape[axes] if isinstance(axes, int) else math.prod(shape[i] for i in axes)
  in_size, out_size, batch_size = size(in_axis), size(out_axis), size(batch_axis)
  receptive_field = math.prod(shape) / in_size / out_size / batch_size
  return in_size * receptive_field, out_size * receptive_field


def variance_scaling(scale: float, mode: str, distribution: str, in_axis: int | Sequence[int] = -2,
                     out_axis: int | Sequence[int] = -1, batch_axis: Sequence[int] = (),
                     dtype: Any = None) -> Initializer:
  """Samples whose variance is `scale` / fan (`mode`: "fan_in", "fan_out", "fan_avg", "fan_geo_avg") from a
  "truncated_normal", "normal" or "uniform" `distribution`."""
  def init(key: Any, shape: Sequence[int], dtype: Any = dtype) -> Any:
    shape = tuple(int(d) for d in shape)
    dtype = _float_dtype(dtype)
    fan_in, fan_out = _fans(shape, in_axis, out_axis, batch_axis)
    if mode == "fan_in": denominator = fan_in
    elif mode == "fan_out": denominator = fan_out
    elif mode == "fan_avg": denominator = (fan_in + fan_out) / 2
    elif mode == "fan_geo_avg": denominator = (fan_in * fan_out) ** 0.5
    else: raise ValueError(f"invalid mode for variance scaling initializer: {mode}")
    variance = jnp.array(scale / denominator, dtype=dtype)
    if distribution == "truncated_normal":
      stddev = jnp.sqrt(variance) / jnp.array(_TRUNCATED_NORMAL_STDDEV, dtype)
      return random.truncated_normal(key, -2, 2, shape, dtype) * stddev
    if distribution == "normal": return random.normal(key, shape, dtype) * jnp.sqrt(variance)
    if distribution == "uniform": return random.uniform(key, shape, dtype, -1) * jnp.sqrt(3 * variance)
    raise ValueError(f"invalid distribution for variance scaling initializer: {distribution}")
  return init


def glorot_uniform(in_axis: Any = -2, out_axis: Any = -1, batch_axis: Any = (), dtype: Any = None) -> Initializer:
  return variance_scaling(1.0, "fan_avg", "uniform", in_axis, out_axis, batch_axis, dtype)


def glorot_normal(in_axis: Any = -2, out_axis: Any = -1, batch_axis: Any = (), dtype: Any = None) -> Initializer:
  return variance_scaling(1.0, "fan_avg", "truncated_normal", in_axis, out_axis, batch_axis, dtype)


def lecun_uniform(in_axis: Any = -2, out_axis: Any = -1, batch_axis: Any = (), dtype: Any = None) -> Initializer:
  return variance_scaling(1.0, "fan_in", "uniform", in_axis, out_axis, batch_axis, dtype)


def lecun_normal(in_axis: Any = -2, out_axis: Any = -1, batch_axis: Any = (), dtype: Any = None) -> Initializer:
  return variance_scaling(1.0, "fan_in", "truncated_normal", in_axis, out_axis, batch_axis, dtype)


def he_uniform(in_axis: Any = -2, out_axis: Any = -1, batch_axis: Any = (), dtype: Any = None) -> Initializer:
  return variance_scaling(2.0, "fan_in", "uniform", in_axis, out_axis, batch_axis, dtype)


def he_normal(in_axis: Any = -2, out_axis: Any = -1, batch_axis: Any = (), dtype: Any = None) -> Initializer:
  return variance_scaling(2.0, "fan_in", "truncated_normal", in_axis, out_axis, batch_axis, dtype)


xavier_uniform, xavier_normal = glorot_uniform, glorot_normal
kaiming_uniform, kaiming_normal = he_uniform, he_normal


def orthogonal(scale: float = 1.0, column_axis: int = -1, dtype: Any = None) -> Initializer:
  """Orthogonal matrices (orthonormal along `column_axis` or across it, whichever side is smaller) times `scale`,
  from `random.orthogonal` (as JAX: the other axes are flattened into the rows)."""
  def init(key: Any, shape: Sequence[int], dtype: Any = dtype) -> Any:
    dtype = dtypes.default_float_dtype() if dtype is None else dtype
    shape = tuple(int(d) for d in shape)
    if len(shape) < 2: raise ValueError("orthogonal initializer requires at least a 2D shape")
    if any(d == 0 for d in shape): return jnp.zeros(shape, dtype)
    rows, columns = math.prod(shape) // shape[column_axis], shape[column_axis]
    q = random.orthogonal(key, rows, (), dtype, columns)
    q = jnp.reshape(q, tuple(np.delete(shape, column_axis)) + (columns,))
    return jnp.asarray(scale, dtype) * jnp.moveaxis(q, -1, column_axis)
  return init


def delta_orthogonal(scale: float = 1.0, column_axis: int = -1, dtype: Any = None) -> Initializer:
  """Convolution kernels (k, in, out), (k, k, in, out) or (k, k, k, in, out) that are zero except at the window's
  centre, an orthogonal (in, out) matrix there (Xiao et al.; as JAX)."""
  def init(key: Any, shape: Sequence[int], dtype: Any = dtype) -> Any:
    dtype = dtypes.default_float_dtype() if dtype is None else dtype
    shape = tuple(int(d) for d in shape)
    if len(shape) not in (3, 4, 5): raise ValueError("Delta orthogonal initializer requires a 3D, 4D or 5D shape.")
    if shape[-1] < shape[-2]: raise ValueError("`fan_in` must be less or equal than `fan_out`. ")
    matrix = orthogonal(scale, column_axis, dtype)(key, shape[-2:])
    centre = tuple((k - 1) // 2 for k in shape[:-2])
    return jnp.zeros(shape, dtype).at[centre].set(matrix)
  return init


__all__ = ["constant", "delta_orthogonal", "glorot_normal", "glorot_uniform", "he_normal", "he_uniform",
           "kaiming_normal", "kaiming_uniform", "lecun_normal", "lecun_uniform", "normal", "ones", "orthogonal",
           "truncated_normal", "uniform", "variance_scaling", "xavier_normal", "xavier_uniform", "zeros"]
