"""The array API standard's names in tinyjax.numpy (numpy/_array_api.py): against numpy 2's own implementation of the
standard (float64 references), under jit / vmap / grad, and the errors JAX raises."""
import ml_dtypes
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as jnp

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("name,numpy_name,low,high", [
  ("acos", "arccos", -0.99, 0.99), ("acosh", "arccosh", 1.01, 4.0), ("asin", "arcsin", -0.99, 0.99),
  ("asinh", "arcsinh", -4.0, 4.0), ("atan", "arctan", -4.0, 4.0), ("atanh", "arctanh", -0.99, 0.99)])
def test_inverse_trigonometry_names(name, numpy_name, low, high):
  x = RNG.uniform(low, high, 101).astype(np.float32)
  got = getattr(jnp, name)(x)
  np.testing.assert_allclose(np.asarray(got), getattr(np, numpy_name)(x.astype(np.float64)), rtol=2e-6, atol=1e-7)
  # the gradient, against central differences in float64
  grad = tj.jit(tj.vmap(tj.grad(getattr(jnp, name))))(x)
  step = 1e-6
  x64 = x.astype(np.float64)
  numeric = (getattr(np, numpy_name)(x64 + step) - getattr(np, numpy_name)(x64 - step)) / (2 * step)
  np.testing.assert_allclose(np.asarray(grad), numeric, rtol=1e-4)


def test_other_renamed_functions():
  a, b = RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(jnp.atan2(a, b)), np.atan2(a.astype(np.float64), b), rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(np.asarray(jnp.pow(np.abs(a), b)), np.pow(np.abs(a).astype(np.float64), b), rtol=1e-5)
  i = RNG.integers(-100, 100, (3, 4)).astype(np.int32)
  shifts = RNG.integers(0, 8, (3, 4)).astype(np.int32)
  np.testing.assert_array_equal(np.asarray(jnp.bitwise_invert(i)), np.bitwise_invert(i))
  np.testing.assert_array_equal(np.asarray(jnp.bitwise_left_shift(i, shifts)), np.bitwise_left_shift(i, shifts))
  np.testing.assert_array_equal(np.asarray(jnp.bitwise_right_shift(i, shifts)), np.bitwise_right_shift(i, shifts))
  np.testing.assert_array_equal(np.asarray(jnp.concat([a, b], axis=1)), np.concat([a, b], axis=1))
  np.testing.assert_array_equal(np.asarray(jnp.concat([a, b], axis=None)), np.concat([a, b], axis=None))
  x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jnp.permute_dims(x, (2, 0, 1))), np.permute_dims(x, (2, 0, 1)))
  assert jnp.bool is jnp.bool_ and jnp.zeros(3, jnp.bool).dtype == np.bool_


