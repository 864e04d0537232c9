"""Optimizers as optax has them: a `GradientTransformation` is a pair of pure functions, `init(params) -> state` and
`update(updates, state, params=None) -> (updates, state)`, over pytrees; `chain` composes them and `apply_updates`
adds the result to the parameters. The formulas are optax's (bias-corrected Adam, decoupled weight decay, Lion's
sign update, ...), and states are NamedTuples of arrays (step counts int32), so a whole training step runs under
`tj.jit`, schedules of the traced step count included:

    optimizer = optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(optim.cosine_decay_schedule(1e-3, 1000)))
    state = optimizer.init(params)
    updates, state = optimizer.update(grads, state, params)
    params = optim.apply_updates(params, updates)
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from tinyjax import lax, tree_util
from tinyjax import numpy as jnp
from tinyjax.array import Array

Schedule = Callable[[Any], Any]
ScalarOrSchedule = float | Schedule


class GradientTransformation(NamedTuple):
  """init(params) -> state; update(updates, state, params=None) -> (new updates, new state)."""
  init: Callable[[Any], Any]
  update: Callable[..., tuple[Any, Any]]


class EmptyState(NamedTuple):
  """The state of a transformation that keeps none."""


# ---------------------------------------------------------------------------------------------------------------------
# tree helpers

def _check_same_structure(name: str, reference: Any, other: Any, what: str, shapes: bool = True) -> None:
  """A ValueError naming the first path where two pytrees differ in structure (or leaf shape, with `shapes`)."""
  ref_leaves, ref_tree = tree_util.tree_flatten_with_path(reference)
  other_leaves, other_tree = tree_util.tree_flatten_with_path(other)
  if ref_tree != other_tree:
    ref_paths = [tree_util.keystr(p) for p, _ in ref_leaves]
    other_paths = [tree_util.keystr(p) for p, _ in other_leaves]
    missing = sorted(set(ref_paths) - set(other_paths))
    extra = sorted(set(other_paths) - set(ref_paths))
    raise ValueError(f"{name}: the {what} do not have the structure of the updates: missing {missing[:5]}, "
                     f"unexpected {extra[:5]} (updates: {ref_tree}, {what}: {other_tree})")
  for (path, a), (_, b) in zip(ref_leaves, other_leaves):
    if shapes and np.shape(a) != np.shape(b):
      raise ValueError(f"{name}: at {tree_util.keystr(path)} the updates have shape {tuple(np.shape(a))} but the "
                       f"{what} have shape {tuple(np.shape(b))}")


def _map(fn: Callable, tree: Any, *rest: Any) -> Any:
  return tree_util.tree_map(fn, tree, *rest)


def _zeros_like(tree: Any, name: str = "optimizer") -> Any:
  """Zeros like every leaf (a state for float parameters: other dtypes raise a TypeError naming the leaf)."""
  _check_float(name, tree)
  return _map(lambda x: jnp.zeros(np.shape(x), jnp.asarray(x).dtype), tree)


def _check_float(name: str, tree: Any) -> None:
  for path, leaf in tree_util.tree_flatten_with_path(tree)[0]:
    dtype = jnp.asarray(leaf).dtype
    if dtype.kind != "f" and dtype.name != "bfloat16":
      raise TypeError(f"{name}: the leaf at {tree_util.keystr(path)} has dtype {dtype}; optimizers need floating-point "
                      "parameters (cast it, or leave it out of the optimized tree with masked())")


def apply_updates(params: Any, updates: Any) -> Any:
  """params + updates, leaf by leaf (each result in its parameter's dtype)."""
  _check_same_structure("apply_updates", params, updates, "updates")
  return _map(lambda p, u: (jnp.asarray(p) + u).astype(jnp.asarray(p).dtype), params, updates)


def global_norm(tree: Any) -> Array:
  """sqrt of the sum of squares of every leaf."""
  leaves = tree_util.tree_leaves(tree)
  if not leaves: return jnp.asarray(0.0)
  return jnp.sqrt(sum(jnp.sum(jnp.square(jnp.asarray(x).astype(jnp.float32))) for x in leaves))


def _increment(count: Array) -> Array:
  """count + 1, saturating at the int32 maximum (as optax's safe_increment)."""
  return jnp.where(count < np.iinfo(np.int32).max, count + 1, count)


def _value(schedule: ScalarOrSchedule, count: Array) -> Any:
  return schedule(count) if callable(schedule) else schedule


# ---------------------------------------------------------------------------------------------------------------------
# building blocks

def identity() -> GradientTransformation:
  """Leaves the updates as they are."""
  return GradientTransformation(lambda params: EmptyState(), lambda updates, state, params=None: (updates, state))


def chain(*transforms: GradientTransformation) -> GradientTransformation:
  """The transformations applied in order; the state is the tuple of their states."""
  def init(params: Any) -> tuple:
    return tuple(t.init(params) for t in transforms)

  def update(updates: Any, state: tuple, params: Any = None) -> tuple[Any, tuple]:
    if len(state) != len(transforms):
      raise ValueError(f"chain: the state holds {len(state)} states for {len(transforms)} transformations")
    new_states = []
    for transform, inner in zip(transforms, state):
      updates, inner = transform.update(updates, inner, params)
      new_states.append(inner)
    return updates, tuple(new_states)
  return GradientTransformation(init, update)


class ScaleState(NamedTuple):
  count: Array


def scale(step_size: float) -> GradientTransformation:
  """updates * step_size."""
  return GradientTransformation(lambda params: EmptyState(),
                                lambda updates, state, params=None: (_map(lambda g: g * step_size, updates), state))


def scale_by_schedule(step_size_fn: Schedule) -> GradientTransformation:
  """updates * step_size_fn(count), count the number of updates so far (from 0)."""
  def init(params: Any) -> ScaleState:
    return ScaleState(jnp.zeros((), jnp.int32))

  def update(updates: Any, state: ScaleState, params: Any = None) -> tuple[Any, ScaleState]:
    step_size = step_size_fn(state.count)
    return _map(lambda g: (g * step_size).astype(g.dtype), updates), ScaleState(_increment(state.count))
  return GradientTransformation(init, update)


def scale_by_learning_rate(learning_rate: ScalarOrSchedule, *, flip_sign: bool = True) -> GradientTransformation:
  """updates * -learning_rate (a number or a schedule of the step count)."""
  sign = -1 if flip_sign else 1
  if callable(learning_rate): return scale_by_schedule(lambda count: sign * learning_rate(count))
  return scale(sign * learning_rate)


class TraceState(NamedTuple):
  trace: Any


def trace(decay: float, nesterov: bool = False) -> GradientTransformation:
  """Momentum: t = g + decay * t; the update is t (or g + decay * t with `nesterov`)."""
  def init(params: Any) -> TraceState:
    return TraceState(_zeros_like(params, "trace"))

  def update(updates: Any, state: TraceState, params: Any = None) -> tuple[Any, TraceState]:
    _check_same_structure("trace", updates, state.trace, "momentum state")
    new_trace = _map(lambda g, t: g + decay * t, updates, state.trace)
    out = _map(lambda g, t: g + decay * t, updates, new_trace) if nesterov else new_trace
    return out, TraceState(new_trace)
  return GradientTransformation(init, update)


class ScaleByAdamState(NamedTuple):
  count: Array
  mu: Any
  nu: Any


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                  eps_root: float = 0.0) -> GradientTransformation:
  """Adam's direction: bias-corrected first and second moments, mu_hat / (sqrt(nu_hat + eps_root) + eps)."""
  def init(params: Any) -> ScaleByAdamState:
    zeros = _zeros_like(params, "adam")
    return ScaleByAdamState(jnp.zeros((), jnp.int32), zeros, zeros)

  def update(updates: Any, state: ScaleByAdamState, params: Any = None) -> tuple[Any, ScaleByAdamState]:
    _check_same_structure("scale_by_adam", updates, state.mu, "first moments")
    mu = _map(lambda g, m: (1 - b1) * g + b1 * m, updates, state.mu)
    nu = _map(lambda g, v: (1 - b2) * jnp.square(g) + b2 * v, updates, state.nu)
    count = _increment(state.count)
    step = count.astype(jnp.float32)
    mu_correction, nu_correction = 1 - b1 ** step, 1 - b2 ** step
    out = _map(lambda m, v: ((m / mu_correction) / (jnp.sqrt(v / nu_correction + eps_root) + eps)).astype(m.dtype),
               mu, nu)
    return out, ScaleByAdamState(count, mu, nu)
  return GradientTransformation(init, update)


