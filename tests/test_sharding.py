"""Several CPU devices, tinyjax.sharding and shard_map: results against numpy float64 references (values JAX 0.10.2
gives for the same programs are noted where they pin a semantic), transformations composed, and JAX's errors."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax import lax
from tinyjax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

DEVICES = 8


@pytest.fixture(autouse=True)
def eight_devices(on_cpu):
  """Eight CPU devices, the default platform (meshes are of CPU devices: a GPU mesh is not built yet)."""
  tj.config.update("jax_num_cpu_devices", DEVICES)
  yield
  tj.config.update("jax_num_cpu_devices", -1)


def mesh_1d(n: int = 4, name: str = "i") -> Mesh:
  return Mesh(np.array(tj.devices()[:n]), (name,))


def normal(shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- devices

def test_devices_count_and_attributes():
  devices = tj.devices()
  assert len(devices) == DEVICES == tj.device_count() == tj.local_device_count()
  assert [d.id for d in devices] == list(range(DEVICES))
  assert all(d.platform == "cpu" and d.process_index == 0 for d in devices)
  assert repr(devices[3]) == "CpuDevice(id=3)" and str(devices[3]) == "cpu:3"
  assert tj.process_index() == 0 and tj.process_count() == 1
  assert tj.devices()[0] is tj.devices()[0]  # the same objects every time


def test_device_count_from_config_back_to_one():
  tj.config.update("jax_num_cpu_devices", -1)
  assert tj.device_count() == 1
  tj.config.update("jax_num_cpu_devices", 0)
  with pytest.raises(ValueError, match="at least 1"):
    tj.devices()


def test_computation_follows_its_device():
  device = tj.devices()[5]
  x = tj.device_put(jnp.arange(4.0), device)
  assert x.device is device and x.sharding == SingleDeviceSharding(device)
  assert (x * 2).device is device
  y = tj.jit(lambda v: jnp.sin(v) + 1)(x)
  assert y.device is device
  np.testing.assert_allclose(np.asarray(y), np.sin(np.arange(4.0)) + 1, rtol=1e-6)
  # two committed devices: JAX's error
  z = tj.device_put(jnp.ones(4), tj.devices()[2])
  with pytest.raises(ValueError, match="incompatible devices"):
    np.asarray(x + z)
  # an input stays where it was when jit passes it through
  same = tj.jit(lambda v: v)(x)
  assert same.device is device


# ---- meshes, specs, shardings

def test_mesh_and_make_mesh():
  mesh = tj.make_mesh((2, 4), ("x", "y"))
  assert mesh.shape == {"x": 2, "y": 4} and mesh.size == 8 and mesh.axis_names == ("x", "y")
  assert [d.id for d in mesh.devices.flat] == list(range(8))
  assert repr(mesh) == "Mesh('x': 2, 'y': 4, axis_types=(Explicit, Explicit))"  # (JAX 0.10's make_mesh default)
  with pytest.raises(ValueError, match="needs 16 devices"):
    tj.make_mesh((4, 4), ("x", "y"))
  with pytest.raises(ValueError, match="unique"):
    Mesh(np.array(tj.devices()[:4]).reshape(2, 2), ("x", "x"))
  with pytest.raises(ValueError, match="rank"):
    Mesh(np.array(tj.devices()[:4]), ("x", "y"))


def test_partition_spec():
  assert P("x", None, ("x", "y")) == ("x", None, ("x", "y"))
  assert repr(P("i")) == "P('i',)" and repr(P()) == "P()"
  assert P(("a",)) == P("a")  # a one-name tuple is the name
  assert tj.P is P
  with pytest.raises(TypeError):
    P(3)


@pytest.mark.parametrize("spec,shape", [(P("x", "y"), (4, 8)), (P("y"), (8, 6)), (P(None, "x"), (3, 4)),
                                        (P(("x", "y")), (16,)), (P(("y", "x"), None), (8, 2)), (P(), (5, 3))])
def test_device_put_sharded_blocks(spec, shape):
  mesh = tj.make_mesh((2, 4), ("x", "y"))
  host = normal(shape)
  sharding = NamedSharding(mesh, spec)
  x = tj.device_put(host, sharding)
  assert x.sharding == sharding and x.devices() == set(mesh.devices.flat)
  np.testing.assert_array_equal(np.asarray(x), host)
  shards = x.addressable_shards
  assert len(shards) == 8
  block = sharding.shard_shape(shape)
  coverage = np.zeros(shape, np.int64)
  for shard in shards:
    data = np.asarray(shard.data)
    assert data.shape == block and shard.data.device is shard.device
    np.testing.assert_array_equal(data, host[shard.index])
    coverage[shard.index] += 1
  replicas = 8 // int(np.prod([mesh.shape[n] for n in spec.axis_names()] or [1]))
  assert (coverage == replicas).all()  # every element in as many shards as there are copies of it
  assert sorted(s.replica_id for s in shards) == sorted(list(range(replicas)) * (8 // replicas))
  assert x.is_fully_replicated == (spec == P())


def test_shard_index_order_is_row_major_over_named_axes():
  mesh = tj.make_mesh((2, 4), ("x", "y"))
  x = tj.device_put(jnp.arange(16.0), NamedSharding(mesh, P(("y", "x"))))
  # device (x, y) holds block number y * 2 + x: the first name is major
  for shard in x.addressable_shards:
    xi, yi = np.argwhere(mesh.devices == shard.device)[0]
    number = yi * 2 + xi
    assert shard.index == (slice(2 * number, 2 * number + 2),)


def test_sharding_errors():
  mesh = tj.make_mesh((2, 4), ("x", "y"))
  with pytest.raises(ValueError, match="divisible by 4"):
    tj.device_put(jnp.ones(6), NamedSharding(mesh, P("y")))
  with pytest.raises(ValueError, match="not found in mesh"):
    NamedSharding(mesh, P("z"))
  with pytest.raises(ValueError, match="more than once"):
    NamedSharding(mesh, P("x", "x"))
  with pytest.raises(ValueError, match="rank"):
    tj.device_put(jnp.ones(4), NamedSharding(mesh, P("x", "y")))
  with pytest.raises(TypeError, match="Sharding"):
    tj.device_put(jnp.ones(4), "cpu")


def test_device_put_tree_prefix_and_jit_shardings():
  mesh = mesh_1d(4)
  row, rep = NamedSharding(mesh, P("i")), NamedSharding(mesh, P())
  tree = {"a": np.ones((4, 2), np.float32), "b": [np.zeros(8, np.float32), np.ones(3, np.float32)]}
  placed = tj.device_put(tree, {"a": row, "b": rep})
  assert placed["a"].sharding == row and placed["b"][0].sharding == rep and placed["b"][1].sharding == rep
  f = tj.jit(lambda a, b: (a * 2, b + 1), in_shardings=(row, None), out_shardings=(row, rep))
  out = f(np.arange(8.0, dtype=np.float32), np.ones(2, np.float32))
  assert out[0].sharding == row and out[1].sharding == rep
  np.testing.assert_array_equal(np.asarray(out[0]), np.arange(8.0) * 2)
  # the computation on sharded arrays gives the values of the whole arrays
  x = tj.device_put(normal((8, 3)), row)
  np.testing.assert_allclose(np.asarray(tj.jit(lambda v: (v @ v.T).sum(0))(x)),
                             (np.asarray(x, np.float64) @ np.asarray(x, np.float64).T).sum(0), rtol=1e-5)


def test_visualize_array_sharding(capsys):
  mesh = tj.make_mesh((2, 2), ("x", "y"))
  tj.debug.visualize_array_sharding(tj.device_put(jnp.ones((4, 4)), NamedSharding(mesh, P("x"))))
  assert capsys.readouterr().out.splitlines() == [
    "┌─────────┐", "│ CPU 0,1 │", "├─────────┤", "│ CPU 2,3 │", "└─────────┘"]
  tj.debug.visualize_array_sharding(tj.device_put(jnp.ones((4, 4)), NamedSharding(mesh, P("x", "y"))))
  lines = capsys.readouterr().out.splitlines()
  assert lines[1] == "│  CPU 0  │  CPU 1  │" and lines[3] == "│  CPU 2  │  CPU 3  │"
  with pytest.raises(ValueError, match="1- and 2-dimensional"):
    tj.debug.visualize_array_sharding(jnp.ones((2, 2, 2)))


# ---- shard_map

def blocks(x: np.ndarray, n: int) -> list[np.ndarray]:
  return np.split(x, n)


def test_shard_map_elementwise_and_axis_index():
  mesh = mesh_1d(4)
  x = np.arange(8.0, dtype=np.float32)
  f = tj.shard_map(lambda v: v * lax.axis_index("i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
  y = f(x)
  np.testing.assert_array_equal(np.asarray(y), [0, 0, 2, 3, 8, 10, 18, 21])  # JAX 0.10.2
  assert y.sharding == NamedSharding(mesh, P("i"))
  assert [s.index for s in y.addressable_shards] == [(slice(2 * k, 2 * k + 2),) for k in range(4)]


def test_shard_map_psum_pmean_pmax_replicated_output():
  mesh = mesh_1d(4)
  x = normal((8, 3))
  total = tj.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(x)
  np.testing.assert_allclose(np.asarray(total), sum(blocks(x.astype(np.float64), 4)), rtol=1e-6)
  assert total.sharding.spec == P() and total.is_fully_replicated
  mean = tj.shard_map(lambda v: lax.pmean(v.sum(0), "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(x)
  np.testing.assert_allclose(np.asarray(mean), x.astype(np.float64).sum(0) / 4, rtol=1e-5)
  top = tj.shard_map(lambda v: lax.pmax(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(x)
  np.testing.assert_array_equal(np.asarray(top), np.max(np.stack(blocks(x, 4)), axis=0))


def test_shard_map_two_axes():
  mesh = tj.make_mesh((2, 2), ("x", "y"))
  a = np.arange(16.0, dtype=np.float32).reshape(4, 4)
  f = tj.shard_map(lambda b: b.sum(keepdims=True), mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))
  np.testing.assert_array_equal(np.asarray(f(a)), [[10, 18], [42, 50]])  # JAX 0.10.2
  g = tj.shard_map(lambda b: lax.psum(b, "y"), mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", None))
  np.testing.assert_array_equal(np.asarray(g(a)), a[:, :2] + a[:, 2:])
  h = tj.shard_map(lambda b: b * 10 + lax.axis_index("y"), mesh=mesh, in_specs=P(("x", "y")),
                   out_specs=P(("x", "y")))
  np.testing.assert_array_equal(np.asarray(h(np.arange(8.0, dtype=np.float32))), [0, 10, 21, 31, 40, 50, 61, 71])
  both = tj.shard_map(lambda b: lax.psum(b, ("x", "y")), mesh=mesh, in_specs=P("x", "y"), out_specs=P())
  np.testing.assert_array_equal(np.asarray(both(a)), a[:2, :2] + a[:2, 2:] + a[2:, :2] + a[2:, 2:])


def test_shard_map_replicated_input_and_pytrees():
  mesh = mesh_1d(2)
  w, xs = normal((3, 4), 1), normal((6, 3), 2)

  def local(params, batch):
    return {"out": batch["x"] @ params["w"], "n": lax.psum(jnp.ones(()), "i")}
  f = tj.shard_map(local, mesh=mesh, in_specs=({"w": P()}, {"x": P("i")}), out_specs={"out": P("i"), "n": P()})
  out = f({"w": w}, {"x": xs})
  np.testing.assert_allclose(np.asarray(out["out"]), xs.astype(np.float64) @ w, rtol=1e-5)
  assert float(out["n"]) == 2.0


def test_shard_map_check_vma():
  mesh = mesh_1d(4)
  x = np.arange(8.0, dtype=np.float32)
  with pytest.raises(ValueError, match="replicated across mesh axis 'i'"):
    tj.shard_map(lambda v: v, mesh=mesh, in_specs=P("i"), out_specs=P())(x)
  first = tj.shard_map(lambda v: v, mesh=mesh, in_specs=P("i"), out_specs=P(), check_vma=False)(x)
  np.testing.assert_array_equal(np.asarray(first), x[:2])  # the first shard's value
  from tinyjax.experimental.shard_map import shard_map as old_shard_map
  np.testing.assert_array_equal(np.asarray(old_shard_map(lambda v: v, mesh=mesh, in_specs=P("i"), out_specs=P(),
                                                         check_rep=False)(x)), x[:2])


def test_shard_map_errors():
  mesh = mesh_1d(4)
  with pytest.raises(ValueError, match="does not divide"):
    tj.shard_map(lambda v: v, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(np.ones(6, np.float32))
  with pytest.raises(ValueError, match="not found in mesh"):
    tj.shard_map(lambda v: v, mesh=mesh, in_specs=P("j"), out_specs=P("i"))(np.ones(8, np.float32))
  with pytest.raises(ValueError, match="tree prefix"):
    tj.shard_map(lambda a, b: a, mesh=mesh, in_specs=(P("i"),), out_specs=P("i"))(np.ones(8), np.ones(8))
  with pytest.raises(ValueError, match="rank"):
    tj.shard_map(lambda v: v.sum(), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(np.ones(8, np.float32))
  with pytest.raises(NameError, match="unbound axis name: j"):
    tj.shard_map(lambda v: lax.psum(v, "j"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(np.ones(8, np.float32))
  with pytest.raises(ValueError, match="needs a mesh"):
    tj.shard_map(lambda v: v, in_specs=P("i"), out_specs=P("i"))(np.ones(8, np.float32))
  with mesh:  # the mesh of an enclosing `with mesh:`
    out = tj.shard_map(lambda v: v + 1, in_specs=P("i"), out_specs=P("i"))(np.ones(8, np.float32))
  np.testing.assert_array_equal(np.asarray(out), np.full(8, 2.0))


def test_shard_map_in_specs_from_argument_shardings():
  mesh = mesh_1d(4)
  x = tj.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("i")))
  out = tj.shard_map(lambda v: v.sum(keepdims=True), mesh=mesh, out_specs=P("i"))(x)
  np.testing.assert_array_equal(np.asarray(out), [1, 5, 9, 13])


def test_shard_map_traced_once_and_one_program():
  mesh = mesh_1d(4)
  calls = []

  def local(v):
    calls.append(v.shape)
    return jnp.tanh(v) * 2
  f = tj.shard_map(local, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
  x = normal((16, 5))
  y = f(x)
  assert calls == [(4, 5)]  # the per-shard function sees one block, once for all shards (eagerly, once per call)
  np.testing.assert_allclose(np.asarray(y), np.tanh(x.astype(np.float64)) * 2, rtol=1e-5, atol=1e-6)
  jitted = tj.jit(f)
  for _ in range(3): out = jitted(x)
  assert calls == [(4, 5)] * 2  # under jit, traced once for every call
  assert len(jitted.lower(x)._compiled.schedule.schedule.kernels) == 1  # every shard in one fused kernel
  np.testing.assert_allclose(np.asarray(out), np.asarray(y), rtol=1e-6)


def test_shard_map_composes_with_grad_jit_vmap():
  mesh = mesh_1d(4)
  x = normal((8,), 3)
  total = tj.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
  # grad outside shard_map: psum's batch rule is a sum, transposed into a broadcast (JAX 0.10.2: all ones)
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda v: total(v).sum())(x)), np.ones(8))
  np.testing.assert_array_equal(np.asarray(tj.jit(tj.grad(lambda v: total(v).sum()))(x)), np.ones(8))
  square = tj.shard_map(lambda v: lax.psum((v * v).sum(), "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
  g = tj.grad(square)(x)
  np.testing.assert_allclose(np.asarray(g), 2 * x, rtol=1e-6)
  eps = 1e-3
  fd = [(float(square(x + eps * e)) - float(square(x - eps * e))) / (2 * eps) for e in np.eye(8, dtype=np.float32)]
  np.testing.assert_allclose(np.asarray(g), fd, rtol=2e-2)
  # vmap over shard_map and shard_map over vmap
  xs = normal((3, 8), 4)
  batched = tj.vmap(total)(xs)
  np.testing.assert_allclose(np.asarray(batched), xs.reshape(3, 4, 2).sum(1), rtol=1e-6)
  inner = tj.shard_map(tj.vmap(lambda v: lax.psum(v, "i")), mesh=mesh, in_specs=P(None, "i"), out_specs=P())
  np.testing.assert_allclose(np.asarray(inner(xs)), xs.reshape(3, 4, 2).sum(1), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(tj.jit(total)))(xs)), xs.reshape(3, 4, 2).sum(1), rtol=1e-6)


def test_data_parallel_step_equals_one_device():
  """Data parallelism as JAX's check_vma types it: the gradient of the pmean'ed loss with respect to replicated
  parameters is the whole batch's gradient; without check_vma, per-shard gradients are pmean'ed. The gradient of a
  per-shard loss with respect to replicated parameters is summed over the shards under check_vma (JAX 0.10.2: 4x the
  whole batch's gradient on 4 shards, 1x without check_vma)."""
  mesh = mesh_1d(4, "data")
  rng = np.random.default_rng(7)
  params = {"w": rng.standard_normal((5, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
  x, y = rng.standard_normal((16, 5)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32)

  def loss(p, xb, yb):
    return ((jnp.tanh(xb @ p["w"] + p["b"]) - yb) ** 2).mean()

  def run(local, check_vma=True):
    return tj.jit(tj.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P(),
                               check_vma=check_vma))(params, x, y)
  whole = tj.grad(loss)(params, x, y)
  cases = [(run(lambda p, xb, yb: tj.grad(lambda q: lax.pmean(loss(q, xb, yb), "data"))(p)), 1),
           (run(lambda p, xb, yb: lax.pmean(tj.grad(loss)(p, xb, yb), "data"), check_vma=False), 1),
           (run(lambda p, xb, yb: lax.pmean(tj.grad(loss)(p, xb, yb), "data")), 4)]
  for got, factor in cases:
    for name in params:
      np.testing.assert_allclose(np.asarray(got[name]), factor * np.asarray(whole[name]), rtol=1e-5, atol=1e-7)


def test_grad_of_replicated_input_mixing_invariant_and_varying_uses():
  """An invariant input used both with varying values (its cotangent summed over the shards, as the pvary JAX inserts
  there transposes) and alone (its cotangent as it is): JAX 0.10.2 gives psum(x) + 2p = [14, 20]."""
  mesh = mesh_1d(4)
  p = np.array([1.0, 2.0], np.float32)
  xs = np.arange(8.0, dtype=np.float32).reshape(4, 2)

  def body(p, x):
    return tj.grad(lambda q: lax.psum((q * x).sum(), "i") + (q * q).sum())(p)
  out = tj.shard_map(body, mesh=mesh, in_specs=(P(), P("i")), out_specs=P())(p, xs)
  np.testing.assert_array_equal(np.asarray(out), [14.0, 20.0])


def test_typeof_varying_axes_and_pcast():
  """typeof shows the mesh axes a value varies over (JAX's vma); pcast(to='varying') makes a replicated value vary."""
  mesh = tj.make_mesh((4, 2), ("i", "j"))
  seen = []

  def body(x, y):
    seen.append((tj.typeof(x).vma, tj.typeof(lax.psum(x, "j")).vma, tj.typeof(y).vma,
                 tj.typeof(lax.pcast(y, "i", to="varying")).vma, str(tj.typeof(x))))
    return lax.psum(x, "j") * lax.pcast(y, "i", to="varying")
  out = tj.shard_map(body, mesh=mesh, in_specs=(P("i", "j"), P()), out_specs=P("i"))(
    np.arange(32.0, dtype=np.float32).reshape(8, 4), np.float32(2))
  assert seen == [({"i", "j"}, {"i"}, frozenset(), {"i"}, "float32[2,2]{V:(i,j)}")]
  x = np.arange(32.0).reshape(8, 4)
  np.testing.assert_array_equal(np.asarray(out), 2 * (x[:, :2] + x[:, 2:]))
  with pytest.raises(ValueError, match="to='varying'"):
    tj.shard_map(lambda v: lax.pcast(v, "i", to="invariant"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))(
      np.ones(8, np.float32))


def test_data_parallel_weight_gradient_is_one_contraction():
  """The sum over shards of a replicated weight's gradient is part of its contraction: no per-example outer product
  is materialised (4 shards x 16 rows x 128 x 256 floats would be 8 MB of temporaries), nor per-shard gradients."""
  mesh = mesh_1d(4, "data")
  w, x = normal((128, 256), 1), normal((64, 128), 2)

  def local(w, xb):
    return tj.grad(lambda v: lax.pmean(jnp.tanh(xb @ v).sum(), "data"))(w)
  f = tj.jit(tj.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))
  stats = f.lower(w, x).compile().memory_analysis()
  # no per-example product, and no per-shard partial gradients either (4 x 128 x 256 floats: 512 KB): the sum over
  # the shards of the per-shard contractions is one contraction (lower/schedule.py `merge_sums`)
  assert stats.temp_size_in_bytes < 1 << 18, stats
  expected = x.astype(np.float64).T @ (1 - np.tanh(x.astype(np.float64) @ w) ** 2) / 4
  np.testing.assert_allclose(np.asarray(f(w, x)), expected, rtol=2e-4, atol=1e-5)


def test_sum_over_shards_of_per_shard_sums():
  """A replicated layer's gradients over 2 shards: per-shard sums over the batch, then their sum over the shards (the
  reduction over 2 shards was split into 2 one-element partials, whose float64 partial had no loop and kept the
  float32 sum's type: invalid LLVM IR)."""
  tj.config.update("jax_num_cpu_devices", 2)
  mesh = mesh_1d(2, "data")
  w, b, x = normal((256, 512), 1) * 0.1, normal((512,), 2), normal((512, 256), 3)

  def loss(p, xb):
    return jnp.maximum(xb @ p[0] + p[1], 0).sum(-1).mean()

  def local(p, xb):
    return tj.grad(lambda q: lax.pmean(loss(q, xb), "data"))(p)
  out = tj.jit(tj.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))((w, b), x)
  whole = tj.grad(loss)((w, b), x)
  for got, want in zip(out, whole):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_jit_infers_in_specs_from_sharded_arguments_and_keys_on_them():
  """Inside jit (and grad of it) a shard_map without in_specs reads the sharded arguments' specs; the program is
  traced again for another sharding of the same shapes."""
  mesh = mesh_1d(4, "batch")
  loss = tj.shard_map(lambda w, x: lax.pmean(((x @ w) ** 2).mean(), "batch"), mesh=mesh, out_specs=P())
  w, x = normal((3, 2), 1), normal((8, 3), 2)
  w_rep = tj.device_put(w, NamedSharding(mesh, P()))
  x_rows = tj.device_put(x, NamedSharding(mesh, P("batch")))
  expected = ((x.astype(np.float64) @ w) ** 2).mean()
  np.testing.assert_allclose(float(tj.jit(loss)(w_rep, x_rows)), expected, rtol=1e-5)
  grad = tj.jit(tj.grad(loss))(w_rep, x_rows)
  np.testing.assert_allclose(np.asarray(grad), 2 * x.T.astype(np.float64) @ (x @ w) / 16, rtol=1e-4, atol=1e-6)
  # the same shapes replicated: another program, in which every shard holds the whole batch
  x_rep = tj.device_put(x, NamedSharding(mesh, P()))
  np.testing.assert_allclose(float(tj.jit(loss)(w_rep, x_rep)), expected, rtol=1e-5)
  with pytest.raises(ValueError, match="cannot be inferred"):
    tj.jit(loss)(w, x)


def test_remat_with_collectives_inside_shard_map():
  """FSDP as JAX's shard_map tutorial writes it: parameters sharded, all_gather'ed inside a remat'ed function."""
  mesh = mesh_1d(4, "batch")
  w, x = normal((8, 6), 1), normal((16, 8), 2)

  @tj.checkpoint
  def predict(w_frag, inputs):
    return jnp.tanh(inputs @ lax.all_gather(w_frag, "batch", tiled=True))

  def local(w_frag, xb):
    return lax.pmean((predict(w_frag, xb) ** 2).mean(), "batch")
  loss = tj.shard_map(local, mesh=mesh, in_specs=(P("batch"), P("batch")), out_specs=P())
  whole = lambda w, x: (jnp.tanh(x @ w) ** 2).mean()  # noqa: E731
  np.testing.assert_allclose(float(tj.jit(loss)(w, x)), float(whole(w, x)), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(loss))(w, x)), np.asarray(tj.grad(whole)(w, x)),
                             rtol=1e-4, atol=1e-6)


