"""Memory planning (lower/memory.py): intermediates share one arena by liveness, donated arguments' buffers are
written in place (`donate_argnums`), and `jit(f).lower(...).memory_analysis()` sizes a program's memory."""
import functools

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax
from tinyjax.lower import memory, realize
from tinyjax.lower.memory import ALIGNMENT, liveness, plan_memory
from tinyjax.nn import optim

RNG = np.random.default_rng(0)


def _normal(*shape) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


def _mlp_loss(params, x, y):
  hidden = tnp.tanh(x @ params["w1"] + params["b1"])
  logits = hidden @ params["w2"] + params["b2"]
  return ((logits - y) ** 2).mean()


def _mlp_params():
  return {"w1": _normal(8, 32) * 0.3, "b1": _normal(32) * 0.1, "w2": _normal(32, 4) * 0.3, "b2": _normal(4) * 0.1}


_optimizer = optim.adam(1e-2)


def _adam_step(params, opt_state, x, y):
  loss, grads = tj.value_and_grad(_mlp_loss)(params, x, y)
  updates, opt_state = _optimizer.update(grads, opt_state, params)
  return optim.apply_updates(params, updates), opt_state, loss


def _softmax_chain(x):
  for _ in range(4): x = tnp.exp(x - x.max(axis=-1, keepdims=True)) @ x.T
  return x / x.sum(axis=-1, keepdims=True)


def _scan_program(x):
  def body(carry, row):
    carry = tnp.tanh(carry @ x + row)
    return carry, carry.sum()
  return lax.scan(body, x[0], x)


def _cond_program(x):
  y = tnp.sin(x) @ x
  return lax.cond(y.sum() > 0, lambda a: (a @ a).T * 2, lambda a: a @ a.T, y) + y


def _while_program(x):
  return lax.while_loop(lambda c: c[1] < 3, lambda c: (tnp.tanh(c[0] @ x) + c[0], c[1] + 1), (x, 0))[0]


def _scatter_program(x, index):
  y = tnp.exp(x)
  return y.at[index].add(x[::-1] * 2).sum(axis=0) + y[0]


PROGRAMS = {
  "adam_step": (_adam_step, lambda: (_mlp_params(), _optimizer.init(_mlp_params()), _normal(16, 8), _normal(16, 4))),
  "softmax_chain": (_softmax_chain, lambda: (_normal(16, 16),)),
  "scan": (_scan_program, lambda: (_normal(8, 8) * 0.5,)),
  "cond": (_cond_program, lambda: (_normal(8, 8),)),
  "while_loop": (_while_program, lambda: (_normal(8, 8) * 0.5,)),
  "scatter": (_scatter_program, lambda: (_normal(6, 5), np.array([0, 2, 2, 5, 1, 0], np.int32))),
}


def _check_plan(compiled) -> None:
  """Intermediates whose liveness intervals overlap get disjoint, aligned memory, inside the arena."""
  sched, plan = compiled.schedule, compiled.plan
  intervals = liveness(sched)
  placed = []
  for k, (offset, (_, _, nbytes)) in enumerate(zip(plan.offsets, compiled.slot_specs)):
    slot = sched.n_inputs + k
    if offset < 0 or slot not in intervals or nbytes == 0: continue
    assert offset % ALIGNMENT == 0 and offset + nbytes <= plan.arena_bytes
    placed.append((intervals[slot], offset, offset + nbytes))
  for i, ((first, last), start, end) in enumerate(placed):
    for (other_first, other_last), other_start, other_end in placed[:i]:
      if first <= other_last and other_first <= last: assert end <= other_start or other_end <= start


def _run_unshared(monkeypatch, fun, args):
  """`jit(fun)(*args)` with every intermediate in memory of its own (no sharing)."""
  with monkeypatch.context() as patch:
    patch.setattr(realize, "plan_memory", functools.partial(plan_memory, share=False))
    patch.setattr(realize, "_memory_cache", {})
    jitted = tj.jit(lambda *args: fun(*args))  # (a new function: jit(fun) would find the planned program)
    plan = jitted.lower(*args)._compiled.schedule.plan
    assert plan.arena_bytes >= plan.intermediate_bytes
    return jitted(*args)


