"""lax extras: associative_scan, cumlogsumexp, the general reduce, broadcasted_iota, population_count, clz,
reduce_precision, optimization_barrier; against numpy / exact references and JAX 0.10.2's values."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import lax


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32], ids=str)
def test_population_count_and_clz(dtype):
  info = np.iinfo(dtype)
  rng = np.random.default_rng(0)
  x = np.concatenate([np.array([0, 1, info.max, info.min, 2, 3], dtype),
                      rng.integers(info.min, info.max, 50, endpoint=True).astype(dtype)])
  bits = np.dtype(dtype).itemsize * 8
  unsigned = x.view(f"uint{bits}").astype(np.uint64)
  want_pop = np.array([bin(int(v)).count("1") for v in unsigned])
  want_clz = np.array([bits - int(v).bit_length() for v in unsigned])
  for fn in (lambda v: v, tj.jit):
    pop, lead = fn(lax.population_count)(x), fn(lax.clz)(x)
    assert pop.dtype == dtype and lead.dtype == dtype
    np.testing.assert_array_equal(np.asarray(pop).astype(np.int64), want_pop)
    np.testing.assert_array_equal(np.asarray(lead).astype(np.int64), want_clz)
  with pytest.raises(TypeError, match="integer"):
    lax.population_count(np.ones(2, np.float32))


@pytest.mark.parametrize("length", [1, 2, 7, 8, 13])
def test_associative_scan_matches_sequential(length):
  rng = np.random.default_rng(length)
  x = rng.standard_normal((3, length))
  np.testing.assert_allclose(np.asarray(lax.associative_scan(tnp.add, x.astype(np.float32), axis=1)),
                             np.cumsum(x, axis=1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(lax.associative_scan(tnp.maximum, x.T.astype(np.float32))),
                             np.maximum.accumulate(x.T, axis=0), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(lax.associative_scan(tnp.add, x.astype(np.float32), reverse=True, axis=1)),
                             np.cumsum(x[:, ::-1], axis=1)[:, ::-1], rtol=1e-5, atol=1e-5)
  # a non-commutative pytree combination: composing affine maps (a, b): x -> a * x + b
  a, b = rng.uniform(0.5, 1.5, length), rng.standard_normal(length)

  def compose(first, second): return (second[0] * first[0], second[0] * first[1] + second[1])
  got_a, got_b = lax.associative_scan(compose, (a.astype(np.float32), b.astype(np.float32)))
  want_a, want_b, ca, cb = [], [], 1.0, 0.0
  for ai, bi in zip(a, b):
    ca, cb = ai * ca, ai * cb + bi
    want_a.append(ca)
    want_b.append(cb)
  np.testing.assert_allclose(np.asarray(got_a), want_a, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(got_b), want_b, rtol=1e-5, atol=1e-5)


def test_associative_scan_transformations_and_cumlogsumexp():
  x = np.random.default_rng(1).standard_normal((4, 9)).astype(np.float32)
  batched = tj.jit(tj.vmap(lambda row: lax.associative_scan(tnp.multiply, row)))(x)
  np.testing.assert_allclose(np.asarray(batched), np.cumprod(x.astype(np.float64), axis=1), rtol=1e-5, atol=1e-6)
  grad = np.asarray(tj.grad(lambda v: (lax.associative_scan(tnp.add, v) ** 2).sum())(tnp.asarray(x[0])))
  prefix = np.cumsum(x[0].astype(np.float64))
  np.testing.assert_allclose(grad, np.cumsum((2 * prefix)[::-1])[::-1], rtol=1e-5)
  got = lax.cumlogsumexp(x, axis=1)
  np.testing.assert_allclose(np.asarray(got), np.log(np.cumsum(np.exp(x.astype(np.float64)), axis=1)), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(lax.cumlogsumexp(x, axis=1, reverse=True)),
                             np.log(np.cumsum(np.exp(x[:, ::-1].astype(np.float64)), axis=1))[:, ::-1], rtol=1e-5)
  with pytest.raises(ValueError, match="same length"):
    lax.associative_scan(tnp.add, (np.ones(3), np.ones(4)))
  # each level is materialised: a jitted scan over 4096 elements compiles in about a second (it took minutes when
  # the levels were fused into one another); its value is checked too
  long = np.random.default_rng(2).standard_normal(4096).astype(np.float32)
  scan = tj.jit(lambda v: lax.associative_scan(tnp.add, v))
  np.testing.assert_allclose(np.asarray(scan(long)), np.cumsum(long.astype(np.float64)), rtol=1e-4, atol=1e-3)
  # so is each level's interleave: no kernel chooses among the buffers of many levels per element (one did, 24 of
  # them, 4x slower than JAX)
  kernels = re.findall(r"# kernel \S+ buffers=\[([^\]]*)\]", scan.lower(long).as_text())
  assert kernels and max(len(buffers.split(",")) for buffers in kernels) <= 4


def test_general_reduce():
  m = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7) / 3
  np.testing.assert_allclose(np.asarray(lax.reduce(m, 0.0, lax.add, (1,))), m.sum(1), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(lax.reduce(m, -np.inf, lax.max, (0, 2))), m.max((0, 2)))
  # a computation that is no known monoid runs as a halving tree (odd lengths padded with the identity)
  got = lax.reduce(m, 1.0, lambda a, b: a * b, (2,))
  np.testing.assert_allclose(np.asarray(got), m.astype(np.float64).prod(2), rtol=1e-5)
  pair = lax.reduce((m, -m), (0.0, 0.0), lambda a, b: (a[0] + b[0], tnp.maximum(a[1], b[1])), (0, 1))
  np.testing.assert_allclose(np.asarray(pair[0]), m.sum((0, 1)), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(pair[1]), np.maximum((-m).max((0, 1)), 0.0))
  empty = lax.reduce(np.zeros((0, 3), np.float32), 0.0, lambda a, b: a + b, (0,))
  np.testing.assert_array_equal(np.asarray(empty), np.zeros(3))
  with pytest.raises(ValueError, match="structure"):
    lax.reduce((m, m), 0.0, lax.add, (0,))
  # as JAX: the init value is combined once (not an identity here), an empty reduction is the init value, no
  # dimensions leave the operand as it is, axes are checked
  a = np.arange(6, dtype=np.float32)
  assert float(lax.reduce(a, np.float32(1), lax.add, (0,))) == 16.0
  assert float(lax.reduce(a, np.float32(1), lambda x, y: x + y, (0,))) == 16.0
  assert float(lax.reduce(np.arange(7, dtype=np.float32), np.float32(0), lambda x, y: x + y, (0,))) == 21.0
  np.testing.assert_array_equal(np.asarray(lax.reduce(np.zeros((0, 3), np.float32), np.float32(5),
                                                      lambda x, y: x + y, (0,))), [5, 5, 5])
  np.testing.assert_array_equal(np.asarray(lax.reduce(a, np.float32(1), lax.add, ())), a)
  assert int(lax.reduce(np.array([3, 5, 7], np.uint8), np.uint8(255), lax.bitwise_and, (0,))) == 1
  for bad in ((-1,), (0, 0)):
    with pytest.raises(ValueError, match="dimensions"):
      lax.reduce(a.reshape(2, 3), np.float32(0), lax.add, bad)


def test_iota_barrier_and_reduce_precision():
  np.testing.assert_array_equal(np.asarray(lax.broadcasted_iota(np.int32, (2, 3), 1)), [[0, 1, 2], [0, 1, 2]])
  with pytest.raises(ValueError, match="dimension"):
    lax.broadcasted_iota(np.int32, (2, 3), -1)
  tree = {"a": tnp.ones(2), "b": (tnp.zeros(3),)}
  out = lax.optimization_barrier(tree)
  assert tj.tree.structure(out) == tj.tree.structure(tree)
  v = np.array([1.0, 1.0000001, 3.14159265, 1e-30, 1e30, -2.5e-8, 65504, 70000, np.inf, np.nan], np.float32)
  want = {  # JAX 0.10.2's values
    (8, 7): [1.0, 1.0, 3.140625, 9.98402083170343e-31, 1.0002555517425873e+30, -2.5029294192790985e-08, 65536.0,
             70144.0, np.inf, np.nan],
    (5, 10): [1.0, 1.0, 3.140625, 0.0, np.inf, -0.0, 65504.0, np.inf, np.inf, np.nan],
    (4, 3): [1.0, 1.0, 3.25, 0.0, np.inf, -0.0, np.inf, np.inf, np.inf, np.nan],
  }
  for (exponent, mantissa), values in want.items():
    got = np.asarray(lax.reduce_precision(v, exponent, mantissa))
    np.testing.assert_array_equal(got, np.array(values, np.float32))
    assert (np.signbit(got) == np.signbit(np.array(values, np.float32))).all()
  # differentiable as the identity (JAX), NaN kept even with no mantissa bits
  assert float(tj.grad(lambda x: lax.reduce_precision(x * x, 8, 7))(1.3)) == pytest.approx(2.6)
  kept = np.asarray(lax.reduce_precision(np.array([np.nan, 1.5], np.float32), 8, 0))
  assert np.isnan(kept[0]) and kept[1] == 2.0
  # as bfloat16 / float16 round trips
  import ml_dtypes
  np.testing.assert_array_equal(np.asarray(lax.reduce_precision(v[:8], 8, 7)),
                                v[:8].astype(ml_dtypes.bfloat16).astype(np.float32))
