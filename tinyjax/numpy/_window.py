"""Window functions of tinyjax.numpy: `bartlett`, `blackman`, `hamming`, `hanning`, `kaiser` (M points, the default
float dtype, as JAX's)."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinyjax import dtypes
from tinyjax.array import Array


def _positions(M: int, name: str) -> tuple[int, Array | None]:  # noqa: N803 (numpy's name)
  """M as an int and the sample positions 0..M-1 (None when M <= 1: the window is all ones)."""
  from tinyjax import numpy as jnp
  from tinyjax.trace.core import Tracer
  if isinstance(M, Tracer): raise TypeError(f"{name}: M must be a concrete (static) number, got a traced array")
  M = int(M)  # noqa: N806 (as JAX: a float M is truncated)
  if M < 0: raise ValueError(f"{name}: M must be non-negative, got {M}")
  return M, (None if M <= 1 else jnp.arange(M, dtype=dtypes.default_float_dtype()))


def _ones(M: int) -> Array:  # noqa: N803
  from tinyjax import numpy as jnp
  return jnp.ones(M, dtypes.default_float_dtype())


def bartlett(M: int) -> Array:  # noqa: N803
  """The triangular window 1 - |2n - (M - 1)| / (M - 1)."""
  from tinyjax import numpy as jnp
  M, n = _positions(M, "bartlett")  # noqa: N806
  if n is None: return _ones(M)
  return 1 - jnp.abs(2 * n + 1 - M) / (M - 1)


def blackman(M: int) -> Array:  # noqa: N803
  """0.42 - 0.5 cos(2 pi n / (M - 1)) + 0.08 cos(4 pi n / (M - 1))."""
  from tinyjax import numpy as jnp
  M, n = _positions(M, "blackman")  # noqa: N806
  if n is None: return _ones(M)
  return 0.42 - 0.5 * jnp.cos(2 * np.pi * n / (M - 1)) + 0.08 * jnp.cos(4 * np.pi * n / (M - 1))


def hamming(M: int) -> Array:  # noqa: N803
  """0.54 - 0.46 cos(2 pi n / (M - 1))."""
  from tinyjax import numpy as jnp
  M, n = _positions(M, "hamming")  # noqa: N806
  if n is None: return _ones(M)
  return 0.54 - 0.46 * jnp.cos(2 * np.pi * n / (M - 1))


def hanning(M: int) -> Array:  # noqa: N803
  """0.5 - 0.5 cos(2 pi n / (M - 1))."""
  from tinyjax import numpy as jnp
  M, n = _positions(M, "hanning")  # noqa: N806
  if n is None: return _ones(M)
  return 0.5 * (1 - jnp.cos(2 * np.pi * n / (M - 1)))


def kaiser(M: int, beta: Any) -> Array:  # noqa: N803
  """I0(beta sqrt(1 - (2n / (M - 1) - 1)^2)) / I0(beta) (`beta` may be traced)."""
  from tinyjax import numpy as jnp
  M, n = _positions(M, "kaiser")  # noqa: N806
  if n is None: return _ones(M)
  alpha = 0.5 * (M - 1)
  beta = jnp.asarray(beta).astype(n.dtype)
  return jnp.i0(beta * jnp.sqrt(1 - ((n - alpha) / alpha) ** 2)) / jnp.i0(beta)
