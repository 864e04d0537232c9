"""Differentially private SGD (Abadi et al. 2016): per-example gradients with `vmap(grad)`, each clipped to an L2
norm of at most --l2_norm_clip, summed, Gaussian noise of scale --noise_multiplier * clip added, then averaged: one
jitted step. Trains a small CNN on Fashion-MNIST (or the synthetic task).

    .venv/bin/python examples/dp_sgd.py --epochs 1 --noise_multiplier 1.1
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import flags  # noqa: E402
from training import FLAGS, load_data, run  # noqa: E402

import tinyjax as tj  # noqa: E402
import tinyjax.numpy as tnp  # noqa: E402
from tinyjax import nn, random  # noqa: E402
from tinyjax.nn import datasets, optim  # noqa: E402

flags.DEFINE_float("l2_norm_clip", 1.5, "clip each example's gradient to this L2 norm")
flags.DEFINE_float("noise_multiplier", 1.1, "noise standard deviation, in units of the clip norm")

MODEL = nn.Sequential(nn.Conv2d(1, 16, 5, stride=2), nn.relu, nn.Conv2d(16, 32, 3, stride=2), nn.relu, nn.flatten,
                      nn.Linear(7 * 7 * 32, 10))


def loss(params, x, y):
  logits = MODEL.apply(params, x)
  return -(nn.log_softmax(logits) * nn.one_hot(y, 10)).sum(axis=-1).mean()


def private_gradient(params, x, y, key):
  """The mean of the clipped per-example gradients plus Gaussian noise."""
  per_example = tj.vmap(tj.grad(loss), in_axes=(None, 0, 0))(params, x[:, None], y[:, None])
  norms = tnp.sqrt(sum(tnp.sum(tnp.square(g), axis=tuple(range(1, g.ndim))) for g in tj.tree.leaves(per_example)))
  factors = tnp.minimum(1.0, FLAGS.l2_norm_clip / (norms + 1e-12))
  clipped = tj.tree.map(lambda g: tnp.tensordot(factors, g, axes=1), per_example)  # sum of the clipped gradients
  leaves, tree = tj.tree.flatten(clipped)
  keys = random.split(key, len(leaves))
  noisy = [g + FLAGS.noise_multiplier * FLAGS.l2_norm_clip * random.normal(k, g.shape) for g, k in zip(leaves, keys)]
  return tj.tree.unflatten(tree, [g / x.shape[0] for g in noisy])


def main(argv: list[str]) -> None:
  del argv
  train_x, train_y, test_x, test_y = load_data()
  key = random.PRNGKey(FLAGS.seed)
  params = MODEL.init(key)
  optimizer = optim.sgd(FLAGS.lr * 100, momentum=0.9)  # (DP-SGD wants larger steps than Adam's default)
  opt_state = optimizer.init(params)

  @tj.jit
  def step(p, s, x, y, k):
    updates, s = optimizer.update(private_gradient(p, x, y, k), s, p)
    return optim.apply_updates(p, updates), s

  @tj.jit
  def correct(p, x, y):
    return (tnp.argmax(MODEL.apply(p, x), axis=-1) == y).sum()

  for epoch in range(1, FLAGS.epochs + 1):
    start = time.perf_counter()
    batches = datasets.batches((train_x, train_y), FLAGS.batch_size, key=random.fold_in(key, epoch))
    for i, (x, y) in enumerate(batches):
      params, opt_state = step(params, opt_state, x, y, random.fold_in(random.fold_in(key, 10_000 + epoch), i))
    hits = sum(int(correct(params, x, y)) for x, y in datasets.batches((test_x, test_y), 1000, drop_last=False))
    print(f"epoch {epoch}: {time.perf_counter() - start:.1f} s, test accuracy {hits / len(test_x):.4f} "
          f"(clip {FLAGS.l2_norm_clip}, noise multiplier {FLAGS.noise_multiplier})")


if __name__ == "__main__":
  run(main)
