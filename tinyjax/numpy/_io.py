"""Host input/output of tinyjax.numpy, as JAX's: arrays from bytes and text (`frombuffer`, `fromstring`; `fromiter`
raises, as JAX's), files (`load`, which restores bfloat16 data saved by `save`; `save` and `savez` are numpy's),
and numpy's print options and `array_repr`/`array_str`."""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from tinyjax.array import Array

save = np.save
savez = np.savez
printoptions = np.printoptions
get_printoptions = np.get_printoptions
set_printoptions = np.set_printoptions
array_repr = np.array_repr
array_str = np.array_str


def frombuffer(buffer: bytes | Any, dtype: Any = float, count: int = -1, offset: int = 0) -> Array:
  """The bytes of `buffer` read as a 1-d array of `dtype` (numpy's frombuffer, then moved to the device)."""
  from tinyjax import numpy as jnp
  return jnp.asarray(np.frombuffer(buffer, dtype=dtype, count=count, offset=offset))


def fromstring(string: str, dtype: Any = float, count: int = -1, *, sep: str) -> Array:
  """The numbers in the text `string`, separated by `sep`, as a 1-d array of `dtype`."""
  from tinyjax import numpy as jnp
  return jnp.asarray(np.fromstring(string, dtype=dtype, count=count, sep=sep))


def fromiter(*args: Any, **kwargs: Any) -> Array:
  """Not implemented, as in JAX: consuming an iterator is a side effect."""
  raise NotImplementedError("jnp.fromiter() is not implemented because it may be non-pure and thus unsafe for use "
                            "with JIT and other JAX transformations. Consider using jnp.asarray(np.fromiter(...)) "
                            "instead, although care should be taken if np.fromiter is used within a jax "
                            "transformation because of its potential side-effect of consuming the iterable object.")


def load(file: Any, *args: Any, **kwargs: Any) -> Any:
  """numpy's load, an array moved to the device (bfloat16 data, which numpy saves as 2-byte voids, restored); an
  .npz archive or an unsupported dtype comes back as numpy gives it."""
  from tinyjax import numpy as jnp
  out = np.load(file, *args, **kwargs)
  if isinstance(out, np.ndarray):
    if out.dtype == np.dtype("V2"): out = out.view(ml_dtypes.bfloat16)
    try:
      out = jnp.asarray(out)
    except TypeError:  # (a dtype tinyjax does not support)
      pass
  return out