def test_collectives_inside_loops_under_shard_map():
  """scan / fori_loop bodies with collectives over the mesh axis (values from JAX 0.10.2)."""
  mesh = mesh_1d(4)
  ring = [(k, (k + 1) % 4) for k in range(4)]

  def body(x):
    return lax.scan(lambda c, _: (lax.ppermute(c, "i", ring) + lax.psum(c, "i"), None), x, None, length=3)[0]
  f = tj.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
  x = np.arange(8.0, dtype=np.float32)
  expected = [374, 499, 376, 501, 378, 503, 372, 497]
  np.testing.assert_array_equal(np.asarray(f(x)), expected)
  np.testing.assert_array_equal(np.asarray(tj.jit(f)(x)), expected)
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda v: f(v).sum())(x)), np.full(8, 125.0))
  g = tj.shard_map(lambda v: lax.fori_loop(0, 3, lambda i, c: lax.pmax(c, "i") + c, v), mesh=mesh, in_specs=P("i"),
                   out_specs=P("i"))
  np.testing.assert_array_equal(np.asarray(g(x)), [42, 50, 44, 52, 46, 54, 48, 56])
  # the same under a plain named vmap: a loop's collective over the vmap's axis
  sums = tj.vmap(lambda v: lax.fori_loop(0, 2, lambda i, c: lax.psum(c, "k") * 0.5, v), axis_name="k")(x)
  np.testing.assert_allclose(np.asarray(sums), np.full(8, x.sum() * 0.5 * 8 * 0.5), rtol=1e-6)


