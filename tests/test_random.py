"""tinyjax.random: bit-exact against JAX 0.10's outputs for the same keys (tests/data/random_reference.json, made by
tests/data/make_random_reference.py; JAX is not needed here), distribution statistics, typed keys, jit / vmap /
grad, and JAX's errors for bad keys and dtypes."""
import json
import math
import os

import ml_dtypes
import numpy as np
import pytest

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import random

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "random_reference.json")) as f:
  REFERENCE = json.load(f)["cases"]
BITS_OF = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}
DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16)}


def decode(out):
  dtype = DTYPES.get(out["dtype"], np.dtype(out["dtype"]))
  if out["dtype"] in BITS_OF:
    return np.array(out["values"], BITS_OF[out["dtype"]]).view(dtype).reshape(out["shape"])
  return np.array(out["values"], dtype).reshape(out["shape"])


def run_case(case):
  fn, args = case["fn"], case["args"]
  key = random.PRNGKey(args.get("seed", 0))
  shape = tuple(args["shape"]) if args.get("shape") is not None else None
  if fn == "PRNGKey": return random.PRNGKey(args["seed"])
  if fn == "split": return random.split(key, args["num"] if isinstance(args["num"], int) else tuple(args["num"]))
  if fn == "fold_in": return random.fold_in(key, args["data"])
  if fn == "bits": return random.bits(key, shape, args["dtype"])
  if fn == "uniform": return random.uniform(key, shape, args["dtype"], args.get("minval", 0.0), args.get("maxval", 1.0))
  if fn == "normal": return random.normal(key, shape, args["dtype"])
  if fn == "randint": return random.randint(key, shape, args["minval"], args["maxval"], args["dtype"])
  if fn == "bernoulli": return random.bernoulli(key, args["p"], shape)
  if fn in ("exponential", "gumbel", "laplace", "logistic"): return getattr(random, fn)(key, shape)
  if fn == "categorical": return random.categorical(key, tnp.asarray(np.array(args["logits"], np.float32)))
  if fn == "truncated_normal": return random.truncated_normal(key, args["lower"], args["upper"], shape)
  if fn == "vmap_normal": return tj.vmap(lambda k: random.normal(k, shape))(random.split(key, args["num"]))
  if fn == "permutation": return random.permutation(key, args["n"])
  if fn == "permutation_rows": return random.permutation(key, tnp.arange(15.0).reshape(5, 3))
  if fn == "permutation_independent":
    return random.permutation(key, tnp.arange(18.0).reshape(3, 6), axis=1, independent=True)
  if fn == "choice": return random.choice(key, args["n"], shape, replace=args["replace"])
  if fn == "choice_p":
    return random.choice(key, args["n"], shape, replace=args["replace"], p=tnp.asarray(np.array(args["p"], np.float32)))
  if fn == "categorical_without":
    return random.categorical(key, tnp.asarray(np.array(args["logits"], np.float32)), shape=shape, replace=False)
  raise AssertionError(fn)


EXACT = {"PRNGKey", "split", "fold_in", "bits", "uniform", "randint", "bernoulli", "categorical", "permutation",
         "permutation_rows", "permutation_independent", "choice", "choice_p", "categorical_without"}


def ulp_distance(got, want):
  got, want = np.atleast_1d(np.asarray(got, np.float64)), np.atleast_1d(np.asarray(want, np.float64))
  spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
  distance = np.abs(got - want) / spacing
  distance[got == want] = 0
  return distance if distance.size else np.zeros(1)


@pytest.mark.parametrize("case", REFERENCE, ids=[f"{c['fn']}-{i}" for i, c in enumerate(REFERENCE)])
def test_matches_jax(case):
  want = decode(case["out"])
  got = run_case(case)
  got = np.asarray(got)
  assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
  if case["fn"] in EXACT:
    np.testing.assert_array_equal(got.view(BITS_OF.get(str(got.dtype), got.dtype)),
                                  want.view(BITS_OF.get(str(want.dtype), want.dtype)))
  elif got.dtype in (np.dtype(np.float16), DTYPES["bfloat16"]):  # rounded once from float32: at most 1 ulp apart
    ulp = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64) * 2 ** (23 - ml_dtypes.finfo(got.dtype).nmant)
    assert np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= ulp)
  elif case["fn"] in ("normal", "vmap_normal"):
    assert ulp_distance(got, want).max() <= 2, (got, want)  # erf_inv as XLA's, within 2 ulp
  else:  # log-based: -log(-log(u)) magnifies a 1-ulp difference of the logarithms
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)


