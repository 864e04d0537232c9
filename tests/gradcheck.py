"""Central finite differences, the tests' reference for gradients."""
import numpy as np


def numeric_grad(f, x, eps=1e-3):
  """The gradient of the scalar function `f` at numpy array `x` by central differences, in float64 (each step is
  taken in `x`'s dtype)."""
  grad = np.zeros_like(x, dtype=np.float64)
  for index in np.ndindex(x.shape):
    step = np.zeros_like(x)
    step[index] = eps
    grad[index] = (float(f(x + step)) - float(f(x - step))) / (2 * eps)
  return grad


def numeric_grad_f32(fn, host, eps=1e-3):
  """`numeric_grad` of `fn` taking a tinyjax float32 array, the steps taken in float64 on `host` and then rounded."""
  import tinyjax.numpy as tnp
  return numeric_grad(lambda h: fn(tnp.asarray(h.astype(np.float32))), np.asarray(host, np.float64), eps)


def numeric_grad_complex(f, z, eps=1e-6):
  """JAX's gradient of the real function `f` of complex numpy array `z`, df/dx - i df/dy, by central differences in
  complex128."""
  z = np.asarray(z, np.complex128)
  grad = np.zeros_like(z)
  for index in np.ndindex(z.shape):
    step = np.zeros_like(z)
    step[index] = eps
    d_real = (f(z + step) - f(z - step)) / (2 * eps)
    d_imag = (f(z + 1j * step) - f(z - 1j * step)) / (2 * eps)
    grad[index] = d_real - 1j * d_imag
  return grad
