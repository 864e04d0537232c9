"""Activations and helpers of jax.nn: relu, gelu, silu, sigmoid, softplus, softmax, log_softmax, logsumexp, one_hot,
standardize and a few more, with JAX's values and derivatives.

Built from tinyjax.numpy and tinyjax.lax. Where JAX attaches a derivative of its own (relu's 0 at 0, softplus's
sigmoid), the function is a Primitive with that JVP rule; softmax and logsumexp subtract a `stop_gradient`ed maximum
for stability, so their derivatives are those of the plain formulas.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax import numpy as tnp
from tinyjax.array import Array
from tinyjax.lax import _elementwise as ew
from tinyjax.lax._base import canonicalize_axes, full, like, staged
from tinyjax.lax._shape import iota_along, stop_gradient
from tinyjax.trace import ad, batching
from tinyjax.trace.core import Primitive

Axis = int | Sequence[int] | None


def _float_operand(x: Any, name: str) -> Array:
  """x as an array of a float dtype (integers and bools move to the default float dtype, as jax.nn does)."""
  array = tnp.asarray(x)
  if not dtypes.is_floating(array.dtype): array = array.astype(dtypes.to_inexact_dtype(array.dtype))
  return array


# ---------------------------------------------------------------------------------------------- activations

relu_p = Primitive("relu", lambda x: ew.max_p.bind(x, like(x, 0)))
ad.defjvp(relu_p, lambda t, out, x: ew._where(ew._lt(like(out, 0), out), t, like(t, 0)))  # 0 at x == 0, as JAX


def relu(x: Any) -> Array:
  """Rectified linear unit max(x, 0), elementwise. Its derivative at 0 is 0 (as JAX)."""
  return relu_p.bind(tnp.asarray(x))


@staged()
def relu6(x: Any) -> Array:
  """min(max(x, 0), 6), elementwise; as JAX, the derivative is 1 strictly inside (0, 6) and 0 elsewhere."""
  x = tnp.asarray(x)
  clipped = tnp.minimum(tnp.maximum(x, 0), 6)
  return tnp.where(tnp.logical_and(x > 0, x < 6), x, stop_gradient(clipped))


def sigmoid(x: Any) -> Array:
  """Logistic sigmoid 1 / (1 + exp(-x)), elementwise (lax.logistic)."""
  return ew.logistic_p.bind(_float_operand(x, "sigmoid"))


def _softplus_impl(x: Array) -> Array:
  """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|)) (NaN stays NaN)."""
  return ew._add(ew.max_p.bind(x, like(x, 0)), ew.log1p_p.bind(ew.exp_p.bind(ew._neg(ew.abs_p.bind(x)))))


softplus_p = Primitive("softplus", _softplus_impl)
ad.defjvp(softplus_p, lambda t, out, x: ew._mul(t, ew.logistic_p.bind(x)))  # sigmoid, smooth at 0


def softplus(x: Any) -> Array:
  """log(1 + exp(x)), elementwise and stable for large |x|; its derivative is sigmoid(x)."""
  return softplus_p.bind(_float_operand(x, "softplus"))


@staged()
def silu(x: Any) -> Array:
  """x * sigmoid(x), elementwise (also called swish)."""
  x = _float_operand(x, "silu")
  return x * sigmoid(x)


swish = silu


@staged(static_argnames=("approximate",))
def gelu(x: Any, approximate: bool = True) -> Array:
  """Gaussian error linear unit. approximate=True (JAX's default) is the tanh form
  x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); approximate=False the exact x/2 (1 + erf(x / sqrt(2)))."""
  x = _float_operand(x, "gelu")
  if not approximate:
    from tinyjax.lax._special import erf
    return x * (0.5 * (1.0 + erf(x * full((), 1 / math.sqrt(2), x.dtype))))  # (a strongly typed constant)
  inner = math.sqrt(2 / math.pi) * (x + 0.044715 * (x ** 3))
  return x * (0.5 * (1.0 + tnp.tanh(inner)))


@staged()
def selu(x: Any) -> Array:
  """Scaled ELU: scale * elu(x, alpha) with the self-normalising constants (alpha 1.6733, scale 1.0507)."""
  alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
  return scale * elu(x, alpha)


@staged()
def celu(x: Any, alpha: float = 1.0) -> Array:
  """Continuously differentiable ELU: max(x, 0) + alpha * min(expm1(x / alpha), 0)."""
  x = _float_operand(x, "celu")
  return tnp.maximum(x, 0.0) + alpha * tnp.expm1(tnp.minimum(x, 0.0) / alpha)


@staged()
def log_sigmoid(x: Any) -> Array:
  """log(sigmoid(x)) = -softplus(-x), stable for large |x|."""
  return -softplus(-_float_operand(x, "log_sigmoid"))


@staged()
def hard_tanh(x: Any) -> Array:
  """-1 below -1, 1 above 1, x between."""
  x = _float_operand(x, "hard_tanh")
  return tnp.where(x > 1, 1.0, tnp.where(x < -1, -1.0, x))


@staged()
def hard_sigmoid(x: Any) -> Array:
  """relu6(x + 3) / 6."""
  return relu6(_float_operand(x, "hard_sigmoid") + 3.0) / 6.0


@staged()
def hard_silu(x: Any) -> Array:
  """x * hard_sigmoid(x) (also called hard_swish)."""
  x = _float_operand(x, "hard_silu")
  return x * hard_sigmoid(x)


hard_swish = hard_silu


@staged(static_argnames=("axis",))
def glu(x: Any, axis: int = -1) -> Array:
  """Gated linear unit: the first half of `axis` times the sigmoid of the second half."""
  x = tnp.asarray(x)
  size = x.shape[axis]
  if size % 2: raise ValueError(f"glu requires an even size along axis {axis}, got {size}")
  first, second = tnp.split(x, 2, axis=axis)
  return first * sigmoid(second)


@staged()
def leaky_relu(x: Any, negative_slope: float = 1e-2) -> Array:
  """x where x >= 0, else negative_slope * x."""
  x = _float_operand(x, "leaky_relu")
  return tnp.where(x >= 0, x, negative_slope * x)


@staged()
def elu(x: Any, alpha: float = 1.0) -> Array:
  """x where x > 0, else alpha * (exp(x) - 1) (computed on the clipped input, so no overflow in the unused branch)."""
  x = _float_operand(x, "elu")
  safe = tnp.where(x > 0, 0.0, x)
  return tnp.where(x > 0, x, alpha * tnp.expm1(safe))


def tanh(x: Any) -> Array:
  """Hyperbolic tangent, elementwise."""
  return tnp.tanh(x)


@staged()
def mish(x: Any) -> Array:
  """x * tanh(softplus(x))."""
  x = _float_operand(x, "mish")
  return x * tnp.tanh(softplus(x))


@staged()
def squareplus(x: Any, b: Any = 4) -> Array:
  """(x + sqrt(x^2 + b)) / 2, a smooth ReLU."""
  x = _float_operand(x, "squareplus")
  return (x + tnp.sqrt(tnp.square(x) + b)) / 2


@staged()
def soft_sign(x: Any) -> Array:
  """x / (|x| + 1)."""
  x = _float_operand(x, "soft_sign")
  return x / (tnp.abs(x) + 1)


@staged()
def sparse_plus(x: Any) -> Array:
  """0 for x <= -1, x for x >= 1, (x + 1)^2 / 4 between."""
  x = _float_operand(x, "sparse_plus")
  return tnp.where(x <= -1.0, 0.0, tnp.where(x >= 1.0, x, (x + 1.0) ** 2 / 4)).astype(x.dtype)


@staged()
def sparse_sigmoid(x: Any) -> Array:
  """clip((x + 1) / 2, 0, 1): the derivative of sparse_plus."""
  x = _float_operand(x, "sparse_sigmoid")
  return 0.5 * tnp.clip(x + 1.0, 0.0, 2.0)


@staged()
def log1mexp(x: Any) -> Array:
  """log(1 - exp(-x)) for x > 0, stably (expm1 below log 2, log1p above)."""
  x = _float_operand(x, "log1mexp")
  return tnp.where(x < math.log(2.0), tnp.log(-tnp.expm1(-x)), tnp.log1p(-tnp.exp(-x)))


def identity(x: Any) -> Array:
  """x itself."""
  return tnp.asarray(x)


# ---------------------------------------------------------------------------------------------- normalisers

def _stable_max(x: Array, axis: Axis) -> Array:
  """The maximum along axis (kept), replaced by 0 where it is not finite, outside differentiation."""
  x_max = tnp.max(x, axis=axis, keepdims=True)
  return stop_gradient(tnp.where(tnp.isfinite(x_max), x_max, 0).astype(x.dtype))


def logsumexp(a: Any, axis: Axis = None, b: Any = None, keepdims: bool = False, return_sign: bool = False) -> Any:
  """log(sum(b * exp(a))) over `axis` (None: all), computed stably by subtracting the maximum. With `return_sign`,
  returns (log|sum|, sign(sum)); otherwise a negative weighted sum gives NaN."""
  a = _float_operand(a, "logsumexp")
  if b is None and not return_sign:  # (one primitive: see `softmax_p`)
    return logsumexp_p.bind(a, axis=canonicalize_axes(axis, a.ndim), keepdims=bool(keepdims))
  return _logsumexp(a, axis, b, keepdims, return_sign)


def _logsumexp(a: Array, axis: Axis, b: Any, keepdims: bool, return_sign: bool) -> Any:
  if b is not None:
    b = tnp.asarray(b)
    a, b = tnp.broadcast_arrays(a, b.astype(a.dtype))
  shift = _stable_max(a, axis)
  exponentials = tnp.exp(a - shift)
  if b is not None: exponentials = exponentials * b
  total = tnp.sum(exponentials, axis=axis, keepdims=True)
  sign = tnp.sign(total)
  magnitude = tnp.abs(total) if return_sign else total
  out = tnp.log(magnitude) + shift
  if not keepdims:
    axes = tuple(range(a.ndim)) if axis is None else (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out, sign = tnp.squeeze(out, axes), tnp.squeeze(sign, axes)
  return (out, stop_gradient(sign)) if return_sign else out


@staged(static_argnames=("axis", "keepdims"))
def logmeanexp(x: Any, axis: Axis = None, where: Any = None, keepdims: bool = False) -> Array:
  """log(mean(exp(x))) over `axis` (the elements where `where` holds), stably: logsumexp - log(count)."""
  x = _float_operand(x, "logmeanexp")
  if where is not None:
    where = tnp.broadcast_to(tnp.asarray(where), x.shape)
    x = tnp.where(where, x, -tnp.inf)
    count = tnp.sum(where, axis=axis, keepdims=keepdims).astype(x.dtype)
  else:
    axes = tuple(range(x.ndim)) if axis is None else (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    count = float(np.prod([x.shape[a] for a in axes]))
  return logsumexp(x, axis=axis, keepdims=keepdims) - tnp.log(count)


def log_softmax(x: Any, axis: Axis = -1) -> Array:
  """x - logsumexp(x) along `axis`, stably: the shift by the maximum is outside differentiation."""
  x = _float_operand(x, "log_softmax")
  return log_softmax_p.bind(x, axis=canonicalize_axes(axis, x.ndim))


def _log_softmax(x: Array, *, axis: tuple[int, ...]) -> Array:
  shifted = x - _stable_max(x, axis)
  return shifted - tnp.log(tnp.sum(tnp.exp(shifted), axis=axis, keepdims=True))


def softmax(x: Any, axis: Axis = -1) -> Array:
  """exp(x) / sum(exp(x)) along `axis`, stably (the maximum is subtracted first)."""
  x = _float_operand(x, "softmax")
  return softmax_p.bind(x, axis=canonicalize_axes(axis, x.ndim))


def _softmax(x: Array, *, axis: tuple[int, ...]) -> Array:
  unnormalized = tnp.exp(x - _stable_max(x, axis))
  return unnormalized / tnp.sum(unnormalized, axis=axis, keepdims=True)


# softmax, log_softmax and logsumexp are primitives without rules of their own: an eager call is one node (trace/core.py
# `stage_call`; `softmax(x)` of 64 floats built 17 nodes through ~40 jnp calls, 96 us, and read back took 157 us
# against JAX's 30), and their decompositions are what is lowered, differentiated and batched.
softmax_p = Primitive("softmax", _softmax)
log_softmax_p = Primitive("log_softmax", _log_softmax)
logsumexp_p = Primitive("logsumexp", lambda a, *, axis, keepdims: _logsumexp(a, axis, None, keepdims, False))


@staged(static_argnames=("axis", "epsilon"))
def standardize(x: Any, axis: Axis = -1, mean: Any = None, variance: Any = None, epsilon: float = 1e-5) -> Array:
  """(x - mean) / sqrt(variance + epsilon) along `axis`; mean and variance (E[x^2] - E[x]^2, as JAX) are computed
  when not given."""
  x = _float_operand(x, "standardize")
  if mean is None: mean = tnp.mean(x, axis=axis, keepdims=True)
  if variance is None: variance = tnp.mean(tnp.square(x), axis=axis, keepdims=True) - tnp.square(mean)
  return (x - mean) * ew.rsqrt(tnp.asarray(variance) + epsilon)


@staged(static_argnames=("num_classes", "dtype", "axis"))
def one_hot(x: Any, num_classes: int, *, dtype: Any = None, axis: int = -1) -> Array:
  """A one-hot encoding of the integer array x: a new axis of size `num_classes` at `axis` holding 1 at index x and
  0 elsewhere (all 0 for out-of-range values). dtype defaults to the default float dtype."""
  x = tnp.asarray(x)
  out_dtype = dtypes.default_float_dtype() if dtype is None else dtypes.check_user_dtype_supported(dtype, "one_hot")
  num_classes = int(num_classes)
  axis = axis % (x.ndim + 1)
  expanded = tnp.expand_dims(x, axis)
  out_shape = expanded.shape[:axis] + (num_classes,) + expanded.shape[axis + 1:]
  classes = iota_along(x.dtype if x.dtype.kind in "iu" else dtypes.default_int_dtype(), out_shape, axis)
  return (tnp.broadcast_to(expanded, out_shape) == classes.astype(x.dtype)).astype(out_dtype)


batching.defelementwise(relu_p, softplus_p)


# ---------------------------------------------------------------------------------------------- attention

def _as_4d(x: Any) -> Array:
  x = tnp.asarray(x)
  return tnp.reshape(x, (1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x


def dot_product_attention(query: Any, key: Any, value: Any, bias: Any = None, mask: Any = None, *,
                          scale: float | None = None, is_causal: bool = False, query_seq_lengths: Any = None,
                          key_value_seq_lengths: Any = None, local_window_size: int | tuple[int, int] | None = None,
                          implementation: str | None = None, return_residual: bool = False) -> Any:
  """softmax(Q K^T * scale + bias, masked) V per head, as jax.nn's: query (B, T, N, H) or (T, N, H), key and value
  (B, S, K, H) with N a multiple of K (grouped-query attention), bias / boolean mask broadcastable to (B, N, T, S),
  `is_causal` (query t sees keys s <= t), sequence lengths and a local window masking the rest. Logits and the softmax
  are float32 (at least); masked logits get a large negative value, not -inf, as JAX."""
  if implementation not in (None, "xla"):
    raise ValueError(f"dot_product_attention: implementation {implementation!r} is not available in tinyjax; use "
                     "None or 'xla'")
  output_shape = tnp.asarray(query).shape
  q, k, v = _as_4d(query), _as_4d(key), _as_4d(value)
  batch, source, kv_heads, head_dim = k.shape
  if v.shape != k.shape: raise ValueError(f"value shape should be {k.shape}: but got {v.shape}")
  if q.ndim != 4 or q.shape[0] != batch or q.shape[3] != head_dim:
    raise ValueError(f"query shape should be ({batch}, T, N, {head_dim}): but got {q.shape}")
  if q.dtype != k.dtype or v.dtype != k.dtype:
    raise ValueError(f"query, key and value must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
  target, heads = q.shape[1], q.shape[2]
  if heads % kv_heads:
    raise ValueError(f"the number of query heads ({heads}) must be a multiple of the key/value heads ({kv_heads})")
  groups = heads // kv_heads
  scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
  logits_dtype = tnp.promote_types(q.dtype, np.float32)
  # (B, T, K, G, H) x (B, S, K, H) -> (B, K, G, T, S)
  grouped = tnp.reshape(q, (batch, target, kv_heads, groups, head_dim))
  logits = tnp.einsum("btkgh,bskh->bkgts", grouped, k, preferred_element_type=logits_dtype)
  logits = logits * tnp.asarray(scale, logits.dtype)

  def per_head(x: Any, name: str) -> Array:  # (B|1, N|1, T, S) -> broadcastable to (B, K, G, T, S)
    x = _as_4d(x)
    if x.shape[1] == 1: return tnp.expand_dims(x, 2)
    if x.shape[1] != heads: raise ValueError(f"{name} must have 1 or {heads} heads, got shape {x.shape}")
    return tnp.reshape(x, (x.shape[0], kv_heads, groups) + x.shape[2:])
  if bias is not None: logits = (logits + per_head(bias, "bias")).astype(logits.dtype)
  keep = None
  if mask is not None:
    mask = tnp.asarray(mask)
    if mask.dtype != np.bool_: raise ValueError(f"mask dtype should be bool, but got {mask.dtype}")
    keep = per_head(mask, "mask")
  rows = tnp.arange(target)[:, None]
  cols = tnp.arange(source)[None, :]
  if is_causal: keep = (rows >= cols) if keep is None else keep & (rows >= cols)
  if local_window_size is not None:
    left, right = (local_window_size, local_window_size) if isinstance(local_window_size, int) else local_window_size
    window = (cols >= rows - left) & (cols <= rows + right)
    keep = window if keep is None else keep & window
  if query_seq_lengths is not None or key_value_seq_lengths is not None:
    lengths = tnp.ones((batch, 1, 1, target, source), bool)
    if query_seq_lengths is not None:
      lengths = lengths & (rows < tnp.asarray(query_seq_lengths)[:, None, None, None, None])
    if key_value_seq_lengths is not None:
      lengths = lengths & (cols < tnp.asarray(key_value_seq_lengths)[:, None, None, None, None])
    keep = lengths if keep is None else keep & lengths
  if keep is not None:
    large_negative = -0.7 * min(float(np.finfo(logits.dtype).max), float(np.finfo(np.float32).max))
    logits = tnp.where(keep, logits, tnp.asarray(large_negative, logits.dtype))
  logits = logits.astype(np.float32) if logits.dtype.itemsize < 4 else logits
  probs = softmax(logits, axis=-1).astype(k.dtype)
  encoded = tnp.einsum("bkgts,bskh->btkgh", probs, v)
  encoded = tnp.reshape(encoded, (batch, target, heads, head_dim))
  if query_seq_lengths is not None:
    encoded = encoded * (tnp.arange(target)[None, :, None, None] <
                         tnp.asarray(query_seq_lengths)[:, None, None, None]).astype(encoded.dtype)
  encoded = tnp.reshape(encoded, output_shape)
  if not return_residual: return encoded
  residual = logsumexp(logits, axis=-1)  # (B, K, G, T)
  residual = tnp.reshape(tnp.moveaxis(residual, -1, 1), (batch, target, heads)).astype(k.dtype)
  return encoded, stop_gradient(tnp.reshape(residual, output_shape[:-1]))
