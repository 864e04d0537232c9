"""The classic MNIST CNN on Fashion-MNIST: two blocks of 3x3 convolution + ReLU + 2x2 max pooling, then a dense
layer and the classifier, trained with Adam in one jitted step.

    .venv/bin/python examples/cnn.py --epochs 5 --checkpoint /tmp/cnn.safetensors --plot /tmp/cnn.png
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from training import FLAGS, run, train  # noqa: E402

from tinyjax import nn, random  # noqa: E402


def pool(x):
  return nn.max_pool(x, (2, 2))


MODEL = nn.Sequential(
  nn.Conv2d(1, 32, 3), nn.relu, pool,      # 28x28x1 -> 14x14x32
  nn.Conv2d(32, 64, 3), nn.relu, pool,     # -> 7x7x64
  nn.flatten, nn.Linear(7 * 7 * 64, 128), nn.relu,
  nn.Linear(128, 10),
)


def main(argv: list[str]) -> None:
  del argv
  train("CNN", MODEL, MODEL.init(random.PRNGKey(FLAGS.seed)))


if __name__ == "__main__":
  FLAGS.set_default("lr", 2e-3)  # Fashion-MNIST, seed 0, 5 epochs: 92.1% test accuracy (1e-3: 91.0%)
  run(main)
