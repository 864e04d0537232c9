"""The rest of jax.numpy's functions in tinyjax.numpy: composed ufuncs (nan_to_num, float_power, spacing, sinc, i0,
...), array manipulation (compress, choose, block, put_along_axis, ...), vectorize and the vmap-built helpers, index
tricks, statistics (cov, corrcoef, gradient, histograms), window functions, polynomials and the dtype names; against
numpy (float64 references), JAX's dtypes and errors, finite differences and composed transformations."""
from __future__ import annotations

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from gradcheck import numeric_grad

RNG = np.random.default_rng(7)


def close(got, want, rtol=1e-6, atol=1e-6):
  got = np.asarray(got)
  np.testing.assert_allclose(got.astype(np.complex128 if got.dtype.kind == "c" else np.float64), want, rtol=rtol,
                             atol=atol)


def same(got, want):
  """Equal values, shape and dtype."""
  got = np.asarray(got)
  assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, (got.shape, got.dtype)
  np.testing.assert_array_equal(got, want)


@pytest.fixture
def x64():
  with tj.config.override("jax_enable_x64", True):
    yield


# ------------------------------------------------------------------------------------------------- composed ufuncs

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_nan_to_num(dtype):
  x = np.array([0.0, np.nan, 1.5, np.inf, -2.0, -np.inf], dtype)
  with tj.config.override("jax_enable_x64", dtype == np.float64):
    same(jnp.nan_to_num(x), np.nan_to_num(x))
    same(jnp.nan_to_num(x, nan=-1.0, posinf=9.0, neginf=-9.0), np.nan_to_num(x, nan=-1.0, posinf=9.0, neginf=-9.0))
  same(jnp.nan_to_num(np.arange(3, dtype=np.int32)), np.arange(3, dtype=np.int32))
  assert not tj.dtypes.is_weakly_typed(jnp.nan_to_num(1.0))  # (as JAX: the constants are strongly typed)
  z = np.array([complex(np.inf, np.nan), complex(1, -np.inf)], np.complex64)
  same(jnp.nan_to_num(z, nan=2.0), np.nan_to_num(z, nan=2.0))


def test_float_power_dtypes_and_gradient(x64):
  same(jnp.float_power(np.arange(4, dtype=np.int64), 2), np.float_power(np.arange(4), 2))  # int64 -> float64
  same(jnp.float_power(np.arange(4, dtype=np.int32), 2), np.arange(4.0, dtype=np.float32) ** 2)  # int32 -> float32
  assert jnp.float_power(np.ones(2, np.float32), 2).dtype == np.float32
  assert jnp.float_power(np.ones(2, np.float16), 2).dtype == np.float16
  weak = jnp.float_power(2, 3)
  assert float(weak) == 8.0 and weak.dtype == np.float64 and tj.dtypes.is_weakly_typed(weak)
  x = RNG.uniform(0.5, 2.0, 5)

  def f(v): return jnp.sum(jnp.float_power(v, 2.5) + jnp.float_power(1.5, v))
  close(tj.grad(f)(x), numeric_grad(lambda v: f(jnp.asarray(v)), x, 1e-6), rtol=1e-7)


def test_float_power_without_x64():
  same(jnp.float_power(np.arange(4, dtype=np.int32), 2), np.float_power(np.arange(4), 2).astype(np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_divmod(dtype):
  a = np.array([-7, -3, -2, 0, 3, 8], dtype)
  b = np.array([2, 2, -3, 5, -2, 3], dtype)
  quotient, remainder = jnp.divmod(a, b)
  want_q, want_r = np.divmod(a, b)
  same(quotient, want_q)
  same(remainder, want_r)


def test_copy_and_iterable():
  x = jnp.arange(3.0)
  same(jnp.copy(x), np.arange(3.0, dtype=np.float32))
  same(jnp.copy([1, 2]), np.array([1, 2], np.int32))
  assert tj.dtypes.is_weakly_typed(jnp.copy(1.0))
  assert jnp.iterable([1]) and jnp.iterable(x) and not jnp.iterable(jnp.float32(1)) and not jnp.iterable(2)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_spacing(dtype):
  x = np.array([0.0, 1.0, -1.0, 0.25, 1e4, -3.5, np.inf, np.nan], dtype)
  with tj.config.override("jax_enable_x64", dtype == np.float64):
    got = jnp.spacing(x)
    negative_zero = jnp.spacing(np.array([-0.0], dtype))
  assert got.dtype == dtype
  with np.errstate(invalid="ignore"):
    want = np.spacing(x)
  np.testing.assert_array_equal(np.asarray(got), want)
  if dtype != np.float16:  # (JAX: -0.0 gives minus the smallest subnormal; numpy gives plus)
    same(negative_zero, -np.array([np.finfo(dtype).smallest_subnormal], dtype))
  assert jnp.spacing(3).dtype == np.float32
  with pytest.raises(ValueError, match="complex"):
    jnp.spacing(np.array([1j], np.complex64))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.uint32, np.bool_])
def test_bitwise_count(dtype):
  x = np.array([0, 1, 3, 7, 100, -1, -128, 127]).astype(dtype)
  same(jnp.bitwise_count(x), np.bitwise_count(x))
  same(jnp.bitwise_count(7), np.uint8(3))
  with pytest.raises(TypeError):
    jnp.bitwise_count(1.5)


def test_isposinf_isneginf():
  x = np.array([np.inf, -np.inf, np.nan, 0.0, 1.0], np.float32)
  same(jnp.isposinf(x), np.isposinf(x))
  same(jnp.isneginf(x), np.isneginf(x))
  same(jnp.isposinf(np.arange(3)), np.zeros(3, bool))
  with pytest.raises(ValueError, match="complex"):
    jnp.isneginf(np.array([1j], np.complex64))


