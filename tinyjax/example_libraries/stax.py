"""JAX's stax: a layer is a pair `(init_fun, apply_fun)`; `init_fun(rng, input_shape) -> (output_shape, params)` and
`apply_fun(params, inputs, **kwargs) -> outputs`. Combinators (`serial`, `parallel`) build networks from layers.

    init_fun, predict = stax.serial(stax.Dense(512), stax.Relu, stax.Dense(10), stax.LogSoftmax)
    out_shape, params = init_fun(rng, (-1, 784))

Images are NHWC by default (`GeneralConv` takes any dimension numbers). `Dropout(rate)` keeps each input with
probability `rate` (stax's convention) and needs `rng=` when applying in "train" mode.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

from tinyjax import lax, random
from tinyjax import numpy as jnp
from tinyjax.nn import functions as nn_functions
from tinyjax.nn.functions import (elu, gelu, leaky_relu, log_softmax, relu, selu, sigmoid, softmax, softplus,  # noqa: F401
                                  standardize)
from tinyjax.nn.initializers import glorot_normal, normal, ones, zeros
from tinyjax.trace.jit import ShapeDtypeStruct, eval_shape

# the functions and aliases stax code calls by stax's names (JAX's examples: `stax.logsoftmax(logits)`)
glorot = glorot_normal
randn = normal
logsoftmax = log_softmax


# ---------------------------------------------------------------------------------------------------------------------
# layers with parameters

def Dense(out_dim: int, W_init: Callable = glorot_normal(), b_init: Callable = normal()):  # noqa: N802, N803
  """A fully connected layer: inputs @ W + b over the last axis."""
  def init_fun(rng, input_shape):
    output_shape = tuple(input_shape[:-1]) + (out_dim,)
    k1, k2 = random.split(rng)
    return output_shape, (W_init(k1, (input_shape[-1], out_dim)), b_init(k2, (out_dim,)))

  def apply_fun(params, inputs, **kwargs):
    W, b = params  # noqa: N806
    return jnp.dot(inputs, W) + b
  return init_fun, apply_fun


def _conv_output_shape(input_shape, kernel_shape, strides, padding, dimension_numbers, dilation=None):
  batch_shape = tuple(1 if d < 0 else d for d in input_shape)  # (-1: any batch size)
  out = eval_shape(lambda x, w: lax.conv_general_dilated(x, w, strides, padding, rhs_dilation=dilation,
                                                         dimension_numbers=dimension_numbers),
                   ShapeDtypeStruct(batch_shape, jnp.float32), ShapeDtypeStruct(tuple(kernel_shape), jnp.float32))
  return tuple(-1 if i == dimension_numbers[0].index("N") and input_shape[i] < 0 else d
               for i, d in enumerate(out.shape)) if isinstance(dimension_numbers[0], str) else tuple(out.shape)


def GeneralConv(dimension_numbers, out_chan: int, filter_shape: Sequence[int], strides=None, padding="VALID",  # noqa: N802
                W_init: Callable | None = None, b_init: Callable = normal(1e-6)):  # noqa: N803
  """A convolution with any dimension numbers (lhs, rhs, out specs such as ("NHWC", "HWIO", "NHWC"))."""
  lhs_spec, rhs_spec, out_spec = dimension_numbers
  one = (1,) * len(filter_shape)
  strides = tuple(strides or one)
  W_init = W_init or glorot_normal(rhs_spec.index("I"), rhs_spec.index("O"))  # noqa: N806

  def init_fun(rng, input_shape):
    sizes = iter(filter_shape)
    kernel_shape = [out_chan if c == "O" else input_shape[lhs_spec.index("C")] if c == "I" else next(sizes)
                    for c in rhs_spec]
    output_shape = _conv_output_shape(input_shape, kernel_shape, strides, padding, dimension_numbers)
    bias_shape = [out_chan if c == "C" else 1 for c in out_spec]
    k1, k2 = random.split(rng)
    return output_shape, (W_init(k1, kernel_shape), b_init(k2, bias_shape))

  def apply_fun(params, inputs, **kwargs):
    W, b = params  # noqa: N806
    return lax.conv_general_dilated(inputs, W, strides, padding, one, one, dimension_numbers=dimension_numbers) + b
  return init_fun, apply_fun


Conv = functools.partial(GeneralConv, ("NHWC", "HWIO", "NHWC"))
Conv1D = functools.partial(GeneralConv, ("NHC", "HIO", "NHC"))


def BatchNorm(axis=(0, 1, 2), epsilon: float = 1e-5, center: bool = True, scale: bool = True,  # noqa: N802
              beta_init: Callable = zeros, gamma_init: Callable = ones):
  """Normalise over `axis` with the batch's statistics, then scale (gamma) and shift (beta)."""
  axis = (axis,) if isinstance(axis, int) else tuple(axis)

  def init_fun(rng, input_shape):
    shape = tuple(d for i, d in enumerate(input_shape) if i not in axis)
    k1, k2 = random.split(rng)
    beta = beta_init(k1, shape) if center else ()
    gamma = gamma_init(k2, shape) if scale else ()
    return input_shape, (beta, gamma)

  def apply_fun(params, x, **kwargs):
    beta, gamma = params
    expand = tuple(None if i in axis else slice(None) for i in range(jnp.ndim(x)))
    z = nn_functions.standardize(x, axis, epsilon=epsilon)
    if center and scale: return gamma[expand] * z + beta[expand]
    if center: return z + beta[expand]
    if scale: return gamma[expand] * z
    return z
  return init_fun, apply_fun