def _blocks_reference(x: np.ndarray, mesh_shape: dict, spec: P, summed: tuple[str, ...], out_spec: P):
  """shard_map(lambda b: psum(b * (1 + axis_index over every mesh axis), summed), in_specs=spec, out_specs=out_spec)
  computed block by block with numpy: the reference semantics of JAX's shard_map tutorial."""
  names = list(mesh_shape)
  sizes = [mesh_shape[n] for n in names]

  def block_index(spec_, coords, shape):
    index = []
    for dim, size in enumerate(shape):
      axes = spec_.axes_of(dim)
      number, count = 0, 1
      for name in axes:
        number = number * mesh_shape[name] + coords[names.index(name)]
        count *= mesh_shape[name]
      block = size // count
      index.append(slice(number * block, (number + 1) * block))
    return tuple(index)

  def local(coords):
    scale = 1 + sum(c * 10 ** k for k, c in enumerate(coords))
    return x[block_index(spec, coords, x.shape)].astype(np.float64) * scale

  all_coords = list(np.ndindex(*sizes))
  results = {}
  for coords in all_coords:
    total = 0
    for other in all_coords:  # psum over `summed`: the positions that differ only along those axes
      if all(o == c or names[k] in summed for k, (o, c) in enumerate(zip(other, coords))): total = total + local(other)
    results[coords] = total
  block_shape = results[all_coords[0]].shape
  out_shape = [size * int(np.prod([mesh_shape[n] for n in out_spec.axes_of(dim)] or [1]))
               for dim, size in enumerate(block_shape)]
  out = np.zeros(out_shape)
  for coords, value in results.items():
    out[block_index(out_spec, coords, out_shape)] = value
  return out