def test_sinc_values_and_derivatives(x64):
  x = np.array([0.0, 1e-9, 0.01, 0.031, 0.032, 0.5, -1.0, 2.5, -7.25])
  close(jnp.sinc(x), np.sinc(x), rtol=1e-15, atol=1e-16)
  assert jnp.sinc(x.astype(np.float32)).dtype == np.float32
  assert jnp.sinc(np.arange(3, dtype=np.int64)).dtype == np.float64
  # JAX's derivatives at 0: 0, -pi^2/3, 0, pi^4/5
  derivative = jnp.sinc
  for want in (0.0, -np.pi ** 2 / 3, 0.0, np.pi ** 4 / 5):
    derivative = tj.grad(derivative)
    close(derivative(0.0), want, rtol=1e-12, atol=1e-12)
  points = np.array([-0.7, 0.02, 0.3, 1.5])
  grads = tj.jit(tj.vmap(tj.grad(jnp.sinc)))(points)
  close(grads, [numeric_grad(lambda v: np.sinc(v), np.array(p), 1e-6) for p in points], rtol=1e-7, atol=1e-9)


def test_sinc_float32_matches_numpy():
  x = RNG.uniform(-4, 4, 50).astype(np.float32)
  close(jnp.sinc(x), np.sinc(x.astype(np.float64)), rtol=1e-5, atol=2e-7)


def test_i0(x64):
  x = np.array([0.0, 0.5, -1.0, 3.0, 7.9, 8.0, 8.1, 20.0, -35.0, 300.0])
  close(jnp.i0(x), np.i0(x), rtol=1e-14)
  x32 = x[:-1].astype(np.float32)
  with tj.config.override("jax_enable_x64", False):
    got = jnp.i0(x32)
    assert got.dtype == np.float32
    close(got, np.i0(x[:-1]), rtol=1e-6)
  points = np.array([-2.0, 0.3, 5.0, 9.0])
  close(tj.vmap(tj.grad(jnp.i0))(points), [numeric_grad(np.i0, np.array(p), 1e-6) for p in points], rtol=1e-8)
  assert float(tj.grad(jnp.i0)(0.0)) == 0.0


# ------------------------------------------------------------------------------------------------- products, grids

def test_matvec_vecmat():
  a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
  v = RNG.standard_normal(4).astype(np.float32)
  close(jnp.matvec(a, v), np.matvec(a.astype(np.float64), v), rtol=1e-5, atol=1e-6)
  w = RNG.standard_normal((5, 1, 3)).astype(np.float32)
  close(jnp.vecmat(w, a), np.vecmat(w.astype(np.float64), a), rtol=1e-5, atol=1e-6)
  z = np.array([1j, 2 - 1j], np.complex64)
  m = np.array([[1, 2j], [3, 4]], np.complex64)
  close(jnp.vecmat(z, m), np.vecmat(z, m))  # (the vector conjugated)
  close(jnp.matvec(m, z), np.matvec(m, z))
  assert jnp.matvec(np.ones((2, 2), np.int32), np.ones(2, np.float16)).dtype == np.float16
  with pytest.raises(ValueError, match="inconsistent size"):
    jnp.matvec(a, np.ones(3))
  with pytest.raises(ValueError, match="enough dimensions"):
    jnp.matvec(np.ones(3), np.ones(3))


@pytest.mark.parametrize("endpoint", [True, False])
def test_logspace_geomspace(endpoint):
  close(jnp.logspace(0, 3, 7, endpoint=endpoint), np.logspace(0, 3, 7, endpoint=endpoint), rtol=1e-6)
  close(jnp.logspace(1, 2, 4, base=2.0, endpoint=endpoint), np.logspace(1, 2, 4, base=2.0, endpoint=endpoint))
  close(jnp.geomspace(1, 1000, 4, endpoint=endpoint), np.geomspace(1, 1000, 4, endpoint=endpoint), rtol=1e-6)
  close(jnp.geomspace(-2, -32, 5, endpoint=endpoint), np.geomspace(-2, -32, 5, endpoint=endpoint), rtol=1e-6)
  start, stop = np.array([1.0, 2.0]), np.array([10.0, 200.0])
  close(jnp.geomspace(start, stop, 3, axis=1), np.geomspace(start, stop, 3, axis=1), rtol=1e-6)
  close(jnp.logspace(start, stop / 100, 3, axis=-1), np.logspace(start, stop / 100, 3, axis=-1), rtol=1e-5)
  same(jnp.logspace(0, 2, 3, dtype=np.int32), np.array([1, 10, 100], np.int32))
  assert jnp.logspace(0, 2, 3).dtype == np.float32


def test_index_tricks():
  same(jnp.mgrid[0:3, 0:2], np.mgrid[0:3, 0:2].astype(np.int32))
  close(jnp.mgrid[0:1:5j], np.mgrid[0:1:5j])
  close(jnp.mgrid[-1:1:0.5, 0:3], np.mgrid[-1:1:0.5, 0:3])
  for got, want in zip(jnp.ogrid[0:3, 1:5:2], np.ogrid[0:3, 1:5:2]): same(got, want.astype(np.int32))
  same(jnp.r_[np.array([1, 2]), 0, 0, np.array([4, 5])], np.array([1, 2, 0, 0, 4, 5], np.int32))
  close(jnp.r_[-1:1:5j, 0, 1], np.r_[-1:1:5j, 0, 1])
  same(jnp.r_["0,2", [1, 2, 3], [4, 5, 6]], np.r_["0,2", [1, 2, 3], [4, 5, 6]].astype(np.int32))
  same(jnp.r_["-1,2,0", [1, 2, 3], [4, 5, 6]], np.r_["-1,2,0", [1, 2, 3], [4, 5, 6]].astype(np.int32))
  same(jnp.r_["r", [1, 2, 3], [4, 5, 6]], np.array([[1, 2, 3, 4, 5, 6]], np.int32))  # (numpy: a matrix)
  same(jnp.r_["c", [1, 2, 3]], np.array([[1], [2], [3]], np.int32))
  same(jnp.c_[np.array([1, 2, 3]), np.array([4, 5, 6])],
       np.c_[np.array([1, 2, 3]), np.array([4, 5, 6])].astype(np.int32))
  same(jnp.c_[np.array([[1, 2, 3]]), 0, 0, np.array([[4, 5, 6]])],
       np.c_[np.array([[1, 2, 3]]), 0, 0, np.array([[4, 5, 6]])].astype(np.int32))
  assert tj.dtypes.is_weakly_typed(jnp.r_[1.5, 2])
  with pytest.raises(ValueError, match="directive"):
    jnp.r_["x", 1]
  assert jnp.s_[1:3, ::2] == np.s_[1:3, ::2] and jnp.index_exp[2] == (2,)
  x = np.arange(20, dtype=np.int32).reshape(4, 5)
  rows, cols = jnp.ix_(np.array([0, 3]), np.array([1, 2, 4]))
  same(jnp.asarray(x)[rows, cols], x[np.ix_([0, 3], [1, 2, 4])])
  with pytest.raises(NotImplementedError):
    jnp.ix_(np.array([True, False]))
  with pytest.raises(ValueError, match="1-dimensional"):
    jnp.ix_(np.ones((2, 2), int))
  for got, want in zip(jnp.mask_indices(4, jnp.triu, 1), np.mask_indices(4, np.triu, 1)):
    same(got, want.astype(np.int32))
  rows, _ = tj.jit(lambda: jnp.mask_indices(3, jnp.tril, size=7))()
  same(rows, np.array([0, 1, 1, 2, 2, 2, 0], np.int32))