def test_unstack_and_vecdot():
  x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
  for axis in (0, 1, -1):
    got, want = jnp.unstack(x, axis=axis), np.unstack(x, axis=axis)
    assert isinstance(got, tuple) and len(got) == len(want)
    for g, w in zip(got, want): np.testing.assert_array_equal(np.asarray(g), w)
  a, b = RNG.standard_normal((5, 3, 4)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
  for axis in (-1, -2):  # (the standard's axes count from the end; a positive one is each operand's own, as JAX's)
    np.testing.assert_allclose(np.asarray(jnp.vecdot(a, b, axis=axis)),
                               np.vecdot(a.astype(np.float64), b.astype(np.float64), axis=axis), rtol=1e-5, atol=1e-6)
  # composed: the gradient of x . x is 2x, batched and jitted
  grads = tj.jit(tj.vmap(tj.grad(lambda v: jnp.vecdot(v, v))))(a.reshape(15, 4))
  np.testing.assert_allclose(np.asarray(grads), 2 * a.reshape(15, 4), rtol=1e-6)
  assert jnp.vecdot(a, b, preferred_element_type=jnp.float16).dtype == np.float16
  unstacked = tj.vmap(lambda v: jnp.unstack(v)[1])(x)  # vmap over the leading axis, unstack the next
  np.testing.assert_array_equal(np.asarray(unstacked), x[:, 1])


def test_unique_functions_match_numpy():
  x = RNG.integers(0, 6, (4, 5)).astype(np.int32)
  got, want = jnp.unique_all(x), np.unique_all(x)
  assert got._fields == ("values", "indices", "inverse_indices", "counts")
  for g, w in zip(got, want): np.testing.assert_array_equal(np.asarray(g), w)
  assert got.inverse_indices.shape == x.shape
  np.testing.assert_array_equal(np.asarray(got.values)[np.asarray(got.inverse_indices)], x)  # the identity
  for name in ("unique_counts", "unique_inverse"):
    for g, w in zip(getattr(jnp, name)(x), getattr(np, name)(x)): np.testing.assert_array_equal(np.asarray(g), w)
  # (numpy 2.3+ leaves unique_values unsorted, as the standard allows; JAX sorts, as np.unique)
  np.testing.assert_array_equal(np.asarray(jnp.unique_values(x)), np.unique(x))
  padded = tj.jit(lambda v: jnp.unique_values(v, size=8, fill_value=-1))(x)  # static size: works under jit
  np.testing.assert_array_equal(np.asarray(padded), np.concatenate([np.unique(x), [-1] * (8 - len(np.unique(x)))]))


def test_isdtype_and_can_cast():
  kinds = ("bool", "signed integer", "unsigned integer", "integral", "real floating", "complex floating", "numeric")
  for dt in (np.bool_, np.int8, np.int32, np.int64, np.uint8, np.uint32, np.float16, np.float32, np.float64):
    for kind in kinds:
      assert jnp.isdtype(dt, kind) == np.isdtype(dt, kind), (dt, kind)
    assert jnp.isdtype(dt, ("bool", "real floating")) == np.isdtype(dt, ("bool", "real floating"))
  assert jnp.isdtype(jnp.bfloat16, "real floating") and jnp.isdtype(ml_dtypes.float8_e4m3fn, "numeric")
  assert jnp.isdtype(jnp.int8, jnp.int8) and not jnp.isdtype(jnp.int8, jnp.int16)
  with pytest.raises(ValueError, match="Unrecognized kind='foo'"):
    jnp.isdtype(jnp.float32, "foo")
  pairs = [(np.int32, np.float32), (np.int8, np.int16), (np.float32, np.float64), (np.float64, np.float32),
           (np.uint8, np.int8), (np.bool_, np.int32)]
  for a, b in pairs:
    assert jnp.can_cast(a, b) == np.can_cast(a, b)
    assert jnp.can_cast(a, b, casting="same_kind") == np.can_cast(a, b, casting="same_kind")
  assert not jnp.can_cast(jnp.float32, jnp.bfloat16) and jnp.can_cast(jnp.bfloat16, jnp.float32)
  assert not jnp.can_cast(jnp.asarray(1), jnp.int8)  # an array: its dtype (int32)


def test_namespace_info_and_array_methods():
  assert jnp.__array_api_version__ == "2024.12"
  info = jnp.__array_namespace_info__()
  assert info.capabilities() == {"boolean indexing": False, "data-dependent shapes": False, "max dimensions": 64}
  assert info.default_device() is None and info.devices()[1] is tj.devices()[0]
  assert info.default_dtypes() == {"real floating": np.float32, "complex floating": np.complex64,
                                   "integral": np.int32, "indexing": np.int32}
  assert set(info.dtypes()) == {"bool", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float32", "complex64"}
  assert set(info.dtypes(kind="complex floating")) == {"complex64"}
  assert set(info.dtypes(kind="unsigned integer")) == {"uint8", "uint16", "uint32"}
  with tj.config.override("jax_enable_x64", True):
    assert {"int64", "uint64", "float64", "complex128"} <= set(info.dtypes())
    assert info.default_dtypes()["real floating"] == np.float64
  x = jnp.arange(3.0)
  assert x.__array_namespace__() is jnp and x.__array_namespace__(api_version="2023.12") is jnp
  with pytest.raises(ValueError, match="array API version"):
    x.__array_namespace__(api_version="1999.01")
  moved = x.to_device(tj.devices()[0])
  assert moved.committed and moved.device is tj.devices()[0] and np.asarray(moved).tolist() == [0.0, 1.0, 2.0]


def test_bad_input():
  with pytest.raises(ValueError, match="axes must match"):
    jnp.vecdot(jnp.ones(3), jnp.ones(4))
  with pytest.raises(ValueError, match="axes must match"):
    jnp.vecdot(jnp.ones((5, 3, 4)), jnp.ones((3, 4)), axis=1)
  with pytest.raises(ValueError, match="out of bounds"):
    jnp.vecdot(jnp.ones(3), jnp.ones(3), axis=1)
  with pytest.raises(ValueError, match="at least one dimension"):
    jnp.unstack(jnp.float32(1.0))


def test_dlpack_both_ways_without_copies(on_cpu):  # (DLPack export: CPU arrays)
  x = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4) * 2  # lazy: computed on export
  host = np.from_dlpack(x)
  np.testing.assert_array_equal(host, np.arange(12.0).reshape(3, 4) * 2)
  assert np.shares_memory(host, np.asarray(x)) and not host.flags.writeable and x.__dlpack_device__() == (1, 0)
  a = RNG.standard_normal((5, 6)).astype(np.float32)
  y = jnp.from_dlpack(a)
  assert np.shares_memory(np.asarray(y), a) and a.flags.writeable  # (the producer's array stays writable)
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda v: v * 2)(y)), a * 2)
  copied = jnp.from_dlpack(a, copy=True)
  assert not np.shares_memory(np.asarray(copied), a)
  strided = jnp.from_dlpack(a[:, ::2])  # not contiguous: copied
  np.testing.assert_array_equal(np.asarray(strided), a[:, ::2])
  assert jnp.from_dlpack(np.arange(3.0)).dtype == np.float32  # float64 without x64: float32, as JAX
  with tj.config.override("jax_enable_x64", True):
    wide = np.arange(3.0)
    assert jnp.from_dlpack(wide).dtype == np.float64 and np.shares_memory(np.asarray(jnp.from_dlpack(wide)), wide)
  round_trip = jnp.from_dlpack(x)  # tinyjax to tinyjax
  np.testing.assert_array_equal(np.asarray(round_trip), np.asarray(x))
  legacy = x.__dlpack__()  # a pre-1.0 consumer can't be told the memory is read-only: it gets a copy
  assert type(legacy).__name__ == "PyCapsule"
  with pytest.raises(TypeError, match="does not export DLPack"):
    jnp.from_dlpack([1.0, 2.0])
  complex_host = np.array([1 + 2j, 3 - 1j], np.complex64)
  np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(complex_host)), complex_host)


