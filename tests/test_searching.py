"""Searching and counting: nonzero / argwhere / one-argument where / unique on concrete arrays, searchsorted,
bincount and histogram against numpy, under jit and vmap, and their errors."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp

RNG = np.random.default_rng(3)


def test_nonzero_argwhere_where_flatnonzero():
  mask = RNG.standard_normal((6, 7)) > 0.5
  for got, want in zip(tnp.nonzero(mask), np.nonzero(mask)):
    assert got.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), want)
  np.testing.assert_array_equal(np.asarray(tnp.argwhere(mask)), np.argwhere(mask))
  np.testing.assert_array_equal(np.asarray(tnp.flatnonzero(mask)), np.flatnonzero(mask))
  np.testing.assert_array_equal(np.asarray(tnp.where(tnp.asarray(mask))[1]), np.nonzero(mask)[1])
  np.testing.assert_array_equal(np.asarray(tnp.nonzero(np.array([0, 1, 1]), size=4, fill_value=-1)[0]), [1, 2, -1, -1])
  np.testing.assert_array_equal(np.asarray(tnp.nonzero(np.array([1, 1, 1]), size=2)[0]), [0, 1])
  assert tnp.argwhere(np.array(3)).shape == (1, 0)
  with pytest.raises(ValueError, match="0d"):
    tnp.nonzero(np.array(1))
  with pytest.raises(tj.ConcretizationTypeError, match="nonzero"):
    tj.jit(tnp.nonzero)(tnp.ones(3))
  with pytest.raises(ValueError, match="both or neither"):
    tnp.where(mask, 1.0)


def test_unique_matches_numpy():
  host = np.array([3, 1, 3, 2, 1, 7], np.int32)
  np.testing.assert_array_equal(np.asarray(tnp.unique(host)), np.unique(host))
  got = tnp.unique(host, return_index=True, return_inverse=True, return_counts=True)
  for g, w in zip(got, np.unique(host, return_index=True, return_inverse=True, return_counts=True)):
    np.testing.assert_array_equal(np.asarray(g), w)
  np.testing.assert_array_equal(np.asarray(tnp.unique(host, size=6)), [1, 2, 3, 7, 1, 1])
  np.testing.assert_array_equal(np.asarray(tnp.unique(host, size=2)), [1, 2])
  floats = np.array([1.5, np.nan, 1.5, np.nan], np.float32)
  np.testing.assert_array_equal(np.asarray(tnp.unique(floats)), [1.5, np.nan])


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_searchsorted_matches_numpy(side, dtype):
  if dtype == np.float32:
    a = np.sort(RNG.standard_normal(37)).astype(dtype)
    a[5] = a[6]
    a[-3:] = np.nan  # NaN sorts last
    v = np.concatenate([a[:10], RNG.standard_normal(20), [np.nan, -np.inf, np.inf]]).astype(dtype)
  else:
    a = np.sort(RNG.integers(0, 50, 33)).astype(dtype)
    v = RNG.integers(0, 60, 25).astype(dtype)
  np.testing.assert_array_equal(np.asarray(tnp.searchsorted(a, v, side=side)), np.searchsorted(a, v, side=side))
  got = tj.jit(lambda x, y: tnp.searchsorted(x, y, side=side))(tnp.asarray(a), tnp.asarray(v.reshape(-1, 1)))
  np.testing.assert_array_equal(np.asarray(got), np.searchsorted(a, v, side=side).reshape(-1, 1))
  sorter = RNG.permutation(len(a))
  shuffled = np.sort(a)[np.argsort(sorter)]
  np.testing.assert_array_equal(np.asarray(tnp.searchsorted(shuffled, v, side=side, sorter=np.argsort(shuffled))),
                                np.searchsorted(shuffled, v, side=side, sorter=np.argsort(shuffled)))


def test_searchsorted_edge_sizes_vmap_and_errors():
  assert np.asarray(tnp.searchsorted(np.zeros(0, np.float32), np.array([1.0]))).tolist() == [0]
  assert np.asarray(tnp.searchsorted(np.array([2.0]), np.array([1.0, 2.0, 3.0]))).tolist() == [0, 0, 1]
  tables = np.sort(RNG.standard_normal((3, 9)).astype(np.float32), axis=1)
  values = RNG.standard_normal((3, 4)).astype(np.float32)
  got = tj.vmap(tnp.searchsorted)(tnp.asarray(tables), tnp.asarray(values))
  np.testing.assert_array_equal(np.asarray(got), np.stack([np.searchsorted(t, v) for t, v in zip(tables, values)]))
  with pytest.raises(ValueError, match="1-dimensional"):
    tnp.searchsorted(tnp.ones((2, 2)), 1.0)
  with pytest.raises(ValueError, match="side"):
    tnp.searchsorted(tnp.ones(2), 1.0, side="middle")


def test_bincount():
  x = np.array([0, 3, 3, 1, -2, 9])
  np.testing.assert_array_equal(np.asarray(tnp.bincount(x)), np.bincount(np.clip(x, 0, None)))
  np.testing.assert_array_equal(np.asarray(tnp.bincount(x, length=4)), [2, 1, 0, 2])  # 9 is dropped, as JAX
  np.testing.assert_array_equal(np.asarray(tnp.bincount(x, minlength=12)), np.bincount(np.clip(x, 0, None),
                                                                                       minlength=12))
  weights = RNG.standard_normal(6).astype(np.float32)
  np.testing.assert_allclose(np.asarray(tnp.bincount(x, weights)), np.bincount(np.clip(x, 0, None), weights),
                             rtol=1e-6)
  jitted = tj.jit(lambda v: tnp.bincount(v, length=10))(tnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(jitted), np.bincount(np.clip(x, 0, None), minlength=10))
  grad = tj.grad(lambda w: (tnp.bincount(x, w, length=5) ** 2).sum())(tnp.asarray(weights))
  sums = np.bincount(np.clip(x, 0, None), weights, minlength=10)
  np.testing.assert_allclose(np.asarray(grad), [2 * sums[i] if i < 5 else 0 for i in np.clip(x, 0, None)], rtol=1e-5)
  with pytest.raises(TypeError, match="integer"):
    tnp.bincount(np.array([0.5]))
  with pytest.raises(tj.ConcretizationTypeError, match="length"):
    tj.jit(tnp.bincount)(tnp.asarray(x))


def test_histogram_matches_numpy():
  data = RNG.standard_normal(1000).astype(np.float32)
  for kwargs in [{"bins": 7}, {"bins": np.array([-1.0, 0.0, 0.5, 3.0])}, {"bins": 5, "range": (-1, 1)},
                 {"bins": 4, "density": True}, {"bins": 3, "weights": data}]:
    counts, edges = tnp.histogram(data, **kwargs)
    want_counts, want_edges = np.histogram(data, **kwargs)
    np.testing.assert_allclose(np.asarray(counts), want_counts, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(edges), want_edges, rtol=1e-6, atol=1e-6)
  counts, edges = tnp.histogram(np.full(4, 2.0, np.float32), 2)
  np.testing.assert_array_equal(np.asarray(counts), np.histogram(np.full(4, 2.0), 2)[0])
  jitted = tj.jit(lambda d: tnp.histogram(d, 6)[0])(tnp.asarray(data))
  np.testing.assert_array_equal(np.asarray(jitted), np.histogram(data, 6)[0])
  with pytest.raises(ValueError, match="positive"):
    tnp.histogram(data, 0)


def test_traced_nonzero_unique_and_repeat_with_static_sizes():
  mask = np.array([[0, 3, 0], [1, 0, 2]])
  rows, cols = tj.jit(lambda v: tnp.nonzero(v, size=5, fill_value=-1))(mask)
  np.testing.assert_array_equal(np.asarray(rows), [0, 1, 1, -1, -1])
  np.testing.assert_array_equal(np.asarray(cols), [1, 0, 2, -1, -1])
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: tnp.argwhere(v, size=2))(mask)), [[0, 1], [1, 0]])
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: tnp.flatnonzero(v, size=4))(mask)), [1, 3, 5, 0])
  np.testing.assert_array_equal(np.asarray(tj.vmap(lambda v: tnp.nonzero(v, size=2)[0])(mask)), [[1, 0], [0, 2]])
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: tnp.where(v > 0, size=3)[1])(mask)), [1, 0, 2])
  unique = tj.jit(lambda v: tnp.unique(v, size=5))(np.array([3, 1, 3, 2, 1]))
  np.testing.assert_array_equal(np.asarray(unique), [1, 2, 3, 1, 1])  # padded with the smallest, as JAX
  floats = tj.jit(lambda v: tnp.unique(v, size=3, fill_value=-1.0))(np.array([2.0, np.nan, 2.0, np.nan], np.float32))
  np.testing.assert_array_equal(np.asarray(floats), [2.0, np.nan, -1.0])
  np.testing.assert_array_equal(np.asarray(tnp.repeat(np.arange(3), np.array([2, 0, 3]))), [0, 0, 2, 2, 2])
  got = tj.jit(lambda r: tnp.repeat(tnp.arange(6).reshape(3, 2), r, axis=0, total_repeat_length=5))(np.array([1, 2, 1]))
  np.testing.assert_array_equal(np.asarray(got), [[0, 1], [2, 3], [2, 3], [4, 5], [4, 5]])  # the last one repeats
  with pytest.raises(tj.ConcretizationTypeError, match="total_repeat_length"):
    tj.jit(lambda r: tnp.repeat(tnp.arange(3), r))(np.array([1, 2, 1]))


@pytest.mark.parametrize("values", [np.array([3, 1, 3, 2, 1, 3, 7], np.int32),
                                    np.array([[2.0, np.nan, 0.5], [np.nan, 2.0, -1.0]], np.float32),
                                    np.array([5], np.int32)])
@pytest.mark.parametrize("size", [1, 3, 8])
def test_traced_unique_returns_index_inverse_and_counts(values, size):
  """`unique(..., size=)` of a traced array with return_index, return_inverse and return_counts (JAX's rules):
  against numpy's for the groups that fit, the rest padded (values with the smallest one, or `fill_value`; indices
  with the smallest one's first position; counts with 0), the inverse in the input's shape; one compilation for
  every input of a shape, and per row under vmap as a loop over the rows."""
  want = np.unique(values, return_index=True, return_inverse=True, return_counts=True, equal_nan=True)
  fun = tj.jit(lambda v: tnp.unique(v, return_index=True, return_inverse=True, return_counts=True, size=size))
  got = [np.asarray(r) for r in fun(values)]
  kept, pad = min(size, len(want[0])), max(size - len(want[0]), 0)
  np.testing.assert_array_equal(got[0], np.concatenate([want[0][:kept], [want[0][0]] * pad]))
  np.testing.assert_array_equal(got[1], np.concatenate([want[1][:kept], [want[1][0]] * pad]))
  np.testing.assert_array_equal(got[2], want[2].reshape(values.shape))
  np.testing.assert_array_equal(got[3], np.concatenate([want[3][:kept], [0] * pad]))
  assert got[1].dtype == got[2].dtype == got[3].dtype == np.int32 and got[0].dtype == values.dtype
  filled, counts = tj.jit(lambda v: tnp.unique(v, return_counts=True, size=size, fill_value=9))(values)
  np.testing.assert_array_equal(np.asarray(filled)[kept:], [9] * pad)
  np.testing.assert_array_equal(np.asarray(counts), got[3])
  fun(values + 1)
  assert fun._cache_size() == 1
  rows = values.reshape(1, -1).repeat(2, axis=0)
  rows[1] = rows[1][::-1]
  batched = tj.vmap(lambda v: tnp.unique(v, return_counts=True, return_inverse=True, size=size))(rows)
  for i, row in enumerate(rows):
    single = tj.jit(lambda v: tnp.unique(v, return_counts=True, return_inverse=True, size=size))(row)
    for b, s in zip(batched, single): np.testing.assert_array_equal(np.asarray(b)[i], np.asarray(s))
  with pytest.raises(NotImplementedError, match="axis"):
    tj.jit(lambda v: tnp.unique(v, size=2, axis=0))(values)