# ---------------------------------------------------------------------------------------------------------------------
# layers without parameters

def elementwise(fun: Callable, **fun_kwargs):
  """A layer applying `fun` to its input."""
  def init_fun(rng, input_shape): return input_shape, ()

  def apply_fun(params, inputs, **kwargs): return fun(inputs, **fun_kwargs)
  return init_fun, apply_fun


Tanh = elementwise(jnp.tanh)
Relu = elementwise(nn_functions.relu)
Exp = elementwise(jnp.exp)
LogSoftmax = elementwise(nn_functions.log_softmax, axis=-1)
Softmax = elementwise(nn_functions.softmax, axis=-1)
Softplus = elementwise(nn_functions.softplus)
Sigmoid = elementwise(nn_functions.sigmoid)
Elu = elementwise(nn_functions.elu)
LeakyRelu = elementwise(nn_functions.leaky_relu)
Selu = elementwise(nn_functions.selu)
Gelu = elementwise(nn_functions.gelu)


def _pooling_layer(reducer: Callable, init_val: Any, average: bool = False):
  def PoolingLayer(window_shape: Sequence[int], strides=None, padding="VALID", spec=None):  # noqa: N802
    """Pooling over the spatial axes of (N, ..., C) inputs (or those the `spec` string names)."""
    window_shape = tuple(window_shape)
    strides = tuple(strides or (1,) * len(window_shape))

    def layout(ndim):
      if spec is None: return tuple(range(1, ndim - 1))
      return tuple(i for i, c in enumerate(spec) if c not in "NC")

    def full(ndim, spatial, values, fill):
      out = [fill] * ndim
      for axis, value in zip(spatial, values): out[axis] = value
      return tuple(out)

    def init_fun(rng, input_shape):
      spatial = layout(len(input_shape))
      dims, steps = full(len(input_shape), spatial, window_shape, 1), full(len(input_shape), spatial, strides, 1)
      batch_shape = tuple(1 if d < 0 else d for d in input_shape)
      out = eval_shape(lambda x: lax.reduce_window(x, init_val, reducer, dims, steps, padding),
                       ShapeDtypeStruct(batch_shape, jnp.float32))
      return tuple(-1 if d < 0 else o for d, o in zip(input_shape, out.shape)), ()

    def apply_fun(params, inputs, **kwargs):
      spatial = layout(inputs.ndim)
      dims, steps = full(inputs.ndim, spatial, window_shape, 1), full(inputs.ndim, spatial, strides, 1)
      out = lax.reduce_window(inputs, init_val, reducer, dims, steps, padding)
      if not average: return out
      if padding == "VALID": return out / math.prod(window_shape)
      counts = lax.reduce_window(jnp.ones(inputs.shape, inputs.dtype), 0.0, lax.add, dims, steps, padding)
      return out / counts
    return init_fun, apply_fun
  return PoolingLayer