# ------------------------------------------------------------------------------------------------- manipulation

def test_diagflat_ediff1d_array_equiv():
  for k in (-2, 0, 1):
    same(jnp.diagflat(np.array([[1, 2], [3, 4]]), k), np.diagflat(np.array([[1, 2], [3, 4]]), k).astype(np.int32))
  x = np.array([[1, 2], [3, 7]], np.int32)
  same(jnp.ediff1d(x), np.ediff1d(x))
  same(jnp.ediff1d(x, to_end=np.array([1.5]), to_begin=np.array([9, 9])), np.array([9, 9, 1, 1, 4, 1], np.int32))
  same(jnp.ediff1d(np.array([1.0, 2.0, 4.0], np.float32), to_begin=-1), np.array([-1, 1, 2], np.float32))
  with pytest.raises(TypeError):
    jnp.ediff1d([1, 2])
  assert bool(jnp.array_equiv(np.array([1, 2]), np.array([[1, 2], [1, 2]])))
  assert not bool(jnp.array_equiv(np.array([1, 2]), np.array([[1, 2, 3]])))
  assert not bool(jnp.array_equiv(np.array([np.nan]), np.array([np.nan])))
  assert bool(tj.jit(jnp.array_equiv)(np.ones(3), np.ones((2, 1))))


def test_compress_and_extract():
  a = np.arange(12).reshape(4, 3)
  condition = np.array([True, False, True, True])
  for axis in (0, None):
    same(jnp.compress(condition, a, axis=axis), np.compress(condition, a, axis=axis).astype(np.int32))
  same(jnp.compress([0, 1], a, axis=1), np.compress([0, 1], a, axis=1).astype(np.int32))
  same(jnp.compress(condition, a, axis=0, size=4, fill_value=-1),
       np.concatenate([a[condition], np.full((1, 3), -1)]).astype(np.int32))
  with pytest.raises(ValueError, match="out of bounds"):
    jnp.compress(np.ones(14), np.arange(12))
  with pytest.raises(ValueError, match="1D"):
    jnp.compress(np.ones((1, 2)), np.arange(12))
  with pytest.raises(tj.ConcretizationTypeError):
    tj.jit(lambda c: jnp.compress(c, a, axis=0))(condition)
  got = tj.jit(lambda c: jnp.compress(c, a, axis=0, size=2))(condition)
  same(got, a[condition][:2].astype(np.int32))
  mask = a % 3 == 0
  same(jnp.extract(mask, a), np.extract(mask, a).astype(np.int32))
  same(tj.jit(lambda m: jnp.extract(m, a, size=6, fill_value=99))(mask),
       np.array([0, 3, 6, 9, 99, 99], np.int32))


def test_choose():
  choices = [np.arange(4), 10 + np.arange(4), 20 + np.arange(4)]
  index = np.array([0, 1, 2, 1])
  same(jnp.choose(index, choices), np.choose(index, choices).astype(np.int32))
  wild = np.array([0, 5, -1, 3])
  for mode in ("wrap", "clip"):
    same(jnp.choose(wild, choices, mode=mode), np.choose(wild, choices, mode=mode).astype(np.int32))
    same(tj.jit(lambda i, mode=mode: jnp.choose(i, choices, mode=mode))(wild),
         np.choose(wild, choices, mode=mode).astype(np.int32))
  broadcast = jnp.choose(np.array([[0], [1]]), [np.arange(3, dtype=np.int32), 5.0])
  same(broadcast, np.array([[0, 1, 2], [5, 5, 5]], np.float32))
  assert not tj.dtypes.is_weakly_typed(broadcast)
  with pytest.raises(ValueError, match="invalid entry"):
    jnp.choose(wild, choices)
  with pytest.raises(tj.ConcretizationTypeError, match="mode='wrap'"):
    tj.jit(lambda i: jnp.choose(i, choices))(index)
  with pytest.raises(ValueError, match="not understood"):
    jnp.choose(index, choices, mode="bad")
  with pytest.raises(ValueError, match="integer"):
    jnp.choose(np.array([0.0]), choices)


@pytest.mark.parametrize("shape", [(2, 4), (7,), (3, 3, 2), (0,), ()])
def test_resize(shape):
  same(jnp.resize(np.arange(5), shape), np.resize(np.arange(5), shape).astype(np.int32))
  same(jnp.resize(np.zeros(0, np.float32), 3), np.zeros(3, np.float32))
  with pytest.raises(ValueError, match="non-negative"):
    jnp.resize(np.arange(5), (-1,))


@pytest.mark.parametrize("axis,start", [(3, 1), (-1, -3), (0, 4), (2, 0), (1, 1)])
def test_rollaxis(axis, start):
  x = np.zeros((2, 3, 4, 5))
  assert jnp.rollaxis(x, axis, start).shape == np.rollaxis(x, axis, start).shape
  with pytest.raises(ValueError, match="start"):
    jnp.rollaxis(x, 0, 5)


def test_trim_zeros():
  x = np.array([0, 0, 1, 2, 0, 3, 0])
  for trim in ("fb", "f", "b", "F"):
    same(jnp.trim_zeros(x, trim), np.trim_zeros(x, trim).astype(np.int32))
  same(jnp.trim_zeros(x, "x"), x.astype(np.int32))  # (JAX: nothing to trim; numpy raises)
  same(jnp.trim_zeros(np.zeros(3, np.float32)), np.zeros(0, np.float32))
  grid = np.zeros((4, 5), np.float32)
  grid[1, 2] = grid[2, 3] = 1
  got = jnp.trim_zeros(grid)
  same(got, grid[1:3, 2:4])
  same(jnp.trim_zeros(grid, axis=0), grid[1:3])
  with pytest.raises(tj.ConcretizationTypeError):
    tj.jit(jnp.trim_zeros)(x)


