"""What examples/mlp.py and examples/cnn.py share: the flags, the data (Fashion-MNIST, or a built-in synthetic task when
it is not installed), the jitted training step with an nn.optim optimizer, a progress bar, evaluation, a checkpoint
and an optional plot of the curves."""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np
from absl import flags

import tinyjax as tj
import tinyjax.numpy as tnp
from tinyjax import nn, random
from tinyjax.nn import datasets, optim

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 5, "passes over the training set")
flags.DEFINE_integer("batch_size", 128, "examples per step")
flags.DEFINE_float("lr", 1e-3, "peak learning rate (Adam, warmup then cosine decay)")
flags.DEFINE_integer("seed", 0, "random seed (initialisation and shuffling)")
flags.DEFINE_string("checkpoint", "", "save params and optimizer state here at the end (safetensors)")
flags.DEFINE_string("plot", "", "write a PNG of the loss and accuracy curves here (needs matplotlib)")
flags.DEFINE_bool("synthetic", False, "use the built-in synthetic task instead of Fashion-MNIST")
flags.DEFINE_integer("limit", 0, "use only the first N training and test examples (0: all)")

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


def synthetic(n_train: int = 6000, n_test: int = 1000, seed: int = 0) -> tuple[np.ndarray, ...]:
  """Ten classes of 28x28 uint8 images: a class-specific pattern of bars and blobs, shifted and noisy."""
  rng = np.random.default_rng(seed)
  yy, xx = np.mgrid[0:28, 0:28]
  patterns = []
  for c in range(10):
    angle = np.pi * c / 10
    stripes = np.cos((xx * np.cos(angle) + yy * np.sin(angle)) * (0.35 + 0.05 * c))
    blob = np.exp(-((xx - 6 - 1.7 * c) ** 2 + (yy - 20 + 1.3 * c) ** 2) / 18)
    patterns.append(0.5 + 0.3 * stripes + 0.6 * blob)

  def make(n: int) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, 10, n).astype(np.uint8)
    shifts = rng.integers(-2, 3, (n, 2))
    images = np.stack([np.roll(patterns[y], tuple(s), axis=(0, 1)) for y, s in zip(labels, shifts)])
    images = images + 0.25 * rng.standard_normal(images.shape)
    return (np.clip(images, 0, 1) * 255).astype(np.uint8), labels
  return (*make(n_train), *make(n_test))


def load_data() -> tuple[np.ndarray, ...]:
  """(train images, train labels, test images, test labels) as float32 in [0, 1] (N, 28, 28, 1) and int32."""
  if FLAGS.synthetic:
    data, name = synthetic(seed=FLAGS.seed), "synthetic task"
  else:
    try:
      data, name = datasets.fashion_mnist(), "Fashion-MNIST"
    except FileNotFoundError as error:
      print(f"{error}\n-> training on the built-in synthetic task instead.\n", file=sys.stderr)
      data, name = synthetic(seed=FLAGS.seed), "synthetic task"
  train_x, train_y, test_x, test_y = data
  if FLAGS.limit: train_x, train_y, test_x, test_y = (a[:FLAGS.limit] for a in (train_x, train_y, test_x, test_y))
  print(f"{name}: {len(train_x)} training and {len(test_x)} test images")
  prepare = lambda images: (images.astype(np.float32) / 255.0)[..., None]  # noqa: E731
  return prepare(train_x), train_y.astype(np.int32), prepare(test_x), test_y.astype(np.int32)


def progress(epoch: int, done: int, total: int, loss: float, accuracy: float, rate: float) -> None:
  width = 24
  filled = int(width * done / max(total, 1))
  bar = "=" * filled + ">" * (filled < width) + " " * (width - filled - 1)
  print(f"\repoch {epoch} [{bar}] {done}/{total}  loss {loss:.4f}  acc {accuracy:.3f}  {rate:,.0f} examples/s",
        end="", flush=True)


