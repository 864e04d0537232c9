"""`Array`: tinyjax's array type. Lazy: it holds a UOp over realised buffers, and runs only when a value is needed
(`__array__`, `item`, `tolist`, `bool`/`float`/`int`, `repr`, `block_until_ready`).

Python operators and methods (`+`, `@`, `.sum()`, `.reshape()`, ...) are attached by `tinyjax.numpy`, which sits
above this module, the way `jax.numpy` sets them on `jax.Array`.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from tinyjax.devices.buffer import Buffer, DeletedBuffer
from tinyjax.devices.device import host_buffer
from tinyjax.helpers import LazyModule
from tinyjax.uop import Ops, UOp, is_view, toposort_of

_realize = LazyModule("tinyjax.lower.realize")  # (it imports this module; and `import tinyjax` need not load it)


print_hooks: list = []  # functions giving an array's str() where a transformation prints it its own way, else None


class Array:
  """An immutable n-dimensional array. `shape`, `dtype` (a numpy dtype) and `weak_type` are known without running
  anything; the values are computed on first use and kept."""
  # `_named`: the NamedSharding the operations computing this array gave it (trace/sharding_types.py), else None
  __slots__ = ("uop", "weak_type", "_named", "__weakref__")
  __array_priority__ = 100  # numpy defers to our operators: np.float32(2) * x is an Array

  def __init__(self, uop: UOp, weak_type: bool = False):
    self.uop, self.weak_type, self._named = uop, weak_type, None

  @staticmethod
  def from_numpy(value: np.ndarray, weak_type: bool = False) -> Array:
    """A realised array holding a copy of `value` (already in a supported dtype)."""
    host = np.array(value, copy=True, order="C")
    host.flags.writeable = False
    return Array(UOp(Ops.BUFFER, host.dtype, (), host_buffer(host)), weak_type)

  @property
  def shape(self) -> tuple[int, ...]: return self.uop.shape
  @property
  def dtype(self) -> np.dtype: return self.uop.dtype
  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def size(self) -> int: return math.prod(self.shape)
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def is_realized(self) -> bool: return self.uop.op is Ops.BUFFER

  @property
  def device(self):
    """The device this array lives on (computing it if it is lazy)."""
    return self.realize().uop.arg.device

  def devices(self) -> set:
    """The set of devices this array lives on (one, or a sharded array's mesh devices)."""
    return self.sharding.device_set

  @property
  def sharding(self):
    """How this array is laid out over devices: a `tinyjax.sharding.NamedSharding` if it was placed or computed with
    one (`device_put`, `shard_map`, `jit(out_shardings=)`, or computed from such arrays: trace/sharding_types.py),
    else a `SingleDeviceSharding` of its device."""
    from tinyjax.sharding import SingleDeviceSharding
    if getattr(self, "_named", None) is not None: return self._named
    buffer = self.realize().uop.arg
    sharding = getattr(buffer, "sharding", None)
    return SingleDeviceSharding(buffer.device) if sharding is None else sharding

  @property
  def is_fully_replicated(self) -> bool: return self.sharding.is_fully_replicated

  @property
  def committed(self) -> bool:
    """Whether this array is committed to its devices, as JAX's: placed there by `device_put` (or `jit` with
    out_shardings), or computed from such arrays. A computation runs where its committed inputs are; two committed
    to different devices are a ValueError. Arrays made from host data (`jnp.arange`) are not."""
    return bool(getattr(self.realize().uop.arg, "committed", False))

  @property
  def global_shards(self) -> list:
    """One `Shard` per device: its `device`, its `index` into this array (a tuple of slices), its `replica_id` (0 for
    the first copy of a block) and its `data` (the block, an Array on that device)."""
    from tinyjax.sharding import Shard
    sharding = self.sharding
    shards, copies = [], {}
    for device, index in sharding.devices_indices_map(self.shape).items():
      key = tuple((s.start, s.stop) for s in index)
      replica = copies[key] = copies.get(key, -1) + 1
      shards.append(Shard(device, index, replica, self))
    return shards

  @property
  def addressable_shards(self) -> list:
    """The `global_shards` on this process's devices (all of them without tinyjax.distributed)."""
    from tinyjax.devices.device import process_index
    me = process_index()
    return [shard for shard in self.global_shards if getattr(shard.device, "process_index", 0) == me]

  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of unsized object")
    return self.shape[0]

  def __setitem__(self, index: Any, value: Any) -> None:
    raise TypeError("JAX arrays are immutable and do not support in-place item assignment. Instead of x[idx] = y, "
                    "use x = x.at[idx].set(y) or another .at[] method (.add, .multiply, .min, .max, .get)")

  def __hash__(self):
    raise TypeError("unhashable type: 'Array' (use a tuple of its values, or make it static with np.asarray)")

  def delete(self) -> None:
    """Delete this array, as JAX's `Array.delete`: any later use of its values raises RuntimeError. Its memory is
    freed once nothing else refers to it (a lazy array computed from this one keeps what it reads)."""
    device = self.uop.arg.device if self.uop.op is Ops.BUFFER else None
    self.uop = deleted_uop(self.shape, self.dtype, device)

  def is_deleted(self) -> bool:
    """Whether `delete()` was called on this array or it was donated to a jitted call (`donate_argnums`)."""
    return self.uop.op is Ops.BUFFER and type(self.uop.arg) is DeletedBuffer

  # ---- realisation: the only ways values leave the lazy graph
  def realize(self) -> Array:
    """Compute this array now (if it is not yet) and keep the result."""
    if self.uop.op is not Ops.BUFFER: realize_arrays([self])
    return self

  def block_until_ready(self) -> Array:
    """Compute this array and wait until its device has finished (GPU launches are asynchronous)."""
    self.realize().uop.arg.device.synchronize()
    return self

  def _value(self) -> np.ndarray:
    return self.realize().uop.arg.numpy()

  def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    value = self._value()
    if dtype is not None and np.dtype(dtype) != value.dtype: return value.astype(dtype)
    return value.copy() if copy else value

  def item(self, *args) -> Any: return self._value().item(*args)
  def tolist(self) -> Any: return self._value().tolist()

  def _scalar(self, kind: str) -> Any:
    """The one value of a size-1 array as a Python scalar (or an ml_dtypes scalar), for float(), int(), ... (A host
    buffer's value of a common dtype is read where it lies: no numpy view is made for it.)"""
    if self.size != 1:
      raise TypeError(f"only size-1 arrays can be converted to Python {kind}; this array has shape {self.shape}")
    if self.uop.op is not Ops.BUFFER: realize_arrays([self])
    buffer = self.uop.arg
    if type(buffer) is Buffer and buffer._address and (reader := _SCALAR_READERS.get(buffer.dtype)) is not None:
      return reader.from_address(buffer._address).value
    return self._value().item()

  def __bool__(self) -> bool:
    if self.size != 1:
      raise ValueError(f"The truth value of an array with shape {self.shape} is ambiguous. Use a.any() or a.all()")
    return bool(self._value())
  def __float__(self) -> float: return float(self._scalar("float"))
  def __int__(self) -> int: return int(self._scalar("int"))
  def __complex__(self) -> complex: return complex(self._scalar("complex"))

  def __index__(self) -> int:
    if self.dtype.kind not in "iub": raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
    return int(self._scalar("int"))

  def __repr__(self) -> str:
    body = np.array2string(self._value(), separator=", ", prefix="Array(")
    weak = ", weak_type=True" if self.weak_type else ""
    return f"Array({body}, dtype={self.dtype.name}{weak})"

  def __str__(self) -> str:
    for hook in print_hooks:  # (inside an eager shard_map: each device's block, trace/batching.py)
      if (shown := hook(self)) is not None: return shown
    return str(self._value())
  def __format__(self, spec: str) -> str:
    return format(self._value().item(), spec) if self.ndim == 0 else format(str(self), spec)

  def __iter__(self):
    if not self.shape: raise TypeError("iteration over a 0-d array")
    return (self[i] for i in range(self.shape[0]))

  def __reduce__(self):  # pickling stores the values
    return (Array.from_numpy, (self._value(), self.weak_type))


# dtype -> the ctypes type that reads one value of it as numpy's `item()` gives it (a Python float, int or bool)
_SCALAR_READERS = {np.dtype(dtype): reader for dtype, reader in (
  (np.float32, ctypes.c_float), (np.float64, ctypes.c_double), (np.bool_, ctypes.c_bool), (np.int8, ctypes.c_int8),
  (np.int16, ctypes.c_int16), (np.int32, ctypes.c_int32), (np.int64, ctypes.c_int64), (np.uint8, ctypes.c_uint8),
  (np.uint16, ctypes.c_uint16), (np.uint32, ctypes.c_uint32), (np.uint64, ctypes.c_uint64))}


def deleted_uop(shape: tuple[int, ...], dtype: np.dtype, device: Any = None) -> UOp:
  """The node a deleted array holds: a BUFFER whose buffer raises on any use of its memory."""
  return UOp(Ops.BUFFER, dtype, (), DeletedBuffer(shape, dtype) if device is None else
             DeletedBuffer(shape, dtype, device))


def held_arrays(pending: list[Array]) -> tuple[list[Array], set[UOp], list[UOp]]:
  """The live arrays (other than `pending`) whose lazy values the computation of `pending` passes through: eager
  operations record on each node the array they made (`held_by`). Computing them in the same schedule and keeping
  them means a value the program holds on to is computed once, as JAX computes every operation once: without it, a
  loop that updates state eagerly (an optimizer's moments, `m = 0.9 * m + g` each step) would recompute the state's
  whole history at each step, from a graph that grows with the number of steps. Views of buffers and constants stay
  lazy (they cost nothing to recompute and never grow). Also, from the same walk, the nodes whose computation reads
  some buffer (a node of constants alone may also be embedded in a jitted program's graph, which must not change
  under it: see `realize_arrays`), and the walk's order (every node the computation needs, sources first)."""
  targets = {id(a) for a in pending}
  held, reading = [], set()
  order = toposort_of([a.uop for a in pending])
  for node in order:
    if node.op is Ops.BUFFER or not reading.isdisjoint(node.src): reading.add(node)
    reference = node.__dict__.get("held_by")
    if reference is None or node.op is Ops.BUFFER: continue
    array = reference()
    if array is None or array.uop is not node or id(array) in targets or is_view(node): continue
    targets.add(id(array))
    held.append(array)
  return held, reading, order


def realize_arrays(arrays: list[Array]) -> None:
  """Compute several lazy arrays in one schedule (shared work is done once) and keep their buffers. So are the
  values on the way that other live arrays hold (`held_arrays`)."""
  pending = [a for a in arrays if a.uop.op is not Ops.BUFFER]
  if not pending: return
  if len(pending) == 1 and pending[0]._named is None:  # a small eager program, or one operation over buffers
    node = pending[0].uop
    if (signed := _realize.run_signed(node)) is not None:
      _keep(pending[0], node, *signed)
      return
    if (buffer := _realize.run_one_op(node)) is not None:
      _keep(pending[0], node, buffer, True)
      return
  held, reading, order = held_arrays(pending)
  pending += held
  buffers = _realize.realize([a.uop for a in pending], order)
  for array, buffer in zip(pending, buffers):
    if array._named is not None and buffer.device.platform == "cpu":  # computed from sharded arrays: laid out so
      from tinyjax.devices.buffer import shard
      buffer = shard(buffer, array._named)
    _keep(array, array.uop, buffer, array.uop in reading)


def _keep(array: Array, node: UOp, buffer, reads_buffers: bool) -> None:
  """Make `array` hold `buffer`, the value of its lazy `node` (whose computation reads some buffer, or only
  constants)."""
  if buffer._node is None and node.__dict__.get("held_by") is not None and reads_buffers:
    node.become_buffer(buffer)  # (graphs built on the lazy node now read the result: see UOp.become_buffer)
  else:
    array.uop = UOp(Ops.BUFFER, buffer.dtype, (), buffer)
