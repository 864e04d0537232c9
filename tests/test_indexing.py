"""Gather and scatter: numpy indexing (integer arrays, boolean masks, mixed with slices/None/Ellipsis), `x.at[]`,
`take`, `take_along_axis` and the `lax.dynamic_slice` family, against numpy; their gradients against finite
differences, their vmap rules against Python loops, and their kernels' cost (a gather reads only what it returns)."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax
from tinyjax.lower.realize import normalize
from tinyjax.lower.schedule import schedule
from tinyjax.numpy._indexing import NonConcreteBooleanIndexError
from tests.gradcheck import numeric_grad_f32

RNG = np.random.default_rng(7)
H = RNG.standard_normal((3, 4, 5)).astype(np.float32)

GET_CASES = [
  np.s_[np.array([0, 2])], np.s_[:, np.array([[1, 3], [0, 0]])], np.s_[0, :, np.array([1, 2])],
  np.s_[:, np.array([0]), None, np.array([1])], np.s_[np.array([0]), None, np.array([1])],
  np.s_[None, np.array([0]), np.array([1])], np.s_[..., np.array([4, -1, 0])], np.s_[H[:, :, 0] > 0], np.s_[H > 0],
  np.s_[1:, ::-2, np.array([1, 2])], np.s_[True], np.s_[False], np.s_[np.array([[0], [2]]), :, np.array([1, 3])],
  np.s_[:, H[0, :, 0] > 0, 1:3], np.s_[np.array([], np.int32)], np.s_[np.array(1), 2],
  np.s_[np.array([2, 1]).astype(np.uint8), np.array([-1, 0], np.int8)],
]


@pytest.mark.parametrize("index", GET_CASES, ids=[f"case{i}" for i in range(len(GET_CASES))])
def test_getitem_matches_numpy(index):
  x = tnp.asarray(H)
  np.testing.assert_array_equal(np.asarray(x[index]), H[index])
  items = index if isinstance(index, tuple) else (index,)
  if not any(isinstance(i, np.ndarray) and i.dtype == np.bool_ for i in items):  # masks need concrete values
    np.testing.assert_array_equal(np.asarray(tj.jit(lambda a: a[index])(x)), H[index])


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_, np.float16])
def test_getitem_dtypes_and_traced_indices(dtype):
  host = (RNG.standard_normal((6, 3)) * 4).astype(dtype)
  index = np.array([5, 0, 5, -2])
  got = tj.jit(lambda a, i: a[i, 1:])(tnp.asarray(host), tnp.asarray(index))
  assert got.dtype == host.dtype
  np.testing.assert_array_equal(np.asarray(got), host[index, 1:])
  scalar = tj.jit(lambda a, i: a[i])(tnp.asarray(host), tnp.asarray(np.int32(4)))
  np.testing.assert_array_equal(np.asarray(scalar), host[4])


def test_out_of_bounds_reads_clamp_and_modes():
  x = tnp.arange(5.0)
  index = np.array([7, -1, -7, 2])
  np.testing.assert_array_equal(np.asarray(x[index]), [4, 4, 0, 2])  # -7 -> -2 -> clamped to 0, as JAX
  np.testing.assert_array_equal(np.asarray(x.at[index].get(mode="fill", fill_value=-1.0)), [-1, 4, -1, 2])
  np.testing.assert_array_equal(np.asarray(tnp.take(x, index)), [np.nan, 4, np.nan, 2])
  np.testing.assert_array_equal(np.asarray(tnp.take(x, index, mode="clip")), [4, 0, 0, 2])
  np.testing.assert_array_equal(np.asarray(tnp.take(x, index, mode="wrap")), [2, 4, 3, 2])
  np.testing.assert_array_equal(np.asarray(tnp.take(tnp.arange(5), np.array([9]))), [np.iinfo(np.int32).min])
  np.testing.assert_array_equal(np.asarray(tnp.take_along_axis(x, np.array([7, -1, -7]), axis=0)), [np.nan, 4, np.nan])


def test_take_and_take_along_axis_match_numpy():
  host = RNG.standard_normal((3, 4)).astype(np.float32)
  x = tnp.asarray(host)
  order = np.argsort(host, axis=1)
  np.testing.assert_array_equal(np.asarray(tnp.take_along_axis(x, order, axis=1)), np.take_along_axis(host, order, 1))
  np.testing.assert_array_equal(np.asarray(tnp.take_along_axis(x, order[:1], axis=1)),
                                np.take_along_axis(host, order[:1], 1))
  np.testing.assert_array_equal(np.asarray(tnp.take_along_axis(x, np.argsort(host, 0), axis=0)),
                                np.take_along_axis(host, np.argsort(host, 0), 0))
  np.testing.assert_array_equal(np.asarray(tnp.take(x, np.array([[2, 0]]), axis=1)), np.take(host, [[2, 0]], 1))
  np.testing.assert_array_equal(np.asarray(tnp.take(x, np.array([11, 0]))), np.take(host, [11, 0]))
  np.testing.assert_array_equal(np.asarray(tnp.take(x, 2, axis=-1)), host[:, 2])


UPDATE_CASES = [
  np.s_[0], np.s_[:, 1], np.s_[np.array([0, 2])], np.s_[:, np.array([[1, 3], [0, 0]])], np.s_[0, :, np.array([1, 2])],
  np.s_[:, np.array([0]), None, np.array([1])], np.s_[..., np.array([4, -1, 0])], np.s_[H > 0],
  np.s_[1:, ::-2, np.array([1, 2])], np.s_[np.array([[0], [2]]), :, np.array([1, 3])], np.s_[1:3, ::2],
  np.s_[-1, 2, 3], np.s_[()], np.s_[np.array([1, 1, 1])], np.s_[:, :, np.array([0, 0, 4])],
]
NUMPY_UFUNC = {"add": np.add, "multiply": np.multiply, "min": np.minimum, "max": np.maximum}


@pytest.mark.parametrize("index", UPDATE_CASES, ids=[f"case{i}" for i in range(len(UPDATE_CASES))])
@pytest.mark.parametrize("method", ["set", "add", "multiply", "min", "max"])
def test_at_updates_match_numpy(index, method):
  values = RNG.standard_normal(H[index].shape).astype(np.float32)
  expected = H.copy()
  if method == "set":
    expected[index] = values
  else:
    NUMPY_UFUNC[method].at(expected, index, values)
  got = getattr(tnp.asarray(H).at[index], method)(values)
  if method == "set" and isinstance(index, np.ndarray) and index.ndim == 1 and len(set(index.tolist())) < len(index):
    np.testing.assert_array_equal(np.asarray(got)[1], values[-1])  # duplicates: the last update wins, as JAX on CPU
    return
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6)
  jitted = tj.jit(lambda a, v: getattr(a.at[index], method)(v))(tnp.asarray(H), tnp.asarray(values))
  np.testing.assert_allclose(np.asarray(jitted), expected, rtol=1e-6)


def test_at_updates_out_of_bounds_broadcast_and_dtypes():
  x = tnp.arange(5.0)
  np.testing.assert_array_equal(np.asarray(x.at[np.array([7, -1, -7, 2])].set(9.0)), [0, 1, 9, 3, 9])  # dropped
  np.testing.assert_array_equal(np.asarray(x.at[np.array([7, -7])].set(9.0, mode="clip")), [9, 1, 2, 3, 9])
  np.testing.assert_array_equal(np.asarray(x.at[7].add(1.0)), np.arange(5.0))
  np.testing.assert_array_equal(np.asarray(x.at[np.array([1, 1, 2])].add(1.0)), [0, 3, 3, 3, 4])
  np.testing.assert_array_equal(np.asarray(x.at[1:3].subtract(1.0)), [0, 0, 1, 3, 4])
  np.testing.assert_allclose(np.asarray((x + 1).at[np.array([1, 1])].divide(2.0)), [1, 0.5, 3, 4, 5])
  np.testing.assert_allclose(np.asarray((x + 1).at[np.array([1, 1])].power(2.0)), [1, 16, 3, 4, 5])
  ints = tnp.arange(5)
  got = ints.at[1].add(2.7)  # values take the array's dtype, as JAX
  assert got.dtype == np.int32
  np.testing.assert_array_equal(np.asarray(got), [0, 3, 2, 3, 4])
  np.testing.assert_array_equal(np.asarray(ints.at[np.array([0, 0, 3])].min(np.array([-5, 2, 9]))), [-5, 1, 2, 3, 4])
  np.testing.assert_array_equal(np.asarray(ints.at[np.array([0, 0])].max(np.array([-5, 2]))), [2, 1, 2, 3, 4])
  flags = tnp.zeros(4, bool).at[np.array([1, 3])].set(True)
  np.testing.assert_array_equal(np.asarray(flags), [False, True, False, True])
  assert float(tnp.zeros(()).at[()].set(3.0)) == 3.0
  nan_min = tnp.ones(3).at[np.array([0, 0])].min(np.array([np.nan, 0.0], np.float32))
  assert np.isnan(np.asarray(nan_min)[0])


def test_dynamic_slice_family_clamps_as_jax():
  host = np.arange(20.0, dtype=np.float32).reshape(4, 5)
  x = tnp.asarray(host)
  for start in (-7, -2, 0, 2, 3, 9):
    expected_start = min(max(start + 4 if start < 0 else start, 0), 2)
    want = host[expected_start:expected_start + 2, 1:4]
    np.testing.assert_array_equal(np.asarray(lax.dynamic_slice(x, (start, 1), (2, 3))), want)
    traced = tj.jit(lambda a, s: lax.dynamic_slice(a, (s, 1), (2, 3)))(x, tnp.asarray(np.int32(start)))
    np.testing.assert_array_equal(np.asarray(traced), want)
    updated = host.copy()
    updated[expected_start:expected_start + 2, 1:4] = -1
    got = tj.jit(lambda a, s: lax.dynamic_update_slice(a, -tnp.ones((2, 3)), (s, tnp.asarray(1))))(
      x, tnp.asarray(np.int32(start)))
    np.testing.assert_array_equal(np.asarray(got), updated)
  np.testing.assert_array_equal(np.asarray(lax.dynamic_slice(x, tnp.asarray([1, 2]), (1, 2))), host[1:2, 2:4])
  np.testing.assert_array_equal(np.asarray(lax.dynamic_slice_in_dim(x, tnp.asarray(3), 2, axis=1)), host[:, 3:5])
  np.testing.assert_array_equal(np.asarray(lax.dynamic_index_in_dim(x, tnp.asarray(-1), 0, keepdims=False)), host[3])
  np.testing.assert_array_equal(np.asarray(lax.dynamic_update_index_in_dim(x, tnp.zeros(4), tnp.asarray(2), 1))[:, 2],
                                0)
  np.testing.assert_array_equal(np.asarray(lax.dynamic_update_slice_in_dim(x, tnp.zeros((1, 5)), 3, 0))[3], 0)


# ------------------------------------------------------------------------------------------- gradients


X2 = RNG.standard_normal((4, 5)).astype(np.float32)
W = tnp.asarray(RNG.standard_normal((4, 5)).astype(np.float32))


def test_gather_gradient_is_a_scatter_add():
  index = np.array([3, 0, 3, -1, 9])
  weights = tnp.asarray(RNG.standard_normal((5, 5)).astype(np.float32))

  def loss(a): return (tnp.sin(a[index]) * weights).sum()
  np.testing.assert_allclose(np.asarray(tj.grad(loss)(tnp.asarray(X2))), numeric_grad_f32(loss, X2), atol=2e-3)
  # the identity: d/dx sum(x[i] * w) = sum of w over the rows that read x, duplicates and clamped indices included
  expected = np.zeros_like(X2)
  np.add.at(expected, np.clip(np.where(index < 0, index + 4, index), 0, 3), np.asarray(weights))
  np.testing.assert_allclose(np.asarray(tj.grad(lambda a: (a[index] * weights).sum())(tnp.asarray(X2))), expected,
                             rtol=1e-6)


@pytest.mark.parametrize("method", ["set", "add", "multiply", "min", "max"])
def test_scatter_gradients_match_finite_differences(method):
  index = np.array([3, 0, 1, -2])
  updates = RNG.standard_normal((4, 5)).astype(np.float32)
  kwargs = {"unique_indices": True} if method == "multiply" else {}

  def loss(a, u): return (tnp.sin(getattr(a.at[index], method)(u, **kwargs)) * W).sum()
  grad_x = tj.grad(loss)(tnp.asarray(X2), tnp.asarray(updates))
  np.testing.assert_allclose(np.asarray(grad_x), numeric_grad_f32(lambda a: loss(a, tnp.asarray(updates)), X2),
                             atol=2e-3)
  grad_u = tj.jit(tj.grad(loss, 1))(tnp.asarray(X2), tnp.asarray(updates))
  np.testing.assert_allclose(np.asarray(grad_u), numeric_grad_f32(lambda u: loss(tnp.asarray(X2), u), updates),
                             atol=2e-3)


def test_scatter_gradients_with_duplicates_and_dropped_updates():
  index = np.array([1, 1, 2, 7])
  updates = tnp.asarray(RNG.standard_normal((4, 5)).astype(np.float32))
  grad_set = tj.grad(lambda u: (tnp.asarray(X2).at[index].set(u) ** 2).sum())(updates)
  expected = np.zeros((4, 5), np.float32)
  expected[1:3] = 2 * np.asarray(updates)[1:3]  # the first update to row 1 is overwritten, the last one is dropped
  np.testing.assert_allclose(np.asarray(grad_set), expected, rtol=1e-6)
  grad_add = tj.grad(lambda u: (tnp.asarray(X2).at[index].add(u) * W).sum())(updates)
  np.testing.assert_allclose(np.asarray(grad_add), np.concatenate([np.asarray(W)[[1, 1, 2]], np.zeros((1, 5))]))
  with pytest.raises(NotImplementedError, match="unique_indices"):
    tj.grad(lambda u: tnp.asarray(X2).at[index].multiply(u).sum())(updates)


def test_dynamic_slice_gradients():
  updates = RNG.standard_normal((2, 2)).astype(np.float32)

  def loss(a, u, start): return (tnp.sin(lax.dynamic_update_slice(a, u, (start, 2))) * W).sum()
  start = tnp.asarray(np.int32(3))
  grad_x = tj.grad(loss)(tnp.asarray(X2), tnp.asarray(updates), start)
  np.testing.assert_allclose(np.asarray(grad_x), numeric_grad_f32(lambda a: loss(a, tnp.asarray(updates), start), X2),
                             atol=2e-3)
  grad_u = tj.grad(loss, 1)(tnp.asarray(X2), tnp.asarray(updates), start)
  np.testing.assert_allclose(np.asarray(grad_u), numeric_grad_f32(lambda u: loss(tnp.asarray(X2), u, start), updates),
                             atol=2e-3)
  grad_slice = tj.grad(lambda a: (lax.dynamic_slice(a, (start, 1), (2, 3)) ** 2).sum())(tnp.asarray(X2))
  expected = np.zeros_like(X2)
  expected[2:4, 1:4] = 2 * X2[2:4, 1:4]
  np.testing.assert_allclose(np.asarray(grad_slice), expected, rtol=1e-6)


# ------------------------------------------------------------------------------------------- vmap

XS = RNG.standard_normal((3, 4, 5)).astype(np.float32)
IDS = np.array([[0, 1], [3, 3], [2, -1]])


def test_vmap_gather_rules_match_python_loops():
  xs, ids = tnp.asarray(XS), tnp.asarray(IDS)
  np.testing.assert_array_equal(np.asarray(tj.vmap(lambda a, i: a[i])(xs, ids)),
                                np.stack([XS[k][IDS[k]] for k in range(3)]))
  np.testing.assert_array_equal(np.asarray(tj.vmap(lambda a: a[:, np.array([4, 0])])(xs)), XS[:, :, [4, 0]])
  np.testing.assert_array_equal(np.asarray(tj.vmap(lambda i: tnp.asarray(X2)[i], in_axes=1)(ids)),
                                np.stack([X2[IDS[:, k]] for k in range(2)]))
  starts = tnp.asarray(np.array([0, 3, 1], np.int32))
  got = tj.vmap(lambda a, s: lax.dynamic_slice(a, (s, 1), (2, 3)))(xs, starts)
  np.testing.assert_array_equal(np.asarray(got), np.stack([XS[k, s:s + 2, 1:4] for k, s in zip(range(3), [0, 2, 1])]))
  got = tj.vmap(lambda a, i: tnp.take_along_axis(a, i, axis=1), in_axes=(0, None))(xs, np.argsort(XS[0], axis=1))
  np.testing.assert_array_equal(np.asarray(got), np.take_along_axis(XS, np.argsort(XS[0], axis=1)[None], 2))


@pytest.mark.parametrize("method", ["set", "add", "max"])
def test_vmap_scatter_rules_match_python_loops(method):
  xs, ids = tnp.asarray(XS), tnp.asarray(IDS)
  updates = tnp.asarray(RNG.standard_normal((3, 2, 5)).astype(np.float32))
  got = tj.vmap(lambda a, i, u: getattr(a.at[i], method)(u))(xs, ids, updates)
  want = np.stack([np.asarray(getattr(xs[k].at[ids[k]], method)(updates[k])) for k in range(3)])
  np.testing.assert_array_equal(np.asarray(got), want)
  got = tj.vmap(lambda u: getattr(tnp.asarray(X2).at[np.array([1, 2])], method)(u))(updates)
  want = np.stack([np.asarray(getattr(tnp.asarray(X2).at[np.array([1, 2])], method)(updates[k])) for k in range(3)])
  np.testing.assert_array_equal(np.asarray(got), want)


def test_composed_transformations():
  xs, ids = tnp.asarray(XS), tnp.asarray(IDS)

  def loss(a, i): return (tnp.sin(a[i]) ** 2).sum() + (a.at[i].multiply(2.0, unique_indices=True) ** 3).sum()
  expected = np.stack([np.asarray(tj.grad(loss)(xs[k], ids[k])) for k in range(3)])
  np.testing.assert_allclose(np.asarray(tj.jit(tj.vmap(tj.grad(loss)))(xs, ids)), expected, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.vmap(tj.jit(tj.grad(loss)))(xs, ids)), expected, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(tj.grad(lambda a: tj.vmap(loss)(a, ids).sum())(xs)), expected, rtol=1e-5)
  hessian = tj.hessian(lambda v: (v[np.array([0, 0, 2])] ** 3).sum())(tnp.asarray(np.array([1.0, 2.0, 3.0])))
  np.testing.assert_allclose(np.asarray(hessian), np.diag([12.0, 0.0, 18.0]), rtol=1e-6)


# ------------------------------------------------------------------------------------------- cost and errors

def _kernel_work(array):
  return [kernel.work for kernel in schedule(normalize([array.uop])[0]).kernels]


def test_gather_reads_only_what_it_returns():
  table = tnp.asarray(RNG.standard_normal((1000, 8)).astype(np.float32))
  rows = table[tnp.asarray(np.array([5, 999, 0], np.int32))]
  assert _kernel_work(rows) == [3 * 8]  # one kernel, O(len(ids) x 8), never a one-hot product over 1000 rows
  exp_rows = tnp.exp(table)[tnp.asarray(np.array([5, 7], np.int32))]
  assert _kernel_work(exp_rows) == [2 * 8]  # elementwise work on the table is done only for the rows read
  summed = tnp.ones((4, 1000)).sum(axis=1)[tnp.asarray(np.zeros(8, np.int32))]
  assert len(_kernel_work(summed)) == 2  # a reduction read more often than it has elements is computed once
  updated = tnp.zeros((1000, 8)).at[tnp.asarray(np.array([3], np.int32))].add(1.0)
  assert _kernel_work(updated) == [8000, 8]  # the copy, then one sequential pass over the updates


def test_indexing_errors():
  x = tnp.asarray(H)
  with pytest.raises(TypeError, match="integer or boolean"):
    x[tnp.asarray(np.array([0.5]))]
  with pytest.raises(TypeError, match="non-tuple sequence"):
    x[[0, 1]]
  with pytest.raises(IndexError, match="Too many indices"):
    x[0, 0, 0, 0]
  with pytest.raises(IndexError, match="boolean index"):
    x[np.array([True, False])]
  # an empty mask selects nothing, whatever the size of the axes its empty dimensions stand over (JAX's rule)
  assert x[np.zeros(0, bool)].shape == (0, *H.shape[1:])
  assert x[np.zeros((H.shape[0], 0), bool)].shape == (0, *H.shape[2:])
  with pytest.raises(IndexError, match="boolean index"):
    x[np.zeros((0, H.shape[1] + 1), bool)]
  with pytest.raises(NonConcreteBooleanIndexError, match="concrete"):
    tj.jit(lambda a: a[a > 0])(x)
  assert issubclass(NonConcreteBooleanIndexError, IndexError)
  with pytest.raises(TypeError, match=r"immutable .* x = x.at\[idx\].set\(y\)"):  # JAX's message
    x[0] = 1.0
  with pytest.raises(TypeError, match="immutable"):
    tj.jit(lambda a: a.__setitem__(0, 1.0))(x)
  with pytest.raises(ValueError, match="broadcast"):
    tnp.arange(5.0).at[np.array([1, 2])].set(tnp.ones(3))
  with pytest.raises(ValueError, match="mode"):
    tnp.arange(5.0).at[1].set(1.0, mode="bogus")
  with pytest.raises(ValueError, match="same number of dimensions"):
    tnp.take_along_axis(tnp.ones((2, 3)), np.array([0]), axis=1)
  with pytest.raises(TypeError, match="integer"):
    tnp.take(tnp.ones(3), np.array([0.5]))
  with pytest.raises(TypeError, match="start indices"):
    lax.dynamic_slice(tnp.ones((2, 3)), (0,), (1, 1))
  with pytest.raises(TypeError, match="slice_sizes"):
    lax.dynamic_slice(tnp.ones((2, 3)), (0, 0), (3, 1))
  with pytest.raises(TypeError, match="integer scalars"):
    lax.dynamic_slice(tnp.ones((2, 3)), (tnp.asarray(0.5), 0), (1, 1))
  with pytest.raises(TypeError, match="dtype"):
    lax.dynamic_update_slice(tnp.ones((2, 3)), tnp.ones((1, 1), np.int32), (0, 0))


@pytest.mark.parametrize("method", ["add", "mul", "min", "max", "set"])
@pytest.mark.parametrize("size", [1, 2])
def test_scatter_into_few_elements_applies_every_update(method, size):
  """An indexed update of a 1- or 2-element array by many indices, repeated and out of bounds (dropped): each update
  sees the ones before it (codegen/linearize.py `free_ranges`: the scatter's read of its output was hoisted out of its
  loop when its place was a constant, so `zeros(1).at[[0, 0]].add(1)` gave 1). Against a numpy loop, eager and
  jitted, in float32 and int32."""
  rng = np.random.default_rng(size)
  index = np.array([0, 0, 1, size - 1, 5, 0, -1], np.int32)
  for dtype in (np.float32, np.int32):
    base = (rng.integers(1, 4, size) if dtype == np.int32 else rng.standard_normal(size)).astype(dtype)
    updates = (rng.integers(1, 4, len(index)) if dtype == np.int32 else rng.standard_normal(len(index))).astype(dtype)
    want = base.astype(np.float64)
    for i, u in zip(index, updates.astype(np.float64)):
      if not -size <= i < size: continue
      combined = {"add": want[i] + u, "mul": want[i] * u, "min": min(want[i], u), "max": max(want[i], u), "set": u}
      want[i] = combined[method]
    update = lambda b, i, u: getattr(tnp.asarray(b).at[i], method)(u)
    for got in (update(base, index, updates), tj.jit(update)(base, index, updates)):
      if method == "set":  # (which of several updates of one place lands is unspecified, as in JAX: one of them)
        assert all(np.asarray(got)[k] in set(updates[(index % size == k) & (index < size)]) | {base[k]}
                   for k in range(size))
      else: np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5)