def add_decayed_weights(weight_decay: float = 0.0, mask: Any = None) -> GradientTransformation:
  """updates + weight_decay * params (decoupled weight decay); `mask`: only where the mask (or mask(params)) is True."""
  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    if params is None: raise ValueError("add_decayed_weights needs the params: call update(updates, state, params)")
    _check_same_structure("add_decayed_weights", updates, params, "params")
    return _map(lambda g, p: g + weight_decay * p, updates, params), state
  transform = GradientTransformation(lambda params: EmptyState(), update)
  return masked(transform, mask) if mask is not None else transform


class ScaleByLionState(NamedTuple):
  count: Array
  mu: Any


def scale_by_lion(b1: float = 0.9, b2: float = 0.99) -> GradientTransformation:
  """Lion's direction: sign(b1 * mu + (1 - b1) * g), then mu = b2 * mu + (1 - b2) * g."""
  def init(params: Any) -> ScaleByLionState:
    return ScaleByLionState(jnp.zeros((), jnp.int32), _zeros_like(params, "lion"))

  def update(updates: Any, state: ScaleByLionState, params: Any = None) -> tuple[Any, ScaleByLionState]:
    _check_same_structure("scale_by_lion", updates, state.mu, "momentum")
    out = _map(lambda g, m: jnp.sign((1 - b1) * g + b1 * m), updates, state.mu)
    mu = _map(lambda g, m: (1 - b2) * g + b2 * m, updates, state.mu)
    return out, ScaleByLionState(_increment(state.count), mu)
  return GradientTransformation(init, update)


