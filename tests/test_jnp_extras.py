"""Order statistics, set operations, index helpers, insert/delete, interpolation and float/int decompositions of
tinyjax.numpy against numpy (float64 references), finite differences, and composed transformations."""
from __future__ import annotations

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp

RNG = np.random.default_rng(0)


def close(got, want, rtol=1e-5, atol=1e-6):
  np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------------- order statistics

@pytest.mark.parametrize("method", ["linear", "lower", "higher", "midpoint", "nearest"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, False), (0, True), ((0, 2), False), (-1, True)])
def test_quantile_matches_numpy(method, axis, keepdims):
  x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
  q = np.array([0.0, 0.1, 0.37, 0.5, 1.0])
  got = jnp.quantile(x, q, axis=axis, method=method, keepdims=keepdims)
  want = np.quantile(x.astype(np.float64), q, axis=axis, method=method, keepdims=keepdims)
  assert got.shape == want.shape and got.dtype == np.float32
  close(got, want)
  close(jnp.percentile(x, 100 * q, axis=axis, method=method, keepdims=keepdims), want, rtol=1e-4, atol=1e-5)


def test_median_nan_forms_and_dtypes():
  x = RNG.standard_normal((7, 4)).astype(np.float32)
  close(jnp.median(x), np.median(x.astype(np.float64)))
  close(jnp.median(x, axis=0), np.median(x.astype(np.float64), axis=0))
  ints = np.arange(10, dtype=np.int32)
  assert jnp.quantile(ints, 0.3).dtype == np.float32 and float(jnp.quantile(ints, 0.3)) == pytest.approx(2.7)
  assert jnp.median(np.arange(4, dtype=np.int32)).dtype == np.float32
  y = x.copy()
  y[2, 1] = y[5, 1] = np.nan
  y[:, 3] = np.nan
  assert np.isnan(np.asarray(jnp.median(y, axis=0))[[1, 3]]).all()
  with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
    want = np.nanmedian(y.astype(np.float64), axis=0)
  close(jnp.nanmedian(y, axis=0), want)
  with pytest.warns(RuntimeWarning):
    want = np.nanquantile(y.astype(np.float64), [0.2, 0.9], axis=0)
  close(jnp.nanquantile(y, np.array([0.2, 0.9]), axis=0), want)
  close(jnp.nanpercentile(y[:, :3], 40, axis=0), np.nanpercentile(y[:, :3].astype(np.float64), 40, axis=0))


def test_quantile_transformations_and_gradient():
  x = RNG.standard_normal((3, 9)).astype(np.float32)
  batched = tj.jit(tj.vmap(lambda row: jnp.median(row)))(x)
  close(batched, np.median(x.astype(np.float64), axis=1))
  close(tj.vmap(tj.jit(lambda row: jnp.quantile(row, 0.3)))(x), np.quantile(x.astype(np.float64), 0.3, axis=1))

  def f(v): return jnp.quantile(v, 0.3) * 2 + jnp.median(v)
  v = RNG.standard_normal(11)
  grad = np.asarray(tj.jit(tj.grad(f))(jnp.asarray(v.astype(np.float32))))
  numeric = np.zeros_like(v)
  for i in range(v.size):
    step = np.zeros_like(v)
    step[i] = 1e-3
    numeric[i] = (np.quantile(v + step, 0.3) * 2 + np.median(v + step) - np.quantile(v - step, 0.3) * 2 -
                  np.median(v - step)) / 2e-3
  close(grad, numeric, rtol=1e-3, atol=1e-3)


