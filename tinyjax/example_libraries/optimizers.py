"""JAX's example optimizers: each is an `Optimizer(init_fn, update_fn, params_fn)` triple over pytrees of parameters.

    opt_init, opt_update, get_params = optimizers.adam(1e-3)
    opt_state = opt_init(params)
    opt_state = opt_update(step, grads, opt_state)     # step: the iteration number, for schedules
    params = get_params(opt_state)

An optimizer is written for one array (`init(x) -> state`, `update(i, g, state) -> state`, `get_params(state) -> x`)
and `optimizer` lifts it to pytrees: the state of a whole tree is an `OptimizerState`, itself a pytree, so it passes
through `jit`. Step sizes are numbers or schedules (functions of the step).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

from tinyjax import tree_util
from tinyjax import numpy as jnp

Schedule = Callable[[Any], Any]


class Optimizer(NamedTuple):
  init_fn: Callable
  update_fn: Callable
  params_fn: Callable


class OptimizerState:
  """The per-leaf states (flattened), the params' tree structure and each leaf state's own structure. A pytree whose
  children are the states' arrays (the structures are static), so it passes through `jit`; unpacks as a triple."""
  __slots__ = ("packed_state", "tree_def", "subtree_defs")

  def __init__(self, packed_state: list, tree_def: Any, subtree_defs: tuple):
    self.packed_state, self.tree_def, self.subtree_defs = packed_state, tree_def, subtree_defs

  def __iter__(self): return iter((self.packed_state, self.tree_def, self.subtree_defs))
  def __repr__(self) -> str: return f"OptimizerState(tree={self.tree_def})"


tree_util.register_pytree_node(
  OptimizerState,
  lambda state: ((state.packed_state,), (state.tree_def, state.subtree_defs)),
  lambda aux, children: OptimizerState(children[0], aux[0], aux[1]))


def make_schedule(scalar_or_schedule: float | Schedule) -> Schedule:
  if callable(scalar_or_schedule): return scalar_or_schedule
  if jnp.ndim(scalar_or_schedule) == 0: return constant(scalar_or_schedule)
  raise TypeError(f"step size must be a scalar or a schedule (a function of the step), got {scalar_or_schedule!r}")


def optimizer(opt_maker: Callable[..., tuple[Callable, Callable, Callable]]) -> Callable[..., Optimizer]:
  """Lift an optimizer written for one array to pytrees of arrays."""
  @functools.wraps(opt_maker)
  def tree_opt_maker(*args: Any, **kwargs: Any) -> Optimizer:
    init, update, get_params = opt_maker(*args, **kwargs)

    def tree_init(x0_tree: Any) -> OptimizerState:
      leaves, tree = tree_util.tree_flatten(x0_tree)
      states = [init(x0) for x0 in leaves]
      flat = [tree_util.tree_flatten(state) for state in states]
      return OptimizerState([leaves for leaves, _ in flat], tree, tuple(sub for _, sub in flat))

    def tree_update(i: Any, grad_tree: Any, opt_state: OptimizerState) -> OptimizerState:
      packed, tree, subtrees = opt_state
      grads, grad_tree_def = tree_util.tree_flatten(grad_tree)
      if grad_tree_def != tree:
        raise TypeError(f"optimizer update: the gradient tree {grad_tree_def} does not match the parameter tree "
                        f"{tree}")
      states = [tree_util.tree_unflatten(sub, leaves) for sub, leaves in zip(subtrees, packed)]
      new_states = [update(i, g, state) for g, state in zip(grads, states)]
      flat = [tree_util.tree_flatten(state) for state in new_states]
      return OptimizerState([leaves for leaves, _ in flat], tree, tuple(sub for _, sub in flat))

    def tree_get_params(opt_state: OptimizerState) -> Any:
      packed, tree, subtrees = opt_state
      states = [tree_util.tree_unflatten(sub, leaves) for sub, leaves in zip(subtrees, packed)]
      return tree_util.tree_unflatten(tree, [get_params(state) for state in states])
    return Optimizer(tree_init, tree_update, tree_get_params)
  return tree_opt_maker


