"""nn.optim against float64 numpy transcriptions of the published formulas (optax's), over several steps on a small
pytree; schedules against their closed forms; combinators; a jitted training loop; errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import tree
from tinyjax.nn import optim

RNG = np.random.default_rng(0)
PARAMS = {"w": RNG.standard_normal((3, 4)), "b": RNG.standard_normal(4), "layers": [RNG.standard_normal((2,))]}
GRADS = [tree.map(lambda p: RNG.standard_normal(p.shape), PARAMS) for _ in range(6)]


def run(optimizer, steps=6, params=PARAMS):
  """Our updates over `steps` gradient steps (float32), as float64 pytrees, plus the final params."""
  p = tree.map(lambda x: tnp.asarray(x, tnp.float32), params)
  state = optimizer.init(p)
  outputs = []
  for g in GRADS[:steps]:
    updates, state = optimizer.update(tree.map(lambda x: tnp.asarray(x, tnp.float32), g), state, p)
    p = optim.apply_updates(p, updates)
    outputs.append(tree.map(lambda u: np.asarray(u, np.float64), updates))
  return outputs


def reference(step_fn, init_fn, steps=6, params=PARAMS):
  """A numpy transcription run per leaf: step_fn(g, p, state, t) -> (update, state), t counting from 1."""
  leaves, treedef = tree.flatten(params)
  states = [init_fn(p) for p in leaves]
  current = [p.copy() for p in leaves]
  outputs = []
  for t, g in enumerate(GRADS[:steps], start=1):
    grads = tree.leaves(g)
    updates = []
    for i, (gi, pi) in enumerate(zip(grads, current)):
      u, states[i] = step_fn(gi, pi, states[i], t)
      updates.append(u)
    current = [p + u for p, u in zip(current, updates)]
    outputs.append(tree.unflatten(treedef, updates))
  return outputs


def assert_close(ours, theirs, rtol=2e-5, atol=1e-6):
  for a, b in zip(ours, theirs):
    for x, y in zip(tree.leaves(a), tree.leaves(b)):
      np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def test_sgd_and_momentum():
  assert_close(run(optim.sgd(0.1)), reference(lambda g, p, s, t: (-0.1 * g, s), lambda p: None))
  for nesterov in (False, True):
    def step(g, p, trace, t, nesterov=nesterov):
      trace = g + 0.9 * trace
      return -0.1 * (g + 0.9 * trace if nesterov else trace), trace
    assert_close(run(optim.sgd(0.1, momentum=0.9, nesterov=nesterov)), reference(step, np.zeros_like))


def adam_step(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0):
  def step(g, p, state, t):
    m, v = state
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    direction = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + weight_decay * p
    return -lr * direction, (m, v)
  return step


def test_adam_adamw_lion():
  zeros2 = lambda p: (np.zeros_like(p), np.zeros_like(p))  # noqa: E731
  assert_close(run(optim.adam(0.01)), reference(adam_step(0.01), zeros2))
  assert_close(run(optim.adam(0.01, b1=0.5, b2=0.9, eps=1e-3)), reference(adam_step(0.01, 0.5, 0.9, 1e-3), zeros2))
  assert_close(run(optim.adamw(0.01, weight_decay=0.1)), reference(adam_step(0.01, weight_decay=0.1), zeros2))

  def lion_step(g, p, m, t, b1=0.9, b2=0.99, lr=0.01, wd=0.05):
    update = np.sign(b1 * m + (1 - b1) * g) + wd * p
    return -lr * update, b2 * m + (1 - b2) * g
  assert_close(run(optim.lion(0.01, weight_decay=0.05)), reference(lion_step, np.zeros_like))


def test_rmsprop_and_adagrad():
  def rms(g, p, v, t, decay=0.9, eps=1e-8, lr=0.01):
    v = decay * v + (1 - decay) * g * g
    return -lr * g / np.sqrt(v + eps), v
  assert_close(run(optim.rmsprop(0.01)), reference(rms, np.zeros_like), rtol=1e-4)

  def centered(g, p, state, t, decay=0.9, eps=1e-8, lr=0.01, momentum=0.5):
    m, v, trace = state
    m, v = decay * m + (1 - decay) * g, decay * v + (1 - decay) * g * g
    scaled = -lr * g / np.sqrt(v - m * m + eps)
    trace = scaled + momentum * trace
    return trace, (m, v, trace)
  assert_close(run(optim.rmsprop(0.01, centered=True, momentum=0.5)),
               reference(centered, lambda p: (np.zeros_like(p),) * 3), rtol=1e-4)

  def adagrad(g, p, total, t, lr=0.1, eps=1e-7):
    total = total + g * g
    return -lr * g / np.sqrt(total + eps), total
  assert_close(run(optim.adagrad(0.1)), reference(adagrad, lambda p: np.full_like(p, 0.1)))


def test_clipping_decay_mask_and_chain():
  def clipped(g, p, s, t): return -0.1 * np.clip(g, -0.5, 0.5), s
  assert_close(run(optim.chain(optim.clip(0.5), optim.sgd(0.1))), reference(clipped, lambda p: None))
  # clip_by_global_norm acts on the whole tree
  optimizer = optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(1.0))
  ours = run(optimizer)
  for step, grads in zip(ours, GRADS):
    norm = math.sqrt(sum((x ** 2).sum() for x in tree.leaves(grads)))
    want = tree.map(lambda g: -g * min(1.0, 1.0 / norm), grads)
    assert_close([step], [want])
  assert float(optim.global_norm({"a": tnp.ones(4), "b": [tnp.full((2,), 2.0)]})) == pytest.approx(math.sqrt(12))
  # weight decay only on "w" (mask), and masked adam leaves "b" untouched
  mask = {"w": True, "b": False, "layers": [False]}
  ours = run(optim.chain(optim.add_decayed_weights(0.5, mask=mask), optim.sgd(0.1)), steps=1)
  want = tree.map(lambda g, p, m: -0.1 * (g + 0.5 * p * m), GRADS[0], PARAMS, mask)
  assert_close(ours, [want])
  ours = run(optim.masked(optim.sgd(0.1), lambda params: tree.map(lambda p: p.ndim == 2, params)), steps=1)
  want = tree.map(lambda g, p: -0.1 * g if p.ndim == 2 else g, GRADS[0], PARAMS)
  assert_close(ours, [want])


def test_multi_steps_accumulates():
  k = 3
  ours = run(optim.multi_steps(optim.sgd(0.1), k))
  for i, step in enumerate(ours):
    if (i + 1) % k:
      assert all(not x.any() for x in tree.leaves(step))
    else:
      mean = tree.map(lambda *gs: sum(gs) / k, *GRADS[i + 1 - k:i + 1])
      assert_close([step], [tree.map(lambda g: -0.1 * g, mean)])
  # with adam inside, its state steps once per k gradients
  ours = run(optim.multi_steps(optim.adam(0.01), 2))
  means = [tree.map(lambda a, b: (a + b) / 2, GRADS[i], GRADS[i + 1]) for i in (0, 2, 4)]
  step = adam_step(0.01)
  leaves, treedef = tree.flatten(PARAMS)
  states = [(np.zeros_like(p), np.zeros_like(p)) for p in leaves]
  for t, mean in enumerate(means, start=1):
    updates = []
    for i, g in enumerate(tree.leaves(mean)):
      u, states[i] = step(g, leaves[i], states[i], t)
      updates.append(u)
    assert_close([ours[2 * t - 1]], [tree.unflatten(treedef, updates)])


def test_schedules_closed_forms():
  counts = [0, 1, 5, 10, 11, 50, 99, 100, 150]
  lin = optim.linear_schedule(1.0, 0.1, 100, transition_begin=10)
  exp = optim.exponential_decay(1.0, 10, 0.5, transition_begin=5, end_value=0.01)
  stair = optim.exponential_decay(2.0, 10, 0.5, staircase=True)
  cos = optim.cosine_decay_schedule(0.5, 100, alpha=0.2)
  warm = optim.warmup_cosine_decay_schedule(0.0, 1.0, 10, 110, end_value=0.1)
  joined = optim.join_schedules([optim.constant_schedule(1.0), optim.constant_schedule(2.0)], [7])
  for c in counts:
    t = min(max(c - 10, 0), 100)
    assert float(lin(c)) == pytest.approx(0.9 * (1 - t / 100) + 0.1, rel=1e-6)
    want = 1.0 if c <= 5 else max(0.5 ** ((c - 5) / 10), 0.01)
    assert float(exp(c)) == pytest.approx(want, rel=1e-6)
    assert float(stair(c)) == pytest.approx(2.0 * 0.5 ** (c // 10), rel=1e-6)
    cosine = 0.5 * (1 + math.cos(math.pi * min(c, 100) / 100))
    assert float(cos(c)) == pytest.approx(0.5 * (0.8 * cosine + 0.2), rel=1e-6)
    if c < 10: want = c / 10
    else:
      s = min(c - 10, 100)
      want = 1.0 * (0.9 * 0.5 * (1 + math.cos(math.pi * s / 100)) + 0.1)
    assert float(warm(c)) == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert float(joined(c)) == (1.0 if c < 7 else 2.0)
  # a schedule as the learning rate steps with the optimizer's own count
  ours = run(optim.sgd(optim.linear_schedule(0.1, 0.0, 4)))
  assert_close(ours, reference(lambda g, p, s, t: (-0.1 * max(0.0, 1 - (t - 1) / 4) * g, s), lambda p: None))


def test_jitted_training_loop_converges():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((64, 3)).astype(np.float32)
  true_w = np.array([1.5, -2.0, 0.5], np.float32)
  y = x @ true_w + 0.3
  params = {"w": tnp.zeros(3), "b": tnp.zeros(())}
  optimizer = optim.chain(optim.clip_by_global_norm(10.0), optim.adam(optim.warmup_cosine_decay_schedule(
    0.0, 0.1, 10, 300)))
  state = optimizer.init(params)

  def loss(p): return tnp.mean((x @ p["w"] + p["b"] - y) ** 2)

  @tj.jit
  def step(p, s):
    value, grads = tj.value_and_grad(loss)(p)
    updates, s = optimizer.update(grads, s, p)
    return optim.apply_updates(p, updates), s, value
  eager_p, eager_s, _ = (lambda p, s: (lambda v, g: (optim.apply_updates(p, optimizer.update(g, s, p)[0]),
                                                     optimizer.update(g, s, p)[1], v))(
    *tj.value_and_grad(loss)(p)))(params, state)
  jit_p, _, _ = step(params, state)
  for a, b in zip(tree.leaves(eager_p), tree.leaves(jit_p)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  for _ in range(300): params, state, value = step(params, state)
  assert float(value) < 1e-3
  np.testing.assert_allclose(np.asarray(params["w"]), true_w, atol=0.02)


def test_errors_name_the_path():
  optimizer = optim.adam(0.1)
  state = optimizer.init({"a": tnp.zeros(3)})
  with pytest.raises(ValueError, match="structure"):
    optimizer.update({"b": tnp.zeros(3)}, state)
  with pytest.raises(ValueError, match=r"\['a'\].*\(4,\).*\(3,\)"):
    optimizer.update({"a": tnp.zeros(4)}, state)
  with pytest.raises(TypeError, match=r"\['n'\].*int32"):
    optim.adam(0.1).init({"n": tnp.zeros(3, tnp.int32)})
  with pytest.raises(ValueError, match="params"):
    optim.adamw(0.1).update({"a": tnp.zeros(3)}, optim.adamw(0.1).init({"a": tnp.zeros(3)}))
  with pytest.raises(ValueError, match="structure"):
    optim.apply_updates({"a": tnp.zeros(3)}, {"a": tnp.zeros(3), "c": tnp.zeros(1)})
