"""Collectives over named axes (tinyjax.lax's psum, pmax, pmin, pmean, pvary, axis_index, axis_size, all_gather,
psum_scatter, ppermute, all_to_all) under vmap and under `batched(..., spmd=True)` (shard_map's mesh axes): values
against numpy, tuple axis names over nested vmaps, composition with jit/grad/vmap, reverse mode through them (the
spmd and vmap transposes of psum), and errors. Literal expectations were measured with JAX 0.10.2."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax
from tinyjax.trace.batching import batched, vmap
from tests.gradcheck import numeric_grad

RNG = np.random.default_rng(0)
N = 4


def per_example(fun, xs, axis_name="i", **kwargs):
  """vmap of `fun` over axis 0 of `xs`, named `axis_name`, as a numpy float64 array."""
  return np.asarray(vmap(fun, axis_name=axis_name, **kwargs)(xs), np.float64)


def over_grid(fun, xs, names=("x", "y")):
  """Two nested named vmaps (the first name outer) over the two leading axes of `xs`."""
  return np.asarray(vmap(vmap(fun, axis_name=names[1]), axis_name=names[0])(xs), np.float64)


def spmd(fun, xs, in_axes=0, out_axes=0):
  """As shard_map over a mesh axis 'i' of N shards would run `fun`: a vmap with spmd=True over the shards."""
  return np.asarray(batched(fun, in_axes, out_axes, axis_name="i", axis_size=N, spmd=True)(xs), np.float64)


# ------------------------------------------------------------------------------------------- numpy references
# each maps the stack of all examples (N, *example shape) to the stack of the results

def all_gather_ref(stack, axis=0, tiled=False):
  gathered = np.concatenate(list(stack), axis) if tiled else np.moveaxis(stack, 0, axis)
  return np.broadcast_to(gathered, stack.shape[:1] + gathered.shape)


def psum_scatter_ref(stack, scatter_dimension=0, tiled=False):
  chunks = np.split(stack.sum(0), len(stack), axis=scatter_dimension)
  return np.stack(chunks if tiled else [np.squeeze(c, scatter_dimension) for c in chunks])


def ppermute_ref(stack, perm):
  out = np.zeros_like(stack)
  for source, destination in perm: out[destination] = stack[source]
  return out


def all_to_all_ref(stack, split_axis, concat_axis, tiled=False):
  size = len(stack)
  out = []
  for receiver in range(size):
    chunks = [np.split(stack[sender], size, axis=split_axis)[receiver] for sender in range(size)]
    if tiled: out.append(np.concatenate(chunks, concat_axis))
    else: out.append(np.stack([np.squeeze(c, split_axis) for c in chunks], concat_axis))
  return np.stack(out)


# ------------------------------------------------------------------------------------------- values under vmap

def test_reductions_and_axis_queries():
  xs = RNG.standard_normal((N, 3)).astype(np.float32)
  np.testing.assert_allclose(per_example(lambda x: lax.psum(x, "i"), xs), np.broadcast_to(xs.sum(0), xs.shape),
                             rtol=1e-6)
  np.testing.assert_array_equal(per_example(lambda x: lax.pmax(x, "i"), xs), np.broadcast_to(xs.max(0), xs.shape))
  np.testing.assert_array_equal(per_example(lambda x: lax.pmin(x, "i"), xs), np.broadcast_to(xs.min(0), xs.shape))
  ints = np.array([[3, -7], [np.iinfo(np.int32).min, 5], [0, 9], [2, 2]], np.int32)
  out = vmap(lambda x: lax.pmin(x, "i"), axis_name="i")(ints)
  assert out.dtype == np.int32
  np.testing.assert_array_equal(np.asarray(out), np.broadcast_to(ints.min(0), ints.shape))
  unsigned = vmap(lambda x: lax.pmin(x, "i"), axis_name="i")(np.arange(4, 8, dtype=np.uint8))
  np.testing.assert_array_equal(np.asarray(unsigned), np.full(4, 4))
  np.testing.assert_array_equal(per_example(lambda x: lax.pmin(x, "i"), np.ones(3, np.float32), in_axes=None,
                                            axis_size=N), np.ones((N, 3)))
  np.testing.assert_array_equal(per_example(lambda x: x * lax.axis_size("i"), np.ones(N, np.float32)), np.full(N, N))
  assert vmap(lambda x: x * 0 + lax.axis_size("i"), axis_name="i")(np.ones(3)).tolist() == [3, 3, 3]
  # pytrees, as JAX's
  tree = vmap(lambda x: lax.pmin({"a": x, "b": (2 * x,)}, "i"), axis_name="i")(xs)
  np.testing.assert_array_equal(np.asarray(tree["b"][0]), np.broadcast_to(2 * xs.min(0), xs.shape))


def test_pvary_is_identity_and_broadcasts_unbatched_values():
  xs = np.arange(6, dtype=np.float32).reshape(3, 2)
  np.testing.assert_array_equal(per_example(lambda x: lax.pvary(x, "i"), xs), xs)
  w = np.array([1.0, 2.0], np.float32)
  out = vmap(lambda x, w: lax.pvary(w, "i"), in_axes=(0, None), out_axes=0, axis_name="i")(xs, w)
  np.testing.assert_array_equal(np.asarray(out), np.broadcast_to(w, (3, 2)))


@pytest.mark.parametrize("shape,axis,tiled", [((3,), 0, False), ((2, 3), 1, False), ((2, 3), -1, False),
                                              ((2, 3), 2, False), ((4, 2), 0, True), ((2, 3), 1, True),
                                              ((2, 3), -1, True)])
def test_all_gather(shape, axis, tiled):
  xs = RNG.standard_normal((N, *shape)).astype(np.float32)
  out = per_example(lambda x: lax.all_gather(x, "i", axis=axis, tiled=tiled), xs)
  position = axis % (len(shape) + (not tiled))
  np.testing.assert_array_equal(out, all_gather_ref(xs, position, tiled))


def test_all_gather_literals():
  # JAX: vmap(all_gather, axis_name='i')(arange(3.)) is the whole gather in every example
  np.testing.assert_array_equal(per_example(lambda x: lax.all_gather(x, "i"), np.arange(3.0)), [[0, 1, 2]] * 3)
  # shard_map over 4 shards of arange(8.): all_gather tiled, out_specs P('i'): arange(8) four times
  out = spmd(lambda x: lax.all_gather(x, "i", tiled=True), np.arange(8.0).reshape(N, 2))
  np.testing.assert_array_equal(out.ravel(), np.tile(np.arange(8.0), 4))
  out = spmd(lambda x: lax.all_gather(x, "i", axis=1, tiled=True), np.arange(16.0).reshape(N, 2, 2))
  np.testing.assert_array_equal(out[0], [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]])


@pytest.mark.parametrize("shape,dim,tiled", [((N,), 0, False), ((3, N), 1, False), ((2, N, 3), -2, False),
                                             ((8,), 0, True), ((1, 8), 1, True), ((8, 3), 0, True)])
def test_psum_scatter(shape, dim, tiled):
  xs = RNG.standard_normal((N, *shape)).astype(np.float32)
  out = per_example(lambda x: lax.psum_scatter(x, "i", scatter_dimension=dim, tiled=tiled), xs)
  np.testing.assert_allclose(out, psum_scatter_ref(xs, dim % len(shape), tiled), rtol=1e-5, atol=1e-6)


def test_psum_scatter_literals():
  # shard_map, in_specs P() (every shard holds arange(8.)), psum_scatter tiled: [0, 4, 8, ..., 28]
  out = spmd(lambda x: lax.psum_scatter(x, "i", tiled=True), np.arange(8.0), in_axes=None)
  np.testing.assert_array_equal(out.ravel(), np.arange(0.0, 32.0, 4.0))
  out = per_example(lambda x: lax.psum_scatter(x, "i", scatter_dimension=1), np.arange(32.0).reshape(N, 2, N))
  np.testing.assert_array_equal(out, [[48, 64], [52, 68], [56, 72], [60, 76]])


@pytest.mark.parametrize("perm", [[(0, 1), (1, 2), (2, 3), (3, 0)], [(0, 1), (1, 2)], [(3, 0), (0, 3), (1, 1)], []])
def test_ppermute(perm):
  xs = RNG.standard_normal((N, 2, 3)).astype(np.float32)
  np.testing.assert_array_equal(per_example(lambda x: lax.ppermute(x, "i", perm), xs), ppermute_ref(xs, perm))


def test_ppermute_literals():
  xs = np.arange(8.0).reshape(N, 2)
  out = spmd(lambda x: lax.ppermute(x, "i", [(0, 1), (1, 2), (2, 3), (3, 0)]), xs)
  np.testing.assert_array_equal(out.ravel(), [6, 7, 0, 1, 2, 3, 4, 5])
  out = spmd(lambda x: lax.ppermute(x, "i", [(0, 1), (1, 2)]), xs)
  np.testing.assert_array_equal(out.ravel(), [0, 0, 0, 1, 2, 3, 0, 0])
  tree = vmap(lambda x: lax.ppermute((x, 2 * x), "i", [(0, 1)]), axis_name="i")(xs)
  np.testing.assert_array_equal(np.asarray(tree[1]), [[0, 0], [0, 2], [0, 0], [0, 0]])


@pytest.mark.parametrize("shape,split,concat,tiled", [
  ((N,), 0, 0, False), ((N, 2), 0, 1, False), ((2, N, 3), 1, 2, False), ((2, N, 3), 1, 0, False),
  ((8,), 0, 0, True), ((2, 8), 1, 0, True), ((N, 3), 0, 1, True), ((3, 8), -1, -2, True)])
def test_all_to_all(shape, split, concat, tiled):
  xs = RNG.standard_normal((N, *shape)).astype(np.float32)
  out = per_example(lambda x: lax.all_to_all(x, "i", split, concat, tiled=tiled), xs)
  np.testing.assert_array_equal(out, all_to_all_ref(xs, split % len(shape), concat % len(shape), tiled))


def test_all_to_all_literals():
  out = spmd(lambda x: lax.all_to_all(x, "i", 0, 0, tiled=True), np.arange(16.0).reshape(N, 4))
  np.testing.assert_array_equal(out.ravel(), [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])
  out = per_example(lambda x: lax.all_to_all(x, "i", 0, 1), np.arange(32.0).reshape(N, N, 2))
  np.testing.assert_array_equal(out[1], [[2, 10, 18, 26], [3, 11, 19, 27]])
  ints = vmap(lambda x: lax.all_to_all(x, "i", 0, 0), axis_name="i")(np.arange(16, dtype=np.int32).reshape(4, 4))
  assert ints.dtype == np.int32 and np.asarray(ints).tolist()[1] == [1, 5, 9, 13]


# ------------------------------------------------------------------------------------ tuple names, nested vmaps

GRID = (2, 3)  # nx, ny


def stack_of(grid, names):
  """The examples of a (nx, ny, ...) grid stacked along the combined axis `names` (first name major)."""
  return (grid if names == ("x", "y") else np.swapaxes(grid, 0, 1)).reshape(6, *grid.shape[2:])


def grid_of(stack, names):
  """Inverse of `stack_of`."""
  if names == ("x", "y"): return stack.reshape(*GRID, *stack.shape[1:])
  return np.swapaxes(stack.reshape(GRID[1], GRID[0], *stack.shape[1:]), 0, 1)


@pytest.mark.parametrize("names", [("x", "y"), ("y", "x")])
def test_tuple_axis_names_over_nested_vmaps(names):
  grid = RNG.standard_normal((*GRID, 6, 2)).astype(np.float32)
  index = over_grid(lambda x: lax.axis_index(names), grid)
  np.testing.assert_array_equal(index, grid_of(np.arange(6.0), names))
  assert over_grid(lambda x: x[0, 0] * 0 + lax.axis_size(names), grid).tolist() == [[6.0] * 3] * 2
  cases = [
    (lambda x: lax.psum(x, names), lambda s: np.broadcast_to(s.sum(0), s.shape)),
    (lambda x: lax.pmin(x, names), lambda s: np.broadcast_to(s.min(0), s.shape)),
    (lambda x: lax.all_gather(x, names, axis=1), lambda s: all_gather_ref(s, 1)),
    (lambda x: lax.all_gather(x, names, tiled=True), lambda s: all_gather_ref(s, 0, True)),
    (lambda x: lax.psum_scatter(x, names, scatter_dimension=0), lambda s: psum_scatter_ref(s, 0)),
    (lambda x: lax.psum_scatter(x, names, tiled=True), lambda s: psum_scatter_ref(s, 0, True)),
    (lambda x: lax.ppermute(x, names, [(0, 1), (1, 5), (5, 3), (3, 0)]),
     lambda s: ppermute_ref(s, [(0, 1), (1, 5), (5, 3), (3, 0)])),
    (lambda x: lax.all_to_all(x, names, 0, 1), lambda s: all_to_all_ref(s, 0, 1)),
    (lambda x: lax.all_to_all(x, names, 0, 1, tiled=True), lambda s: all_to_all_ref(s, 0, 1, True)),
  ]
  for fun, ref in cases:
    np.testing.assert_allclose(over_grid(fun, grid), grid_of(ref(stack_of(grid, names)), names), rtol=1e-5,
                               atol=1e-6)


def test_tuple_axis_names_literals():
  # shard_map over a (2, 3) mesh ('x', 'y') of arange(6.) / arange(36.), P(('x', 'y')), measured
  grid = np.arange(6.0).reshape(*GRID, 1)
  out = over_grid(lambda x: lax.ppermute(x, ("x", "y"), [(0, 1), (1, 5), (5, 3), (3, 0)]), grid)
  np.testing.assert_array_equal(out.ravel(), [3, 0, 0, 5, 0, 1])
  np.testing.assert_array_equal(over_grid(lambda x: lax.axis_index(("y", "x")), grid).ravel(), [0, 2, 4, 1, 3, 5])
  np.testing.assert_array_equal(over_grid(lambda x: lax.all_gather(x, ("y", "x"), tiled=True), grid)[0, 0],
                                [0, 3, 1, 4, 2, 5])
  grid = np.arange(36.0).reshape(*GRID, 6)
  out = over_grid(lambda x: lax.psum_scatter(x, ("y", "x"), tiled=True), grid)
  np.testing.assert_array_equal(out.ravel(), [90, 102, 114, 96, 108, 120])
  out = over_grid(lambda x: lax.all_to_all(x, ("y", "x"), 0, 0, tiled=True), grid)
  np.testing.assert_array_equal(out[0, 1], [2, 20, 8, 26, 14, 32])


def test_collective_over_the_outer_name_with_the_inner_batch_axis_elsewhere():
  # the inner vmap's batch axis (axis 1 of each outer example) passes through collectives over the outer name
  grid = RNG.standard_normal((N, 5, N)).astype(np.float32)  # (outer 'x', inner 'y', example)

  def run(fun):
    return np.asarray(vmap(vmap(fun, in_axes=1, axis_name="y"), axis_name="x")(np.swapaxes(grid, 1, 2)), np.float64)
  np.testing.assert_array_equal(run(lambda x: lax.all_gather(x, "x", axis=1)),
                                np.broadcast_to(np.transpose(grid, (1, 2, 0)), (N, 5, N, N)))
  perm = [(0, 2), (2, 1), (1, 0)]
  np.testing.assert_array_equal(run(lambda x: lax.ppermute(x, "x", perm)), ppermute_ref(grid, perm))
  np.testing.assert_allclose(run(lambda x: lax.psum_scatter(x, "x")), grid.sum(0).T, rtol=1e-5)
  np.testing.assert_array_equal(run(lambda x: lax.all_to_all(x, "x", 0, 0)), np.transpose(grid, (2, 1, 0)))


def test_tuple_axis_names_with_another_vmap_between_them():
  # vmaps x > z > y, collectives over ('x', 'y'): z's batch axis passes through while y's is already gathered
  grid = RNG.standard_normal((2, 5, 3, 6, 2)).astype(np.float32)  # (x, z, y, example)
  perm = [(0, 4), (4, 5), (5, 0)]
  for fun, ref in [(lambda v: lax.all_to_all(v, ("x", "y"), 0, 1), lambda s: all_to_all_ref(s, 0, 1)),
                   (lambda v: lax.ppermute(v, ("x", "y"), perm), lambda s: ppermute_ref(s, perm))]:
    nested = vmap(vmap(vmap(fun, in_axes=1, axis_name="y"), in_axes=2, axis_name="z"), axis_name="x")
    # (x, 6, y, z, 2): z's axis is 2 of each x example, y's is 1 of each (x, z) example
    out = np.asarray(nested(np.moveaxis(grid, (1, 2), (3, 2))))
    for z in range(5):
      np.testing.assert_array_equal(out[:, z], ref(grid[:, z].reshape(6, 6, 2)).reshape(2, 3, *out.shape[3:]))


# ------------------------------------------------------------------------------------ jit, grad and vmap composed

def loss_with(collective):
  """A scalar per example that mixes the examples through `collective` (nonlinear before and after it)."""
  def loss(x):
    mixed = collective(x * x)
    weights = np.linspace(0.5, 2.0, int(np.prod(mixed.shape)), dtype=np.float32).reshape(mixed.shape)
    return tnp.sum(tnp.sin(mixed) * weights)
  return loss


COLLECTIVES = {
  "psum": lambda x: lax.psum(x, "i"),
  "pmax": lambda x: lax.pmax(x, "i"),
  "pmin": lambda x: lax.pmin(x, "i"),
  "pmean": lambda x: lax.pmean(x, "i"),
  "all_gather": lambda x: lax.all_gather(x, "i", tiled=True),
  "psum_scatter": lambda x: lax.psum_scatter(x, "i", tiled=True),
  "ppermute": lambda x: lax.ppermute(x, "i", [(0, 1), (1, 2), (3, 0)]),
  "all_to_all": lambda x: lax.all_to_all(x, "i", 0, 0, tiled=True),
}


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_grad_of_vmap_against_finite_differences(name):
  xs = RNG.uniform(0.2, 1.5, (N, 4)).astype(np.float32)
  total = lambda xs: tnp.sum(vmap(loss_with(COLLECTIVES[name]), axis_name="i")(xs))
  expected = numeric_grad(total, xs.astype(np.float64))
  np.testing.assert_allclose(np.asarray(tj.grad(total)(xs)), expected, rtol=2e-2, atol=2e-3)
  # vmap(grad(f)) sends each example's cotangent through the collective's transpose: for a linear collective (not
  # psum, whose vmap transpose is psum) the per-example gradients equal the gradient of the sum
  if name not in ("psum", "pmean", "pmax", "pmin"):
    per_example_grads = vmap(tj.grad(loss_with(COLLECTIVES[name])), axis_name="i")(xs)
    np.testing.assert_allclose(np.asarray(per_example_grads), expected, rtol=2e-2, atol=2e-3)
    jitted = tj.jit(vmap(tj.grad(loss_with(COLLECTIVES[name])), axis_name="i"))(xs)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(per_example_grads), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["all_gather", "psum_scatter", "ppermute", "all_to_all", "pmin"])
def test_jit_and_vmap_of_jit(name):
  xs = RNG.standard_normal((N, 4)).astype(np.float32)
  fun = COLLECTIVES[name]
  expected = per_example(fun, xs)
  np.testing.assert_allclose(np.asarray(tj.jit(vmap(fun, axis_name="i"))(xs)), expected, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(vmap(tj.jit(fun), axis_name="i")(xs)), expected, rtol=1e-6)


def test_linearize_and_jvp_through_collectives():
  xs = RNG.standard_normal((N, 4)).astype(np.float32)
  ts = RNG.standard_normal((N, 4)).astype(np.float32)
  perm = [(0, 1), (1, 2), (2, 3), (3, 0)]
  fun = lambda x: lax.ppermute(tnp.sin(x), "i", perm)
  _, tangent = vmap(lambda x, t: tj.jvp(fun, (x,), (t,)), axis_name="i")(xs, ts)
  np.testing.assert_allclose(np.asarray(tangent), ppermute_ref(np.cos(xs) * ts, perm), rtol=1e-5)
  lin = vmap(lambda x, t: tj.linearize(fun, x)[1](t), axis_name="i")(xs, ts)
  np.testing.assert_allclose(np.asarray(lin), ppermute_ref(np.cos(xs) * ts, perm), rtol=1e-5)
  # pmax's tangent is the one of the example holding the maximum, ties shared evenly
  values = np.array([1.0, 3.0, 3.0, 2.0], np.float32)
  _, tangent = vmap(lambda x, t: tj.jvp(lambda y: lax.pmax(y, "i"), (x,), (t,)), axis_name="i")(
    values, np.array([1.0, 2.0, 4.0, 8.0], np.float32))
  np.testing.assert_allclose(np.asarray(tangent), np.full(4, 3.0))


def test_grad_through_collectives_with_two_named_vmaps():
  # grad inside the outer vmap, the inner vmap and a collective over both names inside the differentiated function
  grid = RNG.uniform(0.2, 1.5, (*GRID, 2)).astype(np.float32)
  perm = [(0, 1), (1, 5), (5, 3), (3, 0), (2, 4)]
  inner = lambda v: tnp.sin(lax.ppermute(v * v, ("x", "y"), perm)) * tnp.arange(2.0)
  per_row = lambda row: tnp.sum(vmap(inner, axis_name="y")(row))
  grads = vmap(tj.grad(per_row), axis_name="x")(grid)
  total = lambda g: tnp.sum(vmap(vmap(inner, axis_name="y"), axis_name="x")(g))
  np.testing.assert_allclose(np.asarray(grads), numeric_grad(total, grid.astype(np.float64)), rtol=2e-2,
                             atol=2e-3)
  # psum over both names, differentiated inside both vmaps: the vmap transpose (psum), N times the cotangent
  out = over_grid(tj.grad(lambda v: tnp.sum(lax.psum(v * v, ("x", "y")))), grid)
  np.testing.assert_allclose(out, 2 * grid * 6, rtol=1e-5)


# ---------------------------------------------------------------------- reverse mode: vmap versus shard_map (spmd)

def test_psum_transpose_under_vmap_is_psum():
  # JAX: vmap(grad(lambda x: psum(x, 'i')), axis_name='i')(arange(3.)) -> [3, 3, 3]; with x * x -> [0, 6, 12]
  np.testing.assert_array_equal(per_example(tj.grad(lambda x: lax.psum(x, "i")), np.arange(3.0)), [3, 3, 3])
  np.testing.assert_array_equal(per_example(tj.grad(lambda x: lax.psum(x * x, "i")), np.arange(3.0)), [0, 6, 12])
  np.testing.assert_array_equal(np.asarray(tj.jit(vmap(tj.grad(lambda x: lax.psum(x * x, "i")), axis_name="i"))(
    np.arange(3.0))), [0, 6, 12])
  # grad(vmap(f)) differentiates the whole batch (JAX: [5, 11, 17])
  total = lambda xs: tnp.sum(vmap(lambda x: lax.psum(x * x, "i") * x, axis_name="i")(xs))
  np.testing.assert_allclose(np.asarray(tj.grad(total)(np.arange(3.0))), [5, 11, 17])


def test_psum_transpose_under_shard_map_is_a_broadcast():
  shards = np.arange(8.0).reshape(N, 2)
  per_shard = lambda loss: (lambda x: tj.grad(loss)(x))
  psum_of_sum = per_shard(lambda x: lax.psum(tnp.sum(x), "i"))
  # JAX shard_map: check_vma=True -> 1.0 everywhere, check_vma=False -> 4.0
  np.testing.assert_array_equal(spmd(psum_of_sum, shards).ravel(), np.ones(8))
  np.testing.assert_array_equal(per_example(psum_of_sum, shards).ravel(), np.full(8, 4.0))
  # an invariant operand (in_specs P()) is made varying first: 4.0 either way
  out = spmd(psum_of_sum, np.arange(8.0), in_axes=None, out_axes=None)
  np.testing.assert_array_equal(out, np.full(8, 4.0))
  # all_gather transposes to psum_scatter: 4.0 both ways; also under a psum
  gather_sum = per_shard(lambda x: tnp.sum(lax.all_gather(x, "i")))
  np.testing.assert_array_equal(spmd(gather_sum, shards).ravel(), np.full(8, 4.0))
  np.testing.assert_array_equal(per_example(gather_sum, shards).ravel(), np.full(8, 4.0))
  np.testing.assert_array_equal(spmd(per_shard(lambda x: lax.psum(tnp.sum(lax.all_gather(x, "i")), "i")),
                                     shards).ravel(), np.full(8, 4.0))
  # psum's invariant result meeting a varying value: its cotangent is summed first (JAX: [24, 32] per shard)
  out = spmd(per_shard(lambda x: tnp.sum(lax.psum(x, "i") * x)), shards)
  np.testing.assert_array_equal(out, np.tile([24.0, 32.0], (N, 1)))
  # pmean: 0.5 x under check_vma, 2 x without (JAX)
  mean_sq = per_shard(lambda x: lax.pmean(tnp.sum(x * x), "i"))
  np.testing.assert_allclose(spmd(mean_sq, shards).ravel(), np.arange(8.0) / 2)
  np.testing.assert_allclose(per_example(mean_sq, shards).ravel(), np.arange(8.0) * 2)
  # pvary transposes to psum
  out = batched(lambda x, w: tj.grad(lambda w: tnp.sum(lax.pvary(w, "i") * x))(w), (0, None), None, axis_name="i",
                spmd=True)(shards, np.ones(2, np.float32))
  np.testing.assert_array_equal(np.asarray(out), shards.sum(0))


def test_spmd_gradient_of_an_invariant_input_is_summed_over_the_shards():
  # shard_map(in_specs=(P(), P('i'))) of grad w.r.t. the replicated w: JAX's implicit pvary of w transposes to a psum
  shards, w = np.arange(8.0).reshape(N, 2), np.array([1.0, 2.0], np.float32)
  fun = lambda w, x: tj.grad(lambda w: lax.psum(tnp.sum(w * x), "i"))(w)
  out = batched(fun, (None, 0), None, axis_name="i", spmd=True)(w, shards)
  np.testing.assert_array_equal(np.asarray(out), [12, 16])
  # under vmap (and for a cotangent that does not vary) nothing is summed
  np.testing.assert_array_equal(np.asarray(vmap(fun, (None, 0), axis_name="i")(w, shards)), shards * N)
  fun = lambda w, x: tj.grad(lambda w: tnp.sum(w * 2.0))(w)
  np.testing.assert_array_equal(np.asarray(batched(fun, (None, 0), None, axis_name="i", spmd=True)(w, shards)), [2, 2])
  # the same under jit
  fun = batched(lambda x: tj.grad(lambda x: lax.psum(tnp.sum(x), "i"))(x), axis_name="i", spmd=True)
  np.testing.assert_array_equal(np.asarray(tj.jit(fun)(shards)), np.ones((N, 2)))


def test_jacobians_through_collectives_inside_vmap():
  # JAX 0.10.2: jacrev [6, 12, 18], jacfwd [12, 12, 12], hessian and grad of grad [18, 36, 54], jacrev of ppermute
  xs = np.arange(1.0, 4.0, dtype=np.float32)
  np.testing.assert_allclose(per_example(tj.jacrev(lambda x: lax.psum(x * x, "i")), xs), [6, 12, 18])
  np.testing.assert_allclose(per_example(tj.jacfwd(lambda x: lax.psum(x * x, "i")), xs), [12, 12, 12])
  np.testing.assert_allclose(per_example(tj.hessian(lambda x: lax.psum(x * x * x, "i")), xs), [18, 36, 54])
  np.testing.assert_allclose(per_example(tj.grad(tj.grad(lambda x: lax.psum(x * x * x, "i"))), xs), [18, 36, 54])
  out = per_example(tj.jacrev(lambda x: lax.ppermute(x * x, "i", [(0, 1), (1, 2), (2, 0)])), xs)
  np.testing.assert_allclose(out, [2, 4, 6])


def test_spmd_gradients_of_the_movement_collectives():
  # JAX shard_map (check_vma) gradients, measured
  out = spmd(lambda x: tj.grad(lambda x: tnp.sum(lax.all_gather(x, "i", axis=1, tiled=True) ** 2 *
                                                 tnp.arange(8.0)))(x), np.arange(16.0).reshape(N, 2, 2))
  np.testing.assert_array_equal(out.reshape(8, 2), [[0, 8], [0, 24], [64, 120], [96, 168], [256, 360], [320, 440],
                                                    [576, 728], [672, 840]])
  out = spmd(lambda x: tj.grad(lambda x: tnp.sum(lax.ppermute(x * x, "i", [(0, 1), (1, 2)]) * tnp.arange(2.0)))(x),
             np.arange(8.0).reshape(N, 2))
  np.testing.assert_array_equal(out.ravel(), [0, 2, 0, 6, 0, 0, 0, 0])
  out = spmd(lambda x: tj.grad(lambda x: tnp.sum(lax.all_to_all(x * x, "i", 0, 0, tiled=True) * tnp.arange(4.0)))(x),
             np.arange(16.0).reshape(N, 4))
  np.testing.assert_array_equal(out.ravel(), [0, 0, 0, 0, 8, 10, 12, 14, 32, 36, 40, 44, 72, 78, 84, 90])


# ------------------------------------------------------------------------------------------------------- errors

def test_errors():
  xs = np.zeros((N, 8), np.float32)
  with pytest.raises(NameError, match="unbound axis name: j"):
    vmap(lambda x: lax.all_gather(x, "j"), axis_name="i")(xs)
  with pytest.raises(NameError, match="unbound axis name: j"):
    vmap(lambda x: lax.ppermute(x, ("i", "j"), [(0, 1)]), axis_name="i")(xs)
  with pytest.raises(NameError, match="unbound axis name: i"):
    lax.axis_size("i")
  with pytest.raises(ValueError, match="ppermute sources and destinations must be unique"):
    vmap(lambda x: lax.ppermute(x, "i", [(0, 1), (0, 2)]), axis_name="i")(xs)
  with pytest.raises(ValueError, match="ppermute sources and destinations must be unique"):
    vmap(lambda x: lax.ppermute(x, "i", [(0, 1), (2, 1)]), axis_name="i")(xs)
  for bad in ([(0, 4)], [(-1, 0)]):
    with pytest.raises(ValueError, match=r"ppermute indices must be in \[0, 4\)"):
      vmap(lambda x: lax.ppermute(x, "i", bad), axis_name="i")(xs)
  with pytest.raises(ValueError, match="tiled reduce_scatter operand scatter dimension size 6 must be divisible"):
    vmap(lambda x: lax.psum_scatter(x, "i", tiled=True), axis_name="i")(np.zeros((N, 6)))
  with pytest.raises(ValueError, match="reduce_scatter operand scatter dimension size 8 must match shard count 4"):
    vmap(lambda x: lax.psum_scatter(x, "i"), axis_name="i")(xs)
  with pytest.raises(ValueError, match="out of bounds"):
    vmap(lambda x: lax.psum_scatter(x, "i", scatter_dimension=1), axis_name="i")(xs)
  with pytest.raises(ValueError, match="split_axis \\(3\\) has to be divisible by the size of the named axis i"):
    vmap(lambda x: lax.all_to_all(x, "i", 0, 0, tiled=True), axis_name="i")(np.zeros((N, 3)))
  with pytest.raises(ValueError, match="all_to_all requires the size of the mapped axis"):
    vmap(lambda x: lax.all_to_all(x, "i", 0, 0), axis_name="i")(xs)
  with pytest.raises(ValueError, match="out of bounds"):
    vmap(lambda x: lax.all_to_all(x, "i", 1, 0, tiled=True), axis_name="i")(xs)
  with pytest.raises(ValueError, match="axis 3 is out of bounds for array of dimension 3"):
    vmap(lambda x: lax.all_gather(x, "i", axis=3), axis_name="i")(np.zeros((N, 3, 2)))
  with pytest.raises(ValueError, match="axis 0 is out of bounds for array of dimension 0"):
    vmap(lambda x: lax.all_gather(x, "i", tiled=True), axis_name="i")(np.zeros(N))