@optimizer
def sgd(step_size: float | Schedule):
  """x <- x - step_size(i) * g."""
  step_size = make_schedule(step_size)
  return (lambda x0: x0, lambda i, g, x: x - step_size(i) * g, lambda x: x)


@optimizer
def momentum(step_size: float | Schedule, mass: float):
  """v <- mass * v + g; x <- x - step_size(i) * v."""
  step_size = make_schedule(step_size)

  def update(i, g, state):
    x, velocity = state
    velocity = mass * velocity + g
    return x - step_size(i) * velocity, velocity
  return (lambda x0: (x0, jnp.zeros_like(x0)), update, lambda state: state[0])


@optimizer
def nesterov(step_size: float | Schedule, mass: float):
  """v <- mass * v + g; x <- x - step_size(i) * (mass * v + g)."""
  step_size = make_schedule(step_size)

  def update(i, g, state):
    x, velocity = state
    velocity = mass * velocity + g
    return x - step_size(i) * (mass * velocity + g), velocity
  return (lambda x0: (x0, jnp.zeros_like(x0)), update, lambda state: state[0])


@optimizer
def adagrad(step_size: float | Schedule, momentum: float = 0.9):
  """Adagrad (Duchi et al.) with momentum on the scaled gradient."""
  step_size = make_schedule(step_size)

  def update(i, g, state):
    x, g_sq, m = state
    g_sq = g_sq + jnp.square(g)
    inv_sqrt = jnp.where(g_sq > 0, 1.0 / jnp.sqrt(jnp.where(g_sq > 0, g_sq, 1.0)), 0.0)
    m = (1.0 - momentum) * (g * inv_sqrt) + momentum * m
    return x - step_size(i) * m, g_sq, m
  return (lambda x0: (x0, jnp.zeros_like(x0), jnp.zeros_like(x0)), update, lambda state: state[0])


@optimizer
def rmsprop(step_size: float | Schedule, gamma: float = 0.9, eps: float = 1e-8):
  """x <- x - step_size(i) * g / sqrt(avg(g^2) + eps), avg a decaying mean."""
  step_size = make_schedule(step_size)

  def update(i, g, state):
    x, avg_sq_grad = state
    avg_sq_grad = avg_sq_grad * gamma + jnp.square(g) * (1.0 - gamma)
    return x - step_size(i) * g / jnp.sqrt(avg_sq_grad + eps), avg_sq_grad
  return (lambda x0: (x0, jnp.zeros_like(x0)), update, lambda state: state[0])


@optimizer
def rmsprop_momentum(step_size: float | Schedule, gamma: float = 0.9, eps: float = 1e-8, momentum: float = 0.9):
  """RMSProp whose scaled steps accumulate in a momentum buffer."""
  step_size = make_schedule(step_size)

  def update(i, g, state):
    x, avg_sq_grad, mom = state
    avg_sq_grad = avg_sq_grad * gamma + jnp.square(g) * (1.0 - gamma)
    mom = momentum * mom + step_size(i) * g / jnp.sqrt(avg_sq_grad + eps)
    return x - mom, avg_sq_grad, mom
  return (lambda x0: (x0, jnp.zeros_like(x0), jnp.zeros_like(x0)), update, lambda state: state[0])


