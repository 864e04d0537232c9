"""tinyjax.nn: jax.nn's activations and helpers (relu, gelu, silu, sigmoid, softplus, softmax, log_softmax,
logsumexp, one_hot, standardize, ...)."""
from tinyjax.nn.functions import (elu, gelu, leaky_relu, log_softmax, logsumexp, one_hot, relu, relu6, sigmoid, silu,
                                  softmax, softplus, standardize, swish, tanh)

__all__ = ["elu", "gelu", "leaky_relu", "log_softmax", "logsumexp", "one_hot", "relu", "relu6", "sigmoid", "silu",
           "softmax", "softplus", "standardize", "swish", "tanh"]