def test_vander():
  x = np.array([1, 2, 3])
  for n in (None, 0, 2, 4):
    for increasing in (False, True):
      same(jnp.vander(x, n, increasing), np.vander(x, n, increasing).astype(np.int32))
  close(jnp.vander(np.array([0.5, -1.5, 2.0]), 5), np.vander(np.array([0.5, -1.5, 2.0]), 5))
  with pytest.raises(ValueError, match="one-dimensional"):
    jnp.vander(np.ones((2, 2)))
  with pytest.raises(ValueError, match="nonnegative"):
    jnp.vander(np.ones(2), -1)


def test_block():
  a, b = np.eye(2, dtype=np.float32), np.zeros((2, 1), np.float32)
  same(jnp.block([[a, b], [np.ones((1, 3), np.float32)]]), np.block([[a, b], [np.ones((1, 3), np.float32)]]))
  same(jnp.block([np.ones(2, np.float32), 3, np.zeros(1, np.float32)]), np.array([1, 1, 3, 0], np.float32))
  same(jnp.block([[1, 2], [3, 4]]), np.block([[1, 2], [3, 4]]).astype(np.int32))
  cube = np.arange(8.0).reshape(2, 2, 2)
  close(jnp.block([[[cube], [cube]], [[cube], [cube]]]), np.block([[[cube], [cube]], [[cube], [cube]]]))
  for bad, message in ((([1, 2],), "tuples"), ([], "empty"), ([[1, 2], 3], "depths")):
    with pytest.raises(ValueError, match=message):
      jnp.block(bad)


def test_put_along_axis():
  x = np.arange(12).reshape(3, 4)
  index = np.array([[0], [2], [3]])
  want = x.copy()
  np.put_along_axis(want, index, 99, axis=1)
  same(jnp.put_along_axis(x, index, 99, axis=1, inplace=False), want.astype(np.int32))
  want = x.copy()
  np.put_along_axis(want, np.array([1, 7]), np.array([-1, -2]), axis=None)
  same(jnp.put_along_axis(x, np.array([1, 7]), np.array([-1, -2]), axis=None, inplace=False), want.astype(np.int32))
  column = np.argmax(x, axis=0, keepdims=True)
  same(tj.jit(lambda m: jnp.put_along_axis(m, column, 0, axis=0, inplace=False))(x),
       np.where(np.arange(3)[:, None] == 2, 0, x).astype(np.int32))
  with pytest.raises(ValueError, match="inplace=False"):
    jnp.put_along_axis(x, index, 99, axis=1)
  with pytest.raises(ValueError, match="same ndim"):
    jnp.put_along_axis(x, np.array([0]), 99, axis=1, inplace=False)
  x = np.ones((2, 3), np.float32)
  grad = tj.grad(lambda m: jnp.sum(jnp.put_along_axis(m, np.array([[1], [0]]), 5.0, axis=1, inplace=False) * 2))(x)
  same(grad, np.array([[2, 0, 2], [0, 2, 2]], np.float32))


def test_setxor1d():
  a, b = np.array([5, 1, 2, 3, 3, 9]), np.array([2, 5, 7, 7])
  same(jnp.setxor1d(a, b), np.setxor1d(a, b).astype(np.int32))
  same(tj.jit(lambda p, q: jnp.setxor1d(p, q, size=5, fill_value=-1))(a, b), np.array([1, 3, 7, 9, -1], np.int32))
  same(jnp.setxor1d(np.zeros(0), np.zeros(0)), np.zeros(0, np.float32))


# ------------------------------------------------------------------------------------------------- functional

def test_vectorize_elementwise_and_excluded():
  def add(a, b): return a + b
  same(jnp.vectorize(add)(np.arange(3), np.arange(3)[:, None]), (np.arange(3) + np.arange(3)[:, None]).astype(np.int32))
  power = jnp.vectorize(lambda x, p: x ** p, excluded={1})
  close(power(np.arange(3.0), 2), np.arange(3.0) ** 2)
  keyword = jnp.vectorize(lambda x, *, scale: x * scale, excluded={"scale"})
  close(keyword(np.arange(3.0), scale=2.0), 2 * np.arange(3.0))
  with pytest.raises(TypeError, match="exclude"):
    jnp.vectorize(add, excluded={1.5})
  with pytest.raises(ValueError, match="negative"):
    jnp.vectorize(add, excluded={-1})


def test_vectorize_signature():
  dot = jnp.vectorize(jnp.dot, signature="(n),(n)->()")
  a, b = RNG.standard_normal((2, 1, 3)).astype(np.float32), RNG.standard_normal((4, 3)).astype(np.float32)
  got = dot(a, b)
  assert got.shape == (2, 4)
  close(got, np.einsum("ijk,jk->ij", a.astype(np.float64), b), rtol=1e-5)
  two = jnp.vectorize(lambda v: (v.sum(), v * 2), signature="(n)->(),(n)")
  total, doubled = two(np.ones((2, 3), np.float32))
  same(total, np.full(2, 3.0, np.float32))
  same(doubled, np.full((2, 3), 2.0, np.float32))
  matmul = jnp.vectorize(jnp.matmul, signature="(m,k),(k,n)->(m,n)")
  x, y = RNG.standard_normal((5, 2, 3)), RNG.standard_normal((3, 4))
  close(matmul(x, y), x @ y, rtol=1e-5, atol=1e-5)
  for args, message in (((np.ones((2, 3)), np.ones(4)), "inconsistent size"),
                        ((np.ones(()), np.ones(4)), "enough dimensions")):
    with pytest.raises(ValueError, match=message):
      dot(*args)
  with pytest.raises(ValueError, match="does not match core dimensions"):
    jnp.vectorize(lambda v: v, signature="(n)->()")(np.ones((2, 3)))
  with pytest.raises(ValueError, match="not a valid gufunc signature"):
    jnp.vectorize(lambda v: v, signature="(n->()")(np.ones(3))
  with pytest.raises(TypeError, match="wrong number of positional"):
    dot(np.ones(3))


