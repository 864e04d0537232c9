"""Writes conv_reference.npz: JAX 0.10's outputs of convolutions, transposed convolutions and windowed reductions
(and their gradients) on fixed inputs, the reference tests/test_conv.py checks tinyjax.lax against. Needs jax (never a
test dependency); run once with a Python that has it:

    python tests/data/make_conv_reference.py

The inputs come from numpy's default_rng(0) in the order `conv_cases` draws them (tests/test_conv.py draws the same)."""
import os

import numpy as np


def conv_cases(lax, jnp, grad):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
  w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
  outs = {}
  outs["valid"] = lax.conv_general_dilated(x, w, (1, 1), "VALID")
  outs["same_s2"] = lax.conv_general_dilated(x, w, (2, 2), "SAME")
  outs["explicit"] = lax.conv_general_dilated(x, w, (2, 1), [(1, 2), (0, -1)])
  outs["rhs_dil"] = lax.conv_general_dilated(x, w, (1, 1), "SAME", rhs_dilation=(2, 3))
  outs["lhs_dil"] = lax.conv_general_dilated(x, w, (1, 1), [(1, 1), (0, 0)], lhs_dilation=(2, 1))
  xn, wn = np.transpose(x, (0, 2, 3, 1)), np.transpose(w, (2, 3, 1, 0))
  outs["nhwc"] = lax.conv_general_dilated(xn, wn, (1, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  wg = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
  outs["depthwise"] = lax.conv_general_dilated(x, wg, (1, 1), "SAME", feature_group_count=3)
  wb = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
  outs["batch_group"] = lax.conv_general_dilated(x, wb, (1, 1), "VALID", batch_group_count=2)
  x1, w1 = rng.standard_normal((2, 3, 10)).astype(np.float32), rng.standard_normal((5, 3, 4)).astype(np.float32)
  outs["conv1d"] = lax.conv(x1, w1, (2,), "SAME")
  outs["transpose"] = lax.conv_transpose(xn, rng.standard_normal((3, 3, 3, 5)).astype(np.float32), (2, 2), "SAME")
  outs["transpose_kernel"] = lax.conv_transpose(xn, rng.standard_normal((3, 3, 5, 3)).astype(np.float32), (2, 2),
                                                "VALID", transpose_kernel=True)
  outs["maxpool"] = lax.reduce_window(xn, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
  outs["avgpool_same"] = lax.reduce_window(xn, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
  outs["minpool_dilated"] = lax.reduce_window(x, jnp.inf, lax.min, (1, 1, 2, 2), (1, 1, 1, 2), "VALID",
                                              window_dilation=(1, 1, 2, 1))
  grads = grad(lambda x, w: (lax.conv_general_dilated(x, w, (2, 2), "SAME") ** 2).sum(), argnums=(0, 1))(x, w)
  outs["grad_x"], outs["grad_w"] = grads
  outs["grad_maxpool"] = grad(lambda x: (lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                                           "VALID") ** 2).sum())(xn)
  return outs


if __name__ == "__main__":
  import jax
  import jax.numpy as jnp
  from jax import lax
  outs = conv_cases(lax, jnp, jax.grad)
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv_reference.npz")
  np.savez_compressed(path, **{name: np.asarray(value) for name, value in outs.items()})
  print(f"wrote {len(outs)} arrays to {path}")