def test_average_and_ptp():
  x = RNG.standard_normal((3, 4)).astype(np.float32)
  w = RNG.random(4).astype(np.float32)
  close(jnp.average(x), np.average(x.astype(np.float64)))
  got, total = jnp.average(x, axis=1, weights=w, returned=True)
  want, want_total = np.average(x.astype(np.float64), axis=1, weights=w, returned=True)
  close(got, want)
  close(total, want_total)
  full = RNG.random((3, 4)).astype(np.float32)
  close(jnp.average(x, axis=0, weights=full, keepdims=True),
        np.average(x.astype(np.float64), axis=0, weights=full, keepdims=True))
  grad = tj.grad(lambda a: jnp.average(a, weights=full))(jnp.asarray(x))
  close(grad, full / full.sum())
  close(jnp.ptp(x, axis=0), np.ptp(x.astype(np.float64), axis=0))
  assert jnp.ptp(np.arange(5, dtype=np.int32)).dtype == np.int32
  with pytest.raises(ValueError, match="axis"):
    jnp.average(x, weights=w)
  with pytest.raises(ValueError, match="length"):
    jnp.average(x, axis=0, weights=w)


def test_quantile_errors():
  with pytest.raises(ValueError, match="method"):
    jnp.quantile(jnp.arange(4.0), 0.5, method="bad")
  with pytest.raises(ValueError, match="1-d"):
    jnp.quantile(jnp.arange(4.0), np.ones((2, 2)) / 2)


# -------------------------------------------------------------------------------------- selection and interpolation

def test_select_and_piecewise():
  x = np.linspace(-2, 2, 9).astype(np.float32)
  conditions = [x < -1, x < 1]
  close(jnp.select([jnp.asarray(c) for c in conditions], [x * 2, x ** 2], -7.0),
        np.select(conditions, [x * 2.0, x ** 2.0], -7.0))
  funcs = [lambda v: -v, lambda v: v * 10, 7.0]
  close(jnp.piecewise(x, [x < 0, x > 1], funcs), np.piecewise(x.astype(np.float64), [x < 0, x > 1], funcs))
  with pytest.raises(TypeError, match="boolean"):
    jnp.select([jnp.ones(3)], [jnp.ones(3)])


def test_interp_polyval_digitize():
  xp = np.array([0.0, 1.0, 1.5, 3.0, 4.0])
  fp = np.array([1.0, 3.0, 2.0, 0.0, 5.0])
  x = np.array([-1.0, 0.0, 0.5, 1.2, 2.9, 4.0, 9.0])
  close(jnp.interp(x, xp, fp), np.interp(x, xp, fp))
  close(jnp.interp(x, xp, fp, left=-5.0, right=9.0), np.interp(x, xp, fp, left=-5.0, right=9.0))
  angles = np.array([-170.0, 190.0, 45.0, 359.0])
  close(jnp.interp(angles, np.array([-180.0, -90, 0, 90]), np.array([0.0, 1, 2, 3]), period=360),
        np.interp(angles, [-180.0, -90, 0, 90], [0.0, 1, 2, 3], period=360), rtol=1e-5)
  grad = tj.grad(lambda f: jnp.interp(jnp.asarray(x), jnp.asarray(xp), f).sum())(jnp.asarray(fp))
  basis = np.eye(5)
  close(grad, [np.interp(x, xp, b).sum() for b in basis])  # interp is linear in fp
  p = np.array([2.0, -1.0, 0.5, 3.0])
  close(jnp.polyval(p, x), np.polyval(p, x))
  assert jnp.polyval(np.array([1, 2, 3]), 2).dtype == np.int32
  bins = np.array([0.0, 1.0, 1.0, 2.5, 4.0])
  values = np.array([-1.0, 0.0, 1.0, 2.0, 2.5, 7.0])
  for right in (False, True):
    np.testing.assert_array_equal(np.asarray(jnp.digitize(values, bins, right=right)),
                                  np.digitize(values, bins, right=right))
    np.testing.assert_array_equal(np.asarray(jnp.digitize(values, bins[::-1], right=right)),
                                  np.digitize(values, bins[::-1], right=right))
  with pytest.raises(ValueError, match="1-d"):
    jnp.digitize(values, np.ones((2, 2)))