class ScaleByRmsState(NamedTuple):
  nu: Any


class ScaleByRStdDevState(NamedTuple):
  mu: Any
  nu: Any


def scale_by_rms(decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0) -> GradientTransformation:
  """g / sqrt(nu + eps), nu the decaying mean of g^2 (RMSProp)."""
  def init(params: Any) -> ScaleByRmsState:
    return ScaleByRmsState(_map(lambda p: jnp.full(np.shape(p), initial_scale, jnp.asarray(p).dtype), params))

  def update(updates: Any, state: ScaleByRmsState, params: Any = None) -> tuple[Any, ScaleByRmsState]:
    nu = _map(lambda g, v: (1 - decay) * jnp.square(g) + decay * v, updates, state.nu)
    return _map(lambda g, v: g * lax.rsqrt(v + eps), updates, nu), ScaleByRmsState(nu)
  return GradientTransformation(init, update)


def scale_by_stddev(decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0) -> GradientTransformation:
  """g / sqrt(nu - mu^2 + eps): centered RMSProp."""
  def init(params: Any) -> ScaleByRStdDevState:
    return ScaleByRStdDevState(_zeros_like(params),
                               _map(lambda p: jnp.full(np.shape(p), initial_scale, jnp.asarray(p).dtype), params))

  def update(updates: Any, state: ScaleByRStdDevState, params: Any = None) -> tuple[Any, ScaleByRStdDevState]:
    mu = _map(lambda g, m: (1 - decay) * g + decay * m, updates, state.mu)
    nu = _map(lambda g, v: (1 - decay) * jnp.square(g) + decay * v, updates, state.nu)
    out = _map(lambda g, m, v: g * lax.rsqrt(v - jnp.square(m) + eps), updates, mu, nu)
    return out, ScaleByRStdDevState(mu, nu)
  return GradientTransformation(init, update)


class ScaleByRssState(NamedTuple):
  sum_of_squares: Any


def scale_by_rss(initial_accumulator_value: float = 0.1, eps: float = 1e-7) -> GradientTransformation:
  """g / sqrt(sum of g^2 so far + eps) (Adagrad; 0 where nothing has accumulated)."""
  def init(params: Any) -> ScaleByRssState:
    return ScaleByRssState(_map(lambda p: jnp.full(np.shape(p), initial_accumulator_value, jnp.asarray(p).dtype),
                                params))

  def update(updates: Any, state: ScaleByRssState, params: Any = None) -> tuple[Any, ScaleByRssState]:
    total = _map(lambda g, s: jnp.square(g) + s, updates, state.sum_of_squares)
    out = _map(lambda g, s: jnp.where(s > 0, lax.rsqrt(s + eps), 0.0).astype(g.dtype) * g, updates, total)
    return out, ScaleByRssState(total)
  return GradientTransformation(init, update)


def clip(max_delta: float) -> GradientTransformation:
  """Each update element clipped to [-max_delta, max_delta]."""
  return GradientTransformation(lambda params: EmptyState(), lambda updates, state, params=None: (
    _map(lambda g: jnp.clip(g, -max_delta, max_delta), updates), state))


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
  """All updates scaled by max_norm / global_norm when their global norm exceeds max_norm."""
  def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
    norm = global_norm(updates)
    keep = norm < max_norm
    return _map(lambda g: jnp.where(keep, g, (g / norm.astype(g.dtype)) * max_norm).astype(g.dtype), updates), state
  return GradientTransformation(lambda params: EmptyState(), update)


class MaskedState(NamedTuple):
  inner_state: Any