def test_vectorize_gradient_and_jit(x64):
  def norm(v): return jnp.sqrt(jnp.sum(v * v))
  batched = jnp.vectorize(norm, signature="(n)->()")
  x = RNG.standard_normal((3, 4))

  def f(m): return jnp.sum(batched(m) ** 2) + jnp.sum(jnp.vectorize(jnp.sin)(m[0]))
  close(tj.jit(tj.grad(f))(x), numeric_grad(lambda m: f(jnp.asarray(m)), x, 1e-6), rtol=1e-6, atol=1e-8)


def test_apply_along_and_over_axes():
  x = np.arange(24.0).reshape(2, 3, 4)
  for axis in (0, 1, 2, -1):
    close(jnp.apply_along_axis(jnp.sum, axis, x), np.apply_along_axis(np.sum, axis, x))
    close(jnp.apply_along_axis(lambda v: jnp.outer(v, v), axis, x),
          np.apply_along_axis(lambda v: np.outer(v, v), axis, x))
  close(jnp.apply_along_axis(lambda v, p: v ** p, 1, x, 2), x ** 2)
  close(jnp.apply_over_axes(jnp.sum, x, [0, 2]), np.apply_over_axes(np.sum, x, [0, 2]))
  close(jnp.apply_over_axes(lambda a, axis: jnp.cumsum(a, axis), x, [1]), np.cumsum(x, 1))
  with pytest.raises(ValueError, match="correct shape"):
    jnp.apply_over_axes(lambda a, axis: jnp.sum(a), x, [0])


def test_fromfunction():
  same(jnp.fromfunction(lambda i, j: i + 2 * j, (2, 3)),
       np.fromfunction(lambda i, j: i + 2 * j, (2, 3)).astype(np.float32))
  same(jnp.fromfunction(lambda i, j: i * j, (3, 2), dtype=np.int32),
       np.arange(3, dtype=np.int32)[:, None] * np.arange(2, dtype=np.int32))


# ------------------------------------------------------------------------------------------------- statistics

M = np.array([[1.0, 2, 4, 7, 3], [0, 1, 0, 3, -2], [5, 2, 2, 1, 0.5]])


@pytest.mark.parametrize("kwargs", [{}, {"rowvar": False}, {"bias": True}, {"ddof": 2},
                                    {"fweights": np.array([1, 2, 1, 3, 1])},
                                    {"aweights": np.array([0.5, 1.0, 2.0, 1.0, 0.25])},
                                    {"fweights": np.array([1, 2, 1, 3, 1]), "aweights": np.array([0.5, 1, 2, 1, 3.0])},
                                    {"ddof": 0, "aweights": np.array([0.5, 1.0, 2.0, 1.0, 0.25])}])
def test_cov_matches_numpy(kwargs, x64):
  close(jnp.cov(M, **kwargs), np.cov(M, **kwargs), rtol=1e-13, atol=1e-13)
  # (float64 aweights promote the result; integer fweights don't, in JAX's lattice)
  assert jnp.cov(M.astype(np.float32), **kwargs).dtype == (np.float64 if "aweights" in kwargs else np.float32)


def test_cov_forms_and_corrcoef(x64):
  close(jnp.cov(M[0]), np.cov(M[0]), rtol=1e-14)
  assert jnp.cov(M[0]).shape == ()
  close(jnp.cov(M[0], M[1]), np.cov(M[0], M[1]), rtol=1e-14)
  close(jnp.cov(M.T, M[:1].T, rowvar=False), np.cov(M.T, M[:1].T, rowvar=False), rtol=1e-14)
  assert jnp.cov(np.array([[1, 2, 4], [3, 1, 0]], np.int32)).dtype == np.float32
  assert jnp.cov(np.zeros((0, 3))).shape == (0, 0)
  close(jnp.corrcoef(M), np.corrcoef(M), rtol=1e-14, atol=1e-15)
  close(jnp.corrcoef(M[0], M[2]), np.corrcoef(M[0], M[2]), rtol=1e-14, atol=1e-15)
  close(jnp.corrcoef(M[0]), 1.0)
  z = M[:2] + 1j * M[1:]
  close(jnp.cov(z), np.cov(z), rtol=1e-13, atol=1e-13)
  close(jnp.corrcoef(z), np.corrcoef(z), rtol=1e-13, atol=1e-13)
  with pytest.raises(ValueError, match="more than 2"):
    jnp.cov(np.ones((2, 2, 2)))
  with pytest.raises(TypeError, match="fweights must be integer"):
    jnp.cov(M, fweights=np.ones(5))
  with pytest.raises(RuntimeError, match="incompatible"):
    jnp.cov(M, aweights=np.ones(4))


def test_cov_corrcoef_gradients(x64):
  x = RNG.standard_normal((3, 6))
  weights = np.array([0.5, 1.0, 2.0, 1.0, 0.25, 3.0])

  def f(m): return jnp.sum(jnp.cov(m, aweights=weights) ** 2) + jnp.sum(jnp.corrcoef(m)[0] * np.array([0, 1.5, -2]))
  close(tj.jit(tj.grad(f))(x), numeric_grad(lambda m: f(jnp.asarray(m)), x, 1e-6), rtol=1e-6, atol=1e-8)
  batched = tj.vmap(tj.jit(lambda m: jnp.cov(m)))(np.stack([x, 2 * x]))
  close(batched, np.stack([np.cov(x), np.cov(2 * x)]), rtol=1e-13)


@pytest.mark.parametrize("shape", [(2,), (7,), (4, 5), (3, 2, 4)])
def test_gradient_matches_numpy(shape, x64):
  f = RNG.standard_normal(shape)
  got, want = jnp.gradient(f), np.gradient(f)
  for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, tuple) else [want]):
    close(g, w, rtol=1e-13, atol=1e-13)
  close(jnp.gradient(f, 0.5, axis=-1), np.gradient(f, 0.5, axis=-1), rtol=1e-13, atol=1e-13)
  coordinates = np.cumsum(RNG.uniform(0.1, 1.0, shape[0]))
  close(jnp.gradient(f, coordinates, axis=0), np.gradient(f, coordinates, axis=0), rtol=1e-12, atol=1e-12)