@pytest.mark.parametrize("seed", range(24))
def test_shard_map_random_specs_against_blocks(seed):
  rng = np.random.default_rng(seed)
  mesh_shape = {"a": int(rng.choice([1, 2, 4])), "b": int(rng.choice([1, 2]))}
  mesh = tj.make_mesh(tuple(mesh_shape.values()), tuple(mesh_shape))
  rank = int(rng.integers(1, 4))
  names = list(mesh_shape)
  rng.shuffle(names)
  entries = [None] * rank
  for name in names:  # each mesh axis splits one random dimension, or none
    dim = int(rng.integers(-1, rank))
    if dim < 0: continue
    entries[dim] = name if entries[dim] is None else ((entries[dim],) if isinstance(entries[dim], str)
                                                      else entries[dim]) + (name,)
  spec = P(*entries)
  shape = [int(rng.integers(1, 3)) * int(np.prod([mesh_shape[n] for n in spec.axes_of(d)] or [1]))
           for d in range(rank)]
  x = rng.standard_normal(shape).astype(np.float32)
  summed = tuple(n for n in mesh_shape if rng.random() < 0.5)
  varying = [n for n in mesh_shape if n not in summed]
  out_entries = [None] * rank  # the axes still varying go somewhere in the output spec
  for name in varying:
    dim = int(rng.integers(0, rank))
    out_entries[dim] = name if out_entries[dim] is None else ((out_entries[dim],) if isinstance(out_entries[dim], str)
                                                              else out_entries[dim]) + (name,)
  out_spec = P(*out_entries)

  def body(block):
    scale = 1 + lax.axis_index("a") + 10 * lax.axis_index("b")
    value = block * scale.astype(jnp.float32)
    return lax.psum(value, summed) if summed else value
  f = tj.shard_map(body, mesh=mesh, in_specs=spec, out_specs=out_spec)
  expected = _blocks_reference(x, mesh_shape, spec, summed, out_spec)
  np.testing.assert_allclose(np.asarray(f(x)), expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.jit(f)(x)), expected, rtol=1e-5, atol=1e-5)