def test_cross_trapezoid_nancumsum_partition():
  a, b = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
  close(jnp.cross(a.astype(np.float32), b.astype(np.float32)), np.cross(a, b), rtol=1e-5, atol=1e-5)
  planar = a.copy()
  planar[:, 2] = 0  # a 2-vector is a 3-vector with a zero third component
  close(jnp.cross(a[:, :2], b), np.cross(planar, b), rtol=1e-5, atol=1e-5)
  close(jnp.cross(a[:, :2], b[:, :2]), a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0], rtol=1e-5, atol=1e-5)
  close(jnp.cross(a.T, b.T, axis=0), np.cross(a.T, b.T, axis=0), rtol=1e-5, atol=1e-5)
  y, x = RNG.standard_normal((3, 6)), np.sort(RNG.random(6))
  close(jnp.trapezoid(y, x), np.trapezoid(y, x))
  close(jnp.trapezoid(y, dx=0.5, axis=0), np.trapezoid(y, dx=0.5, axis=0))
  z = np.array([1.0, np.nan, 2.0, np.nan, 3.0])
  close(jnp.nancumsum(z), np.nancumsum(z))
  close(jnp.nancumprod(z), np.nancumprod(z))
  v = RNG.permutation(11).astype(np.float32)
  for kth in (0, 4, 10, -1):
    part = np.asarray(jnp.partition(v, kth))
    assert part[kth] == np.sort(v)[kth] and (part[:kth] <= part[kth]).all() and (part[kth:] >= part[kth]).all()
    order = np.asarray(jnp.argpartition(v, kth))
    assert v[order][kth] == np.sort(v)[kth]
  with pytest.raises(ValueError, match="kth"):
    jnp.partition(v, 11)


# ---------------------------------------------------------------------------------------------- insert and delete

@pytest.mark.parametrize("obj,values,axis", [(2, [7, 8], None), ([0, 2, 2], [7, 8, 9], None), (-1, 5, None),
                                             (1, [[7], [8]], 1), ([0, 3], 9, 1), (slice(0, 3, 2), [5, 6], 1),
                                             (np.array([1]), [[4, 5, 6, 7]], 0), (1, [4, 5, 6, 7], 0)], ids=str)
def test_insert_matches_numpy(obj, values, axis):
  a = np.arange(12, dtype=np.int32).reshape(3, 4)
  got = jnp.insert(a, obj, np.asarray(values, np.int32), axis=axis)
  np.testing.assert_array_equal(np.asarray(got), np.insert(a, obj, values, axis=axis))


def test_delete_append_and_errors():
  a = np.arange(12.0).reshape(3, 4)
  for obj, axis in [(1, None), ([0, 3, 3], None), (slice(None, None, 2), 1), (-1, 0)]:
    np.testing.assert_array_equal(np.asarray(jnp.delete(a, obj, axis=axis)), np.delete(a, obj, axis=axis))
  np.testing.assert_array_equal(np.asarray(jnp.append(a, [1, 2])), np.append(a, [1, 2]))
  np.testing.assert_array_equal(np.asarray(jnp.append(a, a[:1], axis=0)), np.append(a, a[:1], axis=0))
  with pytest.raises(IndexError):
    jnp.delete(a, 12)
  with pytest.raises(IndexError):
    jnp.insert(a, 20, 1.0)
  with pytest.raises(TypeError, match="concrete"):
    tj.jit(lambda i: jnp.delete(jnp.arange(5), i))(1)
  # values inserted under jit are traced (positions concrete): gradient flows to them
  grad = tj.grad(lambda v: (jnp.insert(jnp.arange(4.0), 2, v) ** 2).sum())(3.0)
  assert float(grad) == 6.0


# --------------------------------------------------------------------------------------------------- index helpers