def test_gradient_forms_errors_and_derivative(x64):
  f = RNG.standard_normal((4, 5))
  for got, want in zip(jnp.gradient(f, 2.0, np.linspace(0, 1, 5)), np.gradient(f, 2.0, np.linspace(0, 1, 5))):
    close(got, want, rtol=1e-12, atol=1e-12)
  assert jnp.gradient(np.array([1, 4, 9, 16], np.int32)).dtype == np.float32
  with pytest.raises(ValueError, match="too small"):
    jnp.gradient(np.ones(1))
  with pytest.raises(NotImplementedError):
    jnp.gradient(f, edge_order=2)
  with pytest.raises(TypeError, match="spacing arguments"):
    jnp.gradient(f, 1.0, 2.0, 3.0)
  with pytest.raises(ValueError, match="same length"):
    jnp.gradient(f, np.arange(3.0), axis=1)
  coordinates = np.array([0.0, 0.3, 1.0, 1.2, 2.0])

  def loss(v): return jnp.sum(jnp.gradient(jnp.sin(v), coordinates) ** 2)
  v = RNG.standard_normal(5)
  close(tj.grad(loss)(v), numeric_grad(lambda w: loss(jnp.asarray(w)), v, 1e-6), rtol=1e-6, atol=1e-8)


def test_unwrap(x64):
  phase = np.cumsum(RNG.uniform(-3, 3, 20))
  wrapped = np.angle(np.exp(1j * phase))
  close(jnp.unwrap(wrapped), np.unwrap(wrapped), rtol=1e-13, atol=1e-12)
  close(jnp.unwrap(wrapped, discont=4.0), np.unwrap(wrapped, discont=4.0), rtol=1e-13, atol=1e-12)
  grid = np.stack([wrapped, wrapped[::-1]])
  close(jnp.unwrap(grid, axis=0), np.unwrap(grid, axis=0), rtol=1e-13, atol=1e-12)
  same(jnp.unwrap(np.array([0, 5, 9, 2, 7], np.int32), period=10), np.array([0, 5, 9, 12, 17], np.int32))
  close(jnp.unwrap(np.array([0.0, 170, 350, 10]), period=360), np.unwrap(np.array([0.0, 170, 350, 10]), period=360))
  assert jnp.unwrap(np.arange(3, dtype=np.int32)).dtype == np.float64  # (int32 with a weak float: x64's float)
  with pytest.raises(ValueError, match="complex"):
    jnp.unwrap(np.array([1j], np.complex64))


@pytest.mark.parametrize("name", ["bartlett", "blackman", "hamming", "hanning"])
@pytest.mark.parametrize("size", [0, 1, 2, 7, 16])
def test_windows(name, size, x64):
  got = getattr(jnp, name)(size)
  assert got.dtype == np.float64 and got.shape == (size,)
  close(got, getattr(np, name)(size), rtol=1e-14, atol=1e-15)
  with tj.config.override("jax_enable_x64", False):
    assert getattr(jnp, name)(size).dtype == np.float32


@pytest.mark.parametrize("size,beta", [(1, 2.0), (6, 3.5), (11, 0.0), (20, 14.0)])
def test_kaiser(size, beta, x64):
  close(jnp.kaiser(size, beta), np.kaiser(size, beta), rtol=1e-13, atol=1e-15)
  with tj.config.override("jax_enable_x64", False):
    close(tj.jit(jnp.kaiser, static_argnums=0)(size, beta), np.kaiser(size, beta), rtol=2e-6, atol=1e-7)


def test_histogram_bin_edges_and_2d():
  x = np.array([0.1, 0.5, 0.5, 0.9, 2.0, 2.5], np.float32)
  y = np.array([1.0, 0, 3, 2, 2, 0], np.float32)
  close(jnp.histogram_bin_edges(x, 4), np.histogram_bin_edges(x.astype(np.float64), 4))
  close(jnp.histogram_bin_edges(x, 3, range=(0, 3)), np.histogram_bin_edges(x, 3, range=(0, 3)))
  close(jnp.histogram_bin_edges(np.ones(3), 2), np.histogram_bin_edges(np.ones(3), 2))
  close(jnp.histogram_bin_edges(x, np.array([0, 1, 3])), [0, 1, 3])
  assert jnp.histogram_bin_edges(np.arange(5), 2).dtype == np.float32
  with pytest.raises(NotImplementedError):
    jnp.histogram_bin_edges(x, "auto")
  for kwargs in ({"bins": 3}, {"bins": [2, np.array([0.0, 1, 3])]}, {"bins": np.array([0.0, 1.5, 3])},
                 {"bins": 2, "density": True}, {"bins": 2, "weights": np.arange(6.0, dtype=np.float32)},
                 {"bins": 2, "range": [(0, 1), None]}):
    numpy_kwargs = dict(kwargs, range=[(0, 1), (0, 3)]) if "range" in kwargs else kwargs
    hist, x_edges, y_edges = jnp.histogram2d(x, y, **kwargs)
    want, want_x, want_y = np.histogram2d(x.astype(np.float64), y.astype(np.float64), **numpy_kwargs)
    close(hist, want, rtol=1e-5)
    close(x_edges, want_x)
    close(y_edges, want_y)
  assert jnp.histogram2d(x, y)[0].dtype == np.int32
  with pytest.raises(ValueError, match="pairs or Nones"):
    jnp.histogram2d(x, y, range=[(0, 1)])


