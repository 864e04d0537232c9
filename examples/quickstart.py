"""tinyjax in one page: lazy arrays, fusion, and what DEBUG shows.

Run with `make demo`, or `DEBUG=2 .venv/bin/python examples/quickstart.py` to see the schedule and kernels too
(DEBUG=3 prints each kernel's UOps, DEBUG=4 the LLVM IR).
"""
import numpy as np

import tinyjax
import tinyjax.numpy as tnp
from tinyjax.lower.realize import counters

x = tnp.arange(12.0).reshape(3, 4)          # float32, as in JAX
y = (x * 2 + 1).sum(axis=1)                 # lazy: nothing has run yet
print("y is lazy, kernels run so far:", counters.kernels_launched)
print("y =", y)                             # printing needs the values: one fused kernel runs now
print("kernels run:", counters.kernels_launched, "(multiply, add and sum fused into one)")

logits = tnp.asarray(np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32))
shifted = logits - logits.max(axis=-1, keepdims=True)
probs = tnp.exp(shifted) / tnp.exp(shifted).sum(axis=-1, keepdims=True)
counters.reset()
print("softmax row sums:", probs.sum(axis=-1))
print("softmax took", counters.kernels_launched, "kernels")

a = tnp.ones((64, 32)) * 0.5
b = tnp.arange(32 * 16, dtype=tnp.float32).reshape(32, 16)
counters.reset()
c = a @ b
print("a @ b:", c.shape, c.dtype, "first row sum", float(c[0].sum()), "kernels:", counters.kernels_launched)
print("tinyjax", tinyjax.__version__, "compile cache:", tinyjax.compile_cache_stats())
