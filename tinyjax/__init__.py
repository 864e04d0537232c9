"""tinyjax: JAX's front (pure functions, composable transformations, pytrees) on tinygrad's back (one small IR,
laziness, kernel fusion, LLVM)."""
__version__ = "0.1.0"

from tinyjax.config import config  # noqa: E402
from tinyjax.array import Array  # noqa: E402
from tinyjax import lax, numpy  # noqa: E402  (numpy also attaches Array's operators and methods)
