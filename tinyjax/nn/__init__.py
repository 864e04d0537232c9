"""tinyjax.nn: jax.nn's activations and helpers (relu, gelu, silu, sigmoid, softplus, softmax, log_softmax,
logsumexp, one_hot, standardize, dot_product_attention, ...) and `initializers`."""
from tinyjax.nn import initializers
from tinyjax.nn.functions import (celu, dot_product_attention, elu, gelu, glu, hard_sigmoid, hard_silu, hard_swish,
                                  hard_tanh, leaky_relu, log_sigmoid, log_softmax, logsumexp, one_hot, relu, relu6,
                                  selu, sigmoid, silu, softmax, softplus, standardize, swish, tanh)

__all__ = ["celu", "dot_product_attention", "elu", "gelu", "glu", "hard_sigmoid", "hard_silu", "hard_swish",
           "hard_tanh", "initializers", "leaky_relu", "log_sigmoid", "log_softmax", "logsumexp", "one_hot", "relu",
           "relu6", "selu", "sigmoid", "silu", "softmax", "softplus", "standardize", "swish", "tanh"]
