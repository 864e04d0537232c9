"""Control flow: lax.scan, fori_loop, while_loop, map, cond and switch against Python loops (numpy references),
gradients against finite differences and unrolled loops, vmap against Python loops, composed transformations, the
one-call property of a jitted loop, and JAX's errors."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax
from tinyjax.devices import LaunchList
from tinyjax.lower.schedule import kernels_of
from tests.gradcheck import numeric_grad, numeric_grad_f32

RNG = np.random.default_rng(11)


def test_scan_matches_a_python_loop_with_pytrees():
  xs = {"a": RNG.standard_normal((7, 3)).astype(np.float32), "b": np.arange(7, dtype=np.int32)}

  def step(carry, x):
    total, count = carry
    total = total * 0.5 + x["a"] * x["b"]
    return (total, count + x["b"]), {"sum": total.sum(), "twice": 2 * x["b"]}

  (total, count), ys = lax.scan(step, (tnp.zeros(3), tnp.asarray(np.int32(0))), {k: tnp.asarray(v) for k, v in
                                                                               xs.items()})
  want_total, want_count, sums = np.zeros(3, np.float64), 0, []
  for t in range(7):
    want_total = want_total * 0.5 + xs["a"][t] * xs["b"][t]
    want_count += xs["b"][t]
    sums.append(want_total.sum())
  np.testing.assert_allclose(np.asarray(total), want_total, rtol=1e-5)
  assert int(count) == want_count and count.dtype == np.int32
  np.testing.assert_allclose(np.asarray(ys["sum"]), sums, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(ys["twice"]), 2 * xs["b"])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("jit", [False, True])
def test_scan_reverse_length_and_empty(reverse, jit):
  def run(xs):
    return lax.scan(lambda c, x: (c + x, c * 2), 0.0, xs, reverse=reverse)
  run = tj.jit(run) if jit else run
  xs = np.arange(5.0, dtype=np.float32)
  carry, ys = run(tnp.asarray(xs))
  order = range(4, -1, -1) if reverse else range(5)
  c, want = 0.0, np.zeros(5)
  for t in order:
    want[t] = 2 * c
    c += xs[t]
  assert float(carry) == c
  np.testing.assert_array_equal(np.asarray(ys), want)
  carry, ys = run(tnp.zeros((0,)))
  assert float(carry) == 0.0 and ys.shape == (0,)
  count, none = lax.scan(lambda c, _: (c + 1, None), 0, None, length=4, unroll=2)
  assert int(count) == 4 and none is None


def test_loops_fori_while_map():
  assert int(lax.fori_loop(0, 10, lambda i, v: v + i, 0)) == 45
  assert int(tj.jit(lambda n: lax.fori_loop(0, n, lambda i, v: v + i, 0))(10)) == 45  # traced bounds: a while loop
  assert int(lax.fori_loop(5, 2, lambda i, v: v + i, 7)) == 7
  count, value = lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 2.0), (0, 1.0))
  assert int(count) == 10 and float(value) == 1024.0
  collatz = tj.jit(lambda n: lax.while_loop(lambda c: c[0] != 1, lambda c: (
    tnp.where(c[0] % 2 == 0, c[0] // 2, 3 * c[0] + 1), c[1] + 1), (n, 0))[1])
  assert int(collatz(27)) == 111
  np.testing.assert_array_equal(np.asarray(lax.map(lambda x: x ** 2, tnp.arange(5.0))), np.arange(5.0) ** 2)
  assert int(lax.while_loop(lambda c: c < 0, lambda c: c + 1, 5)) == 5  # zero passes
  # with concrete bounds the index is the Python int, weakly typed whatever the bounds' dtype, as JAX's: a weak carry
  # stays weak, a float32 one float32
  for lower in (0, tnp.int16(0), np.int64(0)):
    total = lax.fori_loop(lower, 10, lambda i, v: v + i, 0)
    assert (int(total), total.dtype, total.weak_type) == (45, np.int32, True)
  total = lax.fori_loop(0, 10, lambda i, v: v + i, tnp.float32(0))
  assert (float(total), total.dtype, total.weak_type) == (45.0, np.float32, False)


def test_cond_and_switch():
  assert float(lax.cond(True, lambda x: x + 1, lambda x: x - 1, 3.0)) == 4.0
  branch = tj.jit(lambda p, x: lax.cond(p, lambda x: x + 1, lambda x: x - 1, x))
  assert float(branch(False, 3.0)) == 2.0 and float(branch(True, 3.0)) == 4.0
  assert float(lax.cond(2, lambda: 1.0, lambda: 0.0)) == 1.0
  branches = [lambda x: x, lambda x: x * 10, lambda x: -x]
  for index, want in [(-3, 2.0), (0, 2.0), (1, 20.0), (2, -2.0), (9, -2.0)]:  # the index is clamped
    assert float(lax.switch(index, branches, 2.0)) == want
    assert float(tj.jit(lambda i, x: lax.switch(i, branches, x))(index, 2.0)) == want
  batched = tj.vmap(lambda p, x: lax.cond(p, lambda v: v * 2, lambda v: v + 100, x))(
    tnp.asarray([True, False, True]), tnp.asarray([1.0, 2.0, 3.0]))
  np.testing.assert_array_equal(np.asarray(batched), [2.0, 102.0, 6.0])


def test_jitted_scan_of_1000_steps_is_one_call(monkeypatch, on_cpu):
  calls = []
  original = LaunchList.__call__

  def counting(self, addresses):
    calls.append(self)
    return original(self, addresses)
  monkeypatch.setattr(LaunchList, "__call__", counting)
  w = tnp.asarray(RNG.standard_normal((16, 16)).astype(np.float32) * 0.1)
  xs = tnp.asarray(RNG.standard_normal((1000, 16)).astype(np.float32))
  run = tj.jit(lambda w, xs: lax.scan(lambda h, x: (tnp.tanh(h @ w + x), h.sum()), tnp.zeros(16), xs))
  h, ys = run(w, xs)
  h.block_until_ready()
  calls.clear()
  before = tj.runtime_stats()["kernels_launched"]
  h, ys = run(w, xs)
  h.block_until_ready()
  assert len(calls) == 1  # one call from Python for the whole loop
  launched = tj.runtime_stats()["kernels_launched"] - before
  assert launched >= 1000 and launched == calls[0].launched
  host_w, host_xs, want = np.asarray(w, np.float64), np.asarray(xs, np.float64), np.zeros(16)
  for t in range(1000): want = np.tanh(want @ host_w + host_xs[t])
  np.testing.assert_allclose(np.asarray(h), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_pass_numbers_come_from_the_runtime(reverse):
  """A scan's body reads its slice of xs at the pass number, which the runtime writes into a counter buffer before
  each pass (no kernels set or step it): the RNN step is one kernel per pass (tanh fused after the vector-matrix
  product) plus the carry's copy, and the numbers agree with float64 numpy whether the loop runs in the runtime or
  from Python (a profile times each launch), nested in another scan too."""
  w = tnp.asarray(RNG.standard_normal((8, 8)).astype(np.float32) * 0.3)
  xs = tnp.asarray(RNG.standard_normal((37, 8)).astype(np.float32))
  step = lambda h, x: (tnp.tanh(h @ w + x), (h * x).sum())  # noqa: E731
  run = tj.jit(lambda xs: lax.scan(step, tnp.zeros(8), xs, reverse=reverse))
  host_w, host_xs = np.asarray(w, np.float64), np.asarray(xs, np.float64)
  h, want_ys = np.zeros(8), np.zeros(37)
  for t in (range(36, -1, -1) if reverse else range(37)):
    want_ys[t] = (h * host_xs[t]).sum()
    h = np.tanh(h @ host_w + host_xs[t])
  sched = run.lower(xs)._compiled.schedule.schedule
  (loop,) = [step for step in sched.kernels if hasattr(step, "body")]
  assert loop.counter_slot >= 0
  assert not any(kernel.slots[0] == loop.counter_slot for kernel in kernels_of(sched.kernels))
  assert len(loop.body) == 4  # the RNN step, y, y's write into ys, the carry's copy
  for timed in (False, True):
    if timed:
      with tj.profile():
        got_h, got_ys = run(xs)
        got_h.block_until_ready()
    else: got_h, got_ys = run(xs)
    np.testing.assert_allclose(np.asarray(got_h), h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got_ys), want_ys, rtol=1e-4, atol=1e-5)
  nested = tj.jit(lambda xss: lax.scan(lambda c, xs: (c + lax.scan(step, tnp.zeros(8), xs)[1].sum(), None), 0.0,
                                       xss)[0])
  xss = RNG.standard_normal((3, 5, 8)).astype(np.float32)
  want = 0.0
  for block in xss.astype(np.float64):
    h = np.zeros(8)
    for x in block:
      want += (h * x).sum()
      h = np.tanh(h @ host_w + x)
  np.testing.assert_allclose(float(nested(tnp.asarray(xss))), want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------- differentiation

W = tnp.asarray(RNG.standard_normal((4, 4)).astype(np.float32) * 0.5)
XS = tnp.asarray(RNG.standard_normal((6, 4)).astype(np.float32))
H0 = tnp.asarray(RNG.standard_normal(4).astype(np.float32))


def rnn(w, h0, xs):
  def step(h, x):
    h = tnp.tanh(h @ w + x)
    return h, tnp.sin(h).sum()
  h, ys = lax.scan(step, h0, xs)
  return (h ** 2).sum() + (ys ** 2).sum()


def rnn_unrolled(w, h0, xs):
  h, ys = h0, []
  for t in range(xs.shape[0]):
    h = tnp.tanh(h @ w + xs[t])
    ys.append(tnp.sin(h).sum())
  return (h ** 2).sum() + (tnp.stack(ys) ** 2).sum()


def test_scan_gradients_match_unrolled_loop_and_finite_differences():
  grads = tj.grad(rnn, argnums=(0, 1, 2))(W, H0, XS)
  unrolled = tj.grad(rnn_unrolled, argnums=(0, 1, 2))(W, H0, XS)
  for got, want in zip(grads, unrolled): np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
  np.testing.assert_allclose(np.asarray(grads[0]), numeric_grad_f32(lambda w: rnn(w, H0, XS), W), atol=5e-3)
  jitted = tj.jit(tj.grad(rnn, argnums=(0, 2)))(W, H0, XS)
  np.testing.assert_allclose(np.asarray(jitted[0]), np.asarray(unrolled[0]), atol=1e-5)
  np.testing.assert_allclose(np.asarray(jitted[1]), np.asarray(unrolled[2]), atol=1e-5)
  _, tangent = tj.jvp(lambda w: rnn(w, H0, XS), (W,), (tnp.ones((4, 4)),))
  _, want_tangent = tj.jvp(lambda w: rnn_unrolled(w, H0, XS), (W,), (tnp.ones((4, 4)),))
  np.testing.assert_allclose(float(tangent), float(want_tangent), rtol=1e-5)


def test_reverse_scan_and_fori_loop_gradients():
  def reverse_product(x): return lax.scan(lambda c, v: (c * v + 1.0, c), 1.0, x, reverse=True)[1].sum()
  host = RNG.standard_normal(5).astype(np.float32)
  np.testing.assert_allclose(np.asarray(tj.grad(reverse_product)(tnp.asarray(host))),
                             numeric_grad_f32(reverse_product, host), atol=2e-3)
  assert float(tj.grad(lambda x: lax.fori_loop(0, 5, lambda i, v: v * x, 1.0))(2.0)) == 80.0
  assert float(tj.hessian(lambda x: lax.scan(lambda c, _: (c * x, None), 1.0, None, length=3)[0])(2.0)) == 12.0


def test_while_loop_is_forward_differentiable_only():
  def power(x): return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * x), (0, 1.0))[1]
  value, tangent = tj.jvp(power, (2.0,), (1.0,))
  assert float(value) == 32.0 and float(tangent) == 80.0
  assert float(tj.jacfwd(power)(2.0)) == 80.0
  with pytest.raises(ValueError, match="Reverse-mode differentiation does not work for lax.while_loop"):
    tj.grad(power)(2.0)
  with pytest.raises(ValueError, match="Reverse-mode"):
    tj.jit(tj.grad(lambda x, n: lax.fori_loop(0, n, lambda i, v: v * x, 1.0)))(2.0, 3)  # traced bounds


def test_cond_gradient_takes_the_branch():
  def f(x): return lax.cond(x > 0, lambda v: v ** 2, lambda v: -v, x)
  assert float(tj.grad(f)(3.0)) == 6.0 and float(tj.grad(f)(-3.0)) == -1.0
  assert float(tj.jit(tj.grad(f))(3.0)) == 6.0 and float(tj.jit(tj.grad(f))(-3.0)) == -1.0
  # only the taken branch is differentiated, also under jit: no NaN from log's derivative at -1
  def safe_log(x): return lax.cond(x > 0, lambda v: tnp.log(v), lambda v: 0.0 * v, x)
  assert float(tj.jit(tj.grad(safe_log))(-1.0)) == 0.0 and float(tj.jit(tj.grad(safe_log))(2.0)) == 0.5
  np.testing.assert_array_equal(np.asarray(tj.jit(tj.vmap(tj.grad(safe_log)))(tnp.asarray([-1.0, 2.0]))), [0, 0.5])
  weights = tnp.asarray([1.0, 2.0])
  branches = [lambda v: (v * weights).sum(), lambda v: tnp.sin(v).sum(), lambda v: (v ** 3).sum()]
  x = tnp.asarray([0.5, 1.5])
  for index, want in enumerate([np.array([1.0, 2.0]), np.cos([0.5, 1.5]), 3 * np.array([0.5, 1.5]) ** 2]):
    got = tj.jit(tj.grad(lambda v, i: lax.switch(i, branches, v)))(x, index)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
  assert float(tj.hessian(lambda v: lax.cond(v > 0, lambda a: a ** 3, lambda a: -a, v))(2.0)) == 12.0
  inside_scan = tj.grad(lambda xs: lax.scan(lambda c, v: (lax.cond(v > 0, lambda a: a * v, lambda a: a - v, c),
                                                          None), 1.0, xs)[0])
  np.testing.assert_array_equal(np.asarray(inside_scan(tnp.asarray([2.0, -1.0, 3.0]))), [3.0, -3.0, 3.0])


def test_only_the_chosen_branch_runs():
  text = str(tj.make_jaxpr(lambda p, x: lax.cond(p, tnp.sin, tnp.cos, x))(True, 1.0))
  assert "cond[branches=(" in text and text.count("{ lambda") == 3
  run = tj.jit(lambda i, x: lax.switch(i, [lambda v: v + 1, lambda v: v * 2], x))
  assert float(run(0, 3.0)) == 4.0 and float(run(1, 3.0)) == 6.0
  def slow(v): return lax.fori_loop(0, 50, lambda i, a: tnp.sin(a), v).sum()  # 50 passes of kernels
  expensive = tj.jit(lambda p, x: lax.cond(p, slow, lambda v: v[0], x))
  x = tnp.ones(64)
  expensive(False, x).block_until_ready()
  expensive(True, x).block_until_ready()
  before = tj.runtime_stats()["kernels_launched"]
  assert float(expensive(False, x)) == 1.0
  cheap = tj.runtime_stats()["kernels_launched"] - before
  before = tj.runtime_stats()["kernels_launched"]
  assert float(expensive(True, x)) == pytest.approx(float(slow(x)), rel=1e-6)
  assert cheap + 50 < tj.runtime_stats()["kernels_launched"] - before  # the untaken branch's loop did not run


# ------------------------------------------------------------------------------------------- vmap and composition

def test_vmap_of_scan_matches_python_loops():
  ws = tnp.stack([W, W * 0.5, W * 2])
  got = tj.vmap(rnn, in_axes=(0, None, None))(ws, H0, XS)
  np.testing.assert_allclose(np.asarray(got), [float(rnn(ws[i], H0, XS)) for i in range(3)], rtol=1e-5)
  xs2 = tnp.stack([XS, XS * 2], axis=1)  # the batch axis in the middle of xs
  got = tj.vmap(rnn, in_axes=(None, None, 1))(W, H0, xs2)
  np.testing.assert_allclose(np.asarray(got), [float(rnn(W, H0, XS)), float(rnn(W, H0, XS * 2))], rtol=1e-5)
  h0s = tnp.stack([H0, -H0])
  got = tj.vmap(rnn, in_axes=(None, 0, None))(W, h0s, XS)  # only the carry batched
  np.testing.assert_allclose(np.asarray(got), [float(rnn(W, H0, XS)), float(rnn(W, -H0, XS))], rtol=1e-5)
  grads = tj.jit(tj.vmap(tj.grad(rnn), in_axes=(0, None, None)))(ws, H0, XS)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(grads[i]), np.asarray(tj.grad(rnn_unrolled)(ws[i], H0, XS)), atol=1e-5)
  per_example = tj.vmap(tj.jit(rnn), in_axes=(0, None, None))(ws, H0, XS)
  np.testing.assert_allclose(np.asarray(per_example), [float(rnn(ws[i], H0, XS)) for i in range(3)], rtol=1e-5)


def test_vmap_of_while_with_a_batched_predicate_runs_until_all_are_done():
  def doubling(n): return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0), (0, 1.0))
  counts, values = tj.vmap(doubling)(tnp.asarray([1, 3, 0, 5]))
  np.testing.assert_array_equal(np.asarray(counts), [1, 3, 0, 5])
  np.testing.assert_array_equal(np.asarray(values), [2.0, 8.0, 1.0, 32.0])
  jitted = tj.jit(tj.vmap(doubling))(tnp.asarray([2, 4]))
  np.testing.assert_array_equal(np.asarray(jitted[1]), [4.0, 16.0])
  scaled = tj.vmap(lambda x: lax.while_loop(lambda c: c < 10.0, lambda c: c * x, 1.0))(tnp.asarray([2.0, 3.0]))
  np.testing.assert_array_equal(np.asarray(scaled), [16.0, 27.0])


def test_nested_loops_and_their_gradients():
  def nested(x):
    def outer(c, row):
      inner, _ = lax.scan(lambda a, v: (a * 0.9 + tnp.sin(v * c), None), c, row)
      return inner, inner
    return lax.scan(outer, 0.5, x)[1].sum()
  host = RNG.standard_normal((3, 4)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(tj.grad(nested)(tnp.asarray(host))), numeric_grad_f32(nested, host), atol=3e-3)
  counted = lax.scan(lambda c, x: (c + lax.while_loop(lambda v: v < x, lambda v: v + 1, 0), None), 0,
                     tnp.asarray([3, 1, 4]))[0]
  assert int(counted) == 8


def test_make_jaxpr_shows_the_loop_and_its_body():
  text = str(tj.make_jaxpr(lambda xs: lax.scan(lambda c, x: (c + x, tnp.tanh(c)), 0.0, xs))(tnp.arange(3.0)))
  assert "scan[jaxpr={ lambda" in text and "length=3 num_carry=" in text and "tanh" in text


# ------------------------------------------------------------------------------------------- errors

def test_loop_errors():
  with pytest.raises(TypeError, match="carry input and carry output must have equal types"):
    lax.scan(lambda c, x: (c.astype(np.int32), x), tnp.zeros(2), tnp.ones((3, 2)))
  with pytest.raises(TypeError, match="same pytree structure"):
    lax.scan(lambda c, x: ((c, c), x), tnp.zeros(2), tnp.ones((3, 2)))
  with pytest.raises(ValueError, match="different leading axis sizes"):
    lax.scan(lambda c, x: (c, x), 0.0, (tnp.ones(3), tnp.ones(4)))
  with pytest.raises(ValueError, match="length"):
    lax.scan(lambda c, x: (c, x), 0.0, None)
  with pytest.raises(TypeError, match="boolean scalar"):
    lax.while_loop(lambda c: c, lambda c: c + 1.0, 0.0)
  with pytest.raises(TypeError, match="equal types"):
    lax.while_loop(lambda c: c < 3, lambda c: tnp.ones(2), 0.0)
  with pytest.raises(TypeError, match="identical types"):
    lax.cond(True, lambda: tnp.zeros(2), lambda: tnp.zeros(3))
  with pytest.raises(TypeError, match="scalar"):
    lax.cond(tnp.asarray([True, False]), lambda: 1.0, lambda: 0.0)
  with pytest.raises(TypeError, match="integer"):
    lax.fori_loop(0.0, 3, lambda i, v: v, 0.0)
  with pytest.raises(TypeError, match="callable"):
    lax.scan(3, 0.0, tnp.ones(3))


CHILD_ENDLESS_LOOP = """
import signal; signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
import sys; sys.path.insert(0, {root!r})
import tinyjax as tj
from tinyjax import lax
endless = tj.jit(lambda x: lax.while_loop(lambda c: c >= 0.0, lambda c: c + 1.0, x))  # stops growing at 2**24
endless(-1.0).block_until_ready()  # compiled, and run once
print("RUNNING", flush=True)
endless(0.0).block_until_ready()
print("FINISHED", flush=True)
"""


def test_ctrl_c_stops_an_endless_while_loop(tmp_path):
  import os
  import signal
  import subprocess
  import sys
  import time
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, TINYJAX_CACHE_DIR=str(tmp_path))
  child = subprocess.Popen([sys.executable, "-c", CHILD_ENDLESS_LOOP.format(root=root)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
  try:
    assert child.stdout.readline().strip() == "RUNNING"
    time.sleep(0.3)
    interrupted_at = time.perf_counter()
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=20)
    exit_seconds = time.perf_counter() - interrupted_at
  finally:
    if child.poll() is None: child.kill()
  assert "FINISHED" not in stdout
  assert "KeyboardInterrupt" in stderr, stderr
  assert exit_seconds < 2.0


def test_custom_jvp_rule_applies_inside_loop_bodies_and_branches():
  """A custom_jvp function called in a scan / fori_loop body or a cond branch is staged as a primitive, so the body's
  derivative uses the rule (here deliberately not the true derivative), as it does outside a loop."""
  @tj.custom_jvp
  def f(x): return tnp.sin(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return f(x), 3.0 * tnp.cos(2 * x) * dx

  xs = tnp.asarray(np.array([0.3, -1.2, 2.0], np.float32))

  def scanned(c0):
    return lax.scan(lambda c, x: (c + f(x * c), None), c0, xs)[0]

  def unrolled(c):
    for x in np.asarray(xs): c = c + f(float(x) * c)
    return c
  want = float(tj.grad(unrolled)(0.7))
  for transform in (tj.grad, lambda g: tj.jit(tj.grad(g))):
    np.testing.assert_allclose(float(transform(scanned)(0.7)), want, rtol=1e-5)
  cs = tnp.asarray(np.array([0.7, -0.4], np.float32))
  wants = [float(tj.grad(unrolled)(float(c))) for c in np.asarray(cs)]
  np.testing.assert_allclose(np.asarray(tj.grad(lambda c: tj.vmap(scanned)(c).sum())(cs)), wants, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(tj.grad(scanned)))(cs)), wants, rtol=1e-5)
  looped = tj.grad(lambda c: lax.fori_loop(0, 3, lambda i, v: v + f(v), c))(0.2)
  np.testing.assert_allclose(float(looped), float(tj.grad(lambda v: (lambda a: (lambda b: b + f(b))(a + f(a)))(
    v + f(v)))(0.2)), rtol=1e-5)
  branch = tj.grad(lambda v: lax.cond(v > 0, f, tnp.cos, v))(0.4)
  np.testing.assert_allclose(float(branch), 3.0 * np.cos(0.8), rtol=1e-6)
  # forward mode through a while_loop body
  _, tangent = tj.jvp(lambda v: lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, f(s[1])), (0, v))[1],
                      (0.5,), (1.0,))
  np.testing.assert_allclose(float(tangent), 3.0 * np.cos(2 * np.sin(0.5)) * 3.0 * np.cos(1.0), rtol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_scan_carries_updated_from_each_other(jit):
  """Carries whose new values read the others' old values (a rotation and a running sum): the elementwise updates
  merge into one kernel, which must not write a carry in place while a later output still reads its old value."""
  def body(carry, x):
    a, b, c = carry
    return (b * 2.0, a + 1.0, c + a * b + x), a.sum()

  def run(a, b, c, xs): return lax.scan(body, (a, b, c), xs)
  a, b, c = (RNG.standard_normal(6).astype(np.float32) for _ in range(3))
  xs = RNG.standard_normal((5, 6)).astype(np.float32)
  (ga, gb, gc), ys = (tj.jit(run) if jit else run)(a, b, c, xs)
  want_a, want_b, want_c, want_ys = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64), []
  for x in xs:
    want_ys.append(want_a.sum())
    want_a, want_b, want_c = want_b * 2.0, want_a + 1.0, want_c + want_a * want_b + x
  for got, want in ((ga, want_a), (gb, want_b), (gc, want_c), (ys, want_ys)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
def test_carry_passed_on_while_its_own_update_is_computed(jit):
  """A carry's old value passed on as another carry's new one while its own new value is computed from it, (a, b) ->
  (b, a + b): the computed value must not be written over the old one before it is copied (fori_loop's Fibonacci
  gave (4, 4) for (2, 3)); scan, fori_loop, while_loop, and the JAX docs' fixed point (Newton's square root, whose
  while_loop stopped after one pass), eagerly and jitted, under vmap, and its custom_vjp gradients."""
  maybe_jit = tj.jit if jit else (lambda f: f)
  fib = maybe_jit(lambda n: lax.fori_loop(0, n, lambda i, c: (c[1], c[0] + c[1]), (0.0, 1.0)))
  assert [float(v) for v in fib(10)] == [55.0, 89.0]
  (last, ys) = maybe_jit(lambda c: lax.scan(lambda c, _: ((c[1], c[0] + c[1]), c[0]), c, None, length=8))((0.0, 1.0))
  assert [float(v) for v in last] == [21.0, 34.0] and np.asarray(ys).tolist() == [0, 1, 1, 2, 3, 5, 8, 13]
  x = RNG.standard_normal(5).astype(np.float32)
  rotated = maybe_jit(lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[2], c[1] * 10.0),
                                               (0, x, 2 * x)))(x)
  np.testing.assert_allclose(np.asarray(rotated[1]), x * 20, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(rotated[2]), x * 100, rtol=1e-6)

  def fixed_point(f, a, x_guess):
    def cond_fun(carry):
      x_prev, x = carry
      return tnp.abs(x_prev - x) > 1e-6
    _, x_star = lax.while_loop(cond_fun, lambda carry: (carry[1], f(a, carry[1])), (x_guess, f(a, x_guess)))
    return x_star

  def newton_sqrt(a): return fixed_point(lambda a, x: 0.5 * (x + a / x), a, a)
  np.testing.assert_allclose(float(maybe_jit(newton_sqrt)(2.0)), np.sqrt(2.0), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(maybe_jit(tj.vmap(newton_sqrt))(tnp.array([1.0, 2.0, 3.0, 4.0]))),
                             np.sqrt([1.0, 2.0, 3.0, 4.0]), rtol=1e-6)

  @tj.custom_vjp
  def sqrt_by_fixed_point(a): return newton_sqrt(a)

  def forward(a):
    root = newton_sqrt(a)
    return root, root

  def backward(root, g): return (g * 0.5 / root,)  # d sqrt(a) / da
  sqrt_by_fixed_point.defvjp(forward, backward)
  np.testing.assert_allclose(float(maybe_jit(tj.grad(sqrt_by_fixed_point))(2.0)), 0.5 / np.sqrt(2.0), rtol=1e-6)


def test_unread_scan_outputs_and_inputs_are_pruned(monkeypatch, on_cpu):
  """A scan's ys that nothing reads are not computed, and the xs its body doesn't read are dropped, so that an earlier
  scan's ys read only by those go too (lower/schedule.py `prune_scans`): an HMM's log-likelihood gradient in a
  fori_loop (its forward pass stacked the reduce_max masks of logsumexp, which the backward pass never reads) has
  fewer kernels; the results against a float64 forward algorithm and finite differences."""
  from tinyjax.lower import schedule as schedule_module
  from tinyjax.scipy.special import logsumexp
  rng = np.random.default_rng(3)
  log_pi, log_a, log_b = (rng.standard_normal(shape).astype(np.float32) for shape in ((5,), (5, 5), (5, 7)))
  seq = rng.integers(0, 7, 40).astype(np.int32)

  def log_normalizer(params, seq):
    pi, a, b = params

    def marginalize(alpha, obs):
      return logsumexp(alpha[:, None] + a, axis=0) + b[:, obs], alpha.sum()
    alpha, sums = lax.scan(marginalize, pi, seq)
    return logsumexp(alpha)

  def em(params, seq):
    def update(i, params):
      moments = tj.grad(log_normalizer)(params, seq)
      return [tnp.log(m / m.sum(-1, keepdims=True)) for m in moments]
    return lax.fori_loop(0, 3, update, params)
  params = [tnp.asarray(v) for v in (log_pi, log_a, log_b)]

  def kernel_counts(fn) -> tuple[int, int]:  # (kernels with pruning, without)
    sink = tj.jit(fn).lower(params, seq)._compiled.jaxpr.sink
    pruned = len(kernels_of(schedule_module.schedule(sink).kernels))
    with monkeypatch.context() as patch:
      patch.setattr(schedule_module, "prune_scans", lambda program: program)
      return pruned, len(kernels_of(schedule_module.schedule(sink).kernels))
  for fn in (em, log_normalizer):
    pruned, whole = kernel_counts(fn)
    assert pruned < whole, (fn.__name__, pruned, whole)
  # EM's steps keep each distribution normalised (exp of each row sums to 1)
  for p in tj.jit(em)(params, seq): np.testing.assert_allclose(np.exp(np.asarray(p, np.float64)).sum(-1), 1, rtol=1e-5)
  wide = [np.asarray(v, np.float64) for v in (log_pi, log_a, log_b)]

  def forward(pi, a, b):
    alpha = pi
    for obs in seq:
      top = (alpha[:, None] + a).max(0)
      alpha = top + np.log(np.exp(alpha[:, None] + a - top).sum(0)) + b[:, obs]
    return alpha.max() + np.log(np.exp(alpha - alpha.max()).sum())
  np.testing.assert_allclose(float(tj.jit(log_normalizer)(params, seq)), forward(*wide), rtol=1e-5)
  with tj.config.override("jax_enable_x64", True):
    wide_params = [tnp.asarray(v) for v in wide]
    grads = tj.jit(tj.grad(log_normalizer))(wide_params, seq)
    numeric = numeric_grad(lambda a: log_normalizer([wide_params[0], tnp.asarray(a), wide_params[2]], seq), wide[1],
                           1e-6)
    np.testing.assert_allclose(np.asarray(grads[1]), numeric, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(float(tj.jit(log_normalizer)(wide_params, seq)), forward(*wide), rtol=1e-12)
