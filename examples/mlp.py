"""A multi-layer perceptron on Fashion-MNIST (784 -> 512 -> 512 -> 10, ReLU), trained with Adam in one jitted step.
Params and optimizer state are pytrees; the step is `jit(value_and_grad(loss))` plus `nn.optim`.

    .venv/bin/python examples/mlp.py --epochs 5          # DEBUG=1 shows each kernel launch of a step
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from training import FLAGS, run, train  # noqa: E402

from tinyjax import nn, random  # noqa: E402

MODEL = nn.Sequential(nn.flatten, nn.Linear(784, 512), nn.relu, nn.Linear(512, 512), nn.relu, nn.Linear(512, 10))


def main(argv: list[str]) -> None:
  del argv
  train("MLP", MODEL, MODEL.init(random.PRNGKey(FLAGS.seed)))


if __name__ == "__main__":
  run(main)
