"""Functions of tinyjax.numpy that apply a Python function over arrays, built on `tinyjax.vmap` as JAX's:
`vectorize` (with gufunc `signature=` and `excluded=`), `apply_along_axis`, `apply_over_axes`, `fromfunction`."""
from __future__ import annotations

import functools
import operator
import re
from typing import Any, Callable, Collection, Sequence

import numpy as np

from tinyjax.array import Array
from tinyjax.lax._base import canonicalize_axis
from tinyjax.trace.batching import vmap

# a gufunc signature: "(m,n),(n,p)->(m,p)"
_DIMENSION_NAME = r"\w+"
_CORE_DIMENSION_LIST = "(?:{0:}(?:,{0:})*)?".format(_DIMENSION_NAME)
_ARGUMENT = rf"\({_CORE_DIMENSION_LIST}\)"
_ARGUMENT_LIST = "{0:}(?:,{0:})*".format(_ARGUMENT)
_SIGNATURE = "^{0:}->{0:}$".format(_ARGUMENT_LIST)

CoreDims = tuple[str, ...]


def _parse_gufunc_signature(signature: str) -> tuple[list[CoreDims], list[CoreDims]]:
  """The core dimension names of each input and each output of a signature such as "(m,n),(n)->(m)"."""
  if not re.match(_SIGNATURE, signature): raise ValueError(f"not a valid gufunc signature: {signature}")
  inputs, outputs = ([tuple(re.findall(_DIMENSION_NAME, argument)) for argument in re.findall(_ARGUMENT, arguments)]
                     for arguments in signature.split("->"))
  return inputs, outputs


def _update_dim_sizes(dim_sizes: dict[str, int], shape: tuple[int, ...], core_dims: CoreDims, error_context: str,
                      *, is_input: bool) -> None:
  """Check one argument's core dimensions against the sizes seen so far, recording new ones in `dim_sizes`."""
  if is_input and len(shape) < len(core_dims):
    raise ValueError(f"input with shape {shape!r} does not have enough dimensions for all core dimensions "
                     f"{core_dims!r} {error_context}")
  if not is_input and len(shape) != len(core_dims):
    raise ValueError(f"output shape {shape!r} does not match core dimensions {core_dims!r} {error_context}")
  core_shape = shape[len(shape) - len(core_dims):]
  for dim, size in zip(core_dims, core_shape):
    if dim not in dim_sizes: dim_sizes[dim] = size
    elif size != dim_sizes[dim]:
      raise ValueError(f"inconsistent size for core dimension {dim!r}: {size!r} vs {dim_sizes[dim]!r} "
                       f"{error_context}")


def _check_output_dims(func: Callable, dim_sizes: dict[str, int], output_core_dims: list[CoreDims],
                       error_context: str) -> Callable:
  """`func`, checking that its outputs have the signature's core dimensions."""
  def checked(*args: Any) -> Any:
    out = func(*args)
    outputs = out if isinstance(out, tuple) else [out]
    if len(output_core_dims) > 1 and not isinstance(out, tuple):
      raise TypeError(f"output must be a tuple when multiple outputs are expected, got: {out!r}\n{error_context}")
    if len(outputs) != len(output_core_dims):
      raise TypeError(f"wrong number of output arguments: expected {len(output_core_dims)}, got {len(outputs)} "
                      f"{error_context}")
    sizes = dict(dim_sizes)
    for output, core_dims in zip(outputs, output_core_dims):
      _update_dim_sizes(sizes, np.shape(output), core_dims, error_context, is_input=False)
    return out
  return checked


def _apply_excluded(func: Callable, excluded: Collection[int | str], args: Sequence[Any],
                    kwargs: dict[str, Any]) -> tuple[Callable, list[Any], dict[str, Any]]:
  """`func` with the excluded positional and keyword arguments bound, and the remaining arguments."""
  if not excluded: return func, list(args), kwargs
  dynamic_args = [arg for i, arg in enumerate(args) if i not in excluded]
  dynamic_kwargs = {key: value for key, value in kwargs.items() if key not in excluded}
  static_args = [(i, args[i]) for i in sorted(e for e in excluded if isinstance(e, int)) if i < len(args)]
  static_kwargs = {key: value for key, value in kwargs.items() if key in excluded}

  def bound(*args: Any, **kwargs: Any) -> Any:
    args = list(args)
    for i, arg in static_args: args.insert(i, arg)
    return func(*args, **kwargs, **static_kwargs)
  return bound, dynamic_args, dynamic_kwargs


