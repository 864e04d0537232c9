"""Convolution and windowed reductions: `conv_general_dilated` (any dimension numbers, strides, 'SAME'/'VALID'/
explicit padding, lhs and rhs dilation, feature and batch groups), `conv`, `conv_with_general_padding`,
`conv_transpose`, `conv_dimension_numbers`, and `reduce_window` (sum, max, min, product) with pooling on top.

No conv Op: the windows of the input are a movement view (tinygrad's pooling trick: tile the axis k times, reshape
to (k, n + dilation), slice the strided window starts; a window element is then at index a*dilation + j*stride, folded
to plain strides by the index simplifier), and a convolution is one `dot_general` of that view with the kernel over
(input channels, window), which codegen tiles like a matmul. A padded input is materialised first, so the
contraction reads an ungated buffer. Gradients and vmap come from the movement ops and dot_general.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array
from tinyjax.lax._base import expand_raw, like, reshape_raw, to_array
from tinyjax.lax._reductions import dot_general_raw, reduce_raw, sum_raw
from tinyjax.lax._elementwise import _neg, add, max as lax_max, min as lax_min, mul
from tinyjax.lax._shape import flip_raw, pad, permute_raw, shrink_raw
from tinyjax.trace.core import bind
from tinyjax.uop import Ops


class ConvDimensionNumbers(NamedTuple):
  """Where the batch/feature and spatial axes are: lhs_spec = (batch, feature, spatial...), rhs_spec = (out
  feature, in feature, spatial...), out_spec = (batch, feature, spatial...), each a tuple of axis numbers."""
  lhs_spec: tuple[int, ...]
  rhs_spec: tuple[int, ...]
  out_spec: tuple[int, ...]


def _spec_from_string(spec: str, first: str, second: str) -> tuple[int, ...]:
  if sorted(spec) != sorted(set(spec)) or first not in spec or second not in spec:
    raise ValueError(f"invalid convolution dimension spec {spec!r}: it needs {first!r}, {second!r} and spatial "
                     "letters, each once")
  spatial = [i for i, c in enumerate(spec) if c not in (first, second)]
  return (spec.index(first), spec.index(second), *spatial)


def conv_dimension_numbers(lhs_shape: Sequence[int], rhs_shape: Sequence[int], dimension_numbers: Any
                           ) -> ConvDimensionNumbers:
  """Dimension numbers from None (NC..., OI..., NC...), a triple of strings ('NHWC', 'HWIO', 'NHWC') or numbers."""
  ndim = len(lhs_shape)
  if len(rhs_shape) != ndim:
    raise TypeError(f"convolution requires lhs and rhs of the same rank, got shapes {tuple(lhs_shape)} and "
                    f"{tuple(rhs_shape)}")
  if dimension_numbers is None:
    default = tuple(range(ndim))
    return ConvDimensionNumbers(default, default, default)
  if isinstance(dimension_numbers, ConvDimensionNumbers): return dimension_numbers
  if len(dimension_numbers) != 3: raise TypeError(f"dimension_numbers must be a triple, got {dimension_numbers!r}")
  lhs_spec, rhs_spec, out_spec = dimension_numbers
  if isinstance(lhs_spec, str):
    for spec in (lhs_spec, rhs_spec, out_spec):
      if len(spec) != ndim:
        raise TypeError(f"convolution dimension_numbers {dimension_numbers} must have rank {ndim} specs")
    return ConvDimensionNumbers(_spec_from_string(lhs_spec, "N", "C"), _spec_from_string(rhs_spec, "O", "I"),
                                _spec_from_string(out_spec, "N", "C"))
  return ConvDimensionNumbers(tuple(lhs_spec), tuple(rhs_spec), tuple(out_spec))


def padtype_to_pads(in_shape: Sequence[int], window_shape: Sequence[int], window_strides: Sequence[int],
                    padding: str) -> list[tuple[int, int]]:
  """Explicit (low, high) padding for 'SAME', 'SAME_LOWER' or 'VALID' (as XLA: the output covers ceil(n / stride))."""
  padding = padding.upper()
  if padding == "VALID": return [(0, 0)] * len(in_shape)
  if padding not in ("SAME", "SAME_LOWER"):
    raise ValueError(f"Unknown padding type: {padding}. Use 'SAME', 'SAME_LOWER', 'VALID' or explicit pairs.")
  pads = []
  for size, window, stride in zip(in_shape, window_shape, window_strides):
    out = -(-size // stride)
    total = max((out - 1) * stride + window - size, 0)
    low = total // 2 if padding == "SAME" else -(-total // 2)
    pads.append((low, total - low))
  return pads


def _windows(x: Array, axes: Sequence[int], sizes: Sequence[int], strides: Sequence[int],
             dilations: Sequence[int]) -> tuple[Array, list[int]]:
  """A movement view of `x` whose axis `axes[i]` (length n) becomes two axes (window position o, window offset k):
  element (j, a) is x[j * stride + a * dilation]. The view has the new axes in place of the old, (o, k) each."""
  out_sizes = []
  for position, (axis, size, stride, dilation) in enumerate(zip(axes, sizes, strides, dilations)):
    axis = axis + position  # every earlier axis became two
    n = x.shape[axis]
    out = (n - dilation * (size - 1) - 1) // stride + 1
    if out <= 0:
      raise ValueError(f"window of size {size} (dilation {dilation}) does not fit an axis of size {n}")
    out_sizes.append(out)
    before, after = x.shape[:axis], x.shape[axis + 1:]
    repeats = -(-size * (n + dilation) // n)
    tiled = expand_raw(reshape_raw(x, (*before, 1, n, *after)), (*before, repeats, n, *after))
    tiled = reshape_raw(tiled, (*before, repeats * n, *after))
    full = [(0, d) for d in tiled.shape]
    full[axis] = (0, size * (n + dilation))
    rows = reshape_raw(shrink_raw(tiled, full), (*before, size, n + dilation, *after))
    bounds = [(0, d) for d in rows.shape]
    bounds[axis + 1] = (0, out * stride)
    rows = shrink_raw(rows, bounds)
    rows = reshape_raw(rows, (*before, size, out, stride, *after))
    bounds = [(0, d) for d in rows.shape]
    bounds[axis + 2] = (0, 1)
    rows = reshape_raw(shrink_raw(rows, bounds), (*before, size, out, *after))
    order = list(range(rows.ndim))
    order[axis], order[axis + 1] = axis + 1, axis  # (out, size): window position first
    x = permute_raw(rows, order)
  return x, out_sizes


def _materialize(x: Array) -> Array: return bind(Ops.CONTIGUOUS, x, weak_type=x.weak_type)


def conv_general_dilated(lhs: Any, rhs: Any, window_strides: Sequence[int], padding: Any,
                         lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                         dimension_numbers: Any = None, feature_group_count: int = 1, batch_group_count: int = 1,
                         precision: Any = None, preferred_element_type: Any = None) -> Array:
  """General N-d convolution (cross-correlation, as XLA): see the module docstring."""
  lhs, rhs = to_array(lhs), to_array(rhs)
  if lhs.dtype != rhs.dtype:
    raise TypeError(f"lax.conv_general_dilated requires arguments to have the same dtypes, got {lhs.dtype.name}, "
                    f"{rhs.dtype.name}.")
  numbers = conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  n_spatial = lhs.ndim - 2
  if n_spatial < 1: raise TypeError(f"convolution needs at least one spatial dimension, got lhs shape {lhs.shape}")
  strides = tuple(int(s) for s in window_strides)
  lhs_dilation = tuple(lhs_dilation or (1,) * n_spatial)
  rhs_dilation = tuple(rhs_dilation or (1,) * n_spatial)
  for name, values in (("window_strides", strides), ("lhs_dilation", lhs_dilation), ("rhs_dilation", rhs_dilation)):
    if len(values) != n_spatial or any(v < 1 for v in values):
      raise ValueError(f"{name} must have {n_spatial} positive entries, got {values}")
  x = permute_raw(lhs, numbers.lhs_spec)  # (N, C, spatial...)
  w = permute_raw(rhs, numbers.rhs_spec)  # (O, I, spatial...)
  batch, channels = x.shape[:2]
  out_features, in_features = w.shape[:2]
  groups, batch_groups = int(feature_group_count), int(batch_group_count)
  if groups < 1 or channels % groups or out_features % groups:
    raise ValueError(f"feature_group_count={groups} must divide the input features {channels} and the output "
                     f"features {out_features}")
  if channels != in_features * groups:
    raise TypeError(f"conv_general_dilated lhs feature dimension size divided by feature_group_count ({channels} / "
                    f"{groups}) must equal the rhs input feature dimension size {in_features}")
  if batch_groups < 1 or batch % batch_groups or out_features % batch_groups:
    raise ValueError(f"batch_group_count={batch_groups} must divide the batch {batch} and the output features "
                     f"{out_features}")
  if isinstance(padding, str) and any(d != 1 for d in lhs_dilation):
    raise ValueError("String padding is not implemented for transposed convolution using this op. Please either "
                     "exactly specify the required padding or use conv_transpose.")
  if any(d != 1 for d in lhs_dilation):  # transposed convolution: zeros between input elements
    x = pad(x, 0, [(0, 0, 0), (0, 0, 0)] + [(0, 0, d - 1) for d in lhs_dilation])
  kernel = w.shape[2:]
  effective = [(k - 1) * d + 1 for k, d in zip(kernel, rhs_dilation)]
  pads = padtype_to_pads(x.shape[2:], effective, strides, padding) if isinstance(padding, str) else \
    [tuple(int(v) for v in pair) for pair in padding]
  if len(pads) != n_spatial: raise ValueError(f"padding must have {n_spatial} (low, high) pairs, got {padding}")
  if any(p != (0, 0) for p in pads):
    x = _materialize(pad(x, 0, [(0, 0, 0), (0, 0, 0)] + [(lo, hi, 0) for lo, hi in pads]))
  patches, out_sizes = _windows(x, range(2, 2 + n_spatial), kernel, strides, rhs_dilation)
  # patches: (N, C, o1, k1, o2, k2, ...); kernel w: (O, I, k1, k2, ...)
  spatial_k = [3 + 2 * i for i in range(n_spatial)]
  out_dtype = lhs.dtype if preferred_element_type is None else dtypes.canonicalize_dtype(
    dtypes.dtype(preferred_element_type))
  if groups == 1 and batch_groups == 1:
    result = dot_general_raw(patches, w, ((1, *spatial_k), (1, *range(2, 2 + n_spatial))), ((), ()), out_dtype)
    # (N, o..., O) -> (N, O, o...)
    result = permute_raw(result, (0, n_spatial + 1, *range(1, n_spatial + 1)))
  elif batch_groups == 1:
    per_group = channels // groups
    patches = reshape_raw(patches, (batch, groups, per_group, *patches.shape[2:]))
    w = reshape_raw(w, (groups, out_features // groups, in_features, *kernel))
    contract_lhs = (2, *[k + 1 for k in spatial_k])
    result = dot_general_raw(patches, w, (contract_lhs, (2, *range(3, 3 + n_spatial))), ((1,), (0,)), out_dtype)
    # (G, N, o..., O/G) -> (N, G, O/G, o...) -> (N, O, o...)
    result = permute_raw(result, (1, 0, n_spatial + 2, *range(2, n_spatial + 2)))
    result = reshape_raw(result, (batch, out_features, *out_sizes))
  else:
    per_batch = batch // batch_groups
    patches = reshape_raw(patches, (batch_groups, per_batch, *patches.shape[1:]))
    w = reshape_raw(w, (batch_groups, out_features // batch_groups, in_features, *kernel))
    contract_lhs = (2, *[k + 1 for k in spatial_k])
    result = dot_general_raw(patches, w, (contract_lhs, (2, *range(3, 3 + n_spatial))), ((0,), (0,)), out_dtype)
    # (B, N/B, o..., O/B) -> (N/B, B, O/B, o...) -> (N/B, O, o...)
    result = permute_raw(result, (1, 0, n_spatial + 2, *range(2, n_spatial + 2)))
    result = reshape_raw(result, (per_batch, out_features, *out_sizes))
  return permute_raw(result, list(np.argsort(numbers.out_spec)))


def conv(lhs: Any, rhs: Any, window_strides: Sequence[int], padding: Any, precision: Any = None,
         preferred_element_type: Any = None) -> Array:
  """conv_general_dilated with NC... / OI... layouts and no dilation."""
  return conv_general_dilated(lhs, rhs, window_strides, padding, precision=precision,
                              preferred_element_type=preferred_element_type)


def conv_with_general_padding(lhs: Any, rhs: Any, window_strides: Sequence[int], padding: Any,
                              lhs_dilation: Sequence[int] | None, rhs_dilation: Sequence[int] | None,
                              precision: Any = None, preferred_element_type: Any = None) -> Array:
  """conv_general_dilated with NC... / OI... layouts."""
  return conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, precision=precision,
                              preferred_element_type=preferred_element_type)


def _conv_transpose_padding(kernel: int, stride: int, padding: str) -> tuple[int, int]:
  """The padding of the dilated input that makes conv_transpose the gradient of a conv with this padding (JAX's)."""
  if padding == "SAME":
    pad_len = kernel + stride - 2
    low = kernel - 1 if stride > kernel - 1 else int(math.ceil(pad_len / 2))
  elif padding == "VALID":
    pad_len = kernel + stride - 2 + max(kernel - stride, 0)
    low = kernel - 1
  else:
    raise ValueError(f"Padding mode must be `SAME` or `VALID`, got {padding!r}")
  return low, pad_len - low


def conv_transpose(lhs: Any, rhs: Any, strides: Sequence[int], padding: Any, rhs_dilation: Sequence[int] | None = None,
                   dimension_numbers: Any = None, transpose_kernel: bool = False, precision: Any = None,
                   preferred_element_type: Any = None) -> Array:
  """Transposed convolution (the input dilated by `strides`), as jax.lax.conv_transpose; `transpose_kernel` flips
  the kernel's spatial axes and swaps its feature axes (the exact gradient of a conv)."""
  lhs, rhs = to_array(lhs), to_array(rhs)
  ndim = lhs.ndim
  if dimension_numbers is None:
    defaults = {3: ("NHC", "HIO", "NHC"), 4: ("NHWC", "HWIO", "NHWC"), 5: ("NHWDC", "HWDIO", "NHWDC")}
    dimension_numbers = defaults.get(ndim)
    if dimension_numbers is None: raise ValueError(f"conv_transpose needs dimension_numbers for rank {ndim}")
  numbers = conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  kernel_spatial = [rhs.shape[i] for i in numbers.rhs_spec[2:]]
  rhs_dilation = tuple(rhs_dilation or (1,) * (ndim - 2))
  effective = [(k - 1) * d + 1 for k, d in zip(kernel_spatial, rhs_dilation)]
  if isinstance(padding, str):
    pads = [_conv_transpose_padding(k, s, padding.upper()) for k, s in zip(effective, strides)]
  else:
    pads = [tuple(int(v) for v in pair) for pair in padding]
  if transpose_kernel:
    rhs = flip_raw(rhs, list(numbers.rhs_spec[2:]))
    order = list(range(ndim))
    order[numbers.rhs_spec[0]], order[numbers.rhs_spec[1]] = numbers.rhs_spec[1], numbers.rhs_spec[0]
    rhs = permute_raw(rhs, order)
  return conv_general_dilated(lhs, rhs, (1,) * (ndim - 2), pads, strides, rhs_dilation, numbers, precision=precision,
                              preferred_element_type=preferred_element_type)


# ------------------------------------------------------------------------------------------- reduce_window

def _computation_op(computation: Any) -> Ops | str:
  from tinyjax import lax
  from tinyjax import numpy as jnp
  if computation in (lax.add, jnp.add): return Ops.ADD
  if computation in (lax.max, jnp.maximum): return Ops.MAX
  if computation in (lax.min, jnp.minimum): return "min"
  if computation in (lax.mul, jnp.multiply): return Ops.MUL
  raise NotImplementedError(f"reduce_window with computation {computation!r}: tinyjax supports lax.add, lax.max, "
                            "lax.min and lax.mul (and their jnp forms)")


def reduce_window(operand: Any, init_value: Any, computation: Any, window_dimensions: Sequence[int],
                  window_strides: Sequence[int], padding: Any, base_dilation: Sequence[int] | None = None,
                  window_dilation: Sequence[int] | None = None) -> Array:
  """Reduce each window of `operand` (sizes `window_dimensions`, every `window_strides`) with `computation` (add, max,
  min, mul), starting from `init_value` (also what padding and base dilation insert)."""
  x = to_array(operand)
  op = _computation_op(computation)
  ndim = x.ndim
  window = tuple(int(w) for w in window_dimensions)
  strides = tuple(int(s) for s in window_strides)
  base = tuple(base_dilation or (1,) * ndim)
  dilation = tuple(window_dilation or (1,) * ndim)
  for name, values in (("window_dimensions", window), ("window_strides", strides), ("base_dilation", base),
                       ("window_dilation", dilation)):
    if len(values) != ndim or any(v < 1 for v in values):
      raise ValueError(f"reduce_window: {name} must have {ndim} positive entries, got {values}")
  dilated = [(n - 1) * b + 1 if n else 0 for n, b in zip(x.shape, base)]
  effective = [(w - 1) * d + 1 for w, d in zip(window, dilation)]
  pads = padtype_to_pads(dilated, effective, strides, padding) if isinstance(padding, str) else \
    [tuple(int(v) for v in pair) for pair in padding]
  if len(pads) != ndim: raise ValueError(f"reduce_window: padding must have {ndim} pairs, got {padding}")
  if any(p != (0, 0) for p in pads) or any(b != 1 for b in base):
    x = _materialize(pad(x, init_value, [(lo, hi, b - 1) for (lo, hi), b in zip(pads, base)]))
  patches, out_sizes = _windows(x, range(ndim), window, strides, dilation)
  window_axes = tuple(1 + 2 * i for i in range(ndim))
  if op == "min":  # min is the negated max of the negation (ints: of the bitwise complement, which keeps order)
    flipped = bind(Ops.XOR, patches, like(patches, -1)) if patches.dtype.kind in "iu" else _neg(patches)
    reduced = reduce_raw(flipped, Ops.MAX, window_axes)
    reduced = bind(Ops.XOR, reduced, like(reduced, -1)) if patches.dtype.kind in "iu" else _neg(reduced)
  elif op is Ops.ADD:
    reduced = sum_raw(patches, window_axes)  # 16-bit floats accumulate in float32
  else:
    reduced = reduce_raw(patches, op, window_axes)
  result = reshape_raw(reduced, tuple(out_sizes))
  combine = {Ops.ADD: add, Ops.MAX: lax_max, Ops.MUL: mul, "min": lax_min}[op]
  return combine(result, init_value)
