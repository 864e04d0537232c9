"""complex64 / complex128: promotion (JAX's lattice), storage, arithmetic and the functions built so far against
numpy's complex128, contractions, transformations (jit, vmap, grad with JAX's conventions, holomorphic grad), and the
lexicographic order of complex numbers, and the functions without meaning on them raising JAX's errors."""
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp
from tinyjax import lax
from tests.gradcheck import numeric_grad_complex

RNG = np.random.default_rng(1127)


def _complex(*shape, dtype=np.complex64, scale=1.0):
  return ((RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)) * scale).astype(dtype)


def _close(got, want, rtol=2e-6, atol=1e-6):
  got = np.asarray(got)
  assert got.dtype == np.asarray(want).dtype or np.asarray(want).dtype == np.complex128
  np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_creation_storage_and_printing():
  host = _complex(2, 3)
  x = jnp.asarray(host)
  assert x.dtype == np.complex64 and x.shape == (2, 3)
  np.testing.assert_array_equal(np.asarray(x), host)
  assert jnp.zeros(2, jnp.complex64).dtype == np.complex64 and jnp.ones(2, complex).dtype == np.complex64
  assert jnp.array([1 + 1j, 2]).dtype == np.complex64 and jnp.asarray(3j).weak_type
  assert complex(jnp.asarray(1 - 2j)) == 1 - 2j
  assert "1.+2.j" in repr(jnp.asarray(np.array([1 + 2j], np.complex64)))
  np.testing.assert_array_equal(np.asarray(jnp.full((2,), 1 - 1j)), np.full(2, 1 - 1j, np.complex64))
  with tj.config.override("jax_enable_x64", True):
    assert jnp.asarray(1j).dtype == np.complex128 and jnp.asarray(host.astype(np.complex128)).dtype == np.complex128
  assert jnp.asarray(host.astype(np.complex128)).dtype == np.complex64  # canonicalised without x64, as JAX