def test_device_keyword_of_creation_functions():
  """`device=` (the array API's and JAX's) puts the result there, committed, as JAX; under jit it labels."""
  device = tj.devices()[0]
  made = [jnp.zeros(3, device=device), jnp.ones((2, 2), jnp.int32, device=device), jnp.full(2, 7.0, device=device),
          jnp.asarray([1.0, 2.0], device=device), jnp.array([1, 2], device=device), jnp.arange(4, device=device),
          jnp.linspace(0.0, 1.0, 5, device=device), jnp.eye(3, device=device),
          jnp.zeros_like(np.ones(2), device=device), jnp.astype(jnp.arange(3), jnp.float32, device=device)]
  for x in made: assert x.committed and x.device is device
  np.testing.assert_array_equal(np.asarray(made[6]), np.linspace(0.0, 1.0, 5, dtype=np.float32))
  assert not jnp.zeros(3).committed and not jnp.arange(3).astype(jnp.float32).committed
  inside = tj.jit(lambda: jnp.zeros(3, device=device) + 1)()
  np.testing.assert_array_equal(np.asarray(inside), [1.0, 1.0, 1.0])
  values, step = jnp.linspace(0.0, 1.0, 3, retstep=True, device=device)
  assert values.committed and float(step) == 0.5


def test_linalg_extension_without_factorisations():
  x = RNG.standard_normal((2, 3, 3)).astype(np.float32)
  x64 = x.astype(np.float64)
  np.testing.assert_allclose(np.asarray(jnp.linalg.trace(x, offset=1)), np.linalg.trace(x64, offset=1), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(jnp.linalg.diagonal(x, offset=-1)), np.linalg.diagonal(x, offset=-1))
  for n in (0, 1, 2, 5):
    np.testing.assert_allclose(np.asarray(jnp.linalg.matrix_power(x, n)), np.linalg.matrix_power(x64, n), rtol=1e-4,
                               atol=1e-5)
  for ord in (2, 1, np.inf, -np.inf, 0, 3):
    for axis in (None, 1, (0, 2)):
      got = jnp.linalg.vector_norm(x, axis=axis, ord=ord)
      np.testing.assert_allclose(np.asarray(got), np.linalg.vector_norm(x64, axis=axis, ord=ord), rtol=1e-5)
      kept = jnp.linalg.vector_norm(x, axis=axis, ord=ord, keepdims=True)
      assert kept.shape == np.linalg.vector_norm(x64, axis=axis, ord=ord, keepdims=True).shape
  for ord in ("fro", 1, -1, np.inf, -np.inf):
    np.testing.assert_allclose(np.asarray(jnp.linalg.matrix_norm(x, ord=ord)), np.linalg.matrix_norm(x64, ord=ord),
                               rtol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.linalg.cross(x, x[::-1])), np.linalg.cross(x64, x64[::-1]), atol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.linalg.vecdot(x, x)), np.linalg.vecdot(x64, x64), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(jnp.linalg.outer(x[0, 0], x[0, 1])), np.linalg.outer(x64[0, 0], x64[0, 1]),
                             rtol=1e-6)
  # the identity d||v|| / dv = v / ||v||, batched and jitted; and d trace(A^2) / dA = 2 A^T
  grads = tj.jit(tj.vmap(tj.grad(lambda v: jnp.linalg.vector_norm(v))))(x.reshape(6, 3))
  np.testing.assert_allclose(np.asarray(grads), x.reshape(6, 3) / np.linalg.norm(x.reshape(6, 3), axis=1,
                                                                               keepdims=True), rtol=1e-5)
  squared = tj.grad(lambda a: jnp.linalg.trace(jnp.linalg.matrix_power(a, 2)))(x[0])
  np.testing.assert_allclose(np.asarray(squared), 2 * x[0].T, rtol=1e-5)
  with pytest.raises(ValueError, match="3-dimensional vectors"):
    jnp.linalg.cross(jnp.ones(2), jnp.ones(2))
  with pytest.raises(ValueError, match="square"):
    jnp.linalg.matrix_power(jnp.ones((2, 3)), 2)
  m = np.array([[2.0, 1.0], [1.0, 1.0]], np.float32)  # a negative power inverts first (JAX: [[2, -3], [-3, 5]])
  np.testing.assert_allclose(np.asarray(jnp.linalg.matrix_power(m, -2)), [[2, -3], [-3, 5]], rtol=1e-5)


