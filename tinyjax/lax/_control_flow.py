"""Control flow as JAX's lax has it: `scan`, `fori_loop`, `while_loop`, `map`, `cond`, `switch`.

`scan` and `while_loop` are primitives holding their traced bodies (tinyjax/trace/control_flow.py): under `jit` the
whole loop runs inside the compiled program (the runtime repeats the body's kernels), so a jitted scan of 1000 steps
is one call from Python. `fori_loop` with concrete bounds is a scan (so it is reverse-differentiable, as JAX), with
traced bounds a while loop. `map` is a scan without a carry.

`cond` and `switch` trace every branch (their output types must agree, as JAX) and run only the chosen one: with a
concrete index it is called directly; with a traced one the COND primitive holds the branches as programs and the
runtime runs the one the index picks. Only the taken branch is differentiated. Under `vmap` with a batched index
every branch runs and each example selects its own (as JAX).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.lax._base import cast, to_array
from tinyjax.trace.control_flow import aval_of, bind_cond, bind_scan, bind_while, trace_program
from tinyjax.trace import batching
from tinyjax.trace.core import ShapedArray, Tracer, check_callable


def _leaf_array(x: Any) -> Array:
  if isinstance(x, Array): return x
  if isinstance(x, (bool, int, float, np.ndarray, np.generic)): return to_array(x)
  raise TypeError(f"Value {x!r} of type {type(x).__name__} is not a valid JAX type: loop carries, xs and branch "
                  "operands must be arrays or Python scalars")


def _type_string(avals: Sequence[tuple]) -> str:
  return ", ".join(f"{np.dtype(dtype).name}{list(shape)}{'{weak_type=True}' if weak else ''}"
                   for shape, dtype, weak in avals)


def _check_carry(name: str, in_tree: Any, out_tree: Any, in_avals: list[tuple], out_avals: list[tuple]) -> bool:
  """JAX's checks of a loop body's carry output against its input: same tree, shapes and dtypes (TypeError
  otherwise). Returns whether only weak types differ (the caller then retraces with strongly typed carries)."""
  if in_tree != out_tree:
    raise TypeError(f"{name} body function carry input and carry output must have the same pytree structure, but "
                    f"they differ:\n  the input carry has structure {in_tree}\n  the output carry has structure "
                    f"{out_tree}")
  for index, (a, b) in enumerate(zip(in_avals, out_avals)):
    if a[0] != b[0] or a[1] != b[1]:
      raise TypeError(f"{name} body function carry input and carry output must have equal types, but they differ: "
                      f"the input carry component {index} has type {_type_string([a])} but the corresponding output "
                      f"carry component has type {_type_string([b])}, so the "
                      f"{'shapes do not match' if a[0] != b[0] else 'dtypes do not match'}.")
  return any(a[2] != b[2] for a, b in zip(in_avals, out_avals))


def _varying(program: Any, inputs: Sequence[Any], consts: Sequence[Any]) -> tuple[list[tuple], list[tuple]] | None:
  """Under shard_map's check_vma: the mesh axes each input and each output of a traced body varies over (JAX's vma),
  sorted; None outside a shard_map."""
  traces = [trace for trace in batching._named_traces() if trace.spmd]
  if not traces: return None
  varying = {trace: trace.varying_nodes(program, len(inputs), list(consts), list(inputs)) for trace in traces}
  inside = [tuple(sorted(str(t.axis_name) for t in traces if batching._varies(v, t))) for v in inputs]
  outside = [tuple(sorted(str(t.axis_name) for t in traces if out in varying[t])) for out in program.src]
  return inside, outside


def _vma_type(aval: tuple, axes: tuple) -> str:
  return ShapedArray(aval[0], aval[1], vma=axes).str_short()


def _component_names(function: Callable, tree: Any, default: str) -> list[str]:
  """How JAX's errors name each leaf of a body function's first argument: its parameter name and the leaf's path."""
  try: name = next(iter(inspect.signature(function).parameters))
  except (TypeError, ValueError, StopIteration): name = default
  paths = [tree_util.keystr(path) for path, _ in tree_util.tree_flatten_with_path(
    tree_util.tree_unflatten(tree, [0] * tree.num_leaves))[0]]
  return [name + path for path in paths]


_VMA_HELP = "See https://docs.jax.dev/en/latest/notebooks/shard_map.html#scan-vma for more information."