def test_make_array_from_callback_single_device_arrays_and_local_data():
  """JAX's constructors of global arrays, in one process (tests/test_distributed.py runs them over processes)."""
  from tinyjax.experimental import multihost_utils
  mesh = tj.make_mesh((4, 2), ("x", "y"))
  sharding = NamedSharding(mesh, P("x", "y"))
  full = np.arange(32.0, dtype=np.float32).reshape(8, 4)
  made = tj.make_array_from_callback((8, 4), sharding, lambda index: full[index])
  assert made.sharding == sharding
  np.testing.assert_array_equal(np.asarray(made), full)
  shards = [tj.device_put(full[index], device) for device, index in sharding.devices_indices_map((8, 4)).items()]
  np.testing.assert_array_equal(np.asarray(tj.make_array_from_single_device_arrays((8, 4), sharding, shards)), full)
  local = tj.make_array_from_process_local_data(NamedSharding(mesh, P("x")), full)
  np.testing.assert_array_equal(np.asarray(local), full)
  assert local.sharding.spec == P("x")
  np.testing.assert_array_equal(multihost_utils.process_allgather(np.float32(3)), [3.0])
  assert int(multihost_utils.broadcast_one_to_all(np.int32(7))) == 7
  with pytest.raises(ValueError, match="cover only"):
    tj.make_array_from_single_device_arrays((8, 4), sharding, shards[:3])
  with pytest.raises(ValueError, match="does not fit"):
    tj.make_array_from_callback((8, 4), sharding, lambda index: np.zeros((3, 3), np.float32))