def train(name: str, model: Any, params: Any) -> dict:
  """Train `model` (init/apply over NHWC images) with Adam and a warmup-cosine schedule; returns the history."""
  train_x, train_y, test_x, test_y = load_data()
  steps_per_epoch = len(train_x) // FLAGS.batch_size
  total_steps = max(steps_per_epoch * FLAGS.epochs, 1)
  schedule = optim.warmup_cosine_decay_schedule(0.0, FLAGS.lr, min(total_steps // 10, 500), total_steps)
  optimizer = optim.adam(schedule)
  opt_state = optimizer.init(params)

  def loss_fn(p: Any, x: Any, y: Any) -> tuple[Any, Any]:
    logits = model.apply(p, x)
    loss = -(nn.log_softmax(logits) * nn.one_hot(y, 10)).sum(axis=-1).mean()
    return loss, (tnp.argmax(logits, axis=-1) == y).mean()

  @tj.jit
  def step(p: Any, s: Any, x: Any, y: Any) -> tuple:
    (loss, accuracy), grads = tj.value_and_grad(loss_fn, has_aux=True)(p, x, y)
    updates, s = optimizer.update(grads, s, p)
    return optim.apply_updates(p, updates), s, loss, accuracy

  @tj.jit
  def correct(p: Any, x: Any, y: Any) -> Any:
    return (tnp.argmax(model.apply(p, x), axis=-1) == y).sum()

  def evaluate(p: Any) -> float:
    hits = sum(int(correct(p, x, y)) for x, y in datasets.batches((test_x, test_y), 1000, drop_last=False))
    return hits / len(test_x)

  history = {"loss": [], "accuracy": [], "test_accuracy": [], "seconds": []}
  key = random.PRNGKey(FLAGS.seed)
  print(f"{name}: {sum(np.size(leaf) for leaf in tj.tree.leaves(params)):,} parameters, {steps_per_epoch} steps per "
        f"epoch of {FLAGS.batch_size}")
  for epoch in range(1, FLAGS.epochs + 1):
    start, losses, accuracies = time.perf_counter(), [], []
    for i, (x, y) in enumerate(datasets.batches((train_x, train_y), FLAGS.batch_size, key=random.fold_in(key, epoch)),
                               start=1):
      params, opt_state, loss, accuracy = step(params, opt_state, x, y)
      if i % 20 == 0 or i == steps_per_epoch:
        losses.append(float(loss))
        accuracies.append(float(accuracy))
        progress(epoch, i, steps_per_epoch, losses[-1], accuracies[-1], i * FLAGS.batch_size /
                 (time.perf_counter() - start))
    seconds = time.perf_counter() - start
    test_accuracy = evaluate(params)
    history["loss"].append(float(np.mean(losses)) if losses else float("nan"))
    history["accuracy"].append(float(np.mean(accuracies)) if accuracies else float("nan"))
    history["test_accuracy"].append(test_accuracy)
    history["seconds"].append(seconds)
    print(f"\repoch {epoch}: {seconds:.1f} s, train loss {history['loss'][-1]:.4f}, train acc "
          f"{history['accuracy'][-1]:.3f}, test acc {test_accuracy:.4f}" + " " * 30)
  if FLAGS.checkpoint:
    nn.state.save(FLAGS.checkpoint, {"params": params, "opt_state": opt_state})
    print(f"saved params and optimizer state to {FLAGS.checkpoint}")
  if FLAGS.plot: plot(history, FLAGS.plot, name)
  return history


def plot(history: dict, path: str, title: str) -> None:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("--plot needs matplotlib: pip install matplotlib (or pip install -e '.[examples]')", file=sys.stderr)
    return
  epochs = range(1, len(history["loss"]) + 1)
  figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
  left.plot(epochs, history["loss"], marker="o")
  left.set(xlabel="epoch", ylabel="training loss", title=title)
  right.plot(epochs, history["accuracy"], marker="o", label="train")
  right.plot(epochs, history["test_accuracy"], marker="o", label="test")
  right.set(xlabel="epoch", ylabel="accuracy")
  right.legend()
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  print(f"wrote {path}")


def run(main: Callable[[list[str]], None]) -> None:
  from absl import app
  app.run(main)