def test_typed_keys():
  k = random.key(0)
  assert k.shape == () and str(k.dtype) == "key<fry>"
  np.testing.assert_array_equal(np.asarray(random.key_data(k)), np.asarray(random.PRNGKey(0)))
  keys = random.split(k, 3)
  assert isinstance(keys, random.PRNGKeyArray) and keys.shape == (3,)
  np.testing.assert_array_equal(np.asarray(random.key_data(keys)), np.asarray(random.split(random.PRNGKey(0), 3)))
  first, second, third = keys
  np.testing.assert_array_equal(np.asarray(random.normal(second, (4,))), np.asarray(random.normal(keys[1], (4,))))
  wrapped = random.wrap_key_data(random.key_data(keys))
  np.testing.assert_array_equal(np.asarray(random.key_data(wrapped)), np.asarray(random.key_data(keys)))
  assert random.split(k, (2, 3)).shape == (2, 3)
  assert "key<fry>" in repr(k)
  assert str(tj.typeof(k)) == "key<fry>[]" and str(tj.typeof(keys)) == "key<fry>[3]"  # as JAX prints them
  assert tj.typeof(keys).shape == (3,) and tj.typeof(keys).dtype == k.dtype
  sample = tj.jit(lambda key: random.uniform(key, (5,)))(k)  # typed keys are pytrees: jit passes them through
  np.testing.assert_array_equal(np.asarray(sample), np.asarray(random.uniform(random.PRNGKey(0), (5,))))
  new_key, value = tj.jit(lambda key: (random.split(key)[0], random.normal(key)))(k)
  assert isinstance(new_key, random.PRNGKeyArray)


def test_jit_vmap_and_independent_streams():
  key = random.PRNGKey(3)
  eager = random.normal(key, (4, 3))
  np.testing.assert_array_equal(np.asarray(tj.jit(lambda k: random.normal(k, (4, 3)))(key)), np.asarray(eager))
  keys = random.split(key, 5)
  batched = tj.vmap(lambda k: random.normal(k, (3,)))(keys)
  stacked = np.stack([np.asarray(random.normal(keys[i], (3,))) for i in range(5)])
  np.testing.assert_array_equal(np.asarray(batched), stacked)
  assert len({tuple(row) for row in np.asarray(batched).tolist()}) == 5
  typed = tj.vmap(lambda k: random.uniform(k, (2,)))(random.split(random.key(3), 5))
  np.testing.assert_array_equal(np.asarray(typed), np.stack([np.asarray(random.uniform(keys[i], (2,)))
                                                              for i in range(5)]))
  folded = tj.vmap(lambda i: random.fold_in(key, i))(tnp.arange(4))
  np.testing.assert_array_equal(np.asarray(folded), np.stack([np.asarray(random.fold_in(key, i)) for i in range(4)]))
  nested = tj.jit(tj.vmap(tj.vmap(lambda k: random.bits(k, (2,)))))(random.split(key, (2, 3)))
  assert nested.shape == (2, 3, 2) and nested.dtype == np.uint32


