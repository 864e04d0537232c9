"""tinyjax.numpy.linalg: the parts of jax.numpy.linalg built so far: `norm`."""
from tinyjax.numpy._more import norm

__all__ = ["norm"]