def test_index_helpers():
  rows, cols = jnp.triu_indices(4, 1)
  want_rows, want_cols = np.triu_indices(4, 1)
  np.testing.assert_array_equal(np.asarray(rows), want_rows)
  np.testing.assert_array_equal(np.asarray(cols), want_cols)
  for got, want in zip(jnp.tril_indices(3, -1, 5), np.tril_indices(3, -1, 5)):
    np.testing.assert_array_equal(np.asarray(got), want)
  for got, want in zip(jnp.diag_indices(3, 3), np.diag_indices(3, 3)):
    np.testing.assert_array_equal(np.asarray(got), want)
  flat = np.array([0, 5, 11, -1, 30, -20], np.int32)
  got = jnp.unravel_index(flat, (3, 4))
  # as JAX: negative indices count from the end, out-of-bounds ones clip
  want = np.unravel_index(np.clip(np.where(flat < 0, flat + 12, flat), 0, 11), (3, 4))
  for g, w in zip(got, want): np.testing.assert_array_equal(np.asarray(g), w)
  coords = (np.array([1, 2, 0]), np.array([3, 5, -1]))
  for mode in ("clip", "wrap"):
    np.testing.assert_array_equal(np.asarray(jnp.ravel_multi_index(coords, (3, 4), mode=mode)),
                                  np.ravel_multi_index(coords, (3, 4), mode=mode))
  np.testing.assert_array_equal(np.asarray(jnp.ravel_multi_index((np.array([1, 2]), np.array([3, 0])), (3, 4),
                                                                 order="F")),
                                np.ravel_multi_index((np.array([1, 2]), np.array([3, 0])), (3, 4), order="F"))
  with pytest.raises(ValueError, match="invalid entry"):
    jnp.ravel_multi_index(coords, (3, 4))
  for shape, wrap in [((5, 3), True), ((5, 3), False), ((3, 3, 3), False), ((2, 5), False)]:
    want = np.zeros(shape)
    np.fill_diagonal(want, [1, 2], wrap=wrap)
    got = jnp.fill_diagonal(jnp.zeros(shape), jnp.array([1.0, 2.0]), wrap=wrap, inplace=False)
    np.testing.assert_array_equal(np.asarray(got), want)
  with pytest.raises(NotImplementedError, match="inplace=False"):
    jnp.fill_diagonal(jnp.zeros((2, 2)), 1.0)


# -------------------------------------------------------------------------------------------------- set operations

def test_set_operations_match_numpy():
  a = np.array([5, 1, 3, 3, 9, -2, 1], np.int32)
  b = np.array([3, 4, 1, 1, 7], np.int32)
  np.testing.assert_array_equal(np.asarray(jnp.isin(a, b)), np.isin(a, b))
  np.testing.assert_array_equal(np.asarray(jnp.isin(a.reshape(7, 1), b, invert=True)), np.isin(a.reshape(7, 1), b,
                                                                                                invert=True))
  assert not np.asarray(jnp.isin(a, np.array([], np.int32))).any()
  np.testing.assert_array_equal(np.asarray(jnp.union1d(a, b)), np.union1d(a, b))
  np.testing.assert_array_equal(np.asarray(jnp.setdiff1d(a, b)), np.setdiff1d(a, b))
  np.testing.assert_array_equal(np.asarray(jnp.intersect1d(a, b)), np.intersect1d(a, b))
  for got, want in zip(jnp.intersect1d(a, b, return_indices=True), np.intersect1d(a, b, return_indices=True)):
    np.testing.assert_array_equal(np.asarray(got), want)
  floats = np.array([0.5, np.nan, 2.0, 0.5], np.float32)
  np.testing.assert_array_equal(np.asarray(jnp.isin(floats, np.array([np.nan, 2.0], np.float32))),
                                [False, False, True, False])


