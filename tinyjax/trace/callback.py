"""`pure_callback`, as JAX's: call a Python function on the host from inside transformed code.

Eagerly the function runs at once on numpy values. Under `jit` the call is a CALLBACK node of the program, and the
schedule has a host step there (lower/schedule.py `HostCall`): the runtime launches the kernels before it, calls back
into Python (devices/cpu.py `HostProgram`), which hands the function its operands' values as numpy arrays and writes
its results into their buffers, and goes on: the program is still one call into the runtime. In a `scan` /
`while_loop` body it runs on every iteration. Under `vmap`, `vmap_method` says how: "sequential" calls it once per
example, "expand_dims" once with unbatched operands given a leading axis of size 1, "broadcast_all" once with every
operand broadcast to the batch; without one, vmap raises, but inside `shard_map` (whose mesh axes are batch axes
here) it runs once per device on that device's block, as JAX's does. It has no derivative (JAX's error); wrap it in
`custom_jvp` / `custom_vjp` to give it one.
"""
from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.devices.device import host_buffer, place, placement_of
from tinyjax.helpers import DEBUG
from tinyjax.trace import ad, batching
from tinyjax.trace.core import Primitive, Tracer, bind
from tinyjax.uop import BOOL, Ops, UOp

VMAP_METHODS = ("sequential", "expand_dims", "broadcast_all", "legacy_vectorized")


class NativeKernel(NamedTuple):
  """A host step's function as a compiled CPU kernel over the step's slots (inputs, then outputs): `source()` gives
  its name and LLVM IR (made on first use), launched over [0, count) with `grain` (lax/_small_linalg.py,
  lax/_fft.py). The lowering hands its source to the program's compile stream, so that it compiles with the program's
  own kernels."""
  source: Callable[[], tuple[str, str]]
  count: int
  grain: int