def test_fixes_found_by_the_array_api_suite():
  """Each found by data-apis/array-api-tests (run with JAX's skip list) and checked against numpy / JAX 0.10.2."""
  import inspect
  for name in ("zeros", "ones", "empty", "full", "arange", "asarray", "eye", "linspace", "zeros_like", "full_like"):
    assert inspect.signature(getattr(jnp, name)).parameters["device"].kind is inspect.Parameter.KEYWORD_ONLY, name
  assert "copy" in inspect.signature(jnp.reshape).parameters
  a = np.array([[1, 4, 9], [2, 3, 7]])
  np.testing.assert_array_equal(np.asarray(jnp.diff(a, prepend=0, append=np.array([[1], [2]]))),
                                np.diff(a, prepend=0, append=np.array([[1], [2]])))
  np.testing.assert_array_equal(np.asarray(jnp.diff(a, axis=0, prepend=a[:1])), np.diff(a, axis=0, prepend=a[:1]))
  scalar = jnp.asarray(np.float32(3.0))
  assert scalar[jnp.asarray(True)].shape == (1,) and scalar[jnp.asarray(False)].shape == (0,)
  assert jnp.arange(6).reshape(2, 3)[jnp.asarray(True)].shape == (1, 2, 3)
  np.testing.assert_array_equal(np.asarray(jnp.arange(5, None, 2)), np.arange(5, None, 2))
  assert jnp.arange(0, None, 1).shape == (0,)
  assert jnp.repeat(jnp.ones(0, bool), jnp.asarray([1], jnp.int8)).shape == (0,)
  np.testing.assert_array_equal(np.asarray(jnp.repeat(jnp.arange(3), jnp.asarray([2]))), np.repeat(np.arange(3), [2]))
  assert jnp.vecdot(jnp.ones(3, jnp.uint8), jnp.ones(3, jnp.uint8)).dtype == np.uint8


def test_acosh_below_one_is_nan_also_far_below():
  """Found by array-api-tests: for x << -1, t + sqrt(t^2 + 2t) rounded to 0 and acosh gave 0."""
  with tj.config.override("jax_enable_x64", True):
    got = np.asarray(jnp.arccosh(jnp.asarray([-3.7e16, -2.0, 0.5, 1.0, 2.0])))
  assert np.all(np.isnan(got[:3])) and got[3] == 0.0 and np.isclose(got[4], np.arccosh(2.0))