def vectorize(pyfunc: Callable, *, excluded: Collection[int | str] = frozenset(), signature: str | None = None
              ) -> Callable:
  """`pyfunc` mapped over the leading (broadcast) dimensions of its array arguments by nested `vmap`s.

  Without `signature`, `pyfunc` takes scalars; with a gufunc signature such as "(n),(n)->()" each argument keeps
  its core dimensions (the trailing ones named there, checked for consistent sizes) and the rest broadcast
  together. Positional indices and keyword names in `excluded` are passed through unmapped, as are `None`
  arguments. Keyword arguments not in `excluded` are passed through unmapped too (JAX drops them; numpy maps
  them)."""
  if any(not isinstance(e, (str, int)) for e in excluded):
    raise TypeError(f"jax.numpy.vectorize can only exclude integer or string arguments, but excluded={excluded!r}")
  if any(isinstance(e, int) and e < 0 for e in excluded):
    raise ValueError(f"excluded={excluded!r} contains negative numbers")

  @functools.wraps(pyfunc)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    from tinyjax import numpy as jnp
    error_context = f"on vectorized function with excluded={excluded!r} and signature={signature!r}"
    func, args, kwargs = _apply_excluded(pyfunc, excluded, args, kwargs)
    if kwargs: func = functools.partial(func, **kwargs)
    if signature is not None: input_core_dims, output_core_dims = _parse_gufunc_signature(signature)
    else: input_core_dims, output_core_dims = [()] * len(args), None
    none_args = {i for i, arg in enumerate(args) if arg is None}
    if none_args:
      if any(input_core_dims[i] != () for i in none_args):
        raise ValueError(f"Cannot pass None at locations {none_args} with signature={signature!r}")
      func, args, _ = _apply_excluded(func, none_args, args, {})
      input_core_dims = [dims for i, dims in enumerate(input_core_dims) if i not in none_args]
    args = [jnp.asarray(arg) for arg in args]
    if len(args) != len(input_core_dims):
      raise TypeError(f"wrong number of positional arguments: expected {len(input_core_dims)}, got {len(args)} "
                      f"{error_context}")
    dim_sizes: dict[str, int] = {}
    loop_shapes = []
    for arg, core_dims in zip(args, input_core_dims):
      _update_dim_sizes(dim_sizes, arg.shape, core_dims, error_context, is_input=True)
      loop_shapes.append(arg.shape[:arg.ndim - len(core_dims)])
    broadcast_shape = jnp.broadcast_shapes(*loop_shapes)
    if output_core_dims is not None: func = _check_output_dims(func, dim_sizes, output_core_dims, error_context)

    # one vmap per loop dimension, mapping only the arguments that have it (size-1 dimensions are squeezed away
    # and the argument passed unmapped there); a dimension no argument has is added to the result at the end
    squeezed_args, reversed_filled_shapes = [], []
    for arg, loop_shape in zip(args, loop_shapes):
      filled_shape = (1,) * (len(broadcast_shape) - len(loop_shape)) + loop_shape
      reversed_filled_shapes.append(filled_shape[::-1])
      squeezed_args.append(jnp.squeeze(arg, axis=tuple(i for i, size in enumerate(loop_shape) if size == 1)))
    mapped = func
    dims_to_expand = []
    for negative_dim, axis_sizes in enumerate(zip(*reversed_filled_shapes)):
      in_axes = tuple(None if size == 1 else 0 for size in axis_sizes)
      if all(axis is None for axis in in_axes): dims_to_expand.append(len(broadcast_shape) - 1 - negative_dim)
      else: mapped = vmap(mapped, in_axes)
    result = mapped(*squeezed_args)
    if not dims_to_expand: return result
    if isinstance(result, tuple): return tuple(jnp.expand_dims(r, axis=dims_to_expand) for r in result)
    return jnp.expand_dims(result, axis=dims_to_expand)
  return wrapped


def apply_along_axis(func1d: Callable, axis: int, arr: Any, *args: Any, **kwargs: Any) -> Array:
  """func1d(1-d slice, *args, **kwargs) for every 1-d slice of `arr` along `axis`; the result's dimensions take the
  place of `axis` (as numpy), by vmap over the other axes."""
  from tinyjax import numpy as jnp
  array = jnp.asarray(arr)
  axis = canonicalize_axis(axis, array.ndim)

  def func(x: Array) -> Any: return func1d(x, *args, **kwargs)
  for i in range(1, array.ndim - axis): func = vmap(func, in_axes=i, out_axes=-1)
  for _ in range(axis): func = vmap(func, in_axes=0, out_axes=0)
  return func(array)


def apply_over_axes(func: Callable, a: Any, axes: Sequence[int]) -> Array:
  """func(a, axis) applied for each axis in turn, the reduced axis kept as size 1 (func must keep the number of
  dimensions or drop the one axis)."""
  from tinyjax import numpy as jnp
  array = jnp.asarray(a)
  for axis in axes:
    result = func(array, axis)
    if result.ndim == array.ndim: array = result
    elif result.ndim == array.ndim - 1: array = jnp.expand_dims(result, axis)
    else: raise ValueError("function is not returning an array of the correct shape")
  return array


def fromfunction(function: Callable, shape: Sequence[int], *, dtype: Any = float, **kwargs: Any) -> Any:
  """function(i0, i1, ...) over the index grid of `shape`, the index arrays of `dtype` (default: the default float
  dtype, as numpy and JAX); by vmap, so `function` sees scalar indices."""
  from tinyjax import numpy as jnp
  shape = tuple(operator.index(d) for d in shape)
  for i in range(len(shape)):
    in_axes = [0 if i == j else None for j in range(len(shape))]
    function = vmap(function, in_axes=tuple(in_axes[::-1]))
  return function(*(jnp.arange(size, dtype=dtype) for size in shape), **kwargs)
