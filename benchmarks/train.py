"""Training-step figures: milliseconds per jitted step of examples/mlp.py's MLP and examples/cnn.py's CNN (batch 128,
Adam + warmup-cosine, random data). With `--compare`, the same models written in JAX + optax, timed in the same
process when they are importable (run it from a virtualenv that has both, e.g. `PYTHONPATH=. jaxvenv/bin/python`).

    python benchmarks/train.py [mlp|cnn] [--compare]
"""
from __future__ import annotations

import sys
import time

import numpy as np

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import nn, random
from tinyjax.nn import optim

BATCH = 128
ROUNDS = 10  # timed passes per library


class Timer:
  """Times passes of a training step through a list of batches, the state threaded through; the best mean seconds
  per step over the passes timed so far. Passes of the two libraries alternate (`main`), so that the machine's
  noise hits both alike."""

  def __init__(self, step, state, batches, sync):
    self.step, self.state, self.batches, self.sync, self.best = step, state, batches, sync, float("inf")
    self.run()  # warm-up: compile

  def run(self) -> None:
    start = time.perf_counter()
    for x, y in self.batches: self.state = self.step(*self.state, x, y)
    self.sync(self.state)
    self.best = min(self.best, (time.perf_counter() - start) / len(self.batches))


def tinyjax_step(model, params):
  optimizer = optim.adam(optim.warmup_cosine_decay_schedule(0.0, 1e-3, 50, 5000))

  def loss_fn(p, x, y):
    logits = model.apply(p, x)
    return -(nn.log_softmax(logits) * nn.one_hot(y, 10)).sum(axis=-1).mean(), (tnp.argmax(logits, -1) == y).mean()

  @tj.jit
  def step(p, s, x, y):
    (loss, accuracy), grads = tj.value_and_grad(loss_fn, has_aux=True)(p, x, y)
    updates, s = optimizer.update(grads, s, p)
    return optim.apply_updates(p, updates), s
  return step, (params, optimizer.init(params))


def jax_step(name, seed):
  import jax
  import jax.numpy as jnp
  import optax
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), 8))

  def dense(n_in, n_out):
    return {"w": jax.nn.initializers.lecun_normal()(next(keys), (n_in, n_out)), "b": jnp.zeros(n_out)}

  def conv(c_in, c_out):
    return {"w": jax.nn.initializers.lecun_normal()(next(keys), (3, 3, c_in, c_out)), "b": jnp.zeros(c_out)}

  if name == "mlp":
    params = [dense(784, 512), dense(512, 512), dense(512, 10)]

    def apply(p, x):
      h = x.reshape(x.shape[0], -1)
      for layer in p[:-1]: h = jax.nn.relu(h @ layer["w"] + layer["b"])
      return h @ p[-1]["w"] + p[-1]["b"]
  else:
    params = [conv(1, 32), conv(32, 64), dense(7 * 7 * 64, 128), dense(128, 10)]

    def apply(p, x):
      for layer in p[:2]:
        x = jax.lax.conv_general_dilated(x, layer["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        x = jax.nn.relu(x + layer["b"])
        x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
      h = jax.nn.relu(x.reshape(x.shape[0], -1) @ p[2]["w"] + p[2]["b"])
      return h @ p[3]["w"] + p[3]["b"]
  optimizer = optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 50, 5000))

  def loss_fn(p, x, y):
    logits = apply(p, x)
    return -(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 10)).sum(-1).mean(), (jnp.argmax(logits, -1) == y).mean()

  @jax.jit
  def step(p, s, x, y):
    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, x, y)
    updates, s = optimizer.update(grads, s, p)
    return optax.apply_updates(p, updates), s
  return step, (params, optimizer.init(params)), jax


MODELS = {
  "mlp": nn.Sequential(nn.flatten, nn.Linear(784, 512), nn.relu, nn.Linear(512, 512), nn.relu, nn.Linear(512, 10)),
  "cnn": nn.Sequential(nn.Conv2d(1, 32, 3), nn.relu, lambda x: nn.max_pool(x, (2, 2)),
                       nn.Conv2d(32, 64, 3), nn.relu, lambda x: nn.max_pool(x, (2, 2)),
                       nn.flatten, nn.Linear(7 * 7 * 64, 128), nn.relu, nn.Linear(128, 10)),
}


def main() -> None:
  compare = "--compare" in sys.argv
  wanted = [a for a in sys.argv[1:] if not a.startswith("--")] or list(MODELS)
  rng = np.random.default_rng(0)
  for name in wanted:
    batches = [(rng.random((BATCH, 28, 28, 1), np.float32), rng.integers(0, 10, BATCH).astype(np.int32))
               for _ in range(20 if name == "mlp" else 6)]
    model = MODELS[name]
    step, state = tinyjax_step(model, model.init(random.PRNGKey(0)))
    timers = {"tinyjax": Timer(step, state, [(tj.device_put(x), tj.device_put(y)) for x, y in batches],
                               tj.block_until_ready)}
    note = ""
    if compare:
      try:
        jstep, jstate, jax = jax_step(name, 0)
      except ImportError as error:
        note = f"  (no JAX comparison: {error})"
      else:
        timers["JAX"] = Timer(jstep, jstate, [(jax.device_put(x), jax.device_put(y)) for x, y in batches],
                              jax.block_until_ready)
    for _ in range(ROUNDS):
      for timer in timers.values(): timer.run()
    line = f"{name} step, batch {BATCH}: " + "  ".join(f"{who} {t.best * 1e3:7.2f} ms" for who, t in timers.items())
    if "JAX" in timers:
      line += f"  ratio (JAX time / ours) {timers['JAX'].best / timers['tinyjax'].best:5.2f}x"
    print(line + note, flush=True)


if __name__ == "__main__":
  main()