def _check_carry_vma(name: str, body: Callable, tree: Any, program: Any, carries: Sequence[Any],
                     inputs: Sequence[Any], consts: Sequence[Any], avals: Sequence[tuple]) -> None:
  """JAX's TypeError under shard_map when a loop's carry varies over other mesh axes coming out of the body than
  going in (a carry made varying in the body must be varying from the start: `lax.pvary` / `pcast`)."""
  found = _varying(program, inputs, consts)
  if found is None: return
  inside, outside = found
  names = _component_names(body, tree, "carry")
  bad = [k for k in range(len(carries)) if inside[k] != outside[k]]
  if not bad: return
  single = tree.num_leaves == 1 and not names[0].endswith("]")
  what = "carry" if single else "carry component"

  def line(k: int) -> str:
    return (f"the input {what} {names[k]} has type {_vma_type(avals[k], inside[k])} but the corresponding output "
            f"carry component has type {_vma_type(avals[k], outside[k])}, so the manual axis types do not match")
  details = line(bad[0])[0].upper() + line(bad[0])[1:] + "." if len(bad) == 1 else \
      "\n".join(f"  * {line(k)}{';' if i < len(bad) - 1 else '.'}" for i, k in enumerate(bad))
  hint = ""
  grow = next((k for k in bad if set(inside[k]) < set(outside[k])), None)
  if grow is not None:
    axes = tuple(a for a in outside[grow] if a not in inside[grow])
    hint = (f"\n\nThis might be fixed by applying `jax.lax.pcast(..., {axes!r}, to='varying')`, to the initial carry "
            f"value corresponding to the input {what} {names[grow]}.\n{_VMA_HELP}")
  raise TypeError(f"{name} body function carry input and carry output must have equal types, but they differ:\n\n"
                  f"{details}{hint}\n\nRevise the function so that all output types match the corresponding input "
                  "types.")


def _strong(arrays: list[Array]) -> list[Array]:
  return [cast(a, a.dtype, False) if a.weak_type else a for a in arrays]


def scan(f: Callable, init: Any, xs: Any = None, length: int | None = None, reverse: bool = False,
         unroll: int | bool = 1, _split_transpose: bool = False) -> tuple[Any, Any]:
  """Loop `f(carry, x) -> (carry, y)` over the leading axis of `xs` (pytrees), returning the final carry and the
  stacked ys: `for x in xs: carry, y = f(carry, x); ys.append(y)`. `length` is needed when xs is None; `reverse`
  runs from the end (ys keep their positions); `unroll` is accepted (the loop runs inside the compiled program)."""
  check_callable(f)
  carry_leaves, carry_tree = tree_util.tree_flatten(init)
  x_leaves, x_tree = tree_util.tree_flatten(xs)
  carries = [_leaf_array(c) for c in carry_leaves]
  xs_arrays = [_leaf_array(x) for x in x_leaves]
  for x in xs_arrays:
    if x.ndim == 0: raise ValueError("scan got value with no leading axis to scan over: xs leaves must have ndim >= 1")
  lengths = {x.shape[0] for x in xs_arrays}
  if length is not None:
    length = int(length)
    if lengths and lengths != {length}:
      raise ValueError(f"scan got `length` argument of {length} which disagrees with leading axis sizes "
                       f"{sorted(lengths)}.")
  elif len(lengths) > 1:
    sizes = ", ".join(str(size) for size in sorted(lengths))
    raise ValueError(f"scan got values with different leading axis sizes: {sizes}.")
  elif not lengths:
    raise ValueError("scan got no values to scan over and `length` not provided.")
  else:
    length = lengths.pop()
  for attempt in range(2):
    carry_avals = [aval_of(c) for c in carries]
    x_avals = [(tuple(x.shape[1:]), x.dtype, x.weak_type) for x in xs_arrays]

    def body(*args: Any) -> Any:
      carry = tree_util.tree_unflatten(carry_tree, list(args[:len(carries)]))
      x = tree_util.tree_unflatten(x_tree, list(args[len(carries):]))
      out = f(carry, x)
      if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"scan body output must be a pair (carry, y), got {type(out).__name__}")
      return tuple(out)

    program, out_avals, consts, out_tree = trace_program(body, carry_avals + x_avals, "scan")
    pair_children = tree_util.treedef_children(out_tree)
    new_carry_tree, y_tree = pair_children
    n_carry = len(carries)
    if not _check_carry("scan", carry_tree, new_carry_tree, carry_avals, out_avals[:n_carry]) or attempt: break
    carries = _strong(carries)
  _check_carry_vma("scan", f, carry_tree, program, carries, carries + xs_arrays, consts, carry_avals)
  outs = bind_scan(carries, xs_arrays, consts, program, out_avals, length, bool(reverse))
  return (tree_util.tree_unflatten(new_carry_tree, outs[:n_carry]),
          tree_util.tree_unflatten(y_tree, outs[n_carry:]))


