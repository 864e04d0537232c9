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
from tinyjax.helpers import LazyModule
from tinyjax.lax._base import cast, expand_raw, full, like, reshape_raw, to_array
from tinyjax.lax._reductions import dot_general_raw, reduce_raw, sum_raw
from tinyjax.lax._elementwise import _neg, add, max as lax_max, min as lax_min, mul
from tinyjax.lax._shape import (concatenate, flip_raw, interleave_raw, pad, pad_raw, permute_raw, shrink_raw,
                               strided_slice_raw)
from tinyjax.trace import ad
from tinyjax.trace.control_flow import BodyTrace
from tinyjax.trace.core import Primitive, StagingTracer, bind, current_trace
from tinyjax.uop import Ops, UOp

_opt = LazyModule("tinyjax.codegen.opt")  # (codegen's tile model, which `import tinyjax` need not load)


class ConvDimensionNumbers(NamedTuple):
  """Where the batch/feature and spatial axes are: lhs_spec = (batch, feature, spatial...), rhs_spec = (out
  feature, in feature, spatial...), out_spec = (batch, feature, spatial...), each a tuple of axis numbers."""
  lhs_spec: tuple[int, ...]
  rhs_spec: tuple[int, ...]
  out_spec: tuple[int, ...]


def _spec_from_string(spec: str, first: str, second: str, spatial: str) -> tuple[int, ...]:
  """Axis numbers (first, second, spatial...) of a spec string, the spatial axes in the order of `spatial` (the
  kernel spec's, as JAX)."""
  if len(set(spec)) != len(spec) or set(spec) != {first, second, *spatial}:
    raise ValueError(f"invalid convolution dimension spec {spec!r}: it needs {first!r}, {second!r} and the spatial "
                     f"letters {spatial!r}, each once")
  return (spec.index(first), spec.index(second), *(spec.index(c) for c in spatial))


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
    spatial = "".join(c for c in rhs_spec if c not in "OI")
    return ConvDimensionNumbers(_spec_from_string(lhs_spec, "N", "C", spatial),
                                _spec_from_string(rhs_spec, "O", "I", spatial),
                                _spec_from_string(out_spec, "N", "C", spatial))
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
    out, disjoint = _window_count(n, size, stride, dilation)
    if out <= 0:
      raise ValueError(f"window of size {size} (dilation {dilation}) does not fit an axis of size {n}")
    out_sizes.append(out)
    before, after = x.shape[:axis], x.shape[axis + 1:]
    if disjoint:
      # windows that don't overlap (or a single one: a global pooling): each is a block of the axis cut into
      # `stride`-long pieces (pad / shrink and reshapes only, so the transpose, a pooling gradient, is a cheap copy
      # instead of the tiled view's sums)
      if out == 1: stride = (size - 1) * dilation + 1
      x = _cut(x, axis, out * stride)
      x = reshape_raw(x, (*before, out, stride, *after))
      x = _cut(x, axis + 1, size * dilation)  # the window elements, `dilation` apart
      x = reshape_raw(x, (*before, out, size, dilation, *after))
      bounds = [(0, d) for d in x.shape]
      bounds[axis + 2] = (0, 1)
      x = reshape_raw(shrink_raw(x, bounds), (*before, out, size, *after))
      continue
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


def _window_count(n: int, size: int, stride: int, dilation: int) -> tuple[int, bool]:
  """How many windows fit an axis of length n, and whether they are disjoint (or just one): then `_windows` cuts the
  axis into blocks instead of tiling it."""
  out = (n - dilation * (size - 1) - 1) // stride + 1
  return out, stride >= (size - 1) * dilation + 1 or out == 1


def _phased_windows(x: Array, axes: Sequence[int], sizes: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int]) -> Array:
  """`_windows(x, ...)[0]` built for its transpose: an axis whose windows overlap is reshaped into (rows, stride) and
  materialised, and window offset a is the slice of it starting at row a * dilation // stride, column
  a * dilation % stride. Transposed (a max-pool gradient), every offset's cotangent is shifted into that layout and
  summed there, in one kernel over (rows, stride): plain strides, where the tiled view's transpose divides by the axis
  length per element (ResNet-50's first max pool: 75 ms, 3.6 GFLOP/s)."""
  for position, (axis, size, stride, dilation) in enumerate(zip(axes, sizes, strides, dilations)):
    axis = axis + position  # every earlier axis became two
    out, disjoint = _window_count(x.shape[axis], size, stride, dilation)
    if disjoint:
      x, _ = _windows(x, [axis], [size], [stride], [dilation])
      continue
    before, after = x.shape[:axis], x.shape[axis + 1:]
    rows = out + (size - 1) * dilation // stride
    grid = _materialize(reshape_raw(_cut(x, axis, rows * stride), (*before, rows, stride, *after)))
    pieces = []
    for offset in range(size):
      row, column = divmod(offset * dilation, stride)
      bounds = [(0, d) for d in grid.shape]
      bounds[axis], bounds[axis + 1] = (row, row + out), (column, column + 1)
      pieces.append(shrink_raw(grid, bounds))  # (..., out, 1, ...)
    x = concatenate(pieces, axis + 1)
  return x