def test_promotion_in_operations():
  z = jnp.asarray(_complex(3))
  f = jnp.ones(3, jnp.float32)
  assert (z + f).dtype == np.complex64 and (f * 1j).dtype == np.complex64 and (f * 1j).weak_type is False
  assert (jnp.arange(3) + 1j).dtype == np.complex64
  assert (z.astype(jnp.float32)).dtype == np.float32  # the real part, as numpy and JAX
  np.testing.assert_array_equal(np.asarray(z.astype(jnp.float32)), np.asarray(z).real)
  np.testing.assert_array_equal(np.asarray(f.astype(jnp.complex64)), np.ones(3, np.complex64))
  assert z.astype(bool).dtype == np.bool_


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_arithmetic_matches_numpy(dtype):
  with tj.config.override("jax_enable_x64", dtype == np.complex128):
    a, b = _complex(4, 5, dtype=dtype), _complex(4, 5, dtype=dtype)
    want = {name: fn(a.astype(np.complex128), b.astype(np.complex128)) for name, fn in (
      ("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide))}
    x, y = jnp.asarray(a), jnp.asarray(b)
    tol = dict(rtol=2e-6, atol=1e-6) if dtype == np.complex64 else dict(rtol=1e-14, atol=1e-14)
    for name, got in (("add", x + y), ("sub", x - y), ("mul", x * y), ("div", x / y)):
      assert got.dtype == dtype
      np.testing.assert_allclose(np.asarray(got), want[name], **tol)
    np.testing.assert_allclose(np.asarray(-x), -a)
    np.testing.assert_allclose(np.asarray(1 / x), 1 / a.astype(np.complex128), **tol)
    np.testing.assert_allclose(np.asarray(jnp.reciprocal(x)), 1 / a.astype(np.complex128), **tol)
    np.testing.assert_allclose(np.asarray(jnp.square(x)), a.astype(np.complex128) ** 2, **tol)
    np.testing.assert_array_equal(np.asarray(x == y), a == b)
    np.testing.assert_array_equal(np.asarray(x == x), np.ones(a.shape, bool))
    np.testing.assert_array_equal(np.asarray(x != jnp.conj(x)), a != np.conj(a))


def test_division_without_overflow():
  """Smith's algorithm: c^2 + d^2 would overflow float32 here (numpy's division gives 1)."""
  big = np.array([1e30 + 1e30j, 3e-30 + 4e-30j, 1 + 0j], np.complex64)
  np.testing.assert_allclose(np.asarray(jnp.asarray(big) / jnp.asarray(big)), np.ones(3), rtol=1e-6)
  divided = np.asarray(jnp.asarray(np.array([1 + 1j], np.complex64)) / jnp.asarray(np.array([0j], np.complex64)))
  assert not np.isfinite(divided).all()


def test_functions_match_numpy():
  a = _complex(6, 4)
  wide = a.astype(np.complex128)
  x = jnp.asarray(a)
  _close(jnp.real(x), a.real)
  _close(jnp.imag(x), a.imag)
  _close(x.real, a.real)
  _close(x.imag, a.imag)
  _close(jnp.conj(x), np.conj(a))
  _close(x.conj(), np.conj(a))
  _close(jnp.abs(x), np.abs(wide).astype(np.float32))
  assert jnp.abs(x).dtype == np.float32 and abs(x).dtype == np.float32
  _close(jnp.angle(x), np.angle(wide).astype(np.float32))
  _close(jnp.angle(x, deg=True), np.angle(wide, deg=True).astype(np.float32), rtol=1e-5)
  _close(jnp.exp(x), np.exp(wide), rtol=1e-5)
  _close(jnp.sin(x), np.sin(wide), rtol=1e-5)
  _close(jnp.cos(x), np.cos(wide), rtol=1e-5)
  _close(jnp.sqrt(x), np.sqrt(wide), rtol=1e-5)
  edges = np.array([4 + 0j, -4 + 0j, 0 + 4j, 0 - 4j, 0j, -1e-20 + 1j, 3e30 + 4e30j], np.complex64)
  _close(jnp.sqrt(edges), np.sqrt(edges.astype(np.complex128)), rtol=1e-6)
  _close(jnp.abs(edges), np.abs(edges.astype(np.complex128)).astype(np.float32), rtol=1e-6)
  _close(lax.complex(x.real, x.imag), a)
  _close(jnp.real(jnp.ones(2)), np.ones(2, np.float32))
  _close(jnp.imag(jnp.ones(2)), np.zeros(2, np.float32))
  np.testing.assert_array_equal(np.asarray(jnp.iscomplex(jnp.asarray([1 + 0j, 1j]))), [False, True])
  np.testing.assert_array_equal(np.asarray(jnp.isreal(jnp.asarray([1 + 0j, 1j]))), [True, False])
  assert jnp.iscomplexobj(x) and not jnp.iscomplexobj(jnp.ones(2)) and jnp.isrealobj(jnp.ones(2))
  assert jnp.issubdtype(x.dtype, jnp.complexfloating) and jnp.isdtype(x.dtype, "complex floating")


@pytest.mark.parametrize("name", ["log", "log1p", "expm1", "tan", "sinh", "cosh", "tanh"])
def test_functions_built_from_exp_and_log(name):
  a = _complex(5, scale=1.5)
  got = getattr(jnp, name)(jnp.asarray(a))
  assert got.dtype == np.complex64
  _close(got, getattr(np, name)(a.astype(np.complex128)), rtol=3e-5, atol=3e-6)


def test_power():
  a = _complex(6)
  wide = a.astype(np.complex128)
  x = jnp.asarray(a)
  _close(x ** 3, wide ** 3, rtol=1e-5)
  _close(x ** -2, wide ** -2, rtol=1e-5)
  _close(x ** (0.5 + 1j), wide ** (0.5 + 1j), rtol=5e-5)
  _close(jnp.power(x, x), wide ** wide, rtol=5e-5, atol=1e-6)
  _close(jnp.power(jnp.zeros(2, jnp.complex64), jnp.asarray([0j, 2 + 0j])), np.array([1, 0], np.complex64))
  _close(tj.grad(lambda u: jnp.sum(u ** 3), holomorphic=True)(a), 3 * wide ** 2, rtol=1e-5)
  _close(tj.grad(lambda u: jnp.sum(jnp.log(u)), holomorphic=True)(a), 1 / wide, rtol=1e-5)


def test_reductions_and_contractions():
  a, b = _complex(5, 7), _complex(7, 3)
  wide_a, wide_b = a.astype(np.complex128), b.astype(np.complex128)
  x, y = jnp.asarray(a), jnp.asarray(b)
  _close(jnp.sum(x), wide_a.sum(), rtol=1e-5)
  _close(jnp.sum(x, axis=0), wide_a.sum(axis=0), rtol=1e-5)
  _close(jnp.mean(x, axis=1), wide_a.mean(axis=1), rtol=1e-5)
  _close(x @ y, wide_a @ wide_b, rtol=1e-5, atol=1e-5)
  _close(jnp.einsum("ij,jk->ik", x, y), wide_a @ wide_b, rtol=1e-5, atol=1e-5)
  _close(jnp.dot(x[0], x[1]), np.dot(wide_a[0], wide_a[1]), rtol=1e-5)
  _close(jnp.vdot(x[0], x[1]), np.vdot(wide_a[0], wide_a[1]), rtol=1e-5)
  real_matrix = RNG.standard_normal((7, 2)).astype(np.float32)
  _close(x @ real_matrix, wide_a @ real_matrix, rtol=1e-5, atol=1e-5)
  batch = _complex(3, 4, 5)
  _close(jnp.matmul(jnp.asarray(batch), x[:5]), batch.astype(np.complex128) @ wide_a[:5], rtol=1e-5, atol=1e-5)


def test_movement_indexing_and_selection():
  a = _complex(4, 6)
  x = jnp.asarray(a)
  _close(x.T, a.T)
  _close(x[1:3, ::2], a[1:3, ::2])
  _close(x.reshape(3, 8), a.reshape(3, 8))
  _close(jnp.concatenate([x, x[:1]]), np.concatenate([a, a[:1]]))
  _close(jnp.flip(x, 1), np.flip(a, 1))
  _close(jnp.pad(x, ((1, 0), (0, 2))), np.pad(a, ((1, 0), (0, 2))))
  _close(jnp.broadcast_to(x[0], (3, 6)), np.broadcast_to(a[0], (3, 6)))
  _close(jnp.where(x.real > 0, x, 0), np.where(a.real > 0, a, 0))
  _close(x[jnp.asarray([3, 0, 0])], a[[3, 0, 0]])
  _close(x.at[1, 2].set(5j), np.where(np.arange(24).reshape(4, 6) == 8, 5j, a).astype(np.complex64))
  _close(x.at[0].add(1 + 1j), a + np.array([[1 + 1j]] * 1 + [[0]] * 3, np.complex64))


def test_jit_and_vmap():
  a, b = _complex(5, 3), _complex(5, 3)
  f = tj.jit(lambda u, v: jnp.sum(u * jnp.conj(v), axis=1) + 1j)
  want = (a.astype(np.complex128) * np.conj(b)).sum(axis=1) + 1j
  _close(f(a, b), want, rtol=1e-5)
  _close(f(b, a), np.conj(want - 1j) + 1j, rtol=1e-5)
  _close(tj.vmap(jnp.vdot)(a, b), np.array([np.vdot(u, v) for u, v in zip(a, b)]), rtol=1e-5)
  _close(tj.vmap(tj.jit(lambda u: u * u), in_axes=1, out_axes=1)(a), a.astype(np.complex128) ** 2, rtol=1e-5)
  scale = tj.jit(lambda u, s: u * s)
  _close(scale(a, 2.0), a * 2)
  _close(scale(a, np.float32(0.5)), a * 0.5)


def test_grad_of_real_functions_of_complex_inputs():
  """JAX's convention: grad(f)(z) = df/dx - i df/dy (grad(|z|^2) = 2 conj(z)); values checked against JAX 0.10.2."""
  z = np.array([1 + 2j, -0.5 + 0.25j], np.complex64)
  _close(tj.grad(lambda u: jnp.sum(jnp.abs(u) ** 2))(z), np.array([2 - 4j, -1 - 0.5j], np.complex64), rtol=1e-6)
  _close(tj.grad(lambda u: jnp.sum(jnp.real(u * u)))(z), np.array([2 + 4j, -1 + 0.5j], np.complex64), rtol=1e-6)
  _close(tj.grad(lambda u: jnp.sum(jnp.imag(jnp.exp(u))))(z),
         np.array([2.4717267 + 1.1312041j, 0.15005809 - 0.5876751j], np.complex64), rtol=1e-5)
  _close(tj.grad(lambda x: jnp.sum(jnp.abs(x * (1 + 2j))))(np.array([1.0, 2.0], np.float32)),
         np.full(2, np.sqrt(5), np.float32), rtol=1e-6)
  with tj.config.override("jax_enable_x64", True):
    w = _complex(3, dtype=np.complex128)
    for fn, host in ((lambda u: jnp.sum(jnp.real(jnp.sqrt(u) * jnp.sin(u))),
                      lambda u: np.sum(np.real(np.sqrt(u) * np.sin(u)))),
                     (lambda u: jnp.sum(jnp.abs(u / (u + 2.0))), lambda u: np.sum(np.abs(u / (u + 2.0)))),
                     (lambda u: jnp.real(jnp.vdot(u, u * 1j + 1.0)), lambda u: np.real(np.vdot(u, u * 1j + 1.0)))):
      got = tj.grad(fn)(w)
      np.testing.assert_allclose(np.asarray(got), numeric_grad_complex(host, w, 1e-4), rtol=1e-7, atol=1e-8)
      np.testing.assert_allclose(np.asarray(tj.jit(tj.grad(fn))(w)), np.asarray(got), rtol=1e-12)


def test_holomorphic_grad_jvp_and_vjp():
  z = np.array([1 + 2j, -0.5 + 0.25j], np.complex64)
  _close(tj.grad(lambda u: jnp.sum(u * u), holomorphic=True)(z), 2 * z)
  _close(tj.grad(lambda u: jnp.sum(jnp.exp(u)), holomorphic=True)(z), np.exp(z.astype(np.complex128)), rtol=1e-5)
  primal, tangent = tj.jvp(lambda u: u * u, (z,), (np.ones(2, np.complex64),))
  _close(primal, z.astype(np.complex128) ** 2)
  _close(tangent, 2 * z)
  _, pullback = tj.vjp(jnp.exp, z)
  _close(pullback(np.ones(2, np.complex64))[0], np.exp(z.astype(np.complex128)), rtol=1e-5)
  per_example = tj.vmap(tj.grad(lambda u: jnp.real(u * jnp.conj(u))))(z)
  _close(per_example, 2 * z.astype(np.complex128).conj())  # |z|^2 per example
  with pytest.raises(TypeError, match="holomorphic=True"):
    tj.grad(lambda u: jnp.sum(u * u))(z)
  with pytest.raises(TypeError, match="complex dtype"):
    tj.grad(lambda u: jnp.sum(u * u), holomorphic=True)(np.ones(2, np.float32))


def _with_ties(dtype=np.complex64):
  """Complex numbers whose real parts tie (so the imaginary parts decide the order), zeros of both signs included."""
  real = np.array([1.0, 1.0, -3.0, 0.0, 2.0, 1.0, -0.0, 2.0, -3.0, 0.5])
  imag = np.array([2.0, -1.0, 0.0, 0.0, 0.5, 3.0, 1.0, 0.5, -2.0, 0.0])
  return (real + 1j * imag).astype(dtype)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_numbers_are_ordered_lexicographically_as_numpy(dtype):
  with tj.config.override("jax_enable_x64", dtype == np.complex128):
    host = _with_ties(dtype)
    other = np.roll(host, 3)
    z, w = jnp.asarray(host), jnp.asarray(other)
    for name in ("less", "less_equal", "greater", "greater_equal", "maximum", "minimum", "fmax", "fmin"):
      got = getattr(jnp, name)(z, w)
      np.testing.assert_array_equal(np.asarray(got), getattr(np, name)(host, other), err_msg=name)
    np.testing.assert_array_equal(np.asarray(z < w), host < other)
    table = host.reshape(2, 5)
    for axis in (None, 0, 1):
      np.testing.assert_array_equal(np.asarray(jnp.max(jnp.asarray(table), axis=axis)), np.max(table, axis=axis))
      np.testing.assert_array_equal(np.asarray(jnp.min(jnp.asarray(table), axis=axis)), np.min(table, axis=axis))
      np.testing.assert_array_equal(np.asarray(tj.jit(lambda t, a=axis: jnp.max(t, axis=a))(table)),
                                    np.max(table, axis=axis))
    np.testing.assert_array_equal(np.asarray(jnp.sort(z)), np.sort(host))
    np.testing.assert_array_equal(np.asarray(jnp.sort(jnp.asarray(table), axis=0)), np.sort(table, axis=0))
    np.testing.assert_array_equal(np.asarray(jnp.argsort(z)), np.argsort(host, kind="stable"))
    np.testing.assert_array_equal(np.asarray(jnp.sort_complex(z)), np.sort_complex(host))
    np.testing.assert_array_equal(np.asarray(jnp.lexsort([z.real, z])), np.lexsort([host.real, host]))
    np.testing.assert_array_equal(np.asarray(jnp.cummax(z)), np.maximum.accumulate(host))
    np.testing.assert_array_equal(np.asarray(jnp.cummin(z)), np.minimum.accumulate(host))
    ordered = np.sort(host)
    np.testing.assert_array_equal(np.asarray(jnp.searchsorted(jnp.asarray(ordered), z)), np.searchsorted(ordered, host))
    np.testing.assert_array_equal(np.asarray(jnp.searchsorted(jnp.asarray(ordered), z, side="right")),
                                  np.searchsorted(ordered, host, side="right"))
    assert jnp.sort_complex(jnp.arange(3, 0, -1)).dtype == (np.complex128 if dtype == np.complex128 else np.complex64)
    # transformations: a batch of sorts, jitted
    batch = np.stack([host, other, host[::-1]])
    np.testing.assert_array_equal(np.asarray(tj.jit(tj.vmap(jnp.sort))(batch)), np.sort(batch, axis=1))


def test_complex_nans_sort_last_and_propagate_through_maxima():
  nan = float("nan")
  host = np.array([1 + 2j, complex(nan, 1), 3 + 0j, complex(1, nan), -1 + 0j], np.complex64)
  host = np.concatenate([host, np.array([complex(nan, nan), complex(-5, nan), complex(nan, -1)], np.complex64)])
  got = np.asarray(jnp.sort(jnp.asarray(host)))
  # JAX's order: by real part, then imaginary part, NaN last in each (numpy puts every R + nanj after all R + Rj)
  want = np.array(sorted(host, key=lambda v: (np.isnan(v.real), v.real if v.real == v.real else 0,
                                               np.isnan(v.imag), v.imag if v.imag == v.imag else 0)), np.complex64)
  np.testing.assert_array_equal(got.view(np.float32), want.view(np.float32))
  host = host[:5]
  assert np.isnan(complex(jnp.max(jnp.asarray(host))).real)
  maxima = np.asarray(jnp.maximum(jnp.asarray(host), jnp.zeros(5, jnp.complex64)))
  assert np.isnan(maxima[1].real) and np.isnan(maxima[3].imag)
  np.testing.assert_array_equal(maxima[[0, 2, 4]], [1 + 2j, 3 + 0j, 0j])
  np.testing.assert_array_equal(np.asarray(jnp.fmax(jnp.asarray(host), jnp.zeros(5, jnp.complex64)))[[1, 3]], [0j, 0j])


def test_extremum_gradients_of_complex_numbers():
  host = _with_ties(np.complex64)
  grad = tj.grad(lambda v: jnp.max(v).real)(jnp.asarray(host))
  np.testing.assert_array_equal(np.asarray(grad), np.eye(10, dtype=np.complex64)[4] * 0.5 + np.eye(10)[7] * 0.5)
  grad = tj.grad(lambda v: jnp.maximum(v, 1 + 1j).imag.sum())(jnp.asarray(host))
  want = np.where(host > (1 + 1j), -1j, 0).astype(np.complex64)  # d imag / d z: JAX's conjugate convention
  np.testing.assert_array_equal(np.asarray(grad), want)
  per_row = tj.jit(tj.vmap(tj.grad(lambda v: jnp.min(v).real)))(host.reshape(2, 5))
  np.testing.assert_array_equal(np.asarray(per_row), np.eye(5, dtype=np.complex64)[[2, 3]])
  assert not np.asarray(tj.grad(lambda v: jnp.sign(v).real.sum())(jnp.asarray(host))).any()  # sign: 0, as JAX


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_more_functions_of_complex_numbers_against_numpy(dtype):
  with tj.config.override("jax_enable_x64", dtype == np.complex128):
    host = np.concatenate([_complex(12, dtype=dtype, scale=2.0), np.array([0j, 2.5 + 0.5j, -1.5 - 2.5j], dtype)])
    z = jnp.asarray(host)
    wide = host.astype(np.complex128)
    rtol = 2e-6 if dtype == np.complex64 else 1e-13
    scaled = {"deg2rad": lambda v: v * (np.pi / 180), "rad2deg": lambda v: v * (180 / np.pi)}  # (numpy: reals only)
    for name in ("sign", "rint", "exp2", "log2", "log10", "deg2rad", "rad2deg"):
      with np.errstate(all="ignore"):
        want = scaled.get(name, getattr(np, name))(wide)
      got = np.asarray(getattr(jnp, name)(z))
      assert got.dtype == dtype, name
      np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=name)
    np.testing.assert_array_equal(np.asarray(jnp.round(z)), np.round(host))
    np.testing.assert_allclose(np.asarray(jnp.round(z * 1.37, 1)), np.round(host * 1.37, 1), rtol=rtol)
    assert np.asarray(jnp.log2(jnp.zeros(1, dtype)))[0] == complex(-np.inf, 0)  # numpy's, not -inf + nanj
    for reduce in ("var", "std"):
      got = getattr(jnp, reduce)(z)
      assert got.dtype == np.dtype(dtype).type(0).real.dtype
      np.testing.assert_allclose(np.asarray(got), getattr(np, reduce)(wide), rtol=rtol)
    np.testing.assert_allclose(np.asarray(jnp.var(z.reshape(3, 5), axis=1, ddof=1)),
                               np.var(wide.reshape(3, 5), axis=1, ddof=1), rtol=rtol)
    np.testing.assert_allclose(np.asarray(jnp.correlate(z, z[:4], mode="full")), np.correlate(wide, wide[:4], "full"),
                               rtol=rtol * 10, atol=rtol * 10)
    other = np.roll(host, 1)
    # logaddexp of complex numbers: log(e^x + e^y) on the principal branch (JAX's extension of numpy's function)
    np.testing.assert_allclose(np.asarray(jnp.logaddexp(z, jnp.asarray(other))),
                               np.log(np.exp(wide) + np.exp(other.astype(np.complex128))), rtol=rtol * 10,
                               atol=rtol * 10)
    np.testing.assert_allclose(np.asarray(jnp.logaddexp2(z, jnp.asarray(other))),
                               np.log2(np.exp2(wide) + np.exp2(other.astype(np.complex128))), rtol=rtol * 10,
                               atol=rtol * 10)
    # arctan2 of complex numbers: -i log((x + iy) / sqrt(x^2 + y^2)), the angle of (x, y)
    y, x = wide[:12], np.roll(wide, 2)[:12]
    np.testing.assert_allclose(np.asarray(jnp.arctan2(jnp.asarray(host[:12]), jnp.asarray(np.roll(host, 2)[:12]))),
                               -1j * np.log((x + 1j * y) / np.sqrt(x * x + y * y)), rtol=rtol * 10, atol=rtol * 10)


def test_complex_division_by_zero_and_powers_of_zero_as_numpy():
  numerators = np.array([1 + 2j, -3 + 0j, 0j, 1 - 1j, complex("nan+1j")], np.complex64)
  zeros = np.zeros(5, np.complex64)
  with np.errstate(all="ignore"):
    for got, want in ((jnp.asarray(numerators) / jnp.asarray(zeros), numerators / zeros),
                      (tj.jit(lambda a: 1 / a)(zeros), 1 / zeros),
                      (jnp.reciprocal(jnp.asarray(zeros)), np.reciprocal(zeros)),
                      (jnp.asarray(numerators) / jnp.asarray(numerators), numerators / numerators)):
      np.testing.assert_array_equal(np.asarray(got), want)
    exponents = np.array([1 + 1j, -3 + 0j, 0j, -1j, 2 + 0j], np.complex64)
    np.testing.assert_array_equal(np.asarray(jnp.power(jnp.zeros(5, jnp.complex64), jnp.asarray(exponents))),
                                  np.power(zeros, exponents))


def test_functions_without_meaning_on_complex_numbers_raise_as_jax():
  x = jnp.asarray(_complex(3))
  for fn in (jnp.floor, jnp.ceil, jnp.trunc, jnp.cbrt, jnp.signbit, jnp.fabs, lambda v: jnp.hypot(v, v),
             lambda v: jnp.nextafter(v, v), lambda v: jnp.copysign(v, v), lambda v: jnp.fmod(v, v),
             lambda v: jnp.floor_divide(v, v), lambda v: jnp.argmax(v), lambda v: jnp.argmin(v),
             lambda v: jnp.nanargmax(v), lambda v: jnp.bitwise_and(v, v)):
    with pytest.raises(TypeError, match="complex"):
      fn(x)
  for fn in (lambda v: jnp.clip(v, 0, 1), lambda v: jnp.clip(jnp.real(v), 0, 1j), jnp.median,
             lambda v: jnp.quantile(v, 0.5), lambda v: jnp.percentile(v, 50)):
    with pytest.raises(ValueError, match="complex"):
      fn(x)
  with pytest.raises(TypeError, match="complex"):
    lax.lt(x, x)  # lax's comparisons take real numbers (jnp.less orders complex ones), as JAX's


def test_host_calls_take_and_give_complex_arrays():
  """A pure_callback (or a LAPACK step) under jit exchanges complex values with the host as complex arrays."""
  seen = []

  def on_host(z):
    seen.append(z.dtype)
    return np.conj(z) * 2

  shape = tj.ShapeDtypeStruct((3,), np.complex64)
  f = tj.jit(lambda z: tj.pure_callback(on_host, shape, z * 1j) + 1)
  z = _complex(3)
  _close(f(z), np.conj(z * 1j) * 2 + 1)
  assert seen == [np.complex64]
  _close(tj.pure_callback(on_host, shape, jnp.asarray(z)), np.conj(z) * 2)


def test_holomorphic_jacobians_and_hessian():
  z = np.array([1 + 2j, 0.5 - 1j], np.complex64)
  _close(tj.jacfwd(lambda u: u ** 2, holomorphic=True)(z), np.diag(2 * z))
  _close(tj.jacrev(lambda u: u ** 2, holomorphic=True)(z), np.diag(2 * z))
  _close(tj.hessian(lambda u: jnp.sum(u ** 3), holomorphic=True)(z), np.diag(6 * z))
  with pytest.raises(TypeError, match="holomorphic=True"):
    tj.jacfwd(lambda u: u ** 2)(z)
  with pytest.raises(TypeError, match="real-valued outputs"):
    tj.jacrev(lambda u: u * 1j)(np.ones(2, np.float32))
  with pytest.raises(TypeError, match="complex dtype"):
    tj.jacfwd(lambda u: u ** 2, holomorphic=True)(np.ones(2, np.float32))


def test_nan_inf_tests_and_complex_python_arguments():
  z = jnp.asarray(np.array([1 + 1j, complex(np.inf, 0), complex(0, np.nan), complex(np.nan, np.inf)], np.complex64))
  np.testing.assert_array_equal(np.asarray(jnp.isinf(z)), [False, True, False, True])
  np.testing.assert_array_equal(np.asarray(jnp.isnan(z)), [False, False, True, True])
  np.testing.assert_array_equal(np.asarray(jnp.isfinite(z)), [True, False, False, False])
  # a Python complex argument is a weak complex scalar, as JAX (the autodiff cookbook differentiates at 3 + 4j)
  _close(tj.grad(lambda u: jnp.abs(u) ** 2)(3 + 4j), np.complex64(6 - 8j))
  _close(tj.jit(lambda u: u * 2)(1 - 1j), np.complex64(2 - 2j))


@pytest.mark.parametrize("name", ["arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh"])
def test_inverse_functions_and_their_branch_cuts(name):
  """numpy's principal branches, the sides of the cuts chosen by the sign of a zero imaginary part included."""
  z = np.concatenate([_complex(8, scale=1.5),
                      np.array([2 + 0j, -2 + 0j, 0.5 + 0j, 0.3 - 4j, -0.0 - 0.5j], np.complex64),
                      np.array([complex(2, -0.0), complex(-2, -0.0), complex(0.5, -0.0)], np.complex64)])
  got = getattr(jnp, name)(jnp.asarray(z))
  _close(got, getattr(np, name)(z.astype(np.complex128)), rtol=3e-6, atol=3e-6)
  derivative = {"arcsin": lambda w: 1 / np.sqrt(1 - w * w), "arccos": lambda w: -1 / np.sqrt(1 - w * w),
                "arctan": lambda w: 1 / (1 + w * w), "arcsinh": lambda w: 1 / np.sqrt(w * w + 1),
                "arccosh": lambda w: 1 / (np.sqrt(w - 1) * np.sqrt(w + 1)), "arctanh": lambda w: 1 / (1 - w * w)}[name]
  off_cuts = z[:8]
  _close(tj.grad(lambda u: jnp.sum(getattr(jnp, name)(u)), holomorphic=True)(off_cuts),
         derivative(off_cuts.astype(np.complex128)), rtol=2e-5, atol=2e-5)


def test_special_values_at_infinities():
  """The array API standard's special cases of exp, expm1, sinh, cosh, tanh that a naive formula gets wrong."""
  inf, nan = np.inf, np.nan
  z = jnp.asarray(np.array([complex(inf, 0), complex(nan, 0), complex(inf, inf), complex(inf, nan)], np.complex64))
  exp = np.asarray(jnp.exp(z))
  assert exp[0] == complex(inf, 0) and np.isnan(exp[1].real) and exp[1].imag == 0
  for name in ("sinh", "cosh"):
    values = np.asarray(getattr(jnp, name)(z))
    assert values[0] == complex(inf, 0) and np.isnan(values[1].real) and values[1].imag == 0, name
  assert np.asarray(jnp.expm1(z))[0] == complex(inf, 0)
  tanh = np.asarray(jnp.tanh(z))
  np.testing.assert_array_equal(tanh[[0, 2, 3]], np.ones(3, np.complex64))
  assert np.isnan(tanh[1].real) and tanh[1].imag == 0
  negated = np.asarray(-jnp.zeros(2, jnp.complex64))  # a zero's sign survives being stored
  assert np.all(np.signbit(negated.imag)) and np.all(np.signbit(negated.real))


def test_inverse_functions_at_infinities():
  """C99's limits (the array API standard's special cases): log(2z) far out, 0 + i pi/2 for atanh."""
  inf, nan = np.inf, np.nan
  z = jnp.asarray(np.array([complex(inf, inf), complex(1.0, inf), complex(inf, 1.0), complex(-inf, 1.0),
                            complex(nan, inf)], np.complex64))
  asinh, acosh, atanh = (np.asarray(f(z)) for f in (jnp.arcsinh, jnp.arccosh, jnp.arctanh))
  assert np.all(np.isinf(asinh[:3].real)) and np.allclose(asinh[:3].imag, [np.pi / 4, np.pi / 2, 0])
  assert np.all(np.isinf(acosh[:4].real)) and np.allclose(acosh[:4].imag, [np.pi / 4, np.pi / 2, 0, np.pi])
  assert np.all(atanh[:3].real == 0) and np.allclose(atanh[:3].imag, np.pi / 2) and np.isclose(atanh[4].imag, np.pi / 2)
  acos = np.asarray(jnp.arccos(jnp.asarray(np.array([0j, complex(inf, 1.0)], np.complex64))))
  assert acos[0] == complex(np.pi / 2, 0) and np.signbit(acos[0].imag) and acos[1].real == 0 and acos[1].imag == -inf


def test_sqrt_of_signed_zeros():
  """sqrt(+-0 + 0j) is +0 + 0j, sqrt(+-0 - 0j) is +0 - 0j (the array API standard; found by array-api-tests)."""
  z = np.array([complex(0.0, 0.0), complex(-0.0, 0.0), complex(0.0, -0.0), complex(-0.0, -0.0)], np.complex64)
  root = np.asarray(jnp.sqrt(jnp.asarray(z)))
  assert np.all(root == 0) and not np.any(np.signbit(root.real))
  np.testing.assert_array_equal(np.signbit(root.imag), [False, False, True, True])


def test_products_over_axes():
  a = _complex(3, 5, 4)
  wide = a.astype(np.complex128)
  for axis in (None, 0, 1, (0, 2), -1):
    _close(jnp.prod(a, axis=axis), np.prod(wide, axis=axis), rtol=2e-6, atol=1e-6)
    assert jnp.prod(a, axis=axis, keepdims=True).shape == np.prod(wide, axis=axis, keepdims=True).shape
  _close(jnp.prod(jnp.zeros((2, 0), jnp.complex64), axis=1), np.ones(2, np.complex64))
  with tj.config.override("jax_enable_x64", True):
    z = _complex(5, dtype=np.complex128)
    got = tj.grad(lambda u: jnp.real(jnp.prod(u)))(z)
    np.testing.assert_allclose(np.asarray(got), numeric_grad_complex(lambda u: np.real(np.prod(u)), z, 1e-4), rtol=1e-7,
                               atol=1e-8)


def test_loops_and_branches_carry_complex_values():
  """scan / fori_loop / while_loop / cond with complex carries, xs, ys and operands (their bodies are lowered as pairs
  of floats too), jitted and differentiated."""
  z0 = np.array([1 + 1j, 2 - 0.5j], np.complex64)
  xs = (np.arange(6).reshape(3, 2) + 1j).astype(np.complex64)

  def step(c, x): return c * x + 1j, c.real + jnp.abs(c)
  carry, ys = tj.lax.scan(step, z0, xs)
  want_carry, want_ys = z0.astype(np.complex128), []
  for x in xs:
    want_ys.append(want_carry.real + np.abs(want_carry))
    want_carry = want_carry * x + 1j
  _close(carry, want_carry, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(ys), np.array(want_ys), rtol=1e-6)
  jitted_carry, _ = tj.jit(lambda c, x: tj.lax.scan(step, c, x))(z0, xs)
  _close(jitted_carry, want_carry, rtol=1e-6)
  _close(tj.lax.fori_loop(0, 3, lambda i, c: c * 1j, jnp.asarray(z0)), z0 * (-1j), atol=1e-7)
  _close(tj.lax.while_loop(lambda c: jnp.abs(c[0]) < 10, lambda c: c * (1 + 1j), jnp.asarray(z0)), z0 * (1 + 1j) ** 6,
         rtol=1e-6)
  _close(tj.lax.cond(True, lambda u: u * 2j, jnp.conj, jnp.asarray(z0)), z0 * 2j)
  _close(tj.lax.cond(False, lambda u: u * 2j, jnp.conj, jnp.asarray(z0)), np.conj(z0))
  product = np.prod(xs.astype(np.complex128), axis=0)
  # Re(sum(c * prod(xs))): JAX's gradient with respect to c is d/dx - i d/dy = prod(xs)
  gradient = tj.grad(lambda u: jnp.real(tj.lax.scan(lambda c, x: (c * x, None), u, xs)[0].sum()))(jnp.asarray(z0))
  _close(gradient, product, rtol=1e-6)


def test_loop_bodies_compute_with_complex_values_their_program_has_none_of():
  """A jitted loop whose carries, xs and ys are real but whose body computes with complex values (a spectral step:
  rfft, a product, irfft), and a body calling a named primitive on complex operands (a concatenation): the bodies
  are lowered as pairs of floats although the program around them has no complex value (they raised
  NotImplementedError before)."""
  rows = RNG.standard_normal((5, 16)).astype(np.float32)
  kernel = np.fft.rfft(RNG.standard_normal(16))

  def smooth(carry, row):
    out = jnp.fft.irfft(jnp.fft.rfft(row + carry) * jnp.asarray(kernel.astype(np.complex64)), n=16)
    return out, jnp.abs(jnp.fft.fft(row)).sum()

  def concatenated(carry, row):
    z = tj.lax.complex(row, 2 * row)
    z = jnp.concatenate([z, z[:1]])
    return carry + jnp.real(z * z)[:16], jnp.imag(z).sum()

  carry, sums = tj.jit(lambda xs: tj.lax.scan(smooth, jnp.zeros(16), xs))(rows)
  want = np.zeros(16)
  for row in rows: want = np.fft.irfft(np.fft.rfft(row + want) * kernel, n=16)
  np.testing.assert_allclose(np.asarray(carry), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(sums), np.abs(np.fft.fft(rows.astype(np.float64))).sum(-1), rtol=1e-5)
  carry, sums = tj.jit(lambda xs: tj.lax.scan(concatenated, jnp.zeros(16), xs))(rows)
  np.testing.assert_allclose(np.asarray(carry), (-3 * rows.astype(np.float64) ** 2).sum(0), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(sums), 2 * (rows.sum(-1) + rows[:, 0]), rtol=1e-5)
  counted = tj.jit(lambda x: tj.lax.fori_loop(0, 3, lambda i, v: jnp.real(jnp.exp(1j * v)) + v, x))(rows[0])
  want = rows[0].astype(np.float64)
  for _ in range(3): want = np.cos(want) + want
  np.testing.assert_allclose(np.asarray(counted), want, rtol=1e-5)


@pytest.mark.parametrize("name", ["exp", "expm1", "sin", "cos", "tan", "sinh", "cosh", "tanh"])
def test_complex_functions_at_large_parts_against_numpy(name):
  """A large imaginary part keeps its angle (it is not scaled by log2 e and back), and the parts are computed where
  e**|a| alone would overflow but the result does not (sin(1 + 89j) is finite in float32)."""
  host = np.array([1 + 2.0036046e17j, 1 + 7.1682566e16j, 1 + 89j, 89 + 1j, -89 - 2j, 30 - 2j, 100 + 0j, 1e20 + 1j,
                   0.5 + 0.1j, 0j, -3 - 0j], np.complex64)
  got = np.asarray(getattr(jnp, name)(jnp.asarray(host)))
  with np.errstate(all="ignore"):
    want = getattr(np, name)(host.astype(np.complex128))
    finite = np.isfinite(want.astype(np.complex64))
  np.testing.assert_allclose(got[finite], want[finite], rtol=5e-6, atol=1e-30)
  # overflow where the exact value overflows, never a NaN for a finite input
  assert not np.isnan(got).any()
