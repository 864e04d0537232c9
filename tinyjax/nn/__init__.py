"""tinyjax.nn: jax.nn's activations and helpers (relu, gelu, silu, sigmoid, softplus, softmax, log_softmax,
logsumexp, one_hot, standardize, dot_product_attention, ...), `initializers`, and pure layers (`Linear`, `Conv2d`,
`LayerNorm`, `RMSNorm`, `BatchNorm`, `Embedding`, `MultiHeadAttention`, `Dropout`, `Sequential`; see layers.py).

jax.nn's own names (the functions and `initializers`) are imported with tinyjax, as JAX's are; the layers, `optim`,
`state` and `datasets` when first named (~20 ms: the layers' dataclasses, the datasets' gzip and queue)."""
from tinyjax.helpers import lazy_attributes as _lazy_attributes
from tinyjax.nn import initializers
from tinyjax.nn.functions import (celu, dot_product_attention, elu, gelu, glu, hard_sigmoid, hard_silu, hard_swish,
                                  hard_tanh, identity, leaky_relu, log1mexp, log_sigmoid, log_softmax, logmeanexp,
                                  logsumexp, mish, one_hot, relu, relu6, selu, sigmoid, silu, soft_sign, softmax,
                                  softplus, sparse_plus, sparse_sigmoid, squareplus, standardize, swish, tanh)

__all__ = ["avg_pool", "BatchNorm", "celu", "Conv2d", "datasets", "dot_product_attention", "Dropout", "elu",
           "Embedding", "flatten", "gelu", "glu", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh", "identity",
           "initializers", "LayerNorm", "leaky_relu", "Linear", "log1mexp", "log_sigmoid", "log_softmax", "logmeanexp",
           "logsumexp", "max_pool", "mish", "MultiHeadAttention", "one_hot", "optim", "relu", "relu6", "RMSNorm",
           "selu", "Sequential", "sigmoid", "silu", "soft_sign", "softmax", "softplus", "sparse_plus", "sparse_sigmoid",
           "squareplus", "standardize", "state", "swish", "tanh"]

_LAYERS = ("BatchNorm", "Conv2d", "Dropout", "Embedding", "LayerNorm", "Linear", "MultiHeadAttention", "RMSNorm",
           "Sequential", "avg_pool", "flatten", "max_pool")
_MODULES = ("datasets", "optim", "state")
__getattr__ = _lazy_attributes(__name__, {**{name: (f"tinyjax.nn.{name}", None) for name in _MODULES},
                                          **{name: ("tinyjax.nn.layers", name) for name in _LAYERS}})
