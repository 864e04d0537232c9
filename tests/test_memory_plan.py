"""Memory planning (lower/memory.py): intermediates share one arena by liveness, donated arguments' buffers are
written in place (`donate_argnums`), and `jit(f).lower(...).memory_analysis()` sizes a program's memory."""
import functools
import warnings

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax
from tinyjax.lower import memory, realize
from tinyjax.lower.memory import ALIGNMENT, liveness, plan_memory
from tinyjax.nn import optim

# the CPU runtime's memory plan and donation (a GPU run allocates every slot on its own, lower/realize.py): on the CPU
# whatever the suite's default device
pytestmark = pytest.mark.usefixtures("on_cpu")
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


def _carry_in_place_program(x):
  """A scan whose one kernel updates its carry where it lies: the slot the carry was first given is used by no
  step, and gets no memory."""
  return lax.scan(lambda carry, _: (carry * 1.0001 + 0.5, None), x[0], None, length=40)[0]


def _counted_loop_program(x):
  """A fori_loop reading the pass number the runtime writes into its counter slot (and one that never reads it),
  between intermediates that the arena could place over that slot."""
  y = tnp.sin(x) @ x
  z = lax.fori_loop(0, 4, lambda i, c: tnp.tanh(c @ x) * i + y, y * 2)
  z = lax.fori_loop(0, 3, lambda _, c: tnp.tanh(c @ x) + z, z)
  return (z + tnp.cos(y)) @ x


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
  "carry_in_place": (_carry_in_place_program, lambda: (_normal(8, 25),)),
  "cond": (_cond_program, lambda: (_normal(8, 8),)),
  "counted_loop": (_counted_loop_program, lambda: (_normal(8, 8) * 0.5,)),
  "while_loop": (_while_program, lambda: (_normal(8, 8) * 0.5,)),
  "scatter": (_scatter_program, lambda: (_normal(6, 5), np.array([0, 2, 2, 5, 1, 0], np.int32))),
}


def _check_plan(compiled) -> None:
  """Intermediates whose liveness intervals overlap get disjoint, aligned memory, inside the arena."""
  sched, plan = compiled.schedule, compiled.plan
  intervals = liveness(sched)
  for step in sched.kernels:  # a counted loop's counter, written by the runtime, is live across its loop
    if getattr(step, "counter_slot", -1) >= 0: assert step.counter_slot in intervals
  placed = []
  for k, (offset, (_, _, nbytes)) in enumerate(zip(plan.offsets, compiled.slot_specs)):
    slot = sched.n_inputs + k
    if slot not in intervals: assert offset == -1  # (no step uses it: no memory, nothing to view when profiled)
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


def test_loop_counter_is_live_across_its_loop():
  """The runtime writes a counted loop's pass number into its counter slot before each pass: that slot is touched
  by the loop, whether its kernels read it or not, so no other slot live then shares its memory."""
  from tinyjax.lower.schedule import Loop
  assert memory.step_slots(Loop((), trip=3, counter_slot=7)) == {7}
  assert memory.step_slots(Loop((), trip=3)) == set()


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
  rows = _normal(8, 25)
  expected = rows[0].astype(np.float64)
  for _ in range(40): expected = expected * 1.0001 + 0.5
  with tj.profile():  # (a slot no step uses had a view made into an arena too small for it: ValueError)
    np.testing.assert_allclose(np.asarray(tj.jit(_carry_in_place_program)(rows)), expected, rtol=1e-6)


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


# ---- donation

