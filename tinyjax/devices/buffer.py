"""Device memory. On the CPU a buffer is a C-contiguous host allocation, held as a numpy array."""
from __future__ import annotations

import numpy as np


class Buffer:
  """A realised array's storage: `shape`, `dtype`, and its memory once allocated (`numpy()`, `address`).

  Buffers hash by identity: a BUFFER node of the UOp graph names one buffer."""
  __slots__ = ("shape", "dtype", "_host", "__weakref__")

  def __init__(self, shape: tuple[int, ...], dtype: np.dtype, host: np.ndarray | None = None):
    self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
    if host is not None:
      assert host.shape == self.shape and host.dtype == self.dtype, (host.shape, host.dtype, self.shape, self.dtype)
      host = np.require(host, requirements="C")
    self._host = host

  @property
  def size(self) -> int: return int(np.prod(self.shape, dtype=np.int64))
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def is_allocated(self) -> bool: return self._host is not None

  def allocate(self) -> Buffer:
    if self._host is None: self._host = np.empty(self.shape, self.dtype)
    return self

  @property
  def address(self) -> int:
    """The memory address kernels receive for this buffer."""
    return self.allocate()._host.ctypes.data

  def numpy(self) -> np.ndarray:
    """The contents as a read-only numpy array (no copy)."""
    view = self.allocate()._host.view()
    view.flags.writeable = False
    return view

  def __repr__(self) -> str: return f"Buffer({self.shape}, {self.dtype.name}, {'allocated' if self._host is not None else 'empty'})"