def test_histogramdd():
  sample = RNG.standard_normal((50, 3)).astype(np.float32)
  hist, edges = jnp.histogramdd(sample, bins=(2, 3, 4))
  want, want_edges = np.histogramdd(sample.astype(np.float64), bins=(2, 3, 4))
  same(hist, want.astype(np.int32))
  for got, wanted in zip(edges, want_edges): close(got, wanted, rtol=1e-6)
  weights = RNG.uniform(0, 1, 50).astype(np.float32)
  hist, _ = tj.jit(lambda s, w: jnp.histogramdd(s, bins=3, weights=w, density=True))(sample, weights)
  close(hist, np.histogramdd(sample.astype(np.float64), bins=3, weights=weights, density=True)[0], rtol=1e-4)
  with pytest.raises(ValueError, match="bin for each dimension"):
    jnp.histogramdd(sample, bins=(2, 3))
  with pytest.raises(ValueError, match="one weight for each sample"):
    jnp.histogramdd(sample, weights=np.ones(3))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_packbits_unpackbits(axis, bitorder):
  bits = RNG.integers(0, 2, (3, 13))
  packed = jnp.packbits(bits, axis=axis, bitorder=bitorder)
  same(packed, np.packbits(bits, axis=axis, bitorder=bitorder))
  same(jnp.packbits(bits.astype(bool), axis=axis, bitorder=bitorder), np.packbits(bits, axis=axis, bitorder=bitorder))
  data = RNG.integers(0, 256, (2, 3)).astype(np.uint8)
  for count in (None, 3, 20):
    same(jnp.unpackbits(data, axis=axis, count=count, bitorder=bitorder),
         np.unpackbits(data, axis=axis, count=count, bitorder=bitorder))
  length = bits.size if axis is None else bits.shape[axis]
  roundtrip = tj.jit(lambda b: jnp.unpackbits(jnp.packbits(b, axis=axis, bitorder=bitorder), axis=axis, count=length,
                                              bitorder=bitorder))(bits)
  same(roundtrip, (bits.ravel() if axis is None else bits).astype(np.uint8))


def test_packbits_errors():
  with pytest.raises(TypeError, match="integer or boolean"):
    jnp.packbits(np.ones(3))
  with pytest.raises(TypeError, match="unsigned byte"):
    jnp.unpackbits(np.array([2], np.int32))
  with pytest.raises(ValueError, match="'little' or 'big'"):
    jnp.packbits(np.ones(3, np.int32), bitorder="x")


# ------------------------------------------------------------------------------------------------- polynomials

P = np.array([2.0, -3.0, 0.5, 4.0])
Q = np.array([1.5, -1.0])


def test_poly_arithmetic(x64):
  close(jnp.poly(np.array([1.0, 2.0, -3.0])), np.poly([1.0, 2.0, -3.0]), rtol=1e-14)
  close(jnp.poly(np.array([[1.0, 2.0], [3.0, 4.0]])), np.poly(np.array([[1.0, 2.0], [3.0, 4.0]])), rtol=1e-12)
  same(jnp.poly(np.zeros(0)), np.float64(1.0))
  for got, want in ((jnp.polyadd(P, Q), np.polyadd(P, Q)), (jnp.polyadd(Q, P), np.polyadd(Q, P)),
                    (jnp.polysub(P, Q), np.polysub(P, Q)), (jnp.polysub(Q, P), np.polysub(Q, P)),
                    (jnp.polymul(P, Q), np.polymul(P, Q))):
    close(got, want, rtol=1e-14)
  same(jnp.polyadd(np.array([1, 2], np.int32), np.array([3, 4, 5], np.int32)), np.array([3, 5, 7], np.int32))
  assert jnp.polymul(np.array([1, 2], np.int32), np.array([3, 4], np.int32)).dtype == np.float32  # (JAX: int32 -> f32)
  close(jnp.polymul(np.array([0.0, 1, 2]), np.array([0.0, 3, 4]), trim_leading_zeros=True), np.polymul([1, 2], [3, 4]))
  quotient, remainder = jnp.polydiv(P, Q)
  want_q, want_r = np.polydiv(P, Q)
  close(quotient, want_q, rtol=1e-14)
  close(remainder[-want_r.size:], want_r, rtol=1e-13, atol=1e-14)
  assert remainder.shape == P.shape  # (JAX keeps the leading zeros)
  quotient, remainder = jnp.polydiv(np.array([1.0, 2, 3, 4]), np.array([1.0, 1]), trim_leading_zeros=True)
  close(remainder, np.polydiv([1.0, 2, 3, 4], [1.0, 1])[1])


@pytest.mark.parametrize("m", [0, 1, 2, 4])
def test_polyder_polyint(m, x64):
  close(jnp.polyder(P, m), np.polyder(P, m), rtol=1e-14)
  close(jnp.polyint(P, m), np.polyint(P, m), rtol=1e-14)
  if m:
    constants = np.arange(1.0, m + 1)
    close(jnp.polyint(P, m, k=constants), np.polyint(P, m, k=constants), rtol=1e-14)
    close(jnp.polyint(P, m, k=2.5), np.polyint(P, m, k=2.5), rtol=1e-14)
    close(jnp.polyder(jnp.polyint(P, m), m), P, rtol=1e-14)
  assert jnp.polyder(np.array([1, 2, 3], np.int32)).dtype == np.float32
  with pytest.raises(ValueError, match="positive"):
    jnp.polyder(P, -1)
  with pytest.raises(ValueError, match="positive"):
    jnp.polyint(P, -1)
  with pytest.raises(ValueError, match="length 1 or m"):
    jnp.polyint(P, 2, k=np.ones(3))


def test_polyfit(x64):
  x = np.linspace(0, 2, 9)
  y = 1 + 2 * x - x ** 2 + 0.1 * np.sin(5 * x)
  for deg in (0, 1, 2, 3):
    close(jnp.polyfit(x, y, deg), np.polyfit(x, y, deg), rtol=1e-10, atol=1e-12)
  weights = np.arange(1.0, 10.0)
  columns = np.stack([y, 2 * y - x], 1)
  close(jnp.polyfit(x, columns, 2, w=weights), np.polyfit(x, columns, 2, w=weights), rtol=1e-10, atol=1e-12)
  got, want = jnp.polyfit(x, y, 2, full=True), np.polyfit(x, y, 2, full=True)
  for g, w in zip(got, want): close(g, w, rtol=1e-9, atol=1e-12)
  for cov in (True, "unscaled"):
    (coefficients, covariance), (want_c, want_cov) = jnp.polyfit(x, y, 2, cov=cov), np.polyfit(x, y, 2, cov=cov)
    close(coefficients, want_c, rtol=1e-10)
    close(covariance, want_cov, rtol=1e-8, atol=1e-14)
  with pytest.raises(ValueError, match="deg"):
    jnp.polyfit(x, y, -1)
  with pytest.raises(TypeError, match="same length"):
    jnp.polyfit(x, y[:-1], 1)
  # the fit is linear in y: its gradient is the pseudo-inverse's row sums
  fit = tj.jit(lambda values: jnp.sum(jnp.polyfit(x, values, 2) * np.array([1.0, -2.0, 0.5])))
  close(tj.grad(fit)(y), numeric_grad(lambda v: fit(jnp.asarray(v)), y, 1e-6), rtol=1e-6, atol=1e-9)