def masked(inner: GradientTransformation, mask: Any) -> GradientTransformation:
  """`inner` applied only to the leaves where `mask` (a pytree of bools like the params, or a function of the params
  returning one) is True; the other updates pass through unchanged."""
  def mask_tree(params: Any) -> Any:
    tree = mask(params) if callable(mask) else mask
    _check_same_structure("masked", params, tree, "mask", shapes=False)
    return tree

  def init(params: Any) -> MaskedState:
    return MaskedState(inner.init(params))

  def update(updates: Any, state: MaskedState, params: Any = None) -> tuple[Any, MaskedState]:
    tree = mask_tree(updates if params is None else params)
    new_updates, inner_state = inner.update(updates, state.inner_state, params)
    chosen = _map(lambda keep, new, old: new if keep else old, tree, new_updates, updates)
    return chosen, MaskedState(inner_state)
  return GradientTransformation(init, update)


class MultiStepsState(NamedTuple):
  mini_step: Array
  gradient_step: Array
  inner_state: Any
  acc_grads: Any


def multi_steps(inner: GradientTransformation, every_k_schedule: int | Schedule) -> GradientTransformation:
  """Gradient accumulation (optax.MultiSteps): the running mean of k gradients is accumulated, zero updates are
  returned in between, and every k-th call returns `inner`'s update of the mean (and only then steps inner's state)."""
  def k_of(step: Array) -> Any:
    return every_k_schedule(step) if callable(every_k_schedule) else every_k_schedule

  def init(params: Any) -> MultiStepsState:
    return MultiStepsState(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), inner.init(params), _zeros_like(params))

  def update(updates: Any, state: MultiStepsState, params: Any = None) -> tuple[Any, MultiStepsState]:
    _check_same_structure("multi_steps", updates, state.acc_grads, "accumulated gradients")
    k = k_of(state.gradient_step)
    count = (state.mini_step + 1).astype(jnp.float32)
    acc = _map(lambda g, a: a + (g - a) / count, updates, state.acc_grads)
    emit = state.mini_step + 1 >= k
    inner_updates, inner_state = inner.update(acc, state.inner_state, params)
    out = _map(lambda u: jnp.where(emit, u, jnp.zeros_like(u)), inner_updates)
    inner_state = _map(lambda new, old: jnp.where(emit, new, old), inner_state, state.inner_state)
    acc = _map(lambda a: jnp.where(emit, jnp.zeros_like(a), a), acc)
    mini_step = jnp.where(emit, 0, state.mini_step + 1).astype(jnp.int32)
    gradient_step = jnp.where(emit, _increment(state.gradient_step), state.gradient_step)
    return out, MultiStepsState(mini_step, gradient_step, inner_state, acc)
  return GradientTransformation(init, update)


# ---------------------------------------------------------------------------------------------------------------------
# optimizers

def sgd(learning_rate: ScalarOrSchedule, momentum: float | None = None,
        nesterov: bool = False) -> GradientTransformation:
  """Stochastic gradient descent, with optional (Nesterov) momentum."""
  return chain(trace(momentum, nesterov) if momentum is not None else identity(),
               scale_by_learning_rate(learning_rate))


def adam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         eps_root: float = 0.0) -> GradientTransformation:
  """Adam (Kingma and Ba): bias-corrected moments."""
  return chain(scale_by_adam(b1, b2, eps, eps_root), scale_by_learning_rate(learning_rate))


def adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
          weight_decay: float = 1e-4, mask: Any = None) -> GradientTransformation:
  """Adam with decoupled weight decay (Loshchilov and Hutter): the decay is added to Adam's direction before the
  learning rate."""
  return chain(scale_by_adam(b1, b2, eps, eps_root), add_decayed_weights(weight_decay, mask),
               scale_by_learning_rate(learning_rate))


def lion(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99, weight_decay: float = 1e-3,
         mask: Any = None) -> GradientTransformation:
  """Lion (Chen et al.): the sign of an interpolated momentum, with decoupled weight decay."""
  return chain(scale_by_lion(b1, b2), add_decayed_weights(weight_decay, mask), scale_by_learning_rate(learning_rate))


def rmsprop(learning_rate: ScalarOrSchedule, decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0,
            centered: bool = False, momentum: float | None = None, nesterov: bool = False) -> GradientTransformation:
  """RMSProp (centered: divided by the running standard deviation), then the learning rate, then optional momentum."""
  return chain((scale_by_stddev if centered else scale_by_rms)(decay, eps, initial_scale),
               scale_by_learning_rate(learning_rate),
               trace(momentum, nesterov) if momentum is not None else identity())


