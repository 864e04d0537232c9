"""Layers, pure and small: a layer is an immutable description (sizes and options); its parameters are a pytree.

    layer = nn.Linear(784, 128)
    params = layer.init(key)               # {"w": f32[784, 128], "b": f32[128]}
    y = layer.apply(params, x)             # no hidden state: the same params and x give the same y

`init(key) -> params` and `apply(params, x, ...)` are plain functions of pytrees, so `jit`, `grad`, `vmap` and the
optimizers of `nn.optim` see ordinary dicts of arrays, and checkpoints (`nn.state`) name them by their paths. Layers
with randomness take a key (`Dropout`); layers with running statistics take and return them as a state pytree
(`BatchNorm`). `Sequential` chains layers and plain functions (activations, reshapes): its params are a list, one
entry per layer. Images are channels-last (NHWC), as in JAX's examples; `Conv2d(data_format="NCHW")` takes
channels-first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import lax, random
from tinyjax import numpy as jnp
from tinyjax.array import Array
from tinyjax.nn import initializers
from tinyjax.nn.functions import dot_product_attention

Params = Any
Initializer = Callable[..., Array]


def _check_features(name: str, x: Array, axis: int, expected: int) -> None:
  if x.ndim == 0 or x.shape[axis] != expected:
    raise ValueError(f"{name} expects inputs with {expected} features on axis {axis}, got shape {tuple(x.shape)}")


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
  pair = (int(value), int(value)) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
  if len(pair) != 2: raise ValueError(f"{name} must be an int or a pair, got {value!r}")
  return pair


@dataclass(frozen=True)
class Linear:
  """y = x @ w + b over the last axis: w (in_features, out_features), b (out_features,)."""
  in_features: int
  out_features: int
  use_bias: bool = True
  w_init: Initializer = field(default_factory=initializers.lecun_normal)
  b_init: Initializer = initializers.zeros
  dtype: Any = jnp.float32

  def init(self, key: Any) -> Params:
    params = {"w": self.w_init(key, (self.in_features, self.out_features), self.dtype)}
    if self.use_bias: params["b"] = self.b_init(random.fold_in(key, 1), (self.out_features,), self.dtype)
    return params

  def apply(self, params: Params, x: Any) -> Array:
    x = jnp.asarray(x)
    _check_features("Linear", x, -1, self.in_features)
    y = x @ params["w"]
    return y + params["b"] if self.use_bias else y


@dataclass(frozen=True)
class Conv2d:
  """A 2-d convolution: w (kh, kw, in_channels / groups, out_channels) (HWIO), b (out_channels,). Inputs are
  (N, H, W, C) (or (N, C, H, W) with data_format="NCHW"); padding "SAME", "VALID" or explicit pairs."""
  in_channels: int
  out_channels: int
  kernel_size: int | Sequence[int]
  stride: int | Sequence[int] = 1
  padding: Any = "SAME"
  dilation: int | Sequence[int] = 1
  groups: int = 1
  use_bias: bool = True
  data_format: str = "NHWC"
  w_init: Initializer = field(default_factory=initializers.lecun_normal)
  b_init: Initializer = initializers.zeros
  dtype: Any = jnp.float32

  def __post_init__(self) -> None:
    if self.data_format not in ("NHWC", "NCHW"):
      raise ValueError(f"Conv2d: data_format must be 'NHWC' or 'NCHW', got {self.data_format!r}")
    if self.in_channels % self.groups or self.out_channels % self.groups:
      raise ValueError(f"Conv2d: groups={self.groups} must divide in_channels={self.in_channels} and "
                       f"out_channels={self.out_channels}")

  def init(self, key: Any) -> Params:
    kh, kw = _pair(self.kernel_size, "kernel_size")
    params = {"w": self.w_init(key, (kh, kw, self.in_channels // self.groups, self.out_channels), self.dtype)}
    if self.use_bias: params["b"] = self.b_init(random.fold_in(key, 1), (self.out_channels,), self.dtype)
    return params

  def apply(self, params: Params, x: Any) -> Array:
    x = jnp.asarray(x)
    if x.ndim != 4:
      raise ValueError(f"Conv2d expects 4-d inputs ({self.data_format}), got shape {tuple(x.shape)}; add a batch "
                       "axis with x[None] for a single image")
    channel_axis = 3 if self.data_format == "NHWC" else 1
    _check_features("Conv2d", x, channel_axis, self.in_channels)
    y = lax.conv_general_dilated(x, params["w"], _pair(self.stride, "stride"), self.padding,
                                 rhs_dilation=_pair(self.dilation, "dilation"),
                                 dimension_numbers=(self.data_format, "HWIO", self.data_format),
                                 feature_group_count=self.groups)
    if not self.use_bias: return y
    return y + (params["b"] if channel_axis == 3 else params["b"][:, None, None])


@dataclass(frozen=True)
class LayerNorm:
  """Normalise over the last axis to zero mean and unit variance, then scale and shift: scale, bias (features,)."""
  features: int
  eps: float = 1e-5
  use_scale: bool = True
  use_bias: bool = True
  dtype: Any = jnp.float32

  def init(self, key: Any = None) -> Params:
    params = {}
    if self.use_scale: params["scale"] = jnp.ones((self.features,), self.dtype)
    if self.use_bias: params["bias"] = jnp.zeros((self.features,), self.dtype)
    return params

  def apply(self, params: Params, x: Any) -> Array:
    x = jnp.asarray(x)
    _check_features("LayerNorm", x, -1, self.features)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * lax.rsqrt(variance + self.eps)
    if self.use_scale: y = y * params["scale"]
    return y + params["bias"] if self.use_bias else y


@dataclass(frozen=True)
class RMSNorm:
  """x / sqrt(mean(x^2) + eps) over the last axis, times scale (features,)."""
  features: int
  eps: float = 1e-6
  dtype: Any = jnp.float32

  def init(self, key: Any = None) -> Params:
    return {"scale": jnp.ones((self.features,), self.dtype)}

  def apply(self, params: Params, x: Any) -> Array:
    x = jnp.asarray(x)
    _check_features("RMSNorm", x, -1, self.features)
    return x * lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps) * params["scale"]


@dataclass(frozen=True)
class BatchNorm:
  """Batch normalisation over every axis but the last (channels-last). Its running statistics are a state pytree:
  `params, state = bn.init(key)`, then `y, state = bn.apply(params, state, x, train=True)` normalises with the batch's
  statistics and returns the updated running mean and variance (new = momentum * old + (1 - momentum) * batch);
  `train=False` uses the running statistics and returns the state unchanged."""
  features: int
  momentum: float = 0.9
  eps: float = 1e-5
  dtype: Any = jnp.float32

  def init(self, key: Any = None) -> tuple[Params, Params]:
    params = {"scale": jnp.ones((self.features,), self.dtype), "bias": jnp.zeros((self.features,), self.dtype)}
    state = {"mean": jnp.zeros((self.features,), self.dtype), "var": jnp.ones((self.features,), self.dtype)}
    return params, state

  def apply(self, params: Params, state: Params, x: Any, train: bool = False) -> tuple[Array, Params]:
    x = jnp.asarray(x)
    _check_features("BatchNorm", x, -1, self.features)
    if train:
      axes = tuple(range(x.ndim - 1))
      mean = jnp.mean(x, axis=axes)
      variance = jnp.mean(jnp.square(x - mean), axis=axes)
      count = math.prod(x.shape[:-1])
      unbiased = variance * (count / max(count - 1, 1))
      state = {"mean": self.momentum * state["mean"] + (1 - self.momentum) * lax.stop_gradient(mean),
               "var": self.momentum * state["var"] + (1 - self.momentum) * lax.stop_gradient(unbiased)}
    else:
      mean, variance = state["mean"], state["var"]
    y = (x - mean) * lax.rsqrt(variance + self.eps) * params["scale"] + params["bias"]
    return y, state


@dataclass(frozen=True)
class Embedding:
  """Rows of a table (num_embeddings, features) looked up by integer ids; `attend` is the transposed use (logits of
  x against every row, for tied output layers)."""
  num_embeddings: int
  features: int
  table_init: Initializer = field(default_factory=lambda: initializers.variance_scaling(1.0, "fan_in", "normal",
                                                                                         out_axis=0))
  dtype: Any = jnp.float32

  def init(self, key: Any) -> Params:
    return {"table": self.table_init(key, (self.num_embeddings, self.features), self.dtype)}

  def apply(self, params: Params, ids: Any) -> Array:
    ids = jnp.asarray(ids)
    if ids.dtype.kind not in "iu":
      raise TypeError(f"Embedding expects integer ids, got {ids.dtype}; use attend() for float inputs")
    return jnp.take(params["table"], ids, axis=0, mode="clip")

  def attend(self, params: Params, x: Any) -> Array:
    return jnp.asarray(x) @ params["table"].T


@dataclass(frozen=True)
class MultiHeadAttention:
  """Multi-head attention: linear projections of the queries (from x) and keys / values (from `context`, default x)
  into num_heads heads of features // num_heads, `nn.dot_product_attention` per head (a boolean `mask` broadcastable
  to (batch, heads, T, S), `causal`), and an output projection. Inputs (batch, length, features)."""
  features: int
  num_heads: int
  causal: bool = False
  use_bias: bool = True
  dtype: Any = jnp.float32

  def __post_init__(self) -> None:
    if self.features % self.num_heads:
      raise ValueError(f"MultiHeadAttention: num_heads={self.num_heads} must divide features={self.features}")

  def _projection(self) -> Linear:
    return Linear(self.features, self.features, self.use_bias, dtype=self.dtype)

  def init(self, key: Any) -> Params:
    keys = random.split(key, 4)
    return {name: self._projection().init(k) for name, k in zip(("query", "key", "value", "out"), keys)}

  def apply(self, params: Params, x: Any, context: Any = None, mask: Any = None) -> Array:
    x = jnp.asarray(x)
    context = x if context is None else jnp.asarray(context)
    if x.ndim != 3 or context.ndim != 3:
      raise ValueError(f"MultiHeadAttention expects (batch, length, features) inputs, got {tuple(x.shape)} and "
                       f"{tuple(context.shape)}")
    projection = self._projection()
    head_dim = self.features // self.num_heads

    def heads(name: str, value: Array) -> Array:
      y = projection.apply(params[name], value)
      return jnp.reshape(y, y.shape[:-1] + (self.num_heads, head_dim))
    attended = dot_product_attention(heads("query", x), heads("key", context), heads("value", context), mask=mask,
                                     is_causal=self.causal)
    return projection.apply(params["out"], jnp.reshape(attended, x.shape[:-1] + (self.features,)))


@dataclass(frozen=True)
class Dropout:
  """Zero each element with probability `rate` and scale the rest by 1 / (1 - rate), with the given key; without a
  key or with `deterministic=True` it is the identity. No parameters (init returns {})."""
  rate: float

  def __post_init__(self) -> None:
    if not 0.0 <= self.rate < 1.0: raise ValueError(f"Dropout: rate must be in [0, 1), got {self.rate}")

  def init(self, key: Any = None) -> Params:
    return {}

  def apply(self, params: Params, x: Any, *, key: Any = None, deterministic: bool = False) -> Array:
    x = jnp.asarray(x)
    if deterministic or self.rate == 0.0: return x
    if key is None:
      raise ValueError("Dropout needs a key when it is not deterministic: apply(params, x, key=key), or pass "
                       "deterministic=True for evaluation")
    keep = random.bernoulli(key, 1.0 - self.rate, x.shape)
    return jnp.where(keep, x / (1.0 - self.rate), 0).astype(x.dtype)


def max_pool(x: Any, window_shape: Sequence[int], strides: Sequence[int] | None = None,
             padding: Any = "VALID") -> Array:
  """Max pooling over the spatial axes of channels-last inputs (N, *spatial, C) (as flax.linen.max_pool)."""
  return _pool(x, -jnp.inf, lax.max, window_shape, strides, padding)


def avg_pool(x: Any, window_shape: Sequence[int], strides: Sequence[int] | None = None,
             padding: Any = "VALID") -> Array:
  """Average pooling over the spatial axes of (N, *spatial, C) inputs (padding counts as zeros, as flax's default)."""
  window_shape = tuple(window_shape)
  return _pool(x, 0.0, lax.add, window_shape, strides, padding) / math.prod(window_shape)


def _pool(x: Any, init: Any, op: Callable, window_shape: Sequence[int], strides: Sequence[int] | None,
          padding: Any) -> Array:
  x = jnp.asarray(x)
  window_shape = tuple(int(w) for w in window_shape)
  strides = window_shape if strides is None else tuple(int(s) for s in strides)
  if x.ndim != len(window_shape) + 2:
    raise ValueError(f"pooling a {len(window_shape)}-d window expects (N, *spatial, C) inputs of rank "
                     f"{len(window_shape) + 2}, got shape {tuple(x.shape)}")
  pads = padding if isinstance(padding, str) else ((0, 0), *padding, (0, 0))
  return lax.reduce_window(x, init, op, (1, *window_shape, 1), (1, *strides, 1), pads)


def flatten(x: Any) -> Array:
  """(N, ...) -> (N, prod(...)): the usual step from convolutions to dense layers."""
  x = jnp.asarray(x)
  return jnp.reshape(x, (x.shape[0], -1))


@dataclass(frozen=True)
class Sequential:
  """Layers applied in order. Entries are layers (with init / apply) or plain functions of x (activations,
  `flatten`, pooling with fixed arguments). params is a list with one entry per entry ({} for functions). A key given
  to apply is split among the layers that take one (Dropout); `deterministic` is passed to them."""
  layers: tuple

  def __init__(self, *layers: Any) -> None:
    object.__setattr__(self, "layers", tuple(layers))
    for layer in self.layers:
      if isinstance(layer, BatchNorm):
        raise TypeError("Sequential does not thread BatchNorm's state; call bn.apply(params, state, x, train) "
                        "between the parts of the model")
      if not callable(layer) and not hasattr(layer, "apply"):
        raise TypeError(f"Sequential entries must be layers or functions, got {layer!r}")

  def init(self, key: Any) -> Params:
    keys = random.split(key, max(len(self.layers), 1))
    return [layer.init(k) if hasattr(layer, "init") else {} for layer, k in zip(self.layers, keys)]

  def apply(self, params: Params, x: Any, *, key: Any = None, deterministic: bool = False) -> Any:
    if len(params) != len(self.layers):
      raise ValueError(f"Sequential has {len(self.layers)} layers but params has {len(params)} entries")
    keys = random.split(key, len(self.layers)) if key is not None else [None] * len(self.layers)
    for layer, layer_params, layer_key in zip(self.layers, params, keys):
      if isinstance(layer, Dropout): x = layer.apply(layer_params, x, key=layer_key, deterministic=deterministic)
      elif hasattr(layer, "apply"): x = layer.apply(layer_params, x)
      else: x = layer(x)
    return x