MaxPool = _pooling_layer(lax.max, -jnp.inf)
SumPool = _pooling_layer(lax.add, 0.0)
AvgPool = _pooling_layer(lax.add, 0.0, average=True)


def _flatten_init(rng, input_shape):
  return (input_shape[0], math.prod(input_shape[1:])), ()


def _flatten_apply(params, inputs, **kwargs):
  return jnp.reshape(inputs, (inputs.shape[0], -1))


Flatten = (_flatten_init, _flatten_apply)
Identity = (lambda rng, input_shape: (input_shape, ()), lambda params, inputs, **kwargs: inputs)


def FanOut(num: int):  # noqa: N802
  """The input repeated `num` times (a list), for `parallel` branches."""
  return (lambda rng, input_shape: ([input_shape] * num, ()), lambda params, inputs, **kwargs: [inputs] * num)


FanInSum = (lambda rng, input_shape: (input_shape[0], ()), lambda params, inputs, **kwargs: sum(inputs[1:], inputs[0]))


def FanInConcat(axis: int = -1):  # noqa: N802
  """The list of inputs concatenated along `axis`."""
  def init_fun(rng, input_shape):
    ax = axis % len(input_shape[0])
    concat_size = sum(shape[ax] for shape in input_shape)
    return tuple(input_shape[0][:ax]) + (concat_size,) + tuple(input_shape[0][ax + 1:]), ()

  def apply_fun(params, inputs, **kwargs): return jnp.concatenate(inputs, axis)
  return init_fun, apply_fun


def Dropout(rate: float, mode: str = "train"):  # noqa: N802
  """Keep each input with probability `rate` (scaled by 1 / rate) in "train" mode (needs `rng=`); identity in
  "test" mode."""
  def init_fun(rng, input_shape): return input_shape, ()

  def apply_fun(params, inputs, **kwargs):
    rng = kwargs.get("rng", None)
    if mode != "train": return inputs
    if rng is None:
      raise ValueError("Dropout in train mode needs a PRNG key: apply_fun(params, inputs, rng=key); use "
                       "Dropout(rate, mode='test') for evaluation")
    keep = random.bernoulli(rng, rate, inputs.shape)
    return jnp.where(keep, inputs / rate, 0)
  return init_fun, apply_fun


# ---------------------------------------------------------------------------------------------------------------------
# combinators

def serial(*layers):
  """Layers applied in sequence; params is a list of the layers' params. An `rng=` given to apply is split among
  the layers."""
  init_funs, apply_funs = zip(*layers) if layers else ((), ())

  def init_fun(rng, input_shape):
    params = []
    for init in init_funs:
      rng, layer_rng = random.split(rng)
      input_shape, param = init(layer_rng, input_shape)
      params.append(param)
    return input_shape, params

  def apply_fun(params, inputs, **kwargs):
    rng = kwargs.pop("rng", None)
    rngs = random.split(rng, len(apply_funs)) if rng is not None else [None] * len(apply_funs)
    for fun, param, layer_rng in zip(apply_funs, params, rngs):
      inputs = fun(param, inputs, rng=layer_rng, **kwargs)
    return inputs
  return init_fun, apply_fun


def parallel(*layers):
  """Layers applied to the matching entries of a list of inputs; outputs a list."""
  init_funs, apply_funs = zip(*layers) if layers else ((), ())

  def init_fun(rng, input_shape):
    rngs = random.split(rng, len(init_funs))
    shapes_params = [init(r, shape) for init, r, shape in zip(init_funs, rngs, input_shape)]
    return [s for s, _ in shapes_params], [p for _, p in shapes_params]

  def apply_fun(params, inputs, **kwargs):
    rng = kwargs.pop("rng", None)
    rngs = random.split(rng, len(apply_funs)) if rng is not None else [None] * len(apply_funs)
    return [f(p, x, rng=r, **kwargs) for f, p, x, r in zip(apply_funs, params, inputs, rngs)]
  return init_fun, apply_fun


def shape_dependent(make_layer: Callable):
  """A layer built from the input's shape (`make_layer(input_shape) -> layer`)."""
  def init_fun(rng, input_shape): return make_layer(input_shape)[0](rng, input_shape)

  def apply_fun(params, inputs, **kwargs): return make_layer(inputs.shape)[1](params, inputs, **kwargs)
  return init_fun, apply_fun
