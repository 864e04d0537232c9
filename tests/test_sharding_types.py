"""Shardings carried through operations (trace/sharding_types.py), as JAX 0.10's sharding propagation: the types
`typeof` prints and the shardings of results, eagerly, under jit, grad, vmap and shard_map, JAX's ShardingTypeErrors
on Explicit meshes, and values that stay numpy's. The expected types are what JAX 0.10.2 prints for the same
programs on 8 CPU devices."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax import lax
from tinyjax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tinyjax.trace.sharding_types import ShardingTypeError


@pytest.fixture(autouse=True)
def mesh(on_cpu):  # (a mesh of CPU devices, the default platform: a GPU mesh is not built yet)
  tj.config.update("jax_num_cpu_devices", 8)
  mesh = tj.make_mesh((4, 2), ("X", "Y"))
  with tj.set_mesh(mesh): yield mesh
  tj.config.update("jax_num_cpu_devices", -1)


def host(shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def placed(value, *spec):
  return tj.device_put(value, P(*spec))


def test_make_mesh_axes_are_explicit_and_types_show_the_layout(mesh):
  assert mesh.axis_types == ("Explicit", "Explicit")
  assert repr(mesh) == "Mesh('X': 4, 'Y': 2, axis_types=(Explicit, Explicit))"
  x = placed(np.arange(32.0, dtype=np.float32).reshape(8, 4), "X", "Y")
  assert str(tj.typeof(x)) == "float32[8@X,4@Y]" and repr(tj.typeof(x)) == "ShapedArray(float32[8@X,4@Y])"
  assert repr(tj.typeof(x).sharding) == (  # (JAX 0.10.2's)
    "NamedSharding(mesh=AbstractMesh('X': 4, 'Y': 2, axis_types=(Explicit, Explicit), device_kind=cpu, "
    "num_cores=None, platform=cpu), spec=P('X', 'Y'))")
  assert x.sharding == NamedSharding(mesh, P("X", "Y"))
  assert str(tj.typeof(jnp.ones((8, 4)))) == "float32[8,4]"  # created from nothing: not split


# (expression, JAX 0.10.2's type of the result) for x: float32[8@X,4@Y], x2: float32[8@X,4]
EAGER = [
  (lambda x, x2: jnp.sin(x).T, "float32[4@Y,8@X]"),
  (lambda x, x2: x.sum(0), "float32[4@Y]"),
  (lambda x, x2: x.sum(1), "float32[8@X]"),
  (lambda x, x2: x.sum(), "float32[]"),
  (lambda x, x2: x.mean(0), "float32[4@Y]"),
  (lambda x, x2: x.max(1), "float32[8@X]"),
  (lambda x, x2: x.argmax(1), "int32[8@X]"),
  (lambda x, x2: x.reshape(8, 2, 2), "float32[8@X,2@Y,2]"),
  (lambda x, x2: x.reshape(4, 2, 4), "float32[4@X,2,4@Y]"),
  (lambda x, x2: x.reshape(8, 4, 1), "float32[8@X,4@Y,1]"),
  (lambda x, x2: x.reshape(1, 8, 4), "float32[1,8@X,4@Y]"),
  (lambda x, x2: x.reshape(32), "float32[32@(X,Y)]"),
  (lambda x, x2: x2.reshape(32), "float32[32@X]"),
  (lambda x, x2: x2.reshape(8, 2, 2), "float32[8@X,2,2]"),
  (lambda x, x2: x2[:, 1:3], "float32[8@X,2]"),
  (lambda x, x2: jnp.concatenate([x, x], 1), "float32[8@X,8@Y]"),
  (lambda x, x2: jnp.concatenate([x, x], 0), "float32[16@X,4@Y]"),
  (lambda x, x2: x + jnp.ones(4), "float32[8@X,4@Y]"),
  (lambda x, x2: x2[:, :, None] * jnp.ones((1, 1, 3)), "float32[8@X,4,3]"),
  (lambda x, x2: jnp.where(x > 1, x, 0.0), "float32[8@X,4@Y]"),
  (lambda x, x2: x.astype(jnp.int32), "int32[8@X,4@Y]"),
  (lambda x, x2: x[::-1], "float32[8@X,4@Y]"),
  (lambda x, x2: jnp.expand_dims(x, 0), "float32[1,8@X,4@Y]"),
  (lambda x, x2: jnp.broadcast_to(x2[:, None, :], (8, 3, 4)), "float32[8@X,3,4]"),
  (lambda x, x2: tj.nn.softmax(x, axis=-1), "float32[8@X,4@Y]"),
  (lambda x, x2: 2.0 * x - 1, "float32[8@X,4@Y]"),
  (lambda x, x2: x2 @ placed(np.ones((4, 16), np.float32), None, "Y"), "float32[8@X,16@Y]"),
  (lambda x, x2: x @ placed(np.ones((4, 16), np.float32), None, "Y"), "float32[8@X,16@Y]"),
  (lambda x, x2: x2 @ jnp.ones((4, 16)), "float32[8@X,16]"),
]


@pytest.mark.parametrize("index", range(len(EAGER)))
def test_results_carry_jax_shardings_eagerly_and_under_jit(index):
  fn, expected = EAGER[index]
  a, b = host((8, 4)), host((8, 4), 1)
  x, x2 = placed(a, "X", "Y"), placed(b, "X", None)
  eager = fn(x, x2)
  assert str(tj.typeof(eager)) == expected
  jitted = tj.jit(fn)(x, x2)
  assert str(tj.typeof(jitted)) == expected and jitted.sharding == eager.sharding
  seen = []
  tj.jit(lambda x, x2: seen.append(str(tj.typeof(fn(x, x2)))))(x, x2)
  assert seen == [expected]  # (the type under the trace)
  reference = np.asarray(fn(jnp.asarray(a), jnp.asarray(b)))  # the same program on unplaced arrays
  np.testing.assert_allclose(np.asarray(eager), reference, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jitted), reference, rtol=1e-6, atol=1e-6)


def test_broadcast_operands_combine_their_splits():
  x = placed(np.arange(4, dtype=np.int32).reshape(4, 1), "X", None)
  y = placed(np.arange(8, dtype=np.int32).reshape(1, 8), None, "Y")
  z = x + y
  assert (str(tj.typeof(x)), str(tj.typeof(y)), str(tj.typeof(z))) == ("int32[4@X,1]", "int32[1,8@Y]", "int32[4@X,8@Y]")
  np.testing.assert_array_equal(np.asarray(z), np.arange(4)[:, None] + np.arange(8)[None, :])
  # each device's shard is its block of the result
  for shard in z.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(z)[shard.index])
  assert len(z.addressable_shards) == 8 and not z.is_fully_replicated


def test_jax_sharding_type_errors_on_explicit_meshes():
  a = placed(np.arange(16, dtype=np.int32).reshape(4, 4), "X", None)
  b = placed(np.arange(16, dtype=np.int32).reshape(4, 4), None, "X")
  with pytest.raises(ShardingTypeError) as error:
    a + b
  assert str(error.value) == ("add operation with inputs: i32[4@X,4], i32[4,4@X] produces an illegally sharded "
                              "result: i32[4@X,4@X]")  # (JAX 0.10.2's message)
  with pytest.raises(ShardingTypeError) as error:
    a * placed(np.ones((4, 4), np.int32), "Y", None)
  assert str(error.value) == "mul got incompatible shardings for broadcasting: ('X', None), ('Y', None)."
  with pytest.raises(ShardingTypeError, match="This reshape is not supported"):
    placed(host((8, 4)), "X", None).reshape(4, 8)
  x = placed(host((8, 4)), None, "X")
  y = placed(host((4, 16)), "X", None)
  with pytest.raises(ShardingTypeError, match="Contracting dimensions are sharded"):
    jnp.dot(x, y)
  with pytest.raises(ShardingTypeError, match="Contracting dimensions are sharded"):
    tj.jit(lambda x, y: x @ y)(x, y)
  # with the result's sharding given, it is computed
  z = jnp.dot(x, y, out_sharding=P("X", None))
  assert str(tj.typeof(z)) == "float32[8@X,16]"
  np.testing.assert_allclose(np.asarray(z), host((8, 4)).astype(np.float64) @ host((4, 16)), rtol=1e-5, atol=1e-5)
  z = tj.jit(lambda x, y: jnp.matmul(x, y, out_sharding=P(None, "X")))(x, y)
  assert str(tj.typeof(z)) == "float32[8,16@X]"


def test_auto_meshes_propagate_without_showing_or_raising():
  auto = Mesh(np.array(tj.devices()).reshape(4, 2), ("a", "b"))  # the constructor's axes are Auto
  z = tj.device_put(host((8, 4)), NamedSharding(auto, P("a", "b")))
  assert str(tj.typeof(z)) == "float32[8,4]"
  assert jnp.sin(z).sharding == NamedSharding(auto, P("a", "b"))
  assert tj.jit(jnp.sin)(z).sharding == NamedSharding(auto, P("a", "b"))
  assert tj.jit(lambda v: v.sum(0))(z).sharding.spec == P("b")
  assert tj.jit(lambda v: v.T)(z).sharding.spec == P("b", "a")
  w = tj.device_put(np.ones((4, 16), np.float32), NamedSharding(auto, P()))
  assert (z @ w).sharding.spec == P("a")  # (JAX 0.10.2: the compiler drops trailing unsplit entries)
  # a dimension split two ways is not split (JAX's compiler would reshard; Explicit axes raise)
  c = tj.device_put(host((8, 8)), NamedSharding(auto, P("a", None)))
  d = tj.device_put(host((8, 8)), NamedSharding(auto, P(None, "a")))
  np.testing.assert_allclose(np.asarray(c + d), host((8, 8)) * 2, rtol=1e-6)
  assert (c + d).sharding.spec.axis_names() == ("a",)


def test_transformations_keep_the_layout():
  a = host((8, 4))
  x = placed(a, "X", "Y")
  grad = tj.grad(lambda v: (jnp.sin(v) ** 2).sum())(x)
  assert str(tj.typeof(grad)) == "float32[8@X,4@Y]"
  np.testing.assert_allclose(np.asarray(grad), np.sin(2 * a.astype(np.float64)), rtol=1e-5, atol=1e-6)
  assert str(tj.typeof(tj.jit(tj.grad(lambda v: jnp.tanh(v).sum()))(x))) == "float32[8@X,4@Y]"
  assert str(tj.typeof(tj.vmap(jnp.sin)(x))) == "float32[8@X,4@Y]"
  # a data-parallel gradient: batch split over X, weights replicated; the weight gradient is replicated
  w = placed(host((4, 3), 2))
  gw = tj.jit(tj.grad(lambda w, x: jnp.tanh(x @ w).sum()))(w, placed(a, "X", None))
  assert str(tj.typeof(gw)) == "float32[4,3]" and gw.is_fully_replicated and len(gw.addressable_shards) == 8
  expected = a.T.astype(np.float64) @ (1 - np.tanh(a.astype(np.float64) @ host((4, 3), 2)) ** 2)
  np.testing.assert_allclose(np.asarray(gw), expected, rtol=1e-5, atol=1e-5)


def test_shard_map_types_and_results(mesh):
  x = placed(host((8, 4)), "X", "Y")
  seen = []

  def f(block):
    seen.append((str(tj.typeof(block)), str(tj.typeof(lax.psum(block, "X")))))
    return block * 2
  out = tj.jit(tj.shard_map(f, mesh=mesh, in_specs=P("X", "Y"), out_specs=P("X", "Y")))(x)
  assert seen == [("float32[2,2]{V:(X,Y)}", "float32[2,2]{V:Y}")]  # (JAX 0.10's notation for varying axes)
  assert out.sharding == NamedSharding(mesh, P("X", "Y")) and str(tj.typeof(out)) == "float32[8@X,4@Y]"
  np.testing.assert_allclose(np.asarray(out), host((8, 4)) * 2)


def test_sharding_constraints_label_traced_values():
  x = placed(host((8, 4)), "X", "Y")
  seen = []

  def f(v):
    w = lax.with_sharding_constraint(jnp.sin(v), P(None, "X"))
    seen.append(str(tj.typeof(w)))
    return w * 2
  out = tj.jit(f)(x)
  assert seen == ["float32[8,4@X]"] and str(tj.typeof(out)) == "float32[8,4@X]"
  np.testing.assert_allclose(np.asarray(out), np.sin(host((8, 4))) * 2, rtol=1e-6)
  assert str(tj.typeof(tj.reshard(x, P("Y", None)))) == "float32[8@Y,4]"


def test_abstract_meshes(mesh):
  abstract = tj.sharding.get_abstract_mesh()
  assert repr(abstract) == ("AbstractMesh('X': 4, 'Y': 2, axis_types=(Explicit, Explicit), device_kind=cpu, "
                            "num_cores=None, platform=cpu)")
  assert (abstract.axis_names, abstract.axis_sizes, abstract.size) == (("X", "Y"), (4, 2), 8)
  assert tj.sharding.get_mesh() is mesh
  explicit = tj.sharding.AxisType.Explicit
  assert repr(tj.sharding.AbstractMesh((8,), ("A",), (explicit,))) == "AbstractMesh('A': 8, axis_types=(Explicit,))"
  x = placed(np.arange(32.0, dtype=np.float32).reshape(8, 4), "X", "Y")

  @tj.jit
  def f(v):  # (JAX's sharding tutorial: the mesh's devices renamed under jit)
    with tj.sharding.use_abstract_mesh(tj.sharding.AbstractMesh((8,), ("A",), (explicit,))):
      return tj.reshard(v, P("A", None)) * 2
  z = f(x)
  assert str(tj.typeof(z)) == "float32[8@A,4]"
  np.testing.assert_array_equal(np.asarray(z), np.arange(32.0).reshape(8, 4) * 2)
  with pytest.raises(ValueError, match="has 4 devices but the current mesh has 8"):
    with tj.sharding.use_abstract_mesh(tj.sharding.AbstractMesh((4,), ("A",))): pass


def test_auto_axes_and_explicit_axes():
  x = placed(np.arange(16, dtype=np.int32).reshape(4, 4), "X", None)
  y = placed(np.arange(16, dtype=np.int32).reshape(4, 4), None, "X")
  seen = []

  @tj.sharding.auto_axes
  def add(a, b):
    seen.append(repr(tj.sharding.get_abstract_mesh()))
    return a + b  # no error: the axes are Auto here
  result = add(x, y, out_sharding=P("X", None))
  assert seen == ["AbstractMesh('X': 4, 'Y': 2, axis_types=(Auto, Auto), device_kind=cpu, num_cores=None, "
                  "platform=cpu)"]
  assert str(tj.typeof(result)) == "int32[4@X,4]"
  np.testing.assert_array_equal(np.asarray(result), np.arange(16).reshape(4, 4) + np.arange(16).reshape(4, 4))
  my_array = jnp.sin(placed(np.arange(8.0, dtype=np.float32), "X"))
  specs = []

  @tj.sharding.auto_axes
  def compare(v):
    specs.append((v.sharding.spec, tj.typeof(v).sharding.spec))  # the concrete layout; the type hides Auto axes
    return v
  compare(my_array, out_sharding=P("X"))
  assert specs == [(P("X"), P(None))] and tj.typeof(my_array).sharding.spec == P("X")

  auto = tj.make_mesh((4, 2), ("X", "Y"), (tj.sharding.AxisType.Auto,) * 2)
  with tj.set_mesh(auto):
    types = []

    @tj.sharding.explicit_axes
    def twice(v):
      types.append(str(tj.typeof(v)))
      return v * 2

    @tj.jit
    def f(v):
      return twice(jnp.sin(v), in_sharding=P("X", "Y")) + 1
    out = f(tj.device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4), P("X", "Y")))
    assert types == ["float32[4@X,4@Y]"]
    np.testing.assert_allclose(np.asarray(out), np.sin(np.arange(16.0).reshape(4, 4)) * 2 + 1, rtol=1e-6)


def test_out_sharding_of_creation_random_and_shape_functions():
  key = tj.random.key(0)
  x = tj.random.normal(key, (8, 4), out_sharding=P("X", "Y"))
  assert str(tj.typeof(x)) == "float32[8@X,4@Y]" and str(tj.typeof(x.sum(0))) == "float32[4@Y]"
  np.testing.assert_array_equal(np.asarray(x), np.asarray(tj.random.normal(key, (8, 4))))  # the same numbers
  assert str(tj.typeof(tj.random.uniform(key, (8,), out_sharding=P("X")))) == "float32[8@X]"
  assert str(tj.typeof(tj.random.randint(key, (8, 2), 0, 5, out_sharding=P("X", None)))) == "int32[8@X,2]"
  assert str(tj.typeof(jnp.zeros((8, 4), out_sharding=P(None, "Y")))) == "float32[8,4@Y]"
  assert str(tj.typeof(jnp.arange(16, out_sharding=P("X")))) == "int32[16@X]"
  assert str(tj.typeof(jnp.ones_like(x, out_sharding=P("Y", None)))) == "float32[8@Y,4]"
  # a reshape JAX has no rule for, given its layout
  x2 = placed(host((8, 4)), "X", None)
  with pytest.raises(ShardingTypeError):
    jnp.reshape(x2, (4, 8))
  r = jnp.reshape(x2, (4, 8), out_sharding=P("X", None))
  assert str(tj.typeof(r)) == "float32[4@X,8]"
  np.testing.assert_array_equal(np.asarray(r), host((8, 4)).reshape(4, 8))
  r = tj.jit(lambda v: jnp.reshape(v, (4, 8), out_sharding=P(None, "Y")))(x2)
  assert str(tj.typeof(r)) == "float32[4,8@Y]"


def test_auto_mesh_results_report_compiler_specs():
  auto = tj.make_mesh((4, 2), ("X", "Y"), (tj.sharding.AxisType.Auto,) * 2)
  with tj.set_mesh(auto):
    x = tj.device_put(jnp.arange(8 * 4.0).reshape(8, 4), P(None, "X"))
    y = tj.device_put(jnp.arange(4 * 16.0).reshape(4, 16), P("X", None))
    z = jnp.dot(x, y)  # not an error on Auto axes
    assert z.sharding.spec == P() and str(tj.typeof(z)) == "float32[8,16]"  # (JAX's GSPMD result, printed P())
    np.testing.assert_allclose(np.asarray(z), np.arange(32.0).reshape(8, 4) @ np.arange(64.0).reshape(4, 16))
    z = tj.jit(lambda a, b: lax.with_sharding_constraint(jnp.dot(a, b), P("X", None)))(x, y)
    assert z.sharding.spec == P("X")  # (JAX prints P('X',))


def test_print_inside_an_eager_shard_map_shows_each_device_block(capsys):
  one = tj.make_mesh((2,), ("i",))
  with tj.set_mesh(one):
    @tj.shard_map(in_specs=P("i"), out_specs=P())
    def f(x):
      print(x)  # varying: each device's block
      y = lax.psum(x, "i")
      print(y)  # invariant: the same block on each device
      return y
    out = f(tj.device_put(jnp.arange(6.0), P("i")))
  np.testing.assert_array_equal(np.asarray(out), [3.0, 5.0, 7.0])
  assert capsys.readouterr().out == (  # (JAX 0.10.2's output)
    "On cpu:0 at mesh coordinates (i,) = (0,):\n[0. 1. 2.]\n\n"
    "On cpu:1 at mesh coordinates (i,) = (1,):\n[3. 4. 5.]\n\n"
    "On cpu:0 at mesh coordinates (i,) = (0,):\n[3. 5. 7.]\n\n"
    "On cpu:1 at mesh coordinates (i,) = (1,):\n[3. 5. 7.]\n\n")
  grid = tj.make_mesh((2, 2), ("i", "j"))
  tj.shard_map(lambda b: print(b) or b, mesh=grid, in_specs=P("i", "j"), out_specs=P("i", "j"))(
    np.arange(16).reshape(4, 4))
  printed = capsys.readouterr().out
  assert printed.startswith("On cpu:0 at mesh coordinates (i, j,) = (0, 0):\n[[0 1]\n [4 5]]\n\n"
                            "On cpu:1 at mesh coordinates (i, j,) = (0, 1):\n[[2 3]\n [6 7]]\n\n")
  assert printed.endswith("On cpu:3 at mesh coordinates (i, j,) = (1, 1):\n[[10 11]\n [14 15]]\n\n")
  # under jit the values are staged: printed as tracers, as JAX
  tj.jit(tj.shard_map(lambda b: print(b) or b, mesh=grid, in_specs=P("i", "j"), out_specs=P("i", "j")))(
    np.arange(16).reshape(4, 4))
  assert "Tracer(int32[2,2])" in capsys.readouterr().out  # (each block, as JAX's JitTracer(int32[2,2]{V:(i,j)}))
