"""tinyjax.scipy.signal: `convolve` and `correlate` of N-d arrays (modes full / same / valid), as one
lax.conv_general_dilated with a single channel (the kernel flipped for convolution)."""
from __future__ import annotations

from typing import Any

from tinyjax import dtypes
from tinyjax import numpy as jnp
from tinyjax.array import Array
from tinyjax.lax._base import cast, reshape_raw
from tinyjax.lax._conv import conv_general_dilated
from tinyjax.lax._shape import flip_raw


def _correlate(in1: Any, in2: Any, mode: str, flip: bool, name: str) -> Array:
  x, kernel = jnp.asarray(in1), jnp.asarray(in2)
  if x.ndim != kernel.ndim: raise ValueError(f"{name}: in1 and in2 should have the same dimensionality")
  if x.ndim == 0: raise ValueError(f"{name}: inputs must be at least 1-D")
  if mode not in ("full", "same", "valid"):
    raise ValueError(f"{name}: mode must be one of 'full', 'same', 'valid', got {mode!r}")
  if mode == "valid" and any(k > n for k, n in zip(kernel.shape, x.shape)):
    if all(k >= n for k, n in zip(kernel.shape, x.shape)): x, kernel = kernel, x
    else: raise ValueError(f"{name}: for 'valid' mode, one input must be at least as large as the other in every axis")
  common = dtypes.result_type(x, kernel, 1.0)
  x, kernel = cast(x, common, False), cast(kernel, common, False)
  if flip: kernel = flip_raw(kernel, list(range(kernel.ndim)))
  if mode == "full": padding = [(k - 1, k - 1) for k in kernel.shape]
  elif mode == "same": padding = [(k // 2, k - 1 - k // 2) for k in kernel.shape]  # the centre of "full"
  else: padding = [(0, 0)] * x.ndim
  out = conv_general_dilated(reshape_raw(x, (1, 1, *x.shape)), reshape_raw(kernel, (1, 1, *kernel.shape)),
                             (1,) * x.ndim, padding)
  return reshape_raw(out, out.shape[2:])


def convolve(in1: Any, in2: Any, mode: str = "full", method: str = "auto", *, precision: Any = None) -> Array:
  """N-d convolution of in1 with in2 ('full', 'same' (centred as scipy) or 'valid')."""
  return _correlate(in1, in2, mode, True, "convolve")


def correlate(in1: Any, in2: Any, mode: str = "full", method: str = "auto", *, precision: Any = None) -> Array:
  """N-d cross-correlation of in1 with in2 ('full', 'same' or 'valid')."""
  return _correlate(in1, in2, mode, False, "correlate")


__all__ = ["convolve", "correlate"]