def _cut(x: Array, axis: int, length: int) -> Array:
  """x with `axis` shrunk or zero-padded at its end to `length`."""
  n = x.shape[axis]
  if length == n: return x
  if length < n:
    bounds = [(0, d) for d in x.shape]
    bounds[axis] = (0, length)
    return shrink_raw(x, bounds)
  padding = [(0, 0)] * x.ndim
  padding[axis] = (0, length - n)
  return pad_raw(x, padding)


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
  lhs_dilation = tuple(int(d) for d in (lhs_dilation or (1,) * n_spatial))
  rhs_dilation = tuple(int(d) for d in (rhs_dilation or (1,) * n_spatial))
  for name, values in (("window_strides", strides), ("lhs_dilation", lhs_dilation), ("rhs_dilation", rhs_dilation)):
    if len(values) != n_spatial or any(v < 1 for v in values):
      raise ValueError(f"{name} must have {n_spatial} positive entries, got {values}")
  batch, channels = (lhs.shape[i] for i in numbers.lhs_spec[:2])
  out_features, in_features = (rhs.shape[i] for i in numbers.rhs_spec[:2])
  groups, batch_groups = int(feature_group_count), int(batch_group_count)
  if groups < 1 or channels % groups or out_features % groups:
    raise ValueError(f"feature_group_count={groups} must divide the input features {channels} and the output "
                     f"features {out_features}")
  if channels != in_features * groups:
    raise ValueError(f"conv_general_dilated lhs feature dimension size divided by feature_group_count ({channels} / "
                    f"{groups}) must equal the rhs input feature dimension size {in_features}")
  if batch_groups < 1 or batch % batch_groups or out_features % batch_groups:
    raise ValueError(f"batch_group_count={batch_groups} must divide the batch {batch} and the output features "
                     f"{out_features}")
  if groups > 1 and batch_groups > 1: raise ValueError("at most one of feature_group_count and batch_group_count > 1")
  if isinstance(padding, str) and any(d != 1 for d in lhs_dilation):
    raise ValueError("String padding is not implemented for transposed convolution using this op. Please either "
                     "exactly specify the required padding or use conv_transpose.")
  kernel = [rhs.shape[i] for i in numbers.rhs_spec[2:]]
  effective = [(k - 1) * d + 1 for k, d in zip(kernel, rhs_dilation)]
  in_sizes = [lhs.shape[i] for i in numbers.lhs_spec[2:]]
  pads = padtype_to_pads(in_sizes, effective, strides, padding) if isinstance(padding, str) else \
    tuple(tuple(int(v) for v in pair) for pair in padding)
  if len(pads) != n_spatial: raise ValueError(f"padding must have {n_spatial} (low, high) pairs, got {padding}")
  out_dtype = lhs.dtype if preferred_element_type is None else dtypes.canonicalize_dtype(
    dtypes.dtype(preferred_element_type))
  params = dict(window_strides=strides, padding=tuple(tuple(p) for p in pads), lhs_dilation=lhs_dilation,
                rhs_dilation=rhs_dilation, dimension_numbers=numbers, feature_group_count=groups,
                batch_group_count=batch_groups, preferred_element_type=out_dtype)
  out_shape = _conv_out_shape(lhs.shape, rhs.shape, params)
  if 0 in out_shape or lhs.size == 0 or rhs.size == 0:  # no window fits (or nothing to sum): zeros, as XLA
    return full(out_shape, 0, out_dtype)
  return conv_general_dilated_p.bind(lhs, rhs, **params)