def test_set_operations_under_jit_with_size():
  a = np.array([3, 1, 2, 5], np.int32)
  b = np.array([2], np.int32)
  got = tj.jit(lambda x, y: jnp.setdiff1d(x, y, size=5))(a, b)
  np.testing.assert_array_equal(np.asarray(got), [1, 3, 5, 0, 0])
  got = tj.jit(lambda x, y: jnp.intersect1d(x, y, size=3, fill_value=-1))(a, np.array([5, 1, 8], np.int32))
  np.testing.assert_array_equal(np.asarray(got), [1, 5, -1])
  got = tj.jit(lambda x, y: jnp.union1d(x, y, size=6, fill_value=0))(a, np.array([9, 1], np.int32))
  np.testing.assert_array_equal(np.asarray(got), [1, 2, 3, 5, 9, 0])
  rows = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
  batched = tj.vmap(lambda r: jnp.isin(r, np.array([2, 6], np.int32)))(rows)
  np.testing.assert_array_equal(np.asarray(batched), np.isin(rows, [2, 6]))
  with pytest.raises(TypeError, match="size="):
    tj.jit(lambda x: jnp.setdiff1d(x, b))(a)


# ---------------------------------------------------------------------------------------- integer and float parts

def test_gcd_lcm():
  x = np.array([12, -8, 0, 0, 17, 2 ** 30, -36], np.int32)
  y = np.array([18, 12, 0, 5, 5, 2 ** 12 * 3, 24], np.int32)
  np.testing.assert_array_equal(np.asarray(jnp.gcd(x, y)), np.gcd(x, y))
  np.testing.assert_array_equal(np.asarray(jnp.lcm(x[:5], y[:5])), np.lcm(x[:5], y[:5]))
  np.testing.assert_array_equal(np.asarray(tj.jit(jnp.gcd)(x, y)), np.gcd(x, y))
  np.testing.assert_array_equal(np.asarray(tj.vmap(jnp.gcd, in_axes=(0, None))(x, 6)), np.gcd(x, 6))
  assert jnp.gcd(np.uint8(12), np.uint8(18)).dtype == np.uint8
  with pytest.raises(TypeError, match="integer"):
    jnp.gcd(1.5, 2.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=str)
def test_frexp_ldexp_modf(dtype):
  info = np.finfo(dtype)
  x = np.array([0.0, -0.0, 3.0, -0.3, 1.0, info.max, info.tiny, info.tiny / 8, -info.tiny / 2, 1e-3, np.inf, -np.inf,
                np.nan], dtype)
  mantissa, exponent = jnp.frexp(x)
  want_mantissa, want_exponent = np.frexp(x)
  assert mantissa.dtype == dtype and exponent.dtype == np.int32
  np.testing.assert_array_equal(np.asarray(mantissa), want_mantissa)
  np.testing.assert_array_equal(np.asarray(exponent)[~np.isinf(x) & ~np.isnan(x)],
                                want_exponent[~np.isinf(x) & ~np.isnan(x)])
  # the round trip is exact, except that kernels flush float32 subnormals to zero as XLA's do (JAX's ldexp gives 0
  # there too); float16 is computed in float32, where its subnormals are normal numbers
  subnormal = (np.abs(x) < info.tiny) & (x != 0) & (dtype == np.float32)
  flushed = np.where(subnormal, np.copysign(np.zeros_like(x), x), x)
  np.testing.assert_array_equal(np.asarray(jnp.ldexp(mantissa, exponent)), flushed)
  n = np.array([0, 3, -3, 200, -200, 1, 0, 40, -40, 1, 0, 2, 5], np.int32)
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(np.asarray(jnp.ldexp(x, n))[~subnormal], np.ldexp(x, n)[~subnormal])
  assert jnp.ldexp(np.array([1, 2], np.int32), 3).dtype == np.float32
  fraction, whole = jnp.modf(np.array([2.5, -2.5, -0.0, 7.0], dtype))
  np.testing.assert_array_equal(np.asarray(fraction), [0.5, -0.5, 0.0, 0.0])
  np.testing.assert_array_equal(np.asarray(whole), [2.0, -2.0, -0.0, 7.0])
  assert np.isnan(np.asarray(jnp.modf(np.array([np.inf], dtype))[0])).all()  # JAX: inf - inf
  with pytest.raises(TypeError, match="integer"):
    jnp.ldexp(1.0, 2.5)
