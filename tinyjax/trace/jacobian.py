"""Jacobians and Hessians, as JAX builds them: `jacfwd` pushes forward a basis of input tangents with `vmap(jvp)`,
`jacrev` pulls back a basis of output cotangents with `vmap(vjp_fn)`, and `hessian` is `jacfwd(jacrev(f))`.

The result for pytrees is JAX's: a tree shaped like the output whose leaves are trees shaped like the input, each
leaf of shape `out_leaf.shape + in_leaf.shape`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax.array import Array
from tinyjax.trace import ad
from tinyjax.trace.batching import vmap
from tinyjax.trace.core import check_callable
from tinyjax.uop import Ops


def _std_basis(leaves: list[Any]) -> tuple[list[Array], int]:
  """For leaves of total size N: per leaf, an (N, *leaf.shape) block of the N x N identity."""
  sizes = [int(np.prod(leaf.shape, dtype=np.int64)) for leaf in leaves]
  total, offset, basis = sum(sizes), 0, []
  for leaf, size in zip(leaves, sizes):
    block = np.zeros((total, size), dtype=leaf.dtype)
    block[offset:offset + size] = np.eye(size, dtype=leaf.dtype)
    basis.append(Array.from_numpy(block.reshape((total, *leaf.shape))))
    offset += size
  return basis, total


def _split_last(jac: Any, leaves: list[Any], leading_shape: tuple[int, ...], batch_axis_last: bool) -> list[Any]:
  """Split a jacobian block with one axis over all input (or output) elements into one block per leaf."""
  blocks, offset = [], 0
  for leaf in leaves:
    size = int(np.prod(leaf.shape, dtype=np.int64))
    if batch_axis_last:
      shape = tuple(jac.shape)
      piece = ad.bind(Ops.SHRINK, jac, arg=tuple((0, d) for d in shape[:-1]) + ((offset, offset + size),))
      blocks.append(ad.bind(Ops.RESHAPE, piece, arg=(*leading_shape, *leaf.shape)))
    else:
      shape = tuple(jac.shape)
      piece = ad.bind(Ops.SHRINK, jac, arg=((offset, offset + size),) + tuple((0, d) for d in shape[1:]))
      blocks.append(ad.bind(Ops.RESHAPE, piece, arg=(*leaf.shape, *leading_shape)))
    offset += size
  return blocks


def _diff_args(args: tuple, argnums: int | Sequence[int]) -> Any:
  """The differentiated argument (or the tuple of them, for several argnums)."""
  return args[argnums] if isinstance(argnums, int) else tuple(args[p] for p in argnums)


def _with_diff_args(fun: Callable, args: tuple, argnums: int | Sequence[int]) -> Callable:
  """`fun` as a function of the differentiated arguments only (one value, or a tuple for several argnums)."""
  positions = (argnums,) if isinstance(argnums, int) else tuple(argnums)

  def partial_fun(diff: Any) -> Any:
    call_args = list(args)
    for p, value in zip(positions, (diff,) if isinstance(argnums, int) else diff): call_args[p] = value
    return fun(*call_args)
  return partial_fun


def _check_inexact(name: str, leaves: list[Any], holomorphic: bool, what: str = "inputs") -> None:
  for leaf in leaves:
    if holomorphic and not dtypes.is_complex(leaf.dtype):
      raise TypeError(f"{name} with holomorphic=True requires {what} with complex dtype, but got {leaf.dtype.name}.")
    if not holomorphic and not dtypes.is_floating(leaf.dtype):
      raise TypeError(f"{name} requires real-valued {what} ({what[:-1]} dtype that is a sub-dtype of np.floating), but "
                      f"got {leaf.dtype.name}. For holomorphic differentiation, pass holomorphic=True.")


def _differentiated(name: str, fun: Callable, args: tuple, argnums: int | Sequence[int], holomorphic: bool):
  """`fun` as a function of the differentiated arguments, and those arguments as checked float (complex, when
  `holomorphic`) array leaves."""
  in_leaves, in_tree = tree_util.tree_flatten(_diff_args(args, argnums))
  in_leaves = [ad._to_array(x) for x in in_leaves]
  _check_inexact(name, in_leaves, holomorphic)
  return _with_diff_args(fun, args, argnums), in_leaves, in_tree


def jacfwd(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False,
           holomorphic: bool = False) -> Callable:
  """The Jacobian of `fun` by forward mode (one JVP per input element, batched with vmap); `holomorphic`: complex
  inputs, the complex derivative df/dz."""
  check_callable(fun)
  def jacfun(*args: Any) -> Any:
    partial_fun, in_leaves, in_tree = _differentiated("jacfwd", fun, args, argnums, holomorphic)
    chosen_arrays = tree_util.tree_unflatten(in_tree, in_leaves)
    basis, _ = _std_basis(in_leaves)

    def pushforward(*tangent_leaves: Any) -> Any:
      return ad.jvp(partial_fun, (chosen_arrays,), (tree_util.tree_unflatten(in_tree, list(tangent_leaves)),),
                    has_aux=has_aux)

    result = vmap(pushforward, in_axes=0, out_axes=(None, -1, None) if has_aux else (None, -1))(*basis)
    out, jac, aux = result if has_aux else (*result, None)
    out_leaves, out_tree = tree_util.tree_flatten(out)
    jac_leaves = tree_util.tree_leaves(jac)
    per_output = [tree_util.tree_unflatten(in_tree, _split_last(j, in_leaves, tuple(o.shape), True))
                  for j, o in zip(jac_leaves, out_leaves)]
    jacobian = tree_util.tree_unflatten(out_tree, per_output)
    return (jacobian, aux) if has_aux else jacobian
  return jacfun


def jacrev(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False,
           holomorphic: bool = False) -> Callable:
  """The Jacobian of `fun` by reverse mode (one VJP per output element, batched with vmap); `holomorphic`: complex
  inputs and outputs, the complex derivative df/dz."""
  check_callable(fun)
  def jacfun(*args: Any) -> Any:
    partial_fun, in_leaves, in_tree = _differentiated("jacrev", fun, args, argnums, holomorphic)
    result = ad.vjp(partial_fun, tree_util.tree_unflatten(in_tree, in_leaves), has_aux=has_aux)
    out, vjp_fn, aux = result if has_aux else (*result, None)
    out_leaves, out_tree = tree_util.tree_flatten(out)
    out_leaves = [ad._to_array(o) for o in out_leaves]
    _check_inexact("jacrev", out_leaves, holomorphic, "outputs")
    basis, _ = _std_basis(out_leaves)
    pulled = vmap(lambda *cts: vjp_fn(tree_util.tree_unflatten(out_tree, list(cts)))[0])(*basis)
    pulled_leaves = tree_util.tree_leaves(pulled)  # per input leaf: (M_total, *in_shape)
    per_input = [_split_last(p, out_leaves, tuple(x.shape), False) for p, x in zip(pulled_leaves, in_leaves)]
    per_output = [tree_util.tree_unflatten(in_tree, [blocks[k] for blocks in per_input])
                  for k in range(len(out_leaves))]
    jacobian = tree_util.tree_unflatten(out_tree, per_output)
    return (jacobian, aux) if has_aux else jacobian
  return jacfun


def hessian(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False,
            holomorphic: bool = False) -> Callable:
  """The Hessian of scalar `fun`: `jacfwd(jacrev(fun))`."""
  return jacfwd(jacrev(fun, argnums, has_aux, holomorphic), argnums, has_aux, holomorphic)


jacobian = jacrev  # JAX's name for the reverse-mode Jacobian
