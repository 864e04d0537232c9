"""The device API, as JAX's: `devices()`, `device_count()`, `local_devices()`, `default_backend()`, `device_put`,
`device_get`. Which device arrays live on and where computations run is decided in devices/device.py."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.devices.device import backend_devices, default_backend, default_device, host_buffer, move
from tinyjax.uop import Ops, UOp

__all__ = ["default_backend", "device_count", "device_get", "device_put", "devices", "local_device_count",
           "local_devices"]


def devices(backend: str | None = None) -> list:
  """The devices of `backend` ('cpu', 'cuda' or 'gpu'; default: the default device's platform)."""
  return backend_devices(default_device().platform if backend is None else backend)


def local_devices(process_index: int | None = None, backend: str | None = None) -> list:
  """The devices of this process (every device: tinyjax runs in one process)."""
  return devices(backend)


def device_count(backend: str | None = None) -> int: return len(devices(backend))
def local_device_count(backend: str | None = None) -> int: return len(devices(backend))


def _is_device(value: Any) -> bool:
  return hasattr(value, "platform") and hasattr(value, "id") and not isinstance(value, (Array, np.ndarray))


def device_put(x: Any, device: Any = None) -> Any:
  """`x` (a pytree of arrays, numpy arrays or scalars) with every leaf on `device` (default: the default device).
  Arrays already there are returned as they are; others are copied."""
  if device is None: device = default_device()
  if not _is_device(device):
    raise TypeError(f"device_put: expected a device such as tinyjax.devices()[0], got {type(device).__name__} "
                    "(shardings come with tinyjax.sharding)")

  def put(leaf: Any) -> Array:
    if isinstance(leaf, Array):
      buffer = leaf.realize().uop.arg
      if buffer.device is device: return leaf
      return Array(UOp(Ops.BUFFER, leaf.dtype, (), move(buffer, device)), leaf.weak_type)
    if isinstance(leaf, (bool, int, float, complex)) and not isinstance(leaf, np.generic):
      host, weak = np.asarray(leaf, dtypes.python_scalar_dtype(leaf)), True
    else:
      host, weak = np.asarray(leaf), False
      host = host.astype(dtypes.canonicalize_dtype(dtypes.dtype(host.dtype)), copy=False)
    host = np.array(host, copy=True, order="C")
    host.flags.writeable = False
    return Array(UOp(Ops.BUFFER, host.dtype, (), host_buffer(host, device)), weak)
  return tree_util.tree_map(put, x)


def device_get(x: Any) -> Any:
  """`x` with every Array leaf copied to a numpy array on the host."""
  return tree_util.tree_map(lambda leaf: np.asarray(leaf) if isinstance(leaf, Array) else leaf, x)
