"""User-defined derivatives: `custom_jvp`, `custom_vjp`, and `checkpoint` (remat), with JAX's interfaces.

A custom_jvp function is an ordinary function to every trace but the JVP trace, which calls the user's rule
instead of differentiating the body. A custom_vjp function, differentiated in reverse mode, runs `fwd` on the primal
values and stages one CUSTOM_LINEAR node per output into the linear program; transposing that node calls `bwd`.
`checkpoint` is a custom_vjp whose residuals are just the inputs: the backward pass re-linearizes the function,
so nothing computed inside it is kept between the forward and backward passes.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from tinyjax import tree_util
from tinyjax.trace import ad, batching
from tinyjax.trace.core import Primitive, StagingTracer, current_trace, set_current_trace
from tinyjax.trace.jit import ShapeDtypeStruct
from tinyjax.uop import Ops, UOp


def _nondiff(argnums: int | Sequence[int]) -> tuple[int, ...]:
  return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def _split_args(args: tuple, nondiff_argnums: tuple[int, ...]) -> tuple[list[Any], list[Any]]:
  static = [args[i] for i in nondiff_argnums]
  dynamic = [a for i, a in enumerate(args) if i not in nondiff_argnums]
  return static, dynamic


class custom_jvp:  # noqa: N801  (JAX's name)
  """`@custom_jvp def f(x): ...` then `@f.defjvp def f_jvp(primals, tangents): return out, tangent_out`.
  `nondiff_argnums` arguments are passed to the rule first and get no tangents."""

  def __init__(self, fun: Callable, nondiff_argnums: int | Sequence[int] = ()):
    self.fun, self.nondiff_argnums, self.jvp = fun, _nondiff(nondiff_argnums), None
    functools.update_wrapper(self, fun, updated=())  # not the attributes of a wrapped jit or custom rule
    # inside a loop body the call is staged as this primitive, so that differentiating the body applies the rule
    self.primitive = Primitive(f"custom_jvp_call[{getattr(fun, '__name__', 'f')}]", self._flat_fun,
                               multiple_results=True, fixed=False)
    self._out_trees: dict[Any, Any] = {}
    ad.jvp_rules[self.primitive] = self._flat_rule
    batching.batch_rules[self.primitive] = self._flat_batch

  def defjvp(self, jvp: Callable) -> Callable:
    self.jvp = jvp
    return jvp

  def defjvps(self, *tangent_fns: Callable | None) -> None:
    """One function per argument, `tangent_fn(g, ans, *primals)`, whose contributions are summed (as JAX)."""
    def jvp(primals, tangents):
      out = self.fun(*primals)
      contributions = [fn(t, out, *primals) for fn, t in zip(tangent_fns, tangents) if fn is not None]
      return out, functools.reduce(lambda a, b: tree_util.tree_map(ad.add, a, b), contributions)
    self.jvp = jvp

  def __call__(self, *args: Any) -> Any:
    if self.jvp is None:
      raise AttributeError(f"No JVP defined for custom_jvp function {self.__name__} using defjvp.")
    trace = current_trace.get()
    if isinstance(trace, batching.BatchTrace): return self._call_batched(trace, args)
    from tinyjax.trace.control_flow import BodyTrace
    if isinstance(trace, BodyTrace): return self._call_staged(args)
    if isinstance(trace, ad.LinearTrace) and not any(trace.is_mine(x) for x in tree_util.tree_leaves(args)):
      # (a rule's primal work, staged by reverse mode below a trace that may differentiate it: the call is the
      # traces beneath's to interpret, so a JVP there applies this rule, as grad(grad(f)) needs)
      with set_current_trace(trace.parent): return self(*args)
    if not isinstance(trace, ad.JVPTrace): return self.fun(*args)
    static, dynamic = _split_args(args, self.nondiff_argnums)
    leaves, in_tree = tree_util.tree_flatten(dynamic)
    primals, tangents = trace.unpack(tuple(ad._to_array(leaf) for leaf in leaves))
    if all(t is None for t in tangents):  # nothing to differentiate here: the traces beneath may
      with set_current_trace(trace.tangent_trace): return self(*args)
    with set_current_trace(trace.tangent_trace):
      tangents = [ad.instantiate(t, p) for t, p in zip(tangents, primals)]
      primal_args = tree_util.tree_unflatten(in_tree, primals)
      tangent_args = tree_util.tree_unflatten(in_tree, tangents)
      out, tangent_out = self.jvp(*static, tuple(primal_args), tuple(tangent_args))
    out_leaves, out_tree = tree_util.tree_flatten(out)
    tangent_leaves, tangent_tree = tree_util.tree_flatten(tangent_out)
    if out_tree != tangent_tree:
      raise TypeError(f"Custom JVP rule of {self.__name__} must produce primal and tangent outputs with equal "
                      f"container (pytree) structures, but got {out_tree} and {tangent_tree}.")
    packed = [trace.pack(ad._to_array(o), ad.cast(ad._to_array(t), o.dtype) if ad.is_float(o) else None)
              for o, t in zip(out_leaves, tangent_leaves)]
    return tree_util.tree_unflatten(out_tree, packed)


  def _call_staged(self, args: tuple) -> Any:
    """In a loop body: one PRIMITIVE node (params: the static arguments and the input tree), whose JVP is the rule."""
    static, dynamic = _split_args(args, self.nondiff_argnums)
    leaves, in_tree = tree_util.tree_flatten(dynamic)
    key = (tuple(static), in_tree)
    try:
      hash(key)
    except TypeError:  # static arguments that cannot key a node: the body differentiates the definition
      return self.fun(*args)
    outs = self.primitive.bind(*(ad._to_array(leaf) for leaf in leaves), static=key[0], in_tree=in_tree)
    return tree_util.tree_unflatten(self._out_trees[key], outs)

  def _flat_fun(self, *flat: Any, static: tuple, in_tree: Any) -> list[Any]:
    out = self.fun(*_merge(self.nondiff_argnums, static, tree_util.tree_unflatten(in_tree, list(flat))))
    leaves, self._out_trees[(static, in_tree)] = tree_util.tree_flatten(out)
    return [ad._to_array(leaf) for leaf in leaves]

  def _flat_rule(self, primals: Sequence[Any], tangents: Sequence[Any], *, static: tuple, in_tree: Any
                 ) -> tuple[list[Any], list[Any]]:
    tangents = [ad.instantiate(t, p) for t, p in zip(tangents, primals)]
    out, tangent_out = self.jvp(*static, tuple(tree_util.tree_unflatten(in_tree, list(primals))),
                                tuple(tree_util.tree_unflatten(in_tree, tangents)))
    out_leaves, out_tree = tree_util.tree_flatten(out)
    tangent_leaves, tangent_tree = tree_util.tree_flatten(tangent_out)
    if out_tree != tangent_tree:
      raise TypeError(f"Custom JVP rule of {self.__name__} must produce primal and tangent outputs with equal "
                      f"container (pytree) structures, but got {out_tree} and {tangent_tree}.")
    outs = [ad._to_array(o) for o in out_leaves]
    return outs, [ad.cast(ad._to_array(t), o.dtype) if ad.is_float(o) else None for o, t in zip(outs, tangent_leaves)]

  def _flat_batch(self, trace: batching.BatchTrace, vals: Sequence[Any], dims: Sequence[Any], *, static: tuple,
                  in_tree: Any) -> tuple[list[Any], list[Any]]:
    """The staged call under vmap (a loop body being batched): batched as a direct call is (`_call_batched`)."""
    packed = [trace.pack(v, d) for v, d in zip(vals, dims)]
    args = _merge(self.nondiff_argnums, static, tree_util.tree_unflatten(in_tree, packed))
    with set_current_trace(trace):
      out = self._call_batched(trace, tuple(args))
    out_vals, out_dims = trace.unpack([ad._to_array(leaf) for leaf in tree_util.tree_leaves(out)])
    return list(out_vals), list(out_dims)

  def _call_batched(self, trace: batching.BatchTrace, args: tuple) -> Any:
    """Under vmap, the rule must survive for transformations below the batching (`grad(vmap(f))`): call, on the
    parent trace, a custom_jvp function whose body and rule are the batched body and rule."""
    static, dynamic = _split_args(args, self.nondiff_argnums)
    leaves, in_tree = tree_util.tree_flatten(dynamic)
    vals, dims = trace.unpack([ad._to_array(leaf) for leaf in leaves])
    if all(d is None for d in dims):
      with set_current_trace(trace.parent): return self(*args)

    def flat_fun(*flat: Any) -> Any:
      return self.fun(*_merge(self.nondiff_argnums, static, tree_util.tree_unflatten(in_tree, list(flat))))

    def flat_jvp(primals: list[Any], tangents: list[Any]) -> Any:
      return self.jvp(*static, tuple(tree_util.tree_unflatten(in_tree, primals)),
                      tuple(tree_util.tree_unflatten(in_tree, tangents)))

    batched = custom_jvp(batching.vmap(flat_fun, in_axes=tuple(dims), axis_size=trace.axis_size))
    batched.defjvp(lambda primals, tangents: batching.vmap(flat_jvp, in_axes=(list(dims), list(dims)),
                                                           axis_size=trace.axis_size)(list(primals), list(tangents)))
    with set_current_trace(trace.parent):
      out = batched(*vals)
    return tree_util.tree_map(lambda value: trace.pack(value, 0), out)


class _CustomLinear:
  """The staged linear map of a custom_vjp call: `transpose(index, ct)` feeds output `index`'s cotangent (zeros for
  the others: bwd is linear) to `bwd` and returns the cotangents of the differentiated inputs."""

  def __init__(self, bwd: Callable, residuals: Any, out_tree: Any, outs: list[Any], in_tree: Any, inputs: list[Any],
               name: str):
    self.bwd, self.residuals, self.out_tree, self.outs = bwd, residuals, out_tree, outs
    self.in_tree, self.inputs, self.name = in_tree, inputs, name
    self.out_shapes = [tuple(o.shape) for o in outs]

  def transpose(self, index: int, ct: Any) -> tuple[Any, ...]:
    cts = [ct if i == index else ad.zeros_like(o) for i, o in enumerate(self.outs)]
    result = self.bwd(self.residuals, tree_util.tree_unflatten(self.out_tree, cts))
    if not isinstance(result, (tuple, list)):
      raise TypeError(f"Custom VJP bwd rule of {self.name} must produce a tuple of cotangents, got {type(result)}")
    leaves, tree = tree_util.tree_flatten(tuple(result), is_leaf=lambda x: x is None)
    if tree != self.in_tree and len(leaves) != len(self.inputs):
      raise TypeError(f"Custom VJP bwd rule of {self.name} must produce an output with the same container (pytree) "
                      f"structure as the args tuple of the primal function, got {tree}, expected {self.in_tree}")
    return tuple(None if g is None else ad.cast(ad._to_array(g), x.dtype) for g, x in zip(leaves, self.inputs))

  __hash__ = object.__hash__


ad.transpose_rules[Ops.CUSTOM_LINEAR] = lambda ct, node, known: node.arg[0].transpose(node.arg[1], ct)


class custom_vjp:  # noqa: N801  (JAX's name)
  """`@custom_vjp def f(x): ...`, then `f.defvjp(fwd, bwd)` with `fwd(*args) -> (out, residuals)` and
  `bwd(residuals, cotangent) -> tuple of input cotangents`. Reverse mode only, as in JAX."""

  def __init__(self, fun: Callable, nondiff_argnums: int | Sequence[int] = ()):
    self.fun, self.nondiff_argnums, self.fwd, self.bwd = fun, _nondiff(nondiff_argnums), None, None
    functools.update_wrapper(self, fun, updated=())  # not the attributes of a wrapped jit or custom rule

  def defvjp(self, fwd: Callable, bwd: Callable) -> None:
    self.fwd, self.bwd = fwd, bwd

  def __call__(self, *args: Any) -> Any:
    if self.fwd is None:
      raise AttributeError(f"No VJP defined for custom_vjp function {self.__name__} using defvjp.")
    trace = current_trace.get()
    if isinstance(trace, batching.BatchTrace): return self._call_batched(trace, args)
    if not isinstance(trace, ad.JVPTrace): return self.fun(*args)
    static, dynamic = _split_args(args, self.nondiff_argnums)
    leaves, in_tree = tree_util.tree_flatten(tuple(dynamic))
    primals, tangents = trace.unpack(tuple(ad._to_array(leaf) for leaf in leaves))
    if all(t is None for t in tangents):
      with set_current_trace(trace.tangent_trace): return self.fun(*args)
    linear = trace.tangent_trace
    if not isinstance(linear, ad.LinearTrace):
      raise TypeError(f"can't apply forward-mode autodiff (jvp) to a custom_vjp function ({self.__name__}); use "
                      "reverse mode (grad, vjp) or define it with custom_jvp")
    with set_current_trace(linear.parent):
      primal_args = tree_util.tree_unflatten(in_tree, primals)
      out, residuals = self.fwd(*_merge(self.nondiff_argnums, static, primal_args))
    out_leaves, out_tree = tree_util.tree_flatten(out)
    out_leaves = [ad._to_array(o) for o in out_leaves]
    bwd = functools.partial(self.bwd, *static) if static else self.bwd
    handle = _CustomLinear(bwd, residuals, out_tree, out_leaves, in_tree, primals, self.__name__)
    tangent_uops = tuple(t.uop if linear.is_mine(t) else linear.const_param(ad.instantiate(t, p))
                         for t, p in zip(tangents, primals))
    packed = [trace.pack(o, StagingTracer(UOp(Ops.CUSTOM_LINEAR, o.dtype, tangent_uops, (handle, i)), o.weak_type,
                                          linear) if ad.is_float(o) else None)
              for i, o in enumerate(out_leaves)]
    return tree_util.tree_unflatten(out_tree, packed)

  def _call_batched(self, trace: batching.BatchTrace, args: tuple) -> Any:
    """Under vmap, call on the parent trace a custom_vjp whose fun, fwd and bwd are batched: bwd runs per example
    and the cotangent of an unbatched input is summed over the examples (so `grad(vmap(f))` keeps the rule)."""
    static, dynamic = _split_args(args, self.nondiff_argnums)
    leaves, in_tree = tree_util.tree_flatten(tuple(dynamic))
    vals, dims = trace.unpack([ad._to_array(leaf) for leaf in leaves])
    if all(d is None for d in dims):
      with set_current_trace(trace.parent): return self(*args)
    size = trace.axis_size

    def full_args(flat: Sequence[Any]) -> list[Any]:
      return _merge(self.nondiff_argnums, static, tree_util.tree_unflatten(in_tree, list(flat)))

    def flat_bwd(residuals: Any, cotangent: Any) -> list[Any]:
      grads = self.bwd(*static, residuals, cotangent)
      grad_leaves = tree_util.tree_leaves(tuple(grads), is_leaf=lambda g: g is None)
      return [ad.zeros_like(v) if g is None else ad._to_array(g) for g, v in zip(grad_leaves, example_vals)]

    example_vals = [_unbatched_like(v, d) for v, d in zip(vals, dims)]
    # (the same axis name, so that collectives inside over a vmap's or shard_map's axis find it)
    def rebatched(fn: Callable, in_axes: Any) -> Callable:
      return batching.batched(fn, in_axes, 0, trace.axis_name, size, trace.spmd)
    batched = custom_vjp(rebatched(lambda *flat: self.fun(*full_args(flat)), tuple(dims)))

    def batched_bwd(residuals: Any, cotangent: Any) -> tuple:
      per_example = rebatched(flat_bwd, (0, 0))(residuals, cotangent)
      return tuple(ad.bind(Ops.RESHAPE, ad.bind(Ops.REDUCE_AXIS, g, arg=(Ops.ADD, (0,))), arg=tuple(g.shape[1:]))
                   if d is None else batching.move_axis(g, 0, d) for g, d in zip(per_example, dims))

    batched.defvjp(rebatched(lambda *flat: self.fwd(*full_args(flat)), tuple(dims)), batched_bwd)
    with set_current_trace(trace.parent):
      out = batched(*vals)
    return tree_util.tree_map(lambda value: trace.pack(value, 0), out)


def _unbatched_like(value: Any, batch_dim: int | None) -> Any:
  """An abstract stand-in with one example's shape (only its shape and dtype are read)."""
  if batch_dim is None: return value
  shape = tuple(value.shape[:batch_dim]) + tuple(value.shape[batch_dim + 1:])
  return ShapeDtypeStruct(shape, value.dtype)