def adagrad(learning_rate: ScalarOrSchedule, initial_accumulator_value: float = 0.1,
            eps: float = 1e-7) -> GradientTransformation:
  """Adagrad: updates divided by the root of the sum of all squared gradients so far."""
  return chain(scale_by_rss(initial_accumulator_value, eps), scale_by_learning_rate(learning_rate))


# ---------------------------------------------------------------------------------------------------------------------
# schedules: functions of the step count (a Python int or a traced int32 array)

def constant_schedule(value: float) -> Schedule:
  return lambda count: value


def polynomial_schedule(init_value: float, end_value: float, power: float, transition_steps: int,
                        transition_begin: int = 0) -> Schedule:
  """From init_value to end_value over transition_steps (after transition_begin) as (1 - t / steps) ** power."""
  if transition_steps <= 0: return constant_schedule(init_value)

  def schedule(count: Any) -> Array:
    t = jnp.clip(jnp.asarray(count) - transition_begin, 0, transition_steps).astype(jnp.float32)
    return (init_value - end_value) * (1 - t / transition_steps) ** power + end_value
  return schedule


def linear_schedule(init_value: float, end_value: float, transition_steps: int, transition_begin: int = 0) -> Schedule:
  """Linear from init_value to end_value over transition_steps, constant outside."""
  return polynomial_schedule(init_value, end_value, 1, transition_steps, transition_begin)


def exponential_decay(init_value: float, transition_steps: int, decay_rate: float, transition_begin: int = 0,
                      staircase: bool = False, end_value: float | None = None) -> Schedule:
  """init_value * decay_rate ** ((count - transition_begin) / transition_steps) (floored with `staircase`), bounded
  by end_value."""
  if transition_steps <= 0 or decay_rate == 0: return constant_schedule(init_value)

  def schedule(count: Any) -> Array:
    t = jnp.asarray(count) - transition_begin
    p = t.astype(jnp.float32) / transition_steps
    if staircase: p = jnp.floor(p)
    value = jnp.where(t <= 0, init_value, init_value * jnp.power(jnp.float32(decay_rate), p))
    if end_value is not None:
      value = jnp.maximum(value, end_value) if decay_rate < 1 else jnp.minimum(value, end_value)
    return value
  return schedule


def cosine_decay_schedule(init_value: float, decay_steps: int, alpha: float = 0.0, exponent: float = 1.0) -> Schedule:
  """init_value * ((1 - alpha) * (0.5 * (1 + cos(pi * t / decay_steps))) ** exponent + alpha), t capped at
  decay_steps."""
  if decay_steps <= 0: raise ValueError(f"cosine_decay_schedule: decay_steps must be positive, got {decay_steps}")

  def schedule(count: Any) -> Array:
    t = jnp.minimum(jnp.asarray(count), decay_steps).astype(jnp.float32)
    cosine = 0.5 * (1 + jnp.cos(math.pi * t / decay_steps))
    return init_value * ((1 - alpha) * cosine ** exponent + alpha)
  return schedule


def join_schedules(schedules: Sequence[Schedule], boundaries: Sequence[int]) -> Schedule:
  """schedules[i] from boundaries[i - 1] on, each started at its own count 0."""
  def schedule(count: Any) -> Array:
    count = jnp.asarray(count)
    value = schedules[0](count)
    for boundary, following in zip(boundaries, schedules[1:]):
      value = jnp.where(count < boundary, value, following(count - boundary))
    return value
  return schedule


def warmup_cosine_decay_schedule(init_value: float, peak_value: float, warmup_steps: int, decay_steps: int,
                                 end_value: float = 0.0, exponent: float = 1.0) -> Schedule:
  """Linear warmup from init_value to peak_value over warmup_steps, then cosine decay to end_value at decay_steps
  (counted from the start)."""
  alpha = 0.0 if peak_value == 0 else end_value / peak_value
  return join_schedules([linear_schedule(init_value, peak_value, warmup_steps),
                         cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha, exponent)],
                        [warmup_steps])


def warmup_exponential_decay_schedule(init_value: float, peak_value: float, warmup_steps: int, transition_steps: int,
                                      decay_rate: float, transition_begin: int = 0, staircase: bool = False,
                                      end_value: float | None = None) -> Schedule:
  """Linear warmup, then exponential_decay from peak_value."""
  return join_schedules([linear_schedule(init_value, peak_value, warmup_steps),
                         exponential_decay(peak_value, transition_steps, decay_rate, transition_begin, staircase,
                                           end_value)], [warmup_steps])