def test_with_sharding_constraint_and_reshard():
  mesh = mesh_1d(4)
  x = np.arange(8.0, dtype=np.float32)
  placed = lax.with_sharding_constraint(jnp.asarray(x), NamedSharding(mesh, P("i")))
  assert placed.sharding == NamedSharding(mesh, P("i"))
  with tj.set_mesh(mesh):
    assert tj.reshard(jnp.asarray(x), P("i")).sharding.spec == P("i")
  # inside jit the value itself: the program computes on whole arrays
  out = tj.jit(lambda v: lax.with_sharding_constraint(v * 2, NamedSharding(mesh, P("i"))) + 1)(x)
  np.testing.assert_array_equal(np.asarray(out), x * 2 + 1)
  np.testing.assert_array_equal(np.asarray(tj.grad(lambda v: lax.with_sharding_constraint(v * v, NamedSharding(
    mesh, P())).sum())(x)), 2 * x)


def test_out_sharding_trace_and_manual_axis_type():
  """Spellings of newer JAX code (its shard_map docs): `out_sharding=` of the products, `jit(f).trace(...).jaxpr`,
  `typeof(x).manual_axis_type.varying`."""
  mesh = tj.make_mesh((4, 2), ("x", "y"))
  a, b = normal((8, 16), 1), normal((16, 4), 2)
  with tj.set_mesh(mesh):
    c = jnp.dot(a, b, out_sharding=P("x", None))
    assert c.sharding == NamedSharding(mesh, P("x", None))
    np.testing.assert_allclose(np.asarray(c), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jnp.matmul(a, b, out_sharding=P())), a.astype(np.float64) @ b, rtol=1e-5,
                               atol=1e-5)
    e = jnp.einsum("ij,jk->ik", a, b, out_sharding=P("x"))
    assert e.sharding.spec == P("x")
    seen = []

    @tj.shard_map(in_specs=P("x", "y"), out_specs=P("x"))
    def f(block):
      seen.append(tj.typeof(lax.psum(block, "y")).manual_axis_type.varying)
      return lax.psum(block, "y")
    traced = tj.jit(f).trace(a)
    assert "reduce" in str(traced.jaxpr) and seen == [{"x"}]
    np.testing.assert_allclose(np.asarray(tj.jit(f)(a)), a[:, :8] + a[:, 8:], rtol=1e-6)
    assert traced.lower().as_text()


