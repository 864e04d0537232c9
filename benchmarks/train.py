"""Training-step figures: milliseconds per jitted step of examples/mlp.py's MLP and examples/cnn.py's CNN (batch 128,
Adam + warmup-cosine, random data). With `--compare`, the same models written in JAX + optax, timed in the same
process when they are importable (run it from a virtualenv that has both, e.g. `PYTHONPATH=. jaxvenv/bin/python`).

    python benchmarks/train.py [mlp|cnn] [--compare] [--epoch]     # --epoch: seconds per epoch on Fashion-MNIST
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


def epochs(name: str, compare: bool) -> None:
  """Seconds per epoch on Fashion-MNIST, the loop of examples/training.py (shuffled batches prepared on a background
  thread, the loss read every 20 steps) with the same batches for both libraries; best of 2 epochs after one."""
  from tinyjax.nn import datasets
  train_x, train_y, _, _ = datasets.fashion_mnist()
  train_x = (train_x.astype(np.float32) / 255.0)[..., None]
  train_y = train_y.astype(np.int32)
  model = MODELS[name]
  steps = {"tinyjax": (*tinyjax_step(model, model.init(random.PRNGKey(0))), lambda a: a)}
  if compare:
    try:
      jstep, jstate, _ = jax_step(name, 0)
      steps["JAX"] = (jstep, jstate, np.asarray)
    except ImportError as error:
      print(f"(no JAX comparison: {error})")
  best = {who: float("inf") for who in steps}
  for epoch in range(3):
    for who, (step, state, convert) in steps.items():
      start = time.perf_counter()
      for i, (x, y) in enumerate(datasets.batches((train_x, train_y), BATCH, key=random.PRNGKey(epoch)), start=1):
        state = step(*state, convert(x), convert(y))
        if i % 20 == 0: float(tj.tree.leaves(state)[0].reshape(-1)[0])
      tj.tree.leaves(state)[0].block_until_ready()
      if epoch: best[who] = min(best[who], time.perf_counter() - start)
      steps[who] = (step, state, convert)
  line = f"{name} epoch (Fashion-MNIST, batch {BATCH}): " + "  ".join(f"{who} {t:5.2f} s" for who, t in best.items())
  if "JAX" in best: line += f"  ratio (JAX time / ours) {best['JAX'] / best['tinyjax']:5.2f}x"
  print(line, flush=True)


def main() -> None:
  compare = "--compare" in sys.argv
  wanted = [a for a in sys.argv[1:] if not a.startswith("--")] or list(MODELS)
  rng = np.random.default_rng(0)
  if "--epoch" in sys.argv:
    for name in wanted: epochs(name, compare)
    return
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
