"""tinyjax.test_util.check_grads: JAX's check of a function's derivatives against finite differences, in forward
mode (jvp against a central difference along a random direction) and reverse mode (vjp against the jvp by the
inner-product identity <J t, c> = <t, J^T c>), to any order."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from tinyjax import dtypes, tree_util
from tinyjax import numpy as jnp
from tinyjax.trace.ad import jvp, vjp

# JAX's default tolerances per dtype for gradient checks, and the finite-difference step
_TOLERANCE = {np.dtype(np.float16): 1e-2, np.dtype(dtypes.bfloat16): 1e-1, np.dtype(np.float32): 2e-2,
              np.dtype(np.float64): 1e-5}
EPS = 1e-4


def _tolerance(tree: Any, given: float | None) -> float:
  if given is not None: return given
  leaves = tree_util.tree_leaves(tree)
  return max([_TOLERANCE.get(np.dtype(jnp.asarray(leaf).dtype), 2e-2) for leaf in leaves] or [2e-2])


def _random_like(rng: np.random.RandomState, tree: Any) -> Any:
  def draw(leaf: Any) -> Any:
    array = jnp.asarray(leaf)
    values = np.asarray(rng.randn(*array.shape))
    return jnp.asarray(values.astype(array.dtype if dtypes.is_floating(array.dtype) else np.float32))
  return tree_util.tree_map(draw, tree)


def _axpy(a: float, x: Any, y: Any) -> Any: return tree_util.tree_map(lambda u, v: a * u + v, x, y)


def _inner(x: Any, y: Any) -> float:
  return float(sum(np.vdot(np.asarray(u, np.float64), np.asarray(v, np.float64))
                   for u, v in zip(tree_util.tree_leaves(x), tree_util.tree_leaves(y))))


def _check_close(name: str, got: Any, want: Any, atol: float, rtol: float) -> None:
  for g, w in zip(tree_util.tree_leaves(got), tree_util.tree_leaves(want)):
    np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), atol=atol, rtol=rtol,
                               err_msg=name)


def numerical_jvp(f: Callable, primals: Sequence[Any], tangents: Sequence[Any], eps: float = EPS) -> Any:
  """(f(x + eps t) - f(x - eps t)) / (2 eps)."""
  plus = f(*_axpy(eps, tangents, primals))
  minus = f(*_axpy(-eps, tangents, primals))
  return tree_util.tree_map(lambda a, b: (jnp.asarray(a) - jnp.asarray(b)) / (2 * eps), plus, minus)


def check_jvp(f: Callable, f_jvp: Callable, args: Sequence[Any], atol: float | None = None,
              rtol: float | None = None, eps: float = EPS) -> None:
  """jvp of f at args along a random tangent against the central difference (AssertionError if not close)."""
  rng = np.random.RandomState(0)
  tangent = _random_like(rng, tuple(args))
  value, tangent_out = f_jvp(tuple(args), tangent)
  atol, rtol = _tolerance(args, atol), _tolerance(args, rtol)
  _check_close("jvp primal output", value, f(*args), atol, rtol)
  _check_close("jvp tangent output", tangent_out, numerical_jvp(f, args, tangent, eps), atol, rtol)


def check_vjp(f: Callable, f_vjp: Callable, args: Sequence[Any], atol: float | None = None,
              rtol: float | None = None, eps: float = EPS) -> None:
  """vjp of f at args against the central difference, by <J t, c> == <t, J^T c> (AssertionError if not)."""
  rng = np.random.RandomState(0)
  value, vjp_fn = f_vjp(*args)
  tangent = _random_like(rng, tuple(args))
  tangent_out = numerical_jvp(f, args, tangent, eps)
  cotangent = _random_like(rng, value)
  cotangent_out = vjp_fn(cotangent)
  atol, rtol = _tolerance(args, atol), _tolerance(args, rtol)
  np.testing.assert_allclose(_inner(tangent, cotangent_out), _inner(tangent_out, cotangent), atol=atol, rtol=rtol,
                             err_msg="vjp against the numerical jvp (inner products)")


def check_grads(f: Callable, args: Sequence[Any], order: int, modes: Sequence[str] = ("fwd", "rev"),
                atol: float | None = None, rtol: float | None = None, eps: float | None = None) -> None:
  """Check f's derivatives at args up to `order` in `modes` ("fwd", "rev") against finite differences; raises
  AssertionError naming the check that failed."""
  args, eps = tuple(args), EPS if eps is None else eps
  for mode in modes:
    if mode not in ("fwd", "rev"): raise ValueError(f"Unknown mode {mode!r}: use 'fwd' and/or 'rev'")

  def check(fun: Callable, fun_args: tuple, remaining: int) -> None:
    if "fwd" in modes:
      check_jvp(fun, lambda primals, tangents: jvp(fun, primals, tangents), fun_args, atol, rtol, eps)
      if remaining > 1:
        check(lambda *a: jvp(fun, a[:len(a) // 2], a[len(a) // 2:])[1], fun_args + fun_args, remaining - 1)
    if "rev" in modes:
      check_vjp(fun, lambda *a: vjp(fun, *a), fun_args, atol, rtol, eps)
      if remaining > 1:
        def vjp_of_output(*a: Any) -> Any:
          out, pullback = vjp(fun, *a)
          return pullback(out)
        check(vjp_of_output, fun_args, remaining - 1)
  check(f, args, order)
