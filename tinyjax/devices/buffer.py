"""Device memory. On the CPU a buffer is a C-contiguous host allocation, held as a numpy array (on any of the CPU
devices: they share the host's memory, a buffer's `device` says which one it is placed on).

Freed allocations go to a small pool and are handed to the next buffer of the same size: a fresh large allocation
costs a page fault per 4 KiB on first touch, often more than the kernel that fills it.

A buffer keeps its address once allocated (numpy's `.ctypes.data` costs ~1 us, a jitted call's whole budget is 10),
and `allocate_buffers` makes the buffers of a launch without re-checking shapes and dtypes planned ahead of time.
"""
from __future__ import annotations

import ctypes
import math
import os
import sys

import numpy as np

from tinyjax.devices.device import CPU


def _physical_memory() -> int:
  """The machine's physical memory in bytes (0 where the OS doesn't say)."""
  try: return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError): return 0


# Memory kept for reuse, in all: a quarter of the machine's memory, at least 1 GiB; beyond it freed allocations go
# back to the system. A training step's arena of intermediates is one block (ResNet-50 at batch 8: 1.1 GB), taken and
# given back once per step: left out of the pool, every step paid a page fault per 4 KiB (or 2 MiB) of it on first
# touch, 2.45 -> 1.63 s per step on a 24 GB machine.
POOL_LIMIT_BYTES = max(1 << 30, _physical_memory() // 4)
_pool: dict[int, list[tuple[np.ndarray, int]]] = {}  # nbytes -> free (uint8 block, its address)
_pool_bytes = 0


def take_block(nbytes: int) -> tuple[np.ndarray, int]:
  """A uint8 block of `nbytes` and its address, from the pool if one of that size is free (a buffer's memory, or a
  run's arena of intermediates, which `give_block` returns once the run is done)."""
  global _pool_bytes
  if (free := _pool.get(nbytes)):
    _pool_bytes -= nbytes
    return free.pop()
  if 0 < nbytes <= SMALL_BLOCK_BYTES:  # (its address without numpy's `.ctypes`: 1.1 -> 0.45 us; zeroing it is free)
    memory = ctypes.create_string_buffer(nbytes)
    return np.frombuffer(memory, np.uint8), ctypes.addressof(memory)
  # (untouched: its pages are faulted in where a kernel first writes them; BLOCK_ALIGNMENT-aligned, seen through a
  # memoryview so that the block, not the allocation under it, is the base of its numpy views)
  memory = np.empty(nbytes + BLOCK_ALIGNMENT - 1, np.uint8)
  start = -memory.ctypes.data % BLOCK_ALIGNMENT
  raw = np.frombuffer(memoryview(memory)[start:start + nbytes], np.uint8)
  return raw, raw.ctypes.data


# A block larger than SMALL_BLOCK_BYTES starts at a multiple of BLOCK_ALIGNMENT bytes, a cache line: a kernel's rows of
# whole lines are then whole lines in memory (a 64-float row of numpy's 16-byte aligned blocks spans 5 lines), and its
# non-temporal stores (codegen/opt.py NONTEMPORAL_BYTES) find the alignment they need (NCHW 1x1 convolution of
# 32x64x56x56 into 64 channels, read in place: 2.26-2.36 -> 2.04-2.21 ms). Every numpy view of a block has the block
# itself as its base (`Buffer.__del__` counts references to it): a slice of the aligned allocation would have had the
# allocation as its base, and a block gone back to the pool while a view still read it.
BLOCK_ALIGNMENT = 64
# A new block up to this size is a ctypes buffer seen by numpy (an eager read handed out as a numpy view takes one
# each time: the view keeps its block out of the pool).
SMALL_BLOCK_BYTES = 1 << 16


def give_block(raw: np.ndarray, address: int) -> None:
  """Keep a block nothing uses any more for the next `take_block` of its size (within POOL_LIMIT_BYTES)."""
  global _pool_bytes
  if raw.nbytes == 0 or _pool_bytes + raw.nbytes > POOL_LIMIT_BYTES: return
  _pool.setdefault(raw.nbytes, []).append((raw, address))
  _pool_bytes += raw.nbytes


class Buffer:
  """A realised array's storage: `shape`, `dtype`, and its memory once allocated (`numpy()`, `address`).

  Its memory is a pooled block (`_raw`, uint8, taken from the pool on allocation and given back when the buffer dies
  unseen) or a host array it was made from; the typed view of a block (`_host`) is made when first asked for, since a
  launch needs only the address (a view costs ~0.5 us of a jitted call's few). Buffers hash by identity: a BUFFER node
  of the UOp graph names one buffer, and the buffer keeps a weak reference to that node (`_node`, see UOp)."""
  # `committed`: placed on its device by `device_put`, or computed from such buffers (JAX's committed arrays: a
  # computation runs where they are, and two committed to different devices are an error, devices/device.py `place`)
  __slots__ = ("shape", "dtype", "nbytes", "device", "committed", "_raw", "_host", "_address", "_node", "__weakref__")

  def __init__(self, shape: tuple[int, ...], dtype: np.dtype, host: np.ndarray | None = None, device=CPU):
    self.shape, self.dtype, self.device = tuple(int(d) for d in shape), np.dtype(dtype), device
    self.committed = False
    self.nbytes = math.prod(self.shape) * self.dtype.itemsize
    self._raw, self._address, self._node = None, 0, None
    if host is not None:
      assert host.shape == self.shape and host.dtype == self.dtype, (host.shape, host.dtype, self.shape, self.dtype)
      host = np.require(host, requirements="C")
      self._address = host.ctypes.data
    self._host = host

  @property
  def size(self) -> int: return math.prod(self.shape)
  @property
  def is_allocated(self) -> bool: return self._raw is not None or self._host is not None

  def allocate(self) -> Buffer:
    if self._raw is None and self._host is None: self._raw, self._address = take_block(self.nbytes)
    return self

  def __del__(self):
    # Recycle the block only if nothing else can see it. Every numpy view of it (numpy() hands them out) has the block
    # itself as its base, so once the typed view (`_host`) is dropped the block's only references must be `_raw`, the
    # local name and getrefcount's argument. (give_block inlined: a training step frees hundreds of outputs.)
    global _pool_bytes
    try: raw = self._raw
    except AttributeError: return  # (a Buffer whose __init__ raised)
    if raw is None or sys is None: return
    if self._host is not None: self._host = None
    if sys.getrefcount(raw) == 3 and (nbytes := raw.nbytes) and _pool_bytes + nbytes <= POOL_LIMIT_BYTES:
      if (free := _pool.get(nbytes)) is None: free = _pool[nbytes] = []
      free.append((raw, self._address))
      _pool_bytes += nbytes

  @property
  def address(self) -> int:
    """The memory address kernels receive for this buffer."""
    return self._address if self.is_allocated else self.allocate()._address

  def _typed(self) -> np.ndarray:
    if self._host is None:
      self.allocate()
      if self._host is None: self._host = self._raw.view(self.dtype).reshape(self.shape)
    return self._host

  def numpy(self) -> np.ndarray:
    """The contents as a read-only numpy array (no copy)."""
    view = self._typed().view()
    view.flags.writeable = False
    return view

  def __repr__(self) -> str:
    return f"Buffer({self.shape}, {self.dtype.name}, {'allocated' if self.is_allocated else 'empty'})"


class ShardedBuffer(Buffer):
  """The buffer of an array with a `sharding` over several CPU devices (tinyjax/sharding.py): the whole array in host
  memory, which those devices share; each device's shard is a block of it. Made over another buffer's memory (no
  copy); `device` is the first device of the sharding's mesh."""
  __slots__ = ("sharding",)


def shard(buffer: Buffer, sharding) -> ShardedBuffer:
  """A CPU buffer's memory, laid out as `sharding` says (no copy), committed to its mesh's devices. It shares the
  buffer's block or host array (a block goes back to the pool only when neither holds it: `__del__` counts
  references), so a jitted call wraps its sharded outputs for a few hundred ns each."""
  if buffer._raw is None and buffer._host is None: buffer.allocate()
  out = object.__new__(ShardedBuffer)
  out.shape, out.dtype, out.nbytes = buffer.shape, buffer.dtype, buffer.nbytes
  out.device = sharding.mesh.devices.flat[0]
  out._raw, out._host, out._address, out._node = buffer._raw, buffer._host, buffer._address, None
  out.sharding, out.committed = sharding, True
  return out


def reinterpret(buffer: Buffer, shape: tuple[int, ...], dtype: np.dtype) -> Buffer:
  """A buffer's memory seen as another shape and dtype of the same size (no copy): a complex array computed as
  interleaved float pairs (lower/complex.py). A CPU buffer shares its block as `shard` does; a GPU buffer gives its
  `view`."""
  if isinstance(buffer, DeviceBuffer): return buffer.view(shape, dtype)
  if buffer._raw is None and buffer._host is None: buffer.allocate()
  out = object.__new__(Buffer)
  out.shape, out.dtype, out.device, out.committed = tuple(shape), np.dtype(dtype), buffer.device, buffer.committed
  out.nbytes = buffer.nbytes
  assert math.prod(out.shape) * out.dtype.itemsize == out.nbytes, (buffer, shape, dtype)
  host = buffer._host
  out._raw, out._address, out._node = buffer._raw, buffer._address, None
  out._host = None if host is None else host.reshape(-1).view(out.dtype).reshape(out.shape)
  return out


def is_exclusive(buffer: Buffer) -> bool:
  """Whether `buffer` is the only way to its memory: no numpy view of it was handed out (`numpy()`, `np.asarray` of
  an Array) and it was not made over someone else's host array. (A donated buffer is written over only then.)"""
  if type(buffer) is not Buffer: return False
  raw, host = buffer._raw, buffer._host
  if raw is not None:  # referenced by buffer._raw, `raw`, getrefcount's argument and the typed view's base, if any
    return sys.getrefcount(raw) == (3 if host is None else 4) and (host is None or sys.getrefcount(host) == 3)
  return host is not None and host.base is None and sys.getrefcount(host) == 3


class DeletedBuffer:
  """What an Array deleted by `delete()` or donated to a jitted call holds instead of its buffer: its shape, dtype and
  device remain (so signatures and error messages can be formed), any use of its memory raises as JAX does."""
  __slots__ = ("shape", "dtype", "nbytes", "device")
  committed = False  # (a deleted array is placed nowhere in particular)

  def __init__(self, shape: tuple[int, ...], dtype: np.dtype, device=CPU):
    self.shape, self.dtype, self.device = tuple(shape), np.dtype(dtype), device
    self.nbytes = math.prod(self.shape) * self.dtype.itemsize

  def _deleted(self) -> RuntimeError:
    return RuntimeError(f"Array has been deleted with shape={self.dtype.name}[{','.join(map(str, self.shape))}].")

  @property
  def _address(self) -> int: raise self._deleted()
  address = _address
  @property
  def is_allocated(self) -> bool: return False
  @property
  def size(self) -> int: return math.prod(self.shape)

  def allocate(self): raise self._deleted()
  def numpy(self): raise self._deleted()
  def __repr__(self) -> str: return f"DeletedBuffer({self.shape}, {self.dtype.name})"


def allocate_buffers(specs: list[tuple[tuple[int, ...], np.dtype, int]]) -> list[Buffer]:
  """New allocated buffers for `(shape, dtype, nbytes)` specs already normalised (a schedule's planned slots)."""
  global _pool_bytes
  buffers = []
  for shape, dtype, nbytes in specs:
    buffer = object.__new__(Buffer)
    if (free := _pool.get(nbytes)):  # take_block, inlined: this runs on every jitted call
      _pool_bytes -= nbytes
      buffer._raw, buffer._address = free.pop()
    else:
      buffer._raw, buffer._address = take_block(nbytes)
    buffer.shape, buffer.dtype, buffer.nbytes, buffer._host, buffer._node = shape, dtype, nbytes, None, None
    buffer.device, buffer.committed = CPU, False
    buffers.append(buffer)
  return buffers


class DeviceBuffer:
  """An array's storage in a GPU device's memory. Same interface as the CPU `Buffer`: `shape`, `dtype`, `nbytes`,
  `address` (the handle kernels get: `device.allocate(nbytes)`'s) and `numpy()` (a host copy, made once: computed
  buffers never change). The device provides `allocate(nbytes)`, `upload(handle, host)` and `read(buffer)`."""
  __slots__ = ("shape", "dtype", "nbytes", "device", "committed", "_address", "_host", "_node", "_base", "__weakref__")

  def __init__(self, shape: tuple[int, ...], dtype: np.dtype, device, host: np.ndarray | None = None):
    self.shape, self.dtype, self.device = tuple(int(d) for d in shape), np.dtype(dtype), device
    self.committed = False
    self._node = self._base = None
    self.nbytes = math.prod(self.shape) * self.dtype.itemsize
    self._address = device.allocate(self.nbytes)
    self._host = None
    if host is not None:
      host = np.require(host, requirements="C")
      assert host.shape == self.shape and host.dtype == self.dtype, (host.shape, host.dtype, self.shape, self.dtype)
      device.upload(self._address, host)

  @property
  def size(self) -> int: return math.prod(self.shape)
  @property
  def is_allocated(self) -> bool: return True
  @property
  def address(self): return self._address

  def allocate(self) -> DeviceBuffer: return self

  def view(self, shape: tuple[int, ...], dtype: np.dtype) -> DeviceBuffer:
    """The same device memory seen as another shape and dtype of the same size (no copy; `reinterpret`). The view
    holds this buffer (`_base`), whose memory is freed only when neither is left."""
    out = object.__new__(type(self))
    out.shape, out.dtype, out.device, out.committed = tuple(shape), np.dtype(dtype), self.device, self.committed
    out.nbytes, out._address, out._host, out._node = self.nbytes, self._address, None, None
    assert math.prod(out.shape) * out.dtype.itemsize == out.nbytes, (self, shape, dtype)
    out._base = self if self._base is None else self._base
    return out

  def numpy(self) -> np.ndarray:
    """The contents copied to the host (once), read-only."""
    if self._host is None:
      host = self.device.read(self)
      host.flags.writeable = False
      self._host = host
    return self._host

  def __repr__(self) -> str: return f"{type(self).__name__}({self.shape}, {self.dtype.name}, {self.device})"
