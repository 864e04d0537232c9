"""Sorting (lax.sort, sort_key_val, top_k; jnp sort, argsort, lexsort) and cumulative reductions (cumsum, cumprod,
cummax, cummin, cumulative_sum/prod; lax forms) against numpy, with gradients, vmap, jit and errors."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax

RNG = np.random.default_rng(5)


CASES = [(n, np.float32) for n in (1, 2, 3, 7, 16, 33, 300)] + [(n, dtype) for n in (5, 33)
                                                                 for dtype in (np.int32, np.uint8, np.int8, np.float16)]


@pytest.mark.parametrize("n,dtype", CASES, ids=[f"{n}-{np.dtype(d).name}" for n, d in CASES])
def test_sort_and_argsort_match_numpy(n, dtype):
  if np.dtype(dtype).kind == "f":
    host = RNG.standard_normal((3, n)).astype(dtype)
    host[0, ::3] = np.nan
    host[1, ::2] = 0.5  # ties
    host[2, :2] = [-0.0, 0.0][:min(n, 2)]
  else:
    host = RNG.integers(0, 6, (3, n)).astype(dtype)
  x = tnp.asarray(host)
  np.testing.assert_array_equal(np.asarray(tnp.sort(x)), np.sort(host, axis=-1))
  np.testing.assert_array_equal(np.asarray(tnp.argsort(x)), np.argsort(host, axis=-1, kind="stable"))
  np.testing.assert_array_equal(np.asarray(tnp.sort(x, axis=0)), np.sort(host, axis=0))
  np.testing.assert_array_equal(np.asarray(tnp.argsort(x, axis=None)), np.argsort(host, axis=None, kind="stable"))
  descending = np.asarray(tnp.argsort(x, descending=True))
  # stable descending (as JAX): ties keep their original order
  np.testing.assert_array_equal(descending, np.stack([np.lexsort((np.arange(n), -_rank(row))) for row in host]))


def _rank(row):
  """Dense ranks with NaN largest, for building the descending reference."""
  order = np.argsort(row, kind="stable")
  ranks = np.empty(len(row))
  sorted_row = row[order]
  current = 0
  for i in range(len(row)):
    if i and not (sorted_row[i] == sorted_row[i - 1] or (np.isnan(sorted_row[i]) and np.isnan(sorted_row[i - 1]))):
      current += 1
    ranks[order[i]] = current
  return ranks


def test_multi_operand_sort_top_k_lexsort():
  keys = RNG.integers(0, 4, 50).astype(np.int32)
  values = RNG.standard_normal(50).astype(np.float32)
  sorted_keys, sorted_values = lax.sort_key_val(tnp.asarray(keys), tnp.asarray(values))
  order = np.argsort(keys, kind="stable")
  np.testing.assert_array_equal(np.asarray(sorted_keys), keys[order])
  np.testing.assert_array_equal(np.asarray(sorted_values), values[order])
  second = RNG.integers(0, 3, 50).astype(np.int32)
  by_two = lax.sort((tnp.asarray(keys), tnp.asarray(second), tnp.asarray(values)), num_keys=2)
  order = np.lexsort((second, keys))
  np.testing.assert_array_equal(np.asarray(by_two[2]), values[order])
  np.testing.assert_array_equal(np.asarray(tnp.lexsort((tnp.asarray(second), tnp.asarray(keys)))), order)
  host = np.array([[1.0, 3.0, 3.0, np.nan, 2.0], [0.0, -1.0, 5.0, 5.0, 4.0]], np.float32)
  top, indices = lax.top_k(tnp.asarray(host), 3)
  np.testing.assert_array_equal(np.asarray(indices), [[3, 1, 2], [2, 3, 4]])  # NaN largest, ties in order
  np.testing.assert_array_equal(np.asarray(top)[1], [5.0, 5.0, 4.0])


def test_sorting_gradients_vmap_and_jit():
  host = RNG.standard_normal((4, 9)).astype(np.float32)
  weights = tnp.asarray(np.arange(9.0, dtype=np.float32))
  grad = tj.grad(lambda v: (tnp.sort(v) * weights).sum())(tnp.asarray(host[0]))
  np.testing.assert_array_equal(np.asarray(grad), np.argsort(np.argsort(host[0])).astype(np.float32))  # the rank
  batched = tj.jit(tj.vmap(tj.grad(lambda v: (lax.top_k(v, 3)[0] ** 2).sum())))(tnp.asarray(host))
  for row, got in zip(host, np.asarray(batched)):
    want = np.zeros(9, np.float32)
    top3 = np.argsort(-row, kind="stable")[:3]
    want[top3] = 2 * row[top3]
    np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(tj.vmap(tnp.argsort)(tnp.asarray(host))), np.argsort(host, axis=1,
                                                                                                 kind="stable"))


@pytest.mark.parametrize("fn", ["cumsum", "cumprod", "cummax", "cummin"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_cumulative_reductions_match_numpy(fn, axis):
  host = RNG.uniform(0.5, 1.5, (5, 37)).astype(np.float32)
  host[2, 7] = np.nan
  reference = {"cumsum": np.cumsum, "cumprod": np.cumprod, "cummax": np.fmax.accumulate,
               "cummin": np.fmin.accumulate}[fn]
  got = np.asarray(getattr(tnp, fn)(tnp.asarray(host), axis=axis))
  if fn in ("cummax", "cummin"):  # NaN propagates (as JAX), numpy's fmax ignores it: compare before the NaN
    want = reference(host.ravel() if axis is None else host, axis=0 if axis is None else axis)
    mask = ~np.isnan(np.cumsum(host.ravel() if axis is None else host, axis=0 if axis is None else axis))
    np.testing.assert_array_equal(got[mask], want[mask])
    assert np.isnan(got[~mask]).all()
  else:
    want = reference(host.astype(np.float64), axis=axis)
    np.testing.assert_allclose(got, want, rtol=2e-6, equal_nan=True)


def test_cumulative_dtypes_forms_and_gradients():
  assert tnp.cumsum(np.array([True, True, False])).dtype == np.int32
  # JAX 0.10.2's dtypes: cumsum/cumprod keep narrow integers; the array API's cumulative_sum widens them as sum does
  assert tnp.cumsum(np.arange(5, dtype=np.uint8)).dtype == np.uint8
  assert tnp.cumsum(np.arange(5, dtype=np.int8)).dtype == np.int8
  assert tnp.cumprod(np.arange(5, dtype=np.int16)).dtype == np.int16
  assert tnp.cumulative_sum(np.arange(5, dtype=np.uint8)).dtype == np.uint32
  assert tnp.cumulative_sum(np.arange(5, dtype=np.int8)).dtype == np.int32
  assert tnp.cumulative_prod(np.arange(5, dtype=np.uint8)).dtype == np.uint8
  with tj.config.override("jax_enable_x64", True):
    assert tnp.cumulative_sum(np.arange(5, dtype=np.uint8)).dtype == np.uint64
  assert tnp.cumsum(tnp.ones(3, tnp.bfloat16)).dtype == tnp.bfloat16
  np.testing.assert_array_equal(np.asarray(tnp.cumsum(np.arange(300, dtype=np.int32))), np.cumsum(np.arange(300)))
  np.testing.assert_array_equal(np.asarray(lax.cumsum(tnp.arange(5.0), reverse=True)), [10, 10, 9, 7, 4])
  np.testing.assert_array_equal(np.asarray(lax.cummax(tnp.asarray([1, 3, 2, 5, 4]), axis=0)), [1, 3, 3, 5, 5])
  np.testing.assert_array_equal(np.asarray(tnp.cumulative_sum(tnp.arange(4), include_initial=True)), [0, 0, 1, 3, 6])
  np.testing.assert_array_equal(np.asarray(tnp.cumulative_prod(tnp.arange(1, 4), include_initial=True)), [1, 1, 2, 6])
  grad = tj.grad(lambda v: (tnp.cumsum(v) ** 2).sum())(tnp.arange(4.0))
  np.testing.assert_array_equal(np.asarray(grad), [20, 20, 18, 12])
  host = RNG.uniform(0.5, 1.5, 6).astype(np.float32)
  grad = tj.grad(lambda v: tnp.cumprod(v).sum())(tnp.asarray(host))
  eps, numeric = 1e-3, []
  for i in range(6):
    step = np.zeros(6, np.float64)
    step[i] = eps
    numeric.append((np.cumprod(host + step).sum() - np.cumprod(host - step).sum()) / (2 * eps))
  np.testing.assert_allclose(np.asarray(grad), numeric, rtol=1e-3)
  batched = tj.vmap(tnp.cumsum)(tnp.asarray(np.arange(12.0).reshape(3, 4)))
  np.testing.assert_array_equal(np.asarray(batched), np.cumsum(np.arange(12.0).reshape(3, 4), axis=1))


def test_sorting_errors():
  with pytest.raises(ValueError, match="k argument"):
    lax.top_k(tnp.ones(3), 4)
  with pytest.raises(TypeError, match="same shape"):
    lax.sort((tnp.ones(3), tnp.ones(4)))
  with pytest.raises(ValueError, match="num_keys"):
    lax.sort((tnp.ones(3), tnp.ones(3)), num_keys=3)
  with pytest.raises(ValueError, match="out of bounds"):
    tnp.sort(tnp.ones(3), axis=2)
  with pytest.raises(ValueError, match="axis must be specified"):
    tnp.cumulative_sum(tnp.ones((2, 2)))


def _total_order_top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """numpy reference for JAX's top_k: the IEEE total order (NaN above +inf, a sign-bit NaN below -inf, -0.0 below
  0.0), largest first, ties by lower index."""
  bits = x.astype(np.float32).view(np.int32).astype(np.int64)
  key = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
  order = np.argsort(-key, axis=-1, kind="stable")[..., :k]
  return np.take_along_axis(x, order, axis=-1), order.astype(np.int32)


@pytest.mark.parametrize("k", [0, 1, 5, 16, 17])
def test_top_k_by_selection_matches_the_total_order(k):
  """top_k of at most TOP_K_SELECT entries picks them one at a time (no sorting network: no `sort` in the program),
  more sorts: the same values and indices as JAX's (NaNs of both signs, signed zeros, infinities, ties), for float32,
  bfloat16 and int32; gradients scatter into the picked places; vmap and jit agree with eager."""
  import ml_dtypes
  from tinyjax.lax._sort import TOP_K_SELECT
  rng = np.random.default_rng(k)
  x = rng.integers(-4, 5, (6, 40)).astype(np.float32)  # (ties)
  neg_nan = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
  x[0, :6] = [np.nan, neg_nan, np.inf, -np.inf, 0.0, -0.0]
  x[1, 10:14] = [-0.0, 0.0, -0.0, np.nan]
  for array in (x, x.astype(ml_dtypes.bfloat16), np.nan_to_num(x, posinf=99, neginf=-99).astype(np.int32)):
    values, indices = lax.top_k(array, k)
    want_values, want_indices = _total_order_top_k(array.astype(np.float32), k)
    np.testing.assert_array_equal(np.asarray(indices), want_indices)
    np.testing.assert_array_equal(np.asarray(values, np.float32).view(np.int32),
                                  want_values.astype(array.dtype).astype(np.float32).view(np.int32))
  text = str(tj.make_jaxpr(lambda a: lax.top_k(a, k))(x))
  selected = "sort[" not in text and "scan" not in text
  assert selected == (k <= TOP_K_SELECT)
  finite = rng.standard_normal((6, 40)).astype(np.float32)
  weights = rng.standard_normal((6, k)).astype(np.float32)
  grad = tj.grad(lambda a: (lax.top_k(a, k)[0] * weights).sum())(finite)
  expected = np.zeros_like(finite)
  np.put_along_axis(expected, _total_order_top_k(finite, k)[1].astype(np.int64), weights, axis=-1)
  np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-6)
  batched = tj.jit(tj.vmap(lambda a: lax.top_k(a, k)))(finite)
  np.testing.assert_array_equal(np.asarray(batched[1]), np.asarray(lax.top_k(finite, k)[1]))


def test_eager_sort_and_quantile_are_one_node(monkeypatch):
  """An eager sort is one `sort` primitive node (its network's scan traced where the program is lowered, not at each
  call) and a median or quantile one `quantile` node; values against numpy (NaN last, ties), gradients through the
  decomposition, and jaxprs that print `sort[...]` as JAX's do."""
  from tinyjax.trace import core, sharding_types
  from tinyjax.uop import Ops
  monkeypatch.setattr(sharding_types, "_enabled", [False])
  monkeypatch.setattr(core, "_sharding_enabled", sharding_types._enabled)
  rng = np.random.default_rng(11)
  x = rng.integers(-5, 5, (3, 37)).astype(np.float32)
  x[1, 4] = np.nan
  ordered = tnp.sort(tnp.asarray(x), axis=1)
  assert ordered.uop.op is Ops.PRIMITIVE and ordered.uop.arg.prim.name == "sort"  # (jnp.sort's staged call)
  np.testing.assert_array_equal(np.asarray(ordered), np.sort(x, axis=1))
  median = tnp.median(tnp.asarray(x[::2]), axis=1)
  assert median.uop.op is Ops.PRIMITIVE and median.uop.arg.prim.name == "quantile"
  np.testing.assert_allclose(np.asarray(median), np.median(x[::2].astype(np.float64), axis=1), rtol=1e-6)
  q = tnp.quantile(tnp.asarray(x), tnp.asarray([0.1, 0.5, 0.9]), axis=0, keepdims=True)
  np.testing.assert_allclose(np.asarray(q), np.quantile(x.astype(np.float64), [0.1, 0.5, 0.9], axis=0,
                                                        keepdims=True), rtol=1e-6)
  assert "sort[" in str(tj.make_jaxpr(lambda a: tnp.sort(a))(x))
  smooth = rng.standard_normal(9)
  with tj.config.override("jax_enable_x64", True):
    grad = np.asarray(tj.grad(lambda a: tnp.median(a))(tnp.asarray(smooth)))
  expected = np.zeros(9)
  expected[np.argsort(smooth)[4]] = 1.0
  np.testing.assert_allclose(grad, expected)
