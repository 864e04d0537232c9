"""Python operators and methods of `tinyjax.Array`, set on the class when tinyjax.numpy is imported (the way
jax.numpy sets them on jax.Array): `+ - * / // % ** @`, unary `- + abs ~`, `& | ^ << >>`, comparisons, reflected
forms, `x[...]`, and `astype, reshape, transpose, T, mT, sum, ..., dot`."""
from __future__ import annotations

from typing import Any, Callable

from tinyjax.array import Array
from tinyjax.numpy import _elementwise as ew
from tinyjax.numpy import _indexing, _linalg, _reductions, _shape


def _defer_to_others(fn: Callable[[Any, Any], Array], reflected: bool) -> Callable[[Array, Any], Any]:
  """A binary operator: NotImplemented for operand types we don't know, so Python tries the other side."""
  def operator(self: Array, other: Any) -> Any:
    if isinstance(other, (list, tuple, str, dict, set)) or other is None:
      return NotImplemented if not isinstance(other, (list, tuple)) else _reject_sequence(other)
    return fn(other, self) if reflected else fn(self, other)
  return operator


def _reject_sequence(other: Any) -> Array:
  raise TypeError(f"unsupported operand type {type(other).__name__} for an Array operator: convert it with "
                  "tinyjax.numpy.asarray first (as JAX requires)")


_BINARY = {
  "add": ew.add, "sub": ew.subtract, "mul": ew.multiply, "truediv": ew.true_divide, "floordiv": ew.floor_divide,
  "mod": ew.remainder, "pow": ew.power, "matmul": _linalg.matmul, "and": ew.bitwise_and, "or": ew.bitwise_or,
  "xor": ew.bitwise_xor, "lshift": ew.left_shift, "rshift": ew.right_shift,
}
_COMPARISONS = {"eq": ew.equal, "ne": ew.not_equal, "lt": ew.less, "le": ew.less_equal, "gt": ew.greater,
                "ge": ew.greater_equal}


def _reshape(self: Array, *shape: Any, order: str = "C") -> Array:
  """x.reshape(2, 3) or x.reshape((2, 3))."""
  if len(shape) == 1 and not isinstance(shape[0], int): shape = shape[0]
  return _shape.reshape(self, shape, order)


def _transpose(self: Array, *axes: Any) -> Array:
  """x.transpose(), x.transpose(1, 0) or x.transpose((1, 0))."""
  if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], int)): axes = axes[0]
  return _shape.transpose(self, axes or None)


def _divmod(self: Array, other: Any) -> tuple[Array, Array]:
  return ew.floor_divide(self, other), ew.remainder(self, other)


def _rdivmod(self: Array, other: Any) -> tuple[Array, Array]:
  return ew.floor_divide(other, self), ew.remainder(other, self)


def _array_namespace(self, /, *, api_version: str | None = None):
  """The array API namespace of tinyjax arrays: tinyjax.numpy (standard 2024.12; earlier versions' names too)."""
  if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
    raise ValueError(f"Unrecognized array API version {api_version!r}: tinyjax.numpy implements 2024.12")
  import tinyjax.numpy
  return tinyjax.numpy


def _to_device(self, device, /, *, stream=None):
  """This array on `device` (a Device or a Sharding): `device_put(x, device)`."""
  if stream is not None: raise NotImplementedError("to_device: streams are not supported; pass stream=None")
  from tinyjax.placement import device_put
  return device_put(self, device)


def _dlpack(self, /, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None):
  """A DLPack capsule of this array's memory (computed first if it is not yet), shared, not copied: a CPU array
  only (`np.from_dlpack(x)`, `torch.from_dlpack(x)`). The memory is read-only; a consumer of the pre-1.0 protocol
  (`max_version=None`), which can't be told so, gets a copy."""
  device = self.realize().uop.arg.device
  if device.platform != "cpu":  # (checked before its values are read back from the device)
    raise BufferError(f"__dlpack__: the array is on {device}; only CPU arrays export DLPack (move it with "
                      "jax.device_get or device_put(x, jax.devices('cpu')[0]) first)")
  host = self._value()
  if max_version is None or tuple(max_version) < (1, 0): host = host.copy()
  return host.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)


def _dlpack_device(self) -> tuple[int, int]:
  """(DLPack's device type, device id) of this array: (1, 0), the CPU (kDLCPU), for a CPU array."""
  device = self.realize().uop.arg.device
  if device.platform != "cpu": raise BufferError(f"__dlpack_device__: only CPU arrays export DLPack, not {device}")
  return (1, 0)


def attach() -> None:
  """Set the operators and methods on Array."""
  for name, fn in _BINARY.items():
    setattr(Array, f"__{name}__", _defer_to_others(fn, False))
    setattr(Array, f"__r{name}__", _defer_to_others(fn, True))
  for name, fn in _COMPARISONS.items(): setattr(Array, f"__{name}__", _defer_to_others(fn, False))
  Array.__divmod__, Array.__rdivmod__ = _divmod, _rdivmod
  Array.__neg__ = lambda self: ew.negative(self)
  Array.__pos__ = lambda self: ew.positive(self)
  Array.__abs__ = lambda self: ew.absolute(self)
  Array.__invert__ = lambda self: ew.bitwise_not(self)
  Array.__getitem__ = lambda self, index: _indexing.getitem(self, index)
  Array.at = property(_indexing._IndexUpdateHelper, doc="`x.at[index].set(v)`, `.add(v)`, ...: pure indexed updates.")
  methods = {
    "astype": ew.astype, "reshape": _reshape, "transpose": _transpose, "sum": _reductions.sum,
    "prod": _reductions.prod, "max": _reductions.max, "min": _reductions.min, "mean": _reductions.mean,
    "var": _reductions.var, "std": _reductions.std, "argmax": _reductions.argmax, "argmin": _reductions.argmin,
    "any": _reductions.any, "all": _reductions.all, "clip": ew.clip, "round": ew.round, "squeeze": _shape.squeeze,
    "flatten": _shape.ravel, "ravel": _shape.ravel, "swapaxes": _shape.swapaxes, "dot": _linalg.dot,
    "conj": ew.conjugate, "conjugate": ew.conjugate,
  }
  for name, fn in methods.items(): setattr(Array, name, fn)
  Array.T = property(lambda self: _shape.transpose(self), doc="The array with its axes reversed.")
  Array.mT = property(_shape.matrix_transpose, doc="The array with its last two axes swapped.")
  Array.real = property(ew.real, doc="The real part (the array itself if it is not complex).")
  Array.imag = property(ew.imag, doc="The imaginary part (zeros if the array is not complex).")
  Array.__array_namespace__ = _array_namespace
  Array.to_device = _to_device
  Array.__dlpack__, Array.__dlpack_device__ = _dlpack, _dlpack_device