def _sorted_roots(r):
  r = np.asarray(r)
  return r[np.lexsort((np.round(r.imag, 6), np.round(r.real, 6)))]


@pytest.mark.parametrize("p", [[1.0, -6, 11, -6], [0.0, 0, 1, -3, 2], [1.0, 0, 1], [2.0, -1, 0, 0], [3.0], [1.0, 5]])
def test_roots(p, x64):
  p = np.array(p)
  got, want = jnp.roots(p), np.roots(p)
  assert got.dtype == np.complex128 and got.shape == want.shape
  close(_sorted_roots(got), _sorted_roots(want), rtol=1e-10, atol=1e-10)


def test_roots_without_stripping_and_under_jit():
  p = np.array([0.0, 0.0, 1.0, -3.0, 2.0], np.float32)
  got = np.asarray(tj.jit(lambda c: jnp.roots(c, strip_zeros=False))(p))
  assert got.dtype == np.complex64 and got.shape == (4,)
  close(np.sort_complex(got[:2]), [1.0, 2.0], rtol=1e-5)
  assert np.isnan(got[2:]).all()
  with pytest.raises(tj.ConcretizationTypeError, match="strip_zeros=False"):
    tj.jit(jnp.roots)(p)
  assert jnp.roots(np.array([1, 0, -4], np.int32)).dtype == np.complex64


# ------------------------------------------------------------------------------------------------- dtype names, I/O

def test_dtype_names_and_abstract_types(x64):
  for name, dtype in (("float_", np.float64), ("double", np.float64), ("single", np.float32), ("int_", np.int64),
                      ("uint", np.uint64), ("csingle", np.complex64), ("cdouble", np.complex128)):
    assert np.dtype(getattr(jnp, name)) == dtype and getattr(jnp, name)(1).dtype == dtype
  assert jnp.issubdtype(jnp.bfloat16, jnp.floating) and jnp.issubdtype(jnp.float8_e4m3fn, jnp.inexact)
  assert jnp.issubdtype(jnp.arange(3.0).dtype, jnp.floating) and not jnp.issubdtype(np.int32, jnp.floating)
  assert jnp.issubdtype(np.int8, jnp.signedinteger) and not jnp.issubdtype(np.uint8, jnp.signedinteger)
  assert jnp.issubdtype(np.uint16, jnp.unsignedinteger) and jnp.issubdtype(np.uint16, jnp.integer)
  assert jnp.issubdtype(np.complex64, jnp.number) and jnp.issubdtype(np.bool_, jnp.generic)
  assert not jnp.issubdtype(np.float32, jnp.character) and jnp.issubdtype(np.str_, jnp.flexible)
  assert jnp.object_ is np.object_ and issubclass(jnp.ComplexWarning, RuntimeWarning)


def test_print_options_and_text():
  x = jnp.arange(3.0) / 3
  with jnp.printoptions(precision=2):
    assert jnp.array_str(x) == "[0.   0.33 0.67]" and jnp.get_printoptions()["precision"] == 2
  assert "0.33333" in jnp.array_str(x)
  assert jnp.array_repr(jnp.arange(3)) == "Array([0, 1, 2], dtype=int32)"  # (numpy's, calling the array's repr)


def test_frombuffer_fromstring_fromiter():
  same(jnp.frombuffer(b"\x01\x02\x03\x04", dtype=np.uint8, count=3, offset=1), np.array([2, 3, 4], np.uint8))
  same(jnp.frombuffer(np.arange(3, dtype=np.int16).tobytes(), dtype=np.int16), np.arange(3, dtype=np.int16))
  same(jnp.fromstring("1, 2, 3", dtype=np.int32, sep=","), np.array([1, 2, 3], np.int32))
  same(jnp.fromstring("1.5 2", sep=" "), np.array([1.5, 2], np.float32))
  with pytest.raises(NotImplementedError, match="np.fromiter"):
    jnp.fromiter(iter([1, 2]), float)


def test_load_save(tmp_path):
  path = tmp_path / "x.npy"
  jnp.save(path, jnp.arange(4, dtype=jnp.bfloat16))
  loaded = jnp.load(path)
  assert isinstance(loaded, tj.Array) and loaded.dtype == jnp.bfloat16
  same(loaded, np.arange(4).astype(jnp.bfloat16))
  jnp.save(path, np.arange(3, dtype=np.int16))
  same(jnp.load(path), np.arange(3, dtype=np.int16))
  archive = tmp_path / "x.npz"
  jnp.savez(archive, a=np.ones(2), b=jnp.zeros(3))
  with jnp.load(archive) as data:
    np.testing.assert_array_equal(data["b"], np.zeros(3))


def test_put_and_place():
  x = np.arange(6).reshape(2, 3)
  same(jnp.put(x, np.array([0, 2]), np.array([10, 20]), inplace=False), np.array([[10, 1, 20], [3, 4, 5]], np.int32))
  same(jnp.put(x, np.array([0, 4, 1]), 9, inplace=False), np.array([[9, 9, 2], [3, 9, 5]], np.int32))
  for mode in ("clip", "wrap"):
    want = x.copy()
    np.put(want, [0, 7, -1], 9, mode=mode)
    same(jnp.put(x, np.array([0, 7, -1]), 9, mode=mode, inplace=False), want.astype(np.int32))
  with pytest.raises(ValueError, match="inplace=False"):
    jnp.put(x, 0, 1)
  with pytest.raises(NotImplementedError):
    jnp.put(x, 0, 1, mode="raise", inplace=False)
  want = x.copy()
  np.place(want, x % 2 == 1, [7, 8])
  same(jnp.place(x, x % 2 == 1, np.array([7, 8]), inplace=False), want.astype(np.int32))
  same(tj.jit(lambda m: jnp.place(x, m, np.array([-1]), inplace=False))(x > 3), np.where(x > 3, -1, x).astype(np.int32))
  with pytest.raises(ValueError, match="inplace=False"):
    jnp.place(x, x > 1, np.array([1]))
  with pytest.raises(ValueError, match="empty"):
    jnp.place(x, x > 1, np.zeros(0), inplace=False)