def map(f: Callable, xs: Any, *, batch_size: int | None = None) -> Any:  # noqa: A001
  """`f` applied to each slice of `xs` along its leading axis, stacked: a scan without a carry."""
  check_callable(f)
  _, ys = scan(lambda carry, x: (carry, f(x)), (), xs)
  return ys


def while_loop(cond_fun: Callable, body_fun: Callable, init_val: Any) -> Any:
  """`while cond_fun(val): val = body_fun(val)`, as one loop inside the compiled program. Forward-mode
  differentiable; reverse mode raises a ValueError (use scan or fori_loop with static bounds), as JAX."""
  check_callable(cond_fun)
  check_callable(body_fun)
  leaves, tree = tree_util.tree_flatten(init_val)
  carries = [_leaf_array(c) for c in leaves]
  for attempt in range(2):
    avals = [aval_of(c) for c in carries]
    def as_tree(*args: Any) -> Any: return tree_util.tree_unflatten(tree, list(args))
    cond_program, cond_avals, cond_consts, _ = trace_program(lambda *a: cond_fun(as_tree(*a)), avals, "while_loop")
    if len(cond_avals) != 1 or cond_avals[0][0] != () or cond_avals[0][1] != np.dtype(bool):
      raise TypeError(f"cond_fun must return a boolean scalar, but got output type(s) [{_type_string(cond_avals)}].")
    body_program, body_avals, body_consts, body_tree = trace_program(lambda *a: body_fun(as_tree(*a)), avals,
                                                                     "while_loop")
    if not _check_carry("while_loop", tree, body_tree, avals, body_avals) or attempt: break
    carries = _strong(carries)
  _check_carry_vma("while_loop", body_fun, tree, body_program, carries, carries, body_consts, avals)
  outs = bind_while(carries, [], cond_program, cond_consts, body_program, body_consts, body_avals)
  return tree_util.tree_unflatten(tree, outs)


def _concrete_int(x: Any) -> int | None:
  """A loop bound's Python value, or None when it is traced."""
  if isinstance(x, Tracer): return None
  if isinstance(x, (int, np.integer)): return int(x)
  if isinstance(x, (Array, np.ndarray)) and np.ndim(x) == 0: return int(np.asarray(x))
  return None


def fori_loop(lower: Any, upper: Any, body_fun: Callable, init_val: Any, *, unroll: int | bool | None = None) -> Any:
  """`for i in range(lower, upper): val = body_fun(i, val)`. With concrete bounds a scan (reverse-differentiable),
  else a while loop (forward-mode only), as JAX."""
  check_callable(body_fun)
  for name, bound in (("lower", lower), ("upper", upper)):
    bound_dtype = bound.dtype if isinstance(bound, (Array, np.ndarray, np.generic)) else np.asarray(bound).dtype
    if not dtypes.issubdtype(bound_dtype, np.integer):
      raise TypeError(f"fori_loop {name} bound must be an integer, got {bound_dtype}")
  index_dtype = dtypes.result_type(lower, upper)
  start, stop = _concrete_int(lower), _concrete_int(upper)
  if start is not None and stop is not None:
    def step(loop_carry: Any, _: Any) -> Any:  # (JAX's errors name the carry `loop_carry`)
      i, val = loop_carry
      return (i + 1, body_fun(i, val)), None
    # (the index starts as the Python int, weakly typed, whatever the bounds' dtype, as JAX's: `fori_loop(0, 10,
    # lambda i, x: x + i, 0)` stays a weak int32)
    (_, result), _ = scan(step, (start, init_val), None, length=max(stop - start, 0))
    return result
  lower_array, upper_array = cast(to_array(lower), index_dtype, False), cast(to_array(upper), index_dtype, False)
  _, _, result = while_loop(lambda carry: carry[0] < carry[1],
                            lambda carry: (carry[0] + 1, carry[1], body_fun(carry[0], carry[2])),
                            (lower_array, upper_array, init_val))
  return result