@pytest.mark.parametrize("wrap", [lambda f: f, tj.jit], ids=["eager", "jit"])
def test_shard_map_follows_the_current_mesh(wrap):
  """A shard_map without mesh= uses the mesh current at each call; jit keys its programs on that mesh."""
  f = wrap(tj.shard_map(lambda v: lax.psum(v, "i"), in_specs=P("i"), out_specs=P()))
  x = np.arange(8.0, dtype=np.float32)
  with tj.set_mesh(mesh_1d(4)):
    np.testing.assert_array_equal(np.asarray(f(x)), x.reshape(4, 2).sum(0))
  with tj.set_mesh(mesh_1d(2)):
    np.testing.assert_array_equal(np.asarray(f(x)), x.reshape(2, 4).sum(0))


# ---- JAX's type errors for loops and branches whose values vary over different mesh axes (check_vma)

def _vma_mesh():
  return tj.make_mesh((2,), ("i",))


def test_scan_carry_that_becomes_varying_is_a_type_error():
  mesh = _vma_mesh()
  x, y = np.arange(6.0, dtype=np.float32), np.arange(3.0, dtype=np.float32)

  def swap(x, y):
    def body(carry, _):
      c1, c2 = carry
      return (c2, c1), ()
    return lax.scan(body, (x, y), (), length=2)[0]
  with pytest.raises(TypeError) as error:
    tj.shard_map(swap, mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))(x, y)
  assert str(error.value) == (  # (JAX 0.10.2's message)
    "scan body function carry input and carry output must have equal types, but they differ:\n\n"
    "  * the input carry component carry[0] has type float32[3]{V:i} but the corresponding output carry component "
    "has type float32[3], so the manual axis types do not match;\n"
    "  * the input carry component carry[1] has type float32[3] but the corresponding output carry component has "
    "type float32[3]{V:i}, so the manual axis types do not match.\n\n"
    "This might be fixed by applying `jax.lax.pcast(..., ('i',), to='varying')`, to the initial carry value "
    "corresponding to the input carry component carry[1].\n"
    "See https://docs.jax.dev/en/latest/notebooks/shard_map.html#scan-vma for more information.\n\n"
    "Revise the function so that all output types match the corresponding input types.")
  # fori_loop names its carry as JAX does; while_loop by the body's parameter
  with pytest.raises(TypeError, match=r"input carry component loop_carry\[1\] has type float32\[3\] but"):
    tj.shard_map(lambda x, y: lax.fori_loop(0, 2, lambda i, c: c + x, y), mesh=mesh, in_specs=(P("i"), P()),
                 out_specs=P("i"))(x, y)
  with pytest.raises(TypeError, match=r"^while_loop body function (.|\n)*input carry component c\[1\]"):
    tj.shard_map(lambda x, y: lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + x), (0, y))[1],
                 mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"))(x, y)
  # made varying first (JAX's fix), the same loop runs: each shard adds its own block twice
  fixed = tj.shard_map(lambda x, y: lax.fori_loop(0, 2, lambda i, c: c + x, lax.pvary(y, "i")), mesh=mesh,
                       in_specs=(P("i"), P()), out_specs=P("i"))(x, y)
  np.testing.assert_array_equal(np.asarray(fixed), np.concatenate([y + 2 * x[:3], y + 2 * x[3:]]))
  # under vmap (no mesh) a carry that becomes batched is no error
  out = tj.vmap(lambda v: lax.fori_loop(0, 2, lambda i, c: c + v, jnp.zeros(3)))(x.reshape(2, 3))
  np.testing.assert_array_equal(np.asarray(out), 2 * x.reshape(2, 3))


