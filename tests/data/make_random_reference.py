"""Writes random_reference.json: JAX 0.10's outputs of jax.random for fixed keys, the reference that
tests/test_random.py checks tinyjax.random against bit for bit. Needs jax (never a test dependency); run once with a
Python that has it:

    python tests/data/make_random_reference.py

Each case is (function, arguments, dtype, value): floats are stored as their bit patterns (uint16/uint32), so the
comparison is exact."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

random = jax.random
SEEDS = [0, 1, 42, -1, 2**31 - 1, 2**40, 123456789]
SHAPES = [(), (1,), (7,), (3, 5), (2, 0)]
BITS_OF = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}


def encode(array):
  array = np.asarray(array)
  dtype = str(array.dtype)
  values = array.view(BITS_OF[dtype]) if dtype in BITS_OF else array
  return {"dtype": dtype, "shape": list(array.shape), "values": values.ravel().tolist()}


cases = []
def add(name, args, value): cases.append({"fn": name, "args": args, "out": encode(value)})


for seed in SEEDS:
  add("PRNGKey", {"seed": seed}, random.PRNGKey(seed))
key = random.PRNGKey(1701)
for num in [2, 3, [2, 3], [1]]:
  add("split", {"seed": 1701, "num": num}, random.split(key, num if isinstance(num, int) else tuple(num)))
for data in [0, 1, 7, 2**31 - 1, 12345]:
  add("fold_in", {"seed": 1701, "data": data}, random.fold_in(key, data))
for seed in [0, 1701]:
  k = random.PRNGKey(seed)
  for shape in SHAPES:
    for dtype in ["uint8", "uint16", "uint32"]:
      add("bits", {"seed": seed, "shape": list(shape), "dtype": dtype}, random.bits(k, shape, dtype))
    for dtype in ["float32", "float16", "bfloat16"]:
      add("uniform", {"seed": seed, "shape": list(shape), "dtype": dtype}, random.uniform(k, shape, dtype))
      add("normal", {"seed": seed, "shape": list(shape), "dtype": dtype}, random.normal(k, shape, dtype))
    add("uniform", {"seed": seed, "shape": list(shape), "dtype": "float32", "minval": -3.0, "maxval": 2.5},
        random.uniform(k, shape, "float32", -3.0, 2.5))
    for dtype, low, high in [("int32", 0, 10), ("int32", -100, 100000), ("uint8", 0, 256), ("int8", -128, 127),
                             ("int32", 5, 5), ("int32", 9, 3), ("int16", -7, 300), ("uint32", 3, 4000000000)]:
      if dtype == "uint32" and high > 2**31 - 1: continue
      add("randint", {"seed": seed, "shape": list(shape), "dtype": dtype, "minval": low, "maxval": high},
          random.randint(k, shape, low, high, dtype))
k = random.PRNGKey(7)
add("bernoulli", {"seed": 7, "p": 0.3, "shape": [20]}, random.bernoulli(k, 0.3, (20,)))
add("exponential", {"seed": 7, "shape": [20]}, random.exponential(k, (20,)))
add("gumbel", {"seed": 7, "shape": [20]}, random.gumbel(k, (20,)))
add("laplace", {"seed": 7, "shape": [20]}, random.laplace(k, (20,)))
add("logistic", {"seed": 7, "shape": [20]}, random.logistic(k, (20,)))
add("categorical", {"seed": 7, "logits": [[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 0.0, 0.0]], "shape": None},
    random.categorical(k, jnp.array([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 0.0, 0.0]])))
add("truncated_normal", {"seed": 7, "lower": -1.5, "upper": 0.5, "shape": [20]},
    random.truncated_normal(k, -1.5, 0.5, (20,)))
for seed, n in [(0, 10), (3, 1), (5, 100), (9, 1000)]:
  add("permutation", {"seed": seed, "n": n}, random.permutation(random.PRNGKey(seed), n))
add("permutation_rows", {"seed": 4, "shape": [5, 3]},
    random.permutation(random.PRNGKey(4), jnp.arange(15.0).reshape(5, 3)))
add("permutation_independent", {"seed": 4, "shape": [3, 6]},
    random.permutation(random.PRNGKey(4), jnp.arange(18.0).reshape(3, 6), axis=1, independent=True))
add("choice", {"seed": 8, "n": 10, "shape": [6], "replace": True}, random.choice(random.PRNGKey(8), 10, (6,)))
add("choice", {"seed": 8, "n": 10, "shape": [6], "replace": False}, random.choice(random.PRNGKey(8), 10, (6,),
                                                                                    replace=False))
add("choice_p", {"seed": 8, "n": 4, "shape": [12], "replace": True, "p": [0.1, 0.2, 0.3, 0.4]},
    random.choice(random.PRNGKey(8), 4, (12,), p=jnp.array([0.1, 0.2, 0.3, 0.4])))
add("choice_p", {"seed": 8, "n": 4, "shape": [3], "replace": False, "p": [0.1, 0.2, 0.3, 0.4]},
    random.choice(random.PRNGKey(8), 4, (3,), replace=False, p=jnp.array([0.1, 0.2, 0.3, 0.4])))
add("categorical_without", {"seed": 7, "logits": [0.1, 2.0, -1.0, 0.5, 0.0], "shape": [3]},
    random.categorical(k, jnp.array([0.1, 2.0, -1.0, 0.5, 0.0]), shape=(3,), replace=False))
add("vmap_normal", {"seed": 7, "num": 4, "shape": [3]},
    jax.vmap(lambda kk: random.normal(kk, (3,)))(random.split(k, 4)))

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "random_reference.json")
with open(path, "w") as f:
  json.dump({"jax_version": jax.__version__, "cases": cases}, f, separators=(",", ":"))
print(f"wrote {len(cases)} cases to {path}")