def test_distribution_statistics():
  key = random.PRNGKey(0)
  n = 200_000
  normal = np.asarray(random.normal(key, (n,)), np.float64)
  assert abs(normal.mean()) < 5 / math.sqrt(n) and abs(normal.var() - 1) < 5 * math.sqrt(2 / n)
  normal_sorted = np.sort(normal)  # Kolmogorov-Smirnov against the normal CDF
  cdf = 0.5 * (1 + np.vectorize(math.erf)(normal_sorted[::50] / math.sqrt(2)))
  assert np.abs(cdf - (np.arange(0, n, 50) + 0.5) / n).max() < 1.63 * 1.5 / math.sqrt(n) * 10
  uniform = np.asarray(random.uniform(key, (n,), minval=2.0, maxval=5.0), np.float64)
  assert uniform.min() >= 2.0 and uniform.max() < 5.0 and abs(uniform.mean() - 3.5) < 5 * math.sqrt(0.75 / n)
  ints = np.asarray(random.randint(key, (n,), -3, 4))
  assert ints.min() == -3 and ints.max() == 3
  counts = np.bincount(ints + 3)
  assert ((counts - n / 7) ** 2 / (n / 7)).sum() < 40  # chi-square, 6 degrees of freedom
  assert abs(np.asarray(random.bernoulli(key, 0.3, (n,))).mean() - 0.3) < 0.01
  assert abs(np.asarray(random.exponential(key, (n,)), np.float64).mean() - 1) < 0.02
  assert abs(np.asarray(random.gumbel(key, (n,)), np.float64).mean() - np.euler_gamma) < 0.02
  assert abs(np.asarray(random.laplace(key, (n,)), np.float64).var() - 2) < 0.05
  truncated = np.asarray(random.truncated_normal(key, -1.0, 2.0, (n,)))
  assert truncated.min() > -1.0 and truncated.max() < 2.0
  logits = np.log(np.array([0.1, 0.2, 0.7], np.float32))
  draws = np.asarray(random.categorical(key, tnp.asarray(logits), shape=(n,)))
  np.testing.assert_allclose(np.bincount(draws, minlength=3) / n, [0.1, 0.2, 0.7], atol=0.01)
  cov = np.array([[2.0, 0.6], [0.6, 1.0]], np.float32)
  samples = np.asarray(random.multivariate_normal(key, np.array([1.0, -1.0], np.float32), cov, (50_000,)),
                       np.float64)
  np.testing.assert_allclose(samples.mean(0), [1.0, -1.0], atol=0.03)
  np.testing.assert_allclose(np.cov(samples.T), cov, atol=0.05)


def test_reparameterised_gradients():
  key = random.PRNGKey(5)
  z = np.asarray(random.normal(key, (8,)), np.float64)

  def loss(mu, sigma): return (mu + sigma * random.normal(key, (8,))).sum()
  grads = tj.grad(loss, argnums=(0, 1))(1.0, 2.0)
  assert float(grads[0]) == 8.0 and abs(float(grads[1]) - z.sum()) < 1e-5
  grads = tj.jit(tj.grad(loss, argnums=(0, 1)))(1.0, 2.0)
  assert abs(float(grads[1]) - z.sum()) < 1e-5
  # truncated_normal and uniform are differentiable in their bounds where JAX's are
  grad_high = tj.grad(lambda high: random.uniform(key, (), minval=0.0, maxval=high))(3.0)
  assert abs(float(grad_high) - float(random.uniform(key, ()))) < 1e-6


def test_bad_keys_and_dtypes():
  with pytest.raises(TypeError, match="dtype = uint32"):
    random.normal(tnp.zeros(2), (2,))
  with pytest.raises(TypeError, match="end with"):
    random.normal(tnp.zeros(3, tnp.uint32), (2,))
  with pytest.raises(ValueError, match="accepts a single key"):
    random.normal(random.split(random.PRNGKey(0), 2), (2,))
  with pytest.raises(ValueError, match="float dtype"):
    random.uniform(random.PRNGKey(0), dtype=tnp.int32)
  with pytest.raises(TypeError, match="integer dtypes"):
    random.randint(random.PRNGKey(0), (2,), 0, 5, dtype=tnp.float32)
  with pytest.raises(TypeError, match="seed must be an integer"):
    random.key(1.5)
  with pytest.raises(TypeError, match="unsigned"):
    random.bits(random.PRNGKey(0), (2,), tnp.int32)
  with pytest.raises(ValueError, match="broadcast-compatible"):
    random.uniform(random.PRNGKey(0), (3,), minval=tnp.zeros(4))
  with pytest.raises(TypeError):
    random.normal("not a key")


@pytest.mark.parametrize("sample", [lambda k: random.uniform(k, (4,), dtype=tnp.float64),
                                    lambda k: random.normal(k, (4,), dtype=tnp.float64),
                                    lambda k: random.randint(k, (4,), 0, 9, dtype=tnp.int64),
                                    lambda k: random.bits(k, (4,), dtype=tnp.uint64)])
def test_64_bit_dtypes_without_x64_warn_and_truncate(sample):
  """As JAX: a 64-bit dtype asked of a sampler while jax_enable_x64 is off is a UserWarning, and the 32-bit dtype."""
  with pytest.warns(UserWarning, match="Explicitly requested dtype .*64 is not available"):
    values = sample(random.key(0))
  assert values.dtype.itemsize == 4
