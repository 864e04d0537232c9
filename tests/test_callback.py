"""pure_callback: host functions called eagerly, as host steps of compiled programs (also in loops and branches),
under vmap's three methods, with custom_jvp for a derivative, and JAX's errors."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax import lax


def host_sin(x):
  return np.sin(x.astype(np.float64)).astype(x.dtype)


def like(x):
  return tj.ShapeDtypeStruct(x.shape, x.dtype)


def test_eager_and_jit_against_numpy():
  x = np.linspace(-2, 2, 11, dtype=np.float32)
  f = lambda v: jnp.tanh(tj.pure_callback(host_sin, like(v), v * 2 + 1)).sum() * 3  # noqa: E731
  expected = np.tanh(np.sin(x.astype(np.float64) * 2 + 1)).sum() * 3
  np.testing.assert_allclose(float(f(x)), expected, rtol=1e-6)
  jitted = tj.jit(f)
  np.testing.assert_allclose(float(jitted(x)), expected, rtol=1e-6)
  # every call runs the host function on that call's values (kernels before and after it)
  np.testing.assert_allclose(float(jitted(x + 1)), np.tanh(np.sin((x.astype(np.float64) + 1) * 2 + 1)).sum() * 3,
                             rtol=1e-6)


def test_called_once_per_run_with_its_values():
  seen = []

  def record(v):
    seen.append(np.array(v))
    return v * 10

  f = tj.jit(lambda v: tj.pure_callback(record, like(v), v + 1) - 1)
  for k in range(3):
    out = f(np.full(3, k, np.float32))
    np.testing.assert_array_equal(np.asarray(out), np.full(3, (k + 1) * 10 - 1))
  assert [s.tolist() for s in seen] == [[1, 1, 1], [2, 2, 2], [3, 3, 3]]


def test_pytrees_kwargs_and_several_results():
  def host(tree, *, scale):
    return {"sum": np.asarray(tree["a"] + tree["b"] * scale), "n": np.int32(tree["a"].size)}
  shapes = {"sum": tj.ShapeDtypeStruct((2, 2), np.float32), "n": tj.ShapeDtypeStruct((), np.int32)}
  a, b = np.ones((2, 2), np.float32), np.arange(4, dtype=np.float32).reshape(2, 2)
  for fn in (lambda t: tj.pure_callback(host, shapes, t, scale=2.0),
             tj.jit(lambda t: tj.pure_callback(host, shapes, t, scale=2.0))):
    out = fn({"a": a, "b": b})
    np.testing.assert_array_equal(np.asarray(out["sum"]), a + b * 2)
    assert int(out["n"]) == 4 and out["n"].dtype == np.int32


def test_in_scan_and_cond():
  counter = []

  def step(c):
    counter.append(1)
    return c + 1

  def body(carry, x):
    new = tj.pure_callback(step, tj.ShapeDtypeStruct((), np.float32), carry)
    return new * x, new

  final, ys = tj.jit(lambda xs: lax.scan(body, jnp.float32(1), xs))(np.array([1, 2, 3], np.float32))
  # carry: (1 + 1) * 1 = 2, (2 + 1) * 2 = 6, (6 + 1) * 3 = 21; ys are the callback results 2, 3, 7
  assert float(final) == 21.0 and np.asarray(ys).tolist() == [2.0, 3.0, 7.0]
  assert len(counter) == 3
  pick = tj.jit(lambda i, v: lax.cond(i > 0, lambda u: tj.pure_callback(host_sin, like(u), u), lambda u: -u, v))
  x = np.array([0.5, 1.0], np.float32)
  np.testing.assert_allclose(np.asarray(pick(1, x)), np.sin(x), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(pick(0, x)), -x)


@pytest.mark.parametrize("method", ["sequential", "expand_dims", "broadcast_all"])
def test_vmap_methods(method):
  calls = []

  def host(v, w):
    calls.append((v.shape, w.shape))
    return (v * w).astype(np.float32)
  xs, w = np.arange(6, dtype=np.float32).reshape(3, 2), np.array([10, 100], np.float32)
  shape = lambda v: tj.ShapeDtypeStruct(v.shape, v.dtype)  # noqa: E731
  f = tj.vmap(lambda v: tj.pure_callback(host, shape(v), v, w, vmap_method=method))
  np.testing.assert_array_equal(np.asarray(f(xs)), xs * w)
  np.testing.assert_array_equal(np.asarray(tj.jit(f)(xs)), xs * w)
  per_call = {"sequential": [((2,), (2,))] * 3, "expand_dims": [((3, 2), (1, 2))],
              "broadcast_all": [((3, 2), (3, 2))]}[method]
  assert calls == per_call * 2


def test_inside_shard_map_it_runs_once_per_device(on_cpu):
  """Inside `shard_map` (the JAX docs' callbacks example) a callback without vmap_method runs once per device on that
  device's block, eagerly and jitted, as JAX's does; under vmap it still asks for a vmap_method."""
  tj.config.update("jax_num_cpu_devices", 4)
  try:
    calls = []

    def host(v):
      calls.append(v.shape)
      return (v * 2).astype(v.dtype)
    f = lambda v: tj.pure_callback(host, like(v), v)  # noqa: E731
    mesh = tj.make_mesh((4,), ("i",))
    x = np.arange(8, dtype=np.float32)
    mapped = tj.shard_map(f, mesh=mesh, in_specs=tj.P("i"), out_specs=tj.P("i"))
    for run in (mapped, tj.jit(mapped)):
      calls.clear()
      np.testing.assert_array_equal(np.asarray(run(x)), x * 2)
      assert calls == [(2,)] * 4
    with pytest.raises(NotImplementedError, match="vmap_method"): tj.vmap(f)(x)
  finally:
    tj.config.update("jax_num_cpu_devices", -1)


def test_errors():
  x = np.ones(3, np.float32)
  with pytest.raises(NotImplementedError, match="vmap_method"):
    tj.vmap(lambda v: tj.pure_callback(host_sin, like(v), v))(np.ones((2, 3), np.float32))
  with pytest.raises(ValueError, match="do not support JVP"):
    tj.grad(lambda v: tj.pure_callback(host_sin, like(v), v).sum())(x)
  with pytest.raises(ValueError, match="shape"):
    tj.jit(lambda v: tj.pure_callback(lambda u: np.ones(4, np.float32), like(v), v))(x)
  with pytest.raises(TypeError, match="dtype"):
    tj.pure_callback(lambda u: np.ones(3, np.complex64), like(x), x)
  with pytest.raises(TypeError, match="structure"):
    tj.pure_callback(lambda u: (u, u), like(x), x)
  with pytest.raises(ValueError, match="vmap_method"):
    tj.pure_callback(host_sin, like(x), x, vmap_method="parallel")
  # a float64 result of a float32 declaration is rounded, as JAX does
  out = tj.jit(lambda v: tj.pure_callback(lambda u: np.sin(u.astype(np.float64)), like(v), v))(x)
  assert out.dtype == np.float32
  np.testing.assert_allclose(np.asarray(out), np.sin(1.0), rtol=1e-6)


def test_custom_jvp_gives_a_derivative_and_composes():
  @tj.custom_jvp
  def sin(v):
    return tj.pure_callback(host_sin, like(v), v, vmap_method="sequential")

  @sin.defjvp
  def sin_jvp(primals, tangents):
    (v,), (t,) = primals, tangents
    return sin(v), jnp.cos(v) * t

  x = np.linspace(-1, 1, 5, dtype=np.float32)
  np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(tj.grad(lambda v: sin(v) * 2)))(x)), 2 * np.cos(x),
                             rtol=1e-6)
  eps = 1e-3
  fd = (np.asarray(sin(x + eps), np.float64) - np.asarray(sin(x - eps), np.float64)) / (2 * eps)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda v: sin(v).sum())(x)), fd, rtol=1e-3)


def test_make_jaxpr_and_profile_show_it():
  x = np.ones(4, np.float32)
  text = str(tj.make_jaxpr(lambda v: tj.pure_callback(host_sin, like(v), v) + 1)(x))
  assert "pure_callback[callback=host_sin]" in text
  f = tj.jit(lambda v: tj.pure_callback(host_sin, like(v), v * 2) + 1)
  with tj.profile() as profile:
    out = f(x)
  np.testing.assert_allclose(np.asarray(out), np.sin(2.0) + 1, rtol=1e-6)
  assert len(profile.kernels) >= 1


def test_host_step_views_follow_the_buffers_addresses():
  """A host step keeps a numpy view per (slot, address) (devices/cpu.py HostProgram): with outputs held alive the
  addresses keep changing, past the views it keeps (HOST_VIEWS), and with them dropped they repeat; every call must
  see its own operands and write its own results."""
  from tinyjax.devices.cpu import HOST_VIEWS
  f = tj.jit(lambda x: tj.pure_callback(lambda v: np.cumsum(v) * 2, tj.ShapeDtypeStruct(x.shape, x.dtype), x) + x)
  rng = np.random.default_rng(5)
  held = []
  for step in range(HOST_VIEWS + 20):
    host = rng.standard_normal(33).astype(np.float32)
    out = f(jnp.asarray(host))
    if step % 2: held.append((out, host))
    else: np.testing.assert_allclose(np.asarray(out), np.cumsum(host) * 2 + host, rtol=1e-5, atol=1e-5)
  for out, host in held:
    np.testing.assert_allclose(np.asarray(out), np.cumsum(host) * 2 + host, rtol=1e-5, atol=1e-5)