def _conv_impl(lhs: Array, rhs: Array, *, window_strides: tuple[int, ...], padding: tuple[tuple[int, int], ...],
               lhs_dilation: tuple[int, ...], rhs_dilation: tuple[int, ...], dimension_numbers: ConvDimensionNumbers,
               feature_group_count: int, batch_group_count: int, preferred_element_type: np.dtype) -> Array:
  """The convolution as movement ops and one dot_general (arguments checked and resolved by the caller)."""
  numbers, out_dtype, strides = dimension_numbers, preferred_element_type, window_strides
  n_spatial = lhs.ndim - 2
  if any(d != 1 for d in lhs_dilation) and all(s == 1 for s in strides) and \
      all(r == 1 for d, r in zip(lhs_dilation, rhs_dilation) if d != 1):
    return _phase_conv(lhs, rhs, padding=padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                       dimension_numbers=numbers, feature_group_count=feature_group_count,
                       batch_group_count=batch_group_count, preferred_element_type=out_dtype)
  if any(d != 1 for d in lhs_dilation) or any(p != (0, 0) for p in padding):
    # zeros between input elements (a transposed convolution) and around them, in the input's own layout: the padded
    # copy of an NHWC input written as NCHW took 117 ms in ResNet-50's step (strided reads of all it fuses), 2 GFLOP/s
    config = [(0, 0, 0)] * lhs.ndim
    for axis, d, (lo, hi) in zip(numbers.lhs_spec[2:], lhs_dilation, padding): config[axis] = (lo, hi, d - 1)
    padded = pad(lhs, 0, config)
    flat = _flat(padded, rhs, window_strides, rhs_dilation, numbers, feature_group_count, batch_group_count)
    if flat and (order := _rows_order(numbers.lhs_spec)) != sorted(order):
      # the flat GEMM's rows transpose the input (an NCHW input's weight gradient): a copy of the input in their
      # order first (register transposes, codegen/llvm.py), then the rows copy reads it through the padding in order
      # (32x64x56x56: 1.06 + 0.67 ms; read through the padding across: 2.7-3.3 ms; padded, then read: 1.75 + 3.3)
      padded = pad(permute_raw(_materialize(permute_raw(lhs, order)), list(np.argsort(order))), 0, config)
    # (a flat GEMM copies its rows, with zero rows after them, in one pass through the padding: `_flat_conv`; the
    # padded input materialized first was a second pass, 3x3 NHWC weight gradient 112 -> 107 ms at 32x56x56x64)
    elif any(p != (0, 0) for p in padding) and not flat: padded = _materialize(padded)
    lhs = padded
  channels_last = (0, n_spatial + 1, *range(1, n_spatial + 1))
  if feature_group_count == 1 and batch_group_count == 1 and \
      all(rhs.shape[axis] == 1 for axis in numbers.rhs_spec[2:]) and \
      (tuple(numbers.lhs_spec) == channels_last or tuple(numbers.lhs_spec) == tuple(numbers.out_spec) == tuple(range(
        n_spatial + 2))):
    return _pointwise_conv(lhs, rhs, strides, numbers, out_dtype)
  x = permute_raw(lhs, numbers.lhs_spec)  # (N, C, spatial...)
  w = permute_raw(rhs, numbers.rhs_spec)  # (O, I, spatial...)
  batch, channels = x.shape[:2]
  out_features, in_features = w.shape[:2]
  groups, batch_groups = feature_group_count, batch_group_count
  kernel = w.shape[2:]
  if _flat(lhs, rhs, strides, rhs_dilation, numbers, groups, batch_groups):
    order = _rows_order(numbers.rhs_spec)
    result = _flat_conv(x, w, out_dtype, transposed_taps=order != sorted(order))
    return permute_raw(result, list(np.argsort(numbers.out_spec)))
  patches, out_sizes = _windows(x, range(2, 2 + n_spatial), kernel, strides, rhs_dilation)
  # patches: (N, C, o1, k1, o2, k2, ...); kernel w: (O, I, k1, k2, ...)
  spatial_k = [3 + 2 * i for i in range(n_spatial)]
  taps_bytes = math.prod(kernel) * channels * out_features * w.dtype.itemsize
  to_out = [(0, n_spatial + 1, *range(1, n_spatial + 1))[axis] for axis in np.argsort(numbers.out_spec)]
  if groups == 1 and batch_groups == 1 and math.prod(kernel) > 1 and taps_bytes >= IM2COL_TAPS_BYTES:
    # taps too many to stay in cache: the patches are copied into rows (N o..., k... C) first, so that the product is
    # one GEMM with a single reduce range, which gets the K-blocked row groups and the packed kernel (codegen/opt.py)
    order = (0, *[2 + 2 * i for i in range(n_spatial)], *spatial_k, 1)
    rows = _materialize(permute_raw(patches, order))
    rows = reshape_raw(rows, (batch * math.prod(out_sizes), math.prod(kernel) * channels))
    taps = _materialize(permute_raw(w, (*range(2, 2 + n_spatial), 1, 0)))  # (k..., C, O)
    taps = reshape_raw(taps, (math.prod(kernel) * channels, out_features))
    result = dot_general_raw(rows, taps, ((1,), (0,)), ((), ()), out_dtype)
    return _into_layout(reshape_raw(result, (batch, *out_sizes, out_features)), to_out, rows.shape[1])
  if groups == 1 and batch_groups == 1:
    # a GEMM (N o...) x (C k...) @ (C k...) x O: the kernel goes first into (C, k..., O) and the product is computed
    # as (N, o..., O), so that the output channels are the contiguous, vectorised axis of the tile (codegen/opt.py)
    w = _materialize(permute_raw(w, (*range(1, n_spatial + 2), 0)))
    result = dot_general_raw(patches, w, ((1, *spatial_k), tuple(range(n_spatial + 1))), ((), ()), out_dtype)
    return _into_layout(result, to_out, channels * math.prod(kernel))
  if batch_groups == 1:
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