def _adam(params, m, v, grads, count, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
  m = tj.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
  v = tj.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
  def update(p, m, v):
    return p - lr * (m / (1 - b1 ** count)) / (tnp.sqrt(v / (1 - b2 ** count)) + eps)
  return tj.tree_util.tree_map(update, params, m, v), m, v


def _train_step(params, m, v, x, y, count):
  loss, grads = tj.value_and_grad(_mlp_loss)(params, x, y)
  params, m, v = _adam(params, m, v, grads, count)
  return params, m, v, loss


def _addresses(tree):
  return [leaf.uop.arg.address for leaf in tj.tree_util.tree_leaves(tree)]


def _asarrays(tree): return tj.tree_util.tree_map(tnp.asarray, tree)


def test_donated_adam_step_matches_and_writes_in_place():
  params = _mlp_params()
  zeros = tj.tree_util.tree_map(np.zeros_like, params)
  x, y = _normal(16, 8), _normal(16, 4)
  plain = tj.jit(_train_step)
  donating = tj.jit(_train_step, donate_argnums=(0, 1, 2))
  expected = (_asarrays(params), _asarrays(zeros), _asarrays(zeros))
  state = (_asarrays(params), _asarrays(zeros), _asarrays(zeros))
  for count in range(1, 5):
    before = state
    addresses = [_addresses(tree) for tree in before]
    *expected, _ = plain(*expected, x, y, np.float32(count))
    with warnings.catch_warnings():
      # every donated buffer is usable: the loss kernel, which reads b2 again, runs before b2's update (the schedule
      # computes the outputs that depend on less first, lower/schedule.py `_outputs_first`)
      warnings.simplefilter("error")
      *state, loss = donating(*state, tnp.asarray(x), tnp.asarray(y), tnp.asarray(np.float32(count)))
    # each parameter and moment written over its donated input
    assert _addresses(state[1]) == addresses[1] and _addresses(state[2]) == addresses[2]
    reused = sum(new == old for new, old in zip(_addresses(state[0]), addresses[0]))
    aliased = {index for index, *_ in donating.lower(*state, x, y, np.float32(count))._compiled.aliases}
    assert reused == 4 and aliased == set(range(12))
    for index, leaf in enumerate(tj.tree_util.tree_leaves(before)):
      assert leaf.is_deleted() == (index in aliased)  # (a donated array no output can take is kept, as in JAX)
      if index in aliased:
        with pytest.raises(RuntimeError, match="Array has been deleted with shape=float32"): np.asarray(leaf)
    for got, want in zip(tj.tree_util.tree_leaves(state), tj.tree_util.tree_leaves(expected)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert donating._fast_calls >= 2  # the hot path donates too
  compiled = donating.lower(*expected, x, y, np.float32(1))._compiled
  assert compiled.schedule.plan.arena_bytes < compiled.schedule.plan.intermediate_bytes


def test_donated_step_matches_float64_adam():
  params = {"w": _normal(5, 3)}
  x, y = _normal(7, 5), _normal(7, 3)
  def loss(params, x, y): return ((x @ params["w"] - y) ** 2).sum()
  def step(params, m, v, count):
    grads = tj.grad(loss)(params, x, y)
    return _adam(params, m, v, grads, count)
  w, m, v = params["w"].astype(np.float64), np.zeros((5, 3)), np.zeros((5, 3))
  state = (_asarrays(params), {"w": tnp.zeros((5, 3))}, {"w": tnp.zeros((5, 3))})
  jitted = tj.jit(step, donate_argnums=(0, 1, 2))
  for count in range(1, 4):
    state = jitted(*state, np.float32(count))
    g = 2 * x.T.astype(np.float64) @ (x @ w - y)
    m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    w = w - 1e-2 * (m / (1 - 0.9 ** count)) / (np.sqrt(v / (1 - 0.999 ** count)) + 1e-8)
    np.testing.assert_allclose(np.asarray(state[0]["w"]), w, rtol=1e-4, atol=1e-5)


def test_donation_composes_with_vmap_and_grad():
  def loss(w, x): return tnp.tanh(x @ w).sum()
  def step(w, xs):
    per_example = tj.vmap(tj.grad(loss), in_axes=(None, 0))(w, xs)
    return w - 0.1 * per_example.mean(axis=0)
  w, xs = _normal(4, 3), _normal(6, 2, 4)
  expected = np.asarray(tj.jit(step)(w, xs))
  donated = tnp.asarray(w)
  address = donated.uop.arg.address
  out = tj.jit(step, donate_argnums=0)(donated, xs)
  assert donated.is_deleted() and out.uop.arg.address == address
  np.testing.assert_array_equal(np.asarray(out), expected)
  np.testing.assert_allclose(expected, w - 0.1 * np.mean([xs_i.T @ (1 - np.tanh(xs_i @ w) ** 2) for xs_i in xs], 0),
                             rtol=1e-5, atol=1e-6)


def test_unusable_donation_warns_and_keeps_the_argument():
  x = tnp.ones(3)
  with pytest.warns(UserWarning, match=r"Some donated buffers were not usable: float32\[3\]"):
    total = tj.jit(lambda x: x.sum(), donate_argnums=0)(x)
  assert float(total) == 3.0 and not x.is_deleted()
  with pytest.warns(UserWarning, match="not usable"):
    tj.jit(lambda x: x[:2] * 2, donate_argnums=0)(x)
  assert not x.is_deleted()


def test_donated_buffer_seen_elsewhere_is_not_written():
  add = tj.jit(lambda x, y: x * 2 + y, donate_argnums=0)
  # the same array passed again, not donated: the result is right, the memory not reused
  x = tnp.asarray(np.arange(4, dtype=np.float32))
  address = x.uop.arg.address
  out = add(x, x)
  assert x.is_deleted() and out.uop.arg.address != address
  np.testing.assert_array_equal(np.asarray(out), np.arange(4) * 3)
  # a lazy array computed from it, and a numpy view of it, keep their values
  x = tnp.asarray(np.arange(4, dtype=np.float32))
  lazy, view = x + 10, np.asarray(x)
  out = add(x, tnp.ones(4))
  np.testing.assert_array_equal(np.asarray(lazy), np.arange(4) + 10)
  np.testing.assert_array_equal(view, np.arange(4))
  np.testing.assert_array_equal(np.asarray(out), np.arange(4) * 2 + 1)
  # with nothing else holding it, it is reused (also by the hot path)
  for _ in range(3):
    x = tnp.asarray(np.arange(4, dtype=np.float32))
    address = x.uop.arg.address
    out = add(x, tnp.ones(4))
    assert out.uop.arg.address == address
  assert add._fast_calls >= 2


def test_donated_pytrees_numpy_and_passthrough():
  scale = tj.jit(lambda tree: {key: value * 2 for key, value in tree.items()}, donate_argnums=0)
  tree = {"a": tnp.ones(3), "b": tnp.ones((2, 2))}
  out = scale(tree)
  assert all(leaf.is_deleted() for leaf in tree.values())
  np.testing.assert_array_equal(np.asarray(out["b"]), np.full((2, 2), 2.0))
  # numpy arguments and Python scalars may be donated (a scalar has no output to go to: JAX warns about it too)
  with pytest.warns(UserWarning, match=r"not usable: ~float32\[\]"):
    out = tj.jit(lambda x, n: x * n, donate_argnums=(0, 1))(np.ones(3, np.float32), 2.0)
  np.testing.assert_array_equal(np.asarray(out), [2.0, 2.0, 2.0])
  # returned unchanged: the output is the donated buffer
  x = tnp.ones(3)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    out = tj.jit(lambda x: x, donate_argnums=0)(x)
  assert x.is_deleted()
  np.testing.assert_array_equal(np.asarray(out), np.ones(3))


def test_static_and_donated_arguments_cannot_intersect():
  with pytest.raises(ValueError, match="cannot intersect"):
    tj.jit(lambda x, n: x * n, static_argnums=1, donate_argnums=1)


def test_delete_and_deleted_arrays_raise():
  x = tnp.ones((2, 3))
  assert not x.is_deleted()
  x.delete()
  x.delete()  # (again: nothing happens, as JAX)
  assert x.is_deleted() and x.shape == (2, 3) and x.dtype == np.float32
  for use in (np.asarray, repr, lambda x: (x + 1).block_until_ready(), tj.jit(lambda x: x * 2)):
    with pytest.raises(RuntimeError, match=r"Array has been deleted with shape=float32\[2,3\]"):
      use(x)
  y = tnp.ones((2, 3))
  with pytest.raises(RuntimeError, match="deleted"):
    tj.jit(lambda y, x: y + x, donate_argnums=0)(y, x)
  assert not y.is_deleted()  # nothing is donated by a call that cannot run


# ---- memory_analysis

def test_memory_analysis_counts_bytes():
  block = 64 * 64 * 4
  x, y = _normal(64, 64), _normal(64, 64)
  stats = tj.jit(lambda x: x @ x @ x @ x).lower(x).compile().memory_analysis()
  # x @ x and (x @ x) @ x are both live while the third product is computed
  assert (stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.alias_size_in_bytes,
          stats.temp_size_in_bytes) == (block, block, 0, 2 * block)
  assert stats.peak_memory_in_bytes == 4 * block
  assert stats.generated_code_size_in_bytes > 0 and stats.host_temp_size_in_bytes == 0
  stats = tj.jit(lambda x, y: (x + y * 2, y.sum()), donate_argnums=0).lower(x, y).memory_analysis()
  assert (stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.alias_size_in_bytes,
          stats.temp_size_in_bytes) == (2 * block, block + 4, block, 0)
  assert stats.peak_memory_in_bytes == 2 * block + 4
  stats = tj.jit(lambda x: x + 1).lower(np.ones(8, np.float32)).memory_analysis()
  assert (stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes,
          stats.peak_memory_in_bytes) == (32, 32, 0, 64)


def test_pool_keeps_a_quarter_of_memory_and_a_runs_arena_for_the_next_run(monkeypatch):
  """The pool of freed blocks holds up to a quarter of the machine's memory (at least 1 GiB), so a big program's
  arena (ResNet-50's: 1.1 GB) is handed to its next run instead of being faulted in afresh; a block past the limit
  goes back to the system."""
  import importlib
  buffer = importlib.import_module("tinyjax.devices.buffer")
  assert buffer.POOL_LIMIT_BYTES == max(1 << 30, buffer._physical_memory() // 4)
  if buffer._physical_memory():
    assert buffer.POOL_LIMIT_BYTES >= buffer._physical_memory() // 4
  f = tj.jit(lambda x: ((x @ x) @ x) @ x)
  x = _normal(64, 64)
  arena = f.lower(x)._compiled.schedule.plan.arena_bytes
  assert arena > 0
  taken, take = [], realize.take_block

  def recorded(nbytes):
    raw, address = take(nbytes)
    taken.append(address)
    return raw, address
  monkeypatch.setattr(realize, "take_block", recorded)
  first, second = np.asarray(f(x)), np.asarray(f(x))
  assert taken[0] == taken[1]  # the same arena, from the pool
  np.testing.assert_array_equal(first, second)
  monkeypatch.setattr(buffer, "POOL_LIMIT_BYTES", 0)  # nothing is kept past the limit
  raw, address = buffer.take_block(4096)
  before = buffer._pool_bytes
  buffer.give_block(raw, address)
  assert buffer._pool_bytes == before

