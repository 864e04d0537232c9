"""Train a 3-layer MLP on a synthetic regression task with a functional loop: params are a pytree (dict), the step
is `jit(value_and_grad(loss))`, and the update is plain SGD written with tree_map.

    .venv/bin/python examples/mlp.py            # DEBUG=1 shows each kernel launch of a step
"""
import time

import numpy as np

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax.tree_util import tree_map


def init(rng: np.random.Generator, sizes=(8, 32, 32, 1)) -> dict:
  return {f"layer{i}": {"w": (rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32),
                        "b": np.zeros(n, np.float32)} for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:]))}


def predict(params: dict, x):
  hidden = x
  for i in range(len(params)):
    layer = params[f"layer{i}"]
    hidden = hidden @ layer["w"] + layer["b"]
    if i < len(params) - 1: hidden = tnp.tanh(hidden)
  return hidden


def loss(params: dict, x, y):
  return ((predict(params, x) - y) ** 2).mean()


@tj.jit
def train_step(params: dict, x, y, learning_rate):
  value, grads = tj.value_and_grad(loss)(params, x, y)
  return value, tree_map(lambda p, g: p - learning_rate * g, params, grads)


def main() -> None:
  rng = np.random.default_rng(0)
  x = rng.standard_normal((256, 8)).astype(np.float32)
  y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)
  params = tree_map(tnp.asarray, init(rng))
  start = time.perf_counter()
  for step in range(301):
    value, params = train_step(params, x, y, 0.1)
    if step == 0: print(f"first step (trace + lower + compile): {(time.perf_counter() - start) * 1e3:.0f} ms")
    if step % 100 == 0: print(f"step {step:3d}  loss {float(value):.5f}")
  print(f"{(time.perf_counter() - start) * 1e3 / 301:.2f} ms per step on average")


if __name__ == "__main__":
  main()