def _phase_conv(lhs: Array, rhs: Array, *, padding: tuple[tuple[int, int], ...], lhs_dilation: tuple[int, ...],
                rhs_dilation: tuple[int, ...], dimension_numbers: ConvDimensionNumbers, feature_group_count: int,
                batch_group_count: int, preferred_element_type: np.dtype) -> Array:
  """A convolution over an input dilated by s (a strided convolution's input gradient, `conv_transpose`) as s
  convolutions per dilated axis, one per output phase r (the outputs s * q + r), each over the undilated input with
  the taps that meet its elements (every s-th, from the first k with k = lo - r mod s), interleaved after: the zeros
  between the input's elements are never multiplied (3x3 stride 2, 16x32x32x64 -> 128: the input gradient summed
  4x the products it needed, 25 ms). For strides of 1 and no kernel dilation along the dilated axes."""
  numbers = dimension_numbers
  n_spatial = lhs.ndim - 2
  kernel = [rhs.shape[axis] for axis in numbers.rhs_spec[2:]]
  sizes = [lhs.shape[axis] for axis in numbers.lhs_spec[2:]]
  outs = [(n - 1) * d + 1 + lo + hi - (k - 1) * r
          for n, d, (lo, hi), k, r in zip(sizes, lhs_dilation, padding, kernel, rhs_dilation)]
  counts = [-(-out // d) for out, d in zip(outs, lhs_dilation)]  # each phase padded to this many outputs
  params = dict(window_strides=(1,) * n_spatial, rhs_dilation=rhs_dilation, dimension_numbers=numbers,
                feature_group_count=feature_group_count, batch_group_count=batch_group_count,
                preferred_element_type=preferred_element_type)
  phase_shape = list(_conv_out_shape(lhs.shape, rhs.shape, dict(params, padding=padding, lhs_dilation=lhs_dilation)))
  for axis, count in zip(numbers.out_spec[2:], counts): phase_shape[axis] = count

  def phase(phases: tuple[int, ...]) -> Array:
    """The outputs s * q + r of the phases `phases` (one per spatial axis), `counts` of them on each axis."""
    taps = [(0, size, 1) for size in rhs.shape]
    pads = []
    for i, (r, d, (lo, _), k, n) in enumerate(zip(phases, lhs_dilation, padding, kernel, sizes)):
      first = (lo - r) % d if d > 1 else 0
      count = len(range(first, k, d))
      wanted = -(-(outs[i] - r) // d) if d > 1 else outs[i]
      if count == 0 or wanted <= 0:  # (no tap meets this phase's outputs: zeros)
        return full(tuple(phase_shape), 0, preferred_element_type)
      taps[numbers.rhs_spec[2 + i]] = (first, k, d)
      start = (r + first - lo) // d if d > 1 else -lo  # the input element its first tap meets at q = 0
      pads.append((-start, counts[i] + count * rhs_dilation[i] - rhs_dilation[i] - n + start))
    sub = strided_slice_raw(rhs, [t[0] for t in taps], [t[1] for t in taps], [t[2] for t in taps])
    return _conv_impl(lhs, sub, padding=tuple(pads), lhs_dilation=(1,) * n_spatial, **params)

  def interleave(axis_index: int, prefix: tuple[int, ...]) -> Array:
    if axis_index == n_spatial: return phase(prefix)
    d = lhs_dilation[axis_index]
    pieces = [interleave(axis_index + 1, (*prefix, r)) for r in range(d)]
    return pieces[0] if d == 1 else interleave_raw(pieces, numbers.out_spec[2 + axis_index], outs[axis_index])
  return interleave(0, ())


def _flat(lhs: Array, rhs: Array, strides: tuple[int, ...], rhs_dilation: tuple[int, ...],
          numbers: ConvDimensionNumbers, groups: int, batch_groups: int) -> bool:
  """Whether the convolution (of its input as padded) is one GEMM over its flattened grid (`_flat_conv`)."""
  grid, kernel = [lhs.shape[axis] for axis in numbers.lhs_spec[2:]], [rhs.shape[axis] for axis in numbers.rhs_spec[2:]]
  return groups == 1 and batch_groups == 1 and all(s == 1 for s in strides + rhs_dilation) and \
      math.prod(grid) <= FLAT_WASTE * math.prod(kernel)


def _rows_order(spec: tuple[int, ...]) -> list[int]:
  """The axes of an operand, given its (batch, feature, spatial...) spec, in the order of `_flat_conv`'s rows and taps
  (feature, spatial..., batch): not sorted where they transpose its memory (an NCHW input's or output gradient's in
  a weight gradient). Rows in the input's own order (NHWC) copy the padded input, which the forward convolution has
  made already (examples/cnn.py: 110 + a shared 196 us, read through the padding's gates: 379)."""
  return [spec[1], *spec[2:], spec[0]]


def _into_layout(result: Array, order: list[int], steps: int) -> Array:
  """A channels-last product (N, o..., O) of `steps` products per element permuted into the output's layout. Left
  unmaterialised where it writes the output itself: channels last (what follows fuses into it), or element by element
  from its register tile where that pays (codegen/opt.py `permuted_store_pays`, lower/schedule.py
  `_contraction_order`); else it is copied first and then transposed."""
  direct = order == sorted(order) or _opt.permuted_store_pays(result.shape[order[-1]], result.shape[-1], steps,
                                                              math.prod(result.shape))
  return permute_raw(result if direct else _materialize(result), order)


def _pointwise_conv(lhs: Array, rhs: Array, strides: tuple[int, ...], numbers: ConvDimensionNumbers,
                    out_dtype: np.dtype) -> Array:
  """A 1x1 convolution as a GEMM over the input's memory as it lies (a strided one's picked positions copied first).
  Channels last (N, spatial..., C): one GEMM (N * spatial, C) @ (C, O), whose one row range gets the packed, K-blocked
  register tile of a matmul (read as (N, C, spatial...), it had three row ranges, none of them long enough for the
  pack: ResNet-50's 14x14x256 -> 1024 at 36% of the FMA peak). Channels first in and out (N, C, spatial...), JAX's
  default: per image, (O, C) @ (C, spatial), written as (N, O, spatial) in place, the spatial positions the tile's
  contiguous columns (computed channels last and transposed, 32x64x56x56 -> 64 took 8.0 ms, 2.3 of them the
  transpose; so, 2.4 ms)."""
  n_spatial = lhs.ndim - 2
  first = tuple(numbers.lhs_spec) == tuple(range(n_spatial + 2))
  spatial_axes = range(2, n_spatial + 2) if first else range(1, n_spatial + 1)
  if any(s != 1 for s in strides):  # (ResNet's downsampling shortcuts): every stride-th position, as a copy
    limits, steps = list(lhs.shape), [1] * lhs.ndim
    for axis, s in zip(spatial_axes, strides): limits[axis], steps[axis] = (lhs.shape[axis] - 1) // s * s + 1, s
    lhs = _materialize(strided_slice_raw(lhs, [0] * lhs.ndim, limits, steps))
  out_features = rhs.shape[numbers.rhs_spec[0]]
  taps = permute_raw(rhs, numbers.rhs_spec)  # (O, C, 1...)
  if first:
    batch, channels, *sizes = lhs.shape
    taps = expand_raw(reshape_raw(taps, (1, out_features, channels)), (batch, out_features, channels))
    images = reshape_raw(lhs, (batch, channels, math.prod(sizes)))
    result = dot_general_raw(taps, images, ((2,), (1,)), ((0,), (0,)), out_dtype)  # (N, O, spatial)
    return reshape_raw(result, (batch, out_features, *sizes))  # (out_spec is lhs_spec: the identity)
  batch, *sizes, channels = lhs.shape
  rows = reshape_raw(lhs, (batch * math.prod(sizes), channels))
  taps = reshape_raw(permute_raw(taps, (1, 0, *range(2, n_spatial + 2))), (channels, out_features))
  result = dot_general_raw(rows, taps, ((1,), (0,)), ((), ()), out_dtype)
  result = reshape_raw(result, (batch, *sizes, out_features))
  result = permute_raw(result, (0, n_spatial + 1, *range(1, n_spatial + 1)))  # (N, o..., O) -> (N, O, o...)
  return permute_raw(result, list(np.argsort(numbers.out_spec)))


# A convolution whose window covers nearly all of its (padded) input, as a weight gradient's (the window is the output
# gradient's spatial extent, the result the small kernel), is computed as one GEMM over the input's flattened
# (features, spatial) grid (`_flat_conv`) when that grid is at most FLAT_WASTE times the window's taps. The weight
# gradient of a 3x3 convolution of 32x64x56x56 (SAME) into 64 channels, a 64x576 result summed over 100K grid points:
# 129 ms (57 GFLOP/s, a register tile per output row streaming the whole output gradient) -> 43 ms, 2 cores.
FLAT_WASTE = 1.5
# A convolution whose taps (kernel window x input x output features) take at least this many bytes (ResNet's 3x3
# convolutions of 256 and 512 features: 2.4 and 9.4 MB) is an explicit im2col copy and one GEMM. Read in place, its
# several reduce ranges (C, kh, kw) leave the register tiles without K-blocked row groups, and each 4-row tile
# streamed all the taps from memory (7x7x512 into 512, batch 8: 31 -> 13 ms; 14x14x256: 15.5 -> 6.6 ms). Taps that
# stay in cache keep the direct product: examples/cnn.py's 3x3x32 -> 64 (74 KB) ran 30% slower as im2col, the copy
# costing more than the GEMM gains.
IM2COL_TAPS_BYTES = 1 << 20


def _flat_conv(x: Array, w: Array, out_dtype: np.dtype, transposed_taps: bool = False) -> Array:
  """A stride-1, undilated convolution of a padded input x (B, F, P...) with a kernel w (O, F, K...) as one GEMM with
  a long reduction: the input becomes rows (F * prod(P), B), one per grid point, and the kernel is zero-padded onto
  the same grid, (F * prod(P), O); an output position y reads the rows shifted by y's flat offset (a windowed view
  of the rows): out[b, o, y] = sum_q rows[q + offset(y), b] * kernel[q, o]. The reduction runs over the whole grid,
  so the padded kernel's zeros cost prod(P) / prod(K) times the useful products (FLAT_WASTE). A shifted read past
  the end of a grid row meets a zero tap, so nothing wraps into the result; zero rows after the last grid point
  keep the shifted reads in bounds. The GEMM (rows B, columns O) gets the register tile and K-blocked row groups of
  a weight-gradient matmul."""
  n_spatial = x.ndim - 2
  grid, kernel = x.shape[2:], w.shape[2:]
  out_sizes = [p - k + 1 for p, k in zip(grid, kernel)]
  flat_strides = [math.prod(grid[i + 1:]) for i in range(n_spatial)]
  spatial = tuple(range(2, 2 + n_spatial))
  points = x.shape[1] * math.prod(grid)
  rows = reshape_raw(permute_raw(x, (1, *spatial, 0)), (points, x.shape[0]))
  # (with nothing to pad -- a window as big as the grid: a 1x1 convolution's weight gradient -- the views are read in
  # place: copied, they were two passes over its 32x56x56x64 input and output gradient, 2.3 ms of 6.6)
  if (extra := sum((o - 1) * s for o, s in zip(out_sizes, flat_strides))):
    rows = _materialize(pad_raw(rows, [(0, extra), (0, 0)]))
  taps = permute_raw(w, (1, *spatial, 0))  # (F, K..., O)
  # (taps transposing the kernel as it lies, an NCHW output gradient: copied in that order first, register
  # transposes, and then padded in order: 1.06 + 0.67 ms against 2.6 for 32x64x56x56 padded across)
  if grid != kernel and transposed_taps: taps = _materialize(taps)
  if grid != kernel: taps = pad_raw(taps, [(0, 0)] + [(0, p - k) for p, k in zip(grid, kernel)] + [(0, 0)])
  taps = reshape_raw(taps, (points, w.shape[0]))
  if grid != kernel: taps = _materialize(taps)
  windows = rows
  for size, stride in zip(reversed(out_sizes), reversed(flat_strides)):  # (q, y1, ..., yn, B)
    windows, _ = _windows(windows, [0], [size], [1], [stride])
  result = dot_general_raw(windows, taps, ((0,), (0,)), ((), ()), out_dtype)  # (y..., B, O)
  return permute_raw(result, (n_spatial, n_spatial + 1, *range(n_spatial)))


conv_general_dilated_p = Primitive("conv_general_dilated", _conv_impl)


# -- differentiation: JAX's transposes, themselves convolutions (so the backward pass is as fast as the forward)

def _dilate_shape(shape: Sequence[int], dilation: Sequence[int]) -> list[int]:
  return [0 if d == 0 else 1 + r * (d - 1) for d, r in zip(shape, dilation)]


def _spec_transpose(spec: tuple[int, ...]) -> tuple[int, ...]: return (spec[1], spec[0], *spec[2:])


def _reshape_axis_out_of(source: int, size: int, x: Array) -> Array:
  shape = list(x.shape)
  shape[source:source + 1] = [size, shape[source] // size]
  return reshape_raw(x, tuple(shape))


def _reshape_axis_into(source: int, destination: int, x: Array) -> Array:
  """Merge axis `source` into axis `destination` (numbered without `source`), as its major part."""
  perm = [i for i in range(x.ndim) if i != source]
  perm.insert(destination, source)
  shape = [d for i, d in enumerate(x.shape) if i != source]
  shape[destination] *= x.shape[source]
  return reshape_raw(permute_raw(x, perm), tuple(shape))


def _transpose_lhs(ct: Array, rhs: Array, lhs_shape: tuple[int, ...], params: dict) -> Array:
  numbers = params["dimension_numbers"]
  groups, batch_groups = params["feature_group_count"], params["batch_group_count"]
  lhs_spec, rhs_spec, out_spec = numbers
  if groups > 1:
    rhs = _reshape_axis_into(rhs_spec[0], rhs_spec[1], _reshape_axis_out_of(rhs_spec[0], groups, rhs))
  elif batch_groups > 1:
    rhs = _reshape_axis_into(rhs_spec[0], rhs_spec[1], _reshape_axis_out_of(rhs_spec[0], batch_groups, rhs))
    groups = batch_groups
  in_shape = [lhs_shape[i] for i in lhs_spec[2:]]
  window = [rhs.shape[i] for i in rhs_spec[2:]]
  out_shape = [ct.shape[i] for i in out_spec[2:]]
  lhs_dilated = _dilate_shape(in_shape, params["lhs_dilation"])
  rhs_dilated = _dilate_shape(window, params["rhs_dilation"])
  out_dilated = _dilate_shape(out_shape, params["window_strides"])
  before = [r - lo - 1 for r, (lo, _) in zip(rhs_dilated, params["padding"])]
  after = [l + r - 1 - o - b for l, r, o, b in zip(lhs_dilated, rhs_dilated, out_dilated, before)]
  flipped = flip_raw(rhs, list(rhs_spec[2:]))
  result = conv_general_dilated(ct, flipped, params["lhs_dilation"], list(zip(before, after)),
                                params["window_strides"], params["rhs_dilation"],
                                ConvDimensionNumbers(out_spec, _spec_transpose(rhs_spec), lhs_spec), groups, 1,
                                preferred_element_type=ct.dtype)
  if batch_groups > 1:
    result = _reshape_axis_into(lhs_spec[1], lhs_spec[0], _reshape_axis_out_of(lhs_spec[1], batch_groups, result))
  return result


def _transpose_rhs(ct: Array, lhs: Array, rhs_shape: tuple[int, ...], params: dict) -> Array:
  numbers = params["dimension_numbers"]
  groups, batch_groups = params["feature_group_count"], params["batch_group_count"]
  lhs_spec, rhs_spec, out_spec = numbers
  if batch_groups > 1: groups, batch_groups = batch_groups, 1
  elif groups > 1: groups, batch_groups = 1, groups
  in_shape = [lhs.shape[i] for i in lhs_spec[2:]]
  window = [rhs_shape[i] for i in rhs_spec[2:]]
  out_shape = [ct.shape[i] for i in out_spec[2:]]
  lhs_dilated = _dilate_shape(in_shape, params["lhs_dilation"])
  rhs_dilated = _dilate_shape(window, params["rhs_dilation"])
  out_dilated = _dilate_shape(out_shape, params["window_strides"])
  lows = [lo for lo, _ in params["padding"]]
  highs = [(o - l) + (r - lo - 1) for o, l, r, lo in zip(out_dilated, lhs_dilated, rhs_dilated, lows)]
  numbers_t = ConvDimensionNumbers(_spec_transpose(lhs_spec), _spec_transpose(out_spec), _spec_transpose(rhs_spec))
  return conv_general_dilated(lhs, ct, params["rhs_dilation"], list(zip(lows, highs)), params["lhs_dilation"],
                              params["window_strides"], numbers_t, groups, batch_groups,
                              preferred_element_type=ct.dtype)


class _ConvLinear:
  """A convolution as a linear map of one operand (the other known), staged in a linear program: its transpose is
  the convolution JAX uses for that operand's gradient."""

  def __init__(self, known: Any, which: str, params: dict, operand_shape: tuple[int, ...], out_shape: tuple,
               operand_dtype: np.dtype):
    self.known, self.which, self.params = known, which, params
    self.operand_shape, self.out_shapes, self.operand_dtype = operand_shape, [tuple(out_shape)], operand_dtype

  def transpose(self, index: int, ct: Any) -> tuple[Any]:
    # with preferred_element_type the cotangent is wider than the operands (bfloat16 inputs, float32 result): the
    # transposed convolution runs in the cotangent's dtype, and the gradient has the operand's, as in JAX
    known = self.known if self.known.dtype == ct.dtype else cast(self.known, ct.dtype)
    if self.which == "lhs": result = _transpose_lhs(ct, known, self.operand_shape, self.params)
    else: result = _transpose_rhs(ct, known, self.operand_shape, self.params)
    return (result if result.dtype == self.operand_dtype else cast(result, self.operand_dtype),)

  __hash__ = object.__hash__


def _linear_conv(tangent: Any, known: Any, which: str, params: dict) -> Any:
  """The convolution of a tangent with the known other operand: a CUSTOM_LINEAR node in a linear program (so its
  transpose is a convolution), or the convolution itself under plain forward mode."""
  trace = current_trace.get()
  operands = (tangent, known) if which == "lhs" else (known, tangent)
  if isinstance(trace, ad.LinearTrace) and isinstance(trace.parent, BodyTrace):
    # inside a loop body being linearized, the known operand must be a residual of the body's program: stage the
    # decomposition, whose known operands the linear trace records as residuals
    return _conv_impl(*operands, **params)
  if isinstance(trace, ad.LinearTrace) and trace.is_mine(tangent):
    lhs_shape, rhs_shape = (tangent.shape, known.shape) if which == "lhs" else (known.shape, tangent.shape)
    shape = _conv_out_shape(lhs_shape, rhs_shape, params)
    handle = _ConvLinear(known, which, params, tuple(tangent.shape), shape, tangent.dtype)
    node = UOp(Ops.CUSTOM_LINEAR, np.dtype(params["preferred_element_type"]), (tangent.uop,), (handle, 0))
    return StagingTracer(node, False, trace)
  return conv_general_dilated_p.bind(*operands, **params)


def _conv_out_shape(lhs_shape: Sequence[int], rhs_shape: Sequence[int], params: dict) -> tuple[int, ...]:
  lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
  batch = lhs_shape[lhs_spec[0]] // params["batch_group_count"]
  features = rhs_shape[rhs_spec[0]]
  spatial = []
  for axis, k_axis, stride, (lo, hi), base, dilation in zip(lhs_spec[2:], rhs_spec[2:], params["window_strides"],
                                                            params["padding"], params["lhs_dilation"],
                                                            params["rhs_dilation"]):
    size = _dilate_shape([lhs_shape[axis]], [base])[0] + lo + hi
    effective = (rhs_shape[k_axis] - 1) * dilation + 1
    spatial.append(max((size - effective) // stride + 1, 0))
  logical = [batch, features, *spatial]
  shape = [0] * len(logical)
  for position, axis in enumerate(out_spec): shape[axis] = logical[position]
  return tuple(shape)


def _conv_jvp(primals, tangents, out, **params):
  (lhs, rhs), (t_lhs, t_rhs) = primals, tangents
  terms = []
  if t_lhs is not None: terms.append(_linear_conv(t_lhs, rhs, "lhs", params))
  if t_rhs is not None: terms.append(_linear_conv(t_rhs, lhs, "rhs", params))
  return ad.sum_tangents(*terms)


ad.jvp_rules[conv_general_dilated_p] = _conv_jvp


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
    if len(values) != ndim:
      raise TypeError(f"reduce_window got the wrong number of {name} for operand: got operand shape {x.shape} with "
                      f"{name} {values}")
    if any(v < 1 for v in values): raise ValueError(f"reduce_window: {name} must be positive, got {values}")
  dilated = [(n - 1) * b + 1 if n else 0 for n, b in zip(x.shape, base)]
  effective = [(w - 1) * d + 1 for w, d in zip(window, dilation)]
  pads = padtype_to_pads(dilated, effective, strides, padding) if isinstance(padding, str) else \
    [tuple(int(v) for v in pair) for pair in padding]
  if len(pads) != ndim: raise ValueError(f"reduce_window: padding must have {ndim} pairs, got {padding}")
  out_shape = tuple(max((d + lo + hi - e) // s + 1, 0) for d, (lo, hi), e, s in zip(dilated, pads, effective, strides))
  if 0 in out_shape: return full(out_shape, 0, x.dtype)  # no window fits: an empty result, as XLA
  if any(p != (0, 0) for p in pads) or any(b != 1 for b in base):
    x = _materialize(pad(x, init_value, [(lo, hi, b - 1) for (lo, hi), b in zip(pads, base)]))
  params = dict(window=window, strides=strides, dilation=dilation)
  if op in ("min", Ops.MAX):
    result = window_max_p.bind(x, minimum=op == "min", **params)
  else:
    patches, out_sizes = _windows(x, range(ndim), window, strides, dilation)
    window_axes = tuple(1 + 2 * i for i in range(ndim))
    reduced = sum_raw(patches, window_axes) if op is Ops.ADD else reduce_raw(patches, op, window_axes)
    result = reshape_raw(reduced, tuple(out_sizes))  # (sum_raw: 16-bit floats accumulate in float32)
  combine = {Ops.ADD: add, Ops.MAX: lax_max, Ops.MUL: mul, "min": lax_min}[op]
  return combine(result, init_value)


def _order_flip(x: Array) -> Array:
  """An order-reversing bijection: the negation (floats), the bitwise complement (ints, no overflow at the minimum)."""
  return bind(Ops.XOR, x, like(x, -1)) if x.dtype.kind in "iu" else _neg(x)


def _window_max(x: Array, *, window: tuple[int, ...], strides: tuple[int, ...], dilation: tuple[int, ...],
                minimum: bool) -> Array:
  """The maximum (with `minimum`: the minimum, the flipped maximum of the flipped values) of every window."""
  patches, out_sizes = _windows(_order_flip(x) if minimum else x, range(x.ndim), window, strides, dilation)
  result = reshape_raw(reduce_raw(patches, Ops.MAX, tuple(1 + 2 * i for i in range(x.ndim))), tuple(out_sizes))
  return _order_flip(result) if minimum else result


def _window_max_jvp(primals, tangents, out, *, window, strides, dilation, minimum):
  """JAX's rule (select_and_gather_add): each window's tangent is the one at its first extremal element in window
  order, so tied maxima don't share it (a plain max reduction splits it between them)."""
  from tinyjax import lax
  (x,), (t,) = primals, tangents
  ndim = x.ndim
  patches, out_sizes = _windows(x, range(ndim), window, strides, dilation)
  t_patches = _phased_windows(t, range(ndim), window, strides, dilation)
  window_axes = tuple(1 + 2 * i for i in range(ndim))
  spread = tuple(d for size in out_sizes for d in (size, 1))  # out with a 1 at every window axis
  position_shape = tuple(d for size in window for d in (1, size))  # a window element's number, in window order
  position = to_array(np.arange(math.prod(window), dtype=np.int32).reshape(position_shape))
  position = expand_raw(position, patches.shape)
  is_extremal = lax.eq(patches, expand_raw(reshape_raw(out, spread), patches.shape))
  first = reduce_raw(lax.select(is_extremal, _neg(position), full(patches.shape, -math.prod(window), np.int32)),
                     Ops.MAX, window_axes, keepdims=True)
  chosen = lax.eq(_neg(position), expand_raw(first, patches.shape))
  picked = lax.select(chosen, t_patches, full(patches.shape, 0, t.dtype))
  return reshape_raw(reduce_raw(picked, Ops.ADD, window_axes), tuple(out_sizes))


window_max_p = Primitive("reduce_window_max", _window_max)
ad.jvp_rules[window_max_p] = _window_max_jvp