def switch(index: Any, branches: Sequence[Callable], *operands: Any) -> Any:
  """`branches[index](*operands)`, the index clamped into range. Every branch is traced (their outputs must have
  the same types, as JAX); only the chosen one runs, also under `jit`, and only it is differentiated."""
  branches = list(branches)
  if not branches: raise ValueError("Empty branch sequence")
  for branch in branches: check_callable(branch)
  index_array = index if isinstance(index, Array) else to_array(index)
  if index_array.ndim != 0:
    raise TypeError(f"Branch index must be scalar, got {index_array.dtype.name}{list(index_array.shape)}")
  if not dtypes.issubdtype(index_array.dtype, np.integer) and index_array.dtype != np.bool_:
    raise TypeError(f"Index type must be an integer, got {index_array.dtype.name}.")
  leaves, in_tree = tree_util.tree_flatten(operands)
  arrays = [_leaf_array(leaf) for leaf in leaves]
  in_avals = [aval_of(a) for a in arrays]
  traced = []
  for branch in branches:
    def flat(*args: Any, branch=branch) -> Any: return branch(*tree_util.tree_unflatten(in_tree, list(args)))
    traced.append(trace_program(flat, in_avals, "switch"))
  _, first_avals, _, first_tree = traced[0]
  for _, avals, _, tree in traced[1:]:
    if tree != first_tree:
      raise TypeError(f"branch outputs must have the same pytree structure, got {first_tree} and {tree}")
    if [a[:2] for a in avals] != [a[:2] for a in first_avals]:
      raise TypeError(f"branch outputs must have identical types, got [{_type_string(first_avals)}] and "
                      f"[{_type_string(avals)}]")
  _check_branches_vma(branches, traced, arrays)
  concrete = _concrete_int(index_array) if index_array.dtype != np.bool_ else \
    (None if isinstance(index_array, Tracer) else int(bool(index_array)))
  if concrete is not None: return branches[min(max(concrete, 0), len(branches) - 1)](*operands)
  out_avals = [(shape, dtype, all(t[1][k][2] for t in traced)) for k, (shape, dtype, _) in enumerate(first_avals)]
  outs = bind_cond(cast(index_array, np.int32, False), arrays, [(program, consts) for program, _, consts, _ in traced],
                   out_avals)
  return tree_util.tree_unflatten(first_tree, outs)


def _check_branches_vma(branches: list[Callable], traced: list[tuple], arrays: list[Any]) -> None:
  """JAX's TypeError under shard_map when two branches' outputs vary over different mesh axes."""
  kinds = [_varying(program, arrays, consts) for program, _, consts, _ in traced]
  if kinds[0] is None: return
  labels = ["false_fun", "true_fun"] if len(branches) == 2 else [f"branch {k}" for k in range(len(branches))]
  first_outputs = kinds[0][1]
  for b, (_, outputs) in enumerate(kinds[1:], 1):
    for k, (a, c) in enumerate(zip(first_outputs, outputs)):
      if a == c: continue
      one, other = (b, 0) if len(branches) == 2 else (0, b)  # (cond names true_fun first, as JAX)
      axes = {0: a, b: c}
      aval = traced[0][1][k]
      where = lambda j: f"{labels[j]} is {getattr(branches[j], '__name__', repr(branches[j]))}"  # noqa: E731
      name = "cond" if len(branches) == 2 else "switch"
      raise TypeError(
        f"{name} branches must have equal output types but they differ.\n\n{where(one)}\n{where(other)}\n\nThe "
        f"output of {labels[one]} has type {_vma_type(aval, axes[one])} but the corresponding output of "
        f"{labels[other]} has type {_vma_type(aval, axes[other])}, so the manual axis types do not match.\n\n"
        f"{_VMA_HELP}\n\nRevise {labels[one]} and/or {labels[other]} so that all output types match.")


def cond(pred: Any, true_fun: Callable, false_fun: Callable, *operands: Any) -> Any:
  """`true_fun(*operands)` if `pred` else `false_fun(*operands)`: only the chosen branch runs (also under `jit`)
  and only it is differentiated; under `vmap` with a batched predicate both run and each example selects."""
  check_callable(true_fun)
  check_callable(false_fun)
  pred_array = pred if isinstance(pred, Array) else to_array(pred)
  if pred_array.ndim != 0:
    raise TypeError(f"Pred must be a scalar, got {pred_array.dtype.name}{list(pred_array.shape)}.")
  if not (pred_array.dtype == np.bool_ or dtypes.issubdtype(pred_array.dtype, np.number)):
    raise TypeError(f"Pred type must be either boolean or number, got {pred_array.dtype.name}.")
  if pred_array.dtype != np.bool_:
    from tinyjax.lax._elementwise import ne
    pred_array = ne(pred_array, 0)
  return switch(cast(pred_array, np.int32, False), [false_fun, true_fun], *operands)
