"""Device memory. On the CPU a buffer is a C-contiguous host allocation, held as a numpy array.

Freed allocations go to a small pool and are handed to the next buffer of the same size: a fresh large allocation
costs a page fault per 4 KiB on first touch, often more than the kernel that fills it.
"""
from __future__ import annotations

import sys

import numpy as np

POOL_LIMIT_BYTES = 1 << 30  # memory kept for reuse, in all; beyond it freed allocations go back to the system
_pool: dict[int, list[np.ndarray]] = {}
_pool_bytes = 0


def _take_from_pool(nbytes: int) -> np.ndarray:
  global _pool_bytes
  if (free := _pool.get(nbytes)):
    _pool_bytes -= nbytes
    return free.pop()
  return np.empty(nbytes, np.uint8)


def _give_to_pool(raw: np.ndarray) -> None:
  global _pool_bytes
  if raw.nbytes == 0 or _pool_bytes + raw.nbytes > POOL_LIMIT_BYTES: return
  _pool.setdefault(raw.nbytes, []).append(raw)
  _pool_bytes += raw.nbytes


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
    if self._host is None:
      raw = _take_from_pool(self.nbytes)
      self._host = raw.view(self.dtype).reshape(self.shape)
    return self

  def __del__(self):
    # Recycle the allocation only if it is ours (a pooled uint8 block) and nothing else can see it. Every numpy view
    # of it (numpy() hands them out) has the block itself as its base, so once our typed view is dropped the block's
    # only references must be the local name and getrefcount's argument.
    host = self._host
    if host is None or sys is None: return
    raw = host.base
    if not (isinstance(raw, np.ndarray) and raw.dtype == np.uint8 and raw.base is None): return
    self._host = None
    del host
    if sys.getrefcount(raw) == 2: _give_to_pool(raw)

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