class HostCallback:
  """The arg of a CALLBACK node: a function of numpy arrays returning a list of them, and the results' avals
  ((shape, dtype) each). Compared by identity: a program is never shared between two callbacks."""

  def __init__(self, fn: Callable[..., list], out_avals: tuple, name: str, checked: bool = True,
               native: NativeKernel | None = None):
    # (`checked`: the results are checked against the declared avals; the library's own host steps, lax.linalg's
    # LAPACK calls, make them as declared: unchecked, 1-2 us less per step of a small solve)
    # (`native`: where the same function exists as a compiled CPU kernel over the step's slots (inputs, then outputs),
    # a NativeKernel: a CPU program launches it among its kernels, no call into Python (lax.linalg's small matrices,
    # lax/_small_linalg.py; FFTs, lax/_fft.py); `fn` still runs eagerly, under DEBUG and profiles)
    self.fn, self.out_avals, self.name, self.checked, self.native = fn, out_avals, name, checked, native

  def __repr__(self) -> str: return f"pure_callback[{self.name}@{id(self):x}]"

  def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Call the function; its results as arrays of the declared shapes and dtypes (ValueError / TypeError if not)."""
    start = time.perf_counter()
    results = self.fn(*inputs)
    out = [self._checked(index, value, aval) for index, (value, aval) in enumerate(zip(results, self.out_avals))] \
        if self.checked else results
    if DEBUG >= 1: print(f"*** host call {self.name:40s} {(time.perf_counter() - start) * 1e6:9.1f} us")
    return out

  def _checked(self, index: int, value: Any, aval: tuple) -> np.ndarray:
    """Result `index` as an array of its declared (shape, dtype) `aval`."""
    shape, dtype = aval
    array = np.asarray(value)
    if array.shape != tuple(shape):
      raise ValueError(f"pure_callback {self.name}: result {index} has shape {array.shape}, but "
                       f"result_shape_dtypes declared {tuple(shape)}")
    if array.dtype != dtype:  # (as JAX: a float64 result of a float32 declaration is rounded)
      if not np.can_cast(array.dtype, dtype, casting="same_kind"):
        raise TypeError(f"pure_callback {self.name}: result {index} has dtype {array.dtype}, but "
                        f"result_shape_dtypes declared {dtype}; convert it in the callback (np.asarray(x, "
                        f"{dtype.name!r}))")
      array = array.astype(dtype)
    return array


def host_call(callback: HostCallback, *args: Any) -> list[Array]:
  """Eagerly: call the function now. On a staging trace (jit, a loop body's lowering): a CALLBACK node. (Also how
  primitives computed on the host, as lax.linalg's LAPACK calls, are lowered.)"""
  if not any(isinstance(arg, Tracer) for arg in args):
    values = callback.run([np.asarray(arg) for arg in args])
    placed = [placement_of(arg.uop.arg) for arg in args if isinstance(arg, Array)]  # (realised by np.asarray)
    device, committed, _ = place(placed)  # the results go where a computation over the operands runs
    results = []
    for value in values:
      host = np.array(value, copy=True, order="C")
      host.flags.writeable = False
      buffer = host_buffer(host, device)
      buffer.committed = committed
      results.append(Array(UOp(Ops.BUFFER, host.dtype, (), buffer)))
    return results
  node = bind(Ops.CALLBACK, *args, arg=callback, dtype=BOOL)
  return [bind(Ops.PROJECT, node, arg=(index, tuple(shape)), dtype=dtype)
          for index, (shape, dtype) in enumerate(callback.out_avals)]


pure_callback_p = Primitive("pure_callback", lambda *args, callback, vmap_method: host_call(callback, *args),
                            multiple_results=True)


def _jvp(primals, tangents, *, callback, vmap_method):
  raise ValueError(f"Pure callbacks do not support JVP ({callback.name}). Please use `tinyjax.custom_jvp` to use "
                   "callbacks while taking gradients.")


def _batch(trace: batching.BatchTrace, vals, dims, *, callback: HostCallback, vmap_method: str | None):
  """vmap of a callback, as `vmap_method` says (see the module docstring); the results are batched along axis 0."""
  if all(d is None for d in dims): return pure_callback_p.bind(*vals, callback=callback, vmap_method=vmap_method), \
      [None] * len(callback.out_avals)
  size = trace.axis_size
  if vmap_method is None and getattr(trace, "mesh", None) is not None: vmap_method = "sequential"  # (a shard_map's)
  if vmap_method is None:
    raise NotImplementedError(f"vmap of pure_callback {callback.name} needs vmap_method: 'sequential' (one call per "
                              "example), 'expand_dims' or 'broadcast_all' (one call on the batch)")
  if vmap_method == "sequential":
    per_example = []
    for index in range(size):
      example = [v if d is None else _take(v, d, index) for v, d in zip(vals, dims)]
      per_example.append(pure_callback_p.bind(*example, callback=callback, vmap_method=vmap_method))
    from tinyjax.lax import concatenate
    stacked = [concatenate([bind(Ops.RESHAPE, outs[k], arg=(1, *outs[k].shape), weak_type=outs[k].weak_type)
                            for outs in per_example], 0) for k in range(len(callback.out_avals))]
    return stacked, [0] * len(stacked)
  # one call on the whole batch: the function receives a leading batch axis and must return results with one
  operands = []
  for v, d in zip(vals, dims):
    if d is not None: operands.append(batching.move_axis(v, d, 0))
    elif vmap_method == "expand_dims": operands.append(bind(Ops.RESHAPE, v, arg=(1, *v.shape), weak_type=v.weak_type))
    else: operands.append(batching.broadcast_axis(v, 0, size))
  batched_callback = HostCallback(callback.fn, tuple(((size, *shape), dtype) for shape, dtype in callback.out_avals),
                                  callback.name)
  outs = pure_callback_p.bind(*operands, callback=batched_callback, vmap_method=vmap_method)
  return outs, [0] * len(outs)


def _take(x: Any, axis: int, index: int) -> Any:
  """Slice `index` of `x` along `axis`, the axis removed."""
  bounds = tuple((index, index + 1) if i == axis else (0, s) for i, s in enumerate(x.shape))
  piece = bind(Ops.SHRINK, x, arg=bounds, weak_type=x.weak_type)
  return bind(Ops.RESHAPE, piece, arg=tuple(s for i, s in enumerate(x.shape) if i != axis), weak_type=x.weak_type)


ad.jvp_rules[pure_callback_p] = _jvp
batching.batch_rules[pure_callback_p] = _batch


def pure_callback(callback: Callable[..., Any], result_shape_dtypes: Any, *args: Any, sharding: Any = None,
                  vmap_method: str | None = None, **kwargs: Any) -> Any:
  """Call `callback(*args, **kwargs)` on the host with numpy arrays and return its results (a pytree of arrays shaped
  like `result_shape_dtypes`: ShapeDtypeStructs or arrays) as tinyjax arrays. It must be a pure function of its
  arguments: under `jit` it runs on each call of the compiled program, in program order with the kernels around it.
  `vmap_method`: how `vmap` calls it (see the module docstring). No derivative (ValueError under grad/jvp)."""
  if vmap_method is not None and vmap_method not in VMAP_METHODS:
    raise ValueError(f"pure_callback vmap_method must be one of {VMAP_METHODS} or None, got {vmap_method!r}")
  if not callable(callback): raise TypeError(f"pure_callback expects a callable, got {callback!r}")
  del sharding  # (one device computes it: the host)
  leaves, in_tree = tree_util.tree_flatten((args, kwargs))
  arrays = [leaf if isinstance(leaf, Array) else ad._to_array(leaf) for leaf in leaves]
  result_leaves, result_tree = tree_util.tree_flatten(result_shape_dtypes)
  out_avals = []
  for leaf in result_leaves:
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
      raise TypeError(f"pure_callback result_shape_dtypes must be a pytree of objects with .shape and .dtype "
                      f"(tinyjax.ShapeDtypeStruct, arrays), got {leaf!r}")
    out_avals.append((tuple(int(d) for d in leaf.shape), dtypes.canonicalize_dtype(np.dtype(leaf.dtype))))
  name = getattr(callback, "__name__", type(callback).__name__)

  def flat(*values: np.ndarray) -> list:
    call_args, call_kwargs = tree_util.tree_unflatten(in_tree, list(values))
    result = callback(*call_args, **call_kwargs)
    flat_result, tree = tree_util.tree_flatten(result)
    if tree != result_tree:
      raise TypeError(f"pure_callback {name}: the callback returned a value of structure {tree}, but "
                      f"result_shape_dtypes has structure {result_tree}")
    return flat_result

  outs = pure_callback_p.bind(*arrays, callback=HostCallback(flat, tuple(out_avals), name), vmap_method=vmap_method)
  return tree_util.tree_unflatten(result_tree, outs)