@pytest.fixture
def poisoned_arena(monkeypatch):
  """Arenas filled with 0xff bytes (NaN in floats) on every run: a slot read before it is written shows."""
  take = realize.take_block

  def poisoned(nbytes):
    raw, address = take(nbytes)
    raw.fill(0xFF)
    return raw, address
  monkeypatch.setattr(realize, "take_block", poisoned)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_plan_gives_identical_results(name, monkeypatch, poisoned_arena):
  fun, make_args = PROGRAMS[name]
  args = make_args()
  jitted = tj.jit(fun)
  _check_plan(jitted.lower(*args)._compiled.schedule)
  planned = tj.tree_util.tree_leaves(jitted(*args))
  planned_again = tj.tree_util.tree_leaves(jitted(*args))  # (the arena comes from the pool, holding the last run)
  unshared = tj.tree_util.tree_leaves(_run_unshared(monkeypatch, fun, args))
  eager = tj.tree_util.tree_leaves(fun(*args))
  for a, b, c, d in zip(planned, planned_again, unshared, eager):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    np.testing.assert_array_equal(np.asarray(b), np.asarray(c))
    np.testing.assert_allclose(np.asarray(a), np.asarray(d), rtol=1e-5, atol=1e-5)


def test_plan_when_kernels_run_one_by_one(poisoned_arena):
  """An open profile launches kernel by kernel from Python, over views into the arena."""
  x = _normal(16, 16)
  expected = np.asarray(tj.jit(_softmax_chain)(x))
  with tj.profile():
    np.testing.assert_array_equal(np.asarray(tj.jit(_softmax_chain)(x)), expected)
  np.testing.assert_array_equal(np.asarray(tj.jit(_scan_program)(x)[0]),
                                np.asarray(_run_scan_profiled(x)[0]))


def _run_scan_profiled(x):
  with tj.profile(): return tj.jit(_scan_program)(x)


def test_softmax_chain_matches_float64():
  x = _normal(16, 16)
  ref = x.astype(np.float64)
  for _ in range(4): ref = np.exp(ref - ref.max(-1, keepdims=True)) @ ref.T
  ref = ref / ref.sum(-1, keepdims=True)
  np.testing.assert_allclose(np.asarray(tj.jit(_softmax_chain)(x)), ref, rtol=1e-4, atol=1e-6)


def test_chain_arena_is_smaller_than_its_intermediates():
  def chain(x, w):
    for _ in range(6): x = x @ w
    return x
  x, w = _normal(64, 64), _normal(64, 64) * 0.1
  lowered = tj.jit(chain).lower(x, w)
  plan = lowered._compiled.schedule.plan
  # five 16 KiB intermediates, each live from its matmul to the next: two at a time
  assert plan.intermediate_bytes == 5 * 64 * 64 * 4
  assert plan.arena_bytes == 2 * 64 * 64 * 4
  ref = x.astype(np.float64)
  for _ in range(6): ref = ref @ w
  np.testing.assert_allclose(np.asarray(tj.jit(chain)(x, w)), ref, rtol=1e-4, atol=1e-5)


def test_outputs_and_kernel_operands_never_share():
  """A kernel's output never shares memory with what the same kernel reads, nor with the program's outputs."""
  x = _normal(32, 32)
  compiled = tj.jit(_softmax_chain).lower(x)._compiled.schedule
  plan, sched = compiled.plan, compiled.schedule
  def byte_range(slot):
    offset = plan.offsets[slot - sched.n_inputs] if slot >= sched.n_inputs else -1
    return None if offset < 0 else (offset, offset + compiled.slot_specs[slot - sched.n_inputs][2])
  for kernel in memory.kernels_of(sched.kernels):
    ranges = [byte_range(slot) for slot in dict.fromkeys(kernel.slots)]
    ranges = [r for r in ranges if r is not None and r[0] < r[1]]
    for i, (start, end) in enumerate(ranges):
      assert all(end <= other_start or other_end <= start for other_start, other_end in ranges[:i])