def _merge(nondiff_argnums: tuple[int, ...], static: Sequence[Any], dynamic: Sequence[Any]) -> list[Any]:
  """Put static and dynamic argument values back in their original positions."""
  static_iter, dynamic_iter = iter(static), iter(dynamic)
  return [next(static_iter) if i in nondiff_argnums else next(dynamic_iter) for i in range(len(static) + len(dynamic))]


def checkpoint(fun: Callable, *, prevent_cse: bool = True, policy: Any = None,
               static_argnums: int | Sequence[int] = ()) -> Callable:
  """`fun`, differentiated without keeping its intermediate values: reverse mode saves only the inputs and
  re-linearizes `fun` during the backward pass (JAX's remat; alias `remat`). `prevent_cse` and `policy` are
  accepted for compatibility; everything is recomputed."""
  static = _nondiff(static_argnums)

  def fwd(*args: Any) -> tuple[Any, tuple]:
    return fun(*args), tuple(a for i, a in enumerate(args) if i not in static)

  def bwd(*static_residuals_ct: Any) -> tuple:
    *static_values, inputs, ct = static_residuals_ct
    return tuple(ad.vjp(lambda *dynamic: fun(*_merge(static, static_values, dynamic)), *inputs)[1](ct))

  wrapped = custom_vjp(fun, nondiff_argnums=static)
  wrapped.defvjp(fwd, bwd)
  return wrapped


remat = checkpoint