@optimizer
def adam(step_size: float | Schedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
  """Adam (Kingma and Ba): bias-corrected moments, step i counting from 0."""
  step_size = make_schedule(step_size)

  def update(i, g, state):
    x, m, v = state
    m = (1 - b1) * g + b1 * m
    v = (1 - b2) * jnp.square(g) + b2 * v
    t = jnp.asarray(i) + 1
    m_hat = m / (1 - jnp.asarray(b1, m.dtype) ** t)
    v_hat = v / (1 - jnp.asarray(b2, m.dtype) ** t)
    return x - step_size(i) * m_hat / (jnp.sqrt(v_hat) + eps), m, v
  return (lambda x0: (x0, jnp.zeros_like(x0), jnp.zeros_like(x0)), update, lambda state: state[0])


@optimizer
def adamax(step_size: float | Schedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
  """Adamax: Adam with an infinity-norm second moment."""
  step_size = make_schedule(step_size)

  def update(i, g, state):
    x, m, u = state
    m = (1 - b1) * g + b1 * m
    u = jnp.maximum(b2 * u, jnp.abs(g))
    t = jnp.asarray(i) + 1
    return x - (step_size(i) / (1 - jnp.asarray(b1, m.dtype) ** t)) * m / (u + eps), m, u
  return (lambda x0: (x0, jnp.zeros_like(x0), jnp.zeros_like(x0)), update, lambda state: state[0])


# ---------------------------------------------------------------------------------------------------------------------
# schedules

def constant(step_size: float) -> Schedule:
  return lambda i: step_size


def exponential_decay(step_size: float, decay_steps: int, decay_rate: float) -> Schedule:
  return lambda i: step_size * decay_rate ** (i / decay_steps)


def inverse_time_decay(step_size: float, decay_steps: int, decay_rate: float, staircase: bool = False) -> Schedule:
  if staircase: return lambda i: step_size / (1 + decay_rate * jnp.floor(i / decay_steps))
  return lambda i: step_size / (1 + decay_rate * i / decay_steps)


def polynomial_decay(step_size: float, decay_steps: int, final_step_size: float, power: float = 1.0) -> Schedule:
  def schedule(step_num):
    step_num = jnp.minimum(step_num, decay_steps)
    return (step_size - final_step_size) * (1 - step_num / decay_steps) ** power + final_step_size
  return schedule


def piecewise_constant(boundaries: Any, values: Any) -> Schedule:
  """values[k] for steps between boundaries[k - 1] and boundaries[k] (len(values) = len(boundaries) + 1)."""
  boundaries, values = jnp.asarray(boundaries), jnp.asarray(values)
  if not values.shape[0] == boundaries.shape[0] + 1:
    raise ValueError("piecewise_constant: values must have one more entry than boundaries")
  return lambda i: values[jnp.sum(i > boundaries)]


# ---------------------------------------------------------------------------------------------------------------------
# utilities

def l2_norm(tree: Any) -> Any:
  """The L2 norm of all the leaves together."""
  leaves = tree_util.tree_leaves(tree)
  return jnp.sqrt(sum(jnp.vdot(x, x) for x in leaves))


def clip_grads(grad_tree: Any, max_norm: float) -> Any:
  """The gradients scaled to an L2 norm of at most max_norm."""
  norm = l2_norm(grad_tree)
  factor = jnp.where(norm < max_norm, 1.0, max_norm / norm)
  return tree_util.tree_map(lambda g: g * factor, grad_tree)


def unpack_optimizer_state(opt_state: OptimizerState) -> Any:
  """The state as a pytree of per-leaf states in the params' structure (for saving)."""
  packed, tree, subtrees = opt_state
  states = [tree_util.tree_unflatten(sub, leaves) for sub, leaves in zip(subtrees, packed)]
  return tree_util.tree_unflatten(tree, states)


def pack_optimizer_state(marked_pytree: Any, params_tree_def: Any = None) -> OptimizerState:
  """The inverse of unpack_optimizer_state, given the per-leaf states and (optionally) the params' tree."""
  if params_tree_def is None:
    raise ValueError("pack_optimizer_state needs the params' tree structure: pack_optimizer_state(states, "
                     "tree_structure(params))")
  per_leaf = params_tree_def.flatten_up_to(marked_pytree)
  flat = [tree_util.tree_flatten(state) for state in per_leaf]
  return OptimizerState([leaves for leaves, _ in flat], params_tree_def, tuple(sub for _, sub in flat))