def test_cond_branches_that_vary_differently_are_a_type_error():
  mesh = _vma_mesh()
  x, y = np.arange(6.0, dtype=np.float32), np.arange(3.0, dtype=np.float32)
  with pytest.raises(TypeError, match=r"cond branches must have equal output types but they differ\.(.|\n)*The output "
                                      r"of true_fun has type float32\[3\]\{V:i\} but the corresponding output of "
                                      r"false_fun has type float32\[3\]"):
    tj.shard_map(lambda x, y: lax.cond(True, lambda: x, lambda: y), mesh=mesh, in_specs=(P("i"), P()),
                 out_specs=P("i"))(x, y)
  out = tj.shard_map(lambda x, y: lax.cond(True, lambda: x, lambda: lax.pvary(y, "i")), mesh=mesh,
                     in_specs=(P("i"), P()), out_specs=P("i"))(x, y)
  np.testing.assert_array_equal(np.asarray(out), x)


# ---- committed arrays (JAX's placement rules)

def test_committed_arrays_pull_computations_and_clash_as_in_jax():
  devices = tj.devices()
  assert not jnp.arange(4.0).committed  # made from host data: uncommitted, as JAX's
  assert not tj.device_put(np.ones(3)).committed  # device_put without a device: uncommitted too
  on_one = tj.device_put(np.ones(3, np.float32), devices[1])
  assert on_one.committed and on_one.devices() == {devices[1]}
  # an uncommitted operand follows a committed one; the result is committed there
  out = on_one + jnp.arange(3.0)
  assert out.committed and out.devices() == {devices[1]}
  np.testing.assert_array_equal(np.asarray(out), [1.0, 2.0, 3.0])
  jitted = tj.jit(lambda a, b: a * b)(on_one, jnp.arange(3.0))
  assert jitted.committed and jitted.devices() == {devices[1]}
  # two arrays committed to different devices (even the default one): JAX's ValueError, eagerly and under jit
  on_zero = tj.device_put(np.ones(3, np.float32), devices[0])
  with pytest.raises(ValueError, match="Received incompatible devices"):
    np.asarray(on_zero + on_one)
  with pytest.raises(ValueError, match="Received incompatible devices"):
    tj.jit(lambda a, b: a + b)(on_zero, on_one)
  # meshes: arrays committed to different meshes clash; a program over a mesh's arrays gives results on the mesh
  mesh_a, mesh_b = Mesh(np.array(devices[:4]), ("x",)), Mesh(np.array(devices[4:]), ("x",))
  xa = tj.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh_a, P("x")))
  xb = tj.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh_b, P("x")))
  with pytest.raises(ValueError, match="Received incompatible devices"):
    np.asarray(xa + xb)
  total = tj.jit(lambda v: v.sum())(xa)  # not split by the operations: replicated over the mesh, committed
  assert total.committed and total.sharding == NamedSharding(mesh_a, P()) and float(total) == 28.0


def test_partition_specs_that_differ_by_trailing_nones_are_one_sharding():
  mesh = mesh_1d(4)
  assert NamedSharding(mesh, P()) == NamedSharding(mesh, P(None)) == NamedSharding(mesh, P(None, None))
  assert hash(NamedSharding(mesh, P("i"))) == hash(NamedSharding(mesh, P("i", None)))
  # so a jitted step fed its own replicated outputs runs its compiled program again, not a new one
  step = tj.jit(lambda w: w * 0.5 + 1.0)
  w = tj.device_put(np.ones(4, np.float32), NamedSharding(mesh, P()))
  for _ in range(4): w = step(w)
  assert len(step._cache) == 1 and step._fast_calls >= 2
  np.testing.assert_allclose(np.asarray(w), 1.9375)


def test_device_put_inside_jit_labels_or_refuses_another_mesh():
  devices = tj.devices()
  mesh_a, mesh_b = Mesh(np.array(devices[:4]), ("x",)), Mesh(np.array(devices[4:]), ("x",))
  xa = tj.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh_a, P("x")))
  with pytest.raises(ValueError, match="device_put inside jit"):  # JAX's: a traced program can't move between meshes
    tj.jit(lambda v: tj.device_put(v, NamedSharding(mesh_b, P("x"))))(xa)
  same = tj.jit(lambda v: tj.device_put(v * 2, NamedSharding(mesh_a, P())))(xa)  # the same devices: a new layout
  assert same.sharding == NamedSharding(mesh_a, P())
  np.testing.assert_array_equal(np.asarray(same), np.arange(8.0) * 2)
